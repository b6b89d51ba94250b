//! `restore --dry-run`: what a restore would write, keep and delete, found by walking
//! the snapshot beside the target without changing anything. The decisions are the
//! restore's own ([`overwrite::decide`]), made on the same `fstatat` of each name in
//! a directory descriptor opened without following symlinks, so the counts are what
//! the restore would do if the target does not change in between.

use super::overwrite::{self, Decision};
use super::{Gone, RestoreIssue, RestoreOptions, RestoreStats, sys, target};
use crate::error::{Error, Result};
use crate::ops::backup::source::Excludes;
use crate::progress::{FileAction, Progress};
use crate::repo::Repository;
use cairn_format::BlobId;
use cairn_format::tree::{Content, Node, NodeKind};
use std::collections::{HashMap, HashSet};
use std::ffi::CStr;
use std::os::fd::{AsFd, BorrowedFd, OwnedFd};
use std::path::PathBuf;

/// What `--delete` leaves where it is ([`target::remove_tree`]): anything on
/// another mount than the target's, and the spared directories.
struct Leave<'a> {
    mount: (u64, u64),
    spared: &'a [(u64, u64)],
    progress: &'a Progress,
}

struct Level {
    todo: Vec<Node>,
    /// The target's directory, when it exists (else everything below is new).
    dir: Option<OwnedFd>,
    path: PathBuf,
    all: bool,
    snap_path: String,
    keep: Option<HashSet<Vec<u8>>>,
    /// Held whole by the snapshot ([`super::Whole`]); else `way` is its path.
    whole: bool,
    way: String,
}

