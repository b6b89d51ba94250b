//! Checking a repository: structure always (index files, packs exist and fit, every
//! snapshot's trees and chunk lists resolve to indexed blobs) and, with `read_data`,
//! every pack read whole, its hash, header and every blob verified. Each problem names
//! the damaged object and, where known, the snapshots and files it affects.

use crate::error::{Error, Result};
use crate::index::IdSet;
use crate::repo::Repository;
use crate::repo::blob;
use crate::tree::chunklist::for_each_chunk;
use cairn_backend::names;
use cairn_format::consts::PACK_TRAILER_LEN;
use cairn_format::pack;
use cairn_format::tree::NodeKind;
use cairn_format::{BlobId, PackId, SnapshotId};
use std::collections::{HashMap, HashSet};

#[derive(Clone, Debug, Default)]
pub struct CheckOptions {
    pub read_data: bool,
    /// Read only part of the packs (implies reading data).
    pub subset: Option<Subset>,
}

/// Which packs `--read-data-subset` reads.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum Subset {
    /// Group `n` (1-based) of `m`: packs are split into `m` groups by id, so running
    /// 1/m .. m/m on successive days reads everything once.
    Part { n: u32, m: u32 },
    /// A random sample of this percentage of packs.
    Percent(f64),
}

impl Subset {
    fn select(&self, packs: &mut Vec<(PackId, u64)>) {
        match *self {
            Subset::Part { n, m } => packs.retain(|(id, _)| {
                let g = u32::from_be_bytes([id.0[0], id.0[1], id.0[2], id.0[3]]) % m.max(1);
                g + 1 == n
            }),
            Subset::Percent(p) => {
                let want = ((packs.len() as f64) * p / 100.0).ceil() as usize;
                // Order by a keyed hash with a fresh random key: a uniform sample.
                let key: [u8; 32] = cairn_format::envelope::random_bytes();
                packs.sort_by_cached_key(|(id, _)| *blake3::keyed_hash(&key, &id.0).as_bytes());
                packs.truncate(want.min(packs.len()));
            }
        }
    }
}

#[derive(Clone, Debug, serde::Serialize)]
pub struct Problem {
    /// The damaged or missing object, e.g. `pack 3fa2…` or `snapshot 91bc…`.
    pub object: String,
    pub message: String,
    /// `snapshot-id:path` of files and directories that cannot be fully restored.
    pub affects: Vec<String>,
}

#[derive(Clone, Debug, Default, serde::Serialize)]
pub struct CheckReport {
    pub snapshots: usize,
    pub index_files: usize,
    pub packs: usize,
    pub blobs: usize,
    pub packs_read: usize,
    /// Packs no index lists (left by an interrupted backup; removed by prune).
    pub unindexed_packs: usize,
    /// Prune records whose packs wait for deletion.
    pub pending_deletions: usize,
    pub problems: Vec<Problem>,
}

