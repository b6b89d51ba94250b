//! Storage backends. The trait has only object-store operations — put a whole object,
//! get, get a range, list, delete — so that S3-compatible storage fits without any
//! change to the engine. Object names are `/`-separated relative paths such as
//! `data/3f/3f…` or `snapshots/ab…`.
//!
//! Contract every backend keeps:
//! - `put` is atomic: a reader sees either no object or the whole object, never a part
//!   (local: write a temporary file, fsync, rename, fsync the directory).
//! - once `put` returns, the object survives a crash of this machine.
//! - a missing object is [`BackendErrorKind::NotFound`], never an empty read.
//! - deleting a missing object is either `Ok` or `NotFound` (S3 cannot tell).
//! - `put_new` never replaces an object: if the name exists it fails with
//!   [`BackendErrorKind::AlreadyExists`] and the stored object is unchanged (local:
//!   `link`, which fails on an existing name; S3: a conditional write, which most
//!   servers honour but some ignore — nothing relies on it for correctness, since
//!   immutable objects are named by the hash of their bytes, and `cairn serve`
//!   checks it itself for untrusted writers).
//!
//! Wrappers add what remote storage needs without touching the engine:
//! [`RetryBackend`] (backoff on transient errors), [`CachedBackend`] (a local copy
//! of index, snapshot and tree data), [`ThrottledBackend`] (rate limits and traffic
//! counters) and, for tests, [`FaultyBackend`].

pub mod bufpool;
pub mod cache;
pub mod direct;
mod dryrun;
mod fault;
mod io;
mod local;
mod mem;
pub mod process;
mod retry;
mod s3;
mod server;
mod throttle;

pub use cache::CachedBackend;
pub use dryrun::DryRunBackend;
pub use fault::{FaultSpec, FaultyBackend};
pub use local::{LocalBackend, private_dir, replace_private_file};
pub use mem::MemBackend;
pub use retry::{RetryBackend, RetryPolicy, within};
pub use s3::{S3_SILENCE, S3Backend, S3Location, S3Options};
pub use server::{
    SERVER_SILENCE_MIN, ServerBackend, ServerLocation, ServerOptions, parse_fingerprint,
    valid_datastore_name,
};
pub use throttle::{Limiter, ThrottledBackend, Traffic, stop_waits_on};

pub use bytes::Bytes;
use std::fmt;

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum BackendErrorKind {
    NotFound,
    /// `put_new` found an object of that name.
    AlreadyExists,
    /// `get_bounded` found an object larger than its kind may be.
    TooLarge,
    /// The medium is full (ENOSPC, EDQUOT).
    NoSpace,
    PermissionDenied,
    /// A transient failure that may succeed when retried.
    Transient,
    /// Nothing answers at the address (connection refused, unknown host): retried
    /// only briefly (a server restarting), never for the full retry budget.
    Unreachable,
    /// A range read reaches past the end of the object.
    OutOfRange,
    /// There is no repository at the location at all (a cairn server without a
    /// datastore of that name): nothing in it can be found, and no object is
    /// missing from one.
    NoRepository,
    /// Something that is not a file (a FIFO, a device, a directory) stands where a
    /// local repository keeps an object: damage, named as such, never waited on.
    NotAFile,
    Other,
}

/// The cause a local backend gives for an object that is not a regular file, so
/// that `BackendError::from_io` can tell it from other failures.
#[derive(Debug, thiserror::Error)]
#[error("not a regular file (a repository's objects are files)")]
pub struct NotAFile;

#[derive(Clone, Debug, thiserror::Error)]
#[error("{op} {path}: {message}")]
pub struct BackendError {
    pub kind: BackendErrorKind,
    pub op: &'static str,
    pub path: String,
    pub message: String,
}

