//! Chunk lists of fixed geometry: those of image snapshots, whose chunks are all one
//! block size and whose list blobs all hold `fanout` entries (the last of each level
//! fewer). The list blob holding block `b` at level `k` is then found by arithmetic,
//! so an incremental image backup takes every untouched subtree of its parent's list
//! by id, reading and writing only the lists around what changed.
//!
//! Nothing read from the repository is trusted: every list met on the way down is
//! checked to have exactly the entries and byte counts the geometry says, so a list
//! that is not of this shape is refused instead of yielding another block's id.

use crate::error::{Error, Result};
use crate::repo::Repository;
use cairn_format::FormatError;
use cairn_format::consts::{CHUNK_LIST_FANOUT, MAX_CHUNK_LIST_DEPTH};
use cairn_format::tree::{ChunkList, ChunkRef, Content};

/// Entries per list blob for an image of this block size: a level-0 list covers
/// about 1 MiB of image, so that changes in a few places rewrite little of the list,
/// and at least 64 entries, so that six levels reach far beyond any disk (64^6
/// blocks of 64 KiB are 4 EiB).
pub fn fanout_for(block_size: u32) -> u32 {
    ((1u32 << 20) / block_size.max(1)).clamp(64, 256)
}

/// The shape of an image's chunk list.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Geometry {
    pub size: u64,
    pub block_size: u64,
    pub fanout: u64,
}

impl Geometry {
    pub fn new(size: u64, block_size: u32, fanout: u32) -> Result<Geometry> {
        // A block is one blob: a snapshot's block size beyond a blob's is damage
        // (audit r33: a restore allocated and hashed 4 GiB of zeros for one).
        if block_size == 0
            || block_size as usize > cairn_format::consts::MAX_BLOB_SIZE
            || !(2..=CHUNK_LIST_FANOUT as u32).contains(&fanout)
        {
            return Err(Error::Invalid(format!(
                "image geometry out of range: block size {block_size}, fanout {fanout}"
            )));
        }
        Ok(Geometry {
            size,
            block_size: block_size.into(),
            fanout: fanout.into(),
        })
    }

    pub fn blocks(&self) -> u64 {
        self.size.div_ceil(self.block_size)
    }

    /// Blocks covered by one entry of a level-`level` list.
    pub fn span(&self, level: u32) -> u64 {
        self.fanout.saturating_pow(level)
    }

    /// Bytes of blocks `[first, first + n)`, the last block possibly short.
    pub fn bytes_of(&self, first: u64, n: u64) -> u64 {
        let start = first.saturating_mul(self.block_size).min(self.size);
        let end = first
            .saturating_add(n)
            .saturating_mul(self.block_size)
            .min(self.size);
        end - start
    }

    /// List levels of a chunk list of this many blocks, as the builder makes it:
    /// inline (0) up to `INLINE_CHUNKS_MAX` blocks, else the depth of the tree.
    pub fn depth(&self) -> u32 {
        let blocks = self.blocks();
        // The builder flushes a full level-0 list as soon as it fills, so a list of
        // exactly `fanout` blocks is a tree even when it would fit inline.
        if blocks <= cairn_format::consts::INLINE_CHUNKS_MAX as u64 && blocks < self.fanout {
            return 0;
        }
        let mut depth = 1;
        while self.span(depth) < blocks {
            depth += 1;
        }
        depth
    }
}

/// Reads entries of a fixed-geometry chunk list by block number, keeping the list
/// last read at each level (a forward pass reads every list once).
pub struct FixedList<'r> {
    repo: &'r Repository,
    geo: Geometry,
    content: Content,
    /// Per level: the index of the cached list at that level and the list.
    cache: Vec<Option<(u64, ChunkList)>>,
}

