use crate::args::{ExportArgs, Global};
use anyhow::{Context, Result, bail};
use cairn_backend::direct::SequentialWriter;
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
        None => {
            let mut out = StdoutArchive::open()?;
            let r = export::export(&session, &root, path, format, out.writer())?;
            out.finish()?;
            r
        }
        Some(file) => {
            // Written beside the file and renamed when complete: a failed export
            // never leaves a file that looks whole.
            let mut name = file.file_name().unwrap_or_default().to_os_string();
            name.push(".partial");
            let partial = file.with_file_name(name);
            let f = std::fs::File::create(&partial)
                .with_context(|| format!("creating {}", partial.display()))?;
            let mut w = SequentialWriter::new(f)
                .with_context(|| format!("opening {}", partial.display()))?;
            let r = export::export(&session, &root, path, format, &mut w).and_then(|r| {
                let f = w.finish().map_err(|e| cairn_core::Error::io(&partial, e))?;
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

/// Standard output for an archive or a file's bytes. Redirected to a regular file
/// (`> archive.tar`), the bulk is written around the page cache
/// ([`SequentialWriter`]); a pipe, a tape or a terminal get ordinary writes, as
/// before.
pub(super) enum StdoutArchive {
    File(SequentialWriter),
    Stream(std::io::StdoutLock<'static>),
}

impl StdoutArchive {
    pub(super) fn open() -> Result<StdoutArchive> {
        use std::os::fd::AsFd;
        let out = std::io::stdout();
        let fd = out
            .as_fd()
            .try_clone_to_owned()
            .context("standard output")?;
        let f = std::fs::File::from(fd);
        if f.metadata().is_ok_and(|m| m.file_type().is_file()) {
            let w = SequentialWriter::new(f).context("standard output")?;
            return Ok(StdoutArchive::File(w));
        }
        Ok(StdoutArchive::Stream(out.lock()))
    }

    pub(super) fn writer(&mut self) -> &mut dyn Write {
        match self {
            StdoutArchive::File(w) => w,
            StdoutArchive::Stream(s) => s,
        }
    }

    /// Writes what is still gathered; the file's position ends after the archive.
    pub(super) fn finish(self) -> Result<()> {
        match self {
            StdoutArchive::File(w) => {
                w.finish().context("writing standard output")?;
            }
            StdoutArchive::Stream(mut s) => s.flush().context("writing standard output")?,
        }
        Ok(())
    }
}
