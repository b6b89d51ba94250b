//! Golden repositories: every fixture in tests/fixtures/repos must keep opening,
//! restoring exactly and checking clean. `v1` is the day-one repository (two
//! snapshots); `v1-2026-11` holds everything the format has gained since (index
//! files of version 2 with snapshot and forgotten records, snapshots copied from
//! another repository with `copied_from`, superseding index files of a prune);
//! `v1-2026-11-25` the same history with the `admin-names` feature (prune's
//! superseding file stored as `index/admin-<id>`); `v1-2026-11-25-images` adds two
//! image snapshots (`backup --image`, the second from a changed-block list).
//! `tests/fixtures/make-golden.sh NAME` makes a new one; existing fixtures are never
//! rewritten.

use crate::util::*;
use std::path::{Path, PathBuf};
use std::process::Command;

pub(crate) fn unpack(name: &str) -> Env {
    let fixture = PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join(format!("../../tests/fixtures/repos/{name}.tar.gz"));
    let env = Env::new();
    let st = Command::new("tar")
        .arg("-xzf")
        .arg(&fixture)
        .arg("-C")
        .arg(env.dir.path())
        .status()
        .unwrap();
    assert!(st.success(), "golden fixture {name} must exist and unpack");
    let repo = env.dir.path().join(name).join("repo");
    Env::at(env.dir, repo)
}

/// Restores `snap` and compares it with the reference copy `expected` of the tree
/// it was taken of (`/tmp/cairn-golden-src`).
fn restores_as(env: &Env, snap: &str, expected: &Path, into: &str) {
    let target = env.dir.path().join(into);
    env.ok(&["restore", snap, "--target", target.to_str().unwrap()]);
    let restored = target.join("tmp/cairn-golden-src");
    let diffs = compare(expected, &restored);
    // Owners and xattrs of the unpacked reference copy come from tar; compare content,
    // names, types, modes and times only.
    let relevant: Vec<_> = diffs
        .iter()
        .filter(|d| !d.contains("owner") && !d.contains("xattrs"))
        .collect();
    assert!(relevant.is_empty(), "{snap}: {relevant:#?}");
}

#[test]
fn golden_v1_repository_opens_restores_and_checks() {
    let env = unpack("v1");
    let out = env.ok(&["check", "--read-data"]);
    assert!(out.contains("no errors were found"), "{out}");
    let snaps: serde_json::Value = serde_json::from_str(&env.ok(&["snapshots", "--json"])).unwrap();
    assert_eq!(snaps.as_array().unwrap().len(), 2);
    let expected = env.dir.path().join("v1/src");
    restores_as(&env, "latest", &expected, "out");
}

#[test]
fn golden_v1_2026_11_repository_opens_restores_and_checks() {
    history_fixture("v1-2026-11");
}

/// The same history written with the `admin-names` feature: prune's superseding
/// index file is stored as `index/admin-<id>` and is what readers follow.
#[test]
fn golden_v1_2026_11_25_repository_with_admin_names() {
    let env = history_fixture("v1-2026-11-25");
    // The prune just run in it wrote its superseding file under the admin name too.
    let admin_named = admin_named_index_files(&env.repo);
    assert!(admin_named >= 1);
}

/// Image snapshots: the full one and the one from a changed-block list restore as
/// the images were, verified block by block.
#[test]
fn golden_v1_2026_11_25_images_restore_as_they_were_saved() {
    let env = history_fixture("v1-2026-11-25-images");
    let snaps: serde_json::Value = serde_json::from_str(&env.ok(&["snapshots", "--json"])).unwrap();
    let images: Vec<String> = snaps
        .as_array()
        .unwrap()
        .iter()
        .filter(|s| !s["image"].is_null())
        .map(|s| s["id"].as_str().unwrap().to_string())
        .collect();
    assert_eq!(images.len(), 2, "{snaps:#}");
    let dir = env.dir.path().join("v1-2026-11-25-images");
    for (snap, expected) in images.iter().zip(["img1.raw", "img2.raw"]) {
        let out = env.dir.path().join(format!("{expected}.restored"));
        env.ok(&[
            "restore",
            snap,
            "--image",
            "--verify",
            "--target",
            out.to_str().unwrap(),
        ]);
        assert!(
            std::fs::read(&out).unwrap() == std::fs::read(dir.join(expected)).unwrap(),
            "{snap} differs from {expected}"
        );
    }
}

/// Index files stored under the admin name (`index/admin-<id>`).
fn admin_named_index_files(repo: &Path) -> usize {
    std::fs::read_dir(repo.join("index"))
        .unwrap()
        .filter(|e| {
            e.as_ref()
                .unwrap()
                .file_name()
                .to_string_lossy()
                .starts_with("admin-")
        })
        .count()
}

/// Opens, checks, restores every snapshot of a fixture made by make-golden.sh's
/// history, then backs up and prunes in it.
fn history_fixture(name: &str) -> Env {
    let env = unpack(name);
    let admin_named = admin_named_index_files(&env.repo);
    let config = std::fs::read_to_string(env.repo.join("config")).unwrap();
    if config.contains("admin-names") {
        assert!(admin_named > 0, "{name}: prune's file is admin-named");
    } else {
        assert_eq!(admin_named, 0, "{name}");
    }
    let out = env.ok(&["check", "--read-data"]);
    assert!(out.contains("no errors were found"), "{out}");
    let snaps: serde_json::Value = serde_json::from_str(&env.ok(&["snapshots", "--json"])).unwrap();
    // Image snapshots (fixtures since v1-2026-11-25-images) are checked apart.
    let snaps: Vec<serde_json::Value> = snaps
        .as_array()
        .unwrap()
        .iter()
        .filter(|s| s["image"].is_null())
        .cloned()
        .collect();
    // The first backup, the second (tagged), the copy (tagged elsewhere); the
    // third was forgotten and pruned.
    assert_eq!(snaps.len(), 3, "{snaps:#?}");
    let tagged = |t: &str| {
        snaps
            .iter()
            .find(|s| s["tags"].as_array().unwrap().iter().any(|x| x == t))
            .map(|s| s["id"].as_str().unwrap().to_string())
            .unwrap_or_else(|| panic!("no snapshot tagged {t}"))
    };
    let dir = env.dir.path().join(name);
    restores_as(&env, &tagged("second"), &dir.join("src2"), "second");
    restores_as(&env, &tagged("elsewhere"), &dir.join("src1"), "copied");
    let first = snaps
        .iter()
        .find(|s| s["tags"].as_array().unwrap().is_empty())
        .unwrap()["id"]
        .as_str()
        .unwrap()
        .to_string();
    restores_as(&env, &first, &dir.join("src1"), "first");
    // The copied snapshot records where it came from: copying again is a no-op.
    let stats: serde_json::Value = serde_json::from_str(&env.ok(&["stats", "--json"])).unwrap();
    let images = stats["images"]["snapshots"].as_u64().unwrap_or(0);
    assert_eq!(stats["snapshots"], 3 + images, "{stats}");
    // A backup into it still works, and so does prune.
    let src = env.dir.path().join("new-src");
    std::fs::create_dir_all(&src).unwrap();
    std::fs::write(src.join("f"), b"new").unwrap();
    env.backup(&[&src]);
    env.ok(&["prune"]);
    env.check_clean();
    env
}
