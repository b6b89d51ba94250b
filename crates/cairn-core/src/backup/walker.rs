//! Stage 1 of backup: walk the source in sorted order and emit the item stream.

use super::source::{Excludes, NameCache, node_from_metadata};
use super::{Budget, Item, Skipped};
use crate::error::{Error, Result};
use crate::progress::BackupProgress;
use crate::repo::Repository;
use cairn_chunker::StreamChunker;
use cairn_format::BlobId;
use cairn_format::tree::{Node, NodeKind, Tree};
use crossbeam_channel::Sender;
use std::collections::BTreeMap;
use std::fs::File;
use std::io::{ErrorKind, Read};
use std::os::unix::ffi::OsStrExt;
use std::path::{Path, PathBuf};

/// Bytes of chunks sent to the workers as one item.
const BATCH_BYTES: usize = 4 << 20;
/// Items per bundle at most.
const BUNDLE_ITEMS: usize = 256;
/// Batches smaller than this are sent as exact-size copies and the big buffer reused.
const SMALL_BATCH_BYTES: usize = 256 << 10;
/// Bytes asked of one `read` call.
const READ_BYTES: usize = 1 << 20;

/// The command-line paths as a tree of path components: interior nodes are the
/// directories leading to what was asked for, leaves are backed up whole.
enum Selection {
    Leaf(PathBuf),
    Dir(PathBuf, BTreeMap<Vec<u8>, Selection>),
}

fn build_selection(paths: &[PathBuf]) -> BTreeMap<Vec<u8>, Selection> {
    let mut root: BTreeMap<Vec<u8>, Selection> = BTreeMap::new();
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
                level.insert(key, Selection::Leaf(prefix.clone()));
                break;
            }
            let entry = level
                .entry(key)
                .or_insert_with(|| Selection::Dir(prefix.clone(), BTreeMap::new()));
            match entry {
                Selection::Leaf(_) => break, // an ancestor is already backed up whole
                Selection::Dir(_, children) => level = children,
            }
        }
    }
    root
}

pub(crate) struct Walker<'a> {
    repo: &'a Repository,
    tx: Sender<(u64, Vec<Item>)>,
    seq: u64,
    bundle: Vec<Item>,
    bundle_bytes: usize,
    budget: &'a Budget,
    excludes: &'a Excludes,
    progress: &'a dyn BackupProgress,
    one_file_system: bool,
    names: NameCache,
    chunker: StreamChunker,
    batch: Vec<u8>,
    lens: Vec<u32>,
}

impl<'a> Walker<'a> {
    pub(crate) fn new(
        repo: &'a Repository,
        tx: Sender<(u64, Vec<Item>)>,
        budget: &'a Budget,
        excludes: &'a Excludes,
        progress: &'a dyn BackupProgress,
        one_file_system: bool,
    ) -> Self {
        Walker {
            repo,
            tx,
            seq: 0,
            bundle: Vec::with_capacity(BUNDLE_ITEMS),
            bundle_bytes: 0,
            budget,
            excludes,
            progress,
            one_file_system,
            names: NameCache::default(),
            chunker: StreamChunker::new(repo.chunker()),
            batch: Vec::new(),
            lens: Vec::new(),
        }
    }

