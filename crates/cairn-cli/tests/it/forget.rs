//! `cairn forget` end to end. Snapshot times here are real (seconds apart at most),
//! so calendar buckets are covered by the unit tests in cairn-core; these check the
//! command: selection, output, and that what remains is intact.

use crate::util::*;
use std::fs;
use std::path::Path;

fn backup_as(env: &Env, src: &Path, host: &str, tags: &[&str]) -> String {
    let mut a = vec!["backup", "--json", "--host", host];
    for t in tags {
        a.extend(["--tag", t]);
    }
    let src = src.to_str().unwrap();
    a.push(src);
    let v: serde_json::Value = serde_json::from_str(&env.ok(&a)).unwrap();
    v["snapshot_id"].as_str().unwrap().to_string()
}

fn forget_json(env: &Env, args: &[&str]) -> serde_json::Value {
    let mut a = vec!["forget", "--json"];
    a.extend_from_slice(args);
    serde_json::from_str(&env.ok(&a)).unwrap()
}

/// The ids of a `forget --json` list, oldest first (the JSON has them newest
/// first, as restic's).
fn ids(list: &serde_json::Value) -> Vec<String> {
    list.as_array()
        .unwrap()
        .iter()
        .rev()
        .map(|s| s["id"].as_str().unwrap().to_string())
        .collect()
}

/// Five snapshots: a1 a2 a3 on host a, b1 b2 on host b, each source a bit different.
fn setup(env: &Env) -> (std::path::PathBuf, Vec<String>) {
    env.init(&[]);
    let src = env.path("src");
    fs::create_dir_all(&src).unwrap();
    let mut ids = Vec::new();
    for (i, (host, tags)) in [
        ("a", vec!["t1"]),
        ("a", vec!["t2"]),
        ("a", vec!["t1", "t2"]),
        ("b", vec!["t1"]),
        ("b", vec![]),
    ]
    .into_iter()
    .enumerate()
    {
        fs::write(
            src.join(format!("file{i}")),
            format!("content {i}\n").repeat(100),
        )
        .unwrap();
        ids.push(backup_as(env, &src, host, &tags));
    }
    assert_eq!(env.snapshot_ids().len(), 5);
    (src, ids)
}

#[test]
fn forget_without_policy_or_ids_fails_and_removes_nothing() {
    let env = Env::new();
    let (_, all) = setup(&env);
    // A missing argument: exit 2, as for a usage error (QA r29: 1).
    let err = env.fails(&["forget"], 2);
    assert!(
        err.contains("no policy given: nothing would be removed"),
        "{err}"
    );
    let err = env.fails(&["forget", "--keep-last", "0"], 2);
    assert!(err.contains("no policy given"), "{err}");
    let err = env.fails(&["forget", "--keep-within", "1w"], 2);
    assert!(err.contains("invalid duration \"1w\""), "{err}");
    let err = env.fails(&["forget", "--keep-daily", "-3"], 2);
    assert!(err.contains("keep-daily -3"), "{err}");
    let err = env.fails(&["forget", "--group-by", "time", "--keep-last", "1"], 2);
    assert!(err.contains("cannot group by"), "{err}");
    // Ids and a policy together are refused before anything happens.
    let err = env.fails(&["forget", &all[0], "--keep-last", "1"], 1);
    assert!(err.contains("cannot be combined"), "{err}");
    // One unknown id among good ones removes nothing.
    let err = env.fails(&["forget", &all[0], "ffffffffffff"], 1);
    assert!(err.contains("no snapshot matches"), "{err}");
    // A keep-tag that matches nothing in a group would empty it: refused.
    let err = env.fails(&["forget", "--keep-tag", "nosuchtag"], 1);
    assert!(err.contains("refusing to remove them all"), "{err}");
    assert_eq!(env.snapshot_ids(), all);
}

