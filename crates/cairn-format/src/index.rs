//! Index files: `index/<id>`, the persistent map blob id -> place in a pack.
//!
//! ```text
//! index  = version:u8 || nsup:varint || superseded index id:32 * nsup
//!          || npacks:varint || pack*npacks
//!          [version 2: || nann:varint || snapshot id:32 * nann
//!                      || nforgot:varint || snapshot id:32 * nforgot]
//! pack   = pack id:32 || nblobs:varint || blob*nblobs
//! blob   = kind:u8 || blob id:32 || offset:varint || length:varint
//!          || raw_length:varint || compression:u8
//! ```
//! The plaintext is sealed; the file name is BLAKE3 of the sealed bytes.

use crate::consts::*;
use crate::error::{Result, check_version};
use crate::id::{BlobId, IndexId, PackId, SnapshotId};
use crate::pack::{BlobCompression, BlobKind};
use crate::wire::{Reader, Writer};

#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct IndexBlob {
    pub kind: BlobKind,
    pub id: BlobId,
    pub offset: u32,
    pub length: u32,
    pub raw_length: u32,
    pub compression: BlobCompression,
}

impl IndexBlob {
    /// Index entries for a pack's header entries: blobs lie back to back from
    /// offset 0 in header order.
    pub fn from_header(entries: Vec<crate::pack::PackEntry>) -> Vec<IndexBlob> {
        let mut offset = 0u32;
        entries
            .into_iter()
            .map(|e| {
                let b = IndexBlob {
                    kind: e.kind,
                    id: e.id,
                    offset,
                    length: e.length,
                    raw_length: e.raw_length,
                    compression: e.compression,
                };
                offset = offset.saturating_add(e.length);
                b
            })
            .collect()
    }
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct IndexPack {
    pub id: PackId,
    pub blobs: Vec<IndexBlob>,
}

#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct IndexFile {
    /// Index files whose content this one replaces (written by prune/repair).
    pub supersedes: Vec<IndexId>,
    pub packs: Vec<IndexPack>,
    /// Snapshots that were committed (written after them by backup and repair), so
    /// that a snapshot object deleted from storage is noticed.
    pub snapshots: Vec<SnapshotId>,
    /// Snapshots removed on purpose (`forget`, `repair snapshots`).
    pub forgotten: Vec<SnapshotId>,
}

impl IndexFile {
    /// Blobs listed, over all packs.
    pub fn blob_count(&self) -> usize {
        self.packs.iter().map(|p| p.blobs.len()).sum()
    }

    pub fn encode(&self) -> Vec<u8> {
        let n: usize = self.packs.iter().map(|p| p.blobs.len()).sum();
        let mut w = Writer::with_capacity(16 + n * 48);
        // Version 1 unless the file carries snapshot records, so files of format 1
        // stay byte-identical.
        let v2 = !self.snapshots.is_empty() || !self.forgotten.is_empty();
        w.u8(if v2 {
            INDEX_VERSION_SNAPSHOTS
        } else {
            INDEX_VERSION
        });
        w.varint(self.supersedes.len() as u64);
        for s in &self.supersedes {
            w.raw(&s.0);
        }
        w.varint(self.packs.len() as u64);
        for p in &self.packs {
            w.raw(&p.id.0);
            w.varint(p.blobs.len() as u64);
            for b in &p.blobs {
                w.u8(b.kind as u8);
                w.raw(&b.id.0);
                w.varint(b.offset.into());
                w.varint(b.length.into());
                w.varint(b.raw_length.into());
                w.u8(b.compression as u8);
            }
        }
        if v2 {
            for list in [&self.snapshots, &self.forgotten] {
                w.varint(list.len() as u64);
                for id in list {
                    w.raw(&id.0);
                }
            }
        }
        w.into_inner()
    }

