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
//! - a locality cache: when a lookup finds a blob, every record of its pack is
//!   read (one sequential read) into a bounded cache, because the next chunks of
//!   the same files are almost always in the same pack. A re-backup of known data
//!   then costs one disk read per pack, not one per chunk.
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

use crate::error::{Error, Result};
use crate::index::{
    BlobLocation, PackTable, RECORD_LEN, Record, pack_record, record_id, record_pending,
    unpack_record,
};
use crate::repo::Repository;
use cairn_format::index::IndexFile;
use cairn_format::{BlobId, IndexId, PackId, PendingId};
use std::collections::{HashMap, HashSet, VecDeque};
use std::fs::File;
use std::io::{BufReader, BufWriter, Read, Write};
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};
use std::sync::Mutex;
use std::sync::atomic::{AtomicU64, Ordering};

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
const MANIFEST_VERSION: u32 = 1;
/// Index files read (in parallel) and held at once while building: what bounds the
/// build's memory (a backup's index file holds up to 200,000 blobs, a prune's
/// compacted one more).
const READ_BATCH: usize = 4;

/// RAM bytes per blob of the SSD placement (filter, directory, pack runs).
pub const RAM_BYTES_PER_BLOB: f64 =
    FILTER_BITS_PER_BLOB as f64 / 8.0 + 8.0 / KEYS_PER_BUCKET as f64 + 0.05;
/// Local-disk bytes per blob (record and key).
pub const DISK_BYTES_PER_BLOB: f64 = (RECORD_LEN + KEY_LEN) as f64;

fn prefix_of(id: &[u8]) -> u64 {
    let mut b = [0u8; 8];
    b.copy_from_slice(&id[..8]);
    u64::from_be_bytes(b)
}

pub(crate) fn mix(mut x: u64) -> u64 {
    // splitmix64's finaliser: the filter's probes from the id prefix, the
    // estimate's gear table from a counter.
    x ^= x >> 30;
    x = x.wrapping_mul(0xbf58_476d_1ce4_e5b9);
    x ^= x >> 27;
    x = x.wrapping_mul(0x94d0_49bb_1331_11eb);
    x ^ (x >> 31)
}

/// A blocked Bloom filter: each key sets [`FILTER_PROBES`] bits in one 512-bit
/// block, so a query touches one cache line.
struct Filter {
    blocks: Vec<[u64; 8]>,
}

impl Filter {
    fn with_capacity(n: u64) -> Self {
        let blocks = (n * FILTER_BITS_PER_BLOB).div_ceil(512).max(1) as usize;
        Filter {
            blocks: vec![[0u64; 8]; blocks],
        }
    }
    fn probes(&self, prefix: u64) -> (usize, [u32; FILTER_PROBES as usize]) {
        let h = mix(prefix);
        let block = ((u128::from(h) * self.blocks.len() as u128) >> 64) as usize;
        let mut g = mix(h ^ 0x9e37_79b9_7f4a_7c15);
        let mut bits = [0u32; FILTER_PROBES as usize];
        for b in bits.iter_mut() {
            *b = (g & 511) as u32;
            g = g.rotate_right(9);
        }
        (block, bits)
    }
    fn insert(&mut self, prefix: u64) {
        let (block, bits) = self.probes(prefix);
        let blk = &mut self.blocks[block];
        for b in bits {
            blk[(b / 64) as usize] |= 1 << (b % 64);
        }
    }
    fn may_contain(&self, prefix: u64) -> bool {
        let (block, bits) = self.probes(prefix);
        let blk = &self.blocks[block];
        bits.iter()
            .all(|b| blk[(b / 64) as usize] & (1 << (b % 64)) != 0)
    }
    fn to_bytes(&self) -> Vec<u8> {
        self.blocks
            .iter()
            .flat_map(|b| b.iter().flat_map(|w| w.to_le_bytes()))
            .collect()
    }
    fn from_bytes(data: &[u8]) -> Option<Self> {
        if data.is_empty() || !data.len().is_multiple_of(64) {
            return None;
        }
        let blocks = data
            .chunks_exact(64)
            .map(|c| {
                let mut b = [0u64; 8];
                for (w, bytes) in b.iter_mut().zip(c.chunks_exact(8)) {
                    let mut a = [0u8; 8];
                    a.copy_from_slice(bytes);
                    *w = u64::from_le_bytes(a);
                }
                b
            })
            .collect();
        Some(Filter { blocks })
    }
}

/// What the cache was built from.
#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
struct Manifest {
    version: u32,
    repo_id: String,
    /// Every index file listed when it was built (live and superseded), sorted.
    index_files: Vec<String>,
    /// Every pending-deletion record listed, sorted.
    pending: Vec<String>,
    records: u64,
    unique: u64,
    live: u64,
    dir_bits: u32,
    /// Index files that could not be read (their blobs count as missing).
    errors: Vec<String>,
}

