use crate::args::{CheckArgs, Global};
use anyhow::{Result, anyhow, bail};
use cairn_core::check::{self, CheckOptions, Subset};

fn subset(s: &str) -> Result<Subset> {
    let bad = || {
        anyhow!("invalid --read-data-subset {s:?}: use N/M (e.g. 2/7) or a percentage (e.g. 10%)")
    };
    if let Some(p) = s.trim().strip_suffix('%') {
        let v: f64 = p.trim().parse().map_err(|_| bad())?;
        if !(v > 0.0 && v <= 100.0) {
            bail!("--read-data-subset percentage must be above 0% and at most 100%");
        }
        return Ok(Subset::Percent(v));
    }
    let (n, m) = s.split_once('/').ok_or_else(bad)?;
    let n: u32 = n.trim().parse().map_err(|_| bad())?;
    let m: u32 = m.trim().parse().map_err(|_| bad())?;
    if m == 0 || n == 0 || n > m {
        bail!("--read-data-subset {s}: need 1 <= N <= M");
    }
    Ok(Subset::Part { n, m })
}

pub fn run(g: &Global, a: &CheckArgs) -> Result<i32> {
    let subset = a.read_data_subset.as_deref().map(subset).transpose()?;
    // Check reads what the storage holds, never the local cache's copies (a damaged
    // remote index file must be found even if an intact copy is cached).
    let mut g = g.clone();
    g.remote.no_cache = true;
    let g = &g;
    let mut repo = super::open(g)?;
    let _lock = super::lock(&repo, "read", false)?;
    let report = check::check(
        &mut repo,
        &CheckOptions {
            read_data: a.read_data,
            subset,
        },
    )?;
    if g.json {
        super::print_json(&report)?;
    } else {
        for p in &report.problems {
            println!("error: {}: {}", p.object, p.message);
            for a in &p.affects {
                println!("    affects {a}");
            }
        }
        if !g.quiet {
            println!(
                "checked {} snapshots, {} index files, {} packs ({} read in full), {} blobs",
                report.snapshots, report.index_files, report.packs, report.packs_read, report.blobs
            );
            if report.pending_deletions > 0 {
                println!(
                    "note: {} prune records wait to delete retired packs (the next prune does it once the operations it waits for end)",
                    report.pending_deletions
                );
            }
            if report.unindexed_packs > 0 {
                println!(
                    "note: {} packs are not in any index (left by an interrupted backup; prune removes them)",
                    report.unindexed_packs
                );
            }
        }
    }
    if report.problems.is_empty() {
        if !g.json && !g.quiet {
            println!("no errors were found");
        }
        Ok(0)
    } else {
        eprintln!(
            "cairn: error: the repository has {} problems",
            report.problems.len()
        );
        Ok(1)
    }
}
