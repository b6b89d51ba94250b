//! S3-compatible object storage through Apache OpenDAL. The engine's calls are
//! synchronous; each one runs to completion on a small tokio runtime owned by the
//! backend, so many engine threads (uploaders, restore readers) keep many requests in
//! flight at once. Retries are not done here but by [`crate::RetryBackend`], above
//! any backend, so that the fault-injection tests exercise the same retry code.

use crate::io::IoRuntime;
use crate::{Backend, BackendError, BackendErrorKind, ObjectInfo, Result};
use opendal::layers::TimeoutLayer;
use opendal::services::S3;
use opendal::{ErrorKind, HttpTransporter, Operator};
use std::path::PathBuf;
use std::time::Duration;

/// Where a repository lives on S3: parsed from `s3:http(s)://HOST[:PORT]/BUCKET[/PREFIX]`
/// (or `s3:HOST/BUCKET[/PREFIX]`, meaning https).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct S3Location {
    /// `scheme://host[:port]`
    pub endpoint: String,
    pub bucket: String,
    /// Key prefix inside the bucket without leading or trailing `/`; may be empty.
    pub prefix: String,
}

impl S3Location {
    pub fn parse(location: &str) -> std::result::Result<S3Location, String> {
        let rest = location
            .strip_prefix("s3:")
            .ok_or_else(|| format!("{location:?} is not an s3: location"))?;
        let (scheme, rest) = if let Some(r) = rest.strip_prefix("https://") {
            ("https", r)
        } else if let Some(r) = rest.strip_prefix("http://") {
            ("http", r)
        } else {
            ("https", rest.trim_start_matches('/'))
        };
        let mut parts = rest.splitn(3, '/');
        let host = parts.next().unwrap_or("");
        let bucket = parts.next().unwrap_or("");
        let prefix = parts.next().unwrap_or("").trim_matches('/');
        let usage = "use s3:http(s)://HOST[:PORT]/BUCKET[/PREFIX]";
        if host.is_empty() {
            return Err(format!("{location:?} names no host ({usage})"));
        }
        if bucket.is_empty() {
            return Err(format!("{location:?} names no bucket ({usage})"));
        }
        if prefix.split('/').any(|c| c == "." || c == "..") {
            return Err(format!("{location:?}: the prefix may not contain . or .."));
        }
        Ok(S3Location {
            endpoint: format!("{scheme}://{host}"),
            bucket: bucket.to_string(),
            prefix: prefix.to_string(),
        })
    }
}

/// Settings S3 users expect beside the location. Credentials are not here: they come
/// from the AWS environment variables or the shared config/credentials files
/// (`AWS_PROFILE`), as every AWS tool reads them.
#[derive(Clone, Debug, Default)]
pub struct S3Options {
    /// Region to sign for; default `AWS_REGION`, `AWS_DEFAULT_REGION`, else us-east-1.
    pub region: Option<String>,
    /// `https://BUCKET.host/key` instead of `https://host/BUCKET/key` (path style,
    /// the default, which MinIO and most S3-compatible servers need).
    pub virtual_host: bool,
    /// Profile from `~/.aws/credentials` / `~/.aws/config` (default: `AWS_PROFILE`).
    pub profile: Option<String>,
    /// Extra PEM certificate(s) to trust (a private CA).
    pub ca_cert: Option<PathBuf>,
    /// Accept any server certificate. For testing only.
    pub insecure_tls: bool,
    /// How long a request may go without a byte before the attempt is given up
    /// (and retried); default [`S3_SILENCE`]. `--retry-for` shortens it.
    pub silence: Option<Duration>,
}

/// A minute of silence: an S3 server answers within seconds.
pub const S3_SILENCE: Duration = Duration::from_secs(60);

pub struct S3Backend {
    op: Operator,
    /// The backend's own runtime (callable from any thread, droppable anywhere).
    io: IoRuntime,
    location: String,
}

impl std::fmt::Debug for S3Backend {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("S3Backend")
            .field("location", &self.location)
            .finish()
    }
}

