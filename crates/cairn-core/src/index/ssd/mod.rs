//! The SSD placement of the index: the master index kept on a local disk, with at
//! most about 1.4 bytes of RAM per unique blob.
//!
//! The approach is the one Data Domain's and ChunkStash's papers describe:
//! - a Bloom filter in RAM (10 bits per blob, about 1% false positives) answers
//!   "certainly new" for most new chunks without touching the disk;
//! - the records (id and location, [`RECORD_LEN`] bytes) sit on disk in the order
//!   the index files list them, that is, pack by pack; a sorted table of 13-byte
//!   keys (the id's first 8 bytes and the record's position) is on disk too, and a
//!   directory in RAM (8 bytes per 64 keys) tells where the keys of each id prefix
//!   start, so a lookup that passes the filter reads one small run of keys and one
//!   record;
//! - a locality cache: when a lookup finds a blob, the records around it in its
//!   pack (a window of 1,024, 47 KiB) are read (one sequential read) into a
//!   bounded cache, because the next chunks of the same files are almost always
//!   next in the same pack. A re-backup of known data then costs one disk read per
//!   window, not one per chunk.
//!
//! RAM per blob: filter 1.25 B, directory 0.13 B, pack list and pack runs a few
//! hundredths; the cache and the build's buffers are fixed sizes.
//!
//! The files are a cache of the repository's index files: a manifest records which
//! index files and pending-deletion records they were built from, and when the
//! repository's listing differs they are rebuilt (streaming, in bounded memory:
//! records go to disk as each index file is read, keys are sorted in 256 buckets).
//! Anything unreadable or inconsistent in the cache means a rebuild, never an
//! answer: ids are compared in full, so a damaged cache cannot claim a blob that
//! is not there; a lookup that fails to read counts as an error the caller sees.

mod build;
mod cache;
mod checked;
pub(crate) mod filter;
mod lookup;
mod manifest;

use build::*;
use cache::*;
use checked::*;
use filter::*;
use lookup::*;
use manifest::*;

use crate::error::{Error, Result};
use crate::index::IndexSource;
use crate::index::{
    BlobLocation, PackTable, RECORD_LEN, Record, pack_record, record_id, record_pending,
    unpack_record,
};
use cairn_format::index::IndexFile;
use cairn_format::{BlobId, IndexId, PackId, PendingId};
use std::collections::{HashMap, HashSet, VecDeque};
use std::fs::File;
use std::io::{BufReader, BufWriter, Read, Write};
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

/// Bytes of one key: the id's first 8 bytes (big-endian), then the record's
/// position (39 bits) and its pending flag (the top bit), little-endian.
const KEY_LEN: usize = 13;
const POS_MASK: u64 = (1 << 39) - 1;
/// Keys per directory bucket on average (one small read per lookup).
const KEYS_PER_BUCKET: u64 = 64;
/// Filter bits per blob.
const FILTER_BITS_PER_BLOB: u64 = 10;
/// Bit positions set per blob within its 512-bit block.
const FILTER_PROBES: u32 = 7;
/// Keys one directory bucket may hold in a valid build (64 on average; a build
/// is judged damaged past this, rather than reading a huge run per lookup).
const MAX_BUCKET_KEYS: u64 = 1 << 16;
/// Records the locality cache holds (about 5 MB of RAM whatever the index size).
const CACHE_RECORDS: usize = 64 * 1024;
/// 2: checksums (files read whole: BLAKE3 in the manifest; records and keys:
/// XXH3 per 4 KiB block).
const MANIFEST_VERSION: u32 = 2;
/// Index files read (in parallel) and held at once while building: what bounds the
/// build's memory (a backup's index file holds up to 200,000 blobs, a prune's
/// compacted one more).
const READ_BATCH: usize = 4;

/// RAM bytes per blob of the SSD placement (filter, directory, pack runs).
pub const RAM_BYTES_PER_BLOB: f64 =
    FILTER_BITS_PER_BLOB as f64 / 8.0 + 8.0 / KEYS_PER_BUCKET as f64 + 0.05;
/// Local-disk bytes per blob (record and key).
pub const DISK_BYTES_PER_BLOB: f64 = (RECORD_LEN + KEY_LEN) as f64;

/// What the caller of an SSD index will ask.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Answers {
    /// Any id, most of them new (a backup): the Bloom filter in RAM answers
    /// "certainly absent" without a disk read.
    AnyId,
    /// Ids that trees and chunk lists name, nearly always stored (a mount, a
    /// restore): the filter would be passed anyway, so it is not loaded, and RAM
    /// stays nearly flat whatever the repository's size.
    StoredIds,
}

