//! `cairn find`: which snapshots hold a file, by name or path pattern.
//!
//! Snapshots of one machine share almost all their trees (an unchanged directory is
//! the same tree blob in every snapshot), so a subtree found to hold no match is
//! remembered by its id and never read again: searching 25 nightly snapshots costs
//! little more than searching one plus what changed. With a pattern on whole paths
//! the answer also depends on where the tree sits, so the memory is keyed by path
//! too.

use crate::error::{Error, Result};
use crate::ops::ls::Entry;
use crate::session::{Access, Session};
use crate::tree::walk::{Visitor, walk};
use cairn_format::BlobId;
use cairn_format::SnapshotId;
use cairn_format::snapshot::Snapshot;
use cairn_format::tree::{Node, Tree};
use std::collections::HashSet;

/// What `find` looks for: a glob (`*`, `?`, `[...]`, `**`) matched against each
/// entry's name, or, when it contains a `/`, against its whole path in the snapshot
/// (`/home/*/notes.txt`; a relative one like `docs/*.pdf` may start anywhere).
/// A trailing `/` asks for directories only (`cache/`), as in a shell or rsync.
pub struct Pattern {
    text: String,
    glob: crate::pattern::Glob,
    whole_path: bool,
    dirs_only: bool,
}

impl Pattern {
    pub fn new(pattern: &str, ignore_case: bool) -> Result<Pattern> {
        if pattern.is_empty() {
            return Err(Error::BadArgument("the pattern is empty".into()));
        }
        // Paths in a snapshot never end in `/`: without this, `d1/` would be a
        // whole-path pattern that matches nothing (QA).
        let trimmed = pattern.trim_end_matches('/');
        let (body, dirs_only) = match trimmed.is_empty() {
            true => (pattern, false),
            false => (trimmed, trimmed.len() < pattern.len()),
        };
        let whole_path = body.contains('/');
        let anchored = if whole_path && !body.starts_with('/') && !body.starts_with("**") {
            format!("**/{body}")
        } else {
            body.to_string()
        };
        let glob = crate::pattern::Glob::new(&anchored, whole_path, ignore_case)
            .map_err(Error::BadArgument)?;
        Ok(Pattern {
            text: pattern.to_string(),
            glob,
            whole_path,
            dirs_only,
        })
    }

    fn matches(&self, path: &str, node: &Node) -> bool {
        if self.dirs_only && node.kind != cairn_format::tree::NodeKind::Dir {
            false
        } else if self.whole_path {
            self.glob.is_match(path)
        } else {
            self.glob.is_match_bytes(&node.name)
        }
    }
}

/// The matches in one snapshot.
#[derive(Clone, Debug, serde::Serialize)]
pub struct SnapshotMatches {
    pub snapshot: SnapshotId,
    pub time: String,
    pub host: String,
    pub matches: Vec<Entry>,
}

/// A directory whose contents could not be read: its matches are unknown.
#[derive(Clone, Debug, serde::Serialize)]
pub struct Unreadable {
    pub snapshot: SnapshotId,
    pub path: String,
    pub error: String,
}

/// What `cairn find --json` prints.
#[derive(Clone, Debug, serde::Serialize)]
pub struct FindReport {
    pub pattern: String,
    /// Snapshots searched (newest first; with a limit, the search stops early).
    pub snapshots_searched: u64,
    /// Snapshots holding at least one match, newest first.
    pub snapshots: Vec<SnapshotMatches>,
    /// Tree blobs read: the memory of trees without a match keeps this near the
    /// number of distinct directories, not snapshots × directories.
    pub trees_read: u64,
    pub unreadable: Vec<Unreadable>,
}

