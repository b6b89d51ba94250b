//! Locks written through the server: who owns one, and how long it may live.
//!
//! Ownership needs no state: a non-admin token may create only locks whose id
//! starts with [`cairn_backend::lock_owner_prefix`] of its token id (the client
//! names them so), and refresh or remove only those. Any server in front of the
//! datastore checks the same, so two servers on one S3 bucket agree.
//!
//! The lifetime cap is best effort: the server remembers when it first saw each
//! lock (`locks-<datastore>.json` in the state directory) and refuses to refresh a
//! non-admin lock older than `max_lock_age_hours`, so that a hijacked client cannot
//! keep one lock alive forever and with it keep prune from deleting. A removed
//! lock's name is remembered as long as that cap, so that deleting it and storing it
//! again does not start its life anew (prune waits for locks by id), the newest
//! [`REMEMBERED_PER_OWNER`] removed names of each token at most. A lock first
//! seen by another server, or before a lost state file, counts from when this server
//! first saw it. Losing the file costs no data.

use serde::{Deserialize, Serialize};
use std::collections::{BTreeMap, BTreeSet, HashMap, HashSet};
use std::path::PathBuf;
use std::sync::Mutex;

/// Lock names remembered per owner (the token a name's id prefix belongs to), and
/// in all: a token that creates and removes locks without end (each a new name)
/// grew the file by every name for the whole cap, and each new name wrote it
/// whole (audit r33: 1,000 cycles took 21 s, 5,000 took 157 s). Past these, the
/// names of locks removed through this server are forgotten, the longest removed
/// first: such a name only starts its life anew if stored again, as any new name
/// does. A lock still stored is never forgotten (review r34: forgetting one let
/// its token refresh it past the age cap, and hold prune off for ever); its
/// token holds at most [`MAX_LOCKS_PER_TOKEN`] of them.
const REMEMBERED_PER_OWNER: usize = 2 * MAX_LOCKS_PER_TOKEN;
const REMEMBERED: usize = 65_536;

/// Makes room in `seen` for the new name `name`.
fn make_room(seen: &mut BTreeMap<String, Seen>, name: &str) {
    // `locks/` and the owner's 16 hex digits.
    let owner = name.get(..6 + 16).unwrap_or(name);
    let mine: Vec<_> = (seen.range(owner.to_string()..))
        .take_while(|(k, _)| k.starts_with(owner))
        .collect();
    let over = (mine.len() + 1).saturating_sub(REMEMBERED_PER_OWNER);
    for k in oldest_removed(mine, over) {
        seen.remove(&k);
    }
    let over = (seen.len() + 1).saturating_sub(REMEMBERED);
    if over > 0 {
        for k in oldest_removed(seen.iter().collect(), over) {
            seen.remove(&k);
        }
    }
}

/// The `n` names of `of` removed longest ago (fewer when fewer were removed).
fn oldest_removed(of: Vec<(&String, &Seen)>, n: usize) -> Vec<String> {
    let mut removed: Vec<(i64, &String)> = (of.into_iter())
        .filter_map(|(k, x)| Some((x.removed_at?, k)))
        .collect();
    removed.sort_unstable();
    removed
        .into_iter()
        .take(n)
        .map(|(_, k)| k.clone())
        .collect()
}

#[derive(Clone, Debug, Serialize, Deserialize)]
struct Seen {
    /// Unix seconds when this server first stored or refreshed it.
    first_seen: i64,
    /// Unix seconds when this server last stored or refreshed it (absent in
    /// files of earlier versions: then `first_seen`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    last_written: Option<i64>,
    /// BLAKE3 of its content when last seen (hex): a lock refreshed through
    /// another server in front of the same datastore changes it, though this
    /// server saw no write.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    content: Option<String>,
    /// The client session (`<token id>-<session>`) that stored or last refreshed
    /// it through this server and has not removed it: kept so that a restarted
    /// server still knows whose it is ([`LockOwners::take_orphans`]).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    session: Option<String>,
    /// Unix seconds when it was removed through this server (not written since).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    removed_at: Option<i64>,
}