#[test]
fn dry_run_removes_nothing() {
    let env = Env::new();
    let (_, all) = setup(&env);
    let out = env.ok(&["forget", "--keep-last", "1", "--dry-run"]);
    assert!(out.contains("would remove 2 snapshots:"), "{out}");
    assert!(out.contains("would remove 1 snapshot:"), "{out}");
    assert!(out.contains("keep 1 snapshot:"), "{out}");
    assert!(out.contains("last snapshot"), "{out}");
    assert!(out.contains("nothing was removed"), "{out}");
    let v = forget_json(&env, &["--keep-last", "1", "-n"]);
    assert_eq!(v.as_array().unwrap().len(), 2);
    env.ok(&["forget", &all[0], &all[1][..8], "--dry-run"]);
    assert_eq!(env.snapshot_ids(), all);
}

#[test]
fn keep_last_per_group_json_and_filters() {
    let env = Env::new();
    let (src, all) = setup(&env);
    let (a1, a2, a3, b1, b2) = (
        all[0].as_str(),
        all[1].as_str(),
        all[2].as_str(),
        all[3].as_str(),
        all[4].as_str(),
    );

    // Default grouping is host and paths: two groups.
    let v = forget_json(&env, &["--keep-last", "1", "--keep-tag", "t2", "--dry-run"]);
    let groups = v.as_array().unwrap();
    assert_eq!(groups.len(), 2);
    let ga = &groups[0];
    assert_eq!(ga["group"]["host"], "a");
    assert_eq!(ga["group"]["paths"][0], src.to_str().unwrap());
    assert!(ga["group"]["tags"].is_null());
    assert_eq!(ids(&ga["keep"]), [a2, a3]);
    assert_eq!(ids(&ga["remove"]), [a1]);
    // Newest first, as restic's.
    let keep = ga["keep"].as_array().unwrap();
    assert_eq!(keep[1]["reasons"], serde_json::json!(["has tags [t2]"]));
    assert_eq!(
        keep[0]["reasons"],
        serde_json::json!(["has tags [t2]", "last snapshot"])
    );
    assert_eq!(keep[0]["short_id"], &a3[..8]);
    assert_eq!(keep[0]["host"], "a");
    assert_eq!(keep[0]["tags"], serde_json::json!(["t1", "t2"]));
    assert!(keep[0]["time"].as_str().unwrap().ends_with('Z'));
    // restic's fields, beside cairn's: the group's host, paths and tags at the
    // top (null where the grouping leaves one out), the snapshot's `hostname`,
    // and a list of {snapshot, matches}.
    assert_eq!(ga["host"], "a");
    assert_eq!(ga["paths"], ga["group"]["paths"]);
    assert!(ga["tags"].is_null());
    assert_eq!(keep[0]["hostname"], "a");
    let reasons = ga["reasons"].as_array().unwrap();
    assert_eq!(reasons.len(), 2, "{ga}");
    assert_eq!(reasons[0]["snapshot"]["id"], a3);
    assert_eq!(
        reasons[0]["matches"],
        serde_json::json!(["has tags [t2]", "last snapshot"])
    );
    assert_eq!(groups[1]["group"]["host"], "b");
    assert_eq!(ids(&groups[1]["keep"]), [b2]);
    assert_eq!(ids(&groups[1]["remove"]), [b1]);

    // Filter by tag, one group for everything: of a1, a3 and b1 keep only b1.
    let v = forget_json(
        &env,
        &["--tag", "t1", "--group-by", "", "--keep-last", "1", "-n"],
    );
    assert_eq!(v.as_array().unwrap().len(), 1);
    assert!(v[0]["group"]["host"].is_null());
    assert_eq!(v[0]["host"], "");
    assert!(v[0]["paths"].is_null());
    assert_eq!(ids(&v[0]["keep"]), [b1]);
    assert_eq!(ids(&v[0]["remove"]), [a1, a3]);
    // Comma-separated tags must all be present.
    let v = forget_json(&env, &["--tag", "t1,t2", "--keep-last", "1", "-n"]);
    assert_eq!(ids(&v[0]["keep"]), [a3]);
    assert!(ids(&v[0]["remove"]).is_empty());

    // For real now: host a keeps its newest two; host b is not touched.
    let out = env.ok(&["forget", "--host", "a", "--keep-last", "2"]);
    assert!(out.contains("remove 1 snapshot:"), "{out}");
    assert!(out.contains(&a1[..8]), "{out}");
    assert!(out.contains("removed 1 snapshot\n"), "{out}");
    assert_eq!(env.snapshot_ids(), [a2, a3, b1, b2]);

    // Explicit ids, one by prefix; -q prints nothing.
    let out = env.ok(&["forget", "-q", &a2[..10], b1]);
    assert!(out.is_empty(), "{out}");
    assert_eq!(env.snapshot_ids(), [a3, b2]);

    // What remains still restores, and the repository is consistent.
    for (i, snap) in [a3, b2].into_iter().enumerate() {
        let restored = env.restore(snap, &src, &format!("out{i}"));
        let n = if snap == a3 { 3 } else { 5 };
        for f in 0..n {
            assert_eq!(
                fs::read(restored.join(format!("file{f}"))).unwrap(),
                fs::read(src.join(format!("file{f}"))).unwrap()
            );
        }
        assert!(!restored.join(format!("file{n}")).exists());
    }
    env.check_clean();
}

