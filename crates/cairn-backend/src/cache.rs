//! A local copy of the objects every command reads again and again — index files,
//! snapshots, and the packs of trees and chunk lists — so that listing snapshots and
//! incremental backups of a remote repository do not download them each time.
//!
//! Safe by construction: these objects are immutable (named by the hash of their
//! content), so a cached copy is never stale while its name exists; every `list`
//! drops cached copies whose object is gone (a prune ran elsewhere), and the engine
//! lists before it reads index files and snapshots. Each cached file carries a
//! BLAKE3 checksum of its content, checked before first use in a process, so a
//! damaged cache is re-downloaded instead of being reported as a damaged repository.
//! Files are written to a temporary name and renamed: concurrent processes sharing
//! the cache see whole files only. Losing the cache costs only downloads.

use crate::{Backend, BackendError, BackendErrorKind, ObjectInfo, Result, names};
use std::collections::HashSet;
use std::io::Write;
use std::os::unix::fs::DirBuilderExt;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};

const SUM_LEN: usize = 32;

/// Where cairn keeps local state for repositories (caches, the SSD index, copy
/// maps): `$XDG_CACHE_HOME/cairn`, else `~/.cache/cairn`, with the home
/// directory from the user database when `HOME` is not set (a systemd service,
/// `env -i`); None without any.
pub fn base_dir() -> Option<PathBuf> {
    let base = std::env::var_os("XDG_CACHE_HOME")
        .filter(|v| !v.is_empty())
        .map(PathBuf::from)
        .or_else(|| {
            std::env::var_os("HOME")
                .filter(|v| !v.is_empty())
                .map(PathBuf::from)
                .or_else(|| {
                    nix::unistd::User::from_uid(nix::unistd::geteuid())
                        .ok()
                        .flatten()
                        .map(|u| u.dir)
                        .filter(|d| d.is_absolute() && d.is_dir())
                })
                .map(|h| h.join(".cache"))
        })?;
    Some(base.join("cairn"))
}

#[derive(Debug)]
pub struct CachedBackend {
    inner: Arc<dyn Backend>,
    dir: PathBuf,
    /// Cached files checked against their checksum in this process.
    verified: Mutex<HashSet<String>>,
}

/// Objects kept whole in the cache by name alone.
fn cached_by_name(name: &str) -> bool {
    name.starts_with(names::INDEX) || name.starts_with(names::SNAPSHOTS)
}

/// Whether an object kept by name (`index/[admin-]<hex>`, `snapshots/<hex>`) is
/// named by `sum`, the BLAKE3 hash of its content, as every such object is.
fn named_by(name: &str, sum: &blake3::Hash) -> bool {
    let last = name.rsplit('/').next().unwrap_or(name);
    let hex = last.strip_prefix("admin-").unwrap_or(last);
    hex.eq_ignore_ascii_case(sum.to_hex().as_str())
}

fn valid_name(name: &str) -> bool {
    !name.is_empty()
        && name
            .split('/')
            .all(|c| !c.is_empty() && c != "." && c != "..")
}

impl CachedBackend {
    /// `dir` is this repository's own cache directory (created when needed).
    pub fn new(inner: Arc<dyn Backend>, dir: PathBuf) -> Self {
        CachedBackend {
            inner,
            dir,
            verified: Mutex::new(HashSet::new()),
        }
    }

    /// The name of a repository's cache directory under the cache base: 24 hex
    /// digits of the hash of its location.
    pub fn dir_name(location: &str) -> String {
        blake3::hash(location.as_bytes()).to_hex().as_str()[..24].to_string()
    }

    pub fn dir(&self) -> &Path {
        &self.dir
    }

    fn path(&self, name: &str) -> Option<PathBuf> {
        valid_name(name).then(|| self.dir.join(name))
    }

    /// The cached content, if present and intact (a damaged file is removed).
    fn load(&self, name: &str) -> Option<Vec<u8>> {
        let path = self.path(name)?;
        let mut data = std::fs::read(&path).ok()?;
        let first_use = !self
            .verified
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .contains(name);
        let ok = data.len() >= SUM_LEN && {
            let body = data.len() - SUM_LEN;
            !first_use || blake3::hash(&data[..body]).as_bytes()[..] == data[body..]
        };
        if !ok {
            let _ = std::fs::remove_file(&path);
            return None;
        }
        if first_use {
            self.verified
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .insert(name.to_string());
        }
        data.truncate(data.len() - SUM_LEN);
        Some(data)
    }

