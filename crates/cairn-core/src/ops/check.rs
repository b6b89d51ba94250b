//! Checking a repository: structure always (index files, packs exist and fit, every
//! snapshot's trees and chunk lists resolve to indexed blobs) and, with `read_data`,
//! every pack read whole, its hash, header and every blob verified. Each problem names
//! the damaged object and, where known, the snapshots and files it affects.

use crate::error::{Error, Result};
use crate::index::IdSet;
use crate::progress::{Phase, Progress};
use crate::repo::blob;
use crate::repo::{IndexObject, IndexState, Repository};
use crate::session::{Read, Session};
use crate::tree::chunklist::ListTotals;
use crate::tree::walk::Visitor;
use cairn_backend::names;
use cairn_format::IndexId;
use cairn_format::consts::PACK_TRAILER_LEN;
use cairn_format::index::IndexBlob;
use cairn_format::pack;
use cairn_format::tree::{Content, Node, NodeKind, Tree};
use cairn_format::{BlobId, PackId, SnapshotId};
use std::collections::{HashMap, HashSet};

#[derive(Clone, Debug, Default)]
pub struct CheckOptions {
    pub read_data: bool,
    /// Read only part of the packs (implies reading data).
    pub subset: Option<Subset>,
}

/// Which packs `--read-data-subset` reads.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum Subset {
    /// Group `n` (1-based) of `m`: packs are split into `m` groups by id, so running
    /// 1/m .. m/m on successive days reads everything once.
    Part { n: u32, m: u32 },
    /// A random sample of this percentage of packs.
    Percent(f64),
    /// Random packs until they add up to this many bytes (restic's `50M`; the
    /// last may go past it, so at least one is read): a nightly check that reads
    /// about a fixed amount whatever the repository's size.
    Bytes(u64),
}

impl Subset {
    fn select(&self, packs: &mut Vec<(PackId, u64)>) {
        match *self {
            Subset::Part { n, m } => packs.retain(|(id, _)| {
                let g = u32::from_be_bytes([id.0[0], id.0[1], id.0[2], id.0[3]]) % m.max(1);
                g + 1 == n
            }),
            Subset::Percent(p) => {
                let want = ((packs.len() as f64) * p / 100.0).ceil() as usize;
                shuffle(packs);
                packs.truncate(want.min(packs.len()));
            }
            Subset::Bytes(want) => {
                shuffle(packs);
                // In the random order until the size is reached. Passing over
                // packs larger than what is left would favour small (tree)
                // packs and could read no data at all (QA: 5M of packs of 54K,
                // 13M and 16M read the 54K tree pack alone, "no errors").
                let mut total = 0u64;
                let take = packs
                    .iter()
                    .take_while(|(_, size)| {
                        let more = total < want;
                        total = total.saturating_add(*size);
                        more
                    })
                    .count();
                packs.truncate(take);
            }
        }
    }
}

/// Orders packs by a keyed hash with a fresh random key: a uniform sample of any
/// length is then a prefix.
fn shuffle(packs: &mut [(PackId, u64)]) {
    let key: [u8; 32] = cairn_format::envelope::random_bytes();
    packs.sort_by_cached_key(|(id, _)| *blake3::keyed_hash(&key, &id.0).as_bytes());
}

/// A file or directory of a snapshot that a problem makes unrestorable (in full).
#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize)]
pub struct Affected {
    pub snapshot: SnapshotId,
    pub path: String,
}

/// The kind of blob a problem concerns.
#[derive(Clone, Copy, Debug, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "snake_case")]
pub enum BlobRole {
    Tree,
    ChunkList,
    Chunk,
}

/// One thing `check` found wrong, with the object it concerns. Text wording is the
/// caller's (the CLI renders each kind).
#[derive(Clone, Debug, PartialEq, serde::Serialize)]
#[serde(tag = "kind", rename_all = "snake_case")]
pub enum Problem {
    /// An index file or pending-deletion record cannot be read; the blobs only it
    /// lists count as missing.
    IndexUnreadable { object: IndexObject, error: String },
    /// The index lists a pack that storage does not hold.
    PackMissing { pack: PackId },
    /// A pack is shorter than its index entries need.
    PackTruncated {
        pack: PackId,
        size: u64,
        needed: u64,
    },
    /// A pack's size is not what its index entries and header make (bytes appended,
    /// or its header cut off), and its trailer does not account for it either.
    PackSize {
        pack: PackId,
        size: u64,
        expected: u64,
    },
    /// Reading a pack whole found damage (`--read-data`): its hash, header or blobs.
    PackDamaged { pack: PackId, error: String },
    /// The file under `pack`'s name holds another pack, `holds`, whole (moved or
    /// copied over it): `pack`'s `blobs` are lost unless a copy is found, and the
    /// file belongs under `holds`'s name. Not damage of every blob.
    PackMisnamed {
        pack: PackId,
        holds: PackId,
        blobs: usize,
    },
    /// A pack read whole is intact (its content is its name, its header covers
    /// every byte and each blob it lists decodes), but index entries place
    /// `entries` blobs in it where it does not hold them: written by a client
    /// holding the key (a server's backup token may add index files), or by a
    /// bug. Readers go to another copy where there is one (a blob with none is
    /// reported on its own); `repair index`, which indexes what pack headers
    /// say, drops the false entries. Not damage: no blob of this pack is lost.
    /// `blobs`: the first few blobs named falsely.
    FalseIndexEntries {
        pack: PackId,
        entries: usize,
        blobs: Vec<BlobId>,
    },
    /// A pack this user may not read (`--read-data`): not damage, so neither its
    /// blobs nor the files needing them are counted as lost, and no repair is
    /// advised (`repair index` would refuse to work around it).
    PackUnreadable { pack: PackId, error: String },
    /// A pack that reading failed on (`--read-data`: an I/O error of the disk,
    /// storage that kept failing): whether it is damaged is not known, so its
    /// blobs are not counted as lost and no repair is advised (QA: an EIO made
    /// every blob of the pack a problem, and the advice was to repair, which
    /// would have dropped what a fixed disk still holds).
    PackReadFailed { pack: PackId, error: String },
    /// A snapshot object cannot be read or names no valid tree.
    SnapshotUnreadable {
        snapshot: SnapshotId,
        error: String,
        /// What to do: removing it only when it is damage (not when this user
        /// may not read it, or a newer cairn wrote it).
        advice: String,
    },
    /// A snapshot recorded as committed is gone without `forget`.
    SnapshotVanished { snapshot: SnapshotId },
    /// A blob a snapshot needs is in no index.
    BlobMissing {
        blob: BlobId,
        role: BlobRole,
        affects: Vec<Affected>,
    },
    /// A blob a snapshot needs is in a pack found damaged or missing.
    BlobInDamagedPack {
        blob: BlobId,
        role: BlobRole,
        affects: Vec<Affected>,
    },
    /// A file's node disagrees with its content: its size is not what its chunks
    /// add up to, a chunk's length is not its blob's, or a chunk-list root claims
    /// another number of chunks than it lists. Restore would fail on it.
    FileInconsistent {
        error: String,
        affects: Vec<Affected>,
    },
    /// A key file cannot be read or does not match its name.
    KeyUnreadable {
        key: cairn_format::KeyId,
        error: String,
    },
    /// An index file's dedup list (what a server answers dedup queries from) does not
    /// say what the file says: a server could tell clients that chunks are stored
    /// which are not.
    DedupListWrong {
        index: cairn_format::IndexId,
        error: String,
    },
    /// A tree or chunk list whose pack the storage failed to read (an I/O error
    /// of the disk): not known to be damaged, and what is below it was not
    /// checked. See [`Problem::PackReadFailed`].
    BlobReadFailed {
        blob: Option<BlobId>,
        role: BlobRole,
        error: String,
        affects: Vec<Affected>,
    },
    /// A tree or chunk list was found but does not decode, authenticate or fit its
    /// place.
    BlobDamaged {
        blob: Option<BlobId>,
        role: BlobRole,
        error: String,
        affects: Vec<Affected>,
    },
}

/// `error` prefixed with `object` unless it already names the object by `id`
/// (a damaged object's error does: printing the id twice only hides the reason).
fn naming(object: String, error: &str, id: &str) -> String {
    if error.contains(id) {
        error.to_string()
    } else {
        format!("{object}: {error}")
    }
}

