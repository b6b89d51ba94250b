use crate::args::Global;
use crate::ui;
use anyhow::Result;
use cairn_core::repo::info::SnapshotInfo;

pub fn run(g: &Global) -> Result<i32> {
    let p = super::progress(g);
    let repo = super::open(g, &p.progress)?;
    let (snaps, bad) = repo.snapshots()?;
    for e in &bad {
        p.progress.warning_msg(e.to_string());
    }
    if g.json {
        let v: Vec<SnapshotInfo> = snaps
            .iter()
            .map(|(id, s)| SnapshotInfo::of(id, s))
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
