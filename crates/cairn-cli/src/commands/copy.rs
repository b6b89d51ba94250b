//! `cairn copy`: snapshots from one repository to another, sending only what the
//! destination lacks (re-chunked when the two differ in block size or key).

use crate::args::{CopyArgs, Global};
use crate::ui::{self, Progress};
use anyhow::{Context, Result, bail};
use cairn_core::copy::{CopyOptions, copy_snapshots};
use std::io::IsTerminal;
use std::time::Instant;

/// The source repository's password: CAIRN_FROM_PASSWORD, the file, or a prompt.
pub fn source_password(file: Option<&std::path::Path>) -> Result<String> {
    if let Ok(p) = std::env::var("CAIRN_FROM_PASSWORD") {
        return Ok(p);
    }
    if let Some(f) = file {
        return ui::read_password_file(f);
    }
    if std::io::stdin().is_terminal() {
        return rpassword::prompt_password("enter password for the source repository: ")
            .context("reading password");
    }
    bail!(
        "no password for the source repository: set CAIRN_FROM_PASSWORD, use --from-password-file, or run on a terminal"
    )
}

pub fn run(g: &Global, a: &CopyArgs) -> Result<i32> {
    let to = match &a.to {
        Some(t) => t.clone(),
        None => super::repo_location(g)
            .context("no destination: use --to or --repo (or set CAIRN_REPO)")?,
    };
    if to == a.from {
        bail!("the source and the destination are the same repository");
    }
    let mut src = super::open_at(g, &a.from, || {
        source_password(a.from_password_file.as_deref())
    })
    .with_context(|| format!("opening the source {}", a.from))?;
    let mut dst = super::open_at(g, &to, || ui::password(g))
        .with_context(|| format!("opening the destination {to}"))?;
    if src.config().id == dst.config().id {
        bail!("the source and the destination are the same repository");
    }
    let _src_lock = super::lock(&src, "read", false)?;
    let dst_lock = super::lock(&dst, "copy", false)?;

    let mut unreadable = 0;
    let wanted = if a.snapshots.is_empty() {
        let (list, bad) = src.snapshots()?;
        for e in &bad {
            eprintln!("warning: {e} (not copied)");
        }
        unreadable = bad.len();
        list
    } else {
        let mut v = Vec::new();
        for spec in &a.snapshots {
            v.push(src.find_snapshot(spec)?);
        }
        v.sort_by_key(|x| x.0);
        v.dedup_by(|x, y| x.0 == y.0);
        v
    };
    // Nothing to do: no index is loaded (a no-op copy reads only snapshot objects).
    let present = cairn_core::copy::copies_in(&src, &dst)?;
    let all_present = wanted
        .iter()
        .all(|(id, _)| present.contains_key(&id.to_hex()));
    if !all_present {
        src.load_index().context("loading the source's index")?;
        dst.load_index()
            .context("loading the destination's index")?;
    }
    for e in src.index_errors() {
        eprintln!("warning: source: {e} (its blobs are treated as missing)");
    }
    for e in dst.index_errors() {
        eprintln!("warning: destination: {e} (its blobs are treated as missing)");
    }
    let map_path = (!g.remote.no_cache)
        .then(|| super::cache_base(g))
        .flatten()
        .map(|b| {
            b.join("copy")
                .join(format!("{}-{}.map", src.config().id, dst.config().id))
        });
    let progress = Progress::new(ui::interactive(g));
    progress.set_total(wanted.iter().map(|(_, s)| s.summary.total_bytes).sum());
    let threads = a.threads.map(|t| t as usize).unwrap_or_else(|| {
        std::thread::available_parallelism()
            .map(|n| n.get())
            .unwrap_or(2)
    });
    let start = Instant::now();
    let opts = CopyOptions {
        threads,
        map_path,
        lock: dst_lock,
    };
    let result = copy_snapshots(&src, &dst, &wanted, present, &opts, &progress);
    progress.finish();
    let stats = result?;
    let secs = start.elapsed().as_secs_f64();
    let sent = super::traffic_of(&to).map(|t| t.uploaded()).unwrap_or(0);
    let received = super::traffic_of(&a.from)
        .map(|t| t.downloaded())
        .unwrap_or(0);
    let copied = stats
        .snapshots
        .iter()
        .filter(|s| !s.already_present)
        .count();
    for w in &stats.warnings {
        eprintln!("warning: {w}");
    }
    for (id, why) in &stats.failed {
        eprintln!("warning: snapshot {} not copied: {why}", id.short());
    }
    if g.json {
        super::print_json(&serde_json::json!({
            "from": a.from,
            "to": to,
            "snapshots": stats.snapshots.iter().map(|s| serde_json::json!({
                "source": s.source.to_hex(),
                "target": s.target.to_hex(),
                "already_present": s.already_present,
            })).collect::<Vec<_>>(),
            "snapshots_copied": copied,
            "same_chunking": stats.same_chunking,
            "logical_bytes": stats.logical_bytes,
            "files": stats.files,
            "files_rechunked": stats.files_rechunked,
            "bytes_read_from_source": stats.bytes_read,
            "blobs_added": stats.blobs_added,
            "bytes_added": stats.bytes_added,
            "bytes_sent": sent,
            "bytes_received": received,
            "duration_secs": secs,
            "failed": stats.failed.iter().map(|(id, why)| serde_json::json!({
                "source": id.to_hex(),
                "error": why,
            })).collect::<Vec<_>>(),
            "unreadable_source_snapshots": unreadable,
        }))?;
    } else if !g.quiet {
        for s in &stats.snapshots {
            if s.already_present {
                println!(
                    "snapshot {} is already in the destination as {}",
                    s.source.short(),
                    s.target.short()
                );
            } else {
                println!(
                    "copied snapshot {} as {}",
                    s.source.short(),
                    s.target.short()
                );
            }
        }
        let pct = if stats.logical_bytes > 0 {
            format!(
                " ({:.2}% of it)",
                sent as f64 * 100.0 / stats.logical_bytes as f64
            )
        } else {
            String::new()
        };
        println!(
            "{copied} snapshots copied ({} already there): {} of files, {} sent to the destination{pct}, {} read from the source, {:.2}s{}",
            stats.snapshots.len() - copied,
            ui::bytes(stats.logical_bytes),
            ui::bytes(sent),
            ui::bytes(received),
            secs,
            if stats.same_chunking {
                ", same chunking: copied blob by blob"
            } else {
                ""
            }
        );
    }
    if !stats.failed.is_empty() || unreadable > 0 {
        eprintln!(
            "cairn: {} snapshots could not be copied (listed above); the others were",
            stats.failed.len() + unreadable
        );
        return Ok(crate::EXIT_INCOMPLETE);
    }
    Ok(0)
}
