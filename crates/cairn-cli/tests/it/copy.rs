//! `cairn copy`: snapshots move between repositories of different block sizes and
//! keys, exactly; only what the destination lacks is sent; a second copy does
//! nothing; an interrupted copy resumes without sending again what arrived.

use crate::util::*;
use std::fs;

fn copy_cmd(src: &Env, dst: &Env, extra: &[&str]) -> std::process::Command {
    let mut c = dst.cmd(&["copy", "--json", "--from", &src.location]);
    c.args(extra);
    c.env("CAIRN_FROM_PASSWORD", PASSWORD);
    // Every copy here tracks what it stored partly on local disk (past 256
    // ids), the path a copy of millions of chunks takes.
    c.env("CAIRN_TEST_CLAIMS_CAP", "256");
    c
}

fn copy(src: &Env, dst: &Env, extra: &[&str]) -> serde_json::Value {
    let o = copy_cmd(src, dst, extra).output().unwrap();
    assert!(
        o.status.success(),
        "copy failed: {}",
        String::from_utf8_lossy(&o.stderr)
    );
    serde_json::from_slice(&o.stdout).unwrap()
}

/// Three days of backups: a tree with every kind of entry, then a changed file,
/// a new directory and a large file edited in its middle.
fn history(env: &Env) -> (std::path::PathBuf, Vec<std::path::PathBuf>) {
    let src = env.path("src");
    make_full_tree(&src, 31);
    let big = Rng(77).bytes(5 << 20, true);
    fs::write(src.join("image.bin"), &big).unwrap();
    let mut days = Vec::new();
    for day in 0..3 {
        if day == 1 {
            fs::write(src.join("small.txt"), b"day two").unwrap();
            fs::create_dir_all(src.join("new/deeper")).unwrap();
            fs::write(src.join("new/deeper/f"), Rng(5).bytes(100_000, false)).unwrap();
        }
        if day == 2 {
            let mut b = big.clone();
            b[2 << 20..(2 << 20) + 5000].fill(0xee);
            fs::write(src.join("image.bin"), &b).unwrap();
        }
        env.backup(&[&src]);
        let keep = env.path(&format!("day{day}"));
        copy_tree(&src, &keep);
        days.push(keep);
    }
    (src, days)
}

#[test]
fn copies_rechunk_into_another_block_size_exactly_once() {
    let r1 = Env::new();
    r1.init(&[]);
    let (src, days) = history(&r1);
    let r2 = Env::new();
    r2.init(&["--block-size", "64K", "--compression", "max"]);

    // Day one alone, then everything: the second run sends only the later days'
    // new data, and re-chunks only the files that changed.
    let ids = r1.snapshot_ids();
    let first = copy(&r1, &r2, &[&ids[0]]);
    assert_eq!(first["snapshots_copied"], 1);
    assert_eq!(first["same_chunking"], false);
    // `--threads` (the global option) sizes the re-chunking (it panicked here).
    let rest = copy(&r1, &r2, &["--threads", "2"]);
    assert_eq!(rest["snapshots_copied"], 2, "{rest}");
    // Each copy says where it came from.
    let listed: serde_json::Value = serde_json::from_str(&r2.ok(&["snapshots", "--json"])).unwrap();
    let from: Vec<&str> = listed
        .as_array()
        .unwrap()
        .iter()
        .map(|s| s["copied_from"]["snapshot"].as_str().unwrap())
        .collect();
    assert_eq!(from.len(), 3);
    for id in &ids {
        assert!(
            from.contains(&id.as_str()) || from.iter().any(|f| f.starts_with(id.as_str())),
            "{listed}"
        );
    }
    let sent_first = first["bytes_sent"].as_u64().unwrap();
    let sent_rest = rest["bytes_sent"].as_u64().unwrap();
    assert!(
        sent_rest * 4 < sent_first,
        "two later days sent {sent_rest} bytes, the first {sent_first}"
    );
    let files = first["files_rechunked"].as_u64().unwrap();
    let again = rest["files_rechunked"].as_u64().unwrap();
    assert!(
        again <= 4,
        "re-chunked {again} files of {files} on later days"
    );

    // Every copied snapshot restores exactly as its day was.
    let copied = r2.snapshot_ids();
    assert_eq!(copied.len(), 3);
    for (day, id) in copied.iter().enumerate() {
        let out = r2.restore(id, &src, &format!("r{day}"));
        assert_same(&days[day], &out);
    }
    r2.check_clean();

    // Copying again is a no-op.
    let noop = copy(&r1, &r2, &[]);
    assert_eq!(noop["snapshots_copied"], 0);
    assert_eq!(noop["blobs_added"], 0);
    let read = noop["bytes_received"].as_u64().unwrap();
    assert!(read < 64 << 10, "a no-op copy read {read} bytes (indexes?)");
    assert_eq!(r2.snapshot_ids().len(), 3);

    // Copying back (replication both ways): the copies are r1's own snapshots,
    // already there; only r2's own new snapshot comes over.
    let extra = r2.path("extra");
    fs::create_dir_all(&extra).unwrap();
    fs::write(extra.join("f"), b"only in r2").unwrap();
    r2.backup(&[&extra]);
    let back = copy(&r2, &r1, &[]);
    assert_eq!(back["snapshots_copied"], 1, "{back}");
    assert_eq!(r1.snapshot_ids().len(), 4);
}

