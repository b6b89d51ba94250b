//! Exporting part of a snapshot as an archive stream: for tape, for another tool,
//! for a browser download. The archive is written as the tree is walked, one file at
//! a time, so memory does not grow with the size of what is exported (a file's
//! chunk ids are its only per-file state: 32 bytes per chunk; a zip's central
//! directory, written at the end, holds one record per entry). A file's blobs are
//! read several at a time, ahead of the writer.
//!
//! A tar archive is in GNU tar's format, which GNU tar, bsdtar and Python's
//! tarfile read: ustar headers, GNU long-name records for names and link targets
//! past 100 bytes, GNU base-256 numbers for owners, sizes and times that do not
//! fit the octal fields, GNU sparse 1.0 for sparse files, and pax records for
//! modification times with nanoseconds, owner names past 31 bytes, extended
//! attributes as `SCHILY.xattr.*` (what GNU tar and bsdtar read), and POSIX ACLs
//! also as GNU tar's `SCHILY.acl.access`/`.default` (what `tar --acls` reads). Hard links
//! within the export become tar hard links. A zip archive (for systems without tar)
//! carries names, permission bits, symlinks and modification times to the zip
//! format's 2 seconds (in local time; exact in an extra field); owners, xattrs, FIFOs and devices have no place in it
//! (counted in the report), and a hard link is stored as another copy. Content is
//! deflated; files past 4 GiB use zip64.
//!
//! A file whose content cannot be read completely stops the export with an error:
//! an entry's size is written before (tar) or checked after (zip) its bytes, so a
//! short file cannot be left in the archive silently.

use crate::error::{Error, Result};
use crate::ops::ls::find_node;
use crate::repo::Repository;
use crate::session::{Access, Session};
use crate::tree::chunklist::{FileReader, Piece};
use crate::tree::walk::Visitor;
use cairn_format::BlobId;
use cairn_format::tree::{ChunkRef, Node, NodeKind, Tree};
use std::collections::HashMap;
use std::io::{Read, Write};
use std::os::unix::ffi::OsStrExt;

/// The name an error writing the archive gives as its path: the engine does not
/// know where the stream goes (a caller that does names it instead).
pub const ARCHIVE: &str = "the archive";

/// What an export wrote.
#[derive(Clone, Debug, Default, serde::Serialize)]
pub struct ExportReport {
    pub files: u64,
    pub dirs: u64,
    pub other_entries: u64,
    /// File content bytes (not counting tar headers).
    pub bytes: u64,
    /// Directories whose tree could not be read (left out, with why).
    pub errors: Vec<ExportError>,
    /// Files in the archive with chunks that could not be read written as zeros.
    pub damaged: Vec<DamagedFile>,
    /// Entries the format cannot carry as they are (zip: FIFOs, devices, sockets,
    /// names that are not UTF-8), with what was done instead.
    pub notes: Vec<String>,
}

impl ExportReport {
    /// Whether the archive holds everything the snapshot does as it is: no
    /// directory left out, no zeros for content that could not be read
    /// (`notes`, what a format cannot carry, are its documented limits).
    pub fn is_whole(&self) -> bool {
        self.errors.is_empty() && self.damaged.is_empty()
    }
}

/// A directory left out of an archive: its tree could not be read.
#[derive(Clone, Debug, Default, serde::Serialize)]
pub struct ExportError {
    pub path: String,
    pub error: String,
}

/// A file in an archive with zeros where its content could not be read.
#[derive(Clone, Debug, Default, serde::Serialize)]
pub struct DamagedFile {
    pub path: String,
    /// The bytes written as zeros.
    pub zeroed_bytes: u64,
    /// Why the first of them could not be read.
    pub error: String,
}

/// The archive formats `export` writes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Format {
    Tar,
    Zip,
}

impl std::str::FromStr for Format {
    type Err = Error;
    fn from_str(s: &str) -> Result<Format> {
        match s {
            "tar" => Ok(Format::Tar),
            "zip" => Ok(Format::Zip),
            _ => Err(Error::Invalid(format!(
                "archive format {s:?}: expected tar or zip"
            ))),
        }
    }
}

/// Writes the entry at `path` and everything below it as an archive of `format`
/// (see [`export_tar`]).
pub fn export<A: Access>(
    session: &Session<A>,
    root: &BlobId,
    path: &str,
    format: Format,
    out: &mut dyn Write,
) -> Result<ExportReport> {
    export_as(session, root, path, format, out, false)
}

/// [`export`] that stops with an error at the first file it cannot read in full
/// or directory it cannot read, for a reader that cannot be told afterwards (a
/// browser's download): an archive finished with zeros in place of lost data
/// passed every check (QA: `unzip` and its CRCs said nothing). The archive is
/// then left cut short (a zip without its central directory, a tar without its
/// end-of-archive blocks, as after any failed export); the caller must not
/// finish what wraps it either (the server's zstd frame).
pub fn export_complete<A: Access>(
    session: &Session<A>,
    root: &BlobId,
    path: &str,
    format: Format,
    out: &mut dyn Write,
) -> Result<ExportReport> {
    export_as(session, root, path, format, out, true)
}

fn export_as<A: Access>(
    session: &Session<A>,
    root: &BlobId,
    path: &str,
    format: Format,
    out: &mut dyn Write,
    complete_only: bool,
) -> Result<ExportReport> {
    // Found before the archive starts: a tar writer ends its archive when
    // dropped, and an empty but valid archive after a mistyped path let a
    // pipeline (`| tar x`, a tape job) succeed (QA).
    let start = find_node(session.repo(), root, path)?;
    match format {
        Format::Tar => run(
            session,
            root,
            (path, start),
            TarSink::new(out),
            complete_only,
        ),
        Format::Zip => run(
            session,
            root,
            (path, start),
            ZipSink::new(out),
            complete_only,
        ),
    }
}

/// Writes the entry at `path` of the snapshot whose root tree is `root` and
/// everything below it as a tar stream to `out`. Names in the archive are
/// relative to `path`'s parent (exporting `/home/a` gives `a/...`; the root gives
/// the snapshot's top-level entries). Unreadable directories are left out and
/// listed in the report; unreadable file content is an error.
pub fn export_tar<A: Access>(
    session: &Session<A>,
    root: &BlobId,
    path: &str,
    out: &mut dyn Write,
) -> Result<ExportReport> {
    export_as(session, root, path, Format::Tar, out, false)
}

fn run<A: Access, S: Sink>(
    session: &Session<A>,
    root: &BlobId,
    path: (&str, Option<Node>),
    sink: S,
    complete_only: bool,
) -> Result<ExportReport> {
    let repo = session.repo();
    std::thread::scope(|s| {
        let readers = BlobReaders::start(s, repo);
        let r = run_with(repo, root, path, sink, &readers, complete_only);
        drop(readers);
        r
    })
}

/// `path`: where the export starts, and its node (None: the root).
fn run_with<S: Sink>(
    repo: &Repository,
    root: &BlobId,
    (path, start): (&str, Option<Node>),
    sink: S,
    readers: &BlobReaders,
    complete_only: bool,
) -> Result<ExportReport> {
    let base = crate::ops::ls::walk_path(path);
    let mut ex = Exporter {
        repo,
        readers,
        sink,
        dirs: Vec::new(),
        links: HashMap::new(),
        report: ExportReport::default(),
        ahead: Ahead::default(),
        dir_serial: 0,
        complete_only,
    };
    let tree_id = match &start {
        None => *root,
        Some(n) => {
            // `/home/a` is archived as `a`.
            ex.write_node(n.name.clone(), n)?;
            match n.subtree {
                Some(s) => s,
                None => return ex.finish(),
            }
        }
    };
    crate::tree::walk::walk_from(repo, &tree_id, &base, start, &mut ex)?;
    ex.finish()
}

/// Where entries go: one archive format.
trait Sink {
    /// A directory, symlink, FIFO or device (`n.kind` says which); returns a note
    /// when the format cannot carry it (it is then left out).
    fn entry(&mut self, name: &[u8], n: &Node) -> Result<Option<String>>;
    /// A regular file with its content; or, with `first`, another name of a file
    /// written before.
    fn file(
        &mut self,
        name: &[u8],
        n: &Node,
        first: Option<&[u8]>,
        content: &mut Content<'_>,
    ) -> Result<()>;
    /// Another name of a symlink, FIFO or device written before as `first`; false
    /// when the format has no hard links (the entry is then written again).
    fn link(&mut self, name: &[u8], n: &Node, first: &[u8]) -> Result<bool>;
    fn finish(&mut self) -> Result<()>;
    /// What the archive could not keep exactly of the entries written since last
    /// asked (a name or a time the format cannot hold), for the report.
    fn take_notes(&mut self) -> Vec<String> {
        Vec::new()
    }
}

struct Exporter<'a, S: Sink> {
    repo: &'a Repository,
    readers: &'a BlobReaders,
    sink: S,
    /// The archive names (bytes: Unix names need not be UTF-8) of the directories
    /// being walked, innermost last.
    dirs: Vec<Vec<u8>>,
    /// (device, inode) of files with more than one link, and their first name.
    links: HashMap<(u64, u64), Vec<u8>>,
    report: ExportReport,
    /// Small files' blobs asked for before the writer gets to them.
    ahead: Ahead,
    /// Numbers the directories entered (see [`FileTag`]).
    dir_serial: u64,
    /// Stop at the first loss ([`export_complete`]).
    complete_only: bool,
}

