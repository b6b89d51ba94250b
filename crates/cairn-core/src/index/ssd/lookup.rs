//! Answering lookups: filter, directory, a run of keys, one record; and iterating
//! every record.

use super::*;

impl SsdIndex {
    /// Blobs findable (a blob stored again after the base was built counts twice
    /// until the next full build).
    pub fn len(&self) -> usize {
        self.unique as usize + self.delta.as_ref().map_or(0, |d| d.len())
    }
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
    pub fn live_len(&self) -> usize {
        self.live as usize + self.delta.as_ref().map_or(0, |d| d.live_len())
    }
    pub fn path(&self) -> &Path {
        &self.dir_path
    }

    /// RAM the open index holds (filter, directory, runs, skip list; the cache is
    /// bounded separately).
    pub fn ram_bytes(&self) -> usize {
        self.delta.as_ref().map_or(0, |d| d.ram_bytes())
            + self.filter.as_ref().map_or(0, |f| f.blocks.len() * 64)
            + self.dir.len() * 8
            + self.runs.len() * std::mem::size_of::<Run>()
            + self.skipped.len() * 8
            + self.records.ram_bytes()
            + self.keys.ram_bytes()
    }

    pub(super) fn fail(&self, e: impl std::fmt::Display) {
        self.failures.fetch_add(1, Ordering::Relaxed);
        // Whatever failed (damage, a read error), the next open rebuilds the files
        // rather than meeting it again.
        mark_damaged(&self.dir_path);
        if let Ok(mut l) = self.last_failure.lock() {
            *l = Some(e.to_string());
        }
    }

    /// The damage this run met and mended by rebuilding from the repository: a
    /// build found damaged at open (replaced), or files found damaged by its
    /// reads (base or delta), if any.
    pub fn repaired(&self) -> Option<String> {
        let found = |r: &Repair| r.found.lock().ok().and_then(|f| f.clone());
        self.rebuilt_from
            .clone()
            .or_else(|| self.repair.as_deref().and_then(found))
            .or_else(|| self.delta.as_ref().and_then(|d| d.repaired()))
    }

    /// Lookups that could not read the disk since the index was opened (base and
    /// delta together), and the last reason.
    pub fn failures(&self) -> Option<(u64, String)> {
        let delta = self.delta.as_ref().and_then(|d| d.failures());
        let n = self.failures.load(Ordering::Relaxed);
        let why = || {
            self.last_failure
                .lock()
                .ok()
                .and_then(|l| l.clone())
                .unwrap_or_default()
        };
        match (n, delta) {
            (0, d) => d,
            (n, None) => Some((n, why())),
            (n, Some((dn, dwhy))) => Some((n + dn, dwhy)),
        }
    }

    pub(super) fn read_record(&self, pos: u64) -> std::io::Result<Record> {
        let mut r = [0u8; RECORD_LEN];
        self.records
            .read_exact_at(&mut r, pos * RECORD_LEN as u64)?;
        Ok(r)
    }

    pub(super) fn run_of(&self, pos: u64) -> Option<Run> {
        let i = self.runs.partition_point(|r| r.start <= pos);
        let r = *self.runs.get(i.checked_sub(1)?)?;
        (pos < r.start + u64::from(r.count)).then_some(r)
    }

    /// Loads the window of records holding `pos` (within its pack's run) into
    /// the cache, when that window was hit on disk recently too.
    pub(super) fn load_run(&self, pos: u64) -> std::io::Result<()> {
        let Some(run) = self.run_of(pos) else {
            return Ok(());
        };
        let window = pos / WINDOW;
        {
            let mut cache = self.cache.lock().unwrap_or_else(|e| e.into_inner());
            let again = cache.recent.contains(&window);
            if cache.recent.len() == RECENT_HITS {
                cache.recent.pop_front();
            }
            cache.recent.push_back(window);
            if !again || cache.loaded.contains_key(&window) {
                return Ok(());
            }
        }
        let start = run.start.max(window * WINDOW);
        let end = (run.start + u64::from(run.count)).min((window + 1) * WINDOW);
        let mut buf = vec![0u8; (end - start) as usize * RECORD_LEN];
        self.records
            .read_exact_at(&mut buf, start * RECORD_LEN as u64)?;
        let mut out = Vec::with_capacity((end - start) as usize);
        for (i, c) in buf.chunks_exact(RECORD_LEN).enumerate() {
            // (checked: `records` reads whole blocks and verifies them)
            let p = start + i as u64;
            if self.skipped.binary_search(&p).is_ok() {
                continue;
            }
            let mut r = [0u8; RECORD_LEN];
            r.copy_from_slice(c);
            let loc = unpack_record(&r);
            if loc.pack_number() < self.n_packs {
                out.push((record_id(&r), loc, record_pending(&r)));
            }
        }
        let mut cache = self.cache.lock().unwrap_or_else(|e| e.into_inner());
        cache.insert_window(window, out);
        Ok(())
    }