pub fn check(repo: &mut Repository, opts: &CheckOptions) -> Result<CheckReport> {
    let mut report = CheckReport::default();
    // Snapshots are listed before the index is read, so a backup committing
    // meanwhile cannot look like one whose blobs are missing.
    let (snaps, bad_snaps) = repo.snapshots()?;
    let state = repo.read_index_state()?;
    repo.set_index(&state)?;
    report.index_files = state.live.len();
    report.pending_deletions = state.pending.len();
    let pending_orphans: HashSet<PackId> = state
        .pending
        .iter()
        .flat_map(|(_, p)| p.orphans.iter().copied())
        .collect();
    for e in &state.errors {
        report.problems.push(Problem {
            object: "index".into(),
            message: e.to_string(),
            affects: vec![],
        });
    }
    let index = repo.index().clone();
    report.blobs = index.len();

    // Packs: every indexed pack must exist and hold its blobs.
    let stored: HashMap<PackId, u64> = repo.list_packs()?;
    report.packs = stored.len();
    let live_packs: HashSet<PackId> = index.iter_live().map(|(_, l)| index.pack_of(&l)).collect();
    let mut extent: HashMap<PackId, u64> = HashMap::new();
    for (_, loc) in index.iter() {
        let p = index.pack_of(&loc);
        let end = u64::from(loc.offset) + u64::from(loc.length);
        let e = extent.entry(p).or_default();
        *e = (*e).max(end);
    }
    let mut bad_blobs: IdSet = IdSet::default();
    let mut bad_packs: HashSet<PackId> = HashSet::new();
    for (p, end) in &extent {
        match stored.get(p) {
            // A pack prune retired may already be gone; only a snapshot needing one
            // of its blobs makes that a problem (reported below).
            None if !live_packs.contains(p) => {
                bad_packs.insert(*p);
            }
            None => {
                bad_packs.insert(*p);
                report.problems.push(Problem {
                    object: format!("pack {}", p.to_hex()),
                    message: "listed in the index but missing from storage".into(),
                    affects: vec![],
                });
            }
            Some(size) if *end + PACK_TRAILER_LEN as u64 > *size => {
                bad_packs.insert(*p);
                report.problems.push(Problem {
                    object: format!("pack {}", p.to_hex()),
                    message: format!("truncated: {size} bytes, the index needs more than {end}"),
                    affects: vec![],
                });
            }
            Some(_) => {}
        }
    }
    report.unindexed_packs = stored
        .keys()
        .filter(|p| !extent.contains_key(p) && !pending_orphans.contains(p))
        .count();

    if opts.read_data || opts.subset.is_some() {
        let mut packs: Vec<(PackId, u64)> = stored.iter().map(|(p, s)| (*p, *s)).collect();
        packs.sort();
        if let Some(sub) = &opts.subset {
            sub.select(&mut packs);
        }
        let (problems, bad) = read_packs(repo, &packs, &live_packs);
        report.packs_read = packs.len();
        report.problems.extend(problems);
        bad_blobs.extend(bad);
    }
    for (id, loc) in index.iter() {
        if bad_packs.contains(&index.pack_of(&loc)) {
            bad_blobs.insert(id);
        }
    }

    // Snapshots: every tree, chunk list and chunk must resolve.
    report.snapshots = snaps.len() + bad_snaps.len();
    for e in bad_snaps {
        report.problems.push(Problem {
            object: "snapshot".into(),
            message: e.to_string(),
            affects: vec![],
        });
    }
    let mut seen_trees = IdSet::default();
    let mut object_problems: HashMap<String, Problem> = HashMap::new();
    for (sid, snap) in &snaps {
        let root = match snap.tree_id() {
            Ok(r) => r,
            Err(e) => {
                report.problems.push(Problem {
                    object: format!("snapshot {}", sid.to_hex()),
                    message: e.to_string(),
                    affects: vec![],
                });
                continue;
            }
        };
        walk_snapshot(
            repo,
            sid,
            root,
            "",
            &bad_blobs,
            &mut seen_trees,
            &mut object_problems,
        );
    }
    let mut extra: Vec<Problem> = object_problems.into_values().collect();
    extra.sort_by(|a, b| a.object.cmp(&b.object));
    report.problems.extend(extra);
    report.problems.extend(vanished_snapshots(repo, &state)?);
    Ok(report)
}

/// Snapshots that index files record as committed, that were not forgotten, and
/// whose object is gone: deleted from storage behind cairn's back. Listed after the
/// index was read (a recorded snapshot was written before its record); a candidate
/// is confirmed against a fresh read of the records, since a `forget` running
/// meanwhile records the removal before it deletes.
fn vanished_snapshots(repo: &Repository, state: &crate::repo::IndexState) -> Result<Vec<Problem>> {
    let (announced, forgotten) = state.snapshot_records();
    let present: HashSet<SnapshotId> = repo.list_snapshot_ids()?.into_iter().collect();
    let mut missing: Vec<SnapshotId> = announced
        .iter()
        .filter(|id| !present.contains(*id) && !forgotten.contains(*id))
        .copied()
        .collect();
    if missing.is_empty() {
        return Ok(Vec::new());
    }
    let (_, forgotten_now) = repo.read_index_state()?.snapshot_records();
    missing.retain(|id| !forgotten_now.contains(id));
    missing.sort();
    Ok(missing
        .into_iter()
        .map(|id| Problem {
            object: format!("snapshot {}", id.to_hex()),
            message: "was committed but its object is missing (deleted from storage without \
                      `cairn forget`); `cairn repair snapshots` records it as lost"
                .into(),
            affects: vec![id.short()],
        })
        .collect())
}

