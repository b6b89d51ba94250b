//! Sessions: the only way to run an operation that reads or writes a repository's
//! data. A session takes, in this order, what keeps concurrent prunes safe (the
//! argument is in docs/FORMAT.md, "Prune and concurrent writers"):
//!
//! 1. the repository lock the operation needs (shared for everything but prune and
//!    repair, which take an exclusive one), refreshed in the background;
//! 2. for backups, a job slot (`max_concurrent_jobs`): it waits for the jobs ahead
//!    by their locks, then, through a cairn server, for the slot the server counts
//!    (which a client cannot skip: the server refuses its writes without one);
//! 3. the list of snapshots, and only then
//! 4. the index, in its placement.
//!
//! Snapshots are listed before the index is read, so every snapshot the session
//! hands out has its blobs in the index it loaded; a snapshot written later is not
//! in the session's list. Everything is released when the session is dropped
//! (including after a cancellation or an error).
//!
//! The kind of session is a type: [`Backup`], [`Read`], [`Write`] (`forget`,
//! `tag`, `rewrite`: one at a time) and [`Exclusive`] (prune, repair). Each operation asks
//! for the kind it needs (`backup` takes a `&Session<Backup>`), so a backup cannot
//! run without its job slot, and nothing commits a snapshot without a lock that is
//! provably fresh ([`Session::commit_lock`]). Only a read session may go on when
//! its lock cannot be written (read-only storage, a full disk: the day a restore
//! matters most); the worst a concurrent prune can then do is make a read fail.

use crate::error::{Error, Result};
use crate::progress::{Phase, Progress};
use crate::repo::lock::{self, RepoLock};
use crate::repo::memory::IndexUse;
use crate::repo::{Repository, SnapshotList};
use cairn_format::SnapshotId;
use cairn_format::snapshot::Snapshot;
use std::marker::PhantomData;
use std::sync::Arc;

mod sealed {
    pub trait Sealed {}
}

/// What a kind of session takes from the repository.
pub trait Access: sealed::Sealed {
    /// The lock excludes other exclusive locks (prune, repair).
    const EXCLUSIVE: bool;
    /// The session waits for a job slot before loading the index.
    const JOB_SLOT: bool;
    /// The session only reads: it may go on without a lock it cannot write.
    const READ_ONLY: bool;
    /// The session replaces or removes snapshots: one such session at a time
    /// ([`RepoLock::acquire_editing`]).
    const EDITS_SNAPSHOTS: bool = false;
}

/// Restore, ls, dump, check, stats, mount, a copy's source.
pub struct Read;
/// A backup, or a copy's destination: a shared lock and a job slot.
pub struct Backup;
/// Writes snapshots or records without a job slot: forget, tag, rewrite.
pub struct Write;
/// Prune and repair: an exclusive lock.
pub struct Exclusive;

impl sealed::Sealed for Read {}
impl sealed::Sealed for Backup {}
impl sealed::Sealed for Write {}
impl sealed::Sealed for Exclusive {}
impl Access for Read {
    const EXCLUSIVE: bool = false;
    const JOB_SLOT: bool = false;
    const READ_ONLY: bool = true;
}
impl Access for Backup {
    const EXCLUSIVE: bool = false;
    const JOB_SLOT: bool = true;
    const READ_ONLY: bool = false;
}
impl Access for Write {
    const EXCLUSIVE: bool = false;
    const JOB_SLOT: bool = false;
    const READ_ONLY: bool = false;
    const EDITS_SNAPSHOTS: bool = true;
}
impl Access for Exclusive {
    const EXCLUSIVE: bool = true;
    const JOB_SLOT: bool = false;
    const READ_ONLY: bool = false;
}

/// Sessions that may write snapshots (and so must prove their lock is fresh).
pub trait Commits: Access {}
impl Commits for Backup {}
impl Commits for Write {}
impl Commits for Exclusive {}

