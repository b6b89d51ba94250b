//! Checksums for the SSD placement's files, so that local damage (a bit flip, a
//! torn write, a stray editor) is found and the files rebuilt from the repository,
//! never taken for an answer.
//!
//! The files loaded whole into RAM at every open (filter, directory, packs, runs,
//! skip list, and the block checksums below) are checked against BLAKE3 sums in the
//! manifest. The two large files read piecemeal by lookups (records, keys) carry a
//! 64-bit XXH3 checksum per 4 KiB block in a `.sums` file (0.2% of their size, kept
//! in RAM: about 0.1 byte per blob); every read covers whole blocks and checks them.
//! A mismatch marks the build damaged (`damaged` in its directory), so that the
//! next open rebuilds it, and the read is answered all the same: the segment's two
//! large files are rebuilt from the repository's index files the segment was
//! built from (a build is reproducible: the same files give the same bytes) into
//! a directory of their own, checked against the sums the damaged files should
//! have had, and read from then on ([`Repair`]). Only when that fails does the
//! read fail; a lookup then answers "absent" and says so.

use super::*;
use std::io::ErrorKind;
use xxhash_rust::xxh3::xxh3_64;

/// Bytes per checksummed block of the large files.
pub(super) const SUM_BLOCK: usize = 4096;
/// The marker a build gets when damage is found in it.
pub(super) const DAMAGED: &str = "damaged";

/// BLAKE3 of a file's bytes, as the manifest records it.
pub(super) fn file_sum(data: &[u8]) -> String {
    blake3::hash(data).to_hex().to_string()
}

/// Reads a small file and checks it against the manifest's sum.
pub(super) fn read_verified(dir: &Path, name: &str, m: &Manifest) -> Result<Vec<u8>> {
    let data = read_file(dir, name)?;
    match m.checksums.get(name) {
        Some(sum) if *sum == file_sum(&data) => Ok(data),
        Some(_) => Err(damage(dir, &format!("{name} does not match its checksum"))),
        None => Err(Error::Invalid(format!("SSD index: no checksum for {name}"))),
    }
}

/// The error for damage found in the build at `dir`, which is marked so that the
/// next open rebuilds it.
pub(super) fn damage(dir: &Path, what: &str) -> Error {
    mark_damaged(dir);
    Error::Invalid(format!(
        "SSD index at {} is damaged: {what} (it is rebuilt from the repository)",
        dir.display()
    ))
}

/// Marks the build holding `dir` (a build, or its delta segment) as damaged.
pub(super) fn mark_damaged(dir: &Path) {
    let build = if dir.file_name().is_some_and(|n| n == "delta") {
        dir.parent().unwrap_or(dir)
    } else {
        dir
    };
    let _ = std::fs::write(build.join(DAMAGED), b"");
}

/// Per-block checksums of a file just written: `<name>.sums`, whose own BLAKE3 goes
/// into the manifest. Returns that sum.
pub(super) fn write_block_sums(dir: &Path, name: &str) -> Result<String> {
    let path = dir.join(name);
    let f = File::open(&path).map_err(|e| io_err(&path, e))?;
    let mut r = BufReader::with_capacity(1 << 20, f);
    let mut block = vec![0u8; SUM_BLOCK];
    let mut sums = Vec::new();
    loop {
        let n = read_full(&mut r, &mut block).map_err(|e| io_err(&path, e))?;
        if n == 0 {
            break;
        }
        sums.extend_from_slice(&xxh3_64(&block[..n]).to_le_bytes());
        if n < SUM_BLOCK {
            break;
        }
    }
    let sums_name = format!("{name}.sums");
    let sp = dir.join(&sums_name);
    std::fs::write(&sp, &sums).map_err(|e| io_err(&sp, e))?;
    Ok(file_sum(&sums))
}

/// Reads until `buf` is full or the file ends.
fn read_full(r: &mut impl Read, buf: &mut [u8]) -> std::io::Result<usize> {
    let mut n = 0;
    while n < buf.len() {
        match r.read(&mut buf[n..]) {
            Ok(0) => break,
            Ok(k) => n += k,
            Err(e) if e.kind() == ErrorKind::Interrupted => {}
            Err(e) => return Err(e),
        }
    }
    Ok(n)
}

/// Where a segment's large files come from again when damage is met in the
/// middle of a run: the repository (a handle of its own, see
/// [`IndexSource::detached`]) and what the segment was built from.
pub(super) struct Repair {
    source: Source,
    segment: PathBuf,
    repo_id: String,
    files: Vec<String>,
    pending: Vec<String>,
    delta: bool,
    /// The manifest's sums of `records.bin.sums` and `keys.bin.sums`: what the
    /// rebuilt files' block sums must hash to.
    expect: [Option<String>; 2],
    /// Done once per segment, by whichever read meets damage first; the others
    /// wait for it and share its outcome.
    outcome: Mutex<Option<std::result::Result<[File; 2], String>>>,
    /// What the damage was, once repaired (for the run's report).
    pub(super) found: Mutex<Option<String>>,
}