    /// Queues an item; items travel in bundles so that a tree of small files costs a
    /// channel message per few hundred entries, not several per file.
    fn emit(&mut self, item: Item) -> Result<()> {
        let end = matches!(item, Item::End);
        if let Item::Data { buf, .. } = &item {
            self.bundle_bytes += buf.len();
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

    fn load_parent(&self, id: Option<BlobId>) -> Option<Tree> {
        // A parent tree that cannot be read only costs re-reading files.
        id.and_then(|id| self.repo.load_tree(&id).ok())
    }

    pub(crate) fn run(&mut self, paths: &[PathBuf], parent_root: Option<BlobId>) -> Result<()> {
        if paths.iter().any(|p| p.parent().is_none()) {
            // `/` itself: the snapshot's root tree is the root directory.
            let root = Path::new("/");
            let meta = std::fs::symlink_metadata(root).map_err(|e| Error::io(root, e))?;
            let (node, _) = node_from_metadata(Vec::new(), root, &meta, &mut self.names);
            let mut parent = Node::new(Vec::new(), NodeKind::Dir);
            parent.subtree = parent_root;
            self.walk_dir(root, node, Some(&parent), None)?;
            return self.emit(Item::End);
        }
        let sel = build_selection(paths);
        let parent = self.load_parent(parent_root);
        self.emit(Item::DirStart(Box::new(Node::new(
            Vec::new(),
            NodeKind::Dir,
        ))))?;
        self.walk_selection(&sel, parent.as_ref())?;
        self.emit(Item::DirEnd)?;
        self.emit(Item::End)
    }

    pub(crate) fn run_stdin(&mut self, name: &str, mut reader: Box<dyn Read + Send>) -> Result<()> {
        self.emit(Item::DirStart(Box::new(Node::new(
            Vec::new(),
            NodeKind::Dir,
        ))))?;
        let mut node = Node::new(name.as_bytes().to_vec(), NodeKind::File);
        let now = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap_or_default();
        let t = cairn_format::tree::Timestamp {
            secs: now.as_secs() as i64,
            nanos: now.subsec_nanos(),
        };
        node.mtime = t;
        node.atime = t;
        node.ctime = t;
        node.mode = 0o100600;
        node.uid = nix::unistd::getuid().as_raw();
        node.gid = nix::unistd::getgid().as_raw();
        node.user = self.names.user(node.uid);
        node.group = self.names.group(node.gid);
        let path = PathBuf::from(format!("/{name}"));
        self.emit(Item::FileStart {
            node: Box::new(node),
            changed: false,
        })?;
        match self.read_content(&mut reader) {
            Ok(()) => self.emit(Item::FileEnd { ok: true })?,
            Err(ReadError::Source(e)) => {
                return Err(Error::io(path, e));
            }
            Err(ReadError::Fatal(e)) => return Err(e),
        }
        self.emit(Item::DirEnd)?;
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
                Selection::Leaf(path) => self.walk_entry(path, name, pnode, None)?,
                Selection::Dir(path, children) => {
                    let meta = match std::fs::symlink_metadata(path) {
                        Ok(m) => m,
                        Err(e) => {
                            self.skip(path, e.to_string())?;
                            continue;
                        }
                    };
                    let (node, _) = node_from_metadata(name.clone(), path, &meta, &mut self.names);
                    let ptree = self.load_parent(pnode.and_then(|n| n.subtree));
                    self.emit(Item::DirStart(Box::new(node)))?;
                    self.walk_selection(children, ptree.as_ref())?;
                    self.emit(Item::DirEnd)?;
                }
            }
        }
        Ok(())
    }

    fn walk_entry(
        &mut self,
        path: &Path,
        name: &[u8],
        parent: Option<&Node>,
        root_dev: Option<u64>,
    ) -> Result<()> {
        if self.excludes.is_excluded(path) {
            return Ok(());
        }
        let meta = match std::fs::symlink_metadata(path) {
            Ok(m) => m,
            Err(e) => return self.skip(path, e.to_string()),
        };
        let (node, warning) = node_from_metadata(name.to_vec(), path, &meta, &mut self.names);
        if let Some(w) = warning {
            self.progress.warning(path, &w);
        }
        match node.kind {
            NodeKind::Dir => self.walk_dir(path, node, parent, root_dev),
            NodeKind::File => self.walk_file(path, node, parent),
            _ => {
                self.progress.entry_done();
                self.emit(Item::Entry {
                    node: Box::new(node),
                    unchanged: false,
                })
            }
        }
    }

