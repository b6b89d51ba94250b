//! Opening, creating and reading a repository.
//!
//! Order of objects at `init`: key file first, `config` last, so a crash leaves either
//! no config (no repository; `init` may be run again) or a complete one. `config` is
//! the marker that a repository exists, and `init` refuses to run where one does.

use crate::blob;
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

/// What the repository's index files and pending-deletion records say.
#[derive(Default)]
pub struct IndexState {
    /// Index files in force.
    pub live: Vec<(IndexId, IndexFile)>,
    /// Index files still stored whose content a live file replaces.
    pub superseded: Vec<IndexId>,
    pub pending: Vec<(PendingId, PendingDeletion)>,
    /// Files that could not be read.
    pub errors: Vec<Error>,
}

impl IndexState {
    /// Snapshots recorded as committed, and as forgotten, by live index files.
    pub fn snapshot_records(&self) -> (HashSet<SnapshotId>, HashSet<SnapshotId>) {
        let mut announced = HashSet::new();
        let mut forgotten = HashSet::new();
        for (_, f) in &self.live {
            announced.extend(f.snapshots.iter().copied());
            forgotten.extend(f.forgotten.iter().copied());
        }
        (announced, forgotten)
    }
}

/// Runs `f` over `items` on up to `threads` threads, keeping the order. Items are
/// handed out one at a time, so uneven work (a tree pack next to a full data pack)
/// still keeps every thread busy.
pub(crate) fn parallel_map<T: Sync, R: Send>(
    items: &[T],
    threads: usize,
    f: impl Fn(&T) -> R + Sync,
) -> Vec<R> {
    use std::sync::atomic::{AtomicUsize, Ordering};
    let threads = threads.min(items.len()).max(1);
    let next = AtomicUsize::new(0);
    let mut slots: Vec<Option<R>> = std::iter::repeat_with(|| None).take(items.len()).collect();
    let done: Vec<Vec<(usize, R)>> = std::thread::scope(|s| {
        let handles: Vec<_> = (0..threads)
            .map(|_| {
                s.spawn(|| {
                    let mut out = Vec::new();
                    loop {
                        let i = next.fetch_add(1, Ordering::Relaxed);
                        let Some(item) = items.get(i) else { break };
                        out.push((i, f(item)));
                    }
                    out
                })
            })
            .collect();
        handles
            .into_iter()
            .map(|h| h.join().unwrap_or_else(|p| std::panic::resume_unwind(p)))
            .collect()
    });
    for (i, r) in done.into_iter().flatten() {
        slots[i] = Some(r);
    }
    slots.into_iter().flatten().collect()
}

/// One thread per core.
pub(crate) fn cores() -> usize {
    std::thread::available_parallelism()
        .map(|n| n.get())
        .unwrap_or(2)
}

/// Readable snapshots (oldest first) and the errors of those that could not be read.
pub type SnapshotList = (Vec<(SnapshotId, Snapshot)>, Vec<Error>);

pub struct Repository {
    backend: Arc<dyn Backend>,
    config: Config,
    key: Arc<MasterKey>,
    key_id: Option<KeyId>,
    index: Arc<MasterIndex>,
    /// Index files that could not be read, with why; blobs only they listed are
    /// treated as missing.
    index_errors: Vec<Error>,
}

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

fn config_exists(backend: &dyn Backend) -> Result<bool> {
    match backend.get(names::CONFIG) {
        Ok(_) => Ok(true),
        Err(e) if e.is_not_found() => Ok(false),
        Err(e) => Err(e.into()),
    }
}

