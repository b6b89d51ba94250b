//! `backup --image`: a disk image or block device read in fixed blocks of the
//! repository's block size, as one file of a one-entry snapshot.
//!
//! Blocks travel the backup pipeline like a large file's chunks (the workers hash,
//! deduplicate and encode them; the archiver packs them and builds the list), with
//! two differences: the chunk list has a fixed geometry
//! ([`crate::tree::fixed`]), and with a changed-block list the walker reads only the
//! changed blocks and hands the archiver the parent's list entries for the rest —
//! whole subtrees where nothing under them changed, so the work and the list bytes
//! written follow the size of the change, not of the disk.
//!
//! Reads are positional and several are in flight (`READERS` threads), which keeps
//! a fast device busy. A block that cannot be read is saved as zeros, its range
//! reported and recorded in the snapshot, and the backup goes on.

use super::walker::Walker;
use super::{Item, Skipped};
use crate::error::{Error, Result};
use crate::ops::image::changed::ChangedRanges;
use crate::tree::fixed::{FixedList, Geometry};
use cairn_backend::direct::{AlignedBuf, DIRECT_ALIGN};
use cairn_format::id::SnapshotId;
use cairn_format::tree::{ChunkRef, Content, Node, NodeKind};
use std::collections::{BTreeMap, VecDeque};
use std::fs::File;
use std::os::unix::fs::FileExt;
use std::path::PathBuf;
use std::sync::atomic::{AtomicU64, Ordering};

/// Reader threads: positional reads in flight at once.
const READERS: usize = 4;
/// Reads queued ahead of the one being emitted, per reader.
const AHEAD_PER_READER: usize = 2;
/// Bytes of one read when the whole image is read.
const READ_BYTES: u64 = 4 << 20;
/// Read buffers kept for reuse: those in flight and those the workers hold.
pub(crate) const BUFFERS: usize = READERS * AHEAD_PER_READER + 8;

/// What the image reader reports besides data.
#[derive(Clone, Debug)]
pub(crate) enum Note {
    /// Bytes `[offset, offset + length)` failed to read and hold zeros.
    Unreadable { offset: u64, length: u64 },
    /// The source's size at the end of the backup differed from its size at the
    /// start (the image was saved at the start's size).
    SizeChanged { now: u64 },
    /// Bytes of a sparse file's holes: zeros, not read from the disk.
    Holes { bytes: u64, blocks: u64 },
}

/// Everything decided before the pipeline starts.
pub(crate) struct ImagePlan {
    pub file: File,
    /// `file` opened again with `O_DIRECT`, where the filesystem or device allows it.
    pub direct: Option<File>,
    pub path: PathBuf,
    pub node: Node,
    pub geometry: Geometry,
    /// The parent snapshot's image: its geometry and content.
    pub parent: Option<(Geometry, Content)>,
    /// The byte ranges the parent's source could not read (zeros in the parent).
    pub parent_unreadable: Vec<(u64, u64)>,
    /// Warnings about the parent, said when the backup starts.
    pub notes: Vec<String>,
    pub changed: Option<ChangedRanges>,
    /// A block device's write counters when it was opened ([`device_writes`]).
    pub device_writes: Option<(u64, u64)>,
    /// A regular file's device and inode numbers (see `ImageInfo::source_file`).
    pub source_file: Option<[u64; 2]>,
    /// A block device's image: the parent image's times (mtime, atime, ctime),
    /// kept when the content is the parent's.
    pub unchanged_times: Option<[cairn_format::tree::Timestamp; 3]>,
}

impl ImagePlan {
    /// The parent's unreadable ranges this backup takes from the parent instead of
    /// reading them again: with a changed-block list, every byte outside the
    /// blocks the list touches is the parent's, zeros of its failed reads
    /// included. (A backup without a list reads every block again.)
    pub(crate) fn inherited_unreadable(&self) -> Vec<(u64, u64)> {
        let Some(changed) = &self.changed else {
            return Vec::new();
        };
        let g = &self.geometry;
        let mut out = Vec::new();
        for &(off, len) in &self.parent_unreadable {
            let mut start = off.min(g.size);
            let end = off.saturating_add(len).min(g.size);
            // Cut out each changed range, widened to the blocks read for it.
            for &(s, e) in changed.ranges() {
                let (rs, re) = (
                    s / g.block_size * g.block_size,
                    e.div_ceil(g.block_size).saturating_mul(g.block_size),
                );
                if re <= start || rs >= end {
                    continue;
                }
                if rs > start {
                    out.push((start, rs - start));
                }
                start = start.max(re);
            }
            if end > start {
                out.push((start, end - start));
            }
        }
        out
    }

    /// Whether the parent's blocks `[b, b + n)` can stand for the new image's: the
    /// same bytes of both images (full blocks inside both), or the images end
    /// together there.
    fn parent_covers(&self, b: u64, n: u64) -> bool {
        let Some((pg, _)) = &self.parent else {
            return false;
        };
        let g = &self.geometry;
        let end = (b + n).saturating_mul(g.block_size);
        end <= g.size.min(pg.size) || (pg.size == g.size && b + n >= g.blocks())
    }

    /// Whether the parent's subtree of level `k` at block `b` lists exactly `n`
    /// blocks, as the new image's there does. A parent larger than a shrunk
    /// image lists a whole subtree where the new image's last one is cut short:
    /// taken whole, it brought the parent's blocks past the new end (QA: a file
    /// of 2 MiB in a snapshot of a 1.5 MiB image, and `check` saying its chunk
    /// list claims 96 chunks and lists 128).
    fn parent_subtree_is(&self, k: u32, b: u64, n: u64) -> bool {
        self.parent
            .as_ref()
            .is_some_and(|(pg, _)| pg.span(k).min(pg.blocks().saturating_sub(b)) == n)
    }
}

/// One step of the stream, in image order.
enum Step {
    Reuse {
        level: u32,
        entry: ChunkRef,
        chunks: u64,
    },
    /// Blocks `[first, first + n)` read as read request `seq`.
    Read { seq: u64, first: u64, n: u64 },
}

struct ReadOut {
    /// The bytes read are `buf[start..]`, 4 KiB-aligned in memory.
    buf: Vec<u8>,
    start: usize,
    /// Unreadable byte ranges within the read.
    bad: Vec<(u64, u64, String)>,
}