    fn walk_dir(
        &mut self,
        path: &Path,
        node: Node,
        parent: Option<&Node>,
        root_dev: Option<u64>,
    ) -> Result<()> {
        let dev = node.dev;
        let root_dev = root_dev.unwrap_or(dev);
        let descend = !self.one_file_system || dev == root_dev;
        let mut names: Vec<Vec<u8>> = Vec::new();
        if descend {
            let rd = match std::fs::read_dir(path) {
                Ok(rd) => rd,
                Err(e) => return self.skip(path, e.to_string()),
            };
            for ent in rd {
                match ent {
                    Ok(ent) => names.push(ent.file_name().as_bytes().to_vec()),
                    Err(e) => return self.skip(path, e.to_string()),
                }
            }
            names.sort_unstable();
        }
        let ptree = match parent {
            Some(p) if p.kind == NodeKind::Dir => self.load_parent(p.subtree),
            _ => None,
        };
        self.emit(Item::DirStart(Box::new(node)))?;
        for name in names {
            let child = path.join(std::ffi::OsStr::from_bytes(&name));
            let pnode = ptree.as_ref().and_then(|t| find(t, &name));
            self.walk_entry(&child, &name, pnode, Some(root_dev))?;
        }
        self.progress.entry_done();
        self.emit(Item::DirEnd)
    }

    fn walk_file(&mut self, path: &Path, mut node: Node, parent: Option<&Node>) -> Result<()> {
        if let Some(p) = parent
            && p.kind == NodeKind::File
            && p.size == node.size
            && p.mtime == node.mtime
            && p.ctime == node.ctime
            && p.inode == node.inode
            && p.dev == node.dev
            && content_is_live(self.repo, &p.content)
        {
            node.content = p.content.clone();
            self.progress.bytes_done(node.size);
            self.progress.entry_done();
            return self.emit(Item::Entry {
                node: Box::new(node),
                unchanged: true,
            });
        }
        let changed = parent.is_some_and(|p| p.kind == NodeKind::File);
        let file = super::source::open_source(path);
        let mut file: File = match file {
            Ok(f) => f,
            Err(e) => return self.skip(path, e.to_string()),
        };
        self.progress.file_started(path);
        self.emit(Item::FileStart {
            node: Box::new(node),
            changed,
        })?;
        match self.read_content(&mut file) {
            Ok(()) => {
                self.progress.entry_done();
                self.emit(Item::FileEnd { ok: true })
            }
            Err(ReadError::Source(e)) => {
                self.emit(Item::FileEnd { ok: false })?;
                self.skip(path, format!("read failed: {e}"))
            }
            Err(ReadError::Fatal(e)) => Err(e),
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
        self.emit(Item::Data { buf, lens })
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
            self.chunker.commit(n);
            self.take_chunks()?;
        }
        self.chunker.finish();
        self.take_chunks()?;
        self.flush_batch()
    }
}

enum ReadError {
    /// The source could not be read: the file is skipped.
    Source(std::io::Error),
    /// The pipeline stopped: the backup fails.
    Fatal(Error),
}

fn find<'t>(tree: &'t Tree, name: &[u8]) -> Option<&'t Node> {
    tree.nodes
        .binary_search_by(|n| n.name.as_slice().cmp(name))
        .ok()
        .map(|i| &tree.nodes[i])
}

/// Whether every blob a parent's file content needs — chunks, and for large files the
/// chunk-list blobs and every chunk they list — is in a live index file of the index
/// this backup loaded. Only then may the content be reused without reading the file:
/// a blob retired by a prune that ran before this backup loaded its index is not
/// live, and a prune that retires one later waits for this backup's lock
/// (docs/FORMAT.md, "Prune and concurrent writers"). Reading a large file's chunk
/// lists costs one small read per 4096 chunks.
fn content_is_live(repo: &Repository, c: &cairn_format::tree::Content) -> bool {
    let index = repo.index();
    match c {
        cairn_format::tree::Content::None => true,
        cairn_format::tree::Content::Inline(refs) => refs.iter().all(|r| index.is_live(&r.id)),
        tree @ cairn_format::tree::Content::Tree { .. } => {
            let mut all = true;
            let walked = crate::chunklist::for_each_content_blob(repo, tree, &mut |b| {
                all &= index.is_live(&b);
                all
            });
            walked.is_ok() && all
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
