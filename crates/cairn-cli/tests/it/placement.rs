//! The SSD placement of the index: every command works as with the RAM placement,
//! the placement can be changed and moved at any time, and it costs under 2 bytes
//! of RAM per blob.

use crate::util::*;
use std::fs;

fn index_json(env: &Env) -> serde_json::Value {
    serde_json::from_str(&env.ok(&["index", "--json"])).unwrap()
}

#[test]
fn backups_on_the_ssd_placement_deduplicate_and_restore_exactly() {
    let env = Env::new();
    let ssd = env.path("ssd");
    init_ssd(&env, &ssd);
    let src = env.path("src");
    make_full_tree(&src, 11);
    let mut rng = Rng(5);
    fs::write(src.join("big"), rng.bytes(3 << 20, false)).unwrap();
    let first = env.backup_json(&[&src]);
    let v = index_json(&env);
    assert_eq!(v["placement"], "ssd");
    assert!(
        v["path"]
            .as_str()
            .unwrap()
            .starts_with(ssd.to_str().unwrap()),
        "{v}"
    );
    let blobs = v["blobs"].as_u64().unwrap();
    assert!(blobs > 700, "{v}");
    assert!(v["disk_bytes"].as_u64().unwrap() > blobs * 47, "{v}");
    // `stats` gives the SSD placement's memory, as `index` does, not the RAM
    // placement's (QA: 28 times too high), and its local disk.
    let st: serde_json::Value = serde_json::from_str(&env.ok(&["stats", "--json"])).unwrap();
    assert_eq!(st["index"]["placement"], "ssd", "{st}");
    assert!(
        st["index"]["ram_bytes"].as_u64().unwrap() < blobs * 12,
        "{st}"
    );
    assert!(
        st["index"]["local_disk_bytes"].as_u64().unwrap() > blobs * 47,
        "{st}"
    );
    assert!(env.ok(&["stats"]).contains("of local disk (SSD placement)"));

    // The same data again: nothing new is stored (every chunk found on disk).
    let second = env.backup_json(&[&src]);
    assert!(first["data_added"].as_u64().unwrap() > 3 << 20, "{first}");
    assert!(
        second["data_added"].as_u64().unwrap() < 64 << 10,
        "{second}"
    );
    // Changed data among known data, from a different path (no parent): the
    // known chunks are found through the SSD index, not the parent snapshot.
    let other = env.path("other");
    copy_tree(&src, &other);
    fs::write(other.join("new"), rng.bytes(200_000, false)).unwrap();
    let third = env.backup_json(&[&other]);
    let added = third["data_added"].as_u64().unwrap();
    assert!((200_000..400_000).contains(&added), "{third}");

    for (i, (snap, dir)) in [(&second, &src), (&third, &other)].iter().enumerate() {
        let id = snap["snapshot_id"].as_str().unwrap();
        let copy = env.restore(id, dir, &format!("r{i}"));
        assert_same(dir, &copy);
    }
    env.check_clean();

    // Prune rewrites the index files; the SSD index follows.
    let ids = env.snapshot_ids();
    env.ok(&["forget", &ids[0], &ids[1]]);
    env.ok(&["prune", "--max-unused", "0%"]);
    let copy = env.restore("latest", &other, "after-prune");
    assert_same(&other, &copy);

    // Move it, then back to RAM, then to SSD again: same answers each time.
    let moved = env.path("moved");
    let v = serde_json::from_str::<serde_json::Value>(&env.ok(&[
        "index",
        "--path",
        moved.to_str().unwrap(),
        "--json",
    ]))
    .unwrap();
    assert!(
        v["path"]
            .as_str()
            .unwrap()
            .starts_with(moved.to_str().unwrap())
    );
    assert!(
        !ssd.join(v["path"].as_str().unwrap().rsplit('/').nth(1).unwrap())
            .exists(),
        "old files removed"
    );
    let on_ssd = v["blobs"].as_u64().unwrap();
    let v = serde_json::from_str::<serde_json::Value>(&env.ok(&[
        "index",
        "--placement",
        "ram",
        "--json",
    ]))
    .unwrap();
    assert_eq!(v["placement"], "ram");
    assert_eq!(v["blobs"].as_u64().unwrap(), on_ssd);
    assert!(v["ram_bytes_per_blob"].as_f64().unwrap() < 48.0, "{v}");
    let v = serde_json::from_str::<serde_json::Value>(&env.ok(&[
        "index",
        "--placement",
        "ssd",
        "--json",
    ]))
    .unwrap();
    assert_eq!(v["blobs"].as_u64().unwrap(), on_ssd);
    assert!(v["ram_bytes_per_blob"].as_f64().unwrap() < 2.0, "{v}");
    let copy = env.restore("latest", &other, "after-moves");
    assert_same(&other, &copy);

    // A damaged local index is rebuilt from the repository, never trusted.
    let dir = std::path::PathBuf::from(v["path"].as_str().unwrap());
    fs::write(dir.join("keys.bin"), b"garbage").unwrap();
    let copy = env.restore("latest", &other, "after-damage");
    assert_same(&other, &copy);

    env.fails(&["index", "--placement", "floppy"], 2);
    // A directory given where the index is in RAM: refused, not ignored.
    let ram = Env::new();
    let e = ram.fails(&["init", "--index-path", "/tmp/x"], 1);
    assert!(e.contains("goes with --index-placement ssd"), "{e}");
    ram.init(&[]);
    let e = ram.fails(&["index", "--index-path", "/tmp/x"], 1);
    assert!(e.contains("give --index-placement ssd with it"), "{e}");

    // A directory that cannot take the index changes nothing: it stays where it
    // was and every command goes on working.
    let file = env.path("a-file");
    fs::write(&file, b"x").unwrap();
    let before = index_json(&env);
    let o = env.run(&["index", "--index-path", file.to_str().unwrap()]);
    let e = String::from_utf8_lossy(&o.stderr);
    assert_eq!(o.status.code(), Some(1), "{e}");
    assert!(e.contains("config was not changed"), "{e}");
    assert_eq!(index_json(&env)["path"], before["path"]);
    // A move to RAM with a directory is refused (which was meant?); without, it
    // needs no directory.
    let e = env.fails(
        &[
            "index",
            "--index-placement",
            "ram",
            "--index-path",
            file.to_str().unwrap(),
        ],
        1,
    );
    assert!(e.contains("a RAM index has no directory"), "{e}");
    env.ok(&["index", "--index-placement", "ram"]);
    // With CAIRN_INDEX_PATH set, the build would check that path and the
    // repository would keep the other: refused.
    let o = env
        .cmd(&[
            "index",
            "--index-placement",
            "ssd",
            "--index-path",
            file.to_str().unwrap(),
        ])
        .env("CAIRN_INDEX_PATH", env.path("elsewhere"))
        .output()
        .unwrap();
    let e = String::from_utf8_lossy(&o.stderr);
    assert_eq!(o.status.code(), Some(1), "{e}");
    assert!(e.contains("CAIRN_INDEX_PATH is set"), "{e}");
    let copy = env.restore("latest", &other, "after-refused-move");
    assert_same(&other, &copy);
}

