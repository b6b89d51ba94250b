//! The `config` object: what a repository is (format version, id, chunker, sealing,
//! compression policy). It is plaintext JSON so that `open` can learn the encryption
//! before any key is unwrapped, and it carries a MAC (keyed BLAKE3 under the master
//! key's MAC key) over the exact bytes of its `config` member, checked after unlock.

use crate::consts::*;
use crate::envelope::Encryption;
use crate::error::{FormatError, Result, check_version};
use crate::id::RepoId;
use crate::json::{UnknownFields, check_json_version};
use serde::{Deserialize, Serialize};
use serde_json::value::RawValue;

/// Compression policy for new blobs; changeable at any time.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Compression {
    None,
    Standard,
    Max,
}

impl Compression {
    /// zstd level used for the policy (measured: level 3 keeps the two-core pipeline
    /// above 300 MB/s on mixed data; level 9 gains a few percent at a quarter the speed).
    pub fn zstd_level(self) -> Option<i32> {
        match self {
            Compression::None => None,
            Compression::Standard => Some(1),
            Compression::Max => Some(9),
        }
    }
    pub fn name(self) -> &'static str {
        match self {
            Compression::None => "none",
            Compression::Standard => "standard",
            Compression::Max => "max",
        }
    }
}

impl std::str::FromStr for Compression {
    type Err = String;
    fn from_str(s: &str) -> std::result::Result<Self, String> {
        match s {
            "none" | "off" => Ok(Compression::None),
            "standard" | "auto" => Ok(Compression::Standard),
            "max" => Ok(Compression::Max),
            _ => Err(format!(
                "unknown compression {s:?} (expected none, standard or max)"
            )),
        }
    }
}

/// Where the master index lives while a command runs; changeable at any time
/// (`cairn index --placement`).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum IndexPlacement {
    /// Built in RAM from the index files at every open (47 bytes per blob).
    #[default]
    Ram,
    /// Kept on a local disk between runs, about 1.4 bytes of RAM per blob.
    Ssd,
}

impl IndexPlacement {
    pub fn name(self) -> &'static str {
        match self {
            IndexPlacement::Ram => "ram",
            IndexPlacement::Ssd => "ssd",
        }
    }
}

impl std::str::FromStr for IndexPlacement {
    type Err = String;
    fn from_str(s: &str) -> std::result::Result<Self, String> {
        match s {
            "ram" => Ok(IndexPlacement::Ram),
            "ssd" | "disk" => Ok(IndexPlacement::Ssd),
            _ => Err(format!(
                "unknown index placement {s:?} (expected ram or ssd)"
            )),
        }
    }
}

/// FastCDC parameters, fixed at creation.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct ChunkerParams {
    pub algorithm: String,
    pub min_size: u32,
    pub avg_size: u32,
    pub max_size: u32,
    pub normalization: u32,
}

impl ChunkerParams {
    pub fn for_block_size(avg: u32) -> Self {
        ChunkerParams {
            algorithm: "fastcdc-v2020".into(),
            min_size: avg / 4,
            avg_size: avg,
            max_size: avg * 4,
            normalization: 1,
        }
    }
    /// Checks the parameters, naming the first field out of bounds (QA r28: a
    /// Rust debug dump of them all said nothing of which one).
    pub fn validate(&self) -> Result<()> {
        let why = if self.algorithm != "fastcdc-v2020" {
            format!(
                "chunker.algorithm {:?}: only \"fastcdc-v2020\" is known",
                self.algorithm
            )
        } else if !BLOCK_SIZES.contains(&self.avg_size) {
            format!(
                "chunker.avg_size {}: one of {}",
                self.avg_size,
                BLOCK_SIZES
                    .iter()
                    .map(u32::to_string)
                    .collect::<Vec<_>>()
                    .join(", ")
            )
        } else if self.min_size < 64
            || !self.min_size.is_multiple_of(2)
            || self.min_size >= self.avg_size
        {
            format!(
                "chunker.min_size {}: an even number from 64 up to below avg_size {} (cairn \
                 writes avg_size / 4)",
                self.min_size, self.avg_size
            )
        } else if !self.max_size.is_multiple_of(2)
            || self.max_size <= self.avg_size
            || (self.max_size as usize) > MAX_BLOB_SIZE
        {
            format!(
                "chunker.max_size {}: an even number above avg_size {} and at most {} (cairn \
                 writes avg_size * 4)",
                self.max_size, self.avg_size, MAX_BLOB_SIZE
            )
        } else if self.normalization > 3 {
            format!(
                "chunker.normalization {}: 0 to 3 (cairn writes 1)",
                self.normalization
            )
        } else {
            return Ok(());
        };
        Err(FormatError::malformed(
            "config",
            format!("unsupported chunker parameters: {why}"),
        ))
    }
}

