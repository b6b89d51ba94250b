//! A real repository at a scale whose data would not fit on this machine, for the
//! scale table of issue #19 (`bench/scale.sh`): every chunk is 16 bytes, but it is
//! stored, sealed, indexed and reachable from snapshots exactly as a backup stores
//! chunks (packs with encrypted headers, index files, chunk-list blobs, trees,
//! snapshots, each written through the engine's own writers). So prune, check, copy
//! and stats do all of their work on it, at 100 million index entries in about 15
//! GB, where real 16 KiB chunks would need 1.6 TB.
//!
//! Snapshots share no data: forgetting one of `n` leaves 1/n of the blobs unused.

use cairn_core::repo::blob::BlobEncoder;
use cairn_core::repo::packer::{BufferPool, Packer, Uploader};
use cairn_core::tree::chunklist::ChunkListBuilder;
use cairn_core::{Repository, Result};
use cairn_format::pack::BlobKind;
use cairn_format::snapshot::{Snapshot, SnapshotSummary};
use cairn_format::tree::{ChunkList, ChunkRef, Node, NodeKind, Tree};
use cairn_format::{BlobId, SnapshotId};
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

/// Bytes of every synthetic chunk.
pub const CHUNK_BYTES: u64 = 16;

#[derive(Clone, Debug)]
pub struct ScaleOptions {
    /// Data blobs in all (index entries: these plus the chunk lists and trees).
    pub blobs: u64,
    pub snapshots: u64,
    /// Chunks per file: what a chunk list holds (1M chunks is a 16 GB file at 16
    /// KiB per chunk).
    pub chunks_per_file: u64,
    /// Target size of data packs. Small, so that the pack count is near a real
    /// repository's of as many chunks (16 MiB packs of 16 KiB chunks: 1,000 chunks a
    /// pack).
    pub pack_size: usize,
    pub threads: usize,
}

impl Default for ScaleOptions {
    fn default() -> Self {
        ScaleOptions {
            blobs: 1_000_000,
            snapshots: 20,
            chunks_per_file: 1_000_000,
            pack_size: 64 << 10,
            threads: cairn_core::threads::cores(),
        }
    }
}

/// The 16 bytes of chunk `n` of the repository: unique per `n`.
fn chunk_data(n: u64) -> [u8; CHUNK_BYTES as usize] {
    let mut d = [0u8; CHUNK_BYTES as usize];
    d[..8].copy_from_slice(&n.to_le_bytes());
    d[8..].copy_from_slice(b"cairnsca");
    d
}

/// One writer thread's packers (data and metadata packs apart, as a backup keeps
/// them) feeding the shared uploader.
struct Writer<'a> {
    repo: &'a Repository,
    up: &'a Uploader,
    enc: BlobEncoder,
    data: Packer,
    meta: Packer,
}

impl Writer<'_> {
    fn put(&mut self, kind: BlobKind, bytes: &[u8]) -> Result<BlobId> {
        let id = self.repo.key().blob_id(bytes);
        let b = self.enc.encode(self.repo.key(), kind, id, bytes)?;
        let packer = if kind == BlobKind::Data {
            &mut self.data
        } else {
            &mut self.meta
        };
        if let Some(p) = packer.add(b) {
            self.up.send(p)?;
        }
        Ok(id)
    }

    fn finish(mut self) -> Result<()> {
        for p in [self.data.finish(), self.meta.finish()]
            .into_iter()
            .flatten()
        {
            self.up.send(p)?;
        }
        Ok(())
    }

    /// Snapshot `s`'s root tree: its chunks `first..end` in files of
    /// `per_file` chunks.
    fn snapshot_tree(&mut self, first: u64, end: u64, per_file: u64) -> Result<(BlobId, u64)> {
        let mut nodes = Vec::new();
        let mut start = first;
        while start < end {
            let stop = (start + per_file).min(end);
            let mut list = ChunkListBuilder::new();
            for n in start..stop {
                let id = self.put(BlobKind::Data, &chunk_data(n))?;
                let r = ChunkRef {
                    id,
                    length: CHUNK_BYTES,
                };
                list.push(r, &mut |cl: ChunkList| {
                    self.put(BlobKind::ChunkList, &cl.encode())
                })?;
            }
            let content =
                list.finish(&mut |cl: ChunkList| self.put(BlobKind::ChunkList, &cl.encode()))?;
            let mut node = Node::new(format!("file-{start:012}").into_bytes(), NodeKind::File);
            node.mode = 0o100644;
            node.nlink = 1;
            node.size = (stop - start) * CHUNK_BYTES;
            node.content = content;
            nodes.push(node);
            start = stop;
        }
        let mut root = Node::new(b"data".to_vec(), NodeKind::Dir);
        root.mode = 0o40755;
        root.subtree = Some(self.put(BlobKind::Tree, &Tree { nodes }.encode())?);
        let files = (end - first).div_ceil(per_file);
        let id = self.put(BlobKind::Tree, &Tree { nodes: vec![root] }.encode())?;
        Ok((id, files))
    }
}

