//! Answers a caller has not taken yet, held to a memory budget.
//!
//! An answer the server has built waits in memory until its client takes it.
//! Over HTTP/2 a client can leave a stream's window closed while its connection
//! answers pings: the connection never stalls, so [`crate::conns::Watched`] never
//! ends it, and every answer on such a stream stays in memory (review r34 L6:
//! about 200 answers of 1 MiB a connection, 128 connections an address). So each
//! answer is weighed when it is built and held against its caller's share and
//! the server's whole budget until it is taken or dropped; one that does not fit
//! is dropped at once and refused with `429 answers_not_taken`, which clients
//! retry. A caller is the credential it presents (a token, a console session),
//! or its address when it presents none: the answers worth holding need a
//! credential that authenticates, and another spelling of a wrong one is
//! answered with a few bytes.
//!
//! The body hands its answer out in frames of at most [`crate::pipe::FRAME`]
//! bytes, the last [`COPIED_TAIL`] of it copied, so that what the connection
//! still holds for a stream once the body has ended is those copies, not the
//! whole buffer the frames were cut from.

use crate::conns::Places;
use axum::body::Bytes;
use axum::http::{HeaderMap, header};
use axum::response::{IntoResponse, Response};
use std::sync::Arc;

/// The end of an answer handed out as copies: more than a connection holds of
/// an answer once its body has ended (HTTP/2: [`crate::H2_SEND_BUFFER`] a
/// stream; HTTP/1.1: hyper's queue of a few frames; review r36 M2).
const COPIED_TAIL: u64 = 512 << 10;

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
    /// A token (by its id) or a console user (by name), authenticated: however
    /// many spellings of the token or sessions of the user, one share.
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

/// An anonymous address's share, and the anonymous pool, in MiB.
const ANONYMOUS_PER_ADDRESS_MIB: u64 = 16;
const ANONYMOUS_MIB: u64 = 128;

fn kib(mib: u64) -> usize {
    usize::try_from(mib.saturating_mul(1024)).unwrap_or(usize::MAX)
}

