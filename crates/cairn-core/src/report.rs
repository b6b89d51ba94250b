//! Helpers for the typed reports operations return (`serde::Serialize`): what
//! `--json` prints and text output renders from.

use serde::Serializer;
use std::path::Path;

/// A path as text; bytes that are not UTF-8 become U+FFFD (JSON has no bytes).
pub fn lossy_path<S: Serializer>(p: &Path, s: S) -> Result<S::Ok, S::Error> {
    s.serialize_str(&p.to_string_lossy())
}
