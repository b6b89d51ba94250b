use cairn_backend::{BackendError, BackendErrorKind};
use cairn_format::{BlobId, FormatError};
use std::path::PathBuf;
use thiserror::Error;

/// Every failure the engine reports. Messages are lowercase, one line, and name the
/// object or path involved.
#[derive(Debug, Error)]
pub enum Error {
    #[error("there is no repository at {0}")]
    RepositoryNotFound(String),
    #[error("{0} is not a cairn repository (no valid config)")]
    NotARepository(String),
    /// Packs, index files or snapshots without a config: a repository that lost
    /// its config (see [`Error::is_config_damage`]).
    #[error(
        "{0} holds a cairn repository's data but not its config (the file `config` is missing)"
    )]
    ConfigMissing(String),
    /// Another backup tool's repository (restic, borg, kopia): told apart from a
    /// cairn repository whose config is damaged, whose advice would be to put
    /// back a config file.
    #[error(
        "{0} is a {1} repository, not a cairn one: cairn cannot read it (restore from it \
         with {1}; to move to cairn, back up what {1} restores, or the original data)"
    )]
    OtherToolsRepository(String, &'static str),
    #[error(
        "{0} is not a cairn repository: it holds only what an interrupted `cairn init` left \
         (key files, no config), nothing else; remove it and run init again"
    )]
    InterruptedInit(String),
    #[error("a repository already exists at {0}; refusing to overwrite it")]
    RepositoryExists(String),
    #[error("wrong password: no key in the repository opens with it")]
    WrongPassword,
    /// No intact key opened, and a key file is damaged (the password may be its).
    #[error(
        "no intact key opens with this password, and {0}; if the password belongs to that key, restore its key file from a copy or use another key's password"
    )]
    KeyDamaged(String),
    #[error("no snapshot matches {0:?}")]
    SnapshotNotFound(String),
    /// `latest` was asked for while some snapshot could not be read: the damaged one
    /// may be the newest.
    #[error(
        "`latest` is uncertain: a snapshot could not be read ({unreadable}), and it may be the newest; {}",
        match newest_readable {
            Some(id) => format!("name the snapshot to use (the newest readable one is {id})"),
            None => "no snapshot is readable".to_string(),
        }
    )]
    LatestUncertain {
        unreadable: String,
        newest_readable: Option<String>,
    },
    #[error("snapshot id {prefix:?} is ambiguous: it matches {matches}")]
    AmbiguousSnapshot { prefix: String, matches: String },
    /// A path given as text that names more than one entry of a snapshot.
    #[error("{0}")]
    AmbiguousPath(String),
    /// An object written under newer format rules than this cairn knows (a newer
    /// version, an unknown feature): not damage, an upgrade is needed.
    #[error("{what}: {source}")]
    NewerFormat {
        what: String,
        #[source]
        source: FormatError,
    },
    #[error("{what} is damaged: {source}")]
    Damaged {
        what: String,
        #[source]
        source: FormatError,
    },
    #[error("blob {0} is referenced but missing from the index")]
    BlobNotFound(BlobId),
    /// The SSD placement's local files could not answer (damaged or unreadable):
    /// they are marked and rebuilt from the repository at the next run.
    #[error(
        "blob {blob}: the local SSD index could not be read ({error}); it is rebuilt from the repository at the next run"
    )]
    LocalIndexFailed { blob: BlobId, error: String },
    /// The index names a pack the storage does not hold (lost or deleted behind
    /// cairn's back).
    #[error("pack {pack} holding blob {blob} is missing")]
    PackMissing { pack: String, blob: String },
    #[error(transparent)]
    Backend(BackendError),
    #[error("{}: {source}", path.display())]
    Io {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("{0}")]
    Invalid(String),
    /// A snapshot that cannot be read stops an operation that needs all of them
    /// (stats: its figures would be wrong, not only short). Damage in the
    /// repository, not a wrong request: a server answers it as such (500).
    #[error("{0}")]
    SnapshotUnreadable(String),
    /// A value the caller gave cannot be taken (a pattern that is not a glob, a
    /// file name where a path is not allowed): nothing was done. The CLI exits 2
    /// for it as for any usage error, so that a script does not read a typo as a
    /// run that failed part way.
    #[error("{0}")]
    BadArgument(String),
    /// The memory limit cannot be kept by this operation (with what it would
    /// need and how to get there).
    #[error("{0}")]
    MemoryLimit(String),
    /// Some of the work could not be done and what was done is kept (an image
    /// restore's blocks that could not be read, left in its partial file).
    #[error("{0}")]
    Incomplete(String),
    #[error("operation interrupted")]
    Interrupted,
    /// An error kept to be handed out again (a session's snapshot list).
    #[error("{0}")]
    Shared(std::sync::Arc<Error>),
    /// The caller asked the operation to stop ([`crate::progress::CancelToken`]); it
    /// stopped at a safe point, leaving the repository as a crash there would.
    #[error("cancelled")]
    Cancelled,
    /// Another exclusive operation (prune, repair) holds the repository.
    #[error("{0}")]
    Locked(String),
    /// This process could not show it was alive for too long; prune may have treated
    /// it as dead, so it must not commit anything.
    #[error("{0}")]
    LockExpired(String),
    /// `forget` was asked to apply a policy that keeps nothing in particular: applying
    /// it would remove nothing, so saying so beats silently succeeding.
    #[error("no policy given: nothing would be removed")]
    NoPolicy,
    #[error("invalid duration {input:?}: {reason}")]
    InvalidDuration { input: String, reason: String },
    /// A snapshot whose time cannot be read cannot be placed in a retention bucket;
    /// guessing could remove the wrong snapshot.
    #[error(
        "snapshot {id} has an unreadable time {time:?}; refusing to apply a policy (`cairn \
         forget {id}` removes it, or leave it out with --host or --path)"
    )]
    InvalidSnapshotTime { id: String, time: String },
    /// Only keep-tag rules were given and no snapshot of a group carries the tags:
    /// removing the whole group is almost certainly a typo in the tag.
    /// Every such group is named, so one run shows every typo.
    #[error("{}", would_remove_all(.groups))]
    WouldRemoveAll { groups: Vec<String> },
}

