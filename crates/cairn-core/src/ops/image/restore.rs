//! `restore --image`: an image snapshot written back to a file or a block device.
//!
//! The image is planned in windows of blocks: the blocks of a window are grouped by
//! pack and the packs queued for worker threads, which read each pack's needed blobs
//! in a few coalesced ranges, decode and verify each blob (its id is checked against
//! the plaintext), and write it at every offset that holds it. Blocks that follow
//! each other in the image are gathered into writes of up to 4 MiB whose aligned
//! bulk goes around the page cache (`O_DIRECT`): through the page cache, the
//! kernel's copies and writeback cost more CPU than decoding (an 8 GiB image: 17 s
//! of system time, against 2 s). Zero blocks are not written to a new file
//! (created sparse at full size) nor, with `--zeroed`, to a device the caller knows
//! is zeroed; otherwise runs of them are zeroed by the kernel (zero-range). The
//! target is synced before the report says it is done.
//!
//! A block device is opened with `O_EXCL`, which the kernel refuses while the
//! device is mounted or held by another user (LVM, RAID, a swap): restoring over a
//! mounted filesystem is refused, not attempted. A device smaller than the image is
//! refused before anything is written.

use crate::error::{Error, Result};
use crate::progress::Progress;
use crate::repo::{Repository, blob};
use crate::tree::chunklist::for_each_chunk;
use cairn_backend::direct::{self, AlignedBuf};
use cairn_format::BlobId;
use cairn_format::snapshot::Snapshot;
use std::collections::HashMap;
use std::fs::File;
use std::os::unix::fs::{FileExt, FileTypeExt, OpenOptionsExt};
use std::path::{Path, PathBuf};
use std::sync::Mutex;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};

/// Bytes of image planned and written at a time.
const WINDOW_BYTES: u64 = 256 << 20;

#[derive(Clone, Debug, Default)]
pub struct ImageRestoreOptions {
    /// A file (created, or replaced with `replace`), a directory (the image is
    /// written there under its name) or a block device.
    pub target: PathBuf,
    /// A device known to be zeroed: zero blocks are not written to it.
    pub zeroed: bool,
    /// Replace an existing regular file.
    pub replace: bool,
    /// Read every block back from the target and compare it with the snapshot.
    pub verify: bool,
    /// Bytes per second written to the target at most (`--write-limit`): data
    /// blocks, and zeros when they have to be written (not a device's own zero-out).
    pub write_limit: Option<u64>,
}

#[derive(Clone, Debug, Default, serde::Serialize)]
pub struct ImageRestoreReport {
    /// The snapshot restored (set by [`restore_image_snapshot`], as a file
    /// restore's report names it).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub snapshot_id: Option<cairn_format::SnapshotId>,
    #[serde(serialize_with = "crate::report::lossy_path")]
    pub target: PathBuf,
    /// `file` or `device`.
    pub target_kind: &'static str,
    pub size: u64,
    pub blocks: u64,
    /// Blocks written with data.
    pub blocks_written: u64,
    /// Zero blocks left as holes (or not written to a zeroed device).
    pub blocks_skipped_zero: u64,
    /// Zero blocks written to a device as zeros (zero-range, else zeros written).
    pub blocks_zeroed: u64,
    /// Bytes of data blocks written.
    pub bytes_written: u64,
    /// Bytes of zeros written to a device (`blocks_zeroed`).
    pub bytes_zeroed: u64,
    /// Blocks read back and found equal (with `verify`).
    pub blocks_verified: u64,
    pub duration_secs: f64,
    /// Ranges the source could not read at backup time: zeros in the image.
    pub unreadable_at_backup: Vec<(u64, u64)>,
    /// Bytes of a device target past the image's end: left as they were (what
    /// was there before, an old backup GPT header, say).
    #[serde(skip_serializing_if = "crate::report::is_zero")]
    pub device_bytes_left: u64,
}

/// Where the image goes, opened.
struct Target {
    file: File,
    /// The path the image is restored to.
    path: PathBuf,
    device: bool,
    /// A device's size (0 for a file).
    device_size: u64,
    /// For a file: what the image is written to until it is whole and synced
    /// ([`partial_path`]), then renamed to `path`. A restore that is killed or fails
    /// leaves no file under the target's name that looks like the image (a
    /// full-size sparse file would), and an existing file it replaces stays as it
    /// was until then.
    partial: Option<Partial>,
}

struct Partial {
    path: PathBuf,
    /// The mode and owner of the file replaced, given to the image before the
    /// rename, as writing over it in place kept them.
    replaces: Option<std::fs::Metadata>,
}

impl Partial {
    /// What a restore that stops before the rename did to the target, for messages.
    fn target_left(&self) -> &'static str {
        if self.replaces.is_some() {
            "is unchanged"
        } else {
            "was not created"
        }
    }
}

/// `FILE.cairn-partial`, beside the target: where an image restore to a file writes.
pub fn partial_path(target: &Path) -> PathBuf {
    let mut name = target.file_name().unwrap_or_default().to_os_string();
    name.push(".cairn-partial");
    target.with_file_name(name)
}

