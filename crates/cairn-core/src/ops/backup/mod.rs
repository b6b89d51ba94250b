//! Backup: source tree -> chunks -> packs, trees and a snapshot.
//!
//! Three stages, each on its own threads, joined by bounded channels:
//!
//! 1. the *walker* (one thread, [`walker`]) visits the source in sorted order and
//!    emits a numbered stream of items (directory start/end, small files to read,
//!    large-file starts, batches of chunk data, file ends, complete entries).
//!    *Scanners* ([`scan`], a small pool) list, stat and compare directories against
//!    the parent snapshot ahead of the walker, several at once; unchanged files reuse
//!    the parent's chunk list there. The walker reads and chunks large files itself;
//! 2. *workers* ([`default_read_concurrency`], several per core: they also wait on
//!    small-file reads) read, chunk and hash small files and hash the walker's chunks, skip the chunks the index or
//!    another worker already has, and compress and seal the new ones;
//! 3. the *archiver* ([`archiver`], on the calling thread) takes the items back in
//!    stream order, appends new blobs to packs (so packs keep stream order), builds
//!    chunk lists and directory trees as directories complete, and hands sealed packs
//!    to the uploader.
//!
//! Memory is bounded: chunk data in flight is capped by a byte budget, files are read
//! in pieces, and only the open directories of the current path are held.
//!
//! Commit: the snapshot object is written after the uploader has stored every pack and
//! the index files that list them. A crash before that loses only this snapshot.

mod archiver;
mod image;
mod links;
pub(crate) use image::source_size as image_source_size;
mod scan;
pub mod source;
mod walker;

use crate::error::{Error, Result};
use crate::progress::{Phase, Progress};
use crate::repo::Repository;
use crate::repo::blob::{BlobEncoder, EncodedBlob};
use crate::repo::packer::BufferPool;
use crate::session::{self, Session};
use cairn_backend::DedupAnswer;
use cairn_format::pack::BlobKind;
use cairn_format::snapshot::{Snapshot, SnapshotSummary};
use cairn_format::tree::Node;
use cairn_format::{BlobId, SnapshotId};
use crossbeam_channel::bounded;
use std::collections::HashSet;
use std::io::{Read, Seek};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Condvar, Mutex};
use std::time::Instant;

/// What to back up and how to label it.
#[derive(Default)]
pub struct BackupOptions {
    pub paths: Vec<PathBuf>,
    /// `--stdin`: back up this stream as one file of this name.
    pub stdin: Option<(String, Box<dyn Read + Send>)>,
    /// `--image`: back up a disk image or block device in fixed blocks.
    pub image: Option<crate::ops::image::ImageOptions>,
    pub tags: Vec<String>,
    pub host: Option<String>,
    /// What to leave out; the snapshot records the `--exclude` patterns.
    pub excludes: source::ExcludeRules,
    pub one_file_system: bool,
    /// Parent snapshot for change detection (`latest` or an id prefix); `None`
    /// picks the latest one with the same host and paths.
    pub parent: Option<String>,
    /// Read every file even when the parent says it is unchanged.
    pub force: bool,
    /// `--skip-if-unchanged`: save no snapshot when the new one's tree is the
    /// parent's (nothing was added, changed or removed, metadata included), as
    /// restic's flag: an hourly job over a quiet tree does not pile up copies.
    pub skip_if_unchanged: bool,
    /// What a file must keep to be taken as unchanged since the parent.
    pub change_detection: ChangeDetection,
    /// Worker threads, which read small files (several at once hide read latency);
    /// `None`: [`default_read_concurrency`].
    pub read_concurrency: Option<usize>,
    /// Packs of this backup fill up to this many bytes (`None`: the repository's
    /// pack size): small packs for a slow link lose seconds, not minutes, when it
    /// drops.
    pub pack_size: Option<u64>,
    /// Read sources at most at this many bytes per second on average
    /// (`--read-limit`: a backup that leaves the disk to production).
    pub read_limit: Option<u64>,
    /// The snapshot's time instead of now (`--time`: importing old backups), as
    /// [`crate::time::parse_user_time`] reads it.
    pub time: Option<String>,
    /// Send an [`Event::File`](crate::progress::Event::File) for each file of
    /// the source (`--verbose`): new, modified or unchanged.
    pub list_files: bool,
}

/// What a file must keep, besides its size and modification time, to be taken as
/// unchanged since the parent snapshot (and not read). The device number is never
/// compared: a file system backed up from a fresh LVM, btrfs or ZFS snapshot each
/// time gets a new one, with the same inodes and change times.
#[derive(Clone, Copy, Debug, Default)]
pub struct ChangeDetection {
    /// `--ignore-inode`: neither the inode number nor the change time (file
    /// systems that give new inode numbers at each mount: some FUSE and network
    /// ones), as restic's flag.
    pub ignore_inode: bool,
    /// `--ignore-ctime`: not the change time (files rewritten in place with their
    /// old modification time, by a sync tool that also resets it).
    pub ignore_ctime: bool,
}

impl ChangeDetection {
    /// Whether an entry's change time and inode number still prove that its
    /// extended attributes and link target are the parent's.
    pub(crate) fn trusts_ctime(self) -> bool {
        !self.ignore_inode && !self.ignore_ctime
    }
}

/// An entry that could not be backed up.
#[derive(Clone, Debug, serde::Serialize)]
pub struct Skipped {
    #[serde(serialize_with = "crate::report::lossy_path")]
    pub path: PathBuf,
    #[serde(rename = "error")]
    pub message: String,
}

/// What a backup did: the snapshot it saved and what it left out.
#[derive(Clone, Debug, serde::Serialize)]
pub struct BackupReport {
    /// The snapshot saved; `None` when none was, with `--skip-if-unchanged`
    /// (`unchanged`).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub snapshot_id: Option<SnapshotId>,
    /// With `--skip-if-unchanged`: nothing changed since the parent, so no
    /// snapshot was saved.
    #[serde(skip_serializing_if = "std::ops::Not::not")]
    pub unchanged: bool,
    pub parent: Option<SnapshotId>,
    pub time: String,
    pub paths: Vec<String>,
    #[serde(flatten)]
    pub summary: SnapshotSummary,
    pub skipped: Vec<Skipped>,
    /// Files that changed while they were read: saved as read (the content may mix
    /// old and new data), and read again by the next backup.
    pub changed_while_read: Vec<Skipped>,
    pub packs_written: u64,
    /// Bytes this run stored in the repository: its packs (blobs, with their
    /// headers) and index files, what `stats` sees the repository grow by but for
    /// the snapshot object and the index file recording it (a few hundred bytes).
    /// `data_added_packed` counts the blobs alone.
    pub bytes_stored: u64,
    /// Seconds spent waiting for a job slot before the backup began (not part of
    /// `duration_secs`, which is the backup's own time).
    pub slot_wait_secs: f64,
    /// Files in the snapshot per second of the backup's own time.
    pub files_per_sec: f64,
    /// Lookups in the SSD placement that failed to read its local files: those
    /// chunks were stored again (the snapshot is complete) but not deduplicated.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub index_lookup_failures: Option<LookupFailures>,
    /// Damage met in those files and mended in the run (see
    /// [`crate::report::index_repaired`]).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub index_repaired: Option<String>,
    /// Data this backup added that a backup running at the same time stored too
    /// (each copy was counted as added by its backup; prune reclaims one).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub concurrent_duplicates: Option<ConcurrentDuplicates>,
    /// Set when the storage (a cairn server) answered dedup queries instead of the
    /// whole index being read.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub server_dedup: Option<ServerDedup>,
    /// New chunk ids this backup kept track of on local disk rather than in RAM
    /// (a run that stored more than its share of memory holds; see
    /// `index/claims.rs`).
    #[serde(skip_serializing_if = "crate::report::is_zero")]
    pub claims_on_disk: u64,
    /// An image backup's figures (blocks read, changed, zero; unreadable ranges),
    /// as the snapshot records them.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub image: Option<cairn_format::snapshot::ImageInfo>,
    #[serde(skip)]
    pub snapshot: Snapshot,
}

