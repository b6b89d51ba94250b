//! The small tokio runtime a network backend owns (S3, a cairn server).
//!
//! The engine is blocking, and its callers may themselves live inside a tokio
//! runtime (the server calls it through `spawn_blocking`), where
//! `Runtime::block_on` panics ("Cannot start a runtime from within a runtime").
//! Spawning onto the backend's own runtime and waiting on a channel works from any
//! thread. Dropping a runtime normally waits for its threads, which tokio forbids
//! inside another runtime's tasks, so it is shut down without waiting.

use crate::{BackendError, BackendErrorKind, Result};
use std::path::Path;
use std::time::Duration;

/// How long a request may hear nothing by default, before its attempt is given
/// up (and retried).
pub(crate) const DEFAULT_SILENCE: Duration = Duration::from_secs(120);

/// The HTTP client settings every network backend uses. Stalls are caught per read
/// and per unacknowledged write (TCP user timeout), not by a cap on a whole
/// transfer, which a slow link could never meet. The read timeout (reqwest's
/// runs from a request's start until its answer, and then per read) is the
/// caller's to set: a cairn server's uploads are watched otherwise.
pub(crate) fn http_client() -> reqwest::ClientBuilder {
    reqwest::Client::builder()
        .connect_timeout(Duration::from_secs(10))
        .tcp_user_timeout(DEFAULT_SILENCE)
        .tcp_keepalive(Duration::from_secs(30))
        .pool_max_idle_per_host(32)
}

/// Adds the PEM certificate(s) in `path` (a private CA) to the trusted roots.
pub(crate) fn trust_ca(
    mut client: reqwest::ClientBuilder,
    path: &Path,
    location: &str,
) -> Result<reqwest::ClientBuilder> {
    let pem = std::fs::read(path).map_err(|e| {
        BackendError::open_failed(
            location,
            format!("cannot read CA certificate {}: {e}", path.display()),
        )
    })?;
    let certs = reqwest::Certificate::from_pem_bundle(&pem).map_err(|e| {
        BackendError::open_failed(
            location,
            format!("invalid CA certificate {}: {e}", path.display()),
        )
    })?;
    // An empty file, or one of something else (a key, DER bytes), parses as no
    // certificate at all: said now, not as an unknown issuer at the first request.
    if certs.is_empty() {
        return Err(BackendError::open_failed(
            location,
            format!(
                "no PEM certificate in {} (a CA certificate file holds \
                 -----BEGIN CERTIFICATE----- blocks)",
                path.display()
            ),
        ));
    }
    for c in certs {
        client = client.add_root_certificate(c);
    }
    Ok(client)
}

pub(crate) struct IoRuntime {
    /// `None` only while dropping.
    rt: Option<tokio::runtime::Runtime>,
    /// Names the client in messages ("the S3 client stopped").
    what: &'static str,
}

impl IoRuntime {
    /// Two worker threads named `thread_name`.
    pub(crate) fn new(thread_name: &str, what: &'static str) -> std::io::Result<IoRuntime> {
        let rt = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(2)
            .thread_name(thread_name)
            .enable_all()
            .build()?;
        Ok(IoRuntime { rt: Some(rt), what })
    }

    /// Runs one request on the runtime and waits for it on this thread. The request
    /// is built from owned values, so it may outlive the call only as long as the
    /// runtime runs.
    pub(crate) fn run<T: Send + 'static>(
        &self,
        op: &'static str,
        name: &str,
        fut: impl std::future::Future<Output = T> + Send + 'static,
    ) -> Result<T> {
        let gone = || BackendError {
            kind: BackendErrorKind::Other,
            op,
            path: name.to_string(),
            message: format!("the {} client stopped", self.what),
        };
        let rt = self.rt.as_ref().ok_or_else(gone)?;
        let (tx, rx) = std::sync::mpsc::sync_channel(1);
        rt.spawn(async move {
            let _ = tx.send(fut.await);
        });
        rx.recv().map_err(|_| gone())
    }
}

impl IoRuntime {
    /// Runs a task in the background until it ends or is aborted (or the runtime
    /// stops).
    pub(crate) fn spawn(
        &self,
        fut: impl std::future::Future<Output = ()> + Send + 'static,
    ) -> Option<tokio::task::AbortHandle> {
        self.rt.as_ref().map(|rt| rt.spawn(fut).abort_handle())
    }
}

impl Drop for IoRuntime {
    fn drop(&mut self) {
        if let Some(rt) = self.rt.take() {
            rt.shutdown_background();
        }
    }
}

#[cfg(test)]
mod tests {
    /// A file without a PEM certificate is refused when the client is made.
    #[test]
    fn a_ca_file_without_a_certificate_is_refused() {
        let dir = std::env::temp_dir().join(format!("cairn-ca-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        for (name, body) in [
            ("empty.pem", &b""[..]),
            ("junk.pem", b"not a certificate\n"),
        ] {
            let p = dir.join(name);
            std::fs::write(&p, body).unwrap();
            let e = super::trust_ca(reqwest::Client::builder(), &p, "here").unwrap_err();
            assert!(e.message.contains("no PEM certificate"), "{e}");
        }
        let _ = std::fs::remove_dir_all(&dir);
    }
}
