//! Restoring over a target that already holds files: what to do with each entry that
//! is there already (`--overwrite`), and the content comparison behind `if-changed`
//! and `--verify`.
//!
//! Every decision is made on what `fstatat` (no symlinks followed) says about the
//! name in a directory descriptor restore holds; a file is compared by reading it
//! through a descriptor opened without following symlinks and checked to be the
//! entry that was looked at, chunk by chunk at the snapshot's chunk boundaries,
//! hashing each with the repository's keyed blob hash. Equal hashes mean equal bytes
//! (the same test deduplication relies on), so an equal file is left untouched:
//! not rewritten, not even given a new time.

use super::metadata::XattrSelect;
use super::sys::{self, Stat};
use crate::error::{Error, Result};
use crate::progress::FileAction;
use crate::repo::Repository;
use crate::tree::chunklist::for_each_chunk;
use cairn_format::tree::{Node, NodeKind};
use std::ffi::CStr;
use std::fs::File;
use std::io::Read;
use std::os::fd::BorrowedFd;
use std::str::FromStr;

/// What restore does with an entry that already exists in the target.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum Overwrite {
    /// Replace it.
    Always,
    /// Replace it unless it already holds the snapshot's content: same size and
    /// modification time (and the same bytes, with `--verify`), or (when only the
    /// time differs) the same bytes. A file
    /// with the snapshot's content whose time, permission bits or owner differ gets
    /// the snapshot's metadata.
    #[default]
    IfChanged,
    /// Replace it only when the snapshot's entry is newer (modification time).
    IfNewer,
    /// Leave it alone.
    Never,
}

impl FromStr for Overwrite {
    type Err = Error;
    fn from_str(s: &str) -> Result<Self> {
        Ok(match s {
            "always" => Overwrite::Always,
            "if-changed" => Overwrite::IfChanged,
            "if-newer" => Overwrite::IfNewer,
            "never" => Overwrite::Never,
            _ => {
                return Err(Error::Invalid(format!(
                    "--overwrite {s:?}: expected always, if-changed, if-newer or never"
                )));
            }
        })
    }
}

/// What to do with one entry of the snapshot.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Decision {
    /// Create it (nothing is there) or replace what is there.
    Write,
    /// Leave what is there: it is the snapshot's entry already, or the mode says so.
    Keep,
    /// A file that holds the snapshot's bytes already but not its time, mode or
    /// owner: set its metadata, leave its content.
    Metadata,
}

fn mtime_of(node: &Node) -> (i64, u32) {
    (node.mtime.secs, node.mtime.nanos)
}

/// The mode for the existing entry `st`: `never` and `if-newer` become `if-changed`
/// for an entry changed since a restore that did not finish began (maybe its
/// unfinished work, which must not be kept for its time: [`super::unfinished`]);
/// `always` stays.
pub(crate) fn effective(
    mode: Overwrite,
    unfinished_since: Option<(i64, u32)>,
    st: &Stat,
) -> Overwrite {
    match mode {
        Overwrite::Never | Overwrite::IfNewer
            if unfinished_since.is_some_and(|t| st.mtime >= t) =>
        {
            Overwrite::IfChanged
        }
        m => m,
    }
}

/// What an entry kept by `--overwrite` (never, if-newer) is worth a warning for:
/// another kind of entry than the snapshot's (a FIFO where the snapshot has a
/// file), which the restore then does not give back (QA: kept silently, while a
/// directory in the way was reported).
pub(crate) fn kept_other_kind(st: &Stat, node: &Node) -> Option<String> {
    let kind = st.mode & libc::S_IFMT;
    if kind == node.kind.type_bits() {
        return None;
    }
    let word = |bits: u32| match bits {
        libc::S_IFREG => "a file",
        libc::S_IFDIR => "a directory",
        libc::S_IFLNK => "a symlink",
        libc::S_IFIFO => "a FIFO",
        libc::S_IFCHR => "a character device",
        libc::S_IFBLK => "a block device",
        libc::S_IFSOCK => "a socket",
        _ => "another kind of entry",
    };
    Some(format!(
        "kept as it is (--overwrite): it is {}, where the snapshot has {}",
        word(kind),
        word(node.kind.type_bits())
    ))
}