impl BackendError {
    pub fn not_found(op: &'static str, path: &str) -> Self {
        BackendError {
            kind: BackendErrorKind::NotFound,
            op,
            path: path.to_string(),
            message: "object not found".into(),
        }
    }
    pub fn from_io(op: &'static str, path: &str, e: &std::io::Error) -> Self {
        let kind = match e.kind() {
            std::io::ErrorKind::NotFound => BackendErrorKind::NotFound,
            std::io::ErrorKind::PermissionDenied | std::io::ErrorKind::ReadOnlyFilesystem => {
                BackendErrorKind::PermissionDenied
            }
            std::io::ErrorKind::StorageFull | std::io::ErrorKind::QuotaExceeded => {
                BackendErrorKind::NoSpace
            }
            std::io::ErrorKind::Interrupted | std::io::ErrorKind::TimedOut => {
                BackendErrorKind::Transient
            }
            _ if e.get_ref().is_some_and(|c| c.is::<NotAFile>()) => BackendErrorKind::NotAFile,
            _ => BackendErrorKind::Other,
        };
        let message = match kind {
            BackendErrorKind::NoSpace => "no space left on the repository's device".to_string(),
            _ if e.kind() == std::io::ErrorKind::ReadOnlyFilesystem => format!(
                "{e}: the repository's file system is mounted read-only (commands that only \
                 read work, and so do dry runs)"
            ),
            // The common case of a repository made by another user (root's, read by
            // an operator): "Permission denied" alone does not say whose it is.
            BackendErrorKind::PermissionDenied if matches!(op, "put" | "delete") => format!(
                "{e}: this user may not write into the repository (its files belong to \
                 another user, or are read-only; commands that only read work, and so do dry \
                 runs)"
            ),
            _ => e.to_string(),
        };
        BackendError {
            kind,
            op,
            path: path.to_string(),
            message,
        }
    }
    /// True when the storage failed to answer a read (an I/O error of the disk, a
    /// remote that kept failing or went away), as opposed to finding the object
    /// missing, too short, not a file, or not allowed: whether the object is
    /// whole is not known.
    pub fn is_read_failure(&self) -> bool {
        matches!(
            self.kind,
            BackendErrorKind::Other | BackendErrorKind::Transient | BackendErrorKind::Unreachable
        )
    }

    pub fn already_exists(op: &'static str, path: &str) -> Self {
        BackendError {
            kind: BackendErrorKind::AlreadyExists,
            op,
            path: path.to_string(),
            message: "an object of that name exists".into(),
        }
    }
    pub fn too_large(op: &'static str, path: &str, size: u64, max: u64) -> Self {
        BackendError {
            kind: BackendErrorKind::TooLarge,
            op,
            path: path.to_string(),
            message: format!(
                "the object is {size} bytes, more than the {max} this kind of object may be (damaged or hostile)"
            ),
        }
    }
    /// A backend that could not be set up (bad location, certificate, settings).
    pub fn open_failed(location: &str, message: String) -> Self {
        BackendError {
            kind: BackendErrorKind::Other,
            op: "open",
            path: location.to_string(),
            message,
        }
    }
    pub fn is_not_found(&self) -> bool {
        self.kind == BackendErrorKind::NotFound
    }
    pub fn is_already_exists(&self) -> bool {
        self.kind == BackendErrorKind::AlreadyExists
    }
}

pub type Result<T, E = BackendError> = std::result::Result<T, E>;

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ObjectInfo {
    /// Full object name, e.g. `index/ab…`.
    pub name: String,
    pub size: u64,
}

pub trait Backend: Send + Sync + fmt::Debug {
    /// Human-readable location for messages.
    fn location(&self) -> String;
    /// Stores a whole object atomically, replacing any object of that name (config
    /// and locks, the only objects rewritten in place).
    fn put(&self, name: &str, data: &[u8]) -> Result<()>;
    /// Stores a whole object atomically, only if no object of that name exists;
    /// else [`BackendErrorKind::AlreadyExists`]. Every immutable object is written
    /// this way.
    fn put_new(&self, name: &str, data: &[u8]) -> Result<()>;
    fn get(&self, name: &str) -> Result<Vec<u8>>;
    /// Reads a whole object of at most `max` bytes, refusing a larger one
    /// ([`BackendErrorKind::TooLarge`]) before reading it into memory: small
    /// objects (locks, keys, snapshots, config) are read this way, so a hostile
    /// 1.5 GB lock costs nothing. The default reads first (backends override it).
    fn get_bounded(&self, name: &str, max: u64) -> Result<Vec<u8>> {
        let data = self.get(name)?;
        if data.len() as u64 > max {
            return Err(BackendError::too_large("get", name, data.len() as u64, max));
        }
        Ok(data)
    }
    /// The size of object `name` in bytes, without reading it (a stat, a HEAD):
    /// what a reader that streams a large object in ranges needs first. The
    /// default reads the object.
    fn size(&self, name: &str) -> Result<u64> {
        self.get(name).map(|d| d.len() as u64)
    }
    /// Reads `length` bytes at `offset`; a range past the end is an error, never short.
    fn get_range(&self, name: &str, offset: u64, length: u64) -> Result<Vec<u8>>;
    /// [`Backend::get_range`] into `out`, whose content it replaces: a reader of many
    /// ranges (a restore worker, the server answering them) keeps one buffer rather
    /// than have the kernel map and zero fresh pages for every range. The default
    /// reads a new buffer and copies it.
    fn get_range_into(
        &self,
        name: &str,
        offset: u64,
        length: u64,
        out: &mut bufpool::Pooled,
    ) -> Result<()> {
        let data = self.get_range(name, offset, length)?;
        out.clear_for(data.len());
        out.extend_from_slice(&data);
        Ok(())
    }
    /// Every object whose name starts with `prefix` (a directory such as `index/`).
    fn list(&self, prefix: &str) -> Result<Vec<ObjectInfo>>;
    fn delete(&self, name: &str) -> Result<()>;