/// Opens (creating, or taking over one an earlier restore left) the partial file
/// beside `path`, empty and `size` bytes long. It is locked for as long as it is
/// open, so two restores to one target do not write into each other; the lock
/// goes with the process, so one left by a killed restore is simply reused.
fn open_partial(path: &Path, size: u64) -> Result<(File, PathBuf)> {
    let partial = partial_path(path);
    let file = std::fs::OpenOptions::new()
        .write(true)
        .read(true)
        .create(true)
        .mode(0o600)
        .custom_flags(libc::O_NOFOLLOW)
        .open(&partial)
        .map_err(|e| Error::io(&partial, e))?;
    // In a directory others can write (`/tmp`), someone else's file under this
    // name would receive the image and then become the target: only our own,
    // with no other name, is taken over.
    let m = file.metadata().map_err(|e| Error::io(&partial, e))?;
    {
        use std::os::unix::fs::MetadataExt;
        if !m.is_file() || m.uid() != nix::unistd::geteuid().as_raw() || m.nlink() != 1 {
            return Err(Error::Invalid(format!(
                "{} is in the way (not a file of this user's that an earlier restore left): \
                 remove it, or restore to another target",
                partial.display()
            )));
        }
    }
    match file.try_lock() {
        Ok(()) => {}
        Err(std::fs::TryLockError::WouldBlock) => {
            return Err(Error::Invalid(format!(
                "another restore is writing {} (to {}): wait for it, or restore to another target",
                partial.display(),
                path.display()
            )));
        }
        Err(std::fs::TryLockError::Error(e)) => return Err(Error::io(&partial, e)),
    }
    // Emptied first so that zero blocks become holes, not what an earlier try wrote.
    // Emptied, then sized: one that cannot take the image's size (EFBIG past
    // `ulimit -f` or the filesystem's largest file) is removed, not left empty.
    if let Err(e) = file.set_len(0).and_then(|()| file.set_len(size)) {
        let _ = std::fs::remove_file(&partial);
        return Err(Error::io(&partial, e));
    }
    Ok((file, partial))
}

impl Target {
    /// Gives the image its name: the partial file (synced) takes the replaced
    /// file's mode and owner where it had one, is renamed over the target, and the
    /// directory is synced so that the name survives a crash.
    fn commit(&self) -> Result<()> {
        let Some(partial) = &self.partial else {
            return Ok(());
        };
        if let Some(old) = &partial.replaces {
            use std::os::unix::fs::{MetadataExt, PermissionsExt};
            use xattr::FileExt;
            // Best effort: a user who may replace a root-owned file's content in
            // place may still not give it away.
            let _ = std::os::unix::fs::fchown(&self.file, Some(old.uid()), Some(old.gid()));
            let _ = self
                .file
                .set_permissions(std::fs::Permissions::from_mode(old.mode() & 0o7777));
            // Its extended attributes too (an SELinux label a hypervisor needs, an
            // ACL), after the mode, which would change an ACL's mask.
            if let Ok(names) = xattr::list(&self.path) {
                for name in names {
                    if let Ok(Some(v)) = xattr::get(&self.path, &name) {
                        let _ = self.file.set_xattr(&name, &v);
                    }
                }
            }
        }
        std::fs::rename(&partial.path, &self.path).map_err(|e| {
            Error::Invalid(format!(
                "the image is complete in {}, but it could not be renamed to {}: {e}",
                partial.path.display(),
                self.path.display()
            ))
        })?;
        // Best effort: the image itself is synced; some file systems (FUSE, NFS)
        // cannot sync a directory.
        let dir = match self.path.parent() {
            Some(d) if !d.as_os_str().is_empty() => d,
            _ => Path::new("."),
        };
        let _ = File::open(dir).and_then(|d| d.sync_all());
        Ok(())
    }

    /// Removes the partial file of a restore that stopped with nothing worth
    /// keeping in it.
    fn abandon(&self) {
        if let Some(p) = &self.partial {
            let _ = std::fs::remove_file(&p.path);
        }
    }
}

/// The loop devices (`/dev/loopN`) whose backing file is the file `m` describes.
pub(crate) fn loop_devices_backed_by(m: &std::fs::Metadata) -> Vec<String> {
    use std::os::unix::fs::MetadataExt;
    let Ok(dir) = std::fs::read_dir("/sys/block") else {
        return Vec::new();
    };
    let mut out = Vec::new();
    for e in dir.flatten() {
        let name = e.file_name().to_string_lossy().into_owned();
        if !name.starts_with("loop") {
            continue;
        }
        // The kernel knows the file by number too; the path may have moved.
        let read = |f: &str| std::fs::read_to_string(e.path().join("loop").join(f));
        let by_number = match (read("backing_inode"), read("backing_dev")) {
            (Ok(ino), Ok(dev)) => Some(
                ino.trim().parse::<u64>().ok() == Some(m.ino())
                    && dev.trim().parse::<u64>().ok() == Some(m.dev()),
            ),
            _ => None,
        };
        // A block device (a loop device stacked on the target disk) is one disk
        // under any of its nodes: known by its device number.
        let same = |b: &std::fs::Metadata| {
            (b.ino() == m.ino() && b.dev() == m.dev())
                || (m.file_type().is_block_device()
                    && b.file_type().is_block_device()
                    && b.rdev() == m.rdev())
        };
        let backed = by_number == Some(true)
            || read("backing_file").is_ok_and(|p| {
                std::fs::metadata(p.trim_end().trim_end_matches(" (deleted)"))
                    .is_ok_and(|b| same(&b))
            });
        if backed {
            out.push(format!("/dev/{name}"));
        }
    }
    out.sort();
    out
}

