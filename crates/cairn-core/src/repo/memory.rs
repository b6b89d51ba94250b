//! Memory budgets (`--memory-limit`, or the repository's default): before an
//! operation loads its index, the memory it will need is estimated, said, and
//! either fitted under the limit (by sizing the caches and queues from what the
//! index leaves) or refused with what to change — never found out by swapping or
//! by the kernel's OOM killer.
//!
//! The index is the part that grows with the repository: in RAM, a 47-byte record
//! per blob; in the SSD placement, about 1.4 bytes of RAM per blob (docs/FORMAT.md).
//! Its blob count is estimated from the index files' sizes (about 42 bytes per entry
//! on storage: random ids do not compress), before anything is read. The rest is
//! per operation: buffers, queues and caches, which this module sizes.

use super::Repository;
use crate::error::{Error, Result};
use cairn_backend::names;
use cairn_format::config::IndexPlacement;

/// Index file bytes per index entry, as measured (ids are random: no compression).
const INDEX_FILE_BYTES_PER_ENTRY: f64 = 42.0;
/// RAM per entry: the RAM placement's record, and the SSD placement's share.
const RAM_PLACEMENT_BYTES_PER_ENTRY: f64 = crate::index::RECORD_LEN as f64 + 0.25;
const SSD_PLACEMENT_BYTES_PER_ENTRY: f64 = 1.4;
/// The same files opened without their filter, for a reader of stored blobs only.
const FOR_READS_BYTES_PER_ENTRY: f64 = 0.2;

/// How an operation will hold the index, for its memory plan.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum IndexUse {
    /// In the repository's placement.
    Placement,
    /// Not at all (`repair index`, which reads the packs instead).
    NotHeld,
    /// On local disk without its filter, whatever the placement (the mount).
    ForReads,
}
/// What any operation needs besides the index and its working buffers: the program,
/// thread stacks, the allocator's slack.
const BASE_BYTES: u64 = 48 << 20;
/// The least working memory an operation is run with (below this a limit is
/// refused rather than met by crawling).
pub const MIN_WORK_BYTES: u64 = 32 << 20;
/// The least limit any operation can run under (a repository with no index yet).
pub const MIN_LIMIT_BYTES: u64 = BASE_BYTES + MIN_WORK_BYTES;

/// How an operation's memory divides under its limit.
#[derive(Clone, Copy, Debug, serde::Serialize)]
pub struct MemoryPlan {
    pub limit_bytes: u64,
    /// The index, in the placement the operation uses.
    pub index_bytes: u64,
    /// Whether that is the RAM placement.
    pub index_in_ram: bool,
    /// For buffers, queues and caches.
    pub work_bytes: u64,
}

impl MemoryPlan {
    /// One line for the start of the operation.
    pub fn describe(&self) -> String {
        if self.index_bytes == 0 {
            return format!(
                "memory: about {} for buffers and caches, within the limit of {}",
                crate::units::bytes(self.work_bytes, 1),
                crate::units::bytes(self.limit_bytes, 1)
            );
        }
        format!(
            "memory: about {} for the index ({}) and {} for buffers and caches, within the limit of {}",
            crate::units::bytes(self.index_bytes, 1),
            if self.index_in_ram {
                "in RAM"
            } else {
                "SSD placement"
            },
            crate::units::bytes(self.work_bytes, 1),
            crate::units::bytes(self.limit_bytes, 1)
        )
    }

    /// A share of the working memory, within `lo..=hi`.
    pub fn share(&self, divisor: u64, lo: u64, hi: u64) -> u64 {
        (self.work_bytes / divisor.max(1)).clamp(lo, hi)
    }
}

impl Repository {
    /// Sets the memory limit for operations on this handle (`None`: no limit).
    pub fn set_memory_limit(&mut self, limit: Option<u64>) {
        self.memory_limit = limit.filter(|&l| l > 0);
    }

    pub fn memory_limit(&self) -> Option<u64> {
        self.memory_limit
    }

