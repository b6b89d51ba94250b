//! Every kind of bad input gets a clear one-line error and a non-zero exit, never a
//! panic; damage is named; a restore restores everything else.

use crate::util::*;
use std::fs;
use std::io::Write as _;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

fn files_under(dir: &Path) -> Vec<(PathBuf, u64)> {
    let mut v: Vec<(PathBuf, u64)> = walk(dir)
        .into_iter()
        .filter(|(_, m)| m.is_file())
        .map(|(p, m)| (dir.join(p), m.len()))
        .collect();
    v.sort();
    v
}

fn flip(path: &Path, offset: usize) {
    let mut d = fs::read(path).unwrap();
    d[offset] ^= 0x40;
    fs::write(path, d).unwrap();
}

/// Flips a byte of a tree blob that holds `name`, in a repository made with
/// `--no-encryption --compression none` (where names stand in the packs as they are).
fn damage_tree_naming(env: &Env, name: &[u8]) {
    let mut hit = None;
    for (p, _) in files_under(&env.repo.join("data")) {
        let bytes = fs::read(&p).unwrap();
        if let Some(i) = bytes.windows(name.len()).position(|w| w == name) {
            hit = Some((p, i));
        }
    }
    let (pack, at) = hit.expect("a tree blob with the name");
    flip(&pack, at);
}

/// The `--json` document of a command that went past one unreadable directory,
/// checked: exit 1, whole, its "errors" naming that directory alone.
fn one_gap_named(o: &std::process::Output, dir: &str) -> serde_json::Value {
    assert_eq!(o.status.code(), Some(1), "{o:?}");
    let v: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
    let errors = v["errors"].as_array().unwrap();
    assert_eq!(errors.len(), 1, "{v}");
    assert!(errors[0]["path"].as_str().unwrap().ends_with(dir), "{v}");
    v
}

fn small_tree(env: &Env) -> PathBuf {
    let src = env.path("src");
    fs::create_dir_all(src.join("keep")).unwrap();
    fs::create_dir_all(src.join("subdir-marker-name")).unwrap();
    let mut rng = Rng(77);
    fs::write(src.join("keep/a.bin"), rng.bytes(400_000, false)).unwrap();
    fs::write(src.join("keep/b.txt"), rng.bytes(100_000, true)).unwrap();
    fs::write(
        src.join("subdir-marker-name/c.bin"),
        rng.bytes(300_000, false),
    )
    .unwrap();
    src
}

#[test]
fn wrong_password_missing_repo_and_init_over_existing() {
    let env = Env::new();
    // Missing repository.
    let e = env.fails(&["snapshots"], 10);
    assert!(e.contains("there is no repository"), "{e}");
    // A directory that is not a repository.
    fs::create_dir_all(&env.repo).unwrap();
    fs::write(env.repo.join("unrelated"), b"x").unwrap();
    let e = env.fails(&["snapshots"], 10);
    assert!(e.contains("not a cairn repository"), "{e}");
    fs::remove_dir_all(&env.repo).unwrap();
    // Another tool's repository is named as such, not taken for a cairn one with
    // a damaged config (QA: the advice was to put back restic's config).
    let restic_key = br#"{"created":"2026-11-30T10:00:00Z","username":"u","hostname":"h",
        "kdf":"scrypt","N":32768,"r":8,"p":1,"salt":"c2FsdA==","data":"ZGF0YQ=="}"#;
    type Files<'a> = &'a [(&'a str, &'a [u8])];
    let kinds: [(&str, Files); 3] = [
        (
            "restic",
            &[
                ("config", &[0x11, 0x10, 0x09, 0xa4]),
                ("keys/ab12", restic_key),
            ],
        ),
        (
            "borg",
            &[
                ("config", b"[repository]\nversion = 1\n"),
                ("README", b"borg"),
            ],
        ),
        ("kopia", &[("kopia.repository.f", b"{}")]),
    ];
    for (tool, files) in kinds {
        for (name, body) in files {
            let p = env.repo.join(name);
            fs::create_dir_all(p.parent().unwrap()).unwrap();
            fs::write(p, body).unwrap();
        }
        for cmd in ["snapshots", "init"] {
            let e = env.fails(&[cmd], 10);
            assert!(
                e.contains(&format!("is a {tool} repository, not a cairn one")),
                "{cmd}: {e}"
            );
        }
        fs::remove_dir_all(&env.repo).unwrap();
    }

    env.init(&[]);
    let e = env.fails(&["init"], 1);
    assert!(e.contains("already exists"), "{e}");
    let o = env
        .cmd(&["snapshots"])
        .env("CAIRN_PASSWORD", "wrong")
        .output()
        .unwrap();
    assert_eq!(o.status.code(), Some(12));
    let e = String::from_utf8_lossy(&o.stderr);
    assert!(
        e.contains("wrong password") && e.lines().count() == 1,
        "{e}"
    );
    // No password at all, not on a terminal.
    let o = env
        .cmd(&["snapshots"])
        .env_remove("CAIRN_PASSWORD")
        .output()
        .unwrap();
    assert_eq!(o.status.code(), Some(1));
    assert!(String::from_utf8_lossy(&o.stderr).contains("no password given"));
    // Piped to standard input, as restic reads it: its first line; never when
    // standard input is the backup's data.
    let piped = |args: &[&str], input: &[u8]| {
        let mut child = env
            .cmd(args)
            .env_remove("CAIRN_PASSWORD")
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap();
        // cairn stops reading at a line too long: the rest is not taken.
        let _ = child.stdin.take().unwrap().write_all(input);
        child.wait_with_output().unwrap()
    };
    let pw = format!("{PASSWORD}\n");
    assert_eq!(
        piped(&["snapshots", "-q"], pw.as_bytes()).status.code(),
        Some(0)
    );
    assert_eq!(piped(&["snapshots"], b"wrong\n").status.code(), Some(12));
    // A line without end is not read into memory without end (QA: cat /dev/zero).
    let o = piped(&["snapshots"], &vec![0u8; 200_000]);
    assert!(
        String::from_utf8_lossy(&o.stderr).contains("longer than 64 KiB"),
        "{o:?}"
    );
    let o = piped(&["snapshots"], b"\n");
    assert!(
        String::from_utf8_lossy(&o.stderr).contains("an empty line"),
        "{o:?}"
    );
    let o = piped(&["backup", "--stdin"], pw.as_bytes());
    assert_eq!(o.status.code(), Some(1), "{o:?}");
    let e = String::from_utf8_lossy(&o.stderr);
    assert!(
        e.contains("no password given") && !e.contains("pipe it"),
        "{e}"
    );
    // No repository given.
    let o = Command::new(bin())
        .arg("snapshots")
        .env_remove("CAIRN_REPO")
        .output()
        .unwrap();
    assert_eq!(o.status.code(), Some(1));
    assert!(String::from_utf8_lossy(&o.stderr).contains("no repository given"));
    // Bad option values.
    let e = Env::new();
    let err = e.fails(&["init", "--block-size", "5K"], 2);
    assert!(err.contains("invalid block size"), "{err}");
}

#[test]
fn snapshot_ids_that_match_nothing_or_several() {
    let env = Env::new();
    env.init(&["--no-encryption"]);
    let src = env.path("src");
    fs::create_dir_all(&src).unwrap();
    // 17 snapshots: two must share a first hex digit.
    let mut ids = Vec::new();
    for i in 0..17 {
        fs::write(src.join("f"), format!("version {i}")).unwrap();
        ids.push(env.backup(&[&src]));
    }
    let e = env.fails(&["ls", "zzzz"], 1);
    assert!(e.contains("no snapshot matches"), "{e}");
    let e = env.fails(
        &["restore", "0123456789abcdef0123", "--target", "/tmp/never"],
        1,
    );
    assert!(e.contains("no snapshot matches"), "{e}");
    let first = ids
        .iter()
        .find(|a| ids.iter().filter(|b| b[..1] == a[..1]).count() > 1)
        .unwrap();
    let e = env.fails(&["ls", &first[..1]], 1);
    assert!(e.contains("ambiguous"), "{e}");
}

#[test]
fn unwritable_targets() {
    let env = Env::new();
    env.init(&[]);
    let src = small_tree(&env);
    let snap = env.backup(&[&src]);
    let file = env.path("a-file");
    fs::write(&file, b"x").unwrap();
    let e = env.fails(&["restore", &snap, "--target", file.to_str().unwrap()], 1);
    assert!(e.contains("a-file"), "{e}");
    // A read-only filesystem (root can write anywhere else).
    assert!(
        is_root(),
        "the test suite runs as root (CI does): it mounts filesystems"
    );
    let ro = env.path("ro");
    fs::create_dir_all(&ro).unwrap();
    let m = Command::new("mount")
        .args(["-t", "tmpfs", "-o", "ro,size=1m", "tmpfs"])
        .arg(&ro)
        .status()
        .unwrap();
    assert!(m.success());
    let e = env.fails(&["restore", &snap, "--target", ro.to_str().unwrap()], 1);
    let _ = Command::new("umount").arg(&ro).status();
    assert!(e.to_lowercase().contains("read-only"), "{e}");
}