/// The current build directory of the SSD index under `ssd`.
fn current_build(ssd: &std::path::Path) -> std::path::PathBuf {
    let repo_dir = fs::read_dir(ssd).unwrap().next().unwrap().unwrap().path();
    let name = fs::read_to_string(repo_dir.join("CURRENT")).unwrap();
    repo_dir.join(name.trim())
}

/// Flips 2% of a file's bytes.
fn flip(path: &std::path::Path) {
    let mut data = fs::read(path).unwrap();
    let n = (data.len() / 50).max(1);
    let step = (data.len() / n).max(1);
    for i in (0..data.len()).step_by(step).take(n) {
        data[i] ^= 0x5a;
    }
    fs::write(path, data).unwrap();
}

/// See: issue "a damaged local SSD-index cache breaks every restore while check
/// passes" (2% of packs.bin or filter.bin flipped: every restore failed with
/// "missing from the index", check said no errors).
#[test]
fn a_damaged_ssd_index_is_found_and_rebuilt() {
    let env = Env::new();
    let ssd = env.path("ssd");
    init_ssd_with(&env, &ssd, &[]);
    let src = env.path("src");
    make_full_tree(&src, 5);
    let mut rng = Rng(9);
    fs::write(src.join("big"), rng.bytes(2 << 20, false)).unwrap();
    let id = env.backup(&[&src]);
    // (check brings the build up to date: damage in a build that is out of
    // date anyway is not told apart from its being out of date.)
    env.ok(&["check"]);
    for (i, name) in ["packs.bin", "filter.bin"].iter().enumerate() {
        flip(&current_build(&ssd).join(name));
        // Found when the index is opened, rebuilt, said, and the restore is exact.
        let target = env.path(&format!("r{i}"));
        let o = env.run(&["restore", &id, "--target", target.to_str().unwrap()]);
        let err = String::from_utf8_lossy(&o.stderr);
        assert!(o.status.success(), "{err}");
        assert!(
            err.contains("local SSD index was damaged") && err.contains(name),
            "{err}"
        );
        assert_same(&src, &target.join(src.strip_prefix("/").unwrap()));
    }
    // Damage in the large files: check finds it and rebuilds.
    flip(&current_build(&ssd).join("records.bin"));
    let o = env.run(&["check", "--read-data"]);
    let err = String::from_utf8_lossy(&o.stderr);
    assert_eq!(o.status.code(), Some(0), "{err}");
    assert!(
        err.contains("local SSD index") && err.contains("rebuilt"),
        "{err}"
    );
    let v: serde_json::Value = serde_json::from_str(&env.ok(&["check", "--json"])).unwrap();
    assert_eq!(v["local_index"]["state"], "intact", "{v}");
    // A restore or a backup that meets such damage rebuilds the files from the
    // repository and goes on: the restore is exact, the backup deduplicates
    // against what the damaged files held, and each says what it met. (Before,
    // the restore failed with "missing from the index" and the backup stored
    // every chunk again.)
    flip(&current_build(&ssd).join("keys.bin"));
    let target = env.path("r-after-keys");
    let o = env.run(&["restore", &id, "--target", target.to_str().unwrap()]);
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(o.status.success(), "{err}");
    assert!(err.contains("local SSD index was damaged"), "{err}");
    assert_same(&src, &target.join(src.strip_prefix("/").unwrap()));
    let other = env.path("elsewhere");
    copy_tree(&src, &other);
    // (check builds afresh the index the restore left marked, then it is damaged.)
    env.ok(&["check"]);
    flip(&current_build(&ssd).join("records.bin"));
    let o = env.run(&["backup", "--json", other.to_str().unwrap()]);
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(o.status.success(), "{err}");
    let v: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
    assert!(v["index_repaired"].is_string(), "{v}");
    // Said as a warning event, as --json says everything on stderr.
    let said = err.lines().any(|l| {
        serde_json::from_str::<serde_json::Value>(l)
            .is_ok_and(|e| e.to_string().contains("warning") && l.contains("SSD index was damaged"))
    });
    assert!(said, "{err}");
    assert!(v.get("index_lookup_failures").is_none(), "{v}");
    assert!(v["data_added"].as_u64().unwrap() < 64 << 10, "{v}");
    let copy = env.restore(v["snapshot_id"].as_str().unwrap(), &other, "r-again");
    assert_same(&other, &copy);
    // Damage check meets after the repository's index changed (a backup made
    // through another index directory): the update of the build keeps the
    // damaged files, and check finds them there (QA: "no errors were found").
    env.ok(&["check"]);
    flip(&current_build(&ssd).join("records.bin"));
    fs::write(other.join("newer"), rng.bytes(300_000, false)).unwrap();
    let o = env
        .cmd(&["backup", other.to_str().unwrap()])
        .env("CAIRN_INDEX_PATH", env.path("another-index"))
        .output()
        .unwrap();
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let o = env.run(&["check"]);
    let err = String::from_utf8_lossy(&o.stderr);
    assert_eq!(o.status.code(), Some(0), "{err}");
    assert!(
        err.contains("local SSD index") && err.contains("rebuilt"),
        "{err}"
    );
}

