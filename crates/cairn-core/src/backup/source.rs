//! Reading what the source filesystem says about an entry: lstat fields, owner
//! names, link targets and extended attributes, into a tree [`Node`].

use cairn_format::tree::{Node, NodeKind, Timestamp};
use globset::{GlobBuilder, GlobSet, GlobSetBuilder};
use std::collections::HashMap;
use std::fs::Metadata;
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::{FileTypeExt, MetadataExt};
use std::path::Path;

/// uid/gid -> name, looked up once each.
#[derive(Default)]
pub struct NameCache {
    users: HashMap<u32, String>,
    groups: HashMap<u32, String>,
}

impl NameCache {
    pub fn user(&mut self, uid: u32) -> String {
        cached(&mut self.users, uid, |id| {
            nix::unistd::User::from_uid(id.into())
                .ok()
                .flatten()
                .map(|u| u.name)
        })
    }
    pub fn group(&mut self, gid: u32) -> String {
        cached(&mut self.groups, gid, |id| {
            nix::unistd::Group::from_gid(id.into())
                .ok()
                .flatten()
                .map(|g| g.name)
        })
    }
}

/// A name looked up once per id; ids without a name map to "".
fn cached(
    map: &mut HashMap<u32, String>,
    id: u32,
    look: impl FnOnce(u32) -> Option<String>,
) -> String {
    map.entry(id)
        .or_insert_with(|| look(id).unwrap_or_default())
        .clone()
}

/// Opens a source file for reading without following a symlink put in its place,
/// and without touching its access time where the OS allows it (`O_NOATIME` is
/// refused, EPERM, for files we do not own).
pub fn open_source(path: &Path) -> std::io::Result<std::fs::File> {
    use std::os::unix::fs::OpenOptionsExt;
    std::fs::OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_NOATIME | libc::O_NOFOLLOW)
        .open(path)
        .or_else(|e| {
            if e.raw_os_error() == Some(libc::EPERM) {
                std::fs::OpenOptions::new()
                    .read(true)
                    .custom_flags(libc::O_NOFOLLOW)
                    .open(path)
            } else {
                Err(e)
            }
        })
}

pub fn kind_of(meta: &Metadata) -> NodeKind {
    let ft = meta.file_type();
    if ft.is_dir() {
        NodeKind::Dir
    } else if ft.is_symlink() {
        NodeKind::Symlink
    } else if ft.is_fifo() {
        NodeKind::Fifo
    } else if ft.is_char_device() {
        NodeKind::CharDevice
    } else if ft.is_block_device() {
        NodeKind::BlockDevice
    } else if ft.is_socket() {
        NodeKind::Socket
    } else {
        NodeKind::File
    }
}

fn ts(secs: i64, nanos: i64) -> Timestamp {
    Timestamp {
        secs,
        nanos: nanos.clamp(0, 999_999_999) as u32,
    }
}

/// Builds a node from lstat data. Link targets and xattrs that cannot be read are
/// returned as a warning message alongside the node (the entry itself is kept).
pub fn node_from_metadata(
    name: Vec<u8>,
    path: &Path,
    meta: &Metadata,
    names: &mut NameCache,
) -> (Node, Option<String>) {
    node_reusing_parent(name, path, meta, names, None)
}

/// [`node_from_metadata`], but a link target and xattrs are taken from the parent
/// snapshot's node when it is the same inode with the same ctime: the kernel moves
/// ctime forward on every xattr change (and a symlink's target cannot change in
/// place), so they are what a read would return. This saves an `llistxattr` (a
/// path walk) per unchanged entry.
pub fn node_reusing_parent(
    name: Vec<u8>,
    path: &Path,
    meta: &Metadata,
    names: &mut NameCache,
    parent: Option<&Node>,
) -> (Node, Option<String>) {
    let kind = kind_of(meta);
    let mut node = Node::new(name, kind);
    node.mode = meta.mode();
    node.uid = meta.uid();
    node.gid = meta.gid();
    node.user = names.user(meta.uid());
    node.group = names.group(meta.gid());
    node.mtime = ts(meta.mtime(), meta.mtime_nsec());
    node.atime = ts(meta.atime(), meta.atime_nsec());
    node.ctime = ts(meta.ctime(), meta.ctime_nsec());
    node.inode = meta.ino();
    node.dev = meta.dev();
    node.nlink = meta.nlink();
    node.rdev = meta.rdev();
    node.size = if kind == NodeKind::File {
        meta.size()
    } else {
        0
    };
    if let Some(p) = parent
        && p.kind == kind
        && p.ctime == node.ctime
        && p.inode == node.inode
        && p.dev == node.dev
    {
        node.link_target = p.link_target.clone();
        node.xattrs = p.xattrs.clone();
        return (node, None);
    }
    let mut warning = None;
    if kind == NodeKind::Symlink {
        match std::fs::read_link(path) {
            Ok(t) => node.link_target = t.as_os_str().as_bytes().to_vec(),
            Err(e) => warning = Some(format!("reading link target: {e}")),
        }
    }
    match read_xattrs(path) {
        Ok(x) => node.xattrs = x,
        Err(e) => warning = Some(format!("reading extended attributes: {e}")),
    }
    (node, warning)
}

fn read_xattrs(path: &Path) -> std::io::Result<Vec<(Vec<u8>, Vec<u8>)>> {
    let mut out = Vec::new();
    let names = match xattr::list(path) {
        Ok(n) => n,
        // Filesystems without xattr support have none to save.
        Err(e) if e.raw_os_error() == Some(libc::ENOTSUP) => return Ok(out),
        Err(e) => return Err(e),
    };
    for name in names {
        if let Some(v) = xattr::get(path, &name)? {
            out.push((name.as_bytes().to_vec(), v));
        }
    }
    out.sort();
    Ok(out)
}

/// Exclude patterns with restic's meaning: a pattern without `/` matches a name at
/// any depth (`*.tmp`, `node_modules`); a pattern with `/` matches the absolute path
/// (`/home/*/.cache`), and a relative one with `/` matches at any depth.
pub struct Excludes {
    set: GlobSet,
}

impl Excludes {
    pub fn new(patterns: &[String]) -> Result<Self, String> {
        let mut b = GlobSetBuilder::new();
        for p in patterns {
            let p = p.trim_end_matches('/');
            if p.is_empty() {
                continue;
            }
            let full = if p.starts_with('/') {
                p.to_string()
            } else {
                format!("**/{p}")
            };
            let g = GlobBuilder::new(&full)
                .literal_separator(true)
                .backslash_escape(true)
                .build()
                .map_err(|e| format!("invalid exclude pattern {p:?}: {e}"))?;
            b.add(g);
        }
        Ok(Excludes {
            set: b.build().map_err(|e| e.to_string())?,
        })
    }

    pub fn is_excluded(&self, path: &Path) -> bool {
        !self.set.is_empty() && self.set.is_match(path)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn exclude_semantics() {
        let e =
            Excludes::new(&["*.tmp".into(), "/home/*/.cache".into(), "build/out".into()]).unwrap();
        assert!(e.is_excluded(Path::new("/a/b/x.tmp")));
        assert!(!e.is_excluded(Path::new("/a/b/x.tmpl")));
        assert!(e.is_excluded(Path::new("/home/joe/.cache")));
        assert!(!e.is_excluded(Path::new("/home/joe/x/.cache")));
        assert!(e.is_excluded(Path::new("/src/build/out")));
        assert!(!e.is_excluded(Path::new("/src/build/outx")));
    }
}
