//! Repositories on S3 (the MinIO server scripts/test.sh starts), storage faults
//! (`CAIRN_FAULTS`) and rate limits: every command works on S3 as on a directory,
//! transient failures are retried, permanent ones fail cleanly and lose nothing.

use crate::util::*;
use std::fs;
use std::time::{Duration, Instant};

fn downloaded(stderr: &str) -> u64 {
    traffic_bytes(stderr, "downloaded")
}

fn traffic(env: &Env, args: &[&str]) -> u64 {
    let o = env
        .cmd(args)
        .env("CAIRN_TRAFFIC_REPORT", "1")
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&o.stderr).into_owned();
    assert!(o.status.success(), "cairn {args:?}: {stderr}");
    downloaded(&stderr)
}

#[test]
fn every_command_works_on_s3() {
    let env = Env::s3("commands");
    let src = env.path("src");
    make_full_tree(&src, 21);
    env.init(&[]);
    // A second init refuses (the repository exists).
    env.fails(&["init"], 1);
    let first = env.backup(&[&src]);
    let orig = env.path("orig");
    copy_tree(&src, &orig);
    fs::write(src.join("small.txt"), b"changed on day two").unwrap();
    fs::create_dir_all(src.join("new-dir")).unwrap();
    fs::write(src.join("new-dir/new.bin"), Rng(5).bytes(3 << 20, false)).unwrap();
    let second = env.backup(&[&src]);
    assert_eq!(env.snapshot_ids().len(), 2);

    let restored = env.restore(&second, &src, "r2");
    assert_same(&src, &restored);
    let restored = env.restore(&first, &src, "r1");
    assert_same(&orig, &restored);
    let listing = env.ok(&["ls", &second]);
    assert!(listing.contains("new.bin"), "{listing}");
    let dumped = env
        .cmd(&["dump", &second, &format!("{}/small.txt", src.display())])
        .output()
        .unwrap();
    assert_eq!(dumped.stdout, b"changed on day two");
    let stats: serde_json::Value = serde_json::from_str(&env.ok(&["stats", "--json"])).unwrap();
    assert!(stats["snapshots"].as_u64().unwrap_or(2) >= 1, "{stats}");
    let pw2 = env.path("pw2");
    fs::write(&pw2, "second password\n").unwrap();
    env.ok(&["key", "add", "--new-password-file", pw2.to_str().unwrap()]);
    let o = env
        .cmd(&["snapshots"])
        .env_remove("CAIRN_PASSWORD")
        .arg("--password-file")
        .arg(&pw2)
        .output()
        .unwrap();
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));

    env.ok(&["forget", &first]);
    env.ok(&["prune"]);
    env.check_clean();
    assert_same(&src, &env.restore(&second, &src, "r3"));

    // Settings, locks, the index's placement, and rebuilding the index from packs.
    env.ok(&["config", "--max-concurrent-jobs", "3"]);
    env.ok(&["unlock"]);
    let ssd = env.path("ssd-index");
    env.ok(&[
        "index",
        "--placement",
        "ssd",
        "--path",
        ssd.to_str().unwrap(),
    ]);
    env.ok(&["index", "--placement", "ram"]);
    env.ok(&["repair", "index"]);
    env.check_clean();

    // Three backups at once into the same S3 repository.
    let trees: Vec<_> = (0..3)
        .map(|i| {
            let t = env.path(&format!("job{i}"));
            fs::create_dir_all(&t).unwrap();
            fs::write(t.join("shared.bin"), Rng(40).bytes(2 << 20, false)).unwrap();
            fs::write(t.join("own.bin"), Rng(41 + i).bytes(1 << 20, false)).unwrap();
            t
        })
        .collect();
    let children: Vec<_> = trees
        .iter()
        .map(|t| {
            env.cmd(&["backup", "-q", t.to_str().unwrap()])
                .spawn()
                .unwrap()
        })
        .collect();
    for mut c in children {
        assert!(c.wait().unwrap().success());
    }
    assert_eq!(env.snapshot_ids().len(), 4);
    env.check_clean();
}

