//! The chunk ids a datastore holds, as the dedup service needs them: asked "is this
//! id stored?" thousands of times per request, built from every live dedup list.
//!
//! A hash set of whole ids cost the server about 56 bytes per chunk, and 115 at the
//! peak of a build (measured: 561 MB resident, 1.15 GB peak, for a datastore of 10.3
//! million chunks), so 5.6 GB at the 100 million chunks a server should hold. Here
//! an id takes 16 bytes: the first 128 bits of each id, sorted in one vector, found
//! by binary search within the run that a directory of their first 16 bits points
//! to. Ids added between rebuilds (new lists) wait in a small hash set and are
//! merged in when it grows.
//!
//! Why 128 bits are enough: ids are keyed BLAKE3 hashes, so an id a client asks
//! about that is not stored shares its first 128 bits with one of n stored ids with
//! probability n / 2^128 (3e-31 at n = 10^8), far below the odds of the 256-bit id
//! itself colliding in a client's lifetime of backups. Only a client holding the key
//! could make ids collide on purpose, and such a client can already store a list
//! that names ids it never stored (docs/FORMAT.md, "Dedup lists").

use std::collections::HashSet;

/// The part of an id that is kept.
pub type Prefix = u128;

/// The first 16 bytes of an id, big-endian (so prefixes sort as the ids do).
pub fn prefix(id: &[u8; 32]) -> Prefix {
    let mut b = [0u8; 16];
    b.copy_from_slice(&id[..16]);
    u128::from_be_bytes(b)
}

/// Sets smaller than this are searched without a directory.
const DIRECTORY_FROM: usize = 1 << 16;
/// Bits of the directory (65,536 runs; 512 KiB).
const DIRECTORY_BITS: u32 = 16;

#[derive(Default)]
pub struct IdSet {
    /// Ascending, no duplicates.
    sorted: Vec<Prefix>,
    /// Where the prefixes beginning with each value of their first
    /// [`DIRECTORY_BITS`] start in `sorted` (one entry more than values); empty
    /// below [`DIRECTORY_FROM`].
    starts: Vec<usize>,
    /// Added since the last merge; none of them in `sorted`.
    recent: HashSet<Prefix>,
}

impl IdSet {
    /// The set of `prefixes` (any order, duplicates allowed). The vector is
    /// sorted in place and kept: building takes no memory beyond it.
    pub fn from_prefixes(mut prefixes: Vec<Prefix>) -> IdSet {
        prefixes.sort_unstable();
        prefixes.dedup();
        prefixes.shrink_to_fit();
        let mut s = IdSet {
            sorted: prefixes,
            starts: Vec::new(),
            recent: HashSet::new(),
        };
        s.index();
        s
    }

    pub fn len(&self) -> usize {
        self.sorted.len() + self.recent.len()
    }

    pub fn contains(&self, id: &[u8; 32]) -> bool {
        let p = prefix(id);
        self.in_sorted(p) || self.recent.contains(&p)
    }

