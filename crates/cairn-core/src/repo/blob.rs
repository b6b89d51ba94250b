//! Encoding one blob for a pack (compress, then seal) and decoding it back (open,
//! decompress, verify that the plaintext hashes to the id it was stored under).

use crate::error::{Error, Result};
use cairn_format::consts::MAX_BLOB_SIZE;
use cairn_format::key::MasterKey;
use cairn_format::pack::{BlobCompression, BlobKind};
use cairn_format::{BlobId, FormatError};

/// A blob ready to be appended to a pack.
#[derive(Debug)]
pub struct EncodedBlob {
    pub kind: BlobKind,
    pub id: BlobId,
    pub sealed: Vec<u8>,
    pub raw_length: u32,
    pub compression: BlobCompression,
}

/// Per-thread compression state (a zstd context is expensive to create).
pub struct BlobEncoder {
    level: Option<i32>,
    compressor: Option<zstd::bulk::Compressor<'static>>,
    scratch: Vec<u8>,
}

impl BlobEncoder {
    pub fn new(level: Option<i32>) -> Self {
        BlobEncoder {
            level,
            compressor: None,
            scratch: Vec::new(),
        }
    }

    /// Compresses when that saves at least 1/32 of the bytes (otherwise the blob is
    /// stored raw and restore skips decompression), then seals.
    pub fn encode(
        &mut self,
        key: &MasterKey,
        kind: BlobKind,
        id: BlobId,
        plaintext: &[u8],
    ) -> Result<EncodedBlob> {
        let mut compression = BlobCompression::Raw;
        if let Some(level) = self.level
            && plaintext.len() >= 64
        {
            if self.compressor.is_none() {
                self.compressor = Some(
                    zstd::bulk::Compressor::new(level)
                        .map_err(|e| Error::Invalid(format!("zstd init: {e}")))?,
                );
            }
            if let Some(c) = self.compressor.as_mut() {
                let bound = zstd::zstd_safe::compress_bound(plaintext.len());
                self.scratch.clear();
                self.scratch.reserve(bound);
                if let Ok(n) = c.compress_to_buffer(plaintext, &mut self.scratch)
                    && n + n / 32 < plaintext.len()
                {
                    compression = BlobCompression::Zstd;
                }
            }
        }
        let body: &[u8] = match compression {
            BlobCompression::Zstd => &self.scratch,
            BlobCompression::Raw => plaintext,
        };
        Ok(EncodedBlob {
            kind,
            id,
            sealed: key.sealer.seal(body),
            raw_length: plaintext.len() as u32,
            compression,
        })
    }
}

thread_local! {
    /// A zstd decompression context per thread: creating one costs more than
    /// decompressing a 16 KiB chunk.
    static DECOMPRESSOR: std::cell::RefCell<Option<zstd::bulk::Decompressor<'static>>> =
        const { std::cell::RefCell::new(None) };
}

/// Opens a sealed blob and checks its id. `what` names it in errors.
pub fn decode(
    key: &MasterKey,
    id: &BlobId,
    sealed: &[u8],
    raw_length: u32,
    compression: BlobCompression,
) -> Result<Vec<u8>> {
    let what = || format!("blob {}", id.short());
    let opened = key
        .sealer
        .open("blob", sealed)
        .map_err(|e| Error::damaged(what(), e))?;
    let plain = match compression {
        BlobCompression::Raw => opened,
        BlobCompression::Zstd => decompress(id, &opened, raw_length)?,
    };
    check(key, id, &plain, raw_length)?;
    Ok(plain)
}

/// A blob decoded by [`decode_in_place`].
pub enum Plain {
    /// The plaintext lies in the sealed buffer, here (a blob stored raw).
    At(std::ops::Range<usize>),
    /// Decompressed into a buffer of its own.
    Owned(Vec<u8>),
}

impl Plain {
    /// The plaintext; `sealed` is the buffer [`decode_in_place`] was given.
    pub fn bytes<'a>(&'a self, sealed: &'a [u8]) -> &'a [u8] {
        match self {
            Plain::At(r) => &sealed[r.clone()],
            Plain::Owned(v) => v,
        }
    }
}

