//! From a location string (`/srv/repo`, `s3:https://host/bucket/prefix`,
//! `cairn+https://host:port/datastore`) and
//! options to the storage stack a repository lives on. Every caller — the CLI, the
//! server, tests — opens storage here, so the stack is the same for all of them.
//!
//! From the bottom: the store itself (a local directory or S3), fault injection
//! (only in builds with the `test-hooks` feature, for the test suite), rate limits and
//! traffic counters, retries with backoff, and for remote stores a local cache of
//! index, snapshot and tree data.

use crate::error::{Error, Result};
use crate::progress::Progress;
use cairn_backend::{
    Backend, CachedBackend, LocalBackend, RetryBackend, RetryPolicy, S3Backend, S3Options,
    ThrottledBackend, Traffic,
};
use std::path::PathBuf;
use std::sync::Arc;

/// Where a repository lives, parsed from its location string.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Location {
    /// A directory on this machine (the embedded default).
    Local(PathBuf),
    /// S3-compatible object storage: the location as given (`s3:...`).
    S3(String),
    /// A datastore of a cairn server (`cairn+https://host:port/datastore`).
    Server(String),
}

impl Location {
    pub fn parse(location: &str) -> Result<Location> {
        // A location that cannot be one is a usage error (exit 2), as any
        // argument that cannot be taken.
        if location.is_empty() {
            return Err(Error::BadArgument(
                "the repository location is empty".into(),
            ));
        }
        if location.starts_with("s3:") {
            cairn_backend::S3Location::parse(location).map_err(Error::BadArgument)?;
            return Ok(Location::S3(location.to_string()));
        }
        if location.starts_with("cairn+") {
            cairn_backend::ServerLocation::parse(location).map_err(Error::BadArgument)?;
            return Ok(Location::Server(location.to_string()));
        }
        if let Some(hint) = remote_look(location) {
            return Err(Error::BadArgument(format!(
                "{location} is not a repository location cairn knows: {hint}; a local \
                 directory of that name is written ./{location}"
            )));
        }
        Ok(Location::Local(PathBuf::from(location)))
    }

    pub fn is_remote(&self) -> bool {
        !matches!(self, Location::Local(_))
    }
}

/// What to write instead, when a location names another tool's kind of storage or
/// a URL: taken for a local directory, it would be one below the current directory
/// (QA: `--repo https://server:8443/main` made `./https:/server:8443/main` and the
/// backups went there, not to the server).
fn remote_look(location: &str) -> Option<&'static str> {
    let (scheme, rest) = location.split_once(':')?;
    let scheme = scheme.to_ascii_lowercase();
    match scheme.as_str() {
        "http" | "https" if rest.starts_with("//") => Some(
            "a cairn server is cairn+https://HOST:PORT/DATASTORE, S3-compatible storage \
             s3:https://HOST[:PORT]/BUCKET[/PREFIX]",
        ),
        "rest" => Some(
            "cairn does not speak restic's REST protocol; a cairn server is \
             cairn+https://HOST:PORT/DATASTORE",
        ),
        "sftp" | "b2" | "azure" | "gs" | "swift" | "rclone" => Some(
            "cairn stores repositories on local disks (a mounted NAS too), S3-compatible \
             storage (s3:https://HOST/BUCKET) and cairn servers \
             (cairn+https://HOST:PORT/DATASTORE)",
        ),
        _ => None,
    }
}

/// Whether and where remote repositories keep a local cache.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub enum CacheChoice {
    /// Under the user's cache directory ([`cairn_backend::cache::base_dir`]).
    #[default]
    Default,
    /// Under this directory.
    Dir(PathBuf),
    /// No cache: every read goes to the storage (`check` always reads this way).
    Off,
}

impl CacheChoice {
    /// The base directory for local state of remote repositories (cache, copy maps).
    pub fn base(&self) -> Option<PathBuf> {
        match self {
            CacheChoice::Default => cairn_backend::cache::base_dir(),
            CacheChoice::Dir(d) => Some(d.clone()),
            CacheChoice::Off => None,
        }
    }
}

/// How to reach storage and how fast. The CLI turns its flags into this.
#[derive(Clone, Debug, Default)]
pub struct StorageOptions {
    pub s3: S3Options,
    /// Token and certificate pinning for `cairn+https://` locations.
    pub server: cairn_backend::ServerOptions,
    /// Average upload and download rates, bytes per second.
    pub limit_upload: Option<u64>,
    pub limit_download: Option<u64>,
    pub cache: CacheChoice,
    pub retry: RetryPolicy,
    /// Store nothing but locks (`backup --dry-run`): see [`cairn_backend::DryRunBackend`].
    pub dry_run: bool,
    /// An S3 endpoint that answered and then stops answering (a restart) is
    /// retried as any transient failure, not given up within seconds: what a
    /// command run unattended wants, not a server's console.
    pub ride_s3_restarts: bool,
}

/// A repository's storage stack, ready for [`crate::Repository::open`].
#[derive(Clone)]
pub struct Storage {
    pub location: Location,
    /// The location as the user wrote it (for messages).
    pub name: String,
    pub backend: Arc<dyn Backend>,
    /// Bytes and requests that went to and came from the store.
    pub traffic: Arc<Traffic>,
}

impl std::fmt::Debug for Storage {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Storage")
            .field("name", &self.name)
            .finish_non_exhaustive()
    }
}

