//! The blob ids one run (a backup, a copy) has claimed for storing, in bounded
//! memory.
//!
//! Every chunk a run meets that the loaded index lacks is claimed by the first
//! worker to meet it, so that a chunk met twice in one run is stored once. A
//! first backup of a large file server claims every chunk it stores: 100 million
//! at 1.6 TB of 16 KiB chunks, which as a hash set is 4-7 GB of RAM. So the set
//! is held in RAM only up to a cap (sized from the memory plan); past it, its
//! ids are sorted and written to a *run* on local disk (32 bytes an id, an
//! unlinked scratch file), with a Bloom filter (10 bits an id, in RAM) and a
//! fence of every 128th id (a quarter byte an id). A lookup asks the RAM set,
//! then each run's filter, and reads one 4 KiB block of a run only when its
//! filter says maybe: about 1.5 bytes of RAM per spilled id, and no disk read
//! for most new chunks. Past 16 runs they are merged into one (a sequential
//! rewrite on local disk), so a lookup asks at most 16 filters.
//!
//! A spill takes the RAM set out under the shard locks and writes its run outside
//! them: meanwhile the set, *frozen*, still answers lookups (first as it was, then
//! as its sorted copy), so workers go on claiming while the run is sorted, written
//! or merged (seconds at millions of ids, when every worker waited before).
//!
//! Answers are exact where it matters: "claimed" is said only for an id that is
//! in the RAM set or found in a run's block. A run that cannot be read makes the
//! answer "not claimed", which costs a second copy of a blob (prune drops it),
//! never a chunk left unstored.

use super::IdSet;
use crate::index::ssd::filter::{Filter, prefix_of};
use cairn_format::BlobId;
use std::os::unix::fs::FileExt;
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, RwLock};

/// Ids per fence entry: one 4 KiB block of a run.
const FENCE: usize = 128;
/// RAM a claimed id takes in the hash set at most (32 bytes and the table's
/// control byte, at the lowest load just after it grew).
const RAM_BYTES_PER_ID: u64 = 75;
/// Runs kept apart before they are merged into one: a lookup of a new id asks
/// every run's filter (a cache miss each).
const MAX_RUNS: usize = 16;
/// The cap without a memory limit: 8 million ids, about 450 MB.
const DEFAULT_CAP: usize = 8 << 20;
const SHARDS: usize = 64;

/// One spilled part of the set: sorted ids on local disk.
struct Run {
    file: std::fs::File,
    len: usize,
    fence: Vec<[u8; 32]>,
    filter: Filter,
}

impl Run {
    /// Whether the run holds `id`; false when its block cannot be read.
    fn holds(&self, id: &BlobId) -> bool {
        if !self.filter.may_contain(prefix_of(&id.0)) {
            return false;
        }
        let block = match self.fence.partition_point(|f| *f <= id.0) {
            0 => return false,
            n => n - 1,
        };
        let first = block * FENCE;
        let count = FENCE.min(self.len - first);
        let mut buf = vec![0u8; count * 32];
        if self
            .file
            .read_exact_at(&mut buf, (first * 32) as u64)
            .is_err()
        {
            return false;
        }
        buf.chunks_exact(32)
            .collect::<Vec<_>>()
            .binary_search(&&id.0[..])
            .is_ok()
    }
}

/// The set a spill took out of RAM, answering until its run is in place.
enum Frozen {
    /// The shards' sets as they were.
    Sets(Vec<IdSet>),
    /// Their ids, sorted (the sets freed).
    Sorted(Vec<[u8; 32]>),
}

impl Frozen {
    fn contains(&self, id: &BlobId) -> bool {
        match self {
            Frozen::Sets(sets) => sets
                .get(id.0[0] as usize % SHARDS)
                .is_some_and(|s| s.contains(id)),
            Frozen::Sorted(ids) => ids.binary_search(&id.0).is_ok(),
        }
    }
}

/// The claims of one run: see the module's text.
pub(crate) struct Claims {
    shards: Vec<Mutex<IdSet>>,
    /// Ids in the RAM set, over all shards.
    in_ram: AtomicUsize,
    /// Ids the RAM set may hold before it is spilled.
    cap: AtomicUsize,
    runs: RwLock<Vec<Run>>,
    /// Whether `runs` holds any: most runs never spill, and their lookups skip
    /// the lock.
    spilled_any: AtomicBool,
    /// The set being spilled (see the module's text), and whether there is one.
    frozen: RwLock<Option<Arc<Frozen>>>,
    frozen_any: AtomicBool,
    /// Held by the one spill under way.
    spilling: Mutex<()>,
    /// Where runs go.
    dir: PathBuf,
    /// The first spill that failed (the set stayed in RAM).
    failed: Mutex<Option<String>>,
}

