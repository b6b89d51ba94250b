//! The system calls restore makes on the target, all relative to descriptors it holds.
//!
//! Restore may run as root over directories that ordinary users own and can change
//! at any moment, so it never hands the kernel a path that walks through them: every
//! entry is reached by one name looked up in a directory descriptor restore opened
//! itself, without following symlinks. Thin safe wrappers over `libc`; the `unsafe`
//! is confined to this module.
#![allow(unsafe_code)]

use std::ffi::CStr;
use std::io;
use std::os::fd::{AsRawFd, BorrowedFd, FromRawFd, OwnedFd, RawFd};
use std::sync::atomic::{AtomicU8, Ordering};

/// What `fstat` says about an entry, the parts restore checks.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub(crate) struct Stat {
    pub dev: u64,
    pub ino: u64,
    pub mode: u32,
    pub uid: u32,
    pub gid: u32,
    pub nlink: u64,
    pub rdev: u64,
    pub size: u64,
    /// Modification time (seconds, nanoseconds).
    pub mtime: (i64, u32),
    /// Access time (seconds, nanoseconds).
    pub atime: (i64, u32),
}

impl Stat {
    pub fn id(&self) -> (u64, u64) {
        (self.dev, self.ino)
    }
    pub fn kind(&self) -> u32 {
        self.mode & libc::S_IFMT
    }
}

fn cvt(r: libc::c_int) -> io::Result<libc::c_int> {
    if r < 0 {
        Err(io::Error::last_os_error())
    } else {
        Ok(r)
    }
}

/// Retries a call interrupted by a signal (EINTR): restore is not interruptible
/// mid-entry, and a stray signal must not turn into a spurious per-file failure.
fn retry(mut f: impl FnMut() -> libc::c_int) -> io::Result<libc::c_int> {
    loop {
        match cvt(f()) {
            Err(e) if e.raw_os_error() == Some(libc::EINTR) => continue,
            r => return r,
        }
    }
}

/// Whether `openat2` works here: 0 not probed yet, 1 yes, 2 no (older kernel, or a
/// seccomp filter that refuses it with ENOSYS or EPERM).
static OPENAT2: AtomicU8 = AtomicU8::new(0);

/// Probes `openat2` once on `dir` (which must be a directory descriptor). Done before
/// the first entry, so that an EPERM from an entry later is that entry's error, never
/// mistaken for "openat2 is filtered".
pub(crate) fn probe_openat2(dir: BorrowedFd<'_>) {
    if OPENAT2.load(Ordering::Relaxed) != 0 {
        return;
    }
    let ok = openat2(dir, c".", libc::O_PATH | libc::O_DIRECTORY, 0).is_ok();
    OPENAT2.store(if ok { 1 } else { 2 }, Ordering::Relaxed);
}

fn openat2(
    dir: BorrowedFd<'_>,
    path: &CStr,
    flags: libc::c_int,
    mode: libc::mode_t,
) -> io::Result<OwnedFd> {
    // SAFETY: open_how is a plain C struct; all-zero is a valid value.
    let mut how: libc::open_how = unsafe { std::mem::zeroed() };
    how.flags = (flags | libc::O_CLOEXEC | libc::O_NOFOLLOW) as u64;
    if flags & libc::O_CREAT != 0 {
        how.mode = u64::from(mode);
    }
    how.resolve = libc::RESOLVE_BENEATH | libc::RESOLVE_NO_SYMLINKS | libc::RESOLVE_NO_MAGICLINKS;
    loop {
        // SAFETY: `path` is a valid NUL-terminated string and `how` a valid open_how
        // of the size passed; both outlive the call. The kernel returns a new
        // descriptor that nothing else owns.
        let r = unsafe {
            libc::syscall(
                libc::SYS_openat2,
                dir.as_raw_fd(),
                path.as_ptr(),
                &how as *const libc::open_how,
                std::mem::size_of::<libc::open_how>(),
            )
        };
        if r >= 0 {
            // SAFETY: a fresh descriptor returned by the kernel, owned by no one else.
            return Ok(unsafe { OwnedFd::from_raw_fd(r as RawFd) });
        }
        let e = io::Error::last_os_error();
        if e.raw_os_error() != Some(libc::EINTR) {
            return Err(e);
        }
    }
}

