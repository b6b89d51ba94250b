//! Dedup queries: the server answers "which of these chunk ids do you hold?" from
//! the datastore's dedup lists (`dedup/<index id>`, docs/FORMAT.md), without a key,
//! and knows which chunks clients are sending now, so that two clients sending the
//! same new chunk at the same moment store it once.
//!
//! Correctness rests on three rules (the argument is in docs/FORMAT.md, "Dedup
//! lists"):
//! - "Stored" only for ids in the list of a live index file (listed, not superseded
//!   by an admin file's list). An `admin-` file without a list makes the service
//!   unavailable: the server cannot know what it removed.
//! - The view is refreshed after the asking client's lock was written (every lock
//!   written through this server bumps a generation; a view older than it is rebuilt
//!   before answering), so a prune that finished before the backup started is
//!   seen, and none can start while the lock is held.
//! - Nothing here is needed for correctness after a restart: the view is rebuilt
//!   from the datastore, claims only save uploads.
//!
//! On a datastore on this machine's file systems, each plan also lists the packs
//! and holds them against the packs the live lists name (lists of format 2): a pack
//! deleted or cut short behind the server's back makes the chunks only it held
//! "not stored", changes the epoch, and is named in the plan, so that the backup
//! stores that data again instead of a snapshot that cannot be restored (QA r28).

use crate::idset::{IdSet, Prefix, prefix};
use cairn_backend::{Backend, BackendError, DedupAnswer, names};
use cairn_format::dedup::DedupList;
use std::collections::{HashMap, HashSet};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, RwLock};
use std::time::{Duration, Instant};

/// How long a chunk a client was told to send counts as in flight from it at most.
pub const CLAIM_TTL: Duration = Duration::from_secs(180);
/// A client not heard from for this long (any request carries its session) is
/// taken for gone, and its claims with it: a killed client's chunks are then sent
/// by others after seconds, not minutes.
pub const SESSION_SILENCE: Duration = Duration::from_secs(15);
/// Claims kept at most per datastore (beyond, ids are answered "send" unclaimed,
/// which costs at worst a chunk stored twice until prune): about 130 bytes each,
/// so some 130 MB however clients ask (queries and confirmation rounds alike;
/// audit r33: confirmations had no cap, and 4 M claims held 560 MB). A million
/// covers 16 GB of new chunks in flight at 16 KiB.
const MAX_CLAIMS: usize = if cfg!(test) { 10_000 } else { 1_000_000 };
/// How old the view may be for a confirmation round.
const CONFIRM_LISTING_EVERY: Duration = Duration::from_secs(1);
/// Ids per request at most.
pub const MAX_IDS_PER_REQUEST: usize = 65_536;
/// A view older than this is refreshed before answering (to see lists written
/// through other servers; correctness does not depend on it).
const MAX_VIEW_AGE: Duration = Duration::from_secs(30);

/// The dedup service of one datastore.
#[derive(Default)]
pub struct Dedup {
    view: RwLock<View>,
    /// One refresh at a time.
    refreshing: Mutex<()>,
    /// Bumped by every lock written through this server.
    lock_gen: AtomicU64,
    /// Set when the server stops: a view being built gives up between lists, so
    /// that a shutdown does not wait for a large datastore's lists to be read.
    stopping: AtomicBool,
    claims: Mutex<HashMap<[u8; 32], Claim>>,
    /// When each session (token id and the client's session header) was last heard.
    seen: Mutex<HashMap<String, Instant>>,
    /// Which token stored each plain index file lately (see [`Dedup::writer_of`]).
    writers: Mutex<Writers>,
    /// When the claims were last swept for dead sessions' (see [`Dedup::query`]).
    swept: Mutex<Option<Instant>>,
    /// Damaged lists already logged (each once, not at every refresh).
    damaged_logged: Mutex<HashSet<[u8; 32]>>,
    /// The datastore's name, for the log.
    pub name: String,
    /// Whether plans list the packs to find those missing or cut short (a
    /// datastore on this machine's file systems, where a listing is a directory
    /// read; on object storage it is thousands of requests, as for a client).
    pub check_packs: bool,
    /// Packs logged as missing, and lists logged for naming a pack longer than
    /// it is (each once).
    missing_logged: Mutex<HashSet<[u8; 32]>>,
    /// The packs' listing, shared by the plans that wait for it together.
    listings: Listings,
    /// Packs the last scrub job found damaged (content that does not match the
    /// name): judged as missing, on object storage too, until a scrub finds
    /// them whole or a repair supersedes the lists naming them (QA r33: backups
    /// through the server were told such chunks were stored).
    damaged: Mutex<HashSet<[u8; 32]>>,
    pub stats: DedupStats,
}

/// Index files stored through this server and the tokens that stored them, the
/// newest [`WRITERS_KEPT`].
#[derive(Default)]
struct Writers {
    by_name: HashMap<String, String>,
    order: std::collections::VecDeque<String>,
}

/// Index files whose writers are remembered: a client stores an index file's list
/// right after the file, so the last few thousand cover every backup running.
const WRITERS_KEPT: usize = 16_384;

#[derive(Default)]
pub struct DedupStats {
    pub queries: AtomicU64,
    pub stored: AtomicU64,
    pub send: AtomicU64,
    pub in_flight: AtomicU64,
    pub confirmed_missing: AtomicU64,
}

struct Claim {
    /// Shared by every claim of one request (an allocation per request, not per id).
    session: Arc<str>,
    at: Instant,
}

#[derive(Default)]
struct View {
    /// `lock_gen` when the refresh that built it began; `None`: never built.
    gen_at: Option<u64>,
    built: Option<Instant>,
    /// Every listed index file: its object name and what its list says.
    files: HashMap<[u8; 32], FileInfo>,
    /// Data chunk ids of live files.
    ids: IdSet,
    /// Why queries cannot be answered.
    unavailable: Option<String>,
    /// Per index file, the packs its list names that the storage lacks or holds
    /// shorter than the list says, when last looked: their ids in that list are
    /// not in `ids` (those other lists place in whole packs are).
    skip: HashMap<[u8; 32], Vec<[u8; 32]>>,
    /// Packs the storage lacks, or holds shorter than every list naming them
    /// says (a list alone cannot make a pack missing for all): named in plans.
    missing: HashSet<[u8; 32]>,
    /// The number of the listing `skip` and `missing` come from ([`ListingState::started`]).
    missing_seq: u64,
    /// Part of the epoch: drawn anew when the first view is built (this server
    /// cannot know what was removed before it started) and whenever an index file
    /// goes without an admin file superseding it (deleted directly).
    salt: [u8; 16],
}

#[derive(Clone)]
struct FileInfo {
    name: String,
    admin: bool,
    /// `None`: no (valid) list.
    list: Option<ListInfo>,
}

#[derive(Clone)]
struct ListInfo {
    metadata: bool,
    supersedes: Vec<[u8; 32]>,
    /// The packs the file lists and where each one's last blob ends (empty for
    /// a list of format 1, which names none: those packs are not checked).
    packs: Vec<([u8; 32], u64)>,
}

impl ListInfo {
    fn of(l: &DedupList) -> ListInfo {
        ListInfo {
            metadata: l.metadata,
            supersedes: l.supersedes.iter().map(|s| s.0).collect(),
            packs: (l.packs.iter().flatten())
                .map(|p| (p.id.0, p.end))
                .collect(),
        }
    }
}

/// The index files that the lists of `files` supersede (no longer live).
fn superseded_by(files: &HashMap<[u8; 32], FileInfo>) -> HashSet<[u8; 32]> {
    files
        .values()
        .filter_map(|f| f.list.as_ref())
        .flat_map(|l| l.supersedes.iter().copied())
        .collect()
}

