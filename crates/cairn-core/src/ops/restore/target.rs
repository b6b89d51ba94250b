//! The restore target, reached only through descriptors restore opened itself.
//!
//! A root restore may run over directories that an ordinary user owns (restoring
//! `/home` over itself, or into a shared scratch area). That user can rename any entry
//! in such a directory and put a symlink, a hard link or another file in its place at
//! any moment, so no decision may be taken on a path and acted on later: every entry
//! is created, opened and changed by one name relative to a directory descriptor that
//! restore holds, never following a symlink (see [`super::sys`]); what restore opens
//! again later (to write a file's content, to set its metadata) is checked to be the
//! very inode it created. A directory that is renamed while restore holds it is
//! followed to wherever it went (it stays the user's own directory; nothing new is
//! reachable through it), never through a symlink left in its place.

use super::sys::{self, Stat};
use std::ffi::{CStr, CString, OsStr};
use std::fs::File;
use std::io;
use std::os::fd::{AsFd, BorrowedFd, OwnedFd};
use std::os::unix::ffi::OsStrExt;
use std::path::PathBuf;
use std::sync::Arc;

/// The owner of `link` (what `symlink_metadata` gave) when it is a symlink that
/// neither root nor this user owns. A path a user names for output (an image
/// restore's target, `export -o`, `dump -t`) is followed through its symlinks
/// only when this is `None`: one another user planted in a shared directory could
/// point at any file this user may write (the kernel's `protected_symlinks`
/// refuses such a link to `> FILE` in a sticky directory).
pub fn foreign_symlink_owner(link: &std::fs::Metadata) -> Option<u32> {
    use std::os::unix::fs::MetadataExt;
    let euid = sys::euid();
    (link.file_type().is_symlink() && link.uid() != 0 && link.uid() != euid).then(|| link.uid())
}

/// Where a directory of the target is: its name in its parent and its identity when
/// restore first opened it. Holds no descriptor, so it can be kept for every
/// directory something still refers to: it names entries in messages, and it lets
/// restore find a directory again (and check it is the same one) after closing it.
pub(crate) struct DirNode {
    parent: Option<Arc<DirNode>>,
    /// The name in the parent; for the target itself, the target's path.
    name: CString,
    /// (device, inode).
    pub id: (u64, u64),
    /// Set-group-ID when restore opened it: what is created in it takes its group,
    /// not the restoring process's.
    pub setgid: bool,
}

impl DirNode {
    /// The target, `st` what `fstat` said of it.
    pub fn root(path: &std::path::Path, st: &Stat) -> Arc<Self> {
        Arc::new(DirNode {
            parent: None,
            name: CString::new(path.as_os_str().as_bytes()).unwrap_or_default(),
            id: st.id(),
            setgid: st.mode & libc::S_ISGID != 0,
        })
    }

    pub fn child(parent: &Arc<DirNode>, name: CString, st: &Stat) -> Arc<Self> {
        Arc::new(DirNode {
            parent: Some(parent.clone()),
            name,
            id: st.id(),
            setgid: st.mode & libc::S_ISGID != 0,
        })
    }

    /// The directories from the target (first) down to this one.
    fn chain(&self) -> Vec<&DirNode> {
        let mut v = vec![self];
        let mut cur = self;
        while let Some(p) = &cur.parent {
            v.push(p);
            cur = p;
        }
        v.reverse();
        v
    }

    /// The path, for messages only (built on demand: a path per entry would cost
    /// memory quadratic in the depth of the tree).
    pub fn path(&self) -> PathBuf {
        let mut p = PathBuf::new();
        for d in self.chain() {
            p.push(OsStr::from_bytes(d.name.to_bytes()));
        }
        p
    }

    pub fn join(&self, name: &CStr) -> PathBuf {
        self.path().join(OsStr::from_bytes(name.to_bytes()))
    }
}

impl Drop for DirNode {
    /// Unlinks the chain of parents iteratively: the default drop recurses once per
    /// level and would overflow the stack on a very deep tree.
    fn drop(&mut self) {
        let mut next = self.parent.take();
        while let Some(p) = next {
            match Arc::try_unwrap(p) {
                Ok(mut node) => next = node.parent.take(),
                Err(_) => break,
            }
        }
    }
}