impl Problem {
    /// One line saying what is wrong, for people (`check`, the server's check job).
    pub fn describe(&self) -> String {
        let role = |r: &BlobRole| match r {
            BlobRole::Tree => "tree",
            BlobRole::ChunkList => "chunk list",
            BlobRole::Chunk => "blob",
        };
        match self {
            Problem::IndexUnreadable { object, error } => match object {
                IndexObject::IndexFile(id) => format!(
                    "{} (`cairn prune` drops it when no snapshot needs what only it lists; \
                     `cairn repair index` rebuilds the index from the packs)",
                    naming(format!("index file {id}"), error, &id.to_string())
                ),
                IndexObject::PendingDeletion(id) => {
                    naming(format!("pending deletion {id}"), error, &id.to_string())
                }
            },
            Problem::PackMissing { pack } => {
                format!("pack {pack}: listed in the index but missing from storage")
            }
            Problem::PackTruncated { pack, size, needed } => {
                format!("pack {pack}: truncated: {size} bytes, the index needs {needed}")
            }
            Problem::PackSize {
                pack,
                size,
                expected,
            } => format!(
                "pack {pack}: {size} bytes, where its index entries and header make \
                 {expected} (appended to, or its end cut off; `check --read-data` reads it)"
            ),
            Problem::PackDamaged { pack, error } => format!("pack {pack}: {error}"),
            Problem::PackMisnamed { pack, holds, blobs } => {
                let hex = holds.to_hex();
                format!(
                    "pack {pack}: the file holds another pack, whole: {hex} (stored under \
                     this name by mistake); this pack's {} lost unless a copy of it is \
                     found, and the file belongs at data/{}/{hex}",
                    crate::units::count_is(*blobs as u64, "blob"),
                    &hex[..2]
                )
            }
            Problem::FalseIndexEntries {
                pack,
                entries,
                blobs,
            } => {
                let named: Vec<String> = blobs.iter().map(|b| b.short()).collect();
                format!(
                    "pack {pack}: intact, but index entries place {} in it as it does not \
                     hold {} ({}{}; written by a client holding the key, or by a bug): \
                     readers go to another copy where there is one, and `cairn repair index` \
                     drops the false entries",
                    crate::units::count(*entries as u64, "blob"),
                    if *entries == 1 { "it" } else { "them" },
                    named.join(", "),
                    if *entries > named.len() { ", ..." } else { "" }
                )
            }
            Problem::PackUnreadable { pack, error } => format!(
                "pack {pack}: {error}: its data was not verified (give this user read access \
                 to the repository, or check as its owner)"
            ),
            Problem::PackReadFailed { pack, error } => format!(
                "pack {pack}: could not be read ({error}): its data was not verified, and \
                 whether it is damaged is not known (check the disk or the storage, then \
                 check again)"
            ),
            Problem::SnapshotUnreadable {
                snapshot,
                error,
                advice,
            } => {
                // The error names the snapshot already when it is the object's own.
                let named = error.contains(&snapshot.to_hex());
                format!(
                    "{}{error}; {advice}",
                    if named {
                        String::new()
                    } else {
                        format!("snapshot {snapshot}: ")
                    }
                )
            }
            Problem::SnapshotVanished { snapshot } => format!(
                "snapshot {snapshot}: was committed but its object is missing (deleted from \
                 storage without `cairn forget`); `cairn recover` saves its directory trees \
                 as a new snapshot (before a prune deletes them), and `cairn repair \
                 snapshots` records it as lost"
            ),
            Problem::BlobMissing { blob, role: r, .. } => {
                format!("{} {blob}: missing from the index", role(r))
            }
            Problem::BlobInDamagedPack { blob, role: r, .. } => {
                format!("{} {blob}: stored in a damaged or missing pack", role(r))
            }
            Problem::FileInconsistent { error, .. } => format!("file content: {error}"),
            Problem::KeyUnreadable { key, error } => {
                naming(format!("key file {key}"), error, &key.short())
            }
            Problem::DedupListWrong { index, error } => format!(
                "index file {}: {error} (a server would answer dedup queries wrongly; \
                 `cairn repair index` rewrites the index and its lists)",
                index.short()
            ),
            Problem::BlobDamaged {
                blob,
                role: r,
                error,
                ..
            } => match blob {
                Some(b) => format!("{} {b}: {error}", role(r)),
                None => format!("{}: {error}", role(r)),
            },
            Problem::BlobReadFailed {
                blob,
                role: r,
                error,
                ..
            } => format!(
                "{}: could not be read ({error}): whether it is damaged is not known, and \
                 what is below it was not checked (check the disk or the storage, then check \
                 again)",
                match blob {
                    Some(b) => format!("{} {b}", role(r)),
                    None => role(r).to_string(),
                }
            ),
        }
    }

    /// The paths the problem makes unrestorable, for the kinds that have them.
    pub fn affects(&self) -> &[Affected] {
        match self {
            Problem::BlobMissing { affects, .. }
            | Problem::BlobInDamagedPack { affects, .. }
            | Problem::BlobDamaged { affects, .. }
            | Problem::BlobReadFailed { affects, .. }
            | Problem::FileInconsistent { affects, .. } => affects,
            _ => &[],
        }
    }
    fn affects_mut(&mut self) -> Option<&mut Vec<Affected>> {
        match self {
            Problem::BlobMissing { affects, .. }
            | Problem::BlobInDamagedPack { affects, .. }
            | Problem::BlobDamaged { affects, .. }
            | Problem::BlobReadFailed { affects, .. }
            | Problem::FileInconsistent { affects, .. } => Some(affects),
            _ => None,
        }
    }
}

#[derive(Clone, Debug, Default, serde::Serialize)]
pub struct CheckReport {
    pub snapshots: usize,
    pub index_files: usize,
    pub packs: usize,
    pub blobs: usize,
    pub packs_read: usize,
    /// Bytes of the packs read in full (`--read-data`, `--read-data-subset`).
    pub bytes_read: u64,
    /// Packs no index lists (left by an interrupted backup; removed by prune).
    pub unindexed_packs: usize,
    /// Prune records whose packs wait for deletion.
    pub pending_deletions: usize,
    /// Objects in the repository's folders under names no reader opens (see
    /// [`stray_names`]), and the first [`SHOWN_STRAYS`] of them.
    pub strays: u64,
    pub stray_names: Vec<String>,
    /// Of the strays, packs under another folder or spelling than their own:
    /// where each is and where it belongs (moved there, it is read again).
    pub misplaced_packs: Vec<MisplacedPack>,
    pub problems: Vec<Problem>,
    /// This machine's SSD index of the repository, when it uses that placement.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub local_index: Option<LocalIndex>,
    /// The host whose snapshots alone were checked: the client is shown only
    /// those (a cairn server's host-bound token). Snapshots deleted behind
    /// cairn's back are then not looked for.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub only_host: Option<String>,
}