/// Opens the storage at `location`. Retries are announced on `progress` (as
/// notices), so a slow or flapping server is visible to whoever watches.
pub fn open_storage(location: &str, opts: &StorageOptions, progress: &Progress) -> Result<Storage> {
    let loc = Location::parse(location)?;
    let store: Arc<dyn Backend> = match &loc {
        Location::Local(dir) => Arc::new(LocalBackend::new(dir)),
        Location::S3(s) => Arc::new(S3Backend::open(s, &opts.s3)?),
        Location::Server(s) => Arc::new(cairn_backend::ServerBackend::open(s, &opts.server)?),
    };
    let store = test_hooks::faults(store, progress)?;
    crate::hooks::check_env(progress)?;
    let throttled = Arc::new(ThrottledBackend::new(
        store,
        opts.limit_upload,
        opts.limit_download,
    ));
    let traffic = throttled.traffic();
    let policy = opts.retry;
    let notices = progress.clone();
    let retry =
        RetryBackend::new(throttled, policy).with_notice(Box::new(move |e, attempt, wait| {
            // The number of attempts is known only when attempts bound the retries.
            let of = match (e.kind, policy.max_total) {
                (cairn_backend::BackendErrorKind::Unreachable, _) => String::new(),
                (_, Some(max)) => format!(", retrying for up to {}s", max.as_secs()),
                (_, None) => format!(" of {}", policy.attempts),
            };
            notices.notice(format!(
                "{e}; retrying in {:.1}s (attempt {}{of})",
                wait.as_secs_f64(),
                attempt + 1,
            ));
        }));
    // Remote storage that stops answering after it answered is restarting: a
    // `cairn serve` upgraded (its clients wait for it as for any transient failure;
    // the job slot is asked for again when it is back), or an S3 server or its load
    // balancer restarted, waited for by a command (`ride_s3_restarts`) or when
    // `--retry-for` says how long. Otherwise an S3 outage fails within seconds: a
    // server's console must not hang on one.
    let retry = if matches!(loc, Location::Server(_))
        || (matches!(loc, Location::S3(_)) && (policy.max_total.is_some() || opts.ride_s3_restarts))
    {
        retry.riding_restarts()
    } else {
        retry
    };
    let mut backend: Arc<dyn Backend> = Arc::new(retry);
    if loc.is_remote()
        && let Some(base) = opts.cache.base()
    {
        let dir = base.join(CachedBackend::dir_name(location));
        // A cache that cannot be made (a file in the way, a read-only place) leaves
        // the job working without one: said once, not per object.
        // Private, as a local repository is: it holds copies of its objects.
        match cairn_backend::private_dir(&dir, true) {
            Ok(()) => backend = Arc::new(CachedBackend::new(backend, dir)),
            Err(e) => progress.notice(format!(
                "the cache directory {} cannot be used ({e}): working without a cache",
                dir.display()
            )),
        }
    }
    // Above the cache, which would otherwise keep copies of what was never stored.
    if opts.dry_run {
        backend = Arc::new(cairn_backend::DryRunBackend::new(backend));
    }
    Ok(Storage {
        location: loc,
        name: location.to_string(),
        backend,
        traffic,
    })
}

/// Whether a repository exists at the storage (its config object is there).
pub fn repository_exists(storage: &Storage) -> Result<bool> {
    if let Location::Local(dir) = &storage.location
        && !dir.exists()
    {
        return Ok(false);
    }
    let max = cairn_format::consts::MAX_SMALL_OBJECT_SIZE as u64;
    match storage
        .backend
        .get_bounded(cairn_backend::names::CONFIG, max)
    {
        Ok(_) => Ok(true),
        Err(e) if e.is_not_found() => Ok(false),
        Err(e) if e.kind == cairn_backend::BackendErrorKind::TooLarge => Ok(true),
        Err(e) => Err(e.into()),
    }
}

/// Hooks the test suite drives through the environment. They exist only in builds
/// with the `test-hooks` feature (the CLI's integration tests enable it as a
/// dev-dependency feature); a release binary ignores the variables and says so.
mod test_hooks {
    use super::*;

    /// `CAIRN_FAULTS=<spec>`: inject storage failures ([`cairn_backend::FaultSpec`]).
    #[cfg(feature = "test-hooks")]
    pub(super) fn faults(store: Arc<dyn Backend>, _: &Progress) -> Result<Arc<dyn Backend>> {
        match std::env::var("CAIRN_FAULTS") {
            Ok(spec) if !spec.is_empty() => {
                let spec = cairn_backend::FaultSpec::parse(&spec)
                    .map_err(|e| Error::Invalid(format!("CAIRN_FAULTS: {e}")))?;
                Ok(Arc::new(cairn_backend::FaultyBackend::new(store, spec)))
            }
            _ => Ok(store),
        }
    }

    #[cfg(not(feature = "test-hooks"))]
    pub(super) fn faults(store: Arc<dyn Backend>, progress: &Progress) -> Result<Arc<dyn Backend>> {
        if std::env::var_os("CAIRN_FAULTS").is_some_and(|v| !v.is_empty()) {
            progress.notice(
                "CAIRN_FAULTS is ignored: fault injection exists only in test builds of cairn",
            );
        }
        Ok(store)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn locations() {
        assert_eq!(
            Location::parse("/srv/r").unwrap(),
            Location::Local("/srv/r".into())
        );
        assert!(
            Location::parse("s3:http://127.0.0.1:9000/bucket/p")
                .unwrap()
                .is_remote()
        );
        assert!(Location::parse("").is_err());
        assert!(Location::parse("s3:").is_err());
        // URLs and other tools' storage are not taken for local directories.
        for l in [
            "https://host:8443/main",
            "HTTP://host/x",
            "rest:https://host/main",
            "sftp:user@host:/srv/r",
        ] {
            let e = Location::parse(l).unwrap_err().to_string();
            assert!(e.contains("not a repository location"), "{l}: {e}");
        }
        assert!(matches!(
            Location::parse("./https://host/x").unwrap(),
            Location::Local(_)
        ));
        assert!(matches!(
            Location::parse("http:dir").unwrap(),
            Location::Local(_)
        ));
    }
}
