//! Applying an entry's metadata after its content: owner (as root), extended
//! attributes, permission bits, then times last (every earlier step may change them;
//! a chown clears set-id bits, so the mode comes after it). What `fstat` shows is
//! already right is not set again: most small files are created with their final
//! mode and keep their owner ([`Creation`]), and their `fchown` and `fchmod` would be
//! two of their six system calls.
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

/// Which extended attributes a restore handles (`--include-xattr`,
/// `--exclude-xattr`, restic's options): the others are neither set from the
/// snapshot nor removed from, or compared on, what the target holds. For a
/// restore where some cannot be set (`security.selinux` in a container, `trusted.*`
/// when not root) and should not count as failures. By default, all of them.
#[derive(Clone, Debug, Default)]
pub struct XattrSelect {
    include: crate::pattern::GlobSet,
    exclude: crate::pattern::GlobSet,
}

impl XattrSelect {
    /// Glob patterns on attribute names (`user.*`, `security.selinux`): with
    /// `include` given, only the names it matches; never those `exclude` matches.
    pub fn new(include: &[String], exclude: &[String]) -> Result<Self, String> {
        let set = |v: &[String], flag: &str| {
            if let Some(p) = v.iter().find(|p| p.is_empty()) {
                return Err(format!("{flag} {p:?}: give an attribute name or glob"));
            }
            crate::pattern::GlobSet::new(v.iter().map(|p| (p.as_str(), false)))
                .map_err(|e| format!("{flag}: {e}"))
        };
        Ok(XattrSelect {
            include: set(include, "--include-xattr")?,
            exclude: set(exclude, "--exclude-xattr")?,
        })
    }

    /// Whether the attribute `name` is restored.
    pub fn wants(&self, name: &[u8]) -> bool {
        (self.include.is_empty() || self.include.is_match_bytes(name))
            && !self.exclude.is_match_bytes(name)
    }

    /// Whether every attribute is (nothing to filter).
    pub fn is_all(&self) -> bool {
        self.include.is_empty() && self.exclude.is_empty()
    }

    /// Keeps in `list` only the attributes restored.
    pub fn retain(&self, list: &mut Vec<(Vec<u8>, Vec<u8>)>) {
        if !self.is_all() {
            list.retain(|(k, _)| self.wants(k));
        }
    }
}

fn time(t: Timestamp) -> (i64, u32) {
    (t.secs, t.nanos)
}

/// Gives the open entry the inode flags of [`cairn_format::consts::INODE_FLAGS`]
/// that `flags` has, and takes away those it lacks; the file system's own flags
/// (extents, inline data) stay as they are.
///
/// When the whole set is refused (a flag this file system lacks, or `i` and
/// `a` for a user who is not root), the flags are set one at a time, so that
/// every one that can be is; the first refusal is returned.
pub(crate) fn set_inode_flags(fd: BorrowedFd<'_>, flags: u32) -> std::io::Result<()> {
    use cairn_format::consts::INODE_FLAGS;
    crate::hooks::point("restore:inode-flags");
    let now = sys::inode_flags(fd)?;
    let want = (now & !INODE_FLAGS) | (flags & INODE_FLAGS);
    if want == now {
        return Ok(());
    }
    let refused = |e: &std::io::Error| {
        matches!(
            e.raw_os_error(),
            Some(libc::EOPNOTSUPP | libc::EPERM | libc::EINVAL)
        )
    };
    match sys::set_inode_flags(fd, want) {
        Err(e) if refused(&e) => {
            let mut first = None;
            // First away what the snapshot lacks, then each it has.
            let mut have = now & (want | !INODE_FLAGS);
            if have != now
                && let Err(e) = sys::set_inode_flags(fd, have)
            {
                have = now;
                first.get_or_insert(e);
            }
            let missing = want & !have;
            for bit in (0..32).map(|i| 1u32 << i).filter(|b| missing & b != 0) {
                match sys::set_inode_flags(fd, have | bit) {
                    Ok(()) => have |= bit,
                    Err(e) => {
                        first.get_or_insert(e);
                    }
                }
            }
            first.map_or(Ok(()), Err)
        }
        r => r,
    }
}

/// Through `fd`, an ordinary descriptor of a regular file or directory, or (with
/// `path_only`) an `O_PATH` descriptor of any entry.
pub(crate) fn apply(
    fd: BorrowedFd<'_>,
    path_only: bool,
    node: &Node,
    owners: bool,
) -> std::io::Result<()> {
    let have = sys::fstat(fd)?;
    let chown = owners && (have.uid, have.gid) != (node.uid, node.gid);
    if chown {
        if path_only {
            sys::chown_path_fd(fd, node.uid, node.gid)?;
        } else {
            sys::chown_fd(fd, node.uid, node.gid)?;
        }
    }
    // An attribute refused (`trusted.*` for a user who is not root, a file system
    // without user attributes) leaves the rest to set: it is reported, and the
    // content, mode and times are the snapshot's all the same.
    let refused = set_xattrs(fd, path_only, &node.xattrs)?;
    let mode = node.mode & 0o7777;
    // After a chown (set-ID bits cleared) or xattrs (an ACL sets the mode too), the
    // mode is set whatever it was.
    if node.kind != NodeKind::Symlink
        && (chown || !node.xattrs.is_empty() || have.mode & 0o7777 != mode)
    {
        if path_only {
            sys::chmod_path_fd(fd, mode as libc::mode_t)?;
        } else {
            sys::chmod_fd(fd, mode as libc::mode_t)?;
        }
    }
    if path_only {
        sys::utimens_path_fd(fd, time(node.atime), time(node.mtime))?;
    } else {
        sys::futimens(fd, time(node.atime), time(node.mtime))?;
    }
    if refused.is_empty() {
        Ok(())
    } else {
        Err(std::io::Error::other(XattrsNotSet(refused.join(", "))))
    }
}

