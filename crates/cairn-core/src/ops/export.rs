//! Exporting part of a snapshot as a tar stream: for tape, for another tool, for a
//! browser download. The archive is written as the tree is walked, one file at a
//! time, so memory does not grow with the size of what is exported (a file's
//! chunk ids are its only per-file state: 32 bytes per chunk).
//!
//! The archive is POSIX (ustar with pax extensions): long names and link targets,
//! owners by id and name, modification times with nanoseconds, and extended
//! attributes as `SCHILY.xattr.*` (what GNU tar and bsdtar read). Hard links
//! within the export become tar hard links. A file whose content cannot be read
//! completely stops the export with an error: a tar entry's size is written before
//! its bytes, so a short file cannot be left in the archive silently.

use crate::error::{Error, Result};
use crate::ops::ls::find_node;
use crate::repo::Repository;
use crate::session::{Access, Session};
use crate::tree::chunklist::for_each_chunk;
use crate::tree::walk::Visitor;
use cairn_format::BlobId;
use cairn_format::tree::{Node, NodeKind, Tree};
use std::collections::HashMap;
use std::io::{Read, Write};
use std::os::unix::ffi::OsStrExt;

/// What an export wrote.
#[derive(Clone, Debug, Default, serde::Serialize)]
pub struct ExportReport {
    pub files: u64,
    pub dirs: u64,
    pub other_entries: u64,
    /// File content bytes (not counting tar headers).
    pub bytes: u64,
    /// Directories whose tree could not be read (left out, with why).
    pub errors: Vec<(String, String)>,
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
    let repo = session.repo();
    let start = find_node(repo, root, path)?;
    let base: String = path
        .split('/')
        .filter(|c| !c.is_empty() && *c != ".")
        .map(|c| format!("/{c}"))
        .collect();
    let mut ex = Exporter {
        repo,
        tar: tar::Builder::new(out),
        dirs: Vec::new(),
        links: HashMap::new(),
        report: ExportReport::default(),
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

struct Exporter<'a> {
    repo: &'a Repository,
    tar: tar::Builder<&'a mut dyn Write>,
    /// The archive names (bytes: Unix names need not be UTF-8) of the directories
    /// being walked, innermost last.
    dirs: Vec<Vec<u8>>,
    /// (device, inode) of files with more than one link, and their first name.
    links: HashMap<(u64, u64), Vec<u8>>,
    report: ExportReport,
}

fn io(e: std::io::Error) -> Error {
    Error::io("the archive", e)
}

impl Exporter<'_> {
    fn finish(mut self) -> Result<ExportReport> {
        self.tar.finish().map_err(io)?;
        self.tar.get_mut().flush().map_err(io)?;
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
        let shown = String::from_utf8_lossy(&name).into_owned();
        let path = std::path::Path::new(std::ffi::OsStr::from_bytes(&name));
        let mut h = tar::Header::new_ustar();
        h.set_mode(n.mode & 0o7777);
        h.set_uid(u64::from(n.uid));
        h.set_gid(u64::from(n.gid));
        // Names that do not fit the header's fields go in the pax record instead.
        let _ = h.set_username(&n.user);
        let _ = h.set_groupname(&n.group);
        h.set_mtime(n.mtime.secs.max(0) as u64);
        h.set_size(0);
        let mut pax: Vec<(String, Vec<u8>)> = Vec::new();
        pax.push((
            "mtime".into(),
            format!("{}.{:09}", n.mtime.secs, n.mtime.nanos).into_bytes(),
        ));
        if n.user.len() > 31 {
            pax.push(("uname".into(), n.user.clone().into_bytes()));
        }
        if n.group.len() > 31 {
            pax.push(("gname".into(), n.group.clone().into_bytes()));
        }
        for (k, v) in &n.xattrs {
            pax.push((
                format!("SCHILY.xattr.{}", String::from_utf8_lossy(k)),
                v.clone(),
            ));
        }
        self.tar
            .append_pax_extensions(pax.iter().map(|(k, v)| (k.as_str(), v.as_slice())))
            .map_err(io)?;
        match n.kind {
            NodeKind::Dir => {
                h.set_entry_type(tar::EntryType::Directory);
                self.tar
                    .append_data(&mut h, path, std::io::empty())
                    .map_err(io)?;
                self.report.dirs += 1;
            }
            NodeKind::Symlink => {
                h.set_entry_type(tar::EntryType::Symlink);
                let target = std::ffi::OsStr::from_bytes(&n.link_target);
                self.tar.append_link(&mut h, path, target).map_err(io)?;
                self.report.other_entries += 1;
            }
            NodeKind::File => {
                if n.nlink > 1 {
                    if let Some(first) = self.links.get(&(n.dev, n.inode)) {
                        h.set_entry_type(tar::EntryType::Link);
                        let first = std::path::PathBuf::from(std::ffi::OsStr::from_bytes(first));
                        self.tar.append_link(&mut h, path, first).map_err(io)?;
                        self.report.files += 1;
                        return Ok(());
                    }
                    self.links.insert((n.dev, n.inode), name.clone());
                }
                h.set_entry_type(tar::EntryType::Regular);
                h.set_size(n.size);
                let mut chunks = Vec::new();
                for_each_chunk(self.repo, &n.content, &mut |c| {
                    chunks.push(c.id);
                    Ok(())
                })?;
                let mut content = Content {
                    repo: self.repo,
                    chunks: chunks.into_iter(),
                    buf: Vec::new(),
                    pos: 0,
                    left: n.size,
                    path: &shown,
                    error: None,
                };
                let r = self.tar.append_data(&mut h, path, &mut content);
                if let Some(e) = content.error.take() {
                    return Err(e);
                }
                r.map_err(io)?;
                self.report.files += 1;
                self.report.bytes += n.size;
            }
            NodeKind::Fifo | NodeKind::CharDevice | NodeKind::BlockDevice => {
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
                self.report.other_entries += 1;
            }
            // A socket cannot be archived (tar has no entry for it; tar itself
            // skips them too).
            NodeKind::Socket => {}
        }
        Ok(())
    }
}

