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
//! Format 2 also names each pack the file lists, where the pack's last indexed
//! blob ends, and which of the data ids that pack holds: with those, a server can
//! notice a pack that was deleted or cut short behind its back (its listing lacks
//! it, or shows it shorter) and stop answering "stored" for what only that pack
//! held (QA r28: a backup through the server said "saved" over a deleted pack).
//!
//! ```text
//! dedup v1 = magic "CAIRNDL1" || index id:32 || flags:u8 (bit 0 metadata, bit 1 admin)
//!            || nsup:varint || superseded index id:32 * nsup
//!            || nids:varint || data blob id:32 * nids (strictly ascending)
//!            || checksum: BLAKE3 of everything before:32
//! dedup v2 = magic "CAIRNDL2" || index id:32 || flags:u8 || nsup:varint
//!            || superseded index id:32 * nsup
//!            || npacks:varint || pack * npacks || checksum:32
//! pack     = pack id:32 || end:varint || nids:varint
//!            || data blob id:32 * nids (strictly ascending within the pack)
//! ```
//! The list is written after its index file (so a list never names ids that are not
//! indexed); `check` compares it with the file. The checksum finds bit rot without
//! a key; it does not authenticate (anyone with write access could compute it), so
//! a reader with the key trusts the index file, never the list.

use crate::consts::{ID_LEN, MAX_INDEX_FILE_SIZE, MAX_PACK_SIZE};
use crate::error::Result;
use crate::id::{BlobId, IndexId, PackId};
use crate::wire::{Reader, Writer};

/// Format 1 (no packs named): still read, never written.
pub const DEDUP_MAGIC_V1: &[u8; 8] = b"CAIRNDL1";
/// Format 2, with each pack's id, end and data ids.
pub const DEDUP_MAGIC: &[u8; 8] = b"CAIRNDL2";
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
    /// Data blob ids, ascending, without repeats (over every pack).
    pub ids: Vec<BlobId>,
    /// The packs the index file lists, in its order, with their data ids; `None`:
    /// a list of format 1, which names no packs.
    pub packs: Option<Vec<DedupPack>>,
}

/// One pack of a format-2 list.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct DedupPack {
    pub id: PackId,
    /// Where the pack's last blob the index file lists ends: a stored pack
    /// shorter than this was cut short.
    pub end: u64,
    /// The data blob ids the index file places in this pack, ascending, without
    /// repeats (empty for a pack of trees or chunk lists).
    pub ids: Vec<BlobId>,
}

impl DedupList {
    /// The list for an index file: its packs with their data blob ids sorted, its
    /// supersede list.
    pub fn of(index: IndexId, file: &crate::index::IndexFile, admin: bool) -> DedupList {
        let mut metadata = false;
        let mut packs = Vec::with_capacity(file.packs.len());
        for p in &file.packs {
            let mut ids = Vec::with_capacity(p.blobs.len());
            let mut end = 0u64;
            for b in &p.blobs {
                end = end.max(u64::from(b.offset) + u64::from(b.length));
                if b.kind == crate::pack::BlobKind::Data {
                    ids.push(b.id);
                } else {
                    metadata = true;
                }
            }
            ids.sort_unstable();
            ids.dedup();
            packs.push(DedupPack { id: p.id, end, ids });
        }
        DedupList {
            index,
            metadata,
            admin,
            supersedes: file.supersedes.clone(),
            ids: all_ids(&packs),
            packs: Some(packs),
        }
    }

