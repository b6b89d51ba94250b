//! Job slots: the datastore's `max_concurrent_jobs`, enforced by the server.
//!
//! Direct clients queue themselves by their locks (docs/FORMAT.md, "Locks"); a
//! client behind a server could skip that, so the server keeps its own count. A
//! writing session of a non-admin token must hold a slot before it stores a pack,
//! an index file, a dedup list or a snapshot ([`crate::api::put`] refuses with
//! `no_job_slot` otherwise). A client asks with `POST .../slots`, which answers at
//! once when a slot is free and otherwise waits up to [`LONG_POLL`] and says who is
//! ahead; the client asks again until it is its turn. Waiting clients are served
//! in the order they first asked.
//!
//! A slot is freed by `DELETE .../slots`, or when its session has not been heard
//! from for the idle time (a killed client): the client repeats its `POST` every
//! third of that time while it works. The count is per server: two servers in
//! front of one datastore each allow the limit (their clients still queue by
//! locks, as direct ones do).
//!
//! One token holds all slots but one at most (see [`per_token`]): a hijacked
//! client could otherwise open sessions until it held them all and keep every
//! other host's backups waiting. Its further sessions wait without holding
//! up the others queued behind them, and at most [`QUEUED_PER_TOKEN`] of them are
//! remembered.

use serde::{Deserialize, Serialize};
use std::collections::VecDeque;
use std::sync::Mutex;
use std::time::{Duration, Instant};

/// How long one `POST .../slots` waits for a slot before answering "queued".
pub const LONG_POLL: Duration = Duration::from_secs(20);
/// Ended client jobs kept for the jobs view.
const RECENT: usize = 50;
/// Waiting sessions remembered per token; more wait unremembered (never served).
pub const QUEUED_PER_TOKEN: usize = 64;

/// The slots one token may hold at once of a datastore's `max`.
pub fn per_token(max: usize) -> usize {
    max.saturating_sub(1).max(1)
}

/// What a client reports of its job with each heartbeat: numbers only (the
/// server never learns paths). Everything is optional and bounded.
#[derive(Clone, Debug, Default, Serialize, Deserialize, PartialEq)]
pub struct ClientProgress {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub phase: Option<String>,
    #[serde(default)]
    pub elapsed_secs: f64,
    #[serde(default)]
    pub bytes_done: u64,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub bytes_total: Option<u64>,
    #[serde(default)]
    pub files_done: u64,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub files_total: Option<u64>,
    #[serde(default)]
    pub bytes_per_sec: f64,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub eta_secs: Option<f64>,
}

impl ClientProgress {
    /// Keeps what a client sent within sense: a short phase name, finite numbers.
    pub fn sanitized(mut self) -> ClientProgress {
        self.phase = self.phase.map(|p| {
            p.chars()
                .filter(|c| c.is_ascii_alphanumeric() || *c == '_')
                .take(32)
                .collect()
        });
        let finite = |x: f64| if x.is_finite() && x >= 0.0 { x } else { 0.0 };
        self.elapsed_secs = finite(self.elapsed_secs);
        self.bytes_per_sec = finite(self.bytes_per_sec);
        self.eta_secs = self.eta_secs.filter(|x| x.is_finite() && *x >= 0.0);
        self
    }
}

/// Who holds or waits for a slot.
#[derive(Clone, Debug)]
struct Holder {
    /// Token id and the client's session: `<token id>-<session>`.
    key: String,
    /// The token's id (a console user's: `user-<name>`).
    token_id: String,
    token_name: String,
    host: String,
    operation: String,
    since: i64,
    seen: Instant,
    progress: Option<ClientProgress>,
    /// Snapshots this session stored while it held the slot.
    snapshots: Vec<String>,
}

/// One running or queued job, as `GET .../slots` and the waiting client see it.
#[derive(Clone, Debug, Serialize, PartialEq)]
pub struct JobView {
    pub token: String,
    pub host: String,
    pub operation: String,
    /// Unix seconds when it started (running) or first asked (queued).
    pub since: i64,
    /// The client's last report (running jobs of clients that send one).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub progress: Option<ClientProgress>,
}

/// A client job that ended, as the jobs view shows it.
#[derive(Clone, Debug, Serialize, PartialEq)]
pub struct EndedJob {
    #[serde(flatten)]
    pub job: JobView,
    /// Unix seconds.
    pub ended: i64,
    /// `ok` (it stored a snapshot), `ended` (it gave its slot back without storing
    /// one: failed, cancelled, or nothing to store) or `lost` (the client went
    /// silent: killed, or its connection lost).
    pub outcome: String,
    pub summary: String,
}