    /// The positions of the records whose key has `id`'s prefix, in key order.
    fn candidates(&self, id: &BlobId) -> std::io::Result<Vec<u64>> {
        let prefix = prefix_of(&id.0);
        let b = if self.dir_bits == 0 {
            0
        } else {
            (prefix >> (64 - self.dir_bits)) as usize
        };
        let (lo, hi) = (self.dir[b], self.dir[b + 1]);
        if lo == hi {
            return Ok(Vec::new());
        }
        let mut buf = vec![0u8; ((hi - lo) as usize) * KEY_LEN];
        self.keys.read_exact_at(&mut buf, lo * KEY_LEN as u64)?;
        Ok(buf
            .chunks_exact(KEY_LEN)
            .filter(|k| prefix_of(k) == prefix)
            .map(key_pos)
            .collect())
    }

    pub(super) fn lookup_disk(&self, id: &BlobId) -> std::io::Result<Option<(BlobLocation, bool)>> {
        for pos in self.candidates(id)? {
            if self.skipped.binary_search(&pos).is_ok() {
                continue;
            }
            let r = self.read_record(pos)?;
            if r[..32] == id.0 {
                let loc = unpack_record(&r);
                if loc.pack_number() >= self.n_packs {
                    return Err(std::io::Error::other("a record names an unknown pack"));
                }
                // The locality cache only saves later reads: a failure there is no
                // error for this lookup, but damage found there is damage.
                if let Err(e) = self.load_run(pos)
                    && e.kind() == std::io::ErrorKind::InvalidData
                {
                    self.fail(format!("reading {}: {e}", self.dir_path.display()));
                }
                return Ok(Some((loc, record_pending(&r))));
            }
        }
        Ok(None)
    }

    /// Every copy of a blob, [`Self::lookup`]'s first (see
    /// `MasterIndex::copies`). A failed read of the local files gives what was
    /// found before it.
    pub fn copies(&self, id: &BlobId) -> Vec<BlobLocation> {
        let mut out: Vec<BlobLocation> = self.lookup(id).map(|(l, _)| l).into_iter().collect();
        if let Some(d) = &self.delta {
            match d.copies_disk(id) {
                Ok(v) => out.extend(v.into_iter().map(|l| l.with_pack_offset(self.base_packs))),
                Err(e) => d.fail(format!("reading {}: {e}", d.dir_path.display())),
            }
        }
        match self.copies_disk(id) {
            Ok(v) => out.extend(v),
            Err(e) => self.fail(format!("reading {}: {e}", self.dir_path.display())),
        }
        // A handful at most: the first of each kept, in order.
        let mut unique: Vec<BlobLocation> = Vec::with_capacity(out.len());
        for l in out {
            if !unique.contains(&l) {
                unique.push(l);
            }
        }
        unique
    }

    /// Every record of `id` in this segment, chosen or skipped.
    fn copies_disk(&self, id: &BlobId) -> std::io::Result<Vec<BlobLocation>> {
        let mut out = Vec::new();
        for pos in self.candidates(id)? {
            let r = self.read_record(pos)?;
            if r[..32] == id.0 {
                let loc = unpack_record(&r);
                if loc.pack_number() < self.n_packs {
                    out.push(loc);
                }
            }
        }
        Ok(out)
    }

    /// The location of a blob and whether it is only pending.
    pub fn lookup(&self, id: &BlobId) -> Option<(BlobLocation, bool)> {
        // The delta holds only live records: a hit there is as good as any.
        if let Some(d) = &self.delta
            && let Some((loc, pending)) = d.lookup_segment(id)
        {
            return Some((loc.with_pack_offset(self.base_packs), pending));
        }
        self.lookup_segment(id)
    }

