//! `cairn mount` (issue #18) as a real FUSE mount of the real binary: the layout,
//! a tree exactly as recorded, reads at any offset, a damaged pack, prune while a
//! mount is open, and unmounting on a signal or from outside. Every mount is
//! unmounted by a guard, even when a test fails.

use crate::util::*;
use std::fs;
use std::os::unix::fs::{FileExt, MetadataExt};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

/// A running `cairn mount`; dropping it stops the process and makes sure nothing
/// stays mounted.
struct Mount {
    child: Child,
    dir: PathBuf,
    lines: Option<StderrLines>,
}

impl Mount {
    fn start(env: &Env, dir: &Path, extra: &[&str]) -> Mount {
        let mut args = vec!["mount", dir.to_str().unwrap()];
        args.extend_from_slice(extra);
        Mount::spawn(env.cmd(&args), dir)
    }

    fn spawn(mut c: Command, dir: &Path) -> Mount {
        c.stdout(Stdio::null());
        Mount::spawn_keeping_stdout(c, dir)
    }

    /// [`Mount::spawn`] with the caller's choice of standard output.
    fn spawn_keeping_stdout(mut c: Command, dir: &Path) -> Mount {
        fs::create_dir_all(dir).unwrap();
        c.stderr(Stdio::piped());
        let mut child = c.spawn().unwrap();
        let lines = StderrLines::of(&mut child);
        // Owned from here on: a failed start below still stops the process.
        let mut m = Mount {
            child,
            dir: dir.to_path_buf(),
            lines: Some(lines),
        };
        let line = m
            .lines
            .as_mut()
            .unwrap()
            .wait_for("mounted ", Duration::from_secs(60));
        assert!(line.contains("fusermount3 -u"), "{line}");
        assert!(is_mounted(dir), "not in /proc/self/mounts after: {line}");
        m
    }

    fn signal(&self, sig: nix::sys::signal::Signal) {
        let _ = nix::sys::signal::kill(nix::unistd::Pid::from_raw(self.child.id() as i32), sig);
    }

    /// Waits for the process to end by itself and returns its stderr.
    fn wait(mut self, within: Duration) -> (std::process::ExitStatus, String) {
        let t = Instant::now();
        let status = loop {
            if let Some(s) = self.child.try_wait().unwrap() {
                break s;
            }
            assert!(
                t.elapsed() < within,
                "cairn mount still runs after {within:?}"
            );
            std::thread::sleep(Duration::from_millis(20));
        };
        let log = self.lines.take().unwrap().all();
        assert!(!log.contains("panicked"), "{log}");
        (status, log)
    }
}

impl Drop for Mount {
    fn drop(&mut self) {
        if self.child.try_wait().ok().flatten().is_none() {
            self.signal(nix::sys::signal::Signal::SIGTERM);
            let t = Instant::now();
            while self.child.try_wait().ok().flatten().is_none() && t.elapsed().as_secs() < 10 {
                std::thread::sleep(Duration::from_millis(20));
            }
            let _ = self.child.kill();
            let _ = self.child.wait();
        }
        if is_mounted(&self.dir) {
            let _ = Command::new("umount").arg("-l").arg(&self.dir).status();
        }
    }
}

/// Unmounts `dir` from outside, as a user would.
fn fusermount_u(dir: &Path) {
    let ok = Command::new("fusermount3")
        .arg("-u")
        .arg(dir)
        .status()
        .unwrap()
        .success();
    assert!(ok, "fusermount3 -u {}", dir.display());
}

/// Whether `dir` is a mount point now (by /proc, which works even when the mount's
/// process is gone and the directory itself cannot be looked at).
fn is_mounted(dir: &Path) -> bool {
    let parent = dir.parent().unwrap().canonicalize().unwrap();
    let path = parent.join(dir.file_name().unwrap());
    let want = path.to_str().unwrap().replace(' ', "\\040");
    fs::read_to_string("/proc/self/mounts")
        .unwrap()
        .lines()
        .any(|l| l.split(' ').nth(1) == Some(want.as_str()))
}

fn names(dir: &Path) -> Vec<String> {
    let mut v: Vec<String> = fs::read_dir(dir)
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    v.sort();
    v
}

fn backup_host(env: &Env, src: &Path, host: &str) -> String {
    let out = env.ok(&["backup", "--json", "--host", host, src.to_str().unwrap()]);
    let v: serde_json::Value = serde_json::from_str(&out).unwrap();
    v["snapshot_id"].as_str().unwrap().to_string()
}

/// A repository holding one snapshot of one one-byte file.
fn one_tiny_snapshot() -> Env {
    let env = Env::new();
    env.init(&[]);
    let src = env.path("src");
    fs::create_dir_all(&src).unwrap();
    fs::write(src.join("f"), b"x").unwrap();
    env.backup(&[&src]);
    env
}

/// Where the source `src` appears inside a mounted snapshot root.
fn inside(root: &Path, src: &Path) -> PathBuf {
    root.join(src.strip_prefix("/").unwrap())
}