/// A copy killed part-way (here: storage refusing writes after a few) resumes
/// without sending again the packs that arrived, and ends exact.
#[test]
fn an_interrupted_copy_resumes() {
    let r1 = Env::new();
    r1.init(&[]);
    let src = r1.path("src");
    fs::create_dir_all(&src).unwrap();
    for i in 0..5 {
        fs::write(
            src.join(format!("f{i}")),
            Rng(100 + i).bytes(8 << 20, false),
        )
        .unwrap();
    }
    r1.backup(&[&src]);

    // The whole copy into a fresh repository, for comparison.
    let clean = Env::new();
    clean.init(&["--block-size", "4K"]);
    let full = copy(&r1, &clean, &[])["bytes_sent"].as_u64().unwrap();

    let r2 = Env::new();
    r2.init(&["--block-size", "4K"]);
    let o = copy_cmd(&r1, &r2, &[])
        .env("CAIRN_FAULTS", "fail=1,kind=permanent,ops=put,after=6")
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&o.stderr);
    assert_eq!(o.status.code(), Some(1), "{err}");
    assert!(
        err.contains("injected fault") && !err.contains("panicked"),
        "{err}"
    );
    assert!(r2.snapshot_ids().is_empty());
    r2.check_clean();

    let resumed = copy(&r1, &r2, &[]);
    let sent = resumed["bytes_sent"].as_u64().unwrap();
    assert_eq!(resumed["snapshots_copied"], 1);
    assert!(
        sent * 10 < full * 7,
        "resumed copy sent {sent} bytes of {full}: what arrived was sent again"
    );
    let id = &r2.snapshot_ids()[0];
    assert_same(&src, &r2.restore(id, &src, "r"));
    r2.check_clean();
}

#[test]
fn copy_between_local_and_s3() {
    let r1 = Env::new();
    r1.init(&[]);
    let (src, days) = history(&r1);
    let s3 = Env::s3("copy");
    s3.init(&["--block-size", "64K"]);
    let up = copy(&r1, &s3, &[]);
    assert_eq!(up["snapshots_copied"], 3);
    s3.check_clean();
    // And back down into a third repository, from S3.
    let r3 = Env::new();
    r3.init(&["--block-size", "8K", "--no-encryption"]);
    let down = copy(&s3, &r3, &[]);
    assert_eq!(down["snapshots_copied"], 3);
    let ids = r3.snapshot_ids();
    assert_same(&days[2], &r3.restore(&ids[2], &src, "r"));
    r3.check_clean();
}

/// A mirror made with `cp -a` keeps the repository's id; copy brings it what it
/// lacks (as restic's copy does for an rsync'd mirror), once, and copying back
/// finds nothing to do. The one directory under another spelling is refused.
#[test]
fn copy_keeps_a_cp_a_mirror_up_to_date() {
    let r1 = Env::new();
    r1.init(&[]);
    let src = r1.path("src");
    make_full_tree(&src, 11);
    r1.backup(&[&src]);
    let m = Env::new();
    copy_tree(&r1.repo, &m.repo);
    assert_eq!(copy(&r1, &m, &[])["snapshots_copied"], 0);
    fs::write(src.join("day-two"), b"written after the mirror was made").unwrap();
    r1.backup(&[&src]);
    assert_eq!(copy(&r1, &m, &[])["snapshots_copied"], 1);
    assert_eq!(copy(&r1, &m, &[])["snapshots_copied"], 0);
    assert_eq!(m.snapshot_ids().len(), 2);
    assert_same(&src, &m.restore("latest", &src, "out"));
    m.check_clean();
    assert_eq!(copy(&m, &r1, &[])["snapshots_copied"], 0);
    let other_spelling = format!("{}/../repo/", r1.repo.display());
    let o = r1
        .cmd(&["copy", "--from", &other_spelling])
        .env("CAIRN_FROM_PASSWORD", PASSWORD)
        .output()
        .unwrap();
    assert_eq!(o.status.code(), Some(1));
    assert!(String::from_utf8_lossy(&o.stderr).contains("same repository"));
}

