//! What needs a datastore's key: its content figures (`cairn stats`), its
//! snapshots, their directories, files and archives, and a search by name.
//!
//! The server holds no key unless an administrator unlocks a datastore for it:
//! from a password file named in the settings (`[datastore_passwords]`, read at
//! start) or with the password entered in the console (`POST …/unlock`). The key
//! then lives in this process's memory only, until `DELETE …/unlock` or a restart;
//! the password itself is not kept. What that means for the threat model is in
//! docs/SERVER.md ("Unlocked datastores").
//!
//! Reads go through ordinary engine sessions, so a prune (through this server or
//! directly) stays as safe as it is for any reader: a read session is kept while
//! the console is used and ended after [`SESSION_IDLE`] without use (its lock then
//! goes too, so it holds up a prune for at most that long), after
//! [`SESSION_MAX_AGE`], or as soon as a write through the server changes what a
//! reader would see (a snapshot, an index file, a deletion).
//!
//! Who sees what: an admin token everything; a token bound to a host only the
//! snapshots recorded for its host ([`crate::hosts`]); a restore token without a
//! host every snapshot; a backup token without a host none (it may add backups,
//! not read them back in a browser).

use crate::api::Path;
use crate::api::Query;
use crate::api::{ApiError, authenticate, blocking, datastore};
use crate::policy::Role;
use crate::tokens::TokenEntry;
use crate::{App, Datastore};
use axum::body::{Body, Bytes};
use axum::extract::State;
use axum::http::{HeaderMap, StatusCode, header};
use axum::response::{IntoResponse, Response};
use cairn_core::session::{IndexLoad, Read, Session};
use cairn_core::{Repository, progress::Progress};
use serde::{Deserialize, Serialize};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

/// A read session unused for this long ends (and its lock with it).
pub const SESSION_IDLE: Duration = Duration::from_secs(30);
/// A read session is replaced after this long, to see what others wrote directly.
pub const SESSION_MAX_AGE: Duration = Duration::from_secs(300);
/// Entries per page of a directory listing, by default and at most.
const PAGE: usize = 200;
const PAGE_MAX: usize = 2000;
/// Matches a search returns, by default and at most.
const SEARCH: usize = 100;
const SEARCH_MAX: usize = 1000;
/// Bytes per piece of a streamed download.
const PIECE: usize = 256 << 10;

/// A datastore's key, if it is unlocked, and the sessions reading with it.
#[derive(Default)]
pub struct Content {
    unlocked: Mutex<Option<Arc<Unlocked>>>,
    /// Counts writes through the server that change what a reader sees.
    generation: AtomicU64,
    /// Why the unlock at start failed, for the console.
    unlock_error: Mutex<Option<String>>,
    /// Wrong passwords given to unlock in a row, and when the last was: past
    /// [`crate::users::FREE_FAILURES`], unlocking waits as a sign-in does, so that
    /// whoever holds an admin token (which may delete, but not read) cannot guess
    /// the encryption password at the key derivation's pace.
    wrong: Mutex<Option<(u32, Instant)>>,
    /// An admin locked the datastore (`DELETE …/unlock`): its password file is not
    /// read for jobs either until it is unlocked again, so that "Lock" means the
    /// server stops using the key.
    withheld: std::sync::atomic::AtomicBool,
    /// Held during an unlock's key derivation: one at a time, so that parallel
    /// guesses cannot all run before the wait of [`Self::unlock_wait`] applies.
    unlocking: Mutex<()>,
    /// Counts locks ([`Self::lock`]): an unlock whose key derivation a lock
    /// overtook does not install its key.
    locks: AtomicU64,
    /// When /metrics last had the figures computed again, and whether that is
    /// under way ([`figures_for_metrics`]).
    figures_tried: Mutex<Option<Instant>>,
    figures_running: std::sync::atomic::AtomicBool,
}

/// How often /metrics has stale figures computed again, at most.
const FIGURES_EVERY: Duration = Duration::from_secs(60);

/// The datastore's figures (`cairn stats`) for /metrics: the last ones computed,
/// None while it is locked or before the first. Stale ones (a write since) are
/// computed again in the background, at most once a minute, so that a scrape
/// never waits for a pass over the index while backups change it pack by pack.
pub fn figures_for_metrics(ds: &Arc<Datastore>) -> Option<Arc<cairn_core::stats::Stats>> {
    let c = &ds.content;
    let u = c.unlocked()?;
    let generation = c.generation.load(Ordering::Relaxed);
    let cached = lock(&u.stats).clone();
    let fresh = cached.as_ref().is_some_and(|(g, _)| *g == generation);
    let due = lock(&c.figures_tried).is_none_or(|t| t.elapsed() >= FIGURES_EVERY);
    if !fresh && due && !c.figures_running.swap(true, Ordering::AcqRel) {
        *lock(&c.figures_tried) = Some(Instant::now());
        let ds = ds.clone();
        tokio::task::spawn_blocking(move || {
            // An error (a damaged snapshot) is the console's and /stats' to say.
            let _ = ds.content.stats();
            ds.content.figures_running.store(false, Ordering::Release);
        });
    }
    cached.map(|(_, s)| s)
}

/// Why [`Content::unlock`] did not unlock.
#[derive(Debug)]
pub enum UnlockError {
    /// Too many wrong passwords in a row: wait this long.
    Wait(Duration),
    /// Another unlock of this datastore is deriving its key now.
    Busy,
    /// An admin locked the datastore while the key was being derived, or had
    /// locked it (for an unlock not asked by an admin).
    Locked,
    Engine(cairn_core::Error),
}

pub struct Unlocked {
    /// The repository opened with the key, never given an index: each session
    /// opens a copy ([`Repository::reopen`]).
    template: Repository,
    /// "password file /etc/…" or "console (token NAME)".
    pub how: String,
    pub since: String,
    session: Mutex<Option<Cached>>,
    stats: Mutex<Option<(u64, Arc<cairn_core::stats::Stats>)>>,
}

struct Cached {
    session: Arc<Session<Read>>,
    generation: u64,
    opened: Instant,
    used: Instant,
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

impl Content {
    /// Something a reader sees changed (a snapshot, an index file, a deletion).
    pub fn changed(&self) {
        self.generation.fetch_add(1, Ordering::Relaxed);
    }

    pub fn unlocked(&self) -> Option<Arc<Unlocked>> {
        lock(&self.unlocked).clone()
    }

    pub fn unlock_error(&self) -> Option<String> {
        lock(&self.unlock_error).clone()
    }

    /// How long an unlock must still wait after wrong passwords, if at all.
    pub fn unlock_wait(&self) -> Option<Duration> {
        let (count, last) = (*lock(&self.wrong))?;
        if count < crate::users::FREE_FAILURES {
            return None;
        }
        let wait = Duration::from_secs(1 << (count - crate::users::FREE_FAILURES).min(10))
            .min(crate::users::MAX_BACKOFF);
        wait.checked_sub(last.elapsed())
    }

