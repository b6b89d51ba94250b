//! Whole-repository sets of records, split by blob id into partitions that sit
//! on local disk, so that a job joining "every blob the snapshots need" with
//! "every blob the index lists" (prune) holds one partition in RAM at a time
//! instead of both sets whole. A repository of 100 million chunks has about 5 GB
//! of such records; its partitions are a few hundred MB each.
//!
//! Records are fixed-size byte arrays whose first 32 bytes are a blob id; the
//! partition is chosen by the id's leading bits, which are uniform (ids are keyed
//! hashes). With one partition nothing touches the disk: the records stay in
//! memory, as they did before this existed, for the repositories that fit.
//!
//! The files are scratch space: made in a fresh private directory, unlinked when
//! the set is dropped (and by the OS's temporary cleaning after a crash).

use crate::error::{Error, Result};
use std::fs::File;
use std::io::{Read, Seek, SeekFrom, Write};
use std::path::Path;

/// Buffered bytes per partition before they are appended to its file.
const BUFFER: usize = 256 << 10;

/// Records of `N` bytes split into partitions by their first bytes (a blob id).
pub struct Spill<const N: usize> {
    dir: Option<tempfile::TempDir>,
    bits: u32,
    buffers: Vec<Vec<u8>>,
    files: Vec<Option<File>>,
    records: u64,
}

impl<const N: usize> Spill<N> {
    /// A set of `partitions` (rounded up to a power of two, at most 4096)
    /// partitions; with more than one, its files go in a new directory under `dir`.
    pub fn new(partitions: usize, dir: &Path) -> Result<Self> {
        let bits = partitions
            .clamp(1, 4096)
            .next_power_of_two()
            .trailing_zeros();
        let n = 1usize << bits;
        let dir = if n > 1 {
            std::fs::create_dir_all(dir).map_err(|e| io_error(dir, e))?;
            Some(
                tempfile::Builder::new()
                    .prefix("cairn-spill-")
                    .tempdir_in(dir)
                    .map_err(|e| io_error(dir, e))?,
            )
        } else {
            None
        };
        Ok(Spill {
            dir,
            bits,
            buffers: (0..n).map(|_| Vec::new()).collect(),
            files: (0..n).map(|_| None).collect(),
            records: 0,
        })
    }

    pub fn partitions(&self) -> usize {
        self.buffers.len()
    }

    pub fn len(&self) -> u64 {
        self.records
    }

    pub fn is_empty(&self) -> bool {
        self.records == 0
    }

    /// The partition of a record (or of an id: its first 32 bytes).
    pub fn partition_of(&self, key: &[u8]) -> usize {
        if self.bits == 0 {
            return 0;
        }
        let top = u32::from_be_bytes([key[0], key[1], key[2], key[3]]);
        (top >> (32 - self.bits)) as usize
    }

    pub fn push(&mut self, rec: &[u8; N]) -> Result<()> {
        let p = self.partition_of(rec);
        self.buffers[p].extend_from_slice(rec);
        self.records += 1;
        if self.dir.is_some() && self.buffers[p].len() >= BUFFER {
            self.flush(p)?;
        }
        Ok(())
    }

    fn flush(&mut self, p: usize) -> Result<()> {
        let Some(dir) = &self.dir else {
            return Ok(());
        };
        if self.buffers[p].is_empty() {
            return Ok(());
        }
        let path = dir.path().join(format!("{p:04x}"));
        if self.files[p].is_none() {
            let f = std::fs::OpenOptions::new()
                .create_new(true)
                .read(true)
                .write(true)
                .open(&path)
                .map_err(|e| io_error(&path, e))?;
            self.files[p] = Some(f);
        }
        if let Some(f) = self.files[p].as_mut() {
            f.write_all(&self.buffers[p])
                .map_err(|e| io_error(&path, e))?;
        }
        self.buffers[p].clear();
        Ok(())
    }

