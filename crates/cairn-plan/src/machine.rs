//! `cairn bench`: how fast this machine runs each stage of the pipeline, and the
//! backup and restore throughput that implies per block size and compression.
//!
//! Every stage is timed on one core over the same deterministic data (half random,
//! half text-like), in the chunk sizes a backup would use. The expected throughputs
//! are CPU ceilings: each core runs chunk -> hash -> compress -> seal for backup and
//! open -> decompress -> hash for restore, so per core the stage times add up, and
//! the cores work in parallel. Storage speed is not included.

use cairn_core::index::MasterIndex;
use cairn_format::config::ChunkerParams;
use cairn_format::consts::BLOCK_SIZES;
use cairn_format::envelope::Encryption;
use cairn_format::index::IndexBlob;
use cairn_format::key::MasterKey;
use cairn_format::pack::{BlobCompression, BlobKind};
use cairn_format::{BlobId, PackId};
use std::time::Instant;

#[derive(Clone, Debug, serde::Serialize)]
pub struct StageSpeed {
    pub stage: String,
    /// Megabytes (10^6 bytes) of input per second on one core.
    pub mb_per_s: f64,
}

#[derive(Clone, Debug, serde::Serialize)]
pub struct Expected {
    pub block_size: u32,
    pub compression: String,
    /// Compressed size / input size on the test data.
    pub compressed_ratio: f64,
    pub backup_mb_per_s: f64,
    pub restore_mb_per_s: f64,
}

#[derive(Clone, Debug, serde::Serialize)]
pub struct MachineBench {
    pub cores: usize,
    pub encryption: String,
    pub data_bytes: usize,
    pub stages: Vec<StageSpeed>,
    /// Random lookups per second in the RAM placement of the index (1M blobs).
    pub index_lookups_per_s: f64,
    pub expected: Vec<Expected>,
}

/// Test data: `n` bytes, alternately 1 MiB of xorshift noise and 1 MiB of words.
fn test_data(n: usize) -> Vec<u8> {
    let mut out = Vec::with_capacity(n);
    let mut x: u64 = 0x9e37_79b9_7f4a_7c15;
    let words: [&[u8]; 8] = [
        b"backup ",
        b"restore ",
        b"chunk ",
        b"index\n",
        b"pack ",
        b"2026 ",
        b"cairn ",
        b"data ",
    ];
    while out.len() < n {
        let noisy = (out.len() >> 20) % 2 == 0;
        let end = (out.len() + (1 << 20)).min(n);
        while out.len() < end {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            if noisy {
                out.extend_from_slice(&x.to_le_bytes());
            } else {
                out.extend_from_slice(words[(x % 8) as usize]);
            }
        }
    }
    out.truncate(n);
    out
}

fn rate(bytes: usize, start: Instant) -> f64 {
    bytes as f64 / start.elapsed().as_secs_f64().max(1e-9) / 1e6
}

