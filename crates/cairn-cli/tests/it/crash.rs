//! Crash safety beyond the maintenance harness (maintenance.rs): `cairn backup` of a
//! tree with every kind of entry, `cairn copy`, and key changes, each killed with
//! SIGKILL at its kill points (`cairn_core::hooks`) and after random delays
//! (crashkit.rs). After every kill, what was committed before is intact
//! (docs/FORMAT.md, "Write ordering invariants"). The suite runs a few dozen
//! trials; scripts/crash-trials.sh runs a thousand and more
//! (`CAIRN_CRASH_FULL_TREE_TRIALS`, `CAIRN_CRASH_COPY_TRIALS`,
//! `CAIRN_CRASH_KEY_TRIALS`, `CAIRN_CRASH_SEED`).

use crate::crashkit::{
    self, BACKUP_POINTS, Kill, Outcome, Spec, Tally, backup_committed_at, env_u64,
};
use crate::util::*;
use std::collections::{BTreeMap, HashSet};
use std::fs;
use std::path::{Path, PathBuf};
use std::time::Instant;

/// Restores `id` and compares it with `expected`, the copy of `src` it holds.
fn assert_restores(env: &Env, id: &str, src: &Path, expected: &Path, label: &str) {
    let into = format!("restore-{}", &id[..16]);
    let _ = fs::remove_dir_all(env.path(&into));
    let restored = env.restore(id, src, &into);
    let d = compare(expected, &restored);
    assert!(
        d.is_empty(),
        "{label}: snapshot {id} differs:\n{}",
        d.join("\n")
    );
    fs::remove_dir_all(env.path(&into)).unwrap();
}

/// `cairn backup` of a tree with every kind of entry, killed at each backup point
/// and at random: a snapshot shows exactly when the kill came after its commit
/// point, and every snapshot that committed restores exactly.
#[test]
fn killed_backups_lose_nothing_committed() {
    let trials = env_u64("CAIRN_CRASH_FULL_TREE_TRIALS", 12);
    let seed = env_u64("CAIRN_CRASH_SEED", 0x5eed);
    let env = Env::new();
    env.init(&["--block-size", "8K"]);
    let src = env.path("src");
    make_full_tree(&src, 21);
    let first = env.backup(&[&src]);
    let keep = env.path("v-first");
    copy_tree(&src, &keep);
    let mut committed = vec![(first, keep)];
    let mut rng = Rng((seed ^ 8) | 1);
    // An incremental backup like the trials' gives the time scale for random delays.
    fs::write(src.join("new-setup.bin"), rng.bytes(1 << 20, false)).unwrap();
    let t = Instant::now();
    let second = env.backup(&[&src]);
    let took = t.elapsed();
    let keep = env.path("v-second");
    copy_tree(&src, &keep);
    committed.push((second, keep));
    let mut tally = Tally::new("full-tree");
    tally.pace("backup", took);
    for trial in 0..trials {
        let label = format!("full-tree trial {trial} (seed {seed})");
        tally.begin("backup");
        // New data every time: every run has packs and index files to write.
        fs::write(
            src.join(format!("new-{trial}.bin")),
            rng.bytes(1 << 20, trial % 2 == 0),
        )
        .unwrap();
        let kill = tally.choose("backup", BACKUP_POINTS, &mut rng);
        let before = env.snapshot_ids();
        let outcome = crashkit::run(
            env.cmd(&["backup", "-q", src.to_str().unwrap()]),
            &kill,
            &label,
        );
        tally.record("backup", &kill, outcome);
        let new: Vec<String> = env
            .snapshot_ids()
            .into_iter()
            .filter(|i| !before.contains(i))
            .collect();
        assert!(new.len() <= 1, "{label}: {new:?}");
        if let Kill::At(spec) = kill {
            assert_eq!(
                new.len(),
                usize::from(backup_committed_at(spec)),
                "{label}: killed at {spec:?}, new snapshots {new:?}"
            );
        }
        env.check_clean();
        // A snapshot that committed before the kill is complete.
        if let Some(id) = new.into_iter().next() {
            let keep = env.path(&format!("v{trial}"));
            copy_tree(&src, &keep);
            assert_restores(&env, &id, &src, &keep, &label);
            committed.push((id, keep));
        }
        tally.passed();
    }
    tally.assert_all_hit("backup", BACKUP_POINTS);
    for (id, keep) in &committed {
        assert_restores(&env, id, &src, keep, "after the trials");
    }
    // The next backup works and restores exactly.
    let last = env.backup(&[&src]);
    assert_restores(&env, &last, &src, &src, "the last backup");
    env.check_clean();
}