/// An open directory of the target.
pub(crate) struct Dir {
    pub fd: OwnedFd,
    pub node: Arc<DirNode>,
    /// Opened `O_PATH` because the restoring user may not read it: metadata then goes
    /// through `/proc/self/fd` rather than `fchmod` and friends.
    pub path_only: bool,
}

impl Dir {
    pub fn fd(&self) -> BorrowedFd<'_> {
        self.fd.as_fd()
    }
}

pub(crate) fn c_name(name: &[u8]) -> io::Result<CString> {
    // The tree decoder rejects names with NUL; this is a second line only.
    CString::new(name).map_err(|_| io::Error::new(io::ErrorKind::InvalidData, "NUL in a name"))
}

fn errno(e: &io::Error) -> i32 {
    e.raw_os_error().unwrap_or(0)
}

/// Opens directory `name` in `parent` (no symlinks; falling back to `O_PATH` when the
/// restoring user may search but not read it).
fn open_dir_at(parent: BorrowedFd<'_>, name: &CStr) -> io::Result<(OwnedFd, bool)> {
    match sys::open_at(parent, name, libc::O_RDONLY | libc::O_DIRECTORY, 0) {
        Ok(fd) => Ok((fd, false)),
        Err(e) if errno(&e) == libc::EACCES => {
            sys::open_at(parent, name, libc::O_PATH | libc::O_DIRECTORY, 0).map(|fd| (fd, true))
        }
        Err(e) => Err(e),
    }
}

/// How often an entry is created again when it keeps being replaced under restore.
const ATTEMPTS: usize = 3;

fn kept_changing() -> io::Error {
    io::Error::other(
        "it was replaced again and again while being created (someone is changing this directory)",
    )
}

/// A directory [`ensure_dir`] opened.
pub(crate) struct Opened {
    pub fd: OwnedFd,
    pub stat: Stat,
    /// Created by restore (and still owned by the restoring user).
    pub created: bool,
    /// See [`Dir::path_only`].
    pub path_only: bool,
}

/// Makes `name` in `parent` a real directory and opens it: an existing directory is
/// kept, anything else (a symlink included, which could point outside the target) is
/// removed first. Returns the open directory, its identity and whether restore created
/// it (a fresh directory of the restoring user, whose children need no check for
/// existing entries). Every creation is exclusive, so even a wrong guess about
/// freshness can only fail an entry, never write through something planted.
pub(crate) fn ensure_dir(parent: &Dir, name: &CStr, fresh: bool) -> io::Result<Opened> {
    let p = parent.fd();
    for attempt in 0..ATTEMPTS {
        if !fresh || attempt > 0 {
            match open_dir_at(p, name) {
                Ok((fd, path_only)) => {
                    let stat = sys::fstat(fd.as_fd())?;
                    let (fd, path_only) = writable(fd, &stat, path_only)?;
                    return Ok(Opened {
                        fd,
                        stat,
                        created: false,
                        path_only,
                    });
                }
                Err(e) if errno(&e) == libc::ENOENT => {}
                // A symlink or a non-directory is in the way.
                Err(e) if matches!(errno(&e), libc::ELOOP | libc::ENOTDIR) => {
                    match sys::unlink_at(p, name) {
                        Ok(()) => {}
                        Err(e) if matches!(errno(&e), libc::ENOENT | libc::EISDIR) => continue,
                        Err(e) => return Err(e),
                    }
                }
                Err(e) => return Err(e),
            }
        }
        match sys::mkdir_at(p, name, 0o700) {
            Ok(()) => {}
            Err(e) if errno(&e) == libc::EEXIST && attempt + 1 < ATTEMPTS => continue,
            Err(e) => return Err(e),
        }
        match open_dir_at(p, name) {
            Ok((fd, path_only)) => {
                let stat = sys::fstat(fd.as_fd())?;
                // Someone may have put a directory of their own in place of the new one.
                let created = stat.uid == sys::euid();
                return Ok(Opened {
                    fd,
                    stat,
                    created,
                    path_only,
                });
            }
            // Replaced between creating and opening it.
            Err(e) if matches!(errno(&e), libc::ENOENT | libc::ELOOP | libc::ENOTDIR) => continue,
            Err(e) => return Err(e),
        }
    }
    Err(kept_changing())
}

