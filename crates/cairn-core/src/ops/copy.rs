//! Copying snapshots from one repository to another (`cairn copy`), sending only
//! what the destination lacks.
//!
//! Two repositories share blob ids only when they share their master secret and
//! chunker parameters (ids are keyed hashes, chunk boundaries are seeded by the key).
//! Then a copy is a set difference: every blob the snapshot needs and the
//! destination's index does not hold is read from the source, re-encoded with the
//! destination's compression and sealed with its key. Otherwise (the usual case:
//! independent repositories, possibly of different block sizes) each file is
//! re-chunked with the destination's chunker on the way, and only chunks whose
//! destination id is missing are stored.
//!
//! Re-chunking reads the file from the source; a *file map* remembers, per source
//! content (its chunk list), the destination content it became, so a file seen in
//! an earlier snapshot, or an earlier run, is neither read nor re-chunked again. The
//! map is kept in memory for the run and, when given a path, appended to a local
//! file authenticated with the destination's key; an entry from disk is used only
//! after every blob it names is found in the destination's index.
//!
//! Commit and resume: each snapshot is finished separately (packs, then index
//! files, then the snapshot object, the order of a backup), and the destination's
//! index is flushed every few thousand blobs, so a killed copy keeps what it sent;
//! the next run finds those blobs in the index and does not send them again. A copy
//! records where it came from (`Snapshot::copied_from`), so copying the same
//! snapshot again does nothing, and neither does copying a copy back to the
//! repository that holds its original (replication both ways).

use crate::error::{Error, Result};
use crate::index::IdMap;
use crate::ops::backup::InFlight;
use crate::progress::Progress;
use crate::repo::Repository;
use crate::repo::blob::{BlobEncoder, EncodedBlob};
use crate::repo::dedup::{DedupClient, Held};
use crate::repo::lock::RepoLock;
use crate::repo::packer::{BufferPool, DEFAULT_UPLOAD_THREADS, Packer, Uploader};
use crate::session::{self, Session};
use crate::tree::chunklist::{ChunkListBuilder, for_each_chunk, for_each_content_blob};
use crate::tree::walk::Visitor;
use cairn_backend::DedupAnswer;
use cairn_format::pack::BlobKind;
use cairn_format::snapshot::{CopiedFrom, Snapshot};
use cairn_format::tree::{ChunkList, ChunkRef, Content, Node, NodeKind, Tree};
use cairn_format::{BlobId, FormatError, PackId, SnapshotId};
use crossbeam_channel::{Sender, bounded, unbounded};
use std::collections::HashMap;
use std::io::Write;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

/// Index flushes while copying: every this many blobs or packs (64 MiB at the
/// default pack size), so a killed copy re-sends at most that much.
const COPY_INDEX_FLUSH_BLOBS: usize = 65_536;
const COPY_INDEX_FLUSH_PACKS: usize = 4;
/// Re-chunked data chunks asked about in one dedup question at most (by count
/// and by bytes held meanwhile).
const PENDING_CHUNKS: usize = 1024;
const PENDING_BYTES: usize = 8 << 20;

/// Re-chunked data chunks (id and bytes) waiting for one dedup question to a
/// server: one round trip for many chunks, not one each.
#[derive(Default)]
struct Pending {
    chunks: Vec<(BlobId, Vec<u8>)>,
    bytes: usize,
}

pub struct CopyOptions {
    /// Threads re-chunking or re-encoding files in parallel.
    pub threads: usize,
    /// Where file maps are kept (`<dir>/<source id>-<destination id>.map`); None:
    /// in memory for this run only.
    pub map_dir: Option<PathBuf>,
    /// Which of the source's snapshots are copied (host, tags, paths): all that
    /// match when none is named, and a named one must match.
    pub filter: crate::ops::forget::SnapshotFilter,
    /// This copy's pack size (`--pack-size`, as a backup's); None: the
    /// destination's. Small packs over a slow link lose little to a drop.
    pub pack_size: Option<u64>,
}

/// What the copy internals need besides the options.
struct Run<'a> {
    threads: usize,
    map_path: Option<PathBuf>,
    /// The destination's lock, checked before each snapshot is committed.
    lock: &'a RepoLock,
    /// The destination's snapshots when the copy began: one that appears later is
    /// read to see whether it is a copy made meanwhile by another run.
    dst_snapshots: std::collections::HashSet<SnapshotId>,
    /// The source's snapshots (as hex) that have a copy in the destination, and
    /// that copy: an image's parent copy is what its blocks are counted against.
    copies: HashMap<String, SnapshotId>,
    pack_size: Option<u64>,
}

#[derive(Clone, Debug, serde::Serialize)]
pub struct SnapshotCopy {
    pub source: SnapshotId,
    pub target: SnapshotId,
    /// The destination already had a copy of it (nothing was done).
    pub already_present: bool,
}

/// A source snapshot that could not be copied, with why.
#[derive(Clone, Debug, serde::Serialize)]
pub struct FailedCopy {
    pub source: SnapshotId,
    pub error: String,
}

/// What `cairn copy` did. `bytes_sent` and `bytes_received` are what crossed the
/// wire to the destination and from the source (after compression, with headers).
#[derive(Clone, Debug, Default, serde::Serialize)]
pub struct CopyReport {
    pub from: String,
    pub to: String,
    pub snapshots: Vec<SnapshotCopy>,
    pub snapshots_copied: usize,
    pub same_chunking: bool,
    pub logical_bytes: u64,
    pub files: u64,
    pub files_rechunked: u64,
    /// The plaintext of the blobs read from the source (decompressed: more than
    /// what crossed the wire for them, `bytes_received`).
    pub bytes_read_from_source: u64,
    pub blobs_added: u64,
    pub bytes_added: u64,
    pub bytes_sent: u64,
    pub bytes_received: u64,
    pub duration_secs: f64,
    pub failed: Vec<FailedCopy>,
    /// Source snapshots that could not even be read (not copied).
    pub unreadable_source_snapshots: Vec<String>,
    /// Things to tell the user (e.g. the file map could not be kept).
    pub warnings: Vec<String>,
}

/// Copies the snapshots named by `specs` (`latest`, id prefixes; all when empty)
/// from the source session's repository to the destination's. Indexes are loaded
/// only when something is to be copied.
pub fn copy(
    src: &mut Session<session::Read>,
    dst: &mut Session<session::Backup>,
    specs: &[String],
    opts: &CopyOptions,
) -> Result<CopyReport> {
    let start = std::time::Instant::now();
    if let Some(n) = opts.pack_size
        && !(crate::repo::CLIENT_PACK_SIZE_MIN..=crate::repo::PACK_SIZE_MAX).contains(&n)
    {
        return Err(Error::BadArgument(
            "--pack-size must be between 128 KiB and 256 MiB".into(),
        ));
    }
    if src.repo().location() == dst.repo().location() {
        return Err(Error::Invalid(
            "the source and the destination are the same repository".into(),
        ));
    }
    let progress = dst.progress().clone();
    let mut report = CopyReport {
        from: src.repo().location().to_string(),
        to: dst.repo().location().to_string(),
        ..Default::default()
    };
    let wanted = if specs.is_empty() {
        let (list, bad) = src.snapshots()?;
        report.unreadable_source_snapshots = bad.iter().map(|e| e.to_string()).collect();
        list.iter()
            .filter(|(_, s)| opts.filter.matches(s))
            .cloned()
            .collect()
    } else {
        let mut v = Vec::new();
        for spec in specs {
            v.push(src.find_snapshot_matching(spec, &opts.filter)?);
        }
        v.sort_by_key(|x| x.0);
        v.dedup_by(|x, y| x.0 == y.0);
        v
    };
    // Nothing to do: no index is loaded (a no-op copy reads only snapshot objects).
    // A copy that `repair snapshots` cut down in the destination (it lost data
    // there) is no copy of a whole source snapshot: copied again, which heals the
    // replica, unless the source's snapshot was repaired too.
    let mut present = HashMap::new();
    let mut healing = Vec::new();
    let copies = copies_in(src.repo(), dst)?;
    for (id, s) in &wanted {
        if let Some(&(there, repaired)) = copies.get(&id.to_hex()) {
            if repaired && !crate::repo::is_repaired(s) {
                healing.push((*id, there));
            } else {
                present.insert(id.to_hex(), there);
            }
        }
    }
    // A source snapshot that is itself a copy of one of the destination's (copying
    // back, as replication both ways does) is there already.
    let dst_id = &dst.repo().config().id;
    // The destination's snapshots by id, and by what copies keep of them (a copy
    // that came by another way, through a third repository, or by a copy running
    // at the same time: the same snapshot as far as copy can tell, though its tree
    // may be cut otherwise).
    let mut in_dst: HashMap<String, SnapshotId> = HashMap::new();
    let mut by_identity: HashMap<String, SnapshotId> = HashMap::new();
    for (id, s) in dst.snapshots()?.0.iter() {
        in_dst.insert(id.to_hex(), *id);
        by_identity.insert(identity(s), *id);
    }
    for (id, s) in &wanted {
        if let Some(c) = &s.copied_from
            && &c.repository == dst_id
            && let Some(original) = in_dst.get(&c.snapshot)
        {
            present.insert(id.to_hex(), *original);
        }
    }
    for (id, s) in &wanted {
        if !present.contains_key(&id.to_hex())
            && let Some(there) = by_identity.get(&identity(s))
        {
            present.insert(id.to_hex(), *there);
        }
    }
    let missing: Vec<&Snapshot> = wanted
        .iter()
        .filter(|(id, _)| !present.contains_key(&id.to_hex()))
        .map(|(_, s)| s)
        .collect();
    let mut notes = Vec::new();
    if !missing.is_empty() {
        refuse_other_hosts(dst.repo(), &missing)?;
        src.load_index()?;
        dst.load_index()?;
    }
    if !healing.is_empty() {
        // Copying again sends what the destination's index lacks: an index that
        // still lists packs that are gone would have it skip the lost data.
        let stored: std::collections::HashSet<PackId> =
            dst.repo().list_packs()?.into_keys().collect();
        let gone = dst
            .repo()
            .index()
            .packs()
            .iter()
            .filter(|p| !stored.contains(p))
            .count();
        // One found whole by another way (`identity`) needs no healing.
        healing.retain(|(id, _)| !present.contains_key(&id.to_hex()));
        for (id, there) in healing {
            if gone > 0 {
                present.insert(id.to_hex(), there);
                notes.push(format!(
                    "snapshot {} is in the destination only as {}, which `repair snapshots` \
                     left without the data it lost there, and the destination's index still \
                     lists {gone} packs that are gone: run `cairn repair index` there, then \
                     copy again to copy it whole",
                    id.short(),
                    there.short()
                ));
            } else {
                notes.push(format!(
                    "snapshot {} is in the destination only as {}, which `repair snapshots` \
                     left without the data it lost there: copied again from the source \
                     (`cairn forget {}` in the destination removes the repaired one)",
                    id.short(),
                    there.short(),
                    there.short()
                ));
            }
        }
    }
    progress.phase(crate::progress::Phase::Copy);
    // What is left to copy: the snapshots already there are not walked (QA: the
    // total was every source snapshot's size, and a job of seconds showed an ETA
    // of days).
    progress.set_total(
        Some(
            wanted
                .iter()
                .filter(|(id, _)| !present.contains_key(&id.to_hex()))
                .map(|(_, s)| s.summary.total_bytes)
                .sum(),
        ),
        None,
    );
    let sent_before = dst.repo().traffic().map(|t| t.uploaded()).unwrap_or(0);
    let received_before = src.repo().traffic().map(|t| t.downloaded()).unwrap_or(0);
    let lock = dst.lock()?;
    // Into a cairn server: data chunks the loaded index lacks are asked about
    // first, as a backup's are, so that two copies (or a copy and a backup) that
    // send the same new data at once store it once (QA: twice before).
    if !missing.is_empty() {
        dst.repo_mut().start_dedup_queries()?;
    }
    let map_path = opts.map_dir.as_ref().map(|d| {
        d.join(format!(
            "{}-{}.map",
            src.repo().config().id,
            dst.repo().config().id
        ))
    });
    // Each re-chunking thread holds a file's chunks on their way (a few MiB).
    let threads = dst.repo().memory_plan_in_use().map_or(opts.threads, |p| {
        opts.threads.min(p.share(4 << 20, 1, 64) as usize)
    });
    let run = Run {
        threads: threads.max(1),
        map_path,
        lock: &lock,
        dst_snapshots: in_dst.values().copied().collect(),
        copies: copies.iter().map(|(k, v)| (k.clone(), v.0)).collect(),
        pack_size: opts.pack_size,
    };
    let stats = copy_snapshots(src.repo(), dst.repo(), &wanted, present, &run, &progress)?;
    report.bytes_sent = dst
        .repo()
        .traffic()
        .map(|t| t.uploaded())
        .unwrap_or(0)
        .saturating_sub(sent_before);
    report.bytes_received = src
        .repo()
        .traffic()
        .map(|t| t.downloaded())
        .unwrap_or(0)
        .saturating_sub(received_before);
    report.snapshots_copied = stats
        .snapshots
        .iter()
        .filter(|s| !s.already_present)
        .count();
    report.snapshots = stats.snapshots;
    report.same_chunking = stats.same_chunking;
    report.logical_bytes = stats.logical_bytes;
    report.files = stats.files;
    report.files_rechunked = stats.files_rechunked;
    report.bytes_read_from_source = stats.bytes_read;
    report.blobs_added = stats.blobs_added;
    report.bytes_added = stats.bytes_added;
    report.failed = stats
        .failed
        .into_iter()
        .map(|(source, error)| FailedCopy { source, error })
        .collect();
    report.warnings = notes;
    report.warnings.extend(stats.warnings);
    report.duration_secs = start.elapsed().as_secs_f64();
    Ok(report)
}