/// [`decode`] without copying the sealed blob first: it is decrypted where it lies
/// (a restore's range read, which is not needed afterwards). `sealed` holds garbage
/// after an error.
pub fn decode_in_place(
    key: &MasterKey,
    id: &BlobId,
    sealed: &mut [u8],
    raw_length: u32,
    compression: BlobCompression,
) -> Result<Plain> {
    let at = key
        .sealer
        .open_in_place("blob", sealed)
        .map_err(|e| Error::damaged(format!("blob {}", id.short()), e))?;
    let plain = match compression {
        BlobCompression::Raw => Plain::At(at),
        BlobCompression::Zstd => Plain::Owned(decompress(id, &sealed[at], raw_length)?),
    };
    check(key, id, plain.bytes(sealed), raw_length)?;
    Ok(plain)
}

fn decompress(id: &BlobId, opened: &[u8], raw_length: u32) -> Result<Vec<u8>> {
    let cap = (raw_length as usize).min(MAX_BLOB_SIZE);
    DECOMPRESSOR
        .with(|d| {
            let mut d = d.borrow_mut();
            if d.is_none() {
                *d = Some(zstd::bulk::Decompressor::new()?);
            }
            match d.as_mut() {
                Some(d) => d.decompress(opened, cap),
                None => Err(std::io::Error::other("no decompressor")),
            }
        })
        .map_err(|e| {
            Error::damaged(
                format!("blob {}", id.short()),
                FormatError::malformed("blob", format!("zstd: {e}")),
            )
        })
}

/// The decoded blob must have the length the index gives and hash to its id.
fn check(key: &MasterKey, id: &BlobId, plain: &[u8], raw_length: u32) -> Result<()> {
    let what = || format!("blob {}", id.short());
    if plain.len() != raw_length as usize {
        return Err(Error::damaged(
            what(),
            FormatError::malformed("blob", "length differs from the index"),
        ));
    }
    if key.blob_id(plain) != *id {
        return Err(Error::damaged(
            what(),
            FormatError::IdMismatch {
                expected: id.to_hex(),
            },
        ));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use cairn_format::envelope::Encryption;

    #[test]
    fn round_trip_compressible_and_not() {
        let key = MasterKey::generate(Encryption::Aes256Gcm);
        let mut enc = BlobEncoder::new(Some(3));
        let text = b"hello world ".repeat(1000);
        let random: Vec<u8> = (0..5000u32)
            .map(|i| (i.wrapping_mul(2654435761) >> 13) as u8)
            .collect();
        for data in [&text[..], &random[..], b""] {
            let id = key.blob_id(data);
            let b = enc.encode(&key, BlobKind::Data, id, data).unwrap();
            let back = decode(&key, &id, &b.sealed, b.raw_length, b.compression).unwrap();
            assert_eq!(back, data);
            let mut sealed = b.sealed.clone();
            let plain =
                decode_in_place(&key, &id, &mut sealed, b.raw_length, b.compression).unwrap();
            assert_eq!(plain.bytes(&sealed), data);
        }
        let id = key.blob_id(&text);
        assert_eq!(
            enc.encode(&key, BlobKind::Data, id, &text)
                .unwrap()
                .compression,
            BlobCompression::Zstd
        );
    }

    #[test]
    fn wrong_id_is_detected() {
        let key = MasterKey::generate(Encryption::None);
        let mut enc = BlobEncoder::new(None);
        let id = key.blob_id(b"abc");
        let b = enc.encode(&key, BlobKind::Data, id, b"abc").unwrap();
        let other = key.blob_id(b"abd");
        assert!(decode(&key, &other, &b.sealed, 3, b.compression).is_err());
        let mut sealed = b.sealed.clone();
        assert!(decode_in_place(&key, &other, &mut sealed, 3, b.compression).is_err());
        let mut sealed = b.sealed.clone();
        assert!(decode_in_place(&key, &id, &mut sealed, 4, b.compression).is_err());
    }
}