/// An existing directory of the restoring user that it may not write into or
/// search (a 0555 directory an earlier restore made, as its snapshot had it) is
/// given the owner's rwx, and opened for reading again if it was opened `O_PATH`:
/// restoring into it again, or removing it with what it holds (`--delete`), would
/// fail otherwise. Restore sets every directory's mode from the snapshot once its
/// entries are written, so a kept one ends as before. Root needs no permission
/// bits; someone else's directory is left alone.
fn writable(fd: OwnedFd, stat: &Stat, path_only: bool) -> io::Result<(OwnedFd, bool)> {
    let euid = sys::euid();
    if euid == 0 || stat.uid != euid || stat.mode & 0o700 == 0o700 {
        return Ok((fd, path_only));
    }
    let mode = (stat.mode & 0o7777) | 0o700;
    if path_only {
        sys::chmod_path_fd(fd.as_fd(), mode)?;
        let readable = sys::open_at(fd.as_fd(), c".", libc::O_RDONLY | libc::O_DIRECTORY, 0)?;
        Ok((readable, false))
    } else {
        sys::chmod_fd(fd.as_fd(), mode)?;
        Ok((fd, false))
    }
}

/// Removes a non-directory `name` from `parent` so a new entry can be created there
/// (the entry itself: a symlink is removed, never followed). Nothing to do in a
/// directory restore just created.
pub(crate) fn remove_existing(parent: &Dir, name: &CStr, fresh: bool) -> io::Result<()> {
    if fresh {
        return Ok(());
    }
    match sys::unlink_unlocking(parent.fd(), name) {
        Ok(()) => Ok(()),
        Err(e) if errno(&e) == libc::ENOENT => Ok(()),
        Err(e) if matches!(errno(&e), libc::EISDIR | libc::EPERM) => {
            // Linux says EISDIR for a directory; EPERM may also mean an immutable file.
            match sys::stat_at(parent.fd(), name) {
                Ok(st) if st.kind() == libc::S_IFDIR => Err(io::Error::new(
                    io::ErrorKind::AlreadyExists,
                    "a directory is in the way",
                )),
                _ => Err(e),
            }
        }
        Err(e) => Err(e),
    }
}

/// Creates the regular file `name` in `parent` (exclusively, never through a symlink),
/// mode 0600 until its metadata is applied.
pub(crate) fn create_file(parent: BorrowedFd<'_>, name: &CStr) -> io::Result<File> {
    create_file_mode(parent, name, 0o600)
}

/// [`create_file`] with the permission bits `mode` (the umask and a default ACL of
/// `parent` still apply).
pub(crate) fn create_file_mode(
    parent: BorrowedFd<'_>,
    name: &CStr,
    mode: libc::mode_t,
) -> io::Result<File> {
    let fd = sys::open_at(
        parent,
        name,
        libc::O_WRONLY | libc::O_CREAT | libc::O_EXCL,
        mode,
    )?;
    Ok(File::from(fd))
}

/// Opens again the regular file `name` in `parent` that restore created (`created`
/// is what `fstat` said then). Fails if it is anything else now: a file moved there,
/// a hard link to another file, a symlink (never followed). The owner is compared too
/// (it changes last, with the metadata): a file someone else created after deleting
/// restore's could reuse its inode number, never its owner. `O_NONBLOCK | O_NOCTTY` so
/// that a FIFO or terminal put there cannot block or take over the process before
/// the check.
pub(crate) fn reopen_file(
    parent: BorrowedFd<'_>,
    name: &CStr,
    flags: libc::c_int,
    created: &Stat,
) -> io::Result<File> {
    let fd = match sys::open_at(parent, name, flags | libc::O_NONBLOCK | libc::O_NOCTTY, 0) {
        Ok(fd) => fd,
        Err(e) if errno(&e) == libc::ELOOP => {
            return Err(io::Error::other(
                "it was replaced by a symlink during the restore (not followed)",
            ));
        }
        Err(e) => return Err(e),
    };
    let st = sys::fstat(fd.as_fd())?;
    if st.kind() != libc::S_IFREG || st.id() != created.id() || st.uid != created.uid {
        return Err(io::Error::other(
            "it was replaced during the restore (another file is there now; not written)",
        ));
    }
    Ok(File::from(fd))
}