#[test]
fn corrupted_pack_is_named_and_restore_restores_the_rest() {
    let env = Env::new();
    env.init(&["--no-encryption", "--compression", "none"]);
    let src = small_tree(&env);
    let snap = env.backup(&[&src]);
    // The data pack is the largest; damage c.bin's bytes inside it.
    let c = fs::read(src.join("subdir-marker-name/c.bin")).unwrap();
    let (pack, _) = files_under(&env.repo.join("data"))
        .into_iter()
        .max_by_key(|(_, s)| *s)
        .unwrap();
    let bytes = fs::read(&pack).unwrap();
    let at = bytes
        .windows(64)
        .position(|w| w == &c[1000..1064])
        .expect("plaintext chunk in pack");
    flip(&pack, at + 10);

    let o = env.run(&["check", "--read-data"]);
    assert_eq!(o.status.code(), Some(1));
    let out = String::from_utf8_lossy(&o.stdout);
    let pack_name = pack.file_name().unwrap().to_string_lossy();
    assert!(out.contains(&*pack_name), "check must name the pack: {out}");
    assert!(
        out.contains("subdir-marker-name/c.bin"),
        "check must name the affected file: {out}"
    );

    let target = env.path("out");
    let e = env.fails(&["restore", &snap, "--target", target.to_str().unwrap()], 1);
    assert!(e.contains("c.bin"), "{e}");
    let base = target.join(src.strip_prefix("/").unwrap());
    assert_eq!(
        fs::read(base.join("keep/a.bin")).unwrap(),
        fs::read(src.join("keep/a.bin")).unwrap()
    );
    assert_eq!(
        fs::read(base.join("keep/b.txt")).unwrap(),
        fs::read(src.join("keep/b.txt")).unwrap()
    );
}

#[test]
fn corrupted_tree_is_named_and_other_directories_restore() {
    let env = Env::new();
    env.init(&["--no-encryption", "--compression", "none"]);
    let src = small_tree(&env);
    let snap = env.backup(&[&src]);
    // The tree listing "c.bin" lives in the metadata pack; find the name and damage it.
    damage_tree_naming(&env, b"c.bin");
    let o = env.run(&["check"]);
    assert_eq!(o.status.code(), Some(1));
    let out = String::from_utf8_lossy(&o.stdout);
    assert!(
        out.contains("tree") && out.contains("subdir-marker-name"),
        "{out}"
    );
    let target = env.path("out");
    let e = env.fails(&["restore", &snap, "--target", target.to_str().unwrap()], 1);
    assert!(e.contains("subdir-marker-name"), "{e}");
    let base = target.join(src.strip_prefix("/").unwrap());
    assert_eq!(
        fs::read(base.join("keep/a.bin")).unwrap(),
        fs::read(src.join("keep/a.bin")).unwrap()
    );
    // ls --json lists the rest in a whole document that names the gap, and
    // exits 1; so does a list of paths with the damaged directory among them
    // (QA: it stopped there, the JSON cut off).
    let o = env.run(&["ls", &snap, "--json"]);
    let v = one_gap_named(&o, "subdir-marker-name");
    let (damaged, keep) = (src.join("subdir-marker-name"), src.join("keep"));
    let o = env.run(&[
        "ls",
        &snap,
        "--json",
        damaged.to_str().unwrap(),
        keep.to_str().unwrap(),
    ]);
    let listed = one_gap_named(&o, "subdir-marker-name");
    let lists = |doc: &serde_json::Value, end: &str| {
        doc["entries"]
            .as_array()
            .unwrap()
            .iter()
            .any(|e| e["path"].as_str().unwrap().ends_with(end))
    };
    assert!(lists(&listed, "keep/b.txt"), "{listed}");
    assert!(lists(&v, "keep/a.bin"), "{v}");
}

/// A damaged tree met by `diff` is named, and the rest is compared: a change
/// beside it is still listed, `--json` stays one whole document with the gap in
/// its "errors", and the exit status is 1 (QA: the document was cut off and the
/// changes after the damaged directory were never listed).
#[test]
fn diff_goes_past_a_damaged_tree_and_names_it() {
    let env = Env::new();
    env.init(&["--no-encryption", "--compression", "none"]);
    let src = small_tree(&env);
    let a = env.backup(&[&src]);
    fs::write(src.join("subdir-marker-name/c.bin"), b"changed").unwrap();
    fs::write(src.join("keep/b.txt"), b"changed too").unwrap();
    let b = env.backup(&[&src]);
    // Both snapshots' trees of the directory name "c.bin": damage one of them.
    damage_tree_naming(&env, b"c.bin");
    let o = env.run(&["diff", &a, &b, "--json"]);
    let v = one_gap_named(&o, "subdir-marker-name");
    let modified: Vec<&str> = v["differences"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|d| d["change"] == "modified")
        .map(|d| d["path"].as_str().unwrap())
        .collect();
    assert_eq!(modified, [format!("{}/keep/b.txt", src.display())], "{v}");
    let o = env.run(&["diff", &a, &b]);
    assert_eq!(o.status.code(), Some(1), "{o:?}");
    let out = String::from_utf8_lossy(&o.stdout);
    assert!(
        out.contains("keep/b.txt") && out.contains("1 modified"),
        "{out}"
    );
    assert!(
        String::from_utf8_lossy(&o.stderr).contains("subdir-marker-name"),
        "{o:?}"
    );
}

#[test]
fn corrupted_or_truncated_index_snapshot_config_and_pack() {
    let env = Env::new();
    env.init(&[]);
    let src = small_tree(&env);
    let s1 = env.backup(&[&src]);
    fs::write(src.join("keep/new"), b"second").unwrap();
    let s2 = env.backup(&[&src]);

    // A damaged snapshot is named; the other still lists and restores.
    let snap_file = env.repo.join("snapshots").join(&s1);
    let orig = fs::read(&snap_file).unwrap();
    flip(&snap_file, 30);
    let o = env.run(&["snapshots"]);
    assert_eq!(o.status.code(), Some(1));
    assert!(
        String::from_utf8_lossy(&o.stderr).contains(&s1),
        "{}",
        String::from_utf8_lossy(&o.stderr)
    );
    assert!(String::from_utf8_lossy(&o.stdout).contains(&s2[..8]));
    // Named: the damaged one says it is damaged (QA: "no snapshot matches"),
    // the other lists without the first's warning or exit status.
    let err = env.fails(&["snapshots", &s1[..8]], 1);
    assert!(err.contains(&s1[..8]) && err.contains("damaged"), "{err}");
    let o = env.run(&["snapshots", &s2[..8]]);
    assert_eq!(o.status.code(), Some(0), "{o:?}");
    assert!(
        !String::from_utf8_lossy(&o.stderr).contains(&s1[..8]),
        "{o:?}"
    );
    let o = env.run(&["check"]);
    assert_eq!(o.status.code(), Some(1));
    assert!(String::from_utf8_lossy(&o.stdout).contains(&s1));
    let r = env.restore(&s2, &src, "out2");
    assert_same(&src, &r);
    fs::write(&snap_file, &orig).unwrap();

    // A damaged index file is named by check; restore reports what it cannot find.
    let (idx, _) = files_under(&env.repo.join("index"))
        .into_iter()
        .next()
        .unwrap();
    let orig_idx = fs::read(&idx).unwrap();
    flip(&idx, orig_idx.len() / 2);
    let o = env.run(&["check"]);
    assert_eq!(o.status.code(), Some(1));
    assert!(
        String::from_utf8_lossy(&o.stdout).contains(idx.file_name().unwrap().to_str().unwrap())
    );
    fs::write(&idx, &orig_idx).unwrap();

    // A truncated index file too.
    fs::write(&idx, &orig_idx[..orig_idx.len() / 3]).unwrap();
    let o = env.run(&["check"]);
    assert_eq!(o.status.code(), Some(1));
    fs::write(&idx, &orig_idx).unwrap();

    // A truncated pack: check names it.
    let (pack, size) = files_under(&env.repo.join("data"))
        .into_iter()
        .max_by_key(|(_, s)| *s)
        .unwrap();
    let orig_pack = fs::read(&pack).unwrap();
    fs::write(&pack, &orig_pack[..(size / 2) as usize]).unwrap();
    let o = env.run(&["check"]);
    assert_eq!(o.status.code(), Some(1));
    let out = String::from_utf8_lossy(&o.stdout);
    assert!(
        out.contains(pack.file_name().unwrap().to_str().unwrap()) && out.contains("truncated"),
        "{out}"
    );
    let target = env.path("out-trunc");
    let e = env.fails(&["restore", &s2, "--target", target.to_str().unwrap()], 1);
    assert!(!e.contains("panicked"));
    fs::write(&pack, &orig_pack).unwrap();
    env.check_clean();

    // A damaged config and a damaged key file.
    let cfg = env.repo.join("config");
    let orig_cfg = fs::read(&cfg).unwrap();
    let mut bad = orig_cfg.clone();
    let pos = bad.windows(9).position(|w| w == b"\"standard").unwrap();
    bad[pos + 1] = b'S';
    fs::write(&cfg, &bad).unwrap();
    // Each says what can be done: put back a copy (QA: no advice at all).
    let e = env.fails(&["snapshots"], 1);
    assert!(e.contains("config") && e.contains("put back a copy"), "{e}");
    fs::write(&cfg, &orig_cfg[..orig_cfg.len() / 2]).unwrap();
    let e = env.fails(&["snapshots"], 1);
    assert!(
        e.contains("config") && e.contains("put back a copy") && e.lines().count() == 1,
        "{e}"
    );
    // A missing one says so, with the same advice (QA: "not a cairn repository",
    // as if the path were wrong); a FIFO in its place is refused, not waited on
    // for ever (QA: every command hung).
    fs::remove_file(&cfg).unwrap();
    let e = env.fails(&["snapshots"], 10);
    assert!(
        e.contains("the file `config` is missing") && e.contains("put back a copy"),
        "{e}"
    );
    assert!(Command::new("mkfifo").arg(&cfg).status().unwrap().success());
    let mut child = env.cmd(&["snapshots"]).spawn().unwrap();
    let mut status = None;
    wait_until(
        "snapshots with a FIFO config to end",
        std::time::Duration::from_secs(60),
        || {
            status = child.try_wait().unwrap();
            status.is_some()
        },
    );
    assert_eq!(status.unwrap().code(), Some(1));
    fs::remove_file(&cfg).unwrap();
    fs::write(&cfg, &orig_cfg).unwrap();
    let (key, _) = files_under(&env.repo.join("keys"))
        .into_iter()
        .next()
        .unwrap();
    fs::write(&key, b"{not json").unwrap();
    let e = env.fails(&["snapshots"], 1);
    assert!(e.contains("key file"), "{e}");
}