fn openat(
    dir: BorrowedFd<'_>,
    path: &CStr,
    flags: libc::c_int,
    mode: libc::mode_t,
) -> io::Result<OwnedFd> {
    let flags = flags | libc::O_CLOEXEC | libc::O_NOFOLLOW;
    // SAFETY: `path` is NUL-terminated and outlives the call.
    let fd = retry(|| unsafe { libc::openat(dir.as_raw_fd(), path.as_ptr(), flags, mode) })?;
    // SAFETY: a fresh descriptor returned by the kernel, owned by no one else.
    Ok(unsafe { OwnedFd::from_raw_fd(fd) })
}

/// Opens `name` (one component: no `/`, never `.` or `..`) in `dir`, never following
/// a symlink and never leaving `dir`. `O_NOFOLLOW` and `O_CLOEXEC` are always added.
/// Uses `openat2` with `RESOLVE_BENEATH | RESOLVE_NO_SYMLINKS` where the kernel has
/// it; otherwise `openat` with `O_NOFOLLOW`, which for a single component is the same
/// guarantee.
pub(crate) fn open_at(
    dir: BorrowedFd<'_>,
    name: &CStr,
    flags: libc::c_int,
    mode: libc::mode_t,
) -> io::Result<OwnedFd> {
    if OPENAT2.load(Ordering::Relaxed) == 1 {
        openat2(dir, name, flags, mode)
    } else {
        openat(dir, name, flags, mode)
    }
}

/// Opens a relative path of several components below `dir` in one call, when
/// `openat2` confines it (`RESOLVE_BENEATH | RESOLVE_NO_SYMLINKS`); `None` when the
/// kernel lacks `openat2` (the caller then walks one component at a time).
pub(crate) fn open_beneath_path(
    dir: BorrowedFd<'_>,
    path: &CStr,
    flags: libc::c_int,
) -> Option<io::Result<OwnedFd>> {
    (OPENAT2.load(Ordering::Relaxed) == 1).then(|| openat2(dir, path, flags, 0))
}

/// The parent of `dir` (its `..`), opened as a directory. Restore checks that it is
/// the directory it expects (by device and inode) before using it.
pub(crate) fn open_parent(dir: BorrowedFd<'_>, flags: libc::c_int) -> io::Result<OwnedFd> {
    openat(dir, c"..", flags | libc::O_DIRECTORY, 0)
}

fn to_stat(st: &libc::stat) -> Stat {
    Stat {
        dev: st.st_dev,
        ino: st.st_ino,
        mode: st.st_mode,
        uid: st.st_uid,
        gid: st.st_gid,
        nlink: st.st_nlink,
        rdev: st.st_rdev,
        size: u64::try_from(st.st_size).unwrap_or(0),
        mtime: (st.st_mtime, u32::try_from(st.st_mtime_nsec).unwrap_or(0)),
        atime: (st.st_atime, u32::try_from(st.st_atime_nsec).unwrap_or(0)),
    }
}

/// The open entry's inode flags (`FS_IOC_GETFLAGS`: the `chattr` bits, all of
/// them).
pub(crate) fn inode_flags(fd: BorrowedFd<'_>) -> io::Result<u32> {
    let mut v: libc::c_int = 0;
    // SAFETY: FS_IOC_GETFLAGS writes one int through the pointer, which points at
    // `v`; the descriptor is borrowed open for the call.
    retry(|| unsafe { libc::ioctl(fd.as_raw_fd(), libc::FS_IOC_GETFLAGS, &mut v) })?;
    Ok(v as u32)
}

/// Sets the open entry's inode flags to `flags` (`FS_IOC_SETFLAGS`; the immutable
/// and append-only bits need `CAP_LINUX_IMMUTABLE`).
pub(crate) fn set_inode_flags(fd: BorrowedFd<'_>, flags: u32) -> io::Result<()> {
    let v = flags as libc::c_int;
    // SAFETY: FS_IOC_SETFLAGS reads one int through the pointer, which points at
    // `v`; the descriptor is borrowed open for the call.
    retry(|| unsafe { libc::ioctl(fd.as_raw_fd(), libc::FS_IOC_SETFLAGS, &v) })?;
    Ok(())
}

