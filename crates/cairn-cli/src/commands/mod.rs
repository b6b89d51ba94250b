mod backup;
mod bench;
mod check;
mod config;
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
use cairn_backend::LocalBackend;
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
    }
}

pub fn repo_path(g: &Global) -> Result<PathBuf> {
    g.repo
        .clone()
        .ok_or_else(|| anyhow!("no repository given: use --repo or set CAIRN_REPO"))
}

pub fn backend(g: &Global) -> Result<Arc<LocalBackend>> {
    Ok(Arc::new(LocalBackend::new(repo_path(g)?)))
}

/// Opens the repository (asking for the password only if it is encrypted).
pub fn open(g: &Global) -> Result<Repository> {
    let path = repo_path(g)?;
    if !path.exists() {
        return Err(cairn_core::Error::RepositoryNotFound(path.display().to_string()).into());
    }
    let backend = backend(g)?;
    let repo = Repository::open(backend, || {
        crate::ui::password(g).map_err(|e| cairn_core::Error::Invalid(format!("{e:#}")))
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
