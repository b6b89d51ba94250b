use crate::args::{Global, UnlockArgs};
use anyhow::Result;
use cairn_core::lock;

pub fn run(g: &Global, a: &UnlockArgs) -> Result<i32> {
    let repo = super::open(g)?;
    let removed = lock::remove_locks(&repo, a.remove_all)?;
    let left = lock::list_locks(&repo)?;
    if g.json {
        let j = |l: &lock::LockInfo| {
            serde_json::json!({
                "id": l.hex(),
                "lock": l.lock,
                "stale": l.stale,
                "description": l.describe(),
            })
        };
        super::print_json(&serde_json::json!({
            "removed": removed.iter().map(j).collect::<Vec<_>>(),
            "remaining": left.iter().map(j).collect::<Vec<_>>(),
        }))?;
    } else if !g.quiet {
        for l in &removed {
            println!("removed {}", l.describe());
        }
        for l in &left {
            println!("in use: {}", l.describe());
        }
        if removed.is_empty() && left.is_empty() {
            println!("no locks");
        }
    }
    Ok(0)
}
