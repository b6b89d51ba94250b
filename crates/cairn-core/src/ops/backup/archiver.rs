//! Stage 3 of backup: put the processed item stream back in order, pack new blobs,
//! and build chunk lists and trees. Runs on one thread, so its sets need no locks.

use super::{Budget, ChunkOut, InFlight, Item, Skipped};
use crate::error::{Error, Result};
use crate::index::IdSet;
use crate::progress::{Event, FileAction};
use crate::repo::Repository;
use crate::repo::blob::BlobEncoder;
use crate::repo::packer::{BufferPool, Packer, Uploader};
use crate::tree::chunklist::ChunkListBuilder;
use crate::tree::fixed::FixedList;
use cairn_format::BlobId;
use cairn_format::consts::MAX_BLOB_SIZE;
use cairn_format::pack::BlobKind;
use cairn_format::snapshot::SnapshotSummary;
use cairn_format::tree::{ChunkList, ChunkRef, Node, NodeKind, Tree};
use crossbeam_channel::Receiver;
use std::collections::BTreeMap;
use std::sync::Arc;

pub(crate) struct Archived {
    pub root: BlobId,
    pub summary: SnapshotSummary,
    pub skipped: Vec<Skipped>,
    pub changed_while_read: Vec<Skipped>,
    pub packs: u64,
    /// Bytes of the packs and index files this run stored.
    pub bytes_stored: u64,
    /// Data chunks this run stored (through a server: remembered for the next).
    pub stored_data: Vec<BlobId>,
    /// The index files this run wrote.
    pub index_files: Vec<cairn_format::IndexId>,
    /// The packs this run stored.
    pub pack_ids: Vec<cairn_format::PackId>,
    /// What an image backup counted.
    pub image: Option<ImageCounts>,
}

/// Blocks of an image backup, as the archiver saw them.
#[derive(Clone, Debug, Default)]
pub(crate) struct ImageCounts {
    pub blocks_read: u64,
    pub blocks_changed: u64,
    pub blocks_zero: u64,
    /// Bytes of a sparse source's holes, which were not read.
    pub hole_bytes: u64,
    /// Blocks wholly in those holes.
    pub hole_blocks: u64,
    pub notes: Vec<super::image::Note>,
}

/// An image being archived: the parent's list to compare blocks with.
struct ImageTrack<'a> {
    parent: Option<FixedList<'a>>,
    zero_id: BlobId,
    /// The next block's number.
    block: u64,
    counts: ImageCounts,
    /// The parent image's content and times, which the image takes when its
    /// content is that (a block device's: see `Item::ImageStart`).
    unchanged: Option<(
        cairn_format::tree::Content,
        [cairn_format::tree::Timestamp; 3],
    )>,
}

impl ImageTrack<'_> {
    fn observe(&mut self, id: &BlobId) {
        let c = &mut self.counts;
        c.blocks_read += 1;
        if *id == self.zero_id {
            c.blocks_zero += 1;
        }
        // A parent list that cannot be read only makes every block count as changed.
        let same = match self.parent.as_mut().map(|p| p.entry(0, self.block)) {
            Some(Ok(e)) => e.is_some_and(|e| e.id == *id),
            Some(Err(_)) => {
                self.parent = None;
                false
            }
            None => false,
        };
        if !same {
            c.blocks_changed += 1;
        }
        self.block += 1;
    }
}

struct OpenFile<'a> {
    node: Node,
    changed: bool,
    builder: ChunkListBuilder,
    bytes: u64,
    /// Bytes taken from a parent image's list without reading them.
    reused: u64,
    image: Option<ImageTrack<'a>>,
    /// Its inode as the walker saw it, when its other names take what is read
    /// ([`super::links`]).
    link: Option<super::links::Inode>,
}

struct State<'a> {
    repo: &'a Repository,
    /// Tree and chunk-list blobs packed by this run. Data blobs are in the workers'
    /// in-flight set (each is encoded by the one worker that claimed it), so they
    /// are not remembered twice.
    written: IdSet,
    inflight: &'a InFlight,
    /// What the first name of each hard-linked file was read as, for its others.
    links: super::links::Finished,
    data: Packer,
    meta: Packer,
    encoder: BlobEncoder,
    uploader: Uploader,
    summary: SnapshotSummary,
    /// Chunks another client of the server was sending (see [`ChunkOut::held`]),
    /// with their bytes: sent at the end only if that copy never arrived.
    held: crate::repo::dedup::Held,
    /// Data chunks stored, when a server answers dedup queries.
    stored_data: Vec<BlobId>,
    /// `backup --verbose`: where each file's [`Event::File`] goes, said once the
    /// file is in its directory (a file that could not be read is not listed).
    list_files: Option<crate::progress::Progress>,
}

