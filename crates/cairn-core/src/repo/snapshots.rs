//! Snapshot objects: listing, reading, resolving `latest` and id prefixes, writing
//! (the commit point of a backup) and forgetting.

use super::*;

/// Readable snapshots (oldest first) and the errors of those that could not be read.
pub type SnapshotList = (Vec<(SnapshotId, Snapshot)>, Vec<Error>);

impl Repository {
    // ---- snapshots ----

    pub fn list_snapshot_ids(&self) -> Result<Vec<SnapshotId>> {
        Ok(self
            .backend
            .list(names::SNAPSHOTS)?
            .iter()
            .filter_map(|i| SnapshotId::from_hex(names::base(&i.name)).ok())
            .collect())
    }

    pub fn read_snapshot(&self, id: &SnapshotId) -> Result<Snapshot> {
        let what = format!("snapshot {}", id.to_hex());
        let plain =
            self.read_sealed_object(&names::snapshot(&id.to_hex()), &id.0, "snapshot", &what)?;
        Snapshot::from_bytes(&plain).map_err(|e| Error::damaged(what, e))
    }

    /// Writing the snapshot object is the commit point of a backup. Afterwards a
    /// small index file records that the snapshot exists, so that `check` notices
    /// if the object is ever deleted without `forget`. That record is best effort:
    /// the snapshot is committed whether or not it could be written.
    pub fn write_snapshot(&self, snap: &Snapshot) -> Result<SnapshotId> {
        let sealed = self.key.sealer.seal(&snap.to_bytes());
        let id = SnapshotId::of_content(&sealed);
        self.backend.put(&names::snapshot(&id.to_hex()), &sealed)?;
        let _ = self.write_index_file(&IndexFile {
            snapshots: vec![id],
            ..Default::default()
        });
        Ok(id)
    }

    /// Removes snapshot objects on purpose: first records them as forgotten (so
    /// `check` does not take their absence for damage), then deletes them. Returns
    /// each id with the result of its deletion (a missing object counts as done).
    pub fn forget_snapshots(&self, ids: &[SnapshotId]) -> Result<Vec<(SnapshotId, Result<()>)>> {
        if ids.is_empty() {
            return Ok(Vec::new());
        }
        self.write_index_file(&IndexFile {
            forgotten: ids.to_vec(),
            ..Default::default()
        })?;
        Ok(ids
            .iter()
            .map(|id| {
                let r = match self.backend.delete(&names::snapshot(&id.to_hex())) {
                    Ok(()) => Ok(()),
                    Err(e) if e.is_not_found() => Ok(()),
                    Err(e) => Err(e.into()),
                };
                (*id, r)
            })
            .collect())
    }

    /// All snapshots sorted by time (oldest first), plus the ones that could not be read.
    pub fn snapshots(&self) -> Result<SnapshotList> {
        let mut ok = Vec::new();
        let mut bad = Vec::new();
        for id in self.list_snapshot_ids()? {
            match self.read_snapshot(&id) {
                Ok(s) => ok.push((id, s)),
                Err(Error::Backend(b)) if b.is_not_found() => {}
                Err(e @ Error::Damaged { .. }) => bad.push(e),
                Err(e) => return Err(e),
            }
        }
        ok.sort_by(|a, b| a.1.time.cmp(&b.1.time).then(a.0.cmp(&b.0)));
        Ok((ok, bad))
    }

    /// Resolves `latest` or an id prefix (at least one hex digit).
    pub fn find_snapshot(&self, spec: &str) -> Result<(SnapshotId, Snapshot)> {
        if spec == "latest" {
            let (all, _) = self.snapshots()?;
            return all
                .into_iter()
                .next_back()
                .ok_or_else(|| Error::SnapshotNotFound(spec.into()));
        }
        let lower = spec.to_ascii_lowercase();
        if lower.is_empty() || !lower.bytes().all(|b| b.is_ascii_hexdigit()) {
            return Err(Error::SnapshotNotFound(spec.into()));
        }
        let matches: Vec<SnapshotId> = self
            .list_snapshot_ids()?
            .into_iter()
            .filter(|id| id.to_hex().starts_with(&lower))
            .collect();
        match matches.len() {
            0 => Err(Error::SnapshotNotFound(spec.into())),
            1 => Ok((matches[0], self.read_snapshot(&matches[0])?)),
            _ => Err(Error::AmbiguousSnapshot {
                prefix: spec.into(),
                matches: matches
                    .iter()
                    .take(5)
                    .map(|m| m.short())
                    .collect::<Vec<_>>()
                    .join(", "),
            }),
        }
    }
}