/// A destination that binds this client to one host (a cairn server's host-bound
/// token) records every snapshot stored through it as that host's and shows it
/// only that host's: another host's snapshot copied there would be filed under the
/// wrong host, and, never seen again, copied anew at every run. Refused before
/// anything is sent.
fn refuse_other_hosts(dst: &Repository, missing: &[&Snapshot]) -> Result<()> {
    let Some(bound) = dst.backend().bound_host()? else {
        return Ok(());
    };
    let mut others: Vec<&str> = missing
        .iter()
        .map(|s| s.hostname.as_str())
        .filter(|h| *h != bound)
        .collect();
    if others.is_empty() {
        return Ok(());
    }
    others.sort_unstable();
    others.dedup();
    Err(Error::Invalid(format!(
        "the destination's token is bound to host {bound}: it files every snapshot it \
         stores as {bound}'s and sees no other host's, but snapshots to copy are of {}; \
         copy with --host {bound}, or through a token not bound to a host",
        others.join(", ")
    )))
}

#[derive(Clone, Debug, Default)]
struct CopyStats {
    pub snapshots: Vec<SnapshotCopy>,
    /// Blob ids shared with the source: copied blob by blob, without re-chunking.
    pub same_chunking: bool,
    /// Logical bytes of the files in the snapshots copied.
    pub logical_bytes: u64,
    pub files: u64,
    /// Files read from the source and re-chunked (the rest came from the file map).
    pub files_rechunked: u64,
    /// Bytes read from the source's files (plaintext).
    pub bytes_read: u64,
    pub blobs_added: u64,
    /// Bytes of the blobs added, as stored (compressed and sealed).
    pub bytes_added: u64,
    /// Snapshots that could not be copied (damaged or missing data in the source),
    /// with the reason; the others were copied.
    pub failed: Vec<(SnapshotId, String)>,
    /// Things the caller should tell the user (e.g. the file map is not kept).
    pub warnings: Vec<String>,
}

/// Copies `snapshots` of `src` into `dst`, oldest first, skipping those `present`
/// (from [`copies_in`]) says are there. Both repositories have their index
/// loaded; `dst` is locked (non-exclusively, like a backup) and `src` at least for
/// reading. A snapshot whose data cannot be read from the source is skipped
/// (listed in `failed`); a storage failure stops the copy.
fn copy_snapshots(
    src: &Repository,
    dst: &Repository,
    snapshots: &[(SnapshotId, Snapshot)],
    mut present: HashMap<String, SnapshotId>,
    opts: &Run<'_>,
    progress: &Progress,
) -> Result<CopyStats> {
    let same_chunking = shares_ids(src, dst);
    let mut order: Vec<&(SnapshotId, Snapshot)> = snapshots.iter().collect();
    order.sort_by(|a, b| a.1.time.cmp(&b.1.time));

    let mut warnings = Vec::new();
    let map = FileMap::open(dst, opts.map_path.as_deref(), &mut warnings);
    let map_reader = map.reader();
    let copier = Copier {
        src,
        dst,
        same_chunking,
        threads: opts.threads.max(1),
        map: Mutex::new(map),
        map_reader,
        packers: Mutex::new(None),
        uploader: Mutex::new(None),
        written: InFlight::spilling(
            crate::ops::scan::scratch_dir(dst),
            dst.memory_plan_in_use()
                .map(|p| p.share(6, 8 << 20, u64::MAX)),
        ),
        fetching: Fetching::default(),
        rechunking: Fetching::default(),
        progress,
        counters: Counters::default(),
        trees: Mutex::new(IdMap::default()),
        image: Default::default(),
        image_zero_blocks: AtomicU64::new(0),
        image_cut: Mutex::default(),
        run_images: Mutex::default(),
        dedup: dst.dedup().cloned(),
        deferred: Mutex::new(Default::default()),
        held: Mutex::new(Default::default()),
        seen: Mutex::new(Seen {
            listed: opts.dst_snapshots.clone(),
            arrived: Vec::new(),
        }),
        copies: Mutex::new(opts.copies.clone()),
    };
    let mut stats = CopyStats {
        same_chunking,
        warnings,
        ..Default::default()
    };
    // The source's server records (`hosts/`, `received/`), listed once: most
    // repositories have none, and then no snapshot costs a request for one.
    let listed = |prefix: &str| -> std::collections::HashSet<String> {
        match copier.src.backend().list(prefix) {
            Ok(l) => l
                .into_iter()
                .map(|o| cairn_backend::names::listed(&o.name).to_string())
                .collect(),
            Err(_) => Default::default(),
        }
    };
    let (hosts, received) = (
        listed(cairn_backend::names::HOSTS),
        listed(cairn_backend::names::RECEIVED),
    );
    let has_record = |sid: &SnapshotId| {
        let hex = sid.to_hex();
        (hosts.contains(&hex), received.contains(&hex))
    };
    let copied = copy_in_order(&copier, &order, &mut present, &mut stats, opts, &has_record);
    // The copies committed before a failure were each said as they were
    // (`Event::SnapshotCopied`): the report that lists them is not made.
    copied?;
    stats.warnings.extend(copier.written.spill_failure());
    let c = &copier.counters;
    stats.files = c.files.load(Ordering::Relaxed);
    stats.files_rechunked = c.files_rechunked.load(Ordering::Relaxed);
    stats.bytes_read = c.bytes_read.load(Ordering::Relaxed);
    stats.blobs_added = c.blobs_added.load(Ordering::Relaxed);
    stats.bytes_added = c.bytes_added.load(Ordering::Relaxed);
    Ok(stats)
}

/// The loop of [`copy_snapshots`]: each snapshot in turn, until one fails for
/// a reason other than damage in the source.
fn copy_in_order(
    copier: &Copier<'_>,
    order: &[&(SnapshotId, Snapshot)],
    present: &mut HashMap<String, SnapshotId>,
    stats: &mut CopyStats,
    opts: &Run<'_>,
    has_record: &dyn Fn(&SnapshotId) -> (bool, bool),
) -> Result<()> {
    let progress = copier.progress;
    for &(sid, snap) in order {
        progress.check_cancelled()?;
        if let Some(t) = present.get(&sid.to_hex()) {
            crate::lock(&copier.copies).insert(sid.to_hex(), *t);
            // A record a run killed after the snapshot did not write, now.
            match copier
                .dst
                .copy_server_records_from(copier.src, sid, t, has_record(sid))
            {
                Ok(()) => {}
                Err(e) if refusal_loses_nothing(copier, sid, snap, &e) => {}
                Err(e) => stats.warnings.push(format!(
                    "snapshot {}: its server records were not copied ({e})",
                    t.short()
                )),
            }
            stats.snapshots.push(SnapshotCopy {
                source: *sid,
                target: *t,
                already_present: true,
            });
            continue;
        }
        // Another copy into the destination may have copied it since this one
        // listed the destination: looked for before reading it, and again right
        // before committing it (two copies started together both send its data,
        // but only one stores the snapshot).
        let arrived = match copier.copied_meanwhile(sid, snap)? {
            Some(t) => Ok((t, true)),
            None => copier.copy_one(sid, snap, opts),
        };
        let target = match arrived {
            Ok((t, true)) => {
                present.insert(sid.to_hex(), t);
                crate::lock(&copier.copies).insert(sid.to_hex(), t);
                stats.snapshots.push(SnapshotCopy {
                    source: *sid,
                    target: t,
                    already_present: true,
                });
                continue;
            }
            Ok((t, false)) => t,
            // The source's data is damaged or missing: the other snapshots may be fine.
            Err(e) if e.is_lost_data() => {
                stats.failed.push((*sid, e.to_string()));
                continue;
            }
            // A pack shorter than the index says, or larger than any: only reads
            // give these, and a copy reads only the source (a truncated pack).
            Err(Error::Backend(b))
                if matches!(
                    b.kind,
                    cairn_backend::BackendErrorKind::OutOfRange
                        | cairn_backend::BackendErrorKind::TooLarge
                ) =>
            {
                stats
                    .failed
                    .push((*sid, format!("the source is damaged: {b}")));
                continue;
            }
            Err(e) => return Err(e),
        };
        progress.emit(crate::progress::Event::SnapshotCopied {
            source: sid.to_hex(),
            target: target.to_hex(),
        });
        crate::hooks::point("copy:snapshot-committed");
        // The host `cairn serve` recorded for the snapshot, and when it received
        // it, go with it, so that the replica attributes it as the original does
        // (docs/SERVER.md).
        let records =
            copier
                .dst
                .copy_server_records_from(copier.src, sid, &target, has_record(sid));
        let records = match records {
            Err(e) if refusal_loses_nothing(copier, sid, snap, &e) => Ok(()),
            r => r,
        };
        if let Err(e) = records {
            stats
                .warnings
                .push(match copier.dst.backend().bound_host() {
                    Ok(Some(_)) => format!("snapshot {}: {e}", target.short()),
                    _ => format!(
                        "snapshot {}: its server records were not copied ({e}); on the destination \
                     it counts as the host it names",
                        target.short()
                    ),
                });
        }
        present.insert(sid.to_hex(), target);
        crate::lock(&copier.copies).insert(sid.to_hex(), target);
        stats.snapshots.push(SnapshotCopy {
            source: *sid,
            target,
            already_present: false,
        });
        stats.logical_bytes += snap.summary.total_bytes;
    }
    Ok(())
}