/// The data ids of a list that a pack not in `skip` holds, as prefixes (all of
/// a list of format 1's).
fn held_prefixes(l: &DedupList, skip: &[[u8; 32]]) -> Vec<Prefix> {
    match &l.packs {
        Some(packs) if !skip.is_empty() => {
            let mut v: Vec<Prefix> = packs
                .iter()
                .filter(|p| !skip.contains(&p.id.0))
                .flat_map(|p| p.ids.iter().map(|i| prefix(&i.0)))
                .collect();
            v.sort_unstable();
            v.dedup();
            v
        }
        _ => l.ids.iter().map(|i| prefix(&i.0)).collect(),
    }
}

/// What a backup client is told to read.
#[derive(serde::Serialize)]
pub struct Plan {
    pub available: bool,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub reason: Option<String>,
    pub index_files: Vec<String>,
    pub chunks: u64,
    /// Packs (hex ids) live index files name that the storage lacks or holds cut
    /// short, the first [`MAX_NAMED_MISSING`]: the client treats their blobs as
    /// missing, as a backup of a local repository does.
    pub missing_packs: Vec<String>,
    /// Changes whenever an `admin-` index file appears or goes, or an index file
    /// goes without one (the only ways a chunk stops being stored), and when the
    /// server starts: a client may keep "stored" answers across backups while it
    /// is the same.
    pub epoch: String,
}

fn id32(hex_id: &str) -> Option<[u8; 32]> {
    let mut out = [0u8; 32];
    hex::decode_to_slice(hex_id, &mut out).ok()?;
    Some(out)
}

/// Builds every datastore's view in the background when the server starts, so
/// that the first backup after a start (or an upgrade) does not wait for it: a
/// datastore of 100 M chunks takes seconds to read. A failure is logged and the
/// view is built at the first question instead.
pub fn warm_all(app: &crate::App) {
    for ds in app.datastores.values() {
        if !ds.admin_names.load(std::sync::atomic::Ordering::Acquire) {
            continue;
        }
        let ds = ds.clone();
        tokio::task::spawn_blocking(move || {
            let t = Instant::now();
            match ds.dedup.fresh(ds.backend.as_ref()) {
                Ok(()) => {
                    let (chunks, bytes) = ds.dedup.view_size();
                    crate::log_line(&format!(
                        "datastore {}: dedup view of {chunks} chunks ready in {:.1} s ({} MiB)",
                        ds.name,
                        t.elapsed().as_secs_f64(),
                        bytes >> 20
                    ));
                }
                Err(_) if ds.dedup.stopping.load(Ordering::SeqCst) => {}
                Err(e) => crate::log_line(&format!(
                    "datastore {}: dedup view not built at start ({e}); the first backup builds it",
                    ds.name
                )),
            }
        });
    }
}

/// The listing of `data/` the plans share: many clients starting at once read
/// the directory once or twice, not once each. A plan uses only a listing that
/// began after it arrived (so it sees every pack deleted before it asked), and
/// waits for the one running first.
#[derive(Default)]
struct Listings {
    state: Mutex<ListingState>,
    done: std::sync::Condvar,
}

/// Packs and their sizes, as a listing found them.
type Listed = Arc<HashMap<[u8; 32], u64>>;

#[derive(Default)]
struct ListingState {
    /// Numbers the listings as they begin, so that a check whose listing is
    /// older than the one the view was built from changes nothing.
    started: u64,
    running: bool,
    /// The newest listing that ended: its number and its packs and sizes
    /// (`None`: it failed).
    last: Option<(u64, Option<Listed>)>,
    /// Whether the last listing failed (logged once until one works again).
    failing: bool,
    /// Listings made (for the tests).
    made: u64,
}

impl Listings {
    /// A number for a judgement made without a listing (object storage), in
    /// the same sequence as the listings'.
    fn next_seq(&self) -> u64 {
        let mut st = self.state.lock().unwrap_or_else(|e| e.into_inner());
        st.started += 1;
        st.started
    }
}

/// Ends a listing even when the backend panics, so that no plan waits forever.
struct ListingRun<'a> {
    listings: &'a Listings,
    seq: u64,
    /// The packs and sizes, once listed (`None`: failed, or the backend panicked).
    result: Option<Listed>,
}

impl Drop for ListingRun<'_> {
    fn drop(&mut self) {
        let mut st = (self.listings.state.lock()).unwrap_or_else(|e| e.into_inner());
        // One listing runs at a time: this is the newest.
        st.running = false;
        st.last = Some((self.seq, self.result.take()));
        self.listings.done.notify_all();
    }
}

/// Lists read at the same time while a view is built.
const LIST_READERS: usize = 4;
/// Missing packs a plan names at most (lists could name millions of packs that
/// never were; the view leaves out what they hold however many there are).
pub const MAX_NAMED_MISSING: usize = 10_000;
/// Missing packs (or lying lists) logged one by one per check at most.
const MAX_LOGGED_MISSING: usize = 10;

impl Dedup {
    /// The service of datastore `name`.
    pub fn named(name: &str) -> Dedup {
        Dedup {
            name: name.to_string(),
            ..Default::default()
        }
    }

    /// The service of datastore `name`; `remote`: on object storage, where its
    /// packs are not listed to find missing ones.
    pub fn at(name: &str, remote: bool) -> Dedup {
        Dedup {
            check_packs: !remote,
            ..Dedup::named(name)
        }
    }

    /// `session`'s job is over (its client released its job slot, after a
    /// backup that ended or failed): its claims stand no longer, so that another
    /// client sends what it never will at once rather than after
    /// [`SESSION_SILENCE`]. A later request of the session starts it again.
    pub fn end_session(&self, session: &str) {
        self.seen
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .remove(session);
    }

    /// A request of `session` arrived.
    pub fn touch(&self, session: &str) {
        let mut seen = self.seen.lock().unwrap_or_else(|e| e.into_inner());
        if seen.len() > 100_000 {
            seen.retain(|_, t| t.elapsed() < SESSION_SILENCE);
        }
        seen.insert(session.to_string(), Instant::now());
    }

    /// Whether a claim still stands: young enough, and its client heard lately.
    /// `seen`: [`Dedup::seen`], locked once per request rather than per id.
    fn live(seen: &HashMap<String, Instant>, c: &Claim) -> bool {
        c.at.elapsed() < CLAIM_TTL
            && seen
                .get(&*c.session)
                .is_some_and(|t| t.elapsed() < SESSION_SILENCE)
    }

    /// The server is stopping: views being built give up.
    pub fn stop(&self) {
        self.stopping.store(true, Ordering::SeqCst);
    }

