//! `cairn index`: where the index lives, what it costs, and moving it.

use crate::args::{Global, IndexArgs};
use crate::ui;
use anyhow::{Context, Result};
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
    let mut repo = super::open(g)?;
    let old_dir = match repo.config().index_placement {
        IndexPlacement::Ssd => repo
            .index_path()
            .ok()
            .map(|p| cairn_core::index::ssd::SsdIndex::dir_for(&p, &repo.config().id)),
        IndexPlacement::Ram => None,
    };
    if a.placement.is_some() || a.path.is_some() {
        let placement = match &a.placement {
            Some(p) => p.parse::<IndexPlacement>().map_err(anyhow::Error::msg)?,
            None => repo.config().index_placement,
        };
        let path = a.path.as_deref().map(absolute_path).transpose()?;
        repo.set_index_placement(placement, path)?;
    }
    let _lock = super::lock(&repo, "read", false)?;
    let started = std::time::Instant::now();
    repo.load_index().context("loading the index")?;
    let seconds = started.elapsed().as_secs_f64();
    for e in repo.index_errors() {
        eprintln!("warning: {e} (its blobs are treated as missing)");
    }
    let c = repo.config();
    let index = repo.index();
    let (path, disk) = match index.ssd() {
        Some(s) => (
            Some(s.path().display().to_string()),
            cairn_core::index::ssd::disk_bytes(s.path()),
        ),
        None => (None, 0),
    };
    // A moved SSD index leaves its old files behind: they are only a cache.
    if let (Some(old), Some(new)) = (&old_dir, index.ssd().map(|s| s.path().to_path_buf())) {
        if !new.starts_with(old) && old.exists() {
            let _ = std::fs::remove_dir_all(old);
        }
    } else if let (Some(old), None) = (&old_dir, index.ssd()) {
        let _ = std::fs::remove_dir_all(old);
    }
    let blobs = index.len();
    let ram = index.ram_bytes();
    if g.json {
        super::print_json(&serde_json::json!({
            "placement": c.index_placement.name(),
            "path": path,
            "blobs": blobs,
            "ram_bytes": ram,
            "ram_bytes_per_blob": if blobs > 0 { ram as f64 / blobs as f64 } else { 0.0 },
            "disk_bytes": disk,
            "load_seconds": seconds,
        }))?;
    } else if !g.quiet {
        println!("placement   {}", c.index_placement.name());
        if let Some(p) = &path {
            println!("path        {p}");
            println!("local disk  {}", ui::bytes(disk));
        }
        println!("blobs       {blobs}");
        println!(
            "RAM         {}{}",
            ui::bytes(ram as u64),
            if blobs > 0 {
                format!(" ({:.2} bytes per blob)", ram as f64 / blobs as f64)
            } else {
                String::new()
            }
        );
        println!("loaded in   {seconds:.2} s");
    }
    Ok(0)
}
