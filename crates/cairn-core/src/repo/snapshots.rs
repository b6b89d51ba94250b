//! Snapshot objects: listing, reading, resolving `latest` and id prefixes, writing
//! (the commit point of a backup) and forgetting.

use super::*;

/// Reads the `hosts/` record of a snapshot (hex id); `None` when there is none.
pub type HostRead<'a> =
    dyn Fn(&str) -> std::result::Result<Option<String>, cairn_backend::BackendError> + Sync + 'a;

/// A `hosts/` record is a host name: short; a larger one is refused unread.
const MAX_HOST_RECORD: u64 = 255;

/// A `received/` record is decimal Unix seconds, with nanoseconds: short; a larger
/// one is refused unread.
const MAX_RECEIVED_RECORD: u64 = 32;

/// The time in a `received/` record, `None` when it holds none: whole seconds
/// (servers before 2026-12-07) or seconds with up to nine decimals.
pub(crate) fn parse_received(b: &[u8]) -> Option<chrono::DateTime<chrono::Utc>> {
    let s = std::str::from_utf8(b).ok()?.trim();
    let (secs, frac) = s.split_once('.').unwrap_or((s, ""));
    let digits = |t: &str| t.bytes().all(|c| c.is_ascii_digit());
    if secs.is_empty() || !digits(secs) || !digits(frac) || frac.len() > 9 {
        return None;
    }
    if s.ends_with('.') {
        return None;
    }
    let nanos = if frac.is_empty() {
        0
    } else {
        frac.parse::<u32>().ok()? * 10u32.pow(9 - frac.len() as u32)
    };
    chrono::DateTime::from_timestamp(secs.parse().ok()?, nanos)
}

/// Readable snapshots (oldest first) and the errors of those that could not be read.
pub type SnapshotList = (Vec<(SnapshotId, Snapshot)>, Vec<SnapshotError>);

/// A snapshot object that could not be read, with why.
#[derive(Debug)]
pub struct SnapshotError {
    pub id: SnapshotId,
    pub error: Error,
}

impl SnapshotError {
    /// The object was read and is not a snapshot (its authentication, encoding or
    /// contents fail): damage that removing it repairs. An object this user may not
    /// read, or one a newer cairn wrote, is not damage: nothing may remove it on
    /// its own.
    pub fn is_damage(&self) -> bool {
        matches!(self.error, Error::Damaged { .. })
    }

    /// What to do about it, for messages.
    pub fn advice(&self) -> String {
        let id = self.id.to_hex();
        match &self.error {
            // Its trees are most likely whole: `recover` saves them as a new
            // snapshot, which the next prune would otherwise delete (QA).
            Error::Damaged { .. } => format!(
                "first `cairn recover` saves the directory trees it held as a new snapshot \
                 (the next prune deletes them otherwise), then `cairn forget {id}` removes \
                 that object (`cairn repair snapshots` removes every damaged one)"
            ),
            Error::NewerFormat { .. } => {
                format!("upgrade cairn to read it, or `cairn forget {id}` removes it")
            }
            _ => format!(
                "this user may not read it: give it access to the object as to the repository's \
                 other files (or `cairn forget {id}` removes it)"
            ),
        }
    }
}

impl std::fmt::Display for SnapshotError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        self.error.fmt(f)
    }
}

impl Repository {
    // ---- snapshots ----

    pub fn list_snapshot_ids(&self) -> Result<Vec<SnapshotId>> {
        Ok(self
            .backend
            .list(names::SNAPSHOTS)?
            .iter()
            .filter_map(|i| SnapshotId::from_hex(names::listed(&i.name)).ok())
            .collect())
    }

    pub fn read_snapshot(&self, id: &SnapshotId) -> Result<Snapshot> {
        let what = format!("snapshot {}", id.to_hex());
        let plain = self.read_sealed_object(
            &names::snapshot(&id.to_hex()),
            &id.0,
            "snapshot",
            &what,
            Some(MAX_METADATA_OBJECT_SIZE as u64),
        )?;
        let snap = Snapshot::from_bytes(&plain).map_err(|e| Error::damaged(&what, e))?;
        // Every reader orders, groups and dates snapshots by their time: one that
        // is not a time (sealed by a client holding the key, as cairn never
        // writes it) is damaged, listed apart, not a reason for retention or
        // the console to fail on all (console pentest: "soon" emptied the
        // console's snapshot table; `forget --keep-*` refused to run).
        if crate::time::parse_rfc3339(&snap.time).is_none() {
            return Err(Error::damaged(
                what,
                cairn_format::FormatError::malformed(
                    "snapshot",
                    format!(
                        "its time {:?} is not an RFC 3339 time",
                        snap.time.chars().take(64).collect::<String>()
                    ),
                ),
            ));
        }
        Ok(snap)
    }

