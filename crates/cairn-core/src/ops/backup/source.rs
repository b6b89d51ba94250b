//! Reading what the source filesystem says about an entry: lstat fields, owner
//! names, link targets and extended attributes, into a tree [`Node`].

use cairn_format::tree::{Node, NodeKind, Timestamp};
use std::collections::HashMap;
use std::fs::Metadata;
use std::os::fd::OwnedFd;
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};

/// uid/gid -> name, looked up once each.
#[derive(Default)]
pub struct NameCache {
    users: HashMap<u32, String>,
    groups: HashMap<u32, String>,
}

impl NameCache {
    pub fn user(&mut self, uid: u32) -> String {
        cached(&mut self.users, uid, |id| {
            nix::unistd::User::from_uid(id.into())
                .ok()
                .flatten()
                .map(|u| u.name)
        })
    }
    pub fn group(&mut self, gid: u32) -> String {
        cached(&mut self.groups, gid, |id| {
            nix::unistd::Group::from_gid(id.into())
                .ok()
                .flatten()
                .map(|g| g.name)
        })
    }
}

/// A name looked up once per id; ids without a name map to "".
fn cached(
    map: &mut HashMap<u32, String>,
    id: u32,
    look: impl FnOnce(u32) -> Option<String>,
) -> String {
    map.entry(id)
        .or_insert_with(|| look(id).unwrap_or_default())
        .clone()
}

/// Opens a source file for reading without following a symlink put in its place,
/// and without touching its access time where the OS allows it (`O_NOATIME` is
/// refused, EPERM, for files we do not own).
pub fn open_source(path: &Path) -> std::io::Result<std::fs::File> {
    open_noatime(None, path.as_os_str(), false).map(std::fs::File::from)
}

/// [`open_source`] (or, with `directory`, [`open_dir`]) of a path of any length:
/// one too long for a single system call (`PATH_MAX`) is opened as far as one
/// call reaches, then a component at a time beneath it, none followed if it is a
/// symlink (as a backup walks down to it).
pub fn open_long(path: &Path, directory: bool) -> std::io::Result<OwnedFd> {
    const SHORT: usize = 4000;
    if path.as_os_str().len() < SHORT {
        return open_noatime(None, path.as_os_str(), directory);
    }
    let parts: Vec<_> = path.components().collect();
    let mut head = PathBuf::new();
    let mut i = 0;
    while i < parts.len() && head.as_os_str().len() + parts[i].as_os_str().len() + 1 < SHORT {
        head.push(parts[i]);
        i += 1;
    }
    let mut fd = open_noatime(None, head.as_os_str(), true)?;
    for (k, c) in parts[i..].iter().enumerate() {
        let last = i + k + 1 == parts.len();
        fd = open_noatime(Some(&fd), c.as_os_str(), directory || !last)?;
    }
    Ok(fd)
}

/// Opens `name` in the open directory `dir` like [`open_source`]: one path
/// component to resolve instead of the whole path.
pub fn open_source_at(dir: &OwnedFd, name: &[u8]) -> std::io::Result<std::fs::File> {
    open_noatime(Some(dir), std::ffi::OsStr::from_bytes(name), false).map(std::fs::File::from)
}

/// Every open of the source: read-only, never following a symlink put in the
/// entry's place, and without moving its access time (`O_NOATIME`, refused with
/// EPERM for files the user does not own: then without it). Relative to `dir` when
/// given (one component to resolve), else by path.
fn open_noatime(
    dir: Option<&OwnedFd>,
    name: &std::ffi::OsStr,
    directory: bool,
) -> std::io::Result<OwnedFd> {
    use nix::fcntl::OFlag;
    use nix::sys::stat::Mode;
    let mut flags = OFlag::O_RDONLY | OFlag::O_NOFOLLOW | OFlag::O_CLOEXEC;
    if directory {
        flags |= OFlag::O_DIRECTORY;
    } else {
        // A file replaced by a FIFO since the walk saw it would block the open
        // until a writer came, forever: opened without waiting, then refused below.
        flags |= OFlag::O_NONBLOCK;
    }
    let open = |flags| match dir {
        Some(d) => nix::fcntl::openat(d, name, flags, Mode::empty()),
        None => nix::fcntl::open(name, flags, Mode::empty()),
    };
    let (fd, used) = match open(flags | OFlag::O_NOATIME) {
        Err(nix::errno::Errno::EPERM) => (open(flags), flags),
        r => (r, flags | OFlag::O_NOATIME),
    };
    let fd = match fd {
        // What the open meets in a file's place, said as what it is now: a symlink
        // is not followed (ELOOP), a socket cannot be opened (ENXIO).
        Err(nix::errno::Errno::ELOOP) if !directory => {
            return Err(no_longer_regular(libc::S_IFLNK));
        }
        Err(nix::errno::Errno::ENXIO) if !directory => {
            return Err(no_longer_regular(libc::S_IFSOCK));
        }
        r => r.map_err(std::io::Error::from)?,
    };
    if !directory {
        let st = nix::sys::stat::fstat(&fd).map_err(std::io::Error::from)?;
        let kind = st.st_mode & libc::S_IFMT;
        if kind != libc::S_IFREG {
            return Err(no_longer_regular(kind));
        }
        // Reads of a regular file never wait anyway; the flag is taken off so the
        // descriptor behaves as any other. Only that flag: `O_NOATIME` stays (the
        // file's access time must not move because a backup read it). The flags
        // the open used are known: no F_GETFL for each file.
        nix::fcntl::fcntl(
            &fd,
            nix::fcntl::FcntlArg::F_SETFL(used & !OFlag::O_NONBLOCK),
        )
        .map_err(std::io::Error::from)?;
    }
    Ok(fd)
}

/// The error for a source file found to be of type `kind` now.
fn no_longer_regular(kind: libc::mode_t) -> std::io::Error {
    std::io::Error::other(format!(
        "is no longer a regular file (it is now {})",
        kind_name(kind)
    ))
}

