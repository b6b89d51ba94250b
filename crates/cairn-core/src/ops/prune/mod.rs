//! Prune: remove data no snapshot needs, without ever blocking backups.
//!
//! It runs in two phases (the argument is in docs/FORMAT.md, "Prune and concurrent
//! writers"):
//!
//! 1. **Plan and retire.** Under an exclusive lock (against other prunes only), find
//!    the blobs every snapshot needs, copy the needed blobs out of mostly-unused packs
//!    ("repack"), then write index files that supersede all the old ones and no longer
//!    list the retired packs. Then list the locks and write a *pending deletion*
//!    record naming the retired packs (with their entries), the unindexed packs found,
//!    and those locks.
//! 2. **Delete.** A record's packs are deleted only once none of its locks is alive:
//!    every operation that could have loaded the old index has ended. Just before
//!    deleting, snapshots written since phase 1 are walked too; a retired pack that
//!    holds a blob some snapshot needs and no live pack has is indexed again
//!    ("rescued") instead of deleted.
//!
//! With no other job running, both phases happen in one run. Otherwise phase 2 of
//! this run's record happens in a later prune.
//!
//! The plan holds whole-repository sets on local disk, not in RAM ([`scan`]).

mod join;
mod retired;

use crate::error::{Error, Result};
use crate::index::IdSet;
use crate::progress::{Phase, Progress};
use crate::repo::lock::{self, RepoLock};
use crate::repo::{IndexState, Repository};
use crate::session::{Exclusive, Read, Session};
use cairn_backend::names;
use cairn_format::consts::{PACK_HEADER_ENTRY_LEN, PACK_TRAILER_LEN};
use cairn_format::index::{IndexBlob, IndexFile, IndexPack};
use cairn_format::pending::PendingDeletion;
use cairn_format::{BlobId, PackId, PendingId, SnapshotId};
use std::collections::{HashMap, HashSet};

/// More live index files than this and prune rewrites the index even when it
/// deletes nothing.
const COMPACT_INDEX_FILES: usize = 64;

/// How much unused space may stay in packs that are kept.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum MaxUnused {
    /// Percent of the bytes in use (restic's meaning): 5 allows unused/(used+unused)
    /// up to 5%.
    Percent(f64),
    Bytes(u64),
    Unlimited,
}

#[derive(Clone, Debug)]
pub struct PruneOptions {
    pub dry_run: bool,
    pub max_unused: MaxUnused,
    /// Upper bound on the total size of packs repacked in this run.
    pub max_repack_bytes: Option<u64>,
    /// Memory for one partition of the plan's whole-repository sets (default:
    /// a share of `--memory-limit`, else 256 MiB); below what they need, they
    /// spill to local disk in as many partitions as it takes.
    pub partition_bytes: Option<u64>,
    /// A dry run plans as if these snapshots were gone (`forget --dry-run --prune`:
    /// what the prune after that forget would free). A real prune ignores this.
    pub as_if_forgotten: Vec<SnapshotId>,
}

impl Default for PruneOptions {
    fn default() -> Self {
        PruneOptions {
            dry_run: false,
            max_unused: MaxUnused::Percent(5.0),
            max_repack_bytes: None,
            partition_bytes: None,
            as_if_forgotten: Vec::new(),
        }
    }
}

/// What prune found and decided. All sizes are bytes as stored.
#[derive(Clone, Debug, Default, serde::Serialize)]
pub struct PrunePlan {
    pub snapshots: usize,
    pub packs: usize,
    pub pack_bytes: u64,
    pub used_blobs: usize,
    pub used_bytes: u64,
    pub unused_bytes: u64,
    /// Pack headers and trailers (neither used nor unused blob bytes).
    pub overhead_bytes: u64,
    /// Packs nothing needs: deleted whole.
    pub delete_packs: usize,
    pub delete_bytes: u64,
    /// Packs partly needed and selected for repacking: their needed blobs are
    /// copied into new packs, then they are deleted.
    pub repack_packs: usize,
    pub repack_bytes: u64,
    /// Of `repack_bytes`, what is copied into new packs.
    pub repack_copy_bytes: u64,
    /// The headers and trailers of the new packs that copy takes (an entry per
    /// blob copied): not reclaimed (QA: counted as freed, the figure was up to
    /// twice the space prune freed when many small blobs moved).
    pub repack_header_bytes: u64,
    /// Packs no index lists (left by interrupted backups).
    pub unindexed_packs: usize,
    pub unindexed_bytes: u64,
    /// Indexed packs missing from storage whose blobs no snapshot needs: dropped
    /// from the index.
    pub missing_unused_packs: usize,
    /// Unused bytes left in kept packs afterwards.
    pub unused_bytes_after: u64,
    /// Space freed once this plan's deletions happen.
    pub reclaim_bytes: u64,
    /// Index files replaced by new ones (plus superseded ones still stored).
    pub index_files_replaced: usize,
    /// Packs retired by earlier prunes, still waiting for their deletion.
    pub earlier_pending_packs: usize,
    /// Copies of needed blobs that also have other copies, read before the
    /// others could be dropped.
    pub checked_copies: usize,
    /// Of those, index entries whose pack does not hold the blob they name
    /// (damage, or an index file written to make prune delete real data):
    /// treated as unused, never kept.
    pub false_copies: usize,
}

