//! Dedup lists: `dedup/<index id>`, the plaintext companion of an index file.
//!
//! A cairn server has no key, so it cannot read index files; to answer "which of
//! these chunk ids do you hold?" it reads these lists instead. Each names the index
//! file it accompanies, the data-blob ids that file lists (blob ids are keyed
//! hashes: they say nothing about content to whoever lacks the key), whether the
//! file also lists trees or chunk lists (a client loads those files, and only
//! those, to read its parent snapshot), and, for an `admin-` index file, the index
//! files it supersedes, so the server drops what prune removed.
//!
//! ```text
//! dedup = magic "CAIRNDL1" || index id:32 || flags:u8 (bit 0 metadata, bit 1 admin)
//!         || nsup:varint || superseded index id:32 * nsup
//!         || nids:varint || data blob id:32 * nids (strictly ascending)
//!         || checksum: BLAKE3 of everything before:32
//! ```
//! The list is written after its index file (so a list never names ids that are not
//! indexed); `check` compares it with the file. The checksum finds bit rot without
//! a key; it does not authenticate (anyone with write access could compute it), so
//! a reader with the key trusts the index file, never the list.

use crate::consts::{ID_LEN, MAX_INDEX_FILE_SIZE};
use crate::error::Result;
use crate::id::{BlobId, IndexId};
use crate::wire::{Reader, Writer};

pub const DEDUP_MAGIC: &[u8; 8] = b"CAIRNDL1";
const FLAG_METADATA: u8 = 1;
const FLAG_ADMIN: u8 = 2;

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct DedupList {
    /// The index file this list accompanies.
    pub index: IndexId,
    /// The index file lists tree or chunk-list blobs too.
    pub metadata: bool,
    /// The index file is stored as `index/admin-<id>`.
    pub admin: bool,
    pub supersedes: Vec<IndexId>,
    /// Data blob ids, ascending, without repeats.
    pub ids: Vec<BlobId>,
}

impl DedupList {
    /// The list for an index file: its data blob ids sorted, its supersede list.
    pub fn of(index: IndexId, file: &crate::index::IndexFile, admin: bool) -> DedupList {
        let mut ids = Vec::with_capacity(file.blob_count());
        let mut metadata = false;
        for b in file.packs.iter().flat_map(|p| &p.blobs) {
            if b.kind == crate::pack::BlobKind::Data {
                ids.push(b.id);
            } else {
                metadata = true;
            }
        }
        ids.sort_unstable();
        ids.dedup();
        DedupList {
            index,
            metadata,
            admin,
            supersedes: file.supersedes.clone(),
            ids,
        }
    }

    pub fn encode(&self) -> Vec<u8> {
        let mut w = Writer::with_capacity(8 + 32 + 16 + 32 * (self.ids.len() + 1));
        w.raw(DEDUP_MAGIC);
        w.raw(&self.index.0);
        w.u8((u8::from(self.metadata) * FLAG_METADATA) | (u8::from(self.admin) * FLAG_ADMIN));
        w.varint(self.supersedes.len() as u64);
        for s in &self.supersedes {
            w.raw(&s.0);
        }
        w.varint(self.ids.len() as u64);
        for id in &self.ids {
            w.raw(&id.0);
        }
        let sum = blake3::hash(&w.buf);
        w.raw(sum.as_bytes());
        w.into_inner()
    }

    /// Decodes and checks a list: magic, checksum, ascending ids, bounded counts.
    pub fn decode(data: &[u8]) -> Result<DedupList> {
        let r = Reader::new(data, "dedup list");
        if data.len() > MAX_INDEX_FILE_SIZE {
            return Err(r.malformed("larger than an index file may be"));
        }
        if data.len() < DEDUP_MAGIC.len() + ID_LEN + 32 || &data[..8] != DEDUP_MAGIC {
            return Err(r.malformed("not a dedup list (magic)"));
        }
        let (body, sum) = data.split_at(data.len() - 32);
        if blake3::hash(body).as_bytes() != sum {
            return Err(r.malformed("checksum mismatch (damaged)"));
        }
        Self::decode_body(body)
    }

    /// The part before the checksum (the fuzzer's view of the format).
    pub(crate) fn decode_body(body: &[u8]) -> Result<DedupList> {
        let mut r = Reader::new(body, "dedup list");
        if r.take(DEDUP_MAGIC.len())? != DEDUP_MAGIC {
            return Err(r.malformed("not a dedup list (magic)"));
        }
        let index = IndexId(r.array()?);
        let flags = r.u8()?;
        if flags & !(FLAG_METADATA | FLAG_ADMIN) != 0 {
            return Err(r.malformed("unknown flags"));
        }
        let ns = r.count(ID_LEN, usize::MAX)?;
        let mut supersedes = Vec::with_capacity(ns);
        for _ in 0..ns {
            supersedes.push(IndexId(r.array()?));
        }
        let n = r.count(ID_LEN, usize::MAX)?;
        let mut ids: Vec<BlobId> = Vec::with_capacity(n);
        for _ in 0..n {
            let id = BlobId(r.array()?);
            if ids.last().is_some_and(|last| *last >= id) {
                return Err(r.malformed("ids not strictly ascending"));
            }
            ids.push(id);
        }
        r.finish()?;
        Ok(DedupList {
            index,
            metadata: flags & FLAG_METADATA != 0,
            admin: flags & FLAG_ADMIN != 0,
            supersedes,
            ids,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn round_trip_and_damage() {
        let l = DedupList {
            index: IndexId([7; 32]),
            metadata: true,
            admin: true,
            supersedes: vec![IndexId([1; 32])],
            ids: vec![BlobId([2; 32]), BlobId([3; 32])],
        };
        let enc = l.encode();
        assert_eq!(DedupList::decode(&enc).unwrap(), l);
        for i in [0, 9, 45, enc.len() - 1] {
            let mut bad = enc.clone();
            bad[i] ^= 1;
            assert!(DedupList::decode(&bad).is_err(), "flip at {i}");
        }
        assert!(DedupList::decode(&enc[..enc.len() - 1]).is_err());
        let unsorted = DedupList {
            ids: vec![BlobId([3; 32]), BlobId([2; 32])],
            ..l
        };
        assert!(DedupList::decode(&unsorted.encode()).is_err());
    }
}