/// What a file type (`st_mode & S_IFMT`) is called in a message.
fn kind_name(kind: libc::mode_t) -> &'static str {
    match kind {
        libc::S_IFIFO => "a FIFO",
        libc::S_IFSOCK => "a socket",
        libc::S_IFCHR => "a character device",
        libc::S_IFBLK => "a block device",
        libc::S_IFDIR => "a directory",
        libc::S_IFLNK => "a symbolic link",
        _ => "of another kind",
    }
}

/// What moves when a file is written to while it is read: size, modification and
/// change times (compared before and after a read, as tar does). `None` fields: the
/// file could not be stat'ed (then nothing is compared).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Changes(Option<(u64, i64, i64, i64, i64)>);

impl Changes {
    /// What the scan saw of a file (its node's size and times).
    pub fn of_node(n: &Node) -> Changes {
        Changes(Some((
            n.size,
            n.mtime.secs,
            i64::from(n.mtime.nanos),
            n.ctime.secs,
            i64::from(n.ctime.nanos),
        )))
    }

    pub fn of(f: &std::fs::File) -> Changes {
        Changes(f.metadata().ok().map(|m| {
            (
                m.len(),
                m.mtime(),
                m.mtime_nsec(),
                m.ctime(),
                m.ctime_nsec(),
            )
        }))
    }
}

/// Opens the directory `name` in the open directory `dir` like [`open_dir`]: one
/// component to resolve, so a directory 100,000 levels deep opens as easily as one
/// at the top (its full path would be far beyond `PATH_MAX`).
pub fn open_dir_at(dir: &OwnedFd, name: &[u8]) -> std::io::Result<OwnedFd> {
    open_noatime(Some(dir), std::ffi::OsStr::from_bytes(name), true)
}

/// A short path to the entry `name` of the open directory `dir`, through
/// `/proc/self/fd`, for the calls that have no `*at` form (`llistxattr`,
/// `lgetxattr`): the entry's real path may be too long for the kernel. `None` when
/// `/proc` is not mounted.
pub fn entry_path(dir: &OwnedFd, name: &[u8]) -> Option<PathBuf> {
    use std::os::fd::AsRawFd;
    static PROC: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
    if !*PROC.get_or_init(|| Path::new("/proc/self/fd").is_dir()) {
        return None;
    }
    let mut p = PathBuf::from(format!("/proc/self/fd/{}", dir.as_raw_fd()));
    p.push(std::ffi::OsStr::from_bytes(name));
    Some(p)
}

/// Opens a directory for listing without changing its access time (reading a
/// directory moves its atime, which would make the next backup see every directory
/// as changed) and without following a symlink put in its place.
pub fn open_dir(path: &Path) -> std::io::Result<OwnedFd> {
    open_noatime(None, path.as_os_str(), true)
}

/// The lstat fields a node records, from std's metadata or from a raw `fstatat`.
pub struct Stat {
    pub mode: u32,
    pub uid: u32,
    pub gid: u32,
    pub size: u64,
    pub ino: u64,
    pub dev: u64,
    pub nlink: u64,
    pub rdev: u64,
    pub atime: Timestamp,
    pub mtime: Timestamp,
    pub ctime: Timestamp,
}

impl From<&Metadata> for Stat {
    fn from(m: &Metadata) -> Self {
        Stat {
            mode: m.mode(),
            uid: m.uid(),
            gid: m.gid(),
            size: m.size(),
            ino: m.ino(),
            dev: m.dev(),
            nlink: m.nlink(),
            rdev: m.rdev(),
            atime: ts(m.atime(), m.atime_nsec()),
            mtime: ts(m.mtime(), m.mtime_nsec()),
            ctime: ts(m.ctime(), m.ctime_nsec()),
        }
    }
}

impl From<&libc::stat> for Stat {
    #[allow(clippy::unnecessary_cast, clippy::useless_conversion)] // field widths vary by target
    fn from(s: &libc::stat) -> Self {
        Stat {
            mode: s.st_mode as u32,
            uid: s.st_uid,
            gid: s.st_gid,
            size: s.st_size.max(0) as u64,
            ino: s.st_ino as u64,
            dev: s.st_dev as u64,
            nlink: s.st_nlink as u64,
            rdev: s.st_rdev as u64,
            atime: ts(s.st_atime as i64, s.st_atime_nsec as i64),
            mtime: ts(s.st_mtime as i64, s.st_mtime_nsec as i64),
            ctime: ts(s.st_ctime as i64, s.st_ctime_nsec as i64),
        }
    }
}

/// The node kind of a `st_mode`.
pub fn kind_of_mode(mode: u32) -> NodeKind {
    match mode & libc::S_IFMT {
        libc::S_IFDIR => NodeKind::Dir,
        libc::S_IFLNK => NodeKind::Symlink,
        libc::S_IFIFO => NodeKind::Fifo,
        libc::S_IFCHR => NodeKind::CharDevice,
        libc::S_IFBLK => NodeKind::BlockDevice,
        libc::S_IFSOCK => NodeKind::Socket,
        _ => NodeKind::File,
    }
}

fn ts(secs: i64, nanos: i64) -> Timestamp {
    Timestamp {
        secs,
        nanos: nanos.clamp(0, 999_999_999) as u32,
    }
}

/// Builds a node from lstat data. Link targets and xattrs that cannot be read are
/// returned as a warning message alongside the node (the entry itself is kept).
pub fn node_from_metadata(
    name: Vec<u8>,
    path: &Path,
    meta: &Metadata,
    names: &mut NameCache,
) -> (Node, Option<String>) {
    let (node, warning, _) = node_reusing_parent(
        name,
        &|_| path.to_path_buf(),
        &Stat::from(meta),
        names,
        None,
        false,
    );
    (node, warning)
}