#[test]
fn the_cache_spares_downloads() {
    let env = Env::s3("cache");
    let src = env.path("src");
    fs::create_dir_all(&src).unwrap();
    for d in 0..20 {
        let dir = src.join(format!("d{d}"));
        fs::create_dir_all(&dir).unwrap();
        for f in 0..20 {
            fs::write(dir.join(format!("f{f}")), format!("{d}/{f}").repeat(50)).unwrap();
        }
    }
    env.init(&[]);
    env.backup(&[&src]);
    // Listing and an unchanged re-backup read index, snapshots and the parent's
    // trees: from the cache, not from S3 (only config, key and locks travel).
    let listed = traffic(&env, &["snapshots"]);
    let rebackup = traffic(&env, &["backup", src.to_str().unwrap()]);
    let uncached = traffic(&env, &["--no-cache", "backup", src.to_str().unwrap()]);
    assert!(listed < 4096, "snapshots downloaded {listed} bytes");
    assert!(
        rebackup * 3 < uncached,
        "cached re-backup downloaded {rebackup} bytes, uncached {uncached}"
    );
    // A cache emptied by hand is only slower.
    fs::remove_dir_all(env.dir.path().join("cache")).unwrap();
    env.ok(&["backup", src.to_str().unwrap()]);
    env.check_clean();
}

#[test]
fn s3_errors_are_one_clear_line() {
    let env = Env::s3("errors");
    let base = std::env::var("CAIRN_TEST_S3").unwrap();
    let endpoint = base.rsplit_once('/').unwrap().0.to_string();
    // A bucket that does not exist.
    let mut c = env.cmd(&["init"]);
    c.arg("--repo")
        .arg(format!("{endpoint}/no-such-bucket-here/x"));
    let o = c.output().unwrap();
    let err = String::from_utf8_lossy(&o.stderr);
    assert_eq!(o.status.code(), Some(1), "{err}");
    assert!(err.contains("bucket does not exist"), "{err}");
    // Nothing there yet: not a repository (exit 10).
    let err = env.fails(&["snapshots"], 10);
    assert!(
        err.contains("not a cairn repository") || err.contains("no repository"),
        "{err}"
    );
    // Wrong credentials are refused, not retried for minutes.
    env.init(&[]);
    let t0 = Instant::now();
    let o = env
        .cmd(&["snapshots"])
        .env("AWS_SECRET_ACCESS_KEY", "wrong-secret")
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&o.stderr);
    assert_eq!(o.status.code(), Some(1), "{err}");
    assert!(!err.contains("panicked"), "{err}");
    assert_eq!(err.trim().lines().count(), 1, "{err}");
    assert!(
        err.contains("access denied") && err.contains("SignatureDoesNotMatch"),
        "{err}"
    );
    assert!(t0.elapsed() < Duration::from_secs(20));
    // Malformed locations.
    for bad in ["s3:http://127.0.0.1:1", "s3:"] {
        let mut c = env.cmd(&["snapshots"]);
        c.arg("--repo").arg(bad);
        let o = c.output().unwrap();
        let err = String::from_utf8_lossy(&o.stderr);
        // A location that cannot be one is a usage error.
        assert_eq!(o.status.code(), Some(2), "{bad}: {err}");
        assert!(
            err.contains("bucket") || err.contains("host"),
            "{bad}: {err}"
        );
    }
}