#[derive(Clone, Debug, Default, serde::Serialize)]
pub struct PruneReport {
    pub plan: PrunePlan,
    pub dry_run: bool,
    /// Packs deleted in this run (this plan's and earlier ones').
    pub deleted_packs: usize,
    pub deleted_bytes: u64,
    /// Retired packs indexed again because a snapshot written meanwhile needs them.
    pub rescued_packs: usize,
    /// Their stored bytes: not reclaimed after all.
    pub rescued_bytes: u64,
    /// Packs retired but not yet deleted: operations that may still use them run.
    pub deferred_packs: usize,
    pub deferred_bytes: u64,
    /// The locks deletion waits for.
    pub waiting_for: Vec<String>,
    /// Locks taken for stale (their holder dead, or silent for longer than
    /// [`crate::repo::lock::STALE_AFTER`]), removed before packs were deleted.
    pub stale_locks_removed: Vec<String>,
    /// Stale locks that could not be removed (the storage refused): ignored, as
    /// stale locks always were, with why.
    pub stale_locks_kept: Vec<String>,
    pub new_packs: u64,
    pub new_index_files: usize,
    /// Partial files killed writers left behind, removed.
    pub temporaries_removed_bytes: u64,
    /// Index files that could not be read (hex ids): left out and replaced, the
    /// packs only they listed treated as unindexed.
    pub damaged_index_files: Vec<String>,
}

enum Action {
    Keep,
    Delete,
    Repack,
    DropMissing,
    /// Listed by superseded index files only: not part of the index.
    Unlisted,
    /// Listed only by pending-deletion records: phase 2 decides about it; no
    /// reason to rewrite the index.
    PendingOnly,
}

/// Runs prune under the session's exclusive lock. The session's repository holds
/// no index afterwards (what prune read is out of date). With `opts.dry_run`,
/// only plans (see [`plan`]).
pub fn prune(session: &mut Session<Exclusive>, opts: &PruneOptions) -> Result<PruneReport> {
    let lock = session.lock()?;
    let progress = session.progress().clone();
    run(session.repo_mut(), opts, Some(&lock), &progress)
}

/// What prune would do, changing nothing: a shared lock is enough, so it runs
/// while another prune does.
pub fn plan(session: &mut Session<Read>, opts: &PruneOptions) -> Result<PruneReport> {
    let opts = PruneOptions {
        dry_run: true,
        ..opts.clone()
    };
    let progress = session.progress().clone();
    run(session.repo_mut(), &opts, None, &progress)
}

