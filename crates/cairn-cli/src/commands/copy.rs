//! `cairn copy`: snapshots from one repository to another, sending only what the
//! destination lacks (re-chunked when the two differ in block size or key).

use crate::args::{CopyArgs, Global};
use crate::ui;
use anyhow::{Context, Result, bail};
use cairn_core::copy::{self, CopyOptions};
use cairn_core::session::{Backup, IndexLoad, Read, Session};

/// The source repository's password: `--from-password-file`, `CAIRN_FROM_PASSWORD`,
/// `CAIRN_FROM_PASSWORD_FILE`, or a prompt.
pub fn source_password(file: Option<&std::path::Path>, command: Option<&str>) -> Result<String> {
    ui::Source {
        flag: file,
        command,
        env_command: Some("CAIRN_FROM_PASSWORD_COMMAND"),
        env: "CAIRN_FROM_PASSWORD",
        env_file: "CAIRN_FROM_PASSWORD_FILE",
        what: "the source repository",
        flags: "--from-password-file or --from-password-command",
    }
    .password()
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
    let mut p = super::progress(g);
    // The source's own server credentials when given (a copy from one cairn
    // server to another), else the destination's.
    let mut storage = super::storage_options(g)?;
    if let Some(t) = super::token_from(a.from_token_file.as_deref(), "CAIRN_FROM_TOKEN")
        .context("--from-token-file")?
    {
        storage.server.token = Some(t);
    }
    if let Some(c) = &a.from_cacert {
        storage.server.ca_cert = Some(c.clone());
        storage.s3.ca_cert = Some(c.clone());
        // The source is trusted by its CA: the destination's pin is not its.
        storage.server.fingerprint = None;
    }
    if let Some(f) =
        super::fingerprint_flag(&a.from_server_fingerprint, "--from-server-fingerprint")?
    {
        storage.server.fingerprint = Some(f);
    }
    let mut src = super::open_with(
        g,
        &a.from,
        &storage,
        || {
            source_password(
                a.from_password_file.as_deref(),
                a.from_password_command.as_deref(),
            )
        },
        &p.progress,
    )
    .with_context(|| format!("opening the source {}", a.from))?;
    let mut dst = super::open_at(g, &to, || ui::password(g), &p.progress)
        .with_context(|| format!("opening the destination {to}"))?;
    // The same id is not the same repository: a mirror made with `cp -a` or
    // rsync keeps the id, and copy then brings it what it lacks. Only the same
    // directory under two spellings is refused (copying into itself would find
    // every snapshot there and do nothing, but the user surely meant otherwise).
    if src.config().id == dst.config().id && same_local_dir(&a.from, &to) {
        bail!("the source and the destination are the same repository");
    }
    // One limit for the job (the flag, else the destination's default, else the
    // source's): both
    // indexes are held at once, so the destination plans its buffers within what
    // the source's index leaves.
    let limit = dst.memory_limit().or(src.memory_limit());
    src.set_memory_limit(limit);
    // (What the limit costs is said with it; other failures, a lock that cannot
    // be written, say themselves.)
    let mut src: Session<Read> = Session::open(src, "copy", IndexLoad::Deferred, &p.progress)
        .map_err(|e| match e {
            e @ cairn_core::Error::MemoryLimit(_) => {
                anyhow::Error::from(e).context("the source's index under the memory limit")
            }
            e => e.into(),
        })?;
    let src_index = src
        .repo()
        .memory_plan_in_use()
        .map_or(0, |plan| plan.index_bytes);
    if let Some(l) = limit {
        dst.set_memory_limit(Some(l.saturating_sub(src_index).max(1)));
    }
    let mut dst: Session<Backup> = Session::open(dst, "copy", IndexLoad::Deferred, &p.progress)
        .map_err(|e| match e {
            e @ cairn_core::Error::MemoryLimit(_) => anyhow::Error::from(e).context(format!(
                "the destination's index beside the source's (about {} of the limit)",
                ui::bytes(src_index)
            )),
            e => e.into(),
        })?;
    // The global --threads (files re-chunked in parallel), else the cores.
    let threads = g
        .threads
        .unwrap_or_else(|| {
            std::thread::available_parallelism()
                .map(|n| n.get())
                .unwrap_or(2)
        })
        .clamp(1, 256);
    let opts = CopyOptions {
        threads,
        map_dir: if g.remote.no_cache {
            None
        } else {
            super::storage_options(g)?
                .cache
                .base()
                .map(|b| b.join("copy"))
        },
        filter: a.filter.engine(),
        pack_size: super::pack_size_flag(&a.pack_size)?,
    };
    p.start();
    let r = copy::copy(&mut src, &mut dst, &a.snapshots, &opts);
    p.finish();
    let r = r.map_err(|e| match e {
        cairn_core::Error::Cancelled => anyhow::Error::from(e).context(
            "copy cancelled: the snapshots reported copied are complete; what was stored of \
             the others is kept and not sent again by the next run (but the last few packs)",
        ),
        e if e.is_no_space() => anyhow::anyhow!(
            "{e}: the snapshots copied so far are complete and the others were not saved; \
             free space on the destination, then run the copy again (what it stored is reused)"
        ),
        e => e.into(),
    })?;
    // Warnings as the run's other events (JSON lines with --json).
    let warn = |m: String| p.progress.warning_msg(m);
    for e in &r.unreadable_source_snapshots {
        warn(format!("{e} (not copied)"));
    }
    // Nothing selected: a filter that matches nothing (a host name mistyped)
    // looks like a copy with nothing left to do, so it is said.
    if r.snapshots.is_empty() && r.failed.is_empty() && r.unreadable_source_snapshots.is_empty() {
        warn(format!(
            "no snapshot of the source matches{}",
            if a.filter.engine().is_empty() {
                ": the source has none"
            } else {
                " the filters (--host, --tag, --path)"
            }
        ));
    }
    for w in &r.warnings {
        warn(w.clone());
    }
    for f in &r.failed {
        warn(format!(
            "snapshot {} not copied: {}",
            f.source.short(),
            f.error
        ));
    }
    // What to do about it (QA: the warning alone, and a damaged source seemed
    // impossible to copy from).
    if !r.failed.is_empty() {
        crate::ui::note(format!(
            "the source lacks data {}: `cairn check --read-data` on the source names the files; \
             `cairn repair snapshots` there takes them out (restore them first to keep what \
             can still be read), and a copy after that copies the rest",
            if r.failed.len() == 1 {
                "this snapshot needs"
            } else {
                "these snapshots need"
            }
        ));
    }
    if g.json {
        super::print_json_report(&r)?;
    } else if !g.quiet {
        // The copied ones were printed as each was committed (the progress sink).
        for s in r.snapshots.iter().filter(|s| s.already_present) {
            println!(
                "snapshot {} is already in the destination as {}",
                s.source.short(),
                s.target.short()
            );
        }
        // Of the files' size: meaningless when little was copied (a lock and an
        // index file weigh more than a tiny snapshot).
        let pct = if r.logical_bytes > 0 && r.bytes_sent <= r.logical_bytes {
            format!(
                " ({:.2}% of it)",
                r.bytes_sent as f64 * 100.0 / r.logical_bytes as f64
            )
        } else {
            String::new()
        };
        println!(
            "{} copied ({} already there): {} of files, {} sent to the destination{pct}, {} read from the source{}, {:.2}s{}",
            ui::count(r.snapshots_copied as u64, "snapshot"),
            r.snapshots.len() - r.snapshots_copied,
            ui::bytes(r.logical_bytes),
            ui::bytes(r.bytes_sent),
            ui::bytes(r.bytes_received),
            if r.bytes_read_from_source > 0 {
                format!(" ({} once opened)", ui::bytes(r.bytes_read_from_source))
            } else {
                String::new()
            },
            r.duration_secs,
            if r.same_chunking {
                ", same chunking: copied blob by blob"
            } else {
                ""
            }
        );
    }
    let unreadable = r.unreadable_source_snapshots.len();
    if !r.failed.is_empty() || unreadable > 0 {
        let others = r.snapshots.len();
        crate::ui::warn(format!(
            "{} could not be copied (listed above){}",
            ui::count((r.failed.len() + unreadable) as u64, "snapshot"),
            if others > 0 { "; the others were" } else { "" }
        ));
        // Nothing copied is an error, not a copy done in part.
        return Ok(if others > 0 {
            crate::EXIT_INCOMPLETE
        } else {
            1
        });
    }
    Ok(0)
}

/// Whether two locations name one local directory (through a symlink, `..` or a
/// trailing slash). Remote locations are never judged the same here.
fn same_local_dir(a: &str, b: &str) -> bool {
    let local = |l: &str| match cairn_core::repo::storage::Location::parse(l) {
        Ok(cairn_core::repo::storage::Location::Local(p)) => std::fs::canonicalize(p).ok(),
        _ => None,
    };
    matches!((local(a), local(b)), (Some(x), Some(y)) if x == y)
}
