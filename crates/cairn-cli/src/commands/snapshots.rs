use crate::args::{Global, SnapshotsArgs};
use crate::ui;
use anyhow::Result;
use cairn_core::forget::{GroupBy, GroupKey};
use cairn_core::repo::info::SnapshotInfo;
use cairn_format::SnapshotId;
use cairn_format::snapshot::Snapshot;
use std::collections::{BTreeMap, HashMap};

type Listed = Vec<(SnapshotId, Snapshot)>;

pub fn run(g: &Global, a: &SnapshotsArgs) -> Result<i32> {
    // A bad --group-by is refused before the password is asked for.
    let group_by: Option<GroupBy> = a.group_by.as_deref().map(str::parse).transpose()?;
    // `--group-by ''` groups by nothing: one list, as restic prints it.
    let group_by = group_by.filter(|g| g.host || g.paths || g.tags);
    let p = super::progress(g);
    let repo = super::open(g, &p.progress)?;
    let (mut snaps, bad) = repo.snapshots()?;
    // `latest` decides from every snapshot as stored, as `ls latest` does (which
    // could not be read is judged against all the others and the server's
    // records: QA, a filtered list called it uncertain where `ls` passed it over).
    let stored = snaps.clone();
    // Through a cairn server, a snapshot a host-bound token stored under another
    // host's name is listed (and filtered) as its token's host, as `forget` counts
    // it. Only an admin may read the records; for others nothing changes.
    let claimed: HashMap<_, _> = repo
        .attribute_hosts(&mut snaps)
        .unwrap_or_default()
        .into_iter()
        .collect();
    let filter = a.filter.engine();
    // Unreadable ones too: a prefix naming one says so, not "no snapshot".
    let all_ids: Vec<SnapshotId> = (snaps.iter().map(|(id, _)| *id))
        .chain(bad.iter().map(|e| e.id))
        .collect();
    snaps.retain(|(_, s)| filter.matches(s));
    // Snapshots named: each resolved (a prefix among all, `latest` among those
    // the filters leave, passing over one dated in the future, and refused
    // while an unreadable snapshot might be newer), then only those listed.
    if !a.snapshots.is_empty() {
        let mut chosen = Vec::new();
        for spec in &a.snapshots {
            let id = if spec == "latest" {
                // As `ls latest --host H` decides.
                cairn_core::session::latest_matching(&repo, &stored, &bad, &filter, &|note| {
                    crate::ui::warn(note)
                })?
                .0
            } else {
                let id = cairn_core::repo::resolve_snapshot_prefix(spec, &all_ids)?;
                if let Some(e) = bad.iter().find(|e| e.id == id) {
                    anyhow::bail!("{e}");
                }
                if !snaps.iter().any(|(i, _)| *i == id) {
                    anyhow::bail!(
                        "snapshot {} does not match {}",
                        id.short(),
                        filter.describe()
                    );
                }
                id
            };
            chosen.push(id);
        }
        snaps.retain(|(id, _)| chosen.contains(id));
    }
    // Groups in key order, each oldest first; one group of all without --group-by.
    let mut groups: BTreeMap<GroupKey, Listed> = BTreeMap::new();
    for (id, s) in snaps {
        let key = group_by.map(|by| GroupKey::of(&s, by)).unwrap_or_default();
        groups.entry(key).or_default().push((id, s));
    }
    // 0: no limit, as restic's.
    if let Some(n) = a.latest.filter(|&n| n > 0) {
        for list in groups.values_mut() {
            newest_only(list, n, group_by.is_some());
        }
    }
    // Snapshots named by id: the others' damage is not this listing's (a
    // `latest` that an unreadable one might beat was refused above).
    let bad = if a.snapshots.is_empty() {
        bad
    } else {
        Vec::new()
    };
    for e in &bad {
        p.progress.warning_msg(e.to_string());
    }
    let info = |(id, s): &(SnapshotId, Snapshot)| SnapshotInfo {
        claimed_hostname: claimed.get(id).cloned(),
        ..SnapshotInfo::of(id, s)
    };
    if g.json {
        match group_by {
            None => {
                let v: Vec<SnapshotInfo> = groups.values().flatten().map(info).collect();
                super::print_json(&v)?;
            }
            Some(_) => {
                // restic's shape: every key field present, empty when not grouped by.
                let v: Vec<serde_json::Value> = groups
                    .iter()
                    .map(|(k, list)| {
                        serde_json::json!({
                            "group_key": {
                                "hostname": k.host.clone().unwrap_or_default(),
                                "paths": k.paths,
                                // Untagged: null, as restic's.
                                "tags": k.tags.as_ref().filter(|t| !t.is_empty()),
                            },
                            "snapshots": list.iter().map(info).collect::<Vec<_>>(),
                        })
                    })
                    .collect();
                super::print_json(&v)?;
            }
        }
    } else {
        let mut first = true;
        for (key, list) in &groups {
            if group_by.is_some() {
                if !first {
                    println!();
                }
                println!("{}", ui::printable(&format!("snapshots for {key}:")));
            }
            first = false;
            print_table(list, &claimed, a.compact);
        }
        if groups.is_empty() {
            print_table(&[], &claimed, a.compact);
        }
        for (id, s) in groups.values().flatten() {
            if let Some(c) = claimed.get(id) {
                println!(
                    "* {}: {} (as forget does)",
                    id.short(),
                    cairn_core::repo::host_claim_note(c, &s.hostname)
                );
            }
        }
        // What only --json showed (QA): an image saved with holes of zeros
        // where its source could not be read, or one whose size changed.
        for (id, s) in groups.values().flatten() {
            if let Some(note) =
                (s.image.as_ref()).and_then(|i| image_note(i, cairn_core::repo::is_repaired(s)))
            {
                println!("! {}: {note}", id.short());
            }
        }
    }
    Ok(if bad.is_empty() { 0 } else { 1 })
}