/// Decides for a non-directory entry `name` of `dir` that should become `node`.
/// `existing` is what `fstatat` found (`None`: nothing there); `opts` gives the
/// mode, whether owners are set and which attributes count; `unfinished_since`
/// may raise the mode ([`effective`]). Content is read only for `if-changed` when
/// size matches and the time does not, or the restore is verified.
///
/// Metadata is set in place only on a file with one name whose owner stays the
/// same. A file with more names could be a hard link to a file outside the target
/// (anyone who can write the target can make one), and a chmod, chown or new time
/// there would change that file too; a file whose owner would change is someone
/// else's content given the snapshot's owner (and set-ID bits): both are replaced
/// by a new file instead.
pub(crate) fn decide(
    repo: &Repository,
    opts: &super::RestoreOptions,
    unfinished_since: Option<(i64, u32)>,
    dir: BorrowedFd<'_>,
    name: &CStr,
    existing: Option<&Stat>,
    node: &Node,
) -> Decision {
    let Some(st) = existing else {
        return Decision::Write;
    };
    let mode = effective(opts.overwrite, unfinished_since, st);
    let (owners, select) = (opts.owners, &opts.xattrs);
    match mode {
        Overwrite::Always => Decision::Write,
        Overwrite::Never => Decision::Keep,
        Overwrite::IfNewer => {
            if snapshot_is_newer(st, node) {
                Decision::Write
            } else {
                Decision::Keep
            }
        }
        Overwrite::IfChanged => {
            if node.kind == NodeKind::File && st.kind() == libc::S_IFREG && st.size == node.size {
                let same_time = st.mtime == mtime_of(node);
                // Size and time are trusted to mean the same bytes, unless the
                // restore is to be verified: then the bytes are compared too, so
                // that a file changed in place with its time put back (damage, a
                // tool that keeps times) is written again, not left unread (QA).
                let mut compared = None;
                let mut same_bytes = || {
                    *compared.get_or_insert_with(|| {
                        matches!(file_matches(repo, dir, name, st, node), Ok(true))
                    })
                };
                let time_says_same = same_time && !opts.verify && !opts.compare_content;
                if same_time
                    && !metadata_differs(st, node, owners)
                    && xattrs_match(dir, name, &node.xattrs, select)
                    && (time_says_same || same_bytes())
                {
                    return Decision::Keep;
                }
                // Metadata in place only on a file whose one name is this and whose
                // owner stays: a chown (and with it set-ID bits) would hand the
                // snapshot's owner whatever the file's owner put there, and that
                // owner could still change the bytes after they were compared. Such
                // files are written anew, by restore, from the snapshot.
                let owner_stays = !owners || (st.uid, st.gid) == (node.uid, node.gid);
                if st.nlink > 1 || !owner_stays {
                    return Decision::Write;
                }
                return if time_says_same || same_bytes() {
                    Decision::Metadata
                } else {
                    Decision::Write
                };
            }
            // A symlink, FIFO or device (cheap to make again, and never changed in
            // place) is kept only with the snapshot's owner, time, mode (not a
            // symlink's: it has none) and attributes too.
            let special = !matches!(node.kind, NodeKind::File | NodeKind::Dir);
            let metadata_same = !special
                || st.mtime == mtime_of(node)
                    && !(owners && (st.uid, st.gid) != (node.uid, node.gid))
                    && (node.kind == NodeKind::Symlink || st.mode & 0o7777 == node.mode & 0o7777)
                    && xattrs_match(dir, name, &node.xattrs, select);
            if same_entry(repo, dir, name, st, node) && metadata_same {
                Decision::Keep
            } else {
                Decision::Write
            }
        }
    }
}