impl Walker<'_> {
    pub(crate) fn run_image(&mut self, plan: &ImagePlan) -> Result<()> {
        let g = plan.geometry;
        self.emit(Item::DirStart(
            Box::new(Node::new(Vec::new(), NodeKind::Dir)),
            None,
        ))?;
        self.emit(Item::ImageStart {
            node: Box::new(plan.node.clone()),
            geometry: g,
            parent: plan.parent.clone(),
            unchanged_times: plan.unchanged_times,
        })?;
        let to_read = match &plan.changed {
            Some(c) => {
                c.block_bytes(g.block_size, g.size)
                    + g.size
                        .saturating_sub(plan.parent.as_ref().map_or(0, |p| p.0.size))
            }
            None => g.size,
        };
        self.progress.set_total(Some(to_read.min(g.size)), Some(1));
        for n in &plan.notes {
            self.progress.warning(&plan.path, n);
        }
        for (offset, length) in plan.inherited_unreadable() {
            self.progress
                .warning(&plan.path, &inherited_message(offset, length));
        }
        let mut parent = match (&plan.changed, &plan.parent) {
            (Some(_), Some((pg, content))) => {
                Some(FixedList::new(self.repo, *pg, content.clone())?)
            }
            (Some(_), None) => {
                return Err(Error::Invalid(
                    "--changed-blocks needs a parent image snapshot of this source".into(),
                ));
            }
            _ => None,
        };

        let source = &Source {
            file: &plan.file,
            direct: plan.direct.as_ref(),
            sparse: plan.file.metadata().is_ok_and(|m| m.is_file()),
            holes: AtomicU64::new(0),
            hole_blocks: AtomicU64::new(0),
            block_size: plan.geometry.block_size,
            limit: self.read_limit,
        };
        let pool = &self.budget.pool;
        let (req_tx, req_rx) = crossbeam_channel::bounded::<(u64, u64, u64)>(READERS * 4);
        let (res_tx, res_rx) = crossbeam_channel::unbounded::<(u64, ReadOut)>();
        std::thread::scope(|s| -> Result<()> {
            for _ in 0..READERS {
                let (req_rx, res_tx) = (req_rx.clone(), res_tx.clone());
                let bs = g.block_size;
                std::thread::Builder::new()
                    .name("cairn-image-read".into())
                    .spawn_scoped(s, move || {
                        let mut scratch = AlignedBuf::default();
                        for (seq, off, len) in req_rx {
                            let buf = pool.take_kept(len as usize + DIRECT_ALIGN as usize);
                            let out = read_range(source, off, len, bs, buf, &mut scratch);
                            if res_tx.send((seq, out)).is_err() {
                                return;
                            }
                        }
                    })
                    .map_err(|e| Error::Invalid(format!("cannot start a reader thread: {e}")))?;
            }
            drop(req_rx);
            drop(res_tx);
            let mut stream = Stream {
                steps: VecDeque::new(),
                outstanding: 0,
                next_seq: 0,
                arrived: BTreeMap::new(),
                req_tx: Some(req_tx),
                res_rx,
                shrink_warned: false,
                read_warnings: 0,
                pending_warning: None,
            };
            let r = self.image_steps(plan, parent.as_mut(), &mut stream);
            // Stop the readers whatever happened; they end when the queue closes.
            stream.req_tx = None;
            r?;
            while !stream.steps.is_empty() {
                self.emit_step(plan, &mut stream)?;
            }
            self.flush_read_warning(plan, &mut stream);
            Ok(())
        })?;
        let holes = source.holes.load(Ordering::Relaxed);
        if holes > 0 {
            self.emit(Item::ImageNote(Note::Holes {
                bytes: holes,
                blocks: source.hole_blocks.load(Ordering::Relaxed),
            }))?;
        }
        let now = source_size(&plan.file).unwrap_or(g.size);
        if now != g.size {
            let m = format!(
                "the source changed size during the backup ({} to {} bytes): saved at {} bytes; \
                 back up a snapshot of the device (LVM, ZFS, a stopped VM) for a consistent image",
                g.size, now, g.size
            );
            self.progress.warning(&plan.path, &m);
            self.emit(Item::ImageNote(Note::SizeChanged { now }))?;
        }
        // An image file written to while it was read (a running VM's disk) is
        // saved as read, and may be inconsistent: said, as for any file. A block
        // device's times do not tell; its write counters do.
        let written = match plan.file.metadata() {
            Ok(m) if m.is_file() => {
                super::source::Changes::of(&plan.file)
                    != super::source::Changes::of_node(&plan.node)
            }
            _ => plan.device_writes.is_some() && device_writes(&plan.file) != plan.device_writes,
        };
        let torn = match written {
            true if now == g.size => {
                let message = "changed while it was being read (saved as read, and the image may \
                     be inconsistent); back up a snapshot of it (LVM, ZFS, a stopped VM) for a \
                     consistent image"
                    .to_string();
                self.progress.warning(&plan.path, &message);
                Some(Skipped {
                    path: plan.path.clone(),
                    message,
                })
            }
            _ => None,
        };
        self.emit(Item::FileEnd { ok: true, torn })?;
        self.emit(Item::DirEnd)?;
        self.emit(Item::End)
    }

    /// Produces the steps in image order, emitting finished ones as reads complete.
    fn image_steps(
        &mut self,
        plan: &ImagePlan,
        parent: Option<&mut FixedList<'_>>,
        stream: &mut Stream,
    ) -> Result<()> {
        let g = plan.geometry;
        let nb = g.blocks();
        let leaf = g.fanout;
        let mut b = 0u64;
        match (&plan.changed, parent) {
            (Some(changed), Some(parent)) => {
                let top = parent.depth();
                'outer: while b < nb {
                    // The largest untouched subtree starting here, taken whole.
                    for k in (1..top).rev() {
                        let span = g.span(k);
                        if !b.is_multiple_of(span) {
                            continue;
                        }
                        let n = span.min(nb - b);
                        let (start, len) = (b * g.block_size, g.bytes_of(b, n));
                        if plan.parent_covers(b, n)
                            && plan.parent_subtree_is(k, b, n)
                            && !changed.intersects(start, start + len)
                            && let Some(entry) = parent.entry(k, b)?
                        {
                            self.push_step(
                                plan,
                                stream,
                                Step::Reuse {
                                    level: k,
                                    entry,
                                    chunks: n,
                                },
                            )?;
                            b += n;
                            continue 'outer;
                        }
                    }
                    // One level-0 list: changed blocks read, the others reused.
                    let end = (b + leaf - b % leaf).min(nb);
                    let mut run: Option<u64> = None;
                    for i in b..end {
                        let start = i * g.block_size;
                        let dirty = !plan.parent_covers(i, 1)
                            || changed.intersects(start, start + g.bytes_of(i, 1));
                        let entry = if dirty { None } else { parent.entry(0, i)? };
                        match (entry, run) {
                            (None, None) => run = Some(i),
                            (None, Some(_)) => {}
                            (Some(e), r) => {
                                if let Some(first) = r {
                                    self.push_read(plan, stream, first, i - first)?;
                                    run = None;
                                }
                                self.push_step(
                                    plan,
                                    stream,
                                    Step::Reuse {
                                        level: 0,
                                        entry: e,
                                        chunks: 1,
                                    },
                                )?;
                            }
                        }
                    }
                    if let Some(first) = run {
                        self.push_read(plan, stream, first, end - first)?;
                    }
                    b = end;
                }
            }
            _ => {
                let per_read = (READ_BYTES / g.block_size).max(1);
                while b < nb {
                    let n = per_read.min(nb - b);
                    self.push_read(plan, stream, b, n)?;
                    b += n;
                }
            }
        }
        Ok(())
    }

    /// Queues a read of blocks `[first, first + n)`, split to bound each read.
    fn push_read(
        &mut self,
        plan: &ImagePlan,
        stream: &mut Stream,
        first: u64,
        n: u64,
    ) -> Result<()> {
        let per_read = (READ_BYTES / plan.geometry.block_size).max(1);
        let mut b = first;
        while b < first + n {
            let m = per_read.min(first + n - b);
            let seq = stream.next_seq;
            stream.next_seq += 1;
            let g = plan.geometry;
            let req = (seq, b * g.block_size, g.bytes_of(b, m));
            if let Some(tx) = &stream.req_tx {
                tx.send(req)
                    .map_err(|_| Error::Invalid("the image readers stopped".into()))?;
            }
            stream.outstanding += 1;
            self.push_step(
                plan,
                stream,
                Step::Read {
                    seq,
                    first: b,
                    n: m,
                },
            )?;
            b += m;
        }
        Ok(())
    }

    fn push_step(&mut self, plan: &ImagePlan, stream: &mut Stream, step: Step) -> Result<()> {
        stream.steps.push_back(step);
        // Emit from the front while too many reads are queued, and every step that
        // needs no read.
        while stream.outstanding >= READERS * AHEAD_PER_READER
            || matches!(stream.steps.front(), Some(Step::Reuse { .. }))
        {
            self.emit_step(plan, stream)?;
        }
        Ok(())
    }

    /// Emits the first step, waiting for its read.
    fn emit_step(&mut self, plan: &ImagePlan, stream: &mut Stream) -> Result<()> {
        let Some(step) = stream.steps.pop_front() else {
            return Ok(());
        };
        match step {
            Step::Reuse {
                level,
                entry,
                chunks,
            } => {
                self.flush_read_warning(plan, stream);
                self.emit(Item::Reuse {
                    level,
                    entry,
                    chunks,
                })
            }
            Step::Read { seq, first, n } => {
                let out = loop {
                    if let Some(o) = stream.arrived.remove(&seq) {
                        break o;
                    }
                    let (s, o) = stream
                        .res_rx
                        .recv()
                        .map_err(|_| Error::Invalid("the image readers stopped".into()))?;
                    stream.arrived.insert(s, o);
                };
                stream.outstanding -= 1;
                let g = plan.geometry;
                let len = (out.buf.len() - out.start) as u64;
                self.progress.bytes_done(len);
                for (offset, length, message) in out.bad {
                    let warn = if message == SHRANK {
                        let first = !stream.shrink_warned;
                        stream.shrink_warned = true;
                        first.then(|| {
                            format!(
                                "bytes from {offset} on could not be read ({message}); saved \
                                 as zeros"
                            )
                        })
                    } else {
                        // Said once it ends: it may go on in the next read.
                        match &mut stream.pending_warning {
                            // Whatever the error, as the snapshot records it.
                            Some((_, end, _)) if *end == offset => {
                                *end = offset + length;
                            }
                            _ => {
                                self.flush_read_warning(plan, stream);
                                stream.pending_warning =
                                    Some((offset, offset + length, message.clone()));
                            }
                        }
                        None
                    };
                    if let Some(m) = warn {
                        self.progress.warning(&plan.path, &m);
                    }
                    self.emit(Item::ImageNote(Note::Unreadable { offset, length }))?;
                }
                // A range that ends before this read's end is whole.
                let read_end = first * g.block_size + g.bytes_of(first, n);
                if stream
                    .pending_warning
                    .as_ref()
                    .is_some_and(|&(_, end, _)| end < read_end)
                {
                    self.flush_read_warning(plan, stream);
                }
                let lens = (first..first + n)
                    .map(|i| g.bytes_of(i, 1) as u32)
                    .collect();
                self.emit(Item::Data {
                    buf: out.buf,
                    start: out.start,
                    lens,
                })
            }
        }
    }
}

