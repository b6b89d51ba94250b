//! Snapshot objects: `snapshots/<id>`, sealed JSON. Writing one is the commit point of
//! a backup: it must only be written after every pack and index file it needs.

use crate::consts::MAX_METADATA_OBJECT_SIZE;
use crate::error::{FormatError, Result, check_version};
use crate::id::BlobId;
use crate::json::check_json_version;
use serde::{Deserialize, Serialize};

/// Snapshot version written and read by this code.
pub const SNAPSHOT_VERSION: u32 = 1;

#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct SnapshotSummary {
    pub files_new: u64,
    pub files_changed: u64,
    pub files_unchanged: u64,
    pub dirs: u64,
    pub other_entries: u64,
    pub entries_skipped: u64,
    pub bytes_read: u64,
    /// Logical bytes of all files in the snapshot.
    pub total_bytes: u64,
    pub blobs_added: u64,
    /// Plaintext bytes of new blobs.
    pub data_added: u64,
    /// Bytes the new blobs occupy in packs (after compression and sealing).
    pub data_added_packed: u64,
    pub duration_secs: f64,
    /// Entries that carry a POSIX ACL (access or default). Absent from snapshots
    /// written before it was counted: unknown. Zero lets a mount tell `ls -l` that
    /// the snapshot has no ACLs, which spares a question per file.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub entries_with_acl: Option<u64>,
    /// Directories (the root left out, as in `dirs`) against the parent
    /// snapshot: not in it, in it with another tree, in it with the same tree (as
    /// restic counts them). Absent from snapshots written before they were
    /// counted.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub dirs_new: Option<u64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub dirs_changed: Option<u64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub dirs_unchanged: Option<u64>,
}

#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct CopiedFrom {
    pub repository: String,
    pub snapshot: String,
}

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Snapshot {
    pub version: u32,
    /// RFC 3339 with nanoseconds, UTC.
    pub time: String,
    /// The offset from UTC (seconds east) of the time zone the snapshot was taken
    /// in, at `time`: retention counts its hours, days and weeks there, wherever
    /// `forget` runs. Absent from snapshots written before it was recorded: those
    /// are counted in the zone of the machine that runs `forget`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub utc_offset: Option<i32>,
    pub hostname: String,
    pub username: String,
    pub paths: Vec<String>,
    #[serde(default)]
    pub tags: Vec<String>,
    /// Hex blob id of the root tree.
    pub tree: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub parent: Option<String>,
    #[serde(default)]
    pub excludes: Vec<String>,
    /// Set by `repair snapshots`: the id of the snapshot this one replaces.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub original: Option<String>,
    /// Set by `copy`: the id of the snapshot this one was copied from, and the id of
    /// the repository that holds it. Copying it again finds this and does nothing.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub copied_from: Option<CopiedFrom>,
    pub program_version: String,
    pub summary: SnapshotSummary,
    /// Set by `backup --image`: the snapshot's one file is a disk image cut in
    /// fixed blocks (see [`ImageInfo`]).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub image: Option<ImageInfo>,
}

/// What an image snapshot records beyond a file snapshot. Its root tree holds one
/// file node, the image, whose chunks are all `block_size` bytes (the last may be
/// shorter) and whose chunk-list blobs hold exactly `fanout` entries each (the last
/// of each level may hold fewer), so that the list of block `n` is found by
/// arithmetic and a later backup can take whole subtrees from this one.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct ImageInfo {
    /// Where it was read from (a file or block device path).
    pub source: String,
    /// Bytes of the image.
    pub size: u64,
    pub block_size: u32,
    /// Entries per chunk-list blob.
    pub fanout: u32,
    /// Blocks of the image (`ceil(size / block_size)`).
    pub blocks: u64,
    /// Blocks read from the source (all, unless a changed-block list was given).
    pub blocks_read: u64,
    /// Blocks whose content differs from the parent's block at the same place
    /// (all of them without a parent).
    pub blocks_changed: u64,
    /// Blocks of zeros (stored once, restored as holes).
    pub blocks_zero: u64,
    /// The parent's blocks were taken for everything outside these ranges.
    #[serde(default)]
    pub changed_blocks_input: bool,
    /// Byte ranges `[offset, length]` the source failed to read: they hold zeros
    /// in the snapshot.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub unreadable: Vec<(u64, u64)>,
    /// Set when the source's size at the end of the backup differed from `size`
    /// (the image was saved at `size`, and may be inconsistent).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub size_at_end: Option<u64>,
    /// Bytes of a sparse source file's holes, which were not read (they are
    /// zeros, counted in `blocks_read` and `blocks_zero` like read ones). Absent
    /// when none, and in snapshots written before it was counted.
    #[serde(default, skip_serializing_if = "is_zero")]
    pub bytes_in_holes: u64,
    /// Blocks among `blocks_read` wholly in those holes (not read at all).
    /// Absent when none, and in snapshots written before it was counted.
    #[serde(default, skip_serializing_if = "is_zero")]
    pub blocks_in_holes: u64,
    /// A regular file source's device and inode numbers: a changed-block list is
    /// not applied to another file at that path (replaced, or an image restored
    /// onto it), whose blocks it does not describe. Absent for a block device,
    /// and in snapshots written before it was recorded.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub source_file: Option<[u64; 2]>,
}

