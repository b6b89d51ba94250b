//! `cairn estimate`: its prediction for each block size matches what a real
//! datastore of that block size reports after backing up the same data.

use crate::util::*;
use std::fs;
use std::path::Path;

/// Data of every compressibility from fully random to text, in a mix of sizes.
fn varied(rng: &mut Rng, n: usize, random_share: u64) -> Vec<u8> {
    let mut out = Vec::with_capacity(n + 4096);
    while out.len() < n {
        let piece = 256 + rng.below(3840) as usize;
        let random = rng.below(100) < random_share;
        out.extend_from_slice(&rng.bytes(piece, !random));
    }
    out.truncate(n);
    out
}

/// Two "days" of a file share: the second keeps most files, edits some in the
/// middle (shifting everything after), adds some and drops some.
fn make_days(root: &Path) -> (std::path::PathBuf, std::path::PathBuf) {
    let mut rng = Rng(2026);
    let day1 = root.join("day1");
    for d in 0..6 {
        fs::create_dir_all(day1.join(format!("dir{d}"))).unwrap();
    }
    for i in 0..40 {
        let size = 20_000 + rng.below(700_000) as usize;
        let share = rng.below(101);
        let data = varied(&mut rng, size, share);
        fs::write(day1.join(format!("dir{}/file{i}", i % 6)), data).unwrap();
    }
    for i in 0..600 {
        let size = 1 + rng.below(8192) as usize;
        let data = varied(&mut rng, size, 50);
        fs::write(day1.join(format!("dir{}/small{i}", i % 6)), data).unwrap();
    }
    // A file holding copies of itself and a zeroed region, as images do.
    let block = varied(&mut rng, 1 << 20, 30);
    let mut image = Vec::new();
    for _ in 0..3 {
        image.extend_from_slice(&block);
        image.extend_from_slice(&varied(&mut rng, 300_000, 70));
    }
    image.extend_from_slice(&vec![0u8; 2 << 20]);
    fs::write(day1.join("image.raw"), image).unwrap();

    let day2 = root.join("day2");
    copy_tree(&day1, &day2);
    for i in (0..40).step_by(4) {
        let p = day2.join(format!("dir{}/file{i}", i % 6));
        let mut data = fs::read(&p).unwrap();
        let at = rng.below(data.len() as u64) as usize;
        let insert = varied(&mut rng, 5_000, 50);
        data.splice(at..at, insert);
        fs::write(&p, data).unwrap();
    }
    for i in 40..46 {
        let data = varied(&mut rng, 200_000, 40);
        fs::write(day2.join(format!("dir0/new{i}")), data).unwrap();
    }
    for i in (1..40).step_by(9) {
        fs::remove_file(day2.join(format!("dir{}/file{i}", i % 6))).unwrap();
    }
    (day1, day2)
}

fn f(v: &serde_json::Value, k: &str) -> f64 {
    v[k].as_f64()
        .unwrap_or_else(|| panic!("{k} missing in {v}"))
}

#[test]
fn estimate_is_within_two_points_of_real_datastores_for_every_block_size() {
    let scratch = Env::new();
    let (day1, day2) = make_days(scratch.dir.path());
    let html = scratch.path("report.html");
    let est: serde_json::Value = serde_json::from_str(&scratch.ok(&[
        "estimate",
        "--json",
        "--scale",
        "10T",
        "--ram",
        "64G",
        "--html",
        html.to_str().unwrap(),
        day1.to_str().unwrap(),
        day2.to_str().unwrap(),
    ]))
    .unwrap();
    let blocks = est["block_sizes"].as_array().unwrap();
    assert_eq!(blocks.len(), 5, "{est}");

    let mut checked = 0;
    for (b, compression) in blocks
        .iter()
        .map(|b| (b, "standard"))
        .chain(std::iter::once((&blocks[2], "max")))
    {
        let bs = b["block_size"].as_u64().unwrap();
        let env = Env::new();
        env.init(&[
            "--block-size",
            &format!("{}K", bs / 1024),
            "--compression",
            compression,
        ]);
        env.backup(&[&day1]);
        env.backup(&[&day2]);
        let real: serde_json::Value = serde_json::from_str(&env.ok(&["stats", "--json"])).unwrap();
        let (c, r) = match compression {
            "max" => ("compression_max_percent", "reduction_max_percent"),
            _ => ("compression_standard_percent", "reduction_standard_percent"),
        };
        for (what, e, real) in [
            ("dedup", f(b, "dedup_percent"), f(&real, "dedup_percent")),
            ("compression", f(b, c), f(&real, "compression_percent")),
            ("reduction", f(b, r), f(&real, "reduction_percent")),
        ] {
            eprintln!("{bs} {compression} {what}: estimated {e:.2}%, real {real:.2}%");
            assert!(
                (e - real).abs() <= 2.0,
                "{bs} {compression}: estimated {what} {e:.2}% vs real {real:.2}%\nestimate {b}\nreal {real}"
            );
        }
        // The data is meant to exercise both: a test that cannot fail is no test.
        assert!(f(&real, "dedup_percent") > 25.0, "{real}");
        assert!(f(&real, "compression_percent") > 15.0, "{real}");
        assert_eq!(
            b["sample"]["stored_bytes"].as_u64(),
            real["stored_bytes"].as_u64(),
            "the data read is the data backed up"
        );
        checked += 1;
    }
    assert_eq!(checked, 6);

    // Smaller blocks find more duplicates here; the index grows as blocks shrink.
    let dedup: Vec<f64> = blocks.iter().map(|b| f(b, "dedup_percent")).collect();
    assert!(dedup[0] > dedup[4], "{dedup:?}");
    let ram: Vec<u64> = blocks
        .iter()
        .map(|b| b["scaled"]["ram_placement_ram_bytes"].as_u64().unwrap())
        .collect();
    assert!(ram.windows(2).all(|w| w[0] > w[1]), "{ram:?}");
    assert!(est["recommendation"]["reasons"].as_array().unwrap().len() >= 2);

    let page = fs::read_to_string(&html).unwrap();
    assert!(page.starts_with("<!DOCTYPE html>") && page.contains("<svg"));
    assert!(page.contains("Recommended"), "{page}");
    assert!(!page.contains("<script"), "self-contained, no scripts");
}