fn io(e: std::io::Error) -> Error {
    Error::io(ARCHIVE, e)
}

impl<S: Sink> Exporter<'_, S> {
    fn finish(mut self) -> Result<ExportReport> {
        self.sink.finish()?;
        Ok(self.report)
    }

    /// The archive name of entry `n` of the innermost directory being walked.
    fn name_in_dir(&self, n: &Node) -> Vec<u8> {
        match self.dirs.last() {
            Some(d) if !d.is_empty() => [d.as_slice(), b"/", &n.name].concat(),
            _ => n.name.clone(),
        }
    }

    fn write_node(&mut self, name: Vec<u8>, n: &Node) -> Result<()> {
        match n.kind {
            NodeKind::File => {
                let first = if n.nlink > 1 {
                    let first = self.links.get(&(n.dev, n.inode)).cloned();
                    if first.is_none() {
                        self.links.insert((n.dev, n.inode), name.clone());
                    }
                    first
                } else {
                    None
                };
                let shown = String::from_utf8_lossy(&name).into_owned();
                // Readable for another name too: a format without hard links (zip)
                // stores the content again.
                let mut content = Content::new(self.repo, n, &shown, self.readers);
                content.ahead = Some(&mut self.ahead);
                // A damaged or missing chunk is written as zeros and the file
                // reported, as a restore does; a file that cannot be read otherwise
                // (the storage fails) ends the archive: the message names it (not
                // only its blob), so that the admin knows what is lost.
                content.zero_damaged = true;
                let written = self
                    .sink
                    .file(&name, n, first.as_deref(), &mut content)
                    .map_err(|e| match e {
                        e @ (Error::Damaged { .. }
                        | Error::BlobNotFound(_)
                        | Error::PackMissing { .. }
                        | Error::Backend(_)) => {
                            Error::Invalid(format!("{shown}: {e}; the archive is incomplete"))
                        }
                        e => e,
                    });
                let damaged = content.damaged.take();
                self.report.notes.extend(self.sink.take_notes());
                written?;
                if let Some((bytes, why)) = damaged {
                    if self.complete_only {
                        return Err(Error::Invalid(format!(
                            "{shown} could not be read in full ({why}); the archive is \
                             incomplete"
                        )));
                    }
                    self.report.damaged.push(DamagedFile {
                        path: shown,
                        zeroed_bytes: bytes,
                        error: why,
                    });
                }
                self.report.files += 1;
                if first.is_none() {
                    self.report.bytes += n.size;
                }
            }
            // A socket cannot be archived (neither format has an entry for it; tar
            // itself skips them too, and says so).
            NodeKind::Socket => self.report.notes.push(format!(
                "{}: a socket cannot be stored in an archive (left out)",
                String::from_utf8_lossy(&name)
            )),
            // Hard links to a symlink, FIFO or device stay links, as restore keeps
            // them.
            NodeKind::Symlink | NodeKind::Fifo | NodeKind::CharDevice | NodeKind::BlockDevice
                if n.nlink > 1
                    && let Some(first) = self.links.get(&(n.dev, n.inode)).cloned()
                    && self.sink.link(&name, n, &first)? =>
            {
                self.report.other_entries += 1;
            }
            _ => match self.sink.entry(&name, n).inspect(|_| {
                let notes = self.sink.take_notes();
                self.report.notes.extend(notes);
            })? {
                Some(note) => self.report.notes.push(note),
                None if n.kind == NodeKind::Dir => self.report.dirs += 1,
                None => {
                    if n.nlink > 1 && n.kind != NodeKind::Dir {
                        self.links.entry((n.dev, n.inode)).or_insert(name);
                    }
                    self.report.other_entries += 1;
                }
            },
        }
        Ok(())
    }
}

struct TarSink<'a> {
    tar: tar::Builder<Cutoff<'a>>,
    cut: std::rc::Rc<std::cell::Cell<bool>>,
    /// Bytes written so far, and where the last entry written whole ended.
    written: std::rc::Rc<std::cell::Cell<u64>>,
    boundary: u64,
    finished: bool,
}

impl<'a> TarSink<'a> {
    fn new(out: &'a mut dyn Write) -> Self {
        let cut = std::rc::Rc::new(std::cell::Cell::new(false));
        let written = std::rc::Rc::new(std::cell::Cell::new(0));
        TarSink {
            tar: tar::Builder::new(Cutoff {
                out,
                cut: cut.clone(),
                written: Some(written.clone()),
            }),
            cut,
            written,
            boundary: 0,
            finished: false,
        }
    }

    fn mark<T>(&mut self, r: Result<T>) -> Result<T> {
        if r.is_ok() {
            self.boundary = self.written.get();
        }
        r
    }
}

/// Where a failed export's tar stream ends when it failed between entries: a
/// header that promises data which never comes.
const FAILED_MARK: &str = "CAIRN-EXPORT-FAILED-THE-ARCHIVE-IS-INCOMPLETE";

impl Drop for TarSink<'_> {
    /// An export that failed leaves its archive cut short, without the two zero
    /// blocks `tar`'s own drop would write: with them, a member whose data could
    /// not be read was followed by a proper end of archive, and `tar -x` read the
    /// file as zeros and exited 0 with the files after it missing (QA). Cut
    /// inside a member, every reader says "unexpected end of file"; cut between
    /// two (a chunk list unreadable before its file's header, Ctrl-C), GNU tar
    /// and Python's tarfile take the end for a whole archive, so a last header
    /// is written there whose data never comes (and whose name says why).
    fn drop(&mut self) {
        if self.finished {
            return;
        }
        if self.written.get() == self.boundary {
            let mut h = tar::Header::new_ustar();
            if h.set_path(FAILED_MARK).is_ok() {
                h.set_size(512);
                h.set_mode(0o600);
                h.set_entry_type(tar::EntryType::Regular);
                h.set_cksum();
                // Best effort: an output that failed is not written to again.
                let _ = self.tar.get_mut().write_all(h.as_bytes());
                let _ = self.tar.get_mut().flush();
            }
        }
        self.cut.set(true);
    }
}

impl TarSink<'_> {
    /// The header every entry starts from, and its pax records (written first).
    fn header(&mut self, n: &Node) -> Result<tar::Header> {
        self.header_with(n, Vec::new())
    }

    /// [`TarSink::header`] with more pax records (a sparse file's map keys).
    fn header_with(&mut self, n: &Node, extra: Vec<(Vec<u8>, Vec<u8>)>) -> Result<tar::Header> {
        let mut h = tar::Header::new_ustar();
        h.set_mode(n.mode & 0o7777);
        h.set_uid(u64::from(n.uid));
        h.set_gid(u64::from(n.gid));
        // Names that do not fit the header's fields go in the pax record instead.
        let _ = h.set_username(&n.user);
        let _ = h.set_groupname(&n.group);
        h.set_mtime(n.mtime.secs.max(0) as u64);
        h.set_size(0);
        let mut pax: Vec<(Vec<u8>, Vec<u8>)> = Vec::new();
        pax.push((
            b"mtime".to_vec(),
            pax_time(n.mtime.secs, n.mtime.nanos).into_bytes(),
        ));
        if n.user.len() > 31 {
            pax.push((b"uname".to_vec(), n.user.clone().into_bytes()));
        }
        if n.group.len() > 31 {
            pax.push((b"gname".to_vec(), n.group.clone().into_bytes()));
        }
        for (k, v) in &n.xattrs {
            // The name's bytes as they are (GNU tar's way; a name that is not
            // UTF-8 would otherwise come back as another name), but for `=` and
            // `%`, which GNU tar escapes: a reader takes the first `=` for the
            // end of the key (QA: `user.a=b` came back as `user.a`).
            pax.push((
                [&b"SCHILY.xattr."[..], &xattr_keyword(k)].concat(),
                v.clone(),
            ));
            // GNU tar's `--acls` reads ACLs from its own records in text form (and
            // sets them over what the xattrs gave): both go in, as GNU tar writes.
            let acl = match k.as_slice() {
                b"system.posix_acl_access" => Some("SCHILY.acl.access"),
                b"system.posix_acl_default" => Some("SCHILY.acl.default"),
                _ => None,
            };
            if let Some((key, text)) = acl.zip(cairn_format::tree::acl_text(v)) {
                pax.push((key.as_bytes().to_vec(), text.into_bytes()));
            }
        }
        pax.extend(extra);
        let data = pax_records(&pax);
        let mut x = tar::Header::new_ustar();
        x.set_size(data.len() as u64);
        x.set_entry_type(tar::EntryType::XHeader);
        x.set_cksum();
        self.tar.append(&x, data.as_slice()).map_err(io)?;
        Ok(h)
    }
}

