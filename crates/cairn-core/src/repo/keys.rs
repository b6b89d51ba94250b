//! The repository's keys: several passwords open the same master secret.

use super::*;

impl Repository {
    // ---- keys ----

    pub(super) fn add_key_with(&self, password: &str, kdf: KdfParams) -> Result<KeyId> {
        let kf = KeyFile::wrap(
            &self.key,
            password.as_bytes(),
            kdf,
            crate::time::now_rfc3339(),
            hostname(),
            username(),
        )
        .map_err(|e| Error::Invalid(e.to_string()))?;
        let bytes = kf.to_bytes();
        let id = KeyId::of_content(&bytes);
        super::objects::store_immutable(
            self.backend.as_ref(),
            &names::key(&id.to_hex()),
            &bytes,
            false,
        )?;
        crate::hooks::point("key:stored");
        Ok(id)
    }

    pub fn add_key(&self, password: &str) -> Result<KeyId> {
        if self.config.encryption == Encryption::None {
            return Err(Error::Invalid(
                "this repository is not encrypted: it has no passwords".into(),
            ));
        }
        self.add_key_with(password, KdfParams::new_default())
    }

    pub fn list_keys(&self) -> Result<Vec<(KeyId, Result<KeyFile>)>> {
        let mut out = Vec::new();
        for info in self.backend.list(names::KEYS)? {
            let Ok(id) = KeyId::from_hex(names::listed(&info.name)) else {
                continue;
            };
            let kf = read_key_file(self.backend.as_ref(), &info, &id);
            out.push((id, kf));
        }
        out.sort_by_key(|a| a.0);
        Ok(out)
    }

    /// The keys other than the one in use that `password` also opens. `key
    /// passwd` changes one key; another made with the same password still opens
    /// the repository with it afterwards, which the user must hear of.
    pub fn other_keys_opening_with(&self, password: &str) -> Result<Vec<KeyId>> {
        let mut out = Vec::new();
        for (id, kf) in self.list_keys()? {
            if Some(id) == self.key_id {
                continue;
            }
            // Every key of this repository wraps its one secret: a key file of
            // another repository that opens with the same password is not one.
            if let Ok(kf) = kf
                && kf
                    .unwrap_secret(password.as_bytes())
                    .is_ok_and(|s| s == *self.key.secret())
            {
                out.push(id);
            }
        }
        Ok(out)
    }

    /// Resolves a key id prefix.
    pub fn find_key(&self, prefix: &str) -> Result<KeyId> {
        // An empty prefix would match every key: a typo, not a choice.
        if prefix.is_empty() {
            return Err(Error::Invalid(
                "no key id given (`cairn key list` shows them)".into(),
            ));
        }
        let keys = self.list_keys()?;
        // Ids are shown in lower case; one typed in upper case is the same id,
        // as for snapshots.
        let lower = prefix.to_ascii_lowercase();
        let m: Vec<KeyId> = keys
            .iter()
            .map(|(id, _)| *id)
            .filter(|id| id.to_hex().starts_with(&lower))
            .collect();
        match m.len() {
            0 => Err(Error::Invalid(format!(
                "no key matches {prefix:?} (`cairn key list` shows them)"
            ))),
            1 => Ok(m[0]),
            _ => Err(Error::Invalid(format!(
                "key id {prefix:?} is ambiguous: it matches {}",
                m.iter().map(|k| k.short()).collect::<Vec<_>>().join(", ")
            ))),
        }
    }