pub(super) fn dry_run(
    repo: &Repository,
    root: &BlobId,
    whole: &super::Whole,
    opts: &RestoreOptions,
    includes: &super::Includes,
    excludes: Option<&Excludes>,
    progress: &Progress,
) -> Result<RestoreStats> {
    let mut stats = RestoreStats::default();
    let target = &opts.target;
    let dir: Option<OwnedFd> = match std::fs::symlink_metadata(target) {
        Ok(m) if m.file_type().is_symlink() => return Err(super::target_is_symlink(target)),
        Ok(m) if m.is_dir() => Some(
            std::fs::File::open(target)
                .map_err(|e| Error::io(target, e))?
                .into(),
        ),
        Ok(_) => return Err(super::not_a_directory(target)),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => None,
        Err(e) => return Err(Error::io(target, e)),
    };
    // What the restore would fail on at once, the preview says too (QA: a dry run
    // into a read-only file system promised hundreds of files): the target, or
    // where it would be made, must be writable.
    let place = where_it_would_be_made(target);
    writable(&place).map_err(|e| Error::io(target, e))?;
    let mount = match &dir {
        Some(d) => sys::mount_of(d.as_fd(), c"").map_err(|e| Error::io(target, e))?,
        None => (0, 0),
    };
    let spared = super::spared_dirs(repo);
    let leave = Leave {
        mount,
        spared: &spared,
        progress,
    };
    // `--verbose`: what the restore would do with each file, as it would say it.
    let say = |action: FileAction, path: &std::path::Path, size: u64| {
        if opts.list_files {
            super::list_file(progress, action, path, size);
        }
    };
    let tree = super::load_tree(repo, root, &opts.xattrs)?;
    let unfinished_since = dir
        .as_ref()
        .and_then(|d| super::unfinished::since(d.as_fd()));
    // Said as the restore will say it: it explains entries `--overwrite never`
    // would otherwise keep (QA: the preview listed them updated with no reason).
    if let Some(t) = unfinished_since {
        progress.notice(super::unfinished::notice(target, t));
        stats.unfinished_before = Some(t.0);
    }
    let all = includes.is_empty();
    // A hard-linked file's first name there: its inode when kept as it was, and
    // its path (for the warning the restore gives a name kept apart from it).
    let mut first_links: HashMap<(u64, u64), FirstName> = HashMap::new();
    // A hard-linked file's name kept as it was while it does not look like the
    // snapshot's content: the next name written is a file of its own.
    let mut kept_apart: HashMap<(u64, u64), PathBuf> = HashMap::new();
    // Kept first names whose content was compared with the snapshot's and matched.
    let mut verified: HashSet<(u64, u64)> = HashSet::new();
    let mut stack = vec![Level {
        keep: super::keep_names(
            opts,
            &tree.nodes,
            all,
            includes,
            whole.root(),
            dir.is_none(),
        )
        .map(super::and_the_mark),
        todo: tree.nodes.into_iter().rev().collect(),
        dir,
        path: target.clone(),
        all,
        snap_path: String::new(),
        whole: whole.root(),
        way: String::new(),
    }];
    while let Some(top) = stack.last_mut() {
        if progress.is_cancelled() {
            return Err(Error::Cancelled);
        }
        let Some(node) = top.todo.pop() else {
            if let Some(level) = stack.pop()
                && let (Some(keep), Some(dir)) = (&level.keep, &level.dir)
            {
                let excluded = |n: &[u8]| {
                    super::spared_extra(excludes, includes, level.all, &level.snap_path, n)
                };
                count_extra(
                    dir.as_fd(),
                    keep,
                    &excluded,
                    &level.path,
                    &leave,
                    &mut stats,
                );
                if !level.all {
                    count_chosen_below(
                        dir.as_fd(),
                        keep,
                        &level.snap_path,
                        &level.path,
                        &super::ChosenExtras {
                            mount: leave.mount,
                            spared: leave.spared,
                            excludes,
                            includes,
                        },
                        &leave,
                        &mut stats,
                    );
                }
            }
            continue;
        };
        let (inside, ancestor, snap_path) =
            super::judge(top.all, &top.snap_path, &node.name, includes, excludes);
        if !inside && !ancestor {
            continue;
        }
        // The name's bytes, as the restore joins them (not U+FFFD for bytes
        // that are not UTF-8: `--verbose` spells names as the restore does).
        let path = top
            .path
            .join(<std::ffi::OsStr as std::os::unix::ffi::OsStrExt>::from_bytes(&node.name));
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
        // A directory in the way of a non-directory: cleared (counted) or reported.
        let clear = |stats: &mut RestoreStats| {
            dir_in_the_way(parent, &name, existing.as_ref(), &path, opts, &leave, stats)
        };
        let decide = |st: Option<&sys::Stat>| match parent {
            Some(p) => overwrite::decide(repo, opts, unfinished_since, p, &name, st, &node),
            None => Decision::Write,
        };
        match node.kind {
            NodeKind::Dir => {
                let other_there = existing.is_some_and(|st| st.kind() != libc::S_IFDIR);
                if let Some(st) = existing.as_ref().filter(|_| other_there)
                    && decide(Some(st)) != Decision::Write
                {
                    // As the restore warns.
                    progress.warning(
                        &path,
                        "kept as it is (--overwrite): it is not a directory, where the \
                         snapshot has one, so nothing below it was restored",
                    );
                    say(FileAction::Unchanged, &path, 0);
                    kept(&mut stats, st);
                    continue;
                }
                if existing
                    .as_ref()
                    .is_some_and(|st| st.kind() == libc::S_IFDIR && spared.contains(&st.id()))
                {
                    issue(&mut stats, path, super::REPOSITORY_HERE.into());
                    continue;
                }
                // As the restore does: a directory there keeps its metadata where
                // the mode keeps existing entries.
                match &existing {
                    Some(st)
                        if st.kind() == libc::S_IFDIR
                            && overwrite::keeps_dir(
                                opts.overwrite,
                                unfinished_since,
                                st,
                                &node,
                            ) =>
                    {
                        say(FileAction::Unchanged, &path, 0);
                        kept(&mut stats, st)
                    }
                    _ => {
                        let dir = existing.as_ref().filter(|_| !other_there);
                        let action = overwrite::dir_action_at(
                            parent,
                            &name,
                            dir,
                            other_there,
                            &node,
                            opts.owners,
                            &opts.xattrs,
                            opts.overwrite,
                        );
                        say(action, &path, 0);
                        // As the restore counts it: already the snapshot's, kept.
                        match dir {
                            Some(st) if action == FileAction::Unchanged => kept(&mut stats, st),
                            _ => stats.dirs += 1,
                        }
                    }
                }
                let sub = match (&existing, parent) {
                    (Some(st), Some(p)) if st.kind() == libc::S_IFDIR => {
                        match sys::open_at(p, &name, libc::O_RDONLY | libc::O_DIRECTORY, 0) {
                            Ok(fd) => Some(fd),
                            // The user's own, not readable now: the restore gives it
                            // the owner's rwx and restores into it; its entries are
                            // counted as if it were empty.
                            Err(e)
                                if e.raw_os_error() == Some(libc::EACCES)
                                    && st.uid == sys::euid() =>
                            {
                                progress.notice(format!(
                                    "{}: not readable now: what the snapshot has in it is \
                                     counted as written (the restore makes it readable)",
                                    path.display()
                                ));
                                None
                            }
                            Err(e) => {
                                issue(&mut stats, path, format!("opening it: {e}"));
                                continue;
                            }
                        }
                    }
                    _ => None,
                };
                let tree = match node
                    .subtree
                    .map(|t| super::load_tree(repo, &t, &opts.xattrs))
                {
                    Some(Ok(t)) => t.nodes,
                    Some(Err(e)) => {
                        issue(&mut stats, path, format!("directory contents lost: {e}"));
                        continue;
                    }
                    None => Vec::new(),
                };
                let (is_whole, way) = if top.whole {
                    (true, String::new())
                } else {
                    whole.below(&top.way, &node.name)
                };
                stack.push(Level {
                    keep: super::keep_names(opts, &tree, inside, includes, is_whole, sub.is_none()),
                    whole: is_whole,
                    way,
                    todo: tree.into_iter().rev().collect(),
                    dir: sub,
                    path,
                    all: inside,
                    snap_path: if inside && excludes.is_none() {
                        String::new()
                    } else {
                        snap_path
                    },
                });
            }
            _ if !inside => {}
            NodeKind::Socket => stats.sockets_skipped += 1,
            NodeKind::File => {
                let key = (node.dev, node.inode);
                // As the restore judges: a first name kept as it was is compared
                // with the snapshot before another name would be linked to it; one
                // that differs is no first name.
                if node.nlink > 1
                    && !verified.contains(&key)
                    && let Some((Some(first), first_path)) = first_links.get(&key)
                    && existing.as_ref().is_none_or(|st| {
                        st.id() != *first
                            && overwrite::replaces_other_name(
                                overwrite::effective(opts.overwrite, unfinished_since, st),
                                st,
                                &node,
                            )
                    })
                {
                    if holds_the_snapshots(repo, first_path, *first, &node) {
                        verified.insert(key);
                    } else if let Some((_, first_path)) = first_links.remove(&key) {
                        if existing.is_some() {
                            progress.warning(&path, &super::not_linked_warning(&first_path));
                        } else {
                            kept_apart.insert(key, first_path);
                        }
                    }
                }
                if node.nlink > 1
                    && let Some((first, first_path)) = first_links.get(&key)
                {
                    // As the restore decides (`never`; `if-newer` when the
                    // name there is newer than the snapshot's).
                    match &existing {
                        Some(st)
                            if Some(st.id()) == *first
                                || !overwrite::replaces_other_name(
                                    overwrite::effective(opts.overwrite, unfinished_since, st),
                                    st,
                                    &node,
                                ) =>
                        {
                            if Some(st.id()) != *first {
                                progress.warning(
                                    &path,
                                    &format!(
                                        "kept as it is (--overwrite), so it is not a name of \
                                         {}, as it is in the snapshot",
                                        first_path.display()
                                    ),
                                );
                            }
                            say(FileAction::Unchanged, &path, node.size);
                            kept(&mut stats, st)
                        }
                        _ => {
                            if clear(&mut stats) {
                                say(FileAction::written(existing.is_some()), &path, node.size);
                                stats.files += 1;
                            }
                        }
                    }
                    continue;
                }
                let d = decide(existing.as_ref());
                // As the restore does: a name becomes the first of its inode's names
                // only when it is there afterwards (kept, or written).
                let there = match (d, &existing) {
                    // Kept by `never` or `if-newer`, it is what later names link to
                    // only when its size and time say it holds the snapshot's content
                    // (it may hold anything), as the restore judges.
                    (Decision::Keep, Some(st)) => {
                        if let Some(why) = overwrite::kept_other_kind(st, &node) {
                            progress.warning(&path, &why);
                        }
                        say(FileAction::Unchanged, &path, node.size);
                        kept(&mut stats, st);
                        let first = overwrite::effective(opts.overwrite, unfinished_since, st)
                            == overwrite::Overwrite::IfChanged
                            || overwrite::looks_unchanged(st, &node);
                        if !first && node.nlink > 1 {
                            kept_apart.entry(key).or_insert_with(|| path.clone());
                        }
                        first
                    }
                    (Decision::Metadata, _) => {
                        say(FileAction::Updated, &path, node.size);
                        stats.metadata_only += 1;
                        true
                    }
                    _ => {
                        let cleared = clear(&mut stats);
                        // What the index lacks, the restore could not read: said
                        // now, from lookups alone (QA: the dry run promised a
                        // file the restore then failed on).
                        let missing = cleared.then(|| unreadable_content(repo, &node.content));
                        if let Some(Some(why)) = missing {
                            say(FileAction::written(existing.is_some()), &path, node.size);
                            issue_with(
                                &mut stats,
                                path.clone(),
                                format!("content would not be restored in full ({})", why.message),
                                why.lost,
                            );
                        } else if cleared {
                            say(FileAction::written(existing.is_some()), &path, node.size);
                            stats.files += 1;
                            stats.bytes += node.size;
                            if node.nlink > 1
                                && let Some(k) = kept_apart.remove(&key)
                            {
                                progress.warning(&path, &super::own_file_warning(&k));
                            }
                        }
                        cleared
                    }
                };
                // As the restore does: a name written becomes the one later names
                // link to; one kept does only when none is there yet (a name kept
                // apart from the first leaves the first in place).
                if node.nlink > 1 && there {
                    let id = existing.filter(|_| d != Decision::Write).map(|st| st.id());
                    if id.is_none() {
                        first_links.insert(key, (id, path.clone()));
                    } else {
                        first_links.entry(key).or_insert((id, path.clone()));
                    }
                }
            }
            _ => match (decide(existing.as_ref()), &existing) {
                (Decision::Write, _) | (_, None) => {
                    if clear(&mut stats) {
                        say(FileAction::written(existing.is_some()), &path, 0);
                        stats.other += 1;
                    }
                }
                (_, Some(st)) => {
                    if let Some(why) = overwrite::kept_other_kind(st, &node) {
                        progress.warning(&path, &why);
                    }
                    say(FileAction::Unchanged, &path, 0);
                    kept(&mut stats, st)
                }
            },
        }
    }
    // What the restore would report as it went, the dry run reports at its end.
    for i in &stats.issues {
        progress.warning(&i.path, &i.message);
    }
    if let Some(free) = free_bytes(&place)
        && stats.bytes > free
    {
        progress.notice(format!(
            "the file system of {} has {} free, and this restore would write {}: it \
             stops when the disk is full (files with holes take less)",
            target.display(),
            crate::units::bytes(free, 1),
            crate::units::bytes(stats.bytes, 1)
        ));
    }
    Ok(stats)
}

