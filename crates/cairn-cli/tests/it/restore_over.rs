//! Restoring over a target that already holds files: `--overwrite`, `--delete`,
//! `--dry-run` and `--verify`, checked on what is on disk afterwards (inode numbers
//! say whether a file was rewritten).

use crate::util::*;
use std::fs;
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};

fn ino(p: &Path) -> u64 {
    fs::symlink_metadata(p).unwrap().ino()
}

/// Keeps the inodes of `names` in `copy` alive through hard links in a directory of
/// `env` (so a file that is removed and created again cannot get its old inode
/// number back) and returns their inode numbers.
fn hold(env: &Env, copy: &Path, names: &[&str]) -> Vec<u64> {
    let held = env.path("held");
    let _ = fs::remove_dir_all(&held);
    fs::create_dir_all(&held).unwrap();
    names
        .iter()
        .map(|n| {
            fs::hard_link(copy.join(n), held.join(n)).unwrap();
            ino(&copy.join(n))
        })
        .collect()
}

/// A source tree, backed up; returns (env, snapshot, source, the restored copy's
/// path inside a first restore that was already made).
fn backed_up() -> (Env, String, PathBuf, PathBuf) {
    let env = Env::new();
    env.init(&[]);
    let src = env.path("src");
    fs::create_dir_all(src.join("d/sub")).unwrap();
    let mut rng = Rng(7);
    fs::write(src.join("same"), rng.bytes(300_000, false)).unwrap();
    fs::write(src.join("touched"), rng.bytes(200_000, false)).unwrap();
    fs::write(src.join("edited"), rng.bytes(200_000, false)).unwrap();
    fs::write(src.join("gone"), b"restored again").unwrap();
    fs::write(src.join("d/sub/deep"), b"deep").unwrap();
    std::os::unix::fs::symlink("same", src.join("link")).unwrap();
    for f in ["same", "touched", "edited", "gone", "d/sub/deep"] {
        set_times(&src.join(f), 1_600_000_000, 0);
    }
    let snap = env.backup(&[&src]);
    let copy = env.restore(&snap, &src, "t");
    (env, snap, src, copy)
}

fn restore_json(env: &Env, snap: &str, extra: &[&str]) -> serde_json::Value {
    let target = env.path("t");
    let mut args = vec![
        "restore",
        snap,
        "--target",
        target.to_str().unwrap(),
        "--json",
    ];
    args.extend_from_slice(extra);
    serde_json::from_str(&env.ok(&args)).unwrap()
}

/// Changes the restored copy the way a day of use would: one file's time only, one
/// file's bytes (same size, new time), one file removed, two entries added.
fn change(copy: &Path) {
    set_times(&copy.join("touched"), 1_700_000_000, 0);
    let mut b = fs::read(copy.join("edited")).unwrap();
    b[100_000] ^= 1;
    fs::write(copy.join("edited"), b).unwrap();
    fs::remove_file(copy.join("gone")).unwrap();
    fs::write(copy.join("extra"), b"not in the snapshot").unwrap();
    fs::create_dir_all(copy.join("d/newdir/inner")).unwrap();
    fs::write(copy.join("d/newdir/inner/x"), b"x").unwrap();
}

#[test]
fn if_changed_rewrites_only_what_differs_and_delete_removes_the_rest() {
    let (env, snap, src, copy) = backed_up();
    change(&copy);
    let before = hold(&env, &copy, &["same", "touched", "edited"]);

    // The dry run says what will happen and changes nothing.
    let listing = walk(&copy);
    let dry = restore_json(&env, &snap, &["--dry-run", "--delete"]);
    assert_eq!(dry["dry_run"], true);
    assert_eq!(
        (&dry["files"], &dry["metadata_only"], &dry["deleted"]),
        (&2.into(), &1.into(), &4.into()),
        "{dry}"
    );
    assert_eq!(
        walk(&copy).keys().collect::<Vec<_>>(),
        listing.keys().collect::<Vec<_>>()
    );
    assert_eq!(
        fs::metadata(copy.join("touched")).unwrap().mtime(),
        1_700_000_000,
        "the dry run changed a time"
    );

    // Without --delete the extra entries stay.
    let r = restore_json(&env, &snap, &[]);
    assert_eq!(r["overwrite"], "if-changed");
    // `edited` (content differs) and `gone` (missing) are written; `touched` gets
    // its time back without being rewritten; the rest is left alone.
    assert_eq!(
        (&r["files"], &r["metadata_only"]),
        (&2.into(), &1.into()),
        "{r}"
    );
    assert!(r["kept"].as_u64().unwrap() >= 3, "{r}");
    assert_eq!(
        ino(&copy.join("same")),
        before[0],
        "an equal file was rewritten"
    );
    assert_eq!(
        ino(&copy.join("touched")),
        before[1],
        "a file whose time changed was rewritten"
    );
    assert_ne!(
        ino(&copy.join("edited")),
        before[2],
        "a changed file was not rewritten"
    );
    assert!(copy.join("extra").exists());
    assert_eq!(
        fs::metadata(copy.join("touched")).unwrap().mtime(),
        1_600_000_000
    );

    // With --delete the tree becomes the snapshot's exactly.
    fs::remove_dir_all(env.path("held")).unwrap();
    let r = restore_json(&env, &snap, &["--delete"]);
    assert_eq!((&r["files"], &r["deleted"]), (&0.into(), &4.into()), "{r}");
    assert_same(&src, &copy);
    // Nothing left to do: a second run writes and deletes nothing.
    let r = restore_json(&env, &snap, &["--delete", "--verify"]);
    assert_eq!(
        (&r["files"], &r["deleted"], &r["verified"]),
        (&0.into(), &0.into(), &0.into()),
        "{r}"
    );
}

