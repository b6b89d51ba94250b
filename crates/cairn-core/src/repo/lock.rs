//! Repository locks. They never block a backup: every operation that uses the index
//! (backup, restore, check, ...) holds a *shared* lock so that prune knows which
//! operations may still rely on blobs it is removing; prune and repair hold an
//! *exclusive* lock that only keeps them apart from each other.
//!
//! A lock is rewritten by a background thread every [`REFRESH_EVERY`]. Another process
//! treats it as gone when it has not been refreshed for [`STALE_AFTER`], or at once
//! when it was taken on the same machine (same boot, same pid namespace) by a process
//! that no longer exists. So a crashed job never blocks the next one, and nothing
//! needs `unlock` in normal operation.
//!
//! The holder checks its side of the bargain: if it could not refresh for longer than
//! [`MAX_UNREFRESHED`] (suspended machine, unreachable storage), it may have been
//! treated as dead, and [`RepoLock::check_fresh`] makes it refuse to commit.

use crate::error::{Error, Result};
use crate::repo::Repository;
use crate::time::now_unix;
use cairn_backend::process::{boot_id, pid_namespace};
use cairn_backend::{Backend, names};
use cairn_format::key::MasterKey;
use cairn_format::lock::Lock;
use std::sync::atomic::Ordering;
use std::sync::{Arc, Condvar, Mutex};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

pub const REFRESH_EVERY: Duration = Duration::from_secs(5 * 60);
pub const STALE_AFTER: Duration = Duration::from_secs(30 * 60);
/// Leaves `STALE_AFTER - MAX_UNREFRESHED` for clock differences between machines.
pub const MAX_UNREFRESHED: Duration = Duration::from_secs(20 * 60);

/// A lock found in the repository.
#[derive(Clone, Debug)]
pub struct LockInfo {
    pub id: [u8; 32],
    /// The object's name (`locks/<hex>`, or `locks/admin-<hex>` for an exclusive
    /// lock in a repository with the `admin-names` feature).
    pub name: String,
    /// `None` when the object could not be read or opened.
    pub lock: Option<Lock>,
    /// True when its holder is known dead or it was not refreshed in time.
    pub stale: bool,
}

impl LockInfo {
    pub fn hex(&self) -> String {
        hex::encode(self.id)
    }
    /// Eight hex digits naming the lock in messages. Not the first eight: through
    /// a server, a lock's first 8 bytes name the token that owns it, the same for
    /// every lock of one client; the next ones are random.
    pub fn short(&self) -> String {
        self.hex()[16..24].to_string()
    }
    /// One line for messages: what, where, since when; and, when its holder's
    /// clock is far ahead of this machine's, that (a lock refreshed "in the
    /// future" is taken for stale, and its job then fails for no reason it says).
    pub fn describe(&self) -> String {
        match &self.lock {
            Some(l) => {
                let ahead = l.refreshed.saturating_sub(now_unix());
                let skew = if ahead > CLOCK_SKEW_SAID.as_secs() as i64 {
                    format!(
                        "; its refresh time is {} ahead of this machine's clock: one of the \
                         two clocks is wrong (set both by NTP)",
                        crate::units::duration_words(ahead as u64)
                    )
                } else {
                    String::new()
                };
                format!(
                    "{} lock {} held by {}@{} (pid {}) since {}{skew}",
                    l.operation,
                    self.short(),
                    l.username,
                    l.hostname,
                    l.pid,
                    l.created.get(..19).unwrap_or(&l.created).replace('T', " ")
                )
            }
            None => format!("unreadable lock {}", self.short()),
        }
    }
}

/// A lock whose times are further ahead of this machine's clock than this is
/// said to come from a clock that is off.
pub(crate) const CLOCK_SKEW_SAID: Duration = Duration::from_secs(5 * 60);

/// Whether a lock's holder is known to be gone, judged at `now` (unix seconds): not
/// refreshed for [`STALE_AFTER`], or, when it was taken on this machine (same boot,
/// same pid namespace), its process no longer exists.
pub fn is_stale(l: &Lock, now: i64) -> bool {
    if now.saturating_sub(l.refreshed) > STALE_AFTER.as_secs() as i64 {
        return true;
    }
    let boot = boot_id();
    !boot.is_empty()
        && l.boot_id == boot
        && l.pid_namespace == pid_namespace()
        && l.hostname == crate::repo::hostname()
        && !cairn_backend::process::alive(l.pid)
}

/// A lock's id and whether its name has the admin mark.
fn parse_id(name: &str) -> Option<([u8; 32], bool)> {
    let (admin, hex) = names::split_admin(names::listed(name));
    let mut id = [0u8; 32];
    hex::decode_to_slice(hex, &mut id).ok()?;
    Some((id, admin))
}

