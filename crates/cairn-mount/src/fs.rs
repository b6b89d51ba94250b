//! The FUSE file system: requests from the kernel answered from the inode table,
//! the snapshot listing, trees (read when a directory is looked into) and file
//! content (read at the offsets asked).
//!
//! Everything below a snapshot never changes, so the kernel may keep its names and
//! attributes for a long time ([`IMMUTABLE_TTL`]) and a listing answers with the
//! attributes of every entry at once (`readdirplus`): `ls -l` of a directory is one
//! tree read and no request per entry. The top level follows the snapshot list and
//! is kept for a second only.
//!
//! Every failure to read from the repository answers EIO and is reported once
//! through the log with what could not be read; the rest of the file system goes
//! on. Nothing read from the repository is trusted to be well formed.

use crate::fetch::Fetcher;
use crate::file::OpenFile;
use crate::inodes::{HOSTS, LinkKey, ROOT, SNAPSHOTS, Table, What};
use crate::layout::SnapEntry;
use crate::log::Log;
use crate::sessions::Sessions;
use crate::trees::{TreeCache, lock};
use cairn_core::session::Read;
use cairn_format::tree::{Content, Node, NodeKind, Timestamp, Tree, is_acl_name};
use cairn_format::{BlobId, SnapshotId};
use fuser::{
    Errno, FileAttr, FileHandle, FileType, Filesystem, FopenFlags, Generation, INodeNo, InitFlags,
    KernelConfig, OpenAccMode, OpenFlags, ReplyAttr, ReplyData, ReplyDirectory, ReplyDirectoryPlus,
    ReplyEmpty, ReplyEntry, ReplyLseek, ReplyOpen, ReplyStatfs, ReplyXattr, Request,
};
use std::collections::HashMap;
use std::ffi::OsStr;
use std::os::unix::ffi::OsStrExt;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

/// How long the kernel keeps names and attributes of snapshot content.
pub const IMMUTABLE_TTL: Duration = Duration::from_secs(24 * 3600);
/// How long it keeps those of the top level (which follows the snapshot list).
pub const VIRTUAL_TTL: Duration = Duration::from_secs(1);

/// Shared by the kernel's request threads and the mount handle.
pub struct State {
    pub sessions: Arc<Sessions>,
    pub table: Mutex<Table>,
    pub trees: TreeCache,
    pub fetch: Fetcher,
    files: Mutex<HashMap<u64, Arc<OpenFile>>>,
    /// Files being read without an OPEN (the kernel's no-open mode, see `open`),
    /// by inode.
    by_inode: Mutex<InodeFiles>,
    /// The kernel can skip OPEN and RELEASE: `open` answers ENOSYS to turn that on.
    no_open: AtomicBool,
    dirs: Mutex<HashMap<u64, Arc<DirList>>>,
    next_fh: AtomicU64,
    /// The owner of the top-level directories (the user who mounted).
    owner: (u32, u32),
    pub log: Log,
    xattrs: bool,
    /// Others may use the mount (`--allow-other`): the kernel must then apply the
    /// recorded POSIX ACLs in its permission checks.
    allow_other: bool,
    /// The kernel checks permissions against POSIX ACLs (FUSE_POSIX_ACL is on).
    acl_checks: AtomicBool,
    /// Which chunks are holes ([`crate::holes`]).
    zeros: crate::holes::Zeros,
    /// Bytes of data (holes left out) of files with chunk lists, by list.
    data_bytes: Mutex<HashMap<BlobId, u64>>,
}

/// Files whose data bytes are remembered at most (about 50 bytes each).
const DATA_BYTES_KEPT: usize = 100_000;

/// An open directory: what it lists, fixed when it was opened.
enum DirList {
    Virtual(Vec<VEntry>),
    Tree {
        snap: SnapshotId,
        id: BlobId,
        tree: Arc<Tree>,
    },
}

/// Files read without OPEN, by inode. Without OPEN the kernel sends no RELEASE
/// either, so nothing says when a file is done with: the table keeps the most
/// recently read [`INODE_FILES`] and forgets the others (a forgotten file's next
/// read sets it up again, at the cost of one chunk-list descent).
#[derive(Default)]
struct InodeFiles {
    map: HashMap<u64, (Arc<OpenFile>, u64)>,
    tick: u64,
}

/// Files kept by [`InodeFiles`]: far more than are read at once (a file's state
/// is its chunk window, at most 40 KiB).
const INODE_FILES: usize = 512;

impl InodeFiles {
    fn get(&mut self, ino: u64) -> Option<Arc<OpenFile>> {
        self.tick += 1;
        let tick = self.tick;
        self.map.get_mut(&ino).map(|(f, used)| {
            *used = tick;
            f.clone()
        })
    }

    fn insert(&mut self, ino: u64, f: Arc<OpenFile>) {
        if self.map.len() >= INODE_FILES && !self.map.contains_key(&ino) {
            // Forget the older half at once, so that eviction costs O(1) a file.
            let mut ticks: Vec<u64> = self.map.values().map(|(_, t)| *t).collect();
            let (_, median, _) = ticks.select_nth_unstable(INODE_FILES / 2);
            let median = *median;
            self.map.retain(|_, (_, t)| *t > median);
        }
        self.tick += 1;
        self.map.insert(ino, (f, self.tick));
    }

    fn remove(&mut self, ino: u64) {
        self.map.remove(&ino);
    }
}

/// An entry of a top-level directory.
struct VEntry {
    name: Vec<u8>,
    what: What,
    attr: FileAttr,
}

/// Why a request failed: the answer, and what to report (nothing for the
/// ordinary ones such as ENOENT).
struct Failure {
    errno: Errno,
    report: Option<String>,
}

impl Failure {
    fn of(errno: Errno) -> Failure {
        Failure {
            errno,
            report: None,
        }
    }
    fn io(report: String) -> Failure {
        Failure {
            errno: Errno::EIO,
            report: Some(report),
        }
    }
}

type Res<T> = Result<T, Failure>;