/// A directory the archiver is filling: its node, the entries that joined it so
/// far, and the parent snapshot's entry of its name (to tell new, changed,
/// unchanged).
struct Frame {
    node: Node,
    children: Vec<Node>,
    parent: Option<Box<Node>>,
}

/// Says what was done with a file that joined its directory, or a directory
/// whose tree is stored (`--verbose`): its path is the open directories' names
/// and its own, as listings show them; a directory's ends in `/`, as restic's.
fn list_file(st: &State<'_>, frames: &[Frame], node: &Node, action: FileAction) {
    let Some(progress) = &st.list_files else {
        return;
    };
    let mut path = String::new();
    // The first frame is the snapshot's root, which has no name.
    for name in frames
        .iter()
        .skip(1)
        .map(|f| &f.node.name)
        .chain([&node.name])
    {
        path.push('/');
        path.push_str(&crate::tree::escape_name(name));
    }
    if node.kind == NodeKind::Dir {
        path.push('/');
    }
    progress.emit(Event::File {
        action,
        path,
        size: node.size,
    });
}

impl State<'_> {
    fn store(&mut self, blob: crate::repo::blob::EncodedBlob) -> Result<()> {
        if blob.kind != BlobKind::Data
            && (self.repo.index().is_live(&blob.id) || !self.written.insert(blob.id))
        {
            return Ok(());
        }
        if blob.kind == BlobKind::Data && self.repo.dedup().is_some() {
            self.stored_data.push(blob.id);
        }
        self.summary.blobs_added += 1;
        self.summary.data_added += u64::from(blob.raw_length);
        self.summary.data_added_packed += blob.sealed.len() as u64;
        let packer = if blob.kind == BlobKind::Data {
            &mut self.data
        } else {
            &mut self.meta
        };
        if let Some(p) = packer.add(blob) {
            self.uploader.send(p)?;
        }
        Ok(())
    }

    /// Stores a tree or chunk-list blob (encoded here: they are small and few).
    fn store_meta(&mut self, kind: BlobKind, plaintext: &[u8]) -> Result<BlobId> {
        if plaintext.len() > MAX_BLOB_SIZE {
            // Format 1 stores a directory listing as one blob; refuse rather than
            // write a blob that readers must reject.
            return Err(Error::Invalid(format!(
                "a directory listing of {} bytes exceeds the format limit of {MAX_BLOB_SIZE} bytes (about 500,000 entries in one directory)",
                plaintext.len()
            )));
        }
        let key = self.repo.key().clone();
        let id = key.blob_id(plaintext);
        // A data chunk with the same bytes has the same id and serves as well.
        if !self.repo.index().is_live(&id)
            && !self.written.contains(&id)
            && !self.inflight.contains(&id)
        {
            let b = self.encoder.encode(&key, kind, id, plaintext)?;
            self.store(b)?;
        }
        Ok(id)
    }
}