/// Takes the immutable and append-only flags off an open entry (root only);
/// its flags before, when it had either. A restore that has to change what an
/// earlier restore locked (its flags are restored too) lifts them this way, and
/// puts back what the snapshot or the entry kept says at the end.
pub(crate) fn lift_locks(fd: BorrowedFd<'_>) -> io::Result<Option<u32>> {
    let now = inode_flags(fd)?;
    if now & cairn_format::consts::LOCKING_INODE_FLAGS == 0 {
        return Ok(None);
    }
    set_inode_flags(fd, now & !cairn_format::consts::LOCKING_INODE_FLAGS)?;
    Ok(Some(now))
}

/// How many entries of a target [`unlink_unlocking`] has unlocked to remove them
/// (in this process): a restore says how many it did (QA: an administrator's
/// `chattr +i` went silently).
static LOCKS_LIFTED: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);

pub(crate) fn locks_lifted() -> u64 {
    LOCKS_LIFTED.load(std::sync::atomic::Ordering::Relaxed)
}

/// [`unlink_at`] that lifts a regular file's immutable and append-only flags
/// ([`lift_locks`]) when they are why it was refused (EPERM), and tries once
/// more. Only a regular file is opened for that: opening a device node can do
/// something (a tape rewinds), and no other kind is given flags by restore.
pub(crate) fn unlink_unlocking(dir: BorrowedFd<'_>, name: &CStr) -> io::Result<()> {
    match unlink_at(dir, name) {
        Err(e)
            if e.raw_os_error() == Some(libc::EPERM)
                && stat_at(dir, name).is_ok_and(|st| st.kind() == libc::S_IFREG) =>
        {
            let flags = libc::O_RDONLY | libc::O_NONBLOCK | libc::O_NOCTTY;
            match open_at(dir, name, flags, 0)
                .and_then(|fd| lift_locks(std::os::fd::AsFd::as_fd(&fd)))
            {
                Ok(Some(_)) => {
                    LOCKS_LIFTED.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                    unlink_at(dir, name)
                }
                _ => Err(e),
            }
        }
        r => r,
    }
}

pub(crate) fn fstat(fd: BorrowedFd<'_>) -> io::Result<Stat> {
    let mut st = std::mem::MaybeUninit::<libc::stat>::uninit();
    // SAFETY: fstat writes a whole `stat` into the buffer when it returns 0.
    retry(|| unsafe { libc::fstat(fd.as_raw_fd(), st.as_mut_ptr()) })?;
    // SAFETY: initialised by the successful call above.
    Ok(to_stat(unsafe { st.assume_init_ref() }))
}

/// Which mount `name` in `dir` lies on (an empty `name`: `dir` itself), symlinks not
/// followed: its mount id where the kernel says (statx, Linux 5.8), so that a bind
/// mount of the same file system counts as another mount and a btrfs subvolume
/// (a device of its own on the same mount) does not; else its device. Equal
/// values: the same mount.
pub(crate) fn mount_of(dir: BorrowedFd<'_>, name: &CStr) -> io::Result<(u64, u64)> {
    let mut stx = std::mem::MaybeUninit::<libc::statx>::zeroed();
    let flags = libc::AT_SYMLINK_NOFOLLOW
        | libc::AT_NO_AUTOMOUNT
        | if name.is_empty() {
            libc::AT_EMPTY_PATH
        } else {
            0
        };
    // SAFETY: `name` is NUL-terminated; statx fills the buffer when it returns 0.
    let r = retry(|| unsafe {
        libc::statx(
            dir.as_raw_fd(),
            name.as_ptr(),
            flags,
            libc::STATX_MNT_ID,
            stx.as_mut_ptr(),
        )
    });
    match r {
        Ok(_) => {}
        // No statx (an old kernel, a seccomp filter): the device alone.
        Err(e) if matches!(e.raw_os_error(), Some(libc::ENOSYS | libc::EPERM)) => {
            let st = if name.is_empty() {
                fstat(dir)?
            } else {
                stat_at(dir, name)?
            };
            return Ok((st.dev, 0));
        }
        Err(e) => return Err(e),
    }
    // SAFETY: zeroed, then filled by the successful call above.
    let stx = unsafe { stx.assume_init() };
    if stx.stx_mask & libc::STATX_MNT_ID != 0 {
        return Ok((u64::MAX, stx.stx_mnt_id));
    }
    Ok((libc::makedev(stx.stx_dev_major, stx.stx_dev_minor), 0))
}

