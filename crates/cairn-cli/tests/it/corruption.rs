//! Corruption of any one object: a pack (data or trees), an index file or a snapshot,
//! flipped, truncated or deleted. `check` must detect it and name it; `repair index`
//! and then `repair snapshots` must recover everything recoverable, so that
//! `check --read-data` is clean again; and a snapshot that did not need the object
//! must still restore exactly.

use crate::util::*;
use std::fs;
use std::path::{Path, PathBuf};

#[derive(Clone, Copy, Debug, PartialEq)]
enum Damage {
    Flip,
    Truncate,
    Delete,
}

#[derive(Clone, Copy, Debug, PartialEq)]
enum Object {
    DataPack,
    TreePack,
    Index,
    Snapshot,
}

fn files(dir: &Path) -> Vec<PathBuf> {
    let mut out = Vec::new();
    if let Ok(rd) = fs::read_dir(dir) {
        for e in rd.flatten() {
            let p = e.path();
            if p.is_dir() {
                out.extend(files(&p));
            } else {
                out.push(p);
            }
        }
    }
    out.sort();
    out
}

fn damage(path: &Path, how: Damage) {
    match how {
        Damage::Flip => {
            let mut b = fs::read(path).unwrap();
            let i = b.len() / 2;
            b[i] ^= 0x40;
            fs::write(path, b).unwrap();
        }
        Damage::Truncate => {
            let b = fs::read(path).unwrap();
            fs::write(path, &b[..b.len() / 2]).unwrap();
        }
        Damage::Delete => fs::remove_file(path).unwrap(),
    }
}

struct Template {
    env: Env,
    a: PathBuf,
    b: PathBuf,
    copy_a: PathBuf,
    snap_a: String,
    snap_b: String,
    data_pack_a: PathBuf,
    tree_pack_a: PathBuf,
    index_a: PathBuf,
}

/// Two snapshots with nothing in common: A's objects can be damaged while B's stay.
fn template() -> Template {
    let env = Env::new();
    env.init(&[]);
    let (a, b) = (env.path("a"), env.path("b"));
    let mut rng = Rng(1234);
    for (root, n) in [(&a, 6), (&b, 4)] {
        fs::create_dir_all(root.join("sub")).unwrap();
        for i in 0..n {
            fs::write(root.join(format!("f{i}")), rng.bytes(300_000, false)).unwrap();
            fs::write(root.join(format!("sub/t{i}")), rng.bytes(2_000, true)).unwrap();
        }
    }
    let snap_a = env.backup(&[&a]);
    let mut packs = files(&env.repo.join("data"));
    packs.sort_by_key(|p| fs::metadata(p).unwrap().len());
    assert_eq!(packs.len(), 2, "one data and one tree pack");
    let (tree_pack_a, data_pack_a) = (packs[0].clone(), packs[1].clone());
    // The index file listing A's packs (the other one only records the snapshot).
    let index_a = files(&env.repo.join("index"))
        .into_iter()
        .max_by_key(|p| fs::metadata(p).unwrap().len())
        .unwrap();
    let snap_b = env.backup(&[&b]);
    let copy_a = env.path("copy-a");
    copy_tree(&a, &copy_a);
    Template {
        env,
        a,
        b,
        copy_a,
        snap_a,
        snap_b,
        data_pack_a,
        tree_pack_a,
        index_a,
    }
}

#[test]
fn every_damaged_object_is_found_named_and_repaired() {
    let t = template();
    let copy_b = t.env.path("copy-b");
    copy_tree(&t.b, &copy_b);
    let objects = [
        Object::DataPack,
        Object::TreePack,
        Object::Index,
        Object::Snapshot,
    ];
    for obj in objects {
        for how in [Damage::Flip, Damage::Truncate, Damage::Delete] {
            let label = format!("{obj:?} {how:?}");
            let env = Env::new();
            copy_tree(&t.env.repo, &env.repo);
            let target = match obj {
                Object::DataPack => &t.data_pack_a,
                Object::TreePack => &t.tree_pack_a,
                Object::Index => &t.index_a,
                Object::Snapshot => &t.env.repo.join("snapshots").join(&t.snap_a),
            };
            let rel = target.strip_prefix(&t.env.repo).unwrap();
            let name = target.file_name().unwrap().to_str().unwrap().to_string();
            damage(&env.repo.join(rel), how);

            // Detection: every case is reported, naming the object.
            let o = env.run(&["check", "--read-data"]);
            let out = format!(
                "{}{}",
                String::from_utf8_lossy(&o.stdout),
                String::from_utf8_lossy(&o.stderr)
            );
            assert!(!out.contains("panicked"), "{label}: {out}");
            assert_eq!(o.status.code(), Some(1), "{label}: not detected:\n{out}");
            let named = match (obj, how) {
                // A deleted index file cannot be named; what it held is reported
                // as missing from the index, with the files that need it.
                (Object::Index, Damage::Delete) => out.contains("missing from the index"),
                _ => out.contains(&name),
            };
            assert!(named, "{label}: report does not name {name}:\n{out}");

            // Repair, then everything must check clean.
            env.ok(&["repair", "index"]);
            if (obj, how) == (Object::DataPack, Damage::Delete) {
                // With the index rebuilt, what is left to do is repair snapshots
                // (QA: check still said to repair the index first).
                let err = env.fails(&["check"], 1);
                assert!(
                    err.contains("`cairn repair snapshots` takes the files named out")
                        && err.contains("NAME.damaged")
                        && !err.contains("`cairn repair index`, then"),
                    "{label}: {err}"
                );
            }
            let rep = env.ok(&["repair", "snapshots"]);
            let out = env.ok(&["check", "--read-data"]);
            assert!(
                out.contains("no errors were found"),
                "{label}: still damaged after repair:\n{rep}\n{out}"
            );

            // B was never affected.
            let r = env.restore(&t.snap_b, &t.b, "rb");
            assert_same(&copy_b, &r);
            // A: an index file is rebuilt from the packs, so nothing is lost.
            if obj == Object::Index {
                let r = env.restore(&t.snap_a, &t.a, "ra");
                assert_same(&t.copy_a, &r);
            } else if obj != Object::Snapshot {
                // A's repaired snapshot keeps whatever is left and says what went.
                // A line for what went: a path dropped, or a directory kept
                // empty when its listing went.
                assert!(
                    rep.lines().any(|l| {
                        let l = l.trim_start();
                        l.starts_with("dropped /")
                            || (l.starts_with("kept /") && l.ends_with("kept empty)"))
                    }),
                    "{label}: {rep}"
                );
                let snaps: serde_json::Value =
                    serde_json::from_str(&env.ok(&["snapshots", "--json"])).unwrap();
                // The snapshots it replaced are not reported as vanished.
                assert!(!rep.contains("without forget"), "{label}: {rep}");
                for s in snaps.as_array().unwrap() {
                    let id = s["id"].as_str().unwrap();
                    let dir = env.path(&format!("all-{}", &id[..8]));
                    env.ok(&["restore", id, "--target", dir.to_str().unwrap()]);
                    // Its recorded size is what it now holds (what `stats` adds up).
                    let held: u64 = walk(&dir)
                        .values()
                        .filter(|m| m.is_file())
                        .map(|m| m.len())
                        .sum();
                    assert_eq!(s["summary"]["total_bytes"], held, "{label}: {id}");
                }
            }
        }
    }
}

