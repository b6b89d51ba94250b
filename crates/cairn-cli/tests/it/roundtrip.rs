use crate::util::*;
use std::fs;
use std::io::Write;
use std::process::Stdio;

#[test]
fn comparer_detects_every_difference() {
    // The comparer must not be able to pass on a difference: change one attribute at a
    // time in a copy and expect a report each time.
    let env = Env::new();
    let a = env.path("a");
    make_full_tree(&a, 1);
    type Mutation = (&'static str, fn(&std::path::Path));
    let mutations: Vec<Mutation> = vec![
        ("content", |b| {
            let p = b.join("dir/random.bin");
            let mut d = fs::read(&p).unwrap();
            d[1000] ^= 1;
            let t = fs::symlink_metadata(&p).unwrap();
            fs::write(&p, d).unwrap();
            use std::os::unix::fs::MetadataExt;
            set_times(&p, t.mtime(), t.mtime_nsec());
        }),
        ("mode", |b| {
            use std::os::unix::fs::PermissionsExt;
            fs::set_permissions(b.join("script.sh"), fs::Permissions::from_mode(0o700)).unwrap();
        }),
        ("mtime", |b| {
            set_times(&b.join("small.txt"), 1_600_000_000, 1)
        }),
        ("xattr", |b| {
            xattr::set(b.join("small.txt"), "user.note", b"changed").unwrap()
        }),
        ("symlink", |b| {
            fs::remove_file(b.join("link-rel")).unwrap();
            std::os::unix::fs::symlink("other", b.join("link-rel")).unwrap();
        }),
        ("hardlink", |b| {
            let d = fs::read(b.join("hard-2")).unwrap();
            fs::remove_file(b.join("hard-2")).unwrap();
            fs::write(b.join("hard-2"), d).unwrap();
        }),
        ("missing", |b| fs::remove_file(b.join("empty")).unwrap()),
        ("sparse", |b| {
            let p = b.join("sparse");
            let d = fs::read(&p).unwrap();
            fs::remove_file(&p).unwrap();
            fs::write(&p, d).unwrap();
        }),
    ];
    for (i, (what, m)) in mutations.into_iter().enumerate() {
        let b = env.path(&format!("b{i}"));
        copy_tree(&a, &b);
        assert!(
            compare(&a, &b).is_empty(),
            "copy of the tree differs before mutation {what}: {:?}",
            compare(&a, &b)
        );
        m(&b);
        assert!(
            !compare(&a, &b).is_empty(),
            "comparer missed a {what} difference"
        );
    }
}

#[test]
fn full_tree_round_trips_exactly() {
    let env = Env::new();
    env.init(&[]);
    let src = env.path("src");
    make_full_tree(&src, 7);
    let snap = env.backup(&[&src]);
    let restored = env.restore(&snap, &src, "out");
    assert_same(&src, &restored);
    assert_rsync_same(&src, &restored);
    env.check_clean();
}

#[test]
fn small_blocks_unencrypted_and_deep_chunk_lists() {
    // 4 KiB blocks: a 24 MB file has more than 4096 chunks (two chunk-list levels).
    let env = Env::new();
    env.init(&[
        "--block-size",
        "4K",
        "--no-encryption",
        "--compression",
        "max",
    ]);
    let src = env.path("src");
    fs::create_dir_all(&src).unwrap();
    let mut rng = Rng(99);
    fs::write(src.join("image.raw"), rng.bytes(24 << 20, false)).unwrap();
    fs::write(src.join("log.txt"), rng.bytes(1 << 20, true)).unwrap();
    let snap = env.backup(&[&src]);
    let restored = env.restore(&snap, &src, "out");
    assert_same(&src, &restored);
    // Dump streams the same bytes.
    let out = env
        .cmd(&["dump", &snap, &format!("{}/image.raw", src.display())])
        .output()
        .unwrap();
    assert!(out.status.success());
    assert_eq!(out.stdout, fs::read(src.join("image.raw")).unwrap());
    env.check_clean();
}

#[test]
fn incremental_backups_after_edits_inserts_deletes_renames() {
    let env = Env::new();
    env.init(&["--block-size", "8K"]);
    let src = env.path("src");
    make_full_tree(&src, 3);
    let s1 = env.backup(&[&src]);
    let copy1 = env.path("copy1");
    copy_tree(&src, &copy1);

    // Unchanged re-backup: nothing read.
    let v = env.backup_json(&[&src]);
    assert_eq!(v["files_new"], 0);
    assert_eq!(v["files_changed"], 0);
    assert_eq!(v["bytes_read"], 0, "{v}");
    assert!(v["files_unchanged"].as_u64().unwrap() > 20);

    // Edit in place, insert in the middle, append, delete, rename, add.
    let mut rng = Rng(5);
    let p = src.join("dir/random.bin");
    let mut d = fs::read(&p).unwrap();
    d[12345] ^= 0xff;
    let ins: Vec<u8> = rng.bytes(10_000, false);
    d.splice(1_000_000..1_000_000, ins);
    fs::write(&p, &d).unwrap();
    fs::OpenOptions::new()
        .append(true)
        .open(src.join("dir/text.log"))
        .unwrap()
        .write_all(b"appended\n")
        .unwrap();
    fs::remove_file(src.join("dup-a")).unwrap();
    fs::remove_dir_all(src.join("dir/sub/deeper")).unwrap();
    fs::rename(src.join("dir/sub/big.bin"), src.join("moved-big.bin")).unwrap();
    fs::write(src.join("dir/new-file"), rng.bytes(50_000, true)).unwrap();
    let v = env.backup_json(&[&src]);
    assert!(v["files_changed"].as_u64().unwrap() >= 2, "{v}");
    // The insert changes only a few chunks: far less than the file is added.
    assert!(v["data_added"].as_u64().unwrap() < 500_000, "{v}");
    let s3 = v["snapshot_id"].as_str().unwrap().to_string();

    let r3 = env.restore(&s3, &src, "out3");
    assert_same(&src, &r3);
    assert_rsync_same(&src, &r3);
    let r1 = env.restore(&s1, &src, "out1");
    assert_same(&copy1, &r1);
    env.check_clean();
}

#[test]
fn stdin_backup_dump_ls_include_and_excludes() {
    let env = Env::new();
    env.init(&[]);
    let mut rng = Rng(11);
    let payload = rng.bytes(3 << 20, true);
    // A backup of standard input fed `input`.
    let piped = |args: &[&str], input: &[u8]| {
        let mut child = env
            .cmd(args)
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .spawn()
            .unwrap();
        child.stdin.take().unwrap().write_all(input).unwrap();
        child.wait_with_output().unwrap()
    };
    let out = piped(
        &[
            "backup",
            "--stdin",
            "--stdin-name",
            "db.sql",
            "--tag",
            "dump",
            "--json",
        ],
        &payload,
    );
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    let sid = v["snapshot_id"].as_str().unwrap();
    let dumped = env.cmd(&["dump", &sid[..8], "/db.sql"]).output().unwrap();
    assert!(dumped.status.success());
    assert_eq!(dumped.stdout, payload);
    assert!(!String::from_utf8_lossy(&out.stderr).contains("was empty"));
    // An empty dump (a producer missing from a pipe) is saved, and said.
    let empty = env
        .cmd(&["backup", "--stdin", "--stdin-name", "empty.sql"])
        .stdin(Stdio::null())
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&empty.stderr);
    assert!(empty.status.success(), "{err}");
    assert!(
        err.contains("standard input was empty") && err.contains("empty.sql"),
        "{err}"
    );
    // A path as the name (restic's --stdin-filename), the last given winning.
    let out = piped(
        &[
            "backup",
            "--stdin",
            "--stdin-filename",
            "x",
            "--stdin-filename",
            "dumps/db.sql",
        ],
        b"rows",
    );
    assert!(out.status.success());
    let dumped = env
        .cmd(&["dump", "latest", "/dumps/db.sql"])
        .output()
        .unwrap();
    assert_eq!(dumped.stdout, b"rows");
    let err = env.fails(&["backup", "--stdin", "--stdin-name", "a/../b"], 1);
    assert!(err.contains("invalid --stdin-name"), "{err}");

    let src = env.path("src");
    make_full_tree(&src, 4);
    fs::write(env.path("excludes"), "# comment\n*.log\n").unwrap();
    let out = env.ok(&[
        "backup",
        "--json",
        "--exclude",
        "dup-*",
        "--exclude-file",
        env.path("excludes").to_str().unwrap(),
        src.to_str().unwrap(),
    ]);
    let v: serde_json::Value = serde_json::from_str(&out).unwrap();
    let sid = v["snapshot_id"].as_str().unwrap();
    let ls = env.ok(&["ls", sid]);
    assert!(ls.contains(&format!("{}/small.txt", src.display())), "{ls}");
    assert!(
        !ls.contains("dup-a") && !ls.contains("dup-b") && !ls.contains("text.log"),
        "{ls}"
    );
    let lsj: serde_json::Value =
        serde_json::from_str(&env.ok(&["ls", "--json", sid, &format!("{}/dir", src.display())]))
            .unwrap();
    assert!(
        lsj["entries"]
            .as_array()
            .unwrap()
            .iter()
            .any(|e| e["path"].as_str().unwrap().ends_with("/dir/random.bin"))
    );

    // --include restores only that subtree.
    let target = env.path("partial");
    env.ok(&[
        "restore",
        sid,
        "--target",
        target.to_str().unwrap(),
        "--include",
        &format!("{}/dir/sub", src.display()),
    ]);
    let base = target.join(src.strip_prefix("/").unwrap());
    assert!(base.join("dir/sub/big.bin").exists());
    assert!(!base.join("small.txt").exists());
    assert_eq!(
        fs::read(base.join("dir/sub/big.bin")).unwrap(),
        fs::read(src.join("dir/sub/big.bin")).unwrap()
    );

    let snaps: serde_json::Value = serde_json::from_str(&env.ok(&["snapshots", "--json"])).unwrap();
    assert_eq!(snaps.as_array().unwrap().len(), 4);
    assert_eq!(snaps[0]["tags"][0], "dump");
}

#[test]
fn backup_init_flag_creates_repository() {
    let env = Env::new();
    let src = env.path("src");
    fs::create_dir_all(&src).unwrap();
    fs::write(src.join("f"), b"data").unwrap();
    env.ok(&["backup", "--init", src.to_str().unwrap()]);
    env.ok(&["backup", "--init", src.to_str().unwrap()]);
    let snaps: serde_json::Value = serde_json::from_str(&env.ok(&["snapshots", "--json"])).unwrap();
    assert_eq!(snaps.as_array().unwrap().len(), 2);
    let cfg: serde_json::Value = serde_json::from_str(&env.ok(&["config", "--json"])).unwrap();
    assert_eq!(cfg["block_size"], 16384);
    env.ok(&["config", "--compression", "max"]);
    let cfg: serde_json::Value = serde_json::from_str(&env.ok(&["config", "--json"])).unwrap();
    assert_eq!(cfg["compression"], "max");
}

#[test]
fn restore_replaces_symlinks_in_the_target_instead_of_following_them() {
    let env = Env::new();
    env.init(&[]);
    let src = env.path("src");
    fs::create_dir_all(src.join("d")).unwrap();
    fs::write(src.join("d/f"), b"inside").unwrap();
    fs::write(src.join("g"), b"file g").unwrap();
    let snap = env.backup(&[&src]);
    // A target whose directories and files are symlinks pointing outside it.
    let outside = env.path("outside");
    fs::create_dir_all(&outside).unwrap();
    let target = env.path("t");
    let base = target.join(src.strip_prefix("/").unwrap());
    fs::create_dir_all(&base).unwrap();
    std::os::unix::fs::symlink(&outside, base.join("d")).unwrap();
    std::os::unix::fs::symlink(outside.join("g-victim"), base.join("g")).unwrap();
    env.ok(&["restore", &snap, "--target", target.to_str().unwrap()]);
    assert_eq!(
        fs::read_dir(&outside).unwrap().count(),
        0,
        "restore wrote through a symlink"
    );
    assert!(fs::symlink_metadata(base.join("d")).unwrap().is_dir());
    assert_eq!(fs::read(base.join("d/f")).unwrap(), b"inside");
    assert_eq!(fs::read(base.join("g")).unwrap(), b"file g");
}