/// A handle on the repository that a segment keeps for rebuilding its large files
/// when a read meets damage (see `checked`).
pub(super) type Source = Arc<dyn IndexSource + Send + Sync>;

/// The open SSD index.
pub struct SsdIndex {
    dir_path: PathBuf,
    records: CheckedFile,
    keys: CheckedFile,
    n_records: u64,
    unique: u64,
    live: u64,
    dir_bits: u32,
    dir: Vec<u64>,
    /// `None` when opened for [`Answers::StoredIds`].
    filter: Option<Filter>,
    runs: Vec<Run>,
    /// Record positions that are not the chosen copy of their id (duplicates).
    skipped: Vec<u64>,
    /// Packs the build knows; a record naming another is damage.
    n_packs: u32,
    /// Index files added since this segment was built, in a segment of their own
    /// whose pack numbers follow this one's (`base_packs` of them).
    delta: Option<Box<SsdIndex>>,
    base_packs: u32,
    cache: Mutex<Cache>,
    /// Lookups that failed to read the disk (their answer was "absent").
    failures: AtomicU64,
    last_failure: Mutex<Option<String>>,
    /// How the large files are rebuilt on damage (absent when the index was
    /// opened only to be checked).
    repair: Option<Arc<Repair>>,
    /// The damage of the build this one replaced at open, if it replaced one.
    rebuilt_from: Option<String>,
    pub(crate) errors: Vec<String>,
}

/// How a build is being opened: for which answers, and with what to rebuild
/// damaged files from.
#[derive(Clone, Copy)]
struct Opening<'a> {
    answers: Answers,
    source: Option<&'a Source>,
}

/// What [`SsdIndex::check_cached`] found.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum CacheState {
    /// No SSD index of this repository on this machine (built at the next use).
    Absent,
    /// Built from other index files than the repository has now (rebuilt at the
    /// next use).
    OutOfDate,
    /// Up to date, every file matching its checksums.
    Intact,
    /// Damaged (marked: rebuilt at the next use), with what was found.
    Damaged(String),
}

/// The repository's index files and pending records, as a build's manifest names
/// them (sorted hex ids): what decides whether a build is current.
fn listing(repo: &dyn IndexSource) -> Result<(Vec<String>, Vec<String>)> {
    let mut files: Vec<String> = repo
        .index_files()?
        .iter()
        .map(|(id, _)| id.to_hex())
        .collect();
    files.sort();
    let mut pending: Vec<String> = repo
        .pending_records()?
        .iter()
        .map(PendingId::to_hex)
        .collect();
    pending.sort();
    Ok((files, pending))
}

/// Whether a build (its base's manifest `m`, its delta's `md`) was made from
/// exactly these index files and pending records (sorted hex ids): what decides
/// whether it is current. A delta holds no pending records.
fn made_from(m: &Manifest, md: Option<&Manifest>, files: &[String], pending: &[String]) -> bool {
    let mut all: Vec<&String> = m
        .index_files
        .iter()
        .chain(md.map_or(&[][..], |d| &d.index_files))
        .collect();
    all.sort();
    all.into_iter().eq(files.iter())
        && m.pending == pending
        && md.is_none_or(|d| d.pending.is_empty())
}

fn io_err(what: &Path, e: std::io::Error) -> Error {
    Error::io(what, e)
}

fn read_file(dir: &Path, name: &str) -> Result<Vec<u8>> {
    let p = dir.join(name);
    std::fs::read(&p).map_err(|e| io_err(&p, e))
}

fn u64s(data: &[u8]) -> Vec<u64> {
    data.chunks_exact(8)
        .map(|c| {
            let mut a = [0u8; 8];
            a.copy_from_slice(c);
            u64::from_le_bytes(a)
        })
        .collect()
}

impl SsdIndex {
    /// The cache directory of a repository under the placement's path.
    pub fn dir_for(base: &Path, repo_id: &str) -> PathBuf {
        base.join(repo_id)
    }

    /// Opens the index at `base` for `repo`, rebuilding it first when the
    /// repository's index files changed since it was built.
    pub fn open(repo: &dyn IndexSource, base: &Path) -> Result<(SsdIndex, Vec<PackId>)> {
        Self::open_with(repo, base, Answers::AnyId)
    }

