//! Image backups (`backup --image`): fixed blocks, changed-block lists, restore to
//! files and block devices, and the bad inputs around them — a source with
//! unreadable blocks (a FUSE file started by the test that answers EIO there), a
//! changed-block list that lies, a device too small or mounted.

use crate::util::*;
use std::fs;
use std::os::unix::fs::{FileExt, MetadataExt};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::Duration;

const MIB: usize = 1 << 20;

/// A disk-like image: random data with runs of zeros, not a multiple of the block
/// size long.
fn make_image(path: &Path, mib: usize, seed: u64) -> Vec<u8> {
    let mut rng = Rng(seed);
    let mut data = Vec::with_capacity(mib * MIB + 5000);
    for i in 0..mib {
        if i % 4 == 3 {
            data.extend(std::iter::repeat_n(0u8, MIB));
        } else {
            data.extend(rng.bytes(MIB, i % 2 == 0));
        }
    }
    data.extend(rng.bytes(5000, false));
    fs::write(path, &data).unwrap();
    data
}

/// Overwrites `ranges` of the image with new bytes; returns the list's text.
fn change(path: &Path, data: &mut [u8], ranges: &[(usize, usize)], seed: u64) -> String {
    let mut rng = Rng(seed);
    let mut text = String::from("# offset length\n");
    for &(off, len) in ranges {
        data[off..off + len].copy_from_slice(&rng.bytes(len, false));
        text.push_str(&format!("{off} {len}\n"));
    }
    fs::write(path, &*data).unwrap();
    text
}

fn backup_image(env: &Env, src: &Path, extra: &[&str]) -> serde_json::Value {
    let mut a = vec!["backup", "--json", "--image", src.to_str().unwrap()];
    a.extend_from_slice(extra);
    serde_json::from_str(&env.ok(&a)).unwrap()
}

/// `backup --image SRC --changed-blocks LIST`, which must succeed: its report
/// and what it said on stderr.
fn backup_image_listed(env: &Env, src: &Path, list: &Path) -> (serde_json::Value, String) {
    let o = env.run(&[
        "backup",
        "--json",
        "--image",
        src.to_str().unwrap(),
        "--changed-blocks",
        list.to_str().unwrap(),
    ]);
    let err = String::from_utf8_lossy(&o.stderr).into_owned();
    assert!(o.status.success(), "{err}");
    (serde_json::from_slice(&o.stdout).unwrap(), err)
}

/// `backup --image SRC`: its snapshot's id.
fn image_snapshot(env: &Env, src: &Path) -> String {
    backup_image(env, src, &[])["snapshot_id"]
        .as_str()
        .unwrap()
        .to_string()
}

fn image_of(env: &Env, snap: &str) -> serde_json::Value {
    let v: serde_json::Value = serde_json::from_str(&env.ok(&["snapshots", "--json"])).unwrap();
    v.as_array()
        .unwrap()
        .iter()
        .find(|s| s["id"].as_str().unwrap().starts_with(snap))
        .unwrap()["image"]
        .clone()
}

fn restore_image(env: &Env, snap: &str, target: &Path, extra: &[&str]) -> String {
    let mut a = vec![
        "restore",
        snap,
        "--image",
        "--target",
        target.to_str().unwrap(),
    ];
    a.extend_from_slice(extra);
    env.ok(&a)
}

#[test]
fn image_backups_are_full_every_time_and_changed_blocks_cost_what_changed() {
    let env = Env::new();
    env.init(&["--block-size", "16K"]);
    let src = env.path("disk.img");
    let mut data = make_image(&src, 40, 1);
    let first = backup_image(&env, &src, &[]);
    let s1 = first["snapshot_id"].as_str().unwrap().to_string();
    let i1 = image_of(&env, &s1);
    let blocks = (data.len() as u64).div_ceil(16384);
    assert_eq!(i1["blocks"], blocks);
    assert_eq!(i1["blocks_read"], blocks);
    assert_eq!(i1["size"], data.len() as u64);
    // 10 of the 40 MiB are zeros: stored once, counted.
    assert!(i1["blocks_zero"].as_u64().unwrap() >= 640, "{i1}");
    let original = data.clone();

    // Three changed places (one spanning a block boundary): a changed-block list.
    let ranges = [
        (3 * MIB + 100, 5000),
        (17 * MIB + 16380, 10),
        (39 * MIB, 70000),
    ];
    let list = change(&src, &mut data, &ranges, 2);
    let cbt = env.path("changed.txt");
    fs::write(&cbt, list).unwrap();
    let second = backup_image(&env, &src, &["--changed-blocks", cbt.to_str().unwrap()]);
    let s2 = second["snapshot_id"].as_str().unwrap().to_string();
    let i2 = image_of(&env, &s2);
    // Blocks touched: 1 + 2 + 5 (70000 bytes from a block boundary).
    assert_eq!(i2["blocks_read"], 8, "{i2}");
    assert_eq!(i2["blocks_changed"], 8, "{i2}");
    assert_eq!(i2["changed_blocks_input"], true);
    assert_eq!(second["bytes_read"], 8 * 16384);
    // Only the lists around the changes are new: 8 blocks, 3 level-0 lists, the
    // level-1 list and the root, and the snapshot's tree.
    let added = second["blobs_added"].as_u64().unwrap();
    assert!(added <= 8 + 3 + 2 + 1, "blobs added: {added}");

    // A whole read of the same content finds nothing new: the same list.
    let third = backup_image(&env, &src, &[]);
    let i3 = image_of(&env, third["snapshot_id"].as_str().unwrap());
    assert_eq!(i3["blocks_changed"], 0, "{i3}");
    assert!(third["blobs_added"].as_u64().unwrap() <= 1, "{third}");

    // Every snapshot restores on its own, sparse, and verified.
    let out2 = env.path("out2.img");
    let text = restore_image(&env, &s2, &out2, &["--verify"]);
    assert!(text.contains("verified"), "{text}");
    assert!(fs::read(&out2).unwrap() == data, "snapshot 2 differs");
    assert!(
        fs::metadata(&out2).unwrap().blocks() * 512 < data.len() as u64 - 8 * MIB as u64,
        "zero blocks were written, not left as holes"
    );
    let out1 = env.path("out1.img");
    restore_image(&env, &s1, &out1, &[]);
    assert!(fs::read(&out1).unwrap() == original, "snapshot 1 differs");
    // An existing file is not replaced without --overwrite always.
    let e = env.fails(
        &[
            "restore",
            &s1,
            "--image",
            "--target",
            out2.to_str().unwrap(),
        ],
        1,
    );
    assert!(e.contains("exists"), "{e}");
    restore_image(&env, &s1, &out2, &["--overwrite", "always"]);
    assert!(fs::read(&out2).unwrap() == original);
    // A directory target gets the image under its name; a plain restore of an
    // image snapshot gives the same file.
    fs::create_dir(env.path("dir")).unwrap();
    restore_image(&env, &s2, &env.path("dir"), &[]);
    assert!(fs::read(env.path("dir/disk.img")).unwrap() == data);
    env.ok(&[
        "restore",
        &s2,
        "--target",
        env.path("plain").to_str().unwrap(),
    ]);
    // (The snapshot's root holds the image under its name alone.)
    assert!(fs::read(env.path("plain/disk.img")).unwrap() == data);

    // snapshots and stats say what they are.
    let table = env.ok(&["snapshots"]);
    assert!(table.contains("[image: 8 changed of"), "{table}");
    let stats = env.ok(&["stats"]);
    assert!(stats.contains("of which images:     3"), "{stats}");
    env.check_clean();
}

#[test]
fn a_source_that_grew_or_shrank_is_read_where_the_parent_cannot_stand_for_it() {
    let env = Env::new();
    env.init(&["--block-size", "4K"]);
    let src = env.path("vm.raw");
    let mut data = make_image(&src, 6, 3);
    backup_image(&env, &src, &[]);
    let was = data.len();
    // Grown by a bit more than a MiB; the list names one change in the middle.
    let mut rng = Rng(9);
    data.extend(rng.bytes(MIB + 777, false));
    let list = change(&src, &mut data, &[(2 * MIB, 4096)], 4);
    let cbt = env.path("c.txt");
    fs::write(&cbt, list).unwrap();
    let (grown, err) = backup_image_listed(&env, &src, &cbt);
    // Said as what it is: this source, grown (QA: named the same path twice).
    let says = format!(
        "the source was {was} bytes when the parent image snapshot was read and is {} \
         bytes now",
        data.len()
    );
    assert!(err.contains(&says), "{err}");
    let out = env.path("grown.img");
    restore_image(
        &env,
        grown["snapshot_id"].as_str().unwrap(),
        &out,
        &["--verify"],
    );
    assert!(fs::read(&out).unwrap() == data, "grown image differs");
    // Shrunk to a size that cuts a block: the cut block is read again.
    data.truncate(3 * MIB + 1000);
    fs::write(&src, &data).unwrap();
    fs::write(&cbt, "").unwrap();
    let shrunk = backup_image(&env, &src, &["--changed-blocks", cbt.to_str().unwrap()]);
    assert_eq!(shrunk["bytes_read"], 1000, "{shrunk}");
    let out = env.path("shrunk.img");
    restore_image(
        &env,
        shrunk["snapshot_id"].as_str().unwrap(),
        &out,
        &["--verify"],
    );
    assert!(fs::read(&out).unwrap() == data, "shrunk image differs");
    env.check_clean();
}

