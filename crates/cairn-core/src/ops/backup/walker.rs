//! Stage 1 of backup: walk the source in sorted order and emit the item stream.

use super::scan::{self, Pending, Pool, ScanContext, Scanned, find};
use super::source::{NameCache, node_from_metadata};
use super::{Budget, Item, Skipped};
use crate::error::{Error, Result};
use crate::progress::Progress;
use crate::repo::Repository;
use cairn_chunker::StreamChunker;
use cairn_format::BlobId;
use cairn_format::tree::{Node, NodeKind, Tree};
use crossbeam_channel::Sender;
use std::collections::{BTreeMap, HashSet};
use std::fs::File;
use std::io::{ErrorKind, Read};
use std::os::fd::OwnedFd;
use std::os::unix::ffi::{OsStrExt, OsStringExt};
use std::path::{Path, PathBuf};
use std::sync::Arc;

/// Bytes of chunks sent to the workers as one item.
const BATCH_BYTES: usize = 4 << 20;
/// Items per bundle at most.
const BUNDLE_ITEMS: usize = 256;
/// Batches smaller than this are sent as exact-size copies and the big buffer reused.
const SMALL_BATCH_BYTES: usize = 256 << 10;
/// Bytes asked of one `read` call.
const READ_BYTES: usize = 1 << 20;
/// Regular files up to this size are read by the workers, many at once; larger ones
/// are read here, in order, one at a time (their reads are large and sequential).
pub(crate) const SMALL_FILE_BYTES: u64 = 1 << 20;

/// The command-line paths as a tree of path components: interior nodes are the
/// directories leading to what was asked for, leaves are backed up whole.
enum Selection {
    Leaf(PathBuf),
    Dir(PathBuf, BTreeMap<Vec<u8>, Selection>),
}

/// The directories leading to `paths` (below `/`).
fn ways_to(paths: &HashSet<PathBuf>) -> HashSet<PathBuf> {
    paths
        .iter()
        .flat_map(|p| p.ancestors().skip(1))
        .filter(|a| a.parent().is_some())
        .map(Path::to_path_buf)
        .collect()
}

/// The paths' selection, and the paths inside another one (`/` and `/boot`):
/// walked as part of it, but with `--one-file-system` they are file systems of
/// their own to enter ([`Walker::nested`]).
fn build_selection(paths: &[PathBuf]) -> (BTreeMap<Vec<u8>, Selection>, HashSet<PathBuf>) {
    fn leaves(sel: &Selection, out: &mut HashSet<PathBuf>) {
        match sel {
            Selection::Leaf(p) => {
                out.insert(p.clone());
            }
            Selection::Dir(_, children) => children.values().for_each(|c| leaves(c, out)),
        }
    }
    let mut root: BTreeMap<Vec<u8>, Selection> = BTreeMap::new();
    let mut nested = HashSet::new();
    for p in paths {
        let comps: Vec<&std::ffi::OsStr> = p
            .components()
            .filter_map(|c| match c {
                std::path::Component::Normal(n) => Some(n),
                _ => None,
            })
            .collect();
        let mut level = &mut root;
        let mut prefix = PathBuf::from("/");
        for (i, c) in comps.iter().enumerate() {
            prefix.push(c);
            let last = i + 1 == comps.len();
            let key = c.as_bytes().to_vec();
            if last {
                // Paths asked for below this one are walked as part of it.
                if let Some(Selection::Dir(_, children)) =
                    level.insert(key, Selection::Leaf(prefix.clone()))
                {
                    children.values().for_each(|c| leaves(c, &mut nested));
                }
                break;
            }
            let entry = level
                .entry(key)
                .or_insert_with(|| Selection::Dir(prefix.clone(), BTreeMap::new()));
            match entry {
                // An ancestor is already backed up whole.
                Selection::Leaf(_) => {
                    nested.insert(p.clone());
                    break;
                }
                Selection::Dir(_, children) => level = children,
            }
        }
    }
    (root, nested)
}