/// Does the mode keep the owner, mode, times and attributes of the directory `st`
/// that was in the target before, where the snapshot has `node`? `never` keeps
/// every existing entry as it is, and `if-newer` one the snapshot's is not newer
/// than; what the snapshot holds below is restored into it all the same.
pub(crate) fn keeps_dir(
    mode: Overwrite,
    unfinished_since: Option<(i64, u32)>,
    st: &Stat,
    node: &Node,
) -> bool {
    match effective(mode, unfinished_since, st) {
        Overwrite::Never => true,
        Overwrite::IfNewer => !snapshot_is_newer(st, node),
        Overwrite::Always | Overwrite::IfChanged => false,
    }
}

/// What `restore --verbose` says of a directory that gets the snapshot's
/// metadata: `dir` is the one that was there (None: made by the restore, where
/// nothing was or, `replaced`, something other than a directory was). Updated
/// when its mode, owner (if restored) or modification time differ, as a file
/// whose metadata only is set; else unchanged.
pub(crate) fn dir_action(
    dir: Option<&Stat>,
    replaced: bool,
    node: &Node,
    owners: bool,
) -> FileAction {
    match dir {
        None => FileAction::written(replaced),
        Some(st) if metadata_differs(st, node, owners) || st.mtime != mtime_of(node) => {
            FileAction::Updated
        }
        Some(_) => FileAction::Unchanged,
    }
}

/// [`dir_action`] for the directory `name` of `parent` under `--overwrite
/// mode`, its extended attributes compared too: one whose only difference is an
/// attribute is updated, not unchanged (the restore sets them back), and so is
/// every existing one under `always`, which sets its metadata again and counts
/// it written (QA r35: listed "unchanged" while the summary said written).
#[allow(clippy::too_many_arguments)]
pub(crate) fn dir_action_at(
    parent: Option<BorrowedFd<'_>>,
    name: &CStr,
    dir: Option<&Stat>,
    replaced: bool,
    node: &Node,
    owners: bool,
    select: &XattrSelect,
    mode: Overwrite,
) -> FileAction {
    match dir_action(dir, replaced, node, owners) {
        FileAction::Unchanged if mode == Overwrite::Always => FileAction::Updated,
        FileAction::Unchanged
            if parent.is_some_and(|p| !xattrs_match(p, name, &node.xattrs, select)) =>
        {
            FileAction::Updated
        }
        a => a,
    }
}

/// Whether `mode` replaces `st`, a name there that is another file than the one
/// the snapshot's earlier name of a hard link became (by a link to that one):
/// `never` keeps it, `if-newer` when it is newer than the snapshot's.
pub(crate) fn replaces_other_name(mode: Overwrite, st: &sys::Stat, node: &Node) -> bool {
    match mode {
        Overwrite::Never => false,
        Overwrite::IfNewer => snapshot_is_newer(st, node),
        Overwrite::IfChanged | Overwrite::Always => true,
    }
}

/// Is the snapshot's entry newer (modification time) than the existing one, which
/// `if-newer` replaces only then?
pub(crate) fn snapshot_is_newer(st: &Stat, node: &Node) -> bool {
    mtime_of(node) > st.mtime
}

/// Does the existing entry look like the snapshot's file by what `if-changed`
/// looks at first: a regular file of its size and modification time?
pub(crate) fn looks_unchanged(st: &Stat, node: &Node) -> bool {
    node.kind == NodeKind::File
        && st.kind() == libc::S_IFREG
        && st.size == node.size
        && st.mtime == mtime_of(node)
}

/// Do the permission bits of the existing file, or its owner when restore sets
/// owners, differ from the snapshot's? (Extended attributes: [`xattrs_match`].)
fn metadata_differs(st: &Stat, node: &Node, owners: bool) -> bool {
    st.mode & 0o7777 != node.mode & 0o7777 || owners && (st.uid, st.gid) != (node.uid, node.gid)
}