/// A run's claims on local disk: a backup whose new chunks outgrow the cap of
/// ids held in RAM (1,024 here, through the test hook; millions by default)
/// spills them to runs, and still stores each chunk once, whichever file meets
/// it first: the same blobs as a backup that kept them all in RAM, restored
/// exactly.
#[test]
fn a_backup_past_its_claims_cap_stores_each_chunk_once() {
    let src_env = Env::new();
    let src = src_env.path("src");
    fs::create_dir_all(&src).unwrap();
    // 12 MiB in 4 KiB chunks, then the same content three more times under
    // other names: 3/4 of the chunks are met again in the same run.
    let data = Rng(31).bytes(12 << 20, false);
    for i in 0..4 {
        fs::write(src.join(format!("copy{i}")), &data).unwrap();
    }
    // Two copies of one new repository: the same key, so the same chunks.
    src_env.init(&["--block-size", "4K"]);
    let mut added = Vec::new();
    for cap in [None, Some("1024")] {
        let env = Env::new();
        copy_tree(&src_env.repo, &env.repo);
        let mut c = env.cmd(&["backup", "--json", src.to_str().unwrap()]);
        if let Some(cap) = cap {
            c.env("CAIRN_TEST_CLAIMS_CAP", cap);
        }
        let o = c.output().unwrap();
        assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
        let v: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
        let on_disk = v["claims_on_disk"].as_u64().unwrap_or(0);
        assert_eq!(on_disk > 1024, cap.is_some(), "{v}");
        added.push((
            v["blobs_added"].as_u64().unwrap(),
            v["data_added"].as_u64().unwrap(),
        ));
        let out = env.restore("latest", &src, "r");
        assert_same(&src, &out);
        env.check_clean();
    }
    // The same blobs; their bytes differ only by the trees of the directories
    // above the source (/tmp's times move as other tests run).
    assert_eq!(
        added[0].0, added[1].0,
        "stored once each, spilled or not: {added:?}"
    );
    assert!(added[0].1.abs_diff(added[1].1) < 1024, "{added:?}");
    assert!(added[0].1 < 13 << 20, "{added:?}");
}

