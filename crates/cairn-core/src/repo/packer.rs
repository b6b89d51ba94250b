//! Writing packs: blobs are appended in stream order to an in-memory pack; at the
//! target size the header is sealed and appended, the pack handed to the uploader.
//!
//! Ordering invariant (docs/FORMAT.md, "Write ordering"): a pack is stored before any
//! index file lists it, and an index file is stored before any snapshot needs it. The
//! upload threads keep it: each writes a pack, then records it for the next index
//! file, which is written after the packs it lists.

use crate::error::{Error, Result};
use crate::lock;
use crate::repo::blob::EncodedBlob;
use cairn_backend::direct::{DIRECT_ALIGN, pad_to_align};
use cairn_backend::{Backend, Bytes, names};
use cairn_format::consts::PACK_TRAILER_LEN;
use cairn_format::index::{IndexBlob, IndexFile, IndexPack};
use cairn_format::key::MasterKey;
use cairn_format::pack::{self, PackEntry};
use cairn_format::{IndexId, PackId};
use crossbeam_channel::{Receiver, Sender, bounded};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;

/// Index files are written after this many blobs, so an interrupted backup leaves
/// most of its uploaded data findable (a later backup then does not upload it again).
pub const INDEX_FLUSH_BLOBS: usize = 200_000;

/// ... and at least this often while packs are stored, so that an interrupted backup
/// re-sends at most about a minute of uploads, whatever the link's speed (a slow link
/// loses seconds of work, not gigabytes; a fast one writes one small index file a
/// minute).
pub const INDEX_FLUSH_INTERVAL: std::time::Duration = std::time::Duration::from_secs(60);

/// Recycles large buffers: allocating and freeing a fresh 4 or 16 MiB buffer each
/// time costs page faults, zeroing and TLB shootdowns (measured: about 10% of backup
/// CPU before this pool).
pub struct BufferPool {
    free: Mutex<Vec<Vec<u8>>>,
    max: usize,
}

impl BufferPool {
    pub fn new(max: usize) -> Self {
        BufferPool {
            free: Mutex::new(Vec::new()),
            max,
        }
    }
    /// A kept buffer, or a new empty one.
    fn pop(&self) -> Vec<u8> {
        self.free
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .pop()
            .unwrap_or_default()
    }

    /// An empty buffer with at least `capacity` bytes reserved.
    pub fn take(&self, capacity: usize) -> Vec<u8> {
        let mut v = self.pop();
        v.clear();
        v.reserve(capacity);
        v
    }
    /// A buffer with at least `capacity` bytes reserved that still holds what it
    /// held: its length is how much of it was ever written, so a caller that
    /// overwrites it all need not zero it first (the image readers: zeroing 4 MiB
    /// before every read was 3% of a first image backup's CPU).
    pub fn take_kept(&self, capacity: usize) -> Vec<u8> {
        let mut v = self.pop();
        if v.capacity() < capacity {
            // Grown: what it held is not worth copying over.
            v.clear();
            v.reserve(capacity);
        }
        v
    }
    pub fn put(&self, v: Vec<u8>) {
        let mut free = self.free.lock().unwrap_or_else(|e| e.into_inner());
        if free.len() < self.max {
            free.push(v);
        }
    }
}

/// A sealed pack's buffer while a backend stores it (see [`SealedPack::into_shared`]).
struct PackBuf {
    buf: Vec<u8>,
    start: usize,
    pool: Arc<BufferPool>,
}

impl AsRef<[u8]> for PackBuf {
    fn as_ref(&self) -> &[u8] {
        &self.buf[self.start..]
    }
}

impl Drop for PackBuf {
    fn drop(&mut self) {
        self.pool.put(std::mem::take(&mut self.buf));
    }
}

pub struct SealedPack {
    pub id: PackId,
    /// The pack is `buf[start..]`: it starts 4 KiB-aligned in memory, so that a local
    /// repository writes it with `O_DIRECT` straight from here.
    buf: Vec<u8>,
    start: usize,
    pub blobs: Vec<IndexBlob>,
}