/// `fstatat(dir, name, AT_SYMLINK_NOFOLLOW)`.
pub(crate) fn stat_at(dir: BorrowedFd<'_>, name: &CStr) -> io::Result<Stat> {
    let mut st = std::mem::MaybeUninit::<libc::stat>::uninit();
    // SAFETY: `name` is NUL-terminated; fstatat fills the buffer when it returns 0.
    retry(|| unsafe {
        libc::fstatat(
            dir.as_raw_fd(),
            name.as_ptr(),
            st.as_mut_ptr(),
            libc::AT_SYMLINK_NOFOLLOW,
        )
    })?;
    // SAFETY: initialised by the successful call above.
    Ok(to_stat(unsafe { st.assume_init_ref() }))
}

pub(crate) fn mkdir_at(dir: BorrowedFd<'_>, name: &CStr, mode: libc::mode_t) -> io::Result<()> {
    // SAFETY: `name` is NUL-terminated and outlives the call.
    retry(|| unsafe { libc::mkdirat(dir.as_raw_fd(), name.as_ptr(), mode) }).map(drop)
}

/// Writes out everything the file system holding `dir` has not yet put on disk
/// (`syncfs`): its errors are those of the writes it finishes.
pub(crate) fn sync_fs(dir: BorrowedFd<'_>) -> io::Result<()> {
    // SAFETY: a plain call on an open descriptor.
    retry(|| unsafe { libc::syncfs(dir.as_raw_fd()) }).map(drop)
}

/// Removes the non-directory `name` from `dir` (the link itself, never what a
/// symlink points to).
pub(crate) fn unlink_at(dir: BorrowedFd<'_>, name: &CStr) -> io::Result<()> {
    // SAFETY: `name` is NUL-terminated and outlives the call.
    retry(|| unsafe { libc::unlinkat(dir.as_raw_fd(), name.as_ptr(), 0) }).map(drop)
}

pub(crate) fn symlink_at(target: &CStr, dir: BorrowedFd<'_>, name: &CStr) -> io::Result<()> {
    // SAFETY: both strings are NUL-terminated and outlive the call.
    retry(|| unsafe { libc::symlinkat(target.as_ptr(), dir.as_raw_fd(), name.as_ptr()) }).map(drop)
}

pub(crate) fn mknod_at(
    dir: BorrowedFd<'_>,
    name: &CStr,
    mode: libc::mode_t,
    rdev: libc::dev_t,
) -> io::Result<()> {
    // SAFETY: `name` is NUL-terminated and outlives the call.
    retry(|| unsafe { libc::mknodat(dir.as_raw_fd(), name.as_ptr(), mode, rdev) }).map(drop)
}

/// A new name `new_name` in `new_dir` for the entry `old_name` in `old_dir`; a
/// symlink at `old_name` is linked itself, never followed.
pub(crate) fn link_at(
    old_dir: BorrowedFd<'_>,
    old_name: &CStr,
    new_dir: BorrowedFd<'_>,
    new_name: &CStr,
) -> io::Result<()> {
    // SAFETY: both names are NUL-terminated and outlive the call.
    retry(|| unsafe {
        libc::linkat(
            old_dir.as_raw_fd(),
            old_name.as_ptr(),
            new_dir.as_raw_fd(),
            new_name.as_ptr(),
            0,
        )
    })
    .map(drop)
}

