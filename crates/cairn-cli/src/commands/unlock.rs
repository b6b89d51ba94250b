use crate::args::{Global, UnlockArgs};
use anyhow::Result;

pub fn run(g: &Global, a: &UnlockArgs) -> Result<i32> {
    let p = super::progress(g);
    let repo = super::open(g, &p.progress)?;
    let r = cairn_core::repo::info::unlock(&repo, a.remove_all)?;
    if g.json {
        super::print_json(&r)?;
    } else if !g.quiet {
        for l in &r.removed {
            println!("removed {}", l.description);
        }
        let now = cairn_core::time::now_unix();
        for l in &r.remaining {
            match &l.lock {
                Some(lock) => {
                    let stale_in = (lock.refreshed
                        + cairn_core::repo::lock::STALE_AFTER.as_secs() as i64
                        - now)
                        .max(0);
                    println!(
                        "in use: {} (refreshed {} min ago; stale in {} min if its process is gone)",
                        l.description,
                        (now - lock.refreshed).max(0) / 60,
                        (stale_in + 59) / 60
                    );
                }
                None => println!("in use: {}", l.description),
            }
        }
        // A job that died on another machine cannot be seen dead from here.
        let here = cairn_core::repo::hostname();
        if !a.remove_all
            && r.remaining
                .iter()
                .any(|l| l.lock.as_ref().is_some_and(|k| k.hostname != here))
        {
            println!(
                "a lock whose process died on another machine goes stale 30 minutes after its \
                 last refresh; once you know no cairn is running on this repository, `cairn \
                 unlock --remove-all` removes it now"
            );
        }
        // An unreadable lock never goes stale by itself (its age cannot be read):
        // say how it goes.
        if !a.remove_all
            && r.remaining
                .iter()
                .any(|l| l.description.starts_with("unreadable lock"))
        {
            println!(
                "an unreadable lock counts as held until removed: once no cairn is running \
                 on this repository, `cairn unlock --remove-all` removes it"
            );
        }
        for l in &r.running_here {
            crate::ui::warn(format!(
                "left {}: that process is running on this machine (stop it first; \
                 removing its lock would let a prune delete what it is writing)",
                l.description
            ));
        }
        if r.removed.is_empty() && r.remaining.is_empty() {
            println!("no locks");
        }
    }
    Ok(0)
}