/// Without a configured path, the SSD placement's files go where `--cache-dir`
/// says (as the caches of remote repositories do), and `config` shows where.
#[test]
fn the_ssd_index_follows_the_cache_dir_and_config_says_where() {
    let env = Env::new();
    env.init(&[]);
    let src = env.path("src");
    make_full_tree(&src, 3);
    env.backup(&[&src]);
    let cache = env.path("elsewhere");
    let c = cache.to_str().unwrap();
    let v: serde_json::Value = serde_json::from_str(&env.ok(&[
        "--cache-dir",
        c,
        "index",
        "--index-placement",
        "ssd",
        "--json",
    ]))
    .unwrap();
    let path = v["path"].as_str().unwrap();
    assert!(path.starts_with(&format!("{c}/index/")), "{v}");
    assert!(std::path::Path::new(path).is_dir());
    let v: serde_json::Value =
        serde_json::from_str(&env.ok(&["--cache-dir", c, "config", "--json"])).unwrap();
    assert_eq!(v["index_placement"], "ssd");
    assert_eq!(v["index_path"].as_str().unwrap(), format!("{c}/index"));
    let text = env.ok(&["--cache-dir", c, "config"]);
    assert!(text.contains(&format!("ssd, in {c}/index")), "{text}");
    let copy = env.restore("latest", &src, "r");
    assert_same(&src, &copy);
}

/// The SSD placement's local files are a cache: a restore or a prune on a
/// machine whose disk for them is full reads the index into memory for that run
/// instead of failing, and says so.
#[test]
fn a_restore_reads_the_index_into_memory_when_its_disk_is_full() {
    let env = Env::new();
    let holder = env.path("idx");
    let _fs = Tmpfs::mount(&holder, "size=2m");
    init_ssd(&env, &holder);
    let src = env.path("src");
    make_full_tree(&src, 3);
    env.backup(&[&src]);
    {
        let mut filler = fs::File::create(holder.join("filler")).unwrap();
        let block = vec![7u8; 1 << 16];
        while std::io::Write::write_all(&mut filler, &block).is_ok() {}
    }
    fs::write(src.join("more.bin"), Rng(4).bytes(4 << 20, false)).unwrap();
    let o = env.run(&["backup", src.to_str().unwrap()]);
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(o.status.success(), "{err}");
    let o = env.run(&[
        "restore",
        "latest",
        "--target",
        env.path("out").to_str().unwrap(),
    ]);
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(o.status.success(), "{err}");
    assert!(
        err.contains("reads the index into memory instead") && err.contains("make room there"),
        "{err}"
    );
    assert_same(&src, &env.path("out").join(src.strip_prefix("/").unwrap()));
    // So does prune, which may be what frees the space (QA: it failed, blaming
    // the repository's storage).
    let ids = env.snapshot_ids();
    env.ok(&["forget", &ids[0]]);
    let o = env.run(&["prune"]);
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(o.status.success(), "{err}");
    assert!(err.contains("reads the index into memory instead"), "{err}");
    env.check_clean();
}