/// How much of the index a session loads when it opens.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum IndexLoad {
    /// The index in the repository's placement (RAM or SSD): restore, backup, ls.
    Placement,
    /// Not yet: [`Session::load_index`] loads it when the operation knows it needs
    /// it (a copy with nothing to copy loads none). Snapshots are still listed at
    /// open, so the order holds.
    Deferred,
    /// For a backup: when the storage is a cairn server that answers dedup queries,
    /// only the index files listing trees and chunk lists (the server is asked
    /// about data chunks); else as `Placement`.
    Backup,
    /// On local disk without its filter, whatever the placement: for a
    /// long-lived reader that looks up only blobs trees name (the mount), whose
    /// memory must not grow with the repository.
    ForReads,
    /// Never: the operation reads the index itself, in the order it needs (prune,
    /// repair), or not at all (forget).
    None,
}

/// What the session holds in the repository's `locks/`.
enum Held {
    Lock(Arc<RepoLock>),
    /// A read session whose lock could not be written, with why.
    Unwritable(String),
}

/// The job slot a cairn server keeps for this client (its datastore's
/// `max_concurrent_jobs`, counted by the server), released on drop. Other storage
/// grants it at once.
struct ServerSlot {
    backend: Arc<dyn cairn_backend::Backend>,
    /// The storage keeps slots: this one (or its place in line) is given back.
    kept: bool,
}

impl ServerSlot {
    /// Asks until granted, saying once (and again when the line changes) who is
    /// ahead; the cancellation token ends the wait. `None`: the storage keeps no
    /// slots.
    fn take(repo: &Repository, operation: &str, progress: &Progress) -> Result<Option<ServerSlot>> {
        // Made first: a wait that ends in an error or a cancellation leaves the line.
        let mut slot = ServerSlot {
            backend: repo.backend().clone(),
            kept: true,
        };
        let host = crate::repo::hostname();
        let mut told: Option<usize> = None;
        loop {
            progress.check_cancelled()?;
            match slot.backend.job_slot(operation, &host)? {
                cairn_backend::JobSlot::Granted => {
                    let p = progress.clone();
                    slot.backend
                        .report_job_progress(std::sync::Arc::new(move || job_report(&p)));
                    return Ok(Some(slot));
                }
                cairn_backend::JobSlot::NotKept => {
                    // Nothing to give back.
                    slot.kept = false;
                    return Ok(None);
                }
                cairn_backend::JobSlot::Queued {
                    max,
                    running,
                    ahead,
                    token_at_share,
                } => {
                    if told != Some(ahead.len()) {
                        progress.phase(Phase::WaitingForJobSlot);
                        let mut m = match token_at_share {
                            Some(held) => format!(
                                "waiting: this client's token already runs {held} jobs on this \
                                 datastore, the most one token may run at once (one less than \
                                 max-concurrent-jobs {max}, so that one client cannot take \
                                 every slot); this job starts when one of them ends:"
                            ),
                            None => format!(
                                "waiting: the server runs {} of at most {max} jobs on this \
                                 datastore and {} are queued ahead (max-concurrent-jobs):",
                                running.len(),
                                ahead.len()
                            ),
                        };
                        let shown = max as usize + 2;
                        for j in running.iter().chain(&ahead).take(shown) {
                            m.push_str("\n  ");
                            m.push_str(j);
                        }
                        // QA r43: "5 queued ahead" and 3 listed, said as all.
                        let left = (running.len() + ahead.len()).saturating_sub(shown);
                        if left > 0 {
                            m.push_str(&format!("\n  (and {left} more)"));
                        }
                        if !running.is_empty() {
                            m.push_str(
                                "\n(a job whose client died keeps its slot until the server \
                                 has not heard from it for job_idle_secs, 90 s by default)",
                            );
                        }
                        progress.notice(m);
                        told = Some(ahead.len());
                    }
                }
            }
        }
    }
}

