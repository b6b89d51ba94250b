//! The server's settings: a TOML file, flags, or both (flags win).
//!
//! ```toml
//! listen = "0.0.0.0:8443"
//! state_dir = "/var/lib/cairn"
//! tls_cert = "/etc/cairn/cert.pem"   # both absent: a self-signed certificate
//! tls_key = "/etc/cairn/key.pem"
//! request_timeout_secs = 600
//! max_connections = 1024
//! max_connections_per_ip = 128
//! answer_memory_mib = 2048
//! answer_memory_per_caller_mib = 512
//! answer_stall_secs = 120
//! connection_idle_secs = 120
//! max_lock_age_hours = 168
//! job_idle_secs = 90
//! restart_lock_secs = 360
//! session_idle_secs = 1800
//! session_max_hours = 12
//! stale_after_hours = 26
//!
//! [datastores]
//! main = "/srv/cairn/main"
//! offsite = "s3:https://s3.example.com/bucket/cairn"
//! ```

use serde::Deserialize;
use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};

#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    #[error("cannot read {path}: {message}")]
    Read { path: PathBuf, message: String },
    #[error("{path}: {message}")]
    Parse { path: PathBuf, message: String },
    #[error("{0}")]
    Invalid(String),
    /// A command-line flag's value that cannot be taken (the CLI exits 2).
    #[error("{0}")]
    BadFlag(String),
}

/// Everything `cairn serve` needs to run.
#[derive(Clone, Debug)]
pub struct ServerConfig {
    pub listen: SocketAddr,
    /// Datastore name to repository location (`/path` or `s3:...`).
    pub datastores: BTreeMap<String, String>,
    pub state_dir: PathBuf,
    pub tls: Tls,
    /// Seconds a request may take from its first byte to its answer.
    pub request_timeout_secs: u64,
    /// Connections served at once; more wait to be accepted.
    pub max_connections: usize,
    /// Connections served at once from one address; more are closed at once.
    pub max_connections_per_ip: usize,
    /// MiB the answers built and not yet taken by their clients may hold in all,
    /// and for one caller (a token, a console session): an answer that does not
    /// fit is refused with `429` ([`crate::answers`]).
    pub answer_memory_mib: u64,
    pub answer_memory_per_caller_mib: u64,
    /// Seconds a client may take none of an answer before the server gives it
    /// up and ends the connection ([`crate::conns::Untaken`]).
    pub answer_stall_secs: u64,
    /// Seconds a connection may go without a request running or an answer
    /// being sent before the server closes it ([`crate::conns::Busy`]).
    pub connection_idle_secs: u64,
    /// Hours after which a lock made by a backup or restore token may no longer be
    /// refreshed (a week by default: longer than any sane backup, short enough that
    /// a hijacked client cannot keep prune from deleting forever).
    pub max_lock_age_hours: u64,
    /// Seconds a job slot stays with a client the server does not hear from
    /// (a killed client's slot is freed after this; clients speak every third).
    pub job_idle_secs: u64,
    /// After a start: a lock whose client session held it when the server
    /// stopped, and which is not refreshed (through any server) within this
    /// long, belongs to a client that is gone, and is deleted. Longer than the
    /// clients' refresh interval (5 minutes), so that a live one always shows.
    pub restart_lock_secs: u64,
    /// A console sign-in unused for this long ends.
    pub session_idle_secs: u64,
    /// No console sign-in lasts longer than this.
    pub session_max_hours: u64,
    /// The console flags a host whose last backup is older than this.
    pub stale_after_hours: u64,
    /// The largest object a client may upload, bytes.
    pub max_object_size: u64,
    /// Bandwidth limits, bytes per second: each token's, and the whole server's.
    pub limits: Limits,
    /// Scheduled jobs (settings file only).
    pub jobs: Vec<crate::jobs::JobSpec>,
    /// Password files of the datastores the server may open with the key (for
    /// check and retention jobs).
    pub datastore_passwords: BTreeMap<String, PathBuf>,
}

