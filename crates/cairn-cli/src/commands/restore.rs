use crate::args::{Global, RestoreArgs};
use crate::ui::{self, Progress};
use anyhow::Result;
use cairn_core::restore::{self, RestoreOptions};
use std::time::Instant;

pub fn run(g: &Global, a: &RestoreArgs) -> Result<i32> {
    let (repo, _lock, id, snap) = super::open_snapshot(g, &a.snapshot)?;
    let opts = RestoreOptions {
        target: a.target.clone(),
        includes: a.includes.clone(),
        owners: nix::unistd::geteuid().is_root(),
    };
    let progress = Progress::new(ui::interactive(g));
    if a.includes.is_empty() {
        progress.set_total(snap.summary.total_bytes);
    }
    let start = Instant::now();
    let stats = restore::restore(&repo, &snap.tree_id()?, &opts, &progress);
    progress.finish();
    let stats = stats?;
    let secs = start.elapsed().as_secs_f64();
    if g.json {
        super::print_json(&serde_json::json!({
            "snapshot_id": id.to_hex(),
            "target": a.target,
            "files": stats.files,
            "dirs": stats.dirs,
            "other_entries": stats.other,
            "bytes": stats.bytes,
            "duration_secs": secs,
            "errors": stats.issues.iter().map(|i| serde_json::json!({"path": i.path, "error": i.message})).collect::<Vec<_>>(),
        }))?;
    } else if !g.quiet {
        println!(
            "restored snapshot {} to {}: {} files, {} dirs, {} other, {} in {:.2}s ({})",
            id.short(),
            a.target.display(),
            stats.files,
            stats.dirs,
            stats.other,
            ui::bytes(stats.bytes),
            secs,
            ui::rate(stats.bytes, secs)
        );
    }
    if !stats.issues.is_empty() {
        eprintln!(
            "cairn: error: {} entries could not be restored completely (listed above); everything else was restored",
            stats.issues.len()
        );
        return Ok(1);
    }
    Ok(0)
}
