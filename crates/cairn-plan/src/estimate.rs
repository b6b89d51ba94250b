//! `cairn estimate`: what a datastore of each block size would make of some data,
//! before any datastore exists.
//!
//! The data is read once. Every piece of it goes through one chunker per block size
//! (the same FastCDC parameters a datastore of that size uses), each chunk is hashed,
//! and for each block size the engine counts the bytes and chunks it has seen and
//! those it has seen for the first time. Unique chunks are compressed with the
//! datastore's own rule (zstd at the standard and at the maximum level, kept only
//! when that saves at least 1/32, as `cairn_core::repo::blob::BlobEncoder` does).
//!
//! Two samples keep this fast and small on large data, both chosen by the chunk's
//! hash, so that a chunk is in or out of the sample wherever it occurs and
//! duplicates are counted consistently:
//! - the dedup sample: only chunks whose hash falls below a threshold are
//!   remembered, so that the sets of hashes fit the `memory` given (on data up to
//!   tens of GB every chunk is remembered and the count is exact);
//! - the compression samples: a smaller share of the unique chunks is compressed
//!   (the maximum level is ten times slower than the standard one).
//!
//! Ratios from a sample are ratios of byte sums over the sampled chunks, which is
//! an unbiased estimate because selection depends on content only, not on size.
//!
//! The chunker seed differs from any datastore's (a datastore's is derived from its
//! key), so chunk boundaries differ; the distribution of chunk sizes and the
//! duplicates found do not, which the accuracy test in `tests/it/estimate.rs`
//! checks against real datastores.

use cairn_chunker::multi::MultiChunker;
use cairn_core::ops::backup::source::{Excludes, open_long};
use cairn_core::ops::stats::RAM_BYTES_PER_BLOB;
use cairn_core::progress::Progress;
use cairn_core::{Error, Result};
use cairn_format::config::{ChunkerParams, Compression};
use cairn_format::consts::{BLOCK_SIZES, ENVELOPE_OVERHEAD, ID_LEN, PACK_HEADER_ENTRY_LEN};
use std::collections::HashSet;
use std::io::{Read, Seek, SeekFrom};
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::MetadataExt;
use std::path::PathBuf;
use std::sync::Mutex;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Instant;

/// Bytes of an index file per blob: kind, id, offset, length, raw length and
/// compression (varints at their usual sizes).
pub const INDEX_BYTES_PER_BLOB: f64 = 1.0 + ID_LEN as f64 + 3.0 + 3.0 + 3.0 + 1.0;

/// RAM and local disk per unique chunk of the SSD placement (see `cairn_core::index::ssd`).
pub const SSD_RAM_BYTES_PER_BLOB: f64 = cairn_core::index::ssd::RAM_BYTES_PER_BLOB;
pub const SSD_DISK_BYTES_PER_BLOB: f64 = cairn_core::index::ssd::DISK_BYTES_PER_BLOB;

/// Bytes of trees and chunk lists per chunk reference (an id and a length) and per
/// file (name, mode, owners, times, sizes, and the tree's framing), as measured on
/// the benchmark datasets after compression.
const METADATA_BYTES_PER_CHUNK: f64 = ID_LEN as f64 + 1.0;
const METADATA_BYTES_PER_FILE: f64 = 90.0;

/// Large files are cut into ranges of this size so that one big image keeps every
/// core busy. Each range starts a new chunk, which costs one extra boundary per
/// range and block size (at 64 KiB blocks, one chunk in a thousand).
const RANGE_BYTES: u64 = 64 << 20;

/// Memory per remembered hash in a hash set of 16-byte keys, between its growth
/// steps.
const SET_BYTES_PER_HASH: f64 = 36.0;

/// Compression is what makes a backup CPU-bound, and the estimate would compress at
/// two levels for every block size; so it compresses a sample of the unique chunks
/// of a fixed *size*, chosen by hash: the error of a ratio from a random sample
/// depends on how many chunks it holds, not on the share of the data (12,000
/// chunks of very mixed data put the standard ratio within about half a point).
/// The maximum level costs about ten times the standard one per byte, so its
/// sample is smaller and estimates only the ratio of maximum to standard size on
/// the same chunks, which varies far less than either (a ratio estimator).
const SAMPLE_STANDARD_CHUNKS: usize = 12_000;
const SAMPLE_MAX_CHUNKS: usize = 600;

#[derive(Clone, Debug)]
pub struct EstimateOptions {
    /// Average block sizes to evaluate (each one of [`BLOCK_SIZES`]).
    pub block_sizes: Vec<u32>,
    /// Protected data to project the index and datastore size to; the data read
    /// when `None`.
    pub scale: Option<u64>,
    /// RAM of the machine that will run the datastore.
    pub ram: u64,
    /// RAM this estimate may use to remember chunk hashes.
    pub memory: u64,
    pub excludes: Vec<String>,
    pub one_file_system: bool,
    pub threads: usize,
}