#[test]
fn changed_block_lists_that_lie_are_refused_or_repaired() {
    let env = Env::new();
    env.init(&[]);
    let src = env.path("d.img");
    let mut data = make_image(&src, 3, 5);
    let cbt = env.path("c.txt");
    let cbt_s = cbt.to_str().unwrap().to_string();
    let src_s = src.to_str().unwrap().to_string();
    fs::write(&cbt, "0 4096\n").unwrap();
    // No parent image yet.
    let e = env.fails(
        &["backup", "--image", &src_s, "--changed-blocks", &cbt_s],
        1,
    );
    assert!(e.contains("needs a parent image snapshot"), "{e}");
    // A snapshot of files named as the parent: said for what it is.
    let files = env.path("files");
    fs::create_dir_all(&files).unwrap();
    let file_snap = env.backup(&[&files]);
    let e = env.fails(
        &[
            "backup",
            "--image",
            &src_s,
            "--changed-blocks",
            &cbt_s,
            "--parent",
            &file_snap,
        ],
        1,
    );
    assert!(e.contains("--parent names a snapshot of files"), "{e}");
    // Refused without a list too (QA: recorded as the image's parent).
    let e = env.fails(&["backup", "--image", &src_s, "--parent", &file_snap], 1);
    assert!(e.contains("--parent names a snapshot of files"), "{e}");
    env.ok(&["forget", &file_snap]);
    backup_image(&env, &src, &[]);
    // A list that is not there, or not text: named as the list.
    for (list, says) in [
        ("/nonexistent/list", "No such file"),
        ("/bin/sh", "not text"),
    ] {
        let e = env.fails(&["backup", "--image", &src_s, "--changed-blocks", list], 1);
        assert!(
            e.contains(&format!("changed-block list {list}: {says}")),
            "{e}"
        );
    }
    // Past the end of the source.
    fs::write(&cbt, format!("{} 2\n", data.len() - 1)).unwrap();
    let e = env.fails(
        &["backup", "--image", &src_s, "--changed-blocks", &cbt_s],
        1,
    );
    assert!(e.contains("past the end of the source"), "{e}");
    // Garbage.
    fs::write(&cbt, "12 twelve\n").unwrap();
    let e = env.fails(
        &["backup", "--image", &src_s, "--changed-blocks", &cbt_s],
        1,
    );
    assert!(e.contains("line 1"), "{e}");
    // qemu-img map output is ambiguous without the format named.
    fs::write(&cbt, r#"[{"start": 0, "length": 4096, "data": false}]"#).unwrap();
    let e = env.fails(
        &["backup", "--image", &src_s, "--changed-blocks", &cbt_s],
        1,
    );
    assert!(e.contains("qemu-dirty-map"), "{e}");
    assert_eq!(
        env.snapshot_ids().len(),
        1,
        "a refused list saved a snapshot"
    );
    // Unsorted and overlapping ranges are sorted and merged: the result is right.
    let list = change(&src, &mut data, &[(MIB, 3000), (100, 50)], 6);
    let mut lines: Vec<&str> = list.lines().skip(1).collect();
    lines.reverse();
    fs::write(&cbt, format!("{}\n{} 1000\n", lines.join("\n"), MIB + 10)).unwrap();
    let r = backup_image(&env, &src, &["--changed-blocks", &cbt_s]);
    let out = env.path("o.img");
    restore_image(&env, r["snapshot_id"].as_str().unwrap(), &out, &[]);
    assert!(fs::read(&out).unwrap() == data);
    // The qemu dirty-map format, named: "data": false is dirty. The map covers the
    // whole disk; one that does not is refused.
    let list = change(&src, &mut data, &[(2 * MIB, 4096)], 7);
    let _ = list;
    let map = |total: usize| {
        format!(
            r#"[{{"start": 0, "length": {}, "data": true}}, {{"start": {}, "length": 65536, "data": false}}, {{"start": {}, "length": {}, "data": true}}]"#,
            2 * MIB,
            2 * MIB,
            2 * MIB + 65536,
            total - 2 * MIB - 65536
        )
    };
    let qemu = ["--changed-blocks-format", "qemu-dirty-map"];
    fs::write(&cbt, map(data.len() - 4096)).unwrap();
    let mut a = vec!["backup", "--image", &src_s, "--changed-blocks", &cbt_s];
    a.extend(qemu);
    let e = env.fails(&a, 1);
    assert!(e.contains("but the source is"), "{e}");
    fs::write(&cbt, map(data.len())).unwrap();
    let r = backup_image(
        &env,
        &src,
        &[
            "--changed-blocks",
            &cbt_s,
            "--changed-blocks-format",
            "qemu-dirty-map",
        ],
    );
    restore_image(
        &env,
        r["snapshot_id"].as_str().unwrap(),
        &out,
        &["--overwrite", "always"],
    );
    assert!(fs::read(&out).unwrap() == data);
}

/// A loop device over a new file of `bytes`; detached on drop.
struct Loop(String);

impl Loop {
    fn new(file: &Path, bytes: u64) -> Loop {
        let f = fs::File::create(file).unwrap();
        f.set_len(bytes).unwrap();
        Loop::of(file)
    }

    fn of(file: &Path) -> Loop {
        let o = Command::new("losetup")
            .args(["-f", "--show"])
            .arg(file)
            .output()
            .unwrap();
        assert!(o.status.success(), "losetup: {o:?}");
        Loop(String::from_utf8(o.stdout).unwrap().trim().to_string())
    }
}

impl Drop for Loop {
    fn drop(&mut self) {
        let _ = Command::new("umount").arg(&self.0).output();
        let _ = Command::new("losetup").arg("-d").arg(&self.0).output();
    }
}

/// The mtime `ls --json` gives the image of snapshot `snap`.
fn image_mtime(env: &Env, snap: &str) -> String {
    let json: serde_json::Value = serde_json::from_str(&env.ok(&["ls", snap, "--json"])).unwrap();
    let entries = json["entries"].as_array().unwrap();
    let file = entries.iter().find(|e| e["type"] == "file").unwrap();
    file["mtime"].as_str().unwrap().to_string()
}

/// A block device node's times do not move when its disk is written through a
/// mounted filesystem, so the image of a device has the time it was read, kept
/// while its content is the parent's: a disk written since is a newer file in
/// the mount, an export and a restore (QA r37: `rsync -a` from a mount skipped
/// Tuesday's image as Monday's), and an unchanged one keeps its time
/// (`--skip-if-unchanged` saves nothing).
#[test]
fn a_block_devices_image_is_as_new_as_its_content() {
    assert!(
        is_root(),
        "the test suite runs as root (CI does): it uses loop devices"
    );
    let env = Env::new();
    env.init(&["--block-size", "4K"]);
    let tree = env.path("tree");
    fs::create_dir_all(&tree).unwrap();
    fs::write(tree.join("monday.txt"), b"monday\n").unwrap();
    let img = ext4_image(
        &env,
        &tree,
        &["-E", "lazy_itable_init=0,lazy_journal_init=0"],
    );
    let dev = Loop::of(&img);
    let node_mtime = fs::metadata(&dev.0).unwrap().modified().unwrap();
    std::thread::sleep(std::time::Duration::from_millis(20));
    let started = std::time::SystemTime::now();
    let first = image_snapshot(&env, Path::new(&dev.0));
    let m1 = image_mtime(&env, &first);
    let second = image_snapshot(&env, Path::new(&dev.0));
    assert_eq!(image_mtime(&env, &second), m1, "the same content");
    let o = env.ok(&["backup", "--image", &dev.0, "--skip-if-unchanged"]);
    assert!(o.contains("no snapshot saved"), "{o}");
    // Written through a mounted filesystem: the node's times stay.
    let mnt = env.path("mnt");
    fs::create_dir(&mnt).unwrap();
    sh(Command::new("mount").arg(&dev.0).arg(&mnt));
    fs::write(mnt.join("tuesday.txt"), b"tuesday\n").unwrap();
    sh(Command::new("umount").arg(&mnt));
    assert_eq!(
        fs::metadata(&dev.0).unwrap().modified().unwrap(),
        node_mtime
    );
    let third = image_snapshot(&env, Path::new(&dev.0));
    let m3 = image_mtime(&env, &third);
    assert!(m3 > m1, "{m3} is not after {m1}");
    // As restored: the time it was read, after the test began.
    let out = env.path("restored.img");
    restore_image(&env, &third, &out, &[]);
    let restored = fs::metadata(&out).unwrap().modified().unwrap();
    assert!(restored >= started && restored > node_mtime);
}

#[test]
fn block_devices_back_up_and_restore_and_one_file_comes_back_through_the_mount() {
    assert!(
        is_root(),
        "the test suite runs as root (CI does): it uses loop devices"
    );
    let env = Env::new();
    env.init(&["--block-size", "4K"]);
    // An ext4 filesystem holding a tree, on a loop device.
    let tree = env.path("tree");
    fs::create_dir_all(tree.join("etc")).unwrap();
    let mut rng = Rng(11);
    let payload = rng.bytes(300_000, false);
    fs::write(tree.join("etc/payload.bin"), &payload).unwrap();
    fs::write(tree.join("hello.txt"), b"hello from inside the image\n").unwrap();
    let img = ext4_image(&env, &tree, &[]);
    let src = Loop::of(&img);
    let r = backup_image(&env, Path::new(&src.0), &["--name", "root"]);
    let snap = r["snapshot_id"].as_str().unwrap().to_string();
    assert_eq!(image_of(&env, &snap)["source"], src.0.as_str());

    // A device smaller than the image is refused before anything is written.
    let small = Loop::new(&env.path("small.dev"), 8 << 20);
    let e = env.fails(&["restore", &snap, "--image", "--target", &small.0], 1);
    assert!(e.contains("smaller than the image"), "{e}");
    // A device with a mounted filesystem is refused.
    let busy = Loop::new(&env.path("busy.dev"), 16 << 20);
    // Tables made now: the kernel's lazy init would write to the device while
    // the backup below reads it.
    sh(Command::new("mke2fs").args([
        "-q",
        "-t",
        "ext4",
        "-E",
        "lazy_itable_init=0,lazy_journal_init=0",
        &busy.0,
    ]));
    let mnt = env.path("busy-mnt");
    fs::create_dir(&mnt).unwrap();
    sh(Command::new("mount").arg(&busy.0).arg(&mnt));
    let e = env.fails(&["restore", &snap, "--image", "--target", &busy.0], 1);
    assert!(e.contains("in use"), "{e}");
    // Backing a device up while it is mounted read-write is worth a word.
    let o = env.run(&["backup", "--dry-run", "--image", &busy.0]);
    let err = String::from_utf8_lossy(&o.stderr);
    // A mounted filesystem may still write (its journal): then the backup also
    // says the device changed while read, and exits 3.
    assert!(
        o.status.success() || (o.status.code() == Some(3) && err.contains("changed while")),
        "{err}"
    );
    assert!(
        err.contains(&format!("mounted read-write at {}", mnt.display())),
        "{err}"
    );
    // So is the file behind it (O_EXCL cannot tell for a file).
    let busy_file = env.path("busy.dev");
    let e = env.fails(
        &[
            "restore",
            &snap,
            "--image",
            "--overwrite",
            "always",
            "--target",
            busy_file.to_str().unwrap(),
        ],
        1,
    );
    sh(Command::new("umount").arg(&mnt));
    assert!(e.contains(&format!("backing file of {}", busy.0)), "{e}");
    // And a device with a loop device over it (a partition of it mounted
    // through one), which O_EXCL does not see either (QA).
    let under = Loop::new(&env.path("under.dev"), 20 << 20);
    let stacked = Loop::of(Path::new(&under.0));
    let e = env.fails(&["restore", &snap, "--image", "--target", &under.0], 1);
    assert!(
        e.contains(&format!("backing device of {}", stacked.0)),
        "{e}"
    );
    drop((stacked, under));
    // A read-only device: refused before the first write.
    let ro_file = env.path("ro.dev");
    fs::File::create(&ro_file)
        .unwrap()
        .set_len(20 << 20)
        .unwrap();
    let o = Command::new("losetup")
        .args(["-f", "--show", "-r"])
        .arg(&ro_file)
        .output()
        .unwrap();
    let ro = Loop(String::from_utf8(o.stdout).unwrap().trim().to_string());
    let e = env.fails(&["restore", &snap, "--image", "--target", &ro.0], 1);
    assert!(e.contains("read-only"), "{e}");
    drop(ro);
    // A device of the right size: restored, every block written (zeros too),
    // verified, and it mounts with the files in it.
    let dev = Loop::new(&env.path("good.dev"), 20 << 20);
    sh(Command::new("dd")
        .args(["if=/dev/urandom", "bs=1M", "count=20", "status=none"])
        .arg(format!("of={}", dev.0)));
    // Not without --overwrite always, as for a file that exists (QA).
    let e = env.fails(&["restore", &snap, "--image", "--target", &dev.0], 1);
    assert!(
        e.contains("is a block device of") && e.contains("--overwrite always"),
        "{e}"
    );
    let o = env.run(&[
        "restore",
        &snap,
        "--image",
        "--target",
        &dev.0,
        "--verify",
        "--overwrite",
        "always",
    ]);
    let (out, err) = (
        String::from_utf8_lossy(&o.stdout),
        String::from_utf8_lossy(&o.stderr),
    );
    assert!(o.status.success(), "{err}");
    assert!(out.contains("(device)"), "{out}");
    // The zero blocks were written to the device as zeros, and said so.
    assert!(out.contains("zero blocks zeroed"), "{out}");
    // Its last 4 MiB keep what they held: said.
    assert!(err.contains("larger than the image: its last 4"), "{err}");
    let back = fs::read(&dev.0).unwrap();
    assert!(
        back[..16 << 20] == fs::read(&img).unwrap()[..],
        "device differs from the image"
    );
    let m2 = env.path("good-mnt");
    fs::create_dir(&m2).unwrap();
    sh(Command::new("mount")
        .args(["-o", "ro"])
        .arg(&dev.0)
        .arg(&m2));
    let got = fs::read(m2.join("etc/payload.bin"));
    sh(Command::new("umount").arg(&m2));
    assert!(got.unwrap() == payload);
    // --zeroed onto a device that holds zeros: only the data is written.
    let fresh = Loop::new(&env.path("fresh.dev"), 16 << 20);
    let out = env.ok(&[
        "restore",
        &snap,
        "--image",
        "--zeroed",
        "--overwrite",
        "always",
        "--target",
        &fresh.0,
    ]);
    assert!(out.contains("zero blocks not written (--zeroed)"), "{out}");
    assert!(fs::read(&fresh.0).unwrap() == fs::read(&img).unwrap());
    drop(fresh);
    // It changes nothing on a file (said), and goes with --image only.
    let o = env.run(&[
        "restore",
        &snap,
        "--image",
        "--zeroed",
        "--target",
        env.path("as-file.img").to_str().unwrap(),
    ]);
    assert!(o.status.success(), "{o:?}");
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(err.contains("--zeroed changes nothing on a file"), "{err}");
    let out = env.path("zeroed-fs");
    let e = env.fails(
        &[
            "restore",
            &snap,
            "--image-fs",
            "/",
            "--zeroed",
            "--target",
            out.to_str().unwrap(),
        ],
        2,
    );
    assert!(e.contains("--zeroed goes with --image"), "{e}");

    // One file without restoring the disk: cairn mount, then a read-only loop
    // mount of the image file in it.
    let fuse = env.path("fuse");
    fs::create_dir(&fuse).unwrap();
    let mut child = env
        .cmd(&["mount", fuse.to_str().unwrap()])
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let mut lines = StderrLines::of(&mut child);
    lines.wait_for("fusermount3 -u", std::time::Duration::from_secs(60));
    let inner = fuse.join(format!("snapshots/{}/root", &snap[..8]));
    let m3 = env.path("inner-mnt");
    fs::create_dir(&m3).unwrap();
    let mounted = Command::new("mount")
        .args(["-o", "ro,loop"])
        .arg(&inner)
        .arg(&m3)
        .output()
        .unwrap();
    let got = fs::read(m3.join("hello.txt"));
    let _ = Command::new("umount").arg(&m3).status();
    // The loop device lets go of the image a moment after its umount, and
    // until then the FUSE mount is busy; never wait forever on the mount.
    let unmounted = (0..50).any(|_| {
        let ok = Command::new("fusermount3")
            .arg("-u")
            .arg(&fuse)
            .status()
            .is_ok_and(|s| s.success());
        if !ok {
            std::thread::sleep(Duration::from_millis(100));
        }
        ok
    });
    if !unmounted {
        let _ = Command::new("umount").arg("-l").arg(&fuse).status();
        let _ = child.kill();
    }
    let _ = child.wait();
    assert!(
        mounted.status.success(),
        "loop mount in the FUSE mount: {mounted:?}"
    );
    assert_eq!(got.unwrap(), b"hello from inside the image\n");
}

/// A FUSE filesystem with one file, `disk`, whose reads fail with EIO wherever they
/// touch `bad`, and whose size becomes `grown` once `grow_after` reads were served.
struct Faulty {
    data: Vec<u8>,
    bad: (u64, u64),
    grow_after: Option<(usize, u64)>,
    reads: std::sync::atomic::AtomicUsize,
}

impl Faulty {
    fn size(&self) -> u64 {
        match self.grow_after {
            Some((n, grown)) if self.reads.load(std::sync::atomic::Ordering::SeqCst) >= n => grown,
            _ => self.data.len() as u64,
        }
    }

    fn attr(&self, ino: u64) -> fuser::FileAttr {
        let t = std::time::SystemTime::UNIX_EPOCH;
        fuser::FileAttr {
            ino: fuser::INodeNo(ino),
            size: if ino == 1 { 0 } else { self.size() },
            blocks: 0,
            atime: t,
            mtime: t,
            ctime: t,
            crtime: t,
            kind: if ino == 1 {
                fuser::FileType::Directory
            } else {
                fuser::FileType::RegularFile
            },
            perm: if ino == 1 { 0o755 } else { 0o644 },
            nlink: 1,
            uid: 0,
            gid: 0,
            rdev: 0,
            blksize: 4096,
            flags: 0,
        }
    }
}

impl fuser::Filesystem for Faulty {
    fn lookup(
        &self,
        _req: &fuser::Request,
        parent: fuser::INodeNo,
        name: &std::ffi::OsStr,
        reply: fuser::ReplyEntry,
    ) {
        if parent.0 == 1 && name == "disk" {
            reply.entry(
                &std::time::Duration::ZERO,
                &self.attr(2),
                fuser::Generation(0),
            );
        } else {
            reply.error(fuser::Errno::ENOENT);
        }
    }

    fn getattr(
        &self,
        _req: &fuser::Request,
        ino: fuser::INodeNo,
        _fh: Option<fuser::FileHandle>,
        reply: fuser::ReplyAttr,
    ) {
        reply.attr(&std::time::Duration::ZERO, &self.attr(ino.0));
    }

    fn open(
        &self,
        _req: &fuser::Request,
        _ino: fuser::INodeNo,
        _flags: fuser::OpenFlags,
        reply: fuser::ReplyOpen,
    ) {
        // Direct I/O: every read reaches here with its own offset and size, as on a
        // device, instead of the kernel's read-ahead widening it.
        reply.opened(fuser::FileHandle(0), fuser::FopenFlags::FOPEN_DIRECT_IO);
    }

    #[allow(clippy::too_many_arguments)]
    fn read(
        &self,
        _req: &fuser::Request,
        _ino: fuser::INodeNo,
        _fh: fuser::FileHandle,
        offset: u64,
        size: u32,
        _flags: fuser::OpenFlags,
        _lock: Option<fuser::LockOwner>,
        reply: fuser::ReplyData,
    ) {
        self.reads.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
        let end = (offset + u64::from(size))
            .min(self.data.len() as u64)
            .min(self.size());
        if offset < self.bad.1 && end > self.bad.0 {
            return reply.error(fuser::Errno::EIO);
        }
        let start = offset.min(end) as usize;
        reply.data(&self.data[start..end as usize]);
    }
}

fn faulty_mount(dir: &Path, fs_: Faulty) -> fuser::BackgroundSession {
    let mut config = fuser::Config::default();
    config.mount_options = vec![
        fuser::MountOption::RO,
        fuser::MountOption::FSName("faulty".into()),
    ];
    fuser::spawn_mount(fs_, dir, &config).unwrap()
}

/// An unreadable range across two reads of the backup (4 MiB each) is warned
/// about once, as the snapshot records it (QA r40: said as two ranges).
#[test]
fn an_unreadable_range_across_two_reads_is_said_once() {
    let env = Env::new();
    env.init(&["--block-size", "16K"]);
    let data = Rng(22).bytes(6 * MIB, false);
    let bad = (4 * MIB as u64 - 20_000, 40_000u64);
    let (snap, e) = backup_with_bad_range_said(&env, "faulty", data, (bad.0, bad.0 + bad.1));
    let (first, end) = (
        bad.0 / 16384 * 16384,
        (bad.0 + bad.1).div_ceil(16384) * 16384,
    );
    assert_eq!(e.matches("could not be read").count(), 1, "{e}");
    assert!(
        e.contains(&format!("bytes {first}..{end} could not be read")),
        "{e}"
    );
    let info = image_of(&env, &snap);
    assert_eq!(
        info["unreadable"],
        serde_json::json!([[first, end - first]]),
        "{info}"
    );
}

#[test]
fn unreadable_blocks_are_reported_kept_going_past_and_saved_as_zeros() {
    let env = Env::new();
    env.init(&["--block-size", "16K"]);
    let mut rng = Rng(21);
    let data = rng.bytes(6 * MIB, false);
    let mnt = env.path("faulty");
    fs::create_dir(&mnt).unwrap();
    let bad = (2 * MIB as u64 + 20_000, 40_000u64);
    let session = faulty_mount(
        &mnt,
        Faulty {
            data: data.clone(),
            bad: (bad.0, bad.0 + bad.1),
            grow_after: None,
            reads: Default::default(),
        },
    );
    let src: PathBuf = mnt.join("disk");
    let e = env.fails(&["backup", "--image", src.to_str().unwrap()], 3);
    // The blocks the bad bytes touch: 16 KiB blocks 129 to 131.
    let (first, end) = (
        bad.0 / 16384 * 16384,
        (bad.0 + bad.1).div_ceil(16384) * 16384,
    );
    assert!(
        e.contains(&format!("bytes {first}..{end} could not be read")),
        "{e}"
    );
    let snap = env.snapshot_ids().pop().unwrap();
    let info = image_of(&env, &snap);
    assert_eq!(
        info["unreadable"],
        serde_json::json!([[first, end - first]]),
        "{info}"
    );
    // An incremental from a changed-block list that leaves those blocks out reads
    // them again (the parent has zeros there): still unreadable, it says so, in
    // its exit code and its record.
    let list = env.path("changed.txt");
    fs::write(&list, format!("0 {}\n", 16384)).unwrap();
    let e = env.fails(
        &[
            "backup",
            "--image",
            src.to_str().unwrap(),
            "--changed-blocks",
            list.to_str().unwrap(),
        ],
        3,
    );
    assert!(
        e.contains(&format!("bytes {first}..{end} could not be read")),
        "{e}"
    );
    let incremental = env.snapshot_ids().pop().unwrap();
    // An empty list: the note says what was read all the same (QA: "the
    // snapshot holds the parent's image", where the unreadable part was read).
    let empty = env.path("empty.txt");
    fs::write(&empty, "").unwrap();
    let e = env.fails(
        &[
            "backup",
            "--image",
            src.to_str().unwrap(),
            "--changed-blocks",
            empty.to_str().unwrap(),
        ],
        3,
    );
    drop(session);
    assert!(
        e.contains("names no change") && e.contains("the parent could not read, read again"),
        "{e}"
    );
    assert_ne!(incremental, snap);
    assert_eq!(
        image_of(&env, &incremental)["unreadable"],
        serde_json::json!([[first, end - first]])
    );
    let o = env.run(&[
        "restore",
        &incremental,
        "--image",
        "--target",
        env.path("inc.img").to_str().unwrap(),
    ]);
    assert_eq!(o.status.code(), Some(3), "{o:?}");
    // Restore: everything else is the source's, the bad blocks zeros, and the
    // restore says so (exit 3).
    let out = env.path("out.img");
    let o = env.run(&[
        "restore",
        &snap,
        "--image",
        "--target",
        out.to_str().unwrap(),
    ]);
    assert_eq!(o.status.code(), Some(3), "{o:?}");
    assert!(String::from_utf8_lossy(&o.stderr).contains("could not be read at backup time"));
    let back = fs::read(&out).unwrap();
    let (f, n) = (first as usize, end as usize);
    assert!(back[..f] == data[..f] && back[n..] == data[n..]);
    assert!(back[f..n].iter().all(|&b| b == 0));
    // Read as a file (restore, dump, export), the image says the same.
    let dir = env.path("as-file");
    let o = env.run(&["restore", &snap, "--target", dir.to_str().unwrap()]);
    assert_eq!(o.status.code(), Some(3), "{o:?}");
    for args in [
        vec!["dump", &snap, "disk"],
        vec!["export", &snap, "--format", "tar"],
    ] {
        let o = env.run(&args);
        assert_eq!(o.status.code(), Some(3), "{args:?}");
        let e = String::from_utf8_lossy(&o.stderr);
        assert!(
            e.contains("could not be read at backup time"),
            "{args:?}: {e}"
        );
    }
}

/// `--image-fs` reads an image's filesystem in place: a file whose blocks lie
/// where the source could not be read says so (exit 3); one elsewhere does not.
#[test]
fn image_fs_reads_through_unreadable_blocks_say_so() {
    let env = Env::new();
    env.init(&["--block-size", "4K"]);
    let tree = env.path("tree");
    fs::create_dir_all(&tree).unwrap();
    let payload = Rng(41).bytes(2 << 20, false);
    fs::write(tree.join("payload"), &payload).unwrap();
    fs::write(tree.join("small"), b"elsewhere\n").unwrap();
    let img = env.path("fs.img");
    sh(Command::new("mke2fs")
        .args(["-q", "-t", "ext4", "-d"])
        .arg(&tree)
        .arg(&img)
        .arg("8M"));
    let data = fs::read(&img).unwrap();
    // Where the payload's second MiB is stored in the image.
    let probe = &payload[1 << 20..(1 << 20) + 4096];
    let at = data.windows(4096).position(|w| w == probe).unwrap() as u64;
    let snap = backup_with_bad_range(&env, "faulty", data, (at, at + 4096));
    // The listing says so, not only its JSON (QA).
    let list = env.ok(&["snapshots"]);
    assert!(
        list.contains(&format!("! {}: ", &snap[..8]))
            && list.contains(
                "KiB of the image in 1 range could not be read at backup time and holds zeros"
            ),
        "{list}"
    );
    let o = env.run(&["dump", &snap, "--image-fs", "/payload"]);
    assert_eq!(o.status.code(), Some(3), "{o:?}");
    assert!(String::from_utf8_lossy(&o.stderr).contains("could not be read at backup time"));
    // Tagged (a new snapshot that names this one as its original), it is still
    // not said to have lost blocks in the repository: only a repair does that.
    env.ok(&["tag", "--add", "kept", &snap]);
    let list = env.ok(&["snapshots"]);
    assert!(
        list.contains("could not be read at backup time and holds zeros")
            && !list.contains("lost in the repository"),
        "{list}"
    );
    let snap = env.snapshot_ids().pop().unwrap();
    let o = env.run(&["dump", &snap, "--image-fs", "/small"]);
    assert_eq!(o.status.code(), Some(0), "{o:?}");
    assert_eq!(o.stdout, b"elsewhere\n");
    // Restored from the image into the repository: refused as a restore of files
    // is (QA r15: export and dump wrote there).
    let into = env.repo.join("data/restored");
    let t = into.to_str().unwrap();
    let e = env.fails(&["restore", &snap, "--image-fs", "/small", "-t", t], 1);
    assert!(e.contains("is the repository being restored from"), "{e}");
    assert!(!into.exists());
    // A file named as a directory (`name/`) is an error, not the file (QA).
    let o = env.run(&["dump", &snap, "--image-fs", "/small/"]);
    assert_eq!(o.status.code(), Some(1), "{o:?}");
    assert!(o.stdout.is_empty(), "{o:?}");
    assert!(
        String::from_utf8_lossy(&o.stderr).contains("/small/: not a directory"),
        "{o:?}"
    );
    // No archive of a file read in place: refused, not its bytes bare (QA).
    let e = env.fails(
        &["dump", &snap, "--image-fs", "/small", "--archive", "tar"],
        2,
    );
    assert!(e.contains("cannot be used with"), "{e}");
    // Listing options of file snapshots: refused as usage errors (QA r37:
    // --ncdu was ignored, --sort exited 1).
    let e = env.fails(&["ls", &snap, "--image-fs", "/", "--ncdu"], 2);
    assert!(e.contains("--ncdu writes a file snapshot's tree"), "{e}");
    env.fails(&["ls", &snap, "--image-fs", "/", "--sort", "size"], 2);
    let target = env.path("out");
    let mut args = fs_restore(&snap, "/", &target).to_vec();
    args.push("--json");
    let o = env.run(&args);
    assert_eq!(o.status.code(), Some(3), "{o:?}");
    // The file holding the zeros is named, and left with the restore's time and
    // mode 0600; the other is restored as it was (QA r37: only the root was
    // named, and the file looked intact).
    let r: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
    assert_eq!(r["failed"], serde_json::json!([]), "{r}");
    // The run, as a file restore's report names it (QA r37).
    assert!(
        r["snapshot_id"].as_str().unwrap().starts_with(&snap)
            && r["overwrite"] == "if-changed"
            && r["target"] == target.to_str().unwrap()
            && r["unreadable_at_backup"][0][0].as_u64().unwrap() <= at,
        "{r}"
    );
    let warned = r["warnings"].as_array().unwrap();
    assert_eq!(warned.len(), 1, "{r}");
    assert!(
        warned[0].as_str().unwrap().contains(&format!(
            "{}: holds zeros where the image could not be read at backup",
            target.join("root/payload").display()
        )),
        "{r}"
    );
    // Standard error stays JSON lines.
    for line in String::from_utf8_lossy(&o.stderr).lines() {
        serde_json::from_str::<serde_json::Value>(line).unwrap_or_else(|_| panic!("{line}"));
    }
    let damaged = fs::metadata(target.join("root/payload")).unwrap();
    assert_eq!(damaged.mode() & 0o7777, 0o600);
    assert_eq!(fs::read(target.join("root/small")).unwrap(), b"elsewhere\n");
    // The image readable again: its restore over this one writes the file whole.
    let good = env.path("fs-good.img");
    fs::copy(&img, &good).unwrap();
    let healed = image_snapshot(&env, &good);
    let o = env.run(&fs_restore(&healed, "/", &target));
    assert_eq!(o.status.code(), Some(0), "{o:?}");
    assert!(fs::read(target.join("root/payload")).unwrap() == payload);

    // A directory's block unreadable at backup time: the listing fails there,
    // naming the ranges as the likely cause (QA: "corrupt filesystem" alone).
    let tree = env.path("tree2");
    fs::create_dir_all(tree.join("sub")).unwrap();
    fs::write(tree.join("sub/inner"), b"inner").unwrap();
    let img = env.path("fs2.img");
    sh(Command::new("mke2fs")
        .args(["-q", "-t", "ext4", "-b", "4096", "-d"])
        .arg(&tree)
        .arg(&img)
        .arg("8M"));
    let o = Command::new("debugfs")
        .args(["-R", "bmap /sub 0"])
        .arg(&img)
        .output()
        .unwrap();
    let block: u64 = String::from_utf8_lossy(&o.stdout).trim().parse().unwrap();
    let bad = (block * 4096, block * 4096 + 4096);
    let snap = backup_with_bad_range(&env, "faulty2", fs::read(&img).unwrap(), bad);
    let e = env.fails(&["ls", &snap, "--image-fs", "/"], 1);
    assert!(
        e.contains("could not be read at backup time and hold zeros")
            && e.contains("the filesystem was read where the image could not be read"),
        "{e}"
    );
}

/// An image backup (exit 3) of a FUSE file holding `data` (mounted at `dir`)
/// whose bytes `bad` cannot be read; its snapshot id.
fn backup_with_bad_range(env: &Env, dir: &str, data: Vec<u8>, bad: (u64, u64)) -> String {
    backup_with_bad_range_said(env, dir, data, bad).0
}

/// [`backup_with_bad_range`]: the snapshot, and what the backup said on stderr.
fn backup_with_bad_range_said(
    env: &Env,
    dir: &str,
    data: Vec<u8>,
    bad: (u64, u64),
) -> (String, String) {
    let mnt = env.path(dir);
    fs::create_dir(&mnt).unwrap();
    let session = faulty_mount(
        &mnt,
        Faulty {
            data,
            bad,
            grow_after: None,
            reads: Default::default(),
        },
    );
    let said = env.fails(
        &["backup", "--image", mnt.join("disk").to_str().unwrap()],
        3,
    );
    drop(session);
    (env.snapshot_ids().pop().unwrap(), said)
}

/// An image backup (exit 3) of a FUSE file holding `data` that becomes `size`
/// bytes long after its first read; returns the backup's stderr.
fn backup_resized(env: &Env, dir: &str, data: &[u8], size: u64) -> String {
    let mnt = env.path(dir);
    fs::create_dir(&mnt).unwrap();
    let session = faulty_mount(
        &mnt,
        Faulty {
            data: data.to_vec(),
            bad: (u64::MAX, u64::MAX),
            grow_after: Some((1, size)),
            reads: Default::default(),
        },
    );
    let e = env.fails(
        &["backup", "--image", mnt.join("disk").to_str().unwrap()],
        3,
    );
    drop(session);
    e
}

#[test]
fn a_source_that_changes_size_during_the_backup_is_saved_as_read_with_a_warning() {
    let env = Env::new();
    env.init(&[]);
    let mut rng = Rng(22);
    let data = rng.bytes(3 * MIB, false);
    let e = backup_resized(&env, "growing", &data, 5 * MIB as u64);
    assert!(e.contains("changed size during the backup"), "{e}");
    let snap = env.snapshot_ids().pop().unwrap();
    let info = image_of(&env, &snap);
    assert_eq!(info["size"], data.len() as u64);
    assert_eq!(info["size_at_end"], 5 * MIB as u64);
    let list = env.ok(&["snapshots", &snap]);
    assert!(
        list.contains("the source's size changed during the backup (3.00 MiB to 5.00 MiB)"),
        "{list}"
    );
    let out = env.path("o.img");
    restore_image(&env, &snap, &out, &[]);
    assert!(fs::read(&out).unwrap() == data);

    // One that shrinks: what is gone is zeros, said once (not once per read).
    let data = rng.bytes(24 * MIB, false);
    let e = backup_resized(&env, "shrinking", &data, MIB as u64);
    assert_eq!(e.matches("shrank during the backup").count(), 1, "{e}");
    let snap = env.snapshot_ids().pop().unwrap();
    let info = image_of(&env, &snap);
    assert_eq!(info["size"], data.len() as u64);
    let gone = &info["unreadable"].as_array().unwrap()[0];
    assert_eq!(
        gone[1].as_u64().unwrap() + gone[0].as_u64().unwrap(),
        data.len() as u64,
        "{info}"
    );
}

/// A whole-disk image: a partition table of `label` (dos or gpt) with one
/// partition at 1 MiB holding `fs`.
fn partitioned(disk: &Path, fs_img: &Path, label: &str) {
    let fs_len = fs::metadata(fs_img).unwrap().len();
    let f = fs::File::create(disk).unwrap();
    f.set_len((4 << 20) + fs_len).unwrap();
    drop(f);
    // `logical`: an empty primary partition 1, an extended partition 2, and the
    // filesystem in logical partition 5 at 3 MiB.
    let (table, at_mib) = match label {
        "logical" => (
            format!(
                "label: dos\nstart=2048, size=2048, type=83\nstart=4096, type=5\nstart=6144, size={}, type=83\n",
                fs_len / 512
            ),
            3,
        ),
        _ => (
            format!("label: {label}\nstart=2048, size={}\n", fs_len / 512),
            1,
        ),
    };
    let mut c = Command::new("sfdisk")
        .arg("-q")
        .arg(disk)
        .stdin(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    use std::io::Write;
    write!(c.stdin.take().unwrap(), "{table}").unwrap();
    assert!(c.wait().unwrap().success(), "sfdisk");
    sh(Command::new("dd")
        .arg(format!("if={}", fs_img.display()))
        .arg(format!("of={}", disk.display()))
        .args(["bs=1M", "conv=notrunc", "status=none"])
        .arg(format!("seek={at_mib}")));
}

#[test]
fn files_come_out_of_an_image_in_place_with_image_fs_even_from_a_partitioned_disk() {
    let env = Env::new();
    env.init(&["--block-size", "4K"]);
    let tree = env.path("tree");
    fs::create_dir_all(tree.join("etc/deep")).unwrap();
    let mut rng = Rng(31);
    let payload = rng.bytes(1_500_000, false);
    fs::write(tree.join("etc/deep/payload.bin"), &payload).unwrap();
    fs::write(tree.join("etc/hosts"), b"127.0.0.1 localhost\n").unwrap();
    std::os::unix::fs::symlink("hosts", tree.join("etc/link")).unwrap();
    // An owner of its own and a file that is mostly a hole, for the restore.
    let owned = tree.join("owned");
    fs::write(&owned, b"mine\n").unwrap();
    std::os::unix::fs::lchown(&owned, Some(1234), Some(4321)).unwrap();
    let holey = fs::File::create(tree.join("holey")).unwrap();
    holey.write_all_at(b"end", 3 << 20).unwrap();
    drop(holey);
    let fs_img = env.path("fs.img");
    sh(Command::new("mke2fs")
        .args(["-q", "-t", "ext4", "-d"])
        .arg(&tree)
        .arg(&fs_img)
        .arg("12M"));
    for (label, name) in [
        ("none", "plain.img"),
        ("dos", "mbr.img"),
        ("gpt", "gpt.img"),
        ("logical", "logical.img"),
    ] {
        let img = env.path(name);
        if label == "none" {
            fs::copy(&fs_img, &img).unwrap();
        } else {
            partitioned(&img, &fs_img, label);
        }
        let r = backup_image(&env, &img, &[]);
        let snap = r["snapshot_id"].as_str().unwrap().to_string();
        let list = env.ok(&["ls", &snap, "--image-fs", "/etc"]);
        assert_eq!(
            list.lines().collect::<Vec<_>>(),
            [
                "/etc",
                "/etc/deep",
                "/etc/deep/payload.bin",
                "/etc/hosts",
                "/etc/link"
            ],
            "{label}"
        );
        let o = env
            .cmd(&["dump", &snap, "--image-fs", "/etc/deep/payload.bin"])
            .output()
            .unwrap();
        assert!(o.status.success(), "{o:?}");
        assert!(o.stdout == payload, "{label}: dumped file differs");
        let target = env.path(&format!("out-{label}"));
        env.ok(&fs_restore(&snap, "/etc", &target));
        assert!(fs::read(target.join("etc/deep/payload.bin")).unwrap() == payload);
        assert_eq!(
            fs::read_link(target.join("etc/link")).unwrap(),
            Path::new("hosts")
        );
        if label == "none" {
            // `..` stays inside the image's root, and the copy inside the target.
            let jail = env.path("jail");
            let target = jail.join("target");
            env.ok(&fs_restore(&snap, "/etc/..", &target));
            let names: Vec<_> = fs::read_dir(&jail)
                .unwrap()
                .map(|e| e.unwrap().file_name())
                .collect();
            assert_eq!(names, ["target"], "written beside the target");
            assert!(target.join("root/etc/hosts").is_file());
            // Owners come back (as root), holes stay holes.
            use std::os::unix::fs::MetadataExt;
            let m = fs::metadata(target.join("root/owned")).unwrap();
            assert_eq!((m.uid(), m.gid()), (1234, 4321));
            let m = fs::metadata(target.join("root/holey")).unwrap();
            assert_eq!(m.len(), (3 << 20) + 3);
            assert!(m.blocks() * 512 < 1 << 20, "{} blocks", m.blocks());
            // Again over what is there: left as it is (if-changed), a changed file
            // replaced; --overwrite never leaves even that.
            let hosts = target.join("root/etc/hosts");
            fs::write(&hosts, b"changed").unwrap();
            let again = |how: &str| {
                env.ok(&[
                    "restore",
                    &snap,
                    "--image-fs",
                    "/",
                    "--overwrite",
                    how,
                    "--target",
                    target.to_str().unwrap(),
                ])
            };
            // (Directories count among what was left: QA r23, they were said
            // to be restored.)
            let out = again("never");
            assert!(
                out.contains("0 directories") && out.contains("left 9 existing entries"),
                "{out}"
            );
            assert_eq!(fs::read(&hosts).unwrap(), b"changed");
            let out = again("if-changed");
            assert!(
                out.contains("0 directories") && out.contains("left 8 existing entries"),
                "{out}"
            );
            assert_eq!(fs::read(&hosts).unwrap(), b"127.0.0.1 localhost\n");
            // A file whose content is the image's but whose mode or owner changed
            // gets them back (QA: it was kept as it was).
            let owned = target.join("root/owned");
            fs::set_permissions(&owned, std::os::unix::fs::PermissionsExt::from_mode(0o777))
                .unwrap();
            std::os::unix::fs::chown(&owned, Some(7), Some(7)).unwrap();
            let out = again("if-changed");
            assert!(out.contains("left 8 existing entries"), "{out}");
            let m = fs::metadata(&owned).unwrap();
            assert_eq!((m.uid(), m.gid()), (1234, 4321));
            assert_ne!(m.mode() & 0o777, 0o777);
            // ls: the long form of a file snapshot's, and --no-recursive.
            let long = env.ok(&["ls", "-l", &snap, "--image-fs", "/etc"]);
            assert!(
                long.lines()
                    .any(|l| l.starts_with("lrwxrwxrwx") && l.ends_with("/etc/link -> hosts")),
                "{long}"
            );
            assert!(long.lines().any(|l| l.starts_with("drwx")), "{long}");
            // A symlink where the image has a directory is replaced, never
            // followed: nothing is written where it points.
            let elsewhere = env.path("elsewhere");
            fs::create_dir_all(&elsewhere).unwrap();
            let etc = target.join("root/etc");
            fs::remove_dir_all(&etc).unwrap();
            std::os::unix::fs::symlink(&elsewhere, &etc).unwrap();
            again("always");
            assert!(fs::symlink_metadata(&etc).unwrap().is_dir(), "replaced");
            assert_eq!(fs::read_dir(&elsewhere).unwrap().count(), 0, "followed");
            let top = env.ok(&["ls", &snap, "--image-fs", "/", "--no-recursive"]);
            assert!(
                top.lines().any(|l| l == "/etc") && !top.contains("/etc/hosts"),
                "{top}"
            );
        }
        if label == "logical" {
            env.ok(&["ls", &snap, "--image-fs", "/", "--partition", "5"]);
            let e = env.fails(&["ls", &snap, "--image-fs", "/", "--partition", "6"], 1);
            assert!(e.contains("no partition 6 (it has 1, 5)"), "{e}");
        } else if label != "none" {
            env.ok(&["ls", &snap, "--image-fs", "/", "--partition", "1"]);
            let e = env.fails(&["ls", &snap, "--image-fs", "/", "--partition", "2"], 1);
            assert!(e.contains("no partition 2"), "{e}");
        }
        // A path that is not there.
        let e = env.fails(&["dump", &snap, "--image-fs", "/etc/nothing"], 1);
        assert!(e.contains("/etc/nothing"), "{e}");
    }
    // An image without a filesystem cairn can read.
    let noise = env.path("noise.img");
    fs::write(&noise, rng.bytes(3 << 20, false)).unwrap();
    let r = backup_image(&env, &noise, &[]);
    let e = env.fails(
        &["ls", r["snapshot_id"].as_str().unwrap(), "--image-fs", "/"],
        1,
    );
    assert!(e.contains("no ext2/3/4 filesystem"), "{e}");
    // One that is ext4, with a feature the in-place reader does not read: said
    // to be found, and how to get at it.
    let inline = env.path("inline.img");
    sh(Command::new("mke2fs")
        .args(["-q", "-t", "ext4", "-O", "inline_data", "-d"])
        .arg(&tree)
        .arg(&inline)
        .arg("8M"));
    let r = backup_image(&env, &inline, &[]);
    let e = env.fails(
        &["ls", r["snapshot_id"].as_str().unwrap(), "--image-fs", "/"],
        1,
    );
    assert!(
        e.contains("filesystem at byte 0 of the image cannot be read in place"),
        "{e}"
    );
    // ext3 (block-mapped files, 1 KiB blocks): sparse files whose holes span whole
    // indirect blocks read exactly, by dump and by restore. `eight`: the single
    // indirect pointer is null and so are the first 30 of the double indirect
    // block's; `deep`: data in the single indirect range, then nothing up to the
    // triple indirect range (from 64.3 MiB).
    let sparse_tree = env.path("sparse-tree");
    fs::create_dir_all(sparse_tree.join("d")).unwrap();
    let mut want = Vec::new();
    for (name, at, middle) in [("d/eight", 8u64 << 20, false), ("d/deep", 66 << 20, true)] {
        let f = fs::File::create(sparse_tree.join(name)).unwrap();
        f.write_all_at(b"head", 0).unwrap();
        if middle {
            f.write_all_at(b"middle", 70_000).unwrap();
        }
        f.write_all_at(b"tail", at).unwrap();
        want.push((name, at, middle));
    }
    fs::write(sparse_tree.join("plain"), b"plain file\n").unwrap();
    let ext3 = env.path("ext3.img");
    sh(Command::new("mke2fs")
        .args(["-q", "-t", "ext3", "-b", "1024", "-d"])
        .arg(&sparse_tree)
        .arg(&ext3)
        .arg("32M"));
    let r = backup_image(&env, &ext3, &[]);
    let snap = r["snapshot_id"].as_str().unwrap().to_string();
    let check = |got: &[u8], at: u64, middle: bool, what: &str| {
        let mut expected = vec![0u8; at as usize + 4];
        expected[..4].copy_from_slice(b"head");
        if middle {
            expected[70_000..70_006].copy_from_slice(b"middle");
        }
        expected[at as usize..].copy_from_slice(b"tail");
        assert!(got == expected, "{what}: differs ({} bytes)", got.len());
    };
    for (name, at, middle) in &want {
        let o = env
            .cmd(&["dump", &snap, "--image-fs", &format!("/{name}")])
            .output()
            .unwrap();
        assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
        check(&o.stdout, *at, *middle, name);
    }
    let out = env.path("ext3-out");
    env.ok(&fs_restore(&snap, "/d", &out));
    for (name, at, middle) in &want {
        check(&fs::read(out.join(name)).unwrap(), *at, *middle, "restored");
    }
    let o = env.ok(&["dump", &snap, "--image-fs", "/plain"]);
    assert_eq!(o, "plain file\n");
    // A file snapshot is not an image.
    let snap = env.backup(&[&tree]);
    let e = env.fails(&["ls", &snap, "--image-fs", "/"], 1);
    assert!(e.contains("not an image snapshot"), "{e}");
}

/// A path given to `--image-fs` is read as listings write it, but a name in
/// the image may itself hold the characters that stand for bytes (U+10FF00 and
/// on): such a name is found by what it is, two entries a path could mean are
/// refused as ambiguous, and no reading of a name can be `..` or hold a `/`
/// (review: a directory named by two U+10FF2E took a restore into its target's
/// parent, and the wrong entry was dumped).
#[test]
fn image_fs_paths_never_leave_the_entry_they_name() {
    use std::ffi::OsStr;
    use std::os::unix::ffi::OsStrExt;
    let env = Env::new();
    env.init(&[]);
    let tree = env.path("tree");
    // U+10FF41 (it stands for the byte `A`) and U+10FF2E (for `.`).
    let literal_a = OsStr::from_bytes(b"\xf4\x8f\xbd\x81");
    let dots = OsStr::from_bytes(b"\xf4\x8f\xbc\xae\xf4\x8f\xbc\xae");
    fs::create_dir_all(tree.join("A")).unwrap();
    fs::write(tree.join("A/f"), b"in A\n").unwrap();
    fs::create_dir_all(tree.join(literal_a)).unwrap();
    fs::write(tree.join(literal_a).join("f"), b"in the literal one\n").unwrap();
    fs::create_dir_all(tree.join(dots)).unwrap();
    fs::write(tree.join(dots).join("readme"), b"inside\n").unwrap();
    fs::create_dir_all(tree.join(".ssh")).unwrap();
    fs::write(tree.join(".ssh/authorized_keys"), b"from the image\n").unwrap();
    let snap = ext4_image_snapshot(&env, &tree, &[]);
    let arg = |b: &[u8]| OsStr::from_bytes(b).to_os_string();
    let run = |args: &[&OsStr]| env.cmd(&[]).args(args).output().unwrap();

    // A name that is not there is said as `ls` of a snapshot says it (QA r29:
    // ext4-view's "file not found").
    let err = env.fails(&["ls", &snap, "--image-fs", "/nope"], 1);
    assert!(
        err.contains("/nope: no such file or directory in the image's filesystem"),
        "{err}"
    );

    // Both are there and each is read as itself when the directory is walked.
    let out = env.path("all");
    env.ok(&fs_restore(&snap, "/", &out));
    assert_eq!(fs::read(out.join("root/A/f")).unwrap(), b"in A\n");
    assert_eq!(
        fs::read(out.join("root").join(literal_a).join("f")).unwrap(),
        b"in the literal one\n"
    );
    // Named by its bytes: it could be either, and is refused.
    let o = run(&[
        OsStr::new("dump"),
        OsStr::new(&snap),
        OsStr::new("--image-fs"),
        &arg(b"/\xf4\x8f\xbd\x81/f"),
    ]);
    assert_eq!(o.status.code(), Some(1), "{o:?}");
    assert!(
        String::from_utf8_lossy(&o.stderr).contains("two names"),
        "{o:?}"
    );
    // The directory whose name holds two U+10FF2E is restored inside the
    // target, under its own name; nothing is written beside the target.
    let base = env.path("base");
    let target = base.join("target");
    let o = run(&[
        OsStr::new("restore"),
        OsStr::new(&snap),
        OsStr::new("--image-fs"),
        &arg(b"/\xf4\x8f\xbc\xae\xf4\x8f\xbc\xae"),
        OsStr::new("--target"),
        target.as_os_str(),
    ]);
    assert!(o.status.success(), "{o:?}");
    assert_eq!(
        fs::read(target.join(dots).join("readme")).unwrap(),
        b"inside\n"
    );
    let beside: Vec<_> = fs::read_dir(&base)
        .unwrap()
        .map(|e| e.unwrap().file_name())
        .collect();
    assert_eq!(beside, vec![std::ffi::OsString::from("target")]);
    // Stand-ins for `../` name no entry and cannot be one name: refused.
    let o = run(&[
        OsStr::new("restore"),
        OsStr::new(&snap),
        OsStr::new("--image-fs"),
        OsStr::new("/\u{10FF2E}\u{10FF2E}\u{10FF2F}.ssh"),
        OsStr::new("--target"),
        target.as_os_str(),
    ]);
    assert_eq!(o.status.code(), Some(1), "{o:?}");
    assert!(
        String::from_utf8_lossy(&o.stderr).contains("cannot be a file name"),
        "{o:?}"
    );
    assert!(!base.join(".ssh").exists());
}

/// `--image-file PATH` looks inside a raw disk image saved as a file in a
/// snapshot of files: a VM's disk backed up with its directory, or the image
/// `recover` saved from an image snapshot whose snapshot file was lost (QA: such
/// an image was only "not an image snapshot", with no way on but a whole dump).
#[test]
fn image_fs_reads_an_image_saved_as_a_file() {
    let env = Env::new();
    env.init(&[]);
    let tree = env.path("tree");
    fs::create_dir_all(tree.join("etc")).unwrap();
    fs::write(tree.join("etc/hostname"), b"vm-one\n").unwrap();
    let vms = env.path("vms");
    fs::create_dir_all(&vms).unwrap();
    fs::rename(ext4_image(&env, &tree, &[]), vms.join("disk.img")).unwrap();
    let snap = env.backup(&[&vms]);
    let file = format!("{}/disk.img", vms.display());
    let ls = env.ok(&["ls", &snap, "--image-fs", "/etc", "--image-file", &file]);
    assert!(ls.contains("/etc/hostname"), "{ls}");
    let o = env.ok(&[
        "dump",
        &snap,
        "--image-fs",
        "/etc/hostname",
        "--image-file",
        &file,
    ]);
    assert_eq!(o, "vm-one\n");
    let out = env.path("out");
    env.ok(&[
        "restore",
        &snap,
        "--image-fs",
        "/etc",
        "--image-file",
        &file,
        "--target",
        out.to_str().unwrap(),
    ]);
    assert_eq!(fs::read(out.join("etc/hostname")).unwrap(), b"vm-one\n");
    // Without it, the error says how; a directory or a missing path is refused.
    let e = env.fails(&["ls", &snap, "--image-fs", "/"], 1);
    assert!(
        e.contains("not an image snapshot") && e.contains("--image-file"),
        "{e}"
    );
    let dir = vms.display().to_string();
    let e = env.fails(&["ls", &snap, "--image-fs", "/", "--image-file", &dir], 1);
    assert!(e.contains("not a disk image file"), "{e}");
    let e = env.fails(
        &[
            "ls",
            &snap,
            "--image-fs",
            "/",
            "--image-file",
            "/no/such.img",
        ],
        1,
    );
    assert!(e.contains("/no"), "{e}");
    // An image snapshot whose snapshot file is lost: `recover` saves its image
    // as a file, which --image-file reads.
    let img = ext4_image(&env, &tree, &[]);
    let isnap = image_snapshot(&env, &img);
    let sfile = fs::read_dir(env.repo.join("snapshots"))
        .unwrap()
        .map(|e| e.unwrap().path())
        .find(|p| {
            p.file_name()
                .unwrap()
                .to_string_lossy()
                .starts_with(&isnap[..8])
        })
        .unwrap();
    fs::remove_file(sfile).unwrap();
    let v: serde_json::Value = serde_json::from_str(&env.ok(&["recover", "--json"])).unwrap();
    let rsnap = v["snapshot"].as_str().unwrap().to_string();
    let listed = env.ok(&["ls", &rsnap]);
    let saved = listed
        .lines()
        .find(|l| l.ends_with("/fs.img"))
        .unwrap_or_else(|| panic!("{listed}"))
        .to_string();
    let o = env.ok(&[
        "dump",
        &rsnap,
        "--image-fs",
        "/etc/hostname",
        "--image-file",
        &saved,
    ]);
    assert_eq!(o, "vm-one\n");
}

/// A copy into a repository of another block size cuts the image again in that
/// repository's blocks: it stays an image snapshot there, and parents incremental
/// image backups made there.
#[test]
fn copied_image_snapshots_stay_images_in_the_destination_block_size() {
    let src_env = Env::new();
    src_env.init(&["--block-size", "16K"]);
    let img = src_env.path("vm.img");
    let mut data = make_image(&img, 5, 41);
    fs::write(&img, &data[..MIB]).unwrap();
    backup_image(&src_env, &img, &[]);
    fs::write(&img, &data).unwrap();
    let second = backup_image(&src_env, &img, &[]);
    let summaries = |env: &Env| -> Vec<u64> {
        serde_json::from_str::<serde_json::Value>(&env.ok(&["snapshots", "--json"]))
            .unwrap()
            .as_array()
            .unwrap()
            .iter()
            .map(|s| s["summary"]["data_added_packed"].as_u64().unwrap())
            .collect()
    };
    let src_added = summaries(&src_env);
    let dst = Env::new();
    dst.init(&["--block-size", "4K"]);
    // The second snapshot alone: here its copy adds the first MiB too, which its
    // source backup took from its parent. Its figure says this copy's (QA: a
    // copied image read "N changed of N blocks, 20 KiB added").
    let o = dst
        .cmd(&[
            "copy",
            "--from",
            &src_env.location,
            second["snapshot_id"].as_str().unwrap(),
        ])
        .env("CAIRN_FROM_PASSWORD", PASSWORD)
        .output()
        .unwrap();
    assert!(o.status.success(), "{o:?}");
    let dst_added = summaries(&dst);
    assert!(
        dst_added[0] > src_added[1] + src_added[0] / 2,
        "{src_added:?} {dst_added:?}"
    );
    let copied = dst.snapshot_ids().pop().unwrap();
    let info = image_of(&dst, &copied);
    assert_eq!(info["block_size"], 4096, "{info}");
    assert_eq!(info["blocks"], (data.len() as u64).div_ceil(4096));
    assert!(info["blocks_zero"].as_u64().unwrap() >= 256, "{info}");
    let out = dst.path("copy.img");
    restore_image(&dst, &copied, &out, &["--verify"]);
    assert!(fs::read(&out).unwrap() == data);
    // The copy is the parent of a changed-block backup in the destination (same
    // host and source path).
    let list = change(&img, &mut data, &[(MIB + 5, 100)], 42);
    let cbt = dst.path("c.txt");
    fs::write(&cbt, list).unwrap();
    let r = backup_image(&dst, &img, &["--changed-blocks", cbt.to_str().unwrap()]);
    assert_eq!(r["bytes_read"], 4096, "{r}");
    let out2 = dst.path("after.img");
    restore_image(
        &dst,
        r["snapshot_id"].as_str().unwrap(),
        &out2,
        &["--verify"],
    );
    assert!(fs::read(&out2).unwrap() == data);
    // A later backup copied too: its blocks are counted against the copy of
    // its parent here (QA r37: every copied image said every block changed).
    // Changed since the second: 4K blocks 256 (above) and 512-513.
    change(&img, &mut data, &[(2 * MIB + 10, 5000)], 43);
    let third = backup_image(&src_env, &img, &[]);
    let info = copied_image(&src_env, &dst, third["snapshot_id"].as_str().unwrap());
    assert_eq!(info["blocks_changed"], 3, "{info}");
    assert_eq!(info["blocks"], (data.len() as u64).div_ceil(4096));
    let shown = dst.ok(&["snapshots"]);
    assert!(shown.contains("3 changed of"), "{shown}");
    // Unchanged since: none changed, whether the copy cuts it again or takes
    // the content it cut for the third.
    let fourth = backup_image(&src_env, &img, &[]);
    let info = copied_image(&src_env, &dst, fourth["snapshot_id"].as_str().unwrap());
    assert_eq!(info["blocks_changed"], 0, "{info}");
    dst.check_clean();
    // All four in one run: each is counted against the copy of its parent made
    // just before it, whose blobs the run's loaded index does not hold (QA r40:
    // every block changed, for all of them). The first has no parent; the
    // second is the first grown from 1 MiB (256 blocks of 4K) to 1282 blocks.
    let dst2 = copied_whole_at_4k(&src_env);
    assert_eq!(
        image_counts(&dst2, "blocks_changed"),
        [256, 1282 - 256, 3, 0]
    );
    // The fourth is the third's tree again (nothing cut): its zero blocks are
    // the third's.
    assert_eq!(image_counts(&dst2, "blocks_zero"), [0, 256, 256, 256]);
}

/// `copy` of snapshot `id` of `src` into `dst`: the image record of the copy.
fn copied_image(src: &Env, dst: &Env, id: &str) -> serde_json::Value {
    let o = dst
        .cmd(&["copy", "--from", &src.location, id])
        .env("CAIRN_FROM_PASSWORD", PASSWORD)
        .output()
        .unwrap();
    assert!(o.status.success(), "{o:?}");
    let all: serde_json::Value = serde_json::from_str(&dst.ok(&["snapshots", "--json"])).unwrap();
    all.as_array()
        .unwrap()
        .iter()
        .find(|s| s["copied_from"]["snapshot"] == id)
        .unwrap_or_else(|| panic!("no copy of {id}: {all}"))["image"]
        .clone()
}

/// A new repository of 4 KiB blocks holding a copy of every snapshot of `src`,
/// made in one run.
fn copied_whole_at_4k(src: &Env) -> Env {
    let dst = Env::new();
    dst.init(&["--block-size", "4K"]);
    let o = dst
        .cmd(&["copy", "--from", &src.location])
        .env("CAIRN_FROM_PASSWORD", PASSWORD)
        .output()
        .unwrap();
    assert!(o.status.success(), "{o:?}");
    dst
}

/// The image figure `key` of each snapshot of `env`, oldest first.
fn image_counts(env: &Env, key: &str) -> Vec<u64> {
    let all: serde_json::Value = serde_json::from_str(&env.ok(&["snapshots", "--json"])).unwrap();
    all.as_array()
        .unwrap()
        .iter()
        .map(|s| s["image"][key].as_u64().unwrap_or_else(|| panic!("{all}")))
        .collect()
}

/// A parent copied in an earlier run, its unchanged child and a changed
/// grandchild copied together: the grandchild counts against the child, whose
/// image is the stored parent's (QA r43: every block changed).
#[test]
fn a_copied_image_counts_against_an_unchanged_parent_copied_in_the_same_run() {
    let src = Env::new();
    src.init(&["--block-size", "16K"]);
    let img = src.path("vm.img");
    let mut data = Rng(71).bytes(2 * MIB, false);
    fs::write(&img, &data).unwrap();
    let first = backup_image(&src, &img, &[]);
    backup_image(&src, &img, &[]);
    change(&img, &mut data, &[(100_000, 100)], 72);
    backup_image(&src, &img, &[]);
    let dst = Env::new();
    dst.init(&["--block-size", "4K"]);
    for only in [Some(first["snapshot_id"].as_str().unwrap()), None] {
        let mut args = vec!["copy", "--from", &src.location];
        args.extend(only);
        let o = dst
            .cmd(&args)
            .env("CAIRN_FROM_PASSWORD", PASSWORD)
            .output()
            .unwrap();
        assert!(o.status.success(), "{o:?}");
    }
    assert_eq!(image_counts(&dst, "blocks_changed"), [512, 0, 1]);
}

/// Two disks' snapshots copied in one run into another block size, one disk's
/// between the other's: each counts its blocks against its own parent's copy
/// (review r42: only the image copied just before was remembered).
#[test]
fn copied_image_snapshots_of_two_disks_in_one_run_count_against_their_own_parents() {
    let src = Env::new();
    src.init(&["--block-size", "16K"]);
    let (a, b) = (src.path("a.img"), src.path("b.img"));
    let mut da = Rng(51).bytes(2 * MIB, false);
    fs::write(&a, &da).unwrap();
    fs::write(&b, Rng(52).bytes(2 * MIB, false)).unwrap();
    backup_image(&src, &a, &[]);
    backup_image(&src, &b, &[]);
    change(&a, &mut da, &[(100_000, 100)], 53);
    backup_image(&src, &a, &[]);
    backup_image(&src, &b, &[]);
    let dst = copied_whole_at_4k(&src);
    assert_eq!(image_counts(&dst, "blocks_changed"), [512, 512, 1, 0]);
}

/// Through `cairn serve` (TLS, a backup token): a full image, then a changed-block
/// one; a restore token brings both back.
#[test]
fn image_backups_go_through_the_server_with_a_backup_token() {
    use crate::server::{Server, client_cmd};
    let env = Env::new();
    env.init(&["--block-size", "4K"]);
    let img = env.path("vm.raw");
    let mut data = make_image(&img, 6, 51);
    let srv = Server::start(&env.path("state"), &[("main", &env.repo)], false);
    let backup = srv.token("vm01", "main", "backup");
    let restore = srv.token("vm01-r", "main", "restore");
    let run = |token: &str, args: &[&str]| {
        let o = client_cmd(&env, &srv, "main", token, args)
            .output()
            .unwrap();
        assert!(
            o.status.success(),
            "{args:?}: {}",
            String::from_utf8_lossy(&o.stderr)
        );
        serde_json::from_slice::<serde_json::Value>(&o.stdout).unwrap_or_default()
    };
    let i = img.to_str().unwrap();
    let first = run(&backup, &["backup", "--json", "--image", i]);
    let list = change(&img, &mut data, &[(3 * MIB + 7, 9000)], 52);
    let cbt = env.path("c.txt");
    fs::write(&cbt, list).unwrap();
    let second = run(
        &backup,
        &[
            "backup",
            "--json",
            "--image",
            i,
            "--changed-blocks",
            cbt.to_str().unwrap(),
        ],
    );
    assert_eq!(second["bytes_read"], 3 * 4096, "{second}");
    for (snap, what) in [(&first, "first"), (&second, "second")] {
        let out = env.path(what);
        run(
            &restore,
            &[
                "restore",
                snap["snapshot_id"].as_str().unwrap(),
                "--image",
                "--verify",
                "--target",
                out.to_str().unwrap(),
            ],
        );
        if what == "second" {
            assert!(fs::read(&out).unwrap() == data, "{what} differs");
        }
    }
    env.check_clean();
}

/// A changed-block list given against a parent read from another source of the
/// same size is warned about (not refused: an LVM snapshot's device name can
/// change every day); another source of another size is another disk, refused
/// (QA: blocks of the other disk's snapshot were saved as this one's, exit 0).
#[test]
fn a_changed_block_list_against_another_sources_parent_is_warned_about() {
    let env = Env::new();
    env.init(&["--block-size", "4K"]);
    let a = env.path("a.img");
    make_image(&a, 2, 5);
    let first = backup_image(&env, &a, &[]);
    // --json carries the image's figures, as the text does.
    assert_eq!(
        first["image"]["blocks_read"], first["image"]["blocks"],
        "{first}"
    );
    assert!(first["image"]["blocks"].as_u64().unwrap() >= 512, "{first}");
    let list = env.path("none.txt");
    fs::write(&list, "").unwrap();
    let other = env.path("other.img");
    make_image(&other, 1, 7);
    let e = env.fails(
        &[
            "backup",
            "--image",
            other.to_str().unwrap(),
            "--changed-blocks",
            list.to_str().unwrap(),
            "--parent",
            first["snapshot_id"].as_str().unwrap(),
        ],
        1,
    );
    // It does not tell to name a parent: one was named (QA).
    assert!(
        e.contains("another disk") && e.contains("without --changed-blocks once"),
        "{e}"
    );
    assert!(!e.contains("with --parent ID"), "{e}");
    let b = env.path("b.img");
    make_image(&b, 2, 6);
    let o = env.run(&[
        "backup",
        "--image",
        b.to_str().unwrap(),
        "--changed-blocks",
        list.to_str().unwrap(),
        "--parent",
        first["snapshot_id"].as_str().unwrap(),
    ]);
    let e = String::from_utf8_lossy(&o.stderr);
    assert!(o.status.success(), "{e}");
    assert!(e.contains("the parent image snapshot was read from"), "{e}");
    // An empty list may be a tool that failed: said.
    assert!(e.contains("names no change"), "{e}");
    let out = String::from_utf8_lossy(&o.stdout);
    assert!(out.contains("changed since the parent"), "{out}");
    let o = env.run(&[
        "backup",
        "--image",
        env.path("b.img").to_str().unwrap(),
        "--force",
    ]);
    let out = String::from_utf8_lossy(&o.stdout);
    assert!(out.contains("new (no parent)"), "{out}");
}

/// A changed-block backup of an image that shrank, its new end partway through
/// a subtree of the parent's and nothing listed there: the last subtree is the
/// new image's, not the parent's whole one (QA: a 1.5 MiB image saved as a file
/// of 2 MiB, `check` failing, dump and restore giving the parent's bytes past
/// the end with exit 0).
#[test]
fn a_shrunk_image_with_a_changed_block_list_ends_where_it_ends() {
    let env = Env::new();
    env.init(&["--block-size", "16K"]);
    let src = env.path("shrink.img");
    let data = make_image(&src, 3, 8);
    backup_image(&env, &src, &[]);
    let list = env.path("empty.txt");
    fs::write(&list, "").unwrap();
    for size in [1_572_864usize, 1_064_960, 524_288] {
        fs::write(&src, &data[..size]).unwrap();
        let r = backup_image(&env, &src, &["--changed-blocks", list.to_str().unwrap()]);
        let id = r["snapshot_id"].as_str().unwrap();
        let out = env.path(&format!("out-{size}.img"));
        restore_image(&env, id, &out, &[]);
        assert!(fs::read(&out).unwrap() == data[..size], "{size}");
        let dumped = env.cmd(&["dump", id, "shrink.img"]).output().unwrap();
        assert!(dumped.status.success());
        assert!(dumped.stdout == data[..size], "dump of {size}");
    }
    env.check_clean();
}

/// A changed-block list is relative to the backup made last: a snapshot dated
/// ahead by a wrong clock does not stay the parent of the ones after it, and a
/// parent found by path that holds another image (one path, several disks in turn)
/// is refused. Each image restores as it was.
#[test]
fn a_changed_block_parent_is_the_last_backup_of_this_image_whatever_the_clock() {
    let env = Env::new();
    env.init(&["--block-size", "4K"]);
    let src = env.path("disk.img");
    let mut data = make_image(&src, 2, 11);
    let list = env.path("cbt.txt");
    backup_image(&env, &src, &[]);
    // The clock three hours ahead for one backup, then right again.
    let ahead = std::process::Command::new("date")
        .args(["-u", "-d", "+3 hours", "+%Y-%m-%dT%H:%M:%SZ"])
        .output()
        .unwrap();
    let ahead = String::from_utf8(ahead.stdout).unwrap().trim().to_string();
    fs::write(&list, change(&src, &mut data, &[(4096, 4096)], 1)).unwrap();
    let l = list.to_str().unwrap();
    backup_image(&env, &src, &["--changed-blocks", l, "--time", &ahead]);
    let mut snaps = Vec::new();
    for (i, off) in [(2u64, 65536usize), (3, 1 << 20)] {
        fs::write(&list, change(&src, &mut data, &[(off, 4096)], i)).unwrap();
        let r = backup_image(&env, &src, &["--changed-blocks", l]);
        snaps.push((r["snapshot_id"].as_str().unwrap().to_string(), data.clone()));
    }
    for (i, (snap, want)) in snaps.iter().enumerate() {
        let out = env.path(&format!("r{i}.img"));
        restore_image(&env, snap, &out, &[]);
        assert!(fs::read(&out).unwrap() == *want, "snapshot {i} differs");
    }

    // Another disk at the same path, named so: a list of the first is refused.
    let other = make_image(&src, 1, 12);
    backup_image(&env, &src, &["--name", "other"]);
    fs::write(&src, &data).unwrap();
    fs::write(&list, "").unwrap();
    let o = env.run(&[
        "backup",
        "--image",
        src.to_str().unwrap(),
        "--changed-blocks",
        l,
    ]);
    let e = String::from_utf8_lossy(&o.stderr);
    assert_eq!(o.status.code(), Some(1), "{e}");
    assert!(
        e.contains("is of the image \"other\", not \"disk.img\""),
        "{e}"
    );
    // Named, it goes.
    let last = &snaps[1].0;
    let r = backup_image(&env, &src, &["--changed-blocks", l, "--parent", last]);
    let out = env.path("named.img");
    restore_image(&env, r["snapshot_id"].as_str().unwrap(), &out, &[]);
    assert!(fs::read(&out).unwrap() == data);
    assert_ne!(other, data);
    env.ok(&["check", "--read-data"]);
}

/// An ext4 image of `tree` (16 MiB, `mke2fs -d` with `extra` options), backed up
/// as an image: its snapshot's id.
fn ext4_image_snapshot(env: &Env, tree: &Path, extra: &[&str]) -> String {
    image_snapshot(env, &ext4_image(env, tree, extra))
}

/// A 16 MiB ext4 image holding `tree` (`extra`: more `mke2fs` options).
fn ext4_image(env: &Env, tree: &Path, extra: &[&str]) -> PathBuf {
    let img = env.path("fs.img");
    sh(Command::new("mke2fs")
        .args(["-q", "-t", "ext4"])
        .args(extra)
        .arg("-d")
        .arg(tree)
        .arg(&img)
        .arg("16M"));
    img
}

/// `dump` and `restore --image-fs` of image snapshot `snap`, both succeeding:
/// its `/pre` is `len` zeros (a preallocated file over a deleted one's bytes),
/// and its `/small` holds `small`.
fn preallocated_reads_as_zeros(env: &Env, snap: &str, len: usize, small: &[u8]) {
    let dumped = env
        .cmd(&["dump", snap, "--image-fs", "/pre"])
        .output()
        .unwrap();
    assert!(dumped.status.success(), "{dumped:?}");
    assert_eq!(dumped.stdout.len(), len);
    assert!(dumped.stdout.iter().all(|&b| b == 0), "stale bytes dumped");
    let out = env.path("out");
    env.ok(&fs_restore(snap, "/", &out));
    let restored = fs::read(out.join("root/pre")).unwrap();
    assert_eq!(restored.len(), len);
    assert!(restored.iter().all(|&b| b == 0), "stale bytes restored");
    assert_eq!(fs::read(out.join("root/small")).unwrap(), small);
}

/// A preallocated file (`fallocate`: extents marked uninitialised) reads as
/// zeros, as the kernel reads it, not as what a deleted file left in its blocks
/// (QA r23: `dump` and `restore --image-fs` gave out the deleted file's data);
/// and a bigalloc filesystem of 1 KiB blocks, whose first data block is 0, is
/// read (its inode tables were looked for in the superblock).
#[test]
fn image_fs_reads_preallocated_blocks_as_zeros_and_bigalloc() {
    let env = Env::new();
    env.init(&[]);
    let tree = env.path("tree");
    fs::create_dir_all(&tree).unwrap();
    let junk = Rng(41).bytes(2 << 20, false);
    fs::write(tree.join("junk"), &junk).unwrap();
    fs::write(tree.join("small"), b"small\n").unwrap();
    let img = ext4_image(&env, &tree, &["-b", "1024"]);
    let cmds = env.path("cmds");
    fs::write(
        &cmds,
        "rm junk\nwrite /dev/null pre\nfallocate pre 0 2047\nsif pre size 2097152\n",
    )
    .unwrap();
    sh(Command::new("debugfs")
        .arg("-w")
        .arg("-f")
        .arg(&cmds)
        .arg(&img));
    let stat = Command::new("debugfs")
        .args(["-R", "stat pre"])
        .arg(&img)
        .output()
        .unwrap();
    assert!(
        String::from_utf8_lossy(&stat.stdout).contains("[u]"),
        "no uninitialised extent: {stat:?}"
    );
    // The deleted file's bytes are still in the image, in the new file's blocks.
    let raw = fs::read(&img).unwrap();
    let listed = Command::new("debugfs")
        .args(["-R", "blocks pre"])
        .arg(&img)
        .output()
        .unwrap();
    let junk_blocks: std::collections::HashSet<&[u8]> = junk.chunks(1024).collect();
    let stale = String::from_utf8_lossy(&listed.stdout)
        .split_whitespace()
        .filter_map(|b| b.parse::<usize>().ok())
        .filter(|&b| junk_blocks.contains(&raw[b * 1024..(b + 1) * 1024]))
        .count();
    assert!(
        stale > 1000,
        "{stale} of pre's blocks hold the deleted file's bytes"
    );
    let snap = image_snapshot(&env, &img);
    preallocated_reads_as_zeros(&env, &snap, 2 << 20, b"small\n");

    fs::write(tree.join("junk"), &junk).unwrap();
    fs::remove_file(&img).unwrap();
    let img = ext4_image(
        &env,
        &tree,
        &["-b", "1024", "-O", "bigalloc", "-C", "16384"],
    );
    let snap = image_snapshot(&env, &img);
    let out = env.path("out-bigalloc");
    env.ok(&fs_restore(&snap, "/", &out));
    assert_eq!(fs::read(out.join("root/junk")).unwrap(), junk);
    assert_eq!(fs::read(out.join("root/small")).unwrap(), b"small\n");
}

/// `restore --image-fs --verify` reads back every file it writes and compares
/// it with the image (it was refused, QA r37), counts and says so, and names a
/// file that differs (changed between its write and its read-back); under
/// `if-changed` a file of the image's size and time is kept only when its bytes
/// are the image's too.
#[test]
fn image_fs_restore_verify_reads_back_and_compares() {
    let env = Env::new();
    env.init(&[]);
    let tree = env.path("tree");
    fs::create_dir_all(tree.join("d")).unwrap();
    let big = Rng(31).bytes(300_000, false);
    fs::write(tree.join("d/big"), &big).unwrap();
    fs::write(tree.join("d/small"), b"small\n").unwrap();
    fs::write(tree.join("top"), b"top\n").unwrap();
    let snap = ext4_image_snapshot(&env, &tree, &[]);
    let out = env.path("out");
    let restore = |extra: &[&str]| {
        let mut args = vec!["restore", &snap, "--image-fs", "/d", "--verify", "--target"];
        args.push(out.to_str().unwrap());
        args.extend_from_slice(extra);
        env.run(&args)
    };
    let o = restore(&[]);
    let text = String::from_utf8_lossy(&o.stdout);
    assert!(o.status.success(), "{o:?}");
    assert!(
        text.contains("verified 2 files against the image"),
        "{text}"
    );
    assert!(text.contains("all match"), "{text}");
    assert!(fs::read(out.join("d/big")).unwrap() == big);
    // Kept unread by `never`: said so, not "all match" (QA r40).
    let o = restore(&["--overwrite", "never"]);
    let text = String::from_utf8_lossy(&o.stdout);
    assert!(
        text.contains(
            "nothing to compare; 2 files not compared (left in place by --overwrite never"
        ),
        "{text}"
    );
    // A same-size, same-time change: kept without --verify, written again with.
    let f = out.join("d/big");
    let before = fs::metadata(&f).unwrap();
    let mut changed = big.clone();
    changed[1000] ^= 1;
    fs::write(&f, &changed).unwrap();
    let set = |p: &Path, m: &fs::Metadata| {
        let t = fs::FileTimes::new().set_modified(m.modified().unwrap());
        fs::File::options()
            .write(true)
            .open(p)
            .unwrap()
            .set_times(t)
            .unwrap();
    };
    set(&f, &before);
    env.ok(&[
        "restore",
        &snap,
        "--image-fs",
        "/d",
        "--target",
        out.to_str().unwrap(),
    ]);
    assert!(fs::read(&f).unwrap() == changed, "kept by size and time");
    let o = restore(&["--json"]);
    assert!(o.status.success(), "{o:?}");
    let j: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
    assert_eq!(j["verified"], 2, "{j}");
    assert_eq!(j["files"], 1, "{j}");
    assert_eq!(j["kept"], 2, "the directory and the small file: {j}");
    assert!(fs::read(&f).unwrap() == big, "written again");
    // Changed between its write and its read-back: named, exit 1.
    fs::remove_dir_all(&out).unwrap();
    let pause = env.path("pause");
    fs::create_dir_all(&pause).unwrap();
    let mut args = vec!["restore", &snap, "--image-fs", "/d", "--verify", "--target"];
    args.push(out.to_str().unwrap());
    let child = env
        .cmd(&args)
        .env(
            "CAIRN_TEST_PAUSE_AT",
            format!("image-fs:verify:1:{}", pause.display()),
        )
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    wait_until(
        "the restore to write its first file",
        Duration::from_secs(60),
        || pause.join("reached").exists(),
    );
    let written: Vec<PathBuf> = ["d/big", "d/small"]
        .iter()
        .map(|n| out.join(n))
        .filter(|p| p.exists())
        .collect();
    assert_eq!(written.len(), 1, "{written:?}");
    let mut bytes = fs::read(&written[0]).unwrap();
    bytes[0] ^= 1;
    fs::write(&written[0], &bytes).unwrap();
    fs::write(pause.join("go"), b"").unwrap();
    let o = child.wait_with_output().unwrap();
    let err = String::from_utf8_lossy(&o.stderr);
    let text = String::from_utf8_lossy(&o.stdout);
    assert_eq!(o.status.code(), Some(1), "{err}");
    assert!(
        err.contains(&format!(
            "{}: verify: the file read back differs from the image",
            written[0].display()
        )),
        "{err}"
    );
    assert!(
        text.contains("verified 1 file against the image") && text.contains("1 problem"),
        "{text}"
    );
    assert!(
        text.contains(": 1 file,"),
        "the file that differs is not counted: {text}"
    );
    // Left as a file written in part (QA r40: it kept the image's size, mode
    // and time, and the next restore kept it as unchanged).
    let m = fs::metadata(&written[0]).unwrap();
    assert_eq!(m.mode() & 0o777, 0o600);
    let wrong = fs::read(&written[0]).unwrap();
    env.ok(&[
        "restore",
        &snap,
        "--image-fs",
        "/d",
        "--target",
        out.to_str().unwrap(),
    ]);
    let right = fs::read(&written[0]).unwrap();
    assert!(wrong != right, "rewritten by the next restore");
    assert!(right == big || right == b"small\n", "the image's bytes");
}

/// `restore --image-fs --dry-run` (it was refused, QA r37) writes nothing, into
/// a target that is not there or one that holds an earlier restore, and says
/// what the restore then does: the same counts, entry by entry.
#[test]
fn image_fs_restore_dry_run_counts_what_the_restore_does_and_writes_nothing() {
    let env = Env::new();
    env.init(&[]);
    let tree = env.path("tree");
    fs::create_dir_all(tree.join("d/sub")).unwrap();
    fs::write(tree.join("d/big"), Rng(41).bytes(200_000, false)).unwrap();
    fs::write(tree.join("d/small"), b"small\n").unwrap();
    fs::write(tree.join("d/sub/f"), b"linked\n").unwrap();
    fs::hard_link(tree.join("d/sub/f"), tree.join("d/g")).unwrap();
    std::os::unix::fs::symlink("sub/f", tree.join("d/s")).unwrap();
    sh(Command::new("mkfifo").arg(tree.join("d/p")));
    let snap = ext4_image_snapshot(&env, &tree, &[]);
    let out = env.path("out");
    let run = |extra: &[&str]| -> serde_json::Value {
        let mut args = vec!["restore", &snap, "--image-fs", "/d", "--json", "--target"];
        args.push(out.to_str().unwrap());
        args.extend_from_slice(extra);
        serde_json::from_str(&env.ok(&args)).unwrap()
    };
    let counts = |j: &serde_json::Value| -> Vec<u64> {
        [
            "files",
            "dirs",
            "symlinks",
            "specials",
            "hardlinks",
            "kept",
            "bytes",
        ]
        .iter()
        .map(|k| j[k].as_u64().unwrap_or_else(|| panic!("{k}: {j}")))
        .collect()
    };
    let state = |root: &Path| -> Vec<(PathBuf, u32, i64, i64, Vec<u8>)> {
        walk(root)
            .into_iter()
            .map(|(p, m)| {
                let body = if m.is_file() {
                    fs::read(root.join(&p)).unwrap()
                } else {
                    Vec::new()
                };
                (p, m.mode(), m.mtime(), m.mtime_nsec(), body)
            })
            .collect()
    };
    // Nothing there yet: nothing made.
    let dry = run(&["--dry-run"]);
    assert!(!out.exists(), "the target was created");
    assert_eq!(dry["dry_run"], true, "{dry}");
    let real = run(&[]);
    assert_eq!(counts(&dry), counts(&real), "{dry} {real}");
    assert_eq!(
        counts(&real),
        [4 - 1, 2, 1, 1, 1, 0, 200_000 + 6 + 7],
        "{real}"
    );
    // Over that restore, changed: one file rewritten, one removed, one's mode.
    fs::write(out.join("d/small"), b"SMALL\n").unwrap();
    fs::remove_file(out.join("d/big")).unwrap();
    fs::set_permissions(
        out.join("d/sub/f"),
        std::os::unix::fs::PermissionsExt::from_mode(0o600),
    )
    .unwrap();
    let before = state(&out);
    for mode in ["if-changed", "always", "never", "if-newer"] {
        let dry = run(&["--dry-run", "--overwrite", mode]);
        assert_eq!(
            state(&out),
            before,
            "--overwrite {mode}: the dry run changed the target"
        );
        // What the dry run says, the restore does (on a copy, so that each mode
        // starts from the same target).
        let copy = env.path(&format!("copy-{mode}"));
        sh(Command::new("cp").arg("-a").arg(&out).arg(&copy));
        let mut args = vec![
            "restore",
            &snap,
            "--image-fs",
            "/d",
            "--json",
            "--overwrite",
            mode,
            "--target",
        ];
        args.push(copy.to_str().unwrap());
        let real: serde_json::Value = serde_json::from_str(&env.ok(&args)).unwrap();
        assert_eq!(
            counts(&dry),
            counts(&real),
            "--overwrite {mode}: {dry} {real}"
        );
    }
    let dry = run(&["--dry-run"]);
    // small and sub/f (and g, its other name, linked to it), big, and d's own
    // times (its entries changed); sub, s and p kept.
    assert_eq!(counts(&dry)[..6], [3, 1, 0, 0, 1, 3], "{dry}");
    // Text: said as what would be done.
    let text = env.ok(&[
        "restore",
        &snap,
        "--image-fs",
        "/d",
        "--dry-run",
        "--target",
        out.to_str().unwrap(),
    ]);
    assert!(
        text.contains("would restore /d from the image's filesystem"),
        "{text}"
    );
    assert!(text.contains("would leave 3 existing entries"), "{text}");
    // With --verify, a file of the image's size and time whose bytes differ
    // is written again, and the dry run says so too (review r42).
    let fresh = env.path("fresh");
    let into = |dir: &Path, extra: &[&str]| -> serde_json::Value {
        let mut args = vec!["restore", &snap, "--image-fs", "/d", "--json", "--target"];
        args.push(dir.to_str().unwrap());
        args.extend_from_slice(extra);
        serde_json::from_str(&env.ok(&args)).unwrap()
    };
    into(&fresh, &[]);
    let big = fresh.join("d/big");
    let m = fs::metadata(&big).unwrap();
    let mut bytes = fs::read(&big).unwrap();
    bytes[5] ^= 1;
    fs::write(&big, &bytes).unwrap();
    fs::File::options()
        .write(true)
        .open(&big)
        .unwrap()
        .set_times(fs::FileTimes::new().set_modified(m.modified().unwrap()))
        .unwrap();
    assert_eq!(into(&fresh, &["--dry-run"])["files"], 0);
    let dry = into(&fresh, &["--dry-run", "--verify"]);
    assert_eq!(dry["files"], 1, "{dry}");
    assert_eq!(dry["verified"], serde_json::Value::Null, "{dry}");
    assert_eq!(fs::read(&big).unwrap(), bytes, "the dry run wrote");
    assert_eq!(into(&fresh, &["--verify"])["files"], 1);
    // A target that is a symlink is refused as the restore refuses it.
    let link = env.path("link");
    std::os::unix::fs::symlink(&out, &link).unwrap();
    env.fails(
        &[
            "restore",
            &snap,
            "--image-fs",
            "/d",
            "--dry-run",
            "--target",
            link.to_str().unwrap(),
        ],
        1,
    );
    assert_eq!(state(&out), before);
}

/// A hard-linked file whose first name `never` or `if-newer` keeps while it
/// holds something else: the other names are written as a file of their own,
/// with the image's bytes, and said so, as a restore of files does (QA r43:
/// they became links to the kept file, its bytes, exit 0). The dry run says
/// the same.
#[test]
fn image_fs_names_of_a_file_whose_first_name_is_kept_apart_get_the_images_bytes() {
    let env = Env::new();
    env.init(&[]);
    let tree = env.path("tree");
    fs::create_dir_all(tree.join("d1")).unwrap();
    fs::create_dir_all(tree.join("d2")).unwrap();
    let data = Rng(61).bytes(300_000, false);
    fs::write(tree.join("d1/a.bin"), &data).unwrap();
    fs::hard_link(tree.join("d1/a.bin"), tree.join("d2/a.hard")).unwrap();
    let snap = ext4_image_snapshot(&env, &tree, &[]);
    for mode in ["never", "if-newer"] {
        let out = env.path(&format!("out-{mode}"));
        fs::create_dir_all(out.join("root/d1")).unwrap();
        // Someone else's file, newer, where the first name goes.
        fs::write(out.join("root/d1/a.bin"), b"theirs").unwrap();
        let args = |extra: &[&'static str]| {
            let mut a = vec!["restore", &snap, "--image-fs", "/", "--overwrite", mode];
            a.extend_from_slice(extra);
            a.push("--target");
            a.push(out.to_str().unwrap());
            a.iter().map(|s| s.to_string()).collect::<Vec<_>>()
        };
        let run = |extra: &[&'static str]| {
            let a = args(extra);
            env.run(&a.iter().map(String::as_str).collect::<Vec<_>>())
        };
        let dry = run(&["--dry-run", "--json"]);
        let real = run(&["--json"]);
        let err = String::from_utf8_lossy(&real.stderr);
        assert_eq!(real.status.code(), Some(3), "{mode}: {err}");
        assert!(
            err.contains("d2/a.hard: restored as a file of its own"),
            "{mode}: {err}"
        );
        assert_eq!(
            fs::read(out.join("root/d2/a.hard")).unwrap(),
            data,
            "{mode}"
        );
        assert_eq!(fs::read(out.join("root/d1/a.bin")).unwrap(), b"theirs");
        let (dry, real): (serde_json::Value, serde_json::Value) = (
            serde_json::from_slice(&dry.stdout).unwrap(),
            serde_json::from_slice(&real.stdout).unwrap(),
        );
        for k in ["files", "hardlinks", "kept", "warnings"] {
            assert_eq!(dry[k], real[k], "{mode} {k}: {dry} {real}");
        }
    }
}

/// `restore --image-fs -v` lists each entry as a restore of a file snapshot
/// does (it was refused): restored the first time, unchanged when run again,
/// updated once a file was changed in the target; an image restore with -v is
/// still refused (it writes blocks, not files).
#[test]
fn image_fs_restore_verbose_lists_each_entry() {
    let env = Env::new();
    env.init(&[]);
    let tree = env.path("tree");
    fs::create_dir_all(tree.join("d/sub")).unwrap();
    fs::write(tree.join("d/sub/f"), b"one\n").unwrap();
    fs::hard_link(tree.join("d/sub/f"), tree.join("d/g")).unwrap();
    std::os::unix::fs::symlink("sub/f", tree.join("d/s")).unwrap();
    sh(Command::new("find").arg(&tree).args([
        "-exec",
        "touch",
        "-h",
        "-d",
        "@1700000000",
        "{}",
        "+",
    ]));
    let snap = ext4_image_snapshot(&env, &tree, &["-b", "4096"]);
    let out = env.path("out");
    let restore = |extra: &[&str]| {
        let mut args = vec!["restore", &snap, "--image-fs", "/d", "-v", "--target"];
        args.push(out.to_str().unwrap());
        args.extend_from_slice(extra);
        env.ok(&args)
    };
    let lines = |text: &str, word: &str| -> Vec<String> {
        let mut v: Vec<String> = text
            .lines()
            // Listed lines pad the word to 10 columns; the summary does not.
            .filter_map(|l| l.strip_prefix(&format!("{:<10}", word.trim())))
            .map(|p| p.trim_start().rsplit("out/").next().unwrap().to_string())
            .collect();
        v.sort();
        v
    };
    let all = ["d", "d/g", "d/s", "d/sub", "d/sub/f"]
        .map(String::from)
        .to_vec();
    let first = restore(&[]);
    assert_eq!(lines(&first, "restored "), all, "{first}");
    let again = restore(&[]);
    assert_eq!(lines(&again, "unchanged "), all, "{again}");
    fs::remove_file(out.join("d/s")).unwrap();
    std::os::unix::fs::symlink("elsewhere", out.join("d/s")).unwrap();
    let third = restore(&["--overwrite", "always"]);
    assert!(
        lines(&third, "updated ").contains(&"d/s".to_string()),
        "{third}"
    );
    assert_eq!(fs::read_link(out.join("d/s")).unwrap(), Path::new("sub/f"));

    let err = env.fails(
        &[
            "restore",
            &snap,
            "--image",
            "-v",
            "--target",
            env.path("whole.img").to_str().unwrap(),
        ],
        2,
    );
    assert!(err.contains("an image restore writes blocks"), "{err}");
}

/// A tree restored out of an image's ext4 with `--image-fs` keeps its hard links
/// (one inode, every name), extended attributes inside the inode and in a block
/// of their own, POSIX ACLs (ext4 keeps them in a shorter form than `setxattr`
/// takes) and file capabilities: `compare` finds nothing different.
#[test]
fn image_fs_restores_keep_hard_links_xattrs_acls_and_capabilities() {
    let env = Env::new();
    env.init(&[]);
    let tree = env.path("tree");
    let d = tree.join("d");
    fs::create_dir_all(d.join("a")).unwrap();
    fs::create_dir_all(d.join("b")).unwrap();
    fs::write(d.join("a/file"), b"linked three times\n").unwrap();
    fs::hard_link(d.join("a/file"), d.join("a/file2")).unwrap();
    fs::hard_link(d.join("a/file"), d.join("b/link")).unwrap();
    fs::write(d.join("plain"), b"one name\n").unwrap();
    xattr::set(d.join("plain"), "user.comment", b"small, in the inode").unwrap();
    // Too large for the inode: kept in a block of its own.
    xattr::set(d.join("plain"), "user.big", &vec![b'x'; 2000]).unwrap();
    // cap_net_raw, effective (VFS_CAP_REVISION_2).
    let mut cap = Vec::new();
    for w in [0x0200_0001u32, 1 << 13, 0, 0, 0] {
        cap.extend_from_slice(&w.to_le_bytes());
    }
    fs::write(d.join("ping"), b"#!/bin/sh\n").unwrap();
    xattr::set(d.join("ping"), "security.capability", &cap).unwrap();
    let acl = posix_acl(&[
        (1, 6, u32::MAX),
        (2, 4, 1234),
        (4, 4, u32::MAX),
        (8, 2, 4321),
        (0x10, 6, u32::MAX),
        (0x20, 0, u32::MAX),
    ]);
    xattr::set(d.join("a/file"), "system.posix_acl_access", &acl).unwrap();
    xattr::set(d.join("b"), "system.posix_acl_default", &acl).unwrap();
    xattr::set(d.join("b"), "user.dir", b"on a directory").unwrap();
    std::os::unix::fs::symlink("a/file", d.join("sym")).unwrap();
    // Whole seconds: mke2fs -d copies no nanoseconds.
    sh(Command::new("find")
        .arg(&d)
        .args(["-exec", "touch", "-h", "-d", "@1700000000", "{}", "+"]));
    let snap = ext4_image_snapshot(&env, &tree, &["-b", "4096", "-I", "256"]);
    // `restore --image-fs /d --json` into `env`'s directory `into`, with `extra`.
    let restore_d = |into: &str, extra: &[&str]| -> serde_json::Value {
        let target = env.path(into);
        let mut args = vec!["restore", &snap, "--image-fs", "/d", "--json", "--target"];
        args.push(target.to_str().unwrap());
        args.extend_from_slice(extra);
        serde_json::from_str(&env.ok(&args)).unwrap()
    };
    let out = env.path("out");
    let v = restore_d("out", &[]);
    assert_eq!(v["hardlinks"], 2, "{v}");
    assert_eq!(v["xattrs"], 6, "{v}");
    assert_eq!(v["warnings"].as_array().unwrap().len(), 0, "{v}");
    let diffs = compare(&d, &out.join("d"));
    assert!(diffs.is_empty(), "{diffs:#?}");
    assert_eq!(fs::metadata(out.join("d/b/link")).unwrap().nlink(), 3);
    // Only one name of the three restored: a file of its own, and a note of it.
    let one = env.path("one");
    let o = env.cmd(&fs_restore(&snap, "/d/a", &one)).output().unwrap();
    let err = String::from_utf8_lossy(&o.stderr);
    assert_eq!(o.status.code(), Some(0), "{err}");
    assert!(
        err.contains("note: ") && err.contains("names outside /d/a"),
        "{err}"
    );
    assert_eq!(fs::metadata(one.join("a/file2")).unwrap().nlink(), 2);
    // No extended attribute asked for: none set, none failed.
    let v = restore_d("none", &["--exclude-xattr", "*"]);
    assert_eq!(v["xattrs"], 0, "{v}");
    assert_eq!(v["hardlinks"], 2, "{v}");
}

/// `--image-fs` restores FIFOs and (as root) devices, gives a symlink named on its
/// own its own extended attributes (not its target's), and an entry it cannot
/// read costs only that entry: its directory's others are restored, and the
/// restore names it and exits 1.
#[test]
fn image_fs_restores_specials_and_goes_past_an_unreadable_entry() {
    use std::os::unix::ffi::OsStrExt;
    use std::os::unix::fs::{FileTypeExt, PermissionsExt};
    let env = Env::new();
    env.init(&[]);
    let tree = env.path("tree");
    let d = tree.join("d");
    fs::create_dir_all(&d).unwrap();
    fs::write(d.join("a"), b"first\n").unwrap();
    fs::write(d.join("z"), b"last\n").unwrap();
    fs::write(tree.join("target"), b"pointed at\n").unwrap();
    xattr::set(tree.join("target"), "user.only-on-target", b"1").unwrap();
    std::os::unix::fs::symlink("target", tree.join("link")).unwrap();
    sh(Command::new("mkfifo")
        .args(["-m", "0640"])
        .arg(d.join("fifo")));
    if is_root() {
        sh(Command::new("mknod")
            .arg(d.join("null"))
            .args(["c", "1", "3"]));
    }
    // A time before 1970, which the image reader (`ext4-view` 1.0) refuses.
    fs::write(d.join("old"), b"old\n").unwrap();
    sh(Command::new("touch")
        .args(["-d", "1969-12-31 23:59:58"])
        .arg(d.join("old")));
    // A name that is not UTF-8 is read as any other (it was refused).
    let odd = std::ffi::OsStr::from_bytes(b"odd\xff");
    fs::write(d.join(odd), b"odd\n").unwrap();
    let snap = ext4_image_snapshot(&env, &tree, &[]);

    let out = env.path("out-link");
    env.ok(&fs_restore(&snap, "/link", &out));
    assert_eq!(
        fs::read_link(out.join("link")).unwrap(),
        Path::new("target")
    );
    let names: Vec<_> = xattr::list(out.join("link")).unwrap().collect();
    assert!(names.is_empty(), "{names:?}");
    // A restore of a part that leaves no file cut short takes its own mark away
    // (left, it would have later restores rewrite what was edited since); so does
    // one of the whole filesystem, even with an entry that could not be restored
    // (the old file: not there, the next restore writes it whatever it is told).
    let mark = out.join(".cairn-restore-unfinished");
    assert!(!mark.exists());
    let o = env.run(&fs_restore(&snap, "/", &out));
    assert_eq!(o.status.code(), Some(1), "{o:?}");
    assert!(!mark.exists());

    let out = env.path("out-d");
    let o = env
        .cmd(&[
            "restore",
            &snap,
            "--image-fs",
            "/d",
            "--target",
            out.to_str().unwrap(),
            "--json",
        ])
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&o.stderr);
    assert_eq!(o.status.code(), Some(1), "{err}");
    assert!(
        err.contains("/d/old") && err.contains("1 entry could not be restored"),
        "{err}"
    );
    let v: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
    assert_eq!(v["failed"].as_array().unwrap().len(), 1, "{v}");
    // Each with the entry's path and why, as a file restore's errors (QA r35:
    // plain strings).
    assert_eq!(
        v["failed"][0]["path"].as_str(),
        out.join("d/old").to_str(),
        "{v}"
    );
    assert!(
        v["failed"][0]["error"].as_str().unwrap().contains("/d/old"),
        "{v}"
    );
    assert!(!out.join(".cairn-restore-unfinished").exists());
    assert_eq!(fs::read(out.join("d/a")).unwrap(), b"first\n");
    assert_eq!(fs::read(out.join("d/z")).unwrap(), b"last\n");
    assert_eq!(fs::read(out.join("d").join(odd)).unwrap(), b"odd\n");
    // Listed as a file snapshot lists such a name, and named so (its bytes as
    // given on the command line) it is dumped.
    let o = env.run(&["ls", &snap, "--image-fs", "/d"]);
    assert!(
        String::from_utf8_lossy(&o.stdout).contains("/d/odd\\xff"),
        "{o:?}"
    );
    // A device's number, as `ls -l` of a snapshot of files shows it (QA r37).
    if is_root() {
        let o = env.run(&["ls", "-l", &snap, "--image-fs", "/d"]);
        let text = String::from_utf8_lossy(&o.stdout);
        assert!(
            text.lines()
                .any(|l| l.contains("/d/null") && l.contains("1, 3")),
            "{text}"
        );
    }
    let o = env
        .cmd(&["dump", &snap, "--image-fs"])
        .arg(std::ffi::OsStr::from_bytes(b"/d/odd\xff"))
        .output()
        .unwrap();
    assert!(o.status.success(), "{o:?}");
    assert_eq!(o.stdout, b"odd\n");
    let fifo = fs::symlink_metadata(out.join("d/fifo")).unwrap();
    assert!(fifo.file_type().is_fifo());
    assert_eq!(fifo.permissions().mode() & 0o7777, 0o640);
    if is_root() {
        let null = fs::symlink_metadata(out.join("d/null")).unwrap();
        assert!(null.file_type().is_char_device());
        assert_eq!(null.rdev(), libc::makedev(1, 3));
        // Not root: the device is a failed entry (as in a restore of files), the
        // FIFO is made.
        let (mine, cache) = open_to_nobody(&env);
        let o = output_as_nobody(&mut env.cmd(&fs_restore(&snap, "/d", &mine)), &cache);
        let err = String::from_utf8_lossy(&o.stderr);
        assert_eq!(o.status.code(), Some(1), "{err}");
        assert!(
            err.contains("null: a device file is made only by root"),
            "{err}"
        );
        assert!(err.contains("2 entries could not be restored"), "{err}");
        assert!(
            fs::symlink_metadata(mine.join("d/fifo"))
                .unwrap()
                .file_type()
                .is_fifo()
        );
    }
    // ls lists the rest too, then says what it could not read.
    let o = env
        .cmd(&["ls", &snap, "--image-fs", "/d"])
        .output()
        .unwrap();
    assert_eq!(o.status.code(), Some(1));
    let listed = String::from_utf8_lossy(&o.stdout);
    assert!(
        listed.contains("/d/a") && listed.contains("/d/z"),
        "{listed}"
    );
    // In JSON as well (it printed nothing).
    let o = env
        .cmd(&["ls", &snap, "--image-fs", "/d", "--json"])
        .output()
        .unwrap();
    assert_eq!(o.status.code(), Some(1));
    let v: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
    let paths: Vec<&str> = v["entries"]
        .as_array()
        .unwrap()
        .iter()
        .filter_map(|e| e["path"].as_str())
        .collect();
    assert!(paths.contains(&"/d/a") && paths.contains(&"/d/z"), "{v}");
    // Written as the walk goes (an entry a line), the failure in "errors", as
    // a file snapshot's listing.
    let errors = v["errors"].as_array().unwrap();
    assert_eq!(errors.len(), 1, "{v}");
    // The entry that could not be read, not the path listed (QA r35).
    assert_eq!(errors[0]["path"], "/d/old", "{v}");
    let out = String::from_utf8_lossy(&o.stdout);
    assert_eq!(out.lines().count(), paths.len() + 2, "{out}");
}

/// A damaged image: a symlink inode claiming a target of hundreds of GB (the
/// reader would allocate that much, and the process abort) is reported as that
/// entry's damage, on the way to a path or listed; the rest is listed and
/// restored. And a file of holes larger than the image's disk is restored as
/// holes, and stopped by Ctrl-C (SIGINT) while it is written.
#[test]
fn image_fs_goes_past_a_damaged_symlink_and_stops_on_sigint() {
    let env = Env::new();
    env.init(&[]);
    let tree = env.path("tree");
    fs::create_dir_all(tree.join("d")).unwrap();
    fs::write(tree.join("d/f"), b"kept\n").unwrap();
    std::os::unix::fs::symlink("d", tree.join("dl")).unwrap();
    std::os::unix::fs::symlink("d/f", tree.join("bad")).unwrap();
    // 1 TiB of holes with four bytes in the middle.
    let big = fs::File::create(tree.join("holes.raw")).unwrap();
    big.set_len(1 << 40).unwrap();
    std::os::unix::fs::FileExt::write_all_at(&big, b"data", 1 << 39).unwrap();
    drop(big);
    let img = ext4_image(&env, &tree, &[]);
    sh(Command::new("debugfs")
        .args(["-w", "-R", "sif /bad size 0x9700000008"])
        .arg(&img));
    let snap = image_snapshot(&env, &img);
    for args in [
        vec!["ls", &snap, "--image-fs", "/"],
        vec!["ls", &snap, "--image-fs", "/bad/x"],
        vec!["dump", &snap, "--image-fs", "/bad"],
    ] {
        let o = env.cmd(&args).output().unwrap();
        let err = String::from_utf8_lossy(&o.stderr);
        assert_eq!(o.status.code(), Some(1), "{args:?}: {err}");
        assert!(err.contains("/bad: a symlink whose inode claims"), "{err}");
    }
    let o = env.cmd(&["ls", &snap, "--image-fs", "/"]).output().unwrap();
    let listed = String::from_utf8_lossy(&o.stdout);
    assert!(
        listed.contains("/d/f") && listed.contains("/holes.raw"),
        "{listed}"
    );
    assert_eq!(env.ok(&["dump", &snap, "--image-fs", "/dl/f"]), "kept\n");
    // The damaged entry fails alone; Ctrl-C ends the terabyte of holes.
    let out = env.path("out");
    let child = restore_image_fs_root(&env, &snap, &out);
    let file = out.join("root/holes.raw");
    let started = std::time::Instant::now();
    while !file.exists() {
        assert!(started.elapsed() < Duration::from_secs(60), "no holes.raw");
        std::thread::sleep(Duration::from_millis(20));
    }
    std::thread::sleep(Duration::from_millis(300));
    nix::sys::signal::kill(
        nix::unistd::Pid::from_raw(child.id() as i32),
        nix::sys::signal::Signal::SIGINT,
    )
    .unwrap();
    let stopped = std::time::Instant::now();
    let o = child.wait_with_output().unwrap();
    let err = String::from_utf8_lossy(&o.stderr);
    assert_eq!(o.status.code(), Some(130), "{err}");
    assert!(stopped.elapsed() < Duration::from_secs(20), "{err}");
    assert_eq!(fs::read(out.join("root/d/f")).unwrap(), b"kept\n");
}

/// A corrupt filesystem whose directory entries point back at a directory above
/// them (`/b` -> `/`, `/d/back` -> `/d`) is walked once: ls and restore name each
/// loop and go on, where the restore used to create nested directories without
/// end (QA). A directory whose block cannot be read is reported and the listing
/// goes on past it (it stopped there).
#[test]
fn image_fs_walks_name_directory_loops_and_go_past_a_bad_directory() {
    let env = Env::new();
    env.init(&[]);
    let tree = env.path("tree");
    for (f, body) in [("a_bad/in", "1"), ("d/f", "2"), ("z/late", "3")] {
        fs::create_dir_all(tree.join(f).parent().unwrap()).unwrap();
        fs::write(tree.join(f), body).unwrap();
    }
    let img = ext4_image(&env, &tree, &["-b", "4096"]);
    let debugfs = |req: &str| {
        let o = Command::new("debugfs")
            .args(["-w", "-R", req])
            .arg(&img)
            .output()
            .unwrap();
        assert!(o.status.success(), "{o:?}");
        String::from_utf8_lossy(&o.stdout).trim().to_string()
    };
    debugfs("ln / /b");
    debugfs("ln /d /d/back");
    let block: u64 = debugfs("bmap /a_bad 0").parse().unwrap();
    let f = fs::OpenOptions::new().write(true).open(&img).unwrap();
    std::os::unix::fs::FileExt::write_all_at(&f, &[0xff], block * 4096 + 40).unwrap();
    drop(f);
    let snap = image_snapshot(&env, &img);

    let o = env.cmd(&["ls", &snap, "--image-fs", "/"]).output().unwrap();
    let (listed, err) = (
        String::from_utf8_lossy(&o.stdout),
        String::from_utf8_lossy(&o.stderr),
    );
    assert_eq!(o.status.code(), Some(1), "{err}");
    assert!(err.contains("3 entries could not be read"), "{err}");
    // Each one named, not only the first.
    assert_eq!(err.matches("error: ").count(), 4, "{err}");
    assert!(
        listed.contains("/d/back\n") && listed.contains("/z/late\n"),
        "{listed}"
    );
    assert!(!listed.contains("/b/d"), "{listed}");

    let out = env.path("out");
    let mut child = restore_image_fs_root(&env, &snap, &out);
    wait_until("the restore ends", Duration::from_secs(60), || {
        child.try_wait().unwrap().is_some()
    });
    let o = child.wait_with_output().unwrap();
    let err = String::from_utf8_lossy(&o.stderr);
    assert_eq!(o.status.code(), Some(1), "{err}");
    for loop_ in [
        "/b: corrupt filesystem: directory inode 2 is reached a second time",
        "/d/back: corrupt filesystem: directory inode",
    ] {
        assert!(err.contains(loop_), "{err}");
    }
    assert_eq!(fs::read(out.join("root/z/late")).unwrap(), b"3");
    // Refused, not ignored (QA: --verify checked nothing and said nothing), and
    // as usage errors, exit 2 (QA: 1), as options that do not combine are.
    let o = out.to_str().unwrap();
    let x = env.path("x.img");
    let fs_restore: &[&str] = &["restore", &snap, "--image-fs", "/z", "--target", o];
    let image_restore: &[&str] = &["restore", &snap, "--image", "--target", x.to_str().unwrap()];
    for (args, flag, says) in [
        (&fs_restore, "--delete", "do not apply"),
        (
            &image_restore,
            "--dry-run",
            "do not apply to an image restore",
        ),
    ] {
        let mut args = args.to_vec();
        args.push(flag);
        let e = env.fails(&args, 2);
        assert!(e.contains(says), "{flag}: {e}");
    }
    // --image with --image-fs: which restore is meant is asked, not guessed
    // (QA: an --image-fs restore was done).
    let e = env.fails(
        &[
            "restore",
            &snap,
            "--image",
            "--image-fs",
            "/z",
            "--target",
            out.to_str().unwrap(),
        ],
        2,
    );
    assert!(e.contains("'--image' cannot be used with"), "{e}");
    assert_eq!(fs::read(out.join("root/d/f")).unwrap(), b"2");
    assert_eq!(walk(&out).len(), 7, "{:?}", walk(&out));
}

/// A symlink whose target holds a name longer than 255 bytes (the kernel keeps
/// any bytes; no path can follow it): listed and restored as it is (QA r24:
/// `ext4-view` reads targets as paths and refused it, exit 1).
#[test]
fn image_fs_restores_a_symlink_whose_target_no_path_can_follow() {
    let env = Env::new();
    env.init(&[]);
    let tree = env.path("tree");
    fs::create_dir_all(&tree).unwrap();
    let target = format!("../{}/x", "n".repeat(300));
    std::os::unix::fs::symlink(&target, tree.join("long")).unwrap();
    let snap = ext4_image_snapshot(&env, &tree, &[]);
    let listed = env.ok(&["ls", &snap, "--image-fs", "/", "-l"]);
    assert!(listed.contains(&target), "{listed}");
    let out = env.path("out");
    env.ok(&fs_restore(&snap, "/long", &out));
    assert_eq!(fs::read_link(out.join("long")).unwrap(), Path::new(&target));
}

/// A corrupt directory holding one name twice: neither entry is restored and
/// both are reported, exit 1 (QA: the second was counted as an entry left in
/// place, exit 0).
#[test]
fn image_fs_reports_a_name_held_twice() {
    let env = Env::new();
    env.init(&[]);
    let tree = env.path("tree");
    fs::create_dir_all(tree.join("z")).unwrap();
    fs::write(tree.join("z/late"), "first").unwrap();
    fs::write(tree.join("z/other"), "second").unwrap();
    // The second entry of the name is another file's second name: which of
    // the two is read must not decide its hard links (pentest: the name came
    // back as a link to that other file, with its content).
    fs::hard_link(tree.join("z/other"), tree.join("z/latf")).unwrap();
    // Without checksums, so that the renamed entry reads as written.
    let img = ext4_image(&env, &tree, &["-O", "^metadata_csum"]);
    let mut data = fs::read(&img).unwrap();
    let at: Vec<usize> = (0..data.len() - 4)
        .filter(|&i| &data[i..i + 4] == b"latf")
        .collect();
    assert_eq!(at.len(), 1, "one directory entry holds the name");
    data[at[0] + 3] = b'e';
    fs::write(&img, &data).unwrap();
    let snap = image_snapshot(&env, &img);
    let out = env.path("out");
    let o = env.run(&fs_restore(&snap, "/z", &out));
    let err = String::from_utf8_lossy(&o.stderr);
    assert_eq!(o.status.code(), Some(1), "{err}");
    assert!(
        err.contains("/z/late: corrupt filesystem: the directory holds this name more than once"),
        "{err}"
    );
    // Neither entry: which one a lookup by the name reads depends on the
    // directory's index (review), so the name is not restored at all.
    assert!(!out.join("z/late").exists());
    assert_eq!(fs::read(out.join("z/other")).unwrap(), b"second");
    assert_eq!(fs::metadata(out.join("z/other")).unwrap().nlink(), 1);
    assert!(
        !String::from_utf8_lossy(&o.stdout).contains("left"),
        "{o:?}"
    );
}

/// Writes `blocks` (number, bytes) into the image file `img` of `bs`-byte
/// blocks and sets fields of the inode at `path` with debugfs.
fn craft(img: &Path, bs: u64, blocks: &[(u64, Vec<u8>)], path: &str, fields: &[String]) {
    use std::io::Write as _;
    let f = fs::OpenOptions::new().write(true).open(img).unwrap();
    for (n, data) in blocks {
        f.write_all_at(data, n * bs).unwrap();
    }
    let cmds: String = fields
        .iter()
        .map(|f| format!("set_inode_field {path} {f}\n"))
        .collect();
    let mut child = Command::new("debugfs")
        .arg("-w")
        .arg("-f")
        .arg("-")
        .arg(img)
        .stdin(Stdio::piped())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    child
        .stdin
        .take()
        .unwrap()
        .write_all(cmds.as_bytes())
        .unwrap();
    assert!(child.wait().unwrap().success());
}

/// Crafted directories from a hijacked client's image (pentest): an extent
/// tree whose index nodes name one child block again and again (4·84⁴ reads
/// in `ext4-view`, endless with larger blocks), and a block-mapped directory
/// whose every pointer names one block (millions of entries held in memory).
/// Each is named as crafted, the rest is listed and restored.
#[test]
fn image_fs_refuses_crafted_directories_whose_blocks_repeat() {
    let env = Env::new();
    env.init(&[]);
    let tree = env.path("tree");
    fs::create_dir_all(tree.join("d1")).unwrap();
    fs::write(tree.join("d1/x"), "x").unwrap();
    fs::write(tree.join("kept"), "kept").unwrap();
    let bs = 1024u64;
    let img = ext4_image(&env, &tree, &["-O", "^metadata_csum", "-b", "1024"]);
    let header = |entries: u16, depth: u16| {
        let mut h = 0xF30Au16.to_le_bytes().to_vec();
        for v in [entries, entries, depth] {
            h.extend_from_slice(&v.to_le_bytes());
        }
        h.extend_from_slice(&[0; 4]);
        h
    };
    let index = |child: u64| {
        let mut e = 0u32.to_le_bytes().to_vec();
        e.extend_from_slice(&(child as u32).to_le_bytes());
        e.extend_from_slice(&[0; 4]);
        e
    };
    // Blocks near the end of the 16 MiB filesystem, unused by its few files.
    let base = (16 << 20) / bs - 10;
    let per = ((bs - 12) / 12) as u16;
    let mut blocks = Vec::new();
    for depth in 0..5u16 {
        let mut b = header(if depth == 0 { 0 } else { per }, depth);
        for _ in 0..if depth == 0 { 0 } else { per } {
            b.extend(index(base + u64::from(depth) - 1));
        }
        b.resize(bs as usize, 0);
        blocks.push((base + u64::from(depth), b));
    }
    let mut root = header(4, 5);
    for _ in 0..4 {
        root.extend(index(base + 4));
    }
    let fields: Vec<String> = root
        .chunks(4)
        .enumerate()
        .map(|(i, w)| {
            format!(
                "block[{i}] {}",
                u32::from_le_bytes([w[0], w[1], w[2], w[3]])
            )
        })
        .collect();
    craft(&img, bs, &blocks, "/d1", &fields);
    // ls, dump below it and restore name the directory and go on past it.
    let named_and_passed = |img: &Path, says: &str, out: &str| -> String {
        let snap = image_snapshot(&env, img);
        let o = env.run(&["ls", &snap, "--image-fs", "/"]);
        let listed = String::from_utf8_lossy(&o.stderr).into_owned();
        assert_eq!(o.status.code(), Some(1), "{listed}");
        assert!(listed.contains(says), "{listed}");
        assert!(String::from_utf8_lossy(&o.stdout).contains("/kept"));
        let err = env.fails(&["dump", &snap, "--image-fs", "/d1/x"], 1);
        assert!(err.contains(says), "{err}");
        let out = env.path(out);
        let o = env.run(&fs_restore(&snap, "/", &out));
        let err = String::from_utf8_lossy(&o.stderr);
        assert_eq!(o.status.code(), Some(1), "{err}");
        assert!(err.contains(says), "{err}");
        assert_eq!(fs::read(out.join("root/kept")).unwrap(), b"kept");
        listed
    };
    named_and_passed(&img, "/d1: a crafted extent tree", "out");

    // Block-mapped (as ext2 and ext3), one directory block under every pointer.
    fs::remove_file(&img).unwrap();
    let img = ext4_image(
        &env,
        &tree,
        &["-O", "^extent,^64bit,^metadata_csum", "-b", "1024"],
    );
    let (dir_block, ind, dind) = (base, base + 1, base + 2);
    let mut b = Vec::new();
    let entry = |b: &mut Vec<u8>, ino: u32, name: &[u8], rec: u16| {
        b.extend_from_slice(&ino.to_le_bytes());
        b.extend_from_slice(&rec.to_le_bytes());
        b.push(name.len() as u8);
        b.push(1);
        b.extend_from_slice(name);
        b.resize(b.len() + usize::from(rec) - 8 - name.len(), 0);
    };
    entry(&mut b, 2, b".", 12);
    entry(&mut b, 2, b"..", 12);
    let mut n = 0;
    while b.len() + 24 <= bs as usize {
        entry(&mut b, 2, format!("{n:02}").as_bytes(), 12);
        n += 1;
    }
    let rest = (bs as usize - b.len()) as u16;
    entry(&mut b, 2, b"zz", rest);
    let pointers = |to: u64| (to as u32).to_le_bytes().repeat((bs / 4) as usize);
    let blocks = vec![
        (dir_block, b),
        (ind, pointers(dir_block)),
        (dind, pointers(ind)),
    ];
    let mut fields: Vec<String> = (0..12).map(|k| format!("block[{k}] {dir_block}")).collect();
    fields.push(format!("block[IND] {ind}"));
    fields.push(format!("block[DIND] {dind}"));
    fields.push(format!("size {}", 3000 * bs));
    craft(&img, bs, &blocks, "/d1", &fields);
    let listed = named_and_passed(&img, "/d1: a crafted directory", "out2");
    assert!(listed.contains("is in it twice"), "{listed}");
}

/// An ext4 image (`mke2fs` with `mkfs` options, of `size`) mounted with
/// `options`, changed by `work`, its journal committed and the image copied
/// while still mounted (as a snapshot of a live system has it: what was
/// committed last is in the journal only, still to replay), then unmounted:
/// the image (clean now) and the copy.
fn copied_while_mounted(
    env: &Env,
    mkfs: &[&str],
    size: &str,
    options: &str,
    work: impl FnOnce(&Path),
) -> (PathBuf, PathBuf) {
    let img = env.path("fs.img");
    // The type is ext4 unless `mkfs` names one (its first options).
    let kind: &[&str] = if mkfs.first() == Some(&"-t") {
        &[]
    } else {
        &["-t", "ext4"]
    };
    sh(Command::new("mke2fs")
        .arg("-q")
        .args(kind)
        .args(mkfs)
        .arg(&img)
        .arg(size));
    let mnt = env.path("mnt");
    fs::create_dir_all(&mnt).unwrap();
    sh(Command::new("mount")
        .arg("-o")
        .arg(options)
        .arg(&img)
        .arg(&mnt));
    work(&mnt);
    // Each file and directory `fsync`ed (their data written, the journal
    // committed), not `sync`: that also writes the committed metadata in
    // place, and the copy would need no replay to read right.
    fsync_all(&mnt);
    let live = env.path("live.img");
    fs::copy(&img, &live).unwrap();
    sh(Command::new("umount").arg(&mnt));
    (img, live)
}

/// `fsync` of every file and directory below `dir`, and of `dir`.
fn fsync_all(dir: &Path) {
    for e in fs::read_dir(dir).unwrap() {
        let e = e.unwrap();
        let t = e.file_type().unwrap();
        if t.is_dir() {
            fsync_all(&e.path());
        } else if t.is_file() {
            fs::File::open(e.path()).unwrap().sync_all().unwrap();
        }
    }
    fs::File::open(dir).unwrap().sync_all().unwrap();
}

/// An image taken while mounted whose journal revokes, in a later
/// transaction, blocks logged in an earlier one (a directory deleted, its
/// blocks then reused for a file's data): `ext4-view` 1.0's own replay put
/// the old directory blocks over the data, the kernel's does not (QA r25: the
/// file came back with an old directory block inside, exit 0). The journal is
/// replayed the kernel's way, and the file reads as the mounted filesystem
/// had it.
#[test]
fn image_fs_replays_the_journal_as_the_kernel_does() {
    let env = Env::new();
    env.init(&[]);
    let mut fill = Vec::new();
    let (img, live) = copied_while_mounted(
        &env,
        &["-b", "1024", "-J", "size=1"],
        "16M",
        "loop,commit=60",
        |mnt| {
            fs::create_dir(mnt.join("d")).unwrap();
            for i in 0..400 {
                let name = format!("d/long-file-name-to-fill-directory-blocks-{i}");
                fs::write(mnt.join(name), b"").unwrap();
            }
            sh(&mut Command::new("sync"));
            fs::remove_dir_all(mnt.join("d")).unwrap();
            sh(&mut Command::new("sync"));
            // Whatever fits (data is written in place, not through the journal).
            let _ = fs::write(mnt.join("fill"), vec![0xab; 12 << 20]);
            fill = fs::read(mnt.join("fill")).unwrap();
        },
    );
    assert!(fill.len() > 1 << 20, "{}", fill.len());
    assert!(
        needs_recovery(&live),
        "the copy's journal needs no recovery"
    );
    let snap = image_snapshot(&env, &live);
    let o = env
        .cmd(&["dump", &snap, "--image-fs", "/fill"])
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(o.status.success(), "{:?} {err}", o.status);
    assert!(o.stdout == fill, "the file read otherwise than mounted");
    let listed = env.ok(&["ls", &snap, "--image-fs", "/"]);
    assert!(
        !listed.contains("/d"),
        "a deleted directory listed: {listed}"
    );
    // An image unmounted cleanly reads the same.
    let clean = env.path("clean.img");
    fs::copy(&img, &clean).unwrap();
    let snap = image_snapshot(&env, &clean);
    let o = env
        .cmd(&["dump", &snap, "--image-fs", "/fill"])
        .output()
        .unwrap();
    assert!(o.status.success() && o.stdout == fill, "{:?}", o.status);
}

/// Whether the ext2/3/4 image at `img` asks for its journal's recovery.
fn needs_recovery(img: &Path) -> bool {
    let mut f = fs::File::open(img).unwrap();
    let mut sb = [0u8; 4];
    use std::io::{Read, Seek};
    f.seek(std::io::SeekFrom::Start(1024 + 96)).unwrap();
    f.read_exact(&mut sb).unwrap();
    u32::from_le_bytes(sb) & 4 != 0
}

/// Images taken while mounted whose journals `ext4-view` 1.0 cannot replay
/// (an ext3 filesystem: 32-bit block numbers and no checksums; ext4 without
/// `metadata_csum`, with checksums v1 or none; ext4 with `data=journal`, whose
/// log holds file data, a block of it starting with the journal's magic number
/// written escaped) are
/// read as mounted: files written and deleted since the last checkpoint, hard
/// links and content as the kernel showed them when the copy was taken.
#[test]
fn image_fs_replays_journals_of_every_format() {
    let cases: [(&[&str], &str); 4] = [
        (
            &["-t", "ext3", "-b", "1024", "-J", "size=4"],
            "loop,commit=60",
        ),
        (&["-O", "^metadata_csum", "-b", "4096"], "loop,commit=60"),
        (&["-b", "4096"], "loop,commit=60,data=journal"),
        // Checksums v1: a CRC32 of each transaction in its commit block.
        (
            &["-O", "^metadata_csum", "-b", "1024"],
            "loop,commit=60,journal_checksum",
        ),
    ];
    for (mkfs, options) in cases {
        let env = Env::new();
        env.init(&[]);
        let mut seen = String::new();
        // A block that starts as the journal's own blocks do.
        let mut magic = Rng(7).bytes(64 << 10, false);
        for b in magic.chunks_mut(1024) {
            b[..4].copy_from_slice(&0xC03B_3998u32.to_be_bytes());
        }
        let (_, live) = copied_while_mounted(&env, mkfs, "64M", options, |mnt| {
            fs::create_dir(mnt.join("old")).unwrap();
            for i in 0..50 {
                fs::write(mnt.join(format!("old/f{i}")), format!("old {i}\n")).unwrap();
            }
            sh(&mut Command::new("sync"));
            fs::remove_dir_all(mnt.join("old")).unwrap();
            fs::create_dir(mnt.join("new")).unwrap();
            for i in 0..30 {
                fs::write(mnt.join(format!("new/g{i}")), format!("new {i}\n")).unwrap();
            }
            fs::hard_link(mnt.join("new/g0"), mnt.join("new/link")).unwrap();
            fs::write(mnt.join("magic"), &magic).unwrap();
            let mut names: Vec<String> = fs::read_dir(mnt.join("new"))
                .unwrap()
                .map(|e| e.unwrap().file_name().into_string().unwrap())
                .collect();
            names.sort();
            seen = names.join(",");
        });
        assert!(needs_recovery(&live), "{mkfs:?}: no recovery needed");
        let snap = image_snapshot(&env, &live);
        let listed = env.ok(&["ls", &snap, "--image-fs", "/"]);
        assert!(!listed.contains("/old"), "{mkfs:?}: {listed}");
        let json: serde_json::Value =
            serde_json::from_str(&env.ok(&["ls", &snap, "--image-fs", "/new", "--json"])).unwrap();
        let mut names: Vec<&str> = json["entries"]
            .as_array()
            .unwrap()
            .iter()
            .filter_map(|e| e["path"].as_str()?.strip_prefix("/new/"))
            .collect();
        names.sort();
        assert_eq!(names.join(","), seen, "{mkfs:?}");
        // The filesystem keeps ids, no names: none is given, not "" (QA r29).
        let first = &json["entries"][0];
        assert!(
            first["uid"].is_u64() && first.get("user").is_none(),
            "{first}"
        );
        let o = env
            .cmd(&["dump", &snap, "--image-fs", "/magic"])
            .output()
            .unwrap();
        let err = String::from_utf8_lossy(&o.stderr);
        assert!(o.status.success(), "{mkfs:?}: {:?} {err}", o.status);
        assert!(o.stdout == magic, "{mkfs:?}: escaped blocks read otherwise");
        let out = env.path("out");
        let o = env.cmd(&fs_restore(&snap, "/new", &out)).output().unwrap();
        assert!(o.status.success(), "{mkfs:?}: {o:?}");
        let g0 = fs::metadata(out.join("new/g0")).unwrap();
        assert_eq!(g0.nlink(), 2, "{mkfs:?}: hard link lost");
        assert_eq!(fs::read(out.join("new/g29")).unwrap(), b"new 29\n");
    }
}

/// An image of a filesystem taken while it was mounted (its journal still to
/// replay, as with an LVM snapshot of a live system): the journal is replayed
/// for cairn's own reader too, so a preallocated file written since the last
/// checkpoint reads as zeros, not what a deleted file left (review: the
/// content came from `ext4-view`, which reads uninitialised extents' old
/// bytes).
#[test]
fn image_fs_replays_the_journal_for_preallocated_files() {
    let env = Env::new();
    env.init(&[]);
    let (_, live) = copied_while_mounted(&env, &["-b", "4096"], "64M", "loop", |mnt| {
        let junk = Rng(43).bytes(4 << 20, false);
        fs::write(mnt.join("junk"), &junk).unwrap();
        sh(&mut Command::new("sync"));
        fs::remove_file(mnt.join("junk")).unwrap();
        sh(&mut Command::new("sync"));
        sh(Command::new("fallocate")
            .args(["-l", "4M"])
            .arg(mnt.join("pre")));
        fs::write(mnt.join("small"), b"written while mounted\n").unwrap();
    });
    assert!(
        needs_recovery(&live),
        "the copy's journal needs no recovery"
    );
    let snap = image_snapshot(&env, &live);
    preallocated_reads_as_zeros(&env, &snap, 4 << 20, b"written while mounted\n");
}

/// The arguments of `restore SNAP --image-fs PATH --target OUT`.
fn fs_restore<'a>(snap: &'a str, path: &'a str, out: &'a Path) -> [&'a str; 6] {
    let out = out.to_str().unwrap();
    ["restore", snap, "--image-fs", path, "--target", out]
}

