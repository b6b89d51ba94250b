//! Dedup queries: a backup through a cairn server that answers them asks which
//! chunk ids the datastore holds instead of loading the datastore's whole index.
//!
//! Callers on many threads (chunk workers, directory scanners) ask at once;
//! [`Coalescer`] turns them into few requests: whoever asks while no request is out
//! sends everything asked so far, the others wait for that answer or send the next
//! batch. Batches grow with the number of waiting threads and the round-trip time,
//! without a timer. "Stored" answers are remembered for the session: while the
//! backup holds its lock no prune can remove them (docs/FORMAT.md, "Dedup lists").

use crate::error::{Error, Result};
use crate::index::IdSet;
use crate::repo::blob::EncodedBlob;
use cairn_backend::{Backend, DedupAnswer};
use cairn_format::BlobId;
use cairn_format::pack::BlobKind;
use std::collections::HashMap;
use std::sync::{Arc, Condvar, Mutex};

/// The client side of a server's dedup service, for one backup session.
pub struct DedupClient {
    backend: Arc<dyn Backend>,
    stored: Vec<Mutex<IdSet>>,
    co: Coalescer,
    /// Index files the session read (those the server's plan named).
    pub index_files_read: usize,
    /// Data chunks the server knew at the start.
    pub chunks_known: u64,
    /// Where "stored" answers are kept between backups, and the server's epoch
    /// they hold under.
    memo: Option<(std::path::PathBuf, String)>,
    /// Ids taken from that file at the start.
    pub remembered: usize,
    /// Packs the server found missing or cut short when it planned the backup.
    pub missing_packs: std::collections::HashSet<cairn_format::PackId>,
    /// Chunk ids sent to the server to ask about (the others were known).
    asked: std::sync::atomic::AtomicU64,
    /// Of those, the ones the server said it holds.
    answered_stored: std::sync::atomic::AtomicU64,
}

const MEMO_MAGIC: &[u8; 8] = b"CAIRNDM1";
/// Ids remembered at most (a client's own data; 32 MiB of file).
const MEMO_MAX_IDS: usize = 1 << 20;

impl std::fmt::Debug for DedupClient {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("DedupClient").finish_non_exhaustive()
    }
}

impl DedupClient {
    /// `memo`: the file of "stored" answers from earlier backups of this datastore
    /// and the server's epoch now; the file is used only if written under it.
    pub(crate) fn new(
        backend: Arc<dyn Backend>,
        index_files_read: usize,
        chunks_known: u64,
        memo: Option<(std::path::PathBuf, String)>,
    ) -> Self {
        let mut c = DedupClient {
            backend,
            stored: (0..32).map(|_| Mutex::new(IdSet::default())).collect(),
            co: Coalescer::default(),
            index_files_read,
            chunks_known,
            memo: memo.filter(|(_, epoch)| !epoch.is_empty()),
            remembered: 0,
            missing_packs: Default::default(),
            asked: Default::default(),
            answered_stored: Default::default(),
        };
        if let Some((path, epoch)) = &c.memo
            && let Ok(data) = std::fs::read(path)
        {
            let ids = parse_memo(&data, epoch);
            c.remembered = ids.len();
            for id in ids {
                c.shard(&id).insert(id);
            }
        }
        c
    }

    /// Keeps, for the next backup, every id the server said it holds and every id
    /// this backup stored (called once its snapshot is committed). Best effort: a
    /// memo that cannot be written only costs questions next time.
    pub fn remember(&self, stored_now: &[BlobId]) {
        let Some((path, epoch)) = &self.memo else {
            return;
        };
        let mut ids: Vec<BlobId> = Vec::new();
        for shard in &self.stored {
            ids.extend(crate::lock(shard).iter().copied());
        }
        ids.extend_from_slice(stored_now);
        ids.sort_unstable();
        ids.dedup();
        ids.truncate(MEMO_MAX_IDS);
        let mut out = Vec::with_capacity(16 + epoch.len() + ids.len() * 32);
        out.extend_from_slice(MEMO_MAGIC);
        out.push(epoch.len() as u8);
        out.extend_from_slice(epoch.as_bytes());
        for id in &ids {
            out.extend_from_slice(&id.0);
        }
        if let Some(dir) = path.parent() {
            let _ = std::fs::create_dir_all(dir);
        }
        // A memo that could not be written is only a slower next start.
        let _ = cairn_backend::replace_private_file(path, &out, false);
    }