impl SealedPack {
    /// The pack's bytes.
    pub fn bytes(&self) -> &[u8] {
        &self.buf[self.start..]
    }

    /// The pack as bytes a backend may hold on to (an HTTP body): no copy is made,
    /// and the buffer goes back to `pool` when the last holder drops it.
    fn into_shared(self, pool: Arc<BufferPool>) -> Bytes {
        Bytes::from_owner(PackBuf {
            buf: self.buf,
            start: self.start,
            pool,
        })
    }

    /// Holds only trees and chunk lists (backup keeps them apart from data).
    pub fn is_metadata(&self) -> bool {
        !self.blobs.is_empty()
            && self
                .blobs
                .iter()
                .all(|b| b.kind != cairn_format::pack::BlobKind::Data)
    }
}

/// Accumulates blobs into one pack at a time.
pub struct Packer {
    key: Arc<MasterKey>,
    pool: Arc<BufferPool>,
    target_size: usize,
    /// The pack being built is `buf[start..]` (see [`SealedPack`]).
    buf: Vec<u8>,
    start: usize,
    entries: Vec<PackEntry>,
    blobs: Vec<IndexBlob>,
}

impl Packer {
    pub fn new(key: Arc<MasterKey>, pool: Arc<BufferPool>, target_size: usize) -> Self {
        Packer {
            key,
            pool,
            target_size,
            buf: Vec::new(),
            start: 0,
            entries: Vec::new(),
            blobs: Vec::new(),
        }
    }

    pub fn is_empty(&self) -> bool {
        self.entries.is_empty()
    }

    /// Adds a blob; returns a sealed pack when the target size is reached.
    pub fn add(&mut self, b: EncodedBlob) -> Option<SealedPack> {
        if self.buf.capacity() == 0 {
            self.buf = self
                .pool
                .take(self.target_size + (1 << 20) + DIRECT_ALIGN as usize);
            self.start = pad_to_align(&mut self.buf);
        }
        let offset = (self.buf.len() - self.start) as u32;
        let length = b.sealed.len() as u32;
        self.buf.extend_from_slice(&b.sealed);
        self.entries.push(PackEntry {
            kind: b.kind,
            id: b.id,
            length,
            raw_length: b.raw_length,
            compression: b.compression,
        });
        self.blobs.push(IndexBlob {
            kind: b.kind,
            id: b.id,
            offset,
            length,
            raw_length: b.raw_length,
            compression: b.compression,
        });
        (self.buf.len() - self.start >= self.target_size).then(|| self.seal())
    }

    /// Seals the current pack (header, trailer) even if it is small.
    pub fn seal(&mut self) -> SealedPack {
        let header = pack::encode_header(&self.entries);
        let sealed = self.key.sealer.seal(&header);
        let mut buf = std::mem::take(&mut self.buf);
        let start = std::mem::take(&mut self.start);
        buf.reserve(sealed.len() + PACK_TRAILER_LEN);
        buf.extend_from_slice(&sealed);
        buf.extend_from_slice(&pack::encode_trailer(sealed.len() as u32));
        self.entries.clear();
        SealedPack {
            id: PackId::of_content(&buf[start..]),
            buf,
            start,
            blobs: std::mem::take(&mut self.blobs),
        }
    }

    pub fn finish(&mut self) -> Option<SealedPack> {
        (!self.is_empty()).then(|| self.seal())
    }
}

#[derive(Clone, Debug, Default)]
pub struct UploadStats {
    pub packs: u64,
    /// Bytes of the packs stored.
    pub bytes: u64,
    pub index_files: Vec<IndexId>,
    /// Bytes of the index files (and their dedup lists) stored.
    pub index_bytes: u64,
    /// The packs stored, for a writer to check they are still there before it
    /// commits.
    pub pack_ids: Vec<cairn_format::PackId>,
}

