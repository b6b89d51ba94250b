//! Repair: rebuild the index from the packs themselves, and rewrite snapshots so
//! they keep everything that can still be restored.
//!
//! `repair index` reads every pack whole and indexes each blob that decrypts and
//! hashes to its id. A pack whose header is damaged is salvaged with the entries the
//! old index (or a pending record) had for it. Blobs that fail verification are
//! left out, so afterwards the index lists only good data and `repair snapshots` can
//! tell what is lost by looking it up.
//!
//! `repair snapshots` walks every snapshot; a file that needs a missing blob is
//! dropped, a directory whose tree is unreadable becomes empty, and each changed
//! snapshot is written again (tagged `repaired`, naming the original) before the
//! original is deleted. Everything dropped is reported by path.
//!
//! `recover` (restic's) gives back what a mistaken `forget`, or a snapshot object
//! lost on its own, left without a snapshot: every directory tree that no other tree
//! and no snapshot refers to, gathered under one new snapshot, until a prune
//! removes such trees.

use crate::error::{Error, Result};
use crate::index::{IdMap, IdSet, MasterIndex};
use crate::progress::Phase;
use crate::repo::Repository;
use crate::repo::blob::{self, BlobEncoder};
use crate::repo::packer::{BufferPool, Packer};
use crate::session::{Exclusive, Session};
use crate::tree::chunklist::{
    ChunkListBuilder, Piece, for_each_chunk_or_gap, for_each_content_blob,
};
use crate::tree::walk::Visitor;
use cairn_backend::names;
use cairn_format::consts::MAX_PACK_SIZE;
use cairn_format::consts::PACK_TRAILER_LEN;
use cairn_format::index::{IndexBlob, IndexFile, IndexPack};
use cairn_format::pack::{self, BlobKind};
use cairn_format::snapshot::ImageInfo;
use cairn_format::tree::{ChunkList, ChunkRef, Content, Node, NodeKind, Tree};
use cairn_format::{BlobId, IndexId, PackId, SnapshotId};
use std::collections::{HashMap, HashSet};
use std::sync::Arc;

#[derive(Clone, Debug, Default, serde::Serialize)]
pub struct DamagedPack {
    pub pack: String,
    pub message: String,
    /// Blobs its header lists that fail verification and that no other pack
    /// holds whole.
    pub blobs_lost: usize,
    pub blobs_kept: usize,
    /// Blobs its header lists that fail verification here but another pack
    /// holds whole: a damaged or false copy, nothing lost (a client holding the
    /// key can store a pack of junk under the ids of blobs stored already).
    pub blobs_held_elsewhere: usize,
    /// The ids of the blobs that failed, one per failed entry.
    #[serde(skip)]
    failed: Vec<BlobId>,
}

#[derive(Clone, Debug, Default, serde::Serialize)]
pub struct RepairIndexReport {
    pub packs_read: usize,
    pub blobs_indexed: usize,
    pub damaged_packs: Vec<DamagedPack>,
    pub index_files_replaced: usize,
    pub index_files_written: usize,
    pub pending_records_dropped: usize,
    /// Damaged packs whose good blobs were copied to new packs and that were deleted
    /// (else they wait for the next prune).
    pub damaged_packs_deleted: usize,
    /// Nothing was written: what the repair would do (`--dry-run`).
    pub dry_run: bool,
    /// Packs the old index listed that the storage does not hold (deleted or
    /// lost behind cairn's back), with the blobs it said they held: those are
    /// not indexed any more (QA: they were dropped without a word).
    pub missing_packs: Vec<MissingPack>,
    /// Whole packs the old index placed blobs in that their headers do not list
    /// (an index file that lies): the rebuilt index drops those entries, since a
    /// pack's header is the word on what it holds.
    pub false_claims: Vec<FalseClaims>,
}

#[derive(Clone, Debug, serde::Serialize)]
pub struct FalseClaims {
    pub pack: String,
    /// Blobs the old index placed in the pack that its header does not list.
    pub entries: usize,
    /// Of those, the blobs no other pack holds either: lost to the snapshots
    /// that need them (the rest are whole elsewhere, nothing lost).
    pub blobs_lost: usize,
}

#[derive(Clone, Debug, serde::Serialize)]
pub struct MissingPack {
    pub pack: String,
    pub blobs_lost: usize,
}

/// The packs the live index files list, with how many blobs each, read along
/// the stream of the old index ([`old_index`]).
#[derive(Default)]
struct OldPacks {
    by_file: HashMap<IndexId, Vec<(PackId, usize)>>,
    /// Packs a pending-deletion record names: a prune took them out already,
    /// so their absence is no loss.
    retired: HashSet<PackId>,
}

/// Reads the old index state for a repair, keeping which packs its live files
/// list (a pack id and a count each, not their entries).
fn old_index(repo: &Repository) -> Result<(crate::repo::IndexState, OldPacks)> {
    let mut old = OldPacks::default();
    let state = repo.read_index_state_streamed(
        &mut |id, f| {
            old.by_file
                .insert(*id, f.packs.iter().map(|p| (p.id, p.blobs.len())).collect());
            Ok(())
        },
        &mut |_, r| {
            old.retired.extend(r.packs.iter().map(|p| p.id));
            old.retired.extend(r.orphans.iter().copied());
            Ok(())
        },
    )?;
    Ok((state, old))
}

impl OldPacks {
    /// How many blobs the old index's live files place in each pack (the most
    /// any one file does: a pack is listed whole where it is listed).
    fn claims(&self, superseded: &[IndexId]) -> OldClaims {
        let superseded: HashSet<IndexId> = superseded.iter().copied().collect();
        let mut claimed: HashMap<PackId, usize> = HashMap::new();
        for (file, packs) in &self.by_file {
            if superseded.contains(file) {
                continue;
            }
            for (id, blobs) in packs {
                let n = claimed.entry(*id).or_default();
                *n = (*n).max(*blobs);
            }
        }
        OldClaims {
            claimed,
            superseded,
        }
    }

    /// The packs the old index's live files list that are not in `stored`.
    fn missing(self, superseded: &[IndexId], stored: &HashSet<PackId>) -> Vec<MissingPack> {
        let superseded: HashSet<&IndexId> = superseded.iter().collect();
        let mut lost: HashMap<PackId, usize> = HashMap::new();
        for (file, packs) in self.by_file {
            if superseded.contains(&file) {
                continue;
            }
            for (id, blobs) in packs {
                if !stored.contains(&id) && !self.retired.contains(&id) {
                    let n = lost.entry(id).or_default();
                    *n = (*n).max(blobs);
                }
            }
        }
        let mut v: Vec<MissingPack> = lost
            .into_iter()
            .map(|(id, blobs_lost)| MissingPack {
                pack: id.to_hex(),
                blobs_lost,
            })
            .collect();
        v.sort_by(|a, b| a.pack.cmp(&b.pack));
        v
    }
}

/// Index entries per file the rebuilt index is written in.
const REPAIR_FILE_BLOBS: usize = 200_000;

/// What `repair index` would do, without writing or deleting anything: every
/// pack is read and checked as the repair reads it (the damaged ones, what of
/// them could be kept), and the index files and pending records it would replace
/// are counted. A shared lock: other commands go on meanwhile.
pub fn plan_repair_index(session: &Session<crate::session::Read>) -> Result<RepairIndexReport> {
    let progress = session.progress().clone();
    progress.phase(Phase::RebuildingIndex);
    let repo = session.repo();
    let mut report = RepairIndexReport {
        dry_run: true,
        ..Default::default()
    };
    let old_ids = repo.list_index_files()?;
    let (old_state, old_packs) = old_index(repo)?;
    let old = old_packs.claims(&old_state.superseded);
    report.pending_records_dropped = repo.list_pending()?.len();
    let mut blobs = 0usize;
    let (rewrite, stored) = read_every_pack(repo, &progress, &mut report, &old, &mut |_, b| {
        blobs += b.len();
        Ok(())
    })?;
    report.missing_packs = old_packs.missing(&old_state.superseded, &stored);
    report.blobs_indexed += rewrite.iter().map(|p| p.blobs.len()).sum::<usize>();
    let mut supersedes: Vec<IndexId> = old_ids;
    supersedes.extend(old_state.superseded.iter().copied());
    supersedes.sort();
    supersedes.dedup();
    report.index_files_replaced = supersedes.len();
    // As the repair writes them: full files of `REPAIR_FILE_BLOBS`, the last one
    // (with the snapshot records and the switch) whatever is left; damaged packs'
    // good blobs in the files of the packs they are copied to.
    report.index_files_written = blobs / REPAIR_FILE_BLOBS + 1 + usize::from(!rewrite.is_empty());
    Ok(report)
}

