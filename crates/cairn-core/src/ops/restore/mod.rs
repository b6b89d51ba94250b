//! Restore: snapshot tree -> files under a target directory.
//!
//! 1. Walk the tree (filtered by `--include`) with an explicit stack, creating
//!    directories, links, FIFOs and devices, and creating each regular file at its
//!    final size (so unwritten ranges stay holes). Every name was checked by the tree
//!    decoder (no `/`, `.`, `..`, NUL, duplicates).
//! 2. In batches of files (bounded memory and descriptors), [`plan`] expands their
//!    chunk lists and groups the needed blobs by pack; [`execute`] reads each pack
//!    once in coalesced ranges on several threads, opens, decompresses and verifies
//!    every blob against its id, and writes it with positional writes, skipping
//!    all-zero chunks.
//! 3. File metadata is applied after a batch's content; a directory's once its
//!    entries are complete and written (children before parents, so writing
//!    children does not disturb a parent's times).
//!
//! Nothing is done by path below the target: the target is opened once, and every
//! entry is created, opened and changed by one name relative to a directory
//! descriptor restore holds, without following symlinks ([`target`], [`sys`]). A user
//! who owns a directory in the target and swaps entries for symlinks while a root
//! restore runs can make entries fail, never make restore write, chmod or chown
//! anything outside the directories that user could change anyway (docs/FORMAT.md,
//! threat model). Deep trees keep a bounded number of ancestors open and reopen the
//! others through `..`, checked by device and inode.
//!
//! Damage is reported per file: a restore writes everything it can and returns the
//! list of what it could not.

pub(crate) mod execute;
pub(crate) mod metadata;
mod overwrite;
mod plan;
mod run;
pub(crate) mod survey;
pub(crate) mod sys;
pub(crate) mod target;
pub(crate) mod unfinished;

pub use metadata::XattrSelect;
pub use overwrite::Overwrite;
pub(crate) use overwrite::effective as overwrite_effective;
pub(crate) use overwrite::xattrs_match;
pub use run::{Issue, RestoreReport, restore_snapshot};
pub use target::foreign_symlink_owner;

use crate::error::{Error, Result};
use crate::ops::backup::source::Excludes;
use crate::progress::{Event, FileAction, Progress};
use crate::repo::Repository;
use cairn_format::BlobId;
use cairn_format::consts::{INODE_FLAGS, LOCKING_INODE_FLAGS};
use cairn_format::tree::{Content, Node, NodeKind};
use overwrite::Decision;
use std::collections::HashMap;
use std::ffi::{CStr, CString};
use std::fs;
use std::os::fd::{AsFd, OwnedFd};
use std::os::unix::fs::OpenOptionsExt;
use std::path::PathBuf;
use std::sync::{Arc, Weak};
use target::{Dir, DirNode, c_name};

/// The warning for a hard link's name written as a file of its own because
/// `kept`, an earlier name of it, was kept as it is (the restore and its dry run).
pub(crate) fn own_file_warning(kept: &std::path::Path) -> String {
    format!(
        "restored as a file of its own: {}, another name of this file in the snapshot, \
         was kept as it is (--overwrite) and does not look like the snapshot's content",
        kept.display()
    )
}

/// The warning for a hard link's name there already, not linked to `first`, an
/// earlier name kept as it was, because that one does not hold the snapshot's
/// content (the restore and its dry run).
pub(super) fn not_linked_warning(first: &std::path::Path) -> String {
    format!(
        "not made a name of {}, as it is in the snapshot: that one was kept as it is \
         (its size and time are the snapshot's) but holds other content than the \
         snapshot's, so this one is judged on its own",
        first.display()
    )
}

/// Sends `restore --verbose`'s line for a file: its path in the target, as
/// listings show it (bytes that are not UTF-8 as stand-ins).
pub(crate) fn list_file(
    progress: &Progress,
    action: FileAction,
    path: &std::path::Path,
    size: u64,
) {
    use std::os::unix::ffi::OsStrExt;
    progress.emit(Event::File {
        action,
        path: crate::tree::escape_name(path.as_os_str().as_bytes()),
        size,
    });
}

/// A tree of the snapshot with only the extended attributes the restore handles
/// ([`RestoreOptions::xattrs`]): what it does not handle it never sees.
pub(crate) fn load_tree(
    repo: &Repository,
    id: &cairn_format::BlobId,
    select: &XattrSelect,
) -> Result<cairn_format::tree::Tree> {
    let mut tree = repo.load_tree(id)?;
    if !select.is_all() {
        for n in &mut tree.nodes {
            select.retain(&mut n.xattrs);
        }
    }
    Ok(tree)
}

#[derive(Clone)]
pub struct RestoreOptions {
    pub target: PathBuf,
    /// What to restore (with everything below it); empty means all. A path of
    /// the snapshot, or, when it names no entry as it is (or starts with `!`), a
    /// pattern as backup's `--exclude` (`*.conf`, `/home/*/mail`, `sub`: a name
    /// at any depth) choosing every entry it matches, as restic reads includes.
    pub includes: Vec<String>,
    /// Patterns as `includes`' ignoring case (`--iinclude`), wildcards or not.
    pub iincludes: Vec<String>,
    /// Patterns of snapshot paths not to restore (as backup's `--exclude`, matched
    /// against the paths `ls` prints); `--delete` leaves what they match alone.
    pub excludes: Vec<String>,
    /// The same, ignoring case (`--iexclude`).
    pub iexcludes: Vec<String>,
    /// Restore numeric owners (default: when running as root).
    pub owners: bool,
    /// What to do with entries that exist in the target already.
    pub overwrite: Overwrite,
    /// Remove what is in the target's restored directories but not in the snapshot.
    pub delete: bool,
    /// Read every file written back and compare it with the snapshot.
    pub verify: bool,
    /// `if-changed` keeps a file of the snapshot's size and time only once its
    /// bytes are compared too. Set by the restore itself for an image
    /// snapshot: a block device's time does not move when its disk is written,
    /// so size and time say nothing of an image restored before (QA r37).
    pub compare_content: bool,
    /// Write nothing: count what a restore would write, keep and delete.
    pub dry_run: bool,
    /// Write at most this many bytes per second on average (`--write-limit`).
    pub write_limit: Option<u64>,
    /// Which extended attributes are restored (default: all).
    pub xattrs: XattrSelect,
    /// Send an [`Event::File`](crate::progress::Event::File) for each file done
    /// (`--verbose`): restored, updated, unchanged or deleted.
    pub list_files: bool,
    /// A directory of the snapshot restored as the target itself (`SNAP:PATH`, as
    /// restic's `latest:/home/alice --target /home/alice`): its contents go straight
    /// into the target, and paths of `includes`/`excludes` are below it.
    pub subfolder: Option<String>,
}

impl RestoreOptions {
    /// Restore into `target` (created if missing): everything, owners when running
    /// as root, entries already there replaced unless they hold the snapshot's content.
    pub fn new(target: impl Into<PathBuf>) -> Self {
        RestoreOptions {
            target: target.into(),
            includes: Vec::new(),
            iincludes: Vec::new(),
            excludes: Vec::new(),
            iexcludes: Vec::new(),
            owners: sys::euid() == 0,
            overwrite: Overwrite::default(),
            delete: false,
            verify: false,
            compare_content: false,
            dry_run: false,
            write_limit: None,
            xattrs: XattrSelect::default(),
            list_files: false,
            subfolder: None,
        }
    }
}

#[derive(Clone, Debug)]
pub struct RestoreIssue {
    pub path: PathBuf,
    pub message: String,
    /// The repository lacks what the entry needs (a blob damaged or gone from
    /// the index, its pack gone or short), rather than the target or the
    /// storage failing: `cairn check` says what, and which repair helps.
    pub lost_data: bool,
}

/// Why a file was not restored in full, and whether the repository lost what it
/// needs ([`RestoreIssue::lost_data`]).
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct Failure {
    pub message: String,
    pub lost: bool,
}

impl Failure {
    /// A failure that is not the repository's (the target's, a cancel).
    pub(crate) fn of(message: impl Into<String>) -> Failure {
        Failure {
            message: message.into(),
            lost: false,
        }
    }

    /// The repository's loss.
    pub(crate) fn lost(message: impl Into<String>) -> Failure {
        Failure {
            message: message.into(),
            lost: true,
        }
    }

    pub(crate) fn error(e: &Error) -> Failure {
        Failure {
            message: e.to_string(),
            lost: lost_in(e),
        }
    }

    /// The same failure, its message after `prefix: `.
    pub(crate) fn within(self, prefix: &str) -> Failure {
        Failure {
            message: format!("{prefix}: {}", self.message),
            ..self
        }
    }
}

/// Whether `e` means the repository lacks what a read needs: lost data, or an
/// object gone, short or not an object where storage was asked for it.
pub(crate) fn lost_in(e: &Error) -> bool {
    e.is_lost_in_storage()
}

#[derive(Clone, Debug, Default)]
pub struct RestoreStats {
    pub files: u64,
    pub dirs: u64,
    pub other: u64,
    pub bytes: u64,
    pub issues: Vec<RestoreIssue>,
    /// Sockets in the snapshot: not restored (a socket is made by the program that
    /// listens on it; as tar does, they are skipped and counted, not errors).
    pub sockets_skipped: u64,
    /// Entries already in the target that were left as they were (`--overwrite`), and
    /// the bytes of those that are files.
    pub kept: u64,
    pub kept_bytes: u64,
    /// Files whose content was already the snapshot's: only their metadata was set.
    pub metadata_only: u64,
    /// Entries removed from the target because the snapshot does not have them
    /// (`--delete`; a directory counts with everything in it).
    pub deleted: u64,
    /// `--dry-run`: what `--delete` would remove, each at the top of what goes.
    pub would_delete: Vec<std::path::PathBuf>,
    /// `--delete` left the repository being restored from, which was among what
    /// the snapshot does not have ([`SPARED`]).
    pub repository_left: bool,
    /// Files being written when the restore was cancelled, left with the restore's
    /// time and mode 0600 (counted, not listed one by one).
    pub cancelled_files: u64,
    /// Files the writers gave up once the target was full (the restore's error
    /// counts them): not created at all, and created but not written in full
    /// (left with the restore's time and mode 0600).
    pub unwritten_full: u64,
    pub unfinished_full: u64,
    /// Mount points `--delete` left alone with everything in them: it removes nothing
    /// on another file system (or bind mount) than the target's.
    pub mounts_left: u64,
    /// Files read back and compared (`--verify`).
    pub verified: u64,
    /// The start (Unix seconds) of an earlier restore into the target that did not
    /// finish: what changed there since is rewritten whatever `--overwrite` says.
    pub unfinished_before: Option<i64>,
}

/// A regular file whose content still has to be written. It is named by its parent
/// directory's descriptor and its name there, never by a path: the executor writes
/// it later, and a path could lead elsewhere by then.
pub(crate) struct FileJob {
    pub dir: Arc<Dir>,
    pub name: CString,
    pub node: Node,
    /// A single-chunk file with one link: the executor creates it, writes it and sets
    /// its metadata through one open descriptor (the common case of a dense tree:
    /// one lookup instead of five).
    pub direct: bool,
    /// The file the walk created (`None` for `direct` jobs): what the executor
    /// checks it reopened.
    pub created: Option<sys::Stat>,
    /// Something was at its name in the target before (`--verbose` says
    /// "updated" then, "restored" for a new name, as restic's).
    pub replaced: bool,
}

impl FileJob {
    pub fn path(&self) -> PathBuf {
        self.dir.node.join(&self.name)
    }

    /// Opens the file the walk created again, checked to be that very file.
    pub fn reopen(&self, flags: libc::c_int) -> std::io::Result<fs::File> {
        let created = self
            .created
            .as_ref()
            .ok_or_else(|| std::io::Error::other("the file was not created yet"))?;
        target::reopen_file(self.dir.fd(), &self.name, flags, created)
    }
}

const BATCH_CHUNKS: u64 = 1 << 21;
const BATCH_FILES: usize = 50_000;
/// Ancestor directories kept open on the way down a deep tree (besides the target):
/// one descriptor per level would exceed the limit on open files at 100,000 levels.
/// Closed ones are reopened through `..` on the way back up, and checked.
const OPEN_ANCESTORS: usize = 256;

/// A directory being restored: the walk's explicit stack holds one per level (a
/// recursive walk would overflow the thread's stack on a very deep tree).
struct Frame {
    /// Entries still to restore, last first (popped in tree order).
    todo: Vec<Node>,
    /// Open while the frame is among the deepest [`OPEN_ANCESTORS`] (the target always).
    dir: Option<Arc<Dir>>,
    /// The descriptor while anything (the batch) still holds it, to use it again.
    weak: Weak<Dir>,
    node: Arc<DirNode>,
    /// What the directory gets when complete: its entry's metadata, or (kept as
    /// it was by `--overwrite`) its own times back; `None` for the target.
    meta: Option<DirMeta>,
    /// Everything below is selected (no `--include`, or inside one).
    all: bool,
    /// The snapshot path, kept only while `!all` or with excludes (to match
    /// includes and excludes against).
    snap_path: String,
    /// Created by this restore: nothing can be in it that restore did not put there.
    fresh: bool,
    /// With `--delete`, for a directory that existed and is restored whole: the
    /// snapshot's names in it; anything else is removed when the walk leaves it.
    keep: Option<std::collections::HashSet<Vec<u8>>>,
    /// The snapshot holds the directory whole ([`Whole`]); else `way` is its
    /// snapshot path, to find the sources below it by.
    whole: bool,
    way: String,
    /// Entries created in it take inode flags from it (ext4 passes `d`, `A`,
    /// `S` ... of a directory on to what is created in it): a directory that was
    /// there with such flags, or one below it. Its entries get exactly the
    /// snapshot's flags at the end, none included.
    inherits: bool,
}

/// Inode flags a directory passes on to what is created in it (ext4's
/// `EXT4_FL_INHERITED`, of those a snapshot keeps): all but `i` and `a`.
const INHERITED_FLAGS: u32 = INODE_FLAGS & !LOCKING_INODE_FLAGS;

/// Where a directory the walk enters stands: selected whole by the includes
/// (`all`, with its snapshot path when matched against them), and held whole by
/// the snapshot ([`Whole`], with its path while not).
struct Scope {
    all: bool,
    snap_path: String,
    whole: bool,
    way: String,
}

/// An entry whose inode flags wait for the end of the restore: its directory (by
/// descriptor while one is held, else reopened from the target) and its name.
struct Flagged {
    dir: Weak<Dir>,
    dir_node: Arc<DirNode>,
    name: CString,
    flags: u32,
    is_dir: bool,
    /// The entry's own flags from before the restore (a directory kept as it
    /// was, unlocked to restore into it): put back even when restore reported
    /// a problem with it.
    original: bool,
}