    pub(super) fn lookup_segment(&self, id: &BlobId) -> Option<(BlobLocation, bool)> {
        // The filter first: it needs no lock, and new data (most of a first
        // backup) ends there; every cached blob passes it.
        if self
            .filter
            .as_ref()
            .is_some_and(|f| !f.may_contain(prefix_of(&id.0)))
        {
            return None;
        }
        if let Some(hit) = self.cache.lock().unwrap_or_else(|e| e.into_inner()).get(id) {
            return Some(hit);
        }
        match self.lookup_disk(id) {
            Ok(r) => r,
            Err(e) => {
                self.fail(format!("reading {}: {e}", self.dir_path.display()));
                None
            }
        }
    }

    /// Reads every file of the build (and its delta) and checks it against its
    /// checksums; on damage the build is marked and the next open rebuilds it.
    pub fn verify(&self) -> std::result::Result<(), String> {
        let r = self
            .records
            .verify()
            .and_then(|()| self.keys.verify())
            .map_err(|e| e.to_string());
        if let Err(e) = &r {
            mark_damaged(&self.dir_path);
            return Err(e.clone());
        }
        match &self.delta {
            Some(d) => d.verify(),
            None => Ok(()),
        }
    }

    /// Every record (chosen copies only), in disk order. A read error ends the
    /// iteration and is counted as a failure.
    pub fn iter(&self) -> Box<dyn Iterator<Item = (BlobId, BlobLocation, bool)> + '_> {
        let base = self.iter_segment();
        match &self.delta {
            None => Box::new(base),
            Some(d) => {
                let offset = self.base_packs;
                Box::new(
                    base.chain(
                        d.iter_segment()
                            .map(move |(id, l, p)| (id, l.with_pack_offset(offset), p)),
                    ),
                )
            }
        }
    }

    pub(super) fn iter_segment(&self) -> impl Iterator<Item = (BlobId, BlobLocation, bool)> + '_ {
        // Positional reads: several iterations (and lookups) may share the file.
        const BATCH: u64 = 16 * 1024;
        let mut buf: Vec<u8> = Vec::new();
        let mut at = 0usize;
        let mut pos = 0u64;
        let mut skip = self.skipped.iter().peekable();
        std::iter::from_fn(move || {
            loop {
                if pos >= self.n_records {
                    return None;
                }
                if at >= buf.len() {
                    let n = BATCH.min(self.n_records - pos) as usize;
                    buf.resize(n * RECORD_LEN, 0);
                    if let Err(e) = self
                        .records
                        .read_exact_at(&mut buf, pos * RECORD_LEN as u64)
                    {
                        self.fail(e);
                        return None;
                    }
                    at = 0;
                }
                let mut r = [0u8; RECORD_LEN];
                r.copy_from_slice(&buf[at..at + RECORD_LEN]);
                at += RECORD_LEN;
                let p = pos;
                pos += 1;
                while skip.peek().is_some_and(|s| **s < p) {
                    skip.next();
                }
                if skip.peek() == Some(&&p) {
                    continue;
                }
                let loc = unpack_record(&r);
                if loc.pack_number() >= self.n_packs {
                    self.fail("a record names an unknown pack");
                    return None;
                }
                return Some((record_id(&r), loc, record_pending(&r)));
            }
        })
    }
}

pub(super) fn key_value(k: &[u8]) -> u64 {
    let mut p = [0u8; 8];
    p[..5].copy_from_slice(&k[8..13]);
    u64::from_le_bytes(p)
}

pub(super) fn key_pos(k: &[u8]) -> u64 {
    key_value(k) & POS_MASK
}

pub(super) fn key_pending(k: &[u8]) -> bool {
    key_value(k) >> 39 != 0
}

pub(super) fn read_at(f: &File, pos: u64, path: &Path) -> Result<Record> {
    let mut r = [0u8; RECORD_LEN];
    f.read_exact_at(&mut r, pos * RECORD_LEN as u64)
        .map_err(|e| io_err(path, e))?;
    Ok(r)
}
