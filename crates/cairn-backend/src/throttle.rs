//! Upload and download rate limits (`--limit-upload`, `--limit-download`) and the
//! traffic counters that commands report (bytes sent to and read from the
//! repository, requests made). The limit is a reservation clock per direction:
//! each transfer books `bytes / rate` seconds on it, after the transfers booked
//! before it, and does not return before its booking ends. Over any stretch of
//! transfers the average stays at or under the limit, whatever the number of
//! threads. Objects travel whole, so the link sees bursts at line speed separated
//! by pauses; the average is what a shared WAN link or a metered quota cares about.

use crate::{Backend, ObjectInfo, Result};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

/// Bytes and requests that crossed between cairn and the repository's storage.
#[derive(Debug, Default)]
pub struct Traffic {
    pub uploaded: AtomicU64,
    pub downloaded: AtomicU64,
    pub requests: AtomicU64,
}

impl Traffic {
    pub fn uploaded(&self) -> u64 {
        self.uploaded.load(Ordering::Relaxed)
    }
    pub fn downloaded(&self) -> u64 {
        self.downloaded.load(Ordering::Relaxed)
    }
    pub fn requests(&self) -> u64 {
        self.requests.load(Ordering::Relaxed)
    }
}

/// An average rate for any stream of transfers, shared by threads: the upload and
/// download limits here, and the engine's source-read and restore-write limits.
#[derive(Debug)]
pub struct Limiter {
    bytes_per_sec: u64,
    next_free: Mutex<Instant>,
    /// The lane of [`Limiter::take_ahead`]: paced among themselves, those
    /// transfers pass the ones waiting in the main lane.
    ahead_free: Mutex<Instant>,
}

impl Limiter {
    pub fn new(bytes_per_sec: u64) -> Self {
        Limiter {
            bytes_per_sec: bytes_per_sec.max(1),
            next_free: Mutex::new(Instant::now()),
            ahead_free: Mutex::new(Instant::now()),
        }
    }

    /// Books this transfer's time and waits until the booking ends, or until the
    /// process is asked to stop ([`stop_waits_on`]): at a low rate one small file's
    /// booking can last minutes, and Ctrl-C must not wait for it.
    pub fn take(&self, bytes: u64) {
        let end = Self::book(&self.next_free, self.cost(bytes));
        Self::wait_until(end);
    }

    /// Books this transfer's time in a lane of its own and waits until that
    /// booking ends: such transfers are paced among themselves at the rate, and
    /// go ahead of the ones [`Limiter::take`] keeps waiting (whose bookings
    /// stand); their time is added to the main lane too, so the transfers
    /// booked there after them wait for it. The average holds over any stretch
    /// long enough to drain both lanes; in a short one both may send at once.
    pub fn take_ahead(&self, bytes: u64) {
        let cost = self.cost(bytes);
        Self::book(&self.next_free, cost);
        let end = Self::book(&self.ahead_free, cost);
        Self::wait_until(end);
    }

    fn cost(&self, bytes: u64) -> Duration {
        Duration::from_secs_f64(bytes as f64 / self.bytes_per_sec as f64)
    }

    /// Books `cost` on `lane` after what is booked there; returns its end.
    fn book(lane: &Mutex<Instant>, cost: Duration) -> Instant {
        let mut next = lane.lock().unwrap_or_else(|p| p.into_inner());
        *next = (*next).max(Instant::now()) + cost;
        *next
    }

    fn wait_until(end: Instant) {
        loop {
            let now = Instant::now();
            if end <= now || STOP.get().is_some_and(|s| s.load(Ordering::Relaxed)) {
                return;
            }
            std::thread::sleep((end - now).min(Duration::from_millis(100)));
        }
    }
}

static STOP: std::sync::OnceLock<Arc<std::sync::atomic::AtomicBool>> = std::sync::OnceLock::new();

/// Makes every rate limit's wait end early once `flag` is set (the process's
/// cancellation flag, set by SIGINT or SIGTERM). The work that follows sees the
/// cancellation and stops; an average above the limit for that last moment is
/// of no concern.
pub fn stop_waits_on(flag: Arc<std::sync::atomic::AtomicBool>) {
    let _ = STOP.set(flag);
}

#[derive(Debug)]
pub struct ThrottledBackend {
    inner: Arc<dyn Backend>,
    up: Option<Limiter>,
    down: Option<Limiter>,
    traffic: Arc<Traffic>,
}

impl ThrottledBackend {
    /// `None` (or 0) means no limit in that direction.
    pub fn new(inner: Arc<dyn Backend>, upload: Option<u64>, download: Option<u64>) -> Self {
        ThrottledBackend {
            inner,
            up: upload.filter(|&r| r > 0).map(Limiter::new),
            down: download.filter(|&r| r > 0).map(Limiter::new),
            traffic: Arc::new(Traffic::default()),
        }
    }