    pub fn decode(data: &[u8]) -> Result<Self> {
        let mut r = Reader::new(data, "index file");
        let v = r.u8()?;
        check_version(
            "index file",
            v.into(),
            INDEX_VERSION.into(),
            INDEX_VERSION_SNAPSHOTS.into(),
        )?;
        let ns = r.count(ID_LEN, usize::MAX)?;
        let mut supersedes = Vec::with_capacity(ns);
        for _ in 0..ns {
            supersedes.push(IndexId(r.array()?));
        }
        let np = r.count(ID_LEN + 1, usize::MAX)?;
        let mut packs = Vec::with_capacity(np);
        for _ in 0..np {
            let id = PackId(r.array()?);
            // Smallest blob entry: kind, id, three one-byte varints, compression.
            let nb = r.count(1 + ID_LEN + 3 + 1, MAX_PACK_BLOBS)?;
            let mut blobs = Vec::with_capacity(nb);
            for _ in 0..nb {
                let k = r.u8()?;
                let kind = BlobKind::from_u8(k).ok_or_else(|| r.malformed("unknown blob kind"))?;
                let id = BlobId(r.array()?);
                let offset = r.varint_u32()?;
                let length = r.varint_u32()?;
                let raw_length = r.varint_u32()?;
                let c = r.u8()?;
                let compression = BlobCompression::from_u8(c)
                    .ok_or_else(|| r.malformed("unknown compression"))?;
                // A sealed blob is its (possibly compressed) plaintext and an
                // envelope: never empty, never much over a blob's plaintext limit.
                if u64::from(offset) + u64::from(length) > MAX_PACK_SIZE
                    || length == 0
                    || length as usize > MAX_SEALED_BLOB_LEN
                    || raw_length as usize > MAX_BLOB_SIZE
                {
                    return Err(r.malformed("blob location out of range"));
                }
                blobs.push(IndexBlob {
                    kind,
                    id,
                    offset,
                    length,
                    raw_length,
                    compression,
                });
            }
            packs.push(IndexPack { id, blobs });
        }
        let mut lists = [Vec::new(), Vec::new()];
        if v == INDEX_VERSION_SNAPSHOTS {
            for list in &mut lists {
                let n = r.count(ID_LEN, usize::MAX)?;
                list.reserve(n);
                for _ in 0..n {
                    list.push(SnapshotId(r.array()?));
                }
            }
        }
        r.finish()?;
        let [snapshots, forgotten] = lists;
        Ok(IndexFile {
            supersedes,
            packs,
            snapshots,
            forgotten,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn blob() -> impl Strategy<Value = IndexBlob> {
        (
            0u8..3,
            any::<[u8; 32]>(),
            0u32..(1 << 29),
            1u32..(MAX_BLOB_SIZE as u32 + 1024),
            0u32..(MAX_BLOB_SIZE as u32),
            any::<bool>(),
        )
            .prop_map(|(k, id, offset, length, raw_length, z)| IndexBlob {
                kind: BlobKind::from_u8(k).unwrap(),
                id: BlobId(id),
                offset,
                length,
                raw_length,
                compression: if z {
                    BlobCompression::Zstd
                } else {
                    BlobCompression::Raw
                },
            })
    }

    #[test]
    fn smallest_entries_round_trip() {
        // Regression: the count check once assumed 38 bytes per blob entry, so an
        // index whose only blob had one-byte offset and lengths did not decode.
        let f = IndexFile {
            supersedes: vec![],
            packs: vec![IndexPack {
                id: PackId([1; 32]),
                blobs: vec![IndexBlob {
                    kind: BlobKind::Tree,
                    id: BlobId([2; 32]),
                    offset: 0,
                    length: 60,
                    raw_length: 20,
                    compression: BlobCompression::Raw,
                }],
            }],
            ..Default::default()
        };
        assert_eq!(IndexFile::decode(&f.encode()).unwrap(), f);
        assert_eq!(
            f.encode()[0],
            INDEX_VERSION,
            "no snapshot records: version 1"
        );
    }

    proptest! {
        #[test]
        fn round_trip(
            sup in proptest::collection::vec(any::<[u8; 32]>(), 0..3),
            packs in proptest::collection::vec((any::<[u8; 32]>(), proptest::collection::vec(blob(), 0..20)), 0..5),
            snaps in proptest::collection::vec(any::<[u8; 32]>(), 0..3),
            gone in proptest::collection::vec(any::<[u8; 32]>(), 0..3),
        ) {
            let f = IndexFile {
                supersedes: sup.into_iter().map(IndexId).collect(),
                packs: packs.into_iter().map(|(id, blobs)| IndexPack { id: PackId(id), blobs }).collect(),
                snapshots: snaps.iter().map(|s| SnapshotId(*s)).collect(),
                forgotten: gone.iter().map(|s| SnapshotId(*s)).collect(),
            };
            prop_assert_eq!(IndexFile::decode(&f.encode()).unwrap(), f);
        }

        #[test]
        fn decode_never_panics(data: Vec<u8>) {
            let _ = IndexFile::decode(&data);
        }
    }
}