/// How a backup through a server deduplicated.
#[derive(Clone, Debug, serde::Serialize)]
pub struct ServerDedup {
    /// Index files read (those listing trees and chunk lists).
    pub index_files_read: usize,
    /// Data chunks the server knew when the backup began.
    pub chunks_known: u64,
    /// Chunk ids this backup asked the server about; the others were known to
    /// be stored (remembered from earlier backups, or answered before).
    pub chunks_asked: u64,
    /// Of those, the ones the server said it already held.
    pub chunks_answered_stored: u64,
    /// Stored chunk ids remembered on this machine from earlier backups.
    pub chunks_remembered: u64,
}

pub use crate::report::LookupFailures;

/// One element of the stream from walker to archiver.
pub(crate) enum Item {
    /// A directory's entries follow, up to its `DirEnd`. With the parent
    /// snapshot's entry of its name, if any, so that the archiver can tell a new,
    /// changed or unchanged directory.
    DirStart(Box<Node>, Option<Box<Node>>),
    DirEnd,
    /// A regular file whose content follows as `Data`/`Chunks` items, then `FileEnd`.
    FileStart {
        node: Box<Node>,
        changed: bool,
        /// Its inode, when its other names take what is read ([`links`]).
        link: Option<links::Inode>,
    },
    /// Raw chunk data from the walker: `buf[start..]` holds chunks of the given
    /// lengths (an image reader starts them 4 KiB-aligned in memory, to read into
    /// the buffer with `O_DIRECT`).
    Data {
        buf: Vec<u8>,
        start: usize,
        lens: Vec<u32>,
    },
    /// `Data` after a worker has hashed and (if new) encoded each chunk.
    Chunks {
        chunks: Vec<ChunkOut>,
        bytes: usize,
    },
    /// A regular file of at most [`walker::SMALL_FILE_BYTES`] for a worker to read.
    SmallFile {
        path: PathBuf,
        /// The open directory holding it (opened by name there), if the walker
        /// listed it; a file named on the command line is opened by path.
        dir: Option<std::sync::Arc<std::os::fd::OwnedFd>>,
        node: Box<Node>,
        changed: bool,
        /// Read its xattrs from the open file (the scanner left them).
        xattrs_unread: bool,
        link: Option<links::Inode>,
    },
    /// A `SmallFile` a worker has read, chunked, hashed and encoded. `budget` is
    /// what the walker took for it.
    SmallDone {
        node: Box<Node>,
        changed: bool,
        chunks: Vec<ChunkOut>,
        budget: usize,
        /// The file kept changing while it was read (saved as last read).
        torn: Option<Skipped>,
        link: Option<links::Inode>,
    },
    /// A `SmallFile` that could not be read: left out of the snapshot.
    SmallFailed {
        skipped: Skipped,
        budget: usize,
        link: Option<links::Inode>,
    },
    /// `ok == false`: reading failed part-way; the file is left out.
    FileEnd {
        ok: bool,
        /// The file changed while it was read (saved as read).
        torn: Option<Skipped>,
    },
    /// Another name of a hard-linked file read earlier in this backup, with that
    /// read's content ([`links`]). `changed`: the parent snapshot had a file of
    /// that name.
    Linked {
        node: Box<Node>,
        changed: bool,
        path: PathBuf,
        /// No other name of the inode is to come.
        last: bool,
    },
    /// The inode's last name was read itself: what its linkable name was read
    /// as is not needed any more.
    LinkDone(links::Inode),
    /// A complete entry: an unchanged file (content reused), a symlink, a device...
    Entry {
        node: Box<Node>,
        unchanged: bool,
    },
    Skipped(Skipped),
    /// An image file (`backup --image`) whose content follows as `Data` (fixed
    /// blocks) and `Reuse` items, then `FileEnd`. Its chunk list has the image
    /// geometry's fanout; `parent` is the parent snapshot's image content, which
    /// the archiver compares blocks with to count those that changed.
    ImageStart {
        node: Box<Node>,
        geometry: crate::tree::fixed::Geometry,
        parent: Option<(crate::tree::fixed::Geometry, cairn_format::tree::Content)>,
        /// A block device's image with a parent: the parent image's mtime, atime
        /// and ctime, which the image keeps when its content is the parent's
        /// (else it has the time it was read).
        unchanged_times: Option<[cairn_format::tree::Timestamp; 3]>,
    },
    /// A whole subtree of the parent image's chunk list taken as it is: an entry
    /// of a level-`level` list covering `chunks` blocks.
    Reuse {
        level: u32,
        entry: cairn_format::tree::ChunkRef,
        chunks: u64,
    },
    /// Something the image reader has to say: unreadable ranges, a size change.
    ImageNote(image::Note),
    End,
}

pub(crate) struct ChunkOut {
    pub id: BlobId,
    pub length: u32,
    pub blob: Option<EncodedBlob>,
    /// Another client of the server is sending this chunk: the archiver holds the
    /// blob and sends it only if that client's copy never arrives.
    pub held: bool,
}

/// What a worker does with a chunk.
#[derive(Clone, Copy)]
enum Decision {
    /// Stored already, or another worker of this run encodes it.
    Skip,
    /// Encode it; `held`: see [`ChunkOut::held`].
    Encode { held: bool },
}

/// Caps the chunk bytes between walker and archiver. `abort` wakes a waiting walker
/// when a later stage has failed.
pub(crate) struct Budget {
    used: Mutex<usize>,
    cv: Condvar,
    limit: usize,
    aborted: AtomicBool,
    /// Large chunk buffers, recycled by the workers for the walker.
    pub(crate) pool: BufferPool,
}

impl Budget {
    fn new(limit: usize) -> Self {
        Self::with_pool(limit, 2)
    }

    /// `buffers`: large buffers kept for reuse (an image backup keeps its reads'
    /// buffers: a fresh 4 MiB buffer costs a thousand page faults).
    fn with_pool(limit: usize, buffers: usize) -> Self {
        Budget {
            used: Mutex::new(0),
            cv: Condvar::new(),
            limit,
            aborted: AtomicBool::new(false),
            pool: BufferPool::new(buffers),
        }
    }
    pub(crate) fn acquire(&self, n: usize) -> Result<()> {
        let mut used = self.used.lock().unwrap_or_else(|e| e.into_inner());
        while *used > 0 && *used + n > self.limit {
            if self.aborted.load(Ordering::Relaxed) {
                return Err(Error::Interrupted);
            }
            used = self.cv.wait(used).unwrap_or_else(|e| e.into_inner());
        }
        if self.aborted.load(Ordering::Relaxed) {
            return Err(Error::Interrupted);
        }
        *used += n;
        Ok(())
    }
    pub(crate) fn release(&self, n: usize) {
        let mut used = self.used.lock().unwrap_or_else(|e| e.into_inner());
        *used = used.saturating_sub(n);
        self.cv.notify_all();
    }
    pub(crate) fn abort(&self) {
        self.aborted.store(true, Ordering::Relaxed);
        let _g = self.used.lock().unwrap_or_else(|e| e.into_inner());
        self.cv.notify_all();
    }
}