/// `dump --archive tar` of a directory, unpacked by GNU tar, gives the same tree as
/// the source: content, modes, owners (as root), times with nanoseconds, symlinks,
/// hard links, xattrs, FIFOs and devices. Only sparseness is not kept (the archive
/// is not a sparse tar).
#[test]
fn dump_archive_tar_round_trips_through_gnu_tar() {
    let env = Env::new();
    env.init(&[]);
    let src = env.path("src");
    make_full_tree(&src, 5);
    let sid = env.backup(&[&src]);
    let tarball = env.path("export.tar");
    let out = env
        .cmd(&["dump", &sid, src.to_str().unwrap(), "--archive", "tar"])
        .stdout(fs::File::create(&tarball).unwrap())
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let unpacked = env.path("unpacked");
    fs::create_dir_all(&unpacked).unwrap();
    let mut tar = std::process::Command::new("tar");
    tar.args(["--xattrs", "--xattrs-include=*", "-xpf"])
        .arg(&tarball)
        .arg("-C")
        .arg(&unpacked);
    if is_root() {
        tar.arg("--same-owner");
    }
    let t = tar.output().unwrap();
    assert!(t.status.success(), "{}", String::from_utf8_lossy(&t.stderr));
    let got = unpacked.join(src.file_name().unwrap());
    let diffs: Vec<String> = compare(&src, &got)
        .into_iter()
        .filter(|d| !d.contains("allocated blocks"))
        .filter(|d| is_root() || !d.contains(": owner differs"))
        .collect();
    assert!(diffs.is_empty(), "trees differ:\n{}", diffs.join("\n"));

    // The whole snapshot from its root, and one file: names relative to the parent.
    let all = env
        .cmd(&["dump", &sid, "/", "--archive", "tar"])
        .output()
        .unwrap();
    assert!(all.status.success());
    let listed = std::process::Command::new("tar")
        .args(["-tf", "-"])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .spawn()
        .and_then(|mut c| {
            c.stdin.take().unwrap().write_all(&all.stdout)?;
            c.wait_with_output()
        })
        .unwrap();
    let names = String::from_utf8_lossy(&listed.stdout);
    let rel = src.strip_prefix("/").unwrap().display().to_string();
    assert!(
        names.lines().any(|l| l == format!("{rel}/small.txt")),
        "{names}"
    );
    // A path that is not in the snapshot is an error, not an empty archive.
    env.fails(&["dump", &sid, "/no/such/dir", "--archive", "tar"], 1);
}

/// The exclusion options restic users reach for, and the path lists, each seen
/// leaving out (or naming) exactly what it says.
#[test]
fn exclusion_options_and_path_lists() {
    let env = Env::new();
    env.init(&[]);
    let src = env.path("src");
    for d in ["a", "b", "cache", "fake-cache", "tagged", "c/d", "odd dir"] {
        fs::create_dir_all(src.join(d)).unwrap();
    }
    fs::write(src.join("a/Notes.TXT"), "x").unwrap();
    fs::write(src.join("a/keep"), "y").unwrap();
    fs::write(src.join("b/big"), vec![7u8; 2 << 20]).unwrap();
    fs::write(src.join("b/small"), "s").unwrap();
    fs::write(
        src.join("cache/CACHEDIR.TAG"),
        "Signature: 8a477f597d28d172789f06886806bc55\n# a cache",
    )
    .unwrap();
    fs::write(src.join("cache/data"), "c").unwrap();
    fs::write(
        src.join("fake-cache/CACHEDIR.TAG"),
        "Signature: something else",
    )
    .unwrap();
    fs::write(src.join("fake-cache/data"), "f").unwrap();
    fs::write(src.join("tagged/.nobackup"), "").unwrap();
    fs::write(src.join("tagged/data"), "t").unwrap();
    fs::write(src.join("c/d/e"), "e").unwrap();
    fs::write(src.join("odd dir/#name"), "o").unwrap();
    let s = src.to_str().unwrap();
    let ls = |sid: &str| -> Vec<String> {
        env.ok(&["ls", sid])
            .lines()
            .filter_map(|l| l.strip_prefix(s).map(String::from))
            .collect()
    };

    let got = ls(&env.backup_args(&[
        "--iexclude",
        "*.txt",
        "--exclude-caches",
        "--exclude-if-present",
        ".nobackup",
        "--exclude-larger-than",
        "1M",
        s,
    ]));
    let want = [
        "",
        "/a",
        "/a/keep",
        "/b",
        "/b/small",
        "/c",
        "/c/d",
        "/c/d/e",
        // A cache keeps itself and its tag (the rest of its content is left
        // out), as restic documents it; so does a directory holding .nobackup.
        "/cache",
        "/cache/CACHEDIR.TAG",
        "/fake-cache",
        "/fake-cache/CACHEDIR.TAG",
        "/fake-cache/data",
        "/odd dir",
        "/odd dir/#name",
        "/tagged",
        "/tagged/.nobackup",
    ];
    assert_eq!(got, want);
    // A header that must match: the tag with another header is not one.
    let got = ls(&env.backup_args(&[
        "--exclude-if-present",
        "CACHEDIR.TAG:Signature: something",
        s,
    ]));
    assert!(got.contains(&"/cache/data".to_string()), "{got:?}");
    assert!(
        got.contains(&"/fake-cache/CACHEDIR.TAG".to_string()),
        "{got:?}"
    );
    assert!(!got.contains(&"/fake-cache/data".to_string()), "{got:?}");
    // A path named on the command line is judged too.
    let got = ls(&env.backup_args(&[
        "--exclude-larger-than",
        "1K",
        &format!("{s}/b/big"),
        &format!("{s}/b/small"),
    ]));
    assert_eq!(got, ["", "/b", "/b/small"]);

    // --files-from: comments, blank lines, patterns; a pattern matching nothing
    // is a warning.
    let list = env.path("list");
    fs::write(
        &list,
        format!("# the list\n{s}/a/keep\n\n  {s}/c/*  \n{s}/nothing-*\n"),
    )
    .unwrap();
    let out = env
        .cmd(&["backup", "--json", "--files-from", list.to_str().unwrap()])
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let stderr = String::from_utf8_lossy(&out.stderr);
    // A warning event with --json, and shown with -q too (QA: plain text in
    // the JSON stream, and nothing with -q).
    assert!(
        stderr
            .lines()
            .any(|l| l.contains(r#""type":"warning""#) && l.contains("matches nothing")),
        "{stderr}"
    );
    let quiet = env
        .cmd(&["backup", "-q", "--files-from", list.to_str().unwrap()])
        .output()
        .unwrap();
    assert!(String::from_utf8_lossy(&quiet.stderr).contains("matches nothing"));
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    let got = ls(v["snapshot_id"].as_str().unwrap());
    assert_eq!(got, ["", "/a", "/a/keep", "/c", "/c/d", "/c/d/e"]);
    // Verbatim and NUL-separated lists take names as they are ('#', spaces).
    fs::write(&list, format!("{s}/odd dir/#name\n")).unwrap();
    let raw = env.path("raw");
    fs::write(&raw, format!("{s}/b/small\0{s}/odd dir\0")).unwrap();
    let got = ls(&env.backup_args(&[
        "--files-from-verbatim",
        list.to_str().unwrap(),
        "--files-from-raw",
        raw.to_str().unwrap(),
    ]));
    assert_eq!(got, ["", "/b", "/b/small", "/odd dir", "/odd dir/#name"]);

    // Lists that name nothing, and a tag that is a path, are refused.
    fs::write(&list, "# nothing\n\n").unwrap();
    let out = env
        .cmd(&["backup", "--files-from", list.to_str().unwrap()])
        .output()
        .unwrap();
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("name no path"));
    let out = env
        .cmd(&["backup", "--exclude-if-present", "a/b", s])
        .output()
        .unwrap();
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("not a path"));
}

#[test]
fn the_repository_itself_is_never_backed_up() {
    // The repository lives inside the tree backed up, reached through a symlink
    // (another spelling of the same directory): its packs stay out, whatever the
    // path, and the user is told.
    let env = Env::new();
    env.init(&[]);
    let src = env.dir.path();
    fs::write(src.join("keep"), "data").unwrap();
    std::os::unix::fs::symlink(&env.repo, src.join("repo-link")).unwrap();
    let s = src.to_str().unwrap();
    let out = env.cmd(&["backup", s]).output().unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{stderr}");
    assert!(
        stderr.contains("leaving out") && stderr.contains("the repository this backup writes to"),
        "{stderr}"
    );
    let listed = env.ok(&["ls", "latest"]);
    assert!(listed.contains(&format!("{s}/keep")), "{listed}");
    assert!(!listed.contains(&format!("{s}/repo/")), "{listed}");
    assert!(
        !listed.lines().any(|l| l == format!("{s}/repo")),
        "{listed}"
    );
    // The same repository opened through the symlink: the inode decides.
    let linked = Env::at(tempfile::tempdir().unwrap(), src.join("repo-link"));
    let id = linked.backup_args(&["-q", s]);
    let listed = linked.ok(&["ls", &id]);
    assert!(!listed.contains(&format!("{s}/repo/")), "{listed}");
    // The repository named on its own, or a directory inside it: nothing to back up.
    let err = env.fails(&["backup", env.repo.to_str().unwrap()], 1);
    assert!(err.contains("nothing to back up"), "{err}");
    let data = env.repo.join("data");
    let err = env.fails(&["backup", data.to_str().unwrap()], 1);
    assert!(err.contains("nothing to back up"), "{err}");
    env.check_clean();
}

/// `restore --exclude/--iexclude` leave out what they match, and `--delete`
/// leaves what they match in the target alone; the dry run counts the same.
#[test]
fn restore_excludes_and_delete_leaves_excluded_alone() {
    let env = Env::new();
    env.init(&[]);
    let src = env.path("src");
    for d in ["a", "b/deep"] {
        fs::create_dir_all(src.join(d)).unwrap();
    }
    fs::write(src.join("a/Notes.TXT"), "x").unwrap();
    fs::write(src.join("a/keep"), "y").unwrap();
    fs::write(src.join("b/deep/f"), "z").unwrap();
    let s = src.to_str().unwrap();
    env.ok(&["backup", "-q", s]);
    let target = env.path("out");
    let t = target.to_str().unwrap();
    env.ok(&[
        "restore",
        "latest",
        "-t",
        t,
        "--exclude",
        "b",
        "--iexclude",
        "*.txt",
    ]);
    let inside = target.join(s.trim_start_matches('/'));
    assert_eq!(fs::read(inside.join("a/keep")).unwrap(), b"y");
    assert!(!inside.join("a/Notes.TXT").exists());
    assert!(!inside.join("b").exists());

    // Extra entries: one the excludes match (kept), one they do not (deleted).
    fs::write(inside.join("a/other.txt"), "mine").unwrap();
    fs::write(inside.join("a/extra"), "gone").unwrap();
    fs::create_dir_all(inside.join("b")).unwrap();
    fs::write(inside.join("b/mine"), "kept").unwrap();
    let args = [
        "restore",
        "latest",
        "-t",
        t,
        "--delete",
        "-e",
        "b",
        "--iexclude",
        "*.TXT",
        "--json",
    ];
    let dry: serde_json::Value =
        serde_json::from_str(&env.ok(&[&args[..], &["-n"]].concat())).unwrap();
    assert_eq!(dry["deleted"], 1, "{dry}");
    let real: serde_json::Value = serde_json::from_str(&env.ok(&args)).unwrap();
    assert_eq!(real["deleted"], 1, "{real}");
    assert!(!inside.join("a/extra").exists());
    assert_eq!(fs::read(inside.join("a/other.txt")).unwrap(), b"mine");
    assert_eq!(fs::read(inside.join("b/mine")).unwrap(), b"kept");
    assert!(!inside.join("a/Notes.TXT").exists());
    // Without the excludes, the same restore puts everything back.
    env.ok(&["restore", "latest", "-t", t, "--delete"]);
    assert_eq!(fs::read(inside.join("a/Notes.TXT")).unwrap(), b"x");
    assert!(!inside.join("a/other.txt").exists() && !inside.join("b/mine").exists());
    assert_eq!(fs::read(inside.join("b/deep/f")).unwrap(), b"z");
}

/// Every object of a repository with its size, for "nothing changed" checks.
fn repo_listing(dir: &std::path::Path) -> Vec<(String, u64)> {
    let mut out = Vec::new();
    let mut stack = vec![dir.to_path_buf()];
    while let Some(d) = stack.pop() {
        for e in fs::read_dir(&d).unwrap() {
            let e = e.unwrap();
            let m = e.metadata().unwrap();
            if m.is_dir() {
                stack.push(e.path());
            } else {
                let name = e.path().strip_prefix(dir).unwrap().display().to_string();
                out.push((name, m.len()));
            }
        }
    }
    out.sort();
    out
}

