//! One newtype per kind of id, so a pack id can never be passed where a blob id is meant.

use crate::consts::ID_LEN;
use crate::error::FormatError;
use std::fmt;

macro_rules! id_type {
    ($(#[$doc:meta])* $name:ident) => {
        $(#[$doc])*
        #[derive(Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
        pub struct $name(pub [u8; ID_LEN]);

        impl $name {
            pub fn to_hex(&self) -> String {
                hex::encode(self.0)
            }
            pub fn short(&self) -> String {
                hex::encode(&self.0[..4])
            }
            pub fn from_hex(s: &str) -> Result<Self, FormatError> {
                let mut out = [0u8; ID_LEN];
                hex::decode_to_slice(s, &mut out)
                    .map_err(|e| FormatError::malformed(stringify!($name), e.to_string()))?;
                Ok($name(out))
            }
            pub fn as_bytes(&self) -> &[u8; ID_LEN] {
                &self.0
            }
            /// Id of an object stored under its content hash (plain BLAKE3).
            pub fn of_content(data: &[u8]) -> Self {
                $name(*blake3::hash(data).as_bytes())
            }
        }
        impl fmt::Debug for $name {
            fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                write!(f, "{}({})", stringify!($name), self.short())
            }
        }
        /// Serialized as 64 hex digits, as ids appear everywhere else.
        impl serde::Serialize for $name {
            fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
                s.serialize_str(&self.to_hex())
            }
        }
        impl fmt::Display for $name {
            fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str(&self.to_hex())
            }
        }
    };
}

id_type!(
    /// Keyed BLAKE3 of a blob's plaintext (chunk, tree or chunk list).
    BlobId
);
id_type!(
    /// Plain BLAKE3 of a pack file's bytes.
    PackId
);
id_type!(
    /// Plain BLAKE3 of an index file's bytes.
    IndexId
);
id_type!(
    /// Plain BLAKE3 of a pending-deletion record's bytes.
    PendingId
);
id_type!(
    /// Plain BLAKE3 of a snapshot file's bytes.
    SnapshotId
);
id_type!(
    /// Plain BLAKE3 of a key file's bytes.
    KeyId
);
id_type!(
    /// Random identity of a repository, fixed at creation.
    RepoId
);

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    proptest! {
        #[test]
        fn hex_round_trip(bytes: [u8; 32]) {
            let id = BlobId(bytes);
            prop_assert_eq!(BlobId::from_hex(&id.to_hex()).unwrap(), id);
            prop_assert_eq!(id.to_hex().len(), 64);
            prop_assert!(id.to_hex().starts_with(&id.short()));
        }

        #[test]
        fn from_hex_never_panics(s in ".*") {
            let _ = SnapshotId::from_hex(&s);
        }
    }

    #[test]
    fn wrong_lengths_and_digits_are_refused() {
        assert!(PackId::from_hex(&"ab".repeat(31)).is_err());
        assert!(PackId::from_hex(&"ab".repeat(33)).is_err());
        assert!(PackId::from_hex(&"zz".repeat(32)).is_err());
    }
}