/// `restore SNAP --image-fs / --target out`, started with its stderr piped.
fn restore_image_fs_root(env: &Env, snap: &str, out: &Path) -> std::process::Child {
    env.cmd(&fs_restore(snap, "/", out))
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap()
}

/// `backup --image` of a FIFO is refused at once (opening one waits for a writer),
/// and of a file in /proc (its size is not its content).
#[test]
fn an_image_backup_of_a_fifo_is_refused_at_once() {
    let env = Env::new();
    env.init(&[]);
    let fifo = env.path("pipe");
    sh(Command::new("mkfifo").arg(&fifo));
    let mut child = env
        .cmd(&["backup", "--image", fifo.to_str().unwrap()])
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let started = std::time::Instant::now();
    while child.try_wait().unwrap().is_none() {
        if started.elapsed() > Duration::from_secs(30) {
            let _ = child.kill();
            panic!("backup --image of a FIFO still waits");
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    let o = child.wait_with_output().unwrap();
    let err = String::from_utf8_lossy(&o.stderr);
    assert_eq!(o.status.code(), Some(1), "{err}");
    assert!(
        err.contains("--image takes a file or a block device"),
        "{err}"
    );
    // Nor a file of /proc, which says it is empty (it was saved as 0 bytes).
    let o = env
        .cmd(&["backup", "--image", "/proc/self/status"])
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&o.stderr);
    assert_eq!(o.status.code(), Some(1), "{err}");
    assert!(err.contains("whose size is not its content"), "{err}");
    // Nor an empty one (an idle device says it holds 0 bytes).
    let empty = env.path("empty.img");
    fs::write(&empty, b"").unwrap();
    let err = env.fails(&["backup", "--image", empty.to_str().unwrap()], 1);
    assert!(err.contains("the source holds 0 bytes"), "{err}");
    assert!(env.snapshot_ids().is_empty());
}

/// An image restore to a file writes `FILE.cairn-partial` and renames it when the
/// image is whole: a restore killed midway leaves nothing under the target's name
/// that looks like the image, one that could not read some blocks leaves the file
/// it was to replace as it was (what it wrote kept beside it), and the next
/// restore starts the partial file over and finishes.
#[test]
fn a_killed_or_failed_image_restore_leaves_the_target_as_it_was() {
    let env = Env::new();
    env.init(&[]);
    let src = env.path("disk.raw");
    let data = make_image(&src, 24, 91);
    let snap = image_snapshot(&env, &src);
    let target = env.path("back.raw");
    let partial = env.path("back.raw.cairn-partial");
    let t = target.to_str().unwrap();
    // A restore held to `limit` (`rate`), once it has been writing for a while.
    let slowed = |limit: &str, rate: &str| {
        let child = env
            .cmd(&["restore", &snap, "--image", "--target", t, limit, rate])
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap();
        wait_until("the partial file", Duration::from_secs(60), || {
            partial.exists()
        });
        std::thread::sleep(Duration::from_millis(1500));
        child
    };
    // Killed: slowed to about 12 s, killed once it has begun writing.
    let mut child = slowed("--write-limit", "2MiB");
    child.kill().unwrap();
    child.wait().unwrap();
    assert!(!target.exists(), "a killed restore left the target's name");
    assert!(partial.exists());
    // Ctrl-C under a download limit: it stops there, says so (130) and leaves
    // no file (QA: it read the rest at full speed and said it restored it).
    let (code, err, took) = interrupt(slowed("--limit-download", "1M"));
    assert_eq!(code, Some(130), "{err}");
    assert!(err.contains("cancelled"), "{err}");
    assert!(took < Duration::from_secs(10), "{took:?}");
    assert!(!target.exists());
    // Run again: it finishes over the leftover, which is gone.
    restore_image(&env, &snap, &target, &[]);
    assert!(fs::read(&target).unwrap() == data, "restored image differs");
    assert!(!partial.exists());
    assert_eq!(fs::metadata(&target).unwrap().mode() & 0o777, 0o600);
    // Replacing keeps the replaced file's mode.
    fs::set_permissions(&target, std::os::unix::fs::PermissionsExt::from_mode(0o640)).unwrap();
    restore_image(&env, &snap, &target, &["--overwrite", "always"]);
    assert_eq!(fs::metadata(&target).unwrap().mode() & 0o777, 0o640);
    // A full disk: the restore stops at the first refused write, says how far it
    // got, and leaves no partial file holding the space.
    let small = env.path("small");
    let _fs = Tmpfs::mount(&small, "size=4m");
    let on_small = small.join("back.raw");
    let err = env.fails(
        &[
            "restore",
            &snap,
            "--image",
            "--target",
            on_small.to_str().unwrap(),
        ],
        1,
    );
    assert!(
        err.contains("the target refused a write at byte")
            && err.contains("No space left")
            && err.contains("is removed"),
        "{err}"
    );
    assert_eq!(fs::read_dir(&small).unwrap().count(), 0, "{err}");
    // A target in a directory that does not exist: said so.
    let nowhere = env.path("no-such-dir/back.raw");
    let err = env.fails(
        &[
            "restore",
            &snap,
            "--image",
            "--target",
            nowhere.to_str().unwrap(),
        ],
        1,
    );
    assert!(err.contains("no-such-dir does not exist"), "{err}");
    // A symlink at the name the snapshot gives the image, in a target directory,
    // is not followed out of it (QA: it replaced the file it pointed at); a
    // mistyped device makes no file in /dev; `newdir/` is refused before any
    // writing.
    let dir = env.path("into");
    fs::create_dir(&dir).unwrap();
    let victim = env.path("victim");
    fs::write(&victim, b"victim").unwrap();
    std::os::unix::fs::symlink(&victim, dir.join("disk.raw")).unwrap();
    let restore_to = |to: &str| {
        env.fails(
            &[
                "restore",
                &snap,
                "--image",
                "--target",
                to,
                "--overwrite",
                "always",
            ],
            1,
        )
    };
    let err = restore_to(dir.to_str().unwrap());
    assert!(
        err.contains("is a symlink, at the name the snapshot gives"),
        "{err}"
    );
    assert_eq!(fs::read(&victim).unwrap(), b"victim");
    let err = restore_to("/dev/cairn-no-such-device");
    assert!(err.contains("no such device"), "{err}");
    assert!(!Path::new("/dev/cairn-no-such-device").exists());
    // A symlink as the target that leads into the repository is refused: the
    // image would go where it points (QA: a link to the repository's config).
    let config = env.repo.join("config");
    let config_before = fs::read(&config).unwrap();
    let into_repo = env.path("looks-harmless.raw");
    std::os::unix::fs::symlink(&config, &into_repo).unwrap();
    let err = restore_to(into_repo.to_str().unwrap());
    assert!(
        err.contains("is the repository being restored from"),
        "{err}"
    );
    assert_eq!(fs::read(&config).unwrap(), config_before);
    let newdir = format!("{}/", env.path("newdir").display());
    let err = restore_to(&newdir);
    assert!(err.contains("no such directory"), "{err}");
    assert!(!env.path("newdir.cairn-partial").exists());
    // A damaged pack: the restore fails, names where its work is, and the file it
    // was to replace is untouched.
    flip_middle(&largest_pack(&env.repo));
    let err = env.fails(
        &[
            "restore",
            &snap,
            "--image",
            "--target",
            t,
            "--overwrite",
            "always",
        ],
        1,
    );
    // Says what is wrong with the pack, and what finds and repairs it.
    assert!(
        err.contains("could not be restored")
            && err.contains("back.raw.cairn-partial")
            && err.contains("unchanged")
            && err.contains("check --read-data")
            && !err.contains("could not be read)"),
        "{err}"
    );
    assert!(
        fs::read(&target).unwrap() == data,
        "the replaced file changed"
    );
    assert!(partial.exists());

    // Under a file-size limit (`ulimit -f`) below the image's size: an error
    // that says so, and no file left (QA: SIGXFSZ ended the process, exit 153,
    // and left an empty partial file).
    let small = env.path("small.raw");
    let mut cmd = env.cmd(&[
        "restore",
        &snap,
        "--image",
        "--target",
        small.to_str().unwrap(),
    ]);
    limit(&mut cmd, libc::RLIMIT_FSIZE, 4 << 20);
    let o = cmd.output().unwrap();
    let err = String::from_utf8_lossy(&o.stderr);
    assert_eq!(o.status.code(), Some(1), "{err}");
    assert!(err.contains("File too large"), "{err}");
    assert!(!small.exists() && !env.path("small.raw.cairn-partial").exists());
}

/// A sparse image file's holes are not read from the disk, and the report says
/// so: "read" is what was read, the holes are counted apart.
#[test]
fn a_sparse_image_files_holes_are_counted_as_not_read() {
    let env = Env::new();
    env.init(&[]);
    let src = env.path("sparse.raw");
    let f = fs::File::create(&src).unwrap();
    f.set_len(64 * MIB as u64).unwrap();
    let data = Rng(4).bytes(MIB, false);
    f.write_all_at(&data, 8 * MIB as u64).unwrap();
    // Pages of data inside blocks otherwise holes: those blocks are read, not
    // counted in holes (QA r18).
    let pages: Vec<u64> = (0..4).map(|k| (20 * MIB + k * MIB + 8192) as u64).collect();
    for p in &pages {
        f.write_all_at(&Rng(*p).bytes(4096, false), *p).unwrap();
    }
    drop(f);
    if src.metadata().unwrap().blocks() * 512 > 4 * MIB as u64 {
        eprintln!("skipped: the file system here does not keep holes");
        return;
    }
    let r = backup_image(&env, &src, &[]);
    let read = r["bytes_read"].as_u64().unwrap();
    assert!((MIB as u64..2 * MIB as u64).contains(&read), "{r}");
    let i = image_of(&env, r["snapshot_id"].as_str().unwrap());
    let holes = i["bytes_in_holes"].as_u64().unwrap();
    assert!(holes >= 62 * MIB as u64 && holes <= 63 * MIB as u64, "{i}");
    assert_eq!(i["blocks_read"], i["blocks"], "{i}");
    let bs = i["block_size"].as_u64().unwrap();
    let blocks = i["blocks"].as_u64().unwrap();
    let with_data = (0..blocks)
        .filter(|b| {
            let (lo, hi) = (b * bs, (b + 1) * bs);
            (lo < 9 * MIB as u64 && hi > 8 * MIB as u64)
                || pages.iter().any(|&p| lo < p + 4096 && hi > p)
        })
        .count() as u64;
    assert_eq!(
        i["blocks_in_holes"].as_u64(),
        Some(blocks - with_data),
        "{i}"
    );
    let text = env.ok(&["backup", "--image", src.to_str().unwrap()]);
    assert!(text.contains("of the file are holes"), "{text}");
    assert!(text.contains(" in holes (zeros, not read)"), "{text}");
    let out = env.path("back.raw");
    restore_image(&env, r["snapshot_id"].as_str().unwrap(), &out, &[]);
    let back = fs::read(&out).unwrap();
    assert!(back[8 * MIB..9 * MIB] == data[..] && back.len() == 64 * MIB);
    for p in &pages {
        let p = *p as usize;
        assert_eq!(back[p..p + 4096], Rng(p as u64).bytes(4096, false)[..]);
    }
}

/// `repair snapshots` of an image snapshot with a lost block keeps the image:
/// the lost blocks become zeros, recorded as unreadable (so its restore says so,
/// exit 3), where the whole image was dropped for one bad block.
#[test]
fn repair_snapshots_keeps_an_image_with_its_lost_blocks_as_zeros() {
    let env = Env::new();
    env.init(&["--block-size", "16K"]);
    let src = env.path("disk.img");
    let data = make_image(&src, 6, 31);
    backup_image(&env, &src, &[]);
    let snap = env.snapshot_ids().pop().unwrap();
    flip_middle(&largest_pack(&env.repo));
    env.ok(&["repair", "index"]);
    let said = env.ok(&["repair", "snapshots"]);
    assert!(
        said.contains("kept /disk.img (")
            && said.contains(" of its blocks in 1 range lost: now zeros, recorded as unreadable)"),
        "{said}"
    );
    assert!(!said.contains("file data lost"), "{said}");
    let ids = env.snapshot_ids();
    assert_eq!(ids.len(), 1, "{ids:?}");
    let repaired = ids[0].clone();
    assert_ne!(repaired, snap);
    let info = image_of(&env, &repaired);
    let lost: Vec<(usize, usize)> = info["unreadable"]
        .as_array()
        .unwrap()
        .iter()
        .map(|r| {
            (
                r[0].as_u64().unwrap() as usize,
                r[1].as_u64().unwrap() as usize,
            )
        })
        .collect();
    assert!(!lost.is_empty(), "{info}");
    assert!(
        lost.iter()
            .all(|&(at, len)| at % 16384 == 0 && len % 16384 == 0 && len > 0)
    );
    env.check_clean();
    let out = env.path("out.img");
    let o = env.run(&[
        "restore",
        &repaired,
        "--image",
        "--target",
        out.to_str().unwrap(),
    ]);
    assert_eq!(o.status.code(), Some(3), "{o:?}");
    // Its zeros are not said to be the source's doing alone.
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(
        err.contains("could not be read at backup or was lost in the repository"),
        "{err}"
    );
    let listed = env.ok(&["snapshots"]);
    assert!(listed.contains("lost in the repository"), "{listed}");
    let back = fs::read(&out).unwrap();
    assert_eq!(back.len(), data.len());
    let mut at = 0;
    for &(from, len) in &lost {
        assert!(back[at..from] == data[at..from], "kept bytes before {from}");
        assert!(back[from..from + len].iter().all(|&b| b == 0));
        at = from + len;
    }
    assert!(back[at..] == data[at..]);
    // A changed-block incremental on it reads the lost blocks again from the
    // source, which still has them: whole again, with nothing unreadable.
    let list = env.path("nothing-changed.txt");
    fs::write(&list, "").unwrap();
    let again = backup_image(&env, &src, &["--changed-blocks", list.to_str().unwrap()]);
    let healed = again["snapshot_id"].as_str().unwrap().to_string();
    assert!(image_of(&env, &healed)["unreadable"].is_null(), "{again}");
    let out = env.path("healed.img");
    restore_image(&env, &healed, &out, &[]);
    assert!(
        fs::read(&out).unwrap() == data,
        "the lost blocks were not read again"
    );
}

/// An image file written to while it is read (a running VM's disk) is saved as
/// read with a warning and exit 3, as a file would be: its times moved. A block
/// device too, by its write counters (QA: no word for a device written through).
#[test]
fn an_image_file_written_during_the_backup_is_said_to_have_changed() {
    let env = Env::new();
    env.init(&[]);
    let file = env.path("vm.img");
    make_image(&file, 4, 41);
    let dev = Loop::of(&env.path("vm.img"));
    for src in [file.clone(), PathBuf::from(&dev.0)] {
        written_during_the_backup(&env, &src);
    }
}

fn written_during_the_backup(env: &Env, src: &Path) {
    let gate = env.path(&format!("gate-{}", src.display()).replace('/', "_"));
    fs::create_dir_all(&gate).unwrap();
    let backup = env
        .cmd(&["backup", "--json", "--image", src.to_str().unwrap()])
        .env(
            cairn_core::hooks::PAUSE_AT_VAR,
            format!("image:planned:1:{}", gate.display()),
        )
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    wait_until(
        "the backup planned its image",
        Duration::from_secs(60),
        || gate.join("reached").exists(),
    );
    let f = fs::OpenOptions::new().write(true).open(src).unwrap();
    f.write_all_at(b"written by the VM", 3 * MIB as u64)
        .unwrap();
    f.sync_all().unwrap();
    drop(f);
    fs::write(gate.join("go"), b"").unwrap();
    let out = backup.wait_with_output().unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(3), "{err}");
    assert!(err.contains("changed while it was being read"), "{err}");
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(
        v["changed_while_read"].as_array().map(Vec::len),
        Some(1),
        "{v}"
    );
    // Left alone, the next backup says nothing.
    let v = backup_image(env, src, &[]);
    assert_eq!(
        v["changed_while_read"].as_array().map(Vec::len),
        Some(0),
        "{v}"
    );
}

