//! Bounds on connections: how many the server serves at once, and how many of
//! them one address may hold. Without them, a client that opens connections and
//! sends nothing (each costs a task and a read buffer) could take all memory or
//! all of the server's attention; with the global bound alone, one address could
//! still take every place.

use std::collections::HashMap;
use std::hash::Hash;
use std::net::IpAddr;
use std::sync::{Arc, Mutex};

/// Places held at once per key (an address's connections, a caller's
/// downloads, the bytes of a caller's answers not yet taken), at most `each`
/// per key and `all` in all.
pub struct Places<K> {
    each: usize,
    all: usize,
    /// A key holding less than this may enter past `all` ([`Places::with_floor`]).
    floor: usize,
    /// Places held in all, and by key (keys holding none are dropped).
    open: Mutex<(usize, HashMap<K, usize>)>,
    /// Told when a place is given back ([`Places::released`]).
    given_back: tokio::sync::Notify,
}

/// Connections per address ([`Places::enter_from`]).
pub type PerAddress = Places<IpAddr>;

/// One key's place (of some weight), given back on drop.
pub struct Place<K: Hash + Eq> {
    of: Arc<Places<K>>,
    key: K,
    weight: usize,
}

impl<K: Hash + Eq + Clone> Places<K> {
    pub fn new(each: usize, all: usize) -> Arc<Places<K>> {
        Self::with_floor(each, all, 0)
    }

    /// As [`Places::new`], and a key holding less than `floor` (with the new
    /// place) enters whatever all the others hold: a few keys that fill `all`
    /// cannot shut the rest out (audit r36: a token's sessions filled the
    /// answer budget and every other caller was refused). What is held in all
    /// is then at most `all` and `floor` a key.
    pub fn with_floor(each: usize, all: usize, floor: usize) -> Arc<Places<K>> {
        Arc::new(Places {
            each: each.max(1),
            all: all.max(1),
            floor: floor.min(each),
            open: Mutex::new((0, HashMap::new())),
            given_back: tokio::sync::Notify::new(),
        })
    }

    /// Resolves when a place is given back after it is enabled or first polled:
    /// a wait for room that does not poll.
    pub fn released(&self) -> tokio::sync::futures::Notified<'_> {
        self.given_back.notified()
    }

    /// A place for `key`, or `None` when it holds `each` already or all places
    /// are taken.
    pub fn enter(self: &Arc<Self>, key: K) -> Option<Place<K>> {
        self.enter_weighing(key, 1)
    }

    /// A place of `weight` for `key`, or `None` when the key's places and this
    /// one would pass `each`, or all places and this one would pass `all`. A
    /// weight over a bound is taken as the bound (it enters where nothing is
    /// held), so that no place is out of reach.
    pub fn enter_weighing(self: &Arc<Self>, key: K, weight: usize) -> Option<Place<K>> {
        let weight = weight.clamp(1, self.each.min(self.all));
        let mut guard = self.open.lock().unwrap_or_else(|e| e.into_inner());
        let (total, open) = &mut *guard;
        let n = open.entry(key.clone()).or_insert(0);
        let over_all = *total + weight > self.all && *n + weight > self.floor;
        if *n + weight > self.each || over_all {
            if *n == 0 {
                open.remove(&key);
            }
            return None;
        }
        *n += weight;
        *total += weight;
        Some(Place {
            of: self.clone(),
            key,
            weight,
        })
    }

    /// The weight held in all.
    pub fn held(&self) -> usize {
        self.open.lock().unwrap_or_else(|e| e.into_inner()).0
    }

    #[cfg(test)]
    fn keys(&self) -> usize {
        self.open.lock().unwrap().1.len()
    }
}

impl Places<IpAddr> {
    /// A place for a connection from `ip`. IPv6 addresses count by their /64 (one
    /// host usually has a whole /64 to draw from), IPv4 ones written as IPv6 as
    /// IPv4.
    pub fn enter_from(self: &Arc<Self>, ip: IpAddr) -> Option<Place<IpAddr>> {
        self.enter(address_of(ip))
    }
}

impl<K: Hash + Eq> Place<K> {
    /// The weight this place holds.
    pub fn weight(&self) -> usize {
        self.weight
    }
}