/// What a client tells the server of its job: the numbers of its progress, never
/// the path it is at (the server must not learn names).
fn job_report(p: &Progress) -> serde_json::Value {
    let s = p.status();
    serde_json::json!({
        "phase": s.phase,
        "elapsed_secs": s.elapsed_secs,
        "bytes_done": s.bytes_done,
        "bytes_total": s.bytes_total,
        "files_done": s.files_done,
        "files_total": s.files_total,
        "bytes_per_sec": s.bytes_per_sec,
        "eta_secs": s.eta_secs,
    })
}

impl Drop for ServerSlot {
    fn drop(&mut self) {
        if self.kept {
            self.backend.release_job_slot();
        }
    }
}

/// An operation's hold on a repository. See the module documentation.
pub struct Session<A: Access> {
    repo: Repository,
    held: Held,
    /// A cairn server's job slot, given back when the session ends.
    _slot: Option<ServerSlot>,
    progress: Progress,
    snapshot_ids: Vec<SnapshotId>,
    snapshots: std::sync::OnceLock<Result<SnapshotList, Arc<Error>>>,
    index_loaded: bool,
    /// Time spent waiting for a job slot when the session opened.
    slot_wait: std::time::Duration,
    _access: PhantomData<A>,
}

/// Takes the lock `acquire` takes; while another operation holds the
/// repository, tries again until `--retry-lock` ([`Repository::lock_wait`]) is
/// spent, saying so once, and stops at once when the run is cancelled (nothing
/// was done yet). Other outcomes are `acquire`'s, for the caller to judge.
fn wait_for_lock(
    repo: &Repository,
    acquire: impl Fn() -> Result<RepoLock>,
    progress: &Progress,
) -> Result<Result<RepoLock>> {
    let wait = repo.lock_wait();
    let started = std::time::Instant::now();
    let mut said = false;
    loop {
        match acquire() {
            Err(Error::Locked(m)) if started.elapsed() < wait => {
                if !said {
                    progress.notice(format!(
                        "{m}: waiting up to {} for it (--retry-lock)",
                        crate::units::duration_words(wait.as_secs())
                    ));
                    said = true;
                }
                // Every second or two (the jitter keeps two waiting rivals
                // apart), looking for a cancellation in between.
                let jitter: [u8; 2] = cairn_format::envelope::random_bytes();
                let pause = std::time::Duration::from_millis(
                    1000 + u64::from(u16::from_le_bytes(jitter)) % 1000,
                );
                let until = std::time::Instant::now() + pause;
                while std::time::Instant::now() < until && started.elapsed() < wait {
                    if progress.is_cancelled() {
                        progress
                            .notice("stopped waiting for the lock: nothing was done".to_string());
                        return Err(Error::Cancelled);
                    }
                    std::thread::sleep(std::time::Duration::from_millis(100));
                }
            }
            Err(Error::Locked(m)) if !wait.is_zero() => {
                return Ok(Err(Error::Locked(format!(
                    "{m}; still so after waiting {} (--retry-lock)",
                    crate::units::duration_words(wait.as_secs())
                ))));
            }
            r => return Ok(r),
        }
    }
}