/// Ids that some worker is already encoding in this run (bounded: past a share
/// of the memory plan they go to local disk).
pub(crate) use crate::index::claims::Claims as InFlight;

const CHUNK_BYTES_IN_FLIGHT: usize = 16 << 20;

/// The warning for a file that changed while it was being read.
pub(crate) const CHANGED_WHILE_READ: &str =
    "changed while it was being read (saved as read; the next backup reads it again)";

pub(crate) fn absolute(p: &Path) -> Result<PathBuf> {
    let abs = std::path::absolute(p).map_err(|e| Error::io(p, e))?;
    // A path ending in `/` or `/.` names a directory, through a symlink too (as
    // the kernel, tar and rsync take it): resolved whole.
    let given = p.as_os_str().as_encoded_bytes();
    if given.ends_with(b"/") || given.ends_with(b"/.") {
        // As given: `absolute` drops the `/.`, and `file/.` would pass for `file`.
        return p.canonicalize().map_err(|e| Error::io(p, e));
    }
    // Resolve `..` and symlinks in the parent, keep the last component as it is (a
    // symlink given on the command line is saved as a symlink).
    match (abs.parent(), abs.file_name()) {
        (Some(parent), Some(name)) => {
            // Named as given: the directory that failed is only a part of it.
            let parent = parent.canonicalize().map_err(|e| Error::io(p, e))?;
            Ok(parent.join(name))
        }
        _ => abs.canonicalize().map_err(|e| Error::io(&abs, e)),
    }
}

/// The directories of `repo` on this machine, which no backup into it takes in
/// ([`source::ExcludeRules::own_dirs`]) and no `restore --delete` from it removes:
/// a local repository's root.
pub(crate) fn own_dirs(repo: &Repository) -> Vec<PathBuf> {
    match crate::repo::storage::Location::parse(repo.location()) {
        Ok(crate::repo::storage::Location::Local(p)) => vec![p],
        _ => Vec::new(),
    }
}

/// `rules` as a backup into `repo` applies them: with the repository's own
/// directories left out.
fn rules_for(repo: &Repository, rules: &source::ExcludeRules) -> source::ExcludeRules {
    let mut rules = rules.clone();
    rules.own_dirs.extend(own_dirs(repo));
    rules
}

/// The exclusions of a backup into `repo` ([`rules_for`]), for the walk that
/// counts its total for the progress display.
pub fn excludes(
    repo: &Repository,
    rules: &source::ExcludeRules,
) -> Result<source::Excludes, String> {
    source::Excludes::new(&rules_for(repo, rules))
}

/// A path as the snapshot records it: its bytes that are not UTF-8 as their
/// stand-ins ([`crate::tree::escape_name`]), as listings name entries, so that
/// two directories whose names differ only there (`proj\xe9`, `proj\xe8`) stay
/// two paths (QA r15: both read `proj\u{fffd}`, and `forget` took them for one
/// backup set and deleted the only snapshot of one).
fn snapshot_path(p: &std::path::Path) -> String {
    use std::os::unix::ffi::OsStrExt;
    crate::tree::escape_name(p.as_os_str().as_bytes())
}

fn same_paths(a: &[String], b: &[String]) -> bool {
    let mut a = a.to_vec();
    let mut b = b.to_vec();
    a.sort();
    b.sort();
    a == b
}

/// Before the commit: the packs this backup stored are still in the storage. A
/// prune that took its lock for stale (a host whose clock runs half an hour ahead,
/// a lock removed by hand) may have deleted them; a snapshot committed then would
/// not restore, and its index files would lead later backups to the same loss.
/// Asked of each pack (one small request each) or a directory (`data/xx/`) at a
/// time, whichever takes fewer requests; through `cairn serve` the server's own
/// clock judges locks, and this check is left to it. When packs are gone, this
/// backup's index files are taken back (its other packs are then unindexed, and
/// prune's to remove) and it fails.
fn packs_still_there(repo: &Repository, r: &Ran) -> Result<()> {
    if r.pack_ids.is_empty() || repo.backend().discards_writes() || repo.through_server() {
        return Ok(());
    }
    let mut by_dir: std::collections::BTreeMap<String, Vec<String>> = Default::default();
    for id in &r.pack_ids {
        let hex = id.to_hex();
        let name = cairn_backend::names::pack(&hex);
        let dir = name.rsplit_once('/').map_or("", |(d, _)| d).to_string();
        by_dir.entry(dir).or_default().push(hex);
    }
    // A listing returns about 1,000 names a request (S3), and a directory holds
    // 1/256 of the repository's packs: a large repository's listings would cost
    // more than asking for a few packs.
    let pages_per_dir = repo.index().packs().len() / 256 / 1000 + 1;
    let mut gone = 0usize;
    if r.pack_ids.len() <= by_dir.len() * pages_per_dir {
        let found = crate::threads::parallel_map(&r.pack_ids, 8, |id| {
            let name = cairn_backend::names::pack(&id.to_hex());
            repo.backend().get_range(&name, 0, 0)
        });
        for f in found {
            match f {
                Ok(_) => {}
                Err(e) if e.is_not_found() => gone += 1,
                Err(e) => return Err(e.into()),
            }
        }
    } else {
        for (dir, ids) in &by_dir {
            let listed: HashSet<String> = repo
                .backend()
                .list(&format!("{dir}/"))?
                .iter()
                .map(|o| cairn_backend::names::listed(&o.name).to_string())
                .collect();
            gone += ids.iter().filter(|h| !listed.contains(*h)).count();
        }
    }
    if gone == 0 {
        return Ok(());
    }
    for f in &r.index_files {
        let _ = repo.delete_index_file(f);
    }
    Err(Error::Invalid(format!(
        "{gone} of the {} packs this backup stored are gone from the repository: a prune \
         took its lock for stale (do this machine's and the pruning machine's clocks \
         agree? see docs/FORMAT.md) or its lock was removed; no snapshot was saved (run \
         the backup again)",
        r.pack_ids.len()
    )))
}