#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Config {
    pub version: u32,
    pub id: String,
    pub created: String,
    pub encryption: Encryption,
    pub chunker: ChunkerParams,
    pub compression: Compression,
    pub pack_size: u32,
    /// Backup jobs that may write at once; more wait their turn (changeable at any
    /// time; configs written before the setting existed mean the default).
    #[serde(default = "default_max_concurrent_jobs")]
    pub max_concurrent_jobs: u32,
    /// Where the index lives (absent: RAM).
    #[serde(default)]
    pub index_placement: IndexPlacement,
    /// Directory of the SSD placement's files (absent: the user's cache directory;
    /// `CAIRN_INDEX_PATH` overrides it on one machine).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub index_path: Option<String>,
    /// The memory operations on this repository keep under, in bytes, unless
    /// `--memory-limit` says otherwise (absent: no limit).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub memory_limit: Option<u64>,
    /// Only for `encryption: none`: the master secret, hex (nothing to protect).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub plain_master_secret: Option<String>,
    /// Format features the repository uses beyond version 1's rules; a reader must
    /// implement every one of them or refuse the repository (see
    /// [`KNOWN_FEATURES`]). Empty, and then not written, for repositories made before
    /// the first feature (`admin-names`).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub features: Vec<String>,
    /// Top-level members this code does not know (written by a newer cairn), kept so
    /// that rewriting the config here does not drop them.
    #[serde(flatten, skip_deserializing)]
    pub unknown_fields: UnknownFields,
}

/// Names of the top-level config members [`Config`] reads; every other member is
/// kept in [`Config::unknown_fields`].
const KNOWN_FIELDS: &[&str] = &[
    "version",
    "id",
    "created",
    "encryption",
    "chunker",
    "compression",
    "pack_size",
    "max_concurrent_jobs",
    "index_placement",
    "index_path",
    "memory_limit",
    "plain_master_secret",
    "features",
];

#[derive(Serialize, Deserialize)]
struct ConfigFile<'a> {
    #[serde(borrow)]
    config: &'a RawValue,
    mac: String,
}

/// Default of [`Config::max_concurrent_jobs`].
pub const DEFAULT_MAX_CONCURRENT_JOBS: u32 = 4;
/// Highest accepted value (a sanity bound; above 16 the CLI warns).
pub const MAX_MAX_CONCURRENT_JOBS: u32 = 1024;

fn default_max_concurrent_jobs() -> u32 {
    DEFAULT_MAX_CONCURRENT_JOBS
}

/// Refuses a feature list naming anything this code does not implement.
fn check_features(features: &[String]) -> Result<()> {
    let unknown: Vec<String> = features
        .iter()
        .filter(|f| !KNOWN_FEATURES.contains(&f.as_str()))
        .cloned()
        .collect();
    if unknown.is_empty() {
        Ok(())
    } else {
        Err(FormatError::UnknownFeatures { features: unknown })
    }
}

impl Config {
    /// Whether the repository uses a format feature (a name of [`KNOWN_FEATURES`]).
    pub fn has_feature(&self, feature: &str) -> bool {
        self.features.iter().any(|f| f == feature)
    }

    pub fn repo_id(&self) -> Result<RepoId> {
        RepoId::from_hex(&self.id)
    }

