use crate::args::Global;
use crate::ui;
use anyhow::Result;

pub fn run(g: &Global) -> Result<i32> {
    let repo = super::open(g)?;
    let (snaps, bad) = repo.snapshots()?;
    for e in &bad {
        eprintln!("warning: {e}");
    }
    if g.json {
        let v: Vec<_> = snaps
            .iter()
            .map(|(id, s)| {
                serde_json::json!({
                    "id": id.to_hex(),
                    "short_id": id.short(),
                    "time": s.time,
                    "hostname": s.hostname,
                    "username": s.username,
                    "paths": s.paths,
                    "tags": s.tags,
                    "tree": s.tree,
                    "parent": s.parent,
                    "summary": s.summary,
                })
            })
            .collect();
        super::print_json(&v)?;
    } else {
        println!(
            "{:<10} {:<20} {:<16} {:<12} {:>12}  paths",
            "id", "time", "host", "tags", "size"
        );
        for (id, s) in &snaps {
            let time = s.time.get(..19).unwrap_or(&s.time).replace('T', " ");
            println!(
                "{:<10} {:<20} {:<16} {:<12} {:>12}  {}",
                id.short(),
                time,
                s.hostname,
                s.tags.join(","),
                ui::bytes(s.summary.total_bytes),
                s.paths.join(" ")
            );
        }
        println!("{} snapshots", snaps.len());
    }
    Ok(if bad.is_empty() { 0 } else { 1 })
}