#[test]
fn mount_shows_hosts_snapshots_and_latest_with_everything_a_restore_has() {
    let env = Env::new();
    env.init(&[]);
    let src = env.path("src");
    make_full_tree(&src, 11);
    // A symlink with two names: one inode in the mount too.
    std::os::unix::fs::symlink("small.txt", src.join("sym-1")).unwrap();
    fs::hard_link(src.join("sym-1"), src.join("sym-2")).unwrap();
    let s1 = backup_host(&env, &src, "alpha");
    let s2 = backup_host(&env, &src, "beta/gamma");
    // Dated by a clock decades ahead: listed, but no `latest` points at it.
    let out = env.ok(&[
        "backup",
        "--json",
        "--host",
        "alpha",
        "--time",
        "2099-01-01T00:00:00Z",
        src.to_str().unwrap(),
    ]);
    let s3 = serde_json::from_str::<serde_json::Value>(&out).unwrap()["snapshot_id"]
        .as_str()
        .unwrap()
        .to_string();
    let mnt = env.path("mnt");
    let m = Mount::start(&env, &mnt, &[]);

    assert_eq!(names(&mnt), ["hosts", "latest", "snapshots"]);
    assert_eq!(
        fs::read_link(mnt.join("latest")).unwrap(),
        PathBuf::from(format!("snapshots/{s2}"))
    );
    assert_eq!(names(&mnt.join("hosts")), ["alpha", "beta%2Fgamma"]);
    let mut ids = vec![s1.clone(), s2.clone(), s3];
    ids.sort();
    assert_eq!(names(&mnt.join("snapshots")), ids);
    // hosts/H: one directory per snapshot, named by its UTC time, and `latest`.
    let alpha = names(&mnt.join("hosts/alpha"));
    assert_eq!(alpha.len(), 3, "{alpha:?}");
    let date = &alpha[0];
    assert_eq!(alpha[1], "2099-01-01T00-00-00Z");
    assert_eq!(alpha[2], "latest");
    let b = date.as_bytes();
    assert!(
        date.len() == 20 && b[4] == b'-' && b[10] == b'T' && b[13] == b'-' && b[19] == b'Z',
        "{date}"
    );
    assert_eq!(
        fs::read_link(mnt.join("hosts/alpha/latest")).unwrap(),
        PathBuf::from(date)
    );
    // A unique id prefix resolves (as a symlink), without being listed.
    let short = mnt.join("snapshots").join(&s1[..8]);
    assert_eq!(fs::read_link(&short).unwrap(), PathBuf::from(&s1));

    // The tree as recorded: types, modes, owners, ns times, xattrs, link targets,
    // device numbers, content, and hard links as one inode with its link count.
    // (Sparseness is not shown: a file's blocks are its size.)
    for root in [
        mnt.join("snapshots").join(&s1),
        mnt.join("hosts/alpha").join(date),
        mnt.join("latest"),
    ] {
        let diffs: Vec<String> = compare(&src, &inside(&root, &src))
            .into_iter()
            .filter(|d| !d.contains("allocated blocks"))
            .collect();
        assert!(
            diffs.is_empty(),
            "{}:\n{}",
            root.display(),
            diffs.join("\n")
        );
    }
    // An absent attribute is ENODATA, but an absent SELinux label (or any
    // `security.` name) is "not supported", which GNU `ls -l` remembers per device
    // instead of asking again for every file.
    let latest = inside(&mnt.join("latest"), &src);
    for f in ["small.txt", "hard-1"] {
        assert_eq!(
            xattr::get(latest.join(f), "user.absent").unwrap(),
            None,
            "{f}"
        );
        let err = xattr::get(latest.join(f), "security.selinux").unwrap_err();
        assert_eq!(err.raw_os_error(), Some(libc::EOPNOTSUPP), "{f}: {err}");
    }
    assert_eq!(
        xattr::get(latest.join("small.txt"), "user.note").unwrap(),
        Some(b"hello".to_vec())
    );
    let m1 = fs::metadata(inside(&mnt.join("latest"), &src).join("hard-1")).unwrap();
    let m2 = fs::metadata(inside(&mnt.join("latest"), &src).join("hard-2")).unwrap();
    assert_eq!((m1.ino(), m1.nlink()), (m2.ino(), 2));
    let m1 = fs::symlink_metadata(inside(&mnt.join("latest"), &src).join("sym-1")).unwrap();
    let m2 = fs::symlink_metadata(inside(&mnt.join("latest"), &src).join("sym-2")).unwrap();
    assert_eq!((m1.ino(), m1.nlink()), (m2.ino(), 2));
    // `cp -a` out of the mount gives the source back, holes included.
    let copy = env.path("copy");
    let ok = Command::new("cp")
        .args(["-a", "--sparse=always"])
        .arg(inside(&mnt.join("latest"), &src))
        .arg(&copy)
        .status()
        .unwrap()
        .success();
    assert!(ok, "cp -a out of the mount");
    assert_same(&src, &copy);
    // Read-only.
    let err = fs::write(inside(&mnt.join("latest"), &src).join("new"), b"x").unwrap_err();
    assert_eq!(err.raw_os_error(), Some(libc::EROFS), "{err}");

    let (status, log) = {
        m.signal(nix::sys::signal::Signal::SIGINT);
        m.wait(Duration::from_secs(20))
    };
    assert!(status.success(), "{status:?}: {log}");
    assert!(!is_mounted(&mnt));
}

/// `--snapshot latest` passes over a snapshot dated ahead of this machine's
/// clock and says so, as every other command does.
#[test]
fn mounting_latest_says_what_it_passed_over() {
    let env = Env::new();
    env.init(&[]);
    let src = env.path("src");
    fs::create_dir_all(&src).unwrap();
    fs::write(src.join("f"), b"old").unwrap();
    let s = src.to_str().unwrap();
    env.ok(&["backup", s, "--time", "2099-01-01 00:00:00", "-q"]);
    fs::write(src.join("f"), b"new").unwrap();
    env.backup(&[&src]);
    let mnt = env.path("mnt");
    let m = Mount::start(&env, &mnt, &["--snapshot", "latest"]);
    assert_eq!(fs::read(inside(&mnt, &src).join("f")).unwrap(), b"new");
    m.signal(nix::sys::signal::Signal::SIGTERM);
    let (_, log) = m.wait(Duration::from_secs(30));
    assert!(
        log.contains("1 snapshot dated ahead of this machine's clock was passed over"),
        "{log}"
    );
}

#[test]
fn reads_at_any_offset_of_a_file_with_a_deep_chunk_list() {
    // 4 KiB blocks: 20 MB is more than 4096 chunks, so two chunk-list levels.
    let env = Env::new();
    env.init(&["--block-size", "4K", "--no-encryption"]);
    let src = env.path("src");
    fs::create_dir_all(&src).unwrap();
    let data = Rng(5).bytes(20 << 20, false);
    fs::write(src.join("image.raw"), &data).unwrap();
    env.backup(&[&src]);
    let mnt = env.path("mnt");
    let _m = Mount::start(&env, &mnt, &["--snapshot", "latest"]);
    // The snapshot alone, at the mount's root.
    let f = fs::File::open(inside(&mnt, &src).join("image.raw")).unwrap();
    assert_eq!(f.metadata().unwrap().len(), data.len() as u64);
    // From the end backwards first (nothing read before it), then scattered.
    let len = data.len() as u64;
    let mut offsets = vec![len - 1, len - 5000, len / 2 + 12_345, 4095, 0];
    let mut rng = Rng(9);
    offsets.extend((0..40).map(|_| rng.below(len)));
    for (i, off) in offsets.into_iter().enumerate() {
        let want = [1usize, 100, 4096, 70_000, 1 << 20][i % 5];
        let mut buf = vec![0u8; want];
        let n = f.read_at(&mut buf, off).unwrap();
        let end = (off as usize + want).min(data.len());
        assert_eq!(n, end - off as usize, "at {off}");
        assert!(
            buf[..n] == data[off as usize..end],
            "bytes differ at {off}+{want}"
        );
    }
    // And the whole file in order.
    assert!(fs::read(inside(&mnt, &src).join("image.raw")).unwrap() == data);
}

