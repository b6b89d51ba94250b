//! `cairn bench`: how fast this machine runs each stage of the pipeline, and the
//! backup and restore throughput that implies per block size and compression.
//!
//! Every stage is timed on one core over the same deterministic data (half random,
//! half text-like), in the chunk sizes a backup would use. The expected throughputs
//! are CPU ceilings: each core runs chunk -> hash -> compress -> seal for backup and
//! open -> decompress -> hash for restore, so per core the stage times add up, and
//! the cores work in parallel. Storage speed is not included.

use crate::index::MasterIndex;
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
