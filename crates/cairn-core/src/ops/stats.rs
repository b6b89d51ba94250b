//! What a datastore holds and what it costs: logical data, deduplication,
//! compression, and where every stored byte goes.
//!
//! The numbers add up exactly:
//!
//! ```text
//! stored × (1 − dedup) = unique_data            (plaintext of the unique chunks)
//! unique_data × (1 − compression) = compressed_data
//! compressed_data + overhead = occupied
//! ```
//!
//! where `overhead` is itemised (envelopes of data blobs, trees and chunk lists,
//! pack headers, blobs nothing needs, index files, snapshots, everything else) and
//! each item comes from a different source than `occupied`, which is the sum of the
//! sizes of every object in storage.

use crate::error::{Error, Result};
use crate::ops::scan;
use crate::repo::Repository;
use crate::session::{Read, Session};
use cairn_backend::names;
use cairn_format::SnapshotId;
use cairn_format::pack::BlobKind;
use std::collections::HashSet;

#[derive(Clone, Debug, Default, serde::Serialize)]
pub struct Overhead {
    /// Nonces and tags (or checksums) of the unique data blobs.
    pub envelope_bytes: u64,
    /// Trees and chunk lists the snapshots need, as stored.
    pub metadata_bytes: u64,
    /// Pack headers and trailers.
    pub pack_header_bytes: u64,
    /// Blobs no selected snapshot needs (forgotten data before prune, duplicate
    /// copies, packs no index lists).
    pub unused_bytes: u64,
    /// Of `unused_bytes`: second copies of blobs that are needed (backups running at
    /// the same time that stored the same new data each; prune reclaims them).
    pub duplicate_bytes: u64,
    pub index_bytes: u64,
    pub snapshot_bytes: u64,
    /// Config, key files, pending-deletion records, dedup lists and a server's host
    /// records (locks, being transient, are not counted).
    pub other_bytes: u64,
}

impl Overhead {
    /// Every item once (`duplicate_bytes` is part of `unused_bytes`).
    pub fn total(&self) -> u64 {
        self.envelope_bytes
            + self.metadata_bytes
            + self.pack_header_bytes
            + self.unused_bytes
            + self.index_bytes
            + self.snapshot_bytes
            + self.other_bytes
    }
}

#[derive(Clone, Debug, Default, serde::Serialize)]
pub struct IndexStats {
    pub files: usize,
    /// Bytes of index files in storage.
    pub bytes: u64,
    pub blobs: usize,
    /// Memory the index needs for these blobs: in the RAM placement a 47-byte
    /// record each and a quarter byte of directory; in the SSD placement what its
    /// loaded files hold in memory (QA: the RAM placement's figure was given,
    /// about 28 times too high).
    pub ram_bytes: u64,
    /// The repository's index placement (`ram` or `ssd`).
    pub placement: &'static str,
    /// The SSD placement's files on this machine's disk.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub local_disk_bytes: Option<u64>,
}

#[derive(Clone, Debug, Default, serde::Serialize)]
pub struct PackStats {
    pub count: usize,
    pub bytes: u64,
    pub average_bytes: u64,
    pub target_bytes: u64,
    /// Average pack size as a percentage of the target size; `None` when the
    /// average is above today's target: most packs were written for a larger one
    /// (`config --pack-size` lowered since), and no percentage says how full they
    /// are (QA: "959% full").
    pub fill_percent: Option<f64>,
    /// Share of pack bytes that selected snapshots need.
    pub used_percent: f64,
}

#[derive(Clone, Debug, Default, serde::Serialize)]
pub struct Stats {
    pub snapshots: usize,
    /// Logical bytes that can be restored, summed over the selected snapshots.
    pub stored_bytes: u64,
    /// Plaintext bytes of the distinct data chunks those snapshots need.
    pub unique_data_bytes: u64,
    /// The same chunks as compressed (before their envelopes).
    pub compressed_data_bytes: u64,
    pub unique_chunks: u64,
    pub average_chunk_bytes: u64,
    pub dedup_percent: f64,
    pub compression_percent: f64,
    /// Reduction from stored to compressed unique data.
    pub reduction_percent: f64,
    /// Every object in storage except locks (for a subset of snapshots: still the
    /// whole store).
    pub occupied_bytes: u64,
    /// stored : occupied.
    pub stored_to_occupied: f64,
    /// For a subset of snapshots (`stats ID...`, `--host`): the space they need,
    /// the occupied space less what none of them needs (other snapshots' data,
    /// unused blobs). The index and snapshot files count whole.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub needed_bytes: Option<u64>,
    /// stored : needed, for a subset: what the headline ratio of a subset is.
    /// Divided by the whole repository's space, one host's 5 MiB among 25 read
    /// as 0.20 : 1 (QA).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub stored_to_needed: Option<f64>,
    pub overhead: Overhead,
    pub index: IndexStats,
    pub packs: PackStats,
    /// The image snapshots among those selected (`backup --image`).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub images: Option<ImageStats>,
    /// Index files that could not be read (hex ids), left out: the packs only
    /// they listed count as unindexed.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub damaged_index_files: Vec<String>,
    /// Snapshots that could not be read (why, one each), left out of the
    /// figures of the whole repository: what only they need counts as unused.
    /// A backup token can store junk as a snapshot; the figures of the rest
    /// are still given (QA r38: stats failed for everyone, admins and the
    /// console included).
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub unreadable_snapshots: Vec<String>,
}