/// Writes `opts.snapshots` snapshots holding `opts.blobs` distinct 16-byte chunks
/// between them into `repo`. `done` is called with the chunks written so far.
/// Returns the snapshots' ids, oldest first.
pub fn build(
    repo: &Repository,
    opts: &ScaleOptions,
    done: &(dyn Fn(u64) + Sync),
) -> Result<Vec<SnapshotId>> {
    let snapshots = opts.snapshots.max(1);
    let per_snap = opts.blobs.div_ceil(snapshots);
    let per_file = opts.chunks_per_file.max(1);
    let lock = cairn_core::lock::RepoLock::acquire(repo, "scale-repo", false)?;
    let threads = opts.threads.max(1);
    let pool = Arc::new(BufferPool::new(threads * 4));
    let up = repo.uploader(pool.clone());
    let next = AtomicU64::new(0);
    let written = AtomicU64::new(0);
    let roots: std::sync::Mutex<Vec<(u64, BlobId, u64)>> = Default::default();
    let results: Vec<Result<()>> = std::thread::scope(|s| {
        let handles: Vec<_> = (0..threads)
            .map(|_| {
                s.spawn(|| -> Result<()> {
                    let mut w = Writer {
                        repo,
                        up: &up,
                        enc: BlobEncoder::new(repo.config().compression.zstd_level()),
                        data: Packer::new(repo.key().clone(), pool.clone(), opts.pack_size),
                        meta: Packer::new(repo.key().clone(), pool.clone(), 4 << 20),
                    };
                    loop {
                        let snap = next.fetch_add(1, Ordering::Relaxed);
                        if snap >= snapshots {
                            break;
                        }
                        let first = (snap * per_snap).min(opts.blobs);
                        let end = ((snap + 1) * per_snap).min(opts.blobs);
                        let (root, files) = w.snapshot_tree(first, end, per_file)?;
                        roots
                            .lock()
                            .unwrap_or_else(|e| e.into_inner())
                            .push((snap, root, files));
                        done(written.fetch_add(end - first, Ordering::Relaxed) + end - first);
                    }
                    w.finish()
                })
            })
            .collect();
        handles
            .into_iter()
            .map(|h| {
                h.join().unwrap_or_else(|_| {
                    Err(cairn_core::Error::Invalid(
                        "a writer thread panicked".into(),
                    ))
                })
            })
            .collect()
    });
    // The uploader's error says why a writer's send failed: report it first.
    up.finish()?;
    for r in results {
        r?;
    }
    // Snapshots only once every blob they name is indexed (the order backups keep).
    let mut roots = roots.into_inner().unwrap_or_else(|e| e.into_inner());
    roots.sort();
    let mut ids = Vec::with_capacity(roots.len());
    for (snap, root, files) in roots {
        let first = (snap * per_snap).min(opts.blobs);
        let end = ((snap + 1) * per_snap).min(opts.blobs);
        let snapshot = Snapshot {
            version: 1,
            time: format!("2026-01-{:02}T00:00:00.000000000Z", 1 + snap % 28),
            utc_offset: None,
            hostname: "scale".into(),
            username: "bench".into(),
            paths: vec!["/data".into()],
            tags: vec![format!("day-{}", snap + 1)],
            tree: root.to_hex(),
            parent: None,
            excludes: Vec::new(),
            original: None,
            copied_from: None,
            program_version: format!("cairn-plan scale {}", env!("CARGO_PKG_VERSION")),
            image: None,
            summary: SnapshotSummary {
                files_new: files,
                dirs: 1,
                total_bytes: (end - first) * CHUNK_BYTES,
                bytes_read: (end - first) * CHUNK_BYTES,
                blobs_added: end - first,
                data_added: (end - first) * CHUNK_BYTES,
                ..Default::default()
            },
        };
        ids.push(repo.write_snapshot(&snapshot, &lock)?);
    }
    Ok(ids)
}

#[cfg(test)]
mod tests {
    use super::*;
    use cairn_core::session::Read;
    use cairn_core::{IndexLoad, Session};

