//! The set of blobs snapshots need: every tree, chunk-list blob and chunk reachable
//! from their roots. Prune keeps exactly these. Trees are loaded by several threads
//! at once (loading means reading, decrypting and decompressing; most of it waits on
//! storage), and a tree or chunk list reached twice is read once.

use crate::error::{Error, Result};
use crate::index::IdSet;
use crate::progress::Progress;
use crate::repo::Repository;
use crate::tree::chunklist::for_each_content_blob_as;
use cairn_format::BlobId;
use cairn_format::tree::NodeKind;
use std::sync::{Condvar, Mutex};

/// Where a walk puts what it reaches.
pub trait Reached: Send {
    /// A tree or chunk-list blob: true the first time, when its content is to be
    /// read.
    fn first_visit(&mut self, id: BlobId) -> bool;
    /// A data chunk; the same one may come more than once.
    fn chunk(&mut self, id: BlobId) -> Result<()>;
}

impl Reached for IdSet {
    fn first_visit(&mut self, id: BlobId) -> bool {
        self.insert(id)
    }
    fn chunk(&mut self, id: BlobId) -> Result<()> {
        self.insert(id);
        Ok(())
    }
}

/// Trees to read, each with the root (by its place in the roots given) it was
/// first reached from, which a failure is put down to.
struct Queue {
    todo: Vec<(BlobId, usize)>,
    busy: usize,
    error: Option<(Error, Option<usize>)>,
}

/// Adds to `seen` every blob the given snapshots need. A tree or chunk list that
/// cannot be read (lost, damaged, or written by a newer cairn) is named in the
/// error with a snapshot that needs it, and how to get past it.
pub fn collect_snapshots<S: Reached>(
    repo: &Repository,
    snaps: &[(cairn_format::SnapshotId, cairn_format::snapshot::Snapshot)],
    seen: &mut S,
    progress: &Progress,
) -> Result<()> {
    let roots = snaps
        .iter()
        .map(|(id, s)| {
            s.tree_id()
                .map_err(|e| Error::damaged(format!("snapshot {}", id.to_hex()), e))
        })
        .collect::<Result<Vec<BlobId>>>()?;
    let (e, root) = match walk(repo, &roots, seen, progress) {
        Ok(()) => return Ok(()),
        Err(failed) => failed,
    };
    let Some((sid, _)) = root.and_then(|i| snaps.get(i)) else {
        return Err(e);
    };
    let sid = sid.to_hex();
    // Lost data may come back (`repair index`, when only the index lost it):
    // check is the one to say, not this.
    let forget = format!("`cairn forget {sid}` removes the snapshot");
    let advice = match &e {
        Error::NewerFormat { .. } => format!("upgrade cairn, or {forget}"),
        // Most often the index lost it, not the packs (an index file damaged or
        // deleted): forgetting would throw away a snapshot that `repair index`
        // gives back whole (QA: the advice was forget).
        Error::BlobNotFound(_) => "`cairn repair index` indexes the packs again and gives \
             it back if a pack holds it; `cairn check` then says what, if anything, is lost"
            .to_string(),
        e if e.is_lost_data() => {
            format!("`cairn check` says what is lost and how to repair it ({forget})")
        }
        _ => return Err(e),
    };
    Err(Error::Invalid(format!(
        "snapshot {sid} cannot be read whole: {e}; {advice}"
    )))
}

/// Adds to `seen` every blob reachable from `roots` (tree ids). Fails on the first
/// tree or chunk list that cannot be read: a caller deciding what to delete must not
/// go on with an incomplete set.
/// Stops with [`Error::Cancelled`] when `progress` is cancelled.
pub fn collect<S: Reached>(
    repo: &Repository,
    roots: &[BlobId],
    seen: &mut S,
    progress: &Progress,
) -> Result<()> {
    walk(repo, roots, seen, progress).map_err(|(e, _)| e)
}

