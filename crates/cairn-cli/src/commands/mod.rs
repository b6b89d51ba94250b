mod backup;
mod bench;
mod check;
mod config;
mod copy;
mod dump;
mod estimate;
mod forget;
mod index;
mod init;
mod key;
mod ls;
mod prune;
mod repair;
mod restore;
mod snapshots;
mod stats;
mod unlock;

use crate::args::{Cli, Command, Global};
use anyhow::{Context, Result, anyhow};
use cairn_backend::{
    Backend, CachedBackend, FaultSpec, FaultyBackend, LocalBackend, RetryBackend, RetryPolicy,
    S3Backend, S3Options, ThrottledBackend, Traffic,
};
use cairn_core::Repository;
use cairn_core::lock::RepoLock;
use cairn_format::snapshot::Snapshot;
use std::path::PathBuf;
use std::sync::Arc;

pub fn run(cli: Cli) -> Result<i32> {
    let g = &cli.global;
    match cli.command {
        Command::Init(a) => init::run(g, &a),
        Command::Backup(a) => backup::run(g, a),
        Command::Snapshots => snapshots::run(g),
        Command::Ls(a) => ls::run(g, &a),
        Command::Dump(a) => dump::run(g, &a),
        Command::Restore(a) => restore::run(g, &a),
        Command::Key(k) => key::run(g, k),
        Command::Config(a) => config::run(g, &a),
        Command::Check(a) => check::run(g, &a),
        Command::Prune(a) => prune::run(g, &a),
        Command::Unlock(a) => unlock::run(g, &a),
        Command::Repair(c) => repair::run(g, c),
        Command::Stats(a) => stats::run(g, &a),
        Command::Bench(a) => bench::run(g, &a),
        Command::Estimate(a) => estimate::run(g, &a),
        Command::Index(a) => index::run(g, &a),
        Command::Forget(a) => forget::run(g, &a),
        Command::Copy(a) => copy::run(g, &a),
    }
}

/// The repository location as given (`--repo` / `CAIRN_REPO`).
pub fn repo_location(g: &Global) -> Result<String> {
    g.repo
        .clone()
        .filter(|r| !r.is_empty())
        .ok_or_else(|| anyhow!("no repository given: use --repo or set CAIRN_REPO"))
}

/// A local directory, or `None` for a remote location (`s3:...`).
pub fn local_dir(location: &str) -> Option<PathBuf> {
    (!location.starts_with("s3:")).then(|| PathBuf::from(location))
}

/// Traffic counters of every repository opened, reported at exit when
/// `CAIRN_TRAFFIC_REPORT` is set (a diagnostic: proves what the cache saves).
static TRAFFIC: std::sync::Mutex<Vec<(String, Arc<Traffic>)>> = std::sync::Mutex::new(Vec::new());

/// The traffic counters of the repository opened at `location`.
pub fn traffic_of(location: &str) -> Option<Arc<Traffic>> {
    TRAFFIC
        .lock()
        .unwrap_or_else(|p| p.into_inner())
        .iter()
        .rev()
        .find(|(l, _)| l == location)
        .map(|(_, t)| t.clone())
}

pub fn report_traffic() {
    if std::env::var_os("CAIRN_TRAFFIC_REPORT").is_none() {
        return;
    }
    for (loc, t) in TRAFFIC.lock().unwrap_or_else(|p| p.into_inner()).iter() {
        eprintln!(
            "traffic: {loc}: uploaded {} bytes, downloaded {} bytes, {} requests",
            t.uploaded(),
            t.downloaded(),
            t.requests()
        );
    }
}

/// The storage stack for a location. From the bottom: the store itself (local
/// directory or S3), fault injection when `CAIRN_FAULTS` is set (tests), rate limits
/// and traffic counters, retries with backoff, and for remote stores the local cache
/// of index, snapshot and tree data.
pub fn backend_at(g: &Global, location: &str) -> Result<(Arc<dyn Backend>, Arc<Traffic>)> {
    let r = &g.remote;
    let store: Arc<dyn Backend> = match local_dir(location) {
        Some(dir) => Arc::new(LocalBackend::new(dir)),
        None => {
            let opts = S3Options {
                region: r.s3_region.clone(),
                virtual_host: r.s3_virtual_host,
                profile: r.s3_profile.clone(),
                ca_cert: r.cacert.clone(),
                insecure_tls: r.insecure_tls,
            };
            Arc::new(S3Backend::open(location, &opts)?)
        }
    };
    let store: Arc<dyn Backend> = match std::env::var("CAIRN_FAULTS") {
        Ok(spec) if !spec.is_empty() => {
            let spec = FaultSpec::parse(&spec).map_err(|e| anyhow!("CAIRN_FAULTS: {e}"))?;
            Arc::new(FaultyBackend::new(store, spec))
        }
        _ => store,
    };
    let rate = |v: &Option<String>, what: &str| -> Result<Option<u64>> {
        v.as_deref()
            .map(|s| parse_size(s).with_context(|| format!("--limit-{what}")))
            .transpose()
    };
    let throttled = Arc::new(ThrottledBackend::new(
        store,
        rate(&r.limit_upload, "upload")?,
        rate(&r.limit_download, "download")?,
    ));
    let traffic = throttled.traffic();
    TRAFFIC
        .lock()
        .unwrap_or_else(|p| p.into_inner())
        .push((location.to_string(), traffic.clone()));
    let policy = RetryPolicy::default();
    let mut retry = RetryBackend::new(throttled, policy);
    if !g.quiet {
        retry = retry.with_notice(Box::new(move |e, attempt, wait| {
            eprintln!(
                "warning: {e}; retrying in {:.1}s (attempt {} of {})",
                wait.as_secs_f64(),
                attempt + 1,
                policy.attempts
            );
        }));
    }
    let mut backend: Arc<dyn Backend> = Arc::new(retry);
    if local_dir(location).is_none()
        && !r.no_cache
        && let Some(base) = cache_base(g)
    {
        let dir = base.join(CachedBackend::dir_name(location));
        backend = Arc::new(CachedBackend::new(backend, dir));
    }
    Ok((backend, traffic))
}

