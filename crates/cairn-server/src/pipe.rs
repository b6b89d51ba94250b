//! Answers sent a piece at a time by a producer (a task reading a pack, an
//! export on its own thread) through a bounded channel, so that an answer of any
//! size holds a few pieces of memory.
//!
//! Two things are kept here that each producer got wrong on its own (review r34):
//! - **An answer ends complete only by saying so.** The producer ends it with
//!   [`PipeTx::end`]; a channel closed without that (a producer that failed and
//!   could not say why, or died) ends the body with an error, so a client never
//!   takes a cut archive for a whole one.
//! - **A slow client is not a gone one.** The body hands the server pieces of at
//!   most [`FRAME`] bytes and notes when it last did: a producer waiting for room
//!   gives up only when the client took nothing for `answer_stall_secs`, not
//!   when one large piece took that long to go out at a few KiB/s.

use axum::body::Bytes;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

/// What the body hands the connection at a time.
pub const FRAME: usize = 64 << 10;

/// How often a producer waiting for room looks at how long the client took
/// nothing.
const LOOK_EVERY: Duration = Duration::from_secs(5);

type Item = Result<Bytes, std::io::Error>;

/// Milliseconds since the first call (a clock the atomics can hold).
fn now_ms() -> u64 {
    static START: std::sync::OnceLock<Instant> = std::sync::OnceLock::new();
    START.get_or_init(Instant::now).elapsed().as_millis() as u64
}

/// Why a producer stops sending.
#[derive(Debug, PartialEq, Eq)]
pub enum Stop {
    /// The client went away (its answer was dropped).
    Gone,
    /// The client took nothing for this long (`answer_stall_secs`).
    Stalled(Duration),
}

impl Stop {
    pub fn into_io(self) -> std::io::Error {
        match self {
            Stop::Gone => {
                std::io::Error::new(std::io::ErrorKind::BrokenPipe, "the client went away")
            }
            Stop::Stalled(after) => std::io::Error::new(
                std::io::ErrorKind::TimedOut,
                format!(
                    "the client took none of the answer for {} s",
                    after.as_secs()
                ),
            ),
        }
    }
}

/// The producer's end.
pub struct PipeTx {
    tx: tokio::sync::mpsc::Sender<Item>,
    taken: Arc<AtomicU64>,
    stall: Duration,
}

/// The answer's body.
pub struct PipeBody {
    rx: tokio::sync::mpsc::Receiver<Item>,
    current: Bytes,
    taken: Arc<AtomicU64>,
    done: bool,
}

/// A pipe holding at most `pieces` pieces besides the one being sent, whose
/// producer gives up when its client takes nothing for `stall`.
pub fn pipe(pieces: usize, stall: Duration) -> (PipeTx, PipeBody) {
    let (tx, rx) = tokio::sync::mpsc::channel(pieces.max(1));
    let taken = Arc::new(AtomicU64::new(now_ms()));
    (
        PipeTx {
            tx,
            taken: taken.clone(),
            stall,
        },
        PipeBody {
            rx,
            current: Bytes::new(),
            taken,
            done: false,
        },
    )
}

impl PipeTx {
    /// Sends a piece (empty ones are skipped: an empty piece ends the answer).
    pub async fn send(&self, piece: Bytes) -> Result<(), Stop> {
        if piece.is_empty() {
            return Ok(());
        }
        self.put(Ok(piece)).await
    }

    /// Ends the answer complete.
    pub async fn end(&self) -> Result<(), Stop> {
        self.put(Ok(Bytes::new())).await
    }

    /// Ends the answer with an error (said to the client by a broken transfer;
    /// were it not delivered, the closed channel says the same).
    pub async fn fail(&self, e: std::io::Error) {
        let _ = self.put(Err(e)).await;
    }