    fn shard(&self, id: &BlobId) -> std::sync::MutexGuard<'_, IdSet> {
        crate::lock(&self.stored[id.0[1] as usize % self.stored.len()])
    }

    /// Chunk ids asked about so far: not those the server had said it holds, in
    /// this session or in the earlier ones this machine remembers.
    pub fn asked(&self) -> u64 {
        self.asked.load(std::sync::atomic::Ordering::Relaxed)
    }

    /// Of the ids asked about, those the server said it holds.
    pub fn answered_stored(&self) -> u64 {
        self.answered_stored
            .load(std::sync::atomic::Ordering::Relaxed)
    }

    /// Whether the server has said it holds this id in this session.
    pub fn known_stored(&self, id: &BlobId) -> bool {
        self.shard(id).contains(id)
    }

    /// The server's answer for each id (remembered ones without asking).
    pub fn query(&self, ids: &[BlobId]) -> Result<Vec<DedupAnswer>> {
        let mut out = vec![DedupAnswer::Stored; ids.len()];
        let mut ask = Vec::new();
        let mut at = Vec::new();
        for (i, id) in ids.iter().enumerate() {
            if !self.known_stored(id) {
                ask.push(id.0);
                at.push(i);
            }
        }
        if ask.is_empty() {
            return Ok(out);
        }
        self.asked
            .fetch_add(ask.len() as u64, std::sync::atomic::Ordering::Relaxed);
        let answers = self
            .co
            .run(&ask, |batch| self.backend.dedup_query(batch))
            .map_err(Error::Backend)?;
        let mut stored = 0;
        for (i, a) in at.into_iter().zip(answers) {
            out[i] = a;
            if a == DedupAnswer::Stored {
                self.shard(&ids[i]).insert(ids[i]);
                stored += 1;
            }
        }
        self.answered_stored
            .fetch_add(stored, std::sync::atomic::Ordering::Relaxed);
        Ok(out)
    }

    /// Whether the server holds every id (false also when it cannot be asked: the
    /// caller then reads the file again, which is never wrong).
    pub fn all_stored(&self, ids: &[BlobId]) -> bool {
        match self.query(ids) {
            Ok(a) => a.iter().all(|a| *a == DedupAnswer::Stored),
            Err(_) => false,
        }
    }

    /// Asks about ids ahead of need (a directory's unchanged files), ignoring errors.
    pub fn prefetch(&self, ids: &[BlobId]) {
        let _ = self.query(ids);
    }

    /// Waits for ids other clients were sending; returns those that never arrived.
    pub fn confirm(&self, ids: &[BlobId]) -> Result<Vec<BlobId>> {
        let raw: Vec<[u8; 32]> = ids.iter().map(|i| i.0).collect();
        let missing = self.backend.dedup_confirm(&raw).map_err(Error::Backend)?;
        let missing: Vec<BlobId> = missing.into_iter().map(BlobId).collect();
        let set: std::collections::HashSet<&BlobId> = missing.iter().collect();
        for id in ids.iter().filter(|i| !set.contains(i)) {
            self.shard(id).insert(*id);
        }
        Ok(missing)
    }
}

/// Chunks another client was sending when this one needed them (answered
/// [`DedupAnswer::InFlight`]), encoded and kept until the end of the run: then
/// the server is asked which never arrived ([`Held::send_missing`]), and only
/// those are stored.
#[derive(Default)]
pub struct Held {
    mem: Vec<EncodedBlob>,
    mem_bytes: usize,
    /// Held chunks beyond [`HELD_BYTES_MAX`], in a temporary file.
    spool: Option<Spool>,
}

impl Held {
    pub fn is_empty(&self) -> bool {
        self.mem.is_empty() && self.spool.is_none()
    }

    /// Keeps `b`; gives it back when there is no room left (the caller stores it
    /// now: stored twice at worst, never missing).
    pub fn hold(&mut self, b: EncodedBlob) -> Result<Option<EncodedBlob>> {
        if self.mem_bytes + b.sealed.len() <= HELD_BYTES_MAX {
            self.mem_bytes += b.sealed.len();
            self.mem.push(b);
            return Ok(None);
        }
        if self.spool.as_ref().map_or(0, |s| s.len) + (b.sealed.len() as u64) > SPOOL_BYTES_MAX {
            return Ok(Some(b));
        }
        let spool = match &mut self.spool {
            Some(s) => s,
            None => self.spool.insert(Spool::create()?),
        };
        spool.push(&b)?;
        Ok(None)
    }

