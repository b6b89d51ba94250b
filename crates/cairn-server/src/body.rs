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
/// of its permits): four of the largest object, at least 256 MiB. An upload holds
/// what it has received so far, taken [`STEP`] at a time as its body arrives (not
/// its announced length: a client announcing a large object and trickling it
/// would hold that much for nothing, and two such clients held the whole budget,
/// QA), so that many clients sending at once wait instead of the server
/// buffering them all. Tokens that are not admins hold at most three quarters of
/// it together, so that an admin's forget, prune and repair are never stalled by
/// backup clients, and one such token at most a quarter, so that uploads sent
/// slowly by one client (or three) do not stall every other.
pub struct UploadBudget {
    all: Arc<tokio::sync::Semaphore>,
    clients: Arc<tokio::sync::Semaphore>,
    total: u32,
    tokens: std::sync::Mutex<std::collections::HashMap<String, Arc<Share>>>,
}

/// One token's share of the budget, and whether the token was removed: its
/// uploads then end at once, so that an admin who removes a hijacked client's
/// token gets back what its uploads held.
struct Share {
    room: Arc<tokio::sync::Semaphore>,
    removed: std::sync::atomic::AtomicBool,
    told: tokio::sync::Notify,
}

impl Share {
    /// Returns once the token is removed.
    async fn removed(&self) {
        loop {
            let told = self.told.notified();
            tokio::pin!(told);
            told.as_mut().enable();
            if self.removed.load(std::sync::atomic::Ordering::Acquire) {
                return;
            }
            told.await;
        }
    }
}

/// What an upload reserves of the budget at a time as its body arrives.
pub const STEP: u64 = 4 << 20;
/// How long an upload that has begun waits for more of the budget before it is
/// ended with "busy, send again later": uploads each holding part of the budget
/// and each waiting for more would otherwise wait for one another for ever.
pub const GROW_WAIT: std::time::Duration = std::time::Duration::from_secs(20);

/// What an upload holds of the budget until it is dropped; it grows as the body
/// arrives ([`Reserved::grow`]).
pub struct Reserved {
    /// The token's own share, the non-admins' part (both `None` for an admin).
    token: Option<Arc<Share>>,
    clients: Option<Arc<tokio::sync::Semaphore>>,
    all: Arc<tokio::sync::Semaphore>,
    share: u32,
    total: u32,
    /// KiB held (of the budget; of the token's share and the non-admins' part,
    /// as much up to all of each).
    kib: u32,
    permits: Vec<tokio::sync::OwnedSemaphorePermit>,
}

/// The budget had no room for more of an upload within [`GROW_WAIT`].
#[derive(Debug)]
pub struct Busy;

impl UploadBudget {
    pub fn new(max_object_size: u64) -> UploadBudget {
        let kib = (max_object_size.saturating_mul(4).max(256 << 20) / 1024)
            .min(tokio::sync::Semaphore::MAX_PERMITS as u64)
            .min(u64::from(u32::MAX)) as u32;
        UploadBudget {
            all: Arc::new(tokio::sync::Semaphore::new(kib as usize)),
            clients: Arc::new(tokio::sync::Semaphore::new((kib / 4 * 3) as usize)),
            total: kib,
            tokens: Default::default(),
        }
    }

    /// Waits until the first [`STEP`] of an upload (`len` when smaller) fits the
    /// token's share, the non-admins' part and the whole budget. `None` when
    /// stopping.
    pub async fn reserve(&self, token: &str, admin: bool, len: u64) -> Option<Reserved> {
        let (token, clients) = if admin {
            (None, None)
        } else {
            let share = (self.total / 4).max(1);
            let mut t = self.tokens.lock().unwrap_or_else(|e| e.into_inner());
            let mine = t
                .entry(token.to_string())
                .or_insert_with(|| {
                    Arc::new(Share {
                        room: Arc::new(tokio::sync::Semaphore::new(share as usize)),
                        removed: Default::default(),
                        told: Default::default(),
                    })
                })
                .clone();
            (Some(mine), Some(self.clients.clone()))
        };
        let mut r = Reserved {
            token,
            clients,
            all: self.all.clone(),
            share: (self.total / 4).max(1),
            total: self.total,
            kib: 0,
            permits: Vec::new(),
        };
        r.take(len.clamp(1, STEP)).await.ok()?;
        Some(r)
    }