/// Whether copying `sid`'s server records failed only because the destination
/// refuses them to its token (a backup token bound to no host), where that
/// loses nothing: the destination counts the snapshot as the host it names,
/// and the source records that host too. Not said then, on the first copy or
/// on later runs (QA r38: every run of a copy job warned, and ended in
/// `problems`); a record of another host, or one that cannot be read, is.
fn refusal_loses_nothing(
    copier: &Copier<'_>,
    sid: &SnapshotId,
    snap: &Snapshot,
    e: &Error,
) -> bool {
    matches!(e, Error::Backend(b) if b.kind == cairn_backend::BackendErrorKind::PermissionDenied)
        && matches!(copier.src.host_record(&sid.to_hex()), Ok(Some(h)) if h == snap.hostname)
}

/// What makes two snapshots copies of one another when neither names the other:
/// everything `copy` keeps but the tree (which another block size cuts otherwise).
fn identity(s: &Snapshot) -> String {
    let m = &s.summary;
    format!(
        "{}\0{}\0{}\0{:?}\0{:?}\0{:?}\0{}\0{}\0{}\0{}",
        s.time,
        s.hostname,
        s.username,
        s.paths,
        s.tags,
        s.excludes,
        m.total_bytes,
        m.files_new + m.files_changed + m.files_unchanged,
        m.dirs,
        m.other_entries
    )
}

/// Source snapshot id (hex) -> the destination's copy of it, among the snapshots
/// the destination's session listed. Needs no index: it is called first, and no
/// index is loaded when everything asked for is already there.
/// With each, whether it is a repaired one (a whole copy is preferred to it).
fn copies_in<A: session::Access>(
    src: &Repository,
    dst: &Session<A>,
) -> Result<HashMap<String, (SnapshotId, bool)>> {
    let src_repo = &src.config().id;
    let mut present: HashMap<String, (SnapshotId, bool)> = HashMap::new();
    for (id, s) in dst.snapshots()?.0.iter() {
        if let Some(c) = &s.copied_from
            && &c.repository == src_repo
        {
            let repaired = crate::repo::is_repaired(s);
            if !(repaired && present.get(&c.snapshot).is_some_and(|p| !p.1)) {
                present.insert(c.snapshot.clone(), (*id, repaired));
            }
        }
    }
    Ok(present)
}

/// Whether `src` and `dst` produce the same blob ids for the same data: same id
/// key, same chunker seed and parameters.
pub fn shares_ids(src: &Repository, dst: &Repository) -> bool {
    let (a, b) = (src.key(), dst.key());
    a.id_key == b.id_key
        && a.chunker_seed == b.chunker_seed
        && src.config().chunker == dst.config().chunker
}

#[derive(Default)]
struct Counters {
    files: AtomicU64,
    files_rechunked: AtomicU64,
    bytes_read: AtomicU64,
    blobs_added: AtomicU64,
    bytes_added: AtomicU64,
}

/// The packers of the snapshot being copied.
struct Packers {
    data: Packer,
    meta: Packer,
}

struct Copier<'a> {
    src: &'a Repository,
    dst: &'a Repository,
    same_chunking: bool,
    threads: usize,
    map: Mutex<FileMap<'a>>,
    /// Reads the map file's records of earlier runs.
    map_reader: Option<std::fs::File>,
    packers: Mutex<Option<Packers>>,
    /// Sent to without holding `packers`: a full upload queue blocks only the
    /// thread whose blob sealed a pack.
    uploader: Mutex<Option<Arc<Uploader>>>,
    /// Blobs queued for storing by this run (not in the destination's loaded index).
    /// An id enters only when its blob goes to a packer: after a failed snapshot,
    /// whose packs are still stored, every id here is in the destination.
    written: InFlight,
    /// Blobs a thread is reading from the source right now: another thread that
    /// needs one waits for it instead of reading it too (a file that is in a
    /// snapshot twice was read once per thread).
    fetching: Fetching,
    /// Contents being re-chunked: a second file with the same content (a copy in
    /// the same snapshot, or in another one's directory on another thread) waits
    /// for the first and takes its result from the file map.
    rechunking: Fetching<[u8; 32]>,
    progress: &'a Progress,
    counters: Counters,
    /// Source tree -> destination tree, for trees copied by this run: the next
    /// snapshot's unchanged directories are not walked again.
    trees: Mutex<IdMap<BlobId>>,
    /// What [`Copier::copied_meanwhile`] learnt of the destination's snapshots.
    seen: Mutex<Seen>,
    /// [`Run::copies`], and the copies this run made or found.
    copies: Mutex<HashMap<String, SnapshotId>>,
    /// The snapshot being copied is an image (`backup --image`): re-chunked files
    /// are cut in the destination's fixed blocks with the image list geometry, so
    /// the copy stays an image snapshot (and a parent for incremental ones there).
    image: std::sync::atomic::AtomicBool,
    /// Zero blocks met re-chunking the image (its `blocks_zero` in the copy).
    image_zero_blocks: AtomicU64,
    /// The image snapshot being copied into another block size: what counts
    /// its blocks changed.
    image_cut: Mutex<ImageCut>,
    /// The images this run copied into another block size, newest last: the
    /// source snapshot (hex), and their content and blocks here. Their blobs
    /// are not in the destination's loaded index, so a child copied later in
    /// the run is counted against these (QA r40: every block changed when both
    /// went in one run; review r42: two disks' snapshots interleaved).
    run_images: Mutex<std::collections::VecDeque<RunImage>>,
    /// The destination server's dedup service (see [`Repository::start_dedup_queries`]).
    dedup: Option<Arc<DedupClient>>,
    /// Data chunks another client of the server was sending when this copy
    /// needed them, with the same ids as the source's: confirmed before the
    /// snapshot is written, and read from the source then if they never arrived.
    deferred: Mutex<crate::index::IdSet>,
    /// Re-chunked data chunks another client was sending, encoded (they cannot be
    /// read again by id): stored before the snapshot only if they never arrived.
    held: Mutex<Held>,
}

/// What some thread is working on, so that the others wait for it rather than do
/// it again: blob ids being read from the source, or file contents (by their
/// [`Copier::content_key`]) being re-chunked.
struct Fetching<K = BlobId> {
    ids: Mutex<std::collections::HashSet<K>>,
    done: std::sync::Condvar,
}

impl<K> Default for Fetching<K> {
    fn default() -> Self {
        Fetching {
            ids: Mutex::new(Default::default()),
            done: Default::default(),
        }
    }
}

impl<K: Copy + Eq + std::hash::Hash> Fetching<K> {
    /// Takes for the calling thread to read those of `ids` no other thread has
    /// (one lock for the batch); the others are added to `theirs`.
    fn claim(&self, ids: impl Iterator<Item = K>, theirs: &mut Vec<K>) -> Vec<K> {
        let mut held = crate::lock(&self.ids);
        let mut mine = Vec::new();
        for id in ids {
            if held.insert(id) {
                mine.push(id);
            } else {
                theirs.push(id);
            }
        }
        mine
    }

    /// Gives back what a thread claimed (read and stored, or failed: then a
    /// waiting thread reads it itself).
    fn release(&self, ids: &[K]) {
        if ids.is_empty() {
            return;
        }
        let mut held = crate::lock(&self.ids);
        for id in ids {
            held.remove(id);
        }
        drop(held);
        self.done.notify_all();
    }

    /// Waits until no thread reads `id`; `Err(Cancelled)` when the run is.
    fn wait(&self, id: &K, progress: &Progress) -> Result<()> {
        let mut held = crate::lock(&self.ids);
        while held.contains(id) {
            progress.check_cancelled()?;
            held = self
                .done
                .wait_timeout(held, std::time::Duration::from_millis(200))
                .map(|(g, _)| g)
                .unwrap_or_else(|e| e.into_inner().0);
        }
        Ok(())
    }
}

/// Releases a thread's claims however its reading ends.
struct Claimed<'f, K: Copy + Eq + std::hash::Hash = BlobId>(&'f Fetching<K>, Vec<K>);

impl<K: Copy + Eq + std::hash::Hash> Drop for Claimed<'_, K> {
    fn drop(&mut self) {
        self.0.release(&self.1);
    }
}

/// The destination's snapshots listed so far, and those that appeared after the
/// copy began: each with the snapshot of this source it copies (if it says) and
/// its [`identity`].
struct Seen {
    listed: std::collections::HashSet<SnapshotId>,
    arrived: Vec<(SnapshotId, Option<String>, String)>,
}

/// An image snapshot cut again in the destination's block size (see
/// [`Copier::image_cut`]).
#[derive(Default)]
struct ImageCut {
    /// The destination's copy of the image's parent.
    parent: Option<ParentImage>,
    /// Blocks that differ from the parent's, when the image was cut again.
    changed: u64,
    /// The image's content here, cut again (`rechunked`) or taken from an
    /// earlier cut of the same content.
    content: Option<Content>,
    rechunked: bool,
    /// The image's blocks as cut, the first 8 bytes of each id, when it has at
    /// most [`RUN_IMAGE_BLOCKS`].
    blocks: Option<Arc<Vec<u64>>>,
}