impl<K: Hash + Eq> Drop for Place<K> {
    fn drop(&mut self) {
        let mut guard = self.of.open.lock().unwrap_or_else(|e| e.into_inner());
        let (total, open) = &mut *guard;
        if let Some(n) = open.get_mut(&self.key) {
            *n -= self.weight;
            *total -= self.weight;
            if *n == 0 {
                open.remove(&self.key);
            }
        }
        drop(guard);
        self.of.given_back.notify_waiters();
    }
}

/// The answers of one connection that its client has not taken, so that a
/// connection that leaves one of them untaken too long is ended (audit r36
/// F4). Over HTTP/1 a client that stops taking its answer stalls the
/// connection's writes, which [`Watched`] ends; over HTTP/2 it can shut one
/// stream's window while the connection goes on answering pings, and that
/// answer, with its room in [`crate::answers`], stayed for as long as the
/// connection did.
///
/// An answer's wait alone does not end a connection whose other answers are
/// being taken: HTTP/2 interleaves its streams, and with many answers over a
/// slow link each one's frame completes only every so often (review r39: 100
/// answers at 40 KiB/s, 160 s a frame). Such a connection is ended only once
/// an answer has waited four times the limit.
pub struct Untaken {
    answers: Mutex<Vec<std::sync::Weak<Taking>>>,
    /// When the connection last had a frame of any answer taken.
    any: Arc<Mutex<tokio::time::Instant>>,
}

impl Default for Untaken {
    fn default() -> Untaken {
        Untaken {
            answers: Mutex::default(),
            any: Arc::new(Mutex::new(tokio::time::Instant::now())),
        }
    }
}

/// One answer's frames handed to the connection: how many it has not sent or
/// dropped yet, and since when the client has taken none of them.
pub struct Taking {
    out: Mutex<(usize, tokio::time::Instant)>,
    /// The connection's [`Untaken::any`].
    any: Arc<Mutex<tokio::time::Instant>>,
}

impl Taking {
    /// A frame is handed to the connection: with none out before, the client's
    /// clock starts now.
    pub fn handed(&self) {
        let mut out = self.out.lock().unwrap_or_else(|e| e.into_inner());
        if out.0 == 0 {
            out.1 = tokio::time::Instant::now();
        }
        out.0 += 1;
    }

    /// A frame handed out was sent (or dropped): the client took something.
    pub fn taken(&self) {
        let now = tokio::time::Instant::now();
        let mut out = self.out.lock().unwrap_or_else(|e| e.into_inner());
        out.0 = out.0.saturating_sub(1);
        out.1 = now;
        drop(out);
        *self.any.lock().unwrap_or_else(|e| e.into_inner()) = now;
    }

    /// How long frames of it have waited with none taken, if any wait.
    fn waiting(&self, now: tokio::time::Instant) -> Option<std::time::Duration> {
        let out = self.out.lock().unwrap_or_else(|e| e.into_inner());
        (out.0 > 0).then(|| now.saturating_duration_since(out.1))
    }
}

/// A connection's requests being handled, and when the last one ended: one
/// with none and no answer left to send for `connection_idle_secs` is closed
/// (QA r41: a client that sent one request and then only answered the server's
/// HTTP/2 pings kept its place for good, and enough of them kept every other
/// client waiting to be accepted).
pub struct Busy {
    running: std::sync::atomic::AtomicUsize,
    since: Mutex<tokio::time::Instant>,
}

impl Default for Busy {
    fn default() -> Busy {
        Busy {
            running: Default::default(),
            since: Mutex::new(tokio::time::Instant::now()),
        }
    }
}

/// A request of a [`Busy`] connection being handled; it ends when dropped.
pub struct Running(Arc<Busy>);

impl Drop for Running {
    fn drop(&mut self) {
        *self.0.since.lock().unwrap_or_else(|e| e.into_inner()) = tokio::time::Instant::now();
        self.0
            .running
            .fetch_sub(1, std::sync::atomic::Ordering::SeqCst);
    }
}