    pub fn encode(&self) -> Vec<u8> {
        let n = self.packs.as_ref().map_or(self.ids.len(), |p| {
            p.iter().map(|p| p.ids.len() + 2).sum::<usize>()
        });
        let mut w = Writer::with_capacity(8 + 32 + 16 + 32 * (n + self.supersedes.len() + 1));
        w.raw(match self.packs {
            Some(_) => DEDUP_MAGIC,
            None => DEDUP_MAGIC_V1,
        });
        w.raw(&self.index.0);
        w.u8((u8::from(self.metadata) * FLAG_METADATA) | (u8::from(self.admin) * FLAG_ADMIN));
        w.varint(self.supersedes.len() as u64);
        for s in &self.supersedes {
            w.raw(&s.0);
        }
        let ids = |w: &mut Writer, ids: &[BlobId]| {
            w.varint(ids.len() as u64);
            for id in ids {
                w.raw(&id.0);
            }
        };
        match &self.packs {
            None => ids(&mut w, &self.ids),
            Some(packs) => {
                w.varint(packs.len() as u64);
                for p in packs {
                    w.raw(&p.id.0);
                    w.varint(p.end);
                    ids(&mut w, &p.ids);
                }
            }
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
        if data.len() < DEDUP_MAGIC.len() + ID_LEN + 32
            || (&data[..8] != DEDUP_MAGIC && &data[..8] != DEDUP_MAGIC_V1)
        {
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
        let v2 = match r.take(DEDUP_MAGIC.len())? {
            m if m == DEDUP_MAGIC => true,
            m if m == DEDUP_MAGIC_V1 => false,
            _ => return Err(r.malformed("not a dedup list (magic)")),
        };
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
        let ascending = |r: &mut Reader| -> Result<Vec<BlobId>> {
            let n = r.count(ID_LEN, usize::MAX)?;
            let mut ids: Vec<BlobId> = Vec::with_capacity(n);
            for _ in 0..n {
                let id = BlobId(r.array()?);
                if ids.last().is_some_and(|last| *last >= id) {
                    return Err(r.malformed("ids not strictly ascending"));
                }
                ids.push(id);
            }
            Ok(ids)
        };
        let (ids, packs) = if v2 {
            // A pack takes 34 bytes at least (id, end, count).
            let np = r.count(ID_LEN + 2, usize::MAX)?;
            let mut packs = Vec::with_capacity(np);
            for _ in 0..np {
                let id = PackId(r.array()?);
                let end = r.varint()?;
                if end > MAX_PACK_SIZE {
                    return Err(r.malformed("a pack ends past the largest pack size"));
                }
                let ids = ascending(&mut r)?;
                packs.push(DedupPack { id, end, ids });
            }
            (all_ids(&packs), Some(packs))
        } else {
            (ascending(&mut r)?, None)
        };
        r.finish()?;
        Ok(DedupList {
            index,
            metadata: flags & FLAG_METADATA != 0,
            admin: flags & FLAG_ADMIN != 0,
            supersedes,
            ids,
            packs,
        })
    }
}

/// Every pack's data ids, ascending, without repeats (a blob stored twice is in
/// two packs).
fn all_ids(packs: &[DedupPack]) -> Vec<BlobId> {
    let mut ids: Vec<BlobId> = packs.iter().flat_map(|p| p.ids.iter().copied()).collect();
    ids.sort_unstable();
    ids.dedup();
    ids
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn round_trip_and_damage() {
        let v1 = DedupList {
            index: IndexId([7; 32]),
            metadata: true,
            admin: true,
            supersedes: vec![IndexId([1; 32])],
            ids: vec![BlobId([2; 32]), BlobId([3; 32])],
            packs: None,
        };
        // A blob stored twice is in two packs, once in the ids.
        let v2 = DedupList {
            ids: vec![BlobId([2; 32]), BlobId([3; 32]), BlobId([4; 32])],
            packs: Some(vec![
                DedupPack {
                    id: PackId([8; 32]),
                    end: 5000,
                    ids: vec![BlobId([3; 32]), BlobId([4; 32])],
                },
                DedupPack {
                    id: PackId([9; 32]),
                    end: 70,
                    ids: vec![],
                },
                DedupPack {
                    id: PackId([10; 32]),
                    end: MAX_PACK_SIZE,
                    ids: vec![BlobId([2; 32]), BlobId([3; 32])],
                },
            ]),
            ..v1.clone()
        };
        for l in [v1, v2] {
            let enc = l.encode();
            assert_eq!(DedupList::decode(&enc).unwrap(), l);
            for i in [0, 7, 9, 45, enc.len() - 1] {
                let mut bad = enc.clone();
                bad[i] ^= 1;
                assert!(DedupList::decode(&bad).is_err(), "flip at {i}");
            }
            assert!(DedupList::decode(&enc[..enc.len() - 1]).is_err());
        }
        let unsorted = DedupList {
            index: IndexId([7; 32]),
            metadata: false,
            admin: false,
            supersedes: vec![],
            ids: vec![BlobId([3; 32]), BlobId([2; 32])],
            packs: None,
        };
        assert!(DedupList::decode(&unsorted.encode()).is_err());
        let in_a_pack = DedupList {
            packs: Some(vec![DedupPack {
                id: PackId([8; 32]),
                end: 10,
                ids: vec![BlobId([3; 32]), BlobId([2; 32])],
            }]),
            ..unsorted.clone()
        };
        assert!(DedupList::decode(&in_a_pack.encode()).is_err());
        let too_far = DedupList {
            packs: Some(vec![DedupPack {
                id: PackId([8; 32]),
                end: MAX_PACK_SIZE + 1,
                ids: vec![],
            }]),
            ..unsorted
        };
        let e = DedupList::decode(&too_far.encode())
            .unwrap_err()
            .to_string();
        assert!(e.contains("largest pack size"), "{e}");
    }

    /// A list of an index file names its packs, their ends and which data ids
    /// each holds; trees make the file a metadata one and are not named.
    #[test]
    fn of_an_index_file() {
        use crate::index::{IndexBlob, IndexFile, IndexPack};
        use crate::pack::{BlobCompression, BlobKind};
        let blob = |kind, id: u8, offset, length| IndexBlob {
            kind,
            id: BlobId([id; 32]),
            offset,
            length,
            raw_length: length,
            compression: BlobCompression::Raw,
        };
        let file = IndexFile {
            packs: vec![
                IndexPack {
                    id: PackId([1; 32]),
                    blobs: vec![
                        blob(BlobKind::Data, 5, 0, 10),
                        blob(BlobKind::Data, 4, 10, 20),
                    ],
                },
                IndexPack {
                    id: PackId([2; 32]),
                    blobs: vec![blob(BlobKind::Tree, 6, 100, 7)],
                },
            ],
            ..Default::default()
        };
        let l = DedupList::of(IndexId([3; 32]), &file, false);
        assert!(l.metadata);
        assert_eq!(l.ids, vec![BlobId([4; 32]), BlobId([5; 32])]);
        let packs = l.packs.unwrap();
        assert_eq!(
            packs
                .iter()
                .map(|p| (p.id, p.end, p.ids.len()))
                .collect::<Vec<_>>(),
            vec![(PackId([1; 32]), 30, 2), (PackId([2; 32]), 107, 0)]
        );
    }
}