/// Are the existing file's extended attributes (its ACLs among them) the
/// snapshot's? An ACL entry added in the target (`setfacl -n` leaves the mode as it
/// was) or a changed attribute must not survive a restore that calls the file
/// unchanged. Read by name in the parent's descriptor (through `/proc/self/fd`;
/// `llistxattr` has no `*at` form), without following a symlink. A user who is not
/// root sees no `trusted.*` attributes, so those are left out of the comparison
/// for one. Any error reading them means "no".
pub(crate) fn xattrs_match(
    dir: BorrowedFd<'_>,
    name: &CStr,
    xattrs: &[(Vec<u8>, Vec<u8>)],
    select: &XattrSelect,
) -> bool {
    use std::os::fd::AsRawFd;
    use std::os::unix::ffi::OsStrExt;
    let mut p = std::path::PathBuf::from(format!("/proc/self/fd/{}", dir.as_raw_fd()));
    p.push(std::ffi::OsStr::from_bytes(name.to_bytes()));
    let Ok(have) = crate::ops::backup::source::read_xattrs(&p) else {
        return false;
    };
    let root = sys::euid() == 0;
    let visible = |k: &[u8]| (root || !k.starts_with(b"trusted.")) && select.wants(k);
    let want = xattrs.iter().filter(|(k, _)| visible(k));
    // What the target holds beyond the snapshot counts only where restore would
    // remove it ([`super::metadata::foreign_xattr`]): a security label the system
    // gives every file is not a difference.
    let snapshot_has = |k: &[u8]| xattrs.iter().any(|(n, _)| n.as_slice() == k);
    have.iter()
        .filter(|(k, _)| visible(k) && (snapshot_has(k) || super::metadata::foreign_xattr(k)))
        .eq(want)
}

/// Is the existing entry already the snapshot's `node` (kind and content; for a
/// regular file size and time, else its bytes)? Any error reading it means "no".
pub(crate) fn same_entry(
    repo: &Repository,
    dir: BorrowedFd<'_>,
    name: &CStr,
    st: &Stat,
    node: &Node,
) -> bool {
    let kind = st.kind();
    match node.kind {
        NodeKind::File => {
            kind == libc::S_IFREG
                && st.size == node.size
                && (st.mtime == mtime_of(node)
                    || matches!(file_matches(repo, dir, name, st, node), Ok(true)))
        }
        NodeKind::Symlink => {
            kind == libc::S_IFLNK
                && sys::readlink_at(dir, name).is_ok_and(|t| t == node.link_target)
        }
        NodeKind::Fifo => kind == libc::S_IFIFO,
        NodeKind::CharDevice => kind == libc::S_IFCHR && st.rdev == node.rdev,
        NodeKind::BlockDevice => kind == libc::S_IFBLK && st.rdev == node.rdev,
        NodeKind::Dir => kind == libc::S_IFDIR,
        NodeKind::Socket => kind == libc::S_IFSOCK,
    }
}

/// Opens the regular file `name` of `dir` for reading, checked to be the entry `st`
/// describes (no symlink followed, not swapped in between).
pub(crate) fn open_checked(dir: BorrowedFd<'_>, name: &CStr, st: &Stat) -> std::io::Result<File> {
    let fd = sys::open_at(
        dir,
        name,
        libc::O_RDONLY | libc::O_NOCTTY | libc::O_NONBLOCK,
        0,
    )?;
    let now = sys::fstat(std::os::fd::AsFd::as_fd(&fd))?;
    if now.id() != st.id() || now.kind() != libc::S_IFREG {
        return Err(std::io::Error::other("the file changed while it was read"));
    }
    Ok(File::from(fd))
}