/// Opens the entry `name` in `parent` that restore just created (a symlink, FIFO or
/// device) as an `O_PATH` descriptor, which neither opens the device or FIFO nor
/// follows the symlink, and checks that it is still what was created: the right type
/// (and device number), owned by the restoring user, with no other link (a hard link
/// to something else put in its place would have two).
pub(crate) fn open_created_special(
    parent: BorrowedFd<'_>,
    name: &CStr,
    kind: u32,
    rdev: Option<u64>,
) -> io::Result<OwnedFd> {
    let fd = sys::open_at(parent, name, libc::O_PATH, 0)?;
    let st = sys::fstat(fd.as_fd())?;
    if st.kind() != kind
        || st.nlink != 1
        || st.uid != sys::euid()
        || rdev.is_some_and(|r| r != st.rdev)
    {
        return Err(io::Error::other(
            "it was replaced during the restore (its metadata was not applied)",
        ));
    }
    Ok(fd)
}

/// Opens the directory `node` again from the target's descriptor `root`, checking
/// that what is found is the directory restore opened before (same device and inode;
/// with `openat2`, one confined lookup, otherwise every level). Used when its
/// descriptor was closed (bounded descriptors on deep trees; the first name of a hard
/// link far away).
pub(crate) fn reopen_dir(root: &Dir, node: &Arc<DirNode>) -> io::Result<Dir> {
    let moved = || io::Error::other("it was moved or replaced during the restore (not followed)");
    let chain = node.chain();
    if chain.len() <= 1 {
        return Err(moved());
    }
    let mut rel = Vec::new();
    for d in &chain[1..] {
        if !rel.is_empty() {
            rel.push(b'/');
        }
        rel.extend_from_slice(d.name.to_bytes());
    }
    // openat2 takes paths up to PATH_MAX; longer ones are walked.
    if rel.len() < 4000 {
        let path = c_name(&rel)?;
        let opened = sys::open_beneath_path(root.fd(), &path, libc::O_RDONLY | libc::O_DIRECTORY)
            .map(|r| match r {
                Err(e) if errno(&e) == libc::EACCES => {
                    sys::open_beneath_path(root.fd(), &path, libc::O_PATH | libc::O_DIRECTORY)
                        .unwrap_or(Err(e))
                        .map(|fd| (fd, true))
                }
                r => r.map(|fd| (fd, false)),
            });
        if let Some(r) = opened {
            let (fd, path_only) = r.map_err(|e| match errno(&e) {
                libc::ENOENT | libc::ELOOP | libc::ENOTDIR | libc::EXDEV => moved(),
                _ => e,
            })?;
            if sys::fstat(fd.as_fd())?.id() != node.id {
                return Err(moved());
            }
            return Ok(Dir {
                fd,
                node: node.clone(),
                path_only,
            });
        }
    }
    walk_down(root, node)
}

/// [`reopen_dir`] one level at a time (without `openat2`, or for paths longer than
/// it takes), checking every level.
fn walk_down(root: &Dir, node: &Arc<DirNode>) -> io::Result<Dir> {
    let moved = || io::Error::other("it was moved or replaced during the restore (not followed)");
    let chain = node.chain();
    let mut cur: Option<(OwnedFd, bool)> = None;
    for d in chain.iter().skip(1) {
        let parent = cur.as_ref().map_or(root.fd(), |(fd, _)| fd.as_fd());
        let (fd, path_only) = open_dir_at(parent, &d.name).map_err(|e| match errno(&e) {
            libc::ENOENT | libc::ELOOP | libc::ENOTDIR => moved(),
            _ => e,
        })?;
        if sys::fstat(fd.as_fd())?.id() != d.id {
            return Err(moved());
        }
        cur = Some((fd, path_only));
    }
    let (fd, path_only) = cur.ok_or_else(moved)?;
    Ok(Dir {
        fd,
        node: node.clone(),
        path_only,
    })
}

