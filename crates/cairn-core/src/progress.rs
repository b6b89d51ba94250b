//! How a running operation talks to whoever started it, without printing: a stream
//! of typed [`Event`]s out (phases, periodic counters, the current item, warnings,
//! notices) and a [`CancelToken`] in.
//!
//! The engine's threads update counters with atomic adds (a chunk's bytes, an entry
//! done) and send discrete events (a phase starts, an entry is skipped) to an
//! [`EventSink`]. Counters are not sent one by one: a [`Ticker`] samples them into
//! [`Event::Status`] at a fixed rate, so a million small files cost a million atomic
//! adds, not a million messages. The terminal display, the `--json` progress stream
//! and the server's job records are three sinks of the same events.
//!
//! Cancellation is cooperative: long operations call [`Progress::check_cancelled`] at
//! points where stopping leaves the repository as it was before (a backup before its
//! snapshot, a restore between files, a prune before it replaces the index) and
//! return [`Error::Cancelled`](crate::Error::Cancelled).

use crate::error::{Error, Result};
use serde::Serialize;
use std::path::Path;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Condvar, Mutex};
use std::time::{Duration, Instant};

/// What an operation is doing. Phases follow one another; each is announced when
/// it starts and when it ends.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Phase {
    /// Taking the repository lock.
    Locking,
    /// Queued behind other backup jobs (the datastore's `max_concurrent_jobs`).
    WaitingForJobSlot,
    /// Listing and reading snapshots.
    ListingSnapshots,
    /// Reading index files into the index's placement.
    LoadingIndex,
    /// Reading the source and storing what is new.
    Backup,
    /// Writing files under the target.
    Restore,
    /// Copying snapshots to another repository.
    Copy,
    /// Reading packs whole and verifying every blob.
    ReadingPacks,
    /// Walking snapshots' trees.
    WalkingSnapshots,
    /// Deciding what to delete and repack.
    Planning,
    /// Copying the blobs still needed out of packs that go.
    Repacking,
    /// Writing the index files that replace the old ones.
    WritingIndex,
    /// Deleting packs and objects nothing needs.
    Deleting,
    /// Reading every pack to rebuild the index.
    RebuildingIndex,
    /// Reading a tree of files to estimate what a datastore would make of it.
    Estimating,
}

/// Why an entry was left out or could not be done in full.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct Warning {
    /// The file or object concerned, when there is one.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub path: Option<String>,
    pub message: String,
}

/// A sample of an operation's counters.
#[derive(Clone, Debug, Default, PartialEq, Serialize)]
pub struct Status {
    #[serde(skip_serializing_if = "Option::is_none")]
    pub phase: Option<Phase>,
    pub elapsed_secs: f64,
    pub bytes_done: u64,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub bytes_total: Option<u64>,
    pub files_done: u64,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub files_total: Option<u64>,
    /// Files, directories and other entries finished.
    pub entries_done: u64,
    pub warnings: u64,
    /// Bytes per second since the operation started.
    pub bytes_per_sec: f64,
    /// Seconds left at the average rate so far, when a total is known.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub eta_secs: Option<f64>,
    /// The item being worked on (a file's path), if any.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub current: Option<String>,
    /// Bytes of packs handed to the upload, and stored so far: what is still on its
    /// way to the repository after everything was read (a throttled or slow link).
    #[serde(skip_serializing_if = "is_zero")]
    pub upload_queued_bytes: u64,
    #[serde(skip_serializing_if = "is_zero")]
    pub upload_done_bytes: u64,
    /// Everything the operation reads was read (what is left is storing it).
    #[serde(skip_serializing_if = "std::ops::Not::not")]
    pub read_done: bool,
}

