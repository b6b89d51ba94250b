//! Restore execution: packs are handed to worker threads; each reads its pack in a
//! few coalesced ranges, decodes and verifies every needed blob once, and writes it to
//! every place that needs it with positional writes. All-zero chunks are not written:
//! the file was created at its full size, so they stay holes.
//!
//! Files are reached through their parent directory's descriptor and their name, and
//! a file the walk created is used only after checking it is still that inode (see
//! [`super::target`]); nothing is opened by path.

use super::metadata::{self, Creation};
use super::plan::{Need, Plan};
use super::{Failure, FileJob};
use crate::error::Result;
use crate::progress::Progress;
use crate::repo::Repository;
use crate::repo::blob;
use cairn_backend::bufpool::{BufferPool, Pooled};
use cairn_backend::direct::{self, AlignedBuf, DIRECT_MIN_BYTES};
use std::collections::HashMap;
use std::fs::File;
use std::os::fd::AsFd;
use std::os::unix::fs::FileExt;
use std::sync::Mutex;
use std::sync::atomic::{AtomicUsize, Ordering};

/// Gaps up to this size between needed blobs are read through rather than split.
const MAX_GAP: u32 = 512 << 10;
/// Upper bound of one range read (each reading thread holds one at a time).
const MAX_RANGE: u32 = 8 << 20;
/// The least a range is bounded to under a tight memory limit.
const MIN_RANGE: u32 = 1 << 20;

/// The bound of one range read for `repo`: [`MAX_RANGE`], or under a memory limit
/// a share of the working memory — a restore's pack reads and merged writes are
/// most of what it holds. Half the working memory goes to the reading threads;
/// each holds a range twice (the O_DIRECT buffer and the bytes returned) and its
/// write buffer twice (the merged run and its aligned copy).
pub(crate) fn range_limit(repo: &Repository) -> u32 {
    per_thread_share(repo).map_or(MAX_RANGE, |a| {
        (a / 4).clamp(MIN_RANGE.into(), MAX_RANGE.into()) as u32
    })
}

/// The bound of one merged write, as [`range_limit`] says.
fn merged_write_limit(repo: &Repository) -> usize {
    per_thread_share(repo).map_or(MAX_WRITE, |a| {
        usize::try_from(a / 4)
            .unwrap_or(MAX_WRITE)
            .clamp(MIN_RANGE as usize, MAX_WRITE)
    })
}

fn per_thread_share(repo: &Repository) -> Option<u64> {
    repo.memory_plan_in_use()
        .map(|p| p.work_bytes / 2 / threads() as u64)
}

/// Files a worker keeps open (each with up to two descriptors).
pub(crate) const OPEN_FILES_PER_WORKER: usize = 64;

/// Reads and large writes bypass the page cache and wait for the device: a couple
/// of requests in flight beyond the cores (measured: more threads only cost memory).
pub(crate) fn threads() -> usize {
    crate::threads::cores() + 2
}

pub(crate) struct Executed {
    pub failed: HashMap<u32, Failure>,
    /// One-chunk files written whole whose extended attributes were refused.
    pub xattrs_refused: HashMap<u32, String>,
}

/// A blob's place in its pack, for coalescing reads.
pub(crate) trait PackSpan {
    /// Offset and length in the pack.
    fn span(&self) -> (u32, u32);
}

impl PackSpan for Need {
    fn span(&self) -> (u32, u32) {
        (self.offset, self.length)
    }
}

/// Splits a pack's needs, sorted by offset, into ranges read in one request each:
/// gaps up to [`MAX_GAP`] are read through, a range stops at `max_range` bytes
/// (see [`range_limit`]; a single larger blob is a range of its own).
pub(crate) fn ranges<T: PackSpan>(needs: &[T], max_range: u32) -> Vec<&[T]> {
    let mut out = Vec::new();
    let Some(first) = needs.first() else {
        return out;
    };
    let (offset, length) = first.span();
    let (mut start, mut first_off, mut end) = (0, offset, offset + length);
    for (i, n) in needs.iter().enumerate().skip(1) {
        let (offset, length) = n.span();
        let n_end = offset + length;
        if offset > end.saturating_add(MAX_GAP) || n_end.saturating_sub(first_off) > max_range {
            out.push(&needs[start..i]);
            (start, first_off, end) = (i, offset, n_end);
        } else {
            end = end.max(n_end);
        }
    }
    out.push(&needs[start..]);
    out
}

