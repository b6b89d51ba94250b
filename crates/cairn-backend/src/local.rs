use crate::direct::{self, AlignedBuf, DIRECT_MIN_BYTES};
use crate::{Backend, BackendError, BackendErrorKind, ObjectInfo, Result};
use std::fs::{self, File, OpenOptions};
use std::io::{ErrorKind, Read, Seek, SeekFrom, Write};
use std::path::{Path, PathBuf};
use std::sync::Mutex;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};

/// A repository in a local directory (or a mounted NAS share).
///
/// `put` writes `<name>.tmp-<machine>-<pid>-<n>` next to the destination, fsyncs it, renames it
/// over the destination and fsyncs the directory, so a crash leaves either the old
/// object or the new one, plus at worst a temporary file that listings ignore.
#[derive(Debug)]
pub struct LocalBackend {
    root: PathBuf,
    counter: AtomicU64,
    sync: bool,
    /// Large objects (packs) are written with O_DIRECT while the filesystem allows it.
    direct: AtomicBool,
    /// Set once the file system refused a hard link: `put_new` renames instead.
    no_hard_links: AtomicBool,
    /// [`crate::process::machine_tag`], as used in temporary file names.
    host: String,
    scratch: Mutex<AlignedBuf>,
    /// Aligned buffers for direct range reads, one per concurrent reader.
    read_scratch: Mutex<Vec<AlignedBuf>>,
    /// Set once `config` was read or written here: from then on a directory is
    /// made below the root only while the root still holds `config` (see
    /// [`Self::make_dirs`]).
    config_seen: AtomicBool,
    /// Who may read what this backend writes ([`Self::modes`]): 0 not looked at
    /// yet, 1 the owner only, 2 the group too.
    sharing: std::sync::atomic::AtomicU8,
}

/// Modes of the files and directories a repository's owner alone reads: its key
/// files hold what a password guess is checked against, and its objects' sizes
/// say something of the data (as restic and borg, private by default).
const PRIVATE: (u32, u32) = (0o600, 0o700);
/// The same readable by the group, for a repository whose `config` the
/// administrator made group-readable (a backup group on a NAS share).
const GROUP: (u32, u32) = (0o640, 0o750);

/// Makes `dir` and its missing parents readable by their owner alone (0700, as
/// a local repository's directories are). `tighten`: a directory cairn owns
/// whole (a remote repository's cache, a local index) that is there already
/// and open to others (made by an older cairn) is closed too.
pub fn private_dir(dir: &std::path::Path, tighten: bool) -> std::io::Result<()> {
    use std::os::unix::fs::{DirBuilderExt, PermissionsExt};
    std::fs::DirBuilder::new()
        .recursive(true)
        .mode(0o700)
        .create(dir)?;
    if tighten {
        let mode = std::fs::metadata(dir)?.permissions().mode();
        if mode & 0o077 != 0 {
            std::fs::set_permissions(dir, std::fs::Permissions::from_mode(mode & 0o700))?;
        }
    }
    Ok(())
}

/// Replaces the small private file `path` (mode 0600) with `data`: written to a
/// new name beside it and renamed over it, so a reader (another process, or the
/// next run after a crash) finds the old contents or the new, never half of
/// them. `durable`: the file and the rename are synced before this returns, for
/// state that must survive a power cut; caches and memos skip that cost. A
/// failed write (a full disk) removes what it left.
pub fn replace_private_file(
    path: &std::path::Path,
    data: &[u8],
    durable: bool,
) -> std::io::Result<()> {
    use std::os::unix::fs::OpenOptionsExt;
    static COUNTER: AtomicU64 = AtomicU64::new(0);
    let mut name = path.file_name().unwrap_or_default().to_os_string();
    name.push(format!(
        "{TMP_MARK}{}-{}",
        std::process::id(),
        COUNTER.fetch_add(1, Ordering::Relaxed)
    ));
    let tmp = path.with_file_name(name);
    let written = (|| {
        let mut f = std::fs::OpenOptions::new()
            .write(true)
            .create_new(true)
            .mode(0o600)
            .open(&tmp)?;
        f.write_all(data)?;
        if durable {
            f.sync_all()?;
        }
        std::fs::rename(&tmp, path)
    })();
    if let Err(e) = written {
        let _ = std::fs::remove_file(&tmp);
        return Err(e);
    }
    if durable && let Some(dir) = path.parent() {
        let dir = if dir.as_os_str().is_empty() {
            std::path::Path::new(".")
        } else {
            dir
        };
        std::fs::File::open(dir)?.sync_all()?;
    }
    Ok(())
}