    /// Opens the repository with `password` and keeps its key (blocking: the key
    /// derivation takes a second on purpose).
    /// `by_admin`: an admin asked now (console or API), which lifts an admin's
    /// lock; a password file read at start or when the storage answers again
    /// leaves a datastore an admin locked as it is.
    pub fn unlock(
        &self,
        backend: Arc<dyn cairn_backend::Backend>,
        password: String,
        how: String,
        by_admin: bool,
    ) -> Result<(), UnlockError> {
        let _one = match self.unlocking.try_lock() {
            Ok(g) => g,
            Err(std::sync::TryLockError::Poisoned(p)) => p.into_inner(),
            Err(std::sync::TryLockError::WouldBlock) => return Err(UnlockError::Busy),
        };
        if !by_admin && self.key_withheld() {
            return Err(UnlockError::Locked);
        }
        if let Some(w) = self.unlock_wait() {
            return Err(UnlockError::Wait(w));
        }
        let locks = self.locks.load(Ordering::Acquire);
        let r = Repository::open(backend, move || Ok(password));
        match r {
            Ok(template) => {
                let mut unlocked = lock(&self.unlocked);
                // A lock since the derivation began wins: it was asked later.
                if self.locks.load(Ordering::Acquire) != locks {
                    return Err(UnlockError::Locked);
                }
                *unlocked = Some(Arc::new(Unlocked {
                    template,
                    how,
                    since: cairn_core::time::now_rfc3339(),
                    session: Mutex::new(None),
                    stats: Mutex::new(None),
                }));
                drop(unlocked);
                *lock(&self.unlock_error) = None;
                *lock(&self.wrong) = None;
                self.withheld.store(false, Ordering::Release);
                Ok(())
            }
            Err(e) => {
                if matches!(e, cairn_core::Error::WrongPassword) {
                    let mut w = lock(&self.wrong);
                    let count = w.map_or(0, |(c, _)| c).saturating_add(1);
                    *w = Some((count, Instant::now()));
                }
                *lock(&self.unlock_error) = Some(format!("{how}: {e}"));
                Err(UnlockError::Engine(e))
            }
        }
    }

    /// Whether an admin locked the datastore: no job may use its key, not even
    /// through its password file, until it is unlocked again.
    pub fn key_withheld(&self) -> bool {
        self.withheld.load(Ordering::Acquire)
    }

    /// Forgets the key (blocking: a read session's lock is removed), and withholds
    /// it from jobs ([`Self::key_withheld`]).
    /// How many times the datastore was locked ([`Self::lock`]) since the start.
    pub fn locks(&self) -> u64 {
        self.locks.load(Ordering::Acquire)
    }

    pub fn lock(&self) {
        self.withheld.store(true, Ordering::Release);
        // Counted before the key is taken: an unlock that installs after this
        // sees the count changed ([`Self::unlock`]).
        self.locks.fetch_add(1, Ordering::AcqRel);
        let u = lock(&self.unlocked).take();
        if let Some(u) = u {
            lock(&u.session).take();
        }
    }

    /// A fresh handle on the repository with the key, for a job (blocking).
    pub fn repository(&self) -> Option<cairn_core::Result<Repository>> {
        self.unlocked().map(|u| u.template.reopen())
    }

    /// Ends the read session if unused or old (blocking: its lock is removed).
    pub fn sweep(&self) {
        if let Some(u) = self.unlocked() {
            let mut s = lock(&u.session);
            if s.as_ref().is_some_and(|c| {
                c.used.elapsed() > SESSION_IDLE || c.opened.elapsed() > SESSION_MAX_AGE
            }) {
                s.take();
            }
        }
    }

    /// Ends the read session now, e.g. before a prune through the server.
    pub fn end_session(&self) {
        if let Some(u) = self.unlocked() {
            lock(&u.session).take();
        }
    }

    /// The read session, opened now if there is none or it is out of date
    /// (blocking).
    fn session(&self) -> Result<(Arc<Unlocked>, Arc<Session<Read>>), ApiError> {
        let u = self.unlocked().ok_or_else(locked)?;
        let generation = self.generation.load(Ordering::Relaxed);
        let mut s = lock(&u.session);
        if let Some(c) = s.as_mut()
            && c.generation == generation
            && c.opened.elapsed() < SESSION_MAX_AGE
        {
            c.used = Instant::now();
            return Ok((u.clone(), c.session.clone()));
        }
        // The old one goes first: its lock is not needed twice.
        s.take();
        let repo = u.template.reopen().map_err(engine_error)?;
        let session =
            Session::<Read>::open(repo, "console", IndexLoad::Placement, &Progress::none())
                .map_err(engine_error)?;
        let session = Arc::new(session);
        let now = Instant::now();
        *s = Some(Cached {
            session: session.clone(),
            generation,
            opened: now,
            used: now,
        });
        drop(s);
        Ok((u, session))
    }

    /// `cairn stats` for the whole datastore, computed again only after a change
    /// (blocking).
    fn stats(&self) -> Result<Arc<cairn_core::stats::Stats>, ApiError> {
        let u = self.unlocked().ok_or_else(locked)?;
        let generation = self.generation.load(Ordering::Relaxed);
        if let Some((g, st)) = lock(&u.stats).as_ref()
            && *g == generation
        {
            return Ok(st.clone());
        }
        let repo = u.template.reopen().map_err(engine_error)?;
        let session = Session::<Read>::open(repo, "stats", IndexLoad::Placement, &Progress::none())
            .map_err(engine_error)?;
        let st = Arc::new(cairn_core::stats::stats(&session, None).map_err(engine_error)?);
        *lock(&u.stats) = Some((generation, st.clone()));
        Ok(st)
    }
}

/// Unlocks the datastores that have a password file (in the background: each
/// takes a key derivation) and ends idle read sessions from then on.
pub fn start(app: &Arc<App>) {
    for name in app.config.datastore_passwords.keys() {
        unlock_from_file(app, name);
    }
    let app = app.clone();
    tokio::spawn(async move {
        let mut tick = tokio::time::interval(Duration::from_secs(5));
        loop {
            tick.tick().await;
            let a = app.clone();
            let _ = tokio::task::spawn_blocking(move || {
                for ds in a.datastores.values() {
                    ds.content.sweep();
                }
            })
            .await;
        }
    });
}

/// Unlocks datastore `name` with its password file, if it has one (in the
/// background): at start, and when a datastore whose storage did not answer then
/// comes back.
pub fn unlock_from_file(app: &Arc<App>, name: &str) {
    let (Some(file), Some(ds)) = (
        app.config.datastore_passwords.get(name).cloned(),
        app.datastores.get(name).cloned(),
    ) else {
        return;
    };
    tokio::task::spawn_blocking(move || {
        let how = format!("password file {}", file.display());
        let password = match crate::jobs::password_from(file)() {
            Ok(p) => p,
            Err(e) => {
                let m = format!("{how}: {e}");
                crate::log_line(&format!("datastore {}: stays locked: {m}", ds.name));
                *lock(&ds.content.unlock_error) = Some(m);
                return;
            }
        };
        match ds
            .content
            .unlock(ds.backend.clone(), password, how.clone(), false)
        {
            Ok(()) => crate::log_line(&format!("datastore {}: unlocked ({how})", ds.name)),
            Err(UnlockError::Locked) => crate::log_line(&format!(
                "datastore {}: stays locked: an admin locked it ({how} not used)",
                ds.name
            )),
            Err(e) => crate::log_line(&format!(
                "datastore {}: stays locked: {how}: {}",
                ds.name,
                e.message()
            )),
        }
    });
}

/// Runs a content read off the async threads. When the storage failed (down,
/// unreachable), the cached read session and listing are dropped, so the next
/// request, the datastore table and the fleet see the storage as it is now
/// instead of answering from memory as if nothing happened.
async fn read<T: Send + 'static>(
    store: &Arc<Datastore>,
    f: impl FnOnce() -> Result<T, ApiError> + Send + 'static,
) -> Result<T, ApiError> {
    match blocking(f).await {
        Err(e) if e.kind == "transient" => {
            *store.census.lock().await = None;
            let s = store.clone();
            // Ending it removes its lock: a storage call, so not on this thread.
            tokio::task::spawn_blocking(move || s.content.end_session());
            Err(storage_down(store, e))
        }
        r => r,
    }
}