/// A file system backed up from a fresh copy each time (an LVM or btrfs snapshot,
/// here a copy of an ext4 image on another loop device, mounted at the same
/// place) has a new device number and the same inodes and change times: its
/// unchanged files are not read again, as restic does not read them.
#[test]
fn a_file_system_on_a_new_device_is_not_read_again() {
    assert!(
        is_root(),
        "the test suite runs as root (CI does): it uses loop devices"
    );
    let env = Env::new();
    env.init(&[]);
    let tree = env.path("tree");
    fs::create_dir_all(&tree).unwrap();
    random_files(&tree, "f", 5, 200_000, 0);
    let img = ext4_image(&env, &tree, &[]);
    let copy = env.path("copy.img");
    fs::copy(&img, &copy).unwrap();
    let (first, second) = (Loop::of(&img), Loop::of(&copy));
    let mnt = env.path("mnt");
    fs::create_dir_all(&mnt).unwrap();
    let mut devs = Vec::new();
    let mut runs = Vec::new();
    for dev in [&first, &second] {
        sh(Command::new("mount").args(["-o", "ro", &dev.0]).arg(&mnt));
        devs.push(fs::metadata(mnt.join("f0")).unwrap().dev());
        let v = env.backup_json(&[&mnt]);
        sh(Command::new("umount").arg(&mnt));
        runs.push(v);
    }
    assert_ne!(devs[0], devs[1], "the copy is to be on another device");
    assert_eq!(runs[1]["files_unchanged"], 5, "{}", runs[1]);
    assert_eq!(runs[1]["bytes_read"], 0, "{}", runs[1]);
}