/// Runs the measurements on `data_bytes` of generated data (64 MiB is steady;
/// tests use less).
pub fn measure(data_bytes: usize) -> MachineBench {
    let data = test_data(data_bytes.max(1 << 20));
    let encryption = Encryption::best_for_this_cpu();
    let key = MasterKey::generate(encryption);
    let cores = std::thread::available_parallelism()
        .map(|n| n.get())
        .unwrap_or(1);
    let mut stages = Vec::new();
    let mut stage = |name: String, mb: f64| {
        stages.push(StageSpeed {
            stage: name,
            mb_per_s: mb,
        });
        mb
    };

    let mut chunk_speed = Vec::new();
    for bs in BLOCK_SIZES {
        let p = ChunkerParams::for_block_size(bs);
        let c = cairn_chunker::Chunker::new(
            p.min_size,
            p.avg_size,
            p.max_size,
            p.normalization,
            key.chunker_seed,
        );
        let t = Instant::now();
        let cuts = c.split_all(&data);
        std::hint::black_box(&cuts);
        chunk_speed.push((
            bs,
            stage(format!("chunk {}K", bs / 1024), rate(data.len(), t)),
        ));
    }
    let pieces: Vec<&[u8]> = data.chunks(16 << 10).collect();
    let t = Instant::now();
    for p in &pieces {
        std::hint::black_box(key.blob_id(p));
    }
    let hash = stage("hash (keyed BLAKE3)".into(), rate(data.len(), t));

    let mut comp = Vec::new();
    for (name, level) in [("standard", 1), ("max", 9)] {
        // One context per thread, reused, as the backup pipeline does.
        let (Ok(mut cctx), Ok(mut dctx)) = (
            zstd::bulk::Compressor::new(level),
            zstd::bulk::Decompressor::new(),
        ) else {
            continue;
        };
        let t = Instant::now();
        let mut packed = 0usize;
        let mut outs = Vec::with_capacity(pieces.len());
        for p in &pieces {
            let c = cctx.compress(p).unwrap_or_else(|_| p.to_vec());
            packed += c.len().min(p.len());
            outs.push(c);
        }
        let speed = stage(
            format!("compress {name} (zstd {level})"),
            rate(data.len(), t),
        );
        let t = Instant::now();
        for (c, p) in outs.iter().zip(&pieces) {
            std::hint::black_box(dctx.decompress(c, p.len()).ok());
        }
        let dspeed = stage(format!("decompress {name}"), rate(data.len(), t));
        comp.push((name, speed, dspeed, packed as f64 / data.len() as f64));
    }
    let t = Instant::now();
    let sealed: Vec<Vec<u8>> = pieces.iter().map(|p| key.sealer.seal(p)).collect();
    let seal = stage(format!("seal ({})", encryption.name()), rate(data.len(), t));
    let t = Instant::now();
    for s in &sealed {
        std::hint::black_box(key.sealer.open("bench", s).ok());
    }
    let open = stage(format!("open ({})", encryption.name()), rate(data.len(), t));

    // Index: a million random blobs, then random lookups of present ones.
    let mut index = MasterIndex::new();
    let n = 1_000_000u32;
    let ids: Vec<BlobId> = (0..n)
        .map(|i| {
            let mut id = [0u8; 32];
            id[..4].copy_from_slice(&i.to_le_bytes());
            BlobId(*blake3::hash(&id).as_bytes())
        })
        .collect();
    for (p, part) in ids.chunks(4096).enumerate() {
        let blobs: Vec<IndexBlob> = part
            .iter()
            .map(|id| IndexBlob {
                kind: BlobKind::Data,
                id: *id,
                offset: 0,
                length: 1,
                raw_length: 1,
                compression: BlobCompression::Raw,
            })
            .collect();
        let mut pid = [0u8; 32];
        pid[..8].copy_from_slice(&(p as u64).to_le_bytes());
        index.add_pack(PackId(pid), &blobs);
    }
    index.finish();
    let t = Instant::now();
    let mut found = 0u32;
    let mut x: u64 = 1;
    for _ in 0..n {
        x = x.wrapping_mul(6_364_136_223_846_793_005).wrapping_add(1);
        found += u32::from(index.contains(&ids[(x >> 33) as usize % ids.len()]));
    }
    std::hint::black_box(found);
    let index_lookups_per_s = f64::from(n) / t.elapsed().as_secs_f64().max(1e-9);

    let per_byte = |speeds: &[f64]| speeds.iter().map(|s| 1.0 / s.max(1e-9)).sum::<f64>();
    let mut expected = Vec::new();
    for (bs, chunk) in &chunk_speed {
        for (name, cspeed, dspeed, ratio) in &comp {
            // Compression and sealing see compressed bytes only after the first
            // stage; the restore side reads compressed bytes.
            let backup = cores as f64 / per_byte(&[*chunk, hash, *cspeed, seal / ratio.max(0.01)]);
            let restore = cores as f64 / per_byte(&[open / ratio.max(0.01), *dspeed, hash]);
            expected.push(Expected {
                block_size: *bs,
                compression: (*name).to_string(),
                compressed_ratio: *ratio,
                backup_mb_per_s: backup,
                restore_mb_per_s: restore,
            });
        }
    }
    MachineBench {
        cores,
        encryption: encryption.name().into(),
        data_bytes: data.len(),
        stages,
        index_lookups_per_s,
        expected,
    }
}

#[cfg(test)]
mod tests {
    #[test]
    fn index_bench_measures_both_placements() {
        let dir = tempfile::tempdir().unwrap();
        let r = super::index_bench(5_000, dir.path()).unwrap();
        assert_eq!(r.len(), 2);
        assert!(r.iter().all(|p| p.blobs == 5_000 && p.present_per_s > 0.0));
        assert!(r[0].ram_bytes_per_blob < 48.0 + 1e-9, "{:?}", r[0]);
        assert!(r[1].disk_bytes > 5_000 * 47, "{:?}", r[1]);
    }

    #[test]
    fn measures_every_stage_and_combination() {
        let m = super::measure(2 << 20);
        assert!(
            m.stages
                .iter()
                .all(|s| s.mb_per_s > 0.0 && s.mb_per_s.is_finite())
        );
        assert_eq!(
            m.expected.len(),
            cairn_format::consts::BLOCK_SIZES.len() * 2
        );
        let std16 = m
            .expected
            .iter()
            .find(|e| e.block_size == 16384 && e.compression == "standard")
            .unwrap();
        // Half the test data is text: it must compress, and max more than standard.
        let max16 = m
            .expected
            .iter()
            .find(|e| e.block_size == 16384 && e.compression == "max")
            .unwrap();
        assert!(std16.compressed_ratio < 0.9 && max16.compressed_ratio <= std16.compressed_ratio);
        assert!(m.index_lookups_per_s > 0.0);
    }
}