pub fn system_time(t: Timestamp) -> SystemTime {
    let nanos = Duration::from_nanos(u64::from(t.nanos.min(999_999_999)));
    if t.secs >= 0 {
        UNIX_EPOCH
            .checked_add(Duration::from_secs(t.secs as u64))
            .and_then(|x| x.checked_add(nanos))
            .unwrap_or(UNIX_EPOCH)
    } else {
        UNIX_EPOCH
            .checked_sub(Duration::from_secs(t.secs.unsigned_abs()))
            .and_then(|x| x.checked_add(nanos))
            .unwrap_or(UNIX_EPOCH)
    }
}

/// A device number as the kernel's FUSE attributes carry it (`new_encode_dev`).
fn encode_rdev(rdev: u64) -> u32 {
    let (major, minor) = (
        nix::sys::stat::major(rdev) as u32,
        nix::sys::stat::minor(rdev) as u32,
    );
    (minor & 0xff) | ((major & 0xfff) << 8) | ((minor & !0xff) << 12)
}

fn kind_of(k: NodeKind) -> FileType {
    match k {
        NodeKind::File => FileType::RegularFile,
        NodeKind::Dir => FileType::Directory,
        NodeKind::Symlink => FileType::Symlink,
        NodeKind::Fifo => FileType::NamedPipe,
        NodeKind::CharDevice => FileType::CharDevice,
        NodeKind::BlockDevice => FileType::BlockDevice,
        NodeKind::Socket => FileType::Socket,
    }
}

/// A snapshot entry's attributes, as a restore would give them. Directories
/// report one link: the count recorded at backup may not match the entries the
/// snapshot holds (excluded subdirectories), and tools such as `find` take two
/// links to mean "no subdirectories"; one means "unknown".
pub fn node_attr(n: &Node) -> FileAttr {
    let size = match n.kind {
        NodeKind::Symlink => n.link_target.len() as u64,
        _ => n.size,
    };
    FileAttr {
        ino: INodeNo(0),
        size,
        blocks: size.div_ceil(512),
        atime: system_time(n.atime),
        mtime: system_time(n.mtime),
        ctime: system_time(n.ctime),
        crtime: system_time(n.mtime),
        kind: kind_of(n.kind),
        perm: (n.mode & 0o7777) as u16,
        nlink: match n.kind {
            NodeKind::Dir => 1,
            _ => n.nlink.clamp(1, u64::from(u32::MAX)) as u32,
        },
        uid: n.uid,
        gid: n.gid,
        rdev: encode_rdev(n.rdev),
        blksize: 4096,
        flags: 0,
    }
}

impl State {
    pub fn new(
        sessions: Arc<Sessions>,
        zeros: crate::holes::Zeros,
        trees: TreeCache,
        fetch: Fetcher,
        log: Log,
        xattrs: bool,
        allow_other: bool,
    ) -> State {
        State {
            sessions,
            table: Mutex::new(Table::default()),
            trees,
            fetch,
            files: Mutex::new(HashMap::new()),
            by_inode: Mutex::new(InodeFiles::default()),
            no_open: AtomicBool::new(false),
            dirs: Mutex::new(HashMap::new()),
            next_fh: AtomicU64::new(1),
            owner: (
                nix::unistd::geteuid().as_raw(),
                nix::unistd::getegid().as_raw(),
            ),
            log,
            xattrs,
            allow_other,
            acl_checks: AtomicBool::new(false),
            zeros,
            data_bytes: Mutex::new(HashMap::new()),
        }
    }

    /// Bytes of the file `n` that are not holes, from its chunk list when that
    /// is short enough ([`crate::holes::MAX_CHUNKS_LOOKED_AT`]); `None`: taken
    /// as all data.
    fn data_bytes(&self, n: &Node) -> Option<u64> {
        if let Some(d) = self.zeros.data_bytes_inline(&n.content) {
            return Some(d);
        }
        let Content::Tree { root, chunks, .. } = &n.content else {
            return None;
        };
        if let Some(d) = lock(&self.data_bytes).get(root) {
            return Some(*d);
        }
        if !self.zeros.may_have_holes(n.size, *chunks) {
            return None;
        }
        let session = self.session().ok()?;
        let mut data = 0u64;
        cairn_core::tree::chunklist::for_each_chunk(session.repo(), &n.content, &mut |c| {
            if !self.zeros.is_zero(&c) {
                data += c.length;
            }
            Ok(())
        })
        .ok()?;
        let mut known = lock(&self.data_bytes);
        if known.len() >= DATA_BYTES_KEPT {
            known.clear();
        }
        known.insert(*root, data);
        Some(data)
    }

    /// Where the next data (`SEEK_DATA`) or hole (`SEEK_HOLE`) at or after
    /// `offset` is in the file of inode `ino`; `None`: no data there (ENXIO).
    fn seek(&self, ino: u64, offset: u64, hole: bool) -> Res<Option<u64>> {
        let (tree, i, _) = self.node_of(ino)?;
        let n = tree.nodes.get(i).ok_or(Failure::of(Errno::ENOENT))?;
        if n.kind != NodeKind::File {
            return Err(Failure::of(Errno::EINVAL));
        }
        if offset >= n.size {
            return Ok(None);
        }
        // A file whose blocks are all counted ([`Self::data_bytes`]) is all data
        // here too: a seek that found holes in a file said to have none was taken
        // for zero-length data by copies (QA).
        if let Content::Tree { chunks, .. } = &n.content
            && !self.zeros.may_have_holes(n.size, *chunks)
        {
            return Ok(Some(if hole { n.size } else { offset }));
        }
        let session = self.session()?;
        let reader =
            cairn_core::tree::chunklist::FileReader::new(session.repo(), &n.content, n.size);
        let mut found = None;
        reader
            .chunks_from(offset, &mut |c, start| {
                if self.zeros.is_zero(&c) == hole {
                    found = Some(start.max(offset));
                    return Ok(false);
                }
                Ok(true)
            })
            .map_err(|e| {
                Failure::io(format!(
                    "reading the chunk list of {:?}: {e}",
                    lossy(&n.name)
                ))
            })?;
        Ok(match found {
            Some(at) => Some(at),
            // The end of the file is a hole (an implicit one).
            None if hole => Some(n.size),
            None => None,
        })
    }