impl<A: Access> Session<A> {
    /// Opens a session for `operation` (the name others see in its lock: "backup",
    /// "restore", "prune", ...). Blocks while waiting for a job slot; `progress`'s
    /// cancellation token ends the wait.
    pub fn open(
        repo: Repository,
        operation: &str,
        index: IndexLoad,
        progress: &Progress,
    ) -> Result<Session<A>> {
        progress.check_cancelled()?;
        progress.phase(Phase::Locking);
        debug_assert!(!A::EDITS_SNAPSHOTS || lock::EDITING.contains(&operation));
        let acquire = || {
            if A::EDITS_SNAPSHOTS {
                match RepoLock::acquire_editing(&repo, operation) {
                    // A client that may not hold others up (a cairn server's backup
                    // token: no admin-named lock) may not remove snapshots either, so
                    // its runs cannot undo another's; a plain lock, and the operation
                    // says what it may not do.
                    Err(Error::Backend(b))
                        if b.kind == cairn_backend::BackendErrorKind::PermissionDenied =>
                    {
                        RepoLock::acquire(&repo, operation, false)
                    }
                    r => r,
                }
            } else {
                RepoLock::acquire(&repo, operation, A::EXCLUSIVE)
            }
        };
        let acquired = wait_for_lock(&repo, acquire, progress)?;
        // A server's token that may not take the repository for itself: said in
        // plain words, not as the lock object it was refused (QA r33).
        let acquired = match acquired {
            Err(Error::Backend(b))
                if A::EXCLUSIVE
                    && b.kind == cairn_backend::BackendErrorKind::PermissionDenied
                    && matches!(repo.backend().may_remove(), Ok(false)) =>
            {
                return Err(Error::Invalid(format!(
                    "{operation} needs the repository to itself, which this token may not \
                     take (an admin token can)"
                )));
            }
            r => r,
        };
        let held = match acquired {
            Ok(l) => Held::Lock(Arc::new(l)),
            // A dry run stores nothing either (`backup --dry-run` on a repository
            // mounted read-only).
            Err(Error::Backend(b)) if A::READ_ONLY || repo.backend().discards_writes() => {
                progress.warning_msg(format!(
                    "cannot write a lock ({b}); going on without one (a prune running now \
                     could make this read fail, never return wrong data)"
                ));
                Held::Unwritable(b.to_string())
            }
            Err(e) if e.is_no_space() => {
                return Err(Error::Invalid(format!(
                    "{e}: the repository's storage is full, so even a lock (under 1 KiB) \
                     cannot be stored; free a little space there (any file that is not the \
                     repository's), then `cairn forget` and `cairn prune` free the rest"
                )));
            }
            Err(e) => return Err(e),
        };
        // A storage that says its time (a cairn server): a clock far off is
        // said now, before its locks look stale to other machines' prunes.
        if let Some(skew) = repo.backend().clock_skew()
            && skew.unsigned_abs() > lock::CLOCK_SKEW_SAID.as_secs()
        {
            progress.warning_msg(format!(
                "this machine's clock is {} {} the server's: other machines' prune takes \
                 the locks of a clock far ahead for stale, and snapshots carry this machine's \
                 time; set the clock (NTP)",
                crate::units::duration_words(skew.unsigned_abs()),
                if skew > 0 { "ahead of" } else { "behind" }
            ));
        }
        let waiting = std::time::Instant::now();
        // A cairn server keeps the datastore's job slots: its clients wait in
        // its line, which it shows (metrics, the console, `GET .../slots`). A
        // lock queue before it hid them (QA r41: four clients waited on locks
        // while the server showed none queued), and one after it could wait for
        // jobs queued behind it at the server. Other storage: by the locks.
        let slot = if A::JOB_SLOT {
            ServerSlot::take(&repo, operation, progress)?
        } else {
            None
        };
        if A::JOB_SLOT
            && slot.is_none()
            && let Held::Lock(l) = &held
        {
            let max = repo.config().max_concurrent_jobs;
            lock::wait_for_job_slot(&repo, l, max, progress, |ahead| {
                progress.phase(Phase::WaitingForJobSlot);
                let mut m = format!(
                    "waiting: {} running or queued ahead (max-concurrent-jobs is {max}; \
                     change it with `cairn config --max-concurrent-jobs N`):",
                    if ahead.len() == 1 {
                        "1 backup job is".to_string()
                    } else {
                        format!("{} backup jobs are", ahead.len())
                    }
                );
                let shown = max as usize + 2;
                for j in ahead.iter().take(shown) {
                    m.push_str("\n  ");
                    m.push_str(&j.describe());
                }
                if ahead.len() > shown {
                    m.push_str(&format!("\n  (and {} more)", ahead.len() - shown));
                }
                // A job whose machine died holds its place until its lock goes
                // stale: said, so that the wait is not a mystery (QA).
                m.push_str(
                    "\n  (a job whose machine stopped keeps its place until its lock goes \
                     stale, 30 minutes after its last refresh, or, sent through a cairn \
                     server, until the server has not heard from it for its \
                     job_idle_secs; `cairn unlock` shows the \
                     locks, `cairn unlock --remove-all` removes them once you know those \
                     jobs are dead)",
                );
                progress.notice(m);
            })?;
        }
        let slot_wait = waiting.elapsed();
        progress.phase(Phase::ListingSnapshots);
        let snapshot_ids = repo.list_snapshot_ids()?;
        let mut s = Session {
            repo,
            held,
            _slot: slot,
            progress: progress.clone(),
            snapshot_ids,
            snapshots: std::sync::OnceLock::new(),
            index_loaded: false,
            slot_wait,
            _access: PhantomData,
        };
        // Before the index is read: a limit it would break is said now, not found
        // out by swapping.
        // Prune and `repair snapshots` load the index in its placement themselves
        // (prune besides its partitions on local disk); `repair index` holds none,
        // reading packs a batch at a time; forget needs none.
        let maintenance = operation == "prune" || operation.starts_with("repair");
        if !matches!(index, IndexLoad::None) || maintenance {
            let index_use = match index {
                _ if operation == "repair index" => IndexUse::NotHeld,
                IndexLoad::ForReads => IndexUse::ForReads,
                _ => IndexUse::Placement,
            };
            let plan = s.repo.memory_plan(index_use)?;
            if let Some(p) = &plan {
                progress.notice(p.describe());
            }
            s.repo.use_memory_plan(plan);
        }
        match index {
            // A reader goes past damaged index files to the packs themselves.
            IndexLoad::Placement if A::READ_ONLY => {
                let progress = s.progress.clone();
                let mut added = 0;
                s.load_index_with(|r| {
                    r.load_index_or_in_ram(&progress)?;
                    added = r.index_unlisted_packs()?;
                    Ok(())
                })?;
                if added > 0 {
                    progress.warning_msg(format!(
                        "so this run read the headers of {} that no readable index file \
                         lists, and takes their blobs from there; `cairn repair index` \
                         mends the index for good",
                        crate::units::count(added as u64, "pack")
                    ));
                }
            }
            IndexLoad::Placement => s.load_index()?,
            IndexLoad::ForReads => s.load_index_with(Repository::load_index_for_reads)?,
            IndexLoad::Backup => s.load_index_for_backup()?,
            IndexLoad::Deferred | IndexLoad::None => {}
        }
        Ok(s)
    }

