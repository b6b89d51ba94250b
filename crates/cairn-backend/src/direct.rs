//! Writing large buffers with `O_DIRECT`, bypassing the page cache.
//!
//! Measured on the project machine (ext4 on virtio): writing 2 GiB through the page
//! cache cost 6.2 s of kernel CPU, with `O_DIRECT` 0.2 s, at 1.5 GB/s. Packs and
//! restored files are written once and not read back soon, so caching them only costs.
//! `O_DIRECT` needs the memory address, file offset and length aligned to the logical
//! block size; [`write_at`] sends the 4 KiB-aligned middle of a write through a direct
//! descriptor and the unaligned ends through an ordinary one. A filesystem that refuses
//! `O_DIRECT` (EINVAL) simply gets ordinary writes.

use std::fs::{File, OpenOptions};
use std::os::unix::fs::{FileExt, OpenOptionsExt};
use std::path::Path;

/// Alignment used for direct writes (a multiple of every common logical block size).
pub const DIRECT_ALIGN: u64 = 4096;
/// Aligned spans shorter than this are written through the page cache.
pub const DIRECT_MIN_BYTES: u64 = 256 << 10;

/// A reusable buffer that hands out 4 KiB-aligned copies of data.
#[derive(Default)]
pub struct AlignedBuf {
    buf: Vec<u8>,
}

impl std::fmt::Debug for AlignedBuf {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "AlignedBuf({} bytes)", self.buf.len())
    }
}

impl AlignedBuf {
    fn copy_of(&mut self, data: &[u8]) -> &[u8] {
        let need = data.len() + DIRECT_ALIGN as usize;
        if self.buf.len() < need {
            self.buf.resize(need, 0);
        }
        let off = self.buf.as_ptr().align_offset(DIRECT_ALIGN as usize);
        let dst = &mut self.buf[off..off + data.len()];
        dst.copy_from_slice(data);
        &self.buf[off..off + data.len()]
    }
}

impl AlignedBuf {
    /// A 4 KiB-aligned slice of `len` bytes (contents unspecified).
    fn aligned_mut(&mut self, len: usize) -> &mut [u8] {
        let need = len + DIRECT_ALIGN as usize;
        if self.buf.len() < need {
            self.buf.resize(need, 0);
        }
        let off = self.buf.as_ptr().align_offset(DIRECT_ALIGN as usize);
        &mut self.buf[off..off + len]
    }
}

/// Reads `length` bytes at `offset` of `path` with O_DIRECT (the aligned superset of the
/// range, then the slice). `None` when the filesystem or a short read does not allow
/// it; the caller then reads the ordinary way.
pub fn read_range(
    path: &Path,
    offset: u64,
    length: u64,
    scratch: &mut AlignedBuf,
) -> Option<Vec<u8>> {
    let f = OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_DIRECT | libc::O_NOFOLLOW)
        .open(path)
        .ok()?;
    let a0 = offset / DIRECT_ALIGN * DIRECT_ALIGN;
    let a1 = (offset + length).div_ceil(DIRECT_ALIGN) * DIRECT_ALIGN;
    let buf = scratch.aligned_mut((a1 - a0) as usize);
    let need = (offset + length - a0) as usize;
    let mut got = 0usize;
    while got < need {
        // Reads past the end of the file return short; a short read before `need` means
        // the file is shorter than the range, which the caller reports.
        match f.read_at(&mut buf[got..], a0 + got as u64) {
            Ok(0) => return None,
            Ok(n) if n % DIRECT_ALIGN as usize != 0 && got + n < need => return None,
            Ok(n) => got += n,
            Err(_) => return None,
        }
    }
    let lo = (offset - a0) as usize;
    Some(buf[lo..lo + length as usize].to_vec())
}

/// Opens `path` (which must exist) for direct writes; `None` where the filesystem does
/// not support them.
pub fn open_direct(path: &Path) -> std::io::Result<Option<File>> {
    match OpenOptions::new()
        .write(true)
        .custom_flags(libc::O_DIRECT | libc::O_NOFOLLOW)
        .open(path)
    {
        Ok(f) => Ok(Some(f)),
        Err(e) if refused(&e) => Ok(None),
        Err(e) => Err(e),
    }
}

/// Errors with which filesystems say "no O_DIRECT here".
fn refused(e: &std::io::Error) -> bool {
    matches!(
        e.raw_os_error(),
        Some(libc::EINVAL) | Some(libc::EOPNOTSUPP)
    )
}

/// Writes `data` at `offset`: the aligned middle through `direct` when there is one and
/// the span is large enough, everything else through `buffered`. Returns `false` if the
/// direct write was refused (EINVAL) and the data went through `buffered` instead, so
/// the caller can stop trying.
pub fn write_at(
    buffered: &File,
    direct: Option<&File>,
    scratch: &mut AlignedBuf,
    data: &[u8],
    offset: u64,
) -> std::io::Result<bool> {
    let end = offset + data.len() as u64;
    let a0 = offset.div_ceil(DIRECT_ALIGN) * DIRECT_ALIGN;
    let a1 = end / DIRECT_ALIGN * DIRECT_ALIGN;
    let Some(direct) = direct.filter(|_| a1 > a0 && a1 - a0 >= DIRECT_MIN_BYTES) else {
        buffered.write_all_at(data, offset)?;
        return Ok(true);
    };
    let (head, rest) = data.split_at((a0 - offset) as usize);
    let (middle, tail) = rest.split_at((a1 - a0) as usize);
    buffered.write_all_at(head, offset)?;
    let ok = match direct.write_all_at(scratch.copy_of(middle), a0) {
        Ok(()) => true,
        Err(e) if refused(&e) => {
            buffered.write_all_at(middle, a0)?;
            false
        }
        Err(e) => return Err(e),
    };
    buffered.write_all_at(tail, a1)?;
    Ok(ok)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn direct_range_reads_match() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("f");
        let data: Vec<u8> = (0..1_234_567u32)
            .map(|i| (i * 13 + i / 977) as u8)
            .collect();
        std::fs::write(&p, &data).unwrap();
        let mut scratch = AlignedBuf::default();
        for (off, len) in [
            (0u64, 1_234_567u64),
            (1, 300_000),
            (4096, 8192),
            (1_000_000, 234_567),
            (77, 1_234_000),
        ] {
            if let Some(v) = read_range(&p, off, len, &mut scratch) {
                assert_eq!(&v[..], &data[off as usize..(off + len) as usize]);
            }
        }
    }

    #[test]
    fn split_writes_land_exactly() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("f");
        let data: Vec<u8> = (0..3_000_000u32)
            .map(|i| (i * 7 + i / 4099) as u8)
            .collect();
        let mut scratch = AlignedBuf::default();
        for offset in [0u64, 1, 4095, 4096, 123_457] {
            let _ = std::fs::remove_file(&p);
            let f = File::create(&p).unwrap();
            let d = open_direct(&p).unwrap();
            write_at(&f, d.as_ref(), &mut scratch, &data, offset).unwrap();
            drop(f);
            let back = std::fs::read(&p).unwrap();
            assert_eq!(back.len() as u64, offset + data.len() as u64);
            assert!(back[..offset as usize].iter().all(|b| *b == 0));
            assert_eq!(&back[offset as usize..], &data[..], "offset {offset}");
        }
    }
}
