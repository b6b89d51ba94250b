//! The master index: every blob id the repository holds -> where it is.
//!
//! Built from all `index/` files at open. The repository's index files are the
//! truth; this is a derived, in-memory view (the RAM placement). Blob ids are keyed
//! BLAKE3 outputs, uniformly distributed, so hash tables use their first 8 bytes as
//! the hash instead of hashing them again, and the master index finds an id's place
//! in its sorted table from its first bits.

pub(crate) mod claims;
pub mod spill;
pub mod ssd;

/// What an index placement is built from: the repository's index files and
/// pending-deletion records. The repository implements it; the index layer never
/// names the repository, so the dependency points one way (repo -> index).
pub trait IndexSource: Sync {
    /// The repository's id (the SSD placement keeps one directory per repository).
    fn repository_id(&self) -> &str;
    /// Every stored index file (live and superseded) with its stored size.
    fn index_files(&self) -> crate::Result<Vec<(cairn_format::IndexId, u64)>>;
    fn read_index_file(&self, id: &cairn_format::IndexId) -> crate::Result<IndexFile>;
    fn pending_records(&self) -> crate::Result<Vec<cairn_format::PendingId>>;
    fn read_pending(
        &self,
        id: &cairn_format::PendingId,
    ) -> crate::Result<cairn_format::pending::PendingDeletion>;
    /// A source of its own that the SSD placement keeps to rebuild files it finds
    /// damaged in the middle of a run; `None` when there is none to give (the
    /// damage then fails the lookups that meet it, and the next open rebuilds).
    fn detached(&self) -> Option<std::sync::Arc<dyn IndexSource + Send + Sync>> {
        None
    }
}

use cairn_format::consts::ID_LEN;
use cairn_format::index::{IndexBlob, IndexFile};
use cairn_format::pack::{BlobCompression, BlobKind};
use cairn_format::{BlobId, PackId};
use std::collections::HashMap;
use std::hash::{BuildHasherDefault, Hasher};

#[derive(Default)]
pub struct IdHasher(u64);

impl Hasher for IdHasher {
    fn finish(&self) -> u64 {
        self.0
    }
    fn write(&mut self, bytes: &[u8]) {
        // Ids hash as their first 8 bytes; anything else (never used) still works.
        for chunk in bytes.chunks(8) {
            let mut b = [0u8; 8];
            b[..chunk.len()].copy_from_slice(chunk);
            self.0 = self.0.rotate_left(5) ^ u64::from_le_bytes(b);
        }
    }
}

pub type IdMap<V> = HashMap<BlobId, V, BuildHasherDefault<IdHasher>>;
pub type IdSet = std::collections::HashSet<BlobId, BuildHasherDefault<IdHasher>>;

/// Where one blob lives (as handed out; the table stores it packed in 15 bytes).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct BlobLocation {
    pack: u32,
    pub offset: u32,
    pub length: u32,
    pub raw_length: u32,
    pub kind: BlobKind,
    pub compression: BlobCompression,
}

impl BlobLocation {
    pub(crate) fn pack_number(&self) -> u32 {
        self.pack
    }

    /// Whether this is the entry at `offset` of pack number `pack` with these
    /// lengths and encoding: copies are told apart by everything their entries say
    /// (an entry at a true copy's place with another length is another copy).
    pub(crate) fn is_entry(
        &self,
        pack: u32,
        offset: u32,
        length: u32,
        raw_length: u32,
        compression: BlobCompression,
    ) -> bool {
        (
            self.pack,
            self.offset,
            self.length,
            self.raw_length,
            self.compression,
        ) == (pack, offset, length, raw_length, compression)
    }

    pub(crate) fn with_pack_offset(mut self, offset: u32) -> Self {
        self.pack += offset;
        self
    }

    pub(crate) fn new(pack: u32, b: &IndexBlob) -> Self {
        BlobLocation {
            pack,
            offset: b.offset,
            length: b.length,
            raw_length: b.raw_length,
            kind: b.kind,
            compression: b.compression,
        }
    }
}

/// Pack ids numbered in the order first seen, so that records hold a `u32` instead
/// of a 32-byte id. Shared by both placements' builders.
#[derive(Default)]
pub(crate) struct PackTable {
    pub(crate) ids: Vec<PackId>,
    numbers: HashMap<PackId, u32>,
    /// Per pack number, where its last indexed blob ends: a stored pack shorter
    /// than that was cut short ([`MasterIndex::set_missing_packs`]). Empty for a
    /// table read back from the SSD placement's files (not known there).
    ends: Vec<u32>,
}

