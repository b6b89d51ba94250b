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
    env.init(&[
        "--block-size",
        "4K",
        "--index-placement",
        "ssd",
        "--index-path",
        ssd.to_str().unwrap(),
    ]);
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

    env.fails(&["index", "--placement", "floppy"], 1);
}
