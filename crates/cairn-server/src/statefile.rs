//! A JSON file in the server's state directory (`tokens.json`, `users.json`,
//! `schedules.json`) that the `cairn serve ...` commands change while a server
//! runs: written whole to a new file (mode 0600, synced) and renamed over the old
//! one, and read again by the server when its time or size changes, so a change
//! takes effect without a restart and a reader never sees half a file.

use serde::Serialize;
use serde::de::DeserializeOwned;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::SystemTime;

#[derive(Debug, thiserror::Error)]
pub enum StateError {
    #[error("cannot read {path}: {message}")]
    Read { path: PathBuf, message: String },
    #[error("cannot write {path}: {message}")]
    Write {
        path: PathBuf,
        message: String,
        /// The file system is full (ENOSPC, EDQUOT): answered 507, not as a clash.
        no_space: bool,
    },
    #[error("{path} is damaged: {message}")]
    Damaged { path: PathBuf, message: String },
}

impl StateError {
    fn write(path: PathBuf, e: &std::io::Error) -> StateError {
        StateError::Write {
            path,
            message: e.to_string(),
            no_space: matches!(
                e.kind(),
                std::io::ErrorKind::StorageFull | std::io::ErrorKind::QuotaExceeded
            ),
        }
    }

    /// Whether the state directory's file system is full.
    pub fn is_no_space(&self) -> bool {
        matches!(self, StateError::Write { no_space: true, .. })
    }
}

/// What identifies a version of the file: its modification time, size and inode
/// (every save renames a new file into place, so the inode changes even when two
/// saves fall in the same clock tick with the same size).
type Version = (SystemTime, u64, u64);
type Cached<T> = (Version, Arc<T>);

pub struct StateFile<T> {
    path: PathBuf,
    /// The contents as last read, with the file's time and size then (shared, not
    /// copied, by every request).
    cache: Mutex<Option<Cached<T>>>,
}

impl<T: DeserializeOwned + Serialize + Default> StateFile<T> {
    pub fn new(path: PathBuf) -> StateFile<T> {
        StateFile {
            path,
            cache: Mutex::new(None),
        }
    }

    pub fn path(&self) -> &Path {
        &self.path
    }

    /// The file as it is now (empty when there is none).
    pub fn load(&self) -> Result<T, StateError> {
        let data = match std::fs::read(&self.path) {
            Ok(d) => d,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(T::default()),
            Err(e) => {
                return Err(StateError::Read {
                    path: self.path.clone(),
                    message: e.to_string(),
                });
            }
        };
        serde_json::from_slice(&data).map_err(|e| StateError::Damaged {
            path: self.path.clone(),
            message: e.to_string(),
        })
    }

    /// The contents, read again only if the file changed since the last call.
    pub fn current(&self) -> Result<Arc<T>, StateError> {
        use std::os::unix::fs::MetadataExt;
        let meta = match std::fs::metadata(&self.path) {
            Ok(m) => Some((
                m.modified().unwrap_or(SystemTime::UNIX_EPOCH),
                m.len(),
                m.ino(),
            )),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => None,
            Err(e) => {
                return Err(StateError::Read {
                    path: self.path.clone(),
                    message: e.to_string(),
                });
            }
        };
        let mut cache = self.cache.lock().unwrap_or_else(|e| e.into_inner());
        let Some(version) = meta else {
            *cache = None;
            return Ok(Arc::default());
        };
        if let Some((v, value)) = cache.as_ref()
            && *v == version
        {
            return Ok(value.clone());
        }
        let value = Arc::new(self.load()?);
        *cache = Some((version, value.clone()));
        Ok(value)
    }

    /// Reads, changes and writes the file as one step against every other process
    /// doing the same (a `cairn serve token add` while another runs, two servers
    /// sharing a state directory): an exclusive `flock` on `<file>.lock` is held
    /// from the read to the rename. The file is written only if `f` succeeds and
    /// changed it.
    pub fn update<R, E: From<StateError>>(
        &self,
        f: impl FnOnce(&mut T) -> Result<R, E>,
    ) -> Result<R, E> {
        let _guard = self.lock_exclusive()?;
        let mut value = self.load()?;
        let before = serde_json::to_vec(&value).ok();
        let r = f(&mut value)?;
        if serde_json::to_vec(&value).ok() != before {
            self.save(&value)?;
        }
        Ok(r)
    }

    fn lock_exclusive(&self) -> Result<nix::fcntl::Flock<std::fs::File>, StateError> {
        use std::os::unix::fs::OpenOptionsExt;
        let mut name = self.path.clone().into_os_string();
        name.push(".lock");
        let lock_path = PathBuf::from(name);
        let err = |e: std::io::Error| StateError::write(lock_path.clone(), &e);
        if let Some(dir) = self.path.parent() {
            std::fs::create_dir_all(dir).map_err(err)?;
        }
        let file = std::fs::OpenOptions::new()
            .read(true)
            .write(true)
            .create(true)
            .truncate(false)
            .mode(0o600)
            .open(&lock_path)
            .map_err(err)?;
        nix::fcntl::Flock::lock(file, nix::fcntl::FlockArg::LockExclusive)
            .map_err(|(_, e)| err(e.into()))
    }

    /// Replaces the file: a new file, synced, renamed over the old one.
    pub fn save(&self, value: &T) -> Result<(), StateError> {
        let werr = |e: std::io::Error| StateError::write(self.path.clone(), &e);
        if let Some(dir) = self.path.parent() {
            std::fs::create_dir_all(dir).map_err(werr)?;
        }
        let body = serde_json::to_vec_pretty(value).map_err(|e| StateError::Write {
            path: self.path.clone(),
            message: e.to_string(),
            no_space: false,
        })?;
        // A full disk leaves no half-written file behind (QA); the rename is
        // synced too, so the state survives a crash.
        cairn_backend::replace_private_file(&self.path, &body, true).map_err(werr)?;
        *self.cache.lock().unwrap_or_else(|e| e.into_inner()) = None;
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Updates from many writers at once (threads here; each opens the lock file on
    /// its own, as separate processes do) all land: none reads a file another is
    /// about to replace.
    #[test]
    fn concurrent_updates_lose_nothing() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("list.json");
        let threads: Vec<_> = (0..6)
            .map(|t| {
                let path = path.clone();
                std::thread::spawn(move || {
                    let file = StateFile::<Vec<u32>>::new(path);
                    for i in 0..15 {
                        file.update(|v| {
                            v.push(t * 100 + i);
                            Ok::<_, StateError>(())
                        })
                        .unwrap();
                    }
                })
            })
            .collect();
        for t in threads {
            t.join().unwrap();
        }
        let mut all = StateFile::<Vec<u32>>::new(path).load().unwrap();
        all.sort();
        let want: Vec<u32> = (0..6)
            .flat_map(|t| (0..15).map(move |i| t * 100 + i))
            .collect();
        assert_eq!(all, want);
    }

    #[test]
    fn an_update_that_fails_or_changes_nothing_writes_nothing() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("list.json");
        let file = StateFile::<Vec<u32>>::new(path.clone());
        let r: Result<(), StateError> = file.update(|_| Ok(()));
        r.unwrap();
        assert!(!path.exists(), "unchanged: not created");
        let r: Result<(), StateError> = file.update(|v| {
            v.push(1);
            Err(StateError::Write {
                path: PathBuf::new(),
                message: "no".into(),
                no_space: false,
            })
        });
        assert!(r.is_err());
        assert!(!path.exists(), "failed: not written");
    }
}