/// Reopens the parent of `child` (its `..`) and checks that it is `node`, the
/// directory restore opened before. Cheaper than [`reopen_dir`] (one lookup) when
/// climbing back up a deep tree whose upper descriptors were closed.
pub(crate) fn reopen_parent(child: &Dir, node: &Arc<DirNode>) -> io::Result<Dir> {
    let (fd, path_only) = match sys::open_parent(child.fd(), libc::O_RDONLY) {
        Ok(fd) => (fd, false),
        Err(e) if errno(&e) == libc::EACCES => (sys::open_parent(child.fd(), libc::O_PATH)?, true),
        Err(e) => return Err(e),
    };
    if sys::fstat(fd.as_fd())?.id() != node.id {
        return Err(io::Error::other("moved during the restore"));
    }
    Ok(Dir {
        fd,
        node: node.clone(),
        path_only,
    })
}

/// What [`remove_tree`] did.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub(crate) struct Removal {
    /// Entries removed.
    pub removed: u64,
    /// Bytes of the regular files among them (what `restore -v` lists as the
    /// size of a deleted entry).
    pub bytes: u64,
    /// Directories left in place, with everything in them, because another file
    /// system (or a bind mount) is mounted there.
    pub mounts_left: u64,
    /// Directories left in place because they are one of the spared ones (the
    /// repository being restored from), with the directories above them.
    pub spared_left: u64,
    /// Counting only: directories of the user that it may not read now, counted as
    /// one entry each, what they hold not (removing makes them readable first).
    pub unlisted: u64,
}

/// Removes `name` from `parent` and, when it is a directory, everything in it:
/// children through descriptors opened without following symlinks (a symlink is
/// removed, never what it points to). Nothing on another mount than `mount` (see
/// [`sys::mount_of`]) is touched: a mount point met on the way is left with all it
/// holds, and so are the directories above it. On an error, also what was done
/// before it.
/// Directories in `spared` (device, inode) are left the same way, with what they
/// hold.
pub(crate) fn remove_tree(
    parent: BorrowedFd<'_>,
    name: &CStr,
    mount: (u64, u64),
    spared: &[(u64, u64)],
) -> Result<Removal, (Removal, io::Error)> {
    walk_removal(parent, name, mount, spared, true)
}

/// What [`remove_tree`] would remove (`restore --dry-run`), changing nothing.
pub(crate) fn count_tree(
    parent: BorrowedFd<'_>,
    name: &CStr,
    mount: (u64, u64),
    spared: &[(u64, u64)],
) -> Result<Removal, (Removal, io::Error)> {
    walk_removal(parent, name, mount, spared, false)
}

/// What [`walk_removal`] finds at a name.
enum Found {
    /// On another mount (a mount point, or a file bind-mounted there): left alone.
    Other,
    /// Not a directory, on the target's mount: its size when a regular file.
    Leaf(u64),
    /// A directory on the target's mount, opened.
    Dir(OwnedFd),
    /// Counting only: a directory of the user's that it may not read now (the
    /// removal gives it the owner's rwx first, see [`writable`]).
    Unlisted,
    /// One of the spared directories: left alone.
    Spared,
}