    /// As [`SsdIndex::open`], for a reader that asks only `answers`: with
    /// [`Answers::StoredIds`] the filter stays on disk, and the RAM held is the
    /// directory and the pack runs (about 0.15 bytes per blob).
    pub fn open_with(
        repo: &dyn IndexSource,
        base: &Path,
        answers: Answers,
    ) -> Result<(SsdIndex, Vec<PackId>)> {
        let repo_id = repo.repository_id().to_string();
        let dir = Self::dir_for(base, &repo_id);
        let source = repo.detached();
        let opening = Opening {
            answers,
            source: source.as_ref(),
        };
        // Private, as the repository whose index it holds is.
        cairn_backend::private_dir(&dir, true).map_err(|e| io_err(&dir, e))?;
        let lock_path = dir.join("lock");
        let lock_file = File::create(&lock_path).map_err(|e| io_err(&lock_path, e))?;
        let mut attempt = 0;
        loop {
            attempt += 1;
            let (files, pending) = listing(repo)?;
            let found = match Self::load_current(&dir, &repo_id, &files, &pending, opening, false) {
                Ok(ix) => return Ok(ix),
                Err(e) => e,
            };
            // A build for these very index files that does not load, or one marked,
            // is damage (not a build that is merely out of date): said by the run
            // through `repaired`, once the build that replaces it opens.
            let damaged =
                Self::damaged_build(&dir, &repo_id, &files, &pending).then(|| found.to_string());
            let said = |(mut ix, packs): (SsdIndex, Vec<PackId>)| {
                if ix.rebuilt_from.is_none() {
                    ix.rebuilt_from = damaged.clone();
                }
                (ix, packs)
            };
            // One builder at a time; whoever waited finds the fresh build above.
            let guard = nix::fcntl::Flock::lock(
                lock_file.try_clone().map_err(|e| io_err(&lock_path, e))?,
                nix::fcntl::FlockArg::LockExclusive,
            )
            .map_err(|(_, e)| Error::Invalid(format!("locking {}: {e}", lock_path.display())))?;
            if let Ok(ix) = Self::load_current(&dir, &repo_id, &files, &pending, opening, false) {
                drop(guard);
                return Ok(ix);
            }
            let incremental = match build_incremental(repo, &dir, &repo_id, &files, &pending) {
                Ok(done) => done,
                Err(Error::Backend(b)) if b.is_not_found() && attempt < 5 => continue,
                Err(e) => return Err(e),
            };
            if incremental
                && let Ok(ix) = Self::load_current(&dir, &repo_id, &files, &pending, opening, true)
            {
                drop(guard);
                return Ok(said(ix));
            }
            match build(repo, &dir, &repo_id, &files, &pending) {
                Ok(()) => {}
                Err(Error::Backend(b)) if b.is_not_found() && attempt < 5 => {
                    // An index file vanished while being read (prune replaced it).
                    continue;
                }
                Err(e) => return Err(e),
            }
            drop(guard);
            return Self::load_current(&dir, &repo_id, &files, &pending, opening, true).map(said);
        }
    }

    /// Whether the build `dir/CURRENT` names is damaged: marked so, or made from
    /// exactly these index files (so not out of date) and yet not loading.
    fn damaged_build(dir: &Path, repo_id: &str, files: &[String], pending: &[String]) -> bool {
        let Ok(name) = std::fs::read_to_string(dir.join("CURRENT")) else {
            return false;
        };
        let build = dir.join(name.trim());
        if build.join(DAMAGED).exists() {
            return true;
        }
        let Ok(m) = read_manifest(&build, repo_id, false) else {
            return false;
        };
        let delta = build.join("delta");
        if !delta.exists() {
            return made_from(&m, None, files, pending);
        }
        match read_manifest(&delta, repo_id, false) {
            Ok(md) => made_from(&m, Some(&md), files, pending),
            Err(_) => true,
        }
    }

    /// Looks at this machine's SSD index of the repository without building one:
    /// whether it is there, up to date, and intact (every file read and checked).
    /// A damaged one is marked, so the next open rebuilds it.
    pub fn check_cached(repo: &dyn IndexSource, base: &Path) -> Result<CacheState> {
        let repo_id = repo.repository_id().to_string();
        let dir = Self::dir_for(base, &repo_id);
        if !dir.join("CURRENT").exists() {
            return Ok(CacheState::Absent);
        }
        let (files, pending) = listing(repo)?;
        let damaged_marker = || {
            std::fs::read_to_string(dir.join("CURRENT"))
                .ok()
                .map(|n| dir.join(n.trim()).join(DAMAGED))
                .is_some_and(|p| p.exists())
        };
        // No repair source: damage is what this looks for, not something to mend.
        let opening = Opening {
            answers: Answers::AnyId,
            source: None,
        };
        match Self::load_current(&dir, &repo_id, &files, &pending, opening, false) {
            Ok((ix, _)) => Ok(match ix.verify() {
                Ok(()) => CacheState::Intact,
                Err(e) => CacheState::Damaged(e),
            }),
            Err(e) if damaged_marker() => Ok(CacheState::Damaged(e.to_string())),
            Err(_) => Ok(CacheState::OutOfDate),
        }
    }