/// A file's content as a reader of exactly its recorded size: blobs are read one
/// at a time, and content shorter or longer than the size is an error (kept in
/// `error`, since the tar writer only sees an I/O error).
struct Content<'a> {
    repo: &'a Repository,
    chunks: std::vec::IntoIter<BlobId>,
    buf: Vec<u8>,
    pos: usize,
    left: u64,
    path: &'a str,
    error: Option<Error>,
}

impl Read for Content<'_> {
    fn read(&mut self, out: &mut [u8]) -> std::io::Result<usize> {
        while self.pos >= self.buf.len() {
            match self.chunks.next() {
                None => {
                    if self.left > 0 {
                        self.error = Some(Error::Invalid(format!(
                            "{}: its content is {} bytes shorter than its recorded size",
                            self.path, self.left
                        )));
                        return Err(std::io::Error::other("short content"));
                    }
                    return Ok(0);
                }
                Some(id) => match self.repo.read_blob(&id) {
                    Ok(b) => {
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
                    Err(e) => {
                        self.error = Some(e);
                        return Err(std::io::Error::other("unreadable content"));
                    }
                },
            }
        }
        let n = out.len().min(self.buf.len() - self.pos);
        out[..n].copy_from_slice(&self.buf[self.pos..self.pos + n]);
        self.pos += n;
        Ok(n)
    }
}

impl Visitor for Exporter<'_> {
    type Dir = ();
    type Out = ();
    fn enter(&mut self, _: &str, node: Option<&Node>, _: &Tree) -> Result<()> {
        let name = match (node, self.dirs.is_empty()) {
            (None, _) => Vec::new(),
            // The exported directory itself.
            (Some(n), true) => n.name.clone(),
            (Some(n), false) => self.name_in_dir(n),
        };
        self.dirs.push(name);
        Ok(())
    }
    fn entry(&mut self, _: &mut (), _: &str, n: &Node) -> Result<Option<BlobId>> {
        let name = self.name_in_dir(n);
        self.write_node(name, n)?;
        Ok(n.subtree)
    }
    fn unreadable(&mut self, _: &mut (), path: &str, _: &Node, e: Error) -> Result<()> {
        self.report.errors.push((path.to_string(), e.to_string()));
        Ok(())
    }
    fn leave(&mut self, _: &str, _: Option<&Node>, _: ()) -> Result<()> {
        self.dirs.pop();
        Ok(())
    }
    fn child(&mut self, _: &mut (), _: &str, _: &Node, _: ()) -> Result<()> {
        Ok(())
    }
}