/// Every copy trial has at least one new source snapshot, with new data, to copy,
/// and the first snapshot a run copies has more than nine files.
const COPY_POINTS: &[Spec] = &[
    ("copy:before-file", 1),
    ("copy:before-file", 9),
    ("pack:stored", 1),
    ("index:written", 1),
    ("copy:before-snapshot", 1),
    ("snapshot:before-write", 1),
    ("snapshot:written", 1),
    ("copy:snapshot-committed", 1),
];

/// `cairn copy` killed at its points and at random: the destination stays
/// consistent, every snapshot that arrived restores exactly and arrived once, and
/// the next copy finishes the job.
#[test]
fn killed_copies_lose_nothing_committed() {
    let trials = env_u64("CAIRN_CRASH_COPY_TRIALS", 18);
    let seed = env_u64("CAIRN_CRASH_SEED", 0x5eed);
    let r1 = Env::new();
    r1.init(&[]);
    let src = r1.path("src");
    make_full_tree(&src, 41);
    let mut rng = Rng((seed ^ 9) | 1);
    // Source snapshot time (a copy keeps it) -> an exact copy of what it holds.
    let mut versions: BTreeMap<String, PathBuf> = BTreeMap::new();
    let new_day = |day: u64, rng: &mut Rng, versions: &mut BTreeMap<String, PathBuf>| {
        fs::write(
            src.join(format!("day-{day}.bin")),
            rng.bytes(300_000, day.is_multiple_of(2)),
        )
        .unwrap();
        let _ = fs::remove_file(src.join(format!("day-{}.bin", day.wrapping_sub(3))));
        let v = r1.backup_json(&[&src]);
        let keep = r1.path(&format!("day{day}"));
        copy_tree(&src, &keep);
        versions.insert(v["time"].as_str().unwrap().to_string(), keep);
    };
    let r2 = Env::new();
    r2.init(&["--block-size", "64K"]);
    let copy = || {
        let mut c = r2.cmd(&["copy", "-q", "--from", &r1.location]);
        c.env("CAIRN_FROM_PASSWORD", PASSWORD);
        c
    };
    let copy_ok = |label: &str| {
        let o = copy().output().unwrap();
        assert!(
            o.status.success(),
            "{label}: {}",
            String::from_utf8_lossy(&o.stderr)
        );
    };
    // The destination's snapshots: each a copy of a known source snapshot, none
    // twice, each restoring exactly (checked once per snapshot, in `verified`).
    let verify =
        |versions: &BTreeMap<String, PathBuf>, verified: &mut HashSet<String>, label: &str| {
            r2.check_clean();
            let snaps: serde_json::Value =
                serde_json::from_str(&r2.ok(&["snapshots", "--json"])).unwrap();
            let mut times = HashSet::new();
            for s in snaps.as_array().unwrap() {
                let (id, time) = (s["id"].as_str().unwrap(), s["time"].as_str().unwrap());
                assert!(times.insert(time), "{label}: copied twice: {time}");
                let keep = versions
                    .get(time)
                    .unwrap_or_else(|| panic!("{label}: {id} is a copy of nothing: {time}"));
                if verified.insert(id.to_string()) {
                    assert_restores(&r2, id, &src, keep, label);
                }
            }
            times.len()
        };
    new_day(0, &mut rng, &mut versions);
    copy_ok("the first copy");
    new_day(1, &mut rng, &mut versions);
    let t = Instant::now();
    copy_ok("the second copy");
    let took = t.elapsed();
    let mut verified = HashSet::new();
    verify(&versions, &mut verified, "before the trials");

    let mut tally = Tally::new("copy");
    tally.pace("copy", took);
    for trial in 0..trials {
        let label = format!("copy trial {trial} (seed {seed})");
        tally.begin("copy");
        new_day(trial + 2, &mut rng, &mut versions);
        let kill = tally.choose("copy", COPY_POINTS, &mut rng);
        let before = r2.snapshot_ids().len();
        let outcome = crashkit::run(copy(), &kill, &label);
        tally.record("copy", &kill, outcome);
        let after = verify(&versions, &mut verified, &label);
        if let Kill::At((point, _)) = kill
            && matches!(point, "snapshot:written" | "copy:snapshot-committed")
        {
            assert!(
                after > before,
                "{label}: killed after a commit, yet {after} snapshots"
            );
        }
        if let Outcome::Finished(_) = outcome {
            assert_eq!(after, versions.len(), "{label}: a finished copy copies all");
        }
        tally.passed();
    }
    tally.assert_all_hit("copy", COPY_POINTS);
    copy_ok("the last copy");
    // Every snapshot once more, from scratch.
    let n = verify(&versions, &mut HashSet::new(), "after the last copy");
    assert_eq!(n, versions.len(), "each snapshot copied exactly once");
}

