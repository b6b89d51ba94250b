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
        make_self_signed_once(cert, key)?;
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
/// client, an administrator's copy) changes one of these. The inode's change
/// time too: a copy that keeps the old modification time (`cp -p`, `rsync -a`)
/// and a change of owner or mode (a hook that fixes them after the copy) change
/// it.
type Stamp = [(i64, i64, i64, i64, u64, u64); 2];

fn stamp_of(cert: &Path, key: &Path) -> Option<Stamp> {
    use std::os::unix::fs::MetadataExt;
    let one = |p: &Path| {
        std::fs::metadata(p).ok().map(|m| {
            (
                m.mtime(),
                m.mtime_nsec(),
                m.ctime(),
                m.ctime_nsec(),
                m.size(),
                m.ino(),
            )
        })
    };
    Some([one(cert)?, one(key)?])
}

/// What the watcher last saw of the files.
#[derive(Debug, Default)]
struct Look {
    stamp: Option<Stamp>,
    /// The pair of `stamp` did not load: tried again at every look (a renewal
    /// whose files become readable without changing, say), said once.
    failing: bool,
    /// The files are gone, and that was said.
    gone: bool,
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
    look: std::sync::Mutex<Look>,
}

/// What [`CertSource::reload_if_changed`] found.
pub enum Reload {
    /// The files changed and the new pair is served: its fingerprint and expiry.
    Served {
        fingerprint: String,
        not_after: Option<i64>,
    },
    /// The files changed, but the pair does not load, or its certificate has
    /// expired while the one served has not: the previous one stays.
    Refused(TlsError),
    /// The files are gone: the pair loaded stays served, but a restart would fail.
    Gone,
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
            look: std::sync::Mutex::new(Look {
                stamp,
                ..Look::default()
            }),
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

    /// Reads the files again when they changed since last looked at (or when the
    /// pair last looked at did not load); `None` when there is nothing to say: no
    /// change, the same certificate read again, or a failure already said.
    pub fn reload_if_changed(&self) -> Option<Reload> {
        self.reload_at(cairn_core::time::now_unix())
    }

    fn reload_at(&self, now: i64) -> Option<Reload> {
        let mut look = self.look.lock().unwrap_or_else(|e| e.into_inner());
        let Some(stamp) = stamp_of(&self.cert, &self.key) else {
            let first = !look.gone;
            look.gone = true;
            return first.then_some(Reload::Gone);
        };
        look.gone = false;
        let changed = look.stamp != Some(stamp);
        if !changed && !look.failing {
            return None;
        }
        look.stamp = Some(stamp);
        let (_, served_fp, served_until) = self.current.read().ok()?.clone();
        let l = match load(&self.cert, &self.key, &self.provider) {
            Ok(l) => l,
            Err(e) => {
                look.failing = true;
                return changed.then_some(Reload::Refused(e));
            }
        };
        look.failing = false;
        if l.fingerprint == served_fp {
            return None;
        }
        let expired = |t: Option<i64>| t.is_some_and(|t| t <= now);
        if expired(l.not_after) && !expired(served_until) {
            let when = l.not_after.map(day).unwrap_or_default();
            return changed.then(|| {
                Reload::Refused(file_err(
                    &self.cert,
                    format!("its certificate expired on {when} UTC, and the one served has not"),
                ))
            });
        }
        let r = Reload::Served {
            fingerprint: l.fingerprint.clone(),
            not_after: l.not_after,
        };
        if let Ok(mut c) = self.current.write() {
            *c = (l.key, l.fingerprint, l.not_after);
        }
        Some(r)
    }
}