/// A storage failure, saying whose storage it is.
fn storage_down(store: &Datastore, e: ApiError) -> ApiError {
    ApiError::new(
        e.status,
        e.kind,
        format!(
            "the storage of datastore {} cannot be reached now: {}",
            store.name,
            // Said once: the console names the datastore instead.
            e.message
                .strip_prefix(crate::api::STORAGE_DOWN)
                .unwrap_or(&e.message)
        ),
    )
}

fn locked() -> ApiError {
    ApiError::new(
        StatusCode::CONFLICT,
        "locked",
        "the datastore is locked: content needs its key (an admin unlocks it in the console \
         or with a password file under [datastore_passwords])",
    )
}

/// An engine error as an answer.
fn engine_error(e: cairn_core::Error) -> ApiError {
    use cairn_core::Error as E;
    match e {
        E::Locked(m) => ApiError::new(StatusCode::CONFLICT, "busy", m),
        E::SnapshotNotFound(m) => ApiError::new(
            StatusCode::NOT_FOUND,
            "not_found",
            format!("no snapshot {m}"),
        ),
        E::WrongPassword => ApiError::new(
            StatusCode::FORBIDDEN,
            "wrong_password",
            "wrong password: no key of the datastore opens with it",
        ),
        E::Backend(b) => ApiError::from(b),
        e @ (E::Damaged { .. } | E::SnapshotUnreadable(_)) => {
            ApiError::new(StatusCode::INTERNAL_SERVER_ERROR, "damaged", e.to_string())
        }
        E::Invalid(m) => ApiError::new(StatusCode::NOT_FOUND, "not_found", m),
        E::BadArgument(m) => ApiError::new(StatusCode::BAD_REQUEST, "bad_request", m),
        e => ApiError::new(StatusCode::INTERNAL_SERVER_ERROR, "content", e.to_string()),
    }
}

/// Whether `t` may see snapshot `hex` (blocking): only a host-bound token needs
/// the host the server recorded for it (none for snapshots stored directly or by
/// unbound tokens), so only then is the record read.
fn may_see(store: &Datastore, t: &TokenEntry, hex: &str) -> Result<bool, ApiError> {
    Ok(match (t.role, &t.host) {
        (Role::Admin, _) => true,
        (_, Some(h)) => {
            store.hosts.host_of(store.backend.as_ref(), hex)?.as_deref() == Some(h.as_str())
        }
        (Role::Restore, None) => true,
        (Role::Backup, None) => false,
    })
}

/// The caller and its datastore, for a request that reads snapshots: a backup
/// token without a host is refused (it reads none).
fn reader(
    app: &App,
    headers: &HeaderMap,
    ds: &str,
) -> Result<(TokenEntry, Arc<Datastore>), ApiError> {
    let t = authenticate(app, headers)?;
    let store = datastore(app, &t, ds)?;
    if t.role == Role::Backup && t.host.is_none() {
        return Err(ApiError::new(
            StatusCode::FORBIDDEN,
            "forbidden",
            "a backup token without a host sees no snapshots (give it one with \
             `cairn serve token add --host`, or sign in with a restore or admin token)",
        ));
    }
    Ok((t, store))
}

// ---------------------------------------------------------------------------
// Unlocking

#[derive(Deserialize)]
pub struct UnlockBody {
    password: String,
}

#[derive(Serialize)]
pub struct UnlockState {
    pub unlocked: bool,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub how: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub since: Option<String>,
}

fn admin_of(
    app: &App,
    headers: &HeaderMap,
    ds: &str,
) -> Result<(TokenEntry, Arc<Datastore>), ApiError> {
    let t = authenticate(app, headers)?;
    let store = datastore(app, &t, ds)?;
    if t.role != Role::Admin {
        return Err(ApiError::new(
            StatusCode::FORBIDDEN,
            "forbidden",
            "only an admin (token or user) may unlock or lock a datastore",
        ));
    }
    Ok((t, store))
}

fn too_many(ds: &str, w: Duration) -> ApiError {
    ApiError::new(
        StatusCode::TOO_MANY_REQUESTS,
        "too_many_attempts",
        format!(
            "too many wrong passwords for datastore {ds}: try again in {} s",
            w.as_secs() + 1
        ),
    )
}

impl UnlockError {
    fn message(&self) -> String {
        match self {
            UnlockError::Wait(w) => format!("too many wrong passwords: wait {} s", w.as_secs() + 1),
            UnlockError::Busy => "another unlock is under way".into(),
            UnlockError::Locked => "an admin locked it".into(),
            UnlockError::Engine(e) => e.to_string(),
        }
    }
}

