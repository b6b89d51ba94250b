//! Sans-IO content-defined chunking.
//!
//! The cut-point search is FastCDC v2020 with normalisation (from the `fastcdc`
//! crate); what this crate adds is the *feeding* contract: a boundary is reported only
//! when no further input could move it, so the chunks of a stream are the same whether
//! it arrives whole, byte by byte or in random slices. The gear table is seeded from
//! the repository key so that chunk lengths do not fingerprint known content.
//!
//! Why a boundary is final: FastCDC scans from `min` and stops at the first position
//! whose hash matches the mask that applies there (strict before `avg`, relaxed after),
//! or at `max`. A match found inside the buffer is found at the same place with more
//! input; only "reached the end of the buffer without a match, before `max`" depends
//! on input not yet seen, and that is exactly when [`Chunker::next_boundary`] asks for
//! more.

pub mod multi;

use fastcdc::v2020::{Normalization, cut_gear, get_gear_with_seed, select_masks};
use std::borrow::Cow;

/// Chunker parameters and seeded gear tables.
#[derive(Clone, Debug)]
pub struct Chunker {
    min: usize,
    avg: usize,
    max: usize,
    mask_s: u64,
    mask_l: u64,
    gear: Cow<'static, [u64]>,
    gear_ls: Cow<'static, [u64]>,
}

impl Chunker {
    /// `min`, `avg`, `max` must be even, with `64 <= min < avg < max <= 16 MiB`; the
    /// repository config validates them before a chunker is built.
    pub fn new(min: u32, avg: u32, max: u32, normalization: u32, seed: u64) -> Self {
        let level = match normalization {
            0 => Normalization::Level0,
            1 => Normalization::Level1,
            2 => Normalization::Level2,
            _ => Normalization::Level3,
        };
        let (mask_s, mask_l) = select_masks(avg as usize, level);
        let (gear, gear_ls) = get_gear_with_seed(seed);
        Chunker {
            min: min as usize,
            avg: avg as usize,
            max: max as usize,
            mask_s,
            mask_l,
            gear,
            gear_ls,
        }
    }

    pub fn max_size(&self) -> usize {
        self.max
    }

    /// Length of the next chunk at the start of `buf`, or `None` when more input is
    /// needed to decide. With `eof` set, the rest of `buf` (if any) is the last chunk.
    pub fn next_boundary(&self, buf: &[u8], eof: bool) -> Option<usize> {
        if buf.is_empty() {
            return None;
        }
        let (_, len) = cut_gear(
            buf,
            self.min,
            self.avg,
            self.max,
            self.mask_s,
            self.mask_l,
            self.mask_s << 1,
            self.mask_l << 1,
            &self.gear,
            &self.gear_ls,
        );
        if len < buf.len() || len >= self.max || eof {
            Some(len)
        } else {
            None
        }
    }

    /// All chunk lengths of a complete input (convenience for tests and estimates).
    pub fn split_all(&self, mut data: &[u8]) -> Vec<usize> {
        let mut out = Vec::new();
        while let Some(n) = self.next_boundary(data, true) {
            out.push(n);
            data = &data[n..];
        }
        out
    }
}

/// Feeds a stream through a chunker with a reusable buffer; yields complete chunks.
/// This is the incremental form used by backup: call [`StreamChunker::push`] with
/// whatever the reader returned, then drain [`StreamChunker::next_chunk`].
pub struct StreamChunker {
    chunker: Chunker,
    /// Input lives in `buf[start..end]`; `buf` only grows (its tail is scratch space
    /// for [`StreamChunker::spare`], so reads land in place without an extra copy).
    buf: Vec<u8>,
    start: usize,
    end: usize,
    eof: bool,
}

impl StreamChunker {
    pub fn new(chunker: Chunker) -> Self {
        StreamChunker {
            chunker,
            buf: Vec::new(),
            start: 0,
            end: 0,
            eof: false,
        }
    }

    /// Moves undecided bytes to the front and makes room for `n` more.
    fn make_room(&mut self, n: usize) {
        if self.start > 0 {
            self.buf.copy_within(self.start..self.end, 0);
            self.end -= self.start;
            self.start = 0;
        }
        if self.buf.len() < self.end + n {
            self.buf.resize(self.end + n, 0);
        }
    }

    /// Appends input. Memory stays at about one read plus one maximum chunk.
    pub fn push(&mut self, data: &[u8]) {
        self.make_room(data.len());
        self.buf[self.end..self.end + data.len()].copy_from_slice(data);
        self.end += data.len();
    }

    /// A writable space of `n` bytes after the pending input: read into it, then call
    /// [`StreamChunker::commit`] with the number of bytes read.
    pub fn spare(&mut self, n: usize) -> &mut [u8] {
        self.make_room(n);
        &mut self.buf[self.end..self.end + n]
    }

    /// Marks `n` bytes of the last [`StreamChunker::spare`] as input.
    pub fn commit(&mut self, n: usize) {
        self.end = (self.end + n).min(self.buf.len());
    }

