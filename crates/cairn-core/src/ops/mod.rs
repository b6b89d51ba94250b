//! The operations: each takes options and returns a typed report.

pub mod backup;
pub mod blobs;
pub mod check;
pub mod copy;
pub mod diff;
pub mod dump;
pub mod export;
pub mod find;
pub mod forget;
pub mod image;
pub mod inspect;
pub mod ls;
pub mod prune;
pub mod repair;
pub mod restore;
pub mod rewrite;
mod scan;
pub mod stats;
pub mod tag;

/// Refuses `what` through a client shown only part of the snapshots (a cairn
/// server's host-bound backup or restore token): what the other snapshots use
/// would be taken for unused (QA: a prune through such a token deleted every
/// other host's data, and `repair snapshots` recorded their snapshots as lost).
pub(crate) fn needs_every_snapshot(
    repo: &crate::repo::Repository,
    what: &str,
) -> crate::Result<()> {
    if let Some(host) = repo.backend().partial_view()? {
        return Err(crate::Error::Invalid(format!(
            "{what} needs every snapshot of the datastore, and this token is shown only \
             host {host:?}'s: what other hosts' snapshots use would look unused; run it \
             with an admin token (or as a job of the server)"
        )));
    }
    Ok(())
}
