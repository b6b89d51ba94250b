//! Room kept free on the storage for forget and prune.
//!
//! Forget and prune free space, but both write before they delete: a lock, a
//! record of what was forgotten, and prune a whole new index before any pack
//! goes. A backup that filled the disk to the last byte left a repository that no
//! cairn command could free (the administrator had to find something else on the
//! disk to delete). So whatever adds data (backup, copy, and the backup clients of
//! `cairn serve`) stores no pack that would leave less than [`room_for_prune`]
//! free, on storage whose free space cairn can read. Borg keeps such room too.

use crate::error::Result;
use cairn_backend::{Backend, BackendError, BackendErrorKind, names};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Condvar, Mutex};

/// The free space that what adds data leaves on `backend`'s storage, where it has
/// a limit cairn can read (`None` elsewhere: object storage, a cairn server,
/// which keeps its own): the size of the index files and dedup lists, which a
/// prune writes anew before it deletes anything, plus 1 MiB for locks and
/// forget's records.
pub fn room_for_prune(backend: &dyn Backend) -> Result<Option<u64>> {
    if backend.free_space().is_none() {
        return Ok(None);
    }
    let mut bytes = 1 << 20;
    for prefix in [names::INDEX, names::DEDUP] {
        bytes += backend.list(prefix)?.iter().map(|o| o.size).sum::<u64>();
    }
    Ok(Some(bytes))
}

/// The room one writer (an uploader, a served datastore) keeps, and the packs
/// it is storing right now, which the storage's free space shows only in part
/// while they are written.
#[derive(Debug, Default)]
pub struct Room {
    keep: AtomicU64,
    /// Bytes of the claims granted and not yet dropped.
    storing: Mutex<u64>,
    /// Told when a claim is dropped.
    stored: Condvar,
}

/// Room claimed for one pack until it is stored (or not).
#[must_use]
#[derive(Debug)]
pub struct Claim {
    room: Arc<Room>,
    len: u64,
}

impl Drop for Claim {
    fn drop(&mut self) {
        let mut storing = self.room.storing.lock().unwrap_or_else(|e| e.into_inner());
        *storing = storing.saturating_sub(self.len);
        drop(storing);
        self.room.stored.notify_all();
    }
}

impl Room {
    /// Keeps `bytes` free from now on (0: none).
    pub fn keep(&self, bytes: u64) {
        self.keep.store(bytes, Ordering::Relaxed);
    }