impl Seen {
    /// First seen, and written, at `now`; its content not known yet.
    fn written_at(now: i64) -> Seen {
        Seen {
            first_seen: now,
            last_written: Some(now),
            content: None,
            session: None,
            removed_at: None,
        }
    }
}

/// How many locks one non-admin token may hold at once. A client holds one per
/// command it runs against the datastore (a few at a time, however many jobs);
/// each lock is read by every operation that waits for others, so a hijacked
/// client must not store them without end.
pub const MAX_LOCKS_PER_TOKEN: usize = 64;

/// A lock of a token at [`MAX_LOCKS_PER_TOKEN`] whose content has not changed
/// for this long is removed to make room: its holder rewrites it every 5
/// minutes and gives up after 20 without a refresh, and readers take it for
/// stale after 30 (`cairn_core::repo::lock`), so it belongs to a process that
/// ended without removing it (killed, or its machine lost).
pub const GONE_AFTER_SECS: i64 = 35 * 60;

pub struct LockOwners {
    /// Held while a non-admin token's new lock is counted and stored, so that
    /// requests in parallel cannot each find room for one more.
    pub creating: Mutex<()>,
    path: PathBuf,
    /// How long a name is remembered: the cap on a lock's life, in seconds.
    keep: i64,
    seen: Mutex<BTreeMap<String, Seen>>,
    /// When the file was last saved for a refresh alone (unix seconds).
    saved_at: Mutex<i64>,
    /// The locks each client session (`X-Cairn-Session`, with its token) stored
    /// through this server in this run and has not removed: deleted when the
    /// session goes silent ([`crate::slots::Lost`]). Rebuilt at start from the
    /// sessions the state file names.
    sessions: Mutex<HashMap<String, BTreeSet<String>>>,
    /// The sessions that held locks when the server last stopped: those not
    /// heard from, and whose locks are not refreshed, within a while after the
    /// start are taken for gone (killed while the server was down, or before it
    /// noticed), and their locks deleted like a silent session's (QA: a killed
    /// client's lock outlived a server restart by 25 minutes, every other job
    /// waiting). Their locks are in `sessions`, rebuilt from the same file.
    orphans: Mutex<HashSet<String>>,
    /// The content of the orphans' locks as read from storage when the wait
    /// began: a lock holding other content when it ends was refreshed, through
    /// this server or another in front of the datastore (or one sharing its
    /// state directory), by a client that is alive.
    orphan_content: Mutex<HashMap<String, String>>,
}

/// What a lock held when last seen, kept in the state file to tell a refresh
/// through another server (the content changed) from a lock left behind.
fn content_hash(content: &[u8]) -> String {
    blake3::hash(content).to_hex().to_string()
}

/// Most sessions whose locks are remembered: each client holds a few for the
/// length of a command and removes them as it ends, so this is far above what a
/// server sees at once; past it, a lock is not remembered (it goes stale).
const SESSIONS_KEPT: usize = 65_536;

/// Whether the lock `name` belongs to the token with this id (its id's first 8
/// bytes are the token's lock prefix).
pub fn owned_by(name: &str, token_id: &str) -> bool {
    let prefix = hex::encode(cairn_backend::lock_owner_prefix(token_id));
    crate::policy::id_of(name).is_some_and(|id| id.starts_with(&prefix))
}

/// Deletes every lock of the token with this id (a removed token: its client can
/// no longer refresh or remove them, and until they went stale they would keep
/// other jobs waiting and prune from deleting). Returns their names.
pub fn delete_locks_of(
    backend: &dyn cairn_backend::Backend,
    token_id: &str,
) -> Result<Vec<String>, cairn_backend::BackendError> {
    let mut deleted = Vec::new();
    for o in backend.list(cairn_backend::names::LOCKS)? {
        if !owned_by(&o.name, token_id) {
            continue;
        }
        match backend.delete(&o.name) {
            Ok(()) => deleted.push(o.name),
            Err(e) if e.is_not_found() => {}
            Err(e) => return Err(e),
        }
    }
    Ok(deleted)
}