/// Refuses a target a loop device is set up over (a file behind one, or a disk
/// with one stacked on it): writing under it corrupts what is used through it.
fn refuse_if_looped(path: &Path, m: &std::fs::Metadata) -> Result<()> {
    let loops = loop_devices_backed_by(m);
    if loops.is_empty() {
        return Ok(());
    }
    Err(Error::Invalid(format!(
        "{} is the backing {} of {}: refusing to write an image over it; unmount and \
         detach it first (losetup -d)",
        path.display(),
        if m.is_file() { "file" } else { "device" },
        loops.join(", ")
    )))
}

/// Whether the kernel marks the block device read-only (`/sys/dev/block/M:N/ro`,
/// what `BLKROGET` answers): writes would all fail, so the restore stops before
/// the first.
fn device_is_read_only(m: &std::fs::Metadata) -> bool {
    use std::os::unix::fs::MetadataExt;
    let rdev = m.rdev();
    let (major, minor) = (libc::major(rdev), libc::minor(rdev));
    std::fs::read_to_string(format!("/sys/dev/block/{major}:{minor}/ro"))
        .is_ok_and(|v| v.trim() == "1")
}

fn open_target(opts: &ImageRestoreOptions, name: &[u8], size: u64) -> Result<Target> {
    let mut path = opts.target.clone();
    let named = path.as_os_str().as_encoded_bytes();
    if named.ends_with(b"/") && !path.is_dir() {
        // `newdir/`: a directory that is not there; the image would be written
        // as `newdir` and fail at the end (QA).
        return Err(Error::Invalid(format!(
            "{}: no such directory (the image is restored into an existing directory, \
             or to a file named without a final /)",
            path.display()
        )));
    }
    // The name a directory target gets from the snapshot is the snapshot's, not
    // the user's: a symlink found there (planted in a shared directory) is not
    // followed out of it.
    let mut from_snapshot = false;
    if std::fs::metadata(&path).is_ok_and(|m| m.is_dir()) {
        // The name comes from the snapshot: one like `../x` or `/etc/x` would
        // write outside the directory asked for.
        if !cairn_format::tree::Node::name_is_safe(name) {
            return Err(Error::Invalid(format!(
                "the snapshot names its image {:?}, which is no file name: give the target as a file path",
                String::from_utf8_lossy(name)
            )));
        }
        path = path.join(<std::ffi::OsStr as std::os::unix::ffi::OsStrExt>::from_bytes(name));
        from_snapshot = true;
    }
    if let Ok(l) = std::fs::symlink_metadata(&path)
        && l.file_type().is_symlink()
    {
        if from_snapshot {
            return Err(Error::Invalid(format!(
                "{} is a symlink, at the name the snapshot gives its image: not followed \
                 out of the target directory; give the target as a file path",
                path.display()
            )));
        }
        if let Some(uid) = crate::ops::restore::foreign_symlink_owner(&l) {
            return Err(Error::Invalid(format!(
                "{} is a symlink of another user's (uid {uid}): name the file or device itself",
                path.display()
            )));
        }
    }
    match std::fs::metadata(&path) {
        Ok(m) if m.file_type().is_block_device() => {
            // O_EXCL on a block device: EBUSY while it is mounted or otherwise held.
            let file = std::fs::OpenOptions::new()
                .write(true)
                .read(true)
                .custom_flags(libc::O_EXCL)
                .open(&path)
                .map_err(|e| {
                    if e.raw_os_error() == Some(libc::EBUSY) {
                        Error::Invalid(format!(
                            "{} is in use (mounted, or held by LVM, RAID or swap): refusing to write an image over it; unmount it first",
                            path.display()
                        ))
                    } else {
                        Error::io(&path, e)
                    }
                })?;
            // A loop device over this disk (a filesystem of one of its
            // partitions mounted through it) does not hold it for O_EXCL.
            refuse_if_looped(&path, &m)?;
            if device_is_read_only(&m) {
                return Err(Error::Invalid(format!(
                    "{} is read-only: nothing was written",
                    path.display()
                )));
            }
            let dev_size =
                super::super::backup::image_source_size(&file).map_err(|e| Error::io(&path, e))?;
            if dev_size < size {
                return Err(Error::Invalid(format!(
                    "{} holds {dev_size} bytes, smaller than the image ({size} bytes): nothing was written",
                    path.display()
                )));
            }
            // As for a file that exists: a mistyped /dev/sdX, not mounted, would
            // be overwritten without a word (QA).
            if !opts.replace {
                return Err(Error::Invalid(format!(
                    "{} is a block device of {}: the image ({}) is written over what it \
                     holds; give --overwrite always to do so (nothing was written)",
                    path.display(),
                    crate::units::bytes(dev_size, 1),
                    crate::units::bytes(size, 1)
                )));
            }
            Ok(Target {
                file,
                path,
                device: true,
                device_size: dev_size,
                partial: None,
            })
        }
        Ok(m) if m.is_file() => {
            // A symlink to an image file: the image goes where it points, as
            // writing through it did (the rename would replace the link itself).
            if std::fs::symlink_metadata(&path).is_ok_and(|l| l.file_type().is_symlink()) {
                path = std::fs::canonicalize(&path).map_err(|e| Error::io(&path, e))?;
            }
            // A file behind a loop device is a disk someone uses (perhaps mounted):
            // writing it under them corrupts both. O_EXCL cannot tell for a file.
            refuse_if_looped(&path, &m)?;
            if !opts.replace {
                return Err(Error::Invalid(format!(
                    "{} exists: give --overwrite always to replace it, or another target",
                    path.display()
                )));
            }
            let (file, partial) = open_partial(&path, size)?;
            Ok(Target {
                file,
                path,
                device: false,
                device_size: 0,
                partial: Some(Partial {
                    path: partial,
                    replaces: Some(m),
                }),
            })
        }
        Ok(_) => Err(Error::Invalid(format!(
            "{} is neither a regular file nor a block device",
            path.display()
        ))),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
            // A symlink to nothing: replacing it was never asked for.
            if std::fs::symlink_metadata(&path).is_ok() {
                return Err(Error::Invalid(format!(
                    "{} is a symlink to a file that does not exist: remove it, or give \
                     another target",
                    path.display()
                )));
            }
            // The file is made, not the directories above it (a mistyped path).
            let dir = path.parent().filter(|d| !d.as_os_str().is_empty());
            // Nor a file in /dev (a mistyped device: /dev is memory, QA).
            if dir
                .and_then(|d| std::fs::canonicalize(d).ok())
                .is_some_and(|d| d.starts_with("/dev"))
            {
                return Err(Error::Invalid(format!(
                    "{}: no such device (a new file is not made in /dev; give an existing \
                     block device, or a file elsewhere)",
                    path.display()
                )));
            }
            if let Some(dir) = dir
                && !dir.is_dir()
            {
                return Err(Error::Invalid(format!(
                    "{}: the directory {} does not exist (the image file is created, not \
                     the directories above it)",
                    path.display(),
                    dir.display()
                )));
            }
            let (file, partial) = open_partial(&path, size)?;
            Ok(Target {
                file,
                path,
                device: false,
                device_size: 0,
                partial: Some(Partial {
                    path: partial,
                    replaces: None,
                }),
            })
        }
        Err(e) => Err(Error::io(&path, e)),
    }
}