    /// Opens the repository at a location string with `storage` options (the
    /// password asked only if it is encrypted), then the session, in one call.
    pub fn open_at(
        location: &str,
        storage: &crate::repo::storage::StorageOptions,
        password: impl FnOnce() -> Result<String>,
        operation: &str,
        index: IndexLoad,
        progress: &Progress,
    ) -> Result<Session<A>> {
        let repo = Repository::open_at(location, storage, password, progress)?;
        Session::open(repo, operation, index, progress)
    }

    pub fn repo(&self) -> &Repository {
        &self.repo
    }

    /// Ends the session (its lock is released) and gives the repository back.
    pub fn into_repo(self) -> Repository {
        self.repo
    }

    /// The repository, for operations inside the engine that load or replace its
    /// index in an order of their own (prune, repair, check). Not public: outside
    /// the engine, the index comes only through the session's order.
    pub(crate) fn repo_mut(&mut self) -> &mut Repository {
        &mut self.repo
    }

    pub fn progress(&self) -> &Progress {
        &self.progress
    }

    /// Loads the index in the repository's placement, unless it is loaded, or in
    /// memory when this machine cannot use the SSD placement's local files (see
    /// [`Repository::load_index_or_in_ram`]).
    pub fn load_index(&mut self) -> Result<()> {
        let progress = self.progress.clone();
        self.load_index_with(|r| r.load_index_or_in_ram(&progress))
    }