    pub fn finish(&mut self) {
        self.eof = true;
    }

    /// Bytes waiting for a decision.
    pub fn pending(&self) -> usize {
        self.end - self.start
    }

    pub fn next_chunk(&mut self) -> Option<&[u8]> {
        let rest = &self.buf[self.start..self.end];
        let n = self.chunker.next_boundary(rest, self.eof)?;
        let s = self.start;
        self.start += n;
        Some(&self.buf[s..s + n])
    }

    /// Clears state for the next stream, keeping the buffer's allocation.
    pub fn reset(&mut self) {
        self.start = 0;
        self.end = 0;
        self.eof = false;
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn data(seed: u64, len: usize) -> Vec<u8> {
        // xorshift, with runs of repeated bytes so some regions are low-entropy
        let mut x = seed | 1;
        let mut out = Vec::with_capacity(len);
        while out.len() < len {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            if x.is_multiple_of(17) {
                out.extend(std::iter::repeat_n(
                    (x >> 8) as u8,
                    (x >> 16) as usize % 3000,
                ));
            } else {
                out.extend_from_slice(&x.to_le_bytes());
            }
        }
        out.truncate(len);
        out
    }

    fn chunker(seed: u64) -> Chunker {
        Chunker::new(1024, 4096, 16384, 1, seed)
    }

    fn stream_lengths(c: &Chunker, input: &[u8], slices: &[usize]) -> Vec<usize> {
        let mut s = StreamChunker::new(c.clone());
        let mut out = Vec::new();
        let mut pos = 0;
        let mut i = 0;
        while pos < input.len() {
            let n = slices[i % slices.len()].max(1).min(input.len() - pos);
            i += 1;
            s.push(&input[pos..pos + n]);
            pos += n;
            while let Some(ch) = s.next_chunk() {
                out.push(ch.len());
            }
        }
        s.finish();
        while let Some(ch) = s.next_chunk() {
            out.push(ch.len());
        }
        out
    }

    #[test]
    fn golden_boundaries() {
        // Frozen test vector (docs/FORMAT.md, "Chunker"): seed 0, 64 KiB of the
        // generator above, 1/4/16 KiB parameters. Changing it breaks dedup against
        // existing repositories.
        let c = chunker(0);
        let lens = c.split_all(&data(42, 65536));
        assert_eq!(lens.iter().sum::<usize>(), 65536);
        let expected: Vec<usize> = GOLDEN.to_vec();
        assert_eq!(lens, expected);
    }

    const GOLDEN: &[usize] = &[16384, 16384, 10877, 15329, 2203, 4359];

    #[test]
    fn sizes_within_bounds_and_seed_matters() {
        // pure pseudo-random input: no low-entropy runs
        let mut x = 7u64;
        let input: Vec<u8> = (0..1 << 20)
            .map(|_| {
                x = x
                    .wrapping_mul(6364136223846793005)
                    .wrapping_add(1442695040888963407);
                (x >> 56) as u8
            })
            .collect();
        let a = chunker(1).split_all(&input);
        let b = chunker(2).split_all(&input);
        assert_ne!(a, b);
        for (i, n) in a.iter().enumerate() {
            assert!(*n <= 16384);
            if i + 1 < a.len() {
                assert!(*n >= 1024, "chunk {i} is {n} bytes");
            }
        }
        let avg = input.len() / a.len();
        assert!((2048..8192).contains(&avg), "average {avg}");
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(64))]
        #[test]
        fn boundaries_independent_of_feeding(seed: u64, len in 0usize..200_000, slices in proptest::collection::vec(1usize..70_000, 1..8)) {
            let c = chunker(seed);
            let input = data(seed, len);
            let whole = c.split_all(&input);
            prop_assert_eq!(stream_lengths(&c, &input, &[usize::MAX]), whole.clone());
            prop_assert_eq!(stream_lengths(&c, &input, &slices), whole);
        }
    }

    #[test]
    fn spare_and_commit_feeding_matches() {
        let c = chunker(3);
        let input = data(3, 300_000);
        let mut s = StreamChunker::new(c.clone());
        let mut out = Vec::new();
        let mut pos = 0;
        for step in [1usize, 7000, 65536, 100, 1 << 20].iter().cycle() {
            if pos >= input.len() {
                break;
            }
            let n = (*step).min(input.len() - pos);
            // Ask for more room than is filled, as a short read would.
            s.spare(n + 100)[..n].copy_from_slice(&input[pos..pos + n]);
            s.commit(n);
            pos += n;
            while let Some(ch) = s.next_chunk() {
                out.push(ch.len());
            }
        }
        s.finish();
        while let Some(ch) = s.next_chunk() {
            out.push(ch.len());
        }
        assert_eq!(out, c.split_all(&input));
    }

    #[test]
    fn byte_by_byte_feeding() {
        let c = chunker(9);
        let input = data(9, 40_000);
        assert_eq!(stream_lengths(&c, &input, &[1]), c.split_all(&input));
    }
}