#[test]
fn copy_refuses_bad_input() {
    let r1 = Env::new();
    r1.init(&[]);
    let src = r1.path("src");
    make_full_tree(&src, 3);
    r1.backup(&[&src]);
    // Into itself.
    let o = copy_cmd(&r1, &r1, &[]).output().unwrap();
    assert_eq!(o.status.code(), Some(1));
    assert!(String::from_utf8_lossy(&o.stderr).contains("same repository"));
    // A wrong source password; a missing source; an unknown snapshot.
    let r2 = Env::new();
    r2.init(&[]);
    let o = copy_cmd(&r1, &r2, &[])
        .env("CAIRN_FROM_PASSWORD", "wrong")
        .output()
        .unwrap();
    assert_eq!(
        o.status.code(),
        Some(12),
        "{}",
        String::from_utf8_lossy(&o.stderr)
    );
    let mut c = r2.cmd(&["copy", "--from", "/nonexistent/repo"]);
    c.env("CAIRN_FROM_PASSWORD", PASSWORD);
    assert_eq!(c.output().unwrap().status.code(), Some(10));
    // restic's spelling of the flag is the same flag.
    let mut c = r2.cmd(&["copy", "--from-repo", "/nonexistent/repo"]);
    c.env("CAIRN_FROM_PASSWORD", PASSWORD);
    let o = c.output().unwrap();
    assert_eq!(o.status.code(), Some(10), "{o:?}");
    assert!(
        String::from_utf8_lossy(&o.stderr).contains("/nonexistent/repo"),
        "{o:?}"
    );
    let o = copy_cmd(&r1, &r2, &["ffffffff"]).output().unwrap();
    assert_eq!(o.status.code(), Some(1));
    // A filter that matches nothing (a mistyped host): said, not a quiet success.
    let o = copy_cmd(&r1, &r2, &["--host", "no-such-host"])
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(
        err.contains("no snapshot of the source matches the filters"),
        "{err}"
    );
    assert!(r2.snapshot_ids().is_empty());
}

/// A repository made with `init --copy-key-from` gives the same data the same ids:
/// copy then moves blobs as they are (no re-chunking), reading from the source only
/// what the destination lacks.
#[test]
fn repositories_sharing_a_key_copy_blob_by_blob() {
    let r1 = Env::new();
    r1.init(&["--block-size", "8K"]);
    let (src, days) = history(&r1);
    let r2 = Env::new();
    // Another block size beside the source's key is refused, not ignored.
    let o = r2
        .cmd(&[
            "init",
            "--block-size",
            "64K",
            "--copy-key-from",
            &r1.location,
        ])
        .env("CAIRN_FROM_PASSWORD", PASSWORD)
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(!o.status.success(), "{err}");
    assert!(
        err.contains("takes the source's block size (8 KiB)"),
        "{err}"
    );
    let o = r2
        .cmd(&[
            "init",
            "--json",
            "--compression",
            "max",
            "--block-size",
            "8K",
            "--copy-key-from",
            &r1.location,
        ])
        .env("CAIRN_FROM_PASSWORD", PASSWORD)
        .output()
        .unwrap();
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let made: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
    assert_eq!(made["block_size"], 8192, "the source's chunking is kept");

    let ids = r1.snapshot_ids();
    let first = copy(&r1, &r2, &[&ids[0], &ids[1]]);
    assert_eq!(first["same_chunking"], true);
    assert_eq!(first["files_rechunked"], 0);
    let last = copy(&r1, &r2, &[]);
    assert_eq!(last["snapshots_copied"], 1);
    let read = last["bytes_read_from_source"].as_u64().unwrap();
    assert!(
        read < 1 << 20,
        "day three read {read} bytes from the source"
    );
    let copied = r2.snapshot_ids();
    for (day, id) in copied.iter().enumerate() {
        assert_same(&days[day], &r2.restore(id, &src, &format!("r{day}")));
    }
    r2.check_clean();

    // An unencrypted repository's key is not put behind a password.
    let plain = Env::new();
    plain.init(&["--no-encryption"]);
    let r3 = Env::new();
    let o = r3
        .cmd(&["init", "--copy-key-from", &plain.location])
        .output()
        .unwrap();
    assert_eq!(o.status.code(), Some(1));
    assert!(String::from_utf8_lossy(&o.stderr).contains("not encrypted"));
    // Nor an encrypted repository's key put in plain text.
    let r4 = Env::new();
    let o = r4
        .cmd(&["init", "--no-encryption", "--copy-key-from", &r1.location])
        .env("CAIRN_FROM_PASSWORD", PASSWORD)
        .output()
        .unwrap();
    assert_eq!(o.status.code(), Some(1));
    assert!(String::from_utf8_lossy(&o.stderr).contains("is encrypted"));
    assert!(!r4.repo.join("config").exists());
}

