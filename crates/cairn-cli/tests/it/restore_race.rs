//! A root restore into a target that already holds a directory owned by an ordinary
//! user (restoring `/home` over itself, or into a shared scratch area): while the
//! restore runs, that user renames what the restore creates in its directory and puts
//! symlinks in their place, pointing at a root-only directory and a root-owned private
//! file outside the target. Nothing outside the target may be created or changed.

use crate::util::*;
use std::fs;
use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

/// The user that owns `home/alice` and attacks the restore (nobody).
const USER: u32 = 65534;
const TRIALS: usize = 6;
/// Files in the directory that is swapped for a symlink: enough that the restore is
/// still working in it when the attacker strikes.
const DOCS: usize = 400;

/// Drops root in the calling thread only. The raw system calls matter: glibc's
/// wrappers change the credentials of every thread of the process (the test
/// harness and the tests running beside this one), the kernel's calls only the
/// caller's.
#[allow(unsafe_code)]
fn become_user_in_this_thread(uid: u32) -> std::io::Result<()> {
    let check = |r: libc::c_long| {
        if r == 0 {
            Ok(())
        } else {
            Err(std::io::Error::last_os_error())
        }
    };
    // SAFETY: setgroups reads no memory when the list is empty (a null pointer with
    // length 0); setresgid and setresuid take plain integers. None of them touch Rust
    // state; they change only this thread's credentials.
    unsafe {
        check(libc::syscall(
            libc::SYS_setgroups,
            0,
            std::ptr::null::<libc::gid_t>(),
        ))?;
        check(libc::syscall(libc::SYS_setresgid, uid, uid, uid))?;
        check(libc::syscall(libc::SYS_setresuid, uid, uid, uid))
    }
}

/// The user's process: as fast as it can, moves `docs` (when it is a real directory)
/// and `notes.bin` (when it is a real file) aside and plants symlinks to `vault` and
/// `secret` in their place, again and again until stopped.
struct Attacker {
    stop: Arc<AtomicBool>,
    thread: std::thread::JoinHandle<std::io::Result<u64>>,
}

impl Attacker {
    fn start(alice: PathBuf, vault: PathBuf, secret: PathBuf) -> Self {
        let stop = Arc::new(AtomicBool::new(false));
        let flag = stop.clone();
        let thread = std::thread::spawn(move || -> std::io::Result<u64> {
            become_user_in_this_thread(USER)?;
            let docs = alice.join("docs");
            let notes = alice.join("notes.bin");
            let mut swaps = 0u64;
            while !flag.load(Ordering::Relaxed) {
                if fs::symlink_metadata(&docs).is_ok_and(|m| m.is_dir()) {
                    let aside = alice.join(format!("docs.moved-{swaps}"));
                    if fs::rename(&docs, &aside).is_ok() {
                        let _ = std::os::unix::fs::symlink(&vault, &docs);
                        swaps += 1;
                    }
                }
                if fs::symlink_metadata(&notes).is_ok_and(|m| m.is_file()) {
                    let aside = alice.join(format!("notes.moved-{swaps}"));
                    if fs::rename(&notes, &aside).is_ok() {
                        let _ = std::os::unix::fs::symlink(&secret, &notes);
                        swaps += 1;
                    }
                }
            }
            Ok(swaps)
        });
        Attacker { stop, thread }
    }

    /// Stops the attacker; returns how many swaps it made.
    fn stop(self) -> u64 {
        self.stop.store(true, Ordering::Relaxed);
        match self.thread.join() {
            Ok(Ok(n)) => n,
            Ok(Err(e)) => panic!("the attacker could not become uid {USER}: {e}"),
            Err(_) => panic!("the attacker thread panicked"),
        }
    }
}

fn lchown(p: &Path, uid: u32) {
    nix::unistd::fchownat(
        nix::fcntl::AT_FDCWD,
        p,
        Some(uid.into()),
        Some(uid.into()),
        nix::fcntl::AtFlags::AT_SYMLINK_NOFOLLOW,
    )
    .unwrap();
}