/// A pax time: seconds and a fraction, the sign on the whole (`-1.75`: 1.75 s
/// before the epoch, held as -2 s + 0.25 s).
fn pax_time(secs: i64, nanos: u32) -> String {
    if secs < 0 && nanos > 0 {
        format!("-{}.{:09}", -(secs + 1), 1_000_000_000 - nanos)
    } else {
        format!("{secs}.{nanos:09}")
    }
}

/// pax extended header records, `"<length> <key>=<value>\n"` each, the length
/// counting its own digits; keys as bytes (an xattr name need not be UTF-8).
/// An attribute's name as GNU tar writes it in a `SCHILY.xattr.` keyword: `%` as
/// `%25` and `=` as `%3D` (what its `xattr_decode_keyword` undoes).
fn xattr_keyword(name: &[u8]) -> Vec<u8> {
    let mut out = Vec::with_capacity(name.len());
    for &b in name {
        match b {
            b'%' => out.extend_from_slice(b"%25"),
            b'=' => out.extend_from_slice(b"%3D"),
            b => out.push(b),
        }
    }
    out
}

fn pax_records(records: &[(Vec<u8>, Vec<u8>)]) -> Vec<u8> {
    let mut data = Vec::new();
    for (key, value) in records {
        let rest = 3 + key.len() + value.len();
        let mut digits = 1;
        while rest + digits >= 10usize.pow(digits as u32) {
            digits += 1;
        }
        data.extend_from_slice((rest + digits).to_string().as_bytes());
        data.push(b' ');
        data.extend_from_slice(key);
        data.push(b'=');
        data.extend_from_slice(value);
        data.push(b'\n');
    }
    data
}

fn os_path(name: &[u8]) -> &std::path::Path {
    std::path::Path::new(std::ffi::OsStr::from_bytes(name))
}

impl TarSink<'_> {
    fn write_link(&mut self, name: &[u8], n: &Node, first: &[u8]) -> Result<bool> {
        let mut h = self.header(n)?;
        h.set_entry_type(tar::EntryType::Link);
        self.tar
            .append_link(&mut h, os_path(name), os_path(first))
            .map_err(io)?;
        Ok(true)
    }

    fn write_entry(&mut self, name: &[u8], n: &Node) -> Result<Option<String>> {
        let mut h = self.header(n)?;
        let path = os_path(name);
        match n.kind {
            NodeKind::Dir => {
                h.set_entry_type(tar::EntryType::Directory);
                self.tar
                    .append_data(&mut h, path, std::io::empty())
                    .map_err(io)?;
            }
            NodeKind::Symlink => {
                h.set_entry_type(tar::EntryType::Symlink);
                let target = std::ffi::OsStr::from_bytes(&n.link_target);
                self.tar.append_link(&mut h, path, target).map_err(io)?;
            }
            _ => {
                h.set_entry_type(match n.kind {
                    NodeKind::Fifo => tar::EntryType::Fifo,
                    NodeKind::CharDevice => tar::EntryType::Char,
                    _ => tar::EntryType::Block,
                });
                let (major, minor) = (nix::sys::stat::major(n.rdev), nix::sys::stat::minor(n.rdev));
                h.set_device_major(major as u32).map_err(io)?;
                h.set_device_minor(minor as u32).map_err(io)?;
                self.tar
                    .append_data(&mut h, path, std::io::empty())
                    .map_err(io)?;
            }
        }
        Ok(None)
    }

    fn write_file(
        &mut self,
        name: &[u8],
        n: &Node,
        first: Option<&[u8]>,
        content: &mut Content<'_>,
    ) -> Result<()> {
        let path = os_path(name);
        if let Some(first) = first {
            let mut h = self.header(n)?;
            h.set_entry_type(tar::EntryType::Link);
            return self
                .tar
                .append_link(&mut h, path, os_path(first))
                .map_err(io);
        }
        // A chunk list that cannot be read is met again below, and given as zeros.
        let segments = match data_segments(content.repo, n) {
            Err(e) if content.zero_damaged && e.is_lost_in_storage() => None,
            r => r?,
        };
        if let Some((segments, zeros)) = segments {
            // The holes are skipped, and their chunks need not even be read. Its
            // header has its own pax records (one pax header per entry: libarchive
            // takes a second for a malformed one).
            content.zeros = zeros;
            return self.sparse_file(name, n, segments, content);
        }
        // Written here: [`TarSink::header`] writes the entry's pax header.
        let mut h = self.header(n)?;
        h.set_entry_type(tar::EntryType::Regular);
        h.set_size(n.size);
        let r = self.tar.append_data(&mut h, path, &mut *content);
        if let Some(e) = content.error.take() {
            return Err(e);
        }
        r.map_err(io)
    }

    fn write_finish(&mut self) -> Result<()> {
        self.tar.finish().map_err(io)?;
        self.tar.get_mut().flush().map_err(io)?;
        self.finished = true;
        Ok(())
    }
}

/// Each entry written whole moves the mark of where the next may start (see
/// [`TarSink`]'s `Drop`).
impl Sink for TarSink<'_> {
    fn link(&mut self, name: &[u8], n: &Node, first: &[u8]) -> Result<bool> {
        let r = self.write_link(name, n, first);
        self.mark(r)
    }

    fn entry(&mut self, name: &[u8], n: &Node) -> Result<Option<String>> {
        let r = self.write_entry(name, n);
        self.mark(r)
    }

    fn file(
        &mut self,
        name: &[u8],
        n: &Node,
        first: Option<&[u8]>,
        content: &mut Content<'_>,
    ) -> Result<()> {
        let r = self.write_file(name, n, first, content);
        self.mark(r)
    }

    fn finish(&mut self) -> Result<()> {
        self.write_finish()
    }
}

impl TarSink<'_> {
    /// A file with holes as a PAX sparse entry (format 1.0, as GNU tar writes and
    /// reads it): the pax records name the file and its real size, the entry is
    /// named `GNUSparseFile.0/<name>`, and its data is the map (segment count, then
    /// offset and length of each data segment, in decimal lines, padded to 512
    /// bytes) followed by the data segments only.
    fn sparse_file(
        &mut self,
        name: &[u8],
        n: &Node,
        segments: Vec<(u64, u64)>,
        content: &mut Content<'_>,
    ) -> Result<()> {
        let mut map = format!("{}\n", segments.len());
        for (off, len) in &segments {
            map.push_str(&format!("{off}\n{len}\n"));
        }
        let mut map = map.into_bytes();
        map.resize(map.len().div_ceil(512) * 512, 0);
        let data: u64 = segments.iter().map(|s| s.1).sum();
        let extra = vec![
            (b"GNU.sparse.major".to_vec(), b"1".to_vec()),
            (b"GNU.sparse.minor".to_vec(), b"0".to_vec()),
            (b"GNU.sparse.name".to_vec(), name.to_vec()),
            (
                b"GNU.sparse.realsize".to_vec(),
                n.size.to_string().into_bytes(),
            ),
        ];
        let mut h = self.header_with(n, extra)?;
        h.set_entry_type(tar::EntryType::Regular);
        h.set_size(map.len() as u64 + data);
        let (dir, base) = match name.iter().rposition(|&b| b == b'/') {
            Some(i) => (&name[..=i], &name[i + 1..]),
            None => (&b""[..], name),
        };
        let mut stored = dir.to_vec();
        stored.extend_from_slice(b"GNUSparseFile.0/");
        stored.extend_from_slice(base);
        let mut reader = std::io::Cursor::new(map).chain(SparseData {
            content: &mut *content,
            segments,
            next: 0,
            at: 0,
        });
        let r = self.tar.append_data(&mut h, os_path(&stored), &mut reader);
        if let Some(e) = content.error.take() {
            return Err(e);
        }
        r.map_err(io)
    }
}

/// Files with less than this in holes are written whole.
const SPARSE_MIN_HOLES: u64 = 64 << 10;
/// A sparse map of more segments than this is not worth its length: written whole.
const SPARSE_MAX_SEGMENTS: usize = 65_536;