impl Busy {
    /// A request begins.
    pub fn start(self: &Arc<Self>) -> Running {
        self.running
            .fetch_add(1, std::sync::atomic::Ordering::SeqCst);
        Running(self.clone())
    }

    /// Resolves once the connection has had no request running and no answer
    /// in `answers` left to send for `limit` (looked at every eighth of it, at
    /// most every 15 s).
    pub async fn idle(&self, answers: &Untaken, limit: std::time::Duration) {
        let every = (limit / 8).clamp(
            std::time::Duration::from_millis(100),
            std::time::Duration::from_secs(15),
        );
        loop {
            tokio::time::sleep(every).await;
            if self.running.load(std::sync::atomic::Ordering::SeqCst) > 0 || answers.holds_any() {
                continue;
            }
            let since = *self.since.lock().unwrap_or_else(|e| e.into_inner());
            if since.elapsed() >= limit {
                return;
            }
        }
    }
}

impl Untaken {
    /// Whether an answer of the connection is still being sent.
    fn holds_any(&self) -> bool {
        let mut answers = self.answers.lock().unwrap_or_else(|e| e.into_inner());
        answers.retain(|a| a.strong_count() > 0);
        !answers.is_empty()
    }

    /// A new answer's frames, watched while the answer lives.
    pub fn track(&self) -> Arc<Taking> {
        let taking = Arc::new(Taking {
            out: Mutex::new((0, tokio::time::Instant::now())),
            any: self.any.clone(),
        });
        let mut answers = self.answers.lock().unwrap_or_else(|e| e.into_inner());
        // Answers that ended are swept as they pile up: a connection holds at
        // most a few hundred streams at once.
        if answers.len() >= 64 && answers.len().is_power_of_two() {
            answers.retain(|a| a.strong_count() > 0);
        }
        answers.push(Arc::downgrade(&taking));
        taking
    }

    /// The longest any of the connection's answers has waited with none of it
    /// taken.
    fn longest_wait(&self) -> Option<std::time::Duration> {
        let now = tokio::time::Instant::now();
        let mut answers = self.answers.lock().unwrap_or_else(|e| e.into_inner());
        answers.retain(|a| a.strong_count() > 0);
        answers
            .iter()
            .filter_map(|a| a.upgrade()?.waiting(now))
            .max()
    }

    /// Resolves once an answer of the connection has waited `limit` with none
    /// of it taken while the connection took nothing either for a quarter of
    /// it, or four times `limit` whatever the others did (looked at every
    /// eighth of `limit`, at most every 15 s).
    pub async fn stalled(&self, limit: std::time::Duration) {
        let every = (limit / 8).clamp(
            std::time::Duration::from_millis(100),
            std::time::Duration::from_secs(15),
        );
        loop {
            tokio::time::sleep(every).await;
            let Some(wait) = self.longest_wait() else {
                continue;
            };
            let idle = self.any.lock().unwrap_or_else(|e| e.into_inner()).elapsed();
            if wait >= limit && (idle >= limit / 4 || wait >= 4 * limit) {
                return;
            }
        }
    }
}

/// What counts as one address: see [`Places::enter_from`].
pub(crate) fn address_of(ip: IpAddr) -> IpAddr {
    match ip {
        IpAddr::V4(_) => ip,
        IpAddr::V6(v6) => match v6.to_ipv4_mapped() {
            Some(v4) => IpAddr::V4(v4),
            None => {
                let s = v6.segments();
                IpAddr::V6(std::net::Ipv6Addr::new(s[0], s[1], s[2], s[3], 0, 0, 0, 0))
            }
        },
    }
}

/// A connection that must send its first bytes within a deadline. hyper's
/// `header_read_timeout` runs only once a request has begun, and the builder that
/// tells HTTP/1 from HTTP/2 reads the first bytes with no timeout at all: a client
/// that connects (and finishes TLS) and then sends nothing held its connection
/// forever, and enough of them shut everyone else out. The first read that waits
/// past the deadline fails (`TimedOut`), which ends the connection; after the first
/// bytes, hyper's own timeouts apply.
///
/// And a connection whose writes make no progress for `write_limit` is ended: a
/// client that stops reading its answers (a zero TCP window) would otherwise
/// hold them, the memory they take and the work behind them (an export's
/// threads) for as long as it keeps the connection open (audit r33). Any byte
/// written restarts that clock.
pub struct Watched<S> {
    inner: S,
    deadline: Option<std::pin::Pin<Box<tokio::time::Sleep>>>,
    /// Bytes read so far, while they may still be the HTTP/2 preface.
    seen: usize,
    write_limit: std::time::Duration,
    /// Since when writes have waited (none: the last one made progress).
    writes_waiting: Option<std::pin::Pin<Box<tokio::time::Sleep>>>,
}