impl Claims {
    /// A set that spills past `cap_bytes` of RAM (the default without one)
    /// into `dir`.
    pub(crate) fn spilling(dir: PathBuf, cap_bytes: Option<u64>) -> Self {
        #[cfg(feature = "test-hooks")]
        if let Some(ids) = std::env::var("CAIRN_TEST_CLAIMS_CAP")
            .ok()
            .and_then(|v| v.parse().ok())
        {
            return Claims::with(dir, ids);
        }
        // The set, and the sorted copy a spill makes of it.
        let cap = cap_bytes.map_or(DEFAULT_CAP, |b| {
            (b / (RAM_BYTES_PER_ID + 32)).max(1024) as usize
        });
        Claims::with(dir, cap)
    }

    fn with(dir: PathBuf, cap: usize) -> Self {
        Claims {
            shards: (0..SHARDS).map(|_| Mutex::new(IdSet::default())).collect(),
            in_ram: AtomicUsize::new(0),
            cap: AtomicUsize::new(cap),
            runs: RwLock::new(Vec::new()),
            spilled_any: AtomicBool::new(false),
            frozen: RwLock::new(None),
            frozen_any: AtomicBool::new(false),
            spilling: Mutex::new(()),
            dir,
            failed: Mutex::new(None),
        }
    }

    fn shard(&self, id: &BlobId) -> MutexGuard<'_, IdSet> {
        crate::lock(&self.shards[id.0[0] as usize % SHARDS])
    }

    /// Whether the set being spilled or a spilled run holds `id`. Called with the
    /// id's shard locked, so that a spill cannot move it between the looks; the
    /// frozen set is asked before the runs, and a spill puts its run in place
    /// before it lets the frozen set go.
    fn spilled(&self, id: &BlobId) -> bool {
        if self.frozen_any.load(Ordering::SeqCst) {
            let f = self.frozen.read().unwrap_or_else(|e| e.into_inner());
            if f.as_ref().is_some_and(|f| f.contains(id)) {
                return true;
            }
        }
        if !self.spilled_any.load(Ordering::SeqCst) {
            return false;
        }
        let runs = self.runs.read().unwrap_or_else(|e| e.into_inner());
        runs.iter().any(|r| r.holds(id))
    }

    /// True if the id was already claimed; otherwise claims it.
    pub(crate) fn claim(&self, id: &BlobId) -> bool {
        let mut s = self.shard(id);
        if s.contains(id) || self.spilled(id) {
            return true;
        }
        s.insert(*id);
        drop(s);
        if self.in_ram.fetch_add(1, Ordering::Relaxed) + 1 > self.cap.load(Ordering::Relaxed) {
            self.spill();
        }
        false
    }

    /// Whether some worker has claimed the id in this run.
    pub(crate) fn contains(&self, id: &BlobId) -> bool {
        let s = self.shard(id);
        s.contains(id) || self.spilled(id)
    }

    /// Ids moved to runs on local disk so far.
    pub(crate) fn on_disk(&self) -> u64 {
        let runs = self.runs.read().unwrap_or_else(|e| e.into_inner());
        runs.iter().map(|r| r.len as u64).sum()
    }

    /// Runs written so far.
    #[cfg(test)]
    fn runs(&self) -> usize {
        self.runs.read().unwrap_or_else(|e| e.into_inner()).len()
    }

    /// Why a spill failed, if one did: the set then stayed in RAM, over its cap.
    pub(crate) fn spill_failure(&self) -> Option<String> {
        crate::lock(&self.failed).clone()
    }

    /// Moves the RAM set to a new run: taken out under every shard lock (in
    /// order), then sorted and written with no lock that a claim needs. One spill
    /// at a time; a claim past the cap while one is under way leaves it to finish
    /// (the set is briefly over its cap).
    fn spill(&self) {
        let dir = &self.dir;
        let Ok(_one) = self.spilling.try_lock() else {
            return;
        };
        let cap = self.cap.load(Ordering::Relaxed);
        let sets = {
            let mut shards: Vec<MutexGuard<'_, IdSet>> =
                self.shards.iter().map(|s| crate::lock(s)).collect();
            if self.in_ram.load(Ordering::Relaxed) <= cap {
                return; // another thread spilled meanwhile
            }
            let sets: Vec<IdSet> = shards
                .iter_mut()
                .map(|s| std::mem::take(&mut **s))
                .collect();
            let frozen = Arc::new(Frozen::Sets(sets));
            // Before the shards are let go: a claim finds each id in one or the other.
            *self.frozen.write().unwrap_or_else(|e| e.into_inner()) = Some(frozen.clone());
            self.frozen_any.store(true, Ordering::SeqCst);
            self.in_ram.store(0, Ordering::Relaxed);
            frozen
        };
        let mut ids: Vec<[u8; 32]> = Vec::new();
        if let Frozen::Sets(s) = &*sets {
            ids.reserve(s.iter().map(|s| s.len()).sum());
            for set in s {
                ids.extend(set.iter().map(|b| b.0));
            }
        }
        ids.sort_unstable();
        // The sorted copy answers from here on; the sets are freed.
        let sorted = Arc::new(Frozen::Sorted(ids));
        *self.frozen.write().unwrap_or_else(|e| e.into_inner()) = Some(sorted.clone());
        drop(sets);
        let Frozen::Sorted(ids) = &*sorted else {
            return;
        };
        let written = {
            let runs = self.runs.read().unwrap_or_else(|e| e.into_inner());
            if runs.len() + 1 > MAX_RUNS {
                merge(dir, &runs, ids).map(|r| (r, true))
            } else {
                write_run(dir, ids).map(|r| (r, false))
            }
        };
        match written {
            Ok((run, merged)) => {
                let mut runs = self.runs.write().unwrap_or_else(|e| e.into_inner());
                if merged {
                    runs.clear();
                }
                runs.push(run);
                self.spilled_any.store(true, Ordering::SeqCst);
            }
            Err(e) => {
                for b in ids {
                    self.shard(&BlobId(*b)).insert(BlobId(*b));
                }
                self.in_ram.fetch_add(ids.len(), Ordering::Relaxed);
                // Correct but over budget: keep the set, and try again only once
                // it has doubled.
                self.cap.store(cap.saturating_mul(2), Ordering::Relaxed);
                crate::lock(&self.failed).get_or_insert_with(|| {
                    format!(
                        "the ids this run stored could not be moved to {} ({e}); they stay in RAM",
                        dir.display()
                    )
                });
            }
        }
        // The run (or the RAM set again) holds every id: the frozen set can go.
        self.frozen_any.store(false, Ordering::SeqCst);
        *self.frozen.write().unwrap_or_else(|e| e.into_inner()) = None;
    }
}

