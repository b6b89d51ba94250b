//! Storage backends. The trait has only object-store operations — put a whole object,
//! get, get a range, list, delete — so that S3-compatible storage fits without any
//! change to the engine. Object names are `/`-separated relative paths such as
//! `data/3f/3f…` or `snapshots/ab…`.
//!
//! Contract every backend keeps:
//! - `put` is atomic: a reader sees either no object or the whole object, never a part
//!   (local: write a temporary file, fsync, rename, fsync the directory).
//! - once `put` returns, the object survives a crash of this machine.
//! - a missing object is [`BackendErrorKind::NotFound`], never an empty read.

pub mod direct;
mod local;
mod mem;
pub mod process;

pub use local::LocalBackend;
pub use mem::MemBackend;

use std::fmt;

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum BackendErrorKind {
    NotFound,
    /// The medium is full (ENOSPC, EDQUOT).
    NoSpace,
    PermissionDenied,
    /// A transient failure that may succeed when retried.
    Transient,
    Other,
}

#[derive(Debug, thiserror::Error)]
#[error("{op} {path}: {message}")]
pub struct BackendError {
    pub kind: BackendErrorKind,
    pub op: &'static str,
    pub path: String,
    pub message: String,
}

impl BackendError {
    pub fn not_found(op: &'static str, path: &str) -> Self {
        BackendError {
            kind: BackendErrorKind::NotFound,
            op,
            path: path.to_string(),
            message: "object not found".into(),
        }
    }
    pub fn from_io(op: &'static str, path: &str, e: &std::io::Error) -> Self {
        let kind = match e.kind() {
            std::io::ErrorKind::NotFound => BackendErrorKind::NotFound,
            std::io::ErrorKind::PermissionDenied => BackendErrorKind::PermissionDenied,
            std::io::ErrorKind::StorageFull | std::io::ErrorKind::QuotaExceeded => {
                BackendErrorKind::NoSpace
            }
            std::io::ErrorKind::Interrupted | std::io::ErrorKind::TimedOut => {
                BackendErrorKind::Transient
            }
            _ => BackendErrorKind::Other,
        };
        let message = match kind {
            BackendErrorKind::NoSpace => "no space left on the repository's device".to_string(),
            _ => e.to_string(),
        };
        BackendError {
            kind,
            op,
            path: path.to_string(),
            message,
        }
    }
    pub fn is_not_found(&self) -> bool {
        self.kind == BackendErrorKind::NotFound
    }
}

pub type Result<T, E = BackendError> = std::result::Result<T, E>;

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ObjectInfo {
    /// Full object name, e.g. `index/ab…`.
    pub name: String,
    pub size: u64,
}

pub trait Backend: Send + Sync + fmt::Debug {
    /// Human-readable location for messages.
    fn location(&self) -> String;
    /// Stores a whole object atomically, replacing any object of that name.
    fn put(&self, name: &str, data: &[u8]) -> Result<()>;
    fn get(&self, name: &str) -> Result<Vec<u8>>;
    /// Reads `length` bytes at `offset`; a range past the end is an error, never short.
    fn get_range(&self, name: &str, offset: u64, length: u64) -> Result<Vec<u8>>;
    /// Every object whose name starts with `prefix` (a directory such as `index/`).
    fn list(&self, prefix: &str) -> Result<Vec<ObjectInfo>>;
    fn delete(&self, name: &str) -> Result<()>;

    /// Removes partial objects that interrupted writers left behind (a killed
    /// process's temporary files) and returns the bytes freed. Only leftovers whose
    /// writer is known to be gone are touched. Nothing to do for most backends.
    fn remove_stale_temporaries(&self) -> Result<u64> {
        Ok(0)
    }
}

/// The names the repository uses, so no other module formats paths.
pub mod names {
    pub const CONFIG: &str = "config";
    pub const KEYS: &str = "keys/";
    pub const DATA: &str = "data/";
    pub const INDEX: &str = "index/";
    pub const SNAPSHOTS: &str = "snapshots/";
    pub const LOCKS: &str = "locks/";
    pub const PENDING: &str = "pending/";

    /// `data/<first two hex digits>/<hex>`: 256 directories keep listings short.
    pub fn pack(hex: &str) -> String {
        format!("data/{}/{}", &hex[..2.min(hex.len())], hex)
    }
    pub fn index(hex: &str) -> String {
        format!("index/{hex}")
    }
    pub fn snapshot(hex: &str) -> String {
        format!("snapshots/{hex}")
    }
    pub fn lock(hex: &str) -> String {
        format!("locks/{hex}")
    }
    pub fn pending(hex: &str) -> String {
        format!("pending/{hex}")
    }
    pub fn key(hex: &str) -> String {
        format!("keys/{hex}")
    }
    /// The last path component of an object name.
    pub fn base(name: &str) -> &str {
        name.rsplit('/').next().unwrap_or(name)
    }
}

#[cfg(test)]
pub(crate) mod conformance {
    //! Behaviour every backend must show; run against each implementation.
    use super::*;

    pub fn run(b: &dyn Backend) {
        assert!(b.get("config").unwrap_err().is_not_found());
        assert!(
            b.get_range("data/ab/abcd", 0, 1)
                .unwrap_err()
                .is_not_found()
        );
        b.put("config", b"hello").unwrap();
        assert_eq!(b.get("config").unwrap(), b"hello");
        b.put("config", b"replaced").unwrap();
        assert_eq!(b.get("config").unwrap(), b"replaced");
        b.put("data/ab/abcd", &[1, 2, 3, 4, 5]).unwrap();
        b.put("data/cd/cdef", &[9; 1000]).unwrap();
        assert_eq!(b.get_range("data/ab/abcd", 1, 3).unwrap(), vec![2, 3, 4]);
        assert!(b.get_range("data/ab/abcd", 3, 5).is_err());
        let mut l = b.list("data/").unwrap();
        l.sort_by(|a, b| a.name.cmp(&b.name));
        assert_eq!(
            l,
            vec![
                ObjectInfo {
                    name: "data/ab/abcd".into(),
                    size: 5
                },
                ObjectInfo {
                    name: "data/cd/cdef".into(),
                    size: 1000
                },
            ]
        );
        assert!(b.list("index/").unwrap().is_empty());
        b.delete("data/ab/abcd").unwrap();
        assert!(b.get("data/ab/abcd").unwrap_err().is_not_found());
        assert!(b.delete("data/ab/abcd").unwrap_err().is_not_found());
        assert_eq!(b.list("data/").unwrap().len(), 1);
        let big = vec![7u8; 40 << 20];
        b.put("data/ef/big", &big).unwrap();
        assert_eq!(b.get("data/ef/big").unwrap().len(), big.len());
        assert_eq!(
            b.get_range("data/ef/big", (40 << 20) - 2, 2).unwrap(),
            vec![7, 7]
        );
    }
}
