//! Trees deeper than any stack: a user who can create directories inside a backed-up
//! tree can make a chain 100,000 levels deep, and that must not stop every backup
//! (issue: "a deep directory tree stops every backup"; it aborted at 1,500 levels
//! with a stack overflow, check at 20,000 and ls at 30,000).

use crate::util::*;
use nix::fcntl::{OFlag, openat};
use nix::sys::stat::{Mode, mkdirat};
use std::os::fd::OwnedFd;
use std::path::Path;

/// `depth` directories named `d`, one inside the other, under `root`, with a file
/// `bottom` at the end. Made with descriptors: the path is far beyond PATH_MAX.
fn make_chain(root: &Path, depth: usize) {
    std::fs::create_dir_all(root).unwrap();
    let flags = OFlag::O_RDONLY | OFlag::O_DIRECTORY | OFlag::O_CLOEXEC;
    let mut dir: OwnedFd = nix::fcntl::open(root, flags, Mode::empty()).unwrap();
    for _ in 0..depth {
        mkdirat(&dir, "d", Mode::from_bits_truncate(0o755)).unwrap();
        dir = openat(&dir, "d", flags, Mode::empty()).unwrap();
    }
    let f = openat(
        &dir,
        "bottom",
        OFlag::O_WRONLY | OFlag::O_CREAT | OFlag::O_CLOEXEC,
        Mode::from_bits_truncate(0o644),
    )
    .unwrap();
    nix::unistd::write(&f, b"the bottom").unwrap();
}

/// Removes a deep tree with `rm -rf` (which walks with descriptors; std's
/// `remove_dir_all`, run when the scratch area is dropped, recurses) when dropped,
/// also when an assertion fails.
struct Chain(std::path::PathBuf);

impl Drop for Chain {
    fn drop(&mut self) {
        let _ = std::process::Command::new("rm")
            .arg("-rf")
            .arg(&self.0)
            .status();
    }
}

#[test]
fn a_tree_100000_levels_deep_is_backed_up_checked_and_listed() {
    const DEPTH: usize = 100_000;
    let env = Env::new();
    env.init(&[]);
    let src = env.path("src");
    let _chain = Chain(src.clone());
    make_chain(&src, DEPTH);
    let o = env.run(&["backup", "--json", src.to_str().unwrap()]);
    let err = String::from_utf8_lossy(&o.stderr).into_owned();
    assert_eq!(o.status.code(), Some(0), "{err}");
    let v: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
    // The chain, src, and the directories on the way to src (/tmp, the scratch dir).
    assert_eq!(v["dirs"].as_u64().unwrap() as usize, DEPTH + 3, "{v}");
    assert_eq!(v["files_new"], 1);
    assert_eq!(v["entries_skipped"], 0);
    // Nothing changed: the second backup reuses the file.
    let again: serde_json::Value =
        serde_json::from_str(&env.ok(&["backup", "--json", src.to_str().unwrap()])).unwrap();
    assert_eq!(again["files_unchanged"], 1, "{again}");
    // check walks every tree; ls lists the top without descending.
    assert!(env.ok(&["check"]).contains("no errors were found"));
    let top = env.ok(&["ls", "latest", src.to_str().unwrap(), "--no-recursive"]);
    assert!(top.lines().any(|l| l.ends_with("/src/d")), "{top}");
}