/// A run being written, id by id in order.
struct RunWriter {
    w: std::io::BufWriter<std::fs::File>,
    len: usize,
    fence: Vec<[u8; 32]>,
    filter: Filter,
}

impl RunWriter {
    fn new(dir: &std::path::Path, ids: usize) -> std::io::Result<Self> {
        std::fs::create_dir_all(dir)?;
        Ok(RunWriter {
            w: std::io::BufWriter::with_capacity(1 << 20, tempfile::tempfile_in(dir)?),
            len: 0,
            fence: Vec::with_capacity(ids.div_ceil(FENCE)),
            filter: Filter::with_capacity(ids as u64),
        })
    }

    fn push(&mut self, id: &[u8; 32]) -> std::io::Result<()> {
        use std::io::Write;
        self.w.write_all(id)?;
        self.filter.insert(prefix_of(id));
        if self.len.is_multiple_of(FENCE) {
            self.fence.push(*id);
        }
        self.len += 1;
        Ok(())
    }

    fn finish(self) -> std::io::Result<Run> {
        let file = self.w.into_inner().map_err(|e| e.into_error())?;
        Ok(Run {
            file,
            len: self.len,
            fence: self.fence,
            filter: self.filter,
        })
    }
}

fn write_run(dir: &std::path::Path, ids: &[[u8; 32]]) -> std::io::Result<Run> {
    let mut w = RunWriter::new(dir, ids.len())?;
    for id in ids {
        w.push(id)?;
    }
    w.finish()
}

/// A run read in order, a MiB at a time.
struct RunReader<'a> {
    run: &'a Run,
    next: usize,
    buf: Vec<u8>,
    at: usize,
}

impl RunReader<'_> {
    fn peek(&mut self) -> std::io::Result<Option<[u8; 32]>> {
        if self.at == self.buf.len() {
            let n = (self.run.len - self.next).min(1 << 15);
            if n == 0 {
                return Ok(None);
            }
            self.buf.resize(n * 32, 0);
            self.run
                .file
                .read_exact_at(&mut self.buf, (self.next * 32) as u64)?;
            self.next += n;
            self.at = 0;
        }
        let mut id = [0u8; 32];
        id.copy_from_slice(&self.buf[self.at..self.at + 32]);
        Ok(Some(id))
    }
}