#[test]
fn estimate_rejects_bad_input_clearly() {
    let env = Env::new();
    let missing = env.path("nowhere");
    let err = env.fails(&["estimate", missing.to_str().unwrap()], 1);
    assert!(err.contains("nowhere"), "{err}");
    // The report's path is tried before the data is read, and a report file made
    // for an estimate that then fails is not left behind.
    let src = env.path("src");
    fs::create_dir_all(&src).unwrap();
    let report = env.path("no-dir/report.html");
    let err = env.fails(
        &[
            "estimate",
            "--html",
            report.to_str().unwrap(),
            src.to_str().unwrap(),
        ],
        1,
    );
    assert!(err.contains("cannot write the report"), "{err}");
    let report = env.path("report.html");
    let err = env.fails(
        &[
            "estimate",
            "--html",
            report.to_str().unwrap(),
            missing.to_str().unwrap(),
        ],
        1,
    );
    assert!(err.contains("nowhere") && !report.exists(), "{err}");
    let err = env.fails(
        &["estimate", "--block-sizes", "4K,12K", src.to_str().unwrap()],
        1,
    );
    assert!(err.contains("12288"), "{err}");
    // Nothing to read is still an answer, not a crash.
    let out = env.ok(&["estimate", "--ram", "8G", src.to_str().unwrap()]);
    assert!(out.contains("read 0 files"), "{out}");
}

/// A path longer than one system call takes (which backup stores) is read too.
#[test]
fn paths_longer_than_path_max_are_estimated() {
    let env = Env::new();
    let src = env.path("src");
    let mut deep = src.clone();
    for _ in 0..45 {
        deep.push("d".repeat(100));
    }
    // Made a level at a time through descriptors (one path would be too long).
    fs::create_dir_all(&src).unwrap();
    let mut dir = fs::File::open(&src).unwrap();
    for _ in 0..45 {
        use std::os::fd::AsFd;
        let name = "d".repeat(100);
        nix::sys::stat::mkdirat(
            dir.as_fd(),
            name.as_str(),
            nix::sys::stat::Mode::from_bits_truncate(0o755),
        )
        .unwrap();
        let fd = nix::fcntl::openat(
            dir.as_fd(),
            name.as_str(),
            nix::fcntl::OFlag::O_RDONLY | nix::fcntl::OFlag::O_DIRECTORY,
            nix::sys::stat::Mode::empty(),
        )
        .unwrap();
        dir = fs::File::from(fd);
    }
    {
        use std::os::fd::AsFd;
        let fd = nix::fcntl::openat(
            dir.as_fd(),
            "leaf",
            nix::fcntl::OFlag::O_WRONLY | nix::fcntl::OFlag::O_CREAT,
            nix::sys::stat::Mode::from_bits_truncate(0o644),
        )
        .unwrap();
        std::io::Write::write_all(&mut fs::File::from(fd), b"deep\n").unwrap();
    }
    fs::write(src.join("top"), b"top\n").unwrap();
    assert!(deep.as_os_str().len() > 4096);
    let out = env
        .cmd(&[
            "estimate",
            "--block-sizes",
            "16K",
            "--json",
            src.to_str().unwrap(),
        ])
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!stderr.contains("too long"), "{stderr}");
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(v["files"], 2, "{v}");
}
