//! Opening, creating and reading a repository.
//!
//! Order of objects at `init`: key file first, `config` last, so a crash leaves either
//! no config (no repository; `init` may be run again) or a complete one. `config` is
//! the marker that a repository exists, and `init` refuses to run where one does.

use crate::error::{Error, Result};
use crate::index::MasterIndex;
use cairn_backend::{Backend, names};
use cairn_format::config::{ChunkerParams, Compression, Config, IndexPlacement};
use cairn_format::consts::*;
use cairn_format::envelope::{Encryption, random_bytes};
use cairn_format::index::IndexFile;
use cairn_format::key::{KdfParams, KeyFile, MasterKey};
use cairn_format::pending::PendingDeletion;
use cairn_format::snapshot::Snapshot;
use cairn_format::tree::{ChunkList, Tree};
use cairn_format::{BlobId, FormatError, IndexId, KeyId, PackId, PendingId, RepoId, SnapshotId};
use std::collections::HashSet;
use std::path::PathBuf;
use std::sync::Arc;

/// What a damaged repository config is called in errors ([`Error::is_config_damage`]).
pub(crate) const CONFIG_WHAT: &str = "repository config";

pub mod blob;
pub mod blobcache;
mod config_repair;
pub mod dedup;
mod index_load;
pub mod info;
mod keys;
pub mod lock;
pub mod memory;
mod objects;
pub mod packer;
pub mod room;
mod snapshots;
pub mod storage;

pub use config_repair::{ConfigRepair, Settings as ConfigSettings};
pub(crate) use index_load::until_settled;
pub use index_load::{EachPending, IndexObject, IndexReadError, IndexState};
pub(crate) use objects::packs_of;
pub use snapshots::{
    HostRead, REPAIRED_TAG, SnapshotError, SnapshotList, UNBOUND_MARK, host_claim_note,
    is_repaired, resolve_snapshot_prefix, snapshot_order,
};
pub(crate) use snapshots::{existing_replacement, latest, latest_in, passed_over, same_but_tags};

#[derive(Clone, Debug)]
pub struct InitOptions {
    pub block_size: u32,
    pub compression: Compression,
    pub encryption: bool,
    pub kdf: KdfParams,
    pub index_placement: IndexPlacement,
    pub index_path: Option<String>,
    /// Share another repository's master secret and chunker settings (`init
    /// --copy-key-from`): both then give the same data the same blob ids, so `copy`
    /// between them compares ids instead of re-chunking, and reads from the source
    /// only what the destination lacks. `block_size` is ignored.
    pub shared: Option<SharedKey>,
}

/// What a repository shares with the one whose key it copies.
#[derive(Clone)]
pub struct SharedKey {
    pub secret: [u8; 32],
    pub chunker: ChunkerParams,
}

impl std::fmt::Debug for SharedKey {
    /// The secret never reaches a log line.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SharedKey")
            .field("chunker", &self.chunker)
            .finish_non_exhaustive()
    }
}

impl SharedKey {
    /// Refuses to put the secret of an unencrypted repository (stored in plain text
    /// in its config) behind a password: the new repository would only look secret.
    pub fn of(repo: &Repository, encrypt: bool) -> Result<SharedKey> {
        let source_encrypted = repo.config().encryption != Encryption::None;
        if encrypt && !source_encrypted {
            return Err(Error::Invalid(
                "the source repository is not encrypted: its key is readable by anyone with access to it, so an encrypted repository cannot share it (use --no-encryption, or do not share the key)".into(),
            ));
        }
        if !encrypt && source_encrypted {
            // An unencrypted repository keeps its secret in plain text in `config`:
            // sharing would publish the key that decrypts the source.
            return Err(Error::Invalid(
                "the source repository is encrypted: an unencrypted repository stores its key in plain text, which would expose the source's data (drop --no-encryption, or do not share the key)".into(),
            ));
        }
        Ok(SharedKey {
            secret: *repo.key().secret(),
            chunker: repo.config().chunker.clone(),
        })
    }
}

impl Default for InitOptions {
    fn default() -> Self {
        InitOptions {
            block_size: DEFAULT_BLOCK_SIZE,
            compression: Compression::Standard,
            encryption: true,
            kdf: KdfParams::new_default(),
            index_placement: IndexPlacement::Ram,
            index_path: None,
            shared: None,
        }
    }
}