/// Backs up `opts.paths` (or standard input) into a new snapshot. The session
/// holds the backup's lock and job slot and has loaded the index.
pub fn backup(session: &Session<session::Backup>, opts: BackupOptions) -> Result<BackupReport> {
    let progress = session.progress();
    progress.phase(Phase::Backup);
    let parent = match &opts.parent {
        Some(spec) => Some(session.find_snapshot(spec)?),
        None => None,
    };
    let (listed, unreadable) = session.snapshots()?;
    let skip_if_unchanged = opts.skip_if_unchanged;
    let r = run(session.repo(), opts, parent, listed, unreadable, progress)?;
    progress.check_cancelled()?;
    packs_still_there(session.repo(), &r)?;
    let unchanged = skip_if_unchanged && r.parent_tree.as_deref() == Some(r.snapshot.tree.as_str());
    let snapshot_id = if unchanged {
        None
    } else if session.repo().backend().discards_writes() && !session.holds_lock() {
        // A dry run where no lock could be written: nothing is stored, so there
        // is no commit to guard (the id is the one an unsealed snapshot would have).
        Some(SnapshotId::of_content(&r.snapshot.to_bytes()))
    } else {
        Some(
            session
                .repo()
                .write_snapshot(&r.snapshot, session.commit_lock()?)?,
        )
    };
    if let Some(d) = session.repo().dedup() {
        d.remember(&r.stored_data);
    }
    // What the next changed-block list of this source is relative to.
    if let Some(id) = &snapshot_id
        && r.snapshot.image.is_some()
        && !unchanged
        && !session.repo().backend().discards_writes()
        && let Err(e) = image::record_last_written(session.repo(), &r.snapshot, id)
    {
        progress.notice(format!(
            "could not record this image snapshot as the last one of its source on this \
             machine ({e}): the next --changed-blocks backup cannot tell whether its list \
             is relative to the parent it finds"
        ));
    }
    let index_lookup_failures = LookupFailures::of(session.repo());
    // After the commit: a failure to read the others' index files only loses the
    // note, never the snapshot.
    let concurrent_duplicates = if session.repo().dedup().is_none() {
        concurrent_duplicates(session.repo(), &r.index_before, &r.index_files).unwrap_or_else(|e| {
            progress.warning_msg(format!(
                "could not compare with backups that ran at the same time: {e}"
            ));
            None
        })
    } else {
        None
    };
    Ok(BackupReport {
        snapshot_id,
        unchanged,
        parent: r.parent,
        time: r.snapshot.time.clone(),
        paths: r.snapshot.paths.clone(),
        summary: r.snapshot.summary.clone(),
        skipped: r.skipped,
        changed_while_read: r.changed_while_read,
        packs_written: r.packs_written,
        bytes_stored: r.bytes_stored,
        claims_on_disk: r.claims_on_disk,
        slot_wait_secs: session.slot_wait().as_secs_f64(),
        files_per_sec: {
            let s = &r.snapshot.summary;
            (s.files_new + s.files_changed + s.files_unchanged) as f64 / s.duration_secs.max(1e-6)
        },
        index_lookup_failures,
        index_repaired: crate::report::index_repaired(session.repo()),
        concurrent_duplicates,
        server_dedup: session.repo().dedup().map(|d| ServerDedup {
            index_files_read: d.index_files_read,
            chunks_known: d.chunks_known,
            chunks_asked: d.asked(),
            chunks_answered_stored: d.answered_stored(),
            chunks_remembered: d.remembered as u64,
        }),
        image: r.snapshot.image.clone(),
        snapshot: r.snapshot,
    })
}

struct Ran {
    snapshot: Snapshot,
    parent: Option<SnapshotId>,
    /// The parent's tree (hex), as its snapshot names it.
    parent_tree: Option<String>,
    skipped: Vec<Skipped>,
    changed_while_read: Vec<Skipped>,
    packs_written: u64,
    bytes_stored: u64,
    claims_on_disk: u64,
    stored_data: Vec<BlobId>,
    index_files: Vec<cairn_format::IndexId>,
    pack_ids: Vec<cairn_format::PackId>,
    /// Index files that existed when the backup began.
    index_before: HashSet<cairn_format::IndexId>,
}

/// Data this backup stored that another backup, running at the same time, stored
/// too: both copies are in packs now, and prune reclaims one.
#[derive(Clone, Debug, Default, serde::Serialize)]
pub struct ConcurrentDuplicates {
    pub chunks: u64,
    /// Plaintext bytes of those chunks.
    pub bytes: u64,
}

/// Most blobs read from other backups' new index files to look for duplicates: past
/// this the check is skipped (it is a report, not a correctness matter).
const DUPLICATE_CHECK_MAX_BLOBS: usize = 4_000_000;

/// Compares the data chunks this backup indexed (`ours`) with those of index files
/// other writers added while it ran (all not in `before` and not ours).
fn concurrent_duplicates(
    repo: &Repository,
    before: &HashSet<cairn_format::IndexId>,
    ours: &[cairn_format::IndexId],
) -> Result<Option<ConcurrentDuplicates>> {
    let ours_set: HashSet<_> = ours.iter().copied().collect();
    let others: Vec<_> = repo
        .list_index_files()?
        .into_iter()
        .filter(|id| !before.contains(id) && !ours_set.contains(id))
        .collect();
    if others.is_empty() || ours.is_empty() {
        return Ok(None);
    }
    let mut theirs: HashSet<BlobId> = HashSet::new();
    for id in &others {
        // A file that went away meanwhile (prune superseding it) holds nothing new.
        let Ok(f) = repo.read_index_file(id) else {
            continue;
        };
        for p in &f.packs {
            theirs.extend(
                p.blobs
                    .iter()
                    .filter(|b| b.kind == cairn_format::pack::BlobKind::Data)
                    .map(|b| b.id),
            );
        }
        if theirs.len() > DUPLICATE_CHECK_MAX_BLOBS {
            return Ok(None);
        }
    }
    let mut dup = ConcurrentDuplicates::default();
    for id in ours {
        // Ours too may be gone: a prune running meanwhile superseded it with a
        // file of its own (QA: that was reported as a failure to compare).
        let f = match repo.read_index_file(id) {
            Ok(f) => f,
            Err(Error::Backend(b)) if b.is_not_found() => continue,
            Err(e) => return Err(e),
        };
        for b in f.packs.iter().flat_map(|p| p.blobs.iter()) {
            if b.kind == cairn_format::pack::BlobKind::Data && theirs.contains(&b.id) {
                dup.chunks += 1;
                dup.bytes += u64::from(b.raw_length);
            }
        }
    }
    Ok((dup.chunks > 0).then_some(dup))
}

