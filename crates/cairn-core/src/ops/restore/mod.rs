//! Restore: snapshot tree -> files under a target directory.
//!
//! 1. Walk the tree (filtered by `--include`), creating directories, links, FIFOs and
//!    devices, and creating each regular file at its final size (so unwritten ranges
//!    stay holes). Every name was checked by the tree decoder (no `/`, `.`, `..`,
//!    NUL, duplicates) and every directory on the way is one this restore created or
//!    checked is a real directory, so nothing is written outside the target.
//! 2. In batches of files (bounded memory), [`plan`] expands their chunk lists and
//!    groups the needed blobs by pack; [`execute`] reads each pack once in coalesced
//!    ranges on several threads, opens, decompresses and verifies every blob against
//!    its id, and writes it with positional writes, skipping all-zero chunks.
//! 3. File metadata is applied after a batch's content, directory metadata last and
//!    deepest first (so writing children does not disturb a parent's times).
//!
//! Damage is reported per file: a restore writes everything it can and returns the
//! list of what it could not.

mod execute;
mod metadata;
mod plan;
mod run;

pub use run::{Issue, RestoreReport, restore_snapshot};

use crate::error::{Error, Result};
use crate::progress::Progress;
use crate::repo::Repository;
use cairn_format::BlobId;
use cairn_format::tree::{Content, Node, NodeKind};
use std::collections::HashMap;
use std::ffi::OsStr;
use std::fs;
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::OpenOptionsExt;
use std::path::{Path, PathBuf};

pub struct RestoreOptions {
    pub target: PathBuf,
    /// Snapshot paths to restore (with everything below them); empty means all.
    pub includes: Vec<String>,
    /// Restore numeric owners (default: when running as root).
    pub owners: bool,
}

#[derive(Clone, Debug)]
pub struct RestoreIssue {
    pub path: PathBuf,
    pub message: String,
}

#[derive(Clone, Debug, Default)]
pub struct RestoreStats {
    pub files: u64,
    pub dirs: u64,
    pub other: u64,
    pub bytes: u64,
    pub issues: Vec<RestoreIssue>,
}

/// A regular file whose content still has to be written.
pub(crate) struct FileJob {
    pub path: PathBuf,
    pub node: Node,
    /// A single-chunk file with one link: the executor creates it, writes it and sets
    /// its metadata through one open descriptor (the common case of a dense tree:
    /// one path lookup instead of five).
    pub direct: bool,
}

const BATCH_CHUNKS: u64 = 1 << 21;
const BATCH_FILES: usize = 50_000;

struct Walk<'a> {
    repo: &'a Repository,
    opts: &'a RestoreOptions,
    progress: &'a Progress,
    stats: RestoreStats,
    batch: Vec<FileJob>,
    batch_chunks: u64,
    dirs: Vec<(PathBuf, Node)>,
    hardlinks: HashMap<(u64, u64), PathBuf>,
}

pub fn restore(
    repo: &Repository,
    root: &BlobId,
    opts: &RestoreOptions,
    progress: &Progress,
) -> Result<RestoreStats> {
    let target = &opts.target;
    fs::create_dir_all(target).map_err(|e| Error::io(target, e))?;
    let meta = fs::metadata(target).map_err(|e| Error::io(target, e))?;
    if !meta.is_dir() {
        return Err(Error::Invalid(format!(
            "{} is not a directory",
            target.display()
        )));
    }
    // Fail early and clearly when the target cannot be written.
    let probe = target.join(format!(".cairn-restore-probe-{}", std::process::id()));
    fs::File::create(&probe).map_err(|e| Error::io(target, e))?;
    let _ = fs::remove_file(&probe);

    let includes: Vec<String> = opts
        .includes
        .iter()
        .map(|i| {
            let t = i.trim_end_matches('/');
            if t.starts_with('/') {
                t.to_string()
            } else {
                format!("/{t}")
            }
        })
        .collect();
    let mut w = Walk {
        repo,
        opts,
        progress,
        stats: RestoreStats::default(),
        batch: Vec::new(),
        batch_chunks: 0,
        dirs: Vec::new(),
        hardlinks: HashMap::new(),
    };
    let tree = repo.load_tree(root)?;
    w.walk_tree(&tree, target, "", &includes, includes.is_empty(), false)?;
    w.flush_batch()?;
    // Directories deepest first.
    let dirs = std::mem::take(&mut w.dirs);
    for (path, node) in dirs.iter().rev() {
        if let Err(e) = metadata::apply(path, node, opts.owners) {
            w.issue(path, format!("setting metadata: {e}"));
        }
    }
    Ok(w.stats)
}