/// The object name of a lock: exclusive locks carry the admin mark where the
/// repository uses `admin-names`, so that a server can refuse them to append-only
/// writers.
fn lock_name(repo: &Repository, id: &[u8; 32], exclusive: bool) -> String {
    if exclusive && repo.admin_names() {
        names::admin_lock(&hex::encode(id))
    } else {
        names::lock(&hex::encode(id))
    }
}

/// Every lock in the repository with its state. A lock deleted while listing is
/// skipped; an unreadable one is reported with `lock: None` and counts as live (it
/// might be a running job; `cairn unlock --remove-all` removes it).
///
/// Except where admin objects carry the admin mark: there a lock without it may
/// come from a writer that may only add (a backup token of `cairn serve`), whose
/// word is not taken for ever. Unreadable, or refreshed further in the future than
/// [`STALE_AFTER`] (no clock is that far off on a working machine), such a lock
/// would never go stale and keep prune from deleting anything: it counts as stale.
pub fn list_locks(repo: &Repository) -> Result<Vec<LockInfo>> {
    let now = now_unix();
    let mut out = Vec::new();
    for o in repo.backend().list(names::LOCKS)? {
        let Some((id, admin)) = parse_id(&o.name) else {
            continue;
        };
        // Bounded: a giant object in locks/ (damage, or a hostile writer) is an
        // unreadable lock, not gigabytes of memory for every operation. The listed
        // size decides first (locks are listed every few seconds by queued jobs:
        // one request each, not a size query and a read).
        let lock = match super::objects::get_listed(repo.backend().as_ref(), &o) {
            Ok(data) => repo
                .key()
                .sealer
                .open("lock", &data)
                .ok()
                .and_then(|p| Lock::from_bytes(&p).ok())
                .map(|mut l| {
                    // Only an admin-named lock excludes: a plain name is what an
                    // append-only writer may create, and its claim is not honoured.
                    if repo.admin_names() && !admin {
                        l.exclusive = false;
                    }
                    l
                }),
            Err(e) if e.is_not_found() => continue,
            Err(e) if e.kind == cairn_backend::BackendErrorKind::TooLarge => None,
            Err(e) => return Err(e.into()),
        };
        let untrusted = repo.admin_names() && !admin;
        let stale = match &lock {
            Some(l) => {
                is_stale(l, now)
                    || (untrusted && l.refreshed > now.saturating_add(STALE_AFTER.as_secs() as i64))
            }
            None => untrusted,
        };
        out.push(LockInfo {
            id,
            name: o.name,
            lock,
            stale,
        });
    }
    Ok(out)
}

struct Shared {
    stop: Mutex<bool>,
    wake: Condvar,
    /// When the lock was last written successfully: monotonic time and wall-clock
    /// seconds. The monotonic clock does not advance while a machine sleeps; the
    /// wall clock does, so both are checked.
    last_ok: Mutex<(Instant, i64)>,
    /// Set for good once the lock may have looked stale to others (a gap between
    /// refreshes over [`MAX_UNREFRESHED`], or the lock object vanished).
    expired: std::sync::atomic::AtomicBool,
}

impl Shared {
    fn gap(&self) -> Duration {
        let (mono, wall) = *self.last_ok.lock().unwrap_or_else(|e| e.into_inner());
        let wall_gap = Duration::from_secs(now_unix().saturating_sub(wall).max(0) as u64);
        mono.elapsed().max(wall_gap)
    }
}

/// The locks this process holds (name, storage, refresher state), for
/// [`release_held`].
type Held = (String, Arc<dyn Backend>, Arc<Shared>);
static HELD: Mutex<Vec<Held>> = Mutex::new(Vec::new());

fn held() -> std::sync::MutexGuard<'static, Vec<Held>> {
    HELD.lock().unwrap_or_else(|e| e.into_inner())
}

/// The most a lock that holds no one up is retried for when released.
const READER_RELEASE: Duration = Duration::from_secs(15);

/// Locks this process released but could not remove (the storage was down):
/// no longer refreshed, so they go stale by themselves, but until then they keep
/// prune from deleting. A long-lived process ([`retry_orphaned`]) removes them once
/// the storage answers again.
static ORPHANED: Mutex<Vec<(String, Arc<dyn Backend>)>> = Mutex::new(Vec::new());

/// Tries again to remove the locks this process could not remove when it released
/// them; returns how many are still left. For a long-lived process (the server).
pub fn retry_orphaned() -> usize {
    let list = std::mem::take(&mut *ORPHANED.lock().unwrap_or_else(|e| e.into_inner()));
    let mut left = Vec::new();
    for (name, backend) in list {
        match backend.delete(&name) {
            Ok(()) => {}
            Err(e) if e.is_not_found() => {}
            Err(_) => left.push((name, backend)),
        }
    }
    let n = left.len();
    ORPHANED
        .lock()
        .unwrap_or_else(|e| e.into_inner())
        .extend(left);
    n
}