/// An index file that cannot be read does not stop prune for good: prune drops it
/// and treats the packs only it listed as unindexed (rescued from their headers
/// when a snapshot needs them), unless a snapshot needs a blob only that file
/// listed; then it stops before changing anything and says which file to repair.
#[test]
fn prune_goes_on_past_a_damaged_index_file_unless_a_snapshot_needs_it() {
    let env = Env::new();
    env.init(&[]);
    let src = small_tree(&env);
    let keep = env.backup(&[&src]);
    let before: Vec<_> = files_under(&env.repo.join("index"));
    let other = env.path("other");
    fs::create_dir_all(&other).unwrap();
    fs::write(other.join("big"), Rng(5).bytes(700_000, false)).unwrap();
    let gone = env.backup(&[&other]);
    let damaged: Vec<PathBuf> = files_under(&env.repo.join("index"))
        .into_iter()
        .filter(|f| !before.contains(f))
        .map(|(p, _)| p)
        .collect();
    assert!(!damaged.is_empty());
    for f in &damaged {
        let n = fs::metadata(f).unwrap().len() as usize;
        flip(f, n / 2);
    }
    let objects = |env: &Env| files_under(&env.repo);

    // The second snapshot's blobs are listed only by the damaged files: prune
    // stops, names one and says what to run, and changes nothing.
    let was = objects(&env);
    let e = env.fails(&["prune"], 1);
    let names: Vec<String> = damaged
        .iter()
        .map(|p| p.file_name().unwrap().to_string_lossy().into_owned())
        .collect();
    assert!(
        names.iter().any(|n| e.contains(n.as_str())) && e.contains("repair index"),
        "{e}"
    );
    assert_eq!(objects(&env), was);

    // Once nothing needs them, prune goes on: the damaged files are replaced,
    // the packs only they listed deleted, and the repository is whole.
    env.ok(&["forget", &gone]);
    let data_before = files_under(&env.repo.join("data")).len();
    let o = env.run(&["prune", "--json"]);
    let err = String::from_utf8_lossy(&o.stderr);
    assert_eq!(o.status.code(), Some(0), "{err}");
    let v: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
    let reported: Vec<String> = v["damaged_index_files"]
        .as_array()
        .unwrap()
        .iter()
        .map(|x| x.as_str().unwrap().to_string())
        .collect();
    let mut expected = names.clone();
    expected.sort();
    let mut got = reported.clone();
    got.sort();
    assert_eq!(got, expected);
    assert!(v["plan"]["unindexed_packs"].as_u64().unwrap() >= 1, "{v}");
    assert!(v["deleted_packs"].as_u64().unwrap() >= 1, "{v}");
    assert!(files_under(&env.repo.join("data")).len() < data_before);
    for f in &damaged {
        assert!(!f.exists(), "{} still stored", f.display());
    }
    env.check_clean();
    let r = env.restore(&keep, &src, "out-keep");
    assert_same(&src, &r);
    // Without --json, the warning names the file.
    let mut junk = b"junk that no key opens".to_vec();
    junk.extend_from_slice(&[7u8; 64]);
    let name = blake3::hash(&junk).to_hex().to_string();
    fs::write(env.repo.join("index").join(&name), &junk).unwrap();
    // stats leaves it out too, and says so.
    let v: serde_json::Value = serde_json::from_str(&env.ok(&["stats", "--json"])).unwrap();
    assert_eq!(v["damaged_index_files"][0], name.as_str(), "{v}");
    let o = env.run(&["prune"]);
    assert_eq!(o.status.code(), Some(0));
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(err.contains(&name) && err.contains("warning"), "{err}");
    assert!(!env.repo.join("index").join(&name).exists());
    env.check_clean();
}

#[test]
fn unreadable_source_files_are_warnings_with_exit_3() {
    let env = Env::new();
    env.init(&[]);
    let src = env.path("src");
    fs::create_dir_all(&src).unwrap();
    fs::write(src.join("ok"), b"fine").unwrap();
    // A path that vanishes: a dangling path argument is an error, but inside a tree
    // unreadable entries are skipped. Root reads everything, so use a FIFO-free trick:
    // a directory we cannot list because it is replaced by a file mid-way is racy;
    // instead give a file whose read fails (EISDIR is not possible), use /proc entry.
    let o = env.run(&["backup", "--json", src.to_str().unwrap(), "/proc/self/mem"]);
    // /proc/self/mem cannot be read sequentially from offset 0 (EIO): skipped.
    assert_eq!(
        o.status.code(),
        Some(3),
        "{}",
        String::from_utf8_lossy(&o.stderr)
    );
    let v: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
    assert_eq!(v["entries_skipped"], 1);
    assert!(String::from_utf8_lossy(&o.stderr).contains("warning"));
    let ls = env.ok(&["ls", v["snapshot_id"].as_str().unwrap()]);
    assert!(ls.contains("/ok"));
}

/// A directory the backup cannot list (another user's 0700 directory) is kept
/// as an empty directory with its owner, mode and times, as restic keeps it:
/// warned about, the backup exits 3, and a restore makes it.
#[test]
fn an_unlistable_directory_is_kept_empty() {
    use std::os::unix::fs::PermissionsExt;
    use std::os::unix::process::CommandExt;
    if !is_root() {
        eprintln!("needs root, to run the backup as nobody");
        return;
    }
    let env = Env::new();
    env.init(&[]);
    let src = env.path("src");
    fs::create_dir_all(src.join("open")).unwrap();
    fs::write(src.join("open/f"), b"readable").unwrap();
    fs::create_dir_all(src.join("closed")).unwrap();
    fs::write(src.join("closed/secret"), b"not for nobody").unwrap();
    // Everything is nobody's to read and write but the closed directory.
    sh(Command::new("chmod")
        .args(["-R", "a+rwX"])
        .arg(env.dir.path()));
    fs::set_permissions(src.join("closed"), fs::Permissions::from_mode(0o700)).unwrap();
    let o = env
        .cmd(&["backup", "--json", src.to_str().unwrap()])
        .uid(65534)
        .gid(65534)
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&o.stderr);
    assert_eq!(o.status.code(), Some(3), "{err}");
    assert!(err.contains("kept as an empty directory"), "{err}");
    let v: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
    let snap = v["snapshot_id"].as_str().unwrap();
    let ls = env.ok(&["ls", "-l", snap]);
    let closed = ls
        .lines()
        .find(|l| l.ends_with("/src/closed"))
        .unwrap_or_else(|| panic!("{ls}"));
    assert!(closed.starts_with("drwx------"), "{closed}");
    assert!(!ls.contains("secret"), "{ls}");
    assert!(ls.contains("/src/open/f"), "{ls}");
    let out = env.path("out");
    env.ok(&["restore", snap, "--target", out.to_str().unwrap()]);
    let back = out.join(src.strip_prefix("/").unwrap());
    assert!(back.join("closed").is_dir());
    assert_eq!(fs::read_dir(back.join("closed")).unwrap().count(), 0);
    assert_eq!(fs::read(back.join("open/f")).unwrap(), b"readable");
}

