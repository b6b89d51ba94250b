//! Writing one file of a snapshot to a stream (`cairn dump`). Blobs are fetched a few
//! at a time ahead of the writer so a large file streams at pack-read speed.

use crate::error::{Error, Result};
use crate::ops::ls::find_node;
use crate::session::{Access, Session};
use crate::tree::chunklist::for_each_chunk;
use cairn_format::BlobId;
use cairn_format::tree::NodeKind;
use std::io::Write;

/// Writes the file at `path` of the snapshot whose root tree is `root` to `out`;
/// returns the bytes written.
pub fn dump<A: Access>(
    session: &Session<A>,
    root: &BlobId,
    path: &str,
    out: &mut dyn Write,
) -> Result<u64> {
    let repo = session.repo();
    let node = find_node(repo, root, path)?
        .ok_or_else(|| Error::Invalid("dump needs a file path, not the snapshot root".into()))?;
    if node.kind != NodeKind::File {
        return Err(Error::Invalid(format!(
            "{path} is a {}, not a file",
            node.kind.name()
        )));
    }
    let mut written = 0u64;
    let mut batch: Vec<BlobId> = Vec::new();
    let mut flush = |batch: &mut Vec<BlobId>, written: &mut u64| -> Result<()> {
        let blobs: Vec<Result<Vec<u8>>> = std::thread::scope(|s| {
            let hs: Vec<_> = batch
                .iter()
                .map(|id| s.spawn(move || repo.read_blob(id)))
                .collect();
            hs.into_iter()
                .map(|h| {
                    h.join()
                        .unwrap_or_else(|_| Err(Error::Invalid("reader panicked".into())))
                })
                .collect()
        });
        for b in blobs {
            let b = b?;
            out.write_all(&b)
                .map_err(|e| Error::io("standard output", e))?;
            *written += b.len() as u64;
        }
        batch.clear();
        Ok(())
    };
    for_each_chunk(repo, &node.content, &mut |c| {
        batch.push(c.id);
        if batch.len() >= 8 {
            flush(&mut batch, &mut written)?;
        }
        Ok(())
    })?;
    flush(&mut batch, &mut written)?;
    out.flush().map_err(|e| Error::io("standard output", e))?;
    Ok(written)
}
