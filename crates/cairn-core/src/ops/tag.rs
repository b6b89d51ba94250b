//! `cairn tag`: changes the tags of snapshots.
//!
//! A snapshot object is named by the hash of its bytes and never rewritten, so a
//! new snapshot with the new tags is stored (its `original` naming the first
//! snapshot of the chain, as `repair snapshots` does), and only then is the old
//! one forgotten: a crash in between leaves both, never neither, and `tag` run
//! again on either finishes the job ([`leftovers`]). A record of
//! the host `cairn serve` vouched for (`hosts/<id>`) goes with the snapshot.

use crate::error::{Error, Result};
use crate::repo::same_but_tags;
use crate::session::{Session, Write};
use cairn_format::SnapshotId;
use cairn_format::snapshot::Snapshot;

/// What to do to the tags: `set` replaces them all, then `remove` and `add`
/// apply (each tag once, in order).
#[derive(Clone, Debug, Default)]
pub struct TagChange {
    pub set: Option<Vec<String>>,
    pub add: Vec<String>,
    pub remove: Vec<String>,
}

impl TagChange {
    fn is_empty(&self) -> bool {
        self.set.is_none() && self.add.is_empty() && self.remove.is_empty()
    }

    /// The names as `backup --tag` and the filters take them: without spaces
    /// around them (a tag `" x"` stored as given matched no filter: QA).
    fn trimmed(&self) -> TagChange {
        let trim = |v: &[String]| v.iter().map(|t| t.trim().to_string()).collect::<Vec<_>>();
        TagChange {
            // Only spaces is no tag, as `--set ""` is none.
            set: self.set.as_deref().map(|v| {
                let mut v = trim(v);
                v.retain(|t| !t.is_empty());
                v
            }),
            add: trim(&self.add),
            remove: trim(&self.remove),
        }
    }

    /// The tags `old` becomes. `remove` takes away a tag stored with spaces
    /// around its name too (as an earlier cairn's `tag --add` stored it).
    pub fn apply(&self, old: &[String]) -> Vec<String> {
        let mut tags: Vec<String> = self.set.clone().unwrap_or_else(|| old.to_vec());
        tags.retain(|t| !self.remove.iter().any(|r| r == t || r == t.trim()));
        tags.extend(self.add.iter().cloned());
        let mut seen = std::collections::HashSet::new();
        tags.retain(|t| seen.insert(t.clone()));
        tags
    }
}

#[derive(Clone, Debug, serde::Serialize)]
pub struct Retagged {
    pub old: String,
    /// The new snapshot's id (`None` in a dry run).
    pub new: Option<String>,
    pub tags: Vec<String>,
}

#[derive(Clone, Debug, Default, serde::Serialize)]
pub struct TagReport {
    pub changed: Vec<Retagged>,
    /// Snapshots whose tags were already as asked.
    pub unchanged: usize,
    /// Host records that could not be carried to the new snapshot, with why.
    pub warnings: Vec<String>,
    /// Snapshots an interrupted `tag` left beside their replacement (the same
    /// snapshot, other tags), forgotten now that the replacement was asked for
    /// again.
    pub leftovers_forgotten: Vec<String>,
    pub dry_run: bool,
}

/// The snapshots an interrupted `tag` of `snap` (or of one it replaced) left
/// beside it: the same tree, time, host and paths, of the same first snapshot
/// (`original`), other tags. A tag killed (or refused by a full disk) between
/// storing the replacement and forgetting the old one leaves such a pair; they
/// differ in nothing but tags.
fn leftovers<'a>(
    all: &'a [(SnapshotId, Snapshot)],
    id: &SnapshotId,
    snap: &Snapshot,
) -> impl Iterator<Item = &'a SnapshotId> {
    let first = snap.original.clone();
    all.iter()
        .filter(move |(x_id, x)| {
            x_id != id
                && first.is_some()
                && first == Some(x.original.clone().unwrap_or_else(|| x_id.to_hex()))
                && same_but_tags(x, snap)
                && x.tags != snap.tags
        })
        .map(|(x_id, _)| x_id)
}