    /// Keeps a copy. Failures (full disk, read-only home) only cost later downloads.
    /// A copy whose content is not what its name says (damaged on the way, or at
    /// its source) is not kept: the reader reports it, and a later run downloads
    /// it again instead of reading the damage from here for ever.
    fn store(&self, name: &str, data: &[u8]) {
        let sum = blake3::hash(data);
        if !named_by(name, &sum) {
            return;
        }
        let Some(path) = self.path(name) else { return };
        let Some(parent) = path.parent() else { return };
        // Private to this user, as the trees it holds name every backed-up file.
        if std::fs::DirBuilder::new()
            .recursive(true)
            .mode(0o700)
            .create(parent)
            .is_err()
        {
            return;
        }
        self.tag_cache_dir();
        let tmp = parent.join(format!(
            ".tmp-{}-{:?}",
            std::process::id(),
            std::thread::current().id()
        ));
        let written = std::fs::File::create(&tmp).and_then(|mut f| {
            f.write_all(data)?;
            f.write_all(sum.as_bytes())
        });
        if written.is_err() || std::fs::rename(&tmp, &path).is_err() {
            let _ = std::fs::remove_file(&tmp);
        } else {
            self.verified
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .insert(name.to_string());
        }
    }

    /// A range of a cached copy: the first use in this process reads and checks the
    /// whole file, later ones read only the range. `None`: not cached (or damaged).
    fn load_range(&self, name: &str, offset: u64, length: u64) -> Option<Result<Vec<u8>>> {
        let known = self
            .verified
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .contains(name);
        if !known {
            let d = self.load(name)?;
            return Some(range_of(name, &d, offset, length));
        }
        use std::os::unix::fs::FileExt;
        let f = std::fs::File::open(self.path(name)?).ok()?;
        let body = f.metadata().ok()?.len().checked_sub(SUM_LEN as u64)?;
        match offset.checked_add(length) {
            Some(end) if end <= body => {}
            // Shorter than when it was checked (changed under us): fetch it again.
            _ => {
                self.forget(name);
                return None;
            }
        }
        let mut buf = vec![0u8; usize::try_from(length).ok()?];
        f.read_exact_at(&mut buf, offset).ok()?;
        Some(Ok(buf))
    }

    fn forget(&self, name: &str) {
        if let Some(p) = self.path(name) {
            let _ = std::fs::remove_file(p);
        }
    }

    /// Marks the cache so that backup tools (cairn's own `--exclude-caches`
    /// included, and tar, borg, restic) skip it.
    fn tag_cache_dir(&self) {
        let Some(root) = self.dir.parent() else {
            return;
        };
        let tag = root.join("CACHEDIR.TAG");
        if !tag.exists() {
            let _ = std::fs::write(
                &tag,
                "Signature: 8a477f597d28d172789f06886806bc55\n\
                 # This file is a cache directory tag created by cairn.\n",
            );
        }
    }

    /// Removes cached copies under `prefix` whose object the listing no longer shows.
    fn prune_to(&self, prefix: &str, listed: &[ObjectInfo]) {
        let Some(dir) = self.path(prefix.trim_end_matches('/')) else {
            return;
        };
        let live: HashSet<&str> = listed.iter().map(|o| o.name.as_str()).collect();
        let mut stack = vec![dir];
        while let Some(d) = stack.pop() {
            let Ok(rd) = std::fs::read_dir(&d) else {
                continue;
            };
            for e in rd.flatten() {
                let p = e.path();
                if e.file_type().map(|t| t.is_dir()).unwrap_or(false) {
                    stack.push(p);
                    continue;
                }
                let Ok(rel) = p.strip_prefix(&self.dir) else {
                    continue;
                };
                let Some(rel) = rel.to_str() else { continue };
                if rel.contains("/.tmp-") {
                    // Another process's write in progress, or a killed one's leftover.
                    let stale = e
                        .metadata()
                        .and_then(|m| m.modified())
                        .ok()
                        .and_then(|t| t.elapsed().ok())
                        .is_some_and(|age| age > std::time::Duration::from_secs(3600));
                    if stale {
                        let _ = std::fs::remove_file(&p);
                    }
                    continue;
                }
                if !live.contains(rel) {
                    let _ = std::fs::remove_file(&p);
                    self.verified
                        .lock()
                        .unwrap_or_else(|p| p.into_inner())
                        .remove(rel);
                }
            }
        }
    }
}