/// Sparse files show their holes as a restore makes them: `st_blocks` counts
/// the data only, `SEEK_DATA`/`SEEK_HOLE` find them, and `cp` out of the mount
/// writes a sparse copy (QA: 100 MiB of blocks for a file holding one byte).
#[test]
fn sparse_files_keep_their_holes_in_the_mount() {
    use std::os::fd::AsRawFd;
    let env = Env::new();
    env.init(&["--block-size", "16K"]);
    let src = env.path("src");
    fs::create_dir_all(&src).unwrap();
    // Large (a chunk list of its own), small (its chunks in the node), dense.
    let big = fs::File::create(src.join("big")).unwrap();
    big.set_len(64 << 20).unwrap();
    big.write_at(&Rng(3).bytes(100_000, false), 40 << 20)
        .unwrap();
    big.write_at(b"end", (64 << 20) - 3).unwrap();
    let small = fs::File::create(src.join("small")).unwrap();
    small.set_len(2 << 20).unwrap();
    small.write_at(b"x", 0).unwrap();
    fs::write(src.join("dense"), Rng(4).bytes(3 << 20, false)).unwrap();
    env.backup(&[&src]);
    let mnt = env.path("mnt");
    let _m = Mount::start(&env, &mnt, &["--snapshot", "latest"]);
    let dir = inside(&mnt, &src);
    // `ls -l` first (READDIRPLUS), then each file's own stat.
    let listed: Vec<_> = fs::read_dir(&dir).unwrap().map(|e| e.unwrap()).collect();
    assert_eq!(listed.len(), 3);
    let blocks = |n: &str| fs::metadata(dir.join(n)).unwrap().blocks() * 512;
    assert!(
        blocks("big") < 4 << 20,
        "big: {} bytes of blocks",
        blocks("big")
    );
    assert!(blocks("small") < 1 << 20, "small: {}", blocks("small"));
    assert_eq!(blocks("dense"), 3 << 20);
    // Where the data is, as lseek says it.
    let f = fs::File::open(dir.join("big")).unwrap();
    let seek = |off: i64, whence: i32| {
        // SAFETY: lseek on a descriptor this test owns.
        #[allow(unsafe_code)]
        let r = unsafe { libc::lseek(f.as_raw_fd(), off, whence) };
        r
    };
    let data = seek(0, libc::SEEK_DATA);
    assert!(
        (32 << 20..=40 << 20).contains(&data),
        "SEEK_DATA from 0: {data}"
    );
    let hole = seek(data, libc::SEEK_HOLE);
    assert!(
        ((40 << 20) + 100_000..48 << 20).contains(&hole),
        "SEEK_HOLE from {data}: {hole}"
    );
    assert_eq!(seek(0, libc::SEEK_HOLE), 0);
    assert_eq!(seek(64 << 20, libc::SEEK_DATA), -1);
    // A copy out of the mount is sparse and the same bytes.
    let out = env.path("copy");
    let o = Command::new("cp")
        .arg("--sparse=auto")
        .arg(dir.join("big"))
        .arg(&out)
        .output()
        .unwrap();
    assert!(o.status.success(), "{o:?}");
    assert!(fs::read(&out).unwrap() == fs::read(src.join("big")).unwrap());
    let copied = fs::metadata(&out).unwrap().blocks() * 512;
    assert!(copied < 8 << 20, "the copy takes {copied} bytes");
    drop(f);
    drop(_m);
    // A junk index file does not keep the repository from being mounted (the
    // mount looks blobs up in SSD index files, whose build refused its own
    // damage: QA).
    let junk = env.repo.join("index").join("4c".repeat(32));
    fs::File::create(&junk).unwrap().set_len(1024).unwrap();
    let _m = Mount::start(&env, &mnt, &["--snapshot", "latest"]);
    assert!(fs::read(dir.join("big")).unwrap() == fs::read(src.join("big")).unwrap());
}

#[test]
fn files_read_without_open_keep_reading_right_past_the_state_the_mount_keeps() {
    // The kernel sends no OPEN or RELEASE to the mount (it answers the first OPEN
    // with ENOSYS), so reads find their file by inode and the mount keeps the
    // state of the last 512 files read. A large file read in pieces between 700
    // small ones is forgotten and set up again; every byte must still be right.
    let env = Env::new();
    env.init(&["--block-size", "4K", "--no-encryption"]);
    let src = env.path("src");
    fs::create_dir_all(src.join("many")).unwrap();
    let big = Rng(11).bytes(3 << 20, false);
    fs::write(src.join("big"), &big).unwrap();
    for i in 0..700 {
        fs::write(
            src.join("many").join(format!("{i:03}")),
            format!("{i}-").repeat(i + 1),
        )
        .unwrap();
    }
    env.backup(&[&src]);
    let mnt = env.path("mnt");
    let _m = Mount::start(&env, &mnt, &["--snapshot", "latest"]);
    let root = inside(&mnt, &src);
    let f = fs::File::open(root.join("big")).unwrap();
    let check = |off: usize, len: usize| {
        let mut buf = vec![0u8; len];
        let n = f.read_at(&mut buf, off as u64).unwrap();
        assert_eq!(n, len, "at {off}");
        assert!(
            buf == big[off..off + len],
            "bytes of big differ at {off}+{len}"
        );
    };
    check(0, 100_000);
    for round in 0..2 {
        for i in 0..700 {
            let got = fs::read(root.join("many").join(format!("{i:03}"))).unwrap();
            assert_eq!(
                got,
                format!("{i}-").repeat(i + 1).into_bytes(),
                "round {round}"
            );
        }
        // Out of the page cache, so that the next reads reach the mount.
        nix::fcntl::posix_fadvise(
            &f,
            0,
            0,
            nix::fcntl::PosixFadviseAdvice::POSIX_FADV_DONTNEED,
        )
        .unwrap();
        check(100_000 + round * 1_000_000, 700_000);
        check(5_000, 4_096);
    }
    assert!(fs::read(root.join("big")).unwrap() == big);
}

