//! Prune's plan in bounded memory. Deciding what to keep needs two
//! whole-repository sets: every blob the snapshots need, and every entry of the
//! index. At 100 million chunks each is several GB, so neither is held whole:
//! both are split by blob id into the same partitions ([`Spill`], on local disk
//! when they would not fit the budget), and each partition is sorted and joined
//! on its own. Per pack only a few counters stay in RAM (a repository of 100M
//! 16 KiB chunks has about 100,000 packs).
//!
//! The join runs over the partitions three times: counting each pack's needed
//! blobs (to rank the packs), choosing the one copy of each needed blob that is
//! kept (from the best-ranked readable pack holding it) with the bytes used and
//! unused per pack, and, for the packs chosen for repacking, listing the blobs
//! to copy. The choice is a pure function of the partition, so the second and
//! third passes agree.

use crate::error::{Error, Result};
use crate::index::IdSet;
use crate::index::spill::{Spill, partitions_for};
use crate::repo::{IndexState, Repository};
use crate::tree::reachable::Reached;
use cairn_format::consts::PACK_TRAILER_LEN;
use cairn_format::index::IndexBlob;
use cairn_format::pack::{BlobCompression, BlobKind};
use cairn_format::{BlobId, IndexId, PackId};
use std::collections::HashMap;

/// An index entry as a spill record: blob id (32 bytes), pack number, file
/// number, offset, length, raw length (4 each), kind and compression (1 each).
const ENTRY: usize = 58;
/// A needed blob as a spill record: its id.
const NEEDED: usize = 32;
/// Memory for one partition's records while they are sorted and joined, when no
/// memory limit says otherwise.
const DEFAULT_BUDGET: u64 = 256 << 20;
/// Index file bytes per entry, at least (an entry is 37-38 bytes sealed): how
/// the entry count is estimated before the files are read.
const MIN_ENTRY_BYTES: u64 = 32;
pub(super) const NO_FILE: u32 = u32::MAX;

/// What prune knows of one indexed pack.
pub(super) struct PackRow {
    pub id: PackId,
    pub stored_size: Option<u64>,
    /// The first live index file listing the pack: its listing is the pack's.
    pub file: u32,
    listed_in: Vec<u32>,
    pub blobs: u64,
    end: u64,
    need: u64,
    pub used_bytes: u64,
    pub unused_bytes: u64,
}

impl PackRow {
    /// Whether the pack's stored object is long enough for every blob it lists.
    pub fn usable(&self) -> bool {
        self.stored_size
            .is_some_and(|size| self.end + PACK_TRAILER_LEN as u64 <= size)
    }
}

/// The repository's index, read once: the packs, and every entry spilled.
pub(super) struct Scan {
    /// The index files' lists (supersedes, snapshot records) and pending records;
    /// its live files hold no packs.
    pub state: IndexState,
    /// Packs some live index file lists, in the order the files list them.
    pub packs: Vec<PackRow>,
    entries: Spill<ENTRY>,
    /// Pack numbers (positions in `packs`) by id.
    pub number: HashMap<PackId, u32>,
    /// Index files by number, with their ids and whether they are live.
    pub files: Vec<(IndexId, bool)>,
    /// Where the spill files go.
    dir: std::path::PathBuf,
}

fn encode(pack: u32, file: u32, b: &IndexBlob) -> [u8; ENTRY] {
    let mut r = [0u8; ENTRY];
    r[..32].copy_from_slice(&b.id.0);
    r[32..36].copy_from_slice(&pack.to_le_bytes());
    r[36..40].copy_from_slice(&file.to_le_bytes());
    r[40..44].copy_from_slice(&b.offset.to_le_bytes());
    r[44..48].copy_from_slice(&b.length.to_le_bytes());
    r[48..52].copy_from_slice(&b.raw_length.to_le_bytes());
    r[52] = b.kind as u8;
    r[53] = b.compression as u8;
    r
}

struct Entry {
    pack: u32,
    file: u32,
    blob: IndexBlob,
}

fn decode(r: &[u8; ENTRY]) -> Result<Entry> {
    let u32_at = |i: usize| u32::from_le_bytes([r[i], r[i + 1], r[i + 2], r[i + 3]]);
    let bad = || Error::Invalid("a spilled index entry is damaged".into());
    let mut id = [0u8; 32];
    id.copy_from_slice(&r[..32]);
    Ok(Entry {
        pack: u32_at(32),
        file: u32_at(36),
        blob: IndexBlob {
            id: BlobId(id),
            offset: u32_at(40),
            length: u32_at(44),
            raw_length: u32_at(48),
            kind: BlobKind::from_u8(r[52]).ok_or_else(bad)?,
            compression: BlobCompression::from_u8(r[53]).ok_or_else(bad)?,
        },
    })
}

