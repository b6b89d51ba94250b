use crate::args::{DumpArgs, Global};
use anyhow::Result;

pub fn run(g: &Global, a: &DumpArgs) -> Result<i32> {
    let (repo, _lock, _, snap) = super::open_snapshot(g, &a.snapshot)?;
    let mut out = std::io::stdout().lock();
    cairn_core::dump::dump(&repo, &snap.tree_id()?, &a.file, &mut out)?;
    Ok(0)
}
