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
//! again does not start its life anew (prune waits for locks by id). A lock first
//! seen by another server, or before a lost state file, counts from when this server
//! first saw it. Losing the file costs no data.

use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;
use std::path::PathBuf;
use std::sync::Mutex;

#[derive(Clone, Debug, Serialize, Deserialize)]
struct Seen {
    /// Unix seconds when this server first stored or refreshed it.
    first_seen: i64,
}

pub struct LockOwners {
    path: PathBuf,
    /// How long a name is remembered: the cap on a lock's life, in seconds.
    keep: i64,
    seen: Mutex<BTreeMap<String, Seen>>,
}

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
        let seen = match std::fs::read(&path).map(|d| serde_json::from_slice(&d)) {
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
        LockOwners {
            path,
            keep: max_age,
            seen: Mutex::new(seen),
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

    /// The lock's age in seconds, counting from when this server first saw it.
    pub fn age(&self, name: &str) -> i64 {
        let now = cairn_core::time::now_unix();
        let mut s = self.seen.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(x) = s.get(name) {
            return now - x.first_seen;
        }
        // Names older than the cap are refused anyway once seen again; forgetting
        // those older than twice the cap keeps the file bounded.
        let keep = self.keep.saturating_mul(2);
        s.retain(|_, x| now - x.first_seen <= keep);
        s.insert(name.to_string(), Seen { first_seen: now });
        self.save(&s);
        0
    }
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

    #[test]
    fn ages_count_from_first_sight_and_survive_a_restart() {
        let dir = tempfile::tempdir().unwrap();
        let o = LockOwners::open(dir.path().join("l.json"), 3600);
        assert_eq!(o.age("locks/a"), 0);
        let again = LockOwners::open(dir.path().join("l.json"), 3600);
        assert!(again.age("locks/a") <= 1);
        // A name seen longer ago than twice the cap is forgotten when another is
        // first seen; one within it is kept, removed or not.
        again.seen.lock().unwrap().insert(
            "locks/old".into(),
            Seen {
                first_seen: cairn_core::time::now_unix() - 7201,
            },
        );
        again.seen.lock().unwrap().insert(
            "locks/recent".into(),
            Seen {
                first_seen: cairn_core::time::now_unix() - 7000,
            },
        );
        assert_eq!(again.age("locks/b"), 0);
        let names: Vec<String> = LockOwners::open(dir.path().join("l.json"), 3600)
            .seen
            .lock()
            .unwrap()
            .keys()
            .cloned()
            .collect();
        assert_eq!(names, ["locks/a", "locks/b", "locks/recent"]);
    }
}