#[derive(Clone, Debug, Default, serde::Serialize)]
pub struct Projection {
    /// Protected (stored) data projected to.
    pub stored_bytes: u64,
    pub unique_chunks: u64,
    /// Index files in storage.
    pub index_bytes: u64,
    /// RAM for the index in the RAM placement.
    pub ram_placement_ram_bytes: u64,
    /// RAM and local disk for the index in the SSD placement.
    pub ssd_placement_ram_bytes: u64,
    pub ssd_placement_disk_bytes: u64,
    /// Space the datastore occupies, with standard and with maximum compression.
    pub datastore_standard_bytes: u64,
    pub datastore_max_bytes: u64,
}

#[derive(Clone, Debug, Default, serde::Serialize)]
pub struct BlockEstimate {
    pub block_size: u32,
    /// Chunks the data was cut into (all occurrences).
    pub chunks: u64,
    pub unique_chunks: u64,
    pub unique_bytes: u64,
    pub average_chunk_bytes: u64,
    pub dedup_percent: f64,
    pub compression_standard_percent: f64,
    pub compression_max_percent: f64,
    pub reduction_standard_percent: f64,
    pub reduction_max_percent: f64,
    /// Shares of the unique chunks compressed at each level to measure compression.
    pub standard_sample_share: f64,
    pub max_sample_share: f64,
    /// For the data read.
    pub sample: Projection,
    /// At `scale`.
    pub scaled: Projection,
}

#[derive(Clone, Debug, Default, serde::Serialize)]
pub struct Recommendation {
    pub block_size: u32,
    /// "ram" or "ssd".
    pub placement: String,
    /// Why, as data: the CLI words each reason.
    pub reasons: Vec<Reason>,
}

/// One reason for (or against) a choice. Sizes in bytes, reductions in percent
/// (points for differences).
#[derive(Clone, Debug, PartialEq, serde::Serialize)]
#[serde(tag = "kind", rename_all = "snake_case")]
pub enum Reason {
    /// Even the largest block size needs more RAM than half the machine has.
    NothingFits {
        block_size: u32,
        scale_bytes: u64,
        ssd_ram_bytes: u64,
        ram_bytes: u64,
    },
    /// The chosen placement's index fits in half the machine's RAM.
    IndexFits {
        scale_bytes: u64,
        ram_needed_bytes: u64,
        placement: String,
        ram_bytes: u64,
        /// With the SSD placement: what the RAM placement would need, and what the
        /// SSD placement keeps on local disk.
        ram_placement_bytes: Option<u64>,
        ssd_disk_bytes: Option<u64>,
    },
    /// What the chosen block size makes of the data.
    Reduction {
        reduction_percent: f64,
        dedup_percent: f64,
        compression_percent: f64,
        datastore_bytes: u64,
    },
    /// A smaller block size would reduce more, at a cost.
    SmallerReducesMore {
        block_size: u32,
        more_points: f64,
        /// Its index would not fit: the RAM it would need.
        ram_needed_bytes: Option<u64>,
        /// Else what it costs over the chosen one.
        extra_ram_bytes: u64,
        extra_index_bytes: u64,
    },
    /// A larger block size would reduce less, and save RAM.
    LargerReducesLess {
        block_size: u32,
        fewer_points: f64,
        larger_datastore_bytes: u64,
        saved_ram_bytes: u64,
    },
}

#[derive(Clone, Debug, Default, serde::Serialize)]
pub struct Estimate {
    pub files: u64,
    pub bytes: u64,
    /// Entries that could not be read (left out, as a backup would).
    pub skipped: u64,
    pub seconds: f64,
    pub mb_per_s: f64,
    pub scale_bytes: u64,
    pub ram_bytes: u64,
    /// Share of chunks whose hashes were remembered for deduplication (1 = all).
    pub dedup_share: f64,
    pub block_sizes: Vec<BlockEstimate>,
    pub recommendation: Recommendation,
}

struct FileEntry {
    path: PathBuf,
    size: u64,
}

struct Unit {
    file: usize,
    offset: u64,
    /// `None`: to the end of the file, however long it is by then.
    len: Option<u64>,
}

/// Sums for one block size; each worker keeps its own and they are added at the end.
#[derive(Clone, Default)]
struct Counts {
    chunks: u64,
    sampled_bytes: u64,
    unique_bytes: u64,
    unique_chunks: u64,
}

impl Counts {
    fn add(&mut self, o: &Counts) {
        self.chunks += o.chunks;
        self.sampled_bytes += o.sampled_bytes;
        self.unique_bytes += o.unique_bytes;
        self.unique_chunks += o.unique_chunks;
    }
}

const SHARDS: usize = 64;

/// Hashes a 128-bit content hash by taking its low half: it is already uniform.
#[derive(Default, Clone, Copy)]
struct LowHalf(u64);

impl std::hash::Hasher for LowHalf {
    fn finish(&self) -> u64 {
        self.0
    }
    fn write(&mut self, bytes: &[u8]) {
        for b in bytes {
            self.0 = self.0.rotate_left(8) ^ u64::from(*b);
        }
    }
    fn write_u128(&mut self, v: u128) {
        self.0 = v as u64;
    }
}

type HashSet128 = HashSet<u128, std::hash::BuildHasherDefault<LowHalf>>;