/// `backup --dry-run` goes through the whole backup, says what it would add (what
/// the real backup then adds), and leaves the repository as it was.
#[test]
fn backup_dry_run_stores_nothing_and_predicts_what_is_added() {
    let env = Env::new();
    env.init(&[]);
    let src = env.path("src");
    make_full_tree(&src, 3);
    let s = src.to_str().unwrap();
    env.ok(&["backup", "-q", s]);
    let mut rng = Rng(5);
    fs::write(src.join("new.bin"), rng.bytes(3 << 20, false)).unwrap();
    fs::write(src.join("new.txt"), "text ".repeat(50_000)).unwrap();
    let before = repo_listing(&env.repo);
    let dry: serde_json::Value =
        serde_json::from_str(&env.ok(&["backup", "--dry-run", "--json", s])).unwrap();
    assert_eq!(dry["dry_run"], true);
    assert!(dry.get("snapshot_id").is_none(), "{dry}");
    assert_eq!(dry["files_new"], 2, "{dry}");
    assert_eq!(
        repo_listing(&env.repo),
        before,
        "a dry run changed the repository"
    );
    let text = env.ok(&["backup", "-n", s]);
    assert!(
        text.contains("would add:") && text.contains("nothing was saved"),
        "{text}"
    );
    assert_eq!(repo_listing(&env.repo), before);
    let real: serde_json::Value = serde_json::from_str(&env.ok(&["backup", "--json", s])).unwrap();
    for k in [
        "files_new",
        "files_changed",
        "files_unchanged",
        "blobs_added",
    ] {
        assert_eq!(dry[k], real[k], "{k}: {dry} against {real}");
    }
    // The bytes too, but for the trees of the directories above the source (their
    // times move while other tests create files in /tmp): a few bytes.
    let (d, r) = (
        dry["data_added"].as_i64().unwrap(),
        real["data_added"].as_i64().unwrap(),
    );
    assert!((d - r).abs() <= 256, "data_added: {dry} against {real}");
    assert!(real["data_added"].as_u64().unwrap() > 3 << 20);
    env.check_clean();
    // Nothing to compare with: refused.
    let other = Env::new();
    let out = other.run(&["backup", "-n", s]);
    assert!(!out.status.success());
    assert!(
        String::from_utf8_lossy(&out.stderr).contains("no repository"),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
}

/// `snapshots --latest N`: the N newest of each host and set of paths.
#[test]
fn snapshots_latest_per_host_and_paths() {
    let env = Env::new();
    env.init(&[]);
    let (a, b) = (env.path("a"), env.path("b"));
    fs::create_dir_all(&a).unwrap();
    fs::create_dir_all(&b).unwrap();
    let (a, b) = (a.to_str().unwrap(), b.to_str().unwrap());
    let mut ids = Vec::new();
    for args in [&[a][..], &[a], &[a], &[b], &[a, b]] {
        ids.push(env.backup_args(args));
    }
    env.ok(&["backup", "-q", "--host", "other", a]);
    let list = |n: &str| -> Vec<String> {
        let v: serde_json::Value =
            serde_json::from_str(&env.ok(&["snapshots", "--json", "--latest", n])).unwrap();
        v.as_array()
            .unwrap()
            .iter()
            .map(|s| {
                s["hostname"].as_str().unwrap().to_string() + ":" + &s["id"].as_str().unwrap()[..8]
            })
            .collect()
    };
    let got = list("1");
    assert_eq!(got.len(), 4, "{got:?}");
    assert!(got.iter().any(|s| s.ends_with(&ids[2][..8])), "{got:?}");
    assert!(!got.iter().any(|s| s.ends_with(&ids[1][..8])), "{got:?}");
    assert_eq!(list("2").len(), 5);
    // 0 is no limit, as restic's.
    assert_eq!(list("0").len(), 6);
    // One dated years ahead is passed over as `latest` passes it over, unless
    // there is room for it (QA: --latest 1 showed it and `latest` another).
    let ahead = env.backup_args(&["--time", "2999-01-01T00:00:00Z", a]);
    let got = list("1");
    assert!(got.iter().any(|s| s.ends_with(&ids[2][..8])), "{got:?}");
    assert!(!got.iter().any(|s| s.ends_with(&ahead[..8])), "{got:?}");
    let got = list("4");
    assert!(got.iter().any(|s| s.ends_with(&ahead[..8])), "{got:?}");
}

/// `cairn tag`: a new snapshot with the new tags replaces the old one (which
/// `original` names), restores the same, and the filters select what is changed.
#[test]
fn tag_adds_removes_and_sets_tags() {
    let env = Env::new();
    env.init(&[]);
    let src = env.path("src");
    make_full_tree(&src, 2);
    let s = src.to_str().unwrap();
    let snap = |args: &[&str]| env.backup_args(&[args, &[s]].concat());
    let first = snap(&["--tag", "daily"]);
    let second = snap(&[]);
    let list = || -> Vec<serde_json::Value> {
        serde_json::from_str::<serde_json::Value>(&env.ok(&["snapshots", "--json"]))
            .unwrap()
            .as_array()
            .unwrap()
            .clone()
    };
    // A tag both added and removed is a guess either way: refused (QA).
    let err = env.fails(&["tag", "--add", "q", "--remove", "q", &first[..8]], 1);
    assert!(
        err.contains("both added (--add) and removed (--remove)"),
        "{err}"
    );
    let out = env.ok(&["tag", "--add", "keep,monthly", &first[..8]]);
    assert!(out.contains("1 snapshot changed"), "{out}");
    let l = list();
    assert_eq!(l.len(), 2);
    let retagged = l.iter().find(|v| v["id"] != second.as_str()).unwrap();
    assert_eq!(
        retagged["tags"],
        serde_json::json!(["daily", "keep", "monthly"])
    );
    assert_eq!(retagged["original"], first.as_str());
    let new_id = retagged["id"].as_str().unwrap().to_string();
    assert!(
        !env.run(&["ls", &first[..12]]).status.success(),
        "the old snapshot is gone"
    );
    let r = env.restore(&new_id, &src, "out");
    assert_same(&src, &r);

    // Filters: only snapshots tagged "keep"; --set replaces, --remove drops.
    let out = env.ok(&[
        "tag", "--tag", "keep", "--set", "x,y", "--remove", "y", "--json",
    ]);
    let v: serde_json::Value = serde_json::from_str(&out).unwrap();
    assert_eq!(v["changed"].as_array().unwrap().len(), 1, "{v}");
    assert_eq!(v["changed"][0]["tags"], serde_json::json!(["x"]));
    // The chain keeps naming the first snapshot.
    let l = list();
    let x = l
        .iter()
        .find(|v| v["tags"] == serde_json::json!(["x"]))
        .unwrap();
    assert_eq!(x["original"], first.as_str());
    // A dry run changes nothing; --set "" clears.
    env.ok(&["tag", "--set", "", "-n"]);
    assert_eq!(
        list()
            .iter()
            .filter(|v| v["tags"] == serde_json::json!(["x"]))
            .count(),
        1
    );
    env.ok(&["tag", "--set", ""]);
    assert!(list().iter().all(|v| v["tags"] == serde_json::json!([])));
    env.check_clean();
    // Killed after storing the replacement, before forgetting the old one: both
    // are there (`tag` with `tag` added to `old`; the replacement's id).
    let interrupted = |tag: &str, old: &str| -> String {
        let before = list().len();
        let out = env
            .cmd(&["tag", "--add", tag, old])
            .env(cairn_core::hooks::KILL_AT_VAR, "snapshot:recorded:1")
            .output()
            .unwrap();
        assert!(!out.status.success());
        assert_eq!(list().len(), before + 1);
        list()
            .iter()
            .find(|v| v["tags"].as_array().unwrap().iter().any(|t| t == tag))
            .unwrap()["id"]
            .as_str()
            .unwrap()
            .to_string()
    };
    let tag_json = |args: &[&str]| -> serde_json::Value {
        serde_json::from_str(&env.ok(&[&["tag", "--json"], args].concat())).unwrap()
    };
    // Run again, it forgets the old one and stores no second replacement.
    let before = list().len();
    let old = list()[0]["id"].as_str().unwrap().to_string();
    interrupted("again", &old);
    env.ok(&["tag", "--add", "again", &old]);
    assert_eq!(list().len(), before);
    assert_eq!(
        list()
            .iter()
            .filter(|v| v["tags"] == serde_json::json!(["again"]))
            .count(),
        1
    );
    env.check_clean();
    // The same, run again on the replacement (`latest` takes it, the old one's
    // time tied; QA: "already as asked", and the old one stayed for good).
    let old = list()[0]["id"].as_str().unwrap().to_string();
    let replacement = interrupted("twice", &old);
    let r = tag_json(&["--add", "twice", &replacement]);
    assert_eq!(r["unchanged"], 1, "{r}");
    assert_eq!(r["leftovers_forgotten"][0], old.as_str(), "{r}");
    assert_eq!(list().len(), before);
    env.check_clean();
    // And when the replacement is given another change: the old one goes too.
    let old = list()[0]["id"].as_str().unwrap().to_string();
    let replacement = interrupted("thrice", &old);
    let r = tag_json(&["--add", "other", &replacement]);
    assert_eq!(r["leftovers_forgotten"][0], old.as_str(), "{r}");
    assert_eq!(list().len(), before);
    env.check_clean();
    // And when both are selected (a tag over every snapshot): the old one is not
    // tagged on its own, it goes (one never tagged before: the replacement names
    // it as its original).
    let old = list().iter().find(|v| v["original"].is_null()).unwrap()["id"]
        .as_str()
        .unwrap()
        .to_string();
    interrupted("fourth", &old);
    let dry = tag_json(&["--add", "all", "--dry-run"]);
    assert_eq!(dry["leftovers_forgotten"][0], old.as_str(), "{dry}");
    assert_eq!(list().len(), before + 1);
    let r = tag_json(&["--add", "all"]);
    assert_eq!(r["leftovers_forgotten"][0], old.as_str(), "{r}");
    assert_eq!(list().len(), before);
    env.check_clean();
    // Nothing to do, or a tag with a comma: refused.
    assert!(!env.run(&["tag", "latest"]).status.success());
    assert!(!env.run(&["tag", "--add", "", "latest"]).status.success());
}

/// Tags are names without spaces around them and each is kept once, whichever
/// command gives them (QA: `tag --add " x"` stored a tag no filter could select;
/// `backup --tag x,x --tag x` stored it three times).
#[test]
fn tags_are_trimmed_and_kept_once() {
    let env = Env::new();
    env.init(&[]);
    let src = env.path("src");
    make_full_tree(&src, 1);
    let s = src.to_str().unwrap();
    env.backup_args(&["--tag", "x,x", "--tag", "x", s]);
    let tags = || -> serde_json::Value {
        let v: serde_json::Value = serde_json::from_str(&env.ok(&["snapshots", "--json"])).unwrap();
        v[0]["tags"].clone()
    };
    assert_eq!(tags(), serde_json::json!(["x"]));
    env.ok(&["tag", "latest", "--add", " y ,z"]);
    assert_eq!(tags(), serde_json::json!(["x", "y", "z"]));
    let out = env.ok(&["snapshots", "--tag", "y"]);
    assert!(out.contains("1 snapshot"), "{out}");
    env.ok(&["tag", "latest", "--remove", " z"]);
    assert_eq!(tags(), serde_json::json!(["x", "y"]));
    env.ok(&["tag", "latest", "--set", " w, "]);
    assert_eq!(tags(), serde_json::json!(["w"]));
    let err = env.fails(&["tag", "latest", "--add", " "], 1);
    assert!(err.contains("non-empty"), "{err}");
}

/// `tag`, `forget` and `rewrite` take turns (QA: four `tag ID --add tN` at once
/// left two copies of the snapshot and lost two of the tags with exit 0; a
/// `forget` beside a `tag` saw its snapshot come back). A second change of the
/// snapshot a paused `tag` is replacing waits for it, then fails because that
/// snapshot is gone, and the first one's result is the only copy.
#[test]
fn concurrent_snapshot_changes_take_turns() {
    let env = Env::new();
    env.init(&[]);
    let src = env.path("src");
    make_full_tree(&src, 3);
    for second in [
        &["tag", "--add", "b"][..],
        &["forget"],
        &["rewrite", "--exclude", "x"],
    ] {
        let id = env.backup(&[&src]);
        let pause = env.path(&format!("pause-{}", second[0]));
        fs::create_dir_all(&pause).unwrap();
        let first = env
            .cmd(&["tag", &id[..8], "--add", "a"])
            .env(
                cairn_core::hooks::PAUSE_AT_VAR,
                format!("snapshot:before-write:1:{}", pause.display()),
            )
            .stdout(std::process::Stdio::piped())
            .stderr(std::process::Stdio::piped())
            .spawn()
            .unwrap();
        wait_until(
            "the first tag to reach its write",
            std::time::Duration::from_secs(60),
            || pause.join("reached").exists(),
        );
        let other = env
            .cmd(&[second, &[&id[..8]]].concat())
            .stdout(std::process::Stdio::piped())
            .stderr(std::process::Stdio::piped())
            .spawn()
            .unwrap();
        std::thread::sleep(std::time::Duration::from_millis(1500));
        fs::write(pause.join("go"), b"").unwrap();
        let o = first.wait_with_output().unwrap();
        assert!(o.status.success(), "{o:?}");
        let o = other.wait_with_output().unwrap();
        let err = String::from_utf8_lossy(&o.stderr);
        assert!(!o.status.success(), "{second:?}: {o:?}");
        assert!(err.contains("no snapshot"), "{second:?}: {err}");
        let snaps: serde_json::Value =
            serde_json::from_str(&env.ok(&["snapshots", "--json"])).unwrap();
        let of_this: Vec<&serde_json::Value> = snaps
            .as_array()
            .unwrap()
            .iter()
            .filter(|s| s["id"] == id.as_str() || s["original"] == id.as_str())
            .collect();
        assert_eq!(of_this.len(), 1, "{second:?}: {of_this:?}");
        assert_eq!(of_this[0]["tags"], serde_json::json!(["a"]), "{second:?}");
    }
    env.check_clean();
}

/// `cairn rewrite --exclude`: new snapshots without what the patterns match,
/// the old ones kept unless `--forget`, and after prune the data gone.
#[test]
fn rewrite_takes_files_out_of_snapshots() {
    let env = Env::new();
    env.init(&[]);
    let src = env.path("src");
    make_full_tree(&src, 4);
    fs::create_dir_all(src.join("vault/deep")).unwrap();
    let mut rng = Rng(9);
    fs::write(src.join("vault/deep/key.bin"), rng.bytes(2 << 20, false)).unwrap();
    fs::write(src.join("secret.TXT"), rng.bytes(1 << 20, false)).unwrap();
    let s = src.to_str().unwrap();
    let first = env.backup_args(&[s]);
    let data_bytes = || -> u64 {
        let v: serde_json::Value = serde_json::from_str(&env.ok(&["stats", "--json"])).unwrap();
        v["stored_bytes"]
            .as_u64()
            .or(v["space_occupied"].as_u64())
            .unwrap_or_else(|| panic!("{v}"))
    };
    let before = data_bytes();

    // A dry run changes nothing; then the rewrite keeps the old snapshot.
    let dry: serde_json::Value = serde_json::from_str(&env.ok(&[
        "rewrite",
        "-n",
        "--json",
        "-e",
        "vault",
        "--iexclude",
        "SECRET.txt",
    ]))
    .unwrap();
    assert_eq!(dry["rewritten"][0]["bytes_removed"], 3 << 20, "{dry}");
    let removed: Vec<&str> = dry["rewritten"][0]["removed"]
        .as_array()
        .unwrap()
        .iter()
        .map(|p| p.as_str().unwrap())
        .collect();
    assert_eq!(removed, [format!("{s}/secret.TXT"), format!("{s}/vault")]);
    let count = || {
        serde_json::from_str::<serde_json::Value>(&env.ok(&["snapshots", "--json"]))
            .unwrap()
            .as_array()
            .unwrap()
            .len()
    };
    assert_eq!(count(), 1);
    let r: serde_json::Value = serde_json::from_str(&env.ok(&[
        "rewrite",
        "--json",
        "-e",
        "vault",
        "--iexclude",
        "SECRET.txt",
    ]))
    .unwrap();
    let new = r["rewritten"][0]["new"].as_str().unwrap().to_string();
    assert_eq!(count(), 2);
    // Kept beside its original, the rewrite is tagged as restic's is (QA: the
    // two were told apart only by id).
    let tags: serde_json::Value =
        serde_json::from_str(&env.ok(&["snapshots", "--json", "--tag", "rewrite"])).unwrap();
    assert_eq!(tags.as_array().unwrap().len(), 1, "{tags}");
    assert_eq!(tags[0]["id"], new.as_str(), "{tags}");
    let ls = env.ok(&["ls", &new[..12]]);
    assert!(!ls.contains("vault") && !ls.contains("secret"), "{ls}");
    // The rewritten snapshot restores the rest exactly.
    // The source without them (its directory's time as the snapshot has it).
    let mtime = fs::metadata(&src).unwrap().modified().unwrap();
    fs::remove_dir_all(src.join("vault")).unwrap();
    fs::remove_file(src.join("secret.TXT")).unwrap();
    fs::File::open(&src).unwrap().set_modified(mtime).unwrap();
    let out = env.restore(&new, &src, "out");
    assert_same(&src, &out);
    // Again with --forget on the old one (the new one holds nothing to take out).
    let r: serde_json::Value = serde_json::from_str(&env.ok(&[
        "rewrite",
        "--json",
        "--forget",
        "-e",
        "vault",
        "--iexclude",
        "SECRET.txt",
        &first[..12],
    ]))
    .unwrap();
    assert_eq!(r["rewritten"][0]["forgotten"], true, "{r}");
    // The same rewrite of the same snapshot is there already: not stored twice.
    assert_eq!(r["rewritten"][0]["new"], new.as_str(), "{r}");
    assert_eq!(count(), 1);
    // Keep one snapshot without the secret, drop the rewritten one too.
    let data = src.clone();
    env.ok(&["backup", "-q", data.to_str().unwrap()]);
    env.ok(&["forget", &new[..12]]);
    env.ok(&["prune"]);
    let after = data_bytes();
    assert!(after + (3 << 20) <= before, "{before} -> {after}");
    env.check_clean();
    assert!(
        !env.run(&["rewrite", "latest"]).status.success(),
        "no pattern: refused"
    );
    // A pattern matching everything leaves no empty snapshot behind: without
    // --forget the snapshot stays, with a word; with it, it is forgotten.
    let ids = || -> Vec<String> {
        let v: serde_json::Value = serde_json::from_str(&env.ok(&["snapshots", "--json"])).unwrap();
        v.as_array()
            .unwrap()
            .iter()
            .map(|s| s["id"].as_str().unwrap().to_string())
            .collect()
    };
    let before = ids();
    // The backed-up path itself, or a directory above it, taken out: only the
    // directories on the way to it would be left, and the snapshot is emptied
    // as well (QA: an empty snapshot was stored, which --keep-last then kept
    // over the real one).
    let parent = src.parent().unwrap().to_str().unwrap();
    for path in [s, parent] {
        let out = env.ok(&["rewrite", "-e", path]);
        assert!(out.contains("everything in it matches"), "{path}: {out}");
        assert_eq!(ids(), before, "{path}");
    }
    let o = env.run(&["rewrite", "-e", "*"]);
    let (out, err) = (
        String::from_utf8_lossy(&o.stdout),
        String::from_utf8_lossy(&o.stderr),
    );
    assert!(o.status.success(), "{err}");
    assert!(
        out.contains("everything in it matches")
            && out.contains("left as it is, no empty snapshot stored")
            && out.contains("0 snapshots rewritten"),
        "{out}"
    );
    assert_eq!(ids(), before);
    let r: serde_json::Value =
        serde_json::from_str(&env.ok(&["rewrite", "--json", "--forget", "-e", "*"])).unwrap();
    assert_eq!(r["rewritten"][0]["emptied"], true, "{r}");
    assert_eq!(r["rewritten"][0]["forgotten"], true, "{r}");
    assert!(r["rewritten"][0]["new"].is_null(), "{r}");
    assert!(ids().is_empty(), "{:?}", ids());
}

/// `backup --time` records the time given (imports of old backups), which
/// retention then goes by.
#[test]
fn backup_time_is_recorded_and_retention_uses_it() {
    let env = Env::new();
    env.init(&[]);
    let src = env.path("src");
    fs::create_dir_all(&src).unwrap();
    fs::write(src.join("f"), "x").unwrap();
    let s = src.to_str().unwrap();
    // Local times at Berlin's daylight-saving changes: 03:00 on the day the clocks
    // go back is once (the repeated hour is 02:00-02:59), 02:30 then is twice;
    // 02:00 on the day they skip an hour is never (QA: the edges were off by one).
    let in_berlin = |t: &str| {
        env.cmd(&["backup", "-q", "--time", t, "-n", s])
            .env("TZ", "CET-1CEST,M3.5.0,M10.5.0/3")
            .output()
            .unwrap()
            .status
            .success()
    };
    assert!(in_berlin("2024-10-27 03:00:00"));
    assert!(in_berlin("2024-10-27 01:59:59"));
    assert!(!in_berlin("2024-10-27 02:30:00"));
    assert!(!in_berlin("2024-03-31 02:00:00"));
    assert!(!in_berlin("2024-03-31 02:59:59"));
    assert!(in_berlin("2024-03-31 03:00:00"));
    // Said as what it is, with the offsets to choose from.
    let why = |t: &str| {
        let o = env
            .cmd(&["backup", "-q", "--time", t, "-n", s])
            .env("TZ", "CET-1CEST,M3.5.0,M10.5.0/3")
            .output()
            .unwrap();
        String::from_utf8_lossy(&o.stderr).into_owned()
    };
    let twice = why("2024-10-27 02:30:00");
    assert!(
        twice.contains("happens twice")
            && twice.contains("2024-10-27T02:30:00+01:00")
            && twice.contains("2024-10-27T02:30:00+02:00"),
        "{twice}"
    );
    assert!(why("2024-03-31 02:30:00").contains("does not exist (the clocks skip it)"));
    assert!(why("yesterday").contains("give an RFC 3339 time"));
    // A time given with its offset records that zone: its days are counted there.
    env.ok(&["backup", "-q", "--time", "2024-02-01T00:30:00+05:30", s]);
    let v: serde_json::Value = serde_json::from_str(&env.ok(&["snapshots", "--json"])).unwrap();
    assert_eq!(v[0]["utc_offset"], 19800, "{v}");
    env.ok(&["forget", "-q", &v[0]["id"].as_str().unwrap()[..8]]);
    for t in [
        "2024-03-01T10:00:00Z",
        "2025-03-01T12:00:00+02:00",
        "2025-07-01T10:00:00Z",
    ] {
        env.ok(&["backup", "-q", "--time", t, s]);
    }
    let v: serde_json::Value = serde_json::from_str(&env.ok(&["snapshots", "--json"])).unwrap();
    let times: Vec<&str> = v
        .as_array()
        .unwrap()
        .iter()
        .map(|s| s["time"].as_str().unwrap())
        .collect();
    assert_eq!(
        times,
        [
            "2024-03-01T10:00:00.000000000Z",
            "2025-03-01T10:00:00.000000000Z",
            "2025-07-01T10:00:00.000000000Z"
        ]
    );
    // One a year: the newest of 2025 and the one of 2024.
    let f: serde_json::Value =
        serde_json::from_str(&env.ok(&["forget", "--keep-yearly", "5", "--json"])).unwrap();
    assert_eq!(f[0]["remove"].as_array().unwrap().len(), 1, "{f}");
    let out = env.run(&["backup", "--time", "last tuesday", s]);
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("RFC 3339"));
}