/// Reads and checks every stored pack for `repair index`, a batch at a time:
/// `good` gets each whole pack's blobs (not an empty one's); the damaged ones
/// are salvaged with what the old index said of them and returned (their good
/// blobs, to be copied to new packs), each reported in `report`. Counts
/// `packs_read` and `blobs_indexed`.
fn read_every_pack(
    repo: &Repository,
    progress: &crate::progress::Progress,
    report: &mut RepairIndexReport,
    old: &OldClaims,
    good: &mut dyn FnMut(PackId, Vec<IndexBlob>) -> Result<()>,
) -> Result<(Vec<IndexPack>, HashSet<PackId>)> {
    let mut packs: Vec<(PackId, u64)> = repo.list_packs()?.into_iter().collect();
    packs.sort();
    let stored: HashSet<PackId> = packs.iter().map(|(id, _)| *id).collect();
    report.packs_read = packs.len();
    progress.set_total(Some(packs.iter().map(|(_, s)| s).sum()), None);
    let mut rewrite = Vec::new();
    // Damaged packs (a header that cannot be read, or blobs that fail): salvaged
    // below with the old index's word too.
    let mut damaged: Vec<PackId> = Vec::new();
    // Whole packs the old index may claim too much of, with their headers' blobs.
    let mut suspects: HashMap<PackId, HashSet<BlobId>> = HashMap::new();
    let batch = 4 * crate::threads::cores();
    for part in packs.chunks(batch) {
        // Stopping is safe until the last file supersedes the old ones: the files
        // written so far only list packs the old index lists too.
        progress.check_cancelled()?;
        let salvaged = crate::threads::parallel_map(part, crate::threads::cores(), |(id, _)| {
            salvage_pack(repo, id, None)
        });
        for ((id, size), r) in part.iter().zip(salvaged) {
            progress.bytes_done(*size);
            let (blobs, damage) = r?;
            match damage {
                Some(_) => damaged.push(*id),
                None => {
                    // More blobs in the old index than in the header: some entry
                    // names a blob this pack does not hold.
                    if old.claimed.get(id).is_some_and(|&c| c > blobs.len()) {
                        suspects.insert(*id, blobs.iter().map(|b| b.id).collect());
                    }
                    if !blobs.is_empty() {
                        report.blobs_indexed += blobs.len();
                        good(*id, blobs)?;
                    }
                }
            }
        }
    }
    if !damaged.is_empty() {
        // What the old index (files and pending records) said of each such pack:
        // the salvage plan when its header cannot be read, and blobs its header
        // does not list (a header that lies, or is damaged) that decode where the
        // index places them. The files written above list none of them.
        let wanted: HashSet<PackId> = damaged.iter().copied().collect();
        let known = std::cell::RefCell::new(HashMap::<PackId, Vec<IndexBlob>>::new());
        let take = |ps: &[IndexPack]| {
            let mut k = known.borrow_mut();
            for p in ps.iter().filter(|p| wanted.contains(&p.id)) {
                k.entry(p.id).or_default().extend(p.blobs.iter().copied());
            }
        };
        index_packs_streamed(repo, &take)?;
        let known = known.into_inner();
        for id in damaged {
            let (blobs, damage) = salvage_pack(repo, &id, known.get(&id).map(Vec::as_slice))?;
            if let Some(d) = damage {
                report.damaged_packs.push(d);
            }
            // A damaged pack's good blobs move to new packs, so that afterwards
            // every stored pack is whole again.
            rewrite.push(IndexPack { id, blobs });
        }
        held_elsewhere(repo, &packs, &wanted, &rewrite, report)?;
    }
    let damaged: HashSet<PackId> = rewrite.iter().map(|p| p.id).collect();
    false_claims(repo, &packs, &suspects, &damaged, &rewrite, old, report)?;
    Ok((rewrite, stored))
}

/// What the old index said, for [`read_every_pack`]'s check of its claims.
struct OldClaims {
    /// Blobs per pack ([`OldPacks::claims`]).
    claimed: HashMap<PackId, usize>,
    /// Index files other files superseded: their word no longer counts.
    superseded: HashSet<IndexId>,
}

/// Finds the entries of the old index's live files that place a blob in a
/// whole pack whose header does not list it, for the packs `suspects` names
/// (with the blobs each one's header lists), and which of those blobs no pack
/// holds: those are lost to the snapshots that need them, the rest whole
/// elsewhere. Such entries are dropped by the rebuild, which indexes what the
/// headers list; before, they were dropped without a word. Two more streams
/// of the old index, only when some pack is suspect.
fn false_claims(
    repo: &Repository,
    packs: &[(PackId, u64)],
    suspects: &HashMap<PackId, HashSet<BlobId>>,
    damaged: &HashSet<PackId>,
    rewrite: &[IndexPack],
    old: &OldClaims,
    report: &mut RepairIndexReport,
) -> Result<()> {
    if suspects.is_empty() {
        return Ok(());
    }
    let mut unheld = HashMap::<PackId, HashSet<BlobId>>::new();
    repo.read_index_state_streamed(
        &mut |id, f| {
            if old.superseded.contains(id) {
                return Ok(());
            }
            for p in &f.packs {
                if let Some(header) = suspects.get(&p.id) {
                    for b in p.blobs.iter().filter(|b| !header.contains(&b.id)) {
                        unheld.entry(p.id).or_default().insert(b.id);
                    }
                }
            }
            Ok(())
        },
        &mut |_, _| Ok(()),
    )?;
    if unheld.is_empty() {
        return Ok(());
    }
    let wanted: HashSet<BlobId> = unheld.values().flatten().copied().collect();
    // Held: listed by a suspect's header, among a damaged pack's good blobs
    // (copied to new packs), or in another whole pack where the old index
    // places it and whose header lists it.
    let mut held: HashSet<BlobId> = (suspects.values().flatten())
        .chain(rewrite.iter().flat_map(|p| p.blobs.iter().map(|b| &b.id)))
        .filter(|id| wanted.contains(id))
        .copied()
        .collect();
    let sizes: HashMap<PackId, u64> = packs.iter().copied().collect();
    let claims = std::cell::RefCell::new(HashMap::<PackId, HashSet<BlobId>>::new());
    {
        let take = |ps: &[IndexPack]| {
            let mut c = claims.borrow_mut();
            for p in ps.iter().filter(|p| {
                sizes.contains_key(&p.id)
                    && !damaged.contains(&p.id)
                    && !suspects.contains_key(&p.id)
            }) {
                for b in
                    (p.blobs.iter()).filter(|b| wanted.contains(&b.id) && !held.contains(&b.id))
                {
                    c.entry(p.id).or_default().insert(b.id);
                }
            }
        };
        index_packs_streamed(repo, &take)?;
    }
    for (p, ids) in claims.into_inner() {
        // A pack whose header cannot be read now is not counted on.
        if let Ok(entries) = repo.read_pack_header(&p, sizes[&p]) {
            held.extend(entries.iter().map(|b| b.id).filter(|id| ids.contains(id)));
        }
    }
    let mut v: Vec<FalseClaims> = unheld
        .into_iter()
        .map(|(p, ids)| FalseClaims {
            pack: p.to_hex(),
            entries: ids.len(),
            blobs_lost: ids.iter().filter(|id| !held.contains(id)).count(),
        })
        .collect();
    v.sort_by(|a, b| a.pack.cmp(&b.pack));
    report.false_claims = v;
    Ok(())
}

/// Rebuilds the index from every stored pack. Memory stays bounded at any size:
/// packs are read a batch at a time and their entries written out as index files
/// go; the old index is streamed, once for its snapshot records and once more
/// only when a pack's header is unreadable, for what it said of those packs.
pub fn repair_index(session: &mut Session<Exclusive>) -> Result<RepairIndexReport> {
    let lock = session.lock()?;
    let progress = session.progress().clone();
    progress.phase(Phase::RebuildingIndex);
    let repo = session.repo_mut();
    let mut report = RepairIndexReport::default();
    let old_ids = repo.list_index_files()?;
    let (old_state, old_packs) = old_index(repo)?;
    let pending_ids = repo.list_pending()?;
    let mut file = IndexFile::default();
    let mut written = Vec::new();
    let mut n = 0;
    let old = old_packs.claims(&old_state.superseded);
    let (rewrite, stored) =
        read_every_pack(repo, &progress, &mut report, &old, &mut |id, blobs| {
            n += blobs.len();
            file.packs.push(IndexPack { id, blobs });
            if n >= REPAIR_FILE_BLOBS {
                written.push(repo.write_index_file(&std::mem::take(&mut file))?);
                n = 0;
            }
            Ok(())
        })?;
    report.missing_packs = old_packs.missing(&old_state.superseded, &stored);
    if !rewrite.is_empty() {
        let stats = copy_blobs(repo, &rewrite, true, &crate::progress::Progress::none())?;
        report.blobs_indexed += rewrite.iter().map(|p| p.blobs.len()).sum::<usize>();
        written.extend(stats.index_files);
    }
    // The last file supersedes every old one (damaged ones included): the switch to
    // the rebuilt index is a single write.
    let mut supersedes: Vec<IndexId> = old_ids.clone();
    supersedes.extend(old_state.superseded.iter().copied());
    supersedes.sort();
    supersedes.dedup();
    file.supersedes = supersedes.clone();
    // Snapshot records come from the old files that could still be read.
    let (announced, forgotten) = old_state.snapshot_records();
    file.snapshots = announced.into_iter().collect();
    file.snapshots.sort();
    file.forgotten = forgotten.into_iter().collect();
    file.forgotten.sort();
    // The switch and the deletions below only with a lock that cannot have looked
    // stale to another prune or repair.
    lock.check_fresh()?;
    written.push(repo.write_index_file(&file)?);
    crate::hooks::point("repair:index-written");
    report.index_files_written = written.len();
    report.index_files_replaced = supersedes.len();
    for id in &supersedes {
        if !written.contains(id) {
            match repo.delete_index_file(id) {
                Ok(()) => {}
                Err(Error::Backend(e)) if e.is_not_found() => {}
                Err(e) => return Err(e),
            }
            crate::hooks::point("repair:old-index-deleted");
        }
    }
    // Every stored pack is indexed now, so no pending record may delete one.
    for id in pending_ids {
        ignore_missing(repo.backend().delete(&names::pending(&id.to_hex())))?;
        report.pending_records_dropped += 1;
    }
    // Damaged packs: their good blobs have live copies now. Delete them at once if
    // nothing else runs; otherwise leave them to prune's two-phase deletion.
    if !rewrite.is_empty() {
        let others: Vec<[u8; 32]> = crate::repo::lock::list_locks(repo)?
            .into_iter()
            .filter(|l| l.id != lock.id() && !l.stale)
            .map(|l| l.id)
            .collect();
        if others.is_empty() {
            lock.check_fresh()?;
            for p in &rewrite {
                ignore_missing(repo.backend().delete(&names::pack(&p.id.to_hex())))?;
            }
            report.damaged_packs_deleted = rewrite.len();
        } else {
            repo.write_pending(&cairn_format::pending::PendingDeletion {
                created: crate::time::now_unix(),
                locks: others,
                packs: rewrite,
                orphans: vec![],
            })?;
        }
    }
    // The index of before is out of date; the next operation reads the new one.
    repo.set_index(&crate::repo::IndexState::default())?;
    Ok(report)
}