impl Holder {
    fn view(&self) -> JobView {
        JobView {
            token: self.token_name.clone(),
            host: self.host.clone(),
            operation: self.operation.clone(),
            since: self.since,
            progress: self.progress.clone(),
        }
    }

    /// How this job ended, from what the server saw of it.
    fn ended(&self, how: End) -> EndedJob {
        let (outcome, summary) = match (self.snapshots.len(), how) {
            (0, End::Silent(idle)) => (
                "lost",
                format!(
                    "the client went silent for {} s (killed, or its connection lost)",
                    idle.as_secs()
                ),
            ),
            (0, End::Released) => (
                "ended",
                "gave its slot back without storing a snapshot (failed, cancelled, or \
                 nothing to store)"
                    .to_string(),
            ),
            (0, End::Revoked) => (
                "ended",
                "its token was removed while it ran (refused from then on)".to_string(),
            ),
            (_, how) => (
                "ok",
                format!(
                    "stored snapshot {}{}",
                    self.snapshots
                        .iter()
                        .map(|s| s.get(..8).unwrap_or(s))
                        .collect::<Vec<_>>()
                        .join(", "),
                    match how {
                        End::Released => "",
                        End::Silent(_) => " (then went silent)",
                        End::Revoked => " (then its token was removed)",
                    }
                ),
            ),
        };
        let mut job = self.view();
        job.progress = None;
        EndedJob {
            job,
            ended: cairn_core::time::now_unix(),
            outcome: outcome.to_string(),
            summary,
        }
    }
}

/// Why a job's slot came free.
#[derive(Clone, Copy)]
enum End {
    /// The client gave it back.
    Released,
    /// Nothing was heard from the client for this long.
    Silent(Duration),
    /// Its token (or console user) was removed.
    Revoked,
}

#[derive(Default)]
struct State {
    running: Vec<Holder>,
    queue: Vec<Holder>,
    /// Jobs that held a slot and ended, newest last.
    recent: VecDeque<EndedJob>,
    /// Sessions dropped for silence, running or queued, not yet taken by
    /// [`Slots::take_lost`].
    lost: Vec<Lost>,
}

/// A session the server stopped hearing from (killed, or cut off): its locks are
/// deleted ([`crate::locks::LockOwners::made_by`]), or they would keep the jobs
/// behind it waiting for them to go stale, half an hour.
#[derive(Clone, Debug, PartialEq)]
pub struct Lost {
    pub key: String,
    pub token_name: String,
    pub host: String,
}

/// Most lost sessions kept for the sweep (it takes them every few seconds).
const LOST_KEPT: usize = 1024;

impl State {
    fn remember(&mut self, e: EndedJob) {
        self.recent.push_back(e);
        while self.recent.len() > RECENT {
            self.recent.pop_front();
        }
    }
}

pub struct Slots {
    state: Mutex<State>,
    changed: tokio::sync::Notify,
    idle: Duration,
}

/// What a request for a slot got.
#[derive(Debug, PartialEq)]
pub enum Answer {
    Granted,
    /// Not yet: these jobs run, and this many are queued ahead.
    Queued {
        running: Vec<JobView>,
        ahead: Vec<JobView>,
    },
}

/// A client asking for a slot.
pub struct Request {
    pub key: String,
    pub token_id: String,
    pub token_name: String,
    pub host: String,
    pub operation: String,
    pub progress: Option<ClientProgress>,
}

impl Slots {
    /// `idle`: how long a silent session keeps its slot or its place in the queue.
    pub fn new(idle: Duration) -> Slots {
        Slots {
            state: Mutex::new(State::default()),
            changed: tokio::sync::Notify::new(),
            idle,
        }
    }

    pub fn idle(&self) -> Duration {
        self.idle
    }

    fn state(&self) -> std::sync::MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Drops silent sessions; wakes the waiters if a slot came free.
    fn expire(&self, s: &mut State) {
        let idle = self.idle;
        let before = s.running.len() + s.queue.len();
        let (alive, silent): (Vec<Holder>, Vec<Holder>) = std::mem::take(&mut s.running)
            .into_iter()
            .partition(|h| h.seen.elapsed() < idle);
        s.running = alive;
        let (waiting, gone): (Vec<Holder>, Vec<Holder>) = std::mem::take(&mut s.queue)
            .into_iter()
            .partition(|h| h.seen.elapsed() < idle);
        s.queue = waiting;
        for h in silent.iter().chain(&gone) {
            if s.lost.len() >= LOST_KEPT {
                s.lost.remove(0);
            }
            s.lost.push(Lost {
                key: h.key.clone(),
                token_name: h.token_name.clone(),
                host: h.host.clone(),
            });
        }
        for h in silent {
            let e = h.ended(End::Silent(idle));
            s.remember(e);
        }
        if s.running.len() + s.queue.len() != before {
            self.changed.notify_waiters();
        }
    }