impl PackTable {
    pub(crate) fn from_ids(ids: Vec<PackId>) -> Self {
        let numbers = ids
            .iter()
            .enumerate()
            .map(|(i, p)| (*p, i as u32))
            .collect();
        PackTable {
            ids,
            numbers,
            ends: Vec::new(),
        }
    }

    /// The pack's number, giving it the next one when it is new.
    pub(crate) fn number(&mut self, id: PackId) -> u32 {
        let next = self.ids.len() as u32;
        let n = *self.numbers.entry(id).or_insert(next);
        if n == next {
            self.ids.push(id);
        }
        n
    }

    /// Notes that pack `n` holds bytes up to `end` (an indexed blob's end).
    pub(crate) fn reaches(&mut self, n: u32, end: u32) {
        let n = n as usize;
        if self.ends.len() <= n {
            self.ends.resize(n + 1, 0);
        }
        self.ends[n] = self.ends[n].max(end);
    }

    /// Where pack `n`'s last indexed blob ends; 0 when not known.
    pub(crate) fn end_of(&self, n: usize) -> u64 {
        self.ends.get(n).map_or(0, |&e| u64::from(e))
    }
}

/// Bytes of one table record: the 32-byte id and the packed location.
pub const RECORD_LEN: usize = ID_LEN + 15;

/// One record: id, then pack (32 bits), offset (30), length (27), raw length
/// (27), kind (2), compression (1) and the pending flag (1), little-endian. The
/// index file decoder bounds every field to these widths (`offset + length` within
/// a pack of at most 1 GiB, lengths within one blob).
pub(crate) type Record = [u8; RECORD_LEN];

pub(crate) fn pack_record(id: &BlobId, loc: &BlobLocation, pending: bool) -> Record {
    let v: u128 = u128::from(loc.pack)
        | (u128::from(loc.offset & ((1 << 30) - 1)) << 32)
        | (u128::from(loc.length & ((1 << 27) - 1)) << 62)
        | (u128::from(loc.raw_length & ((1 << 27) - 1)) << 89)
        | (u128::from(loc.kind as u8 & 3) << 116)
        | (u128::from(loc.compression as u8 & 1) << 118)
        | (u128::from(pending) << 119);
    let mut r = [0u8; RECORD_LEN];
    r[..ID_LEN].copy_from_slice(&id.0);
    r[ID_LEN..].copy_from_slice(&v.to_le_bytes()[..15]);
    r
}

pub(crate) fn record_id(r: &Record) -> BlobId {
    let mut id = [0u8; ID_LEN];
    id.copy_from_slice(&r[..ID_LEN]);
    BlobId(id)
}

pub(crate) fn record_pending(r: &Record) -> bool {
    r[RECORD_LEN - 1] & 0x80 != 0
}

pub(crate) fn unpack_record(r: &Record) -> BlobLocation {
    let mut b = [0u8; 16];
    b[..15].copy_from_slice(&r[ID_LEN..]);
    let v = u128::from_le_bytes(b);
    let bits = |shift: u32, width: u32| ((v >> shift) & ((1u128 << width) - 1)) as u32;
    BlobLocation {
        pack: bits(0, 32),
        offset: bits(32, 30),
        length: bits(62, 27),
        raw_length: bits(89, 27),
        kind: BlobKind::from_u8(bits(116, 2) as u8).unwrap_or(BlobKind::Data),
        compression: BlobCompression::from_u8(bits(118, 1) as u8).unwrap_or(BlobCompression::Raw),
    }
}

/// Whether a location fits the packed record (the decoder guarantees it for index
/// files; this guards the other callers).
pub(crate) fn fits(b: &IndexBlob) -> bool {
    b.offset < (1 << 30) && b.length < (1 << 27) && b.raw_length < (1 << 27)
}

