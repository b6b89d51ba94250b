//! Crash safety: `cairn backup` killed with SIGKILL at many points must never damage
//! what was committed before (docs/FORMAT.md, "Write ordering invariants").
//! The full harness with hundreds of trials belongs to issue #3; this keeps the
//! invariant under test in every CI run.

use crate::util::*;
use std::fs;
use std::time::Duration;

#[test]
fn killed_backups_lose_nothing_committed() {
    let env = Env::new();
    env.init(&["--block-size", "8K"]);
    let src = env.path("src");
    make_full_tree(&src, 21);
    let s1 = env.backup(&[&src]);
    let copy1 = env.path("copy1");
    copy_tree(&src, &copy1);

    // New data so that every killed run has packs and index files to write.
    let mut rng = Rng(8);
    for i in 0..6 {
        fs::write(
            src.join(format!("new-{i}.bin")),
            rng.bytes(5 << 20, i % 2 == 0),
        )
        .unwrap();
    }
    let mut killed_mid_run = 0;
    for trial in 0..12u64 {
        let mut child = env
            .cmd(&["backup", "-q", src.to_str().unwrap()])
            .spawn()
            .unwrap();
        // Deterministic spread of kill points from "just started" to "nearly done".
        std::thread::sleep(Duration::from_millis(20 + (trial * 37) % 400));
        if child.try_wait().unwrap().is_none() {
            killed_mid_run += 1;
        }
        let _ = child.kill();
        let _ = child.wait();
        // After every kill the repository is consistent and s1 restores exactly.
        let out = env.ok(&["check", "--read-data"]);
        assert!(out.contains("no errors were found"), "trial {trial}: {out}");
    }
    assert!(
        killed_mid_run >= 3,
        "only {killed_mid_run} kills hit a running backup"
    );
    let r1 = env.restore(&s1, &src, "out1");
    assert_same(&copy1, &r1);
    // Snapshots that did commit before a kill are complete too.
    let snaps: serde_json::Value = serde_json::from_str(&env.ok(&["snapshots", "--json"])).unwrap();
    for s in snaps.as_array().unwrap() {
        let id = s["id"].as_str().unwrap();
        let target = env.path(&format!("all-{}", &id[..8]));
        env.ok(&["restore", id, "--target", target.to_str().unwrap()]);
    }
    // The next backup works and restores exactly.
    let s_final = env.backup(&[&src]);
    let r = env.restore(&s_final, &src, "final");
    assert_same(&src, &r);
    env.check_clean();
}

/// `cairn copy` killed with SIGKILL at many points: the destination stays
/// consistent, snapshots copied before a kill restore exactly, and the next copy
/// finishes the job (and leaves nothing half-copied).
#[test]
fn killed_copies_lose_nothing_committed() {
    let r1 = Env::new();
    r1.init(&[]);
    let src = r1.path("src");
    make_full_tree(&src, 41);
    let mut days = Vec::new();
    let mut rng = Rng(9);
    for day in 0..3 {
        fs::write(
            src.join(format!("day-{day}.bin")),
            rng.bytes(6 << 20, day % 2 == 0),
        )
        .unwrap();
        r1.backup(&[&src]);
        let keep = r1.path(&format!("day{day}"));
        copy_tree(&src, &keep);
        days.push(keep);
    }
    let r2 = Env::new();
    r2.init(&["--block-size", "64K"]);
    let copy = |r2: &Env| {
        let mut c = r2.cmd(&["copy", "-q", "--from", &r1.location]);
        c.env("CAIRN_FROM_PASSWORD", PASSWORD);
        c
    };
    let mut killed_mid_run = 0;
    for trial in 0..8u64 {
        let mut child = copy(&r2).spawn().unwrap();
        std::thread::sleep(Duration::from_millis(30 + (trial * 53) % 500));
        if child.try_wait().unwrap().is_none() {
            killed_mid_run += 1;
        }
        let _ = child.kill();
        let _ = child.wait();
        let out = r2.ok(&["check", "--read-data"]);
        assert!(out.contains("no errors were found"), "trial {trial}: {out}");
    }
    assert!(
        killed_mid_run >= 2,
        "only {killed_mid_run} kills hit a running copy"
    );
    let o = copy(&r2).output().unwrap();
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let ids = r2.snapshot_ids();
    assert_eq!(ids.len(), 3, "each snapshot copied exactly once");
    for (day, id) in ids.iter().enumerate() {
        assert_same(&days[day], &r2.restore(id, &src, &format!("r{day}")));
    }
    r2.check_clean();
}
