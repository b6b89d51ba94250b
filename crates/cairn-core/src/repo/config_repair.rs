//! `repair config`: a config whose content reads but does not authenticate (a bit
//! of its MAC flipped, a value changed by hand) seals nothing in the repository,
//! yet without it nothing can be read. The key file the password opens is proved
//! to be this repository's by opening its snapshots (or index files), and the
//! config is sealed again with it. A config that does not parse cannot be
//! rebuilt this way: a copy must be put back.

use super::{CONFIG_WHAT, Repository, keys, objects};
use crate::error::{Error, Result};
use cairn_backend::{Backend, names};
use cairn_format::FormatError;
use cairn_format::KeyId;
use cairn_format::config::Config;
use cairn_format::consts::*;
use cairn_format::envelope::Encryption;
use cairn_format::key::MasterKey;
use std::sync::Arc;

/// What `repair config` found, and did.
#[derive(Clone, Debug, serde::Serialize)]
pub struct ConfigRepair {
    /// `intact` (it authenticates: nothing to do), `resealed`, or with a dry
    /// run `would_reseal`.
    pub outcome: &'static str,
    /// The key file that opens with the password and sealed the config.
    pub key: Option<String>,
    /// The object the key opened, which proves it this repository's.
    pub proved_by: Option<String>,
    /// The settings sealed, to compare with those given to `init`.
    pub settings: Settings,
}

#[derive(Clone, Debug, serde::Serialize)]
pub struct Settings {
    pub id: String,
    pub created: String,
    pub encryption: String,
    pub compression: String,
    pub chunker_min: u32,
    pub chunker_avg: u32,
    pub chunker_max: u32,
    pub pack_size: u64,
}

/// Objects of each kind tried as proof before giving up on a key.
const TRIED: usize = 8;

impl Repository {
    /// Checks the config of the repository at `backend` and, when it does not
    /// authenticate, seals it again with the key the password opens, once that
    /// key has opened one of the repository's snapshots or index files.
    pub fn repair_config(
        backend: Arc<dyn Backend>,
        password: impl FnOnce() -> Result<String>,
        dry_run: bool,
    ) -> Result<ConfigRepair> {
        let raw = match backend.get_bounded(names::CONFIG, MAX_SMALL_OBJECT_SIZE as u64) {
            Ok(r) => r,
            Err(e) if e.is_not_found() => {
                return Err(Error::ConfigMissing(backend.location()));
            }
            Err(e) => return Err(objects::too_large_is_damage(e, CONFIG_WHAT)),
        };
        let (config, body, tag) = Config::parse(&raw).map_err(|e| match e {
            // A newer cairn's: said as such (upgrade), not damage.
            e @ (FormatError::NewerVersion { .. } | FormatError::UnknownFeatures { .. }) => {
                Error::damaged(CONFIG_WHAT, e)
            }
            e => Error::Invalid(format!(
                "{CONFIG_WHAT} cannot be read as one ({e}): `repair config` seals again a \
                 config whose settings read but do not authenticate; this one must come \
                 back from a copy of the file `config` (a backup of this storage: a disk or \
                 volume snapshot, a file-level copy)"
            )),
        })?;
        let settings = Settings {
            id: config.id.clone(),
            created: config.created.clone(),
            encryption: as_written(&config.encryption),
            compression: as_written(&config.compression),
            chunker_min: config.chunker.min_size,
            chunker_avg: config.chunker.avg_size,
            chunker_max: config.chunker.max_size,
            pack_size: u64::from(config.pack_size),
        };
        let candidates = candidate_keys(backend.as_ref(), &config, password)?;
        for (key, id) in &candidates {
            if config.authenticated_by(&body, &tag, |b| key.mac(b)) {
                return Ok(ConfigRepair {
                    outcome: "intact",
                    key: id.map(|i| i.to_hex()),
                    proved_by: None,
                    settings,
                });
            }
        }
        let opened: Vec<String> = (candidates.iter())
            .filter_map(|(_, id)| id.map(|i| i.short()))
            .collect();
        for (key, id) in candidates {
            let Some(proof) = proof(backend.as_ref(), &key)? else {
                continue;
            };
            if !dry_run {
                Self::store_config(backend.as_ref(), &Arc::new(key), &config)?;
            }
            return Ok(ConfigRepair {
                outcome: if dry_run { "would_reseal" } else { "resealed" },
                key: id.map(|i| i.to_hex()),
                proved_by: Some(proof),
                settings,
            });
        }
        Err(Error::Invalid(format!(
            "{CONFIG_WHAT} does not authenticate, and {} the password opens {} none of the \
             repository's snapshots or index files: it is not this repository's key, so the \
             config was not sealed again (put back a copy of the file `config`)",
            if opened.len() == 1 {
                format!("the key file {}", opened[0])
            } else if opened.is_empty() {
                "the key in the config".to_string()
            } else {
                format!("the key files {}", opened.join(", "))
            },
            if opened.len() > 1 { "open" } else { "opens" }
        )))
    }
}

/// A setting as the config writes it (`aes-256-gcm`, `standard`).
fn as_written(v: &impl serde::Serialize) -> String {
    match serde_json::to_value(v) {
        Ok(serde_json::Value::String(s)) => s,
        Ok(other) => other.to_string(),
        Err(_) => String::new(),
    }
}

/// The keys that may have sealed the config: the one an unencrypted config
/// holds, or each key file the password opens.
fn candidate_keys(
    backend: &dyn Backend,
    config: &Config,
    password: impl FnOnce() -> Result<String>,
) -> Result<Vec<(MasterKey, Option<KeyId>)>> {
    let enc = config.encryption;
    if enc == Encryption::None {
        let bad = |m: String| Error::damaged(CONFIG_WHAT, FormatError::malformed("config", m));
        let hexs = (config.plain_master_secret.as_deref())
            .ok_or_else(|| bad("unencrypted repository without key".into()))?;
        let mut secret = [0u8; 32];
        hex::decode_to_slice(hexs, &mut secret).map_err(|e| bad(e.to_string()))?;
        return Ok(vec![(MasterKey::from_secret(secret, enc), None)]);
    }
    let pw = password()?;
    let mut list = backend.list(names::KEYS)?;
    list.sort_by(|a, b| a.name.cmp(&b.name));
    let mut out = Vec::new();
    let pass = keys::open_each(backend, list, pw.as_bytes(), &mut |secret, id| {
        out.push((MasterKey::from_secret(secret, enc), Some(id)));
        false
    })?;
    let damaged = pass.damaged;
    if out.is_empty() {
        return Err(match damaged {
            Some(d) => Error::KeyDamaged(d.to_string()),
            None => Error::WrongPassword,
        });
    }
    Ok(out)
}

/// The name of a snapshot (else index file) `key` opens, if any of the first
/// few does: only the repository's own key opens them.
fn proof(backend: &dyn Backend, key: &MasterKey) -> Result<Option<String>> {
    for (dir, kind, max) in [
        (
            names::SNAPSHOTS,
            "snapshot",
            super::MAX_METADATA_OBJECT_SIZE,
        ),
        (names::INDEX, "index file", super::MAX_INDEX_FILE_SIZE),
    ] {
        let mut list = backend.list(dir)?;
        list.sort_by(|a, b| a.name.cmp(&b.name));
        for info in list.iter().take(TRIED) {
            let Ok(data) = backend.get_bounded(&info.name, max as u64) else {
                continue;
            };
            if key.sealer.open(kind, &data).is_ok() {
                return Ok(Some(format!("{kind} {}", names::listed(&info.name))));
            }
        }
    }
    Ok(None)
}
