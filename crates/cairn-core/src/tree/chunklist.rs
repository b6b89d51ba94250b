//! Chunk lists as trees of blobs, so that a file with millions of chunks never needs
//! all its chunk ids in one vector or one blob.
//!
//! Writing keeps one partial blob per level (at most `CHUNK_LIST_FANOUT` entries
//! each), so memory is O(levels × fanout) whatever the file size. A file of at most
//! `INLINE_CHUNKS_MAX` chunks lists them inline in its tree node instead.

use crate::error::{Error, Result};
use crate::repo::Repository;
use cairn_format::consts::{CHUNK_LIST_FANOUT, INLINE_CHUNKS_MAX, MAX_CHUNK_LIST_DEPTH};
use cairn_format::tree::{ChunkList, ChunkRef, Content};
use cairn_format::{BlobId, FormatError};

pub struct ChunkListBuilder {
    levels: Vec<Vec<ChunkRef>>,
    chunks: u64,
    fanout: usize,
}

impl Default for ChunkListBuilder {
    fn default() -> Self {
        Self::with_fanout(CHUNK_LIST_FANOUT)
    }
}

impl ChunkListBuilder {
    pub fn new() -> Self {
        Self::default()
    }

    /// A smaller fanout (tests) exercises deep trees with few chunks.
    pub fn with_fanout(fanout: usize) -> Self {
        ChunkListBuilder {
            levels: Vec::new(),
            chunks: 0,
            fanout: fanout.clamp(2, CHUNK_LIST_FANOUT),
        }
    }

    pub fn chunks(&self) -> u64 {
        self.chunks
    }

    pub fn push(
        &mut self,
        r: ChunkRef,
        emit: &mut dyn FnMut(ChunkList) -> Result<BlobId>,
    ) -> Result<()> {
        if self.levels.is_empty() {
            self.levels.push(Vec::new());
        }
        self.levels[0].push(r);
        self.chunks += 1;
        let mut k = 0;
        while self.levels[k].len() >= self.fanout {
            self.flush_level(k, emit)?;
            k += 1;
        }
        Ok(())
    }

    /// Adds a whole subtree at once: `r` is an entry of a level-`level` list (for
    /// `level` 0 a data chunk, else a chunk-list blob of level `level - 1`) covering
    /// `chunks` data chunks. This is how an image backup takes the unchanged parts of
    /// its parent's list without reading them. Only allowed where the builder is at
    /// a boundary of such subtrees (every lower level empty); with a fixed fanout
    /// the list comes out as if every chunk had been pushed one by one.
    pub fn push_entry(
        &mut self,
        level: usize,
        r: ChunkRef,
        chunks: u64,
        emit: &mut dyn FnMut(ChunkList) -> Result<BlobId>,
    ) -> Result<()> {
        if self.levels.iter().take(level).any(|l| !l.is_empty()) {
            return Err(Error::Invalid(
                "a chunk-list subtree pushed off its boundary".into(),
            ));
        }
        while self.levels.len() <= level {
            self.levels.push(Vec::new());
        }
        self.levels[level].push(r);
        self.chunks += chunks;
        let mut k = level;
        while self.levels[k].len() >= self.fanout {
            self.flush_level(k, emit)?;
            k += 1;
        }
        Ok(())
    }

    fn flush_level(
        &mut self,
        k: usize,
        emit: &mut dyn FnMut(ChunkList) -> Result<BlobId>,
    ) -> Result<()> {
        let entries = std::mem::take(&mut self.levels[k]);
        let total = entries.iter().map(|e| e.length).sum();
        let id = emit(ChunkList {
            level: k as u8,
            entries,
        })?;
        if self.levels.len() <= k + 1 {
            self.levels.push(Vec::new());
        }
        self.levels[k + 1].push(ChunkRef { id, length: total });
        Ok(())
    }

