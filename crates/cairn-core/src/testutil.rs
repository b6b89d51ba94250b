//! Helpers for unit tests that need a small repository.

use crate::repo::blob::BlobEncoder;
use crate::repo::packer::{BufferPool, Packer, SealedPack};
use crate::repo::{InitOptions, Repository};
use cairn_backend::MemBackend;
use cairn_format::index::IndexPack;
use cairn_format::pack::BlobKind;
use std::sync::Arc;

/// An unencrypted repository in memory (no key derivation: fast).
pub fn mem_repo() -> Repository {
    let opts = InitOptions {
        encryption: false,
        ..InitOptions::default()
    };
    Repository::init(Arc::new(MemBackend::new()), None, &opts).unwrap()
}

/// Seals blobs into one pack (not stored).
pub fn seal(repo: &Repository, blobs: &[(BlobKind, Vec<u8>)]) -> SealedPack {
    let mut enc = BlobEncoder::new(None);
    let mut packer = Packer::new(repo.key().clone(), Arc::new(BufferPool::new(1)), 1 << 20);
    for (kind, data) in blobs {
        let id = repo.key().blob_id(data);
        packer.add(enc.encode(repo.key(), *kind, id, data).unwrap());
    }
    packer.finish().unwrap()
}

/// Stores blobs in one pack; returns its index entry (not yet indexed).
pub fn store(repo: &Repository, blobs: &[(BlobKind, Vec<u8>)]) -> IndexPack {
    let p = seal(repo, blobs);
    repo.backend()
        .put(&cairn_backend::names::pack(&p.id.to_hex()), p.bytes())
        .unwrap();
    IndexPack {
        id: p.id,
        blobs: p.blobs,
    }
}
