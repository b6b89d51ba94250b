use crate::args::{Global, LsArgs};
use anyhow::Result;
use cairn_core::ls::{Entry, Listing};
use cairn_core::session::{IndexLoad, Read};
use cairn_format::tree::{Node, NodeKind};

fn mode_string(n: &Node) -> String {
    let t = match n.kind {
        NodeKind::Dir => 'd',
        NodeKind::Symlink => 'l',
        NodeKind::Fifo => 'p',
        NodeKind::CharDevice => 'c',
        NodeKind::BlockDevice => 'b',
        NodeKind::Socket => 's',
        NodeKind::File => '-',
    };
    let m = n.mode;
    let mut s = String::from(t);
    for (i, c) in "rwxrwxrwx".chars().enumerate() {
        s.push(if m & (1 << (8 - i)) != 0 { c } else { '-' });
    }
    s
}

pub fn run(g: &Global, a: &LsArgs) -> Result<i32> {
    let p = super::progress(g);
    let session = super::session::<Read>(g, "ls", IndexLoad::Placement, &p.progress)?;
    let (id, snap) = session.find_snapshot(&a.snapshot)?;
    let root = snap.tree_id()?;
    let mut errors = 0;
    let mut entries = Vec::new();
    let mut out = std::io::stdout().lock();
    let mut f = |path: &str, n: &Node| {
        if g.json {
            entries.push(Entry::new(path, n));
        } else if a.long {
            let e = Entry::new(path, n);
            let mut line = format!(
                "{} {:>8} {:>8} {:>12} {} {}",
                mode_string(n),
                if e.user.is_empty() {
                    e.uid.to_string()
                } else {
                    e.user.clone()
                },
                if e.group.is_empty() {
                    e.gid.to_string()
                } else {
                    e.group.clone()
                },
                e.size,
                e.mtime.get(..19).unwrap_or(""),
                path
            );
            if let Some(t) = &e.link_target {
                line.push_str(&format!(" -> {t}"));
            }
            super::out_line(&mut out, &line);
        } else {
            super::out_line(&mut out, path);
        }
    };
    let mut on_err = |path: &str, e: cairn_core::Error| {
        errors += 1;
        eprintln!("error: {path}: {e}");
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