/// What an HTTP/2 connection starts with. The builder reads until it has all 24
/// bytes or one that differs, with no timeout of its own: the deadline holds until
/// then (a client sending `P` and nothing more must not hold the connection).
const H2_PREFACE: &[u8; 24] = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n";

impl<S> Watched<S> {
    /// `inner`, whose first bytes must come `within`, and whose writes may wait
    /// no longer than `write_limit`.
    pub fn new(inner: S, within: std::time::Duration, write_limit: std::time::Duration) -> Self {
        Watched {
            inner,
            deadline: Some(Box::pin(tokio::time::sleep(within))),
            seen: 0,
            write_limit,
            writes_waiting: None,
        }
    }

    /// What a write that returned `r` means: progress clears the clock, waiting
    /// starts it (or ends the connection once it ran out).
    fn judge<T>(
        &mut self,
        cx: &mut std::task::Context<'_>,
        r: std::task::Poll<std::io::Result<T>>,
    ) -> std::task::Poll<std::io::Result<T>> {
        use std::future::Future;
        use std::task::Poll;
        match r {
            Poll::Ready(r) => {
                self.writes_waiting = None;
                Poll::Ready(r)
            }
            Poll::Pending => {
                let limit = self.write_limit;
                let since = self
                    .writes_waiting
                    .get_or_insert_with(|| Box::pin(tokio::time::sleep(limit)));
                if since.as_mut().poll(cx).is_ready() {
                    Poll::Ready(Err(std::io::Error::new(
                        std::io::ErrorKind::TimedOut,
                        "the client took none of the answer for too long",
                    )))
                } else {
                    Poll::Pending
                }
            }
        }
    }
}

/// Adds the bytes just read to `seen` (how many matched the HTTP/2 preface so far);
/// true once the version is decided: all of the preface, or a byte that is not
/// its (HTTP/1, whose header timeout then applies).
fn decided(seen: &mut usize, bytes: &[u8]) -> bool {
    for &b in bytes {
        if *seen >= H2_PREFACE.len() || b != H2_PREFACE[*seen] {
            return true;
        }
        *seen += 1;
    }
    *seen >= H2_PREFACE.len()
}

impl<S: tokio::io::AsyncRead + Unpin> tokio::io::AsyncRead for Watched<S> {
    fn poll_read(
        mut self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
        buf: &mut tokio::io::ReadBuf<'_>,
    ) -> std::task::Poll<std::io::Result<()>> {
        use std::future::Future;
        use std::task::Poll;
        let before = buf.filled().len();
        let this = &mut *self;
        match std::pin::Pin::new(&mut this.inner).poll_read(cx, buf) {
            Poll::Ready(r) => {
                if this.deadline.is_some()
                    && buf.filled().len() > before
                    && decided(&mut this.seen, &buf.filled()[before..])
                {
                    this.deadline = None;
                }
                Poll::Ready(r)
            }
            Poll::Pending => {
                let expired = this
                    .deadline
                    .as_mut()
                    .is_some_and(|d| d.as_mut().poll(cx).is_ready());
                if expired {
                    Poll::Ready(Err(std::io::Error::new(
                        std::io::ErrorKind::TimedOut,
                        "no request in time",
                    )))
                } else {
                    Poll::Pending
                }
            }
        }
    }
}

impl<S: tokio::io::AsyncWrite + Unpin> tokio::io::AsyncWrite for Watched<S> {
    fn poll_write(
        mut self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
        buf: &[u8],
    ) -> std::task::Poll<std::io::Result<usize>> {
        let r = std::pin::Pin::new(&mut self.inner).poll_write(cx, buf);
        self.judge(cx, r)
    }