    pub fn traffic(&self) -> Arc<Traffic> {
        self.traffic.clone()
    }

    /// Sends `n` bytes of object `name` by `send`: booked on the limit before (a
    /// failed attempt used the link too), counted as sent only once stored, so
    /// that a report after retries says what reached the storage, not every
    /// attempt. What is not a pack (an index file, a dedup list, a snapshot, a
    /// lock: small) goes ahead of the packs waiting for their turn, paced among
    /// itself ([`Limiter::take_ahead`]): an index file waiting behind the next
    /// pack's bytes left a stored pack unindexed for a pack's time, and a
    /// backup killed then sent it again (QA r20).
    fn sending<T>(&self, name: &str, n: usize, send: impl FnOnce() -> Result<T>) -> Result<T> {
        if let Some(l) = &self.up {
            if name.starts_with(crate::names::DATA) {
                l.take(n as u64);
            } else {
                l.take_ahead(n as u64);
            }
        }
        self.traffic.requests.fetch_add(1, Ordering::Relaxed);
        let r = send();
        if r.is_ok() {
            self.traffic.uploaded.fetch_add(n as u64, Ordering::Relaxed);
        }
        r
    }

    fn received<T: AsRef<[u8]>>(&self, r: Result<T>) -> Result<T> {
        self.traffic.requests.fetch_add(1, Ordering::Relaxed);
        if let Ok(d) = &r {
            let n = d.as_ref().len() as u64;
            self.traffic.downloaded.fetch_add(n, Ordering::Relaxed);
            // Booked once it arrived: the size of a listing-driven read is known only
            // then. The call returns when the average allows it.
            if let Some(l) = &self.down {
                l.take(n);
            }
        }
        r
    }
}