/// The target if it exists, else the nearest directory above it that does (where
/// the restore would make it).
pub(crate) fn where_it_would_be_made(target: &std::path::Path) -> PathBuf {
    let mut p = target.to_path_buf();
    loop {
        if std::fs::symlink_metadata(&p).is_ok() {
            return p;
        }
        match p.parent() {
            Some(up) if !up.as_os_str().is_empty() => p = up.to_path_buf(),
            _ => return PathBuf::from("."),
        }
    }
}

/// Whether this process may write into `dir` (a read-only file system is refused
/// even to root).
pub(crate) fn writable(dir: &std::path::Path) -> std::io::Result<()> {
    use nix::unistd::AccessFlags;
    nix::unistd::faccessat(
        nix::fcntl::AT_FDCWD,
        dir,
        AccessFlags::W_OK,
        nix::fcntl::AtFlags::AT_EACCESS,
    )
    .map_err(std::io::Error::from)
}

/// The bytes an unprivileged writer may still use on `dir`'s file system.
pub(crate) fn free_bytes(dir: &std::path::Path) -> Option<u64> {
    let v = nix::sys::statvfs::statvfs(dir).ok()?;
    Some((v.blocks_available() as u64).saturating_mul(v.fragment_size() as u64))
}

/// Why the restore could not read a file's content, from the index: the first of
/// its chunks or chunk lists that the index does not hold, or a chunk list that
/// does not read (lists are read, as the restore reads them; chunks are not).
/// QA: a file with a chunk list was promised while its chunks were gone.
fn unreadable_content(repo: &Repository, content: &Content) -> Option<super::Failure> {
    let mut missing = None;
    let walked = crate::tree::chunklist::for_each_content_blob(repo, content, &mut |id| {
        if missing.is_none() && !repo.index().contains(&id) {
            missing = Some(id);
        }
        missing.is_none()
    });
    match (missing, walked) {
        (Some(id), _) => Some(super::Failure::error(&Error::BlobNotFound(id))),
        (None, Err(e)) => Some(super::Failure::error(&e)),
        (None, Ok(())) => None,
    }
}