    /// Ends the file and returns its content reference.
    pub fn finish(mut self, emit: &mut dyn FnMut(ChunkList) -> Result<BlobId>) -> Result<Content> {
        if self.levels.len() <= 1 {
            let l0 = self.levels.pop().unwrap_or_default();
            if l0.is_empty() {
                return Ok(Content::None);
            }
            if l0.len() <= INLINE_CHUNKS_MAX {
                return Ok(Content::Inline(l0));
            }
            self.levels.push(l0);
        }
        let mut k = 0;
        loop {
            let higher = self.levels[k + 1..].iter().any(|l| !l.is_empty());
            if k > 0 && !higher && self.levels[k].len() == 1 {
                let root = self.levels[k][0];
                if k > MAX_CHUNK_LIST_DEPTH as usize {
                    return Err(Error::Invalid("file too large for a chunk list".into()));
                }
                return Ok(Content::Tree {
                    root: root.id,
                    depth: k as u8,
                    chunks: self.chunks,
                });
            }
            if !self.levels[k].is_empty() {
                self.flush_level(k, emit)?;
            }
            k += 1;
        }
    }
}

/// Calls `f` with every data chunk of a file's content, in file order. Chunk-list
/// blobs are checked against their parents (level and byte counts must agree).
pub fn for_each_chunk(
    repo: &Repository,
    content: &Content,
    f: &mut dyn FnMut(ChunkRef) -> Result<()>,
) -> Result<()> {
    match content {
        Content::None => Ok(()),
        Content::Inline(refs) => {
            for r in refs {
                f(*r)?;
            }
            Ok(())
        }
        Content::Tree { root, depth, .. } => walk(repo, *root, *depth, None, f),
    }
}

/// A piece of a file's content as [`for_each_chunk_or_gap`] finds it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Piece {
    Chunk(ChunkRef),
    /// Bytes whose chunks are not known: the chunk list naming them is lost.
    Gap(u64),
}

/// [`for_each_chunk`] for a file whose chunk lists may be lost (`repair`): a list
/// that `listed` says is not stored, or that cannot be read (missing, damaged),
/// is given as a gap of the bytes its parent says it covers (the whole `size`
/// for the root). Whether each chunk is there is the caller's to ask.
pub fn for_each_chunk_or_gap(
    repo: &Repository,
    content: &Content,
    size: u64,
    listed: &dyn Fn(&BlobId) -> bool,
    f: &mut dyn FnMut(Piece) -> Result<()>,
) -> Result<()> {
    let reader = FileReader {
        listed: Some(listed),
        ..FileReader::new(repo, content, size)
    };
    reader.chunks_or_gaps_from(0, &mut None, &mut |p, _| f(p).map(|()| true))
}

/// Reports every blob a file's content needs — chunk-list blobs and chunks — to
/// `first_seen`, which returns true the first time it sees an id. A chunk-list blob
/// seen before is not read again: everything below it was reported then. This is
/// what makes walking many snapshots of the same large files cheap.
pub fn for_each_content_blob(
    repo: &Repository,
    content: &Content,
    first_seen: &mut dyn FnMut(BlobId) -> bool,
) -> Result<()> {
    for_each_content_blob_as(repo, content, &mut |id, _| first_seen(id))
}

/// [`for_each_content_blob`], also telling `first_seen` whether the id is a data
/// chunk (true) or a chunk-list blob (false): a caller can keep the few lists in
/// a set and the many chunks elsewhere (prune spills them to disk).
pub fn for_each_content_blob_as(
    repo: &Repository,
    content: &Content,
    first_seen: &mut dyn FnMut(BlobId, bool) -> bool,
) -> Result<()> {
    match content {
        Content::None => Ok(()),
        Content::Inline(refs) => {
            for r in refs {
                first_seen(r.id, true);
            }
            Ok(())
        }
        Content::Tree { root, depth, .. } => {
            if first_seen(*root, false) {
                walk_lists(repo, *root, *depth, first_seen)
            } else {
                Ok(())
            }
        }
    }
}

/// Checks a chunk-list blob against its place in the tree: its level (one below
/// its parent's, `depth - 1` for the root) and, when the parent says, the bytes
/// its entries cover.
fn checked(
    id: &BlobId,
    list: ChunkList,
    depth: u8,
    expected_len: Option<u64>,
) -> Result<ChunkList> {
    let bytes = list
        .entries
        .iter()
        .try_fold(0u64, |sum, e| sum.checked_add(e.length));
    fits(id, list.level, bytes, depth, expected_len)?;
    Ok(list)
}