/// The parent of an image being cut again ([`ImageCut::parent`]).
#[derive(Clone)]
struct ParentImage {
    content: Content,
    /// Its zero blocks.
    zeros: u64,
    blocks: ParentBlocks,
}

#[derive(Clone)]
enum ParentBlocks {
    /// Stored before this run: its list is read from the destination.
    Stored(crate::tree::fixed::Geometry),
    /// Copied earlier in this run: its blocks, when kept.
    InRun(Option<Arc<Vec<u64>>>),
}

/// An image a run copied into another block size ([`Copier::run_images`]).
struct RunImage {
    /// The source snapshot, as hex.
    from: String,
    /// Its tree here, as hex.
    tree: String,
    content: Content,
    /// Where its blocks are read from: kept in memory, or the list of an image
    /// stored before the run whose content it is (QA r43: an unchanged copy of
    /// such a parent kept no blocks, and its child counted every block).
    blocks: ParentBlocks,
    zeros: u64,
}

/// The most blocks of images this run keeps in memory (8 bytes each: 32 MiB)
/// to count the images copied later in the same run against; a child of an
/// image whose blocks were not kept counts every block as changed.
const RUN_IMAGE_BLOCKS: u64 = 4 << 20;

/// Adds `image` to the run's images, within their bounds: at most
/// [`RUN_IMAGES`] of them, and the blocks of the newest up to
/// [`RUN_IMAGE_BLOCKS`] in all (older ones keep their content and counts).
fn keep_run_image(runs: &mut std::collections::VecDeque<RunImage>, image: RunImage) {
    runs.push_back(image);
    while runs.len() > RUN_IMAGES {
        runs.pop_front();
    }
    let mut kept = 0u64;
    for r in runs.iter_mut().rev() {
        if let ParentBlocks::InRun(Some(b)) = &r.blocks {
            let n = b.len() as u64;
            if kept + n > RUN_IMAGE_BLOCKS {
                r.blocks = ParentBlocks::InRun(None);
            } else {
                kept += n;
            }
        }
    }
}

/// The most images a run remembers ([`Copier::run_images`]): a few hundred
/// bytes each, besides the blocks (QA r43: 64 forgot parents in a run copying
/// a fleet's days).
const RUN_IMAGES: usize = 4096;

/// Copies one snapshot's trees: the walk's visitor.
struct TreeCopy<'c, 'a> {
    copier: &'c Copier<'a>,
    jobs: &'c Sender<FileJob>,
    enc: &'c mut BlobEncoder,
}

impl Visitor for TreeCopy<'_, '_> {
    /// The directory's nodes so far, with destination subtrees.
    type Dir = Vec<Node>;
    /// The directory's tree id in the destination.
    type Out = BlobId;

    fn enter(&mut self, _: &str, _: Option<&Node>, t: &Tree) -> Result<Vec<Node>> {
        Ok(Vec::with_capacity(t.nodes.len()))
    }

    fn entry(&mut self, dir: &mut Vec<Node>, _: &str, n: &Node) -> Result<Option<BlobId>> {
        self.copier.progress.check_cancelled()?;
        if n.kind == NodeKind::File {
            self.copier.progress.file_done();
        } else {
            self.copier.progress.entry_done();
        }
        let mut n = n.clone();
        let walk = match (n.kind, n.subtree) {
            (NodeKind::Dir, Some(sub)) => match crate::lock(&self.copier.trees).get(&sub) {
                Some(done) => {
                    n.subtree = Some(*done);
                    None
                }
                None => Some(sub),
            },
            _ => None,
        };
        dir.push(n);
        Ok(walk)
    }

    fn unreadable(&mut self, _: &mut Vec<Node>, _: &str, _: &Node, e: Error) -> Result<()> {
        Err(e)
    }

    fn leave(&mut self, _: &str, _: Option<&Node>, mut nodes: Vec<Node>) -> Result<BlobId> {
        self.copier.copy_files(&mut nodes, self.jobs)?;
        self.copier
            .put_blob(self.enc, BlobKind::Tree, &Tree { nodes }.encode())
    }

    fn child(&mut self, dir: &mut Vec<Node>, _: &str, n: &Node, out: BlobId) -> Result<()> {
        if let Some(sub) = n.subtree {
            crate::lock(&self.copier.trees).insert(sub, out);
        }
        if let Some(last) = dir.last_mut() {
            last.subtree = Some(out);
        }
        Ok(())
    }
}

/// Files for the worker pool: a run of small files of one directory (their chunks
/// are read from the source together, one range read where a backup stored them
/// side by side) or one large file. Each is its node's index in the directory,
/// its source content and its size; answers go to `reply`, one per file.
struct FileJob {
    files: Vec<(usize, Content, u64)>,
    reply: Sender<(usize, Result<Content>)>,
}

/// The bytes of chunks a copy reads from the source at once: a run of small files
/// is one job up to this size, and a large file is read this much at a time (the
/// bound of [`crate::ops::blobs::read_blobs`]'s range reads, so a job is at most a
/// request or two to remote storage, where one per chunk made a copy from S3
/// dozens of times slower than a restore).
const READ_BATCH_BYTES: u64 = 2 << 20;
/// And at most this many chunks.
const READ_BATCH_CHUNKS: usize = 512;
/// The operation of the lock a copy holds while it looks for another copy's
/// snapshot and commits its own (distinct from the copy's session lock, which
/// is shared with every other copy).
const COMMIT_TURN: &str = "copy-commit";

/// Chunks read ahead for a job's files, by id (each result taken once; a chunk
/// not here is read when needed), and the few that keep coming back.
#[derive(Default)]
struct Prefetched {
    blobs: HashMap<BlobId, Result<Vec<u8>>>,
    /// Chunks met more than once in a batch (a run of zeros, of one byte: one chunk
    /// repeated through a large file), kept for the job's later batches rather than
    /// read again for each (at most [`KEPT_REPEATED`], each up to 1 MiB).
    kept: std::collections::HashSet<BlobId>,
}

const KEPT_REPEATED: usize = 16;

