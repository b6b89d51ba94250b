//! A small cache of decoded blobs, bounded by bytes: repeated reads of the same
//! blobs — a mounted snapshot read at random offsets, an image's file system read
//! block by block, the chunk-list blobs above them — are served from memory instead
//! of the storage. Least recently used blobs go first.

use super::*;
use lru::LruCache;
use std::sync::Mutex;

/// Bytes a repository's cache holds by default.
pub const DEFAULT_BLOB_CACHE_BYTES: usize = 32 << 20;

pub struct BlobCache {
    inner: Mutex<Inner>,
    limit: usize,
}

struct Inner {
    map: LruCache<BlobId, Arc<[u8]>>,
    bytes: usize,
    hits: u64,
    misses: u64,
}

impl BlobCache {
    pub fn new(limit: usize) -> BlobCache {
        BlobCache {
            inner: Mutex::new(Inner {
                map: LruCache::unbounded(),
                bytes: 0,
                hits: 0,
                misses: 0,
            }),
            limit,
        }
    }

    pub fn get(&self, id: &BlobId) -> Option<Arc<[u8]>> {
        let mut g = crate::lock(&self.inner);
        let found = g.map.get(id).cloned();
        match found {
            Some(_) => g.hits += 1,
            None => g.misses += 1,
        }
        found
    }

    /// Whether the blob is cached, without counting a hit or a miss or making it
    /// more recent (a reader about to fetch ahead asks this).
    pub fn contains(&self, id: &BlobId) -> bool {
        crate::lock(&self.inner).map.contains(id)
    }

    pub fn insert(&self, id: BlobId, data: Arc<[u8]>) {
        if data.len() > self.limit / 4 {
            return; // one blob may not push out most of the cache
        }
        let mut g = crate::lock(&self.inner);
        if let Some(old) = g.map.put(id, data.clone()) {
            g.bytes -= old.len();
        }
        g.bytes += data.len();
        while g.bytes > self.limit {
            match g.map.pop_lru() {
                Some((_, v)) => g.bytes -= v.len(),
                None => break,
            }
        }
    }

    /// (hits, misses) so far.
    pub fn stats(&self) -> (u64, u64) {
        let g = crate::lock(&self.inner);
        (g.hits, g.misses)
    }
}

impl Repository {
    /// Reads one blob through the repository's blob cache (see [`BlobCache`]).
    pub fn read_blob_cached(&self, id: &BlobId) -> Result<Arc<[u8]>> {
        if let Some(b) = self.blob_cache.get(id) {
            return Ok(b);
        }
        let data: Arc<[u8]> = self.read_blob(id)?.into();
        self.blob_cache.insert(*id, data.clone());
        Ok(data)
    }

    pub fn blob_cache(&self) -> &BlobCache {
        &self.blob_cache
    }

    /// Reads through `cache` from now on instead of this handle's own. A
    /// long-lived reader that reopens the repository now and then (a mount) keeps
    /// one cache across its handles, with a byte limit of its choosing; blobs are
    /// named by their content, so what one handle cached is right for the next.
    pub fn with_blob_cache(mut self, cache: Arc<BlobCache>) -> Repository {
        self.blob_cache = cache;
        self
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keeps_within_its_bytes_least_recent_out_first() {
        let c = BlobCache::new(1000);
        let id = |i: u8| BlobId([i; 32]);
        for i in 0..5 {
            c.insert(id(i), vec![i; 200].into());
        }
        assert!(c.get(&id(0)).is_some()); // now the most recent
        c.insert(id(5), vec![5; 200].into());
        assert!(c.get(&id(1)).is_none(), "least recent went first");
        assert!(c.get(&id(0)).is_some());
        assert!(c.get(&id(5)).is_some());
        c.insert(id(9), vec![9; 600].into()); // over a quarter: not cached
        assert!(c.get(&id(9)).is_none());
        // Asking whether it is there counts nothing.
        assert!(c.contains(&id(5)) && !c.contains(&id(1)));
        let (hits, misses) = c.stats();
        assert_eq!((hits, misses), (3, 2));
    }
}
