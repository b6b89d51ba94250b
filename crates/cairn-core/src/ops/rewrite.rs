//! `cairn rewrite`: takes files out of existing snapshots (a disk image or a
//! secret backed up by mistake), as restic's `rewrite --exclude` does.
//!
//! Each snapshot that holds something the patterns match gets a new snapshot
//! whose trees leave it out (`original` naming the first of the chain); its
//! trees are stored before any snapshot, and the old snapshot is forgotten only
//! with `forget`, after the new one is stored; without `forget`, the new one is
//! tagged `rewrite`. The data the old one alone needed
//! stays until `prune`, as after `forget`.

use crate::error::{Error, Result};
use crate::index::MasterIndex;
use crate::ops::backup::source::{ExcludeRules, Excludes};
use crate::ops::restore::snap_name;
use crate::repo::Repository;
use crate::session::{Session, Write};
use crate::tree::walk::{Visitor, walk};
use cairn_format::snapshot::Snapshot;
use cairn_format::tree::{Node, NodeKind, Tree};
use cairn_format::{BlobId, SnapshotId};
use std::collections::{HashMap, HashSet};

/// The tag a rewritten snapshot gets when its original is kept (no `--forget`).
pub const REWRITE_TAG: &str = "rewrite";

#[derive(Clone, Debug, Default)]
pub struct RewriteOptions {
    /// What to take out: `--exclude` and `--iexclude` patterns, matched against the
    /// paths `ls` prints.
    pub excludes: ExcludeRules,
    /// Forget each rewritten snapshot once its replacement is stored.
    pub forget: bool,
    pub dry_run: bool,
}

#[derive(Clone, Debug, serde::Serialize)]
pub struct Rewritten {
    pub old: String,
    /// The new snapshot's id (`None` in a dry run).
    pub new: Option<String>,
    /// Paths taken out (a directory once, with everything in it).
    pub removed: Vec<String>,
    /// Bytes of the regular files taken out.
    pub bytes_removed: u64,
    /// The old snapshot was forgotten.
    pub forgotten: bool,
    /// Everything in it matched: no empty replacement is stored (`new` is
    /// `None`); the old one is forgotten with `--forget`, else kept.
    pub emptied: bool,
}

#[derive(Clone, Debug, Default, serde::Serialize)]
pub struct RewriteReport {
    pub rewritten: Vec<Rewritten>,
    /// Snapshots holding nothing the patterns match.
    pub unchanged: usize,
    pub warnings: Vec<String>,
    pub dry_run: bool,
}

/// Rewrites `snapshots` without what `opts.excludes` matches.
pub fn rewrite(
    session: &Session<Write>,
    snapshots: &[(SnapshotId, Snapshot)],
    opts: &RewriteOptions,
) -> Result<RewriteReport> {
    run(session, Some(session.lock()?), snapshots, opts)
}

/// What [`rewrite`] would take out, changing nothing (`opts.dry_run` is taken as
/// set): a read session is enough, so that it works where no lock can be written
/// (a repository mounted read-only).
pub fn plan_rewrite(
    session: &Session<crate::session::Read>,
    snapshots: &[(SnapshotId, Snapshot)],
    opts: &RewriteOptions,
) -> Result<RewriteReport> {
    let opts = RewriteOptions {
        dry_run: true,
        ..opts.clone()
    };
    run(session, None, snapshots, &opts)
}