impl Copier<'_> {
    /// The destination's copy of `snap` stored by another run since this one
    /// listed the destination, if any: snapshots that appeared since are read once.
    fn copied_meanwhile(&self, sid: &SnapshotId, snap: &Snapshot) -> Result<Option<SnapshotId>> {
        let (hex, wanted) = (sid.to_hex(), identity(snap));
        self.find_copy(|from, ident| from == Some(hex.as_str()) || ident == wanted)
    }

    /// The destination's snapshot whose source id (`copied_from` this source, as
    /// hex) and identity `wanted` says, listing the snapshots that arrived since
    /// the last look.
    fn find_copy(&self, wanted: impl Fn(Option<&str>, &str) -> bool) -> Result<Option<SnapshotId>> {
        let src_id = &self.src.config().id;
        let ids = self.dst.list_snapshot_ids()?;
        let mut guard = crate::lock(&self.seen);
        let Seen { listed, arrived } = &mut *guard;
        for id in ids {
            if !listed.insert(id) {
                continue;
            }
            // Unreadable or gone again: not a copy of anything.
            if let Ok(other) = self.dst.read_snapshot(&id) {
                let ident = identity(&other);
                let from = other
                    .copied_from
                    .filter(|c| &c.repository == src_id)
                    .map(|c| c.snapshot);
                arrived.push((id, from, ident));
            }
        }
        Ok(arrived
            .iter()
            .find(|(_, from, ident)| wanted(from.as_deref(), ident))
            .map(|(id, _, _)| *id))
    }

    /// For an image cut again in the destination's blocks: the destination's
    /// copy of its parent snapshot (its image's geometry and content), which its
    /// blocks are counted against as its backup counted them against the parent
    /// there; `None` when there is none, or none that reads as an image of this
    /// block size.
    fn image_parent_copy(&self, snap: &Snapshot) -> Result<Option<ParentImage>> {
        let Some(parent) = snap.parent.as_deref() else {
            return Ok(None);
        };
        if let Some(run) = crate::lock(&self.run_images)
            .iter()
            .rev()
            .find(|r| r.from == parent)
        {
            return Ok(Some(ParentImage {
                content: run.content.clone(),
                zeros: run.zeros,
                blocks: run.blocks.clone(),
            }));
        }
        let known = crate::lock(&self.copies).get(parent).copied();
        let pid = match known {
            Some(p) => p,
            None => match self.find_copy(|from, _| from == Some(parent))? {
                Some(p) => p,
                None => return Ok(None),
            },
        };
        let Ok(psnap) = self.dst.read_snapshot(&pid) else {
            return Ok(None);
        };
        let Ok((info, node)) = crate::ops::image::image_node(self.dst, &psnap) else {
            return Ok(None);
        };
        let bs = self.dst.config().chunker.avg_size;
        if (info.block_size, info.fanout) != (bs, crate::tree::fixed::fanout_for(bs)) {
            return Ok(None);
        }
        let g = crate::tree::fixed::Geometry::new(info.size, info.block_size, info.fanout)?;
        Ok(Some(ParentImage {
            content: node.content,
            zeros: info.blocks_zero,
            blocks: ParentBlocks::Stored(g),
        }))
    }

    /// Copies one snapshot; true with the id of a copy another run stored first.
    fn copy_one(
        &self,
        sid: &SnapshotId,
        snap: &Snapshot,
        opts: &Run<'_>,
    ) -> Result<(SnapshotId, bool)> {
        let pool = Arc::new(BufferPool::new(DEFAULT_UPLOAD_THREADS + 1));
        // Packs being filled and uploaded (about six at a time): smaller under a
        // memory limit, as for a backup.
        let configured = opts
            .pack_size
            .unwrap_or_else(|| u64::from(self.dst.config().pack_size));
        let pack_size = self.dst.memory_plan_in_use().map_or(configured, |p| {
            p.share(12, crate::repo::CLIENT_PACK_SIZE_MIN, configured)
        }) as usize;
        let added_before = self.counters.bytes_added.load(Ordering::Relaxed);
        let mut uploader = self.dst.uploader_keeping_room(pool.clone())?;
        // Upload progress, and on Ctrl-C a word on the packs still to store (a
        // second Ctrl-C abandons them), as for a backup.
        uploader.set_progress(self.progress.clone());
        // Through a server, an index file after every pack, as a backup there does:
        // an interrupted copy sends again at most the pack in flight (the links
        // to a server are the slow ones); elsewhere at most a few packs.
        // (A copy's destination index is read whole, with no dedup service: the
        // location says it is a server. QA: a killed copy sent everything again.)
        let per_flush = if self.dst.through_server() || self.dst.dedup().is_some() {
            1
        } else {
            COPY_INDEX_FLUSH_PACKS
        };
        uploader.set_index_flush(COPY_INDEX_FLUSH_BLOBS, per_flush);
        *crate::lock(&self.packers) = Some(Packers {
            data: Packer::new(self.dst.key().clone(), pool.clone(), pack_size),
            meta: Packer::new(self.dst.key().clone(), pool, pack_size),
        });
        *crate::lock(&self.uploader) = Some(Arc::new(uploader));
        let root = snap.tree_id().map_err(|e| Error::damaged("snapshot", e))?;
        self.image.store(snap.image.is_some(), Ordering::Relaxed);
        self.image_zero_blocks.store(0, Ordering::Relaxed);
        let parent_copy = match (&snap.image, self.same_chunking) {
            (Some(_), false) => self.image_parent_copy(snap)?,
            _ => None,
        };
        *crate::lock(&self.image_cut) = ImageCut {
            parent: parent_copy,
            ..Default::default()
        };
        // One walk thread hands each directory's files to a pool of workers, each
        // with its own encoder for the whole snapshot.
        let walked = std::thread::scope(|s| {
            let (jobs, queue) = bounded::<FileJob>(self.threads * 4);
            for _ in 0..self.threads {
                let queue = queue.clone();
                s.spawn(move || {
                    let mut enc = self.encoder();
                    for job in queue {
                        self.copy_job(&mut enc, job);
                    }
                });
            }
            drop(queue);
            std::thread::Builder::new()
                .name("cairn-copy".into())
                .spawn_scoped(s, move || {
                    let mut enc = self.encoder();
                    // `jobs` is dropped when the walk ends, which stops the workers.
                    self.copy_tree(&root, &jobs, &mut enc)
                })
                .map_err(|e| Error::Invalid(format!("cannot start the copy thread: {e}")))?
                .join()
                .unwrap_or_else(|_| Err(Error::Invalid("copy thread panicked".into())))
        });
        // Every copy thread has ended (the scope joined them): the state is ours alone.
        let walked = walked.and_then(|root| self.send_deferred().map(|()| root));
        let packers = crate::lock(&self.packers).take();
        let uploader = crate::lock(&self.uploader)
            .take()
            .and_then(|u| Arc::try_unwrap(u).ok());
        let finished = match (packers, uploader) {
            (Some(mut p), Some(up)) => {
                let flushed = (|| {
                    if let Some(sp) = p.data.finish() {
                        up.send(sp)?;
                    }
                    if let Some(sp) = p.meta.finish() {
                        up.send(sp)?;
                    }
                    Ok::<_, Error>(())
                })();
                // Finish the uploader even after a failure: what was stored is indexed.
                // Its error is the cause (a full disk, a refused write); a send
                // after it only says "interrupted".
                match (flushed, up.finish()) {
                    (_, Err(e)) | (Err(e), Ok(_)) => Err(e),
                    (Ok(()), Ok(_)) => Ok(()),
                }
            }
            _ => Err(Error::Invalid("copy state lost".into())),
        };
        crate::lock(&self.map).flush();
        // A storage failure first: it means queued blobs may not be stored, so the
        // copy must stop, even if the walk failed for another reason meanwhile.
        finished?;
        let new_root = walked?;
        let mut copy = snap.clone();
        if let (Some(info), false) = (copy.image.as_mut(), self.same_chunking) {
            // Cut again in this repository's blocks: a full image of its own here.
            let bs = self.dst.config().chunker.avg_size;
            info.block_size = bs;
            info.fanout = crate::tree::fixed::fanout_for(bs);
            info.blocks = info.size.div_ceil(u64::from(bs));
            info.blocks_read = info.blocks;
            // Against the copy of its parent here, as its backup counted them
            // against the parent there (QA r37: every copy said every block
            // changed). An image whose content an earlier copy cut already is
            // that content: unchanged when it is the parent's.
            let mut cut = std::mem::take(&mut *crate::lock(&self.image_cut));
            let tree = new_root.to_hex();
            let mut runs = crate::lock(&self.run_images);
            // Not cut again: its tree (nothing was cut or taken: a snapshot of
            // the same tree) or its content is one this run made already, whose
            // image it is.
            let earlier = match &cut.content {
                _ if cut.rechunked => None,
                None => runs.iter().rev().find(|r| r.tree == tree),
                Some(c) => runs.iter().rev().find(|r| r.content == *c),
            };
            let earlier = earlier.map(|r| (r.content.clone(), r.blocks.clone(), r.zeros));
            if let Some((c, _, _)) = &earlier {
                cut.content = Some(c.clone());
            }
            let same_as_parent =
                matches!((&cut.parent, &cut.content), (Some(p), Some(c)) if p.content == *c);
            info.blocks_changed = match &cut.parent {
                Some(_) if cut.rechunked => cut.changed,
                Some(_) if same_as_parent => 0,
                _ => info.blocks,
            };
            // An image taken whole holds the zero blocks of the one it was
            // taken from, and a child copied next in this run is counted
            // against its blocks.
            let (blocks, zeros) = match (&cut.parent, earlier) {
                _ if cut.rechunked => (
                    ParentBlocks::InRun(cut.blocks.take()),
                    self.image_zero_blocks.load(Ordering::Relaxed),
                ),
                (_, Some((_, b, z))) => (b, z),
                (Some(p), None) if same_as_parent => (p.blocks.clone(), p.zeros),
                _ => (
                    ParentBlocks::InRun(None),
                    self.image_zero_blocks.load(Ordering::Relaxed),
                ),
            };
            info.blocks_zero = zeros;
            if let Some(content) = cut.content {
                keep_run_image(
                    &mut runs,
                    RunImage {
                        from: sid.to_hex(),
                        tree,
                        content,
                        blocks,
                        zeros,
                    },
                );
            }
            drop(runs);
            info.changed_blocks_input = false;
            // What this copy added for it, beside "every block changed" (the
            // source's figure said another backup's: QA).
            copy.summary.data_added_packed = self
                .counters
                .bytes_added
                .load(Ordering::Relaxed)
                .saturating_sub(added_before);
        }
        copy.tree = new_root.to_hex();
        copy.parent = None;
        copy.original = None;
        copy.copied_from = Some(CopiedFrom {
            repository: self.src.config().id.clone(),
            snapshot: sid.to_hex(),
        });
        crate::hooks::point("copy:before-snapshot");
        // Ctrl-C after the last file was read (its packs were still being stored):
        // no snapshot, as for a backup. What was stored is indexed and kept.
        self.progress.check_cancelled()?;
        // Two copies into one destination each look for the other's copy, then
        // commit: the look and the commit take turns (a short lock of their own),
        // or both find nothing and store one each (QA: 24 snapshots for 15).
        // Where this client may not take such a lock (a cairn server's backup
        // token: only admins' locks hold others up), the look alone stays.
        let _turn = match RepoLock::acquire_alone(self.dst, COMMIT_TURN) {
            Ok(l) => Some(l),
            Err(Error::Backend(b))
                if b.kind == cairn_backend::BackendErrorKind::PermissionDenied =>
            {
                None
            }
            Err(e) => return Err(e),
        };
        if let Some(there) = self.copied_meanwhile(sid, snap)? {
            return Ok((there, true));
        }
        crate::hooks::point("copy:checked");
        Ok((self.dst.write_snapshot(&copy, opts.lock)?, false))
    }

    /// In the destination's loaded index, queued by this run, said stored by the
    /// server, or left to the client sending it ([`Copier::deferred`]).
    fn is_stored(&self, id: &BlobId) -> bool {
        self.dst.index().is_live(id)
            || self.written.contains(id)
            || self
                .dedup
                .as_ref()
                .is_some_and(|d| d.known_stored(id) || crate::lock(&self.deferred).contains(id))
    }

    /// The server's answer for each data chunk of `ids` (all the destination's
    /// loaded index lacks); `Send` for every one without a dedup service.
    fn ask(&self, ids: &[BlobId]) -> Result<Vec<DedupAnswer>> {
        match &self.dedup {
            Some(d) if !ids.is_empty() => d.query(ids),
            _ => Ok(vec![DedupAnswer::Send; ids.len()]),
        }
    }

    /// Same ids on both sides: of `needed`, the blobs to read and store now. The
    /// data chunks the server holds are dropped, and those another client is
    /// sending are set aside ([`Copier::deferred`]).
    fn to_send(&self, needed: Vec<BlobId>) -> Result<Vec<BlobId>> {
        if self.dedup.is_none() {
            return Ok(needed);
        }
        let src = self.src.index();
        let data: Vec<BlobId> = needed
            .iter()
            .filter(|id| src.get(id).is_some_and(|l| l.kind == BlobKind::Data))
            .copied()
            .collect();
        let answers = self.ask(&data)?;
        let mut skip = crate::index::IdSet::default();
        let mut later = Vec::new();
        for (id, a) in data.iter().zip(answers) {
            match a {
                DedupAnswer::Send => continue,
                DedupAnswer::Stored => {}
                DedupAnswer::InFlight => later.push(*id),
            }
            skip.insert(*id);
        }
        crate::lock(&self.deferred).extend(later);
        Ok(needed.into_iter().filter(|id| !skip.contains(id)).collect())
    }

    /// Re-chunked data chunks waiting for one dedup question (see
    /// [`Pending`]): asked about together, then stored, dropped or held.
    fn settle(&self, enc: &mut BlobEncoder, pending: &mut Pending) -> Result<()> {
        let chunks = std::mem::take(&mut pending.chunks);
        pending.bytes = 0;
        let ids: Vec<BlobId> = chunks.iter().map(|(id, _)| *id).collect();
        let answers = self.ask(&ids)?;
        for ((id, data), a) in chunks.into_iter().zip(answers) {
            if a == DedupAnswer::Stored || self.is_stored(&id) {
                continue;
            }
            let b = enc.encode(self.dst.key(), BlobKind::Data, id, &data)?;
            let b = if a == DedupAnswer::InFlight {
                crate::lock(&self.held).hold(b)?
            } else {
                Some(b)
            };
            if let Some(b) = b {
                self.store(b)?;
            }
        }
        Ok(())
    }

    /// A re-chunked data chunk: stored now, or, through a server that answers
    /// dedup queries, asked about with the next ones ([`Copier::settle`]).
    fn put_data(
        &self,
        enc: &mut BlobEncoder,
        pending: &mut Pending,
        chunk: &[u8],
    ) -> Result<BlobId> {
        if self.dedup.is_none() {
            return self.put_blob(enc, BlobKind::Data, chunk);
        }
        let id = self.dst.key().blob_id(chunk);
        if !self.is_stored(&id) {
            pending.bytes += chunk.len();
            pending.chunks.push((id, chunk.to_vec()));
            if pending.bytes >= PENDING_BYTES || pending.chunks.len() >= PENDING_CHUNKS {
                self.settle(enc, pending)?;
            }
        }
        Ok(id)
    }

    /// Before the snapshot: the chunks other clients were sending are confirmed
    /// with the server, and those that never arrived are stored now. Everything
    /// this copy queued is stored and indexed first, so a client waiting for its
    /// chunks never waits for one that waits too.
    fn send_deferred(&self) -> Result<()> {
        let Some(dedup) = &self.dedup else {
            return Ok(());
        };
        let deferred: Vec<BlobId> = std::mem::take(&mut *crate::lock(&self.deferred))
            .into_iter()
            .collect();
        let held = std::mem::take(&mut *crate::lock(&self.held));
        if deferred.is_empty() && held.is_empty() {
            return Ok(());
        }
        {
            let mut guard = crate::lock(&self.packers);
            let p = guard
                .as_mut()
                .ok_or_else(|| Error::Invalid("copy state lost".into()))?;
            let sealed = [p.data.finish(), p.meta.finish()];
            drop(guard);
            let up = crate::lock(&self.uploader)
                .clone()
                .ok_or_else(|| Error::Invalid("copy state lost".into()))?;
            for sp in sealed.into_iter().flatten() {
                up.send(sp)?;
            }
            up.flush()?;
        }
        let mut enc = self.encoder();
        if !deferred.is_empty() {
            let missing = dedup.confirm(&deferred)?;
            self.fetch_and_store(&mut enc, &missing, &mut Prefetched::default())?;
        }
        held.send_missing(dedup, |b| self.store(b))
    }

    /// Adds an encoded blob to the destination unless another thread just did.
    fn store(&self, b: EncodedBlob) -> Result<()> {
        if self.written.claim(&b.id) {
            return Ok(());
        }
        self.counters.blobs_added.fetch_add(1, Ordering::Relaxed);
        self.counters
            .bytes_added
            .fetch_add(b.sealed.len() as u64, Ordering::Relaxed);
        let sealed = {
            let mut guard = crate::lock(&self.packers);
            let p = guard
                .as_mut()
                .ok_or_else(|| Error::Invalid("copy state lost".into()))?;
            if b.kind == BlobKind::Data {
                p.data.add(b)
            } else {
                p.meta.add(b)
            }
        };
        if let Some(sp) = sealed {
            let up = crate::lock(&self.uploader)
                .clone()
                .ok_or_else(|| Error::Invalid("copy state lost".into()))?;
            up.send(sp)?;
        }
        Ok(())
    }

    /// Stores `plaintext` as a blob of `kind` in the destination if it is missing
    /// there, and returns its destination id.
    fn put_blob(&self, enc: &mut BlobEncoder, kind: BlobKind, plaintext: &[u8]) -> Result<BlobId> {
        let key = self.dst.key();
        let id = key.blob_id(plaintext);
        if !self.is_stored(&id) {
            self.store(enc.encode(key, kind, id, plaintext)?)?;
        }
        Ok(id)
    }

    fn encoder(&self) -> BlobEncoder {
        BlobEncoder::new(self.dst.config().compression.zstd_level())
    }

    /// The destination's id of the source tree `id`: every directory below it
    /// copied bottom-up (each directory's files on the worker pool), trees copied
    /// earlier in this run reused.
    fn copy_tree(
        &self,
        id: &BlobId,
        jobs: &Sender<FileJob>,
        enc: &mut BlobEncoder,
    ) -> Result<BlobId> {
        if let Some(done) = crate::lock(&self.trees).get(id) {
            return Ok(*done);
        }
        let mut w = TreeCopy {
            copier: self,
            jobs,
            enc,
        };
        let new = crate::tree::walk::walk(self.src, id, &mut w)?;
        crate::lock(&self.trees).insert(*id, new);
        Ok(new)
    }

    /// Translates the content of every file of one directory on the worker pool:
    /// runs of small files as one job (read together), each large file as its own.
    fn copy_files(&self, nodes: &mut [Node], jobs: &Sender<FileJob>) -> Result<()> {
        let (reply, answers) = unbounded();
        let mut sent = 0usize;
        let mut run: Vec<(usize, Content, u64)> = Vec::new();
        let mut run_bytes = 0u64;
        let send = |files: Vec<(usize, Content, u64)>| -> Result<()> {
            jobs.send(FileJob {
                files,
                reply: reply.clone(),
            })
            .map_err(|_| Error::Invalid("copy workers stopped".into()))
        };
        for (i, n) in nodes.iter().enumerate() {
            if n.kind != NodeKind::File || n.content == Content::None {
                continue;
            }
            sent += 1;
            if n.size >= READ_BATCH_BYTES {
                send(vec![(i, n.content.clone(), n.size)])?;
                continue;
            }
            if run_bytes + n.size > READ_BATCH_BYTES || run.len() >= READ_BATCH_CHUNKS {
                send(std::mem::take(&mut run))?;
                run_bytes = 0;
            }
            run_bytes += n.size;
            run.push((i, n.content.clone(), n.size));
        }
        if !run.is_empty() {
            send(run)?;
        }
        // Only the jobs hold senders now: a worker that died drops its job's, so the
        // wait below ends with an error instead of hanging.
        drop(reply);
        self.counters
            .files
            .fetch_add(sent as u64, Ordering::Relaxed);
        for _ in 0..sent {
            let (i, content) = answers
                .recv()
                .map_err(|_| Error::Invalid("copy workers stopped".into()))?;
            nodes[i].content = content?;
        }
        Ok(())
    }

    /// A worker's job: the files the destination does not know yet (by the file
    /// map, or every file when both sides share ids) have their chunks read in one
    /// batch, then each file is translated and answered.
    fn copy_job(&self, enc: &mut BlobEncoder, job: FileJob) {
        let mut todo = Vec::with_capacity(job.files.len());
        let mut want: Vec<BlobId> = Vec::new();
        for (node, content, size) in job.files {
            crate::hooks::point("copy:before-file");
            if !self.same_chunking
                && let Some(known) = self.known_content(&content)
            {
                self.progress.bytes_done(size);
                self.note_image_taken(&known);
                let _ = job.reply.send((node, Ok(known)));
                continue;
            }
            // Only inline lists are read ahead (a small file's); a chunk-list tree
            // belongs to a large file, which reads its own batches.
            if let Content::Inline(refs) = &content {
                want.extend(
                    refs.iter()
                        .map(|r| r.id)
                        .filter(|id| !self.same_chunking || !self.is_stored(id)),
                );
            }
            todo.push((node, content, size));
        }
        want.sort_unstable();
        want.dedup();
        let mut pre = Prefetched::default();
        if want.len() > 1 && self.progress.check_cancelled().is_ok() {
            pre.blobs = want
                .iter()
                .copied()
                .zip(crate::ops::blobs::read_blobs(self.src, &want))
                .collect();
        }
        for (node, content, size) in todo {
            let r = self.copy_content(enc, &content, size, &mut pre);
            let _ = job.reply.send((node, r));
        }
    }

    /// An image's content taken from an earlier copy's cut (see [`ImageCut`]).
    fn note_image_taken(&self, content: &Content) {
        if self.image.load(Ordering::Relaxed) {
            crate::lock(&self.image_cut).content = Some(content.clone());
        }
    }

    /// What the file map says `content` became in the destination, if every blob of
    /// that is still there.
    fn known_content(&self, content: &Content) -> Option<Content> {
        let key = self.content_key(content);
        // Bound first: a guard in the match scrutinee would live through the arms.
        let found = crate::lock(&self.map).lookup(&key);
        match found {
            Lookup::Fresh(c) => Some(c),
            // Read and checked against the index without holding the map (it may
            // read chunk lists): used only if every blob is there. Not kept in
            // memory: a directory unchanged since an earlier snapshot of this run
            // is not walked again (`trees`), so a file rarely comes up twice.
            Lookup::OnDisk(offsets) => {
                let c = self
                    .map_reader
                    .as_ref()
                    .and_then(|f| read_record(self.dst, f, &offsets, &key))
                    .filter(|c| FileMap::all_stored(self.dst, c));
                if c.is_none() {
                    crate::lock(&self.map).reject(&key);
                }
                c
            }
            Lookup::Missing => None,
        }
    }

    /// The file map's key of a source content (an image's differs from the same
    /// content cut by content).
    fn content_key(&self, content: &Content) -> [u8; 32] {
        let key = content_key(content);
        if self.image.load(Ordering::Relaxed) {
            *blake3::Hasher::new()
                .update(b"image")
                .update(&key)
                .finalize()
                .as_bytes()
        } else {
            key
        }
    }

    /// Calls `f` with every chunk of `content` and its bytes, in order, reading
    /// them from the source (or `pre`) a batch at a time; Ctrl-C stops it between
    /// batches. A chunk whose length differs from its file's list is damage.
    fn for_each_chunk_read(
        &self,
        content: &Content,
        pre: &mut Prefetched,
        f: &mut dyn FnMut(ChunkRef, &[u8]) -> Result<()>,
    ) -> Result<()> {
        let mut batch: Vec<ChunkRef> = Vec::new();
        let mut bytes = 0u64;
        for_each_chunk(self.src, content, &mut |r: ChunkRef| {
            batch.push(r);
            bytes += r.length;
            if bytes >= READ_BATCH_BYTES || batch.len() >= READ_BATCH_CHUNKS {
                bytes = 0;
                self.read_batch(&mut batch, pre, f)?;
            }
            Ok(())
        })?;
        self.read_batch(&mut batch, pre, f)
    }

    /// Reads the chunks of `batch` (emptying it) and hands them to `f` in order.
    fn read_batch(
        &self,
        batch: &mut Vec<ChunkRef>,
        pre: &mut Prefetched,
        f: &mut dyn FnMut(ChunkRef, &[u8]) -> Result<()>,
    ) -> Result<()> {
        if batch.is_empty() {
            return Ok(());
        }
        self.progress.check_cancelled()?;
        let mut missing: Vec<BlobId> = batch
            .iter()
            .map(|r| r.id)
            .filter(|id| !pre.blobs.contains_key(id))
            .collect();
        missing.sort_unstable();
        missing.dedup();
        let read = crate::ops::blobs::read_blobs(self.src, &missing);
        pre.blobs.extend(missing.into_iter().zip(read));
        // A chunk may come many times (a run of zeros or of one byte is one chunk
        // repeated): each use but the last takes a copy, and one repeated is kept
        // for the next batches too.
        let mut uses: HashMap<BlobId, u32> = HashMap::new();
        for r in batch.iter() {
            *uses.entry(r.id).or_default() += 1;
        }
        let repeated: Vec<BlobId> = uses
            .iter()
            .filter(|(_, n)| **n > 1)
            .map(|(id, _)| *id)
            .collect();
        for id in repeated {
            if pre.kept.len() < KEPT_REPEATED
                && matches!(pre.blobs.get(&id), Some(Ok(d)) if d.len() <= 1 << 20)
            {
                pre.kept.insert(id);
            }
        }
        for r in batch.drain(..) {
            let left = uses.get_mut(&r.id).map_or(0, |n| {
                *n -= 1;
                *n
            });
            // A chunk used again is lent from `pre`, the last use takes it.
            let keep = (left > 0 || pre.kept.contains(&r.id))
                && matches!(pre.blobs.get(&r.id), Some(Ok(_)));
            let owned = if keep {
                None
            } else {
                Some(match pre.blobs.remove(&r.id) {
                    Some(d) => d?,
                    // Taken by an earlier batch of the same file.
                    None => self.src.read_blob(&r.id)?,
                })
            };
            let data: &[u8] = match &owned {
                Some(d) => d,
                None => pre
                    .blobs
                    .get(&r.id)
                    .and_then(|d| d.as_ref().ok())
                    .map_or(&[], |d| d),
            };
            if data.len() as u64 != r.length {
                return Err(Error::damaged(
                    format!("chunk {}", r.id.short()),
                    FormatError::malformed(
                        "chunk",
                        format!(
                            "holds {} bytes where its file lists {}",
                            data.len(),
                            r.length
                        ),
                    ),
                ));
            }
            self.counters
                .bytes_read
                .fetch_add(data.len() as u64, Ordering::Relaxed);
            self.progress.bytes_done(data.len() as u64);
            f(r, data)?;
        }
        Ok(())
    }

    /// The destination's content for one file; `size` is its length (progress).
    /// The file map was asked already (by [`Copier::copy_job`]).
    fn copy_content(
        &self,
        enc: &mut BlobEncoder,
        content: &Content,
        size: u64,
        pre: &mut Prefetched,
    ) -> Result<Content> {
        if self.same_chunking {
            self.copy_missing_blobs(enc, content, pre)?;
            self.progress.bytes_done(size);
            return Ok(content.clone());
        }
        let key = self.content_key(content);
        loop {
            let mut theirs = Vec::new();
            let mine = self.rechunking.claim(std::iter::once(key), &mut theirs);
            if !mine.is_empty() {
                let _claimed = Claimed(&self.rechunking, mine);
                // Progress is reported chunk by chunk as the file is read.
                let c = self.rechunk(enc, content, pre)?;
                crate::lock(&self.map).insert(key, &c);
                return Ok(c);
            }
            self.rechunking.wait(&key, self.progress)?;
            // The other thread failed (or its result is not all stored): the
            // content is this thread's to do after all.
            if let Some(c) = self.known_content(content) {
                self.progress.bytes_done(size);
                self.note_image_taken(&c);
                return Ok(c);
            }
        }
    }

    /// Same ids on both sides: store every blob of the content the destination lacks.
    fn copy_missing_blobs(
        &self,
        enc: &mut BlobEncoder,
        content: &Content,
        pre: &mut Prefetched,
    ) -> Result<()> {
        let mut needed = Vec::new();
        let mut seen = std::collections::HashSet::new();
        // Every chunk list is walked, even one the destination has: its chunks are
        // checked one by one rather than assumed (a prune may have kept a list
        // without its chunks if nothing used it).
        for_each_content_blob(self.src, content, &mut |id| {
            if !self.is_stored(&id) && seen.insert(id) {
                needed.push(id);
            }
            true
        })?;
        drop(seen);
        let needed = self.to_send(needed)?;
        // Claimed a batch at a time (what is claimed stays small whatever the
        // file's size). A thread's claims go back before it waits for another's,
        // so no two threads wait for each other, stored or not.
        let mut others = Vec::new();
        for batch in needed.chunks(READ_BATCH_CHUNKS) {
            let unstored = batch.iter().filter(|id| !self.is_stored(id)).copied();
            let mine = self.fetching.claim(unstored, &mut others);
            let claimed = Claimed(&self.fetching, mine);
            self.fetch_and_store(enc, &claimed.1, pre)?;
        }
        // What another thread was reading: stored by it, or (its read failed) read
        // here.
        let mut left = Vec::new();
        for id in others {
            self.fetching.wait(&id, self.progress)?;
            if !self.is_stored(&id) {
                left.push(id);
            }
        }
        self.fetch_and_store(enc, &left, pre)
    }

    /// Reads `needed` from the source and stores each in the destination.
    fn fetch_and_store(
        &self,
        enc: &mut BlobEncoder,
        needed: &[BlobId],
        pre: &mut Prefetched,
    ) -> Result<()> {
        // In batches read together; a large file is many: Ctrl-C stops it between
        // them, not at its end.
        let mut rest = needed;
        while !rest.is_empty() {
            self.progress.check_cancelled()?;
            let mut bytes = 0u64;
            let mut n = 0;
            while n < rest.len() && n < READ_BATCH_CHUNKS && bytes < READ_BATCH_BYTES {
                bytes += self
                    .src
                    .index()
                    .get(&rest[n])
                    .map_or(0, |l| u64::from(l.length));
                n += 1;
            }
            let (batch, after) = rest.split_at(n);
            rest = after;
            let missing: Vec<BlobId> = batch
                .iter()
                .filter(|id| !pre.blobs.contains_key(id))
                .copied()
                .collect();
            let read = crate::ops::blobs::read_blobs(self.src, &missing);
            pre.blobs.extend(missing.into_iter().zip(read));
            for id in batch {
                let loc = self.src.index().get(id).ok_or(Error::BlobNotFound(*id))?;
                let data = match pre.blobs.remove(id) {
                    Some(d) => d?,
                    None => self.src.read_blob(id)?,
                };
                self.counters
                    .bytes_read
                    .fetch_add(data.len() as u64, Ordering::Relaxed);
                self.store(enc.encode(self.dst.key(), loc.kind, *id, &data)?)?;
            }
        }
        Ok(())
    }

    /// Reads a file from the source and chunks it with the destination's chunker.
    fn rechunk(
        &self,
        enc: &mut BlobEncoder,
        content: &Content,
        pre: &mut Prefetched,
    ) -> Result<Content> {
        self.counters
            .files_rechunked
            .fetch_add(1, Ordering::Relaxed);
        if self.image.load(Ordering::Relaxed) {
            return self.rechunk_image(enc, content, pre);
        }
        let mut stream = cairn_chunker::StreamChunker::new(self.dst.chunker());
        let mut builder = ChunkListBuilder::new();
        let mut meta_enc = self.encoder();
        let mut pending = Pending::default();
        let mut emit = |cl: ChunkList| -> Result<BlobId> {
            self.put_blob(&mut meta_enc, BlobKind::ChunkList, &cl.encode())
        };
        let mut drain = |stream: &mut cairn_chunker::StreamChunker,
                         builder: &mut ChunkListBuilder,
                         pending: &mut Pending,
                         emit: &mut dyn FnMut(ChunkList) -> Result<BlobId>|
         -> Result<()> {
            while let Some(chunk) = stream.next_chunk() {
                let length = chunk.len() as u64;
                let id = self.put_data(enc, pending, chunk)?;
                builder.push(ChunkRef { id, length }, emit)?;
            }
            Ok(())
        };
        self.for_each_chunk_read(content, pre, &mut |_, data: &[u8]| {
            stream.push(data);
            drain(&mut stream, &mut builder, &mut pending, &mut emit)
        })?;
        stream.finish();
        drain(&mut stream, &mut builder, &mut pending, &mut emit)?;
        self.settle(enc, &mut pending)?;
        builder.finish(&mut emit)
    }
}