/// A killed copy leaves a partial record at the end of the file map: the next run
/// cuts it off before appending, so what later runs learn is kept.
#[test]
fn the_file_map_survives_a_damaged_tail() {
    let r1 = Env::new();
    r1.init(&[]);
    let (_src, _days) = history(&r1);
    let ids = r1.snapshot_ids();
    let r2 = Env::new();
    r2.init(&["--block-size", "32K"]);
    copy(&r1, &r2, &[&ids[0]]);
    let dir = r2.dir.path().join("cache/cairn/copy");
    let map = fs::read_dir(&dir).unwrap().next().unwrap().unwrap().path();
    let mut raw = fs::read(&map).unwrap();
    raw.extend_from_slice(&[0x55; 37]); // a partial record
    fs::write(&map, &raw).unwrap();
    // Day two re-chunks its two changed files and records them after the cut.
    let day2 = copy(&r1, &r2, &[&ids[1]]);
    assert_eq!(day2["files_rechunked"], 2, "{day2}");
    // Day three finds them: only the image edited that day is read again.
    let day3 = copy(&r1, &r2, &[&ids[2]]);
    assert_eq!(day3["files_rechunked"], 1, "{day3}");
    r2.check_clean();
}

/// The file map's records of an earlier run are read back from its file as files
/// come up, and one naming blobs the destination no longer has (its snapshot
/// forgotten and pruned there) is not used: the files are read and cut again,
/// and the copy restores exactly.
#[test]
fn file_map_records_whose_blobs_are_gone_are_not_used() {
    let r1 = Env::new();
    r1.init(&[]);
    let (src, days) = history(&r1);
    let ids = r1.snapshot_ids();
    let r2 = Env::new();
    r2.init(&["--block-size", "32K"]);
    let first = copy(&r1, &r2, &[&ids[0]]);
    let files = first["files_rechunked"].as_u64().unwrap();
    assert!(files > 3, "{first}");
    let copied = r2.snapshot_ids();
    r2.ok(&["forget", &copied[0]]);
    r2.ok(&["prune"]);
    let again = copy(&r1, &r2, &[&ids[0]]);
    // Every blob stored again (how many files are cut depends on which of two
    // files of one content gets there first).
    assert_eq!(again["blobs_added"], first["blobs_added"], "{again}");
    assert!(
        again["files_rechunked"].as_u64().unwrap() + 2 > files,
        "{again}"
    );
    let id = &r2.snapshot_ids()[0];
    let out = r2.restore(id, &src, "r");
    assert_same(&days[0], &out);
    r2.check_clean();
}

/// A snapshot whose data is lost in the source is skipped with a warning (exit 3);
/// the others are copied, and the next run does not copy them twice.
#[test]
fn a_damaged_source_snapshot_does_not_block_the_others() {
    // The second snapshot's new data pack is lost, or cut short (which stopped the
    // whole copy: "range beyond end of object").
    for truncate in [false, true] {
        let r1 = Env::new();
        r1.init(&[]);
        let src = r1.path("src");
        make_full_tree(&src, 51);
        let first = r1.backup(&[&src]);
        let keep = r1.path("keep");
        copy_tree(&src, &keep);
        let before = packs(&r1.repo);
        fs::write(src.join("only-in-second.bin"), Rng(6).bytes(3 << 20, false)).unwrap();
        r1.backup(&[&src]);
        let (damaged, size) = packs(&r1.repo)
            .into_iter()
            .filter(|(p, _)| !before.contains_key(p))
            .max_by_key(|(_, n)| *n)
            .unwrap();
        if truncate {
            fs::OpenOptions::new()
                .write(true)
                .open(&damaged)
                .unwrap()
                .set_len(size / 3)
                .unwrap();
        } else {
            fs::remove_file(&damaged).unwrap();
        }

        let r2 = Env::new();
        r2.init(&["--block-size", "64K"]);
        let o = copy_cmd(&r1, &r2, &[]).output().unwrap();
        let err = String::from_utf8_lossy(&o.stderr);
        assert_eq!(o.status.code(), Some(3), "truncated {truncate}: {err}");
        assert!(err.contains("not copied"), "{err}");
        // With what to do about it (QA: nothing said).
        assert!(
            err.contains("`cairn repair snapshots` there takes them out"),
            "{err}"
        );
        let v: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
        assert_eq!(v["snapshots_copied"], 1);
        assert_eq!(v["failed"].as_array().unwrap().len(), 1);
        let ids = r2.snapshot_ids();
        assert_eq!(ids.len(), 1);
        assert_same(&keep, &r2.restore(&ids[0], &src, "r"));
        r2.check_clean();
        // Copying the first again by id is a no-op.
        let again = copy(&r1, &r2, &[&first]);
        assert_eq!(again["snapshots_copied"], 0);
    }
}