    /// One attempt: granted if `key` holds a slot or may take one now (a free slot
    /// and no earlier waiter for it), else queued (and remembered).
    fn try_take(&self, max: usize, r: &Request) -> Answer {
        let mut guard = self.state();
        let s = &mut *guard;
        let now = Instant::now();
        // The asker is alive: not to be taken for silent by the look below (its
        // locks would be deleted as a lost session's).
        for h in s.running.iter_mut().chain(s.queue.iter_mut()) {
            if h.key == r.key {
                h.seen = now;
            }
        }
        self.expire(s);
        if let Some(h) = s.running.iter_mut().find(|h| h.key == r.key) {
            h.seen = now;
            if r.progress.is_some() {
                h.progress = r.progress.clone();
            }
            return Answer::Granted;
        }
        let cap = per_token(max);
        let held =
            |s: &State, token: &str| s.running.iter().filter(|h| h.token_name == token).count();
        let place = match s.queue.iter().position(|h| h.key == r.key) {
            Some(i) => {
                s.queue[i].seen = now;
                i
            }
            None if s
                .queue
                .iter()
                .filter(|h| h.token_name == r.token_name)
                .count()
                >= QUEUED_PER_TOKEN =>
            {
                return Answer::Queued {
                    running: s.running.iter().map(Holder::view).collect(),
                    ahead: s.queue.iter().map(Holder::view).collect(),
                };
            }
            None => {
                s.queue.push(Holder {
                    key: r.key.clone(),
                    token_id: r.token_id.clone(),
                    token_name: r.token_name.clone(),
                    host: r.host.clone(),
                    operation: r.operation.clone(),
                    since: cairn_core::time::now_unix(),
                    seen: now,
                    progress: None,
                    snapshots: Vec::new(),
                });
                s.queue.len() - 1
            }
        };
        // Waiters ahead whose token holds its share cannot take a slot: they do
        // not hold up those behind them.
        let ahead = s.queue[..place]
            .iter()
            .filter(|h| held(s, &h.token_name) < cap)
            .count();
        if held(s, &r.token_name) < cap && s.running.len() + ahead < max {
            let mut h = s.queue.remove(place);
            h.since = cairn_core::time::now_unix();
            s.running.push(h);
            return Answer::Granted;
        }
        Answer::Queued {
            running: s.running.iter().map(Holder::view).collect(),
            ahead: s.queue[..place].iter().map(Holder::view).collect(),
        }
    }

    /// Ends the jobs, and drops the waits, of tokens (and console users) that
    /// `exists` says are gone: their clients are refused from their next request
    /// on, and their slots are not to stay held until they have been silent for
    /// the idle time.
    pub fn end_removed(&self, exists: &dyn Fn(&str) -> bool) {
        let mut s = self.state();
        let before = s.running.len() + s.queue.len();
        let (kept, gone): (Vec<Holder>, Vec<Holder>) = std::mem::take(&mut s.running)
            .into_iter()
            .partition(|h| exists(&h.token_id));
        s.running = kept;
        for h in gone {
            let e = h.ended(End::Revoked);
            s.remember(e);
        }
        s.queue.retain(|h| exists(&h.token_id));
        if s.running.len() + s.queue.len() != before {
            self.changed.notify_waiters();
        }
    }

    /// Asks for a slot for up to `wait`; `max` is the datastore's limit now.
    /// Jobs of tokens `exists` says are removed are ended first, each time it looks.
    pub async fn request(
        &self,
        max: u32,
        r: &Request,
        wait: Duration,
        exists: &(dyn Fn(&str) -> bool + Sync),
    ) -> Answer {
        let deadline = tokio::time::Instant::now() + wait;
        loop {
            // Registered before looking, so a release in between is not missed.
            let woken = self.changed.notified();
            self.end_removed(exists);
            let a = self.try_take(max.max(1) as usize, r);
            if a == Answer::Granted || tokio::time::Instant::now() >= deadline {
                return a;
            }
            // Silent holders expire by time, not by an event: look again each second.
            let tick = (tokio::time::Instant::now() + Duration::from_secs(1)).min(deadline);
            let _ = tokio::time::timeout_at(tick, woken).await;
        }
    }