/// `cairn key passwd`, `key add` and `key remove` killed at their points and at
/// random: the password in use (or, for `passwd`, the old or the new one) still
/// opens the repository, every key file left is whole and opens with a known
/// password, and the data is intact.
#[test]
fn killed_key_changes_keep_a_password_that_opens() {
    let trials = env_u64("CAIRN_CRASH_KEY_TRIALS", 15);
    let seed = env_u64("CAIRN_CRASH_SEED", 0x5eed);
    let env = Env::new();
    env.init(&[]);
    let src = env.path("src");
    fs::create_dir_all(src.join("d")).unwrap();
    let mut rng = Rng((seed ^ 10) | 1);
    fs::write(src.join("a"), rng.bytes(200_000, false)).unwrap();
    fs::write(src.join("d/b"), rng.bytes(50_000, true)).unwrap();
    let snap = env.backup(&[&src]);
    let with = |pw: &str, args: &[&str]| {
        let mut c = env.cmd(args);
        c.env("CAIRN_PASSWORD", pw);
        c
    };
    let opens = |pw: &str| {
        let o = with(pw, &["snapshots"]).output().unwrap();
        match o.status.code() {
            Some(0) => true,
            Some(12) => false,
            _ => panic!(
                "opening with {pw:?}: {:?}: {}",
                o.status,
                String::from_utf8_lossy(&o.stderr)
            ),
        }
    };
    // The id of the key `pw` opens.
    let key_of = |pw: &str| {
        let o = with(pw, &["key", "list", "--json"]).output().unwrap();
        assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
        let keys: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
        let keys = keys.as_array().unwrap().clone();
        let current = keys.iter().find(|k| k["current"] == true).unwrap()["id"]
            .as_str()
            .unwrap()
            .to_string();
        (current, keys)
    };
    // Passwords that open the repository, one key file each; `using` runs commands.
    let mut passwords = vec![PASSWORD.to_string()];
    let t = Instant::now();
    let o = with(PASSWORD, &["key", "add"])
        .env("CAIRN_NEW_PASSWORD", "pw-setup")
        .output()
        .unwrap();
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let took = t.elapsed();
    passwords.push("pw-setup".into());
    let mut using = PASSWORD.to_string();

    let mut tally = Tally::new("keys");
    for op in ["key-passwd", "key-add", "key-remove"] {
        tally.pace(op, took);
    }
    for trial in 0..trials {
        let label = format!("key trial {trial} (seed {seed})");
        // Opening the repository tries every key file (an Argon2 derivation each):
        // keys that kills left behind are removed between trials.
        while passwords.len() > 3 {
            let extra = passwords.remove(0);
            let (id, _) = key_of(&extra);
            let o = with(&using, &["key", "remove", &id]).output().unwrap();
            assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
        }
        let op = match trial % 3 {
            0 => "key-passwd",
            2 if passwords.len() > 1 => "key-remove",
            _ => "key-add",
        };
        tally.begin(op);
        let new_pw = format!("pw-{trial}");
        let victim = match op {
            "key-remove" => passwords.iter().find(|p| **p != using).cloned(),
            _ => None,
        };
        let (cmd, points): (_, &[Spec]) = match op {
            "key-passwd" => {
                let mut c = with(&using, &["key", "passwd"]);
                c.env("CAIRN_NEW_PASSWORD", &new_pw);
                (c, &[("key:stored", 1)])
            }
            "key-add" => {
                let mut c = with(&using, &["key", "add"]);
                c.env("CAIRN_NEW_PASSWORD", &new_pw);
                (c, &[("key:stored", 1)])
            }
            _ => {
                let (id, _) = key_of(victim.as_deref().unwrap());
                (
                    with(&using, &["key", "remove", &id]),
                    &[("key:before-remove", 1)],
                )
            }
        };
        let kill = tally.choose(op, points, &mut rng);
        let outcome = crashkit::run(cmd, &kill, &label);
        tally.record(op, &kill, outcome);
        let at_point = matches!(kill, Kill::At(_));
        let finished = matches!(outcome, Outcome::Finished(_));
        let old_opens = opens(&using);
        let mut now_open: Vec<String> = Vec::new();
        match op {
            "key-passwd" => {
                let new_opens = opens(&new_pw);
                assert!(old_opens || new_opens, "{label}: neither password opens");
                // At its point the new key is stored and the old one not yet deleted.
                if at_point {
                    assert!(old_opens && new_opens, "{label}: {old_opens} {new_opens}");
                }
                if finished {
                    assert!(!old_opens && new_opens, "{label}: {old_opens} {new_opens}");
                }
                if new_opens {
                    now_open.push(new_pw.clone());
                }
                if old_opens {
                    now_open.push(using.clone());
                }
            }
            "key-add" => {
                assert!(old_opens, "{label}: the password in use stopped working");
                let new_opens = opens(&new_pw);
                if at_point || finished {
                    assert!(new_opens, "{label}: the added key does not open");
                }
                now_open.push(using.clone());
                if new_opens {
                    now_open.push(new_pw.clone());
                }
            }
            _ => {
                assert!(old_opens, "{label}: the password in use stopped working");
                let victim = victim.clone().unwrap();
                let victim_opens = opens(&victim);
                if at_point {
                    assert!(victim_opens, "{label}: removed before its point");
                }
                if finished {
                    assert!(!victim_opens, "{label}: the removed key still opens");
                }
                now_open.push(using.clone());
                if victim_opens {
                    now_open.push(victim);
                }
            }
        }
        // The passwords the operation did not touch are untouched.
        for p in &passwords {
            if *p != using && Some(p) != victim.as_ref() {
                assert!(opens(p), "{label}: {p:?} stopped working");
                now_open.push(p.clone());
            }
        }
        // Commands go on with the newest password that opens.
        passwords = now_open;
        passwords.sort_by_key(|p| p.strip_prefix("pw-").and_then(|n| n.parse::<u64>().ok()));
        using = passwords.last().unwrap().clone();
        // Every key file is whole, and each opens with one of the known passwords.
        let (_, keys) = key_of(&using);
        assert!(
            keys.iter().all(|k| k.get("error").is_none()),
            "{label}: {keys:?}"
        );
        assert_eq!(keys.len(), passwords.len(), "{label}: {keys:?}");
        // The data is intact.
        let o = with(&using, &["check", "--read-data"]).output().unwrap();
        let out = String::from_utf8_lossy(&o.stdout);
        assert!(
            o.status.success() && out.contains("no errors were found"),
            "{label}: {out}"
        );
        let target = env.path("restored");
        let _ = fs::remove_dir_all(&target);
        let o = with(
            &using,
            &["restore", &snap, "--target", target.to_str().unwrap()],
        )
        .output()
        .unwrap();
        assert!(
            o.status.success(),
            "{label}: {}",
            String::from_utf8_lossy(&o.stderr)
        );
        assert_same(&src, &target.join(src.strip_prefix("/").unwrap()));
        tally.passed();
    }
    tally.assert_all_hit("key-passwd", &[("key:stored", 1)]);
    tally.assert_all_hit("key-add", &[("key:stored", 1)]);
    tally.assert_all_hit("key-remove", &[("key:before-remove", 1)]);
}
