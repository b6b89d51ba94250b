//! `cairn serve scrub`: finds bit rot on the server itself, without the key.
//!
//! Every pack, index file, snapshot, key file and pending record is named by the
//! BLAKE3 hash of its stored bytes, so reading it whole and hashing it proves it
//! intact or damaged. Packs must also end in a pack trailer. Locks (random names)
//! and the config (a MAC under the key) cannot be checked this way and are skipped.

use cairn_backend::{Backend, BackendErrorKind, ObjectInfo};
use serde::Serialize;
use std::sync::Mutex;
use std::sync::atomic::{AtomicU64, Ordering};

/// One object that failed.
#[derive(Clone, Debug, Serialize, PartialEq, Eq)]
pub struct ScrubProblem {
    pub name: String,
    /// `hash_mismatch`, `not_a_pack`, `vanished` (listed, then gone) or `unreadable`.
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

/// Checks every content-addressed object of the datastore on `threads` threads;
/// `progress` is called with (objects done, bytes read) after each object.
pub fn scrub(
    backend: &dyn Backend,
    threads: usize,
    progress: &(dyn Fn(u64, u64) + Sync),
) -> Result<ScrubReport, cairn_backend::BackendError> {
    let started = std::time::Instant::now();
    let mut work: Vec<(ObjectInfo, crate::policy::Kind)> = Vec::new();
    let mut unknown = Vec::new();
    for prefix in ["data/", "index/", "snapshots/", "keys/", "pending/"] {
        for o in backend.list(prefix)? {
            match crate::policy::classify(&o.name) {
                Ok(k) if k.content_addressed() => work.push((o, k)),
                Ok(_) => {}
                Err(_) => unknown.push(o.name),
            }
        }
    }
    // Largest first: the threads finish together.
    work.sort_by_key(|w| std::cmp::Reverse(w.0.size));
    let next = AtomicU64::new(0);
    let done = AtomicU64::new(0);
    let bytes = AtomicU64::new(0);
    let problems = Mutex::new(Vec::new());
    let fatal = Mutex::new(None);
    std::thread::scope(|s| {
        for _ in 0..threads.max(1) {
            s.spawn(|| {
                loop {
                    let i = next.fetch_add(1, Ordering::Relaxed) as usize;
                    let Some((o, kind)) = work.get(i) else { break };
                    if let Some(p) = check_one(backend, o, *kind, &bytes, &fatal) {
                        problems.lock().unwrap_or_else(|e| e.into_inner()).push(p);
                    }
                    let n = done.fetch_add(1, Ordering::Relaxed) + 1;
                    progress(n, bytes.load(Ordering::Relaxed));
                    if fatal.lock().unwrap_or_else(|e| e.into_inner()).is_some() {
                        break;
                    }
                }
            });
        }
    });
    if let Some(e) = fatal.into_inner().unwrap_or_else(|e| e.into_inner()) {
        return Err(e);
    }
    let mut problems = problems.into_inner().unwrap_or_else(|e| e.into_inner());
    problems.sort_by(|a, b| a.name.cmp(&b.name));
    Ok(ScrubReport {
        objects_checked: done.load(Ordering::Relaxed),
        bytes_read: bytes.load(Ordering::Relaxed),
        unknown_names: unknown,
        problems,
        secs: started.elapsed().as_secs_f64(),
    })
}

fn check_one(
    backend: &dyn Backend,
    o: &ObjectInfo,
    kind: crate::policy::Kind,
    bytes: &AtomicU64,
    fatal: &Mutex<Option<cairn_backend::BackendError>>,
) -> Option<ScrubProblem> {
    let problem = |problem, detail: String| {
        Some(ScrubProblem {
            name: o.name.clone(),
            problem,
            detail,
        })
    };
    let data = match backend.get(&o.name) {
        Ok(d) => d,
        Err(e) if e.is_not_found() => {
            return problem("vanished", "listed, then gone (pruned meanwhile)".into());
        }
        Err(e) if matches!(e.kind, BackendErrorKind::Other | BackendErrorKind::TooLarge) => {
            return problem("unreadable", e.to_string());
        }
        Err(e) => {
            // The storage itself failing (after retries): stop, do not report
            // every later object as damaged.
            *fatal.lock().unwrap_or_else(|e| e.into_inner()) = Some(e);
            return None;
        }
    };
    bytes.fetch_add(data.len() as u64, Ordering::Relaxed);
    let id = crate::policy::id_of(&o.name).unwrap_or("");
    let got = blake3::hash(&data);
    if got.to_hex().as_str() != id {
        return problem(
            "hash_mismatch",
            format!(
                "{} bytes hash to {}, not to the name (bit rot or tampering)",
                data.len(),
                &got.to_hex()[..16]
            ),
        );
    }
    if kind == crate::policy::Kind::Pack {
        use cairn_format::consts::{PACK_TRAILER_LEN, PACK_TRAILER_MAGIC};
        let n = data.len();
        if n < PACK_TRAILER_LEN || &data[n - PACK_TRAILER_MAGIC.len()..] != PACK_TRAILER_MAGIC {
            return problem("not_a_pack", "no pack trailer".into());
        }
    }
    None
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
        let r = scrub(&b, 2, &|_, _| {}).unwrap();
        assert!(r.is_clean(), "{r:?}");
        assert_eq!(r.objects_checked, 2);
        assert_eq!(r.bytes_read, pack.len() as u64 + snap.len() as u64);
        // One flipped bit in the pack.
        pack[17] ^= 0x10;
        b.put(&format!("data/{}/{id}", &id[..2]), &pack).unwrap();
        let r = scrub(&b, 2, &|_, _| {}).unwrap();
        assert!(!r.is_clean());
        assert_eq!(r.problems.len(), 1);
        assert_eq!(r.problems[0].problem, "hash_mismatch");
        assert!(r.problems[0].name.ends_with(&id));
    }
}
