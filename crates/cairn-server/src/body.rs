//! Upload bodies read into reused buffers ([`cairn_backend::bufpool`]: a fresh
//! buffer per pack cost a page fault per 4 KiB, an eighth of the server's CPU in a
//! profile of a first backup).

use cairn_backend::bufpool::{BufferPool, Pooled};
use std::sync::Arc;

/// Buffers larger than this are freed, not kept; at most this many are kept.
const KEEP_MAX: usize = 64 << 20;
const KEEP_COUNT: usize = 4;

/// Range reads (a restore's, ranges of at most a few MiB) kept for answers: a few
/// per reading client.
const READ_KEEP_MAX: usize = 32 << 20;
const READ_KEEP_COUNT: usize = 8;

/// The memory upload bodies being received may take together, in KiB (the unit
/// of its permits): four of the largest object, at least 256 MiB. Each upload
/// reserves its announced length before its body is read (the largest object's
/// when it announces none), so that many clients sending at once wait instead of
/// the server buffering them all; and one token reserves at most half of it, so
/// that uploads sent slowly by one client do not stall every other.
pub struct UploadBudget {
    all: Arc<tokio::sync::Semaphore>,
    total: u32,
    tokens: std::sync::Mutex<std::collections::HashMap<String, Arc<tokio::sync::Semaphore>>>,
}

/// What an upload holds of the budget until it is dropped.
pub struct Reserved {
    _token: tokio::sync::OwnedSemaphorePermit,
    _all: tokio::sync::OwnedSemaphorePermit,
}

impl UploadBudget {
    pub fn new(max_object_size: u64) -> UploadBudget {
        let kib = (max_object_size.saturating_mul(4).max(256 << 20) / 1024)
            .min(tokio::sync::Semaphore::MAX_PERMITS as u64)
            .min(u64::from(u32::MAX)) as u32;
        UploadBudget {
            all: Arc::new(tokio::sync::Semaphore::new(kib as usize)),
            total: kib,
            tokens: Default::default(),
        }
    }

    /// Waits until `len` bytes fit the token's share and the whole budget (an
    /// upload larger than the share takes all of the share, so it waits for the
    /// token's other uploads to end, and its whole length, up to the whole budget,
    /// of the budget). `None` when stopping.
    pub async fn reserve(&self, token: &str, len: u64) -> Option<Reserved> {
        let share = (self.total / 2).max(1);
        let kib = u32::try_from(len.div_ceil(1024).max(1)).unwrap_or(u32::MAX);
        let mine = {
            let mut t = self.tokens.lock().unwrap_or_else(|e| e.into_inner());
            t.entry(token.to_string())
                .or_insert_with(|| Arc::new(tokio::sync::Semaphore::new(share as usize)))
                .clone()
        };
        let _token = mine.acquire_many_owned(kib.min(share)).await.ok()?;
        // The whole length from the budget (up to all of it): an object larger
        // than the share (an index file may be) holds what it will take.
        let _all = self
            .all
            .clone()
            .acquire_many_owned(kib.min(self.total))
            .await
            .ok()?;
        Some(Reserved { _token, _all })
    }
}

pub struct BodyPool {
    pool: Arc<BufferPool>,
    reads: Arc<BufferPool>,
}