/// A file's data segments `(offset, length)` when it has holes worth a sparse
/// entry: runs of chunks of zeros, recognised by their ids (the id of that many
/// zero bytes) without reading them. The last segment ends at the file's size
/// (length 0 when the file ends in a hole, as GNU tar writes it). Segments are
/// aligned to 512-byte blocks.
/// Also returns the ids of the zero chunks met, with their lengths.
#[allow(clippy::type_complexity)]
fn data_segments(
    repo: &Repository,
    n: &Node,
) -> Result<Option<(Vec<(u64, u64)>, HashMap<BlobId, usize>)>> {
    let mut zero_ids: HashMap<u64, BlobId> = HashMap::new();
    let mut segments: Vec<(u64, u64)> = Vec::new();
    let (mut at, mut holes, mut too_many) = (0u64, 0u64, false);
    crate::tree::chunklist::for_each_chunk(repo, &n.content, &mut |c| {
        // Zero runs are cut at the chunker's maximum size, so few lengths occur;
        // past 64 of them, chunks are taken as data.
        let zero = match zero_ids.get(&c.length) {
            Some(id) => *id == c.id,
            None if zero_ids.len() < 64 && c.length <= 1 << 24 => {
                let id = repo.key().blob_id(&vec![0u8; c.length as usize]);
                zero_ids.insert(c.length, id);
                id == c.id
            }
            None => false,
        };
        if zero {
            holes += c.length;
        } else {
            match segments.last_mut() {
                Some(last) if last.0 + last.1 == at => last.1 += c.length,
                _ => segments.push((at, c.length)),
            }
            if segments.len() > SPARSE_MAX_SEGMENTS {
                too_many = true;
                return Err(Error::Interrupted);
            }
        }
        at += c.length;
        Ok(())
    })
    .or_else(|e| if too_many { Ok(()) } else { Err(e) })?;
    if too_many || holes < SPARSE_MIN_HOLES || at != n.size {
        return Ok(None);
    }
    // GNU tar reads each segment in whole 512-byte blocks: segments start and end
    // on block boundaries (the few zero bytes this adds are stored as data).
    let mut aligned: Vec<(u64, u64)> = Vec::with_capacity(segments.len() + 1);
    for (off, len) in segments {
        let start = off / 512 * 512;
        let end = (off + len).div_ceil(512).saturating_mul(512).min(n.size);
        match aligned.last_mut() {
            Some(last) if last.0 + last.1 >= start => last.1 = end - last.0,
            _ => aligned.push((start, end - start)),
        }
    }
    if aligned.last().is_none_or(|l| l.0 + l.1 < n.size) {
        aligned.push((n.size, 0));
    }
    let zeros = zero_ids
        .into_iter()
        .map(|(len, id)| (id, len as usize))
        .collect();
    Ok(Some((aligned, zeros)))
}

/// The data segments of a file's content, the holes between them skipped.
struct SparseData<'c, 'a> {
    content: &'c mut Content<'a>,
    segments: Vec<(u64, u64)>,
    next: usize,
    /// File offset of the content's next byte.
    at: u64,
}

impl Read for SparseData<'_, '_> {
    fn read(&mut self, out: &mut [u8]) -> std::io::Result<usize> {
        let mut skip = [0u8; 64 << 10];
        loop {
            let Some(&(off, len)) = self.segments.get(self.next) else {
                return Ok(0);
            };
            if self.at >= off + len {
                self.next += 1;
                continue;
            }
            if self.at < off {
                let n = ((off - self.at) as usize).min(skip.len());
                let got = self.content.read(&mut skip[..n])?;
                if got == 0 {
                    return Err(std::io::Error::other("short content"));
                }
                self.at += got as u64;
                continue;
            }
            let n = ((off + len - self.at) as usize).min(out.len());
            let got = self.content.read(&mut out[..n])?;
            self.at += got as u64;
            return Ok(got);
        }
    }
}

/// The archive's output, which can be cut off: from then on what is written is
/// thrown away, and succeeds.
struct Cutoff<'a> {
    out: &'a mut dyn Write,
    cut: std::rc::Rc<std::cell::Cell<bool>>,
    /// Counts the bytes written, where wanted.
    written: Option<std::rc::Rc<std::cell::Cell<u64>>>,
}

impl Write for Cutoff<'_> {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        if self.cut.get() {
            return Ok(buf.len());
        }
        let n = self.out.write(buf)?;
        if let Some(w) = &self.written {
            w.set(w.get() + n as u64);
        }
        Ok(n)
    }

    fn flush(&mut self) -> std::io::Result<()> {
        if self.cut.get() {
            return Ok(());
        }
        self.out.flush()
    }
}

type ZipOut<'a> = zip::ZipWriter<zip::write::StreamWriter<Cutoff<'a>>>;

struct ZipSink<'a> {
    zip: Option<ZipOut<'a>>,
    cut: std::rc::Rc<std::cell::Cell<bool>>,
    /// See [`Sink::take_notes`].
    notes: Vec<String>,
    /// Every name stored (without a directory's trailing `/`): a name that is not
    /// UTF-8, written with `%NN`, can come out as another entry's (`n\xff` beside
    /// a real `n%FF`), which the archive cannot hold twice (QA: the export failed
    /// half-way, after a console download had started).
    taken: std::collections::HashSet<String>,
    /// Directories stored under another name than theirs (`~N` added): what is in
    /// them goes there too. By the snapshot's path bytes.
    moved: HashMap<Vec<u8>, String>,
}

impl<'a> ZipSink<'a> {
    fn new(out: &'a mut dyn Write) -> Self {
        let cut = std::rc::Rc::new(std::cell::Cell::new(false));
        ZipSink {
            zip: Some(zip::ZipWriter::new_stream(Cutoff {
                out,
                cut: cut.clone(),
                written: None,
            })),
            cut,
            notes: Vec::new(),
            taken: Default::default(),
            moved: HashMap::new(),
        }
    }

    /// The name `name` is stored under: [`zip_name`]'s, below the new name of a
    /// directory that was moved, and with `~N` added when another entry has it
    /// already (said in a note).
    fn stored_name(&mut self, name: &[u8], dir: bool) -> String {
        let mut shown = None;
        if !self.moved.is_empty() {
            let mut at = name.len();
            while let Some(i) = name[..at].iter().rposition(|&b| b == b'/') {
                if let Some(d) = self.moved.get(&name[..i]) {
                    let d = d.clone();
                    shown = Some(format!("{d}{}", zip_name(&name[i..], &mut self.notes)));
                    break;
                }
                at = i;
            }
        }
        let shown = shown.unwrap_or_else(|| zip_name(name, &mut self.notes));
        if self.taken.insert(shown.clone()) {
            return shown;
        }
        let mut n = 1u64;
        let other = loop {
            let c = format!("{shown}~{n}");
            if self.taken.insert(c.clone()) {
                break c;
            }
            n += 1;
        };
        self.notes.push(format!(
            "{shown}: another entry of the archive has that name already (a name that is \
             not UTF-8 written with %NN); stored as {other}"
        ));
        if dir {
            self.moved.insert(name.to_vec(), other.clone());
        }
        other
    }

    fn writer(&mut self) -> Result<&mut ZipOut<'a>> {
        self.zip
            .as_mut()
            .ok_or_else(|| Error::Invalid("the zip archive was finished".into()))
    }
}

impl Drop for ZipSink<'_> {
    /// An export that failed leaves its archive unfinished, without the central
    /// directory `zip`'s own drop would write (a cut-short archive would look whole,
    /// and a failing output would get that library's message on standard error).
    fn drop(&mut self) {
        if let Some(zip) = self.zip.take() {
            self.cut.set(true);
            drop(zip);
        }
    }
}

fn zip_err(e: zip::result::ZipError) -> Error {
    match e {
        zip::result::ZipError::Io(e) => io(e),
        e => Error::Invalid(format!("writing the zip archive: {e}")),
    }
}

/// [`zip_err`] for the entry `shown`: the zip library's own text for a name it
/// refuses is not one to show.
fn zip_entry_err(shown: &str) -> impl FnOnce(zip::result::ZipError) -> Error + '_ {
    move |e| match e {
        zip::result::ZipError::Io(e) => io(e),
        e if e.to_string().contains("Duplicate filename") => Error::Invalid(format!(
            "{shown}: the zip archive already has an entry of this name (a name that is \
             not UTF-8 is stored changed and can meet another); export as tar instead"
        )),
        e => Error::Invalid(format!("writing the zip archive at {shown}: {e}")),
    }
}

/// Zip's options for an entry: its Unix type and mode bits in the external
/// attributes (set-ID and sticky bits included, as Info-ZIP keeps them), and the
/// modification time twice: as DOS time (2-second steps in this machine's local
/// time, as Info-ZIP's zip and Python's zipfile write it, since readers that know
/// no better show it as local time: QA saw 9 hours off in Tokyo with UTC; a time
/// outside 1980-2107 clamped to the nearest end, so order is kept) and, where it
/// fits, exactly in an extended-timestamp field (`UT`, 0x5455: seconds since the
/// epoch, UTC), which Info-ZIP's unzip and bsdtar use instead. Info-ZIP's unzip
/// ignores a time before 1970 there, so such a file's clamping is said too.
fn zip_options(
    n: &Node,
    file_type: u32,
    shown: &str,
    notes: &mut Vec<String>,
) -> Result<zip::write::FullFileOptions<'static, 'static>> {
    let secs = n.mtime.secs;
    let local = secs.saturating_add(crate::time::local_offset_of(secs).into());
    let (y, mo, d, h, mi, s) = crate::time::civil_utc(local);
    let ut = i32::try_from(secs).ok();
    if !(1980..=2107).contains(&y) && ut.is_none_or(|t| t < 0) {
        notes.push(format!(
            "{shown}: its time (year {y}) is outside what zip can store; stored as {}",
            if y < 1980 { "1980-01-01" } else { "2107-12-31" }
        ));
    }
    let t = if y < 1980 {
        zip::DateTime::default()
    } else if y > 2107 {
        zip::DateTime::from_date_and_time(2107, 12, 31, 23, 59, 58).unwrap_or_default()
    } else {
        zip::DateTime::from_date_and_time(y as u16, mo, d, h, mi, s).unwrap_or_default()
    };
    let mut dos = 0;
    if file_type == libc::S_IFDIR {
        dos |= 0x10;
    }
    let mut opts = zip::write::FullFileOptions::default()
        .system(zip::System::Unix)
        .external_attributes(((file_type | (n.mode & 0o7777)) << 16) | dos)
        .last_modified_time(t);
    if let Some(unix) = ut {
        let mut ut = vec![1u8];
        ut.extend_from_slice(&unix.to_le_bytes());
        opts.add_extra_field(0x5455, ut, false)
            .map_err(|e| Error::Invalid(format!("writing the zip archive: {e}")))?;
    }
    Ok(opts)
}