/// An S3 endpoint that takes requests and never answers (a frozen server, a
/// firewall dropping packets) is given up on within what `--retry-for` allows,
/// not after a minute or two of silence per attempt (QA: 2 minutes with
/// `--retry-for 5s`; 16 minutes by default).
#[test]
fn a_silent_s3_endpoint_is_given_up_within_retry_for() {
    let silent = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let port = silent.local_addr().unwrap().port();
    // Accepts every connection and keeps it open, saying nothing.
    std::thread::spawn(move || {
        let mut held = Vec::new();
        for c in silent.incoming() {
            held.push(c);
        }
    });
    let env = Env::new();
    let t0 = Instant::now();
    let mut c = env.cmd(&["--retry-for", "5s", "--no-cache", "snapshots"]);
    c.arg("--repo")
        .arg(format!("s3:http://127.0.0.1:{port}/bucket/repo"))
        .env("AWS_ACCESS_KEY_ID", "x")
        .env("AWS_SECRET_ACCESS_KEY", "y");
    let o = c.output().unwrap();
    let err = String::from_utf8_lossy(&o.stderr);
    assert_ne!(o.status.code(), Some(0), "{err}");
    assert!(err.contains("--retry-for"), "{err}");
    assert!(
        t0.elapsed() < Duration::from_secs(45),
        "{:?}: {err}",
        t0.elapsed()
    );
}

/// One failed call in ten (before or after reaching the store) is retried away:
/// backup, restore, forget, prune and check all succeed, and the data is exact.
#[test]
fn transient_faults_are_retried() {
    let env = Env::new();
    let src = env.path("src");
    make_full_tree(&src, 22);
    env.init(&[]);
    let faults = |args: &[&str], seed: u32| {
        let o = env
            .cmd(args)
            .env(
                "CAIRN_FAULTS",
                format!("fail=0.1,delay=0.1,delay-ms=5,seed={seed}"),
            )
            .output()
            .unwrap();
        assert!(
            o.status.success(),
            "cairn {args:?} under faults: {}",
            String::from_utf8_lossy(&o.stderr)
        );
        String::from_utf8_lossy(&o.stdout).into_owned()
    };
    faults(&["backup", src.to_str().unwrap()], 1);
    fs::write(src.join("small.txt"), b"second").unwrap();
    faults(&["backup", src.to_str().unwrap()], 2);
    let ids = env.snapshot_ids();
    let target = env.path("r");
    faults(
        &["restore", &ids[1], "--target", target.to_str().unwrap()],
        3,
    );
    assert_same(&src, &target.join(src.strip_prefix("/").unwrap()));
    faults(&["forget", &ids[0]], 4);
    faults(&["prune"], 5);
    faults(&["check", "--read-data"], 6);
    env.check_clean();
}

/// Storage that stops working part-way (dead server, full bucket): each command
/// fails with a clear error, and what was committed before is intact.
#[test]
fn permanent_faults_fail_cleanly_and_lose_nothing() {
    let env = Env::new();
    let src = env.path("src");
    make_full_tree(&src, 23);
    env.init(&[]);
    let first = env.backup(&[&src]);
    let orig = env.path("orig");
    copy_tree(&src, &orig);
    fs::write(src.join("big.bin"), Rng(9).bytes(6 << 20, false)).unwrap();
    for (ops, after) in [("put", 0), ("put", 1), ("put", 2), ("get", 3), ("list", 2)] {
        let o = env
            .cmd(&["backup", src.to_str().unwrap()])
            .env(
                "CAIRN_FAULTS",
                format!("fail=1,kind=permanent,ops={ops},after={after}"),
            )
            .output()
            .unwrap();
        let err = String::from_utf8_lossy(&o.stderr);
        assert_eq!(o.status.code(), Some(1), "{ops} after {after}: {err}");
        assert!(err.contains("injected fault"), "{err}");
        assert!(!err.contains("panicked"), "{err}");
        env.check_clean();
        assert_same(
            &orig,
            &env.restore(&first, &src, &format!("r-{ops}-{after}")),
        );
    }
    // Prune whose deletes fail, and a restore whose reads fail. The first snapshot's
    // random.bin is in no other snapshot: prune has a pack to delete.
    fs::remove_file(src.join("dir/random.bin")).unwrap();
    let second = env.backup(&[&src]);
    env.ok(&["forget", &first]);
    let o = env
        .cmd(&["prune"])
        .env("CAIRN_FAULTS", "fail=1,kind=permanent,ops=delete")
        .output()
        .unwrap();
    assert_eq!(
        o.status.code(),
        Some(1),
        "{}",
        String::from_utf8_lossy(&o.stderr)
    );
    env.check_clean();
    let target = env.path("rf");
    let o = env
        .cmd(&["restore", &second, "--target", target.to_str().unwrap()])
        .env("CAIRN_FAULTS", "fail=1,kind=permanent,ops=get,after=4")
        .output()
        .unwrap();
    assert_ne!(o.status.code(), Some(0));
    assert!(!String::from_utf8_lossy(&o.stderr).contains("panicked"));
    env.ok(&["prune"]);
    env.check_clean();
    assert_same(&src, &env.restore(&second, &src, "r-final"));
}