    /// The attributes of a top-level directory or symlink (`secs`: its time).
    fn virtual_attr(&self, kind: FileType, size: u64, secs: i64) -> FileAttr {
        let t = system_time(Timestamp { secs, nanos: 0 });
        FileAttr {
            ino: INodeNo(0),
            size,
            blocks: 0,
            atime: t,
            mtime: t,
            ctime: t,
            crtime: t,
            kind,
            perm: if kind == FileType::Symlink {
                0o777
            } else {
                0o555
            },
            nlink: 1,
            uid: self.owner.0,
            gid: self.owner.1,
            rdev: 0,
            blksize: 4096,
            flags: 0,
        }
    }

    fn snap_root_attr(&self, e: &SnapEntry) -> FileAttr {
        self.virtual_attr(FileType::Directory, 0, e.secs)
    }

    /// The root's attributes, for `mount` to build the table with.
    pub fn root_attr(&self, single: Option<&SnapEntry>) -> FileAttr {
        match single {
            Some(e) => self.snap_root_attr(e),
            None => {
                let l = self.sessions.listing();
                self.virtual_attr(FileType::Directory, 0, l.latest().map_or(0, |e| e.secs))
            }
        }
    }

    /// A symlink's target at the top level (fixed per inode: a new target is a
    /// new inode, see [`crate::inodes::Table::lookup_current`]).
    fn virtual_target(&self, what: &What) -> Option<String> {
        match what {
            What::Latest(t) | What::HostLatest(_, t) => Some(t.clone()),
            What::ShortId(id) => Some(id.to_hex()),
            _ => None,
        }
    }

    /// The entries of a top-level directory, as the snapshot list is now.
    fn virtual_children(&self, what: &What) -> Option<Vec<VEntry>> {
        let l = self.sessions.listing();
        let dir = |secs| self.virtual_attr(FileType::Directory, 0, secs);
        let newest = l.latest().map_or(0, |e| e.secs);
        let mut v = Vec::new();
        match what {
            What::Top => {
                v.push(VEntry {
                    name: b"hosts".to_vec(),
                    what: What::Hosts,
                    attr: dir(newest),
                });
                if let Some(e) = l.latest() {
                    let target = format!("snapshots/{}", e.id.to_hex());
                    v.push(VEntry {
                        name: b"latest".to_vec(),
                        what: What::Latest(target.clone()),
                        attr: self.virtual_attr(FileType::Symlink, target.len() as u64, e.secs),
                    });
                }
                v.push(VEntry {
                    name: b"snapshots".to_vec(),
                    what: What::Snapshots,
                    attr: dir(newest),
                });
            }
            What::Hosts => {
                for h in l.hosts() {
                    let secs = l.host_latest(h).map_or(0, |e| e.secs);
                    v.push(VEntry {
                        name: h.as_bytes().to_vec(),
                        what: What::Host(h.to_string()),
                        attr: dir(secs),
                    });
                }
            }
            What::Snapshots => {
                for e in l.snapshots() {
                    v.push(VEntry {
                        name: e.id.to_hex().into_bytes(),
                        what: What::SnapRoot {
                            snap: e.id,
                            tree: e.tree,
                        },
                        attr: self.snap_root_attr(e),
                    });
                }
            }
            What::Host(h) => {
                let snaps = l.host_snapshots(h);
                for e in &snaps {
                    v.push(VEntry {
                        name: e.date.clone().into_bytes(),
                        what: What::SnapRoot {
                            snap: e.id,
                            tree: e.tree,
                        },
                        attr: self.snap_root_attr(e),
                    });
                }
                // As the root's `latest`: not a snapshot dated in the future.
                if let Some(e) = l.host_latest(h) {
                    v.push(VEntry {
                        name: b"latest".to_vec(),
                        what: What::HostLatest(h.clone(), e.date.clone()),
                        attr: self.virtual_attr(FileType::Symlink, e.date.len() as u64, e.secs),
                    });
                }
            }
            _ => return None,
        }
        Some(v)
    }

    fn what(&self, ino: u64) -> Res<What> {
        lock(&self.table)
            .get(ino)
            .map(|i| i.what.clone())
            .ok_or(Failure::of(Errno::ENOENT))
    }

