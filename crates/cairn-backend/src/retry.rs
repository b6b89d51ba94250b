//! Retries with exponential backoff for transient failures (timeouts, dropped
//! connections, 5xx and 429 answers). Every operation of the trait is safe to repeat:
//! a put replaces the whole object with the same bytes, reads have no effect, and a
//! delete that is repeated after its first attempt in fact succeeded finds nothing,
//! which counts as success.

use crate::{Backend, BackendError, BackendErrorKind, ObjectInfo, Result};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::Duration;

#[derive(Clone, Copy, Debug)]
pub struct RetryPolicy {
    /// Attempts in all, the first included.
    pub attempts: u32,
    /// Wait before the second attempt; doubles each time up to `max_delay`.
    pub first_delay: Duration,
    pub max_delay: Duration,
    /// The most time one call may spend retrying (`--retry-for`); when set, it
    /// bounds the retries instead of `attempts`.
    pub max_total: Option<Duration>,
    /// Without `max_total`, the most time one call spends retrying even while
    /// attempts remain (default three minutes): the attempts are about a minute
    /// and a half of waits between quick failures, but an attempt that hears
    /// nothing lasts its whole silence (a minute for S3, two for a cairn
    /// server), and eight of those made a call to a stopped server take a
    /// quarter of an hour (QA).
    pub patience: Duration,
    /// The most time one call may take from its start, its first attempt
    /// included: no retry begins after it. `max_total` and `patience` count from
    /// the first failure, so that a long upload cut by a server restart is still
    /// retried; a caller that must answer someone in time (`cairn serve` a client,
    /// a mount the kernel) bounds the whole call with this instead (CI: a silent
    /// S3 storage behind the server answered its client after 40 s, one silent
    /// attempt and then the whole patience, not the 20 s it says).
    pub deadline: Option<Duration>,
}

/// Attempts at an address where nothing answers: a server restarting gets a second
/// and a little more, a wrong address or a stopped server fails within 2 seconds.
const UNREACHABLE_ATTEMPTS: u32 = 3;

/// After a call gave up on a storage that failed transiently for its whole
/// retrying time, later calls within this window are tried once: they are the
/// failed job's cleanup (its index, its lock), and retrying each for the full
/// time made a client whose server had died take 8.5 minutes to fail instead of
/// the minute and a half it says (QA). Any answer ends the window.
const AFTER_GIVING_UP: Duration = Duration::from_secs(120);

std::thread_local! {
    /// [`within`]: the most a call on this thread may take from its start.
    static WITHIN: std::cell::Cell<Option<Duration>> = const { std::cell::Cell::new(None) };
}

/// Runs `f` with every call this thread makes to retrying storage bounded to
/// `limit` from its start, as [`RetryPolicy::deadline`] bounds it: for cleanup
/// at the end of a command that has done its work (a reader's lock released
/// while its server restarts kept a finished restore for a minute and a half,
/// QA r37). A lock left behind goes stale by itself.
pub fn within<T>(limit: Duration, f: impl FnOnce() -> T) -> T {
    let before = WITHIN.with(|w| w.replace(Some(limit)));
    let r = f();
    WITHIN.with(|w| w.set(before));
    r
}

impl Default for RetryPolicy {
    /// About a minute and a half of retrying in all before a call fails: long enough
    /// for a server restart or a network blip, short enough that a dead server is
    /// reported while the administrator is still watching.
    fn default() -> Self {
        RetryPolicy {
            attempts: 8,
            first_delay: Duration::from_millis(500),
            max_delay: Duration::from_secs(30),
            max_total: None,
            patience: Duration::from_secs(180),
            deadline: None,
        }
    }
}

/// Told about each retry (error, attempt that failed counting from 1, wait before
/// the next): the CLI prints it, so a slow or flapping server is visible.
pub type RetryNotice = Box<dyn Fn(&BackendError, u32, Duration) + Send + Sync>;

pub struct RetryBackend {
    inner: Arc<dyn Backend>,
    policy: RetryPolicy,
    retries: AtomicU64,
    notice: Option<RetryNotice>,
    /// See [`RetryBackend::riding_restarts`].
    ride_restarts: bool,
    /// Some call has had an answer from the storage (anything but "nothing answers").
    answered: AtomicBool,
    /// When a call last gave up on transient failures ([`AFTER_GIVING_UP`]);
    /// cleared by any answer.
    gave_up: std::sync::Mutex<Option<std::time::Instant>>,
    /// `gave_up` is set (so that calls that succeed take no lock).
    giving_up: AtomicBool,
}