/// A hard-linked file's first name in the target: its (device, inode) when kept
/// as it was, and its path.
type FirstName = (Option<(u64, u64)>, PathBuf);

fn issue(stats: &mut RestoreStats, path: PathBuf, message: String) {
    issue_with(stats, path, message, false);
}

fn issue_with(stats: &mut RestoreStats, path: PathBuf, message: String, lost_data: bool) {
    stats.issues.push(RestoreIssue {
        path,
        message,
        lost_data,
    });
}

/// As the restore counts: a file kept where the snapshot has something else
/// counts its bytes too.
fn kept(stats: &mut RestoreStats, st: &sys::Stat) {
    stats.kept += 1;
    if st.kind() == libc::S_IFREG {
        stats.kept_bytes += st.size;
    }
}

/// A directory where the snapshot has a file, symlink or device (`existing`), as
/// the restore treats it: `--delete` would remove it (counted), else it is reported.
/// `false`: it would stay, and the entry would not be restored.
fn dir_in_the_way(
    parent: Option<BorrowedFd<'_>>,
    name: &CStr,
    existing: Option<&sys::Stat>,
    path: &std::path::Path,
    opts: &RestoreOptions,
    leave: &Leave<'_>,
    stats: &mut RestoreStats,
) -> bool {
    let Some(parent) = parent.filter(|_| existing.is_some_and(|st| st.kind() == libc::S_IFDIR))
    else {
        return true;
    };
    if !opts.delete {
        issue(
            stats,
            path.to_path_buf(),
            "a directory is in the way (--delete replaces it)".into(),
        );
        return false;
    }
    let dir = path.parent().unwrap_or(path);
    match count_removal(parent, name, dir, leave, stats) {
        Gone::All => true,
        Gone::Kept(why) => {
            issue(stats, path.to_path_buf(), why.into());
            false
        }
        Gone::Failed => false,
    }
}