/// Everything before the commit: stores every new blob and builds the snapshot.
fn run(
    repo: &Repository,
    mut opts: BackupOptions,
    parent: Option<(SnapshotId, Snapshot)>,
    listed: &[(SnapshotId, Snapshot)],
    unreadable: &[crate::repo::SnapshotError],
    progress: &Progress,
) -> Result<Ran> {
    let start = Instant::now();
    let started_at = match &opts.time {
        None => crate::time::now_rfc3339(),
        Some(t) => crate::time::parse_user_time(t).ok_or_else(|| {
            Error::BadArgument(format!(
                "--time {t:?}: give an RFC 3339 time (2026-05-01T02:00:00Z) or \
                 \"YYYY-MM-DD HH:MM:SS\" (local time)"
            ))
        })?,
    };
    // To tell, at the end, which index files other backups wrote meanwhile. Through
    // a server, chunks another client is sending are waited for, never stored twice.
    let index_before: HashSet<cairn_format::IndexId> = if repo.dedup().is_none() {
        repo.list_index_files()?.into_iter().collect()
    } else {
        HashSet::new()
    };
    let host = opts.host.clone().unwrap_or_else(crate::repo::hostname);
    // Filters (`--tag a,b`, `--keep-tag`) split on commas and take an empty entry
    // for "untagged": a tag with a comma, or an empty one, could never be selected.
    if let Some(t) = opts.tags.iter().find(|t| t.is_empty() || t.contains(',')) {
        return Err(Error::BadArgument(format!(
            "tag {t:?}: a tag is a non-empty name without commas"
        )));
    }
    if host.is_empty() {
        return Err(Error::Invalid("the host name is empty".into()));
    }
    let rules = rules_for(repo, &opts.excludes);
    let excludes = source::Excludes::new(&rules).map_err(Error::BadArgument)?;
    if let Some(n) = opts.pack_size {
        let range = crate::repo::CLIENT_PACK_SIZE_MIN..=crate::repo::PACK_SIZE_MAX;
        if !range.contains(&n) {
            return Err(Error::BadArgument(
                "--pack-size must be between 128 KiB and 256 MiB".into(),
            ));
        }
    }

    let mut missing = Vec::new();
    let (paths, snapshot_paths): (Vec<PathBuf>, Vec<String>) = match &opts.stdin {
        _ if opts.image.is_some() => {
            let src = opts
                .image
                .as_ref()
                .map(|i| absolute(&i.source))
                .transpose()?;
            (Vec::new(), src.iter().map(|p| snapshot_path(p)).collect())
        }
        Some((name, _)) => (
            Vec::new(),
            vec![format!("/{}", stdin_path(name)?.join("/"))],
        ),
        None => {
            if opts.paths.is_empty() {
                // A missing argument: exit 2, as for any usage error (QA r29).
                return Err(Error::BadArgument(
                    "nothing to back up: give at least one path".into(),
                ));
            }
            // A path that cannot be looked at (gone, an unmounted volume) is left
            // out with a warning and the backup goes on with the others, as
            // restic's does (exit code 3 then); only none at all is an error.
            let mut v = Vec::new();
            let mut gone = Vec::new();
            for p in &opts.paths {
                // A directory on the way that is gone too (`absolute` resolves
                // the parent) is the same case.
                let a = match absolute(p) {
                    Ok(a) => a,
                    Err(Error::Io { source, .. }) => {
                        gone.push((std::path::absolute(p).unwrap_or_else(|_| p.clone()), source));
                        continue;
                    }
                    Err(e) => return Err(e),
                };
                match std::fs::symlink_metadata(&a) {
                    Ok(_) => v.push(a),
                    Err(e) => gone.push((a, e)),
                }
            }
            if v.is_empty() {
                // Every one named, not only the last.
                return Err(match gone.len() {
                    0 => Error::Invalid("nothing to back up: give at least one path".into()),
                    1 => {
                        let (a, e) = gone.remove(0);
                        Error::io(&a, e)
                    }
                    _ => Error::Invalid(format!(
                        "nothing to back up: none of the paths given can be read: {}",
                        gone.iter()
                            .map(|(a, e)| format!("{} ({e})", a.display()))
                            .collect::<Vec<_>>()
                            .join(", ")
                    )),
                });
            }
            for (a, e) in gone {
                let message = format!("{e}: left out of the snapshot");
                progress.warning(&a, &message);
                missing.push(Skipped { path: a, message });
            }
            v.sort();
            v.dedup();
            // A path inside the repository (its `data/`, say) is as much the
            // repository as its root: left out too.
            let owns: Vec<PathBuf> = (rules.own_dirs.iter())
                .filter_map(|d| d.canonicalize().ok())
                .collect();
            let (inside, kept): (Vec<PathBuf>, Vec<PathBuf>) = v.iter().cloned().partition(|p| {
                p.canonicalize()
                    .is_ok_and(|c| owns.iter().any(|o| c.starts_with(o) && c != *o))
            });
            // Every path given excluded (`-e` matching a source itself): the
            // snapshot would be empty, and say it saved them.
            let left_out = |p: &PathBuf| match std::fs::symlink_metadata(p) {
                Ok(m) => excludes.excludes_named(p, &m),
                Err(_) => excludes.is_excluded(p),
            };
            if kept.iter().all(left_out) {
                return Err(Error::Invalid(format!(
                    "nothing to back up: every path given is excluded ({})",
                    v.iter()
                        .map(|p| p.display().to_string())
                        .collect::<Vec<_>>()
                        .join(", ")
                )));
            }
            for own in &owns {
                if v.iter().any(|p| own.starts_with(p)) {
                    progress.notice(format!(
                        "leaving out {}: it is the repository this backup writes to",
                        own.display()
                    ));
                }
            }
            for p in &inside {
                progress.notice(format!(
                    "leaving out {}: it is inside the repository this backup writes to",
                    p.display()
                ));
            }
            let v = kept;
            let s = v.iter().map(|p| snapshot_path(p)).collect();
            (v, s)
        }
    };

    // The snapshot lists every path given (as restic's does); it must stay readable
    // (`MAX_METADATA_OBJECT_SIZE`, with room for the rest of it). Said before any
    // data is read, not at the commit point.
    let names_len = snapshot_paths.iter().map(|p| p.len() + 8).sum::<usize>();
    if names_len > cairn_format::consts::MAX_METADATA_OBJECT_SIZE - (16 << 20) {
        return Err(Error::Invalid(format!(
            "{} paths ({} MiB of names) are more than one snapshot can list; back up \
             their parent directories (with --exclude for what to leave out) instead",
            snapshot_paths.len(),
            names_len >> 20
        )));
    }

    let is_image = opts.image.is_some();
    // `--force` reads everything and compares with nothing: no parent is recorded
    // (as restic has it), so the counts say "new" truthfully.
    let parent_named = parent.is_some();
    let ours = |s: &Snapshot| {
        s.hostname == host && same_paths(&s.paths, &snapshot_paths) && s.image.is_some() == is_image
    };
    // A snapshot naming this host that the server recorded for another host's
    // token, or that a token without a host stored under a bound token's host,
    // is no parent (only a token without a host, an admin or a direct client
    // sees such snapshots).
    let picks_parent = parent.is_none() && !opts.force;
    let other_hosts = match listed.iter().rev().find(|(_, s)| ours(s)) {
        Some(newest) if picks_parent => {
            let not = repo.not_parents_for(listed, &host)?;
            // Said, when it is the newest backup of these paths: it may be this
            // machine's own, stored through a token without a host (every backup
            // then reads every file again), or one planted in its name.
            if let Some(why) = not.get(&newest.0) {
                progress.warning_msg(format!(
                    "snapshot {} names this host ({host:?}) and these paths, but {why}: it is \
                     not taken as the parent, whose unchanged files it would vouch for (a \
                     machine backing up as {host:?} through a token without a host should \
                     get a token bound to {host:?}: `cairn serve token add NAME --host {host}`)",
                    newest.0.short()
                ));
            }
            not
        }
        _ => std::collections::HashMap::new(),
    };
    // A snapshot that cannot be read may have been this host's last backup of
    // these paths: the parent is then another one, and the files changed since
    // it are read again. Said, as `snapshots` and `restore latest` say it (QA
    // r20: a nightly backup's log showed nothing while its last snapshot was
    // damaged); those that cannot be this host's, as `latest --host` tells
    // them, are not (review: every backup of every host warned).
    let unreadable = if picks_parent && !unreadable.is_empty() {
        repo.narrow_to_hosts(
            &mut listed.to_vec(),
            unreadable,
            std::slice::from_ref(&host),
            &|_| {},
        )?
    } else {
        Vec::new()
    };
    let ours = |id: &SnapshotId, s: &Snapshot| ours(s) && !other_hosts.contains_key(id);
    let parent = match parent {
        _ if opts.force => None,
        Some(p) => Some(p),
        // An image's parent is the one backed up last, which a changed-block list
        // is relative to: the newest that no other is the parent of. By time alone,
        // one dated ahead by a wrong clock would stay the parent after later ones,
        // and their changes would be missing from every image built on it.
        None if is_image => {
            let mine: Vec<&(SnapshotId, Snapshot)> =
                listed.iter().filter(|(id, s)| ours(id, s)).collect();
            let parents: HashSet<&str> = mine
                .iter()
                .filter_map(|(_, s)| s.parent.as_deref())
                .collect();
            mine.iter()
                .rev()
                .find(|(id, _)| !parents.contains(id.to_hex().as_str()))
                .or(mine.last())
                .map(|p| (*p).clone())
        }
        None => listed.iter().rev().find(|(id, s)| ours(id, s)).cloned(),
    };
    for e in unreadable.iter().take(3) {
        progress.warning_msg(format!(
            "snapshot {} could not be read ({}); if it was the last backup of these paths, \
             this one is compared with {} (`cairn check` says more)",
            e.id.short(),
            e.error,
            match &parent {
                Some((id, _)) => format!("another, {}", id.short()),
                None => "none and reads every file".to_string(),
            }
        ));
    }
    if unreadable.len() > 3 {
        progress.warning_msg(format!(
            "{} more snapshots could not be read (`cairn snapshots` lists them)",
            unreadable.len() - 3
        ));
    }
    let image_plan = match opts.image.take() {
        Some(io) => Some(image::plan(
            repo,
            io,
            parent
                .as_ref()
                .map(|(id, s)| (id, s))
                .filter(|_| !opts.force),
            parent_named,
        )?),
        None => None,
    };
    if image_plan.is_some() {
        crate::hooks::point("image:planned");
    }
    let parent_tree = match (&parent, opts.force) {
        (Some((_, s)), false) => Some(
            s.tree_id()
                .map_err(|e| Error::damaged("parent snapshot", e))?,
        ),
        _ => None,
    };

    let key = repo.key().clone();
    let index = repo.index().clone();
    let level = repo.config().compression.zstd_level();
    // Under a memory limit, the chunks in flight and the small-file readers (each
    // holding a file) are sized from the working memory the plan leaves.
    let plan = repo.memory_plan_in_use().copied();
    let in_flight = plan.map_or(CHUNK_BYTES_IN_FLIGHT, |p| {
        p.share(8, 4 << 20, CHUNK_BYTES_IN_FLIGHT as u64) as usize
    });
    let budget = match &image_plan {
        Some(_) => Budget::with_pool(in_flight, image::BUFFERS),
        None => Budget::new(in_flight),
    };
    let inflight = InFlight::spilling(
        crate::ops::scan::scratch_dir(repo),
        plan.map(|p| p.share(6, 8 << 20, u64::MAX)),
    );
    let cores = crate::threads::cores();
    let workers = opts
        .read_concurrency
        .unwrap_or_else(|| default_read_concurrency(cores))
        .min(plan.map_or(usize::MAX, |p| p.share(8 << 20, 2, 256) as usize))
        .clamp(1, 256);
    // Packs being filled and uploaded (about six at a time): smaller under a limit.
    if let Some(p) = plan
        && opts.pack_size.is_none()
    {
        let fits = p.share(
            12,
            crate::repo::CLIENT_PACK_SIZE_MIN,
            repo.config().pack_size.into(),
        );
        if fits < u64::from(repo.config().pack_size) {
            opts.pack_size = Some(fits);
        }
    }
    // Scanners mostly wait on metadata reads; two keep the walker fed on 2 cores.
    let scanners = cores.clamp(2, 8);
    let pool = scan::Pool::new();
    let (work_tx, work_rx) = bounded::<(u64, Vec<Item>)>(16);
    let (res_tx, res_rx) = bounded::<(u64, Vec<Item>)>(16);
    let stdin = opts.stdin.take();

    let read_limiter = opts
        .read_limit
        .filter(|&r| r > 0)
        .map(cairn_backend::Limiter::new);
    let read_limit = read_limiter.as_ref();
    let zero = image_plan.as_ref().map(|p| {
        let z = vec![0u8; p.geometry.block_size as usize];
        let id = key.blob_id(&z);
        (z, id)
    });
    let reads = links::Reads::default();
    let (archived, walk_result) = std::thread::scope(|s| {
        let reads = &reads;
        let budget = &budget;
        let inflight = &inflight;
        let pool = &pool;
        let excludes = &excludes;
        let change = opts.change_detection;
        for _ in 0..scanners {
            let spawned = std::thread::Builder::new()
                .name("cairn-scan".into())
                .spawn_scoped(s, move || {
                    pool.run_scanner(&scan::ScanContext {
                        repo,
                        excludes,
                        change,
                    });
                });
            if spawned.is_err() {
                break; // the walker scans what no scanner takes
            }
        }
        let walk = {
            let paths = &paths;
            let image_plan = &image_plan;
            std::thread::Builder::new()
                .name("cairn-walk".into())
                .spawn_scoped(s, move || {
                    // Scanners wait for work until stopped, even if the walker panics.
                    let _stop = scan::StopOnDrop(pool);
                    let mut w = walker::Walker::new(
                        repo,
                        work_tx,
                        budget,
                        scan::ScanContext {
                            repo,
                            excludes,
                            change,
                        },
                        pool,
                        progress,
                        opts.one_file_system,
                    )
                    .with_read_limit(read_limit)
                    .with_link_reads(reads);
                    let r = match (stdin, image_plan) {
                        (_, Some(plan)) => w.run_image(plan),
                        (Some((name, reader)), None) => w.run_stdin(&name, reader),
                        (None, None) => w.run(paths, parent_tree),
                    };
                    if r.is_err() {
                        budget.abort();
                    }
                    r
                })
        };
        if walk.is_err() {
            pool.stop();
        }
        for _ in 0..workers {
            let work_rx = work_rx.clone();
            let res_tx = res_tx.clone();
            let w = Worker {
                key: key.clone(),
                index: index.clone(),
                dedup: repo.dedup().cloned(),
                deferred: Vec::new(),
                cur_item: 0,
                cur_chunk: 0,
                inflight,
                budget,
                progress,
                enc: BlobEncoder::new(level),
                chunker: repo.chunker(),
                buf: Vec::new(),
                read_limit,
                zero: zero.as_ref(),
                reads,
            };
            let spawned = std::thread::Builder::new()
                .name("cairn-chunk".into())
                .spawn_scoped(s, move || w.run(work_rx, res_tx));
            if spawned.is_err() {
                budget.abort();
            }
        }
        drop(work_rx);
        drop(res_tx);
        let archived = archiver::archive(
            repo,
            res_rx,
            budget,
            inflight,
            opts.pack_size,
            progress,
            opts.list_files,
        );
        if archived.is_err() {
            budget.abort();
        }
        let walk_result = match walk {
            Ok(h) => h
                .join()
                .unwrap_or_else(|_| Err(Error::Invalid("walker thread panicked".into()))),
            Err(e) => Err(Error::Invalid(format!("cannot start walker thread: {e}"))),
        };
        (archived, walk_result)
    });
    // A walker failure explains an incomplete stream better than the archiver's view.
    let archived = match (archived, walk_result) {
        (_, Err(e)) if !matches!(e, Error::Interrupted) => return Err(e),
        (Err(e), _) => return Err(e),
        (Ok(a), _) => a,
    };

    if let Some(w) = inflight.spill_failure() {
        progress.warning_msg(w);
    }
    let mut summary: SnapshotSummary = archived.summary;
    summary.duration_secs = start.elapsed().as_secs_f64();
    summary.entries_skipped += missing.len() as u64;
    let mut skipped = missing;
    skipped.extend(archived.skipped);
    let image = match (&image_plan, archived.image) {
        (Some(plan), Some(counts)) => {
            skipped.extend(image::skipped_for(plan, &counts.notes));
            Some(image::info(plan, counts))
        }
        _ => None,
    };
    let snapshot = Snapshot {
        version: 1,
        // `--time` with an offset names the zone; else this machine's.
        utc_offset: (opts.time.as_deref())
            .and_then(crate::time::given_offset)
            .or_else(|| crate::time::local_offset_at(&started_at)),
        time: started_at,
        hostname: host,
        username: crate::repo::username(),
        paths: snapshot_paths,
        // Each tag once (`--tag x,x --tag x`), in the order given.
        tags: {
            let mut seen = std::collections::HashSet::new();
            opts.tags
                .iter()
                .filter(|t| seen.insert(*t))
                .cloned()
                .collect()
        },
        tree: archived.root.to_hex(),
        parent: parent.as_ref().map(|(id, _)| id.to_hex()),
        excludes: opts.excludes.patterns.clone(),
        original: None,
        copied_from: None,
        program_version: format!("cairn {}", env!("CARGO_PKG_VERSION")),
        image,
        summary,
    };
    Ok(Ran {
        snapshot,
        parent_tree: parent.as_ref().map(|(_, s)| s.tree.clone()),
        parent: parent.map(|(id, _)| id),
        skipped,
        changed_while_read: archived.changed_while_read,
        packs_written: archived.packs,
        bytes_stored: archived.bytes_stored,
        claims_on_disk: inflight.on_disk(),
        stored_data: archived.stored_data,
        index_files: archived.index_files,
        pack_ids: archived.pack_ids,
        index_before,
    })
}