/// [`checked`] of a list by its level and the bytes its entries add up to (`None`:
/// more than a `u64` holds).
fn fits(
    id: &BlobId,
    level: u8,
    bytes: Option<u64>,
    depth: u8,
    expected_len: Option<u64>,
) -> Result<()> {
    let bad = |d: &str| {
        Error::damaged(
            format!("chunk list {}", id.short()),
            FormatError::malformed("chunk list", d.to_string()),
        )
    };
    if depth == 0 || level != depth - 1 {
        return Err(bad("level does not match its place in the tree"));
    }
    let Some(bytes) = bytes else {
        return Err(bad("byte counts add up to more than 2^64"));
    };
    if expected_len.is_some_and(|len| len != bytes) {
        return Err(bad("byte count does not match its parent"));
    }
    Ok(())
}

/// What a chunk-list subtree adds up to, as [`ListTotals`] remembers it.
#[derive(Clone, Copy)]
struct Totals {
    level: u8,
    bytes: u64,
    chunks: u64,
    /// A chunk below it was found wrong: each file holding it walks it again.
    flagged: bool,
}

/// Walks files' chunk lists remembering what each list adds up to, so that a list
/// met again is not walked again: in another snapshot, another file, or many
/// times within one file. A hostile list can name one child 4,096 times at each
/// of six levels (2^72 chunks); walked chunk by chunk, `check` would never end.
///
/// A list under which a chunk was found wrong is walked again once in each file
/// that holds it, so that every such file is named with the problem.
#[derive(Default)]
pub struct ListTotals {
    lists: crate::index::IdMap<Totals>,
}

impl ListTotals {
    /// Calls `f` with every chunk of `content` not under a list already walked
    /// clean, in file order; `f` returns true when something is wrong with it.
    /// Returns the bytes and chunks the whole content adds up to (saturating).
    /// Lists are checked against their place in the tree as [`for_each_chunk`]
    /// checks them; the first that cannot be read or does not fit is the error.
    pub fn walk(
        &mut self,
        repo: &Repository,
        content: &Content,
        f: &mut dyn FnMut(ChunkRef) -> Result<bool>,
    ) -> Result<(u64, u64)> {
        match content {
            Content::None => Ok((0, 0)),
            Content::Inline(refs) => {
                let mut bytes = 0u64;
                for r in refs {
                    f(*r)?;
                    bytes = bytes.saturating_add(r.length);
                }
                Ok((bytes, refs.len() as u64))
            }
            Content::Tree { root, depth, .. } => {
                let mut in_file = crate::index::IdSet::default();
                let t = self.list(repo, *root, *depth, None, &mut in_file, f)?;
                Ok((t.bytes, t.chunks))
            }
        }
    }

    fn list(
        &mut self,
        repo: &Repository,
        id: BlobId,
        depth: u8,
        expected_len: Option<u64>,
        in_file: &mut crate::index::IdSet,
        f: &mut dyn FnMut(ChunkRef) -> Result<bool>,
    ) -> Result<Totals> {
        if let Some(t) = self.lists.get(&id).copied()
            && (!t.flagged || in_file.contains(&id))
        {
            // The same checks as reading the list again would make.
            fits(&id, t.level, Some(t.bytes), depth, expected_len)?;
            return Ok(t);
        }
        let list = checked(&id, repo.load_chunk_list(&id)?, depth, expected_len)?;
        let mut t = Totals {
            level: list.level,
            bytes: 0,
            chunks: 0,
            flagged: false,
        };
        for e in list.entries {
            if list.level == 0 {
                t.flagged |= f(e)?;
                t.chunks += 1;
            } else {
                let sub = self.list(repo, e.id, depth - 1, Some(e.length), in_file, f)?;
                t.flagged |= sub.flagged;
                t.chunks = t.chunks.saturating_add(sub.chunks);
            }
            // `checked` found that the entries' lengths add up within a u64.
            t.bytes += e.length;
        }
        self.lists.insert(id, t);
        in_file.insert(id);
        Ok(t)
    }
}