/// `repair snapshots` killed between storing a repaired snapshot and forgetting
/// the damaged one: run again, it forgets the damaged one and does not store a
/// second, identical repaired snapshot.
#[test]
fn a_repair_killed_half_way_leaves_one_repaired_snapshot() {
    use std::os::unix::process::ExitStatusExt;
    let env = Env::new();
    env.init(&[]);
    let src = env.path("src");
    fs::create_dir_all(&src).unwrap();
    let mut rng = Rng(31);
    for i in 0..4 {
        fs::write(src.join(format!("f{i}")), rng.bytes(5 << 20, false)).unwrap();
    }
    env.backup(&[&src]);
    // The largest pack holds file data: lost.
    let mut packs = files(&env.repo.join("data"));
    packs.sort_by_key(|p| fs::metadata(p).unwrap().len());
    fs::remove_file(packs.last().unwrap()).unwrap();
    env.ok(&["repair", "index"]);
    let out = env
        .cmd(&["repair", "snapshots"])
        .env(cairn_core::hooks::KILL_AT_VAR, "snapshot:recorded:1")
        .output()
        .unwrap();
    assert_eq!(
        out.status.signal(),
        Some(libc::SIGKILL),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let count = || {
        serde_json::from_str::<serde_json::Value>(&env.ok(&["snapshots", "--json"]))
            .unwrap()
            .as_array()
            .unwrap()
            .len()
    };
    assert_eq!(count(), 2, "the damaged snapshot and its replacement");
    env.ok(&["repair", "snapshots"]);
    assert_eq!(count(), 1);
    env.check_clean();
}

/// A file lost among intact ones: the repaired directories keep every other
/// entry, in order, with its content (the repair counts intact entries without
/// copying them and takes them from the stored tree at the first change).
#[test]
fn a_lost_file_among_intact_ones_leaves_the_rest_of_its_directories() {
    let env = Env::new();
    env.init(&[]);
    let src = env.path("src");
    let mut rng = Rng(33);
    for d in ["a", "m", "m/deep", "z"] {
        fs::create_dir_all(src.join(d)).unwrap();
    }
    for name in ["a/1", "m/0", "m/deep/x", "m/y", "z/2", "top"] {
        fs::write(src.join(name), rng.bytes(3_000, true)).unwrap();
    }
    env.backup(&[&src]);
    // The second backup's only new data: one file in the middle of `m/deep`,
    // beside entries before and after it (`w` holds bytes stored already).
    fs::write(src.join("m/deep/lost"), rng.bytes(400_000, false)).unwrap();
    fs::copy(src.join("m/y"), src.join("m/deep/w")).unwrap();
    let before = files(&env.repo.join("data"));
    env.backup(&[&src]);
    let mut new: Vec<PathBuf> = files(&env.repo.join("data"))
        .into_iter()
        .filter(|p| !before.contains(p))
        .collect();
    assert_eq!(new.len(), 2, "a data and a tree pack");
    new.sort_by_key(|p| fs::metadata(p).unwrap().len());
    fs::remove_file(new.last().unwrap()).unwrap();
    env.ok(&["repair", "index"]);
    // For scripts: each loss a path and a reason, not one sentence to split.
    let v: serde_json::Value =
        serde_json::from_str(&env.ok(&["repair", "snapshots", "--dry-run", "--json"])).unwrap();
    let dropped = &v["repaired"][0]["dropped"];
    assert_eq!(dropped.as_array().map(Vec::len), Some(1), "{v:#}");
    assert!(
        dropped[0]["path"]
            .as_str()
            .unwrap()
            .ends_with("/m/deep/lost"),
        "{v:#}"
    );
    assert_eq!(
        dropped[0]["why"], "file data lost: none of it can be read",
        "{v:#}"
    );
    let rep = env.ok(&["repair", "snapshots"]);
    assert!(
        rep.contains("m/deep/lost (file data lost: none of it can be read)"),
        "{rep}"
    );
    env.check_clean();
    let latest = env.snapshot_ids().pop().unwrap();
    let out = env.restore(&latest, &src, "r");
    // The source as the repaired snapshot holds it: without the lost file, its
    // directory's time as backed up.
    let deep = fs::File::open(src.join("m/deep")).unwrap();
    let mtime = deep.metadata().unwrap().modified().unwrap();
    fs::remove_file(src.join("m/deep/lost")).unwrap();
    deep.set_modified(mtime).unwrap();
    assert_same(&src, &out);
}

/// A pack put back in the wrong folder is named as such, with where it belongs,
/// and check advises moving it before any repair (QA: "remove it", and the
/// advised repairs dropped the file whose data it held).
#[test]
fn a_pack_in_the_wrong_folder_is_said_to_belong_elsewhere() {
    let env = Env::new();
    env.init(&[]);
    let src = env.path("src");
    fs::create_dir_all(&src).unwrap();
    fs::write(src.join("f"), Rng(44).bytes(600_000, false)).unwrap();
    env.backup(&[&src]);
    let pack = largest_pack(&env.repo);
    let name = pack.file_name().unwrap().to_str().unwrap().to_string();
    fs::create_dir_all(env.repo.join("data/zz")).unwrap();
    let wrong = env.repo.join("data/zz").join(&name);
    fs::rename(&pack, &wrong).unwrap();
    let o = env.run(&["check"]);
    let (out, err) = (
        String::from_utf8_lossy(&o.stdout),
        String::from_utf8_lossy(&o.stderr),
    );
    assert_eq!(o.status.code(), Some(1), "{err}");
    assert!(
        out.contains(&format!(
            "data/zz/{name} is a pack in the wrong place: move it to data/{}/{name}",
            &name[..2]
        )),
        "{out}"
    );
    assert!(
        err.contains("1 pack missing from storage is there in the wrong place")
            && !err.contains("repair snapshots"),
        "{err}"
    );
    fs::rename(&wrong, &pack).unwrap();
    env.check_clean();
}

/// A pack stored under another pack's name (moved over it): `check
/// --read-data` names the pack the file holds and where it belongs, once, not
/// every blob as damaged, and advises moving it before any repair (QA r11).
#[test]
fn a_pack_under_another_packs_name_is_named_for_what_it_holds() {
    let env = Env::new();
    env.init(&["--compression", "none"]);
    let src = env.path("src");
    fs::create_dir_all(&src).unwrap();
    fs::write(src.join("a"), Rng(45).bytes(600_000, false)).unwrap();
    env.ok(&["backup", "-q", "--pack-size", "1M", src.to_str().unwrap()]);
    fs::write(src.join("b"), Rng(46).bytes(600_000, false)).unwrap();
    env.ok(&["backup", "-q", "--pack-size", "1M", src.to_str().unwrap()]);
    let mut packs = files(&env.repo.join("data"));
    packs.sort_by_key(|p| std::cmp::Reverse(fs::metadata(p).unwrap().len()));
    let (first, second) = (packs[0].clone(), packs[1].clone());
    let held = first.file_name().unwrap().to_str().unwrap().to_string();
    fs::rename(&first, &second).unwrap();
    let o = env.run(&["check", "--read-data"]);
    let (out, err) = (
        String::from_utf8_lossy(&o.stdout),
        String::from_utf8_lossy(&o.stderr),
    );
    assert_eq!(o.status.code(), Some(1), "{err}");
    let all = format!("{out}{err}");
    assert!(
        all.contains(&format!("the file holds another pack, whole: {held}"))
            && all.contains(&format!("belongs at data/{}/{held}", &held[..2])),
        "{all}"
    );
    assert!(!all.contains("blob failed authentication"), "{all}");
    assert!(
        err.contains("1 pack missing from storage is there in the wrong place")
            && err.contains("move it where it belongs"),
        "{err}"
    );
}

/// A restore's dry run finds a large file's chunks missing from the index
/// behind its chunk list, which the index still holds (QA: it promised the file
/// and the restore failed on it).
#[test]
fn a_dry_run_finds_chunks_missing_behind_a_chunk_list() {
    let env = Env::new();
    env.init(&[]);
    let src = env.path("src");
    fs::create_dir_all(&src).unwrap();
    fs::write(src.join("big"), Rng(43).bytes(3_000_000, false)).unwrap();
    env.ok(&["backup", "-q", "--pack-size", "128K", src.to_str().unwrap()]);
    // Only the index files that list trees are left (they list chunk lists too).
    let mut kept = 0;
    for f in files(&env.repo.join("index")) {
        let id = f.file_name().unwrap().to_str().unwrap().to_string();
        let listed: serde_json::Value =
            serde_json::from_str(&env.ok(&["cat", "index", &id])).unwrap();
        let trees = listed["packs"].as_array().unwrap().iter().any(|p| {
            p["blobs"]
                .as_array()
                .unwrap()
                .iter()
                .any(|b| b["type"] == "tree")
        });
        if trees {
            kept += 1;
        } else {
            fs::remove_file(&f).unwrap();
        }
    }
    assert!(kept > 0);
    let t = env.path("t");
    let err = env.fails(
        &[
            "restore",
            "latest",
            "--target",
            t.to_str().unwrap(),
            "--dry-run",
        ],
        1,
    );
    assert!(
        err.contains("big: content would not be restored in full")
            && err.contains("missing from the index"),
        "{err}"
    );
    // With no index at all, the one error says where to look too (QA: no advice).
    for f in files(&env.repo.join("index")) {
        fs::remove_file(f).unwrap();
    }
    let err = env.fails(&["restore", "latest", "--target", t.to_str().unwrap()], 1);
    assert!(
        err.contains("missing from the index")
            && err.contains("`cairn repair index` when index files were lost"),
        "{err}"
    );
}

/// A file that lost part of its data leaves the snapshots, and what can still be
/// read of it stays beside it as NAME.damaged, zeros in place of what was lost,
/// through the advised repairs and a prune (QA: dropped whole, a restore gave
/// back 98% of it before the repair and nothing after it).
#[test]
fn repair_snapshots_keeps_what_can_be_read_of_a_damaged_file() {
    let env = Env::new();
    env.init(&[]);
    let src = env.path("src");
    fs::create_dir_all(&src).unwrap();
    fs::write(src.join("big.bin.damaged"), b"a name in the way").unwrap();
    fs::write(src.join("small"), b"intact").unwrap();
    env.backup(&[&src]);
    let before = files(&env.repo.join("data"));
    // Only the large file's data in the packs that are new, one of which goes.
    let data = Rng(41).bytes(4 << 20, false);
    fs::write(src.join("big.bin"), &data).unwrap();
    env.ok(&["backup", "-q", "--pack-size", "128K", src.to_str().unwrap()]);
    let new: Vec<PathBuf> = files(&env.repo.join("data"))
        .into_iter()
        .filter(|p| !before.contains(p))
        .collect();
    assert!(new.len() > 10, "{new:?}");
    let largest = new
        .iter()
        .max_by_key(|p| fs::metadata(p).unwrap().len())
        .unwrap();
    fs::remove_file(largest).unwrap();
    env.ok(&["repair", "index"]);
    let err = env.fails(&["check"], 1);
    assert!(err.contains("NAME.damaged"), "{err}");
    let rep = env.ok(&["repair", "snapshots"]);
    assert!(
        rep.contains("big.bin (file data lost: ")
            && rep.contains("kept as big.bin.damaged-2, with zeros in place of the rest"),
        "{rep}"
    );
    env.check_clean();
    env.ok(&["prune"]);
    env.check_clean();
    let out = env.restore("latest", &src, "r");
    assert!(!out.join("big.bin").exists());
    assert_eq!(fs::read(out.join("small")).unwrap(), b"intact");
    assert_eq!(
        fs::read(out.join("big.bin.damaged")).unwrap(),
        b"a name in the way"
    );
    let got = fs::read(out.join("big.bin.damaged-2")).unwrap();
    assert_eq!(got.len(), data.len());
    let lost = got.iter().zip(&data).filter(|(g, d)| g != d).count();
    assert!(
        got.iter().zip(&data).all(|(g, d)| g == d || *g == 0),
        "only zeros where it differs"
    );
    assert!(lost > 0 && lost < data.len() / 4, "{lost} bytes differ");
}

/// A repository with one snapshot of four 2 MiB files (`src`), whose largest
/// pack was then deleted by hand.
fn backup_then_lose_the_largest_pack(seed: u64) -> (Env, std::path::PathBuf) {
    let env = Env::new();
    env.init(&[]);
    let src = env.path("src");
    fs::create_dir_all(&src).unwrap();
    let mut rng = Rng(seed);
    for i in 0..4 {
        fs::write(src.join(format!("f{i}")), rng.bytes(2 << 20, false)).unwrap();
    }
    env.backup(&[&src]);
    let mut packs = files(&env.repo.join("data"));
    packs.sort_by_key(|p| fs::metadata(p).unwrap().len());
    fs::remove_file(packs.last().unwrap()).unwrap();
    (env, src)
}

/// A restore that meets a lost pack says which files were not restored in
/// full, marks them as the repository's loss (`lost_data` in `--json`, not a
/// string a script must match) and says where to look next.
#[test]
fn a_restore_marks_what_a_lost_pack_held_as_lost_data() {
    let (env, _) = backup_then_lose_the_largest_pack(34);
    let out = env.path("out");
    let o = env.run(&[
        "restore",
        "latest",
        "--target",
        out.to_str().unwrap(),
        "--json",
    ]);
    let err = String::from_utf8_lossy(&o.stderr);
    assert_eq!(o.status.code(), Some(1), "{err}");
    assert!(
        err.contains("`cairn check --read-data` says what the repository lacks"),
        "{err}"
    );
    let v: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
    let errors = v["errors"].as_array().unwrap();
    assert!(!errors.is_empty(), "{v}");
    assert!(errors.iter().all(|e| e["lost_data"] == true), "{v}");
}

/// `repair index` names a pack the index lists that the storage lost, with the
/// blobs it takes out of the index (they were dropped without a word), in the
/// dry run, the repair and `--json`; run again, it has nothing to say.
#[test]
fn repair_index_names_a_lost_pack_and_what_it_held() {
    let (env, _) = backup_then_lose_the_largest_pack(35);
    let dry = env.ok(&["repair", "index", "--dry-run"]);
    assert!(
        dry.contains("the index lists it but the storage does not hold it (")
            && dry.contains("blobs would be lost)"),
        "{dry}"
    );
    let v: serde_json::Value =
        serde_json::from_str(&env.ok(&["repair", "index", "--json"])).unwrap();
    let missing = v["missing_packs"].as_array().unwrap();
    assert_eq!(missing.len(), 1, "{v}");
    assert!(missing[0]["blobs_lost"].as_u64().unwrap() > 0, "{v}");
    let again = env.ok(&["repair", "index"]);
    assert!(!again.contains("missing pack"), "{again}");
}

/// With every index file gone, `stats` and `prune` point to `repair index`,
/// which gives the snapshots back whole, not to `forget` (QA: following that
/// advice threw away an intact snapshot).
#[test]
fn a_lost_index_points_to_repair_index_not_forget() {
    let env = Env::new();
    env.init(&[]);
    let src = env.path("src");
    fs::create_dir_all(&src).unwrap();
    fs::write(src.join("f"), Rng(36).bytes(300_000, false)).unwrap();
    env.backup(&[&src]);
    for f in files(&env.repo.join("index")) {
        fs::remove_file(f).unwrap();
    }
    for cmd in [&["stats"][..], &["prune", "--dry-run"]] {
        let e = env.fails(cmd, 1);
        assert!(
            e.contains("`cairn repair index` indexes the packs again"),
            "{e}"
        );
        assert!(!e.contains("forget"), "{e}");
    }
    env.ok(&["repair", "index"]);
    env.check_clean();
}

/// A snapshot whose root tree is damaged, or whose object was deleted: `check`
/// says to run `recover` before the repair, which drops the snapshot whole, and
/// the repair says so too; `recover` then gives the directories below back (QA:
/// the advice led to a prune that deleted them).
#[test]
fn a_lost_root_tree_or_snapshot_object_points_to_recover() {
    let env = Env::new();
    env.init(&[]);
    let src = env.path("src");
    fs::create_dir_all(src.join("sub")).unwrap();
    fs::write(src.join("sub/f"), b"below the root\n").unwrap();
    env.backup(&[&src]);
    let snaps: serde_json::Value = serde_json::from_str(&env.ok(&["snapshots", "--json"])).unwrap();
    let tree = snaps[0]["tree"].as_str().unwrap().to_string();
    let blobs: serde_json::Value =
        serde_json::from_str(&env.ok(&["list", "blobs", "--json"])).unwrap();
    let b = (blobs.as_array().unwrap().iter())
        .find(|b| b["id"] == tree.as_str())
        .unwrap();
    let pack = b["pack"].as_str().unwrap();
    let at = b["offset"].as_u64().unwrap() + b["length"].as_u64().unwrap() / 2;
    let path = env.repo.join("data").join(&pack[..2]).join(pack);
    let mut bytes = fs::read(&path).unwrap();
    bytes[at as usize] ^= 4;
    fs::write(&path, bytes).unwrap();
    let e = env.fails(&["check"], 1);
    assert!(e.contains("run `cairn recover` first"), "{e}");
    env.ok(&["repair", "index"]);
    let out = env.ok(&["repair", "snapshots"]);
    assert!(out.contains("`cairn recover` finds them"), "{out}");
    assert!(out.contains("`cairn recover` saves them"), "{out}");
    env.ok(&["recover"]);
    let found = env.ok(&["find", "f"]);
    assert!(found.contains("sub/f"), "{found}");

    // A snapshot's object deleted by hand.
    let env = Env::new();
    env.init(&[]);
    let snap = env.backup(&[&src]);
    fs::remove_file(env.repo.join("snapshots").join(&snap)).unwrap();
    let o = env.run(&["check"]);
    assert_eq!(o.status.code(), Some(1), "{o:?}");
    let e = format!(
        "{}{}",
        String::from_utf8_lossy(&o.stdout),
        String::from_utf8_lossy(&o.stderr)
    );
    assert!(
        e.contains("`cairn recover` saves its directory trees"),
        "{e}"
    );
    let out = env.ok(&["repair", "snapshots"]);
    assert!(out.contains("`cairn recover` saves them"), "{out}");
}

/// `repair snapshots` run without `repair index` first leaves the index naming
/// the lost pack: `check` then says what to run, not only that there is a problem
/// (QA), and that fixes it.
#[test]
fn check_says_to_rebuild_the_index_when_only_it_names_a_lost_pack() {
    let (env, _) = backup_then_lose_the_largest_pack(32);
    env.ok(&["repair", "snapshots"]);
    let o = env.run(&["check"]);
    assert_eq!(o.status.code(), Some(1), "{o:?}");
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(
        err.contains("`cairn repair index` rebuilds the index from the packs that are there"),
        "{err}"
    );
    env.ok(&["repair", "index"]);
    env.check_clean();
}

/// A backup over a repository that lost a pack (deleted by hand) stores that
/// pack's data again from its source, says why, and its snapshot restores whole
/// (QA: it said "saved", exit 0, and the snapshot could not be restored). The
/// unchanged files whose content needed the pack are read again, not reused.
#[test]
fn a_backup_stores_again_what_a_lost_pack_held() {
    let (env, src) = backup_then_lose_the_largest_pack(33);
    let o = env.run(&["backup", src.to_str().unwrap()]);
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(o.status.success(), "{err}");
    assert!(
        err.contains("the index names 1 pack that the repository's storage does not hold")
            && err.contains("cairn repair index"),
        "{err}"
    );
    let out = env.path("out");
    env.ok(&["restore", "latest", "--target", out.to_str().unwrap()]);
    for i in 0..4 {
        let name = format!("f{i}");
        assert!(
            fs::read(out.join(src.strip_prefix("/").unwrap()).join(&name)).unwrap()
                == fs::read(src.join(&name)).unwrap(),
            "{name} differs"
        );
    }
    // The first snapshot stays damaged until it is repaired; after that the
    // repository is whole again.
    env.ok(&["repair", "index"]);
    env.ok(&["repair", "snapshots"]);
    env.check_clean();
}

/// A lost pack of trees: the parent snapshot's directories cannot be read, and
/// the backup says so (QA r31: every file read again without a word why), then
/// stores a whole snapshot.
#[test]
fn a_backup_says_when_the_parents_listings_cannot_be_read() {
    let env = Env::new();
    env.init(&[]);
    let src = env.path("src");
    fs::create_dir_all(src.join("sub")).unwrap();
    let mut rng = Rng(36);
    for i in 0..3 {
        fs::write(src.join(format!("f{i}")), rng.bytes(1 << 20, false)).unwrap();
        fs::write(
            src.join("sub").join(format!("g{i}")),
            rng.bytes(4000, false),
        )
        .unwrap();
    }
    env.backup(&[&src]);
    let mut packs = files(&env.repo.join("data"));
    packs.sort_by_key(|p| fs::metadata(p).unwrap().len());
    fs::remove_file(&packs[0]).unwrap();
    // Without the cache, which holds the trees read before.
    let o = env.run(&["--no-cache", "backup", src.to_str().unwrap()]);
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(o.status.success(), "{err}");
    assert!(
        err.contains("the parent snapshot's listing of this directory cannot be read")
            && err.contains("its files are read again"),
        "{err}"
    );
    let out = env.path("out");
    env.ok(&["restore", "latest", "--target", out.to_str().unwrap()]);
    assert_same(&src, &out.join(src.strip_prefix("/").unwrap()));
}

/// The same for a pack cut short (a storage crash, a copy that stopped): its
/// indexed blobs reach past its end, so it counts as missing, and the backup
/// stores its data again rather than reusing it (QA r28: "saved", exit 0, and
/// the new snapshot could not be restored).
#[test]
fn a_backup_stores_again_what_a_pack_cut_short_held() {
    let env = Env::new();
    env.init(&[]);
    let src = env.path("src");
    fs::create_dir_all(&src).unwrap();
    let mut rng = Rng(35);
    for i in 0..4 {
        fs::write(src.join(format!("f{i}")), rng.bytes(2 << 20, false)).unwrap();
    }
    env.backup(&[&src]);
    let mut packs = files(&env.repo.join("data"));
    packs.sort_by_key(|p| fs::metadata(p).unwrap().len());
    let big = packs.last().unwrap();
    let len = fs::metadata(big).unwrap().len();
    fs::OpenOptions::new()
        .write(true)
        .open(big)
        .unwrap()
        .set_len(len / 2)
        .unwrap();
    let o = env.run(&["backup", src.to_str().unwrap()]);
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(o.status.success(), "{err}");
    assert!(
        err.contains("the index names 1 pack that the repository's storage does not hold whole"),
        "{err}"
    );
    let out = env.path("out");
    env.ok(&["restore", "latest", "--target", out.to_str().unwrap()]);
    for i in 0..4 {
        let name = format!("f{i}");
        assert!(
            fs::read(out.join(src.strip_prefix("/").unwrap()).join(&name)).unwrap()
                == fs::read(src.join(&name)).unwrap(),
            "{name} differs"
        );
    }
}

/// A pack or pending-deletion record larger than any cairn writes (a hostile
/// store, or a file that grew) is refused by its size before it is read into
/// memory: `check` names it, and `repair index` records the pack as damaged
/// instead of reading a gigabyte of it. The files are sparse, so the test is cheap;
/// without the bound each would be read whole.
#[test]
fn oversized_objects_are_refused_unread() {
    let env = Env::new();
    env.init(&[]);
    let src = env.path("src");
    fs::create_dir_all(&src).unwrap();
    fs::write(src.join("a"), b"some content").unwrap();
    let snap = env.backup(&[&src]);
    let giant = |rel: String, size: u64| {
        let p = env.repo.join(rel);
        fs::create_dir_all(p.parent().unwrap()).unwrap();
        fs::File::create(&p).unwrap().set_len(size).unwrap();
    };
    let pack = "ab".repeat(32);
    giant(format!("data/{}/{pack}", &pack[..2]), (1 << 30) + 1);
    let record = "cd".repeat(32);
    giant(format!("pending/{record}"), (4 << 30) + 1);

    let o = env.run(&["check"]);
    let out = format!(
        "{}{}",
        String::from_utf8_lossy(&o.stdout),
        String::from_utf8_lossy(&o.stderr)
    );
    assert_eq!(o.status.code(), Some(1), "{out}");
    assert!(out.contains(&record[..8]), "record not named:\n{out}");
    assert!(!out.contains("panicked"), "{out}");

    // A dry run reads and reports the same, and changes nothing.
    let listed = |d: &str| {
        let mut v = files(&env.repo.join(d));
        v.sort();
        v
    };
    let (index_before, pending_before) = (listed("index"), listed("pending"));
    let dry = env.ok(&["repair", "index", "--dry-run", "--json"]);
    let v: serde_json::Value = serde_json::from_str(&dry).unwrap();
    assert_eq!(v["dry_run"], true, "{v}");
    assert_eq!(v["pending_records_dropped"], 1, "{v}");
    assert!(
        dry.contains(&pack) && dry.contains("larger than any pack"),
        "{dry}"
    );
    assert_eq!(listed("index"), index_before);
    assert_eq!(listed("pending"), pending_before);
    let rep = env.ok(&["repair", "index", "--json"]);
    assert!(
        rep.contains(&pack) && rep.contains("larger than any pack"),
        "{rep}"
    );
    assert!(
        rep.contains("\"dry_run\":false") || rep.contains("\"dry_run\": false"),
        "{rep}"
    );
    // The snapshot never needed either: it restores as it was.
    let r = env.restore(&snap, &src, "r");
    assert_eq!(fs::read(r.join("a")).unwrap(), b"some content");
}

/// One lost index file makes a problem of every blob only it listed: check shows
/// the first twenty, then counts the rest (the line saying what to do is not
/// buried under a thousand); `--json` lists every one.
#[test]
fn check_counts_past_twenty_blob_problems() {
    let env = Env::new();
    env.init(&[]);
    let src = env.path("src");
    fs::create_dir_all(&src).unwrap();
    let mut rng = Rng(77);
    for i in 0..60 {
        fs::write(src.join(format!("f{i:02}")), rng.bytes(3_000, false)).unwrap();
    }
    env.backup(&[&src]);
    // A second snapshot of the same files: each file counts once, not per snapshot.
    env.backup(&[&src]);
    let index = files(&env.repo.join("index"))
        .into_iter()
        .max_by_key(|p| fs::metadata(p).unwrap().len())
        .unwrap();
    fs::remove_file(&index).unwrap();
    let o = env.run(&["check"]);
    assert_eq!(o.status.code(), Some(1));
    let out = String::from_utf8_lossy(&o.stdout);
    let shown = out.lines().filter(|l| l.starts_with("error: blob")).count();
    assert_eq!(shown, 20, "{out}");
    assert!(
        out.contains(
            "40 blobs more missing or in damaged packs, needed by 40 files in 2 snapshots"
        ),
        "{out}"
    );
    let o = env.run(&["check", "--json"]);
    let v: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
    assert!(v["problems"].as_array().unwrap().len() >= 60, "{v}");
}

/// A pack with bytes appended, or its end cut off, is found by `check` without
/// reading data (its size is not what its index entries and header make); a pack
/// cut in half costs, under `--read-data`, the blobs that were cut, not all of its
/// blobs.
#[test]
fn check_finds_a_pack_of_the_wrong_size_and_counts_only_the_blobs_cut_off() {
    let t = template();
    let env = &t.env;
    let pack = &t.data_pack_a;
    let name = pack.file_name().unwrap().to_str().unwrap().to_string();
    let original = fs::read(pack).unwrap();
    let mut appended = original.clone();
    appended.extend_from_slice(&[7u8; 1000]);
    for (label, bytes) in [
        ("appended", &appended[..]),
        ("end cut", &original[..original.len() - 100]),
    ] {
        fs::write(pack, bytes).unwrap();
        let o = env.run(&["check"]);
        let err = format!(
            "{}{}",
            String::from_utf8_lossy(&o.stdout),
            String::from_utf8_lossy(&o.stderr)
        );
        assert_eq!(o.status.code(), Some(1), "{label}: {err}");
        assert!(
            err.contains(&name) && err.contains("its index entries and header make"),
            "{label}: {err}"
        );
        // With a next step, read or not (QA: none).
        for read in [false, true] {
            let args: &[&str] = if read {
                &["check", "--read-data"]
            } else {
                &["check"]
            };
            let e = env.fails(args, 1);
            assert!(
                e.contains("`cairn repair index` rewrites the damaged packs"),
                "{label} {read}: {e}"
            );
            // Unread, it does not say whether snapshots need the packs (QA r33).
            assert_eq!(
                e.contains("not known: `cairn check --read-data` says"),
                !read,
                "{label} {read}: {e}"
            );
        }
    }
    fs::write(pack, &original).unwrap();
    assert!(env.ok(&["check"]).contains("no errors were found"));

    fs::write(pack, &original[..original.len() / 2]).unwrap();
    let o = env.run(&["check", "--read-data", "--json"]);
    assert_eq!(o.status.code(), Some(1));
    let v: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
    let problems = v["problems"].as_array().unwrap();
    let count = |kind: &str| problems.iter().filter(|p| p["kind"] == kind).count();
    let summary = problems
        .iter()
        .filter_map(|p| p["error"].as_str())
        .find(|e| e.contains("blobs are unreadable"))
        .unwrap_or_else(|| panic!("{v}"));
    let (lost, of) = summary
        .split_once("; ")
        .and_then(|(_, s)| s.split_once(" of "))
        .map(|(a, b)| (a.parse::<usize>().unwrap(), b.split(' ').next().unwrap()))
        .unwrap();
    let of: usize = of.parse().unwrap();
    assert!(lost > 0 && lost < of, "{summary}");
    assert_eq!(count("blob_in_damaged_pack"), lost, "{v}");
    // B, in other packs, restores.
    let r = env.restore(&t.snap_b, &t.b, "rb");
    assert_same(&t.b, &r);
}

/// A blob stored twice (a backup that ran while the index file listing it was
/// away), one copy in a damaged pack: check names the pack, but no file is
/// affected — readers take the other copy — and the restore is exact.
#[test]
fn check_names_no_file_when_a_damaged_blob_has_an_intact_copy() {
    let env = Env::new();
    env.init(&[]);
    let src = env.path("src");
    fs::create_dir_all(&src).unwrap();
    fs::write(src.join("big.bin"), Rng(31).bytes(3 << 20, false)).unwrap();
    env.backup(&[&src]);
    let first: Vec<PathBuf> = packs(&env.repo).into_keys().collect();
    let aside = env.path("index-aside");
    fs::rename(env.repo.join("index"), &aside).unwrap();
    fs::create_dir_all(env.repo.join("index")).unwrap();
    env.backup(&[&src]);
    for e in fs::read_dir(&aside).unwrap() {
        let e = e.unwrap();
        fs::rename(e.path(), env.repo.join("index").join(e.file_name())).unwrap();
    }
    // The data pack of the first backup (the largest of its packs).
    let damaged = first
        .iter()
        .max_by_key(|p| fs::metadata(p).unwrap().len())
        .unwrap();
    flip_middle(damaged);
    let o = env.run(&["check", "--read-data"]);
    let out = String::from_utf8_lossy(&o.stdout).into_owned() + &String::from_utf8_lossy(&o.stderr);
    assert_eq!(o.status.code(), Some(1), "{out}");
    assert!(out.contains("pack "), "{out}");
    assert!(!out.contains("affects"), "{out}");
    assert!(out.contains("no snapshot needs what is damaged"), "{out}");
    let restored = env.restore("latest", &src, "r");
    assert_eq!(
        fs::read(restored.join("big.bin")).unwrap(),
        fs::read(src.join("big.bin")).unwrap()
    );
}

/// A dump that meets a damaged blob says which file, which blob in which pack,
/// and that the stream was cut short (QA: only "blob … is damaged"); to a file,
/// nothing is left.
#[test]
fn a_dump_cut_short_by_damage_says_where_and_how_much_came() {
    let env = Env::new();
    env.init(&[]);
    let src = env.path("src");
    fs::create_dir_all(&src).unwrap();
    let data = Rng(11).bytes(3_000_000, false);
    fs::write(src.join("big"), &data).unwrap();
    env.backup(&[&src]);
    flip_middle(&largest_pack(&env.repo));
    let file = format!("{}/big", src.display());
    let o = env.run(&["dump", "latest", &file]);
    let err = String::from_utf8_lossy(&o.stderr);
    assert_eq!(o.status.code(), Some(1), "{err}");
    assert!(o.stdout.len() < data.len() && data.starts_with(&o.stdout));
    assert!(
        err.contains(&format!("{file}: blob "))
            && err.contains("(in pack ")
            && err.contains(&format!(
                "cut short after the first {} of its 3000000 bytes",
                o.stdout.len()
            )),
        "{err}"
    );
    // Standard output redirected to a file gets what the message counts (QA: it
    // got nothing, the rest of a buffer lost).
    let redirected = env.path("redirected.bin");
    let o = env
        .cmd(&["dump", "latest", &file])
        .stdout(fs::File::create(&redirected).unwrap())
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&o.stderr);
    let got = fs::read(&redirected).unwrap();
    assert!(
        !got.is_empty()
            && data.starts_with(&got)
            && err.contains(&format!("after the first {} of", got.len())),
        "{} bytes: {err}",
        got.len()
    );
    let out = env.path("out.bin");
    let err = env.fails(&["dump", "latest", &file, "-t", out.to_str().unwrap()], 1);
    assert!(
        err.contains(&format!("{} was not written", out.display())),
        "{err}"
    );
    assert!(!out.exists());
}