impl UploadStats {
    fn add_index_files(&mut self, files: Vec<(IndexId, u64)>) {
        for (id, bytes) in files {
            self.index_files.push(id);
            self.index_bytes += bytes;
        }
    }
}

/// Seals and stores an index file under the hash of its bytes. With `admin_names`
/// (the repository's `admin-names` feature), a file that supersedes or forgets is
/// stored as `index/admin-<id>`, the name readers require for those lists, and
/// every file gets its dedup list (`dedup/<id>`) for a server.
pub fn write_index_file(
    backend: &dyn Backend,
    key: &MasterKey,
    file: &IndexFile,
    admin_names: bool,
) -> Result<IndexId> {
    write_index_file_named(backend, key, file, admin_names)
        .map(|(id, _)| id)
        .map_err(|(e, _)| e)
}

/// [`write_index_file`], whose error also names the object it tried to store (a
/// failed put may still have stored it: the caller can look); with the bytes
/// stored.
fn write_index_file_named(
    backend: &dyn Backend,
    key: &MasterKey,
    file: &IndexFile,
    admin_names: bool,
) -> std::result::Result<(IndexId, u64), (Error, String)> {
    let sealed = key.sealer.seal(&file.encode());
    let id = IndexId::of_content(&sealed);
    let admin = admin_names && has_admin_lists(file);
    let name = if admin {
        names::admin_index(&id.to_hex())
    } else {
        names::index(&id.to_hex())
    };
    // Not for an operation whose lock is gone: the packs it names may be too
    // ([`super::lock::check_held_on`]). Checked again once stored, for a lock removed
    // meanwhile; the file is taken back then (a prune may have run in between).
    super::lock::check_held_on(backend).map_err(|e| (e, name.clone()))?;
    super::objects::store_immutable(backend, &name, &sealed, false)
        .map_err(|e| (e, name.clone()))?;
    if let Err(e) = super::lock::check_held_on(backend) {
        let _ = backend.delete(&name);
        return Err((e, name));
    }
    crate::hooks::point("index:written");
    if admin_names {
        // After the index file, never before: a list must not name ids that are not
        // indexed (docs/FORMAT.md, "Dedup lists"). A crash between the two leaves a
        // file without a list, which a server treats as unknown.
        // Its failure (a full disk, say) is not the index file's: the file is
        // stored, and callers must know that to clean up correctly. A file without
        // a list is a state readers and servers handle.
        let list = cairn_format::dedup::DedupList::of(id, file, admin).encode();
        if super::objects::store_immutable(backend, &names::dedup(&id.to_hex()), &list, false)
            .is_ok()
        {
            return Ok((id, (sealed.len() + list.len()) as u64));
        }
    }
    Ok((id, sealed.len() as u64))
}

/// Whether an index file removes or hides anything from readers: only files with
/// such lists need the `admin-` name.
pub fn has_admin_lists(file: &IndexFile) -> bool {
    !file.supersedes.is_empty() || !file.forgotten.is_empty()
}

/// Packs stored at once by default. A local disk takes several writes (each ending in
/// an fsync) in flight faster than one after another; object storage wants more.
pub const DEFAULT_UPLOAD_THREADS: usize = 3;

/// What the upload threads share: packs stored but not yet in an index file, the
/// counts, and the first error.
struct UploadShared {
    /// Told the bytes queued and stored, when the operation shows progress.
    progress: std::sync::OnceLock<crate::progress::Progress>,
    /// Packs of data, and packs of trees and chunk lists, stored and not yet in an
    /// index file (kept apart so that a backup client of a server reads only the
    /// small files of the second kind), and the blobs in both.
    pending: Mutex<Pending>,
    /// Whether index files get their dedup lists (the `admin-names` feature).
    admin_names: std::sync::atomic::AtomicBool,
    /// Packs queued and packs done (stored or failed), for [`Uploader::flush`].
    queued: std::sync::atomic::AtomicU64,
    done: Mutex<u64>,
    done_cv: std::sync::Condvar,
    stats: Mutex<UploadStats>,
    failed: Mutex<Option<Error>>,
    flush_blobs: std::sync::atomic::AtomicUsize,
    flush_packs: std::sync::atomic::AtomicUsize,
    /// Milliseconds between index files while packs arrive, and when the last was
    /// written.
    flush_interval_ms: std::sync::atomic::AtomicU64,
    last_flush: Mutex<std::time::Instant>,
    /// The room kept free on the storage ([`Uploader::keep_free`]).
    room: Arc<super::room::Room>,
}