/// The owner of an open file or directory.
pub(crate) fn chown_fd(fd: BorrowedFd<'_>, uid: u32, gid: u32) -> io::Result<()> {
    // SAFETY: plain integer arguments.
    retry(|| unsafe { libc::fchown(fd.as_raw_fd(), uid, gid) }).map(drop)
}

/// The owner through an `O_PATH` descriptor (`AT_EMPTY_PATH`); on a symlink's own
/// descriptor it changes the link itself.
pub(crate) fn chown_path_fd(fd: BorrowedFd<'_>, uid: u32, gid: u32) -> io::Result<()> {
    // SAFETY: the empty path is a valid NUL-terminated string.
    retry(|| unsafe {
        libc::fchownat(
            fd.as_raw_fd(),
            c"".as_ptr(),
            uid,
            gid,
            libc::AT_EMPTY_PATH | libc::AT_SYMLINK_NOFOLLOW,
        )
    })
    .map(drop)
}

pub(crate) fn chmod_fd(fd: BorrowedFd<'_>, mode: libc::mode_t) -> io::Result<()> {
    // SAFETY: plain integer arguments.
    retry(|| unsafe { libc::fchmod(fd.as_raw_fd(), mode) }).map(drop)
}

/// The path of `fd` in `/proc/self/fd`: opening or changing it reaches exactly the
/// inode `fd` refers to (a "magic link"), which is how metadata is applied through
/// an `O_PATH` descriptor (of a device, FIFO or symlink, which restore must not open).
fn proc_path(fd: BorrowedFd<'_>) -> std::ffi::CString {
    let s = format!("/proc/self/fd/{}", fd.as_raw_fd());
    // A formatted integer never holds NUL.
    std::ffi::CString::new(s).unwrap_or_default()
}

/// Permission bits through an `O_PATH` descriptor (via `/proc/self/fd`; a symlink
/// reached that way is the link itself, which has no mode to set).
pub(crate) fn chmod_path_fd(fd: BorrowedFd<'_>, mode: libc::mode_t) -> io::Result<()> {
    let p = proc_path(fd);
    // SAFETY: `p` is NUL-terminated and outlives the call.
    retry(|| unsafe { libc::chmod(p.as_ptr(), mode) }).map(drop)
}

fn timespecs(atime: (i64, u32), mtime: (i64, u32)) -> [libc::timespec; 2] {
    let ts = |(s, n): (i64, u32)| libc::timespec {
        tv_sec: s as libc::time_t,
        tv_nsec: n as libc::c_long,
    };
    [ts(atime), ts(mtime)]
}

/// Access and modification times of an open file or directory.
pub(crate) fn futimens(fd: BorrowedFd<'_>, atime: (i64, u32), mtime: (i64, u32)) -> io::Result<()> {
    let t = timespecs(atime, mtime);
    // SAFETY: `t` is an array of two timespecs, as futimens requires.
    retry(|| unsafe { libc::futimens(fd.as_raw_fd(), t.as_ptr()) }).map(drop)
}

/// The same through an `O_PATH` descriptor (`AT_EMPTY_PATH`, Linux 5.8 and later;
/// `/proc/self/fd` before that). On a symlink's descriptor it sets the link's times.
pub(crate) fn utimens_path_fd(
    fd: BorrowedFd<'_>,
    atime: (i64, u32),
    mtime: (i64, u32),
) -> io::Result<()> {
    let t = timespecs(atime, mtime);
    // SAFETY: the empty path is NUL-terminated; `t` holds two timespecs.
    let r = retry(|| unsafe {
        libc::utimensat(
            fd.as_raw_fd(),
            c"".as_ptr(),
            t.as_ptr(),
            libc::AT_EMPTY_PATH | libc::AT_SYMLINK_NOFOLLOW,
        )
    });
    match r {
        Err(e) if e.raw_os_error() == Some(libc::EINVAL) => {
            let p = proc_path(fd);
            // SAFETY: `p` is NUL-terminated; `t` holds two timespecs.
            retry(|| unsafe { libc::utimensat(libc::AT_FDCWD, p.as_ptr(), t.as_ptr(), 0) })
                .map(drop)
        }
        r => r.map(drop),
    }
}