    /// Stores a pack of trees and chunk lists like [`Backend::put_new`]. A backend
    /// with a local cache keeps a copy, so the next backup and every listing read it
    /// locally.
    fn put_metadata_new(&self, name: &str, data: &[u8]) -> Result<()> {
        self.put_new(name, data)
    }
    /// Stores an immutable object handed over whole: as [`Backend::put_metadata_new`]
    /// when `metadata`, else as [`Backend::put_new`]. Why a second form: a backend
    /// whose request outlives the call's borrow (S3's and the cairn server's HTTP
    /// bodies) would otherwise copy each pack, so that every pack in flight was held
    /// twice; `--memory-limit` plans for once. Wrappers pass the bytes on (a retry
    /// clones the handle, not the data); the default borrows them.
    fn put_new_owned(&self, name: &str, data: Bytes, metadata: bool) -> Result<()> {
        if metadata {
            self.put_metadata_new(name, &data)
        } else {
            self.put_new(name, &data)
        }
    }
    /// Reads from a pack of trees and chunk lists. A backend with a local cache
    /// downloads such a pack whole once and serves every later range from its copy.
    fn get_metadata_range(&self, name: &str, offset: u64, length: u64) -> Result<Vec<u8>> {
        self.get_range(name, offset, length)
    }

    /// Removes partial objects that interrupted writers left behind (a killed
    /// process's temporary files) and returns the bytes freed. Only leftovers whose
    /// writer is known to be gone are touched. Nothing to do for most backends.
    fn remove_stale_temporaries(&self) -> Result<u64> {
        Ok(0)
    }

    /// The first 8 bytes that locks written through this backend must start with,
    /// if the storage says who owns a lock by its name: a cairn server lets a token
    /// refresh and remove only locks whose id starts with [`lock_owner_prefix`] of
    /// that token, which any server fronting the datastore can check without
    /// keeping state. `None`: ids are wholly random.
    fn lock_owner_prefix(&self) -> Option<[u8; 8]> {
        None
    }

    /// Bytes this user may still write on the storage, where the storage is a file
    /// system that says (a local directory); `None` where it has no such limit to
    /// read (object storage, a cairn server: that server keeps its own). A backup
    /// stops short of the last bytes so that forget and prune can still run.
    fn free_space(&self) -> Option<u64> {
        None
    }

    /// Seconds this machine's clock is ahead of the storage's (negative: behind),
    /// as its answers' `Date` said; `None` where the storage says no time (a local
    /// directory, whose time is this machine's).
    fn clock_skew(&self) -> Option<i64> {
        None
    }

    /// Whether writes are thrown away (`backup --dry-run`): nothing stored can be
    /// found again.
    fn discards_writes(&self) -> bool {
        false
    }

    /// Whether this client may remove or replace snapshots (forget, tag): storage
    /// that decides by the client's role (a cairn server: admin tokens only) says,
    /// so that an operation that writes before it removes can refuse before either.
    /// Other storage: yes.
    fn may_remove(&self) -> Result<bool> {
        Ok(true)
    }

    /// The host this client's snapshots are recorded as, whatever they say, when
    /// the storage binds the client to one (a cairn server's host-bound token); it
    /// then sees only that host's snapshots. `None`: no such binding.
    fn bound_host(&self) -> Result<Option<String>> {
        Ok(None)
    }

    /// The host whose snapshots alone this client is shown, when the storage shows
    /// only part (a cairn server's host-bound backup or restore token). What is
    /// unused cannot be judged from part: prune and repair refuse it. `None`:
    /// every snapshot is listed.
    fn partial_view(&self) -> Result<Option<String>> {
        Ok(None)
    }

