//! The blocked Bloom filter kept in RAM: "certainly new" for most new chunks
//! without touching the disk.

use super::*;

pub(crate) fn prefix_of(id: &[u8]) -> u64 {
    let mut b = [0u8; 8];
    b.copy_from_slice(&id[..8]);
    u64::from_be_bytes(b)
}

pub(super) fn mix(mut x: u64) -> u64 {
    // splitmix64's finaliser: the filter's probes from the id prefix, the
    // estimate's gear table from a counter.
    x ^= x >> 30;
    x = x.wrapping_mul(0xbf58_476d_1ce4_e5b9);
    x ^= x >> 27;
    x = x.wrapping_mul(0x94d0_49bb_1331_11eb);
    x ^ (x >> 31)
}

/// A blocked Bloom filter: each key sets [`FILTER_PROBES`] bits in one 512-bit
/// block, so a query touches one cache line.
pub(crate) struct Filter {
    pub(super) blocks: Vec<[u64; 8]>,
}

impl Filter {
    pub(crate) fn with_capacity(n: u64) -> Self {
        let blocks = (n * FILTER_BITS_PER_BLOB).div_ceil(512).max(1) as usize;
        Filter {
            blocks: vec![[0u64; 8]; blocks],
        }
    }
    pub(super) fn probes(&self, prefix: u64) -> (usize, [u32; FILTER_PROBES as usize]) {
        let h = mix(prefix);
        let block = ((u128::from(h) * self.blocks.len() as u128) >> 64) as usize;
        let mut g = mix(h ^ 0x9e37_79b9_7f4a_7c15);
        let mut bits = [0u32; FILTER_PROBES as usize];
        for b in bits.iter_mut() {
            *b = (g & 511) as u32;
            g = g.rotate_right(9);
        }
        (block, bits)
    }
    pub(crate) fn insert(&mut self, prefix: u64) {
        let (block, bits) = self.probes(prefix);
        let blk = &mut self.blocks[block];
        for b in bits {
            blk[(b / 64) as usize] |= 1 << (b % 64);
        }
    }
    pub(crate) fn may_contain(&self, prefix: u64) -> bool {
        let (block, bits) = self.probes(prefix);
        let blk = &self.blocks[block];
        bits.iter()
            .all(|b| blk[(b / 64) as usize] & (1 << (b % 64)) != 0)
    }
    pub(super) fn to_bytes(&self) -> Vec<u8> {
        self.blocks
            .iter()
            .flat_map(|b| b.iter().flat_map(|w| w.to_le_bytes()))
            .collect()
    }
    pub(super) fn from_bytes(data: &[u8]) -> Option<Self> {
        if data.is_empty() || !data.len().is_multiple_of(64) {
            return None;
        }
        let blocks = data
            .chunks_exact(64)
            .map(|c| {
                let mut b = [0u64; 8];
                for (w, bytes) in b.iter_mut().zip(c.chunks_exact(8)) {
                    let mut a = [0u8; 8];
                    a.copy_from_slice(bytes);
                    *w = u64::from_le_bytes(a);
                }
                b
            })
            .collect();
        Some(Filter { blocks })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::index::ssd::tests::Gen;
    #[test]
    fn the_filter_has_no_false_negatives_and_few_false_positives() {
        let mut f = Filter::with_capacity(100_000);
        let mut g = Gen(7);
        let ids: Vec<u64> = (0..100_000).map(|_| prefix_of(&g.id().0)).collect();
        for p in &ids {
            f.insert(*p);
        }
        assert!(ids.iter().all(|p| f.may_contain(*p)));
        let fp = (0..100_000)
            .filter(|_| f.may_contain(prefix_of(&g.id().0)))
            .count();
        assert!(fp < 2_500, "{fp} false positives in 100,000");
        let back = Filter::from_bytes(&f.to_bytes()).unwrap();
        assert!(ids.iter().all(|p| back.may_contain(*p)));
    }
}