/// The pack bytes one of [`ranges`]' ranges covers: from its first blob (the needs
/// are sorted by offset) to the furthest end of any.
pub(crate) fn range_bounds<T: PackSpan>(range: &[T]) -> (u32, u32) {
    let start = range.first().map_or(0, |n| n.span().0);
    let end = range
        .iter()
        .map(|n| n.span().0 + n.span().1)
        .max()
        .unwrap_or(start);
    (start, end)
}

/// Writes blobs to files, merging runs of consecutive chunks of one file into one
/// `pwrite`: fewer system calls, and (because chunks are not page-aligned) far fewer
/// partial pages the filesystem must zero first (measured: 10% of restore CPU).
struct FileWriter<'a> {
    jobs: &'a [FileJob],
    /// file -> (ordinary descriptor, O_DIRECT descriptor if the filesystem allows it)
    files: HashMap<u32, (File, Option<File>)>,
    file: u32,
    offset: u64,
    /// The pending run is `buf[start..]`, laid out so that its aligned middle lies
    /// aligned in memory (`direct::pad_for_offset`): the direct write takes it
    /// without a copy.
    buf: Vec<u8>,
    start: usize,
    scratch: AlignedBuf,
    /// Cleared when the target filesystem refuses O_DIRECT.
    direct: bool,
    /// Bytes merged into one write at most (see [`merged_write_limit`]).
    max_write: usize,
    /// Files a run could not be written to, with why; drained by the caller.
    failed: Vec<(u32, String)>,
}

const MAX_WRITE: usize = 4 << 20;

impl<'a> FileWriter<'a> {
    fn new(jobs: &'a [FileJob], max_write: usize) -> Self {
        FileWriter {
            jobs,
            max_write,
            files: HashMap::new(),
            file: 0,
            offset: 0,
            buf: Vec::new(),
            start: 0,
            scratch: AlignedBuf::default(),
            direct: true,
            failed: Vec::new(),
        }
    }
}

impl FileWriter<'_> {
    /// Queues `data` for `file` at `offset`, writing the pending run first when this
    /// does not continue it. A failure of that run is recorded against the run's file
    /// and never stops `data` from being queued: it belongs to another file or place.
    fn write(&mut self, file: u32, offset: u64, data: &[u8]) {
        let pending = self.buf.len() - self.start;
        if pending > 0
            && (file != self.file
                || offset != self.offset + pending as u64
                || pending + data.len() > self.max_write)
        {
            self.flush();
        }
        if self.buf.len() == self.start {
            self.file = file;
            self.offset = offset;
            if self.buf.capacity() < self.max_write + 2 * direct::DIRECT_ALIGN as usize {
                self.buf = Vec::with_capacity(self.max_write + 2 * direct::DIRECT_ALIGN as usize);
            }
            self.start = direct::pad_for_offset(&mut self.buf, offset);
        }
        self.buf.extend_from_slice(data);
    }

    fn flush(&mut self) {
        if self.buf.len() == self.start {
            return;
        }
        if let Err(m) = self.write_run() {
            self.failed.push((self.file, m));
        }
        self.buf.truncate(self.start);
    }

    /// Writes the pending run; large runs go mostly through O_DIRECT (see
    /// `cairn_backend::direct`: the page cache cost 30x the CPU here).
    fn write_run(&mut self) -> Result<(), String> {
        let file = self.file;
        if self.files.len() >= OPEN_FILES_PER_WORKER && !self.files.contains_key(&file) {
            self.files.clear();
        }
        let run = &self.buf[self.start..];
        let want_direct = self.direct && run.len() as u64 >= DIRECT_MIN_BYTES;
        let job = &self.jobs[file as usize];
        let entry = match self.files.entry(file) {
            std::collections::hash_map::Entry::Occupied(o) => o.into_mut(),
            std::collections::hash_map::Entry::Vacant(v) => {
                let f = job
                    .reopen(libc::O_WRONLY)
                    .map_err(|e| format!("opening for writing: {e}"))?;
                v.insert((f, None))
            }
        };
        if want_direct && entry.1.is_none() {
            // A second descriptor of the same checked inode, opened with O_DIRECT.
            match job.reopen(libc::O_WRONLY | libc::O_DIRECT) {
                Ok(d) => entry.1 = Some(d),
                Err(e) if matches!(e.raw_os_error(), Some(libc::EINVAL | libc::EOPNOTSUPP)) => {
                    self.direct = false
                }
                Err(e) => return Err(format!("opening for writing: {e}")),
            }
        }
        let (f, d) = (&entry.0, entry.1.as_ref().filter(|_| self.direct));
        match direct::write_at(f, d, &mut self.scratch, run, self.offset) {
            Ok(true) => Ok(()),
            Ok(false) => {
                self.direct = false;
                Ok(())
            }
            Err(e) => Err(format!("writing: {e}")),
        }
    }
}