const TMP_MARK: &str = ".tmp-";

impl LocalBackend {
    pub fn new(root: impl Into<PathBuf>) -> Self {
        LocalBackend {
            root: root.into(),
            counter: AtomicU64::new(0),
            host: crate::process::machine_tag(),
            sync: true,
            direct: AtomicBool::new(true),
            no_hard_links: AtomicBool::new(false),
            scratch: Mutex::new(AlignedBuf::default()),
            read_scratch: Mutex::new(Vec::new()),
            config_seen: AtomicBool::new(false),
            sharing: std::sync::atomic::AtomicU8::new(0),
        }
    }

    /// The modes (file, directory) new objects and directories get: private,
    /// unless the repository's `config` is readable by its group, in which case
    /// the group may read them too, whatever the writer's umask (see
    /// [`Self::shared_dir`]). Decided once the config is there; `init` writes it
    /// private.
    fn modes(&self) -> (u32, u32) {
        use std::os::unix::fs::PermissionsExt;
        match self.sharing.load(Ordering::Relaxed) {
            1 => return PRIVATE,
            2 => return GROUP,
            _ => {}
        }
        let Ok(meta) = fs::metadata(self.path(crate::names::CONFIG)) else {
            return PRIVATE;
        };
        let group = meta.permissions().mode() & 0o040 != 0;
        self.sharing
            .store(if group { 2 } else { 1 }, Ordering::Relaxed);
        if group { GROUP } else { PRIVATE }
    }

    /// In a repository its group reads, gives a new directory the group's mode
    /// exactly (and [`Self::write`] a new file): a root job run under umask 077
    /// (cron, systemd) would otherwise write objects the group cannot read, and a
    /// reader of the group would find snapshots missing.
    fn shared_dir(&self, dir: &Path) -> std::io::Result<()> {
        use std::os::unix::fs::PermissionsExt;
        if self.sharing.load(Ordering::Relaxed) != 2 {
            return Ok(());
        }
        // A set-group-id bit the parent passed on stays: it gives the new
        // directory's files the repository's group.
        let setgid = fs::metadata(dir)?.permissions().mode() & 0o2000;
        fs::set_permissions(dir, fs::Permissions::from_mode(GROUP.1 | setgid))
    }

    fn create_dir(&self, dir: &Path, recursive: bool) -> std::io::Result<()> {
        use std::os::unix::fs::DirBuilderExt;
        fs::DirBuilder::new()
            .recursive(recursive)
            .mode(self.modes().1)
            .create(dir)?;
        self.shared_dir(dir)
    }

    /// Whether the repository's file system has (next to) no file entries
    /// (inodes) left for this user: "no space" then does not mean bytes, which is
    /// what an administrator would otherwise look at. (Next to none: other
    /// writers of this run free theirs as they fail.)
    fn out_of_inodes(&self) -> bool {
        nix::sys::statvfs::statvfs(&self.root)
            .is_ok_and(|v| v.files() > 0 && v.files_available() < 16)
    }

    pub fn root(&self) -> &Path {
        &self.root
    }

    fn path(&self, name: &str) -> PathBuf {
        self.root.join(name)
    }
}

/// A temporary file (`<name>.tmp-<machine>-<pid>-<n>`) is stale when it was written
/// on this machine, boot and pid namespace by a process that is gone, or when it has
/// not changed for a day (another machine's writer, or an older name format).
fn temporary_is_stale(tag: &str, host: &str, meta: &fs::Metadata) -> bool {
    let mut parts = tag.rsplitn(3, '-');
    let (_n, pid, writer) = (parts.next(), parts.next(), parts.next());
    if let (Some(pid), Some(writer)) = (pid.and_then(|p| p.parse::<u32>().ok()), writer)
        && writer == host
    {
        return !crate::process::alive(pid);
    }
    meta.modified()
        .ok()
        .and_then(|m| m.elapsed().ok())
        .is_some_and(|age| age > std::time::Duration::from_secs(24 * 3600))
}

/// `rename` that fails with `AlreadyExists` instead of replacing `to`.
fn rename_noreplace(from: &Path, to: &Path) -> std::io::Result<()> {
    use nix::fcntl::{AT_FDCWD, RenameFlags, renameat2};
    match renameat2(AT_FDCWD, from, AT_FDCWD, to, RenameFlags::RENAME_NOREPLACE) {
        Ok(()) => Ok(()),
        Err(nix::errno::Errno::EINVAL | nix::errno::Errno::ENOSYS) => {
            // The file system has no RENAME_NOREPLACE either: check, then rename.
            if to.symlink_metadata().is_ok() {
                return Err(std::io::Error::from(ErrorKind::AlreadyExists));
            }
            fs::rename(from, to)
        }
        Err(e) => Err(std::io::Error::from(e)),
    }
}