/// A damaged index file: a restore reads the headers of the packs no readable
/// index file lists and restores every file whole (QA r11: one flipped bit left
/// 574 files incomplete while every pack was whole); check still names the
/// damage and says to repair the index first.
#[test]
fn a_restore_goes_past_a_damaged_index_file_to_the_packs() {
    let env = Env::new();
    env.init(&[]);
    env.ok(&["config", "--pack-size", "1M"]);
    let src = env.path("src");
    random_files(&src, "f", 30, 100_000, 6);
    env.backup(&[&src]);
    let biggest = files(&env.repo.join("index"))
        .into_iter()
        .max_by_key(|p| fs::metadata(p).unwrap().len())
        .unwrap();
    let mut bytes = fs::read(&biggest).unwrap();
    let mid = bytes.len() / 2;
    bytes[mid] ^= 4;
    fs::write(&biggest, bytes).unwrap();
    let t = env.path("t");
    let o = env.run(&["restore", "latest", "--target", t.to_str().unwrap()]);
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(o.status.success(), "{err}");
    assert!(err.contains("so this run read the headers of"), "{err}");
    assert_same(&src, &t.join(src.strip_prefix("/").unwrap()));
    let o = env.run(&["check"]);
    let (out, err) = (
        String::from_utf8_lossy(&o.stdout),
        String::from_utf8_lossy(&o.stderr),
    );
    assert_eq!(o.status.code(), Some(1), "{err}");
    assert!(err.contains("`cairn repair index` first"), "{err}");
    // The file named once, then why (its id was printed three times).
    let name = biggest.file_name().unwrap().to_str().unwrap();
    let line = out.lines().find(|l| l.contains(name)).unwrap();
    assert_eq!(line.matches(name).count(), 1, "{line}");
    assert!(
        line.contains("is damaged: its content does not match its id"),
        "{line}"
    );
    env.ok(&["repair", "index"]);
    env.check_clean();
}