    /// [`Session::load_index`] without its fallback: `cairn index`, which checks
    /// that the placement works before recording it, must see it fail.
    pub fn load_index_in_place(&mut self) -> Result<()> {
        self.load_index_with(Repository::load_index)
    }

    /// Loads the index with `load`, unless it is loaded; damaged index files are
    /// warnings (their blobs count as missing).
    fn load_index_with(&mut self, load: impl FnOnce(&mut Repository) -> Result<()>) -> Result<()> {
        if self.index_loaded {
            return Ok(());
        }
        self.progress.check_cancelled()?;
        self.progress.phase(Phase::LoadingIndex);
        load(&mut self.repo)?;
        for e in self.repo.index_errors() {
            self.progress
                .warning_msg(format!("{e} (its blobs are treated as missing)"));
        }
        self.index_loaded = true;
        Ok(())
    }

    fn load_index_for_backup(&mut self) -> Result<()> {
        self.progress.check_cancelled()?;
        crate::hooks::point("backup:locked");
        self.progress.phase(Phase::LoadingIndex);
        if self.repo.load_index_for_backup()? {
            for e in self.repo.index_errors() {
                self.progress
                    .warning_msg(format!("{e} (its blobs are treated as missing)"));
            }
            self.index_loaded = true;
        } else {
            self.load_index()?;
        }
        let missing = self.repo.set_aside_missing_packs()?;
        if missing > 0 {
            self.progress.warning_msg(format!(
                "the index names {} that the repository's storage does not hold whole \
                 (damage, cut short, or deleted by hand): this backup stores their data again \
                 where it reads it; snapshots that need them stay damaged: run `cairn \
                 check`, then `cairn repair index` and `cairn repair snapshots`",
                crate::units::count(missing as u64, "pack"),
            ));
        }
        Ok(())
    }

    pub fn index_loaded(&self) -> bool {
        self.index_loaded
    }

    /// Snapshot ids listed when the session opened (before the index was read).
    pub fn snapshot_ids(&self) -> &[SnapshotId] {
        &self.snapshot_ids
    }

    /// The snapshots listed at open, read once (oldest first), and the errors of
    /// those that could not be read.
    pub fn snapshots(&self) -> Result<&SnapshotList> {
        let r = self.snapshots.get_or_init(|| {
            self.repo
                .read_snapshots(&self.snapshot_ids)
                .map_err(Arc::new)
        });
        r.as_ref().map_err(|e| Error::Shared(e.clone()))
    }

    /// Resolves `latest` or an id prefix among the snapshots listed at open.
    pub fn find_snapshot(&self, spec: &str) -> Result<(SnapshotId, Snapshot)> {
        self.find_snapshot_with(spec, &|note| self.progress.warning_msg(note))
    }

    /// [`Session::find_snapshot`], telling `warn` of snapshots `latest` passed
    /// over for being dated ahead of this machine's clock (for a caller whose
    /// session has no progress to say it, such as the mount).
    pub fn find_snapshot_with(
        &self,
        spec: &str,
        warn: &dyn Fn(String),
    ) -> Result<(SnapshotId, Snapshot)> {
        if spec == "latest" {
            let list = self.snapshots()?;
            let found = crate::repo::latest(list)?;
            if let Some(note) = crate::repo::passed_over(&list.0, &found.0) {
                warn(note);
            }
            return Ok(found);
        }
        let id = crate::repo::resolve_snapshot_prefix(spec, &self.snapshot_ids)?;
        match self.repo.read_snapshot(&id) {
            Ok(s) => Ok((id, s)),
            // Listed when the session opened, forgotten since by another process:
            // as if it had been gone already.
            Err(Error::Backend(b)) if b.is_not_found() => {
                Err(Error::SnapshotNotFound(spec.to_string()))
            }
            Err(e) => Err(e),
        }
    }

