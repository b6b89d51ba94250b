//! Access tokens, kept hashed in the server's state directory (`tokens.json`).
//!
//! A token is `cairn_<id>_<secret>`: the 8-byte id finds the entry, the 32-byte
//! secret is compared through its BLAKE3 hash (constant time), and only the hash is
//! stored. The secret is random, so a fast hash is enough (nothing to brute-force).
//! The file is read again when it changes, so `cairn serve token add/remove` take
//! effect in a running server without a restart.

use crate::policy::Role;
use crate::statefile::{StateError, StateFile};
use serde::{Deserialize, Serialize};
use std::path::Path;

#[derive(Debug, thiserror::Error)]
pub enum TokenError {
    #[error("the token file: {0}")]
    File(#[from] StateError),
    #[error("{0}")]
    Invalid(String),
    /// The token is known, and its time is over (`token add --expires`).
    #[error("token {name:?} expired on {at}: an admin adds a new one (`cairn serve token add`)")]
    Expired { name: String, at: String },
}

/// One stored token (never the secret itself). A field this cairn does not know
/// makes the file unreadable rather than ignored: what a token may do must not
/// be guessed (a cairn from before `expires` refuses a file that has one).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct TokenEntry {
    /// 16 hex digits, the public part of the token.
    pub id: String,
    /// A name for people ("web01-backup").
    pub name: String,
    /// The datastore it opens, or [`ALL_DATASTORES`].
    pub datastore: String,
    pub role: Role,
    /// When set, the host the token backs up or restores: it sees only snapshots
    /// it stored itself, recorded by the server as this host's (`hosts`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub host: Option<String>,
    /// BLAKE3 of the secret, hex.
    pub hash: String,
    pub created: String,
    /// When set, RFC 3339: from then on the token opens nothing, and says so
    /// (`token add --expires`). One that cannot be read counts as over.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub expires: Option<String>,
    /// A console user signed in with a password ([`crate::users`]), not a token.
    #[serde(skip)]
    pub user: bool,
}

/// The datastore of a grant that opens every datastore of the server (admin and
/// restore only: a backup client writes into one datastore).
pub const ALL_DATASTORES: &str = "*";

impl TokenEntry {
    /// Whether its time is over at `now` (Unix seconds).
    pub fn expired_at(&self, now: i64) -> bool {
        self.expires
            .as_deref()
            .is_some_and(|e| cairn_core::time::parse_rfc3339(e).is_none_or(|at| at <= now))
    }

    /// "token NAME" or "user NAME", for messages and the log (QA: a console
    /// user was called a token everywhere).
    pub fn who(&self) -> String {
        format!("{} {}", if self.user { "user" } else { "token" }, self.name)
    }

    /// The host whose snapshots alone this grant sees: a host-bound backup or
    /// restore grant's. An admin sees every snapshot whatever its host: it forgets,
    /// prunes and repairs, which judge what is unused from what they see (QA: a
    /// prune through a host-bound admin token deleted every other host's data).
    /// Its host still names the host of the snapshots it stores.
    pub fn view_host(&self) -> Option<&str> {
        match self.role {
            Role::Admin => None,
            _ => self.host.as_deref(),
        }
    }

    /// Whether this grant opens datastore `name`.
    pub fn opens(&self, name: &str) -> bool {
        self.datastore == name || self.datastore == ALL_DATASTORES
    }
}

/// Checks a grant's datastore: a datastore name, or `*` for a role that may span them.
pub fn valid_grant(datastore: &str, role: Role) -> Result<(), String> {
    if datastore == ALL_DATASTORES {
        if role == Role::Backup {
            return Err("a backup grant names one datastore (`*` is for admin and restore)".into());
        }
        return Ok(());
    }
    if !crate::config::valid_datastore_name(datastore) {
        return Err(format!(
            "{datastore:?} is not a datastore name (or `*` for all of them)"
        ));
    }
    Ok(())
}