/// The blob index in RAM: every record in one array sorted by id, and a directory
/// of where each run of ids sharing their top bits starts. Ids are uniformly
/// distributed (keyed hashes), so each run holds about [`PER_BUCKET`] records and a
/// lookup is one directory read and a short binary search. Cost per blob:
/// [`RECORD_LEN`] bytes and a quarter byte of directory, no empty slots.
///
/// Built once per open: records are staged by [`MasterIndex::add_pack`] and
/// [`MasterIndex::add_pending_pack`] and sorted by [`MasterIndex::finish`]; lookups
/// see only finished records. Live entries come from index files; pending ones
/// from prune's pending-deletion records (packs on their way out). Readers use
/// both, so a snapshot that committed while prune ran still restores; backups
/// deduplicate only against live entries, so nothing new comes to depend on a pack
/// that is about to go.
#[derive(Default)]
pub struct MasterIndex {
    packs: PackTable,
    records: Vec<Record>,
    /// `dir[b]..dir[b + 1]` are the records whose ids start with the `bits`-bit value `b`.
    dir: Vec<u32>,
    bits: u32,
    /// Records staged since the last [`MasterIndex::finish`].
    staged: usize,
    live: usize,
    /// The SSD placement: lookups go there and `records` stays empty.
    ssd: Option<crate::index::ssd::SsdIndex>,
    /// The live copies [`MasterIndex::finish`] did not keep, sorted by id: where
    /// a reader looks when the kept copy does not hold the blob (see
    /// [`MasterIndex::copies`]). A record each, as in the table.
    others: Vec<Record>,
    /// What the storage was found not to hold: packs the listing at load lacks
    /// ([`MasterIndex::set_missing_packs`]), and blobs and packs a read of this
    /// process found damaged or gone ([`MasterIndex::found_unreadable`], QA r33:
    /// a backup that failed to read its parent's listing referred to that copy
    /// again). Their blobs are not live.
    lost: std::sync::RwLock<Lost>,
    /// Whether `lost` holds anything (read without its lock: nearly always not).
    any_lost: std::sync::atomic::AtomicBool,
}

#[derive(Default)]
struct Lost {
    blobs: std::collections::HashSet<BlobId>,
    /// Pack numbers.
    packs: std::collections::HashSet<u32>,
}

/// Records per directory bucket on average.
const PER_BUCKET: usize = 16;

/// Most records the RAM placement holds (the directory counts in 32 bits).
pub const MAX_RECORDS: usize = u32::MAX as usize;

fn prefix(id: &[u8]) -> u64 {
    let mut b = [0u8; 8];
    b.copy_from_slice(&id[..8]);
    u64::from_be_bytes(b)
}

impl MasterIndex {
    pub fn new() -> Self {
        Self::default()
    }

    /// Room for `n` more records, so that building does not double the memory.
    /// Fails, saying so, when the RAM placement cannot hold them: the index never
    /// silently holds less than the repository has.
    pub fn reserve(&mut self, n: usize) -> crate::Result<()> {
        let total = self.records.len() + n;
        let too_big = || {
            crate::Error::Invalid(format!(
                "the index has {total} blobs, more than the RAM placement can hold here \
                 ({} of RAM needed); move it to the SSD placement: cairn index --placement ssd",
                crate::units::bytes(total as u64 * RECORD_LEN as u64, 1)
            ))
        };
        if total > MAX_RECORDS {
            return Err(too_big());
        }
        self.records.try_reserve_exact(n).map_err(|_| too_big())
    }

    /// The index of the SSD placement, opened on its local files.
    pub fn from_ssd(ssd: crate::index::ssd::SsdIndex, packs: Vec<PackId>) -> Self {
        MasterIndex {
            packs: PackTable::from_ids(packs),
            ssd: Some(ssd),
            ..Default::default()
        }
    }

    /// The SSD placement's index, when that is where this one lives.
    pub fn ssd(&self) -> Option<&crate::index::ssd::SsdIndex> {
        self.ssd.as_ref()
    }

    /// Blobs findable (live or pending).
    pub fn len(&self) -> usize {
        match &self.ssd {
            Some(s) => s.len(),
            None => self.records.len() - self.staged,
        }
    }
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Bytes of RAM the table uses (records, directory and pack ids).
    pub fn ram_bytes(&self) -> usize {
        self.ssd.as_ref().map_or(0, |s| s.ram_bytes())
            + (self.records.capacity() + self.others.capacity()) * RECORD_LEN
            + self.dir.capacity() * 4
            + self.packs.ids.capacity() * (ID_LEN + 4 + 8)
            + self.packs.ends.capacity() * 4
    }

    fn stage(&mut self, pack: PackId, blobs: &[IndexBlob], pending: bool) {
        let n = self.packs.number(pack);
        for b in blobs.iter().filter(|b| fits(b)) {
            self.records
                .push(pack_record(&b.id, &BlobLocation::new(n, b), pending));
            self.packs.reaches(n, b.offset.saturating_add(b.length));
            self.staged += 1;
        }
    }