/// One blob a window needs, and every image offset that holds it.
struct Need {
    offset: u32,
    length: u32,
    raw_length: u32,
    compression: cairn_format::pack::BlobCompression,
    id: BlobId,
    at: Vec<u64>,
}

pub fn restore_image(
    repo: &Repository,
    snap: &Snapshot,
    opts: &ImageRestoreOptions,
    progress: &Progress,
) -> Result<ImageRestoreReport> {
    let start = std::time::Instant::now();
    let (info, node) = super::image_node(repo, snap)?;
    if !std::fs::metadata(&opts.target).is_ok_and(|m| m.file_type().is_block_device()) {
        crate::ops::restore::refuse_target_in_repository(repo, &opts.target)?;
    }
    let target = open_target(opts, &node.name, info.size)?;
    let outcome = write_image(repo, &info, &node, &target, opts, progress);
    match &outcome {
        Ok(_) => target.commit()?,
        // What could be restored is kept for salvage, under the partial name.
        Err(Error::Incomplete(_)) => {}
        Err(_) => target.abandon(),
    }
    let mut report = outcome?;
    report.duration_secs = start.elapsed().as_secs_f64();
    Ok(report)
}

/// Writes the image into the opened target (the partial file, for a file) and
/// syncs it; verifies it when asked.
fn write_image(
    repo: &Repository,
    info: &cairn_format::snapshot::ImageInfo,
    node: &cairn_format::tree::Node,
    target: &Target,
    opts: &ImageRestoreOptions,
    progress: &Progress,
) -> Result<ImageRestoreReport> {
    let zero_id = repo.key().blob_id(&vec![0u8; info.block_size as usize]);
    let write_zeros = target.device && !opts.zeroed;
    progress.set_total(Some(info.size), Some(1));

    let mut report = ImageRestoreReport {
        target: target.path.clone(),
        target_kind: if target.device { "device" } else { "file" },
        size: info.size,
        unreadable_at_backup: info.unreadable.clone(),
        device_bytes_left: target.device_size.saturating_sub(info.size),
        ..Default::default()
    };
    let failed: Mutex<Vec<(u64, u64, String)>> = Mutex::new(Vec::new());
    let written = AtomicU64::new(0);
    let blocks_written = AtomicU64::new(0);
    let blocks_zeroed = AtomicU64::new(0);
    let bytes_zeroed = AtomicU64::new(0);
    let limit = opts
        .write_limit
        .filter(|&r| r > 0)
        .map(cairn_backend::Limiter::new);
    let direct = super::reopen_direct(&target.file, true);
    let write_failed = std::sync::atomic::AtomicBool::new(false);
    let lost = std::sync::atomic::AtomicBool::new(false);
    let first_refusal = Mutex::new(None);
    let sink = Sink {
        file: &target.file,
        direct: direct.as_ref(),
        block_size: info.block_size,
        progress,
        failed: &failed,
        write_failed: &write_failed,
        lost: &lost,
        first_refusal: &first_refusal,
        written: &written,
        blocks_written: &blocks_written,
        blocks_zeroed: &blocks_zeroed,
        bytes_zeroed: &bytes_zeroed,
        limit: limit.as_ref(),
    };
    let mut pos = 0u64;
    // The planner (this thread) groups each window's blocks by pack and queues the
    // packs; the workers read, decode and write them. No window waits for the last
    // pack of the one before.
    let threads = crate::ops::restore::execute::threads();
    let (tx, rx) = crossbeam_channel::bounded::<Job>(threads * 4);
    let r = std::thread::scope(|s| -> Result<()> {
        for _ in 0..threads {
            let (rx, sink) = (rx.clone(), &sink);
            s.spawn(move || work(repo, sink, rx));
        }
        drop(rx);
        let mut window: Vec<(u64, BlobId, u64)> = Vec::new();
        let mut window_bytes = 0u64;
        let mut flush = |window: &mut Vec<(u64, BlobId, u64)>| -> Result<()> {
            progress.check_cancelled()?;
            // The target refuses writes (a full disk): the rest would fail too.
            if write_failed.load(Ordering::Relaxed) {
                return Err(Error::Invalid(TARGET_REFUSED.into()));
            }
            let (needs, zeros, missing) = plan_window(repo, window, &zero_id, write_zeros);
            if !missing.is_empty() {
                lost.store(true, Ordering::Relaxed);
            }
            crate::lock(&failed).extend(missing);
            report.blocks_skipped_zero += window.len() as u64
                - zeros.len() as u64
                - needs
                    .iter()
                    .map(|(_, v)| v.iter().map(|n| n.at.len() as u64).sum::<u64>())
                    .sum::<u64>();
            window.clear();
            let stopped = || Error::Invalid("the image restore's workers stopped".into());
            if !zeros.is_empty() {
                tx.send(Job::Zeros(zeros)).map_err(|_| stopped())?;
            }
            for (pack, needs) in needs {
                tx.send(Job::Pack(pack, needs)).map_err(|_| stopped())?;
            }
            Ok(())
        };
        for_each_chunk(repo, &node.content, &mut |c| {
            window.push((pos, c.id, c.length));
            pos += c.length;
            window_bytes += c.length;
            report.blocks += 1;
            if window_bytes >= WINDOW_BYTES {
                flush(&mut window)?;
                window_bytes = 0;
            }
            Ok(())
        })?;
        flush(&mut window)?;
        drop(tx);
        Ok(())
    });
    let stopped_early = match r {
        Err(Error::Invalid(m)) if m == TARGET_REFUSED => true,
        r => {
            r?;
            false
        }
    };
    // Stopped (Ctrl-C): even when every block happened to be under way, the
    // restore was not asked to finish (QA: it went on at full speed past its
    // --limit-download and said it restored the image).
    progress.check_cancelled()?;
    let write_failed = write_failed.into_inner();
    if !stopped_early && pos != info.size {
        return Err(Error::damaged(
            "image snapshot",
            cairn_format::FormatError::malformed("image", "its blocks do not add up to its size"),
        ));
    }
    if !write_failed {
        target
            .file
            .sync_all()
            .map_err(|e| Error::io(&target.path, e))?;
    }
    report.bytes_written = written.load(Ordering::Relaxed);
    report.blocks_written = blocks_written.load(Ordering::Relaxed);
    report.blocks_zeroed = blocks_zeroed.load(Ordering::Relaxed);
    report.bytes_zeroed = bytes_zeroed.load(Ordering::Relaxed);
    let failed = failed.into_inner().unwrap_or_else(|e| e.into_inner());
    let refusal = first_refusal
        .into_inner()
        .unwrap_or_else(|e| e.into_inner());
    if let Some((off, len, why)) = failed.iter().min_by_key(|f| f.0) {
        let head = if let Some((at, why)) = refusal {
            // Stopped at the first refusal: a count of blocks would say little.
            format!(
                "the target refused a write at byte {at} after {} of the image's {} were \
                 written ({why})",
                crate::units::bytes(report.bytes_written, 0),
                crate::units::bytes(info.size, 0)
            )
        } else {
            format!(
                "{} blocks could not be restored (the first at bytes {off}..{}: {why}){}",
                failed.len(),
                off + len,
                // As a restore of files advises (QA: an image restore of a
                // missing pack said only "could not be read").
                if lost.load(Ordering::Relaxed) {
                    "; `cairn check --read-data` says what the repository lacks or holds \
                     damaged, and what repairs it (`cairn repair index` when index files \
                     were lost)"
                } else {
                    ""
                }
            )
        };
        return Err(match &target.partial {
            // The target refused writes (a full disk): what was written is no
            // use to keep, and keeping it would hold the space.
            Some(p) if write_failed => Error::Invalid(format!(
                "{head}; {} is removed and {} {}",
                p.path.display(),
                target.path.display(),
                p.target_left()
            )),
            Some(p) => Error::Incomplete(format!(
                "{head}; the incomplete image is left at {}, and {} {}",
                p.path.display(),
                target.path.display(),
                p.target_left()
            )),
            None => Error::Incomplete(format!("{head}; {} is incomplete", target.path.display())),
        });
    }
    if opts.verify {
        report.blocks_verified = verify(repo, target, node, progress)?;
    }
    Ok(report)
}