/// Which of a segment's large files a [`CheckedFile`] is.
#[derive(Clone, Copy)]
pub(super) enum Large {
    Records = 0,
    Keys = 1,
}

impl Large {
    fn name(self) -> &'static str {
        match self {
            Large::Records => "records.bin",
            Large::Keys => "keys.bin",
        }
    }
}

impl Repair {
    pub(super) fn new(source: Source, segment: &Path, m: &Manifest, delta: bool) -> Repair {
        let expect = [Large::Records, Large::Keys]
            .map(|l| m.checksums.get(&format!("{}.sums", l.name())).cloned());
        Repair {
            source,
            segment: segment.to_path_buf(),
            repo_id: m.repo_id.clone(),
            files: m.index_files.clone(),
            pending: m.pending.clone(),
            delta,
            expect,
            outcome: Mutex::new(None),
            found: Mutex::new(None),
        }
    }

    /// The segment's large files rebuilt (once), or why they could not be.
    fn run(&self, damage: &std::io::Error) -> std::result::Result<[File; 2], String> {
        let mut outcome = self.outcome.lock().unwrap_or_else(|e| e.into_inner());
        if outcome.is_none() {
            mark_damaged(&self.segment);
            let r = self.rebuild();
            if r.is_ok() {
                *self.found.lock().unwrap_or_else(|e| e.into_inner()) = Some(damage.to_string());
            }
            *outcome = Some(r);
        }
        match outcome.as_ref() {
            Some(Ok([records, keys])) => {
                let dup = |f: &File| f.try_clone().map_err(|e| e.to_string());
                Ok([dup(records)?, dup(keys)?])
            }
            Some(Err(why)) => Err(why.clone()),
            None => Err("not rebuilt".into()),
        }
    }

    /// Builds the segment again from the same index files into `repair-*` beside
    /// the builds, checks that its large files are those the damaged ones were,
    /// opens them and removes the directory (the open files stay readable).
    fn rebuild(&self) -> std::result::Result<[File; 2], String> {
        let builds = if self.delta {
            self.segment.parent().and_then(Path::parent)
        } else {
            self.segment.parent()
        }
        .ok_or("no directory for a rebuild")?;
        let tmp = builds.join(format!("{REPAIR_PREFIX}{}", &new_build_name()[2..]));
        std::fs::create_dir_all(&tmp).map_err(|e| io_err(&tmp, e).to_string())?;
        let r = (|| {
            let source = self.source.as_ref();
            let (files, pending) = (&self.files, &self.pending);
            if !build_into(source, &tmp, &self.repo_id, files, pending, self.delta)
                .map_err(|e| e.to_string())?
            {
                return Err("the repository's index files changed since it was built".into());
            }
            let m = read_manifest(&tmp, &self.repo_id, true).map_err(|e| e.to_string())?;
            let open = |l: Large| -> std::result::Result<File, String> {
                let sums = m.checksums.get(&format!("{}.sums", l.name()));
                if sums.is_none() || sums != self.expect[l as usize].as_ref() {
                    return Err(
                        "the repository's index files changed since it was built".to_string()
                    );
                }
                let p = tmp.join(l.name());
                File::open(&p).map_err(|e| io_err(&p, e).to_string())
            };
            Ok([open(Large::Records)?, open(Large::Keys)?])
        })();
        let _ = std::fs::remove_dir_all(&tmp);
        r
    }
}

/// The name of a repair's directory begins with this; one a killed process left
/// is removed by the next build that is published.
pub(super) const REPAIR_PREFIX: &str = "repair-";

/// A large file read in whole, checked blocks. A block is hashed the first time it
/// is read and marked (one bit per block) so that repeated lookups in it cost a
/// read, not a hash.
pub(super) struct CheckedFile {
    file: File,
    path: PathBuf,
    len: u64,
    sums: Vec<u64>,
    verified: Vec<std::sync::atomic::AtomicU64>,
    /// How this file is rebuilt when a read meets damage, and which one it is.
    repair: Option<(std::sync::Arc<Repair>, Large)>,
    /// The rebuilt file, read instead of `file` once there.
    repaired: std::sync::OnceLock<File>,
}

impl CheckedFile {
    /// Opens `name` of the build at `dir`, `len` bytes long, with its block sums.
    pub(super) fn open(
        dir: &Path,
        which: Large,
        len: u64,
        m: &Manifest,
        repair: Option<&std::sync::Arc<Repair>>,
    ) -> Result<CheckedFile> {
        let name = which.name();
        let path = dir.join(name);
        let file = File::open(&path).map_err(|e| io_err(&path, e))?;
        let actual = file.metadata().map_err(|e| io_err(&path, e))?.len();
        if actual != len {
            return Err(damage(dir, &format!("{name} has the wrong size")));
        }
        let raw = read_verified(dir, &format!("{name}.sums"), m)?;
        let sums = u64s(&raw);
        if sums.len() as u64 != len.div_ceil(SUM_BLOCK as u64) || raw.len() % 8 != 0 {
            return Err(damage(dir, &format!("{name}.sums has the wrong size")));
        }
        let verified = (0..sums.len().div_ceil(64))
            .map(|_| std::sync::atomic::AtomicU64::new(0))
            .collect();
        Ok(CheckedFile {
            file,
            path,
            len,
            sums,
            verified,
            repair: repair.map(|r| (r.clone(), which)),
            repaired: std::sync::OnceLock::new(),
        })
    }