/// A zip entry's name: zip names are UTF-8 strings; another name is stored with
/// each invalid byte written `%NN` (so that two such names stay apart; not `\xNN`:
/// Windows extractors take a backslash for a separator), and said so.
fn zip_name(name: &[u8], notes: &mut Vec<String>) -> String {
    let mut s = String::with_capacity(name.len());
    for chunk in name.utf8_chunks() {
        s.push_str(chunk.valid());
        for b in chunk.invalid() {
            s.push_str(&format!("%{b:02X}"));
        }
    }
    if s.as_bytes() != name {
        notes.push(format!(
            "{s}: the name is not UTF-8; stored with %NN for its invalid bytes"
        ));
    }
    s
}

impl Sink for ZipSink<'_> {
    fn link(&mut self, _: &[u8], _: &Node, _: &[u8]) -> Result<bool> {
        Ok(false)
    }

    fn entry(&mut self, name: &[u8], n: &Node) -> Result<Option<String>> {
        let shown = self.stored_name(name, n.kind == NodeKind::Dir);
        match n.kind {
            NodeKind::Dir => {
                let opts = zip_options(n, libc::S_IFDIR, &shown, &mut self.notes)?;
                self.writer()?
                    .add_directory(shown.as_str(), opts)
                    .map_err(zip_entry_err(&shown))?;
            }
            NodeKind::Symlink => {
                // An entry of type symlink whose content is the target, as its
                // bytes (the library's own call takes UTF-8 text only).
                let opts = zip_options(n, libc::S_IFLNK, &shown, &mut self.notes)?
                    .external_attributes((libc::S_IFLNK | 0o777) << 16)
                    .compression_method(zip::CompressionMethod::Stored);
                let zip = self.writer()?;
                zip.start_file(shown.as_str(), opts)
                    .map_err(zip_entry_err(&shown))?;
                zip.write_all(&n.link_target).map_err(io)?;
            }
            _ => {
                return Ok(Some(format!(
                    "{shown}: a {} cannot be stored in a zip archive (left out)",
                    n.kind.name()
                )));
            }
        }
        Ok(None)
    }

    fn take_notes(&mut self) -> Vec<String> {
        std::mem::take(&mut self.notes)
    }

    fn file(
        &mut self,
        name: &[u8],
        n: &Node,
        _first: Option<&[u8]>,
        content: &mut Content<'_>,
    ) -> Result<()> {
        let shown = self.stored_name(name, false);
        let opts = zip_options(n, libc::S_IFREG, &shown, &mut self.notes)?
            .compression_method(zip::CompressionMethod::Deflated)
            .compression_level(Some(3))
            .large_file(n.size >= u64::from(u32::MAX));
        let zip = self.writer()?;
        zip.start_file(shown.as_str(), opts)
            .map_err(zip_entry_err(&shown))?;
        // Zip has no hard links: another name of a file is another copy, read again.
        let r = std::io::copy(content, zip);
        if let Some(e) = content.error.take() {
            return Err(e);
        }
        r.map_err(io)?;
        Ok(())
    }

    fn finish(&mut self) -> Result<()> {
        if let Some(zip) = self.zip.take() {
            let mut out = zip.finish().map_err(zip_err)?;
            out.flush().map_err(io)?;
        }
        Ok(())
    }
}

/// Reader threads, and jobs queued for them: enough to keep several pack reads in
/// flight on a disk or object store. What they hold is bounded by the jobs: 16 MiB
/// of small files ahead ([`AHEAD_BYTES`]), two batches of a large file's blobs, and
/// one range of at most [`MAX_JOB_RANGE`] per reader.
const READ_AHEAD: usize = 8;

/// Blobs of a large file asked for in one batch (split into a job per core): at
/// the default 16 KiB blocks about half a MiB, one range read per job where the
/// blobs lie side by side — on a remote repository one request instead of 16.
const BATCH_BLOBS: usize = 32;

/// Blobs read by one reader thread in one job: several at once cost one hand-off
/// between threads instead of one each (the hand-offs were a fifth of an export's
/// CPU), and those side by side in a pack one range read.
type ReadJob = (Vec<BlobId>, crossbeam_channel::Sender<Vec<Result<Vec<u8>>>>);

/// Where a reader thread sends the blobs of one job, in the order asked.
type BlobsReply = crossbeam_channel::Receiver<Vec<Result<Vec<u8>>>>;

/// Threads that read blobs for [`Content`], alive for a whole export or dump.
/// (A thread spawned per blob, as before, cost a thread and a zstd context per
/// blob: a third of an export's CPU.) Dropping this ends them.
pub(crate) struct BlobReaders {
    tx: crossbeam_channel::Sender<ReadJob>,
}

impl BlobReaders {
    /// [`READ_AHEAD`] reader threads in scope `s`.
    pub(crate) fn start<'scope, 'env>(
        s: &'scope std::thread::Scope<'scope, 'env>,
        repo: &'env Repository,
    ) -> BlobReaders {
        let (tx, rx) = crossbeam_channel::bounded::<ReadJob>(READ_AHEAD);
        for _ in 0..READ_AHEAD {
            let rx = rx.clone();
            s.spawn(move || {
                for (ids, reply) in rx {
                    let r = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
                        crate::ops::blobs::read_blobs(repo, &ids)
                    }))
                    .unwrap_or_else(|_| {
                        ids.iter()
                            .map(|_| Err(Error::Invalid("a blob reader panicked".into())))
                            .collect()
                    });
                    let _ = reply.send(r);
                }
            });
        }
        BlobReaders { tx }
    }

    /// Asks for `ids` on a reader thread if one can take them now.
    fn try_ask(&self, ids: Vec<BlobId>) -> Option<BlobsReply> {
        let (tx, rx) = crossbeam_channel::bounded(1);
        self.tx.try_send((ids, tx)).ok().map(|()| rx)
    }

    /// Asks for `ids` on the reader threads, one job per core (each job's blobs
    /// decoded in turn, the jobs in parallel); [`BlobReaders::collect`] waits for them.
    fn ask_all(&self, ids: &[BlobId]) -> Vec<(usize, Option<BlobsReply>)> {
        let per_job = ids.len().div_ceil(crate::threads::cores().max(1)).max(1);
        ids.chunks(per_job)
            .map(|part| {
                let (tx, rx) = crossbeam_channel::bounded(1);
                (
                    part.len(),
                    self.tx.send((part.to_vec(), tx)).ok().map(|()| rx),
                )
            })
            .collect()
    }

    /// The blobs of [`BlobReaders::ask_all`]'s jobs, in order.
    fn collect(jobs: Vec<(usize, Option<BlobsReply>)>) -> Vec<Result<Vec<u8>>> {
        let mut out = Vec::new();
        for (n, rx) in jobs {
            match rx.and_then(|rx| rx.recv().ok()) {
                Some(v) if v.len() == n => out.extend(v),
                _ => out
                    .extend((0..n).map(|_| Err(Error::Invalid("the blob readers stopped".into())))),
            }
        }
        out
    }
}

/// Bytes of small files' blobs asked for ahead of the writer at most.
const AHEAD_BYTES: u64 = 16 << 20;
/// Files up to this size are read ahead (larger ones read their own blobs several
/// at a time, [`Content`]).
const AHEAD_FILE_MAX: u64 = 1 << 20;

/// Which file wanted a blob: (the directory's number in the walk, the file's index
/// in its tree). Tags only grow while one run of files is written.
type FileTag = (u64, usize);

/// Blobs [`Ahead`] asks for in one job at most.
const AHEAD_JOB_BLOBS: usize = 32;
/// And their bytes at most, so that the jobs of a run spread over the readers.
const AHEAD_JOB_BYTES: u64 = 1 << 20;

/// The blobs of a job that arrived, each until it is taken.
type Arrived = Vec<Option<Result<Vec<u8>>>>;

/// One job of [`Ahead`]'s: its reply, then the blobs not taken yet.
struct AskedJob {
    reply: BlobsReply,
    got: std::cell::RefCell<Option<Arrived>>,
}

impl AskedJob {
    /// Blob `i` of the job (waits for the reader the first time).
    fn take(&self, i: usize) -> Result<Vec<u8>> {
        let mut got = self.got.borrow_mut();
        let blobs = got.get_or_insert_with(|| {
            self.reply
                .recv()
                .map(|v| v.into_iter().map(Some).collect())
                .unwrap_or_default()
        });
        blobs
            .get_mut(i)
            .and_then(Option::take)
            .unwrap_or_else(|| Err(Error::Invalid("the blob readers stopped".into())))
    }
}