/// An extended attribute of an open file or directory.
pub(crate) fn set_xattr_fd(fd: BorrowedFd<'_>, name: &CStr, value: &[u8]) -> io::Result<()> {
    // SAFETY: `name` is NUL-terminated and `value` valid for its length.
    retry(|| unsafe {
        libc::fsetxattr(
            fd.as_raw_fd(),
            name.as_ptr(),
            value.as_ptr().cast(),
            value.len(),
            0,
        )
    })
    .map(drop)
}

/// The same through an `O_PATH` descriptor (via `/proc/self/fd`: the magic link leads
/// to the entry itself, a symlink included, never to what a symlink points to).
pub(crate) fn set_xattr_path_fd(fd: BorrowedFd<'_>, name: &CStr, value: &[u8]) -> io::Result<()> {
    let p = proc_path(fd);
    // SAFETY: both strings are NUL-terminated and `value` valid for its length.
    retry(|| unsafe {
        libc::setxattr(
            p.as_ptr(),
            name.as_ptr(),
            value.as_ptr().cast(),
            value.len(),
            0,
        )
    })
    .map(drop)
}

pub(crate) fn euid() -> u32 {
    // SAFETY: geteuid cannot fail and touches no memory.
    unsafe { libc::geteuid() }
}

pub(crate) fn egid() -> u32 {
    // SAFETY: getegid cannot fail and touches no memory.
    unsafe { libc::getegid() }
}

/// The soft limit on open descriptors (restore sizes its descriptor budget by it).
pub(crate) fn nofile_limit() -> u64 {
    let mut r = libc::rlimit {
        rlim_cur: 0,
        rlim_max: 0,
    };
    // SAFETY: getrlimit fills the struct it is given.
    if unsafe { libc::getrlimit(libc::RLIMIT_NOFILE, &mut r) } == 0 {
        r.rlim_cur
    } else {
        1024
    }
}

/// Removes the empty directory `name` from `dir`.
pub(crate) fn rmdir_at(dir: BorrowedFd<'_>, name: &CStr) -> io::Result<()> {
    // SAFETY: `name` is NUL-terminated and outlives the call.
    retry(|| unsafe { libc::unlinkat(dir.as_raw_fd(), name.as_ptr(), libc::AT_REMOVEDIR) })
        .map(drop)
}

/// The target of symlink `name` in `dir`.
pub(crate) fn readlink_at(dir: BorrowedFd<'_>, name: &CStr) -> io::Result<Vec<u8>> {
    let mut buf = vec![0u8; 256];
    loop {
        // SAFETY: `name` is NUL-terminated; readlinkat writes at most `buf.len()` bytes.
        let n = unsafe {
            libc::readlinkat(
                dir.as_raw_fd(),
                name.as_ptr(),
                buf.as_mut_ptr().cast(),
                buf.len(),
            )
        };
        if n < 0 {
            let e = io::Error::last_os_error();
            if e.raw_os_error() == Some(libc::EINTR) {
                continue;
            }
            return Err(e);
        }
        let n = n as usize;
        if n < buf.len() {
            buf.truncate(n);
            return Ok(buf);
        }
        // Possibly truncated: try again with room to spare (a target is < PATH_MAX).
        if buf.len() >= 1 << 16 {
            return Err(io::Error::other("symlink target too long"));
        }
        buf.resize(buf.len() * 4, 0);
    }
}

/// The names in directory `dir` (without `.` and `..`), read through a descriptor of
/// its own opened from `dir` (the caller's keeps its position and flags).
pub(crate) fn list_dir(dir: BorrowedFd<'_>) -> io::Result<Vec<std::ffi::CString>> {
    let fd = openat(dir, c".", libc::O_RDONLY | libc::O_DIRECTORY, 0)?;
    let mut d = nix::dir::Dir::from_fd(fd).map_err(io::Error::from)?;
    let mut names = Vec::new();
    for e in d.iter() {
        let e = e.map_err(io::Error::from)?;
        let n = e.file_name();
        if n != c"." && n != c".." {
            names.push(n.to_owned());
        }
    }
    Ok(names)
}
