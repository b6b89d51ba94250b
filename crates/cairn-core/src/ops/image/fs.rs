//! Files inside an image snapshot (`ls/dump/restore SNAP --image-fs PATH`): the
//! ext2/3/4 filesystem in the image is read in place, through the image's chunk
//! list at the offsets the filesystem asks for, so one file comes back from a disk
//! image without restoring the disk, without root and without a loop device. Only
//! the blocks the filesystem's metadata and the wanted files occupy are read.
//!
//! The filesystem is parsed by `ext4-view` (a read-only ext2/3/4 reader that checks
//! what it reads, including metadata checksums): the image is untrusted input, so
//! its errors are reported, never trusted. Regular files' content, inode numbers
//! and extended attributes come from [`super::blockmap`], which `ext4-view` does
//! not show or reads otherwise than the kernel (uninitialised extents). A whole-disk image with a partition table
//! (MBR or GPT) is read at the partition `--partition N` names, or the first one
//! holding ext2/3/4. XFS, NTFS and other filesystems: mount the image read-only
//! through `cairn mount` (docs/IMAGES.md).

use crate::error::{Error, Result};
use crate::ops::ls::{Entry, escape_name, normalise, unescape_name};
use crate::repo::Repository;
use crate::tree::chunklist::FileReader;
use cairn_format::snapshot::Snapshot;
use cairn_format::tree::Content;
use ext4_view::{Ext4, Ext4Read};
use std::io::Write;
use std::os::unix::ffi::OsStrExt;
use std::path::Path;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

/// Bytes of the image seen by the filesystem reader: a window of the snapshot's
/// image file starting at a partition's offset.
struct ImageBytes {
    repo: Repository,
    content: Content,
    size: u64,
    offset: u64,
    /// The image's ranges the source could not read at backup time (zeros).
    unreadable: Arc<Vec<(u64, u64)>>,
    /// Set once a read touched one of them: what was read may be zeros in place
    /// of data, and the command must say so.
    touched: Arc<AtomicBool>,
}

impl ImageBytes {
    /// Fills `dst` from `start` bytes into the window.
    fn read_at(&self, start: u64, dst: &mut [u8]) -> std::result::Result<(), String> {
        let r = FileReader::new(&self.repo, &self.content, self.size);
        let at = self
            .offset
            .checked_add(start)
            .ok_or("offset past the image")?;
        let end = at.saturating_add(dst.len() as u64);
        if self
            .unreadable
            .iter()
            .any(|&(o, l)| o < end && o.saturating_add(l) > at)
        {
            self.touched.store(true, Ordering::Relaxed);
        }
        let mut done = 0;
        while done < dst.len() {
            let n = r
                .read_at(at + done as u64, &mut dst[done..])
                .map_err(|e| e.to_string())?;
            if n == 0 {
                return Err("read past the end of the image".into());
            }
            done += n;
        }
        Ok(())
    }
}

/// What `ext4-view` reads: the image's bytes with the journal replayed, when
/// it needs recovery (the image was taken while the filesystem was mounted),
/// and the superblock saying it needs none, so that `ext4-view` does not replay
/// it its own way ([`super::blockmap::Ext2::replay_journal`] says why).
struct ViewBytes {
    bytes: ImageBytes,
    journal: Option<Arc<super::blockmap::Replayed>>,
}

impl Ext4Read for ViewBytes {
    fn read(
        &mut self,
        start: u64,
        dst: &mut [u8],
    ) -> std::result::Result<(), Box<dyn std::error::Error + Send + Sync + 'static>> {
        let read = |at: u64, dst: &mut [u8]| self.bytes.read_at(at, dst);
        match &self.journal {
            Some(j) => Ok(j.read_recovered(&read, start, dst)?),
            None => Ok(read(start, dst)?),
        }
    }
}

/// How `restore --image-fs` treats the target ([`ImageFs::restore`]).
pub struct FsRestoreOptions<'a> {
    /// What is done with an entry the target holds already.
    pub overwrite: crate::ops::restore::Overwrite,
    /// Bytes per second written at most.
    pub write_limit: Option<u64>,
    /// Which extended attributes are set.
    pub xattrs: &'a crate::ops::restore::XattrSelect,
    /// Where each entry's outcome is sent as a `File` event (`restore -v`).
    pub list: Option<&'a crate::progress::Progress>,
    /// Read back each file written, and compare the bytes of one kept.
    pub verify: bool,
    /// Write nothing: count and list what the restore would do.
    pub dry_run: bool,
}

/// What `restore --image-fs` wrote.
#[derive(Clone, Debug, Default, serde::Serialize)]
pub struct FsRestoreReport {
    pub files: u64,
    pub dirs: u64,
    pub symlinks: u64,
    /// FIFOs, and devices when restoring as root, made again.
    pub specials: u64,
    /// Sockets: not restored (made by the program that listens on them).
    pub skipped: u64,
    pub bytes: u64,
    /// Entries already in the target left as they were (`--overwrite`).
    pub kept: u64,
    /// Of those, the ones that are not a directory where the image has one:
    /// nothing below them was restored (one line each, said as a warning).
    pub kept_in_place_of_dirs: Vec<String>,
    /// Names given to a file already restored under another name (hard links).
    pub hardlinks: u64,
    /// Extended attributes set (owners' ACLs and file capabilities among them).
    pub xattrs: u64,
    /// What the image could not give back as it was at backup time (hard links
    /// and extended attributes where cairn's own reader cannot read the
    /// filesystem), one line each: the restore is done in part.
    pub warnings: Vec<String>,
    /// Entries that could not be restored, or not all of their metadata (an
    /// extended attribute refused, a device when not root), with why, one each
    /// (the others were restored).
    pub failed: Vec<FsFailure>,
    /// Worth knowing, nothing missing (hard-linked files with names outside the
    /// path restored, a hard link restored as a copy), one line each.
    pub notes: Vec<String>,
    /// `--verify`: files read back after they were written, and files left in
    /// place (`if-changed`) whose bytes were compared, that match the image.
    /// `None` without `--verify`.
    pub verified: Option<u64>,
    /// `--verify`: files neither read back nor compared: left in place by
    /// `--overwrite never` or `if-newer`, or written with zeros where the image
    /// could not be read.
    pub not_verified: u64,
}

/// An entry `restore --image-fs` could not restore in full: where it was to be
/// restored (as `-v` names it), and the line that says why.
#[derive(Clone, Debug, serde::Serialize)]
pub struct FsFailure {
    pub path: String,
    pub error: String,
}

impl FsRestoreReport {
    fn fail(&mut self, path: &Path, error: String) {
        self.failed.push(FsFailure {
            path: path.to_string_lossy().into_owned(),
            error,
        });
    }
}

/// The ext2/3/4 filesystem of an image snapshot.
pub struct ImageFs {
    fs: Ext4,
    /// Bytes from the start of the image to the filesystem.
    pub offset: u64,
    /// The filesystem's bytes, for what [`super::blockmap`] reads.
    bytes: ImageBytes,
    /// Checked between the pieces of a file and between entries: a file can be a
    /// terabyte of holes, which the reader hands over as zeros.
    cancel: crate::progress::CancelToken,
    /// The snapshot's tree: with `offset` and a path, what a restore restores
    /// (the mark of an unfinished restore lists it).
    tree: String,
    /// The image file's path in a snapshot of files (`--image-file`), or empty.
    file: String,
    /// The snapshot was written by `repair snapshots`: its image's unreadable
    /// ranges may also be blocks the repository lost.
    pub repaired: bool,
    /// The journal as [`super::blockmap`] replays it, once for this image.
    journal: super::blockmap::JournalCache,
    /// The filesystem's bytes as [`super::blockmap`] reads them ([`Self::own`]).
    own_read: Box<super::blockmap::ReadAt<'static>>,
}

fn fs_err(what: &str, e: impl std::fmt::Display) -> Error {
    let text = e.to_string();
    // ext4-view 1.0 refuses any inode time before 1970 or from 2038-01-19 on
    // (it takes the signed seconds field's top bit for damage), so a valid file
    // or directory with such a time (a bad clock, an archive's dates) reads as
    // "corrupt". Say what it most likely is, and the way that works.
    if text.contains("has invalid timestamp") {
        return Error::Invalid(format!(
            "{what}: {text}: most likely a time before 1970 or after January 2038, which \
             the ext4 reader --image-fs uses cannot read; restore the image (`restore \
             --image`) and loop-mount it read-only to reach this file (docs/IMAGES.md)"
        ));
    }
    // ext4-view reads only inodes of more than 128 bytes (the extra fields hold
    // what it needs); `mkfs -I 128` and old ext2/ext3 filesystems have them,
    // valid, and every inode then reads as "truncated" (QA r18: "corrupt").
    if text.contains("is truncated: size=128") {
        return Error::Invalid(format!(
            "{what}: the filesystem has 128-byte inodes (an old ext2/ext3, or made with \
             `mkfs -I 128`), which the ext4 reader --image-fs uses cannot read; restore the \
             image (`restore --image`) and loop-mount it read-only to reach its files \
             (docs/IMAGES.md)"
        ));
    }
    // ext4-view's "file not found", in the words `ls` of a snapshot uses (QA r29).
    if text == "file not found" {
        return Error::Invalid(format!(
            "{what}: no such file or directory in the image's filesystem"
        ));
    }
    Error::Invalid(format!("{what}: {text}"))
}

/// [`fs_err`] for reading a file's content. The ext2/3/4 reader cannot follow a
/// block-mapped (ext2/ext3) file whose hole covers a whole indirect block: it
/// reads the null block pointer as block 0 and calls that corruption. Such files
/// are read by [`super::blockmap`], except where it declines (a filesystem it
/// does not read, an inode whose size or mode `ext4-view` reads otherwise): then
/// this says what it is, with the ways that work.
fn read_err(what: &str, e: impl std::fmt::Display) -> Error {
    let text = e.to_string();
    if text.contains("from block 0 (originally 0)") {
        return Error::Invalid(format!(
            "{what}: a sparse file of an ext2/ext3 filesystem whose hole spans an indirect \
             block, which --image-fs could not read here; restore the image \
             (`restore --image`) or loop-mount it \
             read-only through `cairn mount` (docs/IMAGES.md)"
        ));
    }
    fs_err(what, text)
}