/// The blobs of the small files coming next, asked for on the reader threads before
/// the writer gets to them. Without it a tree of small files was read one blob at a
/// time on the writer's thread, between its writes (one core of two busy).
///
/// Only files of the directory being written, up to its next subdirectory (a
/// *run*), are read ahead: the walk goes into that subdirectory next, and what its
/// parent's later files would hold meanwhile is memory for nothing. A run starts
/// when a directory is entered and when one of its subdirectories is done.
#[derive(Default)]
pub(crate) struct Ahead {
    /// Asked for: the job and the blob's place in it, the chunk's length and the
    /// file that wanted it, by blob id.
    asked: HashMap<BlobId, (std::rc::Rc<AskedJob>, usize, u64, FileTag)>,
    /// The same, in the order asked, with the file that wanted each.
    order: std::collections::VecDeque<(FileTag, BlobId)>,
    /// Bytes asked for and not yet taken.
    bytes: u64,
    /// Chunks of the current run not asked for yet.
    pending: std::collections::VecDeque<(FileTag, ChunkRef)>,
    /// Blobs the next job takes at most: 1 at the start of a run, doubling up to
    /// [`AHEAD_JOB_BLOBS`], so that the writer, which wants the run's first blob at
    /// once, never waits for a whole job of them.
    job_blobs: usize,
}

impl Ahead {
    /// The blob, if it was asked for (waits for its reader).
    fn take(&mut self, id: &BlobId) -> Option<Result<Vec<u8>>> {
        let (job, i, len, _) = self.asked.remove(id)?;
        self.bytes = self.bytes.saturating_sub(len);
        Some(job.take(i))
    }

    /// Starts a run of files (forgetting what an earlier run asked for and no file
    /// took).
    fn start_run(&mut self, run: std::collections::VecDeque<(FileTag, ChunkRef)>) {
        self.asked.clear();
        self.order.clear();
        self.bytes = 0;
        self.pending = run;
        self.job_blobs = 1;
    }

    /// File `tag` is next: what earlier files of the run left is dropped (they read
    /// it themselves), and so is what is pending for this one.
    fn at_file(&mut self, tag: FileTag) {
        while let Some((t, _)) = self.pending.front() {
            if *t > tag {
                break;
            }
            self.pending.pop_front();
        }
        while let Some((t, id)) = self.order.front() {
            if *t >= tag {
                break;
            }
            // Unless a later file asked for the same blob again.
            if self.asked.get(id).is_some_and(|a| a.3 == *t)
                && let Some((_, _, len, _)) = self.asked.remove(id)
            {
                self.bytes = self.bytes.saturating_sub(len);
            }
            self.order.pop_front();
        }
    }

    /// Asks for pending blobs while there is room, on the readers and in memory,
    /// up to [`AHEAD_JOB_BLOBS`] in a job.
    fn pump(&mut self, readers: &BlobReaders) {
        while self.bytes < AHEAD_BYTES && !self.pending.is_empty() {
            // The next job: pending chunks not asked for yet (a chunk twice in the
            // run is asked for once; the later file reads its own).
            let mut job: Vec<(FileTag, ChunkRef)> = Vec::new();
            let mut bytes = 0u64;
            let mut scanned = 0;
            for &(tag, c) in &self.pending {
                if job.len() >= self.job_blobs.clamp(1, AHEAD_JOB_BLOBS)
                    || bytes >= AHEAD_JOB_BYTES
                    || self.bytes + bytes >= AHEAD_BYTES
                {
                    break;
                }
                scanned += 1;
                if !self.asked.contains_key(&c.id) && !job.iter().any(|(_, j)| j.id == c.id) {
                    job.push((tag, c));
                    bytes += c.length;
                }
            }
            if !job.is_empty() {
                let Some(reply) = readers.try_ask(job.iter().map(|(_, c)| c.id).collect()) else {
                    return;
                };
                let asked = std::rc::Rc::new(AskedJob {
                    reply,
                    got: std::cell::RefCell::new(None),
                });
                for (i, (tag, c)) in job.into_iter().enumerate() {
                    self.asked.insert(c.id, (asked.clone(), i, c.length, tag));
                    self.order.push_back((tag, c.id));
                }
                self.bytes += bytes;
                self.job_blobs = self.job_blobs.saturating_mul(2);
            }
            self.pending.drain(..scanned);
        }
    }
}

/// The runs of a directory's small files (see [`Ahead`]): the chunks of the files
/// before its first subdirectory, between the first and the second, and so on.
fn runs_of(
    serial: u64,
    tree: &Tree,
) -> std::collections::VecDeque<std::collections::VecDeque<(FileTag, ChunkRef)>> {
    let mut runs = std::collections::VecDeque::new();
    let mut run = std::collections::VecDeque::new();
    for (i, n) in tree.nodes.iter().enumerate() {
        if n.subtree.is_some() {
            runs.push_back(std::mem::take(&mut run));
            continue;
        }
        if n.kind != NodeKind::File || n.size > AHEAD_FILE_MAX {
            continue;
        }
        if let cairn_format::tree::Content::Inline(chunks) = &n.content {
            run.extend(chunks.iter().map(|c| ((serial, i), *c)));
        }
    }
    runs.push_back(run);
    runs
}

/// A directory being exported: its number and the runs of its files still to come.
struct DirAhead {
    serial: u64,
    next_index: usize,
    runs: std::collections::VecDeque<std::collections::VecDeque<(FileTag, ChunkRef)>>,
}

/// Chunk ids taken from the chunk list per descent into it: a file's ids are never
/// held all at once (a 1 TB file has tens of millions of chunks).
const IDS_PER_DESCENT: usize = 1024;

/// A file's content as a reader of exactly its recorded size: chunk ids are taken
/// from its chunk list a thousand at a time, blobs read [`BATCH_BLOBS`] at a
/// time in parallel, and content shorter or longer than the size is an error (kept
/// in `error`, since the writer only sees an I/O error). Used by `export` and `dump`.
pub(crate) struct Content<'a> {
    repo: &'a Repository,
    readers: &'a BlobReaders,
    reader: FileReader<'a>,
    /// File offset of the first chunk not yet in `ids`.
    next_offset: u64,
    /// The next chunks' ids and lengths; no id for the bytes of a lost chunk list.
    ids: std::collections::VecDeque<(Option<BlobId>, u64)>,
    /// Blobs read ahead, in order.
    ready: std::collections::VecDeque<Ready>,
    /// Blobs asked for and not yet in `ready`.
    batches: std::collections::VecDeque<Batch>,
    buf: Vec<u8>,
    pos: usize,
    left: u64,
    path: &'a str,
    pub(crate) error: Option<Error>,
    /// Chunks known to hold only zeros, with their lengths (a sparse file's holes):
    /// made here instead of read.
    zeros: HashMap<BlobId, usize>,
    /// Blobs an export asked for ahead of this file (taken from there when present).
    ahead: Option<&'a mut Ahead>,
    /// A chunk that is damaged or missing is given as zeros (`export`: the archive
    /// goes on, and the file is reported), instead of ending the read.
    pub(crate) zero_damaged: bool,
    /// What was given as zeros: bytes, and why the first such chunk was.
    pub(crate) damaged: Option<(u64, String)>,
    /// A blob or a chunk list that could not be read: the error, given once
    /// what comes before it is written, nothing after it asked for (QA r37: a
    /// dump said it was cut short after 0 bytes where the damage began at
    /// 294,912; QA r40: a damaged list of an image's 7th MiB held back the 2
    /// MiB before it).
    stopped: Option<Error>,
}

/// A piece of a file's content ready for the writer.
enum Ready {
    Data(Vec<u8>),
    /// That many zeros, the bytes of a chunk list that could not be read: given a
    /// MiB at a time.
    Zeros(u64),
}

impl<'a> Content<'a> {
    /// The content of file `n`, named `path` in errors.
    pub(crate) fn new(
        repo: &'a Repository,
        n: &'a Node,
        path: &'a str,
        readers: &'a BlobReaders,
    ) -> Self {
        Content {
            repo,
            readers,
            reader: FileReader::new(repo, &n.content, n.size).short_objects_lost(),
            next_offset: 0,
            ids: std::collections::VecDeque::new(),
            ready: std::collections::VecDeque::new(),
            batches: std::collections::VecDeque::new(),
            buf: Vec::new(),
            pos: 0,
            left: n.size,
            path,
            error: None,
            zeros: HashMap::new(),
            ahead: None,
            zero_damaged: false,
            damaged: None,
            stopped: None,
        }
    }