/// Removes every lock this process holds, for a process about to end without
/// unwinding (`std::process::exit` when its output's reader went away, as in
/// `cairn ls | head`): a lock left behind would hold up prune until it expires.
/// Each lock's refresher is stopped first (it writes while holding its state's
/// mutex, so no refresh can land after the removal); one that is in the middle of a
/// refresh (retrying against unreachable storage, say) is not waited for beyond
/// a second: that lock is left to expire, and the process ends.
pub fn release_held() {
    let all = std::mem::take(&mut *held());
    for (name, backend, shared) in all {
        let deadline = Instant::now() + Duration::from_secs(1);
        let stopped = loop {
            match shared.stop.try_lock() {
                Ok(mut stop) => {
                    *stop = true;
                    break true;
                }
                Err(std::sync::TryLockError::Poisoned(p)) => {
                    *p.into_inner() = true;
                    break true;
                }
                Err(std::sync::TryLockError::WouldBlock) if Instant::now() < deadline => {
                    std::thread::sleep(Duration::from_millis(10));
                }
                Err(std::sync::TryLockError::WouldBlock) => break false,
            }
        };
        if stopped {
            shared.wake.notify_all();
            let _ = backend.delete(&name);
        }
    }
}

/// Which other live locks make an acquisition back off.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Rivals {
    /// None: a shared lock.
    None,
    /// Other exclusive locks.
    Exclusive,
    /// Other locks of the same operation (taken by admins, where the repository
    /// marks admin objects).
    SameOperation,
    /// Other locks of the operations that replace or remove snapshots
    /// ([`EDITING`]), as for `SameOperation`.
    Editing,
}

/// The operations that replace or remove snapshots (a `Write` session): each
/// reads the snapshot list, then writes and deletes by it, so two at once act on
/// what the other is changing (two `tag`s of one snapshot left two copies of it,
/// a `forget` beside a `tag` saw its snapshot come back). They take turns.
pub const EDITING: &[&str] = &["forget", "tag", "rewrite"];

/// A lock this process holds; released (deleted) on drop.
pub struct RepoLock {
    backend: Arc<dyn Backend>,
    /// Others must respect it: its release is retried as long as any call.
    holds_others: bool,
    id: [u8; 32],
    name: String,
    shared: Arc<Shared>,
    thread: Option<JoinHandle<()>>,
}

/// Stores a lock: the first time create-only (its name is fresh and random, and a
/// server lets a token refresh only the locks it created), then by replacing it.
fn write_lock(
    backend: &dyn Backend,
    key: &MasterKey,
    name: &str,
    l: &Lock,
    first: bool,
) -> Result<()> {
    let sealed = key.sealer.seal(&l.to_bytes());
    if first {
        backend.put_new(name, &sealed)?;
    } else {
        backend.put(name, &sealed)?;
    }
    Ok(())
}

impl RepoLock {
    /// Takes a shared lock (`exclusive == false`: never fails because of other
    /// locks) or an exclusive one (fails with [`Error::Locked`] while another live
    /// exclusive lock exists).
    pub fn acquire(repo: &Repository, operation: &str, exclusive: bool) -> Result<RepoLock> {
        Self::acquire_with(repo, operation, exclusive, REFRESH_EVERY)
    }

    pub fn acquire_with(
        repo: &Repository,
        operation: &str,
        exclusive: bool,
        refresh_every: Duration,
    ) -> Result<RepoLock> {
        // Two exclusive candidates that see each other both back off and try again
        // after a random pause; no clock comparison decides who wins.
        let rivals = if exclusive {
            Rivals::Exclusive
        } else {
            Rivals::None
        };
        Self::acquire_against(repo, operation, rivals, refresh_every, 4)
    }

    /// Takes a shared lock (prune and repair go on beside it) that excludes the
    /// other live locks of the same `operation`: for a short read-modify-write of
    /// one object that two commands must not interleave (`config` changes: each
    /// rewrites the whole config, so one would lose the other's setting). Waits a
    /// few seconds for a rival to finish before it gives up.
    pub fn acquire_alone(repo: &Repository, operation: &str) -> Result<RepoLock> {
        Self::acquire_against(repo, operation, Rivals::SameOperation, REFRESH_EVERY, 24)
    }

    /// As [`RepoLock::acquire_alone`], against every operation of [`EDITING`]:
    /// a shared lock (backups and prune go on beside it) that one `forget`,
    /// `tag` or `rewrite` holds at a time.
    pub fn acquire_editing(repo: &Repository, operation: &str) -> Result<RepoLock> {
        Self::acquire_against(repo, operation, Rivals::Editing, REFRESH_EVERY, 24)
    }

    fn acquire_against(
        repo: &Repository,
        operation: &str,
        rivals: Rivals,
        refresh_every: Duration,
        attempts: u32,
    ) -> Result<RepoLock> {
        let mut attempt = 0;
        loop {
            attempt += 1;
            match Self::try_acquire(repo, operation, rivals, refresh_every) {
                Err(Error::Locked(_)) if attempt < attempts => {
                    let jitter: [u8; 2] = cairn_format::envelope::random_bytes();
                    let ms = 50 + u64::from(u16::from_le_bytes(jitter)) % 400;
                    std::thread::sleep(Duration::from_millis(ms));
                }
                r => return r,
            }
        }
    }

