//! `cairn serve scrub`: finds bit rot on the server itself, without the key.
//!
//! Every pack, index file, snapshot, key file and pending record is named by the
//! BLAKE3 hash of its stored bytes, so reading it whole and hashing it proves it
//! intact or damaged. Packs must also end in a pack trailer. Locks (random names)
//! and the config (a MAC under the key) cannot be checked this way and are skipped.

use cairn_backend::{Backend, BackendErrorKind, ObjectInfo};
use cairn_core::progress::{Phase, Progress};
use serde::Serialize;
use std::sync::atomic::{AtomicBool, Ordering};

/// One object that failed.
#[derive(Clone, Debug, Serialize, PartialEq, Eq)]
pub struct ScrubProblem {
    pub name: String,
    /// `hash_mismatch`, `not_a_pack`, `empty`, `vanished` (listed, then gone) or
    /// `unreadable`.
    pub problem: &'static str,
    pub detail: String,
}

#[derive(Clone, Debug, Default, Serialize)]
pub struct ScrubReport {
    pub objects_checked: u64,
    pub bytes_read: u64,
    /// Names that are not repository objects (left alone, listed here).
    pub unknown_names: Vec<String>,
    pub problems: Vec<ScrubProblem>,
    pub secs: f64,
}

impl ScrubReport {
    pub fn is_clean(&self) -> bool {
        self.problems.iter().all(|p| p.problem == "vanished")
    }
}

/// What checking one object found.
enum Checked {
    Fine(u64),
    Problem(ScrubProblem, u64),
    /// The storage failed (after its retries): the scrub stops.
    Failed(cairn_backend::BackendError),
    /// Not read: the scrub was stopping.
    Skipped,
}

