//! Prune, locks and crash safety, driven through the binary.
//!
//! - `killed_backups_and_prunes_lose_nothing_committed`: the crash harness. It kills
//!   `cairn backup`, `cairn prune` and `cairn repair index` with SIGKILL at their
//!   kill points and after random delays (50 trials by default;
//!   `CAIRN_CRASH_TRIALS=N` for more, `CAIRN_CRASH_SEED` to vary; crashkit.rs) and
//!   after each one requires `check --read-data` to be clean and every committed
//!   snapshot to restore exactly.
//! - `backups_and_prune_run_together`: two backups and a prune at the same time,
//!   several rounds with forget in between (`CAIRN_CONCURRENCY_ROUNDS=N` for more).
//! - `prune_waits_for_a_running_backup_and_rescues_what_it_used`: the deterministic
//!   version of the hard case: a backup that deduplicated against data prune retires.

use crate::crashkit::{self, BACKUP_POINTS, Kill, Spec, Tally, backup_committed_at, env_u64};
use crate::util::*;
use std::collections::BTreeMap;
use std::fs;
use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::time::{Duration, Instant};

/// A small tree of plain files: some compressible, some not, in a few directories.
fn make_files(root: &Path, rng: &mut Rng, n: usize, max_size: u64) {
    for i in 0..n {
        let dir = root.join(format!("d{}", i % 4));
        fs::create_dir_all(&dir).unwrap();
        let size = 1 + rng.below(max_size) as usize;
        fs::write(dir.join(format!("f{i}")), rng.bytes(size, i % 3 == 0)).unwrap();
    }
}

/// Rewrites, adds and deletes a few files so the next backup has new data and old
/// snapshots hold data later ones do not.
fn mutate(root: &Path, rng: &mut Rng, round: u64) {
    let mut files: Vec<PathBuf> = walk(root)
        .into_iter()
        .filter(|(_, m)| m.is_file())
        .map(|(p, _)| root.join(p))
        .collect();
    files.sort();
    for _ in 0..3 {
        if files.is_empty() {
            break;
        }
        let f = &files[rng.below(files.len() as u64) as usize];
        let size = 1 + rng.below(400_000) as usize;
        fs::write(f, rng.bytes(size, false)).unwrap();
    }
    if files.len() > 4 {
        let victim = files.remove(rng.below(files.len() as u64) as usize);
        fs::remove_file(victim).unwrap();
    }
    let size = 1 + rng.below(600_000) as usize;
    fs::write(root.join(format!("d0/new-{round}")), rng.bytes(size, false)).unwrap();
}

/// Snapshot id -> (source path, an exact copy of what it backed up).
struct Committed {
    versions: BTreeMap<String, (PathBuf, PathBuf)>,
}

impl Committed {
    fn verify(&self, env: &Env, label: &str) {
        let out = env.ok(&["check", "--read-data"]);
        assert!(out.contains("no errors were found"), "{label}: {out}");
        for (id, (src, copy)) in &self.versions {
            let target = env.path("verify");
            let _ = fs::remove_dir_all(&target);
            env.ok(&["restore", id, "--target", target.to_str().unwrap()]);
            let restored = target.join(src.strip_prefix("/").unwrap());
            let d = compare(copy, &restored);
            assert!(
                d.is_empty(),
                "{label}: snapshot {id} differs:\n{}",
                d.join("\n")
            );
        }
    }
}

/// Lock objects in the repository (not temporary files being written).
fn locks(env: &Env) -> usize {
    fs::read_dir(env.repo.join("locks")).map_or(0, |d| {
        d.filter(|e| {
            e.as_ref()
                .is_ok_and(|e| !e.file_name().to_string_lossy().contains(".tmp-"))
        })
        .count()
    })
}

/// Kill points a prune can reach, from its dry-run plan (made just before, on the
/// same repository: nothing else runs between the two).
fn prune_points(plan: &serde_json::Value) -> Vec<Spec> {
    let n = |k: &str| plan[k].as_u64().unwrap_or_else(|| panic!("{k}: {plan}"));
    let mut v = Vec::new();
    if n("repack_packs") > 0 {
        v.extend([("pack:stored", 1), ("prune:repacked", 1)]);
    }
    let rewrite = n("delete_packs") + n("repack_packs") + n("missing_unused_packs") > 0;
    if rewrite {
        v.extend([("index:written", 1), ("prune:index-replaced", 1)]);
    }
    if n("index_files_replaced") > 0 {
        v.push(("prune:superseded-deleted", 1));
    }
    if n("delete_packs") + n("repack_packs") + n("unindexed_packs") > 0 {
        v.extend([("prune:pending-record", 1), ("prune:pending-written", 1)]);
    }
    if n("delete_packs") + n("repack_packs") > 0 {
        v.push(("prune:pack-deleted", 1));
    }
    v
}