    /// Starts reading the next blobs of the file (up to [`BATCH_BLOBS`]) on the
    /// reader threads; false when there are none left.
    fn start_batch(&mut self) -> Result<bool> {
        if self.ids.len() < BATCH_BLOBS && self.next_offset < self.reader.size() {
            let (ids, next) = (&mut self.ids, &mut self.next_offset);
            let mut taken = 0;
            let from = *next;
            let (mut lost, mut gap_bytes) = (None, 0u64);
            let mut take = |p: Piece, start: u64| {
                let (id, end) = match p {
                    Piece::Chunk(c) => (Some(c.id), start + c.length),
                    // A chunk list that cannot be read: which chunks it names is
                    // not known, so its bytes are given as zeros, as a damaged
                    // chunk is, and the file goes on after them.
                    Piece::Gap(len) => (None, start.saturating_add(len)),
                };
                // `from` is always a chunk's start (the end of the one before), so
                // this only guards against taking bytes twice (a gap may start
                // before the offset asked for).
                if end <= *next {
                    return Ok(true);
                }
                let len = end - start.max(*next);
                if id.is_none() {
                    gap_bytes += len;
                }
                ids.push_back((id, len));
                *next = end;
                taken += 1;
                Ok(taken < IDS_PER_DESCENT)
            };
            let listed = if self.zero_damaged {
                self.reader.chunks_or_gaps_from(from, &mut lost, &mut take)
            } else {
                self.reader
                    .chunks_from(from, &mut |c, start| take(Piece::Chunk(c), start))
            };
            if let Err(e) = listed {
                // The chunks taken before it go first; nothing after it.
                self.stop(e);
                return self.batch_from_ids();
            }
            if let Some(e) = lost {
                let d = self.damaged.get_or_insert_with(|| (0, e.to_string()));
                d.0 += gap_bytes;
            }
            if taken == 0 {
                // Nothing more: the list ends before the recorded size.
                self.next_offset = self.reader.size();
            }
        }
        self.batch_from_ids()
    }

    /// Reads nothing past here: `e` is given once what came before is written.
    fn stop(&mut self, e: Error) {
        self.stopped = Some(e);
        self.next_offset = self.reader.size();
    }

    /// Asks for the next batch of the chunks in `ids`; false when there are none.
    fn batch_from_ids(&mut self) -> Result<bool> {
        if self.ids.is_empty() {
            return Ok(false);
        }
        let n = self.ids.len().min(BATCH_BLOBS);
        let (ids, lens): (Vec<Option<BlobId>>, Vec<u64>) = self.ids.drain(..n).unzip();
        // Blobs asked for ahead of this file are waited for, not read again.
        let mut asked: HashMap<BlobId, Result<Vec<u8>>> = HashMap::new();
        if let Some(ahead) = self.ahead.as_deref_mut() {
            for id in ids.iter().flatten() {
                if let Some(r) = ahead.take(id) {
                    asked.insert(*id, r);
                }
            }
        }
        let zeros = &self.zeros;
        let to_read: Vec<BlobId> = ids
            .iter()
            .flatten()
            .filter(|id| !zeros.contains_key(id) && !asked.contains_key(id))
            .copied()
            .collect();
        // One blob with nothing else under way is read here (no hand-off); more
        // go to the reader threads, and the writer goes on with what came before.
        let read = if to_read.len() <= 1 && self.batches.is_empty() {
            Reads::Done(to_read.iter().map(|id| self.repo.read_blob(id)).collect())
        } else {
            Reads::Asked(self.readers.ask_all(&to_read))
        };
        self.batches.push_back(Batch {
            ids,
            lens,
            asked,
            read,
        });
        Ok(true)
    }

    /// Reads the next blobs: keeps [`BATCHES_IN_FLIGHT`] batches asked for, so that
    /// the readers decode the next ones while the writer writes these.
    fn fill(&mut self) -> Result<()> {
        while self.batches.len() < BATCHES_IN_FLIGHT {
            if !self.start_batch()? {
                break;
            }
        }
        let Some(Batch {
            ids,
            lens,
            mut asked,
            read,
        }) = self.batches.pop_front()
        else {
            return self.stopped.take().map_or(Ok(()), Err);
        };
        let mut read = match read {
            Reads::Done(v) => v,
            Reads::Asked(jobs) => BlobReaders::collect(jobs),
        }
        .into_iter();
        let zeros = &self.zeros;
        let repo = &self.repo;
        // No blob for the bytes of a lost chunk list.
        let blobs: Vec<Option<Result<Vec<u8>>>> = ids
            .iter()
            .enumerate()
            .map(|(i, id)| {
                let id = id.as_ref()?;
                Some(match zeros.get(id) {
                    Some(&len) => Ok(vec![0u8; len]),
                    // A chunk repeated within the batch: copies until its last place;
                    // one that failed fails again there (read again: an error is not
                    // copied, and taking it at its first place left the later ones
                    // the next blob's read, QA r33).
                    None if asked.contains_key(id) => match asked.get(id) {
                        Some(Ok(b)) if ids[i + 1..].contains(&Some(*id)) => Ok(b.clone()),
                        Some(Err(_)) if ids[i + 1..].contains(&Some(*id)) => repo.read_blob(id),
                        _ => asked.remove(id).unwrap_or_else(|| {
                            Err(Error::Invalid("a blob read went missing".into()))
                        }),
                    },
                    None => read
                        .next()
                        .unwrap_or_else(|| Err(Error::Invalid("a blob read went missing".into()))),
                })
            })
            .collect();
        for ((b, len), id) in blobs.into_iter().zip(lens).zip(&ids) {
            let Some(b) = b else {
                self.ready.push_back(Ready::Zeros(len));
                continue;
            };
            let b = match b {
                Err(e) if self.zero_damaged && e.is_lost_in_storage() => {
                    let d = self.damaged.get_or_insert_with(|| (0, e.to_string()));
                    d.0 += len;
                    // Bounded as the blob would have been (a longer one is
                    // refused by `read` as longer than the recorded size).
                    let cap = self
                        .left
                        .min(cairn_format::consts::MAX_BLOB_SIZE as u64 + 1);
                    vec![0u8; usize::try_from(len.min(cap)).unwrap_or(0)]
                }
                // Where the blob is, as restore says it: the pack to look at.
                Err(mut e) => {
                    let pack = id.and_then(|id| self.repo.index().get(&id));
                    if let (Error::Damaged { what, .. }, Some(loc)) = (&mut e, pack) {
                        let pack = self.repo.index().pack_of(&loc).short();
                        what.push_str(&format!(" (in pack {pack})"));
                    }
                    // The blobs before it are the file's bytes: written first;
                    // the batches after it are dropped.
                    self.batches.clear();
                    self.ids.clear();
                    self.stop(e);
                    break;
                }
                Ok(b) => b,
            };
            self.ready.push_back(Ready::Data(b));
        }
        // Stopped with nothing before it left to write: said now.
        match self.stopped.take() {
            Some(e) if self.ready.is_empty() => Err(e),
            stopped => {
                self.stopped = stopped;
                Ok(())
            }
        }
    }
}

/// Batches of a [`Content`] asked for at once: the one being waited for and the next.
const BATCHES_IN_FLIGHT: usize = 2;

/// Up to [`BATCH_BLOBS`] consecutive blobs of a file, asked for together.
struct Batch {
    /// None for the bytes of a lost chunk list.
    ids: Vec<Option<BlobId>>,
    /// Their chunks' lengths (a damaged one is given as that many zeros).
    lens: Vec<u64>,
    /// Those [`Ahead`] had asked for.
    asked: HashMap<BlobId, Result<Vec<u8>>>,
    /// The others (not zero chunks), in order.
    read: Reads,
}

enum Reads {
    Done(Vec<Result<Vec<u8>>>),
    Asked(Vec<(usize, Option<BlobsReply>)>),
}

impl Read for Content<'_> {
    fn read(&mut self, out: &mut [u8]) -> std::io::Result<usize> {
        while self.pos >= self.buf.len() {
            if self.ready.is_empty()
                && let Err(e) = self.fill()
            {
                self.error = Some(e);
                return Err(std::io::Error::other("unreadable content"));
            }
            let b = match self.ready.pop_front() {
                Some(Ready::Data(b)) => b,
                Some(Ready::Zeros(n)) => {
                    let m = n.min(1 << 20);
                    if n > m {
                        self.ready.push_front(Ready::Zeros(n - m));
                    }
                    vec![0u8; m as usize]
                }
                None if self.left > 0 => {
                    self.error = Some(Error::Invalid(format!(
                        "{}: its content is {} bytes shorter than its recorded size",
                        self.path, self.left
                    )));
                    return Err(std::io::Error::other("short content"));
                }
                None => return Ok(0),
            };
            if b.len() as u64 > self.left {
                self.error = Some(Error::Invalid(format!(
                    "{}: its content is longer than its recorded size",
                    self.path
                )));
                return Err(std::io::Error::other("long content"));
            }
            self.left -= b.len() as u64;
            self.buf = b;
            self.pos = 0;
        }
        let n = out.len().min(self.buf.len() - self.pos);
        out[..n].copy_from_slice(&self.buf[self.pos..self.pos + n]);
        self.pos += n;
        Ok(n)
    }
}

impl<S: Sink> Exporter<'_, S> {
    /// The directory's next run of files is coming (see [`Ahead`]).
    fn next_run(&mut self, dir: &mut DirAhead) {
        self.ahead
            .start_run(dir.runs.pop_front().unwrap_or_default());
        self.ahead.pump(self.readers);
    }
}

