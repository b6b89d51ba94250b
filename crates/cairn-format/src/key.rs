//! The master secret and the key files that wrap it.
//!
//! A repository has one 32-byte master secret, created at `init` and never changed.
//! Every working key is derived from it with BLAKE3 `derive_key` and a fixed context
//! string (see `consts`). Each `keys/<id>` file holds the master secret sealed under a
//! key derived from one password with Argon2id; adding or changing a password writes a
//! new key file and never touches data.

use crate::consts::*;
use crate::envelope::{Encryption, Sealer, random_bytes};
use crate::error::{FormatError, Result, check_version};
use crate::json::check_json_version;
use serde::{Deserialize, Serialize};

/// The repository's root secret and the keys derived from it.
#[derive(Clone)]
pub struct MasterKey {
    secret: [u8; 32],
    encryption: Encryption,
    /// Seals blobs and objects.
    pub sealer: Sealer,
    /// Keys the BLAKE3 blob ids.
    pub id_key: [u8; 32],
    /// Authenticates `config`.
    pub mac_key: [u8; 32],
    /// Seeds the chunker's gear table, so chunk boundaries do not reveal content.
    pub chunker_seed: u64,
}

impl std::fmt::Debug for MasterKey {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("MasterKey(..)")
    }
}

impl MasterKey {
    pub fn generate(encryption: Encryption) -> Self {
        Self::from_secret(random_bytes(), encryption)
    }

    pub fn from_secret(secret: [u8; 32], encryption: Encryption) -> Self {
        let enc = blake3::derive_key(KDF_CONTEXT_ENCRYPTION, &secret);
        let id_key = blake3::derive_key(KDF_CONTEXT_ID, &secret);
        let mac_key = blake3::derive_key(KDF_CONTEXT_MAC, &secret);
        let seed = blake3::derive_key(KDF_CONTEXT_CHUNKER, &secret);
        let mut s8 = [0u8; 8];
        s8.copy_from_slice(&seed[..8]);
        // The sealer of an unencrypted repository still checksums with a key.
        let seal_key = if encryption == Encryption::None {
            mac_key
        } else {
            enc
        };
        MasterKey {
            secret,
            encryption,
            sealer: Sealer::new(encryption, seal_key),
            id_key,
            mac_key,
            chunker_seed: u64::from_le_bytes(s8),
        }
    }

    pub fn secret(&self) -> &[u8; 32] {
        &self.secret
    }
    pub fn encryption(&self) -> Encryption {
        self.encryption
    }

    /// Id of a blob: keyed BLAKE3 of its plaintext, so ids reveal nothing to storage.
    pub fn blob_id(&self, plaintext: &[u8]) -> crate::id::BlobId {
        crate::id::BlobId(*blake3::keyed_hash(&self.id_key, plaintext).as_bytes())
    }

    pub fn mac(&self, data: &[u8]) -> [u8; 32] {
        *blake3::keyed_hash(&self.mac_key, data).as_bytes()
    }
}

/// Argon2id parameters, stored in each key file.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct KdfParams {
    pub algorithm: String,
    pub memory_kib: u32,
    pub iterations: u32,
    pub parallelism: u32,
    /// 16 random bytes, hex.
    pub salt: String,
}

impl KdfParams {
    pub fn new_default() -> Self {
        KdfParams {
            algorithm: "argon2id".into(),
            memory_kib: KDF_DEFAULT_MEMORY_KIB,
            iterations: KDF_DEFAULT_ITERATIONS,
            parallelism: KDF_DEFAULT_PARALLELISM,
            salt: hex::encode(random_bytes::<16>()),
        }
    }