/// Reads and checks a segment's manifest. A build that met unreadable index files
/// is redone at every open, as the RAM placement reads them again every time: the
/// damage may have been passing.
fn read_manifest(dir: &Path, repo_id: &str) -> Result<Manifest> {
    let m: Manifest = serde_json::from_slice(&read_file(dir, "manifest.json")?)
        .map_err(|e| Error::Invalid(format!("SSD index manifest: {e}")))?;
    if m.version != MANIFEST_VERSION || m.repo_id != repo_id || !m.errors.is_empty() {
        return Err(Error::Invalid("SSD index is out of date".into()));
    }
    Ok(m)
}

/// A run of consecutive records of one pack.
#[derive(Clone, Copy)]
struct Run {
    start: u64,
    count: u32,
    pack: u32,
}

/// The locality cache: whole packs' records, least recently loaded out first.
#[derive(Default)]
struct Cache {
    map: HashMap<BlobId, (BlobLocation, bool)>,
    order: VecDeque<(u32, Vec<BlobId>)>,
    loaded: HashSet<u32>,
    /// Packs of the last few lookups that went to disk: a pack is loaded whole
    /// on its second hit among them, so random lookups (no locality to exploit)
    /// do not pay for reading and caching whole packs.
    recent: VecDeque<u32>,
}

/// Disk hits remembered to decide whether a pack is worth loading.
const RECENT_HITS: usize = 16;

impl Cache {
    fn insert_pack(&mut self, pack: u32, records: Vec<(BlobId, BlobLocation, bool)>) {
        if !self.loaded.insert(pack) {
            return;
        }
        while self.map.len() + records.len() > CACHE_RECORDS {
            let Some((p, ids)) = self.order.pop_front() else {
                break;
            };
            self.loaded.remove(&p);
            for id in ids {
                self.map.remove(&id);
            }
        }
        let ids = records.iter().map(|r| r.0).collect();
        for (id, loc, pending) in records {
            self.map.entry(id).or_insert((loc, pending));
        }
        self.order.push_back((pack, ids));
    }
}