impl<'r> FixedList<'r> {
    /// Refuses content whose depth does not match the geometry.
    pub fn new(repo: &'r Repository, geo: Geometry, content: Content) -> Result<FixedList<'r>> {
        let depth = match &content {
            Content::None => 0,
            Content::Inline(refs) => {
                if refs.len() as u64 != geo.blocks() {
                    return Err(shape("inline block count differs from the image size"));
                }
                for (i, r) in refs.iter().enumerate() {
                    if r.length != geo.bytes_of(i as u64, 1) {
                        return Err(shape("a block length differs from the block size"));
                    }
                }
                0
            }
            Content::Tree { depth, chunks, .. } => {
                if *chunks != geo.blocks() || *depth > MAX_CHUNK_LIST_DEPTH {
                    return Err(shape("chunk count differs from the image size"));
                }
                u32::from(*depth)
            }
        };
        if depth != geo.depth() {
            return Err(shape("list depth differs from the image size"));
        }
        Ok(FixedList {
            repo,
            geo,
            content,
            cache: vec![None; depth as usize],
        })
    }

    pub fn geometry(&self) -> Geometry {
        self.geo
    }

    /// Levels of lists (0 for inline content).
    pub fn depth(&self) -> u32 {
        self.cache.len() as u32
    }

    /// The entry of a level-`level` list that covers block `b` (for level 0, the
    /// block's own chunk), or `None` past the end or above the root.
    pub fn entry(&mut self, level: u32, b: u64) -> Result<Option<ChunkRef>> {
        if b >= self.geo.blocks() {
            return Ok(None);
        }
        let depth = self.depth();
        if depth == 0 {
            return Ok(match (&self.content, level) {
                (Content::Inline(refs), 0) => refs.get(b as usize).copied(),
                _ => None,
            });
        }
        if level >= depth {
            return Ok(None);
        }
        let Content::Tree { root, .. } = self.content else {
            return Ok(None);
        };
        // Descend from the root list (level depth - 1) to the list of `level`.
        let mut id = root;
        for m in (level..depth).rev() {
            let list_no = b / self.geo.span(m + 1);
            let fresh = !matches!(&self.cache[m as usize], Some((n, _)) if *n == list_no);
            if fresh {
                let list = self.repo.load_chunk_list(&id)?;
                self.check(&list, m, list_no)?;
                self.cache[m as usize] = Some((list_no, list));
            }
            let Some((_, list)) = &self.cache[m as usize] else {
                return Ok(None);
            };
            let at = ((b / self.geo.span(m)) % self.geo.fanout) as usize;
            let e = *list
                .entries
                .get(at)
                .ok_or_else(|| shape("a list is shorter than the image"))?;
            if m == level {
                return Ok(Some(e));
            }
            id = e.id;
        }
        Ok(None)
    }

    /// A list must hold exactly the entries its place covers, each with the bytes
    /// the geometry gives it.
    fn check(&self, list: &ChunkList, level: u32, list_no: u64) -> Result<()> {
        if u32::from(list.level) != level {
            return Err(shape("a list's level differs from its place"));
        }
        let span = self.geo.span(level);
        let first = list_no.saturating_mul(self.geo.span(level + 1));
        let blocks = self.geo.blocks();
        let want = (blocks.saturating_sub(first))
            .div_ceil(span)
            .min(self.geo.fanout);
        if list.entries.len() as u64 != want {
            return Err(shape("a list holds the wrong number of entries"));
        }
        for (j, e) in list.entries.iter().enumerate() {
            let b = first + j as u64 * span;
            if e.length != self.geo.bytes_of(b, span) {
                return Err(shape("an entry's byte count differs from the geometry"));
            }
        }
        Ok(())
    }
}

fn shape(detail: &str) -> Error {
    Error::damaged(
        "image chunk list",
        FormatError::malformed("image chunk list", detail.to_string()),
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn geometry() {
        let g = Geometry::new(10 * 4096 + 100, 4096, 256).unwrap();
        assert_eq!(g.blocks(), 11);
        assert_eq!(g.bytes_of(10, 1), 100);
        assert_eq!(g.bytes_of(9, 5), 4196);
        assert_eq!(g.depth(), 0);
        let g = Geometry::new(1 << 40, 4096, 256).unwrap();
        assert_eq!(g.depth(), 4); // 2^28 blocks: 256^3 < 2^28 <= 256^4
        assert_eq!(fanout_for(4096), 256);
        assert_eq!(fanout_for(16384), 64);
        assert_eq!(fanout_for(65536), 64);
        assert!(Geometry::new(1, 0, 256).is_err());
        assert!(Geometry::new(1, u32::MAX, 256).is_err());
        assert!(Geometry::new(1, 64 << 20, 256).is_ok());
    }
}