fn sync_dir(dir: &Path) -> std::io::Result<()> {
    File::open(dir)?.sync_all()
}

impl LocalBackend {
    /// Opens `name` for a range read, checking that the range lies within it. A
    /// range large enough to bypass the page cache (see [`Self::read_range`]) is
    /// opened with `O_DIRECT` at once, so a restore's pack read opens its pack once.
    fn open_range(&self, name: &str, offset: u64, length: u64) -> Result<RangeFile> {
        let err = |e: std::io::Error| BackendError::from_io("get range", name, &e);
        let path = self.path(name);
        let direct_open = (length >= DIRECT_MIN_BYTES && self.direct.load(Ordering::Relaxed))
            .then(|| direct::open_read(&path).ok().flatten())
            .flatten();
        let direct = direct_open.is_some();
        let (file, size) = match direct_open {
            Some(opened) => opened,
            None => open_object(&path).map_err(err)?,
        };
        usize::try_from(length)
            .ok()
            .filter(|_| offset.checked_add(length).is_some_and(|end| end <= size))
            .map(|len| RangeFile { file, len, direct })
            .ok_or_else(|| BackendError {
                kind: BackendErrorKind::OutOfRange,
                op: "get range",
                path: name.into(),
                message: format!("range {offset}+{length} beyond end of object ({size} bytes)"),
            })
    }

    /// Fills `dst` from `offset` of `name` (opened by [`Self::open_range`]): large
    /// ranges, the pack ranges of a restore, bypass the page cache (see `direct`)
    /// where that works; the rest, and a direct read that fails, is read the
    /// ordinary way.
    fn read_range(&self, src: RangeFile, name: &str, offset: u64, dst: &mut [u8]) -> Result<()> {
        let err = |e: std::io::Error| BackendError::from_io("get range", name, &e);
        let mut f = if src.direct {
            if self.read_direct(&src.file, offset, dst) {
                return Ok(());
            }
            File::open(self.path(name)).map_err(err)?
        } else {
            src.file
        };
        f.seek(SeekFrom::Start(offset))
            .and_then(|_| f.read_exact(dst))
            .map_err(err)
    }

    /// A direct read of `dst` from `offset` of `f` (opened with `O_DIRECT`) through
    /// one of the pooled aligned buffers; `false` when it did not work.
    fn read_direct(&self, f: &File, offset: u64, dst: &mut [u8]) -> bool {
        let mut scratch = self
            .read_scratch
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .pop()
            .unwrap_or_default();
        let read = direct::read_into(f, offset, dst, &mut scratch);
        self.read_scratch
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .push(scratch);
        read
    }
}

/// Opens an object for reading, refusing what is not a regular file: opening a
/// FIFO put in an object's place waits for a writer for ever (QA: a `config` that
/// was a FIFO hung every command), so it is opened without waiting and looked at
/// first. (`O_NONBLOCK` changes nothing for the reads of a regular file.) With
/// its size, from the one `fstat` that tells its kind.
fn open_object(path: &Path) -> std::io::Result<(File, u64)> {
    use std::os::unix::fs::OpenOptionsExt;
    let f = OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_NONBLOCK)
        .open(path)?;
    let meta = f.metadata()?;
    if meta.is_file() {
        Ok((f, meta.len()))
    } else {
        Err(std::io::Error::new(ErrorKind::InvalidData, crate::NotAFile))
    }
}

/// An object opened for a range read, with the range's length.
struct RangeFile {
    file: File,
    len: usize,
    /// Opened with `O_DIRECT`.
    direct: bool,
}

impl Backend for LocalBackend {
    fn location(&self) -> String {
        self.root.display().to_string()
    }

    fn put(&self, name: &str, data: &[u8]) -> Result<()> {
        self.write(name, data, false)
    }

    fn put_new(&self, name: &str, data: &[u8]) -> Result<()> {
        self.write(name, data, true)
    }

    /// Blocks free for this user: root may also write the blocks a file system
    /// keeps back for root (ext4's 5%), and cairn run as root counts them.
    fn free_space(&self) -> Option<u64> {
        let v = nix::sys::statvfs::statvfs(&self.root).ok()?;
        let blocks = if nix::unistd::geteuid().is_root() {
            v.blocks_free()
        } else {
            v.blocks_available()
        };
        Some((blocks as u64).saturating_mul(v.fragment_size() as u64))
    }

