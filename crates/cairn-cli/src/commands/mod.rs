mod backup;
mod check;
mod config;
mod dump;
mod forget;
mod init;
mod key;
mod ls;
mod restore;
mod snapshots;

use crate::args::{Cli, Command, Global};
use anyhow::{Context, Result, anyhow};
use cairn_backend::LocalBackend;
use cairn_core::Repository;
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

/// Opens and loads the index, warning about index files that could not be read.
pub fn open_with_index(g: &Global) -> Result<Repository> {
    let mut repo = open(g)?;
    repo.load_index().context("loading the index")?;
    for e in repo.index_errors() {
        eprintln!("warning: {e} (its blobs are treated as missing)");
    }
    Ok(repo)
}

pub fn print_json<T: serde::Serialize>(v: &T) -> Result<()> {
    println!("{}", serde_json::to_string_pretty(v)?);
    Ok(())
}