#[test]
fn prune_flag_prunes_after_forgetting() {
    let env = Env::new();
    setup(&env);
    let out = env.ok(&["forget", "--keep-last", "1", "--prune", "-n"]);
    assert!(out.contains("dry run"), "{out}");
    assert!(
        out.contains("2 snapshots need"),
        "planned without the 3: {out}"
    );
    let dry = env.ok(&["forget", "--keep-last", "1", "--prune", "-n", "--json"]);
    let dry: serde_json::Value =
        serde_json::from_str(&dry).unwrap_or_else(|e| panic!("{e}: {dry}"));
    // --json: one document, forget's groups and prune's report.
    let out = env.ok(&["forget", "--keep-last", "1", "--prune", "--json"]);
    let doc: serde_json::Value =
        serde_json::from_str(&out).unwrap_or_else(|e| panic!("{e}: {out}"));
    // The dry run's prune planned what the real one did (it planned as if nothing
    // were forgotten, freeing nothing), but for the index file in which the real
    // forget recorded what it removed.
    let (mut planned, mut done) = (dry["prune"]["plan"].clone(), doc["prune"]["plan"].clone());
    let replaced = |p: &mut serde_json::Value| p["index_files_replaced"].take().as_u64();
    assert_eq!(
        replaced(&mut planned).map(|n| n + 1),
        replaced(&mut done),
        "{dry}\n{doc}"
    );
    assert_eq!(planned, done, "{dry}\n{doc}");
    assert!(
        doc["prune"]["plan"]["reclaim_bytes"].as_u64() > Some(0),
        "{doc}"
    );
    let removed = |doc: &serde_json::Value| -> usize {
        doc["forget"]
            .as_array()
            .unwrap()
            .iter()
            .map(|g| g["remove"].as_array().map_or(0, |r| r.len()))
            .sum()
    };
    assert_eq!(removed(&doc), 3, "{doc}");
    assert!(doc["prune"]["plan"]["packs"].as_u64().is_some(), "{doc}");
    // Nothing left to remove: prune does not run, and says so with null.
    let out = env.ok(&["forget", "--keep-last", "1", "--prune", "--json"]);
    let doc: serde_json::Value =
        serde_json::from_str(&out).unwrap_or_else(|e| panic!("{e}: {out}"));
    assert_eq!(removed(&doc), 0, "{doc}");
    assert!(doc["prune"].is_null(), "{doc}");
    env.ok(&["check", "--read-data"]);
}

