use thiserror::Error;

/// Everything that can be wrong with bytes handed to this crate.
#[derive(Debug, Error)]
pub enum FormatError {
    #[error("{what} is truncated")]
    Truncated { what: &'static str },
    #[error("{what} is malformed: {detail}")]
    Malformed { what: &'static str, detail: String },
    #[error("{what} failed authentication (corrupted, or from another repository)")]
    Authentication { what: &'static str },
    /// A version this code never wrote and no later one will (0, or a hole in the
    /// numbering): the object is damaged, not new.
    #[error("{what} has unsupported version {version}")]
    UnsupportedVersion { what: &'static str, version: u32 },
    /// A version above the highest this code reads: the object is most likely fine
    /// and the reader is too old, so the message says to upgrade rather than calling
    /// the repository damaged.
    #[error(
        "{what} was made by a newer version of cairn (format version {version}; this cairn reads up to {supported})"
    )]
    NewerVersion {
        what: &'static str,
        version: u64,
        supported: u64,
    },
    /// The repository's config lists format features this code does not implement;
    /// reading on could misread data written under rules it does not know.
    #[error(
        "the repository uses format features this cairn does not know ({}); upgrade cairn to open it",
        features.join(", ")
    )]
    UnknownFeatures { features: Vec<String> },
    #[error("{what} is too large ({size} bytes, limit {limit})")]
    TooLarge {
        what: &'static str,
        size: u64,
        limit: u64,
    },
    /// A file of no bytes where an object belongs: its write was cut off before
    /// any data, or it was truncated (said apart from a hash mismatch, which
    /// suggests changed bytes).
    #[error("it is empty (0 bytes: its write never finished, or it was truncated)")]
    Empty,
    /// The object's id is not the hash of what was read: changed on disk or in
    /// transit. The message leaves the id out: the caller's context names it.
    #[error("its content does not match its id")]
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

    /// True when the bytes are probably intact but need a newer cairn: a newer
    /// version or an unknown feature. Callers report these as "upgrade", not
    /// "damaged".
    pub fn needs_newer_cairn(&self) -> bool {
        matches!(
            self,
            FormatError::NewerVersion { .. } | FormatError::UnknownFeatures { .. }
        )
    }
}

/// How many versions past the highest this code reads are taken for a newer
/// writer's; beyond, for damage (formats gain a version in years, not weeks).
const NEWER_VERSIONS_BELIEVED: u64 = 32;

/// Checks a version number read from an object: `min..=max` is what this code
/// reads; above `max` is a newer writer, below `min` is damage.
pub fn check_version(what: &'static str, version: u64, min: u64, max: u64) -> Result<()> {
    // Far above anything written: not a newer cairn's object but bytes that are
    // not one (junk a backup token stored as an index file began with `{`, and
    // was said to need an upgrade: QA).
    if version > max.saturating_add(NEWER_VERSIONS_BELIEVED) {
        return Err(FormatError::UnsupportedVersion {
            what,
            version: u32::try_from(version).unwrap_or(u32::MAX),
        });
    }
    if version > max {
        return Err(FormatError::NewerVersion {
            what,
            version,
            supported: max,
        });
    }
    if version < min {
        return Err(FormatError::UnsupportedVersion {
            what,
            version: u32::try_from(version).unwrap_or(u32::MAX),
        });
    }
    Ok(())
}

pub type Result<T, E = FormatError> = std::result::Result<T, E>;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn newer_versions_say_upgrade_and_older_ones_say_unsupported() {
        let e = check_version("index file", 3, 1, 2).unwrap_err();
        assert_eq!(
            e.to_string(),
            "index file was made by a newer version of cairn (format version 3; this cairn reads up to 2)"
        );
        assert!(e.needs_newer_cairn());
        let e = check_version("index file", 123, 1, 2).unwrap_err();
        assert_eq!(e.to_string(), "index file has unsupported version 123");
        assert!(!e.needs_newer_cairn());
        let e = check_version("index file", 0, 1, 2).unwrap_err();
        assert_eq!(e.to_string(), "index file has unsupported version 0");
        assert!(!e.needs_newer_cairn());
        assert!(check_version("index file", 1, 1, 2).is_ok());
        assert!(check_version("index file", 2, 1, 2).is_ok());
    }

    #[test]
    fn unknown_features_are_named() {
        let e = FormatError::UnknownFeatures {
            features: vec!["zz-future".into(), "other".into()],
        };
        assert_eq!(
            e.to_string(),
            "the repository uses format features this cairn does not know (zz-future, other); upgrade cairn to open it"
        );
    }
}
