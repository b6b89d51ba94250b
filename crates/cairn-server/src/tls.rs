//! The listener's certificate: files the administrator gives, or a self-signed one
//! made on first start and kept in the state directory, which clients pin by its
//! SHA-256 fingerprint (`--server-fingerprint`), as Proxmox Backup Server does.

use std::path::{Path, PathBuf};
use std::sync::Arc;

#[derive(Debug, thiserror::Error)]
pub enum TlsError {
    #[error("{path}: {message}")]
    File { path: PathBuf, message: String },
    #[error("TLS: {0}")]
    Setup(String),
}

fn file_err(path: &Path, e: impl std::fmt::Display) -> TlsError {
    TlsError::File {
        path: path.to_path_buf(),
        message: e.to_string(),
    }
}

/// The SHA-256 fingerprint of a DER certificate, lowercase hex.
pub fn fingerprint(der: &[u8]) -> String {
    hex::encode(ring::digest::digest(&ring::digest::SHA256, der))
}

/// Loads (or, for `self_signed`, creates) the certificate chain and key; returns
/// the rustls configuration, the leaf certificate's fingerprint, and the source
/// the listener's certificate comes from (see [`CertSource`]).
pub fn server_config(
    cert: &Path,
    key: &Path,
    self_signed: bool,
) -> Result<(Arc<rustls::ServerConfig>, String, Arc<CertSource>), TlsError> {
    if self_signed && !cert.exists() {
        make_self_signed(cert, key)?;
    }
    let provider = Arc::new(rustls::crypto::aws_lc_rs::default_provider());
    let source = Arc::new(CertSource::open(cert, key, provider.clone())?);
    let fp = source.fingerprint();
    let mut config = rustls::ServerConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .map_err(|e| TlsError::Setup(e.to_string()))?
        .with_no_client_auth()
        .with_cert_resolver(source.clone());
    config.alpn_protocols = vec![b"h2".to_vec(), b"http/1.1".to_vec()];
    Ok((Arc::new(config), fp, source))
}

/// A certificate chain and key read from their files.
struct Loaded {
    key: Arc<rustls::sign::CertifiedKey>,
    fingerprint: String,
    /// The leaf's "not after", in unix seconds (`None`: not readable).
    not_after: Option<i64>,
}

/// What identifies a version of the two files: a renewal (certbot, an ACME
/// client, an administrator's copy) changes one of these.
type Stamp = [(i64, i64, u64, u64); 2];

fn stamp_of(cert: &Path, key: &Path) -> Option<Stamp> {
    use std::os::unix::fs::MetadataExt;
    let one = |p: &Path| {
        std::fs::metadata(p)
            .ok()
            .map(|m| (m.mtime(), m.mtime_nsec(), m.size(), m.ino()))
    };
    Some([one(cert)?, one(key)?])
}

/// Where the listener's certificate comes from: its two files, read again when
/// they change, so that a renewed certificate is served without a restart (as
/// tokens are; nginx needs a reload signal for it). A pair that does not load
/// (half written, a key that does not fit) leaves the previous one served.
#[derive(Debug)]
pub struct CertSource {
    cert: PathBuf,
    key: PathBuf,
    provider: Arc<rustls::crypto::CryptoProvider>,
    current: std::sync::RwLock<(Arc<rustls::sign::CertifiedKey>, String, Option<i64>)>,
    stamp: std::sync::Mutex<Option<Stamp>>,
}

/// What [`CertSource::reload_if_changed`] found.
pub enum Reload {
    /// The files changed and the new pair is served: its fingerprint and expiry.
    Served {
        fingerprint: String,
        not_after: Option<i64>,
    },
    /// The files changed, but the pair does not load: the previous one stays.
    Refused(TlsError),
}

impl CertSource {
    fn open(
        cert: &Path,
        key: &Path,
        provider: Arc<rustls::crypto::CryptoProvider>,
    ) -> Result<CertSource, TlsError> {
        let stamp = stamp_of(cert, key);
        let l = load(cert, key, &provider)?;
        Ok(CertSource {
            cert: cert.to_path_buf(),
            key: key.to_path_buf(),
            provider,
            current: std::sync::RwLock::new((l.key, l.fingerprint, l.not_after)),
            stamp: std::sync::Mutex::new(stamp),
        })
    }

    /// The certificate file's path (for messages).
    pub fn cert_path(&self) -> &Path {
        &self.cert
    }

    /// The served leaf certificate's SHA-256 fingerprint.
    pub fn fingerprint(&self) -> String {
        self.current.read().map(|c| c.1.clone()).unwrap_or_default()
    }

    /// When the served leaf certificate expires (unix seconds), if readable.
    pub fn not_after(&self) -> Option<i64> {
        self.current.read().ok().and_then(|c| c.2)
    }

    /// Reads the files again when they changed since last looked at; `None` when
    /// they did not (or cannot be looked at now: the pair served stays).
    pub fn reload_if_changed(&self) -> Option<Reload> {
        let now = stamp_of(&self.cert, &self.key)?;
        {
            let mut seen = self.stamp.lock().unwrap_or_else(|e| e.into_inner());
            if *seen == Some(now) {
                return None;
            }
            *seen = Some(now);
        }
        Some(match load(&self.cert, &self.key, &self.provider) {
            Ok(l) => {
                let r = Reload::Served {
                    fingerprint: l.fingerprint.clone(),
                    not_after: l.not_after,
                };
                if let Ok(mut c) = self.current.write() {
                    *c = (l.key, l.fingerprint, l.not_after);
                }
                r
            }
            Err(e) => Reload::Refused(e),
        })
    }
}