impl Walker<'_> {
    /// Warns of the unreadable range [`Stream::pending_warning`] holds, if any
    /// (up to [`MAX_READ_WARNINGS`] of them).
    fn flush_read_warning(&mut self, plan: &ImagePlan, stream: &mut Stream) {
        let Some((offset, end, message)) = stream.pending_warning.take() else {
            return;
        };
        stream.read_warnings += 1;
        let warn = match stream.read_warnings {
            n if n < MAX_READ_WARNINGS => {
                format!("bytes {offset}..{end} could not be read ({message}); saved as zeros")
            }
            MAX_READ_WARNINGS => format!(
                "bytes {offset}..{end} could not be read ({message}); saved as zeros; further \
                 unreadable ranges are not shown one by one (the summary and the snapshot \
                 list them all)"
            ),
            _ => return,
        };
        self.progress.warning(&plan.path, &warn);
    }
}

struct Stream {
    steps: VecDeque<Step>,
    outstanding: usize,
    next_seq: u64,
    arrived: BTreeMap<u64, ReadOut>,
    req_tx: Option<crossbeam_channel::Sender<(u64, u64, u64)>>,
    res_rx: crossbeam_channel::Receiver<(u64, ReadOut)>,
    /// Warnings given of unreadable ranges: a source that shrank is said once,
    /// a failing disk's errors up to [`MAX_READ_WARNINGS`] (every range is in the
    /// snapshot and the summary all the same).
    shrink_warned: bool,
    read_warnings: usize,
    /// An unreadable range not warned about yet: it may go on in the next read
    /// (QA r40: one range across two reads was said as two): its start, end
    /// and why.
    pending_warning: Option<(u64, u64, String)>,
}

/// Warnings of unreadable ranges a backup prints before it only counts them.
const MAX_READ_WARNINGS: usize = 50;

const SHRANK: &str = "the source ended early: it shrank during the backup";

