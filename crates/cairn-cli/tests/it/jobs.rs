//! Several backup jobs writing into one datastore at once, and the
//! `max-concurrent-jobs` setting that queues the ones over the limit.

use crate::util::*;
use std::fs;
use std::io::Write;
use std::path::PathBuf;
use std::process::Stdio;
use std::time::{Duration, Instant};

fn stats(env: &Env) -> serde_json::Value {
    serde_json::from_str(&env.ok(&["stats", "--json"])).unwrap()
}

#[test]
fn four_concurrent_backups_of_overlapping_data_all_restore_exactly() {
    let env = Env::new();
    env.init(&["--block-size", "8K"]);
    // Four trees sharing most of their content: a common part, and a part of their own.
    let mut rng = Rng(404);
    let common: Vec<Vec<u8>> = (0..12).map(|i| rng.bytes(300_000, i % 2 == 0)).collect();
    let srcs: Vec<PathBuf> = (0..4)
        .map(|j| {
            let src = env.path(&format!("host{j}"));
            fs::create_dir_all(src.join("shared")).unwrap();
            for (i, c) in common.iter().enumerate() {
                fs::write(src.join(format!("shared/f{i}")), c).unwrap();
            }
            fs::write(src.join("own"), rng.bytes(400_000, false)).unwrap();
            src
        })
        .collect();
    let jobs: Vec<_> = srcs
        .iter()
        .map(|p| {
            env.cmd(&["backup", "--json", p.to_str().unwrap()])
                .stdout(Stdio::piped())
                .stderr(Stdio::piped())
                .spawn()
                .unwrap()
        })
        .collect();
    let mut ids = Vec::new();
    for (child, src) in jobs.into_iter().zip(&srcs) {
        let out = child.wait_with_output().unwrap();
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(out.status.success(), "backup of {}: {err}", src.display());
        assert!(
            !err.contains("waiting"),
            "four jobs fit the default of 4: {err}"
        );
        let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
        ids.push(v["snapshot_id"].as_str().unwrap().to_string());
    }
    for (i, (id, src)) in ids.iter().zip(&srcs).enumerate() {
        let copy = env.restore(id, src, &format!("restored{i}"));
        assert_same(src, &copy);
    }
    env.check_clean();

    // Chunks two jobs stored at the same time are kept once in the index's view
    // ("unique data") and the extra copies show as unused until prune removes them.
    let before = stats(&env);
    let unique = before["unique_data_bytes"].as_u64().unwrap();
    let logical_unique = 12 * 300_000 + 4 * 400_000;
    assert!(
        (unique as i64 - logical_unique as i64).abs() < 100_000,
        "{before}"
    );
    env.ok(&["prune", "--max-unused", "0%"]);
    let after = stats(&env);
    assert_eq!(
        after["overhead"]["unused_bytes"].as_u64(),
        Some(0),
        "{after}"
    );
    for (i, (id, src)) in ids.iter().zip(&srcs).enumerate() {
        let copy = env.restore(id, src, &format!("after-prune{i}"));
        assert_same(src, &copy);
    }
    env.check_clean();
}

/// Starts a backup of standard input that holds its job slot until `stdin` closes.
fn held_job(env: &Env) -> std::process::Child {
    let mut child = env
        .cmd(&["backup", "--stdin", "--stdin-name", "held", "--json"])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    child
        .stdin
        .as_mut()
        .unwrap()
        .write_all(b"some bytes")
        .unwrap();
    child
}

fn backup_locks(env: &Env) -> usize {
    let dir = env.repo.join("locks");
    fs::read_dir(dir).map(|d| d.count()).unwrap_or(0)
}