impl S3Backend {
    pub fn open(location: &str, opts: &S3Options) -> Result<S3Backend> {
        let loc =
            S3Location::parse(location).map_err(|m| BackendError::open_failed(location, m))?;
        let region = opts
            .region
            .clone()
            .or_else(|| std::env::var("AWS_REGION").ok())
            .or_else(|| std::env::var("AWS_DEFAULT_REGION").ok())
            .filter(|r| !r.is_empty())
            .unwrap_or_else(|| "us-east-1".to_string());
        let mut builder = S3::default()
            .endpoint(&loc.endpoint)
            .bucket(&loc.bucket)
            .root(&format!("/{}", loc.prefix))
            .region(&region);
        if opts.virtual_host {
            // BUCKET.HOST needs a name: an address cannot take the bucket in front.
            let hostport = (loc.endpoint.split_once("://")).map_or(&loc.endpoint[..], |(_, h)| h);
            let host = match hostport.rsplit_once(':') {
                Some((h, port)) if !port.is_empty() && port.bytes().all(|b| b.is_ascii_digit()) => {
                    h
                }
                _ => hostport,
            };
            let bare = host.trim_start_matches('[').trim_end_matches(']');
            if bare.parse::<std::net::IpAddr>().is_ok() {
                return Err(BackendError::open_failed(
                    location,
                    format!(
                        "--s3-virtual-host addresses the bucket as {}.{host}, which needs a \
                         host name: an IP address takes path-style addressing (leave the \
                         flag out)",
                        loc.bucket
                    ),
                ));
            }
            builder = builder.enable_virtual_host_style();
        }
        if let Some(p) = &opts.profile {
            builder = builder.profile(p);
        }
        // An S3 server answers within seconds; one that takes a request and then
        // says nothing (stopped, overloaded) is given up on after a minute of
        // silence rather than two, and the retries begin.
        let silence = opts.silence.unwrap_or(S3_SILENCE);
        let mut client = crate::io::http_client()
            .read_timeout(silence)
            .tcp_user_timeout(silence);
        if let Some(path) = &opts.ca_cert {
            client = crate::io::trust_ca(client, path, location)?;
        }
        if opts.insecure_tls {
            client = client.tls_danger_accept_invalid_certs(true);
        }
        let client = client
            .build()
            .map_err(|e| BackendError::open_failed(location, format!("cannot set up HTTP: {e}")))?;
        let op = Operator::new(builder).map_err(|e| {
            BackendError::open_failed(location, format!("invalid S3 settings: {e}"))
        })?;
        let ctx = op.context().with_http_transport(HttpTransporter::new(
            opendal_http_transport_reqwest::ReqwestTransport::new(client),
        ));
        // A stalled request becomes a transient error that the retry layer above
        // repeats, instead of a backup that hangs forever. This layer bounds stat at a
        // minute and the calls that carry data or listings (read, write, list, delete)
        // generously: the HTTP client's read and TCP timeouts above (a minute of
        // silence) catch a stall long before, and a 64 MiB object at 256 KiB/s fits.
        let op = op.with_context(ctx).layer(
            TimeoutLayer::new()
                .with_timeout(silence)
                .with_io_timeout(Duration::from_secs(30 * 60)),
        );
        let io = IoRuntime::new("cairn-s3", "S3").map_err(|e| {
            BackendError::open_failed(location, format!("cannot start I/O threads: {e}"))
        })?;
        Ok(S3Backend {
            op,
            io,
            location: location.to_string(),
        })
    }

    fn run<T: Send + 'static>(
        &self,
        op: &'static str,
        name: &str,
        fut: impl std::future::Future<Output = T> + Send + 'static,
    ) -> Result<T> {
        self.io.run(op, name, fut)
    }
}

