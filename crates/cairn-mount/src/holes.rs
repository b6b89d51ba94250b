//! Holes: which parts of a snapshot's file are zeros, told by chunk ids.
//!
//! A restore leaves a chunk of zeros as a hole; the mount says where those are
//! too, so that a copy out of it (`cp`, `rsync -S`, `tar --sparse`) is as sparse
//! as a restore: `st_blocks` counts only the other chunks, and `SEEK_DATA` /
//! `SEEK_HOLE` answer chunk by chunk. A chunk is zeros when its id is the id of
//! that many zero bytes. The ids are computed once, at mount, for the lengths a
//! run of zeros is stored in: the chunk the content-defined chunker cuts in a
//! long run (every such chunk has that one length), and the repository's block
//! size (the fixed blocks of image snapshots). A shorter chunk of zeros (the end
//! of a run) counts as data, as a file system may count any hole: it reads as
//! zeros all the same.

use cairn_core::Repository;
use cairn_format::BlobId;
use cairn_format::tree::{ChunkRef, Content};

/// Most chunks looked at for a file's holes: one with a longer chunk list is
/// all data (`st_blocks` its size, `SEEK_DATA` where asked, `SEEK_HOLE` its
/// end: allowed, a hole may always be reported as data).
pub const MAX_CHUNKS_LOOKED_AT: u64 = 65_536;

/// The ids of the zero chunks a repository stores.
pub struct Zeros {
    ids: Vec<(u64, BlobId)>,
    /// The repository's block size (average chunk size).
    block: u64,
}

impl Zeros {
    pub fn of(repo: &Repository) -> Zeros {
        let chunker = repo.chunker();
        let zeros = vec![0u8; chunker.max_size() + 1];
        let run = chunker
            .next_boundary(&zeros, false)
            .unwrap_or(chunker.max_size());
        let block = repo.config().chunker.avg_size as usize;
        let mut ids: Vec<(u64, BlobId)> = Vec::new();
        for len in [run, block] {
            if len > 0 && len <= zeros.len() && !ids.iter().any(|(l, _)| *l == len as u64) {
                ids.push((len as u64, repo.key().blob_id(&zeros[..len])));
            }
        }
        Zeros {
            ids,
            block: block as u64,
        }
    }

    /// Whether a file of `size` bytes in `chunks` chunks (a chunk list of its
    /// own) may have holes worth reading its list for. Runs of zeros are cut in
    /// chunks of the longest length, so a file with holes has longer chunks on
    /// average than the block size; a file without has about the block size. An
    /// image's fixed blocks are all the block size, holes or not: such a list is
    /// read too. Others are taken as all data without a read: `ls -l` of a
    /// directory of large files would otherwise read each one's chunk list (a
    /// request each, on remote storage).
    /// Files of more than [`MAX_CHUNKS_LOOKED_AT`] chunks are never read for it.
    pub fn may_have_holes(&self, size: u64, chunks: u64) -> bool {
        let block = self.block.max(1);
        chunks > 0
            && chunks <= MAX_CHUNKS_LOOKED_AT
            && (size / chunks >= block + block / 2 || size.div_ceil(block) == chunks)
    }

    pub fn is_zero(&self, c: &ChunkRef) -> bool {
        self.ids.iter().any(|(l, id)| *l == c.length && *id == c.id)
    }

    /// Bytes of a file's data, holes left out, when they are known without
    /// reading anything (chunks listed in the node).
    pub fn data_bytes_inline(&self, content: &Content) -> Option<u64> {
        match content {
            Content::None => Some(0),
            Content::Inline(refs) => Some(
                refs.iter()
                    .filter(|c| !self.is_zero(c))
                    .map(|c| c.length)
                    .sum(),
            ),
            Content::Tree { .. } => None,
        }
    }
}

/// `st_blocks` of a file of `size` bytes of which `data` are not holes.
pub fn blocks(size: u64, data: u64) -> u64 {
    data.min(size).div_ceil(512)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_lists_that_may_hold_holes_are_read() {
        let z = Zeros {
            ids: Vec::new(),
            block: 64 << 10,
        };
        // Content-defined chunks of data: about the block size on average.
        assert!(!z.may_have_holes(100 << 20, 1590));
        // Long runs of zeros cut at the longest length.
        assert!(z.may_have_holes(100 << 20, 420));
        // An image's fixed blocks, the last one short.
        assert!(z.may_have_holes((100 << 20) + 5, 1601));
        assert!(!z.may_have_holes(1, 0));
        // Past the bound, never: its list would be long to read.
        assert!(!z.may_have_holes(1 << 40, MAX_CHUNKS_LOOKED_AT + 1));
    }

    #[test]
    fn blocks_count_data_only() {
        assert_eq!(blocks(100 << 20, 0), 0);
        assert_eq!(blocks(100 << 20, 1), 1);
        assert_eq!(blocks(1000, 1000), 2);
        assert_eq!(blocks(10, 4096), 1);
    }
}