/// Is `path` (snapshot-absolute) selected by the includes, or an ancestor of one?
fn selection(path: &str, includes: &[String]) -> (bool, bool) {
    let mut inside = false;
    let mut ancestor = false;
    for i in includes {
        if path == i || path.starts_with(&format!("{i}/")) || i == "/" {
            inside = true;
        } else if i.starts_with(&format!("{path}/")) {
            ancestor = true;
        }
    }
    (inside, ancestor)
}

impl Walk<'_> {
    fn issue(&mut self, path: &Path, message: String) {
        self.progress.warning(path, &message);
        self.stats.issues.push(RestoreIssue {
            path: path.to_path_buf(),
            message,
        });
    }

    fn walk_tree(
        &mut self,
        tree: &cairn_format::tree::Tree,
        dir: &Path,
        snap_dir: &str,
        includes: &[String],
        all: bool,
        fresh: bool,
    ) -> Result<()> {
        for node in &tree.nodes {
            let name = OsStr::from_bytes(&node.name);
            let snap_path = format!("{snap_dir}/{}", String::from_utf8_lossy(&node.name));
            let (inside, ancestor) = if all {
                (true, false)
            } else {
                selection(&snap_path, includes)
            };
            if !inside && !ancestor {
                continue;
            }
            let path = dir.join(name);
            match node.kind {
                NodeKind::Dir => {
                    let created = match ensure_dir(&path, fresh) {
                        Ok(c) => c,
                        Err(e) => {
                            self.issue(&path, format!("creating directory: {e}"));
                            continue;
                        }
                    };
                    self.stats.dirs += 1;
                    self.dirs.push((path.clone(), node.clone()));
                    let Some(sub) = node.subtree else { continue };
                    match self.repo.load_tree(&sub) {
                        Ok(t) => {
                            self.walk_tree(&t, &path, &snap_path, includes, inside, created)?
                        }
                        Err(e) => self.issue(&path, format!("directory contents lost: {e}")),
                    }
                    self.progress.entry_done();
                }
                _ if !inside => {}
                NodeKind::File => self.file(path, node, fresh)?,
                _ => {
                    if let Err(e) = self.special(&path, node, fresh) {
                        self.issue(&path, e.to_string());
                    } else {
                        self.stats.other += 1;
                        if let Err(e) = metadata::apply(&path, node, self.opts.owners) {
                            self.issue(&path, format!("setting metadata: {e}"));
                        }
                    }
                    self.progress.entry_done();
                }
            }
        }
        Ok(())
    }

    fn file(&mut self, path: PathBuf, node: &Node, fresh: bool) -> Result<()> {
        if node.nlink > 1 {
            if let Some(first) = self.hardlinks.get(&(node.dev, node.inode)).cloned() {
                if let Err(e) =
                    remove_existing(&path, fresh).and_then(|_| fs::hard_link(&first, &path))
                {
                    self.issue(&path, format!("creating hard link: {e}"));
                }
                self.stats.files += 1;
                self.progress.entry_done();
                return Ok(());
            }
            self.hardlinks.insert((node.dev, node.inode), path.clone());
        }
        let direct = node.nlink <= 1 && matches!(&node.content, Content::Inline(v) if v.len() == 1);
        if let Err(e) = remove_existing(&path, fresh) {
            self.issue(&path, format!("creating file: {e}"));
            return Ok(());
        }
        if direct {
            self.stats.files += 1;
            self.batch_chunks += 1;
            self.batch.push(FileJob {
                path,
                node: node.clone(),
                direct,
            });
            if self.batch_chunks >= BATCH_CHUNKS || self.batch.len() >= BATCH_FILES {
                self.flush_batch()?;
            }
            return Ok(());
        }
        let created = fs::OpenOptions::new()
            .write(true)
            .create_new(true)
            .mode(0o600)
            .custom_flags(libc::O_NOFOLLOW)
            .open(&path)
            .and_then(|f| f.set_len(node.size));
        if let Err(e) = created {
            self.issue(&path, format!("creating file: {e}"));
            return Ok(());
        }
        self.stats.files += 1;
        let chunks = match &node.content {
            Content::None => 0,
            Content::Inline(v) => v.len() as u64,
            Content::Tree { chunks, .. } => *chunks,
        };
        self.batch_chunks += chunks;
        self.batch.push(FileJob {
            path,
            node: node.clone(),
            direct: false,
        });
        if self.batch_chunks >= BATCH_CHUNKS || self.batch.len() >= BATCH_FILES {
            self.flush_batch()?;
        }
        Ok(())
    }

    fn flush_batch(&mut self) -> Result<()> {
        let jobs = std::mem::take(&mut self.batch);
        self.batch_chunks = 0;
        if jobs.is_empty() {
            return Ok(());
        }
        let plan = plan::plan(self.repo, &jobs);
        let owners = self.opts.owners;
        let mut failed: HashMap<u32, String> = plan.failed.clone();
        let exec = execute::execute(self.repo, &jobs, &plan, owners, self.progress)?;
        self.stats.bytes += exec.bytes;
        for (f, m) in exec.failed {
            failed.entry(f).or_insert(m);
        }
        for (i, job) in jobs.iter().enumerate() {
            if let Some(m) = failed.get(&(i as u32)) {
                self.issue(&job.path, format!("content not restored: {m}"));
                if job.direct {
                    continue;
                }
            }
            if job.direct {
                // Created, written and given its metadata by the executor.
                self.progress.entry_done();
                continue;
            }
            if let Err(e) = metadata::apply(&job.path, &job.node, self.opts.owners) {
                self.issue(&job.path, format!("setting metadata: {e}"));
            }
            self.progress.entry_done();
        }
        Ok(())
    }

    fn special(&mut self, path: &Path, node: &Node, fresh: bool) -> std::io::Result<()> {
        use nix::sys::stat::{Mode, SFlag, mknod};
        remove_existing(path, fresh)?;
        let perm = Mode::from_bits_truncate((node.mode & 0o7777) as libc::mode_t);
        let to_io = |e: nix::Error| std::io::Error::from_raw_os_error(e as i32);
        match node.kind {
            NodeKind::Symlink => {
                std::os::unix::fs::symlink(OsStr::from_bytes(&node.link_target), path)
            }
            NodeKind::Fifo => nix::unistd::mkfifo(path, perm).map_err(to_io),
            NodeKind::CharDevice => {
                mknod(path, SFlag::S_IFCHR, perm, node.rdev as libc::dev_t).map_err(to_io)
            }
            NodeKind::BlockDevice => {
                mknod(path, SFlag::S_IFBLK, perm, node.rdev as libc::dev_t).map_err(to_io)
            }
            NodeKind::Socket => Err(std::io::Error::other("sockets are not restored")),
            NodeKind::File | NodeKind::Dir => Ok(()),
        }
    }
}