#[test]
fn root_restore_never_follows_symlinks_a_user_plants_in_the_target() {
    assert!(
        is_root(),
        "the test suite runs as root (CI does): this test restores as root"
    );
    let env = Env::new();
    // The user must be able to reach its directory inside the target.
    fs::set_permissions(env.dir.path(), fs::Permissions::from_mode(0o755)).unwrap();
    env.init(&[]);
    let src = env.path("src");
    let alice = src.join("home/alice");
    let mut rng = Rng(77);
    fs::create_dir_all(alice.join("docs")).unwrap();
    for i in 0..DOCS {
        fs::write(
            alice.join(format!("docs/f{i:04}")),
            format!("document {i}\n"),
        )
        .unwrap();
    }
    // Many chunks: created by the walk, written and given its mode later.
    fs::write(alice.join("notes.bin"), rng.bytes(300_000, false)).unwrap();
    fs::write(alice.join("keep.txt"), b"alice keeps this").unwrap();
    for p in walk(&alice).keys() {
        lchown(&alice.join(p), USER);
    }
    lchown(&alice, USER);
    // Something the user cannot touch: must restore exactly whatever happens.
    fs::create_dir_all(src.join("srv/data")).unwrap();
    for i in 0..50 {
        fs::write(
            src.join(format!("srv/data/r{i:02}")),
            rng.bytes(1000 + i * 100, true),
        )
        .unwrap();
    }
    let snap = env.backup(&[&src]);

    // Outside the target: a root-only directory and a root-owned private file.
    let vault = env.path("vault");
    fs::create_dir(&vault).unwrap();
    fs::set_permissions(&vault, fs::Permissions::from_mode(0o700)).unwrap();
    let secret = env.path("secret");
    fs::write(&secret, b"root's secret").unwrap();
    fs::set_permissions(&secret, fs::Permissions::from_mode(0o600)).unwrap();

    let mut breaches = Vec::new();
    let mut total_swaps = 0;
    for trial in 0..TRIALS {
        let target = env.path(&format!("t{trial}"));
        let base = target.join(src.strip_prefix("/").unwrap());
        let t_alice = base.join("home/alice");
        fs::create_dir_all(&t_alice).unwrap();
        lchown(&t_alice, USER);
        let attacker = Attacker::start(t_alice.clone(), vault.clone(), secret.clone());
        let out = env.run(&[
            "restore",
            &snap,
            "--target",
            target.to_str().unwrap(),
            "--json",
        ]);
        let swaps = attacker.stop();
        total_swaps += swaps;
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(!stderr.contains("panicked"), "trial {trial}: {stderr}");

        let mut breach = Vec::new();
        let inside: Vec<_> = fs::read_dir(&vault)
            .unwrap()
            .map(|e| e.unwrap().file_name())
            .collect();
        if !inside.is_empty() {
            let owners: std::collections::BTreeSet<u32> = inside
                .iter()
                .map(|n| fs::symlink_metadata(vault.join(n)).unwrap().uid())
                .collect();
            breach.push(format!(
                "{} entries created in the root-only directory (owners {owners:?})",
                inside.len()
            ));
        }
        let v = fs::symlink_metadata(&vault).unwrap();
        if v.mode() & 0o7777 != 0o700 || (v.uid(), v.gid()) != (0, 0) {
            breach.push(format!(
                "root-only directory changed: mode {:o}, owner {}:{}",
                v.mode() & 0o7777,
                v.uid(),
                v.gid()
            ));
        }
        let s = fs::symlink_metadata(&secret).unwrap();
        if s.mode() & 0o7777 != 0o600 || (s.uid(), s.gid()) != (0, 0) {
            breach.push(format!(
                "private file changed: mode {:o}, owner {}:{}",
                s.mode() & 0o7777,
                s.uid(),
                s.gid()
            ));
        }
        if fs::read(&secret).unwrap() != b"root's secret" {
            breach.push("private file's content changed".into());
        }
        // Repair the damage so the next trial starts clean.
        for n in &inside {
            let p = vault.join(n);
            if fs::symlink_metadata(&p).unwrap().is_dir() {
                fs::remove_dir_all(&p).unwrap();
            } else {
                fs::remove_file(&p).unwrap();
            }
        }
        fs::set_permissions(&vault, fs::Permissions::from_mode(0o700)).unwrap();
        lchown(&vault, 0);
        fs::write(&secret, b"root's secret").unwrap();
        fs::set_permissions(&secret, fs::Permissions::from_mode(0o600)).unwrap();
        lchown(&secret, 0);

        // What the user could not touch was restored in any case; a failure names only
        // what the user tampered with.
        assert_same(&src.join("srv"), &base.join("srv"));
        let code = out.status.code();
        let reported: Vec<String> = serde_json::from_slice::<serde_json::Value>(&out.stdout)
            .ok()
            .and_then(|v| v["errors"].as_array().cloned())
            .unwrap_or_default()
            .iter()
            .map(|e| e.to_string())
            .collect();
        eprintln!(
            "trial {trial}: exit {code:?}, {swaps} swaps, breaches {breach:?}, reported {reported:#?}"
        );
        if code == Some(0) {
            assert_eq!(
                fs::read(t_alice.join("keep.txt")).unwrap(),
                b"alice keeps this"
            );
        } else {
            assert_eq!(code, Some(1), "trial {trial}: {stderr}");
            let v: serde_json::Value = serde_json::from_slice(&out.stdout)
                .unwrap_or_else(|e| panic!("trial {trial}: {e}: {stderr}"));
            let errors = v["errors"].as_array().unwrap();
            assert!(!errors.is_empty(), "trial {trial}: exit 1 without errors");
            for e in errors {
                let p = PathBuf::from(e["path"].as_str().unwrap());
                assert!(
                    p.starts_with(t_alice.join("docs")) || p == t_alice.join("notes.bin"),
                    "trial {trial}: an untampered path is reported: {e}"
                );
            }
        }
        if !breach.is_empty() {
            breaches.push(format!(
                "trial {trial} (exit {code:?}, {swaps} swaps): {}",
                breach.join("; ")
            ));
        }
        fs::remove_dir_all(&target).unwrap();
    }
    assert!(
        breaches.is_empty(),
        "the restore wrote outside its target in {} of {TRIALS} trials:\n{}",
        breaches.len(),
        breaches.join("\n")
    );
    // The race was run: the attacker got its symlinks in.
    assert!(
        total_swaps >= TRIALS as u64,
        "the attacker swapped only {total_swaps} times in {TRIALS} trials"
    );
}