/// A line about an image snapshot that is not a whole, steady copy of its
/// source, if it is not.
fn image_note(i: &cairn_format::snapshot::ImageInfo, repaired: bool) -> Option<String> {
    let mut parts = Vec::new();
    if !i.unreadable.is_empty() {
        let bytes: u64 = i.unreadable.iter().map(|r| r.1).sum();
        parts.push(format!(
            "{} of the image in {} {} and hold{} zeros (`snapshots --json` lists them)",
            ui::bytes(bytes),
            ui::count(i.unreadable.len() as u64, "range"),
            super::unreadable_why(repaired),
            if i.unreadable.len() == 1 { "s" } else { "" },
        ));
    }
    if let Some(end) = i.size_at_end {
        parts.push(format!(
            "the source's size changed during the backup ({} to {}): the image was saved \
             at the first and may be inconsistent",
            ui::bytes(i.size),
            ui::bytes(end)
        ));
    }
    (!parts.is_empty()).then(|| parts.join("; "))
}

/// Keeps the `n` newest of `list` (oldest first), per host and set of paths
/// unless `whole` (a group of --group-by: per group). Those dated in the future
/// come after every other, as `latest` passes them over.
fn newest_only(list: &mut Listed, n: usize, whole: bool) {
    let future = |s: &Snapshot| {
        cairn_core::time::parse_rfc3339(&s.time).is_some_and(cairn_core::time::in_the_future)
    };
    let mut seen: HashMap<(String, Vec<String>), usize> = HashMap::new();
    let mut keep = vec![false; list.len()];
    for later in [false, true] {
        for (i, (_, s)) in list.iter().enumerate().rev() {
            if future(s) != later {
                continue;
            }
            let key = if whole {
                Default::default()
            } else {
                let mut paths = s.paths.clone();
                paths.sort();
                (s.hostname.clone(), paths)
            };
            let c = seen.entry(key).or_default();
            *c += 1;
            keep[i] = *c <= n;
        }
    }
    let mut k = keep.into_iter();
    list.retain(|_| k.next().unwrap_or(false));
}

/// The listing's table and count line; `compact`: no paths (id, time, host,
/// tags and size, as restic's).
fn print_table(
    snaps: &[(SnapshotId, Snapshot)],
    claimed: &HashMap<SnapshotId, String>,
    compact: bool,
) {
    // Host and tag columns as wide as their longest (QA: a long tag pushed
    // the size column out of line), never narrower than the headings'.
    let host_of = |id: &SnapshotId, s: &Snapshot| match claimed.get(id) {
        Some(_) => format!("{}*", s.hostname),
        None => s.hostname.clone(),
    };
    let hw = ui::column_width(snaps.iter().map(|(id, s)| host_of(id, s)), 16);
    let tw = ui::column_width(snaps.iter().map(|(_, s)| s.tags.join(",")), 12);
    if compact {
        println!(
            "{:<10} {:<20} {:<hw$} {:<tw$} {:>12}",
            "id", "time", "host", "tags", "size"
        );
    } else {
        println!(
            "{:<10} {:<20} {:<hw$} {:<tw$} {:>12}  paths",
            "id", "time", "host", "tags", "size"
        );
    }
    for (id, s) in snaps {
        // Time, host, tags and paths are what the backup's client wrote (a
        // time that does not parse is shown as it is): each cell written out
        // before it is padded, so the columns stay in line.
        let cell = |t: String| ui::printable(&t).into_owned();
        let time = cell(cairn_core::time::local_display(&s.time));
        let line = if compact {
            format!(
                "{:<10} {:<20} {:<hw$} {:<tw$} {:>12}",
                id.short(),
                time,
                cell(host_of(id, s)),
                cell(s.tags.join(",")),
                ui::bytes(s.summary.total_bytes)
            )
        } else {
            format!(
                "{:<10} {:<20} {:<hw$} {:<tw$} {:>12}  {}",
                id.short(),
                time,
                cell(host_of(id, s)),
                cell(s.tags.join(",")),
                ui::bytes(s.summary.total_bytes),
                match &s.image {
                    // An image: what its backup read, changed and added, which for
                    // a full image every time is what tells snapshots apart.
                    Some(i) => format!(
                        "{} [image: {} changed of {}{}, {} added]",
                        cell(s.paths.join(" ")),
                        i.blocks_changed,
                        ui::count(i.blocks, "block"),
                        if i.changed_blocks_input {
                            ", changed-block list"
                        } else {
                            ""
                        },
                        ui::bytes(s.summary.data_added_packed)
                    ),
                    None => cell(s.paths.join(" ")),
                }
            )
        };
        println!("{}", line.trim_end());
    }
    println!("{}", ui::count(snaps.len() as u64, "snapshot"));
}