/// Findings of a black-box review, each seen fixed: `latest` with a host filter
/// in stats and find, `--force` recording no parent, `diff --metadata` seeing a
/// hard link go, an empty CAIRN_PASSWORD counting as unset, device numbers in
/// `ls -l`, and exclude patterns matching characters, not bytes.
#[test]
fn selections_counts_passwords_and_patterns_say_what_they_mean() {
    let env = Env::new();
    env.init(&[]);
    let src = env.path("src");
    fs::create_dir_all(&src).unwrap();
    fs::write(src.join("f"), "hello").unwrap();
    fs::write(src.join("h1"), "h").unwrap();
    fs::hard_link(src.join("h1"), src.join("h2")).unwrap();
    fs::write(src.join("ünï"), "u").unwrap();
    let s = src.to_str().unwrap();
    let a1 = env.backup_args(&["--host", "alpha", s]);
    let b1 = env.backup_args(&["--host", "beta", s]);
    // stats --host alpha latest: alpha's newest alone, not alpha's plus beta's.
    let st: serde_json::Value =
        serde_json::from_str(&env.ok(&["stats", "--json", "--host", "alpha", "latest"])).unwrap();
    assert_eq!(st["snapshots"], 1, "{st}");
    // find -s latest --host alpha searches alpha's newest.
    let f: serde_json::Value = serde_json::from_str(&env.ok(&[
        "find",
        "--json",
        "--host",
        "alpha",
        "--snapshot",
        "latest",
        "f",
    ]))
    .unwrap();
    assert_eq!(f["snapshots"][0]["snapshot"], a1.as_str(), "{f}");
    // --force reads everything and records no parent.
    let v: serde_json::Value =
        serde_json::from_str(&env.ok(&["backup", "--json", "--force", "--host", "beta", s]))
            .unwrap();
    assert!(v["parent"].is_null(), "{v}");
    assert_eq!(v["files_new"], 4, "{v}");
    // A hard link removed: diff --metadata lists the file left.
    fs::remove_file(src.join("h2")).unwrap();
    let b3 = env.backup_args(&["--host", "beta", s]);
    let d = env.ok(&["diff", "--metadata", &b1, &b3]);
    assert!(
        d.lines().any(|l| l.starts_with('U') && l.ends_with("/h1")),
        "{d}"
    );
    // An empty CAIRN_PASSWORD is unset: the password file is used.
    let pw = env.path("pw");
    fs::write(&pw, format!("{PASSWORD}\n")).unwrap();
    let out = env
        .cmd(&["snapshots"])
        .env("CAIRN_PASSWORD", "")
        .env("CAIRN_PASSWORD_FILE", &pw)
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    fs::write(&pw, "\nsecond line\n").unwrap();
    let out = env
        .cmd(&["snapshots", "--password-file", pw.to_str().unwrap()])
        .output()
        .unwrap();
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("empty first line"));
    // `?` is one character, whatever its bytes; -i folds Unicode.
    let e = env.backup_args(&["--exclude", "?n?", s]);
    assert!(!env.ok(&["ls", &e]).contains("ünï"));
    let f: serde_json::Value =
        serde_json::from_str(&env.ok(&["find", "--json", "-i", "--snapshot", &b3, "ÜNÏ"])).unwrap();
    assert_eq!(
        f["snapshots"][0]["matches"].as_array().map(Vec::len),
        Some(1),
        "{f}"
    );
}