    /// Loads the build `dir/CURRENT` names. Builds are never modified once named
    /// there, so every file read belongs to the same build; a build deleted while
    /// being opened is an error, and the caller then takes the build lock and
    /// looks again.
    fn load_current(
        dir: &Path,
        repo_id: &str,
        files: &[String],
        pending: &[String],
        opening: Opening,
        just_built: bool,
    ) -> Result<(SsdIndex, Vec<PackId>)> {
        let name = String::from_utf8(read_file(dir, "CURRENT")?)
            .map_err(|_| Error::Invalid("SSD index: CURRENT is not a name".into()))?;
        let name = name.trim();
        if !name.starts_with("b-") || !name[2..].bytes().all(|b| b.is_ascii_hexdigit()) {
            return Err(Error::Invalid(
                "SSD index: CURRENT is not a build name".into(),
            ));
        }
        Self::load(
            &dir.join(name),
            repo_id,
            files,
            pending,
            opening,
            just_built,
        )
    }

    /// Loads a build: its base segment, and its delta segment when it has one
    /// (index files added since the base was built). Together they must have been
    /// built from exactly `files` and `pending`.
    fn load(
        dir: &Path,
        repo_id: &str,
        files: &[String],
        pending: &[String],
        opening: Opening,
        just_built: bool,
    ) -> Result<(SsdIndex, Vec<PackId>)> {
        let m = read_manifest(dir, repo_id, just_built)?;
        let delta_dir = dir.join("delta");
        let md = if delta_dir.exists() {
            Some(read_manifest(&delta_dir, repo_id, just_built)?)
        } else {
            None
        };
        if !made_from(&m, md.as_ref(), files, pending) {
            return Err(Error::Invalid("SSD index is out of date".into()));
        }
        let Some(md) = md else {
            return Self::load_segment(dir, m, opening, false);
        };
        let (mut base, mut packs) = Self::load_segment(dir, m, opening, false)?;
        let (delta, delta_packs) = Self::load_segment(&delta_dir, md, opening, true)?;
        base.base_packs = packs.len() as u32;
        packs.extend(delta_packs);
        base.delta = Some(Box::new(delta));
        Ok((base, packs))
    }

    /// Loads one segment's files, checking that they are consistent.
    fn load_segment(
        dir: &Path,
        m: Manifest,
        opening: Opening,
        delta: bool,
    ) -> Result<(SsdIndex, Vec<PackId>)> {
        let answers = opening.answers;
        let bad = |what: &str| damage(dir, &format!("{what} is inconsistent"));
        let repair = opening
            .source
            .map(|s| Arc::new(Repair::new(s.clone(), dir, &m, delta)));
        let records = CheckedFile::open(
            dir,
            Large::Records,
            m.records * RECORD_LEN as u64,
            &m,
            repair.as_ref(),
        )?;
        let keys = CheckedFile::open(
            dir,
            Large::Keys,
            m.records * KEY_LEN as u64,
            &m,
            repair.as_ref(),
        )?;
        let dir_bytes = read_verified(dir, "dir.bin", &m)?;
        let d: Vec<u64> = u64s(&dir_bytes);
        if m.dir_bits > 40
            || d.len() != (1usize << m.dir_bits) + 1
            || d.last().copied() != Some(m.records)
            || d.windows(2).any(|w| w[0] > w[1])
        {
            return Err(bad("directory"));
        }
        if d.windows(2).any(|w| w[1] - w[0] > MAX_BUCKET_KEYS) {
            return Err(bad("directory"));
        }
        let filter = match answers {
            Answers::StoredIds => None,
            Answers::AnyId => {
                let f = Filter::from_bytes(&read_verified(dir, "filter.bin", &m)?)
                    .ok_or_else(|| bad("filter"))?;
                if f.blocks.len() as u64 != (m.records * FILTER_BITS_PER_BLOB).div_ceil(512).max(1)
                {
                    return Err(bad("filter"));
                }
                Some(f)
            }
        };
        let packs: Vec<PackId> = read_verified(dir, "packs.bin", &m)?
            .chunks_exact(32)
            .map(|c| {
                let mut a = [0u8; 32];
                a.copy_from_slice(c);
                PackId(a)
            })
            .collect();
        let runs_raw = read_verified(dir, "runs.bin", &m)?;
        let mut runs = Vec::new();
        for c in runs_raw.chunks_exact(16) {
            let start = u64::from_le_bytes([c[0], c[1], c[2], c[3], c[4], c[5], c[6], c[7]]);
            let count = u32::from_le_bytes([c[8], c[9], c[10], c[11]]);
            let pack = u32::from_le_bytes([c[12], c[13], c[14], c[15]]);
            if start
                .checked_add(u64::from(count))
                .is_none_or(|end| end > m.records)
                || pack as usize >= packs.len()
            {
                return Err(bad("pack runs"));
            }
            runs.push(Run { start, count, pack });
        }
        let skipped = u64s(&read_verified(dir, "skipped.bin", &m)?);
        if m.unique > m.records
            || skipped.len() as u64 != m.records - m.unique
            || skipped.windows(2).any(|w| w[0] >= w[1])
            || skipped.last().is_some_and(|&s| s >= m.records)
        {
            return Err(bad("skip list"));
        }
        Ok((
            SsdIndex {
                dir_path: dir.to_path_buf(),
                records,
                keys,
                n_records: m.records,
                unique: m.unique,
                live: m.live,
                dir_bits: m.dir_bits,
                dir: d,
                filter,
                runs,
                skipped,
                n_packs: packs.len() as u32,
                delta: None,
                base_packs: 0,
                cache: Mutex::new(Cache::default()),
                failures: AtomicU64::new(0),
                last_failure: Mutex::new(None),
                repair,
                rebuilt_from: None,
                errors: m.errors,
            },
            packs,
        ))
    }
}