    fn remove_stale_temporaries(&self) -> Result<u64> {
        self.remove_temporaries()
    }
    fn get(&self, name: &str) -> Result<Vec<u8>> {
        let err = |e: std::io::Error| self.read_error(name, &e);
        let (mut f, size) = open_object(&self.path(name)).map_err(err)?;
        let mut data = Vec::with_capacity(usize::try_from(size).unwrap_or(0));
        f.read_to_end(&mut data).map_err(err)?;
        self.saw(name);
        Ok(data)
    }

    fn get_bounded(&self, name: &str, max: u64) -> Result<Vec<u8>> {
        let err = |e: std::io::Error| self.read_error(name, &e);
        let (mut f, size) = open_object(&self.path(name)).map_err(err)?;
        if size > max {
            return Err(BackendError::too_large("get", name, size, max));
        }
        // Read at most one byte beyond the bound: the file may grow meanwhile.
        let mut data = Vec::with_capacity(size as usize);
        (&mut f).take(max + 1).read_to_end(&mut data).map_err(err)?;
        if data.len() as u64 > max {
            return Err(BackendError::too_large("get", name, data.len() as u64, max));
        }
        self.saw(name);
        Ok(data)
    }

    fn size(&self, name: &str) -> Result<u64> {
        let (_, size) = open_object(&self.path(name)).map_err(|e| self.read_error(name, &e))?;
        Ok(size)
    }

    fn get_range(&self, name: &str, offset: u64, length: u64) -> Result<Vec<u8>> {
        let src = self.open_range(name, offset, length)?;
        let mut buf = vec![0u8; src.len];
        self.read_range(src, name, offset, &mut buf)?;
        Ok(buf)
    }

    fn get_range_into(
        &self,
        name: &str,
        offset: u64,
        length: u64,
        out: &mut crate::bufpool::Pooled,
    ) -> Result<()> {
        let src = self.open_range(name, offset, length)?;
        let len = src.len;
        self.read_range(src, name, offset, out.fill(len))
    }

    fn list(&self, prefix: &str) -> Result<Vec<ObjectInfo>> {
        // Prefixes are directories (`data/`, `index/`); walk them recursively.
        use std::os::unix::fs::MetadataExt;
        let mut out = Vec::new();
        let mut stack = vec![prefix.trim_end_matches('/').to_string()];
        let mut linked = std::collections::HashSet::new();
        if let Ok(m) = fs::metadata(self.path(&stack[0])) {
            linked.insert((m.dev(), m.ino()));
        }
        while let Some(rel) = stack.pop() {
            let dir = self.path(&rel);
            let rd = match fs::read_dir(&dir) {
                Ok(rd) => rd,
                Err(e) if e.kind() == ErrorKind::NotFound => continue,
                // A prefix that names an object (`config`): that object, as object
                // storage lists it.
                Err(e) if e.kind() == ErrorKind::NotADirectory && rel == prefix => {
                    if let Ok(m) = fs::metadata(&dir)
                        && m.is_file()
                    {
                        out.push(ObjectInfo {
                            name: rel.clone(),
                            size: m.len(),
                        });
                    }
                    continue;
                }
                Err(e) => return Err(BackendError::from_io("list", &rel, &e)),
            };
            for ent in rd {
                let ent = ent.map_err(|e| BackendError::from_io("list", &rel, &e))?;
                let fname = ent.file_name();
                let Some(fname) = fname.to_str() else {
                    continue;
                };
                if fname.contains(TMP_MARK) {
                    continue;
                }
                let child = if rel.is_empty() {
                    fname.to_string()
                } else {
                    format!("{rel}/{fname}")
                };
                let ft = ent
                    .file_type()
                    .map_err(|e| BackendError::from_io("list", &child, &e))?;
                // A symlink is what it points to (QA: a folder of packs moved to
                // another disk and linked back was skipped, so `check` called every
                // pack in it lost and advised the repair that drops their files).
                let meta = if ft.is_symlink() {
                    fs::metadata(ent.path())
                } else {
                    ent.metadata()
                };
                let meta = match meta {
                    Ok(m) => m,
                    // Gone since the listing, or a link to nothing: not there.
                    Err(e) if e.kind() == ErrorKind::NotFound => continue,
                    Err(e) => return Err(BackendError::from_io("list", &child, &e)),
                };
                if meta.is_dir() {
                    // Each directory once, however it is reached (a link to a
                    // directory above it would be walked for ever; a folder that
                    // is also a link's target would be listed twice).
                    if linked.insert((meta.dev(), meta.ino())) {
                        stack.push(child);
                    }
                    continue;
                }
                // What is neither a file nor a directory (a FIFO, a device) in an
                // object's place is listed, at size 0, so that reading it fails
                // and says why: skipped, it hid a snapshot without a word and
                // `latest` was an older one.
                let size = if meta.is_file() { meta.len() } else { 0 };
                out.push(ObjectInfo { name: child, size });
            }
        }
        Ok(out)
    }