    fn try_acquire(
        repo: &Repository,
        operation: &str,
        rivals: Rivals,
        refresh_every: Duration,
    ) -> Result<RepoLock> {
        let exclusive = rivals == Rivals::Exclusive;
        let mut id: [u8; 32] = cairn_format::envelope::random_bytes();
        // Through a server, the id says which token owns the lock.
        if let Some(prefix) = repo.backend().lock_owner_prefix() {
            id[..8].copy_from_slice(&prefix);
        }
        let mut lock = Lock {
            version: 1,
            operation: operation.to_string(),
            exclusive,
            hostname: crate::repo::hostname(),
            username: crate::repo::username(),
            pid: std::process::id(),
            boot_id: boot_id(),
            pid_namespace: pid_namespace(),
            created: crate::time::now_rfc3339(),
            refreshed: now_unix(),
        };
        let backend = repo.backend().clone();
        let key = repo.key().clone();
        // A lock others must respect carries the admin mark where the repository
        // uses it: an append-only writer (a backup token of `cairn serve`) can
        // then not hold anyone up with one.
        let name = lock_name(repo, &id, rivals != Rivals::None);
        // A full storage is the caller's to judge: a reader goes on without a
        // lock, a writer says what to do (`session::Session::open`).
        write_lock(backend.as_ref(), &key, &name, &lock, true)?;
        let shared = Arc::new(Shared {
            stop: Mutex::new(false),
            wake: Condvar::new(),
            last_ok: Mutex::new((Instant::now(), lock.refreshed)),
            expired: std::sync::atomic::AtomicBool::new(false),
        });
        // From here on, dropping `me` deletes the lock object.
        let mut me = RepoLock {
            backend: backend.clone(),
            holds_others: rivals != Rivals::None,
            id,
            name: name.clone(),
            shared: shared.clone(),
            thread: None,
        };
        let admin_only = repo.admin_names();
        let rival = |o: &LockInfo| {
            let admin = names::split_admin(names::listed(&o.name)).0;
            o.lock.as_ref().is_some_and(|l| match rivals {
                Rivals::None => false,
                Rivals::Exclusive => l.exclusive,
                Rivals::SameOperation => l.operation == operation && (admin || !admin_only),
                Rivals::Editing => {
                    EDITING.contains(&l.operation.as_str()) && (admin || !admin_only)
                }
            })
        };
        if rivals != Rivals::None
            && let Some(other) = list_locks(repo)?
                .into_iter()
                .find(|o| o.id != id && !o.stale && rival(o))
        {
            let what = match rivals {
                Rivals::SameOperation => format!("another {operation} change is under way"),
                Rivals::Editing => "another change of snapshots is under way".to_string(),
                _ => "the repository is busy".to_string(),
            };
            return Err(Error::Locked(format!(
                "{what}: {} (it expires by itself if that process died; see `cairn unlock`)",
                other.describe()
            )));
        }
        me.thread = std::thread::Builder::new()
            .name("cairn-lock".into())
            .spawn(move || {
                let mut stop = shared.stop.lock().unwrap_or_else(|e| e.into_inner());
                loop {
                    // Checked before waiting too: `drop` may have run before this
                    // thread first took the mutex.
                    if *stop {
                        return;
                    }
                    let (s, _) = shared
                        .wake
                        .wait_timeout(stop, refresh_every)
                        .unwrap_or_else(|e| e.into_inner());
                    stop = s;
                    if *stop {
                        return;
                    }
                    if shared.gap() > MAX_UNREFRESHED {
                        shared.expired.store(true, Ordering::SeqCst);
                    }
                    // Someone removed the lock (`unlock --remove-all`): others may
                    // already have acted as if this operation had ended.
                    let max = cairn_format::consts::MAX_SMALL_OBJECT_SIZE as u64;
                    if matches!(backend.get_bounded(&name, max), Err(e) if e.is_not_found()) {
                        shared.expired.store(true, Ordering::SeqCst);
                    }
                    lock.refreshed = now_unix();
                    if write_lock(backend.as_ref(), &key, &name, &lock, false).is_ok() {
                        *shared.last_ok.lock().unwrap_or_else(|e| e.into_inner()) =
                            (Instant::now(), lock.refreshed);
                    }
                }
            })
            .ok();
        if me.thread.is_none() {
            return Err(Error::Invalid(
                "cannot start the lock refresh thread".into(),
            ));
        }
        held().push((me.name.clone(), me.backend.clone(), me.shared.clone()));
        Ok(me)
    }

    pub fn id(&self) -> [u8; 32] {
        self.id
    }

