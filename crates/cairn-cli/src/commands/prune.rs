use crate::args::{Global, PruneArgs};
use crate::ui;
use anyhow::{Context, Result, anyhow};
use cairn_core::prune::{self, MaxUnused, PruneOptions, PruneReport};
use cairn_core::session::{Exclusive, IndexLoad, Read};

pub fn options(a: &PruneArgs) -> Result<PruneOptions> {
    let mu = a.max_unused.trim();
    let max_unused = if mu.eq_ignore_ascii_case("unlimited") {
        MaxUnused::Unlimited
    } else if let Some(p) = mu.strip_suffix('%') {
        let v: f64 = p
            .trim()
            .parse()
            .map_err(|_| anyhow!("invalid --max-unused {mu:?}: use e.g. 5%, 2G or unlimited"))?;
        if !(0.0..=100.0).contains(&v) {
            return Err(super::bad_argument(
                "--max-unused must be between 0% and 100%",
            ));
        }
        MaxUnused::Percent(v)
    } else {
        MaxUnused::Bytes(super::parse_size(mu).context("--max-unused")?)
    };
    let max_repack_bytes = match &a.max_repack_size {
        Some(s) => Some(super::parse_size(s).context("--max-repack-size")?),
        None => None,
    };
    Ok(PruneOptions {
        dry_run: a.dry_run,
        max_unused,
        max_repack_bytes,
        ..Default::default()
    })
}

pub fn run(g: &Global, a: &PruneArgs) -> Result<i32> {
    let report = execute(g, a)?;
    render(g, &report)?;
    Ok(0)
}

/// Prunes (or plans, with --dry-run) and returns the report, printing nothing.
fn execute(g: &Global, a: &PruneArgs) -> Result<PruneReport> {
    execute_with(g, a, Vec::new())
}

/// `execute`, a dry run planning as if the snapshots `forgotten` were gone.
fn execute_with(
    g: &Global,
    a: &PruneArgs,
    forgotten: Vec<cairn_format::SnapshotId>,
) -> Result<PruneReport> {
    let mut opts = options(a)?;
    opts.as_if_forgotten = forgotten;
    let only_unused = matches!(opts.max_unused, MaxUnused::Unlimited);
    let mut p = super::progress(g);
    let report = if opts.dry_run {
        let mut s = super::session::<Read>(g, "prune", IndexLoad::None, &p.progress)?;
        p.start();
        prune::plan(&mut s, &opts)
    } else {
        let mut s = super::session::<Exclusive>(g, "prune", IndexLoad::None, &p.progress)?;
        p.start();
        prune::prune(&mut s, &opts)
    };
    p.finish();
    let report = report.map_err(|e| match e {
        // Repacking writes before it deletes: with the disk full, deleting only
        // whole unused packs (which writes little) frees room first. That still
        // writes the new index first: with no room even for that, room must be
        // made by hand.
        e if e.is_no_space() && !only_unused => anyhow!(
            "{e}: prune writes (repacked data, then its new index) before it deletes; \
             `cairn prune --max-unused unlimited` repacks nothing and only deletes packs \
             nothing uses, but it too needs room for a new index, about what the \
             repository's index/ directory takes: free that much on the storage if needed"
        ),
        e if e.is_no_space() => anyhow!(
            "{e}: even a prune that only deletes writes its new index first; free at least \
             as much room on the storage as the repository's index/ directory takes (other \
             files on that disk, not the repository's), then prune again"
        ),
        // Stopped at one of its safe points, all before the index changes.
        e @ cairn_core::Error::Cancelled => anyhow::Error::from(e).context(
            "prune cancelled before it changed the index: nothing was deleted (what it had \
             repacked stays as second copies, which the next prune removes)",
        ),
        e => anyhow::Error::from(e),
    })?;
    Ok(report)
}

/// `forget --prune`: prune with default settings once snapshots were removed. The
/// report is returned for `--json` (forget prints one document holding both).
pub fn run_after_forget(
    g: &Global,
    dry_run: bool,
    forgotten: Vec<cairn_format::SnapshotId>,
) -> Result<PruneReport> {
    let args = PruneArgs {
        dry_run,
        max_unused: "5%".into(),
        max_repack_size: None,
    };
    let report = execute_with(g, &args, forgotten)?;
    if !g.json {
        render(g, &report)?;
    }
    Ok(report)
}