/// The first name restored for a hard-linked inode; later names link to it.
struct FirstLink {
    dir: Weak<Dir>,
    dir_node: Arc<DirNode>,
    name: CString,
    /// (device, inode) of the file restore created.
    id: (u64, u64),
    /// Its owner: restore's until its metadata is applied, then the snapshot's (an
    /// inode number can be reused by a file someone else creates, an owner cannot).
    owners: [u32; 2],
    /// Kept as it was there (`--overwrite if-changed` judged it by size and time):
    /// its content is not known to be the snapshot's, so a name there already with
    /// other content is not made a link to it.
    kept: bool,
}

struct Walk<'a> {
    repo: &'a Repository,
    opts: &'a RestoreOptions,
    progress: &'a Progress,
    stats: RestoreStats,
    /// Shared, so that `--delete`'s walk below an extra directory can ask them
    /// while the walk acts on what it finds ([`chosen_extras`]).
    includes: Arc<Includes>,
    excludes: Option<Arc<Excludes>>,
    root: Arc<Dir>,
    /// The target's mount ([`sys::mount_of`]): `--delete` removes nothing on another.
    mount: (u64, u64),
    /// Directories `--delete` leaves ([`spared_dirs`]).
    spared: Vec<(u64, u64)>,
    /// Where `--delete` removes.
    whole: &'a Whole,
    stack: Vec<Frame>,
    batch: Vec<FileJob>,
    batch_chunks: u64,
    /// Directory descriptors the batch and `pending` keep open (counted once per
    /// change of directory, an upper bound), and how many they may.
    batch_dirs: usize,
    dir_budget: usize,
    last_dir: Option<Arc<Dir>>,
    /// Directories whose entries are all created, in the order they were completed
    /// (children before parents): their metadata is applied after the batch that
    /// writes their last files.
    pending: Vec<(Arc<Dir>, DirMeta)>,
    hardlinks: HashMap<(u64, u64), FirstLink>,
    /// `--verbose`: the other names of hard-linked files whose first name's
    /// content is still to be written, each with whether it replaced something.
    /// They are listed once it is, and not at all if it never is (QA: a link to
    /// a file left as zeros was "restored").
    links_waiting: HashMap<(u64, u64), Vec<(PathBuf, bool)>>,
    /// `--verify`: hard-linked files whose first name's content is still to be
    /// read back, with how many other names were made links of it meanwhile:
    /// those count as verified once it is, and not if it fails (review: they
    /// were counted before the first name was even written).
    links_to_verify: HashMap<(u64, u64), u64>,
    /// `--verify`: hard-linked files whose first name's content was read back,
    /// or compared with the snapshot's before it was kept: a name made a link
    /// of it later is verified with it.
    first_verified: std::collections::HashSet<(u64, u64)>,
    /// Hard-linked files whose name met first was kept as it was (`never`,
    /// `if-newer`) though it does not look like the snapshot's content: their
    /// other names become a file of their own, which is said. The kept name.
    kept_apart: HashMap<(u64, u64), PathBuf>,
    /// The last directory reopened to link to a first name in it.
    link_dir: Option<Arc<Dir>>,
    /// Entries restored with inode flags (`chattr`): set when everything else is,
    /// since an immutable or append-only file takes no content, times or hard
    /// links after them, and an immutable directory no new entries.
    flagged: Vec<Flagged>,
    /// Cancelled: the walk stopped between entries.
    stopped: bool,
    /// To the executor thread: the next batch to write.
    to_exec: Option<std::sync::mpsc::SyncSender<Batch>>,
    /// From it: each batch back, written, in the order sent.
    from_exec: std::sync::mpsc::Receiver<Result<Written>>,
    /// A batch was sent and has not come back yet.
    in_flight: bool,
    /// The time of the mark an unfinished restore left in the target
    /// ([`unfinished`]): entries changed since are taken as `if-changed` takes them.
    unfinished_since: Option<(i64, u32)>,
    /// A file was left with its content not restored in full.
    left_unfinished: bool,
    /// The first entry that could not be written because the target is full (or
    /// over its quota): the walk stops there, instead of failing every entry
    /// after it one warning at a time.
    full: Option<PathBuf>,
    /// Chunks a batch plans at most (each costs about 128 bytes of plan): fewer
    /// under a memory limit.
    batch_chunks_max: u64,
}

/// Restores the tree `root` into `opts.target`. `whole`: where `--delete` may
/// remove what the tree does not have.
#[cfg(test)]
pub(super) fn restore(
    repo: &Repository,
    root: &BlobId,
    whole: &Whole,
    opts: &RestoreOptions,
    progress: &Progress,
) -> Result<RestoreStats> {
    restore_under(repo, root, None, whole, opts, progress)
}

/// [`restore`] of the tree of `top`, a directory of the snapshot (`SNAP:PATH`):
/// a target the restore creates gets `top`'s own metadata (mode, owner, times,
/// attributes), as the directory would have in a restore of the whole snapshot
/// (QA: a home directory of mode 0700 came back 0755, its files open to all).
/// A target that was there keeps its own.
pub(super) fn restore_under(
    repo: &Repository,
    root: &BlobId,
    top: Option<&Node>,
    whole: &Whole,
    opts: &RestoreOptions,
    progress: &Progress,
) -> Result<RestoreStats> {
    let target = &opts.target;
    let excludes = excludes_of(opts)?;
    let includes = Includes::select(repo, root, opts, excludes.as_ref(), progress)?;
    if opts.delete && whole.is_empty() {
        progress.notice(
            "--delete removes nothing: the snapshot names no directory it backed up whole"
                .to_string(),
        );
    }
    refuse_target_in_repository(repo, target)?;
    if opts.dry_run {
        return survey::dry_run(
            repo,
            root,
            whole,
            opts,
            &includes,
            excludes.as_ref(),
            progress,
        );
    }
    // A target that is a symlink is refused, not followed: where it points is not
    // what the user named (and may be somewhere else by the time restore writes).
    match fs::symlink_metadata(target) {
        Ok(m) if m.file_type().is_symlink() => return Err(target_is_symlink(target)),
        Ok(m) if !m.is_dir() => return Err(not_a_directory(target)),
        _ => {}
    }
    // Read before the target is made: a snapshot whose root cannot be read
    // leaves no empty target behind (QA r23).
    let tree = load_tree(repo, root, &opts.xattrs)?;
    let created =
        matches!(fs::symlink_metadata(target), Err(e) if e.kind() == std::io::ErrorKind::NotFound);
    fs::create_dir_all(target).map_err(|e| Error::io(target, e))?;
    let meta = fs::metadata(target).map_err(|e| Error::io(target, e))?;
    if !meta.is_dir() {
        return Err(not_a_directory(target));
    }
    // The target is opened once, by the path the caller gave; everything below it is
    // reached through this descriptor.
    let root_fd: OwnedFd = fs::OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_DIRECTORY | libc::O_CLOEXEC | libc::O_NOFOLLOW)
        .open(target)
        .map_err(|e| {
            if e.raw_os_error() == Some(libc::ELOOP) {
                target_is_symlink(target)
            } else {
                Error::io(target, e)
            }
        })?
        .into();
    sys::probe_openat2(root_fd.as_fd());
    target::hold_target(root_fd.as_fd(), target)?;
    let st = sys::fstat(root_fd.as_fd()).map_err(|e| Error::io(target, e))?;
    // Fail early and clearly when the target cannot be written. The probe's name is
    // predictable, so whatever is there already is removed (never followed: a symlink
    // planted there must not make restore create or truncate a file elsewhere), and
    // the probe is created exclusively; an entry that reappears in between is someone
    // else's and proves nothing either way.
    let probe = c_name(format!(".cairn-restore-probe-{}", std::process::id()).as_bytes())
        .map_err(|e| Error::io(target, e))?;
    let _ = sys::unlink_at(root_fd.as_fd(), &probe);
    match target::create_file(root_fd.as_fd(), &probe) {
        Ok(_) => {
            let _ = sys::unlink_at(root_fd.as_fd(), &probe);
        }
        Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => {}
        // Locked by its owner: restore does not lift that on its own.
        Err(e)
            if e.raw_os_error() == Some(libc::EPERM)
                && sys::inode_flags(root_fd.as_fd())
                    .is_ok_and(|f| f & LOCKING_INODE_FLAGS != 0) =>
        {
            return Err(Error::Invalid(format!(
                "the target {} is immutable or append-only (chattr +i or +a): nothing can \
                 be restored into it until that is lifted (chattr -i -a {})",
                target.display(),
                target.display()
            )));
        }
        Err(e) => return Err(Error::io(target, e)),
    }

    let mount = sys::mount_of(root_fd.as_fd(), c"").map_err(|e| Error::io(target, e))?;
    let lifted_before = sys::locks_lifted();
    // A restore here that did not finish: what it may have left is distrusted. This
    // one leaves its own mark until it has finished (none if the target takes
    // none: then as before marks existed).
    let unfinished_since = unfinished::since(root_fd.as_fd());
    if let Some(t) = unfinished_since {
        progress.notice(unfinished::notice(target, t));
    }
    let selection = unfinished::selection(
        root.as_bytes(),
        &opts.includes,
        &opts.iincludes,
        &opts.excludes,
        &opts.iexcludes,
    );
    // A snapshot that holds a file of the mark's name at its top (a backup of a
    // target, say) restores it there: no mark is left or taken away, which would
    // be that file (QA: it was deleted as the mark once the restore finished).
    let holds_mark_name = tree.find(unfinished::MARK.to_bytes()).is_some();
    if holds_mark_name {
        progress.notice(format!(
            "the snapshot holds a file named {} at its top: this restore leaves no mark \
             of its own in {} (a restore cut short here is not told apart by the next one)",
            unfinished::MARK.to_string_lossy(),
            target.display()
        ));
    } else {
        if let Err(e) = unfinished::mark(root_fd.as_fd(), &selection) {
            progress.notice(unfinished::not_left(target, &e));
        }
    }
    let root_dir = Arc::new(Dir {
        fd: root_fd,
        node: DirNode::root(target, &st),
        path_only: false,
    });
    let all = includes.is_empty();
    let write_limit = opts
        .write_limit
        .filter(|&r| r > 0)
        .map(cairn_backend::Limiter::new);
    // The batches are written on a thread of their own while the walk builds the
    // next one: creating directories and planning a batch no longer leave the
    // writers idle (a small-file tree's walk is single-threaded work), and the
    // metadata of a batch's files is applied while the next is written.
    std::thread::scope(|s| {
        let (to_exec, batches) = std::sync::mpsc::sync_channel::<Batch>(0);
        let (written, from_exec) = std::sync::mpsc::channel();
        let owners = opts.owners;
        let limit = write_limit.as_ref();
        // Set by the writers on the first write the target has no room for: what
        // is left of the batch is given up, not tried file by file.
        let full = std::sync::atomic::AtomicBool::new(false);
        s.spawn(move || {
            for batch in batches {
                let r = write_batch(repo, batch, owners, progress, limit, &full);
                if written.send(r).is_err() {
                    break;
                }
            }
        });
        let mut w = Walk {
            repo,
            opts,
            progress,
            stats: RestoreStats {
                unfinished_before: unfinished_since.map(|t| t.0),
                ..Default::default()
            },
            includes: Arc::new(includes),
            excludes: excludes.map(Arc::new),
            root: root_dir.clone(),
            mount,
            spared: spared_dirs(repo),
            whole,
            stack: Vec::new(),
            batch: Vec::new(),
            batch_chunks: 0,
            batch_dirs: 0,
            dir_budget: dir_budget(),
            last_dir: None,
            pending: Vec::new(),
            hardlinks: HashMap::new(),
            links_waiting: HashMap::new(),
            links_to_verify: HashMap::new(),
            first_verified: Default::default(),
            kept_apart: HashMap::new(),
            link_dir: None,
            flagged: Vec::new(),
            stopped: false,
            unfinished_since,
            left_unfinished: false,
            full: None,
            to_exec: Some(to_exec),
            from_exec,
            in_flight: false,
            // Two batches are alive at a time (one written while the next is built).
            batch_chunks_max: repo.memory_plan_in_use().map_or(BATCH_CHUNKS, |p| {
                p.share(2 * 4 * 128, 1 << 16, BATCH_CHUNKS)
            }),
        };
        let keep =
            keep_names(opts, &tree.nodes, all, &w.includes, whole.root(), false).map(and_the_mark);
        let mut todo = tree.nodes;
        todo.reverse();
        w.stack.push(Frame {
            todo,
            weak: Arc::downgrade(&root_dir),
            dir: Some(root_dir.clone()),
            node: root_dir.node.clone(),
            meta: None,
            all,
            snap_path: String::new(),
            fresh: false,
            keep,
            whole: whole.root(),
            way: String::new(),
            inherits: sys::inode_flags(root_dir.fd()).is_ok_and(|f| f & INHERITED_FLAGS != 0),
        });
        // On an error too, the batch in flight is waited for and finished: its files
        // get their metadata, or are reported as not restored in full.
        let walked = w.run().and_then(|()| w.flush_batch());
        let drained = w.drain();
        // Cancelled during the walk: the restore ends with an error, and the files
        // in flight are said here, in one line (the report is not made).
        let cancelled = w.stopped || matches!(walked, Err(Error::Cancelled));
        if cancelled && w.stats.cancelled_files > 0 {
            progress.warning_msg(format!(
                "{} being written when the restore was cancelled: left with the \
                 restore's time and mode 0600; the next restore into {} finishes them",
                crate::units::count(w.stats.cancelled_files, "file"),
                target.display()
            ));
        }
        // However it ends, what was restored gets its flags, and what was
        // unlocked to restore into its own back. A file left unfinished and
        // locked is no trap: the next restore (told by the mark) replaces it,
        // lifting the lock as it does any earlier restore's.
        let ended = walked.and(drained).and_then(|()| match w.full_error() {
            Some(e) => Err(e),
            // The files created so far are whole (their batch was written); the
            // rest was not started.
            None if w.stopped => Err(Error::Cancelled),
            None => Ok(()),
        });
        w.set_inode_flags();
        let lifted = sys::locks_lifted() - lifted_before;
        if lifted > 0 {
            progress.notice(format!(
                "{} in {} {} immutable or append-only (chattr +i or +a): restore lifted \
                 that to replace or remove {} (what it restored has the snapshot's flags)",
                crate::units::count(lifted, "entry"),
                target.display(),
                if lifted == 1 { "was" } else { "were" },
                if lifted == 1 { "it" } else { "them" }
            ));
        }
        ended?;
        // Once no file is left cut short (an attribute refused, a device not
        // made: nothing for the next restore to distrust), this restore's part is
        // finished: the mark goes unless it lists another part, still unfinished
        // (one of a part says nothing of the rest); a restore of everything takes
        // it away. A mark left behind for no reason would make later restores
        // rewrite whatever was edited in the target.
        let everything = opts.includes.is_empty()
            && opts.iincludes.is_empty()
            && opts.excludes.is_empty()
            && opts.iexcludes.is_empty();
        if !w.left_unfinished && !holds_mark_name {
            // A directory restored as the target (`SNAP:PATH`) is not all of a
            // snapshot: a mark that lists nothing stays.
            let all_of_a_snapshot = everything && opts.subfolder.is_none();
            unfinished::finished(root_dir.fd(), &selection, everything, all_of_a_snapshot)
                .map_err(|e| Error::io(target, e))?;
        }
        // Last: the mark's removal above would move its modification time.
        if let Some(top) = top.filter(|_| created) {
            let mut node = top.clone();
            opts.xattrs.retain(&mut node.xattrs);
            if let Err(e) = metadata::apply(root_dir.fd(), false, &node, opts.owners) {
                w.issue(target.clone(), format!("setting metadata: {e}"));
            }
        }
        Ok(w.stats)
    })
}