/// What `check` found of the SSD placement's files on this machine: derived state,
/// not part of the repository, but a damaged copy would make every restore fail.
#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize)]
pub struct LocalIndex {
    pub path: String,
    pub state: LocalIndexState,
    /// What was wrong, when it was damaged.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub error: Option<String>,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "snake_case")]
pub enum LocalIndexState {
    /// Up to date and every file matches its checksums.
    Intact,
    /// Not on this machine: built at the next use.
    Absent,
    /// Built from older index files: brought up to date by this check and found
    /// intact (or, when that could not be done, brought up to date at the next
    /// use).
    OutOfDate,
    /// Damaged, and rebuilt from the repository by this check.
    Rebuilt,
    /// Damaged; rebuilding failed (it is rebuilt at the next use).
    Damaged,
}

/// Checks the repository of a read session opened with
/// [`IndexLoad::Deferred`](crate::session::IndexLoad::Deferred): snapshots were
/// listed at open, before the index is read here (so a backup committing
/// meanwhile cannot look like one whose blobs are missing), and this machine's
/// SSD index is checked before it is used.
///
/// Memory stays bounded at any size: the index files are streamed once, keeping
/// a few numbers per pack; blobs are looked up in the index's placement; a pack
/// read whole is compared with its index listing through a fingerprint, and only
/// a pack found damaged has its entries gathered from the index.
pub fn check(session: &mut Session<Read>, opts: &CheckOptions) -> Result<CheckReport> {
    let local_index = local_index(session.repo())?;
    session.load_index()?;
    let repo = session.repo();
    let progress = session.progress();
    let mut report = CheckReport {
        local_index,
        ..Default::default()
    };
    let (snaps, bad_snaps) = session.snapshots()?;
    progress.phase(Phase::LoadingIndex);
    let listing = crate::repo::until_settled(
        || read_listing(repo, repo.admin_names()),
        |l: &Listing| &l.state,
    )?;
    let state = &listing.state;
    report.index_files = state.live.len();
    report.pending_deletions = state.pending.len();
    let pending_orphans: HashSet<PackId> = state
        .pending
        .iter()
        .flat_map(|(_, p)| p.orphans.iter().copied())
        .collect();
    for e in &state.errors {
        report.problems.push(Problem::IndexUnreadable {
            object: e.object,
            error: e.error.to_string(),
        });
    }
    let index = repo.index().clone();
    report.blobs = index.len();

    // Packs: every indexed pack must exist and hold its blobs.
    let data = repo.backend().list(names::DATA)?;
    let stored: HashMap<PackId, u64> = crate::repo::packs_of(&data);
    (report.strays, report.stray_names, report.misplaced_packs) = stray_names(repo, &data, &stored);
    drop(data);
    report.packs = stored.len();
    let mut bad = Bad::default();
    let mut listed: Vec<(&PackId, &Listed)> = listing.packs.iter().collect();
    listed.sort_by_key(|(p, _)| **p);
    for (p, l) in listed {
        match stored.get(p) {
            // A pack prune retired may already be gone; only a snapshot needing one
            // of its blobs makes that a problem (reported below).
            None if !l.live => {
                bad.packs.insert(*p);
            }
            None => {
                bad.packs.insert(*p);
                report.problems.push(Problem::PackMissing { pack: *p });
            }
            Some(size) if l.end + PACK_TRAILER_LEN as u64 > *size => {
                // Read whole, the blobs still inside it count as readable; without
                // that read (or in a sample that may pass it over), all of its
                // blobs are in doubt.
                if !(opts.read_data && opts.subset.is_none()) {
                    bad.packs.insert(*p);
                }
                report.problems.push(Problem::PackTruncated {
                    pack: *p,
                    size: *size,
                    needed: l.end + PACK_TRAILER_LEN as u64,
                });
            }
            Some(size) if l.live && *size != l.expected_size(repo) => {
                match trailer_agrees(repo, p, *size, l.end) {
                    Ok(true) => {}
                    Ok(false) => report.problems.push(Problem::PackSize {
                        pack: *p,
                        size: *size,
                        expected: l.expected_size(repo),
                    }),
                    Err(e) => report.problems.push(Problem::PackReadFailed {
                        pack: *p,
                        error: e.message,
                    }),
                }
            }
            Some(_) => {}
        }
    }
    report.unindexed_packs = stored
        .keys()
        .filter(|p| !listing.packs.contains_key(p) && !pending_orphans.contains(p))
        .count();

    if opts.read_data || opts.subset.is_some() {
        progress.phase(Phase::ReadingPacks);
        let mut packs: Vec<(PackId, u64)> = stored.iter().map(|(p, s)| (*p, *s)).collect();
        packs.sort();
        if let Some(sub) = &opts.subset {
            sub.select(&mut packs);
        }
        progress.set_total(Some(packs.iter().map(|(_, s)| s).sum()), None);
        let (problems, blobs) = read_packs(repo, &packs, &listing.packs, progress)?;
        // Those this user may not read, or that reading failed on, were not read.
        let unread: std::collections::HashSet<PackId> = (problems.iter())
            .filter_map(|p| match p {
                Problem::PackUnreadable { pack, .. } | Problem::PackReadFailed { pack, .. } => {
                    Some(*pack)
                }
                _ => None,
            })
            .collect();
        report.packs_read = packs.len() - unread.len();
        report.bytes_read = (packs.iter())
            .filter(|(p, _)| !unread.contains(p))
            .map(|(_, s)| s)
            .sum();
        // A pack read whole and found intact, listed falsely: what its listing
        // said of its size was the false entries' (QA r22: "appended to, or its
        // end cut off" beside "intact").
        let false_listed: HashSet<PackId> = (problems.iter())
            .filter_map(|p| match p {
                Problem::FalseIndexEntries { pack, .. } => Some(*pack),
                _ => None,
            })
            .collect();
        report.problems.retain(|p| match p {
            Problem::PackTruncated { pack, .. } | Problem::PackSize { pack, .. } => {
                !false_listed.contains(pack)
            }
            _ => true,
        });
        report.problems.extend(problems);
        bad.copies.extend(blobs);
    }

    // Snapshots: every tree, chunk list and chunk must resolve.
    progress.phase(Phase::WalkingSnapshots);
    report.snapshots = snaps.len() + bad_snaps.len();
    for e in bad_snaps {
        report.problems.push(Problem::SnapshotUnreadable {
            snapshot: e.id,
            advice: e.advice(),
            error: e.error.to_string(),
        });
    }
    let mut walked = Walked::default();
    let mut object_problems = ObjectProblems::new();
    for (sid, snap) in snaps {
        progress.check_cancelled()?;
        let root = match snap.tree_id() {
            Ok(r) => r,
            Err(e) => {
                let e = crate::repo::SnapshotError {
                    id: *sid,
                    error: Error::damaged(format!("snapshot {}", sid.to_hex()), e),
                };
                report.problems.push(Problem::SnapshotUnreadable {
                    snapshot: *sid,
                    advice: e.advice(),
                    error: e.error.to_string(),
                });
                continue;
            }
        };
        walk_snapshot(
            repo,
            sid,
            root,
            &bad,
            &mut walked,
            &mut object_problems,
            progress,
        )?;
    }
    let mut extra: Vec<(ProblemKey, Problem)> = object_problems.into_iter().collect();
    extra.sort_by(|a, b| a.0.cmp(&b.0));
    report.problems.extend(extra.into_iter().map(|(_, p)| p));
    // A client shown one host's snapshots cannot tell another host's from one
    // deleted behind cairn's back (QA: six false errors, whose advice, `repair
    // snapshots`, then recorded them as lost).
    report.only_host = repo.backend().partial_view()?;
    if report.only_host.is_none() {
        report.problems.extend(vanished_snapshots(repo, state)?);
    }
    for (key, kf) in repo.list_keys()? {
        if let Err(e) = kf {
            report.problems.push(Problem::KeyUnreadable {
                key,
                error: e.to_string(),
            });
        }
    }
    if let Some(want) = &listing.dedup {
        report.problems.extend(dedup_lists(repo, state, want));
    }
    Ok(report)
}

/// How many stray names a report lists (`strays` counts them all).
pub const SHOWN_STRAYS: usize = 20;

/// Objects in the repository's folders whose names no reader opens: a copy made
/// by hand under another spelling (cairn writes ids in lower case), a file put in
/// the wrong folder, a name that is no id. Not damage, since every reader passes
/// them over, but whoever copied a snapshot back under an upper-case name would
/// otherwise believe it is there (QA). Advisory: a folder that cannot be listed
/// (one a server's token may not list) is passed over. `data` is the listing of
/// `data/` the caller made already.
fn stray_names(
    repo: &Repository,
    data: &[cairn_backend::ObjectInfo],
    stored: &HashMap<PackId, u64>,
) -> (u64, Vec<String>, Vec<MisplacedPack>) {
    let mut count = 0u64;
    let mut shown = Vec::new();
    // A pack put back by hand in the wrong folder is the one copy of its data:
    // said where it belongs (QA: the note said "remove it", and the repair
    // `check` advised dropped the file whose data it held).
    let mut misplaced = Vec::new();
    // (One whose id is stored in its place too is a copy, a stray like others.)
    for o in data.iter().filter(|o| names::listed(&o.name).is_empty()) {
        let lower = names::base(&o.name).to_ascii_lowercase();
        if let Ok(id) = PackId::from_hex(&lower)
            && !stored.contains_key(&id)
            && misplaced.len() < MAX_MISPLACED
        {
            misplaced.push(MisplacedPack {
                name: o.name.clone(),
                place: names::pack(&lower),
            });
        }
    }
    let mut note = |dir: &str, name: &str| {
        let (admin, hex) = names::split_admin(names::listed(name));
        let id = hex.len() == 64 && hex.bytes().all(|b| matches!(b, b'0'..=b'9' | b'a'..=b'f'));
        // Only index files and locks carry the admin mark.
        if !id || (admin && dir != names::INDEX && dir != names::LOCKS) {
            count += 1;
            if shown.len() < SHOWN_STRAYS {
                shown.push(name.to_string());
            }
        }
    };
    for o in data {
        note(names::DATA, &o.name);
    }
    for dir in [
        names::KEYS,
        names::INDEX,
        names::SNAPSHOTS,
        names::LOCKS,
        names::PENDING,
        names::DEDUP,
        names::HOSTS,
        names::RECEIVED,
        names::FORGOTTEN,
    ] {
        if let Ok(list) = repo.backend().list(dir) {
            for o in list {
                note(dir, &o.name);
            }
        }
    }
    shown.sort();
    misplaced.sort_by(|a, b| a.name.cmp(&b.name));
    (count, shown, misplaced)
}

/// How many misplaced packs a report names (a whole `data/` copied flat would
/// otherwise make the report as long as the repository).
const MAX_MISPLACED: usize = 10_000;

/// A pack stored under a name no reader opens, and the name it belongs under.
#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize)]
pub struct MisplacedPack {
    pub name: String,
    pub place: String,
}

/// What the index files and pending records say of one pack.
#[derive(Clone, Copy, Debug)]
struct Listed {
    /// Where its last listed blob ends.
    end: u64,
    blobs: u64,
    /// The sum of its entries' fingerprints ([`entry_print`]).
    print: u64,
    /// Listed by a live index file (else only by a pending-deletion record).
    live: bool,
    /// Live index files list it differently (one of them falsely, or in part):
    /// its size says nothing, and only reading it whole tells.
    mixed: bool,
}

/// Whether a pack whose size is not the expected one still ends in a trailer whose
/// header leaves room for its indexed blobs before it (one small read): a listing
/// of some of a pack's blobs (which is not damage: a pending record of a repair, a
/// client's partial listing) and another version's header layout pass; bytes
/// appended or an end cut off break the trailer and do not.
/// A trailer the storage failed to read is an error: not known to disagree.
fn trailer_agrees(
    repo: &Repository,
    pack: &PackId,
    size: u64,
    end: u64,
) -> std::result::Result<bool, cairn_backend::BackendError> {
    let t = PACK_TRAILER_LEN as u64;
    if size < t {
        return Ok(false);
    }
    let b = match repo
        .backend()
        .get_range(&names::pack(&pack.to_hex()), size - t, t)
    {
        Ok(b) => b,
        Err(e) if e.is_read_failure() => return Err(e),
        Err(_) => return Ok(false),
    };
    Ok(cairn_format::pack::parse_trailer(size, &b)
        .ok()
        .is_some_and(|(blob_bytes, _)| blob_bytes >= end))
}

impl Listed {
    /// The size of a pack holding just these blobs: the blobs back to back, the
    /// sealed header (a version byte, the entry count, the entries) and the trailer.
    fn expected_size(&self, repo: &Repository) -> u64 {
        let count_len = (1..=10).find(|i| self.blobs >> (7 * i) == 0).unwrap_or(10);
        self.end
            + 1
            + count_len
            + self.blobs * cairn_format::consts::PACK_HEADER_ENTRY_LEN as u64
            + repo.key().sealer.overhead() as u64
            + PACK_TRAILER_LEN as u64
    }