pub(crate) fn execute(
    repo: &Repository,
    jobs: &[FileJob],
    plan: &Plan,
    owners: bool,
    progress: &Progress,
    write_limit: Option<&cairn_backend::Limiter>,
    full: &std::sync::atomic::AtomicBool,
) -> Result<Executed> {
    let next = AtomicUsize::new(0);
    let failed: Mutex<HashMap<u32, Failure>> = Mutex::new(HashMap::new());
    let threads = threads();
    let (max_range, max_write) = (range_limit(repo), merged_write_limit(repo));
    let creation = Creation::new(owners);
    let fail = |file: u32, msg: Failure| {
        if super::says_full(&msg.message) {
            full.store(true, Ordering::Relaxed);
        }
        failed
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .entry(file)
            .or_insert(msg);
    };
    // Why what is left is given up, if it is: cancelled, or no room left.
    let halted = || {
        if progress.is_cancelled() {
            Some(super::CANCELLED)
        } else if full.load(Ordering::Relaxed) {
            Some(super::TARGET_FULL)
        } else {
            None
        }
    };
    let xattrs_refused: Mutex<HashMap<u32, String>> = Mutex::new(HashMap::new());
    let attrs = |file: u32, msg: String| {
        xattrs_refused
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .insert(file, msg);
    };
    // `n` bytes of files restored, of which `written` were written: the holes
    // left for all-zero stretches cost no `--write-limit` (QA r35: a 64 MiB
    // sparse file holding 4 KiB took 8 s at 8M).
    let done = |n: usize, written: usize| {
        progress.bytes_done(n as u64);
        if let Some(l) = write_limit {
            l.take(written as u64);
        }
    };
    // Every worker keeps its range buffer: a fresh one per range had the kernel map
    // and zero its pages again (a sixth of the client's CPU in a restore through a
    // server).
    let buffers = BufferPool::new(
        max_range as usize + 2 * direct::DIRECT_ALIGN as usize,
        threads,
    );
    std::thread::scope(|s| {
        for _ in 0..threads.min(plan.packs.len().max(1)) {
            s.spawn(|| {
                let mut w = FileWriter::new(jobs, max_write);
                let mut range_buf = Pooled::new(&buffers, 0);
                while let Some((pack_no, needs)) =
                    plan.packs.get(next.fetch_add(1, Ordering::Relaxed))
                {
                    // Cancelled: the files still waiting for this pack are marked as
                    // not restored in full (mode 0600, the restore's time).
                    if let Some(why) = halted() {
                        for n in needs {
                            fail(n.file, Failure::of(why));
                        }
                        continue;
                    }
                    let pack = repo.index().pack_by_number(*pack_no);
                    for range in ranges(needs, max_range) {
                        // Checked per range and per blob too: a pack can hold tens
                        // of thousands of small files, written slowly under
                        // `--write-limit`.
                        if let Some(why) = halted() {
                            for n in range {
                                fail(n.file, Failure::of(why));
                            }
                            continue;
                        }
                        let (start, end) = range_bounds(range);
                        // One read for the whole range; when it fails (a truncated or
                        // partly unreadable pack), one read per blob, so that what is
                        // still readable is restored.
                        let read = repo.read_pack_range_into(
                            &pack,
                            start.into(),
                            (end - start).into(),
                            &mut range_buf,
                        );
                        // A missing pack: each blob from another copy if it has
                        // one, without asking for the pack again per blob.
                        let mut missing = None;
                        let mut whole = match read {
                            Ok(()) => Some(&mut range_buf),
                            // A short or damaged pack: read it blob by blob below.
                            // Any other failure (storage still unreachable after the
                            // retries) would only fail again once per blob.
                            Err(crate::Error::Backend(e))
                                if matches!(
                                    e.kind,
                                    cairn_backend::BackendErrorKind::Other
                                        | cairn_backend::BackendErrorKind::OutOfRange
                                ) =>
                            {
                                None
                            }
                            Err(crate::Error::Backend(e)) if e.is_not_found() => {
                                missing = Some(Failure::lost(e.to_string()));
                                None
                            }
                            Err(e) => {
                                let m =
                                    Failure::error(&e).within(&format!("pack {}", pack.short()));
                                for n in range {
                                    fail(n.file, m.clone());
                                }
                                continue;
                            }
                        };
                        // The blob last decoded (a blob that several files hold is
                        // listed once per file, side by side): from the range read,
                        // decrypted where it lies, or read on its own.
                        // Known by offset and id: two blobs at one offset (only a
                        // damaged or hostile index lists such) are two blobs, and
                        // the second must not get the first one's bytes.
                        let mut last: Option<(
                            u32,
                            cairn_format::BlobId,
                            Result<Decoded, Failure>,
                        )> = None;
                        // Bytes of the range decrypted so far: a blob that overlaps
                        // them (only a damaged index lists such) is read on its own.
                        let mut decrypted = 0usize;
                        for n in range {
                            if let Some(why) = halted() {
                                fail(n.file, Failure::of(why));
                                continue;
                            }
                            if last
                                .as_ref()
                                .is_none_or(|(off, id, _)| *off != n.offset || *id != n.id)
                            {
                                let lo = (n.offset - start) as usize;
                                let r = match whole.as_mut().filter(|_| lo >= decrypted) {
                                    Some(buf) => {
                                        decrypted = lo + n.length as usize;
                                        let sealed = &mut buf[lo..decrypted];
                                        blob::decode_in_place(
                                            repo.key(),
                                            &n.id,
                                            sealed,
                                            n.raw_length,
                                            n.compression,
                                        )
                                        .map(|p| Decoded::InRange(lo, p))
                                        .map_err(|e| Failure::error(&e))
                                    }
                                    None => match &missing {
                                        Some(m) => Err(m.clone()),
                                        None => repo
                                            .read_pack_range(
                                                &pack,
                                                n.offset.into(),
                                                n.length.into(),
                                            )
                                            .map_err(|e| Failure::error(&e)),
                                    }
                                    .and_then(|sealed| {
                                        blob::decode(
                                            repo.key(),
                                            &n.id,
                                            &sealed,
                                            n.raw_length,
                                            n.compression,
                                        )
                                        .map_err(|e| Failure::error(&e))
                                    })
                                    .map(Decoded::Owned),
                                };
                                // A copy that does not hold its blob: another may.
                                let r = r
                                    .or_else(|e| {
                                        repo.read_other_copy(&n.id, |l| n.is_at(*pack_no, l))
                                            .map(Decoded::Owned)
                                            .ok_or(e)
                                    })
                                    .map_err(|f| f.within(&format!("pack {}", pack.short())));
                                last = Some((n.offset, n.id, r));
                            }
                            let Some((_, _, decoded)) = &last else {
                                continue;
                            };
                            let data = match decoded {
                                Ok(Decoded::InRange(lo, p)) => match &whole {
                                    Some(buf) => p.bytes(&buf[*lo..]),
                                    None => continue,
                                },
                                Ok(Decoded::Owned(v)) => &v[..],
                                Err(m) => {
                                    fail(n.file, m.clone());
                                    continue;
                                }
                            };
                            let job = &jobs[n.file as usize];
                            if job.direct {
                                let written = if super::all_zeros(data) {
                                    0
                                } else {
                                    data.len()
                                };
                                match write_direct(job, data, &creation) {
                                    Ok(()) => done(data.len(), written),
                                    // Complete but for attributes: reported, not failed.
                                    Err(e) if metadata::only_xattrs(&e) => {
                                        done(data.len(), written);
                                        attrs(n.file, e.to_string());
                                    }
                                    Err(e) => fail(n.file, Failure::of(format!("writing: {e}"))),
                                }
                            } else {
                                let written =
                                    write_skipping_zero_pages(&mut w, n.file, n.file_offset, data);
                                done(data.len(), written);
                            }
                            for (f, m) in w.failed.drain(..) {
                                fail(f, Failure::of(m));
                            }
                        }
                    }
                    w.flush();
                    for (f, m) in w.failed.drain(..) {
                        fail(f, Failure::of(m));
                    }
                }
            });
        }
    });
    Ok(Executed {
        failed: failed.into_inner().unwrap_or_else(|e| e.into_inner()),
        xattrs_refused: xattrs_refused
            .into_inner()
            .unwrap_or_else(|e| e.into_inner()),
    })
}