/// The size `restore --verbose` gives an entry: a file's, 0 for anything else.
fn list_size(node: &Node) -> u64 {
    if node.kind == NodeKind::File {
        node.size
    } else {
        0
    }
}

/// The error of a restore (of files, or of files from an image) that stopped on
/// a full target: where it stopped, what it left (`left`, empty or starting with
/// ", "), and that a second run finishes the work (the unfinished mark stays).
pub(crate) fn target_full(
    target: &std::path::Path,
    stopped_at: &std::path::Path,
    left: &str,
) -> Error {
    Error::io(
        target,
        std::io::Error::new(
            std::io::ErrorKind::StorageFull,
            format!(
                "no space left on the target: the restore stopped at {}{left}, and \
                 restored nothing that comes after it in the snapshot; \
                 run it again once there is room, and it finishes what this one left",
                stopped_at.display()
            ),
        ),
    )
}

fn not_a_directory(target: &std::path::Path) -> Error {
    Error::Invalid(format!(
        "the target {} exists and is not a directory (a snapshot of files is restored into a directory)",
        target.display()
    ))
}

/// A target that is the local repository being restored from, or a directory
/// inside it, is refused before anything is made: restored files would land
/// among the repository's objects (a snapshot holding a `config` or `data/`
/// would overwrite them), and `--delete` would remove the objects the restore
/// reads as extras (QA: a restore of `/` onto the repository deleted it). The
/// nearest directory of the target that exists is walked up by `..`, by device
/// and inode, so that a symlink or a bind mount on the way does not hide it (an
/// image restore's target file is judged by its directory, a symlink by the
/// directory of what it points to).
pub(crate) fn refuse_target_in_repository(
    repo: &Repository,
    target: &std::path::Path,
) -> Result<()> {
    match inside_repository(repo, target) {
        Some(repo_dir) => Err(Error::Invalid(format!(
            "the target {} is the repository being restored from{repo_dir}, or a \
             directory inside it: restore into a directory outside the repository",
            target.display()
        ))),
        None => Ok(()),
    }
}

/// Whether `target` (a directory or file to be written, there or not yet) is the
/// local repository `repo` or lies inside it, judged as
/// [`refuse_target_in_repository`] judges: `Some` with the repository's directory
/// as a message shows it (` (PATH)`), or `None`. `export -o` and `dump -t` ask it
/// too (QA: `-o REPO/config` replaced the config with the archive).
pub fn inside_repository(repo: &Repository, target: &std::path::Path) -> Option<String> {
    let spared = spared_dirs(repo);
    if spared.is_empty() {
        return None;
    }
    // A symlink as the target is judged by where it leads: an image restore
    // writes through a symlink to a file (QA: a link to the repository's
    // `config` was overwritten with the image).
    let resolved = fs::symlink_metadata(target)
        .is_ok_and(|m| m.file_type().is_symlink())
        .then(|| fs::canonicalize(target).ok())
        .flatten();
    let mut existing = resolved.as_deref().unwrap_or(target);
    while !fs::metadata(existing).is_ok_and(|m| m.is_dir()) {
        match existing.parent() {
            Some(p) if !p.as_os_str().is_empty() => existing = p,
            _ => {
                existing = std::path::Path::new(".");
                break;
            }
        }
    }
    // `..` is the kernel's parent (of where a symlink led), not the lexical one.
    use std::os::unix::fs::MetadataExt;
    let mut up = existing.to_path_buf();
    let mut last = None;
    // Bounded: a path has at most PATH_MAX / 2 components.
    for _ in 0..2048 {
        let Ok(m) = fs::metadata(&up) else {
            return None;
        };
        let here = (m.dev(), m.ino());
        if last == Some(here) {
            return None;
        }
        if spared.contains(&here) {
            return Some(
                crate::ops::backup::own_dirs(repo)
                    .first()
                    .map_or_else(String::new, |p| format!(" ({})", p.display())),
            );
        }
        last = Some(here);
        up.push("..");
    }
    None
}

fn target_is_symlink(target: &std::path::Path) -> Error {
    Error::Invalid(format!(
        "the target {} is a symlink; restore into the directory it points to by its own path",
        target.display()
    ))
}

/// What the includes select, as snapshot-absolute paths as the walk names them
/// (`/a/b`: no empty or `.` components, no trailing `/`, each name as
/// [`snap_name`] writes it; the root is `/`). A path given is looked up, and a
/// pattern is matched against the whole tree, before anything is written: an
/// include that names nothing would restore nothing, and a typo must not look
/// like success. Sets, so that a pattern matching a million files costs a few
/// lookups per entry of the walk, not a million comparisons.
#[derive(Default)]
pub(super) struct Includes {
    /// Selected, with everything below them.
    paths: std::collections::HashSet<String>,
    /// The directories made but not selected whole: those on the way to one of
    /// `paths` (not the root), and, with a `!` include, the directories the
    /// patterns match (their entries judged one by one).
    ways: std::collections::HashSet<String>,
    /// The include patterns (those given as patterns, and `--iinclude`'s).
    matcher: Option<Excludes>,
    /// Some include was given: what none selects is not restored (even when
    /// every match is a directory whose entries a `!` took back).
    asked: bool,
}

impl Includes {
    /// The selection of `opts.includes` and `opts.iincludes` in the tree `root`;
    /// what `excludes` leaves out is not a match.
    fn select(
        repo: &Repository,
        root: &BlobId,
        opts: &RestoreOptions,
        excludes: Option<&Excludes>,
        progress: &Progress,
    ) -> Result<Includes> {
        let mut paths = Vec::new();
        let mut patterns = Vec::new();
        // An empty include would name the root: a script's unset variable
        // (`--include "$X"`) must not turn a restore with --delete into one of
        // everything (QA).
        if let Some(empty) = (opts.includes.iter())
            .map(|i| ("--include", i))
            .chain(opts.iincludes.iter().map(|i| ("--iinclude", i)))
            .find(|(_, i)| i.trim().is_empty() || i.trim() == "!")
        {
            return Err(Error::Invalid(format!(
                "{} {:?}: an empty path or pattern chooses nothing (leave the option out \
                 to restore everything)",
                empty.0, empty.1
            )));
        }
        // With a `!` among them, every include is a pattern, as restic reads
        // them: `--include /srv/etc --include '!*.txt'` takes the .txt files
        // out of /srv/etc (QA: a path was taken whole, its negation refused).
        let negated = (opts.includes.iter().chain(&opts.iincludes)).any(|i| i.starts_with('!'));
        for i in &opts.includes {
            // A path that names an entry is that entry, even one whose name holds
            // `*`, `?` or `[` (a path copied from a listing); anything else is a
            // pattern, as restic reads every include (`sub` is a name at any
            // depth, `!x` takes back what an earlier pattern chose).
            if !negated {
                match crate::ops::ls::resolve_path(repo, root, i) {
                    Ok(p) => {
                        paths.push(p);
                        continue;
                    }
                    Err(Error::Invalid(_)) => {}
                    Err(e) => return Err(e),
                }
            }
            patterns.push(i.clone());
        }
        let mut matcher = None;
        // Directories matched but not whole (a negation may take back some of
        // what is in them): made, their entries judged one by one.
        let mut dirs_only = Vec::new();
        if !patterns.is_empty() || !opts.iincludes.is_empty() {
            let rules = crate::ops::backup::source::ExcludeRules {
                patterns,
                ipatterns: opts.iincludes.clone(),
                // Matched directories are entered when negated: what is below a
                // match is matched too, in each list (QA: `--iinclude ETC
                // --include '!*.conf'` left etc's files out).
                below: true,
                ..Default::default()
            };
            let m = Excludes::new(&rules).map_err(|e| {
                Error::BadArgument(e.replacen(
                    "invalid exclude pattern",
                    "invalid include pattern",
                    1,
                ))
            })?;
            let (found, dirs) = matching(repo, root, &m, negated, excludes, progress)?;
            if found.is_empty() && dirs.is_empty() {
                let given: Vec<&str> = (rules.patterns.iter().chain(&rules.ipatterns))
                    .map(String::as_str)
                    .collect();
                // Each named with its option, as given.
                // As typed: Debug would double every backslash (QA), which is
                // what a pattern escapes wildcards with. Only control characters
                // are written out, to keep the message on one line.
                let typed = |p: &str| -> String {
                    p.chars()
                        .map(|c| {
                            if c.is_control() {
                                c.escape_debug().to_string()
                            } else {
                                c.to_string()
                            }
                        })
                        .collect()
                };
                let named = (rules.patterns.iter())
                    .map(|p| format!("--include \"{}\"", typed(p)))
                    .chain((rules.ipatterns.iter()).map(|p| format!("--iinclude \"{}\"", typed(p))))
                    .collect::<Vec<_>>()
                    .join(", ");
                if given.iter().all(|p| p.starts_with('!')) {
                    return Err(Error::Invalid(format!(
                        "{named}: a '!' include only takes back what another include chose; \
                         give what to restore too"
                    )));
                }
                let wild = given
                    .iter()
                    .any(|p| crate::pattern::has_wildcard(p.as_bytes()));
                // Under `SNAP:PATH` includes are paths below PATH: one given as the
                // full path in the snapshot is shown in the form meant (QA).
                let sub = opts
                    .subfolder
                    .as_deref()
                    .map(|s| s.trim_end_matches('/'))
                    .filter(|s| !s.is_empty());
                let below = sub.and_then(|sub| {
                    given.iter().find_map(|p| {
                        let rest = p.strip_prefix(sub)?;
                        (rest.is_empty() || rest.starts_with('/')).then(|| {
                            format!(
                                " (includes are paths below {sub}, the directory restored: \
                                 --include \"{}\")",
                                if rest.is_empty() { "/" } else { rest }
                            )
                        })
                    })
                });
                let place = match sub {
                    Some(sub) => format!("{sub} in the snapshot"),
                    None => "the snapshot".to_string(),
                };
                return Err(Error::Invalid(format!(
                    "{named}: nothing in {place} is there or matches{}: nothing to \
                     restore{}{}",
                    if excludes.is_some() {
                        " (or the excludes leave out all that does)"
                    } else {
                        ""
                    },
                    below.unwrap_or_default(),
                    if wild {
                        " (in a pattern, *, ? and [ are wildcards: write \\*, \\? or \\[ for \
                         the character itself)"
                    } else {
                        ""
                    }
                )));
            }
            paths.extend(found);
            matcher = Some(m);
            dirs_only = dirs;
        }
        let mut ways = std::collections::HashSet::new();
        for p in paths.iter().chain(&dirs_only) {
            let mut at = p.len();
            while let Some(i) = p[..at].rfind('/') {
                if i == 0 || !ways.insert(p[..i].to_string()) {
                    break;
                }
                at = i;
            }
        }
        ways.extend(dirs_only);
        Ok(Includes {
            asked: !(opts.includes.is_empty() && opts.iincludes.is_empty()),
            paths: paths.into_iter().collect(),
            ways,
            matcher,
        })
    }

    /// Nothing was asked for: everything is restored.
    pub(super) fn is_empty(&self) -> bool {
        !self.asked
    }

    /// Is `path` (snapshot-absolute) selected (`.0`), or on the way to what is
    /// (`.1`)?
    fn judge(&self, path: &str) -> (bool, bool) {
        if self.paths.contains("/") || self.paths.contains(path) {
            return (true, false);
        }
        let mut at = path.len();
        while let Some(i) = path[..at].rfind('/') {
            if i == 0 {
                break;
            }
            if self.paths.contains(&path[..i]) {
                return (true, false);
            }
            at = i;
        }
        (false, self.ways.contains(path))
    }
}

/// The paths of the entries of tree `root` that `matcher` matches, as the walk
/// names them; what is below a match is not looked at (it is selected with it),
/// unless `negated` (a `!` pattern may take some of it back): then a matched
/// directory is listed apart (second list: made, but not selected whole) and
/// its entries are judged one by one.
fn matching(
    repo: &Repository,
    root: &BlobId,
    matcher: &Excludes,
    negated: bool,
    excludes: Option<&Excludes>,
    progress: &Progress,
) -> Result<(Vec<String>, Vec<String>)> {
    let mut found = Vec::new();
    let mut dirs = Vec::new();
    let mut todo = vec![(*root, String::new())];
    while let Some((id, dir)) = todo.pop() {
        if progress.is_cancelled() {
            return Err(Error::Cancelled);
        }
        for node in repo.load_tree(&id)?.nodes {
            let p = format!("{dir}/{}", snap_name(&node.name));
            // Left out by the excludes: not restored, nor what is below it.
            if excludes.is_some_and(|e| e.is_excluded(std::path::Path::new(&p))) {
                continue;
            }
            let matched = matcher.is_excluded(std::path::Path::new(&p));
            match (node.kind, node.subtree) {
                (NodeKind::Dir, Some(sub)) if negated => {
                    if matched {
                        dirs.push(p.clone());
                    }
                    todo.push((sub, p));
                }
                _ if matched => found.push(p),
                (NodeKind::Dir, Some(sub)) => todo.push((sub, p)),
                _ => {}
            }
        }
    }
    Ok((found, dirs))
}

pub(crate) use cairn_backend::direct::all_zeros;