/// The open SSD index.
pub struct SsdIndex {
    dir_path: PathBuf,
    records: File,
    keys: File,
    n_records: u64,
    unique: u64,
    live: u64,
    dir_bits: u32,
    dir: Vec<u64>,
    filter: Filter,
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
    pub(crate) errors: Vec<String>,
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
    pub fn open(repo: &Repository, base: &Path) -> Result<(SsdIndex, Vec<PackId>)> {
        let repo_id = repo.config().id.clone();
        let dir = Self::dir_for(base, &repo_id);
        std::fs::create_dir_all(&dir).map_err(|e| io_err(&dir, e))?;
        let lock_path = dir.join("lock");
        let lock_file = File::create(&lock_path).map_err(|e| io_err(&lock_path, e))?;
        let mut attempt = 0;
        loop {
            attempt += 1;
            let mut files: Vec<String> = repo
                .list_index_files()?
                .iter()
                .map(IndexId::to_hex)
                .collect();
            files.sort();
            let mut pending: Vec<String> =
                repo.list_pending()?.iter().map(PendingId::to_hex).collect();
            pending.sort();
            if let Ok(ix) = Self::load_current(&dir, &repo_id, &files, &pending) {
                return Ok(ix);
            }
            // One builder at a time; whoever waited finds the fresh build above.
            let guard = nix::fcntl::Flock::lock(
                lock_file.try_clone().map_err(|e| io_err(&lock_path, e))?,
                nix::fcntl::FlockArg::LockExclusive,
            )
            .map_err(|(_, e)| Error::Invalid(format!("locking {}: {e}", lock_path.display())))?;
            if let Ok(ix) = Self::load_current(&dir, &repo_id, &files, &pending) {
                drop(guard);
                return Ok(ix);
            }
            let incremental = match build_incremental(repo, &dir, &repo_id, &files, &pending) {
                Ok(done) => done,
                Err(Error::Backend(b)) if b.is_not_found() && attempt < 5 => continue,
                Err(e) => return Err(e),
            };
            if incremental && let Ok(ix) = Self::load_current(&dir, &repo_id, &files, &pending) {
                drop(guard);
                return Ok(ix);
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
            return Self::load_current(&dir, &repo_id, &files, &pending);
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
    ) -> Result<(SsdIndex, Vec<PackId>)> {
        let name = String::from_utf8(read_file(dir, "CURRENT")?)
            .map_err(|_| Error::Invalid("SSD index: CURRENT is not a name".into()))?;
        let name = name.trim();
        if !name.starts_with("b-") || !name[2..].bytes().all(|b| b.is_ascii_hexdigit()) {
            return Err(Error::Invalid(
                "SSD index: CURRENT is not a build name".into(),
            ));
        }
        Self::load(&dir.join(name), repo_id, files, pending)
    }

    /// Loads a build: its base segment, and its delta segment when it has one
    /// (index files added since the base was built). Together they must have been
    /// built from exactly `files` and `pending`.
    fn load(
        dir: &Path,
        repo_id: &str,
        files: &[String],
        pending: &[String],
    ) -> Result<(SsdIndex, Vec<PackId>)> {
        let stale = || Error::Invalid("SSD index is out of date".into());
        let m = read_manifest(dir, repo_id)?;
        let delta_dir = dir.join("delta");
        if !delta_dir.exists() {
            if m.index_files != files || m.pending != pending {
                return Err(stale());
            }
            return Self::load_segment(dir, m);
        }
        let md = read_manifest(&delta_dir, repo_id)?;
        let mut all: Vec<String> = m
            .index_files
            .iter()
            .chain(&md.index_files)
            .cloned()
            .collect();
        all.sort();
        if all != files || m.pending != pending || !md.pending.is_empty() {
            return Err(stale());
        }
        let (mut base, mut packs) = Self::load_segment(dir, m)?;
        let (delta, delta_packs) = Self::load_segment(&delta_dir, md)?;
        base.base_packs = packs.len() as u32;
        packs.extend(delta_packs);
        base.delta = Some(Box::new(delta));
        Ok((base, packs))
    }

    /// Loads one segment's files, checking that they are consistent.
    fn load_segment(dir: &Path, m: Manifest) -> Result<(SsdIndex, Vec<PackId>)> {
        let bad = |what: &str| Error::Invalid(format!("SSD index: {what} is inconsistent"));
        let records_path = dir.join("records.bin");
        let records = File::open(&records_path).map_err(|e| io_err(&records_path, e))?;
        let keys_path = dir.join("keys.bin");
        let keys = File::open(&keys_path).map_err(|e| io_err(&keys_path, e))?;
        let rlen = records
            .metadata()
            .map_err(|e| io_err(&records_path, e))?
            .len();
        let klen = keys.metadata().map_err(|e| io_err(&keys_path, e))?.len();
        if rlen != m.records * RECORD_LEN as u64 || klen != m.records * KEY_LEN as u64 {
            return Err(bad("record or key file size"));
        }
        let dir_bytes = read_file(dir, "dir.bin")?;
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
        let filter =
            Filter::from_bytes(&read_file(dir, "filter.bin")?).ok_or_else(|| bad("filter"))?;
        if filter.blocks.len() as u64 != (m.records * FILTER_BITS_PER_BLOB).div_ceil(512).max(1) {
            return Err(bad("filter"));
        }
        let packs: Vec<PackId> = read_file(dir, "packs.bin")?
            .chunks_exact(32)
            .map(|c| {
                let mut a = [0u8; 32];
                a.copy_from_slice(c);
                PackId(a)
            })
            .collect();
        let runs_raw = read_file(dir, "runs.bin")?;
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
        let skipped = u64s(&read_file(dir, "skipped.bin")?);
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
                errors: m.errors,
            },
            packs,
        ))
    }

    /// Blobs findable (a blob stored again after the base was built counts twice
    /// until the next full build).
    pub fn len(&self) -> usize {
        self.unique as usize + self.delta.as_ref().map_or(0, |d| d.len())
    }
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
    pub fn live_len(&self) -> usize {
        self.live as usize + self.delta.as_ref().map_or(0, |d| d.live_len())
    }
    pub fn path(&self) -> &Path {
        &self.dir_path
    }

    /// RAM the open index holds (filter, directory, runs, skip list; the cache is
    /// bounded separately).
    pub fn ram_bytes(&self) -> usize {
        self.delta.as_ref().map_or(0, |d| d.ram_bytes())
            + self.filter.blocks.len() * 64
            + self.dir.len() * 8
            + self.runs.len() * std::mem::size_of::<Run>()
            + self.skipped.len() * 8
    }

    fn fail(&self, e: impl std::fmt::Display) {
        self.failures.fetch_add(1, Ordering::Relaxed);
        if let Ok(mut l) = self.last_failure.lock() {
            *l = Some(e.to_string());
        }
    }

    /// Lookups that could not read the disk since the index was opened, and the
    /// last reason.
    pub fn failures(&self) -> Option<(u64, String)> {
        if let Some(f) = self.delta.as_ref().and_then(|d| d.failures()) {
            return Some(f);
        }
        let n = self.failures.load(Ordering::Relaxed);
        (n > 0).then(|| {
            let why = self
                .last_failure
                .lock()
                .ok()
                .and_then(|l| l.clone())
                .unwrap_or_default();
            (n, why)
        })
    }

    fn read_record(&self, pos: u64) -> std::io::Result<Record> {
        let mut r = [0u8; RECORD_LEN];
        self.records
            .read_exact_at(&mut r, pos * RECORD_LEN as u64)?;
        Ok(r)
    }

    fn run_of(&self, pos: u64) -> Option<Run> {
        let i = self.runs.partition_point(|r| r.start <= pos);
        let r = *self.runs.get(i.checked_sub(1)?)?;
        (pos < r.start + u64::from(r.count)).then_some(r)
    }

    /// Loads every record of the pack run holding `pos` into the cache, when
    /// its pack was hit on disk recently too.
    fn load_run(&self, pos: u64) -> std::io::Result<()> {
        let Some(run) = self.run_of(pos) else {
            return Ok(());
        };
        {
            let mut cache = self.cache.lock().unwrap_or_else(|e| e.into_inner());
            let again = cache.recent.contains(&run.pack);
            if cache.recent.len() == RECENT_HITS {
                cache.recent.pop_front();
            }
            cache.recent.push_back(run.pack);
            if !again {
                return Ok(());
            }
        }
        let mut buf = vec![0u8; run.count as usize * RECORD_LEN];
        self.records
            .read_exact_at(&mut buf, run.start * RECORD_LEN as u64)?;
        let mut out = Vec::with_capacity(run.count as usize);
        for (i, c) in buf.chunks_exact(RECORD_LEN).enumerate() {
            let p = run.start + i as u64;
            if self.skipped.binary_search(&p).is_ok() {
                continue;
            }
            let mut r = [0u8; RECORD_LEN];
            r.copy_from_slice(c);
            let loc = unpack_record(&r);
            if loc.pack_number() < self.n_packs {
                out.push((record_id(&r), loc, record_pending(&r)));
            }
        }
        let mut cache = self.cache.lock().unwrap_or_else(|e| e.into_inner());
        cache.insert_pack(run.pack, out);
        Ok(())
    }

    fn lookup_disk(&self, id: &BlobId) -> std::io::Result<Option<(BlobLocation, bool)>> {
        let prefix = prefix_of(&id.0);
        let b = if self.dir_bits == 0 {
            0
        } else {
            (prefix >> (64 - self.dir_bits)) as usize
        };
        let (lo, hi) = (self.dir[b], self.dir[b + 1]);
        if lo == hi {
            return Ok(None);
        }
        let mut buf = vec![0u8; ((hi - lo) as usize) * KEY_LEN];
        self.keys.read_exact_at(&mut buf, lo * KEY_LEN as u64)?;
        for k in buf.chunks_exact(KEY_LEN) {
            if prefix_of(k) != prefix {
                continue;
            }
            let pos = key_pos(k);
            if self.skipped.binary_search(&pos).is_ok() {
                continue;
            }
            let r = self.read_record(pos)?;
            if r[..32] == id.0 {
                let loc = unpack_record(&r);
                if loc.pack_number() >= self.n_packs {
                    return Err(std::io::Error::other("a record names an unknown pack"));
                }
                // The locality cache only saves later reads: its failure is no error.
                let _ = self.load_run(pos);
                return Ok(Some((loc, record_pending(&r))));
            }
        }
        Ok(None)
    }

    /// The location of a blob and whether it is only pending.
    pub fn lookup(&self, id: &BlobId) -> Option<(BlobLocation, bool)> {
        // The delta holds only live records: a hit there is as good as any.
        if let Some(d) = &self.delta
            && let Some((loc, pending)) = d.lookup_segment(id)
        {
            return Some((loc.with_pack_offset(self.base_packs), pending));
        }
        self.lookup_segment(id)
    }

    fn lookup_segment(&self, id: &BlobId) -> Option<(BlobLocation, bool)> {
        // The filter first: it needs no lock, and new data (most of a first
        // backup) ends there; every cached blob passes it.
        if !self.filter.may_contain(prefix_of(&id.0)) {
            return None;
        }
        if let Some(hit) = self
            .cache
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .map
            .get(id)
        {
            return Some(*hit);
        }
        match self.lookup_disk(id) {
            Ok(r) => r,
            Err(e) => {
                self.fail(format!("reading {}: {e}", self.dir_path.display()));
                None
            }
        }
    }

    /// Every record (chosen copies only), in disk order. A read error ends the
    /// iteration and is counted as a failure.
    pub fn iter(&self) -> Box<dyn Iterator<Item = (BlobId, BlobLocation, bool)> + '_> {
        let base = self.iter_segment();
        match &self.delta {
            None => Box::new(base),
            Some(d) => {
                let offset = self.base_packs;
                Box::new(
                    base.chain(
                        d.iter_segment()
                            .map(move |(id, l, p)| (id, l.with_pack_offset(offset), p)),
                    ),
                )
            }
        }
    }

    fn iter_segment(&self) -> impl Iterator<Item = (BlobId, BlobLocation, bool)> + '_ {
        // Positional reads: several iterations (and lookups) may share the file.
        const BATCH: u64 = 16 * 1024;
        let mut buf: Vec<u8> = Vec::new();
        let mut at = 0usize;
        let mut pos = 0u64;
        let mut skip = self.skipped.iter().peekable();
        std::iter::from_fn(move || {
            loop {
                if pos >= self.n_records {
                    return None;
                }
                if at >= buf.len() {
                    let n = BATCH.min(self.n_records - pos) as usize;
                    buf.resize(n * RECORD_LEN, 0);
                    if let Err(e) = self
                        .records
                        .read_exact_at(&mut buf, pos * RECORD_LEN as u64)
                    {
                        self.fail(e);
                        return None;
                    }
                    at = 0;
                }
                let mut r = [0u8; RECORD_LEN];
                r.copy_from_slice(&buf[at..at + RECORD_LEN]);
                at += RECORD_LEN;
                let p = pos;
                pos += 1;
                while skip.peek().is_some_and(|s| **s < p) {
                    skip.next();
                }
                if skip.peek() == Some(&&p) {
                    continue;
                }
                let loc = unpack_record(&r);
                if loc.pack_number() >= self.n_packs {
                    self.fail("a record names an unknown pack");
                    return None;
                }
                return Some((record_id(&r), loc, record_pending(&r)));
            }
        })
    }
}

