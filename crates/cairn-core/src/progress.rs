//! How long operations report progress without printing: the CLI implements these
//! traits (a terminal display, or nothing in scripts). All methods have empty
//! defaults and are called from engine threads, so implementations use atomics.

use std::path::Path;

pub trait BackupProgress: Send + Sync {
    /// A regular file is about to be read.
    fn file_started(&self, _path: &Path) {}
    /// Bytes of file content read (or skipped as unchanged).
    fn bytes_done(&self, _n: u64) {}
    /// A file, directory or other entry has been recorded.
    fn entry_done(&self) {}
    /// An entry could not be read and is left out of the snapshot.
    fn warning(&self, _path: &Path, _message: &str) {}
}

pub trait RestoreProgress: Send + Sync {
    fn bytes_done(&self, _n: u64) {}
    fn entry_done(&self) {}
    fn warning(&self, _path: &Path, _message: &str) {}
}

pub trait EstimateProgress: Send + Sync {
    /// The walk found `files` regular files holding `bytes`.
    fn walked(&self, _files: u64, _bytes: u64) {}
    fn bytes_done(&self, _n: u64) {}
    fn file_done(&self) {}
    fn warning(&self, _path: &Path, _message: &str) {}
}

/// Reports nothing.
pub struct NoProgress;
impl BackupProgress for NoProgress {}
impl RestoreProgress for NoProgress {}
impl EstimateProgress for NoProgress {}