    /// Stages a pack of a live index file. Call [`MasterIndex::finish`] before lookups.
    pub fn add_pack(&mut self, pack: PackId, blobs: &[IndexBlob]) {
        self.stage(pack, blobs, false);
    }

    /// Stages a pack of a pending-deletion record: its blobs are found only where no
    /// live copy exists.
    pub fn add_pending_pack(&mut self, pack: PackId, blobs: &[IndexBlob]) {
        self.stage(pack, blobs, true);
    }

    pub fn add_file(&mut self, file: &IndexFile) {
        for p in &file.packs {
            self.add_pack(p.id, &p.blobs);
        }
    }

    /// Sorts what was staged into the table. Of several copies of a blob, a live
    /// one is kept over a pending one; live copies are equally valid (two writers
    /// stored the same blob), so which of them stays does not matter.
    pub fn finish(&mut self) {
        if self.staged == 0 && !self.dir.is_empty() {
            return;
        }
        // Live before pending for equal ids, so `dedup` keeps a live copy.
        self.records.sort_unstable_by(|a, b| {
            a[..ID_LEN]
                .cmp(&b[..ID_LEN])
                .then(record_pending(a).cmp(&record_pending(b)))
        });
        let others = &mut self.others;
        let before = others.len();
        // Pending copies too: the live copy a prune kept was verified, but a live
        // entry can also be one an append-only writer (a backup token) indexed
        // after the prune, naming bytes that are not the blob, for a blob that
        // then lives only in a pending record; readers that find the live copy
        // false must still reach the pending one (as the SSD placement does).
        // Pending records last only until the next prune, so the memory is
        // passing.
        self.records.dedup_by(|next, kept| {
            let same = next[..ID_LEN] == kept[..ID_LEN];
            if same {
                others.push(*next);
            }
            same
        });
        if before > 0 && others.len() > before {
            others.sort_unstable_by(|a, b| a[..ID_LEN].cmp(&b[..ID_LEN]));
        }
        others.shrink_to_fit();
        self.records.shrink_to_fit();
        self.staged = 0;
        self.live = self.records.iter().filter(|r| !record_pending(r)).count();
        let n = self.records.len();
        let mut bits = 0;
        while bits < 40 && (n >> bits) > PER_BUCKET {
            bits += 1;
        }
        self.bits = bits;
        let buckets = 1usize << bits;
        let mut dir = vec![0u32; buckets + 1];
        let mut i = 0usize;
        for (b, slot) in dir.iter_mut().enumerate().take(buckets) {
            *slot = i as u32;
            while i < n && self.bucket_of(&self.records[i]) == b {
                i += 1;
            }
        }
        dir[buckets] = n as u32;
        self.dir = dir;
    }

    fn bucket_of(&self, id: &[u8]) -> usize {
        if self.bits == 0 {
            0
        } else {
            (prefix(id) >> (64 - self.bits)) as usize
        }
    }

    fn find(&self, id: &BlobId) -> Option<&Record> {
        if self.dir.is_empty() {
            return None;
        }
        let b = self.bucket_of(&id.0);
        let (lo, hi) = (self.dir[b] as usize, self.dir[b + 1] as usize);
        let run = self.records.get(lo..hi)?;
        run.binary_search_by(|r| r[..ID_LEN].cmp(&id.0[..]))
            .ok()
            .map(|i| &run[i])
    }

    /// Where a blob can be read (live copy first, else a pending one).
    pub fn get(&self, id: &BlobId) -> Option<BlobLocation> {
        match &self.ssd {
            Some(s) => s.lookup(id).map(|(l, _)| l),
            None => self.find(id).map(unpack_record),
        }
    }

    /// Every copy of a blob the index lists, the one [`MasterIndex::get`] gives
    /// first. Nearly always one; several when writers stored it more than once,
    /// and then any of them may be the one that does not hold the blob (damage,
    /// or an index entry written by an append-only writer that names another
    /// pack's blob): a reader that finds the first copy false tries the others.
    pub fn copies(&self, id: &BlobId) -> Vec<BlobLocation> {
        match &self.ssd {
            Some(s) => s.copies(id),
            None => {
                let from = self.others.partition_point(|r| r[..ID_LEN] < id.0[..]);
                let more = self.others[from..]
                    .iter()
                    .take_while(|r| r[..ID_LEN] == id.0[..]);
                self.find(id)
                    .into_iter()
                    .chain(more)
                    .map(unpack_record)
                    .collect()
            }
        }
    }

