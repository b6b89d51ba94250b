//! Which token created which lock, so that a lock is refreshed and removed only by
//! its creator, and how long a non-admin lock may live.
//!
//! Kept in the state directory (`locks-<datastore>.json`), so a restarted server
//! still lets a running backup refresh its lock. Losing the file costs no data: a
//! backup that cannot refresh its lock stops before committing, and prune treats an
//! unrefreshed lock as stale after 30 minutes.

use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;
use std::path::PathBuf;
use std::sync::Mutex;

#[derive(Clone, Debug, Serialize, Deserialize)]
struct Owner {
    token: String,
    /// Unix seconds when the server first stored it.
    first_seen: i64,
}

pub struct LockOwners {
    path: PathBuf,
    owners: Mutex<BTreeMap<String, Owner>>,
}

/// Why a lock write was refused.
#[derive(Debug, PartialEq, Eq)]
pub enum LockRefusal {
    NotOwner,
    TooOld { age_secs: i64 },
}

impl LockOwners {
    pub fn open(path: PathBuf) -> LockOwners {
        let owners = std::fs::read(&path)
            .ok()
            .and_then(|d| serde_json::from_slice(&d).ok())
            .unwrap_or_default();
        LockOwners {
            path,
            owners: Mutex::new(owners),
        }
    }

    fn save(&self, owners: &BTreeMap<String, Owner>) {
        // Best effort: see the module comment for what a lost file costs.
        if let Ok(body) = serde_json::to_vec(owners) {
            let tmp = self.path.with_extension("tmp");
            if std::fs::write(&tmp, body).is_ok() {
                let _ = std::fs::rename(&tmp, &self.path);
            }
        }
    }

    /// Records a lock created by `token`.
    pub fn created(&self, name: &str, token: &str) {
        let mut o = self.owners.lock().unwrap_or_else(|e| e.into_inner());
        o.insert(
            name.to_string(),
            Owner {
                token: token.to_string(),
                first_seen: cairn_core::time::now_unix(),
            },
        );
        self.save(&o);
    }

    /// Whether `token` may rewrite the lock `name` now (`max_age` seconds after
    /// it was created, a non-admin lock may no longer be refreshed: a lock kept
    /// alive forever would keep prune from ever deleting anything).
    pub fn may_refresh(&self, name: &str, token: &str, max_age: i64) -> Result<(), LockRefusal> {
        let o = self.owners.lock().unwrap_or_else(|e| e.into_inner());
        match o.get(name) {
            Some(owner) if owner.token == token => {
                let age = cairn_core::time::now_unix() - owner.first_seen;
                if age > max_age {
                    Err(LockRefusal::TooOld { age_secs: age })
                } else {
                    Ok(())
                }
            }
            _ => Err(LockRefusal::NotOwner),
        }
    }

    pub fn may_delete(&self, name: &str, token: &str) -> bool {
        let o = self.owners.lock().unwrap_or_else(|e| e.into_inner());
        o.get(name).is_some_and(|owner| owner.token == token)
    }

    pub fn removed(&self, name: &str) {
        let mut o = self.owners.lock().unwrap_or_else(|e| e.into_inner());
        if o.remove(name).is_some() {
            self.save(&o);
        }
    }
}