    /// If the storage answers dedup queries (a cairn server), the index files a
    /// backup client must still read itself; `None`: it does not, read them all.
    fn dedup_plan(&self) -> Result<Option<DedupPlan>> {
        Ok(None)
    }
    /// For each chunk id, whether the datastore holds it, whether this client should
    /// send it (the server now counts it as in flight from this client), or whether
    /// another client is sending it. Only after [`Backend::dedup_plan`] said yes.
    fn dedup_query(&self, ids: &[[u8; 32]]) -> Result<Vec<DedupAnswer>> {
        let _ = ids;
        Err(BackendError {
            kind: BackendErrorKind::Other,
            op: "dedup",
            path: String::new(),
            message: "this storage does not answer dedup queries".into(),
        })
    }
    /// Waits until ids that other clients were sending are stored and indexed, and
    /// returns those that never arrived (now this client's to send).
    fn dedup_confirm(&self, ids: &[[u8; 32]]) -> Result<Vec<[u8; 32]>> {
        self.dedup_query(ids).map(|_| Vec::new())
    }
    /// Storage that limits how many jobs write at once (a cairn server): asks once,
    /// waiting a few seconds at most, for this client's job slot. Granted is kept
    /// (the client keeps it alive) until [`Backend::release_job_slot`]. Other
    /// storage keeps no slots: [`JobSlot::NotKept`].
    fn job_slot(&self, operation: &str, host: &str) -> Result<JobSlot> {
        let _ = (operation, host);
        Ok(JobSlot::NotKept)
    }
    /// The job is over: frees the slot (best effort; a server frees the slot of a
    /// client it stops hearing from anyway).
    fn release_job_slot(&self) {}
    /// How far the job holding the slot is, for the server's view of running jobs:
    /// called at each heartbeat while the slot is held. Other storage ignores it.
    fn report_job_progress(&self, report: JobReport) {
        let _ = report;
    }
}

/// Builds the progress a client reports with its heartbeat: numbers only (phase,
/// bytes, files, rate, ETA), never paths, which the server must not learn.
pub type JobReport = std::sync::Arc<dyn Fn() -> serde_json::Value + Send + Sync>;

/// The answer to [`Backend::job_slot`].
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum JobSlot {
    Granted,
    /// The storage keeps no job slots (not a cairn server, or one from before
    /// them): its clients queue among themselves by their locks.
    NotKept,
    /// Not yet: `max` jobs may write at once; these run, and these wait ahead
    /// (each described for people: host, operation, since when).
    Queued {
        max: u32,
        running: Vec<String>,
        ahead: Vec<String>,
        /// This client's token already holds the most slots one token may (one
        /// less than `max`, so that one client cannot take them all).
        token_at_share: Option<u32>,
    },
}

/// The answer to one id of a dedup query.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum DedupAnswer {
    /// In an index file of the datastore: nothing to send.
    Stored,
    /// Unknown: this client sends it.
    Send,
    /// Another client is sending it now: encode it, hold it, and confirm before the
    /// snapshot is written.
    InFlight,
}

impl DedupAnswer {
    pub fn to_byte(self) -> u8 {
        match self {
            DedupAnswer::Send => 0,
            DedupAnswer::Stored => 1,
            DedupAnswer::InFlight => 2,
        }
    }
    pub fn from_byte(b: u8) -> Option<DedupAnswer> {
        match b {
            0 => Some(DedupAnswer::Send),
            1 => Some(DedupAnswer::Stored),
            2 => Some(DedupAnswer::InFlight),
            _ => None,
        }
    }
}

/// What a backup client reads of the index when the server answers dedup queries.
#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct DedupPlan {
    /// Index files (object names) that list trees or chunk lists, or have no dedup
    /// list: the client reads these (and pending records), no others.
    pub index_files: Vec<String>,
    /// Data chunk ids the server knows.
    pub chunks: u64,
    /// Changes when a chunk may have stopped being stored (a prune or repair):
    /// "stored" answers remembered under the same epoch still hold.
    #[serde(default)]
    pub epoch: String,
    /// Packs (hex ids) that live index files name and the datastore lacks or
    /// holds cut short, as the server last found them: their blobs are missing.
    #[serde(default)]
    pub missing_packs: Vec<String>,
}

/// The lock-id prefix of the token with this id (the public part of the token).
pub fn lock_owner_prefix(token_id: &str) -> [u8; 8] {
    let h = blake3::derive_key("cairn 2026-11 lock owner", token_id.as_bytes());
    let mut p = [0u8; 8];
    p.copy_from_slice(&h[..8]);
    p
}

