//! Bandwidth limits: a pacer per token and one for the whole server, in each
//! direction. A transfer reserves its bytes on the pacers that apply, a piece
//! at a time, and waits until the slowest of them has room: an upload's body
//! is read so (`BodyPool::read`), an answer sent so (`api::send_paced`), and
//! the client hears from the server all along, at the limit.

use std::sync::Mutex;
use std::time::{Duration, Instant};

/// Up to this much transfer time may be used at once before pacing starts.
const BURST: Duration = Duration::from_secs(1);

pub struct Pacer {
    bytes_per_sec: f64,
    /// When the bytes reserved so far will have gone through at the limit.
    next: Mutex<Instant>,
}

impl Pacer {
    pub fn new(bytes_per_sec: u64) -> Pacer {
        Pacer {
            bytes_per_sec: bytes_per_sec.max(1) as f64,
            next: Mutex::new(Instant::now()),
        }
    }

    /// Reserves `bytes` and returns how long the caller must wait.
    pub fn reserve(&self, bytes: u64) -> Duration {
        let now = Instant::now();
        let mut next = self.next.lock().unwrap_or_else(|e| e.into_inner());
        let floor = now.checked_sub(BURST).unwrap_or(now);
        let start = (*next).max(floor);
        *next = start + Duration::from_secs_f64(bytes as f64 / self.bytes_per_sec);
        next.saturating_duration_since(now + BURST)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_burst_then_the_rate() {
        let p = Pacer::new(1_000_000);
        assert_eq!(p.reserve(500_000), Duration::ZERO, "within the burst");
        assert_eq!(p.reserve(500_000), Duration::ZERO);
        let w = p.reserve(1_000_000);
        assert!(
            w > Duration::from_millis(900) && w <= Duration::from_millis(1000),
            "{w:?}"
        );
        let w = p.reserve(2_000_000);
        assert!(w > Duration::from_millis(2900), "{w:?}");
    }
}