#[derive(Default)]
struct Pending {
    data: IndexFile,
    meta: IndexFile,
    blobs: usize,
}

impl Pending {
    fn packs(&self) -> impl Iterator<Item = &IndexPack> {
        self.data.packs.iter().chain(&self.meta.packs)
    }
    /// Writes the index files (data first, then metadata) and empties the lists.
    /// A list is emptied also when its file's put failed but the file is stored
    /// after all (a put may fail after the storage took the object): its packs are
    /// indexed and must not be deleted.
    fn write(
        &mut self,
        backend: &dyn Backend,
        key: &MasterKey,
        admin_names: bool,
    ) -> Result<Vec<(IndexId, u64)>> {
        let mut ids = Vec::new();
        for f in [&mut self.data, &mut self.meta] {
            if !f.packs.is_empty() {
                match write_index_file_named(backend, key, f, admin_names) {
                    Ok(id) => ids.push(id),
                    Err((e, name)) => {
                        let absent = matches!(
                            backend.get_bounded(&name, 0),
                            Err(ref g) if g.is_not_found()
                        );
                        if absent {
                            return Err(e);
                        }
                        *f = IndexFile::default();
                        return Err(e);
                    }
                }
                *f = IndexFile::default();
            }
        }
        self.blobs = 0;
        Ok(ids)
    }
}

/// Background threads that store packs and then the index files listing them. Each
/// pack joins the pending index file only once its own `put` has returned, and an
/// index file is written from those, so an index file never lists a pack that is
/// not stored, whatever order the threads finish in.
pub struct Uploader {
    tx: Option<Sender<SealedPack>>,
    handles: Vec<JoinHandle<()>>,
    shared: Arc<UploadShared>,
    backend: Arc<dyn Backend>,
    key: Arc<MasterKey>,
    started: bool,
}

impl Uploader {
    /// Stored packs' buffers go back to `pool` for the packers to reuse.
    pub fn start(backend: Arc<dyn Backend>, key: Arc<MasterKey>, pool: Arc<BufferPool>) -> Self {
        Self::start_with(backend, key, pool, DEFAULT_UPLOAD_THREADS)
    }

    pub fn start_with(
        backend: Arc<dyn Backend>,
        key: Arc<MasterKey>,
        pool: Arc<BufferPool>,
        threads: usize,
    ) -> Self {
        let threads = threads.max(1);
        let (tx, rx): (Sender<SealedPack>, Receiver<SealedPack>) = bounded(1);
        let shared = Arc::new(UploadShared {
            progress: std::sync::OnceLock::new(),
            pending: Mutex::new(Pending::default()),
            admin_names: std::sync::atomic::AtomicBool::new(false),
            queued: std::sync::atomic::AtomicU64::new(0),
            done: Mutex::new(0),
            done_cv: std::sync::Condvar::new(),
            stats: Mutex::new(UploadStats::default()),
            failed: Mutex::new(None),
            flush_blobs: std::sync::atomic::AtomicUsize::new(INDEX_FLUSH_BLOBS),
            flush_packs: std::sync::atomic::AtomicUsize::new(usize::MAX),
            flush_interval_ms: std::sync::atomic::AtomicU64::new(
                INDEX_FLUSH_INTERVAL.as_millis() as u64
            ),
            last_flush: Mutex::new(std::time::Instant::now()),
            room: Arc::default(),
        });
        let mut handles = Vec::with_capacity(threads);
        for _ in 0..threads {
            let rx = rx.clone();
            let (backend, key, pool, shared) =
                (backend.clone(), key.clone(), pool.clone(), shared.clone());
            let h = std::thread::Builder::new()
                .name("cairn-upload".into())
                .spawn(move || upload_loop(rx, backend.as_ref(), &key, pool, &shared));
            match h {
                Ok(h) => handles.push(h),
                Err(_) => break,
            }
        }
        let started = !handles.is_empty();
        Uploader {
            tx: started.then_some(tx),
            handles,
            shared,
            backend,
            key,
            started,
        }
    }