/// Where spill files go, and how much one partition may hold: `budget`, else a
/// share of the memory limit, else [`DEFAULT_BUDGET`].
fn scratch(repo: &Repository, budget: Option<u64>) -> (std::path::PathBuf, u64) {
    let dir = repo
        .index_path()
        .unwrap_or_else(|_| std::env::temp_dir().join("cairn"));
    // The suite makes small repositories spill, so the partitioned path is the
    // one its prune and crash tests run.
    #[cfg(feature = "test-hooks")]
    let budget = budget.or_else(|| {
        std::env::var("CAIRN_TEST_SPILL_BUDGET")
            .ok()
            .and_then(|v| v.parse().ok())
    });
    let budget = budget.unwrap_or_else(|| {
        repo.memory_plan_in_use()
            .map_or(DEFAULT_BUDGET, |p| p.share(2, 16 << 20, DEFAULT_BUDGET))
    });
    (dir, budget)
}

/// Reads every index file once, a few at a time: the pack table, every entry to
/// the spill, and the state without the files' packs.
pub(super) fn scan_index(
    repo: &Repository,
    stored: &HashMap<PackId, u64>,
    budget: Option<u64>,
) -> Result<Scan> {
    use crate::index::IndexSource;
    let (dir, budget) = scratch(repo, budget);
    let estimate: u64 = repo
        .index_files()?
        .iter()
        .map(|(_, size)| size / MIN_ENTRY_BYTES + 1)
        .sum();
    let partitions = partitions_for(estimate, (ENTRY + NEEDED) as u64, budget);
    let mut entries = Spill::<ENTRY>::new(partitions, &dir)?;
    let mut packs: Vec<PackRow> = Vec::new();
    let mut number: HashMap<PackId, u32> = HashMap::new();
    let mut ids: Vec<IndexId> = Vec::new();
    let state = repo.read_index_state_streamed(&mut |fid, f| {
        let file = ids.len() as u32;
        ids.push(*fid);
        for p in &f.packs {
            let n = *number.entry(p.id).or_insert_with(|| {
                packs.push(PackRow {
                    id: p.id,
                    stored_size: stored.get(&p.id).copied(),
                    file: NO_FILE,
                    listed_in: Vec::new(),
                    blobs: 0,
                    end: 0,
                    need: 0,
                    used_bytes: 0,
                    unused_bytes: 0,
                });
                packs.len() as u32 - 1
            });
            packs[n as usize].listed_in.push(file);
            for b in &p.blobs {
                entries.push(&encode(n, file, b))?;
            }
        }
        Ok(())
    })?;
    let live: std::collections::HashSet<IndexId> = state.live.iter().map(|(id, _)| *id).collect();
    let files: Vec<(IndexId, bool)> = ids.into_iter().map(|id| (id, live.contains(&id))).collect();
    for row in &mut packs {
        row.file = row
            .listed_in
            .iter()
            .copied()
            .find(|f| files[*f as usize].1)
            .unwrap_or(NO_FILE);
        row.listed_in = Vec::new();
    }
    Ok(Scan {
        state,
        packs,
        entries,
        number,
        files,
        dir,
    })
}

/// The blobs snapshots need, reached by a walk: trees and chunk lists (few, and
/// the walk asks about each) in RAM, chunks spilled in the scan's partitions.
pub(super) struct Needed {
    meta: IdSet,
    chunks: Spill<NEEDED>,
}

impl Needed {
    pub fn new(scan: &Scan) -> Result<Self> {
        Ok(Needed {
            meta: IdSet::default(),
            chunks: Spill::new(scan.entries.partitions(), &scan.dir)?,
        })
    }

    /// Ends the walk: the trees and chunk lists join the chunks.
    fn into_spill(mut self) -> Result<Spill<NEEDED>> {
        for id in std::mem::take(&mut self.meta) {
            self.chunks.push(&id.0)?;
        }
        Ok(self.chunks)
    }
}

impl Reached for Needed {
    fn first_visit(&mut self, id: BlobId) -> bool {
        self.meta.insert(id)
    }
    fn chunk(&mut self, id: BlobId) -> Result<()> {
        self.chunks.push(&id.0)
    }
}

/// What the join decided, besides the counters in the scan's pack rows.
pub(super) struct Joined {
    pub used_blobs: usize,
    /// Needed blobs no kept pack holds but a pack an earlier prune retired does:
    /// deletion indexes such a pack again instead of deleting it.
    pub needed_from_pending: IdSet,
    needed: Spill<NEEDED>,
    rank: Vec<u32>,
}

/// What [`join`] calls with each id: its entries, whether it is needed, and the
/// pack rows to update.
type Visit<'a> = dyn FnMut(&BlobId, &[Entry], bool, &mut [PackRow]) -> Result<()> + 'a;