/// A blob the restore decoded: where it lies in the range read (decrypted in place,
/// `blob::Plain` relative to the blob's offset `.0` in the range), or its own buffer.
enum Decoded {
    InRange(usize, blob::Plain),
    Owned(Vec<u8>),
}

/// All-zero stretches of a chunk, page by page, are not written: the file was
/// created at its full size, so they read as zeros and whole pages stay holes. With
/// large chunks, a chunk often straddles the edge of a sparse region, and writing its
/// zeros would make the restored file denser than the original.
const PAGE: u64 = 4096;

/// Returns the bytes written.
fn write_skipping_zero_pages(w: &mut FileWriter<'_>, file: u32, offset: u64, data: &[u8]) -> usize {
    let end = offset + data.len() as u64;
    let mut pos = offset;
    let mut written = 0;
    let mut pending: Option<u64> = None; // start of the non-zero stretch being collected
    while pos < end {
        let next = ((pos / PAGE) + 1) * PAGE;
        let piece_end = next.min(end);
        let piece = &data[(pos - offset) as usize..(piece_end - offset) as usize];
        let hole = super::all_zeros(piece);
        match (hole, pending) {
            (true, Some(start)) => {
                let run = &data[(start - offset) as usize..(pos - offset) as usize];
                w.write(file, start, run);
                written += run.len();
                pending = None;
            }
            (false, None) => pending = Some(pos),
            _ => {}
        }
        pos = piece_end;
    }
    if let Some(start) = pending {
        let run = &data[(start - offset) as usize..];
        w.write(file, start, run);
        written += run.len();
    }
    written
}