    /// The lock's object name.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// Fails when the lock may have been judged stale by another process: then
    /// blobs this operation relies on may have been deleted, and committing would
    /// risk a snapshot with missing data.
    pub fn check_fresh(&self) -> Result<()> {
        self.shared.check_fresh()
    }

    /// [`Self::check_fresh`], and the lock object is still there: at a commit
    /// point (a snapshot written, a prune's index or deletions), a lock someone
    /// removed (`unlock --remove-all`) is noticed now, not at the next refresh
    /// minutes later — a prune that no longer saw it may already have deleted data
    /// this operation relies on. One small read per commit point.
    pub fn check_held(&self) -> Result<()> {
        self.shared.check_held(self.backend.as_ref(), &self.name)
    }
}

impl Shared {
    fn check_fresh(&self) -> Result<()> {
        if self.gap() > MAX_UNREFRESHED {
            self.expired.store(true, Ordering::SeqCst);
        }
        if self.expired.load(Ordering::SeqCst) {
            return Err(Error::LockExpired(
                "this operation's repository lock went unrefreshed for too long (or was \
                 removed), so a concurrent prune may have removed data it relies on; it \
                 stops without committing (run it again; if it happens again, see whether \
                 this machine's clock is far from the others': their prune takes the locks \
                 of a clock far ahead for stale)"
                    .into(),
            ));
        }
        Ok(())
    }

    fn check_held(&self, backend: &dyn Backend, name: &str) -> Result<()> {
        self.check_fresh()?;
        let max = cairn_format::consts::MAX_SMALL_OBJECT_SIZE as u64;
        match backend.get_bounded(name, max) {
            Err(e) if e.is_not_found() => {
                self.expired.store(true, Ordering::SeqCst);
                self.check_fresh()
            }
            // Unreadable now (storage trouble): the refresher's own checks stand,
            // and the write that follows meets the same storage.
            _ => Ok(()),
        }
    }
}

/// [`RepoLock::check_held`] for every lock this process holds on `backend`: before
/// and after an index file is stored. An operation whose lock was removed or went
/// stale may have lost packs to a prune that no longer saw it; an index file
/// naming them would make later backups deduplicate against data that is gone
/// (their snapshots saved, and not restorable). With no lock held there, nothing
/// to check.
pub(crate) fn check_held_on(backend: &dyn Backend) -> Result<()> {
    let mine: Vec<Held> = held()
        .iter()
        .filter(|(_, b, _)| std::ptr::addr_eq(Arc::as_ptr(b), backend as *const dyn Backend))
        .cloned()
        .collect();
    for (name, b, shared) in mine {
        shared.check_held(b.as_ref(), &name)?;
    }
    Ok(())
}

impl Drop for RepoLock {
    fn drop(&mut self) {
        held().retain(|(n, _, _)| *n != self.name);
        *self.shared.stop.lock().unwrap_or_else(|e| e.into_inner()) = true;
        self.shared.wake.notify_all();
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
        // A reader's lock holds up only prune, and goes stale by itself: its
        // release does not keep a command that finished its work waiting on
        // storage that went away (QA r37: a restore waited a minute and a half
        // for a server that stopped right after it).
        crate::hooks::point("lock:release");
        let delete = || self.backend.delete(&self.name);
        let deleted = if self.holds_others {
            delete()
        } else {
            cairn_backend::within(READER_RELEASE, delete)
        };
        match deleted {
            Ok(()) => {}
            Err(e) if e.is_not_found() => {}
            Err(_) => ORPHANED
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .push((self.name.clone(), self.backend.clone())),
        }
    }
}

/// The backup jobs ahead of the lock `mine` in the queue for job slots: live
/// "backup" locks created before it (ties broken by lock id, so every job sees the
/// same order). A job whose lock is not listed (yet) queues behind every other.
pub fn jobs_ahead(locks: &[LockInfo], mine: &[u8; 32]) -> Vec<LockInfo> {
    let key = |i: &LockInfo| i.lock.as_ref().map(|l| (l.created.clone(), i.id));
    let my_key = locks.iter().find(|i| &i.id == mine).and_then(key);
    let mut ahead: Vec<LockInfo> = locks
        .iter()
        .filter(|i| &i.id != mine && !i.stale)
        .filter(|i| i.lock.as_ref().is_some_and(|l| l.operation == "backup"))
        .filter(|i| match (&my_key, key(i)) {
            (Some(me), Some(other)) => other < *me,
            _ => true,
        })
        .cloned()
        .collect();
    ahead.sort_by_key(key);
    ahead
}

