//! Reading blobs for the mount: through the shared, bounded blob cache, each blob
//! fetched once however many readers want it at the same moment, and a few
//! fetched ahead of a sequential reader on worker threads, so that a file streams
//! at the storage's speed rather than one blob round trip at a time.

use crate::trees::lock;
use cairn_core::Error;
use cairn_core::repo::blobcache::BlobCache;
use cairn_core::session::{Read, Session};
use cairn_format::BlobId;
use crossbeam_channel::{Receiver, Sender, TrySendError};
use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Condvar, Mutex};

pub type Blob = Arc<[u8]>;
pub type FetchResult = Result<Blob, Arc<Error>>;

/// Prefetch requests waiting for a worker; more are dropped (the reader then
/// fetches the blob itself when it gets there).
const QUEUE: usize = 64;

pub struct Fetcher {
    shared: Arc<Shared>,
    tx: Sender<Job>,
}

struct Shared {
    cache: Arc<BlobCache>,
    inflight: Mutex<HashMap<BlobId, Arc<Pending>>>,
    /// Set at unmount: queued read-ahead is dropped instead of read.
    stopping: AtomicBool,
}

#[derive(Default)]
struct Pending {
    result: Mutex<Option<FetchResult>>,
    done: Condvar,
}

struct Job {
    id: BlobId,
    session: Arc<Session<Read>>,
    pending: Arc<Pending>,
}

impl Fetcher {
    /// A fetcher with `workers` threads for reading ahead; they end when the
    /// fetcher is dropped.
    pub fn new(cache: Arc<BlobCache>, workers: usize) -> Fetcher {
        let shared = Arc::new(Shared {
            cache,
            inflight: Mutex::new(HashMap::new()),
            stopping: AtomicBool::new(false),
        });
        let (tx, rx) = crossbeam_channel::bounded::<Job>(QUEUE);
        for i in 0..workers.max(1) {
            let (shared, rx): (Arc<Shared>, Receiver<Job>) = (shared.clone(), rx.clone());
            let _ = std::thread::Builder::new()
                .name(format!("mount-fetch-{i}"))
                .spawn(move || {
                    for job in rx {
                        let r = if shared.stopping.load(Ordering::Relaxed) {
                            Err(Arc::new(Error::Interrupted))
                        } else {
                            fetch(&job.session, &job.id)
                        };
                        shared.complete(&job.id, &job.pending, r);
                    }
                });
        }
        Fetcher { shared, tx }
    }

    /// Drops read-ahead not yet started (at unmount, so that the session it holds
    /// ends).
    pub fn stop(&self) {
        self.shared.stopping.store(true, Ordering::Relaxed);
    }

    /// The blob, from the cache, from a fetch already under way, or read now.
    pub fn get(&self, session: &Session<Read>, id: &BlobId) -> FetchResult {
        if let Some(b) = self.shared.cache.get(id) {
            return Ok(b);
        }
        let (pending, mine) = {
            let mut m = lock(&self.shared.inflight);
            match m.get(id) {
                Some(p) => (p.clone(), false),
                None => {
                    let p = Arc::new(Pending::default());
                    m.insert(*id, p.clone());
                    (p, true)
                }
            }
        };
        if mine {
            let r = fetch(session, id);
            self.shared.complete(id, &pending, r.clone());
            return r;
        }
        let mut g = lock(&pending.result);
        loop {
            match g.as_ref() {
                // A prefetch that found no worker: read it here.
                Some(Err(e)) if matches!(**e, Error::Interrupted) => {
                    drop(g);
                    let r = fetch(session, id);
                    if let Ok(b) = &r {
                        self.shared.cache.insert(*id, b.clone());
                    }
                    return r;
                }
                Some(r) => return r.clone(),
                None => g = pending.done.wait(g).unwrap_or_else(|e| e.into_inner()),
            }
        }
    }

    /// Starts reading the blob on a worker unless it is cached or under way.
    pub fn prefetch(&self, session: &Arc<Session<Read>>, id: &BlobId) {
        if self.shared.cache.contains(id) {
            return;
        }
        let pending = {
            let mut m = lock(&self.shared.inflight);
            if m.contains_key(id) {
                return;
            }
            let p = Arc::new(Pending::default());
            m.insert(*id, p.clone());
            p
        };
        let job = Job {
            id: *id,
            session: session.clone(),
            pending,
        };
        if let Err(TrySendError::Full(job) | TrySendError::Disconnected(job)) =
            self.tx.try_send(job)
        {
            // Nobody waits on it yet: forget it, a reader fetches it itself.
            let mut m = lock(&self.shared.inflight);
            if m.get(&job.id).is_some_and(|p| Arc::ptr_eq(p, &job.pending)) {
                m.remove(&job.id);
            }
            drop(m);
            let r = Err(Arc::new(Error::Interrupted));
            *lock(&job.pending.result) = Some(r);
            job.pending.done.notify_all();
        }
    }
}

impl Shared {
    fn complete(&self, id: &BlobId, pending: &Arc<Pending>, r: FetchResult) {
        if let Ok(b) = &r {
            self.cache.insert(*id, b.clone());
        }
        *lock(&pending.result) = Some(r);
        pending.done.notify_all();
        let mut m = lock(&self.inflight);
        if m.get(id).is_some_and(|p| Arc::ptr_eq(p, pending)) {
            m.remove(id);
        }
    }
}

/// Reads one blob; a panic in the engine becomes an error, never the end of the
/// mount.
fn fetch(session: &Session<Read>, id: &BlobId) -> FetchResult {
    std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
        session.repo().read_blob(id)
    }))
    .unwrap_or_else(|_| {
        Err(Error::Invalid(format!(
            "reading blob {} panicked",
            id.short()
        )))
    })
    .map(Blob::from)
    .map_err(Arc::new)
}