pub struct Repository {
    backend: Arc<dyn Backend>,
    config: Config,
    key: Arc<MasterKey>,
    key_id: Option<KeyId>,
    index: Arc<MasterIndex>,
    /// Index files that could not be read, with why; blobs only they listed are
    /// treated as missing.
    index_errors: Vec<Error>,
    /// What went to and came from the storage, when opened through [`storage`].
    traffic: Option<Arc<cairn_backend::Traffic>>,
    /// The location as the user gave it.
    location: String,
    /// Recently read blobs (for repeated reads: mounts, image file systems).
    blob_cache: Arc<blobcache::BlobCache>,
    /// Set when a backup loaded only part of the index because the storage (a cairn
    /// server) answers dedup queries for the rest.
    dedup: Option<Arc<dedup::DedupClient>>,
    /// `--memory-limit` (or the repository's default), and the plan the session
    /// made under it, which operations size their buffers from.
    memory_limit: Option<u64>,
    memory_plan: Option<memory::MemoryPlan>,
    /// Where this machine keeps what it derives from the repository (the SSD
    /// index, the dedup answers of a server): `--cache-dir`, else the user's
    /// cache directory.
    local_base: Option<PathBuf>,
    /// How long taking a lock keeps trying while another operation holds the
    /// repository (`--retry-lock`); zero: a few seconds' tries, then the error.
    lock_wait: std::time::Duration,
}

/// The datastore's pack size: the format's bounds (docs/FORMAT.md, "Config").
pub const PACK_SIZE_MIN: u64 = 1 << 20;
pub const PACK_SIZE_MAX: u64 = 256 << 20;
/// A client's own pack size (`backup --pack-size`) may be smaller, for slow links.
pub const CLIENT_PACK_SIZE_MIN: u64 = 128 << 10;

pub fn hostname() -> String {
    cairn_backend::process::hostname()
}

pub fn username() -> String {
    nix::unistd::User::from_uid(nix::unistd::getuid())
        .ok()
        .flatten()
        .map(|u| u.name)
        .unwrap_or_else(|| nix::unistd::getuid().to_string())
}

/// The backup tool whose repository `backend` holds, when it is not cairn's:
/// restic (key files of JSON naming scrypt), borg (an INI `config` with a
/// `[repository]` section) or kopia (its `kopia.repository.f`). `config` is the
/// config file read, if there is one. What cannot be read counts as no.
fn other_tool(backend: &dyn Backend, config: Option<&[u8]>) -> Option<&'static str> {
    if config.is_some_and(|c| c.trim_ascii_start().starts_with(b"[repository]")) {
        return Some("borg");
    }
    if config.is_none() && backend.get_bounded("kopia.repository.f", 1 << 20).is_ok() {
        return Some("kopia");
    }
    let keys = backend.list(names::KEYS).ok()?;
    let first = keys.first()?;
    let raw = backend.get_bounded(&first.name, 64 * 1024).ok()?;
    let key: serde_json::Value = serde_json::from_slice(&raw).ok()?;
    (key.get("kdf").and_then(|k| k.as_str()) == Some("scrypt") && key.get("N").is_some())
        .then_some("restic")
}

/// Whether a repository without a config holds nothing an operation wrote:
/// no pack, index file or snapshot (an `init` killed between its key file and its
/// config leaves only keys).
fn interrupted_init(backend: &dyn Backend) -> Result<bool> {
    for prefix in [names::DATA, names::INDEX, names::SNAPSHOTS] {
        match backend.list(prefix) {
            Ok(l) if !l.is_empty() => return Ok(false),
            Ok(_) => {}
            Err(e) if e.is_not_found() => {}
            Err(e) => return Err(e.into()),
        }
    }
    Ok(true)
}

fn config_exists(backend: &dyn Backend) -> Result<bool> {
    match backend.get_bounded(names::CONFIG, MAX_SMALL_OBJECT_SIZE as u64) {
        Ok(_) => Ok(true),
        Err(e) if e.is_not_found() => Ok(false),
        Err(e) => Err(e.into()),
    }
}

/// Whether `backend` holds a repository: a config and a key (a file that happens
/// to be named `config` is not one). What cannot be read counts as no.
fn holds_repository(backend: &dyn Backend) -> bool {
    config_exists(backend).unwrap_or(false)
        && backend.list(names::KEYS).is_ok_and(|k| !k.is_empty())
}

