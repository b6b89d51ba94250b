use crate::args::{ExportArgs, Global};
use anyhow::{Context, Result, bail};
use cairn_core::export::{self, ExportReport, Format};
use cairn_core::session::{IndexLoad, Read};
use std::io::{IsTerminal, Write};

pub fn run(g: &Global, a: &ExportArgs) -> Result<i32> {
    let format: Format = a.format.parse()?;
    if a.output.is_none() && std::io::stdout().is_terminal() {
        bail!(
            "refusing to write a {} archive to the terminal: redirect standard output \
             (> file, | tape) or give --output FILE",
            a.format
        );
    }
    let p = super::progress(g);
    let session = super::session::<Read>(g, "export", IndexLoad::Placement, &p.progress)?;
    let (_, snap) = session.find_snapshot_matching(&a.snapshot, &a.filter.engine())?;
    let root = snap.tree_id()?;
    let path = a.path.as_deref().unwrap_or("/");
    let r = match &a.output {
        None => export::export(&session, &root, path, format, &mut std::io::stdout().lock())?,
        Some(file) => {
            // Written beside the file and renamed when complete: a failed export
            // never leaves a file that looks whole.
            let mut name = file.file_name().unwrap_or_default().to_os_string();
            name.push(".partial");
            let partial = file.with_file_name(name);
            let f = std::fs::File::create(&partial)
                .with_context(|| format!("creating {}", partial.display()))?;
            let mut w = std::io::BufWriter::with_capacity(1 << 20, f);
            let r = export::export(&session, &root, path, format, &mut w).and_then(|r| {
                let f = w
                    .into_inner()
                    .map_err(|e| cairn_core::Error::io(&partial, e.into_error()))?;
                f.sync_all()
                    .map_err(|e| cairn_core::Error::io(&partial, e))?;
                Ok(r)
            });
            let r = match r {
                Ok(r) => r,
                Err(e) => {
                    let _ = std::fs::remove_file(&partial);
                    return Err(e.into());
                }
            };
            std::fs::rename(&partial, file)
                .with_context(|| format!("renaming {} into place", partial.display()))?;
            r
        }
    };
    if g.json {
        // The archive is on standard output unless --output: the report goes to
        // standard error then.
        let json = serde_json::to_string_pretty(&r)?;
        if a.output.is_some() {
            println!("{json}");
        } else {
            let _ = writeln!(std::io::stderr(), "{json}");
        }
    } else if !g.quiet && a.output.is_some() {
        println!(
            "exported {}, {}, {} ({}) to {}",
            crate::ui::count(r.files, "file"),
            crate::ui::count(r.dirs, "directory"),
            crate::ui::count(r.other_entries, "other entry"),
            crate::ui::bytes(r.bytes),
            a.output
                .as_deref()
                .unwrap_or(std::path::Path::new("-"))
                .display()
        );
    }
    Ok(report(&r))
}

/// Prints what an export left out or changed on standard error; the exit code.
pub(super) fn report(r: &ExportReport) -> i32 {
    for (path, e) in &r.errors {
        eprintln!("error: {path}: {e} (left out of the archive)");
    }
    for n in &r.notes {
        eprintln!("note: {n}");
    }
    if r.errors.is_empty() { 0 } else { 3 }
}