/// An index file lost: `check` says to rebuild the index before repairing
/// snapshots, and `repair snapshots` refuses to drop files while packs no index
/// lists may hold them (QA: following check's advice emptied every snapshot).
#[test]
fn snapshots_are_not_repaired_while_packs_are_unindexed() {
    let env = Env::new();
    env.init(&[]);
    env.ok(&["config", "--pack-size", "1M"]);
    let src = env.path("src");
    random_files(&src, "f", 40, 100_000, 5);
    env.backup(&[&src]);
    let biggest = files(&env.repo.join("index"))
        .into_iter()
        .max_by_key(|p| fs::metadata(p).unwrap().len())
        .unwrap();
    fs::remove_file(&biggest).unwrap();
    let err = env.fails(&["check"], 1);
    assert!(
        err.contains("`cairn repair index` first")
            && err.contains("then `cairn check` again: `cairn repair snapshots` then"),
        "{err}"
    );
    let err = env.fails(&["repair", "snapshots"], 1);
    assert!(
        err.contains("run `cairn repair index` first") && err.contains("nothing was changed"),
        "{err}"
    );
    // A restore says where to look and the dry run says it first, from the
    // index alone (QA: the error only; the dry run promised every file).
    let t = env.path("t-dry");
    for dry in [true, false] {
        let mut args = vec!["restore", "latest", "--target", t.to_str().unwrap()];
        if dry {
            args.push("--dry-run");
        }
        let err = env.fails(&args, 1);
        assert!(
            err.contains("missing from the index")
                && err.contains("`cairn check --read-data` says what the repository lacks")
                && err.contains("`cairn repair index` when index files were lost"),
            "dry run {dry}: {err}"
        );
    }
    fs::remove_dir_all(&t).unwrap();
    let dry = env.ok(&["repair", "index", "--dry-run"]);
    assert!(
        dry.contains("would index") && dry.contains("nothing was written"),
        "{dry}"
    );
    env.fails(&["check"], 1);
    env.ok(&["repair", "index"]);
    env.check_clean();
    assert_same(&src, &env.restore("latest", &src, "t"));
}