impl Backend for ThrottledBackend {
    fn location(&self) -> String {
        self.inner.location()
    }
    fn put(&self, name: &str, data: &[u8]) -> Result<()> {
        self.sending(name, data.len(), || self.inner.put(name, data))
    }
    fn put_new(&self, name: &str, data: &[u8]) -> Result<()> {
        self.sending(name, data.len(), || self.inner.put_new(name, data))
    }
    fn get(&self, name: &str) -> Result<Vec<u8>> {
        self.received(self.inner.get(name))
    }
    fn get_bounded(&self, name: &str, max: u64) -> Result<Vec<u8>> {
        self.received(self.inner.get_bounded(name, max))
    }
    fn size(&self, name: &str) -> Result<u64> {
        self.inner.size(name)
    }
    fn get_range(&self, name: &str, offset: u64, length: u64) -> Result<Vec<u8>> {
        self.received(self.inner.get_range(name, offset, length))
    }
    fn get_range_into(
        &self,
        name: &str,
        offset: u64,
        length: u64,
        out: &mut crate::bufpool::Pooled,
    ) -> Result<()> {
        let r = self.inner.get_range_into(name, offset, length, out);
        self.received(r.map(|()| &out[..])).map(|_| ())
    }
    fn list(&self, prefix: &str) -> Result<Vec<ObjectInfo>> {
        self.traffic.requests.fetch_add(1, Ordering::Relaxed);
        self.inner.list(prefix)
    }
    fn delete(&self, name: &str) -> Result<()> {
        self.traffic.requests.fetch_add(1, Ordering::Relaxed);
        self.inner.delete(name)
    }
    fn put_metadata_new(&self, name: &str, data: &[u8]) -> Result<()> {
        self.sending(name, data.len(), || self.inner.put_metadata_new(name, data))
    }
    fn put_new_owned(&self, name: &str, data: crate::Bytes, metadata: bool) -> Result<()> {
        self.sending(name, data.len(), || {
            self.inner.put_new_owned(name, data, metadata)
        })
    }
    fn get_metadata_range(&self, name: &str, offset: u64, length: u64) -> Result<Vec<u8>> {
        // A cache below this layer may fetch more than the range (the whole pack);
        // what is counted here is what the engine received.
        self.received(self.inner.get_metadata_range(name, offset, length))
    }
    fn remove_stale_temporaries(&self) -> Result<u64> {
        self.inner.remove_stale_temporaries()
    }
    fn lock_owner_prefix(&self) -> Option<[u8; 8]> {
        self.inner.lock_owner_prefix()
    }
    fn free_space(&self) -> Option<u64> {
        self.inner.free_space()
    }
    fn clock_skew(&self) -> Option<i64> {
        self.inner.clock_skew()
    }
    fn may_remove(&self) -> Result<bool> {
        self.inner.may_remove()
    }
    fn bound_host(&self) -> Result<Option<String>> {
        self.inner.bound_host()
    }
    fn partial_view(&self) -> Result<Option<String>> {
        self.inner.partial_view()
    }
    fn dedup_plan(&self) -> Result<Option<crate::DedupPlan>> {
        self.traffic.requests.fetch_add(1, Ordering::Relaxed);
        self.inner.dedup_plan()
    }
    // Queries count as traffic like objects do: 32 bytes per id up, one down.
    fn dedup_query(&self, ids: &[[u8; 32]]) -> Result<Vec<crate::DedupAnswer>> {
        let r = self.sending("dedup", ids.len() * 32, || self.inner.dedup_query(ids))?;
        self.traffic
            .downloaded
            .fetch_add(r.len() as u64, Ordering::Relaxed);
        Ok(r)
    }
    fn dedup_confirm(&self, ids: &[[u8; 32]]) -> Result<Vec<[u8; 32]>> {
        let r = self.sending("dedup", ids.len() * 32, || self.inner.dedup_confirm(ids))?;
        self.traffic
            .downloaded
            .fetch_add(32 * r.len() as u64, Ordering::Relaxed);
        Ok(r)
    }
    fn job_slot(&self, operation: &str, host: &str) -> Result<crate::JobSlot> {
        self.inner.job_slot(operation, host)
    }
    fn report_job_progress(&self, report: crate::JobReport) {
        self.inner.report_job_progress(report)
    }
    fn release_job_slot(&self) {
        self.inner.release_job_slot()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::MemBackend;

    #[test]
    fn conformance_and_counters() {
        let b = ThrottledBackend::new(Arc::new(MemBackend::new()), None, None);
        crate::conformance::run(&b);
        let t = b.traffic();
        assert!(t.uploaded() > 48 << 20);
        assert!(t.downloaded() > 48 << 20);
        assert!(t.requests() > 100);
    }

    /// A put that fails (and is retried above) is a request, not bytes sent: a
    /// report after an outage says what reached the storage.
    #[test]
    fn failed_puts_are_not_counted_as_sent() {
        let spec = crate::fault::FaultSpec::parse("fail=1,ops=put,kind=permanent").unwrap();
        let failing = Arc::new(crate::fault::FaultyBackend::new(
            Arc::new(MemBackend::new()),
            spec,
        ));
        let b = ThrottledBackend::new(failing, None, None);
        for _ in 0..3 {
            assert!(b.put("data/x", &[0u8; 1000]).is_err());
        }
        assert_eq!((b.traffic().uploaded(), b.traffic().requests()), (0, 3));
        let ok = ThrottledBackend::new(Arc::new(MemBackend::new()), None, None);
        ok.put("data/x", &[0u8; 1000]).unwrap();
        assert_eq!(ok.traffic().uploaded(), 1000);
    }

    /// 3 MB at 10 MB/s from 3 threads takes at least 0.3 s, and the counters see
    /// every byte.
    #[test]
    fn uploads_are_paced() {
        let b = ThrottledBackend::new(Arc::new(MemBackend::new()), Some(10_000_000), None);
        let t0 = Instant::now();
        std::thread::scope(|s| {
            for t in 0..3 {
                let b = &b;
                s.spawn(move || {
                    for i in 0..10 {
                        b.put(&format!("data/{t}{i}"), &vec![0u8; 100_000]).unwrap();
                    }
                });
            }
        });
        assert!(
            t0.elapsed() >= Duration::from_millis(280),
            "{:?}",
            t0.elapsed()
        );
        assert_eq!(b.traffic().uploaded(), 3_000_000);
    }

    /// An index file (anything not a pack) is not held behind packs waiting
    /// for their turn; the packs still keep the average (QA r20: a pack's index
    /// waited a pack's time, and a backup killed meanwhile sent the pack again).
    #[test]
    fn what_is_not_a_pack_goes_ahead_of_waiting_packs() {
        let b = ThrottledBackend::new(Arc::new(MemBackend::new()), Some(1_000_000), None);
        let t0 = Instant::now();
        std::thread::scope(|s| {
            for p in ["data/p1", "data/p2"] {
                let b = &b;
                s.spawn(move || b.put(p, &vec![0u8; 2_000_000]).unwrap());
                std::thread::sleep(Duration::from_millis(50));
            }
            // Both packs are booked, to 2 s and 4 s from the start.
            let t = Instant::now();
            b.put_new("index/i", &[0u8; 1000]).unwrap();
            assert!(
                t.elapsed() < Duration::from_millis(1500),
                "{:?}",
                t.elapsed()
            );
        });
        assert!(
            t0.elapsed() >= Duration::from_millis(3990),
            "{:?}",
            t0.elapsed()
        );
        assert_eq!(b.traffic().uploaded(), 4_001_000);
        // What goes ahead is paced among itself (a repair's index files, a
        // stream of them, keep the limit).
        let b = ThrottledBackend::new(Arc::new(MemBackend::new()), Some(1_000_000), None);
        let t0 = Instant::now();
        for i in 0..5 {
            b.put_new(&format!("index/{i}"), &[0u8; 200_000]).unwrap();
        }
        assert!(
            t0.elapsed() >= Duration::from_millis(990),
            "{:?}",
            t0.elapsed()
        );
    }
}