/// Records a snapshot as forgotten and deletes its object.
fn forget(repo: &Repository, id: SnapshotId) -> Result<()> {
    for (_, r) in repo.forget_snapshots(&[id])? {
        r?;
    }
    Ok(())
}

/// Errors that mean the data is gone (as opposed to storage being unreachable).
fn is_loss(e: &Error) -> bool {
    matches!(e, Error::Damaged { .. } | Error::BlobNotFound(_))
}

fn ignore_missing(r: cairn_backend::Result<()>) -> Result<()> {
    match r {
        Ok(()) => Ok(()),
        Err(e) if e.is_not_found() => Ok(()),
        Err(e) => Err(e.into()),
    }
}

/// Of the blobs that failed in damaged packs, counts those another pack holds
/// whole as held elsewhere, not lost (pentest: a backup token's pack of junk
/// under the ids of every stored blob had `repair index` say 624 blobs lost,
/// for intact data): found through the old index's word (where it places
/// them), then each such pack's own header, which lists only blobs that
/// verified in the pass above (a pack that is not `damaged`), or among the
/// good blobs of other damaged packs (`rewrite`). A copy the old index does not
/// name stays counted as lost: said too often, never too seldom.
fn held_elsewhere(
    repo: &Repository,
    packs: &[(PackId, u64)],
    damaged: &HashSet<PackId>,
    rewrite: &[IndexPack],
    report: &mut RepairIndexReport,
) -> Result<()> {
    let failed: HashSet<BlobId> = (report.damaged_packs.iter())
        .flat_map(|d| d.failed.iter().copied())
        .collect();
    if failed.is_empty() {
        return Ok(());
    }
    let sizes: HashMap<PackId, u64> = packs.iter().copied().collect();
    let claims = std::cell::RefCell::new(HashMap::<PackId, HashSet<BlobId>>::new());
    let take = |ps: &[IndexPack]| {
        let mut c = claims.borrow_mut();
        for p in ps
            .iter()
            .filter(|p| sizes.contains_key(&p.id) && !damaged.contains(&p.id))
        {
            for b in p.blobs.iter().filter(|b| failed.contains(&b.id)) {
                c.entry(p.id).or_default().insert(b.id);
            }
        }
    };
    index_packs_streamed(repo, &take)?;
    let mut held: HashSet<BlobId> = (rewrite.iter())
        .flat_map(|p| p.blobs.iter().map(|b| b.id))
        .filter(|id| failed.contains(id))
        .collect();
    for (p, ids) in claims.into_inner() {
        // A pack whose header cannot be read now is not counted on.
        if let Ok(entries) = repo.read_pack_header(&p, sizes[&p]) {
            held.extend(entries.iter().map(|b| b.id).filter(|id| ids.contains(id)));
        }
    }
    for d in &mut report.damaged_packs {
        let n = d.failed.iter().filter(|id| held.contains(id)).count();
        d.blobs_lost = d.failed.len() - n;
        d.blobs_held_elsewhere = n;
    }
    Ok(())
}

/// Gives `take` the packs each index file and pending-deletion record lists,
/// one object at a time (the index is never held whole).
fn index_packs_streamed(repo: &Repository, take: &dyn Fn(&[IndexPack])) -> Result<()> {
    repo.read_index_state_streamed(
        &mut |_, f| {
            take(&f.packs);
            Ok(())
        },
        &mut |_, r| {
            take(&r.packs);
            Ok(())
        },
    )
    .map(|_| ())
}

type Salvaged = (Vec<IndexBlob>, Option<DamagedPack>);

/// The verified blobs of one pack, and what is wrong with it if anything: those
/// its header lists, and those `known` (the old index) places in it that decode
/// there. Only blobs the header lists (all of `known` when it cannot be read)
/// count as lost when they fail: an index entry that names a blob a pack does not
/// hold is a false claim, not lost data.
fn salvage_pack(repo: &Repository, id: &PackId, known: Option<&[IndexBlob]>) -> Result<Salvaged> {
    let data = match repo
        .backend()
        .get_bounded(&names::pack(&id.to_hex()), MAX_PACK_SIZE)
    {
        Ok(d) => d,
        Err(e) if e.is_not_found() => return Ok((vec![], None)),
        // Larger than any pack cairn writes: nothing in it can be trusted, and
        // reading it whole could exhaust memory.
        // Or something that is not a file in its place (a FIFO): nothing to read.
        Err(e)
            if matches!(
                e.kind,
                cairn_backend::BackendErrorKind::TooLarge
                    | cairn_backend::BackendErrorKind::NotAFile
            ) =>
        {
            let damage = DamagedPack {
                pack: id.to_hex(),
                message: if e.kind == cairn_backend::BackendErrorKind::TooLarge {
                    format!("larger than any pack ({})", e.message)
                } else {
                    e.message
                },
                blobs_lost: known.map_or(0, <[IndexBlob]>::len),
                failed: known.map_or(Vec::new(), |k| k.iter().map(|b| b.id).collect()),
                ..Default::default()
            };
            return Ok((vec![], Some(damage)));
        }
        Err(e) => return Err(e.into()),
    };
    let mut problems = Vec::new();
    if PackId::of_content(&data) != *id {
        problems.push("content does not match its name".to_string());
    }
    let (entries, listed) = match header_entries(repo, &data) {
        Ok(mut e) => {
            let listed = e.len();
            if let Some(k) = known {
                let have: HashSet<IndexBlob> = e.iter().copied().collect();
                let mut extra: Vec<IndexBlob> =
                    k.iter().filter(|b| !have.contains(b)).copied().collect();
                extra.sort_by_key(|b| (b.offset, b.id));
                extra.dedup();
                e.extend(extra);
            }
            (e, listed)
        }
        Err(e) => {
            problems.push(format!("header unreadable ({e})"));
            let mut k = known.map(<[IndexBlob]>::to_vec).unwrap_or_default();
            k.sort_by_key(|b| (b.offset, b.id));
            k.dedup();
            let n = k.len();
            (k, n)
        }
    };
    let mut good = Vec::with_capacity(entries.len());
    let mut failed = Vec::new();
    let mut seen = IdSet::default();
    for (i, b) in entries.into_iter().enumerate() {
        let start = b.offset as usize;
        let ok = data.get(start..start + b.length as usize).is_some_and(|s| {
            blob::decode(repo.key(), &b.id, s, b.raw_length, b.compression).is_ok()
        });
        if ok {
            if seen.insert(b.id) {
                good.push(b);
            }
        } else if i < listed {
            failed.push(b.id);
        }
    }
    let lost = failed.len();
    if lost > 0 {
        problems.push(format!(
            "{} verification",
            if lost == 1 {
                "1 blob fails".to_string()
            } else {
                format!("{lost} blobs fail")
            }
        ));
    }
    let damage = (!problems.is_empty()).then(|| DamagedPack {
        pack: id.to_hex(),
        message: problems.join("; "),
        blobs_lost: lost,
        blobs_kept: good.len(),
        blobs_held_elsewhere: 0,
        failed,
    });
    Ok((good, damage))
}

fn header_entries(repo: &Repository, data: &[u8]) -> Result<Vec<IndexBlob>> {
    let size = data.len() as u64;
    let trailer = data
        .get(data.len().saturating_sub(PACK_TRAILER_LEN)..)
        .unwrap_or(&[]);
    let (off, len) =
        pack::parse_trailer(size, trailer).map_err(|e| Error::damaged("pack trailer", e))?;
    let sealed = data
        .get(off as usize..(off + u64::from(len)) as usize)
        .ok_or_else(|| Error::Invalid("header outside the pack".into()))?;
    let plain = repo
        .key()
        .sealer
        .open("pack header", sealed)
        .map_err(|e| Error::damaged("pack header", e))?;
    let entries = pack::decode_header(&plain).map_err(|e| Error::damaged("pack header", e))?;
    Ok(IndexBlob::from_header(entries))
}

#[derive(Clone, Debug, Default, serde::Serialize)]
pub struct RepairedSnapshot {
    pub original: String,
    /// `None` when the snapshot was removed (its root tree is lost).
    pub new: Option<String>,
    /// What the repaired snapshot lost.
    pub dropped: Vec<Dropped>,
}

/// A path a repair dropped from a snapshot (or kept in another form), and why:
/// two fields, so that a script reading `--json` need not split a sentence whose
/// path may itself hold parentheses.
#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize)]
pub struct Dropped {
    /// From the snapshot's root, `/` first; a directory's ends with `/`.
    pub path: String,
    pub why: String,
    /// The path is still in the snapshot, with what was lost of it given another
    /// way (an image's lost blocks as zeros, a directory kept empty): not
    /// dropped (QA: an image kept with zeros was said to be "dropped").
    #[serde(skip_serializing_if = "std::ops::Not::not")]
    pub kept: bool,
}

impl Dropped {
    fn new(path: impl Into<String>, why: impl Into<String>) -> Self {
        Dropped {
            path: path.into(),
            why: why.into(),
            kept: false,
        }
    }

    fn kept(path: impl Into<String>, why: impl Into<String>) -> Self {
        Dropped {
            kept: true,
            ..Dropped::new(path, why)
        }
    }

    /// The same loss seen from `prefix`, the directory above.
    fn under(&self, prefix: &str) -> Self {
        Dropped {
            path: format!("{prefix}{}", self.path),
            ..self.clone()
        }
    }
}

