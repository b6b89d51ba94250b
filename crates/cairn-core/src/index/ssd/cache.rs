//! The locality cache: when a lookup finds a blob, the records around it in its
//! pack (a window of [`WINDOW`]) are read into a bounded cache, because the next
//! chunks are almost always there.

use super::*;
use crate::index::IdMap;

/// A run of consecutive records of one pack.
#[derive(Clone, Copy)]
pub(super) struct Run {
    pub(super) start: u64,
    pub(super) count: u32,
    pub(super) pack: u32,
}

/// Records read together: the window of a pack's records around a hit (windows
/// are aligned on record numbers and end where the pack's records end).
///
/// Windows, not whole packs: a snapshot late in a history has its files in many
/// packs of many days, each day's pack hit a little at a time as a walk goes
/// through the tree. A mount copying the 25th day of the bench's history
/// touched more packs at once than the cache holds whole, and loaded and evicted
/// them again and again (half of its CPU, 108 packs of ~3,000 records). A window
/// per pack in use fits.
pub(super) const WINDOW: u64 = 1024;

/// The locality cache: windows of records. The window loaded longest ago goes
/// out first, unless a lookup found a blob in it since it was last passed over:
/// then it gets a second chance (the clock algorithm, close to least recently
/// used), so a window still in use is not evicted for one read once.
#[derive(Default)]
pub(super) struct Cache {
    /// Each cached record, with its window.
    pub(super) map: IdMap<(BlobLocation, bool, u64)>,
    pub(super) order: VecDeque<(u64, Vec<BlobId>)>,
    /// Windows loaded, and whether a lookup found a blob in one since it was last
    /// passed over for eviction.
    pub(super) loaded: HashMap<u64, bool>,
    /// Windows of the last few lookups that went to disk: a window is loaded on
    /// its second hit among them, so random lookups (no locality to exploit) do
    /// not pay for reading and caching windows.
    pub(super) recent: VecDeque<u64>,
}

/// Disk hits remembered to decide whether a pack is worth loading.
pub(super) const RECENT_HITS: usize = 16;

impl Cache {
    /// A cached blob's location, marking its window as used.
    pub(super) fn get(&mut self, id: &BlobId) -> Option<(BlobLocation, bool)> {
        let (loc, pending, window) = *self.map.get(id)?;
        if let Some(used) = self.loaded.get_mut(&window) {
            *used = true;
        }
        Some((loc, pending))
    }

    pub(super) fn insert_window(
        &mut self,
        window: u64,
        records: Vec<(BlobId, BlobLocation, bool)>,
    ) {
        if self.loaded.contains_key(&window) {
            return;
        }
        while self.map.len() + records.len() > CACHE_RECORDS {
            let Some((p, ids)) = self.order.pop_front() else {
                break;
            };
            // Every pass clears the flag it honours, so this ends.
            if let Some(used) = self.loaded.get_mut(&p)
                && *used
            {
                *used = false;
                self.order.push_back((p, ids));
                continue;
            }
            self.loaded.remove(&p);
            for id in ids {
                self.map.remove(&id);
            }
        }
        self.loaded.insert(window, false);
        let ids = records.iter().map(|r| r.0).collect();
        for (id, loc, pending) in records {
            self.map.entry(id).or_insert((loc, pending, window));
        }
        self.order.push_back((window, ids));
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use cairn_format::index::IndexBlob;
    use cairn_format::pack::{BlobCompression, BlobKind};

    fn window(w: u64) -> Vec<(BlobId, BlobLocation, bool)> {
        (0..WINDOW)
            .map(|i| {
                let n = w * WINDOW + i;
                let b = IndexBlob {
                    kind: BlobKind::Data,
                    id: BlobId::of_content(&n.to_le_bytes()),
                    offset: i as u32 * 100,
                    length: 100,
                    raw_length: 100,
                    compression: BlobCompression::Raw,
                };
                (b.id, BlobLocation::new(w as u32, &b), false)
            })
            .collect()
    }

    /// A window a lookup used since it was last passed over stays; the oldest
    /// unused one goes, and the cache stays within its bound.
    #[test]
    fn a_window_in_use_gets_a_second_chance_and_the_cache_stays_bounded() {
        let full = (CACHE_RECORDS as u64) / WINDOW;
        let mut c = Cache::default();
        for w in 0..full {
            c.insert_window(w, window(w));
        }
        assert_eq!(c.map.len(), CACHE_RECORDS);
        let first = window(0)[5].0;
        let second = window(1)[5].0;
        assert!(c.get(&first).is_some());
        c.insert_window(full, window(full));
        assert!(c.map.len() <= CACHE_RECORDS);
        assert!(c.get(&first).is_some(), "the window in use was evicted");
        assert!(c.get(&second).is_none(), "the oldest unused window stayed");
        assert!(c.get(&window(full)[0].0).is_some());
        // Loading a window again changes nothing.
        c.insert_window(full, window(full));
        assert!(c.map.len() <= CACHE_RECORDS);
    }
}