    /// Writing the snapshot object is the commit point of a backup. Afterwards a
    /// small index file records that the snapshot exists, so that `check` notices
    /// if the object is ever deleted without `forget`. That record is best effort:
    /// the snapshot is committed whether or not it could be written.
    ///
    /// It takes the writer's lock and checks that it is fresh and still stored
    /// first: a writer whose lock may have looked stale to a prune, or was removed,
    /// must not commit (the prune may have removed data the snapshot needs).
    pub fn write_snapshot(
        &self,
        snap: &Snapshot,
        lock: &super::lock::RepoLock,
    ) -> Result<SnapshotId> {
        lock.check_held()?;
        let sealed = self.key.sealer.seal(&snap.to_bytes());
        if sealed.len() > MAX_METADATA_OBJECT_SIZE {
            // Readers would refuse it: better no snapshot than an unreadable one.
            return Err(Error::Invalid(format!(
                "the snapshot would take {} MiB, more than the {} MiB a snapshot may \
                 (it lists {} paths and {} tags)",
                sealed.len() >> 20,
                MAX_METADATA_OBJECT_SIZE >> 20,
                snap.paths.len(),
                snap.tags.len()
            )));
        }
        let id = SnapshotId::of_content(&sealed);
        crate::hooks::point("snapshot:before-write");
        super::objects::store_immutable(
            self.backend.as_ref(),
            &names::snapshot(&id.to_hex()),
            &sealed,
            false,
        )?;
        crate::hooks::point("snapshot:written");
        if self
            .write_index_file(&IndexFile {
                snapshots: vec![id],
                ..Default::default()
            })
            .is_ok()
        {
            crate::hooks::point("snapshot:recorded");
        }
        Ok(id)
    }

