//! Helpers for driving the real `cairn` binary, generating source trees with every
//! kind of entry, and comparing trees exactly.

use std::collections::{BTreeMap, HashMap};
use std::ffi::OsStr;
use std::fs;
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};
use std::time::{Duration, Instant};

pub const PASSWORD: &str = "correct horse battery staple";

pub fn bin() -> &'static str {
    env!("CARGO_BIN_EXE_cairn")
}

/// A scratch area with a repository path, cleaned up on drop.
pub struct Env {
    pub dir: tempfile::TempDir,
    pub repo: PathBuf,
    /// What `--repo` gets: `repo`'s path, or an `s3:` location.
    pub location: String,
}

impl Env {
    pub fn new() -> Self {
        let dir = tempfile::Builder::new()
            .prefix("cairn-it-")
            .tempdir()
            .unwrap();
        let repo = dir.path().join("repo");
        let location = repo.to_string_lossy().into_owned();
        Env {
            dir,
            repo,
            location,
        }
    }

    /// A repository at `repo` with scratch space `dir`.
    pub fn at(dir: tempfile::TempDir, repo: PathBuf) -> Self {
        let location = repo.to_string_lossy().into_owned();
        Env {
            dir,
            repo,
            location,
        }
    }

    /// A repository on the loopback S3 server that scripts/test.sh starts, under a
    /// prefix of its own. Fails (never skips) when the server is not there.
    pub fn s3(test: &str) -> Self {
        let mut env = Env::new();
        env.location = s3_location(test);
        env
    }

    pub fn path(&self, p: &str) -> PathBuf {
        self.dir.path().join(p)
    }

    pub fn cmd(&self, args: &[&str]) -> Command {
        let mut c = Command::new(bin());
        c.arg("--repo").arg(&self.location);
        c.args(args);
        c.env("CAIRN_PASSWORD", PASSWORD);
        // The cache of remote repositories and copy maps stay in the scratch area.
        c.env("XDG_CACHE_HOME", self.dir.path().join("cache"));
        c.env_remove("CAIRN_FAULTS");
        c.env_remove(cairn_core::hooks::KILL_AT_VAR);
        c.env_remove("CAIRN_LIMIT_UPLOAD");
        c.env_remove("CAIRN_LIMIT_DOWNLOAD");
        c.env_remove("CAIRN_REPO");
        c.env_remove("CAIRN_PASSWORD_FILE");
        c.env_remove("CAIRN_PASSWORD_COMMAND");
        c.env_remove("CAIRN_TOKEN");
        c.env_remove("CAIRN_TOKEN_FILE");
        c.env_remove("CAIRN_SERVER_FINGERPRINT");
        c.stdin(Stdio::null());
        c
    }

    /// Runs and returns the output, whatever the exit code.
    pub fn run(&self, args: &[&str]) -> Output {
        self.cmd(args).output().unwrap()
    }

    /// Runs and asserts success; returns stdout.
    pub fn ok(&self, args: &[&str]) -> String {
        let o = self.run(args);
        assert!(
            o.status.success(),
            "cairn {args:?} failed with {:?}\nstdout: {}\nstderr: {}",
            o.status.code(),
            String::from_utf8_lossy(&o.stdout),
            String::from_utf8_lossy(&o.stderr)
        );
        String::from_utf8_lossy(&o.stdout).into_owned()
    }

    /// Runs and asserts failure with `code`; returns stderr.
    pub fn fails(&self, args: &[&str], code: i32) -> String {
        let o = self.run(args);
        let stderr = String::from_utf8_lossy(&o.stderr).into_owned();
        assert_eq!(
            o.status.code(),
            Some(code),
            "cairn {args:?}: expected exit {code}\nstdout: {}\nstderr: {stderr}",
            String::from_utf8_lossy(&o.stdout)
        );
        assert!(!stderr.contains("panicked"), "panic: {stderr}");
        stderr
    }

    pub fn init(&self, extra: &[&str]) {
        let mut a = vec!["init"];
        a.extend_from_slice(extra);
        self.ok(&a);
    }

    /// Backs up and returns the snapshot id.
    pub fn backup(&self, paths: &[&Path]) -> String {
        let a: Vec<String> = paths
            .iter()
            .map(|p| p.to_string_lossy().into_owned())
            .collect();
        let refs: Vec<&str> = a.iter().map(String::as_str).collect();
        self.backup_args(&refs)
    }

    /// `backup --json ARGS...` (options and paths): the snapshot id.
    pub fn backup_args(&self, args: &[&str]) -> String {
        let out = self.ok(&[&["backup", "--json"][..], args].concat());
        let v: serde_json::Value = serde_json::from_str(&out).unwrap();
        v["snapshot_id"].as_str().unwrap().to_string()
    }

    pub fn backup_json(&self, paths: &[&Path]) -> serde_json::Value {
        let mut a: Vec<String> = vec!["backup".into(), "--json".into()];
        a.extend(paths.iter().map(|p| p.to_string_lossy().into_owned()));
        let refs: Vec<&str> = a.iter().map(String::as_str).collect();
        serde_json::from_str(&self.ok(&refs)).unwrap()
    }

    /// Restores `snap` into a fresh directory and returns the restored copy of `src`.
    pub fn restore(&self, snap: &str, src: &Path, into: &str) -> PathBuf {
        let target = self.path(into);
        self.ok(&["restore", snap, "--target", target.to_str().unwrap()]);
        target.join(src.strip_prefix("/").unwrap())
    }

    /// Ids of the snapshots in the repository, oldest first.
    pub fn snapshot_ids(&self) -> Vec<String> {
        let v: serde_json::Value =
            serde_json::from_str(&self.ok(&["snapshots", "--json"])).unwrap();
        v.as_array()
            .unwrap()
            .iter()
            .map(|s| s["id"].as_str().unwrap().to_string())
            .collect()
    }

