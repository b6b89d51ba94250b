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
    if node.kind == NodeKind::Symlink {
        // Where it leads, as `--image-fs` says it (QA r35).
        return Err(Error::Invalid(format!(
            "{} is a symlink to {}, not a file: dump where it leads",
            crate::ops::ls::shown(path),
            crate::ops::ls::shown(&crate::tree::escape_name(&node.link_target))
        )));
    }
    if node.kind != NodeKind::File {
        return Err(Error::Invalid(format!(
            "{path} is a {}, not a file",
            node.kind.name()
        )));
    }
    let mut counted = Counted { out, bytes: 0 };
    let copied = std::thread::scope(|s| {
        let readers = crate::ops::export::BlobReaders::start(s, repo);
        let mut content = crate::ops::export::Content::new(repo, &node, path, &readers);
        let copied = std::io::copy(&mut content, &mut counted);
        let error = content.error.take();
        drop(content);
        drop(readers);
        match error {
            // Whoever reads the stream must hear that it is cut short, and where:
            // the bytes before are the file's, the rest never came.
            Some(e) => Err(Error::Incomplete(format!(
                "{path}: {e}; the output was cut short after the first {} of its {} bytes",
                counted.bytes, node.size
            ))),
            None => Ok(copied),
        }
    })?;
    let out = counted.out;
    let written = copied.map_err(|e| Error::io(OUTPUT, e))?;
    out.flush().map_err(|e| Error::io(OUTPUT, e))?;
    Ok(written)
}

/// A writer that counts what reached it (how much of a file a failed dump gave).
pub(crate) struct Counted<'a> {
    pub(crate) out: &'a mut dyn Write,
    pub(crate) bytes: u64,
}

impl Write for Counted<'_> {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        let n = self.out.write(buf)?;
        self.bytes += n as u64;
        Ok(n)
    }
    fn flush(&mut self) -> std::io::Result<()> {
        self.out.flush()
    }
}