/// Reads every index file and pending record of `repo` into a new build
/// directory under `dir`, names it in `dir/CURRENT`, and removes every other
/// build (older ones, and any a killed builder left). Called under the build lock.
fn build(
    repo: &Repository,
    dir: &Path,
    repo_id: &str,
    files: &[String],
    pending: &[String],
) -> Result<()> {
    let name = new_build_name();
    let tmp = dir.join(&name);
    std::fs::create_dir_all(&tmp).map_err(|e| io_err(&tmp, e))?;
    if let Err(e) = build_into(repo, &tmp, repo_id, files, pending, false) {
        let _ = std::fs::remove_dir_all(&tmp);
        return Err(e);
    }
    publish(dir, &name)
}

/// Names the build `name` in `dir/CURRENT` and removes every other build (older
/// ones, and any a killed builder left). Called under the build lock.
fn publish(dir: &Path, name: &str) -> Result<()> {
    let pointer = dir.join("CURRENT.tmp");
    let name = name.to_string();
    std::fs::write(&pointer, name.as_bytes()).map_err(|e| io_err(&pointer, e))?;
    std::fs::rename(&pointer, dir.join("CURRENT")).map_err(|e| io_err(&pointer, e))?;
    if let Ok(rd) = std::fs::read_dir(dir) {
        for e in rd.flatten() {
            let n = e.file_name();
            let n = n.to_string_lossy();
            if n != name && (n.starts_with("b-") || n.starts_with("build-") || n == "current") {
                let _ = std::fs::remove_dir_all(e.path());
            }
        }
    }
    Ok(())
}