/// Creates a single-chunk file (exclusively, in its parent's descriptor), writes it
/// and sets its metadata on that one descriptor. One that fails after it was created
/// with its final mode is put back to 0600, like every file not restored in full.
fn write_direct(job: &FileJob, data: &[u8], creation: &Creation) -> std::io::Result<()> {
    let final_mode = creation.mode(&job.node, &job.dir.node);
    let f = super::target::create_file_mode(job.dir.fd(), &job.name, final_mode.unwrap_or(0o600))?;
    let r = if super::all_zeros(data) {
        f.set_len(data.len() as u64)
    } else {
        f.write_all_at(data, 0)
    };
    let r = r.and_then(|()| metadata::apply(f.as_fd(), false, &job.node, creation.owners));
    if let Err(e) = &r
        && final_mode.is_some()
        && !metadata::only_xattrs(e)
    {
        let _ = super::sys::chmod_fd(f.as_fd(), 0o600);
    }
    r
}

#[cfg(test)]
mod tests {
    use super::*;
    use cairn_format::BlobId;
    use cairn_format::pack::BlobCompression;

    fn need(offset: u32, length: u32) -> Need {
        Need {
            offset,
            length,
            raw_length: length,
            compression: BlobCompression::Raw,
            id: BlobId([0; 32]),
            file: 0,
            file_offset: 0,
        }
    }