impl std::fmt::Display for Dropped {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{} ({})", self.path, self.why)
    }
}

#[derive(Clone, Debug, Default, serde::Serialize)]
pub struct RepairSnapshotsReport {
    pub snapshots_checked: usize,
    pub repaired: Vec<RepairedSnapshot>,
    /// Snapshot objects that were read and found damaged, removed.
    pub unreadable_removed: Vec<String>,
    /// Snapshot objects that could not be read for another reason (this user may
    /// not read them, a newer cairn wrote them): left as they are, with what to
    /// do. The repair is not complete while there are any.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub unreadable_kept: Vec<String>,
    /// Snapshots deleted from storage behind cairn's back, now recorded as lost.
    pub vanished_recorded: Vec<String>,
    /// Host records that could not be carried to a rewritten snapshot, with why.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub warnings: Vec<String>,
    pub dry_run: bool,
}

/// Rewrites snapshots that need missing or unreadable blobs.
pub fn repair_snapshots(
    session: &mut Session<Exclusive>,
    dry_run: bool,
) -> Result<RepairSnapshotsReport> {
    let lock = session.lock()?;
    let progress = session.progress().clone();
    run_snapshots(session.repo_mut(), Some(&lock), &progress, dry_run)
}

/// What [`repair_snapshots`] would do, changing nothing: a read session is
/// enough, so that it works where no lock can be written (a damaged repository
/// mounted read-only, which is when it is wanted).
pub fn plan_repair_snapshots(
    session: &mut Session<crate::session::Read>,
) -> Result<RepairSnapshotsReport> {
    let progress = session.progress().clone();
    run_snapshots(session.repo_mut(), None, &progress, true)
}

/// `lock`: held unless `dry_run`.
fn run_snapshots(
    repo: &mut Repository,
    lock: Option<&crate::repo::lock::RepoLock>,
    progress: &crate::progress::Progress,
    dry_run: bool,
) -> Result<RepairSnapshotsReport> {
    let lock = || lock.ok_or_else(|| Error::Invalid("repair snapshots: no lock held".into()));
    super::needs_every_snapshot(repo, "repair snapshots")?;
    progress.phase(Phase::WalkingSnapshots);
    // Snapshots first, then the index: a backup committing in between must not
    // look like one whose data is lost.
    let (snaps, bad) = repo.snapshots()?;
    // The index in its placement (on local disk with the SSD placement), and the
    // files' snapshot records without their entries.
    repo.load_index()?;
    let state = repo.read_index_state_streamed(&mut |_, _| Ok(()), &mut |_, _| Ok(()))?;
    let (announced, forgotten) = state.snapshot_records();
    let mut report = RepairSnapshotsReport {
        dry_run,
        ..Default::default()
    };
    let stored: HashSet<PackId> = repo.list_packs()?.into_keys().collect();
    let index = repo.index().clone();
    let present = in_stored_packs(&index, &stored);
    let mut rw = Rewriter::new(repo, &present, &index);
    rw.salvage_files = true;
    report.snapshots_checked = snaps.len() + bad.len();
    let mut changed = Vec::new();
    for (sid, snap) in &snaps {
        let mut dropped = Vec::new();
        let root = snap
            .tree_id()
            .map_err(|e| Error::damaged(format!("snapshot {}", sid.to_hex()), e))?;
        // What a newer cairn wrote is not damage, and not this repair's to drop.
        let newer = |e: Error| match e {
            Error::NewerFormat { .. } => Error::Invalid(format!(
                "snapshot {sid} cannot be read whole: {e}; repair leaves it as it is: upgrade cairn, or \
                 `cairn forget {sid}` removes it",
                sid = sid.to_hex()
            )),
            e => e,
        };
        // An image is one file of many blocks: a lost block is given as zeros
        // and recorded as unreadable, as a read error at backup would be, not
        // the whole image dropped.
        if let Some(info) = &snap.image {
            match rw.image(info, &root).map_err(newer)? {
                ImageFix::Intact => continue,
                ImageFix::Repaired {
                    root: new_root,
                    name,
                    lost,
                } => {
                    let bytes: u64 = lost.iter().map(|r| r.1).sum();
                    dropped.push(Dropped::kept(
                        format!("/{name}"),
                        format!(
                            "{} of its blocks in {} lost: now zeros, recorded as unreadable",
                            crate::units::bytes(bytes, 0),
                            if lost.len() == 1 {
                                "1 range".to_string()
                            } else {
                                format!("{} ranges", lost.len())
                            }
                        ),
                    ));
                    let mut snap = snap.clone();
                    if let Some(i) = snap.image.as_mut() {
                        i.unreadable = crate::ops::image::merge_ranges(
                            i.unreadable.iter().copied().chain(lost),
                        );
                    }
                    changed.push((*sid, snap, Some(new_root), dropped));
                    continue;
                }
                ImageFix::AsFiles => {}
            }
        }
        match rw.tree(&root, "", &mut dropped).map_err(newer)? {
            Some(new_root) if new_root == root => {}
            Some(new_root) => changed.push((*sid, snap.clone(), Some(new_root), dropped)),
            None => {
                dropped.push(Dropped::new(
                    "/",
                    "root tree unreadable; the directories below it may be whole: \
                     `cairn recover` finds them",
                ));
                changed.push((*sid, snap.clone(), None, dropped));
            }
        }
    }
    // Packs that no readable index lists (an index file lost or damaged) may hold
    // what these files lack: dropped now, they would be lost for good, and the
    // next prune would delete the packs (QA: `check` advised this repair after an
    // index file was deleted, and it emptied every snapshot). `repair index`
    // reads them back first. (Leftovers of an interrupted backup count too: the
    // repair needs them looked at only when it would drop something.)
    if !changed.is_empty() {
        let indexed: HashSet<PackId> = index.packs().iter().copied().collect();
        let orphans: HashSet<PackId> = (state.pending.iter())
            .flat_map(|(_, p)| p.orphans.iter().copied())
            .collect();
        let unindexed = (stored.iter())
            .filter(|p| !indexed.contains(p) && !orphans.contains(p))
            .count();
        if unindexed > 0 {
            return Err(Error::Invalid(format!(
                "{} would lose data, but {} stored {} in no readable index and may hold \
                 it: run `cairn repair index` first (it reads them back into the index), \
                 then `cairn check` again{}",
                crate::units::count(changed.len() as u64, "snapshot"),
                crate::units::count(unindexed as u64, "pack"),
                if unindexed == 1 { "is" } else { "are" },
                if dry_run { "" } else { "; nothing was changed" }
            )));
        }
    }
    let new_trees = std::mem::take(&mut rw.new_trees);
    // The new trees by id, to add up the repaired snapshots' sizes (the index in
    // memory does not know them yet).
    let written: HashMap<BlobId, Vec<u8>> = new_trees.iter().cloned().collect();
    if !dry_run && !rw.new_blobs.is_empty() {
        store_blobs(rw.repo, std::mem::take(&mut rw.new_blobs))?;
    }
    if !dry_run && !new_trees.is_empty() {
        store_trees(rw.repo, new_trees)?;
    }
    let repo = rw.repo;
    // Replaced or removed here: gone from storage by this repair's own doing, not
    // "deleted without forget".
    let mut handled: HashSet<SnapshotId> = HashSet::new();
    for (sid, mut snap, new_root, dropped) in changed {
        handled.insert(sid);
        let mut entry = RepairedSnapshot {
            original: sid.to_hex(),
            new: None,
            dropped,
        };
        if let Some(root) = new_root {
            snap.tree = root.to_hex();
            // The files dropped no longer count in the snapshot's size (nor in
            // `stats`, which adds these up).
            snap.summary.total_bytes = file_bytes(repo, &root, &written)?;
            if !crate::repo::is_repaired(&snap) {
                snap.tags.push(crate::repo::REPAIRED_TAG.into());
            }
            // The first snapshot of a chain of rewrites (tags, repairs) stays named.
            snap.original = Some(snap.original.clone().unwrap_or_else(|| sid.to_hex()));
            // A repair killed after storing this snapshot's replacement but before
            // forgetting it: the replacement is there already (same chain, tree,
            // time, host and paths); it is not stored twice.
            let done_before = crate::repo::existing_replacement(&snaps, &sid, &snap);
            if let (false, Some(existing)) = (dry_run, done_before.as_ref()) {
                // Its server records may not have been carried before the kill.
                if let Err(e) = repo.carry_server_records(&sid, existing) {
                    report.warnings.push(format!(
                        "snapshot {}: its records from cairn serve were not carried over ({e}); a \
                         host-bound token no longer sees it",
                        existing.short()
                    ));
                }
                entry.new = Some(existing.to_hex());
            } else if !dry_run {
                let new_id = repo.write_snapshot(&snap, lock()?)?;
                if let Err(e) = repo.carry_server_records(&sid, &new_id) {
                    report.warnings.push(format!(
                        "snapshot {}: its records from cairn serve were not carried over ({e}); a \
                         host-bound token no longer sees it",
                        new_id.short()
                    ));
                }
                entry.new = Some(new_id.to_hex());
            }
        }
        if !dry_run {
            forget(repo, sid)?;
        }
        report.repaired.push(entry);
    }
    for e in bad {
        handled.insert(e.id);
        // Only what was read and found damaged goes: an object that could not be
        // read (permissions, a newer format) may be a good snapshot.
        if !e.is_damage() {
            report
                .unreadable_kept
                .push(format!("{}: {}; {}", e.id.to_hex(), e.error, e.advice()));
            continue;
        }
        if !dry_run {
            lock()?.check_fresh()?;
            forget(repo, e.id)?;
        }
        report
            .unreadable_removed
            .push(format!("{}: {}", e.id.to_hex(), e.error));
    }
    // Snapshots recorded as committed whose object is gone: nothing can bring them
    // back; record them as forgotten so that check stops reporting them.
    let present: HashSet<SnapshotId> = repo.list_snapshot_ids()?.into_iter().collect();
    let mut vanished: Vec<SnapshotId> = announced
        .iter()
        .filter(|id| !present.contains(*id) && !forgotten.contains(*id) && !handled.contains(*id))
        .copied()
        .collect();
    vanished.sort();
    for id in vanished {
        if !dry_run {
            forget(repo, id)?;
        }
        report.vanished_recorded.push(id.to_hex());
    }
    Ok(report)
}