    /// Whether a blob can be read.
    pub fn contains(&self, id: &BlobId) -> bool {
        match &self.ssd {
            Some(s) => s.lookup(id).is_some(),
            None => self.find(id).is_some(),
        }
    }

    /// Whether a live index file lists the blob: only such blobs may be reused by a
    /// backup instead of storing them again.
    pub fn is_live(&self, id: &BlobId) -> bool {
        use std::sync::atomic::Ordering;
        // Nearly always nothing is lost: then no record is unpacked for this.
        let any_lost = self.any_lost.load(Ordering::Acquire);
        let pack = match &self.ssd {
            Some(s) => s
                .lookup(id)
                .filter(|(_, pending)| !pending)
                .map(|(l, _)| Some(l.pack)),
            None => self
                .find(id)
                .filter(|r| !record_pending(r))
                .map(|r| any_lost.then(|| unpack_record(r).pack)),
        };
        match pack {
            None => false,
            Some(_) if !any_lost => true,
            Some(pack) => {
                let lost = self.lost.read().unwrap_or_else(|e| e.into_inner());
                !lost.blobs.contains(id) && pack.is_none_or(|p| !lost.packs.contains(&p))
            }
        }
    }

    /// Blob `id` could not be read from any copy (damaged, or its pack gone:
    /// `pack_gone`, the copy whose pack the storage lacks):
    /// from now on it is not live, nor, for a pack gone, any blob of that pack.
    /// A backup then stores what it holds again where its source has it. Only in
    /// this process's view; `check` and `repair` find and mend the damage.
    pub fn found_unreadable(&self, id: &BlobId, pack_gone: Option<&BlobLocation>) {
        let mut lost = self.lost.write().unwrap_or_else(|e| e.into_inner());
        lost.blobs.insert(*id);
        if let Some(l) = pack_gone {
            lost.packs.insert(l.pack);
        }
        self.any_lost
            .store(true, std::sync::atomic::Ordering::Release);
    }

    /// Marks the packs `stored` says the storage does not hold as missing: their
    /// blobs are then not live, so a backup stores them again (where its source
    /// still has them) instead of referring to data that is gone, and does not
    /// reuse a parent's file content that needs them. `stored` gets each pack's
    /// id and where its last indexed blob ends (0: not known, in the SSD
    /// placement), so that a pack cut short counts as missing too. How many were
    /// missing.
    pub fn set_missing_packs(&mut self, stored: impl Fn(&PackId, u64) -> bool) -> usize {
        let missing: std::collections::HashSet<u32> = (self.packs.ids.iter().enumerate())
            .filter(|(n, id)| !stored(id, self.packs.end_of(*n)))
            .map(|(n, _)| n as u32)
            .collect();
        let n = missing.len();
        let lost = self.lost.get_mut().unwrap_or_else(|e| e.into_inner());
        lost.packs.extend(missing);
        let any = !lost.packs.is_empty() || !lost.blobs.is_empty();
        *self.any_lost.get_mut() = any;
        n
    }

    pub fn pack_of(&self, loc: &BlobLocation) -> PackId {
        self.packs.ids[loc.pack as usize]
    }

    /// Number of the pack, stable for this index's lifetime; lets planners group by
    /// pack with a `u32` instead of a 32-byte id.
    pub fn pack_number_of(loc: &BlobLocation) -> u32 {
        loc.pack
    }

    pub fn pack_by_number(&self, n: u32) -> PackId {
        self.packs.ids[n as usize]
    }

    /// Whether the entries live in the SSD placement's files (not in memory).
    pub fn on_disk(&self) -> bool {
        self.ssd.is_some()
    }

    pub fn packs(&self) -> &[PackId] {
        &self.packs.ids
    }