impl crate::ops::restore::execute::PackSpan for Need {
    fn span(&self) -> (u32, u32) {
        (self.offset, self.length)
    }
}

type PackNeeds = Vec<(u32, Vec<Need>)>;
/// Byte ranges of the image, with why they failed.
type Failed = Vec<(u64, u64, String)>;

/// Groups a window's blocks by pack (each blob once, with all its offsets); zero
/// blocks to write, and blocks the index does not know.
fn plan_window(
    repo: &Repository,
    window: &[(u64, BlobId, u64)],
    zero_id: &BlobId,
    write_zeros: bool,
) -> (PackNeeds, Vec<(u64, u64)>, Failed) {
    let mut by_pack: HashMap<u32, HashMap<BlobId, Need>> = HashMap::new();
    let mut zeros = Vec::new();
    let mut missing = Vec::new();
    for &(at, id, len) in window {
        if id == *zero_id {
            if write_zeros {
                zeros.push((at, len));
            }
            continue;
        }
        let Some(loc) = repo.index().get(&id) else {
            missing.push((at, len, format!("blob {} is not in the index", id.short())));
            continue;
        };
        let pack = crate::index::MasterIndex::pack_number_of(&loc);
        by_pack
            .entry(pack)
            .or_default()
            .entry(id)
            .or_insert_with(|| Need {
                offset: loc.offset,
                length: loc.length,
                raw_length: loc.raw_length,
                compression: loc.compression,
                id,
                at: Vec::new(),
            })
            .at
            .push(at);
    }
    let mut packs: PackNeeds = by_pack
        .into_iter()
        .map(|(p, m)| {
            let mut v: Vec<Need> = m.into_values().collect();
            v.sort_by_key(|n| n.offset);
            (p, v)
        })
        .collect();
    packs.sort_by_key(|(p, _)| *p);
    (packs, zeros, missing)
}