/// Where the block device `rdev` is mounted read-write, if it is (from this
/// process's mount table).
fn mounted_read_write(rdev: u64) -> Option<String> {
    let want = format!("{}:{}", libc::major(rdev), libc::minor(rdev));
    let table = std::fs::read_to_string("/proc/self/mountinfo").ok()?;
    table.lines().find_map(|line| {
        // id, parent, major:minor, root, mount point, options, ...
        let f: Vec<&str> = line.split(' ').collect();
        let (dev, at, opts) = (f.get(2)?, f.get(4)?, f.get(5)?);
        (*dev == want && opts.split(',').any(|o| o == "rw")).then(|| at.replace("\\040", " "))
    })
}

/// The writes a block device has taken since it appeared (requests and sectors,
/// from `/sys/dev/block/MAJ:MIN/stat`): the same before and after the read, or
/// it was written while read. `None` for a file, or where sysfs does not say.
fn device_writes(f: &File) -> Option<(u64, u64)> {
    use std::os::unix::fs::{FileTypeExt, MetadataExt};
    let meta = f.metadata().ok()?;
    if !meta.file_type().is_block_device() {
        return None;
    }
    let rdev = meta.rdev();
    let stat = std::fs::read_to_string(format!(
        "/sys/dev/block/{}:{}/stat",
        libc::major(rdev),
        libc::minor(rdev)
    ))
    .ok()?;
    // read I/Os, merges, sectors, ticks; write I/Os, merges, sectors, ...
    let f: Vec<u64> = stat
        .split_whitespace()
        .map(|x| x.parse().ok())
        .collect::<Option<_>>()?;
    Some((*f.get(4)?, *f.get(6)?))
}

/// The size of a file or block device.
pub(crate) fn source_size(f: &File) -> std::io::Result<u64> {
    use std::io::Seek;
    let meta = f.metadata()?;
    if meta.is_file() {
        return Ok(meta.len());
    }
    // A block device's size is where its end is (`BLKGETSIZE64` says the same).
    let mut f = f;
    f.seek(std::io::SeekFrom::End(0))
}

/// The image source as the readers see it.
struct Source<'a> {
    file: &'a File,
    /// The same file or device opened with `O_DIRECT`, where it can be.
    direct: Option<&'a File>,
    /// A regular file, whose holes are skipped (see [`data_segments`]).
    sparse: bool,
    /// Bytes skipped as holes, for the report ("read" counts what was read).
    holes: AtomicU64,
    /// Blocks (of `block_size`, from the offset read) wholly in holes: a
    /// block that is partly data was read (QA r18: holes inside read blocks
    /// were counted as whole blocks in holes).
    hole_blocks: AtomicU64,
    block_size: u64,
    /// `--read-limit`, taken by the readers before each read of data: not for
    /// holes, which are not read (QA r35: a 64 MiB sparse image holding 4 KiB
    /// took 8 s at 8M), and not once a read arrived, which let the readers'
    /// 32 MiB ahead come as a burst at the start (QA: 38 MB in the first second
    /// at 8 MB/s).
    limit: Option<&'a cairn_backend::Limiter>,
}

/// Reads as much of `buf` as the source holds from `off`; stops early only at the
/// end of the source. Holes of a sparse file are not read but zeroed here, which
/// spares the kernel zeroing page-cache pages for them and copying them out (most
/// of a fresh disk image is holes). `buf` may hold anything when called: every
/// byte up to the count returned is the source's.
fn read_full_at(
    src: &Source<'_>,
    buf: &mut [u8],
    off: u64,
    scratch: &mut AlignedBuf,
) -> std::io::Result<usize> {
    let segments = if src.sparse {
        data_segments(src.file, off, buf.len() as u64)
    } else {
        None
    };
    let Some((segments, avail)) = segments else {
        return read_piece(src, buf, off, scratch);
    };
    let mut at = 0usize;
    let data: u64 = segments.iter().map(|(s, e)| e - s).sum();
    let bs = src.block_size.max(1);
    let whole_holes = (0..avail.div_ceil(bs))
        .filter(|i| {
            let (b, be) = (off + i * bs, (off + (i + 1) * bs).min(off + avail));
            !segments.iter().any(|&(s, e)| s < be && e > b)
        })
        .count() as u64;
    for (s, e) in segments {
        let (lo, hi) = ((s - off) as usize, (e - off) as usize);
        buf[at..lo].fill(0);
        let n = read_piece(src, &mut buf[lo..hi], s, scratch)?;
        if n < hi - lo {
            return Ok(lo + n);
        }
        at = hi;
    }
    // Counted once the range is read: a failed read is read again block by
    // block, which counts its own holes.
    src.holes
        .fetch_add(avail.saturating_sub(data), Ordering::Relaxed);
    src.hole_blocks.fetch_add(whole_holes, Ordering::Relaxed);
    let avail = avail as usize;
    buf[at..avail].fill(0);
    Ok(avail)
}

/// Reads `buf` at `off` directly when possible, else through the page cache,
/// and charges `--read-limit` with what was read. Charged after the read, so
/// that a failed range read again block by block, or a source that shrank,
/// is charged for the bytes it gave and no more (review r36 L1); the limiter's
/// wait then paces the reader's next read.
fn read_piece(
    src: &Source<'_>,
    buf: &mut [u8],
    off: u64,
    scratch: &mut AlignedBuf,
) -> std::io::Result<usize> {
    let r = read_piece_unpaced(src, buf, off, scratch);
    if let (Some(l), Ok(n)) = (src.limit, &r) {
        l.take(*n as u64);
    }
    r
}

fn read_piece_unpaced(
    src: &Source<'_>,
    buf: &mut [u8],
    off: u64,
    scratch: &mut AlignedBuf,
) -> std::io::Result<usize> {
    if let Some(d) = src.direct
        && cairn_backend::direct::read_into(d, off, buf, scratch)
    {
        return Ok(buf.len());
    }
    let mut done = 0;
    while done < buf.len() {
        match src.file.read_at(&mut buf[done..], off + done as u64) {
            Ok(0) => break,
            Ok(n) => done += n,
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
            Err(e) => return Err(e),
        }
    }
    Ok(done)
}