/// The remembered hashes of one block size, in shards so that workers rarely meet.
struct Seen {
    shards: Vec<Mutex<HashSet128>>,
}

impl Seen {
    fn new(expected: u64) -> Self {
        let per = (expected / SHARDS as u64).min(1 << 26) as usize;
        Seen {
            shards: (0..SHARDS)
                .map(|_| {
                    Mutex::new(HashSet128::with_capacity_and_hasher(
                        per,
                        Default::default(),
                    ))
                })
                .collect(),
        }
    }
    /// True when `h` was not seen before.
    fn insert(&self, h: u128) -> bool {
        // Shard by the low bits of the high half: uniform even when only hashes
        // whose high half is below a threshold are kept, and independent of the
        // low half the table hashes by.
        let shard = &self.shards[((h >> 64) as usize) % SHARDS];
        match shard.lock() {
            Ok(mut s) => s.insert(h),
            Err(p) => p.into_inner().insert(h),
        }
    }
}

/// Compressed size under the datastore's rule: zstd at `level`, kept when it saves
/// at least 1/32, never for pieces under 64 bytes.
fn stored_size(c: &mut zstd::bulk::Compressor<'static>, scratch: &mut Vec<u8>, data: &[u8]) -> u64 {
    if data.len() < 64 {
        return data.len() as u64;
    }
    scratch.clear();
    scratch.reserve(zstd::zstd_safe::compress_bound(data.len()));
    match c.compress_to_buffer(data, scratch) {
        Ok(n) if n + n / 32 < data.len() => n as u64,
        _ => data.len() as u64,
    }
}

struct Worker {
    buf: Vec<u8>,
    scratch: Vec<u8>,
    standard: zstd::bulk::Compressor<'static>,
    max: zstd::bulk::Compressor<'static>,
    counts: Vec<Counts>,
    /// Chunk lengths of the current unit, per block size.
    cuts: Vec<Vec<u32>>,
}

/// A compressed chunk of the sample: its sample value, plaintext size, stored size
/// at the standard level and, when it is also in the smaller sample, at the
/// maximum level.
#[derive(Clone, Copy)]
struct Record {
    sample: u64,
    raw: u32,
    standard: u32,
    max: Option<u32>,
}

/// The compression sample of one block size. It starts from a threshold on the
/// sample value guessed from the data size, and whenever it holds twice its target
/// it lowers the threshold to keep the target and drops the records above it. The
/// threshold only goes down, so every unique chunk below the final threshold was
/// compressed when it was seen: the result is the sample that threshold would have
/// taken from the start.
struct CompressionSample {
    standard_threshold: AtomicU64,
    max_threshold: AtomicU64,
    records: Mutex<Records>,
}

#[derive(Default)]
struct Records {
    all: Vec<Record>,
    /// How many of them have a size at the maximum level.
    with_max: usize,
}

impl CompressionSample {
    /// `expected_unique_chunks` among those the dedup sample keeps, which is
    /// `dedup_share` of all chunks (thresholds compare against the whole hash range).
    fn new(expected_unique_chunks: f64, dedup_share: f64) -> Self {
        // 1.5 times the target expected at first: little is compressed in vain when
        // the threshold goes down, and duplicates seldom leave it short.
        let guess = |target: usize| {
            threshold(dedup_share * 1.5 * target as f64 / expected_unique_chunks.max(1.0))
        };
        CompressionSample {
            standard_threshold: AtomicU64::new(guess(SAMPLE_STANDARD_CHUNKS)),
            max_threshold: AtomicU64::new(guess(SAMPLE_MAX_CHUNKS)),
            records: Mutex::new(Records::default()),
        }
    }

    fn add(&self, r: Record) {
        let mut records = match self.records.lock() {
            Ok(g) => g,
            Err(p) => p.into_inner(),
        };
        // The thresholds may have gone down while this chunk was compressed.
        if r.sample > self.standard_threshold.load(Ordering::Relaxed) {
            return;
        }
        let mut r = r;
        if r.sample > self.max_threshold.load(Ordering::Relaxed) {
            r.max = None;
        }
        records.with_max += usize::from(r.max.is_some());
        records.all.push(r);
        if records.all.len() >= 2 * SAMPLE_STANDARD_CHUNKS {
            let mut v: Vec<u64> = records.all.iter().map(|r| r.sample).collect();
            let (_, &mut t, _) = v.select_nth_unstable(SAMPLE_STANDARD_CHUNKS);
            self.standard_threshold.store(t, Ordering::Relaxed);
            self.max_threshold.fetch_min(t, Ordering::Relaxed);
            records.all.retain(|r| r.sample <= t);
            records.with_max = records.all.iter().filter(|r| r.max.is_some()).count();
        }
        if records.with_max >= 2 * SAMPLE_MAX_CHUNKS {
            let mut v: Vec<u64> = records
                .all
                .iter()
                .filter(|r| r.max.is_some())
                .map(|r| r.sample)
                .collect();
            let (_, &mut t, _) = v.select_nth_unstable(SAMPLE_MAX_CHUNKS);
            self.max_threshold.store(t, Ordering::Relaxed);
            for r in records.all.iter_mut() {
                if r.sample > t {
                    r.max = None;
                }
            }
            records.with_max = records.all.iter().filter(|r| r.max.is_some()).count();
        }
    }