/// A copy keeps `--memory-limit` with both indexes open at once: the destination
/// plans within what the source's index leaves, and packs and re-chunking
/// threads are sized from it (before, 96 MiB went over by 15: five packs of
/// 16 MiB on their way whatever the limit).
#[test]
fn a_copy_keeps_its_memory_limit() {
    let r1 = Env::new();
    r1.init(&[]);
    let src = r1.path("src");
    fs::create_dir_all(&src).unwrap();
    for i in 0..4 {
        fs::write(
            src.join(format!("f{i}")),
            Rng(400 + i).bytes(28 << 20, false),
        )
        .unwrap();
    }
    r1.ok(&["backup", src.to_str().unwrap()]);
    let r2 = Env::new();
    r2.init(&["--block-size", "64K"]);
    let o = copy_cmd(&r1, &r2, &["--memory-limit", "96M"])
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(o.status.success(), "{err}");
    assert!(err.contains("within the limit of 96.0 MiB"), "{err}");
    let r: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
    assert_eq!(r["snapshots_copied"], 1, "{r}");
    let peak = r["resources"]["peak_rss_bytes"].as_u64().unwrap();
    assert!(peak <= 96 << 20, "peak {} MiB: {r}", peak >> 20);
    r2.check_clean();
}

/// A destination that fills up: the copy says so (not "interrupted"), and the
/// destination checks clean.
#[test]
fn a_full_destination_is_named_as_the_cause() {
    let src = Env::new();
    src.init(&[]);
    // A small snapshot first: it is copied whole before the disk fills.
    let small = src.path("small-dir");
    fs::create_dir_all(&small).unwrap();
    fs::write(small.join("f"), b"small").unwrap();
    let first = src.backup(&[&small]);
    let data = src.path("data");
    fs::create_dir_all(&data).unwrap();
    fs::write(data.join("big"), Rng(8).bytes(12 << 20, false)).unwrap();
    src.backup(&[&data]);
    let holder = Env::new();
    let mnt = holder.path("small");
    let _fs = Tmpfs::mount(&mnt, "size=6m");
    let dst = Env::at(tempfile::tempdir().unwrap(), mnt.join("repo"));
    dst.init(&[]);
    let out = copy_cmd(&src, &dst, &[]).output().unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success());
    assert!(err.contains("no space left"), "{err}");
    assert!(!err.contains("interrupted"), "{err}");
    // What was copied whole before was said when it was, though no report is
    // printed.
    let copied = dst.snapshot_ids();
    assert_eq!(copied.len(), 1, "{err}");
    assert!(
        err.contains(&format!(
            r#"{{"type":"snapshot_copied","source":"{first}","target":"{}"}}"#,
            copied[0]
        )),
        "{err}"
    );
    // Quite full (not even a lock fits): said as that, not as a memory limit
    // (QA: "the destination's index beside the source's (about 0 B of the
    // limit): put locks/...: no space left").
    {
        let mut filler = fs::File::create(mnt.join("filler")).unwrap();
        let block = vec![0u8; 4096];
        while std::io::Write::write_all(&mut filler, &block).is_ok() {}
    }
    let out = copy_cmd(&src, &dst, &[]).output().unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success());
    assert!(
        err.contains("no space left") && !err.contains("of the limit"),
        "{err}"
    );
}

/// Each snapshot copied is said when it is committed, on standard output (text)
/// or as an event (`--json`, even with `-q`): a copy killed later has told which
/// snapshots arrived whole (before, they were listed only at the end).
#[test]
fn a_killed_copy_has_said_what_it_copied() {
    let src = Env::new();
    src.init(&[]);
    let data = src.path("data");
    fs::create_dir_all(&data).unwrap();
    for i in 0..3u64 {
        fs::write(
            data.join(format!("f{i}")),
            Rng(30 + i).bytes(100_000, false),
        )
        .unwrap();
        src.backup(&[&data]);
    }
    let source = src.snapshot_ids();
    for (json, second) in [(false, 2), (true, 1)] {
        let dst = Env::new();
        dst.init(&[]);
        let mut c = if json {
            copy_cmd(&src, &dst, &["-q"])
        } else {
            let mut c = dst.cmd(&["copy", "--from", &src.location]);
            c.env("CAIRN_FROM_PASSWORD", PASSWORD);
            c
        };
        c.env(
            "CAIRN_TEST_KILL_AT",
            format!("copy:snapshot-committed:{second}"),
        );
        let o = c.output().unwrap();
        let (out, err) = (
            String::from_utf8_lossy(&o.stdout),
            String::from_utf8_lossy(&o.stderr),
        );
        assert!(err.contains("killed at copy:snapshot-committed"), "{err}");
        let copied = dst.snapshot_ids();
        assert_eq!(copied.len(), second, "{err}");
        // The destination lists by id; the source's are oldest first.
        let said: Vec<(String, String)> = if json {
            assert!(out.is_empty(), "{out}");
            err.lines()
                .filter_map(|l| serde_json::from_str::<serde_json::Value>(l).ok())
                .filter(|v| v["type"] == "snapshot_copied")
                .map(|v| {
                    let s = |k: &str| v[k].as_str().unwrap().to_string();
                    (s("source"), s("target"))
                })
                .collect()
        } else {
            out.lines()
                .map(|l| {
                    let w: Vec<&str> = l.split(' ').collect();
                    assert_eq!((w[0], w[1], w[3]), ("copied", "snapshot", "as"), "{out}");
                    (w[2].to_string(), w[4].to_string())
                })
                .collect()
        };
        assert_eq!(said.len(), second, "{out}{err}");
        for (i, (s, t)) in said.iter().enumerate() {
            assert!(source[i].starts_with(s.as_str()), "{said:?} {source:?}");
            assert!(
                copied.iter().any(|c| c.starts_with(t.as_str())),
                "{said:?} {copied:?}"
            );
        }
    }
}

