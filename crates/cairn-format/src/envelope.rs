//! Sealing: every object and blob stored in a repository is an *envelope*.
//!
//! Encrypted repositories (AES-256-GCM or ChaCha20-Poly1305):
//! `nonce24 || ciphertext || tag16`. The first 12 bytes of the random 24-byte nonce
//! select a per-envelope subkey, `BLAKE3-keyed(encryption_key, nonce24[0..12])`, and the
//! last 12 are the AEAD nonce. Random 96-bit nonces under one key are safe for about
//! 2^32 messages; deriving a subkey per envelope lifts that bound far beyond any
//! repository's blob count (a 4 KiB-block datastore of 1 PB holds 2^38 blobs).
//!
//! Unencrypted repositories: `plaintext || BLAKE3-keyed(mac_key, plaintext)[0..16]`.
//! The key is stored in the clear in `config`, so this detects corruption, not forgery.

use crate::consts::*;
use crate::error::{FormatError, Result};
use ring::aead;
use ring::rand::{SecureRandom, SystemRandom};
use serde::{Deserialize, Serialize};

/// Which AEAD seals a repository's objects; fixed at `init`, recorded in `config`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum Encryption {
    #[serde(rename = "aes-256-gcm")]
    Aes256Gcm,
    #[serde(rename = "chacha20-poly1305")]
    ChaCha20Poly1305,
    #[serde(rename = "none")]
    None,
}

impl Encryption {
    /// AES-256-GCM where the CPU has AES instructions, otherwise ChaCha20-Poly1305
    /// (which is faster than a software AES there, and constant-time).
    pub fn best_for_this_cpu() -> Self {
        #[cfg(any(target_arch = "x86_64", target_arch = "x86"))]
        {
            if std::arch::is_x86_feature_detected!("aes")
                && std::arch::is_x86_feature_detected!("pclmulqdq")
            {
                return Encryption::Aes256Gcm;
            }
            Encryption::ChaCha20Poly1305
        }
        #[cfg(target_arch = "aarch64")]
        {
            if std::arch::is_aarch64_feature_detected!("aes") {
                return Encryption::Aes256Gcm;
            }
            Encryption::ChaCha20Poly1305
        }
        #[cfg(not(any(target_arch = "x86_64", target_arch = "x86", target_arch = "aarch64")))]
        {
            Encryption::ChaCha20Poly1305
        }
    }
    pub fn name(self) -> &'static str {
        match self {
            Encryption::Aes256Gcm => "aes-256-gcm",
            Encryption::ChaCha20Poly1305 => "chacha20-poly1305",
            Encryption::None => "none",
        }
    }
    pub fn overhead(self) -> usize {
        match self {
            Encryption::None => ENVELOPE_TAG_LEN,
            _ => ENVELOPE_OVERHEAD,
        }
    }
    fn algorithm(self) -> Option<&'static aead::Algorithm> {
        match self {
            Encryption::Aes256Gcm => Some(&aead::AES_256_GCM),
            Encryption::ChaCha20Poly1305 => Some(&aead::CHACHA20_POLY1305),
            Encryption::None => None,
        }
    }
}

/// Seals and opens envelopes with one 32-byte key.
#[derive(Clone)]
pub struct Sealer {
    encryption: Encryption,
    key: [u8; 32],
}

impl std::fmt::Debug for Sealer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Sealer({})", self.encryption.name())
    }
}

pub fn random_bytes<const N: usize>() -> [u8; N] {
    let mut out = [0u8; N];
    // SystemRandom only fails when the OS has no entropy source, which is fatal anyway.
    #[allow(clippy::expect_used)]
    SystemRandom::new()
        .fill(&mut out)
        .expect("operating system random number generator failed");
    out
}

impl Sealer {
    pub fn new(encryption: Encryption, key: [u8; 32]) -> Self {
        Sealer { encryption, key }
    }
    pub fn encryption(&self) -> Encryption {
        self.encryption
    }
    pub fn overhead(&self) -> usize {
        self.encryption.overhead()
    }

    fn subkey(&self, alg: &'static aead::Algorithm, salt: &[u8]) -> aead::LessSafeKey {
        let sub = blake3::keyed_hash(&self.key, salt);
        // A 32-byte key is valid for both algorithms.
        #[allow(clippy::expect_used)]
        let unbound = aead::UnboundKey::new(alg, sub.as_bytes()).expect("32-byte AEAD key");
        aead::LessSafeKey::new(unbound)
    }

