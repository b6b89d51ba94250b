//! Building the SSD index from the repository's index files: streaming, in
//! bounded memory, in full or as a delta segment on top of the current build.

use super::*;

/// Reads every index file and pending record of `repo` into a new build
/// directory under `dir`, names it in `dir/CURRENT`, and removes every other
/// build (older ones, and any a killed builder left). Called under the build lock.
pub(super) fn build(
    repo: &dyn IndexSource,
    dir: &Path,
    repo_id: &str,
    files: &[String],
    pending: &[String],
) -> Result<()> {
    let name = new_build_name();
    let tmp = dir.join(&name);
    std::fs::create_dir_all(&tmp).map_err(|e| io_err(&tmp, e))?;
    if let Err(e) = build_into(repo, &tmp, repo_id, files, pending, false) {
        let _ = std::fs::remove_dir_all(&tmp);
        return Err(e);
    }
    publish(dir, &name)
}

/// Names the build `name` in `dir/CURRENT` and removes every other build (older
/// ones, and any a killed builder left). Called under the build lock.
pub(super) fn publish(dir: &Path, name: &str) -> Result<()> {
    let pointer = dir.join("CURRENT.tmp");
    let name = name.to_string();
    std::fs::write(&pointer, name.as_bytes()).map_err(|e| io_err(&pointer, e))?;
    std::fs::rename(&pointer, dir.join("CURRENT")).map_err(|e| io_err(&pointer, e))?;
    if let Ok(rd) = std::fs::read_dir(dir) {
        for e in rd.flatten() {
            let n = e.file_name();
            let n = n.to_string_lossy();
            if n != name && (n.starts_with("b-") || n.starts_with("build-") || n == "current") {
                let _ = std::fs::remove_dir_all(e.path());
            }
            // A repair's directory lives for the seconds of its rebuild; one an
            // hour old was left by a killed process.
            let stale = e
                .metadata()
                .and_then(|m| m.modified())
                .ok()
                .and_then(|t| t.elapsed().ok())
                .is_some_and(|age| age.as_secs() > 3600);
            if n.starts_with(REPAIR_PREFIX) && stale {
                let _ = std::fs::remove_dir_all(e.path());
            }
        }
    }
    Ok(())
}

pub(super) fn new_build_name() -> String {
    let id: [u8; 8] = cairn_format::envelope::random_bytes();
    format!("b-{}", hex::encode(id))
}

/// When the repository only gained index files since the current build (no
/// pending record changed, nothing superseded) and not too many: a new build that
/// shares the current build's base segment (hard links; builds are never
/// modified) and holds every file the base lacks in a delta segment. Returns
/// `Ok(false)` when that does not apply; the caller then builds in full.
pub(super) fn build_incremental(
    repo: &dyn IndexSource,
    dir: &Path,
    repo_id: &str,
    files: &[String],
    pending: &[String],
) -> Result<bool> {
    let Ok(current) = std::fs::read_to_string(dir.join("CURRENT")) else {
        return Ok(false);
    };
    let base_dir = dir.join(current.trim());
    let Ok(m) = read_manifest(&base_dir, repo_id, false) else {
        return Ok(false);
    };
    let known: HashSet<&String> = m.index_files.iter().collect();
    let listed: HashSet<&String> = files.iter().collect();
    let new: Vec<String> = files
        .iter()
        .filter(|f| !known.contains(f))
        .cloned()
        .collect();
    if m.pending != pending || !known.iter().all(|f| listed.contains(f)) || new.is_empty() {
        return Ok(false);
    }
    // The delta is rebuilt whole at each change: keep it under a quarter of the
    // base (an index file holds about 45 bytes per blob), else build in full.
    let new_set: HashSet<&String> = new.iter().collect();
    let new_bytes: u64 = repo
        .index_files()?
        .iter()
        .filter(|(id, _)| new_set.contains(&id.to_hex()))
        .map(|(_, size)| size)
        .sum();
    if new_bytes / 45 > m.records / 4 {
        return Ok(false);
    }
    let name = new_build_name();
    let tmp = dir.join(&name);
    std::fs::create_dir_all(&tmp).map_err(|e| io_err(&tmp, e))?;
    let result = (|| -> Result<bool> {
        for e in std::fs::read_dir(&base_dir).map_err(|e| io_err(&base_dir, e))? {
            let e = e.map_err(|e| io_err(&base_dir, e))?;
            if e.file_type().map_err(|er| io_err(&e.path(), er))?.is_file() {
                let to = tmp.join(e.file_name());
                std::fs::hard_link(e.path(), &to).map_err(|er| io_err(&to, er))?;
            }
        }
        let delta = tmp.join("delta");
        std::fs::create_dir_all(&delta).map_err(|e| io_err(&delta, e))?;
        build_into(repo, &delta, repo_id, &new, &[], true)
    })();
    match result {
        Ok(true) => {
            publish(dir, &name)?;
            Ok(true)
        }
        other => {
            let _ = std::fs::remove_dir_all(&tmp);
            other
        }
    }
}