impl LockOwners {
    /// `max_age`: the cap on a non-admin lock's life, in seconds.
    pub fn open(path: PathBuf, max_age: i64) -> LockOwners {
        let seen: BTreeMap<String, Seen> =
            match std::fs::read(&path).map(|d| serde_json::from_slice(&d)) {
                Ok(Ok(seen)) => seen,
                Ok(Err(e)) => {
                    // Replaced at the next lock seen: said, since the cap on a lock's
                    // life then counts from now for every lock there is.
                    crate::log_line(&format!(
                        "warning: {} is damaged ({e}): lock ages count from now; it is \
                     written anew",
                        path.display()
                    ));
                    BTreeMap::new()
                }
                Err(_) => BTreeMap::new(),
            };
        let now = cairn_core::time::now_unix();
        let mut sessions: HashMap<String, BTreeSet<String>> = HashMap::new();
        for (name, x) in &seen {
            // A lock unwritten for longer is stale to every reader already.
            let recent = now - x.last_written.unwrap_or(x.first_seen) < GONE_AFTER_SECS;
            if let Some(session) = x.session.as_ref().filter(|_| recent)
                && (sessions.len() < SESSIONS_KEPT || sessions.contains_key(session))
            {
                sessions
                    .entry(session.clone())
                    .or_default()
                    .insert(name.clone());
            }
        }
        LockOwners {
            creating: Mutex::new(()),
            path,
            keep: max_age,
            seen: Mutex::new(seen),
            saved_at: Mutex::new(0),
            orphans: Mutex::new(sessions.keys().cloned().collect()),
            orphan_content: Mutex::new(HashMap::new()),
            sessions: Mutex::new(sessions),
        }
    }

    fn save(&self, seen: &BTreeMap<String, Seen>) {
        // Best effort: see the module comment for what a lost file costs.
        if let Ok(body) = serde_json::to_vec(seen) {
            let tmp = self.path.with_extension("tmp");
            let written = std::os::unix::fs::OpenOptionsExt::mode(
                std::fs::OpenOptions::new()
                    .write(true)
                    .create(true)
                    .truncate(true),
                0o600,
            )
            .open(&tmp)
            .and_then(|mut f| std::io::Write::write_all(&mut f, &body));
            if written.is_ok() {
                let _ = std::fs::rename(&tmp, &self.path);
            } else {
                // (A full state directory: nothing half-written is left there.)
                let _ = std::fs::remove_file(&tmp);
            }
        }
    }

    /// A write of the lock `name` (stored or refreshed): its age in seconds,
    /// counting from when this server first saw it.
    pub fn written(&self, name: &str) -> i64 {
        let now = cairn_core::time::now_unix();
        let mut s = self.seen.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(x) = s.get_mut(name) {
            x.last_written = Some(now);
            x.removed_at = None;
            let age = now - x.first_seen;
            // Saved for a refresh at most once a minute: losing the last refresh time
            // only makes a lock look older by that much to `unwritten_for`.
            self.save_if_due(&s, now);
            return age;
        }
        // Names older than the cap are refused anyway once seen again; forgetting
        // those older than twice the cap keeps the file bounded.
        let keep = self.keep.saturating_mul(2);
        s.retain(|_, x| now - x.first_seen <= keep);
        make_room(&mut s, name);
        s.insert(name.to_string(), Seen::written_at(now));
        self.save(&s);
        0
    }

    /// The lock `name` was stored or refreshed through this server with
    /// `content`.
    pub fn saw(&self, name: &str, content: &[u8]) {
        let now = cairn_core::time::now_unix();
        let hash = content_hash(content);
        let mut s = self.seen.lock().unwrap_or_else(|e| e.into_inner());
        let x = s
            .entry(name.to_string())
            .or_insert_with(|| Seen::written_at(now));
        x.last_written = Some(now);
        // Saved when the content changed (a refresh: every 5 minutes a lock):
        // a write just before may have saved the old one, and the file must
        // not stay a refresh behind.
        if x.content.as_deref() != Some(hash.as_str()) {
            x.content = Some(hash);
            self.save(&s);
        } else {
            self.save_if_due(&s, now);
        }
    }

