//! Which host a snapshot belongs to, for tokens bound to a host (`token add --host`).
//!
//! The server cannot read a snapshot's host name (it is sealed), so when a
//! host-bound token stores a snapshot, the server first stores `hosts/<snapshot id>`
//! holding the token's host, in the datastore (so every server fronting it agrees).
//! A host-bound token lists and reads only snapshots recorded for its host; others
//! are absent to it. This is visibility, not cryptographic isolation: the client
//! holds the datastore's key and packs are shared by deduplication (docs/SERVER.md).

use cairn_backend::{Backend, BackendError, ObjectInfo, names};
use std::collections::HashMap;
use std::sync::Mutex;

pub const PREFIX: &str = names::HOSTS;
/// Host names are short; a record is refused beyond this.
const MAX_RECORD: u64 = 255;

/// Records read so far (they are create-only, so a cached one never changes).
#[derive(Default)]
pub struct HostRecords {
    cache: Mutex<HashMap<String, String>>,
}

fn record_name(snapshot_hex: &str) -> String {
    names::host_record(snapshot_hex)
}

impl HostRecords {
    /// Records `host` for a snapshot about to be stored (blocking). A record that
    /// exists for another host refuses the snapshot (its id is taken by another
    /// host's identical snapshot, which only a replay could produce).
    pub fn record(
        &self,
        backend: &dyn Backend,
        snapshot_hex: &str,
        host: &str,
    ) -> Result<bool, BackendError> {
        match backend.put_new(&record_name(snapshot_hex), host.as_bytes()) {
            Ok(()) => {}
            Err(e) if e.is_already_exists() => {
                return Ok(self.host_of(backend, snapshot_hex)?.as_deref() == Some(host));
            }
            Err(e) => return Err(e),
        }
        self.cache()
            .insert(snapshot_hex.to_string(), host.to_string());
        Ok(true)
    }

    fn cache(&self) -> std::sync::MutexGuard<'_, HashMap<String, String>> {
        self.cache.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// The host recorded for a snapshot, if any (blocking).
    pub fn host_of(
        &self,
        backend: &dyn Backend,
        snapshot_hex: &str,
    ) -> Result<Option<String>, BackendError> {
        if let Some(h) = self.cache().get(snapshot_hex) {
            return Ok(Some(h.clone()));
        }
        let data = match backend.get_bounded(&record_name(snapshot_hex), MAX_RECORD) {
            Ok(d) => d,
            Err(e) if e.is_not_found() => return Ok(None),
            Err(e) => return Err(e),
        };
        let host = String::from_utf8_lossy(&data).into_owned();
        self.cache().insert(snapshot_hex.to_string(), host.clone());
        Ok(Some(host))
    }

    /// A listing with every snapshot not recorded for `host` left out, and the
    /// records themselves too (blocking).
    pub fn filter(
        &self,
        backend: &dyn Backend,
        listed: Vec<ObjectInfo>,
        host: &str,
    ) -> Result<Vec<ObjectInfo>, BackendError> {
        let mut out = Vec::with_capacity(listed.len());
        for o in listed {
            // The prefixes of `Kind::snapshot_record`, by prefix rather than by
            // kind so that a malformed name under them is left out too.
            if o.name.starts_with(PREFIX)
                || o.name.starts_with(names::RECEIVED)
                || o.name.starts_with(names::FORGOTTEN)
            {
                continue;
            }
            if let Some(id) = o.name.strip_prefix(names::SNAPSHOTS)
                && self.host_of(backend, id)?.as_deref() != Some(host)
            {
                continue;
            }
            out.push(o);
        }
        Ok(out)
    }

    /// Removes a deleted snapshot's record (blocking; a missing one is fine).
    pub fn forget(&self, backend: &dyn Backend, snapshot_hex: &str) -> Result<(), BackendError> {
        self.cache().remove(snapshot_hex);
        match backend.delete(&record_name(snapshot_hex)) {
            Err(e) if !e.is_not_found() => Err(e),
            _ => Ok(()),
        }
    }
}

/// Records that the snapshot `snapshot_hex` arrives now (Unix seconds to the
/// nanosecond by this server's clock; blocking). One already recorded is kept:
/// the first arrival counts (docs/FORMAT.md, "received/"). Whole seconds told
/// two snapshots stored within one second apart from neither (QA r35: junk dated
/// into a past day, stored in the same second as the real backup, took that
/// day's slot).
pub fn record_received(backend: &dyn Backend, snapshot_hex: &str) -> Result<(), BackendError> {
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap_or_default();
    let record = format!("{}.{:09}", now.as_secs(), now.subsec_nanos());
    match backend.put_new(&names::received_record(snapshot_hex), record.as_bytes()) {
        Err(e) if !e.is_already_exists() => Err(e),
        _ => Ok(()),
    }
}

/// Removes a deleted snapshot's receive record (blocking; a missing one is fine).
pub fn forget_received(backend: &dyn Backend, snapshot_hex: &str) -> Result<(), BackendError> {
    match backend.delete(&names::received_record(snapshot_hex)) {
        Err(e) if !e.is_not_found() => Err(e),
        _ => Ok(()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use cairn_backend::MemBackend;

    #[test]
    fn listings_show_a_host_only_its_snapshots() {
        let b = MemBackend::new();
        let r = HostRecords::default();
        for (id, host) in [("aa", "web01"), ("bb", "web02")] {
            assert!(r.record(&b, id, host).unwrap());
            b.put_new(&names::snapshot(id), b"x").unwrap();
        }
        b.put_new(&names::snapshot("cc"), b"x").unwrap(); // no record: an admin's
        assert!(!r.record(&b, "aa", "web02").unwrap(), "taken by web01");
        let fresh = HostRecords::default(); // another server: reads the records
        let names = |host| {
            fresh
                .filter(&b, b.list("").unwrap(), host)
                .unwrap()
                .into_iter()
                .map(|o| o.name)
                .collect::<Vec<_>>()
        };
        record_received(&b, "aa").unwrap();
        assert_eq!(names("web01"), vec!["snapshots/aa".to_string()]);
        assert_eq!(names("web02"), vec!["snapshots/bb".to_string()]);
        r.forget(&b, "aa").unwrap();
        assert_eq!(r.host_of(&b, "aa").unwrap(), None);
    }
}