/// `lock`: held unless `opts.dry_run`.
fn run<A: crate::session::Access>(
    session: &Session<A>,
    lock: Option<std::sync::Arc<crate::repo::lock::RepoLock>>,
    snapshots: &[(SnapshotId, Snapshot)],
    opts: &RewriteOptions,
) -> Result<RewriteReport> {
    let rules = &opts.excludes;
    if rules.patterns.is_empty() && rules.ipatterns.is_empty() {
        return Err(Error::Invalid(
            "say what to take out: --exclude or --iexclude".into(),
        ));
    }
    let excludes = Excludes::new(rules).map_err(Error::BadArgument)?;
    let repo = session.repo();
    let held = lock;
    let lock = || {
        held.as_deref()
            .ok_or_else(|| Error::Invalid("rewrite: no lock held".into()))
    };
    if opts.forget && !opts.dry_run && !repo.backend().may_remove()? {
        return Err(Error::Invalid(
            "--forget removes snapshots: this token may not (an admin token can)".into(),
        ));
    }
    let index = repo.index().clone();
    let mut w = Excluder {
        repo,
        excludes: &excludes,
        index: &index,
        root: None,
        next_path: String::new(),
        memo: HashMap::new(),
        new_trees: Vec::new(),
        new_ids: HashSet::new(),
    };
    let mut report = RewriteReport {
        dry_run: opts.dry_run,
        ..Default::default()
    };
    let (all, _) = session.snapshots()?;
    let mut changed = Vec::new();
    for (id, snap) in snapshots {
        let root = snap
            .tree_id()
            .map_err(|e| Error::damaged(format!("snapshot {}", id.to_hex()), e))?;
        w.root = Some(root);
        w.next_path = String::new();
        let out = walk(repo, &root, &mut w).map_err(|e| match e {
            e @ (Error::Damaged { .. } | Error::BlobNotFound(_)) => Error::Invalid(format!(
                "snapshot {}: {e} (run `cairn repair snapshots` first)",
                id.short()
            )),
            e => e,
        })?;
        if out.id == root {
            report.unchanged += 1;
        } else {
            changed.push((*id, snap.clone(), out));
        }
    }
    let written: HashMap<BlobId, Vec<u8>> = w.new_trees.iter().cloned().collect();
    if !opts.dry_run && !w.new_trees.is_empty() {
        crate::ops::repair::store_trees(repo, std::mem::take(&mut w.new_trees))?;
    }
    for (id, mut snap, out) in changed {
        let mut entry = Rewritten {
            old: id.to_hex(),
            new: None,
            removed: out.removed,
            bytes_removed: out.bytes,
            forgotten: false,
            emptied: out.kept == 0 || every_path_taken_out(&excludes, &snap.paths),
        };
        if entry.emptied {
            // An empty snapshot would stand for a backup that holds nothing:
            // restic removes such a one; here only when forgetting was asked for.
            if opts.forget && !opts.dry_run {
                lock()?.check_fresh()?;
                for (_, r) in repo.forget_snapshots(&[id])? {
                    r?;
                }
                entry.forgotten = true;
            }
            report.rewritten.push(entry);
            continue;
        }
        if !opts.dry_run {
            snap.tree = out.id.to_hex();
            snap.summary.total_bytes = crate::ops::repair::file_bytes(repo, &out.id, &written)?;
            snap.original = Some(snap.original.clone().unwrap_or_else(|| id.to_hex()));
            // Kept beside its original, the replacement is told apart by a tag,
            // as restic's (same time, host and paths: retention could otherwise
            // keep the original, secret and all, and forget the rewrite).
            if !opts.forget && !snap.tags.iter().any(|t| t == REWRITE_TAG) {
                snap.tags.push(REWRITE_TAG.to_string());
            }
            // A run killed after storing this replacement: it is there already.
            // With `--forget`, an earlier run's replacement kept beside the
            // original (tagged) is that replacement too.
            let tagged = || {
                let mut t = snap.clone();
                t.tags.push(REWRITE_TAG.to_string());
                t
            };
            let existing = crate::repo::existing_replacement(all, &id, &snap).or_else(|| {
                (opts.forget && !snap.tags.iter().any(|t| t == REWRITE_TAG))
                    .then(|| crate::repo::existing_replacement(all, &id, &tagged()))
                    .flatten()
            });
            let new_id = match existing {
                Some(existing) => existing,
                None => repo.write_snapshot(&snap, lock()?)?,
            };
            let carried = repo.carry_server_records(&id, &new_id);
            if let Err(e) = &carried {
                report.warnings.push(format!(
                    "snapshot {}: its records from cairn serve were not carried over to {} ({e}); the old \
                     one is kept",
                    id.short(),
                    new_id.short()
                ));
            }
            entry.new = Some(new_id.to_hex());
            if opts.forget && carried.is_ok() {
                lock()?.check_fresh()?;
                for (_, r) in repo.forget_snapshots(&[id])? {
                    r?;
                }
                entry.forgotten = true;
            }
        }
        report.rewritten.push(entry);
    }
    Ok(report)
}

/// Are all the paths a snapshot backed up taken out (each, or a directory above
/// it)? What is left then is only the directories on the way to them, which hold
/// nothing of the backup: the snapshot is emptied, as when nothing is left at all.
fn every_path_taken_out(excludes: &Excludes, paths: &[String]) -> bool {
    !paths.is_empty()
        && paths.iter().all(|p| {
            std::path::Path::new(p)
                .ancestors()
                .any(|a| excludes.is_excluded(a))
        })
}