impl Default for BodyPool {
    fn default() -> BodyPool {
        BodyPool {
            pool: BufferPool::new(KEEP_MAX, KEEP_COUNT),
            reads: BufferPool::new(READ_KEEP_MAX, READ_KEEP_COUNT),
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
    /// A buffer for an answer of about `len` bytes (a range read), back in the pool
    /// once the answer was sent.
    pub fn for_answer(&self, len: u64) -> Pooled {
        Pooled::new(
            &self.reads,
            usize::try_from(len).unwrap_or(0).min(READ_KEEP_MAX),
        )
    }

    /// Reads `body` whole, refusing more than `max` bytes; `expected`: the
    /// Content-Length, when sent (only a hint for the buffer's size).
    pub async fn read(
        &self,
        body: axum::body::Body,
        max: u64,
        expected: Option<u64>,
    ) -> Result<Pooled, ReadError> {
        self.read_within(body, max, expected, STALL).await
    }

    /// [`Self::read`], giving up when no bytes came for `stall`, or fewer than
    /// [`MIN_PER_STALL`] in any span of `stall`: an upload that stops sending (or
    /// trickles a byte now and then) holds its reservation of the upload budget
    /// and a place among the connections until it ends, so it is ended.
    pub async fn read_within(
        &self,
        body: axum::body::Body,
        max: u64,
        expected: Option<u64>,
        stall: std::time::Duration,
    ) -> Result<Pooled, ReadError> {
        use http_body_util::BodyExt;
        let mut out = Pooled::new(&self.pool, expected.unwrap_or(0).min(max) as usize);
        let mut body = body;
        let (mut span_start, mut span_bytes) = (tokio::time::Instant::now(), 0usize);
        loop {
            if span_start.elapsed() >= stall {
                if span_bytes < MIN_PER_STALL {
                    return Err(ReadError::Broken(format!(
                        "{span_bytes} bytes received in {} s (after {} bytes): too slow",
                        stall.as_secs(),
                        out.len()
                    )));
                }
                (span_start, span_bytes) = (tokio::time::Instant::now(), 0);
            }
            let frame = match tokio::time::timeout(stall, body.frame()).await {
                Ok(Some(f)) => f,
                Ok(None) => break,
                Err(_) => {
                    return Err(ReadError::Broken(format!(
                        "nothing received for {} s (after {} bytes)",
                        stall.as_secs(),
                        out.len()
                    )));
                }
            };
            let frame = frame.map_err(|e| ReadError::Broken(e.to_string()))?;
            if let Ok(data) = frame.into_data() {
                if (out.len() + data.len()) as u64 > max {
                    return Err(ReadError::TooLarge);
                }
                span_bytes += data.len();
                out.extend_from_slice(&data);
            }
        }
        Ok(out)
    }
}

/// How long an upload may send nothing before it is ended (a slow link sends
/// steadily; this is a client that stopped).
pub const STALL: std::time::Duration = std::time::Duration::from_secs(60);
/// Bytes an upload sends at least in every [`STALL`]: 64 KiB a minute, far below
/// the slowest uplink a backup goes over (a 640 kbit/s seed link sends 4.8 MB).
pub const MIN_PER_STALL: usize = 64 << 10;

/// A request body that is read to its end even when its handler did not want it
/// (a refusal sent before the upload: 401, 403, 413, 429).
///
/// Dropped unread, hyper ends the exchange early: over HTTP/2 it resets the
/// stream after the answer, over HTTP/1 it closes the connection with the
/// client's bytes unread, and the kernel's reset can reach the client before
/// the answer. Either way a client still sending (curl, a script, a proxy) sees
/// "stream error" or "connection reset" instead of the refusal. So the rest is
/// read and thrown away in the background, as much as [`DRAIN_MAX`] within
/// [`DRAIN_FOR`]; past that the exchange is ended as before.
pub struct Drained {
    inner: Option<hyper::body::Incoming>,
}

/// What is read of an unwanted body at most: more than the largest small object
/// and a default pack, so that a refused upload of one reaches its end.
pub const DRAIN_MAX: u64 = 32 << 20;
/// How long an unwanted body is read at most.
pub const DRAIN_FOR: std::time::Duration = std::time::Duration::from_secs(10);

impl Drained {
    pub fn new(body: hyper::body::Incoming) -> Drained {
        Drained { inner: Some(body) }
    }
}

impl http_body::Body for Drained {
    type Data = axum::body::Bytes;
    type Error = hyper::Error;

    fn poll_frame(
        self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<Option<Result<http_body::Frame<axum::body::Bytes>, hyper::Error>>> {
        match self.get_mut().inner.as_mut() {
            Some(b) => std::pin::Pin::new(b).poll_frame(cx),
            None => std::task::Poll::Ready(None),
        }
    }

    fn is_end_stream(&self) -> bool {
        self.inner.as_ref().is_none_or(|b| b.is_end_stream())
    }

    fn size_hint(&self) -> http_body::SizeHint {
        self.inner
            .as_ref()
            .map_or_else(|| http_body::SizeHint::with_exact(0), |b| b.size_hint())
    }
}

impl Drop for Drained {
    fn drop(&mut self) {
        use http_body::Body;
        let Some(body) = self.inner.take() else {
            return;
        };
        if body.is_end_stream() {
            return;
        }
        // Known too long to read: ended at once, as hyper would.
        if body.size_hint().lower() > DRAIN_MAX {
            return;
        }
        if let Ok(rt) = tokio::runtime::Handle::try_current() {
            rt.spawn(drain(body));
        }
    }
}

async fn drain(mut body: hyper::body::Incoming) {
    use http_body_util::BodyExt;
    let deadline = tokio::time::Instant::now() + DRAIN_FOR;
    let mut left = DRAIN_MAX;
    while let Ok(Some(Ok(frame))) = tokio::time::timeout_at(deadline, body.frame()).await {
        if let Some(data) = frame.data_ref() {
            match left.checked_sub(data.len() as u64) {
                Some(l) => left = l,
                None => return,
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A runtime with timers (the server's has them; body reads time out).
    fn runtime() -> tokio::runtime::Runtime {
        tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap()
    }

    /// A body that sends a few bytes, then nothing, never ending.
    struct Stuck(bool);

    impl axum::body::HttpBody for Stuck {
        type Data = axum::body::Bytes;
        type Error = std::convert::Infallible;
        fn poll_frame(
            mut self: std::pin::Pin<&mut Self>,
            _cx: &mut std::task::Context<'_>,
        ) -> std::task::Poll<Option<Result<http_body::Frame<axum::body::Bytes>, Self::Error>>>
        {
            if self.0 {
                return std::task::Poll::Pending;
            }
            self.0 = true;
            std::task::Poll::Ready(Some(Ok(http_body::Frame::data(
                axum::body::Bytes::from_static(b"some"),
            ))))
        }
    }

    /// A body that sends one byte every 20 ms, without end.
    struct Trickle(std::pin::Pin<Box<tokio::time::Sleep>>);

    impl axum::body::HttpBody for Trickle {
        type Data = axum::body::Bytes;
        type Error = std::convert::Infallible;
        fn poll_frame(
            mut self: std::pin::Pin<&mut Self>,
            cx: &mut std::task::Context<'_>,
        ) -> std::task::Poll<Option<Result<http_body::Frame<axum::body::Bytes>, Self::Error>>>
        {
            use std::future::Future;
            if self.0.as_mut().poll(cx).is_pending() {
                return std::task::Poll::Pending;
            }
            let next = tokio::time::Instant::now() + std::time::Duration::from_millis(20);
            self.0.as_mut().reset(next);
            std::task::Poll::Ready(Some(Ok(http_body::Frame::data(
                axum::body::Bytes::from_static(b"x"),
            ))))
        }
    }

    #[test]
    fn an_upload_that_trickles_is_ended() {
        let rt = runtime();
        rt.block_on(async {
            let pool = BodyPool::default();
            let body = axum::body::Body::new(Trickle(Box::pin(tokio::time::sleep(
                std::time::Duration::ZERO,
            ))));
            let r = pool
                .read_within(body, 1 << 20, None, std::time::Duration::from_millis(200))
                .await;
            match r {
                Err(ReadError::Broken(m)) => assert!(m.contains("too slow"), "{m}"),
                _ => panic!("a trickling upload was not ended"),
            }
        });
    }

    #[test]
    fn an_upload_that_stops_sending_is_ended() {
        let rt = runtime();
        rt.block_on(async {
            let pool = BodyPool::default();
            let body = axum::body::Body::new(Stuck(false));
            let r = pool
                .read_within(
                    body,
                    1 << 20,
                    Some(1000),
                    std::time::Duration::from_millis(100),
                )
                .await;
            match r {
                Err(ReadError::Broken(m)) => assert!(m.contains("after 4 bytes"), "{m}"),
                _ => panic!("a stalled upload was not ended"),
            }
        });
    }

    /// One token reserves at most half the budget; another token's upload goes
    /// ahead meanwhile, and the first's waits for its own to end.
    #[test]
    fn one_token_holds_at_most_half_the_upload_budget() {
        let rt = runtime();
        rt.block_on(async {
            let b = UploadBudget::new(64 << 20); // 256 MiB in all, 128 a token
            let a1 = b.reserve("a", 100 << 20).await.unwrap();
            let wait = std::time::Duration::from_millis(100);
            assert!(
                tokio::time::timeout(wait, b.reserve("a", 40 << 20))
                    .await
                    .is_err()
            );
            let b1 = tokio::time::timeout(wait, b.reserve("b", 100 << 20)).await;
            assert!(b1.is_ok(), "another token's upload is not held up");
            drop(a1);
            assert!(
                tokio::time::timeout(wait, b.reserve("a", 40 << 20))
                    .await
                    .is_ok()
            );
        });
    }

    #[test]
    fn bodies_are_read_whole_and_bounded() {
        let rt = runtime();
        let pool = BodyPool::default();
        rt.block_on(async {
            let b = pool
                .read(axum::body::Body::from(vec![7u8; 5000]), 5000, Some(5000))
                .await
                .ok()
                .unwrap();
            assert_eq!(&b[..], &[7u8; 5000][..]);
            assert!(matches!(
                pool.read(axum::body::Body::from(vec![0u8; 101]), 100, None)
                    .await,
                Err(ReadError::TooLarge)
            ));
        });
    }
}