    async fn put(&self, item: Item) -> Result<(), Stop> {
        loop {
            match tokio::time::timeout(LOOK_EVERY.min(self.stall), self.tx.reserve()).await {
                Ok(Ok(permit)) => {
                    permit.send(item);
                    return Ok(());
                }
                Ok(Err(_)) => return Err(Stop::Gone),
                Err(_) => {
                    let idle = now_ms().saturating_sub(self.taken.load(Ordering::Relaxed));
                    if idle >= self.stall.as_millis() as u64 {
                        return Err(Stop::Stalled(self.stall));
                    }
                }
            }
        }
    }
}

impl http_body::Body for PipeBody {
    type Data = Bytes;
    type Error = std::io::Error;
    fn poll_frame(
        mut self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<Option<Result<http_body::Frame<Bytes>, std::io::Error>>> {
        use std::task::Poll;
        loop {
            if !self.current.is_empty() {
                let n = self.current.len().min(FRAME);
                let frame = self.current.split_to(n);
                self.taken.store(now_ms(), Ordering::Relaxed);
                return Poll::Ready(Some(Ok(http_body::Frame::data(frame))));
            }
            if self.done {
                return Poll::Ready(None);
            }
            match std::task::ready!(self.rx.poll_recv(cx)) {
                Some(Ok(b)) if b.is_empty() => {
                    self.done = true;
                    return Poll::Ready(None);
                }
                Some(Ok(b)) => self.current = b,
                Some(Err(e)) => {
                    self.done = true;
                    return Poll::Ready(Some(Err(e)));
                }
                None => {
                    self.done = true;
                    return Poll::Ready(Some(Err(std::io::Error::new(
                        std::io::ErrorKind::UnexpectedEof,
                        "the answer ended before it was complete",
                    ))));
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use http_body_util::BodyExt;

    /// Pieces come out in frames of at most [`FRAME`] bytes and the body ends
    /// only at the end mark; without it, with an error.
    #[tokio::test]
    async fn a_body_ends_whole_only_when_told() {
        let (tx, body) = pipe(1, Duration::from_secs(120));
        let sender = tokio::spawn(async move {
            tx.send(Bytes::from(vec![1u8; 200_000])).await.unwrap();
            tx.send(Bytes::from_static(b"tail")).await.unwrap();
            tx.end().await.unwrap();
        });
        let got = body.collect().await.unwrap().to_bytes();
        sender.await.unwrap();
        assert_eq!(got.len(), 200_004);
        let (tx, body) = pipe(1, Duration::from_secs(120));
        let sender = tokio::spawn(async move {
            tx.send(Bytes::from_static(b"half")).await.unwrap();
            drop(tx);
        });
        assert!(body.collect().await.is_err());
        sender.await.unwrap();
        let (tx, body) = pipe(4, Duration::from_secs(120));
        tx.send(Bytes::from_static(b"x")).await.unwrap();
        tx.fail(std::io::Error::other("damaged")).await;
        let e = body.collect().await.unwrap_err();
        assert!(e.to_string().contains("damaged"), "{e}");
    }

    /// A client that takes frames slowly keeps its answer going however long
    /// one piece takes; one that takes nothing is given up after the limit.
    #[tokio::test]
    async fn a_slow_client_is_served_and_a_silent_one_given_up() {
        let (tx, mut body) = pipe(1, Duration::from_millis(300));
        let sender = tokio::spawn(async move {
            for _ in 0..3 {
                // 4 frames a piece, taken one per 150 ms: 600 ms a piece.
                tx.send(Bytes::from(vec![2u8; 4 * FRAME])).await?;
            }
            tx.end().await
        });
        let mut got = 0;
        while let Some(f) = body.frame().await {
            got += f.unwrap().into_data().unwrap().len();
            tokio::time::sleep(Duration::from_millis(150)).await;
        }
        assert_eq!(got, 12 * FRAME);
        assert_eq!(sender.await.unwrap(), Ok(()));
        let (tx, _body) = pipe(1, Duration::from_millis(300));
        let started = Instant::now();
        tx.send(Bytes::from_static(b"a")).await.unwrap();
        assert_eq!(
            tx.send(Bytes::from_static(b"b")).await,
            Err(Stop::Stalled(Duration::from_millis(300)))
        );
        assert!(started.elapsed() >= Duration::from_millis(300));
    }
}
