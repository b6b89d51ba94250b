//! Pack files: `data/<xx>/<pack id>`.
//!
//! ```text
//! pack    = blob_0 || blob_1 || ... || sealed(header) || header_len:u32le || "CAIRNPK1"
//! blob_i  = envelope of (raw or zstd-compressed) plaintext, in stream order
//! header  = version:u8 || count:varint || entry*count
//! entry   = kind:u8 || blob id:32 || length:u32le || raw_length:u32le || compression:u8
//! ```
//! Blob offsets are implicit: blob i starts where blob i-1 ended, blob 0 at offset 0.
//! The pack id is BLAKE3 of the whole file, so a pack can be checked without a key.

use crate::consts::*;
use crate::error::{FormatError, Result, check_version};
use crate::id::BlobId;
use crate::wire::{Reader, Writer};

/// What a blob holds.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
#[repr(u8)]
pub enum BlobKind {
    /// A chunk of file content.
    Data = 0,
    /// A directory listing.
    Tree = 1,
    /// A node of a file's chunk-list tree.
    ChunkList = 2,
}

impl BlobKind {
    pub fn from_u8(v: u8) -> Option<Self> {
        match v {
            0 => Some(BlobKind::Data),
            1 => Some(BlobKind::Tree),
            2 => Some(BlobKind::ChunkList),
            _ => None,
        }
    }
    pub fn name(self) -> &'static str {
        match self {
            BlobKind::Data => "data",
            BlobKind::Tree => "tree",
            BlobKind::ChunkList => "chunk list",
        }
    }
}

/// How a blob's plaintext was encoded before sealing.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[repr(u8)]
pub enum BlobCompression {
    Raw = 0,
    Zstd = 1,
}

impl BlobCompression {
    pub fn from_u8(v: u8) -> Option<Self> {
        match v {
            0 => Some(BlobCompression::Raw),
            1 => Some(BlobCompression::Zstd),
            _ => None,
        }
    }
}

/// One blob as described by a pack header.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct PackEntry {
    pub kind: BlobKind,
    pub id: BlobId,
    /// Sealed length in the pack.
    pub length: u32,
    /// Plaintext length after decompression.
    pub raw_length: u32,
    pub compression: BlobCompression,
}

pub fn encode_header(entries: &[PackEntry]) -> Vec<u8> {
    let mut w = Writer::with_capacity(8 + entries.len() * PACK_HEADER_ENTRY_LEN);
    w.u8(PACK_HEADER_VERSION);
    w.varint(entries.len() as u64);
    for e in entries {
        w.u8(e.kind as u8);
        w.raw(&e.id.0);
        w.u32(e.length);
        w.u32(e.raw_length);
        w.u8(e.compression as u8);
    }
    w.into_inner()
}

pub fn decode_header(data: &[u8]) -> Result<Vec<PackEntry>> {
    let mut r = Reader::new(data, "pack header");
    let v = r.u8()?;
    let newest = PACK_HEADER_VERSION.into();
    check_version("pack header", v.into(), newest, newest)?;
    let n = r.count(PACK_HEADER_ENTRY_LEN, MAX_PACK_BLOBS)?;
    let mut out = Vec::with_capacity(n);
    // Where the next blob starts: blobs lie back to back from offset 0.
    let mut offset = 0u64;
    for _ in 0..n {
        let kind = r.u8()?;
        let kind = BlobKind::from_u8(kind).ok_or_else(|| r.malformed("unknown blob kind"))?;
        let id = BlobId(r.array()?);
        let length = r.u32()?;
        let raw_length = r.u32()?;
        let c = r.u8()?;
        let compression =
            BlobCompression::from_u8(c).ok_or_else(|| r.malformed("unknown compression"))?;
        if raw_length as usize > MAX_BLOB_SIZE {
            return Err(r.malformed("blob raw length exceeds limit"));
        }
        // The limits an index file has for the same blob, so that an index built
        // from an accepted header (prune, `repair index`) is accepted too.
        offset += u64::from(length);
        if length == 0 || length as usize > MAX_SEALED_BLOB_LEN || offset > MAX_PACK_SIZE {
            return Err(r.malformed("blob length out of range"));
        }
        out.push(PackEntry {
            kind,
            id,
            length,
            raw_length,
            compression,
        });
    }
    r.finish()?;
    Ok(out)
}