    /// Claims room for an object (a pack; through a server also an index file, a
    /// dedup list or a snapshot) of `len` bytes named `name`, keeping this room's
    /// bytes plus `also` (index files the writer added since the room was
    /// measured) free, or says there is none, as a full disk would ("no space").
    ///
    /// Objects being stored count in full, since the free space shows only what
    /// of them is written so far. When only they stand in the way, the claim waits
    /// for them and looks at the free space again: counted in full beside the
    /// part already written, a 16 MiB pack in flight refused a backup with 13 MiB
    /// free that needed 3 (QA), and the free space it gave was not the disk's.
    pub fn claim(
        self: &Arc<Self>,
        backend: &dyn Backend,
        name: &str,
        len: u64,
        also: u64,
    ) -> Result<Claim, BackendError> {
        let mut storing = self.storing.lock().unwrap_or_else(|e| e.into_inner());
        loop {
            let keep = self.keep.load(Ordering::Relaxed);
            let free = if keep == 0 {
                None
            } else {
                backend.free_space()
            };
            let need = len.saturating_add(keep.saturating_add(also));
            match free {
                Some(free) if free.saturating_sub(*storing) < need => {
                    if free >= need && *storing > 0 {
                        storing = self.stored.wait(storing).unwrap_or_else(|e| e.into_inner());
                        continue;
                    }
                    return Err(BackendError {
                        kind: BackendErrorKind::NoSpace,
                        op: "put",
                        path: name.to_string(),
                        message: format!(
                            "no space left on the repository's device for more data: {} free, \
                             less than what is to be stored ({}) and the {} kept for `cairn \
                             forget` and `cairn prune` to free space with (the index's size \
                             plus 1 MiB)",
                            crate::units::bytes(free, 1),
                            crate::units::bytes(len, 1),
                            crate::units::bytes(keep.saturating_add(also), 1)
                        ),
                    });
                }
                _ => {
                    *storing += len;
                    return Ok(Claim {
                        room: self.clone(),
                        len,
                    });
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A backend with a set amount of free space.
    #[derive(Debug)]
    struct Free(cairn_backend::MemBackend, u64);

    impl Backend for Free {
        fn location(&self) -> String {
            "free".into()
        }
        fn put(&self, name: &str, data: &[u8]) -> cairn_backend::Result<()> {
            self.0.put(name, data)
        }
        fn put_new(&self, name: &str, data: &[u8]) -> cairn_backend::Result<()> {
            self.0.put_new(name, data)
        }
        fn get(&self, name: &str) -> cairn_backend::Result<Vec<u8>> {
            self.0.get(name)
        }
        fn get_range(&self, name: &str, o: u64, l: u64) -> cairn_backend::Result<Vec<u8>> {
            self.0.get_range(name, o, l)
        }
        fn list(&self, prefix: &str) -> cairn_backend::Result<Vec<cairn_backend::ObjectInfo>> {
            self.0.list(prefix)
        }
        fn delete(&self, name: &str) -> cairn_backend::Result<()> {
            self.0.delete(name)
        }
        fn free_space(&self) -> Option<u64> {
            Some(self.1)
        }
    }

    #[test]
    fn packs_in_flight_and_index_files_count_against_the_room() {
        let b = Free(cairn_backend::MemBackend::default(), 100 << 20);
        b.put("index/aa", &vec![0; 3 << 20]).unwrap();
        b.put("dedup/bb", &vec![0; 1 << 20]).unwrap();
        b.put("data/cc", &vec![0; 9 << 20]).unwrap();
        let keep = room_for_prune(&b).unwrap().unwrap();
        assert_eq!(keep, 5 << 20, "index and dedup lists plus 1 MiB; not packs");
        let room = Arc::new(Room::default());
        // Nothing kept: any pack is let through.
        drop(room.claim(&b, "data/x", 200 << 20, 0).unwrap());
        room.keep(keep);
        let a = room.claim(&b, "data/a", 60 << 20, 0).unwrap();
        // More than the disk has free beside the room kept: refused at once,
        // saying what the disk has free.
        let e = room.claim(&b, "data/b", 96 << 20, 0).unwrap_err();
        assert_eq!(e.kind, BackendErrorKind::NoSpace);
        assert!(e.message.contains("100.0 MiB free"), "{}", e.message);
        // Index files written since the room was measured are kept too.
        assert!(room.claim(&b, "data/b", 95 << 20, 1).is_err());
        // 40 MiB left while `a` is stored: 35 MiB fits beside the 5 kept.
        drop(room.claim(&b, "data/b", 35 << 20, 0).unwrap());
        // 36 MiB waits for `a`, then looks again (this disk's free space stays
        // the same: `a` went elsewhere).
        let waiting = {
            let (room, b) = (
                room.clone(),
                Arc::new(Free(cairn_backend::MemBackend::default(), 100 << 20)),
            );
            std::thread::spawn(move || room.claim(b.as_ref(), "data/c", 36 << 20, 0).map(drop))
        };
        std::thread::sleep(std::time::Duration::from_millis(200));
        assert!(!waiting.is_finished(), "waits while `a` is stored");
        drop(a);
        waiting.join().unwrap().unwrap();
        drop(room.claim(&b, "data/b", 95 << 20, 0).unwrap());
        // Storage without a limit cairn reads keeps nothing.
        let mem = cairn_backend::MemBackend::default();
        assert_eq!(room_for_prune(&mem).unwrap(), None);
    }
}