pub(crate) struct Walker<'a> {
    pub(super) repo: &'a Repository,
    tx: Sender<(u64, Vec<Item>)>,
    seq: u64,
    bundle: Vec<Item>,
    bundle_bytes: usize,
    pub(super) budget: &'a Budget,
    ctx: ScanContext<'a>,
    pool: &'a Pool,
    /// Top-level trees walked so far (the first component of scan-job keys).
    tops: u32,
    pub(super) progress: &'a Progress,
    one_file_system: bool,
    pub(super) names: NameCache,
    chunker: StreamChunker,
    batch: Vec<u8>,
    lens: Vec<u32>,
    /// `--read-limit`: the average rate at which sources are read.
    pub(super) read_limit: Option<&'a cairn_backend::Limiter>,
    /// Paths asked for inside another path asked for ([`build_selection`]).
    nested: HashSet<PathBuf>,
    /// The directories leading to them: with --one-file-system, a mount point
    /// on the way to one (`-x /data /data/mnt/sub`) is entered for that path only.
    ways: HashSet<PathBuf>,
    /// Hard-linked files read so far: their other names are not read again.
    links: super::links::Seen,
    /// How the reads of their first names went; none: every name is read.
    reads: Option<&'a super::links::Reads>,
    /// Directories whose parent-snapshot tree could not be read, so far.
    parents_unread: usize,
}

/// Unreadable parent trees said one by one at most (a lost pack of trees can
/// hold thousands).
const PARENTS_UNREAD_SAID: usize = 10;

impl<'a> Walker<'a> {
    pub(crate) fn new(
        repo: &'a Repository,
        tx: Sender<(u64, Vec<Item>)>,
        budget: &'a Budget,
        ctx: ScanContext<'a>,
        pool: &'a Pool,
        progress: &'a Progress,
        one_file_system: bool,
    ) -> Self {
        Walker {
            repo,
            tx,
            seq: 0,
            bundle: Vec::with_capacity(BUNDLE_ITEMS),
            bundle_bytes: 0,
            budget,
            ctx,
            pool,
            tops: 0,
            progress,
            one_file_system,
            names: NameCache::default(),
            chunker: StreamChunker::new(repo.chunker()),
            batch: Vec::new(),
            lens: Vec::new(),
            read_limit: None,
            nested: HashSet::new(),
            ways: HashSet::new(),
            links: Default::default(),
            reads: None,
            parents_unread: 0,
        }
    }

    /// Reads a hard-linked file once, its reads told in `reads` ([`super::links`]).
    pub(crate) fn with_link_reads(mut self, reads: &'a super::links::Reads) -> Self {
        self.reads = Some(reads);
        self
    }

    /// Reads sources at most at this average rate.
    pub(crate) fn with_read_limit(mut self, limit: Option<&'a cairn_backend::Limiter>) -> Self {
        self.read_limit = limit;
        self
    }

    /// Queues an item; items travel in bundles so that a tree of small files costs a
    /// channel message per few hundred entries, not several per file.
    pub(super) fn emit(&mut self, item: Item) -> Result<()> {
        let end = matches!(item, Item::End);
        match &item {
            Item::Data { buf, start, .. } => self.bundle_bytes += buf.len() - start,
            Item::SmallFile { node, .. } => self.bundle_bytes += small_budget(node),
            _ => {}
        }
        self.bundle.push(item);
        if end || self.bundle_bytes >= BATCH_BYTES || self.bundle.len() >= BUNDLE_ITEMS {
            self.send_bundle()?;
        }
        Ok(())
    }

    fn send_bundle(&mut self) -> Result<()> {
        if self.bundle.is_empty() {
            return Ok(());
        }
        // Stopping here is safe: no snapshot is written, and what was stored so far
        // is indexed (the next backup reuses it).
        self.progress.check_cancelled()?;
        // Budget is taken for a whole bundle just before it is sent, so the walker
        // never waits while holding budget for data the archiver cannot yet see.
        self.budget.acquire(self.bundle_bytes)?;
        let bundle = std::mem::replace(&mut self.bundle, Vec::with_capacity(BUNDLE_ITEMS));
        self.bundle_bytes = 0;
        let seq = self.seq;
        self.seq += 1;
        self.tx.send((seq, bundle)).map_err(|_| Error::Interrupted)
    }