impl Copier<'_> {
    /// An image's content cut in the destination's fixed blocks, its list built with
    /// the image geometry (docs/FORMAT.md, "Image snapshots").
    fn rechunk_image(
        &self,
        enc: &mut BlobEncoder,
        content: &Content,
        pre: &mut Prefetched,
    ) -> Result<Content> {
        let bs = self.dst.config().chunker.avg_size as usize;
        let zero = vec![0u8; bs];
        let mut builder =
            ChunkListBuilder::with_fanout(crate::tree::fixed::fanout_for(bs as u32) as usize);
        let mut meta_enc = self.encoder();
        let mut pending: Vec<u8> = Vec::with_capacity(2 * bs);
        let mut asking = Pending::default();
        // The parent copy's blocks, read along: its list from the destination,
        // or what this run kept of it (one that cannot be read makes every
        // block count as changed, as in a backup).
        let (mut stored, in_run) = match crate::lock(&self.image_cut).parent.clone() {
            Some(ParentImage {
                content,
                blocks: ParentBlocks::Stored(g),
                ..
            }) => (
                crate::tree::fixed::FixedList::new(self.dst, g, content).ok(),
                None,
            ),
            Some(ParentImage {
                blocks: ParentBlocks::InRun(b),
                ..
            }) => (None, b),
            None => (None, None),
        };
        let short = |id: &BlobId| u64::from_le_bytes(id.0[..8].try_into().unwrap_or_default());
        let mut mine: Option<Vec<u64>> = Some(Vec::new());
        let (mut block, mut changed) = (0u64, 0u64);
        let mut put = |data: &[u8], builder: &mut ChunkListBuilder, enc: &mut BlobEncoder| {
            if data == &zero[..] {
                self.image_zero_blocks.fetch_add(1, Ordering::Relaxed);
            }
            let id = self.put_data(enc, &mut asking, data)?;
            let same = match (stored.as_mut().map(|p| p.entry(0, block)), &in_run) {
                (Some(Ok(e)), _) => e.is_some_and(|e| e.id == id),
                (Some(Err(_)), _) => {
                    stored = None;
                    false
                }
                (None, Some(b)) => usize::try_from(block)
                    .ok()
                    .and_then(|i| b.get(i))
                    .is_some_and(|&s| s == short(&id)),
                (None, None) => false,
            };
            changed += u64::from(!same);
            if block >= RUN_IMAGE_BLOCKS {
                mine = None;
            }
            if let Some(m) = mine.as_mut() {
                m.push(short(&id));
            }
            block += 1;
            let mut emit = |cl: ChunkList| -> Result<BlobId> {
                self.put_blob(&mut meta_enc, BlobKind::ChunkList, &cl.encode())
            };
            builder.push(
                ChunkRef {
                    id,
                    length: data.len() as u64,
                },
                &mut emit,
            )
        };
        self.for_each_chunk_read(content, pre, &mut |_, data: &[u8]| {
            pending.extend_from_slice(data);
            let mut at = 0;
            while pending.len() - at >= bs {
                put(&pending[at..at + bs], &mut builder, enc)?;
                at += bs;
            }
            pending.drain(..at);
            Ok(())
        })?;
        if !pending.is_empty() {
            put(&pending, &mut builder, enc)?;
        }
        self.settle(enc, &mut asking)?;
        let mut meta_enc = self.encoder();
        let root = builder.finish(&mut |cl: ChunkList| {
            self.put_blob(&mut meta_enc, BlobKind::ChunkList, &cl.encode())
        })?;
        let mut cut = crate::lock(&self.image_cut);
        cut.rechunked = true;
        cut.changed = changed;
        cut.content = Some(root.clone());
        cut.blocks = mine.map(Arc::new);
        Ok(root)
    }
}