/// What went wrong, in one line: the S3 error code and message when the server sent
/// one (`SignatureDoesNotMatch: The request signature we calculated does not
/// match…`), else OpenDAL's message and the chain of causes (`connection refused`).
/// OpenDAL's `Display` puts a dump of the response headers first; it is not used.
fn describe(e: &opendal::Error) -> String {
    let m = e.message();
    let field = |name: &str| -> Option<String> {
        let start = m.find(&format!("{name}: \""))? + name.len() + 3;
        let rest = &m[start..];
        let end = rest.find('"')?;
        Some(rest[..end].to_string())
    };
    let mut text = match (field("code"), field("message")) {
        (Some(code), Some(msg)) if !code.is_empty() => format!("{code}: {msg}"),
        (Some(code), None) if !code.is_empty() => code,
        _ => m.to_string(),
    };
    let mut source = std::error::Error::source(e);
    while let Some(s) = source {
        let t = s.to_string();
        if !text.contains(&t) {
            text.push_str(": ");
            text.push_str(&t);
        }
        source = s.source();
    }
    first_line(&text)
}

fn map_err(op: &'static str, path: &str, e: opendal::Error) -> BackendError {
    let text = describe(&e);
    let (kind, message) = if text.contains("NoSuchBucket") {
        (
            BackendErrorKind::Other,
            "the bucket does not exist (create it first)".to_string(),
        )
    } else if text.contains("signing credential") || text.contains("load credential") {
        (
            BackendErrorKind::PermissionDenied,
            "no S3 credentials: set AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY (with \
             AWS_SESSION_TOKEN for temporary ones), or name a profile of ~/.aws/credentials \
             with AWS_PROFILE or --s3-profile"
                .to_string(),
        )
    } else if is_unreachable(&text) {
        (BackendErrorKind::Unreachable, text)
    } else if text.contains("certificate") {
        // A TLS verification failure does not heal by retrying.
        (
            BackendErrorKind::Other,
            format!("{text} (a private CA: --cacert FILE; testing only: --insecure-tls)"),
        )
    } else {
        let kind = match e.kind() {
            ErrorKind::NotFound => BackendErrorKind::NotFound,
            ErrorKind::PermissionDenied => BackendErrorKind::PermissionDenied,
            ErrorKind::RateLimited => BackendErrorKind::Transient,
            _ if e.is_temporary() => BackendErrorKind::Transient,
            _ => BackendErrorKind::Other,
        };
        let message = match kind {
            BackendErrorKind::NotFound => "object not found".to_string(),
            BackendErrorKind::PermissionDenied => format!(
                "access denied ({text}); check the credentials (AWS_ACCESS_KEY_ID, AWS_SECRET_ACCESS_KEY or the profile), the region and this machine's clock"
            ),
            _ => text,
        };
        (kind, message)
    };
    BackendError {
        kind,
        op,
        path: path.to_string(),
        message,
    }
}

/// Nothing listens at the address, or the name does not resolve: the words of the
/// operating system and of hyper's resolver, which the HTTP stack passes on.
pub(crate) fn is_unreachable(text: &str) -> bool {
    text.contains("Connection refused")
        || text.contains("dns error")
        || text.contains("failed to lookup address")
        || text.contains("No route to host")
}

/// OpenDAL's messages carry a multi-line context dump; one line is enough here.
fn first_line(s: &str) -> String {
    let joined = s.split_whitespace().collect::<Vec<_>>().join(" ");
    let line = joined.as_str();
    if line.len() > 400 {
        let mut end = 400;
        while !line.is_char_boundary(end) {
            end -= 1;
        }
        format!("{}…", &line[..end])
    } else {
        line.to_string()
    }
}

impl Backend for S3Backend {
    fn location(&self) -> String {
        self.location.clone()
    }

    fn put(&self, name: &str, data: &[u8]) -> Result<()> {
        // One PUT: S3 makes an object visible only whole, and once the reply came it
        // is stored durably, which is the contract's atomic, durable put.
        let (op, key, data) = (self.op.clone(), name.to_string(), data.to_vec());
        self.run("put", name, async move { op.write(&key, data).await })?
            .map(|_| ())
            .map_err(|e| map_err("put", name, e))
    }

    fn put_new(&self, name: &str, data: &[u8]) -> Result<()> {
        self.put_new_owned(name, crate::Bytes::copy_from_slice(data), false)
    }