    fn skip(&mut self, path: &Path, message: String) -> Result<()> {
        self.progress.warning(path, &message);
        self.emit(Item::Skipped(Skipped {
            path: path.to_path_buf(),
            message,
        }))
    }

    /// The parent snapshot's tree of directory `path`. One that cannot be read
    /// only costs re-reading files, and is said.
    fn load_parent(&mut self, id: Option<BlobId>, path: &Path) -> Option<Tree> {
        match self.repo.load_tree(&id?) {
            Ok(t) => Some(t),
            Err(e) => {
                self.parent_unread(path, &e.to_string());
                None
            }
        }
    }

    /// Says that the parent snapshot's listing of `path` cannot be read (QA r31:
    /// every file read again without a word why), the first
    /// [`PARENTS_UNREAD_SAID`] times.
    fn parent_unread(&mut self, path: &Path, e: &str) {
        self.parents_unread += 1;
        if self.parents_unread <= PARENTS_UNREAD_SAID {
            // With the path, so that `--json` gives it apart.
            self.progress.warning(
                path,
                &format!(
                    "the parent snapshot's listing of this directory cannot be read ({e}): \
                     its files are read again{}",
                    if self.parents_unread == PARENTS_UNREAD_SAID {
                        " (further such directories are not said)"
                    } else {
                        ""
                    }
                ),
            );
        }
    }

    pub(crate) fn run(&mut self, paths: &[PathBuf], parent_root: Option<BlobId>) -> Result<()> {
        if paths.iter().any(|p| p.parent().is_none()) {
            // `/` itself: the snapshot's root tree is the root directory, and
            // every other path is inside it (`backup -x / /boot`).
            self.nested = paths
                .iter()
                .filter(|p| p.parent().is_some())
                .cloned()
                .collect();
            self.ways = ways_to(&self.nested);
            let root = Path::new("/");
            let meta = std::fs::symlink_metadata(root).map_err(|e| Error::io(root, e))?;
            let (node, _) = node_from_metadata(Vec::new(), root, &meta, &mut self.names);
            let top = DirEntry {
                node: Box::new(node),
                parent_subtree: parent_root,
                parent_node: None,
            };
            self.walk_dir(root, top, None, Vec::new(), None)?;
            return self.emit(Item::End);
        }
        let (sel, nested) = build_selection(paths);
        self.ways = ways_to(&nested);
        self.nested = nested;
        let parent = self.load_parent(parent_root, Path::new("/"));
        self.emit(Item::DirStart(
            Box::new(Node::new(Vec::new(), NodeKind::Dir)),
            None,
        ))?;
        self.walk_selection(&sel, parent.as_ref())?;
        self.emit(Item::DirEnd)?;
        self.emit(Item::End)
    }

    pub(crate) fn run_stdin(&mut self, name: &str, mut reader: Box<dyn Read + Send>) -> Result<()> {
        self.emit(Item::DirStart(
            Box::new(Node::new(Vec::new(), NodeKind::Dir)),
            None,
        ))?;
        let parts = super::stdin_path(name)?;
        let (file, dirs) = parts.split_last().unwrap_or((&name, &[]));
        let t = crate::time::now_timestamp();
        let uid = nix::unistd::getuid().as_raw();
        let gid = nix::unistd::getgid().as_raw();
        // Owned by whoever ran the backup, made now; only they may read it.
        let made = |n: &str, kind: NodeKind, mode: u32, names: &mut NameCache| {
            let mut node = Node::new(n.as_bytes().to_vec(), kind);
            node.mtime = t;
            node.atime = t;
            node.ctime = t;
            node.mode = mode;
            node.uid = uid;
            node.gid = gid;
            node.user = names.user(uid);
            node.group = names.group(gid);
            node
        };
        for d in dirs {
            let dir = made(d, NodeKind::Dir, 0o040700, &mut self.names);
            self.emit(Item::DirStart(Box::new(dir), None))?;
        }
        let node = made(file, NodeKind::File, 0o100600, &mut self.names);
        let path = PathBuf::from(format!("/{}", parts.join("/")));
        self.emit(Item::FileStart {
            node: Box::new(node),
            changed: false,
            link: None,
        })?;
        match self.read_content(&mut reader) {
            Ok(()) => self.emit(Item::FileEnd {
                ok: true,
                torn: None,
            })?,
            Err(ReadError::Source(e)) => {
                // A read stopped by Ctrl-C is a cancellation, not a failure.
                self.progress.check_cancelled()?;
                return Err(Error::io(path, e));
            }
            Err(ReadError::Fatal(e)) => return Err(e),
        }
        for _ in 0..=dirs.len() {
            self.emit(Item::DirEnd)?;
        }
        self.emit(Item::End)
    }