    #[test]
    fn coalescing() {
        let needs = vec![
            need(0, 100),
            need(100, 100),
            need(100, 100),
            need(300, 10),
            need(2 << 20, 5),
        ];
        let r = ranges(&needs, MAX_RANGE);
        assert_eq!(r.len(), 2);
        assert_eq!(r[0].len(), 4);
        assert_eq!(r[1].len(), 1);
        assert!(ranges::<Need>(&[], MAX_RANGE).is_empty());
        // A smaller bound splits a run of adjacent blobs; a blob larger than the
        // bound is a range of its own.
        let run: Vec<Need> = (0..8).map(|i| need(i << 20, 1 << 20)).collect();
        assert_eq!(ranges(&run, MAX_RANGE).len(), 1);
        let r = ranges(&run, MIN_RANGE);
        assert_eq!(r.len(), 8);
        assert!(r.iter().all(|r| r.len() == 1));
        let r = ranges(&run, 2 << 20);
        assert_eq!(r.iter().map(|r| r.len()).collect::<Vec<_>>(), vec![2; 4]);
    }

    /// A run that cannot be written (its file was replaced under restore) is reported
    /// against its own file; the data queued after it, for another file, is still
    /// written.
    #[test]
    fn a_failed_file_does_not_cost_the_next_file_its_data() {
        use crate::restore::target::{self, Dir, DirNode};
        use cairn_format::tree::{Node, NodeKind};
        use std::sync::Arc;
        let tmp = tempfile::tempdir().unwrap();
        let fd: std::os::fd::OwnedFd = File::open(tmp.path()).unwrap().into();
        let st = crate::restore::sys::fstat(fd.as_fd()).unwrap();
        let dir = Arc::new(Dir {
            fd,
            node: DirNode::root(tmp.path(), &st),
            path_only: false,
        });
        let mut jobs = Vec::new();
        for name in [c"a", c"b"] {
            let f = target::create_file(dir.fd(), name).unwrap();
            let created = Some(crate::restore::sys::fstat(f.as_fd()).unwrap());
            jobs.push(FileJob {
                dir: dir.clone(),
                name: name.to_owned(),
                node: Node::new(name.to_bytes().to_vec(), NodeKind::File),
                direct: false,
                created,
                replaced: false,
            });
        }
        // `a` is replaced before the executor reopens it.
        std::fs::rename(tmp.path().join("a"), tmp.path().join("moved")).unwrap();
        std::fs::write(tmp.path().join("a"), b"someone else's").unwrap();
        let mut w = FileWriter::new(&jobs, MAX_WRITE);
        w.write(0, 0, b"for a");
        w.write(1, 0, b"for b");
        w.flush();
        assert_eq!(w.failed.len(), 1, "{:?}", w.failed);
        assert_eq!(w.failed[0].0, 0);
        assert_eq!(std::fs::read(tmp.path().join("b")).unwrap(), b"for b");
        assert_eq!(
            std::fs::read(tmp.path().join("a")).unwrap(),
            b"someone else's"
        );
    }