/// Average rates in bytes per second; `None`: unlimited.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Limits {
    pub upload_per_token: Option<u64>,
    pub download_per_token: Option<u64>,
    pub upload: Option<u64>,
    pub download: Option<u64>,
}

/// A rate: bytes per second as a number, or a string with K, M or G (binary).
#[derive(Clone, Debug, Deserialize)]
#[serde(untagged)]
pub enum Rate {
    Bytes(u64),
    Text(String),
}

/// A rate flag or setting into bytes per second ([`cairn_core::units::parse_rate`]).
pub fn parse_rate(s: &str) -> Result<u64, ConfigError> {
    cairn_core::units::parse_rate(s).map_err(ConfigError::Invalid)
}

fn rate(r: &Option<Rate>) -> Result<Option<u64>, ConfigError> {
    match r {
        None => Ok(None),
        Some(Rate::Bytes(0)) => Err(ConfigError::Invalid("a rate of 0".into())),
        Some(Rate::Bytes(n)) => Ok(Some(*n)),
        Some(Rate::Text(t)) => parse_rate(t).map(Some),
    }
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Tls {
    /// Certificate and key files (PEM).
    Files { cert: PathBuf, key: PathBuf },
    /// A self-signed certificate kept in the state directory, made on first start.
    SelfSigned,
    /// No TLS (`--insecure-http`): only on a loopback address.
    InsecureHttp,
}

/// The TOML file's shape; every member is optional.
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct FileConfig {
    pub listen: Option<String>,
    pub state_dir: Option<PathBuf>,
    pub tls_cert: Option<PathBuf>,
    pub tls_key: Option<PathBuf>,
    pub insecure_http: Option<bool>,
    pub request_timeout_secs: Option<u64>,
    pub max_connections: Option<usize>,
    pub max_connections_per_ip: Option<usize>,
    pub answer_memory_mib: Option<u64>,
    pub answer_memory_per_caller_mib: Option<u64>,
    pub answer_stall_secs: Option<u64>,
    pub connection_idle_secs: Option<u64>,
    pub max_lock_age_hours: Option<u64>,
    pub job_idle_secs: Option<u64>,
    pub restart_lock_secs: Option<u64>,
    pub session_idle_secs: Option<u64>,
    pub session_max_hours: Option<u64>,
    pub stale_after_hours: Option<u64>,
    pub max_object_size: Option<u64>,
    pub limit_upload_per_token: Option<Rate>,
    pub limit_download_per_token: Option<Rate>,
    pub limit_upload: Option<Rate>,
    pub limit_download: Option<Rate>,
    #[serde(default)]
    pub datastores: BTreeMap<String, String>,
    #[serde(default)]
    pub datastore_passwords: BTreeMap<String, PathBuf>,
    #[serde(default)]
    pub jobs: Vec<crate::jobs::JobSpec>,
}

impl FileConfig {
    pub fn load(path: &Path) -> Result<FileConfig, ConfigError> {
        let text = std::fs::read_to_string(path).map_err(|e| ConfigError::Read {
            path: path.to_path_buf(),
            message: e.to_string(),
        })?;
        let mut file: FileConfig = toml::from_str(&text).map_err(|e| ConfigError::Parse {
            path: path.to_path_buf(),
            message: e.to_string(),
        })?;
        // Relative paths are the settings file's, as in nginx's and systemd's
        // files, not the current directory's: `serve token add` from a shell and
        // the service started from `/` must find the same state (QA: a token added
        // from the file's directory landed where the server never looked).
        let base = std::path::absolute(path)
            .ok()
            .and_then(|p| p.parent().map(Path::to_path_buf))
            .unwrap_or_default();
        let fix = |p: &mut PathBuf| {
            if p.is_relative() {
                *p = base.join(&*p);
            }
        };
        for p in [&mut file.state_dir, &mut file.tls_cert, &mut file.tls_key]
            .into_iter()
            .flatten()
        {
            fix(p);
        }
        file.datastore_passwords.values_mut().for_each(fix);
        for location in file.datastores.values_mut() {
            if !location.contains(':') && Path::new(location).is_relative() {
                *location = base.join(&*location).to_string_lossy().into_owned();
            }
        }
        for j in &mut file.jobs {
            if let Some(p) = &mut j.to_password_file {
                fix(p);
            }
        }
        Ok(file)
    }
}

/// The default state directory: `/var/lib/cairn` for root, else
/// `$XDG_STATE_HOME/cairn` or `~/.local/state/cairn`.
pub fn default_state_dir() -> PathBuf {
    if nix::unistd::geteuid().is_root() {
        return PathBuf::from("/var/lib/cairn");
    }
    if let Some(d) = std::env::var_os("XDG_STATE_HOME").filter(|d| !d.is_empty()) {
        return PathBuf::from(d).join("cairn");
    }
    match std::env::var_os("HOME") {
        Some(h) => PathBuf::from(h).join(".local/state/cairn"),
        None => PathBuf::from(".cairn-state"),
    }
}

pub use cairn_backend::valid_datastore_name;

/// The flags of `cairn serve`, as the CLI parsed them.
#[derive(Clone, Debug, Default)]
pub struct Flags {
    pub config: Option<PathBuf>,
    pub listen: Option<String>,
    pub datastores: Vec<String>,
    pub state_dir: Option<PathBuf>,
    pub tls_cert: Option<PathBuf>,
    pub tls_key: Option<PathBuf>,
    pub insecure_http: bool,
    /// `--limit-upload-per-token` and friends, already parsed (win over the file).
    pub limits: Limits,
}

impl ServerConfig {
    /// Merges the file (if any) and the flags.
    pub fn from_flags(flags: &Flags) -> Result<ServerConfig, ConfigError> {
        let file = match &flags.config {
            Some(p) => FileConfig::load(p)?,
            None => FileConfig::default(),
        };
        let flagged_listen = flags.listen.is_some();
        let listen = flags
            .listen
            .clone()
            .or(file.listen)
            .unwrap_or_else(|| "127.0.0.1:8443".to_string());
        let listen: SocketAddr = listen.parse().map_err(|_| {
            let m = format!("--listen {listen:?}: expected ADDRESS:PORT such as 0.0.0.0:8443");
            if flagged_listen {
                ConfigError::BadFlag(m)
            } else {
                ConfigError::Invalid(m)
            }
        })?;
        let mut datastores = file.datastores;
        // A flag's datastore replaces the settings file's of that name; two flags
        // of one name are a mistake (one of them would be silently ignored).
        let mut flagged = std::collections::HashSet::new();
        for d in &flags.datastores {
            let Some((name, location)) = d.split_once('=') else {
                return Err(ConfigError::BadFlag(format!(
                    "--datastore {d:?}: expected NAME=PATH or NAME=s3:..."
                )));
            };
            if !flagged.insert(name.to_string()) {
                return Err(ConfigError::Invalid(format!(
                    "--datastore {name} is given twice: each datastore needs a name of its own"
                )));
            }
            datastores.insert(name.to_string(), location.to_string());
        }
        for (name, location) in &datastores {
            if !valid_datastore_name(name) {
                return Err(ConfigError::Invalid(format!(
                    "datastore name {name:?}: use letters, digits, '-', '_' and '.' (at most 64)"
                )));
            }
            if location.is_empty() {
                return Err(ConfigError::Invalid(format!(
                    "datastore {name}: the location is empty"
                )));
            }
        }
        if datastores.is_empty() {
            return Err(ConfigError::Invalid(
                "no datastore: give --datastore NAME=PATH (or [datastores] in --config)".into(),
            ));
        }
        // Two names for one local directory (`/x` and `/x/`, or through `..` or a
        // symlink): a copy job from one to the other would copy a datastore onto
        // itself, and the server would keep two views of one repository.
        let mut seen: Vec<(std::path::PathBuf, &str)> = Vec::new();
        for (name, location) in &datastores {
            let Ok(cairn_core::repo::storage::Location::Local(p)) =
                cairn_core::repo::storage::Location::parse(location)
            else {
                continue;
            };
            let p = std::fs::canonicalize(&p).unwrap_or(p);
            if let Some((_, other)) = seen.iter().find(|(q, _)| *q == p) {
                return Err(ConfigError::Invalid(format!(
                    "datastores {other} and {name} are the same directory ({}): give it one name",
                    p.display()
                )));
            }
            seen.push((p, name));
        }
        let insecure = flags.insecure_http || file.insecure_http.unwrap_or(false);
        let cert = flags.tls_cert.clone().or(file.tls_cert);
        let key = flags.tls_key.clone().or(file.tls_key);
        let tls = match (insecure, cert, key) {
            (true, None, None) => {
                if !listen.ip().is_loopback() {
                    return Err(ConfigError::Invalid(format!(
                        "--insecure-http is allowed on a loopback address only, not {listen}: \
                         tokens and data would cross the network in the clear"
                    )));
                }
                Tls::InsecureHttp
            }
            (true, _, _) => {
                return Err(ConfigError::Invalid(
                    "--insecure-http and a TLS certificate exclude each other".into(),
                ));
            }
            (false, Some(cert), Some(key)) => Tls::Files { cert, key },
            (false, None, None) => Tls::SelfSigned,
            (false, _, _) => {
                return Err(ConfigError::Invalid(
                    "give both --tls-cert and --tls-key, or neither (a self-signed certificate)"
                        .into(),
                ));
            }
        };
        let config = ServerConfig {
            listen,
            datastores,
            state_dir: flags
                .state_dir
                .clone()
                .or(file.state_dir)
                .unwrap_or_else(default_state_dir),
            tls,
            request_timeout_secs: file.request_timeout_secs.unwrap_or(600),
            max_connections: file.max_connections.unwrap_or(1024).max(1),
            max_connections_per_ip: file.max_connections_per_ip.unwrap_or(128).max(1),
            answer_memory_mib: file.answer_memory_mib.unwrap_or(2048),
            answer_memory_per_caller_mib: file.answer_memory_per_caller_mib.unwrap_or(512),
            answer_stall_secs: file.answer_stall_secs.unwrap_or(120),
            connection_idle_secs: file.connection_idle_secs.unwrap_or(120),
            max_lock_age_hours: file.max_lock_age_hours.unwrap_or(7 * 24),
            job_idle_secs: file.job_idle_secs.unwrap_or(90),
            restart_lock_secs: file.restart_lock_secs.unwrap_or(360),
            session_idle_secs: file.session_idle_secs.unwrap_or(1800),
            session_max_hours: file.session_max_hours.unwrap_or(12),
            stale_after_hours: file.stale_after_hours.unwrap_or(26),
            max_object_size: file.max_object_size.unwrap_or(512 << 20),
            jobs: file.jobs,
            datastore_passwords: file.datastore_passwords,
            limits: Limits {
                upload_per_token: flags
                    .limits
                    .upload_per_token
                    .or(rate(&file.limit_upload_per_token)?),
                download_per_token: flags
                    .limits
                    .download_per_token
                    .or(rate(&file.limit_download_per_token)?),
                upload: flags.limits.upload.or(rate(&file.limit_upload)?),
                download: flags.limits.download.or(rate(&file.limit_download)?),
            },
        };
        // A zero here would refuse every connection, time out every request or
        // upload, or make every lock stale at once; a huge lock age would turn
        // negative as seconds and do the same: said, not taken.
        for (name, value) in [
            ("max_connections", file.max_connections),
            ("max_connections_per_ip", file.max_connections_per_ip),
        ] {
            if value == Some(0) {
                return Err(ConfigError::Invalid(format!(
                    "{name} = 0: must be at least 1"
                )));
            }
        }
        for (name, value, min, max) in [
            (
                "request_timeout_secs",
                config.request_timeout_secs,
                1,
                7 * 86_400,
            ),
            (
                "max_lock_age_hours",
                config.max_lock_age_hours,
                1,
                24 * 3660,
            ),
            (
                "max_object_size",
                config.max_object_size,
                1 << 20,
                cairn_format::consts::MAX_PACK_SIZE,
            ),
            ("max_connections", config.max_connections as u64, 1, 1 << 20),
            (
                "max_connections_per_ip",
                config.max_connections_per_ip as u64,
                1,
                1 << 20,
            ),
            // At least one answer of the largest piece read from object storage
            // (and a few of those a restore reads at once).
            ("answer_memory_mib", config.answer_memory_mib, 16, 1 << 30),
            (
                "answer_memory_per_caller_mib",
                config.answer_memory_per_caller_mib,
                16,
                1 << 30,
            ),
            // Long enough for a client's pause, short enough to matter.
            ("answer_stall_secs", config.answer_stall_secs, 5, 86_400),
            // Past a client's own pool (reqwest keeps an idle connection 90 s).
            (
                "connection_idle_secs",
                config.connection_idle_secs,
                5,
                86_400,
            ),
        ] {
            if !(min..=max).contains(&value) {
                return Err(ConfigError::Invalid(format!(
                    "{name} = {value}: must be between {min} and {max}"
                )));
            }
        }
        if !(3..=86_400).contains(&config.job_idle_secs) {
            return Err(ConfigError::Invalid(format!(
                "job_idle_secs = {}: must be between 3 and 86400",
                config.job_idle_secs
            )));
        }
        if !(3..=86_400).contains(&config.restart_lock_secs) {
            return Err(ConfigError::Invalid(format!(
                "restart_lock_secs = {}: must be between 3 and 86400",
                config.restart_lock_secs
            )));
        }
        if !(1..=7 * 86_400).contains(&config.session_idle_secs) {
            return Err(ConfigError::Invalid(format!(
                "session_idle_secs = {}: must be between 1 and 604800",
                config.session_idle_secs
            )));
        }
        if !(1..=24 * 30).contains(&config.session_max_hours) {
            return Err(ConfigError::Invalid(format!(
                "session_max_hours = {}: must be between 1 and 720",
                config.session_max_hours
            )));
        }
        if !(1..=24 * 366).contains(&config.stale_after_hours) {
            return Err(ConfigError::Invalid(format!(
                "stale_after_hours = {}: must be between 1 and 8784",
                config.stale_after_hours
            )));
        }
        let mut names = std::collections::BTreeSet::new();
        for j in &config.jobs {
            j.validate(&config.datastores, &config.datastore_passwords)
                .map_err(ConfigError::Invalid)?;
            if !names.insert(j.name.clone()) {
                return Err(ConfigError::Invalid(format!(
                    "two jobs are named {:?}",
                    j.name
                )));
            }
        }
        for name in config.datastore_passwords.keys() {
            if !config.datastores.contains_key(name) {
                return Err(ConfigError::Invalid(format!(
                    "[datastore_passwords] names {name:?}, which is not a datastore"
                )));
            }
        }
        Ok(config)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn flags_and_file() {
        let dir = tempfile::tempdir().unwrap();
        let f = dir.path().join("c.toml");
        std::fs::write(
            &f,
            "listen = \"127.0.0.1:9000\"\n[datastores]\nmain = \"/srv/a\"\n",
        )
        .unwrap();
        let c = ServerConfig::from_flags(&Flags {
            config: Some(f.clone()),
            datastores: vec!["two=/srv/b".into()],
            ..Flags::default()
        })
        .unwrap();
        assert_eq!(c.listen.port(), 9000);
        assert_eq!(c.datastores.len(), 2);
        assert_eq!(c.tls, Tls::SelfSigned);
        let e = ServerConfig::from_flags(&Flags {
            listen: Some("0.0.0.0:8000".into()),
            datastores: vec!["a=/x".into()],
            insecure_http: true,
            ..Flags::default()
        })
        .unwrap_err();
        assert!(e.to_string().contains("loopback"), "{e}");
        for bad in ["../x=/a", "a", "=/a", "a b=/x"] {
            assert!(
                ServerConfig::from_flags(&Flags {
                    datastores: vec![bad.into()],
                    ..Flags::default()
                })
                .is_err(),
                "{bad}"
            );
        }
        std::fs::write(
            &f,
            "limit_upload_per_token = \"2M\"\nlimit_download = 1000\n[datastores]\na = \"/x\"\n",
        )
        .unwrap();
        let c = ServerConfig::from_flags(&Flags {
            config: Some(f.clone()),
            ..Flags::default()
        })
        .unwrap();
        assert_eq!(c.limits.upload_per_token, Some(2 << 20));
        assert_eq!(c.limits.download, Some(1000));
        assert_eq!(c.limits.upload, None);
        assert!(parse_rate("0").is_err() && parse_rate("x").is_err());
        assert_eq!(parse_rate("1.5K").unwrap(), 1536);
        std::fs::write(&f, "lisen = 1\n").unwrap();
        let e = ServerConfig::from_flags(&Flags {
            config: Some(f),
            ..Flags::default()
        })
        .unwrap_err();
        assert!(e.to_string().contains("lisen"), "{e}");
    }

    /// Relative paths in the file are the file's, wherever the server or a
    /// `serve token` command is started.
    #[test]
    fn relative_paths_are_the_settings_files() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::create_dir_all(dir.path().join("etc")).unwrap();
        let f = dir.path().join("etc/c.toml");
        std::fs::write(
            &f,
            "state_dir = \"st\"\ntls_cert = \"c.pem\"\ntls_key = \"/abs/k.pem\"\n\
             [datastores]\nmain = \"ds/main\"\nfar = \"s3:http://h/b\"\n\
             [datastore_passwords]\nmain = \"pw\"\n",
        )
        .unwrap();
        let c = FileConfig::load(&f).unwrap();
        let etc = dir.path().join("etc");
        assert_eq!(c.state_dir, Some(etc.join("st")));
        assert_eq!(c.tls_cert, Some(etc.join("c.pem")));
        assert_eq!(c.tls_key, Some(PathBuf::from("/abs/k.pem")));
        assert_eq!(c.datastores["main"], etc.join("ds/main").to_str().unwrap());
        assert_eq!(c.datastores["far"], "s3:http://h/b");
        assert_eq!(c.datastore_passwords["main"], etc.join("pw"));
    }

    #[test]
    fn zero_limits_and_one_directory_under_two_names_are_refused() {
        let dir = tempfile::tempdir().unwrap();
        let f = dir.path().join("c.toml");
        for (line, says) in [
            ("max_connections = 0", "max_connections = 0"),
            ("max_connections_per_ip = 0", "max_connections_per_ip = 0"),
            ("request_timeout_secs = 0", "request_timeout_secs = 0"),
            ("max_object_size = 0", "max_object_size = 0"),
            ("max_lock_age_hours = 0", "max_lock_age_hours = 0"),
            (
                "answer_stall_secs = 1",
                "answer_stall_secs = 1: must be between 5",
            ),
        ] {
            std::fs::write(&f, format!("{line}\n[datastores]\na = \"/x\"\n")).unwrap();
            let e = ServerConfig::from_flags(&Flags {
                config: Some(f.clone()),
                ..Flags::default()
            })
            .unwrap_err();
            assert!(e.to_string().contains(says), "{line}: {e}");
        }
        let e = ServerConfig::from_flags(&Flags {
            datastores: vec!["a=/x".into(), "b=/x/".into()],
            ..Flags::default()
        })
        .unwrap_err();
        assert!(e.to_string().contains("same directory"), "{e}");
    }
}
