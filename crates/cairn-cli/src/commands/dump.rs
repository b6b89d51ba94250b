use crate::args::{DumpArgs, Global};
use anyhow::Result;
use cairn_core::session::{IndexLoad, Read};

pub fn run(g: &Global, a: &DumpArgs) -> Result<i32> {
    let p = super::progress(g);
    let session = super::session::<Read>(g, "dump", IndexLoad::Placement, &p.progress)?;
    let (_, snap) = session.find_snapshot(&a.snapshot)?;
    let mut out = std::io::stdout().lock();
    if a.archive.is_some() {
        let r = cairn_core::export::export_tar(&session, &snap.tree_id()?, &a.file, &mut out)?;
        for (path, e) in &r.errors {
            eprintln!("error: {path}: {e} (left out of the archive)");
        }
        return Ok(if r.errors.is_empty() { 0 } else { 3 });
    }
    cairn_core::dump::dump(&session, &snap.tree_id()?, &a.file, &mut out)?;
    Ok(0)
}