/// The parts of `[off, off + len)` of a regular file that hold data (`SEEK_DATA` /
/// `SEEK_HOLE`), and how many bytes of the range the file holds; `None` when the
/// filesystem cannot say (the caller reads everything).
fn data_segments(f: &File, off: u64, len: u64) -> Option<(Vec<(u64, u64)>, u64)> {
    let size = f.metadata().ok()?.len();
    let end = (off + len).min(size);
    let mut out = Vec::new();
    let mut at = off;
    while at < end {
        match super::source::data_after(f, at).ok()? {
            Some((data, hole)) if data < end => {
                out.push((data, hole.min(end)));
                at = hole;
            }
            _ => break,
        }
    }
    // "No data after here" also answers past the end of a file that shrank since
    // its size was read: that tail is missing (reported as such), not holes.
    let now = f.metadata().ok()?.len();
    let end = end.min(now);
    out.retain(|(s, _)| *s < end);
    if let Some(last) = out.last_mut() {
        last.1 = last.1.min(end);
    }
    Some((out, end.saturating_sub(off)))
}

/// Reads `[off, off + len)`. On an error, reads block by block so that only the
/// blocks that fail are lost (as zeros, reported); a source that ends early (it
/// shrank) reports the missing tail.
fn read_range(
    src: &Source<'_>,
    off: u64,
    len: u64,
    block: u64,
    mut out: Vec<u8>,
    scratch: &mut AlignedBuf,
) -> ReadOut {
    let start = aligned_window(&mut out, len as usize);
    let buf = &mut out[start..];
    let mut bad: Vec<(u64, u64, String)> = Vec::new();
    let mut note = |at: u64, n: u64, m: String| match bad.last_mut() {
        Some(last) if last.0 + last.1 == at && last.2 == m => last.1 += n,
        _ => bad.push((at, n, m)),
    };
    match read_full_at(src, buf, off, scratch) {
        Ok(n) if n as u64 == len => {}
        Ok(n) => {
            buf[n..].fill(0);
            note(off + n as u64, len - n as u64, SHRANK.into())
        }
        Err(_) => {
            let mut at = 0u64;
            while at < len {
                let n = block.min(len - at);
                let piece = &mut buf[at as usize..(at + n) as usize];
                piece.fill(0);
                match read_full_at(src, piece, off + at, scratch) {
                    Ok(k) if k as u64 == n => {}
                    Ok(k) => {
                        piece[k..].fill(0);
                        note(off + at + k as u64, n - k as u64, SHRANK.into());
                    }
                    Err(e) => {
                        piece.fill(0);
                        note(off + at, n, e.to_string());
                    }
                }
                at += n;
            }
        }
    }
    ReadOut {
        buf: out,
        start,
        bad,
    }
}

/// Makes `out[start..start + len]` a window that starts 4 KiB-aligned in memory (so
/// that direct reads land in it without a copy) and returns `start`. What `out`
/// held is kept, not zeroed: the reader overwrites the whole window.
fn aligned_window(out: &mut Vec<u8>, len: usize) -> usize {
    let a = DIRECT_ALIGN as usize;
    // Room first: growing moves the buffer, and with it the aligned place.
    out.reserve((len + a).saturating_sub(out.len()));
    let start = out.as_ptr().align_offset(a) % a;
    out.resize(start + len, 0);
    start
}

/// The unreadable ranges (read now, and taken from the parent) and size change,
/// for the report.
pub(crate) fn skipped_for(plan: &ImagePlan, notes: &[Note]) -> Vec<Skipped> {
    let path = &plan.path;
    let size_change = notes.iter().filter_map(|n| match n {
        Note::SizeChanged { now } => Some(Skipped {
            path: path.clone(),
            message: format!("the source changed size during the backup (now {now} bytes)"),
        }),
        Note::Unreadable { .. } | Note::Holes { .. } => None,
    });
    let read_now = crate::ops::image::merge_ranges(notes.iter().filter_map(|n| match n {
        Note::Unreadable { offset, length } => Some((*offset, *length)),
        Note::SizeChanged { .. } | Note::Holes { .. } => None,
    }));
    let failed = read_now.into_iter().map(|(offset, length)| Skipped {
        path: path.clone(),
        message: format!(
            "bytes {offset}..{} could not be read; saved as zeros",
            offset + length
        ),
    });
    let inherited = plan
        .inherited_unreadable()
        .into_iter()
        .map(|(offset, length)| Skipped {
            path: path.clone(),
            message: inherited_message(offset, length),
        });
    failed.chain(inherited).chain(size_change).collect()
}

fn inherited_message(offset: u64, length: u64) -> String {
    format!(
        "bytes {offset}..{} could not be read for the parent snapshot and are outside \
         the changed-block list: they hold the parent's zeros (back up without \
         --changed-blocks to read them again)",
        offset + length
    )
}

/// The last image snapshot this machine wrote of each source, per repository:
/// `image-last/<repository id>` under [`Repository::local_base`], one line per
/// source (`<hash of host and paths> <snapshot id>`). A changed-block list holds
/// the changes since the last backup read the source; when that snapshot was
/// forgotten, the parent found is an older one and the list does not cover what
/// changed between the two (QA: the image was silently wrong), so [`plan`] sets
/// the list aside and reads the source whole, as Proxmox Backup Server does
/// when its dirty bitmap does not match the last backup. Without a record (a
/// new cache directory) the parent found is trusted, as before there was one.
///
/// [`Repository::local_base`]: crate::repo::Repository::local_base
mod last_written {
    use cairn_format::id::SnapshotId;
    use cairn_format::snapshot::Snapshot;
    use std::collections::BTreeMap;
    use std::path::PathBuf;

    /// A record file larger than this is not ours (a line per source is 98 bytes).
    const MAX_FILE: u64 = 16 << 20;

    fn file(repo: &crate::repo::Repository) -> Option<PathBuf> {
        Some(
            repo.local_base()?
                .join("image-last")
                .join(&repo.config().id),
        )
    }

    fn key(host: &str, paths: &[String]) -> String {
        let mut h = blake3::Hasher::new();
        h.update(host.as_bytes());
        for p in paths {
            h.update(b"\0");
            h.update(p.as_bytes());
        }
        h.finalize().to_hex()[..32].to_string()
    }

    /// The records; lines that do not parse are dropped (the file is a cache).
    fn read(file: &std::path::Path) -> BTreeMap<String, SnapshotId> {
        let fits = std::fs::metadata(file).is_ok_and(|m| m.len() <= MAX_FILE);
        let text = if fits {
            std::fs::read_to_string(file).unwrap_or_default()
        } else {
            String::new()
        };
        text.lines()
            .filter_map(|l| {
                let (k, id) = l.split_once(' ')?;
                (k.len() == 32).then_some(())?;
                Some((k.to_string(), SnapshotId::from_hex(id).ok()?))
            })
            .collect()
    }