/// The names on the way to the file `--stdin-name` gives (`db.sql`, or a path
/// such as `dumps/db.sql` as restic takes it), refused when one is empty after
/// the first, `.` or `..`: the snapshot holds the file at that path from its top.
pub(crate) fn stdin_path(name: &str) -> Result<Vec<&str>> {
    let parts: Vec<&str> = name
        .trim_start_matches('/')
        .split('/')
        .filter(|c| !c.is_empty())
        .collect();
    if parts.is_empty() || parts.iter().any(|c| *c == "." || *c == "..") {
        return Err(Error::Invalid(format!(
            "invalid --stdin-name {name:?}: give a file name or a path (dumps/db.sql) \
             without . or .. in it; the snapshot holds it from its top"
        )));
    }
    Ok(parts)
}

/// Workers by default: they read small files as well as hash and compress, and a
/// read that misses the page cache blocks its thread, so several per core keep both
/// the cores and the disk busy (measured in docs/PERFORMANCE.md, "Dense filesystems").
pub fn default_read_concurrency(cores: usize) -> usize {
    (8 * cores).max(16)
}

/// A worker thread: hashes and encodes chunk batches, reads small files.
struct Worker<'a> {
    key: std::sync::Arc<cairn_format::key::MasterKey>,
    index: std::sync::Arc<crate::index::MasterIndex>,
    dedup: Option<std::sync::Arc<crate::repo::dedup::DedupClient>>,
    /// Chunks of this bundle waiting for a decision (through a server): item and
    /// chunk position in the bundle's output, id, bytes.
    deferred: Vec<(usize, usize, BlobId, Vec<u8>)>,
    cur_item: usize,
    cur_chunk: usize,
    inflight: &'a InFlight,
    budget: &'a Budget,
    progress: &'a Progress,
    enc: BlobEncoder,
    chunker: cairn_chunker::Chunker,
    /// A small file's content, reused between files.
    buf: Vec<u8>,
    read_limit: Option<&'a cairn_backend::Limiter>,
    /// Image backups: a block of zeros and its id. A zero block (most of a fresh
    /// disk) is recognised by a compare, far cheaper than hashing it.
    zero: Option<&'a (Vec<u8>, BlobId)>,
    /// Where a linkable small file's read is said to have gone whole or not.
    reads: &'a links::Reads,
}