    /// Seals `plaintext`, appending the envelope to `out`. Every call draws a fresh
    /// random nonce: the only way production code seals.
    pub fn seal_into(&self, plaintext: &[u8], out: &mut Vec<u8>) {
        self.seal_into_with_nonce(random_bytes(), plaintext, out);
    }

    /// Seals with a caller-chosen nonce, for known-answer test vectors and tools that
    /// must produce reproducible bytes. Sealing two different plaintexts with one
    /// nonce under one key gives away both (and, for AES-GCM, the authentication
    /// key): nothing that writes to a repository may call this. Unencrypted
    /// repositories ignore the nonce.
    #[doc(hidden)]
    pub fn seal_with_nonce(&self, nonce: [u8; ENVELOPE_NONCE_LEN], plaintext: &[u8]) -> Vec<u8> {
        let mut out = Vec::with_capacity(plaintext.len() + self.overhead());
        self.seal_into_with_nonce(nonce, plaintext, &mut out);
        out
    }

    fn seal_into_with_nonce(
        &self,
        nonce24: [u8; ENVELOPE_NONCE_LEN],
        plaintext: &[u8],
        out: &mut Vec<u8>,
    ) {
        match self.encryption.algorithm() {
            None => {
                out.extend_from_slice(plaintext);
                let mac = blake3::keyed_hash(&self.key, plaintext);
                out.extend_from_slice(&mac.as_bytes()[..ENVELOPE_TAG_LEN]);
            }
            Some(alg) => {
                let key = self.subkey(alg, &nonce24[..12]);
                let mut n12 = [0u8; 12];
                n12.copy_from_slice(&nonce24[12..]);
                let start = out.len();
                out.reserve(plaintext.len() + ENVELOPE_OVERHEAD);
                out.extend_from_slice(&nonce24);
                out.extend_from_slice(plaintext);
                let body = &mut out[start + ENVELOPE_NONCE_LEN..];
                // Sealing only fails for inputs beyond 2^36 bytes, which blobs never are.
                #[allow(clippy::expect_used)]
                let tag = key
                    .seal_in_place_separate_tag(
                        aead::Nonce::assume_unique_for_key(n12),
                        aead::Aad::empty(),
                        body,
                    )
                    .expect("AEAD seal");
                out.extend_from_slice(tag.as_ref());
            }
        }
    }

    pub fn seal(&self, plaintext: &[u8]) -> Vec<u8> {
        let mut out = Vec::with_capacity(plaintext.len() + self.overhead());
        self.seal_into(plaintext, &mut out);
        out
    }

    /// Opens an envelope; `what` names the object in the error.
    pub fn open(&self, what: &'static str, sealed: &[u8]) -> Result<Vec<u8>> {
        let prefix = self.prefix_len(what, sealed.len())?;
        let mut buf = sealed[prefix..].to_vec();
        let n = self.open_body(what, &sealed[..prefix], &mut buf)?;
        buf.truncate(n);
        Ok(buf)
    }

    /// Opens an envelope where it lies, decrypting it in place (a restore decodes
    /// the blobs of a range read without copying each first); returns the
    /// plaintext's place in `sealed`. `sealed` holds garbage after a failure.
    pub fn open_in_place(
        &self,
        what: &'static str,
        sealed: &mut [u8],
    ) -> Result<std::ops::Range<usize>> {
        let prefix = self.prefix_len(what, sealed.len())?;
        let (nonce, body) = sealed.split_at_mut(prefix);
        let n = self.open_body(what, nonce, body)?;
        Ok(prefix..prefix + n)
    }

    /// Bytes before the body (the nonce), after checking the envelope is long enough.
    fn prefix_len(&self, what: &'static str, len: usize) -> Result<usize> {
        let (min, prefix) = match self.encryption.algorithm() {
            None => (ENVELOPE_TAG_LEN, 0),
            Some(_) => (ENVELOPE_OVERHEAD, ENVELOPE_NONCE_LEN),
        };
        if len < min {
            return Err(FormatError::Truncated { what });
        }
        Ok(prefix)
    }