fn range_of(name: &str, data: &[u8], offset: u64, length: u64) -> Result<Vec<u8>> {
    match offset.checked_add(length) {
        Some(end) if end <= data.len() as u64 => Ok(data[offset as usize..end as usize].to_vec()),
        _ => Err(BackendError {
            kind: BackendErrorKind::OutOfRange,
            op: "get",
            path: name.to_string(),
            message: format!(
                "range {offset}+{length} runs past the end of the object ({} bytes)",
                data.len()
            ),
        }),
    }
}

impl Backend for CachedBackend {
    fn location(&self) -> String {
        self.inner.location()
    }
    fn put(&self, name: &str, data: &[u8]) -> Result<()> {
        self.inner.put(name, data)?;
        if cached_by_name(name) {
            self.store(name, data);
        }
        Ok(())
    }
    fn put_new(&self, name: &str, data: &[u8]) -> Result<()> {
        self.inner.put_new(name, data)?;
        if cached_by_name(name) {
            self.store(name, data);
        }
        Ok(())
    }
    fn get(&self, name: &str) -> Result<Vec<u8>> {
        if cached_by_name(name) {
            if let Some(d) = self.load(name) {
                return Ok(d);
            }
            let d = self.inner.get(name)?;
            self.store(name, &d);
            return Ok(d);
        }
        self.inner.get(name)
    }
    fn size(&self, name: &str) -> Result<u64> {
        self.inner.size(name)
    }
    fn get_bounded(&self, name: &str, max: u64) -> Result<Vec<u8>> {
        if cached_by_name(name) {
            if let Some(d) = self.load(name) {
                if d.len() as u64 > max {
                    return Err(BackendError::too_large("get", name, d.len() as u64, max));
                }
                return Ok(d);
            }
            let d = self.inner.get_bounded(name, max)?;
            self.store(name, &d);
            return Ok(d);
        }
        self.inner.get_bounded(name, max)
    }
    fn get_range(&self, name: &str, offset: u64, length: u64) -> Result<Vec<u8>> {
        // Plain range reads (restore's data, a pack read whole to verify it) always
        // go to the storage; only `get_metadata_range` uses cached packs.
        self.inner.get_range(name, offset, length)
    }
    fn get_range_into(
        &self,
        name: &str,
        offset: u64,
        length: u64,
        out: &mut crate::bufpool::Pooled,
    ) -> Result<()> {
        self.inner.get_range_into(name, offset, length, out)
    }
    fn list(&self, prefix: &str) -> Result<Vec<ObjectInfo>> {
        let listed = self.inner.list(prefix)?;
        if prefix.ends_with('/') {
            self.prune_to(prefix, &listed);
        }
        Ok(listed)
    }
    fn delete(&self, name: &str) -> Result<()> {
        self.forget(name);
        self.inner.delete(name)
    }
    fn put_metadata_new(&self, name: &str, data: &[u8]) -> Result<()> {
        self.inner.put_metadata_new(name, data)?;
        self.store(name, data);
        Ok(())
    }
    fn put_new_owned(&self, name: &str, data: crate::Bytes, metadata: bool) -> Result<()> {
        self.inner.put_new_owned(name, data.clone(), metadata)?;
        if metadata || cached_by_name(name) {
            self.store(name, &data);
        }
        Ok(())
    }
    fn get_metadata_range(&self, name: &str, offset: u64, length: u64) -> Result<Vec<u8>> {
        if let Some(r) = self.load_range(name, offset, length) {
            return r;
        }
        let d = self.inner.get(name)?;
        self.store(name, &d);
        range_of(name, &d, offset, length)
    }
    fn remove_stale_temporaries(&self) -> Result<u64> {
        self.inner.remove_stale_temporaries()
    }
    fn lock_owner_prefix(&self) -> Option<[u8; 8]> {
        self.inner.lock_owner_prefix()
    }
    fn free_space(&self) -> Option<u64> {
        self.inner.free_space()
    }
    fn clock_skew(&self) -> Option<i64> {
        self.inner.clock_skew()
    }
    fn may_remove(&self) -> Result<bool> {
        self.inner.may_remove()
    }
    fn bound_host(&self) -> Result<Option<String>> {
        self.inner.bound_host()
    }
    fn partial_view(&self) -> Result<Option<String>> {
        self.inner.partial_view()
    }
    fn dedup_plan(&self) -> Result<Option<crate::DedupPlan>> {
        self.inner.dedup_plan()
    }
    fn dedup_query(&self, ids: &[[u8; 32]]) -> Result<Vec<crate::DedupAnswer>> {
        self.inner.dedup_query(ids)
    }
    fn dedup_confirm(&self, ids: &[[u8; 32]]) -> Result<Vec<[u8; 32]>> {
        self.inner.dedup_confirm(ids)
    }
    fn job_slot(&self, operation: &str, host: &str) -> Result<crate::JobSlot> {
        self.inner.job_slot(operation, host)
    }
    fn report_job_progress(&self, report: crate::JobReport) {
        self.inner.report_job_progress(report)
    }
    fn release_job_slot(&self) {
        self.inner.release_job_slot()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{MemBackend, ThrottledBackend};

    #[test]
    fn conformance_through_the_cache() {
        let dir = tempfile::tempdir().unwrap();
        let b = CachedBackend::new(Arc::new(MemBackend::new()), dir.path().join("repo"));
        crate::conformance::run(&b);
    }

    #[test]
    fn cached_objects_are_read_once_and_follow_the_listing() {
        let dir = tempfile::tempdir().unwrap();
        let store = Arc::new(MemBackend::new());
        let counted = Arc::new(ThrottledBackend::new(store.clone(), None, None));
        let traffic = counted.traffic();
        let b = CachedBackend::new(counted, dir.path().join("repo"));
        // Names are the BLAKE3 hash of the content, as in a repository.
        let hash = |d: &[u8]| blake3::hash(d).to_hex().to_string();
        let snap = format!("snapshots/{}", hash(b"snapshot"));
        let pack_hex = hash(&[5u8; 1000]);
        let pack = format!("data/{}/{pack_hex}", &pack_hex[..2]);
        let index = format!("index/{}", hash(b"index"));
        store.put(&snap, b"snapshot").unwrap();
        store.put(&pack, &[5u8; 1000]).unwrap();
        b.put(&index, b"index").unwrap();
        assert_eq!(b.get(&snap).unwrap(), b"snapshot");
        assert_eq!(b.get_metadata_range(&pack, 10, 5).unwrap(), [5; 5]);
        let before = traffic.downloaded();
        assert_eq!(before, 8 + 1000, "snapshot and whole pack fetched once");
        for _ in 0..3 {
            assert_eq!(b.get(&snap).unwrap(), b"snapshot");
            assert_eq!(b.get(&index).unwrap(), b"index");
            assert_eq!(b.get_metadata_range(&pack, 0, 2).unwrap(), [5; 2]);
        }
        assert_eq!(
            traffic.downloaded(),
            before,
            "later reads come from the cache"
        );
        // A plain range read goes to the storage (check must see what it holds).
        assert_eq!(b.get_range(&pack, 999, 1).unwrap(), [5]);
        assert_eq!(traffic.downloaded(), before + 1);
        assert!(b.get_metadata_range(&pack, 999, 2).is_err());

        // An object whose content is not what its name says (damaged on the way
        // or at its source) is not kept: each read fetches it again.
        let wrong = format!("index/{}", hash(b"what the name says"));
        store.put(&wrong, b"something else").unwrap();
        let before = traffic.downloaded();
        for _ in 0..2 {
            assert_eq!(b.get(&wrong).unwrap(), b"something else");
        }
        assert_eq!(traffic.downloaded(), before + 2 * 14);
        assert!(!dir.path().join("repo").join(&wrong).exists());

        // A snapshot deleted elsewhere disappears from the cache at the next listing.
        store.delete(&snap).unwrap();
        assert!(b.list("snapshots/").unwrap().is_empty());
        assert!(b.get(&snap).unwrap_err().is_not_found());

        // A damaged cached copy is fetched again, not reported as damage.
        let f = dir.path().join("repo").join(&index);
        let mut raw = std::fs::read(&f).unwrap();
        raw[0] ^= 1;
        std::fs::write(&f, raw).unwrap();
        let fresh = CachedBackend::new(b.inner.clone(), dir.path().join("repo"));
        assert_eq!(fresh.get(&index).unwrap(), b"index");
        assert!(dir.path().join("CACHEDIR.TAG").exists());
    }
}