fn run(
    repo: &mut Repository,
    opts: &PruneOptions,
    lock: Option<&RepoLock>,
    progress: &Progress,
) -> Result<PruneReport> {
    super::needs_every_snapshot(repo, "prune")?;
    let mut report = PruneReport {
        dry_run: opts.dry_run,
        ..Default::default()
    };

    // Order matters (docs/FORMAT.md): packs, then snapshots, then index. A snapshot
    // listed here has its blobs in index files written before it, so the index read
    // afterwards knows them.
    progress.phase(Phase::Planning);
    let stored: HashMap<PackId, u64> = repo.list_packs()?;
    let (mut snaps, mut bad) = repo.snapshots()?;
    if opts.dry_run && !opts.as_if_forgotten.is_empty() {
        let gone: HashSet<&SnapshotId> = opts.as_if_forgotten.iter().collect();
        snaps.retain(|(id, _)| !gone.contains(id));
        bad.retain(|e| !gone.contains(&e.id));
    }
    if let Some(e) = bad.into_iter().next() {
        return Err(Error::Invalid(format!(
            "{e}; prune cannot tell what it needs: {}",
            e.advice()
        )));
    }
    let mut scan = crate::ops::scan::scan_index(repo, &stored, opts.partition_bytes)?;
    // An index file that cannot be read is left out, as if it had never been
    // stored: every pack only such a file lists is then unindexed, the case of a
    // backup killed before its index file, which the two-phase deletion already
    // makes safe (a pack holding a blob a snapshot needs is rescued from its own
    // header; a needed blob no readable file lists stops prune before anything
    // changes). Without this, one undecryptable file — bit rot, or junk that an
    // append-only token may upload under a content-addressed name — would stop
    // every prune until `repair index` read every pack. Anything else unreadable
    // (a damaged pending record, a file that vanished unexplained) still stops it.
    let damaged = scan
        .state
        .damaged_index_files()
        .map_err(|e| Error::Invalid(format!("{e}; run `cairn repair index` before prune")))?;
    report.damaged_index_files = damaged.iter().map(|id| id.to_hex()).collect();
    // What stops prune below because a damaged file listed it is told so.
    let hint = |e: Error| IndexState::damaged_hint(e, &damaged);
    // The walk reads trees and chunk lists through the index in its placement
    // (in memory when this machine cannot use the SSD placement's files: a prune
    // run to free space must not fail on the disk of a cache).
    repo.load_index_or_in_ram(progress)?;

    let listed: HashSet<SnapshotId> = snaps.iter().map(|(id, _)| *id).collect();
    let mut needed = crate::ops::scan::Needed::new(&scan)?;
    crate::tree::reachable::collect_snapshots(repo, &snaps, &mut needed, progress).map_err(hint)?;

    let pending_packs: HashSet<PackId> = scan
        .state
        .pending
        .iter()
        .flat_map(|(_, p)| {
            p.packs
                .iter()
                .map(|x| x.id)
                .chain(p.orphans.iter().copied())
        })
        .collect();
    // A pack stored and indexed by a backup between the listing and the index read
    // is not missing: list again before treating any indexed pack as gone.
    let indexed_missing = scan
        .packs
        .iter()
        .any(|p| p.file != crate::ops::scan::NO_FILE && p.stored_size.is_none());
    let stored = if indexed_missing {
        let mut again = repo.list_packs()?;
        again.extend(stored);
        for p in &mut scan.packs {
            p.stored_size = again.get(&p.id).copied();
        }
        again
    } else {
        stored
    };
    let mut joined = join::join_needed(repo, &mut scan, needed).map_err(hint)?;
    let new_packs = NewPacks {
        target: u64::from(repo.config().pack_size).max(1),
        fixed: (1 + 3 + repo.key().sealer.overhead() + PACK_TRAILER_LEN) as u64,
    };
    let (mut plan, actions, orphans) = make_plan(&scan, &stored, &pending_packs, opts, new_packs);
    // Entries read and found false are left out of a new index.
    let drops_false = joined.false_copies > 0;
    if (!damaged.is_empty() || drops_false) && !rewrites_index(&actions, &scan.state) {
        plan.index_files_replaced += scan.state.live.len();
    }
    plan.index_files_replaced += damaged.len();
    plan.used_blobs = joined.used_blobs;
    plan.false_copies = joined.false_copies;
    plan.checked_copies = joined.checked_copies;
    plan.snapshots = snaps.len();
    // Only those still waiting: a running backup's packs an earlier prune found
    // unindexed are in the index now, and no longer deleted (they were counted
    // as waiting for deletion).
    let indexed: HashSet<PackId> = (scan.packs.iter())
        .filter(|p| p.file != crate::ops::scan::NO_FILE)
        .map(|p| p.id)
        .collect();
    plan.earlier_pending_packs = (pending_packs.iter())
        .filter(|id| stored.contains_key(id) && !indexed.contains(id))
        .count();
    report.plan = plan;
    let lock = match lock {
        Some(l) if !opts.dry_run => l,
        _ => return Ok(report),
    };
    // The last point where stopping changes nothing.
    progress.check_cancelled()?;

    // ---- phase 1: repack, replace the index, record what is retired ----
    report.temporaries_removed_bytes = repo.backend().remove_stale_temporaries()?;
    let mut new_index_files = Vec::new();
    if actions.iter().any(|a| matches!(a, Action::Repack)) {
        progress.phase(Phase::Repacking);
        let mut wanted = join::repack_lists(&mut scan, &mut joined, &|n| {
            matches!(actions[n], Action::Repack)
        })?;
        let lists: Vec<IndexPack> = (0..scan.packs.len())
            .filter(|n| matches!(actions[*n], Action::Repack))
            .map(|n| IndexPack {
                id: scan.packs[n].id,
                blobs: wanted.remove(&(n as u32)).unwrap_or_default(),
            })
            .collect();
        let stats = crate::ops::repair::copy_blobs(repo, &lists, false, progress)?;
        crate::hooks::point("prune:repacked");
        report.new_packs = stats.packs;
        new_index_files.extend(stats.index_files);
        // Stopping here leaves the copies as second ones: nothing is lost.
        progress.check_cancelled()?;
    }
    // Also rewrite when small index files have piled up (every backup adds one or
    // two): one replacement file per 200,000 blobs is what readers like best.
    let state = &scan.state;
    let changed = rewrites_index(&actions, state) || !damaged.is_empty() || drops_false;
    let mut retired = retired::Retired::new(&scan.dir);
    let mut old_files: Vec<cairn_format::IndexId> = state.superseded.clone();
    // A damaged file is replaced like a live one: the packs only it listed are
    // unindexed now, recorded below as orphans like a killed backup's packs.
    old_files.extend(damaged.iter().copied());
    if changed {
        progress.phase(Phase::WritingIndex);
        old_files.extend(state.live.iter().map(|(id, _)| *id));
        let records = carried_snapshot_records(state, &listed);
        // Only a prune whose lock nobody could have taken for stale may change
        // what readers see (another prune may have run meanwhile).
        lock.check_held()?;
        let files = write_replacement_index(
            repo,
            &scan,
            &joined,
            &actions,
            old_files.clone(),
            records,
            &mut retired,
        )?;
        new_index_files.extend(files);
        crate::hooks::point("prune:index-replaced");
        report.new_index_files = new_index_files.len();
    }
    if !retired.is_empty() || !orphans.is_empty() {
        // Locks are listed after the new index is stored: any operation that read
        // the old index took its lock before that, so it is in this list.
        let locks = live_lock_ids(repo, lock)?;
        lock.check_held()?;
        // Several records when many packs retire, each of bounded size. A crash
        // between them leaves the rest unindexed: the next prune finds them as
        // such and records them (with the locks of then) before deleting.
        let created = crate::time::now_unix();
        let record = |packs: Vec<IndexPack>, orphans: Vec<PackId>| -> Result<()> {
            repo.write_pending(&PendingDeletion {
                created,
                locks: locks.clone(),
                packs,
                orphans,
            })?;
            crate::hooks::point("prune:pending-record");
            Ok(())
        };
        let mut orphans = Some(orphans);
        retired.into_batches(retired::entries_per_record(), &mut |packs| {
            record(packs, orphans.take().unwrap_or_default())
        })?;
        if let Some(o) = orphans.filter(|o| !o.is_empty()) {
            record(Vec::new(), o)?;
        }
        crate::hooks::point("prune:pending-written");
    }
    // Superseded files are ignored by every reader; a reader that listed one just
    // before finds it gone and reads the listing again.
    for id in old_files {
        match repo.delete_index_file(&id) {
            Ok(()) => {}
            Err(Error::Backend(e)) if e.is_not_found() => {}
            Err(e) => return Err(e),
        }
        crate::hooks::point("prune:superseded-deleted");
    }
    drop(scan);

    // ---- phase 2: delete what no live operation can still use ----
    progress.phase(Phase::Deleting);
    // Past the index switch nothing stops early: a cancellation would only hide
    // what was done (the report) and leave deletions for the next prune.
    delete_pending(
        repo,
        lock,
        &listed,
        joined.needed_from_pending,
        &mut report,
        &Progress::none(),
    )?;
    // What the plan read is out of date now; the next operation reads the index
    // that prune wrote (for the SSD placement: rebuilds its files once).
    repo.set_index(&IndexState::default())?;
    Ok(report)
}

