//! A repository behind `cairn serve`: `cairn+https://HOST:PORT/DATASTORE`.
//!
//! Every [`Backend`] call is one HTTPS request with the client's bearer token; the
//! server decides, by the token's role, what it may do. Like [`crate::S3Backend`],
//! requests run on this backend's own small tokio runtime and are awaited over a
//! channel, so the blocking engine may call it from any thread, including
//! `spawn_blocking` threads of a server.
//!
//! TLS: the system's roots, plus `ca_cert`, or a pinned certificate: with
//! `fingerprint` (the SHA-256 the server printed), exactly that certificate is
//! accepted, whatever signed it (a self-signed server certificate).

use crate::io::IoRuntime;
use crate::{Backend, BackendError, BackendErrorKind, JobSlot, ObjectInfo, Result};
use std::path::PathBuf;
use std::sync::Arc;

/// How to reach and authenticate to a server.
#[derive(Clone, Debug, Default)]
pub struct ServerOptions {
    /// The bearer token (`CAIRN_TOKEN`, `--token-file`).
    pub token: Option<String>,
    /// SHA-256 of the server's certificate, hex (colons and case ignored).
    pub fingerprint: Option<String>,
    /// Extra PEM certificate(s) to trust.
    pub ca_cert: Option<PathBuf>,
    /// Accept any certificate (`--insecure-tls`, testing only): the token then goes
    /// to whoever answers.
    pub insecure_tls: bool,
    /// How long a request may go without a byte before the attempt is given up
    /// (and retried); default two minutes. `--retry-for` shortens it, to no less
    /// than [`SERVER_SILENCE_MIN`] for a client that may ask for a job slot (the
    /// caller's to keep: a mount, which never asks, waits less).
    pub silence: Option<std::time::Duration>,
}

/// The shortest silence a server request is allowed: the server holds a slot
/// request up to 20 s before it answers.
pub const SERVER_SILENCE_MIN: std::time::Duration = std::time::Duration::from_secs(30);

/// A datastore name: it is part of the server's URLs, so letters, digits, `-`,
/// `_` and `.` (not first), at most 64. The server and its clients both check it.
pub fn valid_datastore_name(name: &str) -> bool {
    !name.is_empty()
        && name.len() <= 64
        && !name.starts_with('.')
        && name
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b"-_.".contains(&b))
}

/// `cairn+https://host:port/datastore` split up.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ServerLocation {
    /// `https://host:port` (or `http://` on loopback).
    pub base: String,
    pub datastore: String,
}

impl ServerLocation {
    pub fn parse(location: &str) -> std::result::Result<ServerLocation, String> {
        let (scheme, rest) = if let Some(r) = location.strip_prefix("cairn+https://") {
            ("https", r)
        } else if let Some(r) = location.strip_prefix("cairn+http://") {
            ("http", r)
        } else {
            return Err(format!(
                "{location:?}: a server location is cairn+https://HOST:PORT/DATASTORE"
            ));
        };
        let (host, ds) = rest.split_once('/').ok_or_else(|| {
            format!("{location:?}: the datastore is missing (cairn+https://HOST:PORT/DATASTORE)")
        })?;
        let ds = ds.trim_end_matches('/');
        if host.is_empty() || ds.is_empty() || ds.contains('/') {
            return Err(format!(
                "{location:?}: expected cairn+https://HOST:PORT/DATASTORE"
            ));
        }
        // Checked here, by the server's own rule: a name with `?`, `#` or `%` in it
        // went into the URL as something else, and the server's answer ("no such
        // call") said nothing of the name (QA r19).
        if !valid_datastore_name(ds) {
            return Err(format!(
                "{location:?}: {ds:?} cannot be a datastore's name (letters, digits, '-', \
                 '_' and '.', not first; at most 64)"
            ));
        }
        if scheme == "http" {
            let hostname = host.rsplit_once(':').map(|h| h.0).unwrap_or(host);
            let hostname = hostname.trim_start_matches('[').trim_end_matches(']');
            let loopback = hostname == "localhost"
                || hostname
                    .parse::<std::net::IpAddr>()
                    .is_ok_and(|ip| ip.is_loopback());
            if !loopback {
                return Err(format!(
                    "{location:?}: plain HTTP only to a loopback address (tokens and data \
                     would cross the network in the clear); use cairn+https://"
                ));
            }
        }
        let base = format!("{scheme}://{host}");
        // A port that is not one (`:notaport`, `:99999`) is the user's typo, not
        // a network fault to retry for a minute (QA).
        match reqwest::Url::parse(&base) {
            Ok(u)
                if u.host_str().is_some_and(|h| !h.is_empty())
                    && u.path() == "/"
                    && u.query().is_none()
                    && u.fragment().is_none()
                    && u.username().is_empty()
                    && u.password().is_none() => {}
            Ok(_) => {
                return Err(format!(
                    "{location:?}: expected cairn+https://HOST:PORT/DATASTORE"
                ));
            }
            Err(e) => {
                return Err(format!(
                    "{location:?}: {e} (cairn+https://HOST:PORT/DATASTORE)"
                ));
            }
        }
        Ok(ServerLocation {
            base,
            datastore: ds.to_string(),
        })
    }
}

pub struct ServerBackend {
    client: reqwest::Client,
    /// For uploads: no read timeout ([`Uploading`] watches them).
    upload_client: reqwest::Client,
    /// How long a request may hear nothing (`--retry-for` and the defaults).
    silence: std::time::Duration,
    io: IoRuntime,
    loc: ServerLocation,
    token: String,
    location: String,
    /// Names this client's claims on chunks it is sending and its job slot (random
    /// per process).
    session: String,
    /// While this client holds a job slot: the task that keeps it alive.
    heartbeat: std::sync::Mutex<Option<tokio::task::AbortHandle>>,
    /// This client asked for a job slot: the server holds it, or a place in line.
    asked_for_slot: std::sync::atomic::AtomicBool,
    /// The job's progress, sent with each heartbeat.
    report: Arc<std::sync::Mutex<Option<crate::JobReport>>>,
    uploads: Arc<crate::bufpool::BufferPool>,
    /// This machine's clock less the server's, in seconds, from the `Date` of the
    /// first answer that had one.
    skew: std::sync::OnceLock<i64>,
    /// The CA file trusted besides the system's (`--cacert`), for the message
    /// when the server's certificate is signed by neither.
    ca_cert: Option<PathBuf>,
}

/// An upload's body, handed to the connection a frame at a time: each frame
/// asked for means the one before was taken (written, or queued within the
/// peer's window), which [`Taken`] notes. A link that is slow but moving keeps
/// an upload going however long it takes; one that takes nothing for the
/// silence allowed, or a server that then does not answer, ends it.
struct Uploading {
    data: bytes::Bytes,
    taken: Arc<Taken>,
}

/// When the connection last took a frame of an upload (or the upload began),
/// and when it was handed the last.
pub(crate) struct Taken {
    start: std::time::Instant,
    /// Milliseconds from `start`.
    at_ms: std::sync::atomic::AtomicU64,
    /// Bytes of the body in all.
    len: u64,
    /// When the last frame was handed over, in milliseconds from `start` plus
    /// one (0: not yet).
    ended_ms: std::sync::atomic::AtomicU64,
}