/// A restore interrupted with SIGINT stops soon even inside one pack of many
/// small files under `--write-limit`, exits with 130 and says what is left;
/// restoring again finishes the job.
#[test]
fn an_interrupted_restore_stops_soon_and_says_what_is_left() {
    let env = Env::new();
    env.init(&[]);
    let src = env.path("src");
    std::fs::create_dir_all(&src).unwrap();
    for i in 0..2000 {
        std::fs::write(src.join(format!("f{i}")), format!("{i:0>1000}")).unwrap();
    }
    let snap = env.backup(&[&src]);
    let target = env.path("t");
    let (code, err, took) = interrupted(
        env.cmd(&[
            "restore",
            &snap,
            "--target",
            target.to_str().unwrap(),
            "--write-limit",
            "20K",
        ]),
        std::time::Duration::from_millis(1500),
    );
    assert_eq!(code, Some(130), "{err}");
    assert!(took < std::time::Duration::from_secs(15), "{err}");
    assert!(err.contains("restore cancelled"), "{err}");
    assert!(!err.contains("everything else was restored"), "{err}");
    // The files in flight are said in one line, not one each.
    assert!(
        !err.contains("(cancelled)") && err.contains("being written left with the restore's time"),
        "{err}"
    );
    env.ok(&["restore", &snap, "--target", target.to_str().unwrap()]);
    let diffs = compare(&src, &target.join(src.strip_prefix("/").unwrap()));
    assert!(diffs.is_empty(), "{diffs:#?}");
}

/// An exclude file written for restic: `!PATTERN` brings back what an earlier line
/// left out (it was taken as a name starting with `!`, and the file was lost).
#[test]
fn negated_exclude_lines_include_again() {
    let env = Env::new();
    env.init(&[]);
    let src = env.path("src");
    fs::create_dir_all(src.join("a")).unwrap();
    fs::write(src.join("a/x.log"), b"1").unwrap();
    fs::write(src.join("a/y.log"), b"2").unwrap();
    let list = env.path("excludes");
    fs::write(&list, "*.log\n!x.log\n").unwrap();
    let snap = env.backup_args(&[
        "--exclude-file",
        list.to_str().unwrap(),
        src.to_str().unwrap(),
    ]);
    let listed = env.ok(&["ls", &snap]);
    assert!(listed.contains("/a/x.log"), "{listed}");
    assert!(!listed.contains("/a/y.log"), "{listed}");
}

/// A rewrite keeps its snapshot's time; `latest` (and `--keep-last`) then take the
/// rewrite, not the original it was made from: a secret dropped by `rewrite`
/// without `--forget` must not come back with `restore latest`.
#[test]
fn latest_is_the_rewrite_when_times_tie() {
    let env = Env::new();
    env.init(&[]);
    let src = env.path("src");
    fs::create_dir_all(&src).unwrap();
    fs::write(src.join("public"), b"p").unwrap();
    for i in 0..5 {
        fs::write(src.join("secret"), format!("s{i}")).unwrap();
        let time = format!("2026-01-0{}T02:00:00Z", i + 1);
        env.backup_args(&["--time", &time, src.to_str().unwrap()]);
        env.ok(&["rewrite", "latest", "--exclude", "secret", "-q"]);
        let listed = env.ok(&["ls", "latest"]);
        assert!(!listed.contains("secret"), "round {i}: {listed}");
        assert!(listed.contains("public"), "round {i}: {listed}");
    }
}

/// `--one-file-system` stops at mount points, but a path asked for on its own
/// inside another (`backup -x / /boot`) is a file system to back up too, in
/// whichever order the paths come (it was saved empty, exit 0).
#[test]
fn one_file_system_enters_a_mount_point_named_as_a_source() {
    let env = Env::new();
    env.init(&[]);
    let fs_dir = env.path("fs");
    fs::create_dir_all(fs_dir.join("mnt")).unwrap();
    fs::write(fs_dir.join("rootfile"), b"r").unwrap();
    let mnt = fs_dir.join("mnt");
    let _m = Tmpfs::mount(&mnt, "size=1m");
    fs::create_dir_all(mnt.join("sub")).unwrap();
    fs::write(mnt.join("sub/m"), b"on the mount").unwrap();
    let (f, m) = (fs_dir.to_str().unwrap(), mnt.to_str().unwrap());
    // Alone: the mount point is kept, empty.
    let snap = env.backup_args(&["-x", f]);
    let listed = env.ok(&["ls", &snap]);
    assert!(
        listed.contains("/fs/mnt") && !listed.contains("/fs/mnt/sub"),
        "{listed}"
    );
    for args in [["-x", f, m], ["-x", m, f]] {
        let snap = env.backup_args(&args);
        let listed = env.ok(&["ls", &snap]);
        assert!(listed.contains("/fs/mnt/sub/m"), "{args:?}: {listed}");
        assert!(listed.contains("/fs/rootfile"), "{args:?}: {listed}");
        let restored = env.restore(&snap, &fs_dir, &format!("r{}", args[1].len()));
        assert_eq!(
            fs::read(restored.join("mnt/sub/m")).unwrap(),
            b"on the mount"
        );
    }
    // A path below the mount point (not the mount point itself), a directory and a
    // file: the mount point is entered for them only.
    fs::write(mnt.join("other"), b"not asked for").unwrap();
    fs::write(mnt.join("file"), b"asked for").unwrap();
    let (sub, file) = (mnt.join("sub"), mnt.join("file"));
    let snap = env.backup_args(&["-x", f, sub.to_str().unwrap(), file.to_str().unwrap()]);
    let listed = env.ok(&["ls", &snap]);
    assert!(
        listed.contains("/fs/mnt/sub/m") && listed.contains("/fs/mnt/file"),
        "{listed}"
    );
    assert!(!listed.contains("/fs/mnt/other"), "{listed}");
}

/// A file replaced between the scan of its directory and the read of its content
/// (an editor saving by rename) is saved with the owner, mode and times of the
/// file read, never the content of one with the permissions of the other (a
/// private file was restored world-readable).
#[test]
fn a_file_replaced_after_the_scan_keeps_the_mode_of_the_file_read() {
    use std::os::unix::fs::PermissionsExt;
    let env = Env::new();
    env.init(&[]);
    let src = env.path("src");
    fs::create_dir_all(&src).unwrap();
    fs::write(src.join("a_big"), Rng(5).bytes(16 << 20, false)).unwrap();
    fs::write(src.join("z_cred"), b"public placeholder").unwrap();
    fs::set_permissions(src.join("z_cred"), fs::Permissions::from_mode(0o644)).unwrap();
    let backup = env
        .cmd(&[
            "backup",
            "--json",
            "--read-limit",
            "8M",
            src.to_str().unwrap(),
        ])
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    // While a_big is read (two seconds at 8 MB/s; its directory was scanned before
    // it was opened), z_cred is replaced.
    let io = format!("/proc/{}/io", backup.id());
    wait_until(
        "the backup to read a_big",
        std::time::Duration::from_secs(60),
        || {
            fs::read_to_string(&io)
                .ok()
                .and_then(|s| {
                    s.lines()
                        .find_map(|l| l.strip_prefix("rchar: "))
                        .and_then(|v| v.trim().parse::<u64>().ok())
                })
                .is_some_and(|r| r > 4 << 20)
        },
    );
    let new = src.join(".z_new");
    fs::write(&new, b"secret=hunter2").unwrap();
    fs::set_permissions(&new, fs::Permissions::from_mode(0o600)).unwrap();
    fs::rename(&new, src.join("z_cred")).unwrap();
    let out = backup.wait_with_output().unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    let snap = v["snapshot_id"].as_str().unwrap();
    let restored = env.restore(snap, &src, "r");
    let m = fs::metadata(restored.join("z_cred")).unwrap();
    assert_eq!(
        fs::read(restored.join("z_cred")).unwrap(),
        b"secret=hunter2"
    );
    assert_eq!(m.permissions().mode() & 0o777, 0o600);
}

/// A symlink given as a source is saved as the symlink; given with a trailing
/// `/` or `/.`, it names the directory it points to, which is saved (as the
/// kernel, tar and rsync read such a path).
#[test]
fn a_symlinked_source_with_a_trailing_slash_is_its_directory() {
    let env = Env::new();
    env.init(&[]);
    let dir = env.path("real");
    fs::create_dir_all(dir.join("sub")).unwrap();
    fs::write(dir.join("sub/f"), b"in the directory").unwrap();
    let link = env.path("link");
    std::os::unix::fs::symlink(&dir, &link).unwrap();
    let listed = |arg: String| {
        let v: serde_json::Value =
            serde_json::from_str(&env.ok(&["backup", "--json", &arg])).unwrap();
        let id = v["snapshot_id"].as_str().unwrap().to_string();
        env.ok(&["ls", &id])
    };
    let as_link = listed(link.to_str().unwrap().to_string());
    assert!(!as_link.contains("sub/f"), "{as_link}");
    for suffix in ["/", "/."] {
        let ls = listed(format!("{}{suffix}", link.display()));
        assert!(
            ls.contains(&format!("{}/sub/f", dir.display())),
            "{suffix}: {ls}"
        );
    }
    // A file named as a directory is refused, as the kernel refuses it.
    for suffix in ["/", "/."] {
        let e = env.fails(
            &[
                "backup",
                &format!("{}{suffix}", dir.join("sub/f").display()),
            ],
            1,
        );
        assert!(e.contains("Not a directory"), "{suffix}: {e}");
    }
}

/// `chattr` flags (`lsattr -d PATH`'s letters, without the file system's own `e`).
fn flags_of(p: &std::path::Path) -> String {
    let o = std::process::Command::new("lsattr")
        .arg("-d")
        .arg(p)
        .output()
        .unwrap();
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let out = String::from_utf8_lossy(&o.stdout);
    let letters = out.split_whitespace().next().unwrap_or("");
    letters
        .chars()
        .filter(|c| "suSDiadA".contains(*c))
        .collect()
}

/// Takes the immutable and append-only flags off everything below `dir` when
/// dropped: the test's directories could not be removed otherwise.
struct Unflag(Vec<std::path::PathBuf>);

impl Drop for Unflag {
    fn drop(&mut self) {
        for d in &self.0 {
            let _ = std::process::Command::new("chattr")
                .args(["-R", "-i", "-a"])
                .arg(d)
                .status();
        }
    }
}