#[test]
fn a_damaged_pack_gives_eio_for_its_file_and_the_rest_still_reads() {
    let env = Env::new();
    env.init(&[]);
    let (a, b) = (env.path("a"), env.path("b"));
    let mut rng = Rng(77);
    fs::create_dir_all(&a).unwrap();
    fs::create_dir_all(&b).unwrap();
    let bad = rng.bytes(1_000_000, false);
    let good = rng.bytes(1_000_000, false);
    fs::write(a.join("bad.bin"), &bad).unwrap();
    fs::write(b.join("good.bin"), &good).unwrap();
    let sa = env.backup(&[&a]);
    let before = packs(&env.repo);
    let sb = env.backup(&[&b]);
    // The largest of the first backup's packs holds bad.bin's chunks.
    let pack = before
        .iter()
        .max_by_key(|(_, s)| **s)
        .map(|(p, _)| p.clone())
        .unwrap();
    flip_middle(&pack);
    let mnt = env.path("mnt");
    let mut m = Mount::start(&env, &mnt, &[]);
    let in_a = inside(&mnt.join("snapshots").join(&sa), &a);
    let in_b = inside(&mnt.join("snapshots").join(&sb), &b);
    assert_eq!(names(&in_a), ["bad.bin"], "the directory still lists");
    let err = fs::read(in_a.join("bad.bin")).unwrap_err();
    assert_eq!(err.raw_os_error(), Some(libc::EIO), "{err}");
    assert!(fs::read(in_b.join("good.bin")).unwrap() == good);
    let line = m
        .lines
        .as_mut()
        .unwrap()
        .wait_for("bad.bin", Duration::from_secs(10));
    assert!(line.contains("blob ") && line.contains("damaged"), "{line}");
}

#[test]
fn prune_completes_while_a_mount_is_open_and_idle() {
    let env = Env::new();
    env.init(&[]);
    let (a, b) = (env.path("a"), env.path("b"));
    fs::create_dir_all(&a).unwrap();
    fs::create_dir_all(&b).unwrap();
    let mut rng = Rng(3);
    fs::write(a.join("old.bin"), rng.bytes(2_000_000, false)).unwrap();
    let kept = rng.bytes(500_000, false);
    fs::write(b.join("kept.bin"), &kept).unwrap();
    let sa = env.backup(&[&a]);
    let sb = env.backup(&[&b]);
    let mnt = env.path("mnt");
    let _m = Mount::start(&env, &mnt, &["--idle-secs", "1"]);
    let locks = || {
        fs::read_dir(env.repo.join("locks"))
            .map(|d| d.count())
            .unwrap_or(0)
    };
    // In use: a session and its lock; idle for a second: both gone.
    fs::read(inside(&mnt.join("snapshots").join(&sa), &a).join("old.bin")).unwrap();
    wait_until(
        "the idle mount to drop its lock",
        Duration::from_secs(20),
        || locks() == 0,
    );
    env.ok(&["forget", &sa]);
    let out = env.ok(&["prune", "--json"]);
    let r: serde_json::Value = serde_json::from_str(&out).unwrap();
    assert!(r["deleted_packs"].as_u64().unwrap() > 0, "{out}");
    assert_eq!(r["deferred_packs"].as_u64(), Some(0), "{out}");
    // The next request opens a new session, which lists the snapshots again.
    assert!(
        fs::read(inside(&mnt.join("snapshots").join(&sb), &b).join("kept.bin")).unwrap() == kept
    );
    std::thread::sleep(Duration::from_millis(1100));
    assert_eq!(names(&mnt.join("snapshots")), vec![sb.clone()]);
    assert_eq!(
        fs::read_link(mnt.join("latest")).unwrap(),
        PathBuf::from(format!("snapshots/{sb}"))
    );
    // A backup made while the mount is idle is seen at the next listing of the
    // top level, not once its minute is up (QA).
    wait_until("the mount idle again", Duration::from_secs(20), || {
        locks() == 0
    });
    let sc = env.backup(&[&a]);
    let mut both = vec![sb.clone(), sc.clone()];
    both.sort();
    assert_eq!(names(&mnt.join("snapshots")), both);
    env.check_clean();
}

#[test]
fn sigterm_or_an_outside_unmount_leaves_no_mount_behind() {
    let env = one_tiny_snapshot();
    let mnt = env.path("mnt");

    // SIGTERM: unmounted, the lock removed, exit 0.
    let m = Mount::start(&env, &mnt, &[]);
    assert_eq!(names(&mnt), ["hosts", "latest", "snapshots"]);
    m.signal(nix::sys::signal::Signal::SIGTERM);
    let (status, log) = m.wait(Duration::from_secs(20));
    assert!(status.success(), "{status:?}: {log}");
    assert!(!is_mounted(&mnt));
    assert_eq!(fs::read_dir(env.repo.join("locks")).unwrap().count(), 0);

    // Unmounted from outside: the process ends by itself. A second mount on a
    // running one is refused, not stacked over it (QA r23).
    let m = Mount::start(&env, &mnt, &[]);
    let err = env.fails(&["mount", mnt.to_str().unwrap()], 1);
    assert!(err.contains("holds a running cairn mount already"), "{err}");
    fusermount_u(&mnt);
    let (status, log) = m.wait(Duration::from_secs(20));
    assert!(status.success(), "{status:?}: {log}");

    // Busy (a process sits inside it): SIGTERM still leaves no mount behind.
    let m = Mount::start(&env, &mnt, &[]);
    let mut inside_it = Command::new("sleep")
        .arg("30")
        .current_dir(mnt.join("latest"))
        .spawn()
        .unwrap();
    m.signal(nix::sys::signal::Signal::SIGTERM);
    let (status, log) = m.wait(Duration::from_secs(20));
    let _ = inside_it.kill();
    let _ = inside_it.wait();
    assert!(status.success(), "{status:?}: {log}");
    assert!(log.contains("detached"), "{log}");
    assert!(!is_mounted(&mnt));

    // Killed: the mount point stays a dead FUSE mount until unmounted, and a new
    // mount there says so (not that FUSE is missing); so does a missing directory.
    // (The guard is kept: its drop would unmount the dead mount.)
    let mut m = Mount::start(&env, &mnt, &[]);
    m.signal(nix::sys::signal::Signal::SIGKILL);
    let _ = m.child.wait();
    let err = env.fails(&["mount", mnt.to_str().unwrap()], 1);
    assert!(
        err.contains("a FUSE mount whose process ended") && !err.contains("apt install"),
        "{err}"
    );
    fusermount_u(&mnt);
    drop(m);
    let err = env.fails(&["mount", env.path("nowhere").to_str().unwrap()], 1);
    assert!(err.contains("does not exist"), "{err}");
}

