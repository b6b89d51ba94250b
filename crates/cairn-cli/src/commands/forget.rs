//! `cairn forget`: remove snapshot objects, named by id or chosen by a retention
//! policy (decided by `cairn_core::forget`). Only the snapshot objects go; the data
//! they alone referenced stays until prune.

use crate::args::{ForgetArgs, Global};
use crate::ui;
use anyhow::{Result, bail};
use cairn_core::forget::{
    self, CalendarDuration, ForgetRequest, GroupBy, GroupReport, Policy, SnapshotEntry,
};
use cairn_core::session::{IndexLoad, Read, Write};

/// A count given to a --keep-* option: a whole number, or "unlimited" for -1.
fn count(flag: &str, v: &Option<String>) -> Result<Option<i64>> {
    match v.as_deref() {
        None => Ok(None),
        Some("unlimited") => Ok(Some(-1)),
        Some(s) => s.trim().parse().map(Some).map_err(|_| {
            super::bad_argument(format!(
                "--{flag} {s:?}: expected a number, -1 or \"unlimited\""
            ))
        }),
    }
}

/// A span given to a --keep-within* option.
fn span(flag: &str, v: &Option<String>) -> Result<Option<CalendarDuration>> {
    match v {
        Some(s) => {
            Ok(Some(s.parse::<CalendarDuration>().map_err(|e| {
                super::bad_argument(format!("--{flag}: {e}"))
            })?))
        }
        None => Ok(None),
    }
}

fn policy(a: &ForgetArgs) -> Result<Policy> {
    let within = span("keep-within", &a.keep_within)?;
    let p = Policy {
        within_hourly: span("keep-within-hourly", &a.keep_within_hourly)?,
        within_daily: span("keep-within-daily", &a.keep_within_daily)?,
        within_weekly: span("keep-within-weekly", &a.keep_within_weekly)?,
        within_monthly: span("keep-within-monthly", &a.keep_within_monthly)?,
        within_yearly: span("keep-within-yearly", &a.keep_within_yearly)?,
        last: count("keep-last", &a.keep_last)?,
        hourly: count("keep-hourly", &a.keep_hourly)?,
        daily: count("keep-daily", &a.keep_daily)?,
        weekly: count("keep-weekly", &a.keep_weekly)?,
        monthly: count("keep-monthly", &a.keep_monthly)?,
        yearly: count("keep-yearly", &a.keep_yearly)?,
        within,
        keep_tags: a.keep_tags.clone(),
    };
    p.validate()?;
    Ok(p)
}

/// True when any option that only makes sense for a policy run was given.
fn policy_options_given(a: &ForgetArgs) -> bool {
    [
        &a.keep_last,
        &a.keep_hourly,
        &a.keep_daily,
        &a.keep_weekly,
        &a.keep_monthly,
        &a.keep_yearly,
        &a.keep_within,
        &a.keep_within_hourly,
        &a.keep_within_daily,
        &a.keep_within_weekly,
        &a.keep_within_monthly,
        &a.keep_within_yearly,
        &a.group_by,
    ]
    .iter()
    .any(|o| o.is_some())
        || !a.keep_tags.is_empty()
        || !a.filter.engine().is_empty()
}