/// A worker's job: one pack's blobs of a window, or a window's zero blocks.
enum Job {
    Pack(u32, Vec<Need>),
    Zeros(Vec<(u64, u64)>),
}

/// How the planner stops once the target refused a write.
const TARGET_REFUSED: &str = "the image restore's target refused a write";

/// Where the workers write, and what they count.
struct Sink<'a> {
    file: &'a File,
    /// The target opened again with `O_DIRECT`, where it can be.
    direct: Option<&'a File>,
    block_size: u32,
    progress: &'a Progress,
    failed: &'a Mutex<Failed>,
    /// Set when the target refused a write (a full disk), not the repository a read.
    write_failed: &'a std::sync::atomic::AtomicBool,
    /// Set when a block's data is missing from the repository or damaged there.
    lost: &'a std::sync::atomic::AtomicBool,
    /// The first write the target refused: where, and why.
    first_refusal: &'a Mutex<Option<(u64, String)>>,
    written: &'a AtomicU64,
    blocks_written: &'a AtomicU64,
    blocks_zeroed: &'a AtomicU64,
    bytes_zeroed: &'a AtomicU64,
    limit: Option<&'a cairn_backend::Limiter>,
}

impl Sink<'_> {
    fn fail(&self, at: u64, len: u64, why: String) {
        crate::lock(self.failed).push((at, len, why));
    }

    fn fail_write(&self, at: u64, len: u64, why: String) {
        self.write_failed.store(true, Ordering::Relaxed);
        crate::lock(self.first_refusal).get_or_insert_with(|| (at, why.clone()));
        self.fail(at, len, why);
    }

    fn wrote(&self, bytes: u64, blocks: u64) {
        self.written.fetch_add(bytes, Ordering::Relaxed);
        self.blocks_written.fetch_add(blocks, Ordering::Relaxed);
        self.progress.bytes_done(bytes);
    }

    /// Zero blocks written to a device: counted apart from the data.
    fn zeroed(&self, bytes: u64, blocks: u64) {
        self.bytes_zeroed.fetch_add(bytes, Ordering::Relaxed);
        self.blocks_zeroed.fetch_add(blocks, Ordering::Relaxed);
        self.progress.bytes_done(bytes);
    }
}

/// Blocks that follow each other in the image, gathered into one write: a pack
/// holds the image's blocks mostly in order, so a few large writes replace one
/// per block, and the aligned bulk of each goes around the page cache.
struct RunWriter<'a> {
    sink: &'a Sink<'a>,
    /// The run, gathered 4 KiB-aligned so that it goes to the device without a copy.
    buf: AlignedBuf,
    len: usize,
    at: u64,
    blocks: u64,
    scratch: AlignedBuf,
    /// Cleared when the target refuses a direct write.
    direct: bool,
}

/// Bytes gathered into one write at most.
const RUN_BYTES: usize = 4 << 20;

impl<'a> RunWriter<'a> {
    fn new(sink: &'a Sink<'a>) -> Self {
        RunWriter {
            sink,
            buf: AlignedBuf::default(),
            len: 0,
            at: 0,
            blocks: 0,
            scratch: AlignedBuf::default(),
            direct: true,
        }
    }

    fn put(&mut self, data: &[u8], at: u64) {
        if self.len > 0 && (at != self.at + self.len as u64 || self.len + data.len() > RUN_BYTES) {
            self.flush();
        }
        if data.len() > RUN_BYTES {
            // Not a block of this repository's sizes; written on its own.
            let sink = self.sink;
            match direct::write_at(sink.file, None, &mut self.scratch, data, at) {
                Ok(_) => sink.wrote(data.len() as u64, 1),
                Err(e) => sink.fail_write(at, data.len() as u64, format!("write failed: {e}")),
            }
            return;
        }
        if self.len == 0 {
            self.at = at;
        }
        self.buf.aligned_mut(RUN_BYTES)[self.len..self.len + data.len()].copy_from_slice(data);
        self.len += data.len();
        self.blocks += 1;
    }

    fn flush(&mut self) {
        if self.len == 0 {
            return;
        }
        let sink = self.sink;
        let direct = sink.direct.filter(|_| self.direct);
        let len = self.len as u64;
        let data = &self.buf.aligned_mut(RUN_BYTES)[..self.len];
        match direct::write_at(sink.file, direct, &mut self.scratch, data, self.at) {
            Ok(ok) => {
                self.direct &= ok;
                sink.wrote(len, self.blocks);
                if let Some(l) = sink.limit {
                    l.take(len);
                }
            }
            Err(e) => sink.fail_write(self.at, len, format!("write failed: {e}")),
        }
        self.len = 0;
        self.blocks = 0;
    }
}