    /// The last image snapshot of `host` and `paths` recorded here.
    pub(super) fn get(
        repo: &crate::repo::Repository,
        host: &str,
        paths: &[String],
    ) -> Option<SnapshotId> {
        read(&file(repo)?).remove(&key(host, paths))
    }

    /// Records `id` as the last image snapshot of its source: written to a new
    /// name and renamed, so that a reader sees the old records or the new ones.
    pub(crate) fn record(
        repo: &crate::repo::Repository,
        snap: &Snapshot,
        id: &SnapshotId,
    ) -> std::io::Result<()> {
        let Some(file) = file(repo) else {
            return Ok(());
        };
        if let Some(dir) = file.parent() {
            cairn_backend::private_dir(dir, true)?;
        }
        let mut records = read(&file);
        records.insert(key(&snap.hostname, &snap.paths), *id);
        let text: String = records
            .iter()
            .map(|(k, id)| format!("{k} {}\n", id.to_hex()))
            .collect();
        cairn_backend::replace_private_file(&file, text.as_bytes(), false)
    }
}

pub(crate) use last_written::record as record_last_written;

/// Opens the source and decides the geometry, the parent image and the changed
/// ranges.
pub(crate) fn plan(
    repo: &crate::repo::Repository,
    opts: crate::ops::image::ImageOptions,
    parent: Option<(&SnapshotId, &cairn_format::snapshot::Snapshot)>,
    parent_named: bool,
) -> Result<ImagePlan> {
    let parent_id = parent.map(|(id, _)| *id);
    let parent = parent.map(|(_, s)| s);
    use std::os::unix::fs::{FileTypeExt, MetadataExt};
    let path = super::absolute(&opts.source)?;
    let refuse = |m: &std::fs::Metadata| {
        if m.is_file() || m.file_type().is_block_device() {
            return Ok(());
        }
        Err(Error::Invalid(format!(
            "{}: --image takes a file or a block device",
            path.display()
        )))
    };
    // Looked at before it is opened too: opening a FIFO waits for a writer.
    refuse(&std::fs::metadata(&path).map_err(|e| Error::io(&path, e))?)?;
    let file = File::open(&path).map_err(|e| Error::io(&path, e))?;
    let meta = file.metadata().map_err(|e| Error::io(&path, e))?;
    refuse(&meta)?;
    // /proc and /sys files say they are empty (or a page) whatever they hold:
    // their size is not their content, and the image would be silently wrong.
    if let Ok(fs) = nix::sys::statfs::fstatfs(&file) {
        let t = fs.filesystem_type();
        if t == nix::sys::statfs::PROC_SUPER_MAGIC || t == nix::sys::statfs::SYSFS_MAGIC {
            return Err(Error::Invalid(format!(
                "{}: a file of /proc or /sys, whose size is not its content: --image takes \
                 a file or a block device",
                path.display()
            )));
        }
    }
    let size = source_size(&file).map_err(|e| Error::io(&path, e))?;
    // Nothing to keep, and most likely not what was meant: a device with nothing
    // attached (an idle NBD or loop device) says it holds 0 bytes.
    if size == 0 {
        return Err(Error::Invalid(format!(
            "{}: the source holds 0 bytes (a device with nothing attached?): no image \
             to back up",
            path.display()
        )));
    }
    let name = match &opts.name {
        Some(n) => n.clone(),
        None => path
            .file_name()
            .map(|n| n.to_string_lossy().into_owned())
            .unwrap_or_else(|| "image".into()),
    };
    if name.is_empty() || name.contains('/') || name == "." || name == ".." {
        return Err(Error::BadArgument(format!(
            "invalid image name {name:?} (--name takes a file name: no /, not . or ..)"
        )));
    }
    let mut names = super::source::NameCache::default();
    let (mut node, _) =
        super::source::node_from_metadata(name.into_bytes(), &path, &meta, &mut names);
    node.kind = NodeKind::File;
    node.mode = libc::S_IFREG | (node.mode & 0o7777);
    node.rdev = 0;
    node.size = size;
    node.xattrs.clear();
    // The image's own read moves its access time (relatime), so the next
    // snapshot's node would differ for nothing, and `--skip-if-unchanged` saved
    // a snapshot of an unchanged image (QA). An image's atime says nothing.
    node.atime = node.mtime;
    // A block device node's times do not move when its disk is written (through
    // a mounted filesystem, a VM), so as the image's times they said Monday's
    // disk and Tuesday's were the same file: `rsync -a` from a mount or an
    // export skipped the new one (QA r37). The image of a device is given the
    // time it was read, and keeps its parent's times while its content is the
    // parent's (see `ImageStart::unchanged_times`), as a file's mtime moves
    // only when it is written.
    let device = meta.file_type().is_block_device();
    if device {
        let now = crate::time::now_timestamp();
        (node.mtime, node.atime, node.ctime) = (now, now, now);
    }
    let mut unchanged_times = None;
    let block_size = repo.config().chunker.avg_size;
    let geometry = Geometry::new(size, block_size, crate::tree::fixed::fanout_for(block_size))?;

    // The parent's image, when it has this geometry's block size and fanout (a
    // repository's block size never changes; a parent of another cairn might).
    let mut parent_unreadable = Vec::new();
    let mut notes = Vec::new();
    if meta.file_type().is_block_device()
        && let Some(at) = mounted_read_write(meta.rdev())
    {
        notes.push(format!(
            "the device is mounted read-write at {at}: what is written there while it is \
             read makes the image inconsistent; back up a snapshot of it (LVM, ZFS) or \
             unmount it (or remount it read-only) first"
        ));
    }
    // A file behind a loop device mounted read-write is that disk (QA: warned of
    // for the device, not for its file).
    if meta.file_type().is_file() {
        for dev in crate::ops::image::restore::loop_devices_backed_by(&meta) {
            if let Ok(m) = std::fs::metadata(&dev)
                && let Some(at) = mounted_read_write(m.rdev())
            {
                notes.push(format!(
                    "it is the backing file of {dev}, mounted read-write at {at}: what is \
                     written there while it is read makes the image inconsistent; unmount \
                     it (or remount it read-only) first"
                ));
            }
        }
    }
    let source_file = meta.file_type().is_file().then(|| [meta.dev(), meta.ino()]);
    // Said only when the list is used (QA: a word about the list, then that it
    // was not used).
    let mut list_notes = Vec::new();
    let parent_snap = parent;
    let mut parent_file = None;
    // A snapshot of files is no image's parent: recorded as one, it would say
    // "changed since the parent" of every block (QA: accepted without a word).
    if parent_named && parent_snap.is_some_and(|s| s.image.is_none()) {
        return Err(Error::Invalid(
            "--parent names a snapshot of files: an image backup's parent must be an \
             image snapshot (`cairn snapshots` shows them as images)"
                .into(),
        ));
    }
    let parent = match parent.and_then(|s| s.image.as_ref().map(|i| (s, i))) {
        Some((snap, info))
            if info.block_size == block_size && u64::from(info.fanout) == geometry.fanout =>
        {
            let (info, pnode) = crate::ops::image::image_node(repo, snap)?;
            // One path may carry several disks in turn (an NBD device, a staging
            // file): the parent found by path must be of this image, or the list
            // would patch another disk's blocks.
            if opts.changed_blocks.is_some() && !parent_named && pnode.name != node.name {
                return Err(Error::Invalid(format!(
                    "the last image snapshot of {} on this host is of the image {:?}, not \
                     {:?}: a changed-block list of this image needs its own parent (name it \
                     with --parent ID, or back up without --changed-blocks)",
                    path.display(),
                    String::from_utf8_lossy(&pnode.name),
                    String::from_utf8_lossy(&node.name),
                )));
            }
            parent_unreadable.clone_from(&info.unreadable);
            if device {
                unchanged_times = Some([pnode.mtime, pnode.atime, pnode.ctime]);
            }
            // A changed-block list describes changes since the parent's source was
            // read: another device, or another size, is worth a word (an LVM
            // snapshot's name may change every day, so it is not refused).
            let here = path.to_string_lossy();
            // Another path *and* another size is another disk: its list would
            // patch this one's blocks into that one's image (QA).
            // Named with --parent too: a volume that was grown and renamed costs
            // one full read, as a grown disk does in Proxmox Backup Server.
            if opts.changed_blocks.is_some() && info.source != here && info.size != size {
                let what = if parent_named {
                    "the parent named with --parent"
                } else {
                    "the parent image snapshot"
                };
                let instead = if parent_named {
                    "back up without --changed-blocks once (a full read; after that, this \
                     snapshot is the parent its lists apply to)"
                } else {
                    "name this disk's own parent with --parent ID, or back up without \
                     --changed-blocks (a full read)"
                };
                return Err(Error::Invalid(format!(
                    "{what} was read from {} ({} bytes), this source is {here} ({size} \
                     bytes): another path and another size look like another disk, so a \
                     changed-block list is not applied to it; {instead}",
                    info.source, info.size
                )));
            }
            if opts.changed_blocks.is_some() && (info.source != here || info.size != size) {
                let was = if info.source == here {
                    format!(
                        "the source was {} bytes when the parent image snapshot was read \
                         and is {size} bytes now",
                        info.size
                    )
                } else {
                    format!(
                        "the parent image snapshot was read from {} ({} bytes), this source \
                         is {here} ({size} bytes)",
                        info.source, info.size
                    )
                };
                list_notes.push(format!(
                    "{was}: the changed-block list must describe the changes since that \
                     snapshot, or the new one will hold the parent's blocks where this source \
                     differs"
                ));
            }
            // At the same path only: at another, the warnings above say it is
            // another source (an LVM snapshot's new name, a parent named).
            if info.source == here {
                parent_file = info.source_file;
            }
            Some((
                Geometry::new(info.size, info.block_size, info.fanout)?,
                pnode.content,
            ))
        }
        _ => None,
    };
    let changed = match &opts.changed_blocks {
        Some((list, format)) => {
            if parent.is_none() {
                return Err(Error::Invalid(
                    "--changed-blocks needs a parent image snapshot of this source (same host and path, or --parent): run a backup without it first".into(),
                ));
            }
            let listed = ChangedRanges::load(list, *format, size)?;
            // The list is of the changes since the last image snapshot this
            // machine wrote of the source; a parent found that is not that one
            // (it was forgotten) would take the list's changes onto an older
            // image and miss those in between. One that `tag`, `rewrite` or
            // `repair snapshots` made of it is that one (QA: a tag forced a full
            // read); what a repair lost in it is read again below.
            if !parent_named
                && let (Some(pid), Some(snap)) = (parent_id, parent_snap)
                && let Some(last) = last_written::get(repo, &snap.hostname, &snap.paths)
                && last != pid
                && snap.original.as_deref() != Some(last.to_hex().as_str())
            {
                notes.push(format!(
                    "the changed-block list was not used and the whole source was read: \
                     it holds the changes since snapshot {}, the last image snapshot \
                     written here of this source, and that is not the parent found ({}; \
                     was {} forgotten?)",
                    last.short(),
                    pid.short(),
                    last.short()
                ));
                None
            } else if let (Some(was), Some(now)) = (parent_file, source_file)
                && was != now
            {
                notes.push(format!(
                    "the changed-block list was not used and the whole source was read: \
                     {} is not the file the parent image snapshot was read from (another \
                     inode: replaced, or an image restored onto it, since), so the list \
                     does not describe its changes",
                    path.display()
                ));
                None
            } else {
                notes.append(&mut list_notes);
                Some(listed)
            }
        }
        None => None,
    };
    let changed = match (changed, &opts.changed_blocks) {
        (Some(listed), Some((list, _))) => {
            // Nothing changed is possible, but so is a tool that failed and left
            // an empty file (`qemu-img map > list`): the snapshot is then the
            // parent's image again, which is worth a word.
            if listed.ranges().is_empty() {
                let reread: u64 = parent_unreadable
                    .iter()
                    .filter(|&&(off, _)| off < size)
                    .map(|&(off, len)| len.min(size - off))
                    .sum();
                notes.push(format!(
                    "the changed-block list {} names no change: the snapshot holds the \
                     parent's image{} (and what grew past its end); if the tool that wrote \
                     the list failed, back up without --changed-blocks",
                    list.display(),
                    if reread > 0 {
                        format!(
                            ", but for the {} the parent could not read, read again",
                            crate::units::bytes(reread, 2)
                        )
                    } else {
                        String::new()
                    }
                ));
            }
            // What the parent holds as zeros for want of data (its source could
            // not read it, or a repair lost it) is read again, not taken over: the
            // source may give it now.
            let again: Vec<(u64, u64)> = listed
                .ranges()
                .iter()
                .map(|&(start, end)| (start, end - start))
                .chain(
                    parent_unreadable
                        .iter()
                        .filter(|&&(off, _)| off < size)
                        .map(|&(off, len)| (off, len.min(size - off))),
                )
                .collect();
            Some(ChangedRanges::from_ranges(again, size).map_err(Error::Invalid)?)
        }
        _ => None,
    };
    let direct = crate::ops::image::reopen_direct(&file, false);
    let device_writes = device_writes(&file);
    Ok(ImagePlan {
        unchanged_times,
        device_writes,
        source_file,
        file,
        direct,
        path,
        node,
        geometry,
        parent,
        parent_unreadable,
        notes,
        changed,
    })
}

