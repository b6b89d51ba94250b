//! The names the mount gives snapshots at its top level:
//!
//! ```text
//! hosts/HOST/DATE/      a snapshot's tree, DATE its time in UTC (2024-05-01T12-34-56Z)
//! hosts/HOST/latest  -> DATE of the host's newest snapshot
//! snapshots/ID/         the same tree under the snapshot's full id
//! latest             -> snapshots/ID of the newest snapshot
//! ```
//!
//! DATE has no `:` (rsync and scp read `a:b` as a remote host) and sorts as text in
//! time order. Two snapshots of one host in the same second both get their short
//! id appended (`…Z-1a2b3c4d`), so a name never depends on which of them is listed
//! first. Host names are made safe to be one path component, two hosts never one. Everything here is
//! pure: the listing is built from snapshot objects already read.

use cairn_format::snapshot::Snapshot;
use cairn_format::{BlobId, SnapshotId};
use std::collections::{BTreeMap, HashMap};

/// A snapshot as the mount shows it.
#[derive(Clone, Debug)]
pub struct SnapEntry {
    pub id: SnapshotId,
    pub tree: BlobId,
    /// Its directory under `hosts/`.
    pub host: String,
    /// Its directory under `hosts/HOST/`.
    pub date: String,
    /// Seconds since the epoch (0 if the time cannot be read).
    pub secs: i64,
    /// Whether none of its entries has a POSIX ACL (unknown for snapshots
    /// written before backups counted them).
    pub acl_free: Option<bool>,
}

/// The snapshots of one session's list, by the names the mount shows.
#[derive(Debug, Default)]
pub struct Listing {
    /// Oldest first (the session's order).
    snaps: Vec<SnapEntry>,
    by_id: HashMap<SnapshotId, usize>,
    /// Host directory -> date directory -> index in `snaps`.
    hosts: BTreeMap<String, BTreeMap<String, usize>>,
}

/// A host name as one safe path component, and never the same for two hosts:
/// `/` and `%` are written `%2F` and `%25` (so `web/01` and `web_01` stay two
/// directories), an empty name `%`, and `.` and `..` `%2E` and `%2E%2E`.
pub fn host_dir_name(host: &str) -> String {
    match host {
        "" => return "%".into(),
        "." => return "%2E".into(),
        ".." => return "%2E%2E".into(),
        _ => {}
    }
    let mut s = String::with_capacity(host.len());
    for c in host.chars() {
        match c {
            '/' => s.push_str("%2F"),
            '%' => s.push_str("%25"),
            '\0' => s.push_str("%00"),
            c => s.push(c),
        }
    }
    s
}

/// A snapshot time (RFC 3339) as a directory name, seconds precision, in UTC.
pub fn date_name(time: &str) -> Option<(String, i64)> {
    let secs = cairn_core::time::parse_rfc3339(time)?;
    let full = cairn_core::time::format_unix(secs, 0);
    let day_time = full.get(..19)?;
    Some((format!("{}Z", day_time.replace(':', "-")), secs))
}

impl Listing {
    /// The listing of `snaps` (oldest first); snapshots whose tree id cannot be
    /// read are left out and described in the second value.
    pub fn new(snaps: &[(SnapshotId, Snapshot)]) -> (Listing, Vec<String>) {
        let mut problems = Vec::new();
        let mut out: Vec<SnapEntry> = Vec::with_capacity(snaps.len());
        for (id, s) in snaps {
            let Ok(tree) = s.tree_id() else {
                problems.push(format!(
                    "snapshot {} has an unreadable tree id: left out",
                    id.short()
                ));
                continue;
            };
            let (date, secs) =
                date_name(&s.time).unwrap_or_else(|| (format!("unknown-time-{}", id.short()), 0));
            out.push(SnapEntry {
                id: *id,
                tree,
                host: host_dir_name(&s.hostname),
                date,
                secs,
                acl_free: s.summary.entries_with_acl.map(|n| n == 0),
            });
        }
        // Same host, same second: every one of them gets its short id.
        let mut seen: HashMap<(String, String), usize> = HashMap::new();
        for e in &out {
            *seen.entry((e.host.clone(), e.date.clone())).or_default() += 1;
        }
        for e in &mut out {
            if seen.get(&(e.host.clone(), e.date.clone())).copied() > Some(1) {
                e.date = format!("{}-{}", e.date, e.id.short());
            }
        }
        let mut l = Listing::default();
        for (i, e) in out.iter().enumerate() {
            l.by_id.insert(e.id, i);
            l.hosts
                .entry(e.host.clone())
                .or_default()
                .insert(e.date.clone(), i);
        }
        l.snaps = out;
        (l, problems)
    }