/// A name in the walk's snapshot paths, which `--include` paths are compared with:
/// every byte kept (one that is not UTF-8 as a stand-in), so that two names that
/// read the same are never both selected.
pub(crate) fn snap_name(name: &[u8]) -> String {
    crate::ops::ls::escape_name(name)
}

/// Why the executor gave up a file when the restore was cancelled.
pub(super) const CANCELLED: &str = "cancelled";
/// Why the executor gave up a file once the target was full (or over quota).
pub(super) const TARGET_FULL: &str = "the target is full";

/// Whether a message about a failed write says the target is out of space or
/// over its quota (the messages carry the system's error as `io::Error` shows it).
pub(super) fn says_full(message: &str) -> bool {
    message.contains("(os error 28)") || message.contains("(os error 122)")
}

/// What `--delete` did with an entry (or, in a dry run, would do).
pub(super) enum Gone {
    /// Removed, with everything in it.
    All,
    /// Kept, or part of it: another file system is mounted on it or below it, or
    /// it holds the repository; why an entry of the snapshot cannot replace it.
    Kept(&'static str),
    /// Not all removed: an error, reported.
    Failed,
}

impl Gone {
    fn of(r: &target::Removal) -> Gone {
        if r.spared_left > 0 {
            Gone::Kept(REPOSITORY_IN_THE_WAY)
        } else if r.mounts_left > 0 {
            Gone::Kept(MOUNT_IN_THE_WAY)
        } else {
            Gone::All
        }
    }
}

const MOUNT_IN_THE_WAY: &str =
    "a directory is in the way, with another file system mounted on or below it";
const REPOSITORY_IN_THE_WAY: &str =
    "a directory is in the way that holds the repository being restored from";

/// Why a directory of the snapshot is not restored: the repository being
/// restored from is where it would go.
pub(super) const REPOSITORY_HERE: &str =
    "the repository being restored from is here: nothing is restored into it";

/// What `restore --delete` says of a directory it left because the repository
/// being restored from is in it.
pub(super) const SPARED: &str = "--delete left the repository being restored from (and the \
     directories above it) in place: backups leave it out, so no snapshot has it";

/// The directories `--delete` never removes, as (device, inode): the repository
/// being restored from when it is local. A backup of a tree that holds it leaves
/// it out ([`crate::ops::backup::own_dirs`]), so the snapshot never has it, and
/// `--delete` would take it for an extra while the restore reads from it.
fn spared_dirs(repo: &Repository) -> Vec<(u64, u64)> {
    use std::os::unix::fs::MetadataExt;
    crate::ops::backup::own_dirs(repo)
        .iter()
        .filter_map(|p| fs::metadata(p).ok())
        .map(|m| (m.dev(), m.ino()))
        .collect()
}

/// The names `--delete` keeps in a directory that existed before and that the
/// snapshot holds whole ([`Whole`]), when it is restored whole (`all`) or
/// include patterns may choose what is in it (then only extras they match go,
/// [`spared_extra`]).
pub(super) fn keep_names(
    opts: &RestoreOptions,
    nodes: &[Node],
    all: bool,
    includes: &Includes,
    whole: bool,
    fresh: bool,
) -> Option<std::collections::HashSet<Vec<u8>>> {
    (opts.delete && (all || includes.matcher.is_some()) && whole && !fresh)
        .then(|| nodes.iter().map(|n| n.name.clone()).collect())
}

/// [`keep_names`] for the target itself also keeps the unfinished-restore mark.
pub(super) fn and_the_mark(
    mut keep: std::collections::HashSet<Vec<u8>>,
) -> std::collections::HashSet<Vec<u8>> {
    keep.insert(unfinished::MARK.to_bytes().to_vec());
    keep
}

/// Where `--delete` may remove what the snapshot does not have: the directories
/// the snapshot backed up whole, its source paths and everything below them. The
/// directories above a source (`/` and `/srv` of a backup of `/srv/www`) are in
/// the snapshot only as the way to it: what else they hold in the target was
/// never backed up, and stays.
pub(super) struct Whole {
    /// The sources as the walk names paths (`/a/b`, as [`Includes`]
    /// writes them); `/` for the root. A set: a backup of 100,000 listed files has
    /// as many paths.
    sources: std::collections::HashSet<String>,
}

impl Whole {
    /// The snapshot's source paths (`paths`), spelled as the walk names paths
    /// (they are absolute, as backup recorded them, so no tree need be read); one
    /// that names nothing in the tree (a tree changed by `rewrite`) marks nothing
    /// whole.
    pub(super) fn of(paths: &[String]) -> Whole {
        let sources = paths
            .iter()
            .map(|p| match crate::ops::ls::walk_path(p) {
                w if w.is_empty() => "/".to_string(),
                w => w,
            })
            .collect();
        Whole { sources }
    }

    /// Everything whole: a tree restored for its own sake (tests).
    #[cfg(test)]
    pub(super) fn root_only() -> Whole {
        Whole::of(&["/".to_string()])
    }

    pub(super) fn root(&self) -> bool {
        self.sources.contains("/")
    }

    /// The entry `name` of a directory at `way` (which is not whole): whether it is
    /// a source, and else its path, to look further down with.
    pub(super) fn below(&self, way: &str, name: &[u8]) -> (bool, String) {
        let p = format!("{way}/{}", snap_name(name));
        if self.sources.contains(&p) {
            (true, String::new())
        } else {
            (false, p)
        }
    }

    pub(super) fn is_empty(&self) -> bool {
        self.sources.is_empty()
    }

    /// The sources as seen from the directory at `way` (a walk path, `/a/b`)
    /// restored as the root: all of it when it is a source or below one, else
    /// the sources below it.
    pub(super) fn under(&self, way: &str) -> Whole {
        let way = way.trim_end_matches('/');
        if way.is_empty() {
            return Whole {
                sources: self.sources.clone(),
            };
        }
        if self
            .sources
            .iter()
            .any(|s| s == "/" || s == way || way.starts_with(&format!("{s}/")))
        {
            return Whole::of(&["/".to_string()]);
        }
        let sources = self
            .sources
            .iter()
            .filter_map(|s| s.strip_prefix(way))
            .filter(|rest| rest.starts_with('/'))
            .map(str::to_string)
            .collect();
        Whole { sources }
    }
}

/// How many directory descriptors a batch may keep open: what the limit on open
/// files leaves after the open ancestors and the executor's files, halved for
/// everything else; at most 4,096 (a batch then still holds 50,000 files of dense
/// trees).
fn dir_budget() -> usize {
    let reserve = OPEN_ANCESTORS + 2 * execute::OPEN_FILES_PER_WORKER * execute::threads() + 64;
    let limit = usize::try_from(sys::nofile_limit()).unwrap_or(usize::MAX);
    // Half of what is left, for two batches alive at a time.
    (limit.saturating_sub(reserve) / 4).clamp(16, 4096)
}

/// What a completed directory gets once the files written into it are.
enum DirMeta {
    /// The snapshot's metadata; whether it existed before the restore (its
    /// foreign attributes are then removed).
    Snapshot(Box<Node>, bool),
    /// A directory `--overwrite` kept as it was: its own access and modification
    /// times back, which creating entries in it moved.
    OwnTimes((i64, u32), (i64, u32)),
}

/// Files for the executor thread, and the directories completed with them (their
/// metadata waits until the files are written).
struct Batch {
    jobs: Vec<FileJob>,
    pending: Vec<(Arc<Dir>, DirMeta)>,
}

/// A batch back from the executor thread.
struct Written {
    batch: Batch,
    /// Files not restored in full, with why.
    failed: HashMap<u32, Failure>,
    /// Files restored in full but for extended attributes that were refused.
    xattrs_refused: HashMap<u32, String>,
}

/// On the executor thread: plans the batch's reads and writes its files.
fn write_batch(
    repo: &Repository,
    batch: Batch,
    owners: bool,
    progress: &Progress,
    write_limit: Option<&cairn_backend::Limiter>,
    full: &std::sync::atomic::AtomicBool,
) -> Result<Written> {
    if batch.jobs.is_empty() {
        return Ok(Written {
            batch,
            failed: HashMap::new(),
            xattrs_refused: HashMap::new(),
        });
    }
    let plan = plan::plan(repo, &batch.jobs);
    let exec = execute::execute(
        repo,
        &batch.jobs,
        &plan,
        owners,
        progress,
        write_limit,
        full,
    )?;
    let mut failed = plan.failed;
    for (f, m) in exec.failed {
        failed.entry(f).or_insert(m);
    }
    Ok(Written {
        batch,
        failed,
        xattrs_refused: exec.xattrs_refused,
    })
}

/// `--verify`: reads back every file of the batch that was written (not those in
/// `failed`) and compares it with the snapshot, on the executor's number of threads.
/// Returns, per file read, why it does not match (`None`: it does).
fn verify(
    repo: &Repository,
    jobs: &[FileJob],
    failed: &HashMap<u32, Failure>,
) -> Vec<(u32, Option<String>)> {
    let written: Vec<u32> = (0..jobs.len() as u32)
        .filter(|i| !failed.contains_key(i))
        .collect();
    crate::threads::parallel_map(&written, execute::threads(), |&i| {
        let job = &jobs[i as usize];
        let r = sys::stat_at(job.dir.fd(), &job.name)
            .map_err(|e| Error::io(job.path(), e))
            .and_then(|st| overwrite::file_matches(repo, job.dir.fd(), &job.name, &st, &job.node));
        let problem = match r {
            Ok(true) => None,
            Ok(false) => Some("verify: the file read back differs from the snapshot".into()),
            Err(e) => Some(format!("verify: {e}")),
        };
        (i, problem)
    })
}

/// The `--exclude` and `--iexclude` patterns, if any.
fn excludes_of(opts: &RestoreOptions) -> Result<Option<Excludes>> {
    if opts.excludes.is_empty() && opts.iexcludes.is_empty() {
        return Ok(None);
    }
    let rules = crate::ops::backup::source::ExcludeRules {
        patterns: opts.excludes.clone(),
        ipatterns: opts.iexcludes.clone(),
        ..Default::default()
    };
    Excludes::new(&rules).map(Some).map_err(Error::BadArgument)
}

/// Where the entry `name` of a directory stands: selected (`inside`), only on the
/// way to an include (`ancestor`), or neither; with its snapshot path when the
/// walk keeps paths (`!all`, or excludes to match). `all`: the directory is
/// restored whole by the includes.
pub(super) fn judge(
    all: bool,
    dir_path: &str,
    name: &[u8],
    includes: &Includes,
    excludes: Option<&Excludes>,
) -> (bool, bool, String) {
    if all && excludes.is_none() {
        return (true, false, String::new());
    }
    let p = format!("{dir_path}/{}", snap_name(name));
    if excludes.is_some_and(|e| e.is_excluded(std::path::Path::new(&p))) {
        return (false, false, p);
    }
    let (i, a) = if all {
        (true, false)
    } else {
        includes.judge(&p)
    };
    (i, a, p)
}

/// Whether `--delete` leaves alone the entry `name` that the directory at
/// snapshot path `dir_path` has in the target and the snapshot does not: the
/// excludes match it (what a restore was told not to touch, it does not remove
/// either), or, in a directory not restored whole (`all`), the include patterns
/// do not (as restic's `--delete` with `--include`: only what they choose goes).
pub(super) fn spared_extra(
    excludes: Option<&Excludes>,
    includes: &Includes,
    all: bool,
    dir_path: &str,
    name: &[u8],
) -> bool {
    let path = format!("{dir_path}/{}", snap_name(name));
    let path = std::path::Path::new(&path);
    excludes.is_some_and(|e| e.is_excluded(path))
        || !(all
            || includes
                .matcher
                .as_ref()
                .is_some_and(|m| m.is_excluded(path)))
}

/// Whether the exclude patterns leave out entry `name` of the directory at
/// `dir_path` (a path as `ls` prints them).
fn is_excluded(excludes: Option<&Excludes>, dir_path: &str, name: &[u8]) -> bool {
    let path = format!("{dir_path}/{}", snap_name(name));
    excludes.is_some_and(|e| e.is_excluded(std::path::Path::new(&path)))
}

/// What [`ChosenExtras::walk`] found.
pub(super) enum Found<'a> {
    /// An entry the includes choose: in the directory `.0`, whose path (for
    /// messages) is `.1`, named `.2`.
    Chosen(std::os::fd::BorrowedFd<'a>, &'a std::path::Path, &'a CStr),
    /// A directory that could not be looked into, and why.
    Unlisted(PathBuf, std::io::Error),
}

/// `--delete` with include patterns below an extra directory of the target (one
/// the snapshot does not have) that no include chooses itself: the entries they
/// choose go, as restic's `--delete` removes every extra its filters select
/// (`--include '*.txt' --delete` kept `extra/x.txt`); the rest stays. Walks
/// without following symlinks, on the target's file system only, and leaves
/// excluded entries and the repository being restored from (`spared`) whole.
pub(super) struct ChosenExtras<'a> {
    pub mount: (u64, u64),
    pub spared: &'a [(u64, u64)],
    pub excludes: Option<&'a Excludes>,
    pub includes: &'a Includes,
}

