use crate::args::{Global, LsArgs};
use anyhow::Result;
use cairn_core::ls::Entry;
use cairn_core::session::{IndexLoad, Read};
use cairn_format::tree::Node;

/// `ls -l`'s mode column: the type letter and the nine permission bits, with
/// set-user-ID, set-group-ID and sticky shown in the execute places as `ls` does
/// (`s`/`S`, `s`/`S`, `t`/`T`: lower case when the execute bit is set too).
fn mode_string(e: &Entry) -> String {
    let t = match e.kind {
        "dir" => 'd',
        "symlink" => 'l',
        "fifo" => 'p',
        "chardev" => 'c',
        "blockdev" => 'b',
        "socket" => 's',
        _ => '-',
    };
    let mut s = String::from(t);
    for (i, c) in "rwxrwxrwx".chars().enumerate() {
        s.push(if e.mode & (1 << (8 - i)) != 0 { c } else { '-' });
    }
    // (special bit, its column, the letter with and without execute)
    for (bit, at, set, unset) in [
        (0o4000, 3, 's', 'S'),
        (0o2000, 6, 's', 'S'),
        (0o1000, 9, 't', 'T'),
    ] {
        if e.mode & bit != 0 {
            let letter = if s.as_bytes()[at] == b'x' { set } else { unset };
            s.replace_range(at..=at, letter.encode_utf8(&mut [0; 4]));
        }
    }
    s
}

/// One line of a long listing (`ls -l`, `find`): mode, owner, group, size, time, path.
pub(super) fn long_line(e: &Entry) -> String {
    let or_id = |name: &str, id: u32| {
        if name.is_empty() {
            id.to_string()
        } else {
            name.to_string()
        }
    };
    let size = match e.device {
        Some([major, minor]) => format!("{major}, {minor}"),
        None => e.size.to_string(),
    };
    let mut line = format!(
        "{} {:>8} {:>8} {:>12} {} {}",
        mode_string(e),
        or_id(&e.user, e.uid),
        or_id(&e.group, e.gid),
        size,
        cairn_core::time::local_display(&e.mtime),
        e.path
    );
    if let Some(t) = &e.link_target {
        line.push_str(&format!(" -> {t}"));
    }
    line
}

