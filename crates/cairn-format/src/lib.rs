//! cairn-format: the repository's bytes and the types they mean, with no I/O.
//!
//! Every decoder here treats its input as hostile: lengths are checked against the
//! remaining input and against the hard caps in [`consts`] before anything is
//! allocated, and every failure is a [`FormatError`], never a panic. The normative
//! description of each object is `docs/FORMAT.md`; each module names its section.

pub mod config;
pub mod consts;
pub mod dedup;
pub mod envelope;
pub mod error;
#[cfg(test)]
mod fuzz;
pub mod id;
pub mod index;
pub mod json;
pub mod key;
pub mod lock;
pub mod pack;
pub mod pending;
pub mod snapshot;
pub mod tree;
pub mod wire;

pub use error::{FormatError, Result};
pub use id::{BlobId, IndexId, KeyId, PackId, PendingId, RepoId, SnapshotId};