    /// Adds ids (those of a new list).
    #[cfg(test)]
    pub fn extend<'a>(&mut self, ids: impl IntoIterator<Item = &'a [u8; 32]>) {
        self.extend_prefixes(ids.into_iter().map(prefix));
    }

    /// Adds ids by their [`prefix`].
    pub fn extend_prefixes(&mut self, prefixes: impl IntoIterator<Item = Prefix>) {
        for p in prefixes {
            if !self.in_sorted(p) {
                self.recent.insert(p);
            }
        }
        if self.recent.len() > (self.sorted.len() / 16).max(1 << 16) {
            self.merge();
        }
    }

    /// Bytes of memory held (for the metrics).
    pub fn bytes(&self) -> usize {
        // A hash set slot holds the value and a control byte (the table has up to
        // 8/7 of `capacity()` slots: an estimate, not a count).
        self.sorted.capacity() * size_of::<Prefix>()
            + self.starts.capacity() * size_of::<usize>()
            + self.recent.capacity() * (size_of::<Prefix>() + 1)
    }

    fn in_sorted(&self, p: Prefix) -> bool {
        let (lo, hi) = if self.starts.is_empty() {
            (0, self.sorted.len())
        } else {
            let top = (p >> (128 - DIRECTORY_BITS)) as usize;
            (self.starts[top], self.starts[top + 1])
        };
        self.sorted[lo..hi].binary_search(&p).is_ok()
    }

    /// Moves `recent` into `sorted`: sorted on its own, then merged from the back
    /// into the space added at the end (no second copy of the large vector).
    fn merge(&mut self) {
        let mut add: Vec<Prefix> = self.recent.drain().collect();
        self.recent.shrink_to_fit();
        add.sort_unstable();
        let old = self.sorted.len();
        self.sorted.resize(old + add.len(), 0);
        let (mut i, mut j, mut k) = (old, add.len(), old + add.len());
        while j > 0 {
            k -= 1;
            if i > 0 && self.sorted[i - 1] > add[j - 1] {
                self.sorted[k] = self.sorted[i - 1];
                i -= 1;
            } else {
                self.sorted[k] = add[j - 1];
                j -= 1;
            }
        }
        self.index();
    }

    fn index(&mut self) {
        self.starts.clear();
        if self.sorted.len() < DIRECTORY_FROM {
            self.starts.shrink_to_fit();
            return;
        }
        let runs = 1usize << DIRECTORY_BITS;
        self.starts.reserve_exact(runs + 1);
        let mut at = 0;
        for top in 0..runs {
            while at < self.sorted.len()
                && ((self.sorted[at] >> (128 - DIRECTORY_BITS)) as usize) < top
            {
                at += 1;
            }
            self.starts.push(at);
        }
        self.starts.push(self.sorted.len());
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Reproducible ids (splitmix64 fills).
    fn ids(seed: u64, n: usize) -> Vec<[u8; 32]> {
        let mut x = seed;
        let mut next = || {
            x = x.wrapping_add(0x9e37_79b9_7f4a_7c15);
            let mut z = x;
            z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
            z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
            z ^ (z >> 31)
        };
        (0..n)
            .map(|_| {
                let mut id = [0u8; 32];
                for c in id.chunks_mut(8) {
                    c.copy_from_slice(&next().to_le_bytes());
                }
                id
            })
            .collect()
    }

    fn check_against(set: &IdSet, reference: &HashSet<[u8; 32]>, probes: &[[u8; 32]]) {
        assert_eq!(set.len(), reference.len());
        for id in reference {
            assert!(set.contains(id));
        }
        for id in probes {
            assert_eq!(set.contains(id), reference.contains(id));
        }
    }

    #[test]
    fn answers_as_a_set_of_whole_ids_small_and_large() {
        for n in [0, 1, 5, 1000, 70_000, 200_000] {
            let all = ids(n as u64, n);
            let mut with_dups = all.clone();
            with_dups.extend_from_slice(&all[..n / 3]);
            let set = IdSet::from_prefixes(with_dups.iter().map(prefix).collect());
            assert_eq!(set.starts.is_empty(), n < DIRECTORY_FROM);
            let reference: HashSet<[u8; 32]> = all.iter().copied().collect();
            check_against(&set, &reference, &ids(999, 5000));
        }
    }

    #[test]
    fn ids_added_later_are_found_and_merged_in_order() {
        let first = ids(1, 100_000);
        let mut set = IdSet::from_prefixes(first.iter().map(prefix).collect());
        let mut reference: HashSet<[u8; 32]> = first.iter().copied().collect();
        // Batches that overlap what is there and each other, enough to merge
        // several times (a merge at 65,536 recent ids).
        for b in 0..6u64 {
            let mut batch = ids(100 + b, 30_000);
            batch.extend_from_slice(&first[(b as usize) * 1000..(b as usize) * 1000 + 500]);
            set.extend(batch.iter());
            reference.extend(batch.iter().copied());
            check_against(&set, &reference, &ids(500 + b, 2000));
        }
        assert!(set.sorted.len() > 100_000, "merged at least once");
        assert!(set.sorted.windows(2).all(|w| w[0] < w[1]));
        // Every directory entry points at the first prefix of its run.
        for (top, &at) in set.starts[..set.starts.len() - 1].iter().enumerate() {
            if at < set.sorted.len() {
                assert!((set.sorted[at] >> (128 - DIRECTORY_BITS)) as usize >= top);
            }
            if at > 0 {
                assert!(((set.sorted[at - 1] >> (128 - DIRECTORY_BITS)) as usize) < top);
            }
        }
    }

    #[test]
    fn only_the_first_128_bits_count() {
        let a = [7u8; 32];
        let mut b = a;
        b[31] = 8;
        let mut c = a;
        c[15] = 8;
        let set = IdSet::from_prefixes(vec![prefix(&a)]);
        assert!(set.contains(&b));
        assert!(!set.contains(&c));
    }

    #[test]
    fn sixteen_bytes_an_id() {
        let n = 300_000;
        let set = IdSet::from_prefixes(ids(3, n).iter().map(prefix).collect());
        assert!(set.bytes() <= n * 16 + (1 << 20), "{} bytes", set.bytes());
    }
}