    /// Removes snapshot objects on purpose: first records them as forgotten (so
    /// `check` does not take their absence for damage), then deletes them. Returns
    /// each id with the result of its deletion (a missing object counts as done).
    ///
    /// Each also gets a plaintext `forgotten/` record before it goes: the index
    /// file's record is sealed, and `cairn serve`, which holds no key, reads this
    /// one to refuse a backup token that stores the snapshot's saved bytes again
    /// (QA: a hijacked client brought back what an admin forgot). A storage that
    /// refuses the record (a server from before it) costs only that protection.
    pub fn forget_snapshots(&self, ids: &[SnapshotId]) -> Result<Vec<(SnapshotId, Result<()>)>> {
        if ids.is_empty() {
            return Ok(Vec::new());
        }
        self.write_index_file(&IndexFile {
            forgotten: ids.to_vec(),
            ..Default::default()
        })?;
        let now = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_secs())
            .to_string();
        Ok(ids
            .iter()
            .map(|id| {
                let record = names::forgotten_record(&id.to_hex());
                match self.backend.put_new(&record, now.as_bytes()) {
                    Ok(()) => {}
                    Err(e) if e.is_already_exists() => {}
                    Err(e)
                        if matches!(
                            e.kind,
                            cairn_backend::BackendErrorKind::PermissionDenied
                                | cairn_backend::BackendErrorKind::Other
                        ) => {}
                    Err(e) => return (*id, Err(e.into())),
                }
                let r = match self.backend.delete(&names::snapshot(&id.to_hex())) {
                    Ok(()) => Ok(()),
                    Err(e) if e.is_not_found() => Ok(()),
                    Err(e) => Err(e.into()),
                };
                (*id, r)
            })
            .collect())
    }

    /// Gives `new` (this repository's copy of `src`'s snapshot `old`: `copy`)
    /// the records `cairn serve` wrote for `old` in `src` that `which` says are
    /// there (`(hosts/, received/)`, so that no snapshot costs a request for
    /// none): its host, and when it was received. On a replica, retention then
    /// attributes it as on the original and tells a token without a host's
    /// snapshots apart (QA: the replica's retention deleted web02's real backups
    /// and kept such junk), and knows one stored late. A destination that may not
    /// take a receive record (a server, through a token that is no admin's)
    /// records its own arrival.
    pub fn copy_server_records_from(
        &self,
        src: &Repository,
        old: &SnapshotId,
        new: &SnapshotId,
        (host, received): (bool, bool),
    ) -> Result<()> {
        if host {
            match self.backend.bound_host()? {
                // A host-bound token's server records the snapshot as the
                // token's host itself, and keeps its records from the token:
                // nothing to copy when the source agrees.
                Some(bound) => {
                    let hex = old.to_hex();
                    if let Some(h) = src.host_record(&hex)?
                        && h != bound
                    {
                        return Err(Error::Invalid(format!(
                            "the source records it as host {h:?}; the destination's \
                             server records it as {bound:?}, its token's host"
                        )));
                    }
                }
                None => {
                    self.copy_record_from(src, names::host_record, MAX_HOST_RECORD, old, new)?
                }
            }
        }
        if received {
            match self.copy_record_from(src, names::received_record, MAX_RECEIVED_RECORD, old, new)
            {
                Err(Error::Backend(e))
                    if e.kind == cairn_backend::BackendErrorKind::PermissionDenied => {}
                r => r?,
            }
        }
        Ok(())
    }

    /// Gives `new` (a rewrite of `old`: new tags, a repair) the records `cairn
    /// serve` wrote for `old`, if any: its host, so that a host-bound token still
    /// sees it and retention still attributes it, and when it was received, so
    /// that retention still knows it for stored late (docs/SERVER.md).
    pub fn carry_server_records(&self, old: &SnapshotId, new: &SnapshotId) -> Result<()> {
        self.copy_server_records_from(self, old, new, (true, true))
    }

    /// Copies the record `name(old)` of `src` to `name(new)` here, if there is one
    /// (records are create-only: one already there stays).
    fn copy_record_from(
        &self,
        src: &Repository,
        name: fn(&str) -> String,
        max: u64,
        old: &SnapshotId,
        new: &SnapshotId,
    ) -> Result<()> {
        let record = match src.backend.get_bounded(&name(&old.to_hex()), max) {
            Ok(r) => r,
            // None, or none this client may read: a host-bound token, whose
            // snapshots are all its host's (the server records them as such when
            // they are stored, and they name it).
            Err(e)
                if e.is_not_found()
                    || e.kind == cairn_backend::BackendErrorKind::PermissionDenied =>
            {
                return Ok(());
            }
            Err(e) => return Err(e.into()),
        };
        match self.backend.put_new(&name(&new.to_hex()), &record) {
            Err(e) if !e.is_already_exists() => Err(e.into()),
            _ => Ok(()),
        }
    }

    /// Those of `snaps` with a record under `prefix` (`hosts/`, `received/`): one
    /// listing. None when the repository has no such records, or the caller may
    /// not see them (a host-bound token).
    fn with_records(
        &self,
        prefix: &str,
        ids: impl Iterator<Item = SnapshotId>,
    ) -> Result<Vec<SnapshotId>> {
        let listed: std::collections::HashSet<String> = match self.backend.list(prefix) {
            Ok(l) => l
                .into_iter()
                .map(|o| names::listed(&o.name).to_string())
                .collect(),
            Err(e)
                if e.is_not_found()
                    || e.kind == cairn_backend::BackendErrorKind::PermissionDenied =>
            {
                return Ok(Vec::new());
            }
            Err(e) => return Err(e.into()),
        };
        Ok(ids.filter(|id| listed.contains(&id.to_hex())).collect())
    }

    /// When `cairn serve` received those of `snaps` that a non-admin token stored
    /// through it (`received/<id>`, docs/FORMAT.md): one listing, then one small
    /// read per recorded snapshot (eight at a time). Empty for a repository no
    /// server wrote to, and for a caller that may not read the records (a
    /// host-bound token). A record that is not a time is left out.
    pub fn received_times(
        &self,
        snaps: &[(SnapshotId, Snapshot)],
    ) -> Result<std::collections::HashMap<SnapshotId, chrono::DateTime<chrono::Utc>>> {
        let wanted = self.with_records(names::RECEIVED, snaps.iter().map(|(id, _)| *id))?;
        let got = crate::threads::parallel_map(&wanted, 8, |id| {
            let r = self
                .backend
                .get_bounded(&names::received_record(&id.to_hex()), MAX_RECEIVED_RECORD);
            (*id, r)
        });
        let mut out = std::collections::HashMap::new();
        for (id, r) in got {
            match r {
                Ok(b) => {
                    if let Some(t) = parse_received(&b) {
                        out.insert(id, t);
                    }
                }
                // Forgotten meanwhile.
                Err(e) if e.is_not_found() => {}
                Err(e) => return Err(e.into()),
            }
        }
        Ok(out)
    }

    /// All snapshots sorted by time (oldest first), plus the ones that could not be read.
    pub fn snapshots(&self) -> Result<SnapshotList> {
        self.read_snapshots(&self.list_snapshot_ids()?)
    }

    /// The given snapshots sorted by time (oldest first), plus the errors of those
    /// that could not be read. One deleted meanwhile (forget) is left out.
    pub fn read_snapshots(&self, ids: &[SnapshotId]) -> Result<SnapshotList> {
        let mut ok = Vec::new();
        let mut bad = Vec::new();
        for id in ids {
            match self.read_snapshot(id) {
                Ok(s) => ok.push((*id, s)),
                Err(Error::Backend(b)) if b.is_not_found() => {}
                // A snapshot written by a newer cairn is not readable here, but the
                // others are: listing them must go on (a backup only needs a parent).
                Err(e @ (Error::Damaged { .. } | Error::NewerFormat { .. })) => {
                    bad.push(SnapshotError { id: *id, error: e })
                }
                // One object this user may not read (written by another user with
                // a tight umask) is reported like a damaged one; the rest are listed.
                Err(Error::Backend(b))
                    if b.kind == cairn_backend::BackendErrorKind::PermissionDenied =>
                {
                    bad.push(SnapshotError {
                        id: *id,
                        error: Error::Backend(b),
                    })
                }
                Err(e) => return Err(e),
            }
        }
        ok.sort_by(|a, b| snapshot_order((&a.0, &a.1), (&b.0, &b.1)));
        Ok((ok, bad))
    }

    /// The hosts `cairn serve` recorded for snapshots stored by host-bound tokens
    /// (`hosts/<id>`, docs/SERVER.md), for those of `snaps` that have a record:
    /// one listing, then `read(snapshot hex)` for each (eight at a time).
    fn recorded_hosts(
        &self,
        ids: impl Iterator<Item = SnapshotId>,
        read: &HostRead<'_>,
    ) -> Result<std::collections::HashMap<SnapshotId, String>> {
        let wanted = self.with_records(names::HOSTS, ids)?;
        let got = crate::threads::parallel_map(&wanted, 8, |id| (*id, read(&id.to_hex())));
        let mut out = std::collections::HashMap::new();
        for (id, host) in got {
            // None: forgotten meanwhile.
            if let Some(h) = host? {
                out.insert(id, h);
            }
        }
        Ok(out)
    }

    /// Gives each snapshot that names another host-bound token's host than the one
    /// `cairn serve` recorded for the token that stored it (`hosts/<id>`) the
    /// recorded host: the client wrote the name, the server vouches for the token.
    /// Retention groups and filters by host, so a hijacked backup client of web01
    /// backing up as `--host web02` must count as web01's, not push web02's real
    /// snapshots out of a `--keep-last`. A snapshot naming a host no bound token
    /// backs up is counted apart (`web03 (stored by web01's token)`) when others
    /// store snapshots under that name too; alone under it (a machine whose own
    /// name differs from its token's), it keeps its name.
    /// Returns the snapshots changed, with the host each claimed.
    pub fn attribute_hosts(
        &self,
        snaps: &mut [(SnapshotId, Snapshot)],
    ) -> Result<Vec<(SnapshotId, String)>> {
        self.attribute_hosts_by(snaps, &|hex| self.host_record(hex))
    }

    /// Of `snaps` (the repository's listing), those naming `host` that a backup
    /// as `host` must not take for its parent, whose files it would take over
    /// unread by their size and time, whatever content the client that stored
    /// it gave them: one `cairn serve` recorded as stored by a token bound to
    /// another host, and one that retention does not count as `host`'s either
    /// ([`Self::attribute_hosts`]): stored by a token without a host under the
    /// name of a bound token's host (QA: a hijacked unbound backup token planted
    /// a copy of web02's latest snapshot with one file's content replaced, and
    /// the next backups of web02 by an admin kept the forged content).
    /// Empty for a repository no server recorded hosts in, and for a host-bound
    /// token (it sees only its own host's snapshots). Each with why, for a
    /// warning.
    pub fn not_parents_for(
        &self,
        snaps: &[(SnapshotId, Snapshot)],
        host: &str,
    ) -> Result<std::collections::HashMap<SnapshotId, String>> {
        let candidates: Vec<SnapshotId> = (snaps.iter())
            .filter(|(_, s)| s.hostname == host)
            .map(|(id, _)| *id)
            .collect();
        if candidates.is_empty() || self.backend.partial_view()?.is_some() {
            return Ok(Default::default());
        }
        // The records of the snapshots naming `host` only (one listing, then a
        // read of each that has one), not of the whole repository's: each backup
        // asks. Retention's rules, for these snapshots: one recorded for another
        // token's host, or counted apart as stored by a bound token under a name
        // not its own, is not `host`'s.
        let recorded =
            self.recorded_hosts(candidates.iter().copied(), &|hex| self.host_record(hex))?;
        let mut out: std::collections::HashMap<SnapshotId, String> = (recorded.iter())
            .filter(|(_, h)| *h != host)
            .map(|(id, h)| (*id, format!("was stored by {h:?}'s host-bound token")))
            .collect();
        // One a token without a host stored (the server recorded when it
        // received it, and no host) is not `host`'s when `host` is a bound
        // token's: known here from `host`'s own snapshots (a bound token whose
        // machine backs up under other names only is not looked for: its host's
        // name is then only ever stored by others, which the server cannot
        // tell apart, docs/SERVER.md).
        if recorded.values().any(|h| h == host) {
            let unrecorded = candidates
                .into_iter()
                .filter(|id| !recorded.contains_key(id));
            let why = format!(
                "was stored by a token without a host, where {host:?} backs up through its \
                 own host-bound token"
            );
            out.extend(
                (self.with_records(names::RECEIVED, unrecorded)?.into_iter())
                    .map(|id| (id, why.clone())),
            );
        }
        Ok(out)
    }

    /// The host `cairn serve` recorded for snapshot `hex`, if any.
    pub(crate) fn host_record(
        &self,
        hex: &str,
    ) -> std::result::Result<Option<String>, cairn_backend::BackendError> {
        match self
            .backend
            .get_bounded(&names::host_record(hex), MAX_HOST_RECORD)
        {
            Ok(b) => Ok(Some(String::from_utf8_lossy(&b).into_owned())),
            Err(e) if e.is_not_found() => Ok(None),
            Err(e) => Err(e),
        }
    }

    /// [`Self::attribute_hosts`] reading each record with `read` (`cairn serve`
    /// passes its cache: records are create-only).
    pub fn attribute_hosts_by(
        &self,
        snaps: &mut [(SnapshotId, Snapshot)],
        read: &HostRead<'_>,
    ) -> Result<Vec<(SnapshotId, String)>> {
        if let Some(host) = self.backend.partial_view()? {
            return Ok(count_as_own(snaps, &host));
        }
        let recorded = self.recorded_hosts(snaps.iter().map(|(id, _)| *id), read)?;
        self.attribute_recorded(snaps, &recorded)
    }

    /// [`Self::attribute_hosts`] with the records read.
    fn attribute_recorded(
        &self,
        snaps: &mut [(SnapshotId, Snapshot)],
        recorded: &std::collections::HashMap<SnapshotId, String>,
    ) -> Result<Vec<(SnapshotId, String)>> {
        let hosts: std::collections::HashSet<&String> = recorded.values().collect();
        // Who else stored snapshots under each name: the recorded host, or none
        // (an admin, a direct client, a token without a host).
        let mut stored_as: std::collections::HashMap<
            &str,
            std::collections::HashSet<Option<&String>>,
        > = Default::default();
        for (id, s) in snaps.iter() {
            stored_as
                .entry(s.hostname.as_str())
                .or_default()
                .insert(recorded.get(id));
        }
        let mut counted_as = Vec::new();
        for (i, (id, s)) in snaps.iter().enumerate() {
            let Some(h) = recorded.get(id) else { continue };
            if *h == s.hostname {
                continue;
            }
            if hosts.contains(&s.hostname) {
                // Another bound token's host: its token's host's.
                counted_as.push((i, h.clone()));
            } else if stored_as[s.hostname.as_str()].iter().any(|o| *o != Some(h)) {
                // A name others store snapshots under too (a host backed up by an
                // admin, directly, or by a token without a host): counted apart,
                // as this token's, so that it pushes none of theirs out of a
                // `--keep-last` (QA: junk stored as `--host web03` by web01's
                // token made retention delete web03's only backups). A machine
                // whose own name differs from its token's, alone under it, keeps
                // its name.
                counted_as.push((i, format!("{}{}", s.hostname, bound_mark(h))));
            }
        }
        let mut changed = Vec::new();
        for (i, counted) in counted_as {
            let (id, s) = &mut snaps[i];
            changed.push((*id, std::mem::replace(&mut s.hostname, counted)));
        }
        // A snapshot a token without a host stored (the server recorded when it
        // received it, and no host) that names a bound token's host is not that
        // host's: grouped apart, it cannot push the host's own backups out of a
        // `--keep-last` or make it look fresh. Only ever more is kept this way (a
        // group of its own keeps its own).
        let claims: Vec<SnapshotId> = snaps
            .iter()
            .filter(|(id, s)| !recorded.contains_key(id) && hosts.contains(&s.hostname))
            .map(|(id, _)| *id)
            .collect();
        if !claims.is_empty() {
            let unbound: std::collections::HashSet<SnapshotId> = self
                .with_records(names::RECEIVED, claims.into_iter())?
                .into_iter()
                .collect();
            for (id, s) in snaps.iter_mut() {
                if unbound.contains(id) {
                    let marked = format!("{}{UNBOUND_MARK}", s.hostname);
                    changed.push((*id, std::mem::replace(&mut s.hostname, marked)));
                }
            }
        }
        Ok(changed)
    }

    /// Narrows `all` and `bad` (a listing: the snapshots read, those that could
    /// not be) to what may be a snapshot of one of `hosts`, as `snapshots --host`
    /// and retention count hosts: a snapshot a host-bound token stored under
    /// another bound host's name is its token's host's ([`Self::attribute_hosts`]).
    /// One that could not be read is passed over (and `warn` told why) when,
    /// whatever it names, it could not count as any of `hosts`' there: `cairn
    /// serve` recorded it as stored by another host's bound token, and each of
    /// `hosts` has a bound token or snapshots others stored under its name; or it
    /// recorded it as stored by a token without a host, and each of `hosts` has a
    /// bound token. So a hijacked client can neither become `latest --host` of
    /// another host nor, with one unreadable snapshot, make other hosts' `latest`
    /// uncertain (QA: junk from web01's token did, for a host only an admin backs
    /// up). A host-bound token, which sees only its own host's snapshots, counts
    /// each as that host's ([`count_as_own`]).
    pub fn narrow_to_hosts<'b>(
        &self,
        all: &mut Vec<(SnapshotId, Snapshot)>,
        bad: &'b [SnapshotError],
        hosts: &[String],
        warn: &dyn Fn(String),
    ) -> Result<Vec<&'b SnapshotError>> {
        if let Some(host) = self.backend.partial_view()? {
            count_as_own(all, &host);
            all.retain(|(_, s)| hosts.contains(&s.hostname));
            return Ok(if hosts.contains(&host) {
                bad.iter().collect()
            } else {
                Vec::new()
            });
        }
        let ids = all
            .iter()
            .map(|(id, _)| *id)
            .chain(bad.iter().map(|e| e.id));
        let recorded = self.recorded_hosts(ids, &|hex| self.host_record(hex))?;
        // Who stored snapshots under each of `hosts`' names (the recorded host,
        // or none), before attribution renames any.
        let mut stored_as: std::collections::HashMap<
            String,
            std::collections::HashSet<Option<String>>,
        > = Default::default();
        for (id, s) in all.iter() {
            if hosts.contains(&s.hostname) {
                stored_as
                    .entry(s.hostname.clone())
                    .or_default()
                    .insert(recorded.get(id).cloned());
            }
        }
        self.attribute_recorded(all, &recorded)?;
        all.retain(|(_, s)| hosts.contains(&s.hostname));
        let bound: std::collections::HashSet<&String> = recorded.values().collect();
        // Unreadable snapshots without a host record that a token without a host
        // stored (the server recorded when it received them): asked for only when
        // it can matter.
        let unrecorded = bad
            .iter()
            .map(|e| e.id)
            .filter(|id| !recorded.contains_key(id));
        let by_unbound: std::collections::HashSet<SnapshotId> =
            if hosts.iter().any(|h| bound.contains(h)) {
                self.with_records(names::RECEIVED, unrecorded)?
                    .into_iter()
                    .collect()
            } else {
                Default::default()
            };
        // Whether an unreadable snapshot could count as host `x`'s, were it read
        // (as `attribute_recorded` would count it).
        let could_be = |x: &String, e: &SnapshotError| match recorded.get(&e.id) {
            Some(h) if h == x => true,
            // A bound token's snapshot naming `x` is counted apart when others
            // store snapshots under `x` (or `x` is a bound host).
            Some(h) => {
                !bound.contains(x)
                    && stored_as
                        .get(x)
                        .is_none_or(|s| s.iter().all(|o| o.as_ref() == Some(h)))
            }
            // A token without a host naming a bound host is counted apart.
            None if by_unbound.contains(&e.id) => !bound.contains(x),
            None => true,
        };
        let mut kept = Vec::new();
        for e in bad {
            if hosts.iter().any(|x| could_be(x, e)) {
                kept.push(e);
                continue;
            }
            let by = match recorded.get(&e.id) {
                Some(h) => format!("a backup token bound to host {h:?}"),
                None => "a token without a host".to_string(),
            };
            warn(format!(
                "snapshot {} could not be read ({}); passed over: `cairn serve` recorded it \
                 as stored by {by}, so it cannot count as {}'s",
                e.id.short(),
                e.error,
                hosts.join(", ")
            ));
        }
        Ok(kept)
    }

    /// Resolves `latest` or an id prefix (at least one hex digit) among all stored
    /// snapshots (operations resolve through their session instead).
    pub fn find_snapshot(&self, spec: &str) -> Result<(SnapshotId, Snapshot)> {
        self.find_snapshot_with(spec, &|_| {})
    }

    /// [`Repository::find_snapshot`], telling `warn` of snapshots `latest`
    /// passed over for being dated ahead of this machine's clock.
    pub fn find_snapshot_with(
        &self,
        spec: &str,
        warn: &dyn Fn(String),
    ) -> Result<(SnapshotId, Snapshot)> {
        if spec == "latest" {
            let list = self.snapshots()?;
            let found = latest(&list)?;
            if let Some(note) = passed_over(&list.0, &found.0) {
                warn(note);
            }
            return Ok(found);
        }
        let id = resolve_snapshot_prefix(spec, &self.list_snapshot_ids()?)?;
        Ok((id, self.read_snapshot(&id)?))
    }
}

