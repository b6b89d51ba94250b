//! cairn-mount: a repository's snapshots as a read-only FUSE file system
//! (`cairn mount`).
//!
//! A crate of its own, not part of the engine or the CLI: the engine stays free of
//! anything that talks to a kernel or a terminal, and only this crate carries the
//! FUSE dependency (`fuser`, pure Rust, no libfuse). It uses the engine as any
//! other reader does: read sessions ([`Session<Read>`]), trees and chunk lists
//! through [`Repository`], the engine's bounded [`BlobCache`]. It never prints:
//! what could not be read goes to the caller's [`ErrorSink`].
//!
//! Module map: [`layout`] names the snapshots at the top level, [`inodes`] keeps
//! the inodes the kernel holds, `trees` caches decoded directories, `sessions`
//! keeps the read session only while the mount is used, `fetch` and `file` read
//! file content at any offset and ahead of sequential readers, `fs` answers the
//! kernel.
//!
//! [`Session<Read>`]: cairn_core::Session
//! [`BlobCache`]: cairn_core::repo::blobcache::BlobCache

pub mod fetch;
pub mod file;
pub mod fs;
pub mod holes;
pub mod inodes;
pub mod layout;
pub mod log;
pub mod sessions;
pub mod trees;

pub use log::ErrorSink;

use cairn_core::Repository;
use cairn_core::repo::blobcache::BlobCache;
use inodes::{Table, What};
use std::path::{Path, PathBuf};
use std::sync::{Arc, Weak};
use std::time::Duration;
use thiserror::Error;

/// How to mount.
#[derive(Clone, Debug)]
pub struct MountOptions {
    /// Mount only this snapshot's tree (an id prefix or `latest`).
    pub snapshot: Option<String>,
    /// Let users other than the one mounting see the files (the kernel still
    /// checks each file's owner, mode and recorded POSIX ACLs; without it, only
    /// the mounting user gets in, the mode bits decide and ACLs are only shown).
    pub allow_other: bool,
    /// Bytes of blobs kept in memory (content and chunk lists).
    pub cache_bytes: usize,
    /// Bytes of decoded directory trees kept in memory.
    pub tree_cache_bytes: usize,
    /// The read session (and its lock) ends after this long without a request.
    pub session_idle: Duration,
    /// A session is replaced after this long, to see what others wrote.
    pub session_max_age: Duration,
    /// The top level is listed again when looked at after this long.
    pub listing_refresh: Duration,
    /// Threads answering the kernel.
    pub threads: usize,
    /// Threads reading ahead of sequential readers.
    pub fetch_threads: usize,
    /// Show extended attributes. Without them the kernel stops asking for any
    /// (the first request is answered "not implemented"), which spares `ls -l`
    /// two round trips per file (an SELinux label and an ACL).
    pub xattrs: bool,
    /// Inodes the mount keeps for the kernel before it asks the kernel to forget
    /// the oldest ones. The kernel keeps every entry it was told of until memory
    /// gets short, and the mount must keep each of them too (about
    /// [`INODE_BYTES`] apiece): without a bound, walking ten million files would
    /// grow the mount by gigabytes on a machine with memory to spare.
    pub max_inodes: usize,
}

/// What one inode the kernel holds costs the mount, about (its table entry, the
/// name twice, the maps' slots), for turning a memory budget into
/// [`MountOptions::max_inodes`].
pub const INODE_BYTES: u64 = 640;

/// [`MountOptions::max_inodes`] unless told otherwise: room for a few directories
/// of 100,000 entries listed at once (`ls -l` of one needs them all), at about
/// 160 MiB.
pub const DEFAULT_MAX_INODES: usize = 262_144;

/// The smallest [`MountOptions::max_inodes`] taken (a smaller one is raised to it).
pub const MIN_MAX_INODES: usize = 1024;

impl Default for MountOptions {
    fn default() -> Self {
        MountOptions {
            snapshot: None,
            allow_other: false,
            cache_bytes: 64 << 20,
            tree_cache_bytes: 64 << 20,
            session_idle: Duration::from_secs(30),
            session_max_age: Duration::from_secs(300),
            listing_refresh: Duration::from_secs(60),
            threads: 4,
            fetch_threads: 4,
            xattrs: true,
            max_inodes: DEFAULT_MAX_INODES,
        }
    }
}