    fn of(blobs: &[IndexBlob], live: bool) -> Listed {
        let mut l = Listed {
            end: 0,
            blobs: 0,
            print: 0,
            live,
            mixed: false,
        };
        for b in blobs {
            l.end = l.end.max(u64::from(b.offset) + u64::from(b.length));
            l.blobs += 1;
            l.print = l.print.wrapping_add(entry_print(
                &b.id,
                b.offset,
                b.length,
                b.raw_length,
                b.kind as u8,
                b.compression as u8,
            ));
        }
        l
    }
}

/// A 64-bit fingerprint of one pack entry. Their wrapping sum fingerprints a
/// listing as a set, so a pack's header can be compared with what the index
/// says of the pack without holding the index's entries: both sides are
/// authenticated, so a difference is a writer's bug, not an attack, and 64 bits
/// find it.
fn entry_print(id: &BlobId, offset: u32, length: u32, raw: u32, kind: u8, compression: u8) -> u64 {
    fn mix(mut z: u64) -> u64 {
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }
    let mut h = mix(u64::from(offset) | u64::from(length) << 32);
    h = mix(h ^ (u64::from(raw) | u64::from(kind) << 32 | u64::from(compression) << 40));
    for word in id.0.chunks_exact(8) {
        let mut w = [0u8; 8];
        w.copy_from_slice(word);
        h = mix(h ^ u64::from_le_bytes(w));
    }
    h
}

/// The index as check reads it: one streamed pass over the files.
struct Listing {
    /// The files' lists and the pending records (live files hold no packs).
    state: IndexState,
    /// Every pack a live file or pending record lists (the first live listing,
    /// else the pending one).
    packs: HashMap<PackId, Listed>,
    /// When dedup lists are checked: the digest of each file's list as it
    /// should be.
    /// Per index file, the digests of its dedup list as format 2 and format 1.
    dedup: Option<HashMap<IndexId, [[u8; 32]; 2]>>,
}

fn read_listing(repo: &Repository, dedup_lists: bool) -> Result<Listing> {
    use cairn_format::dedup::DedupList;
    let mut files: Vec<(IndexId, Vec<(PackId, Listed)>)> = Vec::new();
    let mut dedup = dedup_lists.then(HashMap::new);
    // Packs of pending-deletion records, in the records' order.
    let mut retired: Vec<(PackId, Listed)> = Vec::new();
    let state = repo.read_index_state_streamed(
        &mut |id, f| {
            let packs = f
                .packs
                .iter()
                .map(|p| (p.id, Listed::of(&p.blobs, true)))
                .collect();
            files.push((*id, packs));
            if let Some(d) = &mut dedup {
                let admin = crate::repo::packer::has_admin_lists(f);
                let mut want = DedupList::of(*id, f, admin);
                let v2 = *blake3::hash(&want.encode()).as_bytes();
                want.packs = None;
                d.insert(*id, [v2, *blake3::hash(&want.encode()).as_bytes()]);
            }
            Ok(())
        },
        &mut |_, record| {
            retired.extend(
                record
                    .packs
                    .iter()
                    .map(|p| (p.id, Listed::of(&p.blobs, false))),
            );
            Ok(())
        },
    )?;
    let live: HashSet<IndexId> = state.live.iter().map(|(id, _)| *id).collect();
    let mut packs: HashMap<PackId, Listed> = HashMap::new();
    // Every live listing of a pack counts: one that differs from another makes
    // the pack's listing mixed, read whole by `--read-data` (QA: a false listing
    // in a file read after the true one was never compared with the pack, and
    // the blobs only it placed there were lost without a word).
    for (id, list) in files {
        if live.contains(&id) {
            for (p, l) in list {
                match packs.entry(p) {
                    std::collections::hash_map::Entry::Vacant(v) => {
                        v.insert(l);
                    }
                    std::collections::hash_map::Entry::Occupied(mut o) => {
                        let had = o.get_mut();
                        if (had.blobs, had.print) != (l.blobs, l.print) {
                            had.mixed = true;
                            had.end = had.end.max(l.end);
                        }
                    }
                }
            }
        }
    }
    for (p, l) in retired {
        packs.entry(p).or_insert(l);
    }
    Ok(Listing {
        state,
        packs,
        dedup,
    })
}

/// What is unusable: packs missing, truncated or unreadable as a whole, and
/// blobs whose copy the index points at failed verification. A blob is bad when
/// it is in the second set or the index places it in a pack of the first.
/// Copies of blobs a read found damaged or false, by pack and entry: the
/// index may list a blob twice in one pack, the true entry and a false one
/// (another place, length or compression), and only the false one is unusable.
type DamagedCopies = HashSet<(PackId, Entry)>;

/// Blobs named in a [`Problem::FalseIndexEntries`].
const SHOWN_FALSE_ENTRIES: usize = 5;

/// One index (or header) entry of a blob in a pack, whole.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
struct Entry {
    id: BlobId,
    offset: u64,
    length: u32,
    raw_length: u32,
    compression: u8,
}

impl Entry {
    fn of_blob(b: &IndexBlob) -> Entry {
        Entry {
            id: b.id,
            offset: b.offset.into(),
            length: b.length,
            raw_length: b.raw_length,
            compression: b.compression as u8,
        }
    }

    fn of(id: &BlobId, l: &crate::index::BlobLocation) -> Entry {
        Entry {
            id: *id,
            offset: l.offset.into(),
            length: l.length,
            raw_length: l.raw_length,
            compression: l.compression as u8,
        }
    }
}

/// What `check` found unreadable: whole packs (missing, truncated without a
/// read), and copies of blobs a read found damaged.
#[derive(Default)]
struct Bad {
    packs: HashSet<PackId>,
    copies: DamagedCopies,
}

impl Bad {
    /// Whether `id` cannot be read: every copy the index lists is in a damaged or
    /// missing pack, or was read damaged. A blob stored twice, one copy damaged,
    /// is read from the other (readers try every copy): nothing is lost.
    fn holds(&self, repo: &Repository, id: &BlobId) -> bool {
        if self.packs.is_empty() && self.copies.is_empty() {
            return false;
        }
        let copies = repo.index().copies(id);
        !copies.is_empty() && copies.iter().all(|l| self.is_false(repo, id, l))
    }