/// Through a host-bound token (which the server shows only the snapshots it
/// recorded for that host), every snapshot is that host's: one naming another
/// host is counted as `host`'s, as an admin's view counts it when the name is
/// another bound host's (QA: web01's restore token took a snapshot its own
/// client stored as `--host web02` for `latest --host web02`, where an admin
/// got web02's real one). Returns the snapshots changed, with the host each
/// claimed.
fn count_as_own(snaps: &mut [(SnapshotId, Snapshot)], host: &str) -> Vec<(SnapshotId, String)> {
    let mut changed = Vec::new();
    for (id, s) in snaps.iter_mut() {
        if s.hostname != host {
            changed.push((*id, std::mem::replace(&mut s.hostname, host.to_string())));
        }
    }
    changed
}

/// Appended to the host of a snapshot that names a bound token's host but was
/// stored by a token without a host ([`Repository::attribute_hosts`]).
pub const UNBOUND_MARK: &str = " (unbound token)";

/// Appended to the host of a snapshot that a token bound to `host` stored under
/// the name of a host no bound token backs up ([`Repository::attribute_hosts`]).
pub fn bound_mark(host: &str) -> String {
    format!(" (stored by {host}'s token)")
}

/// Says why a snapshot naming host `claimed` is counted as `counted`'s (see
/// [`Repository::attribute_hosts`]), for warnings.
pub fn host_claim_note(claimed: &str, counted: &str) -> String {
    if let Some(h) = (counted.strip_prefix(claimed))
        .and_then(|m| m.strip_prefix(" (stored by "))
        .and_then(|m| m.strip_suffix("'s token)"))
    {
        return format!(
            "names host {claimed:?}, but was stored by a backup token bound to {h:?}: \
             counted apart, as {counted:?}"
        );
    }
    if counted.strip_suffix(UNBOUND_MARK) == Some(claimed) {
        format!(
            "names host {claimed:?}, which a host-bound token backs up, but was stored by a \
             token without a host: counted apart, as {counted:?}"
        )
    } else {
        format!(
            "names host {claimed:?}, but was stored by a backup token bound to {counted:?}: \
             counted as {counted:?}'s"
        )
    }
}