/// The repository a new one at `location` would be inside of, if any: a directory
/// above it (or an S3 prefix above it, in its bucket) holding a repository.
/// What cannot be looked at (a prefix a policy does not let this user read) counts
/// as no repository.
fn enclosing_repository(
    location: &storage::Location,
    opts: &storage::StorageOptions,
) -> Option<String> {
    match location {
        storage::Location::Local(dir) => {
            // Where it really is: a symlink on the way must not hide the repository
            // above (the part not made yet is taken as written).
            let abs = std::path::absolute(dir).ok()?;
            let mut there = abs.as_path();
            let mut to_make = Vec::new();
            while !there.exists() {
                to_make.push(there.file_name()?);
                there = there.parent()?;
            }
            let mut real = std::fs::canonicalize(there).ok()?;
            real.extend(to_make.iter().rev());
            real.ancestors()
                .skip(1)
                .find(|a| holds_repository(&cairn_backend::LocalBackend::new(a)))
                .map(|a| a.display().to_string())
        }
        storage::Location::S3(s) => {
            let loc = cairn_backend::S3Location::parse(s).ok()?;
            let parts: Vec<&str> = loc.prefix.split('/').filter(|p| !p.is_empty()).collect();
            (0..parts.len()).rev().find_map(|n| {
                let mut above = format!("s3:{}/{}", loc.endpoint, loc.bucket);
                for p in &parts[..n] {
                    above.push('/');
                    above.push_str(p);
                }
                let backend = cairn_backend::S3Backend::open(&above, &opts.s3).ok()?;
                holds_repository(&backend).then_some(above)
            })
        }
        storage::Location::Server(_) => None,
    }
}

impl Repository {
    /// Keep trying to take a lock for up to `wait` while another operation holds
    /// the repository (`--retry-lock`, as restic's): a nightly `forget --prune`
    /// that meets another one waits its turn instead of failing.
    pub fn set_lock_wait(&mut self, wait: std::time::Duration) {
        self.lock_wait = wait;
    }

    pub fn lock_wait(&self) -> std::time::Duration {
        self.lock_wait
    }

    /// Creates a repository. `password` is required unless encryption is off.
    pub fn init(
        backend: Arc<dyn Backend>,
        password: Option<&str>,
        opts: &InitOptions,
    ) -> Result<Repository> {
        if !BLOCK_SIZES.contains(&opts.block_size) {
            return Err(Error::Invalid(format!(
                "block size {} is not one of 4K, 8K, 16K, 32K, 64K",
                opts.block_size
            )));
        }
        // Another tool's repository is said to be one, not "a repository" (a
        // kopia one has no config of ours, and would be written into: QA).
        let config = match backend.get_bounded(names::CONFIG, MAX_SMALL_OBJECT_SIZE as u64) {
            Ok(c) => Some(c),
            Err(e) if e.is_not_found() => None,
            Err(e) => return Err(e.into()),
        };
        if let Some(tool) = other_tool(backend.as_ref(), config.as_deref())
            .filter(|_| config.as_deref().is_none_or(|c| Config::parse(c).is_err()))
        {
            return Err(Error::OtherToolsRepository(backend.location(), tool));
        }
        let has_config = config.is_some();
        let has_keys = !backend.list(names::KEYS)?.is_empty();
        if !has_config && has_keys && interrupted_init(backend.as_ref())? {
            return Err(Error::InterruptedInit(backend.location()));
        }
        if has_config || has_keys {
            return Err(Error::RepositoryExists(backend.location()));
        }
        let encryption = if opts.encryption {
            Encryption::best_for_this_cpu()
        } else {
            Encryption::None
        };
        let key = match &opts.shared {
            Some(s) => MasterKey::from_secret(s.secret, encryption),
            None => MasterKey::generate(encryption),
        };
        let chunker = match &opts.shared {
            Some(s) => s.chunker.clone(),
            None => ChunkerParams::for_block_size(opts.block_size),
        };
        let config = Config {
            version: REPO_FORMAT_VERSION,
            id: RepoId(random_bytes()).to_hex(),
            created: crate::time::now_rfc3339(),
            encryption,
            chunker,
            compression: opts.compression,
            pack_size: DEFAULT_PACK_SIZE as u32,
            max_concurrent_jobs: cairn_format::config::DEFAULT_MAX_CONCURRENT_JOBS,
            index_placement: opts.index_placement,
            index_path: opts.index_path.clone(),
            memory_limit: None,
            plain_master_secret: (encryption == Encryption::None)
                .then(|| hex::encode(key.secret())),
            features: vec![cairn_format::consts::FEATURE_ADMIN_NAMES.to_string()],
            unknown_fields: Default::default(),
        };
        let mut repo = Repository {
            backend,
            config,
            key: Arc::new(key),
            key_id: None,
            index: Arc::new(MasterIndex::new()),
            index_errors: Vec::new(),
            traffic: None,
            location: String::new(),
            dedup: None,
            memory_limit: None,
            memory_plan: None,
            local_base: cairn_backend::cache::base_dir(),
            lock_wait: std::time::Duration::ZERO,
            blob_cache: Arc::new(blobcache::BlobCache::new(
                blobcache::DEFAULT_BLOB_CACHE_BYTES,
            )),
        };
        repo.location = repo.backend.location();
        if opts.encryption {
            let pw = password.ok_or_else(|| {
                Error::Invalid("a password is needed for an encrypted repository".into())
            })?;
            repo.key_id = Some(repo.add_key_with(pw, opts.kdf.clone())?);
        }
        repo.write_config()?;
        Ok(repo)
    }