    /// Whether this copy of `id` was found damaged or false, or is in a pack
    /// that is.
    fn is_false(&self, repo: &Repository, id: &BlobId, l: &crate::index::BlobLocation) -> bool {
        let p = repo.index().pack_of(l);
        self.packs.contains(&p) || self.copies.contains(&(p, Entry::of(id, l)))
    }
}

/// Compares each live index file's dedup list with the file: the data ids, the
/// flags and the supersede list must be exactly what the file says. A file without
/// a list is fine: a server counts its chunks as unknown (an `admin-` one stops its
/// dedup service until the next prune or `repair index` rewrites the index).
/// `want` has the digest of each list as the file gives it; a list that differs
/// has its file read again, to say how.
fn dedup_lists(
    repo: &Repository,
    state: &IndexState,
    want: &HashMap<IndexId, [[u8; 32]; 2]>,
) -> Vec<Problem> {
    use cairn_format::dedup::DedupList;
    let results = crate::threads::parallel_map(&state.live, 4, |(id, _)| {
        let name = cairn_backend::names::dedup(&id.to_hex());
        let data = match repo
            .backend()
            .get_bounded(&name, cairn_format::consts::MAX_INDEX_FILE_SIZE as u64)
        {
            Ok(d) => d,
            // No list (written before lists existed, or its writer was interrupted
            // or out of space): a server reads the file as unknown; not damage.
            Err(e) if e.is_not_found() => return None,
            Err(e) => return Some(format!("cannot read its dedup list: {e}")),
        };
        // Either format, as the file's would be: the file need not be read again.
        let digest = blake3::hash(&data);
        if want.get(id).is_some_and(|w| w.contains(digest.as_bytes())) {
            return None;
        }
        let l = match DedupList::decode(&data) {
            Err(e) => return Some(format!("its dedup list is damaged: {e}")),
            Ok(l) => l,
        };
        let file = match repo.read_index_file(id) {
            Ok(f) => f,
            Err(e) => {
                return Some(format!(
                    "cannot be read again to compare its dedup list: {e}"
                ));
            }
        };
        let mut want = DedupList::of(*id, &file, crate::repo::packer::has_admin_lists(&file));
        // A list of format 1 names no packs: it is compared without them.
        if l.packs.is_none() {
            want.packs = None;
        }
        if l == want {
            None
        } else if l.ids != want.ids {
            let extra = l
                .ids
                .iter()
                .filter(|i| want.ids.binary_search(i).is_err())
                .count();
            Some(format!(
                "its dedup list names {} chunk ids, the file {} ({extra} not in the file)",
                l.ids.len(),
                want.ids.len()
            ))
        } else if l.packs != want.packs {
            Some("its dedup list's packs differ from the file's".to_string())
        } else {
            Some("its dedup list's flags or supersede list differ from the file".to_string())
        }
    });
    state
        .live
        .iter()
        .zip(results)
        .filter_map(|((id, _), r)| r.map(|error| Problem::DedupListWrong { index: *id, error }))
        .collect()
}

/// Checks this machine's SSD index of the repository, rebuilding it when damaged.
fn local_index(repo: &Repository) -> Result<Option<LocalIndex>> {
    use crate::index::ssd::{CacheState, SsdIndex};
    if repo.config().index_placement != cairn_format::config::IndexPlacement::Ssd {
        return Ok(None);
    }
    let Ok(base) = repo.index_path() else {
        return Ok(None);
    };
    let path = SsdIndex::dir_for(&base, &repo.config().id)
        .display()
        .to_string();
    let mut found = SsdIndex::check_cached(repo, &base)?;
    let mut out_of_date = false;
    if found == CacheState::OutOfDate {
        // Brought up to date as the next command would (an update may keep the
        // damaged files of the build before it: QA found damage left unsaid),
        // then checked.
        out_of_date = true;
        if SsdIndex::open(repo, &base).is_ok() {
            found = SsdIndex::check_cached(repo, &base)?;
        }
    }
    let (state, error) = match found {
        CacheState::Absent => (LocalIndexState::Absent, None),
        CacheState::OutOfDate => (LocalIndexState::OutOfDate, None),
        CacheState::Intact if out_of_date => (LocalIndexState::OutOfDate, None),
        CacheState::Intact => (LocalIndexState::Intact, None),
        CacheState::Damaged(e) => match SsdIndex::open(repo, &base) {
            Ok(_) => (LocalIndexState::Rebuilt, Some(e)),
            Err(r) => (
                LocalIndexState::Damaged,
                Some(format!("{e}; rebuilding failed: {r}")),
            ),
        },
    };
    Ok(Some(LocalIndex { path, state, error }))
}

/// Snapshots that index files record as committed, that were not forgotten, and
/// whose object is gone: deleted from storage behind cairn's back. Listed after the
/// index was read (a recorded snapshot was written before its record); a candidate
/// is confirmed against a fresh read of the records, since a `forget` running
/// meanwhile records the removal before it deletes.
fn vanished_snapshots(repo: &Repository, state: &IndexState) -> Result<Vec<Problem>> {
    let (announced, forgotten) = state.snapshot_records();
    let present: HashSet<SnapshotId> = repo.list_snapshot_ids()?.into_iter().collect();
    let mut missing: Vec<SnapshotId> = announced
        .iter()
        .filter(|id| !present.contains(*id) && !forgotten.contains(*id))
        .copied()
        .collect();
    if missing.is_empty() {
        return Ok(Vec::new());
    }
    let (_, forgotten_now) = crate::repo::until_settled(
        || repo.read_index_state_streamed(&mut |_, _| Ok(()), &mut |_, _| Ok(())),
        |s| s,
    )?
    .snapshot_records();
    missing.retain(|id| !forgotten_now.contains(id));
    missing.sort();
    Ok(missing
        .into_iter()
        .map(|snapshot| Problem::SnapshotVanished { snapshot })
        .collect())
}

/// Problems found while walking snapshots, one per object, with the paths they
/// affect added as they are met.
type ObjectProblems = HashMap<ProblemKey, Problem>;
/// Orders and identifies a problem: its kind, the blob, and (for damage found below
/// a file's chunk-list root) the message.
type ProblemKey = (u8, Option<BlobId>, String);

/// At most this many affected paths are listed per problem.
const MAX_AFFECTED: usize = 100;

fn record(problems: &mut ObjectProblems, p: Problem, sid: &SnapshotId, at: &str) {
    let (order, blob) = match &p {
        Problem::BlobMissing { blob, .. } => (0, Some(*blob)),
        Problem::BlobInDamagedPack { blob, .. } => (1, Some(*blob)),
        Problem::BlobDamaged { blob, .. } => (2, *blob),
        Problem::BlobReadFailed { blob, .. } => (3, *blob),
        _ => (4, None),
    };
    // Problems without a blob of their own are told apart by their message.
    let key_text = match &p {
        Problem::BlobDamaged {
            error, blob: None, ..
        }
        | Problem::BlobReadFailed {
            error, blob: None, ..
        } => error.clone(),
        Problem::FileInconsistent { error, .. } => error.clone(),
        _ => String::new(),
    };
    let entry = problems.entry((order, blob, key_text)).or_insert(p);
    if let Some(a) = entry.affects_mut()
        && a.len() < MAX_AFFECTED
    {
        a.push(Affected {
            snapshot: *sid,
            path: if at.is_empty() {
                "/".into()
            } else {
                at.to_string()
            },
        });
    }
}

/// What the snapshots walked so far have been found to hold, so that what they
/// share is not walked again.
#[derive(Default)]
struct Walked {
    /// Trees checked in full.
    trees: IdSet,
    lists: ListTotals,
}

/// Walks one snapshot, recording every tree, chunk list and chunk it needs that is
/// missing or damaged, with the paths affected.
/// Only a cancellation is an error: the check stops.
fn walk_snapshot(
    repo: &Repository,
    sid: &SnapshotId,
    root: BlobId,
    bad: &Bad,
    walked: &mut Walked,
    problems: &mut ObjectProblems,
    progress: &Progress,
) -> Result<()> {
    if bad.holds(repo, &root) {
        let p = Problem::BlobInDamagedPack {
            blob: root,
            role: BlobRole::Tree,
            affects: vec![],
        };
        record(problems, p, sid, "");
        return Ok(());
    }
    // A tree already checked in full (in this or another snapshot) needs no second
    // walk, unless damage was found, in which case affected paths are still listed.
    if !walked.trees.insert(root) && problems.is_empty() {
        return Ok(());
    }
    let mut w = SnapshotWalk {
        repo,
        sid,
        bad,
        walked,
        problems,
        progress,
    };
    match crate::tree::walk::walk(repo, &root, &mut w) {
        Err(Error::Cancelled) => return Err(Error::Cancelled),
        Err(e) => record(problems, blob_problem(root, BlobRole::Tree, e), sid, ""),
        Ok(_) => {}
    }
    Ok(())
}

struct SnapshotWalk<'a> {
    repo: &'a Repository,
    sid: &'a SnapshotId,
    bad: &'a Bad,
    walked: &'a mut Walked,
    problems: &'a mut ObjectProblems,
    progress: &'a Progress,
}

impl Visitor for SnapshotWalk<'_> {
    type Dir = ();
    type Out = ();
    fn enter(&mut self, _: &str, _: Option<&Node>, _: &Tree) -> Result<()> {
        Ok(())
    }

    fn entry(&mut self, _: &mut (), p: &str, n: &Node) -> Result<Option<BlobId>> {
        let (repo, sid) = (self.repo, self.sid);
        match n.kind {
            NodeKind::Dir => {
                let Some(sub) = n.subtree else {
                    return Ok(None);
                };
                if self.bad.holds(repo, &sub) {
                    let problem = Problem::BlobInDamagedPack {
                        blob: sub,
                        role: BlobRole::Tree,
                        affects: vec![],
                    };
                    record(self.problems, problem, sid, p);
                    return Ok(None);
                }
                if !self.walked.trees.insert(sub) && self.problems.is_empty() {
                    return Ok(None);
                }
                Ok(Some(sub))
            }
            NodeKind::File => {
                let (bad, problems, progress) = (self.bad, &mut *self.problems, self.progress);
                let mut walked = 0u64;
                let r = self.walked.lists.walk(repo, &n.content, &mut |c| {
                    walked += 1;
                    if walked.is_multiple_of(65_536) {
                        progress.check_cancelled()?;
                    }
                    // One lookup per chunk: its length, then whether its pack is usable.
                    let Some(loc) = repo.index().get(&c.id) else {
                        let problem = Problem::BlobMissing {
                            blob: c.id,
                            role: BlobRole::Chunk,
                            affects: vec![],
                        };
                        record(problems, problem, sid, p);
                        return Ok(true);
                    };
                    let mut wrong = false;
                    // Another copy may be the true one: an index file written
                    // through an append-only token can list a blob falsely
                    // (the copy read gets the length of its own entry).
                    if u64::from(loc.raw_length) != c.length
                        && !(repo.index().copies(&c.id).iter()).any(|l| {
                            u64::from(l.raw_length) == c.length && !bad.is_false(repo, &c.id, l)
                        })
                    {
                        let problem = Problem::FileInconsistent {
                            error: format!(
                                "chunk {} is listed as {} bytes, its blob has {}",
                                c.id.short(),
                                c.length,
                                loc.raw_length
                            ),
                            affects: vec![],
                        };
                        record(problems, problem, sid, p);
                        wrong = true;
                    }
                    if bad.holds(repo, &c.id) {
                        let problem = Problem::BlobInDamagedPack {
                            blob: c.id,
                            role: BlobRole::Chunk,
                            affects: vec![],
                        };
                        record(problems, problem, sid, p);
                        wrong = true;
                    }
                    Ok(wrong)
                });
                let (bytes, count) = match r {
                    Ok(totals) => totals,
                    Err(e) => {
                        if matches!(e, Error::Cancelled) {
                            return Err(e);
                        }
                        let id = match &n.content {
                            Content::Tree { root, .. } => *root,
                            _ => BlobId([0; 32]),
                        };
                        record(problems, blob_problem(id, BlobRole::ChunkList, e), sid, p);
                        return Ok(None);
                    }
                };
                let mut wrong = Vec::new();
                if bytes != n.size {
                    wrong.push(format!(
                        "its chunks hold {bytes} bytes, the file has {}",
                        n.size
                    ));
                }
                if let Content::Tree { chunks, .. } = n.content
                    && chunks != count
                {
                    wrong.push(format!(
                        "its chunk list claims {chunks} chunks and lists {count}"
                    ));
                }
                for error in wrong {
                    let problem = Problem::FileInconsistent {
                        error,
                        affects: vec![],
                    };
                    record(self.problems, problem, sid, p);
                }
                Ok(None)
            }
            _ => Ok(None),
        }
    }

    fn unreadable(&mut self, _: &mut (), p: &str, n: &Node, e: Error) -> Result<()> {
        let id = n.subtree.unwrap_or(BlobId([0; 32]));
        record(
            self.problems,
            blob_problem(id, BlobRole::Tree, e),
            self.sid,
            p,
        );
        Ok(())
    }

    fn leave(&mut self, _: &str, _: Option<&Node>, _: ()) -> Result<()> {
        Ok(())
    }

    fn child(&mut self, _: &mut (), _: &str, _: &Node, _: ()) -> Result<()> {
        Ok(())
    }
}