#[allow(clippy::too_many_arguments)]
fn walk_snapshot(
    repo: &Repository,
    sid: &SnapshotId,
    tree_id: BlobId,
    path: &str,
    bad: &IdSet,
    seen: &mut IdSet,
    problems: &mut HashMap<String, Problem>,
) {
    fn record(
        problems: &mut HashMap<String, Problem>,
        sid: &SnapshotId,
        object: String,
        message: String,
        at: &str,
    ) {
        let p = problems.entry(object.clone()).or_insert(Problem {
            object,
            message,
            affects: vec![],
        });
        if p.affects.len() < 100 {
            p.affects.push(format!(
                "{}:{}",
                sid.short(),
                if at.is_empty() { "/" } else { at }
            ));
        }
    }
    let tree = if bad.contains(&tree_id) {
        record(
            problems,
            sid,
            format!("tree {}", tree_id.to_hex()),
            "stored in a damaged pack".into(),
            path,
        );
        return;
    } else {
        match repo.load_tree(&tree_id) {
            Ok(t) => t,
            Err(e) => {
                record(
                    problems,
                    sid,
                    format!("tree {}", tree_id.to_hex()),
                    e.to_string(),
                    path,
                );
                return;
            }
        }
    };
    // A tree already checked in full (in this or another snapshot) needs no second
    // walk, unless damage was found, in which case affected paths are still listed.
    let first_visit = seen.insert(tree_id);
    if !first_visit && problems.is_empty() {
        return;
    }
    for n in &tree.nodes {
        let p = format!("{path}/{}", String::from_utf8_lossy(&n.name));
        match n.kind {
            NodeKind::Dir => {
                if let Some(sub) = n.subtree {
                    walk_snapshot(repo, sid, sub, &p, bad, seen, problems);
                }
            }
            NodeKind::File => {
                let r = for_each_chunk(repo, &n.content, &mut |c| {
                    if bad.contains(&c.id) {
                        record(
                            problems,
                            sid,
                            format!("blob {}", c.id.to_hex()),
                            "stored in a damaged pack".into(),
                            &p,
                        );
                    } else if !repo.index().contains(&c.id) {
                        record(
                            problems,
                            sid,
                            format!("blob {}", c.id.to_hex()),
                            "missing from the index".into(),
                            &p,
                        );
                    }
                    Ok(())
                });
                if let Err(e) = r {
                    let obj = match &e {
                        Error::BlobNotFound(id) => format!("chunk list {}", id.to_hex()),
                        Error::Damaged { what, .. } => what.clone(),
                        _ => "chunk list".into(),
                    };
                    record(problems, sid, obj, e.to_string(), &p);
                }
            }
            _ => {}
        }
    }
}

/// Reads every pack whole and verifies hash, header and blobs, on several threads.
fn read_packs(
    repo: &Repository,
    packs: &[(PackId, u64)],
    live: &HashSet<PackId>,
) -> (Vec<Problem>, IdSet) {
    let index = repo.index();
    let mut by_pack: HashMap<PackId, Vec<(BlobId, crate::index::BlobLocation)>> = HashMap::new();
    for (b, l) in index.iter() {
        by_pack.entry(index.pack_of(&l)).or_default().push((b, l));
    }
    let results = crate::threads::parallel_map(packs, crate::threads::cores(), |(id, size)| {
        let indexed = by_pack.get(id).map(Vec::as_slice).unwrap_or(&[]);
        verify_pack(repo, id, *size, indexed, live.contains(id))
    });
    let mut problems = Vec::new();
    let mut bad = IdSet::default();
    for ((id, _), (msgs, blobs)) in packs.iter().zip(results) {
        problems.extend(msgs.into_iter().map(|m| Problem {
            object: format!("pack {}", id.to_hex()),
            message: m,
            affects: vec![],
        }));
        bad.extend(blobs);
    }
    (problems, bad)
}