    /// An unencrypted repository in `dir` (no key derivation: fast).
    fn local_repo(dir: &std::path::Path) -> Repository {
        let opts = cairn_core::InitOptions {
            encryption: false,
            ..Default::default()
        };
        std::fs::create_dir_all(dir.join("repo")).unwrap();
        Repository::init(
            Arc::new(cairn_backend::LocalBackend::new(dir.join("repo"))),
            None,
            &opts,
        )
        .unwrap()
    }

    /// `check --read-data`, which must find nothing wrong.
    fn check_all(repo: Repository) -> (Session<Read>, cairn_core::ops::check::CheckReport) {
        let none = cairn_core::progress::Progress::none();
        let mut s = Session::<Read>::open(repo, "check", IndexLoad::Deferred, &none).unwrap();
        let opts = cairn_core::ops::check::CheckOptions {
            read_data: true,
            ..Default::default()
        };
        let report = cairn_core::ops::check::check(&mut s, &opts).unwrap();
        assert!(report.problems.is_empty(), "{:?}", report.problems);
        (s, report)
    }

    #[test]
    fn a_scale_repository_checks_clean_and_holds_what_it_says() {
        let dir = tempfile::tempdir().unwrap();
        let repo = local_repo(dir.path());
        let opts = ScaleOptions {
            blobs: 20_000,
            snapshots: 3,
            chunks_per_file: 3_000,
            pack_size: 16 << 10,
            threads: 2,
        };
        let ids = build(&repo, &opts, &|_| {}).unwrap();
        assert_eq!(ids.len(), 3);
        let (s, report) = check_all(repo);
        // Every chunk, each file's chunk list (3 files a snapshot, up to 3,000
        // chunks: one list blob each) and 2 trees per snapshot.
        assert_eq!(report.blobs, 20_000 + 9 + 6, "{report:?}");
        let (snaps, _) = s.repo().snapshots().unwrap();
        let total: u64 = snaps.iter().map(|(_, s)| s.summary.total_bytes).sum();
        assert_eq!(total, 20_000 * CHUNK_BYTES);
    }

    /// Prune's plan is the same whether its whole-repository sets stay in RAM or
    /// spill to disk in many partitions; a prune that spills leaves a repository
    /// that checks clean, with the forgotten snapshot's chunks gone.
    #[test]
    fn prune_decides_the_same_with_its_sets_on_disk() {
        use cairn_core::ops::prune::{MaxUnused, PruneOptions};
        use cairn_core::session::Exclusive;
        let dir = tempfile::tempdir().unwrap();
        let repo = local_repo(dir.path());
        // Small packs, one writer: packs at snapshot boundaries hold two
        // snapshots' chunks, so forgetting one leaves some partly used.
        let opts = ScaleOptions {
            blobs: 30_000,
            snapshots: 4,
            chunks_per_file: 2_500,
            pack_size: 16 << 10,
            threads: 1,
        };
        let ids = build(&repo, &opts, &|_| {}).unwrap();
        repo.forget_snapshots(&ids[1..2]).unwrap();
        let none = cairn_core::progress::Progress::none();
        let prune_opts = PruneOptions {
            max_unused: MaxUnused::Percent(0.0),
            ..Default::default()
        };
        let mut plans = Vec::new();
        let mut repo = Some(repo);
        for partition_bytes in [None, Some(100_000)] {
            let prune_opts = PruneOptions {
                partition_bytes,
                ..prune_opts.clone()
            };
            let mut s =
                Session::<Read>::open(repo.take().unwrap(), "prune", IndexLoad::None, &none)
                    .unwrap();
            let r = cairn_core::ops::prune::plan(&mut s, &prune_opts).unwrap();
            plans.push(serde_json::to_string(&r.plan).unwrap());
            repo = Some(s.into_repo());
        }
        assert_eq!(plans[0], plans[1]);
        let prune_opts = PruneOptions {
            partition_bytes: Some(100_000),
            ..prune_opts
        };
        let mut s =
            Session::<Exclusive>::open(repo.take().unwrap(), "prune", IndexLoad::None, &none)
                .unwrap();
        let r = cairn_core::ops::prune::prune(&mut s, &prune_opts).unwrap();
        assert_eq!(r.plan.used_blobs, 22_500 + 9 + 6, "{r:?}");
        assert!(r.plan.repack_packs > 0 && r.plan.delete_packs > 0, "{r:?}");
        assert_eq!(r.plan.unused_bytes_after, 0, "{r:?}");
        let (_, report) = check_all(s.into_repo());
        assert_eq!(report.blobs, 22_500 + 9 + 6);
    }
}