    fn poll_write_vectored(
        mut self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
        bufs: &[std::io::IoSlice<'_>],
    ) -> std::task::Poll<std::io::Result<usize>> {
        let r = std::pin::Pin::new(&mut self.inner).poll_write_vectored(cx, bufs);
        self.judge(cx, r)
    }

    fn is_write_vectored(&self) -> bool {
        self.inner.is_write_vectored()
    }

    fn poll_flush(
        mut self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<std::io::Result<()>> {
        let r = std::pin::Pin::new(&mut self.inner).poll_flush(cx);
        self.judge(cx, r)
    }

    fn poll_shutdown(
        mut self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<std::io::Result<()>> {
        // A TLS close to a peer that reads nothing waits no longer than a write.
        let r = std::pin::Pin::new(&mut self.inner).poll_shutdown(cx);
        self.judge(cx, r)
    }
}

#[cfg(test)]
mod tests {

    /// Writes to a peer that stops reading end after the limit; a peer that
    /// reads, however slowly, is written to for as long as it takes.
    #[tokio::test]
    async fn a_peer_that_stops_reading_is_cut_off() {
        use std::time::Duration;
        use tokio::io::{AsyncReadExt, AsyncWriteExt};
        let (mut peer, ours) = tokio::io::duplex(1024);
        let mut w =
            super::Watched::new(ours, Duration::from_secs(3600), Duration::from_millis(200));
        let slow = tokio::spawn(async move {
            let mut b = [0u8; 100];
            let mut got = 0;
            while got < 8192 {
                tokio::time::sleep(Duration::from_millis(20)).await;
                got += peer.read(&mut b).await.unwrap();
            }
            peer
        });
        // 8 KiB through a 1 KiB pipe read 100 bytes every 20 ms: about 1.6 s.
        w.write_all(&[7u8; 8192]).await.unwrap();
        let _peer = slow.await.unwrap();
        let started = std::time::Instant::now();
        let e = w.write_all(&[7u8; 4096]).await.unwrap_err();
        assert_eq!(e.kind(), std::io::ErrorKind::TimedOut);
        assert!(started.elapsed() >= Duration::from_millis(200));
    }

    /// A peer that sends nothing is cut off at the deadline; one that sends in time
    /// is read as it sends, long after the deadline.
    #[tokio::test]
    async fn a_silent_connection_is_cut_off_and_a_talking_one_is_not() {
        use std::time::Duration;
        use tokio::io::{AsyncReadExt, AsyncWriteExt};
        let (mut peer, ours) = tokio::io::duplex(64);
        let mut silent = Watched::new(ours, Duration::from_millis(100), Duration::from_secs(3600));
        let mut buf = [0u8; 8];
        let t = std::time::Instant::now();
        let e = silent.read(&mut buf).await.unwrap_err();
        assert_eq!(e.kind(), std::io::ErrorKind::TimedOut);
        assert!(t.elapsed() < Duration::from_secs(5));
        drop(peer.shutdown().await);

        let (mut peer, ours) = tokio::io::duplex(64);
        let mut talking = Watched::new(ours, Duration::from_millis(100), Duration::from_secs(3600));
        peer.write_all(b"GET").await.unwrap();
        assert_eq!(talking.read(&mut buf).await.unwrap(), 3);
        tokio::time::sleep(Duration::from_millis(200)).await;
        peer.write_all(b" /").await.unwrap();
        assert_eq!(talking.read(&mut buf).await.unwrap(), 2);

        // A start of the HTTP/2 preface, then nothing: still cut off.
        let (mut peer, ours) = tokio::io::duplex(64);
        let mut teasing = Watched::new(ours, Duration::from_millis(100), Duration::from_secs(3600));
        peer.write_all(b"PRI * ").await.unwrap();
        assert_eq!(teasing.read(&mut buf).await.unwrap(), 6);
        let e = teasing.read(&mut buf).await.unwrap_err();
        assert_eq!(e.kind(), std::io::ErrorKind::TimedOut);
        // The whole preface: decided, the deadline over.
        let (mut peer, ours) = tokio::io::duplex(64);
        let mut h2 = Watched::new(ours, Duration::from_millis(100), Duration::from_secs(3600));
        peer.write_all(H2_PREFACE).await.unwrap();
        let mut all = [0u8; 24];
        h2.read_exact(&mut all).await.unwrap();
        tokio::time::sleep(Duration::from_millis(200)).await;
        peer.write_all(b"x").await.unwrap();
        assert_eq!(h2.read(&mut buf).await.unwrap(), 1);
    }
    use super::*;

    #[test]
    fn an_address_holds_at_most_its_share_until_it_closes_some() {
        let p = PerAddress::new(2, usize::MAX);
        let a: IpAddr = "10.0.0.1".parse().unwrap();
        let b: IpAddr = "10.0.0.2".parse().unwrap();
        let one = p.enter_from(a).unwrap();
        let _two = p.enter_from(a).unwrap();
        assert!(p.enter_from(a).is_none());
        let _other = p.enter_from(b).unwrap();
        drop(one);
        let _three = p.enter_from(a).unwrap();
        drop((_two, _three, _other));
        assert_eq!(p.keys(), 0, "nothing kept for closed connections");
        // One IPv6 /64 is one address; an IPv4 address written as IPv6 is itself.
        let x: IpAddr = "2001:db8:1:2::5".parse().unwrap();
        let y: IpAddr = "2001:db8:1:2:ffff::9".parse().unwrap();
        let z: IpAddr = "2001:db8:1:3::5".parse().unwrap();
        let _x = p.enter_from(x).unwrap();
        let _y = p.enter_from(y).unwrap();
        assert!(p.enter_from(x).is_none(), "the /64 holds two");
        let _z = p.enter_from(z).unwrap();
        let _v4 = p.enter_from(a).unwrap();
        let _v4b = p.enter_from(a).unwrap();
        assert!(p.enter_from("::ffff:10.0.0.1".parse().unwrap()).is_none());
    }

    /// A bound in all as well as per key: a place refused for it leaves
    /// nothing behind, and one given back makes room for any key.
    #[test]
    fn places_are_bounded_in_all_too() {
        let p = super::Places::<&str>::new(2, 3);
        let a1 = p.enter("a").unwrap();
        let _a2 = p.enter("a").unwrap();
        assert!(p.enter("a").is_none());
        let _b1 = p.enter("b").unwrap();
        assert!(p.enter("c").is_none(), "three in all");
        assert_eq!(p.keys(), 2);
        drop(a1);
        let _c1 = p.enter("c").unwrap();
    }

    /// Weighed places: a key holds up to its bound in weight, a weight over the
    /// bound enters alone, and what is given back is what was taken.
    #[test]
    fn weighed_places_count_their_weight() {
        let p = super::Places::<&str>::new(10, 15);
        let a = p.enter_weighing("a", 6).unwrap();
        assert!(p.enter_weighing("a", 5).is_none(), "6 + 5 > 10");
        let a4 = p.enter_weighing("a", 4).unwrap();
        assert!(p.enter_weighing("b", 6).is_none(), "15 in all");
        let b5 = p.enter_weighing("b", 5).unwrap();
        drop((a, a4));
        let big = p.enter_weighing("a", 1000).unwrap();
        assert!(
            p.enter_weighing("a", 1).is_none(),
            "taken as the whole bound"
        );
        drop((big, b5));
        assert_eq!(p.keys(), 0);
        assert_eq!(p.open.lock().unwrap().0, 0);
        // With a floor, a key holding little enters past the bound in all.
        let p = super::Places::<&str>::with_floor(10, 15, 3);
        let _a = p.enter_weighing("a", 10).unwrap();
        let _b = p.enter_weighing("b", 5).unwrap();
        assert!(p.enter_weighing("c", 4).is_none(), "over the floor");
        let c = p.enter_weighing("c", 3).unwrap();
        assert!(p.enter_weighing("c", 1).is_none(), "the floor reached");
        assert!(p.enter_weighing("b", 1).is_none(), "b holds past its floor");
        drop(c);
        assert_eq!(p.held(), 15);
    }
}
