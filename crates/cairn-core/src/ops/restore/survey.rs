//! `restore --dry-run`: what a restore would write, keep and delete, found by walking
//! the snapshot beside the target without changing anything. The decisions are the
//! restore's own ([`overwrite::decide`]), made on the same `fstatat` of each name in
//! a directory descriptor opened without following symlinks, so the counts are what
//! the restore would do if the target does not change in between.

use super::overwrite::{self, Decision};
use super::{RestoreIssue, RestoreOptions, RestoreStats, selection, sys};
use crate::error::{Error, Result};
use crate::progress::Progress;
use crate::repo::Repository;
use cairn_format::BlobId;
use cairn_format::tree::{Node, NodeKind};
use std::collections::{HashMap, HashSet};
use std::ffi::CString;
use std::os::fd::{AsFd, BorrowedFd, OwnedFd};
use std::path::PathBuf;

struct Level {
    todo: Vec<Node>,
    /// The target's directory, when it exists (else everything below is new).
    dir: Option<OwnedFd>,
    path: PathBuf,
    all: bool,
    snap_path: String,
    keep: Option<HashSet<Vec<u8>>>,
}

pub(super) fn dry_run(
    repo: &Repository,
    root: &BlobId,
    opts: &RestoreOptions,
    includes: &[String],
    progress: &Progress,
) -> Result<RestoreStats> {
    let mut stats = RestoreStats::default();
    let target = &opts.target;
    let dir = match std::fs::symlink_metadata(target) {
        Ok(m) if m.file_type().is_symlink() => return Err(super::target_is_symlink(target)),
        Ok(m) if m.is_dir() => Some(
            std::fs::File::open(target)
                .map_err(|e| Error::io(target, e))?
                .into(),
        ),
        Ok(_) => {
            return Err(Error::Invalid(format!(
                "{} is not a directory",
                target.display()
            )));
        }
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => None,
        Err(e) => return Err(Error::io(target, e)),
    };
    let tree = repo.load_tree(root)?;
    let all = includes.is_empty();
    let mut first_links: HashMap<(u64, u64), Option<(u64, u64)>> = HashMap::new();
    let mut stack = vec![Level {
        keep: (opts.delete && all && dir.is_some())
            .then(|| tree.nodes.iter().map(|n| n.name.clone()).collect()),
        todo: tree.nodes.into_iter().rev().collect(),
        dir,
        path: target.clone(),
        all,
        snap_path: String::new(),
    }];
    while let Some(top) = stack.last_mut() {
        if progress.is_cancelled() {
            return Err(Error::Cancelled);
        }
        let Some(node) = top.todo.pop() else {
            if let Some(level) = stack.pop()
                && let (Some(keep), Some(dir)) = (&level.keep, &level.dir)
            {
                count_extra(dir.as_fd(), keep, &level.path, &mut stats);
            }
            continue;
        };
        let (inside, ancestor, snap_path) = if top.all {
            (true, false, String::new())
        } else {
            let p = format!("{}/{}", top.snap_path, String::from_utf8_lossy(&node.name));
            let (i, a) = selection(&p, includes);
            (i, a, p)
        };
        if !inside && !ancestor {
            continue;
        }
        let path = top.path.join(String::from_utf8_lossy(&node.name).as_ref());
        let name = super::c_name(&node.name).map_err(|e| Error::io(&path, e))?;
        let parent = top.dir.as_ref().map(|d| d.as_fd());
        let existing = match parent.map(|p| sys::stat_at(p, &name)) {
            None => None,
            Some(Ok(st)) => Some(st),
            Some(Err(e)) if e.raw_os_error() == Some(libc::ENOENT) => None,
            Some(Err(e)) => {
                issue(&mut stats, path, format!("looking at the target: {e}"));
                continue;
            }
        };
        let decide = |st: Option<&sys::Stat>| match parent {
            Some(p) => overwrite::decide(repo, opts.overwrite, p, &name, st, &node),
            None => Decision::Write,
        };
        match node.kind {
            NodeKind::Dir => {
                if let Some(st) = &existing
                    && st.kind() != libc::S_IFDIR
                    && decide(Some(st)) != Decision::Write
                {
                    kept(&mut stats, st, &node);
                    continue;
                }
                stats.dirs += 1;
                let sub = match (&existing, parent) {
                    (Some(st), Some(p)) if st.kind() == libc::S_IFDIR => {
                        match sys::open_at(p, &name, libc::O_RDONLY | libc::O_DIRECTORY, 0) {
                            Ok(fd) => Some(fd),
                            Err(e) => {
                                issue(&mut stats, path, format!("opening it: {e}"));
                                continue;
                            }
                        }
                    }
                    _ => None,
                };
                let tree = match node.subtree.map(|t| repo.load_tree(&t)) {
                    Some(Ok(t)) => t.nodes,
                    Some(Err(e)) => {
                        issue(&mut stats, path, format!("directory contents lost: {e}"));
                        continue;
                    }
                    None => Vec::new(),
                };
                stack.push(Level {
                    keep: (opts.delete && inside && sub.is_some())
                        .then(|| tree.iter().map(|n| n.name.clone()).collect()),
                    todo: tree.into_iter().rev().collect(),
                    dir: sub,
                    path,
                    all: inside,
                    snap_path: if inside { String::new() } else { snap_path },
                });
            }
            _ if !inside => {}
            NodeKind::Socket => stats.sockets_skipped += 1,
            NodeKind::File => {
                let key = (node.dev, node.inode);
                if node.nlink > 1
                    && let Some(first) = first_links.get(&key)
                {
                    match &existing {
                        Some(st)
                            if Some(st.id()) == *first
                                || opts.overwrite == overwrite::Overwrite::Never =>
                        {
                            kept(&mut stats, st, &node)
                        }
                        _ => stats.files += 1,
                    }
                    continue;
                }
                let d = decide(existing.as_ref());
                if node.nlink > 1 {
                    let id = existing.filter(|_| d != Decision::Write).map(|st| st.id());
                    first_links.insert(key, id);
                }
                match (d, &existing) {
                    (Decision::Keep, Some(st)) => kept(&mut stats, st, &node),
                    (Decision::Metadata, _) => {
                        stats.metadata_only += 1;
                        stats.kept_bytes += node.size;
                    }
                    _ => {
                        stats.files += 1;
                        stats.bytes += node.size;
                    }
                }
            }
            _ => match (decide(existing.as_ref()), &existing) {
                (Decision::Write, _) | (_, None) => stats.other += 1,
                (_, Some(st)) => kept(&mut stats, st, &node),
            },
        }
    }
    Ok(stats)
}

