//! Directory scanning for the walker, several directories at once.
//!
//! A dense filesystem costs per entry, not per byte: a `readdir` share, an `lstat`,
//! an `llistxattr`, a parent-tree lookup and a node to build. The walker must emit
//! entries in depth-first order (trees are built as directories complete), but the
//! work of *preparing* a directory does not depend on that order. So the walker
//! hands the directories it will enter to a small pool of scanner threads, which
//! list, stat and compare each one against its parent-snapshot tree ahead of time;
//! the walker then only puts prepared listings in order.
//!
//! The pool takes jobs earliest-in-walk-order first (a job's key is its path of
//! child indexes, which sorts in depth-first pre-order), so the directory the walker
//! needs next is never queued behind ones it needs much later. Memory stays bounded:
//! at most [`MAX_QUEUED_DIRS`] directories are handed out, scanners stop starting
//! jobs while prepared-but-unconsumed listings hold more than [`MAX_HELD_ENTRIES`]
//! entries, and a walker that finds its job not yet started takes it back and scans
//! the directory itself — so it never waits on a pool that is holding back.

use super::source::{
    Excludes, NameCache, Stat, entry_path, node_reusing_parent, open_dir, open_dir_at,
};
use crate::lock;
use crate::repo::Repository;
use cairn_format::BlobId;
use cairn_format::tree::{Node, NodeKind, Tree};
use std::cmp::Reverse;
use std::collections::BinaryHeap;
use std::os::fd::OwnedFd;
use std::os::unix::ffi::OsStrExt;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Condvar, Mutex};

/// Directories handed to the pool and not yet consumed by the walker, at most (each
/// prepared one holds an open directory).
pub(crate) const MAX_QUEUED_DIRS: usize = 256;
/// Entries of prepared listings waiting for the walker above which the scanners
/// pause (about 200 bytes each).
pub(crate) const MAX_HELD_ENTRIES: usize = 256 * 1024;

/// One prepared directory entry.
pub(crate) enum Scanned {
    /// `lstat` failed (the entry vanished, permission...): skipped with this message.
    Failed {
        name: Vec<u8>,
        message: String,
    },
    Node(Prepared),
}

impl Scanned {
    pub(crate) fn name(&self) -> &[u8] {
        match self {
            Scanned::Failed { name, .. } => name,
            Scanned::Node(p) => &p.node.name,
        }
    }
}

/// An entry ready for the walker.
pub(crate) struct Prepared {
    pub node: Box<Node>,
    /// A link target or xattrs could not be read; the entry is kept.
    pub warning: Option<String>,
    /// The parent snapshot has an entry of this name: a file read now is a
    /// changed one (a type change too, as restic counts it), not a new one.
    pub in_parent: bool,
    /// A regular file whose parent-snapshot content was reused (unchanged metadata
    /// and every blob live): no read needed.
    pub reused: bool,
    /// For a directory: the parent snapshot's entry of the same name, whatever
    /// its kind (to tell a new, changed or unchanged directory).
    pub parent_node: Option<Box<Node>>,
    /// A regular file whose xattrs are to be read from it when it is opened.
    pub xattrs_unread: bool,
}

impl Prepared {
    /// For a directory: the parent snapshot's tree of the same name, if that
    /// was a directory too.
    pub fn parent_subtree(&self) -> Option<BlobId> {
        self.parent_node
            .as_ref()
            .filter(|p| p.kind == NodeKind::Dir)
            .and_then(|p| p.subtree)
    }
}

/// A directory's entries in name order, excluded ones left out, and the directory
/// itself, kept open so that workers open its small files by name.
pub(crate) struct DirListing {
    pub dir: Arc<OwnedFd>,
    pub entries: Vec<Scanned>,
    /// Why the parent snapshot's tree of this directory could not be read (its
    /// files are then read again, as new).
    pub parent_unread: Option<String>,
}

pub(crate) type Listing = std::io::Result<DirListing>;

/// What a scan needs besides the directory: shared, read-only.
pub(crate) struct ScanContext<'a> {
    pub repo: &'a Repository,
    pub excludes: &'a Excludes,
    pub change: super::ChangeDetection,
}