/// Inode flags (`chattr +i`, `+a`, `+d`) are backed up, listed and restored: set
/// last, so an immutable directory still gets its entries and an immutable file
/// its times and its second name; a change of flags alone is a metadata change.
#[test]
fn chattr_flags_are_kept_and_restored() {
    let env = Env::new();
    env.init(&[]);
    let src = env.path("src");
    fs::create_dir_all(src.join("locked")).unwrap();
    fs::write(src.join("locked/inside"), b"in an immutable directory").unwrap();
    fs::write(src.join("imm"), b"immutable").unwrap();
    fs::hard_link(src.join("imm"), src.join("imm-too")).unwrap();
    fs::write(src.join("log"), b"append only").unwrap();
    fs::write(src.join("nodump"), b"not for dump").unwrap();
    fs::write(src.join("plain"), b"no flags").unwrap();
    fs::write(src.join("iS"), b"immutable, synchronous").unwrap();
    fs::create_dir_all(src.join("plaindir")).unwrap();
    fs::write(src.join("plaindir/inner"), b"no flags either").unwrap();
    let restored = env.path("t");
    let _unflag = Unflag(vec![src.clone(), restored.clone()]);
    for (flag, path) in [
        ("+i", "imm"),
        ("+a", "log"),
        ("+d", "nodump"),
        ("+i", "locked"),
        ("+iS", "iS"),
    ] {
        let ok = std::process::Command::new("chattr")
            .arg(flag)
            .arg(src.join(path))
            .status()
            .unwrap();
        assert!(ok.success(), "chattr {flag} {path}");
    }
    let snap = env.backup(&[&src]);
    let listed: serde_json::Value =
        serde_json::from_str(&env.ok(&["ls", &snap, "--json"])).unwrap();
    let listed_flags = |name: &str| {
        listed["entries"]
            .as_array()
            .unwrap()
            .iter()
            .find(|e| e["path"].as_str().unwrap().ends_with(name))
            .map(|e| e["flags"].as_str().unwrap_or("").to_string())
            .unwrap()
    };
    assert_eq!(listed_flags("/imm"), "i");
    assert_eq!(listed_flags("/log"), "a");
    assert_eq!(listed_flags("/plain"), "");

    let copy = env.restore(&snap, &src, "t");
    for name in ["imm", "imm-too", "log", "nodump", "locked", "plain", "iS"] {
        assert_eq!(
            flags_of(&copy.join(name)),
            flags_of(&src.join(name)),
            "{name}"
        );
    }
    assert_same(&src, &copy);
    use std::os::unix::fs::MetadataExt;
    assert_eq!(
        fs::metadata(copy.join("imm")).unwrap().ino(),
        fs::metadata(copy.join("imm-too")).unwrap().ino()
    );
    // Restored again over itself (if-changed): nothing to write, nothing refused.
    let again: serde_json::Value = serde_json::from_str(&env.ok(&[
        "restore",
        &snap,
        "--target",
        restored.to_str().unwrap(),
        "--json",
    ]))
    .unwrap();
    assert_eq!(again["files"], 0, "{again}");

    // A second snapshot changes a locked file and adds to a locked directory. It
    // restores over the first's locked entries in every mode (unlocked for the
    // restore, locked again after), and the first back over it with --delete.
    let chattr = |flag: &str, path: &std::path::Path| {
        let ok = std::process::Command::new("chattr")
            .arg(flag)
            .arg(path)
            .status()
            .unwrap();
        assert!(ok.success(), "chattr {flag} {}", path.display());
    };
    chattr("-i", &src.join("imm"));
    chattr("-i", &src.join("locked"));
    fs::write(src.join("imm"), b"immutable, second edition").unwrap();
    fs::write(src.join("locked/new"), b"added").unwrap();
    chattr("+i", &src.join("imm"));
    chattr("+i", &src.join("locked"));
    let second = env.backup(&[&src]);
    let t = restored.to_str().unwrap();
    for (snap, args) in [
        (&second, &["--overwrite", "if-changed"][..]),
        (&snap, &["--delete"][..]),
        (&second, &["--overwrite", "never"][..]),
        (&second, &["--overwrite", "always"][..]),
    ] {
        let mut cmd = vec!["restore", snap.as_str(), "--target", t];
        cmd.extend_from_slice(args);
        let o = env.run(&cmd);
        let err = String::from_utf8_lossy(&o.stderr);
        assert!(o.status.success(), "{args:?}: {err}");
        // The locked file replaced is said (QA: an administrator's lock went
        // silently).
        if args == ["--overwrite", "if-changed"] {
            assert!(
                err.contains("1 entry in ") && err.contains("restore lifted that"),
                "{err}"
            );
        }
        let added = copy.join("locked/new").exists();
        assert_eq!(added, snap == &second, "{args:?}");
        assert_eq!(flags_of(&copy.join("locked")), "i", "{args:?}");
        assert_eq!(flags_of(&copy.join("imm")), "i", "{args:?}");
    }
    assert_eq!(
        fs::read(copy.join("imm")).unwrap(),
        b"immutable, second edition"
    );
    // A second name missing beside a kept immutable first one: linked (the
    // lock lifted for it and put back).
    chattr("-i", &copy.join("imm"));
    fs::remove_file(copy.join("imm-too")).unwrap();
    chattr("+i", &copy.join("imm"));
    env.ok(&["restore", &second, "--target", t, "--overwrite", "never"]);
    assert_eq!(
        fs::metadata(copy.join("imm")).unwrap().ino(),
        fs::metadata(copy.join("imm-too")).unwrap().ino()
    );
    assert_eq!(flags_of(&copy.join("imm")), "i");
    // A directory there passes flags on to what is created in it (ext4: `d`):
    // what the restore creates there has the snapshot's, none.
    chattr("+d", &copy.join("plaindir"));
    fs::remove_file(copy.join("plaindir/inner")).unwrap();
    env.ok(&["restore", &second, "--target", t]);
    assert_eq!(flags_of(&copy.join("plaindir/inner")), "");
    // Killed while setting the flags (the last pass), then run again with
    // `never`: what the first restore left looking like the snapshot's gets
    // the snapshot's flags.
    let again_t = env.path("t2");
    let o = env
        .cmd(&["restore", &second, "--target", again_t.to_str().unwrap()])
        .env(cairn_core::hooks::KILL_AT_VAR, "restore:inode-flags:1")
        .output()
        .unwrap();
    assert!(!o.status.success());
    let _unflag2 = Unflag(vec![again_t.clone()]);
    env.ok(&[
        "restore",
        &second,
        "--target",
        again_t.to_str().unwrap(),
        "--overwrite",
        "never",
    ]);
    let again_copy = again_t.join(src.strip_prefix("/").unwrap());
    for name in ["imm", "imm-too", "log", "nodump", "locked", "iS"] {
        assert_eq!(
            flags_of(&again_copy.join(name)),
            flags_of(&src.join(name)),
            "{name}"
        );
    }
    // A target its owner locked: said, not lifted.
    chattr("+i", &again_t);
    let e = env.fails(
        &["restore", &second, "--target", again_t.to_str().unwrap()],
        1,
    );
    assert!(e.contains("is immutable or append-only"), "{e}");
    chattr("-i", &again_t);
    // A file system with only some of a file's flags (tmpfs: no `S`): those
    // it has are set, the rest said once.
    let small = env.path("small");
    let _tmpfs = Tmpfs::mount(&small, "size=8m");
    let o = env.run(&["restore", &second, "--target", small.to_str().unwrap()]);
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(o.status.success(), "{err}");
    assert!(err.contains("were not set"), "{err}");
    let on_tmpfs = small.join(src.strip_prefix("/").unwrap());
    assert_eq!(flags_of(&on_tmpfs.join("iS")), "i");
    let _ = std::process::Command::new("chattr")
        .args(["-R", "-i", "-a"])
        .arg(&small)
        .status();

    // Flags changed alone: the next backup records it, diff calls it metadata.
    let ok = std::process::Command::new("chattr")
        .arg("-d")
        .arg(src.join("nodump"))
        .status()
        .unwrap();
    assert!(ok.success());
    let next = env.backup(&[&src]);
    let diff = env.ok(&["diff", &snap, &next, "--metadata"]);
    assert!(
        diff.lines()
            .any(|l| l.starts_with('U') && l.ends_with("/nodump")),
        "{diff}"
    );

    // A user who is not root cannot set +i or +a: left out, as owners are, and
    // said once; the restore succeeds.
    let (mine, cache) = open_to_nobody(&env);
    let o = output_as_nobody(
        &mut env.cmd(&["restore", &snap, "--target", mine.to_str().unwrap()]),
        &cache,
    );
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(o.status.success(), "{err}");
    assert!(
        err.contains("inode flags (chattr) of") && err.contains("were not set"),
        "{err}"
    );
    assert_eq!(err.matches("were not set").count(), 1, "{err}");
}

/// `--ignore-ctime` and `--ignore-inode` leave out of change detection what they
/// say, as restic's flags: a file rewritten in place with its old size and time is
/// taken from the parent with `--ignore-ctime`; one replaced by a new file
/// (another inode) likewise with `--ignore-inode`. An extended attribute added
/// since is read even when the content is not. Such a file keeps the parent's
/// change time in the snapshot, so the next backup without the flag reads it.
#[test]
fn ignore_ctime_and_ignore_inode_do_what_restic_does() {
    let env = Env::new();
    env.init(&[]);
    let src = env.path("src");
    fs::create_dir_all(&src).unwrap();
    let (inplace, replaced) = (src.join("inplace"), src.join("replaced"));
    fs::write(&inplace, b"first content").unwrap();
    fs::write(&replaced, b"first content").unwrap();
    set_times(&inplace, 1_600_000_000, 0);
    set_times(&replaced, 1_600_000_000, 0);
    env.backup(&[&src]);
    let backup = |flag: &str| -> (u64, u64, String) {
        let mut args = vec!["backup", "--json", src.to_str().unwrap()];
        if !flag.is_empty() {
            args.push(flag);
        }
        let v: serde_json::Value = serde_json::from_str(&env.ok(&args)).unwrap();
        (
            v["files_changed"].as_u64().unwrap(),
            v["files_unchanged"].as_u64().unwrap(),
            v["snapshot_id"].as_str().unwrap().to_string(),
        )
    };
    let dump = |snap: &str, f: &std::path::Path| {
        env.cmd(&["dump", snap, f.to_str().unwrap()])
            .output()
            .unwrap()
            .stdout
    };
    // In place, same size and time: only the change time moved.
    fs::write(&inplace, b"other content").unwrap();
    set_times(&inplace, 1_600_000_000, 0);
    xattr::set(&inplace, "user.added", b"since").unwrap();
    let (changed, unchanged, snap) = backup("--ignore-ctime");
    assert_eq!((changed, unchanged), (0, 2));
    assert_eq!(dump(&snap, &inplace), b"first content");
    let back = env.restore(&snap, &src, "out-ctime");
    assert_eq!(
        xattr::get(back.join("inplace"), "user.added")
            .unwrap()
            .as_deref(),
        Some(&b"since"[..])
    );
    let (changed, unchanged, snap) = backup("");
    assert_eq!((changed, unchanged), (1, 1));
    assert_eq!(dump(&snap, &inplace), b"other content");
    // Replaced by a new file: another inode (and change time).
    let tmp = src.join(".tmp");
    fs::write(&tmp, b"third content").unwrap();
    set_times(&tmp, 1_600_000_000, 0);
    fs::rename(&tmp, &replaced).unwrap();
    let (changed, unchanged, snap) = backup("--ignore-inode");
    assert_eq!((changed, unchanged), (0, 2));
    assert_eq!(dump(&snap, &replaced), b"first content");
    let (changed, unchanged, snap) = backup("");
    assert_eq!((changed, unchanged), (1, 1));
    assert_eq!(dump(&snap, &replaced), b"third content");
    // `--no-scan`: no walk ahead for a total, so the status lines have none.
    let o = env.run(&[
        "backup",
        "--json",
        "--no-scan",
        "--force",
        src.to_str().unwrap(),
    ]);
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(o.status.success() && err.contains("\"status\""), "{err}");
    assert!(!err.contains("bytes_total"), "{err}");
}

/// "Everything but": with a `!` pattern, a path named on the command line is
/// entered even if a pattern matches it, and what the negation names comes back
/// with all below it, as in restic (QA: `--exclude '*' --exclude '!keep' DIR`
/// was refused as "every path given is excluded"; `!keep` brought back the
/// directory without its files).
#[test]
fn everything_but_a_negated_directory() {
    let env = Env::new();
    env.init(&[]);
    let src = env.path("src");
    for d in ["keep/sub", "a", "docs"] {
        fs::create_dir_all(src.join(d)).unwrap();
    }
    for f in [
        "keep/k.txt",
        "keep/sub/s.txt",
        "a/x.txt",
        "docs/d.txt",
        "top.txt",
    ] {
        fs::write(src.join(f), f).unwrap();
    }
    let s = src.to_str().unwrap();
    let snap = env.backup_args(&["--exclude", "*", "--exclude", "!keep", s]);
    let listed = env.ok(&["ls", &snap, s]);
    let names: Vec<&str> = listed.lines().filter_map(|l| l.strip_prefix(s)).collect();
    assert_eq!(
        names,
        ["", "/keep", "/keep/k.txt", "/keep/sub", "/keep/sub/s.txt"],
        "{listed}"
    );
    // Without a negation, a pattern naming the path still leaves it out.
    let o = env.run(&["backup", "--exclude", "*", s]);
    assert!(!o.status.success());
    assert!(String::from_utf8_lossy(&o.stderr).contains("every path given is excluded"));
}

/// The entries under `dir`, as paths relative to it, sorted (directories with
/// a trailing `/`).
fn listing(dir: &std::path::Path) -> Vec<String> {
    let mut out: Vec<String> = walk(dir)
        .into_iter()
        .map(|(p, m)| {
            let p = p.to_string_lossy().into_owned();
            if m.is_dir() { format!("{p}/") } else { p }
        })
        .collect();
    out.sort();
    out
}