impl rustls::server::ResolvesServerCert for CertSource {
    fn resolve(
        &self,
        _hello: rustls::server::ClientHello<'_>,
    ) -> Option<Arc<rustls::sign::CertifiedKey>> {
        self.current.read().ok().map(|c| c.0.clone())
    }
}

/// Reads and checks a certificate chain and its private key.
fn load(
    cert: &Path,
    key: &Path,
    provider: &rustls::crypto::CryptoProvider,
) -> Result<Loaded, TlsError> {
    let cert_pem = std::fs::read(cert).map_err(|e| file_err(cert, e))?;
    let key_pem = std::fs::read(key).map_err(|e| file_err(key, e))?;
    let certs: Vec<rustls::pki_types::CertificateDer<'static>> =
        rustls_pemfile::certs(&mut cert_pem.as_slice())
            .collect::<Result<_, _>>()
            .map_err(|e| file_err(cert, format!("not a PEM certificate: {e}")))?;
    let Some(leaf) = certs.first() else {
        return Err(file_err(cert, "no certificate in the file"));
    };
    let fingerprint = fingerprint(leaf.as_ref());
    let not_after = x509_parser::parse_x509_certificate(leaf.as_ref())
        .ok()
        .map(|(_, c)| c.validity().not_after.timestamp());
    let key_der = rustls_pemfile::private_key(&mut key_pem.as_slice())
        .map_err(|e| file_err(key, format!("not a PEM private key: {e}")))?
        .ok_or_else(|| file_err(key, "no private key in the file"))?;
    let key = rustls::sign::CertifiedKey::from_der(certs, key_der, provider)
        .map_err(|e| TlsError::Setup(format!("certificate and key do not fit: {e}")))?;
    Ok(Loaded {
        key: Arc::new(key),
        fingerprint,
        not_after,
    })
}

/// Days before a certificate's expiry from which the server warns about it.
pub const EXPIRY_WARNING_DAYS: i64 = 14;

/// A log line about `not_after` when the certificate has expired or expires
/// within [`EXPIRY_WARNING_DAYS`] of `now`; `None` otherwise.
pub fn expiry_warning(cert: &Path, not_after: Option<i64>, now: i64) -> Option<String> {
    let t = not_after?;
    let when = cairn_core::time::format_unix(t, 0);
    let when = when.get(..19).unwrap_or(&when).replace('T', " ");
    if t <= now {
        Some(format!(
            "warning: the TLS certificate {} expired on {when} UTC: clients that check it \
             refuse to connect; renew it (the server serves the new files once they change)",
            cert.display()
        ))
    } else if t - now < EXPIRY_WARNING_DAYS * 86_400 {
        let left = match (t - now) / 86_400 {
            0 => "less than a day".to_string(),
            1 => "1 day".to_string(),
            d => format!("{d} days"),
        };
        Some(format!(
            "warning: the TLS certificate {} expires on {when} UTC, in {left}; renew it \
             (the server serves the new files once they change)",
            cert.display()
        ))
    } else {
        None
    }
}

/// A self-signed certificate for `localhost`, the loopback addresses and this
/// machine's host name; the key file is readable by its owner only.
fn make_self_signed(cert: &Path, key: &Path) -> Result<(), TlsError> {
    let mut names = vec![
        "localhost".to_string(),
        "127.0.0.1".to_string(),
        "::1".to_string(),
    ];
    if let Ok(h) = nix::unistd::gethostname()
        && let Some(h) = h.to_str()
        && !h.is_empty()
    {
        names.push(h.to_string());
    }
    let made = rcgen::generate_simple_self_signed(names)
        .map_err(|e| TlsError::Setup(format!("cannot make a certificate: {e}")))?;
    if let Some(dir) = cert.parent() {
        std::fs::create_dir_all(dir).map_err(|e| file_err(dir, e))?;
    }
    {
        use std::io::Write;
        use std::os::unix::fs::OpenOptionsExt;
        let mut f = std::fs::OpenOptions::new()
            .write(true)
            .create_new(true)
            .mode(0o600)
            .open(key)
            .map_err(|e| file_err(key, e))?;
        f.write_all(made.signing_key.serialize_pem().as_bytes())
            .map_err(|e| file_err(key, e))?;
        f.sync_all().map_err(|e| file_err(key, e))?;
    }
    std::fs::write(cert, made.cert.pem()).map_err(|e| file_err(cert, e))?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn expiry_is_warned_of_two_weeks_ahead_and_once_past() {
        let p = Path::new("/etc/cairn/cert.pem");
        let now = 1_800_000_000;
        assert_eq!(expiry_warning(p, None, now), None);
        assert_eq!(expiry_warning(p, Some(now + 15 * 86_400), now), None);
        let soon = expiry_warning(p, Some(now + 86_400 + 5), now).unwrap();
        assert!(soon.contains("in 1 day;"), "{soon}");
        let hours = expiry_warning(p, Some(now + 3600), now).unwrap();
        assert!(hours.contains("less than a day"), "{hours}");
        let past = expiry_warning(p, Some(now - 1), now).unwrap();
        assert!(
            past.contains("expired on 2027-01-15 07:59:59 UTC"),
            "{past}"
        );
    }
}