/// The host record a server wrote for a snapshot (`hosts/<id>`) is copied with
/// it, under the copy's id, so a replica attributes it as the original does.
#[test]
fn host_records_go_with_the_copied_snapshots() {
    let src = Env::new();
    src.init(&[]);
    let data = src.path("data");
    fs::create_dir_all(&data).unwrap();
    fs::write(data.join("f"), b"x").unwrap();
    let sid = src.backup(&[&data]);
    fs::create_dir_all(src.repo.join("hosts")).unwrap();
    fs::write(src.repo.join("hosts").join(&sid), b"web01").unwrap();
    let dst = Env::new();
    dst.init(&[]);
    let v = copy(&src, &dst, &[]);
    let target = v["snapshots"][0]["target"].as_str().unwrap().to_string();
    assert_eq!(
        fs::read(dst.repo.join("hosts").join(&target)).unwrap(),
        b"web01",
        "{v}"
    );
    dst.check_clean();
}

/// Ctrl-C stops a copy inside a large file read slowly from its source (it was
/// checked between files only, so the whole file was read first), with 130.
#[test]
fn an_interrupted_copy_stops_inside_a_large_file() {
    let r1 = Env::new();
    r1.init(&[]);
    let src = r1.path("src");
    std::fs::create_dir_all(&src).unwrap();
    std::fs::write(src.join("big"), Rng(7).bytes(48 << 20, false)).unwrap();
    r1.backup(&[&src]);
    let r2 = Env::new();
    r2.init(&["--block-size", "64K"]);
    let (code, err, took) = interrupted(
        copy_cmd(&r1, &r2, &["--limit-download", "4M"]),
        std::time::Duration::from_millis(1500),
    );
    assert_eq!(code, Some(130), "{err}");
    assert!(took < std::time::Duration::from_secs(8), "{err}");
    assert!(err.contains("copy cancelled"), "{err}");
    assert!(r2.snapshot_ids().is_empty());
}

/// A snapshot that reached the destination through a third repository is not
/// copied again when copied directly (the copy names only the repository it came
/// from).
#[test]
fn a_snapshot_copied_by_another_way_is_not_copied_again() {
    let r1 = Env::new();
    r1.init(&[]);
    history(&r1);
    let r3 = Env::new();
    r3.init(&["--block-size", "64K"]);
    copy(&r1, &r3, &[]);
    let r4 = Env::new();
    r4.init(&[]);
    let first = copy(&r3, &r4, &[]);
    assert_eq!(first["snapshots_copied"], 3, "{first}");
    let again = copy(&r1, &r4, &[]);
    assert_eq!(again["snapshots_copied"], 0, "{again}");
    assert_eq!(r4.snapshot_ids().len(), 3);
}

