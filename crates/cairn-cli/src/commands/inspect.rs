//! `cairn list` and `cairn cat`: a repository's objects by hand (restic's `list`
//! and `cat`). The engine reads and checks; this prints.

use crate::args::{CatArgs, Global, ListArgs};
use anyhow::{Context, Result};
use cairn_core::ops::inspect::{self, Stored};
use cairn_core::session::{IndexLoad, Read, Session};
use std::io::{IsTerminal, Write};

fn stored_kind(kind: &str) -> Option<Stored> {
    Some(match kind {
        "snapshots" | "snapshot" => Stored::Snapshots,
        "index" => Stored::Index,
        "packs" | "pack" => Stored::Packs,
        "keys" | "key" => Stored::Keys,
        "locks" | "lock" => Stored::Locks,
        "pending" => Stored::Pending,
        _ => return None,
    })
}

pub fn list(g: &Global, a: &ListArgs) -> Result<i32> {
    let p = super::progress(g);
    let out = std::io::stdout();
    let mut out = std::io::BufWriter::new(out.lock());
    if let Some(kind) = stored_kind(&a.kind) {
        let repo = super::open(g, &p.progress)?;
        let objects = inspect::list_stored(&repo, kind)?;
        if g.json {
            super::print_json(&objects)?;
        } else {
            for o in &objects {
                super::out_raw_line(&mut out, &o.id);
            }
        }
        return super::flush_output(&mut out).map(|()| 0);
    }
    // Blobs: the index, loaded as a restore loads it.
    let session: Session<Read> = super::session(g, "list", IndexLoad::Placement, &p.progress)?;
    let mut json = super::JsonStream::new("[".into());
    for b in inspect::list_blobs(session.repo()) {
        if g.json {
            json.item(&mut out, &serde_json::to_string(&b)?);
        } else {
            super::out_raw_line(&mut out, &format!("{} {}", b.kind, b.id));
        }
    }
    if g.json {
        json.finish(&mut out, "]");
    }
    super::flush_output(&mut out)?;
    // A list short of what unreadable index files held is not the answer (QA:
    // exit 0): said, after what could be listed.
    let errors = session.repo().index_errors();
    if !errors.is_empty() {
        anyhow::bail!(
            "{} could not be read, so the list lacks the blobs only {} held (`cairn check` \
             says more; `cairn repair index` rebuilds the index from the packs)",
            crate::ui::count(errors.len() as u64, "index file"),
            if errors.len() == 1 { "it" } else { "they" }
        );
    }
    Ok(0)
}

pub fn cat(g: &Global, a: &CatArgs) -> Result<i32> {
    let id = match (a.kind.as_str(), a.id.as_deref()) {
        ("config", Some(_)) => {
            return Err(super::bad_argument(
                "`cat config` takes no id: a repository has one config",
            ));
        }
        ("config", None) => "",
        (kind, None) => {
            return Err(super::bad_argument(format!(
                "`cat {kind}` needs an id: `cairn list {}` lists them",
                match kind {
                    "blob" | "tree" | "chunklist" => "blobs",
                    "snapshot" => "snapshots",
                    "key" => "keys",
                    "pack" => "packs",
                    "lock" => "locks",
                    k => k,
                }
            )));
        }
        (_, Some(id)) => id,
    };
    let p = super::progress(g);
    match a.kind.as_str() {
        "blob" | "tree" | "chunklist" => {
            let session: Session<Read> =
                super::session(g, "cat", IndexLoad::Placement, &p.progress)?;
            let repo = session.repo();
            match a.kind.as_str() {
                "blob" => {
                    let bytes = inspect::blob_bytes(repo, id)?;
                    // Binary on a terminal would garble it (and a blob may hold
                    // escape codes). Said once the id is known to be a blob's (QA:
                    // a wrong id got this answer).
                    if std::io::stdout().is_terminal() {
                        anyhow::bail!(
                            "refusing to write a blob's bytes to the terminal: redirect \
                             standard output (`cairn cat blob {id} > FILE`, or `| less`)"
                        );
                    }
                    let mut out = std::io::stdout().lock();
                    if let Err(e) = out.write_all(&bytes) {
                        if e.kind() == std::io::ErrorKind::BrokenPipe {
                            crate::exit_broken_pipe();
                        }
                        return Err(e).context("writing the blob");
                    }
                    super::flush_output(&mut out)?;
                }
                "tree" => {
                    let tree = inspect::tree_of(&session, id)?;
                    super::print_json(&inspect::tree_view(repo, &tree)?)?;
                }
                _ => super::print_json(&inspect::chunk_list_view(repo, id)?)?,
            }
        }
        kind => {
            let repo = super::open(g, &p.progress)?;
            match kind {
                "config" => super::print_json(repo.config())?,
                "key" => super::print_json(&inspect::key_file(&repo, id)?)?,
                "snapshot" => super::print_json(
                    &repo
                        .find_snapshot_with(id, &|note| p.progress.warning_msg(note))?
                        .1,
                )?,
                "index" => super::print_json(&inspect::index_view(&repo, id)?)?,
                "pack" => super::print_json(&inspect::pack_view(&repo, id)?)?,
                "lock" => super::print_json(&inspect::lock_view(&repo, id)?)?,
                "pending" => super::print_json(&inspect::pending_view(&repo, id)?)?,
                other => anyhow::bail!("cannot cat {other:?}"),
            }
        }
    }
    Ok(0)
}