    fn put_new_owned(&self, name: &str, data: crate::Bytes, _metadata: bool) -> Result<()> {
        // A conditional PUT (If-None-Match: *): the server refuses it when the key
        // exists. Not every S3 server honours the header (see the trait's contract).
        let (op, key) = (self.op.clone(), name.to_string());
        self.run("put", name, async move {
            op.write_with(&key, data).if_not_exists(true).await
        })?
        .map(|_| ())
        .map_err(|e| match e.kind() {
            ErrorKind::ConditionNotMatch | ErrorKind::AlreadyExists => {
                BackendError::already_exists("put", name)
            }
            _ => map_err("put", name, e),
        })
    }

    fn get(&self, name: &str) -> Result<Vec<u8>> {
        let (op, key) = (self.op.clone(), name.to_string());
        self.run("get", name, async move {
            op.read(&key).await.map(|b| b.to_vec())
        })?
        .map_err(|e| map_err("get", name, e))
    }

    fn size(&self, name: &str) -> Result<u64> {
        let (op, key) = (self.op.clone(), name.to_string());
        self.run("get", name, async move { op.stat(&key).await })?
            .map(|meta| meta.content_length())
            .map_err(|e| map_err("get", name, e))
    }

    fn get_bounded(&self, name: &str, max: u64) -> Result<Vec<u8>> {
        // The size first (a HEAD): OpenDAL refuses a range that runs past the end,
        // and streams an open-ended read only after a HEAD of its own, so "at most
        // max + 1 bytes" cannot be one request. Callers that listed the object skip
        // this and use the listed size (`list_locks`, the keys).
        let (op, key) = (self.op.clone(), name.to_string());
        let size =
            match self.run("get", name, async move { op.stat(&key).await })? {
                Ok(meta) => meta.content_length(),
                Err(e) if e.kind() == ErrorKind::NotFound => return Err(map_err("get", name, e)),
                // A HEAD that timed out or met a 5xx is said as it is: asking the
                // same silent server again for the message doubled the wait (QA:
                // a stopped S3 server behind `cairn serve`).
                Err(e) if e.is_temporary() || e.kind() == ErrorKind::RateLimited => {
                    return Err(map_err("get", name, e));
                }
                Err(e) => {
                    // A HEAD answer has no body, so the server's code and message
                    // (SignatureDoesNotMatch: ...) come only with a GET: one byte of it.
                    let (op, key) = (self.op.clone(), name.to_string());
                    return Err(
                        match self.run("get", name, async move {
                            op.read_with(&key).range(0..1).await
                        })? {
                            Err(detail) => map_err("get", name, detail),
                            Ok(_) => map_err("get", name, e),
                        },
                    );
                }
            };
        if size > max {
            return Err(BackendError::too_large("get", name, size, max));
        }
        let data = self.get(name)?;
        // Replaced meanwhile by a larger object: still refused.
        if data.len() as u64 > max {
            return Err(BackendError::too_large("get", name, data.len() as u64, max));
        }
        Ok(data)
    }

    fn get_range(&self, name: &str, offset: u64, length: u64) -> Result<Vec<u8>> {
        let end = offset.checked_add(length).ok_or_else(|| BackendError {
            kind: BackendErrorKind::OutOfRange,
            op: "get",
            path: name.to_string(),
            message: "range overflows".into(),
        })?;
        if length == 0 {
            // A zero-length range is not expressible in HTTP; the object must exist.
            let (op, key) = (self.op.clone(), name.to_string());
            let meta = self
                .run("get", name, async move { op.stat(&key).await })?
                .map_err(|e| map_err("get", name, e))?;
            return if offset <= meta.content_length() {
                Ok(Vec::new())
            } else {
                Err(short_read(name, offset, length, meta.content_length()))
            };
        }
        let (op, key) = (self.op.clone(), name.to_string());
        let data = self
            .run("get", name, async move {
                op.read_with(&key)
                    .range(offset..end)
                    .await
                    .map(|b| b.to_vec())
            })?
            .map_err(|e| match e.kind() {
                ErrorKind::RangeNotSatisfied => short_read(name, offset, length, 0),
                _ => map_err("get", name, e),
            })?;
        // A range running past the end comes back short from S3: an error here.
        if data.len() as u64 != length {
            return Err(short_read(name, offset, length, data.len() as u64));
        }
        Ok(data)
    }