/// The bytes of the regular files in the tree `root` (what a snapshot's
/// `total_bytes` records); trees in `new` are taken from there, others read.
pub(crate) fn file_bytes(
    repo: &Repository,
    root: &BlobId,
    new: &HashMap<BlobId, Vec<u8>>,
) -> Result<u64> {
    let mut total = 0u64;
    let mut todo = vec![*root];
    while let Some(id) = todo.pop() {
        let tree = match new.get(&id) {
            Some(data) => {
                Tree::decode(data).map_err(|e| Error::damaged(format!("tree {}", id.short()), e))?
            }
            None => repo.load_tree(&id)?,
        };
        for n in tree.nodes {
            match n.kind {
                NodeKind::File => total += n.size,
                NodeKind::Dir => todo.extend(n.subtree),
                _ => {}
            }
        }
    }
    Ok(total)
}

struct Rewriter<'a, F: Fn(&BlobId) -> bool> {
    repo: &'a Repository,
    /// The tree whose walk is running (the root has no node to tell it).
    root: Option<BlobId>,
    present: &'a F,
    index: &'a MasterIndex,
    /// Tree id -> its repaired id (`None`: unreadable).
    memo: IdMap<(Option<BlobId>, Vec<Dropped>)>,
    new_trees: Vec<(BlobId, Vec<u8>)>,
    new_ids: IdSet,
    /// Data and chunk-list blobs an image's repair needs stored (its zero blocks,
    /// its lists with them), and those of the files salvaged.
    new_blobs: Vec<(BlobKind, BlobId, Vec<u8>)>,
    /// Whether a file that lost part of its data is kept, under another name,
    /// with zeros in place of what was lost ([`Rewriter::salvage`]); else it is
    /// dropped whole (`recover`, which stores no data blobs).
    salvage_files: bool,
}

/// The name a salvaged file is kept under: `NAME.damaged`, or `NAME.damaged-2`
/// ... where that is taken; a name too long for that within the usual 255 bytes
/// is shortened first (QA: nothing was kept of a file with a 248-byte name).
fn damaged_name(name: &[u8], taken: &HashSet<Vec<u8>>) -> Vec<u8> {
    (1u32..)
        .map(|i| {
            let suffix = match i {
                1 => String::from_utf8_lossy(DAMAGED_SUFFIX).into_owned(),
                i => format!("{}-{i}", String::from_utf8_lossy(DAMAGED_SUFFIX)),
            };
            let mut keep = name.len().min(255 - suffix.len());
            // Not inside a UTF-8 character (names are bytes, most are UTF-8).
            if let Ok(text) = std::str::from_utf8(name) {
                while !text.is_char_boundary(keep) {
                    keep -= 1;
                }
            }
            let mut n = name[..keep].to_vec();
            n.extend_from_slice(suffix.as_bytes());
            n
        })
        .find(|n| !taken.contains(n))
        .expect("some suffix is free")
}

/// The zero blobs a repair puts where data was lost: one per length, made once.
struct ZeroBlobs {
    key: Arc<cairn_format::key::MasterKey>,
    ids: HashMap<u64, BlobId>,
    /// Those made, with their bytes, to store ([`Rewriter::keep_zeros`]).
    made: Vec<(BlobId, Vec<u8>)>,
}

impl ZeroBlobs {
    fn new(key: Arc<cairn_format::key::MasterKey>) -> Self {
        ZeroBlobs {
            key,
            ids: HashMap::new(),
            made: Vec::new(),
        }
    }

    fn id(&mut self, n: u64) -> BlobId {
        let (key, made) = (&self.key, &mut self.made);
        *self.ids.entry(n).or_insert_with(|| {
            let data = vec![0u8; n as usize];
            let id = key.blob_id(&data);
            made.push((id, data));
            id
        })
    }

    /// `len` bytes of zeros onto `builder`, in blobs of at most `piece` bytes.
    fn push(
        &mut self,
        builder: &mut ChunkListBuilder,
        emit: &mut dyn FnMut(ChunkList) -> Result<BlobId>,
        len: u64,
        piece: u64,
    ) -> Result<()> {
        let mut left = len;
        while left > 0 {
            let n = left.min(piece);
            let id = self.id(n);
            builder.push(ChunkRef { id, length: n }, emit)?;
            left -= n;
        }
        Ok(())
    }
}

/// Where a repair's [`ChunkListBuilder`] puts the lists it makes: kept with the
/// repair's new blobs unless the repository holds them already.
fn list_sink<'s>(
    key: &'s cairn_format::key::MasterKey,
    present: &'s dyn Fn(&BlobId) -> bool,
    new_ids: &'s mut IdSet,
    new_blobs: &'s mut Vec<(BlobKind, BlobId, Vec<u8>)>,
) -> impl FnMut(ChunkList) -> Result<BlobId> + 's {
    move |list| {
        let data = list.encode();
        let id = key.blob_id(&data);
        if !present(&id) && new_ids.insert(id) {
            new_blobs.push((BlobKind::ChunkList, id, data));
        }
        Ok(id)
    }
}

/// What a salvaged file's name gets ([`Rewriter::salvage`]): the file itself is
/// taken out of the snapshot, and what could be read of it kept beside it.
pub const DAMAGED_SUFFIX: &[u8] = b".damaged";

/// What [`Rewriter::image`] made of an image snapshot.
enum ImageFix {
    /// Every block is there.
    Intact,
    /// Lost blocks are zeros now: the new root tree, the image's name and the
    /// byte ranges given as zeros.
    Repaired {
        root: BlobId,
        name: String,
        lost: Vec<(u64, u64)>,
    },
    /// Not the shape of an image snapshot (or its root is lost): repaired as
    /// files are.
    AsFiles,
}

/// Whether a blob is there to read: the index places it in a pack that storage
/// holds (`stored`).
fn in_stored_packs<'a>(
    index: &'a MasterIndex,
    stored: &'a HashSet<PackId>,
) -> impl Fn(&BlobId) -> bool + 'a {
    move |id| {
        index
            .get(id)
            .is_some_and(|l| stored.contains(&index.pack_of(&l)))
    }
}

impl<'a, F: Fn(&BlobId) -> bool> Rewriter<'a, F> {
    fn new(repo: &'a Repository, present: &'a F, index: &'a MasterIndex) -> Self {
        Rewriter {
            repo,
            root: None,
            present,
            index,
            memo: IdMap::default(),
            new_trees: Vec::new(),
            new_ids: IdSet::default(),
            new_blobs: Vec::new(),
            salvage_files: false,
        }
    }
}