    fn walk_selection(
        &mut self,
        sel: &BTreeMap<Vec<u8>, Selection>,
        parent: Option<&Tree>,
    ) -> Result<()> {
        for (name, s) in sel {
            let pnode = parent.and_then(|t| find(t, name));
            match s {
                Selection::Leaf(path) => self.walk_leaf(path, name, pnode)?,
                Selection::Dir(path, children) => {
                    let meta = match std::fs::symlink_metadata(path) {
                        Ok(m) => m,
                        Err(e) => {
                            self.skip(path, e.to_string())?;
                            continue;
                        }
                    };
                    let (node, _) = node_from_metadata(name.clone(), path, &meta, &mut self.names);
                    let ptree = self.load_parent(pnode.and_then(|n| n.subtree), path);
                    let pnode = pnode.map(|n| Box::new(n.clone()));
                    self.emit(Item::DirStart(Box::new(node), pnode))?;
                    self.walk_selection(children, ptree.as_ref())?;
                    self.emit(Item::DirEnd)?;
                }
            }
        }
        Ok(())
    }

    /// A path named on the command line, backed up whole.
    fn walk_leaf(&mut self, path: &Path, name: &[u8], pnode: Option<&Node>) -> Result<()> {
        let meta = match std::fs::symlink_metadata(path) {
            Ok(m) => m,
            Err(_) if self.ctx.excludes.is_excluded(path) => return Ok(()),
            Err(e) => return self.skip(path, e.to_string()),
        };
        if self.ctx.excludes.excludes_named(path, &meta) {
            return Ok(());
        }
        let (node, warning) = node_from_metadata(name.to_vec(), path, &meta, &mut self.names);
        let scanned = scan::prepare(self.repo, node, warning, pnode, false, self.ctx.change);
        // Each top-level tree gets its own first key component, so scan jobs of
        // later trees sort after this one's.
        let index = self.tops;
        self.tops += 1;
        match self.walk_scanned(path, scanned, None)? {
            Step::Done => Ok(()),
            Step::Dir(d) => self.walk_dir(path, d, None, child_key(&[], index), None),
        }
    }