fn render(g: &Global, r: &PruneReport) -> Result<()> {
    if g.json {
        return super::print_json_report(r);
    }
    for d in &r.damaged_index_files {
        crate::ui::warn(format!(
            "index file {d} cannot be read (damaged, or not written by cairn): \
             prune {}; the packs only it listed count as unindexed",
            if r.dry_run {
                "would drop it"
            } else {
                "dropped it"
            }
        ));
    }
    if g.quiet {
        return Ok(());
    }
    let p = &r.plan;
    let b = ui::bytes;
    println!(
        "{} {} {}; packs: {} in {} ({} used, {} unused, {} headers)",
        ui::count(p.snapshots as u64, "snapshot"),
        if p.snapshots == 1 { "needs" } else { "need" },
        ui::count(p.used_blobs as u64, "blob"),
        p.packs,
        b(p.pack_bytes),
        b(p.used_bytes),
        b(p.unused_bytes),
        b(p.overhead_bytes)
    );
    let verb = if r.dry_run { "would" } else { "will" };
    println!(
        "{verb} delete {} ({})",
        ui::count(p.delete_packs as u64, "unused pack"),
        b(p.delete_bytes)
    );
    println!(
        "{verb} repack {} ({}), copying {}",
        ui::count(p.repack_packs as u64, "pack"),
        b(p.repack_bytes),
        b(p.repack_copy_bytes)
    );
    if p.unindexed_packs > 0 {
        // A running backup's packs are indexed only when it ends: they look the
        // same as an interrupted one's (QA r11: "will delete" read as a threat
        // to the backup running beside it).
        println!(
            "{verb} delete {} no index lists ({}): left by interrupted backups, or being \
             written by one running now (those wait until it ends, and are kept if its \
             snapshot needs them)",
            ui::count(p.unindexed_packs as u64, "pack"),
            b(p.unindexed_bytes)
        );
    }
    if p.missing_unused_packs > 0 {
        println!(
            "{verb} drop {} nothing needs from the index",
            ui::count(p.missing_unused_packs as u64, "missing pack")
        );
    }
    // Packs kept for snapshots written meanwhile were counted by the plan.
    let reclaim = p.reclaim_bytes.saturating_sub(r.rescued_bytes);
    if !r.dry_run && r.deferred_packs > 0 {
        // Packs whose deletion waits for running operations are not free yet.
        println!(
            "space to reclaim: up to {}, by the next prune once the operations below end \
             (what they come to need is kept); unused space left then: {}",
            b(reclaim),
            b(p.unused_bytes_after)
        );
    } else {
        println!(
            "space reclaimed: {}; unused space left: {}",
            b(reclaim),
            b(p.unused_bytes_after)
        );
    }
    if p.false_copies > 0 {
        println!(
            "warning: {} name blobs their packs do not hold (read to check them); \
             prune keeps the true copies and drops these (run `cairn check --read-data`)",
            ui::count(p.false_copies as u64, "index entry")
        );
    }
    if p.earlier_pending_packs > 0 {
        println!(
            "{} waiting for deletion (retired by an earlier prune)",
            ui::count_is(p.earlier_pending_packs as u64, "pack")
        );
    }
    if r.dry_run {
        println!("dry run: nothing was changed");
        return Ok(());
    }
    println!(
        "wrote {} and {}; deleted {} ({})",
        ui::count(r.new_packs, "pack"),
        ui::count(r.new_index_files as u64, "index file"),
        ui::count(r.deleted_packs as u64, "pack"),
        b(r.deleted_bytes)
    );
    if r.temporaries_removed_bytes > 0 {
        println!(
            "removed {} of partial files left by interrupted writers",
            b(r.temporaries_removed_bytes)
        );
    }
    if r.rescued_packs > 0 {
        println!(
            "kept {} that snapshots need (written meanwhile, or holding the only true copy of a blob)",
            ui::count(r.rescued_packs as u64, "retired pack")
        );
    }
    for l in &r.stale_locks_removed {
        println!("removed a stale lock: {l}");
    }
    for l in &r.stale_locks_kept {
        crate::ui::warn(format!("could not remove a stale lock (passed over): {l}"));
    }
    if r.deferred_packs > 0 {
        println!(
            "{} ({}) will be deleted by the next prune once these operations end, unless a \
             snapshot they write needs them:",
            ui::count(r.deferred_packs as u64, "pack"),
            b(r.deferred_bytes)
        );
        for w in &r.waiting_for {
            println!("    {w}");
        }
    }
    Ok(())
}