    fn list(&self, prefix: &str) -> Result<Vec<ObjectInfo>> {
        let (op, key) = (self.op.clone(), prefix.to_string());
        let entries = self
            .run("list", prefix, async move {
                op.list_with(&key).recursive(true).await
            })?
            .map_err(|e| map_err("list", prefix, e))?;
        Ok(entries
            .into_iter()
            .filter(|e| !e.metadata().is_dir() && !e.path().ends_with('/'))
            .map(|e| ObjectInfo {
                name: e.path().trim_start_matches('/').to_string(),
                size: e.metadata().content_length(),
            })
            .collect())
    }

    fn delete(&self, name: &str) -> Result<()> {
        // S3 answers a delete of a missing key with success; the contract allows it.
        let (op, key) = (self.op.clone(), name.to_string());
        self.run("delete", name, async move { op.delete(&key).await })?
            .map_err(|e| map_err("delete", name, e))
    }
}

fn short_read(name: &str, offset: u64, length: u64, got: u64) -> BackendError {
    BackendError {
        kind: BackendErrorKind::OutOfRange,
        op: "get",
        path: name.to_string(),
        message: format!(
            "range {offset}+{length} runs past the end of the object (got {got} bytes)"
        ),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn virtual_host_addressing_needs_a_host_name() {
        let opts = S3Options {
            virtual_host: true,
            ..Default::default()
        };
        for ip in ["s3:http://127.0.0.1:9000/b", "s3:https://[::1]/b/p"] {
            let e = S3Backend::open(ip, &opts).err().map(|e| e.message);
            assert!(e.is_some_and(|m| m.contains("needs a host name")), "{ip}");
        }
        assert!(S3Backend::open("s3:https://s3.example.com/b", &opts).is_ok());
    }

    #[test]
    fn locations_parse() {
        let l = S3Location::parse("s3:http://127.0.0.1:9000/bucket/some/prefix/").unwrap();
        assert_eq!(l.endpoint, "http://127.0.0.1:9000");
        assert_eq!(l.bucket, "bucket");
        assert_eq!(l.prefix, "some/prefix");
        let l = S3Location::parse("s3:s3.example.com/b").unwrap();
        assert_eq!(l.endpoint, "https://s3.example.com");
        assert_eq!((l.bucket.as_str(), l.prefix.as_str()), ("b", ""));
        assert!(S3Location::parse("s3:http://host").is_err());
        assert!(S3Location::parse("s3:http://host/").is_err());
        assert!(S3Location::parse("s3:").is_err());
        assert!(S3Location::parse("s3:http://h/b/../x").is_err());
        assert!(S3Location::parse("/local/dir").is_err());
    }

    /// The same behaviour as every other backend, on the S3 server the test script
    /// starts. Fails (never skips) when that server is not there.
    #[test]
    fn conformance_on_s3() {
        let b = crate::testing::s3_backend("conformance");
        crate::conformance::run(&b);
    }

    /// The engine is blocking and the server calls it from inside tokio (through
    /// `spawn_blocking`, and sometimes, wrongly, straight from a task): every call,
    /// and dropping the backend, must work from such threads.
    #[test]
    fn works_from_inside_a_tokio_runtime() {
        let outer = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(1)
            .enable_all()
            .build()
            .unwrap();
        outer.block_on(async {
            let b = crate::testing::s3_backend("in-tokio");
            let b = std::sync::Arc::new(b);
            let b2 = b.clone();
            tokio::task::spawn_blocking(move || {
                b2.put("data/ab/x", b"hello").unwrap();
                assert_eq!(b2.get("data/ab/x").unwrap(), b"hello");
                assert_eq!(b2.get_range("data/ab/x", 1, 3).unwrap(), b"ell");
                assert_eq!(b2.list("data/").unwrap().len(), 1);
                b2.delete("data/ab/x").unwrap();
            })
            .await
            .unwrap();
            // Straight from a task (blocking it, but not panicking).
            b.put("index/y", b"z").unwrap();
            assert_eq!(b.get("index/y").unwrap(), b"z");
            drop(b);
        });
    }
}