fn would_remove_all(groups: &[String]) -> String {
    match groups {
        [one] => {
            format!("no snapshot of {one} matches a keep-tag rule; refusing to remove them all")
        }
        _ => format!(
            "in {} groups no snapshot matches a keep-tag rule ({}); refusing to remove \
             them all",
            groups.len(),
            groups.join("; ")
        ),
    }
}

/// Storage errors, except that something not a file in an object's place (a FIFO,
/// a device, a directory in a local repository) is damage to that object: every
/// reader then deals with it as with bytes that do not authenticate (a snapshot
/// listed as damaged, an index file set aside, a pack read blob by blob), where a
/// storage failure would stop the command.
impl From<BackendError> for Error {
    fn from(e: BackendError) -> Error {
        if e.kind == BackendErrorKind::NotAFile {
            let what = format!("object {}", e.path);
            return Error::damaged(what, FormatError::malformed("object", e.message));
        }
        Error::Backend(e)
    }
}

impl Error {
    /// The error for an object that failed to decode: damage, unless the object
    /// was written by a newer cairn (then it says to upgrade, never "damaged").
    pub fn damaged(what: impl Into<String>, source: FormatError) -> Self {
        if source.needs_newer_cairn() {
            return Error::NewerFormat {
                what: what.into(),
                source,
            };
        }
        Error::Damaged {
            what: what.into(),
            source,
        }
    }
    pub fn io(path: impl Into<PathBuf>, source: std::io::Error) -> Self {
        Error::Io {
            path: path.into(),
            source,
        }
    }
    /// The error itself, looking through [`Error::Shared`].
    /// Whether this is the repository config failing to parse or authenticate
    /// (not one this user may not read, nor a newer cairn's).
    pub fn is_config_damage(&self) -> bool {
        matches!(self.root(), Error::Damaged { what, .. } if what.starts_with(crate::repo::CONFIG_WHAT))
            || matches!(self.root(), Error::ConfigMissing(_))
    }

    pub fn root(&self) -> &Error {
        match self {
            Error::Shared(e) => e.root(),
            e => e,
        }
    }

    /// True when a blob's data is lost (damaged, missing from the index, its pack
    /// gone), as opposed to storage that failed to answer: what readers that go
    /// on past lost data (export, copy, repair) skip or give as zeros.
    pub fn is_lost_data(&self) -> bool {
        matches!(
            self,
            Error::Damaged { .. } | Error::BlobNotFound(_) | Error::PackMissing { .. }
        )
    }

    /// [`is_lost_data`](Self::is_lost_data), or an object that storage says is
    /// gone, shorter than a read of it, or not an object: the repository lacks
    /// what the read needs (a truncated pack is as lost as a damaged one), as
    /// opposed to storage that failed to answer.
    pub fn is_lost_in_storage(&self) -> bool {
        use cairn_backend::BackendErrorKind as K;
        let e = self.root();
        e.is_lost_data()
            || matches!(e, Error::Backend(b)
                if matches!(b.kind, K::NotFound | K::OutOfRange | K::NotAFile | K::TooLarge))
    }

    /// True when the storage failed to read an object (an I/O error of the disk,
    /// a remote that kept failing or went away), as opposed to finding it
    /// missing, damaged or not allowed: whether the object is whole is not known.
    pub fn is_read_failure(&self) -> bool {
        match self.root() {
            Error::Backend(b) => b.is_read_failure(),
            _ => false,
        }
    }

    /// True when the repository's storage ran out of space.
    pub fn is_no_space(&self) -> bool {
        match self.root() {
            Error::Backend(b) => b.kind == BackendErrorKind::NoSpace,
            Error::Io { source, .. } => source.kind() == std::io::ErrorKind::StorageFull,
            _ => false,
        }
    }
}

pub type Result<T, E = Error> = std::result::Result<T, E>;
