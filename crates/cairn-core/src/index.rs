//! The master index: every blob id the repository holds -> where it is.
//!
//! Built from all `index/` files at open. The repository's index files are the
//! truth; this is a derived, in-memory view (the RAM placement). Blob ids are keyed
//! BLAKE3 outputs, uniformly distributed, so the hash table uses their first 8 bytes as
//! the hash instead of hashing them again.

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

/// Where one blob lives. 20 bytes; with the 32-byte key the table costs about 56
/// bytes per blob at full load.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct BlobLocation {
    pack: u32,
    pub offset: u32,
    pub length: u32,
    pub raw_length: u32,
    pub kind: BlobKind,
    pub compression: BlobCompression,
}

/// Live entries come from index files; pending ones from prune's pending-deletion
/// records (packs on their way out). Readers use both, so a snapshot that committed
/// while prune ran still restores; backups deduplicate only against live entries,
/// so nothing new comes to depend on a pack that is about to go.
impl BlobLocation {
    fn new(pack: u32, b: &IndexBlob) -> Self {
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

#[derive(Default)]
pub struct MasterIndex {
    packs: Vec<PackId>,
    pack_numbers: HashMap<PackId, u32>,
    blobs: IdMap<BlobLocation>,
    pending: IdMap<BlobLocation>,
}

impl MasterIndex {
    pub fn new() -> Self {
        Self::default()
    }

    /// Blobs findable (live or pending).
    pub fn len(&self) -> usize {
        self.blobs.len() + self.pending.len()
    }
    pub fn is_empty(&self) -> bool {
        self.blobs.is_empty() && self.pending.is_empty()
    }

    fn pack_number(&mut self, id: PackId) -> u32 {
        if let Some(n) = self.pack_numbers.get(&id) {
            return *n;
        }
        let n = self.packs.len() as u32;
        self.packs.push(id);
        self.pack_numbers.insert(id, n);
        n
    }

    pub fn add_pack(&mut self, pack: PackId, blobs: &[IndexBlob]) {
        let n = self.pack_number(pack);
        self.blobs.reserve(blobs.len());
        for b in blobs {
            // The first location seen wins; duplicates (two writers storing the same
            // blob) are equally valid copies.
            self.blobs.entry(b.id).or_insert(BlobLocation::new(n, b));
        }
    }

    /// Adds a pack of a pending-deletion record. Call after every live file: a blob
    /// with a live copy keeps it.
    pub fn add_pending_pack(&mut self, pack: PackId, blobs: &[IndexBlob]) {
        let n = self.pack_number(pack);
        for b in blobs {
            if !self.blobs.contains_key(&b.id) {
                self.pending.entry(b.id).or_insert(BlobLocation::new(n, b));
            }
        }
    }

    pub fn add_file(&mut self, file: &IndexFile) {
        for p in &file.packs {
            self.add_pack(p.id, &p.blobs);
        }
    }

    /// Where a blob can be read (live copy first, else a pending one).
    pub fn get(&self, id: &BlobId) -> Option<BlobLocation> {
        self.blobs.get(id).or_else(|| self.pending.get(id)).copied()
    }

    /// Whether a blob can be read.
    pub fn contains(&self, id: &BlobId) -> bool {
        self.blobs.contains_key(id) || self.pending.contains_key(id)
    }

    /// Whether a live index file lists the blob: only such blobs may be reused by a
    /// backup instead of storing them again.
    pub fn is_live(&self, id: &BlobId) -> bool {
        self.blobs.contains_key(id)
    }

    pub fn pack_of(&self, loc: &BlobLocation) -> PackId {
        self.packs[loc.pack as usize]
    }

    /// Number of the pack, stable for this index's lifetime; lets planners group by
    /// pack with a `u32` instead of a 32-byte id.
    pub fn pack_number_of(loc: &BlobLocation) -> u32 {
        loc.pack
    }

    pub fn pack_by_number(&self, n: u32) -> PackId {
        self.packs[n as usize]
    }

    pub fn packs(&self) -> &[PackId] {
        &self.packs
    }

    /// Every findable blob, live ones first.
    pub fn iter(&self) -> impl Iterator<Item = (&BlobId, &BlobLocation)> {
        self.blobs.iter().chain(self.pending.iter())
    }

    pub fn iter_live(&self) -> impl Iterator<Item = (&BlobId, &BlobLocation)> {
        self.blobs.iter()
    }
}