/// [`node_from_metadata`], but a link target and xattrs are taken from the parent
/// snapshot's node when it is the same inode with the same ctime: the kernel moves
/// ctime forward on every xattr change (and a symlink's target cannot change in
/// place), so they are what a read would return. This saves an `llistxattr` (a
/// path walk) per unchanged entry. The access time is kept from the parent too: an
/// atime is recorded when an entry is new or its ctime moved. With `defer_file_xattrs`, a regular file that
/// does not match its parent gets no xattrs here and the third value is true: they
/// are to be read from the open file when its content is read
/// ([`read_xattrs_of`]), saving a path walk per file.
/// `path` gives, from the entry's name, the path to read a link target and xattrs
/// through, only when they must be read (most entries take them from the parent or
/// read them later from the open file).
pub fn node_reusing_parent(
    name: Vec<u8>,
    path: &dyn Fn(&[u8]) -> PathBuf,
    st: &Stat,
    names: &mut NameCache,
    parent: Option<&Node>,
    defer_file_xattrs: bool,
) -> (Node, Option<String>, bool) {
    let kind = kind_of_mode(st.mode);
    let mut node = Node::new(name, kind);
    node.mode = st.mode;
    node.uid = st.uid;
    node.gid = st.gid;
    node.user = names.user(st.uid);
    node.group = names.group(st.gid);
    node.mtime = st.mtime;
    node.atime = st.atime;
    node.ctime = st.ctime;
    node.inode = st.ino;
    node.dev = st.dev;
    node.nlink = st.nlink;
    node.rdev = st.rdev;
    node.size = if kind == NodeKind::File { st.size } else { 0 };
    // Not the device number: a fresh LVM, btrfs or ZFS snapshot of the same file
    // system has a new one, with the same inodes and change times.
    if let Some(p) = parent
        && p.kind == kind
        && p.ctime == node.ctime
        && p.inode == node.inode
    {
        node.link_target = p.link_target.clone();
        node.xattrs = p.xattrs.clone();
        // Only an access happened since (anything else moves ctime): keep the
        // recorded access time, so that listing a directory or reading a file —
        // by anyone, another backup tool included — does not rewrite every tree
        // above it.
        node.atime = p.atime;
        return (node, None, false);
    }
    if kind == NodeKind::File && defer_file_xattrs {
        // Read from the open file by whoever reads its content (`read_xattrs_of`).
        return (node, None, true);
    }
    let mut warning = None;
    let path = path(&node.name);
    if kind == NodeKind::Symlink {
        match std::fs::read_link(&path) {
            Ok(t) => node.link_target = t.as_os_str().as_bytes().to_vec(),
            Err(e) => warning = Some(format!("reading link target: {e}")),
        }
    }
    match read_xattrs(&path) {
        Ok(x) => node.xattrs = x,
        Err(e) => warning = Some(format!("reading extended attributes: {e}")),
    }
    (node, warning, false)
}

/// The inode flags (`chattr`) of an open file or directory that a snapshot keeps
/// ([`cairn_format::consts::INODE_FLAGS`]). One `ioctl` on a descriptor the backup
/// holds anyway; a file system without them (`ENOTTY`, `EOPNOTSUPP`) has none.
/// An unchanged file takes its parent snapshot's: a change of flags moves ctime.
pub fn inode_flags(fd: &impl std::os::fd::AsFd) -> u32 {
    crate::ops::restore::sys::inode_flags(fd.as_fd())
        .map_or(0, |f| f & cairn_format::consts::INODE_FLAGS)
}

/// The node of the file opened for its content when it is not the one the scan
/// saw: the entry was replaced between the two (an editor saving by rename, a
/// swap). Made again from the open file, extended attributes too, so that a
/// snapshot never pairs one file's content with another's owner and mode (a
/// root-only file saved with the world-readable mode of the placeholder it
/// replaced). `None`: the same file, or not a regular file now (its read fails).
pub fn reopened_node(node: &Node, f: &std::fs::File) -> Option<Node> {
    let m = f.metadata().ok()?;
    // The inode number alone is not enough: a file removed and another created
    // may get it back. Its change time moves with any change of owner, mode or
    // content, and a new file has its own.
    let same = (m.dev(), m.ino()) == (node.dev, node.inode)
        && (m.ctime(), m.ctime_nsec()) == (node.ctime.secs, i64::from(node.ctime.nanos));
    if same || !m.file_type().is_file() {
        return None;
    }
    let mut names = NameCache::default();
    let (mut fresh, _, _) = node_reusing_parent(
        node.name.clone(),
        &|_| PathBuf::new(),
        &Stat::from(&m),
        &mut names,
        None,
        true,
    );
    // Unreadable attributes: the content is still saved, as for any file whose
    // attributes cannot be read (the caller's read of them warns likewise).
    fresh.xattrs = read_xattrs_of(f).unwrap_or_default();
    Some(fresh)
}

/// The xattrs of an open file, sorted; a warning message when they cannot be read.
pub fn read_xattrs_of(f: &std::fs::File) -> Result<Xattrs, String> {
    use xattr::FileExt;
    let mut out = Vec::new();
    let names = match f.list_xattr() {
        Ok(n) => n,
        Err(e) if e.raw_os_error() == Some(libc::ENOTSUP) => return Ok(out),
        Err(e) => return Err(format!("reading extended attributes: {e}")),
    };
    for name in names {
        match f.get_xattr(&name) {
            Ok(Some(v)) => out.push((name.as_bytes().to_vec(), v)),
            Ok(None) => {}
            Err(e) => return Err(format!("reading extended attributes: {e}")),
        }
    }
    out.sort();
    Ok(out)
}

/// Extended attributes as (name, value) pairs, sorted by name.
pub type Xattrs = Vec<(Vec<u8>, Vec<u8>)>;

pub(crate) fn read_xattrs(path: &Path) -> std::io::Result<Xattrs> {
    let mut out = Vec::new();
    let names = match xattr::list(path) {
        Ok(n) => n,
        // Filesystems without xattr support have none to save.
        Err(e) if e.raw_os_error() == Some(libc::ENOTSUP) => return Ok(out),
        Err(e) => return Err(e),
    };
    for name in names {
        if let Some(v) = xattr::get(path, &name)? {
            out.push((name.as_bytes().to_vec(), v));
        }
    }
    out.sort();
    Ok(out)
}