#[test]
fn restore_include_patterns_choose_what_they_match() {
    let env = Env::new();
    env.init(&[]);
    let src = env.path("src");
    for d in ["etc/sub", "home/alice/Mail", "home/bob", "var/empty"] {
        fs::create_dir_all(src.join(d)).unwrap();
    }
    for (f, body) in [
        ("etc/a.conf", "a"),
        ("etc/sub/b.conf", "b"),
        ("etc/c.txt", "c"),
        ("etc/st*r", "star"),
        ("etc/stxr", "x"),
        ("etc/v[1].ini", "v"),
        ("etc/v1.ini", "1"),
        ("home/alice/Mail/inbox", "mail"),
        ("home/alice/notes.TXT", "n"),
        ("home/bob/todo.txt", "t"),
    ] {
        fs::write(src.join(f), body).unwrap();
    }
    let snap = env.backup(&[&src]);
    let s = src.display().to_string();
    let restored = |name: &str, args: &[&str]| {
        let t = env.path(name);
        let mut full = vec!["restore", &snap, "-q", "--target", t.to_str().unwrap()];
        full.extend_from_slice(args);
        env.ok(&full);
        let base = t.join(src.strip_prefix("/").unwrap());
        listing(&base)
    };
    // A restore refused (exit 1): its message; nothing was made.
    let refused = |name: &str, args: &[&str]| {
        let t = env.path(name);
        let mut full = vec!["restore", &snap, "--target", t.to_str().unwrap()];
        full.extend_from_slice(args);
        let err = env.fails(&full, 1);
        assert!(!t.exists(), "{name}: {err}");
        err
    };
    // A pattern without `/` matches a name at any depth; only the directories on
    // the way to what it matches are made (not home/ or var/).
    assert_eq!(
        restored("t1", &["--include", "*.conf"]),
        ["etc/", "etc/a.conf", "etc/sub/", "etc/sub/b.conf"]
    );
    // A directory matched comes with everything below it; a path without a
    // wildcard is a path, as before.
    let mail = format!("{}/home/*/Mail", s);
    let todo = format!("{}/home/bob/todo.txt", s);
    assert_eq!(
        restored("t2", &["--include", &mail, "--include", &todo]),
        [
            "home/",
            "home/alice/",
            "home/alice/Mail/",
            "home/alice/Mail/inbox",
            "home/bob/",
            "home/bob/todo.txt"
        ]
    );
    // --iinclude ignores case; an include file takes patterns too.
    fs::write(env.path("list"), "# text files\n*.txt\n").unwrap();
    assert_eq!(
        restored("t3", &["--iinclude", "*.TXT"]),
        [
            "etc/",
            "etc/c.txt",
            "home/",
            "home/alice/",
            "home/alice/notes.TXT",
            "home/bob/",
            "home/bob/todo.txt"
        ]
    );
    assert_eq!(
        restored(
            "t4",
            &["--include-file", env.path("list").to_str().unwrap()]
        ),
        [
            "etc/",
            "etc/c.txt",
            "home/",
            "home/bob/",
            "home/bob/todo.txt"
        ]
    );
    // `\*` is the character itself: st*r, not stxr.
    let star = format!("{}/etc/st\\*r", s);
    assert_eq!(restored("t5", &["--include", &star]), ["etc/", "etc/st*r"]);
    assert_eq!(
        fs::read(env.path("t5").join(&s[1..]).join("etc/st*r")).unwrap(),
        b"star"
    );
    // A path copied from a listing names its entry, wildcards or not.
    let v1 = format!("{}/etc/v[1].ini", s);
    assert_eq!(
        restored("t8", &["--include", &v1]),
        ["etc/", "etc/v[1].ini"]
    );
    // An include that names no entry is a pattern, as restic reads them all: a
    // name at any depth, escapes and all; `!` takes back, whatever it holds.
    assert_eq!(
        restored("t9", &["--include", "Mail"]),
        [
            "home/",
            "home/alice/",
            "home/alice/Mail/",
            "home/alice/Mail/inbox"
        ]
    );
    assert_eq!(
        restored("t10", &["--include", "st\\*r"]),
        ["etc/", "etc/st*r"]
    );
    let not_a = format!("!{}/etc/a.conf", s);
    assert_eq!(
        restored("t11", &["--include", "*.conf", "--include", &not_a]),
        ["etc/", "etc/sub/", "etc/sub/b.conf"]
    );
    // A `!` takes back below a directory another include chose, a path or a
    // pattern (QA: the directory was taken whole), and then every include is
    // a pattern, as restic reads them.
    let etc = format!("{s}/etc");
    assert_eq!(
        restored(
            "t15",
            &[
                "--include",
                &etc,
                "--include",
                "!*.txt",
                "--include",
                "!sub"
            ]
        ),
        [
            "etc/",
            "etc/a.conf",
            "etc/st*r",
            "etc/stxr",
            "etc/v1.ini",
            "etc/v[1].ini"
        ]
    );
    assert_eq!(
        restored("t16", &["--include", "etc", "--include", "!*.conf"]),
        [
            "etc/",
            "etc/c.txt",
            "etc/st*r",
            "etc/stxr",
            "etc/sub/",
            "etc/v1.ini",
            "etc/v[1].ini"
        ]
    );
    // Each list judges on its own: a `!` in --include takes back nothing that
    // --iinclude chose (QA: mixing them restored the whole snapshot).
    assert_eq!(
        restored("t18", &["--iinclude", "ETC", "--include", "!*.conf"]),
        restored("t19", &["--iinclude", "ETC"])
    );
    assert_eq!(
        restored(
            "t20",
            &[
                "--include",
                "home",
                "--iinclude",
                "ETC/SUB",
                "--include",
                "!*.txt"
            ]
        ),
        [
            "etc/",
            "etc/sub/",
            "etc/sub/b.conf",
            "home/",
            "home/alice/",
            "home/alice/Mail/",
            "home/alice/Mail/inbox",
            "home/alice/notes.TXT",
            "home/bob/"
        ]
    );
    let err = refused("t17", &["--include", "!*.txt"]);
    assert!(err.contains("only takes back"), "{err}");
    // An empty include is refused: an unset variable must not mean everything.
    for (opt, empty) in [("--include", ""), ("--iinclude", ""), ("--include", "!")] {
        let err = refused("t17", &["--include", "etc", opt, empty]);
        assert!(err.contains("an empty path or pattern"), "{err}");
    }
    // What the excludes leave out is no match: no directory is made on its way.
    assert_eq!(
        restored("t12", &["--include", "*.conf", "--exclude", "sub"]),
        ["etc/", "etc/a.conf"]
    );
    let err = refused("t13", &["--include", "*.conf", "--exclude", "*.conf"]);
    assert!(err.contains("leave out all that does"), "{err}");
    // --delete removes what the patterns match in the target and the snapshot
    // lacks, in the directories on the way to matches too; nothing else.
    restored("t14", &[]);
    let base = env.path("t14").join(&s[1..]);
    fs::write(base.join("etc/extra.conf"), "x").unwrap();
    fs::write(base.join("etc/sub/new.conf"), "x").unwrap();
    fs::write(base.join("etc/extra.txt"), "x").unwrap();
    fs::create_dir_all(base.join("newdir")).unwrap();
    let t14 = env.path("t14");
    let dry: serde_json::Value = serde_json::from_str(&env.ok(&[
        "restore",
        &snap,
        "--json",
        "-n",
        "--delete",
        "--target",
        t14.to_str().unwrap(),
        "--include",
        "*.conf",
    ]))
    .unwrap();
    assert_eq!(dry["would_delete"].as_array().unwrap().len(), 2, "{dry}");
    let after = restored("t14", &["--delete", "--include", "*.conf"]);
    assert!(!after.contains(&"etc/extra.conf".to_string()), "{after:?}");
    assert!(
        !after.contains(&"etc/sub/new.conf".to_string()),
        "{after:?}"
    );
    assert!(after.contains(&"etc/extra.txt".to_string()) && after.contains(&"newdir/".to_string()));
    assert!(
        after.contains(&"etc/c.txt".to_string())
            && after.contains(&"home/bob/todo.txt".to_string())
    );
    // A negated extra stays, with --delete too.
    fs::write(base.join("etc/keep.conf"), "mine").unwrap();
    fs::write(base.join("etc/gone.conf"), "x").unwrap();
    let after = restored(
        "t14",
        &["--delete", "--include", "*.conf", "--include", "!keep.conf"],
    );
    assert!(after.contains(&"etc/keep.conf".to_string()), "{after:?}");
    assert!(!after.contains(&"etc/gone.conf".to_string()), "{after:?}");
    let all_top = format!("{s}/*");
    let after = restored("t14", &["--delete", "--include", &all_top]);
    assert!(
        !after.contains(&"newdir/".to_string()) && !after.contains(&"etc/extra.txt".to_string()),
        "{after:?}"
    );
    // A dry run counts what the restore writes.
    let t6 = env.path("t6");
    let out = env.ok(&[
        "restore",
        &snap,
        "--json",
        "--dry-run",
        "--target",
        t6.to_str().unwrap(),
        "--include",
        "*.conf",
    ]);
    let v: serde_json::Value = serde_json::from_str(&out).unwrap();
    assert_eq!(v["files"], 2, "{out}");
    // A pattern that matches nothing restores nothing, and says so.
    let err = refused("t7", &["--include", "*.cnf"]);
    assert!(
        err.contains("nothing in the snapshot is there or matches") && err.contains("*.cnf"),
        "{err}"
    );
    // Given back as typed: a backslash (the escape of a wildcard) is not doubled.
    let err = refused("t7", &["--include", "/no/a\\b"]);
    assert!(err.contains("--include \"/no/a\\b\":"), "{err}");
    // Patterns that are not globs are usage errors: exit 2, nothing written.
    for (flag, word) in [("--include", "include"), ("--exclude", "exclude")] {
        let t = env.path("t-bad-pattern");
        let err = env.fails(
            &[
                "restore",
                &snap,
                "--target",
                t.to_str().unwrap(),
                flag,
                "/[x",
            ],
            2,
        );
        assert!(err.contains(&format!("invalid {word} pattern")), "{err}");
        assert!(!t.exists(), "{flag}: {err}");
    }
    let before = env.snapshot_ids().len();
    let err = env.fails(&["backup", &s, "--exclude", "["], 2);
    assert!(err.contains("invalid exclude pattern \"[\""), "{err}");
    assert_eq!(env.snapshot_ids().len(), before, "{err}");
}

#[test]
fn skip_if_unchanged_saves_no_snapshot_when_nothing_changed() {
    use std::os::unix::fs::PermissionsExt;
    let env = Env::new();
    env.init(&[]);
    // The snapshot holds the directories above the source too: under /tmp, whose
    // time the other tests move all along, every backup would differ. /var/tmp
    // stays still while this runs.
    let stable = tempfile::Builder::new()
        .prefix("cairn-it-skip-")
        .tempdir_in("/var/tmp")
        .unwrap();
    let src = stable.path().join("src");
    fs::create_dir_all(src.join("d")).unwrap();
    fs::write(src.join("d/f"), b"one").unwrap();
    let s = src.to_str().unwrap();
    let first = env.backup(&[&src]);
    let count = || env.snapshot_ids().len();
    let out = env.ok(&["backup", "--skip-if-unchanged", s]);
    assert!(
        out.contains(&format!("nothing changed since snapshot {}", &first[..8])),
        "{out}"
    );
    assert_eq!(count(), 1);
    let v: serde_json::Value =
        serde_json::from_str(&env.ok(&["backup", "--skip-if-unchanged", "--json", s])).unwrap();
    assert_eq!(v["unchanged"], true, "{v}");
    assert!(v.get("snapshot_id").is_none(), "{v}");
    assert_eq!(v["parent"].as_str().unwrap(), first);
    assert_eq!(count(), 1);
    // Without the flag, or with --force (no parent), a snapshot is saved.
    env.ok(&["backup", s]);
    assert_eq!(count(), 2);
    env.ok(&["backup", "--skip-if-unchanged", "--force", s]);
    assert_eq!(count(), 3);
    // A change, of content or of metadata alone, is saved.
    fs::write(src.join("d/f"), b"two").unwrap();
    let v: serde_json::Value =
        serde_json::from_str(&env.ok(&["backup", "--skip-if-unchanged", "--json", s])).unwrap();
    assert!(
        v["snapshot_id"].is_string() && v.get("unchanged").is_none(),
        "{v}"
    );
    assert_eq!(count(), 4);
    fs::set_permissions(src.join("d/f"), fs::Permissions::from_mode(0o600)).unwrap();
    env.ok(&["backup", "--skip-if-unchanged", s]);
    assert_eq!(count(), 5);
    env.ok(&["backup", "--skip-if-unchanged", s]);
    assert_eq!(count(), 5);
    env.check_clean();
}

