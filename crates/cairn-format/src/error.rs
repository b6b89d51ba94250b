use thiserror::Error;

/// Everything that can be wrong with bytes handed to this crate.
#[derive(Debug, Error)]
pub enum FormatError {
    #[error("{what} is truncated")]
    Truncated { what: &'static str },
    #[error("{what} is malformed: {detail}")]
    Malformed { what: &'static str, detail: String },
    #[error("{what} failed authentication (corrupted, or sealed with another key)")]
    Authentication { what: &'static str },
    #[error("{what} has unsupported version {version}")]
    UnsupportedVersion { what: &'static str, version: u32 },
    #[error("{what} is too large ({size} bytes, limit {limit})")]
    TooLarge {
        what: &'static str,
        size: u64,
        limit: u64,
    },
    #[error("content does not match its id {expected}")]
    IdMismatch { expected: String },
    #[error("key derivation failed: {0}")]
    Kdf(String),
}

impl FormatError {
    pub fn malformed(what: &'static str, detail: impl Into<String>) -> Self {
        FormatError::Malformed {
            what,
            detail: detail.into(),
        }
    }
}

pub type Result<T, E = FormatError> = std::result::Result<T, E>;