    /// Ends the uploads of a removed token (the ones it starts later are
    /// refused with the token).
    pub fn token_removed(&self, token: &str) {
        let mut t = self.tokens.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(share) = t.remove(token) {
            share
                .removed
                .store(true, std::sync::atomic::Ordering::Release);
            share.told.notify_waiters();
        }
    }
}

impl Reserved {
    /// Returns once the upload's token is removed (never for an admin's).
    async fn token_removed(&self) {
        match &self.token {
            Some(t) => t.removed().await,
            None => std::future::pending().await,
        }
    }

    /// Bytes held.
    pub fn held(&self) -> u64 {
        u64::from(self.kib) * 1024
    }

    /// Holds room for `len` bytes in all, waiting [`GROW_WAIT`] at most.
    pub async fn grow(&mut self, len: u64) -> Result<(), Busy> {
        self.grow_within(len, GROW_WAIT).await
    }

    async fn grow_within(&mut self, len: u64, wait: std::time::Duration) -> Result<(), Busy> {
        if len <= self.held() {
            return Ok(());
        }
        match tokio::time::timeout(wait, self.take(len)).await {
            Ok(Ok(())) => Ok(()),
            _ => Err(Busy),
        }
    }

    /// Takes what holding `len` bytes needs: as much of the token's share and
    /// of the non-admins' part, up to all of each, and of the whole budget (an
    /// object larger than the share would wait for the whole share, not for
    /// ever; the share is at least the largest object). A cancelled wait drops
    /// what it took.
    async fn take(&mut self, len: u64) -> Result<(), Busy> {
        let kib = u32::try_from(len.div_ceil(1024).max(1))
            .unwrap_or(u32::MAX)
            .min(self.total);
        if kib <= self.kib {
            return Ok(());
        }
        let part = (self.total / 4 * 3).max(1);
        let mut got = Vec::new();
        let token = self.token.as_ref().map(|t| &t.room);
        for (sem, cap) in [(token, self.share), (self.clients.as_ref(), part)] {
            let Some(sem) = sem else { continue };
            let (now, then) = (self.kib.min(cap), kib.min(cap));
            if then > now {
                let p = sem.clone().acquire_many_owned(then - now).await;
                got.push(p.map_err(|_| Busy)?);
            }
        }
        let p = self.all.clone().acquire_many_owned(kib - self.kib).await;
        got.push(p.map_err(|_| Busy)?);
        self.permits.append(&mut got);
        self.kib = kib;
        Ok(())
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
    /// The client stopped sending, or sent too slowly (a 408: the client's
    /// retry sends it again).
    Stalled(String),
    /// The upload budget had no room for the rest within [`GROW_WAIT`].
    Busy,
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
    /// Content-Length, when sent (only a hint for the buffer's size). `budget`
    /// grows with what has arrived.
    /// `pace`, when given, says how long to wait after each piece received (the
    /// upload limits): the body is read at the limit's rate, so that the
    /// client's sending is held back as it goes (TCP's and HTTP/2's windows)
    /// and it hears from the server all along, rather than sending at full
    /// speed and then hearing nothing while the whole body's pace is waited
    /// out (QA r38: a 16 MiB pack at 100 KiB/s went 164 s unanswered, past the
    /// client's patience, and was sent again).
    pub async fn read(
        &self,
        body: axum::body::Body,
        max: u64,
        expected: Option<u64>,
        budget: Option<&mut Reserved>,
        pace: Option<&(dyn Fn(u64) -> std::time::Duration + Send + Sync)>,
    ) -> Result<Pooled, ReadError> {
        self.read_within(body, max, expected, budget, STALL, pace)
            .await
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
        mut budget: Option<&mut Reserved>,
        stall: std::time::Duration,
        pace: Option<&(dyn Fn(u64) -> std::time::Duration + Send + Sync)>,
    ) -> Result<Pooled, ReadError> {
        use http_body_util::BodyExt;
        // The buffer is sized for what is held, not what is announced: an
        // announced length costs the client nothing.
        let hint = expected
            .unwrap_or(0)
            .min(max)
            .min(budget.as_ref().map_or(u64::MAX, |b| b.held()));
        let mut out = Pooled::new(&self.pool, hint as usize);
        let mut body = body;
        let (mut span_start, mut span_bytes) = (tokio::time::Instant::now(), 0usize);
        loop {
            if span_start.elapsed() >= stall {
                if span_bytes < MIN_PER_STALL {
                    return Err(ReadError::Stalled(format!(
                        "{span_bytes} bytes received in {} s (after {} bytes): too slow",
                        stall.as_secs(),
                        out.len()
                    )));
                }
                (span_start, span_bytes) = (tokio::time::Instant::now(), 0);
            }
            let next = tokio::time::timeout(stall, body.frame());
            let frame = match budget.as_deref() {
                Some(b) => tokio::select! {
                    f = next => f,
                    () = b.token_removed() => {
                        return Err(ReadError::Broken(format!(
                            "its token was removed (after {} bytes)",
                            out.len()
                        )));
                    }
                },
                None => next.await,
            };
            let frame = match frame {
                Ok(Some(f)) => f,
                Ok(None) => break,
                Err(_) => {
                    return Err(ReadError::Stalled(format!(
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
                if let Some(b) = budget.as_deref_mut() {
                    let need = (out.len() + data.len()) as u64;
                    if need > b.held() {
                        // Another step, or to the announced end when nearer.
                        let end = expected.unwrap_or(u64::MAX).max(need);
                        let want = (b.held() + STEP).min(end).max(need);
                        b.grow(want).await.map_err(|_| ReadError::Busy)?;
                    }
                }
                span_bytes += data.len();
                out.extend_from_slice(&data);
                let wait = pace.map_or(std::time::Duration::ZERO, |p| p(data.len() as u64));
                if !wait.is_zero() {
                    tokio::time::sleep(wait).await;
                    // The server's pause, not the client's: not counted
                    // against how much it must send in a span.
                    span_start += wait;
                }
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

    /// A body of `n` frames of `len` bytes, all there at once.
    struct Frames(usize, usize);

    impl http_body::Body for Frames {
        type Data = axum::body::Bytes;
        type Error = std::convert::Infallible;
        fn poll_frame(
            mut self: std::pin::Pin<&mut Self>,
            _: &mut std::task::Context<'_>,
        ) -> std::task::Poll<Option<Result<http_body::Frame<Self::Data>, Self::Error>>> {
            if self.0 == 0 {
                return std::task::Poll::Ready(None);
            }
            self.0 -= 1;
            std::task::Poll::Ready(Some(Ok(http_body::Frame::data(axum::body::Bytes::from(
                vec![3u8; self.1],
            )))))
        }
    }

    /// A paced upload is read at the pace, a frame at a time, and the pauses
    /// are the server's: however long they are, they do not make the client
    /// look stalled.
    #[test]
    fn a_paced_upload_is_read_at_its_pace_and_not_taken_for_stalled() {
        let rt = runtime();
        rt.block_on(async {
            let pool = BodyPool::default();
            let paced = std::sync::atomic::AtomicUsize::new(0);
            let pace = |n: u64| {
                paced.fetch_add(n as usize, std::sync::atomic::Ordering::Relaxed);
                std::time::Duration::from_millis(150)
            };
            let started = std::time::Instant::now();
            let r = pool
                .read_within(
                    axum::body::Body::new(Frames(4, 1000)),
                    1 << 20,
                    None,
                    None,
                    // Shorter than one pause: 1,000 bytes a span is too slow.
                    std::time::Duration::from_millis(100),
                    Some(&pace),
                )
                .await;
            assert_eq!(r.ok().map(|b| b.len()), Some(4000));
            assert_eq!(paced.load(std::sync::atomic::Ordering::Relaxed), 4000);
            assert!(started.elapsed() >= std::time::Duration::from_millis(600));
        });
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
                .read_within(
                    body,
                    1 << 20,
                    None,
                    None,
                    std::time::Duration::from_millis(200),
                    None,
                )
                .await;
            match r {
                Err(ReadError::Stalled(m)) => assert!(m.contains("too slow"), "{m}"),
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
                    None,
                    std::time::Duration::from_millis(100),
                    None,
                )
                .await;
            match r {
                Err(ReadError::Stalled(m)) => assert!(m.contains("after 4 bytes"), "{m}"),
                _ => panic!("a stalled upload was not ended"),
            }
        });
    }

    /// A body of `len` bytes, sent as it is read.
    fn bytes(len: usize) -> axum::body::Body {
        axum::body::Body::from(vec![7u8; len])
    }

    /// An upload holds what it has received, not what it announced; one token
    /// holds at most a quarter of the budget and tokens that are not admins
    /// three quarters together: another token's upload goes ahead meanwhile,
    /// an admin's always does, and a grow that finds no room ends as busy.
    #[test]
    fn uploads_hold_what_they_received_within_their_tokens_share() {
        let rt = runtime();
        rt.block_on(async {
            let b = UploadBudget::new(64 << 20); // 256 MiB in all, 64 a token
            let wait = std::time::Duration::from_millis(100);
            // Announcing 60 MiB holds one step.
            let big = b.reserve("a", false, 60 << 20).await.unwrap();
            assert_eq!(big.held(), STEP);
            drop(big);
            let pool = BodyPool::default();
            let mut a1 = b.reserve("a", false, 60 << 20).await.unwrap();
            let body = pool.read(
                bytes(60 << 20),
                64 << 20,
                Some(60 << 20),
                Some(&mut a1),
                None,
            );
            assert_eq!(body.await.ok().unwrap().len(), 60 << 20);
            assert_eq!(a1.held(), 60 << 20);
            // The token's share holds 4 MiB more, not 40.
            let r = tokio::time::timeout(wait, b.reserve("a", false, 40 << 20)).await;
            let mut a2 = r.expect("a step fits the share").unwrap();
            let r = tokio::time::timeout(wait, a2.grow(40 << 20)).await;
            assert!(r.is_err(), "the token's share is full");
            // Two more tokens fill the non-admins' part: a fourth waits, an
            // admin does not.
            let mut others = Vec::new();
            for t in ["b", "c"] {
                let mut r = b.reserve(t, false, 64 << 20).await.unwrap();
                r.grow(64 << 20).await.unwrap();
                others.push(r);
            }
            let d = tokio::time::timeout(wait, b.reserve("d", false, 1 << 20)).await;
            assert!(d.is_err(), "the non-admins' part is full");
            let mut admin = tokio::time::timeout(wait, b.reserve("ops", true, 60 << 20))
                .await
                .expect("an admin's upload is not held up by other tokens")
                .unwrap();
            tokio::time::timeout(wait, admin.grow(60 << 20))
                .await
                .expect("an admin's upload grows")
                .unwrap();
            drop(others);
            let d = tokio::time::timeout(wait, b.reserve("d", false, 1 << 20)).await;
            assert!(d.is_ok(), "room again once the others ended");
            drop(a1);
            assert!(tokio::time::timeout(wait, a2.grow(40 << 20)).await.is_ok());
        });
    }

    /// Uploads each holding part of the budget and each waiting for more do not
    /// wait for each other for ever: one ends as busy after its wait.
    #[test]
    fn uploads_waiting_for_each_other_end_as_busy() {
        let rt = runtime();
        rt.block_on(async {
            let b = UploadBudget::new(64 << 20);
            let mut held = Vec::new();
            for (t, len) in [("a", 60 << 20), ("b", 60 << 20), ("ops", 133 << 20)] {
                let mut r = b.reserve(t, t == "ops", len).await.unwrap();
                r.grow(len).await.unwrap();
                held.push(r);
            }
            // 3 MiB left; each wants 4 more.
            let (x, y) = held.split_at_mut(1);
            let wait = std::time::Duration::from_millis(200);
            let r = tokio::join!(
                x[0].grow_within(64 << 20, wait),
                y[0].grow_within(64 << 20, wait)
            );
            assert!(r.0.is_err() && r.1.is_err(), "neither can go on");
            drop(held);
            let mut r = b.reserve("a", false, 64 << 20).await.unwrap();
            assert!(r.grow_within(64 << 20, wait).await.is_ok());
        });
    }

    #[test]
    fn bodies_are_read_whole_and_bounded() {
        let rt = runtime();
        let pool = BodyPool::default();
        rt.block_on(async {
            let b = pool
                .read(
                    axum::body::Body::from(vec![7u8; 5000]),
                    5000,
                    Some(5000),
                    None,
                    None,
                )
                .await
                .ok()
                .unwrap();
            assert_eq!(&b[..], &[7u8; 5000][..]);
            assert!(matches!(
                pool.read(
                    axum::body::Body::from(vec![0u8; 101]),
                    100,
                    None,
                    None,
                    None
                )
                .await,
                Err(ReadError::TooLarge)
            ));
        });
    }
}
