use crate::args::{DumpArgs, Global};
use anyhow::Result;

pub fn run(g: &Global, a: &DumpArgs) -> Result<i32> {
    let (repo, _lock) = super::open_with_index(g)?;
    let (_, snap) = repo.find_snapshot(&a.snapshot)?;
    let mut out = std::io::stdout().lock();
    cairn_core::dump::dump(&repo, &snap.tree_id()?, &a.file, &mut out)?;
    Ok(0)
}