    pub fn check_clean(&self) {
        let out = self.ok(&["check", "--read-data"]);
        assert!(out.contains("no errors were found"), "{out}");
    }
}

/// Polls `f` until it holds, failing the test after `timeout`: for states nothing
/// announces (a lock file appearing, a counter moving). The poll interval only sets
/// how soon the wait notices; whether the test passes depends on the condition alone.
pub fn wait_until(what: &str, timeout: Duration, mut f: impl FnMut() -> bool) {
    let t = Instant::now();
    while !f() {
        assert!(
            t.elapsed() < timeout,
            "timed out after {timeout:?} waiting for {what}"
        );
        std::thread::sleep(Duration::from_millis(10));
    }
}

/// A child's stderr read line by line on a thread, so that a test waits for the line
/// in which cairn reports a state (a job queued, a phase begun) instead of sleeping
/// and hoping the state was reached.
pub struct StderrLines {
    rx: std::sync::mpsc::Receiver<String>,
    seen: Vec<String>,
}

impl StderrLines {
    /// Takes over `child`'s stderr, which must be piped.
    pub fn of(child: &mut Child) -> Self {
        use std::io::BufRead;
        let err = child.stderr.take().expect("stderr must be piped");
        let (tx, rx) = std::sync::mpsc::channel();
        std::thread::spawn(move || {
            for line in std::io::BufReader::new(err).lines() {
                let Ok(line) = line else { break };
                if tx.send(line).is_err() {
                    break;
                }
            }
        });
        StderrLines {
            rx,
            seen: Vec::new(),
        }
    }

    /// Waits for a line containing `needle` and returns it; fails the test when the
    /// child closes stderr (ends) without one, or after `timeout`.
    pub fn wait_for(&mut self, needle: &str, timeout: Duration) -> String {
        let deadline = Instant::now() + timeout;
        loop {
            let left = deadline.saturating_duration_since(Instant::now());
            match self.rx.recv_timeout(left) {
                Ok(line) => {
                    self.seen.push(line.clone());
                    if line.contains(needle) {
                        return line;
                    }
                }
                Err(e) => panic!(
                    "no line with {needle:?} on stderr ({e}); it said:\n{}",
                    self.seen.join("\n")
                ),
            }
        }
    }

    /// Takes every line written so far, so that the next [`StderrLines::wait_for`]
    /// sees only what comes after.
    pub fn drain(&mut self) {
        while let Ok(line) = self.rx.try_recv() {
            self.seen.push(line);
        }
    }

    /// Every line seen so far, the ones waiting included.
    pub fn seen(&mut self) -> String {
        self.drain();
        self.seen.join("\n")
    }

    /// Everything the child wrote on stderr; call it once the child has ended.
    pub fn all(mut self) -> String {
        self.seen.extend(self.rx.iter());
        self.seen.join("\n")
    }
}

/// A fresh location on the test S3 server (`CAIRN_TEST_S3`, set by scripts/test.sh).
pub fn s3_location(test: &str) -> String {
    let base = std::env::var("CAIRN_TEST_S3").unwrap_or_else(|_| {
        panic!(
            "CAIRN_TEST_S3 is not set: the S3 tests need the MinIO server that \
             scripts/test.sh starts (run the suite with `bash scripts/test.sh`)"
        )
    });
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_nanos();
    format!(
        "{}/it-{test}-{}-{nanos}",
        base.trim_end_matches('/'),
        std::process::id()
    )
}

/// Deterministic pseudo-random bytes (xorshift), optionally compressible.
pub struct Rng(pub u64);

/// `n` files of `size` incompressible bytes in `dir` (made if missing), named
/// `{prefix}0`, `{prefix}1`, ...: file `i` is `Rng(seed + i)`'s, so a test can
/// write one again as it was.
pub fn random_files(dir: &Path, prefix: &str, n: u64, size: usize, seed: u64) {
    std::fs::create_dir_all(dir).unwrap();
    for i in 0..n {
        std::fs::write(
            dir.join(format!("{prefix}{i}")),
            Rng(seed + i).bytes(size, false),
        )
        .unwrap();
    }
}

impl Rng {
    pub fn next(&mut self) -> u64 {
        let mut x = self.0;
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        self.0 = x;
        x
    }
    pub fn below(&mut self, n: u64) -> u64 {
        self.next() % n
    }
    pub fn bytes(&mut self, n: usize, compressible: bool) -> Vec<u8> {
        let mut out = Vec::with_capacity(n + 8);
        if compressible {
            let words: [&[u8]; 8] = [
                b"backup ",
                b"cairn ",
                b"chunk ",
                b"data\n",
                b"restore ",
                b"0123 ",
                b"index ",
                b"pack ",
            ];
            while out.len() < n {
                out.extend_from_slice(words[self.below(8) as usize]);
            }
        } else {
            while out.len() < n {
                out.extend_from_slice(&self.next().to_le_bytes());
            }
        }
        out.truncate(n);
        out
    }
}

pub fn set_times(path: &Path, secs: i64, nanos: i64) {
    use nix::sys::stat::{UtimensatFlags, utimensat};
    use nix::sys::time::TimeSpec;
    let t = TimeSpec::new(secs, nanos);
    utimensat(
        nix::fcntl::AT_FDCWD,
        path,
        &t,
        &t,
        UtimensatFlags::NoFollowSymlink,
    )
    .unwrap();
}

/// `cp -a`: an exact copy (times, modes, links, xattrs) to compare against later.
pub fn copy_tree(from: &Path, to: &Path) {
    let ok = Command::new("cp")
        .arg("-a")
        .arg(from)
        .arg(to)
        .status()
        .unwrap()
        .success();
    assert!(ok, "cp -a {} {}", from.display(), to.display());
}