/// A pack damaged inside: a restore's advice names `check --read-data`, and a
/// plain `check`, which does not read the packs' content, does not call the
/// repository clean without saying so (QA r15: "no errors were found").
#[test]
fn damage_inside_a_pack_is_sent_to_read_data_and_plain_check_says_what_it_did_not_read() {
    let env = Env::new();
    env.init(&[]);
    let src = env.path("src");
    fs::create_dir_all(&src).unwrap();
    fs::write(src.join("x"), Rng(3).bytes(3 << 20, false)).unwrap();
    let snap = env.backup(&[&src]);
    flip_middle(&largest_pack(&env.repo));
    let t = env.path("t");
    let err = env.fails(&["restore", &snap, "-t", t.to_str().unwrap()], 1);
    assert!(err.contains("`cairn check --read-data`"), "{err}");
    let out = env.ok(&["check"]);
    assert!(
        out.contains("no errors were found in the repository's structure")
            && out.contains("`--read-data` checks it"),
        "{out}"
    );
    let o = env.run(&["check", "--read-data"]);
    assert_eq!(o.status.code(), Some(1), "{o:?}");
    // Damage, in one blob: not another pack under this one's name with every
    // blob lost (QA r18).
    let out = String::from_utf8_lossy(&o.stdout);
    assert!(
        out.contains("content does not match its name (damaged); 1 of ")
            && !out.contains("holds another pack"),
        "{out}"
    );
}

