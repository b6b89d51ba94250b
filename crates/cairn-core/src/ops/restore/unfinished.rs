//! The mark a restore leaves in its target while it runs, so that the next one
//! knows what to distrust.
//!
//! A restore that is cancelled, killed or stopped by an error leaves files behind
//! that are not the snapshot's yet: cut short, or whole but without their mode and
//! times. They carry the time they were written, which `--overwrite if-newer` takes
//! for "newer than the snapshot", and `never` keeps whatever is there: "run it
//! again to finish" would finish nothing. So a restore first leaves the file
//! [`MARK`] in its target, and removes it when it left no file cut short (an
//! attribute or a device it could not set is no unfinished work) and either the
//! mark was its own or it restored everything (no include or exclude;
//! `--image-fs /`): a restore of a part after an unfinished one says nothing of
//! the rest. The mark lists the selection (the tree and the include and exclude
//! patterns) of each restore that met it; one that finishes takes its own off the
//! list (it rewrote what an unfinished run of it left), and the mark goes with the
//! list's last: a rerun of the unfinished restore of a part takes the mark away.
//! The next restore that finds
//! it treats every entry changed since the mark's time as `if-changed` would when
//! `--overwrite` is `never` or `if-newer`: rewritten unless it is the snapshot's
//! (size and time, else content). What had been there before the unfinished
//! restore keeps the rule asked for. `restore --image-fs` does the same.

use super::sys;
use std::ffi::CStr;
use std::io::{Read, Write};
use std::os::fd::AsFd;
use std::os::fd::BorrowedFd;

/// The mark's name, in the target directory.
pub(crate) const MARK: &CStr = c".cairn-restore-unfinished";

/// The time of the mark an unfinished restore left in the target `root`, if any.
pub(crate) fn since(root: BorrowedFd<'_>) -> Option<(i64, u32)> {
    sys::stat_at(root, MARK)
        .ok()
        .filter(|st| st.kind() == libc::S_IFREG)
        .map(|st| st.mtime)
}

/// What a restore into `target` says when it finds a mark of time `t`.
pub(crate) fn notice(target: &std::path::Path, t: (i64, u32)) -> String {
    format!(
        "a restore into {} that started at {} did not finish (or restored only part of a \
         snapshot): what changed there since is rewritten unless it matches the snapshot, \
         even with --overwrite never or if-newer",
        target.display(),
        crate::time::local_display(&crate::time::format_unix(t.0, t.1))
    )
}

/// The text before the selection lines.
const TEXT: &str = "A cairn restore into this directory has not finished.\n\
     The next restore here rewrites what changed since this file's time, unless it \
     matches the snapshot; it removes this file once everything is restored.\n";

/// A mark longer than this is not read: it is not one restore wrote.
const MARK_MAX: usize = 64 * 1024;

/// What a restore restores, as the mark lists it: `TREE:PATTERNS`, a hash of the
/// tree and one of the patterns that choose from it. Two restores with the same
/// selection write the same entries; a restore of a whole tree writes every
/// entry a restore of a part of that tree writes, and nothing of another tree's.
pub(crate) fn selection(
    root: &[u8],
    includes: &[String],
    iincludes: &[String],
    excludes: &[String],
    iexcludes: &[String],
) -> String {
    let mut h = blake3::Hasher::new();
    let lists = [
        (b'i', includes),
        (b'j', iincludes),
        (b'e', excludes),
        (b'I', iexcludes),
    ];
    for (kind, list) in lists {
        for p in list {
            h.update(&[kind]);
            h.update(&(p.len() as u64).to_le_bytes());
            h.update(p.as_bytes());
        }
    }
    format!(
        "{}:{}",
        hex::encode(&blake3::hash(root).as_bytes()[..16]),
        hex::encode(&h.finalize().as_bytes()[..16])
    )
}

/// The tree part of a selection.
fn tree_of(selection: &str) -> &str {
    selection.split(':').next().unwrap_or(selection)
}

/// Leaves the mark in `root`, listing `selection`. A mark already there keeps its
/// older time and gets `selection` added to its list.
pub(crate) fn mark(root: BorrowedFd<'_>, selection: &str) -> std::io::Result<()> {
    match super::target::create_file(root, MARK) {
        Ok(mut f) => writeln!(f, "{TEXT}selection {selection}"),
        Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => add(root, selection),
        Err(e) => Err(e),
    }
}

/// Adds `selection` to the list of the mark there already, keeping the mark's time
/// (the time is what the next restore distrusts from).
fn add(root: BorrowedFd<'_>, selection: &str) -> std::io::Result<()> {
    let fd = sys::open_at(root, MARK, libc::O_RDWR | libc::O_APPEND, 0)?;
    let st = sys::fstat(fd.as_fd())?;
    let mut f = std::fs::File::from(fd);
    // A mark that lists no part (an older cairn's) or cannot be read says nothing
    // of what was left unfinished: it stays until a restore of everything. (A
    // listed mark's time is kept: what this restore leaves, if it does not finish,
    // is newer.)
    let listed = read_selections(&mut f, &st).unwrap_or_default();
    if listed.is_empty() || listed.iter().any(|l| l == selection) {
        return Ok(());
    }
    f.write_all(format!("selection {selection}\n").as_bytes())?;
    sys::futimens(f.as_fd(), st.atime, st.mtime)
}

