//! Listing a snapshot's tree and finding nodes by path.

use crate::error::{Error, Result};
use crate::repo::Repository;
use crate::session::{Access, Session};
use crate::tree::walk::Visitor;
use cairn_format::BlobId;
use cairn_format::tree::{Node, NodeKind, Tree};

/// Splits a snapshot path (`/home/a/b`) into its components.
/// `path`'s names, `.` and `..` resolved by the text alone as [`normalise`] does,
/// so that ls, dump, export, diff and find take a path spelled with them as
/// restore's `--include` does (QA: `ls SNAP /a/b/..` was "no such file").
fn components(path: &str) -> Vec<&str> {
    let mut out = Vec::new();
    for c in path.split('/') {
        match c {
            "" | "." => {}
            ".." => {
                out.pop();
            }
            c => out.push(c),
        }
    }
    out
}

use crate::tree::RAW_BYTE;
pub use crate::tree::{escape_arg, escape_name, raw_byte};

/// The exact bytes of a name given with stand-ins ([`escape_name`]); `None` when it
/// holds none (it is the name's UTF-8 then).
pub fn unescape_name(name: &str) -> Option<Vec<u8>> {
    let raw = crate::tree::is_stand_in;
    if !name.chars().any(raw) {
        return None;
    }
    let mut out = Vec::with_capacity(name.len());
    for c in name.chars() {
        if raw(c) {
            out.push((u32::from(c) - RAW_BYTE) as u8);
        } else {
            out.extend_from_slice(c.encode_utf8(&mut [0; 4]).as_bytes());
        }
    }
    Some(out)
}

/// A path as listings show it: stand-ins for bytes as U+FFFD.
pub fn shown(path: &str) -> String {
    match unescape_name(path) {
        Some(bytes) => String::from_utf8_lossy(&bytes).into_owned(),
        None => path.to_string(),
    }
}

/// `path` as an absolute path without a trailing slash, `.` and `..` resolved
/// (`..` of the root is the root, as in the kernel), by its text alone (the
/// snapshot may be another machine's). An image restore names its copy after the
/// last component, so that component must be a real name: `/etc/..` must not
/// become a copy named `..`, outside the target; and `--path` spelled any way
/// must select what it names (`/a//b`, `/a/./b`, `/a/c/../b`, `/a/b/`).
pub(crate) fn normalise(path: &str) -> String {
    let mut parts: Vec<&str> = Vec::new();
    for c in path.split('/') {
        match c {
            "" | "." => {}
            ".." => {
                parts.pop();
            }
            c => parts.push(c),
        }
    }
    format!("/{}", parts.join("/"))
}

/// `path` as the walk names it and listings show it: `/a/b` without empty or `.`
/// components (`""` for the root), bytes that are not UTF-8 as their stand-ins.
pub(crate) fn walk_path(path: &str) -> String {
    components(path).iter().map(|c| format!("/{c}")).collect()
}

/// The entry of `tree` named `name`: a name with byte stand-ins by exactly those
/// bytes; else by its UTF-8, else (a name that is not UTF-8, given as listings show
/// it, its invalid bytes as U+FFFD) the one entry whose name reads as `name`;
/// several such are refused as ambiguous.
fn entry_named<'t>(tree: &'t Tree, name: &str, path: &str) -> Result<&'t Node> {
    let missing = || {
        Error::Invalid(format!(
            "{}: no such file or directory in the snapshot",
            shown(path)
        ))
    };
    if let Some(bytes) = unescape_name(name) {
        // Stand-ins as listings print them; or, in a name that holds such a
        // character itself, that character: both there, the name is ambiguous.
        return match (tree.find(&bytes), tree.find(name.as_bytes())) {
            (Some(a), Some(b)) if a.name != b.name => Err(Error::AmbiguousPath(format!(
                "{}: two names in the snapshot match it (one holds the bytes its \
                 characters U+10FF00-U+10FFFF stand for, one those characters themselves): \
                 dump or restore their directory",
                shown(path)
            ))),
            (Some(n), _) | (None, Some(n)) => Ok(n),
            (None, None) => Err(missing()),
        };
    }
    if let Some(n) = tree.find(name.as_bytes()) {
        return Ok(n);
    }
    let mut lossy = tree
        .nodes
        .iter()
        .filter(|n| std::str::from_utf8(&n.name).is_err())
        .filter(|n| String::from_utf8_lossy(&n.name) == name);
    match (lossy.next(), lossy.next()) {
        (Some(n), None) => Ok(n),
        (Some(_), Some(_)) => Err(Error::AmbiguousPath(format!(
            "{path}: several names in the snapshot read as {name:?} (their bytes that are \
             not UTF-8 show as U+FFFD); give the name's own bytes, or name their directory"
        ))),
        _ => Err(missing()),
    }
}