/// Counts what `--delete` would remove from `dir`: the names not in `keep`, each
/// directory with everything in it, nothing on another mount than `mount` (see
/// [`target::remove_tree`]).
fn count_extra(
    dir: BorrowedFd<'_>,
    keep: &HashSet<Vec<u8>>,
    excluded: &dyn Fn(&[u8]) -> bool,
    path: &std::path::Path,
    leave: &Leave<'_>,
    stats: &mut RestoreStats,
) {
    let listed = sys::mount_of(dir, c"").and_then(|m| {
        if m == leave.mount {
            sys::list_dir(dir).map(Some)
        } else {
            Ok(None)
        }
    });
    let names = match listed {
        Ok(Some(n)) => n,
        Ok(None) => {
            stats.mounts_left += 1;
            return;
        }
        Err(e) => {
            issue(
                stats,
                path.to_path_buf(),
                format!("listing it for --delete: {e}"),
            );
            return;
        }
    };
    for name in names
        .into_iter()
        .filter(|n| !keep.contains(n.to_bytes()) && !excluded(n.to_bytes()))
    {
        count_removal(dir, &name, path, leave, stats);
    }
}

/// Counts what `--delete` would remove below the extras of `dir` that the
/// includes do not choose themselves ([`super::ChosenExtras`]): what they choose
/// in them. `snap_path`: `dir` as `ls` prints it.
fn count_chosen_below(
    dir: BorrowedFd<'_>,
    keep: &HashSet<Vec<u8>>,
    snap_path: &str,
    path: &std::path::Path,
    extras: &super::ChosenExtras<'_>,
    leave: &Leave<'_>,
    stats: &mut RestoreStats,
) {
    if extras.includes.matcher.is_none() {
        return;
    }
    // Listed again (the count above listed them): only with include patterns.
    let Ok(names) = sys::list_dir(dir) else {
        return;
    };
    for name in names.iter().filter(|n| !keep.contains(n.to_bytes())) {
        let n = name.to_bytes();
        if !super::spared_extra(extras.excludes, extras.includes, false, snap_path, n)
            || super::is_excluded(extras.excludes, snap_path, n)
        {
            continue;
        }
        let shown = path.join(<std::ffi::OsStr as std::os::unix::ffi::OsStrExt>::from_bytes(n));
        let at = format!("{snap_path}/{}", super::snap_name(n));
        extras.walk(dir, name, shown, at, &mut |found| match found {
            super::Found::Chosen(fd, shown, name) => {
                count_removal(fd, name, shown, leave, stats);
            }
            super::Found::Unlisted(p, e) => {
                issue(stats, p, format!("listing it for --delete: {e}"));
            }
        });
    }
}