/// The selections a mark lists; `None` for one that is not a regular file of at
/// most [`MARK_MAX`] bytes (a mark of an older cairn lists none).
fn read_selections(f: &mut std::fs::File, st: &sys::Stat) -> Option<Vec<String>> {
    if st.kind() != libc::S_IFREG || st.size > MARK_MAX as u64 {
        return None;
    }
    let mut text = String::new();
    (f.take(MARK_MAX as u64 + 1))
        .read_to_string(&mut text)
        .ok()?;
    Some(
        text.lines()
            .filter_map(|l| l.strip_prefix("selection "))
            .map(str::to_string)
            .collect(),
    )
}

/// A restore of `selection` finished and left no file cut short: it takes its
/// selection off the mark's list (what any unfinished restore of the same
/// selection left, it has rewritten), and, when it restored its whole tree
/// (`whole_tree`), every part of that tree; the mark goes when that leaves the
/// list empty. A restore of another snapshot says nothing of what one of this
/// snapshot left (QA: a finished restore of another snapshot took the mark away,
/// and the first one's cut-short files were then kept by `--overwrite never`). A
/// mark that lists nothing (an older cairn's, or unreadable) goes only with a
/// restore of everything (`everything`), as before.
pub(crate) fn finished(
    root: BorrowedFd<'_>,
    selection: &str,
    whole_tree: bool,
    everything: bool,
) -> std::io::Result<()> {
    let fd = match sys::open_at(root, MARK, libc::O_RDWR | libc::O_NONBLOCK, 0) {
        Ok(fd) => fd,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(()),
        // Not a mark a restore left (a symlink, a directory planted under its
        // name): this restore left none, said when it began ([`not_left`]).
        Err(e) if is_not_a_mark(&e) => return Ok(()),
        Err(e) => return Err(e),
    };
    if sys::fstat(fd.as_fd())?.kind() != libc::S_IFREG {
        return Ok(());
    }
    let st = sys::fstat(fd.as_fd())?;
    let mut f = std::fs::File::from(fd);
    let listed = read_selections(&mut f, &st).unwrap_or_default();
    if listed.is_empty() {
        return if everything { clear(root) } else { Ok(()) };
    }
    let covered = |l: &String| l == selection || (whole_tree && tree_of(l) == tree_of(selection));
    let rest: Vec<&String> = listed.iter().filter(|l| !covered(l)).collect();
    if rest.len() == listed.len() {
        return Ok(());
    }
    if rest.is_empty() {
        return clear(root);
    }
    let mut text = TEXT.to_string();
    for l in rest {
        text.push_str(&format!("selection {l}\n"));
    }
    use std::os::unix::fs::FileExt;
    f.write_all_at(text.as_bytes(), 0)?;
    f.set_len(text.len() as u64)?;
    sys::futimens(f.as_fd(), st.atime, st.mtime)
}

/// Whether opening the mark failed because what has its name is no file.
fn is_not_a_mark(e: &std::io::Error) -> bool {
    matches!(
        e.raw_os_error(),
        Some(libc::ELOOP | libc::EISDIR | libc::ENXIO | libc::ENOTDIR)
    )
}

/// What a restore into `target` says when it cannot leave its mark (`e`): the
/// next restore will not know if this one is cut short (QA: a symlink planted
/// under the mark's name ended a complete restore with "Too many levels of
/// symbolic links" naming only the target).
pub(crate) fn not_left(target: &std::path::Path, e: &std::io::Error) -> String {
    let what = if is_not_a_mark(e) || e.kind() == std::io::ErrorKind::AlreadyExists {
        "something else has its name (a symlink or a directory; remove it)".to_string()
    } else {
        e.to_string()
    };
    format!(
        "{} could not be written: {what}; this restore leaves no mark of an unfinished \
         restore, so one cut short here is not told apart by the next",
        target.join(MARK.to_string_lossy().as_ref()).display()
    )
}

/// Removes the mark: a restore finished. What it wrote is put on disk first: a
/// power cut after the mark went and before the kernel wrote the files out would
/// leave them empty or cut short with nothing to say so (their times can reach
/// the disk before their data), and `--overwrite never` would keep them.
pub(crate) fn clear(root: BorrowedFd<'_>) -> std::io::Result<()> {
    sys::sync_fs(root)?;
    match sys::unlink_at(root, MARK) {
        Err(e) if e.kind() != std::io::ErrorKind::NotFound => Err(e),
        _ => Ok(()),
    }
}
