//! The locality cache: when a lookup finds a blob, its whole pack's records are
//! read into a bounded cache, because the next chunks are almost always there.

use super::*;

/// A run of consecutive records of one pack.
#[derive(Clone, Copy)]
pub(super) struct Run {
    pub(super) start: u64,
    pub(super) count: u32,
    pub(super) pack: u32,
}

/// The locality cache: whole packs' records, least recently loaded out first.
#[derive(Default)]
pub(super) struct Cache {
    pub(super) map: HashMap<BlobId, (BlobLocation, bool)>,
    pub(super) order: VecDeque<(u32, Vec<BlobId>)>,
    pub(super) loaded: HashSet<u32>,
    /// Packs of the last few lookups that went to disk: a pack is loaded whole
    /// on its second hit among them, so random lookups (no locality to exploit)
    /// do not pay for reading and caching whole packs.
    pub(super) recent: VecDeque<u32>,
}

/// Disk hits remembered to decide whether a pack is worth loading.
pub(super) const RECENT_HITS: usize = 16;

impl Cache {
    pub(super) fn insert_pack(&mut self, pack: u32, records: Vec<(BlobId, BlobLocation, bool)>) {
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