    fn delete(&self, name: &str) -> Result<()> {
        fs::remove_file(self.path(name)).map_err(|e| BackendError::from_io("delete", name, &e))?;
        if name == crate::names::CONFIG {
            // Removed on purpose, not lost with an unmount.
            self.config_seen.store(false, Ordering::Relaxed);
        }
        Ok(())
    }
}

impl LocalBackend {
    /// Notes that `config` was read or written.
    fn saw(&self, name: &str) {
        if name == crate::names::CONFIG {
            self.config_seen.store(true, Ordering::Relaxed);
        }
    }

    /// Whether the `config` this backend saw is gone from the root (see
    /// [`Self::make_dirs`]).
    fn lost_config(&self) -> bool {
        self.config_seen.load(Ordering::Relaxed) && !self.root.join(crate::names::CONFIG).exists()
    }

    fn lost_config_message(&self) -> String {
        format!(
            "{} holds no config any more: was its file system unmounted, or the \
             repository deleted?",
            self.root.display()
        )
    }

    /// A read's error; `config` missing after it was seen is not "no repository
    /// here" but a repository gone from under this process, and says so.
    fn read_error(&self, name: &str, e: &std::io::Error) -> BackendError {
        if name == crate::names::CONFIG && e.kind() == ErrorKind::NotFound && self.lost_config() {
            return BackendError::from_io(
                "get",
                name,
                &std::io::Error::other(self.lost_config_message()),
            );
        }
        BackendError::from_io("get", name, e)
    }

    /// Makes the directories from the root down to `dir` (the parent of an
    /// object), one level at a time, never the root itself: a repository deleted
    /// under a running `cairn serve` must make writes fail, not start a second
    /// repository skeleton in its place. (The root is made by init.) Nor below a
    /// root that no longer holds the `config` this backend saw: that is a mount
    /// point whose file system was unmounted (or a repository emptied), and
    /// writes there would fill the file system beneath and vanish at the next
    /// mount.
    fn make_dirs(&self, dir: &Path) -> std::io::Result<()> {
        let Ok(below) = dir.strip_prefix(&self.root) else {
            return self.create_dir(dir, true);
        };
        if self.lost_config() {
            return Err(std::io::Error::other(self.lost_config_message()));
        }
        let mut at = self.root.clone();
        for c in below.components() {
            at.push(c);
            match self.create_dir(&at, false) {
                Ok(()) => {}
                Err(e) if e.kind() == ErrorKind::AlreadyExists => {}
                Err(e) if e.kind() == ErrorKind::NotFound => {
                    return Err(std::io::Error::other(format!(
                        "{} is gone: was the repository deleted, or its file system \
                         unmounted?",
                        self.root.display()
                    )));
                }
                Err(e) => return Err(e),
            }
        }
        Ok(())
    }