impl<F: Fn(&BlobId) -> bool> Rewriter<'_, F> {
    /// The repaired id of a tree (`None`: unreadable) and, in `dropped`, what it
    /// lost, as paths under `path`. Results are remembered per tree, so a tree
    /// shared by many snapshots is repaired once and reported in each. Only missing
    /// or damaged blobs count as lost; any other error (I/O) stops the repair.
    fn tree(
        &mut self,
        id: &BlobId,
        path: &str,
        dropped: &mut Vec<Dropped>,
    ) -> Result<Option<BlobId>> {
        let (new, rel) = match self.memo.get(id) {
            Some(r) => r.clone(),
            None if !(self.present)(id) => (None, Vec::new()),
            None => {
                self.root = Some(*id);
                let repo = self.repo;
                let r = match crate::tree::walk::walk(repo, id, self) {
                    Ok(r) => r,
                    Err(e) if is_loss(&e) => (None, Vec::new()),
                    Err(e) => return Err(e),
                };
                self.memo.insert(*id, r.clone());
                r
            }
        };
        dropped.extend(rel.iter().map(|d| d.under(path)));
        Ok(new)
    }

    /// Adds a (possibly repaired) directory entry to `dir`: `new` is its repaired
    /// tree (`None`: lost, kept empty) and `rel` what it lost, under it.
    fn add_dir(
        &mut self,
        dir: &mut RepairDir,
        node: &Node,
        new: Option<BlobId>,
        rel: &[Dropped],
    ) -> Result<()> {
        let name = format!("/{}", String::from_utf8_lossy(&node.name));
        dir.dropped.extend(rel.iter().map(|d| d.under(&name)));
        let new = match new {
            Some(x) => x,
            None => {
                dir.dropped.push(Dropped::kept(
                    format!("{name}/"),
                    "directory listing lost; kept empty",
                ));
                self.empty_tree()
            }
        };
        if node.subtree == Some(new) {
            self.keep(dir, node);
            return Ok(());
        }
        let mut n = node.clone();
        n.subtree = Some(new);
        self.changed(dir)?.push(n);
        Ok(())
    }

    /// Keeps an intact entry of `dir`: only counted while the directory is as
    /// stored, so that repairing a directory of a million intact entries does not
    /// hold a second copy of it.
    fn keep(&self, dir: &mut RepairDir, n: &Node) {
        match &mut dir.nodes {
            Some(nodes) => nodes.push(n.clone()),
            None => dir.kept += 1,
        }
    }

    /// The entries of `dir` so far, for a directory that differs from its stored
    /// tree: on its first change, the intact entries counted until then are taken
    /// from that tree (read again; a repair changes few directories).
    fn changed<'d>(&self, dir: &'d mut RepairDir) -> Result<&'d mut Vec<Node>> {
        if dir.nodes.is_none() {
            let mut nodes = match dir.id {
                Some(id) => self.repo.load_tree(&id)?.nodes,
                None => Vec::new(),
            };
            nodes.truncate(dir.kept);
            if nodes.len() != dir.kept {
                return Err(Error::Invalid("tree repair lost its place".into()));
            }
            dir.nodes = Some(nodes);
        }
        Ok(dir.nodes.get_or_insert_with(Vec::new))
    }

    fn file_ok(&self, n: &Node) -> Result<bool> {
        let mut all = true;
        let mut seen = IdSet::default();
        let r = for_each_content_blob(self.repo, &n.content, &mut |b| {
            if !(self.present)(&b) {
                // Not there: do not try to read it as a chunk list either.
                all = false;
                return false;
            }
            seen.insert(b)
        });
        match r {
            Ok(()) => {}
            Err(e) if is_loss(&e) => return Ok(false),
            Err(e) => return Err(e),
        }
        Ok(all && !matches!(n.content, Content::Tree { .. } if seen.is_empty()))
    }

    /// Repairs an image snapshot whose root is `root`: every block that is
    /// missing, or that a lost chunk list named, becomes a block of zeros of its
    /// length; the chunk lists are rebuilt with the image's fanout, so that they
    /// keep the shape later backups and restores rely on (unchanged lists come
    /// out as they were, and are not stored again).
    fn image(&mut self, info: &ImageInfo, root: &BlobId) -> Result<ImageFix> {
        if !(self.present)(root) {
            return Ok(ImageFix::AsFiles);
        }
        let tree = match self.repo.load_tree(root) {
            Ok(t) => t,
            Err(e) if is_loss(&e) => return Ok(ImageFix::AsFiles),
            Err(e) => return Err(e),
        };
        let [node] = tree.nodes.as_slice() else {
            return Ok(ImageFix::AsFiles);
        };
        if node.kind != NodeKind::File || info.block_size == 0 || info.fanout < 2 {
            return Ok(ImageFix::AsFiles);
        }
        if self.file_ok(node)? {
            return Ok(ImageFix::Intact);
        }
        let present = self.present;
        let repo = self.repo;
        let block = u64::from(info.block_size);
        let mut builder = ChunkListBuilder::with_fanout(info.fanout as usize);
        let mut zeros = ZeroBlobs::new(repo.key().clone());
        let mut lost: Vec<(u64, u64)> = Vec::new();
        let mut at = 0u64;
        let mut emit = list_sink(repo.key(), present, &mut self.new_ids, &mut self.new_blobs);
        for_each_chunk_or_gap(repo, &node.content, node.size, present, &mut |piece| {
            let (len, was_zeros) = match piece {
                Piece::Chunk(c) if present(&c.id) => {
                    at += c.length;
                    return builder.push(c, &mut emit);
                }
                // A block of zeros whose one stored copy was lost loses nothing:
                // it is stored again.
                Piece::Chunk(c) => (c.length, zeros.id(c.length) == c.id),
                Piece::Gap(n) => (n, false),
            };
            if !was_zeros {
                match lost.last_mut() {
                    Some(last) if last.0 + last.1 == at => last.1 += len,
                    _ => lost.push((at, len)),
                }
            }
            // Blocks of zeros in the image's block size (the file's last may be
            // shorter).
            zeros.push(&mut builder, &mut emit, len, block)?;
            at += len;
            Ok(())
        })?;
        let content = builder.finish(&mut emit)?;
        drop(emit);
        self.keep_zeros(zeros);
        if lost.is_empty() {
            // Only blocks of zeros were lost: stored again (above), the image is
            // whole as it stands.
            return Ok(ImageFix::Intact);
        }
        let mut repaired = node.clone();
        repaired.content = content;
        let new_root = self.add_tree(&Tree {
            nodes: vec![repaired],
        });
        Ok(ImageFix::Repaired {
            root: new_root,
            name: String::from_utf8_lossy(&node.name).into_owned(),
            lost,
        })
    }

    /// What can still be read of a file that lost part of its data: the same
    /// node with zeros in place of each lost chunk (and of the bytes a lost chunk
    /// list named), and how many bytes were lost. `None` when nothing of its data
    /// is left. Dropping the file whole, as `repair snapshots` did, let the next
    /// prune delete what a restore could still give back (QA: 8 MiB dropped for
    /// 138 KiB lost); a restore of the salvaged file gives that back, under a
    /// name that says what it is.
    fn salvage(&mut self, node: &Node) -> Result<Option<(Node, u64)>> {
        /// Bytes named by a lost chunk list become zero blobs of at most this.
        const ZERO_PIECE: u64 = 1 << 20;
        let present = self.present;
        let repo = self.repo;
        let mut builder = ChunkListBuilder::new();
        let mut zeros = ZeroBlobs::new(repo.key().clone());
        let mut emit = list_sink(repo.key(), present, &mut self.new_ids, &mut self.new_blobs);
        let (mut read, mut lost) = (0u64, 0u64);
        let r = for_each_chunk_or_gap(repo, &node.content, node.size, present, &mut |piece| {
            let len = match piece {
                Piece::Chunk(c) if present(&c.id) => {
                    read += c.length;
                    return builder.push(c, &mut emit);
                }
                Piece::Chunk(c) => {
                    // A chunk of zeros whose stored copy was lost loses nothing.
                    if zeros.id(c.length) != c.id {
                        lost += c.length;
                    }
                    c.length
                }
                Piece::Gap(n) => {
                    lost += n;
                    n
                }
            };
            zeros.push(&mut builder, &mut emit, len, ZERO_PIECE)
        });
        match r {
            Ok(()) => {}
            Err(e) if is_loss(&e) => return Ok(None),
            Err(e) => return Err(e),
        }
        if read == 0 {
            return Ok(None);
        }
        let content = builder.finish(&mut emit)?;
        drop(emit);
        self.keep_zeros(zeros);
        let mut kept = node.clone();
        kept.content = content;
        Ok(Some((kept, lost)))
    }

    /// Stores, with the repair's other new blobs, the zero blobs it made that
    /// the repository lacks.
    fn keep_zeros(&mut self, zeros: ZeroBlobs) {
        for (id, data) in zeros.made {
            if !(self.present)(&id) && self.new_ids.insert(id) {
                self.new_blobs.push((BlobKind::Data, id, data));
            }
        }
    }

    fn empty_tree(&mut self) -> BlobId {
        self.add_tree(&Tree { nodes: vec![] })
    }

    fn add_tree(&mut self, t: &Tree) -> BlobId {
        let data = t.encode();
        let id = self.repo.key().blob_id(&data);
        if !self.index.is_live(&id) && self.new_ids.insert(id) {
            self.new_trees.push((id, data));
        }
        id
    }
}

/// A directory being repaired: its entries so far and what it lost.
#[derive(Default)]
struct RepairDir {
    /// The directory's own tree id (`None` for the root, whose id the caller has).
    id: Option<BlobId>,
    /// Its entries so far, from the first that differs from the stored tree's
    /// (`None` while none has: see [`Rewriter::keep`]).
    nodes: Option<Vec<Node>>,
    /// Entries kept as stored while `nodes` is `None`.
    kept: usize,
    /// Lost paths, relative to this directory (`/name`).
    dropped: Vec<Dropped>,
    /// Files salvaged ([`Rewriter::salvage`]), under their own names still, with
    /// the bytes each lost: named and added when the directory is complete.
    salvaged: Vec<(Node, u64)>,
    /// Names of files dropped whole: no salvaged file takes one (it would pass
    /// for that file).
    gone: Vec<Vec<u8>>,
}