    /// [`Session::find_snapshot`] narrowed by `filter` (host, tags, paths), as
    /// restic's `latest --host H --path P --tag T`: `latest` is the newest snapshot
    /// that matches; an id must name a matching snapshot.
    pub fn find_snapshot_matching(
        &self,
        spec: &str,
        filter: &crate::ops::forget::SnapshotFilter,
    ) -> Result<(SnapshotId, Snapshot)> {
        if filter.is_empty() {
            return self.find_snapshot(spec);
        }
        if spec == "latest" {
            let (all, bad) = self.snapshots()?;
            return latest_matching(&self.repo, all, bad, filter, &|note| {
                self.progress.warning_msg(note)
            });
        }
        let found = self.find_snapshot(spec)?;
        // Its host as `latest` above counts it.
        let mut counted = found.1.clone();
        if !filter.hosts.is_empty() {
            let mut all = self.snapshots()?.0.clone();
            self.repo.attribute_hosts(&mut all)?;
            if let Some((_, s)) = all.into_iter().find(|(id, _)| *id == found.0) {
                counted.hostname = s.hostname;
            }
        }
        if !filter.matches(&counted) {
            return Err(Error::Invalid(format!(
                "snapshot {} does not match {}",
                found.0.short(),
                filter.describe()
            )));
        }
        Ok(found)
    }

    /// How long opening waited for a job slot (other backups ahead of this one).
    pub fn slot_wait(&self) -> std::time::Duration {
        self.slot_wait
    }

    /// Whether the session holds a lock (a read session may not).
    pub fn holds_lock(&self) -> bool {
        matches!(self.held, Held::Lock(_))
    }

    /// The id of the session's lock, when it holds one.
    pub fn lock_id(&self) -> Option<[u8; 32]> {
        match &self.held {
            Held::Lock(l) => Some(l.id()),
            Held::Unwritable(_) => None,
        }
    }
}

impl<A: Commits> Session<A> {
    /// The lock, after checking that it is fresh: a session whose lock may have
    /// looked stale to others must not commit anything (a prune may have removed
    /// data it relies on).
    pub fn commit_lock(&self) -> Result<&RepoLock> {
        match &self.held {
            Held::Lock(l) => {
                l.check_fresh()?;
                Ok(l)
            }
            // Sessions that commit never go on without a lock (see `open`).
            Held::Unwritable(why) => Err(Error::Invalid(format!(
                "no repository lock ({why}): refusing to commit"
            ))),
        }
    }

    /// The lock, for an operation that checks it itself at several points.
    pub fn lock(&self) -> Result<Arc<RepoLock>> {
        match &self.held {
            Held::Lock(l) => Ok(l.clone()),
            Held::Unwritable(why) => Err(Error::Invalid(format!("no repository lock ({why})"))),
        }
    }
}

