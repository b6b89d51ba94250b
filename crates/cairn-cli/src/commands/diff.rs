use crate::args::{DiffArgs, Global};
use crate::ui;
use anyhow::Result;
use cairn_core::diff::{self, Change};
use cairn_core::session::{IndexLoad, Read};

pub fn run(g: &Global, a: &DiffArgs) -> Result<i32> {
    let p = super::progress(g);
    let session = super::session::<Read>(g, "diff", IndexLoad::Placement, &p.progress)?;
    let (ida, sa) = session.find_snapshot_matching(&a.first, &a.filter.engine())?;
    let (idb, sb) = session.find_snapshot_matching(&a.second, &a.filter.engine())?;
    let r = diff::diff(
        &session,
        &sa.tree_id()?,
        &sb.tree_id()?,
        a.path.as_deref().unwrap_or("/"),
    )?;
    if g.json {
        // As the text: entries with only new metadata are listed with --metadata
        // (the summary counts them either way).
        let mut r = r;
        if !a.metadata {
            r.differences.retain(|d| d.change != Change::Metadata);
        }
        super::print_json(&r)?;
        return Ok(0);
    }
    let mut out = std::io::stdout().lock();
    if !g.quiet {
        super::out_line(
            &mut out,
            &format!(
                "comparing snapshot {} ({}) with {} ({})",
                ida.short(),
                cairn_core::time::local_display(&sa.time),
                idb.short(),
                cairn_core::time::local_display(&sb.time)
            ),
        );
    }
    for d in &r.differences {
        if d.change == Change::Metadata && !a.metadata {
            continue;
        }
        let slash = if d.kind == "dir" { "/" } else { "" };
        super::out_line(
            &mut out,
            &format!("{}    {}{slash}", d.change.mark(), d.path),
        );
    }
    if !g.quiet {
        let s = &r.summary;
        // Sizes that round to the same words but differ are given in bytes
        // (QA: "68.09 KiB -> 68.09 KiB" for a 5-byte change).
        let (before, after) = (
            ui::bytes(s.bytes_modified_before),
            ui::bytes(s.bytes_modified_after),
        );
        let (before, after) =
            if before == after && s.bytes_modified_before != s.bytes_modified_after {
                (
                    format!("{} bytes", s.bytes_modified_before),
                    format!("{} bytes", s.bytes_modified_after),
                )
            } else {
                (before, after)
            };
        super::out_line(
            &mut out,
            &format!(
                "{} added ({}), {} removed ({}), {} modified ({before} -> {after}), {} with new metadata{}",
                s.added,
                ui::bytes(s.bytes_added),
                s.removed,
                ui::bytes(s.bytes_removed),
                s.modified,
                s.metadata,
                if s.type_changed > 0 {
                    format!(", {} changed type", s.type_changed)
                } else {
                    String::new()
                }
            ),
        );
    }
    Ok(0)
}
