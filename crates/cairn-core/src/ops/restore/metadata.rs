//! Applying an entry's metadata after its content: owner (as root), extended
//! attributes, permission bits, then times last (every earlier step may change them;
//! a chown clears set-id bits, so the mode comes after it).
//!
//! Always through a descriptor of the entry itself, never a path: a path through a
//! directory another user controls could lead anywhere by the time it is used, and
//! `chmod` follows symlinks. Regular files and directories are changed through an
//! ordinary descriptor; symlinks, FIFOs and devices (which restore must not open)
//! through an `O_PATH` one. Symlinks get owner, xattrs and times, never a mode.

use super::sys;
use cairn_format::tree::{Node, NodeKind, Timestamp};
use std::os::fd::BorrowedFd;

fn time(t: Timestamp) -> (i64, u32) {
    (t.secs, t.nanos)
}

/// Through `fd`, an ordinary descriptor of a regular file or directory, or (with
/// `path_only`) an `O_PATH` descriptor of any entry.
pub(crate) fn apply(
    fd: BorrowedFd<'_>,
    path_only: bool,
    node: &Node,
    owners: bool,
) -> std::io::Result<()> {
    if owners {
        if path_only {
            sys::chown_path_fd(fd, node.uid, node.gid)?;
        } else {
            sys::chown_fd(fd, node.uid, node.gid)?;
        }
    }
    for (k, v) in &node.xattrs {
        let name = super::target::c_name(k)?;
        if path_only {
            sys::set_xattr_path_fd(fd, &name, v)?;
        } else {
            sys::set_xattr_fd(fd, &name, v)?;
        }
    }
    if node.kind != NodeKind::Symlink {
        let mode = (node.mode & 0o7777) as libc::mode_t;
        if path_only {
            sys::chmod_path_fd(fd, mode)?;
        } else {
            sys::chmod_fd(fd, mode)?;
        }
    }
    if path_only {
        sys::utimens_path_fd(fd, time(node.atime), time(node.mtime))
    } else {
        sys::futimens(fd, time(node.atime), time(node.mtime))
    }
}