/// Looks at `name` in `dir` for [`walk_removal`]. A directory is opened first and
/// its mount then read through the descriptor: an automount point (which the
/// open triggers) or a mount made in between is seen as what the descriptor
/// reaches, never emptied as if it were the target's.
///
/// When `removing`, a directory of the restoring user that it may not read or
/// change (0555, 000) is first given the owner's rwx, through a descriptor of the
/// directory itself: emptying it would fail otherwise, and it is going anyway.
fn look(
    dir: BorrowedFd<'_>,
    name: &CStr,
    mount: (u64, u64),
    spared: &[(u64, u64)],
    removing: bool,
) -> io::Result<Found> {
    let st = sys::stat_at(dir, name)?;
    if st.kind() != libc::S_IFDIR {
        return Ok(if sys::mount_of(dir, name)? == mount {
            Found::Leaf(if st.kind() == libc::S_IFREG {
                st.size
            } else {
                0
            })
        } else {
            Found::Other
        });
    }
    // Not readable: an O_PATH descriptor, enough to see its mount and, when it is
    // the user's own and going, to give it the owner's rwx ([`writable`]).
    let (fd, path_only) = open_dir_at(dir, name)?;
    if sys::mount_of(fd.as_fd(), c"")? != mount {
        return Ok(Found::Other);
    }
    if !spared.is_empty() && spared.contains(&sys::fstat(fd.as_fd())?.id()) {
        return Ok(Found::Spared);
    }
    let (fd, path_only) = if removing {
        let st = sys::fstat(fd.as_fd())?;
        writable(fd, &st, path_only)?
    } else {
        (fd, path_only)
    };
    if path_only {
        let euid = sys::euid();
        if !removing && sys::fstat(fd.as_fd())?.uid == euid && euid != 0 {
            return Ok(Found::Unlisted);
        }
        return Err(io::Error::from_raw_os_error(libc::EACCES));
    }
    // Going: an immutable or append-only directory would keep its entries.
    if removing {
        let _ = sys::lift_locks(fd.as_fd());
    }
    Ok(Found::Dir(fd))
}

/// Unlinks a non-directory for [`walk_removal`]; `false`: it is a mount point
/// (EBUSY: a file bind-mounted there), left alone.
fn unlink_leaf(dir: BorrowedFd<'_>, name: &CStr) -> io::Result<bool> {
    match sys::unlink_unlocking(dir, name) {
        Ok(()) => Ok(true),
        Err(e) if e.raw_os_error() == Some(libc::EBUSY) => Ok(false),
        Err(e) => Err(e),
    }
}

/// [`remove_tree`] (`remove`), or the same walk counting only.
fn walk_removal(
    parent: BorrowedFd<'_>,
    name: &CStr,
    mount: (u64, u64),
    spared: &[(u64, u64)],
    remove: bool,
) -> Result<Removal, (Removal, io::Error)> {
    let mut done = Removal::default();
    let top = match look(parent, name, mount, spared, remove).map_err(|e| (done, e))? {
        Found::Other => {
            done.mounts_left = 1;
            return Ok(done);
        }
        Found::Spared => {
            done.spared_left = 1;
            return Ok(done);
        }
        Found::Leaf(size) => {
            if remove && !unlink_leaf(parent, name).map_err(|e| (done, e))? {
                done.mounts_left = 1;
            } else {
                done.removed = 1;
                done.bytes = size;
            }
            return Ok(done);
        }
        Found::Dir(fd) => fd,
        Found::Unlisted => {
            done.removed = 1;
            done.unlisted = 1;
            return Ok(done);
        }
    };
    // Each level: the directory's descriptor, its name in the level above, the names
    // still to remove in it, and whether it holds a mount point (then it stays).
    let names = sys::list_dir(top.as_fd()).map_err(|e| (done, e))?;
    let mut stack: Vec<(OwnedFd, CString, Vec<CString>, bool)> =
        vec![(top, name.to_owned(), names, false)];
    while let Some((fd, _, todo, _)) = stack.last_mut() {
        let Some(child) = todo.pop() else {
            let Some((fd, own, _, holds_mount)) = stack.pop() else {
                break;
            };
            drop(fd);
            if holds_mount {
                if let Some(up) = stack.last_mut() {
                    up.3 = true;
                }
                continue;
            }
            if remove {
                let up = stack.last().map_or(parent, |(fd, _, _, _)| fd.as_fd());
                sys::rmdir_at(up, &own).map_err(|e| (done, e))?;
            }
            done.removed += 1;
            continue;
        };
        let dir = fd.as_fd();
        let mut size = 0;
        let kept = match look(dir, &child, mount, spared, remove).map_err(|e| (done, e))? {
            Found::Dir(sub) => {
                let names = sys::list_dir(sub.as_fd()).map_err(|e| (done, e))?;
                stack.push((sub, child, names, false));
                continue;
            }
            Found::Other => true,
            Found::Unlisted => {
                done.unlisted += 1;
                false
            }
            Found::Spared => {
                done.spared_left += 1;
                if let Some(level) = stack.last_mut() {
                    level.3 = true;
                }
                continue;
            }
            Found::Leaf(bytes) => {
                size = bytes;
                remove && !unlink_leaf(dir, &child).map_err(|e| (done, e))?
            }
        };
        if kept {
            done.mounts_left += 1;
            if let Some(level) = stack.last_mut() {
                level.3 = true;
            }
        } else {
            done.removed += 1;
            done.bytes += size;
        }
    }
    Ok(done)
}

