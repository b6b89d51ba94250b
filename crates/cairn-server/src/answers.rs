//! Answers a caller has not taken yet, held to a memory budget.
//!
//! An answer the server has built waits in memory until its client takes it.
//! Over HTTP/2 a client can leave a stream's window closed while its connection
//! answers pings: the connection never stalls, so [`crate::conns::Watched`] never
//! ends it, and every answer on such a stream stays in memory (review r34 L6:
//! about 200 answers of 1 MiB a connection, 128 connections an address). So room
//! for each answer to a GET is taken before it is made ([`Answers::reserve`]),
//! the rest once it is weighed ([`Answers::hold`]), and held against its
//! caller's share and the server's whole budget until it is taken or dropped;
//! one that finds no room within [`ROOM_WAIT`] is refused with `429
//! answers_not_taken`, which clients retry. A caller is the token or console
//! user its credential authenticates ([`caller`]); requests without a valid one
//! share a small pool by address.
//!
//! The body hands its answer out in frames of at most [`crate::pipe::FRAME`]
//! bytes, each holding the answer's place: what the connection still holds of
//! an answer once its body has ended stays counted until it is sent or dropped.

use crate::conns::Places;
use axum::body::Bytes;
use axum::http::{HeaderMap, header};
use axum::response::{IntoResponse, Response};
use std::sync::Arc;

/// The weight of an answer whose size is not known when it starts (an archive
/// being made): a few of its pieces.
const UNKNOWN_WEIGHT: u64 = 4 << 20;

/// What a streamed answer weighs, set on its response by whoever streams it:
/// the most it holds at once, not its length.
#[derive(Clone, Copy, Debug)]
pub struct Weight(pub u64);

/// Who an answer is counted against.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Caller {
    /// A token or a console user, by its id (a user's is `user-NAME`),
    /// authenticated: however many spellings of the token or sessions of the
    /// user, one share.
    Known(String),
    /// Whoever presents no valid credential, by address ([`crate::conns`]: an
    /// IPv6 /64 is one): their answers (the console's page, refusals) share a
    /// small pool of their own, so that made-up credentials reach neither the
    /// callers' budget nor a share each (review r36 H1).
    Anonymous(std::net::IpAddr),
}

/// The budget of answers not yet taken, in KiB: one pool for authenticated
/// callers, one for anonymous ones.
pub struct Answers {
    known: Arc<Places<String>>,
    anonymous: Arc<Places<std::net::IpAddr>>,
    per_caller_mib: u64,
    refused: std::sync::atomic::AtomicU64,
}

/// What an authenticated caller may hold whatever the others hold, in MiB (at
/// most a quarter of its share): a restore's few readers (cores + 2, up to 12 MiB each on object storage) go
/// on when callers that never take their answers fill the budget.
const CALLER_FLOOR_MIB: u64 = 64;

/// An anonymous address's share, and the anonymous pool, in MiB.
const ANONYMOUS_PER_ADDRESS_MIB: u64 = 16;
const ANONYMOUS_MIB: u64 = 128;

fn kib(mib: u64) -> usize {
    usize::try_from(mib.saturating_mul(1024)).unwrap_or(usize::MAX)
}

impl Answers {
    pub fn new(per_caller_mib: u64, all_mib: u64) -> Answers {
        Self::with_floor(
            per_caller_mib,
            all_mib,
            CALLER_FLOOR_MIB.min(per_caller_mib / 4),
        )
    }

    fn with_floor(per_caller_mib: u64, all_mib: u64, floor_mib: u64) -> Answers {
        Answers {
            known: Places::with_floor(kib(per_caller_mib), kib(all_mib), kib(floor_mib)),
            anonymous: Places::new(kib(ANONYMOUS_PER_ADDRESS_MIB), kib(ANONYMOUS_MIB)),
            per_caller_mib,
            refused: std::sync::atomic::AtomicU64::new(0),
        }
    }