#[derive(Default, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
struct TokenFile {
    version: u32,
    tokens: Vec<TokenEntry>,
    /// Tokens removed in the last [`REMOVED_KEPT_SECS`]: a running server deletes
    /// their locks, and one started in that time does too ([`Removed`]).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    removed: Vec<Removed>,
}

/// A removed token, remembered for a while. Its locks would otherwise hold other
/// hosts' jobs and prune back until they went stale (30 minutes unrefreshed), and
/// no lock names the token once the token is gone: the server can tell a removed
/// token's locks from a direct client's only by this id.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Removed {
    pub id: String,
    pub name: String,
    /// The datastore it opened, or [`ALL_DATASTORES`].
    pub datastore: String,
    /// When, RFC 3339.
    pub removed: String,
}

/// How long a removed token is remembered: twice the age at which an
/// unrefreshed lock is stale, after which its locks no longer hold anyone.
pub const REMOVED_KEPT_SECS: i64 = 3600;

/// The token file's version this cairn writes and reads.
const TOKEN_FILE_VERSION: u32 = 1;

impl TokenFile {
    /// Refuses a file of a newer version: its tokens may carry limits this cairn
    /// would not apply (QA: version 99 was used as version 1).
    fn checked(&self) -> Result<&Self, TokenError> {
        if self.version > TOKEN_FILE_VERSION {
            return Err(TokenError::Invalid(format!(
                "the token file is version {}, newer than this cairn reads \
                 ({TOKEN_FILE_VERSION}): upgrade cairn",
                self.version
            )));
        }
        Ok(self)
    }
}

fn random<const N: usize>() -> [u8; N] {
    cairn_format::envelope::random_bytes()
}

/// The token file, re-read when it changes.
pub struct TokenStore {
    file: StateFile<TokenFile>,
}

impl TokenStore {
    pub fn new(state_dir: &Path) -> TokenStore {
        TokenStore {
            file: StateFile::new(state_dir.join("tokens.json")),
        }
    }

    pub fn path(&self) -> &Path {
        self.file.path()
    }

    /// Every token, from the file as it is now.
    pub fn list(&self) -> Result<Vec<TokenEntry>, TokenError> {
        let file = self.file.load()?;
        file.checked()?;
        Ok(file.tokens)
    }

    /// Whether a token of this id exists now, and has not expired: what it
    /// started (a download, a job slot, an upload being received) ends with
    /// it, as when it is removed (review r39: an expired token's work went on).
    pub fn exists(&self, id: &str) -> Result<bool, TokenError> {
        let now = cairn_core::time::now_unix();
        Ok(self
            .file
            .current()?
            .checked()?
            .tokens
            .iter()
            .any(|t| t.id == id && !t.expired_at(now)))
    }

    /// The entry a presented token belongs to, if any.
    pub fn authenticate(&self, presented: &str) -> Result<Option<TokenEntry>, TokenError> {
        let Some((id, secret)) = parse(presented) else {
            return Ok(None);
        };
        let hash = blake3::hash(secret.as_bytes());
        let file = self.file.current()?;
        for e in file.checked()?.tokens.iter() {
            if e.id == id {
                let Ok(stored) = blake3::Hash::from_hex(&e.hash) else {
                    continue;
                };
                // blake3::Hash compares in constant time.
                if stored == hash {
                    if e.expired_at(cairn_core::time::now_unix()) {
                        return Err(TokenError::Expired {
                            name: e.name.clone(),
                            at: e.expires.clone().unwrap_or_default(),
                        });
                    }
                    return Ok(Some(e.clone()));
                }
            }
        }
        Ok(None)
    }