/// A copy from `r1` into `r2` started with a pause at the first hit of `point`,
/// returned once it is there, with the directory whose `go` file lets it go on.
fn paused_copy(r1: &Env, r2: &Env, point: &str) -> (std::process::Child, std::path::PathBuf) {
    let pause = r2.path(&format!("pause-{}", point.replace(':', "-")));
    std::fs::create_dir_all(&pause).unwrap();
    let child = copy_cmd(r1, r2, &[])
        .env(
            "CAIRN_TEST_PAUSE_AT",
            format!("{point}:1:{}", pause.display()),
        )
        .stdout(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    wait_until(
        "the first copy to reach its commit",
        std::time::Duration::from_secs(60),
        || pause.join("reached").exists(),
    );
    (child, pause)
}

/// Two copies of the same snapshots into one destination at once: the one that
/// comes to commit second finds the first one's copy and stores no second
/// snapshot (both stored one before; prune took the duplicate data away, but the
/// duplicate snapshots stayed).
#[test]
fn two_copies_at_once_store_each_snapshot_once() {
    let r1 = Env::new();
    r1.init(&[]);
    let (src, _) = history(&r1);
    let r2 = Env::new();
    r2.init(&["--block-size", "64K"]);
    // The first copy stops before committing its first snapshot...
    let (first, pause) = paused_copy(&r1, &r2, "copy:before-snapshot");
    // ...while a second one copies everything...
    let second = copy(&r1, &r2, &[]);
    assert_eq!(second["snapshots_copied"], 3, "{second}");
    // ...then the first one goes on, and finds each snapshot there.
    std::fs::write(pause.join("go"), b"").unwrap();
    let o = first.wait_with_output().unwrap();
    assert!(o.status.success(), "{o:?}");
    let report: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
    assert_eq!(report["snapshots_copied"], 0, "{report}");
    assert_eq!(r2.snapshot_ids().len(), 3);
    r2.ok(&["prune"]);
    r2.check_clean();
    assert_same(&src, &r2.restore("latest", &src, "r"));
}

/// Two copies into one destination at the same moment: one looks for the other's
/// copy and commits while the other waits its turn, so neither stores a snapshot
/// the other stored (QA: two copies started together left 24 snapshots for 15).
#[test]
fn two_copies_committing_together_store_each_snapshot_once() {
    let r1 = Env::new();
    r1.init(&[]);
    let (src, _) = history(&r1);
    let r2 = Env::new();
    r2.init(&["--block-size", "64K"]);
    // The first copy found nothing for its first snapshot and is about to commit...
    let (first, pause) = paused_copy(&r1, &r2, "copy:checked");
    // ...when a second one comes to commit the same snapshot: it waits.
    let second = copy_cmd(&r1, &r2, &[])
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    std::thread::sleep(std::time::Duration::from_millis(1500));
    std::fs::write(pause.join("go"), b"").unwrap();
    let (a, b) = (
        first.wait_with_output().unwrap(),
        second.wait_with_output().unwrap(),
    );
    assert!(a.status.success(), "{a:?}");
    assert!(b.status.success(), "{b:?}");
    let (ra, rb): (serde_json::Value, serde_json::Value) = (
        serde_json::from_slice(&a.stdout).unwrap(),
        serde_json::from_slice(&b.stdout).unwrap(),
    );
    let copied =
        ra["snapshots_copied"].as_u64().unwrap() + rb["snapshots_copied"].as_u64().unwrap();
    assert_eq!(copied, 3, "{ra} {rb}");
    assert_eq!(r2.snapshot_ids().len(), 3);
    r2.check_clean();
    assert_same(&src, &r2.restore("latest", &src, "r"));
}

/// `copy --pack-size` cuts the destination's packs at that size (a slow link loses
/// one small pack to a drop), and a size out of range is refused before anything
/// is read.
#[test]
fn a_copy_takes_its_own_pack_size() {
    let r1 = Env::new();
    r1.init(&[]);
    let (src, _) = history(&r1);
    let r2 = Env::new();
    r2.init(&[]);
    let o = copy_cmd(&r1, &r2, &["--pack-size", "64K"])
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(!o.status.success(), "{err}");
    assert!(err.contains("between 128 KiB and 256 MiB"), "{err}");
    copy(&r1, &r2, &["--pack-size", "256K"]);
    let mut sizes = Vec::new();
    for d in std::fs::read_dir(r2.repo.join("data")).unwrap() {
        for f in std::fs::read_dir(d.unwrap().path()).unwrap() {
            sizes.push(f.unwrap().metadata().unwrap().len());
        }
    }
    assert!(sizes.len() > 10, "{sizes:?}");
    // A pack closes once it passes the size: at most one blob (64 KiB) beyond it.
    assert!(
        sizes.iter().all(|&n| n <= (256 + 64 + 8) << 10),
        "{sizes:?}"
    );
    r2.check_clean();
    assert_same(&src, &r2.restore("latest", &src, "r"));
}

/// Ctrl-C during a copy over a slow link says that the packs already made are
/// being stored, and how not to wait (it stored them without a word), and the next
/// run does not send them again.
#[test]
fn an_interrupted_copy_says_what_it_still_stores() {
    let r1 = Env::new();
    r1.init(&[]);
    let src = r1.path("src");
    std::fs::create_dir_all(&src).unwrap();
    std::fs::write(src.join("big"), Rng(8).bytes(24 << 20, false)).unwrap();
    r1.backup(&[&src]);
    let r2 = Env::new();
    r2.init(&[]);
    let (code, err, _) = interrupted(
        copy_cmd(&r1, &r2, &["--limit-upload", "4M", "--pack-size", "1M"]),
        std::time::Duration::from_millis(2000),
    );
    assert_eq!(code, Some(130), "{err}");
    assert!(err.contains("stopping: storing the"), "{err}");
    assert!(err.contains("interrupt again"), "{err}");
    // With the default packs the whole file is read and packed at once, and
    // only the upload is left when Ctrl-C comes: the copy still stops without a
    // snapshot (it stored the packs, then the snapshot, and exited 0).
    let r3 = Env::new();
    r3.init(&[]);
    let (code, err, _) = interrupted(
        copy_cmd(&r1, &r3, &["--limit-upload", "4M"]),
        std::time::Duration::from_millis(1500),
    );
    assert_eq!(code, Some(130), "{err}");
    assert!(r3.snapshot_ids().is_empty(), "{err}");
    // Ctrl-C came while the copy waited for its uploads: it says so too.
    assert!(err.contains("stopping: storing the"), "{err}");
    let again = copy(&r1, &r2, &[]);
    assert!(
        again["bytes_added"].as_u64().unwrap() < 20 << 20,
        "the stored packs were sent again: {again}"
    );
    assert_same(&src, &r2.restore("latest", &src, "r"));
}

/// A replica that lost data and was repaired (`repair snapshots` cuts the lost
/// files out of its copies) is healed by the next copy: a repaired copy is no
/// copy of the whole source snapshot, so it is copied again, and said so.
#[test]
fn a_copy_heals_a_replica_that_repair_cut_down() {
    let r1 = Env::new();
    r1.init(&[]);
    let src = r1.path("src");
    make_full_tree(&src, 61);
    fs::write(src.join("big.bin"), Rng(8).bytes(3 << 20, false)).unwrap();
    let snap = r1.backup(&[&src]);
    let r2 = Env::new();
    r2.init(&[]);
    assert_eq!(copy(&r1, &r2, &[])["snapshots_copied"], 1);
    // A pack lost in the replica; its snapshot repaired without the index first.
    fs::remove_file(largest_pack(&r2.repo)).unwrap();
    let said = r2.ok(&["repair", "snapshots"]);
    assert!(said.contains("(file data lost"), "{said}");
    // The index still lists the lost pack's blobs: copying again would skip
    // them, so the copy says what to run first.
    let o = copy_cmd(&r1, &r2, &[]).output().unwrap();
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(o.status.success(), "{err}");
    assert!(err.contains("run `cairn repair index` there"), "{err}");
    let v: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
    assert_eq!(v["snapshots_copied"], 0, "{v}");
    r2.ok(&["repair", "index"]);
    let o = copy_cmd(&r1, &r2, &[]).output().unwrap();
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(o.status.success(), "{err}");
    assert!(err.contains("copied again from the source"), "{err}");
    let v: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
    assert_eq!(v["snapshots_copied"], 1, "{v}");
    let healed = v["snapshots"][0]["target"].as_str().unwrap().to_string();
    assert_same(&src, &r2.restore(&healed, &src, "healed"));
    // `latest` is the whole copy, not the repaired one of the same time.
    assert_same(&src, &r2.restore("latest", &src, "latest"));
    // The whole copy is the copy from now on: nothing more to do.
    assert_eq!(copy(&r1, &r2, &[&snap])["snapshots_copied"], 0);
    assert_eq!(copy(&r1, &r2, &[])["snapshots_copied"], 0);
}

/// A file that is in a snapshot three times is read from the source once, by
/// whichever copy thread meets it first, not once per thread (QA: 8 MiB read
/// for 4 MiB of packs with two threads).
#[test]
fn data_in_several_files_is_read_from_the_source_once() {
    let r1 = Env::new();
    r1.init(&[]);
    let src = r1.path("src");
    fs::create_dir_all(&src).unwrap();
    let data = Rng(61).bytes(4 << 20, false);
    for name in ["a", "b", "c", "d"] {
        fs::write(src.join(name), &data).unwrap();
    }
    r1.backup(&[&src]);
    let r2 = Env::new();
    let o = r2
        .cmd(&["init", "--copy-key-from", &r1.location])
        .env("CAIRN_FROM_PASSWORD", PASSWORD)
        .output()
        .unwrap();
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let r = copy(&r1, &r2, &["--threads", "4"]);
    assert_eq!(r["same_chunking"], true, "{r}");
    let read = r["bytes_read_from_source"].as_u64().unwrap();
    assert!(read < (5 << 20), "read {read} bytes for 4 MiB of data: {r}");
    let copied = r2.snapshot_ids();
    assert_same(&src, &r2.restore(&copied[0], &src, "back"));
    // Re-chunked for another block size: one thread cuts the content, the others
    // wait and take its result (before, each thread read and cut it again).
    let r3 = Env::new();
    r3.init(&["--block-size", "64K"]);
    let r = copy(&r1, &r3, &["--threads", "4"]);
    assert_eq!(r["same_chunking"], false, "{r}");
    assert_eq!(r["files_rechunked"], 1, "{r}");
    let read = r["bytes_read_from_source"].as_u64().unwrap();
    assert!(read < (5 << 20), "read {read} bytes for 4 MiB of data: {r}");
    let copied = r3.snapshot_ids();
    assert_same(&src, &r3.restore(&copied[0], &src, "back64"));
    r3.check_clean();
}