    /// Removes a key; the key used to open the repository and the last key cannot be
    /// removed (that would lock everyone out).
    pub fn remove_key(&self, id: KeyId) -> Result<()> {
        if Some(id) == self.key_id {
            return Err(Error::Invalid(
                "refusing to remove the key this session opened the repository with".into(),
            ));
        }
        // Held from the listing to the delete: two removals at once, each from a
        // session opened with the other's key, would otherwise each see two keys
        // and remove both (nobody could open the repository again).
        let lock = super::lock::RepoLock::acquire(self, "key remove", true)?;
        let keys = self.list_keys()?;
        if !keys.iter().any(|(k, _)| *k == id) {
            return Err(Error::Invalid(format!(
                "key {} is not in the repository (removed meanwhile?)",
                id.short()
            )));
        }
        // The key this session opened with must stay: it is the one known to open
        // the repository (another key file that parses may be damaged inside, or
        // another repository's, copied in by mistake). Gone meanwhile (removed by
        // another session), nothing here is known to open it after this removal.
        if !keys
            .iter()
            .any(|(k, kf)| Some(*k) == self.key_id && *k != id && kf.is_ok())
        {
            return Err(Error::Invalid(
                "refusing to remove the last key: the key this session opened the repository \
                 with is not there any more (removed meanwhile?), and no other is known to \
                 open it"
                    .into(),
            ));
        }
        crate::hooks::point("key:before-remove");
        self.backend.delete(&names::key(&id.to_hex()))?;
        drop(lock);
        Ok(())
    }

    /// Changes the password of the key in use: writes a new key file, then removes
    /// the old one. Data is never re-encrypted (the master secret does not change).
    pub fn change_password(&mut self, new_password: &str) -> Result<KeyId> {
        let old = self.key_id;
        let new = self.add_key(new_password)?;
        if let Some(old) = old {
            // Another `key passwd` of the same key may have removed it already: the
            // new key is written and works, which is what was asked.
            match self.backend.delete(&names::key(&old.to_hex())) {
                Ok(()) => {}
                Err(e) if e.is_not_found() => {}
                Err(e) => return Err(e.into()),
            }
        }
        self.key_id = Some(new);
        Ok(new)
    }
}

/// Reads, checks and parses a listed key file. Damage (too large, not matching its
/// name — the name is the hash of its bytes —, not parsing) is `Damaged`: a flipped
/// byte anywhere would otherwise only make the password look wrong.
pub(super) fn read_key_file(
    backend: &dyn Backend,
    info: &cairn_backend::ObjectInfo,
    id: &KeyId,
) -> Result<KeyFile> {
    let what = format!("key file {}", id.short());
    let data = super::objects::get_listed(backend, info)
        .map_err(|e| super::objects::too_large_is_damage(e, &what))?;
    if data.is_empty() {
        return Err(Error::damaged(what, FormatError::Empty));
    }
    if KeyId::of_content(&data) != *id {
        return Err(Error::damaged(
            what,
            FormatError::IdMismatch {
                expected: id.to_hex(),
            },
        ));
    }
    KeyFile::from_bytes(&data).map_err(|e| Error::damaged(what, e))
}

/// What one pass over the key files met besides the keys that opened.
pub(super) struct KeyPass {
    /// A key file that could not be read or unwrapped for damage (or a newer
    /// format): the password may be its.
    pub damaged: Option<Error>,
    /// A key file listed and gone when read (a `key passwd` replacing it).
    pub vanished: bool,
}

/// Unwraps each key file of `keys` (in the order given) that `password` opens
/// and hands its secret to `each`, until `each` returns true. Files whose name
/// is no key id are skipped; a wrong password for a file is no error. Opening
/// the repository and `repair config` walk the keys through this one place.
pub(super) fn open_each(
    backend: &dyn Backend,
    keys: Vec<cairn_backend::ObjectInfo>,
    password: &[u8],
    each: &mut dyn FnMut([u8; 32], KeyId) -> bool,
) -> Result<KeyPass> {
    let mut pass = KeyPass {
        damaged: None,
        vanished: false,
    };
    for info in keys {
        let Ok(id) = KeyId::from_hex(names::listed(&info.name)) else {
            continue;
        };
        let kf = match read_key_file(backend, &info, &id) {
            Ok(k) => k,
            Err(Error::Backend(e)) if e.is_not_found() => {
                pass.vanished = true;
                continue;
            }
            Err(e @ (Error::Damaged { .. } | Error::NewerFormat { .. })) => {
                pass.damaged = Some(e);
                continue;
            }
            Err(e) => return Err(e),
        };
        match kf.unwrap_secret(password) {
            Ok(secret) => {
                if each(secret, id) {
                    break;
                }
            }
            Err(FormatError::Authentication { .. }) => {}
            Err(e) => pass.damaged = Some(Error::damaged(format!("key file {}", id.short()), e)),
        }
    }
    Ok(pass)
}