    /// Reads the dedup list of index file `id`, kept as what the view needs: its
    /// supersede list, flags and packs, and the prefixes of the ids that packs
    /// `skip` does not name for this file hold (the whole list is dropped at
    /// once). A damaged list, or one that does not describe its file, counts as
    /// none. Gives up when the server is stopping.
    fn read_list(
        &self,
        backend: &dyn Backend,
        id: &[u8; 32],
        admin: bool,
        skip: &HashMap<[u8; 32], Vec<[u8; 32]>>,
    ) -> Result<Option<(ListInfo, Vec<Prefix>)>, BackendError> {
        let name = names::dedup(&hex::encode(id));
        if self.stopping.load(Ordering::SeqCst) {
            return Err(BackendError {
                kind: cairn_backend::BackendErrorKind::Other,
                op: "read",
                path: name,
                message: "the server is stopping".into(),
            });
        }
        let data =
            match backend.get_bounded(&name, cairn_format::consts::MAX_INDEX_FILE_SIZE as u64) {
                Ok(d) => d,
                Err(e) if e.is_not_found() => return Ok(None),
                Err(e) => return Err(e),
            };
        let l = match DedupList::decode(&data) {
            Ok(l) if l.index.0 == *id && l.admin == admin && (admin || l.supersedes.is_empty()) => {
                l
            }
            // Taken as no list (clients read the index file itself, so nothing is
            // wrong but speed), and said once, with the way out (QA r28: clients
            // sent everything again and the log said nothing).
            other => {
                let why = match other {
                    Err(e) => e.to_string(),
                    Ok(_) => "it names another index file".to_string(),
                };
                let first = (self.damaged_logged.lock())
                    .unwrap_or_else(|e| e.into_inner())
                    .insert(*id);
                if first {
                    crate::log_line(&format!(
                        "datastore {}: {name} is damaged ({why}): backups read its index \
                         file whole instead; `cairn repair index` (admin) writes it again",
                        self.name
                    ));
                }
                return Ok(None);
            }
        };
        let skip = skip.get(id).map_or(&[][..], Vec::as_slice);
        Ok(Some((ListInfo::of(&l), held_prefixes(&l, skip))))
    }