/// What may sit between an upload's last frame handed over and the server's
/// reading it (HTTP/1.1: the connection's write buffer, the kernel's socket
/// buffers at both ends): it drains at the rate the upload went, before the
/// server can answer.
const UPLOAD_QUEUE_BOUND: u64 = 8 << 20;

/// A frame handed over; dropped once the connection has written it.
struct SentFrame {
    data: bytes::Bytes,
    taken: Arc<Taken>,
}

impl AsRef<[u8]> for SentFrame {
    fn as_ref(&self) -> &[u8] {
        &self.data
    }
}

impl Drop for SentFrame {
    fn drop(&mut self) {
        self.taken.note();
    }
}

/// What an upload hands over at a time.
const UPLOAD_FRAME: usize = 64 << 10;

impl Uploading {
    fn new(data: bytes::Bytes) -> Uploading {
        Uploading {
            taken: Arc::new(Taken {
                start: std::time::Instant::now(),
                at_ms: std::sync::atomic::AtomicU64::new(0),
                len: data.len() as u64,
                ended_ms: std::sync::atomic::AtomicU64::new(0),
            }),
            data,
        }
    }
}

impl Taken {
    fn note(&self) {
        let ms = self.start.elapsed().as_millis() as u64;
        self.at_ms.store(ms, std::sync::atomic::Ordering::Relaxed);
    }

    /// Resolves once nothing was taken for `silence` (looked at every eighth of
    /// it, at most every 15 s). Once the last frame is handed over, what is
    /// still queued behind it drains at the rate the upload went before the
    /// server can answer: that much more is allowed (review r39: at a few
    /// KiB/s an upload was given up at its end, again and again).
    async fn silent_for(&self, silence: std::time::Duration) {
        use std::sync::atomic::Ordering::Relaxed;
        let every = (silence / 8).clamp(
            std::time::Duration::from_millis(100),
            std::time::Duration::from_secs(15),
        );
        loop {
            tokio::time::sleep(every).await;
            let last = self.at_ms.load(Relaxed);
            let now = self.start.elapsed().as_millis() as u64;
            let ended = self.ended_ms.load(Relaxed);
            // The time the queue takes at the upload's rate: the time so far
            // for the bound's share of the body.
            let drain = match ended {
                0 => 0,
                e => (e - 1).saturating_mul(UPLOAD_QUEUE_BOUND.min(self.len)) / self.len.max(1),
            };
            if now.saturating_sub(last) >= (silence.as_millis() as u64).saturating_add(drain) {
                return;
            }
        }
    }
}

impl http_body::Body for Uploading {
    type Data = bytes::Bytes;
    type Error = std::convert::Infallible;

    fn poll_frame(
        mut self: std::pin::Pin<&mut Self>,
        _: &mut std::task::Context<'_>,
    ) -> std::task::Poll<Option<std::result::Result<http_body::Frame<bytes::Bytes>, Self::Error>>>
    {
        self.taken.note();
        if self.data.is_empty() {
            return std::task::Poll::Ready(None);
        }
        let n = self.data.len().min(UPLOAD_FRAME);
        let data = self.data.split_to(n);
        if self.data.is_empty() {
            let t = &self.taken;
            let ms = t.start.elapsed().as_millis() as u64 + 1;
            t.ended_ms.store(ms, std::sync::atomic::Ordering::Relaxed);
        }
        // Noted again when the connection has written it.
        let frame = bytes::Bytes::from_owner(SentFrame {
            data,
            taken: self.taken.clone(),
        });
        std::task::Poll::Ready(Some(Ok(http_body::Frame::data(frame))))
    }

    fn is_end_stream(&self) -> bool {
        self.data.is_empty()
    }

    fn size_hint(&self) -> http_body::SizeHint {
        http_body::SizeHint::with_exact(self.data.len() as u64)
    }
}

/// Seconds between heartbeats at most, each with the job's progress.
const REPORT_EVERY_SECS: u64 = 5;

/// Request bodies (a copy of each pack) are kept for reuse ([`crate::bufpool`]): at
/// most one per upload in flight, none over 64 MiB.
const UPLOAD_KEEP_MAX: usize = 64 << 20;
const UPLOAD_KEEP_COUNT: usize = 4;

/// How long one request for a job slot waits on the server before it answers
/// "queued" (short enough that an interrupted client stops promptly).
const SLOT_WAIT_SECS: u64 = 5;

/// Ids per dedup request (the server's limit is higher).
const DEDUP_BATCH: usize = 16384;

impl Drop for ServerBackend {
    fn drop(&mut self) {
        // The next job need not wait for the server to notice this one is gone.
        self.release_job_slot();
    }
}

impl std::fmt::Debug for ServerBackend {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ServerBackend")
            .field("location", &self.location)
            .finish()
    }
}

/// Accepts exactly the certificate with this SHA-256; signatures are still
/// checked with the provider's algorithms, so the peer must hold its key.
#[derive(Debug)]
struct Pinned {
    sha256: Vec<u8>,
    provider: Arc<rustls::crypto::CryptoProvider>,
}