    /// A tree, from the cache or read now.
    fn tree(&self, id: &BlobId, dir_name: &[u8]) -> Res<Arc<Tree>> {
        if let Some(t) = self.trees.get(id) {
            return Ok(t);
        }
        let session = self.session()?;
        let tree = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
            session.repo().load_tree(id)
        }))
        .unwrap_or_else(|_| {
            Err(cairn_core::Error::Invalid(format!(
                "reading tree {} panicked",
                id.short()
            )))
        })
        .map_err(|e| {
            let what = format!("tree {}", id.short());
            let e = e.to_string();
            Failure::io(if e.contains(&what) {
                format!("directory {:?}: {e}", lossy(dir_name))
            } else {
                format!("directory {:?}: {what}: {e}", lossy(dir_name))
            })
        })?;
        let tree = Arc::new(tree);
        self.trees.insert(*id, tree.clone());
        Ok(tree)
    }

    fn session(&self) -> Res<Arc<cairn_core::Session<cairn_core::session::Read>>> {
        self.sessions
            .get()
            .map_err(|e| Failure::io(format!("cannot open the repository: {e}")))
    }

    /// The node an entry inode stands for, with the tree holding it.
    fn node_of(&self, ino: u64) -> Res<(Arc<Tree>, usize, SnapshotId)> {
        let (dir, snap, name) = self.entry_place(ino)?;
        let tree = self.tree(&dir, b"")?;
        let i = position(&tree, &name).ok_or(Failure::of(Errno::ENOENT))?;
        Ok((tree, i, snap))
    }

    /// The tree holding an entry inode, its snapshot and the entry's name.
    fn entry_place(&self, ino: u64) -> Res<(BlobId, SnapshotId, Box<[u8]>)> {
        let t = lock(&self.table);
        let i = t.get(ino).ok_or(Failure::of(Errno::ENOENT))?;
        match &i.what {
            What::Entry { dir, snap, .. } => Ok((*dir, *snap, i.name.clone())),
            _ => Err(Failure::of(Errno::EINVAL)),
        }
    }

    /// `name` in the snapshot directory `parent` (whose tree is `dir`): one lookup.
    fn tree_lookup(
        &self,
        parent: u64,
        snap: SnapshotId,
        dir: BlobId,
        parent_name: &[u8],
        name: &[u8],
    ) -> Res<(u64, FileAttr)> {
        let tree = self.tree(&dir, parent_name)?;
        let node = tree.find(name).ok_or(Failure::of(Errno::ENOENT))?;
        Ok(
            lock(&self.table).lookup(parent, name, link_key(snap, node), || {
                entry_of(snap, dir, node, &self.zeros)
            }),
        )
    }

    fn lookup_in(&self, parent: u64, name: &[u8]) -> Res<(u64, FileAttr, bool)> {
        let (what, parent_name, is_dir) = {
            let t = lock(&self.table);
            let i = t.get(parent).ok_or(Failure::of(Errno::ENOENT))?;
            (
                i.what.clone(),
                i.name.clone(),
                i.attr.kind == FileType::Directory,
            )
        };
        match what {
            What::SnapRoot { snap, tree } => self
                .tree_lookup(parent, snap, tree, &parent_name, name)
                .map(|(i, a)| (i, a, true)),
            What::Entry {
                snap,
                subtree: Some(t),
                ..
            } => self
                .tree_lookup(parent, snap, t, &parent_name, name)
                .map(|(i, a)| (i, a, true)),
            // A directory recorded without a tree (nothing below it).
            What::Entry { .. } if is_dir => Err(Failure::of(Errno::ENOENT)),
            What::Entry { .. } => Err(Failure::of(Errno::ENOTDIR)),
            What::Top | What::Hosts | What::Snapshots | What::Host(_) => {
                self.sessions.refresh_if_stale();
                let children = self.virtual_children(&what).unwrap_or_default();
                if let Some(c) = children.into_iter().find(|c| c.name == name) {
                    let (ino, attr) =
                        lock(&self.table).lookup_current(parent, name, c.what, c.attr);
                    return Ok((ino, attr, false));
                }
                // `snapshots/PREFIX`: a unique id prefix, as a symlink to the id.
                if what == What::Snapshots
                    && let Some(e) = std::str::from_utf8(name)
                        .ok()
                        .and_then(|p| self.sessions.listing().by_prefix(p).map(|e| e.id))
                {
                    let attr = self.virtual_attr(FileType::Symlink, 64, 0);
                    let (ino, attr) =
                        lock(&self.table).lookup(parent, name, None, || (What::ShortId(e), attr));
                    return Ok((ino, attr, false));
                }
                Err(Failure::of(Errno::ENOENT))
            }
            What::Latest(_) | What::HostLatest(..) | What::ShortId(_) => {
                Err(Failure::of(Errno::ENOTDIR))
            }
        }
    }

    /// Current attributes of an inode (the top level's follow the snapshot list).
    fn attr(&self, ino: u64) -> Res<(FileAttr, bool)> {
        let (what, mut attr) = {
            let t = lock(&self.table);
            let i = t.get(ino).ok_or(Failure::of(Errno::ENOENT))?;
            (i.what.clone(), i.attr)
        };
        if let Some(target) = self.virtual_target(&what) {
            attr.size = target.len() as u64;
        }
        if let What::Entry {
            holes_unknown: true,
            ..
        } = what
            && let Ok((tree, i, _)) = self.node_of(ino)
            && let Some(n) = tree.nodes.get(i)
            && let Some(data) = self.data_bytes(n)
        {
            attr.blocks = crate::holes::blocks(n.size, data);
        }
        Ok((attr, what.immutable()))
    }

    fn open_dir(&self, ino: u64) -> Res<DirList> {
        let (what, name, is_dir) = {
            let t = lock(&self.table);
            let i = t.get(ino).ok_or(Failure::of(Errno::ENOENT))?;
            (
                i.what.clone(),
                i.name.clone(),
                i.attr.kind == FileType::Directory,
            )
        };
        match what {
            What::SnapRoot { snap, tree } => Ok(DirList::Tree {
                snap,
                id: tree,
                tree: self.tree(&tree, &name)?,
            }),
            What::Entry {
                snap,
                subtree: Some(t),
                ..
            } => Ok(DirList::Tree {
                snap,
                id: t,
                tree: self.tree(&t, &name)?,
            }),
            What::Entry { .. } if is_dir => Ok(DirList::Virtual(Vec::new())),
            What::Entry { .. } | What::Latest(_) | What::HostLatest(..) | What::ShortId(_) => {
                Err(Failure::of(Errno::ENOTDIR))
            }
            w => {
                self.sessions.refresh_if_stale();
                Ok(DirList::Virtual(
                    self.virtual_children(&w).unwrap_or_default(),
                ))
            }
        }
    }

    /// The reading state of a regular file entry: what an OPEN sets up.
    fn open_file(&self, ino: u64) -> Res<Arc<OpenFile>> {
        let (tree, i, snap) = self.node_of(ino)?;
        let n = tree.nodes.get(i).ok_or(Failure::of(Errno::ENOENT))?;
        if n.kind != NodeKind::File {
            return Err(Failure::of(Errno::EINVAL));
        }
        let label = format!("{:?} (snapshot {})", lossy(&n.name), snap.short());
        Ok(Arc::new(OpenFile::new(n.content.clone(), n.size, label)))
    }

    /// The file a READ without a handle is for, set up on its first read.
    fn file_of_inode(&self, ino: u64) -> Res<Arc<OpenFile>> {
        if let Some(f) = lock(&self.by_inode).get(ino) {
            return Ok(f);
        }
        let f = self.open_file(ino)?;
        lock(&self.by_inode).insert(ino, f.clone());
        Ok(f)
    }

    fn report(&self, f: &Failure) {
        if let Some(r) = &f.report {
            self.log.error(r);
        }
    }

    /// The answer for an extended attribute the entry `what` does not have.
    ///
    /// ENODATA, except where "not supported" is as true and saves a round trip
    /// per file: GNU `ls -l` asks every file for its SELinux label and its ACL,
    /// the kernel keeps no negative answer for either, and ls stops asking a
    /// device once it says "not supported" (100,000 files: 3.3 s with both
    /// questions, 0.8 s without).
    /// - `security.*`: always. Only the label's display in `ls` can differ (a
    ///   snapshot mixing labelled and unlabelled files); copies list the names
    ///   first and never ask for an absent one.
    /// - ACLs, when the kernel does not check permissions against them (without
    ///   `--allow-other`, see `init`; with its checks, "not supported" would fail
    ///   them): in a snapshot that records that none of its entries has an ACL.
    ///   A snapshot that has some answers ENODATA everywhere, so `ls` marks every
    ///   file that has one (unless the same `ls` listed an ACL-free snapshot
    ///   first: it remembers "not supported" for the whole mount). A snapshot
    ///   written before the count was kept (unknown) answers "not supported" for
    ///   a file whose directory has no entry with an ACL: `ls -l DIR` asks DIR itself first (a directory:
    ///   ENODATA), then its entries, so one listing still marks each file that
    ///   has one, but a recursive listing that meets an ACL-free directory
    ///   first stops showing the marks. getfacl and copies ask each file and get
    ///   its ACL whatever the answer to others.
    fn absent_xattr(&self, what: &What, name: &[u8]) -> Errno {
        if name.starts_with(b"security.") {
            return Errno::EOPNOTSUPP;
        }
        if !is_acl_name(name) {
            return Errno::NO_XATTR;
        }
        let (snap, file_in) = match what {
            What::Entry {
                snap, dir, subtree, ..
            } => (snap, subtree.is_none().then_some(dir)),
            What::SnapRoot { snap, .. } => (snap, None),
            _ => return Errno::NO_XATTR,
        };
        absent_acl(
            self.acl_checks.load(Ordering::Relaxed),
            self.sessions.listing().get(snap).and_then(|e| e.acl_free),
            file_in.map(|dir| || self.dir_has_acls(dir)),
        )
    }

    /// Whether an entry of the directory whose tree is `dir` has a POSIX ACL (yes
    /// when the tree cannot be read: ENODATA is the answer that is never wrong).
    fn dir_has_acls(&self, dir: &BlobId) -> bool {
        if let Some(has) = self.trees.has_acl(dir) {
            return has;
        }
        self.tree(dir, b"")
            .map_or(true, |t| t.nodes.iter().any(Node::has_acl))
    }

    /// When a file is read from its start and the next small file of its
    /// directory is neither cached nor on its way, starts fetching the next
    /// [`SIBLING_FILES`] small files. A copy of a tree reads a directory's files
    /// one after the other in the listing's order, and the backup stored their
    /// content side by side, so they come in one or two range reads instead of
    /// a request each (what a remote repository needs) and the copy finds them
    /// in memory.
    /// Only from a directory tree already in memory: a tree larger than the
    /// cache is not read again for every file.
    fn read_ahead_siblings(&self, ino: u64, session: &Arc<cairn_core::Session<Read>>) {
        let Ok((dir, _, name)) = self.entry_place(ino) else {
            return;
        };
        let Some((tree, i)) = self
            .trees
            .get(&dir)
            .and_then(|t| position(&t, &name).map(|i| (t, i)))
        else {
            return;
        };
        let (mut ids, mut files, mut bytes) = (Vec::new(), 0, 0u64);
        for n in tree.nodes.iter().skip(i + 1) {
            let Content::Inline(chunks) = &n.content else {
                continue;
            };
            if n.kind != NodeKind::File || chunks.is_empty() {
                continue;
            }
            if files == 0 && self.fetch.known(&chunks[0].id) {
                return;
            }
            ids.extend(chunks.iter().map(|c| c.id));
            bytes += chunks.iter().map(|c| c.length).sum::<u64>();
            files += 1;
            if files >= SIBLING_FILES || bytes >= SIBLING_BYTES {
                break;
            }
        }
        self.fetch.prefetch(session, &ids);
    }

    fn new_fh(&self) -> u64 {
        self.next_fh.fetch_add(1, Ordering::Relaxed)
    }
}