/// `backup --tag a,b` adds two tags, as restic does, so the filters and
/// `--keep-tag` (which split on commas) can select them; an empty tag or host is
/// refused before anything is read.
#[test]
fn comma_separated_tags_are_tags_that_keep_tag_keeps() {
    let env = Env::new();
    env.init(&[]);
    let src = env.path("src");
    std::fs::create_dir_all(&src).unwrap();
    std::fs::write(src.join("f"), b"x").unwrap();
    let s = src.to_str().unwrap();
    env.ok(&["backup", s, "--tag", "keep,monthly"]);
    std::fs::write(src.join("f"), b"y").unwrap();
    env.ok(&["backup", s]);
    let listed: serde_json::Value =
        serde_json::from_str(&env.ok(&["snapshots", "--tag", "monthly", "--json"])).unwrap();
    assert_eq!(listed[0]["tags"], serde_json::json!(["keep", "monthly"]));
    env.ok(&["forget", "--keep-tag", "keep", "--keep-last", "1"]);
    assert_eq!(
        env.snapshot_ids().len(),
        2,
        "the tagged snapshot was removed"
    );
    for bad in [&["--tag", ""][..], &["--tag", "a,,b"], &["--host", " "]] {
        let mut args = vec!["backup", s];
        args.extend_from_slice(bad);
        let err = env.fails(&args, 2);
        assert!(err.contains("an empty"), "{bad:?}: {err}");
    }
}

