//! The mount's read session, kept only while the mount is used (as the server's
//! content routes keep theirs, `cairn-server/src/content.rs`).
//!
//! A read session holds a shared lock, and a prune does not delete the packs it
//! retires while a lock taken before it is live (docs/FORMAT.md, "Prune and
//! concurrent writers"). A mount left open for weeks must not hold that up, so the
//! session ends after `idle` without a request (its lock goes with it) and is
//! replaced after `max_age`; the next request opens a new one from the key kept in
//! memory ([`Repository::reopen`]: no password, no key derivation). Each new
//! session lists the snapshots again, so snapshots added or forgotten meanwhile
//! appear and disappear at the top level; a listing older than `refresh` is
//! renewed the next time the top level is looked at.
//!
//! Whatever was read stays valid across sessions: trees and blobs are named by
//! their content, so the caches outlive the session that filled them.

use crate::layout::Listing;
use crate::log::Log;
use crate::trees::lock;
use cairn_core::progress::Progress;
use cairn_core::repo::blobcache::BlobCache;
use cairn_core::session::{IndexLoad, Read, Session};
use cairn_core::{Error, Repository, Result};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, Weak};
use std::time::{Duration, Instant};

#[derive(Clone, Copy, Debug)]
pub struct Timing {
    pub idle: Duration,
    pub max_age: Duration,
    pub refresh: Duration,
}

/// How long a look at the top level waits for the snapshots to be listed again
/// before it answers with the listing it has (the new one lands when it comes):
/// a storage that stopped answering must not hang `ls` of the mount (QA: 160 s).
const REFRESH_WAIT: Duration = Duration::from_secs(2);

pub struct Sessions {
    template: Repository,
    cache: Arc<BlobCache>,
    timing: Timing,
    current: Mutex<Option<Cached>>,
    /// Held while a session opens, so that one opens at a time; `current` is
    /// not, so that what needs no storage (the sweeper, `active`, a refresh
    /// already under way) never waits for a storage that does not answer.
    opening: Mutex<()>,
    /// A listing again is under way ([`Sessions::refresh_if_stale`]).
    refreshing: AtomicBool,
    listing: Mutex<(Arc<Listing>, Instant)>,
    closed: AtomicBool,
    opened: std::sync::atomic::AtomicU64,
    /// The newest session, to wait at unmount until every reader let go of it
    /// (its lock is removed then).
    last: Mutex<Weak<Session<Read>>>,
    log: Log,
}

struct Cached {
    session: Arc<Session<Read>>,
    opened: Instant,
    used: Instant,
}

impl Sessions {
    /// Opens the first session (so that a repository that cannot be read fails the
    /// mount, not its first `ls`) and lists the snapshots.
    pub fn new(
        template: Repository,
        cache: Arc<BlobCache>,
        timing: Timing,
        log: Log,
    ) -> Result<Sessions> {
        let s = Sessions {
            template,
            cache,
            timing,
            current: Mutex::new(None),
            opening: Mutex::new(()),
            refreshing: AtomicBool::new(false),
            listing: Mutex::new((Arc::new(Listing::default()), Instant::now())),
            closed: AtomicBool::new(false),
            opened: Default::default(),
            last: Mutex::new(Weak::new()),
            log,
        };
        s.get()?;
        Ok(s)
    }

    /// The session to read with, opened now if there is none or it is too old.
    pub fn get(&self) -> Result<Arc<Session<Read>>> {
        if self.closed.load(Ordering::Relaxed) {
            return Err(Error::Invalid("the mount is being unmounted".into()));
        }
        if let Some(s) = self.current_session() {
            return Ok(s);
        }
        let _one = lock(&self.opening);
        // Opened by another request while this one waited.
        if let Some(s) = self.current_session() {
            return Ok(s);
        }
        // The old one goes first: its lock is not needed twice.
        retire(lock(&self.current).take());
        let repo = self.template.reopen()?.with_blob_cache(self.cache.clone());
        let session = Session::<Read>::open(repo, "mount", IndexLoad::ForReads, &Progress::none())?;
        let (list, problems) = Listing::new(&session.snapshots()?.0);
        for p in problems {
            self.log.error(&p);
        }
        for e in &session.snapshots()?.1 {
            self.log
                .error(&format!("snapshot {} left out: {}", e.id.short(), e.error));
        }
        *lock(&self.listing) = (Arc::new(list), Instant::now());
        let session = Arc::new(session);
        *lock(&self.last) = Arc::downgrade(&session);
        let now = Instant::now();
        *lock(&self.current) = Some(Cached {
            session: session.clone(),
            opened: now,
            used: now,
        });
        self.opened.fetch_add(1, Ordering::Relaxed);
        Ok(session)
    }

