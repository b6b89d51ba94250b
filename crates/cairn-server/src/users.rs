//! Console users: a name and a password instead of a token, for people.
//!
//! Kept in the state directory (`users.json`, mode 0600) as Argon2id password
//! hashes in the PHC string format, never the password. A user holds the same
//! grant as a token (a datastore or `*`, a role, optionally a host) and is decided
//! by the same policy: the console signs a user in to a session and every request
//! of that session is checked against the user's entry as it is in the file now,
//! so `cairn serve user remove` ends their sessions at once.
//!
//! Guessing is slowed three ways: Argon2id costs about 19 MiB and two passes per
//! try; at most [`HASHING_AT_ONCE`] tries are hashed at a time; and after
//! [`FREE_FAILURES`] wrong passwords in a row a name is refused for a time that
//! doubles with each further failure (up to [`MAX_BACKOFF`]). An unknown name
//! costs the same hashing as a known one, so timing does not tell which exist.

use crate::policy::Role;
use crate::statefile::{StateError, StateFile};
use crate::tokens::{TokenEntry, valid_grant};
use argon2::password_hash::{PasswordHash, PasswordHasher, PasswordVerifier, SaltString};
use serde::{Deserialize, Serialize};
use std::collections::HashMap;
use std::path::Path;
use std::sync::Mutex;
use std::time::{Duration, Instant};

/// Tries hashed at the same time; the rest wait (each try holds ~19 MiB).
pub const HASHING_AT_ONCE: usize = 2;
/// Wrong passwords in a row before a name must wait.
pub const FREE_FAILURES: u32 = 5;
/// The longest wait after many failures.
pub const MAX_BACKOFF: Duration = Duration::from_secs(15 * 60);
/// The shortest password `user add` and `user passwd` accept.
pub const MIN_PASSWORD: usize = 8;

#[derive(Debug, thiserror::Error)]
pub enum UserError {
    #[error("the user file: {0}")]
    File(#[from] StateError),
    #[error("{0}")]
    Invalid(String),
}

/// One stored user (never the password).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct UserEntry {
    pub name: String,
    /// A datastore name, or `*` for all of them.
    pub datastore: String,
    pub role: Role,
    /// When set, the user sees only this host's snapshots (as a host-bound token).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub host: Option<String>,
    /// Argon2id hash of the password, PHC string.
    pub hash: String,
    pub created: String,
}

impl UserEntry {
    /// The grant, in the form the policy decides by.
    pub fn principal(&self) -> TokenEntry {
        TokenEntry {
            id: format!("user-{}", self.name),
            name: self.name.clone(),
            datastore: self.datastore.clone(),
            role: self.role,
            host: self.host.clone(),
            hash: String::new(),
            created: self.created.clone(),
            expires: None,
            user: true,
        }
    }
}

#[derive(Default, Serialize, Deserialize)]
struct UserFile {
    version: u32,
    users: Vec<UserEntry>,
}

/// Argon2id at OWASP's recommended cost (19 MiB, 2 passes, 1 lane).
fn hasher() -> argon2::Argon2<'static> {
    let params = argon2::Params::new(19 * 1024, 2, 1, None).unwrap_or_default();
    argon2::Argon2::new(argon2::Algorithm::Argon2id, argon2::Version::V0x13, params)
}

fn hash_password(password: &str) -> Result<String, UserError> {
    let salt = SaltString::encode_b64(&cairn_format::envelope::random_bytes::<16>())
        .map_err(|e| UserError::Invalid(format!("salt: {e}")))?;
    hasher()
        .hash_password(password.as_bytes(), &salt)
        .map(|h| h.to_string())
        .map_err(|e| UserError::Invalid(format!("hashing the password: {e}")))
}

/// Whether `password` matches the PHC string `hash` (false for a hash that does
/// not parse).
fn verify(hash: &str, password: &str) -> bool {
    match PasswordHash::new(hash) {
        Ok(h) => hasher().verify_password(password.as_bytes(), &h).is_ok(),
        Err(_) => false,
    }
}

fn valid_name(name: &str) -> bool {
    !name.is_empty()
        && name.len() <= 64
        && name
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b"._@-".contains(&b))
}

/// What a sign-in with a password got.
#[derive(Debug, PartialEq, Eq)]
pub enum SignInOutcome {
    Ok(Box<UserEntry>),
    /// Unknown name or wrong password (not told apart).
    Refused,
    /// Too many wrong passwords: try again after this long.
    Wait(Duration),
}