    /// Opens an existing repository. `password` is asked for only when a key file
    /// must be unwrapped.
    pub fn open(
        backend: Arc<dyn Backend>,
        password: impl FnOnce() -> Result<String>,
    ) -> Result<Repository> {
        let raw = match backend.get_bounded(names::CONFIG, MAX_SMALL_OBJECT_SIZE as u64) {
            Ok(r) => r,
            Err(e) if e.kind == cairn_backend::BackendErrorKind::NoRepository => {
                return Err(Error::RepositoryNotFound(format!(
                    "{} ({})",
                    backend.location(),
                    e.message
                )));
            }
            Err(e) if e.is_not_found() => {
                if let Some(tool) = other_tool(backend.as_ref(), None) {
                    return Err(Error::OtherToolsRepository(backend.location(), tool));
                }
                let keys = !backend.list(names::KEYS)?.is_empty();
                let interrupted = interrupted_init(backend.as_ref())?;
                if keys && interrupted {
                    return Err(Error::InterruptedInit(backend.location()));
                }
                // A repository's other objects without its config: the config
                // was lost, and the advice is to put it back, not that the path
                // is wrong (QA).
                if !interrupted {
                    return Err(Error::ConfigMissing(backend.location()));
                }
                return Err(Error::NotARepository(backend.location()));
            }
            Err(e) => return Err(objects::too_large_is_damage(e, CONFIG_WHAT)),
        };
        let (config, body, mac) =
            Config::parse(&raw).map_err(|e| match other_tool(backend.as_ref(), Some(&raw)) {
                Some(tool) => Error::OtherToolsRepository(backend.location(), tool),
                None => Error::damaged(CONFIG_WHAT, e),
            })?;
        let (key, key_id) = match config.encryption {
            Encryption::None => {
                let hexs = config.plain_master_secret.as_deref().ok_or_else(|| {
                    Error::damaged(
                        CONFIG_WHAT,
                        FormatError::malformed("config", "unencrypted repository without key"),
                    )
                })?;
                let mut secret = [0u8; 32];
                hex::decode_to_slice(hexs, &mut secret).map_err(|e| {
                    Error::damaged(CONFIG_WHAT, FormatError::malformed("config", e.to_string()))
                })?;
                (MasterKey::from_secret(secret, Encryption::None), None)
            }
            enc => {
                let pw = password()?;
                // The key must also authenticate the config: a key file copied in
                // from another repository may open with the same password.
                let fits = |secret: &[u8; 32]| {
                    let k = MasterKey::from_secret(*secret, enc);
                    config.authenticated_by(&body, &mac, |b| k.mac(b))
                };
                let (secret, id) = Self::unwrap_any_key(backend.as_ref(), pw.as_bytes(), &fits)?;
                (MasterKey::from_secret(secret, enc), Some(id))
            }
        };
        if !config.authenticated_by(&body, &mac, |b| key.mac(b)) {
            return Err(Error::damaged(
                CONFIG_WHAT,
                FormatError::Authentication { what: "config" },
            ));
        }
        Ok(Repository {
            config,
            key: Arc::new(key),
            key_id,
            index: Arc::new(MasterIndex::new()),
            index_errors: Vec::new(),
            traffic: None,
            dedup: None,
            memory_limit: None,
            memory_plan: None,
            local_base: cairn_backend::cache::base_dir(),
            lock_wait: std::time::Duration::ZERO,
            blob_cache: Arc::new(blobcache::BlobCache::new(
                blobcache::DEFAULT_BLOB_CACHE_BYTES,
            )),
            location: backend.location(),
            backend,
        })
    }