    /// The session ends its job (or gives up waiting).
    pub fn release(&self, key: &str) -> bool {
        let mut s = self.state();
        let before = s.running.len() + s.queue.len();
        if let Some(i) = s.running.iter().position(|h| h.key == key) {
            let h = s.running.remove(i);
            let e = h.ended(End::Released);
            s.remember(e);
        }
        s.queue.retain(|h| h.key != key);
        let found = s.running.len() + s.queue.len() != before;
        if found {
            self.changed.notify_waiters();
        }
        found
    }

    /// Whether `key` holds a slot (and notes that it is alive).
    pub fn holds(&self, key: &str) -> bool {
        let mut s = self.state();
        self.expire(&mut s);
        match s.running.iter_mut().find(|h| h.key == key) {
            Some(h) => {
                h.seen = Instant::now();
                true
            }
            None => false,
        }
    }

    /// A request of `key` arrived: a running job or a waiter is alive.
    pub fn touch(&self, key: &str) {
        let mut guard = self.state();
        let s = &mut *guard;
        let now = Instant::now();
        for h in s.running.iter_mut().chain(s.queue.iter_mut()) {
            if h.key == key {
                h.seen = now;
            }
        }
    }

    /// The session `key` stored snapshot `id` (noted for its job's outcome).
    pub fn stored_snapshot(&self, key: &str, id: &str) {
        let mut s = self.state();
        if let Some(h) = s.running.iter_mut().find(|h| h.key == key)
            && h.snapshots.len() < 16
        {
            h.snapshots.push(id.to_string());
        }
    }

    /// The sessions dropped for silence since the last call (looking for them now).
    pub fn take_lost(&self) -> Vec<Lost> {
        let mut s = self.state();
        self.expire(&mut s);
        std::mem::take(&mut s.lost)
    }

    /// Client jobs that ended, newest first.
    pub fn recent(&self) -> Vec<EndedJob> {
        let mut s = self.state();
        self.expire(&mut s);
        s.recent.iter().rev().cloned().collect()
    }