    /// Stored/plaintext at the standard and at the maximum level, and the shares
    /// of unique (dedup-sampled) chunks the two samples took.
    fn ratios(&self, dedup_threshold: u64) -> (f64, f64, f64, f64) {
        let records = match self.records.lock() {
            Ok(g) => g,
            Err(p) => p.into_inner(),
        };
        let (mut raw, mut std) = (0u64, 0u64);
        let (mut std_of_max, mut max) = (0u64, 0u64);
        for r in records.all.iter() {
            raw += u64::from(r.raw);
            std += u64::from(r.standard);
            if let Some(m) = r.max {
                std_of_max += u64::from(r.standard);
                max += u64::from(m);
            }
        }
        let standard = if raw == 0 {
            1.0
        } else {
            std as f64 / raw as f64
        };
        let to_max = if std_of_max == 0 {
            1.0
        } else {
            max as f64 / std_of_max as f64
        };
        let share =
            |t: &AtomicU64| (t.load(Ordering::Relaxed) as f64 / dedup_threshold as f64).min(1.0);
        (
            standard,
            (standard * to_max).min(1.0),
            share(&self.standard_threshold),
            share(&self.max_threshold),
        )
    }
}

fn threshold(share: f64) -> u64 {
    if share >= 1.0 {
        u64::MAX
    } else {
        (share * u64::MAX as f64) as u64
    }
}

/// Reads a unit into `buf`.
fn read_unit(files: &[FileEntry], u: &Unit, buf: &mut Vec<u8>) -> std::io::Result<()> {
    let mut f = std::fs::File::from(open_long(&files[u.file].path, false)?);
    if u.offset > 0 {
        f.seek(SeekFrom::Start(u.offset))?;
    }
    buf.clear();
    match u.len {
        Some(n) => {
            buf.reserve(n as usize);
            (&mut f).take(n).read_to_end(buf)?;
        }
        None => {
            f.read_to_end(buf)?;
        }
    }
    Ok(())
}

/// Walks `roots`, returning every regular file with its size. Unreadable entries
/// are reported and counted, as a backup would skip them. Directories are listed
/// and their entries looked at through descriptors, so a path too long for one
/// system call (which a backup stores) is estimated too.
/// The roots as absolute paths, those inside another (or given twice) left out:
/// a backup of `/home /home/alice` reads alice's files once, and so must the
/// estimate of it (QA: it counted them twice, overstating dedup).
fn outermost(roots: &[PathBuf]) -> Result<Vec<PathBuf>> {
    let mut all = Vec::with_capacity(roots.len());
    for root in roots {
        all.push(
            std::path::absolute(root)
                .map_err(|e| Error::Invalid(format!("{}: {e}", root.display())))?,
        );
    }
    let lexical = |p: &PathBuf| -> PathBuf { p.components().collect() };
    let clean: Vec<PathBuf> = all.iter().map(lexical).collect();
    let mut out: Vec<PathBuf> = Vec::new();
    for (i, p) in clean.iter().enumerate() {
        let inside = clean
            .iter()
            .enumerate()
            .any(|(j, q)| j != i && p.starts_with(q) && (p != q || j < i));
        if !inside {
            out.push(all[i].clone());
        }
    }
    Ok(out)
}

fn walk(
    roots: &[PathBuf],
    excludes: &Excludes,
    one_file_system: bool,
    progress: &Progress,
    skipped: &AtomicU64,
) -> Result<Vec<FileEntry>> {
    /// What the walk needs of an entry's `lstat`.
    struct Seen {
        mode: u32,
        size: u64,
        dev: u64,
    }
    let mut files = Vec::new();
    for root in outermost(roots)? {
        let meta = std::fs::symlink_metadata(&root)
            .map_err(|e| Error::Invalid(format!("cannot read {}: {e}", root.display())))?;
        let root_dev = meta.dev();
        let first = Seen {
            mode: meta.mode(),
            size: meta.len(),
            dev: meta.dev(),
        };
        let mut stack = vec![(root, first)];
        while let Some((path, seen)) = stack.pop() {
            if excludes.is_excluded(&path) {
                continue;
            }
            let kind = seen.mode & libc::S_IFMT;
            if kind == libc::S_IFREG {
                files.push(FileEntry {
                    path,
                    size: seen.size,
                });
                continue;
            }
            if kind != libc::S_IFDIR || (one_file_system && seen.dev != root_dev) {
                continue;
            }
            let listed = open_long(&path, true).and_then(|fd| {
                let mut names = Vec::new();
                let mut d =
                    nix::dir::Dir::from_fd(fd.try_clone()?).map_err(std::io::Error::from)?;
                for e in d.iter() {
                    let e = e.map_err(std::io::Error::from)?;
                    let n = e.file_name().to_bytes();
                    if n != b"." && n != b".." {
                        names.push(n.to_vec());
                    }
                }
                Ok((fd, names))
            });
            let (fd, names) = match listed {
                Ok(l) => l,
                Err(e) => {
                    progress.warning(&path, &e.to_string());
                    skipped.fetch_add(1, Ordering::Relaxed);
                    continue;
                }
            };
            let mut children = Vec::new();
            for name in names {
                let name = std::ffi::OsStr::from_bytes(&name);
                let p = path.join(name);
                match nix::sys::stat::fstatat(&fd, name, nix::fcntl::AtFlags::AT_SYMLINK_NOFOLLOW) {
                    Ok(st) => children.push((
                        p,
                        Seen {
                            mode: st.st_mode,
                            size: st.st_size as u64,
                            dev: st.st_dev,
                        },
                    )),
                    Err(e) => {
                        progress.warning(&p, &std::io::Error::from(e).to_string());
                        skipped.fetch_add(1, Ordering::Relaxed);
                    }
                }
            }
            // Popped in name order, so files are read in the order a backup reads them.
            children.sort_by(|a, b| b.0.cmp(&a.0));
            stack.extend(children);
        }
    }
    Ok(files)
}