/// One placement's figures in [`index_bench`].
#[derive(Clone, Debug, serde::Serialize)]
pub struct PlacementBench {
    pub placement: String,
    pub blobs: u64,
    pub build_seconds: f64,
    /// RAM the index structure holds, per blob.
    pub ram_bytes_per_blob: f64,
    pub disk_bytes: u64,
    /// Random lookups of present ids, one thread.
    pub present_per_s: f64,
    /// Random lookups of absent ids, one thread.
    pub absent_per_s: f64,
    /// Present ids looked up pack by pack (a re-backup's pattern), one thread.
    pub present_in_order_per_s: f64,
    /// SSD placement: the open after one more index file of 200,000 blobs.
    pub update_seconds: Option<f64>,
}

/// `cairn bench`: the machine's stage speeds and both index placements.
#[derive(Clone, Debug, serde::Serialize)]
pub struct BenchReport {
    #[serde(flatten)]
    pub machine: MachineBench,
    pub index_placements: Vec<PlacementBench>,
}

/// The id of synthetic blob `i`.
fn synthetic_id(i: u64) -> BlobId {
    BlobId(*blake3::hash(&i.to_le_bytes()).as_bytes())
}

const SYNTHETIC_PACK_BLOBS: u64 = 1024;

fn synthetic_pack(p: u64, n: u64) -> (PackId, Vec<IndexBlob>) {
    let blobs = (p * SYNTHETIC_PACK_BLOBS..((p + 1) * SYNTHETIC_PACK_BLOBS).min(n))
        .map(|i| IndexBlob {
            kind: BlobKind::Data,
            id: synthetic_id(i),
            offset: ((i % SYNTHETIC_PACK_BLOBS) * 16_000) as u32,
            length: 16_000,
            raw_length: 16_384,
            compression: BlobCompression::Zstd,
        })
        .collect();
    let mut pid = [0u8; 32];
    pid[..8].copy_from_slice(&p.to_le_bytes());
    (PackId(pid), blobs)
}

/// Adds `n` synthetic entries to `repo`'s index, in index files of about
/// `per_file` entries each (a backup writes up to 200,000), naming packs that do
/// not exist: a repository whose index is as
/// large as a big one's, for measuring what grows with the index (a mount's
/// memory, a session's open) without storing the data. Such a repository is
/// damaged on purpose (`check` reports the missing packs); it is for benchmarks
/// only (`bench/mount.sh --index-entries`). The ids are [`index_bench`]'s.
pub fn add_synthetic_index(
    repo: &cairn_core::Repository,
    n: u64,
    per_file: u64,
) -> cairn_core::Result<()> {
    let packs = n.div_ceil(SYNTHETIC_PACK_BLOBS);
    let per_file = per_file.div_ceil(SYNTHETIC_PACK_BLOBS).max(1);
    let mut p = 0;
    while p < packs {
        let file = cairn_format::index::IndexFile {
            packs: (p..(p + per_file).min(packs))
                .map(|q| {
                    let (id, blobs) = synthetic_pack(q, n);
                    cairn_format::index::IndexPack { id, blobs }
                })
                .collect(),
            ..Default::default()
        };
        repo.write_index_file(&file)?;
        p += per_file;
    }
    Ok(())
}

fn lookups(index: &MasterIndex, n: u64, count: u64) -> cairn_core::Result<(f64, f64, f64)> {
    let wrong = |what: &str| cairn_core::Error::Invalid(format!("index bench: {what}"));
    let mut x: u64 = 0x2545_f491_4f6c_dd1d;
    let mut next = || {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        x
    };
    let present: Vec<BlobId> = (0..count).map(|_| synthetic_id(next() % n)).collect();
    let absent: Vec<BlobId> = (0..count).map(|_| synthetic_id(n + next() % n)).collect();
    let t = Instant::now();
    let found = present.iter().filter(|id| index.is_live(id)).count();
    let present_rate = count as f64 / t.elapsed().as_secs_f64().max(1e-9);
    if found as u64 != count {
        return Err(wrong("a present blob was not found"));
    }
    let t = Instant::now();
    let found = absent.iter().filter(|id| index.contains(id)).count();
    let absent_rate = count as f64 / t.elapsed().as_secs_f64().max(1e-9);
    if found != 0 {
        return Err(wrong("an absent blob was found"));
    }
    // Pack by pack from random packs: a first lookup per pack, then its neighbours.
    let packs = n.div_ceil(SYNTHETIC_PACK_BLOBS);
    let per_pack = SYNTHETIC_PACK_BLOBS.min(n);
    let in_order: Vec<BlobId> = (0..count.div_ceil(per_pack))
        .flat_map(|_| {
            let p = next() % packs;
            (p * SYNTHETIC_PACK_BLOBS..((p + 1) * SYNTHETIC_PACK_BLOBS).min(n)).map(synthetic_id)
        })
        .collect();
    let t = Instant::now();
    let found = in_order.iter().filter(|id| index.is_live(id)).count();
    let order_rate = in_order.len() as f64 / t.elapsed().as_secs_f64().max(1e-9);
    if found != in_order.len() {
        return Err(wrong("a present blob was not found"));
    }
    Ok((present_rate, absent_rate, order_rate))
}