    /// Every record of partition `p`, in no particular order. The file is read
    /// record by record into the result: the partition is held once, not also as
    /// a byte buffer.
    pub fn read(&mut self, p: usize) -> Result<Vec<[u8; N]>> {
        let tail = &self.buffers[p];
        let mut out = Vec::new();
        if let (Some(dir), Some(f)) = (&self.dir, self.files[p].as_mut()) {
            let path = dir.path().join(format!("{p:04x}"));
            let len = f.seek(SeekFrom::End(0)).map_err(|e| io_error(&path, e))?;
            if len % N as u64 != 0 {
                return Err(Error::Invalid(format!(
                    "spill file {} of {len} bytes does not hold whole {N}-byte records",
                    path.display()
                )));
            }
            out.reserve_exact(len as usize / N + tail.len() / N);
            f.seek(SeekFrom::Start(0)).map_err(|e| io_error(&path, e))?;
            let mut r = std::io::BufReader::with_capacity(BUFFER, &mut *f);
            for _ in 0..len / N as u64 {
                let mut rec = [0u8; N];
                r.read_exact(&mut rec).map_err(|e| io_error(&path, e))?;
                out.push(rec);
            }
            drop(r);
            f.seek(SeekFrom::End(0)).map_err(|e| io_error(&path, e))?;
        }
        out.extend(tail.chunks_exact(N).map(|c| {
            let mut rec = [0u8; N];
            rec.copy_from_slice(c);
            rec
        }));
        Ok(out)
    }
}

fn io_error(path: &Path, e: std::io::Error) -> Error {
    Error::Invalid(format!(
        "scratch space {}: {e} (set CAIRN_INDEX_PATH to a disk with room)",
        path.display()
    ))
}

/// Partitions for `records` records of `record_bytes` each so that one partition
/// (held with about as much again for sorting and joining) stays near `budget`.
pub fn partitions_for(records: u64, record_bytes: u64, budget: u64) -> usize {
    let whole = records.saturating_mul(record_bytes).saturating_mul(2);
    whole.div_ceil(budget.max(4096)).clamp(1, 4096) as usize
}

#[cfg(test)]
mod tests {
    use super::*;

    fn rec(n: u64) -> [u8; 40] {
        let mut r = [0u8; 40];
        r[..32].copy_from_slice(blake3::hash(&n.to_le_bytes()).as_bytes());
        r[32..].copy_from_slice(&n.to_le_bytes());
        r
    }

    #[test]
    fn records_come_back_from_their_partition_in_memory_and_on_disk() {
        let dir = tempfile::tempdir().unwrap();
        for parts in [1, 3, 16] {
            let mut s = Spill::<40>::new(parts, dir.path()).unwrap();
            assert_eq!(s.partitions(), parts.next_power_of_two());
            // Enough records to flush some partitions several times.
            let n = 30_000u64;
            for i in 0..n {
                s.push(&rec(i)).unwrap();
            }
            assert_eq!(s.len(), n);
            let mut seen = vec![false; n as usize];
            for p in 0..s.partitions() {
                let got = s.read(p).unwrap();
                // Reading twice gives the same records (files are read from 0).
                assert_eq!(got.len(), s.read(p).unwrap().len());
                for r in got {
                    assert_eq!(s.partition_of(&r), p);
                    let i = u64::from_le_bytes(r[32..].try_into().unwrap());
                    assert_eq!(r, rec(i));
                    assert!(!seen[i as usize], "record {i} twice");
                    seen[i as usize] = true;
                }
            }
            assert!(seen.iter().all(|s| *s));
            if parts > 1 {
                assert_eq!(std::fs::read_dir(dir.path()).unwrap().count(), 1);
            }
            drop(s);
            assert_eq!(
                std::fs::read_dir(dir.path()).unwrap().count(),
                0,
                "the scratch directory is removed"
            );
        }
    }

    #[test]
    fn partitions_grow_with_the_records_and_stay_bounded() {
        assert_eq!(partitions_for(1_000, 50, 256 << 20), 1);
        assert_eq!(partitions_for(100_000_000, 50, 256 << 20), 38);
        assert_eq!(partitions_for(u64::MAX, 50, 1), 4096);
    }
}
