//! Every block size's chunking in one pass over the data, for planning tools
//! (`cairn estimate`): the same cut statistics as [`crate::Chunker`] at each size,
//! for a fraction of the cost of running one chunker per size.

use fastcdc::v2020::get_gear_with_seed;

/// Every block size's content-defined chunking in one pass over the data.
///
/// A datastore's chunker is FastCDC: from a chunk's start it skips `min` bytes,
/// then cuts at the first position where a gear hash (`h = (h << 1) + gear[byte]`,
/// which depends only on the last 64 bytes) has zero bits under a mask — a stricter
/// mask before `avg`, a looser one after — or at `max`. Five such chunkers would
/// compute five gear hashes over the same bytes. Here one hash serves them all:
/// the masks are the top bits of the hash (the stricter the mask, the more bits),
/// so they are nested, and a position where the loosest mask's bits are not zero —
/// all but one in two thousand — cannot be a cut point for any block size. Only
/// the rare positions that pass it (and forced cuts at `max`) look at each block
/// size's state. Cut probabilities, minimum, average and maximum are those of the
/// datastore's chunker (normalisation level 1), so the chunks are statistically
/// the same; their exact boundaries differ anyway (a datastore's gear table is
/// derived from its key).
pub struct MultiChunker {
    gear: [u64; 256],
    lanes: Vec<LaneParams>,
    loose: u64,
}

struct LaneParams {
    min: usize,
    avg: usize,
    max: usize,
    mask_strict: u64,
    mask_loose: u64,
}

fn top_bits(n: u32) -> u64 {
    if n == 0 { 0 } else { !0u64 << (64 - n.min(64)) }
}

impl MultiChunker {
    /// One lane per `(min, avg, max)` (`avg` a power of two, as every block size
    /// is), in the order given.
    pub fn new(params: &[(u32, u32, u32)]) -> Self {
        // Any random table gives the same cut statistics; FastCDC's own (seed 0).
        let (table, _) = get_gear_with_seed(0);
        let mut gear = [0u64; 256];
        gear.copy_from_slice(&table[..256]);
        let lanes: Vec<LaneParams> = params
            .iter()
            .map(|&(min, avg, max)| {
                let bits = avg.trailing_zeros();
                LaneParams {
                    min: min as usize,
                    avg: avg as usize,
                    max: max as usize,
                    mask_strict: top_bits(bits + 1),
                    mask_loose: top_bits(bits.saturating_sub(1)),
                }
            })
            .collect();
        let loose = lanes.iter().map(|l| l.mask_loose).fold(!0u64, |a, m| a & m);
        MultiChunker { gear, lanes, loose }
    }

    /// Appends the chunk lengths of `data` (a whole file or range) to `out`, one
    /// list per block size; each list sums to `data.len()`.
    pub fn cut(&self, data: &[u8], out: &mut [Vec<u32>]) {
        let n = data.len();
        let mut start = vec![0usize; self.lanes.len()];
        let mut deadline = self.lanes.iter().map(|l| l.max).min().unwrap_or(usize::MAX);
        let mut h = 0u64;
        for (i, &b) in data.iter().enumerate() {
            h = (h << 1).wrapping_add(self.gear[b as usize]);
            if h & self.loose != 0 && i < deadline {
                continue;
            }
            deadline = usize::MAX;
            for ((l, s), o) in self.lanes.iter().zip(start.iter_mut()).zip(out.iter_mut()) {
                let mut len = i - *s;
                if len >= l.max {
                    o.push(l.max as u32);
                    *s += l.max;
                    len = i - *s;
                }
                if len >= l.min {
                    let m = if len < l.avg {
                        l.mask_strict
                    } else {
                        l.mask_loose
                    };
                    if h & m == 0 {
                        o.push(len as u32);
                        *s = i;
                    }
                }
                deadline = deadline.min(*s + l.max);
            }
        }
        for ((l, s), o) in self.lanes.iter().zip(start.iter_mut()).zip(out.iter_mut()) {
            while n - *s > l.max {
                o.push(l.max as u32);
                *s += l.max;
            }
            if n > *s {
                o.push((n - *s) as u32);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// min/avg/max of the repository block sizes 4 to 64 KiB (min = avg/4, max = 4*avg).
    const PARAMS: [(u32, u32, u32); 5] = [
        (1024, 4096, 16384),
        (2048, 8192, 32768),
        (4096, 16384, 65536),
        (8192, 32768, 131072),
        (16384, 65536, 262144),
    ];

    fn noise(n: usize, mut x: u64) -> Vec<u8> {
        let mut v = Vec::with_capacity(n + 8);
        while v.len() < n {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            v.extend_from_slice(&x.to_le_bytes());
        }
        v.truncate(n);
        v
    }

    #[test]
    fn one_pass_chunking_has_each_block_sizes_bounds_and_average_and_resynchronises() {
        let m = MultiChunker::new(&PARAMS);
        let data = noise(32 << 20, 11);
        let mut out = vec![Vec::new(); PARAMS.len()];
        m.cut(&data, &mut out);
        for (lens, &(min, b, max)) in out.iter().zip(&PARAMS) {
            assert_eq!(lens.iter().map(|&l| l as usize).sum::<usize>(), data.len());
            let (last, body) = lens.split_last().unwrap();
            assert!(*last <= max);
            assert!(body.iter().all(|&l| l >= min && l <= max), "{b}");
            let avg = data.len() as f64 / lens.len() as f64 / b as f64;
            assert!(
                (0.8..1.6).contains(&avg),
                "{b}: average {avg} of the block size"
            );
        }
        // Bytes inserted at the front change only the first chunks.
        let mut shifted = noise(1000, 3);
        shifted.extend_from_slice(&data);
        let mut out2 = vec![Vec::new(); PARAMS.len()];
        m.cut(&shifted, &mut out2);
        for (a, b) in out.iter().zip(&out2) {
            let tail = |v: &Vec<u32>| v[v.len() - 100..].to_vec();
            assert_eq!(tail(a), tail(b));
        }
    }
}
