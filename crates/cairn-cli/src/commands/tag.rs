use crate::args::{Global, TagArgs};
use anyhow::Result;
use cairn_core::ops::tag::{self, TagChange};
use cairn_core::session::{Access, IndexLoad, Read, Write};

pub fn run(g: &Global, a: &TagArgs) -> Result<i32> {
    let change = TagChange {
        // `--set ""` (or `--set` given only empty names) clears the tags.
        set: (!a.set.is_empty()).then(|| a.set.iter().filter(|t| !t.is_empty()).cloned().collect()),
        add: a.add.clone(),
        remove: a.remove.clone(),
    };
    let p = super::progress(g);
    let r = if a.dry_run {
        // Changes nothing: a shared lock, or none where none can be written.
        let session = super::session::<Read>(g, "tag", IndexLoad::None, &p.progress)?;
        let snaps = select(&session, &a.snapshots, &a.filter)?;
        tag::plan_tag(&session, &snaps, &change)?
    } else {
        let session = super::session::<Write>(g, "tag", IndexLoad::None, &p.progress)?;
        let snaps = select(&session, &a.snapshots, &a.filter)?;
        tag::tag(&session, &snaps, &change, false)?
    };
    for w in &r.warnings {
        crate::ui::warn(w);
    }
    if g.json {
        super::print_json_report(&r)?;
    } else if !g.quiet {
        for c in &r.changed {
            let tags = if c.tags.is_empty() {
                "no tags".to_string()
            } else {
                c.tags.join(",")
            };
            let line = match &c.new {
                Some(n) => format!("snapshot {} -> {}: {tags}", &c.old[..8], &n[..8]),
                None => format!("snapshot {} would get: {tags}", &c.old[..8]),
            };
            println!("{}", crate::ui::printable(&line));
        }
        if !r.leftovers_forgotten.is_empty() {
            println!(
                "{} {} an interrupted tag left beside the snapshot it replaced it with",
                if a.dry_run { "would forget" } else { "forgot" },
                crate::ui::count(r.leftovers_forgotten.len() as u64, "snapshot")
            );
        }
        println!(
            "{} {}, {} already as asked",
            crate::ui::count(r.changed.len() as u64, "snapshot"),
            if a.dry_run { "would change" } else { "changed" },
            r.unchanged
        );
    }
    Ok(0)
}

/// The snapshots named (each resolved before anything changes: one typo changes
/// nothing) and passing the filters; none named: every snapshot the filters pass.
pub(crate) fn select<A: Access>(
    session: &cairn_core::Session<A>,
    specs: &[String],
    filter: &crate::args::FilterArgs,
) -> Result<Vec<(cairn_format::SnapshotId, cairn_format::snapshot::Snapshot)>> {
    let filter = filter.engine();
    if specs.is_empty() {
        let (snaps, bad) = session.snapshots()?;
        for e in bad.iter() {
            crate::ui::warn(format!("{e} (left alone)"));
        }
        return Ok(snaps
            .iter()
            .filter(|(_, s)| filter.matches(s))
            .cloned()
            .collect());
    }
    let mut snaps = Vec::new();
    for spec in specs {
        // "latest" is the newest the filters pass, as for ls and restore.
        let found = if spec == "latest" {
            session.find_snapshot_matching(spec, &filter)?
        } else {
            session.find_snapshot(spec)?
        };
        if filter.matches(&found.1) && !snaps.iter().any(|(i, _)| *i == found.0) {
            snaps.push(found);
        }
    }
    Ok(snaps)
}