/// The names the repository uses, so no other module formats paths.
pub mod names {
    pub const CONFIG: &str = "config";
    pub const KEYS: &str = "keys/";
    pub const DATA: &str = "data/";
    pub const INDEX: &str = "index/";
    pub const SNAPSHOTS: &str = "snapshots/";
    pub const LOCKS: &str = "locks/";
    pub const PENDING: &str = "pending/";
    pub const DEDUP: &str = "dedup/";
    /// `hosts/<snapshot hex>`: the host of the host-bound token that stored the
    /// snapshot through `cairn serve` (plaintext, written by the server).
    pub const HOSTS: &str = "hosts/";
    pub fn host_record(snapshot_hex: &str) -> String {
        format!("{HOSTS}{snapshot_hex}")
    }
    /// `received/<snapshot hex>`: when `cairn serve` received the snapshot from a
    /// non-admin token (decimal Unix seconds, plaintext, written by the server).
    pub const RECEIVED: &str = "received/";
    pub fn received_record(snapshot_hex: &str) -> String {
        format!("{RECEIVED}{snapshot_hex}")
    }
    /// `forgotten/<snapshot hex>`: a snapshot a key holder deleted on purpose
    /// (decimal Unix seconds, plaintext), so that `cairn serve` can refuse a
    /// backup token that stores its saved bytes again.
    pub const FORGOTTEN: &str = "forgotten/";
    pub fn forgotten_record(snapshot_hex: &str) -> String {
        format!("{FORGOTTEN}{snapshot_hex}")
    }

    /// `data/<first two hex digits>/<hex>`: 256 directories keep listings short.
    pub fn pack(hex: &str) -> String {
        format!("data/{}/{}", &hex[..2.min(hex.len())], hex)
    }
    pub fn index(hex: &str) -> String {
        format!("index/{hex}")
    }
    pub fn snapshot(hex: &str) -> String {
        format!("snapshots/{hex}")
    }
    pub fn lock(hex: &str) -> String {
        format!("locks/{hex}")
    }
    /// Marks, in a repository with the `admin-names` feature, the objects that may
    /// remove or hide data: index files with `supersedes`/`forgotten` lists and
    /// exclusive locks. A server tells them apart by this name alone.
    pub const ADMIN: &str = "admin-";
    /// `index/admin-<hex>`: an index file that supersedes or forgets.
    pub fn admin_index(hex: &str) -> String {
        format!("index/{ADMIN}{hex}")
    }
    /// `locks/admin-<hex>`: an exclusive lock.
    pub fn admin_lock(hex: &str) -> String {
        format!("locks/{ADMIN}{hex}")
    }
    /// The id part of a last path component and whether it has the admin mark:
    /// `admin-ab12…` is `(true, "ab12…")`.
    pub fn split_admin(base: &str) -> (bool, &str) {
        match base.strip_prefix(ADMIN) {
            Some(rest) => (true, rest),
            None => (false, base),
        }
    }
    pub fn dedup(hex: &str) -> String {
        format!("{DEDUP}{hex}")
    }
    pub fn pending(hex: &str) -> String {
        format!("pending/{hex}")
    }
    pub fn key(hex: &str) -> String {
        format!("keys/{hex}")
    }
    /// The last path component of an object name.
    pub fn base(name: &str) -> &str {
        name.rsplit('/').next().unwrap_or(name)
    }

    /// The last path component of a listed object name when the name is where
    /// cairn puts such an object (`data/ab/ab…`, `index/…`, one level below the
    /// others), else "" (which no id parses from). Listings are recursive: a
    /// repository made inside another's `data/` must not have its packs taken for
    /// the outer one's. cairn writes ids in lower case: a name with an upper-case
    /// letter (an object copied in by hand under another spelling) is a stray no
    /// reader opens, and taken for its id it made that id ambiguous (QA).
    pub fn listed(name: &str) -> &str {
        let base = listed_anycase(name);
        if base.bytes().any(|b| b.is_ascii_uppercase()) {
            ""
        } else {
            base
        }
    }

    fn listed_anycase(name: &str) -> &str {
        let mut parts = name.split('/');
        let (Some(top), Some(second)) = (parts.next(), parts.next()) else {
            return "";
        };
        match (parts.next(), parts.next()) {
            (Some(base), None)
                if top == DATA.trim_end_matches('/')
                    && base.len() >= 2
                    && base.get(..2) == Some(second) =>
            {
                base
            }
            (None, None) if top != DATA.trim_end_matches('/') => second,
            _ => "",
        }
    }
}