pub fn run(g: &Global, a: &LsArgs) -> Result<i32> {
    // Options that cannot be taken together: refused before anything is read,
    // as a usage error (exit 2).
    let image_fs = a.image_fs.image_fs.is_some();
    if image_fs && (a.sort != "name" || a.reverse) {
        return Err(super::bad_argument(
            "--sort and --reverse order a file snapshot's listing, not --image-fs",
        ));
    }
    if image_fs && a.ncdu {
        // QA r37: ignored, and the plain listing went to ncdu.
        return Err(super::bad_argument(
            "--ncdu writes a file snapshot's tree, not --image-fs's: `cairn mount` the \
             repository, loop-mount the image (`mount -o ro,loop`) and run ncdu there",
        ));
    }
    if image_fs && !a.dirs.is_empty() {
        return Err(super::bad_argument(
            "with --image-fs, the path inside the image is --image-fs's value",
        ));
    }
    if a.ncdu && a.sort != "name" {
        return Err(super::bad_argument(format!(
            "--ncdu writes a tree in name order; --sort {} orders a listing",
            a.sort
        )));
    }
    if a.ncdu && a.dirs.len() > 1 {
        return Err(super::bad_argument(
            "--ncdu writes one directory's tree: give one path",
        ));
    }
    let p = super::progress(g);
    let session = super::session::<Read>(g, "ls", IndexLoad::Placement, &p.progress)?;
    let (id, snap) = session.find_snapshot_matching(&a.snapshot, &a.filter.engine())?;
    if a.image_fs.image_fs.is_some() {
        return super::imagefs::ls(
            g,
            &session,
            (id, &snap),
            &a.image_fs,
            a.long,
            !a.no_recursive,
        );
    }
    let root = snap.tree_id()?;
    if a.ncdu {
        return ncdu(&session, &root, &snap, a);
    }
    // Directories that could not be read: said on stderr as met, and in
    // `--json`'s "errors" (path, message), so that a reader of the document
    // alone knows the listing has gaps (QA: it parsed whole, exit 1 aside).
    let mut errors: Vec<serde_json::Value> = Vec::new();
    let mut out = std::io::BufWriter::new(std::io::stdout().lock());
    // `--json` is one document, `{"snapshot": ID, "entries": [...], "errors":
    // [...]}`, written as the walk goes (an entry a line), so that a snapshot of
    // ten million names costs no more memory to list than to show.
    // The head is written with the first entry, so that a path not found
    // leaves nothing half written.
    let mut doc = super::JsonStream::new(format!(
        "{{\"snapshot\": {}, \"entries\": [",
        serde_json::to_string(&id)?
    ));
    let mut unwritable = None;
    let sorted = a.sort != "name" || a.reverse;
    let mut held: Vec<(SortKey, Entry)> = Vec::new();
    let mut print = |e: &Entry| {
        if g.json {
            let line = match serde_json::to_string(e) {
                Ok(l) => l,
                Err(e) => {
                    // Strings and numbers only, so not expected; if it ever
                    // happens, the listing ends unfinished and says so.
                    unwritable.get_or_insert(e);
                    return;
                }
            };
            doc.item(&mut out, &line);
        } else if a.long {
            super::out_line(&mut out, &long_line(e));
        } else {
            super::out_line(&mut out, &e.path);
        }
    };
    let mut f = |path: &str, n: &Node| {
        let e = Entry::new(path, n);
        if sorted {
            held.push((SortKey::of(&a.sort, n, e.size, path), e));
        } else {
            print(&e);
        }
    };
    let mut on_err = |path: &str, e: cairn_core::Error| {
        crate::ui::entry_error(format!("{path}: {e}"));
        errors.push(serde_json::json!({ "path": path, "message": e.to_string() }));
    };
    // Several paths, as restic's: each is looked up (and spelled as the
    // snapshot names it) before anything is written, so that one not in the
    // snapshot leaves no listing half made. They are listed in name order; a
    // path given twice, or below another listed whole (not with
    // --no-recursive), adds nothing (QA: duplicates).
    let mut paths: Vec<String> = Vec::new();
    for path in a
        .dirs
        .iter()
        .map(String::as_str)
        .chain(a.dirs.is_empty().then_some("/"))
    {
        paths.push(cairn_core::ls::resolve_path(session.repo(), &root, path)?);
    }
    paths.sort_by(|x, y| x.split('/').cmp(y.split('/')));
    paths.dedup();
    if !a.no_recursive {
        let mut kept: Vec<String> = Vec::new();
        for p in paths {
            let inside = kept.last().is_some_and(|k| {
                k == "/"
                    || p.strip_prefix(k.as_str())
                        .is_some_and(|r| r.starts_with('/'))
            });
            if !inside {
                kept.push(p);
            }
        }
        paths = kept;
    }
    for path in &paths {
        // A directory given whose own tree cannot be read is a gap like one
        // met below: said, and the other paths are listed.
        match cairn_core::ls::list(&session, &root, path, !a.no_recursive, &mut f, &mut on_err) {
            Err(e @ cairn_core::Error::Cancelled) => return Err(e.into()),
            Err(e) => on_err(path, e),
            Ok(()) => {}
        }
    }
    if sorted {
        // Equal keys (only by name) stay in the tree's order, reversed with
        // the rest.
        held.sort_by(|x, y| x.0.cmp(&y.0));
        if a.reverse {
            held.reverse();
        }
        for (_, e) in &held {
            print(e);
        }
    }
    if let Some(e) = unwritable {
        anyhow::bail!("an entry of the listing could not be written as JSON: {e}");
    }
    if g.json {
        let errors = serde_json::to_string(&errors)?;
        doc.finish(&mut out, &format!("], \"errors\": {errors}}}"));
    }
    super::flush_output(&mut out)?;
    Ok(if errors.is_empty() { 0 } else { 1 })
}

/// What `ls --sort` orders by, then the path, as restic's (so equal sizes or
/// times list in path order). `Name` keeps the walk's order (depth first, names
/// in byte order), which the stable sort then leaves as it is.
#[derive(PartialEq, Eq, PartialOrd, Ord)]
enum SortKey {
    Name,
    Number(u64, String),
    Time(i64, u32, String),
    /// The extension as Go's `filepath.Ext` (restic's) takes it: from the
    /// name's last `.` on, dot included (`.bashrc` is all extension, `a.` is
    /// `.`), none without a dot.
    Extension(Vec<u8>, String),
}

impl SortKey {
    /// `size`: the size the listing shows (a symlink's is its target's length).
    fn of(by: &str, n: &Node, size: u64, path: &str) -> SortKey {
        let path = path.to_string();
        match by {
            "size" => SortKey::Number(size, path),
            "time" | "mtime" => SortKey::Time(n.mtime.secs, n.mtime.nanos, path),
            "atime" => SortKey::Time(n.atime.secs, n.atime.nanos, path),
            "ctime" => SortKey::Time(n.ctime.secs, n.ctime.nanos, path),
            "extension" => {
                let ext = match n.name.iter().rposition(|&b| b == b'.') {
                    Some(i) => n.name[i..].to_vec(),
                    None => Vec::new(),
                };
                SortKey::Extension(ext, path)
            }
            _ => SortKey::Name,
        }
    }
}