/// `ahead` with at most all places but one (of `max`) counted for locks whose ids
/// share their first 8 bytes: the locks of one `cairn serve` token (the server makes
/// a non-admin token's lock ids start with bytes of the token's id; direct clients'
/// are random). A hijacked backup token can store locks that look like running
/// backups, but so it holds places as the server's own slots let it (all but one),
/// never every place, and every other host's backups go on. With
/// `max-concurrent-jobs 1` there is no place to spare: one job, forged or not,
/// holds it (the limit then serialises every backup by design).
pub fn per_owner(ahead: Vec<LockInfo>, max: u32) -> Vec<LockInfo> {
    let cap = (max as usize).saturating_sub(1).max(1);
    let mut seen: std::collections::HashMap<[u8; 8], usize> = Default::default();
    ahead
        .into_iter()
        .filter(|l| {
            let mut prefix = [0u8; 8];
            prefix.copy_from_slice(&l.id[..8]);
            let n = seen.entry(prefix).or_insert(0);
            *n += 1;
            *n <= cap
        })
        .collect()
}

/// How often a queued job looks again.
const JOB_POLL: Duration = Duration::from_secs(2);

/// Waits until fewer than `max` backup jobs are ahead of `lock` (the datastore's
/// `max_concurrent_jobs`). Jobs queue in the order their locks were created, so
/// none starves. The limit is load control, not safety: a lock write delayed past
/// another job's check, or a clock behind the others, can let one job too many run.
/// `waiting` is called once, with the jobs ahead, when the job has to wait; its lock stays refreshed
/// meanwhile, and a killed job ahead is seen as gone as soon as its lock is stale.
pub fn wait_for_job_slot(
    repo: &Repository,
    lock: &RepoLock,
    max: u32,
    progress: &crate::progress::Progress,
    mut waiting: impl FnMut(&[LockInfo]),
) -> Result<()> {
    let mut told = false;
    loop {
        let ahead = per_owner(jobs_ahead(&list_locks(repo)?, &lock.id()), max);
        if ahead.len() < max as usize {
            return Ok(());
        }
        if !told {
            waiting(&ahead);
            told = true;
        }
        lock.check_fresh()?;
        // Jitter keeps many queued jobs from listing the locks in step.
        let jitter: [u8; 2] = cairn_format::envelope::random_bytes();
        let jitter = u64::from(u16::from_le_bytes(jitter)) % 1000;
        let until = Instant::now() + JOB_POLL + Duration::from_millis(jitter);
        while Instant::now() < until {
            progress.check_cancelled()?;
            std::thread::sleep(Duration::from_millis(50));
        }
    }
}

/// Removes stale locks (all locks with `all`); returns the ones removed.
pub fn remove_locks(repo: &Repository, all: bool) -> Result<(Vec<LockInfo>, Vec<LockInfo>)> {
    let mut removed = Vec::new();
    let mut running_here = Vec::new();
    for l in list_locks(repo)? {
        if !(all || l.stale) {
            continue;
        }
        // `--remove-all` is for holders that are gone or unknown; a process seen
        // running on this machine holds its lock for real, and a prune that no
        // longer saw it could delete what that operation is writing.
        if l.lock.as_ref().is_some_and(held_by_running_process_here) {
            running_here.push(l);
            continue;
        }
        match repo.backend().delete(&l.name) {
            Ok(()) => removed.push(l),
            Err(e) if e.is_not_found() => {}
            Err(e) => return Err(e.into()),
        }
    }
    Ok((removed, running_here))
}

/// Whether the lock was taken on this machine (same boot, same pid namespace) by a
/// process that is running now.
fn held_by_running_process_here(l: &Lock) -> bool {
    let boot = boot_id();
    !boot.is_empty()
        && l.boot_id == boot
        && l.pid_namespace == pid_namespace()
        && l.hostname == crate::repo::hostname()
        && cairn_backend::process::alive(l.pid)
}

#[cfg(test)]
mod tests {

    /// A lock refreshed "in the future" (its holder's clock far ahead) is said
    /// to come from a clock that is off (QA: prune removed such a lock as stale
    /// and neither side said why).
    #[test]
    fn a_lock_from_a_clock_far_ahead_says_so() {
        let info = |ahead: i64| super::LockInfo {
            id: [7; 32],
            name: String::new(),
            lock: Some(cairn_format::lock::Lock {
                version: 1,
                operation: "backup".into(),
                exclusive: false,
                hostname: "web01".into(),
                username: "root".into(),
                pid: 42,
                boot_id: String::new(),
                pid_namespace: String::new(),
                created: "2026-11-30T07:00:00Z".into(),
                refreshed: super::now_unix() + ahead,
            }),
            stale: true,
        };
        let far = info(2 * 3600 + 90).describe();
        assert!(
            far.contains("2 h 1 min ahead of this machine's clock"),
            "{far}"
        );
        assert!(!info(60).describe().contains("clock"));
    }

    /// Two locks of one server client (one owner prefix) are told apart in messages.
    #[test]
    fn one_owners_locks_have_different_short_ids() {
        let info = |tail: u8| {
            let mut id = [tail; 32];
            id[..8].copy_from_slice(b"ownerpfx");
            super::LockInfo {
                id,
                name: String::new(),
                lock: None,
                stale: false,
            }
        };
        let (a, b) = (info(1), info(2));
        assert_ne!(a.short(), b.short());
        assert_ne!(a.describe(), b.describe());
        assert!(a.hex().contains(&a.short()));
    }