fn walk_lists(
    repo: &Repository,
    id: BlobId,
    depth: u8,
    first_seen: &mut dyn FnMut(BlobId, bool) -> bool,
) -> Result<()> {
    let list = checked(&id, repo.load_chunk_list(&id)?, depth, None)?;
    for e in list.entries {
        if first_seen(e.id, list.level == 0) && list.level > 0 {
            walk_lists(repo, e.id, depth - 1, first_seen)?;
        }
    }
    Ok(())
}

fn walk(
    repo: &Repository,
    id: BlobId,
    depth: u8,
    expected_len: Option<u64>,
    f: &mut dyn FnMut(ChunkRef) -> Result<()>,
) -> Result<()> {
    let list = checked(&id, repo.load_chunk_list(&id)?, depth, expected_len)?;
    for e in list.entries {
        if list.level == 0 {
            f(e)?;
        } else {
            walk(repo, e.id, depth - 1, Some(e.length), f)?;
        }
    }
    Ok(())
}

/// A file's content read from any offset. The chunk-list tree is descended by the
/// byte counts its entries carry — one chunk-list blob per level, through the
/// repository's blob cache — so reading at the end of a 1 TB file costs a handful
/// of small reads, not a walk over every chunk id before it (the mount and image
/// snapshots read this way). Every list is checked against its place in the tree,
/// as [`for_each_chunk`] checks them.
pub struct FileReader<'r> {
    repo: &'r Repository,
    content: &'r Content,
    size: u64,
    /// Chunk lists taken for stored (`repair`: its own view); one it says is not
    /// is not read, and is lost.
    listed: Option<&'r dyn Fn(&BlobId) -> bool>,
    /// A list in an object storage says is gone or shorter than the read is lost
    /// too ([`Error::is_lost_in_storage`]), not only one damaged or unindexed
    /// ([`Error::is_lost_data`]): export's view, as restore's. Repair keeps the
    /// narrower one, which the rest of its walk uses.
    short_is_lost: bool,
}

/// One level of the descent: a chunk list and the next entry to take from it.
struct Level {
    list: ChunkList,
    next: usize,
}

impl<'r> FileReader<'r> {
    /// `size` is the file's size as its node records it.
    pub fn new(repo: &'r Repository, content: &'r Content, size: u64) -> Self {
        FileReader {
            repo,
            content,
            size,
            listed: None,
            short_is_lost: false,
        }
    }

    /// Takes a chunk list in an object that is gone or cut short for lost, as
    /// a damaged one is ([`FileReader::short_is_lost`]).
    pub fn short_objects_lost(self) -> Self {
        FileReader {
            short_is_lost: true,
            ..self
        }
    }

    pub fn size(&self) -> u64 {
        self.size
    }

    /// Calls `f(chunk, start)` for every chunk from the one holding byte `offset` on,
    /// in file order, with the file offset the chunk starts at, until `f` returns
    /// false or the file ends.
    pub fn chunks_from(
        &self,
        offset: u64,
        f: &mut dyn FnMut(ChunkRef, u64) -> Result<bool>,
    ) -> Result<()> {
        self.pieces_from(offset, None, &mut |p, start| match p {
            Piece::Chunk(c) => f(c, start),
            // Not given without a place for the loss.
            Piece::Gap(_) => Ok(false),
        })
    }

    /// [`chunks_from`](Self::chunks_from) that goes on past a chunk list that is
    /// lost (missing or damaged): its bytes are given as a [`Piece::Gap`] at the
    /// offset its parent says it starts at (the whole file for the root), and the
    /// first such loss is kept in `lost`. A gap may start before `offset`.
    pub fn chunks_or_gaps_from(
        &self,
        offset: u64,
        lost: &mut Option<Error>,
        f: &mut dyn FnMut(Piece, u64) -> Result<bool>,
    ) -> Result<()> {
        self.pieces_from(offset, Some(lost), f)
    }

    fn pieces_from(
        &self,
        offset: u64,
        lost: Option<&mut Option<Error>>,
        f: &mut dyn FnMut(Piece, u64) -> Result<bool>,
    ) -> Result<()> {
        match self.content {
            Content::None => Ok(()),
            Content::Inline(refs) => {
                let mut pos = 0u64;
                for r in refs {
                    // Saturating: a node's inline lengths are not checked to fit.
                    if pos.saturating_add(r.length) > offset && !f(Piece::Chunk(*r), pos)? {
                        return Ok(());
                    }
                    pos = pos.saturating_add(r.length);
                }
                Ok(())
            }
            Content::Tree { root, depth, .. } => self.tree_from(*root, *depth, offset, lost, f),
        }
    }