    /// A place of `expected` bytes for the answer `caller` asked for, taken
    /// before it is made, so that answers that could not be held are not made
    /// (audit r36: 2,000 ranges asked at once by a caller whose share was full
    /// were each read, then refused). Waits for room up to [`ROOM_WAIT`]: a
    /// restore's next range waits for its earlier ones to be taken rather than
    /// be refused.
    pub async fn reserve(&self, caller: &Caller, expected: u64) -> Result<Place, Response> {
        let kib = usize::try_from(expected.div_ceil(1024)).unwrap_or(usize::MAX);
        let until = tokio::time::Instant::now() + ROOM_WAIT;
        loop {
            // Asked before trying, so that room given back in between wakes it.
            let released = self.released(caller);
            tokio::pin!(released);
            released.as_mut().enable();
            if let Some(p) = self.enter(caller, kib) {
                return Ok(p);
            }
            if tokio::time::timeout_at(until, released).await.is_err() {
                return Err(self.refusal());
            }
        }
    }

    /// Resolves when room in `caller`'s pool is given back.
    fn released(&self, caller: &Caller) -> tokio::sync::futures::Notified<'_> {
        match caller {
            Caller::Known(_) => self.known.released(),
            Caller::Anonymous(_) => self.anonymous.released(),
        }
    }

    fn enter(&self, caller: &Caller, kib: usize) -> Option<Place> {
        match caller {
            Caller::Known(who) => self
                .known
                .enter_weighing(who.clone(), kib)
                .map(Place::Known),
            Caller::Anonymous(ip) => self
                .anonymous
                .enter_weighing(crate::conns::address_of(*ip), kib)
                .map(Place::Anonymous),
        }
    }

    fn refusal(&self) -> Response {
        self.refused
            .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        crate::api::ApiError::new(
            axum::http::StatusCode::TOO_MANY_REQUESTS,
            "answers_not_taken",
            format!(
                "answers to this caller that it has not taken yet, or the server's to all \
                 callers, hold what they may ({} MiB a caller: answer_memory_per_caller_mib), \
                 and none was taken for {} s: take them, then ask again",
                self.per_caller_mib,
                ROOM_WAIT.as_secs()
            ),
        )
        .into_response()
    }

    /// Bytes the answers not yet taken hold, as weighed (`/metrics`).
    pub fn held_bytes(&self) -> u64 {
        (self.known.held() + self.anonymous.held()) as u64 * 1024
    }

    /// Answers refused for want of room (`/metrics`).
    pub fn refused(&self) -> u64 {
        self.refused.load(std::sync::atomic::Ordering::Relaxed)
    }

    /// `resp`, the answer to a GET, held against `caller`'s share until its body
    /// ends or is dropped; or, when it does not fit, a refusal (and `resp`
    /// dropped). Only answers to GET are held: refusing another request's
    /// answer would hide that it was done (a pack stored, a session begun), and
    /// those answers are a few bytes (review r36 H2).
    ///
    /// `taking` follows its frames on their connection, which ends when the
    /// client leaves one untaken too long ([`crate::conns::Untaken`]).
    pub fn hold(
        &self,
        caller: Caller,
        early: Option<Place>,
        resp: Response,
        taking: Arc<crate::conns::Taking>,
    ) -> Response {
        let weight = weight_of(&resp);
        let kib = usize::try_from(weight.div_ceil(1024)).unwrap_or(usize::MAX);
        // The place taken before the answer was made, if it is enough.
        let place = match early {
            Some(p) if p.weight() >= kib => Some(p),
            early => {
                drop(early);
                self.enter(&caller, kib)
            }
        };
        let Some(place) = place else {
            drop(resp);
            return self.refusal();
        };
        resp.map(|inner| {
            axum::body::Body::new(Held {
                inner,
                current: Bytes::new(),
                place: Arc::new(place),
                taking,
            })
        })
    }
}

/// A place in one of the two pools.
pub enum Place {
    Known(crate::conns::Place<String>),
    Anonymous(crate::conns::Place<std::net::IpAddr>),
}

impl Place {
    fn weight(&self) -> usize {
        match self {
            Place::Known(p) => p.weight(),
            Place::Anonymous(p) => p.weight(),
        }
    }
}