    /// One owner's locks (one 8-byte id prefix: a server token's) count for all
    /// places but one at most; every random-id lock counts for itself.
    #[test]
    fn one_owners_locks_never_take_every_place() {
        let info = |first: u8, n: u8| LockInfo {
            id: {
                let mut id = [first; 32];
                id[31] = n;
                id
            },
            name: String::new(),
            lock: None,
            stale: false,
        };
        let forged: Vec<LockInfo> = (0..5).map(|n| info(7, n)).collect();
        assert_eq!(per_owner(forged.clone(), 4).len(), 3);
        assert_eq!(per_owner(forged.clone(), 1).len(), 1);
        let mut mixed = forged;
        mixed.push(info(1, 0));
        mixed.push(info(2, 0));
        assert_eq!(per_owner(mixed, 4).len(), 5);
    }
    use super::*;

    /// Waits until `f` holds, failing the test after a minute: the refresh thread
    /// runs every 20 ms in these tests, so only a stalled machine comes near.
    fn wait_for(what: &str, mut f: impl FnMut() -> bool) {
        let t = Instant::now();
        while !f() {
            assert!(
                t.elapsed() < Duration::from_secs(60),
                "timed out waiting for {what}"
            );
            std::thread::sleep(Duration::from_millis(1));
        }
    }

    use crate::testutil::mem_repo as repo;

    /// A lock as another machine's process would write it, refreshed now.
    fn foreign_lock(operation: &str, exclusive: bool) -> Lock {
        Lock {
            version: 1,
            operation: operation.into(),
            exclusive,
            hostname: "elsewhere".into(),
            username: "u".into(),
            pid: 1,
            boot_id: String::new(),
            pid_namespace: String::new(),
            created: crate::time::now_rfc3339(),
            refreshed: now_unix(),
        }
    }

    /// A lock without the admin mark that could never go stale (unreadable, or
    /// refreshed in the far future) would keep prune waiting for ever: it counts
    /// as stale. An exclusive (admin-marked) one is still taken at its word.
    #[test]
    fn a_plain_lock_that_would_never_go_stale_is_stale() {
        let r = repo();
        assert!(r.admin_names());
        let b = r.backend();
        b.put(&names::lock(&"ab".repeat(32)), b"junk").unwrap();
        b.put(&names::admin_lock(&"cd".repeat(32)), b"junk")
            .unwrap();
        let at = |refreshed: i64| Lock {
            refreshed,
            ..foreign_lock("backup", false)
        };
        let future = at(now_unix() + 2 * STALE_AFTER.as_secs() as i64);
        let sealed = r.key().sealer.seal(&future.to_bytes());
        b.put(&names::lock(&"ef".repeat(32)), &sealed).unwrap();
        let sealed = r.key().sealer.seal(&at(now_unix() + 60).to_bytes());
        b.put(&names::lock(&"12".repeat(32)), &sealed).unwrap();
        let state: Vec<(String, bool)> = list_locks(&r)
            .unwrap()
            .into_iter()
            .map(|l| (l.hex()[..2].to_string(), l.stale))
            .collect();
        let stale = |h: &str| state.iter().find(|(x, _)| x == h).unwrap().1;
        assert!(stale("ab"), "unreadable, plain: {state:?}");
        assert!(!stale("cd"), "unreadable, admin: {state:?}");
        assert!(stale("ef"), "refreshed an hour ahead: {state:?}");
        assert!(!stale("12"), "a minute ahead: {state:?}");
    }

    #[test]
    fn shared_locks_coexist_and_vanish_on_drop() {
        let r = repo();
        let a = RepoLock::acquire(&r, "backup", false).unwrap();
        let b = RepoLock::acquire(&r, "backup", false).unwrap();
        let p = RepoLock::acquire(&r, "prune", true).unwrap();
        assert_eq!(list_locks(&r).unwrap().len(), 3);
        assert!(list_locks(&r).unwrap().iter().all(|l| !l.stale));
        drop((a, b, p));
        assert!(list_locks(&r).unwrap().is_empty());
    }

    #[test]
    fn exclusive_locks_exclude_each_other() {
        let r = repo();
        let p = RepoLock::acquire(&r, "prune", true).unwrap();
        let e = RepoLock::acquire(&r, "prune", true).err().unwrap();
        assert!(matches!(e, Error::Locked(_)), "{e}");
        // The loser removed its own lock.
        assert_eq!(list_locks(&r).unwrap().len(), 1);
        drop(p);
        RepoLock::acquire(&r, "prune", true).unwrap();
    }