/// A directory's result: its new tree, what was taken out below it, and the
/// bytes of the files among that.
#[derive(Clone)]
struct Out {
    id: BlobId,
    removed: Vec<String>,
    bytes: u64,
    /// Entries kept below, of any kind: none, and the snapshot would hold
    /// nothing at all (as restic, a snapshot left with directories is kept).
    kept: u64,
}

struct Dir {
    /// The tree as it was (`None`: not known, the root's is in `root`).
    id: Option<BlobId>,
    /// The directory's snapshot path as `ls` prints it (`""` for the root).
    path: String,
    nodes: Vec<Node>,
    changed: bool,
    removed: Vec<String>,
    bytes: u64,
    kept: u64,
}

struct Excluder<'a> {
    repo: &'a Repository,
    excludes: &'a Excludes,
    index: &'a MasterIndex,
    root: Option<BlobId>,
    /// The path of the directory the walk enters next.
    next_path: String,
    /// (tree, path) -> result: a tree shared by many snapshots at the same place
    /// is rewritten once (the patterns may match a tree at one path, not another).
    memo: HashMap<(BlobId, String), Out>,
    new_trees: Vec<(BlobId, Vec<u8>)>,
    new_ids: HashSet<BlobId>,
}

impl Excluder<'_> {
    fn add_tree(&mut self, t: &Tree) -> BlobId {
        let data = t.encode();
        let id = self.repo.key().blob_id(&data);
        if !self.index.is_live(&id) && self.new_ids.insert(id) {
            self.new_trees.push((id, data));
        }
        id
    }

    fn add_child(parent: &mut Dir, n: &Node, out: &Out) {
        let mut n = n.clone();
        if n.subtree != Some(out.id) {
            parent.changed = true;
            n.subtree = Some(out.id);
        }
        parent.removed.extend(out.removed.iter().cloned());
        parent.bytes += out.bytes;
        parent.kept += 1 + out.kept;
        parent.nodes.push(n);
    }
}

impl Visitor for Excluder<'_> {
    type Dir = Dir;
    type Out = Out;

    fn enter(&mut self, _: &str, node: Option<&Node>, _: &Tree) -> Result<Dir> {
        Ok(Dir {
            id: match node {
                Some(n) => n.subtree,
                None => self.root,
            },
            path: std::mem::take(&mut self.next_path),
            nodes: Vec::new(),
            changed: false,
            removed: Vec::new(),
            bytes: 0,
            kept: 0,
        })
    }

    fn entry(&mut self, dir: &mut Dir, _: &str, n: &Node) -> Result<Option<BlobId>> {
        let path = format!("{}/{}", dir.path, snap_name(&n.name));
        if self.excludes.is_excluded(std::path::Path::new(&path)) {
            dir.changed = true;
            if n.kind == NodeKind::File {
                dir.bytes += n.size;
            } else if let (NodeKind::Dir, Some(sub)) = (n.kind, n.subtree) {
                dir.bytes += crate::ops::repair::file_bytes(self.repo, &sub, &HashMap::new())?;
            }
            dir.removed.push(path);
            return Ok(None);
        }
        match (n.kind, n.subtree) {
            (NodeKind::Dir, Some(sub)) => {
                if let Some(out) = self.memo.get(&(sub, path.clone())).cloned() {
                    Self::add_child(dir, n, &out);
                    return Ok(None);
                }
                self.next_path = path;
                Ok(Some(sub))
            }
            _ => {
                dir.kept += 1;
                dir.nodes.push(n.clone());
                Ok(None)
            }
        }
    }

    fn unreadable(&mut self, _: &mut Dir, _: &str, _: &Node, error: Error) -> Result<()> {
        Err(error)
    }

    fn leave(&mut self, _: &str, _: Option<&Node>, dir: Dir) -> Result<Out> {
        let id = match (dir.changed, dir.id) {
            (false, Some(id)) => id,
            _ => self.add_tree(&Tree { nodes: dir.nodes }),
        };
        Ok(Out {
            id,
            removed: dir.removed,
            bytes: dir.bytes,
            kept: dir.kept,
        })
    }

    fn child(&mut self, parent: &mut Dir, _: &str, n: &Node, out: Out) -> Result<()> {
        if let Some(sub) = n.subtree {
            let path = format!("{}/{}", parent.path, snap_name(&n.name));
            self.memo.insert((sub, path), out.clone());
        }
        Self::add_child(parent, n, &out);
        Ok(())
    }
}