    /// Adds a token and returns it with its secret (shown once, never stored).
    pub fn add(
        &self,
        name: &str,
        datastore: &str,
        role: Role,
        host: Option<&str>,
        expires: Option<String>,
    ) -> Result<(TokenEntry, String), TokenError> {
        if let Some(e) = &expires
            && cairn_core::time::parse_rfc3339(e)
                .is_none_or(|at| at <= cairn_core::time::now_unix())
        {
            return Err(TokenError::Invalid(format!(
                "a token's expiry must be a time to come, not {e}"
            )));
        }
        if name.is_empty() || name.len() > 200 || name.chars().any(char::is_control) {
            return Err(TokenError::Invalid(
                "a token name must be 1-200 printable characters".into(),
            ));
        }
        // The host its snapshots are recorded under (`hosts/<id>`, at most 255
        // bytes); an empty one would bind the token to no real host (QA).
        if let Some(h) = host
            && (h.trim().is_empty() || h.len() > 255 || h.chars().any(char::is_control))
        {
            return Err(TokenError::Invalid(
                "a token's host must be 1-255 bytes of printable characters, not blank".into(),
            ));
        }
        valid_grant(datastore, role).map_err(TokenError::Invalid)?;
        self.file.update(|file| {
            file.checked()?;
            if file.tokens.iter().any(|t| t.name == name) {
                return Err(TokenError::Invalid(format!(
                    "a token named {name:?} exists (remove it first)"
                )));
            }
            let id = hex::encode(random::<8>());
            let secret = hex::encode(random::<32>());
            let entry = TokenEntry {
                id: id.clone(),
                name: name.to_string(),
                datastore: datastore.to_string(),
                role,
                host: host.map(str::to_string),
                hash: blake3::hash(secret.as_bytes()).to_hex().to_string(),
                created: cairn_core::time::now_rfc3339(),
                expires,
                user: false,
            };
            file.version = TOKEN_FILE_VERSION;
            file.tokens.push(entry.clone());
            Ok((entry, format!("cairn_{id}_{secret}")))
        })
    }

    /// Removes the token with this name or id; returns it.
    pub fn remove(&self, name_or_id: &str) -> Result<TokenEntry, TokenError> {
        self.file.update(|file| {
            file.checked()?;
            let Some(pos) = file
                .tokens
                .iter()
                .position(|t| t.name == name_or_id || t.id == name_or_id)
            else {
                return Err(TokenError::Invalid(format!(
                    "no token named {name_or_id:?}"
                )));
            };
            file.version = TOKEN_FILE_VERSION;
            let gone = file.tokens.remove(pos);
            let now = cairn_core::time::now_unix();
            file.removed.retain(|r| {
                cairn_core::time::parse_rfc3339(&r.removed)
                    .is_some_and(|t| now - t < REMOVED_KEPT_SECS)
            });
            file.removed.push(Removed {
                id: gone.id.clone(),
                name: gone.name.clone(),
                datastore: gone.datastore.clone(),
                removed: cairn_core::time::now_rfc3339(),
            });
            Ok(gone)
        })
    }

    /// Tokens removed since the last call, by `known` (each token's id and
    /// datastore at that call, updated to now): those the file remembers as
    /// removed in the last [`REMOVED_KEPT_SECS`], and those gone from it some
    /// other way (an entry deleted by hand). Each is returned once per `known`.
    pub fn removed_since(
        &self,
        known: &mut std::collections::BTreeMap<String, Option<Removed>>,
    ) -> Result<Vec<Removed>, TokenError> {
        let file = self.file.current()?;
        let file = file.checked()?;
        let now = cairn_core::time::now_unix();
        let mut gone: Vec<Removed> = Vec::new();
        for r in &file.removed {
            let recent = cairn_core::time::parse_rfc3339(&r.removed)
                .is_some_and(|t| (now - t).abs() < REMOVED_KEPT_SECS);
            if recent && !matches!(known.get(&r.id), Some(None)) {
                gone.push(r.clone());
            }
        }
        for (id, was) in known.iter() {
            if let Some(t) = was
                && !file.tokens.iter().any(|e| &e.id == id)
                && !gone.iter().any(|g| &g.id == id)
            {
                gone.push(Removed {
                    removed: cairn_core::time::now_rfc3339(),
                    ..t.clone()
                });
            }
        }
        // Now: every current token, and every removed one as handled.
        known.clear();
        for e in &file.tokens {
            known.insert(
                e.id.clone(),
                Some(Removed {
                    id: e.id.clone(),
                    name: e.name.clone(),
                    datastore: e.datastore.clone(),
                    removed: String::new(),
                }),
            );
        }
        for r in file.removed.iter().chain(&gone) {
            known.entry(r.id.clone()).or_insert(None);
        }
        Ok(gone)
    }
}