/// `snapshots --group-by`: a table (and a JSON object) per group, `--latest`
/// counted per group; `--compact`: no size or paths.
#[test]
fn snapshots_group_by_and_compact() {
    let env = Env::new();
    env.init(&[]);
    let (a, b) = (env.path("a"), env.path("b"));
    fs::create_dir_all(&a).unwrap();
    fs::create_dir_all(&b).unwrap();
    let (a, b) = (a.to_str().unwrap(), b.to_str().unwrap());
    let mut ids = Vec::new();
    for args in [
        &["--host", "web", a][..],
        &["--host", "web", b],
        &["--host", "db", a],
    ] {
        ids.push(env.backup_args(args));
    }
    let v: serde_json::Value =
        serde_json::from_str(&env.ok(&["snapshots", "--json", "--group-by", "host"])).unwrap();
    let groups = v.as_array().unwrap();
    assert_eq!(groups.len(), 2, "{v}");
    assert_eq!(groups[0]["group_key"]["hostname"], "db");
    assert!(groups[0]["group_key"]["paths"].is_null());
    assert_eq!(groups[1]["group_key"]["hostname"], "web");
    let web: Vec<&str> = (groups[1]["snapshots"].as_array().unwrap().iter())
        .map(|s| s["id"].as_str().unwrap())
        .collect();
    assert_eq!(web, [ids[0].as_str(), ids[1].as_str()]);
    // --latest 1 per group: per host here, not per host and paths.
    let v: serde_json::Value =
        serde_json::from_str(&env.ok(&["snapshots", "--json", "-g", "host", "--latest", "1"]))
            .unwrap();
    assert_eq!(v[1]["snapshots"].as_array().unwrap().len(), 1, "{v}");
    assert_eq!(v[1]["snapshots"][0]["id"].as_str().unwrap(), ids[1]);
    let out = env.ok(&["snapshots", "-g", "host,paths", "--compact"]);
    assert_eq!(out.matches("snapshots for host ").count(), 3, "{out}");
    assert!(
        out.contains(&format!("snapshots for host web, paths [{b}]:")),
        "{out}"
    );
    assert!(out.contains("size") && !out.contains("paths\n"), "{out}");
    let row = out.lines().find(|l| l.starts_with(&ids[2][..8])).unwrap();
    assert!(
        !row.contains(a) && row.contains(" db ") && row.ends_with("0 B"),
        "{out}"
    );
    // Without --group-by, or grouped by nothing, --json stays a plain list.
    for args in [
        &["snapshots", "--json"][..],
        &["snapshots", "--json", "-g", ""],
    ] {
        let v: serde_json::Value = serde_json::from_str(&env.ok(args)).unwrap();
        assert_eq!(v.as_array().unwrap().len(), 3);
        assert!(v[0]["id"].is_string(), "{v}");
    }
    let err = env.fails(&["snapshots", "-g", "hosst"], 2);
    assert!(err.contains("cannot group by"), "{err}");
}

/// A file's runs of zeros come back as holes, and restic's `--sparse` is
/// accepted for that.
#[test]
fn restore_leaves_runs_of_zeros_as_holes() {
    use std::os::unix::fs::MetadataExt;
    let env = Env::new();
    env.init(&[]);
    let src = env.path("src");
    fs::create_dir_all(&src).unwrap();
    let mut body = Rng(3).bytes(64 << 10, false);
    body.extend(vec![0u8; 8 << 20]);
    body.extend(Rng(4).bytes(64 << 10, false));
    fs::write(src.join("disk.img"), &body).unwrap();
    let snap = env.backup(&[&src]);
    for (t, extra) in [("t1", None), ("t2", Some("--sparse"))] {
        let target = env.path(t);
        let mut args = vec!["restore", &snap, "-q", "--target", target.to_str().unwrap()];
        args.extend(extra);
        env.ok(&args);
        let f = target.join(src.strip_prefix("/").unwrap()).join("disk.img");
        assert_eq!(fs::read(&f).unwrap(), body);
        let m = fs::metadata(&f).unwrap();
        assert!(
            m.blocks() * 512 < 2 << 20,
            "{t}: {} bytes allocated for {} with 8 MiB of zeros",
            m.blocks() * 512,
            m.len()
        );
    }
}

/// `backup --verbose` lists each file as the backup reaches it, and each
/// directory (ending in `/`) once its tree is stored, as restic's -vv: new,
/// modified or unchanged since the parent; with `--json`, one "file" event line
/// each on stderr. Without the flag, nothing is listed. The summary counts
/// directories the same way.
#[test]
fn backup_verbose_lists_each_file_as_new_modified_or_unchanged() {
    let env = Env::new();
    env.init(&[]);
    let src = env.path("src");
    fs::create_dir_all(src.join("d")).unwrap();
    fs::write(src.join("a.txt"), b"a").unwrap();
    fs::write(src.join("d/b.txt"), b"b").unwrap();
    // Larger than a small file: read on the walker's own path.
    fs::write(src.join("big.bin"), Rng(5).bytes(3 << 20, false)).unwrap();
    let s = src.to_str().unwrap();
    let listed = |out: &str| listed_files(out, &src);
    let out = env.ok(&["backup", "-v", s]);
    assert_eq!(
        listed(&out),
        pairs(&[
            ("new", ""),
            ("new", "a.txt"),
            ("new", "big.bin"),
            ("new", "d/"),
            ("new", "d/b.txt")
        ]),
        "{out}"
    );
    assert!(out.contains(&format!("new       {s}/a.txt\n")), "{out}");
    assert!(out.contains(&format!("new       {s}/\n")), "{out}");
    // Every directory is new: `src`, `d` and those on the way to `src` (the
    // root, `/`, is not counted).
    let dirs = src.components().count();
    assert!(
        out.contains(&format!("dirs:      {dirs} new, 0 changed, 0 unchanged;")),
        "{out}"
    );
    fs::write(src.join("a.txt"), b"a, longer").unwrap();
    fs::write(src.join("c.txt"), b"c").unwrap();
    let out = env.ok(&["backup", "--verbose", s]);
    assert_eq!(
        listed(&out),
        pairs(&[
            ("modified", ""),
            ("modified", "a.txt"),
            ("unchanged", "big.bin"),
            ("new", "c.txt"),
            ("unchanged", "d/"),
            ("unchanged", "d/b.txt"),
        ]),
        "{out}"
    );
    // `d` kept its tree; `src` and those above it hold a changed one.
    assert!(
        out.contains(&format!(
            "dirs:      0 new, {} changed, 1 unchanged;",
            dirs - 1
        )),
        "{out}"
    );
    // A directory whose own metadata changed is modified, its entries as they
    // were (QA: a touched directory was "unchanged").
    set_times(&src.join("d"), 1_500_000_000, 0);
    let out = env.ok(&["backup", "-v", s]);
    assert!(out.contains(&format!("modified  {s}/d/\n")), "{out}");
    assert!(out.contains(&format!("unchanged {s}/d/b.txt\n")), "{out}");
    assert!(
        out.contains(&format!("dirs:      0 new, {dirs} changed, 0 unchanged;")),
        "{out}"
    );
    // Quiet without the flag.
    let out = env.ok(&["backup", s]);
    assert!(listed(&out).is_empty(), "{out}");
    // A stream is a file too.
    let mut child = env
        .cmd(&["backup", "-v", "--stdin", "--stdin-name", "in.txt"])
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    child.stdin.take().unwrap().write_all(b"hello\n").unwrap();
    let o = child.wait_with_output().unwrap();
    let out = String::from_utf8_lossy(&o.stdout);
    assert!(o.status.success(), "{o:?}");
    assert!(out.contains("new       /in.txt\n"), "{out}");
    // --json: the report on stdout, a "file" event line per file on stderr.
    fs::write(src.join("d/b.txt"), b"b, longer").unwrap();
    let o = env.run(&["backup", "-v", "--json", s]);
    assert!(o.status.success(), "{o:?}");
    let report: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
    assert!(report["snapshot_id"].is_string(), "{report}");
    assert_eq!(
        (
            &report["dirs_new"],
            &report["dirs_changed"],
            &report["dirs_unchanged"]
        ),
        (&0.into(), &dirs.into(), &0.into()),
        "{report}"
    );
    let mut files: Vec<(String, String, u64)> = String::from_utf8_lossy(&o.stderr)
        .lines()
        .filter_map(|l| serde_json::from_str::<serde_json::Value>(l).ok())
        .filter(|e| e["type"] == "file" && e["path"].as_str().is_some_and(|p| p.starts_with(s)))
        .map(|e| {
            (
                e["action"].as_str().unwrap().to_string(),
                e["path"].as_str().unwrap().to_string(),
                e["size"].as_u64().unwrap(),
            )
        })
        .collect();
    files.sort_by(|x, y| x.1.cmp(&y.1));
    let p = |n: &str| format!("{s}/{n}");
    assert_eq!(
        files,
        [
            ("modified".to_string(), format!("{s}/"), 0),
            ("unchanged".to_string(), p("a.txt"), 9),
            ("unchanged".to_string(), p("big.bin"), 3 << 20),
            ("unchanged".to_string(), p("c.txt"), 1),
            ("modified".to_string(), p("d/"), 0),
            ("modified".to_string(), p("d/b.txt"), 9),
        ]
    );
    // An entry of another kind than before is modified, as restic says: a
    // directory where a file was, a file where a directory was.
    fs::remove_file(src.join("big.bin")).unwrap();
    fs::create_dir(src.join("big.bin")).unwrap();
    fs::remove_dir_all(src.join("d")).unwrap();
    fs::write(src.join("d"), b"now a file").unwrap();
    let out = env.ok(&["backup", "-v", s]);
    assert!(out.contains(&format!("modified  {s}/big.bin/\n")), "{out}");
    assert!(out.contains(&format!("modified  {s}/d\n")), "{out}");
    assert!(
        out.contains("files:     0 new, 1 changed, 2 unchanged"),
        "{out}"
    );
}

/// `snapshots SNAPSHOT...` lists only those, as restic's: `snapshots latest
/// --json` is the newest the filters leave; an id the filters leave out, or
/// none, is an error.
#[test]
fn snapshots_lists_the_snapshots_named() {
    let env = Env::new();
    env.init(&[]);
    let src = env.path("src");
    fs::create_dir_all(&src).unwrap();
    let s = src.to_str().unwrap();
    let mut ids = Vec::new();
    for (host, time) in [
        ("a", "2026-01-01 10:00:00"),
        ("b", "2026-01-02 10:00:00"),
        ("a", "2026-01-03 10:00:00"),
        ("b", "2026-01-04 10:00:00"),
    ] {
        let v: serde_json::Value =
            serde_json::from_str(&env.ok(&["backup", "--host", host, "--time", time, "--json", s]))
                .unwrap();
        ids.push(v["snapshot_id"].as_str().unwrap().to_string());
    }
    let listed = |args: &[&str]| -> Vec<String> {
        let mut a = vec!["snapshots", "--json"];
        a.extend_from_slice(args);
        let v: serde_json::Value = serde_json::from_str(&env.ok(&a)).unwrap();
        v.as_array()
            .unwrap()
            .iter()
            .map(|s| s["id"].as_str().unwrap().to_string())
            .collect()
    };
    assert_eq!(listed(&["latest"]), [ids[3].clone()]);
    assert_eq!(listed(&["latest", "--host", "a"]), [ids[2].clone()]);
    assert_eq!(
        listed(&[&ids[2][..8], &ids[0][..8]]),
        [ids[0].clone(), ids[2].clone()]
    );
    assert_eq!(listed(&[]).len(), 4);
    let err = env.fails(&["snapshots", &ids[1][..8], "--host", "a"], 1);
    assert!(err.contains("does not match"), "{err}");
    env.fails(&["snapshots", "ffffffff"], 1);
    let err = env.fails(&["snapshots", "latest", "--host", "c"], 1);
    assert!(err.contains("latest"), "{err}");
    // A tag shown written out (U+2028 as \u{2028}) keeps the columns in line
    // (QA: the size and paths of its row were pushed out).
    env.ok(&["tag", "--add", "t\u{2028}g", &ids[0][..8]]);
    for args in [&["snapshots"][..], &["forget", "--keep-last", "9", "-n"]] {
        let out = env.ok(args);
        let rows: Vec<usize> = out
            .lines()
            .filter(|l| l.ends_with(s))
            .map(|l| l.chars().count())
            .collect();
        assert!(
            rows.len() >= 2 && rows.iter().all(|&n| n == rows[0]),
            "{out}"
        );
        assert!(out.contains("t\\u{2028}g"), "{out}");
    }
}