/// `POST /v1/datastores/{ds}/unlock` `{"password": …}` (admin).
pub async fn unlock(
    State(app): State<Arc<App>>,
    Path(ds): Path<String>,
    headers: HeaderMap,
    crate::api::SmallBody(body): crate::api::SmallBody,
) -> Result<Response, ApiError> {
    let (t, store) = admin_of(&app, &headers, &ds)?;
    let b: UnlockBody = serde_json::from_slice(&body).map_err(|e| {
        ApiError::new(
            StatusCode::BAD_REQUEST,
            "bad_request",
            format!("send {{\"password\": \"…\"}}: {e}"),
        )
    })?;
    if let Some(w) = store.content.unlock_wait() {
        return Err(too_many(&ds, w));
    }
    let how = format!("console ({})", t.who());
    let s = store.clone();
    let d = ds.clone();
    let r = blocking(move || {
        s.content
            .unlock(s.backend.clone(), b.password, how, true)
            .map_err(|e| match e {
                UnlockError::Wait(w) => too_many(&d, w),
                UnlockError::Busy => ApiError::new(
                    StatusCode::CONFLICT,
                    "busy",
                    format!("another unlock of datastore {d} is under way"),
                ),
                UnlockError::Locked => ApiError::new(
                    StatusCode::CONFLICT,
                    "conflict",
                    format!("datastore {d} was locked while its key was being derived"),
                ),
                UnlockError::Engine(e) => engine_error(e),
            })
    })
    .await;
    if let Err(e) = &r
        && e.kind == "wrong_password"
    {
        crate::log_line(&format!(
            "datastore {ds}: unlock refused (wrong password) for {}",
            t.who()
        ));
    }
    r?;
    crate::log_line(&format!("datastore {ds}: unlocked by {}", t.who()));
    Ok(axum::Json(state_of(&store)).into_response())
}

/// `DELETE /v1/datastores/{ds}/unlock` (admin): the server forgets the key.
pub async fn relock(
    State(app): State<Arc<App>>,
    Path(ds): Path<String>,
    headers: HeaderMap,
) -> Result<Response, ApiError> {
    let (_, store) = admin_of(&app, &headers, &ds)?;
    let s = store.clone();
    blocking(move || {
        s.content.lock();
        Ok::<_, ApiError>(())
    })
    .await?;
    crate::log_line(&format!("datastore {ds}: locked again"));
    Ok(axum::Json(state_of(&store)).into_response())
}

pub fn state_of(store: &Datastore) -> UnlockState {
    match store.content.unlocked() {
        Some(u) => UnlockState {
            unlocked: true,
            how: Some(u.how.clone()),
            since: Some(u.since.clone()),
        },
        None => UnlockState {
            unlocked: false,
            how: None,
            since: None,
        },
    }
}

// ---------------------------------------------------------------------------
// Figures and snapshots

/// `GET /v1/datastores/{ds}/stats`: exactly what `cairn stats --json` prints.
pub async fn stats(
    State(app): State<Arc<App>>,
    Path(ds): Path<String>,
    headers: HeaderMap,
) -> Result<Response, ApiError> {
    let t = authenticate(&app, &headers)?;
    let store = datastore(&app, &t, &ds)?;
    if t.role == Role::Backup || t.view_host().is_some() {
        return Err(ApiError::new(
            StatusCode::FORBIDDEN,
            "forbidden",
            "the whole datastore's figures are for admin and unbound restore tokens",
        ));
    }
    let s = store.clone();
    let st = read(&store, move || s.content.stats()).await?;
    Ok(axum::Json(&*st).into_response())
}

#[derive(Clone, Serialize)]
pub struct SnapshotRow {
    pub id: String,
    pub time: String,
    /// The host the server recorded for the host-bound token that stored it, else
    /// the one the snapshot names.
    pub hostname: String,
    /// The host the snapshot names, when the server recorded another (a backup
    /// client of one host claiming another's name).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub claimed_hostname: Option<String>,
    pub username: String,
    pub paths: Vec<String>,
    pub tags: Vec<String>,
    /// Logical bytes of the files in it.
    pub size: u64,
    pub files: u64,
    /// Plaintext bytes of the chunks this backup added, and as stored.
    pub data_added: u64,
    pub data_added_packed: u64,
    pub duration_secs: f64,
    /// Image snapshots (`backup --image`): the image's block counts.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub image: Option<cairn_format::snapshot::ImageInfo>,
}

#[derive(Serialize)]
pub struct HostRow {
    pub host: String,
    pub snapshots: usize,
    pub last: String,
    /// Hours since the last backup.
    pub age_hours: f64,
    /// The last backup is older than the server's `stale_after_hours` (or there
    /// is none that is not dated in the future).
    pub stale: bool,
    /// Snapshots dated more than an hour in the future: not taken as the last
    /// backup.
    pub future_dated: usize,
}

#[derive(Serialize)]
pub struct SnapshotsAnswer {
    pub stale_after_hours: u64,
    pub hosts: Vec<HostRow>,
    /// Oldest first.
    pub snapshots: Vec<SnapshotRow>,
    /// Snapshot objects that could not be read.
    pub errors: Vec<String>,
}

/// `GET /v1/datastores/{ds}/snapshots`: the snapshots this token may see, and a
/// row per host with its last backup.
pub async fn snapshots(
    State(app): State<Arc<App>>,
    Path(ds): Path<String>,
    headers: HeaderMap,
) -> Result<Response, ApiError> {
    let (t, store) = reader(&app, &headers, &ds)?;
    let stale_hours = app.config.stale_after_hours;
    let s = store.clone();
    let answer = read(&store, move || {
        let (rows, errors) = snapshot_rows(&s, &t)?;
        Ok::<_, ApiError>(SnapshotsAnswer {
            stale_after_hours: stale_hours,
            hosts: host_rows(&rows, cairn_core::time::now_unix(), stale_hours),
            snapshots: rows,
            errors,
        })
    })
    .await?;
    Ok(axum::Json(answer).into_response())
}

/// The snapshots of `store` that `t` may see, oldest first, and the snapshot
/// objects that could not be read (blocking).
fn snapshot_rows(
    store: &Datastore,
    t: &TokenEntry,
) -> Result<(Vec<SnapshotRow>, Vec<String>), ApiError> {
    let (_, session) = store.content.session()?;
    let (list, errors) = session.snapshots().map_err(engine_error)?;
    // Hosts as the server recorded them: a host's last backup, and the fleet's
    // staleness, are not to be vouched for by another host's client.
    let mut list = list.clone();
    // The records through the server's cache (they are create-only).
    let claims: std::collections::HashMap<_, _> = session
        .repo()
        .attribute_hosts_by(&mut list, &|hex| {
            store.hosts.host_of(store.backend.as_ref(), hex)
        })
        .map_err(engine_error)?
        .into_iter()
        .collect();
    let mut rows = Vec::new();
    for (id, s) in &list {
        let hex = id.to_hex();
        if !may_see(store, t, &hex)? {
            continue;
        }
        let sum = &s.summary;
        rows.push(SnapshotRow {
            id: hex,
            time: s.time.clone(),
            hostname: s.hostname.clone(),
            claimed_hostname: claims.get(id).cloned(),
            username: s.username.clone(),
            paths: s.paths.clone(),
            tags: s.tags.clone(),
            size: sum.total_bytes,
            files: sum.files_new + sum.files_changed + sum.files_unchanged,
            data_added: sum.data_added,
            data_added_packed: sum.data_added_packed,
            duration_secs: sum.duration_secs,
            image: s.image.clone(),
        });
    }
    // Which objects failed is not secret, but a host-bound token learns nothing
    // of other hosts: it gets none.
    let errors = if t.view_host().is_none() {
        errors.iter().map(|e| e.to_string()).collect()
    } else {
        Vec::new()
    };
    Ok((rows, errors))
}