/// A pack the disk fails to read (EIO) is not damage found: `check --read-data`
/// says that it could not be read and to look at the disk, without making each
/// of its blobs a problem or advising a repair that would drop what a mended
/// disk still holds (QA r17: 591 problems, "repair index").
#[test]
fn a_pack_the_disk_cannot_read_is_sent_to_the_disk_not_to_repair() {
    let env = Env::new();
    env.init(&["--block-size", "4K"]);
    let src = env.path("src");
    fs::create_dir_all(&src).unwrap();
    fs::write(src.join("x"), Rng(3).bytes(2 << 20, false)).unwrap();
    env.backup(&[&src]);
    let o = env
        .cmd(&["check", "--read-data"])
        .env("CAIRN_FAULTS", "fail=1,ops=get,names=data/,kind=io")
        .output()
        .unwrap();
    let out = String::from_utf8_lossy(&o.stdout);
    let err = String::from_utf8_lossy(&o.stderr);
    assert_eq!(o.status.code(), Some(1), "{out}{err}");
    assert!(
        out.contains("could not be read (Input/output error")
            && out.contains("whether it is damaged is not known"),
        "{out}"
    );
    assert!(!out.contains("stored in a damaged"), "{out}");
    assert!(
        err.contains("could not be read (see the errors above): check the disk")
            && err.contains("what to repair, if anything, is said once everything reads")
            && !err.contains("cairn repair"),
        "{err}"
    );
    let packs = packs(&env.repo).len();
    let v: serde_json::Value = serde_json::from_slice(
        &env.cmd(&["check", "--read-data", "--json"])
            .env("CAIRN_FAULTS", "fail=1,ops=get,names=data/,kind=io")
            .output()
            .unwrap()
            .stdout,
    )
    .unwrap();
    let problems = v["problems"].as_array().unwrap();
    let kinds = |k: &str| problems.iter().filter(|p| p["kind"] == k).count();
    // Each pack once, and the snapshot's root tree, which could not be walked.
    assert_eq!(kinds("pack_read_failed"), packs, "{v}");
    assert_eq!(kinds("blob_read_failed"), 1, "{v}");
    assert_eq!(problems.len(), packs + 1, "{v}");
    assert_eq!(v["packs_read"], 0, "{v}");
    // Without the failing disk, everything reads back.
    env.ok(&["check", "--read-data"]);
}