    fn view(&self) -> std::sync::RwLockReadGuard<'_, View> {
        self.view.read().unwrap_or_else(|e| e.into_inner())
    }

    /// Chunk ids in the current view and the bytes they take.
    pub fn view_size(&self) -> (usize, usize) {
        let v = self.view();
        (v.ids.len(), v.ids.bytes())
    }

    /// Packs found missing or cut short when the last plan checked them.
    pub fn missing_packs(&self) -> usize {
        self.view().missing.len()
    }

    /// A lock was written through this server: views from before are stale.
    pub fn lock_written(&self) {
        self.lock_gen.fetch_add(1, Ordering::SeqCst);
    }

    /// An index file was not found: if the current view names it (a prune that
    /// did not go through this server replaced it), the view is built anew before
    /// the next plan. Clients look for a file under its plain name before its
    /// admin name, so most misses are of names no view holds.
    pub fn index_file_missing(&self, name: &str) {
        let (_, id) = names::split_admin(names::base(name));
        let named =
            id32(id).is_some_and(|id| self.view().files.get(&id).is_some_and(|f| f.name == name));
        if named {
            self.lock_gen.fetch_add(1, Ordering::SeqCst);
        }
    }

    /// Rebuilds the view if it predates the newest lock written here or is old.
    /// Blocking (storage calls).
    fn fresh(&self, backend: &dyn Backend) -> Result<(), BackendError> {
        let need = |v: &View, generation: u64| {
            v.gen_at.is_none_or(|g| g < generation)
                || v.built.is_none_or(|b| b.elapsed() > MAX_VIEW_AGE)
        };
        let generation = self.lock_gen.load(Ordering::SeqCst);
        if !need(&self.view(), generation) {
            return Ok(());
        }
        let _one = self.refreshing.lock().unwrap_or_else(|e| e.into_inner());
        if !need(&self.view(), generation) {
            return Ok(()); // another request refreshed it meanwhile
        }
        self.refresh_locked(backend, None)
    }

    fn refresh(&self, backend: &dyn Backend) -> Result<(), BackendError> {
        let _one = self.refreshing.lock().unwrap_or_else(|e| e.into_inner());
        self.refresh_locked(backend, None)
    }

    /// Builds the view anew from the listing. `packs`: a new judgement of the
    /// packs (what each file's list does not count, the missing packs and the
    /// listing they come from); the ids are then rebuilt from every live list, and
    /// the judgement is part of the view only once that succeeded.
    fn refresh_locked(
        &self,
        backend: &dyn Backend,
        packs: Option<Judged>,
    ) -> Result<(), BackendError> {
        let generation = self.lock_gen.load(Ordering::SeqCst);
        let rebuild = packs.is_some();
        let skip = match &packs {
            Some(j) => j.skip.clone(),
            None => self.view().skip.clone(),
        };
        let listed: Vec<(String, [u8; 32], bool)> = backend
            .list(names::INDEX)?
            .into_iter()
            .filter_map(|o| {
                let (admin, id) = names::split_admin(names::listed(&o.name));
                id32(id).map(|i| (o.name.clone(), i, admin))
            })
            .collect();
        let with_list: HashSet<[u8; 32]> = backend
            .list(names::DEDUP)?
            .iter()
            .filter_map(|o| id32(names::listed(&o.name)))
            .collect();
        let old_files = self.view().files.clone();
        let mut files = HashMap::with_capacity(listed.len());
        // A file known with its list, or known to have none, is taken as it was.
        let reuse = |id: &[u8; 32]| {
            old_files
                .get(id)
                .filter(|f| f.list.is_some() || !with_list.contains(id))
        };
        // The other lists are read now, several at a time (a datastore on S3 of
        // 100 M chunks has about 500 of them), and kept as prefixes: half the
        // memory while the first view of a large datastore is built.
        let to_read: Vec<([u8; 32], bool)> = listed
            .iter()
            .filter(|(_, id, _)| reuse(id).is_none() && with_list.contains(id))
            .map(|(_, id, admin)| (*id, *admin))
            .collect();
        let mut read: HashMap<[u8; 32], (ListInfo, Vec<Prefix>)> = HashMap::new();
        let results = cairn_core::threads::parallel_map(&to_read, LIST_READERS, |(id, admin)| {
            self.read_list(backend, id, *admin, &skip)
        });
        for ((id, _), r) in to_read.iter().zip(results) {
            if let Some(l) = r? {
                read.insert(*id, l);
            }
        }
        let mut fresh: HashMap<[u8; 32], Vec<Prefix>> = HashMap::new();
        for (name, id, admin) in listed {
            if let Some(f) = reuse(&id) {
                files.insert(id, f.clone());
                continue;
            }
            let info = read.remove(&id).map(|(info, prefixes)| {
                fresh.insert(id, prefixes);
                info
            });
            files.insert(
                id,
                FileInfo {
                    name,
                    admin,
                    list: info,
                },
            );
        }
        let unavailable = files
            .values()
            .find(|f| f.admin && f.list.is_none())
            .map(|f| {
                format!(
                    "{} has no dedup list (written by an older cairn, or by a prune that was \
                     interrupted): clients read the whole index until `cairn repair index` \
                     rewrites it",
                    f.name
                )
            });
        let superseded = superseded_by(&files);
        // Files that stopped being live since the last view (deleted or superseded),
        // or new ones already superseded: their ids must go (or never come), which
        // only a rebuild from the live lists can do.
        let lost = old_files
            .keys()
            .any(|id| !files.contains_key(id) || superseded.contains(id))
            || fresh.keys().any(|id| superseded.contains(id));
        let first = self.view().gen_at.is_none();
        // Gone without a superseding file: no admin name changed, so the epoch
        // must change otherwise.
        let deleted = old_files
            .keys()
            .any(|id| !files.contains_key(id) && !superseded.contains(id));
        let rebuilt = if lost || first || rebuild {
            let keep = |id: &[u8; 32], f: &FileInfo| f.list.is_some() && !superseded.contains(id);
            let known = self.view().ids.len();
            let mut all: Vec<Prefix> =
                Vec::with_capacity(fresh.values().map(Vec::len).sum::<usize>() + known);
            let mut again: Vec<([u8; 32], bool)> = Vec::new();
            for (id, f) in &files {
                if !keep(id, f) {
                    continue;
                }
                // Each list read now is moved over and freed at once: the build
                // holds the prefixes about once, not twice.
                match fresh.remove(id) {
                    Some(v) => all.extend(v),
                    None => again.push((*id, f.admin)),
                }
            }
            // Lists known from before are read again, a few at a time.
            for batch in again.chunks(LIST_READERS * 2) {
                let results =
                    cairn_core::threads::parallel_map(batch, LIST_READERS, |(id, admin)| {
                        self.read_list(backend, id, *admin, &skip)
                    });
                for r in results {
                    if let Some((_, v)) = r? {
                        all.extend(v);
                    }
                }
            }
            Some(IdSet::from_prefixes(all))
        } else {
            None
        };
        let mut view = self.view.write().unwrap_or_else(|e| e.into_inner());
        match rebuilt {
            Some(ids) => view.ids = ids,
            None => {
                for v in fresh.into_values() {
                    view.ids.extend_prefixes(v);
                }
            }
        }
        view.files = files;
        view.unavailable = unavailable;
        if let Some(j) = packs {
            view.skip = j.skip;
            view.missing = j.missing;
            view.missing_seq = j.seq;
        }
        if first || deleted {
            view.salt = cairn_format::envelope::random_bytes();
        }
        view.gen_at = Some(generation);
        view.built = Some(Instant::now());
        Ok(())
    }

    /// Lists the packs and holds them against those the live lists name: when
    /// what that finds differs from what the view was built with, the view is
    /// built again without the ids only missing packs hold (blocking). The packs
    /// held against the listing are those of the lists in the view before it
    /// began: a list is stored after its packs, so none of them is taken for
    /// missing for being new. A listing that fails is logged and checks nothing
    /// (the backup goes on as without the check).
    fn check_packs(&self, backend: &dyn Backend) -> Result<(), BackendError> {
        let any_damaged = !(self.damaged.lock())
            .unwrap_or_else(|e| e.into_inner())
            .is_empty();
        if !self.check_packs && !any_damaged {
            // Nothing judged missing to take back either.
            let v = self.view();
            if v.missing.is_empty() && v.skip.is_empty() {
                return Ok(());
            }
        }
        let named = self.named_packs();
        {
            let v = self.view();
            if named.is_empty() && v.skip.is_empty() && v.missing.is_empty() {
                return Ok(());
            }
        }
        let listed = if self.check_packs {
            self.list_packs(backend)
        } else {
            None
        };
        // Taken after the listing's number (review r34: a scrub's finding that
        // came in between went under a newer number with the older set).
        let damaged = self
            .damaged
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .clone();
        let (seq, stored) = match listed {
            Some(x) => x,
            // A listing that failed judges nothing new, but a scrub's finding.
            None if self.check_packs && damaged.is_empty() => return Ok(()),
            None => {
                // No listing (object storage, or one that failed): every pack a
                // list names counts as there and whole, but those found damaged
                // and, when a listing failed, those judged missing before.
                let seq = self.listings.next_seq();
                let before = if self.check_packs {
                    self.view().missing.clone()
                } else {
                    HashSet::new()
                };
                let all = (named.iter())
                    .filter(|(_, p, _)| !before.contains(p))
                    .map(|(_, p, _)| (*p, u64::MAX))
                    .collect();
                (seq, Arc::new(all))
            }
        };
        self.judge(backend, &named, &stored, seq, &damaged)
    }

    /// A scrub of the whole datastore found these objects damaged (and no
    /// others): the packs among them are judged missing by the next plan. None:
    /// none are.
    pub fn scrub_found<'a>(&self, damaged: impl IntoIterator<Item = &'a str>) {
        let packs = (damaged.into_iter())
            .filter(|n| n.starts_with(names::DATA))
            .filter_map(|n| id32(names::listed(n)))
            .collect();
        *self.damaged.lock().unwrap_or_else(|e| e.into_inner()) = packs;
    }

    /// The packs and their sizes from a listing that began after this call
    /// (shared with the plans waiting for it too), and its number; `None` when
    /// it failed. A failure is logged once until a listing works again.
    fn list_packs(&self, backend: &dyn Backend) -> Option<(u64, Listed)> {
        let l = &self.listings;
        let mut st = l.state.lock().unwrap_or_else(|e| e.into_inner());
        // Listings up to this number began before this call.
        let arrived = st.started;
        loop {
            if let Some((seq, packs)) = &st.last
                && *seq > arrived
            {
                return packs.clone().map(|p| (*seq, p));
            }
            if !st.running {
                break;
            }
            st = l.done.wait(st).unwrap_or_else(|e| e.into_inner());
        }
        st.started += 1;
        st.made += 1;
        st.running = true;
        let mut run = ListingRun {
            listings: l,
            seq: st.started,
            result: None,
        };
        drop(st);
        let listed = backend.list(names::DATA);
        let mut st = l.state.lock().unwrap_or_else(|e| e.into_inner());
        match listed {
            Ok(list) => {
                let packs: HashMap<[u8; 32], u64> = list
                    .into_iter()
                    .filter_map(|o| id32(names::listed(&o.name)).map(|id| (id, o.size)))
                    .collect();
                if std::mem::take(&mut st.failing) {
                    crate::log_line(&format!(
                        "datastore {}: the packs can be listed again; backups are planned \
                         with the check for missing packs",
                        self.name
                    ));
                }
                let packs = Arc::new(packs);
                run.result = Some(packs.clone());
                Some((run.seq, packs))
            }
            Err(e) => {
                if !std::mem::replace(&mut st.failing, true) {
                    crate::log_line(&format!(
                        "datastore {}: the packs could not be listed to find missing ones \
                         ({e}); backups are planned without that check until a listing works \
                         (said once)",
                        self.name
                    ));
                }
                None
            }
        }
        // `st` is released before `run` ends the listing (locals drop in reverse).
    }

    /// (file id, pack, end) for every pack a live list names.
    fn named_packs(&self) -> Vec<([u8; 32], [u8; 32], u64)> {
        let v = self.view();
        let superseded = superseded_by(&v.files);
        v.files
            .iter()
            .filter(|(id, _)| !superseded.contains(*id))
            .filter_map(|(id, f)| Some((id, f.list.as_ref()?)))
            .flat_map(|(id, l)| l.packs.iter().map(|(p, end)| (*id, *p, *end)))
            .collect()
    }

    /// Holds the packs `named` against the listing `stored` (number `seq`) and
    /// rebuilds the view when the judgement changed. A pack the listing lacks is
    /// missing; one shorter than a list says is not counted for that list, and
    /// is missing only when it is shorter than every list naming it says (a
    /// lying list cannot take a pack away from the others). A pack in `damaged`
    /// (a scrub's finding) counts as one the listing lacks.
    fn judge(
        &self,
        backend: &dyn Backend,
        named: &[([u8; 32], [u8; 32], u64)],
        stored: &HashMap<[u8; 32], u64>,
        seq: u64,
        damaged: &HashSet<[u8; 32]>,
    ) -> Result<(), BackendError> {
        let mut skip: HashMap<[u8; 32], Vec<[u8; 32]>> = HashMap::new();
        // Pack -> the first file naming it (for the log).
        let mut absent: HashMap<[u8; 32], [u8; 32]> = HashMap::new();
        let mut short: HashMap<[u8; 32], [u8; 32]> = HashMap::new();
        let mut whole: HashSet<[u8; 32]> = HashSet::new();
        for (file, pack, end) in named {
            // A pack a scrub found damaged counts as absent.
            match stored.get(pack).filter(|_| !damaged.contains(pack)) {
                None => {
                    absent.entry(*pack).or_insert(*file);
                }
                Some(size) if size < end => {
                    short.entry(*pack).or_insert(*file);
                }
                Some(_) => {
                    whole.insert(*pack);
                    continue;
                }
            }
            skip.entry(*file).or_default().push(*pack);
        }
        for v in skip.values_mut() {
            v.sort_unstable();
            v.dedup();
        }
        let missing: HashSet<[u8; 32]> = (absent.keys())
            .chain(short.keys().filter(|p| !whole.contains(*p)))
            .copied()
            .collect();
        let same = |v: &View| v.skip == skip && v.missing == missing;
        if same(&self.view()) {
            return Ok(());
        }
        let _one = self.refreshing.lock().unwrap_or_else(|e| e.into_inner());
        {
            let v = self.view();
            // Another plan judged meanwhile: from a newer listing, it stands.
            if v.missing_seq > seq || same(&v) {
                return Ok(());
            }
        }
        let mut said = Vec::new();
        {
            let v = self.view();
            let name = |file: &[u8; 32]| v.files.get(file).map_or("?", |f| f.name.as_str());
            let mut logged = self
                .missing_logged
                .lock()
                .unwrap_or_else(|e| e.into_inner());
            let mut sorted: Vec<_> = missing.iter().collect();
            sorted.sort_unstable();
            for pack in sorted {
                if logged.insert(*pack) {
                    let (what, by) = match absent.get(pack) {
                        Some(file) if damaged.contains(pack) => (
                            "damaged (a scrub found its content does not match its name)",
                            name(file),
                        ),
                        Some(file) => ("missing (damage, or deleted by hand)", name(file)),
                        None => (
                            "cut short (damage, or a copy that stopped short)",
                            name(&short[pack]),
                        ),
                    };
                    said.push(format!(
                        "pack {} that {by} names is {what}: the \
                         chunks only it held count as not stored, so backups store them again; \
                         snapshots that need it stay damaged: run `cairn check`, then `cairn \
                         repair index` and `cairn repair snapshots`",
                        names::pack(&hex::encode(pack)),
                    ));
                }
            }
            // Lists that say a whole pack is longer than it is: damaged, or lying.
            for (pack, file) in &short {
                if whole.contains(pack) && logged.insert(*file) {
                    let by = name(file);
                    said.push(format!(
                        "the dedup list of {by} says pack {} is longer than it is (damaged, or \
                         stored by a hijacked client): its chunks there are not counted; \
                         `cairn check` (admin) compares lists with their files",
                        names::pack(&hex::encode(pack)),
                    ));
                }
            }
        }
        let more = said.len().saturating_sub(MAX_LOGGED_MISSING);
        for line in said.iter().take(MAX_LOGGED_MISSING) {
            crate::log_line(&format!("datastore {}: {line}", self.name));
        }
        if more > 0 {
            crate::log_line(&format!(
                "datastore {}: and {more} more missing packs or lists naming packs longer than \
                 they are",
                self.name
            ));
        }
        let judged = Judged { skip, missing, seq };
        self.refresh_locked(backend, Some(judged))
    }

    /// The plan for a backup client (blocking).
    pub fn plan(&self, backend: &dyn Backend) -> Result<Plan, BackendError> {
        self.fresh(backend)?;
        self.check_packs(backend)?;
        let v = self.view();
        if let Some(r) = &v.unavailable {
            return Ok(Plan {
                available: false,
                reason: Some(r.clone()),
                index_files: Vec::new(),
                chunks: 0,
                missing_packs: Vec::new(),
                epoch: String::new(),
            });
        }
        let mut admin: Vec<&String> = v
            .files
            .values()
            .filter(|f| f.admin)
            .map(|f| &f.name)
            .collect();
        admin.sort();
        let mut h = blake3::Hasher::new();
        h.update(&v.salt);
        for n in admin {
            h.update(n.as_bytes());
            h.update(b"\n");
        }
        // A pack found missing takes chunks away: "stored" answers given before
        // hold no longer.
        let mut missing_packs: Vec<String> = v.missing.iter().map(hex::encode).collect();
        missing_packs.sort();
        for p in &missing_packs {
            h.update(b"missing ");
            h.update(p.as_bytes());
        }
        missing_packs.truncate(MAX_NAMED_MISSING);
        let epoch = h.finalize().to_hex()[..32].to_string();
        let superseded = superseded_by(&v.files);
        let mut index_files: Vec<String> = v
            .files
            .iter()
            .filter(|(id, f)| {
                !superseded.contains(*id) && f.list.as_ref().is_none_or(|l| l.metadata)
            })
            .map(|(_, f)| f.name.clone())
            .collect();
        index_files.sort();
        Ok(Plan {
            available: true,
            reason: None,
            index_files,
            chunks: v.ids.len() as u64,
            missing_packs,
            epoch,
        })
    }

    /// Drops the claims of dead sessions and expired ones: at most once a second
    /// when the table is full (until then new ids are answered unclaimed; live
    /// sessions that hold it full, which one can, would otherwise have every
    /// request walk millions of claims), and every [`CLAIM_TTL`] otherwise, so
    /// that claims nobody asks after again do not stay for the server's life.
    fn sweep(&self, claims: &mut HashMap<[u8; 32], Claim>, seen: &HashMap<String, Instant>) {
        if claims.is_empty() {
            return;
        }
        let every = if claims.len() >= MAX_CLAIMS {
            Duration::from_secs(1)
        } else {
            CLAIM_TTL
        };
        let mut swept = self.swept.lock().unwrap_or_else(|e| e.into_inner());
        match *swept {
            Some(t) if t.elapsed() < every => {}
            Some(_) => {
                claims.retain(|_, c| Self::live(seen, c));
                if claims.capacity() > 4 * claims.len().max(4096) {
                    claims.shrink_to_fit();
                }
                *swept = Some(Instant::now());
            }
            // The first claims: their clock starts now.
            None => *swept = Some(Instant::now()),
        }
    }

    /// Answers a query (blocking).
    pub fn query(
        &self,
        backend: &dyn Backend,
        session: &str,
        ids: &[[u8; 32]],
    ) -> Result<Result<Vec<DedupAnswer>, String>, BackendError> {
        self.touch(session);
        self.fresh(backend)?;
        let v = self.view();
        if let Some(r) = &v.unavailable {
            return Ok(Err(r.clone()));
        }
        let mut claims = self.claims.lock().unwrap_or_else(|e| e.into_inner());
        let seen = self.seen.lock().unwrap_or_else(|e| e.into_inner());
        self.sweep(&mut claims, &seen);
        let now = Instant::now();
        let mine: Arc<str> = Arc::from(session);
        let out: Vec<DedupAnswer> = ids
            .iter()
            .map(|id| {
                if v.ids.contains(id) {
                    claims.remove(id);
                    return DedupAnswer::Stored;
                }
                match claims.get_mut(id) {
                    Some(c) if *c.session != *session && Self::live(&seen, c) => {
                        DedupAnswer::InFlight
                    }
                    Some(c) => {
                        c.session = mine.clone();
                        c.at = now;
                        DedupAnswer::Send
                    }
                    None => {
                        if claims.len() < MAX_CLAIMS {
                            claims.insert(
                                *id,
                                Claim {
                                    session: mine.clone(),
                                    at: now,
                                },
                            );
                        }
                        DedupAnswer::Send
                    }
                }
            })
            .collect();
        let s = &self.stats;
        s.queries.fetch_add(1, Ordering::Relaxed);
        for a in &out {
            match a {
                DedupAnswer::Stored => &s.stored,
                DedupAnswer::Send => &s.send,
                DedupAnswer::InFlight => &s.in_flight,
            }
            .fetch_add(1, Ordering::Relaxed);
        }
        Ok(Ok(out))
    }

    /// One round of a confirmation: the ids that are stored now, those another
    /// session still holds (wait), and those nobody will send (claimed for
    /// `session` and returned).
    pub fn confirm_round(
        &self,
        backend: &dyn Backend,
        session: &str,
        ids: &[[u8; 32]],
        last: bool,
    ) -> Result<Confirm, BackendError> {
        self.touch(session);
        // Lists written through other servers appear only in a listing: one a
        // second at most, however many clients confirm (each listing is two
        // requests to the storage, and a client could ask without pause).
        let recent = self
            .view()
            .built
            .is_some_and(|t| t.elapsed() < CONFIRM_LISTING_EVERY);
        if !recent {
            self.refresh(backend)?;
        }
        let v = self.view();
        let mut claims = self.claims.lock().unwrap_or_else(|e| e.into_inner());
        let seen = self.seen.lock().unwrap_or_else(|e| e.into_inner());
        self.sweep(&mut claims, &seen);
        let mut c = Confirm::default();
        let now = Instant::now();
        let mine: Arc<str> = Arc::from(session);
        for id in ids {
            if v.ids.contains(id) {
                continue;
            }
            match claims.get_mut(id) {
                Some(cl) if *cl.session != *session && Self::live(&seen, cl) && !last => {
                    c.waiting += 1;
                }
                Some(cl) => {
                    // Its own claim, or a dead one taken over: renewed.
                    c.missing.push(*id);
                    cl.session = mine.clone();
                    cl.at = now;
                }
                None => {
                    c.missing.push(*id);
                    if claims.len() < MAX_CLAIMS {
                        claims.insert(
                            *id,
                            Claim {
                                session: mine.clone(),
                                at: now,
                            },
                        );
                    }
                }
            }
        }
        if c.waiting == 0 {
            self.stats
                .confirmed_missing
                .fetch_add(c.missing.len() as u64, Ordering::Relaxed);
        }
        Ok(c)
    }

    /// Notes that the token `token` stored the plain index file `name`.
    pub fn index_stored(&self, name: &str, token: &str) {
        let mut w = self.writers.lock().unwrap_or_else(|e| e.into_inner());
        if w.by_name
            .insert(name.to_string(), token.to_string())
            .is_none()
        {
            w.order.push_back(name.to_string());
        }
        while w.order.len() > WRITERS_KEPT {
            if let Some(old) = w.order.pop_front() {
                w.by_name.remove(&old);
            }
        }
    }

    /// The token that stored the plain index file `name` through this server,
    /// when it is remembered. Only that token may store the file's dedup list:
    /// another client that holds the key could otherwise store a lying list for a
    /// victim's new index file first (the victim takes the conflict for success).
    /// A file stored before a restart, or through another server, is not
    /// remembered: its list is then taken from an admin token only.
    pub fn writer_of(&self, name: &str) -> Option<String> {
        let w = self.writers.lock().unwrap_or_else(|e| e.into_inner());
        w.by_name.get(name).cloned()
    }

    /// A dedup list was stored through this server for an index file that exists:
    /// its ids count as stored at once (no listing needed).
    pub fn list_stored(&self, index_name: &str, list: &DedupList) {
        let mut v = self.view.write().unwrap_or_else(|e| e.into_inner());
        if v.gen_at.is_none() || list.admin || !list.supersedes.is_empty() {
            return; // the next refresh reads it
        }
        v.files.insert(
            list.index.0,
            FileInfo {
                name: index_name.to_string(),
                admin: false,
                list: Some(ListInfo::of(list)),
            },
        );
        let skip: Vec<[u8; 32]> = (list.packs.iter().flatten())
            .map(|p| p.id.0)
            .filter(|p| v.missing.contains(p))
            .collect();
        let held = held_prefixes(list, &skip);
        v.ids.extend_prefixes(held);
        if !skip.is_empty() {
            v.skip.insert(list.index.0, skip);
        }
        drop(v);
        let mut claims = self.claims.lock().unwrap_or_else(|e| e.into_inner());
        for id in &list.ids {
            claims.remove(&id.0);
        }
    }
}