    fn load(&self, id: &BlobId, level: u8, expected: Option<u64>) -> Result<ChunkList> {
        if self.listed.is_some_and(|listed| !listed(id)) {
            return Err(Error::BlobNotFound(*id));
        }
        let data = self.repo.read_blob_cached(id)?;
        let list = ChunkList::decode(&data)
            .map_err(|e| Error::damaged(format!("chunk list {}", id.short()), e))?;
        checked(id, list, level + 1, expected)
    }

    fn tree_from(
        &self,
        root: BlobId,
        depth: u8,
        offset: u64,
        mut lost: Option<&mut Option<Error>>,
        f: &mut dyn FnMut(Piece, u64) -> Result<bool>,
    ) -> Result<()> {
        if depth == 0 || depth > MAX_CHUNK_LIST_DEPTH {
            let e = Error::damaged(
                format!("chunk list {}", root.short()),
                FormatError::malformed("chunk list", "invalid depth"),
            );
            // No list of it can be read: with gaps asked for, all of it is one.
            return match lost {
                Some(lost) => {
                    lost.get_or_insert(e);
                    f(Piece::Gap(self.size), 0).map(drop)
                }
                None => Err(e),
            };
        }
        // A list that cannot be loaded: an error, or (when gaps are asked for) a
        // gap of the `span` bytes it covers, and the walk goes on after it.
        let mut load = |id: &BlobId, level: u8, span: u64, expected: Option<u64>| match (
            self.load(id, level, expected),
            lost.as_deref_mut(),
        ) {
            (Err(e), Some(lost))
                if e.is_lost_data() || (self.short_is_lost && e.is_lost_in_storage()) =>
            {
                lost.get_or_insert(e);
                Ok(Err(span))
            }
            (r, _) => r.map(Ok),
        };
        // Descend to the level-0 list holding `offset`, counting the bytes skipped.
        let mut stack: Vec<Level> = Vec::with_capacity(depth as usize);
        let mut pos = 0u64;
        let (mut id, mut expected) = (root, None);
        for level in (0..depth).rev() {
            let list = match load(&id, level, expected.unwrap_or(self.size), expected)? {
                Ok(list) => list,
                Err(span) => {
                    if !f(Piece::Gap(span), pos)? {
                        return Ok(());
                    }
                    pos += span;
                    match stack.last_mut() {
                        Some(parent) => parent.next += 1,
                        None => return Ok(()),
                    }
                    break;
                }
            };
            let mut next = list.entries.len();
            for (i, e) in list.entries.iter().enumerate() {
                if pos + e.length > offset {
                    next = i;
                    break;
                }
                pos += e.length;
            }
            let child = list.entries.get(next).copied();
            stack.push(Level { list, next });
            match child {
                Some(c) if level > 0 => (id, expected) = (c.id, Some(c.length)),
                _ => break,
            }
        }
        // From there on, in order: chunks of the level-0 list, then up and down.
        loop {
            let Some(top) = stack.last_mut() else {
                return Ok(());
            };
            let level = top.list.level;
            let Some(e) = top.list.entries.get(top.next).copied() else {
                stack.pop();
                if let Some(parent) = stack.last_mut() {
                    parent.next += 1;
                }
                continue;
            };
            if level == 0 {
                top.next += 1;
                if !f(Piece::Chunk(e), pos)? {
                    return Ok(());
                }
                pos += e.length;
                continue;
            }
            // Into the next child list (its first entry), unless we were just in it.
            if stack.len() < depth as usize {
                match load(&e.id, level - 1, e.length, Some(e.length))? {
                    Ok(list) => stack.push(Level { list, next: 0 }),
                    Err(span) => {
                        if let Some(top) = stack.last_mut() {
                            top.next += 1;
                        }
                        if !f(Piece::Gap(span), pos)? {
                            return Ok(());
                        }
                        pos += span;
                    }
                }
            } else {
                return Err(Error::Invalid("chunk list walk lost its place".into()));
            }
        }
    }