impl std::fmt::Debug for RetryBackend {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RetryBackend")
            .field("inner", &self.inner)
            .field("policy", &self.policy)
            .finish_non_exhaustive()
    }
}

impl RetryBackend {
    pub fn new(inner: Arc<dyn Backend>, policy: RetryPolicy) -> Self {
        RetryBackend {
            inner,
            policy,
            retries: AtomicU64::new(0),
            notice: None,
            ride_restarts: false,
            answered: AtomicBool::new(false),
            gave_up: std::sync::Mutex::new(None),
            giving_up: AtomicBool::new(false),
        }
    }

    /// Once the storage has answered, an address where nothing answers is retried
    /// as long as any transient failure (the policy's attempts, or `--retry-for`)
    /// rather than given up within seconds: it is the server restarting under a
    /// running job (a `cairn serve` upgraded or moved), not a wrong address. Before
    /// the first answer it still fails within seconds.
    pub fn riding_restarts(mut self) -> Self {
        self.ride_restarts = true;
        self
    }

    pub fn with_notice(mut self, notice: RetryNotice) -> Self {
        self.notice = Some(notice);
        self
    }

    /// Calls that failed transiently and were repeated.
    pub fn retries(&self) -> u64 {
        self.retries.load(Ordering::Relaxed)
    }

    fn delay(&self, attempt: u32) -> Duration {
        let base = self
            .policy
            .first_delay
            .saturating_mul(1u32 << attempt.min(20))
            .min(self.policy.max_delay);
        // Up to 25% random jitter, so that many threads retrying after one outage do
        // not all come back in the same instant.
        let nanos = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|d| d.subsec_nanos())
            .unwrap_or(0);
        let mut x = u64::from(nanos) ^ (u64::from(attempt) << 32) ^ 0x9e37_79b9_7f4a_7c15;
        x ^= x >> 33;
        x = x.wrapping_mul(0xff51_afd7_ed55_8ccd);
        x ^= x >> 33;
        base + base.mul_f64((x % 1000) as f64 / 4000.0)
    }

    /// Whether `name` holds exactly `data` (a retried create that had in fact
    /// succeeded), read back with retries; in doubt, no.
    fn holds(&self, name: &str, data: &[u8]) -> bool {
        self.run(|_| self.inner.get_bounded(name, data.len() as u64))
            .is_ok_and(|d| d == data)
    }

    fn run<T>(&self, mut f: impl FnMut(u32) -> Result<T>) -> Result<T> {
        let mut attempt = 0;
        // The retrying time counts from the first failure, not from the call's
        // start: an upload that took longer than `--retry-for` on a slow link,
        // then met a server restart, was not retried at all (QA).
        let mut failing_since: Option<std::time::Instant> = None;
        let started = std::time::Instant::now();
        let just_gave_up = || {
            self.gave_up
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .is_some_and(|t| t.elapsed() < AFTER_GIVING_UP)
        };
        loop {
            let r = f(attempt);
            match &r {
                Err(e)
                    if matches!(
                        e.kind,
                        BackendErrorKind::Unreachable | BackendErrorKind::Transient
                    ) =>
                {
                    if e.kind == BackendErrorKind::Transient {
                        self.answered.store(true, Ordering::Relaxed);
                    }
                }
                _ => {
                    self.answered.store(true, Ordering::Relaxed);
                    // Read without the lock first: every successful call passes here.
                    if self.giving_up.swap(false, Ordering::Relaxed) {
                        *self.gave_up.lock().unwrap_or_else(|e| e.into_inner()) = None;
                    }
                }
            }
            match r {
                Err(e)
                    if matches!(
                        e.kind,
                        BackendErrorKind::Transient | BackendErrorKind::Unreachable
                    ) =>
                {
                    let wait = self.delay(attempt);
                    let since = *failing_since.get_or_insert_with(std::time::Instant::now);
                    let unreachable = e.kind == BackendErrorKind::Unreachable
                        && !(self.ride_restarts && self.answered.load(Ordering::Relaxed));
                    let deadline = match (self.policy.deadline, WITHIN.with(|w| w.get())) {
                        (Some(a), Some(b)) => Some(a.min(b)),
                        (a, b) => a.or(b),
                    };
                    let past_deadline = deadline.is_some_and(|d| started.elapsed() + wait > d);
                    let out_of_time = past_deadline
                        || since.elapsed() + wait
                            > self.policy.max_total.unwrap_or(self.policy.patience);
                    let out_of_attempts = if just_gave_up() {
                        true
                    } else if unreachable {
                        attempt + 1 >= UNREACHABLE_ATTEMPTS
                    } else {
                        self.policy.max_total.is_none() && attempt + 1 >= self.policy.attempts
                    };
                    if out_of_time || out_of_attempts {
                        let tried_once = just_gave_up();
                        *self.gave_up.lock().unwrap_or_else(|e| e.into_inner()) =
                            Some(std::time::Instant::now());
                        self.giving_up.store(true, Ordering::Relaxed);
                        let why = if tried_once {
                            "tried once: another call had just given up on this storage"
                        } else if unreachable && self.answered.load(Ordering::Relaxed) {
                            "nothing answers at that address now (it answered earlier in \
                             this run): is the server running, or restarting?"
                        } else if unreachable {
                            "nothing answers at that address: is the server running, and \
                             the address right?"
                        } else if past_deadline {
                            "the most a call may take here"
                        } else if out_of_time && self.policy.max_total.is_some() {
                            "--retry-for"
                        } else {
                            "--retry-for DURATION retries longer"
                        };
                        let (from, from_what) = if past_deadline {
                            (started, "the call began")
                        } else {
                            (since, "the first failure")
                        };
                        return Err(BackendError {
                            message: format!(
                                "{} (gave up after {}, {:.1}s after {from_what}; {why})",
                                e.message,
                                if attempt == 0 {
                                    "1 attempt".to_string()
                                } else {
                                    format!("{} attempts", attempt + 1)
                                },
                                from.elapsed().as_secs_f64()
                            ),
                            ..e
                        });
                    }
                    if let Some(n) = &self.notice {
                        n(&e, attempt + 1, wait);
                    }
                    std::thread::sleep(wait);
                    self.retries.fetch_add(1, Ordering::Relaxed);
                    attempt += 1;
                }
                r => return r,
            }
        }
    }
}