    /// forget, tag and rewrite take turns; backups and prune go on beside them.
    #[test]
    fn snapshot_edits_take_turns() {
        let r = repo();
        let b = RepoLock::acquire(&r, "backup", false).unwrap();
        let p = RepoLock::acquire(&r, "prune", true).unwrap();
        let t = RepoLock::acquire_editing(&r, "tag").unwrap();
        for op in EDITING {
            let e = RepoLock::acquire_against(&r, op, Rivals::Editing, REFRESH_EVERY, 1)
                .err()
                .unwrap();
            assert!(
                e.to_string()
                    .contains("another change of snapshots is under way"),
                "{e}"
            );
        }
        // Nothing else waits for it.
        drop(RepoLock::acquire(&r, "backup", false).unwrap());
        drop(RepoLock::acquire_alone(&r, "config").unwrap());
        drop(t);
        drop(RepoLock::acquire_editing(&r, "forget").unwrap());
        drop((b, p));
    }

    /// An exclusive lock is stored under the admin name; one claiming to be
    /// exclusive under a plain name (what an append-only writer may create) counts
    /// as shared and does not keep prune out.
    #[test]
    fn only_admin_named_locks_exclude() {
        let r = repo();
        let p = RepoLock::acquire(&r, "prune", true).unwrap();
        assert!(p.name().starts_with("locks/admin-"), "{}", p.name());
        drop(p);
        let hostile = foreign_lock("prune", true);
        let name = names::lock(&"ab".repeat(32));
        write_lock(r.backend().as_ref(), r.key(), &name, &hostile, true).unwrap();
        let listed = list_locks(&r).unwrap();
        assert_eq!(listed.len(), 1);
        assert!(!listed[0].lock.as_ref().unwrap().exclusive);
        let p = RepoLock::acquire(&r, "prune", true).unwrap();
        drop(p);
        assert_eq!(remove_locks(&r, true).unwrap().0.len(), 1);
        assert!(list_locks(&r).unwrap().is_empty());
    }

    #[test]
    fn dead_or_old_holders_are_stale() {
        let mut l = Lock {
            version: 1,
            operation: "backup".into(),
            exclusive: false,
            hostname: crate::repo::hostname(),
            username: "u".into(),
            pid: std::process::id(),
            boot_id: boot_id(),
            pid_namespace: pid_namespace(),
            created: crate::time::now_rfc3339(),
            refreshed: now_unix(),
        };
        assert!(!is_stale(&l, now_unix()));
        // Same machine, a pid that does not exist: stale at once.
        l.pid = 0x3fff_fff0;
        assert!(is_stale(&l, now_unix()));
        // Another machine: only time counts.
        l.hostname = "elsewhere".into();
        assert!(!is_stale(&l, now_unix()));
        assert!(is_stale(&l, now_unix() + STALE_AFTER.as_secs() as i64 + 1));
    }

    #[test]
    fn refresh_rewrites_the_lock() {
        let r = repo();
        let l = RepoLock::acquire_with(&r, "backup", false, Duration::from_millis(20)).unwrap();
        let first = l.shared.last_ok.lock().unwrap().0;
        wait_for("a refresh", || l.shared.last_ok.lock().unwrap().0 > first);
        assert!(r.backend().get(l.name()).is_ok());
        l.check_fresh().unwrap();
    }

    #[test]
    fn a_long_gap_expires_the_lock_for_good() {
        let r = repo();
        let l = RepoLock::acquire_with(&r, "backup", false, Duration::from_millis(20)).unwrap();
        l.check_fresh().unwrap();
        // As after a suspend: the monotonic clock did not move, the wall clock did.
        {
            let mut last = l.shared.last_ok.lock().unwrap();
            last.1 -= MAX_UNREFRESHED.as_secs() as i64 + 60;
        }
        assert!(matches!(l.check_fresh(), Err(Error::LockExpired(_))));
        // Later successful refreshes do not make it trustworthy again.
        let expired_at = Instant::now();
        wait_for("a refresh after the gap", || {
            l.shared.last_ok.lock().unwrap().0 > expired_at
        });
        assert!(matches!(l.check_fresh(), Err(Error::LockExpired(_))));
    }

    #[test]
    fn a_removed_lock_expires() {
        let r = repo();
        let l = RepoLock::acquire_with(&r, "backup", false, Duration::from_millis(20)).unwrap();
        l.check_fresh().unwrap();
        // `unlock --remove-all` here leaves it: this process is running.
        let (removed, kept) = remove_locks(&r, true).unwrap();
        assert_eq!((removed.len(), kept.len()), (0, 1));
        l.check_held().unwrap();
        // Removed from elsewhere: a commit point notices at once, the refresh
        // thread the next time it runs.
        r.backend().delete(l.name()).unwrap();
        assert!(matches!(l.check_held(), Err(Error::LockExpired(_))));
        let l = RepoLock::acquire_with(&r, "backup", false, Duration::from_millis(20)).unwrap();
        r.backend().delete(l.name()).unwrap();
        wait_for("the holder to see its lock gone", || {
            matches!(l.check_fresh(), Err(Error::LockExpired(_)))
        });
    }
}