/// How long an answer waits for room in its caller's share before it is made.
const ROOM_WAIT: std::time::Duration = std::time::Duration::from_secs(10);

/// What an answer to a GET is expected to weigh before it is made: a range's
/// length (up to what a streamed range holds on object storage), else a small
/// answer's; one that turns out heavier takes the rest once made.
pub fn expected_weight(headers: &HeaderMap) -> u64 {
    headers
        .get(header::RANGE)
        .and_then(|v| crate::api::parse_range(v.to_str().ok()?).ok())
        .map_or(64 << 10, |(_, len)| len.min(12 << 20))
}

/// What an answer holds at most: what its streamer said, else its length, else
/// [`UNKNOWN_WEIGHT`].
fn weight_of(resp: &Response) -> u64 {
    if let Some(Weight(w)) = resp.extensions().get::<Weight>() {
        return *w;
    }
    http_body::Body::size_hint(resp.body())
        .exact()
        .unwrap_or(UNKNOWN_WEIGHT)
}

/// Who a request's answers are counted against: the token or console user its
/// credential authenticates, read as the API reads it ([`crate::api::authenticate`],
/// and the session cookie as [`crate::signin::cookie_auth`] turns it into one),
/// or, with none that does, its address.
pub fn caller(app: &crate::App, headers: &HeaderMap, peer: std::net::IpAddr) -> Caller {
    let known = if headers.contains_key(header::AUTHORIZATION) {
        crate::api::authenticate(app, headers).ok()
    } else {
        crate::signin::cookie(headers, crate::signin::COOKIE).and_then(|id| {
            match app.signins.get(&id)?.0 {
                crate::signin::Identity::Token(t) => app.tokens.authenticate(&t).ok().flatten(),
                crate::signin::Identity::User(..) => crate::api::session_user(app, &id).ok(),
            }
        })
    };
    known.map_or(Caller::Anonymous(peer), |t| Caller::Known(t.id))
}

/// An answer's body with its place in the budget, handed out a frame at a time.
struct Held {
    inner: axum::body::Body,
    /// What the inner body gave and this one has not handed out yet.
    current: Bytes,
    /// Its place in the budget, shared with every frame handed out: given back
    /// once the body and all of those are dropped, that is once the connection
    /// has sent or dropped the last of them (audit r36: given back when the
    /// last frame was handed over, what a stream that takes a byte at a time
    /// still held was counted nowhere). A frame is a slice of the buffer the
    /// answer was read into, which it keeps alive: counted as long as it lives.
    place: Arc<Place>,
    /// Told of every frame handed out and taken.
    taking: Arc<crate::conns::Taking>,
}

/// A frame handed out, holding the answer's place in the budget.
struct Frame {
    data: Bytes,
    _place: Arc<Place>,
    taking: Arc<crate::conns::Taking>,
}

impl Drop for Frame {
    fn drop(&mut self) {
        self.taking.taken();
    }
}

impl AsRef<[u8]> for Frame {
    fn as_ref(&self) -> &[u8] {
        &self.data
    }
}

impl http_body::Body for Held {
    type Data = Bytes;
    type Error = axum::Error;