/// Returns problems found and the blob ids (per the index) that are unusable.
fn verify_pack(
    repo: &Repository,
    id: &PackId,
    size: u64,
    indexed: &[(BlobId, crate::index::BlobLocation)],
    live: bool,
) -> (Vec<String>, Vec<BlobId>) {
    let all_bad = |m: String| (vec![m], indexed.iter().map(|(b, _)| *b).collect());
    // A whole-object range read: large ones bypass the page cache (much cheaper
    // here than buffered reads, and a check should not evict everything else).
    let data = match repo
        .backend()
        .get_range(&names::pack(&id.to_hex()), 0, size)
    {
        Ok(d) => d,
        // A retired pack (no live entry) that a prune deleted while we ran.
        Err(e) if e.is_not_found() && !live => return (vec![], vec![]),
        Err(e) => return all_bad(format!("cannot be read: {e}")),
    };
    let decode_at = |b: &BlobId, offset: u64, length: u32, raw: u32, c| -> Result<()> {
        match data.get(offset as usize..offset as usize + length as usize) {
            Some(s) => blob::decode(repo.key(), b, s, raw, c).map(|_| ()),
            None => Err(Error::Invalid("outside the pack".into())),
        }
    };
    let mut problems = Vec::new();
    let mut bad = Vec::new();
    for (b, l) in indexed {
        if let Err(e) = decode_at(b, l.offset.into(), l.length, l.raw_length, l.compression) {
            problems.push(format!("blob {}: {e}", b.short()));
            bad.push(*b);
        }
    }
    let trailer = data
        .get(data.len().saturating_sub(PACK_TRAILER_LEN)..)
        .unwrap_or(&[]);
    let header = pack::parse_trailer(data.len() as u64, trailer)
        .map_err(|e| e.to_string())
        .and_then(|(off, len)| {
            let sealed = &data[off as usize..(off + u64::from(len)) as usize];
            repo.key()
                .sealer
                .open("pack header", sealed)
                .map_err(|e| e.to_string())
                .and_then(|p| pack::decode_header(&p).map_err(|e| e.to_string()))
                .map(|entries| (off, entries))
        });
    // With a readable header that covers every byte before it, every byte of the
    // pack is authenticated once each blob is verified: no separate hash needed.
    let mut covered = false;
    match header {
        Err(e) => problems.push(format!("header: {e}")),
        Ok((header_off, entries)) => {
            let at: HashMap<BlobId, u64> = indexed
                .iter()
                .map(|(b, l)| (*b, u64::from(l.offset)))
                .collect();
            let mut offset = 0u64;
            let mut listed: HashMap<BlobId, u64> = HashMap::new();
            for e in &entries {
                listed.insert(e.id, offset);
                // Copies the index does not point at (duplicates) are verified too.
                if at.get(&e.id) != Some(&offset)
                    && let Err(err) =
                        decode_at(&e.id, offset, e.length, e.raw_length, e.compression)
                {
                    problems.push(format!("unindexed copy of blob {}: {err}", e.id.short()));
                }
                offset += u64::from(e.length);
            }
            if offset == header_off {
                covered = true;
            } else {
                problems.push("the header does not account for every byte before it".into());
            }
            for (b, l) in indexed {
                if listed.get(b) != Some(&u64::from(l.offset)) {
                    problems.push(format!(
                        "blob {} is in the index but not at that place in the pack header",
                        b.short()
                    ));
                }
            }
        }
    }
    if (!covered || !problems.is_empty()) && PackId::of_content(&data) != *id {
        problems.insert(
            0,
            format!(
                "content does not match its name (damaged); {} of {} blobs are unreadable",
                bad.len(),
                indexed.len()
            ),
        );
    }
    (problems, bad)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn subsets_partition_and_sample() {
        let packs: Vec<(PackId, u64)> = (0..200u32)
            .map(|i| {
                let mut id = [0u8; 32];
                id[..4].copy_from_slice(&i.wrapping_mul(2_654_435_761).to_be_bytes());
                (PackId(id), 1)
            })
            .collect();
        // N/M for N = 1..M reads every pack exactly once.
        let mut seen = Vec::new();
        for n in 1..=7 {
            let mut p = packs.clone();
            Subset::Part { n, m: 7 }.select(&mut p);
            assert!(!p.is_empty());
            seen.extend(p);
        }
        seen.sort();
        let mut all = packs.clone();
        all.sort();
        assert_eq!(seen, all);
        // A percentage takes that share (rounded up), without repeats.
        let mut p = packs.clone();
        Subset::Percent(10.0).select(&mut p);
        assert_eq!(p.len(), 20);
        p.sort();
        p.dedup();
        assert_eq!(p.len(), 20);
    }
}