/// Lists, stats and prepares one directory: opened relative to its parent's open
/// descriptor when there is one (`path` is then only for messages and excludes),
/// else by path. `names` caches owner names.
pub(crate) fn scan_dir(
    ctx: &ScanContext<'_>,
    path: &Path,
    parent: Option<&OwnedFd>,
    parent_subtree: Option<BlobId>,
    names: &mut NameCache,
) -> Listing {
    let dir = match (parent, path.file_name()) {
        (Some(p), Some(name)) => open_dir_at(p, name.as_bytes())?,
        _ => open_dir(path)?,
    };
    let mut ents: Vec<Vec<u8>> = Vec::new();
    {
        let mut it = nix::dir::Dir::from_fd(dir.try_clone()?).map_err(std::io::Error::from)?;
        for ent in it.iter() {
            let ent = ent.map_err(std::io::Error::from)?;
            let name = ent.file_name().to_bytes();
            if name != b"." && name != b".." {
                ents.push(name.to_vec());
            }
        }
    }
    ents.sort_unstable();
    // A directory tagged (`--exclude-caches`, `--exclude-if-present`): its tag
    // files only.
    if ctx.excludes.has_tags() && ctx.excludes.tagged(&dir, &ents) {
        ents.retain(|n| ctx.excludes.is_tag_name(n));
    }
    // A parent tree that cannot be read only costs re-reading files; the walker
    // says why (QA r31: a full read without a word).
    let mut parent_unread = None;
    let ptree: Option<Tree> = parent_subtree.and_then(|id| {
        ctx.repo
            .load_tree(&id)
            .map_err(|e| parent_unread = Some(e.to_string()))
            .ok()
    });
    if let Some(t) = &ptree {
        prefetch(ctx.repo, t);
    }
    let mut out = Vec::with_capacity(ents.len());
    let mut child = path.to_path_buf();
    for name in ents {
        child.push(std::ffi::OsStr::from_bytes(&name));
        if ctx.excludes.is_excluded(&child) {
            child.pop();
            continue;
        }
        // lstat relative to the open directory: one component to resolve.
        let st = nix::sys::stat::fstatat(
            &dir,
            std::ffi::OsStr::from_bytes(&name),
            nix::fcntl::AtFlags::AT_SYMLINK_NOFOLLOW,
        );
        let scanned = match st {
            Err(e) => Scanned::Failed {
                name,
                message: std::io::Error::from(e).to_string(),
            },
            Ok(st) => {
                let stat = Stat::from(&st);
                if ctx.excludes.excludes_at(&stat) {
                    child.pop();
                    continue;
                }
                let pnode = ptree.as_ref().and_then(|t| find(t, &name));
                // Link targets and xattrs are read through a short path from the open
                // directory (the full one may be too long for the kernel), built
                // only when they are read.
                let at = |n: &[u8]| entry_path(&dir, n).unwrap_or_else(|| child.clone());
                // Without the change time to go by, a file's xattrs are read here:
                // its content may be taken from the parent without an open.
                let trust = ctx.change.trusts_ctime();
                let (node, warning, xattrs_unread) =
                    node_reusing_parent(name, &at, &stat, names, pnode.filter(|_| trust), trust);
                prepare(ctx.repo, node, warning, pnode, xattrs_unread, ctx.change)
            }
        };
        child.pop();
        out.push(scanned);
    }
    Ok(DirListing {
        dir: Arc::new(dir),
        entries: out,
        parent_unread,
    })
}