/// Seconds the upload still needs when it is what holds the operation back (a
/// slow or throttled link): what is queued, plus what the bytes still to read
/// will pack into at the ratio so far, at the upload's average rate. Zero until a
/// pack is stored.
fn upload_eta(left_to_read: f64, read: u64, queued: u64, uploaded: u64, elapsed: f64) -> f64 {
    if uploaded == 0 || read == 0 || elapsed <= 0.0 {
        return 0.0;
    }
    let packed_per_byte = queued as f64 / read as f64;
    let left = queued.saturating_sub(uploaded) as f64 + left_to_read * packed_per_byte;
    left / (uploaded as f64 / elapsed)
}

fn is_zero(v: &u64) -> bool {
    *v == 0
}

impl Status {
    /// Everything is read, and packs are still being stored: the display shows the
    /// upload's progress instead of a finished read.
    pub fn uploading(&self) -> bool {
        self.read_done && self.upload_done_bytes < self.upload_queued_bytes
    }
}

/// Everything an operation tells its caller while it runs.
#[derive(Clone, Debug, PartialEq, Serialize)]
#[serde(tag = "type", rename_all = "snake_case")]
pub enum Event {
    PhaseStarted {
        phase: Phase,
    },
    PhaseEnded {
        phase: Phase,
        secs: f64,
    },
    /// Counters, sampled by a [`Ticker`] (and once more at the end).
    Status(Status),
    /// Something was left out or could not be done; the operation goes on.
    Warning(Warning),
    /// Something the user should know that is not a problem with their data (a
    /// retried request, a queue, a lock that could not be written).
    Notice {
        message: String,
    },
    /// `copy` committed a snapshot to the destination: said when it happens, so
    /// that a run killed later still told which copies are complete.
    SnapshotCopied {
        source: String,
        target: String,
    },
    /// A backup asked to list its files (`backup --verbose`) took this file as
    /// new, modified or unchanged since the parent snapshot: said once the file
    /// is read whole and joins its directory's tree (one that could not be read
    /// is a warning only); like all of it, saved only if the backup completes.
    /// A restore (`restore --verbose`) says what it did with a file of the target
    /// once done (and a dry run what it would do).
    File {
        action: FileAction,
        /// As listings show it (bytes that are not UTF-8 as stand-ins).
        path: String,
        size: u64,
    },
}

/// What a backup does with a file, against the parent snapshot, or a restore
/// with one, against the target.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum FileAction {
    /// Backup: not in the parent snapshot: read.
    New,
    /// Backup: in the parent snapshot, changed since: read.
    Modified,
    /// Backup: as in the parent snapshot, taken from it, not read. Restore:
    /// left as it was (it holds the snapshot's content, or --overwrite kept it).
    Unchanged,
    /// Restore: written where nothing was (or linked to its first name).
    Restored,
    /// Restore: written over what was there, or only given its owner, mode or
    /// times when its content was there already.
    Updated,
    /// Restore: removed by --delete (a directory with everything in it).
    Deleted,
}

impl FileAction {
    /// A file the backup reads: modified when the parent snapshot had a file
    /// at its path, else new.
    pub fn read(in_parent: bool) -> FileAction {
        if in_parent {
            FileAction::Modified
        } else {
            FileAction::New
        }
    }

    /// A file a restore wrote: over something (updated) or not (restored).
    pub fn written(replaced: bool) -> FileAction {
        if replaced {
            FileAction::Updated
        } else {
            FileAction::Restored
        }
    }

    pub fn name(self) -> &'static str {
        match self {
            FileAction::New => "new",
            FileAction::Modified => "modified",
            FileAction::Unchanged => "unchanged",
            FileAction::Restored => "restored",
            FileAction::Updated => "updated",
            FileAction::Deleted => "deleted",
        }
    }
}

/// Receives events, from any thread.
pub trait EventSink: Send + Sync {
    fn event(&self, event: &Event);
}

/// Discards every event.
pub struct NullSink;
impl EventSink for NullSink {
    fn event(&self, _: &Event) {}
}

/// Keeps every event (tests, and callers that want to look afterwards).
#[derive(Default)]
pub struct CollectSink(Mutex<Vec<Event>>);
impl CollectSink {
    pub fn events(&self) -> Vec<Event> {
        crate::lock(&self.0).clone()
    }
}
impl EventSink for CollectSink {
    fn event(&self, event: &Event) {
        crate::lock(&self.0).push(event.clone());
    }
}

