//! Lock objects: `locks/<id>`, sealed JSON. Unlike other objects a lock's name is a
//! random id chosen by its holder, and the holder rewrites it in place to show it is
//! alive (`refreshed`). Locks never block backups; they tell prune which operations
//! may still use blobs it is about to delete, and keep two prunes apart.

use crate::consts::MAX_SMALL_OBJECT_SIZE;
use crate::error::{FormatError, Result, check_version};
use crate::json::check_json_version;
use serde::{Deserialize, Serialize};

/// Lock version written and read by this code.
pub const LOCK_VERSION: u32 = 1;

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
        if data.len() > MAX_SMALL_OBJECT_SIZE {
            return Err(FormatError::TooLarge {
                what: "lock",
                size: data.len() as u64,
                limit: MAX_SMALL_OBJECT_SIZE as u64,
            });
        }
        // The version first: a newer lock may change any other member.
        check_json_version("lock", data, LOCK_VERSION)?;
        let l: Lock = serde_json::from_slice(data)
            .map_err(|e| FormatError::malformed("lock", e.to_string()))?;
        check_version("lock", l.version.into(), 1, LOCK_VERSION.into())?;
        Ok(l)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn lock(operation: String, exclusive: bool, pid: u32, refreshed: i64) -> Lock {
        Lock {
            version: LOCK_VERSION,
            operation,
            exclusive,
            hostname: "h".into(),
            username: "u".into(),
            pid,
            boot_id: "b".into(),
            pid_namespace: "ns".into(),
            created: "2026-11-22T01:02:03Z".into(),
            refreshed,
        }
    }

    proptest! {
        #[test]
        fn round_trip(op in ".*", exclusive: bool, pid: u32, refreshed: i64) {
            let l = lock(op, exclusive, pid, refreshed);
            prop_assert_eq!(Lock::from_bytes(&l.to_bytes()).unwrap(), l);
        }

        #[test]
        fn decode_never_panics(data: Vec<u8>) {
            let _ = Lock::from_bytes(&data);
        }
    }

    #[test]
    fn unknown_members_are_ignored_and_old_locks_lack_machine_fields() {
        let l = lock("backup".into(), false, 7, 1);
        let text = String::from_utf8(l.to_bytes()).unwrap();
        let more = text.replacen('{', r#"{"zz_new":[{}],"#, 1);
        assert_eq!(Lock::from_bytes(more.as_bytes()).unwrap(), l);
        let old = r#"{"version":1,"operation":"read","exclusive":false,"hostname":"h","username":"u","pid":1,"created":"c","refreshed":5}"#;
        let back = Lock::from_bytes(old.as_bytes()).unwrap();
        assert_eq!(back.boot_id, "");
    }

    #[test]
    fn a_newer_lock_says_upgrade() {
        let err = Lock::from_bytes(br#"{"version":3,"exclusive":"maybe"}"#).unwrap_err();
        assert!(
            matches!(err, FormatError::NewerVersion { version: 3, .. }),
            "{err}"
        );
    }
}