    /// The open session, if it is not older than `max_age` (marked used).
    fn current_session(&self) -> Option<Arc<Session<Read>>> {
        let mut cur = lock(&self.current);
        let c = cur
            .as_mut()
            .filter(|c| c.opened.elapsed() < self.timing.max_age)?;
        c.used = Instant::now();
        Some(c.session.clone())
    }

    /// The snapshots as the newest session listed them.
    pub fn listing(&self) -> Arc<Listing> {
        lock(&self.listing).0.clone()
    }

    /// Lists the snapshots again (a new session) if the listing is older than
    /// `refresh`, or once no session is open (the last one ended idle): the
    /// access after a pause sees what was backed up or forgotten meanwhile, as
    /// the README says (QA: listing the top level after 40 s idle still showed
    /// the old snapshots until the minute was up). A failure keeps the old
    /// listing and is logged. It waits [`REFRESH_WAIT`] at most: past that the
    /// caller answers from the listing it has, and the new one replaces it when
    /// it comes (one listing again at a time).
    pub fn refresh_if_stale(self: &Arc<Self>) {
        let idle_ended = lock(&self.current).is_none();
        if !idle_ended && lock(&self.listing).1.elapsed() < self.timing.refresh {
            return;
        }
        if self.refreshing.swap(true, Ordering::AcqRel) {
            return;
        }
        let asked = Instant::now();
        let (done, wait) = std::sync::mpsc::channel();
        let me = self.clone();
        let spawned = std::thread::Builder::new()
            .name("mount-refresh".into())
            .spawn(move || {
                let listed_meanwhile = {
                    // Waits for an open under way; one that ended after this
                    // refresh was asked for has listed the snapshots: done.
                    let _one = lock(&me.opening);
                    let listed = lock(&me.listing).1 >= asked;
                    if !listed {
                        retire(lock(&me.current).take());
                    }
                    listed
                };
                if !listed_meanwhile && let Err(e) = me.get() {
                    me.log
                        .error(&format!("cannot list the snapshots again: {e}"));
                }
                me.refreshing.store(false, Ordering::Release);
                let _ = done.send(());
            });
        match spawned {
            Ok(_) => {
                let _ = wait.recv_timeout(REFRESH_WAIT);
            }
            Err(e) => {
                self.refreshing.store(false, Ordering::Release);
                self.log
                    .error(&format!("cannot list the snapshots again: {e}"));
            }
        }
    }

    /// Ends the session if it has not been used for `idle` (its lock goes too).
    pub fn sweep(&self) {
        let mut cur = lock(&self.current);
        if cur
            .as_ref()
            .is_some_and(|c| c.used.elapsed() >= self.timing.idle)
        {
            retire(cur.take());
        }
    }

    /// Whether a session is open now.
    pub fn active(&self) -> bool {
        lock(&self.current).is_some()
    }

    /// Sessions opened so far.
    pub fn opened(&self) -> u64 {
        self.opened.load(Ordering::Relaxed)
    }

    /// Ends the session for good: none is opened after this. Waits (a few seconds
    /// at most) for requests still reading with it, so that its lock is removed
    /// before the process ends.
    pub fn close(&self) {
        self.closed.store(true, Ordering::Relaxed);
        lock(&self.current).take();
        let last = lock(&self.last).clone();
        let t = Instant::now();
        while (last.strong_count() > 0 || RETIRING.load(Ordering::Acquire) > 0)
            && t.elapsed() < Duration::from_secs(10)
        {
            std::thread::sleep(Duration::from_millis(10));
        }
    }
}

/// Ends a session away from the caller: its lock is removed from the storage,
/// which may not answer (a FUSE request or the sweeper must not wait for that).
/// [`Sessions::close`] waits for them.
fn retire(old: Option<Cached>) {
    if let Some(old) = old {
        RETIRING.fetch_add(1, Ordering::AcqRel);
        let spawned = std::thread::Builder::new()
            .name("mount-retire".into())
            .spawn(move || {
                drop(old);
                RETIRING.fetch_sub(1, Ordering::AcqRel);
            });
        if spawned.is_err() {
            // The closure, and the session with it, was dropped here.
            RETIRING.fetch_sub(1, Ordering::AcqRel);
        }
    }
}

/// Sessions being ended by [`retire`].
static RETIRING: AtomicUsize = AtomicUsize::new(0);