#[cfg(test)]
pub(crate) mod testing {
    /// A backend on the loopback S3 server that `scripts/test.sh` starts, under a
    /// prefix of its own. Panics (the test fails, never skips) without the server.
    pub fn s3_backend(test: &str) -> crate::S3Backend {
        let base = std::env::var("CAIRN_TEST_S3").unwrap_or_else(|_| {
            panic!(
                "CAIRN_TEST_S3 is not set: the S3 tests need the MinIO server that \
                 scripts/test.sh starts (run the suite with `bash scripts/test.sh`)"
            )
        });
        let nanos = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|d| d.as_nanos())
            .unwrap_or(0);
        let location = format!(
            "{}/unit-{test}-{}-{nanos}",
            base.trim_end_matches('/'),
            std::process::id()
        );
        crate::S3Backend::open(&location, &crate::S3Options::default())
            .unwrap_or_else(|e| panic!("cannot open {location}: {e}"))
    }
}

#[cfg(test)]
pub(crate) mod conformance {
    //! Behaviour every backend must show; run against each implementation (local
    //! directory, memory, S3 and the wrappers).
    use super::*;

    /// Bytes that differ at every offset, so a range from the wrong place is caught.
    fn pattern(len: usize, seed: u8) -> Vec<u8> {
        (0..len)
            .map(|i| (i as u32).wrapping_mul(2654435761).to_le_bytes()[1] ^ seed)
            .collect()
    }

    pub fn run(b: &dyn Backend) {
        basics(b);
        missing_objects(b);
        concurrent_writers(b);
        create_only(b);
        bounded_reads(b);
        large_objects(b);
        empty_prefix(b);
    }

    /// `get_bounded` reads objects up to the bound and refuses larger ones.
    fn bounded_reads(b: &dyn Backend) {
        b.put("locks/bb01", &[7u8; 1000]).unwrap();
        assert_eq!(b.get_bounded("locks/bb01", 1000).unwrap(), vec![7u8; 1000]);
        assert_eq!(b.get_bounded("locks/bb01", 5000).unwrap().len(), 1000);
        let e = b.get_bounded("locks/bb01", 999).unwrap_err();
        assert_eq!(e.kind, BackendErrorKind::TooLarge, "{e}");
        assert!(
            b.get_bounded("locks/missing", 10)
                .unwrap_err()
                .is_not_found()
        );
        b.delete("locks/bb01").unwrap();
    }

    /// `put_new` creates, never replaces; of writers racing on one name exactly one
    /// succeeds and its bytes are what is stored.
    fn create_only(b: &dyn Backend) {
        b.put_new("snapshots/aa01", b"first").unwrap();
        let e = b.put_new("snapshots/aa01", b"second").unwrap_err();
        assert!(e.is_already_exists(), "{e}");
        assert_eq!(b.get("snapshots/aa01").unwrap(), b"first");
        b.put_metadata_new("data/aa/aa02", b"trees").unwrap();
        assert!(
            b.put_metadata_new("data/aa/aa02", b"other")
                .unwrap_err()
                .is_already_exists()
        );
        assert_eq!(b.get("data/aa/aa02").unwrap(), b"trees");
        // Handed over whole, as packs are: the same contract, for data and metadata.
        for (name, metadata) in [("data/aa/aa04", false), ("data/aa/aa05", true)] {
            let bytes = Bytes::from(pattern(70_000, 4));
            b.put_new_owned(name, bytes.clone(), metadata).unwrap();
            let e = b
                .put_new_owned(name, Bytes::from_static(b"other"), metadata)
                .unwrap_err();
            assert!(e.is_already_exists(), "{e}");
            assert_eq!(b.get(name).unwrap(), bytes);
            b.delete(name).unwrap();
        }
        let results: Vec<(usize, bool)> = std::thread::scope(|s| {
            let hs: Vec<_> = (0..6)
                .map(|i| {
                    s.spawn(move || {
                        let data = vec![i as u8; 4096];
                        match b.put_new("index/aa03", &data) {
                            Ok(()) => (i, true),
                            Err(e) if e.is_already_exists() => (i, false),
                            Err(e) => panic!("racing put_new: {e}"),
                        }
                    })
                })
                .collect();
            hs.into_iter().map(|h| h.join().unwrap()).collect()
        });
        let winners: Vec<usize> = results.iter().filter(|r| r.1).map(|r| r.0).collect();
        assert_eq!(winners.len(), 1, "{results:?}");
        assert_eq!(b.get("index/aa03").unwrap(), vec![winners[0] as u8; 4096]);
        for n in ["snapshots/aa01", "data/aa/aa02", "index/aa03"] {
            b.delete(n).unwrap();
        }
    }

    fn sorted(mut l: Vec<ObjectInfo>) -> Vec<ObjectInfo> {
        l.sort_by(|a, b| a.name.cmp(&b.name));
        l
    }