/// Asks a running operation to stop at its next safe point. Cloning shares it.
#[derive(Clone, Debug, Default)]
pub struct CancelToken(Arc<AtomicBool>);

impl CancelToken {
    pub fn new() -> Self {
        Self::default()
    }
    pub fn cancel(&self) {
        self.0.store(true, Ordering::SeqCst);
    }
    pub fn is_cancelled(&self) -> bool {
        self.0.load(Ordering::Relaxed)
    }
    /// The flag itself, for a signal handler that may only store to an atomic.
    pub fn flag(&self) -> &Arc<AtomicBool> {
        &self.0
    }
}

#[derive(Default)]
struct Counters {
    bytes_done: AtomicU64,
    bytes_total: AtomicU64,
    files_done: AtomicU64,
    files_total: AtomicU64,
    entries_done: AtomicU64,
    warnings: AtomicU64,
    upload_queued: AtomicU64,
    upload_done: AtomicU64,
    read_done: AtomicBool,
}

/// `u64::MAX` in a total means "not known".
const UNKNOWN: u64 = u64::MAX;

struct Inner {
    sink: Arc<dyn EventSink>,
    cancel: CancelToken,
    counters: Counters,
    current: Mutex<Option<String>>,
    phase: Mutex<Option<(Phase, Instant)>>,
    started: Instant,
}

/// An operation's channel to its caller: events out, cancellation in. Cheap to
/// clone (shared); every method may be called from any engine thread.
#[derive(Clone)]
pub struct Progress(Arc<Inner>);

impl Progress {
    pub fn new(sink: Arc<dyn EventSink>, cancel: CancelToken) -> Self {
        let counters = Counters::default();
        counters.bytes_total.store(UNKNOWN, Ordering::Relaxed);
        counters.files_total.store(UNKNOWN, Ordering::Relaxed);
        Progress(Arc::new(Inner {
            sink,
            cancel,
            counters,
            current: Mutex::new(None),
            phase: Mutex::new(None),
            started: Instant::now(),
        }))
    }

    /// Reports nothing and is never cancelled.
    pub fn none() -> Self {
        Self::new(Arc::new(NullSink), CancelToken::new())
    }

    pub fn cancel_token(&self) -> &CancelToken {
        &self.0.cancel
    }

    pub fn is_cancelled(&self) -> bool {
        self.0.cancel.is_cancelled()
    }

    /// `Err(Cancelled)` once cancellation was asked for: call it where stopping is
    /// safe.
    pub fn check_cancelled(&self) -> Result<()> {
        if self.is_cancelled() {
            Err(Error::Cancelled)
        } else {
            Ok(())
        }
    }

    pub fn emit(&self, event: Event) {
        self.0.sink.event(&event);
    }

    /// Ends the current phase (if any) and starts `phase`.
    pub fn phase(&self, phase: Phase) {
        let previous = crate::lock(&self.0.phase).replace((phase, Instant::now()));
        if let Some((p, since)) = previous {
            self.emit(Event::PhaseEnded {
                phase: p,
                secs: since.elapsed().as_secs_f64(),
            });
        }
        self.emit(Event::PhaseStarted { phase });
    }

    /// Ends the current phase, and sends a last status sample.
    pub fn finish(&self) {
        if let Some((p, since)) = crate::lock(&self.0.phase).take() {
            self.emit(Event::PhaseEnded {
                phase: p,
                secs: since.elapsed().as_secs_f64(),
            });
        }
    }

    pub fn notice(&self, message: impl Into<String>) {
        self.emit(Event::Notice {
            message: message.into(),
        });
    }

    /// An entry left out or not done in full; the operation goes on.
    pub fn warning(&self, path: &Path, message: &str) {
        self.0.counters.warnings.fetch_add(1, Ordering::Relaxed);
        self.emit(Event::Warning(Warning {
            path: Some(path.display().to_string()),
            message: message.to_string(),
        }));
    }