/// Whether the index is written anew: some pack's listing changes, or small
/// index files have piled up.
fn rewrites_index(actions: &[Action], state: &IndexState) -> bool {
    actions
        .iter()
        .any(|a| !matches!(a, Action::Keep | Action::PendingOnly))
        || state.live.len() > COMPACT_INDEX_FILES
}

fn live_lock_ids(repo: &Repository, mine: &RepoLock) -> Result<Vec<[u8; 32]>> {
    Ok(lock::list_locks(repo)?
        .into_iter()
        .filter(|l| l.id != mine.id() && !l.stale)
        .map(|l| l.id)
        .collect())
}

/// What the packs a repack writes cost besides the blobs they copy: the target
/// size (how many there will be) and each one's header bytes beyond its entries
/// (version, entry count, seal, trailer).
#[derive(Clone, Copy)]
struct NewPacks {
    target: u64,
    fixed: u64,
}

fn make_plan(
    scan: &crate::ops::scan::Scan,
    stored: &HashMap<PackId, u64>,
    pending_packs: &HashSet<PackId>,
    opts: &PruneOptions,
    new_packs: NewPacks,
) -> (PrunePlan, Vec<Action>, Vec<PackId>) {
    let mut plan = PrunePlan::default();
    let infos = &scan.packs;
    let mut actions = Vec::with_capacity(infos.len());
    let mut partial = Vec::new();
    for (n, info) in infos.iter().enumerate() {
        let a = match info.stored_size {
            _ if info.pending_only => Action::PendingOnly,
            // Listed only by superseded files: not indexed.
            _ if info.file == crate::ops::scan::NO_FILE => Action::Unlisted,
            None => {
                plan.missing_unused_packs += 1;
                Action::DropMissing
            }
            Some(size) => {
                plan.packs += 1;
                plan.pack_bytes += size;
                plan.used_bytes += info.used_bytes;
                if info.used_bytes == 0 {
                    plan.delete_packs += 1;
                    plan.delete_bytes += size;
                    Action::Delete
                } else {
                    // Unused = blobs nothing needs; headers count as used.
                    plan.unused_bytes += info.unused_bytes;
                    if info.unused_bytes > 0 {
                        partial.push((n, info.unused_bytes, size));
                    }
                    Action::Keep
                }
            }
        };
        actions.push(a);
    }
    // Fully-unused packs: their blobs are all unused bytes.
    for (info, a) in infos.iter().zip(&actions) {
        if matches!(a, Action::Delete) {
            plan.unused_bytes += info.unused_bytes;
        }
    }
    plan.overhead_bytes = plan
        .pack_bytes
        .saturating_sub(plan.used_bytes + plan.unused_bytes);

    // Repack the emptiest packs until the unused space left is within the limit.
    let allowed = match opts.max_unused {
        MaxUnused::Unlimited => u64::MAX,
        MaxUnused::Bytes(b) => b,
        MaxUnused::Percent(p) if p >= 100.0 => u64::MAX,
        MaxUnused::Percent(p) => (plan.used_bytes as f64 * p / (100.0 - p)) as u64,
    };
    partial.sort_by(|a, b| {
        let fa = a.1 as f64 / a.2.max(1) as f64;
        let fb = b.1 as f64 / b.2.max(1) as f64;
        fb.total_cmp(&fa)
    });
    let mut unused_left: u64 = partial.iter().map(|p| p.1).sum();
    let mut copy_blobs = 0u64;
    for (n, unused, size) in partial {
        if unused_left <= allowed {
            break;
        }
        if let Some(max) = opts.max_repack_bytes
            && plan.repack_bytes + size > max
        {
            continue;
        }
        actions[n] = Action::Repack;
        plan.repack_packs += 1;
        plan.repack_bytes += size;
        plan.repack_copy_bytes += infos[n].used_bytes;
        copy_blobs += infos[n].used_blobs;
        unused_left -= unused;
    }
    if copy_blobs > 0 {
        plan.repack_header_bytes = copy_blobs * PACK_HEADER_ENTRY_LEN as u64
            + plan.repack_copy_bytes.div_ceil(new_packs.target).max(1) * new_packs.fixed;
    }
    plan.unused_bytes_after = unused_left;

    // Unindexed packs: not in a live index file and not already pending.
    let indexed: HashSet<PackId> = infos
        .iter()
        .filter(|i| i.file != crate::ops::scan::NO_FILE)
        .map(|i| i.id)
        .collect();
    let mut orphans = Vec::new();
    for (id, size) in stored {
        if !indexed.contains(id) && !pending_packs.contains(id) {
            orphans.push(*id);
            plan.unindexed_packs += 1;
            plan.unindexed_bytes += size;
        }
    }
    orphans.sort();
    let state = &scan.state;
    plan.index_files_replaced = state.superseded.len();
    if rewrites_index(&actions, state) {
        plan.index_files_replaced += state.live.len();
    }
    plan.reclaim_bytes = (plan.delete_bytes + plan.repack_bytes + plan.unindexed_bytes)
        .saturating_sub(plan.repack_copy_bytes + plan.repack_header_bytes);
    (plan, actions, orphans)
}

/// Writes the kept packs' entries as new index files; the last one supersedes the
/// old files, so readers switch at once and a crash before it changes nothing.
/// Snapshot records the replacement index must keep: a "committed" record unless
/// the snapshot is gone *and* was forgotten (a gone, unforgotten one is evidence of
/// deletion and stays), and a "forgotten" record while the snapshot still exists
/// (a forget that has not deleted it yet).
fn carried_snapshot_records(
    state: &IndexState,
    listed: &HashSet<SnapshotId>,
) -> (Vec<SnapshotId>, Vec<SnapshotId>) {
    let (announced, forgotten) = state.snapshot_records();
    let mut keep_ann: Vec<SnapshotId> = announced
        .into_iter()
        .filter(|id| listed.contains(id) || !forgotten.contains(id))
        .collect();
    let mut keep_forgot: Vec<SnapshotId> = forgotten
        .into_iter()
        .filter(|id| listed.contains(id))
        .collect();
    keep_ann.sort();
    keep_forgot.sort();
    (keep_ann, keep_forgot)
}

