//! The packs a prune retires, with their entries, kept on local disk until the
//! pending-deletion records are written. They are known while the replacement
//! index is written, but the records may only be written after it (the locks
//! they name are listed then), and a prune that retires half of a 100-million
//! chunk repository retires 50 million entries: 2.4 GB if held in RAM. Read
//! back, they become records of a bounded number of entries each.

use crate::error::{Error, Result};
use crate::ops::scan::{ENTRY, decode_entry, encode_entry};
use cairn_format::PackId;
use cairn_format::index::IndexPack;
use std::io::{BufReader, BufWriter, Read, Seek, Write};
use std::path::{Path, PathBuf};

/// Entries per pending-deletion record: about 25 MB of record.
const ENTRIES_PER_RECORD: usize = 500_000;

/// [`ENTRIES_PER_RECORD`], except in tests, where prunes write several records
/// from small repositories (unit tests always; the binary's crash tests through
/// `CAIRN_TEST_PENDING_ENTRIES`).
pub(super) fn entries_per_record() -> usize {
    if cfg!(test) {
        return 2;
    }
    #[cfg(feature = "test-hooks")]
    if let Some(n) = std::env::var("CAIRN_TEST_PENDING_ENTRIES")
        .ok()
        .and_then(|v| v.parse().ok())
    {
        return n;
    }
    ENTRIES_PER_RECORD
}

pub(super) struct Retired {
    dir: PathBuf,
    file: Option<BufWriter<std::fs::File>>,
    /// The packs in order, with how many entries each has in the file.
    packs: Vec<(PackId, u32)>,
}

fn io_error(path: &Path, e: std::io::Error) -> Error {
    Error::Invalid(format!(
        "scratch space {}: {e} (set CAIRN_INDEX_PATH to a disk with room)",
        path.display()
    ))
}

impl Retired {
    /// An empty list whose file (made at the first entry, unlinked from the
    /// start) goes in `dir`.
    pub fn new(dir: &Path) -> Self {
        Retired {
            dir: dir.to_path_buf(),
            file: None,
            packs: Vec::new(),
        }
    }

    pub fn is_empty(&self) -> bool {
        self.packs.is_empty()
    }

    pub fn push(&mut self, pack: &IndexPack) -> Result<()> {
        let count = u32::try_from(pack.blobs.len())
            .map_err(|_| Error::Invalid(format!("pack {} lists too many blobs", pack.id)))?;
        self.packs.push((pack.id, count));
        if pack.blobs.is_empty() {
            return Ok(());
        }
        let dir = &self.dir;
        let file = match &mut self.file {
            Some(f) => f,
            None => {
                std::fs::create_dir_all(dir).map_err(|e| io_error(dir, e))?;
                let f = tempfile::tempfile_in(dir).map_err(|e| io_error(dir, e))?;
                self.file.insert(BufWriter::with_capacity(1 << 20, f))
            }
        };
        for b in &pack.blobs {
            file.write_all(&encode_entry(0, 0, b))
                .map_err(|e| io_error(dir, e))?;
        }
        Ok(())
    }

    /// Hands the packs over in order, in batches of at most `per_batch` entries
    /// (a pack is never split; a larger one is a batch of its own).
    pub fn into_batches(
        self,
        per_batch: usize,
        each: &mut dyn FnMut(Vec<IndexPack>) -> Result<()>,
    ) -> Result<()> {
        let dir = self.dir;
        let mut reader = match self.file {
            Some(w) => {
                let mut f = w.into_inner().map_err(|e| io_error(&dir, e.into_error()))?;
                f.rewind().map_err(|e| io_error(&dir, e))?;
                Some(BufReader::with_capacity(1 << 20, f))
            }
            None => None,
        };
        let mut batch: Vec<IndexPack> = Vec::new();
        let mut entries = 0usize;
        let mut record = [0u8; ENTRY];
        for (id, count) in self.packs {
            let mut blobs = Vec::with_capacity(count as usize);
            for _ in 0..count {
                let r = reader.as_mut().ok_or_else(|| {
                    Error::Invalid("retired entries went missing from scratch space".into())
                })?;
                r.read_exact(&mut record).map_err(|e| io_error(&dir, e))?;
                blobs.push(decode_entry(&record)?.blob);
            }
            if entries > 0 && entries + blobs.len() > per_batch {
                each(std::mem::take(&mut batch))?;
                entries = 0;
            }
            entries += blobs.len();
            batch.push(IndexPack { id, blobs });
        }
        if !batch.is_empty() {
            each(batch)?;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use cairn_format::BlobId;
    use cairn_format::index::IndexBlob;
    use cairn_format::pack::{BlobCompression, BlobKind};

    #[test]
    fn packs_come_back_whole_in_bounded_batches() {
        let dir = tempfile::tempdir().unwrap();
        let pack = |n: u8, blobs: u32| IndexPack {
            id: PackId([n; 32]),
            blobs: (0..blobs)
                .map(|i| IndexBlob {
                    kind: BlobKind::Data,
                    id: BlobId([n.wrapping_add(i as u8); 32]),
                    offset: i * 10,
                    length: 10,
                    raw_length: 12,
                    compression: BlobCompression::Raw,
                })
                .collect(),
        };
        let packs = vec![pack(1, 3), pack(2, 0), pack(3, 4), pack(4, 9), pack(5, 1)];
        let mut r = Retired::new(dir.path());
        for p in &packs {
            r.push(p).unwrap();
        }
        let mut batches = Vec::new();
        r.into_batches(5, &mut |b| {
            batches.push(b);
            Ok(())
        })
        .unwrap();
        let sizes: Vec<Vec<usize>> = batches
            .iter()
            .map(|b| b.iter().map(|p| p.blobs.len()).collect())
            .collect();
        // 3+0 fit, 4 would not join them, 9 is alone, then 1.
        assert_eq!(sizes, vec![vec![3, 0], vec![4], vec![9], vec![1]]);
        assert_eq!(batches.concat(), packs);
    }
}
