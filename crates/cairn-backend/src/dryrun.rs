//! The storage of a dry run (`backup --dry-run`): everything is read as usual and
//! nothing is stored, so the run goes through every step of the real one
//! (reading, chunking, deduplication against the index, compression and
//! encryption) and says what it would have added.

use crate::{Backend, ObjectInfo, Result, names};
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

/// Passes reads and locks through to `inner` and drops every other write.
///
/// Locks are still taken (a dry run reads the index and must not see it pruned
/// under it, as the real run would not). The server's dedup queries are not
/// used: they would announce chunks this client never sends, so the whole index
/// is read instead, as for storage without the service.
#[derive(Debug)]
pub struct DryRunBackend {
    inner: Arc<dyn Backend>,
    dropped_bytes: AtomicU64,
    dropped_objects: AtomicU64,
}

impl DryRunBackend {
    pub fn new(inner: Arc<dyn Backend>) -> Self {
        DryRunBackend {
            inner,
            dropped_bytes: AtomicU64::new(0),
            dropped_objects: AtomicU64::new(0),
        }
    }

    /// Bytes and objects the run would have stored.
    pub fn dropped(&self) -> (u64, u64) {
        (
            self.dropped_bytes.load(Ordering::Relaxed),
            self.dropped_objects.load(Ordering::Relaxed),
        )
    }

    /// Whether a write of `name` goes through: only locks.
    fn passes(name: &str) -> bool {
        name.starts_with(names::LOCKS)
    }

    fn drop_write(&self, data: &[u8]) -> Result<()> {
        self.dropped_bytes
            .fetch_add(data.len() as u64, Ordering::Relaxed);
        self.dropped_objects.fetch_add(1, Ordering::Relaxed);
        Ok(())
    }
}

impl Backend for DryRunBackend {
    fn location(&self) -> String {
        self.inner.location()
    }
    fn put(&self, name: &str, data: &[u8]) -> Result<()> {
        if Self::passes(name) {
            return self.inner.put(name, data);
        }
        self.drop_write(data)
    }
    fn put_new(&self, name: &str, data: &[u8]) -> Result<()> {
        if Self::passes(name) {
            return self.inner.put_new(name, data);
        }
        self.drop_write(data)
    }
    fn put_metadata_new(&self, name: &str, data: &[u8]) -> Result<()> {
        if Self::passes(name) {
            return self.inner.put_metadata_new(name, data);
        }
        self.drop_write(data)
    }
    fn get(&self, name: &str) -> Result<Vec<u8>> {
        self.inner.get(name)
    }
    fn get_bounded(&self, name: &str, max: u64) -> Result<Vec<u8>> {
        self.inner.get_bounded(name, max)
    }
    fn size(&self, name: &str) -> Result<u64> {
        self.inner.size(name)
    }
    fn get_range(&self, name: &str, offset: u64, length: u64) -> Result<Vec<u8>> {
        self.inner.get_range(name, offset, length)
    }
    fn get_range_into(
        &self,
        name: &str,
        offset: u64,
        length: u64,
        out: &mut crate::bufpool::Pooled,
    ) -> Result<()> {
        self.inner.get_range_into(name, offset, length, out)
    }
    fn get_metadata_range(&self, name: &str, offset: u64, length: u64) -> Result<Vec<u8>> {
        self.inner.get_metadata_range(name, offset, length)
    }
    fn list(&self, prefix: &str) -> Result<Vec<ObjectInfo>> {
        self.inner.list(prefix)
    }
    /// Only the run's own locks are removed; nothing else a backup would delete.
    fn delete(&self, name: &str) -> Result<()> {
        if Self::passes(name) {
            return self.inner.delete(name);
        }
        Ok(())
    }
    fn lock_owner_prefix(&self) -> Option<[u8; 8]> {
        self.inner.lock_owner_prefix()
    }
    fn discards_writes(&self) -> bool {
        true
    }
    fn clock_skew(&self) -> Option<i64> {
        self.inner.clock_skew()
    }
    fn may_remove(&self) -> Result<bool> {
        self.inner.may_remove()
    }
    fn bound_host(&self) -> Result<Option<String>> {
        self.inner.bound_host()
    }
    fn partial_view(&self) -> Result<Option<String>> {
        self.inner.partial_view()
    }
    fn job_slot(&self, operation: &str, host: &str) -> Result<crate::JobSlot> {
        self.inner.job_slot(operation, host)
    }
    fn report_job_progress(&self, report: crate::JobReport) {
        self.inner.report_job_progress(report)
    }
    fn release_job_slot(&self) {
        self.inner.release_job_slot()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::MemBackend;

    #[test]
    fn only_locks_are_written_and_reads_pass() {
        let mem = Arc::new(MemBackend::new());
        mem.put_new("snapshots/aa", b"old").unwrap();
        let d = DryRunBackend::new(mem.clone());
        d.put_new("data/ab/abcd", b"pack").unwrap();
        d.put_metadata_new("data/cd/cdef", b"trees").unwrap();
        d.put_new("index/1234", b"index").unwrap();
        d.put_new("snapshots/bb", b"snap").unwrap();
        d.put("config", b"cfg").unwrap();
        d.delete("snapshots/aa").unwrap();
        d.put_new("locks/77", b"lock").unwrap();
        assert_eq!(d.get("snapshots/aa").unwrap(), b"old");
        let stored: Vec<String> = mem.list("").unwrap().into_iter().map(|o| o.name).collect();
        assert_eq!(stored, ["locks/77", "snapshots/aa"]);
        assert_eq!(d.dropped(), (4 + 5 + 5 + 4 + 3, 5));
        d.delete("locks/77").unwrap();
        assert!(mem.get("locks/77").is_err());
        // No dedup service through a dry run, whatever the storage offers.
        assert!(d.dedup_plan().unwrap().is_none());
    }
}
