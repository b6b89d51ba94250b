//! Decoded directory trees, kept by bytes, least recently used out first. A tree
//! is read only when its directory is looked into or listed; the cache keeps the
//! directories in use decoded (a lookup is a binary search in memory) without
//! keeping every tree ever read. The most recent tree always stays, however large,
//! so a directory of a million entries is not read again for every page of its
//! listing (an open directory also holds its tree itself).

use cairn_format::BlobId;
use cairn_format::tree::{Content, Node, Tree};
use lru::LruCache;
use std::sync::{Arc, Mutex};

pub struct TreeCache {
    inner: Mutex<Inner>,
    limit: usize,
}

struct Inner {
    /// Each tree, its bytes, and whether an entry of it has a POSIX ACL (asked
    /// for every file `ls -l` lists, so worked out once).
    map: LruCache<BlobId, (Arc<Tree>, usize, bool)>,
    bytes: usize,
}

/// About what a decoded tree takes in memory: the nodes and what they own.
pub fn tree_bytes(t: &Tree) -> usize {
    let node = std::mem::size_of::<cairn_format::tree::Node>();
    t.nodes
        .iter()
        .map(|n| {
            node + n.name.len()
                + n.user.len()
                + n.group.len()
                + n.link_target.len()
                + n.xattrs
                    .iter()
                    .map(|(k, v)| 48 + k.len() + v.len())
                    .sum::<usize>()
                + match &n.content {
                    Content::Inline(v) => v.len() * 40,
                    _ => 0,
                }
        })
        .sum::<usize>()
        + 64
}

impl TreeCache {
    pub fn new(limit: usize) -> TreeCache {
        TreeCache {
            inner: Mutex::new(Inner {
                map: LruCache::unbounded(),
                bytes: 0,
            }),
            limit,
        }
    }

    pub fn get(&self, id: &BlobId) -> Option<Arc<Tree>> {
        lock(&self.inner).map.get(id).map(|(t, _, _)| t.clone())
    }

    /// Whether an entry of the cached tree `id` has a POSIX ACL.
    pub fn has_acl(&self, id: &BlobId) -> Option<bool> {
        lock(&self.inner).map.get(id).map(|&(_, _, acl)| acl)
    }

    pub fn insert(&self, id: BlobId, tree: Arc<Tree>) {
        let size = tree_bytes(&tree);
        let acl = tree.nodes.iter().any(Node::has_acl);
        let mut g = lock(&self.inner);
        if let Some((_, old, _)) = g.map.put(id, (tree, size, acl)) {
            g.bytes -= old;
        }
        g.bytes += size;
        while g.bytes > self.limit && g.map.len() > 1 {
            match g.map.pop_lru() {
                Some((_, (_, s, _))) => g.bytes -= s,
                None => break,
            }
        }
    }

    /// (trees, bytes) held.
    pub fn usage(&self) -> (usize, usize) {
        let g = lock(&self.inner);
        (g.map.len(), g.bytes)
    }
}

pub(crate) fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

#[cfg(test)]
mod tests {
    use super::*;
    use cairn_format::tree::{Node, NodeKind};

    fn tree(n: usize) -> Arc<Tree> {
        Arc::new(Tree {
            nodes: (0..n)
                .map(|i| Node::new(format!("{i:08}").into_bytes(), NodeKind::File))
                .collect(),
        })
    }

    #[test]
    fn bounded_by_bytes_but_the_newest_stays() {
        let one = tree_bytes(&tree(100));
        let c = TreeCache::new(one * 3);
        for i in 0..10u8 {
            c.insert(BlobId([i; 32]), tree(100));
        }
        let (n, bytes) = c.usage();
        assert_eq!(n, 3);
        assert!(bytes <= one * 3);
        assert!(c.get(&BlobId([9; 32])).is_some());
        assert!(c.get(&BlobId([0; 32])).is_none());
        // Larger than the whole limit: kept alone.
        c.insert(BlobId([99; 32]), tree(10_000));
        assert_eq!(c.usage().0, 1);
        assert!(c.get(&BlobId([99; 32])).is_some());
    }
}