/// A repository another user owns (root's, opened by an operator) refuses a
/// backup with a line that says why, while commands that only read it work.
#[test]
fn another_users_repository_says_it_may_not_be_written() {
    if !is_root() {
        eprintln!("needs root, to run the backup as nobody");
        return;
    }
    let env = Env::new();
    env.init(&[]);
    let src = small_tree(&env);
    let snap = env.backup(&[&src]);
    let (_, cache) = open_to_nobody(&env);
    let o = output_as_nobody(&mut env.cmd(&["backup", src.to_str().unwrap()]), &cache);
    let err = String::from_utf8_lossy(&o.stderr);
    assert_eq!(o.status.code(), Some(1), "{err}");
    assert!(
        err.contains("this user may not write into the repository"),
        "{err}"
    );
    assert_eq!(err.trim().lines().count(), 1, "{err}");
    let o = output_as_nobody(&mut env.cmd(&["snapshots"]), &cache);
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    assert!(String::from_utf8_lossy(&o.stdout).contains(&snap[..8]));
    assert_eq!(env.snapshot_ids().len(), 1);
}

#[test]
fn disk_full_fails_cleanly_and_next_backup_works() {
    let env = Env::new();
    let mnt = env.path("small-fs");
    let fs_small = Tmpfs::mount(&mnt, "size=24m");
    let env2 = Env::at(tempfile::tempdir().unwrap(), mnt.join("repo"));
    env2.init(&[]);
    let src = small_tree(&env);
    let s1 = env2.backup(&[&src]);
    let big = env.path("big");
    fs::create_dir_all(&big).unwrap();
    let mut rng = Rng(1234);
    for i in 0..8 {
        fs::write(big.join(format!("f{i}")), rng.bytes(6 << 20, false)).unwrap();
    }
    let e = env2.fails(&["backup", big.to_str().unwrap()], 1);
    assert!(e.contains("no space left"), "{e}");
    assert_eq!(e.trim().lines().count(), 1, "{e}");
    // Full to the last byte: reading still works, without a lock (the day a
    // restore is needed is not the day to free space first); a write says what to do.
    {
        let mut filler = fs::File::create(mnt.join("filler")).unwrap();
        let block = vec![0u8; 1 << 16];
        while std::io::Write::write_all(&mut filler, &block).is_ok() {}
    }
    let r = env2.restore(&s1, &src, "out0");
    assert_same(&src, &r);
    let e = env2.fails(&["forget", "--keep-last", "1"], 1);
    assert!(
        e.contains("storage is full") && !e.contains("free space on the repository's storage"),
        "{e}"
    );
    // Room for a lock, not for the index a prune writes before it deletes the
    // failed backup's packs: the advice is not to prune again the same way.
    let filler = fs::OpenOptions::new()
        .write(true)
        .open(mnt.join("filler"))
        .unwrap();
    filler
        .set_len(filler.metadata().unwrap().len() - 4096)
        .unwrap();
    for args in [&["prune"][..], &["prune", "--max-unused", "unlimited"]] {
        let e = env2.fails(args, 1);
        assert!(
            e.contains("no space left")
                && e.contains("index/ directory takes")
                && !e.contains("free space on the repository's storage"),
            "{args:?}: {e}"
        );
    }
    // A command without advice of its own gets the general one.
    let e = env2.fails(&["tag", "--add", "x", &s1], 1);
    assert!(
        e.contains("no space left") && e.contains("free space on the repository's storage"),
        "{e}"
    );
    fs::remove_file(mnt.join("filler")).unwrap();
    // Earlier snapshots are intact and the repository checks clean.
    env2.check_clean();
    let r = env2.restore(&s1, &src, "out1");
    assert_same(&src, &r);
    // Free space (grow the filesystem), and the next backup works.
    fs_small.remount("size=200m");
    let s2 = env2.backup(&[&big]);
    let r = env2.restore(&s2, &big, "out2");
    assert_same(&big, &r);
    env2.check_clean();

    // A prune that repacks runs out of room while it writes: it names the full
    // disk (it said "operation interrupted", the upload's stop as its sender saw
    // it), and once there is room it finishes.
    for i in (0..8).step_by(2) {
        fs::remove_file(big.join(format!("f{i}"))).unwrap();
    }
    env2.backup(&[&big]);
    env2.ok(&["forget", &s2]);
    {
        let mut filler = fs::File::create(mnt.join("filler")).unwrap();
        let block = vec![0u8; 1 << 16];
        while std::io::Write::write_all(&mut filler, &block).is_ok() {}
        filler
            .set_len(filler.metadata().unwrap().len() - (1 << 20))
            .unwrap();
    }
    let e = env2.fails(&["prune", "--max-unused", "0"], 1);
    assert!(
        e.contains("no space left") && !e.contains("interrupted"),
        "{e}"
    );
    fs::remove_file(mnt.join("filler")).unwrap();
    env2.ok(&["prune", "--max-unused", "0"]);
    env2.check_clean();
}

#[test]
fn missing_source_paths_and_bad_arguments() {
    let env = Env::new();
    env.init(&[]);
    let e = env.fails(&["backup", "/nonexistent/source/dir"], 1);
    assert!(
        e.contains("/nonexistent/source") && e.lines().count() == 1,
        "{e}"
    );
    // No path at all is a missing argument: exit 2 (QA r29: 1).
    let e = env.fails(&["backup"], 2);
    assert!(e.contains("nothing to back up"), "{e}");
    // An exclude that matches every path given (it saved an empty snapshot).
    let src = env.path("src1");
    fs::create_dir_all(&src).unwrap();
    let e = env.fails(&["backup", src.to_str().unwrap(), "-e", "src1"], 1);
    assert!(e.contains("every path given is excluded"), "{e}");
    let e = env.fails(&["dump", "latest", "/x"], 1);
    assert!(e.contains("no snapshot matches"), "{e}");
    let e = env.fails(&["config", "--compression", "extreme"], 2);
    assert!(e.contains("unknown compression"), "{e}");
    let e = env.fails(&["backup", "--stdin", "--stdin-name", "../evil"], 1);
    assert!(e.contains("invalid --stdin-name"), "{e}");
    // Nothing was committed by any of these.
    let snaps: serde_json::Value = serde_json::from_str(&env.ok(&["snapshots", "--json"])).unwrap();
    assert!(snaps.as_array().unwrap().is_empty());
    // One path gone among others (an unmounted volume in a cron job's list): the
    // others are backed up, the gone one is said and left out of the snapshot's
    // paths, and the exit code is 3, as restic's.
    let gone = env.path("gone");
    let o = env
        .cmd(&[
            "backup",
            "--json",
            gone.to_str().unwrap(),
            src.to_str().unwrap(),
        ])
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&o.stderr);
    assert_eq!(o.status.code(), Some(3), "{err}");
    assert!(err.contains("left out of the snapshot"), "{err}");
    let r: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
    assert_eq!(
        r["paths"],
        serde_json::json!([src.to_str().unwrap()]),
        "{r}"
    );
    assert_eq!(r["skipped"][0]["path"], gone.to_str().unwrap(), "{r}");
    // All gone: an error naming each.
    let e = env.fails(&["backup", gone.to_str().unwrap(), "/nonexistent/other"], 1);
    assert!(
        e.contains(gone.to_str().unwrap()) && e.contains("/nonexistent/other"),
        "{e}"
    );
}

/// `--stdin-from-command` (restic's): the command's output is the file; a command
/// that fails after writing some of it (a dump cut short) saves no snapshot, one
/// that cannot start is said so, and a command left running when the backup
/// fails is not left behind.
#[test]
fn a_failing_stdin_command_saves_no_snapshot() {
    let env = Env::new();
    env.init(&[]);
    let ok = env.ok(&[
        "backup",
        "--json",
        "--stdin-from-command",
        "--stdin-name",
        "db.sql",
        "--",
        "sh",
        "-c",
        "seq 1 20000",
    ]);
    let v: serde_json::Value = serde_json::from_str(&ok).unwrap();
    let id = v["snapshot_id"].as_str().unwrap();
    let dumped = env.ok(&["dump", id, "/db.sql"]);
    assert_eq!(dumped.lines().count(), 20000);
    assert_eq!(dumped.lines().last(), Some("20000"));
    let e = env.fails(
        &[
            "backup",
            "--stdin-from-command",
            "--",
            "sh",
            "-c",
            "seq 1 20000; exit 3",
        ],
        1,
    );
    assert!(
        e.contains("failed (exit status: 3)") && e.contains("no snapshot was saved"),
        "{e}"
    );
    let e = env.fails(
        &["backup", "--stdin-from-command", "--", "/no/such/program"],
        1,
    );
    assert!(
        e.contains("starting") && e.contains("/no/such/program"),
        "{e}"
    );
    let e = env.fails(&["backup", "--stdin-from-command"], 1);
    assert!(
        e.contains("runs the command given after the options"),
        "{e}"
    );
    assert_eq!(env.snapshot_ids(), [id]);
    // The command does not see the repository's password.
    let out = env.ok(&[
        "backup",
        "--json",
        "--stdin-from-command",
        "--stdin-name",
        "env.txt",
        "--",
        "sh",
        "-c",
        "echo \"password: ${CAIRN_PASSWORD:-none}\"",
    ]);
    let v: serde_json::Value = serde_json::from_str(&out).unwrap();
    let seen = env.ok(&["dump", v["snapshot_id"].as_str().unwrap(), "/env.txt"]);
    assert_eq!(seen, "password: none\n");
    env.check_clean();
}