/// `--limit-upload` / `--limit-download` hold the average rate: 3 MiB of
/// incompressible data at 1 MiB/s takes at least ~3 s each way.
#[test]
fn rate_limits_hold() {
    let env = Env::new();
    let src = env.path("src");
    fs::create_dir_all(&src).unwrap();
    fs::write(src.join("random.bin"), Rng(3).bytes(3 << 20, false)).unwrap();
    env.init(&[]);
    let t0 = Instant::now();
    env.ok(&["--limit-upload", "1M", "backup", src.to_str().unwrap()]);
    assert!(
        t0.elapsed() >= Duration::from_millis(2900),
        "{:?}",
        t0.elapsed()
    );
    let ids = env.snapshot_ids();
    let target = env.path("r");
    let t0 = Instant::now();
    env.ok(&[
        "--limit-download",
        "1M",
        "restore",
        &ids[0],
        "--target",
        target.to_str().unwrap(),
    ]);
    assert!(
        t0.elapsed() >= Duration::from_millis(2900),
        "{:?}",
        t0.elapsed()
    );
    assert_same(&src, &target.join(src.strip_prefix("/").unwrap()));
    let err = env.fails(&["--limit-upload", "fast", "snapshots"], 2);
    assert!(err.contains("limit-upload"), "{err}");
}

/// Damage on the S3 server is found by `check` even when the local cache holds
/// intact copies: check reads what the storage holds.
#[test]
fn check_sees_damage_on_s3_behind_the_cache() {
    use cairn_backend::{Backend, S3Backend, S3Options};
    let env = Env::s3("damage");
    let src = env.path("src");
    make_full_tree(&src, 24);
    env.init(&[]);
    env.backup(&[&src]);
    env.ok(&["snapshots"]); // fills the cache
    env.check_clean();
    let store = S3Backend::open(&env.location, &S3Options::default()).unwrap();
    let index = store.list("index/").unwrap();
    let victim = &index[0].name;
    let mut raw = store.get(victim).unwrap();
    let mid = raw.len() / 2;
    raw[mid] ^= 0x40;
    store.put(victim, &raw).unwrap();
    let out = env.run(&["check"]);
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    assert_eq!(out.status.code(), Some(1), "{text}");
    assert!(!text.contains("no errors were found"), "{text}");
}