/// Searches `snapshots` (any order; searched newest first) for entries matching
/// `pattern`; with `newest`, stops once that many snapshots with a match are found.
pub fn find<A: Access>(
    session: &Session<A>,
    snapshots: &[(SnapshotId, Snapshot)],
    pattern: &Pattern,
    newest: Option<usize>,
) -> Result<FindReport> {
    let repo = session.repo();
    let progress = session.progress();
    let mut order: Vec<&(SnapshotId, Snapshot)> = snapshots.iter().collect();
    order.sort_by(|a, b| b.1.time.cmp(&a.1.time).then(b.0.cmp(&a.0)));
    let mut report = FindReport {
        pattern: pattern.text.clone(),
        snapshots_searched: 0,
        snapshots: Vec::new(),
        trees_read: 0,
        unreadable: Vec::new(),
    };
    let mut finder = Finder {
        pattern,
        barren: HashSet::new(),
        matches: Vec::new(),
        unreadable: Vec::new(),
        trees: 0,
    };
    for (id, snap) in order {
        if newest.is_some_and(|n| report.snapshots.len() >= n) {
            break;
        }
        if progress.is_cancelled() {
            return Err(Error::Cancelled);
        }
        report.snapshots_searched += 1;
        // A snapshot whose root cannot be read is one whose matches are
        // unknown, as a directory's below it: the others are still searched
        // (QA r23: one lost root tree had `find` print nothing at all).
        let walked = snap
            .tree_id()
            .map_err(|e| Error::damaged(format!("snapshot {}", id.to_hex()), e))
            .and_then(|root| {
                let key = finder.key(&root, "");
                if !finder.barren.contains(&key) && !walk(repo, &root, &mut finder)? {
                    finder.barren.insert(key);
                }
                Ok(())
            });
        match walked {
            Ok(()) => {}
            Err(Error::Cancelled) => return Err(Error::Cancelled),
            Err(e) => {
                finder.matches.clear();
                finder.unreadable.clear();
                finder.unreadable.push(("/".into(), e.to_string()));
            }
        }
        for (path, error) in finder.unreadable.drain(..) {
            report.unreadable.push(Unreadable {
                snapshot: *id,
                path,
                error,
            });
        }
        if !finder.matches.is_empty() {
            report.snapshots.push(SnapshotMatches {
                snapshot: *id,
                time: snap.time.clone(),
                host: snap.hostname.clone(),
                matches: std::mem::take(&mut finder.matches),
            });
        }
        progress.entry_done();
    }
    report.trees_read = finder.trees;
    Ok(report)
}

struct Finder<'p> {
    pattern: &'p Pattern,
    /// Subtrees known to hold no match (keyed by path too for whole-path patterns).
    barren: HashSet<(BlobId, String)>,
    matches: Vec<Entry>,
    unreadable: Vec<(String, String)>,
    trees: u64,
}

impl Finder<'_> {
    fn key(&self, tree: &BlobId, path: &str) -> (BlobId, String) {
        (
            *tree,
            if self.pattern.whole_path {
                path.to_string()
            } else {
                String::new()
            },
        )
    }
}

impl Visitor for Finder<'_> {
    /// Whether anything in the directory (or below) matched.
    type Dir = bool;
    type Out = bool;

    fn enter(&mut self, _: &str, _: Option<&Node>, _: &Tree) -> Result<bool> {
        self.trees += 1;
        Ok(false)
    }

    fn entry(&mut self, dir: &mut bool, path: &str, node: &Node) -> Result<Option<BlobId>> {
        if self.pattern.matches(path, node) {
            *dir = true;
            self.matches.push(Entry::new(path, node));
        }
        Ok(node
            .subtree
            .filter(|t| !self.barren.contains(&self.key(t, path))))
    }

    fn unreadable(&mut self, dir: &mut bool, path: &str, _: &Node, e: Error) -> Result<()> {
        // Unknown is not "no match": never remembered as barren.
        *dir = true;
        self.unreadable.push((path.to_string(), e.to_string()));
        Ok(())
    }

    fn leave(&mut self, path: &str, node: Option<&Node>, found: bool) -> Result<bool> {
        if !found {
            let tree = match node {
                Some(n) => n.subtree,
                None => None,
            };
            if let Some(t) = tree {
                let key = self.key(&t, path);
                self.barren.insert(key);
            }
        }
        Ok(found)
    }

    fn child(&mut self, parent: &mut bool, _: &str, _: &Node, found: bool) -> Result<()> {
        *parent |= found;
        Ok(())
    }
}