impl ImageFs {
    /// Opens the filesystem of `snap`'s image: at `partition` (1-based) of its
    /// partition table, or at the start of the image, or in the first partition
    /// that holds one.
    ///
    /// `file`: the path of a disk image saved as a file in a snapshot of files
    /// ([`super::image_in`]); `None` for an image snapshot's image.
    pub fn open(
        repo: &Repository,
        snap: &Snapshot,
        file: Option<&str>,
        partition: Option<u32>,
    ) -> Result<ImageFs> {
        let super::ImageIn {
            size,
            content,
            unreadable,
        } = super::image_in(repo, snap, file)?;
        let reader = FileReader::new(repo, &content, size);
        let mut head = vec![0u8; 64 * 1024];
        let n = reader.read_at(0, &mut head)?;
        head.truncate(n);
        let parts = partitions(&reader, &head)?;
        let candidates: Vec<u64> = match partition {
            Some(p) => vec![
                parts
                    .iter()
                    .find(|x| x.0 == p)
                    .map(|x| x.1)
                    .ok_or_else(|| {
                        Error::Invalid(format!(
                            "the image has no partition {p} (it has {})",
                            if parts.is_empty() {
                                "none".to_string()
                            } else {
                                parts
                                    .iter()
                                    .map(|x| x.0.to_string())
                                    .collect::<Vec<_>>()
                                    .join(", ")
                            }
                        ))
                    })?,
            ],
            None => std::iter::once(0)
                .chain(parts.iter().map(|p| p.1))
                .collect(),
        };
        let mut last = None;
        let mut declined = None;
        let unreadable = Arc::new(unreadable);
        for offset in candidates {
            // Each window its own flag: a probe that failed elsewhere says nothing
            // of what this filesystem's reads touch.
            let touched = Arc::new(AtomicBool::new(false));
            let window = || ImageBytes {
                repo: repo.handle(),
                content: content.clone(),
                size,
                offset,
                unreadable: unreadable.clone(),
                touched: touched.clone(),
            };
            let mine = window();
            let own_read: Box<super::blockmap::ReadAt<'static>> = {
                let bytes = window();
                Box::new(move |at: u64, dst: &mut [u8]| bytes.read_at(at, dst))
            };
            // The journal replayed as the kernel replays it, and the replayed
            // filesystem given to `ext4-view`, which then replays nothing: both
            // readers read what a mount would show.
            let journal = super::blockmap::JournalCache::new();
            let replayed = {
                let opened = super::blockmap::Ext2::open_cached(&*own_read, &journal);
                let refused = |e: &str| {
                    Error::Invalid(format!(
                        "the ext2/3/4 filesystem at byte {offset} of the image was taken \
                         while mounted, and its journal cannot be replayed here ({e}); \
                         restore the image (`restore --image`), then mount it, which \
                         replays the journal, or repair it with `e2fsck` where the \
                         kernel refuses to"
                    ))
                };
                match (opened, journal.get()) {
                    (Ok(Some(fs)), _) => Some(fs.replayed()),
                    (_, Some(Err(e))) => return Err(refused(e)),
                    // Refused before its journal was looked at: `ext4-view`
                    // would replay it its own way (review r27).
                    (Err(e), None) if needs_recovery(&mine) => return Err(refused(&e)),
                    _ => None,
                }
            };
            let view = ViewBytes {
                bytes: window(),
                journal: replayed,
            };
            match Ext4::load(Box::new(view)) {
                Ok(fs) => {
                    return Ok(ImageFs {
                        fs,
                        offset,
                        bytes: mine,
                        cancel: crate::progress::CancelToken::new(),
                        tree: snap.tree.clone(),
                        file: file.unwrap_or_default().to_string(),
                        repaired: crate::repo::is_repaired(snap),
                        journal,
                        own_read,
                    });
                }
                Err(e) => {
                    // An ext2/3/4 superblock is there: the filesystem was found,
                    // and the reader declines it (a feature it does not read,
                    // damage). Say that, not "not found".
                    // (Said if no later partition can be read instead.)
                    let mut magic = [0u8; 2];
                    if declined.is_none()
                        && mine.read_at(1024 + 56, &mut magic).is_ok()
                        && magic == [0x53, 0xEF]
                    {
                        declined = Some(format!(
                            "the ext2/3/4 filesystem at byte {offset} of the image cannot be \
                             read in place ({e}); restore the image (`restore --image`) or \
                             loop-mount it read-only through `cairn mount` (docs/IMAGES.md)"
                        ));
                    }
                    last = Some(e)
                }
            }
        }
        if let Some(m) = declined {
            return Err(Error::Invalid(m));
        }
        Err(Error::Invalid(format!(
            "no ext2/3/4 filesystem found {} ({}); for other filesystems, `cairn mount` the repository and mount the image file with `mount -o ro,loop`",
            match partition {
                Some(p) => format!("in partition {p} of the image"),
                None if parts.is_empty() => "in the image".to_string(),
                None => format!("in the image or its {} partitions", parts.len()),
            },
            last.map_or_else(|| "nothing to read".to_string(), |e| e.to_string())
        )))
    }

    /// The ranges of the image that could not be read at backup time, if anything
    /// read so far lay in one (then it may hold zeros where data was).
    pub fn read_unreadable(&self) -> Option<&[(u64, u64)]> {
        self.bytes
            .touched
            .load(Ordering::Relaxed)
            .then_some(self.bytes.unreadable.as_slice())
    }

    /// Runs `read`, and says whether what it read lay in a range of the image
    /// that could not be read at backup (and holds zeros there). Reads are made
    /// one at a time (a restore's walk), so the flag says what `read` touched.
    fn noting_zeros<T>(&self, read: impl FnOnce() -> T) -> (T, bool) {
        let before = self.bytes.touched.swap(false, Ordering::Relaxed);
        let out = read();
        let touched = self.bytes.touched.load(Ordering::Relaxed);
        self.bytes
            .touched
            .store(before || touched, Ordering::Relaxed);
        (out, touched)
    }

    /// Stops listings, dumps and restores at their next piece once `cancel` is
    /// (`Error::Cancelled`).
    pub fn with_cancel(mut self, cancel: crate::progress::CancelToken) -> ImageFs {
        self.cancel = cancel;
        self
    }

    fn check_cancelled(&self) -> Result<()> {
        if self.cancel.is_cancelled() {
            return Err(Error::Cancelled);
        }
        Ok(())
    }

    /// cairn's own reader of this filesystem ([`super::blockmap::Ext2`]), its
    /// journal replayed once per image; `None` where it does not read it.
    fn own(&self) -> std::result::Result<Option<super::blockmap::Ext2<'_>>, String> {
        super::blockmap::Ext2::open_cached(&*self.own_read, &self.journal)
    }

    /// An error when a directory on the way to `path` (or `path`) has an extent
    /// tree `ext4-view` must not be given ([`super::blockmap::Ext2::crafted_tree`]);
    /// nothing is said where this crate's reader cannot read the filesystem.
    fn crafted_on_the_way(&self, path: &str) -> Result<()> {
        match self.own() {
            Ok(Some(fs)) => fs
                .crafted_on_the_way(&raw(path))
                .map_err(|e| fs_err(path, e)),
            _ => Ok(()),
        }
    }

    /// The reader's path for `p`, a path as listings write it: a name's bytes
    /// that are not UTF-8 are stand-ins there ([`escape_name`]), and the reader
    /// is given the bytes themselves.
    fn path(p: &str) -> Result<ext4_view::PathBuf> {
        ext4_view::PathBuf::try_from(raw(p)).map_err(|e| fs_err(p, e))
    }

    /// `path` (normalised) with every symlink on the way resolved here, the last
    /// component's too when `follow_last`: the reader's own resolution reads a
    /// link's target into a buffer of the length its inode claims, so a damaged
    /// symlink inode (a size of hundreds of GB) would end the process. What is
    /// handed to the reader after this holds no symlink it would follow.
    fn resolve(&self, path: &str, follow_last: bool) -> Result<String> {
        let wanted = normalise(path);
        // `name/` names a directory, through a symlink too (as POSIX has it): a
        // file so named is an error, not the file (QA: `dump /etc/fstab/` dumped).
        let dir_named = path.ends_with('/');
        let follow_last = follow_last || dir_named;
        // Walked as given, not as normalised: `link/..` is the parent of where
        // the link leads, as the kernel has it (QA: `/link/../f` was read as
        // `/f`, another file than a loop mount gives).
        // Each name with whether it is exact: one given on the command line may
        // be read two ways ([`Self::reading`]), one from a symlink's target is
        // the image's own bytes.
        let mut pending: std::collections::VecDeque<(String, bool)> = path
            .split('/')
            .filter(|c| !c.is_empty())
            .map(|c| (c.to_string(), false))
            .collect();
        let mut done: Vec<String> = Vec::new();
        let mut hops = 0;
        // The last symlink followed, for messages.
        let mut via = String::new();
        while let Some((c, exact)) = pending.pop_front() {
            match c.as_str() {
                "" | "." => continue,
                ".." => {
                    done.pop();
                    continue;
                }
                _ => {}
            }
            let c = if exact {
                c
            } else {
                self.reading(&done, &c, &wanted)?
            };
            let at = format!(
                "/{}",
                done.iter()
                    .chain([&c])
                    .cloned()
                    .collect::<Vec<_>>()
                    .join("/")
            );
            self.crafted_on_the_way(&at)?;
            let meta = self
                .fs
                .symlink_metadata(Self::path(&at)?.as_path())
                .map_err(|e| {
                    // Past a symlink, what is missing is where it leads (QA: a
                    // dangling symlink was said not to exist).
                    if hops > 0 && matches!(e, ext4_view::Ext4Error::NotFound) {
                        Error::Invalid(format!(
                            "{wanted}: the symlink {via} leads to {at}, which the image's \
                         filesystem does not hold"
                        ))
                    } else {
                        fs_err(&wanted, e)
                    }
                })?;
            if !meta.file_type().is_symlink() || (pending.is_empty() && !follow_last) {
                done.push(c);
                continue;
            }
            hops += 1;
            if hops > 40 {
                return Err(Error::Invalid(format!(
                    "{wanted}: more than 40 symlinks on the way (a loop?)"
                )));
            }
            let target = self.read_link(&at, &meta)?;
            via.clone_from(&at);
            if target.starts_with(b"/") {
                done.clear();
            }
            for t in target.split(|b| *b == b'/').rev() {
                pending.push_front((escape_name(t), true));
            }
        }
        let resolved = format!("/{}", done.join("/"));
        if dir_named && resolved != "/" {
            let m = self
                .fs
                .metadata(Self::path(&resolved)?.as_path())
                .map_err(|e| fs_err(&wanted, e))?;
            if !m.file_type().is_dir() {
                return Err(Error::Invalid(format!(
                    "{path}: not a directory (the trailing / names one)"
                )));
            }
        }
        Ok(resolved)
    }

    /// The name `c` of a path given on the command line (in the form listings
    /// write: stand-ins for bytes that are not UTF-8) as the entry of the
    /// directory `dir` (resolved names) it names, written so that [`raw`] gives
    /// its exact bytes. A stand-in character may also be in a name itself (a
    /// valid UTF-8 character): both readings are looked up, and a path that finds
    /// an entry each way is refused as ambiguous, as for a snapshot of files. A
    /// reading whose bytes cannot be one name (`.`, `..`, a `/` or NUL in it) is
    /// never taken: the path cannot leave the directory it names (review: a
    /// stand-in `..` took a restore into its target's parent).
    fn reading(&self, dir: &[String], c: &str, wanted: &str) -> Result<String> {
        let Some(decoded) = unescape_name(c) else {
            return Ok(c.to_string());
        };
        let one_name = |b: &[u8]| {
            !b.is_empty() && b != b"." && b != b".." && !b.contains(&b'/') && !b.contains(&0)
        };
        let exists = |name: &[u8]| -> Result<bool> {
            let mut at = Vec::new();
            for d in dir {
                at.push(b'/');
                at.extend_from_slice(&raw(d));
            }
            at.push(b'/');
            at.extend_from_slice(name);
            let Ok(p) = ext4_view::Path::try_from(at.as_slice()) else {
                return Ok(false);
            };
            // Only "not there" is absence: an entry the reader refuses (a time
            // before 1970) is there, and taking it for absent would pick the
            // other reading where the path is ambiguous (review).
            match self.fs.symlink_metadata(p) {
                Ok(_) => Ok(true),
                Err(ext4_view::Ext4Error::NotFound) => Ok(false),
                Err(e) => Err(fs_err(&crate::ops::ls::shown(wanted), e)),
            }
        };
        let decoded_ok = one_name(&decoded) && exists(&decoded)?;
        let written_ok = exists(c.as_bytes())?;
        match (decoded_ok, written_ok) {
            (true, true) => Err(Error::AmbiguousPath(format!(
                "{}: two names in the image's filesystem match it (one holds the bytes its \
                 characters U+10FF00-U+10FFFF stand for, one those characters themselves): \
                 list, dump or restore their directory",
                crate::ops::ls::shown(wanted)
            ))),
            (false, true) => Ok(escape_name(c.as_bytes())),
            (_, false) if !one_name(&decoded) => Err(Error::Invalid(format!(
                "{}: a name in it stands for bytes that cannot be a file name (`.`, `..`, \
                 or a `/` or NUL in it)",
                crate::ops::ls::shown(wanted)
            ))),
            // Found, or found neither way: what is missing is said as for any
            // name.
            _ => Ok(escape_name(&decoded)),
        }
    }

    /// A symlink's target, refused when its inode claims more than a target can
    /// hold (`PATH_MAX`): the reader would allocate what the inode says.
    fn read_link(&self, path: &str, meta: &ext4_view::Metadata) -> Result<Vec<u8>> {
        const MAX_TARGET: u64 = 4095;
        if meta.len() > MAX_TARGET {
            return Err(Error::Invalid(format!(
                "{path}: a symlink whose inode claims a target of {} bytes (at most {MAX_TARGET}): \
                 the image's filesystem is damaged here",
                meta.len()
            )));
        }
        match self.fs.read_link(Self::path(path)?.as_path()) {
            Ok(t) => Ok(t.as_ref().to_vec()),
            // The reader takes a target for a path, whose names are at most 255
            // bytes; the kernel stores any bytes (a link it cannot follow).
            Err(e) if e.to_string().contains("invalid symlink path") => {
                // Kept in blocks: read as a file's content by this crate's
                // reader, which takes any bytes.
                self.own_link_target(path).ok_or_else(|| {
                    Error::Invalid(format!(
                        "{path}: a symlink whose target --image-fs cannot read (a name in it \
                         longer than 255 bytes, which no path can follow, or damage); restore \
                         the image (`restore --image`) or loop-mount it read-only through \
                         `cairn mount` to get it"
                    ))
                })
            }
            Err(e) => Err(fs_err(path, e)),
        }
    }

    /// The target of the symlink at `path` as this crate's reader reads it
    /// ([`super::blockmap::Ext2::link_target`]), if it can; its length must be
    /// the one `ext4-view` reads.
    fn own_link_target(&self, path: &str) -> Option<Vec<u8>> {
        let fs = self.own().ok()??;
        let (_, ino) = fs.lookup(&raw(path)).ok()??;
        let len = self
            .fs
            .symlink_metadata(Self::path(path).ok()?.as_path())
            .ok()?
            .len();
        fs.link_target(&ino)
            .ok()?
            .filter(|t| t.len() as u64 == len && !t.is_empty() && !t.contains(&0))
    }

    /// Lists `path` and, for a directory, what is in it (everything below it with
    /// `recursive`), in name order, as `ls` lists a file snapshot. Each entry or
    /// directory below `path` that cannot be read goes to `failed` as it is met
    /// (every one named, QA: only the first was), and the listing goes on; an
    /// error of `f` (the output's) ends it.
    pub fn list(
        &self,
        path: &str,
        recursive: bool,
        f: &mut dyn FnMut(Entry) -> Result<()>,
        failed: &mut dyn FnMut(&str, Error),
    ) -> Result<()> {
        let path = self.resolve(path, false)?;
        let meta = self
            .fs
            .symlink_metadata(Self::path(&path)?.as_path())
            .map_err(|e| fs_err(&path, e))?;
        f(self.entry(&path, &meta)?)?;
        if meta.is_dir() {
            // Directories' inode numbers, from this crate's reader where it reads
            // the filesystem: a loop in a corrupt one is then seen at once.
            let ext2 = self.own().ok().flatten();
            let top = (ext2.as_ref())
                .and_then(|fs| fs.lookup(&raw(&path)).ok().flatten())
                .map(|(n, _)| n);
            let mut walk = ListWalk {
                ext2: ext2.as_ref(),
                guard: DirGuard::new(self.inodes_count()),
                recursive,
                failed,
            };
            walk.guard.enter(&path, top)?;
            self.list_below(&path, top, &mut walk, f)?;
        }
        Ok(())
    }

    /// Lists what is below `dir` (image inode `ino`, if known); entries and
    /// directories that cannot be read go to `walk.failed`, and the listing goes
    /// on with the rest (an error of `f`, the output's, ends it).
    fn list_below(
        &self,
        dir: &str,
        ino: Option<u32>,
        walk: &mut ListWalk<'_, '_>,
        f: &mut dyn FnMut(Entry) -> Result<()>,
    ) -> Result<()> {
        let own = match (walk.ext2, ino) {
            (Some(fs), Some(n)) => fs.inode(n).ok().map(|i| (fs, i)),
            _ => None,
        };
        let children = match self.children(dir, own.as_ref().map(|(fs, i)| (*fs, i))) {
            Ok(c) => c,
            Err(e) => {
                (walk.failed)(dir, e);
                return Ok(());
            }
        };
        let mut inos: std::collections::HashMap<Vec<u8>, u32> = match (walk.ext2, ino) {
            (Some(fs), Some(n)) if walk.recursive => fs
                .inode(n)
                .and_then(|d| fs.entries(&d))
                .map(|e| e.into_iter().collect())
                .unwrap_or_default(),
            _ => Default::default(),
        };
        // A name held twice: which inode `ext4-view` reads below it is not
        // known (review: its index may name the other entry), so what is below
        // it is not listed.
        let repeated = repeated_names(&children, &mut inos);
        for c in children {
            self.check_cancelled()?;
            let meta = match c.meta.and_then(|m| Ok((self.entry(&c.path, &m)?, m))) {
                Ok((mut entry, m)) => {
                    // A device's number, from this crate's inode reader
                    // (`ext4-view` does not show it), as `ls -l` of a snapshot
                    // of files shows it (QA r37: none).
                    if matches!(entry.kind, "chardev" | "blockdev")
                        && let (Some(fs), Some(n)) = (walk.ext2, inos.get(&c.raw))
                        && let Ok(i) = fs.inode(*n)
                    {
                        let rdev = i.rdev() as libc::dev_t;
                        entry.device = Some([libc::major(rdev) as u64, libc::minor(rdev) as u64]);
                    }
                    f(entry)?;
                    m
                }
                Err(e) => {
                    (walk.failed)(&c.path, e);
                    continue;
                }
            };
            if walk.recursive && meta.is_dir() && repeated.contains(&c.raw) {
                (walk.failed)(
                    &c.path,
                    Error::Invalid(format!(
                        "{}: corrupt filesystem: the directory holds this name more than once; \
                         what is below it is not listed",
                        c.path
                    )),
                );
            } else if walk.recursive && meta.is_dir() {
                let child = inos.get(&c.raw).copied();
                match walk.guard.enter(&c.path, child) {
                    Ok(()) => self.list_below(&c.path, child, walk, f)?,
                    Err(e) => (walk.failed)(&c.path, e),
                }
            }
        }
        Ok(())
    }

    /// The number of inodes the filesystem's superblock gives, if it can be read.
    fn inodes_count(&self) -> Option<u32> {
        let mut b = [0u8; 4];
        self.bytes.read_at(1024, &mut b).ok()?;
        Some(u32::from_le_bytes(b)).filter(|&n| n > 0)
    }

    /// A listing entry, in the shape of a file snapshot's (`ls --json`, `ls -l`).
    /// ext2/3/4 keeps no user or group names, only numbers.
    fn entry(&self, path: &str, m: &ext4_view::Metadata) -> Result<Entry> {
        let ft = m.file_type();
        let kind = if ft.is_dir() {
            "dir"
        } else if ft.is_regular_file() {
            "file"
        } else if ft.is_symlink() {
            "symlink"
        } else if ft.is_char_dev() {
            "chardev"
        } else if ft.is_block_dev() {
            "blockdev"
        } else if ft.is_fifo() {
            "fifo"
        } else {
            "socket"
        };
        let link_target = if ft.is_symlink() {
            let t = self.read_link(path, m)?;
            Some(escape_name(&t))
        } else {
            None
        };
        let t = m.modified();
        Ok(Entry {
            path: path.to_string(),
            kind,
            mode: u32::from(m.mode()) & 0o7777,
            uid: m.uid(),
            gid: m.gid(),
            user: String::new(),
            group: String::new(),
            size: m.len(),
            mtime: crate::time::format_unix(t.seconds(), t.nanoseconds()),
            link_target,
            device: None,
            flags: String::new(),
        })
    }

    /// Writes a regular file's content to `out`; its size. A symlink named last
    /// is refused with where it leads, as `dump` of a snapshot of files refuses
    /// one (QA r18: the image's was followed, the files' was not); one on the way
    /// is followed, as there.
    pub fn dump(&self, path: &str, out: &mut dyn Write) -> Result<u64> {
        let at = self.resolve(path, false)?;
        let meta = self
            .fs
            .symlink_metadata(Self::path(&at)?.as_path())
            .map_err(|e| fs_err(&at, e))?;
        if meta.file_type().is_symlink() {
            let target = escape_name(&self.read_link(&at, &meta)?);
            return Err(Error::Invalid(format!(
                "{} is a symlink to {}, not a file: dump where it leads",
                crate::ops::ls::shown(path),
                crate::ops::ls::shown(&target)
            )));
        }
        let mut counted = crate::ops::dump::Counted { out, bytes: 0 };
        match self.dump_to(&at, None, &mut counted, Path::new(crate::ops::dump::OUTPUT)) {
            // Whoever reads the stream must hear where it was cut short (as
            // `dump` of a snapshot's file says it; QA r40).
            // Not a failure to write it (a reader gone, `| head`: as `dump`
            // of a snapshot's file leaves those).
            Err(e)
                if meta.file_type().is_regular_file()
                    && !matches!(&e, Error::Cancelled)
                    && !matches!(&e, Error::Io { path, .. }
                        if path.as_path() == Path::new(crate::ops::dump::OUTPUT)) =>
            {
                Err(Error::Incomplete(format!(
                    "{e}; the output was cut short after the first {} of its {} bytes",
                    counted.bytes,
                    meta.len()
                )))
            }
            r => r,
        }
    }

    /// The content of the file at `path`, already resolved (no symlink in it: a
    /// restore's walk gives one, `dump` resolves the user's), to `out`, named
    /// `out_name` in errors writing it. `own`: the file's inode as this crate's
    /// reader found it (a restore's walk), else it is looked up.
    fn dump_to(
        &self,
        path: &str,
        own: Option<(&super::blockmap::Ext2<'_>, &super::blockmap::Inode)>,
        out: &mut dyn Write,
        out_name: &Path,
    ) -> Result<u64> {
        let copied = match own {
            Some((fs, ino)) if fs.reads(ino) => Some(self.copy_own(fs, ino, path, out, out_name)?),
            Some(_) => None,
            None => self.dump_own(path, out, out_name)?,
        };
        if let Some(n) = copied {
            return Ok(n);
        }
        match own {
            Some((fs, ino)) => fs.crafted_tree(ino).map_err(|e| fs_err(path, e))?,
            None => self.crafted_on_the_way(path)?,
        }
        let mut file = self
            .fs
            .open(Self::path(path)?.as_path())
            .map_err(|e| read_err(path, e))?;
        let mut buf = vec![0u8; 1 << 20];
        let mut total = 0u64;
        loop {
            self.check_cancelled()?;
            let n = match file.read_bytes(&mut buf) {
                Ok(n) => n,
                Err(e) => {
                    // What reads before the damage goes out first, 4 KiB at a
                    // time from where the failed read began (review r42: up to
                    // 1 MiB was held back).
                    if file.seek_to(total).is_err() {
                        return Err(read_err(path, e));
                    }
                    let mut small = [0u8; 4096];
                    loop {
                        match file.read_bytes(&mut small) {
                            Err(_) => return Err(read_err(path, e)),
                            // Read to its end this time.
                            Ok(0) => return Ok(total),
                            Ok(k) => {
                                out.write_all(&small[..k])
                                    .map_err(|e| Error::io(out_name, e))?;
                                total += k as u64;
                            }
                        }
                    }
                }
            };
            if n == 0 {
                return Ok(total);
            }
            out.write_all(&buf[..n])
                .map_err(|e| Error::io(out_name, e))?;
            total += n as u64;
        }
    }

    /// A regular file read by [`super::blockmap`] (as [`super::blockmap::Ext2::reads`]
    /// says why), found by its path; `None` for every other file (and whenever
    /// that reader cannot tell: `ext4-view` then reads it, or says why not).
    fn dump_own(&self, path: &str, out: &mut dyn Write, out_name: &Path) -> Result<Option<u64>> {
        let len = match self.fs.metadata(Self::path(path)?.as_path()) {
            Ok(m) if m.file_type().is_regular_file() => m.len(),
            _ => return Ok(None),
        };
        let Ok(canon) = self.fs.canonicalize(Self::path(path)?.as_path()) else {
            return Ok(None);
        };
        let Ok(Some(fs)) = self.own() else {
            return Ok(None);
        };
        let Ok(Some((_, ino))) = fs.lookup(canon.as_ref()) else {
            return Ok(None);
        };
        if ino.size != len || !fs.reads(&ino) {
            return Ok(None);
        }
        self.copy_own(&fs, &ino, path, out, out_name).map(Some)
    }

    /// [`super::blockmap::Ext2::copy`] of the file at `path` to `out`.
    fn copy_own(
        &self,
        fs: &super::blockmap::Ext2<'_>,
        ino: &super::blockmap::Inode,
        path: &str,
        out: &mut dyn Write,
        out_name: &Path,
    ) -> Result<u64> {
        use super::blockmap::CopyError;
        match fs.copy(ino, out, &|| self.cancel.is_cancelled()) {
            Ok(n) => Ok(n),
            Err(CopyError::Fs(m)) => Err(fs_err(path, m)),
            Err(CopyError::Out(e)) => Err(Error::io(out_name, e)),
            Err(CopyError::Stopped) => Err(Error::Cancelled),
        }
    }

    /// Copies `path` (a file, a symlink or a whole directory tree) into the
    /// directory `target`, under its own name, with modes, times and (as root)
    /// owners; runs of zeros in files become holes. Names come from the image:
    /// each is a single component (the reader refuses `/` and NUL in names), and
    /// `.` and `..` are skipped. Everything below `target` is created and changed
    /// through descriptors of its directory, never a path, and never through a
    /// symlink (as `restore` does): someone who can write the target cannot lead
    /// a restore running as root elsewhere. An existing entry is treated as
    /// `overwrite` says (as a restore of a file snapshot does; `if-changed`
    /// compares size and modification time), and an existing directory is
    /// restored into. See [`FsRestoreOptions`] for the rest.
    pub fn restore(
        &self,
        path: &str,
        target: &Path,
        opts: &FsRestoreOptions<'_>,
    ) -> Result<FsRestoreReport> {
        use std::os::unix::fs::OpenOptionsExt;
        if opts.dry_run {
            return self.plan_restore(path, target, opts);
        }
        let limit = opts
            .write_limit
            .filter(|&r| r > 0)
            .map(cairn_backend::Limiter::new);
        let path = self.resolve(path, false)?;
        crate::ops::restore::refuse_target_in_repository(&self.bytes.repo, target)?;
        std::fs::create_dir_all(target).map_err(|e| Error::io(target, e))?;
        // The target itself: a directory, not reached through a final symlink.
        let root = std::fs::OpenOptions::new()
            .read(true)
            .custom_flags(libc::O_DIRECTORY | libc::O_NOFOLLOW)
            .open(target)
            .map_err(|e| Error::io(target, e))?;
        // As a restore of files: what a restore here that did not finish left is
        // not kept for its time, even with `never` or `if-newer`.
        use std::os::fd::AsFd as _;
        crate::ops::restore::target::hold_target(root.as_fd(), target)?;
        let unfinished_since = crate::ops::restore::unfinished::since(root.as_fd());
        let selection = crate::ops::restore::unfinished::selection(
            self.tree.as_bytes(),
            &[if self.file.is_empty() {
                format!("image-fs {} {path}", self.offset)
            } else {
                format!("image-fs {:?} {} {path}", self.file, self.offset)
            }],
            &[],
            &[],
            &[],
        );
        let not_marked = crate::ops::restore::unfinished::mark(root.as_fd(), &selection)
            .err()
            .map(|e| crate::ops::restore::unfinished::not_left(target, &e));
        let notes = (unfinished_since.iter())
            .map(|&t| crate::ops::restore::unfinished::notice(target, t))
            .chain(not_marked)
            .collect();
        let (name, ext2, why_not, top) = self.restore_start(&path)?;
        let mut r = FsRestore::new(opts, ext2.as_ref(), why_not, self.inodes_count());
        r.limit = limit.as_ref();
        r.unfinished_since = unfinished_since;
        r.report.notes = notes;
        if ext2.is_none() {
            r.report.warnings.push(format!(
                "hard links and extended attributes were not restored: {}",
                r.why_not
            ));
        }
        let root = std::rc::Rc::new(std::os::fd::OwnedFd::from(root));
        self.restore_one(
            &path,
            &root,
            &raw(&name),
            &target.join(std::ffi::OsStr::from_bytes(&raw(&name))),
            top,
            None,
            &mut r,
        )
        .map_err(|e| match e {
            Error::Io { path: at, source } if source.kind() == std::io::ErrorKind::StorageFull => {
                // As a restore of files says it.
                crate::ops::restore::target_full(target, &at, "")
            }
            e => e,
        })?;
        // Once no file is left cut short, this restore's part is finished: the
        // mark goes unless it lists another part (one of a part says nothing of
        // the rest). Each path is restored under its own name in the target
        // (`/` as `root/`), so no path covers another's (QA: `--image-fs /`
        // took away the mark of a killed `--image-fs /d2`); only a mark that
        // lists nothing goes with a restore of the whole filesystem.
        if r.unfinished == 0 {
            crate::ops::restore::unfinished::finished(root.as_fd(), &selection, false, path == "/")
                .map_err(|e| Error::io(target, e))?;
        }
        // A file leaves `links` once its last name is made.
        if !r.links.is_empty() && path != "/" {
            r.report.notes.push(outside_names(r.links.len(), &path));
        }
        Ok(r.report)
    }

    /// What a restore of `path` (resolved) starts from: the name it is restored
    /// under (`root` for `/`), this crate's own inode reader, or why there is
    /// none, and the inode number of the entry itself.
    #[allow(clippy::type_complexity)]
    fn restore_start(
        &self,
        path: &str,
    ) -> Result<(
        String,
        Option<super::blockmap::Ext2<'_>>,
        String,
        Option<u32>,
    )> {
        let name = path
            .rsplit('/')
            .next()
            .filter(|n| !n.is_empty() && *n != "." && *n != "..")
            .unwrap_or("root")
            .to_string();
        // Hard links and extended attributes come from this crate's own inode
        // reader (`ext4-view` shows neither); without it, files come back
        // without them, and the report says so.
        let (ext2, why_not) = match self.own() {
            Ok(Some(fs)) => (Some(fs), String::new()),
            Ok(None) => (
                None,
                "cairn's reader does not read this filesystem".to_string(),
            ),
            // `ext4-view` reads it: the files still come back, without these.
            Err(e) => (None, e),
        };
        // The named entry itself, not what a final symlink points to: `path` has
        // no symlink on the way ([`Self::resolve`]).
        let top = match &ext2 {
            Some(fs) => fs.lookup(&raw(path)).map_err(|e| fs_err(path, e))?,
            None => None,
        };
        Ok((name, ext2, why_not, top.map(|(n, _)| n)))
    }

    /// `restore --dry-run`: what [`Self::restore`] would do with `path` and the
    /// target as it is, counted and listed (`-v`) as the restore counts and
    /// lists it, with the same decisions for what the target holds. Nothing is
    /// created, changed or locked: the target and its directories are only
    /// opened to be read, and a directory the restore would make is walked as
    /// empty.
    fn plan_restore(
        &self,
        path: &str,
        target: &Path,
        opts: &FsRestoreOptions<'_>,
    ) -> Result<FsRestoreReport> {
        use std::os::fd::AsFd as _;
        use std::os::unix::fs::OpenOptionsExt;
        let path = self.resolve(path, false)?;
        crate::ops::restore::refuse_target_in_repository(&self.bytes.repo, target)?;
        // The target itself, if there: a directory, not reached through a
        // final symlink (as the restore refuses it).
        let root = match std::fs::OpenOptions::new()
            .read(true)
            .custom_flags(libc::O_DIRECTORY | libc::O_NOFOLLOW)
            .open(target)
        {
            Ok(f) => Some(std::os::fd::OwnedFd::from(f)),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => None,
            Err(e) => return Err(Error::io(target, e)),
        };
        // What the restore would fail on at once, the dry run says too, as a
        // dry run of files does (QA r43): the target, or where it would be
        // made, must be writable.
        use crate::ops::restore::survey;
        let place = survey::where_it_would_be_made(target);
        survey::writable(&place).map_err(|e| Error::io(target, e))?;
        let unfinished_since = root
            .as_ref()
            .and_then(|r| crate::ops::restore::unfinished::since(r.as_fd()));
        let notes = (unfinished_since.iter())
            .map(|&t| crate::ops::restore::unfinished::notice(target, t))
            .collect();
        let (name, ext2, why_not, top) = self.restore_start(&path)?;
        // With `--verify` the restore keeps a file only when its bytes match:
        // so does the dry run, which compares them too (review r42: it said it
        // would leave a file the restore rewrites).
        let mut r = FsRestore::new(opts, ext2.as_ref(), why_not, self.inodes_count());
        r.unfinished_since = unfinished_since;
        r.report.notes = notes;
        if ext2.is_none() {
            r.report.warnings.push(format!(
                "hard links and extended attributes would not be restored: {}",
                r.why_not
            ));
        }
        self.plan_one(
            &path,
            root.as_ref().map(|f| f.as_fd()),
            &raw(&name),
            &target.join(std::ffi::OsStr::from_bytes(&raw(&name))),
            top,
            None,
            &mut r,
        )?;
        // Nothing was written to read back (what is kept unread is counted).
        r.report.verified = None;
        if !r.planned.is_empty() && path != "/" {
            r.report.notes.push(outside_names(r.planned.len(), &path));
        }
        if let Some(free) = survey::free_bytes(&place)
            && r.report.bytes > free
        {
            r.report.notes.push(format!(
                "the file system of {} has {} free, and this restore would write {}: it \
                 stops when the disk is full (files with holes take less)",
                target.display(),
                crate::units::bytes(free, 1),
                crate::units::bytes(r.report.bytes, 1)
            ));
        }
        Ok(r.report)
    }

    /// [`Self::restore_one`] for `--dry-run`: the entry `name` of `dir` (none:
    /// a directory the restore would make, empty) is looked at, never written.
    #[allow(clippy::too_many_arguments)]
    fn plan_one(
        &self,
        path: &str,
        dir: Option<std::os::fd::BorrowedFd<'_>>,
        name: &[u8],
        shown: &Path,
        ino: Option<u32>,
        known: Option<ext4_view::Metadata>,
        r: &mut FsRestore<'_>,
    ) -> Result<()> {
        use crate::ops::restore::{Overwrite, sys, target};
        use std::os::fd::AsFd;
        let io = |e: std::io::Error| Error::io(shown, e);
        let inode = match (r.ext2, ino) {
            (Some(fs), Some(n)) => Some(fs.inode(n).map_err(|e| fs_err(path, e))?),
            _ => None,
        };
        let meta = match known {
            Some(m) => m,
            None => self
                .fs
                .symlink_metadata(Self::path(path)?.as_path())
                .map_err(|e| fs_err(path, e))?,
        };
        let ft = meta.file_type();
        let m = meta.modified();
        let cname = target::c_name(name).map_err(io)?;
        let existing = match dir {
            None => None,
            Some(d) => match sys::stat_at(d, &cname) {
                Ok(st) => Some(st),
                Err(e) if e.raw_os_error() == Some(libc::ENOENT) => None,
                Err(e) => return Err(io(e)),
            },
        };
        if ft.is_dir() {
            r.guard.enter(path, ino)?;
            let sub = match (&existing, dir) {
                (Some(st), Some(d)) if st.kind() == libc::S_IFDIR => {
                    let never = r.overwrite_for(st) == Overwrite::Never;
                    if never || r.dir_as_image(st, &meta) {
                        r.report.kept += 1;
                        r.listed(crate::progress::FileAction::Unchanged, shown, 0);
                    } else {
                        r.report.dirs += 1;
                        r.made(true, shown, 0);
                    }
                    // Its metadata is set again unless `never` keeps it.
                    if let (Some(fs), Some(i), false) = (r.ext2, &inode, never) {
                        r.plan_xattrs(fs, i, shown);
                    }
                    Some(
                        sys::open_at(
                            d,
                            &cname,
                            libc::O_RDONLY | libc::O_DIRECTORY | libc::O_NOFOLLOW,
                            0,
                        )
                        .map_err(io)?,
                    )
                }
                (Some(st), _) if r.keeps_in_place_of_dir(st, m) => {
                    r.report.kept += 1;
                    r.listed(crate::progress::FileAction::Unchanged, shown, 0);
                    r.report.kept_in_place_of_dirs.push(format!(
                        "{}: would be kept as it is (--overwrite): it is not a directory, \
                         where the image has one, so nothing below it would be restored",
                        shown.display()
                    ));
                    return Ok(());
                }
                (e, _) => {
                    r.report.dirs += 1;
                    r.made(e.is_some(), shown, 0);
                    if let (Some(fs), Some(i)) = (r.ext2, &inode) {
                        r.plan_xattrs(fs, i, shown);
                    }
                    None
                }
            };
            for (c, ino) in self.to_restore(path, inode.as_ref(), shown, r, true)? {
                self.check_cancelled()?;
                let child_shown = shown.join(std::ffi::OsStr::from_bytes(&c.raw));
                let done = c.meta.and_then(|m| {
                    let dir = sub.as_ref().map(|f| f.as_fd());
                    self.plan_one(&c.path, dir, &c.raw, &child_shown, ino, Some(m), r)
                });
                match done {
                    Err(Error::Cancelled) => return Err(Error::Cancelled),
                    Err(e) => r.report.fail(&child_shown, e.to_string()),
                    Ok(()) => {}
                }
            }
            return Ok(());
        }
        let device = ft.is_char_dev() || ft.is_block_dev();
        if device && !r.as_root {
            return Err(Error::Invalid(format!(
                "{}: a device file is made only by root: it would not be restored",
                shown.display()
            )));
        }
        if device && inode.is_none() {
            return Err(Error::Invalid(format!(
                "{}: a device whose number cannot be read: it would not be restored",
                shown.display()
            )));
        }
        if !(ft.is_regular_file() || ft.is_symlink() || ft.is_fifo() || device) {
            r.report.skipped += 1;
            return Ok(());
        }
        let kind = if ft.is_fifo() {
            libc::S_IFIFO
        } else if ft.is_char_dev() {
            libc::S_IFCHR
        } else if ft.is_block_dev() {
            libc::S_IFBLK
        } else if ft.is_symlink() {
            libc::S_IFLNK
        } else {
            libc::S_IFREG
        };
        let linked = match (ino, &inode) {
            (Some(n), Some(i)) if kind == libc::S_IFREG && i.links > 1 => Some(n),
            _ => None,
        };
        // Another name of a file whose first name was met: a link to it.
        if let Some(n) = linked
            && let Some((first, _)) = r.planned.get(&n).copied()
        {
            // As `restore_link`: this name is done with.
            if let Some((_, left)) = r.planned.get_mut(&n) {
                *left = left.saturating_sub(1);
                if *left == 0 {
                    r.planned.remove(&n);
                }
            }
            let keep = existing
                .as_ref()
                .map(|st| first.is_some_and(|id| st.id() == id) || r.keeps_in_place_of_dir(st, m));
            match (keep, &existing) {
                (Some(true), _) => {
                    r.report.kept += 1;
                    r.listed(crate::progress::FileAction::Unchanged, shown, 0);
                }
                (_, Some(st)) if st.kind() == libc::S_IFDIR => {
                    return Err(Error::Invalid(format!(
                        "{}: a directory is where the image holds a file; it would not be \
                         replaced",
                        shown.display()
                    )));
                }
                _ => {
                    r.report.hardlinks += 1;
                    list_made(r.list, existing.is_some(), shown, 0);
                }
            }
            return Ok(());
        }
        if let (Some(st), Some(d)) = (&existing, dir) {
            if self.keeps(r, st, kind, &meta, inode.as_ref(), d, &cname, path, shown)? {
                r.report.kept += 1;
                if r.verifies()
                    && kind == libc::S_IFREG
                    && st.kind() == kind
                    && r.overwrite_for(st) != Overwrite::IfChanged
                {
                    r.report.not_verified += 1;
                }
                r.listed(crate::progress::FileAction::Unchanged, shown, st.size);
                if let (Some(n), Some(i)) = (linked, &inode)
                    && st.kind() == kind
                {
                    if looks_like_image(st, &meta) {
                        r.plan_first_link(n, i, Some(st.id()), shown);
                    } else {
                        r.kept_apart.insert(n, shown.to_path_buf());
                    }
                }
                return Ok(());
            }
            if st.kind() == libc::S_IFDIR {
                return Err(Error::Invalid(format!(
                    "{}: a directory is where the image holds a {}; it would not be replaced",
                    shown.display(),
                    if ft.is_symlink() { "symlink" } else { "file" }
                )));
            }
        }
        if let Some(kept) = linked.and_then(|n| r.kept_apart.remove(&n)) {
            r.report.warnings.push(format!(
                "{}: {}",
                shown.display(),
                crate::ops::restore::own_file_warning(&kept)
            ));
        }
        if let (Some(n), Some(i)) = (linked, &inode) {
            r.plan_first_link(n, i, None, shown);
        }
        if let (Some(fs), Some(i)) = (r.ext2, &inode) {
            r.plan_xattrs(fs, i, shown);
        }
        match kind {
            libc::S_IFLNK => r.report.symlinks += 1,
            libc::S_IFREG => {
                r.report.files += 1;
                r.report.bytes += meta.len();
            }
            _ => r.report.specials += 1,
        }
        let size = if kind == libc::S_IFREG { meta.len() } else { 0 };
        r.made(existing.is_some(), shown, size);
        Ok(())
    }

    /// Does the entry `name` of `dir` hold the extended attributes image inode
    /// `ino` has (those restore sets)? Yes when the image's cannot be read: the
    /// restore could not set them either.
    fn xattrs_kept(
        r: &FsRestore<'_>,
        ino: Option<&super::blockmap::Inode>,
        dir: std::os::fd::BorrowedFd<'_>,
        name: &std::ffi::CStr,
    ) -> bool {
        let (Some(fs), Some(i)) = (r.ext2, ino) else {
            return true;
        };
        let Ok(mut list) = fs.xattrs(i) else {
            return true;
        };
        r.xattrs.retain(&mut list);
        list.sort();
        crate::ops::restore::xattrs_match(dir, name, &list, r.xattrs)
    }

    /// Sets the extended attributes of image inode `ino` on `fd` (an `O_PATH`
    /// descriptor with `path_only`); refusals become warnings.
    fn set_xattrs(
        &self,
        fs: &super::blockmap::Ext2<'_>,
        ino: &super::blockmap::Inode,
        fd: std::os::fd::BorrowedFd<'_>,
        path_only: bool,
        shown: &Path,
        r: &mut FsRestore<'_>,
    ) {
        let mut list = match fs.xattrs(ino) {
            Ok(l) => l,
            Err(e) => {
                let why = format!("{}: extended attributes not restored: {e}", shown.display());
                r.report.fail(shown, why);
                return;
            }
        };
        r.xattrs.retain(&mut list);
        let refused = match crate::ops::restore::metadata::set_xattrs(fd, path_only, &list) {
            Ok(refused) => {
                r.report.xattrs += (list.len() - refused.len()) as u64;
                refused
            }
            Err(e) => vec![e.to_string()],
        };
        if !refused.is_empty() {
            let why = format!(
                "{}: extended attributes not set: {}",
                shown.display(),
                refused.join(", ")
            );
            r.report.fail(shown, why);
        }
    }

    /// The owner (as root), extended attributes, mode (`None` for a symlink) and
    /// times of a symlink, FIFO or device just made, through the `O_PATH`
    /// descriptor `fd` checked to be it.
    #[allow(clippy::too_many_arguments)]
    fn finish_made(
        &self,
        fd: std::os::fd::BorrowedFd<'_>,
        (uid, gid): (u32, u32),
        inode: Option<&super::blockmap::Inode>,
        mode: Option<libc::mode_t>,
        times: (i64, u32),
        shown: &Path,
        r: &mut FsRestore<'_>,
    ) -> Result<()> {
        use crate::ops::restore::sys;
        let io = |e: std::io::Error| Error::io(shown, e);
        if r.as_root {
            sys::chown_path_fd(fd, uid, gid).map_err(io)?;
        }
        if let (Some(fs), Some(i)) = (r.ext2, inode) {
            self.set_xattrs(fs, i, fd, true, shown, r);
        }
        if let Some(m) = mode {
            sys::chmod_path_fd(fd, m).map_err(io)?;
        }
        let _ = sys::utimens_path_fd(fd, times, times);
        Ok(())
    }

    /// Restores `path` as the entry `name` of the directory `dir` (`shown`: its
    /// path, for messages only).
    #[allow(clippy::too_many_arguments)]
    fn restore_one(
        &self,
        path: &str,
        dir_fd: &std::rc::Rc<std::os::fd::OwnedFd>,
        name: &[u8],
        shown: &Path,
        ino: Option<u32>,
        known: Option<ext4_view::Metadata>,
        r: &mut FsRestore<'_>,
    ) -> Result<()> {
        use crate::ops::restore::Overwrite;
        use crate::ops::restore::{sys, target};
        use std::os::fd::AsFd;
        let dir = dir_fd.as_fd();
        let io = |e: std::io::Error| Error::io(shown, e);
        // The image's inode, when this crate's reader found it.
        let inode = match (r.ext2, ino) {
            (Some(fs), Some(n)) => Some(fs.inode(n).map_err(|e| fs_err(path, e))?),
            _ => None,
        };
        // From the directory's listing, which read it by its inode: a lookup by
        // path scans a directory without an index, once per entry (QA r23: a
        // directory of 15,000 files took 71 s).
        let meta = match known {
            Some(m) => m,
            None => self
                .fs
                .symlink_metadata(Self::path(path)?.as_path())
                .map_err(|e| fs_err(path, e))?,
        };
        let ft = meta.file_type();
        let m = meta.modified();
        let cname = target::c_name(name).map_err(io)?;
        // In a directory this restore made, nothing is there yet: not looked
        // for, a `stat` per entry saved.
        let existing = match std::mem::take(&mut r.fresh) {
            true => None,
            false => match sys::stat_at(dir, &cname) {
                Ok(st) => Some(st),
                Err(e) if e.raw_os_error() == Some(libc::ENOENT) => None,
                Err(e) => return Err(io(e)),
            },
        };
        let times = (m.seconds(), m.nanoseconds());
        let mode = (u32::from(meta.mode()) & 0o7777) as libc::mode_t;
        if ft.is_dir() {
            r.guard.enter(path, ino)?;
            let mut keep_meta = false;
            let made_here = !matches!(&existing, Some(st) if st.kind() == libc::S_IFDIR);
            match &existing {
                // An existing directory (never a symlink to one: not followed) is
                // restored into; with `never`, its own metadata is left as it is.
                Some(st) if st.kind() == libc::S_IFDIR => {
                    keep_meta = r.overwrite_for(st) == Overwrite::Never;
                }
                // Something else where the image has a directory: replaced
                // unless the mode keeps it, and then nothing below is restored
                // either, which is said (as a restore of a file snapshot does).
                Some(st) if r.keeps_in_place_of_dir(st, m) => {
                    r.report.kept += 1;
                    r.listed(crate::progress::FileAction::Unchanged, shown, 0);
                    r.report.kept_in_place_of_dirs.push(format!(
                        "{}: kept as it is (--overwrite): it is not a directory, where the \
                         image has one, so nothing below it was restored",
                        shown.display()
                    ));
                    return Ok(());
                }
                Some(_) => {
                    sys::unlink_at(dir, &cname).map_err(io)?;
                    sys::mkdir_at(dir, &cname, 0o700).map_err(io)?;
                }
                None => sys::mkdir_at(dir, &cname, 0o700).map_err(io)?,
            }
            let sub = std::rc::Rc::new(
                sys::open_at(dir, &cname, libc::O_RDONLY | libc::O_DIRECTORY, 0).map_err(io)?,
            );
            // Listed as it is entered, so that its entries come after it; an
            // existing one is updated (its metadata set back) unless kept, and
            // counted as kept then, as an unchanged file is (QA r23: a restore
            // over a finished one said every directory was restored).
            match &existing {
                // Kept, or already as the image has it (its entries' changes
                // are listed with them).
                Some(st) if keep_meta || r.dir_as_image(st, &meta) => {
                    r.report.kept += 1;
                    r.listed(crate::progress::FileAction::Unchanged, shown, 0);
                }
                e => {
                    r.report.dirs += 1;
                    r.made(e.is_some(), shown, 0);
                }
            }
            // An entry that cannot be restored is reported, and the directory's
            // other entries are restored (as a restore of a file snapshot does).
            for (c, ino) in self.to_restore(path, inode.as_ref(), shown, r, false)? {
                self.check_cancelled()?;
                let child_shown = shown.join(std::ffi::OsStr::from_bytes(&c.raw));
                let done = c.meta.and_then(|m| {
                    r.fresh = made_here;
                    self.restore_one(&c.path, &sub, &c.raw, &child_shown, ino, Some(m), r)
                });
                match done {
                    Err(Error::Cancelled) => return Err(Error::Cancelled),
                    // A full target fails every file after it too: stop there.
                    Err(e) if e.is_no_space() => return Err(e),
                    Err(e) => r.report.fail(&child_shown, e.to_string()),
                    Ok(()) => {}
                }
            }
            if keep_meta {
                return Ok(());
            }
            if r.as_root {
                // Before the mode: chown clears set-user-ID and set-group-ID bits.
                sys::chown_fd(sub.as_fd(), meta.uid(), meta.gid()).map_err(io)?;
            }
            if let (Some(fs), Some(i)) = (r.ext2, &inode) {
                self.set_xattrs(fs, i, sub.as_fd(), false, shown, r);
            }
            sys::chmod_fd(sub.as_fd(), mode).map_err(io)?;
            let _ = sys::futimens(sub.as_fd(), times, times);
            return Ok(());
        }
        // FIFOs are made again; devices too as root, with the number this crate's
        // inode reader finds (what `ext4-view` does not show); sockets are not
        // (a restore of a file snapshot does the same).
        let special: Option<(u32, u64)> = if ft.is_fifo() {
            Some((libc::S_IFIFO, 0))
        } else if (ft.is_char_dev() || ft.is_block_dev()) && r.as_root {
            let kind = if ft.is_char_dev() {
                libc::S_IFCHR
            } else {
                libc::S_IFBLK
            };
            inode.as_ref().map(|i| (kind, i.rdev()))
        } else {
            None
        };
        if (ft.is_char_dev() || ft.is_block_dev()) && !r.as_root {
            // As a restore of a file snapshot: only root can make a device.
            return Err(Error::Invalid(format!(
                "{}: a device file is made only by root: not restored",
                shown.display()
            )));
        }
        if (ft.is_char_dev() || ft.is_block_dev()) && special.is_none() {
            // Root, but without this crate's inode reader (see `why_not`).
            return Err(Error::Invalid(format!(
                "{}: a device whose number cannot be read ({}): not restored; restore \
                 the whole image, or loop-mount it, for it",
                shown.display(),
                if r.why_not.is_empty() {
                    "its inode was not found"
                } else {
                    &r.why_not
                }
            )));
        }
        if !(ft.is_regular_file() || ft.is_symlink() || special.is_some()) {
            r.report.skipped += 1;
            return Ok(());
        }
        let kind = match special {
            Some((k, _)) => k,
            None if ft.is_symlink() => libc::S_IFLNK,
            None => libc::S_IFREG,
        };
        // A file with more than one name: once one name is restored (or found
        // as it should be), every other one is made a link to it.
        let linked = match (ino, &inode) {
            (Some(n), Some(i)) if kind == libc::S_IFREG && special.is_none() && i.links > 1 => {
                Some(n)
            }
            _ => None,
        };
        if let Some(n) = linked
            && r.links.contains_key(&n)
        {
            return self.restore_link(n, dir, &cname, existing.as_ref(), m, shown, r);
        }
        if let Some(st) = &existing {
            let same_kind = st.kind() == kind;
            let keep = self.keeps(r, st, kind, &meta, inode.as_ref(), dir, &cname, path, shown)?;
            if keep {
                r.report.kept += 1;
                if r.verifies() && kind == libc::S_IFREG && same_kind {
                    match r.overwrite_for(st) {
                        Overwrite::IfChanged => {
                            r.report.verified = r.report.verified.map(|v| v + 1);
                        }
                        _ => r.report.not_verified += 1,
                    }
                }
                r.listed(crate::progress::FileAction::Unchanged, shown, st.size);
                // The file kept is what the file's other names are linked to
                // (QA: a name that was a copy stayed one, and the restore then
                // said the other names were outside the restored directory),
                // when it looks like the image's file: one `never` or
                // `if-newer` kept whatever it holds is not (QA r43: the other
                // names became links to someone else's file).
                if let (Some(n), Some(i)) = (linked, &inode)
                    && same_kind
                {
                    if looks_like_image(st, &meta) {
                        self.first_link(n, i, dir_fd, cname, st.id(), shown, r);
                    } else {
                        r.kept_apart.insert(n, shown.to_path_buf());
                    }
                }
                return Ok(());
            }
            if st.kind() == libc::S_IFDIR {
                return Err(Error::Invalid(format!(
                    "{}: a directory is where the image holds a {}; not replaced",
                    shown.display(),
                    if ft.is_symlink() { "symlink" } else { "file" }
                )));
            }
            sys::unlink_at(dir, &cname).map_err(io)?;
        }
        if let Some((kind, rdev)) = special {
            sys::mknod_at(dir, &cname, kind | 0o600, rdev).map_err(io)?;
            // Through an O_PATH descriptor checked to be the entry just made.
            let check = (kind != libc::S_IFIFO).then_some(rdev);
            let fd = target::open_created_special(dir, &cname, kind, check).map_err(io)?;
            let owner = (meta.uid(), meta.gid());
            self.finish_made(
                fd.as_fd(),
                owner,
                inode.as_ref(),
                Some(mode),
                times,
                shown,
                r,
            )?;
            r.report.specials += 1;
            r.made(existing.is_some(), shown, 0);
            return Ok(());
        }
        if ft.is_symlink() {
            let link = self.read_link(path, &meta)?;
            let link = target::c_name(&link).map_err(io)?;
            sys::symlink_at(&link, dir, &cname).map_err(io)?;
            r.report.symlinks += 1;
            // Through an O_PATH descriptor checked to be the link just made.
            let fd = target::open_created_special(dir, &cname, libc::S_IFLNK, None).map_err(io)?;
            let owner = (meta.uid(), meta.gid());
            // A symlink has no mode of its own to set.
            self.finish_made(fd.as_fd(), owner, inode.as_ref(), None, times, shown, r)?;
            r.made(existing.is_some(), shown, 0);
            return Ok(());
        }
        let f = target::create_file(dir, &cname).map_err(io)?;
        if let Some(kept) = linked.and_then(|n| r.kept_apart.remove(&n)) {
            r.report.warnings.push(format!(
                "{}: {}",
                shown.display(),
                crate::ops::restore::own_file_warning(&kept)
            ));
        }
        // Until its content is whole, the file is this restore's unfinished work.
        r.unfinished += 1;
        let mut w = Sparse {
            f,
            at: 0,
            len: 0,
            block: Vec::with_capacity(SPARSE_BLOCK),
            limit: r.limit,
        };
        // Read by this crate's reader when its inode is the file `ext4-view`
        // describes (their sizes and modes agree).
        let own = r
            .ext2
            .zip(inode.as_ref())
            .filter(|(_, i)| i.size == meta.len() && i.mode() & 0o7777 == meta.mode());
        let (copied, zeros) = self.noting_zeros(|| self.dump_to(path, own, &mut w, shown));
        let copied = copied?;
        let f = w.finish().map_err(io)?;
        // Read back before its mode is set (one the owner cannot read would
        // refuse it), through a descriptor of its own checked to be this file.
        if r.verifies() && zeros {
            r.report.not_verified += 1;
        }
        if r.verifies() && !zeros {
            crate::hooks::point("image-fs:verify");
            let st = sys::fstat(f.as_fd()).map_err(io)?;
            let problem = match self.holds_the_image_file(path, own, dir, &cname, &st, shown) {
                Ok(true) => None,
                Ok(false) => Some("the file read back differs from the image".to_string()),
                Err(e) => Some(e.to_string()),
            };
            if let Some(p) = problem {
                // Left as a file written in part: the restore's time, mode
                // 0600, not counted, and the restore's mark left, so that the
                // next restore does not keep it by its size and time (QA r40:
                // it kept the image's and was taken for whole).
                // Its other names are not made links to it: the next is
                // written (and read back) as a file of its own (review r42
                // L6: they were counted as links made, with its bytes).
                r.report
                    .fail(shown, format!("{}: verify: {p}", shown.display()));
                sys::chmod_fd(f.as_fd(), 0o600).map_err(io)?;
                return Ok(());
            }
            r.report.verified = r.report.verified.map(|v| v + 1);
        }
        r.report.bytes += copied;
        r.unfinished -= 1;
        r.report.files += 1;
        r.made(existing.is_some(), shown, meta.len());
        if r.as_root {
            sys::chown_fd(f.as_fd(), meta.uid(), meta.gid()).map_err(io)?;
        }
        if let (Some(fs), Some(i)) = (r.ext2, &inode) {
            self.set_xattrs(fs, i, f.as_fd(), false, shown, r);
        }
        if zeros {
            // Zeros where the backup could not read the image: named, and left
            // with the restore's time and mode 0600 as a file restore leaves a
            // file it could not restore in full, so that nothing syncing by
            // size and time (the next `if-changed` restore of a good snapshot
            // among them) takes it as whole (QA r37: restored as intact).
            sys::chmod_fd(f.as_fd(), 0o600).map_err(io)?;
            r.report.warnings.push(format!(
                "{}: holds zeros where the image {}; left with the restore's time \
                     and mode 0600",
                shown.display(),
                if self.repaired {
                    "could not be read at backup or was lost in the repository"
                } else {
                    "could not be read at backup"
                }
            ));
        } else {
            sys::chmod_fd(f.as_fd(), mode).map_err(io)?;
            let _ = sys::futimens(f.as_fd(), times, times);
        }
        if let (Some(n), Some(i)) = (linked, &inode) {
            let id = sys::fstat(f.as_fd()).map_err(io)?.id();
            self.first_link(n, i, dir_fd, cname, id, shown, r);
        }
        Ok(())
    }

    /// Whether the existing entry `st` (`name` of `dir`, not a directory where
    /// the image has one) is left as it is where the image has an entry of
    /// kind `kind` (`S_IFREG`, `S_IFLNK`...) described by `meta` and `inode`,
    /// as `--overwrite` says.
    #[allow(clippy::too_many_arguments)]
    fn keeps(
        &self,
        r: &FsRestore<'_>,
        st: &crate::ops::restore::sys::Stat,
        kind: u32,
        meta: &ext4_view::Metadata,
        inode: Option<&super::blockmap::Inode>,
        dir: std::os::fd::BorrowedFd<'_>,
        name: &std::ffi::CStr,
        path: &str,
        shown: &Path,
    ) -> Result<bool> {
        use crate::ops::restore::Overwrite;
        let m = meta.modified();
        let mode = u32::from(meta.mode()) & 0o7777;
        Ok(match r.overwrite_for(st) {
            Overwrite::Never => true,
            Overwrite::Always => false,
            Overwrite::IfNewer => st.mtime.0 >= m.seconds(),
            // The image's entry already, metadata and all (QA: a file whose
            // mode, owner or attributes had changed was kept as it was).
            Overwrite::IfChanged => {
                let looks_kept = st.kind() == kind
                    && st.size == meta.len()
                    && st.mtime == (m.seconds(), m.nanoseconds())
                    && (kind == libc::S_IFLNK || st.mode & 0o7777 == mode)
                    && (!r.as_root || (st.uid, st.gid) == (meta.uid(), meta.gid()))
                    && Self::xattrs_kept(r, inode, dir, name);
                // With `--verify`, a file is kept only when its bytes are the
                // image's too (as a restore of files compares them).
                if !looks_kept || !r.verifies() || kind != libc::S_IFREG {
                    looks_kept
                } else {
                    let own = r
                        .ext2
                        .zip(inode)
                        .filter(|(_, i)| i.size == meta.len() && i.mode() & 0o7777 == meta.mode());
                    match self.holds_the_image_file(path, own, dir, name, st, shown) {
                        Ok(same) => same,
                        // Ctrl-C: not taken for a difference (review r42: the
                        // good file was replaced by an empty one).
                        Err(Error::Cancelled) => return Err(Error::Cancelled),
                        // One that cannot be read is written again.
                        Err(_) => false,
                    }
                }
            }
        })
    }

    /// Whether the regular file `name` of `dir` (`st`: what `stat` said of it)
    /// holds the bytes of the image's file at `path`, read again from the image
    /// and compared as they come (memory does not grow with the file).
    fn holds_the_image_file(
        &self,
        path: &str,
        own: Option<(&super::blockmap::Ext2<'_>, &super::blockmap::Inode)>,
        dir: std::os::fd::BorrowedFd<'_>,
        name: &std::ffi::CStr,
        st: &crate::ops::restore::sys::Stat,
        shown: &Path,
    ) -> Result<bool> {
        let file = crate::ops::restore::target::reopen_file(dir, name, libc::O_RDONLY, st)
            .map_err(|e| Error::io(shown, e))?;
        let mut cmp = Compare {
            file,
            at: 0,
            buf: Vec::new(),
            differs: false,
        };
        let dumped = self.dump_to(path, own, &mut cmp, shown);
        if cmp.differs {
            return Ok(false);
        }
        dumped?;
        let len = cmp.file.metadata().map_err(|e| Error::io(shown, e))?.len();
        Ok(len == cmp.at)
    }

    /// Records the entry `name` of `dir` (device and inode `id`) as the first
    /// name of image inode `n`, which its other names are linked to.
    #[allow(clippy::too_many_arguments)]
    fn first_link(
        &self,
        n: u32,
        inode: &super::blockmap::Inode,
        dir: &std::rc::Rc<std::os::fd::OwnedFd>,
        name: std::ffi::CString,
        id: (u64, u64),
        shown: &Path,
        r: &mut FsRestore<'_>,
    ) {
        if r.links.len() < MAX_OPEN_LINKS {
            r.links.insert(
                n,
                FirstLink {
                    dir: dir.clone(),
                    name,
                    id,
                    left: inode.links - 1,
                },
            );
        } else {
            r.report.notes.push(format!(
                "{}: restored as a copy, not a hard link (too many files with names \
                 still to come)",
                shown.display()
            ));
        }
    }

    /// Restores another name of image inode `n`, whose first name is restored
    /// already: a link to it. An entry there already that is that file is kept;
    /// another one is replaced unless `--overwrite` keeps it (`never`, or
    /// `if-newer` with an entry as new). The link is checked to be the file
    /// this restore recorded (someone who can write the target may have
    /// replaced it meanwhile).
    #[allow(clippy::too_many_arguments)]
    fn restore_link(
        &self,
        n: u32,
        dir: std::os::fd::BorrowedFd<'_>,
        cname: &std::ffi::CStr,
        existing: Option<&crate::ops::restore::sys::Stat>,
        m: ext4_view::Timestamp,
        shown: &Path,
        r: &mut FsRestore<'_>,
    ) -> Result<()> {
        use crate::ops::restore::{Overwrite, sys};
        use std::os::fd::AsFd;
        let io = |e: std::io::Error| Error::io(shown, e);
        let Some(first) = r.links.get(&n) else {
            return Ok(());
        };
        let keep = existing.map(|st| {
            st.id() == first.id
                || match r.overwrite_for(st) {
                    Overwrite::Never => true,
                    Overwrite::IfNewer => st.mtime.0 >= m.seconds(),
                    Overwrite::IfChanged | Overwrite::Always => false,
                }
        });
        let made = match (keep, existing) {
            (Some(true), _) => {
                r.report.kept += 1;
                r.listed(crate::progress::FileAction::Unchanged, shown, 0);
                Ok(())
            }
            (_, Some(st)) if st.kind() == libc::S_IFDIR => Err(Error::Invalid(format!(
                "{}: a directory is where the image holds a file; not replaced",
                shown.display()
            ))),
            _ => (|| {
                if existing.is_some() {
                    sys::unlink_at(dir, cname).map_err(io)?;
                }
                sys::link_at(first.dir.as_fd(), &first.name, dir, cname).map_err(io)?;
                let st = sys::stat_at(dir, cname).map_err(io)?;
                if st.id() != first.id {
                    let _ = sys::unlink_at(dir, cname);
                    return Err(Error::Invalid(format!(
                        "{}: its first name was replaced during the restore (the link was \
                         removed)",
                        shown.display()
                    )));
                }
                r.report.hardlinks += 1;
                // `r.links` is borrowed: the field, not `r.made`.
                list_made(r.list, existing.is_some(), shown, 0);
                Ok(())
            })(),
        };
        // This name is done with, restored or not: it is not one outside the
        // restored directory.
        if let Some(first) = r.links.get_mut(&n) {
            first.left = first.left.saturating_sub(1);
            if first.left == 0 {
                r.links.remove(&n);
            }
        }
        made
    }

    /// The entries of directory `path` (`inode`, as this crate's reader found
    /// it; `shown`: where it is restored) a restore walks, each with its inode
    /// number from that reader. A name held twice comes with an error: which
    /// entry this crate's reader takes is not known to be the one `ext4-view`
    /// reads, so its inode (hard links, attributes, content) is not taken from
    /// here (pentest: the content of another file was restored under the
    /// name); nor is it restored from its first entry: `ext4-view` may read the
    /// content of another (review: in a directory with an index, its lookup by
    /// name finds whichever entry the index names). Inode numbers that cannot
    /// be listed fail the directory's entry in `r` (`would`: a dry run's words).
    fn to_restore(
        &self,
        path: &str,
        inode: Option<&super::blockmap::Inode>,
        shown: &Path,
        r: &mut FsRestore<'_>,
        would: bool,
    ) -> Result<Vec<(Child, Option<u32>)>> {
        let mut inos: std::collections::HashMap<Vec<u8>, u32> = match (r.ext2, inode) {
            (Some(fs), Some(d)) => match fs.entries(d) {
                Ok(e) => e.into_iter().collect(),
                Err(e) => {
                    let why = format!(
                        "{}: hard links and extended attributes below it {}: {e}",
                        shown.display(),
                        if would {
                            "would not be restored"
                        } else {
                            "not restored"
                        }
                    );
                    r.report.fail(shown, why);
                    Default::default()
                }
            },
            _ => Default::default(),
        };
        let children = self.children(path, r.ext2.zip(inode))?;
        let repeated = repeated_names(&children, &mut inos);
        Ok(children
            .into_iter()
            .map(|mut c| {
                if c.meta.is_ok() && repeated.contains(&c.raw) {
                    c.meta = Err(Error::Invalid(format!(
                        "{}: corrupt filesystem: the directory holds this name more than \
                         once; which entry is meant cannot be told, so none {} restored",
                        c.path,
                        if would { "would be" } else { "is" }
                    )));
                }
                let ino = inos.get(&c.raw).copied();
                (c, ino)
            })
            .collect())
    }

    /// A directory's entries (without `.` and `..`) in name order: their paths,
    /// names and metadata. An entry that cannot be read (a name that cannot be a
    /// file name here, an inode the reader refuses) comes with its error, so that
    /// its directory's other entries are still listed and restored.
    ///
    /// A corrupt directory may hold a name twice: both entries would be read by
    /// that name, as the first, so the second is reported, not taken for the
    /// first again (QA: it was counted as left in place, exit 0). More than
    /// [`super::blockmap::MAX_REPEATED_NAMES`] such names make the directory an
    /// error: its blocks repeat (pentest: one block under every pointer of a
    /// directory listed millions of entries, and memory grew with them).
    fn children(
        &self,
        dir: &str,
        own: Option<(&super::blockmap::Ext2<'_>, &super::blockmap::Inode)>,
    ) -> Result<Vec<Child>> {
        match own {
            Some((fs, ino)) => fs.crafted_tree(ino).map_err(|e| fs_err(dir, e))?,
            None => self.crafted_on_the_way(dir)?,
        }
        let mut out = Vec::new();
        let mut seen = std::collections::HashSet::new();
        let mut repeats = 0;
        for (i, e) in self
            .fs
            .read_dir(Self::path(dir)?.as_path())
            .map_err(|e| fs_err(dir, e))?
            .enumerate()
        {
            if i % 4096 == 4095 {
                self.check_cancelled()?;
            }
            let e = e.map_err(|e| fs_err(dir, e))?;
            let raw = e.file_name();
            let raw: &[u8] = raw.as_ref();
            let shown = escape_name(raw);
            let child = if dir == "/" {
                format!("/{shown}")
            } else {
                format!("{dir}/{shown}")
            };
            let repeated = !seen.insert(raw.to_vec());
            let meta = match entry_name(raw, dir) {
                Ok(None) => continue,
                Err(e) => Err(e),
                Ok(Some(_)) if repeated => {
                    repeats += 1;
                    if repeats > super::blockmap::MAX_REPEATED_NAMES {
                        return Err(fs_err(
                            dir,
                            format!(
                                "a damaged directory: more than {} of its names are held twice",
                                super::blockmap::MAX_REPEATED_NAMES
                            ),
                        ));
                    }
                    Err(Error::Invalid(format!(
                        "{child}: corrupt filesystem: the directory holds this name more than \
                         once; only the first entry is read"
                    )))
                }
                Ok(Some(_)) => e.metadata().map_err(|e| fs_err(&child, e)),
            };
            out.push(Child {
                path: child,
                raw: raw.to_vec(),
                meta,
                repeated,
            });
        }
        // Stable: a name's first entry stays first.
        out.sort_by(|a, b| a.path.cmp(&b.path));
        Ok(out)
    }
}

/// What a recursive listing carries down ([`ImageFs::list_below`]).
struct ListWalk<'a, 'f> {
    ext2: Option<&'a super::blockmap::Ext2<'a>>,
    guard: DirGuard,
    recursive: bool,
    /// An entry that could not be read (its path), and why.
    failed: &'f mut dyn FnMut(&str, Error),
}

/// The names a directory holds more than once, taken out of `inos` (the
/// inodes this crate's reader found by name): which entry of such a name
/// `ext4-view` reads is not known.
fn repeated_names(
    children: &[Child],
    inos: &mut std::collections::HashMap<Vec<u8>, u32>,
) -> std::collections::HashSet<Vec<u8>> {
    let repeated: std::collections::HashSet<Vec<u8>> = (children.iter())
        .filter(|c| c.repeated)
        .map(|c| c.raw.clone())
        .collect();
    for name in &repeated {
        inos.remove(name);
    }
    repeated
}

/// An entry of a directory in the image (see [`ImageFs::children`]).
struct Child {
    /// As listings write it (bytes that are not UTF-8 as stand-ins).
    path: String,
    /// The name's bytes.
    raw: Vec<u8>,
    meta: Result<ext4_view::Metadata>,
    /// Not the first entry of its name in the directory.
    repeated: bool,
}

/// Hard-linked files whose other names are still to come, at most: each keeps
/// its directory open.
const MAX_OPEN_LINKS: usize = 10_000;

/// The first name restored of a hard-linked file.
struct FirstLink {
    dir: std::rc::Rc<std::os::fd::OwnedFd>,
    name: std::ffi::CString,
    /// Device and inode of the file the restore made.
    id: (u64, u64),
    /// Names still to come.
    left: u16,
}

/// What one `restore --image-fs` carries along.
struct FsRestore<'a> {
    /// This crate's inode reader (hard links, extended attributes, device
    /// numbers), and why there is none.
    ext2: Option<&'a super::blockmap::Ext2<'a>>,
    why_not: String,
    /// Hard-linked files restored under a first name, by image inode.
    links: std::collections::HashMap<u32, FirstLink>,
    limit: Option<&'a cairn_backend::Limiter>,
    overwrite: crate::ops::restore::Overwrite,
    /// The time of the mark a restore that did not finish left in the target.
    unfinished_since: Option<(i64, u32)>,
    /// Files created whose content was not written in full (an error on the way).
    unfinished: u64,
    /// Which extended attributes are set (`--include-xattr`, `--exclude-xattr`).
    xattrs: &'a crate::ops::restore::XattrSelect,
    as_root: bool,
    report: FsRestoreReport,
    guard: DirGuard,
    /// Where each entry's outcome goes (`restore -v`), as a restore of a file
    /// snapshot lists them.
    list: Option<&'a crate::progress::Progress>,
    /// The entry restored next is in a directory this restore made: nothing
    /// is there to look for (files are created exclusively all the same).
    fresh: bool,
    /// `--dry-run`: the image inodes of hard-linked files whose first name was
    /// met, with the target's file kept for it (`None`: it would be written).
    /// With the names of it still to come (as [`FirstLink::left`]).
    planned: std::collections::HashMap<u32, (Option<(u64, u64)>, u32)>,
    /// Hard-linked files whose first name was kept as it is (`--overwrite`)
    /// while it does not look like the image's file: where it is. The next
    /// name is written as a file of its own, and said so.
    kept_apart: std::collections::HashMap<u32, std::path::PathBuf>,
}

impl<'a> FsRestore<'a> {
    /// A restore's state as `opts` says, before the walk (`inodes`: the
    /// filesystem's inode count, which bounds the directories it enters).
    fn new(
        opts: &FsRestoreOptions<'a>,
        ext2: Option<&'a super::blockmap::Ext2<'a>>,
        why_not: String,
        inodes: Option<u32>,
    ) -> FsRestore<'a> {
        FsRestore {
            limit: None,
            overwrite: opts.overwrite,
            unfinished_since: None,
            unfinished: 0,
            xattrs: opts.xattrs,
            as_root: nix::unistd::geteuid().is_root(),
            report: FsRestoreReport {
                verified: opts.verify.then_some(0),
                ..Default::default()
            },
            ext2,
            why_not,
            links: std::collections::HashMap::new(),
            guard: DirGuard::new(inodes),
            list: opts.list,
            fresh: false,
            planned: Default::default(),
            kept_apart: Default::default(),
        }
    }
}