/// How far a small file may grow between its stat and its read before it is left
/// out (its whole content is held in memory while it is encoded).
const SMALL_FILE_GROWTH_LIMIT: usize = 4 * walker::SMALL_FILE_BYTES as usize;

impl Worker<'_> {
    fn run(
        mut self,
        rx: crossbeam_channel::Receiver<(u64, Vec<Item>)>,
        tx: crossbeam_channel::Sender<(u64, Vec<Item>)>,
    ) {
        for (seq, bundle) in rx {
            let mut out_bundle = Vec::with_capacity(bundle.len());
            for item in bundle {
                self.cur_item = out_bundle.len();
                self.cur_chunk = 0;
                let out = match item {
                    Item::Data { buf, start, lens } => {
                        // Hash every chunk first: one decision (through a server, one
                        // question) for all of them, without copying the data.
                        let slot = crate::threads::cpu_slot();
                        let mut ids = Vec::with_capacity(lens.len());
                        let mut pos = start;
                        for &len in &lens {
                            let data = &buf[pos..pos + len as usize];
                            ids.push(match self.zero {
                                Some((z, id)) if data == &z[..] => *id,
                                _ => self.key.blob_id(data),
                            });
                            pos += len as usize;
                        }
                        drop(slot);
                        let Some(decisions) = self.decide(&ids) else {
                            return;
                        };
                        let mut chunks = Vec::with_capacity(lens.len());
                        let mut pos = start;
                        for ((len, id), d) in lens.into_iter().zip(ids).zip(decisions) {
                            let data = &buf[pos..pos + len as usize];
                            pos += len as usize;
                            match self.encode(id, data, d) {
                                Some(c) => chunks.push(c),
                                None => return,
                            }
                        }
                        let bytes = buf.len() - start;
                        if buf.capacity() >= 1 << 20 {
                            self.budget.pool.put(buf);
                        }
                        Item::Chunks { chunks, bytes }
                    }
                    Item::SmallFile {
                        path,
                        dir,
                        node,
                        changed,
                        xattrs_unread,
                        link,
                    } => match self.small_file(path, dir, node, changed, xattrs_unread, link) {
                        Some(item) => item,
                        None => return,
                    },
                    other => other,
                };
                out_bundle.push(out);
            }
            if !self.deferred.is_empty() && !self.resolve(&mut out_bundle) {
                return;
            }
            if tx.send((seq, out_bundle)).is_err() {
                return;
            }
        }
    }

    /// Decides and encodes the chunks [`Worker::chunk`] deferred for this bundle:
    /// one dedup question to the server for a whole bundle of small files.
    fn resolve(&mut self, out: &mut [Item]) -> bool {
        let deferred = std::mem::take(&mut self.deferred);
        let ids: Vec<BlobId> = deferred.iter().map(|d| d.2).collect();
        let Some(decisions) = self.decide(&ids) else {
            return false;
        };
        for ((item, at, id, data), d) in deferred.into_iter().zip(decisions) {
            let Some(c) = self.encode(id, &data, d) else {
                return false;
            };
            if let Item::Chunks { chunks, .. } | Item::SmallDone { chunks, .. } = &mut out[item]
                && let Some(slot) = chunks.get_mut(at)
            {
                *slot = c;
            }
        }
        true
    }

    /// Hashes a chunk and encodes it if neither the index nor another worker has it.
    /// `None`: encoding failed and the pipeline is aborted.
    /// A small file's chunk. Through a server, the decision waits for the end of
    /// the bundle ([`Worker::resolve`]), so a bundle of small files is one
    /// question: the chunk is kept until then.
    fn chunk(&mut self, data: &[u8]) -> Option<ChunkOut> {
        let id = self.key.blob_id(data);
        if self.dedup.is_some() {
            self.deferred
                .push((self.cur_item, self.cur_chunk, id, data.to_vec()));
            self.cur_chunk += 1;
            return Some(ChunkOut {
                id,
                length: data.len() as u32,
                blob: None,
                held: false,
            });
        }
        let d = self.decide(&[id])?;
        self.encode(id, data, d[0])
    }

    /// Which chunks to encode: not in the loaded index, not claimed by another
    /// worker, and, when the server answers dedup queries, not stored there. `None`:
    /// the server could not be asked and the pipeline is aborted.
    fn decide(&mut self, ids: &[BlobId]) -> Option<Vec<Decision>> {
        let mut out = vec![Decision::Skip; ids.len()];
        let mut ask = Vec::new();
        for (i, id) in ids.iter().enumerate() {
            if !self.index.is_live(id) && !self.inflight.contains(id) {
                ask.push(i);
            }
        }
        let answers = match (&self.dedup, ask.is_empty()) {
            (Some(d), false) => {
                let q: Vec<BlobId> = ask.iter().map(|&i| ids[i]).collect();
                match d.query(&q) {
                    Ok(a) => a,
                    Err(e) => {
                        self.progress
                            .warning_msg(format!("dedup query failed: {e}"));
                        self.budget.abort();
                        return None;
                    }
                }
            }
            _ => vec![DedupAnswer::Send; ask.len()],
        };
        for (i, a) in ask.into_iter().zip(answers) {
            if a != DedupAnswer::Stored && !self.inflight.claim(&ids[i]) {
                out[i] = Decision::Encode {
                    held: a == DedupAnswer::InFlight,
                };
            }
        }
        Some(out)
    }

    fn encode(&mut self, id: BlobId, data: &[u8], d: Decision) -> Option<ChunkOut> {
        let (blob, held) = match d {
            Decision::Skip => (None, false),
            Decision::Encode { held } => {
                let _slot = crate::threads::cpu_slot();
                match self.enc.encode(&self.key, BlobKind::Data, id, data) {
                    Ok(b) => (Some(b), held),
                    Err(_) => {
                        self.budget.abort();
                        return None;
                    }
                }
            }
        };
        Some(ChunkOut {
            id,
            length: data.len() as u32,
            blob,
            held,
        })
    }

    fn small_file(
        &mut self,
        path: PathBuf,
        dir: Option<std::sync::Arc<std::os::fd::OwnedFd>>,
        mut node: Box<Node>,
        changed: bool,
        xattrs_unread: bool,
        link: Option<links::Inode>,
    ) -> Option<Item> {
        let budget = walker::small_budget(&node);
        let limit = (node.size as usize)
            .saturating_mul(2)
            .max(SMALL_FILE_GROWTH_LIMIT);
        let mut buf = std::mem::take(&mut self.buf);
        buf.reserve(node.size as usize + 1);
        if link.is_some() {
            crate::hooks::point("backup:link-open-small");
        }
        // As the walker saw it when it sent this name (before the read changes `node`).
        let sent_as = links::stamp(&node);
        let opened = match &dir {
            Some(d) => source::open_source_at(d, &node.name),
            None => source::open_source(&path),
        };
        drop(dir);
        let mut torn = None;
        let read_limit = self.read_limit;
        let read = opened.map_err(|e| e.to_string()).and_then(|mut f| {
            node.flags = source::inode_flags(&f);
            if xattrs_unread {
                match source::read_xattrs_of(&f) {
                    Ok(x) => node.xattrs = x,
                    Err(w) => self.progress.warning(&path, &w),
                }
            }
            // As tar does: a file whose size or times moved while it was read is
            // read again (twice at most), then saved as read with a warning. The
            // first read is compared with what the scan saw (one fstat per file);
            // only a file that differs is watched before and after each read.
            let mut before = source::Changes::of_node(&node);
            for attempt in 0..3 {
                if attempt > 0 {
                    before = source::Changes::of(&f);
                }
                buf.clear();
                read_small(&mut f, &mut buf, limit)?;
                if let Some(l) = read_limit {
                    l.take(buf.len() as u64);
                }
                let after = source::Changes::of(&f);
                if before == after {
                    return Ok(());
                }
                // Not what the scan saw: perhaps another file (replaced since),
                // described then from the open file, whose content was just read.
                // Looked at only here, so an unchanged file costs one fstat.
                if attempt == 0
                    && let Some(n) = source::reopened_node(&node, &f)
                {
                    *node = n;
                    node.flags = source::inode_flags(&f);
                    if source::Changes::of_node(&node) == after {
                        return Ok(());
                    }
                }
                if attempt < 2 {
                    f.seek(std::io::SeekFrom::Start(0))
                        .map_err(|e| format!("read failed: {e}"))?;
                }
            }
            let message = CHANGED_WHILE_READ.to_string();
            self.progress.warning(&path, &message);
            torn = Some(Skipped {
                path: path.clone(),
                message,
            });
            Ok(())
        });
        if let Some(key) = link {
            // That very inode (not one that replaced it since the walk saw it),
            // read whole and unchanged: its other names may take this read.
            let whole = read.is_ok() && torn.is_none() && (node.dev, node.inode) == key;
            self.reads.done(key, sent_as, whole);
        }
        let out = match read {
            Ok(()) => {
                self.progress.bytes_done(buf.len() as u64);
                let mut chunks = Vec::new();
                let mut rest = &buf[..];
                while let Some(n) = self.chunker.next_boundary(rest, true) {
                    let c = self.chunk(&rest[..n])?;
                    chunks.push(c);
                    rest = &rest[n..];
                }
                self.progress.file_done();
                Item::SmallDone {
                    node,
                    changed,
                    chunks,
                    budget,
                    torn,
                    link,
                }
            }
            Err(message) => {
                self.progress.warning(&path, &message);
                Item::SmallFailed {
                    skipped: Skipped { path, message },
                    budget,
                    link,
                }
            }
        };
        buf.clear();
        if buf.capacity() <= 2 * walker::SMALL_FILE_BYTES as usize {
            self.buf = buf;
        }
        Some(out)
    }
}