fn parse_units(files: &[FileEntry]) -> Vec<Unit> {
    let mut units = Vec::new();
    for (i, f) in files.iter().enumerate() {
        let mut offset = 0;
        while f.size - offset > RANGE_BYTES {
            units.push(Unit {
                file: i,
                offset,
                len: Some(RANGE_BYTES),
            });
            offset += RANGE_BYTES;
        }
        units.push(Unit {
            file: i,
            offset,
            len: None,
        });
    }
    units
}

/// Reads everything under `roots` once and estimates each block size.
pub fn estimate(
    roots: &[PathBuf],
    opts: &EstimateOptions,
    progress: &Progress,
) -> Result<Estimate> {
    let started = Instant::now();
    let mut sizes = opts.block_sizes.clone();
    sizes.sort_unstable();
    sizes.dedup();
    if sizes.is_empty() {
        return Err(Error::Invalid("no block sizes to estimate".into()));
    }
    if let Some(b) = sizes.iter().find(|b| !BLOCK_SIZES.contains(b)) {
        return Err(Error::Invalid(format!(
            "block size {b} is not one of 4K, 8K, 16K, 32K, 64K"
        )));
    }
    let excludes = Excludes::patterns(&opts.excludes).map_err(Error::BadArgument)?;
    let skipped = AtomicU64::new(0);
    let files = walk(roots, &excludes, opts.one_file_system, progress, &skipped)?;
    let planned: u64 = files.iter().map(|f| f.size).sum();
    progress.set_total(Some(planned), Some(files.len() as u64));

    // Remember every chunk's hash when that fits in `memory`, else a hash-chosen share.
    // Chunks per block size if nothing repeats: a file is at least one chunk.
    let chunk_counts: Vec<f64> = sizes
        .iter()
        .map(|&b| {
            files
                .iter()
                .map(|f| f.size.div_ceil(u64::from(b)))
                .sum::<u64>() as f64
        })
        .collect();
    let expected_chunks: f64 = chunk_counts.iter().sum();
    let dedup_share = (opts.memory as f64 / SET_BYTES_PER_HASH / expected_chunks.max(1.0)).min(1.0);
    let dedup_threshold = threshold(dedup_share);

    let chunkers = MultiChunker::new(
        &sizes
            .iter()
            .map(|&b| {
                let p = ChunkerParams::for_block_size(b);
                (p.min_size, p.avg_size, p.max_size)
            })
            .collect::<Vec<_>>(),
    );
    let lanes: Vec<Lane> = chunk_counts
        .iter()
        .map(|&n| {
            let expected = n * dedup_share;
            Lane {
                seen: Seen::new(expected as u64),
                sample: CompressionSample::new(expected, dedup_share),
            }
        })
        .collect();
    let units = parse_units(&files);
    let read_bytes = AtomicU64::new(0);
    let standard_level = Compression::Standard.zstd_level().unwrap_or(1);
    let max_level = Compression::Max.zstd_level().unwrap_or(9);
    let threads = opts.threads.max(1);

    let next = AtomicU64::new(0);
    let results: Vec<Result<Vec<Counts>>> = std::thread::scope(|s| {
        let handles: Vec<_> = (0..threads.min(units.len()).max(1))
            .map(|_| {
                s.spawn(|| -> Result<Vec<Counts>> {
                    let zerr = |e: std::io::Error| Error::Invalid(format!("zstd init: {e}"));
                    let mut w = Worker {
                        buf: Vec::new(),
                        scratch: Vec::new(),
                        standard: zstd::bulk::Compressor::new(standard_level).map_err(zerr)?,
                        max: zstd::bulk::Compressor::new(max_level).map_err(zerr)?,
                        counts: vec![Counts::default(); sizes.len()],
                        cuts: vec![Vec::new(); sizes.len()],
                    };
                    loop {
                        let i = next.fetch_add(1, Ordering::Relaxed) as usize;
                        let Some(u) = units.get(i) else { break };
                        if let Err(e) = read_unit(&files, u, &mut w.buf) {
                            progress.warning(&files[u.file].path, &format!("read failed: {e}"));
                            skipped.fetch_add(1, Ordering::Relaxed);
                            continue;
                        }
                        read_bytes.fetch_add(w.buf.len() as u64, Ordering::Relaxed);
                        process(&mut w, &chunkers, &lanes, dedup_threshold);
                        progress.bytes_done(w.buf.len() as u64);
                        if u.offset == 0 {
                            progress.file_done();
                        }
                    }
                    Ok(w.counts)
                })
            })
            .collect();
        handles
            .into_iter()
            .map(|h| h.join().unwrap_or_else(|p| std::panic::resume_unwind(p)))
            .collect()
    });
    let mut totals = vec![Counts::default(); sizes.len()];
    for r in results {
        for (t, c) in totals.iter_mut().zip(r?) {
            t.add(&c);
        }
    }

    let bytes = read_bytes.load(Ordering::Relaxed);
    let seconds = started.elapsed().as_secs_f64();
    let scale = opts.scale.unwrap_or(bytes);
    let file_count = files.len() as u64;
    let block_sizes: Vec<BlockEstimate> = sizes
        .iter()
        .zip(totals.iter().zip(&lanes))
        .map(|(&b, (c, lane))| {
            let r = lane.sample.ratios(dedup_threshold);
            block_estimate(b, c, r, bytes, file_count, dedup_share, scale)
        })
        .collect();
    let recommendation = recommend(&block_sizes, opts.ram, scale);
    Ok(Estimate {
        files: file_count,
        bytes,
        skipped: skipped.load(Ordering::Relaxed),
        seconds,
        mb_per_s: bytes as f64 / seconds.max(1e-9) / 1e6,
        scale_bytes: scale,
        ram_bytes: opts.ram,
        dedup_share,
        block_sizes,
        recommendation,
    })
}