/// A snapshot of `all` (other than `old`) that is already what `new` would store:
/// a rewrite (tag, rewrite, repair) killed after storing the replacement and
/// before forgetting the old one, run again. Same chain, tree, time, host, paths
/// and tags: storing `new` would only make a second copy.
pub(crate) fn existing_replacement(
    all: &[(SnapshotId, Snapshot)],
    old: &SnapshotId,
    new: &Snapshot,
) -> Option<SnapshotId> {
    all.iter()
        .find(|(id, x)| {
            id != old && x.original == new.original && same_but_tags(x, new) && x.tags == new.tags
        })
        .map(|(id, _)| *id)
}

/// Whether two snapshots are one backup, whatever their tags: the same tree,
/// time, host and paths (a snapshot and what `tag` replaced it with).
pub(crate) fn same_but_tags(a: &Snapshot, b: &Snapshot) -> bool {
    a.tree == b.tree && a.time == b.time && a.hostname == b.hostname && a.paths == b.paths
}

/// The newest snapshot, refusing to guess when some snapshot could not be read: a
/// damaged one may be the newest, and silently taking an older one would restore
/// older data than the user asked for.
/// The order of snapshots, oldest first: by time, then a rewrite (`rewrite`,
/// `tag`, `repair snapshots`, which keep the time) after a snapshot that is no
/// rewrite, so that `latest` and `--keep-last` take a rewrite over the original it
/// was made from (a `rewrite` that dropped a secret, without `--forget`); then by
/// id, so that the order is the same everywhere. A snapshot `repair snapshots`
/// cut down comes before any other of its time: a whole copy of it that `copy`
/// brought back from a replica's source is the one `latest` takes.
/// The tag `repair snapshots` gives what it writes.
pub const REPAIRED_TAG: &str = "repaired";