impl FsRestore<'_> {
    /// `--dry-run`: [`ImageFs::first_link`] of image inode `n`, whose first name
    /// (`shown`) is the target's file `id` when kept (`None`: written).
    fn plan_first_link(
        &mut self,
        n: u32,
        inode: &super::blockmap::Inode,
        id: Option<(u64, u64)>,
        shown: &Path,
    ) {
        if self.planned.len() < MAX_OPEN_LINKS {
            self.planned
                .insert(n, (id, u32::from(inode.links.saturating_sub(1))));
        } else {
            self.report.notes.push(format!(
                "{}: would be restored as a copy, not a hard link (too many files with \
                 names still to come)",
                shown.display()
            ));
        }
    }

    /// `--dry-run`: an entry that would be written fails as the restore fails
    /// it when its extended attributes cannot be read.
    fn plan_xattrs(
        &mut self,
        fs: &super::blockmap::Ext2<'_>,
        inode: &super::blockmap::Inode,
        shown: &Path,
    ) {
        if let Err(e) = fs.xattrs(inode) {
            let why = format!(
                "{}: extended attributes would not be restored: {e}",
                shown.display()
            );
            self.report.fail(shown, why);
        }
    }

    /// Whether `st`, not a directory, is left where the image has a directory
    /// (modified at `m`), and nothing is restored below it.
    fn keeps_in_place_of_dir(
        &self,
        st: &crate::ops::restore::sys::Stat,
        m: ext4_view::Timestamp,
    ) -> bool {
        use crate::ops::restore::Overwrite;
        match self.overwrite_for(st) {
            Overwrite::Never => true,
            Overwrite::IfNewer => st.mtime.0 >= m.seconds(),
            Overwrite::IfChanged | Overwrite::Always => false,
        }
    }

    /// Whether the existing entry `st` is already the image's directory
    /// `meta`, metadata and all (counted as kept then).
    fn dir_as_image(
        &self,
        st: &crate::ops::restore::sys::Stat,
        meta: &ext4_view::Metadata,
    ) -> bool {
        let m = meta.modified();
        st.kind() == libc::S_IFDIR
            && st.mtime == (m.seconds(), m.nanoseconds())
            && st.mode & 0o7777 == u32::from(meta.mode()) & 0o7777
            && (!self.as_root || (st.uid, st.gid) == (meta.uid(), meta.gid()))
    }

    /// `--verify`: files written are read back, files kept compared.
    fn verifies(&self) -> bool {
        self.report.verified.is_some()
    }

    /// Says what was done with the entry `shown` (`restore -v`).
    fn listed(&self, action: crate::progress::FileAction, shown: &Path, size: u64) {
        if let Some(p) = self.list {
            crate::ops::restore::list_file(p, action, shown, size);
        }
    }

    /// Restored where nothing was, or written over what was there.
    fn made(&self, existed: bool, shown: &Path, size: u64) {
        list_made(self.list, existed, shown, size);
    }

    /// `overwrite` for the existing entry `st`, after a restore that did not finish
    /// ([`crate::ops::restore::unfinished`]).
    fn overwrite_for(&self, st: &crate::ops::restore::sys::Stat) -> crate::ops::restore::Overwrite {
        crate::ops::restore::overwrite_effective(self.overwrite, self.unfinished_since, st)
    }
}

