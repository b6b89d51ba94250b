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
/// the rustls configuration and the leaf certificate's fingerprint.
pub fn server_config(
    cert: &Path,
    key: &Path,
    self_signed: bool,
) -> Result<(Arc<rustls::ServerConfig>, String), TlsError> {
    if self_signed && !cert.exists() {
        make_self_signed(cert, key)?;
    }
    let cert_pem = std::fs::read(cert).map_err(|e| file_err(cert, e))?;
    let key_pem = std::fs::read(key).map_err(|e| file_err(key, e))?;
    let certs: Vec<rustls::pki_types::CertificateDer<'static>> =
        rustls_pemfile::certs(&mut cert_pem.as_slice())
            .collect::<Result<_, _>>()
            .map_err(|e| file_err(cert, format!("not a PEM certificate: {e}")))?;
    let Some(leaf) = certs.first() else {
        return Err(file_err(cert, "no certificate in the file"));
    };
    let fp = fingerprint(leaf.as_ref());
    let key_der = rustls_pemfile::private_key(&mut key_pem.as_slice())
        .map_err(|e| file_err(key, format!("not a PEM private key: {e}")))?
        .ok_or_else(|| file_err(key, "no private key in the file"))?;
    let provider = Arc::new(rustls::crypto::aws_lc_rs::default_provider());
    let mut config = rustls::ServerConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .map_err(|e| TlsError::Setup(e.to_string()))?
        .with_no_client_auth()
        .with_single_cert(certs, key_der)
        .map_err(|e| TlsError::Setup(format!("certificate and key do not fit: {e}")))?;
    config.alpn_protocols = vec![b"h2".to_vec(), b"http/1.1".to_vec()];
    Ok((Arc::new(config), fp))
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
