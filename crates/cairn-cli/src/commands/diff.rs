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
    let path = a.path.as_deref().unwrap_or("/");
    let mut out = std::io::BufWriter::new(std::io::stdout().lock());
    // Written as the walk finds them, so memory does not grow with the number of
    // differences. `--json` is one document, `{"first", "second", "path",
    // "differences": [...], "summary"}`, a difference a line; its head waits for the first one, so
    // that a path in neither snapshot leaves nothing half written. Entries with
    // only new metadata are listed with --metadata (the summary counts them
    // either way).
    // The snapshots compared, by full id (QA: a script had only the text's).
    let mut doc = super::JsonStream::new(format!(
        "{{\"first\": {}, \"second\": {}, \"path\": {}, \"differences\": [",
        serde_json::to_string(&ida.to_hex())?,
        serde_json::to_string(&idb.to_hex())?,
        serde_json::to_string(&diff::report_path(path))?
    ));
    let mut unwritable = None;
    // The text's first line, written with the first difference or the summary:
    // a path in neither snapshot writes nothing to stdout.
    let mut header = (!g.json && !g.quiet).then(|| {
        format!(
            "comparing snapshot {} ({}) with {} ({})",
            ida.short(),
            cairn_core::time::local_display(&sa.time),
            idb.short(),
            cairn_core::time::local_display(&sb.time)
        )
    });
    let mut each = |d: &diff::Difference| {
        if d.change == Change::Metadata && !a.metadata {
            return;
        }
        if let Some(h) = header.take() {
            super::out_line(&mut out, &h);
        }
        if g.json {
            match serde_json::to_string(d) {
                Ok(line) => doc.item(&mut out, &line),
                Err(e) => {
                    unwritable.get_or_insert(e);
                }
            }
        } else {
            let slash = if d.kind == "dir" { "/" } else { "" };
            super::out_line(
                &mut out,
                &format!("{}    {}{slash}", d.change.mark(), d.path),
            );
        }
    };
    // Directories that could not be read: said on stderr as met, and in
    // `--json`'s "errors" (path, message); the rest is compared, and the exit
    // status is 1.
    let mut errors: Vec<serde_json::Value> = Vec::new();
    let mut on_err = |path: &str, e: cairn_core::Error| {
        ui::entry_error(format!("{path}: {e}"));
        errors.push(serde_json::json!({ "path": path, "message": e.to_string() }));
    };
    let summary = diff::diff_each(
        &session,
        &sa.tree_id()?,
        &sb.tree_id()?,
        path,
        &mut each,
        &mut on_err,
    )?;
    if let Some(e) = unwritable {
        anyhow::bail!("a difference could not be written as JSON: {e}");
    }
    if g.json {
        doc.finish(
            &mut out,
            &format!(
                "], \"summary\": {}, \"errors\": {}}}",
                serde_json::to_string(&summary)?,
                serde_json::to_string(&errors)?
            ),
        );
    }
    if let Some(h) = header.take() {
        super::out_line(&mut out, &h);
    }
    if !g.json && !g.quiet {
        let s = &summary;
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
    super::flush_output(&mut out)?;
    Ok(if errors.is_empty() { 0 } else { 1 })
}