/// Names of one inode share one inode number: files, and symlinks, FIFOs and
/// devices too (restore and export keep those links).
fn link_key(snap: SnapshotId, n: &Node) -> Option<LinkKey> {
    (n.kind != NodeKind::Dir && n.nlink > 1).then_some((snap, n.dev, n.inode))
}

fn entry_of(
    snap: SnapshotId,
    dir: BlobId,
    n: &Node,
    zeros: &crate::holes::Zeros,
) -> (What, FileAttr) {
    let mut attr = node_attr(n);
    let mut holes_unknown = false;
    if n.kind == NodeKind::File {
        match (zeros.data_bytes_inline(&n.content), &n.content) {
            (Some(data), _) => attr.blocks = crate::holes::blocks(n.size, data),
            (None, Content::Tree { chunks, .. }) => {
                holes_unknown = zeros.may_have_holes(n.size, *chunks);
            }
            (None, _) => {}
        }
    }
    (
        What::Entry {
            snap,
            dir,
            subtree: if n.kind == NodeKind::Dir {
                n.subtree
            } else {
                None
            },
            has_xattrs: !n.xattrs.is_empty(),
            holes_unknown,
        },
        attr,
    )
}

/// The answer for an absent ACL (see [`State::absent_xattr`]): `acl_checks`, the
/// kernel checks permissions against ACLs; `snapshot_acl_free`, what the snapshot
/// records; `file_dir`, for a file (not a directory), whether an entry of its
/// directory has an ACL.
fn absent_acl(
    acl_checks: bool,
    snapshot_acl_free: Option<bool>,
    file_dir: Option<impl FnOnce() -> bool>,
) -> Errno {
    if acl_checks {
        return Errno::NO_XATTR;
    }
    let unsupported = match (snapshot_acl_free, file_dir) {
        (Some(free), _) => free,
        (None, Some(dir_has_acls)) => !dir_has_acls(),
        (None, None) => false,
    };
    if unsupported {
        Errno::EOPNOTSUPP
    } else {
        Errno::NO_XATTR
    }
}

/// Small files of a directory fetched ahead at once, and their bytes at most
/// (see [`State::read_ahead_siblings`]).
const SIBLING_FILES: usize = 16;
const SIBLING_BYTES: u64 = 1 << 20;

/// Where the entry `name` is in a tree (entries are sorted by name).
fn position(tree: &Tree, name: &[u8]) -> Option<usize> {
    tree.nodes
        .binary_search_by(|n| n.name.as_slice().cmp(name))
        .ok()
}

fn lossy(b: &[u8]) -> String {
    String::from_utf8_lossy(b).into_owned()
}