/// A changed-block list holds the changes since the last backup read the source:
/// when that snapshot was forgotten, the parent found is an older one, and the
/// list would miss what changed in between (QA: the image restored silently
/// wrong). The list is set aside, said, and the source read whole; `--parent`
/// naming a snapshot is the user's word and is taken.
#[test]
fn a_changed_block_list_is_not_applied_to_an_older_parent_after_a_forget() {
    let env = Env::new();
    env.init(&["--block-size", "16K"]);
    let src = env.path("disk.img");
    let mut data = make_image(&src, 8, 3);
    let first = image_snapshot(&env, &src);
    let cbt = env.path("changed.txt");
    fs::write(&cbt, change(&src, &mut data, &[(MIB, 5000)], 4)).unwrap();
    let second = backup_image(&env, &src, &["--changed-blocks", cbt.to_str().unwrap()]);
    let s2 = second["snapshot_id"].as_str().unwrap().to_string();
    assert_eq!(image_of(&env, &s2)["changed_blocks_input"], true);
    env.ok(&["forget", &s2]);
    // The next list names only what changed since the second snapshot.
    fs::write(&cbt, change(&src, &mut data, &[(5 * MIB, 3000)], 5)).unwrap();
    let (third, err) = backup_image_listed(&env, &src, &cbt);
    assert!(
        err.contains("the changed-block list was not used and the whole source was read")
            && err.contains(&s2[..8]),
        "{err}"
    );
    let s3 = third["snapshot_id"].as_str().unwrap().to_string();
    let i3 = image_of(&env, &s3);
    assert_eq!(i3["changed_blocks_input"], false, "{i3}");
    assert_eq!(i3["blocks_read"], i3["blocks"], "{i3}");
    let out = env.path("out.img");
    restore_image(&env, &s3, &out, &[]);
    assert!(fs::read(&out).unwrap() == data, "the image differs");
    // From here the list is relative to the third snapshot again: used (given
    // on standard input here, as `-`).
    fs::write(&cbt, change(&src, &mut data, &[(2 * MIB, 100)], 6)).unwrap();
    let o = env
        .cmd(&[
            "backup",
            "--json",
            "--image",
            src.to_str().unwrap(),
            "--changed-blocks",
            "-",
        ])
        .stdin(fs::File::open(&cbt).unwrap())
        .output()
        .unwrap();
    assert!(o.status.success(), "{o:?}");
    let fourth: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
    let s4 = fourth["snapshot_id"].as_str().unwrap().to_string();
    assert_eq!(image_of(&env, &s4)["blocks_read"], 1);
    let out4 = env.path("out4.img");
    restore_image(&env, &s4, &out4, &[]);
    assert!(fs::read(&out4).unwrap() == data, "the fourth image differs");
    // A tag rewrites the snapshot under a new id: still the one the next list
    // is relative to (QA: the list was set aside and the disk read whole).
    env.ok(&["tag", "--add", "weekly", &s4]);
    fs::write(&cbt, change(&src, &mut data, &[(3 * MIB, 100)], 7)).unwrap();
    let (tagged, err) = backup_image_listed(&env, &src, &cbt);
    assert!(!err.contains("not used"), "{err}");
    let st = tagged["snapshot_id"].as_str().unwrap().to_string();
    assert_eq!(image_of(&env, &st)["blocks_read"], 1);
    let out_t = env.path("out-t.img");
    restore_image(&env, &st, &out_t, &[]);
    assert!(
        fs::read(&out_t).unwrap() == data,
        "the image after a tag differs"
    );
    // A parent named is taken as the user says, list and all.
    let named = backup_image(
        &env,
        &src,
        &[
            "--changed-blocks",
            cbt.to_str().unwrap(),
            "--parent",
            &first,
        ],
    );
    let i5 = image_of(&env, named["snapshot_id"].as_str().unwrap());
    assert_eq!(i5["changed_blocks_input"], true, "{i5}");
    env.check_clean();
}