/// SIGTERM (or Ctrl-C) on a backup of standard input or of a command's output
/// stops it at once, exit 130, and ends the command and what it started (QA:
/// both waited for the input's end: 15 s for `sh -c 'sleep 15'`, whose `sleep`
/// went on running).
#[test]
fn a_stdin_backup_stops_at_once_when_told() {
    use nix::sys::signal::{Signal, kill};
    use nix::unistd::Pid;
    let env = Env::new();
    env.init(&[]);
    let marker = env.path("still-running");
    let script = format!("echo start; sleep 30; touch {}", marker.display());
    let stop_soon = |mut c: std::process::Command| {
        let child = c
            .stdout(std::process::Stdio::piped())
            .stderr(std::process::Stdio::piped())
            .spawn()
            .unwrap();
        std::thread::sleep(std::time::Duration::from_millis(1500));
        let t = std::time::Instant::now();
        kill(Pid::from_raw(child.id() as i32), Signal::SIGTERM).unwrap();
        let o = child.wait_with_output().unwrap();
        assert_eq!(o.status.code(), Some(130), "{o:?}");
        assert!(
            t.elapsed() < std::time::Duration::from_secs(10),
            "{:?}",
            t.elapsed()
        );
    };
    stop_soon(env.cmd(&["backup", "--stdin-from-command", "--", "sh", "-c", &script]));
    // Standard input from a program that writes nothing for a long time.
    let mut feeder = std::process::Command::new("sleep")
        .arg("30")
        .stdout(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let mut c = env.cmd(&["backup", "--stdin"]);
    c.stdin(feeder.stdout.take().unwrap());
    stop_soon(c);
    let _ = feeder.kill();
    let _ = feeder.wait();
    // The shell's `sleep` was ended with it: nothing touches the marker later.
    std::thread::sleep(std::time::Duration::from_secs(1));
    assert!(env.snapshot_ids().is_empty());
    assert!(!marker.exists());
}

/// Output to a reader that stops early (`cairn ls | head`, `cairn dump | head`)
/// ends the command quietly with SIGPIPE's status, no panic and no error line, and
/// leaves no lock behind.
#[test]
fn output_to_a_closed_pipe_ends_quietly() {
    use std::io::Read;
    let env = Env::new();
    env.init(&[]);
    let src = env.path("src");
    fs::create_dir_all(&src).unwrap();
    for i in 0..3000 {
        fs::write(
            src.join(format!("a-fairly-long-file-name-{i:05}.txt")),
            b"x",
        )
        .unwrap();
    }
    fs::write(src.join("big.bin"), Rng(8).bytes(4 << 20, false)).unwrap();
    env.backup(&[&src]);
    let big = format!("{}/big.bin", src.display());
    for args in [
        vec!["ls", "-l", "latest"],
        vec!["dump", "latest", big.as_str()],
    ] {
        let mut child = env
            .cmd(&args)
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap();
        let mut first = [0u8; 100];
        child.stdout.take().unwrap().read_exact(&mut first).unwrap();
        // The reader is gone (dropped above); the rest cannot be written.
        let out = child.wait_with_output().unwrap();
        let err = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(141), "{args:?}: {err}");
        assert!(err.is_empty(), "{args:?}: {err}");
        let locks = fs::read_dir(env.repo.join("locks")).unwrap().count();
        assert_eq!(locks, 0, "{args:?} left its lock");
    }
}

/// A repository inside another one: `init` refuses to make one (QA: one made in
/// another's `data/` had its packs taken by the outer one's check for leftovers,
/// and blocked its prune with "object not found"); one moved there anyway is not
/// the outer repository's business.
#[test]
fn a_repository_inside_another_is_refused_and_left_alone() {
    let env = Env::new();
    env.init(&[]);
    let src = small_tree(&env);
    env.backup(&[&src]);
    for inner in ["data/inner", "sub/deeper"] {
        let at = env.repo.join(inner);
        let e = Env::at(tempfile::tempdir().unwrap(), at.clone()).fails(&["init"], 1);
        assert!(
            e.contains(&format!(
                "is inside the cairn repository at {}",
                env.repo.display()
            )),
            "{e}"
        );
        assert!(!at.exists(), "{inner}");
    }
    // A directory that merely holds a file named `config` is no repository.
    let plain = env.path("plain");
    fs::create_dir_all(&plain).unwrap();
    fs::write(plain.join("config"), b"[settings]\n").unwrap();
    Env::at(tempfile::tempdir().unwrap(), plain.join("repo")).init(&[]);
    // Through a symlink to its data/ too.
    let link = env.path("linkdata");
    std::os::unix::fs::symlink(env.repo.join("data"), &link).unwrap();
    let e = Env::at(tempfile::tempdir().unwrap(), link.join("inner")).fails(&["init"], 1);
    assert!(e.contains("is inside the cairn repository at"), "{e}");
    // Made elsewhere and moved in: the outer one neither counts nor touches it.
    let other = Env::new();
    other.init(&[]);
    other.backup(&[&src]);
    let moved = env.repo.join("data").join("moved");
    fs::rename(&other.repo, &moved).unwrap();
    let before = util_files(&moved);
    let out = env.ok(&["check"]);
    assert!(!out.contains("not in any index"), "{out}");
    env.ok(&["prune"]);
    env.check_clean();
    assert_eq!(util_files(&moved), before);
}

fn util_files(dir: &Path) -> Vec<(PathBuf, u64)> {
    let mut v: Vec<(PathBuf, u64)> = walk(dir)
        .into_iter()
        .filter(|(_, m)| m.is_file())
        .map(|(p, m)| (p, m.len()))
        .collect();
    v.sort();
    v
}

/// An init killed between its key file and its config: every command, init
/// included, says what happened and what to do.
#[test]
fn an_interrupted_init_is_named_as_such() {
    let env = Env::new();
    env.init(&[]);
    let cfg = env.repo.join("config");
    fs::rename(&cfg, env.repo.join("config.tmp-01196e729d968795-99999-1")).unwrap();
    let e = env.fails(&["snapshots"], 10);
    assert!(e.contains("interrupted `cairn init`"), "{e}");
    let e = env.fails(&["init"], 10);
    assert!(e.contains("remove it and run init again"), "{e}");
}

/// An unreadable snapshot object (damage, or junk stored under a snapshot's name)
/// stops prune, which cannot tell what it needs; the message says how to remove
/// it, and `forget ID` does, though it cannot be read.
#[test]
fn an_unreadable_snapshot_is_removed_by_forget_with_its_id() {
    let env = Env::new();
    env.init(&[]);
    let src = small_tree(&env);
    let keep = env.backup(&[&src]);
    let junk = b"not a snapshot".to_vec();
    let id = blake3::hash(&junk).to_hex().to_string();
    fs::write(env.repo.join("snapshots").join(&id), &junk).unwrap();
    let e = env.fails(&["prune"], 1);
    assert!(e.contains(&id) && e.contains("cairn forget"), "{e}");
    // By a prefix too, as any snapshot.
    env.ok(&["forget", &id[..12]]);
    assert!(!env.repo.join("snapshots").join(&id).exists());
    env.ok(&["prune"]);
    env.check_clean();
    assert_eq!(env.snapshot_ids(), vec![keep]);
}

/// A damaged snapshot object (cut to nothing by a power loss): `check` and
/// `repair snapshots` say to `recover` its trees before anything prunes them, and
/// `recover` brings the backup back (QA: the advice was forget or repair, and a
/// prune after either lost the data for good).
#[test]
fn a_damaged_snapshot_is_recovered_before_it_is_removed() {
    let env = Env::new();
    env.init(&[]);
    let src = small_tree(&env);
    let id = env.backup(&[&src]);
    fs::write(env.repo.join("snapshots").join(&id), b"").unwrap();
    let o = env.run(&["check"]);
    let out = String::from_utf8_lossy(&o.stdout).to_string() + &String::from_utf8_lossy(&o.stderr);
    assert!(!o.status.success(), "{out}");
    assert!(out.contains("first `cairn recover`"), "{out}");
    // Said as empty, not as changed bytes.
    assert!(out.contains("is damaged: it is empty (0 bytes"), "{out}");
    let out = env.ok(&["repair", "snapshots"]);
    assert!(out.contains("`cairn recover` saves them"), "{out}");
    let out = env.ok(&["recover"]);
    assert!(out.contains("saved"), "{out}");
    env.ok(&["prune"]);
    let ids = env.snapshot_ids();
    assert_eq!(ids.len(), 1);
    env.restore(&ids[0], &src, "back");
    let back = env.path("back");
    // Recovered trees sit under /recover/<tree>: every file is there, whole.
    fn find(dir: &Path, name: &str) -> Option<PathBuf> {
        for e in fs::read_dir(dir).ok()?.flatten() {
            let p = e.path();
            if p.file_name().is_some_and(|n| n == name) {
                return Some(p);
            }
            if p.is_dir()
                && let Some(f) = find(&p, name)
            {
                return Some(f);
            }
        }
        None
    }
    for rel in ["keep/a.bin", "keep/b.txt", "subdir-marker-name/c.bin"] {
        let name = rel.rsplit('/').next().unwrap();
        let got = find(&back, name).unwrap_or_else(|| panic!("{rel} not recovered"));
        assert!(
            fs::read(got).unwrap() == fs::read(src.join(rel)).unwrap(),
            "{rel}"
        );
    }
    env.check_clean();
}