    /// One-chunk files come out with exactly their mode, owner, content and times,
    /// whether they were created with their final mode (`apply` then finds mode and
    /// owner right) or 0600.
    #[test]
    fn one_chunk_files_get_exactly_their_metadata() {
        use crate::restore::sys;
        use crate::restore::target::{Dir, DirNode};
        use cairn_format::tree::{Node, NodeKind, Timestamp};
        use std::os::unix::fs::{MetadataExt, PermissionsExt};
        use std::sync::Arc;
        let tmp = tempfile::tempdir().unwrap();
        let root = sys::euid() == 0;
        // Files created in it take its group, not the process's.
        let sub = tmp.path().join("sgid");
        std::fs::create_dir(&sub).unwrap();
        if root {
            std::os::unix::fs::chown(&sub, None, Some(4321)).unwrap();
        }
        std::fs::set_permissions(&sub, std::fs::Permissions::from_mode(0o2777)).unwrap();
        let (euid, egid) = (sys::euid(), sys::egid());
        let creation = Creation::new(root);
        // (mode, uid, gid, takes the short way when restoring owners as root)
        let mut cases = vec![
            (0o644, euid, egid, true),
            (0o440, euid, egid, true),
            (0o600, euid, egid, true),
            (0o664, euid, egid, false),
            (0o4755, euid, egid, false),
            (0o1644, euid, egid, false),
        ];
        if root {
            cases.push((0o644, 1234, 5678, false));
        }
        for dir_path in [tmp.path(), sub.as_path()] {
            let fd: std::os::fd::OwnedFd = File::open(dir_path).unwrap().into();
            let mut st = sys::fstat(fd.as_fd()).unwrap();
            let in_sgid = dir_path == sub.as_path();
            if in_sgid {
                // Creation avoids a set-group-ID directory as root.
                let node = DirNode::root(dir_path, &st);
                let mut n = Node::new(b"x".to_vec(), NodeKind::File);
                (n.mode, n.uid, n.gid) = (0o644, euid, egid);
                assert_eq!(creation.mode(&n, &node).is_some(), !root);
                // Here it is told otherwise, as a file system's own rule for groups
                // would surprise it: what `fstat` finds is set right.
                st.mode &= !libc::S_ISGID;
            }
            let dir = Arc::new(Dir {
                fd,
                node: DirNode::root(dir_path, &st),
                path_only: false,
            });
            for (i, (mode, uid, gid, short)) in cases.iter().enumerate() {
                let name = format!("f{i}");
                let mut node = Node::new(name.clone().into_bytes(), NodeKind::File);
                node.mode = *mode;
                node.uid = *uid;
                node.gid = *gid;
                node.mtime = Timestamp {
                    secs: 1_000_000 + i as i64,
                    nanos: 5,
                };
                let job = FileJob {
                    dir: dir.clone(),
                    name: std::ffi::CString::new(name.clone()).unwrap(),
                    node,
                    direct: true,
                    created: None,
                    replaced: false,
                };
                assert_eq!(
                    creation.mode(&job.node, &dir.node).is_some(),
                    *short,
                    "case {i} in {dir_path:?}"
                );
                write_direct(&job, name.as_bytes(), &creation).unwrap();
                let path = dir_path.join(&name);
                let m = std::fs::symlink_metadata(&path).unwrap();
                assert_eq!(m.mode() & 0o7777, *mode, "case {i} in {dir_path:?}");
                assert_eq!(m.mtime(), 1_000_000 + i as i64);
                assert_eq!(m.mtime_nsec(), 5);
                if root {
                    assert_eq!((m.uid(), m.gid()), (*uid, *gid), "case {i} in {dir_path:?}");
                }
                if m.mode() & 0o400 != 0 || root {
                    assert_eq!(std::fs::read(&path).unwrap(), name.as_bytes());
                }
            }
        }
    }
}