/// `cairn recover` (restic's): a snapshot forgotten by mistake, before any prune,
/// comes back as a snapshot tagged "recovered" holding its tree under
/// `/recover/<tree id>`, restoring exactly what was backed up; a second run finds
/// nothing new, and after a prune there is nothing to find.
#[test]
fn recover_brings_back_a_snapshot_forgotten_by_mistake() {
    let env = Env::new();
    env.init(&[]);
    let src = env.path("src");
    fs::create_dir_all(src.join("d")).unwrap();
    fs::write(src.join("d/first"), b"only in the first backup").unwrap();
    let first = env.backup(&[&src]);
    let before = env.path("before");
    copy_tree(&src, &before);
    fs::remove_file(src.join("d/first")).unwrap();
    fs::write(src.join("second"), b"later").unwrap();
    env.backup(&[&src]);
    let v: serde_json::Value = serde_json::from_str(&env.ok(&["recover", "--json"])).unwrap();
    assert_eq!(v["roots"].as_array().unwrap().len(), 0, "{v}");
    assert!(v["snapshot"].is_null(), "{v}");

    env.ok(&["forget", &first]);
    let dry = env.ok(&["recover", "--dry-run"]);
    assert!(dry.contains("would save"), "{dry}");
    assert_eq!(env.snapshot_ids().len(), 1);
    // A dry run takes a shared lock, so it runs beside a backup; it names the
    // backup, whose unsaved trees it would count as roots.
    let mut job = env
        .cmd(&["backup", "--stdin"])
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .spawn()
        .unwrap();
    wait_until(
        "the backup's lock",
        std::time::Duration::from_secs(60),
        || fs::read_dir(env.repo.join("locks")).is_ok_and(|d| d.count() == 1),
    );
    let o = env.run(&["recover", "--dry-run"]);
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(o.status.success(), "{err}");
    assert!(err.contains("running now: backup lock"), "{err}");
    drop(job.stdin.take());
    assert!(job.wait().unwrap().success());
    let v: serde_json::Value = serde_json::from_str(&env.ok(&["recover", "--json"])).unwrap();
    let roots = v["roots"].as_array().unwrap();
    assert_eq!(roots.len(), 1, "{v}");
    let id = v["snapshot"].as_str().unwrap().to_string();
    let listed = env.ok(&["snapshots", "--tag", "recovered", "--json"]);
    assert!(listed.contains(&id), "{listed}");
    let out = env.path("out");
    env.ok(&["restore", &id, "--target", out.to_str().unwrap()]);
    let root = roots[0].as_str().unwrap();
    let got = out
        .join("recover")
        .join(root)
        .join(src.strip_prefix("/").unwrap());
    assert_same(&before, &got);
    env.check_clean();
    let v: serde_json::Value = serde_json::from_str(&env.ok(&["recover", "--json"])).unwrap();
    assert_eq!(v["roots"].as_array().unwrap().len(), 0, "{v}");

    // Forgotten again and pruned: gone for good.
    env.ok(&["forget", &id]);
    env.ok(&["prune"]);
    let v: serde_json::Value = serde_json::from_str(&env.ok(&["recover", "--json"])).unwrap();
    assert_eq!(v["roots"].as_array().unwrap().len(), 0, "{v}");
    env.check_clean();

    // A forgotten snapshot whose data pack is gone: saved, and said to be damaged.
    let before = packs(&env.repo);
    fs::write(src.join("big"), Rng(77).bytes(3 << 20, false)).unwrap();
    let lost = env.backup(&[&src]);
    env.ok(&["forget", &lost]);
    let (pack, _) = packs(&env.repo)
        .into_iter()
        .filter(|(p, _)| !before.contains_key(p))
        .max_by_key(|(_, n)| *n)
        .unwrap();
    fs::remove_file(&pack).unwrap();
    // As a prune leaves it: the index no longer lists what was in the pack.
    env.ok(&["repair", "index"]);
    let o = env.run(&["recover", "--json"]);
    let err = String::from_utf8_lossy(&o.stderr);
    assert_eq!(o.status.code(), Some(3), "{err}");
    let v: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
    assert_eq!(v["damaged_roots"].as_array().unwrap().len(), 1, "{v}");
    assert!(v["snapshot"].is_string(), "{v}");
    // Saved without what is gone (QA: with it, check failed and prune refused
    // to run until `repair snapshots`): the rest restores, and prune runs.
    let saved = v["snapshot"].as_str().unwrap();
    env.check_clean();
    // The damaged tree itself stays unreferenced (its rewritten copy was
    // saved): the next recover leaves it to the snapshot that holds it (QA: it
    // saved it again at every run).
    let o = env.run(&["recover", "--json"]);
    assert_eq!(o.status.code(), Some(0), "{o:?}");
    let again: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
    assert_eq!(again["roots"].as_array().unwrap().len(), 0, "{again}");
    assert_eq!(again["recovered_before"], v["roots"], "{again}");
    assert!(again["snapshot"].is_null(), "{again}");
    assert!(
        env.ok(&["recover"])
            .contains("1 more tree saved by an earlier recover"),
        "text"
    );
    // That snapshot forgotten, its root comes back alone: the tree it saved
    // rewritten comes back inside it, not beside it as well (QA: saved twice,
    // one copy nested in the other).
    env.ok(&["forget", saved]);
    let o = env.run(&["recover", "--json"]);
    assert_eq!(o.status.code(), Some(0), "{o:?}");
    let v: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
    assert_eq!(v["roots"].as_array().unwrap().len(), 1, "{v}");
    assert_ne!(v["roots"], again["recovered_before"], "{v}");
    let saved = v["snapshot"].as_str().unwrap();
    env.ok(&["prune"]);
    env.check_clean();
    let back = env.path("recovered");
    env.ok(&["restore", saved, "--target", back.to_str().unwrap()]);
    assert!(!walk(&back).is_empty());
}

