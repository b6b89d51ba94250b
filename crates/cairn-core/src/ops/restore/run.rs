//! Restore through a session: the report `cairn restore` prints.

use super::RestoreOptions;
use crate::error::Result;
use crate::progress::Phase;
use crate::session::{Access, Session};
use cairn_format::SnapshotId;
use cairn_format::snapshot::Snapshot;
use std::path::PathBuf;

/// An entry that could not be restored in full.
#[derive(Clone, Debug, serde::Serialize)]
pub struct Issue {
    pub path: String,
    pub error: String,
    /// The repository lacks what the entry needs (a blob damaged or gone, its
    /// pack gone or short), rather than the target or the storage failing.
    pub lost_data: bool,
}

/// What a restore did.
#[derive(Clone, Debug, serde::Serialize)]
pub struct RestoreReport {
    pub snapshot_id: SnapshotId,
    /// The snapshot's directory restored as the target (`SNAP:PATH`).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub subfolder: Option<String>,
    #[serde(serialize_with = "crate::report::lossy_path")]
    pub target: PathBuf,
    pub files: u64,
    pub dirs: u64,
    pub other_entries: u64,
    pub bytes: u64,
    /// Sockets in the snapshot, skipped (they are made by the program that listens).
    pub sockets_skipped: u64,
    /// Nothing was written: the figures say what the restore would do.
    pub dry_run: bool,
    /// How entries already in the target were treated.
    pub overwrite: super::Overwrite,
    /// Entries already in the target left as they were, and the bytes of those files.
    pub kept: u64,
    pub kept_bytes: u64,
    /// Files that held the snapshot's content already: only their metadata was set.
    pub metadata_only: u64,
    /// Entries removed because the snapshot does not have them (`--delete`).
    pub deleted: u64,
    /// With `--dry-run`: the paths `--delete` would remove (a directory stands for
    /// everything in it).
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub would_delete: Vec<String>,
    /// Mount points `--delete` left alone with what they hold: it removes nothing on
    /// another file system (or bind mount) than the target's.
    pub mounts_left: u64,
    /// `--delete` left the repository being restored from in place: it was in the
    /// target, and no snapshot has it (backups leave it out).
    #[serde(skip_serializing_if = "std::ops::Not::not")]
    pub repository_left: bool,
    /// Files being written when the restore was cancelled: left with the restore's
    /// time and mode 0600 for the next restore to finish (not listed in `errors`).
    pub cancelled_files: u64,
    /// An earlier restore into the target that did not finish, by when it started
    /// (RFC 3339): what changed there since is rewritten unless it matches the
    /// snapshot, whatever `overwrite` says.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub unfinished_restore_started: Option<String>,
    /// Files read back and compared with the snapshot (`--verify`); a difference is
    /// in `errors`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub verified: Option<u64>,
    pub duration_secs: f64,
    /// Entries not restored in full; everything else was.
    pub errors: Vec<Issue>,
    /// The SSD placement's local files failed lookups (they are rebuilt at the next
    /// run, which then restores what this one could not).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub index_lookup_failures: Option<crate::report::LookupFailures>,
    /// Damage met in those files and mended in the run (see
    /// [`crate::report::index_repaired`]).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub index_repaired: Option<String>,
}

/// Restores the snapshot (found through the session) into `opts.target`.
pub fn restore_snapshot<A: Access>(
    session: &Session<A>,
    snapshot: &(SnapshotId, Snapshot),
    opts: &RestoreOptions,
) -> Result<RestoreReport> {
    let start = std::time::Instant::now();
    // An image's size and time say nothing of what an earlier restore of it
    // holds ([`RestoreOptions::compare_content`]).
    let compared;
    let opts = if snapshot.1.image.is_some() && !opts.compare_content {
        compared = RestoreOptions {
            compare_content: true,
            ..opts.clone()
        };
        &compared
    } else {
        opts
    };
    let progress = session.progress();
    progress.phase(Phase::Restore);
    if opts.includes.is_empty()
        && opts.iincludes.is_empty()
        && !opts.dry_run
        && opts.subfolder.is_none()
    {
        progress.set_total(Some(snapshot.1.summary.total_bytes), None);
    }
    let root = snapshot
        .1
        .tree_id()
        .map_err(|e| crate::Error::damaged(format!("snapshot {}", snapshot.0.to_hex()), e))?;
    let whole = super::Whole::of(&snapshot.1.paths);
    let (root, whole, top) = match &opts.subfolder {
        None => (root, whole, None),
        Some(path) => match crate::ops::ls::find_node(session.repo(), &root, path)? {
            // `/`: the whole snapshot.
            None => (root, whole, None),
            Some(n) => match (n.kind, n.subtree) {
                (cairn_format::tree::NodeKind::Dir, Some(sub)) => {
                    let under = whole.under(&crate::ops::ls::walk_path(path));
                    (sub, under, Some(n))
                }
                _ => {
                    return Err(crate::Error::Invalid(format!(
                        "{path}: not a directory in snapshot {}: a file is restored with \
                         --include {path} (under its path) or written out with `cairn \
                         dump`",
                        snapshot.0.short()
                    )));
                }
            },
        },
    };
    let stats = super::restore_under(session.repo(), &root, top.as_ref(), &whole, opts, progress)?;
    Ok(RestoreReport {
        snapshot_id: snapshot.0,
        subfolder: opts.subfolder.clone(),
        target: opts.target.clone(),
        files: stats.files,
        dirs: stats.dirs,
        other_entries: stats.other,
        bytes: stats.bytes,
        sockets_skipped: stats.sockets_skipped,
        dry_run: opts.dry_run,
        overwrite: opts.overwrite,
        kept: stats.kept,
        kept_bytes: stats.kept_bytes,
        metadata_only: stats.metadata_only,
        deleted: stats.deleted,
        would_delete: {
            let mut v: Vec<String> = stats
                .would_delete
                .iter()
                .map(|p| p.to_string_lossy().into_owned())
                .collect();
            v.sort();
            v
        },
        mounts_left: stats.mounts_left,
        repository_left: stats.repository_left,
        cancelled_files: stats.cancelled_files,
        unfinished_restore_started: stats
            .unfinished_before
            .map(|t| crate::time::format_unix(t, 0)),
        verified: opts.verify.then_some(stats.verified),
        duration_secs: start.elapsed().as_secs_f64(),
        errors: stats
            .issues
            .iter()
            .map(|i| Issue {
                path: i.path.to_string_lossy().into_owned(),
                error: i.message.clone(),
                lost_data: i.lost_data,
            })
            .collect(),
        index_lookup_failures: crate::report::LookupFailures::of(session.repo()),
        index_repaired: crate::report::index_repaired(session.repo()),
    })
}