/// The problem a failed read of a tree or chunk list shows.
fn blob_problem(id: BlobId, role: BlobRole, e: Error) -> Problem {
    match e {
        Error::BlobNotFound(blob) => Problem::BlobMissing {
            blob,
            role,
            affects: vec![],
        },
        Error::PackMissing { .. } => Problem::BlobInDamagedPack {
            blob: id,
            role,
            affects: vec![],
        },
        other if other.is_read_failure() => Problem::BlobReadFailed {
            blob: (role == BlobRole::Tree).then_some(id),
            role,
            error: other.to_string(),
            affects: vec![],
        },
        other => Problem::BlobDamaged {
            // A chunk list below the root names itself in the message.
            blob: (role == BlobRole::Tree).then_some(id),
            role,
            error: other.to_string(),
            affects: vec![],
        },
    }
}

/// Every entry the live index files and the pending-deletion records give the
/// packs `wanted`, each once: all of them are judged against the pack, not only
/// the copy of each blob the index reads first (QA: a false entry read second
/// was never judged, and a blob only it placed was lost without a word).
/// Streamed (a second pass over the index files, made only when some pack is
/// not intact); only the wanted packs' entries are held.
fn entries_of(
    repo: &Repository,
    wanted: &HashSet<PackId>,
) -> Result<HashMap<PackId, Vec<IndexBlob>>> {
    let files =
        std::cell::RefCell::new(Vec::<(IndexId, Vec<cairn_format::index::IndexPack>)>::new());
    let pending = std::cell::RefCell::new(Vec::<cairn_format::index::IndexPack>::new());
    let of = |ps: &[cairn_format::index::IndexPack]| -> Vec<cairn_format::index::IndexPack> {
        ps.iter()
            .filter(|p| wanted.contains(&p.id))
            .cloned()
            .collect()
    };
    let state = repo.read_index_state_streamed(
        &mut |id, f| {
            files.borrow_mut().push((*id, of(&f.packs)));
            Ok(())
        },
        &mut |_, r| {
            pending.borrow_mut().extend(of(&r.packs));
            Ok(())
        },
    )?;
    let live: HashSet<IndexId> = state.live.iter().map(|(id, _)| *id).collect();
    let mut sets: HashMap<PackId, HashSet<IndexBlob>> = HashMap::new();
    let live_packs = (files.into_inner().into_iter())
        .filter(|(id, _)| live.contains(id))
        .flat_map(|(_, ps)| ps);
    for p in live_packs.chain(pending.into_inner()) {
        sets.entry(p.id).or_default().extend(p.blobs);
    }
    Ok(sets
        .into_iter()
        .map(|(p, set)| {
            let mut v: Vec<IndexBlob> = set.into_iter().collect();
            v.sort_by_key(|b| (b.offset, b.id));
            (p, v)
        })
        .collect())
}

/// Reads every pack whole and verifies hash, header and blobs, on several threads.
/// A pack whose header authenticates, covers every byte, lists blobs that all
/// verify and matches its index listing (count and fingerprint) is intact; any
/// other is verified again against every entry the index gives it ([`entries_of`],
/// one pass for all such packs), which says exactly what is wrong.
fn read_packs(
    repo: &Repository,
    packs: &[(PackId, u64)],
    listed: &HashMap<PackId, Listed>,
    progress: &Progress,
) -> Result<(Vec<Problem>, DamagedCopies)> {
    let intact = crate::threads::parallel_map(packs, crate::threads::cores(), |(id, size)| {
        if progress.is_cancelled() {
            return None;
        }
        let ok = pack_intact(repo, id, *size, listed.get(id));
        progress.bytes_done(*size);
        Some(ok)
    });
    progress.check_cancelled()?;
    let damaged: Vec<(PackId, u64)> = packs
        .iter()
        .zip(intact)
        .filter(|(_, ok)| *ok != Some(true))
        .map(|(p, _)| *p)
        .collect();
    if damaged.is_empty() {
        return Ok((Vec::new(), HashSet::new()));
    }
    let wanted: HashSet<PackId> = damaged.iter().map(|(p, _)| *p).collect();
    let by_pack = entries_of(repo, &wanted)?;
    let results = crate::threads::parallel_map(&damaged, crate::threads::cores(), |(id, size)| {
        let indexed = by_pack.get(id).map(Vec::as_slice).unwrap_or(&[]);
        let live = listed.get(id).is_some_and(|l| l.live);
        verify_pack(repo, id, *size, indexed, live)
    });
    let mut problems = Vec::new();
    let mut bad = HashSet::new();
    for ((id, _), verified) in damaged.iter().zip(results) {
        let (msgs, blobs) = match verified {
            Verified::Checked(msgs, blobs) => (msgs, blobs),
            Verified::Misnamed(holds, blobs) => {
                problems.push(Problem::PackMisnamed {
                    pack: *id,
                    holds,
                    blobs: by_pack.get(id).map_or(0, Vec::len),
                });
                bad.extend(blobs.iter().map(|e| (*id, *e)));
                continue;
            }
            Verified::FalseEntries(blobs) => {
                problems.push(Problem::FalseIndexEntries {
                    pack: *id,
                    entries: blobs.len(),
                    blobs: blobs
                        .iter()
                        .take(SHOWN_FALSE_ENTRIES)
                        .map(|e| e.id)
                        .collect(),
                });
                bad.extend(blobs.iter().map(|e| (*id, *e)));
                continue;
            }
            Verified::Unreadable(error) => {
                problems.push(Problem::PackUnreadable { pack: *id, error });
                continue;
            }
            Verified::ReadFailed(error) => {
                problems.push(Problem::PackReadFailed { pack: *id, error });
                continue;
            }
        };
        problems.extend(
            msgs.into_iter()
                .map(|error| Problem::PackDamaged { pack: *id, error }),
        );
        bad.extend(blobs.iter().map(|e| (*id, *e)));
    }
    Ok((problems, bad))
}

/// Whether a pack read whole is intact: its header authenticates and accounts
/// for every byte before it, every blob it lists decodes to its id, and the
/// entries are exactly those its index listing has (none when no index lists
/// it). False says nothing more: [`verify_pack`] then finds what is wrong.
fn pack_intact(repo: &Repository, id: &PackId, size: u64, listed: Option<&Listed>) -> bool {
    let Ok(data) = repo
        .backend()
        .get_range(&names::pack(&id.to_hex()), 0, size)
    else {
        return false;
    };
    let trailer = data
        .get(data.len().saturating_sub(PACK_TRAILER_LEN)..)
        .unwrap_or(&[]);
    let Ok((header_off, header_len)) = pack::parse_trailer(data.len() as u64, trailer) else {
        return false;
    };
    let Some(sealed) = data.get(header_off as usize..(header_off + u64::from(header_len)) as usize)
    else {
        return false;
    };
    let Ok(entries) = repo
        .key()
        .sealer
        .open("pack header", sealed)
        .map_err(|e| e.to_string())
        .and_then(|p| pack::decode_header(&p).map_err(|e| e.to_string()))
    else {
        return false;
    };
    let (mut offset, mut print) = (0u64, 0u64);
    for e in &entries {
        let Some(s) = data.get(offset as usize..offset as usize + e.length as usize) else {
            return false;
        };
        if blob::decode(repo.key(), &e.id, s, e.raw_length, e.compression).is_err() {
            return false;
        }
        let Ok(at) = u32::try_from(offset) else {
            return false;
        };
        print = print.wrapping_add(entry_print(
            &e.id,
            at,
            e.length,
            e.raw_length,
            e.kind as u8,
            e.compression as u8,
        ));
        offset += u64::from(e.length);
    }
    offset == header_off
        && listed.is_none_or(|l| !l.mixed && l.blobs == entries.len() as u64 && l.print == print)
}