/// Every kill point of prune, for the check that each was hit.
const PRUNE_POINTS: &[Spec] = &[
    ("pack:stored", 1),
    ("prune:repacked", 1),
    ("index:written", 1),
    ("prune:index-replaced", 1),
    ("prune:superseded-deleted", 1),
    ("prune:pending-record", 1),
    ("prune:pending-written", 1),
    ("prune:pack-deleted", 1),
];

/// `repair index` always has old index files to replace (backups wrote them).
const REPAIR_POINTS: &[Spec] = &[
    ("index:written", 1),
    ("repair:index-written", 1),
    ("repair:old-index-deleted", 1),
];

fn count_dir(dir: &Path) -> usize {
    fs::read_dir(dir).map_or(0, |d| d.count())
}

/// The crash harness for backup, prune and `repair index`. Each trial kills one
/// of them, at a kill point (two trials in three, every point in turn) or after a
/// random delay, then requires `check --read-data` to be clean and every committed
/// snapshot to restore exactly.
#[test]
fn killed_backups_and_prunes_lose_nothing_committed() {
    let trials = env_u64("CAIRN_CRASH_TRIALS", 50);
    let seed = env_u64("CAIRN_CRASH_SEED", 0x5eed);
    let env = Env::new();
    env.init(&["--block-size", "4K"]);
    let src = env.path("src");
    let mut rng = Rng(seed | 1);
    make_files(&src, &mut rng, 24, 300_000);
    let mut committed = Committed {
        versions: BTreeMap::new(),
    };
    // Uninterrupted runs first: they give the time scale for random delays.
    let mut tally = Tally::new("maintenance");
    let id = env.backup(&[&src]);
    let copy = env.path("v-first");
    copy_tree(&src, &copy);
    committed.versions.insert(id, (src.clone(), copy));
    mutate(&src, &mut rng, 0);
    let t = Instant::now();
    let id = env.backup(&[&src]);
    tally.pace("backup", t.elapsed());
    let copy = env.path("v-second");
    copy_tree(&src, &copy);
    committed.versions.insert(id, (src.clone(), copy));
    let t = Instant::now();
    env.ok(&["prune", "--max-unused", "0%"]);
    tally.pace("prune", t.elapsed());
    let t = Instant::now();
    env.ok(&["repair", "index"]);
    tally.pace("repair", t.elapsed());

    for trial in 1..=trials {
        let label = format!("trial {trial} (seed {seed})");
        let op = if trial % 10 == 0 {
            "repair"
        } else if trial % 2 == 1 {
            "backup"
        } else {
            "prune"
        };
        tally.begin(op);
        let reachable = match op {
            "backup" => {
                mutate(&src, &mut rng, trial);
                BACKUP_POINTS.to_vec()
            }
            "prune" => {
                // Give prune work: forget the oldest snapshot while more than two remain.
                if committed.versions.len() > 2 {
                    let ids = env.snapshot_ids();
                    let oldest = ids
                        .iter()
                        .find(|i| committed.versions.contains_key(*i))
                        .unwrap()
                        .clone();
                    env.ok(&["forget", &oldest]);
                    committed.versions.remove(&oldest);
                }
                let r: serde_json::Value = serde_json::from_str(&env.ok(&[
                    "prune",
                    "--dry-run",
                    "--json",
                    "--max-unused",
                    "0%",
                ]))
                .unwrap();
                prune_points(&r["plan"])
            }
            _ => REPAIR_POINTS.to_vec(),
        };
        let kill = tally.choose(op, &reachable, &mut rng);
        let before = env.snapshot_ids();
        let args: Vec<&str> = match op {
            "backup" => vec!["backup", "-q", src.to_str().unwrap()],
            "prune" => vec!["prune", "-q", "--max-unused", "0%"],
            _ => vec!["repair", "-q", "index"],
        };
        let mut cmd = env.cmd(&args);
        // Every other prune plans with its whole-repository sets spilled to disk
        // in many partitions (a small repository otherwise keeps them in RAM).
        if op == "prune" && trial % 4 == 0 {
            cmd.env("CAIRN_TEST_SPILL_BUDGET", "65536");
        }
        // The others write one pending record per retired pack (a large prune
        // writes several), so a kill can fall between them.
        if op == "prune" && trial % 4 == 2 {
            cmd.env("CAIRN_TEST_PENDING_ENTRIES", "1");
        }
        let outcome = crashkit::run(cmd, &kill, &label);
        tally.record(op, &kill, outcome);
        let after = env.snapshot_ids();
        let new: Vec<_> = after.iter().filter(|i| !before.contains(i)).collect();
        if op == "backup" {
            // A backup may have committed just before the kill; at a kill point,
            // exactly when the point is past the snapshot's write.
            assert!(new.len() <= 1, "{label}: {new:?}");
            if let Kill::At(spec) = kill {
                assert_eq!(
                    new.len(),
                    usize::from(backup_committed_at(spec)),
                    "{label}: killed at {spec:?}, new snapshots {new:?}"
                );
            }
            if let Some(id) = new.first() {
                let copy = env.path(&format!("v{trial}"));
                copy_tree(&src, &copy);
                committed
                    .versions
                    .insert((*id).clone(), (src.clone(), copy));
            }
        } else {
            assert!(new.is_empty(), "{label}: {op} made snapshots {new:?}");
        }
        if let Kill::At(("prune:pending-written" | "prune:pending-record", _)) = kill {
            assert!(
                count_dir(&env.repo.join("pending")) > 0,
                "{label}: killed after writing its pending record, which is not there"
            );
        }
        committed.verify(&env, &label);
        tally.passed();
    }
    tally.assert_all_hit("backup", BACKUP_POINTS);
    tally.assert_all_hit("repair", REPAIR_POINTS);
    tally.assert_all_hit("prune", PRUNE_POINTS);
    // Whatever the kills left behind, one prune removes it.
    env.ok(&["prune"]);
    let report: serde_json::Value = serde_json::from_str(&env.ok(&["check", "--json"])).unwrap();
    assert_eq!(report["unindexed_packs"], 0, "{report}");
    assert_eq!(report["pending_deletions"], 0, "{report}");
    let leftovers: Vec<_> = walk(&env.repo)
        .into_keys()
        .filter(|p| p.to_string_lossy().contains(".tmp-"))
        .collect();
    assert!(leftovers.is_empty(), "partial files left: {leftovers:?}");
    committed.verify(&env, "after the final prune");
}