    /// The plan for an operation that holds the index as `index` says, under the
    /// limit; `None` without a limit.
    /// A limit the index alone would break is an error that says what to change.
    pub fn memory_plan(&self, index: IndexUse) -> Result<Option<MemoryPlan>> {
        let Some(limit) = self.memory_limit else {
            return Ok(None);
        };
        let index_file_bytes: u64 = self
            .backend()
            .list(names::INDEX)?
            .iter()
            .map(|o| o.size)
            .sum();
        let entries = index_file_bytes as f64 / INDEX_FILE_BYTES_PER_ENTRY;
        let held = index != IndexUse::NotHeld;
        let for_reads = index == IndexUse::ForReads && self.index_path().is_ok();
        let in_ram = held && !for_reads && self.config().index_placement == IndexPlacement::Ram;
        let ram = (entries * RAM_PLACEMENT_BYTES_PER_ENTRY) as u64;
        let ssd = (entries * SSD_PLACEMENT_BYTES_PER_ENTRY) as u64;
        let index_bytes = match (held, in_ram, for_reads) {
            (false, _, _) => 0,
            (_, true, _) => ram,
            (_, false, true) => (entries * FOR_READS_BYTES_PER_ENTRY) as u64,
            (_, false, false) => ssd,
        };
        let needed = BASE_BYTES + index_bytes + MIN_WORK_BYTES;
        if needed > limit {
            let advice = if in_ram && BASE_BYTES + ssd + MIN_WORK_BYTES <= limit {
                format!(
                    "move the index to the SSD placement (`cairn index --index-placement ssd`: \
                     about {} of RAM for it) or raise the limit to {}",
                    crate::units::bytes(ssd, 1),
                    crate::units::bytes(needed, 1)
                )
            } else {
                format!("raise the limit to {}", crate::units::bytes(needed, 1))
            };
            return Err(Error::MemoryLimit(format!(
                "the memory limit of {} (--memory-limit, or the repository's default that \
                 `cairn config --memory-limit SIZE|none` sets) cannot be met: the index ({} \
                 entries) needs about {} {}, \
                 besides {} of buffers and {} for the program; {advice}",
                crate::units::bytes(limit, 1),
                entries as u64,
                crate::units::bytes(index_bytes, 1),
                if in_ram {
                    "in RAM"
                } else {
                    "in the SSD placement"
                },
                crate::units::bytes(MIN_WORK_BYTES, 0),
                crate::units::bytes(BASE_BYTES, 0),
            )));
        }
        Ok(Some(MemoryPlan {
            limit_bytes: limit,
            index_bytes,
            index_in_ram: in_ram,
            work_bytes: limit - BASE_BYTES - index_bytes,
        }))
    }
}

impl Repository {
    /// The plan the session made (see [`Repository::memory_plan`]); operations size
    /// their buffers from it.
    pub fn memory_plan_in_use(&self) -> Option<&MemoryPlan> {
        self.memory_plan.as_ref()
    }

    /// Adopts `plan` for the operations that follow, and sizes the blob cache from it.
    pub(crate) fn use_memory_plan(&mut self, plan: Option<MemoryPlan>) {
        if let Some(p) = &plan {
            let bytes = p.share(
                8,
                4 << 20,
                super::blobcache::DEFAULT_BLOB_CACHE_BYTES as u64,
            );
            self.blob_cache = std::sync::Arc::new(super::blobcache::BlobCache::new(
                usize::try_from(bytes).unwrap_or(usize::MAX),
            ));
        }
        self.memory_plan = plan;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_index_too_large_for_the_limit_is_refused_with_the_ssd_placement_as_the_way_out() {
        let mut repo = crate::testutil::mem_repo();
        assert!(
            repo.memory_plan(IndexUse::Placement).unwrap().is_none(),
            "no limit, no plan"
        );
        // Index files of 42 MB: about a million entries, 47 MB in RAM, 1.4 MB on SSD.
        repo.backend()
            .put("index/00", &vec![0u8; 42 << 20])
            .unwrap();
        repo.set_memory_limit(Some(100 << 20));
        let e = repo
            .memory_plan(IndexUse::Placement)
            .unwrap_err()
            .to_string();
        assert!(e.contains("--index-placement ssd"), "{e}");
        // The mount looks the index up on disk without its filter: it fits.
        if repo.index_path().is_ok() {
            let plan = repo.memory_plan(IndexUse::ForReads).unwrap().unwrap();
            assert!(!plan.index_in_ram);
            assert!(plan.index_bytes < 1 << 20, "{plan:?}");
        }
        // `repair index` holds no index: only the program and its buffers count.
        let plan = repo.memory_plan(IndexUse::NotHeld).unwrap().unwrap();
        assert_eq!(plan.index_bytes, 0);
        assert!(!plan.describe().contains("index"), "{}", plan.describe());
        // A limit that fits leaves the rest for buffers, and says so.
        repo.set_memory_limit(Some(1 << 30));
        let plan = repo.memory_plan(IndexUse::Placement).unwrap().unwrap();
        assert!(plan.index_in_ram);
        assert!((45 << 20..50 << 20).contains(&plan.index_bytes), "{plan:?}");
        assert_eq!(plan.work_bytes, (1 << 30) - BASE_BYTES - plan.index_bytes);
        assert!(
            plan.describe().contains("within the limit of 1.0 GiB"),
            "{}",
            plan.describe()
        );
    }
}