/// The note for `n` hard-linked files restored from `path` whose other names
/// lie outside it: nothing to do, but worth knowing.
fn outside_names(n: usize, path: &str) -> String {
    format!(
        "{} names outside {path} (not restored)",
        match n {
            1 => "1 hard-linked file has".to_string(),
            n => format!("{n} hard-linked files have"),
        }
    )
}

/// Whether the existing file `st` looks like the image's file `meta`: its size
/// and modification time (what `if-changed` goes by), so that the file's other
/// names may be made links to it.
fn looks_like_image(st: &crate::ops::restore::sys::Stat, meta: &ext4_view::Metadata) -> bool {
    let m = meta.modified();
    st.size == meta.len() && st.mtime == (m.seconds(), m.nanoseconds())
}

/// Lists the entry `shown` (`restore -v`, when `list`) as restored where
/// nothing was, or updated where something was.
fn list_made(list: Option<&crate::progress::Progress>, existed: bool, shown: &Path, size: u64) {
    use crate::progress::FileAction;
    if let Some(p) = list {
        let action = if existed {
            FileAction::Updated
        } else {
            FileAction::Restored
        };
        crate::ops::restore::list_file(p, action, shown, size);
    }
}

/// Keeps a walk of a corrupt filesystem from running forever (QA: a directory
/// entry pointing back at `/` made `restore --image-fs` create nested
/// directories until the disk filled, two such entries doubling the work at
/// every level). ext2/3/4 gives a directory one name, so a directory inode met
/// a second time is a loop or a second link, and is not entered again. Where
/// inode numbers are unknown (this crate's reader declined the filesystem), a
/// walk that has entered more directories than the filesystem has inodes is in a
/// loop, and every further directory is refused.
struct DirGuard {
    seen: std::collections::HashSet<u32>,
    entered: u64,
    limit: u64,
}