fn new_build_name() -> String {
    let id: [u8; 8] = cairn_format::envelope::random_bytes();
    format!("b-{}", hex::encode(id))
}

/// When the repository only gained index files since the current build (no
/// pending record changed, nothing superseded) and not too many: a new build that
/// shares the current build's base segment (hard links; builds are never
/// modified) and holds every file the base lacks in a delta segment. Returns
/// `Ok(false)` when that does not apply; the caller then builds in full.
fn build_incremental(
    repo: &Repository,
    dir: &Path,
    repo_id: &str,
    files: &[String],
    pending: &[String],
) -> Result<bool> {
    let Ok(current) = std::fs::read_to_string(dir.join("CURRENT")) else {
        return Ok(false);
    };
    let base_dir = dir.join(current.trim());
    let Ok(m) = read_manifest(&base_dir, repo_id) else {
        return Ok(false);
    };
    let known: HashSet<&String> = m.index_files.iter().collect();
    let listed: HashSet<&String> = files.iter().collect();
    let new: Vec<String> = files
        .iter()
        .filter(|f| !known.contains(f))
        .cloned()
        .collect();
    if m.pending != pending || !known.iter().all(|f| listed.contains(f)) || new.is_empty() {
        return Ok(false);
    }
    // The delta is rebuilt whole at each change: keep it under a quarter of the
    // base (an index file holds about 45 bytes per blob), else build in full.
    let new_set: HashSet<&String> = new.iter().collect();
    let new_bytes: u64 = repo
        .backend()
        .list(cairn_backend::names::INDEX)?
        .iter()
        .filter(|o| new_set.contains(&cairn_backend::names::base(&o.name).to_string()))
        .map(|o| o.size)
        .sum();
    if new_bytes / 45 > m.records / 4 {
        return Ok(false);
    }
    let name = new_build_name();
    let tmp = dir.join(&name);
    std::fs::create_dir_all(&tmp).map_err(|e| io_err(&tmp, e))?;
    let result = (|| -> Result<bool> {
        for e in std::fs::read_dir(&base_dir).map_err(|e| io_err(&base_dir, e))? {
            let e = e.map_err(|e| io_err(&base_dir, e))?;
            if e.file_type().map_err(|er| io_err(&e.path(), er))?.is_file() {
                let to = tmp.join(e.file_name());
                std::fs::hard_link(e.path(), &to).map_err(|er| io_err(&to, er))?;
            }
        }
        let delta = tmp.join("delta");
        std::fs::create_dir_all(&delta).map_err(|e| io_err(&delta, e))?;
        build_into(repo, &delta, repo_id, &new, &[], true)
    })();
    match result {
        Ok(true) => {
            publish(dir, &name)?;
            Ok(true)
        }
        other => {
            let _ = std::fs::remove_dir_all(&tmp);
            other
        }
    }
}

