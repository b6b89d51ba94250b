use crate::args::{Global, LsArgs};
use anyhow::Result;
use cairn_core::ls::{Entry, Listing};
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
    let mut errors = 0;
    let mut entries = Vec::new();
    let mut out = std::io::stdout().lock();
    let mut f = |path: &str, n: &Node| {
        if g.json {
            entries.push(Entry::new(path, n));
        } else if a.long {
            super::out_line(&mut out, &long_line(&Entry::new(path, n)));
        } else {
            super::out_line(&mut out, path);
        }
    };
    let mut on_err = |path: &str, e: cairn_core::Error| {
        errors += 1;
        eprintln!("error: {}: {e}", crate::ui::printable(path));
    };
    cairn_core::ls::list(
        &session,
        &root,
        a.path.as_deref().unwrap_or("/"),
        !a.no_recursive,
        &mut f,
        &mut on_err,
    )?;
    if g.json {
        super::print_json(&Listing {
            snapshot: id,
            entries,
        })?;
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
