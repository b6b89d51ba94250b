//! Applying an entry's metadata after its content: owner (as root), extended
//! attributes, permission bits, then times last (every earlier step may change them).
//! Symlinks get owner, xattrs and times, never a chmod (it would follow the link).

use cairn_format::tree::{Node, NodeKind, Timestamp};
use nix::sys::stat::{UtimensatFlags, utimensat};
use nix::sys::time::TimeSpec;
use std::ffi::OsStr;
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::PermissionsExt;
use std::path::Path;

fn timespec(t: Timestamp) -> TimeSpec {
    TimeSpec::new(t.secs as libc::time_t, t.nanos as libc::c_long)
}

pub(crate) fn apply(path: &Path, node: &Node, owners: bool) -> std::io::Result<()> {
    let to_io = |e: nix::Error| std::io::Error::from_raw_os_error(e as i32);
    if owners {
        nix::unistd::fchownat(
            nix::fcntl::AT_FDCWD,
            path,
            Some(node.uid.into()),
            Some(node.gid.into()),
            nix::fcntl::AtFlags::AT_SYMLINK_NOFOLLOW,
        )
        .map_err(to_io)?;
    }
    for (k, v) in &node.xattrs {
        xattr::set(path, OsStr::from_bytes(k), v)?;
    }
    if node.kind != NodeKind::Symlink {
        std::fs::set_permissions(path, std::fs::Permissions::from_mode(node.mode & 0o7777))?;
    }
    utimensat(
        nix::fcntl::AT_FDCWD,
        path,
        &timespec(node.atime),
        &timespec(node.mtime),
        UtimensatFlags::NoFollowSymlink,
    )
    .map_err(to_io)
}

/// The same through an open descriptor of a regular file (no path lookups).
pub(crate) fn apply_fd(file: &std::fs::File, node: &Node, owners: bool) -> std::io::Result<()> {
    use std::os::fd::AsFd;
    use xattr::FileExt;
    let to_io = |e: nix::Error| std::io::Error::from_raw_os_error(e as i32);
    if owners {
        nix::unistd::fchown(file.as_fd(), Some(node.uid.into()), Some(node.gid.into()))
            .map_err(to_io)?;
    }
    for (k, v) in &node.xattrs {
        file.set_xattr(OsStr::from_bytes(k), v)?;
    }
    file.set_permissions(std::fs::Permissions::from_mode(node.mode & 0o7777))?;
    nix::sys::stat::futimens(file.as_fd(), &timespec(node.atime), &timespec(node.mtime))
        .map_err(to_io)
}