    /// Authenticates and decrypts `body` (what follows the nonce: ciphertext, then
    /// tag) in place; returns the plaintext's length, at the start of `body`.
    fn open_body(&self, what: &'static str, nonce24: &[u8], body: &mut [u8]) -> Result<usize> {
        match self.encryption.algorithm() {
            None => {
                let (pt, tag) = body.split_at(body.len() - ENVELOPE_TAG_LEN);
                let mac = blake3::keyed_hash(&self.key, pt);
                if !constant_time_eq(&mac.as_bytes()[..ENVELOPE_TAG_LEN], tag) {
                    return Err(FormatError::Authentication { what });
                }
                Ok(pt.len())
            }
            Some(alg) => {
                let key = self.subkey(alg, &nonce24[..12]);
                let mut n12 = [0u8; 12];
                n12.copy_from_slice(&nonce24[12..ENVELOPE_NONCE_LEN]);
                let len = key
                    .open_in_place(
                        aead::Nonce::assume_unique_for_key(n12),
                        aead::Aad::empty(),
                        body,
                    )
                    .map_err(|_| FormatError::Authentication { what })?
                    .len();
                Ok(len)
            }
        }
    }
}

fn constant_time_eq(a: &[u8], b: &[u8]) -> bool {
    a.len() == b.len() && a.iter().zip(b).fold(0u8, |acc, (x, y)| acc | (x ^ y)) == 0
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn sealers() -> Vec<Sealer> {
        [
            Encryption::Aes256Gcm,
            Encryption::ChaCha20Poly1305,
            Encryption::None,
        ]
        .into_iter()
        .map(|e| Sealer::new(e, [7u8; 32]))
        .collect()
    }

    proptest! {
        #[test]
        fn opened_in_place_as_opened(data: Vec<u8>, flip in any::<prop::sample::Index>()) {
            for s in sealers() {
                let sealed = s.seal(&data);
                let mut copy = sealed.clone();
                let at = s.open_in_place("t", &mut copy).unwrap();
                prop_assert_eq!(&copy[at], &data[..]);
                // Any flipped bit is refused, in place as by `open`.
                let mut bad = sealed.clone();
                let i = flip.index(bad.len());
                bad[i] ^= 1;
                prop_assert!(s.open_in_place("t", &mut bad).is_err());
                prop_assert!(s.open("t", &bad).is_err());
                // Too short to be an envelope.
                let mut short = sealed[..s.overhead() - 1].to_vec();
                prop_assert!(s.open_in_place("t", &mut short).is_err());
            }
        }

        #[test]
        fn seal_open_round_trip(data: Vec<u8>) {
            for s in sealers() {
                let sealed = s.seal(&data);
                prop_assert_eq!(sealed.len(), data.len() + s.overhead());
                prop_assert_eq!(s.open("t", &sealed).unwrap(), data.clone());
            }
        }

        #[test]
        fn any_flipped_bit_is_detected(data in proptest::collection::vec(any::<u8>(), 0..300), pos: usize, bit in 0u8..8) {
            for s in sealers() {
                let mut sealed = s.seal(&data);
                let i = pos % sealed.len();
                sealed[i] ^= 1 << bit;
                prop_assert!(s.open("t", &sealed).is_err());
            }
        }

        #[test]
        fn truncation_is_detected(data in proptest::collection::vec(any::<u8>(), 0..300), cut: usize) {
            for s in sealers() {
                let sealed = s.seal(&data);
                let n = cut % sealed.len();
                prop_assert!(s.open("t", &sealed[..n]).is_err());
            }
        }
    }

    #[test]
    fn seal_draws_a_fresh_nonce_every_time() {
        for s in sealers()
            .into_iter()
            .filter(|s| s.encryption() != Encryption::None)
        {
            let a = s.seal(b"same plaintext");
            let b = s.seal(b"same plaintext");
            assert_ne!(a[..ENVELOPE_NONCE_LEN], b[..ENVELOPE_NONCE_LEN]);
            assert_ne!(a, b);
        }
    }

    #[test]
    fn a_fixed_nonce_seals_reproducibly_and_opens() {
        for s in sealers() {
            let a = s.seal_with_nonce([5; ENVELOPE_NONCE_LEN], b"fixed");
            assert_eq!(a, s.seal_with_nonce([5; ENVELOPE_NONCE_LEN], b"fixed"));
            assert_eq!(s.open("t", &a).unwrap(), b"fixed");
            if s.encryption() != Encryption::None {
                assert_eq!(a[..ENVELOPE_NONCE_LEN], [5; ENVELOPE_NONCE_LEN]);
                assert_ne!(a, s.seal_with_nonce([6; ENVELOPE_NONCE_LEN], b"fixed"));
            }
        }
    }

    #[test]
    fn wrong_key_fails() {
        let a = Sealer::new(Encryption::Aes256Gcm, [1u8; 32]);
        let b = Sealer::new(Encryption::Aes256Gcm, [2u8; 32]);
        assert!(b.open("t", &a.seal(b"hello")).is_err());
    }
}