pub(crate) fn archive(
    repo: &Repository,
    rx: Receiver<(u64, Vec<Item>)>,
    budget: &Budget,
    inflight: &InFlight,
    pack_size: Option<u64>,
    progress: &crate::progress::Progress,
    list_files: bool,
) -> Result<Archived> {
    let level = repo.config().compression.zstd_level();
    let pack_size = pack_size.unwrap_or(repo.config().pack_size.into()) as usize;
    let pool = Arc::new(BufferPool::new(
        crate::repo::packer::DEFAULT_UPLOAD_THREADS + 1,
    ));
    let uploader = repo.uploader_keeping_room(pool.clone())?;
    let mut st = State {
        repo,
        written: IdSet::default(),
        inflight,
        links: Default::default(),
        data: Packer::new(repo.key().clone(), pool.clone(), pack_size),
        meta: Packer::new(repo.key().clone(), pool.clone(), pack_size),
        encoder: BlobEncoder::new(level),
        uploader,
        summary: SnapshotSummary {
            entries_with_acl: Some(0),
            dirs_new: Some(0),
            dirs_changed: Some(0),
            dirs_unchanged: Some(0),
            ..SnapshotSummary::default()
        },
        held: Default::default(),
        stored_data: Vec::new(),
        list_files: list_files.then(|| progress.clone()),
    };
    st.uploader.set_progress(progress.clone());
    // Under a memory limit, smaller index files: writing one holds its entries,
    // their encoding and its sealed copy at once (about 100 bytes a blob; 200,000
    // blobs of 4 KiB blocks took 25 MiB at a 96 MiB limit). A sixteenth of the
    // working memory for that.
    let flush_blobs =
        repo.memory_plan_in_use()
            .map_or(crate::repo::packer::INDEX_FLUSH_BLOBS, |p| {
                ((p.work_bytes / 16 / 100) as usize)
                    .clamp(10_000, crate::repo::packer::INDEX_FLUSH_BLOBS)
            });
    // Through a server, an index file (and its dedup list) after every pack: an
    // interrupted backup then sends again at most the pack that was in flight,
    // since the server knows every chunk of the others when it restarts.
    let flush_packs = if repo.dedup().is_some() {
        1
    } else {
        usize::MAX
    };
    st.uploader.set_index_flush(flush_blobs, flush_packs);
    let mut image = None;
    let r = run(&mut st, rx, budget, &mut image, progress).and_then(|root| {
        // Every item was received: what is left is storing the last packs.
        progress.read_done();
        send_held_if_missing(&mut st)?;
        if let Some(p) = st.data.finish() {
            st.uploader.send(p)?;
        }
        if let Some(p) = st.meta.finish() {
            st.uploader.send(p)?;
        }
        Ok(root)
    });
    let ((root, skipped, changed_while_read), up) = st.uploader.finish_after(r)?;
    Ok(Archived {
        root,
        summary: st.summary,
        skipped,
        changed_while_read,
        packs: up.packs,
        bytes_stored: up.bytes + up.index_bytes,
        stored_data: std::mem::take(&mut st.stored_data),
        index_files: up.index_files,
        pack_ids: up.pack_ids,
        image,
    })
}

/// Confirms with the server the chunks other clients were sending and sends those
/// that never arrived. Everything this run sent is stored and indexed first, so a
/// client waiting for this one's chunks never waits for a client that waits too.
fn send_held_if_missing(st: &mut State<'_>) -> Result<()> {
    let Some(dedup) = st.repo.dedup().cloned() else {
        return Ok(());
    };
    if st.held.is_empty() {
        return Ok(());
    }
    for p in [st.data.finish(), st.meta.finish()].into_iter().flatten() {
        st.uploader.send(p)?;
    }
    st.uploader.flush()?;
    std::mem::take(&mut st.held).send_missing(&dedup, |b| st.store(b))
}

