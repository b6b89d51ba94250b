//! `cairn diff`: what changed between two snapshots.
//!
//! Both trees are walked side by side, name by name (tree entries are sorted by
//! name). A directory whose tree blob is the same in both is unchanged down to its
//! last file and is not read at all, so the cost follows what changed, not the size
//! of the snapshots. A file whose chunk list is the same has the same bytes; one
//! whose list differs changed content; one whose owner, mode, time or xattrs differ
//! changed metadata only.

use crate::error::{Error, Result};
use crate::ops::ls::find_node;
use crate::session::{Access, Session};
use cairn_format::BlobId;
use cairn_format::tree::{Node, NodeKind};

/// How an entry differs.
#[derive(Clone, Copy, Debug, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Change {
    /// Only in the second snapshot.
    Added,
    /// Only in the first.
    Removed,
    /// Content changed (a file's bytes, a symlink's target, a device's number).
    Modified,
    /// Same content; owner, mode, times or extended attributes changed.
    Metadata,
    /// A different kind of entry (a file became a directory, ...).
    TypeChanged,
}

impl Change {
    /// The one-letter mark of `cairn diff`'s listing.
    pub fn mark(self) -> char {
        match self {
            Change::Added => '+',
            Change::Removed => '-',
            Change::Modified => 'M',
            Change::Metadata => 'U',
            Change::TypeChanged => 'T',
        }
    }
}

#[derive(Clone, Debug, serde::Serialize)]
pub struct Difference {
    pub path: String,
    pub change: Change,
    /// The entry's kind in the second snapshot (the first for a removal).
    #[serde(rename = "type")]
    pub kind: &'static str,
    /// For a type change, the kind in the first snapshot.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub type_before: Option<&'static str>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub size_before: Option<u64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub size_after: Option<u64>,
}

/// Counts of a diff, by change.
#[derive(Clone, Debug, Default, serde::Serialize)]
pub struct DiffSummary {
    pub added: u64,
    pub removed: u64,
    pub modified: u64,
    pub metadata: u64,
    pub type_changed: u64,
    /// Bytes of the files added, and of the files removed.
    pub bytes_added: u64,
    pub bytes_removed: u64,
    /// Bytes of modified files, before and after.
    pub bytes_modified_before: u64,
    pub bytes_modified_after: u64,
    /// Directories compared by reading both trees (the rest were the same blob).
    pub trees_compared: u64,
}

/// The path a report names: `/` for the whole snapshot.
pub fn report_path(path: &str) -> String {
    if path.is_empty() {
        "/".into()
    } else {
        path.to_string()
    }
}

/// Compares `path` (a directory or file; `/` for everything) in the snapshots whose
/// root trees are `a` and `b`, handing each difference to `f` as the walk finds
/// it, in tree order: a directory, then what is in it, then its next sibling
/// (names in byte order, so `/a/b` comes before `/a-x`). A path missing in one
/// of them is all added or all removed; missing in both is an error. Memory
/// holds the trees on the way down, not the differences: two snapshots of ten
/// million files that all differ cost no more than two that hardly do.
///
/// A directory whose tree cannot be read on either side (damage) is passed to
/// `on_error` with the error, and the walk goes on past it: what is below it is
/// not compared, everything else is.
pub fn diff_each<A: Access>(
    session: &Session<A>,
    a: &BlobId,
    b: &BlobId,
    path: &str,
    f: &mut dyn FnMut(&Difference),
    on_error: &mut dyn FnMut(&str, Error),
) -> Result<DiffSummary> {
    let repo = session.repo();
    let progress = session.progress();
    // The root has no node of its own: a directory node stands in for it.
    let look = |root: &BlobId| -> Result<Option<Node>> {
        match find_node(repo, root, path) {
            Ok(None) => {
                let mut n = Node::new(Vec::new(), NodeKind::Dir);
                n.subtree = Some(*root);
                Ok(Some(n))
            }
            Ok(Some(n)) => Ok(Some(n)),
            Err(Error::Invalid(_)) => Ok(None),
            Err(e) => Err(e),
        }
    };
    let (sa, sb) = (look(a)?, look(b)?);
    if sa.is_none() && sb.is_none() {
        return Err(Error::Invalid(format!(
            "{}: in neither snapshot",
            crate::ops::ls::shown(path)
        )));
    }
    let base = crate::ops::ls::walk_path(path);
    let mut d = Differ {
        out: f,
        summary: DiffSummary::default(),
    };
    // The directories being compared, innermost last: each with both sides'
    // entries and how far the merge has got. An explicit stack keeps the walk
    // depth first without recursion (any depth).
    let mut open: Vec<Frame> = Vec::new();
    let mut next = d.entry(&base, sa.as_ref(), sb.as_ref());
    loop {
        if let Some((dir, x, y)) = next.take()
            && x != y
        {
            if progress.is_cancelled() {
                return Err(Error::Cancelled);
            }
            d.summary.trees_compared += 1;
            let load = |t: Option<BlobId>| -> Result<Vec<Node>> {
                Ok(match t {
                    Some(t) => repo.load_tree(&t)?.nodes,
                    None => Vec::new(),
                })
            };
            match load(x).and_then(|xs| Ok((xs, load(y)?))) {
                Ok((xs, ys)) => open.push(Frame {
                    dir,
                    xs,
                    ys,
                    i: 0,
                    j: 0,
                }),
                Err(e @ Error::Cancelled) => return Err(e),
                Err(e) => on_error(&dir, e),
            }
        }
        let Some(top) = open.last_mut() else { break };
        // The next name of the merge of both sides (each sorted by name).
        let (l, r) = match (top.xs.get(top.i), top.ys.get(top.j)) {
            (None, None) => {
                open.pop();
                continue;
            }
            (Some(l), Some(r)) if l.name == r.name => {
                top.i += 1;
                top.j += 1;
                (Some(l), Some(r))
            }
            (Some(l), Some(r)) if l.name < r.name => {
                top.i += 1;
                (Some(l), None)
            }
            (Some(l), None) => {
                top.i += 1;
                (Some(l), None)
            }
            (_, r) => {
                top.j += 1;
                (None, r)
            }
        };
        let name = l.or(r).map(|n| n.name.as_slice()).unwrap_or_default();
        let p = format!("{}/{}", top.dir, crate::ops::ls::escape_name(name));
        next = d.entry(&p, l, r);
        progress.entry_done();
    }
    Ok(d.summary)
}