/// The nodes on the way to `path` (empty for the root), each found by
/// [`entry_named`].
/// Walked one name at a time, as a file system resolves a path: `..` leaves a
/// directory that exists, and anything after a name (another name, `.`, `..`,
/// a trailing `/`) needs it to be a directory. Applied to the text first,
/// `missing/..` and `file.txt/../other` were found (QA r13).
fn nodes_to(repo: &Repository, root: &BlobId, path: &str) -> Result<Vec<Node>> {
    // `trees` holds the tree of each directory entered: one more than `out` once
    // the last name's own tree is loaded, as many before.
    let mut trees = vec![repo.load_tree(root)?];
    let mut out: Vec<Node> = Vec::new();
    for c in path.split('/') {
        if out.len() == trees.len()
            && let Some(last) = out.last()
        {
            match (last.kind, last.subtree) {
                (NodeKind::Dir, Some(sub)) => trees.push(repo.load_tree(&sub)?),
                _ => {
                    return Err(Error::Invalid(format!(
                        "{}: not a directory in the snapshot",
                        shown(path)
                    )));
                }
            }
        }
        match c {
            "" | "." => {}
            ".." => {
                if out.pop().is_some() {
                    trees.pop();
                }
            }
            name => {
                let Some(tree) = trees.last() else {
                    return Err(Error::Invalid(format!("{}: no such path", shown(path))));
                };
                out.push(entry_named(tree, name, path)?.clone());
            }
        }
    }
    Ok(out)
}

/// Finds the node at `path`; the root (`/` or empty) has no node and returns `None`.
pub fn find_node(repo: &Repository, root: &BlobId, path: &str) -> Result<Option<Node>> {
    Ok(nodes_to(repo, root, path)?.pop())
}

/// `path` resolved to the names it leads to, as [`escape_name`] writes them (`/`
/// for the root): the one spelling of each entry, whatever way it was given.
pub fn resolve_path(repo: &Repository, root: &BlobId, path: &str) -> Result<String> {
    let names: String = nodes_to(repo, root, path)?
        .iter()
        .map(|n| format!("/{}", escape_name(&n.name)))
        .collect();
    Ok(if names.is_empty() { "/".into() } else { names })
}

/// One entry of a listing, as `cairn ls --json` prints it.
#[derive(Clone, Debug, serde::Serialize)]
pub struct Entry {
    pub path: String,
    #[serde(rename = "type")]
    pub kind: &'static str,
    /// Permission bits (`st_mode & 0o7777`).
    pub mode: u32,
    pub uid: u32,
    pub gid: u32,
    /// The owner's names as backed up; left out where none is known (an id
    /// without a name, a filesystem read in place by `--image-fs`, which keeps
    /// only ids), not given as "" (QA r29).
    #[serde(skip_serializing_if = "String::is_empty")]
    pub user: String,
    #[serde(skip_serializing_if = "String::is_empty")]
    pub group: String,
    pub size: u64,
    pub mtime: String,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub link_target: Option<String>,
    /// A device node's device number (`major`, `minor` as `ls -l` shows them).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub device: Option<[u64; 2]>,
    /// Inode flags as `lsattr` writes them (`ia`: immutable, append only).
    #[serde(skip_serializing_if = "String::is_empty")]
    pub flags: String,
}

impl Entry {
    pub fn new(path: &str, n: &Node) -> Entry {
        Entry {
            path: path.to_string(),
            kind: n.kind.name(),
            mode: n.mode & 0o7777,
            uid: n.uid,
            gid: n.gid,
            user: n.user.clone(),
            group: n.group.clone(),
            // A symlink's size is its target's length, as lstat and the mount say.
            size: if n.kind == NodeKind::Symlink {
                n.link_target.len() as u64
            } else {
                n.size
            },
            mtime: crate::time::format_unix(n.mtime.secs, n.mtime.nanos),
            // Bytes that are not UTF-8 as a name's are, not lost to U+FFFD: two
            // targets differing only there list differently.
            link_target: (n.kind == NodeKind::Symlink).then(|| escape_name(&n.link_target)),
            device: matches!(n.kind, NodeKind::CharDevice | NodeKind::BlockDevice).then(|| {
                [
                    libc::major(n.rdev as libc::dev_t) as u64,
                    libc::minor(n.rdev as libc::dev_t) as u64,
                ]
            }),
            flags: cairn_format::tree::inode_flag_letters(n.flags),
        }
    }
}

/// Calls `f(path, node)` for every entry at and below `path` in the snapshot's tree,
/// depth first, in name order. Unreadable subtrees are passed to `on_error` and
/// skipped.
pub fn list<A: Access>(
    session: &Session<A>,
    root: &BlobId,
    path: &str,
    recursive: bool,
    f: &mut dyn FnMut(&str, &Node),
    on_error: &mut dyn FnMut(&str, Error),
) -> Result<()> {
    walk(
        session.repo(),
        root,
        path,
        &mut |p, n| {
            f(p, n);
            recursive
        },
        on_error,
    )
}