/// What one block size accumulates across workers.
struct Lane {
    seen: Seen,
    sample: CompressionSample,
}

/// Chunks, hashes and samples one unit's data for every block size.
fn process(w: &mut Worker, chunkers: &MultiChunker, lanes: &[Lane], dedup_threshold: u64) {
    let Worker {
        buf,
        scratch,
        standard,
        max,
        counts,
        cuts,
    } = w;
    for c in cuts.iter_mut() {
        c.clear();
    }
    chunkers.cut(buf, cuts);
    for ((lens, lane), c) in cuts.iter().zip(lanes).zip(counts.iter_mut()) {
        let mut rest: &[u8] = buf;
        for &n in lens {
            let n = n as usize;
            let piece = &rest[..n];
            rest = &rest[n..];
            c.chunks += 1;
            // Not the datastore's keyed BLAKE3: any 128-bit hash finds the same
            // duplicates (a collision is as unlikely), and XXH3 is five times faster.
            let key = xxhash_rust::xxh3::xxh3_128(piece);
            let sample = (key >> 64) as u64;
            if sample > dedup_threshold {
                continue;
            }
            c.sampled_bytes += n as u64;
            if !lane.seen.insert(key) {
                continue;
            }
            c.unique_bytes += n as u64;
            c.unique_chunks += 1;
            if sample <= lane.sample.standard_threshold.load(Ordering::Relaxed) {
                let in_max = sample <= lane.sample.max_threshold.load(Ordering::Relaxed);
                lane.sample.add(Record {
                    sample,
                    raw: n as u32,
                    standard: stored_size(standard, scratch, piece) as u32,
                    max: in_max.then(|| stored_size(max, scratch, piece) as u32),
                });
            }
        }
    }
}

fn ratio(part: u64, whole: u64) -> f64 {
    if whole == 0 {
        0.0
    } else {
        part as f64 / whole as f64
    }
}

fn block_estimate(
    block_size: u32,
    c: &Counts,
    (std_share, max_share, standard_sample_share, max_sample_share): (f64, f64, f64, f64),
    bytes: u64,
    files: u64,
    dedup_share: f64,
    scale: u64,
) -> BlockEstimate {
    let unique_share = if c.sampled_bytes == 0 {
        1.0
    } else {
        ratio(c.unique_bytes, c.sampled_bytes)
    };
    let unique_bytes = (bytes as f64 * unique_share).round() as u64;
    let unique_chunks = (c.unique_chunks as f64 / dedup_share).round() as u64;
    let average = unique_bytes.checked_div(unique_chunks).unwrap_or(0);
    // Per data blob: its envelope, its pack header entry; metadata per chunk
    // reference and per file, scaled with the unique data.
    let per_blob = ENVELOPE_OVERHEAD as f64 + PACK_HEADER_ENTRY_LEN as f64 + INDEX_BYTES_PER_BLOB;
    let metadata =
        c.chunks as f64 * METADATA_BYTES_PER_CHUNK + files as f64 * METADATA_BYTES_PER_FILE;
    let project = |stored: u64| -> Projection {
        let k = ratio(stored, bytes.max(1));
        let k = if bytes == 0 { 0.0 } else { k };
        let chunks = unique_chunks as f64 * k;
        let unique = unique_bytes as f64 * k;
        let fixed = chunks * per_blob + metadata * k;
        Projection {
            stored_bytes: stored,
            unique_chunks: chunks.round() as u64,
            index_bytes: (chunks * INDEX_BYTES_PER_BLOB) as u64,
            ram_placement_ram_bytes: (chunks * RAM_BYTES_PER_BLOB) as u64,
            ssd_placement_ram_bytes: (chunks * SSD_RAM_BYTES_PER_BLOB) as u64,
            ssd_placement_disk_bytes: (chunks * SSD_DISK_BYTES_PER_BLOB) as u64,
            datastore_standard_bytes: (unique * std_share + fixed) as u64,
            datastore_max_bytes: (unique * max_share + fixed) as u64,
        }
    };
    let pct = |x: f64| 100.0 * x;
    BlockEstimate {
        block_size,
        chunks: c.chunks,
        unique_chunks,
        unique_bytes,
        average_chunk_bytes: average,
        dedup_percent: pct(1.0 - unique_share),
        compression_standard_percent: pct(1.0 - std_share),
        compression_max_percent: pct(1.0 - max_share),
        reduction_standard_percent: pct(1.0 - unique_share * std_share),
        reduction_max_percent: pct(1.0 - unique_share * max_share),
        standard_sample_share,
        max_sample_share,
        sample: project(bytes),
        scaled: project(scale),
    }
}