impl Answers {
    pub fn new(per_caller_mib: u64, all_mib: u64) -> Answers {
        Answers {
            known: Places::new(kib(per_caller_mib), kib(all_mib)),
            anonymous: Places::new(kib(ANONYMOUS_PER_ADDRESS_MIB), kib(ANONYMOUS_MIB)),
            per_caller_mib,
            refused: std::sync::atomic::AtomicU64::new(0),
        }
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
    pub fn hold(&self, caller: Caller, resp: Response) -> Response {
        let weight = weight_of(&resp);
        let kib = usize::try_from(weight.div_ceil(1024)).unwrap_or(usize::MAX);
        let place = match caller {
            Caller::Known(who) => self.known.enter_weighing(who, kib).map(Place::Known),
            Caller::Anonymous(ip) => self
                .anonymous
                .enter_weighing(crate::conns::address_of(ip), kib)
                .map(Place::Anonymous),
        };
        let Some(place) = place else {
            drop(resp);
            self.refused
                .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
            return crate::api::ApiError::new(
                axum::http::StatusCode::TOO_MANY_REQUESTS,
                "answers_not_taken",
                format!(
                    "answers to this caller that it has not taken yet, or the server's to \
                     all callers, hold what they may ({} MiB a caller: \
                     answer_memory_per_caller_mib): take them, then ask again",
                    self.per_caller_mib
                ),
            )
            .into_response();
        };
        let left = resp
            .headers()
            .get(header::CONTENT_LENGTH)
            .and_then(|v| v.to_str().ok())
            .and_then(|v| v.parse::<u64>().ok());
        resp.map(|inner| {
            let left = left.or_else(|| http_body::Body::size_hint(&inner).exact());
            axum::body::Body::new(Held {
                inner,
                current: Bytes::new(),
                left,
                _place: Some(place),
            })
        })
    }
}

/// A place in one of the two pools.
enum Place {
    Known(#[allow(dead_code)] crate::conns::Place<String>),
    Anonymous(#[allow(dead_code)] crate::conns::Place<std::net::IpAddr>),
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
/// credential authenticates (as [`crate::api::authenticate`] and the session
/// cookie read it), or, with none that does, its address.
pub fn caller(app: &crate::App, headers: &HeaderMap, peer: std::net::IpAddr) -> Caller {
    let auth = headers
        .get(header::AUTHORIZATION)
        .and_then(|v| v.to_str().ok());
    let session = match auth {
        Some(v) => v.strip_prefix("Session ").map(str::to_string),
        None => crate::signin::cookie(headers, crate::signin::COOKIE),
    };
    let token = |presented: &str| {
        app.tokens
            .authenticate(presented)
            .ok()
            .flatten()
            .map(|t| Caller::Known(format!("token {}", t.id)))
    };
    let known = match (session, auth) {
        (Some(id), _) => match app.signins.get(&id) {
            Some((crate::signin::Identity::User(name, _), _)) => {
                Some(Caller::Known(format!("user {name}")))
            }
            Some((crate::signin::Identity::Token(t), _)) => token(&t),
            None => None,
        },
        (None, Some(v)) => v
            .split_once(' ')
            .filter(|(scheme, _)| scheme.eq_ignore_ascii_case("bearer"))
            .and_then(|(_, t)| token(t.trim())),
        (None, None) => None,
    };
    known.unwrap_or(Caller::Anonymous(peer))
}

/// An answer's body with its place in the budget, handed out a frame at a time.
struct Held {
    inner: axum::body::Body,
    /// What the inner body gave and this one has not handed out yet.
    current: Bytes,
    /// Bytes still to hand out, when the answer's length is known.
    left: Option<u64>,
    _place: Option<Place>,
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
                let mut frame = this.current.split_to(n);
                if let Some(left) = &mut this.left {
                    // The last frames: copies of their own, so that the buffer
                    // they were cut from goes with this body, whatever the
                    // connection still holds of them once it has ended.
                    if *left <= COPIED_TAIL {
                        frame = Bytes::copy_from_slice(&frame);
                    }
                    *left = left.saturating_sub(n as u64);
                }
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

    /// A caller's answers hold its share until they are taken or dropped; one
    /// that does not fit is refused and another caller is answered.
    #[tokio::test]
    async fn answers_not_taken_hold_their_callers_share() {
        let a = Answers::new(2, 3);
        let one = a.hold(Caller::Known("token a".into()), answer(1 << 20));
        assert_eq!(one.status(), 200);
        let two = a.hold(Caller::Known("token a".into()), answer(1 << 20));
        assert_eq!(two.status(), 200);
        let refused = a.hold(Caller::Known("token a".into()), answer(1 << 20));
        assert_eq!(refused.status(), 429);
        let b = a.hold(Caller::Known("token b".into()), answer(1 << 20));
        assert_eq!(b.status(), 200);
        assert_eq!(
            a.hold(Caller::Known("token c".into()), answer(1 << 20))
                .status(),
            429,
            "3 MiB in all"
        );
        // Taken whole: its place is given back.
        let got = one.into_body().collect().await.unwrap().to_bytes();
        assert_eq!(got.len(), 1 << 20);
        assert_eq!(
            a.hold(Caller::Known("token a".into()), answer(1 << 20))
                .status(),
            200
        );
        drop((two, b));
        let c = a.hold(Caller::Known("token c".into()), answer(2 << 20));
        assert_eq!(c.status(), 200);
        // A streamed answer weighs what it says it holds (over the share: as much
        // as the share).
        let mut s = answer(10);
        s.extensions_mut().insert(Weight(3 << 20));
        assert_eq!(a.hold(Caller::Known("token d".into()), s).status(), 429);
        assert_eq!(
            a.hold(Caller::Known("token d".into()), answer(1 << 20))
                .status(),
            200
        );
        assert_eq!(a.refused(), 3);
        assert_eq!(a.held_bytes(), 2 << 20);
        drop(c);
        assert_eq!(a.held_bytes(), 0);
    }

    /// Frames of at most FRAME bytes, the last COPIED_TAIL bytes copies of
    /// their own, the rest cut from the answer's buffer, and the answer whole.
    #[tokio::test]
    async fn answers_go_out_in_frames_their_tail_copied() {
        let a = Answers::new(16, 16);
        let data: Vec<u8> = (0..(1u32 << 20) + 1000).map(|i| i as u8).collect();
        let src = Bytes::from(data.clone());
        let mut body = a
            .hold(
                Caller::Known("x".into()),
                Response::new(axum::body::Body::from(src.clone())),
            )
            .into_body();
        let (mut got, mut cut) = (Vec::new(), 0);
        let inside = src.as_ptr_range();
        while let Some(f) = body.frame().await {
            let d = f.unwrap().into_data().unwrap();
            assert!(d.len() <= crate::pipe::FRAME);
            let left = data.len() - got.len();
            if inside.contains(&d.as_ptr()) {
                assert!(
                    left as u64 > COPIED_TAIL,
                    "cut at {left} bytes from the end"
                );
                cut += d.len();
            } else {
                assert!(
                    left as u64 <= COPIED_TAIL,
                    "a copy {left} bytes from the end"
                );
            }
            got.extend_from_slice(&d);
        }
        assert_eq!(got, data);
        assert!(cut as u64 >= data.len() as u64 - COPIED_TAIL - crate::pipe::FRAME as u64);
    }
}