/// Calendar buckets are the snapshot's own: taken at +05:30 at 23:00 on the
/// 29th, 04:00 and 12:00 on the 30th, `--keep-daily 2` removes the 04:00 one
/// whatever the time zone `forget` runs in (QA: at UTC it removed the 29th's
/// only snapshot, so a dry run in the shell and the cron job disagreed).
#[test]
fn retention_counts_days_where_each_snapshot_was_taken() {
    let env = Env::new();
    let made = backed_up_at(
        &env,
        "IST-5:30",
        &[
            "2026-11-29 23:00:00",
            "2026-11-30 04:00:00",
            "2026-11-30 12:00:00",
        ],
    );
    for tz in ["UTC0", "IST-5:30", "NST3:30", "LINT-14"] {
        let v = forget_in(&env, tz, &["--keep-daily", "2"]);
        assert_eq!(ids(&v[0]["remove"]), [made[1].clone()], "TZ={tz}: {v}");
    }
}

/// One snapshot of a one-file tree per time of `times`, taken in the time zone
/// `tz` (a POSIX TZ string); their ids.
fn backed_up_at(env: &Env, tz: &str, times: &[&str]) -> Vec<String> {
    env.init(&[]);
    let src = env.path("src");
    fs::create_dir_all(&src).unwrap();
    fs::write(src.join("f"), b"x").unwrap();
    let mut made = Vec::new();
    for t in times {
        let o = env
            .cmd(&["backup", "--json", "--time", t, src.to_str().unwrap()])
            .env("TZ", tz)
            .output()
            .unwrap();
        assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
        let v: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
        made.push(v["snapshot_id"].as_str().unwrap().to_string());
    }
    made
}

/// `forget --json --dry-run` with `policy`, run in the time zone `tz`.
fn forget_in(env: &Env, tz: &str, policy: &[&str]) -> serde_json::Value {
    let mut args = vec!["forget", "--json", "--dry-run"];
    args.extend_from_slice(policy);
    let o = env.cmd(&args).env("TZ", tz).output().unwrap();
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    serde_json::from_slice(&o.stdout).unwrap()
}

/// `--keep-within` steps days back on the newest snapshot's own calendar, not the
/// one of the zone `forget` runs in: taken at UTC, 2024-03-02 13:00 is within 29
/// days of 2024-03-31 12:00, also for a runner in New York, whose clocks went
/// forward in between (QA: it was dropped there, and kept at UTC).
#[test]
fn keep_within_counts_on_the_snapshots_own_calendar() {
    let env = Env::new();
    backed_up_at(
        &env,
        "UTC0",
        &["2024-03-02 13:00:00", "2024-03-31 12:00:00"],
    );
    for tz in ["UTC0", "EST5EDT,M3.2.0,M11.1.0"] {
        let v = forget_in(&env, tz, &["--keep-within", "29d"]);
        assert!(ids(&v[0]["remove"]).is_empty(), "TZ={tz}: {v}");
    }
}

/// `--keep-within-daily` keeps the newest snapshot of each day within the span,
/// however many days; its span is checked before the password is asked for.
#[test]
fn keep_within_daily_keeps_a_day_each_inside_the_span() {
    let env = Env::new();
    let made = backed_up_at(
        &env,
        "UTC0",
        &[
            "2024-05-01 08:00:00",
            "2024-05-03 08:00:00",
            "2024-05-03 20:00:00",
            "2024-05-04 09:00:00",
            "2024-05-04 21:00:00",
        ],
    );
    let v = forget_in(&env, "UTC0", &["--keep-within-daily", "2d"]);
    let mut keep = ids(&v[0]["keep"]);
    keep.sort();
    let mut want = vec![made[2].clone(), made[4].clone()];
    want.sort();
    assert_eq!(keep, want, "{v}");
    assert_eq!(v[0]["keep"][0]["reasons"][0], "daily within 2d", "{v}");
    let err = env.fails(&["forget", "--keep-within-weekly", "2w"], 2);
    assert!(
        err.contains("--keep-within-weekly") && err.contains("7d"),
        "{err}"
    );
}