/// Block sizes whose overall reduction is this close to the best are as good: the
/// larger one restores faster and needs a smaller index.
const REDUCTION_TOLERANCE_PP: f64 = 1.0;

/// Picks the block size for a machine with `ram`: the index may use half of it
/// (the rest is for the system, the backup pipeline and the page cache). Among the
/// sizes whose index fits in the RAM placement, the largest whose overall
/// reduction is within [`REDUCTION_TOLERANCE_PP`] of the best; when none fits, the
/// same choice in the SSD placement; when nothing fits at all, the largest size.
pub fn recommend(blocks: &[BlockEstimate], ram: u64, scale: u64) -> Recommendation {
    let budget = ram / 2;
    let choose = |ram_of: &dyn Fn(&BlockEstimate) -> u64| -> Option<&BlockEstimate> {
        let fits: Vec<&BlockEstimate> = blocks.iter().filter(|b| ram_of(b) <= budget).collect();
        let best = fits
            .iter()
            .map(|b| b.reduction_standard_percent)
            .fold(f64::NEG_INFINITY, f64::max);
        fits.into_iter()
            .filter(|b| b.reduction_standard_percent >= best - REDUCTION_TOLERANCE_PP)
            .max_by_key(|b| b.block_size)
    };
    let ram_of = |b: &BlockEstimate| b.scaled.ram_placement_ram_bytes;
    let ssd_of = |b: &BlockEstimate| b.scaled.ssd_placement_ram_bytes;
    type RamOf<'a> = &'a dyn Fn(&BlockEstimate) -> u64;
    let (chosen, placement, ram_needed): (&BlockEstimate, &str, RamOf) =
        if let Some(b) = choose(&ram_of) {
            (b, "ram", &ram_of)
        } else if let Some(b) = choose(&ssd_of) {
            (b, "ssd", &ssd_of)
        } else {
            let Some(b) = blocks.iter().max_by_key(|b| b.block_size) else {
                return Recommendation::default();
            };
            return Recommendation {
                block_size: b.block_size,
                placement: "ssd".into(),
                reasons: vec![Reason::NothingFits {
                    block_size: b.block_size,
                    scale_bytes: scale,
                    ssd_ram_bytes: ssd_of(b),
                    ram_bytes: ram,
                }],
            };
        };
    let ssd = placement == "ssd";
    let mut reasons = vec![Reason::IndexFits {
        scale_bytes: scale,
        ram_needed_bytes: ram_needed(chosen),
        placement: placement.to_string(),
        ram_bytes: ram,
        ram_placement_bytes: ssd.then(|| ram_of(chosen)),
        ssd_disk_bytes: ssd.then_some(chosen.scaled.ssd_placement_disk_bytes),
    }];
    reasons.push(Reason::Reduction {
        reduction_percent: chosen.reduction_standard_percent,
        dedup_percent: chosen.dedup_percent,
        compression_percent: chosen.compression_standard_percent,
        datastore_bytes: chosen.scaled.datastore_standard_bytes,
    });
    for b in blocks {
        if b.block_size < chosen.block_size {
            reasons.push(Reason::SmallerReducesMore {
                block_size: b.block_size,
                more_points: b.reduction_standard_percent - chosen.reduction_standard_percent,
                ram_needed_bytes: (ram_needed(b) > budget).then(|| ram_needed(b)),
                extra_ram_bytes: ram_needed(b).saturating_sub(ram_needed(chosen)),
                extra_index_bytes: b
                    .scaled
                    .index_bytes
                    .saturating_sub(chosen.scaled.index_bytes),
            });
        } else if b.block_size > chosen.block_size {
            reasons.push(Reason::LargerReducesLess {
                block_size: b.block_size,
                fewer_points: chosen.reduction_standard_percent - b.reduction_standard_percent,
                larger_datastore_bytes: b
                    .scaled
                    .datastore_standard_bytes
                    .saturating_sub(chosen.scaled.datastore_standard_bytes),
                saved_ram_bytes: ram_needed(chosen).saturating_sub(ram_needed(b)),
            });
        }
    }
    Recommendation {
        block_size: chosen.block_size,
        placement: placement.into(),
        reasons,
    }
}