    pub fn validate(&self) -> Result<()> {
        check_version(
            "repository config",
            self.version.into(),
            1,
            REPO_FORMAT_VERSION.into(),
        )?;
        check_features(&self.features)?;
        self.chunker.validate()?;
        self.repo_id()?;
        if !(1 << 20..=256 << 20).contains(&self.pack_size) {
            return Err(FormatError::malformed("config", "pack_size out of range"));
        }
        if !(1..=MAX_MAX_CONCURRENT_JOBS).contains(&self.max_concurrent_jobs) {
            return Err(FormatError::malformed(
                "config",
                "max_concurrent_jobs out of range",
            ));
        }
        // The master secret is in the config exactly when nothing is encrypted: an
        // unencrypted repository cannot be opened without it, and an encrypted one
        // must never show it.
        match (self.encryption, &self.plain_master_secret) {
            (Encryption::None, Some(s)) => {
                let mut secret = [0u8; 32];
                hex::decode_to_slice(s, &mut secret).map_err(|e| {
                    FormatError::malformed("config", format!("plain_master_secret: {e}"))
                })?;
            }
            (Encryption::None, None) => {
                return Err(FormatError::malformed(
                    "config",
                    "unencrypted repository without plain_master_secret",
                ));
            }
            (_, Some(_)) => {
                return Err(FormatError::malformed(
                    "config",
                    "encrypted repository with a plain_master_secret",
                ));
            }
            (_, None) => {}
        }
        Ok(())
    }

    /// Serialises and MACs with `mac`.
    pub fn to_bytes(&self, mac: impl Fn(&[u8]) -> [u8; 32]) -> Vec<u8> {
        #[allow(clippy::expect_used)]
        let body = serde_json::to_string_pretty(self).expect("config serialises");
        let tag = hex::encode(mac(body.as_bytes()));
        #[allow(clippy::expect_used)]
        let raw = RawValue::from_string(body).expect("valid json");
        #[allow(clippy::expect_used)]
        serde_json::to_vec_pretty(&ConfigFile {
            config: &raw,
            mac: tag,
        })
        .expect("config file serialises")
    }

    /// The body as cairn writes it for this config ([`Config::to_bytes`]).
    pub fn canonical_body(&self) -> Vec<u8> {
        #[allow(clippy::expect_used)]
        serde_json::to_string_pretty(self)
            .expect("config serialises")
            .into_bytes()
    }

    /// Whether `mac` (with the key's `mac` function) authenticates this config
    /// read from `body`: the bytes as stored, or, when those were reformatted
    /// (an editor's or `jq`'s spaces, QA: one added space made the repository
    /// unreadable), the same content as cairn writes it. Either way the MAC
    /// vouches for every value; only the layout is let go.
    pub fn authenticated_by(
        &self,
        body: &[u8],
        tag: &[u8; 32],
        mac: impl Fn(&[u8]) -> [u8; 32],
    ) -> bool {
        mac(body) == *tag || mac(&self.canonical_body()) == *tag
    }