/// `ls --ncdu`: the tree below `a.dirs`' one path in ncdu's JSON export format (version
/// 1.2: a directory is an array, its own entry first; a file an object), written
/// as the walk goes, so a tree of millions of entries costs the depth of it in
/// memory. Sizes are the files' own (what a restore writes): the stored bytes of
/// a deduplicated file are not its alone.
fn ncdu(
    session: &cairn_core::session::Session<Read>,
    root: &cairn_format::BlobId,
    snap: &cairn_format::snapshot::Snapshot,
    a: &LsArgs,
) -> Result<i32> {
    use std::io::Write;
    let path = a.dirs.first().map_or("/", String::as_str);
    let top = cairn_core::ls::find_node(session.repo(), root, path)?;
    if let Some(n) = &top
        && n.kind != cairn_format::tree::NodeKind::Dir
    {
        anyhow::bail!(
            "--ncdu lists a directory, and {path} is a {}",
            n.kind.name()
        );
    }
    // The listing's paths spell the directory so; its own entry comes first.
    let resolved = cairn_core::ls::resolve_path(session.repo(), root, path)?;
    let time = cairn_core::time::parse_rfc3339(&snap.time).unwrap_or(0);
    let info = |name: &str, n: Option<&Node>| {
        let mut o = serde_json::json!({ "name": name });
        if let Some(n) = n {
            use cairn_format::tree::NodeKind;
            let size = if n.kind == NodeKind::File { n.size } else { 0 };
            o["asize"] = size.into();
            o["dsize"] = size.into();
            o["ino"] = n.inode.into();
            o["uid"] = n.uid.into();
            o["gid"] = n.gid.into();
            o["mode"] = (n.mode & 0o7777 | n.kind.type_bits()).into();
            o["mtime"] = n.mtime.secs.into();
            if n.kind == NodeKind::File && n.nlink > 1 {
                o["hlnkc"] = true.into();
                o["nlink"] = n.nlink.into();
            }
            if !matches!(n.kind, NodeKind::File | NodeKind::Dir) {
                o["notreg"] = true.into();
            }
        }
        o.to_string()
    };
    let mut out = std::io::BufWriter::new(std::io::stdout().lock());
    let head = serde_json::json!({
        "progname": "cairn",
        "progver": env!("CARGO_PKG_VERSION"),
        "timestamp": time,
    });
    // `open`: the directories whose arrays are open, innermost last; the first
    // is the listing's root.
    let mut open: Vec<String> = vec![if resolved == "/" {
        String::new()
    } else {
        resolved.clone()
    }];
    let mut failed = None;
    let mut errors = 0;
    let mut w = |s: &str, failed: &mut Option<std::io::Error>| {
        if failed.is_none()
            && let Err(e) = out.write_all(s.as_bytes())
        {
            *failed = Some(e);
        }
    };
    let shown = cairn_core::ls::shown(&resolved);
    w(
        &format!("[1,2,{head},[{}", info(&shown, top.as_ref())),
        &mut failed,
    );
    let mut f = |p: &str, n: &Node| {
        if p == resolved {
            return;
        }
        let (parent, name) = p.rsplit_once('/').unwrap_or(("", p));
        while open.len() > 1 && open.last().is_some_and(|o| o != parent) {
            open.pop();
            w("]", &mut failed);
        }
        let name = cairn_core::ls::shown(name);
        if n.kind == cairn_format::tree::NodeKind::Dir {
            w(&format!(",[{}", info(&name, Some(n))), &mut failed);
            open.push(p.to_string());
        } else {
            w(&format!(",{}", info(&name, Some(n))), &mut failed);
        }
    };
    let mut on_err = |p: &str, e: cairn_core::Error| {
        errors += 1;
        crate::ui::entry_error(format!("{p}: {e}"));
    };
    cairn_core::ls::list(session, root, path, true, &mut f, &mut on_err)?;
    let close = "]".repeat(open.len().saturating_sub(1));
    w(&format!("{close}]]\n"), &mut failed);
    if failed.is_none()
        && let Err(e) = out.flush()
    {
        failed = Some(e);
    }
    if let Some(e) = failed {
        return Err(e.into());
    }
    Ok(if errors > 0 { 1 } else { 0 })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn entry(kind: &'static str, mode: u32) -> Entry {
        Entry {
            path: "/x".into(),
            kind,
            mode,
            uid: 0,
            gid: 0,
            user: String::new(),
            group: String::new(),
            size: 0,
            mtime: String::new(),
            link_target: None,
            device: None,
            flags: String::new(),
        }
    }

    #[test]
    fn special_bits_show_as_ls_shows_them() {
        for (kind, mode, want) in [
            ("file", 0o755, "-rwxr-xr-x"),
            ("file", 0o4755, "-rwsr-xr-x"),
            ("file", 0o4644, "-rwSr--r--"),
            ("file", 0o2755, "-rwxr-sr-x"),
            ("file", 0o2644, "-rw-r-Sr--"),
            ("dir", 0o1777, "drwxrwxrwt"),
            ("dir", 0o1776, "drwxrwxrwT"),
            ("file", 0o7000, "---S--S--T"),
        ] {
            assert_eq!(mode_string(&entry(kind, mode)), want, "{mode:o}");
        }
    }
}