pub(super) struct RecordWriter {
    pub(super) out: BufWriter<File>,
    pub(super) n: u64,
    pub(super) runs: Vec<Run>,
    pub(super) packs: PackTable,
    pub(super) path: PathBuf,
}

impl RecordWriter {
    pub(super) fn add_pack(
        &mut self,
        pack: PackId,
        blobs: &[cairn_format::index::IndexBlob],
        pending: bool,
    ) -> Result<()> {
        let n = self.packs.number(pack);
        let start = self.n;
        let mut count = 0u32;
        for b in blobs.iter().filter(|b| crate::index::fits(b)) {
            let loc = BlobLocation::new(n, b);
            self.out
                .write_all(&pack_record(&b.id, &loc, pending))
                .map_err(|e| io_err(&self.path, e))?;
            self.n += 1;
            count += 1;
        }
        if count > 0 {
            self.runs.push(Run {
                start,
                count,
                pack: n,
            });
        }
        Ok(())
    }
}

/// Builds one segment from `files` and `pending` into `tmp`. With `delta`, the
/// segment is to sit on top of an existing base: it returns `Ok(false)` (nothing
/// usable built) when one of the files supersedes others, as a prune's do — the
/// base then holds entries that are no longer live, and only a full build is right.
pub(super) fn build_into(
    repo: &dyn IndexSource,
    tmp: &Path,
    repo_id: &str,
    files: &[String],
    pending: &[String],
    delta: bool,
) -> Result<bool> {
    let ids: Vec<IndexId> = files
        .iter()
        .filter_map(|h| IndexId::from_hex(h).ok())
        .collect();
    // Records go to disk as each file is read, in file order (so pack by pack).
    let records_path = tmp.join("records.bin");
    let writer = || -> Result<RecordWriter> {
        let f = File::create(&records_path).map_err(|e| io_err(&records_path, e))?;
        Ok(RecordWriter {
            out: BufWriter::with_capacity(1 << 20, f),
            n: 0,
            runs: Vec::new(),
            packs: PackTable::default(),
            path: records_path.clone(),
        })
    };
    let mut w = writer()?;
    let mut superseded: HashSet<IndexId> = HashSet::new();
    let mut errors = Vec::new();
    let mut readable: Vec<IndexId> = Vec::new();
    for batch in ids.chunks(READ_BATCH) {
        let got = crate::threads::parallel_map(batch, 4, |id| repo.read_index_file(id));
        for (id, r) in batch.iter().zip(got) {
            match r {
                Ok(f) => {
                    if delta && !f.supersedes.is_empty() {
                        return Ok(false);
                    }
                    superseded.extend(f.supersedes.iter().copied());
                    readable.push(*id);
                    for p in &f.packs {
                        w.add_pack(p.id, &p.blobs, false)?;
                    }
                }
                Err(e @ Error::Damaged { .. }) => errors.push(e.to_string()),
                Err(e) => return Err(e),
            }
        }
    }
    // Which files are superseded is known only once all are read. Superseded
    // files still listed are rare (a prune's replacement beside the files it
    // replaces, until that prune deletes them): then the live ones are read again.
    if readable.iter().any(|id| superseded.contains(id)) {
        drop(w);
        w = writer()?;
        let live_files: Vec<IndexId> = readable
            .into_iter()
            .filter(|id| !superseded.contains(id))
            .collect();
        for batch in live_files.chunks(READ_BATCH) {
            let got: Vec<Result<IndexFile>> =
                crate::threads::parallel_map(batch, 4, |id| repo.read_index_file(id));
            for f in got {
                for p in &f?.packs {
                    w.add_pack(p.id, &p.blobs, false)?;
                }
            }
        }
    }
    // Then the packs of pending-deletion records.
    for h in pending {
        let Ok(id) = PendingId::from_hex(h) else {
            continue;
        };
        match repo.read_pending(&id) {
            Ok(p) => {
                for pack in &p.packs {
                    w.add_pack(pack.id, &pack.blobs, true)?;
                }
            }
            Err(Error::Backend(b)) if b.is_not_found() => {}
            Err(e @ Error::Damaged { .. }) => errors.push(e.to_string()),
            Err(e) => return Err(e),
        }
    }
    let n = w.n;
    let mut out = w
        .out
        .into_inner()
        .map_err(|e| io_err(&records_path, e.into_error()))?;
    out.flush().map_err(|e| io_err(&records_path, e))?;
    drop(out);

    // Keys: bucket by the top byte on disk, then sort each bucket in memory.
    let records = File::open(&records_path).map_err(|e| io_err(&records_path, e))?;
    let mut buckets: Vec<BufWriter<File>> = Vec::with_capacity(256);
    for b in 0..256 {
        let p = tmp.join(format!("bucket-{b:02x}"));
        let f = File::create(&p).map_err(|e| io_err(&p, e))?;
        buckets.push(BufWriter::with_capacity(64 << 10, f));
    }
    let mut reader = BufReader::with_capacity(1 << 20, &records);
    let mut r = [0u8; RECORD_LEN];
    for pos in 0..n {
        reader
            .read_exact(&mut r)
            .map_err(|e| io_err(&records_path, e))?;
        let mut k = [0u8; KEY_LEN];
        k[..8].copy_from_slice(&r[..8]);
        let v = pos | (u64::from(record_pending(&r)) << 39);
        k[8..].copy_from_slice(&v.to_le_bytes()[..5]);
        buckets[r[0] as usize]
            .write_all(&k)
            .map_err(|e| io_err(tmp, e))?;
    }
    for b in buckets {
        b.into_inner()
            .map_err(|e| io_err(tmp, e.into_error()))?
            .flush()
            .map_err(|e| io_err(tmp, e))?;
    }
    let mut dir_bits = 0u32;
    while dir_bits < 40 && (n >> dir_bits) > KEYS_PER_BUCKET {
        dir_bits += 1;
    }
    let mut dir = vec![0u64; (1usize << dir_bits) + 1];
    let mut filter = Filter::with_capacity(n);
    let keys_path = tmp.join("keys.bin");
    let mut keys_out = BufWriter::with_capacity(
        1 << 20,
        File::create(&keys_path).map_err(|e| io_err(&keys_path, e))?,
    );
    let mut skipped: Vec<u64> = Vec::new();
    let (mut unique, mut live) = (0u64, 0u64);
    let mut written = 0u64;
    let bucket_of = |prefix: u64| -> usize {
        if dir_bits == 0 {
            0
        } else {
            (prefix >> (64 - dir_bits)) as usize
        }
    };
    let mut next_dir = 0usize;
    for b in 0..256 {
        let p = tmp.join(format!("bucket-{b:02x}"));
        let data = std::fs::read(&p).map_err(|e| io_err(&p, e))?;
        let _ = std::fs::remove_file(&p);
        let mut keys: Vec<[u8; KEY_LEN]> = data
            .chunks_exact(KEY_LEN)
            .map(|c| {
                let mut k = [0u8; KEY_LEN];
                k.copy_from_slice(c);
                k
            })
            .collect();
        keys.sort_unstable();
        let mut i = 0;
        while i < keys.len() {
            let mut j = i + 1;
            while j < keys.len() && keys[j][..8] == keys[i][..8] {
                j += 1;
            }
            // Keys sharing a prefix: read their records; of equal ids keep one
            // copy, a live one if any.
            let group = &keys[i..j];
            let mut chosen: HashMap<BlobId, (u64, bool)> = HashMap::new();
            if group.len() == 1 {
                unique += 1;
                live += u64::from(!key_pending(&group[0]));
            } else {
                for k in group {
                    let pos = key_pos(k);
                    let rec = read_at(&records, pos, &records_path)?;
                    let id = record_id(&rec);
                    let pending = record_pending(&rec);
                    match chosen.get(&id) {
                        Some(&(other, other_pending)) => {
                            if other_pending && !pending {
                                skipped.push(other);
                                chosen.insert(id, (pos, pending));
                            } else {
                                skipped.push(pos);
                            }
                        }
                        None => {
                            chosen.insert(id, (pos, pending));
                        }
                    }
                }
            }
            for (_, pending) in chosen.values() {
                unique += 1;
                live += u64::from(!pending);
            }
            let prefix = prefix_of(&group[0]);
            filter.insert(prefix);
            let d = bucket_of(prefix);
            while next_dir <= d {
                dir[next_dir] = written;
                next_dir += 1;
            }
            for k in group {
                keys_out.write_all(k).map_err(|e| io_err(&keys_path, e))?;
                written += 1;
            }
            i = j;
        }
    }
    while next_dir < dir.len() {
        dir[next_dir] = written;
        next_dir += 1;
    }
    keys_out
        .into_inner()
        .map_err(|e| io_err(&keys_path, e.into_error()))?
        .flush()
        .map_err(|e| io_err(&keys_path, e))?;
    skipped.sort_unstable();
    let mut checksums = std::collections::BTreeMap::new();
    checksums.insert(
        "records.bin.sums".to_string(),
        write_block_sums(tmp, "records.bin")?,
    );
    checksums.insert(
        "keys.bin.sums".to_string(),
        write_block_sums(tmp, "keys.bin")?,
    );
    let mut write = |name: &str, data: &[u8]| -> Result<()> {
        let p = tmp.join(name);
        checksums.insert(name.to_string(), file_sum(data));
        std::fs::write(&p, data).map_err(|e| io_err(&p, e))
    };
    write(
        "dir.bin",
        &dir.iter()
            .flat_map(|d| d.to_le_bytes())
            .collect::<Vec<u8>>(),
    )?;
    write("filter.bin", &filter.to_bytes())?;
    write(
        "packs.bin",
        &w.packs.ids.iter().flat_map(|p| p.0).collect::<Vec<u8>>(),
    )?;
    let mut runs = Vec::with_capacity(w.runs.len() * 16);
    for r in &w.runs {
        runs.extend_from_slice(&r.start.to_le_bytes());
        runs.extend_from_slice(&r.count.to_le_bytes());
        runs.extend_from_slice(&r.pack.to_le_bytes());
    }
    write("runs.bin", &runs)?;
    write(
        "skipped.bin",
        &skipped
            .iter()
            .flat_map(|s| s.to_le_bytes())
            .collect::<Vec<u8>>(),
    )?;
    let m = Manifest {
        version: MANIFEST_VERSION,
        repo_id: repo_id.to_string(),
        index_files: files.to_vec(),
        pending: pending.to_vec(),
        records: n,
        unique,
        live,
        dir_bits,
        errors,
        checksums,
    };
    let body = serde_json::to_vec_pretty(&m).map_err(|e| Error::Invalid(e.to_string()))?;
    // The manifest last: a build without one is never used.
    let mp = tmp.join("manifest.json");
    std::fs::write(&mp, &body).map_err(|e| io_err(&mp, e))?;
    Ok(true)
}