/// What a backup leaves out (besides other file systems with `-x`), with restic's
/// options and meaning.
#[derive(Clone, Debug, Default)]
pub struct ExcludeRules {
    /// `--exclude`: a pattern without `/` matches a name at any depth (`*.tmp`,
    /// `node_modules`); a pattern with `/` matches the absolute path
    /// (`/home/*/.cache`), and a relative one with `/` matches at any depth.
    pub patterns: Vec<String>,
    /// `--iexclude`: the same, ignoring case.
    pub ipatterns: Vec<String>,
    /// Each pattern also matches what is below what it matches, negations or
    /// not: restore's includes, whose matched directories are entered when a
    /// `!` in either list may take some of their entries back.
    pub below: bool,
    /// `--exclude-if-present NAME[:HEADER]`: the content of a directory holding an
    /// entry NAME (a regular file starting with the bytes HEADER, when given) is
    /// left out; the directory and NAME stay.
    pub if_present: Vec<String>,
    /// `--exclude-caches`: directories tagged as caches ([`CACHEDIR_TAG`]).
    pub caches: bool,
    /// `--exclude-larger-than`: regular files of more than this many bytes.
    pub larger_than: Option<u64>,
    /// Directories never backed up, whatever the path they are reached by: the
    /// repository the backup writes to (the engine adds it). Backing it up would
    /// store packs being written, and each backup would hold all the ones before.
    pub own_dirs: Vec<PathBuf>,
}

impl ExcludeRules {
    /// Only `--exclude` patterns.
    pub fn patterns(patterns: &[String]) -> Self {
        ExcludeRules {
            patterns: patterns.to_vec(),
            ..Default::default()
        }
    }
}

/// The tag file of the Cache Directory Tagging Specification
/// (<https://bford.info/cachedir/>): the name, and the first bytes it must hold.
pub const CACHEDIR_TAG: (&str, &str) = (
    "CACHEDIR.TAG",
    "Signature: 8a477f597d28d172789f06886806bc55",
);

/// The longest header `--exclude-if-present` compares (more would be read from
/// every tagged directory for nothing: a tag is a name and a signature).
const TAG_HEADER_MAX: usize = 4096;

/// [`ExcludeRules`] ready to be asked about each entry.
pub struct Excludes {
    /// `--exclude`'s patterns, then `--iexclude`'s: each list judges on its own,
    /// as in restic, so a `!` in one takes back only what that list left out.
    groups: Vec<PatternGroup>,
    /// Tag file names, with the header each must start with.
    tags: Vec<(Vec<u8>, Option<Vec<u8>>)>,
    larger_than: Option<u64>,
    /// `own_dirs` as (device, inode): a bind mount or another spelling reaches the same.
    own: Vec<(u64, u64)>,
}

/// An exclude pattern as a path is cleaned (as restic's `filepath.Clean` does):
/// `//` is `/`, `./` segments go, `x/..` goes where `x` is a plain name, and a
/// trailing `/` goes. `./src/a`, `src//a` and `/srv/./data` matched nothing
/// before, silently (QA).
fn clean_pattern(p: &str) -> String {
    let absolute = p.starts_with('/');
    let mut parts: Vec<&str> = Vec::new();
    for seg in p.split('/') {
        match seg {
            "" | "." => {}
            ".." if parts
                .last()
                .is_some_and(|l| *l != ".." && !l.contains(['*', '?', '[', '\\'])) =>
            {
                parts.pop();
            }
            _ => parts.push(seg),
        }
    }
    let joined = parts.join("/");
    // `/` alone names no entry (it was skipped before too).
    if absolute && !joined.is_empty() {
        format!("/{joined}")
    } else {
        joined
    }
}

/// The patterns of one option (`--exclude` or `--iexclude`), ready to match.
struct PatternGroup {
    set: crate::pattern::GlobSet,
    /// Which patterns of `set` start with `!`: they take back what an earlier
    /// pattern left out (the last matching pattern decides, as in restic). Empty
    /// when none does.
    negated: Vec<bool>,
}

impl PatternGroup {
    /// `None` when no pattern names anything. `below`: as
    /// [`ExcludeRules::below`].
    fn new(patterns: &[String], fold: bool, below: bool) -> Result<Option<Self>, String> {
        let mut globs: Vec<String> = Vec::new();
        let mut given: Vec<&str> = Vec::new();
        let mut negated = Vec::new();
        for p in patterns {
            // `!PATTERN` includes again what matches it (`\!` for a name that
            // starts with `!`).
            let (rest, not) = match p.strip_prefix('!') {
                Some(rest) => (rest, true),
                None => (p.as_str(), false),
            };
            let clean = clean_pattern(rest);
            if clean.is_empty() {
                continue;
            }
            let full = if clean.starts_with('/') {
                clean
            } else {
                format!("**/{clean}")
            };
            globs.push(full);
            given.push(p);
            negated.push(not);
        }
        if globs.is_empty() {
            return Ok(None);
        }
        let any_negated = negated.contains(&true);
        if !any_negated {
            negated.clear();
        }
        if any_negated || below {
            // With negations, a pattern also matches what is below what it
            // matches, as restic matches a pattern against any run of a path's
            // components: `!keep` takes back `keep/k.txt` from `*.txt`, not only
            // the directory (QA). (Without negations that changes nothing for
            // excludes: what a pattern matches is not entered; restore's
            // includes ask for it, `below`.) Pattern `i` is globs `2i` and
            // `2i + 1`.
            globs = globs
                .into_iter()
                .flat_map(|g| {
                    let under = format!("{}/**", g.trim_end_matches('/'));
                    [g, under]
                })
                .collect();
            given = given.into_iter().flat_map(|p| [p, p]).collect();
        }
        let set = crate::pattern::GlobSet::new(globs.iter().map(|p| (p.as_str(), fold))).map_err(
            |e| {
                // Named as given, not as rewritten for matching (`**/[`).
                let bad = globs
                    .iter()
                    .zip(&given)
                    .find(|(g, _)| crate::pattern::GlobSet::new([(g.as_str(), fold)]).is_err());
                match bad {
                    Some((_, p)) => {
                        let why = e.rsplit(": ").next().unwrap_or(&e).to_string();
                        format!("invalid exclude pattern {p:?}: {why}")
                    }
                    None => format!("invalid exclude pattern: {e}"),
                }
            },
        )?;
        Ok(Some(PatternGroup { set, negated }))
    }