impl rustls::client::danger::ServerCertVerifier for Pinned {
    fn verify_server_cert(
        &self,
        end_entity: &rustls::pki_types::CertificateDer<'_>,
        _intermediates: &[rustls::pki_types::CertificateDer<'_>],
        _server_name: &rustls::pki_types::ServerName<'_>,
        _ocsp: &[u8],
        _now: rustls::pki_types::UnixTime,
    ) -> std::result::Result<rustls::client::danger::ServerCertVerified, rustls::Error> {
        let got = ring::digest::digest(&ring::digest::SHA256, end_entity.as_ref());
        if got.as_ref() == self.sha256.as_slice() {
            Ok(rustls::client::danger::ServerCertVerified::assertion())
        } else {
            Err(rustls::Error::General(format!(
                "the server's certificate has fingerprint {}, not the pinned one: \
                 a different server, or a man in the middle",
                hex_lower(got.as_ref())
            )))
        }
    }
    fn verify_tls12_signature(
        &self,
        message: &[u8],
        cert: &rustls::pki_types::CertificateDer<'_>,
        dss: &rustls::DigitallySignedStruct,
    ) -> std::result::Result<rustls::client::danger::HandshakeSignatureValid, rustls::Error> {
        rustls::crypto::verify_tls12_signature(
            message,
            cert,
            dss,
            &self.provider.signature_verification_algorithms,
        )
    }
    fn verify_tls13_signature(
        &self,
        message: &[u8],
        cert: &rustls::pki_types::CertificateDer<'_>,
        dss: &rustls::DigitallySignedStruct,
    ) -> std::result::Result<rustls::client::danger::HandshakeSignatureValid, rustls::Error> {
        rustls::crypto::verify_tls13_signature(
            message,
            cert,
            dss,
            &self.provider.signature_verification_algorithms,
        )
    }
    fn supported_verify_schemes(&self) -> Vec<rustls::SignatureScheme> {
        self.provider
            .signature_verification_algorithms
            .supported_schemes()
    }
}

/// Percent-encodes everything but unreserved characters and `/` (object names and
/// prefixes are ASCII paths; anything else is escaped rather than trusted).
fn query_escape(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    for b in s.bytes() {
        if b.is_ascii_alphanumeric() || b"-_.~/".contains(&b) {
            out.push(b as char);
        } else {
            out.push_str(&format!("%{b:02X}"));
        }
    }
    out
}

fn hex_lower(b: &[u8]) -> String {
    b.iter().map(|x| format!("{x:02x}")).collect()
}

/// `AB:CD:…` or `abcd…` into 32 bytes.
pub fn parse_fingerprint(s: &str) -> std::result::Result<Vec<u8>, String> {
    let clean: String = s.chars().filter(|c| *c != ':').collect();
    if clean.len() != 64 || !clean.bytes().all(|b| b.is_ascii_hexdigit()) {
        return Err(format!(
            "{s:?} is not a SHA-256 fingerprint (64 hex digits, colons allowed)"
        ));
    }
    Ok((0..32)
        .map(|i| u8::from_str_radix(&clean[2 * i..2 * i + 2], 16).unwrap_or(0))
        .collect())
}

/// The error a server sent: `{"error": kind, "message": text}`.
#[derive(serde::Deserialize)]
struct ErrorBody {
    error: String,
    message: String,
}

impl ServerBackend {
    pub fn open(location: &str, opts: &ServerOptions) -> Result<ServerBackend> {
        let loc =
            ServerLocation::parse(location).map_err(|m| BackendError::open_failed(location, m))?;
        let token = opts
            .token
            .clone()
            .filter(|t| !t.trim().is_empty())
            .ok_or_else(|| {
                BackendError::open_failed(
                    location,
                    "no token: set CAIRN_TOKEN or give --token-file (ask the server's admin for \
                 one: cairn serve token add)"
                        .into(),
                )
            })?;
        // Two clients: uploads get no read timeout (it runs from a request's
        // start to its answer, so it cut every upload longer than the silence
        // allowed, a 16 MiB pack over a link of 1 Mbit/s: QA r38); their
        // silence is watched by what the connection takes of the body instead
        // ([`Uploading`]).
        let client = Self::http(location, opts, true)?;
        let upload_client = Self::http(location, opts, false)?;
        let io = IoRuntime::new("cairn-client", "cairn server").map_err(|e| {
            BackendError::open_failed(location, format!("cannot start I/O threads: {e}"))
        })?;
        Ok(ServerBackend {
            client,
            upload_client,
            silence: opts.silence.unwrap_or(crate::io::DEFAULT_SILENCE),
            io,
            loc,
            token: token.trim().to_string(),
            location: location.to_string(),
            ca_cert: (opts.fingerprint.is_none() && !opts.insecure_tls)
                .then(|| opts.ca_cert.clone())
                .flatten(),
            session: {
                let mut b = [0u8; 16];
                ring::rand::SecureRandom::fill(&ring::rand::SystemRandom::new(), &mut b)
                    .map_err(|_| BackendError::open_failed(location, "no randomness".into()))?;
                hex_lower(&b)
            },
            heartbeat: std::sync::Mutex::new(None),
            asked_for_slot: Default::default(),
            report: Default::default(),
            uploads: crate::bufpool::BufferPool::new(UPLOAD_KEEP_MAX, UPLOAD_KEEP_COUNT),
            skew: std::sync::OnceLock::new(),
        })
    }

    /// The HTTP client for `opts`; `read_timeout`: requests that hear nothing
    /// for the silence allowed (from their start) fail.
    fn http(location: &str, opts: &ServerOptions, read_timeout: bool) -> Result<reqwest::Client> {
        let silence = opts.silence.unwrap_or(crate::io::DEFAULT_SILENCE);
        // No redirect followed ([`refused`] says where it came from).
        let mut client = crate::io::http_client()
            .tcp_user_timeout(silence)
            .redirect(reqwest::redirect::Policy::none());
        if read_timeout {
            client = client.read_timeout(silence);
        }
        if let Some(fp) = &opts.fingerprint {
            let sha256 =
                parse_fingerprint(fp).map_err(|m| BackendError::open_failed(location, m))?;
            let provider = Arc::new(rustls::crypto::aws_lc_rs::default_provider());
            let config = rustls::ClientConfig::builder_with_provider(provider.clone())
                .with_safe_default_protocol_versions()
                .map_err(|e| BackendError::open_failed(location, format!("TLS: {e}")))?
                .dangerous()
                .with_custom_certificate_verifier(Arc::new(Pinned { sha256, provider }))
                .with_no_client_auth();
            client = client.tls_backend_preconfigured(config);
        } else if opts.insecure_tls {
            client = client.tls_danger_accept_invalid_certs(true);
        } else if let Some(path) = &opts.ca_cert {
            client = crate::io::trust_ca(client, path, location)?;
        }
        client
            .build()
            .map_err(|e| BackendError::open_failed(location, format!("cannot set up HTTP: {e}")))
    }

    fn slots_url(&self) -> String {
        format!(
            "{}/v1/datastores/{}/slots",
            self.loc.base, self.loc.datastore
        )
    }

    /// Asks for the job slot until it is granted (for a write refused with
    /// `no_job_slot`: a client that did not ask first, or lost its slot).
    fn wait_for_slot(&self) -> Result<()> {
        let host = crate::process::hostname();
        while let JobSlot::Queued { .. } = self.job_slot("write", &host)? {}
        Ok(())
    }

    fn url(&self, name: &str) -> String {
        format!(
            "{}/v1/datastores/{}/objects/{}",
            self.loc.base,
            self.loc.datastore,
            query_escape(name)
        )
    }

    /// Sends a request on the backend's runtime and waits for status and body, a
    /// body of at most `max` bytes (a server is not trusted to keep to what was
    /// asked: audit r33, an endless answer took a client's memory).
    fn send(
        &self,
        op: &'static str,
        name: &str,
        req: reqwest::RequestBuilder,
        max: u64,
    ) -> Result<(reqwest::StatusCode, Vec<u8>)> {
        self.send_telling(op, name, req, max).map_err(|(e, _)| e)
    }

    /// [`ServerBackend::send`], with the server's name for an error
    /// (`no_job_slot`, ...) beside it.
    fn send_telling(
        &self,
        op: &'static str,
        name: &str,
        req: reqwest::RequestBuilder,
        max: u64,
    ) -> std::result::Result<(reqwest::StatusCode, Vec<u8>), (BackendError, String)> {
        self.send_watched(op, name, req, max, None)
    }