    /// Opens the repository again with the key this handle holds: the config is
    /// read and authenticated afresh and the index starts empty, but no key file is
    /// unwrapped (no password, no KDF). For a long-lived holder of a key, such as a
    /// server that keeps a datastore unlocked, which opens a new session for each
    /// piece of work.
    pub fn reopen(&self) -> Result<Repository> {
        Ok(Repository {
            config: self.stored_config()?,
            blob_cache: Arc::new(blobcache::BlobCache::new(
                blobcache::DEFAULT_BLOB_CACHE_BYTES,
            )),
            ..self.index_source()
        })
    }

    /// A handle that reads index files and pending records as this one does, with
    /// no index of its own (so an index may keep it without holding itself): what
    /// the SSD placement rebuilds damaged files from in the middle of a run.
    pub(crate) fn index_source(&self) -> Repository {
        Repository {
            config: self.config.clone(),
            key: self.key.clone(),
            key_id: self.key_id,
            index: Arc::new(MasterIndex::new()),
            index_errors: Vec::new(),
            traffic: self.traffic.clone(),
            dedup: None,
            memory_limit: self.memory_limit,
            memory_plan: None,
            local_base: self.local_base.clone(),
            lock_wait: self.lock_wait,
            blob_cache: Arc::new(blobcache::BlobCache::new(0)),
            location: self.location.clone(),
            backend: self.backend.clone(),
        }
    }