/// [`collect`], failing with the place in `roots` of the root the failure was
/// reached from (`None`: not from one, as for a cancel).
fn walk<S: Reached>(
    repo: &Repository,
    roots: &[BlobId],
    seen: &mut S,
    progress: &Progress,
) -> std::result::Result<(), (Error, Option<usize>)> {
    let mut start = Vec::new();
    for (i, r) in roots.iter().enumerate() {
        if seen.first_visit(*r) {
            start.push((*r, i));
        }
    }
    let queue = Mutex::new(Queue {
        todo: start,
        busy: 0,
        error: None,
    });
    let wake = Condvar::new();
    let shared_seen = Mutex::new(seen);
    let threads = (crate::threads::cores() * 2).clamp(2, 16);
    std::thread::scope(|s| {
        for _ in 0..threads {
            s.spawn(|| worker(repo, &queue, &wake, &shared_seen, progress));
        }
    });
    match queue.into_inner().unwrap_or_else(|e| e.into_inner()).error {
        Some(e) => Err(e),
        None => Ok(()),
    }
}

fn worker<S: Reached>(
    repo: &Repository,
    queue: &Mutex<Queue>,
    wake: &Condvar,
    seen: &Mutex<&mut S>,
    progress: &Progress,
) {
    loop {
        let (id, root) = {
            let mut q = queue.lock().unwrap_or_else(|e| e.into_inner());
            loop {
                if q.error.is_none() && progress.is_cancelled() {
                    q.error = Some((Error::Cancelled, None));
                }
                if q.error.is_some() {
                    wake.notify_all();
                    return;
                }
                if let Some(next) = q.todo.pop() {
                    q.busy += 1;
                    break next;
                }
                if q.busy == 0 {
                    wake.notify_all();
                    return;
                }
                q = wake.wait(q).unwrap_or_else(|e| e.into_inner());
            }
        };
        let r = visit(repo, &id, seen);
        let mut q = queue.lock().unwrap_or_else(|e| e.into_inner());
        q.busy -= 1;
        match r {
            Ok(more) => q.todo.extend(more.into_iter().map(|sub| (sub, root))),
            Err(e) => {
                if q.error.is_none() {
                    q.error = Some((e, Some(root)));
                }
            }
        }
        wake.notify_all();
    }
}

/// Loads one tree, records its blobs, returns its subtrees not seen before.
fn visit<S: Reached>(repo: &Repository, id: &BlobId, seen: &Mutex<&mut S>) -> Result<Vec<BlobId>> {
    let tree = repo.load_tree(id)?;
    let mut subtrees = Vec::new();
    let mut lists = Vec::new();
    {
        let mut s = seen.lock().unwrap_or_else(|e| e.into_inner());
        for n in &tree.nodes {
            match n.kind {
                NodeKind::Dir => {
                    if let Some(sub) = n.subtree
                        && s.first_visit(sub)
                    {
                        subtrees.push(sub);
                    }
                }
                NodeKind::File => match &n.content {
                    cairn_format::tree::Content::Inline(refs) => {
                        for r in refs {
                            s.chunk(r.id)?;
                        }
                    }
                    cairn_format::tree::Content::None => {}
                    c @ cairn_format::tree::Content::Tree { .. } => lists.push(c.clone()),
                },
                _ => {}
            }
        }
    }
    // Chunk lists are read outside the lock. A list blob is asked about at once
    // (a list seen before is not read again); chunks are handed over in batches,
    // one lock per batch rather than per chunk.
    const BATCH: usize = 4096;
    let mut chunks: Vec<BlobId> = Vec::with_capacity(BATCH);
    let mut failed = None;
    let hand_over = |chunks: &mut Vec<BlobId>, failed: &mut Option<Error>| {
        let mut s = seen.lock().unwrap_or_else(|e| e.into_inner());
        for b in chunks.drain(..) {
            if let Err(e) = s.chunk(b) {
                failed.get_or_insert(e);
                break;
            }
        }
    };
    for c in &lists {
        for_each_content_blob_as(repo, c, &mut |b, chunk| {
            if !chunk {
                return seen
                    .lock()
                    .unwrap_or_else(|e| e.into_inner())
                    .first_visit(b);
            }
            chunks.push(b);
            if chunks.len() >= BATCH {
                hand_over(&mut chunks, &mut failed);
            }
            false
        })?;
    }
    hand_over(&mut chunks, &mut failed);
    match failed {
        Some(e) => Err(e),
        None => Ok(subtrees),
    }
}
