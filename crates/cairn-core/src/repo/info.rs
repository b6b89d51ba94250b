//! Typed reports about the repository itself (what `cairn init`, `config`,
//! `snapshots`, `key list`, `unlock` and `index` print, with `--json` or as text).

use super::*;
use crate::repo::lock::LockInfo;
use cairn_format::config::ChunkerParams;
use cairn_format::snapshot::SnapshotSummary;
use serde::Serialize;

/// The repository's settings.
#[derive(Clone, Debug, Serialize)]
pub struct RepositoryInfo {
    /// The location as given.
    pub repository: String,
    pub id: String,
    pub created: String,
    pub format_version: u32,
    /// Average chunk size in bytes.
    pub block_size: u32,
    pub chunk_min: u32,
    pub chunk_max: u32,
    pub chunker: ChunkerParams,
    pub compression: &'static str,
    pub encryption: &'static str,
    pub pack_size: u32,
    pub max_concurrent_jobs: u32,
    /// The default memory limit of operations (`None`: none).
    pub memory_limit: Option<u64>,
    pub index_placement: &'static str,
    /// Where the SSD placement keeps its files on this machine (`CAIRN_INDEX_PATH`,
    /// the configured path, else the cache directory's `index`); with the RAM
    /// placement, a configured path if one is kept for a later move.
    pub index_path: Option<String>,
}

impl RepositoryInfo {
    pub fn of(repo: &Repository) -> RepositoryInfo {
        let c = repo.config();
        RepositoryInfo {
            repository: repo.location().to_string(),
            id: c.id.clone(),
            created: c.created.clone(),
            format_version: c.version,
            block_size: c.chunker.avg_size,
            chunk_min: c.chunker.min_size,
            chunk_max: c.chunker.max_size,
            chunker: c.chunker.clone(),
            compression: c.compression.name(),
            encryption: c.encryption.name(),
            pack_size: c.pack_size,
            max_concurrent_jobs: c.max_concurrent_jobs,
            memory_limit: c.memory_limit,
            index_placement: c.index_placement.name(),
            index_path: match c.index_placement {
                cairn_format::config::IndexPlacement::Ssd => repo
                    .index_path()
                    .ok()
                    .map(|p| p.to_string_lossy().into_owned()),
                cairn_format::config::IndexPlacement::Ram => c.index_path.clone(),
            },
        }
    }
}

/// One snapshot as `cairn snapshots` lists it.
#[derive(Clone, Debug, Serialize)]
pub struct SnapshotInfo {
    pub id: SnapshotId,
    pub short_id: String,
    pub time: String,
    /// Seconds east of UTC of the zone the snapshot was taken in, when recorded
    /// (retention counts its days there).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub utc_offset: Option<i32>,
    pub hostname: String,
    pub username: String,
    pub paths: Vec<String>,
    pub tags: Vec<String>,
    pub tree: String,
    pub parent: Option<String>,
    /// The snapshot this one was rewritten from (`tag`, `repair snapshots`), the
    /// first of the chain.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub original: Option<String>,
    /// Set by `copy`: the snapshot this one is a copy of, and the repository
    /// (its id) that holds it.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub copied_from: Option<cairn_format::snapshot::CopiedFrom>,
    pub summary: SnapshotSummary,
    /// Image snapshots (`backup --image`): the image's size and blocks.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub image: Option<cairn_format::snapshot::ImageInfo>,
    /// The host the snapshot names, when `cairn serve` recorded another for the
    /// token that stored it (`hostname` is then the recorded one, as `forget`
    /// counts it).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub claimed_hostname: Option<String>,
}

impl SnapshotInfo {
    pub fn of(id: &SnapshotId, s: &Snapshot) -> SnapshotInfo {
        SnapshotInfo {
            id: *id,
            short_id: id.short(),
            time: s.time.clone(),
            utc_offset: s.utc_offset,
            hostname: s.hostname.clone(),
            username: s.username.clone(),
            paths: s.paths.clone(),
            tags: s.tags.clone(),
            tree: s.tree.clone(),
            parent: s.parent.clone(),
            original: s.original.clone(),
            copied_from: s.copied_from.clone(),
            summary: s.summary.clone(),
            image: s.image.clone(),
            claimed_hostname: None,
        }
    }
}