/// Identifies a file's content in the source: its chunk list's root, or the hash of
/// its inline chunk ids and lengths.
fn content_key(content: &Content) -> [u8; 32] {
    let mut h = blake3::Hasher::new();
    match content {
        Content::None => {
            h.update(b"none");
        }
        Content::Inline(refs) => {
            h.update(b"inline");
            for r in refs {
                h.update(&r.id.0);
                h.update(&r.length.to_le_bytes());
            }
        }
        Content::Tree {
            root,
            depth,
            chunks,
        } => {
            h.update(b"tree");
            h.update(&root.0);
            h.update(&[*depth]);
            h.update(&chunks.to_le_bytes());
        }
    }
    *h.finalize().as_bytes()
}

/// Source content -> destination content, for files already re-chunked.
///
/// The map of earlier runs stays in its file: only each record's key prefix and
/// offset are held (16 bytes a file; a share of 20 million files is 320 MB, not
/// the several GB of their chunk lists), and a record is read back, its MAC and
/// key checked, when a file of that content comes up.
struct FileMap<'a> {
    dst: &'a Repository,
    /// Entries made by this run: trusted.
    fresh: HashMap<[u8; 32], Content>,
    /// Records of earlier runs: the first 8 bytes of each key and the record's
    /// offset in the file, sorted by prefix (records of one prefix in file order,
    /// so the last is the newest).
    disk: Vec<(u64, u64)>,
    /// Keys whose record was found wanting (a blob it names is gone): not
    /// offered again.
    rejected: std::collections::HashSet<[u8; 32]>,
    /// The file, locked against other copies of the same pair; None: memory only.
    out: Option<MapFile>,
}