/// With `--json`, every line forget writes on standard error is a JSON object,
/// warnings included (QA: a snapshot dated in the future was warned about in
/// plain text among the JSON events); without it, the warning reads as text.
#[test]
fn forget_json_warnings_are_json_lines() {
    let env = Env::new();
    env.init(&[]);
    let src = env.path("src");
    fs::create_dir_all(&src).unwrap();
    fs::write(src.join("f"), b"x").unwrap();
    env.ok(&[
        "backup",
        "--time",
        "2099-01-01 00:00:00",
        src.to_str().unwrap(),
    ]);
    env.ok(&["backup", src.to_str().unwrap()]);
    let o = env.run(&["forget", "--json", "--keep-last", "1", "--dry-run"]);
    assert!(o.status.success(), "{o:?}");
    let err = String::from_utf8_lossy(&o.stderr);
    let mut warned = false;
    for line in err.lines() {
        let v: serde_json::Value = serde_json::from_str(line)
            .unwrap_or_else(|e| panic!("not JSON ({e}): {line:?}\n{err}"));
        warned |=
            v["type"] == "warning" && v["message"].as_str().unwrap().contains("in the future");
    }
    assert!(warned, "{err}");
    let o = env.run(&["forget", "--keep-last", "1", "--dry-run"]);
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(
        err.contains("warning: snapshot ") && err.contains("in the future"),
        "{err}"
    );
}

/// Two directories whose names differ only in bytes that are not UTF-8 are two
/// backup sets (QA r15: both were recorded as `proj\u{fffd}`, and `forget
/// --keep-last 1` deleted the only snapshot of one): the snapshot records each
/// byte, text shows it as `\xe9`, and `--path` takes the raw name.
#[test]
fn paths_that_differ_only_in_bytes_that_are_not_utf8_stay_apart() {
    use std::os::unix::ffi::OsStrExt;
    let env = Env::new();
    env.init(&[]);
    let base = env.path("src");
    let e9 = base.join(std::ffi::OsStr::from_bytes(b"proj\xe9"));
    let e8 = base.join(std::ffi::OsStr::from_bytes(b"proj\xe8"));
    for (d, content) in [(&e9, "A"), (&e8, "B")] {
        fs::create_dir_all(d).unwrap();
        fs::write(d.join("f"), content).unwrap();
        let o = env.cmd(&["backup", "-q"]).arg(d).output().unwrap();
        assert!(o.status.success(), "{o:?}");
    }
    let list = env.ok(&["snapshots"]);
    assert!(
        list.contains("proj\\xe9") && list.contains("proj\\xe8"),
        "{list}"
    );
    let v: serde_json::Value = serde_json::from_str(&env.ok(&["snapshots", "--json"])).unwrap();
    let paths: Vec<&str> = (v.as_array().unwrap().iter())
        .map(|s| s["paths"][0].as_str().unwrap())
        .collect();
    assert_ne!(paths[0], paths[1]);
    assert!(paths.iter().all(|p| !p.contains('\u{fffd}')), "{paths:?}");
    // Two groups: each keeps its one snapshot.
    env.ok(&["forget", "--keep-last", "1"]);
    assert_eq!(env.snapshot_ids().len(), 2);
    // `--path` with the raw name picks that one.
    let o = env
        .cmd(&["snapshots", "--json", "--path"])
        .arg(&e9)
        .output()
        .unwrap();
    assert!(o.status.success(), "{o:?}");
    let v: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
    assert_eq!(v.as_array().unwrap().len(), 1, "{v}");
    // A restore with --delete knows each directory was backed up whole.
    let out = env.path("out");
    let o = env
        .cmd(&[
            "restore",
            "latest",
            "--delete",
            "-t",
            out.to_str().unwrap(),
            "--path",
        ])
        .arg(&e9)
        .output()
        .unwrap();
    assert!(o.status.success(), "{o:?}");
    let back = out.join(e9.strip_prefix("/").unwrap());
    assert_eq!(fs::read(back.join("f")).unwrap(), b"A");
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(!err.contains("--delete removes nothing"), "{err}");
    env.check_clean();
}