/// https with a private CA: refused (at once, not retried) without it, accepted with
/// `--cacert`, and with `--insecure-tls`.
#[test]
fn tls_with_a_private_ca() {
    let mut env = Env::new();
    let server = OwnMinio::start(&env, true);
    env.location = format!("s3:{}/{}/repo", server.endpoint, server.bucket);
    let with_creds = |c: &mut std::process::Command| {
        c.env("AWS_ACCESS_KEY_ID", &server.user)
            .env("AWS_SECRET_ACCESS_KEY", &server.secret);
    };
    let t0 = Instant::now();
    let mut c = env.cmd(&["init"]);
    with_creds(&mut c);
    let o = c.output().unwrap();
    let err = String::from_utf8_lossy(&o.stderr);
    assert_eq!(o.status.code(), Some(1), "{err}");
    assert!(
        err.contains("certificate") && err.contains("--cacert"),
        "{err}"
    );
    assert!(
        t0.elapsed() < Duration::from_secs(10),
        "a certificate error was retried"
    );
    let ca = server.ca.as_ref().unwrap().to_str().unwrap().to_string();
    let mut c = env.cmd(&["--cacert", &ca, "init"]);
    with_creds(&mut c);
    assert!(c.status().unwrap().success());
    let src = env.path("src");
    make_full_tree(&src, 25);
    let mut c = env.cmd(&["--insecure-tls", "backup", "-q", src.to_str().unwrap()]);
    with_creds(&mut c);
    assert!(c.status().unwrap().success());
    let target = env.path("r");
    let mut c = env.cmd(&[
        "--cacert",
        &ca,
        "restore",
        "latest",
        "--target",
        target.to_str().unwrap(),
    ]);
    with_creds(&mut c);
    assert!(c.status().unwrap().success());
    assert_same(&src, &target.join(src.strip_prefix("/").unwrap()));
}

/// Credentials from a profile in the shared credentials file (no AWS_* keys set).
#[test]
fn credentials_from_a_profile() {
    let env = Env::s3("profile");
    let home = env.path("home");
    fs::create_dir_all(home.join(".aws")).unwrap();
    fs::write(
        home.join(".aws/credentials"),
        format!(
            "[default]\naws_access_key_id = nobody\naws_secret_access_key = nothing\n\n[backup]\naws_access_key_id = {}\naws_secret_access_key = {}\n",
            std::env::var("AWS_ACCESS_KEY_ID").unwrap(),
            std::env::var("AWS_SECRET_ACCESS_KEY").unwrap()
        ),
    )
    .unwrap();
    let run = |args: &[&str], profile: Option<&str>| {
        let mut c = env.cmd(args);
        c.env("HOME", &home)
            .env_remove("AWS_ACCESS_KEY_ID")
            .env_remove("AWS_SECRET_ACCESS_KEY")
            .env_remove("AWS_PROFILE");
        if let Some(p) = profile {
            c.env("AWS_PROFILE", p);
        }
        c.output().unwrap()
    };
    let o = run(&["init"], Some("backup"));
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let o = run(&["--s3-profile", "backup", "snapshots"], None);
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    // The default profile's keys are refused by the server.
    let o = run(&["snapshots"], None);
    assert_eq!(o.status.code(), Some(1));
    assert!(String::from_utf8_lossy(&o.stderr).contains("access denied"));
}

/// A cairn server address that answers with a redirect (a proxy that moved,
/// http to https) is said as such, with what to do, by every request alike:
/// no request follows it, an upload's body could not be sent twice (review
/// r39: reads followed redirects and uploads failed on them).
#[test]
fn a_redirecting_server_address_is_said_as_one() {
    use std::io::{Read, Write};
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let port = listener.local_addr().unwrap().port();
    std::thread::spawn(move || {
        for c in listener.incoming() {
            let Ok(mut c) = c else { continue };
            let mut buf = [0u8; 4096];
            let _ = c.read(&mut buf);
            let _ = c.write_all(
                b"HTTP/1.1 308 Permanent Redirect\r\nLocation: http://127.0.0.1:1/elsewhere\r\n\
                  Content-Length: 0\r\nConnection: close\r\n\r\n",
            );
        }
    });
    let env = Env::new();
    let o = env
        .cmd(&["--retry-for", "0", "snapshots"])
        .arg("--repo")
        .arg(format!("cairn+http://127.0.0.1:{port}/main"))
        .env(
            "CAIRN_TOKEN",
            format!("cairn_{}_{}", "0".repeat(16), "0".repeat(64)),
        )
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&o.stderr);
    assert_ne!(o.status.code(), Some(0), "{err}");
    assert!(
        err.contains("308") && err.contains("give the address it sends to"),
        "{err}"
    );
}