/// A snapshot object this user may not read is not damage: `repair snapshots`
/// leaves it (QA: it removed it, and the next prune deleted its data), says
/// what to do and exits 1; `check` and `prune` advise access, not removal. The
/// snapshot is whole again once the user may read it.
#[test]
fn a_snapshot_this_user_may_not_read_is_left_by_repair() {
    if !is_root() {
        eprintln!("needs root, to run the repair as nobody");
        return;
    }
    let env = Env::new();
    env.init(&[]);
    let src = env.path("src");
    fs::create_dir_all(&src).unwrap();
    fs::write(src.join("a"), Rng(41).bytes(200_000, false)).unwrap();
    let first = env.backup(&[&src]);
    fs::write(src.join("b"), Rng(42).bytes(200_000, false)).unwrap();
    let second = env.backup(&[&src]);
    // The repository is nobody's, but for the second snapshot's object.
    let object = env.repo.join("snapshots").join(&second);
    nobodys_but(&env, &object);
    let as_nobody = |args: &[&str]| as_nobody(&env, args);
    for dry in [true, false] {
        let args: &[&str] = if dry {
            &["repair", "snapshots", "--dry-run"]
        } else {
            &["repair", "snapshots"]
        };
        let o = as_nobody(args);
        let err = String::from_utf8_lossy(&o.stderr);
        assert_eq!(o.status.code(), Some(1), "{err}");
        assert!(
            err.contains(&format!("left snapshot {second}")) && err.contains("may not read it"),
            "{err}"
        );
        assert!(
            object.exists(),
            "dry run {dry}: the object was removed: {err}"
        );
    }
    for args in [&["check"][..], &["prune"][..]] {
        let o = as_nobody(args);
        let err = format!(
            "{}{}",
            String::from_utf8_lossy(&o.stdout),
            String::from_utf8_lossy(&o.stderr)
        );
        assert_eq!(o.status.code(), Some(1), "{args:?}: {err}");
        assert!(
            err.contains("may not read it") && !err.contains("removes every"),
            "{args:?}: {err}"
        );
    }
    // Readable again: both snapshots restore whole.
    sh(Command::new("chown").arg("65534:65534").arg(&object));
    assert_eq!(env.snapshot_ids().len(), 2);
    for snap in [&first, &second] {
        let out = env.restore(snap, &src, &format!("r-{}", &snap[..8]));
        assert!(out.join("a").exists());
    }
    env.check_clean();
}

/// Gives `env`'s directory (repository, sources, caches) to nobody, all but
/// `kept`, which root keeps to itself (0600).
fn nobodys_but(env: &Env, kept: &Path) {
    use std::os::unix::fs::PermissionsExt;
    sh(Command::new("chmod")
        .args(["-R", "a+rwX"])
        .arg(env.dir.path()));
    sh(Command::new("chown")
        .args(["-R", "65534:65534"])
        .arg(env.dir.path()));
    sh(Command::new("chown").arg("0:0").arg(kept));
    fs::set_permissions(kept, fs::Permissions::from_mode(0o600)).unwrap();
}

/// A repository behind a directory this user may not pass is said to be out of
/// reach, not missing (QA: "there is no repository at ...", which reads as the
/// backups being gone).
#[test]
fn a_repository_out_of_reach_is_not_called_missing() {
    assert!(is_root(), "the test suite runs as root (CI does)");
    let env = Env::new();
    env.init(&[]);
    // The test's directory is 0700 root's: nobody cannot pass it.
    let o = as_nobody(&env, &["snapshots"]);
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(!o.status.success());
    assert!(err.contains("Permission denied"), "{err}");
    assert!(!err.contains("no repository"), "{err}");
}

/// Runs cairn with `args` on `env`'s repository as nobody.
fn as_nobody(env: &Env, args: &[&str]) -> std::process::Output {
    use std::os::unix::process::CommandExt;
    env.cmd(args)
        .env("XDG_CACHE_HOME", env.path("nobody-cache"))
        .uid(65534)
        .gid(65534)
        .output()
        .unwrap()
}

/// A repository on a file system mounted read-only (ext4 after errors): reads
/// go on without a lock, and so do the dry runs of backup, forget, tag, rewrite,
/// recover and `repair snapshots`, which is how an administrator looks at such a
/// repository before it is writable again (QA: they failed writing a lock).
#[test]
fn dry_runs_work_on_a_read_only_repository() {
    let env = Env::new();
    let fs_ = Tmpfs::mount(&env.repo, "size=64m");
    env.init(&[]);
    let src = env.path("src");
    fs::create_dir_all(&src).unwrap();
    fs::write(src.join("a"), b"one").unwrap();
    env.backup(&[&src]);
    fs::write(src.join("a"), b"two").unwrap();
    env.backup(&[&src]);
    fs_.remount("ro");
    let out = env.ok(&["forget", "--keep-last", "1", "--dry-run"]);
    assert!(out.contains("would remove 1 snapshot"), "{out}");
    let out = env.ok(&["repair", "snapshots", "--dry-run"]);
    assert!(
        out.contains("checked 2 snapshots; 0 would be repaired"),
        "{out}"
    );
    // So do those of tag, rewrite and recover (they took a lock to write).
    let out = env.ok(&["tag", "--add", "kept", "--dry-run"]);
    assert!(out.contains("2 snapshots would change"), "{out}");
    let v: serde_json::Value = serde_json::from_str(&env.ok(&[
        "rewrite",
        "--exclude",
        "a",
        "--dry-run",
        "--json",
        "latest",
    ]))
    .unwrap();
    assert_eq!(v["dry_run"], true, "{v}");
    assert_eq!(v["rewritten"][0]["bytes_removed"], 3, "{v}");
    let out = env.ok(&["recover", "--dry-run"]);
    assert!(out.contains("nothing to recover"), "{out}");
    fs::write(src.join("b"), b"new").unwrap();
    let out = env.ok(&["backup", "--dry-run", src.to_str().unwrap()]);
    assert!(out.contains("would add"), "{out}");
    // What writes still says why it cannot.
    let err = env.fails(&["forget", "--keep-last", "1"], 1);
    assert!(
        err.contains("Read-only file system") && err.contains("mounted read-only"),
        "{err}"
    );
    fs_.remount("rw");
    assert_eq!(env.snapshot_ids().len(), 2);
}

/// A repository whose file system has room for bytes but no inodes left says
/// so, not only "no space" (QA: `df -h` showed 52 MB free).
#[test]
fn a_repository_out_of_inodes_says_so() {
    let env = Env::new();
    let _fs = Tmpfs::mount(&env.repo, "size=256m,nr_inodes=24");
    env.init(&[]);
    let src = env.path("src");
    fs::create_dir_all(&src).unwrap();
    fs::write(src.join("big"), Rng(7).bytes(12 << 20, false)).unwrap();
    let err = env.fails(&["backup", "--pack-size", "512K", src.to_str().unwrap()], 1);
    assert!(
        err.contains("no inodes left on the repository's device") && err.contains("df -i"),
        "{err}"
    );
}

/// Bytes free for root on the file system holding `dir`, as `df` says.
fn free_bytes(dir: &Path) -> u64 {
    let o = Command::new("df")
        .args(["--output=avail", "-B1"])
        .arg(dir)
        .output()
        .unwrap();
    let out = String::from_utf8_lossy(&o.stdout);
    out.lines().nth(1).unwrap().trim().parse().unwrap()
}

/// A backup that runs out of room stops short of filling the disk: it leaves the
/// room forget and prune write into before they delete (the index's size plus
/// 1 MiB), so that they free space without the administrator finding something
/// else on the disk to delete first (QA: a datastore filled by backups could not
/// be freed with cairn). Small packs make the disk fill to its last few hundred
/// KiB without that room.
#[test]
fn a_backup_leaves_room_for_forget_and_prune() {
    let env = Env::new();
    let _fs = Tmpfs::mount(&env.repo, "size=24m");
    env.init(&[]);
    let mut ids = Vec::new();
    for (i, name) in ["a", "b", "c"].iter().enumerate() {
        let dir = env.path(name);
        fs::create_dir_all(&dir).unwrap();
        fs::write(dir.join("f"), Rng(40 + i as u64).bytes(8 << 20, false)).unwrap();
    }
    for name in ["a", "b"] {
        let dir = env.path(name);
        ids.push(env.backup_args(&["--pack-size", "512K", dir.to_str().unwrap()]));
    }
    let c = env.path("c");
    let e = env.fails(&["backup", "--pack-size", "512K", c.to_str().unwrap()], 1);
    assert!(
        e.contains("no space left") && e.contains("kept for `cairn forget` and `cairn prune`"),
        "{e}"
    );
    assert_eq!(e.trim().lines().count(), 1, "{e}");
    let index: u64 = fs::read_dir(env.repo.join("index"))
        .unwrap()
        .map(|f| f.unwrap().metadata().unwrap().len())
        .sum();
    // The room was the index plus 1 MiB before the last pack; the stopped backup
    // then wrote the index file of the packs it stored into it (and tmpfs rounds
    // each file up to a 4 KiB page), so most of the margin is left, never less
    // than half (a CI run had 1 MiB less 15 KiB).
    let free = free_bytes(&env.repo);
    assert!(free >= index + (1 << 19), "{free} free, index {index}");
    // Forget and prune free the first backup's room with nothing else deleted,
    // and the backup that did not fit goes in.
    env.ok(&["forget", &ids[0]]);
    env.ok(&["prune"]);
    env.backup_args(&["--pack-size", "512K", c.to_str().unwrap()]);
    env.check_clean();
}