/// Packs listed by several live index files whose listings are merged in memory
/// by [`write_replacement_index`], in entries at most: past that, each further
/// listing is written as it is (the same entry twice is one copy to every
/// reader), so a hostile index that lists every pack again costs no more memory.
const MERGED_ENTRIES_MAX: usize = 1 << 20;

/// Streams the live index files once more: each pack's listings go to the new
/// files when the pack is kept, to `retired` when it is retired, without the
/// entries known false (found so by prune's reads, or not fitting the stored
/// pack). A pack several files list gets one listing of their entries, each once.
fn write_replacement_index(
    repo: &Repository,
    scan: &crate::ops::scan::Scan,
    joined: &join::Joined,
    actions: &[Action],
    supersedes: Vec<cairn_format::IndexId>,
    (snapshots, forgotten): (Vec<SnapshotId>, Vec<SnapshotId>),
    retired: &mut retired::Retired,
) -> Result<Vec<cairn_format::IndexId>> {
    const BLOBS_PER_FILE: usize = 200_000;
    let live: Vec<(u32, cairn_format::IndexId)> = scan
        .files
        .iter()
        .enumerate()
        .filter(|(_, (_, live))| *live)
        .map(|(n, (id, _))| (n as u32, *id))
        .collect();
    let mut files = Vec::new();
    let mut cur = IndexFile::default();
    let mut n = 0;
    // Listings of packs several files list, until the last one is met: the
    // entries so far, and how many listings are still to come.
    let mut merging: HashMap<usize, (IndexPack, HashSet<IndexBlob>, u32)> = HashMap::new();
    let mut merged_entries = 0usize;
    let mut emit = |k: usize, p: IndexPack| -> Result<()> {
        match actions[k] {
            Action::Keep => {
                n += p.blobs.len();
                cur.packs.push(p);
                if n >= BLOBS_PER_FILE {
                    files.push(repo.write_index_file(&std::mem::take(&mut cur))?);
                    n = 0;
                }
            }
            Action::Delete | Action::Repack => retired.push(&p)?,
            Action::DropMissing | Action::Unlisted | Action::PendingOnly => {}
        }
        Ok(())
    };
    for batch in live.chunks(4) {
        let read = crate::threads::parallel_map(batch, 4, |(_, id)| repo.read_index_file(id));
        for f in read {
            for mut p in f?.packs {
                let Some(&k) = scan.number.get(&p.id) else {
                    continue;
                };
                let row = &scan.packs[k as usize];
                p.blobs.retain(|b| row.fits(b) && !joined.found_false(k, b));
                let k = k as usize;
                if row.listings < 2 {
                    emit(k, p)?;
                    continue;
                }
                let left = match merging.get_mut(&k) {
                    Some((merged, seen, left)) => {
                        for b in p.blobs {
                            if seen.insert(b) {
                                merged.blobs.push(b);
                                merged_entries += 1;
                            }
                        }
                        *left -= 1;
                        *left
                    }
                    None if merged_entries < MERGED_ENTRIES_MAX => {
                        merged_entries += p.blobs.len();
                        let seen = p.blobs.iter().copied().collect();
                        merging.insert(k, (p, seen, row.listings - 1));
                        continue;
                    }
                    None => {
                        emit(k, p)?;
                        continue;
                    }
                };
                if left == 0
                    && let Some((merged, seen, _)) = merging.remove(&k)
                {
                    merged_entries -= seen.len();
                    emit(k, merged)?;
                }
            }
        }
    }
    for (k, (merged, _, _)) in merging {
        emit(k, merged)?;
    }
    cur.supersedes = supersedes;
    cur.snapshots = snapshots;
    cur.forgotten = forgotten;
    files.push(repo.write_index_file(&cur)?);
    Ok(files)
}