    /// [`ServerBackend::send_telling`]; with `taken` (an upload's [`Uploading`]
    /// clock), given up once the connection took none of the body, or the
    /// server said nothing after the last of it, for the silence allowed.
    fn send_watched(
        &self,
        op: &'static str,
        name: &str,
        req: reqwest::RequestBuilder,
        max: u64,
        taken: Option<Arc<Taken>>,
    ) -> std::result::Result<(reqwest::StatusCode, Vec<u8>), (BackendError, String)> {
        // Every request names the session: the server takes a client it has not
        // heard from for a while for gone, and releases the chunks it was sending.
        let req = self.signed(req);
        // The server's time is read until one answer gave it.
        let want_date = self.skew.get().is_none();
        let watch = taken.map(|t| (t, self.silence));
        let r = self
            .io
            .run(op, name, async move {
                let sent = req.send();
                let mut resp = match &watch {
                    None => sent.await?,
                    Some((taken, silence)) => tokio::select! {
                        r = sent => r?,
                        () = taken.silent_for(*silence) => return Ok(Err(*silence)),
                    },
                };
                let status = resp.status();
                let date = want_date
                    .then(|| resp.headers().get(reqwest::header::DATE))
                    .flatten()
                    .and_then(|d| d.to_str().ok())
                    .and_then(|d| httpdate::parse_http_date(d).ok());
                // An error's body is read as far as its first bytes (its message).
                let cap = if status.is_success() {
                    max
                } else {
                    ERROR_BODY_MAX
                };
                // The answer's body, watched too: the upload's client has no read
                // timeout (review r39: a server that sent its head and then
                // nothing held the backup for ever).
                let (body, over) = match &watch {
                    None => read_capped(&mut resp, cap).await?,
                    Some((taken, silence)) => {
                        taken.note();
                        tokio::select! {
                            r = read_capped(&mut resp, cap) => r?,
                            () = taken.silent_for(*silence) => return Ok(Err(*silence)),
                        }
                    }
                };
                Ok::<_, reqwest::Error>(Ok((status, body, date, over)))
            })
            .map_err(|e| (e, String::new()))?;
        let (status, body, date, over) = r
            .map_err(|e| (self.failed(op, name, &e), String::new()))?
            .map_err(|silence| {
                (
                    BackendError {
                        kind: BackendErrorKind::Transient,
                        op,
                        path: name.to_string(),
                        message: format!(
                            "the upload made no progress, or the server did not answer it, \
                             for {} s",
                            silence.as_secs()
                        ),
                    },
                    String::new(),
                )
            })?;
        if over && status.is_success() {
            return Err((
                BackendError {
                    kind: BackendErrorKind::Other,
                    op,
                    path: name.to_string(),
                    message: format!(
                        "the server's answer is longer than the {max} bytes it may be (a \
                         broken or hostile server)"
                    ),
                },
                String::new(),
            ));
        }
        if let Some(server) = date
            && self.skew.get().is_none()
        {
            let secs = |t: std::time::SystemTime| {
                t.duration_since(std::time::UNIX_EPOCH)
                    .map_or(0, |d| d.as_secs() as i64)
            };
            let _ = self
                .skew
                .set(secs(std::time::SystemTime::now()) - secs(server));
        }
        if status.is_success() {
            return Ok((status, body));
        }
        Err(refused(op, name, status, &body))
    }

    /// `req` with this client's token and session.
    fn signed(&self, req: reqwest::RequestBuilder) -> reqwest::RequestBuilder {
        req.bearer_auth(&self.token)
            .header("x-cairn-session", &self.session)
    }

    /// A request that got no answer (or a broken one).
    fn failed(&self, op: &'static str, name: &str, e: &reqwest::Error) -> BackendError {
        BackendError {
            // A server that cannot be reached may come back (retried); one whose
            // certificate is refused will not.
            kind: if is_tls_refusal(e) {
                BackendErrorKind::PermissionDenied
            } else if scheme_mismatch(&describe(e)).is_some() {
                // Another try gets the same answer.
                BackendErrorKind::Other
            } else if crate::s3::is_unreachable(&describe(e)) {
                BackendErrorKind::Unreachable
            } else {
                BackendErrorKind::Transient
            },
            op,
            path: name.to_string(),
            message: {
                let mut m = describe(e);
                if let Some(hint) = scheme_mismatch(&m) {
                    m.push_str(hint);
                }
                // (BadSignature: a CA of the same name, another key.)
                if (m.contains("UnknownIssuer") || m.contains("BadSignature"))
                    && let Some(ca) = &self.ca_cert
                {
                    // QA: a wrong --cacert was told to pass --cacert.
                    m.push_str(&format!(
                        " (the server's certificate is signed neither by the CA in {} \
                         (--cacert) nor by one this machine trusts: give the certificate of \
                         the CA that signed it, or, for the self-signed one `cairn serve` \
                         made, the fingerprint it printed with --server-fingerprint)",
                        ca.display()
                    ));
                } else if m.contains("UnknownIssuer") {
                    m.push_str(
                        " (a certificate no CA this machine trusts signed: for the \
                         self-signed one `cairn serve` made, pass the fingerprint it printed \
                         with --server-fingerprint; for one your own CA signed, pass that \
                         CA's certificate with --cacert)",
                    );
                }
                m
            },
        }
    }

    fn dedup_url(&self, what: &str) -> String {
        format!(
            "{}/v1/datastores/{}/dedup{what}",
            self.loc.base, self.loc.datastore
        )
    }