/// `repair snapshots` names what it drops as `ls` does: a newline in a name is
/// written `\n`, not as a line break that splits the entry (QA r18).
#[test]
fn repair_snapshots_escapes_control_characters_in_the_names_it_drops() {
    let env = Env::new();
    env.init(&[]);
    let src = env.path("src");
    fs::create_dir_all(&src).unwrap();
    fs::write(src.join("new\nline"), Rng(8).bytes(3 << 20, false)).unwrap();
    env.backup(&[&src]);
    let pack = largest_pack(&env.repo);
    fs::OpenOptions::new()
        .write(true)
        .open(&pack)
        .unwrap()
        .set_len(1000)
        .unwrap();
    env.ok(&["repair", "index"]);
    let out = env.ok(&["repair", "snapshots", "--dry-run"]);
    assert!(
        out.contains("would drop ") && out.contains("/new\\nline ("),
        "{out}"
    );
}

/// A backup whose host's last snapshot cannot be read says so, and which parent
/// it compared with instead (QA: a nightly backup's log showed nothing, and it
/// read again every file the damaged snapshot held).
#[test]
fn a_backup_says_when_a_snapshot_it_may_follow_cannot_be_read() {
    let env = Env::new();
    env.init(&[]);
    let src = env.path("src");
    fs::create_dir_all(&src).unwrap();
    fs::write(src.join("a"), b"a").unwrap();
    let first = env.backup(&[&src]);
    fs::write(src.join("b"), b"b").unwrap();
    let second = env.backup(&[&src]);
    let path = env.repo.join("snapshots").join(&second);
    let mut bytes = fs::read(&path).unwrap();
    bytes[40] ^= 1;
    fs::write(&path, bytes).unwrap();
    fs::write(src.join("c"), b"c").unwrap();
    let o = env.run(&["backup", "--json", src.to_str().unwrap()]);
    assert!(o.status.success(), "{o:?}");
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(
        err.contains(&format!("snapshot {} could not be read", &second[..8]))
            && err.contains(&format!("is compared with another, {}", &first[..8])),
        "{err}"
    );
    let v: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
    assert_eq!(v["parent"].as_str(), Some(first.as_str()));
    // Naming the parent says nothing of it.
    let o = env.run(&["backup", "--parent", &first, src.to_str().unwrap()]);
    assert!(o.status.success(), "{o:?}");
    assert!(
        !String::from_utf8_lossy(&o.stderr).contains("could not be read"),
        "{o:?}"
    );
}