    fn is_excluded(&self, path: &[u8]) -> bool {
        if self.negated.is_empty() {
            return self.set.is_match_bytes(path);
        }
        self.set
            .last_match_bytes(path)
            .is_some_and(|i| !self.negated[i / 2])
    }
}

impl Excludes {
    pub fn new(rules: &ExcludeRules) -> Result<Self, String> {
        let mut groups = Vec::new();
        for (patterns, fold) in [(&rules.patterns, false), (&rules.ipatterns, true)] {
            if let Some(group) = PatternGroup::new(patterns, fold, rules.below)? {
                groups.push(group);
            }
        }
        let mut tags = Vec::new();
        for t in &rules.if_present {
            let (name, header) = match t.split_once(':') {
                Some((n, h)) => (n, Some(h.as_bytes().to_vec())),
                None => (t.as_str(), None),
            };
            if name.is_empty() || name.contains('/') || name == "." || name == ".." {
                return Err(format!(
                    "--exclude-if-present {t:?}: give a file name (NAME or NAME:HEADER), not a path"
                ));
            }
            if header
                .as_ref()
                .is_some_and(|h| h.is_empty() || h.len() > TAG_HEADER_MAX)
            {
                return Err(format!(
                    "--exclude-if-present {t:?}: the header after ':' must be 1 to {TAG_HEADER_MAX} bytes"
                ));
            }
            tags.push((name.as_bytes().to_vec(), header));
        }
        if rules.caches {
            let (name, header) = CACHEDIR_TAG;
            tags.push((name.as_bytes().to_vec(), Some(header.as_bytes().to_vec())));
        }
        // A directory that cannot be looked at now is not one the walk can enter.
        let own = (rules.own_dirs.iter())
            .filter_map(|d| std::fs::metadata(d).ok())
            .filter(|m| m.is_dir())
            .map(|m| (m.dev(), m.ino()))
            .collect();
        Ok(Excludes {
            groups,
            tags,
            larger_than: rules.larger_than,
            own,
        })
    }

    /// Only `--exclude` patterns.
    pub fn patterns(patterns: &[String]) -> Result<Self, String> {
        Self::new(&ExcludeRules::patterns(patterns))
    }

    /// Left out by a pattern: the last one that matches, unless it starts with `!`.
    pub fn is_excluded(&self, path: &Path) -> bool {
        let path = path.as_os_str().as_bytes();
        self.groups.iter().any(|g| g.is_excluded(path))
    }

    /// A regular file left out for its size.
    pub fn too_large(&self, mode: u32, size: u64) -> bool {
        self.larger_than
            .is_some_and(|max| size > max && mode & libc::S_IFMT == libc::S_IFREG)
    }

    /// Whether a tag rule is given (each directory is then looked at for it).
    pub fn has_tags(&self) -> bool {
        !self.tags.is_empty()
    }

    /// Whether `name` is one of the tags' names.
    pub fn is_tag_name(&self, name: &[u8]) -> bool {
        self.tags.iter().any(|(t, _)| t == name)
    }

    /// Whether the open directory `dir`, whose entries are `names` (sorted), holds one of the
    /// tags: then only its tag files are backed up (as restic documents it: the
    /// directory's content is left out; the directory and its tag stay, so a
    /// restore shows what was left out and why). Costs nothing for a directory
    /// without a tag's name; a header is read only from a regular file.
    pub fn tagged(&self, dir: &OwnedFd, names: &[Vec<u8>]) -> bool {
        self.tags.iter().any(|(tag, header)| {
            if names.binary_search(tag).is_err() {
                return false;
            }
            let Some(header) = header else { return true };
            let name = std::ffi::OsStr::from_bytes(tag);
            let Ok(st) =
                nix::sys::stat::fstatat(dir, name, nix::fcntl::AtFlags::AT_SYMLINK_NOFOLLOW)
            else {
                return false;
            };
            // Only a regular file is read (a FIFO would block the walk).
            if st.st_mode & libc::S_IFMT != libc::S_IFREG {
                return false;
            }
            let Ok(f) = open_noatime(Some(dir), name, false) else {
                return false;
            };
            use std::io::Read as _;
            let mut buf = vec![0u8; header.len()];
            let mut f = std::fs::File::from(f);
            f.read_exact(&mut buf).is_ok() && &buf == header
        })
    }

    /// [`Self::excludes_entry`] for a path named on the command line. With a `!`
    /// pattern, a pattern alone does not leave it out: something below it may be
    /// taken back, as in restic (QA: `--exclude '*' --exclude '!keep' DIR` was
    /// refused as "every path given is excluded", where restic keeps `DIR/keep`).
    pub fn excludes_named(&self, path: &Path, meta: &Metadata) -> bool {
        if self.groups.iter().any(|g| !g.negated.is_empty()) {
            self.excludes_at(&Stat::from(meta))
        } else {
            self.excludes_entry(path, meta)
        }
    }

    /// Every rule about an entry itself, for one known by its path and `lstat`: a
    /// path named on the command line, the estimate's and the progress total's walks.
    pub fn excludes_entry(&self, path: &Path, meta: &Metadata) -> bool {
        self.is_excluded(path)
            || self.too_large(meta.mode(), meta.len())
            || self.is_own(meta.mode(), meta.dev(), meta.ino())
    }