    pub fn snapshots(&self) -> &[SnapEntry] {
        &self.snaps
    }

    pub fn get(&self, id: &SnapshotId) -> Option<&SnapEntry> {
        self.by_id.get(id).and_then(|&i| self.snaps.get(i))
    }

    /// The newest snapshot not dated in the future, as the CLI's `latest` has it
    /// (one from a clock years ahead would stay "latest" over every real backup).
    pub fn latest(&self) -> Option<&SnapEntry> {
        newest_not_future(self.snaps.iter())
    }

    pub fn hosts(&self) -> impl Iterator<Item = &str> {
        self.hosts.keys().map(String::as_str)
    }

    pub fn has_host(&self, host: &str) -> bool {
        self.hosts.contains_key(host)
    }

    /// A host's snapshots in time order, to the nanosecond within a second (the
    /// session's order: two in one second have names that sort by id, not time).
    pub fn host_snapshots(&self, host: &str) -> Vec<&SnapEntry> {
        let mut idx: Vec<usize> = self
            .hosts
            .get(host)
            .into_iter()
            .flat_map(|m| m.values().copied())
            .collect();
        // Seconds first (a time that cannot be read, 0, first), then the
        // session's order within a second.
        idx.sort_unstable_by_key(|&i| (self.snaps.get(i).map_or(0, |e| e.secs), i));
        idx.iter().filter_map(|&i| self.snaps.get(i)).collect()
    }

    pub fn by_date(&self, host: &str, date: &str) -> Option<&SnapEntry> {
        let i = *self.hosts.get(host)?.get(date)?;
        self.snaps.get(i)
    }

    /// A host's newest snapshot not dated in the future.
    pub fn host_latest(&self, host: &str) -> Option<&SnapEntry> {
        newest_not_future(self.host_snapshots(host).into_iter())
    }

    /// The snapshot whose id starts with `prefix` (any number of hex digits, as
    /// the CLI takes them), if exactly one does.
    pub fn by_prefix(&self, prefix: &str) -> Option<&SnapEntry> {
        if prefix.is_empty() || !prefix.bytes().all(|b| b.is_ascii_hexdigit()) {
            return None;
        }
        let lower = prefix.to_ascii_lowercase();
        let mut found = self
            .snaps
            .iter()
            .filter(|e| e.id.to_hex().starts_with(&lower));
        let first = found.next()?;
        found.next().is_none().then_some(first)
    }
}