fn ttl(immutable: bool) -> Duration {
    if immutable {
        IMMUTABLE_TTL
    } else {
        VIRTUAL_TTL
    }
}

/// The file system given to fuser: a handle on the shared state.
pub struct CairnFs(pub Arc<State>);

impl Filesystem for CairnFs {
    fn init(&mut self, _req: &Request, config: &mut KernelConfig) -> std::io::Result<()> {
        // Listings carry every entry's attributes; symlink targets are cached
        // (they never change); lookups in different directories run in parallel.
        for cap in [
            InitFlags::FUSE_DO_READDIRPLUS,
            InitFlags::FUSE_CACHE_SYMLINKS,
            InitFlags::FUSE_PARALLEL_DIROPS,
        ] {
            let _ = config.add_capabilities(cap);
        }
        // When others may use the mount, the kernel applies the recorded POSIX
        // ACLs in its permission checks. Otherwise only the user who mounted (who
        // holds the repository's key and could restore it all) gets in, the mode
        // bits decide, and ACLs are only shown: that lets an ACL-free directory
        // answer "not supported" (see `State::absent_xattr`).
        if self.0.xattrs
            && self.0.allow_other
            && config.add_capabilities(InitFlags::FUSE_POSIX_ACL).is_ok()
        {
            self.0.acl_checks.store(true, Ordering::Relaxed);
        }
        if config
            .capabilities()
            .contains(InitFlags::FUSE_NO_OPEN_SUPPORT)
        {
            self.0.no_open.store(true, Ordering::Relaxed);
        }
        let _ = config.set_max_readahead(1 << 20);
        let _ = config.set_max_background(64);
        Ok(())
    }

    fn lookup(&self, _req: &Request, parent: INodeNo, name: &OsStr, reply: ReplyEntry) {
        let st = &self.0;
        match st.lookup_in(parent.0, name.as_bytes()) {
            Ok((_, attr, parent_immutable)) => {
                // Its holes too, when only its chunk list tells them.
                let (attr, immutable) = st.attr(attr.ino.0).unwrap_or((attr, false));
                reply.entry_with_ttls(
                    &ttl(immutable),
                    &ttl(parent_immutable),
                    &attr,
                    Generation(0),
                );
            }
            Err(f) => {
                st.report(&f);
                reply.error(f.errno);
            }
        }
    }

    fn forget(&self, _req: &Request, ino: INodeNo, nlookup: u64) {
        if lock(&self.0.table).forget(ino.0, nlookup) {
            lock(&self.0.by_inode).remove(ino.0);
        }
    }

    fn getattr(&self, _req: &Request, ino: INodeNo, _fh: Option<FileHandle>, reply: ReplyAttr) {
        match self.0.attr(ino.0) {
            Ok((attr, immutable)) => reply.attr(&ttl(immutable), &attr),
            Err(f) => reply.error(f.errno),
        }
    }

    fn readlink(&self, _req: &Request, ino: INodeNo, reply: ReplyData) {
        let st = &self.0;
        let what = match st.what(ino.0) {
            Ok(w) => w,
            Err(f) => return reply.error(f.errno),
        };
        if let What::Entry { .. } = what {
            match st.node_of(ino.0) {
                Ok((tree, i, _)) => match tree.nodes.get(i) {
                    Some(n) if n.kind == NodeKind::Symlink => reply.data(&n.link_target),
                    _ => reply.error(Errno::EINVAL),
                },
                Err(f) => {
                    st.report(&f);
                    reply.error(f.errno)
                }
            }
            return;
        }
        match st.virtual_target(&what) {
            Some(t) => reply.data(t.as_bytes()),
            None => reply.error(Errno::ENOENT),
        }
    }

    fn open(&self, _req: &Request, ino: INodeNo, flags: OpenFlags, reply: ReplyOpen) {
        let st = &self.0;
        if flags.acc_mode() != OpenAccMode::O_RDONLY {
            return reply.error(Errno::EROFS);
        }
        if st.no_open.load(Ordering::Relaxed) {
            // Nothing to set up per open: reads find their file by inode. This
            // answer makes the kernel stop sending OPEN and RELEASE (two of the
            // four or five round trips a small file's copy costs) and keep the
            // page cache across opens (the content never changes).
            return reply.error(Errno::ENOSYS);
        }
        let f = match st.open_file(ino.0) {
            Ok(f) => f,
            Err(f) => {
                st.report(&f);
                return reply.error(f.errno);
            }
        };
        let fh = st.new_fh();
        lock(&st.files).insert(fh, f);
        // The content never changes: pages read once stay valid across opens.
        reply.opened(FileHandle(fh), FopenFlags::FOPEN_KEEP_CACHE);
    }

    fn read(
        &self,
        _req: &Request,
        ino: INodeNo,
        fh: FileHandle,
        offset: u64,
        size: u32,
        _flags: OpenFlags,
        _lock_owner: Option<fuser::LockOwner>,
        reply: ReplyData,
    ) {
        let st = &self.0;
        // The kernel's no-open mode reads with handle 0 (handles start at 1).
        let f = if fh.0 == 0 && st.no_open.load(Ordering::Relaxed) {
            match st.file_of_inode(ino.0) {
                Ok(f) => f,
                Err(fail) => {
                    st.report(&fail);
                    return reply.error(fail.errno);
                }
            }
        } else {
            let found = lock(&st.files).get(&fh.0).cloned();
            let Some(f) = found else {
                return reply.error(Errno::EBADF);
            };
            f
        };
        let session = match st.session() {
            Ok(s) => s,
            Err(fail) => {
                st.report(&fail);
                return reply.error(fail.errno);
            }
        };
        if offset == 0 {
            st.read_ahead_siblings(ino.0, &session);
        }
        match f.read(&session, &st.fetch, offset, size as usize) {
            Ok(data) => reply.data(&data),
            Err(e) => {
                let msg = e.error.to_string();
                let line = match &e.blob {
                    Some(b) if !msg.contains(b.as_str()) => {
                        format!("reading {}: blob {b}: {msg}", f.label)
                    }
                    _ => format!("reading {}: {msg}", f.label),
                };
                st.log.error(&line);
                reply.error(Errno::EIO);
            }
        }
    }