#[test]
fn jobs_over_max_concurrent_jobs_wait_their_turn_and_say_so() {
    let env = Env::new();
    env.init(&[]);
    let out = env.ok(&["config", "--max-concurrent-jobs", "1"]);
    assert!(out.contains("max jobs      1"), "{out}");
    let src = env.path("src");
    fs::create_dir_all(&src).unwrap();
    fs::write(src.join("f"), b"data").unwrap();
    let minute = Duration::from_secs(60);

    let mut first = held_job(&env);
    wait_until("the first job's lock", minute, || backup_locks(&env) == 1);
    let mut second = env
        .cmd(&["backup", "--json", src.to_str().unwrap()])
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    // The second job says that it queues behind the first ...
    let mut events = StderrLines::of(&mut second);
    let notice = events.wait_for("waiting: 1 backup job is", minute);
    assert!(notice.contains("max-concurrent-jobs is 1"), "{notice}");
    assert!(
        notice.contains("backup lock"),
        "names the job it waits for: {notice}"
    );
    assert!(
        notice.contains("cairn unlock"),
        "says how a dead job's place goes: {notice}"
    );
    // ... has committed nothing while the first still runs ...
    assert!(first.try_wait().unwrap().is_none(), "the first job ended");
    assert_eq!(env.snapshot_ids().len(), 0);
    // ... and starts its backup only after the first ends: its snapshot's time (when
    // its backup began) is later than the first job's release.
    let released = cairn_core::time::now_rfc3339();
    drop(first.stdin.take());
    let a = first.wait_with_output().unwrap();
    assert!(a.status.success(), "{}", String::from_utf8_lossy(&a.stderr));
    let b = second.wait_with_output().unwrap();
    let err = events.all();
    assert!(b.status.success(), "{err}");
    let report: serde_json::Value = serde_json::from_slice(&b.stdout).unwrap();
    let began = report["time"].as_str().unwrap();
    // The wait is reported beside the backup's own duration.
    assert!(report["slot_wait_secs"].as_f64().unwrap() > 0.0, "{report}");
    assert!(report["files_per_sec"].as_f64().unwrap() > 0.0, "{report}");
    assert!(
        began > released.as_str(),
        "the second job began at {began}, before the first was released at {released}"
    );
    assert_eq!(env.snapshot_ids().len(), 2);

    // A killed job ahead frees its slot at once (its pid is gone on this machine).
    let mut killed = held_job(&env);
    wait_until("the held job's lock", minute, || backup_locks(&env) == 1);
    killed.kill().unwrap();
    killed.wait().unwrap();
    let t = Instant::now();
    env.backup(&[&src]);
    assert!(t.elapsed() < Duration::from_secs(30));

    // Bad values are refused; above 16 is allowed with a warning.
    env.fails(&["config", "--max-concurrent-jobs", "0"], 2);
    let o = env.run(&["config", "--max-concurrent-jobs", "20"]);
    assert!(o.status.success());
    assert!(String::from_utf8_lossy(&o.stderr).contains("warning"));
    let v: serde_json::Value = serde_json::from_str(&env.ok(&["config", "--json"])).unwrap();
    assert_eq!(v["max_concurrent_jobs"], 20);
}

/// Two backups running at the same time that store the same new data: the one that
/// finishes second says so (instead of both just reporting it as added), `stats`
/// shows the second copy as reclaimable, and prune reclaims it.
#[test]
fn concurrent_backups_storing_the_same_data_say_so_and_prune_reclaims_it() {
    let env = Env::new();
    env.init(&[]);
    let data = Rng(21).bytes(2 << 20, false);
    let src = env.path("src");
    fs::create_dir_all(&src).unwrap();
    fs::write(src.join("same.bin"), &data).unwrap();
    // A: reads the data from standard input and waits, holding it, until stdin closes.
    let mut a = env
        .cmd(&["backup", "--stdin", "--stdin-name", "same.bin", "--json"])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    a.stdin.as_mut().unwrap().write_all(&data).unwrap();
    wait_until("A's lock", Duration::from_secs(60), || {
        backup_locks(&env) == 1
    });
    // B: stores the same chunks and commits while A still runs.
    let b = env.backup_json(&[&src]);
    assert!(b.get("concurrent_duplicates").is_none(), "{b}");
    drop(a.stdin.take());
    let out = a.wait_with_output().unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let ra: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    let dup = ra["concurrent_duplicates"]["bytes"].as_u64().unwrap_or(0);
    assert!(dup >= data.len() as u64 * 9 / 10, "{ra}");

    let st = stats(&env);
    let reclaimable = st["overhead"]["duplicate_bytes"].as_u64().unwrap();
    assert!(reclaimable > 1 << 20, "{st}");
    env.ok(&["prune", "--max-unused", "0%"]);
    assert_eq!(stats(&env)["overhead"]["duplicate_bytes"], 0);
    env.check_clean();
}
