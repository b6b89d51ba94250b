//! Pending deletions: `pending/<id>`, written by prune. A record names packs that
//! prune took out of the index (with their entries, so readers can still find blobs
//! in them) and unindexed packs it found, plus the locks that were held when it did
//! so. The packs are deleted by a later step only after every one of those locks is
//! gone and a fresh look at the snapshots shows nothing needs them (docs/FORMAT.md,
//! "Prune and concurrent writers").
//!
//! ```text
//! pending = version:u8 || created:zigzag || nlocks:varint || lock id:32 * nlocks
//!           || index:bytes || norphans:varint || pack id:32 * norphans
//! ```
//! `index` is an index file's plaintext listing the removed packs. Sealed like every
//! object; the name is BLAKE3 of the sealed bytes.

use crate::consts::*;
use crate::error::{Result, check_version};
use crate::id::PackId;
use crate::index::{IndexFile, IndexPack};
use crate::wire::{Reader, Writer};

pub const PENDING_VERSION: u8 = 1;

#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct PendingDeletion {
    /// Unix seconds when prune wrote the record (informational only: the deletion
    /// rule depends on locks, not clocks).
    pub created: i64,
    /// Lock ids present right after prune replaced the index.
    pub locks: Vec<[u8; 32]>,
    /// Packs taken out of the index, with the entries they had.
    pub packs: Vec<IndexPack>,
    /// Packs no index listed when prune looked.
    pub orphans: Vec<PackId>,
}

impl PendingDeletion {
    pub fn encode(&self) -> Vec<u8> {
        let mut w = Writer::with_capacity(64);
        w.u8(PENDING_VERSION);
        w.varint_i64(self.created);
        w.varint(self.locks.len() as u64);
        for l in &self.locks {
            w.raw(l);
        }
        let inner = IndexFile {
            packs: self.packs.clone(),
            ..Default::default()
        }
        .encode();
        w.bytes(&inner);
        w.varint(self.orphans.len() as u64);
        for o in &self.orphans {
            w.raw(&o.0);
        }
        w.into_inner()
    }

    pub fn decode(data: &[u8]) -> Result<Self> {
        let mut r = Reader::new(data, "pending deletion");
        let v = r.u8()?;
        let newest = PENDING_VERSION.into();
        check_version("pending deletion", v.into(), newest, newest)?;
        let created = r.varint_i64()?;
        let nl = r.count(ID_LEN, usize::MAX)?;
        let mut locks = Vec::with_capacity(nl);
        for _ in 0..nl {
            locks.push(r.array()?);
        }
        // No cap beyond the record itself: the index of a large prune may exceed the
        // metadata object cap (256 MiB is about 6 million blob entries), and `bytes`
        // only borrows from the input, so nothing is allocated for it here.
        let inner = r.bytes(usize::MAX)?;
        let index = IndexFile::decode(inner)?;
        if !index.supersedes.is_empty() {
            return Err(r.malformed("pending deletion lists superseded index files"));
        }
        let no = r.count(ID_LEN, usize::MAX)?;
        let mut orphans = Vec::with_capacity(no);
        for _ in 0..no {
            orphans.push(PackId(r.array()?));
        }
        r.finish()?;
        Ok(PendingDeletion {
            created,
            locks,
            packs: index.packs,
            orphans,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::BlobId;
    use crate::index::IndexBlob;
    use crate::pack::{BlobCompression, BlobKind};
    use proptest::prelude::*;

    #[test]
    fn round_trip() {
        let p = PendingDeletion {
            created: 1_700_000_000,
            locks: vec![[7; 32], [9; 32]],
            packs: vec![IndexPack {
                id: PackId([1; 32]),
                blobs: vec![IndexBlob {
                    kind: BlobKind::Data,
                    id: BlobId([2; 32]),
                    offset: 0,
                    length: 100,
                    raw_length: 80,
                    compression: BlobCompression::Zstd,
                }],
            }],
            orphans: vec![PackId([3; 32])],
        };
        assert_eq!(PendingDeletion::decode(&p.encode()).unwrap(), p);
        let empty = PendingDeletion::default();
        assert_eq!(PendingDeletion::decode(&empty.encode()).unwrap(), empty);
    }

    fn index_blob() -> impl Strategy<Value = IndexBlob> {
        (
            0u8..3,
            any::<[u8; 32]>(),
            0u32..(1 << 29),
            1u32..(1 << 20),
            any::<u32>(),
            any::<bool>(),
        )
            .prop_map(|(k, id, offset, length, raw, z)| IndexBlob {
                kind: BlobKind::from_u8(k).unwrap(),
                id: BlobId(id),
                offset,
                length,
                raw_length: raw % (MAX_BLOB_SIZE as u32 + 1),
                compression: if z {
                    BlobCompression::Zstd
                } else {
                    BlobCompression::Raw
                },
            })
    }

    proptest! {
        #[test]
        fn round_trips(
            created: i64,
            locks in proptest::collection::vec(any::<[u8; 32]>(), 0..4),
            packs in proptest::collection::vec(
                (any::<[u8; 32]>(), proptest::collection::vec(index_blob(), 0..6)),
                0..4,
            ),
            orphans in proptest::collection::vec(any::<[u8; 32]>(), 0..4),
        ) {
            let p = PendingDeletion {
                created,
                locks,
                packs: packs
                    .into_iter()
                    .map(|(id, blobs)| IndexPack { id: PackId(id), blobs })
                    .collect(),
                orphans: orphans.into_iter().map(PackId).collect(),
            };
            prop_assert_eq!(PendingDeletion::decode(&p.encode()).unwrap(), p);
        }

        #[test]
        fn decode_never_panics(data: Vec<u8>) {
            let _ = PendingDeletion::decode(&data);
        }
    }
}