    /// Waits for the server to confirm the held chunks (see
    /// [`DedupClient::confirm`]) and hands those that never arrived to `store`.
    /// Everything the caller sent must be stored and indexed first, so that a
    /// client waiting for its chunks never waits for one that waits too.
    pub fn send_missing(
        self,
        dedup: &DedupClient,
        mut store: impl FnMut(EncodedBlob) -> Result<()>,
    ) -> Result<()> {
        let mut ids: Vec<BlobId> = self.mem.iter().map(|b| b.id).collect();
        if let Some(s) = &self.spool {
            ids.extend(s.blobs.iter().map(|b| b.id));
        }
        if ids.is_empty() {
            return Ok(());
        }
        let missing: IdSet = dedup.confirm(&ids)?.into_iter().collect();
        for b in self.mem {
            if missing.contains(&b.id) {
                store(b)?;
            }
        }
        if let Some(s) = self.spool {
            for b in s.blobs.iter().filter(|b| missing.contains(&b.id)) {
                store(s.read(b)?)?;
            }
        }
        Ok(())
    }
}

/// Held chunk bytes kept in memory; more go to a temporary file (unlinked at once)
/// up to [`SPOOL_BYTES_MAX`]; beyond, chunks are sent like any other (stored twice at
/// worst, never missing). Many clients backing up the same data at once each hold
/// most of it: every chunk has one sender.
const HELD_BYTES_MAX: usize = 64 << 20;
const SPOOL_BYTES_MAX: u64 = 16 << 30;

/// Encoded blobs in an unlinked temporary file.
struct Spool {
    file: std::fs::File,
    len: u64,
    blobs: Vec<SpooledBlob>,
}

struct SpooledBlob {
    id: BlobId,
    raw_length: u32,
    compression: cairn_format::pack::BlobCompression,
    at: u64,
    len: u32,
}

impl Spool {
    fn create() -> Result<Spool> {
        let dir = std::env::temp_dir();
        let path = dir.join(format!(
            "cairn-held-{}-{:x}",
            std::process::id(),
            std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .map(|d| d.as_nanos())
                .unwrap_or(0)
        ));
        let file = std::fs::File::options()
            .read(true)
            .write(true)
            .create_new(true)
            .open(&path)
            .map_err(|e| Error::io(&path, e))?;
        let _ = std::fs::remove_file(&path);
        Ok(Spool {
            file,
            len: 0,
            blobs: Vec::new(),
        })
    }

    fn push(&mut self, b: &EncodedBlob) -> Result<()> {
        use std::os::unix::fs::FileExt;
        self.file
            .write_all_at(&b.sealed, self.len)
            .map_err(|e| Error::io(std::path::Path::new("held chunks (temporary file)"), e))?;
        self.blobs.push(SpooledBlob {
            id: b.id,
            raw_length: b.raw_length,
            compression: b.compression,
            at: self.len,
            len: b.sealed.len() as u32,
        });
        self.len += b.sealed.len() as u64;
        Ok(())
    }

    fn read(&self, s: &SpooledBlob) -> Result<EncodedBlob> {
        use std::os::unix::fs::FileExt;
        let mut sealed = vec![0u8; s.len as usize];
        self.file
            .read_exact_at(&mut sealed, s.at)
            .map_err(|e| Error::io(std::path::Path::new("held chunks (temporary file)"), e))?;
        Ok(EncodedBlob {
            kind: BlobKind::Data,
            id: s.id,
            sealed,
            raw_length: s.raw_length,
            compression: s.compression,
        })
    }
}

/// The ids of a memo written under `epoch` (none if another epoch or damaged).
fn parse_memo(data: &[u8], epoch: &str) -> Vec<BlobId> {
    let head = MEMO_MAGIC.len() + 1;
    if data.len() < head || &data[..MEMO_MAGIC.len()] != MEMO_MAGIC {
        return Vec::new();
    }
    let n = data[MEMO_MAGIC.len()] as usize;
    let Some(e) = data.get(head..head + n) else {
        return Vec::new();
    };
    let body = &data[head + n..];
    if e != epoch.as_bytes() || !body.len().is_multiple_of(32) || body.len() / 32 > MEMO_MAX_IDS {
        return Vec::new();
    }
    body.chunks_exact(32)
        .map(|c| {
            let mut id = [0u8; 32];
            id.copy_from_slice(c);
            BlobId(id)
        })
        .collect()
}

type Shared<T> = Arc<std::result::Result<Vec<T>, cairn_backend::BackendError>>;

/// Turns concurrent calls into batched requests (see the module documentation).
#[derive(Default)]
struct Coalescer {
    state: Mutex<CoState>,
    cv: Condvar,
}

#[derive(Default)]
struct CoState {
    /// Ids asked for the batch not yet sent, and that batch's number.
    open: Vec<[u8; 32]>,
    open_no: u64,
    /// A request is out.
    busy: bool,
    /// Answers of sent batches with the callers still to take their part.
    done: HashMap<u64, (Shared<DedupAnswer>, usize)>,
    waiting: HashMap<u64, usize>,
}