/// Compares a node with its parent-snapshot node.
pub(crate) fn prepare(
    repo: &Repository,
    mut node: Node,
    warning: Option<String>,
    pnode: Option<&Node>,
    xattrs_unread: bool,
    change: super::ChangeDetection,
) -> Scanned {
    let in_parent = pnode.is_some();
    let mut reused = false;
    let mut parent_node = None;
    match node.kind {
        NodeKind::File => {
            if let Some(p) = pnode
                && unchanged(p, &node, change)
                && content_is_live(repo, &p.content)
            {
                node.content = p.content.clone();
                node.flags = p.flags;
                // Taken without its change time: the parent's stays recorded, so
                // that a later backup that compares it reads the file.
                if !change.trusts_ctime() {
                    node.ctime = p.ctime;
                }
                reused = true;
            }
        }
        NodeKind::Dir => {
            parent_node = pnode.map(|p| Box::new(p.clone()));
        }
        _ => {}
    }
    Scanned::Node(Prepared {
        node: Box::new(node),
        warning,
        in_parent,
        reused,
        parent_node,
        xattrs_unread,
    })
}

/// Whether a file is taken as unchanged since the parent, as restic judges it:
/// size and modification time, and unless `change` says otherwise the change
/// time and inode number. Not the device ([`super::ChangeDetection`]).
fn unchanged(p: &Node, n: &Node, change: super::ChangeDetection) -> bool {
    p.kind == NodeKind::File
        && p.size == n.size
        && p.mtime == n.mtime
        && (change.ignore_ctime || change.ignore_inode || p.ctime == n.ctime)
        && (change.ignore_inode || p.inode == n.inode)
}

pub(crate) fn find<'t>(tree: &'t Tree, name: &[u8]) -> Option<&'t Node> {
    tree.find(name)
}

/// Whether every blob a parent's file content needs — chunks, and for large files the
/// chunk-list blobs and every chunk they list — is in a live index file of the index
/// this backup loaded. Only then may the content be reused without reading the file:
/// a blob retired by a prune that ran before this backup loaded its index is not
/// live, and a prune that retires one later waits for this backup's lock
/// (docs/FORMAT.md, "Prune and concurrent writers"). Reading a large file's chunk
/// lists costs one small read per 4096 chunks.
///
/// Through a server that answers dedup queries, data chunks the loaded index lacks
/// are asked about (one question per file, or per directory after [`prefetch`]).
pub(crate) fn content_is_live(repo: &Repository, c: &cairn_format::tree::Content) -> bool {
    let index = repo.index();
    let dedup = repo.dedup();
    let mut ask: Vec<BlobId> = Vec::new();
    let mut check = |id: BlobId| {
        if index.is_live(&id) || dedup.is_some_and(|d| d.known_stored(&id)) {
            true
        } else if dedup.is_some() {
            ask.push(id);
            true
        } else {
            false
        }
    };
    let all = match c {
        cairn_format::tree::Content::None => true,
        cairn_format::tree::Content::Inline(refs) => refs.iter().all(|r| check(r.id)),
        tree @ cairn_format::tree::Content::Tree { .. } => {
            let mut all = true;
            let walked = crate::tree::chunklist::for_each_content_blob(repo, tree, &mut |b| {
                all &= check(b);
                all
            });
            walked.is_ok() && all
        }
    };
    match dedup {
        Some(d) if all && !ask.is_empty() => d.all_stored(&ask),
        _ => all,
    }
}

/// Asks the server, in one question, about the chunks of a parent directory's small
/// files that the loaded index lacks, so the files' checks need no question each.
fn prefetch(repo: &Repository, tree: &Tree) {
    let Some(d) = repo.dedup() else {
        return;
    };
    let index = repo.index();
    let ids: Vec<BlobId> = tree
        .nodes
        .iter()
        .filter(|n| n.kind == NodeKind::File)
        .filter_map(|n| match &n.content {
            cairn_format::tree::Content::Inline(refs) => Some(refs),
            _ => None,
        })
        .flatten()
        .map(|r| r.id)
        .filter(|id| !index.is_live(id) && !d.known_stored(id))
        .collect();
    if !ids.is_empty() {
        d.prefetch(&ids);
    }
}

// ---------------------------------------------------------------------------
// the pool

enum SlotState {
    Queued,
    Running,
    Done(Listing, usize),
    /// The walker took the job back (or dropped it) before a scanner started it.
    Taken,
    /// The walker dropped the job while a scanner worked on it: the listing is
    /// discarded when it lands.
    Abandoned,
}

struct Slot {
    state: Mutex<SlotState>,
    cv: Condvar,
}

