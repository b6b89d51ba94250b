//! `cairn forget`: remove snapshot objects, named by id or chosen by a retention
//! policy (decided by `cairn_core::forget`). Only the snapshot objects go; the data
//! they alone referenced stays until prune.

use crate::args::{ForgetArgs, Global};
use anyhow::{Context, Result, bail};
use cairn_core::Repository;
use cairn_core::forget::{
    self, CalendarDuration, ForgetGroup, GroupBy, GroupKey, Policy, SnapshotFilter,
};
use cairn_format::SnapshotId;
use cairn_format::snapshot::Snapshot;
use std::collections::HashMap;

/// A count given to a --keep-* option: a whole number, or "unlimited" for -1.
fn count(flag: &str, v: &Option<String>) -> Result<Option<i64>> {
    match v.as_deref() {
        None => Ok(None),
        Some("unlimited") => Ok(Some(-1)),
        Some(s) => s
            .trim()
            .parse()
            .map(Some)
            .with_context(|| format!("--{flag} {s:?}: expected a number, -1 or \"unlimited\"")),
    }
}

fn policy(a: &ForgetArgs) -> Result<Policy> {
    let within = match &a.keep_within {
        Some(s) => Some(s.parse::<CalendarDuration>()?),
        None => None,
    };
    let p = Policy {
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
        &a.group_by,
    ]
    .iter()
    .any(|o| o.is_some())
        || !a.keep_tags.is_empty()
        || !a.hosts.is_empty()
        || !a.tags.is_empty()
        || !a.paths.is_empty()
}

/// Resolves every id before anything is removed, so one typo removes nothing.
fn named(repo: &Repository, specs: &[String]) -> Result<Vec<(SnapshotId, Snapshot)>> {
    let mut out: Vec<(SnapshotId, Snapshot)> = Vec::new();
    for spec in specs {
        let (id, s) = repo.find_snapshot(spec)?;
        if !out.iter().any(|(i, _)| *i == id) {
            out.push((id, s));
        }
    }
    out.sort_by(|a, b| a.1.time.cmp(&b.1.time).then(a.0.cmp(&b.0)));
    Ok(out)
}

pub fn run(g: &Global, a: &ForgetArgs) -> Result<i32> {
    // Check the options before asking for a password.
    let by_id = !a.snapshots.is_empty();
    if by_id && policy_options_given(a) {
        bail!("snapshot ids cannot be combined with --keep-*, --host, --tag, --path or --group-by");
    }
    let policy = if by_id { None } else { Some(policy(a)?) };
    if policy.as_ref().is_some_and(Policy::is_empty) {
        return Err(cairn_core::Error::NoPolicy.into());
    }
    let group_by: GroupBy = match &a.group_by {
        Some(s) => s.parse()?,
        None => GroupBy::default(),
    };
    let filter = SnapshotFilter {
        hosts: a.hosts.clone(),
        tags: a.tags.clone(),
        paths: a.paths.clone(),
    };

    let repo = super::open(g)?;
    let (snaps, groups) = match &policy {
        None => {
            let snaps = named(&repo, &a.snapshots)?;
            let group = ForgetGroup {
                key: GroupKey::default(),
                keep: Vec::new(),
                remove: snaps.iter().map(|(id, _)| *id).collect(),
            };
            (snaps, vec![group])
        }
        Some(p) => {
            let (snaps, bad) = repo.snapshots()?;
            for e in &bad {
                eprintln!("warning: {e} (left alone)");
            }
            let groups = forget::plan(&snaps, p, group_by, &filter)?;
            (snaps, groups)
        }
    };
    let by_id_map: HashMap<SnapshotId, &Snapshot> = snaps.iter().map(|(i, s)| (*i, s)).collect();

    let mut removed = 0usize;
    let mut failed = 0usize;
    if !a.dry_run {
        let ids: Vec<SnapshotId> = groups
            .iter()
            .flat_map(|gr| gr.remove.iter().copied())
            .collect();
        for (id, r) in repo.forget_snapshots(&ids)? {
            match r {
                Ok(()) => removed += 1,
                Err(e) => {
                    eprintln!("cairn: error: removing snapshot {}: {e}", id.short());
                    failed += 1;
                }
            }
        }
    }
    let planned: usize = groups.iter().map(|gr| gr.remove.len()).sum();

    if g.json {
        print_json(&groups, &by_id_map)?;
    } else if !g.quiet {
        if let Some(p) = &policy {
            println!("applying policy: {p}");
        }
        for gr in &groups {
            print_group(gr, &by_id_map, policy.is_some(), a.dry_run);
        }
        if a.dry_run {
            println!("would remove {planned} snapshots (dry run: nothing was removed)");
        } else {
            println!("removed {removed} snapshots");
        }
    }
    if failed > 0 {
        bail!("{failed} of {planned} snapshots could not be removed");
    }
    if a.prune && planned > 0 {
        return super::prune::run_after_forget(g, a.dry_run);
    }
    Ok(0)
}