/// Gives `to` the records `cairn serve` wrote for `from` (its host, when it was
/// received) before `from` is forgotten; `false`, with a warning, when they
/// could not be: forgetting `from` then would leave its host's tokens without
/// the snapshot, so both are kept.
fn carried(
    repo: &crate::repo::Repository,
    from: &SnapshotId,
    to: &SnapshotId,
    report: &mut TagReport,
) -> bool {
    match repo.carry_server_records(from, to) {
        Ok(()) => true,
        Err(e) => {
            report.warnings.push(format!(
                "snapshot {}: its records from cairn serve were not carried over to {} ({e}); \
                 both are kept: run tag again once the storage answers",
                from.short(),
                to.short()
            ));
            false
        }
    }
}

/// Forgets the [`leftovers`] of `kept` (its server records carried to it first,
/// as a run that is not interrupted does; records are create-only, so one it
/// has stays), but not one of the snapshots this run was asked to change.
fn forget_leftovers(
    repo: &crate::repo::Repository,
    lock: &crate::repo::lock::RepoLock,
    all: &[(SnapshotId, Snapshot)],
    selected: &[(SnapshotId, Snapshot)],
    kept: (&SnapshotId, &Snapshot),
    report: &mut TagReport,
) -> Result<()> {
    let (id, snap) = kept;
    let mut left = Vec::new();
    for x in leftovers(all, id, snap) {
        // (What this run changed or forgot is among the selected or said.)
        if selected.iter().any(|(s, _)| s == x) || report.leftovers_forgotten.contains(&x.to_hex())
        {
            continue;
        }
        if carried(repo, x, id, report) {
            left.push(*x);
        }
    }
    if !left.is_empty() {
        lock.check_fresh()?;
        for (x, r) in repo.forget_snapshots(&left)? {
            r?;
            report.leftovers_forgotten.push(x.to_hex());
        }
    }
    Ok(())
}

/// Applies `change` to `snapshots`.
pub fn tag(
    session: &Session<Write>,
    snapshots: &[(SnapshotId, Snapshot)],
    change: &TagChange,
    dry_run: bool,
) -> Result<TagReport> {
    run(session, Some(session.lock()?), snapshots, change, dry_run)
}

/// What [`tag`] would change, changing nothing: a read session is enough, so
/// that it works where no lock can be written (a repository mounted read-only).
pub fn plan_tag(
    session: &Session<crate::session::Read>,
    snapshots: &[(SnapshotId, Snapshot)],
    change: &TagChange,
) -> Result<TagReport> {
    run(session, None, snapshots, change, true)
}

