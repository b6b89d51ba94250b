//! Where the mount reports what it could not read. A read that fails answers the
//! program with EIO, which says nothing about why; the reason (the damaged blob,
//! the unreachable storage) goes to the caller's sink, once per message and
//! minute, so a file read page by page does not repeat one line thousands of times.

use crate::trees::lock;
use lru::LruCache;
use std::num::NonZeroUsize;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

/// Receives one line per problem (the CLI prints it on stderr).
pub type ErrorSink = Arc<dyn Fn(&str) + Send + Sync>;

const REPEAT_AFTER: Duration = Duration::from_secs(60);
const REMEMBERED: usize = 256;

#[derive(Clone)]
pub struct Log {
    sink: ErrorSink,
    recent: Arc<Mutex<LruCache<String, Instant>>>,
}

impl Log {
    pub fn new(sink: ErrorSink) -> Log {
        Log {
            sink,
            recent: Arc::new(Mutex::new(LruCache::new(
                NonZeroUsize::new(REMEMBERED).unwrap_or(NonZeroUsize::MIN),
            ))),
        }
    }

    pub fn error(&self, msg: &str) {
        {
            let mut r = lock(&self.recent);
            if r.get(msg).is_some_and(|t| t.elapsed() < REPEAT_AFTER) {
                return;
            }
            r.put(msg.to_string(), Instant::now());
        }
        (self.sink)(msg);
    }
}