    fn basics(b: &dyn Backend) {
        b.put("config", b"hello").unwrap();
        assert_eq!(b.get("config").unwrap(), b"hello");
        b.put("config", b"replaced").unwrap();
        assert_eq!(b.get("config").unwrap(), b"replaced");
        b.put("data/ab/abcd", &[1, 2, 3, 4, 5]).unwrap();
        b.put("data/cd/cdef", &[9; 1000]).unwrap();
        b.put("index/0011", b"").unwrap();
        assert_eq!(b.get("index/0011").unwrap(), b"");
        assert_eq!(b.get_range("data/ab/abcd", 1, 3).unwrap(), vec![2, 3, 4]);
        assert_eq!(
            b.get_range("data/ab/abcd", 0, 5).unwrap(),
            vec![1, 2, 3, 4, 5]
        );
        assert_eq!(b.get_range("data/ab/abcd", 5, 0).unwrap(), Vec::<u8>::new());
        assert!(
            b.get_range("data/ab/abcd", 3, 5).is_err(),
            "range past the end"
        );
        assert!(
            b.get_range("data/ab/abcd", 9, 1).is_err(),
            "range after the end"
        );
        // The same into one kept buffer, whatever it held before.
        let pool = bufpool::BufferPool::new(1 << 20, 2);
        let mut r = bufpool::Pooled::copy_of(&pool, &[7; 100]);
        b.get_range_into("data/ab/abcd", 1, 3, &mut r).unwrap();
        assert_eq!(&r[..], &[2, 3, 4]);
        b.get_range_into("data/ab/abcd", 0, 5, &mut r).unwrap();
        assert_eq!(&r[..], &[1, 2, 3, 4, 5]);
        b.get_range_into("data/ab/abcd", 5, 0, &mut r).unwrap();
        assert!(r.is_empty());
        assert!(b.get_range_into("data/ab/abcd", 3, 5, &mut r).is_err());
        assert!(b.get_range_into("data/ab/abcd", 9, 1, &mut r).is_err());
        b.get_range_into("data/cd/cdef", 10, 990, &mut r).unwrap();
        assert_eq!(&r[..], &[9; 990][..]);
        assert_eq!(
            sorted(b.list("data/").unwrap()),
            vec![
                ObjectInfo {
                    name: "data/ab/abcd".into(),
                    size: 5
                },
                ObjectInfo {
                    name: "data/cd/cdef".into(),
                    size: 1000
                },
            ]
        );
        assert_eq!(
            b.list("index/").unwrap(),
            vec![ObjectInfo {
                name: "index/0011".into(),
                size: 0
            }]
        );
        b.put_metadata_new("data/ee/eeff", b"trees").unwrap();
        assert_eq!(b.get_metadata_range("data/ee/eeff", 1, 3).unwrap(), b"ree");
        assert_eq!(b.get("data/ee/eeff").unwrap(), b"trees");
        for n in [
            "data/ab/abcd",
            "data/cd/cdef",
            "data/ee/eeff",
            "index/0011",
            "config",
        ] {
            b.delete(n).unwrap();
            assert!(b.get(n).unwrap_err().is_not_found(), "{n} deleted");
        }
        assert!(b.list("data/").unwrap().is_empty());
    }

    /// The empty prefix lists everything, under the same names.
    fn empty_prefix(b: &dyn Backend) {
        b.put("data/ab/abcd", b"x").unwrap();
        b.put("config", b"c").unwrap();
        let all: Vec<String> = sorted(b.list("").unwrap())
            .into_iter()
            .map(|o| o.name)
            .collect();
        assert_eq!(all, vec!["config".to_string(), "data/ab/abcd".to_string()]);
        b.delete("data/ab/abcd").unwrap();
        b.delete("config").unwrap();
    }

    fn missing_objects(b: &dyn Backend) {
        assert!(b.get("config").unwrap_err().is_not_found());
        assert!(b.size("data/ab/abcd").unwrap_err().is_not_found());
        assert!(b.get("snapshots/00ff").unwrap_err().is_not_found());
        assert!(
            b.get_range("data/ab/abcd", 0, 1)
                .unwrap_err()
                .is_not_found()
        );
        // An empty range of a missing object says so too (a pack's presence is
        // asked this way).
        assert!(
            b.get_range("data/ab/abcd", 0, 0)
                .unwrap_err()
                .is_not_found()
        );
        assert!(
            b.get_metadata_range("data/ab/abcd", 0, 1)
                .unwrap_err()
                .is_not_found()
        );
        let pool = bufpool::BufferPool::new(1 << 20, 1);
        let mut r = bufpool::Pooled::new(&pool, 0);
        assert!(
            b.get_range_into("data/ab/abcd", 0, 1, &mut r)
                .unwrap_err()
                .is_not_found()
        );
        match b.delete("data/ab/abcd") {
            Ok(()) => {}
            Err(e) => assert!(e.is_not_found(), "delete of a missing object: {e}"),
        }
        assert!(b.list("index/").unwrap().is_empty());
        assert!(b.list("no-such-prefix/").unwrap().is_empty());
    }