    /// Emits one prepared entry, or, for a directory to walk, says so (the caller
    /// walks it: directories are never walked by recursion).
    fn walk_scanned(
        &mut self,
        path: &Path,
        scanned: Scanned,
        dir: Option<&Arc<OwnedFd>>,
    ) -> Result<Step> {
        let p = match scanned {
            Scanned::Failed { message, .. } => {
                self.skip(path, message)?;
                return Ok(Step::Done);
            }
            Scanned::Node(p) => p,
        };
        let parent_subtree = p.parent_subtree();
        let (node, in_parent, xattrs_unread) = (p.node, p.in_parent, p.xattrs_unread);
        if let Some(w) = p.warning {
            self.progress.warning(path, &w);
        }
        let mut link = None;
        if node.kind == NodeKind::File
            && !p.reused
            && let Some(reads) = self.reads
        {
            use super::links::{Decision, Read};
            let key = (node.dev, node.inode);
            match self.links.decide(&node) {
                // Another name of a hard-linked file read earlier, unchanged
                // since, and that read was of this very inode, whole.
                Decision::Linked { last } if reads.get(key) == Some(Read::Whole) => {
                    if last {
                        reads.forget(key);
                    }
                    self.progress.bytes_done(node.size);
                    self.progress.file_done();
                    self.emit(Item::Linked {
                        node,
                        changed: in_parent,
                        path: path.to_path_buf(),
                        last,
                    })?;
                    return Ok(Step::Done);
                }
                // Read itself: the first name's read failed (or was of another
                // file), and this one is read for the later names instead.
                Decision::Linked { last: false } if reads.get(key) == Some(Read::Failed) => {
                    self.links.restart(&node);
                    reads.start(key, super::links::stamp(&node));
                    link = Some(key);
                }
                // Read itself, alone: the first name is still being read, or
                // this is the last name.
                Decision::Linked { last } => {
                    if last {
                        reads.forget(key);
                        self.emit(Item::LinkDone(key))?;
                    }
                }
                Decision::Read { linkable } => {
                    if linkable {
                        reads.start(key, super::links::stamp(&node));
                        link = Some(key);
                    }
                }
            }
        }
        match node.kind {
            NodeKind::Dir => {
                return Ok(Step::Dir(DirEntry {
                    node,
                    parent_subtree,
                    parent_node: p.parent_node,
                }));
            }
            NodeKind::File if p.reused => {
                self.progress.bytes_done(node.size);
                self.progress.file_done();
                self.emit(Item::Entry {
                    node,
                    unchanged: true,
                })?;
            }
            NodeKind::File if node.size <= SMALL_FILE_BYTES => {
                // Read, chunked and encoded by a worker: many small files in flight.
                self.emit(Item::SmallFile {
                    path: path.to_path_buf(),
                    dir: dir.cloned(),
                    node,
                    changed: in_parent,
                    xattrs_unread,
                    link,
                })?;
            }
            NodeKind::File => self.walk_file(path, dir, *node, in_parent, xattrs_unread, link)?,
            _ => {
                self.progress.entry_done();
                self.emit(Item::Entry {
                    node,
                    unchanged: false,
                })?;
            }
        }
        Ok(Step::Done)
    }

    /// Walks the directory at `path` and everything below it, depth first, with an
    /// explicit stack: a tree 100,000 levels deep costs memory for its path, not a
    /// thread's stack. Each level keeps its directory open only while an entry
    /// still to come needs it (a file to read, a subdirectory to open), so a deep
    /// chain of directories holds a few descriptors, not one per level.
    fn walk_dir(
        &mut self,
        path: &Path,
        top: DirEntry,
        root_dev: Option<u64>,
        key: Vec<u32>,
        pending: Option<Pending<'a>>,
    ) -> Result<()> {
        let mut path = path.to_path_buf();
        let mut stack: Vec<Frame<'a>> = Vec::new();
        let from = root_dev.map(|r| (r, false));
        if let Some(f) = self.enter_dir(&path, top, from, key, pending, None)? {
            stack.push(f);
        }
        while let Some(frame) = stack.last_mut() {
            let Some((entry, pending)) = frame.entries.next() else {
                self.progress.entry_done();
                self.emit(Item::DirEnd)?;
                let done = stack.pop();
                if let Some(f) = done {
                    truncate(&mut path, f.path_len);
                }
                continue;
            };
            let index = frame.next;
            frame.next += 1;
            // The descriptor goes once no later entry needs it (the current one
            // still gets it through `dir`).
            let dir = frame.dir.clone();
            if frame.next >= frame.fd_needed_until {
                frame.dir = None;
            }
            let (root_dev, way) = (frame.root_dev, frame.way_only);
            let path_len = path.as_os_str().len();
            path.push(std::ffi::OsStr::from_bytes(entry.name()));
            match self.walk_scanned(&path, entry, dir.as_ref())? {
                Step::Done => truncate(&mut path, path_len),
                Step::Dir(d) => {
                    // The scan key only for directories: most entries are files.
                    let key = stack
                        .last()
                        .map(|f| child_key(&f.key, index))
                        .unwrap_or_default();
                    match self.enter_dir(
                        &path,
                        d,
                        Some((root_dev, way)),
                        key,
                        pending,
                        dir.as_ref(),
                    )? {
                        Some(mut f) => {
                            f.path_len = path_len;
                            stack.push(f);
                        }
                        None => truncate(&mut path, path_len),
                    }
                }
            }
        }
        Ok(())
    }