/// Phase 2 for every pending record whose locks are all gone. `needed` holds the
/// blobs the snapshots in `listed` need that no live pack holds (those only
/// retired packs still do); the snapshots written since are walked here. A
/// retired pack holding a blob of either is indexed again instead of deleted.
fn delete_pending(
    repo: &mut Repository,
    mine: &RepoLock,
    listed: &HashSet<SnapshotId>,
    mut used: IdSet,
    report: &mut PruneReport,
    progress: &Progress,
) -> Result<()> {
    let ids = repo.list_pending()?;
    if ids.is_empty() {
        return Ok(());
    }
    let locks = lock::list_locks(repo)?;
    let alive: HashMap<[u8; 32], &lock::LockInfo> = locks
        .iter()
        .filter(|l| !l.stale && l.id != mine.id())
        .map(|l| (l.id, l))
        .collect();
    // Ready records by id only: they are read again one at a time below (a large
    // prune writes many, each up to half a million entries).
    let mut ready: Vec<PendingId> = Vec::new();
    // Every pack a ready record names: their copies are the ones going.
    let mut retiring: HashSet<PackId> = HashSet::new();
    let mut waiting = HashSet::new();
    // A pack may be named by two records (rescued, then retired again by a later
    // prune); it may only go when every record naming it is ready.
    let mut held: HashSet<PackId> = HashSet::new();
    // Pack sizes, listed once the first record must wait (for its bytes); a
    // pack two waiting records name is counted once.
    let mut sizes: Option<HashMap<PackId, u64>> = None;
    let mut counted: HashSet<PackId> = HashSet::new();
    for id in ids {
        let rec = repo.read_pending(&id)?;
        let blockers: Vec<_> = rec.locks.iter().filter_map(|l| alive.get(l)).collect();
        if blockers.is_empty() {
            ready.push(id);
            retiring.extend(rec.packs.iter().map(|p| p.id));
            retiring.extend(rec.orphans.iter().copied());
        } else {
            for b in blockers {
                // A mount holds its lock only while it is used: the wait may end
                // with the mount still there (README, `cairn mount`).
                let idle = b.lock.as_ref().is_some_and(|l| l.operation == "mount");
                waiting.insert(format!(
                    "{}{}",
                    b.describe(),
                    if idle {
                        " (a mount lets go of its lock after 30 s without a request)"
                    } else {
                        ""
                    }
                ));
            }
            if sizes.is_none() {
                sizes = Some(repo.list_packs()?);
            }
            let sizes = sizes.as_ref();
            for p in rec
                .packs
                .iter()
                .map(|p| p.id)
                .chain(rec.orphans.iter().copied())
            {
                if counted.insert(p) {
                    report.deferred_packs += 1;
                    report.deferred_bytes += sizes.and_then(|s| s.get(&p)).copied().unwrap_or(0);
                }
            }
            held.extend(rec.packs.iter().map(|p| p.id));
            held.extend(rec.orphans.iter().copied());
        }
    }
    report.waiting_for = waiting.into_iter().collect();
    report.waiting_for.sort();
    if ready.is_empty() {
        return Ok(());
    }
    // Packs are deleted below on the strength of those locks being stale. Their
    // objects go first: a holder that is alive after all (a clock far behind this
    // one's, a machine that slept) finds its lock gone at its commit point and
    // stops without committing, instead of saving a snapshot that needs a pack
    // deleted here.
    // (Every stale lock, not only those the records name: one taken for stale
    // when a record was written is named by none.) A lock the storage will not
    // let go is passed over, as stale locks were before this guard.
    for l in locks.iter().filter(|l| l.stale && l.id != mine.id()) {
        match repo.backend().delete(&l.name) {
            Ok(()) => report.stale_locks_removed.push(l.describe()),
            Err(e) if e.is_not_found() => {}
            Err(e) => report
                .stale_locks_kept
                .push(format!("{}: {e}", l.describe())),
        }
    }
    // The locks were checked first: an operation that has ended wrote its snapshot
    // before it removed its lock, so the listing below contains it. Snapshots are
    // listed before the index is read, so the index knows every listed one's blobs.
    let (snaps, bad) = repo.snapshots()?;
    if let Some(e) = bad.into_iter().next() {
        return Err(Error::Invalid(format!(
            "{e}; not deleting anything (`cairn recover` first saves what it held as a \
             new snapshot; then `cairn forget ID` removes that object, `cairn repair \
             snapshots` every unreadable one)"
        )));
    }
    let new: Vec<_> = snaps
        .into_iter()
        .filter(|(id, _)| !listed.contains(id))
        .collect();
    // The index as it is now, only to walk snapshots written since the plan and
    // to see which of their blobs a kept pack holds: loading it is a whole read
    // of the index (a rebuild of the SSD placement's files, which the index
    // switch made stale). Without new snapshots, a retired pack holding a needed
    // blob is rescued without asking whether another copy is live (a duplicate
    // listing at worst, which the next prune drops).
    // What the plan found needed and held only by retired packs (its live copies,
    // if any, read and found false): rescued whatever the index says now, since
    // a false entry indexed since must not count.
    let planned = used.clone();
    let index = if new.is_empty() {
        None
    } else {
        repo.load_index_or_in_ram(progress)?;
        crate::tree::reachable::collect_snapshots(repo, &new, &mut used, progress)?;
        Some(repo.index().clone())
    };
    // A blob a snapshot written since the plan needs counts as held elsewhere only
    // if a live copy outside the retiring packs is read and holds it: an entry is
    // a claim, and an append-only writer can index false ones (read once each,
    // and only for blobs such a snapshot needs that a retiring pack holds).
    let verified = std::cell::RefCell::new(HashMap::<BlobId, bool>::new());
    // A live copy must also be one its pack's header lists (see `vouched`); any
    // doubt rescues the retired pack.
    let sizes = std::cell::OnceCell::new();
    let headers = std::cell::RefCell::new(HashMap::<PackId, HashSet<IndexBlob>>::new());
    let listed_in_header = |pack: PackId, b: IndexBlob| -> bool {
        if let Some(h) = headers.borrow().get(&pack) {
            return h.contains(&b);
        }
        let sizes: &HashMap<PackId, u64> =
            sizes.get_or_init(|| repo.list_packs().unwrap_or_default());
        let h = match sizes.get(&pack) {
            Some(&size) => vouched(repo, &pack, size).unwrap_or_default(),
            None => HashSet::new(),
        };
        let yes = h.contains(&b);
        headers.borrow_mut().insert(pack, h);
        yes
    };
    let live_elsewhere = |id: &BlobId| -> bool {
        if planned.contains(id) {
            return false;
        }
        let Some(ix) = index.as_ref().filter(|i| i.is_live(id)) else {
            return false;
        };
        if let Some(&v) = verified.borrow().get(id) {
            return v;
        }
        let v = ix
            .copies(id)
            .iter()
            .filter(|l| !retiring.contains(&ix.pack_of(l)))
            .any(|l| {
                let b = IndexBlob {
                    kind: l.kind,
                    id: *id,
                    offset: l.offset,
                    length: l.length,
                    raw_length: l.raw_length,
                    compression: l.compression,
                };
                listed_in_header(ix.pack_of(l), b) && repo.read_blob_at(id, l).is_ok()
            });
        verified.borrow_mut().insert(*id, v);
        v
    };
    // Kept current as packs go: a pack two ready records name (see `held`) is
    // deleted through the first, and the second must not read it as an orphan.
    let mut stored = repo.list_packs()?;
    // The packs live index files list (superseded files are only known at the end).
    let mut listed_packs: HashMap<cairn_format::IndexId, Vec<PackId>> = HashMap::new();
    let state = repo.read_index_state_streamed(
        &mut |id, f| {
            listed_packs.insert(*id, f.packs.iter().map(|p| p.id).collect());
            Ok(())
        },
        &mut |_, _| Ok(()),
    )?;
    let live_packs: HashSet<PackId> = state
        .live
        .iter()
        .filter_map(|(id, _)| listed_packs.remove(id))
        .flatten()
        .collect();
    for id in ready {
        let rec = match repo.read_pending(&id) {
            Ok(r) => r,
            Err(Error::Backend(e)) if e.is_not_found() => continue,
            Err(e) => return Err(e),
        };
        let mut rescue = IndexFile::default();
        let mut delete = Vec::new();
        for p in rec.packs {
            if live_packs.contains(&p.id) || !stored.contains_key(&p.id) || held.contains(&p.id) {
                continue;
            }
            if p.blobs
                .iter()
                .any(|b| used.contains(&b.id) && !live_elsewhere(&b.id))
            {
                rescue.packs.push(p);
            } else {
                delete.push(p.id);
            }
        }
        for o in rec.orphans {
            if live_packs.contains(&o) || !stored.contains_key(&o) || held.contains(&o) {
                continue;
            }
            match read_header(repo, &o, stored[&o]) {
                Ok(blobs) => {
                    if blobs
                        .iter()
                        .any(|b| used.contains(&b.id) && !live_elsewhere(&b.id))
                    {
                        rescue.packs.push(IndexPack { id: o, blobs });
                    } else {
                        delete.push(o);
                    }
                }
                // A damaged header cannot be indexed: nothing can use such a pack.
                Err(Error::Damaged { .. }) => delete.push(o),
                // A header of a newer format: perhaps a newer cairn's pack whose
                // index this one cannot read, perhaps a hostile client's claim. It
                // is neither deleted nor a reason to stop every prune: left as it
                // is (the next prune meets it again; `repair index` decides).
                Err(Error::NewerFormat { .. }) => {}
                // Anything else (I/O, timeouts) says nothing about the pack.
                Err(e) => return Err(e),
            }
        }
        if !rescue.packs.is_empty() {
            report.rescued_packs += rescue.packs.len();
            report.rescued_bytes += (rescue.packs.iter())
                .map(|p| stored.get(&p.id).copied().unwrap_or(0))
                .sum::<u64>();
            repo.write_index_file(&rescue)?;
        }
        // Deleting on the strength of this prune's view of the locks and index: only
        // while its own lock cannot have looked stale to another prune.
        mine.check_held()?;
        for p in delete {
            let size = stored.remove(&p).unwrap_or(0);
            match repo.backend().delete(&names::pack(&p.to_hex())) {
                Ok(()) => {
                    report.deleted_packs += 1;
                    report.deleted_bytes += size;
                    crate::hooks::point("prune:pack-deleted");
                }
                Err(e) if e.is_not_found() => {}
                Err(e) => return Err(e.into()),
            }
        }
        match repo.backend().delete(&names::pending(&id.to_hex())) {
            Ok(()) => {}
            Err(e) if e.is_not_found() => {}
            Err(e) => return Err(e.into()),
        }
    }
    Ok(())
}

