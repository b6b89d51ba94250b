//! Prune, locks and crash safety, driven through the binary.
//!
//! - `killed_backups_and_prunes_lose_nothing_committed`: the crash harness. It kills
//!   `cairn backup` and `cairn prune` with SIGKILL at random points (100 trials by
//!   default; `CAIRN_CRASH_TRIALS=N` for more, `CAIRN_CRASH_SEED` to vary) and after
//!   each one requires `check --read-data` to be clean and every committed snapshot to
//!   restore exactly.
//! - `backups_and_prune_run_together`: two backups and a prune at the same time,
//!   several rounds with forget in between (`CAIRN_CONCURRENCY_ROUNDS=N` for more).
//! - `prune_waits_for_a_running_backup_and_rescues_what_it_used`: the deterministic
//!   version of the hard case: a backup that deduplicated against data prune retires.

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

/// Waits until a lock object (not a temporary file being written) exists.
fn wait_for_lock(env: &Env) {
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let n = fs::read_dir(env.repo.join("locks")).map_or(0, |d| {
            d.filter(|e| {
                e.as_ref()
                    .is_ok_and(|e| !e.file_name().to_string_lossy().contains(".tmp-"))
            })
            .count()
        });
        if n > 0 {
            return;
        }
        assert!(Instant::now() < deadline, "the job never took its lock");
        std::thread::sleep(Duration::from_millis(5));
    }
}

fn kill_after(mut child: std::process::Child, delay: Duration) -> (bool, String) {
    let start = Instant::now();
    loop {
        if child.try_wait().unwrap().is_some() {
            break;
        }
        if start.elapsed() >= delay {
            let _ = child.kill();
            break;
        }
        std::thread::sleep(Duration::from_millis(2));
    }
    let out = child.wait_with_output().unwrap();
    (
        out.status.success(),
        String::from_utf8_lossy(&out.stdout).into_owned(),
    )
}