    fn poll_frame(
        mut self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<Option<Result<http_body::Frame<Bytes>, axum::Error>>> {
        use std::task::Poll;
        let this = &mut *self;
        loop {
            if !this.current.is_empty() {
                let n = this.current.len().min(crate::pipe::FRAME);
                this.taking.handed();
                let frame = Bytes::from_owner(Frame {
                    data: this.current.split_to(n),
                    _place: this.place.clone(),
                    taking: this.taking.clone(),
                });
                return Poll::Ready(Some(Ok(http_body::Frame::data(frame))));
            }
            match std::task::ready!(std::pin::Pin::new(&mut this.inner).poll_frame(cx)) {
                Some(Ok(f)) => match f.into_data() {
                    Ok(d) => this.current = d,
                    Err(f) => return Poll::Ready(Some(Ok(f))),
                },
                other => return Poll::Ready(other),
            }
        }
    }

    fn is_end_stream(&self) -> bool {
        self.current.is_empty() && self.inner.is_end_stream()
    }

    fn size_hint(&self) -> http_body::SizeHint {
        let mut h = self.inner.size_hint();
        let n = self.current.len() as u64;
        h.set_lower(h.lower() + n);
        if let Some(u) = h.upper() {
            h.set_upper(u + n);
        }
        h
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use http_body_util::BodyExt;

    fn answer(len: usize) -> Response {
        Response::new(axum::body::Body::from(vec![5u8; len]))
    }

    /// An answer's frames, on a connection of their own.
    fn watched() -> Arc<crate::conns::Taking> {
        crate::conns::Untaken::default().track()
    }

    /// A connection one of whose answers has frames out that none is taken of
    /// is stalled after the limit; one whose client takes them is not, however
    /// long it takes in all, nor one whose answer is not yet made.
    #[tokio::test(start_paused = true)]
    async fn a_connection_that_takes_none_of_an_answer_is_stalled() {
        use std::time::Duration;
        let a = Answers::new(16, 16);
        let conn = crate::conns::Untaken::default();
        async fn stalled(conn: &crate::conns::Untaken) -> bool {
            let limit = Duration::from_secs(120);
            tokio::time::timeout(Duration::from_secs(130), conn.stalled(limit))
                .await
                .is_ok()
        }
        // Made, not yet handed out: no frame waits.
        let idle = a.hold(
            Caller::Known("x".into()),
            None,
            answer(1 << 20),
            conn.track(),
        );
        assert!(!stalled(&conn).await, "an answer not started");
        // Taken a frame every 100 s: slow, not stalled.
        let mut body = idle.into_body();
        let mut frames = 0;
        let mut taker = Box::pin(async {
            while let Some(f) = body.frame().await {
                frames += 1;
                tokio::time::sleep(Duration::from_secs(100)).await;
                drop(f);
            }
        });
        let watch = stalled(&conn);
        tokio::select! {
            _ = &mut taker => panic!("16 frames taken in 130 s"),
            s = watch => assert!(!s, "a slow client"),
        }
        drop(taker);
        assert_eq!(frames, 2);
        // A frame handed out and never taken: stalled.
        let mut body = a
            .hold(
                Caller::Known("y".into()),
                None,
                answer(1 << 20),
                conn.track(),
            )
            .into_body();
        let kept = body.frame().await;
        assert!(stalled(&conn).await, "a frame left untaken");
        drop(kept);
        assert!(!stalled(&conn).await, "taken at last");
    }

    /// A caller's answers hold its share until they are taken or dropped; one
    /// that does not fit is refused and another caller is answered.
    #[tokio::test]
    async fn answers_not_taken_hold_their_callers_share() {
        let a = Answers::with_floor(2, 3, 1);
        let hold =
            |who: &str, len: usize| a.hold(Caller::Known(who.into()), None, answer(len), watched());
        let one = hold("token a", 1 << 20);
        assert_eq!(one.status(), 200);
        let two = hold("token a", 1 << 20);
        assert_eq!(two.status(), 200);
        assert_eq!(hold("token a", 1 << 20).status(), 429, "its share");
        let b = hold("token b", 1 << 20);
        assert_eq!(b.status(), 200);
        // 3 MiB in all: a caller holding less than its floor still enters.
        let c = hold("token c", 1 << 20);
        assert_eq!(c.status(), 200, "within its floor");
        assert_eq!(hold("token c", 1 << 20).status(), 429, "past its floor");
        // Taken whole: its place is given back.
        let got = one.into_body().collect().await.unwrap().to_bytes();
        assert_eq!(got.len(), 1 << 20);
        drop(c);
        assert_eq!(a.held_bytes(), 2 << 20);
        assert_eq!(hold("token a", 1 << 20).status(), 200);
        drop((two, b));
        assert_eq!(a.held_bytes(), 0);
        let c = hold("token c", 2 << 20);
        assert_eq!(c.status(), 200);
        // A streamed answer weighs what it says it holds (over the share: as much
        // as the share).
        let mut s = answer(10);
        s.extensions_mut().insert(Weight(3 << 20));
        assert_eq!(
            a.hold(Caller::Known("token d".into()), None, s, watched())
                .status(),
            429
        );
        assert_eq!(hold("token d", 1 << 20).status(), 200);
        // Anonymous callers have a pool of their own.
        let anon = a.hold(
            Caller::Anonymous("10.0.0.1".parse().unwrap()),
            None,
            answer(1 << 20),
            watched(),
        );
        assert_eq!(anon.status(), 200);
        assert_eq!(a.refused(), 3);
        assert_eq!(a.held_bytes(), 3 << 20);
        drop((c, anon));
        assert_eq!(a.held_bytes(), 0);
    }

    /// An answer left untaken on a connection whose other answers are being
    /// taken (HTTP/2 streams sharing a slow link) ends it only at four times
    /// the limit.
    #[tokio::test(start_paused = true)]
    async fn a_moving_connection_is_given_four_times_the_limit() {
        use std::time::Duration;
        let a = Answers::new(16, 16);
        let conn = crate::conns::Untaken::default();
        let mut stuck = a
            .hold(
                Caller::Known("x".into()),
                None,
                answer(1 << 20),
                conn.track(),
            )
            .into_body();
        let _kept = stuck.frame().await;
        let mut moving = a
            .hold(
                Caller::Known("y".into()),
                None,
                answer(8 << 20),
                conn.track(),
            )
            .into_body();
        let started = tokio::time::Instant::now();
        // The client takes a frame every 20 s in a task of its own, so the
        // watch is polled on time whatever the taker does (in one `select!`
        // with the taker's sleep, the watch waited behind it).
        let taker = tokio::spawn(async move {
            while let Some(f) = moving.frame().await {
                drop(f);
                tokio::time::sleep(Duration::from_secs(20)).await;
            }
        });
        conn.stalled(Duration::from_secs(120)).await;
        let took = started.elapsed();
        assert!(!taker.is_finished(), "the moving answer ran out: {took:?}");
        taker.abort();
        assert!(
            took >= Duration::from_secs(480) && took <= Duration::from_secs(500),
            "{took:?}"
        );
    }

    /// The frames hold the answer's place after the body is gone: the budget
    /// counts them until the connection drops the last one.
    #[tokio::test]
    async fn frames_handed_out_hold_the_place_until_dropped() {
        let a = Answers::new(16, 16);
        let mut body = a
            .hold(Caller::Known("x".into()), None, answer(200_000), watched())
            .into_body();
        let mut frames = Vec::new();
        while let Some(f) = body.frame().await {
            frames.push(f.unwrap().into_data().unwrap());
        }
        drop(body);
        assert!(a.held_bytes() > 0, "the frames are still held");
        let last = frames.pop().unwrap();
        drop(frames);
        assert!(a.held_bytes() > 0);
        drop(last);
        assert_eq!(a.held_bytes(), 0);
    }

    /// Frames of at most FRAME bytes, cut from the answer's buffer (nothing
    /// copied), and the answer whole.
    #[tokio::test]
    async fn answers_go_out_in_frames_cut_from_their_buffer() {
        let a = Answers::new(16, 16);
        let data: Vec<u8> = (0..(1u32 << 20) + 1000).map(|i| i as u8).collect();
        let src = Bytes::from(data.clone());
        let mut body = a
            .hold(
                Caller::Known("x".into()),
                None,
                Response::new(axum::body::Body::from(src.clone())),
                watched(),
            )
            .into_body();
        let mut got = Vec::new();
        let inside = src.as_ptr_range();
        while let Some(f) = body.frame().await {
            let d = f.unwrap().into_data().unwrap();
            assert!(d.len() <= crate::pipe::FRAME);
            assert!(inside.contains(&d.as_ptr()), "a copy");
            got.extend_from_slice(&d);
        }
        assert_eq!(got, data);
    }
}