/// `check --read-data` run by a user who may not read a pack says so and asks
/// for access: it is not damage, and the repairs it advised before (`repair
/// index`, then `repair snapshots`) would refuse or drop files (QA).
#[test]
fn check_asks_for_access_to_a_pack_this_user_may_not_read() {
    if !is_root() {
        eprintln!("needs root, to run the check as nobody");
        return;
    }
    let env = Env::new();
    env.init(&[]);
    let src = env.path("src");
    fs::create_dir_all(&src).unwrap();
    fs::write(src.join("a"), Rng(43).bytes(300_000, false)).unwrap();
    env.backup(&[&src]);
    let (pack, _) = files_under(&env.repo.join("data"))
        .into_iter()
        .max_by_key(|(_, size)| *size)
        .unwrap();
    nobodys_but(&env, &pack);
    let o = as_nobody(&env, &["check", "--read-data"]);
    let out = format!(
        "{}{}",
        String::from_utf8_lossy(&o.stdout),
        String::from_utf8_lossy(&o.stderr)
    );
    assert_eq!(o.status.code(), Some(1), "{out}");
    assert!(
        out.contains("1 pack this user may not read: give it read access")
            && out.contains("its data was not verified")
            && out.contains("(1 read in full, "),
        "{out}"
    );
    assert!(
        !out.contains("repair") && !out.contains("damaged"),
        "no repair for what is not damage: {out}"
    );
    sh(Command::new("chown").arg("65534:65534").arg(&pack));
    env.check_clean();
}

/// A command with no safe point of its own to stop at (tag, forget, repair, key,
/// ...) ends at once on Ctrl-C or SIGTERM, which is as safe as a crash, and says
/// so, with status 130 (QA: it died by the signal, silently); with --json the
/// error is a JSON line.
#[test]
fn any_command_interrupted_says_so() {
    let env = Env::new();
    env.init(&[]);
    for (args, json) in [
        (&["tag", "--add", "x", "latest"][..], false),
        (&["--json", "repair", "index"][..], true),
    ] {
        let mut cmd = env.cmd(args);
        // Stalled in the password command, well after the handler is set.
        cmd.env_remove("CAIRN_PASSWORD").env(
            "CAIRN_PASSWORD_COMMAND",
            format!("sleep 2; echo '{PASSWORD}'"),
        );
        let (code, err, _) = interrupted(cmd, std::time::Duration::from_millis(400));
        assert_eq!(code, Some(130), "{args:?}: {err}");
        assert!(
            err.contains("interrupted: stopped at once, which is as safe as a crash"),
            "{args:?}: {err}"
        );
        if json {
            let v: serde_json::Value = serde_json::from_str(err.trim()).unwrap();
            assert_eq!(
                (&v["type"], &v["exit_code"]),
                (&"error".into(), &130.into())
            );
        }
    }
}

/// Ctrl-C at a password prompt on a terminal gives the terminal its echo back
/// (QA: the shell was left typing blind, where restic puts it back).
#[test]
fn ctrl_c_at_a_password_prompt_gives_the_terminal_back() {
    use std::io::Write;
    let env = Env::new();
    env.init(&[]);
    // The Ctrl-C typed on the terminal (ETX) reaches cairn as SIGINT while it
    // waits for the password.
    let mut script = on_a_terminal(
        &env.cmd(&["snapshots"]),
        "echo exit=$?; stty -a | tr ' ' '\\n' | grep -x -- '-\\?echo'",
    );
    script.env_remove("CAIRN_PASSWORD");
    let mut child = script
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    let mut stdin = child.stdin.take().unwrap();
    std::thread::sleep(std::time::Duration::from_millis(1500));
    stdin.write_all(b"\x03").unwrap();
    std::thread::sleep(std::time::Duration::from_millis(1500));
    drop(stdin);
    let o = child.wait_with_output().unwrap();
    let out = String::from_utf8_lossy(&o.stdout);
    assert!(out.contains("enter password"), "{out}");
    assert!(
        out.contains("interrupted") && out.contains("exit=130"),
        "{out}"
    );
    assert!(
        out.lines().any(|l| l.trim() == "echo") && !out.contains("-echo"),
        "{out}"
    );
}

/// A repository location that cannot be one is a usage error (exit 2) said at
/// once: a server address whose port is not a port is not retried for a minute
/// as a network fault (QA), and another tool's URL is not taken for a directory.
#[test]
fn locations_that_cannot_be_are_usage_errors_at_once() {
    let env = Env::new();
    for (repo, says) in [
        ("cairn+https://127.0.0.1:notaport/main", "invalid port"),
        ("cairn+https://127.0.0.1:99999/main", "invalid port"),
        ("cairn+https://127.0.0.1:8443/", "DATASTORE"),
        ("https://backup.example/main", "cairn+https://"),
        ("rest:https://backup.example/main", "REST"),
    ] {
        let started = std::time::Instant::now();
        // The last --repo given is the one taken.
        let o = env
            .cmd(&["--repo", repo, "snapshots"])
            .env("CAIRN_TOKEN", "x")
            .output()
            .unwrap();
        let err = String::from_utf8_lossy(&o.stderr);
        assert_eq!(o.status.code(), Some(2), "{repo}: {err}");
        assert!(err.contains(says), "{repo}: {err}");
        assert!(
            started.elapsed() < std::time::Duration::from_secs(10),
            "{repo}"
        );
    }
}

/// A local repository whose folders or objects were moved to another disk and
/// linked back reads as before (QA: a linked `data/xx` folder was skipped, so
/// `check` called its packs lost and advised the repair that drops their files,
/// and a linked snapshot was not listed). Something not a file in an object's
/// place (a FIFO) is damage to that object, said as such by every command: it
/// no longer hides a snapshot (`latest` silently an older one), nor stops
/// `repair index`.
#[test]
fn linked_objects_are_read_and_odd_ones_are_damage() {
    use std::os::unix::fs::symlink;
    let env = Env::new();
    env.init(&[]);
    let src = small_tree(&env);
    let first = env.backup_args(&["--pack-size", "128K", src.to_str().unwrap()]);
    fs::write(src.join("keep/new.txt"), b"day two").unwrap();
    let second = env.backup_args(&["--pack-size", "128K", src.to_str().unwrap()]);
    let away = env.path("other-disk");
    fs::create_dir(&away).unwrap();
    let mut moved = 0;
    for d in fs::read_dir(env.repo.join("data")).unwrap() {
        let d = d.unwrap().path();
        let to = away.join(d.file_name().unwrap());
        fs::rename(&d, &to).unwrap();
        symlink(&to, &d).unwrap();
        moved += 1;
    }
    assert!(moved > 1);
    let snap = env.repo.join("snapshots").join(&first);
    fs::rename(&snap, away.join("snap")).unwrap();
    symlink(away.join("snap"), &snap).unwrap();
    env.check_clean();
    assert_eq!(env.snapshot_ids(), [first.clone(), second.clone()]);
    let got = env.restore(&first, &src, "r1");
    assert_eq!(
        fs::read(got.join("keep/a.bin")).unwrap(),
        fs::read(src.join("keep/a.bin")).unwrap()
    );

    // A FIFO where the newest snapshot was: listed as damaged; `latest` will not
    // quietly be the older one; forget removes it.
    let newest = env.repo.join("snapshots").join(&second);
    fs::remove_file(&newest).unwrap();
    sh(Command::new("mkfifo").arg(&newest));
    let e = env.fails(&["snapshots"], 1);
    assert!(
        e.contains(&second) && e.contains("damaged") && e.contains("not a regular file"),
        "{e}"
    );
    let e = env.fails(&["ls", "latest"], 1);
    assert!(e.contains("`latest` is uncertain"), "{e}");
    let o = env.run(&["check"]);
    assert_eq!(o.status.code(), Some(1));
    let out = String::from_utf8_lossy(&o.stdout);
    assert!(
        out.contains(&second) && out.contains("not a regular file"),
        "{out}"
    );
    env.ok(&["forget", &second]);
    assert!(!newest.exists());

    // A FIFO in an index file's place: set aside, its blobs missing until repair.
    let (index, _) = files_under(&env.repo.join("index"))
        .into_iter()
        .next()
        .unwrap();
    fs::remove_file(&index).unwrap();
    sh(Command::new("mkfifo").arg(&index));
    let e = env.fails(&["check"], 1);
    assert!(
        e.contains("index file") && e.contains("not a regular file"),
        "{e}"
    );
    env.ok(&["repair", "index"]);
    env.check_clean();

    // A FIFO in a pack's place (inside a linked folder): a damaged pack, which
    // repair index reads around and repair snapshots then deals with.
    let pack = largest_pack(&env.repo);
    fs::remove_file(&pack).unwrap();
    sh(Command::new("mkfifo").arg(&pack));
    let e = env.fails(&["check"], 1);
    assert!(e.contains("problem"), "{e}");
    let out = env.ok(&["repair", "index"]);
    assert!(out.contains("not a regular file"), "{out}");
    env.ok(&["repair", "snapshots"]);
    env.ok(&["prune"]);
    env.check_clean();
}

