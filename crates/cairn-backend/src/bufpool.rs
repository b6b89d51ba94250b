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

    /// An empty buffer with room for `at_least` bytes: the smallest kept one that
    /// fits, else a kept one grown, else a new one.
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
        buf.reserve(at_least);
        buf
    }

    fn give(&self, mut buf: Vec<u8>) {
        if buf.capacity() > self.keep_max {
            return;
        }
        buf.clear();
        let mut free = self.free.lock().unwrap_or_else(|e| e.into_inner());
        if free.len() < self.keep_count {
            free.push(buf);
        }
    }
}

/// A buffer from a pool, given back on drop. Its content starts 4 KiB-aligned in
/// memory (as long as it grows within the room asked for), so that a local
/// repository writes it with `O_DIRECT` without copying it first.
pub struct Pooled {
    /// The content is `buf[start..]`.
    buf: Vec<u8>,
    start: usize,
    pool: Arc<BufferPool>,
}

impl Pooled {
    /// An empty buffer with room for `at_least` bytes.
    pub fn new(pool: &Arc<BufferPool>, at_least: usize) -> Pooled {
        let mut buf = pool.take(at_least.saturating_add(crate::direct::DIRECT_ALIGN as usize));
        let start = crate::direct::pad_to_align(&mut buf);
        Pooled {
            buf,
            start,
            pool: pool.clone(),
        }
    }

    /// A copy of `data`.
    pub fn copy_of(pool: &Arc<BufferPool>, data: &[u8]) -> Pooled {
        let mut p = Pooled::new(pool, data.len());
        p.buf.extend_from_slice(data);
        p
    }

    pub fn extend_from_slice(&mut self, data: &[u8]) {
        self.buf.extend_from_slice(data);
    }
}

impl std::ops::Deref for Pooled {
    type Target = [u8];
    fn deref(&self) -> &[u8] {
        &self.buf[self.start..]
    }
}

impl AsRef<[u8]> for Pooled {
    fn as_ref(&self) -> &[u8] {
        self
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
}