struct RecordWriter {
    out: BufWriter<File>,
    n: u64,
    runs: Vec<Run>,
    packs: PackTable,
    path: PathBuf,
}

impl RecordWriter {
    fn add_pack(
        &mut self,
        pack: PackId,
        blobs: &[cairn_format::index::IndexBlob],
        pending: bool,
    ) -> Result<()> {
        let n = self.packs.number(pack);
        let start = self.n;
        let mut count = 0u32;
        for b in blobs.iter().filter(|b| crate::index::fits(b)) {
            let loc = BlobLocation::new(n, b);
            self.out
                .write_all(&pack_record(&b.id, &loc, pending))
                .map_err(|e| io_err(&self.path, e))?;
            self.n += 1;
            count += 1;
        }
        if count > 0 {
            self.runs.push(Run {
                start,
                count,
                pack: n,
            });
        }
        Ok(())
    }
}

/// Builds one segment from `files` and `pending` into `tmp`. With `delta`, the
/// segment is to sit on top of an existing base: it returns `Ok(false)` (nothing
/// usable built) when one of the files supersedes others, as a prune's do — the
/// base then holds entries that are no longer live, and only a full build is right.
fn build_into(
    repo: &Repository,
    tmp: &Path,
    repo_id: &str,
    files: &[String],
    pending: &[String],
    delta: bool,
) -> Result<bool> {
    let ids: Vec<IndexId> = files
        .iter()
        .filter_map(|h| IndexId::from_hex(h).ok())
        .collect();
    // Records go to disk as each file is read, in file order (so pack by pack).
    let records_path = tmp.join("records.bin");
    let writer = || -> Result<RecordWriter> {
        let f = File::create(&records_path).map_err(|e| io_err(&records_path, e))?;
        Ok(RecordWriter {
            out: BufWriter::with_capacity(1 << 20, f),
            n: 0,
            runs: Vec::new(),
            packs: PackTable::default(),
            path: records_path.clone(),
        })
    };
    let mut w = writer()?;
    let mut superseded: HashSet<IndexId> = HashSet::new();
    let mut errors = Vec::new();
    let mut readable: Vec<IndexId> = Vec::new();
    for batch in ids.chunks(READ_BATCH) {
        let got = crate::repo::parallel_map(batch, 4, |id| repo.read_index_file(id));
        for (id, r) in batch.iter().zip(got) {
            match r {
                Ok(f) => {
                    if delta && !f.supersedes.is_empty() {
                        return Ok(false);
                    }
                    superseded.extend(f.supersedes.iter().copied());
                    readable.push(*id);
                    for p in &f.packs {
                        w.add_pack(p.id, &p.blobs, false)?;
                    }
                }
                Err(e @ Error::Damaged { .. }) => errors.push(e.to_string()),
                Err(e) => return Err(e),
            }
        }
    }
    // Which files are superseded is known only once all are read. Superseded
    // files still listed are rare (a prune's replacement beside the files it
    // replaces, until that prune deletes them): then the live ones are read again.
    if readable.iter().any(|id| superseded.contains(id)) {
        drop(w);
        w = writer()?;
        let live_files: Vec<IndexId> = readable
            .into_iter()
            .filter(|id| !superseded.contains(id))
            .collect();
        for batch in live_files.chunks(READ_BATCH) {
            let got: Vec<Result<IndexFile>> =
                crate::repo::parallel_map(batch, 4, |id| repo.read_index_file(id));
            for f in got {
                for p in &f?.packs {
                    w.add_pack(p.id, &p.blobs, false)?;
                }
            }
        }
    }
    // Then the packs of pending-deletion records.
    for h in pending {
        let Ok(id) = PendingId::from_hex(h) else {
            continue;
        };
        match repo.read_pending(&id) {
            Ok(p) => {
                for pack in &p.packs {
                    w.add_pack(pack.id, &pack.blobs, true)?;
                }
            }
            Err(Error::Backend(b)) if b.is_not_found() => {}
            Err(e @ Error::Damaged { .. }) => errors.push(e.to_string()),
            Err(e) => return Err(e),
        }
    }
    let n = w.n;
    let mut out = w
        .out
        .into_inner()
        .map_err(|e| io_err(&records_path, e.into_error()))?;
    out.flush().map_err(|e| io_err(&records_path, e))?;
    drop(out);

    // Keys: bucket by the top byte on disk, then sort each bucket in memory.
    let records = File::open(&records_path).map_err(|e| io_err(&records_path, e))?;
    let mut buckets: Vec<BufWriter<File>> = Vec::with_capacity(256);
    for b in 0..256 {
        let p = tmp.join(format!("bucket-{b:02x}"));
        let f = File::create(&p).map_err(|e| io_err(&p, e))?;
        buckets.push(BufWriter::with_capacity(64 << 10, f));
    }
    let mut reader = BufReader::with_capacity(1 << 20, &records);
    let mut r = [0u8; RECORD_LEN];
    for pos in 0..n {
        reader
            .read_exact(&mut r)
            .map_err(|e| io_err(&records_path, e))?;
        let mut k = [0u8; KEY_LEN];
        k[..8].copy_from_slice(&r[..8]);
        let v = pos | (u64::from(record_pending(&r)) << 39);
        k[8..].copy_from_slice(&v.to_le_bytes()[..5]);
        buckets[r[0] as usize]
            .write_all(&k)
            .map_err(|e| io_err(tmp, e))?;
    }
    for b in buckets {
        b.into_inner()
            .map_err(|e| io_err(tmp, e.into_error()))?
            .flush()
            .map_err(|e| io_err(tmp, e))?;
    }
    let mut dir_bits = 0u32;
    while dir_bits < 40 && (n >> dir_bits) > KEYS_PER_BUCKET {
        dir_bits += 1;
    }
    let mut dir = vec![0u64; (1usize << dir_bits) + 1];
    let mut filter = Filter::with_capacity(n);
    let keys_path = tmp.join("keys.bin");
    let mut keys_out = BufWriter::with_capacity(
        1 << 20,
        File::create(&keys_path).map_err(|e| io_err(&keys_path, e))?,
    );
    let mut skipped: Vec<u64> = Vec::new();
    let (mut unique, mut live) = (0u64, 0u64);
    let mut written = 0u64;
    let bucket_of = |prefix: u64| -> usize {
        if dir_bits == 0 {
            0
        } else {
            (prefix >> (64 - dir_bits)) as usize
        }
    };
    let mut next_dir = 0usize;
    for b in 0..256 {
        let p = tmp.join(format!("bucket-{b:02x}"));
        let data = std::fs::read(&p).map_err(|e| io_err(&p, e))?;
        let _ = std::fs::remove_file(&p);
        let mut keys: Vec<[u8; KEY_LEN]> = data
            .chunks_exact(KEY_LEN)
            .map(|c| {
                let mut k = [0u8; KEY_LEN];
                k.copy_from_slice(c);
                k
            })
            .collect();
        keys.sort_unstable();
        let mut i = 0;
        while i < keys.len() {
            let mut j = i + 1;
            while j < keys.len() && keys[j][..8] == keys[i][..8] {
                j += 1;
            }
            // Keys sharing a prefix: read their records; of equal ids keep one
            // copy, a live one if any.
            let group = &keys[i..j];
            let mut chosen: HashMap<BlobId, (u64, bool)> = HashMap::new();
            if group.len() == 1 {
                unique += 1;
                live += u64::from(!key_pending(&group[0]));
            } else {
                for k in group {
                    let pos = key_pos(k);
                    let rec = read_at(&records, pos, &records_path)?;
                    let id = record_id(&rec);
                    let pending = record_pending(&rec);
                    match chosen.get(&id) {
                        Some(&(other, other_pending)) => {
                            if other_pending && !pending {
                                skipped.push(other);
                                chosen.insert(id, (pos, pending));
                            } else {
                                skipped.push(pos);
                            }
                        }
                        None => {
                            chosen.insert(id, (pos, pending));
                        }
                    }
                }
            }
            for (_, pending) in chosen.values() {
                unique += 1;
                live += u64::from(!pending);
            }
            let prefix = prefix_of(&group[0]);
            filter.insert(prefix);
            let d = bucket_of(prefix);
            while next_dir <= d {
                dir[next_dir] = written;
                next_dir += 1;
            }
            for k in group {
                keys_out.write_all(k).map_err(|e| io_err(&keys_path, e))?;
                written += 1;
            }
            i = j;
        }
    }
    while next_dir < dir.len() {
        dir[next_dir] = written;
        next_dir += 1;
    }
    keys_out
        .into_inner()
        .map_err(|e| io_err(&keys_path, e.into_error()))?
        .flush()
        .map_err(|e| io_err(&keys_path, e))?;
    skipped.sort_unstable();
    let write = |name: &str, data: &[u8]| -> Result<()> {
        let p = tmp.join(name);
        std::fs::write(&p, data).map_err(|e| io_err(&p, e))
    };
    write(
        "dir.bin",
        &dir.iter()
            .flat_map(|d| d.to_le_bytes())
            .collect::<Vec<u8>>(),
    )?;
    write("filter.bin", &filter.to_bytes())?;
    write(
        "packs.bin",
        &w.packs.ids.iter().flat_map(|p| p.0).collect::<Vec<u8>>(),
    )?;
    let mut runs = Vec::with_capacity(w.runs.len() * 16);
    for r in &w.runs {
        runs.extend_from_slice(&r.start.to_le_bytes());
        runs.extend_from_slice(&r.count.to_le_bytes());
        runs.extend_from_slice(&r.pack.to_le_bytes());
    }
    write("runs.bin", &runs)?;
    write(
        "skipped.bin",
        &skipped
            .iter()
            .flat_map(|s| s.to_le_bytes())
            .collect::<Vec<u8>>(),
    )?;
    let m = Manifest {
        version: MANIFEST_VERSION,
        repo_id: repo_id.to_string(),
        index_files: files.to_vec(),
        pending: pending.to_vec(),
        records: n,
        unique,
        live,
        dir_bits,
        errors,
    };
    let body = serde_json::to_vec_pretty(&m).map_err(|e| Error::Invalid(e.to_string()))?;
    // The manifest last: a build without one is never used.
    write("manifest.json", &body)?;
    Ok(true)
}