fn issue(stats: &mut RestoreStats, path: PathBuf, message: String) {
    stats.issues.push(RestoreIssue { path, message });
}

fn kept(stats: &mut RestoreStats, st: &sys::Stat, node: &Node) {
    stats.kept += 1;
    if node.kind == NodeKind::File && st.kind() == libc::S_IFREG {
        stats.kept_bytes += st.size;
    }
}

/// Counts what `--delete` would remove from `dir`: the names not in `keep`, each
/// directory with everything in it.
fn count_extra(
    dir: BorrowedFd<'_>,
    keep: &HashSet<Vec<u8>>,
    path: &std::path::Path,
    stats: &mut RestoreStats,
) {
    let names = match sys::list_dir(dir) {
        Ok(n) => n,
        Err(e) => {
            issue(
                stats,
                path.to_path_buf(),
                format!("listing it for --delete: {e}"),
            );
            return;
        }
    };
    for name in names.into_iter().filter(|n| !keep.contains(n.to_bytes())) {
        match count_tree(dir, name) {
            Ok(n) => stats.deleted += n,
            Err(e) => issue(
                stats,
                path.to_path_buf(),
                format!("listing it for --delete: {e}"),
            ),
        }
    }
}

/// How many entries `name` in `dir` holds, itself included (symlinks not followed).
fn count_tree(dir: BorrowedFd<'_>, name: CString) -> std::io::Result<u64> {
    if sys::stat_at(dir, &name)?.kind() != libc::S_IFDIR {
        return Ok(1);
    }
    let mut count = 1u64;
    let top = sys::open_at(dir, &name, libc::O_RDONLY | libc::O_DIRECTORY, 0)?;
    let names = sys::list_dir(top.as_fd())?;
    let mut stack: Vec<(OwnedFd, Vec<CString>)> = vec![(top, names)];
    while let Some((fd, todo)) = stack.last_mut() {
        let Some(child) = todo.pop() else {
            stack.pop();
            continue;
        };
        count += 1;
        if sys::stat_at(fd.as_fd(), &child)?.kind() == libc::S_IFDIR {
            let sub = sys::open_at(fd.as_fd(), &child, libc::O_RDONLY | libc::O_DIRECTORY, 0)?;
            let names = sys::list_dir(sub.as_fd())?;
            stack.push((sub, names));
        }
    }
    Ok(count)
}