impl DirGuard {
    fn new(inodes: Option<u32>) -> DirGuard {
        DirGuard {
            seen: std::collections::HashSet::new(),
            entered: 0,
            limit: inodes.map_or(u64::MAX, u64::from),
        }
    }

    /// May the walk enter the directory `path` (image inode `ino`, if known)?
    fn enter(&mut self, path: &str, ino: Option<u32>) -> Result<()> {
        if let Some(n) = ino
            && !self.seen.insert(n)
        {
            return Err(Error::Invalid(format!(
                "{path}: corrupt filesystem: directory inode {n} is reached a second time \
                 (a directory loop or a second name of a directory); not entered again"
            )));
        }
        self.entered += 1;
        if self.entered > self.limit {
            return Err(Error::Invalid(format!(
                "{path}: corrupt filesystem: the walk entered more directories than the \
                 filesystem has inodes ({}), so its directories form a loop; not entered",
                self.limit
            )));
        }
        Ok(())
    }
}

/// A new file written at increasing offsets, whole 4 KiB blocks of zeros left as
/// holes (the file system's own holes come out of the image as zeros), held to a
/// rate (`--write-limit`). The reader hands over pieces of any size (a block of
/// the image's file system, 1 KiB on small ones), so a block is gathered before
/// it is judged.
struct Sparse<'a> {
    /// A file this restore created (empty then).
    f: std::fs::File,
    /// Where `block` starts in the file (a multiple of [`SPARSE_BLOCK`]).
    at: u64,
    /// The file's length so far: the end of the last write.
    len: u64,
    block: Vec<u8>,
    limit: Option<&'a cairn_backend::Limiter>,
}

