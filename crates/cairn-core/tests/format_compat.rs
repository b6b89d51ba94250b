//! Opening repositories written by a newer cairn (docs/FORMAT.md, "Compatibility"):
//! a newer format version or an unknown feature is refused with an "upgrade"
//! message, never as damage; settings this cairn does not know survive when it
//! rewrites the config.

use cairn_backend::{Backend, MemBackend, names};
use cairn_core::{Error, InitOptions, Repository};
use cairn_format::config::{Compression, Config};
use cairn_format::envelope::Encryption;
use cairn_format::key::MasterKey;
use std::sync::Arc;

fn unencrypted_repo() -> Arc<MemBackend> {
    let backend = Arc::new(MemBackend::new());
    let opts = InitOptions {
        encryption: false,
        ..InitOptions::default()
    };
    Repository::init(backend.clone(), None, &opts).unwrap();
    backend
}

/// Rewrites the stored config's `config` member with `edit` and MACs it again with
/// the repository's key, as a newer cairn would.
fn rewrite_config(backend: &MemBackend, edit: impl Fn(&str) -> String) {
    let raw = backend.get(names::CONFIG).unwrap();
    let (config, body, _) = Config::parse(&raw).unwrap();
    let secret: [u8; 32] = hex::decode(config.plain_master_secret.unwrap())
        .unwrap()
        .try_into()
        .unwrap();
    let key = MasterKey::from_secret(secret, Encryption::None);
    let body = edit(std::str::from_utf8(&body).unwrap());
    assert_ne!(body.as_bytes(), raw.as_slice(), "the edit changed nothing");
    let mac = hex::encode(key.mac(body.as_bytes()));
    let file = format!("{{\"config\": {body}, \"mac\": \"{mac}\"}}");
    backend.put(names::CONFIG, file.as_bytes()).unwrap();
}

fn open_error(backend: Arc<MemBackend>) -> Error {
    match Repository::open(backend, || Ok(String::new())) {
        Ok(_) => panic!("a repository of a newer format opened"),
        Err(e) => e,
    }
}

#[test]
fn a_newer_format_version_says_upgrade_not_damaged() {
    let backend = unencrypted_repo();
    rewrite_config(&backend, |b| {
        b.replacen("\"version\": 1", "\"version\": 2", 1)
    });
    let msg = open_error(backend).to_string();
    assert!(
        msg.contains(
            "was made by a newer version of cairn (format version 2; this cairn reads up to 1)"
        ),
        "{msg}"
    );
    assert!(!msg.contains("damaged"), "{msg}");
}

#[test]
fn an_unknown_feature_is_named() {
    let backend = unencrypted_repo();
    rewrite_config(&backend, |b| {
        assert!(b.contains("\"features\": ["), "{b}");
        b.replacen("\"features\": [", "\"features\": [\"zz-future\", ", 1)
    });
    let msg = open_error(backend).to_string();
    assert!(msg.contains("zz-future"), "{msg}");
    assert!(
        !msg.contains("admin-names"),
        "a known feature is not named: {msg}"
    );
    assert!(msg.contains("upgrade cairn"), "{msg}");
    assert!(!msg.contains("damaged"), "{msg}");
}

#[test]
fn changing_the_compression_keeps_a_newer_cairns_settings() {
    let backend = unencrypted_repo();
    rewrite_config(&backend, |b| {
        b.replacen(
            "\"version\": 1,",
            "\"version\": 1, \"zz_newer\": {\"keep\": [1, 2]},",
            1,
        )
    });
    let mut repo = Repository::open(backend.clone(), || Ok(String::new())).unwrap();
    repo.set_compression(Compression::Max).unwrap();
    let raw = backend.get(names::CONFIG).unwrap();
    let text = String::from_utf8(raw.clone()).unwrap();
    assert!(text.contains(r#""zz_newer": {"keep": [1, 2]}"#), "{text}");
    let (c, _, _) = Config::parse(&raw).unwrap();
    assert_eq!(c.compression, Compression::Max);
    // And the rewritten config still opens (its MAC covers the kept member).
    Repository::open(backend, || Ok(String::new())).unwrap();
}