/// `cairn_<16 hex>_<64 hex>` into id and secret.
fn parse(token: &str) -> Option<(&str, &str)> {
    let rest = token.trim().strip_prefix("cairn_")?;
    let (id, secret) = rest.split_once('_')?;
    let hex = |s: &str, n: usize| s.len() == n && s.bytes().all(|b| b.is_ascii_hexdigit());
    (hex(id, 16) && hex(secret, 64)).then_some((id, secret))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Removed tokens are reported once each: those `remove` remembers (also to a
    /// server started after the removal), and those deleted from the file by hand.
    #[test]
    fn removed_tokens_are_reported_once() {
        let dir = tempfile::tempdir().unwrap();
        let store = TokenStore::new(dir.path());
        store.add("a", "main", Role::Backup, None, None).unwrap();
        let (b, _) = store.add("b", "*", Role::Admin, None, None).unwrap();
        store.add("c", "main", Role::Restore, None, None).unwrap();
        let mut known = std::collections::BTreeMap::new();
        assert!(store.removed_since(&mut known).unwrap().is_empty());
        let a = store.remove("a").unwrap();
        let gone = store.removed_since(&mut known).unwrap();
        assert_eq!(gone.len(), 1);
        assert_eq!(
            (gone[0].id.as_str(), gone[0].name.as_str()),
            (a.id.as_str(), "a")
        );
        assert!(store.removed_since(&mut known).unwrap().is_empty());
        // A server started after the removal learns of it from the file.
        let mut fresh = std::collections::BTreeMap::new();
        let gone = store.removed_since(&mut fresh).unwrap();
        assert_eq!(gone.len(), 1, "{gone:?}");
        assert_eq!(gone[0].datastore, "main");
        // An entry deleted by hand is noticed by a server that knew it.
        let path = dir.path().join("tokens.json");
        let mut v: serde_json::Value =
            serde_json::from_slice(&std::fs::read(&path).unwrap()).unwrap();
        v["tokens"]
            .as_array_mut()
            .unwrap()
            .retain(|t| t["name"] != "b");
        std::fs::write(&path, serde_json::to_vec(&v).unwrap()).unwrap();
        let gone = store.removed_since(&mut known).unwrap();
        assert_eq!(gone.len(), 1, "{gone:?}");
        assert_eq!(
            (gone[0].id.as_str(), gone[0].datastore.as_str()),
            (b.id.as_str(), "*")
        );
        assert!(store.removed_since(&mut known).unwrap().is_empty());
        // The other server knew it too; "a" it had already.
        let gone = store.removed_since(&mut fresh).unwrap();
        assert_eq!(gone.len(), 1, "{gone:?}");
        assert_eq!(gone[0].id, b.id);
        assert!(store.removed_since(&mut fresh).unwrap().is_empty());
    }

    /// A newer file, or an entry with a field this cairn does not know, fails
    /// closed: no token of it opens anything, and nothing is written over it.
    #[test]
    fn a_newer_token_file_is_refused() {
        let dir = tempfile::tempdir().unwrap();
        let store = TokenStore::new(dir.path());
        let (_, token) = store
            .add("web01", "main", Role::Backup, None, None)
            .unwrap();
        let path = dir.path().join("tokens.json");
        let good = std::fs::read_to_string(&path).unwrap();
        assert!(store.authenticate(&token).unwrap().is_some());
        for bad in [
            good.replace("\"version\": 1", "\"version\": 99"),
            good.replace("\"role\":", "\"scope\": \"all\", \"role\":"),
        ] {
            assert_ne!(bad, good);
            std::fs::write(&path, &bad).unwrap();
            let store = TokenStore::new(dir.path());
            assert!(store.authenticate(&token).is_err(), "{bad}");
            assert!(
                store
                    .add("web02", "main", Role::Backup, None, None)
                    .is_err()
            );
            assert_eq!(std::fs::read_to_string(&path).unwrap(), bad);
        }
    }

    /// A token opens until its expiry, and is then refused as expired; an
    /// expiry that cannot be read counts as over (failing closed), and one in
    /// the past is not taken.
    #[test]
    fn a_token_expires() {
        let dir = tempfile::tempdir().unwrap();
        let store = TokenStore::new(dir.path());
        let soon = cairn_core::time::format_unix(cairn_core::time::now_unix() + 3600, 0);
        let (_, token) = store
            .add("t", "main", Role::Restore, None, Some(soon.clone()))
            .unwrap();
        assert!(store.authenticate(&token).unwrap().is_some());
        let path = store.path().to_path_buf();
        let text = std::fs::read_to_string(&path).unwrap();
        for over in ["2020-01-01T00:00:00Z", "not a time"] {
            std::fs::write(&path, text.replace(&soon, over)).unwrap();
            let store = TokenStore::new(dir.path());
            match store.authenticate(&token) {
                Err(TokenError::Expired { name, .. }) => assert_eq!(name, "t"),
                other => panic!("{over}: {other:?}"),
            }
        }
        let past = "2020-01-01T00:00:00Z".to_string();
        assert!(
            store
                .add("u", "main", Role::Restore, None, Some(past))
                .is_err()
        );
    }

    #[test]
    fn add_authenticate_remove() {
        let dir = tempfile::tempdir().unwrap();
        let store = TokenStore::new(dir.path());
        let (e, token) = store
            .add("web01", "main", Role::Backup, Some("web01"), None)
            .unwrap();
        assert_eq!(store.authenticate(&token).unwrap().unwrap(), e);
        let text = std::fs::read_to_string(store.path()).unwrap();
        assert!(
            !text.contains(token.rsplit('_').next().unwrap()),
            "secret stored"
        );
        // A wrong secret with the right id, garbage, and a near miss.
        let mut wrong = token.clone();
        wrong.pop();
        wrong.push(if token.ends_with('0') { '1' } else { '0' });
        assert!(store.authenticate(&wrong).unwrap().is_none());
        assert!(store.authenticate("nonsense").unwrap().is_none());
        assert!(store.add("web01", "main", Role::Admin, None, None).is_err());
        // A blank host binds to nothing.
        for bad in ["", " ", "a\nb"] {
            assert!(
                store
                    .add("blank", "main", Role::Backup, Some(bad), None)
                    .is_err()
            );
        }
        // A second store (another process) removes it; the first one notices.
        let other = TokenStore::new(dir.path());
        std::thread::sleep(std::time::Duration::from_millis(20));
        other.remove("web01").unwrap();
        assert!(store.authenticate(&token).unwrap().is_none());
        assert!(store.remove("web01").is_err());
    }

    #[test]
    fn a_damaged_file_is_an_error_not_an_open_door() {
        let dir = tempfile::tempdir().unwrap();
        let store = TokenStore::new(dir.path());
        std::fs::write(store.path(), b"{not json").unwrap();
        let e = store
            .authenticate(&format!("cairn_{}_{}", "0".repeat(16), "0".repeat(64)))
            .unwrap_err();
        assert!(e.to_string().contains("damaged"), "{e}");
    }
}