impl Repository {
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
        if config_exists(backend.as_ref())? || !backend.list(names::KEYS)?.is_empty() {
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
            plain_master_secret: (encryption == Encryption::None)
                .then(|| hex::encode(key.secret())),
            features: Vec::new(),
            unknown_fields: Default::default(),
        };
        let mut repo = Repository {
            backend,
            config,
            key: Arc::new(key),
            key_id: None,
            index: Arc::new(MasterIndex::new()),
            index_errors: Vec::new(),
        };
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
        let raw = match backend.get(names::CONFIG) {
            Ok(r) => r,
            Err(e) if e.is_not_found() => return Err(Error::NotARepository(backend.location())),
            Err(e) => return Err(e.into()),
        };
        let (config, body, mac) = Config::parse(&raw).map_err(|e| {
            // A newer format is not damage: say to upgrade.
            if e.needs_newer_cairn() {
                Error::Invalid(e.to_string())
            } else {
                Error::damaged("repository config", e)
            }
        })?;
        let (key, key_id) = match config.encryption {
            Encryption::None => {
                let hexs = config.plain_master_secret.as_deref().ok_or_else(|| {
                    Error::damaged(
                        "repository config",
                        FormatError::malformed("config", "unencrypted repository without key"),
                    )
                })?;
                let mut secret = [0u8; 32];
                hex::decode_to_slice(hexs, &mut secret).map_err(|e| {
                    Error::damaged(
                        "repository config",
                        FormatError::malformed("config", e.to_string()),
                    )
                })?;
                (MasterKey::from_secret(secret, Encryption::None), None)
            }
            enc => {
                let pw = password()?;
                let (secret, id) = Self::unwrap_any_key(backend.as_ref(), pw.as_bytes())?;
                (MasterKey::from_secret(secret, enc), Some(id))
            }
        };
        if key.mac(&body) != mac {
            return Err(Error::damaged(
                "repository config",
                FormatError::Authentication { what: "config" },
            ));
        }
        Ok(Repository {
            backend,
            config,
            key: Arc::new(key),
            key_id,
            index: Arc::new(MasterIndex::new()),
            index_errors: Vec::new(),
        })
    }

    fn unwrap_any_key(backend: &dyn Backend, password: &[u8]) -> Result<([u8; 32], KeyId)> {
        let keys = backend.list(names::KEYS)?;
        if keys.is_empty() {
            return Err(Error::Invalid(
                "the repository has no key files: it cannot be opened".into(),
            ));
        }
        let mut damaged = None;
        for info in keys {
            let base = names::base(&info.name);
            let Ok(id) = KeyId::from_hex(base) else {
                continue;
            };
            let data = backend.get(&info.name)?;
            let kf = match KeyFile::from_bytes(&data) {
                Ok(k) => k,
                Err(e) => {
                    damaged = Some(Error::damaged(format!("key file {}", id.short()), e));
                    continue;
                }
            };
            match kf.unwrap_secret(password) {
                Ok(secret) => return Ok((secret, id)),
                Err(FormatError::Authentication { .. }) => continue,
                Err(e) => {
                    damaged = Some(Error::damaged(format!("key file {}", id.short()), e));
                }
            }
        }
        Err(damaged.unwrap_or(Error::WrongPassword))
    }

    fn write_config(&self) -> Result<()> {
        let key = self.key.clone();
        let bytes = self.config.to_bytes(move |b| key.mac(b));
        self.backend.put(names::CONFIG, &bytes)?;
        Ok(())
    }

    pub fn backend(&self) -> &Arc<dyn Backend> {
        &self.backend
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
        self.config.compression = c;
        self.write_config()
    }

    /// Sets how many backup jobs may write at once (1 to 1024); takes effect for
    /// jobs that start from now on.
    pub fn set_max_concurrent_jobs(&mut self, n: u32) -> Result<()> {
        if !(1..=cairn_format::config::MAX_MAX_CONCURRENT_JOBS).contains(&n) {
            return Err(Error::Invalid(format!(
                "max-concurrent-jobs must be between 1 and {}",
                cairn_format::config::MAX_MAX_CONCURRENT_JOBS
            )));
        }
        self.config.max_concurrent_jobs = n;
        self.write_config()
    }

    // ---- keys ----

    fn add_key_with(&self, password: &str, kdf: KdfParams) -> Result<KeyId> {
        let kf = KeyFile::wrap(
            &self.key,
            password.as_bytes(),
            kdf,
            crate::time::now_rfc3339(),
            hostname(),
            username(),
        )
        .map_err(|e| Error::Invalid(e.to_string()))?;
        let bytes = kf.to_bytes();
        let id = KeyId::of_content(&bytes);
        self.backend.put(&names::key(&id.to_hex()), &bytes)?;
        Ok(id)
    }

    pub fn add_key(&self, password: &str) -> Result<KeyId> {
        if self.config.encryption == Encryption::None {
            return Err(Error::Invalid(
                "this repository is not encrypted: it has no passwords".into(),
            ));
        }
        self.add_key_with(password, KdfParams::new_default())
    }

    pub fn list_keys(&self) -> Result<Vec<(KeyId, Result<KeyFile>)>> {
        let mut out = Vec::new();
        for info in self.backend.list(names::KEYS)? {
            let Ok(id) = KeyId::from_hex(names::base(&info.name)) else {
                continue;
            };
            let kf = self
                .backend
                .get(&info.name)
                .map_err(Error::from)
                .and_then(|d| {
                    KeyFile::from_bytes(&d)
                        .map_err(|e| Error::damaged(format!("key file {}", id.short()), e))
                });
            out.push((id, kf));
        }
        out.sort_by_key(|a| a.0);
        Ok(out)
    }

    /// Resolves a key id prefix.
    pub fn find_key(&self, prefix: &str) -> Result<KeyId> {
        let keys = self.list_keys()?;
        let m: Vec<KeyId> = keys
            .iter()
            .map(|(id, _)| *id)
            .filter(|id| id.to_hex().starts_with(prefix))
            .collect();
        match m.len() {
            0 => Err(Error::Invalid(format!("no key matches {prefix:?}"))),
            1 => Ok(m[0]),
            _ => Err(Error::Invalid(format!("key id {prefix:?} is ambiguous"))),
        }
    }

    /// Removes a key; the key used to open the repository and the last key cannot be
    /// removed (that would lock everyone out).
    pub fn remove_key(&self, id: KeyId) -> Result<()> {
        if Some(id) == self.key_id {
            return Err(Error::Invalid(
                "refusing to remove the key this session opened the repository with".into(),
            ));
        }
        if self.list_keys()?.len() <= 1 {
            return Err(Error::Invalid("refusing to remove the last key".into()));
        }
        self.backend.delete(&names::key(&id.to_hex()))?;
        Ok(())
    }

    /// Changes the password of the key in use: writes a new key file, then removes
    /// the old one. Data is never re-encrypted (the master secret does not change).
    pub fn change_password(&mut self, new_password: &str) -> Result<KeyId> {
        let old = self.key_id;
        let new = self.add_key(new_password)?;
        if let Some(old) = old {
            self.backend.delete(&names::key(&old.to_hex()))?;
        }
        self.key_id = Some(new);
        Ok(new)
    }

    // ---- index ----

    pub fn list_index_files(&self) -> Result<Vec<IndexId>> {
        Ok(self
            .backend
            .list(names::INDEX)?
            .iter()
            .filter_map(|i| IndexId::from_hex(names::base(&i.name)).ok())
            .collect())
    }

    /// Reads an object stored under the BLAKE3 hash of its sealed bytes, checks the
    /// hash and opens the envelope. `what` names the object in errors.
    fn read_sealed_object(
        &self,
        name: &str,
        hash: &[u8; 32],
        kind: &'static str,
        what: &str,
    ) -> Result<Vec<u8>> {
        let data = self.backend.get(name)?;
        if blake3::hash(&data).as_bytes() != hash {
            return Err(Error::damaged(
                what,
                FormatError::IdMismatch {
                    expected: hex::encode(hash),
                },
            ));
        }
        self.key
            .sealer
            .open(kind, &data)
            .map_err(|e| Error::damaged(what, e))
    }

    pub fn read_index_file(&self, id: &IndexId) -> Result<IndexFile> {
        let what = format!("index file {}", id.to_hex());
        let plain =
            self.read_sealed_object(&names::index(&id.to_hex()), &id.0, "index file", &what)?;
        IndexFile::decode(&plain).map_err(|e| Error::damaged(what, e))
    }

    pub fn write_index_file(&self, file: &IndexFile) -> Result<IndexId> {
        crate::packer::write_index_file(self.backend.as_ref(), &self.key, file)
    }

    /// Reads every index file (several in parallel) and every pending-deletion
    /// record. Files superseded by a readable one are set aside. Damaged files are
    /// returned in `errors`, not fatal. A file that vanishes between listing and
    /// reading (prune replaced it) makes the whole read start again, so the result
    /// is never a mix that misses entries.
    pub fn read_index_state(&self) -> Result<IndexState> {
        let mut attempt = 0;
        loop {
            attempt += 1;
            let ids = self.list_index_files()?;
            let results = parallel_map(&ids, 4, |id| self.read_index_file(id));
            let mut files = Vec::new();
            let mut errors = Vec::new();
            let mut vanished = Vec::new();
            for (id, r) in ids.iter().zip(results) {
                match r {
                    Ok(f) => files.push((*id, f)),
                    Err(e @ Error::Damaged { .. }) => errors.push(e),
                    Err(Error::Backend(b)) if b.is_not_found() => vanished.push(*id),
                    Err(e) => return Err(e),
                }
            }
            let superseded: HashSet<IndexId> = files
                .iter()
                .flat_map(|(_, f)| f.supersedes.iter().copied())
                .collect();
            let unexplained: Vec<_> = vanished
                .iter()
                .filter(|v| !superseded.contains(*v))
                .collect();
            if !unexplained.is_empty() {
                if attempt < 5 {
                    continue;
                }
                // Never return a silently incomplete index: callers deciding what to
                // delete must see that something is missing.
                for v in unexplained {
                    errors.push(Error::Invalid(format!(
                        "index file {} disappeared while being read and nothing replaces it",
                        v.short()
                    )));
                }
            }
            let (old, live): (Vec<_>, Vec<_>) = files
                .into_iter()
                .partition(|(id, _)| superseded.contains(id));
            let mut pending = Vec::new();
            for id in self.list_pending()? {
                match self.read_pending(&id) {
                    Ok(p) => pending.push((id, p)),
                    Err(e @ Error::Damaged { .. }) => errors.push(e),
                    Err(Error::Backend(b)) if b.is_not_found() => {}
                    Err(e) => return Err(e),
                }
            }
            return Ok(IndexState {
                live,
                superseded: old.into_iter().map(|(id, _)| id).collect(),
                pending,
                errors,
            });
        }
    }

    /// Loads the master index in its placement: in RAM from the index files, or
    /// from the SSD placement's local files (rebuilt first when the repository's
    /// index files changed). Damaged files are remembered in
    /// [`Repository::index_errors`] and skipped: their blobs count as missing.
    pub fn load_index(&mut self) -> Result<()> {
        match self.config.index_placement {
            IndexPlacement::Ram => self.load_index_in_ram(),
            IndexPlacement::Ssd => {
                let base = self.index_path()?;
                let (ssd, packs) = crate::ssd::SsdIndex::open(self, &base)?;
                self.index_errors = ssd
                    .errors
                    .iter()
                    .map(|e| Error::Invalid(e.clone()))
                    .collect();
                self.index = Arc::new(MasterIndex::from_ssd(ssd, packs));
                Ok(())
            }
        }
    }

    /// Loads the master index into RAM whatever the placement (for maintenance
    /// that walks every entry anyway).
    pub fn load_index_in_ram(&mut self) -> Result<()> {
        let state = self.read_index_state()?;
        self.set_index(&state)?;
        self.index_errors = state.errors;
        Ok(())
    }

    /// Where the SSD placement keeps its files on this machine: `CAIRN_INDEX_PATH`,
    /// else the configured path, else the user's cache directory.
    pub fn index_path(&self) -> Result<PathBuf> {
        if let Some(p) = std::env::var_os("CAIRN_INDEX_PATH").filter(|p| !p.is_empty()) {
            return Ok(PathBuf::from(p));
        }
        if let Some(p) = &self.config.index_path {
            return Ok(PathBuf::from(p));
        }
        match cairn_backend::cache::base_dir() {
            Some(base) => Ok(base.join("index")),
            None => Err(Error::Invalid(
                "no directory for the SSD index: set CAIRN_INDEX_PATH or `cairn index --path`"
                    .into(),
            )),
        }
    }

    /// Changes where the index lives (and, for the SSD placement, the directory).
    pub fn set_index_placement(
        &mut self,
        placement: IndexPlacement,
        path: Option<String>,
    ) -> Result<()> {
        self.config.index_placement = placement;
        if path.is_some() {
            self.config.index_path = path;
        }
        self.write_config()
    }

    /// Builds the master index from an [`IndexState`] already read.
    pub fn set_index(&mut self, state: &IndexState) -> Result<()> {
        let mut index = MasterIndex::new();
        let live: usize = state.live.iter().map(|(_, f)| f.blob_count()).sum();
        let pending: usize = state
            .pending
            .iter()
            .flat_map(|(_, p)| &p.packs)
            .map(|p| p.blobs.len())
            .sum();
        index.reserve(live + pending)?;
        for (_, f) in &state.live {
            index.add_file(f);
        }
        for (_, p) in &state.pending {
            for pack in &p.packs {
                index.add_pending_pack(pack.id, &pack.blobs);
            }
        }
        index.finish();
        self.index = Arc::new(index);
        Ok(())
    }

    /// Every stored pack with its size.
    pub fn list_packs(&self) -> Result<std::collections::HashMap<PackId, u64>> {
        Ok(self
            .backend
            .list(names::DATA)?
            .into_iter()
            .filter_map(|o| {
                PackId::from_hex(names::base(&o.name))
                    .ok()
                    .map(|id| (id, o.size))
            })
            .collect())
    }

    pub fn list_pending(&self) -> Result<Vec<PendingId>> {
        Ok(self
            .backend
            .list(names::PENDING)?
            .iter()
            .filter_map(|i| PendingId::from_hex(names::base(&i.name)).ok())
            .collect())
    }

    pub fn read_pending(&self, id: &PendingId) -> Result<PendingDeletion> {
        let what = format!("pending deletion {}", id.to_hex());
        let plain = self.read_sealed_object(
            &names::pending(&id.to_hex()),
            &id.0,
            "pending deletion",
            &what,
        )?;
        PendingDeletion::decode(&plain).map_err(|e| Error::damaged(what, e))
    }

    pub fn write_pending(&self, p: &PendingDeletion) -> Result<PendingId> {
        let sealed = self.key.sealer.seal(&p.encode());
        let id = PendingId::of_content(&sealed);
        self.backend.put(&names::pending(&id.to_hex()), &sealed)?;
        Ok(id)
    }

    // ---- blobs ----

    pub fn read_pack_range(&self, pack: &PackId, offset: u64, length: u64) -> Result<Vec<u8>> {
        Ok(self
            .backend
            .get_range(&names::pack(&pack.to_hex()), offset, length)?)
    }

    /// Reads, opens, decompresses and verifies one blob.
    pub fn read_blob(&self, id: &BlobId) -> Result<Vec<u8>> {
        let loc = self.index.get(id).ok_or(Error::BlobNotFound(*id))?;
        let pack = self.index.pack_of(&loc);
        let name = names::pack(&pack.to_hex());
        let (offset, length) = (loc.offset.into(), loc.length.into());
        let sealed = if loc.kind == cairn_format::pack::BlobKind::Data {
            self.backend.get_range(&name, offset, length)
        } else {
            self.backend.get_metadata_range(&name, offset, length)
        };
        let sealed = sealed.map_err(Error::from).map_err(|e| match e {
            Error::Backend(b) if b.is_not_found() => Error::PackMissing {
                pack: pack.short(),
                blob: id.short(),
            },
            e => e,
        })?;
        blob::decode(&self.key, id, &sealed, loc.raw_length, loc.compression)
    }

    pub fn load_tree(&self, id: &BlobId) -> Result<Tree> {
        let data = self.read_blob(id)?;
        Tree::decode(&data).map_err(|e| Error::damaged(format!("tree {}", id.short()), e))
    }

    pub fn load_chunk_list(&self, id: &BlobId) -> Result<ChunkList> {
        let data = self.read_blob(id)?;
        ChunkList::decode(&data)
            .map_err(|e| Error::damaged(format!("chunk list {}", id.short()), e))
    }

    // ---- snapshots ----

    pub fn list_snapshot_ids(&self) -> Result<Vec<SnapshotId>> {
        Ok(self
            .backend
            .list(names::SNAPSHOTS)?
            .iter()
            .filter_map(|i| SnapshotId::from_hex(names::base(&i.name)).ok())
            .collect())
    }

    pub fn read_snapshot(&self, id: &SnapshotId) -> Result<Snapshot> {
        let what = format!("snapshot {}", id.to_hex());
        let plain =
            self.read_sealed_object(&names::snapshot(&id.to_hex()), &id.0, "snapshot", &what)?;
        Snapshot::from_bytes(&plain).map_err(|e| Error::damaged(what, e))
    }

    /// Writing the snapshot object is the commit point of a backup. Afterwards a
    /// small index file records that the snapshot exists, so that `check` notices
    /// if the object is ever deleted without `forget`. That record is best effort:
    /// the snapshot is committed whether or not it could be written.
    pub fn write_snapshot(&self, snap: &Snapshot) -> Result<SnapshotId> {
        let sealed = self.key.sealer.seal(&snap.to_bytes());
        let id = SnapshotId::of_content(&sealed);
        self.backend.put(&names::snapshot(&id.to_hex()), &sealed)?;
        let _ = self.write_index_file(&IndexFile {
            snapshots: vec![id],
            ..Default::default()
        });
        Ok(id)
    }

    /// Removes snapshot objects on purpose: first records them as forgotten (so
    /// `check` does not take their absence for damage), then deletes them. Returns
    /// each id with the result of its deletion (a missing object counts as done).
    pub fn forget_snapshots(&self, ids: &[SnapshotId]) -> Result<Vec<(SnapshotId, Result<()>)>> {
        if ids.is_empty() {
            return Ok(Vec::new());
        }
        self.write_index_file(&IndexFile {
            forgotten: ids.to_vec(),
            ..Default::default()
        })?;
        Ok(ids
            .iter()
            .map(|id| {
                let r = match self.backend.delete(&names::snapshot(&id.to_hex())) {
                    Ok(()) => Ok(()),
                    Err(e) if e.is_not_found() => Ok(()),
                    Err(e) => Err(e.into()),
                };
                (*id, r)
            })
            .collect())
    }

    /// All snapshots sorted by time (oldest first), plus the ones that could not be read.
    pub fn snapshots(&self) -> Result<SnapshotList> {
        let mut ok = Vec::new();
        let mut bad = Vec::new();
        for id in self.list_snapshot_ids()? {
            match self.read_snapshot(&id) {
                Ok(s) => ok.push((id, s)),
                Err(Error::Backend(b)) if b.is_not_found() => {}
                Err(e @ Error::Damaged { .. }) => bad.push(e),
                Err(e) => return Err(e),
            }
        }
        ok.sort_by(|a, b| a.1.time.cmp(&b.1.time).then(a.0.cmp(&b.0)));
        Ok((ok, bad))
    }

    /// Resolves `latest` or an id prefix (at least one hex digit).
    pub fn find_snapshot(&self, spec: &str) -> Result<(SnapshotId, Snapshot)> {
        if spec == "latest" {
            let (all, _) = self.snapshots()?;
            return all
                .into_iter()
                .next_back()
                .ok_or_else(|| Error::SnapshotNotFound(spec.into()));
        }
        let lower = spec.to_ascii_lowercase();
        if lower.is_empty() || !lower.bytes().all(|b| b.is_ascii_hexdigit()) {
            return Err(Error::SnapshotNotFound(spec.into()));
        }
        let matches: Vec<SnapshotId> = self
            .list_snapshot_ids()?
            .into_iter()
            .filter(|id| id.to_hex().starts_with(&lower))
            .collect();
        match matches.len() {
            0 => Err(Error::SnapshotNotFound(spec.into())),
            1 => Ok((matches[0], self.read_snapshot(&matches[0])?)),
            _ => Err(Error::AmbiguousSnapshot {
                prefix: spec.into(),
                matches: matches
                    .iter()
                    .take(5)
                    .map(|m| m.short())
                    .collect::<Vec<_>>()
                    .join(", "),
            }),
        }
    }
}
