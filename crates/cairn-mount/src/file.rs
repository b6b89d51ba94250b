//! An open file of a snapshot: reads at any offset, and reads ahead when they
//! come in order.
//!
//! The file's chunk list is not walked from the start: [`FileReader::chunks_from`]
//! descends the chunk-list tree by byte counts to the chunk holding the offset, and
//! the next [`WINDOW_CHUNKS`] chunks (with their offsets) are kept with the open
//! file, so that reads in order find their chunks without descending again and a
//! seek costs one descent (a few small blobs, cached). A read that continues where
//! the last one ended starts fetching the next [`AHEAD_BLOBS`] blobs (at most
//! [`AHEAD_BYTES`]) on the fetcher's workers.

use crate::fetch::Fetcher;
use crate::trees::lock;
use cairn_core::Error;
use cairn_core::session::{Read, Session};
use cairn_core::tree::chunklist::FileReader;
use cairn_format::tree::{ChunkRef, Content};
use cairn_format::{BlobId, FormatError};
use std::sync::{Arc, Mutex};

/// Chunks located at a time (40 bytes each with their offset).
pub const WINDOW_CHUNKS: usize = 1024;
/// How far a sequential reader is read ahead.
pub const AHEAD_BLOBS: usize = 16;
pub const AHEAD_BYTES: u64 = 16 << 20;

pub struct OpenFile {
    content: Content,
    size: u64,
    /// Names the file in error messages.
    pub label: String,
    window: Mutex<Window>,
}

#[derive(Default)]
struct Window {
    /// Consecutive chunks and the file offset each starts at.
    chunks: Vec<(ChunkRef, u64)>,
    /// The last chunk of `chunks` is the file's last.
    to_end: bool,
    /// Where the previous read ended: a read starting there is sequential.
    next: Option<u64>,
}

impl Window {
    fn end(&self) -> u64 {
        self.chunks
            .last()
            .map_or(0, |(c, s)| s.saturating_add(c.length))
    }
    fn start(&self) -> u64 {
        self.chunks.first().map_or(0, |(_, s)| *s)
    }
    fn covers(&self, offset: u64) -> bool {
        !self.chunks.is_empty() && self.start() <= offset && offset < self.end()
    }
    /// Index of the chunk holding `offset` (which the window covers).
    fn index_of(&self, offset: u64) -> usize {
        self.chunks
            .partition_point(|(c, s)| s.saturating_add(c.length) <= offset)
    }
}

/// A failure of one read, with the blob it concerns if there is one.
pub struct ReadError {
    pub error: Arc<Error>,
    pub blob: Option<String>,
}

impl From<Error> for ReadError {
    fn from(e: Error) -> Self {
        ReadError {
            error: Arc::new(e),
            blob: None,
        }
    }
}

fn short_content(label: &str) -> Error {
    Error::damaged(
        format!("content of {label}"),
        FormatError::malformed("chunk list", "shorter than the file's recorded size"),
    )
}

impl OpenFile {
    pub fn new(content: Content, size: u64, label: String) -> OpenFile {
        OpenFile {
            content,
            size,
            label,
            window: Mutex::new(Window::default()),
        }
    }

    fn locate(&self, session: &Session<Read>, w: &mut Window, from: u64) -> Result<(), Error> {
        let reader = FileReader::new(session.repo(), &self.content, self.size);
        let mut chunks = Vec::with_capacity(WINDOW_CHUNKS.min(64));
        let mut to_end = true;
        reader.chunks_from(from, &mut |c, start| {
            chunks.push((c, start));
            if chunks.len() >= WINDOW_CHUNKS {
                to_end = false;
                return Ok(false);
            }
            Ok(true)
        })?;
        w.chunks = chunks;
        w.to_end = to_end;
        Ok(())
    }

    /// Up to `len` bytes at `offset` (fewer only at the end of the file).
    pub fn read(
        &self,
        session: &Arc<Session<Read>>,
        fetcher: &Fetcher,
        offset: u64,
        len: usize,
    ) -> Result<Vec<u8>, ReadError> {
        if offset >= self.size || len == 0 {
            return Ok(Vec::new());
        }
        let want = (len as u64).min(self.size - offset);
        let end = offset + want;
        // Under the lock only what locates chunks; blobs are fetched after it.
        let (needed, ahead) = {
            let mut w = lock(&self.window);
            let sequential = w.next == Some(offset);
            w.next = Some(end);
            if !w.covers(offset) {
                self.locate(session, &mut w, offset)?;
            }
            let mut needed: Vec<(ChunkRef, u64)> = Vec::new();
            let mut pos = offset;
            while pos < end {
                if !w.covers(pos) {
                    if w.to_end {
                        return Err(short_content(&self.label).into());
                    }
                    self.locate(session, &mut w, pos)?;
                    if !w.covers(pos) {
                        return Err(short_content(&self.label).into());
                    }
                }
                let i = w.index_of(pos);
                for &(c, s) in &w.chunks[i..] {
                    if s >= end {
                        break;
                    }
                    needed.push((c, s));
                    pos = s.saturating_add(c.length);
                }
            }
            let mut ahead = Vec::new();
            if sequential {
                let i = w.index_of(end.saturating_sub(1)) + 1;
                if w.chunks.len().saturating_sub(i) < AHEAD_BLOBS && !w.to_end {
                    // Near the end of the window: locate from here on.
                    self.locate(session, &mut w, offset)?;
                }
                let i = w.index_of(end.saturating_sub(1)) + 1;
                let mut bytes = 0u64;
                for &(c, _) in w.chunks.iter().skip(i).take(AHEAD_BLOBS) {
                    if bytes >= AHEAD_BYTES {
                        break;
                    }
                    bytes += c.length;
                    ahead.push(c.id);
                }
            }
            (needed, ahead)
        };
        let later: Vec<BlobId> = needed
            .iter()
            .skip(1)
            .map(|(c, _)| c.id)
            .chain(ahead)
            .collect();
        fetcher.prefetch(session, &later);
        let mut out = Vec::with_capacity(want as usize);
        for (c, start) in needed {
            let data = fetcher.get(session, &c.id).map_err(|e| ReadError {
                error: e,
                blob: Some(c.id.short()),
            })?;
            if data.len() as u64 != c.length {
                return Err(ReadError {
                    error: Arc::new(Error::damaged(
                        format!("blob {}", c.id.short()),
                        FormatError::malformed("chunk", "length differs from its chunk list"),
                    )),
                    blob: Some(c.id.short()),
                });
            }
            let from = (offset + out.len() as u64).saturating_sub(start) as usize;
            let n =
                (data.len().saturating_sub(from)).min((want as usize).saturating_sub(out.len()));
            if let Some(piece) = data.get(from..from + n) {
                out.extend_from_slice(piece);
            }
        }
        if (out.len() as u64) < want {
            return Err(short_content(&self.label).into());
        }
        Ok(out)
    }
}
