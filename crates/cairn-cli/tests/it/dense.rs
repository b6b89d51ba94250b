//! Dense trees: many directories and small files, walked by the scanner threads
//! (more directories than they are handed at once, so the walker also scans some
//! itself), small files read by the workers, large ones by the walker.

use crate::util::*;
use std::fs;
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};

/// More directories than the scanners are handed at once (256), some deep, with
/// files on both sides of the 1 MiB small-file limit.
fn make_dense_tree(root: &Path, rng: &mut Rng) {
    for i in 0..1300 {
        let d = root.join(format!("d{:02}/s{i:04}", i % 40));
        fs::create_dir_all(&d).unwrap();
        for j in 0..(i % 4) {
            let n = 1 + rng.below(3000) as usize;
            fs::write(d.join(format!("f{j}")), rng.bytes(n, j % 2 == 0)).unwrap();
        }
        if i % 97 == 0 {
            fs::write(d.join("empty"), b"").unwrap();
        }
    }
    let mut deep = root.join("deep");
    for i in 0..60 {
        deep.push(format!("level{i}"));
    }
    fs::create_dir_all(&deep).unwrap();
    fs::write(deep.join("bottom"), b"deep file").unwrap();
    let edge = root.join("edge");
    fs::create_dir_all(&edge).unwrap();
    fs::write(edge.join("exactly-1MiB"), rng.bytes(1 << 20, false)).unwrap();
    fs::write(edge.join("1MiB-plus-1"), rng.bytes((1 << 20) + 1, false)).unwrap();
    fs::write(edge.join("3MiB"), rng.bytes(3 << 20, true)).unwrap();
    std::os::unix::fs::symlink("../d00", edge.join("link")).unwrap();
    xattr::set(edge.join("exactly-1MiB"), "user.kind", b"edge").unwrap();
    // Read by the walker (over 1 MiB), its xattrs from the open file.
    xattr::set(edge.join("3MiB"), "user.kind", b"large").unwrap();
}

#[test]
fn dense_tree_round_trips_and_rebackups_read_only_what_changed() {
    let env = Env::new();
    env.init(&["--block-size", "8K"]);
    let src = env.path("src");
    let mut rng = Rng(41);
    make_dense_tree(&src, &mut rng);
    // Access times the first backup must not move (relatime would: atime == mtime).
    let watched = [
        "d00",
        "d00/s0040",
        "deep/level0",
        "d01/s0001/f0",
        "edge/3MiB",
    ];
    let atimes = |src: &Path| -> Vec<i64> {
        watched
            .iter()
            .map(|w| fs::symlink_metadata(src.join(w)).unwrap().atime())
            .collect()
    };
    let before = atimes(&src);
    let v = env.backup_json(&[&src]);
    assert_eq!(atimes(&src), before, "the backup moved access times");
    let files = v["files_new"].as_u64().unwrap();
    assert!(files > 1900, "{v}");
    assert_eq!(v["entries_skipped"], 0, "{v}");
    let s1 = v["snapshot_id"].as_str().unwrap().to_string();

    // Unchanged: nothing read, every file reused.
    let v = env.backup_json(&[&src]);
    assert_eq!(v["bytes_read"], 0, "{v}");
    assert_eq!(v["files_unchanged"].as_u64().unwrap(), files, "{v}");

    // Someone reads files and lists directories: access times move, nothing else.
    // Only the trees above the source (/, /tmp, ...: other tests change them) may be
    // new; a tree per directory read would be dozens.
    for i in 0..32 {
        let d = src.join(format!("d01/s{:04}", i * 40 + 1));
        for e in fs::read_dir(&d).unwrap() {
            let _ = fs::read(e.unwrap().path()).unwrap();
        }
    }
    let v = env.backup_json(&[&src]);
    assert_eq!(v["bytes_read"], 0, "{v}");
    assert!(v["blobs_added"].as_u64().unwrap() <= 3, "{v}");

    let r1 = env.restore(&s1, &src, "out1");
    assert_same(&src, &r1);
    let copy1 = env.path("copy1");
    copy_tree(&src, &copy1);

    // A rewritten small file, a new xattr on an unchanged-content file (only its
    // ctime moves), a removed and an added directory: each is seen.
    fs::write(src.join("d05/s0005/f0"), b"rewritten").unwrap();
    xattr::set(src.join("d07/s0007/f0"), "user.added", b"later").unwrap();
    xattr::remove(src.join("edge/exactly-1MiB"), "user.kind").unwrap();
    fs::remove_dir_all(src.join("d09")).unwrap();
    fs::create_dir_all(src.join("d10/new-dir")).unwrap();
    fs::write(src.join("d10/new-dir/new"), rng.bytes(5000, true)).unwrap();
    let v = env.backup_json(&[&src]);
    assert_eq!(v["files_new"], 1, "{v}");
    // The rewritten file is read; so are the two whose xattrs changed (their
    // ctime moved): a read that keeps the metadata exact.
    assert_eq!(v["files_changed"], 3, "{v}");
    let s3 = v["snapshot_id"].as_str().unwrap().to_string();
    let r3 = env.restore(&s3, &src, "out3");
    assert_same(&src, &r3);
    assert_eq!(
        xattr::get(r3.join("d07/s0007/f0"), "user.added")
            .unwrap()
            .as_deref(),
        Some(&b"later"[..])
    );
    assert_eq!(
        xattr::get(r3.join("edge/exactly-1MiB"), "user.kind").unwrap(),
        None
    );
    // The first snapshot is still exactly the first tree.
    let r1 = env.restore(&s1, &src, "out1b");
    assert_same(&copy1, &r1);
    env.check_clean();
}