pub fn is_root() -> bool {
    nix::unistd::geteuid().is_root()
}

/// Creates a tree with every entry type cairn records. Timestamps are set last so
/// they are exact.
pub fn make_full_tree(root: &Path, seed: u64) {
    let mut rng = Rng(seed | 1);
    fs::create_dir_all(root.join("dir/sub/deeper/deepest")).unwrap();
    fs::create_dir_all(root.join("empty-dir")).unwrap();
    fs::create_dir_all(root.join("sticky")).unwrap();
    fs::write(root.join("empty"), b"").unwrap();
    fs::write(root.join("small.txt"), rng.bytes(100, true)).unwrap();
    fs::write(root.join("dir/text.log"), rng.bytes(300_000, true)).unwrap();
    fs::write(root.join("dir/random.bin"), rng.bytes(2_500_000, false)).unwrap();
    // More chunks than fit inline in a tree node: a chunk-list tree.
    fs::write(root.join("dir/sub/big.bin"), rng.bytes(3_000_000, false)).unwrap();
    fs::write(root.join("dir/sub/deeper/deepest/leaf"), b"leaf\n").unwrap();
    // Same content twice: deduplicated.
    let dup = rng.bytes(200_000, false);
    fs::write(root.join("dup-a"), &dup).unwrap();
    fs::write(root.join("dir/dup-b"), &dup).unwrap();
    // Odd names: spaces, unicode, non-UTF-8 bytes, a newline, a leading dash.
    fs::write(root.join("with space"), b"s").unwrap();
    fs::write(root.join("ünïcødé ✓"), b"u").unwrap();
    fs::write(root.join(OsStr::from_bytes(b"bytes-\xff\xfe")), b"b").unwrap();
    fs::write(root.join("new\nline"), b"n").unwrap();
    fs::write(root.join("-rf"), b"dash").unwrap();
    // Permissions.
    fs::write(root.join("private"), b"secret").unwrap();
    fs::set_permissions(root.join("private"), fs::Permissions::from_mode(0o600)).unwrap();
    fs::write(root.join("script.sh"), b"#!/bin/sh\necho hi\n").unwrap();
    fs::set_permissions(root.join("script.sh"), fs::Permissions::from_mode(0o755)).unwrap();
    fs::write(root.join("setuid"), b"x").unwrap();
    fs::set_permissions(root.join("setuid"), fs::Permissions::from_mode(0o4755)).unwrap();
    fs::write(root.join("readonly"), b"r").unwrap();
    fs::set_permissions(root.join("sticky"), fs::Permissions::from_mode(0o1777)).unwrap();
    // Symlinks: relative, absolute, dangling, to a directory.
    std::os::unix::fs::symlink("small.txt", root.join("link-rel")).unwrap();
    std::os::unix::fs::symlink("/etc/hostname", root.join("link-abs")).unwrap();
    std::os::unix::fs::symlink("does/not/exist", root.join("link-dangling")).unwrap();
    std::os::unix::fs::symlink("dir/sub", root.join("link-dir")).unwrap();
    // Hard links: two names in one dir, and three across dirs.
    fs::write(root.join("hard-1"), rng.bytes(5000, true)).unwrap();
    fs::hard_link(root.join("hard-1"), root.join("hard-2")).unwrap();
    fs::write(root.join("dir/tri-1"), b"three names").unwrap();
    fs::hard_link(root.join("dir/tri-1"), root.join("dir/sub/tri-2")).unwrap();
    fs::hard_link(root.join("dir/tri-1"), root.join("tri-3")).unwrap();
    // Sparse: holes at the start, middle and end.
    {
        use std::os::unix::fs::FileExt;
        let f = fs::File::create(root.join("sparse")).unwrap();
        f.set_len(64 << 20).unwrap();
        f.write_all_at(&rng.bytes(100_000, false), 20 << 20)
            .unwrap();
        f.write_all_at(b"tail data", 40 << 20).unwrap();
    }
    // FIFO and devices.
    nix::unistd::mkfifo(
        &root.join("fifo"),
        nix::sys::stat::Mode::from_bits_truncate(0o640),
    )
    .unwrap();
    if is_root() {
        use nix::sys::stat::{Mode, SFlag, makedev, mknod};
        mknod(
            &root.join("chardev"),
            SFlag::S_IFCHR,
            Mode::from_bits_truncate(0o666),
            makedev(1, 3),
        )
        .unwrap();
        mknod(
            &root.join("blockdev"),
            SFlag::S_IFBLK,
            Mode::from_bits_truncate(0o660),
            makedev(7, 200),
        )
        .unwrap();
        // Ownership other than the runner's.
        nix::unistd::chown(&root.join("private"), Some(1234.into()), Some(5678.into())).unwrap();
        nix::unistd::fchownat(
            nix::fcntl::AT_FDCWD,
            &root.join("link-rel"),
            Some(4321.into()),
            Some(8765.into()),
            nix::fcntl::AtFlags::AT_SYMLINK_NOFOLLOW,
        )
        .unwrap();
    }
    // Extended attributes on a file and a directory (binary values too).
    xattr::set(root.join("small.txt"), "user.note", b"hello").unwrap();
    xattr::set(root.join("small.txt"), "user.bin", &[0u8, 1, 2, 255]).unwrap();
    xattr::set(root.join("dir"), "user.dirattr", b"on a directory").unwrap();
    fs::set_permissions(root.join("readonly"), fs::Permissions::from_mode(0o444)).unwrap();
    // Exact timestamps with nanoseconds, deepest first so parents keep theirs.
    let mut all: Vec<PathBuf> = walk(root).into_keys().map(|p| root.join(p)).collect();
    all.sort_by_key(|p| std::cmp::Reverse(p.components().count()));
    for (i, p) in all.iter().enumerate() {
        set_times(
            p,
            1_600_000_000 + i as i64 * 7919,
            (i as i64 * 123_456_789) % 1_000_000_000,
        );
    }
    set_times(root, 1_500_000_000, 999_999_999);
}

