//! Reading many blobs at once: data blobs stored side by side in a pack come in
//! one range read (restore's coalescing), so that a job of a dozen small blobs is
//! one request to remote storage rather than a dozen. Export, dump and the mount's
//! read-ahead read through it.

use crate::error::{Error, Result};
use crate::repo::Repository;
use cairn_format::BlobId;

/// The largest range [`read_blobs`] reads at once (gaps between wanted blobs
/// included): export's eight readers hold 16 MiB at most in all.
const MAX_JOB_RANGE: u32 = 2 << 20;

/// A blob of a [`read_blobs`] call, for coalescing its pack reads.
struct Wanted {
    loc: crate::index::BlobLocation,
    /// Its place in the call's ids.
    at: usize,
}

impl crate::ops::restore::execute::PackSpan for Wanted {
    fn span(&self) -> (u32, u32) {
        (self.loc.offset, self.loc.length)
    }
}

/// Reads `ids` as [`Repository::read_blob`] does, results in the same order, but
/// data blobs side by side in a pack with one range read of at most 2 MiB
/// (restore's coalescing): a tree of small files is many blobs that a backup
/// stored next to each other.
/// A range that cannot be read whole is read blob by blob, so that each error is
/// the one its own read gives.
pub fn read_blobs(repo: &Repository, ids: &[BlobId]) -> Vec<Result<Vec<u8>>> {
    let mut out: Vec<Option<Result<Vec<u8>>>> = (0..ids.len()).map(|_| None).collect();
    let mut wanted = Vec::with_capacity(ids.len());
    for (at, id) in ids.iter().enumerate() {
        match repo.index().get(id) {
            Some(loc) if loc.kind == cairn_format::pack::BlobKind::Data && ids.len() > 1 => {
                wanted.push(Wanted { loc, at })
            }
            // Trees, chunk lists, and what the index lacks: the single read's way
            // (and its error).
            _ => out[at] = Some(repo.read_blob(id)),
        }
    }
    wanted.sort_unstable_by_key(|w| (w.loc.pack_number(), w.loc.offset));
    // Restore's bound, but at most 2 MiB: eight readers each hold one range.
    let max_range = crate::ops::restore::execute::range_limit(repo).min(MAX_JOB_RANGE);
    for same_pack in wanted.chunk_by(|a, b| a.loc.pack_number() == b.loc.pack_number()) {
        let pack = repo.index().pack_of(&same_pack[0].loc);
        for range in crate::ops::restore::execute::ranges(same_pack, max_range) {
            let start = u64::from(range[0].loc.offset);
            let end = range
                .iter()
                .map(|w| u64::from(w.loc.offset) + u64::from(w.loc.length))
                .max()
                .unwrap_or(start);
            let whole = if range.len() > 1 {
                match repo.read_pack_range(&pack, start, end - start) {
                    Ok(b) => Some(b),
                    // Storage that does not answer now (it kept failing, or fell
                    // silent): each blob again on its own would fail as well, one
                    // after the other (CI: a mount waited 80 s, eight silent reads
                    // after the range's). Every blob of the range has its error,
                    // as a restore's range does (`restore::execute`). An I/O
                    // error (`Other`) may be a bad sector under part of the range:
                    // blob by blob, below, as there.
                    Err(e) => match e.root() {
                        Error::Backend(b)
                            if matches!(
                                b.kind,
                                cairn_backend::BackendErrorKind::Transient
                                    | cairn_backend::BackendErrorKind::Unreachable
                            ) =>
                        {
                            for w in range {
                                out[w.at] = Some(Err(Error::Backend(b.clone())));
                            }
                            continue;
                        }
                        // Lost, damaged or unreadable there: each blob on its own
                        // says which are, and may have another copy.
                        _ => None,
                    },
                }
            } else {
                None
            };
            for w in range {
                let lo = (u64::from(w.loc.offset) - start) as usize;
                let sealed = whole
                    .as_deref()
                    .and_then(|b| b.get(lo..lo + w.loc.length as usize));
                out[w.at] = Some(match sealed {
                    // A copy that does not hold its blob: another may.
                    Some(sealed) => crate::repo::blob::decode(
                        repo.key(),
                        &ids[w.at],
                        sealed,
                        w.loc.raw_length,
                        w.loc.compression,
                    )
                    .or_else(|e| repo.read_other_copy(&ids[w.at], |l| *l == w.loc).ok_or(e)),
                    None => repo.read_blob(&ids[w.at]),
                });
            }
        }
    }
    out.into_iter()
        .map(|r| r.unwrap_or_else(|| Err(Error::Invalid("a blob read went missing".into()))))
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use cairn_format::pack::BlobKind;
    use std::sync::Arc;

    /// `read_blobs` gives what `read_blob` gives for every id, in the order asked,
    /// whatever the mix (two packs, duplicates, metadata, unknown ids), and a
    /// damaged blob or a truncated pack costs only the blobs it holds.
    #[test]
    fn read_blobs_gives_what_read_blob_gives_for_every_id() {
        let mut repo = crate::testutil::mem_repo();
        let blobs = |seed: u8, n: usize| -> Vec<(BlobKind, Vec<u8>)> {
            (0..n)
                .map(|i| {
                    let len = 50 + i * 31;
                    (
                        BlobKind::Data,
                        (0..len).map(|j| (j * 7 + i) as u8 ^ seed).collect(),
                    )
                })
                .collect()
        };
        let mut a = blobs(1, 10);
        let mut b = blobs(2, 5);
        b.push((BlobKind::ChunkList, b"a chunk list".to_vec()));
        a.push((BlobKind::Data, vec![9u8; 4000]));
        let pa = crate::testutil::store(&repo, &a);
        let pb = crate::testutil::store(&repo, &b);
        repo.write_index_file(&cairn_format::index::IndexFile {
            packs: vec![pa.clone(), pb.clone()],
            ..Default::default()
        })
        .unwrap();
        repo.load_index_in_ram().unwrap();
        let id = |d: &[u8]| repo.key().blob_id(d);
        let mut ids: Vec<BlobId> = a.iter().chain(&b).map(|(_, d)| id(d)).collect();
        ids.reverse();
        ids.push(ids[3]);
        ids.insert(2, BlobId([7; 32]));
        let check = |ids: &[BlobId]| {
            let got = read_blobs(&repo, ids);
            assert_eq!(got.len(), ids.len());
            for (i, (g, id)) in got.iter().zip(ids).enumerate() {
                match (g, repo.read_blob(id)) {
                    (Ok(g), Ok(w)) => assert_eq!(g, &w, "blob {i}"),
                    (Err(g), Err(w)) => assert_eq!(g.to_string(), w.to_string(), "blob {i}"),
                    (g, w) => panic!("blob {i}: read_blobs {g:?}, read_blob {w:?}"),
                }
            }
            got.iter().filter(|r| r.is_err()).count()
        };
        assert_eq!(check(&ids), 1, "only the unknown id fails");

        // One blob of pack A damaged: that blob alone fails.
        let name = cairn_backend::names::pack(&pa.id.to_hex());
        let mut bytes = repo.backend().get(&name).unwrap();
        let hit = &pa.blobs[4];
        bytes[(hit.offset + hit.length / 2) as usize] ^= 0x40;
        repo.backend().put(&name, &bytes).unwrap();
        assert_eq!(check(&ids), 2);
        assert!(read_blobs(&repo, &[hit.id, pa.blobs[5].id])[0].is_err());
        assert!(read_blobs(&repo, &[hit.id, pa.blobs[5].id])[1].is_ok());

        // Pack B cut short after its second blob: its later blobs fail, the first
        // two still read (the range is read again blob by blob).
        let name = cairn_backend::names::pack(&pb.id.to_hex());
        let bytes = repo.backend().get(&name).unwrap();
        let cut = (pb.blobs[1].offset + pb.blobs[1].length) as usize;
        repo.backend().put(&name, &bytes[..cut]).unwrap();
        let data_b: Vec<BlobId> = pb.blobs.iter().map(|x| x.id).collect();
        let got = read_blobs(&repo, &data_b);
        assert!(got[0].is_ok() && got[1].is_ok());
        assert!(got[2..].iter().all(|r| r.is_err()));
        check(&ids);
    }

    /// A range the storage does not answer for now (a remote that kept failing
    /// or fell silent) is not asked for again blob by blob: one failed request,
    /// and each blob has its error (CI: a mount waited eight silences more). An
    /// I/O error, which may cover part of the range, is read blob by blob.
    #[test]
    fn a_range_the_storage_does_not_answer_for_is_not_read_again_blob_by_blob() {
        let read_with = |spec: &str| {
            let faulty = Arc::new(cairn_backend::FaultyBackend::new(
                Arc::new(cairn_backend::MemBackend::new()),
                cairn_backend::FaultSpec::parse(spec).unwrap(),
            ));

            let opts = crate::repo::InitOptions {
                encryption: false,
                ..Default::default()
            };
            let mut repo = Repository::init(faulty.clone(), None, &opts).unwrap();
            let blobs: Vec<(BlobKind, Vec<u8>)> = (0..6u8)
                .map(|i| (BlobKind::Data, vec![i; 300 + usize::from(i)]))
                .collect();
            let pack = crate::testutil::store(&repo, &blobs);
            repo.write_index_file(&cairn_format::index::IndexFile {
                packs: vec![pack.clone()],
                ..Default::default()
            })
            .unwrap();
            repo.load_index_in_ram().unwrap();
            let ids: Vec<BlobId> = pack.blobs.iter().map(|b| b.id).collect();
            let got = read_blobs(&repo, &ids);
            assert!(
                got.iter()
                    .all(|r| r.as_ref().is_err_and(|e| e.is_read_failure())),
                "{got:?}"
            );
            faulty.injected()
        };
        assert_eq!(
            read_with("fail=1,ops=get,names=data/"),
            1,
            "one request for the range, no more"
        );
        assert_eq!(read_with("fail=1,ops=get,names=data/,kind=io"), 7);
    }
}