/// Image snapshots: each is a full image, so their stored bytes add up fast while
/// what they occupy grows only by what changed.
#[derive(Clone, Debug, Default, serde::Serialize)]
pub struct ImageStats {
    pub snapshots: usize,
    /// Image bytes, summed over the image snapshots.
    pub image_bytes: u64,
    pub blocks: u64,
    /// Blocks changed since each one's parent, summed.
    pub blocks_changed: u64,
    /// Bytes their backups added to the repository (packed), summed.
    pub data_added_packed: u64,
}

fn percent(part: u64, whole: u64) -> f64 {
    if whole == 0 {
        0.0
    } else {
        100.0 * part as f64 / whole as f64
    }
}

/// Bytes per blob of the RAM placement's table: one sorted record and a quarter
/// byte of directory (see [`crate::index::MasterIndex`]).
pub const RAM_BYTES_PER_BLOB: f64 = crate::index::RECORD_LEN as f64 + 0.25;

/// Computes the statistics for `selected` snapshots (all when `None`) in a read
/// session that loaded the index in its placement. Memory stays bounded at any
/// size: the index files are streamed and joined with the blobs the snapshots
/// need partition by partition ([`crate::ops::scan`]), so a repository of 100
/// million chunks is counted in about what its largest partition holds.
pub fn stats(session: &Session<Read>, selected: Option<&[SnapshotId]>) -> Result<Stats> {
    if !session.index_loaded() {
        return Err(Error::Invalid(
            "stats needs a session that loaded the index".into(),
        ));
    }
    let repo = session.repo();
    // Snapshots were listed before the index: their blobs are all in it.
    let (all, bad) = session.snapshots()?;
    // Named snapshots do not need the others; all of them are counted without
    // those that cannot be read, which are said.
    let unreadable: Vec<String> = match selected {
        Some(_) => Vec::new(),
        None => bad.iter().map(|e| e.to_string()).collect(),
    };
    let snaps: Vec<_> = match selected {
        None => all.clone(),
        Some(ids) => {
            let want: HashSet<&SnapshotId> = ids.iter().collect();
            all.iter()
                .filter(|(id, _)| want.contains(id))
                .cloned()
                .collect()
        }
    };
    let mut st = Stats {
        snapshots: snaps.len(),
        stored_bytes: snaps.iter().map(|(_, s)| s.summary.total_bytes).sum(),
        unreadable_snapshots: unreadable,
        ..Default::default()
    };
    for (_, s) in &snaps {
        if let Some(i) = &s.image {
            let im = st.images.get_or_insert_with(ImageStats::default);
            im.snapshots += 1;
            im.image_bytes += i.size;
            im.blocks += i.blocks;
            im.blocks_changed += i.blocks_changed;
            im.data_added_packed += s.summary.data_added_packed;
        }
    }

    // Every object in storage, by kind.
    let packs = repo.list_packs()?;
    session
        .progress()
        .phase(crate::progress::Phase::LoadingIndex);
    let mut scan = crate::repo::until_settled(
        || scan::scan_index(repo, &packs, None),
        |s: &scan::Scan| &s.state,
    )?;
    // An index file that cannot be read is left out, as prune does: the figures
    // are right unless a snapshot needs a blob only it listed, which stops the
    // walk below.
    let damaged = scan.state.damaged_index_files().map_err(|e| {
        Error::Invalid(format!(
            "{e}; statistics would be wrong (run `cairn repair index`)"
        ))
    })?;
    st.damaged_index_files = damaged.iter().map(|id| id.to_hex()).collect();
    scan.add_pending_packs();
    session
        .progress()
        .phase(crate::progress::Phase::WalkingSnapshots);
    let mut needed = scan::Needed::new(&scan)?;
    crate::tree::reachable::collect_snapshots(repo, &snaps, &mut needed, session.progress())
        .map_err(|e| crate::repo::IndexState::damaged_hint(e, &damaged))?;
    let mut needed = needed.into_spill()?;

    // Each needed blob once, as the copy the index chose (the one reads use);
    // every other copy is unused, and a duplicate when the blob is needed.
    let index = repo.index().clone();
    let overhead_per_blob = repo.config().encryption.overhead() as u64;
    let mut used_in_packs = 0u64;
    scan::join(&mut scan, &mut needed, &mut |j, rows| {
        let (id, copies, is_needed) = (j.id, j.copies, j.needed);
        let chosen = match copies.len() {
            _ if !is_needed => None,
            0 => return Err(Error::BlobNotFound(*id)),
            1 => Some(0),
            _ => {
                let at = index.get(id).ok_or(Error::BlobNotFound(*id))?;
                let pack = index.pack_of(&at);
                Some(
                    copies
                        .iter()
                        .position(|e| {
                            rows[e.pack as usize].id == pack && e.blob.offset == at.offset
                        })
                        .unwrap_or(0),
                )
            }
        };
        for (k, e) in copies.iter().enumerate() {
            let row = &mut rows[e.pack as usize];
            let stored = u64::from(e.blob.length);
            if Some(k) != chosen {
                row.unused_bytes += stored;
                if is_needed {
                    row.duplicate_bytes += stored;
                }
                continue;
            }
            row.used_bytes += stored;
            used_in_packs += stored;
            if e.blob.kind == BlobKind::Data {
                st.unique_chunks += 1;
                st.unique_data_bytes += u64::from(e.blob.raw_length);
                st.compressed_data_bytes += stored.saturating_sub(overhead_per_blob);
                st.overhead.envelope_bytes += stored.min(overhead_per_blob);
            } else {
                st.overhead.metadata_bytes += stored;
            }
        }
        Ok(())
    })?;
    st.average_chunk_bytes = st
        .unique_data_bytes
        .checked_div(st.unique_chunks)
        .unwrap_or(0);

    st.packs.count = packs.len();
    st.packs.bytes = packs.values().sum();
    st.overhead.index_bytes = listed_bytes(repo, names::INDEX)?;
    st.overhead.snapshot_bytes = listed_bytes(repo, names::SNAPSHOTS)?;
    // Locks are left out: they come and go (this command holds one itself).
    st.overhead.other_bytes = listed_bytes(repo, names::KEYS)?
        + listed_bytes(repo, names::PENDING)?
        + listed_bytes(repo, names::DEDUP)?
        + listed_bytes(repo, names::HOSTS)?
        + listed_bytes(repo, names::RECEIVED)?
        + listed_bytes(repo, names::FORGOTTEN)?
        + repo
            .backend()
            .get_bounded(
                names::CONFIG,
                cairn_format::consts::MAX_SMALL_OBJECT_SIZE as u64,
            )
            .map(|c| c.len() as u64)
            .unwrap_or(0);
    st.index.files = scan.state.live.len() + scan.state.superseded.len();
    st.index.bytes = st.overhead.index_bytes;
    st.index.blobs = index.len();
    st.index.placement = repo.config().index_placement.name();
    match index.ssd() {
        Some(ssd) => {
            st.index.ram_bytes = index.ram_bytes() as u64;
            st.index.local_disk_bytes = Some(crate::index::ssd::disk_bytes(ssd.path()));
        }
        // What the loaded table takes, as `cairn index` says it (QA r29: an
        // estimate here differed from it).
        None => st.index.ram_bytes = index.ram_bytes() as u64,
    }

    // Pack bytes: blob entries (each pack's own listing, live or pending) versus
    // the pack's size; the difference is its header and trailer.
    for (id, size) in &packs {
        let row = scan
            .number
            .get(id)
            .map(|&n| &scan.packs[n as usize])
            .filter(|r| r.file != scan::NO_FILE);
        match row {
            Some(r) if r.used_bytes + r.unused_bytes <= *size => {
                st.overhead.unused_bytes += r.unused_bytes;
                st.overhead.duplicate_bytes += r.duplicate_bytes;
                st.overhead.pack_header_bytes += size - r.used_bytes - r.unused_bytes;
            }
            // A pack no index describes is unused space as a whole.
            _ => st.overhead.unused_bytes += size,
        }
    }
    st.occupied_bytes = st.packs.bytes
        + st.overhead.index_bytes
        + st.overhead.snapshot_bytes
        + st.overhead.other_bytes;

    st.dedup_percent = 100.0 - percent(st.unique_data_bytes, st.stored_bytes);
    if st.stored_bytes == 0 {
        st.dedup_percent = 0.0;
    }
    st.compression_percent = 100.0 - percent(st.compressed_data_bytes, st.unique_data_bytes);
    if st.unique_data_bytes == 0 {
        st.compression_percent = 0.0;
    }
    st.reduction_percent = 100.0 - percent(st.compressed_data_bytes, st.stored_bytes);
    if st.stored_bytes == 0 {
        st.reduction_percent = 0.0;
    }
    let ratio = |needed: u64| {
        if needed == 0 {
            0.0
        } else {
            st.stored_bytes as f64 / needed as f64
        }
    };
    st.stored_to_occupied = ratio(st.occupied_bytes);
    if selected.is_some() {
        let needed = st.occupied_bytes.saturating_sub(st.overhead.unused_bytes);
        st.needed_bytes = Some(needed);
        st.stored_to_needed = Some(ratio(needed));
    }
    st.packs.average_bytes = st
        .packs
        .bytes
        .checked_div(st.packs.count as u64)
        .unwrap_or(0);
    st.packs.target_bytes = u64::from(repo.config().pack_size);
    st.packs.fill_percent = (st.packs.average_bytes <= st.packs.target_bytes)
        .then(|| percent(st.packs.average_bytes, st.packs.target_bytes));
    st.packs.used_percent = percent(used_in_packs, st.packs.bytes);
    Ok(st)
}

fn listed_bytes(repo: &Repository, prefix: &str) -> Result<u64> {
    Ok(repo.backend().list(prefix)?.iter().map(|o| o.size).sum())
}