struct MapFile {
    /// A duplicate of the locked descriptor (it shares the lock).
    writer: std::io::BufWriter<std::fs::File>,
    _lock: nix::fcntl::Flock<std::fs::File>,
}

enum Lookup {
    Fresh(Content),
    /// Offsets of records of earlier runs that may hold the key, newest first.
    OnDisk(Vec<u64>),
    Missing,
}

/// `len:u32le || source key[32] || encoded one-node tree || mac[32]`, the MAC keyed by
/// the destination's key over everything before it.
const MAP_MAGIC: &[u8; 8] = b"CAIRNCM1";
const MAX_MAP_RECORD: usize = 16 << 20;

fn key_prefix(key: &[u8; 32]) -> u64 {
    let mut b = [0u8; 8];
    b.copy_from_slice(&key[..8]);
    u64::from_le_bytes(b)
}

/// A record's key and content, when its MAC holds.
fn decode_record(dst: &Repository, body_and_mac: &[u8]) -> Option<([u8; 32], Content)> {
    if body_and_mac.len() < 64 {
        return None;
    }
    let (body, mac) = body_and_mac.split_at(body_and_mac.len() - 32);
    if dst.key().mac(body)[..] != *mac {
        return None;
    }
    let mut key = [0u8; 32];
    key.copy_from_slice(&body[..32]);
    let tree = Tree::decode(&body[32..]).ok()?;
    Some((key, tree.nodes.into_iter().next()?.content))
}

/// The content a record of an earlier run holds for `key`, read from the map
/// file at one of `offsets` (without the map's lock: records before the end
/// found at open never change).
fn read_record(
    dst: &Repository,
    file: &std::fs::File,
    offsets: &[u64],
    key: &[u8; 32],
) -> Option<Content> {
    use std::os::unix::fs::FileExt;
    for &at in offsets {
        let mut len = [0u8; 4];
        if file.read_exact_at(&mut len, at).is_err() {
            continue;
        }
        let len = u32::from_le_bytes(len) as usize;
        if !(64..=MAX_MAP_RECORD).contains(&len) {
            continue;
        }
        let mut rec = vec![0u8; len];
        if file.read_exact_at(&mut rec, at + 4).is_err() {
            continue;
        }
        match decode_record(dst, &rec) {
            Some((k, c)) if k == *key => return Some(c),
            _ => {}
        }
    }
    None
}

impl<'a> FileMap<'a> {
    /// Opens (or creates) the map file. It is an optimisation: any problem (no
    /// cache directory, a full disk, another copy of the same pair holding it) leaves
    /// a map in memory only, with a warning.
    fn open(dst: &'a Repository, path: Option<&Path>, warnings: &mut Vec<String>) -> FileMap<'a> {
        let mut map = FileMap {
            dst,
            fresh: HashMap::new(),
            disk: Vec::new(),
            rejected: Default::default(),
            out: None,
        };
        if let Some(path) = path {
            match map.open_file(path) {
                Ok(out) => map.out = Some(out),
                Err(e) => warnings.push(format!(
                    "the copy file map {} is not kept ({e}): files are re-read next time",
                    path.display()
                )),
            }
        }
        map
    }

    /// A descriptor to read earlier runs' records with, outside the map's lock.
    fn reader(&self) -> Option<std::fs::File> {
        self.out
            .as_ref()
            .and_then(|o| o.writer.get_ref().try_clone().ok())
    }

    fn open_file(&mut self, path: &Path) -> std::result::Result<MapFile, String> {
        use nix::fcntl::{Flock, FlockArg};
        if let Some(dir) = path.parent() {
            std::fs::create_dir_all(dir).map_err(|e| e.to_string())?;
        }
        // This user's alone: which source chunks became which (keyed) blob ids.
        let file = std::os::unix::fs::OpenOptionsExt::mode(
            std::fs::OpenOptions::new()
                .create(true)
                .read(true)
                .write(true)
                .truncate(false),
            0o600,
        )
        .open(path)
        .map_err(|e| e.to_string())?;
        let lock = Flock::lock(file, FlockArg::LockExclusiveNonblock)
            .map_err(|_| "another copy between these repositories is using it".to_string())?;
        let mut file = lock.try_clone().map_err(|e| e.to_string())?;
        // Everything after the last whole, authentic record (a killed run's partial
        // tail) is cut off, so that new records follow valid ones.
        let valid = self.load(&file).map_err(|e| e.to_string())?;
        let size = file.metadata().map_err(|e| e.to_string())?.len();
        if valid != size || size == 0 {
            file.set_len(valid).map_err(|e| e.to_string())?;
        }
        {
            use std::io::{Seek, SeekFrom};
            file.seek(SeekFrom::Start(valid))
                .map_err(|e| e.to_string())?;
            if valid == 0 {
                file.write_all(MAP_MAGIC).map_err(|e| e.to_string())?;
            }
        }
        Ok(MapFile {
            writer: std::io::BufWriter::new(file),
            _lock: lock,
        })
    }

    /// Reads the records up to the first damaged one, keeping each one's key
    /// prefix and offset; returns the length of the valid prefix (0 when even
    /// the header is wrong).
    fn load(&mut self, file: &std::fs::File) -> std::io::Result<u64> {
        use std::io::Read;
        let mut r = std::io::BufReader::with_capacity(1 << 20, file);
        let mut magic = [0u8; 8];
        if r.read_exact(&mut magic).is_err() || magic != *MAP_MAGIC {
            return Ok(0);
        }
        let mut valid = MAP_MAGIC.len() as u64;
        let mut rec = Vec::new();
        loop {
            let mut len = [0u8; 4];
            if r.read_exact(&mut len).is_err() {
                break;
            }
            let len = u32::from_le_bytes(len) as usize;
            if !(64..=MAX_MAP_RECORD).contains(&len) {
                break;
            }
            rec.resize(len, 0);
            if r.read_exact(&mut rec).is_err() {
                break;
            }
            let Some((key, _)) = decode_record(self.dst, &rec) else {
                break;
            };
            self.disk.push((key_prefix(&key), valid));
            valid += 4 + len as u64;
        }
        // Stable: records of one prefix stay in file order.
        self.disk.sort_by_key(|(p, _)| *p);
        Ok(valid)
    }

    fn lookup(&self, key: &[u8; 32]) -> Lookup {
        if let Some(c) = self.fresh.get(key) {
            return Lookup::Fresh(c.clone());
        }
        if self.rejected.contains(key) {
            return Lookup::Missing;
        }
        let p = key_prefix(key);
        let from = self.disk.partition_point(|(q, _)| *q < p);
        let to = self.disk.partition_point(|(q, _)| *q <= p);
        let offsets: Vec<u64> = self.disk[from..to]
            .iter()
            .rev()
            .map(|(_, at)| *at)
            .collect();
        if offsets.is_empty() {
            Lookup::Missing
        } else {
            Lookup::OnDisk(offsets)
        }
    }

    /// An earlier run's record that failed [`FileMap::all_stored`], or could not
    /// be read: not offered again.
    fn reject(&mut self, key: &[u8; 32]) {
        self.rejected.insert(*key);
    }

    fn all_stored(dst: &Repository, c: &Content) -> bool {
        let index = dst.index();
        let mut ok = true;
        let walked = for_each_content_blob(dst, c, &mut |id| {
            ok &= index.is_live(&id);
            ok
        });
        walked.is_ok() && ok
    }

    /// Records an entry made by this run. A failed write only stops the file from
    /// growing (the run goes on; its later records are kept in memory).
    fn insert(&mut self, key: [u8; 32], c: &Content) {
        self.fresh.insert(key, c.clone());
        let Some(out) = self.out.as_mut() else {
            return;
        };
        let mut node = Node::new(b"f".to_vec(), NodeKind::File);
        node.content = c.clone();
        let mut body = key.to_vec();
        body.extend_from_slice(&Tree { nodes: vec![node] }.encode());
        let mac = self.dst.key().mac(&body);
        let len = (body.len() + 32) as u32;
        let w = &mut out.writer;
        let written = w
            .write_all(&len.to_le_bytes())
            .and_then(|_| w.write_all(&body))
            .and_then(|_| w.write_all(&mac));
        if written.is_err() {
            self.out = None;
        }
    }

    fn flush(&mut self) {
        if let Some(out) = self.out.as_mut()
            && out.writer.flush().is_err()
        {
            self.out = None;
        }
    }
}
