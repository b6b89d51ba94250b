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

#[derive(Default)]
pub struct MasterIndex {
    packs: Vec<PackId>,
    pack_numbers: HashMap<PackId, u32>,
    blobs: IdMap<BlobLocation>,
}

impl MasterIndex {
    pub fn new() -> Self {
        Self::default()
    }

    pub fn len(&self) -> usize {
        self.blobs.len()
    }
    pub fn is_empty(&self) -> bool {
        self.blobs.is_empty()
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
            self.blobs.entry(b.id).or_insert(BlobLocation {
                pack: n,
                offset: b.offset,
                length: b.length,
                raw_length: b.raw_length,
                kind: b.kind,
                compression: b.compression,
            });
        }
    }

    pub fn add_file(&mut self, file: &IndexFile) {
        for p in &file.packs {
            self.add_pack(p.id, &p.blobs);
        }
    }

    pub fn get(&self, id: &BlobId) -> Option<BlobLocation> {
        self.blobs.get(id).copied()
    }

    pub fn contains(&self, id: &BlobId) -> bool {
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

    pub fn iter(&self) -> impl Iterator<Item = (&BlobId, &BlobLocation)> {
        self.blobs.iter()
    }
}