    /// Lists a directory (from its scan job, or here), hands its subdirectories to
    /// the scanners, and emits its start. `None` when it could not be listed (left
    /// out with a warning).
    fn enter_dir(
        &mut self,
        path: &Path,
        d: DirEntry,
        from: Option<(u64, bool)>,
        key: Vec<u32>,
        pending: Option<Pending<'a>>,
        parent: Option<&Arc<OwnedFd>>,
    ) -> Result<Option<Frame<'a>>> {
        let mut node = *d.node;
        let dev = node.dev;
        // A path asked for on its own inside another is a file system of its own
        // to enter, even with --one-file-system (`backup -x / /boot`); a mount
        // point on the way to one is entered for that path only (`way_only`: its
        // other entries are left out).
        // `from`: the parent frame's root device and whether it is way-only.
        let crossing = |r: u64| self.one_file_system && r != dev;
        let (root_dev, way_only) = match from {
            Some((r, _)) if crossing(r) && self.nested.contains(path) => (dev, false),
            Some((r, way)) if (way || crossing(r)) && self.ways.contains(path) => (dev, true),
            Some((r, _)) => (r, false),
            None => (dev, false),
        };
        let descend = !self.one_file_system || dev == root_dev;
        let (dir, entries) = if descend {
            let parent = parent.map(|p| &**p);
            let listing = match pending {
                Some(p) => p.take(&self.ctx, path, parent, d.parent_subtree, &mut self.names),
                None => scan::scan_dir(&self.ctx, path, parent, d.parent_subtree, &mut self.names),
            };
            match listing {
                Ok(mut l) => {
                    if let Some(e) = l.parent_unread.take() {
                        self.parent_unread(path, &e);
                    }
                    if way_only {
                        let (nested, ways) = (&self.nested, &self.ways);
                        l.entries.retain(|e| {
                            let c = path.join(std::ffi::OsStr::from_bytes(e.name()));
                            nested.contains(&c) || ways.contains(&c)
                        });
                    }
                    (Some(l.dir), l.entries)
                }
                Err(e) => {
                    // Its entries cannot be read, but the directory itself was
                    // looked at: kept, empty, with its owner, mode and times (as
                    // restic keeps it), so that a restore makes it and the tree
                    // has no hole where it was.
                    self.skip(path, format!("{e} (kept as an empty directory)"))?;
                    (None, Vec::new())
                }
            }
        } else {
            (None, Vec::new())
        };
        // Hand the subdirectories this walk will enter to the scanners, in order,
        // and find the last entry that needs this directory open.
        let mut pendings: Vec<Option<Pending<'a>>> = Vec::with_capacity(entries.len());
        let mut fd_needed_until = 0u32;
        let mut child = path.to_path_buf();
        for (i, e) in entries.iter().enumerate() {
            let p = match e {
                Scanned::Node(p)
                    if p.node.kind == NodeKind::Dir
                        && (!self.one_file_system || p.node.dev == root_dev) =>
                {
                    fd_needed_until = i as u32 + 1;
                    child.push(std::ffi::OsStr::from_bytes(&p.node.name));
                    let k = child_key(&key, i as u32);
                    let p = self
                        .pool
                        .submit(k, child.clone(), dir.clone(), p.parent_subtree());
                    child.pop();
                    p
                }
                Scanned::Node(p) if p.node.kind == NodeKind::File && !p.reused => {
                    fd_needed_until = i as u32 + 1;
                    None
                }
                _ => None,
            };
            pendings.push(p);
        }
        if let Some(d) = &dir {
            node.flags = super::source::inode_flags(&**d);
        }
        self.emit(Item::DirStart(Box::new(node), d.parent_node))?;
        Ok(Some(Frame {
            entries: entries
                .into_iter()
                .zip(pendings)
                .collect::<Vec<_>>()
                .into_iter(),
            next: 0,
            dir,
            fd_needed_until,
            key,
            root_dev,
            way_only,
            path_len: 0,
        }))
    }

    fn walk_file(
        &mut self,
        path: &Path,
        dir: Option<&Arc<OwnedFd>>,
        mut node: Node,
        changed: bool,
        xattrs_unread: bool,
        link: Option<super::links::Inode>,
    ) -> Result<()> {
        if link.is_some() {
            crate::hooks::point("backup:link-open");
        }
        // As the walker saw it when it decided to read this name.
        let sent_as = super::links::stamp(&node);
        // Relative to the open directory when there is one: one component to resolve.
        let file = match dir {
            Some(d) => super::source::open_source_at(d, &node.name),
            None => super::source::open_source(path),
        };
        let mut file: File = match file {
            Ok(f) => f,
            Err(e) => {
                self.link_read(link, sent_as, false);
                return self.skip(path, e.to_string());
            }
        };
        let mut xattrs_unread = xattrs_unread;
        // Replaced since the scan, it is described from the open file; it stays
        // new (`changed` says whether the parent snapshot had a file here).
        if let Some(n) = super::source::reopened_node(&node, &file) {
            node = n;
            xattrs_unread = false;
        }
        node.flags = super::source::inode_flags(&file);
        if xattrs_unread {
            match super::source::read_xattrs_of(&file) {
                Ok(x) => node.xattrs = x,
                Err(w) => self.progress.warning(path, &w),
            }
        }
        // Another file than the walk saw (replaced since): not the inode the
        // other names are of.
        let same_inode = link.is_some_and(|k| k == (node.dev, node.inode));
        self.progress.file_started(path);
        self.emit(Item::FileStart {
            node: Box::new(node),
            changed,
            link,
        })?;
        let before = super::source::Changes::of(&file);
        let read = if super::source::looks_sparse(&file) {
            self.read_content(&mut super::source::SparseReader::new(&file))
        } else {
            self.read_content(&mut file)
        };
        match read {
            Ok(()) => {
                self.progress.file_done();
                // Its chunks are on their way: a large file that changed meanwhile is
                // saved as read, with a warning (the next backup sees it changed,
                // since its node keeps the times from before, and reads it again).
                let torn = (before != super::source::Changes::of(&file)).then(|| {
                    let message = super::CHANGED_WHILE_READ.to_string();
                    self.progress.warning(path, &message);
                    Skipped {
                        path: path.to_path_buf(),
                        message,
                    }
                });
                self.link_read(link, sent_as, same_inode && torn.is_none());
                self.emit(Item::FileEnd { ok: true, torn })
            }
            Err(ReadError::Source(e)) => {
                self.link_read(link, sent_as, false);
                self.emit(Item::FileEnd {
                    ok: false,
                    torn: None,
                })?;
                self.skip(path, format!("read failed: {e}"))
            }
            Err(ReadError::Fatal(e)) => Err(e),
        }
    }

    /// Says how the read of a linkable name went ([`super::links::Reads`]).
    fn link_read(
        &self,
        link: Option<super::links::Inode>,
        sent_as: super::links::Stamp,
        whole: bool,
    ) {
        if let (Some(key), Some(reads)) = (link, self.reads) {
            reads.done(key, sent_as, whole);
        }
    }

    fn flush_batch(&mut self) -> Result<(), ReadError> {
        if self.lens.is_empty() {
            return Ok(());
        }
        let buf = if self.batch.len() < SMALL_BATCH_BYTES {
            let copy = self.batch.clone();
            self.batch.clear();
            copy
        } else {
            let fresh = self.budget.pool.take(BATCH_BYTES + (1 << 18));
            std::mem::replace(&mut self.batch, fresh)
        };
        let lens = std::mem::take(&mut self.lens);
        self.emit(Item::Data {
            buf,
            start: 0,
            lens,
        })
        .map_err(ReadError::Fatal)
    }

    fn take_chunks(&mut self) -> Result<(), ReadError> {
        while let Some(c) = self.chunker.next_chunk() {
            self.batch.extend_from_slice(c);
            self.lens.push(c.len() as u32);
            if self.batch.len() >= BATCH_BYTES {
                self.flush_batch()?;
            }
        }
        Ok(())
    }

    /// Reads a stream to its end, chunking as it goes.
    fn read_content(&mut self, reader: &mut dyn Read) -> Result<(), ReadError> {
        self.chunker.reset();
        if self.batch.capacity() == 0 {
            self.batch.reserve(BATCH_BYTES + (1 << 18));
        }
        loop {
            let n = match reader.read(self.chunker.spare(READ_BYTES)) {
                Ok(0) => break,
                Ok(n) => n,
                Err(e) if e.kind() == ErrorKind::Interrupted => continue,
                Err(e) => {
                    self.chunker.reset();
                    // Chunks already batched belong to a file that will be dropped;
                    // sending them is harmless (unreferenced data is pruned later).
                    self.flush_batch()?;
                    return Err(ReadError::Source(e));
                }
            };
            self.progress.bytes_done(n as u64);
            if let Some(l) = self.read_limit {
                l.take(n as u64);
            }
            self.chunker.commit(n);
            self.take_chunks()?;
        }
        self.chunker.finish();
        self.take_chunks()?;
        self.flush_batch()
    }
}