    /// Writes a temporary file, fsyncs it, and moves it into place: `rename` (which
    /// replaces) for `put`, `link` (which fails if the name exists, then the
    /// temporary is removed) for `put_new`; then fsyncs the directory.
    fn write(&self, name: &str, data: &[u8], exclusive: bool) -> Result<()> {
        let dest = self.path(name);
        let dir = dest.parent().unwrap_or(&self.root).to_path_buf();
        let n = self.counter.fetch_add(1, Ordering::Relaxed);
        // The writer's machine and pid are in the name, so a later cleanup can tell
        // a dead writer's leftovers from a live one's work.
        let tmp = dir.join(format!(
            "{}{TMP_MARK}{}-{}-{n}",
            crate::names::base(name),
            self.host,
            std::process::id()
        ));
        let write = || -> std::io::Result<()> {
            use std::os::unix::fs::OpenOptionsExt;
            let create = || {
                OpenOptions::new()
                    .write(true)
                    .create_new(true)
                    .mode(self.modes().0)
                    .open(&tmp)
            };
            let mut f = match create() {
                Ok(f) => f,
                Err(e) if e.kind() == ErrorKind::NotFound => {
                    self.make_dirs(&dir)?;
                    create()?
                }
                Err(e) => return Err(e),
            };
            if self.sharing.load(Ordering::Relaxed) == 2 {
                use std::os::unix::fs::PermissionsExt;
                f.set_permissions(fs::Permissions::from_mode(GROUP.0))?;
            }
            let direct_file =
                if self.direct.load(Ordering::Relaxed) && data.len() as u64 >= DIRECT_MIN_BYTES {
                    direct::open_direct(&tmp)?
                } else {
                    None
                };
            match direct_file {
                Some(d) => {
                    let mut scratch = self.scratch.lock().unwrap_or_else(|e| e.into_inner());
                    if !direct::write_at(&f, Some(&d), &mut scratch, data, 0)? {
                        self.direct.store(false, Ordering::Relaxed);
                    }
                }
                None => f.write_all(data)?,
            }
            if self.sync {
                f.sync_all()?;
            }
            drop(f);
            if exclusive {
                self.place_new(&tmp, &dest)?;
            } else {
                fs::rename(&tmp, &dest)?;
            }
            if self.sync {
                sync_dir(&dir)?;
            }
            Ok(())
        };
        write().map_err(|e| {
            let _ = fs::remove_file(&tmp);
            if exclusive && e.kind() == ErrorKind::AlreadyExists {
                return BackendError::already_exists("put", name);
            }
            let mut b = BackendError::from_io("put", name, &e);
            if b.kind == crate::BackendErrorKind::NoSpace && self.out_of_inodes() {
                b.message = "no inodes left on the repository's device: it may have room for \
                             data but not for more files (`df -i` shows it)"
                    .into();
            }
            b
        })?;
        self.saw(name);
        Ok(())
    }

    /// Moves a written temporary file to `dest` unless `dest` exists: a hard link
    /// where the file system has them (the name is taken atomically or not at all),
    /// else `renameat2(RENAME_NOREPLACE)` (exFAT, vfat and some network or FUSE
    /// file systems have no hard links), else, where neither works, a rename after
    /// checking the name is free (a race with another writer of the same name can
    /// then replace the object with the same bytes: names are hashes of contents).
    fn place_new(&self, tmp: &Path, dest: &Path) -> std::io::Result<()> {
        let no_link = |e: &std::io::Error| {
            matches!(
                e.raw_os_error(),
                Some(libc::EPERM | libc::EOPNOTSUPP | libc::ENOSYS | libc::EMLINK | libc::EXDEV)
            )
        };
        let linked = if self.no_hard_links.load(Ordering::Relaxed) {
            Err(std::io::Error::from_raw_os_error(libc::EPERM))
        } else {
            fs::hard_link(tmp, dest)
        };
        match linked {
            Ok(()) => {
                let _ = fs::remove_file(tmp);
                Ok(())
            }
            Err(e) if no_link(&e) => {
                self.no_hard_links.store(true, Ordering::Relaxed);
                let r = rename_noreplace(tmp, dest);
                if r.is_err() {
                    let _ = fs::remove_file(tmp);
                }
                r
            }
            Err(e) => {
                let _ = fs::remove_file(tmp);
                Err(e)
            }
        }
    }