/// What reading a pack whole found.
enum Verified {
    /// Problems found and the index entries (blob id, offset) that are unusable.
    Checked(Vec<String>, Vec<Entry>),
    /// Another pack, whole, under this one's name; the entries the index places
    /// in this one are unusable.
    Misnamed(PackId, Vec<Entry>),
    /// The pack is whole and authentic; these index entries place blobs in it
    /// where it does not hold them.
    FalseEntries(Vec<Entry>),
    /// This user may not read it: nothing is known of its content.
    Unreadable(String),
    /// Reading it failed (I/O error, storage failing): nothing is known of its
    /// content either.
    ReadFailed(String),
}

fn verify_pack(
    repo: &Repository,
    id: &PackId,
    size: u64,
    indexed: &[IndexBlob],
    live: bool,
) -> Verified {
    let all_bad =
        |m: String| Verified::Checked(vec![m], indexed.iter().map(Entry::of_blob).collect());
    // A whole-object range read: large ones bypass the page cache (much cheaper
    // here than buffered reads, and a check should not evict everything else).
    let data = match repo
        .backend()
        .get_range(&names::pack(&id.to_hex()), 0, size)
    {
        Ok(d) => d,
        // A retired pack (no live entry) that a prune deleted while we ran.
        Err(e) if e.is_not_found() && !live => return Verified::Checked(vec![], vec![]),
        Err(e) if e.kind == cairn_backend::BackendErrorKind::PermissionDenied => {
            return Verified::Unreadable(e.message);
        }
        // The medium or the storage failed, not the pack (which a missing file, a
        // directory in its place or a short one is).
        Err(e) if e.is_read_failure() => return Verified::ReadFailed(e.message),
        Err(e) => return all_bad(format!("cannot be read: {e}")),
    };
    let decode_at = |b: &BlobId, offset: u64, length: u32, raw: u32, c| -> Result<()> {
        match data.get(offset as usize..offset as usize + length as usize) {
            Some(s) => blob::decode(repo.key(), b, s, raw, c).map(|_| ()),
            None => Err(Error::Invalid("outside the pack".into())),
        }
    };
    let mut problems = Vec::new();
    // In the index's order, and as a set for lookups (a pack of small blobs
    // relisted falsely has thousands).
    let mut bad: Vec<Entry> = Vec::new();
    let mut bad_set: HashSet<Entry> = HashSet::new();
    // The index's entries that decode where they say.
    let mut good: HashSet<Entry> = HashSet::new();
    for l in indexed {
        let (b, entry) = (&l.id, Entry::of_blob(l));
        if let Err(e) = decode_at(b, l.offset.into(), l.length, l.raw_length, l.compression) {
            let short = b.short();
            problems.push(naming(format!("blob {short}"), &e.to_string(), &short));
            if bad_set.insert(entry) {
                bad.push(entry);
            }
        } else {
            good.insert(entry);
        }
    }
    let trailer = data
        .get(data.len().saturating_sub(PACK_TRAILER_LEN)..)
        .unwrap_or(&[]);
    let header = pack::parse_trailer(data.len() as u64, trailer)
        .map_err(|e| e.to_string())
        .and_then(|(off, len)| {
            let sealed = &data[off as usize..(off + u64::from(len)) as usize];
            repo.key()
                .sealer
                .open("pack header", sealed)
                .map_err(|e| e.to_string())
                .and_then(|p| pack::decode_header(&p).map_err(|e| e.to_string()))
                .map(|entries| (off, entries))
        });
    // With a readable header that covers every byte before it, every byte of the
    // pack is authenticated once each blob is verified: no separate hash needed.
    let mut covered = false;
    // Every blob the header lists decodes: the file is a whole pack (of some name).
    let mut header_whole = false;
    match header {
        Err(e) => problems.push(format!("header: {e}")),
        Ok((header_off, entries)) => {
            // Entry by entry, whole: the index may list a blob twice in one
            // pack, once falsely (pentest: a backup token's index file
            // re-listing every blob of the real packs at shuffled offsets).
            let mut offset = 0u64;
            let mut listed: HashSet<Entry> = HashSet::new();
            header_whole = true;
            for e in &entries {
                let entry = Entry {
                    id: e.id,
                    offset,
                    length: e.length,
                    raw_length: e.raw_length,
                    compression: e.compression as u8,
                };
                listed.insert(entry);
                // Copies the index does not point at exactly (duplicates, or
                // under an index entry that says another length) are verified
                // too; those it does were above. One that fails makes the file
                // damaged, not another pack (QA r18: a flipped byte was called
                // another pack, whole, and every blob lost).
                if !good.contains(&entry)
                    && let Err(err) =
                        decode_at(&e.id, offset, e.length, e.raw_length, e.compression)
                {
                    header_whole = false;
                    // One the index names exactly was said above.
                    if !bad_set.contains(&entry) {
                        problems.push(format!("unindexed copy of blob {}: {err}", e.id.short()));
                    }
                }
                offset += u64::from(e.length);
            }
            if offset == header_off {
                covered = true;
            } else {
                problems.push("the header does not account for every byte before it".into());
            }
            for l in indexed {
                let (b, entry) = (&l.id, Entry::of_blob(l));
                if !listed.contains(&entry) {
                    problems.push(format!(
                        "blob {} is in the index, but not so in the pack header (its place, length or \
                         compression differ)",
                        b.short()
                    ));
                    if bad_set.insert(entry) {
                        bad.push(entry);
                    }
                }
            }
        }
    }
    let actual = PackId::of_content(&data);
    // Whole and under its own name: nothing in it is damaged, and whatever the
    // index places in it where the header does not is a false entry.
    if covered && header_whole && actual == *id && !bad.is_empty() {
        return Verified::FalseEntries(bad);
    }
    if covered && header_whole && actual != *id {
        // Another pack, whole, under this one's name (moved or copied over it):
        // said once, not as damage of every blob (QA: two lines a blob, each
        // calling it damaged).
        return Verified::Misnamed(actual, bad);
    }
    if (!covered || !problems.is_empty()) && actual != *id {
        problems.insert(
            0,
            format!(
                "content does not match its name (damaged); {} of {} unreadable",
                bad.len(),
                crate::units::count_is(indexed.len() as u64, "blob")
            ),
        );
    }
    Verified::Checked(problems, bad)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn subsets_partition_and_sample() {
        let packs: Vec<(PackId, u64)> = (0..200u32)
            .map(|i| {
                let mut id = [0u8; 32];
                id[..4].copy_from_slice(&i.wrapping_mul(2_654_435_761).to_be_bytes());
                (PackId(id), 1)
            })
            .collect();
        // N/M for N = 1..M reads every pack exactly once.
        let mut seen = Vec::new();
        for n in 1..=7 {
            let mut p = packs.clone();
            Subset::Part { n, m: 7 }.select(&mut p);
            assert!(!p.is_empty());
            seen.extend(p);
        }
        seen.sort();
        let mut all = packs.clone();
        all.sort();
        assert_eq!(seen, all);
        // A percentage takes that share (rounded up), without repeats.
        let mut p = packs.clone();
        Subset::Percent(10.0).select(&mut p);
        assert_eq!(p.len(), 20);
        p.sort();
        p.dedup();
        assert_eq!(p.len(), 20);
        // A size takes random packs until it is reached (the last may go past
        // it): at least one, whatever their sizes.
        let sized: Vec<(PackId, u64)> = packs.iter().map(|(id, _)| (*id, 10)).collect();
        let mut p = sized.clone();
        Subset::Bytes(95).select(&mut p);
        assert_eq!(p.len(), 10, "{p:?}");
        let mut p = sized.clone();
        Subset::Bytes(1).select(&mut p);
        assert_eq!(p.len(), 1);
        let mut p = sized;
        Subset::Bytes(u64::MAX).select(&mut p);
        assert_eq!(p.len(), 200);
        let mut p = vec![(PackId([1; 32]), 1000), (PackId([2; 32]), 10)];
        Subset::Bytes(5).select(&mut p);
        assert_eq!(p.len(), 1);
    }

    /// A pack read whole is intact only when its header matches its index
    /// listing exactly; otherwise the index's own entries decide what is wrong:
    /// a listing that misses a blob the header has is no damage (the copy is
    /// verified as unindexed), one that places blobs where they are not is.
    #[test]
    fn packs_are_compared_with_their_listing() {
        use crate::progress::Progress;
        use crate::session::IndexLoad;
        use cairn_format::index::IndexFile;
        use cairn_format::pack::BlobKind;
        let blobs: Vec<(BlobKind, Vec<u8>)> = (0..3u8)
            .map(|i| (BlobKind::Data, vec![i; 100 + usize::from(i)]))
            .collect();
        let run = |listing: &dyn Fn(&mut Vec<IndexBlob>)| {
            let repo = crate::testutil::mem_repo();
            let mut pack = crate::testutil::store(&repo, &blobs);
            let size = repo.list_packs().unwrap()[&pack.id];
            let all = Listed::of(&pack.blobs, true);
            assert!(pack_intact(&repo, &pack.id, size, Some(&all)));
            assert!(pack_intact(&repo, &pack.id, size, None));
            listing(&mut pack.blobs);
            let changed = Listed::of(&pack.blobs, true);
            let intact = pack_intact(&repo, &pack.id, size, Some(&changed));
            repo.write_index_file(&IndexFile {
                packs: vec![pack],
                ..Default::default()
            })
            .unwrap();
            let mut s: Session<Read> =
                Session::open(repo, "check", IndexLoad::Deferred, &Progress::none()).unwrap();
            let opts = CheckOptions {
                read_data: true,
                ..Default::default()
            };
            (intact, check(&mut s, &opts).unwrap())
        };
        let (intact, r) = run(&|_| {});
        assert!(intact && r.problems.is_empty(), "{:?}", r.problems);
        assert_eq!((r.packs_read, r.blobs), (1, 3));

        let (intact, r) = run(&|b| {
            b.pop();
        });
        assert!(!intact);
        assert!(r.problems.is_empty(), "{:?}", r.problems);

        let (intact, r) = run(&|b| {
            let o = b[0].offset;
            b[0].offset = b[1].offset;
            b[1].offset = o;
        });
        assert!(!intact);
        // The pack is whole: the swapped entries are false, not damage of it
        // (and no blob is lost: the walk finds no snapshot to name).
        assert!(
            matches!(
                r.problems.as_slice(),
                [Problem::FalseIndexEntries { entries: 2, .. }]
            ),
            "{:?}",
            r.problems
        );
    }

    /// See: issue "check --read-data misses what restore then fails on": a file
    /// whose size is not what its chunks hold, a chunk listed with another length
    /// than its blob, and a chunk-list root claiming 2^60 chunks.
    #[test]
    fn files_inconsistent_with_their_content_are_problems() {
        use cairn_format::pack::BlobKind;
        use cairn_format::tree::{ChunkList, ChunkRef, Node, Tree};
        let repo = crate::testutil::mem_repo();
        let chunk = b"some file content".to_vec();
        let cid = repo.key().blob_id(&chunk);
        let list = ChunkList {
            level: 0,
            entries: vec![ChunkRef {
                id: cid,
                length: chunk.len() as u64,
            }],
        }
        .encode();
        let lid = repo.key().blob_id(&list);
        let file = |name: &str, size: u64, content: Content| {
            let mut n = Node::new(name.as_bytes().to_vec(), NodeKind::File);
            n.size = size;
            n.content = content;
            n
        };
        let inline = |length: u64| Content::Inline(vec![ChunkRef { id: cid, length }]);
        let tree = Tree {
            // Names in byte order, as trees must have them.
            nodes: vec![
                file(
                    "count",
                    chunk.len() as u64,
                    Content::Tree {
                        root: lid,
                        depth: 1,
                        chunks: 1 << 60,
                    },
                ),
                file("length", 5, inline(5)),
                file("ok", chunk.len() as u64, inline(chunk.len() as u64)),
                file("size", 999, inline(chunk.len() as u64)),
            ],
        }
        .encode();
        let tid = repo.key().blob_id(&tree);
        let blobs = vec![
            (BlobKind::Data, chunk.clone()),
            (BlobKind::ChunkList, list),
            (BlobKind::Tree, tree),
        ];
        let r = check_snapshots_of(repo, blobs, &[tid]);
        let found: Vec<(String, String)> = r
            .problems
            .iter()
            .filter_map(|p| match p {
                Problem::FileInconsistent { error, affects } => {
                    Some((affects[0].path.clone(), error.clone()))
                }
                _ => None,
            })
            .collect();
        assert_eq!(found.len(), 3, "{:?}", r.problems);
        let has =
            |path: &str, words: &str| found.iter().any(|(p, e)| p == path && e.contains(words));
        assert!(has("/size", "the file has 999"), "{found:?}");
        assert!(has("/length", "listed as 5 bytes"), "{found:?}");
        assert!(
            has("/count", "claims 1152921504606846976 chunks"),
            "{found:?}"
        );
    }

    /// Stores `blobs` in one pack and a snapshot of each tree in `trees`, and checks.
    fn check_snapshots_of(
        repo: Repository,
        blobs: Vec<(cairn_format::pack::BlobKind, Vec<u8>)>,
        trees: &[BlobId],
    ) -> CheckReport {
        use crate::progress::Progress;
        use crate::session::IndexLoad;
        use cairn_format::snapshot::Snapshot;
        let pack = crate::testutil::store(&repo, &blobs);
        repo.write_index_file(&cairn_format::index::IndexFile {
            packs: vec![pack],
            ..Default::default()
        })
        .unwrap();
        let lock = crate::lock::RepoLock::acquire(&repo, "test", false).unwrap();
        for tid in trees {
            repo.write_snapshot(
                &Snapshot {
                    version: 1,
                    time: crate::time::now_rfc3339(),
                    utc_offset: None,
                    hostname: "h".into(),
                    username: "u".into(),
                    paths: vec!["/x".into()],
                    tags: vec![],
                    tree: tid.to_hex(),
                    parent: None,
                    excludes: vec![],
                    original: None,
                    copied_from: None,
                    program_version: "test".into(),
                    image: None,
                    summary: Default::default(),
                },
                &lock,
            )
            .unwrap();
        }
        drop(lock);
        let mut s: Session<Read> =
            Session::open(repo, "check", IndexLoad::Deferred, &Progress::none()).unwrap();
        check(&mut s, &CheckOptions::default()).unwrap()
    }

    /// A chunk list that names one child list 4,096 times at each level makes a
    /// file of 2^48 chunks out of four small blobs. `check` walks each list once,
    /// yet still adds the file up, names every file a missing chunk under such a
    /// list affects, and finds a list met again at the wrong depth.
    #[test]
    fn a_chunk_list_naming_one_list_thousands_of_times_is_checked_once() {
        use cairn_format::consts::CHUNK_LIST_FANOUT;
        use cairn_format::pack::BlobKind;
        use cairn_format::tree::{ChunkList, ChunkRef, Node, Tree};
        let repo = crate::testutil::mem_repo();
        let chunk = b"abc".to_vec();
        let cid = repo.key().blob_id(&chunk);
        let lost = BlobId([7; 32]);
        let mut blobs = vec![(BlobKind::Data, chunk.clone())];
        // Four levels of lists, each naming the one below (or the chunk) 4,096 times;
        // the `lost` bomb's bottom list also names a chunk no index holds.
        let mut bomb = |last: BlobId| {
            let (mut id, mut len) = (cid, 3u64);
            for level in 0..4u8 {
                let mut entries = vec![ChunkRef { id, length: len }; CHUNK_LIST_FANOUT];
                if level == 0 {
                    entries[CHUNK_LIST_FANOUT - 1].id = last;
                }
                let list = ChunkList { level, entries }.encode();
                id = repo.key().blob_id(&list);
                len *= CHUNK_LIST_FANOUT as u64;
                blobs.push((BlobKind::ChunkList, list));
            }
            (id, len)
        };
        let (root, size) = bomb(cid);
        let (lost_root, _) = bomb(lost);
        let file = |name: &str, root: BlobId, depth: u8| {
            let mut n = Node::new(name.as_bytes().to_vec(), NodeKind::File);
            n.size = size;
            n.content = Content::Tree {
                root,
                depth,
                chunks: 1 << 48,
            };
            n
        };
        let mut trees = Vec::new();
        for names in [["a", "b", "c"], ["d", "e", "f"]] {
            let tree = Tree {
                nodes: vec![
                    file(names[0], root, 4),
                    file(names[1], lost_root, 4),
                    file(names[2], root, 3),
                ],
            }
            .encode();
            trees.push(repo.key().blob_id(&tree));
            blobs.push((BlobKind::Tree, tree));
        }
        let r = check_snapshots_of(repo, blobs, &trees);
        let paths = |p: &Problem| -> Vec<String> {
            let mut v: Vec<String> = p.affects().iter().map(|a| a.path.clone()).collect();
            v.sort();
            v
        };
        assert_eq!(r.problems.len(), 2, "{:?}", r.problems);
        let missing = r.problems.iter().find(|p| {
            matches!(p, Problem::BlobMissing { blob, role: BlobRole::Chunk, .. } if *blob == lost)
        });
        assert_eq!(missing.map(paths), Some(vec!["/b".into(), "/e".into()]));
        let depth = r.problems.iter().find(|p| {
            matches!(p, Problem::BlobDamaged { error, .. } if error.contains("level does not match"))
        });
        assert_eq!(depth.map(paths), Some(vec!["/c".into(), "/f".into()]));
    }
}