    /// `SEEK_DATA` and `SEEK_HOLE` (the kernel answers the other kinds itself):
    /// a chunk of zeros is a hole, as a restore makes it ([`crate::holes`]).
    fn lseek(
        &self,
        _req: &Request,
        ino: INodeNo,
        _fh: FileHandle,
        offset: i64,
        whence: i32,
        reply: ReplyLseek,
    ) {
        let st = &self.0;
        let hole = match whence {
            libc::SEEK_DATA => false,
            libc::SEEK_HOLE => true,
            _ => return reply.error(Errno::EINVAL),
        };
        let Ok(offset) = u64::try_from(offset) else {
            return reply.error(Errno::ENXIO);
        };
        match st.seek(ino.0, offset, hole) {
            Ok(Some(at)) => reply.offset(at as i64),
            Ok(None) => reply.error(Errno::ENXIO),
            Err(f) => {
                st.report(&f);
                reply.error(f.errno)
            }
        }
    }

    fn release(
        &self,
        _req: &Request,
        _ino: INodeNo,
        fh: FileHandle,
        _flags: OpenFlags,
        _lock_owner: Option<fuser::LockOwner>,
        _flush: bool,
        reply: ReplyEmpty,
    ) {
        lock(&self.0.files).remove(&fh.0);
        reply.ok();
    }

    fn opendir(&self, _req: &Request, ino: INodeNo, _flags: OpenFlags, reply: ReplyOpen) {
        let st = &self.0;
        match st.open_dir(ino.0) {
            Ok(list) => {
                let fh = st.new_fh();
                lock(&st.dirs).insert(fh, Arc::new(list));
                reply.opened(FileHandle(fh), FopenFlags::empty());
            }
            Err(f) => {
                st.report(&f);
                reply.error(f.errno);
            }
        }
    }

    fn readdirplus(
        &self,
        _req: &Request,
        ino: INodeNo,
        fh: FileHandle,
        offset: u64,
        mut reply: ReplyDirectoryPlus,
    ) {
        let st = &self.0;
        let Some(list) = lock(&st.dirs).get(&fh.0).cloned() else {
            return reply.error(Errno::EBADF);
        };
        let mut t = lock(&st.table);
        let Some(me) = t.get(ino.0) else {
            return reply.error(Errno::ENOENT);
        };
        let (my_attr, parent, immutable) = (me.attr, me.parent, me.what.immutable());
        let parent_attr = t.get(parent).map_or(my_attr, |p| p.attr);
        let count = match list.as_ref() {
            DirList::Virtual(v) => v.len(),
            DirList::Tree { tree, .. } => tree.nodes.len(),
        } as u64;
        let mut i = offset;
        while i < count + 2 {
            let full = match i {
                // `.` and `..` take no lookup (the kernel counts none for them).
                0 => reply.add(ino, 1, ".", &ttl(immutable), &my_attr, Generation(0)),
                1 => reply.add(
                    INodeNo(parent),
                    2,
                    "..",
                    &ttl(immutable),
                    &parent_attr,
                    Generation(0),
                ),
                k => {
                    let idx = (k - 2) as usize;
                    // A file whose holes only its chunk list tells: its blocks if
                    // known already, else its attributes are not kept (the
                    // kernel asks GETATTR, which reads the list).
                    let mut pending = false;
                    let (name, looked) = match list.as_ref() {
                        DirList::Virtual(v) => match v.get(idx) {
                            Some(e) => (
                                e.name.as_slice(),
                                t.lookup_current(ino.0, &e.name, e.what.clone(), e.attr),
                            ),
                            None => break,
                        },
                        DirList::Tree { snap, id, tree } => match tree.nodes.get(idx) {
                            Some(n) => {
                                let (child, mut attr) =
                                    t.lookup(ino.0, &n.name, link_key(*snap, n), || {
                                        entry_of(*snap, *id, n, &st.zeros)
                                    });
                                if let (NodeKind::File, Content::Tree { root, chunks, .. }) =
                                    (n.kind, &n.content)
                                    && st.zeros.may_have_holes(n.size, *chunks)
                                {
                                    match lock(&st.data_bytes).get(root) {
                                        Some(d) => attr.blocks = crate::holes::blocks(n.size, *d),
                                        None => pending = true,
                                    }
                                }
                                (n.name.as_slice(), (child, attr))
                            }
                            None => break,
                        },
                    };
                    let (child, attr) = looked;
                    let full = reply.add(
                        INodeNo(child),
                        k + 1,
                        OsStr::from_bytes(name),
                        &if pending {
                            Duration::ZERO
                        } else {
                            ttl(immutable)
                        },
                        &attr,
                        Generation(0),
                    );
                    if full {
                        // Not sent: the lookup it counted is given back.
                        t.forget(child, 1);
                    }
                    full
                }
            };
            if full {
                break;
            }
            i += 1;
        }
        drop(t);
        reply.ok();
    }

    fn readdir(
        &self,
        _req: &Request,
        ino: INodeNo,
        fh: FileHandle,
        offset: u64,
        mut reply: ReplyDirectory,
    ) {
        // Only used if the kernel does not offer readdirplus. Inode numbers of
        // entries the kernel has not looked up are stand-ins (lookup assigns the
        // real one); nothing is added to the table.
        let st = &self.0;
        let Some(list) = lock(&st.dirs).get(&fh.0).cloned() else {
            return reply.error(Errno::EBADF);
        };
        let entries: Vec<(Vec<u8>, FileType)> = match list.as_ref() {
            DirList::Virtual(v) => v.iter().map(|e| (e.name.clone(), e.attr.kind)).collect(),
            DirList::Tree { tree, .. } => tree
                .nodes
                .iter()
                .skip(offset.saturating_sub(2) as usize)
                .take(4096)
                .map(|n| (n.name.clone(), kind_of(n.kind)))
                .collect(),
        };
        let base = match list.as_ref() {
            DirList::Virtual(_) => 0,
            DirList::Tree { .. } => offset.saturating_sub(2),
        };
        let mut i = offset;
        if i == 0 {
            if reply.add(ino, 1, FileType::Directory, ".") {
                return reply.ok();
            }
            i = 1;
        }
        if i == 1 {
            if reply.add(ino, 2, FileType::Directory, "..") {
                return reply.ok();
            }
            i = 2;
        }
        for (k, (name, kind)) in entries.iter().enumerate().skip((i - 2 - base) as usize) {
            let pos = base + k as u64 + 2;
            let stand_in = (1u64 << 62) | (pos & ((1 << 62) - 1));
            if reply.add(INodeNo(stand_in), pos + 1, *kind, OsStr::from_bytes(name)) {
                break;
            }
        }
        reply.ok();
    }