impl ChosenExtras<'_> {
    /// Walks directory `name` of `parent` (`shown` its path for messages, `at`
    /// as `ls` would print it), giving `found` each chosen entry; one
    /// descriptor per level of depth is open at a time.
    pub(super) fn walk(
        &self,
        parent: std::os::fd::BorrowedFd<'_>,
        name: &CStr,
        shown: PathBuf,
        at: String,
        found: &mut dyn FnMut(Found<'_>),
    ) {
        use std::os::unix::ffi::OsStrExt;
        let Some(matcher) = self.includes.matcher.as_ref() else {
            return;
        };
        struct Level {
            fd: OwnedFd,
            shown: PathBuf,
            at: String,
            names: std::vec::IntoIter<CString>,
        }
        let open =
            |dir: std::os::fd::BorrowedFd<'_>, name: &CStr, shown: PathBuf, at: String| match self
                .open(dir, name)
            {
                Ok(Some(fd)) => match sys::list_dir(fd.as_fd()) {
                    Ok(names) => Ok(Some(Level {
                        fd,
                        shown,
                        at,
                        names: names.into_iter(),
                    })),
                    Err(e) => Err((shown, e)),
                },
                Ok(None) => Ok(None),
                Err(e) => Err((shown, e)),
            };
        let mut stack = match open(parent, name, shown, at) {
            Ok(Some(l)) => vec![l],
            Ok(None) => return,
            Err((p, e)) => return found(Found::Unlisted(p, e)),
        };
        while let Some(top) = stack.last_mut() {
            let Some(n) = top.names.next() else {
                stack.pop();
                continue;
            };
            let at = format!("{}/{}", top.at, snap_name(n.to_bytes()));
            let path = std::path::Path::new(&at);
            if self.excludes.is_some_and(|e| e.is_excluded(path)) {
                continue;
            }
            if matcher.is_excluded(path) {
                found(Found::Chosen(top.fd.as_fd(), &top.shown, &n));
                continue;
            }
            let shown = top.shown.join(std::ffi::OsStr::from_bytes(n.to_bytes()));
            match open(top.fd.as_fd(), &n, shown, at) {
                Ok(Some(l)) => stack.push(l),
                Ok(None) => {}
                Err((p, e)) => found(Found::Unlisted(p, e)),
            }
        }
    }

    /// Opens `name` in `dir` when it is a directory of the target's file system
    /// (not a symlink) other than the repository's; `None` otherwise.
    fn open(
        &self,
        dir: std::os::fd::BorrowedFd<'_>,
        name: &CStr,
    ) -> std::io::Result<Option<OwnedFd>> {
        let st = match sys::stat_at(dir, name) {
            Ok(st) => st,
            Err(e) if e.raw_os_error() == Some(libc::ENOENT) => return Ok(None),
            Err(e) => return Err(e),
        };
        if st.kind() != libc::S_IFDIR || self.spared.contains(&st.id()) {
            return Ok(None);
        }
        let fd = match sys::open_at(
            dir,
            name,
            libc::O_RDONLY | libc::O_DIRECTORY | libc::O_NOFOLLOW,
            0,
        ) {
            Ok(fd) => fd,
            Err(e)
                if matches!(
                    e.raw_os_error(),
                    Some(libc::ENOENT | libc::ENOTDIR | libc::ELOOP)
                ) =>
            {
                return Ok(None);
            }
            Err(e) => return Err(e),
        };
        // The directory looked at (not one put in its place since), on the
        // target's file system: another one mounted here keeps what it holds.
        let same = sys::fstat(fd.as_fd())?.id() == st.id()
            && sys::mount_of(fd.as_fd(), c"")? == self.mount;
        Ok(same.then_some(fd))
    }
}

fn chunks_of(node: &Node) -> u64 {
    match &node.content {
        Content::None => 0,
        Content::Inline(v) => v.len() as u64,
        Content::Tree { chunks, .. } => *chunks,
    }
}