    fn is_verified(&self, b: usize) -> bool {
        self.verified[b / 64].load(Ordering::Relaxed) & (1 << (b % 64)) != 0
    }

    fn set_verified(&self, b: usize) {
        self.verified[b / 64].fetch_or(1 << (b % 64), Ordering::Relaxed);
    }

    /// Reads `buf.len()` bytes at `offset`, checking every block it touches. On
    /// damage (or a failed read) the file is rebuilt from the repository once and
    /// the read answered from the rebuilt one.
    pub(super) fn read_exact_at(&self, buf: &mut [u8], offset: u64) -> std::io::Result<()> {
        self.in_bounds(buf, offset)?;
        let from_repaired = self.repaired.get().is_some();
        // Any failure past the bounds check is the file's: damage, a file cut
        // short or removed under the run, a read error.
        let damage = match self.read_checked(buf, offset) {
            Ok(()) => return Ok(()),
            Err(e) if from_repaired => return Err(e),
            Err(e) => e,
        };
        let Some((repair, which)) = &self.repair else {
            return Err(damage);
        };
        match repair.run(&damage) {
            Ok([records, keys]) => {
                let file = match which {
                    Large::Records => records,
                    Large::Keys => keys,
                };
                if self.repaired.set(file).is_ok() {
                    // Blocks are checked again, in the rebuilt file.
                    for w in &self.verified {
                        w.store(0, Ordering::Relaxed);
                    }
                }
                self.read_checked(buf, offset)
            }
            Err(why) => Err(std::io::Error::new(
                damage.kind(),
                format!("{damage}; rebuilding it from the repository failed: {why}"),
            )),
        }
    }

    /// The file reads go to: the rebuilt one once there is one.
    fn current(&self) -> &File {
        self.repaired.get().unwrap_or(&self.file)
    }

    /// Whether the read lies within the file's length as built (a caller's
    /// mistake otherwise, not damage).
    fn in_bounds(&self, buf: &[u8], offset: u64) -> std::io::Result<u64> {
        offset
            .checked_add(buf.len() as u64)
            .filter(|e| *e <= self.len)
            .ok_or_else(|| std::io::Error::new(ErrorKind::UnexpectedEof, "read past the end"))
    }

    /// [`CheckedFile::read_exact_at`] without the rebuild: an error is the answer.
    fn read_checked(&self, buf: &mut [u8], offset: u64) -> std::io::Result<()> {
        let end = self.in_bounds(buf, offset)?;
        if buf.is_empty() {
            return Ok(());
        }
        let first = offset / SUM_BLOCK as u64;
        let last = (end - 1) / SUM_BLOCK as u64;
        let start = first * SUM_BLOCK as u64;
        let stop = ((last + 1) * SUM_BLOCK as u64).min(self.len);
        let n = (stop - start) as usize;
        // Lookups read one or two blocks: no allocation for them.
        let mut small = [0u8; 2 * SUM_BLOCK];
        let mut large = Vec::new();
        let whole: &mut [u8] = if n <= small.len() {
            &mut small[..n]
        } else {
            large.resize(n, 0);
            &mut large
        };
        self.current().read_exact_at(whole, start)?;
        for (i, block) in whole.chunks(SUM_BLOCK).enumerate() {
            let b = first as usize + i;
            if self.is_verified(b) {
                continue;
            }
            if self.sums.get(b).copied() != Some(xxh3_64(block)) {
                return Err(std::io::Error::new(
                    ErrorKind::InvalidData,
                    format!(
                        "{}: block {b} does not match its checksum",
                        self.path.display()
                    ),
                ));
            }
            self.set_verified(b);
        }
        let from = (offset - start) as usize;
        buf.copy_from_slice(&whole[from..from + buf.len()]);
        Ok(())
    }

    /// Reads the whole file and checks every block (also those read before).
    pub(super) fn verify(&self) -> std::io::Result<()> {
        for w in &self.verified {
            w.store(0, Ordering::Relaxed);
        }
        let step = 256 * SUM_BLOCK as u64;
        let mut buf = Vec::new();
        let mut at = 0;
        while at < self.len {
            let n = step.min(self.len - at) as usize;
            buf.resize(n, 0);
            self.read_checked(&mut buf, at)?;
            at += n as u64;
        }
        Ok(())
    }

    pub(super) fn ram_bytes(&self) -> usize {
        self.sums.len() * 8 + self.verified.len() * 8
    }
}