    fn releasedir(
        &self,
        _req: &Request,
        _ino: INodeNo,
        fh: FileHandle,
        _flags: OpenFlags,
        reply: ReplyEmpty,
    ) {
        lock(&self.0.dirs).remove(&fh.0);
        reply.ok();
    }

    fn statfs(&self, _req: &Request, _ino: INodeNo, reply: ReplyStatfs) {
        let files = lock(&self.0.table).len() as u64;
        reply.statfs(0, 0, 0, files, 0, 4096, 255, 4096);
    }

    fn getxattr(&self, _req: &Request, ino: INodeNo, name: &OsStr, size: u32, reply: ReplyXattr) {
        let st = &self.0;
        if !st.xattrs {
            return reply.error(Errno::ENOSYS);
        }
        let what = match st.what(ino.0) {
            Ok(w) => w,
            Err(f) => return reply.error(f.errno),
        };
        if !matches!(
            what,
            What::Entry {
                has_xattrs: true,
                ..
            }
        ) {
            return reply.error(st.absent_xattr(&what, name.as_bytes()));
        }
        let (tree, i, _) = match st.node_of(ino.0) {
            Ok(x) => x,
            Err(f) => {
                st.report(&f);
                return reply.error(f.errno);
            }
        };
        let value = tree.nodes.get(i).and_then(|n| {
            n.xattrs
                .iter()
                .find(|(k, _)| k.as_slice() == name.as_bytes())
                .map(|(_, v)| v.as_slice())
        });
        match value {
            None => reply.error(st.absent_xattr(&what, name.as_bytes())),
            Some(v) if size == 0 => reply.size(v.len() as u32),
            Some(v) if v.len() > size as usize => reply.error(Errno::ERANGE),
            Some(v) => reply.data(v),
        }
    }

    fn listxattr(&self, _req: &Request, ino: INodeNo, size: u32, reply: ReplyXattr) {
        let st = &self.0;
        if !st.xattrs {
            return reply.error(Errno::ENOSYS);
        }
        let names: Vec<u8> = match st.what(ino.0) {
            Ok(What::Entry {
                has_xattrs: true, ..
            }) => match st.node_of(ino.0) {
                Ok((tree, i, _)) => tree
                    .nodes
                    .get(i)
                    .map(|n| {
                        n.xattrs
                            .iter()
                            .flat_map(|(k, _)| k.iter().copied().chain([0u8]))
                            .collect()
                    })
                    .unwrap_or_default(),
                Err(f) => {
                    st.report(&f);
                    return reply.error(f.errno);
                }
            },
            Ok(_) => Vec::new(),
            Err(f) => return reply.error(f.errno),
        };
        if size == 0 {
            reply.size(names.len() as u32);
        } else if names.len() > size as usize {
            reply.error(Errno::ERANGE);
        } else {
            reply.data(&names);
        }
    }

    fn access(&self, _req: &Request, ino: INodeNo, mask: fuser::AccessFlags, reply: ReplyEmpty) {
        // The kernel checks permissions itself (default_permissions); this only
        // answers for writes, which a snapshot never allows.
        if mask.contains(fuser::AccessFlags::W_OK) {
            return reply.error(Errno::EROFS);
        }
        match self.0.what(ino.0) {
            Ok(_) => reply.ok(),
            Err(f) => reply.error(f.errno),
        }
    }
}

/// The inode numbers the top level uses, for the mount to set up.
pub fn fixed_top(st: &State, t: &mut Table) {
    let l = st.sessions.listing();
    let newest = l.latest().map_or(0, |e| e.secs);
    let dir = st.virtual_attr(FileType::Directory, 0, newest);
    t.insert_fixed(HOSTS, What::Hosts, ROOT, b"hosts", dir);
    t.insert_fixed(SNAPSHOTS, What::Snapshots, ROOT, b"snapshots", dir);
}

#[cfg(test)]
mod tests {
    use super::*;

    fn file(n: u64) -> Arc<OpenFile> {
        Arc::new(OpenFile::new(
            cairn_format::tree::Content::None,
            n,
            format!("f{n}"),
        ))
    }

    #[test]
    fn an_absent_acl_is_not_supported_only_where_no_listing_loses_a_mark() {
        let yes = Some(|| true);
        let no = Some(|| false);
        let dir = None::<fn() -> bool>;
        let (nodata, unsupported) = (Errno::NO_XATTR, Errno::EOPNOTSUPP);
        // The kernel checks permissions against ACLs: never "not supported".
        for free in [Some(true), Some(false), None] {
            assert_eq!(absent_acl(true, free, no), nodata);
            assert_eq!(absent_acl(true, free, dir), nodata);
        }
        // A snapshot that records none: files and directories alike.
        assert_eq!(absent_acl(false, Some(true), yes), unsupported);
        assert_eq!(absent_acl(false, Some(true), dir), unsupported);
        // A snapshot that records some: ENODATA everywhere, so ls keeps asking.
        assert_eq!(absent_acl(false, Some(false), no), nodata);
        assert_eq!(absent_acl(false, Some(false), dir), nodata);
        // Unknown (older snapshots): a file of an ACL-free directory only.
        assert_eq!(absent_acl(false, None, no), unsupported);
        assert_eq!(absent_acl(false, None, yes), nodata);
        assert_eq!(absent_acl(false, None, dir), nodata);
    }

    #[test]
    fn inode_files_keep_the_recently_read_and_stay_bounded() {
        let mut t = InodeFiles::default();
        t.insert(1, file(1));
        for ino in 2..2000u64 {
            t.insert(ino, file(ino));
            // Inode 1 is read all along: it is never the one forgotten.
            assert!(t.get(1).is_some(), "inode 1 forgotten at {ino}");
            assert!(t.map.len() <= INODE_FILES);
        }
        assert!(t.get(1999).is_some() && t.get(1998).is_some());
        assert!(t.get(2).is_none());
        t.remove(1);
        assert!(t.get(1).is_none());
    }
}