/// A worker: reads each pack it is given in a few coalesced ranges, decodes and
/// verifies every blob once and writes it at every offset that holds it.
fn work(repo: &Repository, sink: &Sink<'_>, jobs: crossbeam_channel::Receiver<Job>) {
    let max_range = crate::ops::restore::execute::range_limit(repo);
    let mut w = RunWriter::new(sink);
    for job in jobs {
        let (pack_no, needs) = match job {
            Job::Zeros(zeros) => {
                for (at, len) in super::merge_ranges(zeros.iter().copied()) {
                    match zero_range(sink.file, at, len, sink.limit) {
                        Ok(()) => sink.zeroed(len, len.div_ceil(u64::from(sink.block_size))),
                        Err(e) => sink.fail_write(at, len, format!("writing zeros failed: {e}")),
                    }
                }
                continue;
            }
            Job::Pack(p, n) => (p, n),
        };
        if sink.progress.is_cancelled() {
            for n in &needs {
                for &at in &n.at {
                    sink.fail(at, u64::from(n.raw_length), "cancelled".into());
                }
            }
            continue;
        }
        let pack = repo.index().pack_by_number(pack_no);
        for range in crate::ops::restore::execute::ranges(&needs, max_range) {
            if sink.progress.is_cancelled() {
                for n in range {
                    for &at in &n.at {
                        sink.fail(at, u64::from(n.raw_length), "cancelled".into());
                    }
                }
                continue;
            }
            let (first, end) = crate::ops::restore::execute::range_bounds(range);
            let whole = repo.read_pack_range(&pack, first.into(), (end - first).into());
            for n in range {
                // A slice of the range read (no copy), or the blob alone when the
                // range could not be read whole.
                let (at, len) = ((n.offset - first) as usize, n.length as usize);
                let sealed: Result<std::borrow::Cow<'_, [u8]>> = match &whole {
                    Ok(b) => b
                        .get(at..at + len)
                        .map(std::borrow::Cow::Borrowed)
                        .ok_or_else(|| {
                            Error::Invalid(format!(
                                "a read of pack {} came back short",
                                pack.short()
                            ))
                        }),
                    Err(_) => repo
                        .read_pack_range(&pack, n.offset.into(), n.length.into())
                        .map(std::borrow::Cow::Owned),
                };
                let plain = sealed
                    .and_then(|s| blob::decode(repo.key(), &n.id, &s, n.raw_length, n.compression))
                    .map_err(|e| {
                        (
                            format!("pack {}: {e}", pack.short()),
                            e.is_lost_in_storage(),
                        )
                    })
                    // A copy that does not hold its blob: another may.
                    .or_else(|e| {
                        let tried = |l: &crate::index::BlobLocation| {
                            l.is_entry(pack_no, n.offset, n.length, n.raw_length, n.compression)
                        };
                        repo.read_other_copy(&n.id, tried).ok_or(e)
                    });
                match plain {
                    Ok(p) => {
                        for &at in &n.at {
                            w.put(&p, at);
                        }
                    }
                    Err((why, lost)) => {
                        // Said only once no other copy could be read either.
                        if lost {
                            sink.lost.store(true, Ordering::Relaxed);
                        }
                        for &at in &n.at {
                            sink.fail(at, u64::from(n.raw_length), why.clone());
                        }
                    }
                }
            }
        }
        w.flush();
    }
}

/// Zeros `[at, at + len)` of a device: the kernel's zero-out (`fallocate` with
/// `FALLOC_FL_ZERO_RANGE`: write-zeroes or discard on devices that have them, no
/// data through memory), else written zeros a MiB at a time.
fn zero_range(
    f: &File,
    at: u64,
    len: u64,
    limit: Option<&cairn_backend::Limiter>,
) -> std::io::Result<()> {
    let zeroed = nix::fcntl::fallocate(
        f,
        nix::fcntl::FallocateFlags::FALLOC_FL_ZERO_RANGE,
        at as libc::off_t,
        len as libc::off_t,
    );
    if zeroed.is_ok() {
        return Ok(());
    }
    let zero = vec![0u8; 1 << 20];
    let mut done = 0u64;
    while done < len {
        let n = (len - done).min(zero.len() as u64) as usize;
        f.write_all_at(&zero[..n], at + done)?;
        if let Some(l) = limit {
            l.take(n as u64);
        }
        done += n as u64;
    }
    Ok(())
}

/// Reads the whole target back and compares every block with the snapshot's id.
fn verify(
    repo: &Repository,
    target: &Target,
    node: &cairn_format::tree::Node,
    progress: &Progress,
) -> Result<u64> {
    let mut blocks: Vec<(u64, BlobId, u64)> = Vec::new();
    let mut pos = 0;
    let bad: Mutex<Option<u64>> = Mutex::new(None);
    let checked = AtomicU64::new(0);
    let check = |blocks: &mut Vec<(u64, BlobId, u64)>| {
        let next = AtomicUsize::new(0);
        let per = 256usize;
        std::thread::scope(|s| {
            for _ in 0..crate::threads::cores() + 1 {
                s.spawn(|| {
                    let mut buf = Vec::new();
                    loop {
                        let i = next.fetch_add(per, Ordering::Relaxed);
                        let Some(part) = blocks.get(i..(i + per).min(blocks.len())) else {
                            return;
                        };
                        if part.is_empty() {
                            return;
                        }
                        for &(at, id, len) in part {
                            buf.resize(len as usize, 0);
                            let same = target.file.read_exact_at(&mut buf, at).is_ok()
                                && repo.key().blob_id(&buf) == id;
                            if same {
                                checked.fetch_add(1, Ordering::Relaxed);
                            } else {
                                let mut b = crate::lock(&bad);
                                *b = Some(b.map_or(at, |x: u64| x.min(at)));
                            }
                        }
                    }
                });
            }
        });
        blocks.clear();
    };
    for_each_chunk(repo, &node.content, &mut |c| {
        blocks.push((pos, c.id, c.length));
        pos += c.length;
        if blocks.len() >= 65536 {
            progress.check_cancelled()?;
            check(&mut blocks);
        }
        Ok(())
    })?;
    check(&mut blocks);
    if let Some(at) = bad.into_inner().unwrap_or_else(|e| e.into_inner()) {
        return Err(Error::Invalid(format!(
            "verify: {} differs from the snapshot (first at byte {at})",
            target.path.display()
        )));
    }
    Ok(checked.load(Ordering::Relaxed))
}