/// Relative path -> metadata of every entry below `root` (not following symlinks).
pub fn walk(root: &Path) -> BTreeMap<PathBuf, fs::Metadata> {
    let mut out = BTreeMap::new();
    let mut stack = vec![PathBuf::new()];
    while let Some(rel) = stack.pop() {
        for e in fs::read_dir(root.join(&rel)).unwrap() {
            let e = e.unwrap();
            let r = rel.join(e.file_name());
            let m = fs::symlink_metadata(root.join(&r)).unwrap();
            if m.is_dir() {
                stack.push(r.clone());
            }
            out.insert(r, m);
        }
    }
    out
}

fn xattrs(p: &Path) -> Vec<(Vec<u8>, Vec<u8>)> {
    let mut v: Vec<_> = xattr::list(p)
        .unwrap()
        .map(|n| {
            let val = xattr::get(p, &n).unwrap().unwrap_or_default();
            (n.as_bytes().to_vec(), val)
        })
        .collect();
    v.sort();
    v
}

/// Every difference between two trees: entries, types, permission bits, owners,
/// sizes, mtimes (ns), content, link targets, xattrs, device numbers, hard-link
/// structure, and sparseness (a sparse source file must not be restored dense).
/// Returns human-readable differences; empty means identical.
pub fn compare(a: &Path, b: &Path) -> Vec<String> {
    let mut diffs = Vec::new();
    let ta = walk(a);
    let tb = walk(b);
    for k in ta.keys().filter(|k| !tb.contains_key(*k)) {
        diffs.push(format!("{}: missing from restore", k.display()));
    }
    for k in tb.keys().filter(|k| !ta.contains_key(*k)) {
        diffs.push(format!("{}: extra in restore", k.display()));
    }
    let mut links_a: HashMap<(u64, u64), Vec<PathBuf>> = HashMap::new();
    let mut links_b: HashMap<(u64, u64), Vec<PathBuf>> = HashMap::new();
    let mut entries: Vec<(PathBuf, fs::Metadata, fs::Metadata)> = Vec::new();
    for (k, ma) in &ta {
        if let Some(mb) = tb.get(k) {
            entries.push((k.clone(), ma.clone(), mb.clone()));
        }
    }
    entries.push((
        PathBuf::new(),
        fs::symlink_metadata(a).unwrap(),
        fs::symlink_metadata(b).unwrap(),
    ));
    for (k, ma, mb) in &entries {
        let d = |what: &str, x: String, y: String| {
            format!("{}: {what} differs: {x} vs {y}", k.display())
        };
        let (pa, pb) = (a.join(k), b.join(k));
        if ma.file_type() != mb.file_type() {
            diffs.push(d(
                "type",
                format!("{:?}", ma.file_type()),
                format!("{:?}", mb.file_type()),
            ));
            continue;
        }
        if !ma.file_type().is_symlink() && ma.mode() != mb.mode() {
            diffs.push(d(
                "mode",
                format!("{:o}", ma.mode()),
                format!("{:o}", mb.mode()),
            ));
        }
        if (ma.uid(), ma.gid()) != (mb.uid(), mb.gid()) {
            diffs.push(d(
                "owner",
                format!("{}:{}", ma.uid(), ma.gid()),
                format!("{}:{}", mb.uid(), mb.gid()),
            ));
        }
        if (ma.mtime(), ma.mtime_nsec()) != (mb.mtime(), mb.mtime_nsec()) {
            diffs.push(d(
                "mtime",
                format!("{}.{:09}", ma.mtime(), ma.mtime_nsec()),
                format!("{}.{:09}", mb.mtime(), mb.mtime_nsec()),
            ));
        }
        if ma.rdev() != mb.rdev() {
            diffs.push(d("rdev", ma.rdev().to_string(), mb.rdev().to_string()));
        }
        let xa = xattrs(&pa);
        let xb = xattrs(&pb);
        if xa != xb {
            diffs.push(d("xattrs", format!("{xa:?}"), format!("{xb:?}")));
        }
        if ma.file_type().is_symlink() {
            let la = fs::read_link(&pa).unwrap();
            let lb = fs::read_link(&pb).unwrap();
            if la != lb {
                diffs.push(d(
                    "link target",
                    la.display().to_string(),
                    lb.display().to_string(),
                ));
            }
        }
        if ma.is_file() {
            if ma.len() != mb.len() {
                diffs.push(d("size", ma.len().to_string(), mb.len().to_string()));
            } else if fs::read(&pa).unwrap() != fs::read(&pb).unwrap() {
                diffs.push(d("content", String::new(), String::new()));
            }
            // Sparse in the source (fewer blocks than its size needs) => the restore
            // must not allocate more than the source did (plus one chunk of slack).
            let dense_blocks = ma.len().div_ceil(512);
            if ma.blocks() + 8 < dense_blocks && mb.blocks() > ma.blocks() + 256 {
                diffs.push(d(
                    "allocated blocks (sparseness)",
                    ma.blocks().to_string(),
                    mb.blocks().to_string(),
                ));
            }
            if ma.nlink() > 1 {
                links_a
                    .entry((ma.dev(), ma.ino()))
                    .or_default()
                    .push(k.clone());
                links_b
                    .entry((mb.dev(), mb.ino()))
                    .or_default()
                    .push(k.clone());
            }
            if ma.nlink() != mb.nlink() {
                diffs.push(d(
                    "link count",
                    ma.nlink().to_string(),
                    mb.nlink().to_string(),
                ));
            }
        }
    }
    let groups = |m: HashMap<(u64, u64), Vec<PathBuf>>| {
        let mut g: Vec<Vec<PathBuf>> = m
            .into_values()
            .map(|mut v| {
                v.sort();
                v
            })
            .collect();
        g.sort();
        g
    };
    let (ga, gb) = (groups(links_a), groups(links_b));
    if ga != gb {
        diffs.push(format!("hard-link groups differ: {ga:?} vs {gb:?}"));
    }
    diffs
}