pub fn run(g: &Global, a: &ForgetArgs) -> Result<i32> {
    // Check the options before asking for a password.
    let by_id = !a.snapshots.is_empty();
    if by_id && policy_options_given(a) {
        bail!("snapshot ids cannot be combined with --keep-*, --host, --tag, --path or --group-by");
    }
    let request = if by_id {
        ForgetRequest::Ids(a.snapshots.clone())
    } else {
        let policy = policy(a)?;
        if policy.is_empty() {
            return Err(cairn_core::Error::NoPolicy.into());
        }
        let group_by: GroupBy = match &a.group_by {
            Some(s) => s.parse()?,
            None => GroupBy::default(),
        };
        ForgetRequest::Policy {
            policy: Box::new(policy),
            group_by,
            filter: a.filter.engine(),
        }
    };
    let p = super::progress(g);
    // A dry run changes nothing: a shared lock, or none where none can be
    // written (a repository on a read-only mount), as for other reads. (The
    // session, and its lock, end before a prune that follows.)
    let r = if a.dry_run {
        let s = super::session::<Read>(g, "forget", IndexLoad::None, &p.progress)?;
        forget::forget(&s, &request, true)?
    } else {
        let s = super::session::<Write>(g, "forget", IndexLoad::None, &p.progress)?;
        forget::forget(&s, &request, false)?
    };
    for e in &r.unreadable {
        crate::ui::warn(format!("{e} (left alone)"));
    }
    for c in &r.host_claims {
        crate::ui::warn(format!(
            "snapshot {} {}",
            c.short_id,
            cairn_core::repo::host_claim_note(&c.claimed, &c.recorded)
        ));
    }
    for gr in &r.groups {
        for k in &gr.keep {
            if k.reasons
                .as_ref()
                .is_some_and(|rs| rs.iter().any(|x| x == forget::FUTURE_REASON))
            {
                crate::ui::warn(format!(
                    "snapshot {} of host {:?} is dated {}, in the future: kept, and not \
                     counted by the policy (a host's clock, or a client that dated it so)",
                    k.short_id, k.host, k.time
                ));
            }
        }
    }
    // Each named (a handful at most from honest clients); a flood is counted.
    const LATE_SHOWN: usize = 20;
    let late: Vec<(&forget::GroupReport, &forget::LateEntry)> = r
        .groups
        .iter()
        .flat_map(|g| g.stored_late.iter().map(move |l| (g, l)))
        .collect();
    for (g, l) in late.iter().take(LATE_SHOWN) {
        crate::ui::warn(format!(
            "snapshot {} ({}) is dated {} but cairn serve received it at {}, after a \
             snapshot of its group dated later: it took no slot from the snapshots stored in \
             order (a long backup, a copy, or a client backdating it)",
            l.short_id,
            g.group,
            short_time(&l.time),
            short_time(&l.received)
        ));
    }
    if late.len() > LATE_SHOWN {
        crate::ui::warn(format!(
            "and {} more snapshots stored late (forget --json lists them as stored_late)",
            late.len() - LATE_SHOWN
        ));
    }
    for (id, e) in &r.failed {
        eprintln!("cairn: error: removing snapshot {}: {e}", id.short());
    }
    let planned = r.planned();
    if g.json {
        // With --prune, one document: {"forget": the groups, "prune": prune's
        // report, null when nothing was removed}, printed once prune is done.
        if !a.prune {
            super::print_json(&r)?;
        }
    } else if !g.quiet {
        if let ForgetRequest::Policy { policy, .. } = &request {
            println!("applying policy: {policy}");
        }
        for gr in &r.groups {
            print_group(gr, r.by_policy, a.dry_run);
        }
        if a.dry_run {
            println!(
                "would remove {} (dry run: nothing was removed)",
                ui::count(planned as u64, "snapshot")
            );
        } else {
            println!("removed {}", ui::count(r.removed as u64, "snapshot"));
        }
    }
    if !r.failed.is_empty() {
        if g.json && a.prune {
            super::print_json(&serde_json::json!({ "forget": &r, "prune": null }))?;
        }
        bail!(
            "{} of {planned} snapshots could not be removed",
            r.failed.len()
        );
    }
    if a.prune {
        let pruned = if planned > 0 {
            // A dry run removed nothing: its prune plans as if it had.
            let forgotten = if a.dry_run {
                (r.groups.iter())
                    .flat_map(|g| g.remove.iter().map(|e| e.id))
                    .collect()
            } else {
                Vec::new()
            };
            Some(super::prune::run_after_forget(g, a.dry_run, forgotten))
        } else {
            None
        };
        if g.json {
            let prune = match &pruned {
                Some(Ok(p)) => serde_json::to_value(p)?,
                _ => serde_json::Value::Null,
            };
            super::print_json(&serde_json::json!({ "forget": &r, "prune": prune }))?;
        }
        if let Some(p) = pruned {
            p?;
        }
    }
    Ok(0)
}

fn short_time(time: &str) -> String {
    cairn_core::time::local_display(time)
}

/// Text rendering: per group a header, the kept snapshots with their reasons and the
/// removed ones, columns as in `cairn snapshots`.
fn print_group(gr: &GroupReport, show_group: bool, dry_run: bool) {
    if show_group {
        // `--group-by ''` puts every snapshot in one group, whose key reads
        // "all snapshots" ("snapshots for all snapshots" would say it twice).
        let g = &gr.group;
        let header = if g.host.is_none() && g.paths.is_none() && g.tags.is_none() {
            "all snapshots (not grouped):".to_string()
        } else {
            format!("snapshots for {}:", gr.group)
        };
        println!("{}", ui::printable(&header));
    }
    let reasons: Vec<String> = gr
        .keep
        .iter()
        .map(|s| s.reasons.as_deref().unwrap_or(&[]).join(", "))
        .collect();
    let rw = reasons
        .iter()
        .map(|r| ui::printable(r).chars().count())
        .max()
        .unwrap_or(0)
        .max("reasons".len());
    // Host and tag columns as wide as their longest, as in `snapshots` (QA:
    // a long tag ran into the reasons).
    let all = || gr.keep.iter().chain(&gr.remove);
    let hw = ui::column_width(all().map(|s| s.host.as_str()), 16);
    let tw = ui::column_width(all().map(|s| s.tags.join(",")), 12);
    // Host, tags and paths are what the backup's client wrote: written out as
    // `snapshots` writes them (no control character reaches the terminal).
    let cell = |t: &str| ui::printable(t).into_owned();
    let row = |s: &SnapshotEntry, reason: Option<&str>| {
        println!(
            "{:<10} {:<20} {:<hw$} {:<tw$} {}{}",
            s.short_id,
            cell(&short_time(&s.time)),
            cell(&s.host),
            cell(&s.tags.join(",")),
            reason.map_or(String::new(), |r| format!("{:<rw$}  ", cell(r))),
            cell(&s.paths.join(" "))
        );
    };
    if show_group {
        println!("keep {}:", ui::count(gr.keep.len() as u64, "snapshot"));
        if !gr.keep.is_empty() {
            println!(
                "{:<10} {:<20} {:<hw$} {:<tw$} {:<rw$}  paths",
                "id", "time", "host", "tags", "reasons"
            );
            for (s, r) in gr.keep.iter().zip(&reasons) {
                row(s, Some(r));
            }
        }
    }
    let verb = if dry_run { "would remove" } else { "remove" };
    if !gr.remove.is_empty() {
        println!("{verb} {}:", ui::count(gr.remove.len() as u64, "snapshot"));
        println!(
            "{:<10} {:<20} {:<hw$} {:<tw$} paths",
            "id", "time", "host", "tags"
        );
        for s in &gr.remove {
            row(s, None);
        }
    }
    println!();
}
