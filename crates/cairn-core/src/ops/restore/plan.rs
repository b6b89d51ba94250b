//! Restore planning (sans-IO apart from loading chunk lists): which blobs of which
//! packs go to which file offsets, grouped by pack and sorted by offset so that
//! execution reads every pack once, front to back.

use super::{Failure, FileJob};
use crate::error::Error;
use crate::index::MasterIndex;
use crate::repo::Repository;
use crate::tree::chunklist::for_each_chunk;
use cairn_format::BlobId;
use cairn_format::pack::BlobCompression;
use std::collections::HashMap;

#[derive(Clone, Copy, Debug)]
pub(crate) struct Need {
    pub offset: u32,
    pub length: u32,
    pub raw_length: u32,
    pub compression: BlobCompression,
    pub id: BlobId,
    pub file: u32,
    pub file_offset: u64,
}

impl Need {
    /// Whether `loc`, a copy in pack number `pack`, is the entry this need reads.
    pub(crate) fn is_at(&self, pack: u32, loc: &crate::index::BlobLocation) -> bool {
        loc.is_entry(
            pack,
            self.offset,
            self.length,
            self.raw_length,
            self.compression,
        )
    }
}

pub(crate) struct Plan {
    /// (pack number in the master index, needs sorted by offset)
    pub packs: Vec<(u32, Vec<Need>)>,
    /// Files that cannot be fully restored, with why.
    pub failed: HashMap<u32, Failure>,
}

pub(crate) fn plan(repo: &Repository, jobs: &[FileJob]) -> Plan {
    let index = repo.index();
    let mut by_pack: HashMap<u32, Vec<Need>> = HashMap::new();
    let mut failed = HashMap::new();
    for (i, job) in jobs.iter().enumerate() {
        let file = i as u32;
        let mut offset = 0u64;
        let mut missing: Option<String> = None;
        let r = for_each_chunk(repo, &job.node.content, &mut |c| {
            // A copy of the wrong length (damage, or an entry an append-only
            // writer placed) may have a true twin: the first of the right length.
            let loc = index.get(&c.id).map(|loc| {
                if u64::from(loc.raw_length) == c.length {
                    return loc;
                }
                index
                    .copies(&c.id)
                    .into_iter()
                    .find(|l| u64::from(l.raw_length) == c.length)
                    .unwrap_or(loc)
            });
            match loc {
                Some(loc) if u64::from(loc.raw_length) == c.length => {
                    by_pack
                        .entry(MasterIndex::pack_number_of(&loc))
                        .or_default()
                        .push(Need {
                            offset: loc.offset,
                            length: loc.length,
                            raw_length: loc.raw_length,
                            compression: loc.compression,
                            id: c.id,
                            file,
                            file_offset: offset,
                        });
                }
                Some(_) => {
                    missing.get_or_insert_with(|| {
                        format!("chunk {} has the wrong length", c.id.short())
                    });
                }
                None => {
                    missing.get_or_insert_with(|| Error::BlobNotFound(c.id).to_string());
                }
            }
            offset += c.length;
            Ok(())
        });
        // Each a loss of the repository's: a chunk list that does not read, a
        // chunk the index lacks or lists at another length, a tree whose chunks
        // do not make up the file.
        if let Err(e) = r {
            failed.insert(file, Failure::error(&e));
        } else if let Some(m) = missing {
            failed.insert(file, Failure::lost(m));
        } else if offset != job.node.size {
            failed.insert(
                file,
                Failure::lost(format!(
                    "chunks cover {offset} bytes, the file has {}",
                    job.node.size
                )),
            );
        }
    }
    let mut packs: Vec<(u32, Vec<Need>)> = by_pack.into_iter().collect();
    packs.sort_by_key(|(p, _)| *p);
    for (_, needs) in &mut packs {
        needs.sort_by_key(|n| (n.offset, n.file, n.file_offset));
    }
    Plan { packs, failed }
}