/// One run of `runs` and the sorted `ids` together. An id may be in two of them
/// (claimed again after a run's block could not be read): it is written twice,
/// which lookups by fence and binary search answer as well.
fn merge(dir: &std::path::Path, runs: &[Run], ids: &[[u8; 32]]) -> std::io::Result<Run> {
    let total = runs.iter().map(|r| r.len).sum::<usize>() + ids.len();
    let mut w = RunWriter::new(dir, total)?;
    let mut readers: Vec<RunReader<'_>> = runs
        .iter()
        .map(|run| RunReader {
            run,
            next: 0,
            buf: Vec::new(),
            at: 0,
        })
        .collect();
    let mut heads: Vec<Option<[u8; 32]>> = Vec::with_capacity(readers.len());
    for r in &mut readers {
        heads.push(r.peek()?);
    }
    let mut mine = ids.iter().peekable();
    loop {
        // The least of the runs' heads and the next id of the RAM set: a linear
        // scan of at most 16 heads.
        let mut best: Option<(usize, [u8; 32])> = None;
        for (i, h) in heads.iter().enumerate() {
            if let Some(h) = h
                && best.is_none_or(|(_, b)| *h < b)
            {
                best = Some((i, *h));
            }
        }
        match (best, mine.peek()) {
            (Some((_, b)), Some(m)) if **m < b => {
                w.push(m)?;
                mine.next();
            }
            (Some((i, b)), _) => {
                w.push(&b)?;
                readers[i].at += 32;
                heads[i] = readers[i].peek()?;
            }
            (None, Some(m)) => {
                w.push(m)?;
                mine.next();
            }
            (None, None) => break,
        }
    }
    w.finish()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn id(n: u64) -> BlobId {
        BlobId(*blake3::hash(&n.to_le_bytes()).as_bytes())
    }

    /// Spilled or not, the set answers as a plain set would: every id claimed
    /// once, found again after any number of spills, and nothing else found.
    #[test]
    fn claims_answer_as_a_set_across_spills() {
        let dir = tempfile::tempdir().unwrap();
        let c = Claims::with(dir.path().to_path_buf(), 1000);
        for n in 0..5000 {
            assert!(!c.claim(&id(n)), "{n} claimed twice");
        }
        // 5,000 ids at 1,000 a run: four runs, the fifth spill not yet due.
        assert!(c.runs() >= 4, "{} runs", c.runs());
        assert!(c.in_ram.load(Ordering::Relaxed) <= 1000);
        for n in 0..5000 {
            assert!(c.contains(&id(n)), "{n} lost");
            assert!(c.claim(&id(n)), "{n} claimed again");
        }
        for n in 5000..20_000 {
            assert!(!c.contains(&id(n)), "{n} found but never claimed");
        }
        assert_eq!(c.spill_failure(), None);
    }

    /// Past [`MAX_RUNS`] runs they are merged into one, which answers as they did.
    #[test]
    fn runs_merge_past_their_limit_and_keep_every_id() {
        let dir = tempfile::tempdir().unwrap();
        let c = Claims::with(dir.path().to_path_buf(), 100);
        let n = 100 * (MAX_RUNS as u64 + 3) + 50;
        for i in 0..n {
            assert!(!c.claim(&id(i)), "{i} claimed twice");
        }
        assert!(c.runs() < MAX_RUNS, "{} runs", c.runs());
        assert!(
            c.on_disk() >= 100 * (MAX_RUNS as u64 + 1),
            "{}",
            c.on_disk()
        );
        for i in 0..n {
            assert!(c.claim(&id(i)), "{i} lost in a merge");
        }
        for i in n..n + 5000 {
            assert!(!c.contains(&id(i)), "{i} found but never claimed");
        }
    }

    /// Threads claiming overlapping ids at once: each id is won exactly once.
    #[test]
    fn each_id_is_won_once_by_concurrent_claims() {
        let dir = tempfile::tempdir().unwrap();
        // Spills (and merges past 16 runs) happen while the other threads claim:
        // ids being written out must still be found.
        let c = Claims::with(dir.path().to_path_buf(), 500);
        let won = AtomicUsize::new(0);
        const IDS: u64 = 30_000;
        std::thread::scope(|s| {
            for t in 0..4u64 {
                let (c, won) = (&c, &won);
                s.spawn(move || {
                    for n in 0..IDS {
                        if !c.claim(&id((n * 7 + t * 1000) % IDS)) {
                            won.fetch_add(1, Ordering::Relaxed);
                        }
                    }
                });
            }
        });
        assert_eq!(won.load(Ordering::Relaxed), IDS as usize);
        assert!(c.runs() > 0);
        for n in 0..IDS {
            assert!(c.contains(&id(n)), "{n}");
        }
    }

    /// A scratch directory that cannot be made: the set stays in RAM, still
    /// right, and says why.
    #[test]
    fn a_failed_spill_keeps_the_set_in_ram() {
        let file = tempfile::NamedTempFile::new().unwrap();
        let c = Claims::with(file.path().join("below-a-file"), 10);
        for n in 0..100 {
            assert!(!c.claim(&id(n)));
        }
        for n in 0..100 {
            assert!(c.contains(&id(n)));
        }
        assert_eq!(c.runs(), 0);
        assert!(c.spill_failure().is_some());
    }
}