/// Options that cannot work together or a name that is not a file name are usage
/// errors (exit 2) that write nothing (QA: they exited 1, as a failed backup does).
#[test]
fn image_backup_usage_errors_exit_2() {
    let env = Env::new();
    env.init(&["--block-size", "16K"]);
    let src = env.path("disk.img");
    make_image(&src, 1, 7);
    let s = src.to_str().unwrap();
    let list = env.path("list.txt");
    fs::write(&list, "0 10\n").unwrap();
    let l = list.to_str().unwrap();
    for (args, says) in [
        (vec!["--image", s, "extra-path"], "cannot be combined"),
        (vec!["--image", s, "--stdin"], "cannot be combined"),
        (
            vec!["--image", s, "--exclude", "*.tmp"],
            "--exclude chooses files",
        ),
        (
            vec!["--image", s, "--files-from", l],
            "--files-from chooses files",
        ),
        (vec!["--image", s, "-x"], "--one-file-system chooses files"),
        (
            vec![
                "--image",
                s,
                "--changed-blocks",
                l,
                "--changed-blocks-format",
                "bogus",
            ],
            "--changed-blocks-format",
        ),
        (vec!["--image", s, "--name", "../x"], "invalid image name"),
        (vec!["--image", s, "--name", "/etc/x"], "invalid image name"),
        (vec!["--image", s, "--name", ".."], "invalid image name"),
        (vec!["--image", s, "--name", ""], "invalid image name"),
    ] {
        let mut a = vec!["backup"];
        a.extend_from_slice(&args);
        let err = env.fails(&a, 2);
        assert!(err.contains(says), "{args:?}: {err}");
    }
    assert!(env.snapshot_ids().is_empty());
}