#[derive(Debug, Error)]
pub enum MountError {
    #[error(transparent)]
    Engine(#[from] cairn_core::Error),
    #[error("cannot mount at {}: {source}", path.display())]
    Mount {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("cannot unmount {}: {source}", path.display())]
    Unmount {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
}

/// What [`MountError`] is about.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum MountErrorKind {
    /// The repository could not be read.
    Repository,
    /// The kernel refused the mount (no FUSE, not a directory, no permission).
    Mount,
    /// The unmount failed.
    Unmount,
}

impl MountError {
    pub fn kind(&self) -> MountErrorKind {
        match self {
            MountError::Engine(_) => MountErrorKind::Repository,
            MountError::Mount { .. } => MountErrorKind::Mount,
            MountError::Unmount { .. } => MountErrorKind::Unmount,
        }
    }
}

/// How the file system was unmounted.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Unmounted {
    /// Unmounted, every request answered.
    Clean,
    /// Something still used it (a shell inside it): detached from the directory
    /// tree at once; programs still inside get errors once the process ends.
    Detached,
}

/// A mounted repository. Dropping it ends the read session (its lock) but leaves
/// the unmount to [`Mounted::unmount`] or to whoever unmounts the directory.
pub struct Mounted {
    session: Option<fuser::BackgroundSession>,
    state: Arc<fs::State>,
    dir: PathBuf,
    /// The snapshot mounted alone, if one was asked for.
    pub snapshot: Option<cairn_format::SnapshotId>,
    /// Warnings for the user from mounting (`latest` passed over a snapshot
    /// dated ahead of this machine's clock).
    pub warnings: Vec<String>,
}

/// Mounts `repo` (opened with its key; it is never given an index: each session
/// opens a copy) at `dir` and returns once the kernel answers requests.
pub fn mount(
    repo: Repository,
    dir: &Path,
    opts: &MountOptions,
    on_error: ErrorSink,
) -> Result<Mounted, MountError> {
    let log = log::Log::new(on_error);
    let cache = Arc::new(BlobCache::new(opts.cache_bytes));
    let sessions = Arc::new(sessions::Sessions::new(
        repo,
        cache.clone(),
        sessions::Timing {
            idle: opts.session_idle,
            max_age: opts.session_max_age,
            refresh: opts.listing_refresh,
        },
        log.clone(),
    )?);
    let notes = std::sync::Mutex::new(Vec::new());
    let single = match &opts.snapshot {
        None => None,
        Some(spec) => {
            let s = sessions.get()?;
            let (id, snap) = s.find_snapshot_with(spec, &|n| {
                notes.lock().unwrap_or_else(|e| e.into_inner()).push(n)
            })?;
            let tree = snap
                .tree_id()
                .map_err(|e| cairn_core::Error::damaged(format!("snapshot {}", id.short()), e))?;
            Some((id, tree))
        }
    };
    let zeros = holes::Zeros::of(sessions.get()?.repo());
    let state = Arc::new(fs::State::new(
        sessions,
        zeros,
        trees::TreeCache::new(opts.tree_cache_bytes),
        fetch::Fetcher::new(cache, opts.fetch_threads),
        log,
        opts.xattrs,
        opts.allow_other,
    ));
    {
        let listing = state.sessions.listing();
        let table = match single {
            Some((id, tree)) => {
                let entry = listing.get(&id).cloned();
                let attr = state.root_attr(entry.as_ref());
                Table::new(What::SnapRoot { snap: id, tree }, attr)
            }
            None => {
                let mut t = Table::new(What::Top, state.root_attr(None));
                fs::fixed_top(&state, &mut t);
                t
            }
        };
        *trees::lock(&state.table) = table;
    }
    start_sweeper(Arc::downgrade(&state), opts.session_idle);
    let mut config = fuser::Config::default();
    config.mount_options = vec![
        fuser::MountOption::FSName("cairn".into()),
        fuser::MountOption::Subtype("cairn".into()),
        fuser::MountOption::RO,
        // The kernel checks owners and modes as recorded; device nodes are shown,
        // never opened, and set-id bits are not honoured (a backup may come from
        // another machine).
        fuser::MountOption::DefaultPermissions,
        fuser::MountOption::NoDev,
        fuser::MountOption::NoSuid,
        fuser::MountOption::NoAtime,
    ];
    if opts.allow_other {
        config.acl = fuser::SessionACL::All;
    }
    config.n_threads = Some(opts.threads.max(1));
    config.clone_fd = opts.threads > 1;
    let session = fuser::spawn_mount(fs::CairnFs(state.clone()), dir, &config).map_err(|e| {
        state.sessions.close();
        MountError::Mount {
            path: dir.to_path_buf(),
            source: e,
        }
    })?;
    start_trimmer(&state, session.notifier(), opts.max_inodes);
    Ok(Mounted {
        session: Some(session),
        state,
        dir: dir.to_path_buf(),
        snapshot: single.map(|(id, _)| id),
        warnings: notes.into_inner().unwrap_or_else(|e| e.into_inner()),
    })
}