/// Counts what `--delete` removes for `name` in `dir`.
fn count_removal(
    dir: BorrowedFd<'_>,
    name: &CStr,
    path: &std::path::Path,
    leave: &Leave<'_>,
    stats: &mut RestoreStats,
) -> Gone {
    let shown =
        path.join(<std::ffi::OsStr as std::os::unix::ffi::OsStrExt>::from_bytes(name.to_bytes()));
    let r = target::count_tree(dir, name, leave.mount, leave.spared);
    let counted = match &r {
        Ok(r) | Err((r, _)) => *r,
    };
    // Listed only when something in it would go: a mount point or the repository
    // itself is left whole.
    // (Listed as "would delete" by the report already, not by --verbose.)
    if counted.removed > 0 {
        stats.would_delete.push(shown.clone());
    }
    if counted.spared_left > 0 {
        stats.repository_left = true;
        leave.progress.warning(&shown, super::SPARED);
    }
    if counted.unlisted > 0 {
        leave.progress.notice(format!(
            "{}: {} not readable now, each counted as one entry: the restore \
             makes them readable to delete them with what they hold",
            shown.display(),
            crate::units::count_is(counted.unlisted, "directory")
        ));
    }
    match r {
        Ok(r) => {
            stats.deleted += r.removed;
            stats.mounts_left += r.mounts_left;
            Gone::of(&r)
        }
        Err((r, e)) => {
            stats.deleted += r.removed;
            stats.mounts_left += r.mounts_left;
            issue(
                stats,
                path.join(String::from_utf8_lossy(name.to_bytes()).as_ref()),
                format!("listing it for --delete: {e}"),
            );
            Gone::Failed
        }
    }
}

/// Whether the file at `first` (a path in the target, whose file must still be
/// `first_id`; not followed if a symlink) holds `node`'s content.
fn holds_the_snapshots(
    repo: &Repository,
    first: &std::path::Path,
    first_id: (u64, u64),
    node: &Node,
) -> bool {
    use std::os::unix::fs::OpenOptionsExt;
    let Ok(mut f) = std::fs::OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_NONBLOCK | libc::O_NOCTTY | libc::O_NOFOLLOW)
        .open(first)
    else {
        return false;
    };
    if !sys::fstat(f.as_fd()).is_ok_and(|st| st.id() == first_id) {
        return false;
    }
    let path = || first.display().to_string();
    overwrite::content_matches(repo, &mut f, node, &path).unwrap_or(false)
}