    /// Posts ids (32 bytes each) to a dedup endpoint.
    fn dedup_post(&self, what: &'static str, ids: &[[u8; 32]]) -> Result<Vec<u8>> {
        let req = self.client.post(self.dedup_url(what)).body(ids.concat());
        // An answer is a byte or an id per id asked.
        let max = (ids.len() as u64).saturating_mul(32);
        self.send("dedup", what, req, max).map(|r| r.1)
    }
}

/// The longest answers a server may give, by what was asked (longer ones are
/// refused unread): small JSON (whoami, a stored object's receipt, a slot), an
/// error's message, a listing (about 100 bytes an object: 10 million objects), a
/// dedup plan (index file names, missing packs), and any object (the largest
/// pack is 1 GiB).
const SMALL_ANSWER_MAX: u64 = 1 << 20;
const ERROR_BODY_MAX: u64 = 64 << 10;
const LISTING_MAX: u64 = 1 << 30;
const PLAN_MAX: u64 = 256 << 20;
const OBJECT_MAX: u64 = (1 << 30) + (1 << 20);

/// An answer's body, `cap` bytes of it at most, and whether it was longer.
async fn read_capped(
    resp: &mut reqwest::Response,
    cap: u64,
) -> std::result::Result<(Vec<u8>, bool), reqwest::Error> {
    let cap = usize::try_from(cap).unwrap_or(usize::MAX);
    let mut body: Vec<u8> = Vec::new();
    if resp.content_length().is_some_and(|n| n > cap as u64) {
        return Ok((body, true));
    }
    while let Some(piece) = resp.chunk().await? {
        let room = cap - body.len();
        if piece.len() > room {
            body.extend_from_slice(&piece[..room]);
            return Ok((body, true));
        }
        if body.is_empty() {
            // Without a copy when the body arrives in one piece.
            body = Vec::from(piece);
        } else {
            body.extend_from_slice(&piece);
        }
    }
    Ok((body, false))
}

/// The last byte of a range of `length` (> 0) bytes at `offset`, as a `Range`
/// header names it.
fn range_last(name: &str, offset: u64, length: u64) -> Result<u64> {
    offset.checked_add(length - 1).ok_or_else(|| BackendError {
        kind: BackendErrorKind::OutOfRange,
        op: "get",
        path: name.to_string(),
        message: format!("range {offset}+{length} is past any object's end"),
    })
}

/// A range answered with `sent` bytes (a count, or "more") instead of `length`.
fn wrong_length(name: &str, sent: impl std::fmt::Display, length: u64) -> BackendError {
    BackendError {
        kind: BackendErrorKind::Other,
        op: "get",
        path: name.to_string(),
        message: format!("the server sent {sent} bytes for a range of {length}"),
    }
}

/// The error a server's refusal (`status`, with its JSON error body) means, with the
/// server's name for it (`no_job_slot`, ...).
fn refused(
    op: &'static str,
    name: &str,
    status: reqwest::StatusCode,
    body: &[u8],
) -> (BackendError, String) {
    let (kind_name, message) = match serde_json::from_slice::<ErrorBody>(body) {
        Ok(b) => (b.error, b.message),
        // Redirects are not followed, by any request alike (an upload's body
        // cannot be sent twice: review r39), and said as such.
        Err(_) if status.is_redirection() => (
            String::new(),
            format!(
                "HTTP {status}: the server, or a proxy in front of it, sends this client \
                 elsewhere; give the address it sends to (the cairn server's own) in --repo"
            ),
        ),
        Err(_) => (
            String::new(),
            format!(
                "HTTP {status}, not in cairn's words (is a cairn server at this address, or a \
                 proxy in front of it?){}",
                match foreign_summary(body) {
                    Some(s) => format!(": {s:?}"),
                    None => String::new(),
                }
            ),
        ),
    };
    let kind = match (status.as_u16(), kind_name.as_str()) {
        (404, "not_found") => BackendErrorKind::NotFound,
        (404, "no_datastore" | "no_repository") => BackendErrorKind::NoRepository,
        (500, "not_an_object") => BackendErrorKind::NotAFile,
        (409, _) => BackendErrorKind::AlreadyExists,
        (413, _) => BackendErrorKind::TooLarge,
        (416, _) => BackendErrorKind::OutOfRange,
        (507, _) => BackendErrorKind::NoSpace,
        (401 | 403, _) => BackendErrorKind::PermissionDenied,
        (408 | 429 | 502 | 503 | 504, _) => BackendErrorKind::Transient,
        _ => BackendErrorKind::Other,
    };
    (
        BackendError {
            kind,
            op,
            path: name.to_string(),
            message: format!("server: {message}"),
        },
        kind_name,
    )
}

/// One short line of an answer that is not a cairn server's (a web server's
/// page, a proxy's error): its HTML title, else its first line that holds text,
/// cut to 100 characters (QA: a whole HTML page was printed as the error).
fn foreign_summary(body: &[u8]) -> Option<String> {
    let text = String::from_utf8_lossy(&body[..body.len().min(4096)]);
    let lower = text.to_ascii_lowercase();
    let title = lower.find("<title>").and_then(|start| {
        let from = start + "<title>".len();
        lower[from..]
            .find("</title>")
            .map(|len| text[from..from + len].to_string())
    });
    let line = title.or_else(|| {
        text.lines()
            .map(str::trim)
            .find(|l| !l.is_empty())
            .map(str::to_string)
    })?;
    let line: String = line
        .chars()
        .map(|c| if c.is_control() { ' ' } else { c })
        .collect::<String>()
        .split_whitespace()
        .collect::<Vec<_>>()
        .join(" ")
        .chars()
        .take(100)
        .collect();
    (!line.is_empty()).then_some(line)
}

/// What `/v1/whoami` says of this client's token.
#[derive(serde::Deserialize)]
struct WhoAmI {
    role: String,
    #[serde(default)]
    host: Option<String>,
    /// From servers that say it; one that does not shows a host-bound token,
    /// whatever its role, only its host's snapshots.
    #[serde(default)]
    sees_every_snapshot: Option<bool>,
}

impl ServerBackend {
    fn whoami(&self) -> Result<WhoAmI> {
        let req = self.client.get(format!("{}/v1/whoami", self.loc.base));
        let (_, body) = self.send("whoami", "", req, SMALL_ANSWER_MAX)?;
        serde_json::from_slice(&body).map_err(|e| BackendError {
            kind: BackendErrorKind::Other,
            op: "whoami",
            path: String::new(),
            message: format!("the server's answer is not the expected JSON: {e}"),
        })
    }

    fn put_mode(&self, name: &str, data: &[u8], mode: &str) -> Result<()> {
        self.put_body(name, mode, || {
            bytes::Bytes::from_owner(crate::bufpool::Pooled::copy_of(&self.uploads, data))
        })
    }