struct Job {
    key: Vec<u32>,
    path: PathBuf,
    /// The open parent directory (the job opens its directory relative to it).
    parent: Option<Arc<OwnedFd>>,
    parent_subtree: Option<BlobId>,
    slot: Arc<Slot>,
}

impl PartialEq for Job {
    fn eq(&self, o: &Self) -> bool {
        self.key == o.key
    }
}
impl Eq for Job {}
impl PartialOrd for Job {
    fn partial_cmp(&self, o: &Self) -> Option<std::cmp::Ordering> {
        Some(self.cmp(o))
    }
}
impl Ord for Job {
    fn cmp(&self, o: &Self) -> std::cmp::Ordering {
        self.key.cmp(&o.key)
    }
}

/// The scanner pool's shared state.
pub(crate) struct Pool {
    queue: Mutex<BinaryHeap<Reverse<Job>>>,
    cv: Condvar,
    /// Entries in `Done` listings the walker has not taken yet.
    held: AtomicUsize,
    /// Jobs handed out and not yet consumed (or dropped) by the walker.
    outstanding: AtomicUsize,
    stop: AtomicBool,
}

impl Pool {
    pub(crate) fn new() -> Self {
        Pool {
            queue: Mutex::new(BinaryHeap::new()),
            cv: Condvar::new(),
            held: AtomicUsize::new(0),
            outstanding: AtomicUsize::new(0),
            stop: AtomicBool::new(false),
        }
    }

    /// Hands a directory to the scanners, unless enough are already handed out
    /// (the walker then scans it itself when it gets there).
    pub(crate) fn submit(
        &self,
        key: Vec<u32>,
        path: PathBuf,
        parent: Option<Arc<OwnedFd>>,
        parent_subtree: Option<BlobId>,
    ) -> Option<Pending<'_>> {
        if self.outstanding.load(Ordering::Relaxed) >= MAX_QUEUED_DIRS {
            return None;
        }
        self.outstanding.fetch_add(1, Ordering::Relaxed);
        let slot = Arc::new(Slot {
            state: Mutex::new(SlotState::Queued),
            cv: Condvar::new(),
        });
        lock(&self.queue).push(Reverse(Job {
            key,
            path,
            parent,
            parent_subtree,
            slot: slot.clone(),
        }));
        self.cv.notify_one();
        Some(Pending {
            pool: self,
            slot: Some(slot),
        })
    }

    /// Wakes and ends the scanner threads.
    pub(crate) fn stop(&self) {
        self.stop.store(true, Ordering::Relaxed);
        let _q = lock(&self.queue);
        self.cv.notify_all();
    }

    /// A scanner thread's loop: runs until [`Pool::stop`].
    pub(crate) fn run_scanner(&self, ctx: &ScanContext<'_>) {
        let mut names = NameCache::default();
        loop {
            let job = {
                let mut q = lock(&self.queue);
                loop {
                    if self.stop.load(Ordering::Relaxed) {
                        return;
                    }
                    if self.held.load(Ordering::Relaxed) < MAX_HELD_ENTRIES
                        && let Some(Reverse(job)) = q.pop()
                    {
                        break job;
                    }
                    q = self.cv.wait(q).unwrap_or_else(|e| e.into_inner());
                }
            };
            {
                let mut st = lock(&job.slot.state);
                if !matches!(*st, SlotState::Queued) {
                    continue; // taken back by the walker
                }
                *st = SlotState::Running;
            }
            let listing = scan_dir(
                ctx,
                &job.path,
                job.parent.as_deref(),
                job.parent_subtree,
                &mut names,
            );
            // The parent's descriptor is not needed any more.
            drop(job.parent);
            let n = listing.as_ref().map(|v| v.entries.len()).unwrap_or(0);
            let mut st = lock(&job.slot.state);
            if matches!(*st, SlotState::Running) {
                self.held.fetch_add(n, Ordering::Relaxed);
                *st = SlotState::Done(listing, n);
                job.slot.cv.notify_all();
            }
        }
    }

    fn release(&self, held: usize) {
        self.outstanding.fetch_sub(1, Ordering::Relaxed);
        if held > 0 {
            let before = self.held.fetch_sub(held, Ordering::Relaxed);
            if before >= MAX_HELD_ENTRIES {
                let _q = lock(&self.queue);
                self.cv.notify_all();
            }
        }
    }
}