    /// Reads up to `buf.len()` bytes at `offset`; the count read (0 at or past the
    /// end). Chunks come through the blob cache and are checked against their
    /// recorded lengths.
    pub fn read_at(&self, offset: u64, buf: &mut [u8]) -> Result<usize> {
        if offset >= self.size || buf.is_empty() {
            return Ok(0);
        }
        let want = buf.len().min((self.size - offset) as usize);
        let mut done = 0usize;
        self.chunks_from(offset, &mut |c, start| {
            let data = self.repo.read_blob_cached(&c.id)?;
            if data.len() as u64 != c.length {
                return Err(Error::damaged(
                    format!("chunk {}", c.id.short()),
                    FormatError::malformed("chunk", "length differs from its chunk list"),
                ));
            }
            let from = (offset + done as u64 - start) as usize;
            let n = (data.len() - from).min(want - done);
            buf[done..done + n].copy_from_slice(&data[from..from + n]);
            done += n;
            Ok(done < want)
        })?;
        Ok(done)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::HashMap;

    fn build(n: usize, fanout: usize) -> (Content, HashMap<BlobId, ChunkList>) {
        let mut store = HashMap::new();
        let mut next = 0u64;
        let mut emit = |c: ChunkList| -> Result<BlobId> {
            next += 1;
            let mut id = [0u8; 32];
            id[..8].copy_from_slice(&next.to_le_bytes());
            id[31] = 0xff;
            store.insert(BlobId(id), c);
            Ok(BlobId(id))
        };
        let mut b = ChunkListBuilder::with_fanout(fanout);
        for i in 0..n {
            let mut id = [0u8; 32];
            id[..8].copy_from_slice(&(i as u64).to_le_bytes());
            b.push(
                ChunkRef {
                    id: BlobId(id),
                    length: i as u64 % 7 + 1,
                },
                &mut emit,
            )
            .unwrap();
        }
        let c = b.finish(&mut emit).unwrap();
        (c, store)
    }

    fn flatten(c: &Content, store: &HashMap<BlobId, ChunkList>) -> Vec<ChunkRef> {
        fn rec(id: BlobId, store: &HashMap<BlobId, ChunkList>, out: &mut Vec<ChunkRef>) {
            let l = &store[&id];
            for e in &l.entries {
                if l.level == 0 {
                    out.push(*e)
                } else {
                    rec(e.id, store, out)
                }
            }
        }
        let mut out = Vec::new();
        match c {
            Content::None => {}
            Content::Inline(v) => out.extend(v),
            Content::Tree { root, .. } => rec(*root, store, &mut out),
        }
        out
    }

    /// Subtrees pushed whole at their boundaries give the same list, byte for byte,
    /// as their chunks pushed one by one (what image backups rely on); off a
    /// boundary the push is refused.
    #[test]
    fn subtrees_pushed_whole_build_the_same_list() {
        let store: std::cell::RefCell<HashMap<BlobId, ChunkList>> = Default::default();
        let mut emit = |c: ChunkList| -> Result<BlobId> {
            let id = BlobId(*blake3::hash(&c.encode()).as_bytes());
            store.borrow_mut().insert(id, c);
            Ok(id)
        };
        let chunk = |i: u64| ChunkRef {
            id: BlobId(*blake3::hash(&i.to_le_bytes()).as_bytes()),
            length: 10,
        };
        let mut one = ChunkListBuilder::with_fanout(4);
        for i in 0..37 {
            one.push(chunk(i), &mut emit).unwrap();
        }
        let whole = one.finish(&mut emit).unwrap();
        let Content::Tree { root, depth: 3, .. } = whole else {
            panic!("{whole:?}")
        };
        let top = store.borrow()[&root].clone();
        let second_l1 = store.borrow()[&top.entries[1].id].clone();
        let mut patched = ChunkListBuilder::with_fanout(4);
        patched
            .push_entry(2, top.entries[0], 16, &mut emit)
            .unwrap();
        patched
            .push_entry(1, second_l1.entries[0], 4, &mut emit)
            .unwrap();
        // Off a boundary: one chunk in, a level-1 subtree cannot follow.
        patched.push(chunk(20), &mut emit).unwrap();
        assert!(
            patched
                .push_entry(1, second_l1.entries[2], 4, &mut emit)
                .is_err()
        );
        let mut patched = ChunkListBuilder::with_fanout(4);
        patched
            .push_entry(2, top.entries[0], 16, &mut emit)
            .unwrap();
        patched
            .push_entry(1, second_l1.entries[0], 4, &mut emit)
            .unwrap();
        for i in 20..37 {
            patched.push(chunk(i), &mut emit).unwrap();
        }
        assert_eq!(patched.chunks(), 37);
        assert_eq!(patched.finish(&mut emit).unwrap(), whole);
    }

    #[test]
    fn too_deep_is_an_error_not_a_panic() {
        let mut b = ChunkListBuilder::with_fanout(2);
        let mut emit = |_c: ChunkList| -> Result<BlobId> { Ok(BlobId([1; 32])) };
        for _ in 0..5000 {
            b.push(
                ChunkRef {
                    id: BlobId([0; 32]),
                    length: 1,
                },
                &mut emit,
            )
            .unwrap();
        }
        assert!(b.finish(&mut emit).is_err());
    }

    #[test]
    fn shapes() {
        let cases = [
            (0, 4096),
            (1, 4096),
            (INLINE_CHUNKS_MAX, 4096),
            (INLINE_CHUNKS_MAX + 1, 4096),
            (4096, 4096),
            (4097, 4096),
            (100_000, 4096),
            (65, 4),
            (1000, 4),
            (1024, 4),
            (100, 3),
        ];
        for (n, fanout) in cases {
            let (c, store) = build(n, fanout);
            let flat = flatten(&c, &store);
            assert_eq!(flat.len(), n, "n={n}");
            for (i, r) in flat.iter().enumerate() {
                assert_eq!(r.id.0[..8], (i as u64).to_le_bytes());
            }
            match (&c, n) {
                (Content::None, 0) => {}
                (Content::Inline(_), n) if n <= INLINE_CHUNKS_MAX => {}
                (Content::Tree { depth, chunks, .. }, n) => {
                    assert_eq!(*chunks, n as u64);
                    assert!(*depth >= 1);
                    assert!(store.values().all(|l| l.entries.len() <= fanout));
                }
                _ => panic!("unexpected shape for {n}"),
            }
        }
    }

    /// A file of `n` chunks of varying lengths with a deep chunk-list tree (fanout
    /// 3), stored for real; returns the repository, the content and the bytes.
    fn stored_file(n: usize) -> (Repository, Content, Vec<u8>) {
        use cairn_format::pack::BlobKind;
        let mut repo = crate::testutil::mem_repo();
        let (mut blobs, lists, content, bytes) = crate::testutil::file_with_lists(&repo, n, 3);
        let lists = lists.into_iter().map(|(_, d)| (BlobKind::ChunkList, d));
        blobs.extend(lists);
        crate::testutil::store_indexed(&mut repo, &blobs);
        (repo, content, bytes)
    }

    #[test]
    fn a_file_reads_from_any_offset_through_a_deep_chunk_list() {
        let (repo, content, bytes) = stored_file(200);
        assert!(matches!(content, Content::Tree { depth, .. } if depth >= 4));
        let r = FileReader::new(&repo, &content, bytes.len() as u64);
        for offset in (0..bytes.len() as u64 + 5).step_by(13) {
            for len in [1usize, 5, 64, 400, 5000] {
                let mut buf = vec![0u8; len];
                let n = r.read_at(offset, &mut buf).unwrap();
                let start = (offset as usize).min(bytes.len());
                let end = (start + len).min(bytes.len());
                assert_eq!(&buf[..n], &bytes[start..end], "at {offset}, {len}");
            }
        }
        // Every chunk from an offset, in order, each starting where the last ended.
        let mut starts = Vec::new();
        r.chunks_from(0, &mut |c, s| {
            starts.push((s, c.length));
            Ok(true)
        })
        .unwrap();
        assert_eq!(starts.len(), 200);
        assert!(starts.windows(2).all(|w| w[0].0 + w[0].1 == w[1].0));
        // Repeated reads come from the cache.
        let (hits, _) = repo.blob_cache().stats();
        assert!(hits > 1000, "{hits}");
    }
}
