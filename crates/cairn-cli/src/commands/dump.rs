use crate::args::{DumpArgs, Global};
use anyhow::Result;
use cairn_core::session::{IndexLoad, Read};

pub fn run(g: &Global, a: &DumpArgs) -> Result<i32> {
    let p = super::progress(g);
    let session = super::session::<Read>(g, "dump", IndexLoad::Placement, &p.progress)?;
    let (_, snap) = session.find_snapshot_matching(&a.snapshot, &a.filter.engine())?;
    if a.image_fs.image_fs.is_some() {
        return super::imagefs::dump(&session, &snap, &a.image_fs);
    }
    // Given unless --image-fs names what to dump.
    let file = a.file.as_deref().unwrap_or("/");
    // `-t -` is standard output.
    let target = (a.target.as_deref()).filter(|t| *t != std::path::Path::new("-"));
    // A directory (or the whole snapshot) is written as a tar archive, as restic's
    // dump does: there is no other way to put it on a stream.
    let archive = match &a.archive {
        Some(f) => Some(f.as_str()),
        None => {
            let node = cairn_core::ls::find_node(session.repo(), &snap.tree_id()?, file)?;
            match node {
                None => Some("tar"),
                Some(n) if n.kind == cairn_format::tree::NodeKind::Dir => Some("tar"),
                Some(_) => None,
            }
        }
    };
    if let Some(format) = archive {
        use std::io::IsTerminal;
        if target.is_none() && std::io::stdout().is_terminal() {
            let to = if format == "zip" {
                "> file.zip"
            } else {
                "> file.tar, | tar -x"
            };
            anyhow::bail!(
                "refusing to write a {format} archive of {file} to the terminal: redirect \
                 standard output ({to}) or give --target FILE"
            );
        }
        let format: cairn_core::export::Format = format.parse()?;
        let root = snap.tree_id()?;
        let tar = format == cairn_core::export::Format::Tar;
        let (r, aside) = super::export::write_output(
            g,
            session.repo(),
            target,
            tar,
            false,
            cairn_core::export::ExportReport::is_whole,
            |out| cairn_core::export::export(&session, &root, file, format, out),
        )?;
        let code = super::export::report(&r, g.json, g.quiet);
        super::export::incomplete_note(target, aside.as_deref(), g.json);
        return Ok(super::worst(
            code,
            super::image_zeros_warning(
                super::image_unreadable(&snap),
                "the archive",
                cairn_core::repo::is_repaired(&snap),
            ),
        ));
    }
    let root = snap.tree_id()?;
    // A file whose content cannot be read whole is an error (`Incomplete`):
    // nothing is kept.
    super::export::write_output(
        g,
        session.repo(),
        target,
        false,
        true,
        |_| true,
        |out| cairn_core::dump::dump(&session, &root, file, out),
    )?;
    Ok(super::image_zeros_warning(
        super::image_unreadable(&snap),
        file,
        cairn_core::repo::is_repaired(&snap),
    ))
}