impl Walk<'_> {
    /// The restore's error once the target is full: it stops there. The files
    /// given up with the first one are counted; what the walk had not reached is
    /// not (it is not walked to be counted), and is said to be left.
    fn full_error(&self) -> Option<Error> {
        let first = self.full.as_ref()?;
        let mut skipped = String::new();
        if self.stats.unfinished_full > 0 {
            skipped.push_str(&format!(
                ", left {} unfinished (the restore's time, mode 0600)",
                crate::units::count(self.stats.unfinished_full, "other file")
            ));
        }
        if self.stats.unwritten_full > 0 {
            skipped.push_str(&format!(
                ", did not create {} queued with it",
                crate::units::count(self.stats.unwritten_full, "other file")
            ));
        }
        Some(target_full(&self.opts.target, first, &skipped))
    }

    fn issue(&mut self, path: PathBuf, message: String) {
        self.issue_with(path, message, false)
    }

    /// An issue; `lost_data`: the repository lacks what the entry needs.
    fn issue_with(&mut self, path: PathBuf, message: String, lost_data: bool) {
        // The messages carry the system's error as `io::Error` shows it.
        if self.full.is_none() && says_full(&message) {
            self.full = Some(path.clone());
        }
        self.progress.warning(&path, &message);
        self.stats.issues.push(RestoreIssue {
            path,
            message,
            lost_data,
        });
    }

    /// What is at `name` in `parent` now (`None`: nothing). An entry that cannot be
    /// looked at is reported and treated as absent (creating it then fails clearly).
    fn existing(&mut self, parent: &Arc<Dir>, name: &CStr) -> Result<Option<sys::Stat>> {
        match sys::stat_at(parent.fd(), name) {
            Ok(st) => Ok(Some(st)),
            Err(e) if e.raw_os_error() == Some(libc::ENOENT) => Ok(None),
            Err(e) => {
                self.issue(
                    parent.node.join(name),
                    format!("looking at the target: {e}"),
                );
                Ok(None)
            }
        }
    }

    fn decide(
        &self,
        parent: &Arc<Dir>,
        name: &CStr,
        existing: Option<&sys::Stat>,
        node: &Node,
    ) -> Decision {
        overwrite::decide(
            self.repo,
            self.opts,
            self.unfinished_since,
            parent.fd(),
            name,
            existing,
            node,
        )
    }

    /// `node`, restored as `name` in `parent`, gets its inode flags at the end
    /// ([`Self::set_inode_flags`]); most entries have none.
    fn flag_later(&mut self, parent: &Arc<Dir>, name: &CStr, node: &Node) {
        // The walk's top frame is `parent`'s.
        let inherited = self.stack.last().is_some_and(|f| f.inherits);
        if node.flags != 0 || inherited {
            self.push_flagged(parent, name, node.flags, node.kind == NodeKind::Dir, false);
        }
    }

    /// The entry `name` in `dir`, kept as it was but unlocked for this restore
    /// (`own`: its flags before), gets them back at the end, whatever the
    /// restore reports of it.
    fn flag_own_back(&mut self, dir: &Arc<Dir>, name: &CStr, own: u32, is_dir: bool) {
        self.push_flagged(dir, name, own & INODE_FLAGS, is_dir, true);
    }

    fn push_flagged(
        &mut self,
        dir: &Arc<Dir>,
        name: &CStr,
        flags: u32,
        is_dir: bool,
        original: bool,
    ) {
        self.flagged.push(Flagged {
            dir: Arc::downgrade(dir),
            dir_node: dir.node.clone(),
            name: name.to_owned(),
            flags,
            is_dir,
            original,
        });
    }

    /// Sets the inode flags of the entries restored with some, last (after every
    /// file's content, metadata and hard links), deepest first; not on an entry
    /// restore reported a problem with, whose next restore must be able to write
    /// it. Each is opened by name in its directory, never through a symlink.
    fn set_inode_flags(&mut self) {
        if self.flagged.is_empty() {
            return;
        }
        let failed: std::collections::HashSet<PathBuf> =
            self.stats.issues.iter().map(|i| i.path.clone()).collect();
        let mut last: Option<Arc<Dir>> = None;
        let mut unset: Option<(PathBuf, std::io::Error, u64)> = None;
        for f in std::mem::take(&mut self.flagged).into_iter().rev() {
            let path = f.dir_node.join(&f.name);
            if !f.original && failed.contains(&path) {
                continue;
            }
            let dir = match f.dir.upgrade() {
                Some(d) => Ok(d),
                None => match &last {
                    Some(d) if Arc::ptr_eq(&d.node, &f.dir_node) => Ok(d.clone()),
                    _ => target::reopen_dir(&self.root, &f.dir_node).map(Arc::new),
                },
            };
            let directory = if f.is_dir { libc::O_DIRECTORY } else { 0 };
            let r = dir.and_then(|d| {
                last = Some(d.clone());
                let fd = sys::open_at(
                    d.fd(),
                    &f.name,
                    libc::O_RDONLY | libc::O_NONBLOCK | libc::O_NOCTTY | directory,
                    0,
                )?;
                metadata::set_inode_flags(fd.as_fd(), f.flags)
            });
            match r {
                Ok(()) => {}
                // Not root (immutable and append-only need it), or a file system
                // without such flags: left out as owners are for a user who is not
                // root, and said once, not as a failure of each entry.
                Err(e)
                    if matches!(
                        e.raw_os_error(),
                        Some(libc::EPERM | libc::EOPNOTSUPP | libc::ENOTTY | libc::EINVAL)
                    ) =>
                {
                    unset.get_or_insert((path, e, 0)).2 += 1;
                }
                // Not there: a file a failure kept from being created (a batch
                // that stopped at a full disk says how many it left out), which
                // has no flags to take (QA: three "No such file" lines after it).
                Err(e) if e.raw_os_error() == Some(libc::ENOENT) && !failed.is_empty() => {}
                Err(e) => self.issue(
                    path,
                    format!(
                        "setting its inode flags (chattr +{}): {e}",
                        cairn_format::tree::inode_flag_letters(f.flags)
                    ),
                ),
            }
        }
        if let Some((first, e, n)) = unset {
            self.progress.warning_msg(format!(
                "the inode flags (chattr) of {} were not set: {e} (the first: {}); immutable \
                 and append-only need root, and not every file system has every flag",
                crate::units::count(n, "entry"),
                first.display()
            ));
        }
    }

    /// Says what was done with a file (`--verbose`); `path` is built only then.
    fn list(&self, action: FileAction, path: impl FnOnce() -> PathBuf, size: u64) {
        if self.opts.list_files {
            list_file(self.progress, action, &path(), size);
        }
    }

    /// An entry left as it was.
    fn kept(&mut self, st: &sys::Stat, node: &Node, path: impl FnOnce() -> PathBuf) {
        self.list(FileAction::Unchanged, path, list_size(node));
        self.stats.kept += 1;
        // A file kept where the snapshot has something else counts too.
        if st.kind() == libc::S_IFREG {
            self.stats.kept_bytes += st.size;
        }
        if node.kind == NodeKind::File {
            // Counted as done: the total is the snapshot's bytes, every name's.
            self.progress.bytes_done(node.size);
            self.progress.file_done();
        } else {
            self.progress.entry_done();
        }
    }

    /// A hard-linked file kept as it was is the first name later names link to.
    fn remember_first_link(&mut self, parent: &Arc<Dir>, name: &CStr, st: &sys::Stat, node: &Node) {
        if node.nlink > 1 && st.kind() == libc::S_IFREG {
            self.hardlinks
                .entry((node.dev, node.inode))
                .or_insert_with(|| FirstLink {
                    dir: Arc::downgrade(parent),
                    dir_node: parent.node.clone(),
                    name: name.to_owned(),
                    id: st.id(),
                    owners: [st.uid, st.uid],
                    kept: true,
                });
        }
    }

    /// A name made a link of its first name: listed now, or with the first name
    /// once that is written (`-v`).
    fn listed_link(
        &mut self,
        key: (u64, u64),
        parent: &Arc<Dir>,
        name: &CStr,
        replaced: bool,
        size: u64,
    ) {
        match self.links_waiting.get_mut(&key) {
            Some(waiting) => waiting.push((parent.node.join(name), replaced)),
            None => self.list(
                FileAction::written(replaced),
                || parent.node.join(name),
                size,
            ),
        }
    }

    /// `--delete`: removes from `dir` (which existed before the restore) what the
    /// snapshot does not have there, directories with everything in them, through
    /// descriptors and without following symlinks. Nothing on another mount than the
    /// target's: a directory with a file system mounted on it (an excluded mount
    /// point the snapshot holds empty, say) keeps what that file system holds.
    fn delete_extra(
        &mut self,
        dir: &Arc<Dir>,
        keep: &std::collections::HashSet<Vec<u8>>,
        snap_path: &str,
        all: bool,
    ) {
        match sys::mount_of(dir.fd(), c"") {
            Ok(m) if m == self.mount => {}
            Ok(_) => {
                self.left_mount(dir.node.path());
                return;
            }
            Err(e) => {
                self.issue(dir.node.path(), format!("looking at it for --delete: {e}"));
                return;
            }
        }
        let names = match sys::list_dir(dir.fd()) {
            Ok(n) => n,
            Err(e) => {
                self.issue(dir.node.path(), format!("listing it for --delete: {e}"));
                return;
            }
        };
        let (includes, excludes) = (self.includes.clone(), self.excludes.clone());
        for name in names {
            let n = name.to_bytes();
            if keep.contains(n) {
                continue;
            }
            if !spared_extra(excludes.as_deref(), &includes, all, snap_path, n) {
                self.remove(dir, &name);
            } else if !all && !is_excluded(excludes.as_deref(), snap_path, n) {
                // Not chosen itself: what the includes choose below it goes.
                let (mount, spared) = (self.mount, self.spared.clone());
                let at = format!("{snap_path}/{}", snap_name(n));
                let extras = ChosenExtras {
                    mount,
                    spared: &spared,
                    excludes: excludes.as_deref(),
                    includes: &includes,
                };
                extras.walk(dir.fd(), &name, dir.node.join(&name), at, &mut |found| {
                    match found {
                        Found::Chosen(fd, shown, name) => {
                            self.remove_at(fd, &|| shown.join(<std::ffi::OsStr as std::os::unix::ffi::OsStrExt>::from_bytes(name.to_bytes())), name);
                        }
                        Found::Unlisted(path, e) => {
                            self.issue(path, format!("listing it for --delete: {e}"))
                        }
                    }
                });
            }
        }
    }

    /// Removes `name` from `dir` for `--delete` (a directory with everything in it,
    /// mount points and the repository below it excepted).
    fn remove(&mut self, dir: &Arc<Dir>, name: &CStr) -> Gone {
        self.remove_at(dir.fd(), &|| dir.node.join(name), name)
    }

    /// [`Self::remove`] in the directory `dir`, `shown` the entry's path for messages.
    fn remove_at(
        &mut self,
        dir: std::os::fd::BorrowedFd<'_>,
        shown: &dyn Fn() -> PathBuf,
        name: &CStr,
    ) -> Gone {
        match target::remove_tree(dir, name, self.mount, &self.spared) {
            Ok(r) => {
                self.stats.deleted += r.removed;
                if r.removed > 0 {
                    self.list(FileAction::Deleted, shown, r.bytes);
                }
                if r.spared_left > 0 {
                    self.stats.repository_left = true;
                    self.progress.warning(&shown(), SPARED);
                }
                if r.mounts_left > 0 {
                    self.stats.mounts_left += r.mounts_left;
                    self.progress.warning(
                        &shown(),
                        &format!(
                            "--delete left {} alone: another file system is mounted there",
                            if r.mounts_left == 1 {
                                "a mount point".to_string()
                            } else {
                                format!("{} mount points", r.mounts_left)
                            }
                        ),
                    );
                }
                Gone::of(&r)
            }
            Err((r, e)) => {
                self.stats.deleted += r.removed;
                self.stats.mounts_left += r.mounts_left;
                self.stats.repository_left |= r.spared_left > 0;
                let also = if r.mounts_left > 0 {
                    format!(
                        " ({} with another file system mounted left alone before it)",
                        r.mounts_left
                    )
                } else {
                    String::new()
                };
                self.issue(shown(), format!("deleting it: {e}{also}"));
                Gone::Failed
            }
        }
    }

    /// A directory where the snapshot has a file, symlink or device (`existing`):
    /// `--delete` removes it, since nothing in it is in the snapshot; without it the
    /// directory stays and the entry is reported. `false`: it is still there.
    fn clear_dir_in_the_way(
        &mut self,
        parent: &Arc<Dir>,
        name: &CStr,
        existing: Option<&sys::Stat>,
    ) -> bool {
        if existing.is_none_or(|st| st.kind() != libc::S_IFDIR) {
            return true;
        }
        if !self.opts.delete {
            self.issue(
                parent.node.join(name),
                "a directory is in the way (--delete replaces it)".into(),
            );
            return false;
        }
        match self.remove(parent, name) {
            Gone::All => true,
            Gone::Kept(why) => {
                self.issue(parent.node.join(name), why.into());
                false
            }
            // Reported by `remove`.
            Gone::Failed => false,
        }
    }

    /// `--delete` leaves the directory at `path` as it is: another file system is
    /// mounted there.
    fn left_mount(&mut self, path: PathBuf) {
        self.stats.mounts_left += 1;
        self.progress.warning(
            &path,
            "another file system is mounted here: --delete left what it holds alone",
        );
    }

    fn run(&mut self) -> Result<()> {
        loop {
            // The target is full: the walk ends here, and the caller's flush still
            // hands the batch to the writers (files created for it are written, or
            // counted as left unfinished, not dropped unsaid); the caller then
            // fails with [`Self::full_error`].
            if self.full.is_some() {
                return Ok(());
            }
            let Some(top) = self.stack.last_mut() else {
                break;
            };
            // Between entries: stopping here leaves only whole files behind (the
            // batch written so far is finished by the caller's flush).
            if self.progress.is_cancelled() {
                self.stopped = true;
                return Ok(());
            }
            let Some(node) = top.todo.pop() else {
                self.leave()?;
                continue;
            };
            // Only a frame that could not be reopened has no descriptor, and its
            // entries were dropped then.
            let Some(parent) = top.dir.clone() else {
                continue;
            };
            let fresh = top.fresh;
            let (whole, way) = if top.whole || node.kind != NodeKind::Dir {
                (top.whole, String::new())
            } else {
                self.whole.below(&top.way, &node.name)
            };
            let (inside, ancestor, snap_path) = judge(
                top.all,
                &top.snap_path,
                &node.name,
                &self.includes,
                self.excludes.as_deref(),
            );
            if !inside && !ancestor {
                continue;
            }
            let name = match c_name(&node.name) {
                Ok(n) => n,
                Err(e) => {
                    let p = parent
                        .node
                        .path()
                        .join(String::from_utf8_lossy(&node.name).as_ref());
                    self.issue(p, e.to_string());
                    continue;
                }
            };
            match node.kind {
                NodeKind::Dir => {
                    let scope = Scope {
                        all: inside,
                        snap_path,
                        whole,
                        way,
                    };
                    self.dir(&parent, name, node, fresh, scope)?
                }
                _ if !inside => {}
                NodeKind::File => self.file(parent, name, node, fresh)?,
                _ => self.special(&parent, &name, &node, fresh),
            }
        }
        Ok(())
    }

    fn dir(
        &mut self,
        parent: &Arc<Dir>,
        name: CString,
        node: Node,
        fresh: bool,
        scope: Scope,
    ) -> Result<()> {
        let Scope {
            all,
            snap_path,
            whole,
            way,
        } = scope;
        // Something other than a directory where the snapshot has one: replaced
        // unless the mode keeps it (then nothing below is restored either).
        let existing = if fresh {
            None
        } else {
            self.existing(parent, &name)?
        };
        let other_there = existing.is_some_and(|st| st.kind() != libc::S_IFDIR);
        if let Some(st) = existing.filter(|_| other_there)
            && self.decide(parent, &name, Some(&st), &node) != Decision::Write
        {
            self.kept(&st, &node, || parent.node.join(&name));
            // Not an error (the mode asked for it), but the whole directory of
            // the snapshot is not there: said, not left to be found out.
            self.progress.warning(
                &parent.node.join(&name),
                "kept as it is (--overwrite): it is not a directory, where the snapshot has \
                 one, so nothing below it was restored",
            );
            return Ok(());
        }
        let opened = match target::ensure_dir(parent, &name, fresh) {
            Ok(o) => o,
            Err(e) => {
                self.issue(parent.node.join(&name), format!("creating directory: {e}"));
                return Ok(());
            }
        };
        // The repository being restored from, where the snapshot has a directory
        // (one made of another repository that held it): never written into.
        if !opened.created && self.spared.contains(&opened.stat.id()) {
            self.issue(parent.node.join(&name), REPOSITORY_HERE.into());
            return Ok(());
        }
        // A directory that was there keeps its own metadata where the mode keeps
        // existing entries: only what goes into it is restored.
        let keep_meta = !opened.created
            && overwrite::keeps_dir(
                self.opts.overwrite,
                self.unfinished_since,
                &opened.stat,
                &node,
            );
        // Immutable or append-only (an earlier restore's flags, most likely): its
        // entries could be neither replaced nor added. Unlocked (as root) for the
        // restore; it gets the snapshot's flags at the end, or, kept as it was,
        // its own back.
        let own = (!opened.created && !opened.path_only)
            .then(|| sys::inode_flags(opened.fd.as_fd()).ok())
            .flatten();
        let lifted = own
            .filter(|f| f & LOCKING_INODE_FLAGS != 0)
            .and_then(|_| sys::lift_locks(opened.fd.as_fd()).ok().flatten());
        let inherits = self.stack.last().is_some_and(|f| f.inherits)
            || own.is_some_and(|f| f & INHERITED_FLAGS != 0);
        // Kept, but with the snapshot's time after a restore that did not finish:
        // most likely that restore's own, its flags perhaps not set yet.
        let unfinished_own = keep_meta
            && self.unfinished_since.is_some()
            && opened.stat.mtime == (node.mtime.secs, node.mtime.nanos);
        if unfinished_own {
            self.flag_later(parent, &name, &node);
        }
        let action = if keep_meta {
            FileAction::Unchanged
        } else {
            overwrite::dir_action_at(
                Some(parent.fd()),
                &name,
                (!opened.created).then_some(&opened.stat),
                other_there,
                &node,
                self.opts.owners,
                &self.opts.xattrs,
                self.opts.overwrite,
            )
        };
        // Listed as it is entered, so that its entries come after it.
        if self.opts.list_files {
            self.list(action, || parent.node.join(&name), 0);
        }
        if keep_meta {
            // Counted, not reported done: that is when it is complete.
            self.stats.kept += 1;
            if let Some(own) = lifted.filter(|_| !unfinished_own) {
                self.flag_own_back(parent, &name, own, true);
            }
        } else if action == FileAction::Unchanged {
            // Already the snapshot's (mode, owner, time): counted as left as it
            // was, as `-v` lists it (QA: a restore with nothing to do said it
            // wrote every directory). Its metadata is set again at the end only
            // if what went into it changed its time.
            self.stats.kept += 1;
            self.flag_later(parent, &name, &node);
        } else {
            self.stats.dirs += 1;
            self.flag_later(parent, &name, &node);
        }
        let dir_node = DirNode::child(&parent.node, name, &opened.stat);
        let dir = Arc::new(Dir {
            fd: opened.fd,
            node: dir_node.clone(),
            path_only: opened.path_only,
        });
        let tree = match node
            .subtree
            .map(|sub| load_tree(self.repo, &sub, &self.opts.xattrs))
        {
            Some(Ok(t)) => Some(t),
            Some(Err(e)) => {
                self.issue_with(
                    dir_node.path(),
                    format!("directory contents lost: {e}"),
                    lost_in(&e),
                );
                None
            }
            None => None,
        };
        let meta = if keep_meta {
            DirMeta::OwnTimes(opened.stat.atime, opened.stat.mtime)
        } else {
            DirMeta::Snapshot(Box::new(node), !opened.created)
        };
        let Some(tree) = tree else {
            return self.complete_dir(Some(dir), meta);
        };
        let keep = keep_names(
            self.opts,
            &tree.nodes,
            all,
            &self.includes,
            whole,
            opened.created,
        );
        let mut todo = tree.nodes;
        todo.reverse();
        self.stack.push(Frame {
            todo,
            weak: Arc::downgrade(&dir),
            dir: Some(dir),
            node: dir_node,
            meta: Some(meta),
            all,
            snap_path: if all && self.excludes.is_none() {
                String::new()
            } else {
                snap_path
            },
            fresh: opened.created,
            keep,
            whole,
            way,
            inherits,
        });
        let n = self.stack.len();
        if n > OPEN_ANCESTORS + 1 {
            self.stack[n - 1 - OPEN_ANCESTORS].dir = None;
        }
        Ok(())
    }

    /// The walk leaves the directory on top of the stack: all its entries exist.
    /// Its metadata waits for the batch holding its last files; the directory above
    /// is reopened (and checked) if its descriptor was closed on the way down.
    fn leave(&mut self) -> Result<()> {
        let Some(f) = self.stack.pop() else {
            return Ok(());
        };
        let child = f.dir.clone();
        if let (Some(keep), Some(dir)) = (&f.keep, &f.dir) {
            self.delete_extra(dir, keep, &f.snap_path, f.all);
        }
        if let Some(meta) = f.meta {
            self.complete_dir(f.dir, meta)?;
        }
        let Some(top) = self.stack.last() else {
            return Ok(());
        };
        if top.dir.is_some() {
            return Ok(());
        }
        let node = top.node.clone();
        let reopened = match top.weak.upgrade() {
            Some(d) => Ok(d),
            None => match child.as_ref().map(|c| target::reopen_parent(c, &node)) {
                Some(Ok(d)) => Ok(Arc::new(d)),
                _ => target::reopen_dir(&self.root, &node).map(Arc::new),
            },
        };
        match reopened {
            Ok(d) => {
                if let Some(top) = self.stack.last_mut() {
                    top.weak = Arc::downgrade(&d);
                    top.dir = Some(d);
                }
            }
            Err(e) => {
                let left = self.stack.last_mut().map_or(0, |top| {
                    let n = top.todo.len();
                    top.todo.clear();
                    n
                });
                let what = if left == 0 {
                    "its metadata was not applied".to_string()
                } else {
                    format!("{left} of its entries were not restored")
                };
                self.issue(
                    node.path(),
                    format!("could not return to the directory: {e}; {what}"),
                );
            }
        }
        Ok(())
    }

    /// A directory is complete (`dir` is `None` when it could not be reopened).
    fn complete_dir(&mut self, dir: Option<Arc<Dir>>, meta: DirMeta) -> Result<()> {
        if let Some(dir) = dir {
            self.pending.push((dir, meta));
            self.batch_dirs += 1;
        }
        self.progress.entry_done();
        self.maybe_flush()
    }

    fn file(&mut self, parent: Arc<Dir>, name: CString, node: Node, fresh: bool) -> Result<()> {
        let key = (node.dev, node.inode);
        let existing = if fresh {
            None
        } else {
            self.existing(&parent, &name)?
        };
        // A first name kept as it was there holds the snapshot's content only as
        // far as its size and time say: before any other name is made a link of
        // it, its bytes are compared with the snapshot's (once). One that differs
        // is no first name: the other names are judged on their own, a missing one
        // written from the snapshot (QA r14/r16: a replaced first name's content
        // spread to the names linked to it, said "restored").
        if node.nlink > 1
            && let Some(first) = self.hardlinks.get(&key)
            && first.kept
            && existing.as_ref().is_none_or(|st| {
                st.id() != first.id
                    && overwrite::replaces_other_name(
                        overwrite::effective(self.opts.overwrite, self.unfinished_since, st),
                        st,
                        &node,
                    )
            })
        {
            if self.first_holds_the_snapshots(key, &node) {
                if let Some(f) = self.hardlinks.get_mut(&key) {
                    f.kept = false;
                }
                // Its bytes were compared with the snapshot's.
                self.first_verified.insert(key);
            } else if let Some(f) = self.hardlinks.remove(&key) {
                let first = f.dir_node.join(&f.name);
                if existing.is_some() {
                    self.progress
                        .warning(&parent.node.join(&name), &not_linked_warning(&first));
                } else {
                    self.kept_apart.insert(key, first);
                }
            }
        }
        if node.nlink > 1
            && let Some(first) = self.hardlinks.get(&key)
        {
            // Already this inode, or kept by the mode (`never`; `if-newer` when it
            // is newer than the snapshot's): nothing to do.
            if let Some(st) = &existing
                && (st.id() == first.id
                    || !overwrite::replaces_other_name(
                        overwrite::effective(self.opts.overwrite, self.unfinished_since, st),
                        st,
                        &node,
                    ))
            {
                if st.id() != first.id {
                    let first = first.dir_node.join(&first.name);
                    self.progress.warning(
                        &parent.node.join(&name),
                        &format!(
                            "kept as it is (--overwrite), so it is not a name of {}, as \
                             it is in the snapshot",
                            first.display()
                        ),
                    );
                }
                self.kept(st, &node, || parent.node.join(&name));
                return Ok(());
            }
            if !self.clear_dir_in_the_way(&parent, &name, existing.as_ref()) {
                return Ok(());
            }
            let replaced = existing.is_some();
            // With `--verify` a name made a link holds what its first name holds:
            // verified with it, once that is read back (written now) or when it
            // was compared before it was kept, so that the summary's counts of
            // names written and verified agree (QA: "wrote 3 files", "verified 1").
            match self.link(&parent, &name, key, fresh) {
                Ok(_) if self.opts.verify => {
                    if let Some(n) = self.links_to_verify.get_mut(&key) {
                        *n += 1;
                    } else if self.first_verified.contains(&key) {
                        self.stats.verified += 1;
                    }
                    self.listed_link(key, &parent, &name, replaced, node.size);
                }
                Ok(_) => self.listed_link(key, &parent, &name, replaced, node.size),
                Err(e) => self.issue(parent.node.join(&name), format!("creating hard link: {e}")),
            }
            self.stats.files += 1;
            // The total counts every name's bytes (as the snapshot's size does):
            // a name linked counts its size done, or the progress never reached
            // its end (QA: 4 of 16 MiB with four names).
            self.progress.bytes_done(node.size);
            self.progress.file_done();
            return Ok(());
        }
        match self.decide(&parent, &name, existing.as_ref(), &node) {
            Decision::Write => {}
            Decision::Keep => {
                if let Some(st) = &existing {
                    // Later names link to it when it holds the snapshot's content
                    // (`if-changed` kept it for that, or its size and time say so):
                    // kept by `never` or `if-newer` it may hold anything, and a name
                    // restored as a link to it would too.
                    let if_changed =
                        overwrite::effective(self.opts.overwrite, self.unfinished_since, st)
                            == Overwrite::IfChanged;
                    // The snapshot's entry already: its flags are the snapshot's.
                    // So is one that looks it after a restore that did not finish
                    // (its last pass, the flags, may be what was cut short).
                    if if_changed
                        || self.unfinished_since.is_some() && overwrite::looks_unchanged(st, &node)
                    {
                        self.flag_later(&parent, &name, &node);
                    }
                    if if_changed || overwrite::looks_unchanged(st, &node) {
                        self.remember_first_link(&parent, &name, st, &node);
                    } else if node.nlink > 1 {
                        self.kept_apart
                            .entry(key)
                            .or_insert_with(|| parent.node.join(&name));
                    }
                    if let Some(why) = overwrite::kept_other_kind(st, &node) {
                        self.progress.warning(&parent.node.join(&name), &why);
                    }
                    self.kept(st, &node, || parent.node.join(&name));
                }
                return Ok(());
            }
            Decision::Metadata => {
                if let Some(st) = &existing {
                    self.remember_first_link(&parent, &name, st, &node);
                    let r = overwrite::open_checked(parent.fd(), &name, st).and_then(|f| {
                        // Its flags, if any, are the snapshot's again at the end.
                        let _ = sys::lift_locks(f.as_fd());
                        metadata::drop_other_xattrs(f.as_fd(), &node, &self.opts.xattrs)?;
                        metadata::apply(f.as_fd(), false, &node, self.opts.owners)
                    });
                    if let Err(e) = r {
                        self.issue(parent.node.join(&name), format!("setting metadata: {e}"));
                    }
                    self.flag_later(&parent, &name, &node);
                    self.stats.metadata_only += 1;
                    self.list(FileAction::Updated, || parent.node.join(&name), node.size);
                    self.progress.bytes_done(node.size);
                    self.progress.file_done();
                }
                return Ok(());
            }
        }
        let direct = node.nlink <= 1 && matches!(&node.content, Content::Inline(v) if v.len() == 1);
        if !self.clear_dir_in_the_way(&parent, &name, existing.as_ref()) {
            return Ok(());
        }
        if let Err(e) = target::remove_existing(&parent, &name, fresh) {
            self.issue(parent.node.join(&name), format!("creating file: {e}"));
            return Ok(());
        }
        let created = if direct {
            None
        } else {
            let made = target::create_file(parent.fd(), &name).and_then(|f| {
                // One that cannot have its size (EFBIG: past `ulimit -f` or the
                // file system's largest file) is not left behind empty.
                if let Err(e) = f.set_len(node.size) {
                    let _ = sys::unlink_at(parent.fd(), &name);
                    return Err(e);
                }
                sys::fstat(f.as_fd())
            });
            let st = match made {
                Ok(st) => st,
                Err(e) => {
                    let why = if e.raw_os_error() == Some(libc::EFBIG) {
                        " (larger than the file-size limit, `ulimit -f`, or the largest \
                         file the target's file system takes)"
                    } else {
                        ""
                    };
                    self.issue(parent.node.join(&name), format!("creating file: {e}{why}"));
                    return Ok(());
                }
            };
            if node.nlink > 1 {
                if let Some(kept) = self.kept_apart.remove(&key) {
                    self.progress
                        .warning(&parent.node.join(&name), &own_file_warning(&kept));
                }
                self.hardlinks.insert(
                    key,
                    FirstLink {
                        dir: Arc::downgrade(&parent),
                        dir_node: parent.node.clone(),
                        name: name.clone(),
                        id: st.id(),
                        owners: [st.uid, if self.opts.owners { node.uid } else { st.uid }],
                        kept: false,
                    },
                );
                if self.opts.list_files {
                    self.links_waiting.insert(key, Vec::new());
                }
                if self.opts.verify {
                    self.links_to_verify.insert(key, 0);
                }
            }
            Some(st)
        };
        self.stats.files += 1;
        self.flag_later(&parent, &name, &node);
        self.batch_chunks += if direct { 1 } else { chunks_of(&node) };
        if !self
            .last_dir
            .as_ref()
            .is_some_and(|d| Arc::ptr_eq(d, &parent))
        {
            self.batch_dirs += 1;
            self.last_dir = Some(parent.clone());
        }
        self.batch.push(FileJob {
            dir: parent,
            name,
            node,
            direct,
            created,
            replaced: existing.is_some(),
        });
        self.maybe_flush()
    }

    /// Whether the first name of `key`, kept as it was, holds `node`'s content
    /// (opened without following a symlink, and still that file; anything
    /// unreadable: no).
    fn first_holds_the_snapshots(&mut self, key: (u64, u64), node: &Node) -> bool {
        let Some(first) = self.hardlinks.get(&key) else {
            return false;
        };
        let (first_name, first_id, dir_node) =
            (first.name.clone(), first.id, first.dir_node.clone());
        let Ok(src) = self.first_dir(key, &dir_node) else {
            return false;
        };
        let flags = libc::O_RDONLY | libc::O_NONBLOCK | libc::O_NOCTTY | libc::O_NOFOLLOW;
        let Ok(mut f) = sys::open_at(src.fd(), &first_name, flags, 0).map(std::fs::File::from)
        else {
            return false;
        };
        if !sys::fstat(f.as_fd()).is_ok_and(|st| st.id() == first_id) {
            return false;
        }
        let path = || dir_node.join(&first_name).display().to_string();
        overwrite::content_matches(self.repo, &mut f, node, &path).unwrap_or(false)
    }

    /// The directory of `key`'s first name: open still, or reopened (and checked)
    /// from the target's root.
    fn first_dir(&mut self, key: (u64, u64), dir_node: &Arc<DirNode>) -> std::io::Result<Arc<Dir>> {
        if let Some(d) = self.hardlinks.get(&key).and_then(|f| f.dir.upgrade()) {
            return Ok(d);
        }
        match &self.link_dir {
            Some(d) if Arc::ptr_eq(&d.node, dir_node) => Ok(d.clone()),
            _ => {
                let d = Arc::new(target::reopen_dir(&self.root, dir_node)?);
                self.link_dir = Some(d.clone());
                Ok(d)
            }
        }
    }

    /// Another name for a hard-linked file restored earlier: linked to the inode
    /// restore created, found through its directory's descriptor (reopened and
    /// checked if it was closed), and checked after linking.
    fn link(
        &mut self,
        parent: &Arc<Dir>,
        name: &CStr,
        key: (u64, u64),
        fresh: bool,
    ) -> std::io::Result<()> {
        let Some(first) = self.hardlinks.get(&key) else {
            return Err(std::io::Error::other("no first name"));
        };
        let (first_name, first_id, owners, dir_node) = (
            first.name.clone(),
            first.id,
            first.owners,
            first.dir_node.clone(),
        );
        let src = self.first_dir(key, &dir_node)?;
        target::remove_existing(parent, name, fresh)?;
        match sys::link_at(src.fd(), &first_name, parent.fd(), name) {
            // A first name kept as it was, immutable or append-only (an earlier
            // restore's): no name can be linked to it until that is lifted, and
            // it gets its flags back at the end.
            Err(e) if e.raw_os_error() == Some(libc::EPERM) => {
                let fd = sys::open_at(
                    src.fd(),
                    &first_name,
                    libc::O_RDONLY | libc::O_NONBLOCK | libc::O_NOCTTY,
                    0,
                )?;
                if sys::fstat(fd.as_fd())?.id() != first_id {
                    return Err(e);
                }
                let Some(own) = sys::lift_locks(fd.as_fd())? else {
                    return Err(e);
                };
                self.flag_own_back(&src, &first_name, own, false);
                sys::link_at(src.fd(), &first_name, parent.fd(), name)?;
            }
            r => r?,
        }
        let st = sys::stat_at(parent.fd(), name)?;
        if st.id() != first_id || !owners.contains(&st.uid) {
            let _ = sys::unlink_at(parent.fd(), name);
            return Err(std::io::Error::other(
                "its first name was replaced during the restore (the link was removed)",
            ));
        }
        Ok(())
    }

    fn maybe_flush(&mut self) -> Result<()> {
        if self.batch_chunks >= self.batch_chunks_max
            || self.batch.len() >= BATCH_FILES
            || self.batch_dirs >= self.dir_budget
        {
            self.flush_batch()?;
        }
        Ok(())
    }

    /// Hands the batch built so far to the executor thread, after the one before it
    /// came back, and finishes that one while the new one is written.
    fn flush_batch(&mut self) -> Result<()> {
        let batch = Batch {
            jobs: std::mem::take(&mut self.batch),
            pending: std::mem::take(&mut self.pending),
        };
        self.batch_chunks = 0;
        self.batch_dirs = 0;
        self.last_dir = None;
        let previous = self.wait_batch()?;
        if !batch.jobs.is_empty() || !batch.pending.is_empty() {
            let sent = self.to_exec.as_ref().map(|tx| tx.send(batch));
            match sent {
                Some(Ok(())) => self.in_flight = true,
                // The executor thread is gone: only a panic there ends it early, and
                // the scope reports that.
                _ => return Err(Error::Invalid("the restore's writer stopped".into())),
            }
        }
        if let Some(done) = previous {
            self.finish_batch(done);
        }
        Ok(())
    }

    /// Waits for the batch in flight, if any.
    fn wait_batch(&mut self) -> Result<Option<Written>> {
        if !std::mem::take(&mut self.in_flight) {
            return Ok(None);
        }
        match self.from_exec.recv() {
            Ok(r) => r.map(Some),
            Err(_) => Err(Error::Invalid("the restore's writer stopped".into())),
        }
    }

    /// Finishes the last batch: after the walk's final [`flush_batch`].
    fn drain(&mut self) -> Result<()> {
        if let Some(done) = self.wait_batch()? {
            self.finish_batch(done);
        }
        self.to_exec = None;
        Ok(())
    }

    /// A written batch: its failures reported, `--verify`, then the metadata of its
    /// files that were not written with theirs, and of its completed directories.
    fn finish_batch(&mut self, done: Written) {
        let Written {
            batch: Batch { jobs, pending },
            mut failed,
            xattrs_refused,
        } = done;
        let owners = self.opts.owners;
        if !jobs.is_empty() {
            if self.opts.verify {
                for (f, m) in verify(self.repo, &jobs, &failed) {
                    self.stats.verified += 1;
                    if let Some(m) = m {
                        failed.entry(f).or_insert(Failure::of(m));
                    }
                }
                // The other names of first names read back whole count with them.
                for (i, job) in jobs.iter().enumerate() {
                    let key = (job.node.dev, job.node.inode);
                    if job.node.nlink > 1
                        && let Some(n) = self.links_to_verify.remove(&key)
                        && !failed.contains_key(&(i as u32))
                    {
                        self.stats.verified += n;
                        self.first_verified.insert(key);
                    }
                }
            }
            // The content of the files restored in full: a file that failed part
            // way (a full disk) is an error, not bytes written.
            self.stats.bytes += jobs
                .iter()
                .enumerate()
                .filter(|(i, _)| !failed.contains_key(&(*i as u32)))
                .map(|(_, j)| j.node.size)
                .sum::<u64>();
            for (i, job) in jobs.iter().enumerate() {
                if let Some(Failure { message: m, lost }) = failed.get(&(i as u32)) {
                    let lost = *lost;
                    // Counted when it was queued; it is an error, not a file written.
                    self.stats.files = self.stats.files.saturating_sub(1);
                    // Given up once the target was full: counted, said once by the
                    // restore's error (a file created before is left unfinished).
                    if m == TARGET_FULL {
                        if job.direct {
                            self.stats.unwritten_full += 1;
                        } else {
                            self.stats.unfinished_full += 1;
                            self.left_unfinished = true;
                        }
                        continue;
                    }
                    // Not given its metadata: it keeps the restore's time and mode
                    // 0600, so nothing syncing by size and time takes it as intact.
                    // A one-chunk file is created only with its content: when that
                    // never came, it is created here, at its size (a hole), so that
                    // it is there to see, like a multi-chunk file.
                    if job.direct {
                        match target::create_file(job.dir.fd(), &job.name) {
                            // Made, but perhaps not at its size: it is there,
                            // unfinished, either way.
                            Ok(f) => {
                                let _ = f.set_len(job.node.size);
                            }
                            Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => {}
                            Err(e) => {
                                // Not there at all (a full disk): one message, and
                                // nothing said of a time and mode it does not have.
                                self.issue_with(
                                    job.path(),
                                    format!("not restored: creating file: {e} ({m})"),
                                    lost,
                                );
                                continue;
                            }
                        }
                    }
                    self.left_unfinished = true;
                    // A cancel leaves every file in flight so: counted, and said
                    // once at the end, not a line each (thousands of small files).
                    if m == CANCELLED {
                        self.stats.cancelled_files += 1;
                        continue;
                    }
                    self.issue_with(
                        job.path(),
                        format!(
                            "content not restored in full ({m}); left with the restore's time and mode 0600"
                        ),
                        lost,
                    );
                    continue;
                }
                if job.direct {
                    // Created, written and given its metadata by the executor.
                    if let Some(m) = xattrs_refused.get(&(i as u32)) {
                        self.issue(job.path(), m.clone());
                    }
                    self.list(
                        FileAction::written(job.replaced),
                        || job.path(),
                        job.node.size,
                    );
                    self.progress.file_done();
                    continue;
                }
                let r = job
                    .reopen(libc::O_RDONLY)
                    .and_then(|f| metadata::apply(f.as_fd(), false, &job.node, owners));
                if let Err(e) = r {
                    self.issue(job.path(), format!("setting metadata: {e}"));
                }
                self.list(
                    FileAction::written(job.replaced),
                    || job.path(),
                    job.node.size,
                );
                // Its other names hold what it holds now.
                let key = (job.node.dev, job.node.inode);
                if job.node.nlink > 1
                    && let Some(names) = self.links_waiting.remove(&key)
                {
                    for (n, replaced) in names {
                        self.list(FileAction::written(replaced), || n, job.node.size);
                    }
                }
                self.progress.file_done();
            }
        }
        // Directories whose entries are all written, deepest first, through the
        // descriptors restore holds (never a path someone could have changed).
        for (dir, meta) in pending {
            let r = match meta {
                // Restored into an existing directory: what it held beyond the
                // snapshot goes (a default ACL would pass to every file created in
                // it). A new one keeps what it inherited, as a new file does.
                // (One that existed was unlocked when the walk entered it.)
                // One that holds the snapshot's metadata already is not touched
                // (each write would change its ctime for nothing).
                DirMeta::Snapshot(node, true)
                    if Self::dir_is_already(dir.fd(), &node, owners, &self.opts.xattrs) =>
                {
                    Ok(())
                }
                DirMeta::Snapshot(node, existed) => if existed {
                    metadata::drop_other_xattrs(dir.fd(), &node, &self.opts.xattrs)
                } else {
                    Ok(())
                }
                .and_then(|()| metadata::apply(dir.fd(), dir.path_only, &node, owners)),
                DirMeta::OwnTimes(atime, mtime) if dir.path_only => {
                    sys::utimens_path_fd(dir.fd(), atime, mtime)
                }
                DirMeta::OwnTimes(atime, mtime) => sys::futimens(dir.fd(), atime, mtime),
            };
            if let Err(e) = r {
                self.issue(dir.node.path(), format!("setting metadata: {e}"));
            }
        }
    }

    /// Does the directory open as `fd` hold `node`'s metadata already: mode, owner
    /// (when restored), modification time to the nanosecond and the extended
    /// attributes? The access time is not compared: any reader of the directory
    /// moves it (QA: a `find` between two restores had every directory's times
    /// set again), and `if-changed` does not compare a file's either. Any error
    /// reading it means "no" (it is then set).
    fn dir_is_already(
        fd: std::os::fd::BorrowedFd<'_>,
        node: &Node,
        owners: bool,
        select: &crate::ops::restore::XattrSelect,
    ) -> bool {
        let Ok(st) = sys::fstat(fd) else {
            return false;
        };
        st.mode & 0o7777 == node.mode & 0o7777
            && (!owners || (st.uid, st.gid) == (node.uid, node.gid))
            && st.mtime == (node.mtime.secs, node.mtime.nanos)
            && overwrite::xattrs_match(fd, c".", &node.xattrs, select)
    }

    /// A symlink, FIFO or device: created by name in its parent's descriptor, then
    /// given its metadata through an `O_PATH` descriptor checked to be what was
    /// created.
    fn special(&mut self, parent: &Arc<Dir>, name: &CStr, node: &Node, fresh: bool) {
        let kind = node.kind.type_bits();
        let rdev = match node.kind {
            NodeKind::Symlink | NodeKind::Fifo => None,
            NodeKind::CharDevice | NodeKind::BlockDevice => Some(node.rdev),
            NodeKind::Socket => {
                self.stats.sockets_skipped += 1;
                self.progress.entry_done();
                return;
            }
            NodeKind::File | NodeKind::Dir => return,
        };
        let mut replaced = false;
        if !fresh {
            match sys::stat_at(parent.fd(), name) {
                Ok(st) if self.decide(parent, name, Some(&st), node) != Decision::Write => {
                    if let Some(why) = overwrite::kept_other_kind(&st, node) {
                        self.progress.warning(&parent.node.join(name), &why);
                    }
                    self.kept(&st, node, || parent.node.join(name));
                    return;
                }
                Ok(st) => {
                    if !self.clear_dir_in_the_way(parent, name, Some(&st)) {
                        self.progress.entry_done();
                        return;
                    }
                    replaced = true;
                }
                Err(e) if e.raw_os_error() == Some(libc::ENOENT) => {}
                Err(e) => {
                    self.issue(parent.node.join(name), e.to_string());
                    self.progress.entry_done();
                    return;
                }
            }
        }
        // Another name of a symlink, FIFO or device restored earlier (hard links
        // to such entries exist, as to files): linked, as a file's are.
        let key = (node.dev, node.inode);
        if node.nlink > 1 && self.hardlinks.contains_key(&key) {
            if let Err(e) = self.link(parent, name, key, fresh) {
                self.issue(parent.node.join(name), format!("creating hard link: {e}"));
            } else {
                self.stats.other += 1;
                self.list(FileAction::written(replaced), || parent.node.join(name), 0);
            }
            self.progress.entry_done();
            return;
        }
        let created = target::remove_existing(parent, name, fresh).and_then(|()| {
            if node.kind == NodeKind::Symlink {
                sys::symlink_at(&c_name(&node.link_target)?, parent.fd(), name)
            } else {
                sys::mknod_at(
                    parent.fd(),
                    name,
                    kind | 0o600,
                    rdev.unwrap_or(0) as libc::dev_t,
                )
            }
        });
        if let Err(e) = created {
            self.issue(parent.node.join(name), e.to_string());
        } else {
            self.stats.other += 1;
            self.list(FileAction::written(replaced), || parent.node.join(name), 0);
            let r = target::open_created_special(parent.fd(), name, kind, rdev)
                .and_then(|fd| metadata::apply(fd.as_fd(), true, node, self.opts.owners));
            if let Err(e) = r {
                self.issue(parent.node.join(name), format!("setting metadata: {e}"));
            }
            if node.nlink > 1
                && let Ok(st) = sys::stat_at(parent.fd(), name)
            {
                self.hardlinks.insert(
                    key,
                    FirstLink {
                        dir: Arc::downgrade(parent),
                        dir_node: parent.node.clone(),
                        name: name.to_owned(),
                        id: st.id(),
                        owners: [st.uid, st.uid],
                        kept: false,
                    },
                );
            }
        }
        self.progress.entry_done();
    }
}