/// Appends the trailer after the sealed header.
pub fn encode_trailer(sealed_header_len: u32) -> [u8; PACK_TRAILER_LEN] {
    let mut t = [0u8; PACK_TRAILER_LEN];
    t[..4].copy_from_slice(&sealed_header_len.to_le_bytes());
    t[4..].copy_from_slice(PACK_TRAILER_MAGIC);
    t
}

/// Given the pack's total size and its last `PACK_TRAILER_LEN` bytes, returns the
/// (offset, length) of the sealed header.
pub fn parse_trailer(pack_size: u64, trailer: &[u8]) -> Result<(u64, u32)> {
    if trailer.len() != PACK_TRAILER_LEN || pack_size < PACK_TRAILER_LEN as u64 {
        return Err(FormatError::Truncated { what: "pack" });
    }
    if &trailer[4..] != PACK_TRAILER_MAGIC {
        return Err(FormatError::malformed("pack", "bad trailer magic"));
    }
    let mut l = [0u8; 4];
    l.copy_from_slice(&trailer[..4]);
    let len = u32::from_le_bytes(l);
    let avail = pack_size - PACK_TRAILER_LEN as u64;
    if u64::from(len) > avail {
        return Err(FormatError::malformed(
            "pack",
            "header length exceeds pack size",
        ));
    }
    Ok((avail - u64::from(len), len))
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn entry() -> impl Strategy<Value = PackEntry> {
        (
            0u8..3,
            any::<[u8; 32]>(),
            prop_oneof![1u32..2_000_000, Just(1), Just(MAX_SEALED_BLOB_LEN as u32)],
            0u32..(MAX_BLOB_SIZE as u32),
            any::<bool>(),
        )
            .prop_map(|(k, id, length, raw_length, z)| PackEntry {
                kind: BlobKind::from_u8(k).unwrap(),
                id: BlobId(id),
                length,
                raw_length,
                compression: if z {
                    BlobCompression::Zstd
                } else {
                    BlobCompression::Raw
                },
            })
    }

    fn one(length: u32) -> PackEntry {
        PackEntry {
            kind: BlobKind::Data,
            id: BlobId([1; 32]),
            length,
            raw_length: 10,
            compression: BlobCompression::Raw,
        }
    }

    #[test]
    fn header_entries_have_the_limits_of_index_entries() {
        // Found by the fuzzer: a header with a zero-length blob, a blob over the
        // sealed-blob cap or blobs past 1 GiB decoded, but the index file that prune
        // or `repair index` writes from it would be refused by every reader.
        for bad in [
            vec![one(0)],
            vec![one(MAX_SEALED_BLOB_LEN as u32 + 1)],
            vec![one(MAX_SEALED_BLOB_LEN as u32); 17],
        ] {
            assert!(decode_header(&encode_header(&bad)).is_err(), "{bad:?}");
        }
        let ok = vec![one(MAX_SEALED_BLOB_LEN as u32); 15];
        assert_eq!(decode_header(&encode_header(&ok)).unwrap(), ok);
    }

    proptest! {
        #[test]
        fn header_round_trip(entries in proptest::collection::vec(entry(), 0..15)) {
            let enc = encode_header(&entries);
            prop_assert_eq!(decode_header(&enc).unwrap(), entries);
        }

        #[test]
        fn header_decode_never_panics(data: Vec<u8>) {
            let _ = decode_header(&data);
        }

        #[test]
        fn trailer_round_trip(header_len: u32, blobs in 0u64..(1 << 40)) {
            let size = blobs + u64::from(header_len) + PACK_TRAILER_LEN as u64;
            let t = encode_trailer(header_len);
            prop_assert_eq!(parse_trailer(size, &t).unwrap(), (blobs, header_len));
        }

        #[test]
        fn trailer_never_panics(size: u64, data in proptest::collection::vec(any::<u8>(), 0..20)) {
            let _ = parse_trailer(size, &data);
        }
    }
}