    /// Writes an index file every `blobs` blobs or `packs` packs stored (default
    /// 200,000 blobs, any number of packs): fewer re-sent packs after an
    /// interruption, more index files.
    /// Writes an index file at least every `every` while packs are stored (default
    /// [`INDEX_FLUSH_INTERVAL`]).
    pub fn set_index_flush_interval(&mut self, every: std::time::Duration) {
        self.shared.flush_interval_ms.store(
            every.as_millis() as u64,
            std::sync::atomic::Ordering::Relaxed,
        );
    }

    pub fn set_index_flush(&mut self, blobs: usize, packs: usize) {
        use std::sync::atomic::Ordering::Relaxed;
        self.shared.flush_blobs.store(blobs.max(1), Relaxed);
        self.shared.flush_packs.store(packs.max(1), Relaxed);
    }

    /// Stores no pack that would leave the storage with less than `bytes` free
    /// beside the index files this uploader wrote ([`super::room`]): what adds
    /// data stops there with "no space left", and forget and prune, which free
    /// space but write first, still have the room they need.
    pub fn keep_free(&mut self, bytes: u64) {
        self.shared.room.keep(bytes);
    }

    /// Gives index files their dedup lists (for a repository with the
    /// `admin-names` feature: [`Repository::admin_names`]).
    pub fn set_admin_names(&mut self, on: bool) {
        self.shared
            .admin_names
            .store(on, std::sync::atomic::Ordering::Relaxed);
    }

    /// Reports the bytes queued and stored to `progress` (what a slow link still
    /// has to carry once everything is read).
    pub fn set_progress(&self, progress: crate::progress::Progress) {
        let _ = self.shared.progress.set(progress);
    }

    /// Queues a pack. An error here means the uploader stopped; `finish` says why.
    pub fn send(&self, p: SealedPack) -> Result<()> {
        if lock(&self.shared.failed).is_some() {
            return Err(Error::Interrupted);
        }
        match &self.tx {
            Some(tx) => {
                self.shared
                    .queued
                    .fetch_add(1, std::sync::atomic::Ordering::SeqCst);
                if let Some(pr) = self.shared.progress.get() {
                    pr.upload_queued(p.bytes().len() as u64);
                }
                tx.send(p).map_err(|_| Error::Interrupted)
            }
            None => Err(Error::Invalid("could not start the upload thread".into())),
        }
    }

    /// Waits until every queued pack is stored and writes the index files listing
    /// them, and goes on running: afterwards everything sent so far is indexed.
    pub fn flush(&self) -> Result<()> {
        use std::sync::atomic::Ordering::SeqCst;
        let want = self.shared.queued.load(SeqCst);
        let mut done = lock(&self.shared.done);
        while *done < want {
            if self.handles.iter().all(|h| h.is_finished()) {
                return Err(Error::Invalid("upload thread panicked".into()));
            }
            done = self
                .shared
                .done_cv
                .wait_timeout(done, std::time::Duration::from_millis(200))
                .unwrap_or_else(|e| e.into_inner())
                .0;
        }
        drop(done);
        if lock(&self.shared.failed).is_some() {
            return Err(Error::Interrupted);
        }
        let admin_names = self.shared.admin_names.load(SeqCst);
        let ids =
            lock(&self.shared.pending).write(self.backend.as_ref(), &self.key, admin_names)?;
        *lock(&self.shared.last_flush) = std::time::Instant::now();
        lock(&self.shared.stats).add_index_files(ids);
        Ok(())
    }