impl<F: Fn(&BlobId) -> bool> Visitor for Rewriter<'_, F> {
    type Dir = RepairDir;
    /// The repaired tree and what was lost below it.
    type Out = (Option<BlobId>, Vec<Dropped>);

    fn enter(&mut self, _: &str, node: Option<&Node>, _: &Tree) -> Result<RepairDir> {
        let id = match node {
            Some(n) => n.subtree,
            None => self.root,
        };
        Ok(RepairDir {
            id,
            // Without an id to read it again, the directory is copied as it goes.
            nodes: id.is_none().then(Vec::new),
            ..Default::default()
        })
    }

    fn entry(&mut self, dir: &mut RepairDir, _: &str, n: &Node) -> Result<Option<BlobId>> {
        match n.kind {
            NodeKind::Dir => {
                let Some(sub) = n.subtree else {
                    self.keep(dir, n);
                    return Ok(None);
                };
                if let Some((new, rel)) = self.memo.get(&sub).cloned() {
                    self.add_dir(dir, n, new, &rel)?;
                    return Ok(None);
                }
                if !(self.present)(&sub) {
                    self.memo.insert(sub, (None, Vec::new()));
                    self.add_dir(dir, n, None, &[])?;
                    return Ok(None);
                }
                Ok(Some(sub))
            }
            NodeKind::File => {
                if self.file_ok(n)? {
                    self.keep(dir, n);
                    return Ok(None);
                }
                match self.salvage_files.then(|| self.salvage(n)).transpose()? {
                    Some(Some(kept)) => dir.salvaged.push(kept),
                    salvage => {
                        dir.gone.push(n.name.clone());
                        dir.dropped.push(Dropped::new(
                            format!("/{}", String::from_utf8_lossy(&n.name)),
                            if salvage.is_some() {
                                "file data lost: none of it can be read"
                            } else {
                                "file data lost"
                            },
                        ));
                    }
                }
                self.changed(dir)?;
                Ok(None)
            }
            _ => {
                self.keep(dir, n);
                Ok(None)
            }
        }
    }

    fn unreadable(&mut self, dir: &mut RepairDir, _: &str, n: &Node, e: Error) -> Result<()> {
        if !is_loss(&e) {
            return Err(e);
        }
        if let Some(sub) = n.subtree {
            self.memo.insert(sub, (None, Vec::new()));
        }
        self.add_dir(dir, n, None, &[])
    }

    fn leave(&mut self, _: &str, _: Option<&Node>, mut dir: RepairDir) -> Result<Self::Out> {
        if !dir.salvaged.is_empty() {
            // Every name the directory had is taken, those of the files that
            // leave it too: a salvaged `a` kept as `a.damaged` would pass for the
            // file `a.damaged` (QA).
            let salvaged = std::mem::take(&mut dir.salvaged);
            let gone = std::mem::take(&mut dir.gone);
            let nodes = self.changed(&mut dir)?;
            let mut taken: HashSet<Vec<u8>> = (nodes.iter().map(|n| n.name.clone()))
                .chain(salvaged.iter().map(|(n, _)| n.name.clone()))
                .chain(gone)
                .collect();
            let mut added = Vec::new();
            for (mut node, lost) in salvaged {
                let was = String::from_utf8_lossy(&node.name).into_owned();
                let name = damaged_name(&node.name, &taken);
                taken.insert(name.clone());
                node.name = name;
                dir.dropped.push(Dropped::new(
                    format!("/{was}"),
                    format!(
                        "file data lost: {} of {}; what could be read is kept as {}, with zeros \
                     in place of the rest",
                        crate::units::bytes(lost, 2),
                        crate::units::bytes(node.size, 2),
                        String::from_utf8_lossy(&node.name)
                    ),
                ));
                added.push(node);
            }
            let nodes = self.changed(&mut dir)?;
            nodes.extend(added);
            nodes.sort_by(|a, b| a.name.cmp(&b.name));
        }
        let new = match (dir.nodes, dir.id) {
            (None, Some(id)) => id,
            (nodes, _) => self.add_tree(&Tree {
                nodes: nodes.unwrap_or_default(),
            }),
        };
        Ok((Some(new), dir.dropped))
    }

    fn child(&mut self, parent: &mut RepairDir, _: &str, n: &Node, out: Self::Out) -> Result<()> {
        if let Some(sub) = n.subtree {
            self.memo.insert(sub, out.clone());
        }
        self.add_dir(parent, n, out.0, &out.1)
    }
}

pub(crate) fn store_trees(repo: &Repository, trees: Vec<(BlobId, Vec<u8>)>) -> Result<()> {
    store_blobs(
        repo,
        trees
            .into_iter()
            .map(|(id, data)| (BlobKind::Tree, id, data))
            .collect(),
    )
}

/// Stores blobs of any kind in new packs, which the uploader indexes.
fn store_blobs(repo: &Repository, blobs: Vec<(BlobKind, BlobId, Vec<u8>)>) -> Result<()> {
    let pool = Arc::new(BufferPool::new(1));
    let uploader = repo.uploader(pool.clone());
    let mut packer = Packer::new(repo.key().clone(), pool, repo.config().pack_size as usize);
    let mut enc = BlobEncoder::new(repo.config().compression.zstd_level());
    let mut result = Ok(());
    for (kind, id, data) in blobs {
        let b = enc.encode(repo.key(), kind, id, &data)?;
        if let Some(p) = packer.add(b)
            && let Err(e) = uploader.send(p)
        {
            result = Err(e);
            break;
        }
    }
    if result.is_ok()
        && let Some(p) = packer.finish()
    {
        result = uploader.send(p);
    }
    uploader.finish_after(result).map(|_| ())
}

/// Copies the listed blobs from their packs into new packs, which the uploader
/// indexes. Each blob is verified on the way; one that fails is skipped
/// (`skip_damaged`, for repair) or stops the copy (prune must not lose it).
pub(crate) fn copy_blobs(
    repo: &Repository,
    packs: &[IndexPack],
    skip_damaged: bool,
    progress: &crate::progress::Progress,
) -> Result<crate::repo::packer::UploadStats> {
    let pool = Arc::new(BufferPool::new(1));
    let uploader = repo.uploader(pool.clone());
    let size = repo.config().pack_size as usize;
    let mut data = Packer::new(repo.key().clone(), pool.clone(), size);
    let mut meta = Packer::new(repo.key().clone(), pool, size);
    let mut result = Ok(());
    'packs: for p in packs {
        if p.blobs.is_empty() {
            continue;
        }
        // Ctrl-C between packs: what was copied is stored and indexed (second
        // copies, which the next prune removes), nothing else changed.
        if let Err(e) = progress.check_cancelled() {
            result = Err(e);
            break;
        }
        let bytes = match repo
            .backend()
            .get_bounded(&names::pack(&p.id.to_hex()), MAX_PACK_SIZE)
        {
            Ok(b) => b,
            Err(e) => {
                result = Err(e.into());
                break;
            }
        };
        for b in &p.blobs {
            let start = b.offset as usize;
            let sealed = bytes.get(start..start + b.length as usize);
            let check = match sealed {
                Some(x) => {
                    blob::decode(repo.key(), &b.id, x, b.raw_length, b.compression).map(|_| ())
                }
                None => Err(Error::Invalid("outside the pack".into())),
            };
            let sealed = match (sealed, check) {
                (Some(x), Ok(())) => x,
                _ if skip_damaged => continue,
                (_, Err(e)) => {
                    result = Err(Error::Invalid(format!(
                        "blob {} in pack {} is damaged ({e}); run `cairn check --read-data` and `cairn repair index`",
                        b.id.short(),
                        p.id.short()
                    )));
                    break 'packs;
                }
                (None, Ok(())) => continue,
            };
            let eb = blob::EncodedBlob {
                kind: b.kind,
                id: b.id,
                sealed: sealed.to_vec(),
                raw_length: b.raw_length,
                compression: b.compression,
            };
            let packer = if b.kind == BlobKind::Data {
                &mut data
            } else {
                &mut meta
            };
            if let Some(sp) = packer.add(eb)
                && let Err(e) = uploader.send(sp)
            {
                result = Err(e);
                break 'packs;
            }
        }
    }
    if result.is_ok() {
        for sp in [data.finish(), meta.finish()].into_iter().flatten() {
            if let Err(e) = uploader.send(sp) {
                result = Err(e);
                break;
            }
        }
    }
    uploader.finish_after(result).map(|((), stats)| stats)
}

/// What [`recover`] found and saved.
#[derive(Clone, Debug, Default, serde::Serialize)]
pub struct RecoverReport {
    /// Directory trees in the index, all read.
    pub trees_read: usize,
    /// Trees that no other tree and no snapshot refers to: each a directory of the
    /// new snapshot, named by its id.
    pub roots: Vec<String>,
    /// Trees in the index that could not be read, with why (their subtrees may be
    /// among the roots).
    pub unreadable: Vec<String>,
    /// Roots below which something is gone (a prune removed data no snapshot
    /// needed), with how many trees and blobs: saved without the entries that
    /// need them (as `repair snapshots` would leave them out).
    pub damaged_roots: Vec<String>,
    /// Unreferenced trees an earlier `recover` saved already (its snapshot holds
    /// them, with what was gone left out, under their id): not saved again.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub recovered_before: Vec<String>,
    /// The new snapshot (none when nothing was found, or with `dry_run`).
    pub snapshot: Option<String>,
    /// Bytes of the files the new snapshot holds.
    pub total_bytes: u64,
    pub dry_run: bool,
    /// Other jobs holding locks during a dry run (see [`plan_recover`]).
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub running: Vec<String>,
}

/// The trees a snapshot made by [`recover`] saved: the names of the directories
/// below its `/recover` (ids); none if it does not read as one.
fn recovered_roots(repo: &Repository, root: &BlobId) -> Vec<BlobId> {
    let inner = repo.load_tree(root).ok().and_then(|t| {
        t.nodes
            .iter()
            .find(|n| n.name == b"recover" && n.kind == NodeKind::Dir)
            .and_then(|n| n.subtree)
    });
    let Some(tree) = inner.and_then(|id| repo.load_tree(&id).ok()) else {
        return Vec::new();
    };
    tree.nodes
        .iter()
        .filter_map(|n| std::str::from_utf8(&n.name).ok())
        .filter_map(|name| BlobId::from_hex(name).ok())
        .collect()
}

/// The tag of a snapshot made by [`recover`].
pub const RECOVERED_TAG: &str = "recovered";

/// Saves every unreferenced directory tree (no snapshot's root, no other tree's
/// subtree) as a directory named by its id in one new snapshot of path
/// `/recover`, tagged [`RECOVERED_TAG`]. Run alone (exclusive lock): a backup
/// running meanwhile would have trees not yet in a snapshot. Run again, it finds
/// nothing new: the snapshot it made refers to them.
pub fn recover(session: &mut Session<Exclusive>, dry_run: bool) -> Result<RecoverReport> {
    let lock = session.lock()?;
    let progress = session.progress().clone();
    run_recover(session.repo_mut(), Some(&lock), &progress, dry_run)
}

/// What [`recover`] would save, changing nothing: a read session is enough, so
/// that it works where no lock can be written (a damaged repository mounted
/// read-only, which is when it is wanted). Backups may run meanwhile (they take
/// shared locks too): what one of them stored and has not yet saved in a
/// snapshot is counted among the roots, and the report names such jobs.
pub fn plan_recover(session: &mut Session<crate::session::Read>) -> Result<RecoverReport> {
    let progress = session.progress().clone();
    let mine = session.lock_id();
    let repo = session.repo_mut();
    let running = crate::repo::lock::list_locks(repo)?
        .into_iter()
        .filter(|l| !l.stale && Some(l.id) != mine)
        .map(|l| l.describe())
        .collect();
    let mut r = run_recover(repo, None, &progress, true)?;
    r.running = running;
    Ok(r)
}