/// The newest of `all` that `filter` leaves (restic's `latest --host H --path P
/// --tag T`), unless a snapshot that could not be read (`bad`) might be newer.
/// Hosts count as `snapshots --host` and retention count them: a snapshot
/// another host's bound token stored under this host's name is not its, nor
/// can such an unreadable one be this host's newest. Snapshots passed over for
/// being dated ahead of this machine's clock are told to `warn`.
pub fn latest_matching(
    repo: &Repository,
    all: &[(SnapshotId, Snapshot)],
    bad: &[crate::repo::SnapshotError],
    filter: &crate::ops::forget::SnapshotFilter,
    warn: &dyn Fn(String),
) -> Result<(SnapshotId, Snapshot)> {
    let mut matching = all.to_vec();
    let bad = if filter.hosts.is_empty() {
        bad.iter().collect()
    } else {
        repo.narrow_to_hosts(&mut matching, bad, &filter.hosts, warn)?
    };
    matching.retain(|(_, s)| filter.matches(s));
    let found = crate::repo::latest_in(&matching, &bad).map_err(|e| match e {
        Error::SnapshotNotFound(_) if !filter.is_empty() => {
            Error::SnapshotNotFound(format!("latest with {}", filter.describe()))
        }
        e => e,
    })?;
    if let Some(note) = crate::repo::passed_over(&matching, &found.0) {
        warn(note);
    }
    Ok(found)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::repo::storage::{CacheChoice, StorageOptions};
    use crate::{InitOptions, backup, check, restore};

    /// The server runs operations through `spawn_blocking` inside its tokio runtime:
    /// a backup, a restore and a check of a repository on S3 must work there (the S3
    /// client has a runtime of its own). Fails, never skips, without the test
    /// script's S3 server.
    #[test]
    fn operations_run_inside_a_tokio_runtime_on_s3() {
        let base = std::env::var("CAIRN_TEST_S3").unwrap_or_else(|_| {
            panic!("CAIRN_TEST_S3 is not set: run the suite with `bash scripts/test.sh`")
        });
        let nanos = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|d| d.as_nanos())
            .unwrap_or(0);
        let location = format!("{}/core-in-tokio-{nanos}", base.trim_end_matches('/'));
        let dir = tempfile::tempdir().unwrap();
        let src = dir.path().join("src");
        std::fs::create_dir_all(src.join("sub")).unwrap();
        std::fs::write(src.join("a"), vec![7u8; 300_000]).unwrap();
        std::fs::write(src.join("sub/b"), b"bee").unwrap();
        let target = dir.path().join("target");
        let opts = StorageOptions {
            cache: CacheChoice::Dir(dir.path().join("cache")),
            ..Default::default()
        };
        let rt = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(2)
            .enable_all()
            .build()
            .unwrap();
        let (src2, target2) = (src.clone(), target.clone());
        rt.block_on(async move {
            tokio::task::spawn_blocking(move || {
                let p = Progress::none();
                let init = InitOptions {
                    encryption: false,
                    ..InitOptions::default()
                };
                Repository::init_at(&location, &opts, None, &init, &p).unwrap();
                let s: Session<Backup> = Session::open_at(
                    &location,
                    &opts,
                    || unreachable!(),
                    "backup",
                    IndexLoad::Placement,
                    &p,
                )
                .unwrap();
                let b = backup::backup(
                    &s,
                    backup::BackupOptions {
                        paths: vec![src2],
                        ..Default::default()
                    },
                )
                .unwrap();
                drop(s);
                let repo = Repository::open_at(&location, &opts, || unreachable!(), &p).unwrap();
                let s: Session<Read> =
                    Session::open(repo, "restore", IndexLoad::Placement, &p).unwrap();
                let snap = s.find_snapshot(&b.snapshot_id.unwrap().to_hex()).unwrap();
                let r = restore::restore_snapshot(
                    &s,
                    &snap,
                    &restore::RestoreOptions {
                        owners: false,
                        ..restore::RestoreOptions::new(target2)
                    },
                )
                .unwrap();
                assert!(r.errors.is_empty(), "{:?}", r.errors);
                let repo = s.into_repo();
                let mut s: Session<Read> =
                    Session::open(repo, "check", IndexLoad::Deferred, &p).unwrap();
                let c = check::check(&mut s, &check::CheckOptions::default()).unwrap();
                assert!(c.problems.is_empty(), "{:?}", c.problems);
            })
            .await
            .unwrap();
        });
        let restored = target.join(src.strip_prefix("/").unwrap());
        assert_eq!(
            std::fs::read(restored.join("a")).unwrap(),
            vec![7u8; 300_000]
        );
        assert_eq!(std::fs::read(restored.join("sub/b")).unwrap(), b"bee");
    }
}
