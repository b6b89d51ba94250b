//! Kept buffers for whole-object transfers (a pack sent to or received by a cairn
//! server).
//!
//! A fresh multi-MiB buffer per pack has the kernel map and zero every page of it
//! again, a page fault per 4 KiB: in a profile of a first backup through a server
//! that was an eighth of the server's CPU and showed on the client too. Buffers go
//! back to a small pool when their transfer is done and are reused.

use std::sync::{Arc, Mutex};

pub struct BufferPool {
    free: Mutex<Vec<Vec<u8>>>,
    /// Buffers with more capacity than this are freed, not kept.
    keep_max: usize,
    /// At most this many kept buffers.
    keep_count: usize,
}

impl BufferPool {
    pub fn new(keep_max: usize, keep_count: usize) -> Arc<BufferPool> {
        Arc::new(BufferPool {
            free: Mutex::new(Vec::new()),
            keep_max,
            keep_count,
        })
    }

    /// A buffer with room for `at_least` bytes: the smallest kept one that fits,
    /// else a kept one grown, else a new one. Its length is how much of it was ever
    /// written (kept, so that filling it again does not zero it first).
    fn take(&self, at_least: usize) -> Vec<u8> {
        let mut buf = {
            let mut free = self.free.lock().unwrap_or_else(|e| e.into_inner());
            let pick = free
                .iter()
                .enumerate()
                .filter(|(_, b)| b.capacity() >= at_least)
                .min_by_key(|(_, b)| b.capacity())
                .map(|(i, _)| i)
                .or(if free.is_empty() { None } else { Some(0) });
            pick.map(|i| free.swap_remove(i)).unwrap_or_default()
        };
        if buf.capacity() < at_least {
            // Grown: what it held is not needed, so it is not copied over.
            buf.clear();
            buf.reserve(at_least);
        }
        buf
    }

    fn give(&self, buf: Vec<u8>) {
        if buf.capacity() == 0 || buf.capacity() > self.keep_max {
            return;
        }
        let mut free = self.free.lock().unwrap_or_else(|e| e.into_inner());
        if free.len() < self.keep_count {
            free.push(buf);
        }
    }
}

/// A buffer from a pool, given back on drop. Its content starts 4 KiB-aligned in
/// memory (as long as it grows within the room asked for), so that a local
/// repository writes it, or reads into it, with `O_DIRECT` without a copy.
pub struct Pooled {
    /// The content is `buf[start..end]`; what lies beyond `end` was written before
    /// (a kept buffer is refilled without zeroing it again).
    buf: Vec<u8>,
    start: usize,
    end: usize,
    pool: Arc<BufferPool>,
}

impl Pooled {
    /// An empty buffer with room for `at_least` bytes.
    pub fn new(pool: &Arc<BufferPool>, at_least: usize) -> Pooled {
        let a = crate::direct::DIRECT_ALIGN as usize;
        let mut buf = pool.take(at_least.saturating_add(a));
        let start = buf.as_ptr().align_offset(a) % a;
        if buf.len() < start {
            buf.resize(start, 0);
        }
        Pooled {
            buf,
            start,
            end: start,
            pool: pool.clone(),
        }
    }

    /// A copy of `data`.
    pub fn copy_of(pool: &Arc<BufferPool>, data: &[u8]) -> Pooled {
        let mut p = Pooled::new(pool, data.len());
        p.extend_from_slice(data);
        p
    }

    pub fn extend_from_slice(&mut self, data: &[u8]) {
        let written = (self.buf.len() - self.end).min(data.len());
        let (over, beyond) = data.split_at(written);
        self.buf[self.end..self.end + written].copy_from_slice(over);
        self.buf.extend_from_slice(beyond);
        self.end += data.len();
    }

    /// Moves the buffer out (to a task that must own what it fills), leaving an
    /// empty one without memory in its place.
    pub fn detach(&mut self) -> Pooled {
        let (start, end) = (self.start, self.end);
        (self.start, self.end) = (0, 0);
        Pooled {
            buf: std::mem::take(&mut self.buf),
            start,
            end,
            pool: self.pool.clone(),
        }
    }