fn key_value(k: &[u8]) -> u64 {
    let mut p = [0u8; 8];
    p[..5].copy_from_slice(&k[8..13]);
    u64::from_le_bytes(p)
}

fn key_pos(k: &[u8]) -> u64 {
    key_value(k) & POS_MASK
}

fn key_pending(k: &[u8]) -> bool {
    key_value(k) >> 39 != 0
}

fn read_at(f: &File, pos: u64, path: &Path) -> Result<Record> {
    let mut r = [0u8; RECORD_LEN];
    f.read_exact_at(&mut r, pos * RECORD_LEN as u64)
        .map_err(|e| io_err(path, e))?;
    Ok(r)
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
mod tests {
    use super::*;
    use crate::index::MasterIndex;
    use crate::testutil::mem_repo;
    use cairn_format::index::{IndexBlob, IndexPack};
    use cairn_format::pack::{BlobCompression, BlobKind};
    use cairn_format::pending::PendingDeletion;

    struct Gen(u64);
    impl Gen {
        fn id(&mut self) -> BlobId {
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
    fn assert_same(repo: &mut Repository, base: &Path, probes: &[BlobId], dups: &[BlobId]) {
        let (ssd, packs) = SsdIndex::open(repo, base).unwrap();
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

    #[test]
    fn the_filter_has_no_false_negatives_and_few_false_positives() {
        let mut f = Filter::with_capacity(100_000);
        let mut g = Gen(7);
        let ids: Vec<u64> = (0..100_000).map(|_| prefix_of(&g.id().0)).collect();
        for p in &ids {
            f.insert(*p);
        }
        assert!(ids.iter().all(|p| f.may_contain(*p)));
        let fp = (0..100_000)
            .filter(|_| f.may_contain(prefix_of(&g.id().0)))
            .count();
        assert!(fp < 2_500, "{fp} false positives in 100,000");
        let back = Filter::from_bytes(&f.to_bytes()).unwrap();
        assert!(ids.iter().all(|p| back.may_contain(*p)));
    }
}
