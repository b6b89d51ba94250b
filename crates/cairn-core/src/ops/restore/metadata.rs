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
use super::target::DirNode;
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

/// How restore creates a one-chunk file, which it creates, writes and gives its
/// metadata through one descriptor. Most such files can be created with their final
/// permission bits and keep the owner they are created with (root's files restored by
/// root, anyone's restored by a user): the `fchmod` and `fchown` of [`apply`] would
/// then change nothing, and they are two of the file's six system calls (9% of a
/// small-file restore's time on ext4, where each dirties the inode again).
#[derive(Clone, Copy, Debug)]
pub(crate) struct Creation {
    pub owners: bool,
    euid: u32,
    egid: u32,
}

impl Creation {
    pub fn new(owners: bool) -> Self {
        Creation {
            owners,
            euid: sys::euid(),
            egid: sys::egid(),
        }
    }

    /// The permission bits to create `node` with in `dir` so that only
    /// [`apply_created`] is left to do, or `None`: create it 0600 and [`apply`]
    /// everything after the content, as for any other entry. Only when the file keeps
    /// the owner it is created with (nobody else sees it with other rights while it
    /// is written), nobody but the owner may write to it (nobody can add to it before
    /// restore's content is in), it has no set-ID or sticky bit (those follow the
    /// owner) and no extended attributes (an ACL among them sets the mode too).
    pub fn mode(&self, node: &Node, dir: &DirNode) -> Option<libc::mode_t> {
        let mode = node.mode & 0o7777;
        let keeps_owner =
            !self.owners || (node.uid == self.euid && node.gid == self.egid && !dir.setgid);
        (keeps_owner && mode & 0o7022 == 0 && node.xattrs.is_empty())
            .then_some(mode as libc::mode_t)
    }
}

/// The metadata of a regular file created with the bits [`Creation::mode`] gave:
/// what it was created with is checked (`fstat`, which changes nothing) rather than
/// assumed, since a umask, a default ACL or a file system's own rule for groups may
/// have made it differ; what differs is set, then the times.
pub(crate) fn apply_created(fd: BorrowedFd<'_>, node: &Node, owners: bool) -> std::io::Result<()> {
    let st = sys::fstat(fd)?;
    let mode = node.mode & 0o7777;
    let chown = owners && (st.uid, st.gid) != (node.uid, node.gid);
    if chown {
        sys::chown_fd(fd, node.uid, node.gid)?;
    }
    if chown || st.mode & 0o7777 != mode {
        sys::chmod_fd(fd, mode as libc::mode_t)?;
    }
    sys::futimens(fd, time(node.atime), time(node.mtime))
}