/// What [`search`] found.
#[derive(Clone, Debug, Default, serde::Serialize)]
pub struct Found {
    pub entries: Vec<Entry>,
    /// Entries looked at.
    pub scanned: u64,
    /// More would match: the search stopped at its limit.
    pub truncated: bool,
}

/// The entries at and below `path` whose name contains `needle` (ignoring ASCII
/// case), at most `limit` of them. Once it has them it reads no more trees, so a
/// search that matches early is quick on any snapshot. Unreadable subtrees go to
/// `on_error`.
pub fn search<A: Access>(
    session: &Session<A>,
    root: &BlobId,
    path: &str,
    needle: &str,
    limit: usize,
    on_error: &mut dyn FnMut(&str, Error),
) -> Result<Found> {
    let needle = needle.to_ascii_lowercase().into_bytes();
    let mut found = Found::default();
    walk(
        session.repo(),
        root,
        path,
        &mut |p, n| {
            found.scanned += 1;
            if found.truncated {
                return false;
            }
            let name = n.name.to_ascii_lowercase();
            if needle.is_empty() || name.windows(needle.len()).any(|w| w == needle.as_slice()) {
                if found.entries.len() >= limit {
                    found.truncated = true;
                    return false;
                }
                found.entries.push(Entry::new(p, n));
            }
            true
        },
        on_error,
    )?;
    Ok(found)
}

/// Calls `f(path, node)` for the entry at `path`, the entries in it and, where `f`
/// says so, below them,
/// depth first, in name order. Unreadable subtrees are passed to `on_error` and skipped.
/// `f` returns whether to walk into the entry (if it is a directory).
fn walk(
    repo: &Repository,
    root: &BlobId,
    path: &str,
    f: &mut dyn FnMut(&str, &Node) -> bool,
    on_error: &mut dyn FnMut(&str, Error),
) -> Result<()> {
    let start = find_node(repo, root, path)?;
    let base = walk_path(path);
    let tree_id = match &start {
        None => *root,
        Some(n) => {
            // The start is always walked into: `ls /dir` lists what is in it.
            f(&base, n);
            match n.subtree {
                Some(s) => s,
                None => return Ok(()),
            }
        }
    };
    struct Lister<'a> {
        f: &'a mut dyn FnMut(&str, &Node) -> bool,
        on_error: &'a mut dyn FnMut(&str, Error),
    }
    impl Visitor for Lister<'_> {
        type Dir = ();
        type Out = ();
        fn enter(&mut self, _: &str, _: Option<&Node>, _: &Tree) -> Result<()> {
            Ok(())
        }
        fn entry(&mut self, _: &mut (), path: &str, n: &Node) -> Result<Option<BlobId>> {
            Ok(if (self.f)(path, n) { n.subtree } else { None })
        }
        fn unreadable(&mut self, _: &mut (), path: &str, _: &Node, e: Error) -> Result<()> {
            (self.on_error)(path, e);
            Ok(())
        }
        fn leave(&mut self, _: &str, _: Option<&Node>, _: ()) -> Result<()> {
            Ok(())
        }
        fn child(&mut self, _: &mut (), _: &str, _: &Node, _: ()) -> Result<()> {
            Ok(())
        }
    }
    crate::tree::walk::walk_from(repo, &tree_id, &base, start, &mut Lister { f, on_error })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_travel_as_text_without_losing_a_byte() {
        for name in [
            &b"plain"[..],
            b"\xff-one",
            b"a\xfe\xfdb",
            "caf\u{e9}".as_bytes(),
            b"\x80",
        ] {
            let e = escape_name(name);
            match std::str::from_utf8(name) {
                Ok(s) => assert_eq!((e.as_str(), unescape_name(&e)), (s, None)),
                Err(_) => assert_eq!(unescape_name(&e).as_deref(), Some(name)),
            }
        }
        assert_eq!(shown(&escape_name(b"d/\xff")), "d/\u{FFFD}");
        assert_eq!(
            walk_path(&escape_name(b"/a//\xff/./b/")),
            escape_name(b"/a/\xff/b")
        );
        assert_eq!(
            raw_byte(escape_name(b"\xfe").chars().next().unwrap()),
            Some(0xfe)
        );
        assert_eq!(raw_byte('x'), None);
        // A name holding a character that is itself a stand-in (U+10FFFF) does
        // not read as one holding the byte it stands for (0xff).
        let real = "b\u{10FFFF}".as_bytes();
        let (a, b) = (escape_name(real), escape_name(b"b\xff"));
        assert_ne!(a, b);
        assert_eq!(unescape_name(&a).as_deref(), Some(real));
        assert_eq!(unescape_name(&b).as_deref(), Some(&b"b\xff"[..]));
    }
}