const SPARSE_BLOCK: usize = 4096;

/// A writer that compares what it is given with a file's bytes at the same
/// place (`--verify`): nothing is written.
struct Compare {
    file: std::fs::File,
    /// The file offset of the next bytes given.
    at: u64,
    buf: Vec<u8>,
    differs: bool,
}

impl Write for Compare {
    fn write(&mut self, data: &[u8]) -> std::io::Result<usize> {
        use std::os::unix::fs::FileExt;
        self.buf.resize(data.len(), 0);
        match self.file.read_exact_at(&mut self.buf, self.at) {
            Ok(()) => self.differs = self.buf != data,
            Err(e) if e.kind() == std::io::ErrorKind::UnexpectedEof => self.differs = true,
            Err(e) => return Err(e),
        }
        // The first difference settles it: nothing more is read (review r42:
        // the rest of the image's file was read all the same).
        if self.differs {
            return Err(std::io::Error::other("differs"));
        }
        self.at += data.len() as u64;
        Ok(data.len())
    }

    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

impl Sparse<'_> {
    fn put_block(&mut self) -> std::io::Result<()> {
        let block = std::mem::take(&mut self.block);
        self.put(&block)?;
        self.block = block;
        self.block.clear();
        Ok(())
    }

    /// Writes `data` (whole blocks, or the last piece) at `at`, unless all zeros.
    fn put(&mut self, data: &[u8]) -> std::io::Result<()> {
        use std::os::unix::fs::FileExt;
        if !crate::ops::restore::all_zeros(data) {
            self.f.write_all_at(data, self.at)?;
            self.len = self.at + data.len() as u64;
            if let Some(l) = self.limit {
                l.take(data.len() as u64);
            }
        }
        self.at += data.len() as u64;
        Ok(())
    }