    /// Whether the lock `name` holds other content than when this server last
    /// saw it (refreshed through another server): then it counts as written now.
    fn changed(&self, name: &str, content: &[u8]) -> bool {
        let now = cairn_core::time::now_unix();
        let hash = content_hash(content);
        let mut s = self.seen.lock().unwrap_or_else(|e| e.into_inner());
        let Some(x) = s.get_mut(name) else {
            return true;
        };
        if x.content.as_deref() == Some(hash.as_str()) {
            return false;
        }
        x.content = Some(hash);
        x.last_written = Some(now);
        self.save(&s);
        true
    }

    fn save_if_due(&self, seen: &BTreeMap<String, Seen>, now: i64) {
        let mut last = self.saved_at.lock().unwrap_or_else(|e| e.into_inner());
        if now - *last >= 60 {
            *last = now;
            self.save(seen);
        }
    }

    /// The client session `session` stored (or refreshed) the lock `name`.
    pub fn made_by(&self, session: &str, name: &str) {
        {
            let mut s = self.sessions.lock().unwrap_or_else(|e| e.into_inner());
            if s.len() >= SESSIONS_KEPT && !s.contains_key(session) {
                return;
            }
            s.entry(session.to_string())
                .or_default()
                .insert(name.to_string());
        }
        // Saved at once (the first time only): a server killed right after would
        // otherwise not know the lock's holder when it starts again.
        let mut seen = self.seen.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(x) = seen.get_mut(name)
            && x.session.as_deref() != Some(session)
        {
            x.session = Some(session.to_string());
            self.save(&seen);
        }
    }

    /// The lock `name` was removed through this server (or by its sweep).
    pub fn removed(&self, name: &str) {
        let mut s = self.sessions.lock().unwrap_or_else(|e| e.into_inner());
        s.retain(|_, names| {
            names.remove(name);
            !names.is_empty()
        });
        drop(s);
        let mut seen = self.seen.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(x) = seen.get_mut(name) {
            let held = x.session.take().is_some();
            // Saved with the next write of the file (a lost mark only keeps the
            // name longer).
            x.removed_at = Some(cairn_core::time::now_unix());
            if held {
                self.save(&seen);
            }
        }
    }

    /// A request of the client session `session` arrived: if it held locks when
    /// the server last stopped, it is alive and they stay.
    pub fn heard(&self, session: &str) {
        let mut o = self.orphans.lock().unwrap_or_else(|e| e.into_inner());
        if !o.is_empty() {
            o.remove(session);
        }
    }

    /// The locks of the sessions that held locks when the server last stopped.
    pub fn orphan_locks(&self) -> Vec<String> {
        let o = self.orphans.lock().unwrap_or_else(|e| e.into_inner());
        let s = self.sessions.lock().unwrap_or_else(|e| e.into_inner());
        (o.iter())
            .filter_map(|k| s.get(k))
            .flatten()
            .cloned()
            .collect()
    }

    /// The orphan lock `name` held `content` when the wait began (None: it was
    /// gone already).
    pub fn orphan_read(&self, name: &str, content: Option<&[u8]>) {
        let mut c = self
            .orphan_content
            .lock()
            .unwrap_or_else(|e| e.into_inner());
        match content {
            Some(b) => c.insert(name.to_string(), content_hash(b)),
            None => c.remove(name),
        };
    }

    /// Whether the orphan lock `name` still holds what it held when the wait
    /// began (false for one not read then: nothing is known of it).
    pub fn orphan_unchanged(&self, name: &str, content: &[u8]) -> bool {
        let c = self
            .orphan_content
            .lock()
            .unwrap_or_else(|e| e.into_inner());
        c.get(name).is_some_and(|h| *h == content_hash(content))
    }