    /// Derives the 32-byte wrapping key, refusing parameters a hostile key file could
    /// use to exhaust memory or time.
    pub fn derive(&self, password: &[u8]) -> Result<[u8; 32]> {
        if self.algorithm != "argon2id" {
            return Err(FormatError::malformed(
                "key file",
                format!("unknown kdf {:?}", self.algorithm),
            ));
        }
        if self.memory_kib > KDF_MAX_MEMORY_KIB
            || self.iterations > KDF_MAX_ITERATIONS
            || self.parallelism > KDF_MAX_PARALLELISM
            || self.iterations == 0
            || self.parallelism == 0
        {
            return Err(FormatError::malformed(
                "key file",
                "kdf parameters out of range",
            ));
        }
        let salt = hex::decode(&self.salt)
            .map_err(|e| FormatError::malformed("key file", format!("salt: {e}")))?;
        let params =
            argon2::Params::new(self.memory_kib, self.iterations, self.parallelism, Some(32))
                .map_err(|e| FormatError::Kdf(e.to_string()))?;
        let a2 = argon2::Argon2::new(argon2::Algorithm::Argon2id, argon2::Version::V0x13, params);
        let mut out = [0u8; 32];
        a2.hash_password_into(password, &salt, &mut out)
            .map_err(|e| FormatError::Kdf(e.to_string()))?;
        Ok(out)
    }
}

/// Contents of `keys/<id>` (JSON).
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct KeyFile {
    pub version: u32,
    pub created: String,
    pub hostname: String,
    pub username: String,
    pub kdf: KdfParams,
    pub encryption: Encryption,
    /// The master secret sealed under the Argon2id-derived key, hex.
    pub data: String,
}

/// Key file version written and read by this code.
pub const KEY_FILE_VERSION: u32 = 1;

impl KeyFile {
    pub fn wrap(
        master: &MasterKey,
        password: &[u8],
        kdf: KdfParams,
        created: String,
        hostname: String,
        username: String,
    ) -> Result<Self> {
        Self::wrap_with_nonce(
            master,
            password,
            kdf,
            created,
            hostname,
            username,
            random_bytes(),
        )
    }

    /// [`KeyFile::wrap`] with a chosen envelope nonce, for known-answer test vectors
    /// only (see [`Sealer::seal_with_nonce`] for why nothing else may use it).
    #[doc(hidden)]
    pub fn wrap_with_nonce(
        master: &MasterKey,
        password: &[u8],
        kdf: KdfParams,
        created: String,
        hostname: String,
        username: String,
        nonce: [u8; ENVELOPE_NONCE_LEN],
    ) -> Result<Self> {
        let wrapping = kdf.derive(password)?;
        // Key files are always encrypted, even for unencrypted repositories: the
        // password then still guards nothing, but the code path is the same.
        let enc = match master.encryption() {
            Encryption::None => Encryption::ChaCha20Poly1305,
            e => e,
        };
        let sealed = Sealer::new(enc, wrapping).seal_with_nonce(nonce, master.secret());
        Ok(KeyFile {
            version: KEY_FILE_VERSION,
            created,
            hostname,
            username,
            kdf,
            encryption: enc,
            data: hex::encode(sealed),
        })
    }

    /// Returns the master secret, or `Authentication` for a wrong password.
    pub fn unwrap_secret(&self, password: &[u8]) -> Result<[u8; 32]> {
        check_version(
            "key file",
            self.version.into(),
            KEY_FILE_VERSION.into(),
            KEY_FILE_VERSION.into(),
        )?;
        if self.encryption == Encryption::None {
            return Err(FormatError::malformed("key file", "unencrypted key file"));
        }
        let wrapping = self.kdf.derive(password)?;
        let sealed = hex::decode(&self.data)
            .map_err(|e| FormatError::malformed("key file", format!("data: {e}")))?;
        let secret = Sealer::new(self.encryption, wrapping).open("key file", &sealed)?;
        secret
            .try_into()
            .map_err(|_| FormatError::malformed("key file", "master secret is not 32 bytes"))
    }

    pub fn to_bytes(&self) -> Vec<u8> {
        // Serialising a struct of strings and integers cannot fail.
        #[allow(clippy::expect_used)]
        serde_json::to_vec_pretty(self).expect("key file serialises")
    }