#[derive(Serialize)]
pub struct FleetHost {
    pub datastore: String,
    #[serde(flatten)]
    pub row: HostRow,
}

#[derive(Serialize)]
pub struct FleetSkipped {
    pub datastore: String,
    pub reason: String,
}

#[derive(Serialize)]
pub struct FleetAnswer {
    pub stale_after_hours: u64,
    /// Every host of every datastore the caller opens, stale ones first, then by name.
    pub hosts: Vec<FleetHost>,
    /// Datastores whose hosts are not known: locked, unreachable, or unreadable.
    pub not_shown: Vec<FleetSkipped>,
}

/// `GET /v1/fleet`: the hosts of every datastore the caller opens, with their last
/// backup — which machines backed up last night, and which did not.
pub async fn fleet(State(app): State<Arc<App>>, headers: HeaderMap) -> Result<Response, ApiError> {
    let t = authenticate(&app, &headers)?;
    if t.role == Role::Backup && t.host.is_none() {
        return Err(ApiError::new(
            StatusCode::FORBIDDEN,
            "forbidden",
            "a backup token without a host sees no snapshots",
        ));
    }
    let stale_hours = app.config.stale_after_hours;
    let stores: Vec<Arc<Datastore>> = app
        .datastores
        .values()
        .filter(|d| t.opens(&d.name))
        .cloned()
        .collect();
    let answer = blocking(move || {
        let now = cairn_core::time::now_unix();
        let mut hosts = Vec::new();
        let mut not_shown = Vec::new();
        for store in stores {
            // Not served (storage down, no repository): said so, not "locked"
            // (QA r16: both read "locked: its snapshots need the key").
            if !store.ready.load(std::sync::atomic::Ordering::Acquire) {
                let why = store
                    .not_served
                    .lock()
                    .unwrap_or_else(|e| e.into_inner())
                    .clone();
                not_shown.push(FleetSkipped {
                    datastore: store.name.clone(),
                    reason: match why {
                        Some(w) if t.role == Role::Admin => format!("not served: {w}"),
                        _ => "not served: its storage did not answer, or held no valid \
                              repository, when last tried (the server's log says which)"
                            .into(),
                    },
                });
                continue;
            }
            if store.content.unlocked().is_none() {
                not_shown.push(FleetSkipped {
                    datastore: store.name.clone(),
                    reason: "locked: its snapshots need the datastore's key".into(),
                });
                continue;
            }
            match snapshot_rows(&store, &t) {
                Ok((rows, _)) => {
                    for row in host_rows(&rows, now, stale_hours) {
                        hosts.push(FleetHost {
                            datastore: store.name.clone(),
                            row,
                        });
                    }
                }
                Err(mut e) => {
                    if e.kind == "transient" {
                        store.content.end_session();
                        e = storage_down(&store, e);
                    }
                    not_shown.push(FleetSkipped {
                        datastore: store.name.clone(),
                        reason: e.message,
                    })
                }
            }
        }
        hosts.sort_by(|a, b| {
            (!a.row.stale, &a.row.host, &a.datastore).cmp(&(
                !b.row.stale,
                &b.row.host,
                &b.datastore,
            ))
        });
        Ok::<_, ApiError>(FleetAnswer {
            stale_after_hours: stale_hours,
            hosts,
            not_shown,
        })
    })
    .await?;
    Ok(axum::Json(answer).into_response())
}

/// A row per host: its snapshots, the last one, and whether that is older than
/// `stale_hours` at `now` (seconds since the epoch).
fn host_rows(rows: &[SnapshotRow], now: i64, stale_hours: u64) -> Vec<HostRow> {
    // (snapshots, last time, its seconds, dated in the future)
    let mut hosts: std::collections::BTreeMap<&str, (usize, &str, i64, usize)> = Default::default();
    let future = now + cairn_core::forget::FUTURE_SLACK_HOURS * 3600;
    for r in rows {
        let secs = cairn_core::time::parse_rfc3339(&r.time).unwrap_or(0);
        let h = hosts.entry(&r.hostname).or_insert((0, "", i64::MIN, 0));
        h.0 += 1;
        // A snapshot dated ahead is no proof of a backup: a host whose clock is
        // wrong, or a client dating one so, would never look stale.
        if secs > future {
            h.3 += 1;
        } else if secs >= h.2 {
            (h.1, h.2) = (&r.time, secs);
        }
    }
    hosts
        .into_iter()
        .map(|(host, (n, last, secs, future_dated))| {
            let none = secs == i64::MIN;
            let age = if none {
                0.0
            } else {
                (now - secs).max(0) as f64 / 3600.0
            };
            HostRow {
                host: host.to_string(),
                snapshots: n,
                last: last.to_string(),
                age_hours: age,
                stale: none || age > stale_hours as f64,
                future_dated,
            }
        })
        .collect()
}

/// The snapshot `id` (a full id, a prefix, or `latest`) among those `t` may see,
/// and its root tree (blocking). Resolved among the visible ones only: a host-bound
/// token learns nothing of other hosts' snapshots, not even which prefixes exist
/// (every miss is the same 404), and its own short prefixes stay its own.
fn snapshot_for(
    store: &Datastore,
    t: &TokenEntry,
    id: &str,
) -> Result<(Arc<Session<Read>>, cairn_format::BlobId), ApiError> {
    let (_, session) = store.content.session()?;
    let not_found = || {
        ApiError::new(
            StatusCode::NOT_FOUND,
            "not_found",
            format!(
                "no snapshot {id} for this {}",
                if t.user { "user" } else { "token" }
            ),
        )
    };
    let lower = id.to_ascii_lowercase();
    if lower != "latest" && (lower.is_empty() || !lower.bytes().all(|b| b.is_ascii_hexdigit())) {
        return Err(not_found());
    }
    let (all, _) = session.snapshots().map_err(engine_error)?;
    let mut found = Vec::new();
    for (sid, snap) in all.iter() {
        let hex = sid.to_hex();
        if (lower == "latest" || hex.starts_with(&lower)) && may_see(store, t, &hex)? {
            found.push(snap);
        }
    }
    let snap = match found.len() {
        0 => return Err(not_found()),
        1 => found[0],
        // The newest of those visible (the list is oldest first).
        _ if lower == "latest" => found[found.len() - 1],
        n => {
            return Err(ApiError::new(
                StatusCode::BAD_REQUEST,
                "bad_request",
                format!(
                    "snapshot id {id:?} is ambiguous: {n} snapshots start with it; give more digits"
                ),
            ));
        }
    };
    let root = snap.tree_id().map_err(|e| {
        ApiError::new(
            StatusCode::INTERNAL_SERVER_ERROR,
            "damaged",
            format!("snapshot {id}: {e}"),
        )
    })?;
    Ok((session, root))
}