/// Failures in a row for a name, and when the last one was.
struct Failures {
    count: u32,
    last: Instant,
}

/// At most this many names are remembered for the back-off.
const MAX_TRACKED: usize = 10_000;

pub struct UserStore {
    file: StateFile<UserFile>,
    failures: Mutex<HashMap<String, Failures>>,
    /// A hash to verify against when the name is unknown (same cost), made at the
    /// first sign-in: the CLI's `user` commands never need it.
    decoy: std::sync::OnceLock<String>,
}

impl UserStore {
    pub fn new(state_dir: &Path) -> UserStore {
        UserStore {
            file: StateFile::new(state_dir.join("users.json")),
            failures: Mutex::new(HashMap::new()),
            decoy: std::sync::OnceLock::new(),
        }
    }

    pub fn path(&self) -> &Path {
        self.file.path()
    }

    pub fn list(&self) -> Result<Vec<UserEntry>, UserError> {
        Ok(self.file.load()?.users)
    }

    /// The user `name` as the file says now.
    pub fn get(&self, name: &str) -> Result<Option<UserEntry>, UserError> {
        Ok(self
            .file
            .current()?
            .users
            .iter()
            .find(|u| u.name == name)
            .cloned())
    }

    /// Changes the file as one step against other processes (see
    /// `StateFile::update`).
    fn update<R>(
        &self,
        f: impl FnOnce(&mut Vec<UserEntry>) -> Result<R, UserError>,
    ) -> Result<R, UserError> {
        self.file.update(|file| {
            file.version = 1;
            f(&mut file.users)
        })
    }

    fn check_password(password: &str) -> Result<(), UserError> {
        // Counted without the spaces around it (QA r13: eight spaces were taken).
        if password.trim().chars().count() < MIN_PASSWORD {
            return Err(UserError::Invalid(format!(
                "a console password has at least {MIN_PASSWORD} characters, not counting spaces around them"
            )));
        }
        Ok(())
    }

    pub fn add(
        &self,
        name: &str,
        datastore: &str,
        role: Role,
        host: Option<&str>,
        password: &str,
    ) -> Result<UserEntry, UserError> {
        if !valid_name(name) {
            return Err(UserError::Invalid(format!(
                "{name:?}: a user name is 1-64 letters, digits, '.', '_', '@' or '-'"
            )));
        }
        valid_grant(datastore, role).map_err(UserError::Invalid)?;
        Self::check_password(password)?;
        // The slow hash before the file is locked.
        let hash = hash_password(password)?;
        self.update(|users| {
            if users.iter().any(|u| u.name == name) {
                return Err(UserError::Invalid(format!(
                    "a user named {name:?} exists (remove it first, or change its password \
                     with `cairn serve user passwd`)"
                )));
            }
            let entry = UserEntry {
                name: name.to_string(),
                datastore: datastore.to_string(),
                role,
                host: host.map(str::to_string),
                hash,
                created: cairn_core::time::now_rfc3339(),
            };
            users.push(entry.clone());
            Ok(entry)
        })
    }

    pub fn passwd(&self, name: &str, password: &str) -> Result<(), UserError> {
        Self::check_password(password)?;
        let hash = hash_password(password)?;
        self.update(|users| {
            let Some(u) = users.iter_mut().find(|u| u.name == name) else {
                return Err(UserError::Invalid(format!("no user named {name:?}")));
            };
            u.hash = hash;
            Ok(())
        })
    }

    pub fn remove(&self, name: &str) -> Result<UserEntry, UserError> {
        self.update(|users| {
            let Some(pos) = users.iter().position(|u| u.name == name) else {
                return Err(UserError::Invalid(format!("no user named {name:?}")));
            };
            Ok(users.remove(pos))
        })
    }

    /// How long `name` must still wait before it may try again.
    fn backoff(&self, name: &str) -> Option<Duration> {
        let map = self.failures.lock().unwrap_or_else(|e| e.into_inner());
        let f = map.get(name)?;
        if f.count < FREE_FAILURES {
            return None;
        }
        let wait = Duration::from_secs(1 << (f.count - FREE_FAILURES).min(10)).min(MAX_BACKOFF);
        wait.checked_sub(f.last.elapsed())
    }