/// This machine's RAM (from /proc/meminfo), when it can be read.
pub fn machine_ram() -> Option<u64> {
    let s = std::fs::read_to_string("/proc/meminfo").ok()?;
    let line = s.lines().find(|l| l.starts_with("MemTotal:"))?;
    let kib: u64 = line.split_whitespace().nth(1)?.parse().ok()?;
    Some(kib * 1024)
}

#[cfg(test)]
mod tests {
    use super::*;
    use cairn_core::progress::Progress;

    fn opts() -> EstimateOptions {
        EstimateOptions {
            block_sizes: BLOCK_SIZES.to_vec(),
            scale: None,
            ram: 32 << 30,
            memory: 1 << 30,
            excludes: Vec::new(),
            one_file_system: false,
            threads: 2,
        }
    }

    #[test]
    fn roots_inside_others_are_read_once() {
        let p = |s: &str| PathBuf::from(s);
        let got = outermost(&[
            p("/home/alice"),
            p("/home"),
            p("/srv//data/"),
            p("/srv/data"),
            p("/srv/database"),
        ])
        .unwrap();
        assert_eq!(got, [p("/home"), p("/srv//data/"), p("/srv/database")]);
    }

    fn noise(n: usize, mut x: u64) -> Vec<u8> {
        let mut v = Vec::with_capacity(n + 8);
        while v.len() < n {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            v.extend_from_slice(&x.to_le_bytes());
        }
        v.truncate(n);
        v
    }

    #[test]
    fn duplicated_noise_is_half_dedup_and_incompressible() {
        let dir = tempfile::tempdir().unwrap_or_else(|e| panic!("{e}"));
        let data = noise(4 << 20, 7);
        std::fs::write(dir.path().join("a"), &data).unwrap_or_else(|e| panic!("{e}"));
        std::fs::write(dir.path().join("b"), &data).unwrap_or_else(|e| panic!("{e}"));
        let e = estimate(&[dir.path().to_path_buf()], &opts(), &Progress::none())
            .unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(e.bytes, 8 << 20);
        assert_eq!(e.files, 2);
        for b in &e.block_sizes {
            assert!((b.dedup_percent - 50.0).abs() < 0.01, "{b:?}");
            assert!(b.compression_standard_percent.abs() < 0.01, "{b:?}");
            assert_eq!(b.unique_bytes, 4 << 20);
            let avg = b.average_chunk_bytes as f64 / b.block_size as f64;
            assert!((0.7..1.5).contains(&avg), "{b:?}");
        }
    }

    #[test]
    fn a_file_cut_into_ranges_counts_every_byte_once() {
        let dir = tempfile::tempdir().unwrap_or_else(|e| panic!("{e}"));
        let n = RANGE_BYTES as usize * 2 + 12345;
        std::fs::write(dir.path().join("big"), noise(n, 3)).unwrap_or_else(|e| panic!("{e}"));
        let mut o = opts();
        o.block_sizes = vec![65536];
        let e = estimate(&[dir.path().to_path_buf()], &o, &Progress::none())
            .unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(e.bytes, n as u64);
        assert_eq!(e.block_sizes[0].unique_bytes, n as u64);
    }

    #[test]
    fn recommendation_follows_the_ram() {
        let mk = |bs: u32, red: f64, chunks: u64| BlockEstimate {
            block_size: bs,
            reduction_standard_percent: red,
            scaled: Projection {
                ram_placement_ram_bytes: chunks * 61,
                ssd_placement_ram_bytes: chunks * 2,
                ..Default::default()
            },
            ..Default::default()
        };
        let blocks = vec![
            mk(4096, 60.0, 1 << 30),
            mk(8192, 59.5, 1 << 29),
            mk(16384, 55.0, 1 << 28),
            mk(65536, 40.0, 1 << 26),
        ];
        // Plenty of RAM: 8K is within 1 point of 4K and larger.
        let r = recommend(&blocks, 1 << 40, 1 << 40);
        assert_eq!((r.block_size, r.placement.as_str()), (8192, "ram"));
        // 32 GiB: 16 GiB budget fits 16K (16 GiB... 2^28*61 = 15.25 GiB).
        let r = recommend(&blocks, 32 << 30, 1 << 40);
        assert_eq!((r.block_size, r.placement.as_str()), (16384, "ram"));
        // 4 GiB: only 64K fits in RAM placement; nothing else.
        let r = recommend(&blocks, 8 << 30, 1 << 40);
        assert_eq!((r.block_size, r.placement.as_str()), (65536, "ram"));
        // 1 GiB: nothing fits in RAM; in the SSD placement 16K is the best that fits.
        let r = recommend(&blocks, 1 << 30, 1 << 40);
        assert_eq!((r.block_size, r.placement.as_str()), (16384, "ssd"));
        assert!(r.reasons.len() >= 2);
    }
}