    /// Opens the repository at a location string (`/path`, `s3:...`) with the
    /// storage stack of [`storage::open_storage`]; `password` is asked for only when
    /// the repository is encrypted.
    pub fn open_at(
        location: &str,
        opts: &storage::StorageOptions,
        password: impl FnOnce() -> Result<String>,
        progress: &crate::progress::Progress,
    ) -> Result<Repository> {
        let st = storage::open_storage(location, opts, progress)?;
        if let storage::Location::Local(dir) = &st.location {
            // `exists` is false for a path this user may not reach too: that is
            // said as itself (QA: "there is no repository" for a parent
            // directory of mode 700, which makes a user think the backups gone).
            match std::fs::metadata(dir) {
                Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
                    return Err(Error::RepositoryNotFound(dir.display().to_string()));
                }
                Err(e) => return Err(Error::io(dir, e)),
                Ok(_) => {}
            }
            if !dir.is_dir() {
                return Err(Error::NotARepository(format!(
                    "{} (a file, not a directory)",
                    dir.display()
                )));
            }
        }
        let repo = Repository::open(st.backend.clone(), password)?;
        Ok(repo.reached_through(st, &opts.cache))
    }

    /// Creates a repository at a location string (a local directory is created).
    pub fn init_at(
        location: &str,
        opts: &storage::StorageOptions,
        password: Option<&str>,
        init: &InitOptions,
        progress: &crate::progress::Progress,
    ) -> Result<Repository> {
        let st = storage::open_storage(location, opts, progress)?;
        if let Some(outer) = enclosing_repository(&st.location, opts) {
            return Err(Error::Invalid(format!(
                "{location} is inside the cairn repository at {outer}: that one's check and \
                 prune would take what this one stores for their own, and removing either \
                 would cut into the other; create it outside"
            )));
        }
        if let storage::Location::Local(dir) = &st.location {
            if dir.exists() && !dir.is_dir() {
                return Err(Error::Invalid(format!(
                    "{} is a file: a repository is a directory (give a new or empty one)",
                    dir.display()
                )));
            }
            // Private, as the objects in it are (an existing directory keeps
            // the mode its owner gave it).
            cairn_backend::private_dir(dir, false).map_err(|e| Error::io(dir, e))?;
        }
        let repo = Repository::init(st.backend.clone(), password, init)?;
        Ok(repo.reached_through(st, &opts.cache))
    }

    /// The handle with what the storage's opening knows: its traffic counters,
    /// the location's name, and `--cache-dir` for what this machine keeps.
    fn reached_through(mut self, st: storage::Storage, cache: &storage::CacheChoice) -> Self {
        self.traffic = Some(st.traffic);
        self.location = st.name;
        if let storage::CacheChoice::Dir(d) = cache {
            self.local_base = Some(d.clone());
        }
        self
    }

    /// Bytes and requests to and from the storage so far (when opened at a location).
    pub fn traffic(&self) -> Option<&Arc<cairn_backend::Traffic>> {
        self.traffic.as_ref()
    }

    /// The location the repository was opened at, as given.
    pub fn location(&self) -> &str {
        &self.location
    }

    /// Whether this repository is a datastore of `cairn serve` (`cairn+https://`):
    /// the server judges locks and missing packs itself, and its links are the slow
    /// ones, so callers flush index files more often and skip their own checks.
    pub fn through_server(&self) -> bool {
        matches!(
            storage::Location::parse(&self.location),
            Ok(storage::Location::Server(_))
        )
    }

    /// The secret of the first key file that opens with `password` and `fits`
    /// (authenticates the config); one that opens but does not fit is passed over,
    /// and named if no other fits.
    fn unwrap_any_key(
        backend: &dyn Backend,
        password: &[u8],
        fits: &dyn Fn(&[u8; 32]) -> bool,
    ) -> Result<([u8; 32], KeyId)> {
        // A key file listed and then gone was replaced by a `key passwd` (a new
        // file first, then the old one removed): listed once more, its
        // replacement is found. Another key's change does not concern this one.
        let mut relisted = false;
        loop {
            let mut keys = backend.list(names::KEYS)?;
            // In name order: the same key is tried first on every file system
            // (a directory listing's order is the file system's).
            keys.sort_by(|a, b| a.name.cmp(&b.name));
            if keys.is_empty() {
                return Err(Error::Invalid(
                    "the repository has no key files: it cannot be opened".into(),
                ));
            }
            let keys_listed = keys.len();
            let mut misfits: Vec<KeyId> = Vec::new();
            let mut found = None;
            let pass = keys::open_each(backend, keys, password, &mut |secret, id| {
                if fits(&secret) {
                    found = Some((secret, id));
                    return true;
                }
                misfits.push(id);
                false
            })?;
            if let Some(f) = found {
                return Ok(f);
            }
            let (damaged, vanished) = (pass.damaged, pass.vanished);
            if vanished && !relisted {
                relisted = true;
                continue;
            }
            if !misfits.is_empty() {
                let names: Vec<String> = misfits
                    .iter()
                    .map(|k| format!("{}{}", names::KEYS, k.to_hex()))
                    .collect();
                // Every key file opens with this password: none can be one
                // copied in from elsewhere, so the config is what is damaged
                // (QA: the advice to remove the only key would have lost the
                // repository).
                let why = if misfits.len() == keys_listed {
                    "the config is damaged: `cairn repair config` checks that key against the \
                     snapshots and seals the config again with it"
                } else {
                    "the config is damaged (`cairn repair config` checks that key against the \
                     snapshots and seals the config again with it), or that key file was \
                     copied in from another repository"
                };
                return Err(Error::damaged(
                    format!(
                        "{CONFIG_WHAT} (the password opens {}, which does not authenticate \
                         it: {why})",
                        names.join(", ")
                    ),
                    FormatError::Authentication { what: "config" },
                ));
            }
            return Err(match damaged {
                // The password may belong to the damaged key: say so rather than
                // call it wrong.
                Some(d) => Error::KeyDamaged(d.to_string()),
                None => Error::WrongPassword,
            });
        }
    }

    fn write_config(&self) -> Result<()> {
        Self::store_config(self.backend.as_ref(), &self.key, &self.config)
    }

    fn store_config(backend: &dyn Backend, key: &Arc<MasterKey>, config: &Config) -> Result<()> {
        let key = key.clone();
        let bytes = config.to_bytes(move |b| key.mac(b));
        backend.put(names::CONFIG, &bytes)?;
        Ok(())
    }

    /// The config as the repository holds it now, authenticated with this handle's
    /// key.
    fn stored_config(&self) -> Result<Config> {
        let raw = match self
            .backend
            .get_bounded(names::CONFIG, MAX_SMALL_OBJECT_SIZE as u64)
        {
            Ok(r) => r,
            Err(e) if e.is_not_found() => {
                return Err(Error::NotARepository(self.backend.location()));
            }
            Err(e) => return Err(objects::too_large_is_damage(e, CONFIG_WHAT)),
        };
        let (config, body, mac) =
            Config::parse(&raw).map_err(|e| Error::damaged(CONFIG_WHAT, e))?;
        if config.id != self.config.id || !config.authenticated_by(&body, &mac, |b| self.key.mac(b))
        {
            return Err(Error::damaged(
                CONFIG_WHAT,
                FormatError::Authentication { what: "config" },
            ));
        }
        Ok(config)
    }

    /// Changes one setting in the config as stored now, not as this handle read
    /// it: what another command changed since (during a long `cairn index` build,
    /// say) is kept. Returns the config written.
    ///
    /// Two changes at once would each rewrite the config with only their own
    /// setting changed: a lock that only other config changes respect keeps them
    /// in turn (prune, repair and backups go on beside it).
    fn change_config(&self, change: impl FnOnce(&mut Config)) -> Result<Config> {
        let _turn = lock::RepoLock::acquire_alone(self, "config")?;
        let mut config = self.stored_config()?;
        change(&mut config);
        Self::store_config(self.backend.as_ref(), &self.key, &config)?;
        Ok(config)
    }

    /// A second handle on the same repository: the same storage, key, index and
    /// blob cache (all shared), for a reader that must own its repository (the
    /// image filesystem reader). Index load errors stay with the first handle.
    pub fn handle(&self) -> Repository {
        Repository {
            backend: self.backend.clone(),
            config: self.config.clone(),
            key: self.key.clone(),
            key_id: self.key_id,
            index: self.index.clone(),
            index_errors: Vec::new(),
            traffic: self.traffic.clone(),
            location: self.location.clone(),
            blob_cache: self.blob_cache.clone(),
            dedup: self.dedup.clone(),
            memory_limit: self.memory_limit,
            memory_plan: self.memory_plan,
            local_base: self.local_base.clone(),
            lock_wait: self.lock_wait,
        }
    }

    pub fn backend(&self) -> &Arc<dyn Backend> {
        &self.backend
    }
    /// Where this machine keeps what it knows of repositories (`--cache-dir`, else
    /// the user's cache directory); None when there is none.
    pub(crate) fn local_base(&self) -> Option<&std::path::Path> {
        self.local_base.as_deref()
    }

    pub fn config(&self) -> &Config {
        &self.config
    }
    pub fn key(&self) -> &Arc<MasterKey> {
        &self.key
    }
    pub fn key_id(&self) -> Option<KeyId> {
        self.key_id
    }
    pub fn index(&self) -> &Arc<MasterIndex> {
        &self.index
    }
    /// The server's dedup service, when this backup loaded only the index files
    /// listing trees ([`Repository::load_index_for_backup`]).
    pub fn dedup(&self) -> Option<&Arc<dedup::DedupClient>> {
        self.dedup.as_ref()
    }
    pub fn index_errors(&self) -> &[Error] {
        &self.index_errors
    }

    pub fn chunker(&self) -> cairn_chunker::Chunker {
        let c = &self.config.chunker;
        cairn_chunker::Chunker::new(
            c.min_size,
            c.avg_size,
            c.max_size,
            c.normalization,
            self.key.chunker_seed,
        )
    }

    /// Changes the compression policy for blobs written from now on.
    pub fn set_compression(&mut self, c: Compression) -> Result<()> {
        self.config = self.change_config(|cfg| cfg.compression = c)?;
        Ok(())
    }

    /// Sets how many backup jobs may write at once (1 to 1024); takes effect for
    /// jobs that start from now on.
    /// The size packs of new data fill up to before they are stored: smaller packs
    /// lose less work when a slow link drops, larger ones mean fewer objects.
    pub fn set_pack_size(&mut self, bytes: u64) -> Result<()> {
        let range = PACK_SIZE_MIN..=PACK_SIZE_MAX;
        if !range.contains(&bytes) {
            return Err(Error::BadArgument(
                "the pack size must be between 1 MiB and 256 MiB (a client's own `backup \
                 --pack-size` may go down to 128 KiB)"
                    .into(),
            ));
        }
        self.config = self.change_config(|c| c.pack_size = bytes as u32)?;
        Ok(())
    }

    /// The repository's default memory limit for operations (`None`: none).
    pub fn set_default_memory_limit(&mut self, limit: Option<u64>) -> Result<()> {
        if let Some(l) = limit
            && l < memory::MIN_LIMIT_BYTES
        {
            return Err(Error::BadArgument(format!(
                "memory limit {}: too small to run anything; give at least {}M, plus the \
                 RAM `cairn index` reports for the index",
                crate::units::bytes(l, 0),
                memory::MIN_LIMIT_BYTES >> 20
            )));
        }
        self.config = self.change_config(|c| c.memory_limit = limit)?;
        Ok(())
    }

    pub fn set_max_concurrent_jobs(&mut self, n: u32) -> Result<()> {
        if !(1..=cairn_format::config::MAX_MAX_CONCURRENT_JOBS).contains(&n) {
            return Err(Error::BadArgument(format!(
                "max-concurrent-jobs must be between 1 and {}",
                cairn_format::config::MAX_MAX_CONCURRENT_JOBS
            )));
        }
        self.config = self.change_config(|c| c.max_concurrent_jobs = n)?;
        Ok(())
    }
}