    /// Once the wait is over (the caller's to time): the sessions that held
    /// locks when the server last stopped and have not been heard from since,
    /// each with the locks it stored and did not remove; forgotten.
    pub fn take_orphans(&self) -> Vec<(String, Vec<String>)> {
        let mut o = self.orphans.lock().unwrap_or_else(|e| e.into_inner());
        if o.is_empty() {
            return Vec::new();
        }
        let gone: Vec<String> = o.drain().collect();
        drop(o);
        gone.into_iter()
            .map(|k| {
                let names = self.take_session(&k);
                (k, names)
            })
            .filter(|(_, names)| !names.is_empty())
            .collect()
    }

    /// The locks the session `session` stored and did not remove; forgotten.
    pub fn take_session(&self, session: &str) -> Vec<String> {
        let mut s = self.sessions.lock().unwrap_or_else(|e| e.into_inner());
        s.remove(session)
            .map(|n| n.into_iter().collect())
            .unwrap_or_default()
    }

    /// How long ago this server last saw the lock `name` written. A lock it has
    /// never seen (stored through another server, or before a lost state file)
    /// counts as written now, and from now on.
    pub fn unwritten_for(&self, name: &str) -> i64 {
        let now = cairn_core::time::now_unix();
        let mut s = self.seen.lock().unwrap_or_else(|e| e.into_inner());
        match s.get(name) {
            Some(x) => now - x.last_written.unwrap_or(x.first_seen),
            None => {
                s.insert(name.to_string(), Seen::written_at(now));
                self.save(&s);
                0
            }
        }
    }
}