/// Whether `repair snapshots` wrote this snapshot (a copy of it that lost data).
pub fn is_repaired(s: &Snapshot) -> bool {
    s.tags.iter().any(|t| t == REPAIRED_TAG)
}

pub fn snapshot_order(
    a: (&SnapshotId, &Snapshot),
    b: (&SnapshotId, &Snapshot),
) -> std::cmp::Ordering {
    let rank = |s: &Snapshot| match (is_repaired(s), &s.original) {
        (true, _) => 0,
        (false, None) => 1,
        (false, Some(_)) => 2,
    };
    a.1.time
        .cmp(&b.1.time)
        .then(rank(a.1).cmp(&rank(b.1)))
        .then(a.0.cmp(b.0))
}

pub(crate) fn latest(list: &SnapshotList) -> Result<(SnapshotId, Snapshot)> {
    latest_in(&list.0, &list.1.iter().collect::<Vec<_>>())
}

/// The newest of `all` (sorted oldest first) not dated in the future, unless a
/// snapshot that could not be read (`bad`) might be newer.
pub(crate) fn latest_in(
    all: &[(SnapshotId, Snapshot)],
    bad: &[&SnapshotError],
) -> Result<(SnapshotId, Snapshot)> {
    // Not one dated in the future (a host whose clock is years ahead, `backup
    // --time 2099-...`): it would stay "latest" over every real backup after it,
    // and a restore of latest would bring back its old data. As retention
    // counts them (`forget`), they are passed over unless there is nothing else.
    let newest = all
        .iter()
        .rev()
        .find(|(_, s)| !crate::time::parse_rfc3339(&s.time).is_some_and(crate::time::in_the_future))
        .or(all.last());
    if !bad.is_empty() {
        return Err(Error::LatestUncertain {
            unreadable: bad
                .iter()
                .map(|e| e.to_string())
                .collect::<Vec<_>>()
                .join("; "),
            // The one `latest` would be, by the same rule (QA: the hint named a
            // snapshot dated 2099).
            newest_readable: newest.map(|(id, _)| id.short()),
        });
    }
    newest
        .cloned()
        .ok_or_else(|| Error::SnapshotNotFound("latest".into()))
}