/// The snapshot's image member.
pub(crate) fn info(
    plan: &ImagePlan,
    counts: super::archiver::ImageCounts,
) -> cairn_format::snapshot::ImageInfo {
    let g = plan.geometry;
    let mut unreadable = plan.inherited_unreadable();
    let mut size_at_end = None;
    for n in &counts.notes {
        match n {
            Note::Unreadable { offset, length } => unreadable.push((*offset, *length)),
            Note::SizeChanged { now } => size_at_end = Some(*now),
            // The archiver counts them apart (`ImageCounts::hole_bytes`).
            Note::Holes { .. } => {}
        }
    }
    let unreadable = crate::ops::image::merge_ranges(unreadable.into_iter());
    cairn_format::snapshot::ImageInfo {
        source: plan.path.to_string_lossy().into_owned(),
        size: g.size,
        block_size: g.block_size as u32,
        fanout: g.fanout as u32,
        blocks: g.blocks(),
        blocks_read: counts.blocks_read,
        blocks_changed: counts.blocks_changed,
        blocks_zero: counts.blocks_zero,
        changed_blocks_input: plan.changed.is_some(),
        unreadable,
        size_at_end,
        bytes_in_holes: counts.hole_bytes,
        blocks_in_holes: counts.hole_blocks,
        source_file: plan.source_file,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::Write;

    /// A sparse file: data in a few places (one across a read's boundary, one
    /// ending mid-block), holes elsewhere, an unaligned end.
    fn sparse_file(dir: &std::path::Path, pieces: &[(u64, usize)], size: u64) -> (File, Vec<u8>) {
        let path = dir.join("sparse.img");
        let mut f = File::create(&path).unwrap();
        f.set_len(size).unwrap();
        let mut want = vec![0u8; size as usize];
        for (i, &(at, len)) in pieces.iter().enumerate() {
            let bytes: Vec<u8> = (0..len).map(|k| (k * 7 + i * 13 + 1) as u8 | 1).collect();
            f.write_all_at(&bytes, at).unwrap();
            want[at as usize..at as usize + len].copy_from_slice(&bytes);
        }
        f.flush().unwrap();
        (File::open(&path).unwrap(), want)
    }

    #[test]
    fn holes_are_skipped_and_every_byte_reads_as_the_file_holds_it() {
        let dir = tempfile::tempdir().unwrap();
        let size = (10 << 20) + 777;
        let pieces = [
            (0, 5000),
            ((1 << 20) + 4096, 70_000),
            ((4 << 20) - 3000, 6000),
            (size - 777, 777),
        ];
        let (file, want) = sparse_file(dir.path(), &pieces, size);
        let segs = data_segments(&file, 0, size).expect("ext4 and tmpfs answer SEEK_DATA");
        assert_eq!(segs.1, size);
        // Every piece of data lies in a segment, and most of the file is holes
        // (where the filesystem keeps them).
        for &(at, len) in &pieces {
            assert!(
                segs.0.iter().any(|&(s, e)| s <= at && at + len as u64 <= e),
                "{at}+{len} not in {:?}",
                segs.0
            );
        }
        let direct = crate::ops::image::reopen_direct(&file, false);
        for direct in [direct.as_ref(), None] {
            let src = Source {
                file: &file,
                direct,
                sparse: true,
                holes: AtomicU64::new(0),
                hole_blocks: AtomicU64::new(0),
                block_size: 4096,
                limit: None,
            };
            let mut scratch = AlignedBuf::default();
            // Reads of 4 MiB and of odd sizes at odd places, as the readers and the
            // block-by-block retry do; the last one runs past the end.
            // Buffers with room to start aligned (as the readers take them from
            // the pool: direct reads land in them) and without (through `scratch`).
            // Fresh buffers, and kept ones full of other bytes (the pool hands
            // them back as they were): holes must read as zeros either way.
            for (room, kept) in [(DIRECT_ALIGN as usize, false), (0, false), (0, true)] {
                let mut got = Vec::new();
                for (off, len) in [(0, 4 << 20), (4 << 20, 4 << 20), (8 << 20, 3 << 20)] {
                    let buf = if kept {
                        vec![0xa5; len as usize + 3 * DIRECT_ALIGN as usize]
                    } else {
                        Vec::with_capacity(len as usize + room)
                    };
                    let out = read_range(&src, off, len, 16384, buf, &mut scratch);
                    let data = &out.buf[out.start..];
                    assert_eq!(data.len(), len as usize);
                    if room > 0 || kept {
                        assert_eq!(data.as_ptr().align_offset(DIRECT_ALIGN as usize), 0);
                    }
                    let avail = (size - off).min(len) as usize;
                    got.extend_from_slice(&data[..avail]);
                    assert!(data[avail..].iter().all(|&b| b == 0), "past the end: zeros");
                    assert_eq!(out.bad.len(), usize::from(avail < len as usize));
                }
                assert!(
                    got == want,
                    "direct: {}, room {room}, kept {kept}",
                    direct.is_some()
                );
            }
            // A piece in and around a hole, into a buffer of other bytes.
            let mut piece = vec![0xa5u8; 10_000];
            let n = read_full_at(&src, &mut piece, (1 << 20) + 100, &mut scratch).unwrap();
            assert_eq!(n, piece.len());
            let at = (1 << 20) + 100;
            assert!(piece[..] == want[at..at + 10_000]);
        }
    }

    #[test]
    fn a_file_that_ends_in_a_hole_reads_to_its_end() {
        let dir = tempfile::tempdir().unwrap();
        let size = 6 << 20;
        let (file, want) = sparse_file(dir.path(), &[(100, 100)], size);
        let src = Source {
            file: &file,
            direct: None,
            sparse: true,
            holes: AtomicU64::new(0),
            hole_blocks: AtomicU64::new(0),
            block_size: 4096,
            limit: None,
        };
        let out = read_range(
            &src,
            4 << 20,
            4 << 20,
            16384,
            vec![0xa5; 5 << 20],
            &mut AlignedBuf::default(),
        );
        assert!(out.buf[out.start..].iter().all(|&b| b == 0));
        assert_eq!(out.bad.len(), 1, "the 2 MiB past the end are reported");
        let out = read_range(
            &src,
            0,
            4 << 20,
            16384,
            Vec::new(),
            &mut AlignedBuf::default(),
        );
        assert!(out.buf[out.start..] == want[..4 << 20] && out.bad.is_empty());
    }
}