    /// A warning about no particular path.
    pub fn warning_msg(&self, message: impl Into<String>) {
        self.0.counters.warnings.fetch_add(1, Ordering::Relaxed);
        self.emit(Event::Warning(Warning {
            path: None,
            message: message.into(),
        }));
    }

    /// The work ahead, when known (for the rate and ETA).
    pub fn set_total(&self, bytes: Option<u64>, files: Option<u64>) {
        let c = &self.0.counters;
        c.bytes_total
            .store(bytes.unwrap_or(UNKNOWN), Ordering::Relaxed);
        c.files_total
            .store(files.unwrap_or(UNKNOWN), Ordering::Relaxed);
    }

    /// Bytes of content done (read, written or verified).
    pub fn bytes_done(&self, n: u64) {
        self.0.counters.bytes_done.fetch_add(n, Ordering::Relaxed);
    }

    /// A pack of `n` bytes was handed to the upload.
    pub fn upload_queued(&self, n: u64) {
        self.0
            .counters
            .upload_queued
            .fetch_add(n, Ordering::Relaxed);
    }

    /// Everything was read; what remains is storing it.
    pub fn read_done(&self) {
        self.0.counters.read_done.store(true, Ordering::Relaxed);
    }

    /// A pack of `n` bytes was stored.
    pub fn uploaded(&self, n: u64) {
        self.0.counters.upload_done.fetch_add(n, Ordering::Relaxed);
    }

    /// A file, directory or other entry finished.
    pub fn entry_done(&self) {
        self.0.counters.entries_done.fetch_add(1, Ordering::Relaxed);
    }

    /// A regular file finished (counted towards `files_total`), which is an
    /// entry too.
    pub fn file_done(&self) {
        self.0.counters.files_done.fetch_add(1, Ordering::Relaxed);
        self.entry_done();
    }

    /// The item now being worked on.
    pub fn file_started(&self, path: &Path) {
        *crate::lock(&self.0.current) = Some(path.display().to_string());
    }

    /// A sample of the counters now.
    pub fn status(&self) -> Status {
        let c = &self.0.counters;
        let known = |v: u64| (v != UNKNOWN).then_some(v);
        let elapsed = self.0.started.elapsed().as_secs_f64();
        let bytes_done = c.bytes_done.load(Ordering::Relaxed);
        let bytes_total = known(c.bytes_total.load(Ordering::Relaxed));
        let rate = if elapsed > 0.0 {
            bytes_done as f64 / elapsed
        } else {
            0.0
        };
        let queued = c.upload_queued.load(Ordering::Relaxed);
        let uploaded = c.upload_done.load(Ordering::Relaxed);
        let eta = bytes_total.filter(|_| rate > 0.0).map(|t| {
            let left = t.saturating_sub(bytes_done) as f64;
            upload_eta(left, bytes_done, queued, uploaded, elapsed).max(left / rate)
        });
        Status {
            phase: crate::lock(&self.0.phase).map(|(p, _)| p),
            elapsed_secs: elapsed,
            bytes_done,
            bytes_total,
            files_done: c.files_done.load(Ordering::Relaxed),
            files_total: known(c.files_total.load(Ordering::Relaxed)),
            entries_done: c.entries_done.load(Ordering::Relaxed),
            warnings: c.warnings.load(Ordering::Relaxed),
            bytes_per_sec: rate,
            eta_secs: eta,
            current: crate::lock(&self.0.current).clone(),
            upload_queued_bytes: queued,
            upload_done_bytes: uploaded,
            read_done: c.read_done.load(Ordering::Relaxed),
        }
    }

