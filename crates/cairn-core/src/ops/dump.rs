//! Writing one file of a snapshot to a stream (`cairn dump`), through the same
//! read-ahead reader as `export`: blobs are fetched several at a time ahead of the
//! writer, so a large file streams at pack-read speed.

use crate::error::{Error, Result};
use crate::ops::ls::find_node;
use crate::session::{Access, Session};
use cairn_format::BlobId;
use cairn_format::tree::NodeKind;
use std::io::Write;

/// The name an error writing the file's bytes gives as its path (as
/// [`crate::ops::export::ARCHIVE`]).
pub const OUTPUT: &str = "standard output";

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
    let copied = std::thread::scope(|s| {
        let readers = crate::ops::export::BlobReaders::start(s, repo);
        let mut content = crate::ops::export::Content::new(repo, &node, path, &readers);
        let copied = std::io::copy(&mut content, out);
        let error = content.error.take();
        drop(content);
        drop(readers);
        match error {
            Some(e) => Err(e),
            None => Ok(copied),
        }
    })?;
    let written = copied.map_err(|e| Error::io(OUTPUT, e))?;
    out.flush().map_err(|e| Error::io(OUTPUT, e))?;
    Ok(written)
}