/// `lock`: held unless `dry_run`.
fn run_recover(
    repo: &mut Repository,
    lock: Option<&crate::repo::lock::RepoLock>,
    progress: &crate::progress::Progress,
    dry_run: bool,
) -> Result<RecoverReport> {
    // Other hosts' snapshots' trees would look like ones no snapshot holds.
    super::needs_every_snapshot(repo, "recover")?;
    progress.phase(Phase::WalkingSnapshots);
    let (snaps, _) = repo.snapshots()?;
    repo.load_index()?;
    let index = repo.index().clone();
    let mut trees: Vec<BlobId> = index
        .iter_live()
        .filter(|(_, l)| l.kind == BlobKind::Tree)
        .map(|(id, _)| id)
        .collect();
    trees.sort();
    trees.dedup();
    let mut report = RecoverReport {
        dry_run,
        trees_read: trees.len(),
        ..Default::default()
    };
    progress.set_total(None, Some(trees.len() as u64));
    let mut referenced = IdSet::default();
    // A tree a prune took something from is saved rewritten (below), so the tree
    // itself stays unreferenced: the directories of earlier recovered snapshots
    // name it, and it is not saved again at every run (QA: a snapshot more each
    // time, each kept for good).
    let mut recovered_before = IdSet::default();
    for (sid, snap) in &snaps {
        let root = snap
            .tree_id()
            .map_err(|e| Error::damaged(format!("snapshot {}", sid.to_hex()), e))?;
        referenced.insert(root);
        if snap.tags.iter().any(|t| t == RECOVERED_TAG) {
            recovered_before.extend(recovered_roots(repo, &root));
        }
    }
    for id in &trees {
        progress.check_cancelled()?;
        match repo.load_tree(id) {
            Ok(t) => {
                for n in &t.nodes {
                    if let Some(sub) = n.subtree {
                        referenced.insert(sub);
                    }
                }
            }
            Err(e) if is_loss(&e) => report.unreadable.push(format!("tree {}: {e}", id.to_hex())),
            Err(e) => return Err(e),
        }
        progress.entry_done();
    }
    let unreferenced: Vec<BlobId> = trees
        .into_iter()
        .filter(|id| !referenced.contains(id))
        .collect();
    // The root of a recovered snapshot since forgotten holds the trees it saved
    // (rewritten where a prune took something): they come back inside it, not
    // beside it as well (QA: saved twice, one copy nested in the other).
    let mut covered = IdSet::default();
    for t in &unreferenced {
        covered.extend(recovered_roots(repo, t));
    }
    let (before, roots): (Vec<BlobId>, Vec<BlobId>) = unreferenced
        .into_iter()
        .filter(|id| !covered.contains(id))
        .partition(|id| recovered_before.contains(id));
    report.recovered_before = before.iter().map(|id| id.to_hex()).collect();
    report.roots = roots.iter().map(|id| id.to_hex()).collect();
    if roots.is_empty() {
        return Ok(report);
    }
    // One walk below the roots: the bytes of their files (as a snapshot counts
    // them, a file under two roots twice), and what they need that the index no
    // longer has (a tree shared by several checked, and its losses counted, once).
    let mut seen = IdSet::default();
    let mut lossy: Vec<(BlobId, u64)> = Vec::new();
    for root in &roots {
        progress.check_cancelled()?;
        let mut missing = 0u64;
        let mut todo = vec![*root];
        while let Some(t) = todo.pop() {
            let first = seen.insert(t);
            let tree = match repo.load_tree(&t) {
                Ok(tree) => tree,
                Err(e) if is_loss(&e) => {
                    missing += u64::from(first);
                    continue;
                }
                Err(e) => return Err(e),
            };
            for n in &tree.nodes {
                todo.extend(n.subtree);
                if n.kind == NodeKind::File {
                    report.total_bytes += n.size;
                }
                if !first {
                    continue;
                }
                let r = for_each_content_blob(repo, &n.content, &mut |b| {
                    missing += u64::from(!index.is_live(&b));
                    true
                });
                match r {
                    Err(e) if is_loss(&e) => missing += 1,
                    r => r?,
                }
            }
        }
        if missing > 0 {
            lossy.push((*root, missing));
        }
    }
    // Below a root where a prune removed something, the files and directories that
    // need it are left out, as `repair snapshots` leaves them out: a recovered
    // snapshot that `check` fails and prune refuses to run beside helps no one.
    // Each directory keeps its root's name; its new tree is stored with the rest.
    let mut subtree_of: IdMap<BlobId> = roots.iter().map(|r| (*r, *r)).collect();
    let mut rewritten: Vec<(BlobId, Vec<u8>)> = Vec::new();
    if !lossy.is_empty() {
        let stored: HashSet<PackId> = repo.list_packs()?.into_keys().collect();
        let present = in_stored_packs(&index, &stored);
        let mut rw = Rewriter::new(repo, &present, &index);
        for (root, missing) in &lossy {
            let mut dropped = Vec::new();
            let kept = rw.tree(root, "", &mut dropped)?;
            let what = match kept {
                Some(new) => {
                    subtree_of.insert(*root, new);
                    // A directory whose listing is lost is kept, empty.
                    let emptied = dropped.iter().filter(|d| d.kept).count() as u64;
                    let left_out = dropped.len() as u64 - emptied;
                    let mut said = format!("{} left out", crate::units::count(left_out, "entry"));
                    if emptied > 0 {
                        said.push_str(&format!(
                            ", {} kept empty ({} lost)",
                            crate::units::count(emptied, "directory"),
                            if emptied == 1 {
                                "its listing"
                            } else {
                                "their listings"
                            }
                        ));
                    }
                    said
                }
                None => {
                    subtree_of.remove(root);
                    "unreadable, left out".to_string()
                }
            };
            report.damaged_roots.push(format!(
                "{}: {missing} trees or blobs gone (removed by a prune, or lost from storage); {what}",
                root.to_hex()
            ));
        }
        rewritten = std::mem::take(&mut rw.new_trees);
        // What is left, added up again from the trees as they are now.
        let written: HashMap<BlobId, Vec<u8>> = rewritten.iter().cloned().collect();
        report.total_bytes = 0;
        for new in subtree_of.values() {
            report.total_bytes += file_bytes(repo, new, &written)?;
        }
    }
    let roots: Vec<(BlobId, BlobId)> = roots
        .iter()
        .filter_map(|r| subtree_of.get(r).map(|new| (*r, *new)))
        .collect();
    report.roots = roots.iter().map(|(id, _)| id.to_hex()).collect();
    if roots.is_empty() {
        return Ok(report);
    }
    let now = crate::time::now_timestamp();
    let dir = |name: Vec<u8>, subtree: BlobId| {
        let mut n = Node::new(name, NodeKind::Dir);
        n.mode = libc::S_IFDIR | 0o700;
        n.uid = nix::unistd::geteuid().as_raw();
        n.gid = nix::unistd::getegid().as_raw();
        (n.mtime, n.atime, n.ctime) = (now, now, now);
        n.subtree = Some(subtree);
        n
    };
    // Sorted by name, as every tree is: the ids are.
    let inner = Tree {
        nodes: roots
            .iter()
            .map(|(id, tree)| dir(id.to_hex().into_bytes(), *tree))
            .collect(),
    };
    let inner_data = inner.encode();
    let inner_id = repo.key().blob_id(&inner_data);
    let top = Tree {
        nodes: vec![dir(b"recover".to_vec(), inner_id)],
    };
    let top_data = top.encode();
    let top_id = repo.key().blob_id(&top_data);
    if dry_run {
        return Ok(report);
    }
    let fresh: Vec<(BlobId, Vec<u8>)> = rewritten
        .into_iter()
        .chain([(inner_id, inner_data), (top_id, top_data)])
        .filter(|(id, _)| !index.is_live(id))
        .collect();
    if !fresh.is_empty() {
        store_trees(repo, fresh)?;
    }
    let now = crate::time::now_rfc3339();
    let snap = cairn_format::snapshot::Snapshot {
        version: 1,
        time: now.clone(),
        utc_offset: crate::time::local_offset_at(&now),
        hostname: crate::repo::hostname(),
        username: crate::repo::username(),
        paths: vec!["/recover".into()],
        tags: vec![RECOVERED_TAG.into()],
        tree: top_id.to_hex(),
        parent: None,
        excludes: Vec::new(),
        original: None,
        copied_from: None,
        program_version: format!("cairn {}", env!("CARGO_PKG_VERSION")),
        image: None,
        summary: cairn_format::snapshot::SnapshotSummary {
            total_bytes: report.total_bytes,
            ..Default::default()
        },
    };
    let lock = lock.ok_or_else(|| Error::Invalid("recover: no lock held".into()))?;
    let id = repo.write_snapshot(&snap, lock)?;
    report.snapshot = Some(id.to_hex());
    Ok(report)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A salvaged file's name: a suffix that no name of the directory had, and
    /// at most 255 bytes, shortened at a character boundary.
    #[test]
    fn damaged_names_are_free_and_fit() {
        let taken: HashSet<Vec<u8>> = [b"a".to_vec(), b"a.damaged".to_vec()].into();
        assert_eq!(damaged_name(b"a", &taken), b"a.damaged-2");
        assert_eq!(damaged_name(b"b", &taken), b"b.damaged");
        let long = vec![b'n'; 250];
        let got = damaged_name(&long, &HashSet::new());
        assert_eq!(got.len(), 255);
        assert!(got.ends_with(b".damaged"));
        // Two-byte characters are not cut in half.
        let wide = "é".repeat(125).into_bytes();
        let got = damaged_name(&wide, &HashSet::new());
        assert!(got.len() <= 255);
        assert!(std::str::from_utf8(&got).is_ok());
        assert!(got.ends_with(b".damaged"));
    }
}