/// Holds the target directory `root` for this restore until it is closed (an
/// exclusive `flock` on it), or says that another restore holds it: two
/// restores writing one target at once each find the other's files in their
/// way (QA r37: both exited 1 with hundreds of false "File exists" warnings).
/// A file system without locks (some network ones) is written as before.
pub(crate) fn hold_target(
    root: std::os::fd::BorrowedFd<'_>,
    target: &std::path::Path,
) -> crate::Result<()> {
    // The lock belongs to the open directory, which `root` keeps open.
    let Ok(dup) = root.try_clone_to_owned() else {
        return Ok(());
    };
    match std::fs::File::from(dup).try_lock() {
        Err(std::fs::TryLockError::WouldBlock) => Err(crate::Error::Invalid(format!(
            "another restore is writing into {}: wait for it to finish, or restore to \
             another target",
            target.display()
        ))),
        Ok(()) | Err(std::fs::TryLockError::Error(_)) => Ok(()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::fs;
    use std::os::unix::fs::MetadataExt;
    use std::path::Path;

    fn open_root(p: &Path) -> Dir {
        let fd: OwnedFd = File::open(p).unwrap().into();
        sys::probe_openat2(fd.as_fd());
        let st = sys::fstat(fd.as_fd()).unwrap();
        Dir {
            fd,
            node: DirNode::root(p, &st),
            path_only: false,
        }
    }

    fn sub(parent: &Dir, name: &CStr) -> Dir {
        let o = ensure_dir(parent, name, false).unwrap();
        Dir {
            fd: o.fd,
            node: DirNode::child(&parent.node, name.to_owned(), &o.stat),
            path_only: o.path_only,
        }
    }

    #[test]
    fn symlinks_and_files_in_the_way_of_a_directory_are_replaced_never_followed() {
        let tmp = tempfile::tempdir().unwrap();
        let outside = tmp.path().join("outside");
        fs::create_dir(&outside).unwrap();
        let t = tmp.path().join("t");
        fs::create_dir(&t).unwrap();
        std::os::unix::fs::symlink(&outside, t.join("a")).unwrap();
        fs::write(t.join("b"), b"x").unwrap();
        let root = open_root(&t);
        let a = sub(&root, c"a");
        let b = sub(&root, c"b");
        create_file(a.fd(), c"f").unwrap();
        create_file(b.fd(), c"f").unwrap();
        assert!(fs::symlink_metadata(t.join("a")).unwrap().is_dir());
        assert!(fs::symlink_metadata(t.join("b")).unwrap().is_dir());
        assert_eq!(fs::read_dir(&outside).unwrap().count(), 0);
        // An existing directory is kept, and is never removed for a file.
        let again = ensure_dir(&root, c"a", false).unwrap();
        assert!(!again.created);
        assert_eq!(again.stat.id(), a.node.id);
        let e = remove_existing(&root, c"a", false).unwrap_err();
        assert!(e.to_string().contains("directory is in the way"), "{e}");
    }

    #[test]
    fn a_file_is_reopened_only_if_it_is_the_inode_restore_created() {
        let tmp = tempfile::tempdir().unwrap();
        let t = tmp.path();
        let root = open_root(t);
        let f = create_file(root.fd(), c"f").unwrap();
        let id = sys::fstat(f.as_fd()).unwrap();
        drop(f);
        assert!(
            create_file(root.fd(), c"f").is_err(),
            "creation is exclusive"
        );
        reopen_file(root.fd(), c"f", libc::O_WRONLY, &id).unwrap();
        // Moved away and replaced by another file, a hard link, a symlink.
        fs::rename(t.join("f"), t.join("moved")).unwrap();
        fs::write(t.join("other"), b"other").unwrap();
        for how in ["file", "hard link", "symlink"] {
            match how {
                "file" => fs::write(t.join("f"), b"x").unwrap(),
                "hard link" => fs::hard_link(t.join("other"), t.join("f")).unwrap(),
                _ => std::os::unix::fs::symlink(t.join("moved"), t.join("f")).unwrap(),
            }
            let e = reopen_file(root.fd(), c"f", libc::O_WRONLY, &id).unwrap_err();
            assert!(e.to_string().contains("replaced"), "{how}: {e}");
            fs::remove_file(t.join("f")).unwrap();
        }
        assert_eq!(fs::read(t.join("other")).unwrap(), b"other");
        assert_eq!(fs::metadata(t.join("moved")).unwrap().len(), 0);
    }

    #[test]
    fn specials_are_checked_before_their_metadata_is_applied() {
        let tmp = tempfile::tempdir().unwrap();
        let t = tmp.path();
        let root = open_root(t);
        sys::mknod_at(root.fd(), c"p", libc::S_IFIFO | 0o600, 0).unwrap();
        open_created_special(root.fd(), c"p", libc::S_IFIFO, None).unwrap();
        // Wrong type, or a second link (a hard link to something else planted there).
        assert!(open_created_special(root.fd(), c"p", libc::S_IFLNK, None).is_err());
        fs::hard_link(t.join("p"), t.join("p2")).unwrap();
        assert!(open_created_special(root.fd(), c"p", libc::S_IFIFO, None).is_err());
        // A symlink is opened itself (O_PATH), never what it points to.
        sys::symlink_at(c"/etc/passwd", root.fd(), c"l").unwrap();
        let fd = open_created_special(root.fd(), c"l", libc::S_IFLNK, None).unwrap();
        let before = fs::metadata("/etc/passwd").unwrap();
        sys::utimens_path_fd(fd.as_fd(), (1_000, 5), (2_000, 7)).unwrap();
        let l = fs::symlink_metadata(t.join("l")).unwrap();
        assert_eq!((l.mtime(), l.mtime_nsec()), (2_000, 7));
        assert_eq!(fs::metadata("/etc/passwd").unwrap().mtime(), before.mtime());
    }

    #[test]
    fn a_closed_directory_is_found_again_only_if_it_is_the_same_one() {
        let tmp = tempfile::tempdir().unwrap();
        let t = tmp.path();
        let root = open_root(t);
        let a = sub(&root, c"a");
        let b = sub(&a, c"b");
        assert_eq!(reopen_dir(&root, &b.node).unwrap().node.id, b.node.id);
        assert_eq!(walk_down(&root, &b.node).unwrap().node.id, b.node.id);
        assert_eq!(reopen_parent(&b, &a.node).unwrap().node.id, a.node.id);
        // `a` is moved away and a look-alike put in its place.
        fs::rename(t.join("a"), t.join("x")).unwrap();
        fs::create_dir_all(t.join("a/b")).unwrap();
        let e = reopen_dir(&root, &b.node).err().unwrap();
        assert!(e.to_string().contains("moved or replaced"), "{e}");
        let e = walk_down(&root, &b.node).err().unwrap();
        assert!(e.to_string().contains("moved or replaced"), "{e}");
        // From `b` itself, `..` is still the directory restore opened (now `x`).
        let up = reopen_parent(&b, &a.node).unwrap();
        assert_eq!(sys::fstat(up.fd()).unwrap().id(), a.node.id);
        // And `..` of the look-alike is refused as `a`'s stand-in.
        let fake = open_root(&t.join("a/b"));
        assert!(reopen_parent(&fake, &a.node).is_err());
    }

    #[test]
    fn deep_chains_drop_without_recursion() {
        let mut node = DirNode::root(Path::new("/t"), &Stat::default());
        for ino in 0..200_000u64 {
            let st = Stat {
                ino,
                ..Stat::default()
            };
            node = DirNode::child(&node, c"d".to_owned(), &st);
        }
        drop(node);
    }
}