/// Bytes of the files of an SSD index build (its base and its delta).
pub fn disk_bytes(dir: &Path) -> u64 {
    let files = |d: &Path| -> u64 {
        std::fs::read_dir(d)
            .map(|rd| {
                rd.filter_map(|e| e.ok())
                    .filter_map(|e| e.metadata().ok())
                    .filter(|m| m.is_file())
                    .map(|m| m.len())
                    .sum()
            })
            .unwrap_or(0)
    };
    files(dir) + files(&dir.join("delta"))
}

#[cfg(test)]
pub(super) mod tests {
    use super::*;
    use crate::index::MasterIndex;
    use crate::repo::Repository;
    use crate::testutil::mem_repo;
    use cairn_format::index::{IndexBlob, IndexPack};
    use cairn_format::pack::{BlobCompression, BlobKind};
    use cairn_format::pending::PendingDeletion;

    pub(crate) struct Gen(pub(crate) u64);
    impl Gen {
        pub(crate) fn id(&mut self) -> BlobId {
            let mut id = [0u8; 32];
            for c in id.chunks_mut(8) {
                self.0 ^= self.0 << 13;
                self.0 ^= self.0 >> 7;
                self.0 ^= self.0 << 17;
                c.copy_from_slice(&self.0.to_le_bytes());
            }
            BlobId(id)
        }
    }

    fn pack(g: &mut Gen, n: u32, extra: &[BlobId]) -> IndexPack {
        let mut blobs: Vec<IndexBlob> = (0..n)
            .map(|i| IndexBlob {
                kind: if i % 7 == 0 {
                    BlobKind::Tree
                } else {
                    BlobKind::Data
                },
                id: g.id(),
                offset: i * 1000,
                length: 900 + i,
                raw_length: 2000 + i,
                compression: BlobCompression::Zstd,
            })
            .collect();
        for (i, id) in extra.iter().enumerate() {
            blobs.push(IndexBlob {
                id: *id,
                offset: 900_000 + i as u32 * 10,
                ..blobs[1]
            });
        }
        let mut pid = [0u8; 32];
        pid[..8].copy_from_slice(&g.0.to_le_bytes());
        IndexPack {
            id: PackId(pid),
            blobs,
        }
    }

    /// Every answer of the SSD index equals the RAM index's on the same files.
    /// The SSD index answers as the RAM index does, opened with its filter or
    /// without (for readers of stored ids, where it holds less RAM).
    fn assert_same(repo: &mut Repository, base: &Path, probes: &[BlobId], dups: &[BlobId]) {
        assert_same_as(repo, base, probes, dups, Answers::AnyId);
        assert_same_as(repo, base, probes, dups, Answers::StoredIds);
        let with = SsdIndex::open(repo, base).unwrap().0.ram_bytes();
        let without = SsdIndex::open_with(repo, base, Answers::StoredIds)
            .unwrap()
            .0
            .ram_bytes();
        assert!(without < with, "{without} < {with}");
    }

