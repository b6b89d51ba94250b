//! The whole index joined with what the snapshots need, in bounded memory.
//! Both sides are whole-repository sets: every blob the snapshots need, and
//! every entry of the index. At 100 million chunks each is several GB, so
//! neither is held whole: both are split by blob id into the same partitions
//! ([`Spill`], on local disk when they would not fit the budget), and each
//! partition is sorted and joined on its own. Per pack only a few counters stay
//! in RAM (a repository of 100M 16 KiB chunks has about 100,000 packs).
//!
//! Prune joins three times (see `prune::join`): to rank the packs, to choose
//! each needed blob's kept copy, and to list what repacking copies. `stats`
//! joins once, to count each needed blob once and each pack's used, unused and
//! duplicate bytes.

use crate::error::{Error, Result};
use crate::index::IdSet;
use crate::index::spill::{Spill, partitions_for};
use crate::repo::{IndexState, Repository};
use crate::tree::reachable::Reached;
use cairn_format::consts::PACK_TRAILER_LEN;
use cairn_format::index::{IndexBlob, IndexPack};
use cairn_format::pack::{BlobCompression, BlobKind};
use cairn_format::{BlobId, IndexId, PackId};
use std::collections::HashMap;

/// An index entry as a spill record: blob id (32 bytes), pack number, file
/// number, offset, length, raw length (4 each), kind and compression (1 each).
pub(crate) const ENTRY: usize = 58;
/// A needed blob as a spill record: its id.
pub(crate) const NEEDED: usize = 32;
/// Memory for one partition's records while they are sorted and joined, when no
/// memory limit says otherwise.
const DEFAULT_BUDGET: u64 = 256 << 20;
/// Index file bytes per entry, at least (an entry is 37-38 bytes sealed): how
/// the entry count is estimated before the files are read.
const MIN_ENTRY_BYTES: u64 = 32;
pub(crate) const NO_FILE: u32 = u32::MAX;
/// The file number of entries read from pending-deletion records.
pub(crate) const PENDING_FILE: u32 = u32::MAX - 1;

/// What prune knows of one indexed pack.
pub(crate) struct PackRow {
    pub id: PackId,
    pub stored_size: Option<u64>,
    /// The first live index file listing the pack ([`NO_FILE`]: none does).
    /// Every live file's listing of it counts: each is a claim of what the pack
    /// holds, and an index file that lists a pack again must not hide the
    /// listing of the writer that stored it (an append-only writer can add one).
    pub file: u32,
    listed_in: Vec<u32>,
    /// How many live index files list the pack.
    pub listings: u32,
    /// Listed by no index file at all, only by pending-deletion records.
    pub pending_only: bool,
    pub blobs: u64,
    pub need: u64,
    pub used_bytes: u64,
    /// The blobs `used_bytes` counts (the copies kept).
    pub used_blobs: u64,
    pub unused_bytes: u64,
    /// Of `unused_bytes`: copies of needed blobs kept elsewhere (stats).
    pub duplicate_bytes: u64,
}

impl PackRow {
    fn new(id: PackId, stored_size: Option<u64>) -> Self {
        PackRow {
            id,
            stored_size,
            file: NO_FILE,
            listed_in: Vec::new(),
            listings: 0,
            pending_only: false,
            blobs: 0,
            need: 0,
            used_bytes: 0,
            used_blobs: 0,
            unused_bytes: 0,
            duplicate_bytes: 0,
        }
    }

    /// Whether the stored pack is long enough to hold `b` where an index entry
    /// puts it: a copy that does not fit is not one (judged per entry, so that a
    /// false entry cannot make the pack's true ones unusable).
    pub fn fits(&self, b: &IndexBlob) -> bool {
        let end = u64::from(b.offset) + u64::from(b.length) + PACK_TRAILER_LEN as u64;
        self.stored_size.is_some_and(|size| end <= size)
    }
}

/// The repository's index, read once: the packs, and every entry spilled.
pub(crate) struct Scan {
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
    pub dir: std::path::PathBuf,
}