/// A damaged chunk that a small file holds twice: export names the file and
/// writes zeros in both places, as restore does (QA r33: "a blob read went
/// missing", no file named, the later blobs of the batch out of place).
#[test]
fn export_of_a_file_holding_a_damaged_chunk_twice_names_it() {
    let env = Env::new();
    env.init(&[]);
    let src = env.path("src");
    fs::create_dir_all(&src).unwrap();
    let block = Rng(133).bytes(128 << 10, false);
    fs::write(src.join("a.bin"), block.repeat(4)).unwrap();
    fs::write(src.join("b.bin"), Rng(134).bytes(300_000, false)).unwrap();
    env.backup(&[&src]);
    let tree: serde_json::Value =
        serde_json::from_str(&env.ok(&["cat", "tree", &format!("latest:{}", src.display())]))
            .unwrap();
    let ids: Vec<String> = tree["nodes"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|n| n["name"] == "a.bin")
        .flat_map(|n| n["content"].as_array().unwrap().clone())
        .map(|c| c["id"].as_str().unwrap().to_string())
        .collect();
    let twice = ids
        .iter()
        .find(|i| ids.iter().filter(|j| j == i).count() > 1)
        .expect("a chunk held twice")
        .clone();
    let mut flipped = false;
    for p in env.ok(&["list", "packs"]).lines() {
        let pack: serde_json::Value = serde_json::from_str(&env.ok(&["cat", "pack", p])).unwrap();
        for b in pack["blobs"].as_array().unwrap() {
            if b["id"] == twice.as_str() {
                let at = b["offset"].as_u64().unwrap() + b["length"].as_u64().unwrap() / 2;
                let f = env.repo.join("data").join(&p[..2]).join(p);
                let mut bytes = fs::read(&f).unwrap();
                bytes[at as usize] ^= 0xff;
                fs::write(&f, bytes).unwrap();
                flipped = true;
            }
        }
    }
    assert!(flipped);
    let out = env.path("all.tar");
    let e = env.fails(&["export", "latest", "-o", out.to_str().unwrap()], 1);
    assert!(e.contains("a.bin") && e.contains("is damaged"), "{e}");
    assert!(!e.contains("went missing"), "{e}");
    let tar = env.path("all.tar.incomplete");
    let list = std::process::Command::new("tar")
        .arg("-tvf")
        .arg(&tar)
        .output()
        .unwrap();
    let listing = String::from_utf8_lossy(&list.stdout);
    assert!(
        listing.contains("b.bin") && listing.contains("a.bin"),
        "{listing}"
    );
    // b.bin comes out whole.
    let x = env.path("x");
    fs::create_dir_all(&x).unwrap();
    assert!(
        std::process::Command::new("tar")
            .arg("-xf")
            .arg(&tar)
            .arg("-C")
            .arg(&x)
            .status()
            .unwrap()
            .success()
    );
    let b = x.join(src.strip_prefix("/").unwrap()).join("b.bin");
    assert_eq!(fs::read(b).unwrap(), fs::read(src.join("b.bin")).unwrap());
}
