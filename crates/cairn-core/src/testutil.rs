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
    let encoded: Vec<_> = blobs
        .iter()
        .map(|(kind, data)| {
            let id = repo.key().blob_id(data);
            enc.encode(repo.key(), *kind, id, data).unwrap()
        })
        .collect();
    // A target past all of them: one pack however many bytes.
    let total = encoded.iter().map(|b| b.sealed.len()).sum::<usize>() + 1;
    let mut packer = Packer::new(repo.key().clone(), Arc::new(BufferPool::new(1)), total);
    for b in encoded {
        assert!(
            packer.add(b).is_none(),
            "the pack filled before its last blob"
        );
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

/// Stores blobs in one pack, indexes it and loads the index: the blobs are
/// readable as a backup's would be.
pub fn store_indexed(repo: &mut Repository, blobs: &[(BlobKind, Vec<u8>)]) {
    let pack = store(repo, blobs);
    repo.write_index_file(&cairn_format::index::IndexFile {
        packs: vec![pack],
        ..Default::default()
    })
    .unwrap();
    repo.load_index_in_ram().unwrap();
}

/// A file of `n` chunks of varying lengths (no byte of them 0) with a chunk-list
/// tree of `fanout` entries a list, nothing stored: the data blobs, the
/// chunk-list blobs with their levels, the file's content and its bytes.
#[allow(clippy::type_complexity)]
pub fn file_with_lists(
    repo: &Repository,
    n: usize,
    fanout: usize,
) -> (
    Vec<(BlobKind, Vec<u8>)>,
    Vec<(u8, Vec<u8>)>,
    cairn_format::tree::Content,
    Vec<u8>,
) {
    use cairn_format::tree::{ChunkList, ChunkRef};
    let (mut blobs, mut bytes, mut refs) = (Vec::new(), Vec::new(), Vec::new());
    for i in 0..n {
        let chunk: Vec<u8> = (0..(i * 37 % 97 + 3))
            .map(|j| (i * 7 + j) as u8 | 1)
            .collect();
        refs.push(ChunkRef {
            id: repo.key().blob_id(&chunk),
            length: chunk.len() as u64,
        });
        bytes.extend_from_slice(&chunk);
        blobs.push((BlobKind::Data, chunk));
    }
    let mut lists = Vec::new();
    let mut builder = crate::tree::chunklist::ChunkListBuilder::with_fanout(fanout);
    let key = repo.key().clone();
    let mut emit = |c: ChunkList| -> crate::Result<cairn_format::BlobId> {
        let data = c.encode();
        let id = key.blob_id(&data);
        lists.push((c.level, data));
        Ok(id)
    };
    for r in refs {
        builder.push(r, &mut emit).unwrap();
    }
    let content = builder.finish(&mut emit).unwrap();
    (blobs, lists, content, bytes)
}