    fn assert_same_as(
        repo: &mut Repository,
        base: &Path,
        probes: &[BlobId],
        dups: &[BlobId],
        answers: Answers,
    ) {
        let (ssd, packs) = SsdIndex::open_with(repo, base, answers).unwrap();
        let ssd = MasterIndex::from_ssd(ssd, packs);
        repo.load_index_in_ram().unwrap();
        let ram = repo.index().clone();
        assert_eq!(ssd.len(), ram.len());
        assert_eq!(ssd.live_len(), ram.live_len());
        for id in probes {
            assert_eq!(ssd.contains(id), ram.contains(id), "{id:?}");
            assert_eq!(ssd.is_live(id), ram.is_live(id), "{id:?}");
            match (ssd.get(id), ram.get(id)) {
                // Live copies of a blob stored twice are equally good.
                (Some(_), Some(_)) if dups.contains(id) => {}
                (Some(a), Some(b)) => {
                    assert_eq!(ssd.pack_of(&a), ram.pack_of(&b));
                    assert_eq!((a.offset, a.length, a.kind), (b.offset, b.length, b.kind));
                }
                (None, None) => {}
                other => panic!("{id:?}: {other:?}"),
            }
        }
        let mut a: Vec<(BlobId, PackId)> = ssd
            .iter_live()
            .map(|(id, l)| (id, ssd.pack_of(&l)))
            .collect();
        let mut b: Vec<(BlobId, PackId)> = ram
            .iter_live()
            .map(|(id, l)| (id, ram.pack_of(&l)))
            .collect();
        a.sort();
        b.sort();
        assert_eq!(a.len(), b.len());
        assert_eq!(
            a.iter().map(|x| x.0).collect::<Vec<_>>(),
            b.iter().map(|x| x.0).collect::<Vec<_>>()
        );
        assert_eq!(ssd.iter().count(), ram.iter().count());
        assert!(ssd.ssd().unwrap().failures().is_none());
    }

    #[test]
    fn the_ssd_index_answers_exactly_like_the_ram_index() {
        let mut repo = mem_repo();
        let dir = tempfile::tempdir().unwrap();
        let mut g = Gen(0x1234_5678);
        let p1: Vec<IndexPack> = (0..20).map(|_| pack(&mut g, 500, &[])).collect();
        let dup = p1[3].blobs[10].id;
        let p2: Vec<IndexPack> = (0..10).map(|_| pack(&mut g, 300, &[dup])).collect();
        let old = repo
            .write_index_file(&IndexFile {
                packs: p1.clone(),
                ..Default::default()
            })
            .unwrap();
        // A replacement that keeps half of the old file's packs.
        repo.write_index_file(&IndexFile {
            supersedes: vec![old],
            packs: p1[..10].to_vec(),
            ..Default::default()
        })
        .unwrap();
        repo.write_index_file(&IndexFile {
            packs: p2.clone(),
            ..Default::default()
        })
        .unwrap();
        // Retired packs: one of the superseded ones (pending only) and one holding a
        // blob that also has a live copy.
        let only_pending = p1[15].blobs[0].id;
        repo.write_pending(&PendingDeletion {
            packs: vec![p1[15].clone(), pack(&mut g, 5, &[dup])],
            ..Default::default()
        })
        .unwrap();
        let mut probes: Vec<BlobId> = p1
            .iter()
            .chain(&p2)
            .flat_map(|p| p.blobs.iter().map(|b| b.id))
            .collect();
        probes.extend((0..2000).map(|_| g.id()));
        assert_same(&mut repo, dir.path(), &probes, &[dup]);
        repo.load_index_in_ram().unwrap();
        assert!(repo.index().contains(&only_pending) && !repo.index().is_live(&only_pending));
        assert!(repo.index().is_live(&dup));

        // A new index file: the next open rebuilds and finds it.
        let p3 = pack(&mut g, 50, &[]);
        repo.write_index_file(&IndexFile {
            packs: vec![p3.clone()],
            ..Default::default()
        })
        .unwrap();
        probes.extend(p3.blobs.iter().map(|b| b.id));
        assert_same(&mut repo, dir.path(), &probes, &[dup]);
        let base = SsdIndex::dir_for(dir.path(), &repo.config().id);
        let current = || {
            let name = std::fs::read_to_string(base.join("CURRENT")).unwrap();
            base.join(name.trim())
        };
        assert!(
            current().join("delta").exists(),
            "a new file goes to a delta"
        );
        // Another: the delta is rebuilt with both, the base shared.
        let p4 = pack(&mut g, 40, &[p3.blobs[0].id]);
        repo.write_index_file(&IndexFile {
            packs: vec![p4.clone()],
            ..Default::default()
        })
        .unwrap();
        probes.extend(p4.blobs.iter().map(|b| b.id));
        assert_same(&mut repo, dir.path(), &probes, &[dup, p3.blobs[0].id]);
        assert!(current().join("delta").exists());
        // A file that supersedes others (a prune's) means a full build.
        let all = repo.list_index_files().unwrap();
        repo.write_index_file(&IndexFile {
            supersedes: all,
            packs: p1[..10]
                .iter()
                .chain(&p2)
                .cloned()
                .chain([p3.clone(), p4.clone()])
                .collect(),
            ..Default::default()
        })
        .unwrap();
        assert_same(&mut repo, dir.path(), &probes, &[dup, p3.blobs[0].id]);
        assert!(
            !current().join("delta").exists(),
            "superseding files: full build"
        );

        // A damaged cache is rebuilt, not trusted.
        let cur = current();
        let keys = cur.join("keys.bin");
        let len = std::fs::metadata(&keys).unwrap().len();
        std::fs::OpenOptions::new()
            .write(true)
            .open(&keys)
            .unwrap()
            .set_len(len - 13)
            .unwrap();
        assert_same(&mut repo, dir.path(), &probes, &[dup]);
    }