    /// Empties it, with room for `at_least` bytes from an aligned start (a larger
    /// buffer is made when it has not the room: what it held is not kept).
    pub fn clear_for(&mut self, at_least: usize) {
        let a = crate::direct::DIRECT_ALIGN as usize;
        if self.buf.capacity() < self.start.saturating_add(at_least) {
            let mut buf = Vec::with_capacity(at_least.saturating_add(a));
            self.start = crate::direct::pad_to_align(&mut buf);
            self.pool.give(std::mem::replace(&mut self.buf, buf));
        }
        self.end = self.start;
    }

    /// The content made `len` bytes long, to be overwritten: what they hold is
    /// unspecified (earlier content or zeros), and only bytes this buffer never
    /// held are zeroed.
    pub fn fill(&mut self, len: usize) -> &mut [u8] {
        self.clear_for(len);
        self.end = self.start + len;
        if self.buf.len() < self.end {
            self.buf.resize(self.end, 0);
        }
        &mut self.buf[self.start..self.end]
    }
}

impl std::ops::Deref for Pooled {
    type Target = [u8];
    fn deref(&self) -> &[u8] {
        &self.buf[self.start..self.end]
    }
}

impl std::ops::DerefMut for Pooled {
    fn deref_mut(&mut self) -> &mut [u8] {
        &mut self.buf[self.start..self.end]
    }
}

impl AsRef<[u8]> for Pooled {
    fn as_ref(&self) -> &[u8] {
        self
    }
}

impl std::fmt::Debug for Pooled {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Pooled({} bytes)", self.len())
    }
}

impl Drop for Pooled {
    fn drop(&mut self) {
        self.pool.give(std::mem::take(&mut self.buf));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn buffers_come_back_and_are_reused_within_bounds() {
        let pool = BufferPool::new(1 << 20, 1);
        let a = Pooled::copy_of(&pool, &[7u8; 5000]);
        assert_eq!(&a[..], &[7u8; 5000][..]);
        assert_eq!(
            a.as_ptr().align_offset(4096),
            0,
            "the content starts aligned"
        );
        let ptr = a.as_ptr();
        drop(a);
        let b = Pooled::copy_of(&pool, &[1u8; 10]);
        assert_eq!(&b[..], &[1u8; 10][..]);
        assert_eq!(b.as_ptr(), ptr, "the kept buffer was reused");
        // Only one is kept, and nothing larger than keep_max.
        let c = Pooled::copy_of(&pool, &[2u8; 10]);
        drop((b, c));
        assert_eq!(pool.free.lock().unwrap().len(), 1);
        let big = Pooled::new(&pool, 2 << 20);
        drop(pool.free.lock().unwrap().pop());
        drop(big);
        assert!(pool.free.lock().unwrap().is_empty());
    }

    #[test]
    fn a_kept_buffer_is_refilled_in_place_and_stays_aligned() {
        let pool = BufferPool::new(1 << 20, 2);
        let mut r = Pooled::new(&pool, 0);
        r.fill(10_000).copy_from_slice(&[3u8; 10_000]);
        let ptr = r.as_ptr();
        assert_eq!(ptr.align_offset(4096), 0);
        // Smaller, then as large again: same memory, the length it was told.
        assert_eq!(r.fill(100).len(), 100);
        assert_eq!(r.fill(10_000).len(), 10_000);
        assert_eq!(r.as_ptr(), ptr);
        // Larger than its room: a new aligned buffer.
        assert_eq!(r.fill(200_000).len(), 200_000);
        assert_eq!(r.as_ptr().align_offset(4096), 0);
        r.clear_for(5);
        assert!(r.is_empty());
        drop(r);
        // A kept buffer that held more: appending writes over the old bytes.
        let mut b = Pooled::copy_of(&pool, &[9u8; 3]);
        b.extend_from_slice(&[8u8; 4]);
        assert_eq!(&b[..], &[9, 9, 9, 8, 8, 8, 8]);
        assert_eq!(b.as_ptr().align_offset(4096), 0);
    }
}