/// A user with no directory for the SSD placement's files (no `HOME`, no
/// `XDG_CACHE_HOME`, no home directory: a service account) reads the index into
/// memory, as when those files cannot be written (QA: every command failed).
#[test]
fn without_a_home_the_ssd_placement_reads_the_index_into_memory() {
    if !is_root() {
        eprintln!("needs root, to run as nobody");
        return;
    }
    let env = Env::new();
    env.init(&["--index-placement", "ssd"]);
    let src = env.path("src");
    fs::create_dir_all(src.join("d")).unwrap();
    for i in 0..20u64 {
        fs::write(
            src.join(format!("d/f{i}")),
            Rng(i).bytes(50_000, i % 2 == 0),
        )
        .unwrap();
    }
    env.backup(&[&src]);
    let (target, _) = open_to_nobody(&env);
    let mut cmd = env.cmd(&["restore", "latest", "--target", target.to_str().unwrap()]);
    cmd.env_remove("HOME").env_remove("XDG_CACHE_HOME");
    let o = {
        use std::os::unix::process::CommandExt;
        cmd.uid(65534).gid(65534).output().unwrap()
    };
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(o.status.success(), "{err}");
    assert!(
        err.contains("no directory for the SSD index")
            && err.contains("reads the index into memory instead"),
        "{err}"
    );
    let back = target.join(src.strip_prefix("/").unwrap());
    for i in 0..20 {
        let name = format!("d/f{i}");
        assert_eq!(
            fs::read(back.join(&name)).unwrap(),
            fs::read(src.join(&name)).unwrap()
        );
    }
}

/// A repository of 4 KiB blocks with the SSD index placement in `dir`.
fn init_ssd(env: &Env, dir: &std::path::Path) {
    init_ssd_with(env, dir, &["--block-size", "4K"]);
}

/// A repository with the SSD index placement in `dir`, made with `extra`.
fn init_ssd_with(env: &Env, dir: &std::path::Path, extra: &[&str]) {
    let mut args = extra.to_vec();
    args.extend([
        "--index-placement",
        "ssd",
        "--index-path",
        dir.to_str().unwrap(),
    ]);
    env.init(&args);
}

/// A junk index file (a 1 KiB one, or one larger than cairn writes) in a
/// repository of the SSD placement: the index is built without it, and every
/// command goes on with a warning, as in the RAM placement (QA: "SSD index is out
/// of date" from restore, check, backup and prune: the fresh build was refused
/// for the damage it recorded).
#[test]
fn a_junk_index_file_is_passed_over_by_the_ssd_placement() {
    let env = Env::new();
    let ssd = env.path("ssd");
    init_ssd_with(&env, &ssd, &[]);
    let src = env.path("src");
    make_full_tree(&src, 7);
    let id = env.backup(&[&src]);
    for (n, size) in [(0x4a, 1024u64), (0x4b, (128 << 20) + 1)] {
        let junk = env.repo.join("index").join(format!("{n:x}").repeat(32));
        fs::File::create(&junk).unwrap().set_len(size).unwrap();
        let target = env.path(&format!("r{n}"));
        let o = env.run(&["restore", &id, "--target", target.to_str().unwrap()]);
        let err = String::from_utf8_lossy(&o.stderr);
        assert!(o.status.success(), "{err}");
        assert!(err.contains("damaged"), "{err}");
        assert_same(&src, &target.join(src.strip_prefix("/").unwrap()));
        let o = env.run(&["backup", src.to_str().unwrap()]);
        assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
        let o = env.run(&["check"]);
        let out = String::from_utf8_lossy(&o.stdout);
        assert!(
            !o.status.success() && out.contains(&format!("{n:x}").repeat(32)),
            "{out}"
        );
    }
    env.ok(&["repair", "index"]);
    env.check_clean();
}