    /// [`Self::excludes_entry`] for an entry of an open directory, from its `fstatat`
    /// (its name was judged by the caller).
    pub fn excludes_at(&self, st: &Stat) -> bool {
        self.too_large(st.mode, st.size) || self.is_own(st.mode, st.dev, st.ino)
    }

    /// One of [`ExcludeRules::own_dirs`].
    fn is_own(&self, mode: u32, dev: u64, ino: u64) -> bool {
        !self.own.is_empty()
            && mode & libc::S_IFMT == libc::S_IFDIR
            && self.own.contains(&(dev, ino))
    }
}

/// Adds up the sizes of the regular files a backup of `paths` would read (what
/// `excludes` leaves out is not entered; with `one_file_system`, neither are
/// other filesystems), setting the running sum as `progress`'s total, for an
/// ETA. Directories are read without moving their access times, as the backup
/// reads them. Stops when `stop` returns true; unreadable entries are passed over
/// (the backup itself reports them).
pub fn scan_total(
    paths: &[PathBuf],
    excludes: &Excludes,
    one_file_system: bool,
    progress: &crate::progress::Progress,
    stop: &dyn Fn() -> bool,
) {
    let mut total = 0u64;
    // The paths as the backup resolves them.
    let mut stack: Vec<(PathBuf, Option<u64>)> = paths
        .iter()
        .filter_map(|p| super::absolute(p).ok())
        .map(|p| (p, None))
        .collect();
    while let Some((path, dev)) = stack.pop() {
        if stop() {
            return;
        }
        // Only a path named on the command line has no device yet.
        let named = dev.is_none();
        if !named && excludes.is_excluded(&path) {
            continue;
        }
        let Ok(m) = std::fs::symlink_metadata(&path) else {
            continue;
        };
        let out = if named {
            excludes.excludes_named(&path, &m)
        } else {
            excludes.excludes_entry(&path, &m)
        };
        if out {
            continue;
        }
        if one_file_system && dev.is_some_and(|d| d != m.dev()) {
            continue;
        }
        if m.is_file() {
            total += m.len();
            progress.set_total(Some(total), None);
            continue;
        }
        if !m.is_dir() {
            continue;
        }
        let Ok(fd) = open_dir(&path) else {
            continue;
        };
        let Ok(fd2) = fd.try_clone() else {
            continue;
        };
        let Ok(mut dir) = nix::dir::Dir::from_fd(fd2) else {
            continue;
        };
        let mut names: Vec<Vec<u8>> = dir
            .iter()
            .flatten()
            .map(|e| e.file_name().to_bytes().to_vec())
            .filter(|n| n != b"." && n != b"..")
            .collect();
        names.sort_unstable();
        if excludes.has_tags() && excludes.tagged(&fd, &names) {
            names.retain(|n| excludes.is_tag_name(n));
        }
        for name in names {
            stack.push((path.join(std::ffi::OsStr::from_bytes(&name)), Some(m.dev())));
        }
    }
}

/// Files at least this large are checked for holes (smaller ones are read as they
/// are: one more system call each would cost more than a hole could save).
pub(crate) const SPARSE_MIN_BYTES: u64 = 1 << 20;

/// Whether `file` looks sparse: large, with fewer blocks allocated than its size
/// (a VM disk, a database file with holes). A compressing filesystem can say so of
/// a file without holes; the reader then only finds no hole.
pub(crate) fn looks_sparse(file: &std::fs::File) -> bool {
    use std::os::unix::fs::MetadataExt;
    file.metadata()
        .is_ok_and(|m| m.is_file() && m.len() >= SPARSE_MIN_BYTES && m.blocks() * 512 < m.len())
}

/// Reads a sparse file front to back, holes as zeros without reading them: the
/// kernel would zero a page-cache page for every 4 KiB of a hole and copy it out
/// (in a profile of a disk image backup, a third of all CPU). Where the data and
/// the holes are is asked as the read reaches them (`SEEK_DATA`, `SEEK_HOLE`), so
/// a file that changes while it is read reads as a plain read would, roughly: what
/// was written before the read got there. A filesystem that cannot say gets plain
/// reads.
pub(crate) struct SparseReader<'a> {
    file: &'a std::fs::File,
    pos: u64,
    /// The next data segment `[start, end)` at or after `pos`; `None` until asked,
    /// and again once `pos` reaches its end.
    segment: Option<(u64, u64)>,
    /// The filesystem answered something unexpected: plain reads from here on.
    plain: bool,
}

impl<'a> SparseReader<'a> {
    pub(crate) fn new(file: &'a std::fs::File) -> Self {
        SparseReader {
            file,
            pos: 0,
            segment: None,
            plain: false,
        }
    }
}

/// The first data segment `[start, end)` of `file` at or after `at` (`SEEK_DATA`,
/// then `SEEK_HOLE`); `None` when only holes follow, up to the end of the file. An
/// error where the filesystem cannot say or answers inconsistently: the caller then
/// reads everything.
pub(crate) fn data_after(file: &std::fs::File, at: u64) -> std::io::Result<Option<(u64, u64)>> {
    use nix::unistd::{Whence, lseek};
    let start = match lseek(file, at as libc::off_t, Whence::SeekData) {
        Ok(d) => d as u64,
        Err(nix::errno::Errno::ENXIO) => return Ok(None),
        Err(e) => return Err(e.into()),
    };
    let end = lseek(file, start as libc::off_t, Whence::SeekHole)? as u64;
    if start < at || end <= start {
        return Err(std::io::Error::other("inconsistent SEEK_DATA/SEEK_HOLE"));
    }
    Ok(Some((start, end)))
}