/// What a pack's own header says it holds, as index entries: an index entry it
/// does not list is no copy, even when its bytes decode (a pack of real blobs
/// under a header of other ids, which an append-only writer can store, would be
/// kept in place of the real packs, and `repair index`, which goes by headers,
/// would find nothing in it). Empty when the header cannot be read.
pub(super) fn vouched(repo: &Repository, id: &PackId, size: u64) -> Result<HashSet<IndexBlob>> {
    match read_header(repo, id, size) {
        Ok(entries) => Ok(entries.into_iter().collect()),
        Err(e) if e.is_lost_data() => Ok(HashSet::new()),
        Err(e) => Err(e),
    }
}

/// The blob entries of a pack, from its own header.
pub fn read_header(
    repo: &Repository,
    id: &PackId,
    size: u64,
) -> Result<Vec<cairn_format::index::IndexBlob>> {
    repo.read_pack_header(id, size)
}

#[cfg(test)]
mod tests {
    use super::*;
    use cairn_format::IndexId;
    use cairn_format::pack;

    fn sid(n: u8) -> SnapshotId {
        SnapshotId([n; 32])
    }

    /// One prune with the default options, in its own session.
    fn prune_once(repo: Repository) -> (Repository, PruneReport) {
        let mut s: Session<Exclusive> = Session::open(
            repo,
            "prune",
            crate::session::IndexLoad::None,
            &Progress::none(),
        )
        .unwrap();
        let r = prune(&mut s, &PruneOptions::default()).unwrap();
        (s.into_repo(), r)
    }

    #[test]
    fn snapshot_records_survive_unless_gone_and_forgotten() {
        let file = IndexFile {
            snapshots: vec![sid(1), sid(2), sid(3), sid(4)],
            forgotten: vec![sid(2), sid(3), sid(9)],
            ..Default::default()
        };
        let state = IndexState {
            live: vec![(IndexId([0; 32]), file)],
            ..Default::default()
        };
        // 1 exists; 2 was forgotten and is gone; 3 was forgotten but still exists
        // (a forget in progress); 4 is gone without forget (evidence: keep); 9 is
        // forgotten, never recorded, gone.
        let listed: HashSet<SnapshotId> = [sid(1), sid(3)].into_iter().collect();
        let (ann, forgot) = carried_snapshot_records(&state, &listed);
        assert_eq!(ann, vec![sid(1), sid(3), sid(4)]);
        assert_eq!(forgot, vec![sid(3)]);
    }

