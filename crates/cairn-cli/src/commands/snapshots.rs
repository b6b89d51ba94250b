use crate::args::{Global, SnapshotsArgs};
use crate::ui;
use anyhow::Result;
use cairn_core::repo::info::SnapshotInfo;

pub fn run(g: &Global, a: &SnapshotsArgs) -> Result<i32> {
    let p = super::progress(g);
    let repo = super::open(g, &p.progress)?;
    let (mut snaps, bad) = repo.snapshots()?;
    // Through a cairn server, a snapshot a host-bound token stored under another
    // host's name is listed (and filtered) as its token's host, as `forget` counts
    // it. Only an admin may read the records; for others nothing changes.
    let claimed: std::collections::HashMap<_, _> = repo
        .attribute_hosts(&mut snaps)
        .unwrap_or_default()
        .into_iter()
        .collect();
    let filter = a.filter.engine();
    snaps.retain(|(_, s)| filter.matches(s));
    // 0: no limit, as restic's.
    if let Some(n) = a.latest.filter(|&n| n > 0) {
        // Oldest first: count from the end, per host and set of paths. Those dated
        // in the future come after every other, as `latest` passes them over.
        let future = |s: &cairn_format::snapshot::Snapshot| {
            cairn_core::time::parse_rfc3339(&s.time).is_some_and(cairn_core::time::in_the_future)
        };
        let mut seen: std::collections::HashMap<(String, Vec<String>), usize> =
            std::collections::HashMap::new();
        let mut keep = vec![false; snaps.len()];
        for later in [false, true] {
            for (i, (_, s)) in snaps.iter().enumerate().rev() {
                if future(s) != later {
                    continue;
                }
                let mut paths = s.paths.clone();
                paths.sort();
                let c = seen.entry((s.hostname.clone(), paths)).or_default();
                *c += 1;
                keep[i] = *c <= n;
            }
        }
        let mut k = keep.into_iter();
        snaps.retain(|_| k.next().unwrap_or(false));
    }
    for e in &bad {
        p.progress.warning_msg(e.to_string());
    }
    if g.json {
        let v: Vec<SnapshotInfo> = snaps
            .iter()
            .map(|(id, s)| SnapshotInfo {
                claimed_hostname: claimed.get(id).cloned(),
                ..SnapshotInfo::of(id, s)
            })
            .collect();
        super::print_json(&v)?;
    } else {
        // Host and tag columns as wide as their longest (QA: a long tag pushed
        // the size column out of line), never narrower than the headings'.
        let host_of =
            |id: &cairn_format::SnapshotId, s: &cairn_format::snapshot::Snapshot| match claimed
                .get(id)
            {
                Some(_) => format!("{}*", s.hostname),
                None => s.hostname.clone(),
            };
        let hw = ui::column_width(snaps.iter().map(|(id, s)| host_of(id, s)), 16);
        let tw = ui::column_width(snaps.iter().map(|(_, s)| s.tags.join(",")), 12);
        println!(
            "{:<10} {:<20} {:<hw$} {:<tw$} {:>12}  paths",
            "id", "time", "host", "tags", "size"
        );
        for (id, s) in &snaps {
            let time = cairn_core::time::local_display(&s.time);
            // Host, tags and paths are what the backup's client wrote.
            let line = format!(
                "{:<10} {:<20} {:<hw$} {:<tw$} {:>12}  {}",
                id.short(),
                time,
                host_of(id, s),
                s.tags.join(","),
                ui::bytes(s.summary.total_bytes),
                match &s.image {
                    // An image: what its backup read, changed and added, which for
                    // a full image every time is what tells snapshots apart.
                    Some(i) => format!(
                        "{} [image: {} changed of {}{}, {} added]",
                        s.paths.join(" "),
                        i.blocks_changed,
                        ui::count(i.blocks, "block"),
                        if i.changed_blocks_input {
                            ", changed-block list"
                        } else {
                            ""
                        },
                        ui::bytes(s.summary.data_added_packed)
                    ),
                    None => s.paths.join(" "),
                }
            );
            println!("{}", ui::printable(&line));
        }
        println!("{}", ui::count(snaps.len() as u64, "snapshot"));
        for (id, s) in snaps.iter().filter(|(id, _)| claimed.contains_key(id)) {
            println!(
                "* {}: {} (as forget does)",
                id.short(),
                cairn_core::repo::host_claim_note(&claimed[id], &s.hostname)
            );
        }
    }
    Ok(if bad.is_empty() { 0 } else { 1 })
}