/// A judgement of the packs ([`Dedup::judge`]).
struct Judged {
    skip: HashMap<[u8; 32], Vec<[u8; 32]>>,
    missing: HashSet<[u8; 32]>,
    seq: u64,
}

#[derive(Default)]
pub struct Confirm {
    pub waiting: usize,
    pub missing: Vec<[u8; 32]>,
}

#[cfg(test)]
mod tests {
    use super::*;
    use cairn_backend::MemBackend;
    use cairn_format::dedup::DedupPack;
    use cairn_format::{BlobId, IndexId, PackId};

    fn put_index(b: &MemBackend, id: u8, admin: bool, ids: &[u8], sup: &[u8], meta: bool) {
        let hex = hex::encode([id; 32]);
        let name = if admin {
            names::admin_index(&hex)
        } else {
            names::index(&hex)
        };
        b.put_new(&name, b"sealed").unwrap();
        let l = DedupList {
            index: IndexId([id; 32]),
            metadata: meta,
            admin,
            supersedes: sup.iter().map(|s| IndexId([*s; 32])).collect(),
            ids: ids.iter().map(|i| BlobId([*i; 32])).collect(),
            packs: None,
        };
        b.put_new(&names::dedup(&hex), &l.encode()).unwrap();
    }

    /// A plain index file whose list (format 2) names packs: (pack, its end, ids).
    fn put_index_packs(b: &MemBackend, id: u8, packs: &[(u8, u64, &[u8])]) {
        let hex = hex::encode([id; 32]);
        b.put_new(&names::index(&hex), b"sealed").unwrap();
        let packs: Vec<DedupPack> = packs
            .iter()
            .map(|(p, end, ids)| DedupPack {
                id: PackId([*p; 32]),
                end: *end,
                ids: ids.iter().map(|i| BlobId([*i; 32])).collect(),
            })
            .collect();
        let mut ids: Vec<BlobId> = packs.iter().flat_map(|p| p.ids.clone()).collect();
        ids.sort();
        ids.dedup();
        let l = DedupList {
            index: IndexId([id; 32]),
            metadata: false,
            admin: false,
            supersedes: Vec::new(),
            ids,
            packs: Some(packs),
        };
        b.put_new(&names::dedup(&hex), &l.encode()).unwrap();
    }

