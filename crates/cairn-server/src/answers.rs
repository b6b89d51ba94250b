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
//! bytes, the last one copied, so that what the connection still holds for a
//! stalled stream once the body has ended is that copy, not the whole buffer
//! the frames were cut from.

use crate::conns::{Place, Places};
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

/// The budget of answers not yet taken, in KiB.
pub struct Answers {
    places: Arc<Places<String>>,
    per_caller_mib: u64,
    refused: std::sync::atomic::AtomicU64,
}

impl Answers {
    pub fn new(per_caller_mib: u64, all_mib: u64) -> Answers {
        let kib = |mib: u64| usize::try_from(mib.saturating_mul(1024)).unwrap_or(usize::MAX);
        Answers {
            places: Places::new(kib(per_caller_mib), kib(all_mib)),
            per_caller_mib,
            refused: std::sync::atomic::AtomicU64::new(0),
        }
    }

    /// Bytes the answers not yet taken hold, as weighed (`/metrics`).
    pub fn held_bytes(&self) -> u64 {
        self.places.held() as u64 * 1024
    }

    /// Answers refused for want of room (`/metrics`).
    pub fn refused(&self) -> u64 {
        self.refused.load(std::sync::atomic::Ordering::Relaxed)
    }

    /// `resp`, held against `caller`'s share until its body ends or is dropped;
    /// or, when it does not fit, a refusal (and `resp` dropped).
    pub fn hold(&self, caller: String, resp: Response) -> Response {
        let weight = weight_of(&resp);
        let kib = usize::try_from(weight.div_ceil(1024)).unwrap_or(usize::MAX);
        let Some(place) = self.places.enter_weighing(caller, kib) else {
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

/// Who a request's answers are counted against: the credential it presents, as
/// the server reads it ([`crate::api::authenticate`], the session cookie), or
/// its address.
pub fn caller(headers: &HeaderMap, peer: std::net::IpAddr) -> String {
    let auth = headers
        .get(header::AUTHORIZATION)
        .and_then(|v| v.to_str().ok());
    if let Some(id) = auth.and_then(|v| v.strip_prefix("Session ")) {
        return format!("session {id}");
    }
    if let Some((scheme, token)) = auth.and_then(|v| v.split_once(' '))
        && scheme.eq_ignore_ascii_case("bearer")
    {
        return format!("token {}", token.trim());
    }
    if let Some(id) = crate::signin::cookie(headers, crate::signin::COOKIE) {
        return format!("session {id}");
    }
    format!("address {peer}")
}

/// An answer's body with its place in the budget, handed out a frame at a time.
struct Held {
    inner: axum::body::Body,
    /// What the inner body gave and this one has not handed out yet.
    current: Bytes,
    /// Bytes still to hand out, when the answer's length is known.
    left: Option<u64>,
    _place: Option<Place<String>>,
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
                    *left = left.saturating_sub(n as u64);
                    if *left == 0 {
                        // The last frame: its own copy, so that the buffer it was
                        // cut from goes with this body.
                        frame = Bytes::copy_from_slice(&frame);
                    }
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
        let one = a.hold("token a".into(), answer(1 << 20));
        assert_eq!(one.status(), 200);
        let two = a.hold("token a".into(), answer(1 << 20));
        assert_eq!(two.status(), 200);
        let refused = a.hold("token a".into(), answer(1 << 20));
        assert_eq!(refused.status(), 429);
        let b = a.hold("token b".into(), answer(1 << 20));
        assert_eq!(b.status(), 200);
        assert_eq!(
            a.hold("token c".into(), answer(1 << 20)).status(),
            429,
            "3 MiB in all"
        );
        // Taken whole: its place is given back.
        let got = one.into_body().collect().await.unwrap().to_bytes();
        assert_eq!(got.len(), 1 << 20);
        assert_eq!(a.hold("token a".into(), answer(1 << 20)).status(), 200);
        drop((two, b));
        let c = a.hold("token c".into(), answer(2 << 20));
        assert_eq!(c.status(), 200);
        // A streamed answer weighs what it says it holds (over the share: as much
        // as the share).
        let mut s = answer(10);
        s.extensions_mut().insert(Weight(3 << 20));
        assert_eq!(a.hold("token d".into(), s).status(), 429);
        assert_eq!(a.hold("token d".into(), answer(1 << 20)).status(), 200);
        assert_eq!(a.refused(), 3);
        assert_eq!(a.held_bytes(), 2 << 20);
        drop(c);
        assert_eq!(a.held_bytes(), 0);
    }

    /// Frames of at most FRAME bytes, the last one a copy of its own, and the
    /// answer whole.
    #[tokio::test]
    async fn answers_go_out_in_frames_the_last_one_copied() {
        let a = Answers::new(16, 16);
        let data: Vec<u8> = (0..200_000u32).map(|i| i as u8).collect();
        let src = Bytes::from(data.clone());
        let mut body = a
            .hold(
                "x".into(),
                Response::new(axum::body::Body::from(src.clone())),
            )
            .into_body();
        let mut got = Vec::new();
        let mut last = Bytes::new();
        while let Some(f) = body.frame().await {
            let d = f.unwrap().into_data().unwrap();
            assert!(d.len() <= crate::pipe::FRAME);
            got.extend_from_slice(&d);
            last = d;
        }
        assert_eq!(got, data);
        let inside = src.as_ptr_range();
        assert!(
            !inside.contains(&last.as_ptr()),
            "the last frame is not cut from the answer's buffer"
        );
    }

    #[test]
    fn callers_are_their_credentials() {
        let ip: std::net::IpAddr = "10.0.0.1".parse().unwrap();
        let mut h = HeaderMap::new();
        assert_eq!(caller(&h, ip), "address 10.0.0.1");
        h.insert(header::AUTHORIZATION, "bEaReR   abc ".parse().unwrap());
        assert_eq!(caller(&h, ip), "token abc");
        h.insert(header::AUTHORIZATION, "Bearer abc".parse().unwrap());
        assert_eq!(caller(&h, ip), "token abc");
        h.remove(header::AUTHORIZATION);
        h.insert(header::COOKIE, "x=1; cairn_session=s1".parse().unwrap());
        assert_eq!(caller(&h, ip), "session s1");
    }
}
