use crate::args::{Global, RestoreArgs};
use crate::ui;
use anyhow::Result;
use cairn_core::restore::{self, RestoreOptions};
use cairn_core::session::{IndexLoad, Read};

pub fn run(g: &Global, a: &RestoreArgs) -> Result<i32> {
    let mut p = super::progress(g);
    let session = super::session::<Read>(g, "restore", IndexLoad::Placement, &p.progress)?;
    let snap = session.find_snapshot(&a.snapshot)?;
    let opts = RestoreOptions {
        target: a.target.clone(),
        includes: a.includes.clone(),
        owners: nix::unistd::geteuid().is_root(),
    };
    p.start();
    let r = restore::restore_snapshot(&session, &snap, &opts);
    p.finish();
    let r = r?;
    if g.json {
        super::print_json(&r)?;
    } else if !g.quiet {
        println!(
            "restored snapshot {} to {}: {} files, {} dirs, {} other, {} in {:.2}s ({})",
            r.snapshot_id.short(),
            a.target.display(),
            r.files,
            r.dirs,
            r.other_entries,
            ui::bytes(r.bytes),
            r.duration_secs,
            ui::rate(r.bytes, r.duration_secs)
        );
    }
    if r.sockets_skipped > 0 && !g.quiet && !g.json {
        eprintln!(
            "note: {} sockets were not restored (a socket is created by the program that listens on it)",
            r.sockets_skipped
        );
    }
    if let Some(f) = &r.index_lookup_failures {
        eprintln!(
            "warning: {} lookups in the local SSD index failed ({}); it was marked and is rebuilt \
             from the repository at the next run, which restores what this one could not",
            f.count, f.error
        );
    }
    if !r.errors.is_empty() {
        eprintln!(
            "cairn: error: {} entries could not be restored completely (listed above); everything else was restored",
            r.errors.len()
        );
        return Ok(1);
    }
    Ok(0)
}