/// Makes `path` a real directory: an existing directory is kept, anything else
/// (including a symlink, which could point outside the target) is replaced. Returns
/// whether it was created (so its children need no existence checks). In a `fresh`
/// parent (created by this restore) nothing can exist yet.
fn ensure_dir(path: &Path, fresh: bool) -> std::io::Result<bool> {
    use std::os::unix::fs::DirBuilderExt;
    let create = || fs::DirBuilder::new().mode(0o700).create(path);
    if fresh {
        create()?;
        return Ok(true);
    }
    match fs::symlink_metadata(path) {
        Ok(m) if m.is_dir() => Ok(false),
        Ok(_) => {
            fs::remove_file(path)?;
            create()?;
            Ok(true)
        }
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
            create()?;
            Ok(true)
        }
        Err(e) => Err(e),
    }
}

/// Removes a non-directory at `path` so a new entry can be created there.
fn remove_existing(path: &Path, fresh: bool) -> std::io::Result<()> {
    if fresh {
        return Ok(());
    }
    match fs::symlink_metadata(path) {
        Ok(m) if m.is_dir() => Err(std::io::Error::new(
            std::io::ErrorKind::AlreadyExists,
            "a directory is in the way",
        )),
        Ok(_) => fs::remove_file(path),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(()),
        Err(e) => Err(e),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::progress::Progress;
    use crate::repo::InitOptions;
    use crate::repo::blob::BlobEncoder;
    use crate::repo::packer::{Packer, Uploader};
    use cairn_backend::MemBackend;
    use cairn_format::pack::BlobKind;
    use cairn_format::tree::Tree;
    use std::sync::Arc;

    /// Stores `trees` (already encoded, possibly malicious) as blobs; returns their ids.
    fn repo_with_trees(trees: &[Vec<u8>]) -> (Repository, Vec<BlobId>) {
        let backend = Arc::new(MemBackend::new());
        let opts = InitOptions {
            encryption: false,
            ..InitOptions::default()
        };
        let mut repo = Repository::init(backend.clone(), None, &opts).unwrap();
        let mut enc = BlobEncoder::new(None);
        let pool = Arc::new(crate::repo::packer::BufferPool::new(1));
        let mut packer = Packer::new(repo.key().clone(), pool.clone(), 1 << 20);
        let mut ids = Vec::new();
        for t in trees {
            let id = repo.key().blob_id(t);
            packer.add(enc.encode(repo.key(), BlobKind::Tree, id, t).unwrap());
            ids.push(id);
        }
        let up = Uploader::start(backend, repo.key().clone(), pool);
        up.send(packer.finish().unwrap()).unwrap();
        up.finish().unwrap();
        repo.load_index().unwrap();
        assert!(repo.index_errors().is_empty(), "{:?}", repo.index_errors());
        assert!(
            !repo.index().is_empty(),
            "index empty; files {:?}",
            repo.list_index_files()
        );
        (repo, ids)
    }

    #[test]
    fn malicious_names_never_escape_the_target() {
        let outer = tempfile::tempdir().unwrap();
        let target = outer.path().join("target");
        for name in [
            &b"../escape"[..],
            b"..",
            b"/etc/passwd",
            b"a/../../escape",
            b".",
            b"",
        ] {
            let tree = Tree {
                nodes: vec![Node::new(name.to_vec(), NodeKind::File)],
            };
            let (repo, ids) = repo_with_trees(&[tree.encode()]);
            let opts = RestoreOptions {
                target: target.clone(),
                includes: vec![],
                owners: false,
            };
            let r = restore(&repo, &ids[0], &opts, &Progress::none());
            assert!(matches!(r, Err(Error::Damaged { .. })), "{name:?}: {r:?}");
            let outside: Vec<_> = std::fs::read_dir(outer.path()).unwrap().collect();
            assert_eq!(outside.len(), 1, "only the target may exist for {name:?}");
            assert_eq!(std::fs::read_dir(&target).unwrap().count(), 0);
        }
    }

    #[test]
    fn a_symlink_and_a_directory_of_the_same_name_are_rejected() {
        let mut link = Node::new(b"d".to_vec(), NodeKind::Symlink);
        link.link_target = b"/".to_vec();
        let mut dir = Node::new(b"d".to_vec(), NodeKind::Dir);
        dir.subtree = Some(BlobId([0; 32]));
        let tree = Tree {
            nodes: vec![link, dir],
        };
        let (repo, ids) = repo_with_trees(&[tree.encode()]);
        let dir = tempfile::tempdir().unwrap();
        let opts = RestoreOptions {
            target: dir.path().join("t"),
            includes: vec![],
            owners: false,
        };
        assert!(restore(&repo, &ids[0], &opts, &Progress::none()).is_err());
    }
}
