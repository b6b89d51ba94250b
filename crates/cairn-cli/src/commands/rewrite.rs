use crate::args::{Global, RewriteArgs};
use crate::ui;
use anyhow::Result;
use cairn_core::ops::backup::source::ExcludeRules;
use cairn_core::ops::rewrite::{self, RewriteOptions};
use cairn_core::session::{IndexLoad, Read, Write};

pub fn run(g: &Global, a: &RewriteArgs) -> Result<i32> {
    let mut patterns = a.excludes.clone();
    patterns.extend(super::backup::read_exclude_files(&a.exclude_files)?);
    let opts = RewriteOptions {
        excludes: ExcludeRules {
            patterns,
            ipatterns: a.iexcludes.clone(),
            ..Default::default()
        },
        forget: a.forget,
        dry_run: a.dry_run,
    };
    let p = super::progress(g);
    let r = if a.dry_run {
        // Changes nothing: a shared lock, or none where none can be written.
        let session = super::session::<Read>(g, "rewrite", IndexLoad::Placement, &p.progress)?;
        let snaps = super::tag::select(&session, &a.snapshots, &a.filter)?;
        rewrite::plan_rewrite(&session, &snaps, &opts)?
    } else {
        let session = super::session::<Write>(g, "rewrite", IndexLoad::Placement, &p.progress)?;
        let snaps = super::tag::select(&session, &a.snapshots, &a.filter)?;
        rewrite::rewrite(&session, &snaps, &opts)?
    };
    for w in &r.warnings {
        crate::ui::warn(w);
    }
    if g.json {
        super::print_json_report(&r)?;
    } else if !g.quiet {
        for s in &r.rewritten {
            if s.emptied {
                println!(
                    "snapshot {}: everything in it matches ({}); {}",
                    &s.old[..8],
                    ui::bytes(s.bytes_removed),
                    match (a.dry_run, a.forget) {
                        (true, true) => "it would be forgotten",
                        (false, true) => "forgotten, no empty snapshot stored",
                        (_, false) =>
                            "left as it is, no empty snapshot stored (`cairn \
                                       forget` it, or rewrite with --forget)",
                    }
                );
                continue;
            }
            match &s.new {
                Some(n) => println!(
                    "snapshot {} -> {}{}: took out {}",
                    &s.old[..8],
                    &n[..8],
                    if s.forgotten {
                        " (old one forgotten)"
                    } else {
                        ""
                    },
                    ui::bytes(s.bytes_removed)
                ),
                None => println!(
                    "snapshot {}: would take out {}",
                    &s.old[..8],
                    ui::bytes(s.bytes_removed)
                ),
            }
            for path in &s.removed {
                // As listings show names: escaped, bytes that are not UTF-8 as \xNN.
                println!("    {}", ui::printable(path));
            }
        }
        // Emptied ones left as they are were not rewritten.
        let rewritten = r
            .rewritten
            .iter()
            .filter(|s| !s.emptied || a.forget)
            .count();
        // Those emptied whole are forgotten, no snapshot stored for them: said
        // in the count (QA r12: "5 snapshots rewritten" left none of a host).
        let emptied = if a.forget {
            r.rewritten.iter().filter(|s| s.emptied).count()
        } else {
            0
        };
        println!(
            "{} {}{}, {} hold nothing to take out",
            ui::count(rewritten as u64, "snapshot"),
            if a.dry_run {
                "would be rewritten"
            } else {
                "rewritten"
            },
            if emptied > 0 {
                format!(
                    " ({emptied} of them {} whole, everything in {} matching)",
                    if a.dry_run {
                        "would be forgotten"
                    } else {
                        "forgotten"
                    },
                    if emptied == 1 { "it" } else { "them" }
                )
            } else {
                String::new()
            },
            r.unchanged
        );
        if !a.dry_run && !a.forget && rewritten > 0 {
            println!(
                "the old snapshots stay: `cairn forget` them (or rewrite with --forget), then `cairn prune`"
            );
        }
    }
    Ok(0)
}