    /// Parses without checking the MAC; returns the config and a closure input for
    /// [`Config::verify`]: (body bytes, mac).
    pub fn parse(data: &[u8]) -> Result<(Config, Vec<u8>, [u8; 32])> {
        if data.len() > MAX_SMALL_OBJECT_SIZE {
            return Err(FormatError::TooLarge {
                what: "config",
                size: data.len() as u64,
                limit: MAX_SMALL_OBJECT_SIZE as u64,
            });
        }
        let file: ConfigFile<'_> = serde_json::from_slice(data)
            .map_err(|e| FormatError::malformed("config", e.to_string()))?;
        let body = file.config.get().as_bytes().to_vec();
        // Version and features before anything else: a newer format may have changed
        // the other members, and its reader must be told to upgrade, not that the
        // repository is damaged. Neither needs the MAC: forging them only makes this
        // cairn refuse, which deleting the config would do as well.
        check_json_version("repository config", &body, REPO_FORMAT_VERSION)?;
        #[derive(Deserialize)]
        struct FeatureProbe {
            #[serde(default)]
            features: Vec<String>,
        }
        if let Ok(probe) = serde_json::from_slice::<FeatureProbe>(&body) {
            check_features(&probe.features)?;
        }
        let mut config: Config = serde_json::from_slice(&body)
            .map_err(|e| FormatError::malformed("config", e.to_string()))?;
        config.unknown_fields = UnknownFields::collect(&body, KNOWN_FIELDS)
            .map_err(|e| FormatError::malformed("config", e.to_string()))?;
        let mut mac = [0u8; 32];
        hex::decode_to_slice(&file.mac, &mut mac)
            .map_err(|e| FormatError::malformed("config", format!("mac: {e}")))?;
        config.validate()?;
        Ok((config, body, mac))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn round_trip_and_mac() {
        let c = Config {
            version: 1,
            id: "00".repeat(32),
            created: "now".into(),
            encryption: Encryption::Aes256Gcm,
            chunker: ChunkerParams::for_block_size(16384),
            compression: Compression::Standard,
            pack_size: 16 << 20,
            max_concurrent_jobs: 4,
            index_placement: IndexPlacement::Ssd,
            index_path: Some("/var/cache/cairn".into()),
            memory_limit: Some(2 << 30),
            plain_master_secret: None,
            features: vec![],
            unknown_fields: UnknownFields::default(),
        };
        let mac = |b: &[u8]| *blake3::keyed_hash(&[1u8; 32], b).as_bytes();
        let bytes = c.to_bytes(mac);
        let (back, body, tag) = Config::parse(&bytes).unwrap();
        assert_eq!(back, c);
        assert_eq!(mac(&body), tag);
    }

    #[test]
    fn a_config_from_before_max_concurrent_jobs_means_the_default() {
        let old = br#"{"config": {"version": 1, "id": "0000000000000000000000000000000000000000000000000000000000000000", "created": "now", "encryption": "aes-256-gcm", "chunker": {"algorithm": "fastcdc-v2020", "min_size": 4096, "avg_size": 16384, "max_size": 65536, "normalization": 1}, "compression": "standard", "pack_size": 16777216}, "mac": "0000000000000000000000000000000000000000000000000000000000000000"}"#;
        let (c, _, _) = Config::parse(old).unwrap();
        assert_eq!(c.max_concurrent_jobs, DEFAULT_MAX_CONCURRENT_JOBS);
        let zero = String::from_utf8_lossy(old).replace(
            "\"pack_size\": 16777216",
            "\"pack_size\": 16777216, \"max_concurrent_jobs\": 0",
        );
        assert!(Config::parse(zero.as_bytes()).is_err());
    }

    fn arb_config() -> impl Strategy<Value = Config> {
        (
            (
                any::<[u8; 32]>(),
                ".*",
                prop_oneof![
                    Just(Encryption::Aes256Gcm),
                    Just(Encryption::ChaCha20Poly1305),
                    Just(Encryption::None)
                ],
                proptest::sample::select(BLOCK_SIZES.to_vec()),
                0u32..=3,
            ),
            (
                prop_oneof![
                    Just(Compression::None),
                    Just(Compression::Standard),
                    Just(Compression::Max)
                ],
                (1u32 << 20)..=(256 << 20),
                1u32..=MAX_MAX_CONCURRENT_JOBS,
                any::<bool>(),
                proptest::option::of(".*"),
                proptest::option::of(any::<u64>()),
            ),
        )
            .prop_map(
                |(
                    (id, created, encryption, avg, norm),
                    (compression, pack_size, jobs, ssd, path, extra),
                )| {
                    let mut chunker = ChunkerParams::for_block_size(avg);
                    chunker.normalization = norm;
                    let mut unknown_fields = UnknownFields::default();
                    if let Some(v) = extra {
                        unknown_fields.insert("zz_setting", &v.to_string()).unwrap();
                    }
                    Config {
                        version: REPO_FORMAT_VERSION,
                        id: hex::encode(id),
                        created,
                        encryption,
                        chunker,
                        compression,
                        pack_size,
                        max_concurrent_jobs: jobs,
                        index_placement: if ssd {
                            IndexPlacement::Ssd
                        } else {
                            IndexPlacement::Ram
                        },
                        index_path: path,
                        memory_limit: None,
                        plain_master_secret: (encryption == Encryption::None)
                            .then(|| hex::encode(id)),
                        features: vec![],
                        unknown_fields,
                    }
                },
            )
    }

    proptest! {
        #[test]
        fn config_round_trips(c in arb_config()) {
            let bytes = c.to_bytes(mac);
            let (back, body, tag) = Config::parse(&bytes).unwrap();
            prop_assert_eq!(mac(&body), tag);
            prop_assert_eq!(back, c);
        }

        #[test]
        fn parse_never_panics(data: Vec<u8>) {
            let _ = Config::parse(&data);
        }

        #[test]
        fn policy_names_round_trip(c in 0usize..3, p: bool) {
            let c = [Compression::None, Compression::Standard, Compression::Max][c];
            prop_assert_eq!(c.name().parse::<Compression>().unwrap(), c);
            let p = if p { IndexPlacement::Ssd } else { IndexPlacement::Ram };
            prop_assert_eq!(p.name().parse::<IndexPlacement>().unwrap(), p);
        }
    }

    fn sample() -> Config {
        Config {
            version: 1,
            id: "11".repeat(32),
            created: "2026-11-22T01:02:03Z".into(),
            encryption: Encryption::ChaCha20Poly1305,
            chunker: ChunkerParams::for_block_size(4096),
            compression: Compression::None,
            pack_size: 16 << 20,
            max_concurrent_jobs: 2,
            index_placement: IndexPlacement::Ram,
            index_path: None,
            memory_limit: None,
            plain_master_secret: None,
            features: vec![],
            unknown_fields: UnknownFields::default(),
        }
    }

    fn mac(b: &[u8]) -> [u8; 32] {
        *blake3::keyed_hash(&[3u8; 32], b).as_bytes()
    }

    /// Replaces the `config` member's text and re-MACs it, as a newer writer would.
    fn with_body(body: &str) -> Vec<u8> {
        format!(
            "{{\"config\": {body}, \"mac\": \"{}\"}}",
            hex::encode(mac(body.as_bytes()))
        )
        .into_bytes()
    }

    fn body_of(c: &Config) -> String {
        let (_, body, _) = Config::parse(&c.to_bytes(mac)).unwrap();
        String::from_utf8(body).unwrap()
    }

    #[test]
    fn a_newer_config_says_upgrade_not_damaged() {
        let body = body_of(&sample()).replacen("\"version\": 1", "\"version\": 2", 1);
        let err = Config::parse(&with_body(&body)).unwrap_err();
        assert_eq!(
            err.to_string(),
            "repository config was made by a newer version of cairn (format version 2; this cairn reads up to 1)"
        );
        assert!(err.needs_newer_cairn());
        // Even when the newer version changed other members beyond recognition.
        let strange = r#"{"version": 7, "encryption": {"suite": "future"}, "chunker": 5}"#;
        let err = Config::parse(&with_body(strange)).unwrap_err();
        assert!(
            matches!(
                err,
                FormatError::NewerVersion {
                    version: 7,
                    supported: 1,
                    ..
                }
            ),
            "{err}"
        );
        // Version 0 was never written: that is damage.
        let body = body_of(&sample()).replacen("\"version\": 1", "\"version\": 0", 1);
        let err = Config::parse(&with_body(&body)).unwrap_err();
        assert!(matches!(
            err,
            FormatError::UnsupportedVersion { version: 0, .. }
        ));
    }

    #[test]
    fn unknown_features_are_refused_by_name() {
        let mut c = sample();
        c.features = vec!["zz-future".into(), "other-thing".into()];
        let err = Config::parse(&c.to_bytes(mac)).unwrap_err();
        assert_eq!(
            err.to_string(),
            "the repository uses format features this cairn does not know (zz-future, other-thing); upgrade cairn to open it"
        );
        assert!(err.needs_newer_cairn());
        assert!(c.validate().is_err());
    }

    /// Each chunker field out of bounds is named with what it may be.
    #[test]
    fn chunker_parameters_out_of_bounds_are_named() {
        let good = ChunkerParams::for_block_size(16384);
        assert!(good.validate().is_ok());
        type Spoil = fn(&mut ChunkerParams);
        let cases: [(Spoil, &str); 5] = [
            (
                |p| p.max_size += 1,
                "chunker.max_size 65537: an even number",
            ),
            (|p| p.min_size = 16384, "chunker.min_size 16384"),
            (|p| p.avg_size = 5000, "chunker.avg_size 5000: one of 4096,"),
            (|p| p.algorithm = "x".into(), "chunker.algorithm \"x\""),
            (|p| p.normalization = 9, "chunker.normalization 9: 0 to 3"),
        ];
        for (spoil, says) in cases {
            let mut p = good.clone();
            spoil(&mut p);
            let e = p.validate().unwrap_err().to_string();
            assert!(e.contains(says), "{e} lacks {says}");
            assert!(!e.contains("ChunkerParams"), "{e}");
        }
    }

    #[test]
    fn no_features_means_no_features_member() {
        let c = sample();
        assert!(!body_of(&c).contains("features"));
        let (back, _, _) = Config::parse(&c.to_bytes(mac)).unwrap();
        assert!(back.features.is_empty());
        let empty = body_of(&c).replacen("\"version\": 1", "\"version\": 1, \"features\": []", 1);
        let (back, _, _) = Config::parse(&with_body(&empty)).unwrap();
        assert_eq!(back, c);
    }

    #[test]
    fn unknown_members_are_kept_when_the_config_is_rewritten() {
        // A newer cairn added two settings; this one changes the compression.
        let body = body_of(&sample()).replacen(
            "\"version\": 1,",
            "\"version\": 1, \"zz_retention\": {\"days\": [1, 2.5, \"x\"]}, \"zz_flag\": true,",
            1,
        );
        let stored = with_body(&body);
        let (mut c, body, tag) = Config::parse(&stored).unwrap();
        // The MAC covers the stored bytes exactly, unknown members included.
        assert_eq!(mac(&body), tag);
        assert_eq!(
            c.unknown_fields.names().collect::<Vec<_>>(),
            ["zz_retention", "zz_flag"]
        );
        c.compression = Compression::Max;
        let rewritten = c.to_bytes(mac);
        let (back, body, tag) = Config::parse(&rewritten).unwrap();
        assert_eq!(mac(&body), tag);
        assert_eq!(back, c);
        let text = String::from_utf8(body).unwrap();
        assert!(
            text.contains(r#""zz_retention": {"days": [1, 2.5, "x"]}"#),
            "{text}"
        );
        assert!(text.contains(r#""zz_flag": true"#), "{text}");
        assert!(text.contains(r#""compression": "max""#), "{text}");
    }

    #[test]
    fn a_changed_byte_fails_the_mac() {
        let stored = sample().to_bytes(mac);
        let (_, body, tag) = Config::parse(&stored).unwrap();
        assert_eq!(mac(&body), tag);
        let text = String::from_utf8(stored).unwrap().replacen(
            "\"max_concurrent_jobs\": 2",
            "\"max_concurrent_jobs\": 3",
            1,
        );
        let (_, body, tag) = Config::parse(text.as_bytes()).unwrap();
        assert_ne!(mac(&body), tag);
    }

    #[test]
    fn the_plain_master_secret_is_there_exactly_without_encryption() {
        let mut c = sample();
        c.plain_master_secret = Some("00".repeat(32));
        assert!(c.validate().is_err(), "encrypted, secret shown");
        c.encryption = Encryption::None;
        assert!(c.validate().is_ok());
        c.plain_master_secret = Some("00".repeat(31));
        assert!(c.validate().is_err(), "short secret");
        c.plain_master_secret = None;
        assert!(c.validate().is_err(), "unencrypted, no secret");
    }

    #[test]
    fn normalization_levels_zero_to_three_are_accepted() {
        for level in 0..=3 {
            let mut p = ChunkerParams::for_block_size(16384);
            p.normalization = level;
            assert!(p.validate().is_ok(), "{level}");
        }
        let mut p = ChunkerParams::for_block_size(16384);
        p.normalization = 4;
        assert!(p.validate().is_err());
    }
}