/// A file dated after January 2038 (a bad clock, an archive's dates) is valid
/// ext4 that the reader under `--image-fs` refuses as corrupt: the listing shows
/// the rest and exits 1, and restoring that file says it is most likely the time
/// and how to reach it, instead of calling the filesystem damaged (QA).
#[test]
fn image_fs_says_a_time_after_2038_is_what_it_cannot_read() {
    let env = Env::new();
    env.init(&[]);
    let tree = env.path("tree");
    fs::create_dir_all(&tree).unwrap();
    fs::write(tree.join("now"), b"today\n").unwrap();
    let future = tree.join("future");
    fs::write(&future, b"from 2040\n").unwrap();
    // 2040-05-01: past 2^31 seconds.
    let t = std::time::UNIX_EPOCH + std::time::Duration::from_secs(2_219_572_800);
    fs::File::options()
        .write(true)
        .open(&future)
        .unwrap()
        .set_modified(t)
        .unwrap();
    let snap = ext4_image_snapshot(&env, &tree, &["-I", "256"]);
    let o = env.run(&["ls", &snap, "--image-fs", "/"]);
    assert_eq!(o.status.code(), Some(1), "{o:?}");
    let listed = String::from_utf8_lossy(&o.stdout);
    assert!(listed.contains("/now"), "{listed}");
    let target = env.path("out");
    let o = env.run(&fs_restore(&snap, "/future", &target));
    assert_eq!(o.status.code(), Some(1), "{o:?}");
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(
        err.contains("after January 2038") && err.contains("restore --image"),
        "{err}"
    );
    // What it can read still comes back.
    env.ok(&fs_restore(&snap, "/now", &target));
    assert_eq!(fs::read(target.join("now")).unwrap(), b"today\n");
}