#[cfg(test)]
mod tests {
    /// A directory restored as the root (`SNAP:PATH`) is whole when a source is
    /// it or above it, else holds the sources below it, rebased.
    #[test]
    fn whole_under_a_directory() {
        use super::Whole;
        let w = Whole::of(&["/srv/www".to_string(), "/etc/nginx".to_string()]);
        assert!(w.under("/srv/www").root());
        assert!(w.under("/srv/www/site/img").root());
        let srv = w.under("/srv");
        assert!(!srv.root());
        assert_eq!(srv.below("", b"www"), (true, String::new()));
        assert!(!srv.below("", b"nginx").0);
        // A name that only starts like a source is not below it.
        assert!(w.under("/srv/www2").is_empty());
        assert_eq!(w.under("/").sources, w.sources);
    }

    /// What the repository lost is told from what failed elsewhere by the
    /// error's kind, not its words.
    #[test]
    fn lost_data_is_told_by_kind() {
        use super::{Failure, lost_in};
        use cairn_backend::{BackendError, BackendErrorKind as K};
        let backend = |kind| {
            crate::Error::Backend(BackendError {
                kind,
                op: "get",
                path: "data/ab/ab".into(),
                message: "x".into(),
            })
        };
        assert!(lost_in(&crate::Error::BlobNotFound(cairn_format::BlobId(
            [1; 32]
        ))));
        assert!(lost_in(&backend(K::NotFound)));
        assert!(lost_in(&backend(K::OutOfRange)));
        assert!(!lost_in(&backend(K::Transient)));
        assert!(!lost_in(&backend(K::NoSpace)));
        assert!(!lost_in(&crate::Error::io(
            "/t/f",
            std::io::Error::from(std::io::ErrorKind::StorageFull)
        )));
        let f = Failure::error(&backend(K::NotFound)).within("pack 1234");
        assert!(f.lost && f.message.starts_with("pack 1234: "), "{f:?}");
    }