/// Runs `f` with each blob id's entries (the pack's own listing only) and
/// whether it is needed, partition by partition, ids in order. Needed ids no
/// entry lists come with an empty slice.
fn join(scan: &mut Scan, needed: &mut Spill<NEEDED>, f: &mut Visit<'_>) -> Result<()> {
    for p in 0..scan.entries.partitions() {
        let mut want = needed.read(p)?;
        want.sort_unstable();
        want.dedup();
        let mut have = Vec::new();
        for r in scan.entries.read(p)? {
            let e = decode(&r)?;
            if scan.packs.get(e.pack as usize).map(|row| row.file) == Some(e.file) {
                have.push(e);
            }
        }
        have.sort_unstable_by_key(|e| e.blob.id.0);
        let (mut i, mut j) = (0, 0);
        while i < have.len() || j < want.len() {
            let next = match (have.get(i), want.get(j)) {
                (Some(h), Some(w)) => h.blob.id.0.min(*w),
                (Some(h), None) => h.blob.id.0,
                (None, Some(w)) => *w,
                (None, None) => break,
            };
            let start = i;
            while i < have.len() && have[i].blob.id.0 == next {
                i += 1;
            }
            let is_needed = want.get(j) == Some(&next);
            if is_needed {
                j += 1;
            }
            f(&BlobId(next), &have[start..i], is_needed, &mut scan.packs)?;
        }
    }
    Ok(())
}

/// The copy of a needed blob that is kept: in the best-ranked usable pack.
fn provider(copies: &[Entry], rank: &[u32], packs: &[PackRow]) -> Option<usize> {
    (0..copies.len())
        .filter(|&k| packs[copies[k].pack as usize].usable())
        .min_by_key(|&k| rank[copies[k].pack as usize])
}

/// Counts, per pack, its blobs, their extent and how many are needed; ranks the
/// packs (entirely needed first, then the fullest); then chooses each needed
/// blob's kept copy and adds up the bytes used and unused per pack. Fails when a
/// needed blob has no readable copy and no retired pack holds it.
pub(super) fn join_needed(scan: &mut Scan, needed: Needed) -> Result<Joined> {
    let mut needed = needed.into_spill()?;
    join(scan, &mut needed, &mut |_, copies, is_needed, packs| {
        for e in copies {
            let row = &mut packs[e.pack as usize];
            row.blobs += 1;
            row.end = row
                .end
                .max(u64::from(e.blob.offset) + u64::from(e.blob.length));
            if is_needed {
                row.need += 1;
            }
        }
        Ok(())
    })?;
    let mut order: Vec<u32> = (0..scan.packs.len() as u32).collect();
    let fill = |r: &PackRow| r.need as f64 / r.blobs.max(1) as f64;
    order.sort_by(|a, b| fill(&scan.packs[*b as usize]).total_cmp(&fill(&scan.packs[*a as usize])));
    let mut rank = vec![0u32; scan.packs.len()];
    for (r, n) in order.into_iter().enumerate() {
        rank[n as usize] = r as u32;
    }
    let pending_blobs: IdSet = scan
        .state
        .pending
        .iter()
        .flat_map(|(_, p)| p.packs.iter().flat_map(|x| x.blobs.iter().map(|b| b.id)))
        .collect();
    let mut used_blobs = 0;
    let mut needed_from_pending = IdSet::default();
    join(scan, &mut needed, &mut |id, copies, is_needed, packs| {
        let kept = if is_needed {
            used_blobs += 1;
            provider(copies, &rank, packs)
        } else {
            None
        };
        if is_needed && kept.is_none() {
            if !pending_blobs.contains(id) {
                return Err(Error::Invalid(format!(
                    "blob {} is needed by a snapshot but no readable pack holds it; \
                     run `cairn check` and `cairn repair` before prune",
                    id.to_hex()
                )));
            }
            needed_from_pending.insert(*id);
        }
        for (k, e) in copies.iter().enumerate() {
            let row = &mut packs[e.pack as usize];
            if Some(k) == kept {
                row.used_bytes += u64::from(e.blob.length);
            } else {
                row.unused_bytes += u64::from(e.blob.length);
            }
        }
        Ok(())
    })?;
    Ok(Joined {
        used_blobs,
        needed_from_pending,
        needed,
        rank,
    })
}

/// The kept copies that lie in the packs `repack` selects, by pack, in each
/// pack's order: what repacking copies.
pub(super) fn repack_lists(
    scan: &mut Scan,
    joined: &mut Joined,
    repack: &dyn Fn(usize) -> bool,
) -> Result<HashMap<u32, Vec<IndexBlob>>> {
    let mut lists: HashMap<u32, Vec<IndexBlob>> = HashMap::new();
    let rank = std::mem::take(&mut joined.rank);
    join(
        scan,
        &mut joined.needed,
        &mut |_, copies, is_needed, packs| {
            if !is_needed {
                return Ok(());
            }
            if let Some(k) = provider(copies, &rank, packs)
                && repack(copies[k].pack as usize)
            {
                lists
                    .entry(copies[k].pack)
                    .or_default()
                    .push(copies[k].blob);
            }
            Ok(())
        },
    )?;
    for l in lists.values_mut() {
        l.sort_by_key(|b| b.offset);
    }
    Ok(lists)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_entry_survives_its_record() {
        let b = IndexBlob {
            kind: BlobKind::ChunkList,
            id: BlobId([7; 32]),
            offset: 1 << 30,
            length: 65_536,
            raw_length: 70_000,
            compression: BlobCompression::Zstd,
        };
        let e = decode(&encode(12, 3, &b)).unwrap();
        assert_eq!((e.pack, e.file, e.blob), (12, 3, b));
        let mut bad = encode(1, 1, &b);
        bad[52] = 9;
        assert!(decode(&bad).is_err());
    }
}
