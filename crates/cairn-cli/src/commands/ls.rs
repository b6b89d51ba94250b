use crate::args::{Global, LsArgs};
use anyhow::Result;
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
    let (repo, _lock, id, snap) = super::open_snapshot(g, &a.snapshot)?;
    let root = snap.tree_id()?;
    let mut errors = 0;
    let mut entries = Vec::new();
    let mut out = std::io::stdout().lock();
    use std::io::Write;
    let mut f = |p: &str, n: &Node| {
        if g.json {
            entries.push(serde_json::json!({
                "path": p,
                "type": n.kind.name(),
                "mode": n.mode & 0o7777,
                "uid": n.uid, "gid": n.gid, "user": n.user, "group": n.group,
                "size": n.size,
                "mtime": cairn_core::time::format_unix(n.mtime.secs, n.mtime.nanos),
                "link_target": (n.kind == NodeKind::Symlink).then(|| String::from_utf8_lossy(&n.link_target).into_owned()),
            }));
        } else if a.long {
            let mut line = format!(
                "{} {:>8} {:>8} {:>12} {} {}",
                mode_string(n),
                if n.user.is_empty() {
                    n.uid.to_string()
                } else {
                    n.user.clone()
                },
                if n.group.is_empty() {
                    n.gid.to_string()
                } else {
                    n.group.clone()
                },
                n.size,
                cairn_core::time::format_unix(n.mtime.secs, n.mtime.nanos)
                    .get(..19)
                    .unwrap_or(""),
                p
            );
            if n.kind == NodeKind::Symlink {
                line.push_str(&format!(" -> {}", String::from_utf8_lossy(&n.link_target)));
            }
            let _ = writeln!(out, "{line}");
        } else {
            let _ = writeln!(out, "{p}");
        }
    };
    let mut on_err = |p: &str, e: cairn_core::Error| {
        errors += 1;
        eprintln!("error: {p}: {e}");
    };
    cairn_core::ls::walk(
        &repo,
        &root,
        a.path.as_deref().unwrap_or("/"),
        !a.no_recursive,
        &mut f,
        &mut on_err,
    )?;
    if g.json {
        super::print_json(&serde_json::json!({"snapshot": id.to_hex(), "entries": entries}))?;
    }
    Ok(if errors > 0 { 1 } else { 0 })
}