    /// The repository as a source that gives nothing to rebuild damaged files
    /// from in the middle of a run.
    struct NoRepairs<'a>(&'a Repository);

    impl IndexSource for NoRepairs<'_> {
        fn repository_id(&self) -> &str {
            self.0.repository_id()
        }
        fn index_files(&self) -> Result<Vec<(IndexId, u64)>> {
            self.0.index_files()
        }
        fn read_index_file(&self, id: &IndexId) -> Result<IndexFile> {
            self.0.read_index_file(id)
        }
        fn pending_records(&self) -> Result<Vec<PendingId>> {
            self.0.pending_records()
        }
        fn read_pending(&self, id: &PendingId) -> Result<cairn_format::pending::PendingDeletion> {
            IndexSource::read_pending(self.0, id)
        }
    }

    /// Flips 2% of a file's bytes, spread over it (at least one).
    fn flip(path: &Path) {
        let mut data = std::fs::read(path).unwrap();
        let n = (data.len() / 50).max(1);
        let step = (data.len() / n).max(1);
        for i in (0..data.len()).step_by(step).take(n) {
            data[i] ^= 0x5a;
        }
        std::fs::write(path, data).unwrap();
    }

    /// See: issue "a damaged local SSD-index cache breaks every restore while check
    /// passes". Damage in a file read whole at open is found at open and the build is
    /// rebuilt; damage in records or keys is mended by the lookup that meets it (or
    /// fails it, never a wrong answer), marks the build, and the next open rebuilds
    /// it. `check_cached` finds any of it.
    #[test]
    fn damaged_files_are_found_and_rebuilt() {
        let mut repo = mem_repo();
        let dir = tempfile::tempdir().unwrap();
        let mut g = Gen(0x5eed);
        let packs: Vec<IndexPack> = (0..30).map(|_| pack(&mut g, 400, &[])).collect();
        let probes: Vec<BlobId> = packs
            .iter()
            .flat_map(|p| p.blobs.iter().map(|b| b.id))
            .step_by(7)
            .collect();
        repo.write_index_file(&IndexFile {
            packs,
            ..Default::default()
        })
        .unwrap();
        assert_same(&mut repo, dir.path(), &probes, &[]);
        let base = SsdIndex::dir_for(dir.path(), &repo.config().id);
        let current = || {
            base.join(
                std::fs::read_to_string(base.join("CURRENT"))
                    .unwrap()
                    .trim(),
            )
        };
        assert_eq!(
            SsdIndex::check_cached(&repo, dir.path()).unwrap(),
            CacheState::Intact
        );
        // Read whole at open: found there, rebuilt at once.
        for name in [
            "packs.bin",
            "filter.bin",
            "dir.bin",
            "runs.bin",
            "keys.bin.sums",
        ] {
            let before = current();
            flip(&before.join(name));
            assert!(
                matches!(
                    SsdIndex::check_cached(&repo, dir.path()).unwrap(),
                    CacheState::Damaged(_)
                ),
                "{name}"
            );
            assert_same(&mut repo, dir.path(), &probes, &[]);
            assert_ne!(current(), before, "{name}: rebuilt into a new build");
        }
        // Read piecemeal: a lookup that meets the damage rebuilds the segment's
        // large files from the repository and is answered from them; the build
        // is marked, and the next open rebuilds it. Without a source to rebuild
        // from, such lookups fail (never a false answer).
        for (name, repairs) in [
            ("records.bin", true),
            ("keys.bin", true),
            ("keys.bin", false),
        ] {
            let before = current();
            flip(&before.join(name));
            let opened = if repairs {
                SsdIndex::open(&repo, dir.path())
            } else {
                SsdIndex::open(&NoRepairs(&repo), dir.path())
            };
            let (ssd, packs) = opened.unwrap();
            let ssd = MasterIndex::from_ssd(ssd, packs);
            repo.load_index_in_ram().unwrap();
            let ram = repo.index().clone();
            let mut answered = 0;
            for id in &probes {
                if let Some(a) = ssd.get(id) {
                    let b = ram.get(id).unwrap();
                    assert_eq!(
                        (a.offset, a.length, ssd.pack_of(&a)),
                        (b.offset, b.length, ram.pack_of(&b)),
                        "{name}: wrong answer"
                    );
                    answered += 1;
                }
            }
            let s = ssd.ssd().unwrap();
            if repairs {
                assert_eq!(answered, probes.len(), "{name}: every lookup answered");
                assert!(s.failures().is_none(), "{name}: {:?}", s.failures());
                let found = s.repaired().unwrap_or_default();
                assert!(found.contains(name), "{name}: damage said: {found}");
            } else {
                assert!(answered < probes.len(), "{name}: damage never met");
                assert!(s.failures().is_some(), "{name}: failures counted");
                assert!(s.repaired().is_none());
            }
            assert!(before.join(DAMAGED).exists(), "{name}: marked");
            drop(ssd);
            let leftovers = std::fs::read_dir(&base)
                .unwrap()
                .flatten()
                .filter(|e| e.file_name().to_string_lossy().starts_with(REPAIR_PREFIX))
                .count();
            assert_eq!(leftovers, 0, "a repair's directory is removed once opened");
            assert_same(&mut repo, dir.path(), &probes, &[]);
            assert_ne!(current(), before, "{name}: rebuilt");
            assert_eq!(
                SsdIndex::check_cached(&repo, dir.path()).unwrap(),
                CacheState::Intact
            );
        }
        // Cut short under an open index (in the middle of a run): the same.
        let before = current();
        let (ssd, packs) = SsdIndex::open(&repo, dir.path()).unwrap();
        for name in ["records.bin", "keys.bin"] {
            let f = std::fs::OpenOptions::new()
                .write(true)
                .open(before.join(name))
                .unwrap();
            f.set_len(0).unwrap();
        }
        let ssd = MasterIndex::from_ssd(ssd, packs);
        for id in &probes {
            assert!(
                ssd.get(id).is_some(),
                "answered after the files were cut short"
            );
        }
        let s = ssd.ssd().unwrap();
        assert!(s.failures().is_none(), "{:?}", s.failures());
        assert!(s.repaired().is_some());
        drop(ssd);
        assert_same(&mut repo, dir.path(), &probes, &[]);
        // The delta segment (index files added since the base was built) is
        // rebuilt on its own, from its own files.
        let more: Vec<IndexPack> = (0..2).map(|_| pack(&mut g, 400, &[])).collect();
        let mut probes = probes;
        probes.extend(more.iter().flat_map(|p| p.blobs.iter().map(|b| b.id)));
        repo.write_index_file(&IndexFile {
            packs: more,
            ..Default::default()
        })
        .unwrap();
        assert_same(&mut repo, dir.path(), &probes, &[]);
        let delta = current().join("delta");
        flip(&delta.join("records.bin"));
        let (ssd, packs) = SsdIndex::open(&repo, dir.path()).unwrap();
        let ssd = MasterIndex::from_ssd(ssd, packs);
        repo.load_index_in_ram().unwrap();
        let ram = repo.index().clone();
        for id in &probes {
            let (a, b) = (ssd.get(id).unwrap(), ram.get(id).unwrap());
            assert_eq!((a.offset, ssd.pack_of(&a)), (b.offset, ram.pack_of(&b)));
        }
        let s = ssd.ssd().unwrap();
        assert!(s.failures().is_none(), "{:?}", s.failures());
        assert!(s.repaired().is_some_and(|f| f.contains("delta")));
    }
}
