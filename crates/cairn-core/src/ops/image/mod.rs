//! Image snapshots (`backup --image`): a disk image or block device saved in fixed
//! blocks of the repository's block size, as one file whose chunk list has the fixed
//! geometry of [`crate::tree::fixed`]. Every snapshot is a full image (it restores on
//! its own); an incremental one costs what changed.
//!
//! Backing up is part of [`crate::ops::backup`] (the blocks go through the same
//! pipeline as files); this module holds what is image-specific around it: the
//! changed-block lists, finding an image in a snapshot, and restoring one.

mod blockmap;
pub mod changed;
pub mod fs;
pub mod restore;

pub use changed::{ChangedFormat, ChangedRanges};

use crate::error::{Error, Result};
use crate::repo::Repository;
use cairn_format::snapshot::{ImageInfo, Snapshot};
use cairn_format::tree::{Node, NodeKind};
use std::path::PathBuf;

/// `backup --image SOURCE`.
#[derive(Clone, Debug)]
pub struct ImageOptions {
    /// A file (raw disk image) or block device.
    pub source: PathBuf,
    /// The image's name in the snapshot (default: the source's file name).
    pub name: Option<String>,
    /// `--changed-blocks FILE`: read only these ranges, take the rest from the
    /// parent image snapshot.
    pub changed_blocks: Option<(PathBuf, ChangedFormat)>,
}

/// A disk image in a snapshot, as `--image-fs` reads it.
pub struct ImageIn {
    pub size: u64,
    pub content: cairn_format::tree::Content,
    /// Byte ranges `[offset, length]` that hold zeros because the source could
    /// not read them.
    pub unreadable: Vec<(u64, u64)>,
}

/// The disk image `--image-fs` reads: an image snapshot's image, or with `file`
/// the regular file at that path of the snapshot (a raw image backed up as a
/// file, or an image `recover` saved from a lost image snapshot).
pub fn image_in(repo: &Repository, snap: &Snapshot, file: Option<&str>) -> Result<ImageIn> {
    let Some(path) = file else {
        let (info, node) = image_node(repo, snap)?;
        return Ok(ImageIn {
            size: info.size,
            content: node.content,
            unreadable: info.unreadable,
        });
    };
    let root = snap.tree_id().map_err(|e| Error::damaged("snapshot", e))?;
    // Already in the form listings write (stand-ins for bytes not UTF-8).
    let shown = path;
    let node = crate::ops::ls::find_node(repo, &root, path)?
        .ok_or_else(|| Error::Invalid(format!("{shown} is the snapshot's root, not a file")))?;
    if node.kind != NodeKind::File {
        return Err(Error::Invalid(format!(
            "{shown} is a {}, not a disk image file",
            node.kind.name()
        )));
    }
    // The one file of an image snapshot carries the snapshot's record of what
    // the source could not read.
    let unreadable = match &snap.image {
        Some(info) if info.size == node.size => info.unreadable.clone(),
        _ => Vec::new(),
    };
    Ok(ImageIn {
        size: node.size,
        content: node.content,
        unreadable,
    })
}

/// The image of an image snapshot: what the snapshot records and its one file node.
pub fn image_node(repo: &Repository, snap: &Snapshot) -> Result<(ImageInfo, Node)> {
    let info = snap.image.clone().ok_or_else(|| {
        // A snapshot `recover` saved from a lost image snapshot holds the
        // image as a file (QA: the message gave no way on).
        Error::Invalid(
            "not an image snapshot (made without --image); for a disk image saved in \
                 it as a file (such as one `recover` saved), name the file with \
                 --image-file PATH, or get it whole with `cairn dump SNAPSHOT PATH > \
                 disk.img`"
                .into(),
        )
    })?;
    let root = repo.load_tree(&snap.tree_id().map_err(|e| Error::damaged("snapshot", e))?)?;
    let bad = |d: &str| {
        Error::damaged(
            "image snapshot",
            cairn_format::FormatError::malformed("image snapshot", d.to_string()),
        )
    };
    let held = root.nodes.len();
    let [node] = <[Node; 1]>::try_from(root.nodes).map_err(|_| {
        bad(if held == 0 {
            "its root holds no image (the image was taken out of it: restore an earlier \
             snapshot of it)"
        } else {
            "its root holds more than the image"
        })
    })?;
    if node.kind != NodeKind::File || node.size != info.size {
        return Err(bad("its file does not match the recorded image size"));
    }
    // Every reader sizes its blocks by it (a zero block, a device's writes).
    crate::tree::fixed::Geometry::new(info.size, info.block_size, info.fanout)
        .map_err(|e| bad(&e.to_string()))?;
    Ok((info, node))
}

/// `file` opened a second time with `O_DIRECT` (read-only, or write-only with
/// `write`) through `/proc/self/fd`, so that it is the same file or device whatever
/// its path names now; `None` where the filesystem or device refuses it. An image
/// is read or written once, and through the page cache every byte costs a kernel
/// copy and pushes out what the machine had cached.
pub(crate) fn reopen_direct(file: &std::fs::File, write: bool) -> Option<std::fs::File> {
    use std::os::fd::AsRawFd;
    use std::os::unix::fs::{MetadataExt, OpenOptionsExt};
    let meta = file.metadata().ok()?;
    let d = std::fs::OpenOptions::new()
        .read(!write)
        .write(write)
        .custom_flags(libc::O_DIRECT)
        .open(format!("/proc/self/fd/{}", file.as_raw_fd()))
        .ok()?;
    let m = d.metadata().ok()?;
    (m.dev() == meta.dev() && m.ino() == meta.ino() && m.rdev() == meta.rdev()).then_some(d)
}

/// Byte ranges `(offset, length)` sorted, empty ones dropped, touching and
/// overlapping ones joined: a shrinking source fails read after read, one range
/// each, and is one range to the reader; a repair's lost blocks join the ranges
/// recorded before.
pub(crate) fn merge_ranges(ranges: impl Iterator<Item = (u64, u64)>) -> Vec<(u64, u64)> {
    let mut v: Vec<(u64, u64)> = ranges.filter(|r| r.1 > 0).collect();
    v.sort_unstable();
    let mut out: Vec<(u64, u64)> = Vec::with_capacity(v.len());
    for (off, len) in v {
        let end = off.saturating_add(len);
        match out.last_mut() {
            Some(last) if off <= last.0 + last.1 => {
                last.1 = last.1.max(end - last.0);
            }
            _ => out.push((off, len)),
        }
    }
    out
}

#[cfg(test)]
mod merge_tests {
    #[test]
    fn unreadable_ranges_are_merged_where_they_touch() {
        let r =
            super::merge_ranges([(8, 4), (0, 4), (4, 4), (20, 0), (30, 5), (32, 1)].into_iter());
        assert_eq!(r, vec![(0, 12), (30, 5)]);
    }
}