impl<S: Sink> Visitor for Exporter<'_, S> {
    type Dir = DirAhead;
    type Out = ();
    fn enter(&mut self, _: &str, node: Option<&Node>, tree: &Tree) -> Result<DirAhead> {
        let name = match (node, self.dirs.is_empty()) {
            (None, _) => Vec::new(),
            // The exported directory itself.
            (Some(n), true) => n.name.clone(),
            (Some(n), false) => self.name_in_dir(n),
        };
        self.dirs.push(name);
        self.dir_serial += 1;
        let mut dir = DirAhead {
            serial: self.dir_serial,
            next_index: 0,
            runs: runs_of(self.dir_serial, tree),
        };
        self.next_run(&mut dir);
        Ok(dir)
    }
    fn entry(&mut self, dir: &mut DirAhead, _: &str, n: &Node) -> Result<Option<BlobId>> {
        let tag = (dir.serial, dir.next_index);
        dir.next_index += 1;
        self.ahead.at_file(tag);
        let name = self.name_in_dir(n);
        self.write_node(name, n)?;
        self.ahead.pump(self.readers);
        Ok(n.subtree)
    }
    fn unreadable(&mut self, dir: &mut DirAhead, path: &str, _: &Node, e: Error) -> Result<()> {
        // A directory lost or damaged in the repository is left out, named; any
        // other failure (EIO, a remote that kept failing, no permission, a tree
        // of a newer format) may leave it whole, and leaving it out would make
        // an archive that looks finished (review: only a file's content ended
        // the archive so).
        if self.complete_only || !e.is_lost_in_storage() {
            return Err(Error::Invalid(format!(
                "{path} could not be read ({e}); the archive is incomplete"
            )));
        }
        self.report.errors.push(ExportError {
            path: path.to_string(),
            error: e.to_string(),
        });
        self.next_run(dir);
        Ok(())
    }
    fn leave(&mut self, _: &str, _: Option<&Node>, _: DirAhead) -> Result<()> {
        self.dirs.pop();
        Ok(())
    }
    fn child(&mut self, dir: &mut DirAhead, _: &str, _: &Node, _: ()) -> Result<()> {
        self.next_run(dir);
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A chunk list of a file that cannot be read (here: never stored) gives the
    /// bytes it covers as zeros, counted as damaged, where it ended the archive:
    /// the chunks before and after it come out as saved, and the size is kept.
    #[test]
    fn a_lost_chunk_list_gives_its_own_bytes_as_zeros() {
        // (level of the lost list, which of that level, the chunks it covers)
        for (level, nth, covers) in [(0u8, 5usize, 40..48), (1, 1, 64..128), (2, 0, 0..300)] {
            let (out, bytes, damaged) = export_with_a_lost_list(level, nth);
            assert_eq!(out.len(), bytes.len());
            let (zeros, why) = damaged.expect("the lost list is reported");
            let before = out.iter().zip(&bytes).take_while(|(a, b)| a == b).count();
            let after = out
                .iter()
                .rev()
                .zip(bytes.iter().rev())
                .take_while(|(a, b)| a == b)
                .count();
            // Chunks are never all zeros, so the zeros given are exactly the gap.
            assert_eq!(before as u64 + zeros + after as u64, bytes.len() as u64);
            assert!(out[before..bytes.len() - after].iter().all(|b| *b == 0));
            // Chunk i is i * 37 % 97 + 3 bytes long (see `file_with_lists`).
            let len = |i: usize| (i * 37 % 97 + 3) as u64;
            assert_eq!(before as u64, (0..covers.start).map(len).sum::<u64>());
            assert_eq!(zeros, covers.map(len).sum::<u64>(), "level {level}");
            assert!(why.contains("missing from the index"), "{why}");
        }
    }

    /// Exports a file of 300 chunks in lists of eight, with the `nth` list of
    /// `level` never stored: what came out, the file, and what was reported.
    fn export_with_a_lost_list(level: u8, nth: usize) -> (Vec<u8>, Vec<u8>, Option<(u64, String)>) {
        use cairn_format::pack::BlobKind;
        let mut repo = crate::testutil::mem_repo();
        let (mut blobs, mut lists, content, bytes) =
            crate::testutil::file_with_lists(&repo, 300, 8);
        let lost = lists
            .iter()
            .enumerate()
            .filter(|(_, (l, _))| *l == level)
            .nth(nth)
            .map(|(i, _)| i)
            .unwrap();
        lists.remove(lost);
        blobs.extend(lists.into_iter().map(|(_, d)| (BlobKind::ChunkList, d)));
        crate::testutil::store_indexed(&mut repo, &blobs);
        let mut node = crate::tree::walk::tests::file_node(b"f");
        node.size = bytes.len() as u64;
        node.content = content;
        std::thread::scope(|s| {
            let readers = BlobReaders::start(s, &repo);
            let mut c = Content::new(&repo, &node, "f", &readers);
            c.zero_damaged = true;
            let mut out = Vec::new();
            c.read_to_end(&mut out).unwrap();
            (out, bytes, c.damaged.take())
        })
    }

    /// A tar export that fails between two entries ends with a header whose data
    /// never comes, so that readers fail; a finished one does not (QA, review: a
    /// stream cut between entries extracts with GNU tar's exit 0).
    #[test]
    fn a_tar_that_failed_between_entries_ends_in_a_header_without_its_data() {
        let read_all = |out: &[u8]| -> (Vec<String>, std::io::Result<()>) {
            let mut names = Vec::new();
            let mut a = tar::Archive::new(out);
            let r = (|| {
                for e in a.entries()? {
                    let mut e = e?;
                    names.push(e.path()?.display().to_string());
                    std::io::copy(&mut e, &mut std::io::sink())?;
                }
                Ok(())
            })();
            (names, r)
        };
        let mut dir = Node::new(b"d".to_vec(), NodeKind::Dir);
        dir.mode = 0o755;
        let mut out = Vec::new();
        {
            let mut sink = TarSink::new(&mut out);
            assert_eq!(sink.entry(b"d", &dir).unwrap(), None);
            // Dropped without finish: the export failed.
        }
        // The mark last, with no end-of-archive blocks after it.
        assert!(out[out.len() - 512..].starts_with(FAILED_MARK.as_bytes()));
        let (names, r) = read_all(&out);
        assert_eq!(names, ["d", FAILED_MARK]);
        assert!(r.is_err(), "the archive read as whole");
        let mut out = Vec::new();
        {
            let mut sink = TarSink::new(&mut out);
            sink.entry(b"d", &dir).unwrap();
            sink.finish().unwrap();
        }
        let (names, r) = read_all(&out);
        assert_eq!(names, ["d"]);
        r.unwrap();
    }

    #[test]
    fn pax_times_carry_the_sign_on_the_whole() {
        assert_eq!(pax_time(-2, 250_000_000), "-1.750000000");
        assert_eq!(pax_time(-1, 500_000_000), "-0.500000000");
        assert_eq!(pax_time(-1001, 999_999_500), "-1000.000000500");
        assert_eq!(pax_time(-5, 0), "-5.000000000");
        assert_eq!(pax_time(7, 1), "7.000000001");
    }

    #[test]
    fn pax_record_lengths_count_their_own_digits() {
        // 3 + key + value = 8: the record is 9 bytes ("9 k=vvvv\n" has 1 digit);
        // at 9 it becomes 11 (two digits).
        for value_len in 0..200 {
            let data = pax_records(&[(b"k".to_vec(), vec![b'v'; value_len])]);
            let (len, _) = std::str::from_utf8(&data).unwrap().split_once(' ').unwrap();
            assert_eq!(len.parse::<usize>().unwrap(), data.len(), "{value_len}");
        }
    }

    #[test]
    fn zip_names_that_come_out_alike_are_stored_apart_with_what_is_in_them() {
        let mut out = Vec::new();
        let mut z = ZipSink::new(&mut out);
        assert_eq!(z.stored_name(b"t/n\xff", true), "t/n%FF");
        assert_eq!(z.stored_name(b"t/n\xff/x", false), "t/n%FF/x");
        assert_eq!(z.stored_name(b"t/n%FF", true), "t/n%FF~1");
        assert_eq!(z.stored_name(b"t/n%FF/x", false), "t/n%FF~1/x");
        assert_eq!(
            z.stored_name(b"t/n%FF/sub\xfe/y", false),
            "t/n%FF~1/sub%FE/y"
        );
        assert_eq!(z.stored_name(b"t/f\xff", false), "t/f%FF");
        assert_eq!(z.stored_name(b"t/f%FF", false), "t/f%FF~1");
        assert_eq!(z.stored_name(b"t/f%FF~1", false), "t/f%FF~1~1");
        let notes = z.take_notes();
        assert_eq!(
            notes
                .iter()
                .filter(|n| n.contains("has that name already"))
                .count(),
            3,
            "{notes:?}"
        );
    }

    #[test]
    fn zip_names_that_are_not_utf8_stay_apart_and_are_said() {
        let mut notes = Vec::new();
        assert_eq!(zip_name("plain/é".as_bytes(), &mut notes), "plain/é");
        assert!(notes.is_empty());
        let a = zip_name(b"d/\xff-x", &mut notes);
        let b = zip_name(b"d/\xfe-x", &mut notes);
        assert_eq!((a.as_str(), b.as_str()), ("d/%FF-x", "d/%FE-x"));
        assert_eq!(notes.len(), 2);
        assert!(notes[0].contains("not UTF-8"), "{notes:?}");
    }
}