/// Stops the pool when dropped.
pub(crate) struct StopOnDrop<'p>(pub &'p Pool);

impl Drop for StopOnDrop<'_> {
    fn drop(&mut self) {
        self.0.stop();
    }
}

/// The walker's handle on a directory handed to the pool. Dropping it unused
/// cancels the job (or frees its listing).
pub(crate) struct Pending<'p> {
    pool: &'p Pool,
    slot: Option<Arc<Slot>>,
}

impl Pending<'_> {
    /// The prepared listing: waits while a scanner works on it, scans it here if no
    /// scanner has started it.
    pub(crate) fn take(
        mut self,
        ctx: &ScanContext<'_>,
        path: &Path,
        parent: Option<&OwnedFd>,
        parent_subtree: Option<BlobId>,
        names: &mut NameCache,
    ) -> Listing {
        let Some(slot) = self.slot.take() else {
            return scan_dir(ctx, path, parent, parent_subtree, names);
        };
        let mut st = lock(&slot.state);
        loop {
            match std::mem::replace(&mut *st, SlotState::Taken) {
                SlotState::Queued | SlotState::Taken | SlotState::Abandoned => {
                    drop(st);
                    self.pool.release(0);
                    return scan_dir(ctx, path, parent, parent_subtree, names);
                }
                SlotState::Running => {
                    *st = SlotState::Running;
                    st = slot.cv.wait(st).unwrap_or_else(|e| e.into_inner());
                }
                SlotState::Done(listing, n) => {
                    drop(st);
                    self.pool.release(n);
                    return listing;
                }
            }
        }
    }
}