pub(crate) fn encode_entry(pack: u32, file: u32, b: &IndexBlob) -> [u8; ENTRY] {
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

pub(crate) struct Entry {
    pub pack: u32,
    pub file: u32,
    pub blob: IndexBlob,
}

pub(crate) fn decode_entry(r: &[u8; ENTRY]) -> Result<Entry> {
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

/// Where an operation's spill files go: beside the local index (the SSD
/// placement's directory), else in the system's temporary directory.
pub(crate) fn scratch_dir(repo: &Repository) -> std::path::PathBuf {
    repo.index_path()
        .unwrap_or_else(|_| std::env::temp_dir().join("cairn"))
}

/// Where spill files go, and how much one partition may hold: `budget`, else a
/// share of the memory limit, else [`DEFAULT_BUDGET`].
fn scratch(repo: &Repository, budget: Option<u64>) -> (std::path::PathBuf, u64) {
    let dir = scratch_dir(repo);
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
pub(crate) fn scan_index(
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
    /// The pack table and the spill, filled by both of the read's callbacks.
    struct Acc {
        entries: Spill<ENTRY>,
        packs: Vec<PackRow>,
        number: HashMap<PackId, u32>,
        /// Packs whose entries a pending record gave already (a pack two records
        /// name is spilled once).
        pending_seen: std::collections::HashSet<PackId>,
    }
    impl Acc {
        fn add(&mut self, p: &IndexPack, file: u32, stored: &HashMap<PackId, u64>) -> Result<u32> {
            let packs = &mut self.packs;
            let n = *self.number.entry(p.id).or_insert_with(|| {
                packs.push(PackRow::new(p.id, stored.get(&p.id).copied()));
                packs.len() as u32 - 1
            });
            for b in &p.blobs {
                self.entries.push(&encode_entry(n, file, b))?;
            }
            Ok(n)
        }
    }
    let acc = std::cell::RefCell::new(Acc {
        entries: Spill::<ENTRY>::new(partitions, &dir)?,
        packs: Vec::new(),
        number: HashMap::new(),
        pending_seen: std::collections::HashSet::new(),
    });
    let mut ids: Vec<IndexId> = Vec::new();
    let state = repo.read_index_state_streamed(
        &mut |fid, f| {
            let file = ids.len() as u32;
            ids.push(*fid);
            let mut acc = acc.borrow_mut();
            for p in &f.packs {
                let n = acc.add(p, file, stored)?;
                acc.packs[n as usize].listed_in.push(file);
            }
            Ok(())
        },
        // Spilled as such: the join passes them over unless the pack's row is
        // marked pending ([`Scan::add_pending_packs`]), and tells whether a
        // pending record lists an id.
        &mut |_, record| {
            let mut acc = acc.borrow_mut();
            for p in &record.packs {
                if acc.pending_seen.insert(p.id) {
                    acc.add(p, PENDING_FILE, stored)?;
                }
            }
            Ok(())
        },
    )?;
    let Acc {
        entries,
        mut packs,
        number,
        ..
    } = acc.into_inner();
    let live: std::collections::HashSet<IndexId> = state.live.iter().map(|(id, _)| *id).collect();
    let files: Vec<(IndexId, bool)> = ids.into_iter().map(|id| (id, live.contains(&id))).collect();
    for row in &mut packs {
        row.pending_only = row.listed_in.is_empty();
        let mut live_files = row
            .listed_in
            .iter()
            .copied()
            .filter(|f| files[*f as usize].1);
        row.file = live_files.next().unwrap_or(NO_FILE);
        row.listings = u32::from(row.file != NO_FILE) + live_files.count() as u32;
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

impl Scan {
    /// Counts the packs of pending-deletion records that no live index file
    /// lists, with their entries: readers still find blobs there, so `stats`
    /// counts them (prune, which decides about those packs itself, does not).
    pub(crate) fn add_pending_packs(&mut self) {
        for (_, record) in &self.state.pending {
            for p in &record.packs {
                if let Some(&n) = self.number.get(&p.id) {
                    let row = &mut self.packs[n as usize];
                    if row.file == NO_FILE {
                        row.file = PENDING_FILE;
                    }
                }
            }
        }
    }
}

/// The blobs snapshots need, reached by a walk: trees and chunk lists (few, and
/// the walk asks about each) in RAM, chunks spilled in the scan's partitions.
pub(crate) struct Needed {
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
    pub(crate) fn into_spill(mut self) -> Result<Spill<NEEDED>> {
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

/// One blob id as [`join`] sees it.
pub(crate) struct Joined<'a> {
    pub id: &'a BlobId,
    /// Its entries in every live listing of each pack, the same entry once.
    pub copies: &'a [Entry],
    /// Whether a snapshot needs it.
    pub needed: bool,
    /// Whether a pending-deletion record lists it (counted or not).
    pub pending: bool,
}

/// What [`join`] calls with each id, and the pack rows to update.
pub(crate) type Visit<'a> = dyn FnMut(Joined<'_>, &mut [PackRow]) -> Result<()> + 'a;

/// Runs `f` with each blob id's entries (those of live index files, and of
/// pending records for a pack no live file lists once [`Scan::add_pending_packs`]
/// counted them) and whether it is needed, partition by partition, ids in order.
/// Needed ids no entry lists come with an empty slice.
pub(crate) fn join(scan: &mut Scan, needed: &mut Spill<NEEDED>, f: &mut Visit<'_>) -> Result<()> {
    for p in 0..scan.entries.partitions() {
        let mut want = needed.read(p)?;
        want.sort_unstable();
        want.dedup();
        let mut have = Vec::new();
        let mut pending: Vec<[u8; 32]> = Vec::new();
        for r in scan.entries.read(p)? {
            let e = decode_entry(&r)?;
            let row_file = scan.packs.get(e.pack as usize).map(|row| row.file);
            let counted = if e.file == PENDING_FILE {
                pending.push(e.blob.id.0);
                row_file == Some(PENDING_FILE)
            } else {
                row_file.is_some() && scan.files.get(e.file as usize).is_some_and(|f| f.1)
            };
            if counted {
                have.push(e);
            }
        }
        // A total order: every pass over a partition meets a blob's copies in the
        // same order, which prune's choice of the kept copy depends on (the
        // copies it read and the copy it keeps must be the same).
        // The id decides nearly always; the rest is compared only between the
        // copies of one blob (not copied out for every comparison).
        let rest = |e: &Entry| {
            let b = &e.blob;
            (
                e.pack,
                b.offset,
                b.length,
                b.raw_length,
                b.kind as u8,
                b.compression as u8,
            )
        };
        have.sort_unstable_by(|x, y| {
            x.blob
                .id
                .0
                .cmp(&y.blob.id.0)
                .then_with(|| rest(x).cmp(&rest(y)))
        });
        // The same entry in two listings of a pack is one copy.
        have.dedup_by(|x, y| x.pack == y.pack && x.blob == y.blob);
        pending.sort_unstable();
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
            let joined = Joined {
                id: &BlobId(next),
                copies: &have[start..i],
                needed: is_needed,
                pending: pending.binary_search(&next).is_ok(),
            };
            f(joined, &mut scan.packs)?;
        }
    }
    Ok(())
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
        let e = decode_entry(&encode_entry(12, 3, &b)).unwrap();
        assert_eq!((e.pack, e.file, e.blob), (12, 3, b));
        let mut bad = encode_entry(1, 1, &b);
        bad[52] = 9;
        assert!(decode_entry(&bad).is_err());
    }
}