// ---------------------------------------------------------------------------
// Browsing

#[derive(Deserialize)]
pub struct EntriesQuery {
    #[serde(default)]
    path: String,
    /// The page starts after this name.
    #[serde(default)]
    after: Option<String>,
    #[serde(default)]
    limit: Option<usize>,
}

#[derive(Serialize)]
pub struct EntryRow {
    pub name: String,
    #[serde(rename = "type")]
    pub kind: &'static str,
    pub size: u64,
    pub mode: u32,
    pub user: String,
    pub group: String,
    pub mtime: String,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub link_target: Option<String>,
}

#[derive(Serialize)]
pub struct EntriesAnswer {
    pub path: String,
    /// Entries in the directory.
    pub total: usize,
    pub entries: Vec<EntryRow>,
    /// The name to ask `after` for the next page, if there is one.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub next: Option<String>,
}

/// `limit` as asked (`default` if not); 0 (it was answered with one entry) and
/// more than `max` (answered with `max`, silently) are refused, as the OpenAPI
/// file's bounds say.
fn page_limit(limit: Option<usize>, default: usize, max: usize) -> Result<usize, ApiError> {
    match limit {
        Some(n) if n == 0 || n > max => {
            Err(ApiError::bad(format!("limit={n}: ask for 1 to {max}")))
        }
        l => Ok(l.unwrap_or(default)),
    }
}

/// `GET /v1/datastores/{ds}/snapshots/{id}/entries?path=/a/b&after=NAME&limit=N`:
/// one page of a directory, in name order.
pub async fn entries(
    State(app): State<Arc<App>>,
    Path((ds, id)): Path<(String, String)>,
    Query(q): Query<EntriesQuery>,
    headers: HeaderMap,
) -> Result<Response, ApiError> {
    let (t, store) = reader(&app, &headers, &ds)?;
    let limit = page_limit(q.limit, PAGE, PAGE_MAX)?;
    let s = store.clone();
    let answer = read(&store, move || {
        let (session, root) = snapshot_for(&s, &t, &id)?;
        let repo = session.repo();
        let tree_id = match cairn_core::ls::find_node(repo, &root, &q.path).map_err(engine_error)? {
            None => root,
            Some(n) => n.subtree.ok_or_else(|| {
                ApiError::new(
                    StatusCode::BAD_REQUEST,
                    "not_a_directory",
                    format!("{} is a {}, not a directory", q.path, n.kind.name()),
                )
            })?,
        };
        let tree = repo.load_tree(&tree_id).map_err(engine_error)?;
        let start = match &q.after {
            None => 0,
            Some(a) => {
                let a = cairn_core::ls::unescape_name(a).unwrap_or_else(|| a.as_bytes().to_vec());
                tree.nodes.partition_point(|n| n.name <= a)
            }
        };
        let page: Vec<EntryRow> = tree
            .nodes
            .iter()
            .skip(start)
            .take(limit)
            .map(|n| {
                let e = cairn_core::ls::Entry::new("", n);
                EntryRow {
                    // Its bytes that are not UTF-8 as the stand-ins the console
                    // shows as \xNN and gives back in paths: as U+FFFD, two
                    // such names read the same and neither downloaded (QA).
                    name: cairn_core::tree::escape_name(&n.name),
                    kind: e.kind,
                    size: e.size,
                    mode: e.mode,
                    user: e.user,
                    group: e.group,
                    mtime: e.mtime,
                    link_target: e
                        .link_target
                        .map(|_| cairn_core::tree::escape_name(&n.link_target)),
                }
            })
            .collect();
        let next = (start + page.len() < tree.nodes.len())
            .then(|| page.last().map(|e| e.name.clone()))
            .flatten();
        // The directory as the walk found it (`/` for the root, without `.`,
        // `..` or doubled slashes): the path asked for was echoed, "" for none.
        let path = cairn_core::ls::resolve_path(repo, &root, &q.path).map_err(engine_error)?;
        Ok::<_, ApiError>(EntriesAnswer {
            path,
            total: tree.nodes.len(),
            entries: page,
            next,
        })
    })
    .await?;
    Ok(axum::Json(answer).into_response())
}

#[derive(Deserialize)]
pub struct SearchQuery {
    q: String,
    #[serde(default)]
    path: String,
    #[serde(default)]
    limit: Option<usize>,
}

/// `GET /v1/datastores/{ds}/snapshots/{id}/search?q=NAME&path=/a&limit=N`:
/// entries whose name contains `q` (ignoring ASCII case).
pub async fn search(
    State(app): State<Arc<App>>,
    Path((ds, id)): Path<(String, String)>,
    Query(q): Query<SearchQuery>,
    headers: HeaderMap,
) -> Result<Response, ApiError> {
    let (t, store) = reader(&app, &headers, &ds)?;
    if q.q.trim().is_empty() {
        return Err(ApiError::new(
            StatusCode::BAD_REQUEST,
            "bad_request",
            "search for something: q is empty",
        ));
    }
    let limit = page_limit(q.limit, SEARCH, SEARCH_MAX)?;
    let s = store.clone();
    let found = read(&store, move || {
        let (session, root) = snapshot_for(&s, &t, &id)?;
        // An unreadable directory is left out of the search (check reports it).
        cairn_core::ls::search(&session, &root, &q.path, q.q.trim(), limit, &mut |_, _| {})
            .map_err(engine_error)
    })
    .await?;
    Ok(axum::Json(found).into_response())
}

// ---------------------------------------------------------------------------
// Downloads

#[derive(Deserialize)]
pub struct DownloadQuery {
    path: String,
    /// `file` (one file's bytes; the default for a file), `tar.zst` or `zip`.
    #[serde(default)]
    format: Option<String>,
}

/// Sends what a blocking writer produces as a response body, a piece at a time:
/// at most a few pieces wait in memory, so a download of any size takes the same
/// memory. When the client goes away, the writer gets an error and stops.
struct Pipe {
    tx: crate::pipe::PipeTx,
    buf: Vec<u8>,
    meter: Meter,
    /// The server's runtime, to wait for the client with a time limit.
    rt: tokio::runtime::Handle,
    /// The download's place among those running, given back when it ends.
    _place: crate::conns::Place<String>,
}

