//! `cairn index`: where the index lives, what it costs, and moving it.

use crate::args::{Global, IndexArgs};
use crate::ui;
use anyhow::{Context, Result};
use cairn_core::repo::info::IndexInfo;
use cairn_core::session::{IndexLoad, Read, Session};
use cairn_format::config::IndexPlacement;
use std::path::Path;

/// An absolute form of a directory given on the command line (the config outlives
/// the working directory).
pub fn absolute_path(p: &Path) -> Result<String> {
    let abs = std::path::absolute(p).with_context(|| format!("{}", p.display()))?;
    abs.to_str()
        .map(str::to_string)
        .with_context(|| format!("{} is not valid UTF-8", abs.display()))
}

pub fn run(g: &Global, a: &IndexArgs) -> Result<i32> {
    let p = super::progress(g);
    let mut repo = super::open(g, &p.progress)?;
    let old_dir = match repo.config().index_placement {
        IndexPlacement::Ssd => repo
            .index_path()
            .ok()
            .map(|p| cairn_core::index::ssd::SsdIndex::dir_for(&p, &repo.config().id)),
        IndexPlacement::Ram => None,
    };
    let moving = a.placement.is_some() || a.path.is_some();
    if moving {
        let placement = match &a.placement {
            Some(p) => p.parse::<IndexPlacement>().map_err(super::bad_argument)?,
            None => repo.config().index_placement,
        };
        // The path stored must be the one the build below checks: with the
        // variable set, the build would use it instead, and the stored path would
        // be found wrong only on a machine without it.
        if a.path.is_some()
            && placement == IndexPlacement::Ssd
            && std::env::var_os("CAIRN_INDEX_PATH").is_some_and(|v| !v.is_empty())
        {
            anyhow::bail!(
                "CAIRN_INDEX_PATH is set and would be used instead of --index-path: unset it \
                 to record (and check) the path the repository keeps"
            );
        }
        // A path for a RAM index would change nothing and say nothing.
        if a.path.is_some() && placement == IndexPlacement::Ram {
            anyhow::bail!(
                "--index-path is where the index lives on local disk: {}; give \
                 --index-placement ssd with it to move the index there",
                if a.placement.is_some() {
                    "a RAM index has no directory"
                } else {
                    "this repository keeps it in RAM"
                }
            );
        }
        let path = a.path.as_deref().map(absolute_path).transpose()?;
        repo.try_index_placement(placement, path);
    }
    // A directory the build makes and then fails in is removed again, so a failed
    // move leaves nothing behind (one that was there already is only a cache).
    let new_dir = match repo.config().index_placement {
        IndexPlacement::Ssd if moving => repo
            .index_path()
            .ok()
            .map(|p| cairn_core::index::ssd::SsdIndex::dir_for(&p, &repo.config().id))
            .filter(|d| !d.exists()),
        _ => None,
    };
    let mut session: Session<Read> =
        Session::open(repo, "index", IndexLoad::Deferred, &p.progress)?;
    let started = std::time::Instant::now();
    let loaded = session.load_index_in_place();
    if loaded.is_err()
        && let Some(d) = &new_dir
    {
        let _ = std::fs::remove_dir_all(d);
    }
    loaded.context(if moving {
        "building the index in its new place (the repository's config was not changed: \
         the index stays where it was)"
    } else {
        "loading the index"
    })?;
    if moving {
        session
            .repo()
            .save_index_placement()
            .context("recording the index's new place")?;
    }
    let info = IndexInfo::of(session.repo(), started.elapsed().as_secs_f64());
    // A moved SSD index leaves its old files behind: they are only a cache.
    let index = session.repo().index();
    if let (Some(old), Some(new)) = (&old_dir, index.ssd().map(|s| s.path().to_path_buf())) {
        if !new.starts_with(old) && old.exists() {
            let _ = std::fs::remove_dir_all(old);
        }
    } else if let (Some(old), None) = (&old_dir, index.ssd()) {
        let _ = std::fs::remove_dir_all(old);
    }
    if g.json {
        super::print_json(&info)?;
    } else if !g.quiet {
        println!("placement   {}", info.placement);
        if let Some(p) = &info.path {
            println!("path        {p}");
            println!("local disk  {}", ui::bytes(info.disk_bytes));
        }
        println!("blobs       {}", info.blobs);
        println!(
            "RAM         {}{}",
            ui::bytes(info.ram_bytes as u64),
            if info.blobs > 0 {
                format!(" ({:.2} bytes per blob)", info.ram_bytes_per_blob)
            } else {
                String::new()
            }
        );
        println!("loaded in   {:.2} s", info.load_seconds);
    }
    Ok(0)
}