/// What `latest` passed over when it chose `chosen` among `all` (sorted oldest
/// first): the snapshots after it, all dated ahead of this machine's clock. Said,
/// because a machine whose clock is behind (a fresh VM before NTP, a reset
/// hardware clock) would otherwise restore an older snapshot without a word (QA).
pub(crate) fn passed_over(all: &[(SnapshotId, Snapshot)], chosen: &SnapshotId) -> Option<String> {
    let at = all.iter().position(|(id, _)| id == chosen)?;
    let later = &all[at + 1..];
    let (newest_id, newest) = later.last()?;
    Some(format!(
        "latest is {} ({}): {} dated ahead of this machine's clock {} passed over, the \
         newest {} ({}); if the clock is behind, set it, or name the snapshot by its id",
        chosen.short(),
        all[at].1.time,
        if later.len() == 1 {
            "1 snapshot".to_string()
        } else {
            format!("{} snapshots", later.len())
        },
        if later.len() == 1 { "was" } else { "were" },
        newest_id.short(),
        newest.time
    ))
}

/// The one id among `ids` that starts with `spec` (hex, at least one digit).
pub fn resolve_snapshot_prefix(spec: &str, ids: &[SnapshotId]) -> Result<SnapshotId> {
    let lower = spec.to_ascii_lowercase();
    if lower.is_empty() || !lower.bytes().all(|b| b.is_ascii_hexdigit()) {
        return Err(Error::SnapshotNotFound(spec.into()));
    }
    let matches: Vec<SnapshotId> = ids
        .iter()
        .filter(|id| id.to_hex().starts_with(&lower))
        .copied()
        .collect();
    match matches.len() {
        0 => Err(Error::SnapshotNotFound(spec.into())),
        1 => Ok(matches[0]),
        _ => Err(Error::AmbiguousSnapshot {
            prefix: spec.into(),
            matches: {
                let mut shown = matches
                    .iter()
                    .take(5)
                    .map(|m| m.short())
                    .collect::<Vec<_>>()
                    .join(", ");
                if matches.len() > 5 {
                    shown.push_str(&format!(" and {} more", matches.len() - 5));
                }
                shown
            },
        }),
    }
}

#[cfg(test)]
mod tests {
    /// Whole seconds (servers before 2026-12-07) and seconds with decimals are
    /// read; anything else is no record.
    #[test]
    fn receive_records_are_read_in_both_forms() {
        let at = |b: &[u8]| super::parse_received(b).map(|t| t.timestamp_nanos_opt().unwrap());
        assert_eq!(at(b"1796665633"), Some(1_796_665_633_000_000_000));
        assert_eq!(
            at(b"1796665633.000000123\n"),
            Some(1_796_665_633_000_000_123)
        );
        assert_eq!(at(b"1796665633.25"), Some(1_796_665_633_250_000_000));
        for bad in [
            &b""[..],
            b".5",
            b"1796665633.",
            b"1796665633.1234567890",
            b"-1",
            b"1e9",
            b"17966 65633",
            b"1796665633.5.5",
        ] {
            assert_eq!(at(bad), None, "{:?}", String::from_utf8_lossy(bad));
        }
    }
}