/// A pair of directories being compared (see [`diff_each`]).
struct Frame {
    dir: String,
    xs: Vec<Node>,
    ys: Vec<Node>,
    i: usize,
    j: usize,
}

struct Differ<'f> {
    out: &'f mut dyn FnMut(&Difference),
    summary: DiffSummary,
}

impl Differ<'_> {
    fn push(&mut self, path: &str, change: Change, x: Option<&Node>, y: Option<&Node>) {
        let size = |n: Option<&Node>| n.filter(|n| n.kind == NodeKind::File).map(|n| n.size);
        let s = &mut self.summary;
        match change {
            Change::Added => {
                s.added += 1;
                s.bytes_added += size(y).unwrap_or(0);
            }
            Change::Removed => {
                s.removed += 1;
                s.bytes_removed += size(x).unwrap_or(0);
            }
            Change::Modified => {
                s.modified += 1;
                s.bytes_modified_before += size(x).unwrap_or(0);
                s.bytes_modified_after += size(y).unwrap_or(0);
            }
            Change::Metadata => s.metadata += 1,
            Change::TypeChanged => s.type_changed += 1,
        }
        let kind = y.or(x).map_or("dir", |n| n.kind.name());
        (self.out)(&Difference {
            path: path.to_string(),
            change,
            kind,
            type_before: (change == Change::TypeChanged)
                .then(|| x.map(|n| n.kind.name()))
                .flatten(),
            size_before: size(x),
            size_after: size(y),
        });
    }

    /// Compares one entry; returns the pair of trees to compare next when it is a
    /// directory in either snapshot (an added or removed directory is listed whole).
    #[allow(clippy::type_complexity)]
    fn entry(
        &mut self,
        path: &str,
        x: Option<&Node>,
        y: Option<&Node>,
    ) -> Option<(String, Option<BlobId>, Option<BlobId>)> {
        let dir_tree = |n: Option<&Node>| {
            n.filter(|n| n.kind == NodeKind::Dir)
                .and_then(|n| n.subtree)
        };
        match (x, y) {
            (None, None) => None,
            (None, Some(n)) => {
                self.push(path, Change::Added, None, Some(n));
                dir_tree(y).map(|t| (path.to_string(), None, Some(t)))
            }
            (Some(n), None) => {
                self.push(path, Change::Removed, Some(n), None);
                dir_tree(x).map(|t| (path.to_string(), Some(t), None))
            }
            (Some(l), Some(r)) if l.kind != r.kind => {
                self.push(path, Change::TypeChanged, x, y);
                let (tx, ty) = (dir_tree(x), dir_tree(y));
                (tx.is_some() || ty.is_some()).then(|| (path.to_string(), tx, ty))
            }
            (Some(l), Some(r)) => {
                if !same_content(l, r) {
                    self.push(path, Change::Modified, x, y);
                } else if !same_metadata(l, r) {
                    self.push(path, Change::Metadata, x, y);
                }
                let (tx, ty) = (dir_tree(x), dir_tree(y));
                (l.kind == NodeKind::Dir && tx != ty).then(|| (path.to_string(), tx, ty))
            }
        }
    }
}

/// Same content for entries of one kind. A directory's content is its entries,
/// compared on their own, so a directory is never "modified" itself.
fn same_content(l: &Node, r: &Node) -> bool {
    match l.kind {
        NodeKind::File => l.size == r.size && l.content == r.content,
        NodeKind::Symlink => l.link_target == r.link_target,
        NodeKind::CharDevice | NodeKind::BlockDevice => l.rdev == r.rdev,
        NodeKind::Dir | NodeKind::Fifo | NodeKind::Socket => true,
    }
}

/// What a restore would set besides content: owner, mode, modification time,
/// extended attributes, inode flags, and the number of names a file has (a hard link added or
/// removed). Access and change times are not compared: reading a file moves the
/// one, and a restore or a chown that sets what was there moves the other, with
/// nothing a restore would give back differently (a backup re-reads a file whose
/// change time moved, to be safe: its content is what `diff` compares).
pub(crate) fn same_metadata(l: &Node, r: &Node) -> bool {
    l.mode == r.mode
        && l.uid == r.uid
        && l.gid == r.gid
        && l.mtime == r.mtime
        && l.xattrs == r.xattrs
        && l.flags == r.flags
        && (l.kind == NodeKind::Dir || l.nlink == r.nlink)
}
