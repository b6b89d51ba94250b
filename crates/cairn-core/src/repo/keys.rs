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
            let Ok(id) = KeyId::from_hex(names::base(&info.name)) else {
                continue;
            };
            let kf = self
                .backend
                .get(&info.name)
                .map_err(Error::from)
                .and_then(|d| {
                    KeyFile::from_bytes(&d)
                        .map_err(|e| Error::damaged(format!("key file {}", id.short()), e))
                });
            out.push((id, kf));
        }
        out.sort_by_key(|a| a.0);
        Ok(out)
    }

    /// Resolves a key id prefix.
    pub fn find_key(&self, prefix: &str) -> Result<KeyId> {
        let keys = self.list_keys()?;
        let m: Vec<KeyId> = keys
            .iter()
            .map(|(id, _)| *id)
            .filter(|id| id.to_hex().starts_with(prefix))
            .collect();
        match m.len() {
            0 => Err(Error::Invalid(format!("no key matches {prefix:?}"))),
            1 => Ok(m[0]),
            _ => Err(Error::Invalid(format!("key id {prefix:?} is ambiguous"))),
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
        if self.list_keys()?.len() <= 1 {
            return Err(Error::Invalid("refusing to remove the last key".into()));
        }
        crate::hooks::point("key:before-remove");
        self.backend.delete(&names::key(&id.to_hex()))?;
        Ok(())
    }

    /// Changes the password of the key in use: writes a new key file, then removes
    /// the old one. Data is never re-encrypted (the master secret does not change).
    pub fn change_password(&mut self, new_password: &str) -> Result<KeyId> {
        let old = self.key_id;
        let new = self.add_key(new_password)?;
        if let Some(old) = old {
            self.backend.delete(&names::key(&old.to_hex()))?;
        }
        self.key_id = Some(new);
        Ok(new)
    }
}