    /// One PUT of the body `body` makes (again, after waiting for a job slot),
    /// handed over a frame at a time and given up when the connection takes
    /// none of it, or the server says nothing after the last, for the silence
    /// allowed ([`Uploading`]).
    fn put_body(&self, name: &str, mode: &str, body: impl Fn() -> bytes::Bytes) -> Result<()> {
        let put = || {
            let uploading = Uploading::new(body());
            let taken = uploading.taken.clone();
            let req = self
                .upload_client
                .put(format!("{}?mode={mode}", self.url(name)))
                .body(reqwest::Body::wrap(uploading));
            self.send_watched("put", name, req, SMALL_ANSWER_MAX, Some(taken))
                .map(|_| ())
        };
        match put() {
            Err((_, kind)) if kind == "no_job_slot" => {
                self.wait_for_slot()?;
                put().map_err(|(e, _)| e)
            }
            r => r.map_err(|(e, _)| e),
        }
    }
}

/// Whether the request failed because the server's certificate was refused (a
/// pinned fingerprint that does not match, an untrusted issuer): retrying cannot
/// help, and the user must hear it at once.
fn is_tls_refusal(e: &reqwest::Error) -> bool {
    let mut source: Option<&(dyn std::error::Error + 'static)> = std::error::Error::source(e);
    while let Some(s) = source {
        if s.downcast_ref::<rustls::Error>().is_some() {
            return true;
        }
        if let Some(io) = s.downcast_ref::<std::io::Error>()
            && io
                .get_ref()
                .is_some_and(|inner| inner.downcast_ref::<rustls::Error>().is_some())
        {
            return true;
        }
        source = s.source();
    }
    // Connectors box their causes, which hides the type from `downcast_ref`; rustls'
    // own wording is stable enough to recognise.
    let text = describe(e);
    text.contains("invalid peer certificate") || text.contains("the pinned one")
}

/// A hint when `text` (a failed request, described) shows that the two ends speak
/// different protocols: TLS to a plain HTTP server, or plain HTTP to a TLS one.
fn scheme_mismatch(text: &str) -> Option<&'static str> {
    if text.contains("received corrupt message of type InvalidContentType")
        || text.contains("InvalidContentType")
    {
        Some(
            " (the server answered in plain HTTP: a `cairn serve --insecure-http` is \
             reached with cairn+http://)",
        )
    } else if text.contains("invalid HTTP version parsed") {
        Some(" (the server did not answer in plain HTTP: reach it with cairn+https://)")
    } else {
        None
    }
}

/// reqwest's error and its causes in one line (`connection refused`, the TLS
/// failure's reason).
fn describe(e: &reqwest::Error) -> String {
    let mut text = e.to_string();
    let mut source = std::error::Error::source(e);
    while let Some(s) = source {
        let t = s.to_string();
        // A pinned fingerprint that does not match says all there is to say,
        // without the transport's words around it (QA r29).
        if let Some(at) = t.find("the server's certificate has fingerprint") {
            return t[at..].to_string();
        }
        if !text.contains(&t) {
            text.push_str(": ");
            text.push_str(&t);
        }
        source = s.source();
    }
    text
}

impl Backend for ServerBackend {
    fn clock_skew(&self) -> Option<i64> {
        self.skew.get().copied()
    }
    fn location(&self) -> String {
        self.location.clone()
    }
    fn lock_owner_prefix(&self) -> Option<[u8; 8]> {
        // `cairn_<id>_<secret>`: the id is public; the server derives the same.
        let id = self.token.strip_prefix("cairn_")?.split('_').next()?;
        Some(crate::lock_owner_prefix(id))
    }
    fn put(&self, name: &str, data: &[u8]) -> Result<()> {
        self.put_mode(name, data, "replace")
    }
    fn put_new(&self, name: &str, data: &[u8]) -> Result<()> {
        self.put_mode(name, data, "new")
    }
    fn put_new_owned(&self, name: &str, data: crate::Bytes, _metadata: bool) -> Result<()> {
        self.put_body(name, "new", || data.clone())
    }
    fn get(&self, name: &str) -> Result<Vec<u8>> {
        let req = self.client.get(self.url(name));
        self.send("get", name, req, OBJECT_MAX).map(|r| r.1)
    }
    fn get_bounded(&self, name: &str, max: u64) -> Result<Vec<u8>> {
        let req = self.client.get(format!("{}?max={max}", self.url(name)));
        // The server says when the object is larger (`too_large`); one that sends
        // more all the same is not believed.
        self.send("get", name, req, max.min(OBJECT_MAX))
            .map(|r| r.1)
    }
    fn get_range(&self, name: &str, offset: u64, length: u64) -> Result<Vec<u8>> {
        if length == 0 && offset == 0 {
            // No way to say "0 bytes at 0" in a Range header: check it exists.
            let req = self.client.get(format!("{}?max=0", self.url(name)));
            return match self.send("get", name, req, 0) {
                Ok(_) => Ok(Vec::new()),
                Err(e) if e.kind == BackendErrorKind::TooLarge => Ok(Vec::new()),
                Err(e) => Err(e),
            };
        }
        // An empty range is `START-(START-1)`, which the server answers with nothing.
        let end = match length {
            0 => offset - 1,
            _ => range_last(name, offset, length)?,
        };
        let req = self
            .client
            .get(self.url(name))
            .header(reqwest::header::RANGE, format!("bytes={offset}-{end}"));
        let (_, body) = self.send("get", name, req, length)?;
        if body.len() as u64 != length {
            return Err(wrong_length(name, body.len(), length));
        }
        Ok(body)
    }
    fn get_range_into(
        &self,
        name: &str,
        offset: u64,
        length: u64,
        out: &mut crate::bufpool::Pooled,
    ) -> Result<()> {
        if length == 0 {
            self.get_range(name, offset, length)?;
            out.clear_for(0);
            return Ok(());
        }
        // The body goes into `out` as it arrives: no buffer of its own.
        let last = range_last(name, offset, length)?;
        let req = self.signed(
            self.client
                .get(self.url(name))
                .header(reqwest::header::RANGE, format!("bytes={offset}-{last}")),
        );
        let expected = usize::try_from(length).unwrap_or(usize::MAX);
        let mut buf = out.detach();
        let r = self.io.run("get", name, async move {
            let mut resp = req.send().await?;
            let status = resp.status();
            if !status.is_success() {
                let (body, _) = read_capped(&mut resp, ERROR_BODY_MAX).await?;
                return Ok((status, body, buf, false));
            }
            buf.clear_for(expected);
            let mut too_long = false;
            while let Some(piece) = resp.chunk().await? {
                if buf.len().saturating_add(piece.len()) > expected {
                    too_long = true; // refused below
                    break;
                }
                buf.extend_from_slice(&piece);
            }
            Ok::<_, reqwest::Error>((status, Vec::new(), buf, too_long))
        })?;
        let (status, body, buf, too_long) = r.map_err(|e| self.failed("get", name, &e))?;
        *out = buf;
        if !status.is_success() {
            return Err(refused("get", name, status, &body).0);
        }
        if too_long {
            return Err(wrong_length(name, "more", length));
        }
        if out.len() != expected {
            return Err(wrong_length(name, out.len(), length));
        }
        Ok(())
    }
    fn list(&self, prefix: &str) -> Result<Vec<ObjectInfo>> {
        #[derive(serde::Deserialize)]
        struct Entry {
            name: String,
            size: u64,
        }
        let req = self.client.get(format!(
            "{}/v1/datastores/{}/objects?prefix={}",
            self.loc.base,
            self.loc.datastore,
            query_escape(prefix)
        ));
        let (_, body) = self.send("list", prefix, req, LISTING_MAX)?;
        let entries: Vec<Entry> = serde_json::from_slice(&body).map_err(|e| BackendError {
            kind: BackendErrorKind::Other,
            op: "list",
            path: prefix.to_string(),
            message: format!("the server's listing is not valid: {e}"),
        })?;
        Ok(entries
            .into_iter()
            .map(|e| ObjectInfo {
                name: e.name,
                size: e.size,
            })
            .collect())
    }
    fn delete(&self, name: &str) -> Result<()> {
        let req = self.client.delete(self.url(name));
        self.send("delete", name, req, SMALL_ANSWER_MAX).map(|_| ())
    }
    fn may_remove(&self) -> Result<bool> {
        Ok(self.whoami()?.role == "admin")
    }
    fn bound_host(&self) -> Result<Option<String>> {
        Ok(self.whoami()?.host)
    }
    fn partial_view(&self) -> Result<Option<String>> {
        let w = self.whoami()?;
        Ok(match w.sees_every_snapshot {
            Some(true) => None,
            _ => w.host,
        })
    }
    fn dedup_plan(&self) -> Result<Option<crate::DedupPlan>> {
        #[derive(serde::Deserialize)]
        struct Reply {
            available: bool,
            #[serde(flatten)]
            plan: Option<crate::DedupPlan>,
        }
        let req = self.client.get(self.dedup_url(""));
        let body = match self.send("dedup", "plan", req, PLAN_MAX) {
            Ok((_, b)) => b,
            // A server from before dedup queries.
            Err(e) if e.is_not_found() => return Ok(None),
            Err(e) => return Err(e),
        };
        let r: Reply = serde_json::from_slice(&body).map_err(|e| BackendError {
            kind: BackendErrorKind::Other,
            op: "dedup",
            path: "plan".into(),
            message: format!("the server's dedup plan is not valid: {e}"),
        })?;
        Ok(if r.available { r.plan } else { None })
    }
    fn dedup_query(&self, ids: &[[u8; 32]]) -> Result<Vec<crate::DedupAnswer>> {
        let mut out = Vec::with_capacity(ids.len());
        for batch in ids.chunks(DEDUP_BATCH) {
            let body = self.dedup_post("/query", batch)?;
            if body.len() != batch.len() {
                return Err(bad_reply("query", "a different number of answers"));
            }
            for b in body {
                out.push(
                    crate::DedupAnswer::from_byte(b)
                        .ok_or_else(|| bad_reply("query", "an unknown answer"))?,
                );
            }
        }
        Ok(out)
    }
    fn job_slot(&self, operation: &str, host: &str) -> Result<JobSlot> {
        #[derive(serde::Deserialize)]
        struct Job {
            #[serde(default)]
            token: String,
            #[serde(default)]
            host: String,
            #[serde(default)]
            operation: String,
            #[serde(default)]
            since: i64,
        }
        #[derive(serde::Deserialize)]
        struct Reply {
            granted: bool,
            max: u32,
            heartbeat_secs: u64,
            #[serde(default)]
            running: Vec<Job>,
            #[serde(default)]
            ahead: Vec<Job>,
            #[serde(default)]
            token_running: u32,
            #[serde(default)]
            per_token: u32,
        }
        let body = serde_json::json!({"operation": operation, "host": host}).to_string();
        let ask = |wait: u64| {
            self.client
                .post(format!("{}?wait={wait}", self.slots_url()))
                .header(reqwest::header::CONTENT_TYPE, "application/json")
                .body(body.clone())
        };
        self.asked_for_slot
            .store(true, std::sync::atomic::Ordering::Relaxed);
        let reply = match self.send(
            "ask for",
            "a job slot",
            ask(SLOT_WAIT_SECS),
            SMALL_ANSWER_MAX,
        ) {
            Ok((_, b)) => b,
            // A server from before job slots: it limits nothing, and its
            // clients queue by their locks.
            Err(e) if e.is_not_found() => return Ok(JobSlot::NotKept),
            Err(e) => return Err(e),
        };
        let r: Reply =
            serde_json::from_slice(&reply).map_err(|e| bad_reply("slot", &e.to_string()))?;
        if !r.granted {
            let now = std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .map_or(0, |d| d.as_secs() as i64);
            let describe = |j: &Job| {
                let mins = (now - j.since).max(0) / 60;
                format!(
                    "{} on {} (token {}), for {mins} min",
                    j.operation, j.host, j.token
                )
            };
            return Ok(JobSlot::Queued {
                max: r.max,
                running: r.running.iter().map(describe).collect(),
                ahead: r.ahead.iter().map(describe).collect(),
                // Only when the datastore itself has room: else that is why.
                token_at_share: (r.per_token > 0
                    && r.token_running >= r.per_token
                    && (r.running.len() as u32) < r.max)
                    .then_some(r.token_running),
            });
        }
        let mut hb = self.heartbeat.lock().unwrap_or_else(|e| e.into_inner());
        if hb.is_none() {
            // Asking again is the heartbeat, carrying the job's progress; a failed
            // one is retried at the next beat, and a slot lost meanwhile is asked
            // for again at the next write. Often enough for a live view.
            let every = std::time::Duration::from_secs(
                r.heartbeat_secs.clamp(1, 3600).min(REPORT_EVERY_SECS),
            );
            let (client, url) = (self.client.clone(), format!("{}?wait=0", self.slots_url()));
            let (token, session) = (self.token.clone(), self.session.clone());
            let (operation, host) = (operation.to_string(), host.to_string());
            let report = self.report.clone();
            *hb = self.io.spawn(async move {
                loop {
                    tokio::time::sleep(every).await;
                    let mut body = serde_json::json!({"operation": operation, "host": host});
                    let r = report.lock().unwrap_or_else(|e| e.into_inner()).clone();
                    if let Some(r) = r {
                        body["progress"] = r();
                    }
                    let _ = client
                        .post(&url)
                        .bearer_auth(&token)
                        .header("x-cairn-session", &session)
                        .header(reqwest::header::CONTENT_TYPE, "application/json")
                        .body(body.to_string())
                        .send()
                        .await;
                }
            });
        }
        Ok(JobSlot::Granted)
    }
    fn report_job_progress(&self, report: crate::JobReport) {
        *self.report.lock().unwrap_or_else(|e| e.into_inner()) = Some(report);
    }
    fn release_job_slot(&self) {
        self.report.lock().unwrap_or_else(|e| e.into_inner()).take();
        let held = self
            .heartbeat
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .take();
        if let Some(task) = &held {
            task.abort();
        }
        // A slot, or a place in line that a client giving up must not keep.
        if self
            .asked_for_slot
            .swap(false, std::sync::atomic::Ordering::Relaxed)
        {
            let _ = self.send(
                "slot",
                "",
                self.client.delete(self.slots_url()),
                SMALL_ANSWER_MAX,
            );
        }
    }
    fn dedup_confirm(&self, ids: &[[u8; 32]]) -> Result<Vec<[u8; 32]>> {
        let mut missing = Vec::new();
        for batch in ids.chunks(DEDUP_BATCH) {
            let body = self.dedup_post("/confirm", batch)?;
            if body.len() % 32 != 0 || body.len() / 32 > batch.len() {
                return Err(bad_reply("confirm", "a list that is not ids it was asked"));
            }
            let asked: std::collections::HashSet<&[u8; 32]> = if body.is_empty() {
                Default::default()
            } else {
                batch.iter().collect()
            };
            for c in body.chunks_exact(32) {
                let mut id = [0u8; 32];
                id.copy_from_slice(c);
                if !asked.contains(&id) {
                    return Err(bad_reply("confirm", "an id it was not asked"));
                }
                missing.push(id);
            }
        }
        Ok(missing)
    }
}

fn bad_reply(path: &str, what: &str) -> BackendError {
    BackendError {
        kind: BackendErrorKind::Other,
        op: "dedup",
        path: path.into(),
        message: format!("the server's answer holds {what}"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// An upload is handed over in frames of at most 64 KiB, its length said
    /// first; its clock runs from the last frame taken: a slow taker keeps it
    /// going, one that takes nothing for the silence ends it.
    #[test]
    fn an_upload_is_watched_by_what_is_taken_of_it() {
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_time()
            .build()
            .unwrap();
        rt.block_on(async {
            let mut up = Uploading::new(bytes::Bytes::from(vec![9u8; 200_000]));
            assert_eq!(http_body::Body::size_hint(&up).exact(), Some(200_000));
            let taken = up.taken.clone();
            let silence = std::time::Duration::from_millis(400);
            let watch = tokio::spawn({
                let taken = taken.clone();
                async move { taken.silent_for(silence).await }
            });
            let mut sizes = Vec::new();
            loop {
                let f = std::future::poll_fn(|cx| {
                    http_body::Body::poll_frame(std::pin::Pin::new(&mut up), cx)
                })
                .await;
                let Some(f) = f else { break };
                sizes.push(f.unwrap().into_data().unwrap().len());
                tokio::time::sleep(std::time::Duration::from_millis(150)).await;
                assert!(
                    !watch.is_finished(),
                    "a taker every 150 ms taken for silent"
                );
            }
            assert_eq!(sizes, [65536, 65536, 65536, 3392]);
            let started = std::time::Instant::now();
            tokio::time::timeout(std::time::Duration::from_secs(5), watch)
                .await
                .expect("silence after the last frame is seen")
                .unwrap();
            assert!(started.elapsed() >= std::time::Duration::from_millis(200));
        });
    }

    /// A redirect is said as one, with what to do.
    #[test]
    fn a_redirect_is_said_as_one() {
        let (e, _) = refused(
            "put",
            "data/ab",
            reqwest::StatusCode::PERMANENT_REDIRECT,
            b"",
        );
        assert!(
            e.message.contains("308") && e.message.contains("give the address it sends to"),
            "{}",
            e.message
        );
    }

    /// Another web server's page is named in one line, not printed whole; a
    /// cairn server's JSON error is its message.
    #[test]
    fn an_answer_not_in_cairns_words_is_one_line() {
        let page = b"<!DOCTYPE HTML>\n<html lang=\"en\">\n<head>\n<TITLE>Error response</TITLE>\n\
                     </head><body><h1>Error response</h1><p>Error code: 404</p></body></html>\n";
        let (e, kind) = refused("get", "config", reqwest::StatusCode::NOT_FOUND, page);
        assert_eq!(kind, "");
        assert_eq!(e.kind, BackendErrorKind::Other);
        assert!(!e.message.contains('\n'), "{}", e.message);
        assert!(
            e.message.contains("not in cairn's words") && e.message.contains("\"Error response\""),
            "{}",
            e.message
        );
        let (e, _) = refused(
            "get",
            "config",
            reqwest::StatusCode::BAD_GATEWAY,
            b"\n\n  upstream   went\taway \x07\n more",
        );
        assert_eq!(e.kind, BackendErrorKind::Transient);
        assert!(
            e.message.ends_with(": \"upstream went away\""),
            "{}",
            e.message
        );
        let (e, kind) = refused(
            "get",
            "config",
            reqwest::StatusCode::NOT_FOUND,
            br#"{"error":"no_datastore","message":"no datastore named x"}"#,
        );
        assert_eq!(
            (e.kind, kind.as_str()),
            (BackendErrorKind::NoRepository, "no_datastore")
        );
        assert_eq!(e.message, "server: no datastore named x");
        assert_eq!(foreign_summary(b""), None);
    }

    /// An HTTP server on loopback that answers every request with `body` as a 206,
    /// whatever range was asked for: its first `split` bytes, a pause, then the rest
    /// (so that a piece of the body ends exactly there).
    fn answering(body: Vec<u8>, split: usize) -> String {
        use std::io::{Read, Write};
        let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let port = l.local_addr().unwrap().port();
        std::thread::spawn(move || {
            for stream in l.incoming() {
                let Ok(mut s) = stream else { return };
                let mut req = Vec::new();
                let mut b = [0u8; 1024];
                while !req.windows(4).any(|w| w == b"\r\n\r\n") {
                    match s.read(&mut b) {
                        Ok(0) | Err(_) => return,
                        Ok(n) => req.extend_from_slice(&b[..n]),
                    }
                }
                let head = format!(
                    "HTTP/1.1 206 Partial Content\r\ncontent-length: {}\r\nconnection: close\r\n\r\n",
                    body.len()
                );
                let _ = s.write_all(head.as_bytes());
                let (first, rest) = body.split_at(split.min(body.len()));
                let _ = s.write_all(first);
                let _ = s.flush();
                std::thread::sleep(std::time::Duration::from_millis(50));
                let _ = s.write_all(rest);
            }
        });
        format!("cairn+http://127.0.0.1:{port}/ds")
    }

    /// A range answered with more or fewer bytes than asked is refused, never
    /// handed on short or cut to size.
    #[test]
    fn a_range_of_the_wrong_length_is_refused() {
        let opts = ServerOptions {
            token: Some("cairn_00_11".into()),
            ..Default::default()
        };
        let pool = crate::bufpool::BufferPool::new(1 << 20, 1);
        for (sent, asked) in [
            (100usize, 100u64),
            (101, 100),
            (99, 100),
            (200_000, 100_000),
        ] {
            let b =
                ServerBackend::open(&answering(vec![5u8; sent], asked as usize), &opts).unwrap();
            let mut out = crate::bufpool::Pooled::new(&pool, 0);
            let r = b.get_range_into("data/ab/abcd", 0, asked, &mut out);
            let whole = b.get_range("data/ab/abcd", 0, asked);
            if sent as u64 == asked {
                r.unwrap();
                assert_eq!(&out[..], &vec![5u8; sent][..]);
                assert_eq!(whole.unwrap(), vec![5u8; sent]);
            } else {
                let e = r.unwrap_err();
                assert!(e.message.contains("for a range of"), "{e}");
                assert!(whole.is_err(), "{sent} bytes for {asked}");
            }
        }
    }

    /// An HTTP server on loopback that answers every request with `status` and
    /// a body that never ends (chunked, until the client hangs up).
    fn endless(status: &'static str) -> String {
        use std::io::{Read, Write};
        let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let port = l.local_addr().unwrap().port();
        std::thread::spawn(move || {
            for stream in l.incoming() {
                let Ok(mut s) = stream else { return };
                std::thread::spawn(move || {
                    let mut b = [0u8; 4096];
                    let _ = s.read(&mut b);
                    let head = format!("HTTP/1.1 {status}\r\ntransfer-encoding: chunked\r\n\r\n");
                    let _ = s.write_all(head.as_bytes());
                    let piece = format!("10000\r\n{}\r\n", "[".repeat(0x10000));
                    while s.write_all(piece.as_bytes()).is_ok() {}
                });
            }
        });
        format!("cairn+http://127.0.0.1:{port}/ds")
    }

    /// A server whose answers never end takes no more of a client's memory than
    /// what was asked for allows (audit r33: `snapshots` against one ran the
    /// machine out of memory); an error's body is read as far as its message.
    #[test]
    fn an_answer_longer_than_asked_for_is_refused_unread() {
        let opts = ServerOptions {
            token: Some("cairn_00_11".into()),
            ..Default::default()
        };
        let b = ServerBackend::open(&endless("200 OK"), &opts).unwrap();
        let e = b.get_bounded("config", 1000).unwrap_err();
        assert!(e.message.contains("longer than the 1000 bytes"), "{e}");
        let e = b.get_range("data/ab/abcd", 0, 5000).unwrap_err();
        assert!(e.message.contains("longer than the 5000 bytes"), "{e}");
        let e = b.may_remove().unwrap_err();
        assert!(e.message.contains("longer than"), "{e}");
        let e = b.dedup_query(&[[1u8; 32]; 3]).unwrap_err();
        assert!(e.message.contains("longer than the 96 bytes"), "{e}");
        let b = ServerBackend::open(&endless("500 Internal Server Error"), &opts).unwrap();
        let e = b.get_bounded("config", 1000).unwrap_err();
        assert!(e.message.contains("not in cairn's words"), "{e}");
        assert!(e.message.len() < 1000, "{e}");
    }

    #[test]
    fn locations() {
        let l = ServerLocation::parse("cairn+https://backup.example:8443/main").unwrap();
        assert_eq!(l.base, "https://backup.example:8443");
        assert_eq!(l.datastore, "main");
        assert!(ServerLocation::parse("cairn+http://127.0.0.1:8000/main").is_ok());
        assert!(ServerLocation::parse("cairn+http://[::1]:8000/main").is_ok());
        assert!(ServerLocation::parse("cairn+http://localhost:8000/main").is_ok());
        for bad in [
            "cairn+http://10.0.0.1:8000/main",
            "cairn+https://host:1",
            "cairn+https:///main",
            "cairn+https://h:1/a/b",
            "https://h:1/a",
            "cairn+https://127.0.0.1:notaport/main",
            "cairn+https://127.0.0.1:99999/main",
            "cairn+https://h:1?x/main",
            "cairn+https://h:1/",
            "cairn+https://h:1/a?b",
            "cairn+https://h:1/bad%20name",
            "cairn+https://h:1/..",
        ] {
            assert!(ServerLocation::parse(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn fingerprints() {
        let fp = "AB:".repeat(31) + "AB";
        assert_eq!(parse_fingerprint(&fp).unwrap(), vec![0xab; 32]);
        assert_eq!(parse_fingerprint(&"0f".repeat(32)).unwrap(), vec![0x0f; 32]);
        assert!(parse_fingerprint("abc").is_err());
        assert!(parse_fingerprint(&"zz".repeat(32)).is_err());
    }
}
