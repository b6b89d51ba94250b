//! Lock objects: `locks/<id>`, sealed JSON. Unlike other objects a lock's name is a
//! random id chosen by its holder, and the holder rewrites it in place to show it is
//! alive (`refreshed`). Locks never block backups; they tell prune which operations
//! may still use blobs it is about to delete, and keep two prunes apart.

use crate::consts::MAX_METADATA_OBJECT_SIZE;
use crate::error::{FormatError, Result};
use serde::{Deserialize, Serialize};

#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Lock {
    pub version: u32,
    /// What holds it: "backup", "read", "prune", "repair", ...
    pub operation: String,
    /// Exclusive locks exclude each other (one prune or repair at a time); they never
    /// exclude shared ones.
    pub exclusive: bool,
    pub hostname: String,
    pub username: String,
    pub pid: u32,
    /// Lets a process on the same machine tell for sure whether the holder still
    /// runs: same boot and same pid namespace means `pid` is comparable.
    #[serde(default)]
    pub boot_id: String,
    #[serde(default)]
    pub pid_namespace: String,
    /// RFC 3339, UTC.
    pub created: String,
    /// Unix seconds of the last refresh.
    pub refreshed: i64,
}

impl Lock {
    pub fn to_bytes(&self) -> Vec<u8> {
        #[allow(clippy::expect_used)]
        serde_json::to_vec(self).expect("lock serialises")
    }

    pub fn from_bytes(data: &[u8]) -> Result<Self> {
        if data.len() > MAX_METADATA_OBJECT_SIZE {
            return Err(FormatError::TooLarge {
                what: "lock",
                size: data.len() as u64,
                limit: MAX_METADATA_OBJECT_SIZE as u64,
            });
        }
        let l: Lock = serde_json::from_slice(data)
            .map_err(|e| FormatError::malformed("lock", e.to_string()))?;
        if l.version != 1 {
            return Err(FormatError::UnsupportedVersion {
                what: "lock",
                version: l.version,
            });
        }
        Ok(l)
    }
}