    fn remove_temporaries(&self) -> Result<u64> {
        use std::os::unix::fs::MetadataExt;
        let mut freed = 0;
        let mut stack = vec![self.root.clone()];
        // Linked directories are walked too, once each, as `list` walks them.
        let mut linked = std::collections::HashSet::new();
        if let Ok(m) = fs::metadata(&self.root) {
            linked.insert((m.dev(), m.ino()));
        }
        while let Some(dir) = stack.pop() {
            let rd = match fs::read_dir(&dir) {
                Ok(rd) => rd,
                Err(e) if e.kind() == ErrorKind::NotFound => continue,
                Err(e) => return Err(BackendError::from_io("list", &dir.to_string_lossy(), &e)),
            };
            for ent in rd.flatten() {
                let Ok(ft) = ent.file_type() else { continue };
                let fname = ent.file_name();
                let fname = fname.to_string_lossy();
                if ft.is_dir() {
                    stack.push(ent.path());
                    continue;
                }
                if ft.is_symlink() {
                    if let Ok(m) = fs::metadata(ent.path())
                        && m.is_dir()
                        && linked.insert((m.dev(), m.ino()))
                    {
                        stack.push(ent.path());
                    }
                    continue;
                }
                let Some((_, tag)) = fname.split_once(TMP_MARK) else {
                    continue;
                };
                let Ok(meta) = ent.metadata() else { continue };
                if temporary_is_stale(tag, &self.host, &meta) {
                    match fs::remove_file(ent.path()) {
                        Ok(()) => freed += meta.len(),
                        Err(e) if e.kind() == ErrorKind::NotFound => {}
                        Err(e) => {
                            return Err(BackendError::from_io(
                                "delete",
                                &ent.path().to_string_lossy(),
                                &e,
                            ));
                        }
                    }
                }
            }
        }
        Ok(freed)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn conformance() {
        let dir = tempfile::tempdir().unwrap();
        crate::conformance::run(&LocalBackend::new(dir.path()));
    }

    /// A replaced file holds the new contents, is private, and a write that
    /// fails (here the name is a directory, so the rename does) leaves no
    /// temporary file behind.
    #[test]
    fn replace_private_file_replaces_whole_or_leaves_nothing() {
        use std::os::unix::fs::PermissionsExt;
        let dir = tempfile::tempdir().unwrap();
        let f = dir.path().join("state");
        fs::write(&f, b"old contents").unwrap();
        for durable in [false, true] {
            replace_private_file(&f, b"new", durable).unwrap();
            assert_eq!(fs::read(&f).unwrap(), b"new");
            assert_eq!(
                fs::metadata(&f).unwrap().permissions().mode() & 0o777,
                0o600
            );
        }
        let d = dir.path().join("a-dir");
        fs::create_dir(&d).unwrap();
        fs::write(d.join("x"), b"x").unwrap();
        assert!(replace_private_file(&d, b"data", true).is_err());
        let mut names: Vec<_> = fs::read_dir(dir.path())
            .unwrap()
            .map(|e| e.unwrap().file_name())
            .collect();
        names.sort();
        assert_eq!(names, ["a-dir", "state"]);
    }

    /// On file systems without hard links (exFAT, vfat: the kernel here has neither
    /// to mount, so the refusal is simulated), create-only puts rename instead and
    /// keep the contract.
    #[test]
    fn conformance_without_hard_links() {
        let dir = tempfile::tempdir().unwrap();
        let b = LocalBackend::new(dir.path());
        b.no_hard_links.store(true, Ordering::Relaxed);
        crate::conformance::run(&b);
        // And rename_noreplace itself refuses an existing name.
        let (a, c) = (dir.path().join("a"), dir.path().join("c"));
        fs::write(&a, b"a").unwrap();
        fs::write(&c, b"c").unwrap();
        let e = rename_noreplace(&a, &c).unwrap_err();
        assert_eq!(e.kind(), ErrorKind::AlreadyExists);
        assert_eq!(fs::read(&c).unwrap(), b"c");
    }

    #[test]
    fn temporary_files_are_not_listed() {
        let dir = tempfile::tempdir().unwrap();
        let b = LocalBackend::new(dir.path());
        fs::create_dir_all(dir.path().join("index")).unwrap();
        fs::write(dir.path().join("index/abc.tmp-1-0"), b"partial").unwrap();
        assert!(b.list("index/").unwrap().is_empty());
    }

    #[test]
    fn only_dead_writers_temporaries_are_removed() {
        let dir = tempfile::tempdir().unwrap();
        let b = LocalBackend::new(dir.path());
        fs::create_dir_all(dir.path().join("data/ab")).unwrap();
        let host = &b.host;
        let dead = dir
            .path()
            .join(format!("data/ab/x.tmp-{host}-{}-0", 0x3fff_fff0));
        let mine = dir
            .path()
            .join(format!("data/ab/y.tmp-{host}-{}-0", std::process::id()));
        let other = dir.path().join("data/ab/z.tmp-elsewhere-1-0");
        for p in [&dead, &mine, &other] {
            fs::write(p, b"partial").unwrap();
        }
        assert_eq!(b.remove_stale_temporaries().unwrap(), 7);
        assert!(!dead.exists());
        assert!(mine.exists(), "a live writer's file stays");
        assert!(other.exists(), "another host's recent file stays");
    }

    /// A prefix naming an object lists that object, as object storage does.
    #[test]
    fn a_prefix_naming_an_object_lists_it() {
        let dir = tempfile::tempdir().unwrap();
        let b = LocalBackend::new(dir.path());
        b.put("config", b"12345").unwrap();
        let l = b.list("config").unwrap();
        assert_eq!(l.len(), 1);
        assert_eq!((l[0].name.as_str(), l[0].size), ("config", 5));
    }

    /// A repository deleted under a running server: writes fail and say so; the
    /// directory is not made again.
    #[test]
    fn a_deleted_root_is_not_made_again() {
        let dir = tempfile::tempdir().unwrap();
        let root = dir.path().join("repo");
        fs::create_dir(&root).unwrap();
        let b = LocalBackend::new(&root);
        b.put("snapshots/aa", b"one").unwrap();
        fs::remove_dir_all(&root).unwrap();
        let e = b.put_new("snapshots/bb", b"two").unwrap_err();
        assert!(e.to_string().contains("is gone"), "{e}");
        assert!(!root.exists());
    }

    /// A repository on a file system unmounted under a running server: its mount
    /// point is an empty directory again, and writes below it fail instead of
    /// filling the file system beneath. Before the config is written (init), the
    /// directories are made as always.
    /// A folder or object moved elsewhere and linked back is listed as what it
    /// points to; what is neither file nor folder is listed (reading it says why),
    /// and a link to a folder above it is not walked for ever.
    #[test]
    fn links_are_followed_and_odd_entries_listed() {
        use std::os::unix::fs::symlink;
        let dir = tempfile::tempdir().unwrap();
        let root = dir.path().join("repo");
        fs::create_dir(&root).unwrap();
        let b = LocalBackend::new(&root);
        b.put_new("data/ab/ab01", b"pack one").unwrap();
        b.put_new("data/cd/cd01", b"pack two!").unwrap();
        b.put_new("snapshots/aa", b"snap").unwrap();
        let away = dir.path().join("other-disk");
        fs::create_dir(&away).unwrap();
        fs::rename(root.join("data/cd"), away.join("cd")).unwrap();
        symlink(away.join("cd"), root.join("data/cd")).unwrap();
        fs::rename(root.join("snapshots/aa"), away.join("aa")).unwrap();
        symlink(away.join("aa"), root.join("snapshots/aa")).unwrap();
        symlink(root.join("data"), root.join("data/ab/loop")).unwrap();
        // A folder that is also a link's target is listed once.
        symlink(root.join("data/ab"), away.join("cd/ab-again")).unwrap();
        symlink(away.join("nothing"), root.join("data/ab/ab02")).unwrap();
        assert!(
            std::process::Command::new("mkfifo")
                .arg(root.join("snapshots/bb"))
                .status()
                .unwrap()
                .success()
        );
        // Names and sizes under `prefix`, sorted.
        let listed = |prefix: &str| {
            let mut v: Vec<(String, u64)> = (b.list(prefix).unwrap().into_iter())
                .map(|o| (o.name, o.size))
                .collect();
            v.sort();
            v
        };
        assert_eq!(
            listed("data/"),
            [
                ("data/ab/ab01".to_string(), 8),
                ("data/cd/cd01".to_string(), 9)
            ]
        );
        assert_eq!(
            listed("snapshots/"),
            [
                ("snapshots/aa".to_string(), 4),
                ("snapshots/bb".to_string(), 0)
            ]
        );
        assert_eq!(b.get("snapshots/aa").unwrap(), b"snap");
        let e = b.get("snapshots/bb").unwrap_err();
        assert!(e.to_string().contains("not a regular file"), "{e}");
    }

    #[test]
    fn an_emptied_mount_point_takes_no_writes() {
        let dir = tempfile::tempdir().unwrap();
        let root = dir.path().join("mnt");
        fs::create_dir(&root).unwrap();
        let b = LocalBackend::new(&root);
        b.put_new("keys/aa", b"key").unwrap();
        b.put_new("config", b"config").unwrap();
        b.put_new("snapshots/aa", b"one").unwrap();
        b.put_new("data/ab/cd", b"pack").unwrap();
        let reopened = LocalBackend::new(&root);
        assert_eq!(reopened.get("config").unwrap(), b"config");
        reopened.put_new("data/ab/ef", b"pack").unwrap();
        // "umount": the mount point is empty.
        for e in fs::read_dir(&root).unwrap() {
            let p = e.unwrap().path();
            if p.is_dir() {
                fs::remove_dir_all(p).unwrap();
            } else {
                fs::remove_file(p).unwrap();
            }
        }
        for b in [&b, &reopened] {
            let e = b.put_new("data/ef/01", b"pack").unwrap_err();
            assert!(e.to_string().contains("unmounted"), "{e}");
            let e = b.get("config").unwrap_err();
            assert!(
                !e.is_not_found() && e.to_string().contains("unmounted"),
                "{e}"
            );
        }
        assert!(
            LocalBackend::new(&root)
                .get("config")
                .unwrap_err()
                .is_not_found()
        );
        assert_eq!(fs::read_dir(&root).unwrap().count(), 0, "nothing made");
    }
}
