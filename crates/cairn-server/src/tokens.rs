//! Access tokens, kept hashed in the server's state directory (`tokens.json`).
//!
//! A token is `cairn_<id>_<secret>`: the 8-byte id finds the entry, the 32-byte
//! secret is compared through its BLAKE3 hash (constant time), and only the hash is
//! stored. The secret is random, so a fast hash is enough (nothing to brute-force).
//! The file is read again when it changes, so `cairn serve token add/remove` take
//! effect in a running server without a restart.

use crate::policy::Role;
use serde::{Deserialize, Serialize};
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::SystemTime;

#[derive(Debug, thiserror::Error)]
pub enum TokenError {
    #[error("cannot read the token file {path}: {message}")]
    Read { path: PathBuf, message: String },
    #[error("cannot write the token file {path}: {message}")]
    Write { path: PathBuf, message: String },
    #[error("the token file {path} is damaged: {message}")]
    Damaged { path: PathBuf, message: String },
    #[error("{0}")]
    Invalid(String),
}

/// One stored token (never the secret itself).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct TokenEntry {
    /// 16 hex digits, the public part of the token.
    pub id: String,
    /// A name for people ("web01-backup").
    pub name: String,
    /// The datastore it opens.
    pub datastore: String,
    pub role: Role,
    /// When set, the host the token backs up or restores: it sees only snapshots
    /// it stored itself, recorded by the server as this host's (`hosts`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub host: Option<String>,
    /// BLAKE3 of the secret, hex.
    pub hash: String,
    pub created: String,
}

#[derive(Default, Serialize, Deserialize)]
struct TokenFile {
    version: u32,
    tokens: Vec<TokenEntry>,
}

/// The token file, re-read when its modification time or size changes.
pub struct TokenStore {
    path: PathBuf,
    /// The entries as last read, with the file's time and size then (shared, not
    /// copied, by every request).
    cache: Mutex<Option<Cached>>,
}

/// Modification time, size, entries.
type Cached = (SystemTime, u64, Arc<Vec<TokenEntry>>);

fn random<const N: usize>() -> [u8; N] {
    cairn_format::envelope::random_bytes()
}

impl TokenStore {
    pub fn new(state_dir: &Path) -> TokenStore {
        TokenStore {
            path: state_dir.join("tokens.json"),
            cache: Mutex::new(None),
        }
    }

    pub fn path(&self) -> &Path {
        &self.path
    }

    fn read_file(&self) -> Result<Vec<TokenEntry>, TokenError> {
        let data = match std::fs::read(&self.path) {
            Ok(d) => d,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(Vec::new()),
            Err(e) => {
                return Err(TokenError::Read {
                    path: self.path.clone(),
                    message: e.to_string(),
                });
            }
        };
        let file: TokenFile = serde_json::from_slice(&data).map_err(|e| TokenError::Damaged {
            path: self.path.clone(),
            message: e.to_string(),
        })?;
        Ok(file.tokens)
    }

    /// Every token, from the file as it is now.
    pub fn list(&self) -> Result<Vec<TokenEntry>, TokenError> {
        self.read_file()
    }

    /// The entries, read again only if the file changed since the last call.
    fn current(&self) -> Result<Arc<Vec<TokenEntry>>, TokenError> {
        let meta = match std::fs::metadata(&self.path) {
            Ok(m) => Some((m.modified().unwrap_or(SystemTime::UNIX_EPOCH), m.len())),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => None,
            Err(e) => {
                return Err(TokenError::Read {
                    path: self.path.clone(),
                    message: e.to_string(),
                });
            }
        };
        let mut cache = self.cache.lock().unwrap_or_else(|e| e.into_inner());
        let Some((mtime, len)) = meta else {
            *cache = None;
            return Ok(Arc::default());
        };
        if let Some((m, l, entries)) = cache.as_ref()
            && *m == mtime
            && *l == len
        {
            return Ok(entries.clone());
        }
        let entries = Arc::new(self.read_file()?);
        *cache = Some((mtime, len, entries.clone()));
        Ok(entries)
    }

    /// The entry a presented token belongs to, if any.
    pub fn authenticate(&self, presented: &str) -> Result<Option<TokenEntry>, TokenError> {
        let Some((id, secret)) = parse(presented) else {
            return Ok(None);
        };
        let hash = blake3::hash(secret.as_bytes());
        for e in self.current()?.iter() {
            if e.id == id {
                let Ok(stored) = blake3::Hash::from_hex(&e.hash) else {
                    continue;
                };
                // blake3::Hash compares in constant time.
                if stored == hash {
                    return Ok(Some(e.clone()));
                }
            }
        }
        Ok(None)
    }

    fn write_file(&self, tokens: Vec<TokenEntry>) -> Result<(), TokenError> {
        let werr = |e: std::io::Error| TokenError::Write {
            path: self.path.clone(),
            message: e.to_string(),
        };
        if let Some(dir) = self.path.parent() {
            std::fs::create_dir_all(dir).map_err(werr)?;
        }
        let body = serde_json::to_vec_pretty(&TokenFile { version: 1, tokens })
            .map_err(|e| TokenError::Invalid(e.to_string()))?;
        let tmp = self
            .path
            .with_extension(format!("tmp-{}", std::process::id()));
        {
            use std::io::Write;
            use std::os::unix::fs::OpenOptionsExt;
            let mut f = std::fs::OpenOptions::new()
                .write(true)
                .create(true)
                .truncate(true)
                .mode(0o600)
                .open(&tmp)
                .map_err(werr)?;
            f.write_all(&body).map_err(werr)?;
            f.sync_all().map_err(werr)?;
        }
        std::fs::rename(&tmp, &self.path).map_err(werr)?;
        Ok(())
    }

    /// Adds a token and returns it with its secret (shown once, never stored).
    pub fn add(
        &self,
        name: &str,
        datastore: &str,
        role: Role,
        host: Option<&str>,
    ) -> Result<(TokenEntry, String), TokenError> {
        if name.is_empty() || name.len() > 200 || name.chars().any(char::is_control) {
            return Err(TokenError::Invalid(
                "a token name must be 1-200 printable characters".into(),
            ));
        }
        let mut tokens = self.read_file()?;
        if tokens.iter().any(|t| t.name == name) {
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
        };
        tokens.push(entry.clone());
        self.write_file(tokens)?;
        Ok((entry, format!("cairn_{id}_{secret}")))
    }

    /// Removes the token with this name or id; returns it.
    pub fn remove(&self, name_or_id: &str) -> Result<TokenEntry, TokenError> {
        let mut tokens = self.read_file()?;
        let Some(pos) = tokens
            .iter()
            .position(|t| t.name == name_or_id || t.id == name_or_id)
        else {
            return Err(TokenError::Invalid(format!(
                "no token named {name_or_id:?}"
            )));
        };
        let removed = tokens.remove(pos);
        self.write_file(tokens)?;
        Ok(removed)
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

    #[test]
    fn add_authenticate_remove() {
        let dir = tempfile::tempdir().unwrap();
        let store = TokenStore::new(dir.path());
        let (e, token) = store
            .add("web01", "main", Role::Backup, Some("web01"))
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
        assert!(store.add("web01", "main", Role::Admin, None).is_err());
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