/// Every file below `dir` with its size, by walking it.
fn walk_sizes(dir: &Path, out: &mut Vec<(PathBuf, u64)>) {
    for e in fs::read_dir(dir).unwrap() {
        let e = e.unwrap();
        let m = fs::symlink_metadata(e.path()).unwrap();
        if m.is_dir() {
            walk_sizes(&e.path(), out);
        } else {
            out.push((e.path(), m.len()));
        }
    }
}

#[test]
fn a_walk_of_more_files_than_max_inodes_leaves_the_mount_holding_no_more() {
    let env = Env::new();
    env.init(&[]);
    let src = env.path("src");
    for d in 0..30 {
        fs::create_dir_all(src.join(format!("d{d}"))).unwrap();
        for f in 0..200 {
            fs::write(src.join(format!("d{d}/f{f}")), vec![b'a'; d * 7 + f]).unwrap();
        }
    }
    env.backup(&[&src]);
    let mnt = env.path("mnt");
    let mut c = env.cmd(&[
        "mount",
        mnt.to_str().unwrap(),
        "--max-inodes",
        "1024",
        "--json",
    ]);
    c.stdout(Stdio::piped());
    let mut m = Mount::spawn_keeping_stdout(c, &mnt);
    let root = inside(&mnt.join("latest"), &src);
    // Twice: the second walk finds again what the mount had the kernel forget.
    for _ in 0..2 {
        let mut seen = Vec::new();
        walk_sizes(&root, &mut seen);
        assert_eq!(seen.len(), 6000);
        for (p, size) in &seen {
            let rel = p.strip_prefix(&root).unwrap();
            let want = fs::metadata(src.join(rel)).unwrap().len();
            assert_eq!(*size, want, "{}", rel.display());
        }
    }
    assert_eq!(
        fs::read(root.join("d29/f199")).unwrap(),
        vec![b'a'; 29 * 7 + 199]
    );
    // The kernel's FORGETs arrive shortly after the mount asks.
    std::thread::sleep(Duration::from_millis(1500));
    m.signal(nix::sys::signal::Signal::SIGTERM);
    let mut stdout = m.child.stdout.take().unwrap();
    let (status, log) = m.wait(Duration::from_secs(20));
    assert!(status.success(), "{status:?}: {log}");
    // With --json every line on standard error is an event (QA r35: the
    // "mounted" line was text).
    for line in log.lines() {
        let e: serde_json::Value = serde_json::from_str(line).expect(line);
        assert!(e["type"].is_string(), "{line}");
    }
    assert!(log.contains(r#""type":"mounted""#), "{log}");
    let mut out = String::new();
    std::io::Read::read_to_string(&mut stdout, &mut out).unwrap();
    let v: serde_json::Value = serde_json::from_str(out.trim()).unwrap();
    assert_eq!(v["max_inodes"], 1024, "{out}");
    // Without the budget the kernel would hold all 6,030 entries it was given.
    assert!(v["inodes_at_end"].as_u64().unwrap() <= 1024, "{out}");
    assert!(v["inodes_peak"].as_u64().unwrap() > 1024, "{out}");
}

/// `env`'s repository served as datastore `main` (plain HTTP on loopback) and
/// mounted through it at `mnt` with an admin token and `extra` options.
fn mounted_through_a_server(env: &Env, extra: &[&str]) -> (crate::server::Server, Mount, PathBuf) {
    let srv = crate::server::Server::start(&env.path("state"), &[("main", &env.repo)], true);
    let token = srv.token("mount", "main", "admin");
    let mnt = env.path("mnt");
    let mut args = vec!["mount", mnt.to_str().unwrap()];
    args.extend_from_slice(extra);
    let c = crate::server::client_cmd(env, &srv, "main", &token, &args);
    let m = Mount::spawn(c, &mnt);
    (srv, m, mnt)
}

#[test]
fn a_server_that_goes_away_gives_eio_within_seconds_not_a_hang() {
    let env = Env::new();
    env.init(&[]);
    let src = env.path("src");
    fs::create_dir_all(&src).unwrap();
    let mut rng = Rng(21);
    let first = rng.bytes(400_000, false);
    // In directories of their own: reading a file fetches the next small files of
    // its directory ahead.
    fs::create_dir_all(src.join("a")).unwrap();
    fs::create_dir_all(src.join("b")).unwrap();
    fs::write(src.join("a/first.bin"), &first).unwrap();
    fs::write(src.join("b/second.bin"), rng.bytes(400_000, false)).unwrap();
    env.backup(&[&src]);
    let (srv, mut m, mnt) = mounted_through_a_server(&env, &[]);
    let dir = inside(&mnt.join("latest"), &src);
    // Both directories listed (their trees read) while the server is up.
    assert_eq!(names(&dir.join("b")), ["second.bin"]);
    assert!(fs::read(dir.join("a/first.bin")).unwrap() == first);
    drop(srv);
    // Retried for a few seconds, then EIO; the mount keeps answering.
    let t = Instant::now();
    let err = fs::read(dir.join("b/second.bin")).unwrap_err();
    assert_eq!(err.raw_os_error(), Some(libc::EIO), "{err}");
    assert!(t.elapsed() < Duration::from_secs(30), "{:?}", t.elapsed());
    assert_eq!(names(&dir.join("a")), ["first.bin"]);
    assert!(
        fs::read(dir.join("a/first.bin")).unwrap() == first,
        "cached"
    );
    m.lines
        .as_mut()
        .unwrap()
        .wait_for("second.bin", Duration::from_secs(10));
    m.signal(nix::sys::signal::Signal::SIGTERM);
    let (status, log) = m.wait(Duration::from_secs(30));
    assert!(status.success(), "{status:?}: {log}");
    assert!(!is_mounted(&mnt));
}

/// A server that stops answering (it takes connections and says nothing, as a
/// hung S3 or a network black hole does): a read gives EIO within seconds, not
/// minutes, and what was listed before keeps answering once the idle session is
/// gone, the top level too (QA: a read took 135 s, `ls` of a listed directory
/// 160 s, both behind the session's reopening).
#[test]
fn a_server_that_stops_answering_gives_eio_and_listed_directories_still_answer() {
    let env = Env::new();
    env.init(&[]);
    let src = env.path("src");
    fs::create_dir_all(src.join("a")).unwrap();
    fs::create_dir_all(src.join("b")).unwrap();
    fs::write(src.join("a/first.bin"), Rng(22).bytes(400_000, false)).unwrap();
    fs::write(src.join("b/second.bin"), Rng(23).bytes(400_000, false)).unwrap();
    env.backup(&[&src]);
    let (srv, m, mnt) = mounted_through_a_server(&env, &["--idle-secs", "1"]);
    let dir = inside(&mnt.join("latest"), &src);
    assert_eq!(names(&dir.join("b")), ["second.bin"]);
    assert_eq!(names(&dir), ["a", "b"]);
    srv.signal(nix::sys::signal::Signal::SIGSTOP);
    let t = Instant::now();
    let err = fs::read(dir.join("b/second.bin")).unwrap_err();
    assert_eq!(err.raw_os_error(), Some(libc::EIO), "{err}");
    assert!(t.elapsed() < Duration::from_secs(45), "{:?}", t.elapsed());
    // Idle: the session is gone. The next look at the top level lists the
    // snapshots again, which cannot finish: it answers from what it has.
    std::thread::sleep(Duration::from_millis(1500));
    let t = Instant::now();
    assert_eq!(names(&dir), ["a", "b"]);
    assert_eq!(names(&dir.join("b")), ["second.bin"]);
    assert!(fs::metadata(mnt.join("latest")).is_ok());
    assert!(t.elapsed() < Duration::from_secs(15), "{:?}", t.elapsed());
    drop(srv);
    drop(m);
    assert!(!is_mounted(&mnt));
}

/// `--memory-limit` on a mount: its caches are sized from what the index leaves and
/// said at start; a `--cache-size` that does not fit, or a limit the index and the
/// program alone exceed, is refused before anything is mounted.
#[test]
fn a_mount_sizes_its_caches_to_the_memory_limit_or_refuses() {
    let env = Env::new();
    env.init(&[]);
    let src = env.path("src");
    fs::create_dir_all(&src).unwrap();
    let data = Rng(71).bytes(3 << 20, false);
    fs::write(src.join("f"), &data).unwrap();
    env.backup(&[&src]);
    let mnt = env.path("mnt");
    let mut m = Mount::start(&env, &mnt, &["--memory-limit", "110M"]);
    let said = m.lines.as_mut().unwrap().seen();
    // 110 MiB - 48 MiB for the program - a tiny index: 62 MiB, a third each.
    assert!(
        said.contains("within the limit of 110.0 MiB")
            && said
                .contains("the mount caches 20.7 MiB of file content and 20.7 MiB of directories"),
        "{said}"
    );
    let root = mnt.join("latest").join(src.strip_prefix("/").unwrap());
    assert!(fs::read(root.join("f")).unwrap() == data);
    // The repository keeps its index in RAM, but the mount looks it up on local
    // disk (the SSD placement's files, in the cache directory), so its memory does
    // not grow with the repository.
    assert!(said.contains("SSD placement"), "{said}");
    let built = fs::read_dir(env.path("cache").join("cairn").join("index"))
        .map(|d| d.count())
        .unwrap_or(0);
    assert!(built > 0, "no on-disk index under the cache directory");
    drop(m);
    let other = env.path("mnt2");
    fs::create_dir_all(&other).unwrap();
    let o = env.fails(
        &[
            "mount",
            other.to_str().unwrap(),
            "--memory-limit",
            "110M",
            "--cache-size",
            "1G",
        ],
        1,
    );
    assert!(o.contains("--cache-size 1.0 GiB does not fit"), "{o}");
    let o = env.fails(
        &["mount", other.to_str().unwrap(), "--memory-limit", "50M"],
        1,
    );
    assert!(
        o.contains("cannot be met") && o.contains("raise the limit"),
        "{o}"
    );
    assert!(!is_mounted(&other));
}

/// `user::rw- user:1234:r-- group::r-- mask::r-- other::r--` as Linux stores it.
fn acl_bytes() -> Vec<u8> {
    posix_acl(&[
        (0x01, 6, u32::MAX),
        (0x02, 4, 1234),
        (0x04, 4, u32::MAX),
        (0x10, 4, u32::MAX),
        (0x20, 4, u32::MAX),
    ])
}

fn acl_errno(path: &Path) -> Option<i32> {
    match xattr::get(path, "system.posix_acl_access") {
        Ok(None) => Some(libc::ENODATA),
        Ok(Some(v)) => panic!("{}: an ACL of {} bytes", path.display(), v.len()),
        Err(e) => e.raw_os_error(),
    }
}

/// The `ls -l` lines of `dirs`, listed by one process (GNU ls remembers a
/// device's "not supported" across its arguments), with `+` marking an ACL.
fn ls_marks(dirs: &[PathBuf]) -> Vec<String> {
    let out = Command::new("ls").arg("-l").args(dirs).output().unwrap();
    assert!(out.status.success(), "{out:?}");
    String::from_utf8(out.stdout)
        .unwrap()
        .lines()
        .filter(|l| l.starts_with('-') || l.starts_with('d'))
        .map(|l| {
            let name = l.rsplit(' ').next().unwrap();
            format!("{name}{}", if l.contains("+ ") { " +" } else { "" })
        })
        .collect()
}

#[test]
fn acls_show_as_recorded_and_an_acl_free_snapshot_is_not_asked_file_by_file() {
    let env = Env::new();
    env.init(&[]);
    let src = env.path("src");
    fs::create_dir_all(src.join("b-acl")).unwrap();
    fs::create_dir_all(src.join("a-plain")).unwrap();
    fs::write(src.join("a-plain/f"), "f").unwrap();
    fs::write(src.join("b-acl/granted"), "g").unwrap();
    fs::write(src.join("b-acl/plain"), "p").unwrap();
    let acl = acl_bytes();
    xattr::set(src.join("b-acl/granted"), "system.posix_acl_access", &acl)
        .expect("the test directory's file system must take POSIX ACLs");
    xattr::set(src.join("b-acl"), "system.posix_acl_default", &acl).unwrap();
    let with = backup_host(&env, &src, "h");
    let without = backup_host(&env, &src.join("a-plain"), "h");
    let snaps: serde_json::Value = serde_json::from_str(&env.ok(&["snapshots", "--json"])).unwrap();
    let counts: Vec<_> = snaps
        .as_array()
        .unwrap()
        .iter()
        .map(|s| {
            (
                s["id"].as_str().unwrap(),
                s["summary"]["entries_with_acl"].as_u64(),
            )
        })
        .collect();
    assert!(counts.contains(&(with.as_str(), Some(2))), "{counts:?}");
    assert!(counts.contains(&(without.as_str(), Some(0))), "{counts:?}");

    let mnt = env.path("mnt");
    let m = Mount::start(&env, &mnt, &[]);
    let snap = mnt.join("snapshots");
    // A snapshot with ACLs: every ACL as recorded, getfacl-style reads and `cp
    // -a` get them, and an absent one is ENODATA everywhere, so one `ls` of
    // several directories marks every file that has one.
    let root = inside(&snap.join(&with), &src);
    assert_eq!(
        xattr::get(root.join("b-acl/granted"), "system.posix_acl_access").unwrap(),
        Some(acl.clone())
    );
    assert_eq!(
        xattr::get(root.join("b-acl"), "system.posix_acl_default").unwrap(),
        Some(acl.clone())
    );
    for f in ["a-plain/f", "b-acl/plain", "a-plain", "b-acl"] {
        assert_eq!(acl_errno(&root.join(f)), Some(libc::ENODATA), "{f}");
    }
    assert_eq!(
        ls_marks(&[root.clone(), root.join("a-plain"), root.join("b-acl")]),
        ["a-plain", "b-acl +", "f", "granted +", "plain"]
    );
    let copy = env.path("copy");
    let ok = Command::new("cp")
        .arg("-a")
        .arg(root.join("b-acl"))
        .arg(&copy)
        .status()
        .unwrap();
    assert!(ok.success());
    assert_eq!(
        xattr::get(copy.join("granted"), "system.posix_acl_access").unwrap(),
        Some(acl.clone())
    );
    // A snapshot that records no ACL: "not supported", which `ls -l` remembers
    // for the device instead of asking every file.
    let plain = inside(&snap.join(&without), &src.join("a-plain"));
    assert_eq!(acl_errno(&plain.join("f")), Some(libc::EOPNOTSUPP));
    assert_eq!(acl_errno(&plain), Some(libc::EOPNOTSUPP));
    drop(m);

    // With --allow-other the kernel checks permissions against ACLs, and would
    // fail its checks on "not supported": ENODATA everywhere.
    if nix::unistd::geteuid().is_root() {
        let _m = Mount::start(&env, &mnt, &["--allow-other"]);
        let plain = inside(&snap.join(&without), &src.join("a-plain"));
        assert_eq!(acl_errno(&plain.join("f")), Some(libc::ENODATA));
        let root = inside(&snap.join(&with), &src);
        assert_eq!(
            xattr::get(root.join("b-acl/granted"), "system.posix_acl_access").unwrap(),
            Some(acl)
        );
    }
}

#[test]
fn a_snapshot_from_before_acls_were_counted_answers_by_directory() {
    // v1's snapshots have no ACL count and no ACLs: a file of a directory without
    // ACLs is "not supported", a directory is ENODATA (`ls -l DIR` asks DIR first,
    // and its entries may have ACLs).
    let env = crate::golden::unpack("v1");
    let mnt = env.path("mnt");
    let _m = Mount::start(&env, &mnt, &[]);
    let root = mnt.join("latest/tmp/cairn-golden-src");
    assert_eq!(acl_errno(&root.join("docs")), Some(libc::ENODATA));
    let file = fs::read_dir(root.join("docs"))
        .unwrap()
        .map(|e| e.unwrap())
        .find(|e| e.file_type().unwrap().is_file())
        .expect("a file in docs/")
        .path();
    assert_eq!(
        acl_errno(&file),
        Some(libc::EOPNOTSUPP),
        "{}",
        file.display()
    );
}

/// Reads `what` (a file or the files of a directory, in name order) through a
/// mount of `cairn serve`, checks each against `expect`, and gives the requests
/// the mount made.
fn remote_mount_requests(
    env: &Env,
    src: &Path,
    what: &str,
    expect: &dyn Fn(&str) -> Vec<u8>,
) -> u64 {
    let srv = crate::server::Server::start(&env.path("state"), &[("main", &env.repo)], true);
    let token = srv.token("mount", "main", "restore");
    let mnt = env.path("mnt");
    let mut c =
        crate::server::client_cmd(env, &srv, "main", &token, &["mount", mnt.to_str().unwrap()]);
    c.env("CAIRN_TRAFFIC_REPORT", "1");
    let m = Mount::spawn(c, &mnt);
    let path = inside(&mnt.join("latest"), src).join(what);
    let files: Vec<String> = if path.is_dir() {
        names(&path)
            .into_iter()
            .map(|n| format!("{what}/{n}"))
            .collect()
    } else {
        vec![what.to_string()]
    };
    for f in &files {
        let got = fs::read(inside(&mnt.join("latest"), src).join(f)).unwrap();
        assert!(got == expect(f), "{f} read through the mount differs");
    }
    m.signal(nix::sys::signal::Signal::SIGTERM);
    let (status, log) = m.wait(Duration::from_secs(30));
    assert!(status.success(), "{status:?}: {log}");
    log.lines()
        .filter(|l| l.starts_with("traffic: "))
        .map(|l| {
            let n = l.trim_end_matches(" requests").rsplit(' ').next().unwrap();
            n.parse::<u64>().unwrap()
        })
        .sum()
}

/// A file read through a mount of a remote repository: read-ahead takes blobs
/// side by side in a pack with one range request, not a request per blob.
#[test]
fn a_remote_mount_reads_ahead_several_blobs_per_request() {
    let env = Env::new();
    env.init(&[]);
    let src = env.path("src");
    fs::create_dir_all(&src).unwrap();
    let data = Rng(33).bytes(6 << 20, false);
    fs::write(src.join("big"), &data).unwrap();
    let out = env.ok(&["backup", "--json", src.to_str().unwrap()]);
    let v: serde_json::Value = serde_json::from_str(&out).unwrap();
    let blobs = v["blobs_added"].as_u64().unwrap();
    assert!(blobs > 200, "{out}");
    let requests = remote_mount_requests(&env, &src, "big", &|_| data.clone());
    // Blob by blob this was more than `blobs` requests (333 for 324).
    assert!(
        requests > 0 && requests * 3 < blobs,
        "{requests} requests for {blobs} blobs"
    );
}

/// The small files of a directory read one after the other through a mount of a
/// remote repository (as a copy of the tree reads them): the next ones are
/// fetched ahead together, not with a request each.
#[test]
fn a_remote_mount_reads_a_directory_of_small_files_ahead() {
    let env = Env::new();
    env.init(&[]);
    let src = env.path("src");
    fs::create_dir_all(src.join("many")).unwrap();
    let content = |f: &str| -> Vec<u8> {
        let i: u64 = f.rsplit('-').next().unwrap().parse().unwrap();
        Rng(1000 + i).bytes(1000 + (i as usize * 37) % 3000, false)
    };
    const FILES: u64 = 200;
    for i in 0..FILES {
        let name = format!("many/f-{i:03}");
        fs::write(src.join(&name), content(&name)).unwrap();
    }
    env.backup(&[&src]);
    let requests = remote_mount_requests(&env, &src, "many", &content);
    // A request per file was more than 200.
    assert!(
        requests > 0 && requests * 2 < FILES,
        "{requests} requests for {FILES} files"
    );
}

/// `latest` and `hosts/HOST/latest` follow new backups and forgotten snapshots
/// (the kernel caches a symlink's target, so a new target is a new inode), and
/// two hosts whose names differ only by a `/` get two directories.
#[test]
fn latest_links_follow_the_snapshot_list_and_hosts_stay_apart() {
    let env = Env::new();
    env.init(&[]);
    let src = env.path("src");
    fs::create_dir_all(&src).unwrap();
    fs::write(src.join("f"), b"1").unwrap();
    let s = src.to_str().unwrap();
    let backup = |host: &str| env.backup_args(&["--host", host, s]);
    let s1 = backup("web_01");
    let mnt = env.path("mnt");
    let _m = Mount::start(&env, &mnt, &["--refresh-secs", "1"]);
    let link = |p: &str| fs::read_link(mnt.join(p)).map(|t| t.to_string_lossy().into_owned());
    assert_eq!(link("latest").unwrap(), format!("snapshots/{s1}"));
    let first_date = link("hosts/web_01/latest").unwrap();
    fs::write(src.join("f"), b"2").unwrap();
    let s2 = backup("web_01");
    let s3 = backup("web/01");
    // Looked at after the refresh time: the new list, new targets.
    wait_until(
        "latest to follow the new backup",
        Duration::from_secs(20),
        || {
            names(&mnt.join("hosts")).len() == 2
                && link("latest").ok() == Some(format!("snapshots/{s3}"))
        },
    );
    assert_eq!(names(&mnt.join("hosts")), ["web%2F01", "web_01"]);
    let date = link("hosts/web_01/latest").unwrap();
    assert_ne!(date, first_date);
    assert_eq!(
        fs::read(inside(&mnt.join("hosts/web_01").join(&date), &src).join("f")).unwrap(),
        b"2"
    );
    assert_eq!(
        names(&mnt.join("hosts/web%2F01")).len(),
        2,
        "a date and latest"
    );
    // The newest forgotten: latest goes back to the one before, never dangles.
    env.ok(&["forget", &s3]);
    wait_until(
        "latest to leave a forgotten snapshot",
        Duration::from_secs(20),
        || names(&mnt).len() == 3 && link("latest").ok() == Some(format!("snapshots/{s2}")),
    );
    assert_eq!(
        fs::read(inside(&mnt.join("latest"), &src).join("f")).unwrap(),
        b"2"
    );
    assert_eq!(names(&mnt.join("hosts")), ["web_01"]);
}

/// A mount point inside the repository is refused before anything is mounted
/// (QA r16: mounted on the repository's `snapshots/`, it hid them, and a prune
/// saw none and retired every pack); a `--max-inodes` too small is a usage error.
#[test]
fn a_mount_point_inside_the_repository_is_refused() {
    let env = one_tiny_snapshot();
    let inside = env.repo.join("mnt");
    fs::create_dir_all(&inside).unwrap();
    let link = env.path("looks-outside");
    std::os::unix::fs::symlink(&inside, &link).unwrap();
    for dir in [&inside, &link] {
        let e = env.fails(&["mount", dir.to_str().unwrap()], 1);
        assert!(e.contains("is inside the repository being mounted"), "{e}");
    }
    let out = env.path("out");
    fs::create_dir_all(&out).unwrap();
    env.fails(&["mount", out.to_str().unwrap(), "--max-inodes", "0"], 2);
    fs::remove_dir(&inside).unwrap();
    env.check_clean();
}