    /// The running and the queued jobs.
    pub fn jobs(&self) -> (Vec<JobView>, Vec<JobView>) {
        let mut s = self.state();
        self.expire(&mut s);
        (
            s.running.iter().map(Holder::view).collect(),
            s.queue.iter().map(Holder::view).collect(),
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn req(key: &str) -> Request {
        Request {
            key: key.into(),
            token_id: format!("id-{key}"),
            token_name: format!("token-{key}"),
            host: "h".into(),
            operation: "backup".into(),
            progress: None,
        }
    }

    fn rt() -> tokio::runtime::Runtime {
        tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap()
    }

    #[test]
    fn slots_are_granted_up_to_the_limit_then_in_the_order_asked() {
        let rt = rt();
        let s = Slots::new(Duration::from_secs(60));
        let now = Duration::ZERO;
        rt.block_on(async {
            assert_eq!(
                s.request(2, &req("a"), now, &|_| true).await,
                Answer::Granted
            );
            assert_eq!(
                s.request(2, &req("b"), now, &|_| true).await,
                Answer::Granted
            );
            let Answer::Queued { running, ahead } = s.request(2, &req("c"), now, &|_| true).await
            else {
                panic!("c got a third slot");
            };
            assert_eq!((running.len(), ahead.len()), (2, 0));
            let Answer::Queued { ahead, .. } = s.request(2, &req("d"), now, &|_| true).await else {
                panic!("d got a slot");
            };
            assert_eq!(ahead.len(), 1, "c is ahead of d");
            // Asking again keeps the slot; d cannot jump c when one comes free.
            assert_eq!(
                s.request(2, &req("a"), now, &|_| true).await,
                Answer::Granted
            );
            assert!(s.release("a"));
            assert!(matches!(
                s.request(2, &req("d"), now, &|_| true).await,
                Answer::Queued { .. }
            ));
            assert_eq!(
                s.request(2, &req("c"), now, &|_| true).await,
                Answer::Granted
            );
            assert!(s.holds("c") && s.holds("b") && !s.holds("d"));
            // A waiter is woken by a release, not by its timeout.
            let t = std::time::Instant::now();
            let d = req("d");
            let (got, _) = tokio::join!(
                s.request(2, &d, Duration::from_secs(30), &|_| true),
                async {
                    tokio::time::sleep(Duration::from_millis(100)).await;
                    s.release("b")
                }
            );
            assert_eq!(got, Answer::Granted);
            assert!(t.elapsed() < Duration::from_secs(5));
        });
    }

    /// One token's sessions leave a slot to the others; its waiting sessions do
    /// not hold up other tokens' behind them.
    #[test]
    fn one_token_leaves_a_slot_to_the_others() {
        let rt = rt();
        let s = Slots::new(Duration::from_secs(60));
        let now = Duration::ZERO;
        let of = |key: &str, token: &str| Request {
            token_name: token.into(),
            ..req(key)
        };
        rt.block_on(async {
            for k in ["a1", "a2", "a3"] {
                assert_eq!(
                    s.request(4, &of(k, "a"), now, &|_| true).await,
                    Answer::Granted,
                    "{k}"
                );
            }
            for k in ["a4", "a5"] {
                assert!(
                    matches!(
                        s.request(4, &of(k, "a"), now, &|_| true).await,
                        Answer::Queued { .. }
                    ),
                    "{k}"
                );
            }
            assert_eq!(
                s.request(4, &of("b1", "b"), now, &|_| true).await,
                Answer::Granted
            );
            assert!(matches!(
                s.request(4, &of("c1", "c"), now, &|_| true).await,
                Answer::Queued { .. }
            ));
            // A slot comes free: the first in line takes it.
            assert!(s.release("a1"));
            assert_eq!(
                s.request(4, &of("a4", "a"), now, &|_| true).await,
                Answer::Granted
            );
            // The next: a5 is ahead of c1 but its token holds its share.
            assert!(s.release("b1"));
            assert!(matches!(
                s.request(4, &of("a5", "a"), now, &|_| true).await,
                Answer::Queued { .. }
            ));
            assert_eq!(
                s.request(4, &of("c1", "c"), now, &|_| true).await,
                Answer::Granted
            );
            // A single slot can be held by anyone.
            assert_eq!(per_token(1), 1);
            assert_eq!(per_token(2), 1);
            // A token's waiting sessions are remembered up to a bound.
            for i in 0..QUEUED_PER_TOKEN + 5 {
                let _ = s
                    .request(4, &of(&format!("z{i}"), "z"), now, &|_| true)
                    .await;
            }
            let waiting = s
                .state()
                .queue
                .iter()
                .filter(|h| h.token_name == "z")
                .count();
            assert_eq!(waiting, QUEUED_PER_TOKEN);
        });
    }

    #[test]
    fn a_silent_session_loses_its_slot() {
        let rt = rt();
        let s = Slots::new(Duration::from_millis(300));
        rt.block_on(async {
            assert_eq!(
                s.request(1, &req("a"), Duration::ZERO, &|_| true).await,
                Answer::Granted
            );
            let got = s
                .request(1, &req("b"), Duration::from_secs(10), &|_| true)
                .await;
            assert_eq!(got, Answer::Granted, "a went silent");
            assert!(!s.holds("a"));
            // Touching keeps a holder alive.
            for _ in 0..5 {
                tokio::time::sleep(Duration::from_millis(100)).await;
                s.touch("b");
            }
            assert!(s.holds("b"));
            assert_eq!(s.jobs().0.len(), 1);
            // The silent one is given once to the sweep that deletes its locks.
            let lost: Vec<String> = s.take_lost().into_iter().map(|l| l.key).collect();
            assert_eq!(lost, ["a"]);
            assert!(s.take_lost().is_empty());
            // So is one silent in the queue; one that gave its slot back is not.
            assert!(matches!(
                s.request(1, &req("c"), Duration::ZERO, &|_| true).await,
                Answer::Queued { .. }
            ));
            assert!(s.release("b"));
            tokio::time::sleep(Duration::from_millis(400)).await;
            let lost: Vec<String> = s.take_lost().into_iter().map(|l| l.key).collect();
            assert_eq!(lost, ["c"]);
        });
    }

    /// A removed token's job ends, and its waits go, the next time anyone asks:
    /// not after it has been silent for the idle time.
    #[test]
    fn a_removed_tokens_jobs_end_at_once() {
        let rt = rt();
        let s = Slots::new(Duration::from_secs(90));
        rt.block_on(async {
            assert_eq!(
                s.request(1, &req("a"), Duration::ZERO, &|_| true).await,
                Answer::Granted
            );
            let waits = s.request(1, &req("w"), Duration::ZERO, &|_| true).await;
            assert!(matches!(waits, Answer::Queued { .. }));
            let removed = |id: &str| id != "id-a" && id != "id-w";
            let got = s.request(1, &req("b"), Duration::ZERO, &removed).await;
            assert_eq!(got, Answer::Granted);
            assert!(!s.holds("a"));
            assert!(s.state().queue.is_empty());
            let ended = s.recent();
            assert_eq!(ended.len(), 1);
            assert!(
                ended[0].summary.contains("token was removed"),
                "{:?}",
                ended[0]
            );
        });
    }
}