/// `restore --image-fs` over a target holding the tree already puts hard links
/// back as a restore of files does: a name that became a copy of the file is
/// made a link again, and no note says names were outside the restored
/// directory (QA: the copy was left, and after the first name changed, the note
/// came). A dangling symlink in a path is said to lead nowhere, not to be
/// missing; a full target stops the restore with the file it stopped at (QA: it
/// said "standard output" for each file).
#[test]
fn image_fs_restore_over_a_target_puts_hard_links_back() {
    use std::io::Write;
    let env = Env::new();
    env.init(&[]);
    let tree = env.path("tree");
    let d = tree.join("dir");
    fs::create_dir_all(&d).unwrap();
    fs::write(d.join("a.bin"), Rng(41).bytes(3 << 20, false)).unwrap();
    fs::hard_link(d.join("a.bin"), d.join("b.bin")).unwrap();
    std::os::unix::fs::symlink("missing", d.join("dangling")).unwrap();
    fs::create_dir_all(d.join("sub")).unwrap();
    fs::write(d.join("f2"), b"in /dir").unwrap();
    fs::write(tree.join("f2"), b"at the root").unwrap();
    std::os::unix::fs::symlink("dir/sub", tree.join("link")).unwrap();
    let snap = ext4_image_snapshot(&env, &tree, &[]);
    // `..` after a symlink is the parent of where it leads, as the kernel has
    // it (QA: read as `/f2`).
    let out = env.ok(&["dump", &snap, "--image-fs", "/link/../f2"]);
    assert_eq!(out, "in /dir");
    // A symlink named last is not followed by dump, as in a snapshot of files.
    let e = env.fails(&["dump", &snap, "--image-fs", "/dir/dangling"], 1);
    assert!(
        e.contains("/dir/dangling is a symlink to missing, not a file"),
        "{e}"
    );
    let e = env.fails(&["dump", &snap, "--image-fs", "/link"], 1);
    assert!(e.contains("is a symlink to dir/sub"), "{e}");
    let t = env.path("t");
    let restore = |target: &Path| env.run(&fs_restore(&snap, "/dir", target));
    let inode = |n: &str| fs::metadata(t.join("dir").join(n)).unwrap().ino();
    assert!(restore(&t).status.success());
    assert_eq!(inode("a.bin"), inode("b.bin"));
    // The second name becomes a copy: same content, size and time.
    fs::remove_file(t.join("dir/b.bin")).unwrap();
    fs::copy(t.join("dir/a.bin"), t.join("dir/b.bin")).unwrap();
    let mtime = fs::metadata(t.join("dir/a.bin"))
        .unwrap()
        .modified()
        .unwrap();
    fs::File::options()
        .write(true)
        .open(t.join("dir/b.bin"))
        .unwrap()
        .set_modified(mtime)
        .unwrap();
    assert_ne!(inode("a.bin"), inode("b.bin"));
    let o = restore(&t);
    assert!(o.status.success(), "{o:?}");
    assert_eq!(inode("a.bin"), inode("b.bin"));
    assert_eq!(fs::metadata(t.join("dir/b.bin")).unwrap().nlink(), 2);
    // The first name changes: rewritten, and the other name linked to it.
    fs::OpenOptions::new()
        .append(true)
        .open(t.join("dir/a.bin"))
        .unwrap()
        .write_all(b"changed")
        .unwrap();
    let o = restore(&t);
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(o.status.success(), "{err}");
    assert!(!err.contains("names outside"), "{err}");
    assert_eq!(inode("a.bin"), inode("b.bin"));
    assert!(fs::read(t.join("dir/b.bin")).unwrap() == fs::read(d.join("a.bin")).unwrap());

    // A newer file where the image has the directory: kept under if-newer and
    // never, with a warning that nothing below it was restored (QA: replaced
    // silently under if-newer, nothing said under never); replaced under
    // if-changed.
    let other = env.path("other");
    fs::create_dir_all(&other).unwrap();
    fs::write(other.join("dir"), b"my newer notes").unwrap();
    let later = std::time::SystemTime::now() + std::time::Duration::from_secs(400 * 86400);
    fs::File::options()
        .write(true)
        .open(other.join("dir"))
        .unwrap()
        .set_modified(later)
        .unwrap();
    let over = |mode: &str| {
        let o = env.run(&[
            "restore",
            &snap,
            "--image-fs",
            "/dir",
            "--target",
            other.to_str().unwrap(),
            "--overwrite",
            mode,
        ]);
        let err = String::from_utf8_lossy(&o.stderr).into_owned();
        assert!(o.status.success(), "{mode}: {err}");
        err
    };
    for mode in ["if-newer", "never"] {
        let err = over(mode);
        assert!(
            err.contains("nothing below it was restored"),
            "{mode}: {err}"
        );
        assert_eq!(fs::read(other.join("dir")).unwrap(), b"my newer notes");
    }
    over("if-changed");
    assert!(fs::read(other.join("dir/a.bin")).unwrap() == fs::read(d.join("a.bin")).unwrap());

    let err = env.fails(&["dump", &snap, "--image-fs", "/dir/dangling/"], 1);
    assert!(
        err.contains("the symlink /dir/dangling leads to /dir/missing"),
        "{err}"
    );

    let full = env.path("full");
    let _fs = Tmpfs::mount(&full, "size=1m");
    let o = restore(&full);
    let err = String::from_utf8_lossy(&o.stderr);
    assert_eq!(o.status.code(), Some(1), "{err}");
    assert!(
        err.contains("no space left on the target: the restore stopped at")
            && err.contains("dir/a.bin")
            && !err.contains("standard output"),
        "{err}"
    );
}

/// A changed-block list is of changes to the file the parent was read from: a
/// file put in its place since (here: an older image restored onto it, a new
/// inode) is read whole, with why (QA: the snapshot was the parent's image plus
/// the listed block, silently). Then nothing changed is nothing changed:
/// `--skip-if-unchanged` saves no snapshot (QA: the image's read moved its atime
/// and a snapshot was saved). And `--target -` is no standard output for an
/// image (QA: a file named `-` was written).
#[test]
fn a_changed_block_list_is_not_applied_to_a_file_put_in_the_sources_place() {
    let env = Env::new();
    env.init(&["--block-size", "16K"]);
    let src = env.path("disk.img");
    let mut data = make_image(&src, 4, 11);
    let first = image_snapshot(&env, &src);
    let old = data.clone();
    let cbt = env.path("changed.txt");
    fs::write(&cbt, change(&src, &mut data, &[(MIB, 5000)], 12)).unwrap();
    let (_, err) = backup_image_listed(&env, &src, &cbt);
    assert!(!err.contains("not used"), "{err}");
    // The first image restored onto the source: a new file there.
    restore_image(&env, &first, &src, &["--overwrite", "always"]);
    assert!(fs::read(&src).unwrap() == old);
    fs::write(&cbt, "0 16384\n").unwrap();
    let (third, err) = backup_image_listed(&env, &src, &cbt);
    assert!(
        err.contains("the changed-block list was not used and the whole source was read")
            && err.contains("is not the file the parent image snapshot was read from"),
        "{err}"
    );
    let s3 = third["snapshot_id"].as_str().unwrap().to_string();
    let out = env.path("out.img");
    restore_image(&env, &s3, &out, &[]);
    assert!(
        fs::read(&out).unwrap() == old,
        "the image differs from the source"
    );
    // Unchanged since: no snapshot, after a read of the whole image too.
    let o = env.ok(&[
        "backup",
        "--image",
        src.to_str().unwrap(),
        "--skip-if-unchanged",
    ]);
    assert!(o.contains("no snapshot saved"), "{o}");
    let e = env.fails(&["restore", &s3, "--image", "--target", "-"], 2);
    assert!(e.contains("not standard output"), "{e}");
    assert!(!Path::new("-").exists() && !env.path("-").exists());
}

/// A dump of an image that meets a damaged block gives every block before it
/// and says where it stopped (QA r37: "cut short after the first 0 bytes" for
/// damage at 294,912, the blocks of its read batch before it held back).
#[test]
fn a_dump_cut_short_by_a_damaged_block_gives_the_blocks_before_it() {
    let env = Env::new();
    // Stored as they are: the block to damage is found in its pack.
    env.init(&[
        "--block-size",
        "4K",
        "--no-encryption",
        "--compression",
        "none",
    ]);
    let src = env.path("disk.img");
    let data = Rng(23).bytes(2 * MIB, false);
    fs::write(&src, &data).unwrap();
    let snap = image_snapshot(&env, &src);
    // Block 75: not the first of a batch of 32 (the third batch).
    let at = 75 * 4096;
    let needle = &data[at..at + 4096];
    let mut damaged = false;
    for (pack, _) in packs(&env.repo) {
        let mut b = fs::read(&pack).unwrap();
        if let Some(i) = b.windows(needle.len()).position(|w| w == needle) {
            b[i + 100] ^= 0x10;
            fs::write(&pack, b).unwrap();
            damaged = true;
        }
    }
    assert!(damaged, "block 75 not found in a pack");
    let o = env.run(&["dump", &snap, "disk.img"]);
    let err = String::from_utf8_lossy(&o.stderr);
    assert_eq!(o.status.code(), Some(1), "{err}");
    assert_eq!(o.stdout.len(), at, "{err}");
    assert!(o.stdout == data[..at]);
    assert!(
        err.contains(&format!("cut short after the first {at} of its")),
        "{err}"
    );
    // A damaged chunk list (of the third MiB, in a snapshot of its own): the
    // two MiB before it all come out (QA r40: the chunks already named before
    // the list was met were held back).
    let big = env.path("big.img");
    let data = Rng(24).bytes(4 * MIB, false);
    fs::write(&big, &data).unwrap();
    let snap = image_snapshot(&env, &big);
    let cat = |what: &str, id: &str| -> serde_json::Value {
        serde_json::from_str(&env.ok(&["cat", what, id, "--json"])).unwrap()
    };
    let tree = cat("tree", &snap);
    let root = tree["nodes"][0]["chunk_list"]["root"]
        .as_str()
        .unwrap()
        .to_string();
    let listed = env.ok(&["cat", "chunklist", &root, "--json"]);
    let leaves: Vec<String> =
        serde_json::from_str::<serde_json::Value>(&listed).unwrap()["entries"]
            .as_array()
            .unwrap_or_else(|| panic!("{listed}"))
            .iter()
            .map(|e| e["id"].as_str().unwrap().to_string())
            .collect();
    assert_eq!(
        leaves.len(),
        4,
        "4 MiB at 4K blocks, 256 to a list: {listed}"
    );
    let mut flipped = false;
    for (pack, _) in packs(&env.repo) {
        let name = pack.file_name().unwrap().to_str().unwrap().to_string();
        // The pack damaged above cannot be read whole.
        let o = env.run(&["cat", "pack", &name, "--json"]);
        if !o.status.success() {
            continue;
        }
        let header: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
        for b in header["blobs"].as_array().unwrap() {
            if b["id"] == leaves[2].as_str() {
                let at = b["offset"].as_u64().unwrap() + b["length"].as_u64().unwrap() / 2;
                let mut bytes = fs::read(&pack).unwrap();
                bytes[at as usize] ^= 1;
                fs::write(&pack, bytes).unwrap();
                flipped = true;
            }
        }
    }
    assert!(flipped, "the list's pack not found");
    let o = env.run(&["dump", &snap, "big.img"]);
    let err = String::from_utf8_lossy(&o.stderr);
    assert_eq!(o.status.code(), Some(1), "{err}");
    assert_eq!(o.stdout.len(), 2 * MIB, "{err}");
    assert!(o.stdout == data[..2 * MIB]);
}

/// `dump --image-fs FILE` that meets a damaged block gives every block of the
/// file before it and says how much came out (QA r40: it stopped at the last
/// MiB before the damage, and did not say where).
#[test]
fn an_image_fs_dump_cut_short_gives_the_blocks_before_the_damage() {
    let env = Env::new();
    env.init(&[
        "--block-size",
        "4K",
        "--no-encryption",
        "--compression",
        "none",
    ]);
    let tree = env.path("tree");
    fs::create_dir_all(&tree).unwrap();
    // Each 4 KiB block says its number, so that it is found in its pack.
    let mut data = Vec::new();
    for i in 0..768 {
        let mark = format!("FBK{i:06}");
        data.extend(mark.as_bytes().iter().cycle().take(4096));
    }
    fs::write(tree.join("m.bin"), &data).unwrap();
    let snap = ext4_image_snapshot(&env, &tree, &["-b", "4096"]);
    let needle = b"FBK000300";
    let mut damaged = false;
    for (pack, _) in packs(&env.repo) {
        let mut b = fs::read(&pack).unwrap();
        if let Some(i) = b.windows(needle.len()).position(|w| w == needle) {
            b[i + 100] ^= 0xff;
            fs::write(&pack, b).unwrap();
            damaged = true;
        }
    }
    assert!(damaged, "block 300 not found in a pack");
    let o = env.run(&["dump", &snap, "--image-fs", "/m.bin"]);
    let err = String::from_utf8_lossy(&o.stderr);
    assert_eq!(o.status.code(), Some(1), "{err}");
    assert_eq!(o.stdout.len(), 300 * 4096, "{err}");
    assert!(o.stdout == data[..300 * 4096]);
    assert!(
        err.contains(&format!(
            "the output was cut short after the first {} of its {} bytes",
            300 * 4096,
            data.len()
        )),
        "{err}"
    );
}

/// A filesystem of 128-byte inodes (valid: old ext2/ext3, `mkfs -I 128`),
/// which the reader behind --image-fs cannot read, is said to be that and not
/// "corrupt", with the way that works (QA r18).
#[test]
fn image_fs_names_128_byte_inodes_instead_of_calling_them_corrupt() {
    let env = Env::new();
    env.init(&[]);
    let tree = env.path("tree");
    fs::create_dir_all(&tree).unwrap();
    fs::write(tree.join("f"), b"x").unwrap();
    let snap = ext4_image_snapshot(&env, &tree, &["-I", "128"]);
    let err = env.fails(&["ls", &snap, "--image-fs", "/"], 1);
    assert!(
        err.contains("the filesystem has 128-byte inodes") && !err.contains("corrupt"),
        "{err}"
    );
}

/// A file restore (no `--image`) of an image snapshot over an earlier restore of
/// the same image writes the new image: a block device's time does not move when
/// its disk is written, so the size and time `if-changed` trusts for files say
/// nothing here, and the bytes are compared (QA r37: Tuesday's restore left
/// Monday's disk in place, said "unchanged" and exited 0). One that already
/// holds the snapshot's bytes is still left as it is.
#[test]
fn an_image_restored_over_an_earlier_one_is_compared_by_its_bytes() {
    let env = Env::new();
    env.init(&[]);
    let src = env.path("disk.img");
    let mut data = make_image(&src, 3, 51);
    let monday = image_snapshot(&env, &src);
    let when = fs::metadata(&src).unwrap();
    change(&src, &mut data, &[(MIB + 4096, 8192)], 52);
    // As a device: same size, same time.
    set_times(&src, when.mtime(), when.mtime_nsec());
    let tuesday = image_snapshot(&env, &src);
    let out = env.path("out");
    let restore =
        |snap: &str| env.ok(&["restore", snap, "--json", "--target", out.to_str().unwrap()]);
    restore(&monday);
    let restored = out.join("disk.img");
    assert!(fs::read(&restored).unwrap() != data);
    let r: serde_json::Value = serde_json::from_str(&restore(&tuesday)).unwrap();
    assert!(
        fs::read(&restored).unwrap() == data,
        "Monday's image kept: {r}"
    );
    assert_eq!(r["kept"], 0, "{r}");
    let r: serde_json::Value = serde_json::from_str(&restore(&tuesday)).unwrap();
    assert_eq!(r["kept"], 1, "{r}");
    assert!(fs::read(&restored).unwrap() == data);
}