/// Builds an index of `n` synthetic blobs in each placement and measures it: the
/// RAM placement in memory, the SSD placement from index files written to a
/// repository under `dir` (which this removes at the end).
pub fn index_bench(n: u64, dir: &std::path::Path) -> cairn_core::Result<Vec<PlacementBench>> {
    let mut out = vec![index_bench_ram(n)?];
    out.push(index_bench_ssd(n, dir)?);
    Ok(out)
}

/// [`index_bench`] for the RAM placement alone.
pub fn index_bench_ram(n: u64) -> cairn_core::Result<PlacementBench> {
    let packs = n.div_ceil(SYNTHETIC_PACK_BLOBS);
    let count = n.clamp(1, 1_000_000);
    let t = Instant::now();
    let mut ram = MasterIndex::new();
    ram.reserve(n as usize)?;
    for p in 0..packs {
        let (id, blobs) = synthetic_pack(p, n);
        ram.add_pack(id, &blobs);
    }
    ram.finish();
    let build = t.elapsed().as_secs_f64();
    let (present, absent, in_order) = lookups(&ram, n, count)?;
    Ok(PlacementBench {
        placement: "ram".into(),
        blobs: ram.len() as u64,
        build_seconds: build,
        ram_bytes_per_blob: ram.ram_bytes() as f64 / n.max(1) as f64,
        disk_bytes: 0,
        present_per_s: present,
        absent_per_s: absent,
        present_in_order_per_s: in_order,
        update_seconds: None,
    })
}

/// [`index_bench`] for the SSD placement alone (in its own process, its peak RSS
/// is the placement's).
pub fn index_bench_ssd(n: u64, dir: &std::path::Path) -> cairn_core::Result<PlacementBench> {
    let packs = n.div_ceil(SYNTHETIC_PACK_BLOBS);
    let count = n.clamp(1, 1_000_000);
    let repo_dir = dir.join("repo");
    let ssd_dir = dir.join("ssd");
    std::fs::create_dir_all(&repo_dir).map_err(|e| cairn_core::Error::io(&repo_dir, e))?;
    let backend = std::sync::Arc::new(cairn_backend::LocalBackend::new(&repo_dir));
    let opts = cairn_core::InitOptions {
        encryption: false,
        ..Default::default()
    };
    let repo = cairn_core::Repository::init(backend, None, &opts)?;
    add_synthetic_index(&repo, n, 1_000_000)?;
    let t = Instant::now();
    let (ssd, pack_ids) = cairn_core::index::ssd::SsdIndex::open(&repo, &ssd_dir)?;
    let build = t.elapsed().as_secs_f64();
    let disk = cairn_core::index::ssd::disk_bytes(ssd.path());
    let index = MasterIndex::from_ssd(ssd, pack_ids);
    let (present, absent, in_order) = lookups(&index, n, count)?;
    let r = PlacementBench {
        placement: "ssd".into(),
        blobs: index.len() as u64,
        build_seconds: build,
        ram_bytes_per_blob: index.ram_bytes() as f64 / n.max(1) as f64,
        disk_bytes: disk,
        present_per_s: present,
        absent_per_s: absent,
        present_in_order_per_s: in_order,
        update_seconds: None,
    };
    drop(index);
    // What a backup adds: one index file of 200,000 new blobs (its flush size),
    // then the open that brings the SSD index up to date.
    let extra = 200_000u64;
    let first = packs;
    let last = packs + extra.div_ceil(SYNTHETIC_PACK_BLOBS);
    let file = cairn_format::index::IndexFile {
        packs: (first..last)
            .map(|q| {
                let (id, blobs) = synthetic_pack(q, n + extra);
                cairn_format::index::IndexPack { id, blobs }
            })
            .collect(),
        ..Default::default()
    };
    repo.write_index_file(&file)?;
    let t = Instant::now();
    let (ssd, _) = cairn_core::index::ssd::SsdIndex::open(&repo, &ssd_dir)?;
    let update = t.elapsed().as_secs_f64();
    drop(ssd);
    let r = PlacementBench {
        update_seconds: Some(update),
        ..r
    };
    let _ = std::fs::remove_dir_all(&repo_dir);
    let _ = std::fs::remove_dir_all(&ssd_dir);
    Ok(r)
}
