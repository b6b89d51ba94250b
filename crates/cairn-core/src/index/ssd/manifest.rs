//! What a build was made from: the manifest that says when the SSD index is out
//! of date.

use super::*;

/// What the cache was built from.
#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub(super) struct Manifest {
    pub(super) version: u32,
    pub(super) repo_id: String,
    /// Every index file listed when it was built (live and superseded), sorted.
    pub(super) index_files: Vec<String>,
    /// Every pending-deletion record listed, sorted.
    pub(super) pending: Vec<String>,
    pub(super) records: u64,
    pub(super) unique: u64,
    pub(super) live: u64,
    pub(super) dir_bits: u32,
    /// Index files that could not be read (their blobs count as missing).
    pub(super) errors: Vec<String>,
    /// BLAKE3 (hex) of each file read whole at open (see `checked`).
    pub(super) checksums: std::collections::BTreeMap<String, String>,
}

/// Reads and checks a segment's manifest. A build that met unreadable index files
/// is redone at every open, as the RAM placement reads them again every time: the
/// damage may have been passing. `just_built`: the build this open made, taken
/// with its damage (QA: one junk index file made every command fail with "out of
/// date", the fresh build refused as the old one was).
pub(super) fn read_manifest(dir: &Path, repo_id: &str, just_built: bool) -> Result<Manifest> {
    let m: Manifest = serde_json::from_slice(&read_file(dir, "manifest.json")?)
        .map_err(|e| Error::Invalid(format!("SSD index manifest: {e}")))?;
    if m.version != MANIFEST_VERSION
        || m.repo_id != repo_id
        || (!m.errors.is_empty() && !just_built)
    {
        return Err(Error::Invalid("SSD index is out of date".into()));
    }
    if dir.join(DAMAGED).exists()
        || dir
            .parent()
            .is_some_and(|p| dir.ends_with("delta") && p.join(DAMAGED).exists())
    {
        return Err(Error::Invalid("SSD index was found damaged".into()));
    }
    Ok(m)
}
