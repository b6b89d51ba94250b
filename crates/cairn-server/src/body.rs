//! Upload bodies read into reused buffers.
//!
//! A pack is a few MiB to a few hundred; collecting each into a fresh buffer had
//! the kernel map and zero every page of it again (a page fault per 4 KiB: an
//! eighth of the server's CPU in a profile of a first backup). Buffers up to
//! [`KEEP_MAX`] go back to a small pool when their request is done.

use std::sync::{Arc, Mutex};

/// Buffers larger than this are freed, not kept.
const KEEP_MAX: usize = 64 << 20;
/// At most this many kept buffers.
const KEEP_COUNT: usize = 4;

#[derive(Default)]
pub struct BodyPool {
    free: Mutex<Vec<Vec<u8>>>,
}

/// A body read from a request; its buffer returns to the pool on drop.
pub struct Body {
    buf: Vec<u8>,
    pool: Arc<BodyPool>,
}

impl std::ops::Deref for Body {
    type Target = [u8];
    fn deref(&self) -> &[u8] {
        &self.buf
    }
}

impl Drop for Body {
    fn drop(&mut self) {
        let mut buf = std::mem::take(&mut self.buf);
        if buf.capacity() <= KEEP_MAX {
            buf.clear();
            let mut free = self.pool.free.lock().unwrap_or_else(|e| e.into_inner());
            if free.len() < KEEP_COUNT {
                free.push(buf);
            }
        }
    }
}

/// Why a body could not be read.
pub enum ReadError {
    /// More than the limit.
    TooLarge,
    /// The client went away or sent a broken body.
    Broken(String),
}

impl BodyPool {
    /// Reads `body` whole, refusing more than `max` bytes; `expected`: the
    /// Content-Length, when sent (only a hint for the buffer's size).
    pub async fn read(
        self: &Arc<Self>,
        body: axum::body::Body,
        max: u64,
        expected: Option<u64>,
    ) -> Result<Body, ReadError> {
        use http_body_util::BodyExt;
        let want = expected.unwrap_or(0).min(max) as usize;
        let buf = {
            let mut free = self.free.lock().unwrap_or_else(|e| e.into_inner());
            // The smallest kept buffer that fits, else any (it grows).
            let pick = free
                .iter()
                .enumerate()
                .filter(|(_, b)| b.capacity() >= want)
                .min_by_key(|(_, b)| b.capacity())
                .map(|(i, _)| i)
                .or(if free.is_empty() { None } else { Some(0) });
            pick.map(|i| free.swap_remove(i)).unwrap_or_default()
        };
        let mut out = Body {
            buf,
            pool: self.clone(),
        };
        out.buf.reserve(want);
        let mut body = body;
        while let Some(frame) = body.frame().await {
            let frame = frame.map_err(|e| ReadError::Broken(e.to_string()))?;
            if let Ok(data) = frame.into_data() {
                if (out.buf.len() + data.len()) as u64 > max {
                    return Err(ReadError::TooLarge);
                }
                out.buf.extend_from_slice(&data);
            }
        }
        Ok(out)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bodies_are_read_whole_bounded_and_their_buffers_reused() {
        let rt = tokio::runtime::Builder::new_current_thread()
            .build()
            .unwrap();
        let pool = Arc::new(BodyPool::default());
        rt.block_on(async {
            let b = pool
                .read(axum::body::Body::from(vec![7u8; 5000]), 5000, Some(5000))
                .await
                .ok()
                .unwrap();
            assert_eq!(&b[..], &[7u8; 5000][..]);
            let ptr = b.as_ptr();
            drop(b);
            let again = pool
                .read(axum::body::Body::from(vec![1u8; 10]), 100, Some(10))
                .await
                .ok()
                .unwrap();
            assert_eq!(&again[..], &[1u8; 10][..]);
            assert_eq!(again.as_ptr(), ptr, "the buffer came back");
            assert!(matches!(
                pool.read(axum::body::Body::from(vec![0u8; 101]), 100, None)
                    .await,
                Err(ReadError::TooLarge)
            ));
        });
    }
}
