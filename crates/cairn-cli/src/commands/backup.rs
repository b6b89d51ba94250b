use crate::args::{BackupArgs, Global};
use crate::ui::{self, Progress};
use anyhow::{Context, Result};
use cairn_core::backup::{self, BackupOptions};
use cairn_format::SnapshotId;
use std::path::PathBuf;

fn read_exclude_files(files: &[PathBuf]) -> Result<Vec<String>> {
    let mut out = Vec::new();
    for f in files {
        let text = std::fs::read_to_string(f)
            .with_context(|| format!("reading exclude file {}", f.display()))?;
        out.extend(
            text.lines()
                .map(str::trim)
                .filter(|l| !l.is_empty() && !l.starts_with('#'))
                .map(String::from),
        );
    }
    Ok(out)
}

/// Sums file sizes in the background so the progress display can show an ETA.
fn scan_total(paths: Vec<PathBuf>, progress: &Progress) {
    let mut total = 0u64;
    let mut stack = paths;
    while let Some(p) = stack.pop() {
        let Ok(m) = std::fs::symlink_metadata(&p) else {
            continue;
        };
        if m.is_dir() {
            if let Ok(rd) = std::fs::read_dir(&p) {
                stack.extend(rd.flatten().map(|e| e.path()));
            }
        } else if m.is_file() {
            total += m.len();
            progress.set_total(total);
        }
    }
}

pub fn run(g: &Global, a: BackupArgs) -> Result<i32> {
    let location = super::repo_location(g)?;
    let mut repo = if a.init && !super::repo_exists(g, &location)? {
        let r = super::init::init_repo(g, &cairn_core::InitOptions::default())?;
        if !g.quiet && !g.json {
            eprintln!("created repository at {location}");
        }
        r
    } else {
        super::open(g)?
    };
    let lock = super::lock(&repo, "backup", false)?;
    // Wait for a job slot before loading the index: the jobs ahead are then
    // finished, and this one deduplicates against what they stored.
    if let Some(l) = &lock {
        let max = repo.config().max_concurrent_jobs;
        cairn_core::lock::wait_for_job_slot(&repo, l, max, |ahead| {
            eprintln!(
                "waiting: {} backup jobs are running or queued ahead (max-concurrent-jobs is {max}; change it with `cairn config --max-concurrent-jobs N`):",
                ahead.len()
            );
            for j in ahead.iter().take(max as usize + 2) {
                eprintln!("  {}", j.describe());
            }
        })
        .context("waiting for a job slot")?;
    }
    repo.load_index().context("loading the index")?;
    for e in repo.index_errors() {
        eprintln!("warning: {e} (its data will be stored again)");
    }
    let mut excludes = a.excludes.clone();
    excludes.extend(read_exclude_files(&a.exclude_files)?);
    let parent = match &a.parent {
        Some(p) => Some(repo.find_snapshot(p)?.0),
        None => None,
    };
    let stdin: Option<(String, Box<dyn std::io::Read + Send>)> = a.stdin.then(|| {
        (
            a.stdin_name.clone(),
            Box::new(std::io::stdin()) as Box<dyn std::io::Read + Send>,
        )
    });
    if a.stdin && !a.paths.is_empty() {
        anyhow::bail!("--stdin cannot be combined with paths");
    }
    let opts = BackupOptions {
        paths: a.paths.clone(),
        stdin,
        tags: a.tags.clone(),
        host: a.host.clone(),
        excludes,
        one_file_system: a.one_file_system,
        parent,
        force: a.force,
        read_concurrency: a.read_concurrency.map(|n| n as usize),
        lock,
    };
    let progress = Progress::new(ui::interactive(g));
    let result = std::thread::scope(|s| {
        if ui::interactive(g) && !a.stdin {
            let paths = a.paths.clone();
            let p = &progress;
            s.spawn(move || scan_total(paths, p));
        }
        backup::backup(&repo, opts, &progress)
    });
    progress.finish();
    let r = result.map_err(|e| {
        if e.is_no_space() {
            anyhow::anyhow!("{e}: the backup was not saved; earlier snapshots are intact (free space, then run the backup again)")
        } else {
            anyhow::Error::from(e).context("backup failed; no snapshot was saved")
        }
    })?;
    if let Some((n, why)) = repo.index().ssd().and_then(|s| s.failures()) {
        eprintln!(
            "warning: {n} lookups in the SSD index failed ({why}); those chunks were stored \
             again, so the snapshot is complete, but they are not deduplicated until prune"
        );
    }
    let s = &r.snapshot.summary;
    if g.json {
        super::print_json(&serde_json::json!({
            "snapshot_id": r.snapshot_id.to_hex(),
            "parent": r.parent.map(|p: SnapshotId| p.to_hex()),
            "time": r.snapshot.time,
            "paths": r.snapshot.paths,
            "files_new": s.files_new,
            "files_changed": s.files_changed,
            "files_unchanged": s.files_unchanged,
            "dirs": s.dirs,
            "other_entries": s.other_entries,
            "entries_skipped": s.entries_skipped,
            "skipped": r.skipped.iter().map(|k| serde_json::json!({"path": k.path, "error": k.message})).collect::<Vec<_>>(),
            "bytes_read": s.bytes_read,
            "total_bytes": s.total_bytes,
            "blobs_added": s.blobs_added,
            "data_added": s.data_added,
            "data_added_packed": s.data_added_packed,
            "packs_written": r.packs_written,
            "duration_secs": s.duration_secs,
        }))?;
    } else if !g.quiet {
        let d = s.duration_secs;
        println!(
            "files:     {} new, {} changed, {} unchanged",
            s.files_new, s.files_changed, s.files_unchanged
        );
        println!("dirs:      {}, other entries: {}", s.dirs, s.other_entries);
        println!(
            "read:      {} of {} in the snapshot",
            ui::bytes(s.bytes_read),
            ui::bytes(s.total_bytes)
        );
        println!(
            "added:     {} to the repository ({} before compression)",
            ui::bytes(s.data_added_packed),
            ui::bytes(s.data_added)
        );
        println!(
            "duration:  {:.2}s, {} read, {} processed",
            d,
            ui::rate(s.bytes_read, d),
            ui::rate(s.total_bytes, d)
        );
        if s.entries_skipped > 0 {
            println!(
                "skipped:   {} entries could not be read (see warnings above)",
                s.entries_skipped
            );
        }
        println!("snapshot {} saved", r.snapshot_id.short());
    }
    Ok(if s.entries_skipped > 0 {
        crate::EXIT_INCOMPLETE
    } else {
        0
    })
}
