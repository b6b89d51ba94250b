//! cairn-core: the engine. It never prints, parses arguments or exits: operations take
//! `XxxOptions`, report through the traits in [`progress`], and return values or a
//! typed [`Error`].

pub mod backup;
pub mod blob;
pub mod chunklist;
pub mod copy;
pub mod error;
pub mod estimate;
pub mod index;
pub mod lock;
pub mod machine;
pub mod packer;
pub mod progress;
pub mod prune;
pub mod reachable;
pub mod repair;
pub mod repo;
pub mod ssd;
pub mod stats;
pub mod time;
pub mod units;

#[cfg(test)]
mod testutil;

pub use error::{Error, Result};
pub use repo::{InitOptions, Repository};
pub mod check;
pub mod dump;
pub mod forget;
pub mod ls;
pub mod restore;

/// Locks a mutex whether or not a thread panicked while holding it: every mutex in
/// the engine guards data that stays consistent between statements.
pub(crate) fn lock<T>(m: &std::sync::Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}