pub fn assert_same(a: &Path, b: &Path) {
    let d = compare(a, b);
    assert!(d.is_empty(), "trees differ:\n{}", d.join("\n"));
}

/// `rsync -aHAX --dry-run --itemize-changes --checksum` must list nothing.
pub fn assert_rsync_same(a: &Path, b: &Path) {
    let out = Command::new("rsync")
        .args(["-aHAX", "--dry-run", "--itemize-changes", "--checksum"])
        .arg(format!("{}/", a.display()))
        .arg(format!("{}/", b.display()))
        .output()
        .expect("rsync must be installed (.ci/run installs it)");
    assert!(
        out.status.success(),
        "rsync failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let items = String::from_utf8_lossy(&out.stdout);
    assert!(items.trim().is_empty(), "rsync sees differences:\n{items}");
}

/// Runs a tool the test needs (mke2fs, tar, ...) and fails the test, with its
/// output, if it fails.
pub fn sh(cmd: &mut Command) {
    let o = cmd.output().unwrap();
    assert!(o.status.success(), "{cmd:?}: {o:?}");
}

/// A POSIX ACL as Linux stores it in `system.posix_acl_*`: version 2, then
/// (tag, permission bits, id) entries; tags 1 user::, 2 user:ID, 4 group::,
/// 8 group:ID, 0x10 mask, 0x20 other; id `u32::MAX` where there is none.
pub fn posix_acl(entries: &[(u16, u16, u32)]) -> Vec<u8> {
    let mut v = 2u32.to_le_bytes().to_vec();
    for (tag, perm, id) in entries {
        v.extend_from_slice(&tag.to_le_bytes());
        v.extend_from_slice(&perm.to_le_bytes());
        v.extend_from_slice(&id.to_le_bytes());
    }
    v
}

/// A tmpfs mounted at `dir` (created) with these mount options (`size=24m`),
/// unmounted on drop. Needs root, as the suite runs.
pub struct Tmpfs(pub PathBuf);

impl Tmpfs {
    pub fn mount(dir: &Path, options: &str) -> Tmpfs {
        assert!(
            is_root(),
            "the test suite runs as root (CI does): it mounts filesystems"
        );
        fs::create_dir_all(dir).unwrap();
        let ok = Command::new("mount")
            .args(["-t", "tmpfs", "-o", options, "tmpfs"])
            .arg(dir)
            .status()
            .unwrap()
            .success();
        assert!(ok, "mount -t tmpfs -o {options} {}", dir.display());
        Tmpfs(dir.to_path_buf())
    }

    /// Changes the size (or other options) in place.
    pub fn remount(&self, options: &str) {
        let ok = Command::new("mount")
            .args(["-o", &format!("remount,{options}")])
            .arg(&self.0)
            .status()
            .unwrap()
            .success();
        assert!(ok, "remount {options}");
    }
}

impl Drop for Tmpfs {
    fn drop(&mut self) {
        let _ = Command::new("umount").arg(&self.0).status();
    }
}

/// A byte count from the line `CAIRN_TRAFFIC_REPORT` makes cairn print
/// (`field`: "uploaded" or "downloaded").
pub fn traffic_bytes(stderr: &str, field: &str) -> u64 {
    let line = stderr
        .lines()
        .find(|l| l.starts_with("traffic: "))
        .unwrap_or_else(|| panic!("no traffic line in {stderr}"));
    let after = line
        .split(&format!("{field} "))
        .nth(1)
        .unwrap_or_else(|| panic!("no {field} in {line}"));
    after.split(' ').next().unwrap().parse().unwrap()
}

/// Every pack of a local repository with its size (not a writer's temporary file,
/// which may vanish while this looks: packs can be counted while a backup runs).
pub fn packs(repo: &Path) -> BTreeMap<PathBuf, u64> {
    let mut out = BTreeMap::new();
    let Ok(dirs) = fs::read_dir(repo.join("data")) else {
        return out; // no pack yet
    };
    for d in dirs.flatten() {
        let Ok(files) = fs::read_dir(d.path()) else {
            continue;
        };
        for f in files.flatten() {
            if f.file_name().to_string_lossy().contains(".tmp") {
                continue;
            }
            if let Ok(m) = f.metadata() {
                out.insert(f.path(), m.len());
            }
        }
    }
    out
}

/// The largest pack of a local repository.
pub fn largest_pack(repo: &Path) -> PathBuf {
    packs(repo)
        .into_iter()
        .max_by_key(|(_, size)| *size)
        .expect("the repository has packs")
        .0
}

/// Flips one bit in the middle of a file.
pub fn flip_middle(path: &Path) {
    let mut b = fs::read(path).unwrap();
    let i = b.len() / 2;
    b[i] ^= 0x10;
    fs::write(path, b).unwrap();
}

/// A TCP forwarder to `target` that goes down on request, as a storage server
/// does: once `trigger` exists (a file a script creates) or [`Outage::cut`] is
/// called, every connection is closed and nothing listens on its port any more.
pub struct Outage {
    pub port: u16,
    down: std::sync::Arc<std::sync::atomic::AtomicBool>,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl Outage {
    pub fn start(target: &str, trigger: PathBuf) -> Outage {
        use std::net::{Shutdown, TcpListener, TcpStream};
        use std::sync::atomic::Ordering;
        use std::sync::{Arc, Mutex};
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        listener.set_nonblocking(true).unwrap();
        let port = listener.local_addr().unwrap().port();
        let down = Arc::new(std::sync::atomic::AtomicBool::new(false));
        let target = target.to_string();
        let d = down.clone();
        let thread = std::thread::spawn(move || {
            let open: Arc<Mutex<Vec<TcpStream>>> = Arc::default();
            while !d.load(Ordering::Relaxed) && !trigger.exists() {
                match listener.accept() {
                    Ok((client, _)) => {
                        client.set_nonblocking(false).unwrap();
                        let Ok(server) = TcpStream::connect(&target) else {
                            continue;
                        };
                        let mut list = open.lock().unwrap();
                        for (mut from, mut to) in [
                            (client.try_clone().unwrap(), server.try_clone().unwrap()),
                            (server.try_clone().unwrap(), client.try_clone().unwrap()),
                        ] {
                            std::thread::spawn(move || {
                                let _ = std::io::copy(&mut from, &mut to);
                                let _ = to.shutdown(Shutdown::Write);
                            });
                        }
                        list.push(client);
                        list.push(server);
                    }
                    Err(_) => std::thread::sleep(Duration::from_millis(20)),
                }
            }
            d.store(true, Ordering::Relaxed);
            for s in open.lock().unwrap().iter() {
                let _ = s.shutdown(Shutdown::Both);
            }
            // The listener is dropped here: connections are refused from now on.
        });
        Outage {
            port,
            down,
            thread: Some(thread),
        }
    }

    pub fn is_down(&self) -> bool {
        self.down.load(std::sync::atomic::Ordering::Relaxed)
    }

    pub fn cut(&mut self) {
        self.down.store(true, std::sync::atomic::Ordering::Relaxed);
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

impl Drop for Outage {
    fn drop(&mut self) {
        self.cut();
    }
}

/// A TCP forwarder to `target` whose connections, once frozen, move no byte
/// either way and close nothing: a server, or a link, that stops taking what it
/// is sent while its connections stay open. Connections opened after
/// [`Freezer::freeze`] are forwarded as before (so that what fails is the
/// frozen one, not a new connection's handshake). `up` counts the bytes
/// forwarded to `target`.
pub struct Freezer {
    pub port: u16,
    /// Connections numbered below this are frozen.
    frozen_below: std::sync::Arc<std::sync::atomic::AtomicU64>,
    opened: std::sync::Arc<std::sync::atomic::AtomicU64>,
    pub up: std::sync::Arc<std::sync::atomic::AtomicU64>,
}

impl Freezer {
    pub fn start(target: &str) -> Freezer {
        use std::io::{Read, Write};
        use std::net::{TcpListener, TcpStream};
        use std::sync::Arc;
        use std::sync::atomic::{AtomicU64, Ordering};
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let port = listener.local_addr().unwrap().port();
        let frozen_below = Arc::new(AtomicU64::new(0));
        let opened = Arc::new(AtomicU64::new(0));
        let up = Arc::new(AtomicU64::new(0));
        let target = target.to_string();
        let (f, o, u) = (frozen_below.clone(), opened.clone(), up.clone());
        // Threads end with the test process.
        std::thread::spawn(move || {
            for client in listener.incoming() {
                let (Ok(client), Ok(server)) = (client, TcpStream::connect(&target)) else {
                    continue;
                };
                let n = o.fetch_add(1, Ordering::SeqCst);
                for (mut from, mut to, count) in [
                    (
                        client.try_clone().unwrap(),
                        server.try_clone().unwrap(),
                        Some(u.clone()),
                    ),
                    (server, client, None),
                ] {
                    let f = f.clone();
                    std::thread::spawn(move || {
                        let wait = || {
                            while n < f.load(Ordering::SeqCst) {
                                std::thread::sleep(Duration::from_millis(50));
                            }
                        };
                        let mut buf = vec![0u8; 16 << 10];
                        loop {
                            wait();
                            let got = match from.read(&mut buf) {
                                Ok(0) | Err(_) => break,
                                Ok(got) => got,
                            };
                            wait();
                            if to.write_all(&buf[..got]).is_err() {
                                break;
                            }
                            if let Some(c) = &count {
                                c.fetch_add(got as u64, Ordering::Relaxed);
                            }
                        }
                        let _ = to.shutdown(std::net::Shutdown::Write);
                    });
                }
            }
        });
        Freezer {
            port,
            frozen_below,
            opened,
            up,
        }
    }

    /// Freezes every connection open now.
    pub fn freeze(&self) {
        use std::sync::atomic::Ordering;
        self.frozen_below
            .store(self.opened.load(Ordering::SeqCst), Ordering::SeqCst);
    }
}

/// Runs `cmd` (its standard error captured), sends it SIGINT after `after`, and
/// returns its exit code, its standard error, and how long it took to end once
/// interrupted.
pub fn interrupted(
    mut cmd: std::process::Command,
    after: std::time::Duration,
) -> (Option<i32>, String, std::time::Duration) {
    let child = cmd
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    std::thread::sleep(after);
    interrupt(child)
}

/// Sends `child` (its standard error piped) SIGINT now and returns its exit
/// code, its standard error, and how long it took to end.
pub fn interrupt(child: std::process::Child) -> (Option<i32>, String, std::time::Duration) {
    let start = std::time::Instant::now();
    nix::sys::signal::kill(
        nix::unistd::Pid::from_raw(child.id() as i32),
        nix::sys::signal::Signal::SIGINT,
    )
    .unwrap();
    let o = child.wait_with_output().unwrap();
    (
        o.status.code(),
        String::from_utf8_lossy(&o.stderr).into_owned(),
        start.elapsed(),
    )
}

pub fn openssl(dir: &std::path::Path, args: &[&str]) {
    let o = std::process::Command::new("openssl")
        .current_dir(dir)
        .args(args)
        .output()
        .expect("openssl is needed (scripts/test.sh installs it)");
    assert!(
        o.status.success(),
        "openssl {args:?}: {}",
        String::from_utf8_lossy(&o.stderr)
    );
}

/// A private CA (`dir/ca.crt`) and a server certificate it signed for 127.0.0.1
/// (`dir/certs/public.crt`, key `dir/certs/private.key`), made with openssl.
pub fn private_ca_cert(dir: &std::path::Path) {
    std::fs::create_dir_all(dir.join("certs")).unwrap();
    test_ca(dir, "cairn test CA");
    openssl(
        dir,
        &[
            "req",
            "-newkey",
            "rsa:2048",
            "-nodes",
            "-keyout",
            "certs/private.key",
            "-out",
            "srv.csr",
            "-subj",
            "/CN=127.0.0.1",
        ],
    );
    std::fs::write(
        dir.join("ext.cnf"),
        "subjectAltName=IP:127.0.0.1\nbasicConstraints=CA:FALSE\n",
    )
    .unwrap();
    openssl(
        dir,
        &[
            "x509",
            "-req",
            "-in",
            "srv.csr",
            "-CA",
            "ca.crt",
            "-CAkey",
            "ca.key",
            "-CAcreateserial",
            "-out",
            "certs/public.crt",
            "-days",
            "2",
            "-extfile",
            "ext.cnf",
        ],
    );
}

/// A CA of its own in `dir` (`ca.key`, `ca.crt`), named `name`, for two days.
pub fn test_ca(dir: &std::path::Path, name: &str) {
    let subject = format!("/CN={name}");
    openssl(
        dir,
        &[
            "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-keyout", "ca.key", "-out", "ca.crt",
            "-days", "2", "-subj", &subject,
        ],
    );
}

/// A tree under `src` with hard links to a symlink (`l1`, `d/l2`, pointing to
/// `somewhere`) and to a FIFO (`p1`, `d/p2`).
pub fn linked_specials(src: &std::path::Path) {
    std::fs::create_dir_all(src.join("d")).unwrap();
    std::os::unix::fs::symlink("somewhere", src.join("l1")).unwrap();
    std::fs::hard_link(src.join("l1"), src.join("d/l2")).unwrap();
    nix::unistd::mkfifo(
        &src.join("p1"),
        nix::sys::stat::Mode::from_bits_truncate(0o640),
    )
    .unwrap();
    std::fs::hard_link(src.join("p1"), src.join("d/p2")).unwrap();
}

/// What [`linked_specials`] made, found again under `root`: each pair one inode
/// with two names, the symlink still pointing to `somewhere`.
pub fn assert_linked_specials(root: &std::path::Path) {
    use std::os::unix::fs::MetadataExt;
    for (a, b) in [("l1", "d/l2"), ("p1", "d/p2")] {
        let (ma, mb) = (
            std::fs::symlink_metadata(root.join(a)).unwrap(),
            std::fs::symlink_metadata(root.join(b)).unwrap(),
        );
        assert_eq!((ma.ino(), ma.nlink()), (mb.ino(), 2), "{a} {b}");
    }
    assert_eq!(
        std::fs::read_link(root.join("d/l2")).unwrap(),
        std::path::Path::new("somewhere")
    );
}

/// What user `nobody` needs to restore from `env`'s repository: to read it, a
/// directory to restore into and one for its cache (returned in that order).
pub fn open_to_nobody(env: &Env) -> (std::path::PathBuf, std::path::PathBuf) {
    use std::os::unix::fs::PermissionsExt;
    for p in [env.path(""), env.repo.clone()] {
        fs::set_permissions(&p, fs::Permissions::from_mode(0o755)).unwrap();
    }
    std::process::Command::new("chmod")
        .args(["-R", "a+rX"])
        .arg(&env.repo)
        .status()
        .unwrap();
    let (target, cache) = (env.path("mine"), env.path("nobody-cache"));
    for d in [&target, &cache] {
        fs::create_dir(d).unwrap();
        fs::set_permissions(d, fs::Permissions::from_mode(0o777)).unwrap();
    }
    (target, cache)
}

/// Runs `cmd` as user `nobody` (uid and gid 65534) with its cache in `cache`
/// (from [`open_to_nobody`]).
pub fn output_as_nobody(cmd: &mut Command, cache: &Path) -> Output {
    use std::os::unix::process::CommandExt;
    cmd.env("XDG_CACHE_HOME", cache)
        .uid(65534)
        .gid(65534)
        .output()
        .unwrap()
}

/// `env`'s directory `src` holding one file `f` ("content") with the extended
/// attributes `attrs`: (`src`, `src/f`).
pub fn file_with_xattrs(env: &Env, attrs: &[(&str, &[u8])]) -> (PathBuf, PathBuf) {
    let src = env.path("src");
    fs::create_dir_all(&src).unwrap();
    let f = src.join("f");
    fs::write(&f, b"content").unwrap();
    for (k, v) in attrs {
        xattr::set(&f, k, v).unwrap();
    }
    (src, f)
}

/// Moves `env`'s index to the SSD placement, its files in `env`'s scratch
/// directory `ssd` (returned).
pub fn use_ssd_index(env: &Env) -> PathBuf {
    let ssd = env.path("ssd");
    env.ok(&[
        "index",
        "--index-placement",
        "ssd",
        "--index-path",
        ssd.to_str().unwrap(),
    ]);
    ssd
}

/// The `ACTION    PATH` lines of `backup -v` / `restore -v` whose path is below
/// `dir`, as (action, path relative to `dir`), sorted by path.
pub fn listed_files(out: &str, dir: &Path) -> Vec<(String, String)> {
    let prefix = format!("{}/", dir.display());
    let mut v: Vec<(String, String)> = out
        .lines()
        .filter_map(|l| {
            let (action, path) = l.split_once(' ')?;
            let path = path.trim_start().strip_prefix(&prefix)?;
            Some((action.to_string(), path.to_string()))
        })
        .collect();
    v.sort_by(|x, y| x.1.cmp(&y.1));
    v
}

/// `(action, path)` pairs as [`listed_files`] returns them.
pub fn pairs(v: &[(&str, &str)]) -> Vec<(String, String)> {
    v.iter()
        .map(|(a, p)| (a.to_string(), p.to_string()))
        .collect()
}

/// `cmd` run on a terminal of its own, through util-linux's `script`, with its
/// environment, followed by the shell line `then` (`echo exit=$?`, say); what
/// the terminal shows is the returned command's standard output.
pub fn on_a_terminal(cmd: &Command, then: &str) -> Command {
    let line = std::iter::once(cmd.get_program())
        .chain(cmd.get_args())
        .map(|a| format!("'{}'", a.to_str().unwrap()))
        .collect::<Vec<_>>()
        .join(" ");
    let mut script = Command::new("script");
    script.args(["-qec", &format!("{line}; {then}"), "/dev/null"]);
    for (k, v) in cmd.get_envs() {
        match v {
            Some(v) => script.env(k, v),
            None => script.env_remove(k),
        };
    }
    script
}

/// Runs `cmd` with the resource limit `resource` (`libc::RLIMIT_*`) at `max`
/// (soft and hard), set in the child before it starts.
pub fn limit(cmd: &mut Command, resource: libc::__rlimit_resource_t, max: u64) {
    use std::os::unix::process::CommandExt;
    #[allow(unsafe_code)]
    // SAFETY: only setrlimit (async-signal-safe) runs between fork and exec.
    unsafe {
        cmd.pre_exec(move || {
            let lim = libc::rlimit {
                rlim_cur: max,
                rlim_max: max,
            };
            if libc::setrlimit(resource, &lim) != 0 {
                return Err(std::io::Error::last_os_error());
            }
            Ok(())
        });
    }
}

/// A MinIO of the test's own (the binary scripts/test.sh found), plain http or
/// https with a certificate from a private CA, with one bucket made; killed on
/// drop. For a test that stops or breaks its S3 server, which the shared one
/// (`CAIRN_TEST_S3`) must never be.
pub struct OwnMinio {
    pub child: Child,
    /// `http://127.0.0.1:PORT` or `https://...`.
    pub endpoint: String,
    pub bucket: &'static str,
    /// The private CA's certificate, with https.
    pub ca: Option<PathBuf>,
    /// Its keys: the environment's (`AWS_ACCESS_KEY_ID`, `AWS_SECRET_ACCESS_KEY`,
    /// which scripts/test.sh sets), so that a process the test starts without
    /// keys of its own (`cairn serve`) can use it.
    pub user: String,
    pub secret: String,
}

impl OwnMinio {
    pub fn start(env: &Env, tls: bool) -> OwnMinio {
        let bin = std::env::var("CAIRN_TEST_MINIO_BIN")
            .expect("CAIRN_TEST_MINIO_BIN is not set: run the suite with scripts/test.sh");
        let dir = env.path("own-minio");
        fs::create_dir_all(&dir).unwrap();
        let free_port = || {
            let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
            l.local_addr().unwrap().port()
        };
        let (port, console) = (free_port(), free_port());
        let key =
            |name: &str, default: &str| std::env::var(name).unwrap_or_else(|_| default.to_string());
        let user = key("AWS_ACCESS_KEY_ID", "ownadmin");
        let secret = key("AWS_SECRET_ACCESS_KEY", "ownadmin-secret");
        let mut c = Command::new(bin);
        c.arg("server").arg(dir.join("data"));
        if tls {
            private_ca_cert(&dir);
            c.arg("--certs-dir").arg(dir.join("certs"));
        }
        let child = c
            .args([
                "--address",
                &format!("127.0.0.1:{port}"),
                "--console-address",
                &format!("127.0.0.1:{console}"),
            ])
            .env("MINIO_ROOT_USER", &user)
            .env("MINIO_ROOT_PASSWORD", &secret)
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .unwrap();
        let scheme = if tls { "https" } else { "http" };
        let server = OwnMinio {
            child,
            endpoint: format!("{scheme}://127.0.0.1:{port}"),
            bucket: "ownbucket",
            ca: tls.then(|| dir.join("ca.crt")),
            user,
            secret,
        };
        let t0 = Instant::now();
        loop {
            let mut curl = Command::new("curl");
            curl.arg("-fsS");
            if let Some(ca) = &server.ca {
                curl.arg("--cacert").arg(ca);
            }
            let made = curl
                .args([
                    "--aws-sigv4",
                    "aws:amz:us-east-1:s3",
                    "--user",
                    &format!("{}:{}", server.user, server.secret),
                    "-X",
                    "PUT",
                    &format!("{}/{}", server.endpoint, server.bucket),
                ])
                .output()
                .unwrap();
            if made.status.success() {
                break;
            }
            assert!(
                t0.elapsed() < Duration::from_secs(30),
                "MinIO did not start"
            );
            std::thread::sleep(Duration::from_millis(200));
        }
        server
    }

    /// Sends `signal` (SIGSTOP: storage that takes connections and says nothing).
    pub fn signal(&self, signal: nix::sys::signal::Signal) {
        let _ = nix::sys::signal::kill(nix::unistd::Pid::from_raw(self.child.id() as i32), signal);
    }
}

impl Drop for OwnMinio {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// The first key file of the local repository at `repo` (a new one has one).
pub fn first_key_file(repo: &Path) -> PathBuf {
    fs::read_dir(repo.join("keys"))
        .unwrap()
        .next()
        .unwrap()
        .unwrap()
        .path()
}