    /// [`Self::finish`] after the work that fed it ended with `result`. The
    /// uploader's error wins: it says why the pipeline stopped (the disk is full),
    /// where a [`Self::send`] after it saw only its queue stop ("interrupted").
    pub fn finish_after<T>(self, result: Result<T>) -> Result<(T, UploadStats)> {
        match (result, self.finish()) {
            (_, Err(up)) => Err(up),
            (Err(e), Ok(_)) => Err(e),
            (Ok(t), Ok(stats)) => Ok((t, stats)),
        }
    }

    /// Waits for every queued pack and writes the final index file. After a failed
    /// put, the packs that were stored are still indexed (reusable data), or, if even
    /// that fails (disk full), deleted; the first error is returned.
    pub fn finish(mut self) -> Result<UploadStats> {
        self.tx = None;
        // Stopped early with packs still queued (a slow link), or stopped while
        // waiting here for them: say why the stop takes a while, and how not to wait.
        if let Some(pr) = self.shared.progress.get() {
            use std::sync::atomic::Ordering::SeqCst;
            let want = self.shared.queued.load(SeqCst);
            let mut done = lock(&self.shared.done);
            while *done < want && !self.handles.iter().all(|h| h.is_finished()) {
                if pr.is_cancelled() {
                    let s = pr.status();
                    let waiting = s.upload_queued_bytes.saturating_sub(s.upload_done_bytes);
                    if waiting > 0 {
                        pr.notice(format!(
                            "stopping: storing the {} already packed, so that the next run \
                             need not send it again (interrupt again to abandon it)",
                            crate::units::bytes(waiting, 1)
                        ));
                    }
                    break;
                }
                done = self
                    .shared
                    .done_cv
                    .wait_timeout(done, std::time::Duration::from_millis(100))
                    .unwrap_or_else(|e| e.into_inner())
                    .0;
            }
        }
        let mut panicked = false;
        for h in self.handles.drain(..) {
            panicked |= h.join().is_err();
        }
        if !self.started {
            return Err(Error::Invalid("could not start the upload thread".into()));
        }
        let failed = lock(&self.shared.failed).take();
        let mut pending = std::mem::take(&mut *lock(&self.shared.pending));
        let admin_names = self
            .shared
            .admin_names
            .load(std::sync::atomic::Ordering::Relaxed);
        let written = pending.write(self.backend.as_ref(), &self.key, admin_names);
        if let Some(e) = failed {
            if written.is_err() {
                // What was not indexed (write empties a list only once it is stored).
                for p in pending.packs() {
                    let _ = self.backend.delete(&names::pack(&p.id.to_hex()));
                }
            }
            return Err(e);
        }
        if panicked {
            return Err(Error::Invalid("upload thread panicked".into()));
        }
        let mut stats = std::mem::take(&mut *lock(&self.shared.stats));
        stats.add_index_files(written?);
        Ok(stats)
    }
}