/// Snapshot downloads at once, in all and per token or user: each holds one of
/// the runtime's blocking threads and its own readers for as long as it runs, so
/// downloads without a bound (audit r33: 540 that were never read) took every
/// blocking thread and hung every request that touches storage.
pub const DOWNLOADS_AT_ONCE: usize = 32;
pub const DOWNLOADS_PER_CALLER: usize = 4;

/// What a download's pieces count against: the bytes sent (the server's and its
/// datastore's, for /metrics) and the download limits (the token's, the
/// server's), as the object routes do (QA: a 1 MiB/s limit let 40 MB through
/// this route in 0.13 s, and /metrics counted none of it).
struct Meter {
    app: Arc<App>,
    token: String,
    store: Arc<Datastore>,
    /// Who downloads (a user's name, or a token's id) and the datastore's lock
    /// count at the start: a download ends once the token or user is removed or
    /// an admin locks the datastore (QA r13: 25 MB went on after each).
    user: Option<String>,
    locks_at_start: u64,
    checked: Instant,
}

/// How often a running download asks whether it is still allowed.
const RECHECK: Duration = Duration::from_secs(1);

impl Meter {
    fn still_allowed(&mut self) -> Result<(), String> {
        if self.store.content.locks() != self.locks_at_start {
            return Err("the datastore was locked: the download was ended".into());
        }
        if self.checked.elapsed() < RECHECK {
            return Ok(());
        }
        self.checked = Instant::now();
        // An unreadable file is said by the next request; the download goes on.
        let gone = match &self.user {
            Some(name) => matches!(self.app.users.get(name), Ok(None)),
            None => matches!(self.app.tokens.exists(&self.token), Ok(false)),
        };
        if gone {
            return Err(format!(
                "its {} was removed: the download was ended",
                if self.user.is_some() { "user" } else { "token" }
            ));
        }
        Ok(())
    }
}

impl Pipe {
    fn send(&mut self) -> std::io::Result<()> {
        if self.buf.is_empty() {
            return Ok(());
        }
        self.meter.still_allowed().map_err(std::io::Error::other)?;
        let n = self.buf.len() as u64;
        let m = &self.meter;
        m.app.stats.bytes_out.fetch_add(n, Ordering::Relaxed);
        m.store.stats.bytes_out.fetch_add(n, Ordering::Relaxed);
        // On the export's own thread (not the runtime's): waiting here holds
        // back the next piece, and with it the reading.
        let wait = m.app.pace(&m.token, false, n);
        if !wait.is_zero() {
            std::thread::sleep(wait);
        }
        let piece = Bytes::from(std::mem::replace(&mut self.buf, Vec::with_capacity(PIECE)));
        // A client that takes nothing for that long is given up (over HTTP/2 a
        // stream can stall while its connection goes on); a slow one is not.
        self.rt
            .block_on(self.tx.send(piece))
            .map_err(crate::pipe::Stop::into_io)
    }
    /// Ends the download with an error: the body ends broken, never as if whole.
    fn fail(self, message: String) {
        self.rt
            .block_on(self.tx.fail(std::io::Error::other(message)));
    }
    /// Ends the download complete.
    fn end(&self) -> std::io::Result<()> {
        self.rt
            .block_on(self.tx.end())
            .map_err(crate::pipe::Stop::into_io)
    }
}

impl std::io::Write for Pipe {
    fn write(&mut self, data: &[u8]) -> std::io::Result<usize> {
        self.buf.extend_from_slice(data);
        if self.buf.len() >= PIECE {
            self.send()?;
        }
        Ok(data.len())
    }
    fn flush(&mut self) -> std::io::Result<()> {
        self.send()
    }
}

/// A name for `Content-Disposition`: what is safe in a quoted filename.
fn file_name(s: &str) -> String {
    let n: String = s
        .chars()
        .map(|c| {
            if c.is_ascii_alphanumeric() || "._-+".contains(c) {
                c
            } else {
                '_'
            }
        })
        .collect();
    if n.is_empty() || n.chars().all(|c| c == '.') {
        "download".into()
    } else {
        n
    }
}

/// The name percent-encoded for `filename*=UTF-8''…` (RFC 6266), which browsers
/// prefer to the ASCII stand-in.
fn utf8_name(s: &str) -> String {
    s.bytes()
        .map(|b| {
            if b.is_ascii_alphanumeric() || b"._-+".contains(&b) {
                (b as char).to_string()
            } else {
                format!("%{b:02X}")
            }
        })
        .collect()
}

