//! Checksums for the SSD placement's files, so that local damage (a bit flip, a
//! torn write, a stray editor) is found and the files rebuilt from the repository,
//! never taken for an answer.
//!
//! The files loaded whole into RAM at every open (filter, directory, packs, runs,
//! skip list, and the block checksums below) are checked against BLAKE3 sums in the
//! manifest. The two large files read piecemeal by lookups (records, keys) carry a
//! 64-bit XXH3 checksum per 4 KiB block in a `.sums` file (0.2% of their size, kept
//! in RAM: about 0.1 byte per blob); every read covers whole blocks and checks them.
//! A mismatch fails that read, marks the build damaged (`damaged` in its
//! directory), and the next open rebuilds it.

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

/// A large file read in whole, checked blocks. A block is hashed the first time it
/// is read and marked (one bit per block) so that repeated lookups in it cost a
/// read, not a hash.
pub(super) struct CheckedFile {
    file: File,
    path: PathBuf,
    len: u64,
    sums: Vec<u64>,
    verified: Vec<std::sync::atomic::AtomicU64>,
}

impl CheckedFile {
    /// Opens `name` of the build at `dir`, `len` bytes long, with its block sums.
    pub(super) fn open(dir: &Path, name: &str, len: u64, m: &Manifest) -> Result<CheckedFile> {
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
        })
    }

    fn is_verified(&self, b: usize) -> bool {
        self.verified[b / 64].load(Ordering::Relaxed) & (1 << (b % 64)) != 0
    }

    fn set_verified(&self, b: usize) {
        self.verified[b / 64].fetch_or(1 << (b % 64), Ordering::Relaxed);
    }

    /// Reads `buf.len()` bytes at `offset`, checking every block it touches.
    pub(super) fn read_exact_at(&self, buf: &mut [u8], offset: u64) -> std::io::Result<()> {
        let end = offset
            .checked_add(buf.len() as u64)
            .filter(|e| *e <= self.len)
            .ok_or_else(|| std::io::Error::new(ErrorKind::UnexpectedEof, "read past the end"))?;
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
        self.file.read_exact_at(whole, start)?;
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
            self.read_exact_at(&mut buf, at)?;
            at += n as u64;
        }
        Ok(())
    }

    pub(super) fn ram_bytes(&self) -> usize {
        self.sums.len() * 8 + self.verified.len() * 8
    }
}