fn upload_loop(
    rx: Receiver<SealedPack>,
    backend: &dyn Backend,
    key: &MasterKey,
    pool: Arc<BufferPool>,
    shared: &UploadShared,
) {
    for mut p in rx {
        if lock(&shared.failed).is_some() {
            shared.pack_done();
            continue; // drain: the backup is failing, nothing more is stored
        }
        // Packs of trees and chunk lists go through `put_metadata_new`: a caching
        // backend keeps them, so the next backup reads its parent's trees locally.
        let name = names::pack(&p.id.to_hex());
        let metadata = p.is_metadata();
        let (id, blobs) = (p.id, std::mem::take(&mut p.blobs));
        let bytes = p.into_shared(pool.clone());
        let len = bytes.len() as u64;
        let written = lock(&shared.stats).index_bytes;
        let claim = match shared.room.claim(backend, &name, len, written) {
            Ok(c) => c,
            Err(e) => {
                lock(&shared.failed).get_or_insert(e.into());
                shared.pack_done();
                continue;
            }
        };
        let stored = super::objects::store_immutable_owned(backend, &name, bytes, metadata);
        drop(claim);
        if let Err(e) = stored {
            lock(&shared.failed).get_or_insert(e);
            shared.pack_done();
            continue;
        }
        crate::hooks::point("pack:stored");
        if let Some(pr) = shared.progress.get() {
            pr.uploaded(len);
        }
        {
            let mut st = lock(&shared.stats);
            st.packs += 1;
            st.bytes += len;
        }
        lock(&shared.stats).pack_ids.push(id);
        let mut pending = lock(&shared.pending);
        pending.blobs += blobs.len();
        let list = if metadata {
            &mut pending.meta
        } else {
            &mut pending.data
        };
        list.packs.push(IndexPack { id, blobs });
        let (blobs, packs) = (&shared.flush_blobs, &shared.flush_packs);
        let interval = std::time::Duration::from_millis(
            shared
                .flush_interval_ms
                .load(std::sync::atomic::Ordering::Relaxed),
        );
        let due = lock(&shared.last_flush).elapsed() >= interval;
        let npacks = pending.data.packs.len() + pending.meta.packs.len();
        if pending.blobs >= blobs.load(std::sync::atomic::Ordering::Relaxed)
            || npacks >= packs.load(std::sync::atomic::Ordering::Relaxed)
            || due
        {
            // Written under the lock: index files are rare, and a pack stored by
            // another thread meanwhile simply waits for the next one.
            let admin_names = shared
                .admin_names
                .load(std::sync::atomic::Ordering::Relaxed);
            match pending.write(backend, key, admin_names) {
                Ok(ids) => {
                    lock(&shared.stats).add_index_files(ids);
                    *lock(&shared.last_flush) = std::time::Instant::now();
                }
                Err(e) => {
                    lock(&shared.failed).get_or_insert(e);
                }
            }
        }
        drop(pending);
        shared.pack_done();
    }
}

impl UploadShared {
    fn pack_done(&self) {
        *lock(&self.done) += 1;
        self.done_cv.notify_all();
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::testutil::{mem_repo, seal};
    use cairn_format::pack::BlobKind;

    /// Sends one single-blob pack per byte value and returns the index files written.
    fn upload(
        repo: &crate::Repository,
        interval: Option<std::time::Duration>,
        bytes: &[u8],
    ) -> usize {
        let pool = Arc::new(BufferPool::new(2));
        let mut up =
            Uploader::start_with(repo.backend().clone(), repo.key().clone(), pool.clone(), 1);
        if let Some(every) = interval {
            up.set_index_flush_interval(every);
        }
        for b in bytes {
            up.send(seal(repo, &[(BlobKind::Data, vec![*b; 1000])]))
                .unwrap();
        }
        let stats = up.finish().unwrap();
        assert_eq!(stats.packs, bytes.len() as u64);
        // Each stored pack's buffer came back for the packers to reuse, though the
        // backend was handed the bytes by value.
        let kept = pool.free.lock().unwrap().len();
        assert_eq!(kept, bytes.len().min(2), "buffers back in the pool");
        stats.index_files.len()
    }

    /// With the interval elapsed at every pack, each stored pack is indexed at once:
    /// an interruption then loses only the packs still in flight.
    #[test]
    fn index_files_follow_the_packs_when_the_interval_is_short() {
        let repo = mem_repo();
        let zero = Some(std::time::Duration::ZERO);
        assert_eq!(
            upload(&repo, zero, &[0, 1, 2]),
            3,
            "one index file per pack"
        );
        // The default interval (a minute) batches them.
        assert_eq!(upload(&repo, None, &[10, 11, 12]), 1);
    }
}