fn is_zero(n: &u64) -> bool {
    *n == 0
}

impl Snapshot {
    pub fn tree_id(&self) -> Result<BlobId> {
        BlobId::from_hex(&self.tree)
    }

    pub fn to_bytes(&self) -> Vec<u8> {
        #[allow(clippy::expect_used)]
        serde_json::to_vec(self).expect("snapshot serialises")
    }

    pub fn from_bytes(data: &[u8]) -> Result<Self> {
        if data.len() > MAX_METADATA_OBJECT_SIZE {
            return Err(FormatError::TooLarge {
                what: "snapshot",
                size: data.len() as u64,
                limit: MAX_METADATA_OBJECT_SIZE as u64,
            });
        }
        // The version first: a newer snapshot may change any other member.
        check_json_version("snapshot", data, SNAPSHOT_VERSION)?;
        let s: Snapshot = serde_json::from_slice(data)
            .map_err(|e| FormatError::malformed("snapshot", e.to_string()))?;
        check_version("snapshot", s.version.into(), 1, SNAPSHOT_VERSION.into())?;
        s.tree_id()?;
        Ok(s)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn sample() -> Snapshot {
        Snapshot {
            version: 1,
            time: "2026-11-22T01:02:03.123456789Z".into(),
            utc_offset: None,
            hostname: "h".into(),
            username: "u".into(),
            paths: vec!["/a".into()],
            tags: vec![],
            tree: "ab".repeat(32),
            parent: None,
            excludes: vec![],
            original: None,
            copied_from: Some(CopiedFrom {
                repository: "cd".repeat(32),
                snapshot: "ef".repeat(32),
            }),
            program_version: "cairn test".into(),
            image: None,
            summary: SnapshotSummary::default(),
        }
    }

    #[test]
    fn unknown_members_are_ignored() {
        let s = sample();
        let text = String::from_utf8(s.to_bytes()).unwrap();
        let more = text.replacen("{", r#"{"zz_new":{"a":[1,2]},"#, 1);
        assert_eq!(Snapshot::from_bytes(more.as_bytes()).unwrap(), s);
    }

    #[test]
    fn durations_survive_a_rewrite_exactly() {
        // Found by the fuzzer: serde_json's default float parsing read this back one
        // unit in the last place off, so copying a snapshot changed its summary.
        let mut s = sample();
        s.summary.duration_secs = 9.564_205_398_441_221e-113;
        let back = Snapshot::from_bytes(&s.to_bytes()).unwrap();
        assert_eq!(
            back.summary.duration_secs.to_bits(),
            s.summary.duration_secs.to_bits()
        );
    }

    #[test]
    fn a_newer_snapshot_says_upgrade() {
        let text = String::from_utf8(sample().to_bytes()).unwrap();
        let newer = text.replacen("\"version\":1", "\"version\":2,\"tree\":{}", 1);
        let err = Snapshot::from_bytes(newer.as_bytes()).unwrap_err();
        assert!(
            matches!(
                err,
                FormatError::NewerVersion {
                    version: 2,
                    supported: 1,
                    ..
                }
            ),
            "{err}"
        );
    }

    proptest! {
        #[test]
        fn round_trip(
            host in ".*",
            paths in proptest::collection::vec(".*", 0..4),
            tags in proptest::collection::vec(".*", 0..3),
            excludes in proptest::collection::vec(".*", 0..3),
            files: u64,
            ids in proptest::option::of((any::<[u8; 32]>(), any::<[u8; 32]>())),
            parent in proptest::option::of(any::<[u8; 32]>()),
            original in proptest::option::of(any::<[u8; 32]>()),
            duration in 0f64..1e12,
        ) {
            let s = Snapshot {
                version: 1,
                time: "2026-11-22T01:02:03.123456789Z".into(),
                utc_offset: None,
                hostname: host,
                username: "u".into(),
                paths,
                tags,
                tree: "ab".repeat(32),
                parent: parent.map(hex::encode),
                excludes,
                original: original.map(hex::encode),
                copied_from: ids.map(|(r, s)| CopiedFrom {
                    repository: hex::encode(r),
                    snapshot: hex::encode(s),
                }),
                program_version: "cairn test".into(),
                image: None,
                summary: SnapshotSummary {
                    files_new: files,
                    duration_secs: duration,
                    ..Default::default()
                },
            };
            prop_assert_eq!(Snapshot::from_bytes(&s.to_bytes()).unwrap(), s);
        }

        #[test]
        fn decode_never_panics(data: Vec<u8>) {
            let _ = Snapshot::from_bytes(&data);
        }
    }
}