/// Why a scrub did not finish.
#[derive(Debug, thiserror::Error)]
pub enum ScrubError {
    /// The storage failed (after its retries).
    #[error(transparent)]
    Storage(#[from] cairn_backend::BackendError),
    /// `progress` was cancelled (the server is stopping): the scrub stopped
    /// between objects.
    #[error("the scrub was stopped before it read every object")]
    Cancelled,
}

/// Checks every content-addressed object of the datastore on `threads` threads,
/// reporting bytes and objects done on `progress`; stops between objects when
/// `progress` is cancelled.
pub fn scrub(
    backend: &dyn Backend,
    threads: usize,
    progress: &Progress,
) -> Result<ScrubReport, ScrubError> {
    let started = std::time::Instant::now();
    // The config first: a datastore whose file system went away (or that was
    // deleted) lists nothing, which must not pass for a clean scrub of nothing.
    backend.get_bounded(
        cairn_backend::names::CONFIG,
        cairn_format::consts::MAX_SMALL_OBJECT_SIZE as u64,
    )?;
    let mut work: Vec<(ObjectInfo, crate::policy::Kind)> = Vec::new();
    let mut unknown = Vec::new();
    // Dedup lists too: they carry their own checksum (QA r33: a damaged one was
    // "no damage found"; the server reads such a list as damaged and has its
    // clients read that index file whole, so it costs speed, not data).
    for prefix in [
        "data/",
        "index/",
        "snapshots/",
        "keys/",
        "pending/",
        "dedup/",
    ] {
        for o in backend.list(prefix)? {
            match crate::policy::classify(&o.name) {
                Ok(k) if k.content_addressed() || k == crate::policy::Kind::DedupList => {
                    work.push((o, k))
                }
                Ok(_) => {}
                Err(_) => unknown.push(o.name),
            }
        }
    }
    // Largest first: the threads finish together.
    work.sort_by_key(|w| std::cmp::Reverse(w.0.size));
    progress.phase(Phase::ReadingPacks);
    progress.set_total(
        Some(work.iter().map(|w| w.0.size).sum()),
        Some(work.len() as u64),
    );
    let stop = AtomicBool::new(false);
    let results = cairn_core::threads::parallel_map(&work, threads, |(o, kind)| {
        if stop.load(Ordering::Relaxed) || progress.is_cancelled() {
            return Checked::Skipped;
        }
        let r = check_one(backend, o, *kind);
        match &r {
            Checked::Failed(_) => stop.store(true, Ordering::Relaxed),
            Checked::Fine(n) | Checked::Problem(_, n) => {
                progress.bytes_done(*n);
                progress.file_done();
            }
            Checked::Skipped => {}
        }
        r
    });
    progress.finish();
    if progress.is_cancelled() {
        return Err(ScrubError::Cancelled);
    }
    let mut report = ScrubReport {
        unknown_names: unknown,
        ..ScrubReport::default()
    };
    for r in results {
        match r {
            Checked::Fine(n) => {
                report.objects_checked += 1;
                report.bytes_read += n;
            }
            Checked::Problem(p, n) => {
                report.objects_checked += 1;
                report.bytes_read += n;
                report.problems.push(p);
            }
            Checked::Failed(e) => return Err(e.into()),
            Checked::Skipped => {}
        }
    }
    report.problems.sort_by(|a, b| a.name.cmp(&b.name));
    report.secs = started.elapsed().as_secs_f64();
    Ok(report)
}

fn check_one(backend: &dyn Backend, o: &ObjectInfo, kind: crate::policy::Kind) -> Checked {
    let problem = |problem, detail: String, n| {
        Checked::Problem(
            ScrubProblem {
                name: o.name.clone(),
                problem,
                detail,
            },
            n,
        )
    };
    // No object larger than its kind allows is read into memory (a file that grew
    // on the server's disk is reported, not loaded).
    let max = kind.max_size(cairn_format::consts::MAX_PACK_SIZE);
    let data = match backend.get_bounded(&o.name, max) {
        Ok(d) => d,
        Err(e) if e.is_not_found() => {
            return problem("vanished", "listed, then gone (pruned meanwhile)".into(), 0);
        }
        Err(e) if matches!(e.kind, BackendErrorKind::Other | BackendErrorKind::TooLarge) => {
            return problem("unreadable", e.to_string(), 0);
        }
        // The storage itself failing: stop, do not report every later object as
        // damaged.
        Err(e) => return Checked::Failed(e),
    };
    let n = data.len() as u64;
    match crate::policy::verify(kind, &o.name, &data) {
        Ok(()) => Checked::Fine(n),
        Err(m) => problem(m.kind(), format!("{n} bytes: {m}"), n),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use cairn_backend::MemBackend;

    #[test]
    fn finds_flipped_bits_and_nothing_else() {
        let b = MemBackend::new();
        let mut pack = vec![5u8; 1000];
        pack.extend_from_slice(&100u32.to_le_bytes());
        pack.extend_from_slice(b"CAIRNPK1");
        let id = blake3::hash(&pack).to_hex().to_string();
        b.put(&format!("data/{}/{id}", &id[..2]), &pack).unwrap();
        let snap = b"a snapshot".to_vec();
        let sid = blake3::hash(&snap).to_hex().to_string();
        b.put(&format!("snapshots/{sid}"), &snap).unwrap();
        b.put("locks/whatever", b"x").unwrap();
        b.put("config", b"{}").unwrap();
        let r = scrub(&b, 2, &Progress::none()).unwrap();
        assert!(r.is_clean(), "{r:?}");
        assert_eq!(r.objects_checked, 2);
        assert_eq!(r.bytes_read, pack.len() as u64 + snap.len() as u64);
        // One flipped bit in the pack.
        pack[17] ^= 0x10;
        b.put(&format!("data/{}/{id}", &id[..2]), &pack).unwrap();
        let r = scrub(&b, 2, &Progress::none()).unwrap();
        assert!(!r.is_clean());
        assert_eq!(r.problems.len(), 1);
        assert_eq!(r.problems[0].problem, "hash_mismatch");
        assert!(r.problems[0].name.ends_with(&id));
    }

    #[test]
    fn a_datastore_without_its_config_fails_rather_than_scrub_nothing() {
        let b = MemBackend::new();
        match scrub(&b, 2, &Progress::none()) {
            Err(ScrubError::Storage(e)) => assert_eq!(e.kind, BackendErrorKind::NotFound, "{e}"),
            other => panic!("{:?}", other.map(|r| r.objects_checked)),
        }
    }

    /// Asked to stop (the server stopping), a scrub reads no further object and
    /// says it did not finish (QA: it ran to its end after SIGTERM).
    #[test]
    fn a_cancelled_scrub_stops_between_objects() {
        let b = MemBackend::new();
        b.put(cairn_backend::names::CONFIG, b"config").unwrap();
        let p = Progress::none();
        p.cancel_token().cancel();
        assert!(matches!(scrub(&b, 2, &p), Err(ScrubError::Cancelled)));
    }

    #[test]
    fn a_local_datastore_whose_file_system_went_away_says_so() {
        let dir = tempfile::tempdir().unwrap();
        let b = cairn_backend::LocalBackend::new(dir.path());
        b.put("config", b"{}").unwrap();
        // Seen once, as a server sees it at start; then gone, as after an unmount.
        b.get("config").unwrap();
        std::fs::remove_file(dir.path().join("config")).unwrap();
        let e = scrub(&b, 2, &Progress::none()).unwrap_err();
        assert!(e.to_string().contains("holds no config any more"), "{e}");
    }

    /// Dedup lists are checked by their own checksum and the index file they
    /// name (QA r33: a damaged one was "no damage found").
    #[test]
    fn damaged_dedup_lists_are_found() {
        use cairn_format::dedup::DedupList;
        let b = MemBackend::new();
        b.put("config", b"{}").unwrap();
        let list = |i: u8| DedupList {
            index: cairn_format::IndexId([i; 32]),
            metadata: false,
            admin: false,
            supersedes: Vec::new(),
            ids: vec![cairn_format::BlobId([9; 32])],
            packs: None,
        };
        b.put(
            &format!("dedup/{}", hex::encode([1u8; 32])),
            &list(1).encode(),
        )
        .unwrap();
        let r = scrub(&b, 2, &Progress::none()).unwrap();
        assert!(r.is_clean(), "{r:?}");
        assert_eq!(r.objects_checked, 1);
        let mut bad = list(2).encode();
        bad[20] ^= 1;
        b.put(&format!("dedup/{}", hex::encode([2u8; 32])), &bad)
            .unwrap();
        // Whole, but under another index file's name.
        b.put(
            &format!("dedup/{}", hex::encode([3u8; 32])),
            &list(4).encode(),
        )
        .unwrap();
        let r = scrub(&b, 2, &Progress::none()).unwrap();
        let names: Vec<&str> = r.problems.iter().map(|p| p.name.as_str()).collect();
        assert_eq!(names.len(), 2, "{r:?}");
        assert!(names[0].ends_with(&hex::encode([2u8; 32])));
        assert!(names[1].ends_with(&hex::encode([3u8; 32])));
    }
}