    fn put_pack(b: &MemBackend, p: u8, size: usize) {
        let name = names::pack(&hex::encode([p; 32]));
        let _ = b.delete(&name);
        b.put_new(&name, &vec![0; size]).unwrap();
    }

    /// A pack deleted or cut short behind the server's back: what only it held
    /// is "send" again, the plan names it and the epoch changes; what another
    /// pack holds too stays stored; a pack put back restores the view.
    #[test]
    fn packs_missing_or_cut_short_take_their_chunks_away() {
        let b = MemBackend::new();
        put_pack(&b, 100, 50);
        put_pack(&b, 101, 50);
        put_index_packs(&b, 1, &[(100, 50, &[10, 11]), (101, 40, &[12])]);
        put_index_packs(&b, 2, &[(101, 50, &[11, 13])]);
        let d = Dedup {
            check_packs: true,
            ..Dedup::default()
        };
        let p = d.plan(&b).unwrap();
        assert_eq!((p.chunks, p.missing_packs.len()), (4, 0));
        let e1 = p.epoch;
        let stored = |d: &Dedup| {
            let ans = d
                .query(&b, "s", &(10..14).map(|i| [i; 32]).collect::<Vec<_>>())
                .unwrap()
                .unwrap();
            (10..14u8)
                .zip(ans)
                .filter(|(_, a)| *a == DedupAnswer::Stored)
                .map(|(i, _)| i)
                .collect::<Vec<u8>>()
        };
        assert_eq!(stored(&d), vec![10, 11, 12, 13]);
        // Pack 100 deleted: 10 goes, 11 stays (pack 101 holds it too).
        b.delete(&names::pack(&hex::encode([100u8; 32]))).unwrap();
        let p = d.plan(&b).unwrap();
        assert_eq!(p.missing_packs, vec![hex::encode([100u8; 32])]);
        assert_ne!(p.epoch, e1);
        assert_eq!(stored(&d), vec![11, 12, 13]);
        // Pack 101 at 45 bytes: file 2 says it reaches 50, file 1 only 40. File
        // 2's ids there no longer count (11 and 13: 11's other pack is gone), file
        // 1's do (12); one list cannot make the pack missing for all.
        put_pack(&b, 101, 45);
        let p = d.plan(&b).unwrap();
        assert_eq!(p.missing_packs, vec![hex::encode([100u8; 32])]);
        assert_eq!(stored(&d), vec![12]);
        // Shorter than every list says: missing.
        put_pack(&b, 101, 30);
        let p = d.plan(&b).unwrap();
        assert_eq!(p.missing_packs.len(), 2);
        assert_eq!(stored(&d), Vec::<u8>::new());
        // A new list that names a missing pack adds only what other packs hold.
        put_pack(&b, 102, 10);
        put_index_packs(&b, 3, &[(100, 50, &[10]), (102, 10, &[12])]);
        d.lock_written();
        d.plan(&b).unwrap();
        assert_eq!(stored(&d), vec![12]);
        // So does one stored through this server (taken without a listing).
        put_index_packs(&b, 4, &[(100, 50, &[10]), (102, 10, &[13])]);
        let l = DedupList::decode(&b.get(&names::dedup(&hex::encode([4u8; 32]))).unwrap()).unwrap();
        d.list_stored(&names::index(&hex::encode([4u8; 32])), &l);
        assert_eq!(stored(&d), vec![12, 13]);
        // Both packs put back whole: everything is stored again.
        put_pack(&b, 100, 50);
        put_pack(&b, 101, 50);
        let p = d.plan(&b).unwrap();
        assert!(p.missing_packs.is_empty());
        assert_eq!(stored(&d), vec![10, 11, 12, 13]);
        // A judgement from an older listing than the view's changes nothing.
        let stale: HashMap<[u8; 32], u64> = HashMap::new();
        let seq = d.view().missing_seq;
        d.judge(&b, &d.named_packs(), &stale, seq - 1, &HashSet::new())
            .unwrap();
        assert_eq!(stored(&d), vec![10, 11, 12, 13]);
        // A rebuild that fails (the server stopping) leaves the view as it was,
        // judgement included: the next plan judges again.
        d.stop();
        assert!(
            d.judge(&b, &d.named_packs(), &stale, seq + 1, &HashSet::new())
                .is_err()
        );
        assert!(d.view().missing.is_empty());
        assert_eq!(d.view().missing_seq, seq);
        // Without the check (object storage), nothing is listed or taken away.
        b.delete(&names::pack(&hex::encode([100u8; 32]))).unwrap();
        let unchecked = Dedup::default();
        let p = unchecked.plan(&b).unwrap();
        assert!(p.missing_packs.is_empty());
        assert_eq!(stored(&unchecked), vec![10, 11, 12, 13]);
    }

