use crate::direct::{self, AlignedBuf, DIRECT_MIN_BYTES};
use crate::{Backend, BackendError, BackendErrorKind, ObjectInfo, Result};
use std::fs::{self, File, OpenOptions};
use std::io::{ErrorKind, Read, Seek, SeekFrom, Write};
use std::path::{Path, PathBuf};
use std::sync::Mutex;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};

/// A repository in a local directory (or a mounted NAS share).
///
/// `put` writes `<name>.tmp-<pid>-<n>` next to the destination, fsyncs it, renames it
/// over the destination and fsyncs the directory, so a crash leaves either the old
/// object or the new one, plus at worst a temporary file that listings ignore.
#[derive(Debug)]
pub struct LocalBackend {
    root: PathBuf,
    counter: AtomicU64,
    sync: bool,
    /// Large objects (packs) are written with O_DIRECT while the filesystem allows it.
    direct: AtomicBool,
    scratch: Mutex<AlignedBuf>,
    /// Aligned buffers for direct range reads, one per concurrent reader.
    read_scratch: Mutex<Vec<AlignedBuf>>,
}

const TMP_MARK: &str = ".tmp-";

impl LocalBackend {
    pub fn new(root: impl Into<PathBuf>) -> Self {
        LocalBackend {
            root: root.into(),
            counter: AtomicU64::new(0),
            sync: true,
            direct: AtomicBool::new(true),
            scratch: Mutex::new(AlignedBuf::default()),
            read_scratch: Mutex::new(Vec::new()),
        }
    }

    pub fn root(&self) -> &Path {
        &self.root
    }

    fn path(&self, name: &str) -> PathBuf {
        self.root.join(name)
    }
}

fn sync_dir(dir: &Path) -> std::io::Result<()> {
    File::open(dir)?.sync_all()
}

impl Backend for LocalBackend {
    fn location(&self) -> String {
        self.root.display().to_string()
    }

    fn put(&self, name: &str, data: &[u8]) -> Result<()> {
        let dest = self.path(name);
        let dir = dest.parent().unwrap_or(&self.root).to_path_buf();
        let n = self.counter.fetch_add(1, Ordering::Relaxed);
        let tmp = dir.join(format!(
            "{}{TMP_MARK}{}-{n}",
            crate::names::base(name),
            std::process::id()
        ));
        let write = || -> std::io::Result<()> {
            let mut f = match OpenOptions::new().write(true).create_new(true).open(&tmp) {
                Ok(f) => f,
                Err(e) if e.kind() == ErrorKind::NotFound => {
                    fs::create_dir_all(&dir)?;
                    OpenOptions::new().write(true).create_new(true).open(&tmp)?
                }
                Err(e) => return Err(e),
            };
            let direct_file =
                if self.direct.load(Ordering::Relaxed) && data.len() as u64 >= DIRECT_MIN_BYTES {
                    direct::open_direct(&tmp)?
                } else {
                    None
                };
            match direct_file {
                Some(d) => {
                    let mut scratch = self.scratch.lock().unwrap_or_else(|e| e.into_inner());
                    if !direct::write_at(&f, Some(&d), &mut scratch, data, 0)? {
                        self.direct.store(false, Ordering::Relaxed);
                    }
                }
                None => f.write_all(data)?,
            }
            if self.sync {
                f.sync_all()?;
            }
            drop(f);
            fs::rename(&tmp, &dest)?;
            if self.sync {
                sync_dir(&dir)?;
            }
            Ok(())
        };
        write().map_err(|e| {
            let _ = fs::remove_file(&tmp);
            BackendError::from_io("put", name, &e)
        })
    }

    fn get(&self, name: &str) -> Result<Vec<u8>> {
        fs::read(self.path(name)).map_err(|e| BackendError::from_io("get", name, &e))
    }

    fn get_range(&self, name: &str, offset: u64, length: u64) -> Result<Vec<u8>> {
        let err = |e: std::io::Error| BackendError::from_io("get range", name, &e);
        let mut f = File::open(self.path(name)).map_err(err)?;
        let size = f.metadata().map_err(err)?.len();
        if offset.checked_add(length).is_none_or(|end| end > size) {
            return Err(BackendError {
                kind: BackendErrorKind::Other,
                op: "get range",
                path: name.into(),
                message: format!("range {offset}+{length} beyond end of object ({size} bytes)"),
            });
        }
        if length >= DIRECT_MIN_BYTES && self.direct.load(Ordering::Relaxed) {
            // Pack ranges for restore: bypass the page cache (see `direct`).
            let mut scratch = self
                .read_scratch
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .pop()
                .unwrap_or_default();
            let r = direct::read_range(&self.path(name), offset, length, &mut scratch);
            self.read_scratch
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .push(scratch);
            if let Some(v) = r {
                return Ok(v);
            }
        }
        f.seek(SeekFrom::Start(offset)).map_err(err)?;
        let mut buf = vec![0u8; length as usize];
        f.read_exact(&mut buf).map_err(err)?;
        Ok(buf)
    }

    fn list(&self, prefix: &str) -> Result<Vec<ObjectInfo>> {
        // Prefixes are directories (`data/`, `index/`); walk them recursively.
        let mut out = Vec::new();
        let mut stack = vec![prefix.trim_end_matches('/').to_string()];
        while let Some(rel) = stack.pop() {
            let dir = self.path(&rel);
            let rd = match fs::read_dir(&dir) {
                Ok(rd) => rd,
                Err(e) if e.kind() == ErrorKind::NotFound => continue,
                Err(e) => return Err(BackendError::from_io("list", &rel, &e)),
            };
            for ent in rd {
                let ent = ent.map_err(|e| BackendError::from_io("list", &rel, &e))?;
                let fname = ent.file_name();
                let Some(fname) = fname.to_str() else {
                    continue;
                };
                if fname.contains(TMP_MARK) {
                    continue;
                }
                let child = format!("{rel}/{fname}");
                let ft = ent
                    .file_type()
                    .map_err(|e| BackendError::from_io("list", &child, &e))?;
                if ft.is_dir() {
                    stack.push(child);
                } else if ft.is_file() {
                    let size = match ent.metadata() {
                        Ok(m) => m.len(),
                        Err(e) if e.kind() == ErrorKind::NotFound => continue,
                        Err(e) => return Err(BackendError::from_io("list", &child, &e)),
                    };
                    out.push(ObjectInfo { name: child, size });
                }
            }
        }
        Ok(out)
    }

    fn delete(&self, name: &str) -> Result<()> {
        fs::remove_file(self.path(name)).map_err(|e| BackendError::from_io("delete", name, &e))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn conformance() {
        let dir = tempfile::tempdir().unwrap();
        crate::conformance::run(&LocalBackend::new(dir.path()));
    }

    #[test]
    fn temporary_files_are_not_listed() {
        let dir = tempfile::tempdir().unwrap();
        let b = LocalBackend::new(dir.path());
        fs::create_dir_all(dir.path().join("index")).unwrap();
        fs::write(dir.path().join("index/abc.tmp-1-0"), b"partial").unwrap();
        assert!(b.list("index/").unwrap().is_empty());
    }
}
