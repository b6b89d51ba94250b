use crate::args::{CheckArgs, Global};
use anyhow::Result;
use cairn_core::check::{self, CheckOptions};

pub fn run(g: &Global, a: &CheckArgs) -> Result<i32> {
    let mut repo = super::open(g)?;
    let _lock = super::lock(&repo, "read", false)?;
    let report = check::check(
        &mut repo,
        &CheckOptions {
            read_data: a.read_data,
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