/// A unix time as `YYYY-MM-DD HH:MM:SS` (UTC).
fn day(t: i64) -> String {
    let when = cairn_core::time::format_unix(t, 0);
    when.get(..19).unwrap_or(&when).replace('T', " ")
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
        .ok_or_else(|| {
            let encrypted = key_pem.windows(9).any(|w| w == b"ENCRYPTED");
            file_err(
                key,
                if encrypted {
                    "an encrypted private key: give the server the key unencrypted \
                     (`openssl pkey -in KEY -out PLAIN`), readable by its user only"
                } else {
                    "no private key in the file"
                },
            )
        })?;
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
    let when = day(t);
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

/// [`make_self_signed`] unless another server made the pair meanwhile: under a
/// lock beside the key, so that two servers started together on one new state
/// directory make one pair (QA r43: one of them stopped with "key.pem: File
/// exists"). A key without its certificate is what a generation cut short
/// left (the key is written first): made again.
fn make_self_signed_once(cert: &Path, key: &Path) -> Result<(), TlsError> {
    if let Some(dir) = cert.parent() {
        std::fs::create_dir_all(dir).map_err(|e| file_err(dir, e))?;
    }
    let lock_path = key.with_extension("lock");
    let file = std::fs::OpenOptions::new()
        .create(true)
        .truncate(false)
        .write(true)
        .open(&lock_path)
        .map_err(|e| file_err(&lock_path, e))?;
    let _held = nix::fcntl::Flock::lock(file, nix::fcntl::FlockArg::LockExclusive)
        .map_err(|(_, e)| file_err(&lock_path, std::io::Error::from(e)))?;
    if cert.exists() {
        return Ok(());
    }
    match std::fs::remove_file(key) {
        Ok(()) => {}
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
        Err(e) => return Err(file_err(key, e)),
    }
    make_self_signed(cert, key)
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
    // Whole or not there: a server starting meanwhile reads it once it exists.
    let part = cert.with_extension("pem.part");
    std::fs::write(&part, made.cert.pem()).map_err(|e| file_err(&part, e))?;
    std::fs::rename(&part, cert).map_err(|e| file_err(cert, e))?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A certificate and key in PEM, valid until `until` (None: rcgen's default).
    fn pair(until: Option<(i32, u8, u8)>) -> (String, String) {
        let mut params = rcgen::CertificateParams::new(vec!["localhost".to_string()]).unwrap();
        if let Some((y, m, d)) = until {
            params.not_before = rcgen::date_time_ymd(y - 1, m, d);
            params.not_after = rcgen::date_time_ymd(y, m, d);
        }
        let key = rcgen::KeyPair::generate().unwrap();
        let cert = params.self_signed(&key).unwrap();
        (cert.pem(), key.serialize_pem())
    }

    /// The watcher's answers: a renewal served, a pair that does not load said
    /// once and tried again until it does (files made readable later), an expired
    /// renewal refused, files gone said once (QA found each of these wanting).
    #[test]
    fn renewals_are_served_refused_or_retried() {
        let dir = tempfile::tempdir().unwrap();
        let (cert, key) = (dir.path().join("c.pem"), dir.path().join("k.pem"));
        let install = |(c, k): &(String, String)| {
            std::fs::write(&key, k).unwrap();
            std::fs::write(&cert, c).unwrap();
        };
        install(&pair(None));
        let provider = Arc::new(rustls::crypto::aws_lc_rs::default_provider());
        let src = CertSource::open(&cert, &key, provider).unwrap();
        let now = cairn_core::time::now_unix();
        assert!(src.reload_at(now).is_none(), "nothing changed");
        // Half installed: refused once, tried again quietly, served once whole.
        let next = pair(None);
        std::fs::write(&cert, &next.0).unwrap();
        assert!(matches!(src.reload_at(now), Some(Reload::Refused(_))));
        assert!(src.reload_at(now).is_none(), "said once");
        std::fs::write(&key, &next.1).unwrap();
        let before = src.fingerprint();
        assert!(matches!(src.reload_at(now), Some(Reload::Served { .. })));
        assert_ne!(src.fingerprint(), before);
        // The same pair read again: nothing to say.
        std::fs::write(&cert, &next.0).unwrap();
        assert!(src.reload_at(now).is_none());
        // An expired renewal does not replace a certificate still valid.
        let served = src.fingerprint();
        install(&pair(Some((2020, 1, 1))));
        match src.reload_at(now) {
            Some(Reload::Refused(e)) => assert!(e.to_string().contains("expired on 2020-01-01")),
            _ => panic!("an expired renewal was not refused"),
        }
        assert_eq!(src.fingerprint(), served);
        // Files gone: said once, the pair loaded stays served.
        std::fs::remove_file(&cert).unwrap();
        assert!(matches!(src.reload_at(now), Some(Reload::Gone)));
        assert!(src.reload_at(now).is_none());
        assert_eq!(src.fingerprint(), served);
    }

    /// Servers started together on one new state directory make one pair
    /// (QA r43: one stopped with "key.pem: File exists"), and a key left
    /// without its certificate by a generation cut short is made again.
    #[test]
    fn servers_started_together_make_one_self_signed_pair() {
        let dir = tempfile::tempdir().unwrap();
        let (cert, key) = (
            dir.path().join("tls/cert.pem"),
            dir.path().join("tls/key.pem"),
        );
        let made: Vec<String> = std::thread::scope(|s| {
            let all: Vec<_> = (0..4)
                .map(|_| s.spawn(|| server_config(&cert, &key, true).map(|(_, fp, _)| fp)))
                .collect();
            all.into_iter()
                .map(|t| t.join().unwrap().unwrap())
                .collect()
        });
        assert!(made.iter().all(|f| *f == made[0]), "{made:?}");
        std::fs::remove_file(&cert).unwrap();
        let (_, again, _) = server_config(&cert, &key, true).unwrap();
        assert_ne!(again, made[0], "a new pair");
    }

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