/// Where cairn keeps local state for remote repositories and copies.
pub fn cache_base(g: &Global) -> Option<PathBuf> {
    if let Some(d) = &g.remote.cache_dir {
        return Some(d.clone());
    }
    cairn_backend::cache::base_dir()
}

pub fn backend(g: &Global) -> Result<Arc<dyn Backend>> {
    Ok(backend_at(g, &repo_location(g)?)?.0)
}

/// Whether a repository exists at the location (its config object is there).
pub fn repo_exists(g: &Global, location: &str) -> Result<bool> {
    if let Some(dir) = local_dir(location) {
        return Ok(dir.join("config").exists());
    }
    match backend_at(g, location)?.0.get("config") {
        Ok(_) => Ok(true),
        Err(e) if e.is_not_found() => Ok(false),
        Err(e) => Err(e.into()),
    }
}

/// Opens the repository (asking for the password only if it is encrypted).
pub fn open(g: &Global) -> Result<Repository> {
    open_at(g, &repo_location(g)?, || crate::ui::password(g))
}

/// Opens the repository at `location`; `password` is asked only when needed.
pub fn open_at(
    g: &Global,
    location: &str,
    password: impl FnOnce() -> Result<String>,
) -> Result<Repository> {
    if let Some(dir) = local_dir(location)
        && !dir.exists()
    {
        return Err(cairn_core::Error::RepositoryNotFound(dir.display().to_string()).into());
    }
    let (backend, _) = backend_at(g, location)?;
    let repo = Repository::open(backend, || {
        password().map_err(|e| cairn_core::Error::Invalid(format!("{e:#}")))
    })?;
    Ok(repo)
}

/// Takes a lock. It must be taken before the index is loaded: prune waits only for
/// operations whose lock it can see. A read lock that cannot be written (read-only
/// mount, full disk: the day a restore matters most) is skipped with a warning; the
/// only risk then is that a concurrent prune makes the read fail, never wrong data.
pub fn lock(repo: &Repository, operation: &str, exclusive: bool) -> Result<Option<Arc<RepoLock>>> {
    match RepoLock::acquire(repo, operation, exclusive) {
        Ok(l) => Ok(Some(Arc::new(l))),
        Err(cairn_core::Error::Backend(b)) if !exclusive && operation == "read" => {
            eprintln!("warning: cannot write a lock ({b}); going on without one");
            Ok(None)
        }
        Err(e) => Err(anyhow::Error::new(e).context("locking the repository")),
    }
}

/// Opens, takes a shared read lock, resolves the snapshot and then loads the index,
/// warning about index files that could not be read. The snapshot is read first: a
/// snapshot listed before the index is read has all its blobs in that index
/// (docs/FORMAT.md, "Write ordering invariants"). Keep the lock alive while reading.
pub fn open_snapshot(
    g: &Global,
    spec: &str,
) -> Result<(
    Repository,
    Option<Arc<RepoLock>>,
    cairn_format::SnapshotId,
    Snapshot,
)> {
    let mut repo = open(g)?;
    let lock = lock(&repo, "read", false)?;
    let (id, snap) = repo.find_snapshot(spec)?;
    repo.load_index().context("loading the index")?;
    for e in repo.index_errors() {
        eprintln!("warning: {e} (its blobs are treated as missing)");
    }
    Ok((repo, lock, id, snap))
}

pub fn print_json<T: serde::Serialize>(v: &T) -> Result<()> {
    println!("{}", serde_json::to_string_pretty(v)?);
    Ok(())
}

/// Parses a size such as `500M`, `2G`, `1.5T` or `4096` (bytes; binary units).
pub fn parse_size(s: &str) -> Result<u64> {
    let t = s.trim();
    let (num, mult) = match t.char_indices().last() {
        Some((i, c)) if c.is_ascii_alphabetic() => {
            let m: u64 = match c.to_ascii_uppercase() {
                'B' => 1,
                'K' => 1 << 10,
                'M' => 1 << 20,
                'G' => 1 << 30,
                'T' => 1 << 40,
                _ => anyhow::bail!("invalid size {s:?}: use a number with K, M, G or T"),
            };
            (&t[..i], m)
        }
        _ => (t, 1),
    };
    let v: f64 = num
        .trim()
        .parse()
        .map_err(|_| anyhow!("invalid size {s:?}: use a number with K, M, G or T"))?;
    if !v.is_finite() || v < 0.0 {
        anyhow::bail!("invalid size {s:?}");
    }
    Ok((v * mult as f64) as u64)
}
