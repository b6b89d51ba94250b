use crate::args::{CheckArgs, Global};
use crate::ui;
use anyhow::Result;
use cairn_core::check::{self, CheckOptions, LocalIndexState, Subset};
use cairn_core::session::{IndexLoad, Read};

fn subset(s: &str) -> Result<Subset> {
    let bad = || {
        super::bad_argument(format!(
            "invalid --read-data-subset {s:?}: use N/M (e.g. 2/7), a percentage (e.g. 10%) \
             or a size (e.g. 500M)"
        ))
    };
    // A size, as restic's (`500M`, `2G`): random packs until that much is read
    // (the last may pass it, so at least one).
    if !s.contains('/') && s.trim().ends_with(|c: char| c.is_ascii_alphabetic()) {
        let bytes = super::parse_size(s.trim()).map_err(|_| bad())?;
        if bytes == 0 {
            return Err(super::bad_argument(format!(
                "--read-data-subset {s}: a size must be above 0"
            )));
        }
        return Ok(Subset::Bytes(bytes));
    }
    if let Some(p) = s.trim().strip_suffix('%') {
        let v: f64 = p.trim().parse().map_err(|_| bad())?;
        if !(v > 0.0 && v <= 100.0) {
            return Err(super::bad_argument(
                "--read-data-subset percentage must be above 0% and at most 100%",
            ));
        }
        return Ok(Subset::Percent(v));
    }
    let (n, m) = s.split_once('/').ok_or_else(bad)?;
    let n: u32 = n.trim().parse().map_err(|_| bad())?;
    let m: u32 = m.trim().parse().map_err(|_| bad())?;
    if m == 0 || n == 0 || n > m {
        return Err(super::bad_argument(format!(
            "--read-data-subset {s}: need 1 <= N <= M"
        )));
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
    let mut p = super::progress(g);
    let mut session = super::session::<Read>(g, "check", IndexLoad::Deferred, &p.progress)?;
    p.start();
    let report = check::check(
        &mut session,
        &CheckOptions {
            read_data: a.read_data,
            subset,
        },
    );
    p.finish();
    let report = report?;
    if g.json {
        super::print_json_report(&report)?;
    } else {
        print_problems(&report.problems);
        if let Some(l) = &report.local_index {
            let why = l.error.as_deref().unwrap_or("");
            match l.state {
                LocalIndexState::Rebuilt => crate::ui::warn(format!(
                    "the local SSD index at {} was damaged ({why}); it was rebuilt from the repository",
                    l.path
                )),
                LocalIndexState::Damaged => crate::ui::warn(format!(
                    "the local SSD index at {} is damaged ({why}); it is rebuilt at the next use",
                    l.path
                )),
                _ => {}
            }
        }
        if !g.quiet {
            // What was read in full is said in bytes too: a subset by size
            // reads about that much, whatever the number of packs.
            let read = if report.packs_read > 0 {
                format!(
                    "{} read in full, {}",
                    report.packs_read,
                    ui::bytes(report.bytes_read)
                )
            } else {
                "0 read in full".to_string()
            };
            println!(
                "checked {}, {}, {} ({read}), {}",
                ui::count(report.snapshots as u64, "snapshot"),
                ui::count(report.index_files as u64, "index file"),
                ui::count(report.packs as u64, "pack"),
                ui::count(report.blobs as u64, "blob")
            );
            if let Some(host) = &report.only_host {
                println!(
                    "note: this token is shown only host {host:?}'s snapshots: those were \
                     checked, with every index file and pack; a check with an admin token \
                     also finds snapshots deleted from storage behind cairn's back"
                );
            }
            if report.pending_deletions > 0 {
                println!(
                    "note: {} of earlier prunes {} to delete retired packs (the next prune does it once the operations {} for end)",
                    ui::count(report.pending_deletions as u64, "pending-deletion record"),
                    if report.pending_deletions == 1 {
                        "waits"
                    } else {
                        "wait"
                    },
                    if report.pending_deletions == 1 {
                        "it waits"
                    } else {
                        "they wait"
                    },
                );
            }
            if report.unindexed_packs > 0 && report.problems.is_empty() {
                println!(
                    "note: {} not in any index (left by an interrupted backup or copy; prune removes them)",
                    ui::count_is(report.unindexed_packs as u64, "pack")
                );
            } else if report.unindexed_packs > 0 {
                // With damage found (an unreadable index file, say), they may well
                // be the packs that file listed: prune stops while a snapshot needs
                // a blob only they hold (docs/FORMAT.md, prune step 2), and runs
                // otherwise (QA: the note said it refused, and it ran).
                println!(
                    "note: {} not in any readable index: `cairn repair index` reads them back \
                     into the index (prune stops while a snapshot needs a blob only they hold)",
                    ui::count_is(report.unindexed_packs as u64, "pack")
                );
            }
            if report.strays > 0 {
                let more = report.strays - report.stray_names.len() as u64;
                println!(
                    "note: {} in the repository {} under a name cairn does not read, so no \
                     command uses {}: {}{} (cairn names objects by their id in lower case, a \
                     pack in the folder of its first two digits: put what was copied in by \
                     hand where it belongs, and remove only what is not needed)",
                    ui::count(report.strays, "object"),
                    if report.strays == 1 { "is" } else { "are" },
                    if report.strays == 1 { "it" } else { "them" },
                    report.stray_names.join(", "),
                    if more > 0 {
                        format!(" and {more} more")
                    } else {
                        String::new()
                    }
                );
                for m in report.misplaced_packs.iter().take(SHOWN_MISPLACED) {
                    println!(
                        "note: {} is a pack in the wrong place: move it to {}",
                        m.name, m.place
                    );
                }
                if report.misplaced_packs.len() > SHOWN_MISPLACED {
                    println!(
                        "note: and {} more packs in the wrong place (`--json` lists them)",
                        report.misplaced_packs.len() - SHOWN_MISPLACED
                    );
                }
            }
        }
    }
    if report.problems.is_empty() {
        if !g.json && !g.quiet {
            // Said beside the all-clear when the data itself was not read: the
            // structure is sound, damage inside a pack is not looked for (QA r15:
            // a restore's advice led here, and "no errors" read as "healthy").
            if report.packs_read == 0 && report.packs > 0 {
                println!(
                    "no errors were found in the repository's structure (the packs' \
                     content was not read: `--read-data` checks it, `--read-data-subset` \
                     a part of it)"
                );
            } else {
                println!("no errors were found");
            }
        }
        Ok(0)
    } else {
        // What to do next, by what was found: damaged packs whose damage no
        // snapshot needs are rewritten by `repair index`; files that lost data
        // also need `repair snapshots`.
        use check::Problem;
        // Packs this user may not read are not damage: what to repair is decided
        // by the rest, and access is asked for apart.
        let unreadable = report
            .problems
            .iter()
            .filter(|p| matches!(p, Problem::PackUnreadable { .. }))
            .count();
        // Nor are packs that reading failed on (the disk, the storage): the
        // disk is looked at before anything is repaired.
        // (Once each: the structure's pass may have failed on a pack's trailer
        // before --read-data failed on the whole pack.)
        let failed = (report.problems.iter())
            .filter_map(|p| match p {
                Problem::PackReadFailed { pack, .. } => Some(pack),
                _ => None,
            })
            .collect::<std::collections::HashSet<_>>()
            .len();
        let failed_blobs = report
            .problems
            .iter()
            .any(|p| matches!(p, Problem::BlobReadFailed { .. }));
        let damage: Vec<&Problem> = report
            .problems
            .iter()
            .filter(|p| {
                !matches!(
                    p,
                    Problem::PackUnreadable { .. }
                        | Problem::PackReadFailed { .. }
                        | Problem::BlobReadFailed { .. }
                )
            })
            .collect();
        // A pack with bytes appended (or its end cut off) is among them: `repair
        // index` rewrites it from the blobs that read back (QA: no next step).
        let only_packs = damage.iter().all(|p| {
            matches!(
                p,
                Problem::PackDamaged { .. }
                    | Problem::PackMisnamed { .. }
                    | Problem::PackTruncated { .. }
                    | Problem::PackSize { .. }
                    | Problem::FalseIndexEntries { .. }
            )
        });
        // Packs whole, and index entries that say otherwise: `repair index`
        // drops those.
        let only_false_entries = damage
            .iter()
            .all(|p| matches!(p, Problem::FalseIndexEntries { .. }));
        let files = damage.iter().any(|p| !p.affects().is_empty());
        // The index naming packs that are gone, with no file left needing them
        // (what `repair snapshots` leaves when `repair index` did not run first).
        let index_only = damage.iter().all(|p| {
            matches!(
                p,
                Problem::PackMissing { .. } | Problem::IndexUnreadable { .. }
            )
        });
        // Whether the index itself needs rebuilding first: it names packs that are
        // gone, damaged or cut short, or a file of it cannot be read. After `repair
        // index` only blobs in no index are left, for `repair snapshots` alone.
        let index_too = damage.iter().any(|p| {
            matches!(
                p,
                Problem::PackMissing { .. }
                    | Problem::IndexUnreadable { .. }
                    | Problem::PackDamaged { .. }
                    | Problem::PackMisnamed { .. }
                    | Problem::PackTruncated { .. }
                    | Problem::PackSize { .. }
                    | Problem::BlobInDamagedPack { .. }
            )
        });
        let mut access = if unreadable == 0 {
            String::new()
        } else {
            format!(
                "{}{} this user may not read: give it read access to the repository (or \
                 check as its owner), then check again",
                if damage.is_empty() {
                    "; "
                } else {
                    "; besides, "
                },
                ui::count(unreadable as u64, "pack")
            )
        };
        if failed > 0 || failed_blobs {
            access.push_str(&format!(
                "{}{} could not be read (see the errors above): check the disk or the \
                 storage (the system log, the drive's health, the connection), then check \
                 again; what to repair, if anything, is said once everything reads",
                if access.is_empty() {
                    "; "
                } else {
                    "; besides, "
                },
                if failed > 0 {
                    ui::count(failed as u64, "pack")
                } else {
                    "some of the repository's objects".to_string()
                }
            ));
        }
        // Missing packs that are there under another name: put back, nothing
        // is lost, and a repair now would drop what they hold (QA).
        // So are packs found, whole, under another pack's name (--read-data).
        let misnamed: Vec<String> = (damage.iter())
            .filter_map(|p| match p {
                Problem::PackMisnamed { holds, .. } => Some(holds.to_hex()),
                _ => None,
            })
            .collect();
        let elsewhere = damage
            .iter()
            .filter(|p| match p {
                Problem::PackMissing { pack } => {
                    let hex = pack.to_hex();
                    misnamed.contains(&hex)
                        || (report.misplaced_packs.iter()).any(|m| m.place.ends_with(&hex))
                }
                _ => false,
            })
            .count();
        let elsewhere_advice = format!(
            "; {} missing from storage {} there in the wrong place (see the notes and \
             errors above): move \
             {} where {}, then check again, before any repair",
            ui::count(elsewhere as u64, "pack"),
            if elsewhere == 1 { "is" } else { "are" },
            if elsewhere == 1 { "it" } else { "them" },
            if elsewhere == 1 {
                "it belongs"
            } else {
                "they belong"
            },
        );
        // Storage that fails reads comes first: a repair decided now could drop
        // what the packs that did not read still hold, so none is advised.
        let reads_failed = failed > 0 || failed_blobs;
        let next = if elsewhere > 0 {
            elsewhere_advice.as_str()
        } else if damage.is_empty() || reads_failed {
            ""
        } else if (damage.iter()).all(|p| matches!(p, Problem::KeyUnreadable { .. })) {
            // The data is whole; only that key's password no longer opens it.
            "; a damaged key file locks out only its own password, the data is whole: put              the file back from a copy, or `cairn key remove ID` and `cairn key add` a new              password for whoever used it"
        } else if only_false_entries {
            "; no data is damaged: `cairn repair index` drops the false index entries (it \
             indexes what the packs' own headers list)"
        } else if only_packs && !a.read_data && a.read_data_subset.is_none() {
            // Without reading the packs, which blobs are damaged is not known
            // (QA r33: two packs' contents swapped, every file damaged, and this
            // said no snapshot needed what was).
            "; the packs' content was not read, so which snapshots need what is damaged is \
             not known: `cairn check --read-data` says; `cairn repair index` rewrites the \
             damaged packs without what cannot be read"
        } else if only_packs {
            "; no snapshot needs what is damaged: `cairn repair index` rewrites the damaged \
             packs without it"
        } else if files && (index_too || report.unindexed_packs > 0) {
            // Said as it is: the files named leave the snapshots, and what can
            // still be read of each stays as NAME.damaged (QA: "save what can
            // be saved" dropped a file of which 98% could be read).
            // The index first, and a check after it: the packs it reads back may
            // hold every file named (QA r11: one damaged index file, 826 problems,
            // and all of it came back from the packs).
            "; `cairn repair index` first (it reads the packs back into the index), then \
             `cairn check` again: `cairn repair snapshots` then takes the files still named \
             out of the snapshots and keeps what can still be read of each as NAME.damaged \
             (zeros in place of the rest)"
        } else if files {
            "; `cairn repair snapshots` takes the files named out of the snapshots and keeps \
             what can still be read of each as NAME.damaged, zeros in place of the rest (the \
             index already lists only what is there)"
        } else if index_only {
            "; no snapshot needs what is missing: `cairn repair index` rebuilds the index \
             from the packs that are there"
        } else {
            ""
        };
        // A snapshot whose root tree is lost: the repair drops it whole, and
        // the directories below, most likely whole, then belong to nothing
        // (QA r11: a prune after the repair deleted a snapshot `recover` saved).
        let roots_lost = damage
            .iter()
            .any(|p| p.affects().iter().any(|a| a.path == "/"));
        let recover = if roots_lost && elsewhere == 0 && !reads_failed {
            "; a snapshot whose root directory is lost (SNAP:/ above) is dropped whole \
             by the repair: run `cairn recover` first, which saves the directories below \
             it as a new snapshot"
        } else {
            ""
        };
        crate::report_error(
            g.json,
            &format!(
                "the repository has {}{next}{recover}{access}",
                ui::count(report.problems.len() as u64, "problem")
            ),
            1,
        );
        Ok(1)
    }
}

/// Misplaced packs named one by one in the text report.
const SHOWN_MISPLACED: usize = 5;

/// Blob problems shown one by one before the rest are counted; files shown per
/// problem before the rest are counted. One damaged index file makes a problem
/// of every blob it alone listed (a thousand lines that buried the one saying
/// what to do); `--json` lists every one.
const SHOWN_BLOB_PROBLEMS: usize = 20;
const SHOWN_AFFECTED: usize = 5;

fn print_problems(problems: &[check::Problem]) {
    use check::Problem;
    let (mut blobs_shown, mut blobs_more) = (0usize, 0u64);
    let mut files_more = std::collections::BTreeSet::new();
    for problem in problems {
        let per_blob = matches!(
            problem,
            Problem::BlobMissing { .. } | Problem::BlobInDamagedPack { .. }
        );
        if per_blob && blobs_shown == SHOWN_BLOB_PROBLEMS {
            blobs_more += 1;
            files_more.extend(problem.affects().iter().map(|a| (a.snapshot, &a.path)));
            continue;
        }
        blobs_shown += usize::from(per_blob);
        println!("error: {}", problem.describe());
        let affects = problem.affects();
        for a in affects.iter().take(SHOWN_AFFECTED) {
            println!(
                "    affects {}:{}",
                a.snapshot.short(),
                ui::printable(&a.path)
            );
        }
        if affects.len() > SHOWN_AFFECTED {
            println!(
                "    and {} more",
                ui::count((affects.len() - SHOWN_AFFECTED) as u64, "file")
            );
        }
    }
    if blobs_more > 0 {
        // Files by path, and the snapshots apart: one file in 4 snapshots is not
        // 4 files (QA r11: "needed by 68 files" counted file × snapshot).
        let paths: std::collections::BTreeSet<_> = files_more.iter().map(|(_, p)| p).collect();
        let snaps: std::collections::BTreeSet<_> = files_more.iter().map(|(s, _)| s).collect();
        let needed = if paths.is_empty() {
            String::new()
        } else {
            format!(
                ", needed by {} in {}",
                ui::count(paths.len() as u64, "file"),
                ui::count(snaps.len() as u64, "snapshot")
            )
        };
        println!(
            "error: {} more missing or in damaged packs{needed} (`cairn check --json` lists \
             every one)",
            ui::count(blobs_more, "blob"),
        );
    }
}