    /// Writes what is gathered and sets the length (a file may end in a hole);
    /// the file, for its metadata.
    fn finish(mut self) -> std::io::Result<std::fs::File> {
        self.put_block()?;
        if self.len != self.at {
            self.f.set_len(self.at)?;
        }
        Ok(self.f)
    }
}

impl Write for Sparse<'_> {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        let mut rest = buf;
        // Whole blocks straight from `buf` while none is being gathered.
        if self.block.is_empty() && rest.len() >= SPARSE_BLOCK {
            let whole = rest.len() - rest.len() % SPARSE_BLOCK;
            for b in rest[..whole].chunks_exact(SPARSE_BLOCK) {
                self.put(b)?;
            }
            rest = &rest[whole..];
        }
        while !rest.is_empty() {
            let n = (SPARSE_BLOCK - self.block.len()).min(rest.len());
            self.block.extend_from_slice(&rest[..n]);
            rest = &rest[n..];
            if self.block.len() == SPARSE_BLOCK {
                self.put_block()?;
            }
        }
        Ok(buf.len())
    }

    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

/// Whether the window holds an ext2/3/4 superblock with a journal that asks
/// for recovery.
fn needs_recovery(bytes: &ImageBytes) -> bool {
    let mut sb = [0u8; 100];
    bytes.read_at(1024, &mut sb).is_ok()
        && sb[56..58] == [0x53, 0xEF]
        && u32::from_le_bytes([sb[92], sb[93], sb[94], sb[95]]) & 0x4 != 0
        && u32::from_le_bytes([sb[96], sb[97], sb[98], sb[99]]) & 0x4 != 0
}