    fn iter_all(&self) -> Box<dyn Iterator<Item = (BlobId, BlobLocation, bool)> + '_> {
        match &self.ssd {
            Some(s) => Box::new(s.iter()),
            None => Box::new(
                self.records[..self.records.len() - self.staged]
                    .iter()
                    .map(|r| (record_id(r), unpack_record(r), record_pending(r))),
            ),
        }
    }

    /// Every findable blob.
    pub fn iter(&self) -> impl Iterator<Item = (BlobId, BlobLocation)> + '_ {
        self.iter_all().map(|(id, l, _)| (id, l))
    }

    pub fn iter_live(&self) -> impl Iterator<Item = (BlobId, BlobLocation)> + '_ {
        self.iter_all()
            .filter(|(_, _, pending)| !pending)
            .map(|(id, l, _)| (id, l))
    }

    /// Live blobs.
    pub fn live_len(&self) -> usize {
        match &self.ssd {
            Some(s) => s.live_len(),
            None => self.live,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn blob(id: u8, offset: u32) -> IndexBlob {
        IndexBlob {
            kind: BlobKind::Tree,
            id: BlobId([id; 32]),
            offset,
            length: (1 << 27) - 1,
            raw_length: (1 << 26),
            compression: BlobCompression::Zstd,
        }
    }

    #[test]
    fn records_round_trip_at_the_field_limits() {
        let b = blob(7, (1 << 30) - 1);
        let loc = BlobLocation::new(u32::MAX, &b);
        for pending in [false, true] {
            let r = pack_record(&b.id, &loc, pending);
            assert_eq!(unpack_record(&r), loc);
            assert_eq!(record_pending(&r), pending);
            assert_eq!(record_id(&r), b.id);
        }
    }

    #[test]
    fn live_copies_win_and_everything_is_found() {
        let mut ix = MasterIndex::new();
        let mut ids = Vec::new();
        let mut x: u64 = 99;
        for p in 0..50u8 {
            let blobs: Vec<IndexBlob> = (0..100u32)
                .map(|i| {
                    x ^= x << 13;
                    x ^= x >> 7;
                    x ^= x << 17;
                    let mut id = [0u8; 32];
                    id[..8].copy_from_slice(&x.to_le_bytes());
                    id[8] = p;
                    ids.push(BlobId(id));
                    IndexBlob {
                        id: BlobId(id),
                        offset: i * 100,
                        ..blob(0, 0)
                    }
                })
                .collect();
            ix.add_pack(PackId([p; 32]), &blobs);
        }
        // A pending copy of a live blob, and a blob only pending.
        let only_pending = blob(0xEE, 5);
        ix.add_pending_pack(
            PackId([200; 32]),
            &[
                IndexBlob {
                    id: ids[3],
                    ..blob(0, 1)
                },
                only_pending,
            ],
        );
        assert!(ix.get(&ids[0]).is_none(), "nothing before finish");
        ix.finish();
        assert_eq!(ix.len(), ids.len() + 1);
        assert_eq!(ix.live_len(), ids.len());
        for (i, id) in ids.iter().enumerate() {
            let loc = ix.get(id).unwrap();
            assert_eq!(loc.offset, (i as u32 % 100) * 100);
            assert!(ix.is_live(id));
            assert_eq!(ix.pack_of(&loc), PackId([(i / 100) as u8; 32]));
        }
        assert!(ix.contains(&only_pending.id) && !ix.is_live(&only_pending.id));
        // Copies: one where there is one, live duplicates kept, and a pending copy
        // of a live blob too (after the live one: a false live entry must not hide
        // the real bytes in a pending record).
        let c = ix.copies(&ids[3]);
        assert_eq!(c.len(), 2, "{c:?}");
        assert_eq!(c[0], ix.get(&ids[3]).unwrap());
        assert_eq!(ix.pack_of(&c[1]), PackId([200; 32]));
        assert_eq!(ix.copies(&ids[4]).len(), 1);
        ix.add_pack(
            PackId([202; 32]),
            &[IndexBlob {
                id: ids[5],
                ..blob(0, 77)
            }],
        );
        ix.finish();
        let copies = ix.copies(&ids[5]);
        assert_eq!(copies.len(), 2, "{copies:?}");
        assert_eq!(copies[0], ix.get(&ids[5]).unwrap());
        assert!(copies.iter().any(|l| l.offset == 77));
        assert!(!ix.contains(&BlobId([0x11; 32])));
        assert_eq!(ix.iter().count(), ids.len() + 1);
        assert_eq!(ix.iter_live().count(), ids.len());
        // More staged after finish: found after the next finish.
        ix.add_pack(PackId([201; 32]), &[blob(0x22, 9)]);
        ix.finish();
        assert!(ix.is_live(&BlobId([0x22; 32])));
        assert!(ix.ram_bytes() < (ix.len() + 64) * 48 + 60 * 44);
    }
}