impl Drop for Pending<'_> {
    fn drop(&mut self) {
        if let Some(slot) = self.slot.take() {
            let mut st = lock(&slot.state);
            let prev = std::mem::replace(&mut *st, SlotState::Taken);
            match prev {
                SlotState::Done(_, n) => self.pool.release(n),
                // The scanner discards its listing when it sees this.
                SlotState::Running => {
                    *st = SlotState::Abandoned;
                    self.pool.release(0);
                }
                _ => self.pool.release(0),
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::testutil::{mem_repo, store};
    use cairn_format::index::IndexFile;
    use cairn_format::pack::BlobKind;
    use cairn_format::pending::PendingDeletion;
    use cairn_format::tree::{ChunkList, ChunkRef, Content};

    fn names_of(l: &[Scanned]) -> Vec<Vec<u8>> {
        l.iter().map(|e| e.name().to_vec()).collect()
    }

    #[test]
    fn pool_listings_match_direct_scans_and_everything_is_released() {
        let repo = mem_repo();
        let tmp = tempfile::tempdir().unwrap();
        let dirs: Vec<PathBuf> = (0..60)
            .map(|i| {
                let d = tmp.path().join(format!("d{i:02}"));
                std::fs::create_dir(&d).unwrap();
                for j in 0..i {
                    std::fs::write(d.join(format!("f{}", 100 - j)), b"x").unwrap();
                }
                d
            })
            .collect();
        let excludes = Excludes::patterns(&["f99".into()]).unwrap();
        let ctx = ScanContext {
            repo: &repo,
            excludes: &excludes,
            change: Default::default(),
        };
        let pool = Pool::new();
        std::thread::scope(|s| {
            for _ in 0..2 {
                s.spawn(|| pool.run_scanner(&ctx));
            }
            let _stop = StopOnDrop(&pool);
            let pending: Vec<_> = dirs
                .iter()
                .enumerate()
                .map(|(i, d)| pool.submit(vec![0, i as u32], d.clone(), None, None))
                .collect();
            let mut names = NameCache::default();
            for (i, p) in pending.into_iter().enumerate() {
                let p = p.expect("under the cap");
                if i % 3 == 0 {
                    drop(p); // not walked after all
                    continue;
                }
                let got = p
                    .take(&ctx, &dirs[i], None, None, &mut names)
                    .unwrap()
                    .entries;
                let want = scan_dir(&ctx, &dirs[i], None, None, &mut names)
                    .unwrap()
                    .entries;
                assert_eq!(names_of(&got), names_of(&want));
                // Sorted, the excluded name left out.
                assert_eq!(got.len(), if i >= 2 { i - 1 } else { i });
                assert!(got.windows(2).all(|w| w[0].name() < w[1].name()));
            }
        });
        assert_eq!(pool.outstanding.load(Ordering::Relaxed), 0);
        assert_eq!(pool.held.load(Ordering::Relaxed), 0);
    }

    #[test]
    fn without_scanners_the_walker_scans_and_hand_outs_are_capped() {
        let repo = mem_repo();
        let tmp = tempfile::tempdir().unwrap();
        std::fs::write(tmp.path().join("a"), b"a").unwrap();
        let excludes = Excludes::patterns(&[]).unwrap();
        let ctx = ScanContext {
            repo: &repo,
            excludes: &excludes,
            change: Default::default(),
        };
        let pool = Pool::new();
        let mut pending: Vec<_> = (0..MAX_QUEUED_DIRS)
            .map(|i| {
                pool.submit(vec![i as u32], tmp.path().to_path_buf(), None, None)
                    .expect("under the cap")
            })
            .collect();
        assert!(
            pool.submit(vec![u32::MAX], tmp.path().to_path_buf(), None, None)
                .is_none()
        );
        // Nobody started the job: the walker takes it back and scans it itself.
        let mut names = NameCache::default();
        let first = pending.remove(0);
        let got = first
            .take(&ctx, tmp.path(), None, None, &mut names)
            .unwrap()
            .entries;
        assert_eq!(names_of(&got), vec![b"a".to_vec()]);
        let again = pool.submit(vec![u32::MAX], tmp.path().to_path_buf(), None, None);
        assert!(again.is_some(), "a consumed job frees its place");
        drop(pending);
        assert_eq!(pool.outstanding.load(Ordering::Relaxed), 1);
        drop(again);
        assert_eq!(pool.outstanding.load(Ordering::Relaxed), 0);
    }

    #[test]
    fn parent_content_is_reused_only_if_every_blob_is_live() {
        let mut repo = mem_repo();
        let chunk = b"chunk data".to_vec();
        let x = repo.key().blob_id(&chunk);
        let list = ChunkList {
            level: 0,
            entries: vec![ChunkRef { id: x, length: 10 }],
        }
        .encode();
        let root = repo.key().blob_id(&list);
        let content = Content::Tree {
            root,
            depth: 1,
            chunks: 1,
        };
        let data_pack = store(&repo, &[(BlobKind::Data, chunk)]);
        let list_pack = store(&repo, &[(BlobKind::ChunkList, list)]);
        repo.write_index_file(&IndexFile {
            packs: vec![list_pack],
            ..Default::default()
        })
        .unwrap();
        // The chunk is only in a pack a prune retired: readable, but not live.
        repo.write_pending(&PendingDeletion {
            packs: vec![data_pack.clone()],
            ..Default::default()
        })
        .unwrap();
        repo.load_index().unwrap();
        assert!(repo.index().contains(&x) && !repo.index().is_live(&x));
        assert!(repo.index().is_live(&root));
        assert!(
            !content_is_live(&repo, &content),
            "a retired chunk blocks reuse"
        );
        // Once the chunk is live, the content may be reused.
        repo.write_index_file(&IndexFile {
            packs: vec![data_pack],
            ..Default::default()
        })
        .unwrap();
        repo.load_index().unwrap();
        assert!(content_is_live(&repo, &content));
        assert!(content_is_live(
            &repo,
            &Content::Inline(vec![ChunkRef { id: x, length: 10 }])
        ));
        let absent = BlobId([7; 32]);
        assert!(!content_is_live(
            &repo,
            &Content::Inline(vec![ChunkRef {
                id: absent,
                length: 1
            }])
        ));
    }
}