/// The bytes of a path or name as listings write it ([`escape_name`]: stand-ins
/// for bytes that are not UTF-8).
fn raw(p: &str) -> Vec<u8> {
    unescape_name(p).unwrap_or_else(|| p.as_bytes().to_vec())
}

/// A directory entry's name as one path component: `None` for `.` and `..`; a
/// name holding `/` or NUL (which no ext4 driver writes, but a crafted image can
/// hold) is refused, so that no name reaches outside its directory.
fn entry_name(name: &[u8], dir: &str) -> Result<Option<String>> {
    if name == b"." || name == b".." {
        return Ok(None);
    }
    if name.is_empty() || name.contains(&b'/') || name.contains(&0) {
        return Err(Error::Invalid(format!(
            "{dir}: the image's filesystem holds an entry named {:?}, which cannot be a file name",
            String::from_utf8_lossy(name)
        )));
    }
    Ok(Some(String::from_utf8_lossy(name).into_owned()))
}

/// Partitions of an MBR or GPT partition table: (number, byte offset, byte
/// length), numbered as Linux numbers them (`sda1`...): an MBR's primary
/// partitions by their slot (1-4), its logical ones in an extended partition from
/// 5 in the order of their chain; a GPT's by their entry. An image without a table
/// has none.
fn partitions(reader: &FileReader<'_>, head: &[u8]) -> Result<Vec<(u32, u64, u64)>> {
    let u32le = |b: &[u8], at: usize| -> u64 {
        b.get(at..at + 4).map_or(0, |s| {
            u64::from(u32::from_le_bytes([s[0], s[1], s[2], s[3]]))
        })
    };
    let u64le = |b: &[u8], at: usize| -> u64 {
        b.get(at..at + 8).map_or(0, |s| {
            let mut a = [0u8; 8];
            a.copy_from_slice(s);
            u64::from_le_bytes(a)
        })
    };
    if head.len() < 1024 || head[510] != 0x55 || head[511] != 0xAA {
        return Ok(Vec::new());
    }
    let mut out = Vec::new();
    let protective = (0..4).any(|i| head[446 + i * 16 + 4] == 0xEE);
    if protective && &head[512..520] == b"EFI PART" {
        let entries_lba = u64le(head, 512 + 72);
        let count = u32le(head, 512 + 80).min(256);
        let size = u32le(head, 512 + 84);
        if !(128..=4096).contains(&size) {
            return Ok(out);
        }
        let mut table = vec![0u8; (count * size) as usize];
        let start = entries_lba.saturating_mul(512);
        let n = reader.read_at(start, &mut table)?;
        table.truncate(n);
        for (i, e) in table.chunks_exact(size as usize).enumerate() {
            if e[..16].iter().all(|&b| b == 0) {
                continue;
            }
            let (first, last) = (u64le(e, 32), u64le(e, 40));
            if last >= first {
                out.push((
                    i as u32 + 1,
                    first.saturating_mul(512),
                    (last - first).saturating_add(1).saturating_mul(512),
                ));
            }
        }
    } else {
        let mut extended = None;
        for i in 0..4 {
            let e = &head[446 + i * 16..446 + (i + 1) * 16];
            let (kind, first, len) = (e[4], u32le(e, 8), u32le(e, 12));
            if kind == 0 || len == 0 {
                continue;
            }
            if matches!(kind, 0x05 | 0x0F | 0x85) {
                extended.get_or_insert(first);
            } else {
                out.push((i as u32 + 1, first * 512, len * 512));
            }
        }
        if let Some(ext) = extended {
            logical_partitions(reader, ext, &mut out)?;
        }
    }
    Ok(out)
}

/// The logical partitions of an MBR's extended partition starting at sector
/// `ext`: a chain of boot records, each naming one partition (relative to itself)
/// and the next record (relative to `ext`). Numbered from 5; the chain is
/// untrusted, so it is followed at most 128 steps and never to a record seen.
fn logical_partitions(
    reader: &FileReader<'_>,
    ext: u64,
    out: &mut Vec<(u32, u64, u64)>,
) -> Result<()> {
    let u32le = |b: &[u8], at: usize| -> u64 {
        b.get(at..at + 4).map_or(0, |s| {
            u64::from(u32::from_le_bytes([s[0], s[1], s[2], s[3]]))
        })
    };
    let mut at = ext;
    let mut seen = std::collections::HashSet::new();
    let mut number = 5;
    while seen.insert(at) && seen.len() <= 128 {
        let mut ebr = [0u8; 512];
        let n = reader.read_at(at.saturating_mul(512), &mut ebr)?;
        if n < 512 || ebr[510] != 0x55 || ebr[511] != 0xAA {
            break;
        }
        let (kind, first, len) = (ebr[446 + 4], u32le(&ebr, 446 + 8), u32le(&ebr, 446 + 12));
        if kind != 0 && len > 0 {
            out.push((
                number,
                at.saturating_add(first).saturating_mul(512),
                len * 512,
            ));
            number += 1;
        }
        let next = &ebr[462..478];
        let (kind, first) = (next[4], u32le(next, 8));
        if kind == 0 || first == 0 {
            break;
        }
        at = ext.saturating_add(first);
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use crate::ops::ls::normalise;

    #[test]
    fn a_walk_enters_a_directory_once_and_no_more_than_the_inodes() {
        let mut g = super::DirGuard::new(Some(3));
        assert!(g.enter("/", Some(2)).is_ok());
        let again = g.enter("/a", Some(2)).unwrap_err().to_string();
        assert!(
            again.contains("inode 2 is reached a second time"),
            "{again}"
        );
        // Without inode numbers, only the count stops a loop.
        assert!(g.enter("/b", None).is_ok() && g.enter("/b/b", None).is_ok());
        let over = g.enter("/b/b/b", None).unwrap_err().to_string();
        assert!(
            over.contains("more directories than the filesystem has inodes (3)"),
            "{over}"
        );
    }

    #[test]
    fn paths_are_normalised() {
        assert_eq!(normalise(""), "/");
        assert_eq!(normalise("etc//hosts/"), "/etc/hosts");
        assert_eq!(normalise("/./a"), "/a");
        assert_eq!(normalise("/etc/.."), "/");
        assert_eq!(normalise(".."), "/");
        assert_eq!(normalise("/home/alice/../../.."), "/");
        assert_eq!(normalise("/a/b/../c/."), "/a/c");
    }
}