impl Coalescer {
    fn run(
        &self,
        ids: &[[u8; 32]],
        send: impl Fn(&[[u8; 32]]) -> cairn_backend::Result<Vec<DedupAnswer>>,
    ) -> cairn_backend::Result<Vec<DedupAnswer>> {
        let mut st = crate::lock(&self.state);
        let batch = st.open_no;
        let start = st.open.len();
        st.open.extend_from_slice(ids);
        *st.waiting.entry(batch).or_default() += 1;
        loop {
            if let Some((r, left)) = st.done.get_mut(&batch) {
                let r = r.clone();
                *left -= 1;
                if *left == 0 {
                    st.done.remove(&batch);
                }
                return match &*r {
                    Ok(v) => Ok(v[start..start + ids.len()].to_vec()),
                    Err(e) => Err(cairn_backend::BackendError {
                        kind: e.kind,
                        op: e.op,
                        path: e.path.clone(),
                        message: e.message.clone(),
                    }),
                };
            }
            if !st.busy && st.open_no == batch {
                st.busy = true;
                let asked = std::mem::take(&mut st.open);
                st.open_no += 1;
                drop(st);
                let r = send(&asked).and_then(|v| {
                    if v.len() == asked.len() {
                        Ok(v)
                    } else {
                        Err(cairn_backend::BackendError {
                            kind: cairn_backend::BackendErrorKind::Other,
                            op: "dedup",
                            path: String::new(),
                            message: "a different number of answers than ids".into(),
                        })
                    }
                });
                st = crate::lock(&self.state);
                st.busy = false;
                let n = st.waiting.remove(&batch).unwrap_or(1);
                st.done.insert(batch, (Arc::new(r), n));
                self.cv.notify_all();
                continue;
            }
            st = self.cv.wait(st).unwrap_or_else(|e| e.into_inner());
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::{AtomicUsize, Ordering};

    #[test]
    fn the_memo_holds_only_under_its_epoch() {
        let dir = std::env::temp_dir().join(format!("cairn-memo-{}", std::process::id()));
        let path = dir.join("memo");
        let b: Arc<dyn Backend> = Arc::new(cairn_backend::MemBackend::new());
        let c = DedupClient::new(b.clone(), 0, 0, Some((path.clone(), "e1".into())));
        assert_eq!(c.remembered, 0);
        c.remember(&[BlobId([1; 32]), BlobId([2; 32])]);
        let again = DedupClient::new(b.clone(), 0, 0, Some((path.clone(), "e1".into())));
        assert_eq!(again.remembered, 2);
        assert!(again.known_stored(&BlobId([2; 32])));
        let pruned = DedupClient::new(b.clone(), 0, 0, Some((path.clone(), "e2".into())));
        assert_eq!(pruned.remembered, 0, "a prune since: nothing remembered");
        std::fs::write(&path, b"CAIRNDM1\x02e1xyz").unwrap();
        let damaged = DedupClient::new(b, 0, 0, Some((path, "e1".into())));
        assert_eq!(damaged.remembered, 0);
        let _ = std::fs::remove_dir_all(dir);
    }

    #[test]
    fn concurrent_callers_share_requests_and_get_their_own_answers() {
        let co = Arc::new(Coalescer::default());
        let requests = Arc::new(AtomicUsize::new(0));
        let threads: Vec<_> = (0..16u8)
            .map(|t| {
                let (co, requests) = (co.clone(), requests.clone());
                std::thread::spawn(move || {
                    for i in 0..50u8 {
                        let ids = [[t; 32], [i; 32]];
                        let a = co
                            .run(&ids, |batch| {
                                requests.fetch_add(1, Ordering::Relaxed);
                                std::thread::sleep(std::time::Duration::from_millis(2));
                                // Stored for even first bytes, Send for odd.
                                Ok(batch
                                    .iter()
                                    .map(|id| {
                                        if id[0].is_multiple_of(2) {
                                            DedupAnswer::Stored
                                        } else {
                                            DedupAnswer::Send
                                        }
                                    })
                                    .collect())
                            })
                            .unwrap();
                        let want = |b: u8| {
                            if b.is_multiple_of(2) {
                                DedupAnswer::Stored
                            } else {
                                DedupAnswer::Send
                            }
                        };
                        assert_eq!(a, vec![want(t), want(i)]);
                    }
                })
            })
            .collect();
        for t in threads {
            t.join().unwrap();
        }
        let n = requests.load(Ordering::Relaxed);
        assert!(n < 16 * 50 / 2, "{n} requests for 800 calls: not coalesced");
    }
}