/// `GET /v1/datastores/{ds}/snapshots/{id}/download?path=/a/b&format=file|tar.zst|zip`:
/// one file as it was backed up, or a directory (or file) as a zstd-compressed
/// POSIX tar or a zip (for systems without tar), streamed.
pub async fn download(
    State(app): State<Arc<App>>,
    Path((ds, id)): Path<(String, String)>,
    Query(q): Query<DownloadQuery>,
    headers: HeaderMap,
) -> Result<Response, ApiError> {
    let (t, store) = reader(&app, &headers, &ds)?;
    let Some(place) = app.downloads.enter(t.id.clone()) else {
        return Err(ApiError::new(
            StatusCode::TOO_MANY_REQUESTS,
            "too_many_downloads",
            format!(
                "too many downloads are running (at most {DOWNLOADS_AT_ONCE} at once, \
                 {DOWNLOADS_PER_CALLER} per token or user): try again when one has ended"
            ),
        ));
    };
    let kind = match q.format.as_deref() {
        None | Some("file") => None,
        Some("tar.zst") => Some("tar.zst"),
        Some("zip") => Some("zip"),
        Some(f) => {
            return Err(ApiError::new(
                StatusCode::BAD_REQUEST,
                "bad_request",
                format!("format {f:?}: use file, tar.zst or zip"),
            ));
        }
    };
    let archive = kind.is_some();
    // Checked before the answer starts: what is asked for exists and is allowed.
    let (token, path, sid) = (t.clone(), q.path.clone(), id.clone());
    let s = store.clone();
    let (session, root, node) = read(&store, move || {
        let (session, root) = snapshot_for(&s, &token, &sid)?;
        let node = cairn_core::ls::find_node(session.repo(), &root, &path).map_err(engine_error)?;
        Ok::<_, ApiError>((session, root, node))
    })
    .await?;
    // The name of what was found, not the path's last word (`dir/sub/..` named
    // a zip `...zip`, QA r13).
    let base = node
        .as_ref()
        .map(|n| String::from_utf8_lossy(&n.name).into_owned())
        .filter(|s| !s.is_empty())
        .unwrap_or_else(|| format!("snapshot-{}", id.chars().take(8).collect::<String>()));
    let size = match &node {
        Some(n) if !archive => {
            if n.kind != cairn_format::tree::NodeKind::File {
                return Err(ApiError::new(
                    StatusCode::BAD_REQUEST,
                    "not_a_file",
                    format!(
                        "{} is a {}: download it as an archive (format=tar.zst or zip)",
                        q.path,
                        n.kind.name()
                    ),
                ));
            }
            Some(n.size)
        }
        None if !archive => {
            return Err(ApiError::new(
                StatusCode::BAD_REQUEST,
                "not_a_file",
                "the snapshot's root is a directory: download it as an archive (format=tar.zst or zip)",
            ));
        }
        _ => None,
    };
    let (tx, body) = crate::pipe::pipe(4, app.stall());
    let path = q.path.clone();
    crate::log_line(&format!(
        "datastore {ds}: {} downloads {path} of snapshot {id}{}",
        t.who(),
        kind.map(|k| format!(" as {k}")).unwrap_or_default()
    ));
    let meter = Meter {
        app: app.clone(),
        token: t.id.clone(),
        store: store.clone(),
        user: t.user.then(|| t.name.clone()),
        locks_at_start: store.content.locks(),
        checked: Instant::now(),
    };
    let rt = tokio::runtime::Handle::current();
    tokio::task::spawn_blocking(move || {
        let mut pipe = Pipe {
            tx,
            buf: Vec::with_capacity(PIECE),
            meter,
            rt,
            _place: place,
        };
        // A directory left out, or a file with zeros for what could not be read,
        // must not pass for a complete archive.
        let complete = |r: cairn_core::export::ExportReport| {
            if let Some(cairn_core::export::ExportError { path: p, error: e }) = r.errors.first() {
                return Err(cairn_core::Error::Invalid(format!(
                    "{} could not be read ({p}: {e})",
                    cairn_core::units::count(r.errors.len() as u64, "directory")
                )));
            }
            match r.damaged.first() {
                None => Ok(()),
                Some(cairn_core::export::DamagedFile {
                    path: p, error: e, ..
                }) => Err(cairn_core::Error::Invalid(format!(
                    "{} could not be read in full ({p}: {e})",
                    cairn_core::units::count(r.damaged.len() as u64, "file")
                ))),
            }
        };
        let r = match kind {
            Some("zip") => cairn_core::export::export_complete(
                &session,
                &root,
                &path,
                cairn_core::export::Format::Zip,
                &mut pipe,
            )
            .and_then(complete),
            Some(_) => zstd::stream::Encoder::new(&mut pipe, 3)
                .map_err(|e| cairn_core::Error::io("the archive", e))
                .and_then(|mut enc| {
                    let r = cairn_core::export::export_complete(
                        &session,
                        &root,
                        &path,
                        cairn_core::export::Format::Tar,
                        &mut enc,
                    )?;
                    enc.finish()
                        .map_err(|e| cairn_core::Error::io("the archive", e))?;
                    complete(r)
                }),
            None => cairn_core::dump::dump(&session, &root, &path, &mut pipe).map(|_| ()),
        };
        match r.and_then(|_| {
            std::io::Write::flush(&mut pipe).map_err(|e| cairn_core::Error::io("the download", e))
        }) {
            // Said complete only now: a body whose end is not said ends broken.
            Ok(()) => {
                let _ = pipe.end();
            }
            // The body ends with an error, so the browser reports a failed download
            // instead of keeping a short file.
            Err(e) => {
                crate::log_line(&format!("download of {path} failed: {e}"));
                pipe.fail(e.to_string());
            }
        }
    });
    let (name, ctype) = match kind {
        Some("zip") => (format!("{base}.zip"), "application/zip"),
        Some(_) => (format!("{base}.tar.zst"), "application/zstd"),
        None => (base.clone(), "application/octet-stream"),
    };
    let mut resp = Response::new(Body::new(body));
    let h = resp.headers_mut();
    h.insert(
        header::CONTENT_TYPE,
        header::HeaderValue::from_static(ctype),
    );
    if let Ok(v) = format!(
        "attachment; filename=\"{}\"; filename*=UTF-8''{}",
        file_name(&name),
        utf8_name(&name)
    )
    .parse()
    {
        h.insert(header::CONTENT_DISPOSITION, v);
    }
    if let Some(n) = size
        && let Ok(v) = n.to_string().parse()
    {
        h.insert(header::CONTENT_LENGTH, v);
    }
    Ok(resp)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn row(host: &str, time: &str) -> SnapshotRow {
        SnapshotRow {
            id: String::new(),
            time: time.into(),
            hostname: host.into(),
            claimed_hostname: None,
            username: String::new(),
            paths: vec![],
            tags: vec![],
            size: 0,
            files: 0,
            data_added: 0,
            data_added_packed: 0,
            duration_secs: 0.0,
            image: None,
        }
    }

    #[test]
    fn a_host_is_stale_when_its_last_backup_is_older_than_the_threshold() {
        let now = cairn_core::time::parse_rfc3339("2026-11-25T12:00:00Z").unwrap();
        let rows = [
            row("db1", "2026-11-20T01:00:00Z"),
            row("web01", "2026-11-23T01:00:00Z"),
            row("web01", "2026-11-25T01:00:00Z"),
            row("db1", "2026-11-23T12:00:00Z"),
        ];
        let h = host_rows(&rows, now, 26);
        assert_eq!(h.len(), 2);
        assert_eq!((h[0].host.as_str(), h[0].snapshots), ("db1", 2));
        assert_eq!(
            h[0].last, "2026-11-23T12:00:00Z",
            "the newest, not the last listed"
        );
        assert!(h[0].stale && (h[0].age_hours - 48.0).abs() < 1e-9);
        assert_eq!(h[1].last, "2026-11-25T01:00:00Z");
        assert!(!h[1].stale, "11 hours old");
        // A snapshot dated ahead does not make a host look fresh.
        let mut rows = rows.to_vec();
        rows.push(row("db1", "2030-01-03T00:00:00Z"));
        rows.push(row("ghost", "2031-01-01T00:00:00Z"));
        let h = host_rows(&rows, now, 26);
        assert_eq!(
            (h[0].last.as_str(), h[0].stale, h[0].future_dated),
            ("2026-11-23T12:00:00Z", true, 1)
        );
        assert_eq!(
            (h[1].host.as_str(), h[1].last.as_str(), h[1].stale),
            ("ghost", "", true)
        );
    }

    #[test]
    fn download_names_are_safe_in_a_header() {
        assert_eq!(file_name("report 2026.pdf"), "report_2026.pdf");
        assert_eq!(file_name("a\"b\r\nc"), "a_b__c");
        assert_eq!(file_name(".."), "download");
        assert_eq!(file_name("Ünï"), "_n_");
        assert_eq!(utf8_name("Ünï a.txt"), "%C3%9Cn%C3%AF%20a.txt");
    }
}