fn run<'a>(
    st: &mut State<'a>,
    rx: Receiver<(u64, Vec<Item>)>,
    budget: &Budget,
    image: &mut Option<ImageCounts>,
    progress: &crate::progress::Progress,
) -> Result<(BlobId, Vec<Skipped>, Vec<Skipped>)> {
    let mut pending: BTreeMap<u64, Vec<Item>> = BTreeMap::new();
    let mut next = 0u64;
    let mut frames: Vec<Frame> = Vec::new();
    let mut file: Option<OpenFile<'a>> = None;
    let mut skipped = Vec::new();
    let mut torn_files = Vec::new();
    let mut root: Option<BlobId> = None;

    for (seq, bundle) in rx {
        // Ctrl-C: what was read and not yet packed is dropped, not packed and
        // stored after the stop (QA: 4.1 MiB said, 22 MiB stored, at full speed
        // past --limit-upload). The packs made already are still stored.
        progress.check_cancelled()?;
        pending.insert(seq, bundle);
        while let Some(bundle) = pending.remove(&next) {
            next += 1;
            for item in bundle {
                match item {
                    Item::DirStart(node, parent) => frames.push(Frame {
                        node: *node,
                        children: Vec::new(),
                        parent,
                    }),
                    Item::DirEnd => {
                        let Frame {
                            mut node,
                            mut children,
                            parent,
                        } = frames
                            .pop()
                            .ok_or_else(|| Error::Invalid("unbalanced directory stream".into()))?;
                        children.sort_by(|a, b| a.name.cmp(&b.name));
                        let acls = children.iter().filter(|n| n.has_acl()).count() as u64;
                        if let Some(n) = st.summary.entries_with_acl.as_mut() {
                            *n += acls;
                        }
                        let tree = Tree { nodes: children };
                        let id = st.store_meta(BlobKind::Tree, &tree.encode())?;
                        node.subtree = Some(id);
                        if frames.is_empty() {
                            root = Some(id);
                        } else {
                            st.summary.dirs += 1;
                            // Unchanged: the same entries and its own metadata as it
                            // was (QA: a touched directory was "unchanged"); another
                            // kind of entry before is a change, as restic counts it.
                            let (count, action) = match parent {
                                None => (&mut st.summary.dirs_new, FileAction::New),
                                Some(p)
                                    if p.kind == NodeKind::Dir
                                        && p.subtree == Some(id)
                                        && crate::ops::diff::same_metadata(&p, &node) =>
                                {
                                    (&mut st.summary.dirs_unchanged, FileAction::Unchanged)
                                }
                                Some(_) => (&mut st.summary.dirs_changed, FileAction::Modified),
                            };
                            *count.get_or_insert(0) += 1;
                            list_file(st, &frames, &node, action);
                            if let Some(f) = frames.last_mut() {
                                f.children.push(node);
                            }
                        }
                    }
                    Item::FileStart {
                        node,
                        changed,
                        link,
                    } => {
                        file = Some(OpenFile {
                            node: *node,
                            changed,
                            link,
                            builder: ChunkListBuilder::new(),
                            bytes: 0,
                            reused: 0,
                            image: None,
                        });
                    }
                    Item::ImageStart {
                        node,
                        geometry,
                        parent,
                        unchanged_times,
                    } => {
                        let repo = st.repo;
                        let unchanged = match (&parent, unchanged_times) {
                            (Some((_, c)), Some(t)) => Some((c.clone(), t)),
                            _ => None,
                        };
                        let parent = parent.and_then(|(g, c)| FixedList::new(repo, g, c).ok());
                        let zero = vec![0u8; geometry.block_size as usize];
                        file = Some(OpenFile {
                            changed: parent.is_some(),
                            node: *node,
                            builder: ChunkListBuilder::with_fanout(geometry.fanout as usize),
                            bytes: 0,
                            reused: 0,
                            link: None,
                            image: Some(ImageTrack {
                                parent,
                                zero_id: repo.key().blob_id(&zero),
                                block: 0,
                                counts: ImageCounts::default(),
                                unchanged,
                            }),
                        });
                    }
                    Item::Reuse {
                        level,
                        entry,
                        chunks,
                    } => {
                        let f = file.as_mut().ok_or_else(|| {
                            Error::Invalid("image blocks outside an image".into())
                        })?;
                        let mut emit =
                            |cl: ChunkList| st.store_meta(BlobKind::ChunkList, &cl.encode());
                        f.builder
                            .push_entry(level as usize, entry, chunks, &mut emit)?;
                        f.bytes += entry.length;
                        f.reused += entry.length;
                        if let Some(t) = f.image.as_mut() {
                            t.block += chunks;
                        }
                    }
                    Item::ImageNote(n) => {
                        if let Some(t) = file.as_mut().and_then(|f| f.image.as_mut()) {
                            match n {
                                super::image::Note::Holes { bytes, blocks } => {
                                    t.counts.hole_bytes += bytes;
                                    t.counts.hole_blocks += blocks;
                                }
                                n => t.counts.notes.push(n),
                            }
                        }
                    }
                    Item::Chunks { chunks, bytes } => {
                        budget.release(bytes);
                        let f = file
                            .as_mut()
                            .ok_or_else(|| Error::Invalid("chunk data outside a file".into()))?;
                        add_chunks(st, f, chunks)?;
                    }
                    Item::SmallFile { .. } => {
                        return Err(Error::Invalid(
                            "an unread small file reached the archiver".into(),
                        ));
                    }
                    Item::SmallDone {
                        node,
                        changed,
                        chunks,
                        budget: b,
                        torn,
                        link,
                    } => {
                        budget.release(b);
                        let whole = torn.is_none();
                        torn_files.extend(torn);
                        let mut f = OpenFile {
                            node: *node,
                            changed,
                            builder: ChunkListBuilder::new(),
                            bytes: 0,
                            reused: 0,
                            image: None,
                            link,
                        };
                        add_chunks(st, &mut f, chunks)?;
                        finish_file(st, &mut frames, f, whole)?;
                    }
                    Item::SmallFailed {
                        skipped: s,
                        budget: b,
                        link,
                    } => {
                        budget.release(b);
                        if let Some(l) = link {
                            st.links.record(l, None);
                        }
                        st.summary.entries_skipped += 1;
                        skipped.push(s);
                    }
                    Item::Data { .. } => {
                        return Err(Error::Invalid(
                            "unprocessed chunk data reached the archiver".into(),
                        ));
                    }
                    Item::FileEnd { ok, torn } => {
                        let whole = torn.is_none();
                        torn_files.extend(torn);
                        let f = file
                            .take()
                            .ok_or_else(|| Error::Invalid("file end outside a file".into()))?;
                        if ok {
                            if let Some(t) = &f.image {
                                *image = Some(t.counts.clone());
                            }
                            finish_file(st, &mut frames, f, whole)?;
                        } else if let Some(l) = f.link {
                            st.links.record(l, None);
                        }
                    }
                    Item::Linked {
                        mut node,
                        changed,
                        path,
                        last,
                    } => {
                        // The first name of its inode came before it, read or not.
                        let Some(read) = st.links.take(&node, last) else {
                            let message = "not read: another name of this hard-linked file \
                                           could not be read whole"
                                .to_string();
                            progress.warning(&path, &message);
                            st.summary.entries_skipped += 1;
                            skipped.push(Skipped { path, message });
                            continue;
                        };
                        node.content = read.content;
                        node.size = read.size;
                        node.flags = read.flags;
                        node.xattrs = read.xattrs;
                        st.summary.total_bytes += node.size;
                        if changed {
                            st.summary.files_changed += 1;
                        } else {
                            st.summary.files_new += 1;
                        }
                        list_file(st, &frames, &node, FileAction::read(changed));
                        frames
                            .last_mut()
                            .ok_or_else(|| Error::Invalid("entry outside a directory".into()))?
                            .children
                            .push(*node);
                    }
                    Item::LinkDone(key) => st.links.forget(key),
                    Item::Entry { node, unchanged } => {
                        if node.kind == NodeKind::File {
                            st.summary.total_bytes += node.size;
                            if unchanged {
                                st.summary.files_unchanged += 1;
                                list_file(st, &frames, &node, FileAction::Unchanged);
                            }
                        } else {
                            st.summary.other_entries += 1;
                        }
                        frames
                            .last_mut()
                            .ok_or_else(|| Error::Invalid("entry outside a directory".into()))?
                            .children
                            .push(*node);
                    }
                    Item::Skipped(s) => {
                        st.summary.entries_skipped += 1;
                        skipped.push(s);
                    }
                    Item::End => {
                        return root.map(|r| (r, skipped, torn_files)).ok_or_else(|| {
                            Error::Invalid("backup stream ended without a root".into())
                        });
                    }
                }
            }
        }
    }
    Err(Error::Interrupted)
}