    fn failed(&self, name: &str) {
        let mut map = self.failures.lock().unwrap_or_else(|e| e.into_inner());
        if map.len() >= MAX_TRACKED && !map.contains_key(name) {
            map.retain(|_, f| f.last.elapsed() < MAX_BACKOFF);
            if map.len() >= MAX_TRACKED {
                return;
            }
        }
        let f = map.entry(name.to_string()).or_insert(Failures {
            count: 0,
            last: Instant::now(),
        });
        f.count = f.count.saturating_add(1);
        f.last = Instant::now();
    }

    /// Checks a password (blocking: Argon2id). The caller limits how many run at once.
    pub fn sign_in(&self, name: &str, password: &str) -> Result<SignInOutcome, UserError> {
        if let Some(wait) = self.backoff(name) {
            return Ok(SignInOutcome::Wait(wait));
        }
        let user = self.get(name)?;
        let hash = match &user {
            Some(u) => u.hash.as_str(),
            None => self
                .decoy
                .get_or_init(|| hash_password("decoy password, never valid").unwrap_or_default()),
        };
        let good = verify(hash, password);
        match user {
            Some(u) if good => {
                self.failures
                    .lock()
                    .unwrap_or_else(|e| e.into_inner())
                    .remove(name);
                Ok(SignInOutcome::Ok(Box::new(u)))
            }
            _ => {
                self.failed(name);
                Ok(SignInOutcome::Refused)
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn add_sign_in_passwd_remove() {
        let dir = tempfile::tempdir().unwrap();
        let store = UserStore::new(dir.path());
        let u = store
            .add("ann", "*", Role::Admin, None, "correct horse")
            .unwrap();
        let text = std::fs::read_to_string(store.path()).unwrap();
        assert!(!text.contains("correct horse"), "password stored");
        assert!(text.contains("$argon2id$"), "{text}");
        assert_eq!(
            store.sign_in("ann", "correct horse").unwrap(),
            SignInOutcome::Ok(Box::new(u.clone()))
        );
        assert_eq!(
            store.sign_in("ann", "wrong").unwrap(),
            SignInOutcome::Refused
        );
        assert_eq!(
            store.sign_in("nobody", "correct horse").unwrap(),
            SignInOutcome::Refused
        );
        let p = u.principal();
        assert!(p.user && p.opens("main") && p.opens("other"));
        // Bad input: a name taken, a short password, a bad name, `*` for backup, a
        // datastore name that climbs.
        for (name, ds, role, password) in [
            ("ann", "main", Role::Admin, "12345678"),
            ("bob", "main", Role::Admin, "short"),
            ("b/ob", "main", Role::Admin, "12345678"),
            ("bob", "*", Role::Backup, "12345678"),
            ("bob", "../x", Role::Admin, "12345678"),
        ] {
            assert!(
                store.add(name, ds, role, None, password).is_err(),
                "{name} {ds} {role:?} {password}"
            );
        }
        // A new password; the old one stops working.
        store.passwd("ann", "battery staple").unwrap();
        assert_eq!(
            store.sign_in("ann", "correct horse").unwrap(),
            SignInOutcome::Refused
        );
        assert!(matches!(
            store.sign_in("ann", "battery staple").unwrap(),
            SignInOutcome::Ok(_)
        ));
        // Removed by another process: the running server's next look sees it.
        std::thread::sleep(Duration::from_millis(20));
        UserStore::new(dir.path()).remove("ann").unwrap();
        assert_eq!(store.get("ann").unwrap(), None);
    }

    #[test]
    fn wrong_passwords_in_a_row_make_a_name_wait() {
        let dir = tempfile::tempdir().unwrap();
        let store = UserStore::new(dir.path());
        store
            .add("ann", "main", Role::Restore, Some("web01"), "correct horse")
            .unwrap();
        for _ in 0..FREE_FAILURES {
            assert_eq!(store.sign_in("ann", "x").unwrap(), SignInOutcome::Refused);
        }
        // Now even the right password waits, and so does an unknown name after its
        // own failures.
        assert!(matches!(
            store.sign_in("ann", "correct horse").unwrap(),
            SignInOutcome::Wait(_)
        ));
        std::thread::sleep(Duration::from_millis(1100));
        assert!(matches!(
            store.sign_in("ann", "correct horse").unwrap(),
            SignInOutcome::Ok(_)
        ));
        // A success clears the count.
        assert_eq!(store.sign_in("ann", "x").unwrap(), SignInOutcome::Refused);
    }
}