    /// Writers on several threads: distinct objects all arrive, and writers racing
    /// on one name leave exactly one writer's whole content, never a mix.
    fn concurrent_writers(b: &dyn Backend) {
        const THREADS: u8 = 6;
        const EACH: usize = 8;
        std::thread::scope(|s| {
            for t in 0..THREADS {
                s.spawn(move || {
                    for i in 0..EACH {
                        let body = pattern(1000 + i * 37, t);
                        b.put(&format!("locks/{t:02x}{i:02x}"), &body).unwrap();
                        b.put("snapshots/shared", &pattern(200_000, t)).unwrap();
                    }
                });
            }
        });
        let listed = b.list("locks/").unwrap();
        assert_eq!(listed.len(), THREADS as usize * EACH);
        for t in 0..THREADS {
            for i in 0..EACH {
                let name = format!("locks/{t:02x}{i:02x}");
                assert_eq!(b.get(&name).unwrap(), pattern(1000 + i * 37, t), "{name}");
                b.delete(&name).unwrap();
            }
        }
        let shared = b.get("snapshots/shared").unwrap();
        assert!(
            (0..THREADS).any(|t| shared == pattern(200_000, t)),
            "racing writers left a mixed object"
        );
        b.delete("snapshots/shared").unwrap();
        assert!(b.list("locks/").unwrap().is_empty());
    }

    fn large_objects(b: &dyn Backend) {
        let len = 48 << 20;
        let big = pattern(len, 0x5a);
        b.put("data/ef/big", &big).unwrap();
        assert_eq!(b.list("data/ef/").unwrap()[0].size, len as u64);
        assert_eq!(b.size("data/ef/big").unwrap(), len as u64);
        assert!(b.get("data/ef/big").unwrap() == big);
        for (off, n) in [(0, 1), (len - 2, 2), (17 << 20, 3 << 20), (12345, 1)] {
            assert!(
                b.get_range("data/ef/big", off as u64, n as u64).unwrap() == big[off..off + n],
                "range {off}+{n}"
            );
        }
        assert!(b.get_range("data/ef/big", len as u64 - 1, 2).is_err());
        // Into one kept buffer: large ranges (read with O_DIRECT where the backend
        // does), smaller ones after larger, unaligned ones.
        let pool = bufpool::BufferPool::new(64 << 20, 1);
        let mut r = bufpool::Pooled::new(&pool, 0);
        for (off, n) in [
            (0, 8 << 20),
            (4096, 4 << 20),
            (12345, 3 << 20),
            (len - 5, 5),
            (1, 1),
        ] {
            b.get_range_into("data/ef/big", off as u64, n as u64, &mut r)
                .unwrap();
            assert!(r[..] == big[off..off + n], "range into {off}+{n}");
        }
        assert!(
            b.get_range_into("data/ef/big", len as u64 - 1, 2, &mut r)
                .is_err()
        );
        b.delete("data/ef/big").unwrap();
    }
}

#[cfg(test)]
mod names_tests {
    use super::names::listed;

    /// Only names where cairn puts its objects give an id: what another
    /// repository made inside this one stores is not this one's.
    #[test]
    fn only_objects_in_their_place_are_listed() {
        let hex = "ab".to_string() + &"0".repeat(62);
        assert_eq!(listed(&format!("data/ab/{hex}")), hex);
        assert_eq!(listed(&format!("index/{hex}")), hex);
        assert_eq!(
            listed(&format!("index/admin-{hex}")),
            format!("admin-{hex}")
        );
        assert_eq!(listed(&format!("snapshots/{hex}")), hex);
        for other in [
            format!("data/data/ab/{hex}"),
            format!("data/cd/{hex}"),
            format!("data/{hex}"),
            format!("index/index/{hex}"),
            format!("data/ab/{hex}/x"),
            // Upper case: a copy under another spelling, not the object.
            format!("data/AB/{}", hex.to_uppercase()),
            format!("data/ab/{}", hex.to_uppercase()),
            format!("snapshots/{}", hex.to_uppercase()),
            format!("index/ADMIN-{hex}"),
            hex.clone(),
            String::new(),
        ] {
            assert_eq!(listed(&other), "", "{other}");
        }
    }
}