    /// A pack two ready records name, retired by one and an orphan in the other
    /// (left so by a `repair index` or a rescue killed before it deleted the older
    /// record; found by the crash harness): deleted once, and the record read
    /// second does not fail on the header of the pack the first deleted.
    #[test]
    fn a_pack_named_by_two_ready_records_is_deleted_once() {
        use crate::testutil::{mem_repo, store};
        let repo = mem_repo();
        let p = store(
            &repo,
            &[(pack::BlobKind::Data, b"nobody needs this".to_vec())],
        );
        // Records are read in name order: the one retiring the pack must come first.
        for created in 0.. {
            let retiring = repo
                .write_pending(&PendingDeletion {
                    created,
                    packs: vec![p.clone()],
                    ..Default::default()
                })
                .unwrap();
            let orphaned = repo
                .write_pending(&PendingDeletion {
                    created,
                    orphans: vec![p.id],
                    ..Default::default()
                })
                .unwrap();
            if retiring.to_hex() < orphaned.to_hex() {
                break;
            }
            for id in [retiring, orphaned] {
                repo.backend()
                    .delete(&names::pending(&id.to_hex()))
                    .unwrap();
            }
        }
        let (repo, r) = prune_once(repo);
        assert_eq!(r.deleted_packs, 1, "{r:?}");
        assert!(repo.backend().get(&names::pack(&p.id.to_hex())).is_err());
        assert!(repo.list_pending().unwrap().is_empty());
    }

    /// A prune that retires more entries than a record holds writes several
    /// records (two entries each under test), each naming the lock it waits for;
    /// every retired pack is in exactly one, and all go once the lock is gone.
    #[test]
    fn many_retired_packs_are_recorded_in_bounded_records() {
        use crate::testutil::{mem_repo, store};
        let repo = mem_repo();
        let packs: Vec<IndexPack> = (0..5u8)
            .map(|n| store(&repo, &[(pack::BlobKind::Data, vec![n; 100])]))
            .collect();
        repo.write_index_file(&IndexFile {
            packs: packs.clone(),
            ..Default::default()
        })
        .unwrap();
        let other = RepoLock::acquire(&repo, "backup", false).unwrap();
        let (repo, r) = prune_once(repo);
        assert_eq!(r.deleted_packs, 0, "{r:?}");
        let mut named = Vec::new();
        let ids = repo.list_pending().unwrap();
        assert_eq!(ids.len(), 3, "5 entries, 2 a record");
        for id in &ids {
            let rec = repo.read_pending(id).unwrap();
            assert_eq!(rec.locks, vec![other.id()]);
            assert!(rec.packs.iter().map(|p| p.blobs.len()).sum::<usize>() <= 2);
            named.extend(rec.packs.into_iter().map(|p| p.id));
        }
        named.sort();
        let mut want: Vec<PackId> = packs.iter().map(|p| p.id).collect();
        want.sort();
        assert_eq!(named, want);
        // Check and stats read the waiting records streamed, entries and all:
        // every retired pack is found whole, and counted as blobs and header.
        let mut s: Session<crate::session::Read> = Session::open(
            repo,
            "check",
            crate::session::IndexLoad::Deferred,
            &Progress::none(),
        )
        .unwrap();
        let opts = crate::ops::check::CheckOptions {
            read_data: true,
            ..Default::default()
        };
        let c = crate::ops::check::check(&mut s, &opts).unwrap();
        assert!(c.problems.is_empty(), "{:?}", c.problems);
        assert_eq!((c.pending_deletions, c.packs_read), (3, 5));
        let st = crate::ops::stats::stats(&s, None).unwrap();
        let stored: u64 = s.repo().list_packs().unwrap().values().sum();
        let listed: u64 = packs
            .iter()
            .flat_map(|p| &p.blobs)
            .map(|b| u64::from(b.length))
            .sum();
        assert_eq!(st.overhead.unused_bytes, listed, "{st:?}");
        assert_eq!(
            st.overhead.unused_bytes + st.overhead.pack_header_bytes,
            stored
        );
        let repo = s.into_repo();
        // Another prune while the records wait: nothing to delete yet, and no
        // reason to write the index again.
        let (repo, r) = prune_once(repo);
        assert_eq!((r.deleted_packs, r.new_index_files), (0, 0), "{r:?}");
        assert_eq!(r.plan.index_files_replaced, 0, "{r:?}");
        drop(other);
        let (repo, r) = prune_once(repo);
        assert_eq!(r.deleted_packs, 5, "{r:?}");
        assert!(repo.list_pending().unwrap().is_empty());
        for p in &packs {
            assert!(repo.backend().get(&names::pack(&p.id.to_hex())).is_err());
        }
    }

    #[test]
    fn a_pack_named_by_a_waiting_record_stays() {
        use crate::testutil::{mem_repo, store};
        let repo = mem_repo();
        let p = store(
            &repo,
            &[(pack::BlobKind::Data, b"nobody needs this".to_vec())],
        );
        let name = names::pack(&p.id.to_hex());
        // Another operation is running and waits on the second record.
        let other = RepoLock::acquire(&repo, "backup", false).unwrap();
        for locks in [vec![], vec![other.id()]] {
            repo.write_pending(&PendingDeletion {
                locks,
                packs: vec![p.clone()],
                ..Default::default()
            })
            .unwrap();
        }
        let (repo, r) = prune_once(repo);
        assert_eq!(r.deleted_packs, 0, "{r:?}");
        assert!(repo.backend().get(&name).is_ok());
        assert_eq!(
            repo.list_pending().unwrap().len(),
            1,
            "the ready record went"
        );
        drop(other);
        let (repo, r) = prune_once(repo);
        assert_eq!(r.deleted_packs, 1, "{r:?}");
        assert!(repo.backend().get(&name).is_err());
        assert!(repo.list_pending().unwrap().is_empty());
    }
}