impl Backend for RetryBackend {
    fn location(&self) -> String {
        self.inner.location()
    }
    fn put(&self, name: &str, data: &[u8]) -> Result<()> {
        self.run(|_| self.inner.put(name, data))
    }
    /// A repeated `put_new` whose first attempt in fact stored the object (only the
    /// answer was lost) finds it there: when it holds exactly these bytes, that is
    /// this call's own write and succeeds. Anything else stays `AlreadyExists`, as
    /// does a first attempt that finds the name taken.
    fn put_new(&self, name: &str, data: &[u8]) -> Result<()> {
        self.run(|attempt| match self.inner.put_new(name, data) {
            Err(e) if attempt > 0 && e.is_already_exists() && self.holds(name, data) => Ok(()),
            r => r,
        })
    }
    fn get(&self, name: &str) -> Result<Vec<u8>> {
        self.run(|_| self.inner.get(name))
    }
    fn get_bounded(&self, name: &str, max: u64) -> Result<Vec<u8>> {
        self.run(|_| self.inner.get_bounded(name, max))
    }
    fn size(&self, name: &str) -> Result<u64> {
        self.run(|_| self.inner.size(name))
    }
    fn get_range(&self, name: &str, offset: u64, length: u64) -> Result<Vec<u8>> {
        self.run(|_| self.inner.get_range(name, offset, length))
    }
    fn get_range_into(
        &self,
        name: &str,
        offset: u64,
        length: u64,
        out: &mut crate::bufpool::Pooled,
    ) -> Result<()> {
        self.run(|_| self.inner.get_range_into(name, offset, length, out))
    }
    fn list(&self, prefix: &str) -> Result<Vec<ObjectInfo>> {
        self.run(|_| self.inner.list(prefix))
    }
    fn delete(&self, name: &str) -> Result<()> {
        self.run(|attempt| match self.inner.delete(name) {
            // An earlier attempt may have deleted it and lost only the answer.
            Err(e) if attempt > 0 && e.is_not_found() => Ok(()),
            r => r,
        })
    }
    fn put_metadata_new(&self, name: &str, data: &[u8]) -> Result<()> {
        self.run(|attempt| match self.inner.put_metadata_new(name, data) {
            Err(e) if attempt > 0 && e.is_already_exists() && self.holds(name, data) => Ok(()),
            r => r,
        })
    }
    fn put_new_owned(&self, name: &str, data: crate::Bytes, metadata: bool) -> Result<()> {
        self.run(
            |attempt| match self.inner.put_new_owned(name, data.clone(), metadata) {
                Err(e) if attempt > 0 && e.is_already_exists() && self.holds(name, &data) => Ok(()),
                r => r,
            },
        )
    }
    fn get_metadata_range(&self, name: &str, offset: u64, length: u64) -> Result<Vec<u8>> {
        self.run(|_| self.inner.get_metadata_range(name, offset, length))
    }
    fn remove_stale_temporaries(&self) -> Result<u64> {
        self.run(|_| self.inner.remove_stale_temporaries())
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
        self.run(|_| self.inner.dedup_plan())
    }
    fn dedup_query(&self, ids: &[[u8; 32]]) -> Result<Vec<crate::DedupAnswer>> {
        self.run(|_| self.inner.dedup_query(ids))
    }
    fn dedup_confirm(&self, ids: &[[u8; 32]]) -> Result<Vec<[u8; 32]>> {
        self.run(|_| self.inner.dedup_confirm(ids))
    }
    fn job_slot(&self, operation: &str, host: &str) -> Result<crate::JobSlot> {
        self.run(|_| self.inner.job_slot(operation, host))
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
    use crate::{FaultSpec, FaultyBackend, MemBackend};

    fn quick() -> RetryPolicy {
        RetryPolicy {
            attempts: 30,
            first_delay: Duration::from_micros(50),
            max_delay: Duration::from_millis(1),
            max_total: None,
            patience: Duration::from_secs(60),
            deadline: None,
        }
    }

    fn failing(kind: BackendErrorKind) -> Result<()> {
        Err(BackendError {
            kind,
            op: "get",
            path: "config".into(),
            message: "failed".into(),
        })
    }

    /// Attempts a call makes while nothing answers, to the end.
    fn unreachable_attempts(b: &RetryBackend) -> u32 {
        let mut calls = 0;
        let r = b.run(|_| {
            calls += 1;
            failing(BackendErrorKind::Unreachable)
        });
        assert!(r.is_err());
        calls
    }

    /// Nothing listening is retried briefly, however many attempts the policy allows.
    #[test]
    fn an_unreachable_address_is_given_up_quickly() {
        let b = RetryBackend::new(Arc::new(MemBackend::new()), quick());
        let mut calls = 0;
        let e = b
            .run(|_| {
                calls += 1;
                failing(BackendErrorKind::Unreachable)
            })
            .unwrap_err();
        assert_eq!(calls, UNREACHABLE_ATTEMPTS);
        assert!(e.message.contains("is the server running"), "{e}");
    }

    /// A server that answered and then stops answering (restarting under a running
    /// job) is waited for as long as the policy allows any transient failure; one
    /// that never answered is given up quickly, riding or not.
    #[test]
    fn a_server_restarting_under_a_job_is_waited_for() {
        let b = RetryBackend::new(Arc::new(MemBackend::new()), quick()).riding_restarts();
        assert_eq!(
            unreachable_attempts(&b),
            UNREACHABLE_ATTEMPTS,
            "no answer yet: given up quickly"
        );
        b.run(|_| Ok(())).unwrap();
        let mut calls = 0;
        b.run(|_| {
            calls += 1;
            if calls < 12 {
                failing(BackendErrorKind::Unreachable)
            } else {
                Ok(())
            }
        })
        .unwrap();
        assert_eq!(calls, 12);
        // Without riding, an answer earlier changes nothing.
        let b = RetryBackend::new(Arc::new(MemBackend::new()), quick());
        b.run(|_| Ok(())).unwrap();
        assert_eq!(unreachable_attempts(&b), UNREACHABLE_ATTEMPTS);
    }

    /// Attempts that each hear nothing for long are not all made: without
    /// `--retry-for`, a call stops retrying after the policy's patience (QA: eight
    /// silent minutes against a stopped S3 server).
    #[test]
    fn silent_attempts_stop_at_the_policys_patience() {
        let policy = RetryPolicy {
            attempts: 8,
            patience: Duration::from_millis(250),
            ..quick()
        };
        let b = RetryBackend::new(Arc::new(MemBackend::new()), policy);
        let mut calls = 0;
        let started = std::time::Instant::now();
        let e = b
            .run(|_| {
                calls += 1;
                std::thread::sleep(Duration::from_millis(100));
                failing(BackendErrorKind::Transient)
            })
            .unwrap_err();
        // The first silent attempt is not counted: patience starts at its failure.
        assert!((3..=4).contains(&calls), "{calls} attempts");
        assert!(started.elapsed() < Duration::from_millis(550));
        assert!(
            e.message.contains("--retry-for DURATION retries longer"),
            "{e}"
        );
    }

    /// A deadline counts from the call's start: one silent attempt longer than it
    /// is the only one, where patience alone would begin retrying at its failure.
    #[test]
    fn a_deadline_bounds_the_call_from_its_start() {
        let slow_failure = |policy: RetryPolicy| {
            let b = RetryBackend::new(Arc::new(MemBackend::new()), policy);
            let mut calls = 0;
            let started = std::time::Instant::now();
            let _ = b.run(|_| {
                calls += 1;
                std::thread::sleep(Duration::from_millis(150));
                failing(BackendErrorKind::Transient)
            });
            (calls, started.elapsed())
        };
        let patience = RetryPolicy {
            patience: Duration::from_millis(100),
            ..quick()
        };
        assert_eq!(slow_failure(patience).0, 2);
        let (calls, took) = slow_failure(RetryPolicy {
            deadline: Some(Duration::from_millis(100)),
            ..patience
        });
        assert_eq!(calls, 1);
        assert!(took < Duration::from_millis(290), "{took:?}");
        // A quick failure first: no retry begins past the deadline, so the call
        // lasts the deadline and one attempt at most.
        let b = RetryBackend::new(
            Arc::new(MemBackend::new()),
            RetryPolicy {
                deadline: Some(Duration::from_millis(100)),
                ..quick()
            },
        );
        let started = std::time::Instant::now();
        let e = b
            .run(|attempt| {
                if attempt > 0 {
                    std::thread::sleep(Duration::from_millis(60));
                }
                failing(BackendErrorKind::Transient)
            })
            .unwrap_err();
        assert!(started.elapsed() < Duration::from_millis(250), "{e}");
        assert!(
            e.message
                .contains("after the call began; the most a call may take here"),
            "{e}"
        );
    }

    /// `within` bounds a thread's calls from their start, as a deadline does,
    /// and only while it runs: a server restarting is not waited for past it.
    #[test]
    fn within_bounds_the_calls_of_its_thread_only_while_it_runs() {
        let b = RetryBackend::new(
            Arc::new(MemBackend::new()),
            RetryPolicy {
                first_delay: Duration::from_millis(20),
                max_delay: Duration::from_millis(20),
                ..quick()
            },
        )
        .riding_restarts();
        b.run(|_| Ok(())).unwrap();
        let calls = unreachable_attempts;
        let started = std::time::Instant::now();
        let bounded = within(Duration::from_millis(100), || calls(&b));
        assert!(started.elapsed() < Duration::from_millis(300));
        assert!((2..=7).contains(&bounded), "{bounded}");
        // Afterwards (the storage answered between), the policy's attempts again.
        b.run(|_| Ok(())).unwrap();
        assert_eq!(calls(&b), 30);
    }

    /// Once a call has given up, the next ones (the failed job's cleanup) are
    /// tried once, until the storage answers again.
    #[test]
    fn after_giving_up_calls_are_tried_once_until_an_answer() {
        let b = RetryBackend::new(Arc::new(MemBackend::new()), quick());
        let attempts = |b: &RetryBackend| {
            let mut calls = 0;
            let r = b.run(|_| {
                calls += 1;
                failing(BackendErrorKind::Transient)
            });
            (calls, r.unwrap_err().message)
        };
        assert_eq!(attempts(&b).0, 30);
        for _ in 0..3 {
            let (n, m) = attempts(&b);
            assert_eq!(n, 1);
            assert!(m.contains("tried once"), "{m}");
        }
        // A permanent answer is an answer: the storage is back.
        assert!(b.get("config").unwrap_err().is_not_found());
        assert_eq!(attempts(&b).0, 30);
    }

    /// `--retry-for` counts from the first failure: a call whose first attempt
    /// alone took longer (a pack upload on a slow link) is still retried.
    #[test]
    fn retrying_time_counts_from_the_first_failure() {
        let policy = RetryPolicy {
            max_total: Some(Duration::from_millis(150)),
            ..quick()
        };
        let b = RetryBackend::new(Arc::new(MemBackend::new()), policy);
        let mut calls = 0;
        b.run(|_| {
            calls += 1;
            match calls {
                // A long upload, cut by a restart.
                1 => {
                    std::thread::sleep(Duration::from_millis(300));
                    failing(BackendErrorKind::Transient)
                }
                2 => failing(BackendErrorKind::Unreachable),
                _ => Ok(()),
            }
        })
        .unwrap();
        assert_eq!(calls, 3);
    }

    /// `--retry-for` bounds the time spent retrying, not the number of attempts.
    #[test]
    fn max_total_bounds_the_retrying_time() {
        let policy = RetryPolicy {
            attempts: 2,
            first_delay: Duration::from_millis(5),
            max_delay: Duration::from_millis(5),
            max_total: Some(Duration::from_millis(60)),
            patience: Duration::from_secs(60),
            deadline: None,
        };
        let b = RetryBackend::new(Arc::new(MemBackend::new()), policy);
        let mut calls = 0;
        let start = std::time::Instant::now();
        let e = b
            .run(|_| {
                calls += 1;
                failing(BackendErrorKind::Transient)
            })
            .unwrap_err();
        assert!(calls > 2, "the attempts bound applied instead: {calls}");
        assert!(start.elapsed() < Duration::from_secs(2));
        assert!(e.message.contains("--retry-for"), "{e}");
        // Zero: no retry at all.
        let b = RetryBackend::new(
            Arc::new(MemBackend::new()),
            RetryPolicy {
                max_total: Some(Duration::ZERO),
                ..policy
            },
        );
        let mut calls = 0;
        let _ = b.run(|_| {
            calls += 1;
            failing(BackendErrorKind::Transient)
        });
        assert_eq!(calls, 1);
    }

    /// A third of all calls failing (before or after reaching the store) is invisible
    /// above the retry layer: the whole conformance suite passes.
    #[test]
    fn conformance_through_faults() {
        let faulty = FaultyBackend::new(
            Arc::new(MemBackend::new()),
            FaultSpec::parse("fail=0.33,seed=11").unwrap(),
        );
        let faulty = Arc::new(faulty);
        let b = RetryBackend::new(faulty.clone(), quick());
        crate::conformance::run(&b);
        assert!(faulty.injected() > 20, "faults were injected");
        assert!(b.retries() >= faulty.injected() / 2);
    }

    #[test]
    fn gives_up_with_the_last_error() {
        let faulty = FaultyBackend::new(
            Arc::new(MemBackend::new()),
            FaultSpec::parse("fail=1").unwrap(),
        );
        let b = RetryBackend::new(
            Arc::new(faulty),
            RetryPolicy {
                attempts: 3,
                ..quick()
            },
        );
        let seen = Arc::new(AtomicU64::new(0));
        let counter = seen.clone();
        let b = b.with_notice(Box::new(move |e, attempt, _| {
            assert_eq!(e.kind, BackendErrorKind::Transient);
            assert_eq!(
                u64::from(attempt),
                counter.fetch_add(1, Ordering::Relaxed) + 1
            );
        }));
        let e = b.get("config").unwrap_err();
        assert_eq!(e.kind, BackendErrorKind::Transient);
        assert!(e.message.contains("after 3 attempts"), "{e}");
        assert_eq!(b.retries(), 2);
        assert_eq!(seen.load(Ordering::Relaxed), 2);
    }

    #[test]
    fn permanent_errors_are_not_retried() {
        let b = RetryBackend::new(Arc::new(MemBackend::new()), quick());
        assert!(b.get("config").unwrap_err().is_not_found());
        assert_eq!(b.retries(), 0);
    }
}