/// Does the regular file `name` of `dir` hold exactly the bytes of `node`? Read once,
/// front to back, each chunk hashed and compared with the snapshot's id; stops at the
/// first difference.
pub(crate) fn file_matches(
    repo: &Repository,
    dir: BorrowedFd<'_>,
    name: &CStr,
    st: &Stat,
    node: &Node,
) -> Result<bool> {
    let path = || String::from_utf8_lossy(name.to_bytes()).into_owned();
    let mut f = open_checked(dir, name, st).map_err(|e| Error::io(path(), e))?;
    content_matches(repo, &mut f, node, &path)
}

/// Does `f` (read from its current position) hold exactly the bytes of `node`, and
/// nothing more? `path` names the file in errors.
pub(crate) fn content_matches(
    repo: &Repository,
    f: &mut File,
    node: &Node,
    path: &dyn Fn() -> String,
) -> Result<bool> {
    let key = repo.key();
    let mut buf = Vec::new();
    let mut differs = false;
    let mut covered = 0u64;
    // The chunk walk is stopped at the first difference (by an error `differs` marks).
    let r = for_each_chunk(repo, &node.content, &mut |c| {
        let len = usize::try_from(c.length)
            .map_err(|_| Error::Invalid(format!("chunk of {} bytes", c.length)))?;
        buf.resize(len, 0);
        match f.read_exact(&mut buf) {
            Ok(()) => {}
            Err(e) if e.kind() == std::io::ErrorKind::UnexpectedEof => {
                differs = true;
                return Err(Error::Cancelled);
            }
            Err(e) => return Err(Error::io(path(), e)),
        }
        covered += c.length;
        if key.blob_id(&buf) != c.id {
            differs = true;
            return Err(Error::Cancelled);
        }
        Ok(())
    });
    match r {
        Ok(()) => {}
        Err(_) if differs => return Ok(false),
        Err(e) => return Err(e),
    }
    if covered != node.size {
        return Ok(false);
    }
    // Nothing after the snapshot's bytes.
    let mut one = [0u8; 1];
    let more = f.read(&mut one).map_err(|e| Error::io(path(), e))?;
    Ok(more == 0)
}

#[cfg(test)]
mod tests {
    use super::*;
    use cairn_format::tree::{ChunkRef, Content};
    use std::io::{Seek, Write};

    /// A file node of two chunks holding `a` then `b`.
    fn node(repo: &Repository, a: &[u8], b: &[u8]) -> Node {
        let mut n = Node::new(b"f".to_vec(), NodeKind::File);
        n.size = (a.len() + b.len()) as u64;
        n.content = Content::Inline(vec![
            ChunkRef {
                id: repo.key().blob_id(a),
                length: a.len() as u64,
            },
            ChunkRef {
                id: repo.key().blob_id(b),
                length: b.len() as u64,
            },
        ]);
        n
    }

    fn matches(repo: &Repository, n: &Node, bytes: &[u8]) -> bool {
        let mut f = tempfile::tempfile().unwrap();
        f.write_all(bytes).unwrap();
        f.rewind().unwrap();
        content_matches(repo, &mut f, n, &|| "f".into()).unwrap()
    }

    #[test]
    fn only_the_exact_bytes_match() {
        let repo = crate::testutil::mem_repo();
        let n = node(&repo, b"first chunk", b"second");
        assert!(matches(&repo, &n, b"first chunksecond"));
        assert!(!matches(&repo, &n, b"first chunkSecond"), "a changed byte");
        assert!(!matches(&repo, &n, b"first chunksecond!"), "a byte more");
        assert!(!matches(&repo, &n, b"first chunksecon"), "a byte less");
        assert!(!matches(&repo, &n, b""), "empty");
    }

    #[test]
    fn modes_parse_and_bad_ones_are_named() {
        assert_eq!("if-newer".parse::<Overwrite>().unwrap(), Overwrite::IfNewer);
        assert_eq!(Overwrite::default(), Overwrite::IfChanged);
        let e = "sometimes".parse::<Overwrite>().unwrap_err().to_string();
        assert!(e.contains("sometimes") && e.contains("if-changed"), "{e}");
    }
}