/// A restore and an export under a file-size limit (`ulimit -f`) below a file's
/// size: a message that says why, the other files restored, and nothing left of
/// the one that could not be (QA: SIGXFSZ ended the process, exit 153, leaving
/// an empty file of mode 0600 and a hidden partial export).
#[test]
fn a_file_size_limit_is_an_error_not_a_signal() {
    let env = Env::new();
    env.init(&[]);
    let src = env.path("src");
    fs::create_dir_all(&src).unwrap();
    fs::write(src.join("big"), Rng(7).bytes(6 << 20, false)).unwrap();
    fs::write(src.join("small"), b"fits").unwrap();
    env.backup(&[&src]);
    let limited = |args: &[&str]| {
        let mut cmd = env.cmd(args);
        limit(&mut cmd, libc::RLIMIT_FSIZE, 4 << 20);
        let o = cmd.stdout(Stdio::null()).output().unwrap();
        (
            o.status.code(),
            String::from_utf8_lossy(&o.stderr).into_owned(),
        )
    };
    let out = env.path("out");
    let (code, err) = limited(&["restore", "latest", "--target", out.to_str().unwrap()]);
    assert_eq!(code, Some(1), "{err}");
    assert!(err.contains("ulimit -f"), "{err}");
    let back = out.join(src.strip_prefix("/").unwrap());
    assert_eq!(fs::read(back.join("small")).unwrap(), b"fits");
    assert!(!back.join("big").exists(), "an empty file was left");
    let tar = env.path("out.tar");
    let (code, err) = limited(&["export", "latest", "-o", tar.to_str().unwrap()]);
    assert_eq!(code, Some(1), "{err}");
    assert!(err.contains("File too large"), "{err}");
    let left: Vec<_> = fs::read_dir(env.path(""))
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .filter(|n| n.contains("out.tar"))
        .collect();
    assert!(left.is_empty(), "{left:?}");
}

/// A dry run by a user over a target holding directories of theirs they may not
/// read now (chmod 000) says what the restore will do with them, as the restore
/// does it (makes them readable): no error and exit 0 where the restore has none
/// (QA: the preview failed and said "would delete 0" where the restore deleted).
#[test]
fn a_dry_run_counts_the_users_unreadable_directories_as_the_restore_treats_them() {
    use std::os::unix::fs::PermissionsExt;
    assert!(is_root(), "the test suite runs as root (CI does)");
    let env = Env::new();
    env.init(&[]);
    let src = env.path("src");
    fs::create_dir_all(src.join("d/sub")).unwrap();
    fs::write(src.join("d/f"), b"f").unwrap();
    fs::write(src.join("d/sub/g"), b"g").unwrap();
    let snap = env.backup(&[&src]);
    let kept = env.path("kept");
    fs::write(&kept, b"").unwrap();
    nobodys_but(&env, &kept);
    let t = env.path("t");
    let ts = t.to_str().unwrap();
    let o = as_nobody(&env, &["restore", &snap, "-t", ts]);
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let d = t.join(src.join("d").strip_prefix("/").unwrap());
    fs::create_dir_all(d.join("old/x")).unwrap();
    fs::write(d.join("old/x/r"), b"r").unwrap();
    sh(Command::new("chown")
        .args(["-R", "65534:65534"])
        .arg(d.join("old")));
    for dir in ["old", "sub"] {
        fs::set_permissions(d.join(dir), fs::Permissions::from_mode(0o000)).unwrap();
    }
    let o = as_nobody(&env, &["restore", &snap, "-t", ts, "--delete", "--dry-run"]);
    let (out, err) = (
        String::from_utf8_lossy(&o.stdout),
        String::from_utf8_lossy(&o.stderr),
    );
    assert!(o.status.success(), "{out}{err}");
    assert!(
        out.contains(&format!("would delete {}", d.join("old").display())),
        "{out}"
    );
    assert!(err.contains("sub: not readable now"), "{err}");
    assert!(
        err.contains("old: 1 directory is not readable now"),
        "{err}"
    );
    let o = as_nobody(&env, &["restore", &snap, "-t", ts, "--delete"]);
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    assert!(!d.join("old").exists());
    assert_eq!(fs::read(d.join("sub/g")).unwrap(), b"g");
}

/// A config whose MAC is damaged (or whose value was edited by hand) points to
/// `repair config`, which proves the key the password opens against the
/// snapshots and seals the config again; a config only reformatted (an editor's
/// spaces) opens as it is; a key from another repository is not used to seal
/// it (QA: the advice was to remove the only key file, and nothing could
/// repair the config).
#[test]
fn a_config_that_does_not_authenticate_is_sealed_again_by_repair_config() {
    let env = Env::new();
    env.init(&[]);
    let src = env.path("src");
    fs::create_dir_all(&src).unwrap();
    fs::write(src.join("f"), b"kept\n").unwrap();
    env.backup(&[&src]);
    let cfg = env.repo.join("config");
    let orig = fs::read_to_string(&cfg).unwrap();
    // Reformatted: the same settings, other spaces.
    fs::write(&cfg, orig.replace("\n  \"", "\n     \"")).unwrap();
    assert_ne!(fs::read_to_string(&cfg).unwrap(), orig);
    env.ok(&["snapshots"]);
    // The MAC damaged.
    let pos = orig.find("\"mac\": \"").unwrap() + 8;
    let mut bad = orig.clone().into_bytes();
    bad[pos] = if bad[pos] == b'0' { b'1' } else { b'0' };
    fs::write(&cfg, &bad).unwrap();
    let e = env.fails(&["snapshots"], 1);
    assert!(e.contains("`cairn repair config`"), "{e}");
    assert!(!e.contains("should be removed"), "{e}");
    let dry = env.ok(&["repair", "config", "--dry-run"]);
    assert!(dry.contains("would be sealed again"), "{dry}");
    assert_eq!(fs::read(&cfg).unwrap(), bad);
    let out = env.ok(&["repair", "config"]);
    assert!(
        out.contains("config sealed again with key") && out.contains("opens snapshot"),
        "{out}"
    );
    env.check_clean();
    let out = env.ok(&["repair", "config"]);
    assert!(out.contains("nothing to repair"), "{out}");
    // A key file of another repository with the same password, in place of the
    // repository's own: it opens, but not the snapshots; nothing is sealed.
    let other = Env::new();
    other.init(&[]);
    let keys = |e: &Env| {
        fs::read_dir(e.repo.join("keys"))
            .unwrap()
            .map(|d| d.unwrap().path())
            .collect::<Vec<_>>()
    };
    let own = keys(&env);
    for k in &own {
        fs::rename(k, env.path("saved-key")).unwrap();
    }
    let foreign = &keys(&other)[0];
    fs::copy(
        foreign,
        env.repo.join("keys").join(foreign.file_name().unwrap()),
    )
    .unwrap();
    fs::write(&cfg, &bad).unwrap();
    let e = env.fails(&["repair", "config"], 1);
    assert!(e.contains("not this repository's key"), "{e}");
    assert_eq!(fs::read(&cfg).unwrap(), bad);
}

/// A value that cannot be taken exits 2, as the README says, whichever check
/// finds it (QA r15: these exited 1, as a failed run does, and `--pack-size 1K`
/// read "backup failed"); nothing is written.
#[test]
fn option_values_that_cannot_be_taken_exit_2() {
    let env = Env::new();
    env.init(&[]);
    let src = env.path("src");
    std::fs::create_dir_all(&src).unwrap();
    let s = src.to_str().unwrap();
    let cases: &[&[&str]] = &[
        &["backup", "--time", "garbage", s],
        &["backup", "--pack-size", "1K", s],
        &["forget", "--keep-daily", "abc", "-n"],
        &["forget", "--keep-within", "garbage", "-n"],
        &["forget", "--keep-last", "99999999999999999999", "-n"],
        &["check", "--read-data-subset", "0/0"],
        &["check", "--read-data-subset", "101%"],
        &["check", "--read-data-subset", "0"],
        &["--threads", "0", "snapshots"],
        &["find", "x", "--newest", "0"],
        // QA r16.
        &["--retry-for", "x", "snapshots"],
        &["--retry-lock", "5q", "snapshots"],
        &["--priority", "bogus", "snapshots"],
        &["--memory-limit", "0", "snapshots"],
        &["prune", "--max-unused", "150%", "-n"],
        &["config", "--max-concurrent-jobs", "0"],
        &["config", "--pack-size", "300M"],
        &["index", "--index-placement", "bogus"],
        &["serve", "--listen", "bogus"],
        &["serve", "--datastore", "bogus"],
    ];
    for args in cases {
        let err = env.fails(args, 2);
        assert!(!err.contains("backup failed"), "{args:?}: {err}");
    }
    assert!(env.snapshot_ids().is_empty());
}