/// Makes room for one more lock of the token with this id when it holds
/// [`MAX_LOCKS_PER_TOKEN`]: removes those of its locks whose content has not
/// changed for [`GONE_AFTER_SECS`] (read to tell: another server in front of
/// the datastore may be the one that sees their refreshes). Returns how many it
/// holds then, and the names of those removed.
pub fn make_room_for_lock(
    backend: &dyn cairn_backend::Backend,
    owners: &LockOwners,
    token_id: &str,
) -> Result<(usize, Vec<String>), cairn_backend::BackendError> {
    let mine: Vec<String> = backend
        .list(cairn_backend::names::LOCKS)?
        .into_iter()
        .filter(|o| owned_by(&o.name, token_id))
        .map(|o| o.name)
        .collect();
    if mine.len() < MAX_LOCKS_PER_TOKEN {
        return Ok((mine.len(), Vec::new()));
    }
    let (mut held, mut removed) = (0, Vec::new());
    for name in mine {
        if owners.unwritten_for(&name) < GONE_AFTER_SECS {
            held += 1;
            continue;
        }
        let max = cairn_format::consts::MAX_SMALL_OBJECT_SIZE as u64;
        match backend.get_bounded(&name, max) {
            Ok(content) if owners.changed(&name, &content) => {
                held += 1;
                continue;
            }
            Ok(_) => {}
            Err(e) if e.is_not_found() => continue,
            // Larger than any lock: unreadable to every reader, removed.
            Err(e) if e.kind == cairn_backend::BackendErrorKind::TooLarge => {}
            Err(e) => return Err(e),
        }
        match backend.delete(&name) {
            Ok(()) => removed.push(name),
            Err(e) if e.is_not_found() => {}
            Err(e) => return Err(e),
        }
    }
    Ok((held, removed))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ownership_is_in_the_name() {
        let p = hex::encode(cairn_backend::lock_owner_prefix("0123456789abcdef"));
        let mine = format!("locks/{p}{}", "0".repeat(48));
        assert!(owned_by(&mine, "0123456789abcdef"));
        assert!(!owned_by(&mine, "fedcba9876543210"));
        assert!(!owned_by(
            &format!("locks/{}", "0".repeat(64)),
            "0123456789abcdef"
        ));
    }

    /// A token that stores and removes lock after lock leaves at most
    /// [`REMEMBERED_PER_OWNER`] of its names in the file, the oldest forgotten
    /// first; another token's names and a held lock's stay (audit r33).
    #[test]
    fn names_remembered_per_token_are_bounded() {
        let dir = tempfile::tempdir().unwrap();
        let o = LockOwners::open(dir.path().join("l.json"), 7 * 24 * 3600);
        let lock = |token: &str, i: usize| {
            let p = hex::encode(cairn_backend::lock_owner_prefix(token));
            format!("locks/{p}{i:048x}")
        };
        o.written(&lock("bbbb", 0));
        o.written(&lock("aaaa", 0));
        o.made_by("aaaa-s", &lock("aaaa", 0));
        // A lock stored without a session and never removed (review r34: it
        // was forgotten first, and refreshed past the age cap).
        o.written(&lock("aaaa", 1));
        o.seen
            .lock()
            .unwrap()
            .get_mut(&lock("aaaa", 1))
            .unwrap()
            .first_seen -= 3600;
        for i in 2..REMEMBERED_PER_OWNER * 3 {
            o.written(&lock("aaaa", i));
            o.removed(&lock("aaaa", i));
        }
        assert!(o.written(&lock("aaaa", 1)) >= 3600, "its age is kept");
        let seen = o.seen.lock().unwrap();
        let p = hex::encode(cairn_backend::lock_owner_prefix("aaaa"));
        let mine = seen.keys().filter(|k| k.contains(&p)).count();
        assert_eq!(mine, REMEMBERED_PER_OWNER);
        assert!(seen.contains_key(&lock("bbbb", 0)));
        assert!(seen.contains_key(&lock("aaaa", 0)), "the held one stays");
        assert!(seen.contains_key(&lock("aaaa", REMEMBERED_PER_OWNER * 3 - 1)));
        let file = std::fs::read(dir.path().join("l.json")).unwrap();
        assert!(file.len() < REMEMBERED_PER_OWNER * 400, "{}", file.len());
    }

    /// At the cap, a token's locks not written for an hour make room; those
    /// written lately, and other tokens' locks, stay.
    #[test]
    fn a_token_at_the_cap_loses_only_its_long_unwritten_locks() {
        use cairn_backend::Backend;
        let dir = tempfile::tempdir().unwrap();
        let o = LockOwners::open(dir.path().join("l.json"), 7 * 24 * 3600);
        let b = cairn_backend::MemBackend::new();
        let lock = |token: &str, i: usize| {
            let p = hex::encode(cairn_backend::lock_owner_prefix(token));
            format!("locks/{p}{i:048x}")
        };
        for i in 0..MAX_LOCKS_PER_TOKEN - 1 {
            b.put(&lock("aaaa", i), b"x").unwrap();
            o.written(&lock("aaaa", i));
            o.saw(&lock("aaaa", i), b"x");
        }
        b.put(&lock("bbbb", 0), b"x").unwrap();
        // Under the cap nothing is looked at.
        assert_eq!(
            make_room_for_lock(&b, &o, "aaaa").unwrap(),
            (MAX_LOCKS_PER_TOKEN - 1, Vec::new())
        );
        // One more, never seen by this server: counts as written now.
        b.put(&lock("aaaa", 999), b"x").unwrap();
        let (held, removed) = make_room_for_lock(&b, &o, "aaaa").unwrap();
        assert_eq!((held, removed.len()), (MAX_LOCKS_PER_TOKEN, 0));
        // Four of them long unwritten here; one refreshed through this server
        // since, one through another (its content changed): those two stay.
        let now = cairn_core::time::now_unix();
        for i in 0..4 {
            o.seen
                .lock()
                .unwrap()
                .get_mut(&lock("aaaa", i))
                .unwrap()
                .last_written = Some(now - GONE_AFTER_SECS - 5);
        }
        o.written(&lock("aaaa", 2));
        b.put(&lock("aaaa", 3), b"refreshed elsewhere").unwrap();
        let (held, removed) = make_room_for_lock(&b, &o, "aaaa").unwrap();
        assert_eq!(held, MAX_LOCKS_PER_TOKEN - 2);
        assert_eq!(removed, [lock("aaaa", 0), lock("aaaa", 1)]);
        assert!(b.get(&lock("aaaa", 0)).is_err());
        assert!(b.get(&lock("aaaa", 2)).is_ok());
        assert!(b.get(&lock("aaaa", 3)).is_ok());
        assert!(b.get(&lock("bbbb", 0)).is_ok());
    }

    #[test]
    fn ages_count_from_first_sight_and_survive_a_restart() {
        let dir = tempfile::tempdir().unwrap();
        let o = LockOwners::open(dir.path().join("l.json"), 3600);
        assert_eq!(o.written("locks/a"), 0);
        let again = LockOwners::open(dir.path().join("l.json"), 3600);
        assert!(again.written("locks/a") <= 1);
        // A name seen longer ago than twice the cap is forgotten when another is
        // first seen; one within it is kept, removed or not.
        again.seen.lock().unwrap().insert(
            "locks/old".into(),
            Seen {
                first_seen: cairn_core::time::now_unix() - 7201,
                last_written: None,
                content: None,
                session: None,
                removed_at: None,
            },
        );
        again.seen.lock().unwrap().insert(
            "locks/recent".into(),
            Seen {
                first_seen: cairn_core::time::now_unix() - 7000,
                last_written: None,
                content: None,
                session: None,
                removed_at: None,
            },
        );
        assert_eq!(again.written("locks/b"), 0);
        let names: Vec<String> = LockOwners::open(dir.path().join("l.json"), 3600)
            .seen
            .lock()
            .unwrap()
            .keys()
            .cloned()
            .collect();
        assert_eq!(names, ["locks/a", "locks/b", "locks/recent"]);
    }

    /// A restarted server knows whose locks there were: the sessions not heard
    /// from are handed over with their locks, once; those heard from keep
    /// theirs, a removed lock is nobody's, and a lock that changed since the
    /// wait began was refreshed (its client is alive).
    #[test]
    fn sessions_holding_locks_outlive_a_restart_until_taken_for_gone() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("l.json");
        let o = LockOwners::open(path.clone(), 3600);
        for (session, lock) in [
            ("t1-a", "locks/1"),
            ("t1-a", "locks/2"),
            ("t2-b", "locks/3"),
        ] {
            o.written(lock);
            o.saw(lock, lock.as_bytes());
            o.made_by(session, lock);
        }
        o.written("locks/4");
        o.made_by("t3-c", "locks/4");
        o.removed("locks/4");
        // Nothing to take in this run: no session was left from before it.
        assert!(o.take_orphans().is_empty());
        drop(o);
        let again = LockOwners::open(path, 3600);
        let mut orphan_locks = again.orphan_locks();
        orphan_locks.sort();
        assert_eq!(orphan_locks, ["locks/1", "locks/2", "locks/3"]);
        for n in &orphan_locks {
            again.orphan_read(n, Some(n.as_bytes()));
        }
        again.heard("t2-b");
        assert_eq!(
            again.take_orphans(),
            [(
                "t1-a".to_string(),
                vec!["locks/1".to_string(), "locks/2".to_string()]
            )]
        );
        assert!(again.take_orphans().is_empty(), "handed over once");
        assert!(again.orphan_unchanged("locks/1", b"locks/1"));
        assert!(!again.orphan_unchanged("locks/1", b"refreshed elsewhere"));
        assert!(!again.orphan_unchanged("locks/9", b"never read"));
        // The session heard from is tracked as before (deleted if it goes silent).
        assert_eq!(again.take_session("t2-b"), ["locks/3"]);
    }

    /// A refresh saves the lock's new content at once (the file was one refresh
    /// behind when a write of the same second had just saved it).
    #[test]
    fn a_refreshed_lock_is_saved_with_its_new_content() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("l.json");
        let o = LockOwners::open(path.clone(), 3600);
        o.written("locks/1");
        o.saw("locks/1", b"v1");
        o.made_by("t1-a", "locks/1");
        o.written("locks/1");
        o.saw("locks/1", b"v2");
        drop(o);
        let again = LockOwners::open(path, 3600);
        let seen = again.seen.lock().unwrap();
        assert_eq!(
            seen["locks/1"].content.as_deref(),
            Some(content_hash(b"v2").as_str())
        );
    }
}