/// One key file.
#[derive(Clone, Debug, Serialize)]
pub struct KeyInfo {
    pub id: KeyId,
    /// The key this process opened the repository with.
    pub current: bool,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub created: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub hostname: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub username: Option<String>,
    /// Why the key file could not be read, if it could not.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub error: Option<String>,
}

impl Repository {
    /// Every key file, readable or not.
    pub fn key_infos(&self) -> Result<Vec<KeyInfo>> {
        Ok(self
            .list_keys()?
            .into_iter()
            .map(|(id, kf)| {
                let current = Some(id) == self.key_id();
                match kf {
                    Ok(k) => KeyInfo {
                        id,
                        current,
                        created: Some(k.created),
                        hostname: Some(k.hostname),
                        username: Some(k.username),
                        error: None,
                    },
                    Err(e) => KeyInfo {
                        id,
                        current,
                        created: None,
                        hostname: None,
                        username: None,
                        error: Some(e.to_string()),
                    },
                }
            })
            .collect())
    }
}

/// A key added, changed or removed.
#[derive(Clone, Debug, Serialize)]
pub struct KeyChange {
    #[serde(skip_serializing_if = "Option::is_none")]
    pub id: Option<KeyId>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub removed: Option<KeyId>,
}

/// A lock as `cairn unlock` shows it.
#[derive(Clone, Debug, Serialize)]
pub struct LockEntry {
    pub id: String,
    pub lock: Option<cairn_format::lock::Lock>,
    pub stale: bool,
    pub description: String,
}

impl LockEntry {
    pub fn of(l: &LockInfo) -> LockEntry {
        LockEntry {
            id: l.hex(),
            lock: l.lock.clone(),
            stale: l.stale,
            description: l.describe(),
        }
    }
}

/// What `cairn unlock` removed and what it left.
#[derive(Clone, Debug, Serialize)]
pub struct UnlockReport {
    pub removed: Vec<LockEntry>,
    /// Locks `--remove-all` left: held by a process running on this machine.
    pub running_here: Vec<LockEntry>,
    pub remaining: Vec<LockEntry>,
}

/// Removes stale locks (every lock with `all`) and reports what is left.
pub fn unlock(repo: &Repository, all: bool) -> Result<UnlockReport> {
    let (removed, running_here) = crate::repo::lock::remove_locks(repo, all)?;
    let left = crate::repo::lock::list_locks(repo)?;
    Ok(UnlockReport {
        removed: removed.iter().map(LockEntry::of).collect(),
        running_here: running_here.iter().map(LockEntry::of).collect(),
        remaining: left.iter().map(LockEntry::of).collect(),
    })
}

/// Where the index lives and what it costs (`cairn index`).
#[derive(Clone, Debug, Serialize)]
pub struct IndexInfo {
    pub placement: &'static str,
    /// The SSD placement's directory on this machine.
    pub path: Option<String>,
    pub blobs: usize,
    pub ram_bytes: usize,
    pub ram_bytes_per_blob: f64,
    pub disk_bytes: u64,
    pub load_seconds: f64,
}

impl IndexInfo {
    /// Describes the loaded index of `repo`; `load_seconds` is how long loading took.
    pub fn of(repo: &Repository, load_seconds: f64) -> IndexInfo {
        let index = repo.index();
        let (path, disk) = match index.ssd() {
            Some(s) => (
                Some(s.path().display().to_string()),
                crate::index::ssd::disk_bytes(s.path()),
            ),
            None => (None, 0),
        };
        let blobs = index.len();
        let ram = index.ram_bytes();
        IndexInfo {
            placement: repo.config().index_placement.name(),
            path,
            blobs,
            ram_bytes: ram,
            ram_bytes_per_blob: if blobs > 0 {
                ram as f64 / blobs as f64
            } else {
                0.0
            },
            disk_bytes: disk,
            load_seconds,
        }
    }
}