/// Whether `path` is a block device (for the CLI's messages).
pub fn is_block_device(path: &Path) -> bool {
    std::fs::metadata(path).is_ok_and(|m| m.file_type().is_block_device())
}

/// [`restore_image`] through a session (the CLI's and the server's entry point).
pub fn restore_image_snapshot<A: crate::session::Access>(
    session: &crate::session::Session<A>,
    snapshot: &(cairn_format::SnapshotId, Snapshot),
    opts: &ImageRestoreOptions,
) -> Result<ImageRestoreReport> {
    let progress = session.progress();
    progress.phase(crate::progress::Phase::Restore);
    let mut report = restore_image(session.repo(), &snapshot.1, opts, progress)?;
    report.snapshot_id = Some(snapshot.0);
    Ok(report)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn opts(target: &Path) -> ImageRestoreOptions {
        ImageRestoreOptions {
            target: target.to_path_buf(),
            ..Default::default()
        }
    }

    #[test]
    fn a_directory_target_takes_only_a_plain_name_from_the_snapshot() {
        let dir = tempfile::tempdir().unwrap();
        let inner = dir.path().join("into");
        std::fs::create_dir(&inner).unwrap();
        for bad in [&b"../escape"[..], b"/abs", b"..", b"", b"a\0b"] {
            let e = open_target(&opts(&inner), bad, 10).err().expect("refused");
            assert!(e.to_string().contains("no file name"), "{e}");
        }
        assert!(!dir.path().join("escape.cairn-partial").exists());
        let t = open_target(&opts(&inner), b"disk.raw", 10).unwrap();
        assert_eq!(t.path, inner.join("disk.raw"));
        assert!(inner.join("disk.raw.cairn-partial").exists());
        t.commit().unwrap();
        assert_eq!(std::fs::metadata(inner.join("disk.raw")).unwrap().len(), 10);
        assert!(!inner.join("disk.raw.cairn-partial").exists());
    }

    /// Through a symlink to an image file, the file it points at is replaced,
    /// not the link.
    #[test]
    fn a_symlinked_target_file_is_replaced_where_it_lies() {
        let dir = tempfile::tempdir().unwrap();
        let real = dir.path().join("v3.raw");
        std::fs::write(&real, b"old").unwrap();
        let link = dir.path().join("current.raw");
        std::os::unix::fs::symlink("v3.raw", &link).unwrap();
        let mut o = opts(&link);
        o.replace = true;
        let t = open_target(&o, b"x", 7).unwrap();
        assert!(dir.path().join("v3.raw.cairn-partial").exists());
        t.commit().unwrap();
        assert!(
            std::fs::symlink_metadata(&link)
                .unwrap()
                .file_type()
                .is_symlink()
        );
        assert_eq!(std::fs::metadata(&real).unwrap().len(), 7);
        // A symlink to nothing is not replaced.
        let dangling = dir.path().join("gone.raw");
        std::os::unix::fs::symlink("nowhere.raw", &dangling).unwrap();
        let e = open_target(&opts(&dangling), b"x", 7)
            .err()
            .expect("refused");
        assert!(
            e.to_string()
                .contains("symlink to a file that does not exist"),
            "{e}"
        );
    }

    #[test]
    fn a_partial_file_is_taken_over_only_when_it_is_ours_and_not_in_use() {
        let dir = tempfile::tempdir().unwrap();
        let target = dir.path().join("disk.raw");
        let partial = partial_path(&target);
        // One an earlier run left (with old bytes) is emptied and reused.
        std::fs::write(&partial, b"old bytes").unwrap();
        let t = open_target(&opts(&target), b"x", 4).unwrap();
        assert_eq!(std::fs::read(&partial).unwrap(), vec![0u8; 4]);
        // While it is open, a second restore to the same target is refused.
        let e = open_target(&opts(&target), b"x", 4).err().expect("refused");
        assert!(e.to_string().contains("another restore"), "{e}");
        t.abandon();
        drop(t);
        assert!(!partial.exists());
        // A name with another link (someone's file) or a symlink is not written.
        let other = dir.path().join("other");
        std::fs::write(&other, b"theirs").unwrap();
        std::fs::hard_link(&other, &partial).unwrap();
        let e = open_target(&opts(&target), b"x", 4).err().expect("refused");
        assert!(e.to_string().contains("in the way"), "{e}");
        std::fs::remove_file(&partial).unwrap();
        std::os::unix::fs::symlink(&other, &partial).unwrap();
        assert!(open_target(&opts(&target), b"x", 4).is_err());
        assert_eq!(std::fs::read(&other).unwrap(), b"theirs");
    }
}