/// Sets each `(name, value)` through `fd` (an `O_PATH` descriptor with
/// `path_only`). An attribute refused (`trusted.*` for a user who is not root, a
/// file system without user attributes) leaves the rest to set; the refused ones
/// come back as "name (why)". A name that cannot be one (a NUL in it) is an error.
pub(crate) fn set_xattrs(
    fd: BorrowedFd<'_>,
    path_only: bool,
    list: &[(Vec<u8>, Vec<u8>)],
) -> std::io::Result<Vec<String>> {
    let mut refused = Vec::new();
    for (k, v) in list {
        let name = super::target::c_name(k)?;
        let r = if path_only {
            sys::set_xattr_path_fd(fd, &name, v)
        } else {
            sys::set_xattr_fd(fd, &name, v)
        };
        if let Err(e) = r {
            refused.push(format!("{} ({e})", String::from_utf8_lossy(k)));
        }
    }
    Ok(refused)
}

/// Whether an attribute the target holds and the snapshot does not is removed by a
/// restore in place: anything a user or an intruder can add (user attributes,
/// ACLs, a file capability `setcap` planted), but not the labels the system gives
/// every file (`security.selinux`, IMA/EVM, AppArmor) nor what a filesystem keeps
/// for itself in `trusted.*` (overlayfs, GlusterFS): removing those would break
/// the system or the filesystem, not undo an intrusion.
pub(crate) fn foreign_xattr(name: &[u8]) -> bool {
    const SYSTEM: [&[u8]; 3] = [b"security.selinux", b"security.ima", b"security.evm"];
    const OWNED: [&[u8]; 4] = [
        b"security.apparmor",
        b"trusted.overlay.",
        b"trusted.gfid",
        b"trusted.glusterfs.",
    ];
    !SYSTEM.contains(&name) && !OWNED.iter().any(|p| name.starts_with(p))
}

/// Removes the extended attributes of the entry open as `fd` (a file or directory,
/// possibly `O_PATH`) that the snapshot's `node` does not have and
/// [`foreign_xattr`] calls foreign, before [`apply`] sets the snapshot's on an
/// entry restored in place: an ACL (on a directory, a default ACL every new file
/// inherits), a planted capability or attribute does not survive a restore.
/// Through `/proc/self/fd`, which leads to the entry itself; the `_deref` calls
/// follow that magic link (the plain ones would read the link, which has none).
pub(crate) fn drop_other_xattrs(
    fd: BorrowedFd<'_>,
    node: &Node,
    select: &XattrSelect,
) -> std::io::Result<()> {
    use std::os::fd::AsRawFd;
    use std::os::unix::ffi::OsStrExt;
    let p = format!("/proc/self/fd/{}", fd.as_raw_fd());
    let names = match xattr::list_deref(&p) {
        Ok(n) => n,
        Err(e) if e.raw_os_error() == Some(libc::ENOTSUP) => return Ok(()),
        Err(e) => return Err(e),
    };
    for name in names {
        let n = name.as_bytes();
        if foreign_xattr(n)
            && select.wants(n)
            && !node.xattrs.iter().any(|(k, _)| k.as_slice() == n)
        {
            match xattr::remove_deref(&p, &name) {
                Ok(()) => {}
                Err(e) if e.raw_os_error() == Some(libc::ENODATA) => {}
                Err(e) => return Err(e),
            }
        }
    }
    Ok(())
}

/// What [`apply`] returns when only extended attributes could not be set: the
/// entry is otherwise complete (content, owner, mode, times), and is not to be
/// treated as a file restored in part.
#[derive(Debug)]
pub(crate) struct XattrsNotSet(String);

impl std::fmt::Display for XattrsNotSet {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "extended attributes not set: {}", self.0)
    }
}

impl std::error::Error for XattrsNotSet {}

/// Whether `e` is [`XattrsNotSet`].
pub(crate) fn only_xattrs(e: &std::io::Error) -> bool {
    e.get_ref().is_some_and(|x| x.is::<XattrsNotSet>())
}

/// How restore creates a one-chunk file, which it creates, writes and gives its
/// metadata through one descriptor: with its final permission bits when that is safe,
/// so that [`apply`] finds mode and owner right and only sets the times.
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

    /// The permission bits to create `node` with in `dir`, or `None`: create it 0600
    /// until [`apply`] sets everything after the content, as for any other entry.
    /// Its own bits only when the file keeps the owner it is created with (nobody
    /// else sees it with other rights while it is written), nobody but the owner may
    /// write to it (nobody can add to it before restore's content is in), it has no
    /// set-ID or sticky bit (those follow the owner) and no extended attributes (an
    /// ACL among them sets the mode too).
    pub fn mode(&self, node: &Node, dir: &DirNode) -> Option<libc::mode_t> {
        let mode = node.mode & 0o7777;
        let keeps_owner =
            !self.owners || (node.uid == self.euid && node.gid == self.egid && !dir.setgid);
        (keeps_owner && mode & 0o7022 == 0 && node.xattrs.is_empty())
            .then_some(mode as libc::mode_t)
    }
}