#[cfg(test)]
mod reopen_tests {
    use super::*;
    use cairn_backend::MemBackend;

    /// A repository in memory, with a key that is cheap to derive.
    fn new_repo() -> (Arc<dyn Backend>, Repository) {
        let backend: Arc<dyn Backend> = Arc::new(MemBackend::new());
        let opts = InitOptions {
            kdf: KdfParams {
                memory_kib: 8,
                iterations: 1,
                parallelism: 1,
                ..KdfParams::new_default()
            },
            ..InitOptions::default()
        };
        let repo = Repository::init(backend.clone(), Some("pw"), &opts).unwrap();
        (backend, repo)
    }

    /// A reopened handle sees the config as it is now, keeps the key without a
    /// password, and refuses a config its key did not seal.
    #[test]
    fn reopen_reads_the_config_again_with_the_same_key() {
        let (backend, mut repo) = new_repo();
        repo.set_max_concurrent_jobs(7).unwrap();
        let again = repo.reopen().unwrap();
        assert_eq!(again.config().max_concurrent_jobs, 7);
        assert_eq!(again.key().secret(), repo.key().secret());
        assert_eq!(again.key_id(), repo.key_id());
        let mut raw = backend.get(names::CONFIG).unwrap();
        let last = raw.len() - 1;
        raw[last] ^= 1;
        backend.put(names::CONFIG, &raw).unwrap();
        assert!(repo.reopen().is_err(), "a tampered config is refused");
    }