#[test]
fn backups_and_prune_run_together() {
    let env = Env::new();
    env.init(&["--block-size", "4K"]);
    let (a, b) = (env.path("a"), env.path("b"));
    let mut rng = Rng(77);
    make_files(&a, &mut rng, 20, 500_000);
    make_files(&b, &mut rng, 20, 500_000);
    let mut committed = Committed {
        versions: BTreeMap::new(),
    };
    let rounds: u64 = std::env::var("CAIRN_CONCURRENCY_ROUNDS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(4);
    for round in 0..rounds {
        mutate(&a, &mut rng, round);
        mutate(&b, &mut rng, round);
        let (ca, cb) = (
            env.path(&format!("a-{round}")),
            env.path(&format!("b-{round}")),
        );
        copy_tree(&a, &ca);
        copy_tree(&b, &cb);
        let spawn = |p: &Path| {
            env.cmd(&["backup", "--json", p.to_str().unwrap()])
                .stdout(Stdio::piped())
                .spawn()
                .unwrap()
        };
        let (mut ja, mut jb) = (spawn(&a), spawn(&b));
        // Prune starts once both backups are under way: each holds its lock, or
        // has already ended (and so no longer does).
        wait_until("both backups to start", Duration::from_secs(60), || {
            let ended: usize = [&mut ja, &mut jb]
                .into_iter()
                .map(|c| usize::from(c.try_wait().unwrap().is_some()))
                .sum();
            locks(&env) + ended >= 2
        });
        let prune = env
            .cmd(&["prune", "--json", "--max-unused", "0%"])
            .stdout(Stdio::piped())
            .spawn()
            .unwrap();
        for (child, src, copy) in [(ja, &a, ca), (jb, &b, cb)] {
            let out = child.wait_with_output().unwrap();
            assert!(out.status.success(), "round {round}: backup failed");
            let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
            committed.versions.insert(
                v["snapshot_id"].as_str().unwrap().to_string(),
                (src.clone(), copy),
            );
        }
        let out = prune.wait_with_output().unwrap();
        assert!(
            out.status.success(),
            "round {round}: prune failed: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        committed.verify(&env, &format!("round {round}"));
        // Forget between rounds: keep the last two of each source.
        let out = env.ok(&["forget", "--keep-last", "2", "--json"]);
        let groups: serde_json::Value = serde_json::from_str(&out).unwrap();
        for g in groups.as_array().unwrap() {
            for r in g["remove"].as_array().unwrap() {
                committed.versions.remove(r["id"].as_str().unwrap());
            }
        }
    }
    env.ok(&["prune", "--max-unused", "0%"]);
    committed.verify(&env, "after the last prune");
}

/// Backup B running and relying only on the packs of snapshot A, which is
/// forgotten: A held `data`; B is fed the same bytes (its standard input still
/// open), so it stores nothing new. B's backup phase begins only after its
/// session has loaded the index (which still lists A's data): once B reports it,
/// a prune may go ahead.
fn b_relies_on_forgotten_a(
    env: &Env,
    data: &[u8],
) -> (std::process::Child, StderrLines, std::process::ChildStdin) {
    let mut c = env
        .cmd(&["backup", "--json", "--stdin", "--stdin-name", "a"])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    c.stdin.take().unwrap().write_all(data).unwrap();
    let out = c.wait_with_output().unwrap();
    assert!(out.status.success());
    let a: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    env.ok(&["forget", a["snapshot_id"].as_str().unwrap()]);
    let mut b = env
        .cmd(&["backup", "--json", "--stdin", "--stdin-name", "b"])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let mut b_events = StderrLines::of(&mut b);
    b_events.wait_for(
        r#"{"type":"phase_started","phase":"backup"}"#,
        Duration::from_secs(60),
    );
    let mut pipe = b.stdin.take().unwrap();
    pipe.write_all(data).unwrap();
    (b, b_events, pipe)
}

#[test]
fn prune_waits_for_a_running_backup_and_rescues_what_it_used() {
    let env = Env::new();
    env.init(&["--block-size", "4K"]);
    let data = Rng(99).bytes(3 << 20, false);
    let (b, b_events, pipe) = b_relies_on_forgotten_a(&env, &data);

    // Prune retires A's packs but must not delete them while B runs.
    let r: serde_json::Value = serde_json::from_str(&env.ok(&["prune", "--json"])).unwrap();
    assert!(r["plan"]["delete_packs"].as_u64().unwrap() > 0, "{r}");
    assert_eq!(r["deleted_packs"], 0, "{r}");
    assert!(r["deferred_packs"].as_u64().unwrap() > 0, "{r}");
    // The bytes waiting are counted too (they were 0 whatever waited).
    assert!(
        r["deferred_bytes"].as_u64().unwrap() >= r["plan"]["delete_bytes"].as_u64().unwrap(),
        "{r}"
    );
    assert!(
        r["waiting_for"][0]
            .as_str()
            .unwrap()
            .contains("backup lock"),
        "{r}"
    );
    let out = env.ok(&["unlock"]);
    assert!(out.contains("in use: backup lock"), "{out}");
    // When it would go stale (its job runs on this machine: no word of removing it).
    assert!(
        out.contains("min ago; stale in ") && !out.contains("unlock --remove-all"),
        "{out}"
    );

    drop(pipe);
    let out = b.wait_with_output().unwrap();
    assert!(out.status.success(), "{}", b_events.all());
    let bj: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    let bid = bj["snapshot_id"].as_str().unwrap();
    // Only B's own root tree (a few dozen bytes) is new.
    assert!(
        bj["data_added"].as_u64().unwrap() < 1000,
        "B deduplicated the data: {bj}"
    );
    // B's data lives only in retired packs: still readable through the record.
    let o = env.run(&["dump", bid, "/b"]);
    assert!(
        o.status.success() && o.stdout == data,
        "B reads back before the rescue"
    );
    env.check_clean();

    // The next prune sees B's snapshot and indexes the packs again instead.
    let r: serde_json::Value = serde_json::from_str(&env.ok(&["prune", "--json"])).unwrap();
    assert!(r["rescued_packs"].as_u64().unwrap() > 0, "{r}");
    // Their bytes are counted, and the summary does not call them reclaimed.
    assert!(
        r["rescued_bytes"].as_u64().unwrap() >= data.len() as u64 / 2,
        "{r}"
    );
    env.check_clean();
    let o = env.run(&["dump", bid, "/b"]);
    assert!(o.status.success());
    assert!(o.stdout == data, "B restores exactly after the rescue");
    // And once B is forgotten, its data goes.
    env.ok(&["forget", bid]);
    let r: serde_json::Value = serde_json::from_str(&env.ok(&["prune", "--json"])).unwrap();
    assert!(r["deleted_packs"].as_u64().unwrap() > 0, "{r}");
    env.check_clean();
}

/// A prune while a backup is still writing packs: it finds them unindexed and
/// defers them, says they may be a running backup's, and once the backup has
/// indexed them the next prune no longer counts them as waiting for deletion
/// (QA r11: "9 packs are waiting for deletion" of packs a snapshot needed).
#[test]
fn a_running_backups_packs_are_not_called_waiting_for_deletion_once_indexed() {
    let env = Env::new();
    env.init(&[]);
    env.ok(&["config", "--pack-size", "1M"]);
    let data = Rng(7).bytes(6 << 20, false);
    let mut b = env
        .cmd(&["backup", "--json", "--stdin", "--stdin-name", "b"])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let _events = StderrLines::of(&mut b);
    let mut pipe = b.stdin.take().unwrap();
    pipe.write_all(&data).unwrap();
    // Wait for packs the backup has stored but not indexed yet.
    let t = std::time::Instant::now();
    while packs(&env.repo).len() < 3 {
        assert!(t.elapsed() < Duration::from_secs(60), "no packs written");
        std::thread::sleep(Duration::from_millis(50));
    }
    let out = env.ok(&["prune"]);
    assert!(
        out.contains("being written by one running now") && out.contains("unless a snapshot"),
        "{out}"
    );
    drop(pipe);
    let o = b.wait_with_output().unwrap();
    assert!(o.status.success());
    let id = serde_json::from_slice::<serde_json::Value>(&o.stdout).unwrap()["snapshot_id"]
        .as_str()
        .unwrap()
        .to_string();
    let r: serde_json::Value = serde_json::from_str(&env.ok(&["prune", "--json"])).unwrap();
    assert_eq!(r["plan"]["earlier_pending_packs"], 0, "{r}");
    assert_eq!(r["deleted_packs"], 0, "{r}");
    env.check_clean();
    assert!(env.run(&["dump", &id, "/b"]).stdout == data);
}

/// A prune whose clock is far ahead (past the documented 30 minutes) takes a
/// running backup's lock for stale. It removes that lock before it deletes the
/// packs it no longer holds back, so the backup, which relied on them, finds its
/// lock gone at its commit and saves no snapshot, instead of one that cannot be
/// restored.
#[test]
fn a_prune_with_its_clock_ahead_makes_a_running_backup_stop_not_save_a_broken_snapshot() {
    let env = Env::new();
    env.init(&["--block-size", "4K"]);
    let data = Rng(98).bytes(2 << 20, false);
    let (b, b_events, pipe) = b_relies_on_forgotten_a(&env, &data);
    // The prune's clock is 45 minutes ahead: B's lock looks 45 minutes old.
    let plain = env.cmd(&["prune", "--json"]);
    let mut skewed = std::process::Command::new("faketime");
    skewed
        .args(["-f", "+45m"])
        .arg(plain.get_program())
        .args(plain.get_args());
    for (k, v) in plain.get_envs() {
        match v {
            Some(v) => skewed.env(k, v),
            None => skewed.env_remove(k),
        };
    }
    let o = skewed.output().unwrap();
    let out = String::from_utf8_lossy(&o.stdout);
    assert!(
        o.status.success(),
        "{out} {}",
        String::from_utf8_lossy(&o.stderr)
    );
    let r: serde_json::Value = serde_json::from_str(&out).unwrap();
    assert!(r["deleted_packs"].as_u64().unwrap() > 0, "{r}");
    assert_removed_a_backup_lock(&r);
    drop(pipe);
    let out = b.wait_with_output().unwrap();
    let err = b_events.all();
    assert!(!out.status.success(), "B saved a snapshot: {err}");
    assert!(err.contains("stops without committing"), "{err}");
    assert!(env.snapshot_ids().is_empty(), "no snapshot is saved");
    env.check_clean();
}

#[test]
fn a_killed_job_never_blocks_the_next_one() {
    let env = Env::new();
    env.init(&[]);
    // A backup of new files killed after storing its first pack: well inside its
    // run, holding its lock.
    let killed_backup = |dir: &str, seed: u64| {
        let src = env.path(dir);
        make_files(&src, &mut Rng(seed), 10, 2_000_000);
        crashkit::run(
            env.cmd(&["backup", "-q", src.to_str().unwrap()]),
            &Kill::At(("pack:stored", 1)),
            "backup",
        );
        assert_eq!(locks(&env), 1);
        src
    };
    let src = killed_backup("src", 5);
    // Its lock is left behind but known stale: a backup goes ahead, and
    // `unlock` tidies it away.
    env.backup(&[&src]);
    let out = env.ok(&["unlock"]);
    assert!(out.contains("removed backup lock"), "{out}");
    assert_eq!(fs::read_dir(env.repo.join("locks")).unwrap().count(), 0);
    // Killed again: prune goes ahead too, and removes the dead job's lock before
    // it deletes the pack the job left.
    killed_backup("more", 6);
    let r: serde_json::Value = serde_json::from_str(&env.ok(&["prune", "--json"])).unwrap();
    assert_eq!(r["deferred_packs"], 0, "{r}");
    assert!(r["deleted_packs"].as_u64().unwrap() > 0, "{r}");
    assert_removed_a_backup_lock(&r);
    assert_eq!(locks(&env), 0);
    env.check_clean();
}

/// A backup whose lock is removed while it runs (`unlock --remove-all` from another
/// machine) saves no snapshot: a prune that no longer saw the lock may have deleted
/// what it deduplicated against. And `unlock --remove-all` on this machine leaves
/// the lock of a backup that is running here.
#[test]
fn a_backup_whose_lock_was_removed_saves_no_snapshot() {
    let env = Env::new();
    env.init(&[]);
    let src = env.path("src");
    fs::create_dir_all(&src).unwrap();
    fs::write(src.join("big"), Rng(41).bytes(12 << 20, false)).unwrap();
    let start = || {
        env.cmd(&[
            "backup",
            "--force",
            "--read-limit",
            "4M",
            src.to_str().unwrap(),
        ])
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap()
    };
    let wait_for_lock = || {
        let t = Instant::now();
        while locks(&env) == 0 {
            assert!(t.elapsed() < Duration::from_secs(30), "no lock appeared");
            std::thread::sleep(Duration::from_millis(20));
        }
    };
    // Here: the running backup's lock stays, with a warning; the backup commits.
    let b = start();
    wait_for_lock();
    let o = env.cmd(&["unlock", "--remove-all"]).output().unwrap();
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(err.contains("running on this machine"), "{err}");
    assert_eq!(locks(&env), 1);
    let o = b.wait_with_output().unwrap();
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    assert_eq!(env.snapshot_ids().len(), 1);
    // From elsewhere (the lock object deleted): no snapshot, a clear error, and no
    // index file naming the packs it stored, which a prune that saw no lock could
    // delete (the next backup would deduplicate against them and not be restorable).
    fs::write(src.join("big"), Rng(42).bytes(12 << 20, false)).unwrap();
    let index_files = || -> Vec<_> {
        let mut v: Vec<_> = fs::read_dir(env.repo.join("index"))
            .unwrap()
            .map(|e| e.unwrap().file_name())
            .collect();
        v.sort();
        v
    };
    let before = index_files();
    let b = start();
    wait_for_lock();
    for e in fs::read_dir(env.repo.join("locks")).unwrap() {
        fs::remove_file(e.unwrap().path()).unwrap();
    }
    let o = b.wait_with_output().unwrap();
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(!o.status.success(), "{err}");
    assert!(err.contains("removed"), "{err}");
    assert_eq!(env.snapshot_ids().len(), 1);
    assert_eq!(index_files(), before);
    env.ok(&["prune"]);
    env.check_clean();
    let snap = env.backup(&[&src]);
    let out = env.restore(&snap, &src, "out");
    assert_eq!(
        fs::read(out.join("big")).unwrap(),
        fs::read(src.join("big")).unwrap()
    );
}

/// A pack a backup stored that is gone before it commits (a prune on a host whose
/// clock runs half an hour ahead took its live lock for stale): no snapshot, a
/// message that names clocks, and its index files taken back, so that the next
/// backup stores the data again and restores exactly.
#[test]
fn a_backup_whose_pack_vanished_saves_no_snapshot() {
    let env = Env::new();
    env.init(&[]);
    let src = env.path("src");
    fs::create_dir_all(&src).unwrap();
    fs::write(src.join("big"), Rng(43).bytes(6 << 20, false)).unwrap();
    let before = packs(&env.repo);
    let index_before: Vec<_> = fs::read_dir(env.repo.join("index"))
        .map(|d| d.map(|e| e.unwrap().file_name()).collect())
        .unwrap_or_default();
    let gate = env.path("gate");
    fs::create_dir_all(&gate).unwrap();
    let b = env
        .cmd(&["backup", src.to_str().unwrap()])
        .env(
            cairn_core::hooks::PAUSE_AT_VAR,
            format!("pack:stored:1:{}", gate.display()),
        )
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    wait_until("the first pack stored", Duration::from_secs(60), || {
        gate.join("reached").exists()
    });
    for p in packs(&env.repo).keys().filter(|p| !before.contains_key(*p)) {
        fs::remove_file(p).unwrap();
    }
    fs::write(gate.join("go"), b"").unwrap();
    let o = b.wait_with_output().unwrap();
    let err = String::from_utf8_lossy(&o.stderr);
    assert_eq!(o.status.code(), Some(1), "{err}");
    assert!(err.contains("are gone") && err.contains("clocks"), "{err}");
    assert!(env.snapshot_ids().is_empty());
    let index_after: Vec<_> = fs::read_dir(env.repo.join("index"))
        .map(|d| d.map(|e| e.unwrap().file_name()).collect())
        .unwrap_or_default();
    assert_eq!(index_after, index_before);
    let snap = env.backup(&[&src]);
    let out = env.restore(&snap, &src, "out");
    assert_eq!(
        fs::read(out.join("big")).unwrap(),
        fs::read(src.join("big")).unwrap()
    );
    env.ok(&["prune"]);
    env.check_clean();
}

/// Prune's report names the stale backup lock it removed first.
fn assert_removed_a_backup_lock(r: &serde_json::Value) {
    assert!(
        r["stale_locks_removed"][0]
            .as_str()
            .is_some_and(|l| l.contains("backup lock")),
        "{r}"
    );
}

/// Ctrl-C (or SIGTERM) during a prune's repacking stops it before it changes
/// the index: exit 130 and a word saying nothing was deleted (QA: it went on to
/// delete at full speed, past --limit-upload, and exited 0). The next prune does
/// the job, and the data is whole throughout.
#[test]
fn a_prune_interrupted_while_repacking_stops_before_the_index() {
    use nix::sys::signal::{Signal, kill};
    use nix::unistd::Pid;
    for sig in [Signal::SIGINT, Signal::SIGTERM] {
        let env = Env::new();
        env.init(&["--block-size", "4K"]);
        let src = env.path("src");
        fs::create_dir_all(&src).unwrap();
        let mut rng = Rng(7);
        for i in 0..40 {
            fs::write(src.join(format!("f{i}")), rng.bytes(60_000, false)).unwrap();
        }
        let first = env.backup(&[&src]);
        for i in (0..40).step_by(2) {
            fs::remove_file(src.join(format!("f{i}"))).unwrap();
        }
        env.backup(&[&src]);
        env.ok(&["forget", &first]);
        let packs = || fs::read_dir(env.repo.join("data")).unwrap().count();
        let gate = env.path("gate");
        fs::create_dir_all(&gate).unwrap();
        let child = env
            .cmd(&["prune", "--max-unused", "0%"])
            .env(
                cairn_core::hooks::PAUSE_AT_VAR,
                format!("prune:repacked:1:{}", gate.display()),
            )
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap();
        wait_until("the prune to repack", Duration::from_secs(60), || {
            gate.join("reached").exists()
        });
        let before = packs();
        kill(Pid::from_raw(child.id() as i32), sig).unwrap();
        fs::write(gate.join("go"), b"").unwrap();
        let o = child.wait_with_output().unwrap();
        let err = String::from_utf8_lossy(&o.stderr);
        assert_eq!(o.status.code(), Some(130), "{sig}: {err}");
        assert!(err.contains("nothing was deleted"), "{sig}: {err}");
        assert!(packs() >= before, "{sig}: a pack was deleted");
        env.check_clean();
        let r: serde_json::Value =
            serde_json::from_str(&env.ok(&["prune", "--json", "--max-unused", "0%"])).unwrap();
        assert!(r["deleted_packs"].as_u64().unwrap() > 0, "{r}");
        env.check_clean();
        assert_same(&src, &env.restore("latest", &src, "out"));
    }
}

/// `check --read-data-subset SIZE` (restic's `500M`) reads random packs adding up
/// to at most that size; N/M, P% and nonsense as before.
#[test]
fn check_reads_a_subset_of_packs_by_size() {
    let env = Env::new();
    env.init(&[]);
    let src = env.path("src");
    fs::create_dir_all(&src).unwrap();
    fs::write(src.join("big"), Rng(11).bytes(4 << 20, false)).unwrap();
    env.ok(&["backup", "--pack-size", "512K", src.to_str().unwrap()]);
    let read = |subset: &str| -> u64 {
        let mut args = vec!["check", "--json"];
        if subset == "all" {
            args.push("--read-data");
        } else {
            args.extend(["--read-data-subset", subset]);
        }
        let v: serde_json::Value = serde_json::from_str(&env.ok(&args)).unwrap();
        v["packs_read"].as_u64().unwrap()
    };
    let all = read("all");
    assert!(all >= 8, "{all} packs");
    assert_eq!(read("100G"), all);
    // Random packs until 1 MiB is reached: more than none, fewer than all, and
    // without the last of them less than 1 MiB.
    let v: serde_json::Value =
        serde_json::from_str(&env.ok(&["check", "--json", "--read-data-subset", "1M"])).unwrap();
    let (some, bytes) = (
        v["packs_read"].as_u64().unwrap(),
        v["bytes_read"].as_u64().unwrap(),
    );
    let largest = walk(&env.repo.join("data"))
        .into_values()
        .filter(|m| m.is_file())
        .map(|m| m.len())
        .max()
        .unwrap();
    assert!(some >= 1 && some < all, "{some} of {all} packs");
    assert!(
        bytes >= 1 << 20 && bytes < (1 << 20) + largest,
        "{bytes} bytes"
    );
    // A size below any pack still reads one (QA: 200B read none, "no errors").
    assert_eq!(read("200B"), 1);
    let out = env.ok(&["check", "--read-data-subset", "1M"]);
    assert!(out.contains("read in full, "), "{out}");
    assert_eq!(read("100%"), all);
    for bad in ["0M", "12Q", "3/2"] {
        let err = env.fails(&["check", "--read-data-subset", bad], 2);
        assert!(err.contains("--read-data-subset"), "{bad}: {err}");
    }
}

/// The space prune says it reclaims is what leaves the repository's packs: a
/// repack copies the kept blobs into new packs with headers of their own, which
/// are not freed (QA: 298 KiB said where 160 KiB went, thousands of small
/// blobs repacked).
#[test]
fn prune_reclaims_what_it_says_when_it_repacks_small_blobs() {
    let env = Env::new();
    env.init(&[]);
    let src = env.path("src");
    fs::create_dir_all(&src).unwrap();
    let mut rng = Rng(11);
    for i in 0..3000 {
        fs::write(src.join(format!("f{i:04}")), rng.bytes(2000, false)).unwrap();
    }
    let first = env.backup(&[&src]);
    for i in 0..1000 {
        fs::remove_file(src.join(format!("f{i:04}"))).unwrap();
    }
    env.backup(&[&src]);
    env.ok(&["forget", &first]);
    let packs = |repo: &Path| -> u64 {
        walk(&repo.join("data"))
            .into_iter()
            .filter(|(_, m)| m.is_file())
            .map(|(_, m)| m.len())
            .sum()
    };
    let before = packs(&env.repo);
    let r: serde_json::Value =
        serde_json::from_str(&env.ok(&["prune", "--max-unused", "0", "--json"])).unwrap();
    let plan = &r["plan"];
    assert!(plan["repack_packs"].as_u64().unwrap() > 0, "{r}");
    let freed = before - packs(&env.repo);
    let said = plan["reclaim_bytes"].as_u64().unwrap();
    // Within the new packs' fixed bytes (the entry count's length is estimated).
    assert!(
        said.abs_diff(freed) <= 64,
        "said {said}, freed {freed}: {r}"
    );
    env.check_clean();
}
