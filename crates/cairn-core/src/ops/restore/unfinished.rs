//! The mark a restore leaves in its target while it runs, so that the next one
//! knows what to distrust.
//!
//! A restore that is cancelled, killed or stopped by an error leaves files behind
//! that are not the snapshot's yet: cut short, or whole but without their mode and
//! times. They carry the time they were written, which `--overwrite if-newer` takes
//! for "newer than the snapshot", and `never` keeps whatever is there: "run it
//! again to finish" would finish nothing. So a restore first leaves the file
//! [`MARK`] in its target, and removes it when it left no file cut short (an
//! attribute or a device it could not set is no unfinished work) and either the
//! mark was its own or it restored everything (no include or exclude;
//! `--image-fs /`): a restore of a part after an unfinished one says nothing of
//! the rest. The next restore that finds
//! it treats every entry changed since the mark's time as `if-changed` would when
//! `--overwrite` is `never` or `if-newer`: rewritten unless it is the snapshot's
//! (size and time, else content). What had been there before the unfinished
//! restore keeps the rule asked for. `restore --image-fs` does the same.

use super::sys;
use std::ffi::CStr;
use std::io::Write;
use std::os::fd::BorrowedFd;

/// The mark's name, in the target directory.
pub(crate) const MARK: &CStr = c".cairn-restore-unfinished";

/// The time of the mark an unfinished restore left in the target `root`, if any.
pub(crate) fn since(root: BorrowedFd<'_>) -> Option<(i64, u32)> {
    sys::stat_at(root, MARK)
        .ok()
        .filter(|st| st.kind() == libc::S_IFREG)
        .map(|st| st.mtime)
}

/// What a restore into `target` says when it finds a mark of time `t`.
pub(crate) fn notice(target: &std::path::Path, t: (i64, u32)) -> String {
    format!(
        "a restore into {} that started at {} did not finish (or restored only part of a \
         snapshot): what changed there since is rewritten unless it matches the snapshot, \
         even with --overwrite never or if-newer",
        target.display(),
        crate::time::local_display(&crate::time::format_unix(t.0, t.1))
    )
}

/// Leaves the mark in `root` (a mark already there stays, with its older time).
pub(crate) fn mark(root: BorrowedFd<'_>) -> std::io::Result<()> {
    match super::target::create_file(root, MARK) {
        Ok(mut f) => writeln!(
            f,
            "A cairn restore into this directory has not finished.\n\
             The next restore here rewrites what changed since this file's time, unless it \
             matches the snapshot; it removes this file once everything is restored."
        ),
        Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => Ok(()),
        Err(e) => Err(e),
    }
}

/// Removes the mark: the restore finished. What it wrote is put on disk first: a
/// power cut after the mark went and before the kernel wrote the files out would
/// leave them empty or cut short with nothing to say so (their times can reach
/// the disk before their data), and `--overwrite never` would keep them.
pub(crate) fn clear(root: BorrowedFd<'_>) -> std::io::Result<()> {
    sys::sync_fs(root)?;
    match sys::unlink_at(root, MARK) {
        Err(e) if e.kind() != std::io::ErrorKind::NotFound => Err(e),
        _ => Ok(()),
    }
}
