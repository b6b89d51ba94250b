use crate::args::{DumpArgs, Global};
use anyhow::Result;
use cairn_core::session::{IndexLoad, Read};

pub fn run(g: &Global, a: &DumpArgs) -> Result<i32> {
    let p = super::progress(g);
    let session = super::session::<Read>(g, "dump", IndexLoad::Placement, &p.progress)?;
    let (_, snap) = session.find_snapshot(&a.snapshot)?;
    let mut out = std::io::stdout().lock();
    if let Some(format) = &a.archive {
        let r = cairn_core::export::export(
            &session,
            &snap.tree_id()?,
            &a.file,
            format.parse()?,
            &mut out,
        )?;
        return Ok(super::export::report(&r));
    }
    cairn_core::dump::dump(&session, &snap.tree_id()?, &a.file, &mut out)?;
    Ok(0)
}