    pub fn from_bytes(data: &[u8]) -> Result<Self> {
        if data.len() > MAX_SMALL_OBJECT_SIZE {
            return Err(FormatError::TooLarge {
                what: "key file",
                size: data.len() as u64,
                limit: MAX_SMALL_OBJECT_SIZE as u64,
            });
        }
        // The version first: a newer key file may change any other field.
        check_json_version("key file", data, KEY_FILE_VERSION)?;
        serde_json::from_slice(data).map_err(|e| FormatError::malformed("key file", e.to_string()))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn cheap_kdf() -> KdfParams {
        KdfParams {
            memory_kib: 64,
            iterations: 1,
            ..KdfParams::new_default()
        }
    }

    #[test]
    fn wrap_unwrap() {
        let mk = MasterKey::generate(Encryption::Aes256Gcm);
        let kf =
            KeyFile::wrap(&mk, b"pw", cheap_kdf(), "t".into(), "h".into(), "u".into()).unwrap();
        let back = KeyFile::from_bytes(&kf.to_bytes()).unwrap();
        assert_eq!(&back.unwrap_secret(b"pw").unwrap(), mk.secret());
        assert!(matches!(
            back.unwrap_secret(b"wrong"),
            Err(FormatError::Authentication { .. })
        ));
    }

    #[test]
    fn newer_key_files_say_upgrade_and_unknown_members_are_ignored() {
        let mk = MasterKey::generate(Encryption::ChaCha20Poly1305);
        let kf =
            KeyFile::wrap(&mk, b"pw", cheap_kdf(), "t".into(), "h".into(), "u".into()).unwrap();
        let text = String::from_utf8(kf.to_bytes()).unwrap();
        let more = text.replacen('{', r#"{"zz_hint": "x","#, 1);
        let back = KeyFile::from_bytes(more.as_bytes()).unwrap();
        assert_eq!(&back.unwrap_secret(b"pw").unwrap(), mk.secret());
        let newer = text.replacen("\"version\": 1", "\"version\": 2", 1);
        let err = KeyFile::from_bytes(newer.as_bytes()).unwrap_err();
        assert!(
            matches!(err, FormatError::NewerVersion { version: 2, .. }),
            "{err}"
        );
    }

    proptest! {
        #[test]
        fn key_file_round_trips(
            created in ".*",
            host in ".*",
            user in ".*",
            memory in 8u32..KDF_MAX_MEMORY_KIB,
            iterations in 1u32..=KDF_MAX_ITERATIONS,
            salt: [u8; 16],
            data: Vec<u8>,
            aes: bool,
        ) {
            let kf = KeyFile {
                version: KEY_FILE_VERSION,
                created,
                hostname: host,
                username: user,
                kdf: KdfParams {
                    memory_kib: memory,
                    iterations,
                    salt: hex::encode(salt),
                    ..KdfParams::new_default()
                },
                encryption: if aes { Encryption::Aes256Gcm } else { Encryption::ChaCha20Poly1305 },
                data: hex::encode(data),
            };
            let back = KeyFile::from_bytes(&kf.to_bytes()).unwrap();
            prop_assert_eq!(back.to_bytes(), kf.to_bytes());
            prop_assert_eq!(back.kdf, kf.kdf);
        }

        #[test]
        fn from_bytes_never_panics(data: Vec<u8>) {
            let _ = KeyFile::from_bytes(&data);
        }
    }

    #[test]
    fn every_encryption_wraps_and_unwraps() {
        for enc in [
            Encryption::Aes256Gcm,
            Encryption::ChaCha20Poly1305,
            Encryption::None,
        ] {
            let mk = MasterKey::generate(enc);
            let kf =
                KeyFile::wrap(&mk, b"pw", cheap_kdf(), "t".into(), "h".into(), "u".into()).unwrap();
            assert_ne!(
                kf.encryption,
                Encryption::None,
                "key files are always encrypted"
            );
            assert_eq!(&kf.unwrap_secret(b"pw").unwrap(), mk.secret());
        }
    }

    #[test]
    fn hostile_kdf_params_rejected() {
        let mut p = cheap_kdf();
        p.memory_kib = u32::MAX;
        assert!(p.derive(b"x").is_err());
    }
}
