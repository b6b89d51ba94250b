//! The golden repository made by format version 1 must keep opening, restoring and
//! checking clean. It lives in tests/fixtures/repos/v1.tar.gz with the source tree it
//! was made from; `bench/make-golden.sh` regenerates both (only for a new format
//! version: existing fixtures are never rewritten).

use crate::util::*;
use std::path::PathBuf;
use std::process::Command;

fn fixture() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../tests/fixtures/repos/v1.tar.gz")
}

#[test]
fn golden_v1_repository_opens_restores_and_checks() {
    let env = Env::new();
    let st = Command::new("tar")
        .arg("-xzf")
        .arg(fixture())
        .arg("-C")
        .arg(env.dir.path())
        .status()
        .unwrap();
    assert!(st.success(), "golden fixture must exist and unpack");
    let repo = env.dir.path().join("v1/repo");
    let env = Env::at(env.dir, repo);
    let out = env.ok(&["check", "--read-data"]);
    assert!(out.contains("no errors were found"), "{out}");
    let snaps: serde_json::Value = serde_json::from_str(&env.ok(&["snapshots", "--json"])).unwrap();
    assert_eq!(snaps.as_array().unwrap().len(), 2);
    // The snapshot was taken of /tmp/cairn-golden-src; the fixture holds a copy of it.
    let target = env.dir.path().join("out");
    env.ok(&["restore", "latest", "--target", target.to_str().unwrap()]);
    let expected = env.dir.path().join("v1/src");
    let restored = target.join("tmp/cairn-golden-src");
    let diffs = compare(&expected, &restored);
    // Owners and xattrs of the unpacked reference copy come from tar; compare content,
    // names, types, modes and times only.
    let relevant: Vec<_> = diffs
        .iter()
        .filter(|d| !d.contains("owner") && !d.contains("xattrs"))
        .collect();
    assert!(relevant.is_empty(), "{relevant:#?}");
}