#[test]
fn killed_backups_and_prunes_lose_nothing_committed() {
    let trials: u64 = std::env::var("CAIRN_CRASH_TRIALS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(100);
    let seed: u64 = std::env::var("CAIRN_CRASH_SEED")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(0x5eed);
    let env = Env::new();
    env.init(&["--block-size", "4K"]);
    let src = env.path("src");
    let mut rng = Rng(seed | 1);
    make_files(&src, &mut rng, 24, 300_000);
    let mut committed = Committed {
        versions: BTreeMap::new(),
    };
    // Uninterrupted runs first: they give the time scale for kill points.
    let t = Instant::now();
    let id = env.backup(&[&src]);
    let backup_time = t.elapsed();
    let copy = env.path("v-first");
    copy_tree(&src, &copy);
    committed.versions.insert(id, (src.clone(), copy));
    mutate(&src, &mut rng, 0);
    let id = env.backup(&[&src]);
    let copy = env.path("v-second");
    copy_tree(&src, &copy);
    committed.versions.insert(id, (src.clone(), copy));
    let t = Instant::now();
    env.ok(&["prune", "--max-unused", "0%"]);
    let prune_time = t.elapsed();

    let (mut killed, mut finished) = (0u64, 0u64);
    for trial in 1..=trials {
        let label = format!("trial {trial} (seed {seed})");
        let (op, scale) = if trial % 2 == 1 {
            mutate(&src, &mut rng, trial);
            ("backup", backup_time)
        } else {
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
            ("prune", prune_time)
        };
        let before = env.snapshot_ids();
        let delay = Duration::from_micros(rng.below(scale.as_micros() as u64 * 13 / 10 + 1));
        let args: Vec<&str> = match op {
            "backup" => vec!["backup", "-q", src.to_str().unwrap()],
            _ => vec!["prune", "-q", "--max-unused", "0%"],
        };
        let child = env.cmd(&args).stdout(Stdio::piped()).spawn().unwrap();
        let (ok, _) = kill_after(child, delay);
        if ok {
            finished += 1;
        } else {
            killed += 1;
        }
        if op == "backup" {
            // A backup may have committed just before the kill.
            let after = env.snapshot_ids();
            let new: Vec<_> = after.iter().filter(|i| !before.contains(i)).collect();
            assert!(new.len() <= 1, "{label}: {new:?}");
            if let Some(id) = new.first() {
                let copy = env.path(&format!("v{trial}"));
                copy_tree(&src, &copy);
                committed
                    .versions
                    .insert((*id).clone(), (src.clone(), copy));
            }
        }
        committed.verify(&env, &label);
    }
    eprintln!("crash harness: {trials} trials, {killed} killed mid-run, {finished} finished first");
    assert!(
        killed >= trials / 3,
        "only {killed} of {trials} kills hit a running operation"
    );
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
        let (ja, jb) = (spawn(&a), spawn(&b));
        std::thread::sleep(Duration::from_millis(30));
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

#[test]
fn prune_waits_for_a_running_backup_and_rescues_what_it_used() {
    let env = Env::new();
    env.init(&["--block-size", "4K"]);
    let data = Rng(99).bytes(3 << 20, false);
    // Snapshot A holds the data; forgetting it leaves the data unreferenced.
    let mut c = env
        .cmd(&["backup", "--json", "--stdin", "--stdin-name", "a"])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    c.stdin.take().unwrap().write_all(&data).unwrap();
    let out = c.wait_with_output().unwrap();
    assert!(out.status.success());
    let a: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    env.ok(&["forget", a["snapshot_id"].as_str().unwrap()]);

    // Backup B starts (loads the index, which still lists A's data) and is fed the
    // same bytes, so it stores nothing new: it relies on A's packs.
    let mut b = env
        .cmd(&["backup", "--json", "--stdin", "--stdin-name", "b"])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    let mut pipe = b.stdin.take().unwrap();
    pipe.write_all(&data).unwrap();
    wait_for_lock(&env);
    std::thread::sleep(Duration::from_millis(500));

    // Prune retires A's packs but must not delete them while B runs.
    let r: serde_json::Value = serde_json::from_str(&env.ok(&["prune", "--json"])).unwrap();
    assert!(r["plan"]["delete_packs"].as_u64().unwrap() > 0, "{r}");
    assert_eq!(r["deleted_packs"], 0, "{r}");
    assert!(r["deferred_packs"].as_u64().unwrap() > 0, "{r}");
    assert!(
        r["waiting_for"][0]
            .as_str()
            .unwrap()
            .contains("backup lock"),
        "{r}"
    );
    let out = env.ok(&["unlock"]);
    assert!(out.contains("in use: backup lock"), "{out}");

    drop(pipe);
    let out = b.wait_with_output().unwrap();
    assert!(out.status.success());
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

#[test]
fn a_killed_job_never_blocks_the_next_one() {
    let env = Env::new();
    env.init(&[]);
    let src = env.path("src");
    make_files(&src, &mut Rng(5), 10, 2_000_000);
    let child = env
        .cmd(&["backup", "-q", src.to_str().unwrap()])
        .spawn()
        .unwrap();
    wait_for_lock(&env);
    let _ = kill_after(child, Duration::ZERO);
    assert_eq!(fs::read_dir(env.repo.join("locks")).unwrap().count(), 1);
    // Its lock is left behind but known stale: prune and backup go ahead.
    let r: serde_json::Value = serde_json::from_str(&env.ok(&["prune", "--json"])).unwrap();
    assert_eq!(r["deferred_packs"], 0, "{r}");
    env.backup(&[&src]);
    let out = env.ok(&["unlock"]);
    assert!(out.contains("removed backup lock"), "{out}");
    assert_eq!(fs::read_dir(env.repo.join("locks")).unwrap().count(), 0);
    env.check_clean();
}