#[test]
fn excluded_directories_are_not_scanned() {
    let env = Env::new();
    env.init(&[]);
    let src = env.path("src");
    let mut rng = Rng(8);
    make_dense_tree(&src, &mut rng);
    fs::create_dir_all(src.join("d03/cache/inner")).unwrap();
    fs::write(src.join("d03/cache/inner/x"), b"excluded").unwrap();
    let out = env.ok(&[
        "backup",
        "--exclude",
        "cache",
        "--exclude",
        "s0001",
        "--json",
        src.to_str().unwrap(),
    ]);
    let v: serde_json::Value = serde_json::from_str(&out).unwrap();
    assert_eq!(v["entries_skipped"], 0, "{v}");
    let snap = v["snapshot_id"].as_str().unwrap();
    let listing = env.ok(&["ls", snap]);
    assert!(!listing.contains("/cache"), "excluded dir listed");
    assert!(!listing.contains("s0001"), "excluded dir listed");
    assert!(listing.contains("s0002"));
    assert!(listing.contains("level59/bottom"));
}

/// An rsnapshot-style tree (each day a hard-linked copy of the one before, a
/// few files new) is read once per inode, not once per name: the other names take
/// the content their inode was read with (one changed since is read again: the
/// unit tests of `backup::links`), and everything restores as it was, links and
/// xattrs too.
#[test]
fn hard_linked_names_are_read_once() {
    let env = Env::new();
    env.init(&[]);
    let src = env.path("src");
    let mut rng = Rng(0x11_4e);
    let day0 = src.join("daily.0");
    fs::create_dir_all(&day0).unwrap();
    // Large files (read by the walker) and small ones (read by workers).
    let mut sizes = vec![3 << 20, 2 << 20];
    sizes.extend((0..40).map(|i| 1000 + i * 97));
    let mut total = 0u64;
    for (i, n) in sizes.iter().enumerate() {
        fs::write(day0.join(format!("f{i}")), rng.bytes(*n, false)).unwrap();
        total += *n as u64;
    }
    xattr::set(day0.join("f3"), "user.kept", b"on every name").unwrap();
    for day in 1..4 {
        let d = src.join(format!("daily.{day}"));
        fs::create_dir_all(&d).unwrap();
        for i in 0..sizes.len() {
            fs::hard_link(day0.join(format!("f{i}")), d.join(format!("f{i}"))).unwrap();
        }
        fs::write(d.join("only-today"), rng.bytes(5000, false)).unwrap();
    }
    let v = env.backup_json(&[&src]);
    let read = v["bytes_read"].as_u64().unwrap();
    assert!(
        read < total + total / 2,
        "{read} bytes read for {total} bytes under 4 names each: {v}"
    );
    assert_eq!(
        v["files_new"].as_u64().unwrap(),
        4 * sizes.len() as u64 + 3,
        "{v}"
    );
    let s = v["snapshot_id"].as_str().unwrap().to_string();
    let out = env.restore(&s, &src, "out");
    assert_same(&src, &out);
    let back = fs::symlink_metadata(out.join("daily.3/f0")).unwrap();
    assert_eq!(back.nlink(), 4);
    assert_eq!(
        xattr::get(out.join("daily.2/f3"), "user.kept")
            .unwrap()
            .as_deref(),
        Some(&b"on every name"[..])
    );
    env.check_clean();
}