#[test]
fn never_if_newer_and_always_do_what_they_say() {
    let (env, snap, src, copy) = backed_up();
    change(&copy);
    let edited = fs::read(copy.join("edited")).unwrap();
    // never: only the missing file comes back.
    let r = restore_json(&env, &snap, &["--overwrite", "never"]);
    assert_eq!(r["files"], 1, "{r}");
    assert_eq!(fs::read(copy.join("edited")).unwrap(), edited);
    assert_eq!(fs::read(copy.join("gone")).unwrap(), b"restored again");

    // if-newer: the edited file is newer than the snapshot's and stays; an older one
    // is replaced.
    set_times(&copy.join("edited"), 1_800_000_000, 0);
    set_times(&copy.join("touched"), 1_500_000_000, 0);
    let r = restore_json(&env, &snap, &["--overwrite", "if-newer"]);
    assert_eq!(r["files"], 1, "{r}");
    assert_eq!(fs::read(copy.join("edited")).unwrap(), edited);
    assert_eq!(
        fs::metadata(copy.join("touched")).unwrap().mtime(),
        1_600_000_000
    );

    // always: every file is written again.
    let same = hold(&env, &copy, &["same"])[0];
    let r = restore_json(&env, &snap, &["--overwrite", "always", "--verify"]);
    assert_eq!(r["kept"], 0, "{r}");
    assert_eq!(r["verified"], r["files"], "{r}");
    assert_ne!(ino(&copy.join("same")), same);
    assert_eq!(
        fs::read(copy.join("edited")).unwrap(),
        fs::read(src.join("edited")).unwrap()
    );

    let err = env.fails(
        &[
            "restore",
            &snap,
            "--target",
            "x",
            "--overwrite",
            "sometimes",
        ],
        1,
    );
    assert!(
        err.contains("expected always, if-changed, if-newer or never"),
        "{err}"
    );
}

/// `--delete` removes symlinks in the target, never what they point to, and never
/// goes into a directory through one.
#[test]
fn delete_never_follows_a_symlink_out_of_the_target() {
    let (env, snap, _src, copy) = backed_up();
    let outside = env.path("outside");
    fs::create_dir_all(outside.join("keep")).unwrap();
    fs::write(outside.join("keep/precious"), b"precious").unwrap();
    std::os::unix::fs::symlink(&outside, copy.join("to-outside")).unwrap();
    std::os::unix::fs::symlink(outside.join("keep/precious"), copy.join("d/to-file")).unwrap();
    // A directory the snapshot has, replaced by a symlink to the outside.
    fs::remove_dir_all(copy.join("d/sub")).unwrap();
    std::os::unix::fs::symlink(&outside, copy.join("d/sub")).unwrap();
    let r = restore_json(&env, &snap, &["--delete", "--overwrite", "always"]);
    assert_eq!(r["deleted"], 2, "{r}");
    assert_eq!(
        fs::read(outside.join("keep/precious")).unwrap(),
        b"precious"
    );
    assert_eq!(fs::read_dir(&outside).unwrap().count(), 1);
    assert!(fs::symlink_metadata(copy.join("d/sub")).unwrap().is_dir());
    assert_eq!(fs::read(copy.join("d/sub/deep")).unwrap(), b"deep");
    assert!(!copy.join("to-outside").exists());
}

/// The text summary says what was written, left and deleted.
#[test]
fn the_summary_says_what_was_written_kept_and_deleted() {
    let (env, snap, _src, copy) = backed_up();
    change(&copy);
    let t = env.path("t");
    let out = env.ok(&[
        "restore",
        &snap,
        "--target",
        t.to_str().unwrap(),
        "--delete",
        "-n",
    ]);
    assert!(out.contains("would restore snapshot"), "{out}");
    assert!(
        out.contains("would delete 4 entries not in the snapshot"),
        "{out}"
    );
    let out = env.ok(&[
        "restore",
        &snap,
        "--target",
        t.to_str().unwrap(),
        "--delete",
        "--verify",
    ]);
    assert!(out.contains("wrote 2 files"), "{out}");
    assert!(out.contains("deleted 4 entries"), "{out}");
    assert!(
        out.contains("verified 2 files against the snapshot: all match"),
        "{out}"
    );
}

/// A target that is a symlink is refused with a clear message, dry run or not, and
/// nothing is written where it points.
#[test]
fn a_target_that_is_a_symlink_is_refused() {
    let (env, snap, _src, _copy) = backed_up();
    let elsewhere = env.path("elsewhere");
    fs::create_dir_all(&elsewhere).unwrap();
    let link = env.path("link");
    std::os::unix::fs::symlink(&elsewhere, &link).unwrap();
    for extra in [&[][..], &["--dry-run"][..]] {
        let mut args = vec!["restore", &snap, "--target", link.to_str().unwrap()];
        args.extend_from_slice(extra);
        let err = env.fails(&args, 1);
        assert!(err.contains("is a symlink"), "{err}");
    }
    assert_eq!(fs::read_dir(&elsewhere).unwrap().count(), 0);
}