    /// A pack the scrub job found damaged counts as missing, on object storage
    /// too (no listing there), until a scrub finds it whole (QA r33: backups
    /// through the server were told its chunks were stored).
    #[test]
    fn packs_a_scrub_found_damaged_take_their_chunks_away() {
        let b = MemBackend::new();
        put_pack(&b, 100, 50);
        put_pack(&b, 101, 50);
        put_index_packs(&b, 1, &[(100, 50, &[10, 11]), (101, 50, &[12])]);
        for local in [false, true] {
            let d = Dedup {
                check_packs: local,
                ..Dedup::default()
            };
            let stored = |d: &Dedup| {
                let ans = d
                    .query(&b, "s", &(10..13).map(|i| [i; 32]).collect::<Vec<_>>())
                    .unwrap()
                    .unwrap();
                ans.iter().filter(|a| **a == DedupAnswer::Stored).count()
            };
            let e1 = d.plan(&b).unwrap().epoch;
            assert_eq!(stored(&d), 3);
            let pack = names::pack(&hex::encode([100u8; 32]));
            d.scrub_found([pack.as_str(), "index/0011"]);
            let p = d.plan(&b).unwrap();
            assert_eq!(p.missing_packs, vec![hex::encode([100u8; 32])], "{local}");
            assert_ne!(p.epoch, e1);
            assert_eq!(stored(&d), 1);
            d.scrub_found([]);
            let p = d.plan(&b).unwrap();
            assert!(p.missing_packs.is_empty());
            assert_eq!(stored(&d), 3);
        }
    }

    /// Plans that arrive together share a listing of the packs (a slow one
    /// here), each using one that began after it arrived; a listing that fails
    /// plans without the check, and so does every plan until one works.
    #[test]
    fn plans_arriving_together_share_a_listing_of_the_packs() {
        use cairn_backend::{FaultSpec, FaultyBackend};
        let mem = Arc::new(MemBackend::new());
        put_pack(&mem, 100, 50);
        put_index_packs(&mem, 1, &[(100, 50, &[10])]);
        let slow = FaultyBackend::new(
            mem.clone(),
            FaultSpec::parse("delay=1,delay-ms=300,ops=list,names=data").unwrap(),
        );
        let d = Dedup {
            check_packs: true,
            ..Dedup::default()
        };
        d.plan(&slow).unwrap();
        let made = |d: &Dedup| d.listings.state.lock().unwrap().made;
        assert_eq!(made(&d), 1);
        let together = std::sync::Barrier::new(6);
        std::thread::scope(|s| {
            for _ in 0..6 {
                s.spawn(|| {
                    together.wait();
                    d.plan(&slow).unwrap()
                });
            }
        });
        // The first of the six lists; those arriving while it runs share the next
        // (a thread the machine runs late may start one more).
        let made6 = made(&d) - 1;
        assert!((1..=3).contains(&made6), "{made6} listings for 6 plans");
        // A pack deleted before a plan is seen by it, however recent the last
        // listing was.
        mem.delete(&names::pack(&hex::encode([100u8; 32]))).unwrap();
        assert_eq!(d.plan(&slow).unwrap().missing_packs.len(), 1);
        // Listings that fail: planned without the check, the view as it was.
        let failing = FaultyBackend::new(
            mem.clone(),
            FaultSpec::parse("fail=1,kind=permanent,ops=list,names=data").unwrap(),
        );
        put_pack(&mem, 100, 50);
        for _ in 0..3 {
            assert_eq!(d.plan(&failing).unwrap().missing_packs.len(), 1);
        }
        assert!(d.listings.state.lock().unwrap().failing);
        assert!(d.plan(&*mem).unwrap().missing_packs.is_empty());
        assert!(!d.listings.state.lock().unwrap().failing);
    }