/// Reads a whole small file into `buf`; more than `limit` bytes is an error.
fn read_small(
    f: &mut std::fs::File,
    buf: &mut Vec<u8>,
    limit: usize,
) -> std::result::Result<(), String> {
    f.take(limit as u64 + 1)
        .read_to_end(buf)
        .map_err(|e| format!("read failed: {e}"))?;
    if buf.len() > limit {
        return Err(format!(
            "grew to more than {limit} bytes while being read; left out of this snapshot"
        ));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn small_reads_are_whole_and_bounded() {
        let tmp = tempfile::tempdir().unwrap();
        let p = tmp.path().join("f");
        std::fs::write(&p, vec![7u8; 5000]).unwrap();
        let dir = source::open_dir(tmp.path()).unwrap();
        let mut buf = Vec::new();
        read_small(
            &mut source::open_source_at(&dir, b"f").unwrap(),
            &mut buf,
            5000,
        )
        .unwrap();
        assert_eq!(buf, vec![7u8; 5000]);
        // A file that grew past the limit is refused, not cut short.
        buf.clear();
        let e = read_small(&mut source::open_source(&p).unwrap(), &mut buf, 4999).unwrap_err();
        assert!(e.contains("grew to more than 4999 bytes"), "{e}");
        let e = source::open_source_at(&dir, b"gone").unwrap_err();
        assert_eq!(e.kind(), std::io::ErrorKind::NotFound);
        // A symlink put in a file's place is not followed.
        std::os::unix::fs::symlink(&p, tmp.path().join("link")).unwrap();
        assert!(source::open_source_at(&dir, b"link").is_err());
        assert!(source::open_source(&tmp.path().join("link")).is_err());
        // Nor is one put in a directory's place.
        std::os::unix::fs::symlink(tmp.path(), tmp.path().join("dirlink")).unwrap();
        assert!(source::open_dir(&tmp.path().join("dirlink")).is_err());
    }
}
