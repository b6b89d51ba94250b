//! cairn-core: the engine. It never prints, parses arguments or exits: operations take
//! `XxxOptions` and a [`Session`] of the kind they need, report through
//! [`progress`] (events out, cancellation in), and return typed reports or a typed
//! [`Error`].
//!
//! The engine is blocking: an operation runs on the calling thread and threads of
//! its own, and returns when it is done. An async caller (the server) runs it
//! through `tokio::task::spawn_blocking`; the S3 backend keeps a runtime of its own
//! and works from such threads (tested: `session::tests`).
//!
//! Layers (each may use the ones below it, never the ones above):
//!
//! - [`ops`]: the operations (backup, restore, copy, prune, check, repair, stats, ls,
//!   dump, forget).
//! - [`tree`]: directory trees and chunk lists: reading, walking, reachability.
//! - [`repo`]: the repository as storage: opening, keys, sealed objects, snapshots,
//!   locks, the packer and uploader, blob encoding.
//! - [`index`]: the master index and its placements (RAM, SSD).
//!
//! `tests::layers` checks that no module of a lower layer names a higher one.

pub mod error;
pub mod hooks;
pub mod index;
pub mod ops;
pub mod pattern;
pub mod progress;
pub mod repo;
pub mod report;
pub mod session;
pub mod threads;
pub mod time;
pub mod tree;
pub mod units;

#[cfg(test)]
mod testutil;

pub use error::{Error, Result};
pub use ops::{
    backup, check, copy, diff, dump, export, find, forget, ls, prune, repair, restore, stats,
};
pub use repo::{InitOptions, Repository, blob, lock, packer};
pub use session::{IndexLoad, Session};

/// Locks a mutex whether or not a thread panicked while holding it: every mutex in
/// the engine guards data that stays consistent between statements.
pub(crate) fn lock<T>(m: &std::sync::Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

#[cfg(test)]
mod tests {
    /// The layers of the crate (see the crate documentation): no module of a lower
    /// layer may name a higher one outside its tests. A textual check, so that a
    /// convenient `use crate::ops::...` deep in the storage layer fails the build's
    /// tests instead of quietly bringing the old import circles back.
    #[test]
    fn layers() {
        let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
        let rules: &[(&str, &[&str])] = &[
            (
                "index",
                &["crate::repo", "crate::tree", "crate::ops", "crate::session"],
            ),
            ("repo", &["crate::tree", "crate::ops", "crate::session"]),
            ("tree", &["crate::ops", "crate::session"]),
        ];
        let mut bad = Vec::new();
        for (layer, forbidden) in rules {
            let mut stack = vec![root.join(layer)];
            while let Some(dir) = stack.pop() {
                for e in std::fs::read_dir(&dir).unwrap() {
                    let p = e.unwrap().path();
                    if p.is_dir() {
                        stack.push(p);
                        continue;
                    }
                    let text = std::fs::read_to_string(&p).unwrap();
                    let code = text.split("#[cfg(test)]").next().unwrap_or("");
                    for (i, line) in code.lines().enumerate() {
                        for f in *forbidden {
                            if line.contains(f) {
                                bad.push(format!("{}:{}: {}", p.display(), i + 1, line.trim()));
                            }
                        }
                    }
                }
            }
        }
        assert!(bad.is_empty(), "layering violations:\n{}", bad.join("\n"));
    }
}
