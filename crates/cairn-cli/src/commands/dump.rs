use crate::args::{DumpArgs, Global};
use anyhow::{Context, Result};
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
    let mut out = super::export::ArchiveOut::stdout()?;
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
        let format: cairn_core::export::Format = format.parse()?;
        let r = cairn_core::export::export(&session, &snap.tree_id()?, file, format, out.writer())?;
        out.finish(format == cairn_core::export::Format::Tar)
            .context("writing standard output")?;
        let code = super::export::report(&r, g.json);
        return Ok(super::worst(
            code,
            super::image_zeros_warning(super::image_unreadable(&snap), "the archive"),
        ));
    }
    cairn_core::dump::dump(&session, &snap.tree_id()?, file, out.writer())?;
    out.finish(false).context("writing standard output")?;
    Ok(super::image_zeros_warning(
        super::image_unreadable(&snap),
        file,
    ))
}