impl std::io::Read for SparseReader<'_> {
    fn read(&mut self, buf: &mut [u8]) -> std::io::Result<usize> {
        use std::os::unix::fs::FileExt;
        if buf.is_empty() {
            return Ok(0);
        }
        if !self.plain && self.segment.is_none() {
            match data_after(self.file, self.pos) {
                Ok(Some(seg)) => self.segment = Some(seg),
                Ok(None) => {
                    // Only holes from here: zeros up to the size the file has now.
                    let size = self.file.metadata()?.len();
                    let n = size.saturating_sub(self.pos).min(buf.len() as u64) as usize;
                    buf[..n].fill(0);
                    self.pos += n as u64;
                    return Ok(n);
                }
                Err(_) => self.plain = true,
            }
        }
        let want = match self.segment {
            Some((start, _)) if self.pos < start => {
                let n = (start - self.pos).min(buf.len() as u64) as usize;
                buf[..n].fill(0);
                self.pos += n as u64;
                return Ok(n);
            }
            Some((_, end)) => (end - self.pos).min(buf.len() as u64) as usize,
            None => buf.len(),
        };
        let n = self.file.read_at(&mut buf[..want], self.pos)?;
        self.pos += n as u64;
        // 0: the file ended inside what was data (it shrank), as a plain read says.
        if n == 0 || self.segment.is_some_and(|(_, end)| self.pos >= end) {
            self.segment = None;
        }
        Ok(n)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A source file is read without moving its access time (`O_NOATIME`, kept
    /// when the open's `O_NONBLOCK` is taken off: clearing every flag once made
    /// a second backup's trees differ from the first's), and a FIFO put in a
    /// file's place is refused at once, not waited on.
    #[test]
    fn source_files_keep_their_access_time_and_a_fifo_is_refused() {
        use std::io::Read;
        let tmp = tempfile::tempdir().unwrap();
        let f = tmp.path().join("f");
        std::fs::write(&f, b"content").unwrap();
        let old = std::time::SystemTime::UNIX_EPOCH + std::time::Duration::from_secs(1_000_000_000);
        std::fs::File::options()
            .write(true)
            .open(&f)
            .unwrap()
            .set_times(std::fs::FileTimes::new().set_accessed(old))
            .unwrap();
        let mut file = open_source(&f).unwrap();
        let flags = nix::fcntl::fcntl(&file, nix::fcntl::FcntlArg::F_GETFL).unwrap();
        assert_eq!(flags & libc::O_NONBLOCK, 0);
        let mut buf = Vec::new();
        file.read_to_end(&mut buf).unwrap();
        assert_eq!(buf, b"content");
        assert_eq!(std::fs::metadata(&f).unwrap().accessed().unwrap(), old);
        let p = tmp.path().join("p");
        nix::unistd::mkfifo(&p, nix::sys::stat::Mode::S_IRWXU).unwrap();
        let e = open_source(&p).unwrap_err();
        assert!(e.to_string().contains("it is now a FIFO"), "{e}");
        let l = tmp.path().join("l");
        std::os::unix::fs::symlink("/dev/zero", &l).unwrap();
        let e = open_source(&l).unwrap_err();
        assert!(e.to_string().contains("it is now a symbolic link"), "{e}");
        let s = tmp.path().join("s");
        let _sock = std::os::unix::net::UnixListener::bind(&s).unwrap();
        let e = open_source(&s).unwrap_err();
        assert!(e.to_string().contains("it is now a socket"), "{e}");
    }

    /// Patterns are cleaned as paths before matching (QA: `./src/a`, `src//a`,
    /// `/tmp//x` and `a/./b` matched nothing), and a bad one is named as given.
    #[test]
    fn exclude_patterns_are_cleaned_and_named_as_given() {
        for (given, clean) in [
            ("./src/a", "src/a"),
            ("src//a/", "src/a"),
            ("a/./b", "a/b"),
            ("/tmp//x/./y", "/tmp/x/y"),
            ("a/b/../c", "a/c"),
            ("*/../c", "*/../c"),
            ("/", ""),
            ("*.tmp", "*.tmp"),
        ] {
            assert_eq!(clean_pattern(given), clean, "{given}");
        }
        let ex = |p: &str| {
            Excludes::new(&ExcludeRules {
                patterns: vec![p.to_string()],
                ..Default::default()
            })
        };
        for p in ["./src/a", "src//a", "/srv//backup/src/a"] {
            assert!(
                ex(p).unwrap().is_excluded(Path::new("/srv/backup/src/a")),
                "{p}"
            );
        }
        let e = ex("[").err().unwrap();
        assert!(e.starts_with("invalid exclude pattern \"[\""), "{e}");
        assert!(!e.contains("**/"), "{e}");
    }

    /// Reads `r` to its end in reads of `step` bytes.
    fn read_all(r: &mut dyn std::io::Read, step: usize) -> Vec<u8> {
        let mut out = Vec::new();
        let mut buf = vec![0xEEu8; step];
        loop {
            let n = r.read(&mut buf).unwrap();
            if n == 0 {
                return out;
            }
            out.extend_from_slice(&buf[..n]);
        }
    }

    #[test]
    fn a_sparse_file_reads_as_it_is_holes_and_all() {
        use std::fs::File;
        use std::os::unix::fs::FileExt;
        let d = tempfile::tempdir().unwrap();
        type Pieces = &'static [(u64, usize)];
        let cases: [(&str, u64, Pieces); 3] = [
            // Data at the start, in the middle across a MiB boundary, at the end.
            (
                "middle",
                (5 << 20) + 123,
                &[(0, 3000), ((2 << 20) - 10, 9000), ((5 << 20), 123)],
            ),
            // A hole at the start and at the end.
            ("ends", 4 << 20, &[((1 << 20) + 4096, 100_000)]),
            // No data at all.
            ("empty", 3 << 20, &[]),
        ];
        for (name, size, pieces) in cases {
            let path = d.path().join(name);
            let f = File::create(&path).unwrap();
            f.set_len(size).unwrap();
            for (i, &(at, len)) in pieces.iter().enumerate() {
                let bytes: Vec<u8> = (0..len).map(|k| (k % 251) as u8 | 1 | i as u8).collect();
                f.write_all_at(&bytes, at).unwrap();
            }
            drop(f);
            let want = std::fs::read(&path).unwrap();
            let f = File::open(&path).unwrap();
            assert!(looks_sparse(&f), "{name}");
            for step in [1 << 20, 65536, 5000] {
                let got = read_all(&mut SparseReader::new(&f), step);
                assert!(got == want, "{name} in reads of {step}");
            }
        }
        // A file without holes is not taken for sparse.
        let full = d.path().join("full");
        std::fs::write(&full, vec![7u8; 2 << 20]).unwrap();
        assert!(!looks_sparse(&File::open(&full).unwrap()));
    }

    /// The total leaves out what is excluded, and reading the directories moves
    /// none of their access times.
    #[test]
    fn the_total_counts_what_the_backup_reads_and_moves_no_access_time() {
        let d = tempfile::tempdir().unwrap();
        let root = d.path().join("src");
        std::fs::create_dir_all(root.join("keep/deeper")).unwrap();
        std::fs::create_dir_all(root.join("cache")).unwrap();
        std::fs::write(root.join("keep/a"), vec![1u8; 1000]).unwrap();
        std::fs::write(root.join("keep/deeper/b"), vec![2u8; 234]).unwrap();
        std::fs::write(root.join("cache/big"), vec![3u8; 50_000]).unwrap();
        // An access time in the past: any read of the directory (relatime) moves it.
        let old = nix::sys::time::TimeSpec::new(1_000_000, 0);
        for dir in [root.clone(), root.join("keep"), root.join("keep/deeper")] {
            nix::sys::stat::utimensat(
                nix::fcntl::AT_FDCWD,
                &dir,
                &old,
                &nix::sys::time::TimeSpec::UTIME_OMIT,
                nix::sys::stat::UtimensatFlags::NoFollowSymlink,
            )
            .unwrap();
        }
        let p = crate::progress::Progress::none();
        let ex = Excludes::patterns(&["cache".into()]).unwrap();
        scan_total(std::slice::from_ref(&root), &ex, false, &p, &|| false);
        assert_eq!(p.status().bytes_total, Some(1234));
        for dir in [root.clone(), root.join("keep"), root.join("keep/deeper")] {
            let at = std::fs::symlink_metadata(&dir).unwrap().atime();
            assert_eq!(at, 1_000_000, "{}", dir.display());
        }
    }

    #[test]
    fn exclude_semantics() {
        let e = Excludes::patterns(&["*.tmp".into(), "/home/*/.cache".into(), "build/out".into()])
            .unwrap();
        assert!(e.is_excluded(Path::new("/a/b/x.tmp")));
        assert!(!e.is_excluded(Path::new("/a/b/x.tmpl")));
        assert!(e.is_excluded(Path::new("/home/joe/.cache")));
        assert!(!e.is_excluded(Path::new("/home/joe/x/.cache")));
        assert!(e.is_excluded(Path::new("/src/build/out")));
        assert!(!e.is_excluded(Path::new("/src/build/outx")));
    }

    /// `!PATTERN` takes back what an earlier pattern left out; the last pattern
    /// that matches decides (restic's rule), and `\!` is a literal `!`.
    #[test]
    fn negated_patterns_include_again() {
        let e = Excludes::patterns(&[
            "*.log".into(),
            "!keep.log".into(),
            "/var/*".into(),
            "!/var/lib".into(),
            "/var/lib/tmp".into(),
            "\\!odd".into(),
        ])
        .unwrap();
        assert!(e.is_excluded(Path::new("/a/x.log")));
        assert!(!e.is_excluded(Path::new("/a/keep.log")));
        assert!(e.is_excluded(Path::new("/var/cache")));
        assert!(!e.is_excluded(Path::new("/var/lib")));
        assert!(e.is_excluded(Path::new("/var/lib/tmp")));
        assert!(e.is_excluded(Path::new("/a/!odd")));
        assert!(!e.is_excluded(Path::new("/a/odd")));
        // Only negations: nothing is left out.
        let e = Excludes::patterns(&["!*.log".into()]).unwrap();
        assert!(!e.is_excluded(Path::new("/a/x.log")));
        // A negation takes back what is below what it names, as restic's (QA:
        // `!keep` brought back the directory and none of its files).
        let e = Excludes::patterns(&["*.txt".into(), "!keep".into()]).unwrap();
        assert!(!e.is_excluded(Path::new("/t/keep/k.txt")));
        assert!(!e.is_excluded(Path::new("/t/keep/deeper/k.txt")));
        assert!(e.is_excluded(Path::new("/t/other/k.txt")));
        let e = Excludes::patterns(&["*".into(), "!t".into(), "!t/*".into()]).unwrap();
        assert!(!e.is_excluded(Path::new("/t/a/b")));
        assert!(e.is_excluded(Path::new("/u")));
    }

    /// `--exclude` and `--iexclude` judge apart, as in restic: a `!` in one list
    /// does not take back what the other left out (QA: it did, in either order).
    #[test]
    fn a_negation_applies_to_its_own_option_only() {
        let e = Excludes::new(&ExcludeRules {
            patterns: vec!["*.log".into(), "!b.log".into()],
            ipatterns: vec!["*.TMP".into(), "!A.LOG".into()],
            ..Default::default()
        })
        .unwrap();
        assert!(e.is_excluded(Path::new("/d/a.log")));
        assert!(!e.is_excluded(Path::new("/d/b.log")));
        assert!(e.is_excluded(Path::new("/d/x.tmp")));
        let e = Excludes::new(&ExcludeRules {
            patterns: vec!["!x.tmp".into()],
            ipatterns: vec!["*.TMP".into()],
            ..Default::default()
        })
        .unwrap();
        assert!(e.is_excluded(Path::new("/d/x.tmp")));
        // A bad pattern in either list is named as given.
        let err = Excludes::new(&ExcludeRules {
            ipatterns: vec!["ok".into(), "[x".into()],
            ..Default::default()
        })
        .err()
        .unwrap_or_default();
        assert!(err.contains("\"[x\""), "{err}");
    }
}