    /// Samples the counters into [`Event::Status`] every `every` until the returned
    /// guard is dropped (which sends one last sample).
    pub fn ticker(&self, every: Duration) -> Ticker {
        let stop = Arc::new((Mutex::new(false), Condvar::new()));
        let progress = self.clone();
        let stop2 = stop.clone();
        let thread = std::thread::Builder::new()
            .name("cairn-progress".into())
            .spawn(move || {
                let (lock, cv) = &*stop2;
                let mut stopped = crate::lock(lock);
                loop {
                    let (s, _) = cv
                        .wait_timeout(stopped, every)
                        .unwrap_or_else(|e| e.into_inner());
                    stopped = s;
                    if *stopped {
                        return;
                    }
                    progress.emit(Event::Status(progress.status()));
                }
            })
            .ok();
        Ticker {
            progress: self.clone(),
            stop,
            thread,
        }
    }
}

/// Stops a [`Progress::ticker`] on drop, after one last sample.
pub struct Ticker {
    progress: Progress,
    stop: Arc<(Mutex<bool>, Condvar)>,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl Drop for Ticker {
    fn drop(&mut self) {
        *crate::lock(&self.stop.0) = true;
        self.stop.1.notify_all();
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
        self.progress.emit(Event::Status(self.progress.status()));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn events_phases_counters_and_cancel() {
        let sink = Arc::new(CollectSink::default());
        let cancel = CancelToken::new();
        let p = Progress::new(sink.clone(), cancel.clone());
        p.set_total(Some(100), None);
        p.phase(Phase::Backup);
        p.bytes_done(40);
        p.entry_done();
        p.warning(Path::new("/x"), "unreadable");
        assert!(p.check_cancelled().is_ok());
        cancel.cancel();
        assert!(matches!(p.check_cancelled(), Err(Error::Cancelled)));
        p.phase(Phase::Restore);
        p.finish();
        let s = p.status();
        assert_eq!(
            (s.bytes_done, s.bytes_total, s.entries_done, s.warnings),
            (40, Some(100), 1, 1)
        );
        assert_eq!(s.files_total, None);
        let ev = sink.events();
        let kinds: Vec<String> = ev
            .iter()
            .map(|e| {
                serde_json::to_value(e).unwrap()["type"]
                    .as_str()
                    .unwrap()
                    .to_string()
            })
            .collect();
        assert_eq!(
            kinds,
            [
                "phase_started",
                "warning",
                "phase_ended",
                "phase_started",
                "phase_ended"
            ]
        );
        let json = serde_json::to_string(&ev[1]).unwrap();
        assert_eq!(
            json,
            r#"{"type":"warning","path":"/x","message":"unreadable"}"#
        );
    }

    #[test]
    fn the_ticker_samples_and_ends_with_a_sample() {
        let sink = Arc::new(CollectSink::default());
        let p = Progress::new(sink.clone(), CancelToken::new());
        let t = p.ticker(Duration::from_millis(1));
        p.bytes_done(7);
        // Wait on the condition (a sample showing the bytes), not on a fixed time.
        while !sink
            .events()
            .iter()
            .any(|e| matches!(e, Event::Status(s) if s.bytes_done == 7))
        {
            std::thread::yield_now();
        }
        drop(t);
        assert!(matches!(sink.events().last(), Some(Event::Status(s)) if s.bytes_done == 7));
    }

    /// The time left follows the upload when the upload holds the read back: 100
    /// MB read of 200 in 10 s, packed at 0.5 bytes per byte read, 10 MB of it
    /// stored (1 MB/s): 40 MB queued and 50 MB still to pack take 90 s, not the
    /// 10 s the read rate alone would say.
    #[test]
    fn the_eta_follows_a_slow_upload() {
        let eta = upload_eta(100e6, 100_000_000, 50_000_000, 10_000_000, 10.0);
        assert!((eta - 90.0).abs() < 1e-6, "{eta}");
        assert_eq!(upload_eta(100e6, 100_000_000, 50_000_000, 0, 10.0), 0.0);
        let p = Progress::none();
        p.set_total(Some(200), None);
        p.bytes_done(100);
        p.upload_queued(60);
        p.uploaded(10);
        let s = p.status();
        let read_eta = 100.0 / s.bytes_per_sec;
        assert!(s.eta_secs.unwrap() > 5.0 * read_eta, "{s:?}");
    }
}