    use super::*;
    use crate::progress::Progress;
    use crate::repo::InitOptions;
    use crate::repo::blob::BlobEncoder;
    use crate::repo::packer::{Packer, Uploader};
    use cairn_backend::MemBackend;
    use cairn_format::pack::BlobKind;
    use cairn_format::tree::Tree;
    use std::sync::Arc;

    /// Stores `trees` (already encoded, possibly malicious) as blobs; returns their ids.
    fn repo_with_trees(trees: &[Vec<u8>]) -> (Repository, Vec<BlobId>) {
        let mut ids = Vec::new();
        let repo = repo_built(|store| {
            for t in trees {
                ids.push(store(t));
            }
        });
        (repo, ids)
    }

    /// A repository holding the trees `build` stores through the function it is
    /// handed (which returns each tree's id, so trees can refer to trees stored
    /// before them).
    fn repo_built(build: impl FnOnce(&mut dyn FnMut(&[u8]) -> BlobId)) -> Repository {
        let backend = Arc::new(MemBackend::new());
        let opts = InitOptions {
            encryption: false,
            ..InitOptions::default()
        };
        let mut repo = Repository::init(backend.clone(), None, &opts).unwrap();
        let mut enc = BlobEncoder::new(None);
        let pool = Arc::new(crate::repo::packer::BufferPool::new(1));
        let mut packer = Packer::new(repo.key().clone(), pool.clone(), 1 << 20);
        let up = Uploader::start(backend, repo.key().clone(), pool);
        build(&mut |t: &[u8]| {
            let id = repo.key().blob_id(t);
            if let Some(p) = packer.add(enc.encode(repo.key(), BlobKind::Tree, id, t).unwrap()) {
                up.send(p).unwrap();
            }
            id
        });
        up.send(packer.finish().unwrap()).unwrap();
        up.finish().unwrap();
        repo.load_index().unwrap();
        assert!(repo.index_errors().is_empty(), "{:?}", repo.index_errors());
        assert!(
            !repo.index().is_empty(),
            "index empty; files {:?}",
            repo.list_index_files()
        );
        repo
    }

    #[test]
    fn malicious_names_never_escape_the_target() {
        let outer = tempfile::tempdir().unwrap();
        let target = outer.path().join("target");
        for name in [
            &b"../escape"[..],
            b"..",
            b"/etc/passwd",
            b"a/../../escape",
            b".",
            b"",
        ] {
            let tree = Tree {
                nodes: vec![Node::new(name.to_vec(), NodeKind::File)],
            };
            let (repo, ids) = repo_with_trees(&[tree.encode()]);
            let opts = RestoreOptions {
                owners: false,
                ..RestoreOptions::new(target.clone())
            };
            let r = restore(
                &repo,
                &ids[0],
                &Whole::root_only(),
                &opts,
                &Progress::none(),
            );
            assert!(matches!(r, Err(Error::Damaged { .. })), "{name:?}: {r:?}");
            // The root tree is refused before the target is made: nothing at all.
            let outside: Vec<_> = std::fs::read_dir(outer.path()).unwrap().collect();
            assert!(outside.is_empty(), "nothing may exist for {name:?}");
        }
    }

    #[test]
    fn a_symlink_and_a_directory_of_the_same_name_are_rejected() {
        let mut link = Node::new(b"d".to_vec(), NodeKind::Symlink);
        link.link_target = b"/".to_vec();
        let mut dir = Node::new(b"d".to_vec(), NodeKind::Dir);
        dir.subtree = Some(BlobId([0; 32]));
        let tree = Tree {
            nodes: vec![link, dir],
        };
        let (repo, ids) = repo_with_trees(&[tree.encode()]);
        let dir = tempfile::tempdir().unwrap();
        let opts = RestoreOptions {
            owners: false,
            ..RestoreOptions::new(dir.path().join("t"))
        };
        assert!(
            restore(
                &repo,
                &ids[0],
                &Whole::root_only(),
                &opts,
                &Progress::none()
            )
            .is_err()
        );
    }

    /// Removes a tree too deep for path system calls (and for `remove_dir_all`, which
    /// recurses) one level at a time through descriptors.
    fn remove_deep(top: &std::path::Path, name: &CStr) {
        use nix::fcntl::{OFlag, openat};
        use nix::sys::stat::Mode;
        use nix::unistd::{UnlinkatFlags, unlinkat};
        let dir = OFlag::O_DIRECTORY | OFlag::O_NOFOLLOW | OFlag::O_RDONLY;
        let mut fd: OwnedFd = fs::File::open(top).unwrap().into();
        let mut depth = 0;
        while let Ok(child) = openat(&fd, name, dir, Mode::empty()) {
            fd = child;
            depth += 1;
        }
        for e in nix::dir::Dir::openat(&fd, ".", dir, Mode::empty())
            .unwrap()
            .iter()
        {
            let e = e.unwrap();
            let n = e.file_name();
            if n != c"." && n != c".." {
                unlinkat(&fd, n, UnlinkatFlags::NoRemoveDir).unwrap();
            }
        }
        for _ in 0..depth {
            let parent = openat(&fd, "..", dir, Mode::empty()).unwrap();
            unlinkat(&parent, name, UnlinkatFlags::RemoveDir).unwrap();
            fd = parent;
        }
    }

    #[test]
    fn a_tree_100000_levels_deep_restores_to_the_bottom() {
        const DEPTH: usize = 100_000;
        let mut bottom = Node::new(b"bottom".to_vec(), NodeKind::File);
        bottom.mode = libc::S_IFREG | 0o640;
        let mut link = Node::new(b"up".to_vec(), NodeKind::Symlink);
        link.link_target = b"..".to_vec();
        link.mode = libc::S_IFLNK | 0o777;
        let mut root = BlobId([0; 32]);
        let repo = repo_built(|store| {
            let mut id = store(
                &Tree {
                    nodes: vec![bottom, link],
                }
                .encode(),
            );
            for level in (0..DEPTH).rev() {
                let mut d = Node::new(b"d".to_vec(), NodeKind::Dir);
                d.mode = libc::S_IFDIR | 0o750;
                d.mtime.secs = 1_000_000 + level as i64;
                d.subtree = Some(id);
                id = store(&Tree { nodes: vec![d] }.encode());
            }
            root = id;
        });
        let dir = tempfile::tempdir().unwrap();
        let target = dir.path().join("t");
        let opts = RestoreOptions {
            owners: false,
            ..RestoreOptions::new(target.clone())
        };
        let stats = restore(&repo, &root, &Whole::root_only(), &opts, &Progress::none()).unwrap();
        assert!(
            stats.issues.is_empty(),
            "{:?}",
            &stats.issues[..3.min(stats.issues.len())]
        );
        assert_eq!((stats.dirs, stats.files, stats.other), (DEPTH as u64, 1, 1));
        // Down through descriptors: the paths are far beyond PATH_MAX.
        let mut fd: OwnedFd = fs::File::open(&target).unwrap().into();
        for level in 0..DEPTH {
            let child = sys::open_at(fd.as_fd(), c"d", libc::O_RDONLY | libc::O_DIRECTORY, 0)
                .unwrap_or_else(|e| panic!("level {level}: {e}"));
            let st = nix::sys::stat::fstat(&child).unwrap();
            assert_eq!(st.st_mode & 0o7777, 0o750, "level {level}");
            assert_eq!(st.st_mtime, 1_000_000 + level as i64, "level {level}");
            fd = child;
        }
        let st = sys::stat_at(fd.as_fd(), c"bottom").unwrap();
        assert_eq!(st.mode, libc::S_IFREG | 0o640);
        assert_eq!(
            sys::stat_at(fd.as_fd(), c"up").unwrap().kind(),
            libc::S_IFLNK
        );
        drop(fd);
        remove_deep(&target, c"d");
    }
}