/// Packs a file's new chunks and adds them to its chunk list.
fn add_chunks(st: &mut State<'_>, f: &mut OpenFile<'_>, chunks: Vec<ChunkOut>) -> Result<()> {
    for c in chunks {
        if let Some(t) = f.image.as_mut() {
            t.observe(&c.id);
        }
        f.bytes += u64::from(c.length);
        if let Some(b) = c.blob {
            if !c.held {
                st.store(b)?;
            } else if let Some(b) = st.held.hold(b)? {
                st.store(b)?;
            }
        }
        let r = ChunkRef {
            id: c.id,
            length: c.length.into(),
        };
        let mut emit = |cl: ChunkList| st.store_meta(BlobKind::ChunkList, &cl.encode());
        f.builder.push(r, &mut emit)?;
    }
    Ok(())
}

/// A completely read file joins its directory. `whole`: it did not change while
/// it was read (its other names, if hard-linked, may then take its content).
fn finish_file(
    st: &mut State<'_>,
    frames: &mut [Frame],
    f: OpenFile<'_>,
    whole: bool,
) -> Result<()> {
    let mut node = f.node;
    let mut emit = |cl: ChunkList| st.store_meta(BlobKind::ChunkList, &cl.encode());
    node.content = f.builder.finish(&mut emit)?;
    node.size = f.bytes;
    if let Some((content, [m, a, c])) = f.image.as_ref().and_then(|t| t.unchanged.as_ref())
        && *content == node.content
    {
        (node.mtime, node.atime, node.ctime) = (*m, *a, *c);
    }
    if let Some(l) = f.link {
        st.links.record(l, whole.then_some(&node));
    }
    // A sparse image's holes were not read: they are zeros, not disk reads.
    let holes = f.image.as_ref().map_or(0, |t| t.counts.hole_bytes);
    st.summary.bytes_read += (f.bytes - f.reused).saturating_sub(holes);
    st.summary.total_bytes += f.bytes;
    if f.changed {
        st.summary.files_changed += 1;
    } else {
        st.summary.files_new += 1;
    }
    list_file(st, frames, &node, FileAction::read(f.changed));
    frames
        .last_mut()
        .ok_or_else(|| Error::Invalid("file outside a directory".into()))?
        .children
        .push(node);
    Ok(())
}
