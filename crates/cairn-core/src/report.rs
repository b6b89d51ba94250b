//! Helpers for the typed reports operations return (`serde::Serialize`): what
//! `--json` prints and text output renders from.

use serde::Serializer;
use std::path::Path;

/// A path as text; bytes that are not UTF-8 become U+FFFD (JSON has no bytes).
pub fn lossy_path<S: Serializer>(p: &Path, s: S) -> Result<S::Ok, S::Error> {
    s.serialize_str(&p.to_string_lossy())
}

/// Lookups in the SSD placement that failed to read or verify its local files (the
/// files are marked and rebuilt at the next open).
#[derive(Clone, Debug, serde::Serialize)]
pub struct LookupFailures {
    pub count: u64,
    pub error: String,
}

impl LookupFailures {
    /// The failures the repository's loaded index met, if any.
    pub fn of(repo: &crate::Repository) -> Option<LookupFailures> {
        repo.index()
            .ssd()
            .and_then(|s| s.failures())
            .map(|(count, error)| LookupFailures { count, error })
    }
}

/// Damage the run met in the SSD placement's local files and mended by
/// rebuilding them from the repository (the files are rebuilt again at the next
/// open): a local disk that damages files is worth a look.
pub fn index_repaired(repo: &crate::Repository) -> Option<String> {
    repo.index().ssd().and_then(|s| s.repaired())
}

/// For `skip_serializing_if`: a count that is absent when zero.
pub fn is_zero(n: &u64) -> bool {
    *n == 0
}