    /// Confirmation rounds claim what they report missing as queries do, within
    /// the same cap (audit r33: a backup token's confirmations of random ids grew
    /// the table without end); past it, ids are still answered.
    #[test]
    fn claims_stay_bounded_however_clients_ask() {
        let b = MemBackend::new();
        let d = Dedup::default();
        d.plan(&b).unwrap();
        let id = |i: u32| {
            let mut x = [0u8; 32];
            x[..4].copy_from_slice(&i.to_le_bytes());
            x
        };
        let ids: Vec<[u8; 32]> = (0..MAX_CLAIMS as u32 + 5000).map(id).collect();
        for part in ids.chunks(4096) {
            let c = d.confirm_round(&b, "s", part, false).unwrap();
            assert_eq!((c.missing.len(), c.waiting), (part.len(), 0));
        }
        assert_eq!(d.claims.lock().unwrap().len(), MAX_CLAIMS);
        let more: Vec<[u8; 32]> = (1 << 30..(1 << 30) + 100).map(id).collect();
        let a = d.query(&b, "t", &more).unwrap().unwrap();
        assert!(a.iter().all(|a| *a == DedupAnswer::Send));
        assert_eq!(d.claims.lock().unwrap().len(), MAX_CLAIMS);
        // Another session waits for claimed ids; in the last round it takes them.
        let c = d.confirm_round(&b, "t", &ids[..10], false).unwrap();
        assert_eq!((c.missing.len(), c.waiting), (0, 10));
        let c = d.confirm_round(&b, "t", &ids[..10], true).unwrap();
        assert_eq!((c.missing.len(), c.waiting), (10, 0));
        let a = d.query(&b, "s", &ids[..10]).unwrap().unwrap();
        assert!(a.iter().all(|a| *a == DedupAnswer::InFlight));
    }

    #[test]
    fn answers_follow_live_lists_and_claims() {
        let b = MemBackend::new();
        put_index(&b, 1, false, &[10, 11], &[], false);
        put_index(&b, 2, false, &[12], &[], true);
        let d = Dedup::default();
        let plan = d.plan(&b).unwrap();
        assert!(plan.available);
        assert_eq!(plan.chunks, 3);
        assert_eq!(
            plan.index_files,
            vec![names::index(&hex::encode([2u8; 32]))]
        );
        let q = |s: &str, i: u8| d.query(&b, s, &[[i; 32]]).unwrap().unwrap()[0];
        assert_eq!(q("a", 10), DedupAnswer::Stored);
        assert_eq!(q("a", 20), DedupAnswer::Send);
        assert_eq!(q("b", 20), DedupAnswer::InFlight, "a is sending it");
        assert_eq!(q("a", 20), DedupAnswer::Send, "a's own claim");
        // A session that ended (its slot released, a backup that failed) holds
        // nothing: another sends at once.
        assert_eq!(q("a", 21), DedupAnswer::Send);
        d.end_session("a");
        assert_eq!(q("b", 21), DedupAnswer::Send, "a ended");
        assert_eq!(q("a", 21), DedupAnswer::InFlight, "b claimed it since");
        // A prune supersedes file 1 (keeping only 11): after a lock is written, the
        // view drops 10.
        put_index(&b, 3, true, &[11], &[1], false);
        d.lock_written();
        assert_eq!(q("a", 10), DedupAnswer::Send);
        assert_eq!(q("a", 11), DedupAnswer::Stored);
        // File 2's list, known from before, was read again for the rebuild.
        assert_eq!(q("a", 12), DedupAnswer::Stored);
        assert_eq!(d.view_size().0, 2);
        let c = d
            .confirm_round(&b, "b", &[[20; 32], [11; 32]], false)
            .unwrap();
        assert_eq!((c.waiting, c.missing.len()), (1, 0));
        let c = d.confirm_round(&b, "b", &[[20; 32]], true).unwrap();
        assert_eq!(c.missing, vec![[20; 32]]);
        // An admin file without a list: unavailable.
        b.put_new(&names::admin_index(&hex::encode([4u8; 32])), b"x")
            .unwrap();
        d.lock_written();
        assert!(!d.plan(&b).unwrap().available);
        assert!(d.query(&b, "a", &[[1; 32]]).unwrap().is_err());
    }

    /// Clients keep "stored" answers while the epoch stays: it changes when an
    /// index file goes, superseded or not, and with every start of the server.
    #[test]
    fn the_epoch_changes_when_index_files_go_and_when_the_server_starts() {
        let b = MemBackend::new();
        put_index(&b, 1, false, &[10, 11], &[], false);
        put_index(&b, 2, false, &[12], &[], false);
        let d = Dedup::default();
        let e1 = d.plan(&b).unwrap().epoch;
        put_index(&b, 3, false, &[13], &[], false);
        d.lock_written();
        assert_eq!(d.plan(&b).unwrap().epoch, e1, "a new file only adds");
        let restarted = Dedup::default();
        assert_ne!(restarted.plan(&b).unwrap().epoch, e1, "a new start");
        // Deleted directly (no admin file supersedes it): 12 is no longer stored.
        b.delete(&names::index(&hex::encode([2u8; 32]))).unwrap();
        d.lock_written();
        let p = d.plan(&b).unwrap();
        assert_ne!(p.epoch, e1);
        assert_eq!(p.chunks, 3);
        let e2 = p.epoch;
        put_index(&b, 4, true, &[10], &[1], false);
        d.lock_written();
        assert_ne!(d.plan(&b).unwrap().epoch, e2, "superseded");
    }

    /// A prune deletes packs only once no live file names them: the packs of a
    /// superseded file are not judged, and nothing is logged or taken away.
    #[test]
    fn packs_of_superseded_files_are_not_missing() {
        let b = MemBackend::new();
        put_pack(&b, 100, 50);
        put_pack(&b, 101, 50);
        put_index_packs(&b, 1, &[(100, 50, &[10, 11])]);
        put_index_packs(&b, 2, &[(101, 50, &[12])]);
        let d = Dedup {
            check_packs: true,
            ..Dedup::default()
        };
        assert_eq!(d.plan(&b).unwrap().chunks, 3);
        // The prune keeps 11 (repacked into 101's neighbour 102), drops 10.
        put_pack(&b, 102, 20);
        put_index(&b, 3, true, &[11], &[1], false);
        b.delete(&names::pack(&hex::encode([100u8; 32]))).unwrap();
        d.lock_written();
        let p = d.plan(&b).unwrap();
        assert!(p.missing_packs.is_empty(), "{:?}", p.missing_packs);
        assert_eq!(p.chunks, 2);
        assert!(d.view().skip.is_empty());
    }

    #[test]
    fn a_stopping_server_builds_no_view() {
        let b = MemBackend::new();
        put_index(&b, 1, false, &[10, 11], &[], false);
        let d = Dedup::default();
        d.stop();
        let e = d.plan(&b).err().expect("no plan while stopping");
        assert!(e.to_string().contains("stopping"), "{e}");
        assert_eq!(d.view_size().0, 0);
        assert!(d.view().gen_at.is_none(), "not marked built");
    }

    #[test]
    fn a_rebuild_reads_many_lists_again_in_batches() {
        let b = MemBackend::new();
        // 20 files (more than a batch of readers), ids 20 + 5f .. 20 + 5f + 4.
        for f in 0..20u8 {
            let ids: Vec<u8> = (0..5).map(|i| 20 + f * 5 + i).collect();
            put_index(&b, 1 + f, false, &ids, &[], false);
        }
        let d = Dedup::default();
        assert_eq!(d.plan(&b).unwrap().chunks, 100);
        // A prune supersedes file 1 (ids 20..25), keeping 20 and 21.
        put_index(&b, 200, true, &[20, 21], &[1], false);
        d.lock_written();
        assert_eq!(d.plan(&b).unwrap().chunks, 97);
        let answers = d
            .query(&b, "s", &(18..122).map(|i| [i; 32]).collect::<Vec<_>>())
            .unwrap()
            .unwrap();
        for (i, a) in (18..122u8).zip(answers) {
            let stored = (20..22).contains(&i) || (25..120).contains(&i);
            assert_eq!(a == DedupAnswer::Stored, stored, "id {i}");
        }
    }
}