    /// A handle that records a setting after a long piece of work (the index
    /// built in its new place) keeps what another command set in the meantime.
    #[test]
    fn a_setting_recorded_late_keeps_the_changes_made_meanwhile() {
        let (_, first) = new_repo();
        let mut long = first.reopen().unwrap();
        long.try_index_placement(IndexPlacement::Ssd, Some("/var/tmp/idx".into()));
        let mut other = first.reopen().unwrap();
        other.set_compression(Compression::Max).unwrap();
        other.set_max_concurrent_jobs(9).unwrap();
        long.save_index_placement().unwrap();
        let now = first.reopen().unwrap();
        let c = now.config();
        assert_eq!(c.compression, Compression::Max);
        assert_eq!(c.max_concurrent_jobs, 9);
        assert_eq!(c.index_placement, IndexPlacement::Ssd);
        assert_eq!(c.index_path.as_deref(), Some("/var/tmp/idx"));
    }

    /// A config change waits while another one holds its turn (each rewrites
    /// the whole config: interleaved, one setting would be lost), and changes
    /// made at once from many threads all stay.
    #[test]
    fn config_changes_take_turns_and_none_is_lost() {
        let (_, first) = new_repo();
        let turn = lock::RepoLock::acquire_alone(&first, "config").unwrap();
        let mut waiting = first.reopen().unwrap();
        let (tx, rx) = std::sync::mpsc::channel();
        let t = std::thread::spawn(move || {
            tx.send(waiting.set_max_concurrent_jobs(5)).unwrap();
        });
        let early = rx.recv_timeout(std::time::Duration::from_millis(700));
        assert!(
            early.is_err(),
            "the change waited for the turn held: {early:?}"
        );
        drop(turn);
        rx.recv_timeout(std::time::Duration::from_secs(30))
            .expect("the change goes on once the turn is free")
            .unwrap();
        t.join().unwrap();
        // A prune's exclusive lock does not hold a config change up.
        let prune = lock::RepoLock::acquire(&first, "prune", true).unwrap();
        let threads: Vec<_> = (0..4)
            .map(|i| {
                let mut r = first.reopen().unwrap();
                std::thread::spawn(move || match i {
                    0 => r.set_compression(Compression::Max),
                    1 => r.set_pack_size(3 << 20),
                    2 => r.set_default_memory_limit(Some(1 << 30)),
                    _ => r.set_max_concurrent_jobs(11),
                })
            })
            .collect();
        for t in threads {
            t.join().unwrap().unwrap();
        }
        drop(prune);
        let now = first.reopen().unwrap();
        let c = now.config();
        assert_eq!(c.compression, Compression::Max);
        assert_eq!(c.pack_size, 3 << 20);
        assert_eq!(c.memory_limit, Some(1 << 30));
        assert_eq!(c.max_concurrent_jobs, 11);
    }
}