/// The last of `snaps` (oldest first) not dated in the future; the last of all
/// when every one is.
fn newest_not_future<'a>(
    snaps: impl DoubleEndedIterator<Item = &'a SnapEntry> + Clone,
) -> Option<&'a SnapEntry> {
    snaps
        .clone()
        .rev()
        .find(|e| !cairn_core::time::in_the_future(e.secs))
        .or_else(|| snaps.last())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn snap(host: &str, time: &str, tree: u8) -> Snapshot {
        Snapshot {
            version: 1,
            time: time.into(),
            utc_offset: None,
            hostname: host.into(),
            username: "u".into(),
            paths: vec!["/x".into()],
            tags: vec![],
            tree: BlobId([tree; 32]).to_hex(),
            parent: None,
            excludes: vec![],
            original: None,
            copied_from: None,
            program_version: "t".into(),
            image: None,
            summary: Default::default(),
        }
    }

    /// `latest` (and a host's) passes over a snapshot dated in the future, unless
    /// it is the only one.
    #[test]
    fn latest_is_not_one_dated_in_the_future() {
        let list = vec![
            (SnapshotId([1; 32]), snap("h", "2024-01-01T00:00:00Z", 1)),
            (SnapshotId([2; 32]), snap("h", "2099-01-01T00:00:00Z", 2)),
        ];
        let (l, _) = Listing::new(&list);
        assert_eq!(l.latest().map(|e| e.id), Some(SnapshotId([1; 32])));
        assert_eq!(l.host_latest("h").map(|e| e.id), Some(SnapshotId([1; 32])));
        let (l, _) = Listing::new(&list[1..]);
        assert_eq!(l.latest().map(|e| e.id), Some(SnapshotId([2; 32])));
    }

    #[test]
    fn names_are_safe_sortable_and_unique() {
        assert_eq!(host_dir_name("a/b"), "a%2Fb");
        assert_ne!(host_dir_name("a/b"), host_dir_name("a_b"));
        assert_eq!(host_dir_name("100%"), "100%25");
        assert_ne!(host_dir_name("a%2Fb"), host_dir_name("a/b"));
        assert_eq!(host_dir_name(""), "%");
        assert_eq!(host_dir_name(".."), "%2E%2E");
        assert_eq!(host_dir_name("web01"), "web01");
        assert_eq!(
            date_name("2024-05-01T12:34:56.123456789Z").map(|d| d.0),
            Some("2024-05-01T12-34-56Z".to_string())
        );
        // Offsets are turned into UTC.
        assert_eq!(
            date_name("2024-05-01T14:34:56+02:00").map(|d| d.0),
            Some("2024-05-01T12-34-56Z".to_string())
        );
        assert!(date_name("yesterday").is_none());

        let mut bad = snap("h", "2024-01-01T00:00:00Z", 9);
        bad.tree = "not hex".into();
        let list = vec![
            (SnapshotId([1; 32]), snap("h", "2024-01-01T00:00:00.1Z", 1)),
            (SnapshotId([2; 32]), snap("h", "2024-01-01T00:00:00.2Z", 2)),
            (
                SnapshotId([3; 32]),
                snap("other/host", "2024-02-01T00:00:00Z", 3),
            ),
            (SnapshotId([4; 32]), snap("h", "not a time", 4)),
            (SnapshotId([5; 32]), bad),
        ];
        let (l, problems) = Listing::new(&list);
        assert_eq!(problems.len(), 1, "{problems:?}");
        assert_eq!(l.hosts().collect::<Vec<_>>(), vec!["h", "other%2Fhost"]);
        let dates: Vec<String> = l
            .host_snapshots("h")
            .iter()
            .map(|e| e.date.clone())
            .collect();
        assert_eq!(
            dates,
            vec![
                "unknown-time-04040404".to_string(),
                "2024-01-01T00-00-00Z-01010101".to_string(),
                "2024-01-01T00-00-00Z-02020202".to_string(),
            ]
        );
        assert_eq!(l.latest().map(|e| e.id), Some(SnapshotId([4; 32])));
        assert_eq!(l.host_latest("h").map(|e| e.id), Some(SnapshotId([2; 32])));
        assert_eq!(
            l.by_date("other%2Fhost", "2024-02-01T00-00-00Z")
                .map(|e| e.id),
            Some(SnapshotId([3; 32]))
        );
        assert_eq!(l.by_prefix("0303").map(|e| e.id), Some(SnapshotId([3; 32])));
        assert_eq!(
            l.by_prefix("03").map(|e| e.id),
            Some(SnapshotId([3; 32])),
            "as the CLI"
        );
        assert!(l.by_prefix("0").is_none(), "not unique");
        assert!(l.by_prefix("zzzz").is_none());
    }
}