/// A backup of `src` holding `a/f` (`size` random bytes) hard-linked as `b/f`, and
/// `b/c`, paused at `point` (its first hit) until `pause/go` exists.
fn paused_at_a_linked_file(
    size: usize,
    point: &str,
) -> (Env, PathBuf, Vec<u8>, std::process::Child, PathBuf) {
    let env = Env::new();
    env.init(&[]);
    let src = env.path("src");
    fs::create_dir_all(src.join("a")).unwrap();
    fs::create_dir_all(src.join("b")).unwrap();
    let old = Rng(21).bytes(size, false);
    fs::write(src.join("a/f"), &old).unwrap();
    fs::hard_link(src.join("a/f"), src.join("b/f")).unwrap();
    fs::write(src.join("b/c"), b"other").unwrap();
    let pause = env.path("pause");
    fs::create_dir_all(&pause).unwrap();
    let child = env
        .cmd(&["backup", "--json", src.to_str().unwrap()])
        .env(
            "CAIRN_TEST_PAUSE_AT",
            format!("{point}:1:{}", pause.display()),
        )
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    wait_until(
        "the backup to reach the first name",
        std::time::Duration::from_secs(60),
        || pause.join("reached").exists(),
    );
    (env, src, old, child, pause)
}

/// The first name of a hard-linked file replaced (a save by rename), or renamed
/// away, between the walk's look at it and its read: its other names are read
/// themselves, not left out (QA: they were left out as "could not be read
/// whole", the only copy of the old content missing from the snapshot).
#[test]
fn a_hard_linked_files_other_names_are_read_when_its_first_name_went() {
    // Large (read by the walker, so the later name is decided after it) and
    // small (read by a worker while the walk goes on).
    for (how, size, point) in [
        ("replaced", 3 << 20, "backup:link-open"),
        ("renamed", 3 << 20, "backup:link-open"),
        ("replaced", 100_000, "backup:link-open-small"),
        ("renamed", 100_000, "backup:link-open-small"),
    ] {
        let (env, src, old, child, pause) = paused_at_a_linked_file(size, point);
        match how {
            "replaced" => {
                fs::write(src.join("a/f.tmp"), b"new content").unwrap();
                fs::rename(src.join("a/f.tmp"), src.join("a/f")).unwrap();
            }
            _ => fs::rename(src.join("a/f"), src.join("a/moved")).unwrap(),
        }
        fs::write(pause.join("go"), b"").unwrap();
        let o = child.wait_with_output().unwrap();
        let err = String::from_utf8_lossy(&o.stderr);
        let v: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
        let s = v["snapshot_id"].as_str().unwrap().to_string();
        let out = env.path("out");
        env.ok(&["restore", &s, "--target", out.to_str().unwrap()]);
        let back = out.join(src.strip_prefix("/").unwrap());
        assert!(
            fs::read(back.join("b/f")).unwrap() == old,
            "{how} ({size} bytes): b/f lost: {v} {err}"
        );
        if how == "replaced" {
            assert_eq!(fs::read(back.join("a/f")).unwrap(), b"new content");
        }
    }
}

/// A file that becomes a FIFO between the walk seeing it and the backup opening
/// it (QA: the open waited for a writer forever, and the backup with it) is
/// skipped with a warning that says what it is now; the rest is saved (exit 3).
#[test]
fn a_file_turned_into_a_fifo_during_the_backup_is_skipped_not_waited_on() {
    use std::os::unix::process::ExitStatusExt;
    for (size, point) in [
        (3 << 20, "backup:link-open"),
        (100_000, "backup:link-open-small"),
    ] {
        let (env, src, old, mut child, pause) = paused_at_a_linked_file(size, point);
        fs::remove_file(src.join("a/f")).unwrap();
        nix::unistd::mkfifo(&src.join("a/f"), nix::sys::stat::Mode::S_IRWXU).unwrap();
        fs::write(pause.join("go"), b"").unwrap();
        let start = std::time::Instant::now();
        while child.try_wait().unwrap().is_none() {
            if start.elapsed() > std::time::Duration::from_secs(60) {
                let _ = child.kill();
                panic!("{size} bytes: the backup still waits on the FIFO after a minute");
            }
            std::thread::sleep(std::time::Duration::from_millis(50));
        }
        let o = child.wait_with_output().unwrap();
        let err = String::from_utf8_lossy(&o.stderr);
        assert_eq!(
            o.status.code(),
            Some(3),
            "{size}: {:?} {err}",
            o.status.signal()
        );
        assert!(
            err.contains("no longer a regular file (it is now a FIFO)"),
            "{size}: {err}"
        );
        let v: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
        let s = v["snapshot_id"].as_str().unwrap().to_string();
        let out = env.path("out");
        env.ok(&["restore", &s, "--target", out.to_str().unwrap()]);
        let back = out.join(src.strip_prefix("/").unwrap());
        assert_eq!(fs::read(back.join("b/f")).unwrap(), old, "{size}");
        assert_eq!(fs::read(back.join("b/c")).unwrap(), b"other");
    }
}