/// Ends the read session once it has been idle long enough; stops when the mount's
/// state is gone.
fn start_sweeper(state: Weak<fs::State>, idle: Duration) {
    let every = (idle / 4).clamp(Duration::from_millis(100), Duration::from_secs(5));
    let _ = std::thread::Builder::new()
        .name("mount-sweeper".into())
        .spawn(move || {
            loop {
                std::thread::sleep(every);
                match state.upgrade() {
                    Some(s) => s.sessions.sweep(),
                    None => return,
                }
            }
        });
}

/// Keeps the inode table within `max` entries: past it, asks the kernel to
/// forget the oldest entries it was given (down to nine tenths of `max`), and the
/// kernel's FORGETs then shrink the table. Runs on its own thread, woken by the
/// lookup that goes past the budget: the kernel takes an invalidation only once
/// requests on that directory are answered, which the request threads must stay
/// free to do. Stops when the mount's state is gone.
fn start_trimmer(state: &Arc<fs::State>, notifier: fuser::Notifier, max: usize) {
    use std::os::unix::ffi::OsStrExt;
    let weak = Arc::downgrade(state);
    let spawned = std::thread::Builder::new()
        .name("mount-trimmer".into())
        .spawn(move || {
            loop {
                std::thread::park_timeout(Duration::from_millis(500));
                let Some(s) = weak.upgrade() else {
                    return;
                };
                let entries = {
                    let mut t = trees::lock(&s.table);
                    let n = t.excess();
                    if n == 0 {
                        continue;
                    }
                    t.oldest(n)
                };
                drop(s);
                for (parent, name) in entries {
                    // Fails for an entry the kernel already dropped (ENOENT) and
                    // once unmounted: nothing to do either way.
                    let _ = notifier
                        .inval_entry(fuser::INodeNo(parent), std::ffi::OsStr::from_bytes(&name));
                }
            }
        });
    if let Ok(h) = spawned {
        trees::lock(&state.table).set_budget(max.max(MIN_MAX_INODES), h.thread().clone());
    }
}

impl Mounted {
    /// Inodes the kernel holds now, and the most it held at once.
    pub fn inodes(&self) -> (usize, usize) {
        let t = trees::lock(&self.state.table);
        (t.len(), t.peak())
    }

    /// Whether the file system was unmounted from outside (`fusermount3 -u`).
    pub fn is_finished(&self) -> bool {
        self.session.as_ref().is_none_or(|s| s.guard.is_finished())
    }

    /// Unmounts (lazily if something still uses it) and ends the read session.
    pub fn unmount(mut self) -> Result<Unmounted, MountError> {
        let r = match self.session.take() {
            None => Ok(Unmounted::Clean),
            Some(s) if s.guard.is_finished() => {
                let _ = s.join();
                Ok(Unmounted::Clean)
            }
            Some(s) => match s.umount_and_join() {
                Ok(()) => Ok(Unmounted::Clean),
                Err(e) if e.raw_os_error() == Some(libc::EBUSY) => {
                    detach(&self.dir).map(|()| Unmounted::Detached)
                }
                Err(e) => Err(MountError::Unmount {
                    path: self.dir.clone(),
                    source: e,
                }),
            },
        };
        self.state.fetch.stop();
        self.state.sessions.close();
        r
    }

    /// Read sessions opened so far, and whether one is open now.
    pub fn sessions(&self) -> (u64, bool) {
        (self.state.sessions.opened(), self.state.sessions.active())
    }
}

impl Drop for Mounted {
    fn drop(&mut self) {
        self.state.fetch.stop();
        self.state.sessions.close();
    }
}

/// Detaches a busy mount from the directory tree (`umount -l`); as another user
/// than root, through `fusermount3 -u -z`.
fn detach(dir: &Path) -> Result<(), MountError> {
    match nix::mount::umount2(dir, nix::mount::MntFlags::MNT_DETACH) {
        Ok(()) => Ok(()),
        Err(nix::errno::Errno::EPERM) => {
            let ok = std::process::Command::new("fusermount3")
                .args(["-u", "-z"])
                .arg(dir)
                .status()
                .is_ok_and(|s| s.success());
            if ok {
                Ok(())
            } else {
                Err(MountError::Unmount {
                    path: dir.to_path_buf(),
                    source: std::io::Error::from_raw_os_error(libc::EBUSY),
                })
            }
        }
        Err(e) => Err(MountError::Unmount {
            path: dir.to_path_buf(),
            source: e.into(),
        }),
    }
}