/// `lock`: held unless `dry_run`.
fn run<A: crate::session::Access>(
    session: &Session<A>,
    lock: Option<std::sync::Arc<crate::repo::lock::RepoLock>>,
    snapshots: &[(SnapshotId, Snapshot)],
    change: &TagChange,
    dry_run: bool,
) -> Result<TagReport> {
    if change.is_empty() {
        return Err(Error::Invalid(
            "say what to change: --add, --remove or --set".into(),
        ));
    }
    let change = &change.trimmed();
    let all = change
        .set
        .iter()
        .flatten()
        .chain(&change.add)
        .chain(&change.remove);
    if let Some(t) = all.into_iter().find(|t| t.is_empty() || t.contains(',')) {
        return Err(Error::Invalid(format!(
            "tag {t:?}: a tag is a non-empty name without commas"
        )));
    }
    // Asked to be both added and removed: which wins is a guess, so neither.
    if let Some(t) = change.add.iter().find(|t| change.remove.contains(t)) {
        return Err(Error::Invalid(format!(
            "tag {t:?} is both added (--add) and removed (--remove): say which"
        )));
    }
    let repo = session.repo();
    let held = lock;
    let lock = || {
        held.as_deref()
            .ok_or_else(|| Error::Invalid("tag: no lock held".into()))
    };
    // A new snapshot is stored before the old is removed: a client that may not
    // remove (a cairn server's backup token) would be left with both.
    if !dry_run && !repo.backend().may_remove()? {
        return Err(Error::Invalid(
            "changing tags replaces snapshots: this token may not remove them (an admin token can)"
                .into(),
        ));
    }
    let mut report = TagReport {
        dry_run,
        ..Default::default()
    };
    let (all, _) = session.snapshots()?;
    for (id, snap) in snapshots {
        // The old half of a pair an interrupted tag left, selected with the rest
        // (`tag --add x` over all): it is gone once its replacement is kept, never
        // tagged on its own (it would no longer pair with the replacement).
        if let Some((new_id, _)) = all.iter().find(|(n_id, n)| {
            n_id != id
                && n.original.as_deref() == Some(id.to_hex().as_str())
                && same_but_tags(n, snap)
        }) {
            if !dry_run {
                if !carried(repo, id, new_id, &mut report) {
                    continue;
                }
                lock()?.check_fresh()?;
                for (_, r) in repo.forget_snapshots(&[*id])? {
                    r?;
                }
            }
            report.leftovers_forgotten.push(id.to_hex());
            continue;
        }
        let tags = change.apply(&snap.tags);
        if tags == snap.tags {
            report.unchanged += 1;
            // Asked again after a run that stored this one and stopped before
            // forgetting what it replaced: that is finished now.
            if !dry_run {
                forget_leftovers(repo, lock()?, all, snapshots, (id, snap), &mut report)?;
            }
            continue;
        }
        let mut new = snap.clone();
        new.tags = tags.clone();
        new.original = Some(snap.original.clone().unwrap_or_else(|| id.to_hex()));
        let new_id = if dry_run {
            None
        } else {
            // A run killed after storing this replacement: it is there already.
            let new_id = match crate::repo::existing_replacement(all, id, &new) {
                Some(existing) => existing,
                None => repo.write_snapshot(&new, lock()?)?,
            };
            if carried(repo, id, &new_id, &mut report) {
                lock()?.check_fresh()?;
                for (_, r) in repo.forget_snapshots(&[*id])? {
                    r?;
                }
                // Other versions of it an interrupted tag left: this one is what
                // was asked for last.
                forget_leftovers(repo, lock()?, all, snapshots, (&new_id, &new), &mut report)?;
            }
            Some(new_id.to_hex())
        };
        report.changed.push(Retagged {
            old: id.to_hex(),
            new: new_id,
            tags,
        });
    }
    Ok(report)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn set_then_remove_then_add_each_once() {
        let old: Vec<String> = ["a", "b", "c"].map(String::from).to_vec();
        let c = TagChange {
            add: vec!["d".into(), "a".into()],
            remove: vec!["b".into()],
            ..Default::default()
        };
        assert_eq!(c.apply(&old), ["a", "c", "d"]);
        let c = TagChange {
            set: Some(vec!["x".into(), "x".into()]),
            add: vec!["y".into()],
            remove: vec!["a".into()],
        };
        assert_eq!(c.apply(&old), ["x", "y"]);
        let c = TagChange {
            set: Some(vec![]),
            ..Default::default()
        };
        assert!(c.apply(&old).is_empty());
        // Names as the filters take them: spaces around them go, a tag stored
        // with them is removed by its bare name, and only spaces is no tag.
        let spaced: Vec<String> = [" x", "y "].map(String::from).to_vec();
        let c = TagChange {
            add: vec![" z ".into()],
            remove: vec!["x".into()],
            ..Default::default()
        }
        .trimmed();
        assert_eq!(c.apply(&spaced), ["y ", "z"]);
        let c = TagChange {
            set: Some(vec![" ".into(), " w".into()]),
            ..Default::default()
        }
        .trimmed();
        assert_eq!(c.apply(&spaced), ["w"]);
    }
}