/// Scan keys keep at most this many levels: deeper directories share their
/// ancestor's key. The key only orders the scanners' work (the walker takes back a
/// job nobody started), and a full key per level would cost memory quadratic in
/// the depth of a deep chain of directories.
const MAX_KEY_LEVELS: usize = 48;

/// What the walker does next with an entry.
enum Step {
    Done,
    /// A directory to walk into.
    Dir(DirEntry),
}

/// A directory entry to walk into.
struct DirEntry {
    node: Box<Node>,
    /// The parent snapshot's tree of the same name.
    parent_subtree: Option<BlobId>,
    /// The parent snapshot's entry of the same name (see [`Item::DirStart`]).
    parent_node: Option<Box<Node>>,
}

/// One directory being walked (see [`Walker::walk_dir`]).
struct Frame<'a> {
    entries: std::vec::IntoIter<(Scanned, Option<Pending<'a>>)>,
    /// Index of the next entry.
    next: u32,
    /// The open directory, while an entry still to come needs it.
    dir: Option<Arc<OwnedFd>>,
    /// Entries from this index on need no descriptor.
    fd_needed_until: u32,
    key: Vec<u32>,
    root_dev: u64,
    /// Entered only on the way to a path asked for below it ([`Walker::ways`]).
    way_only: bool,
    /// The walk path's length before this directory's name.
    path_len: usize,
}

/// Cuts a path back to `len` bytes (the parent it was pushed onto).
fn truncate(path: &mut PathBuf, len: usize) {
    let mut bytes = std::mem::take(path).into_os_string().into_vec();
    bytes.truncate(len);
    *path = PathBuf::from(std::ffi::OsString::from_vec(bytes));
}

/// The scan key of child `index` of the directory keyed `parent`: its path of child
/// indexes, which sorts in depth-first pre-order (capped at [`MAX_KEY_LEVELS`]).
fn child_key(parent: &[u32], index: u32) -> Vec<u32> {
    if parent.len() >= MAX_KEY_LEVELS {
        return parent.to_vec();
    }
    let mut k = Vec::with_capacity(parent.len() + 1);
    k.extend_from_slice(parent);
    k.push(index);
    k
}

/// The chunk-byte budget a small file's read takes (its size when stat'ed; a worker
/// reading it releases the same amount whatever it finds).
pub(crate) fn small_budget(node: &Node) -> usize {
    node.size.min(SMALL_FILE_BYTES) as usize
}

enum ReadError {
    /// The source could not be read: the file is skipped.
    Source(std::io::Error),
    /// The pipeline stopped: the backup fails.
    Fatal(Error),
}
