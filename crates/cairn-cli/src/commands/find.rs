use crate::args::{FindArgs, Global};
use crate::ui;
use anyhow::Result;
use cairn_core::find::{self, Pattern};
use cairn_core::session::{IndexLoad, Read};

pub fn run(g: &Global, a: &FindArgs) -> Result<i32> {
    // A bad pattern is refused before the password is asked for.
    let pattern = Pattern::new(&a.pattern, a.ignore_case)?;
    if a.newest == Some(0) {
        return Err(super::bad_argument(
            "--newest 0 would search nothing; give 1 or more",
        ));
    }
    let p = super::progress(g);
    let session = super::session::<Read>(g, "find", IndexLoad::Placement, &p.progress)?;
    let filter = a.filter.engine();
    let mut snapshots = Vec::new();
    // Snapshot objects that cannot be read: their matches are unknown too.
    let mut unread = Vec::new();
    if a.snapshots.is_empty() {
        let (all, bad) = session.snapshots()?;
        unread.extend(bad.iter().map(|e| find::Unreadable {
            snapshot: e.id,
            path: "/".into(),
            error: e.error.to_string(),
        }));
        snapshots.extend(all.iter().filter(|(_, s)| filter.matches(s)).cloned());
    } else {
        for spec in &a.snapshots {
            // "latest" is the newest the filters pass, as for ls and restore.
            let s = if spec == "latest" {
                session.find_snapshot_matching(spec, &filter)?
            } else {
                session.find_snapshot(spec)?
            };
            if filter.matches(&s.1) && !snapshots.iter().any(|(id, _)| *id == s.0) {
                snapshots.push(s);
            }
        }
    }
    let mut r = find::find(&session, &snapshots, &pattern, a.newest)?;
    r.unreadable.splice(0..0, unread);
    // With --json they are in the report (stdout), not lines among the events.
    for u in r.unreadable.iter().filter(|_| !g.json) {
        let line = format!(
            "error: snapshot {}: {}: {} (its matches are unknown)",
            u.snapshot.short(),
            u.path,
            u.error
        );
        eprintln!("{}", ui::printable(&line));
    }
    if g.json {
        super::print_json(&r)?;
    } else {
        let mut out = std::io::stdout().lock();
        let mut matches = 0u64;
        for s in &r.snapshots {
            let time = cairn_core::time::local_display(&s.time);
            super::out_line(
                &mut out,
                &format!("snapshot {} of {} at {time}:", s.snapshot.short(), s.host),
            );
            for e in &s.matches {
                super::out_line(&mut out, &format!("  {}", super::ls::long_line(e)));
            }
            matches += s.matches.len() as u64;
        }
        if !g.quiet {
            let unread = r.unreadable.len();
            eprintln!(
                "{} in {} of {} searched{}",
                ui::count(matches, "match"),
                ui::count(r.snapshots.len() as u64, "snapshot"),
                r.snapshots_searched,
                if unread > 0 {
                    format!("; {unread} could not be read in full (listed above)")
                } else {
                    String::new()
                }
            );
        }
    }
    Ok(if r.unreadable.is_empty() { 0 } else { 1 })
}