fn short_time(s: &Snapshot) -> String {
    s.time.get(..19).unwrap_or(&s.time).replace('T', " ")
}

/// Text rendering: per group a header, the kept snapshots with their reasons and the
/// removed ones, columns as in `cairn snapshots`.
fn print_group(
    gr: &ForgetGroup,
    snaps: &HashMap<SnapshotId, &Snapshot>,
    show_group: bool,
    dry_run: bool,
) {
    if show_group {
        println!("snapshots for {}:", gr.key);
    }
    let reasons: Vec<String> = gr.keep.iter().map(|(_, r)| r.join(", ")).collect();
    let rw = reasons
        .iter()
        .map(|r| r.chars().count())
        .max()
        .unwrap_or(0)
        .max("reasons".len());
    let row = |id: &SnapshotId, reason: Option<&str>| {
        let (time, host, tags, paths) = match snaps.get(id) {
            Some(s) => (
                short_time(s),
                s.hostname.clone(),
                s.tags.join(","),
                s.paths.join(" "),
            ),
            None => Default::default(),
        };
        match reason {
            Some(r) => println!(
                "{:<10} {:<20} {:<16} {:<12} {:<rw$}  {}",
                id.short(),
                time,
                host,
                tags,
                r,
                paths
            ),
            None => println!(
                "{:<10} {:<20} {:<16} {:<12} {}",
                id.short(),
                time,
                host,
                tags,
                paths
            ),
        }
    };
    if show_group {
        println!("keep {} snapshots:", gr.keep.len());
        if !gr.keep.is_empty() {
            println!(
                "{:<10} {:<20} {:<16} {:<12} {:<rw$}  paths",
                "id", "time", "host", "tags", "reasons"
            );
            for ((id, _), r) in gr.keep.iter().zip(&reasons) {
                row(id, Some(r));
            }
        }
    }
    let verb = if dry_run { "would remove" } else { "remove" };
    if !gr.remove.is_empty() {
        println!("{verb} {} snapshots:", gr.remove.len());
        println!(
            "{:<10} {:<20} {:<16} {:<12} paths",
            "id", "time", "host", "tags"
        );
        for id in &gr.remove {
            row(id, None);
        }
    }
    println!();
}

fn snapshot_json(
    id: &SnapshotId,
    snaps: &HashMap<SnapshotId, &Snapshot>,
    reasons: Option<&[String]>,
) -> serde_json::Value {
    let mut v = serde_json::json!({
        "id": id.to_hex(),
        "short_id": id.short(),
    });
    if let Some(s) = snaps.get(id) {
        v["time"] = s.time.clone().into();
        v["host"] = s.hostname.clone().into();
        v["paths"] = s.paths.clone().into();
        v["tags"] = s.tags.clone().into();
    }
    if let Some(r) = reasons {
        v["reasons"] = r.to_vec().into();
    }
    v
}

/// `[{group: {host, paths, tags}, keep: [...], remove: [...]}]`; a group field not used
/// for grouping (and every field when ids were named) is null.
fn print_json(groups: &[ForgetGroup], snaps: &HashMap<SnapshotId, &Snapshot>) -> Result<()> {
    let v: Vec<_> = groups
        .iter()
        .map(|gr| {
            serde_json::json!({
                "group": gr.key,
                "keep": gr.keep.iter().map(|(id, r)| snapshot_json(id, snaps, Some(r))).collect::<Vec<_>>(),
                "remove": gr.remove.iter().map(|id| snapshot_json(id, snaps, None)).collect::<Vec<_>>(),
            })
        })
        .collect();
    super::print_json(&v)
}
