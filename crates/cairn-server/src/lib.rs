//! `cairn serve`: a recovery-point server in front of ordinary cairn repositories.
//!
//! ```text
//! client (chunking, hashing, compression, encryption: keys never leave it)
//!    -> HTTPS object calls with a bearer token
//! server: token -> policy (role x object kind x action, by name) -> checks
//!    (name = hash of the bytes, sizes, create-only) -> the datastore's storage
//! ```
//!
//! The server adds no format of its own: a datastore is a repository that an admin
//! can also open directly, and the server never holds a key. Storage calls are
//! blocking and run through `spawn_blocking`.

pub mod answers;
pub mod api;
pub mod body;
pub mod config;
pub mod conns;
pub mod console;
pub mod content;
pub mod dedup;
pub mod hosts;
mod idset;
pub mod jobs;
pub mod locks;
pub mod metrics;
pub mod overview;
pub mod pace;
pub mod pipe;
pub mod policy;
pub mod scrub;
pub mod signin;
pub mod slots;
pub mod statefile;
pub mod tls;
pub mod tokens;
pub mod users;

use axum::Router;
use axum::routing::get;
use cairn_backend::Backend;
use config::{ServerConfig, Tls};
use std::collections::BTreeMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

#[derive(Debug, thiserror::Error)]
pub enum ServerError {
    #[error(transparent)]
    Config(#[from] config::ConfigError),
    #[error(transparent)]
    Tls(#[from] tls::TlsError),
    #[error(transparent)]
    Tokens(#[from] tokens::TokenError),
    #[error(transparent)]
    Users(#[from] users::UserError),
    #[error("datastore {name}: {message}")]
    Datastore { name: String, message: String },
    #[error("cannot listen on {addr}: {message}")]
    Listen { addr: String, message: String },
    #[error("{0}")]
    Io(String),
}

/// One served repository.
pub struct Datastore {
    pub name: String,
    pub location: String,
    /// On object storage (each read of a piece is a request there).
    pub remote: bool,
    pub backend: Arc<dyn Backend>,
    /// The repository has the `admin-names` feature: the policy can tell, by name,
    /// what an append-only token must not write (read with the config, at start or
    /// once the storage answers: see `ready`).
    pub admin_names: std::sync::atomic::AtomicBool,
    /// Its config has been read. A datastore whose storage did not answer when the
    /// server started is not served (503) until it does, while the others are.
    pub ready: std::sync::atomic::AtomicBool,
    /// Why it is not served when its storage answered but holds no valid
    /// repository (none yet, or a damaged config): clients are told at once
    /// rather than retrying what only an admin can mend.
    pub not_served: std::sync::Mutex<Option<String>>,
    pub owners: locks::LockOwners,
    /// Requests and bytes for this datastore.
    pub stats: Stats,
    /// What the last listing for `/metrics` found, and when.
    pub census: tokio::sync::Mutex<Option<(Instant, metrics::Census)>>,
    /// Dedup queries: what the datastore holds and what clients are sending.
    pub dedup: dedup::Dedup,
    /// Snapshot owners for host-bound tokens.
    pub hosts: hosts::HostRecords,
    /// Job slots: who may write now.
    pub slots: slots::Slots,
    /// The repository's `max_concurrent_jobs` (read at start, and again when an
    /// admin replaces the config through this server).
    pub max_jobs: std::sync::atomic::AtomicU32,
    /// The key, when an admin unlocked the datastore, and what reads with it.
    pub content: content::Content,
    /// Room kept free for forget and prune: a non-admin token's pack that would
    /// leave less is refused as on a full disk (`cairn_core::repo::room`),
    /// and when that room was last measured.
    pub room: Arc<cairn_core::repo::room::Room>,
    pub room_measured: std::sync::Mutex<Option<Instant>>,
}

/// Counters for the log and, later, `/metrics`.
#[derive(Default)]
pub struct Stats {
    /// Requests being answered now.
    pub active: AtomicU64,
    pub requests: AtomicU64,
    pub bytes_in: AtomicU64,
    pub bytes_out: AtomicU64,
    pub errors: AtomicU64,
}

pub struct App {
    pub config: ServerConfig,
    pub datastores: BTreeMap<String, Arc<Datastore>>,
    pub tokens: tokens::TokenStore,
    pub stats: Stats,
    pacers: Pacers,
    pub jobs: jobs::Jobs,
    /// Upload buffers for reuse.
    pub bodies: body::BodyPool,
    /// The console's sign-ins.
    pub signins: signin::SignIns,
    /// Console users (name and password).
    pub users: users::UserStore,
    /// Password checks running at once ([`users::HASHING_AT_ONCE`]).
    pub hashing: tokio::sync::Semaphore,
    /// Memory for upload bodies being received.
    pub uploads: body::UploadBudget,
    /// The listener's certificate, once it listens with TLS (for `/metrics`).
    pub cert: std::sync::OnceLock<Arc<tls::CertSource>>,
    /// Snapshot downloads running, by token or user (each holds a thread and its
    /// readers): see [`content::DOWNLOADS_AT_ONCE`].
    pub downloads: Arc<conns::Places<String>>,
    /// Answers built and not yet taken by their clients, held to a budget.
    pub answers: answers::Answers,
}

/// The bandwidth limits in force: the server's, and each token's (made when the
/// token first transfers).
#[derive(Default)]
struct Pacers {
    upload: Option<pace::Pacer>,
    download: Option<pace::Pacer>,
    /// By token: its download and upload pacers (looked up by `&str`: a paced
    /// transfer asks once per frame, review r39 L3).
    per_token: std::sync::Mutex<std::collections::HashMap<String, [Option<Arc<pace::Pacer>>; 2]>>,
}

impl App {
    /// How long a client may take none of an answer before the answer is
    /// given up and its connection ended (`answer_stall_secs`).
    pub fn stall(&self) -> Duration {
        Duration::from_secs(self.config.answer_stall_secs)
    }

    /// Waits as long as the bandwidth limits require for a transfer of `bytes` by
    /// `token` (`upload`: client to server).
    pub async fn pace_transfer(&self, token: &str, upload: bool, bytes: u64) {
        let wait = self.pace(token, upload, bytes);
        if !wait.is_zero() {
            tokio::time::sleep(wait).await;
        }
    }

    /// Whether uploads are paced at all (`limit_upload`,
    /// `limit_upload_per_token`).
    pub fn uploads_paced(&self) -> bool {
        let l = &self.config.limits;
        l.upload.is_some() || l.upload_per_token.is_some()
    }

    /// Whether downloads are paced at all (`limit_download`,
    /// `limit_download_per_token`): they then go out a frame at a time, each
    /// paced, so that a client hears from the server as the limit allows
    /// rather than nothing for a whole piece (QA r38: a 1 MiB piece paced
    /// whole kept a client at a few KiB/s silent past its patience).
    pub fn downloads_paced(&self) -> bool {
        let l = &self.config.limits;
        l.download.is_some() || l.download_per_token.is_some()
    }

    /// What a paced download hands out at a time: an eighth of a second of the
    /// lowest download limit, 4 to 64 KiB, so that readers sharing a slow limit
    /// each hear from the server every few seconds, not every few minutes (QA
    /// r38: four readers at 7 KiB/s waited 37 s a frame of 64 KiB).
    pub fn download_frame(&self) -> usize {
        let l = &self.config.limits;
        let lowest = [l.download, l.download_per_token]
            .into_iter()
            .flatten()
            .min()
            .unwrap_or(u64::MAX);
        usize::try_from(lowest / 8)
            .unwrap_or(usize::MAX)
            .clamp(4 << 10, pipe::FRAME)
    }

    /// How long a transfer of `bytes` by `token` must wait for the limits
    /// (`upload`: client to server).
    pub fn pace(&self, token: &str, upload: bool, bytes: u64) -> Duration {
        let l = &self.config.limits;
        let (global, per_token) = if upload {
            (&self.pacers.upload, l.upload_per_token)
        } else {
            (&self.pacers.download, l.download_per_token)
        };
        let mut wait = global.as_ref().map_or(Duration::ZERO, |p| p.reserve(bytes));
        if let Some(rate) = per_token {
            let mut all = self
                .pacers
                .per_token
                .lock()
                .unwrap_or_else(|e| e.into_inner());
            let both = match all.get_mut(token) {
                Some(b) => b,
                None => all.entry(token.to_string()).or_default(),
            };
            let p = both[usize::from(upload)]
                .get_or_insert_with(|| Arc::new(pace::Pacer::new(rate)))
                .clone();
            drop(all);
            wait = wait.max(p.reserve(bytes));
        }
        wait
    }
}

/// What the server reads from a repository's config: its features and its job
/// limit. The config is plaintext JSON under a MAC the server cannot check; the
/// features only decide whether to allow non-admin writes (a forged feature list
/// would make the readers themselves ignore the lists a hostile writer could add),
/// and a forged job limit only changes how many clients write at once.
pub struct ConfigSummary {
    pub features: Vec<String>,
    pub max_concurrent_jobs: u32,
    /// The size packs are made up to (`pack_size`), when the config says.
    pub pack_size: Option<u64>,
    /// The largest chunk (`chunker.max_size`): a pack is sealed once it
    /// reaches `pack_size`, so it may pass it by one chunk.
    pub largest_chunk: u64,
    /// The smallest chunk but a file's last (`chunker.min_size`), for the
    /// size of a pack's header: an entry a chunk.
    pub smallest_chunk: u64,
}

impl ConfigSummary {
    /// The most a pack is expected to pass `pack_size` by: its last chunk in
    /// its envelope, and its header, an entry for each chunk of the smallest
    /// size (chunks that compress well make more; review r39: the header was
    /// left out).
    fn pack_overrun(&self, pack_size: u64) -> u64 {
        use cairn_format::consts::{ENVELOPE_OVERHEAD, PACK_HEADER_ENTRY_LEN};
        let entries = pack_size / self.smallest_chunk.max(512) + 1;
        self.largest_chunk
            .saturating_add(2 * ENVELOPE_OVERHEAD as u64 + 8)
            .saturating_add(entries.saturating_mul(PACK_HEADER_ENTRY_LEN as u64))
    }

    /// The repository has the `admin-names` feature.
    pub fn admin_names(&self) -> bool {
        self.features
            .iter()
            .any(|f| f == cairn_format::consts::FEATURE_ADMIN_NAMES)
    }
}

/// The repository config's plaintext settings (the `config` member, unverified:
/// the server cannot check its MAC).
pub fn read_config_json(backend: &dyn Backend) -> Result<serde_json::Value, String> {
    let max = cairn_format::consts::MAX_SMALL_OBJECT_SIZE as u64;
    let data = backend
        .get_bounded(cairn_backend::names::CONFIG, max)
        .map_err(|e| {
            if e.is_not_found() {
                "no repository there (is its file system mounted? if it is new, create it \
                 with `cairn init`)"
                    .to_string()
            } else {
                e.to_string()
            }
        })?;
    let mut v: serde_json::Value =
        serde_json::from_slice(&data).map_err(|e| format!("the config is damaged: {e}"))?;
    match v.get_mut("config") {
        Some(c) => Ok(c.take()),
        None => Err("the config is damaged: no settings".into()),
    }
}

/// Whether a datastore's config could not be read because the server lacks the
/// right to (no S3 credentials, a refused key, a directory it may not read): not
/// "no repository there", which would send clients away as if there were none
/// (QA r16: they exited "no repository", and read the server's credential setup).
/// Clients are answered "not served yet" (503) and the log says why.
fn server_may_not_read(why: &str) -> bool {
    [
        "no S3 credentials",
        "Permission denied",
        "AccessDenied",
        "permission denied",
    ]
    .iter()
    .any(|w| why.contains(w))
}

pub fn read_config_summary(backend: &dyn Backend) -> Result<ConfigSummary, String> {
    let v = read_config_json(backend)?;
    let features = v
        .get("features")
        .and_then(|f| f.as_array())
        .map(|a| {
            a.iter()
                .filter_map(|x| x.as_str().map(str::to_string))
                .collect()
        })
        .unwrap_or_default();
    let max_concurrent_jobs = v
        .get("max_concurrent_jobs")
        .and_then(|m| m.as_u64())
        .map_or(cairn_format::config::DEFAULT_MAX_CONCURRENT_JOBS, |m| {
            m.clamp(1, cairn_format::config::MAX_MAX_CONCURRENT_JOBS as u64) as u32
        });
    let pack_size = v.get("pack_size").and_then(|p| p.as_u64());
    let chunker = |k: &str| v.pointer(&format!("/chunker/{k}")).and_then(|m| m.as_u64());
    Ok(ConfigSummary {
        features,
        max_concurrent_jobs,
        pack_size,
        largest_chunk: chunker("max_size").unwrap_or(0),
        smallest_chunk: chunker("min_size").unwrap_or(0),
    })
}

/// Logs when datastore `name` makes packs larger than the server takes: every
/// backup through it would fail (QA r35: the server started without a word).
fn warn_pack_size(name: &str, summary: &ConfigSummary, max_object_size: u64) {
    // Sealed once it reaches pack_size: a chunk and the header more (review
    // r36 L3: a pack_size equal to max_object_size was not warned of).
    if let Some(p) = summary.pack_size
        && p.saturating_add(summary.pack_overrun(p)) > max_object_size
    {
        log_line(&format!(
            "warning: datastore {name} makes packs of its pack_size ({p} bytes) and up to \
             {} bytes more (a last chunk and the pack's header), more than max_object_size \
             ({max_object_size}): backups through this server fail unless they use smaller \
             packs (`backup --pack-size`); raise max_object_size, or lower the datastore's \
             pack size (`cairn config --pack-size`)",
            summary.pack_overrun(p)
        ));
    }
}

/// How long a datastore's storage (S3) may stay silent on one call, and how long a
/// call to it is retried, while a client waits: the client is answered 503 ("the
/// datastore's storage does not answer now") within about 20 s, well inside the
/// 30 s a client waits for an answer at the least
/// (`cairn_backend::SERVER_SILENCE_MIN`), so it is told why and retries by its
/// own `--retry-for` (QA: requests were held as long as a stopped S3 server stayed
/// silent, minutes, and the clients timed out blaming the server). Scheduled jobs
/// open the storage themselves, with a client's patience.
const STORAGE_SILENCE: Duration = Duration::from_secs(20);
/// No retry of a call to a datastore's storage begins after this from the call's
/// start, so that the last attempt, silent for at most [`STORAGE_SILENCE`], ends
/// inside the 30 s a client waits (review: 15 s of quick failures and then a
/// silent attempt answered after 35 s).
const STORAGE_RETRIES_BEGIN_WITHIN: Duration = Duration::from_secs(8);

/// Above this many simultaneous jobs per datastore the server warns: each job
/// holds packs in flight and keeps the disks seeking.
pub const JOBS_WARNING: u32 = 16;

impl App {
    /// Opens every datastore's storage (no local cache: the server reads each
    /// object for a client, who caches it) and the token file.
    pub fn open(config: ServerConfig) -> Result<App, ServerError> {
        // Made for this user alone: it holds token hashes, the TLS key and what
        // each datastore's locks and copies are doing.
        std::os::unix::fs::DirBuilderExt::mode(std::fs::DirBuilder::new().recursive(true), 0o700)
            .create(&config.state_dir)
            .map_err(|e| {
                ServerError::Io(format!(
                    "cannot create the state directory {}: {e}",
                    config.state_dir.display()
                ))
            })?;
        let opts = cairn_core::repo::storage::StorageOptions {
            cache: cairn_core::repo::storage::CacheChoice::Off,
            s3: cairn_backend::S3Options {
                silence: Some(STORAGE_SILENCE),
                ..Default::default()
            },
            // As patience, not `max_total` (`--retry-for`), which would also wait
            // out an S3 server that refuses connections as if it were restarting:
            // the console must say at once that it is down.
            retry: cairn_backend::RetryPolicy {
                // Counted from the call's start, not its first failure: a silent
                // first attempt (20 s) and then a whole patience answered the
                // client after 40 s (CI). The patience, as long but from the first
                // failure, never ends a call first.
                patience: STORAGE_RETRIES_BEGIN_WITHIN,
                deadline: Some(STORAGE_RETRIES_BEGIN_WITHIN),
                ..Default::default()
            },
            ..Default::default()
        };
        let mut datastores = BTreeMap::new();
        api::hide_location(
            &config.state_dir.to_string_lossy(),
            "<the server's state directory>",
        );
        for (name, location) in &config.datastores {
            api::hide_location(location, &format!("<datastore {name}>"));
            let err = |message: String| ServerError::Datastore {
                name: name.clone(),
                message,
            };
            let storage = cairn_core::repo::storage::open_storage(
                location,
                &opts,
                &cairn_core::progress::Progress::none(),
            )
            .map_err(|e| err(e.to_string()))?;
            // Storage that does not answer now (an S3 endpoint down), or that holds
            // no valid repository (a disk not mounted, a damaged config), does not
            // keep the other datastores from being served: this one waits (not
            // served, said in the log) until it is mended.
            let down = match storage
                .backend
                .get_bounded(cairn_backend::names::CONFIG, 1 << 20)
            {
                Err(e)
                    if matches!(
                        e.kind,
                        cairn_backend::BackendErrorKind::Unreachable
                            | cairn_backend::BackendErrorKind::Transient
                    ) =>
                {
                    Some(e.to_string())
                }
                _ => None,
            };
            let mut not_served = None;
            let summary = match down {
                Some(why) => {
                    log_line(&format!(
                        "warning: datastore {name}: its storage does not answer ({why}); \
                         serving the others, and this one once it answers"
                    ));
                    None
                }
                None => match read_config_summary(storage.backend.as_ref()) {
                    Ok(s) => Some(s),
                    Err(why) if server_may_not_read(&why) => {
                        log_line(&format!(
                            "warning: datastore {name}: not served: the server may not read \
                             its storage ({why}); serving the others, and this one once it can"
                        ));
                        None
                    }
                    Err(why) => {
                        log_line(&format!(
                            "warning: datastore {name}: not served: {why}; serving the \
                             others, and this one once it holds its repository"
                        ));
                        not_served = Some(why);
                        None
                    }
                },
            };
            let ready = summary.is_some();
            let summary = summary.unwrap_or(ConfigSummary {
                features: Vec::new(),
                max_concurrent_jobs: cairn_format::config::DEFAULT_MAX_CONCURRENT_JOBS,
                pack_size: None,
                largest_chunk: 0,
                smallest_chunk: 0,
            });
            warn_pack_size(name, &summary, config.max_object_size);
            if summary.max_concurrent_jobs > JOBS_WARNING {
                log_line(&format!(
                    "warning: datastore {name} allows {} simultaneous jobs (max-concurrent-jobs); \
                     more than {JOBS_WARNING} usually makes every job slower",
                    summary.max_concurrent_jobs
                ));
            }
            let admin_names = summary.admin_names();
            let owners = locks::LockOwners::open(
                config.state_dir.join(format!("locks-{name}.json")),
                config.max_lock_age_hours.saturating_mul(3600) as i64,
            );
            let remote =
                cairn_core::repo::storage::Location::parse(location).is_ok_and(|l| l.is_remote());
            datastores.insert(
                name.clone(),
                Arc::new(Datastore {
                    name: name.clone(),
                    location: location.clone(),
                    remote,
                    backend: storage.backend,
                    admin_names: admin_names.into(),
                    ready: ready.into(),
                    not_served: std::sync::Mutex::new(not_served),
                    owners,
                    stats: Stats::default(),
                    census: tokio::sync::Mutex::new(None),
                    dedup: dedup::Dedup::at(name, remote),
                    hosts: hosts::HostRecords::default(),
                    slots: slots::Slots::new(Duration::from_secs(config.job_idle_secs)),
                    max_jobs: summary.max_concurrent_jobs.into(),
                    content: content::Content::default(),
                    room: Arc::default(),
                    room_measured: std::sync::Mutex::new(None),
                }),
            );
        }
        let tokens = tokens::TokenStore::new(&config.state_dir);
        tokens.list()?;
        let users = users::UserStore::new(&config.state_dir);
        // The console's files are not the backup service: damaged, they are said
        // (at start here, and to each sign-in or change that needs them) and left
        // as they are for the admin to mend, and clients' backups go on.
        if let Err(e) = users.list() {
            log_line(&format!(
                "warning: console users cannot be read ({e}): console sign-in is refused until \
                 the file is mended, or removed and the users added again (`cairn serve user \
                 add`); tokens work"
            ));
        }
        let pacers = Pacers {
            upload: config.limits.upload.map(pace::Pacer::new),
            download: config.limits.download.map(pace::Pacer::new),
            per_token: Default::default(),
        };
        let jobs = jobs::Jobs::new(
            config.jobs.clone(),
            config.datastore_passwords.clone(),
            &config.state_dir,
        );
        if let Err(e) = jobs.check_console_file() {
            log_line(&format!(
                "warning: the console's schedules cannot be read ({e}): none of them runs, \
                 and the console cannot change them, until the file is mended or removed; \
                 the settings file's jobs run"
            ));
        }
        for name in jobs.shadowed() {
            log_line(&format!(
                "warning: console schedule {name:?} does not run: the settings file has a job \
                 of that name, which runs instead (remove one of them)"
            ));
        }
        for spec in jobs.console_specs() {
            if !datastores.contains_key(&spec.datastore) {
                log_line(&format!(
                    "warning: console schedule {:?} is for datastore {:?}, which this server \
                     does not serve: it fails at every run until that datastore is back or \
                     the schedule is removed",
                    spec.name, spec.datastore
                ));
            }
        }
        let signins = signin::SignIns::new(
            Duration::from_secs(config.session_idle_secs),
            Duration::from_secs(config.session_max_hours * 3600),
        );
        let uploads = body::UploadBudget::new(config.max_object_size);
        let answers = answers::Answers::new(
            config.answer_memory_per_caller_mib,
            config.answer_memory_mib,
        );
        Ok(App {
            config,
            datastores,
            tokens,
            stats: Stats::default(),
            pacers,
            jobs,
            bodies: body::BodyPool::default(),
            signins,
            users,
            hashing: tokio::sync::Semaphore::new(users::HASHING_AT_ONCE),
            uploads,
            cert: std::sync::OnceLock::new(),
            downloads: conns::Places::new(
                content::DOWNLOADS_PER_CALLER,
                content::DOWNLOADS_AT_ONCE,
            ),
            answers,
        })
    }

    pub fn router(self: &Arc<App>) -> Router {
        let [
            r_health,
            r_metrics,
            r_whoami,
            r_list,
            r_object,
            r_jobs,
            r_run,
            r_plan,
            r_query,
            r_confirm,
            r_slots,
            r_session,
            r_datastores,
            r_unlock,
            r_stats,
            r_snapshots,
            r_entries,
            r_search,
            r_download,
            r_start_job,
            r_fleet,
            r_schedule,
        ] = ROUTES;
        Router::new()
            .route(r_health, get(|| async { "ok\n" }))
            .route(r_metrics, get(metrics::metrics))
            .route(r_whoami, get(api::whoami))
            .route(r_list, get(api::list))
            .route(r_object, get(api::get).put(api::put).delete(api::delete))
            .route(r_jobs, get(api::jobs))
            .route(r_run, axum::routing::post(api::run_job))
            .route(r_plan, get(api::dedup_plan))
            .route(r_query, axum::routing::post(api::dedup_query))
            .route(r_confirm, axum::routing::post(api::dedup_confirm))
            .route(
                r_slots,
                get(api::slots_list)
                    .post(api::slot_request)
                    .delete(api::slot_release),
            )
            .route(
                r_session,
                get(api::session_get)
                    .post(api::session_post)
                    .delete(api::session_delete),
            )
            .route(r_datastores, get(overview::datastores))
            .route(
                r_unlock,
                axum::routing::post(content::unlock).delete(content::relock),
            )
            .route(r_stats, get(content::stats))
            .route(r_snapshots, get(content::snapshots))
            .route(r_entries, get(content::entries))
            .route(r_search, get(content::search))
            .route(r_download, get(content::download))
            .route(r_start_job, axum::routing::post(api::start_job))
            .route(r_fleet, get(content::fleet))
            .route(
                r_schedule,
                axum::routing::put(api::put_schedule).delete(api::delete_schedule),
            )
            .route("/", get(console::index))
            .route("/console/app.js", get(console::app_js))
            .route("/console/style.css", get(console::style))
            // Errors are JSON everywhere, also for a call the server does not have.
            .fallback(api::no_such_call)
            .method_not_allowed_fallback(api::method_not_allowed)
            .layer(axum::middleware::from_fn_with_state(
                self.clone(),
                signin::cookie_auth,
            ))
            .layer(axum::middleware::from_fn(no_store))
            // The bound of every body read whole before its handler runs (sign-in,
            // job, schedule, slot and unlock requests: small JSON), before any
            // token is checked. Uploads read their body themselves, bounded by
            // what their kind of object may be (`api::put`).
            .layer(axum::extract::DefaultBodyLimit::max(SMALL_BODY_LIMIT))
            .with_state(self.clone())
    }
}

/// Answers of the API are kept by no cache: a browser's would hold the files and
/// listings a console user restored after they signed out (console pentest).
async fn no_store(
    req: axum::extract::Request,
    next: axum::middleware::Next,
) -> axum::response::Response {
    let api = req.uri().path().starts_with("/v1/");
    let mut r = next.run(req).await;
    if api {
        r.headers_mut().insert(
            axum::http::header::CACHE_CONTROL,
            axum::http::HeaderValue::from_static("no-store"),
        );
    }
    r
}

/// What a request body read whole may hold (see [`App::router`]).
pub const SMALL_BODY_LIMIT: usize = 64 << 10;

/// Every route the server answers; docs/openapi.yaml describes each (a test checks).
pub const ROUTES: [&str; 22] = [
    "/healthz",
    "/metrics",
    "/v1/whoami",
    "/v1/datastores/{ds}/objects",
    "/v1/datastores/{ds}/objects/{*name}",
    "/v1/jobs",
    "/v1/jobs/{name}/run",
    "/v1/datastores/{ds}/dedup",
    "/v1/datastores/{ds}/dedup/query",
    "/v1/datastores/{ds}/dedup/confirm",
    "/v1/datastores/{ds}/slots",
    "/v1/session",
    "/v1/datastores",
    "/v1/datastores/{ds}/unlock",
    "/v1/datastores/{ds}/stats",
    "/v1/datastores/{ds}/snapshots",
    "/v1/datastores/{ds}/snapshots/{id}/entries",
    "/v1/datastores/{ds}/snapshots/{id}/search",
    "/v1/datastores/{ds}/snapshots/{id}/download",
    "/v1/datastores/{ds}/jobs",
    "/v1/fleet",
    "/v1/schedules/{name}",
];

/// Where the self-signed certificate lives.
pub fn self_signed_paths(state_dir: &std::path::Path) -> (std::path::PathBuf, std::path::PathBuf) {
    (
        state_dir.join("tls/cert.pem"),
        state_dir.join("tls/key.pem"),
    )
}

/// What the server says when it is ready (printed by the CLI).
pub struct Ready {
    pub addr: std::net::SocketAddr,
    pub fingerprint: Option<String>,
}

/// Bytes read from a TLS connection's socket at a time.
const TLS_READ_BUFFER: usize = 128 << 10;

/// Whether SIGHUP is ignored by this process (`nohup`), by /proc.
fn hangup_ignored() -> bool {
    std::fs::read_to_string("/proc/self/status")
        .ok()
        .and_then(|s| {
            s.lines()
                .find_map(|l| l.strip_prefix("SigIgn:"))
                .and_then(|v| u64::from_str_radix(v.trim(), 16).ok())
        })
        .is_some_and(|mask| mask & (1 << (libc::SIGHUP - 1)) != 0)
}

/// Set when SIGHUP stopped the server ([`stopped_by_hangup`]).
static HUNG_UP: std::sync::atomic::AtomicBool = std::sync::atomic::AtomicBool::new(false);

/// Whether the server stopped for a SIGHUP: the CLI then exits non-zero, so that a
/// service manager restarting on failure starts it again, reading its settings
/// anew (an administrator or logrotate sends HUP for a reload; with exit 0 the
/// server stayed down: QA).
pub fn stopped_by_hangup() -> bool {
    HUNG_UP.load(Ordering::Relaxed)
}

/// The next SIGHUP, or never without a handler.
async fn hangup(h: &mut Option<tokio::signal::unix::Signal>) {
    match h {
        Some(h) => {
            h.recv().await;
        }
        None => std::future::pending().await,
    }
}

/// Deletes the locks of tokens removed while the server runs, or in the hour
/// before it started (`tokens::Removed`), and ends their uploads, looking every
/// few seconds: a
/// hijacked client's token is removed, and its lock must not keep other hosts'
/// backups and prune waiting for half an hour.
fn sweep_removed_tokens(app: &Arc<App>) {
    let app = app.clone();
    tokio::spawn(async move {
        let mut known = BTreeMap::new();
        let mut tick = tokio::time::interval(Duration::from_secs(3));
        let mut file_there = app.tokens.path().exists();
        let mut said_gone = false;
        loop {
            tick.tick().await;
            // A token file deleted (by hand, a cleanup script) takes every token
            // with it: said, since each client is then refused as unknown.
            let there = app.tokens.path().exists();
            if there != file_there {
                file_there = there;
                let path = app.tokens.path().display();
                if !there {
                    log_line(&format!(
                        "warning: {path} was deleted: no token is accepted until it is back \
                         (restore it, or add tokens with `cairn serve token add`)"
                    ));
                    said_gone = true;
                } else if said_gone {
                    log_line(&format!("{path} is back: its tokens are accepted"));
                    said_gone = false;
                }
            }
            // Its tokens' locks stay meanwhile (a file deleted by mistake and
            // restored must not have ended every running job).
            if !there {
                continue;
            }
            // Console sessions of removed tokens and users (or changed passwords)
            // end now: they stop holding places (QA r13).
            let a = app.clone();
            let _ = tokio::task::spawn_blocking(move || {
                a.signins.retain(|who| match who {
                    signin::Identity::Token(t) => match a.tokens.authenticate(t) {
                        Ok(None) | Err(tokens::TokenError::Expired { .. }) => {
                            Err(signin::TOKEN_GONE)
                        }
                        _ => Ok(()),
                    },
                    signin::Identity::User(name, hash) => match a.users.get(name) {
                        Ok(Some(u)) if &u.hash != hash => Err(signin::USER_GONE),
                        Ok(None) => Err(signin::USER_GONE),
                        _ => Ok(()),
                    },
                })
            })
            .await;
            // An unreadable file is said by the requests it fails.
            let Ok(gone) = app.tokens.removed_since(&mut known) else {
                continue;
            };
            for r in gone {
                // Its uploads end now, and give back the memory they held.
                app.uploads.token_removed(&r.id);
                for ds in app.datastores.values() {
                    if r.datastore != ds.name && r.datastore != tokens::ALL_DATASTORES {
                        continue;
                    }
                    let (d, id) = (ds.clone(), r.id.clone());
                    let deleted = tokio::task::spawn_blocking(move || {
                        locks::delete_locks_of(d.backend.as_ref(), &id)
                    })
                    .await;
                    match deleted {
                        Ok(Ok(names)) if !names.is_empty() => log_line(&format!(
                            "token {:?} was removed: deleted its {} on datastore {}, so that \
                             other jobs do not wait for {} to go stale",
                            r.name,
                            if names.len() == 1 {
                                "lock".to_string()
                            } else {
                                format!("{} locks", names.len())
                            },
                            ds.name,
                            if names.len() == 1 { "it" } else { "them" }
                        )),
                        Ok(Err(e)) => log_line(&format!(
                            "token {:?} was removed, but its locks on datastore {} could not \
                             be deleted ({e}): they go stale 30 minutes after their last refresh",
                            r.name, ds.name
                        )),
                        _ => {}
                    }
                }
            }
        }
    });
}

/// Deletes the locks of client sessions the server stopped hearing from (each
/// working client says it is alive every third of `job_idle_secs`), looking every
/// few seconds. The server gives such a session's job slot to the next in line at
/// once, but its lock stayed: clients queue by locks too (direct clients share the
/// datastore), and a lock held by another machine counts until it is stale, 30
/// minutes after its last refresh (QA: one killed client held every other host's
/// backup for half an hour, and prune's deletions with it). A client that was only
/// cut off, and comes back, finds its lock gone and stops at its next commit
/// point without committing (`cairn_core::repo::lock`): run again, it completes.
fn sweep_lost_sessions(app: &Arc<App>) {
    let app = app.clone();
    tokio::spawn(async move {
        let mut tick = tokio::time::interval(Duration::from_secs(3));
        // The locks of the sessions left from before the start, as they are now
        // (the server listens already: clients can be heard from this moment).
        for ds in app.datastores.values() {
            let d = ds.clone();
            let _ = tokio::task::spawn_blocking(move || read_orphan_locks(&d)).await;
        }
        let since = std::time::Instant::now();
        let orphan_wait = Duration::from_secs(app.config.restart_lock_secs);
        loop {
            tick.tick().await;
            for ds in app.datastores.values() {
                let lost = ds.slots.take_lost().into_iter().map(|l| {
                    let names = ds.owners.take_session(&l.key);
                    let who = format!("token {:?} (host {:?})", l.token_name, l.host);
                    (who, names, false)
                });
                // Sessions that held locks when the server last stopped and were
                // not heard from since its start.
                let orphans = if since.elapsed() >= orphan_wait {
                    ds.owners.take_orphans()
                } else {
                    Vec::new()
                };
                let orphans = orphans.into_iter().map(|(key, names)| {
                    (
                        format!("token {:?}", token_name_of(&app, &key)),
                        names,
                        true,
                    )
                });
                let all: Vec<_> = lost.chain(orphans).collect();
                for (who, names, orphan) in all {
                    if names.is_empty() {
                        continue;
                    }
                    let d = ds.clone();
                    let deleted = tokio::task::spawn_blocking(move || {
                        delete_session_locks(&d, &names, orphan)
                    })
                    .await;
                    let secs = app.config.job_idle_secs;
                    let what = if orphan {
                        format!(
                            "a client of {who} that held locks when the server stopped was not \
                             heard from, nor its locks refreshed, in the {} s after its start \
                             (killed, or cut off)",
                            orphan_wait.as_secs()
                        )
                    } else {
                        format!("a client of {who} went silent for {secs} s (killed, or cut off)")
                    };
                    match deleted {
                        Ok(Ok(0)) => {}
                        Ok(Ok(n)) => log_line(&format!(
                            "{what}: deleted its {} on datastore {}, so that other jobs do not \
                             wait 30 minutes for {} to go stale",
                            if n == 1 {
                                "lock".to_string()
                            } else {
                                format!("{n} locks")
                            },
                            ds.name,
                            if n == 1 { "it" } else { "them" }
                        )),
                        Ok(Err(e)) => log_line(&format!(
                            "{what}, but its locks on datastore {} could not be deleted ({e}): \
                             they go stale 30 minutes after their last refresh",
                            ds.name
                        )),
                        Err(_) => {}
                    }
                }
            }
        }
    });
}

/// The name of the token whose client session is `key` (`<token id>-<session>`),
/// or its id when the token is gone.
fn token_name_of(app: &App, key: &str) -> String {
    // The session part is letters and digits only (`api::session_of`).
    let id = key.rsplit_once('-').map_or(key, |(id, _)| id);
    app.tokens
        .list()
        .ok()
        .and_then(|ts| ts.into_iter().find(|t| t.id == id).map(|t| t.name))
        .unwrap_or_else(|| id.to_string())
}

/// Reads the locks of the client sessions left from before the start (see
/// [`locks::LockOwners::orphan_read`]); one that cannot be read is not deleted.
fn read_orphan_locks(ds: &Datastore) {
    let max = cairn_format::consts::MAX_SMALL_OBJECT_SIZE as u64;
    for n in ds.owners.orphan_locks() {
        match ds.backend.get_bounded(&n, max) {
            Ok(content) => ds.owners.orphan_read(&n, Some(&content)),
            Err(_) => ds.owners.orphan_read(&n, None),
        }
    }
}

/// Deletes the locks `names` of a client session taken for gone; how many there
/// were. With `unless_refreshed` (a session left from before the start), only a
/// lock that holds what it held when the wait began goes: one refreshed since,
/// through this server or another in front of the datastore, has a live client.
fn delete_session_locks(
    ds: &Datastore,
    names: &[String],
    unless_refreshed: bool,
) -> Result<usize, cairn_backend::BackendError> {
    let mut deleted = 0;
    for n in names {
        if unless_refreshed {
            let max = cairn_format::consts::MAX_SMALL_OBJECT_SIZE as u64;
            match ds.backend.get_bounded(n, max) {
                Ok(content) if !ds.owners.orphan_unchanged(n, &content) => continue,
                Ok(_) => {}
                Err(e) if e.is_not_found() => {
                    ds.owners.removed(n);
                    continue;
                }
                Err(e) => return Err(e),
            }
        }
        match ds.backend.delete(n) {
            Ok(()) => deleted += 1,
            Err(e) if e.is_not_found() => {}
            Err(e) => return Err(e),
        }
        ds.owners.removed(n);
    }
    Ok(deleted)
}

/// Says in the log, at start, which tokens and console users name a datastore
/// this server does not serve: a datastore renamed or left out of the settings
/// leaves them refused ("no such datastore") with nothing said on the server.
fn warn_of_grants_without_datastore(app: &App) {
    let served = |d: &str| d == tokens::ALL_DATASTORES || app.datastores.contains_key(d);
    let tokens = app.tokens.list().unwrap_or_default();
    let users = app.users.list().unwrap_or_default();
    let grants = tokens
        .iter()
        .map(|t| ("token", &t.name, &t.datastore))
        .chain(users.iter().map(|u| ("user", &u.name, &u.datastore)));
    for (what, name, ds) in grants.filter(|(_, _, ds)| !served(ds)) {
        let until = if what == "token" {
            "its client is refused until it does"
        } else {
            "it signs in to see nothing until it does"
        };
        log_line(&format!(
            "warning: {what} {name:?} is for datastore {ds:?}, which this server does not \
             serve (check --datastore or the settings file): {until}"
        ));
    }
}

/// Seconds between looks at the certificate's files.
const CERT_CHECK_SECS: u64 = 5;

/// Serves a renewed certificate once its files change (looked at every
/// [`CERT_CHECK_SECS`]), and warns in the log at start and then daily while the
/// served one has expired or is about to.
fn watch_certificate(source: Arc<tls::CertSource>) {
    let warn = |s: &tls::CertSource| {
        if let Some(w) =
            tls::expiry_warning(s.cert_path(), s.not_after(), cairn_core::time::now_unix())
        {
            log_line(&w);
        }
    };
    warn(&source);
    tokio::spawn(async move {
        let mut tick = tokio::time::interval(Duration::from_secs(CERT_CHECK_SECS));
        let mut warned = std::time::Instant::now();
        loop {
            tick.tick().await;
            let s = source.clone();
            let Ok(found) = tokio::task::spawn_blocking(move || s.reload_if_changed()).await else {
                continue;
            };
            match found {
                Some(tls::Reload::Served { fingerprint, .. }) => {
                    log_line(&format!(
                        "TLS certificate {} changed: serving it now (fingerprint {fingerprint})",
                        source.cert_path().display()
                    ));
                    warn(&source);
                    warned = std::time::Instant::now();
                }
                Some(tls::Reload::Refused(e)) => log_line(&format!(
                    "TLS certificate {} changed but cannot be served ({e}); the previous one \
                     still is (tried again every {CERT_CHECK_SECS} s)",
                    source.cert_path().display()
                )),
                Some(tls::Reload::Gone) => log_line(&format!(
                    "warning: the TLS certificate {} or its key is gone (or cannot be looked \
                     at): the one loaded is still served, but the server would not start again \
                     without them",
                    source.cert_path().display()
                )),
                None if warned.elapsed() >= Duration::from_secs(86_400) => {
                    warn(&source);
                    warned = std::time::Instant::now();
                }
                None => {}
            }
        }
    });
}

/// Runs the server until SIGTERM, SIGHUP or SIGINT; `ready` is called once it
/// listens.
/// On the signal it stops accepting, lets running requests finish (up to 30 s),
/// and returns.
pub fn serve(config: ServerConfig, ready: impl FnOnce(&Ready)) -> Result<(), ServerError> {
    let tls = match &config.tls {
        Tls::Files { cert, key } => Some(tls::server_config(cert, key, false)?),
        Tls::SelfSigned => {
            let (c, k) = self_signed_paths(&config.state_dir);
            Some(tls::server_config(&c, &k, true)?)
        }
        Tls::InsecureHttp => None,
    };
    let app = Arc::new(App::open(config)?);
    let rt = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .thread_name("cairn-serve")
        .build()
        .map_err(|e| ServerError::Io(format!("cannot start the server's threads: {e}")))?;
    let r = rt.block_on(run(app, tls, ready));
    // A blocking task still going (a job past its stop, a request's engine call)
    // must not hold the process: what it committed is committed, the rest was not.
    rt.shutdown_timeout(Duration::from_secs(1));
    // Locks of work abandoned there (a job past its budget) are removed now, not
    // left to go stale and hold prune back.
    cairn_core::repo::lock::release_held();
    r
}

async fn run(
    app: Arc<App>,
    tls: Option<(Arc<rustls::ServerConfig>, String, Arc<tls::CertSource>)>,
    ready: impl FnOnce(&Ready),
) -> Result<(), ServerError> {
    let addr = app.config.listen;
    let listener = tokio::net::TcpListener::bind(addr)
        .await
        .map_err(|e| ServerError::Listen {
            addr: addr.to_string(),
            message: e.to_string(),
        })?;
    let local = listener
        .local_addr()
        .map_err(|e| ServerError::Io(e.to_string()))?;
    // The handlers are in place before the server says it listens: a signal sent
    // as soon as it does (a test, a supervisor) stops it cleanly.
    let mut term = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate())
        .map_err(|e| ServerError::Io(e.to_string()))?;
    // SIGHUP (the terminal closed) stops the server as SIGTERM does, running jobs
    // recorded as interrupted and their locks removed, instead of killing it; left
    // alone when ignored (started under nohup).
    let mut hup = if hangup_ignored() {
        None
    } else {
        tokio::signal::unix::signal(tokio::signal::unix::SignalKind::hangup()).ok()
    };
    ready(&Ready {
        addr: local,
        fingerprint: tls.as_ref().map(|t| t.1.clone()),
    });
    if let Some((_, _, source)) = &tls {
        let _ = app.cert.set(source.clone());
        watch_certificate(source.clone());
    }
    warn_of_grants_without_datastore(&app);
    let acceptor = tls.map(|t| tokio_rustls::TlsAcceptor::from(t.0));
    jobs::schedule(&app);
    // A datastore whose storage did not answer at start is served once it does.
    let waiting = app.clone();
    tokio::spawn(async move {
        let mut tick = tokio::time::interval(Duration::from_secs(15));
        loop {
            tick.tick().await;
            for ds in waiting.datastores.values() {
                if ds.ready.load(Ordering::Acquire) {
                    continue;
                }
                let d = ds.clone();
                let read =
                    tokio::task::spawn_blocking(move || read_config_summary(d.backend.as_ref()))
                        .await;
                if let Ok(Ok(summary)) = read {
                    warn_pack_size(&ds.name, &summary, waiting.config.max_object_size);
                    ds.admin_names
                        .store(summary.admin_names(), Ordering::Release);
                    ds.max_jobs
                        .store(summary.max_concurrent_jobs, Ordering::Relaxed);
                    *ds.not_served.lock().unwrap_or_else(|e| e.into_inner()) = None;
                    ds.ready.store(true, Ordering::Release);
                    log_line(&format!(
                        "datastore {}: its storage answers: serving it",
                        ds.name
                    ));
                    content::unlock_from_file(&waiting, &ds.name);
                } else if let Ok(Err(e)) = &read
                    && !e.contains("gave up after")
                    && !e.contains("nothing answers")
                    && !server_may_not_read(e)
                {
                    // It answers, but with no repository or a damaged config: that
                    // is for an admin to fix, and it is said (each time it is tried).
                    log_line(&format!("datastore {}: not served: {e}", ds.name));
                    *ds.not_served.lock().unwrap_or_else(|e| e.into_inner()) = Some(e.clone());
                } else {
                    *ds.not_served.lock().unwrap_or_else(|e| e.into_inner()) = None;
                }
            }
        }
    });
    // Locks of read sessions dropped while a datastore's storage was down are
    // removed once it answers again (until then they would hold prune back).
    tokio::spawn(async {
        let mut tick = tokio::time::interval(Duration::from_secs(15));
        loop {
            tick.tick().await;
            let _ = tokio::task::spawn_blocking(cairn_core::repo::lock::retry_orphaned).await;
        }
    });
    sweep_removed_tokens(&app);
    sweep_lost_sessions(&app);
    for spec in &app.jobs.specs {
        for m in spec.missing_now(&app.config.datastores) {
            log_line(&format!(
                "warning: job {}: {m}: its runs fail until it is there",
                spec.name
            ));
        }
    }
    content::start(&app);
    dedup::warm_all(&app);
    let router = app.router();
    let timeout = Duration::from_secs(app.config.request_timeout_secs);
    let graceful = hyper_util::server::graceful::GracefulShutdown::new();
    let connections = Arc::new(tokio::sync::Semaphore::new(app.config.max_connections));
    let per_address = conns::PerAddress::new(
        app.config.max_connections_per_ip,
        app.config.max_connections,
    );
    loop {
        // A place before accepting: at the bound, new connections wait in the
        // listen backlog until one closes.
        let permit = tokio::select! {
            p = connections.clone().acquire_owned() => match p {
                Ok(p) => p,
                Err(_) => break,
            },
            _ = term.recv() => break,
            _ = hangup(&mut hup) => {
                HUNG_UP.store(true, Ordering::Relaxed);
                break;
            }
            _ = tokio::signal::ctrl_c() => break,
        };
        let (tcp, peer) = tokio::select! {
            r = listener.accept() => match r {
                Ok(x) => x,
                Err(e) => {
                    log_line(&format!("accept: {e}"));
                    tokio::time::sleep(Duration::from_millis(100)).await;
                    continue;
                }
            },
            _ = term.recv() => break,
            _ = hangup(&mut hup) => {
                HUNG_UP.store(true, Ordering::Relaxed);
                break;
            }
            _ = tokio::signal::ctrl_c() => break,
        };
        let Some(place) = per_address.enter_from(peer.ip()) else {
            log_line(&format!(
                "{peer} closed: {} connections from this address already (max_connections_per_ip)",
                app.config.max_connections_per_ip
            ));
            continue;
        };
        let held = (permit, place);
        let _ = tcp.set_nodelay(true);
        // Its answers not yet taken: one left so too long ends it.
        let untaken = Arc::new(conns::Untaken::default());
        let busy = Arc::new(conns::Busy::default());
        let service = logged(
            app.clone(),
            router.clone(),
            timeout,
            peer,
            (untaken.clone(), busy.clone()),
        );
        let builder = connection_builder(app.uploads_paced());
        let stall = app.stall();
        let idle_limit = Duration::from_secs(app.config.connection_idle_secs);
        // Ends the connection when its client takes none of an answer for too
        // long, or when it has had nothing to do for too long (a request the
        // client never makes, or an answer it never reads, holds no place).
        let stalled = async move {
            tokio::select! {
                () = untaken.stalled(stall) => log_line(&format!(
                    "{peer} closed: its client took none of an answer for {} s \
                     (answer_stall_secs)",
                    stall.as_secs()
                )),
                () = busy.idle(&untaken, idle_limit) => log_line(&format!(
                    "{peer} closed: no request for {} s (connection_idle_secs)",
                    idle_limit.as_secs()
                )),
            }
        };
        match &acceptor {
            Some(acc) => {
                let acc = acc.clone();
                let watcher = graceful.watcher();
                tokio::spawn(async move {
                    // rustls reads one record (at most 16 KiB) per call: beneath it, a
                    // buffer takes what the socket holds in one system call (an upload
                    // cost a `recvfrom` per record, 40,000 for 640 MB).
                    let tcp = tokio::io::BufReader::with_capacity(TLS_READ_BUFFER, tcp);
                    // A client that never finishes its handshake is dropped.
                    let tls = match tokio::time::timeout(Duration::from_secs(10), acc.accept(tcp))
                        .await
                    {
                        Ok(Ok(s)) => s,
                        _ => return,
                    };
                    let tls = conns::Watched::new(tls, FIRST_REQUEST_WITHIN, stall);
                    let io = hyper_util::rt::TokioIo::new(tls);
                    let conn = builder.serve_connection_with_upgrades(io, service);
                    tokio::select! {
                        _ = watcher.watch(conn.into_owned()) => {}
                        () = stalled => {}
                    }
                    drop(held);
                });
            }
            None => {
                let tcp = conns::Watched::new(tcp, FIRST_REQUEST_WITHIN, stall);
                let io = hyper_util::rt::TokioIo::new(tcp);
                let conn = builder
                    .serve_connection_with_upgrades(io, service)
                    .into_owned();
                let fut = graceful.watch(conn);
                tokio::spawn(async move {
                    tokio::select! {
                        _ = fut => {}
                        () = stalled => {}
                    }
                    drop(held);
                });
            }
        }
    }
    log_line("stopping: no new connections; waiting up to 30 s for running requests and jobs");
    drop(listener);
    // A dedup view being built (seconds for a large datastore) gives up rather
    // than hold the process after the requests are done.
    for ds in app.datastores.values() {
        ds.dedup.stop();
    }
    // Scheduled jobs stop at their next safe point and are recorded as
    // interrupted; the requests get the same 30 s meanwhile.
    let jobs = app.jobs.cancel_all();
    if jobs > 0 {
        log_line(&format!("stopping {jobs} running job(s)"));
    }
    // One budget for both, under systemd's default stop timeout.
    let deadline = tokio::time::Instant::now() + Duration::from_secs(30);
    let requests_done = tokio::time::timeout_at(deadline, graceful.shutdown())
        .await
        .is_ok();
    while app.jobs.running() > 0 && tokio::time::Instant::now() < deadline {
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    // A job still in an upload that does not end at once: recorded as interrupted.
    app.jobs.record_interrupted();
    let _ = tokio::task::spawn_blocking(cairn_core::repo::lock::retry_orphaned).await;
    if requests_done {
        log_line("stopped");
    } else {
        log_line("stopped with requests still running (their uploads were not committed)");
    }
    Ok(())
}

/// A new connection's first request must begin within this (after TLS); the
/// headers then have `header_read_timeout` (30 s) to arrive.
const FIRST_REQUEST_WITHIN: Duration = Duration::from_secs(30);

/// `paced_uploads`: an upload limit is set ([`App::uploads_paced`]).
fn connection_builder(
    paced_uploads: bool,
) -> hyper_util::server::conn::auto::Builder<hyper_util::rt::TokioExecutor> {
    let mut b = hyper_util::server::conn::auto::Builder::new(hyper_util::rt::TokioExecutor::new());
    // Slow clients: headers must arrive within 30 s of the connection's start.
    b.http1()
        .timer(hyper_util::rt::TokioTimer::new())
        .header_read_timeout(Duration::from_secs(30));
    // A peer that has gone (its connection never closed) is found by pings and
    // its connection freed: connections are counted (`conns`).
    // A path deep in a snapshot travels in the URL: 16 KiB of headers (HTTP/2's
    // default here) refused a directory 34 levels down in the console, which
    // the CLI restores (QA: HTTP 431). HTTP/1.1 already takes about 400 KiB.
    b.http2()
        .timer(hyper_util::rt::TokioTimer::new())
        .keep_alive_interval(Some(Duration::from_secs(60)))
        .keep_alive_timeout(Duration::from_secs(20))
        .max_header_list_size(MAX_HEADER_BYTES)
        // What a stream holds of an answer beyond what its client took: a frame
        // of it (h2's default is 400 KiB a stream; `answers`).
        .max_send_buf_size(H2_SEND_BUFFER);
    if paced_uploads {
        // What a client has handed over of an upload and the server has not
        // read yet drains at the paced rate once the client has sent its last
        // byte, while the client waits for the answer: at most this (hyper's
        // default is 1 MiB: 110 s at 9 KiB/s, past a client's patience when
        // many uploads share a limit: review r39).
        b.http2().initial_stream_window_size(PACED_UPLOAD_WINDOW);
    }
    b
}

/// An HTTP/2 stream's receive window when uploads are paced.
const PACED_UPLOAD_WINDOW: u32 = 256 << 10;

/// The most an HTTP/2 stream buffers of an answer beyond its client's window.
pub(crate) const H2_SEND_BUFFER: usize = pipe::FRAME;

/// The most header bytes a request may carry over HTTP/2.
const MAX_HEADER_BYTES: u32 = 384 << 10;

/// The router wrapped with a per-request timeout and one log line per request.
fn logged(
    app: Arc<App>,
    router: Router,
    timeout: Duration,
    peer: std::net::SocketAddr,
    (untaken, busy): (Arc<conns::Untaken>, Arc<conns::Busy>),
) -> hyper_util::service::TowerToHyperService<
    impl tower::Service<
        axum::http::Request<hyper::body::Incoming>,
        Response = axum::response::Response,
        Error = std::convert::Infallible,
        Future = impl Send,
    > + Clone,
> {
    use tower::ServiceExt;
    let svc = tower::service_fn(move |req: axum::http::Request<hyper::body::Incoming>| {
        let app = app.clone();
        let router = router.clone();
        let untaken = untaken.clone();
        let running = busy.start();
        async move {
            let _running = running;
            let started = Instant::now();
            let method = req.method().clone();
            // With the query (prefix, mode, max): the log says what was asked.
            let path = req
                .uri()
                .path_and_query()
                .map_or_else(|| req.uri().path().to_string(), |p| p.to_string());
            // Only answers to GET are held ([`answers::Answers::hold`]).
            let caller = (req.method() == axum::http::Method::GET)
                .then(|| answers::caller(&app, req.headers(), peer.ip()));
            let expected = answers::expected_weight(req.headers());
            // A body its handler leaves unread is read to its end, so the client
            // gets the refusal (`body::Drained`).
            let req = req.map(|b| axum::body::Body::new(body::Drained::new(b)));
            app.stats.active.fetch_add(1, Ordering::Relaxed);
            let answered = async {
                // Room for the answer before it is made (`Answers::reserve`).
                let early = match &caller {
                    Some(c) => Some(app.answers.reserve(c, expected).await?),
                    None => None,
                };
                let resp = match router.oneshot(req).await {
                    Ok(r) => r,
                    Err(never) => match never {},
                };
                // Held to the budget of answers not yet taken until its client
                // takes it, or refused.
                Ok::<_, axum::response::Response>(match caller {
                    Some(c) => app.answers.hold(c, early, resp, untaken.track()),
                    None => resp,
                })
            };
            let resp = match tokio::time::timeout(timeout, answered).await {
                Ok(Ok(r) | Err(r)) => r,
                Err(_) => axum::response::IntoResponse::into_response(api::ApiError::new(
                    axum::http::StatusCode::REQUEST_TIMEOUT,
                    "timeout",
                    format!("the request took longer than {} s", timeout.as_secs()),
                )),
            };
            app.stats.active.fetch_sub(1, Ordering::Relaxed);
            app.stats.requests.fetch_add(1, Ordering::Relaxed);
            if resp.status().is_server_error() {
                app.stats.errors.fetch_add(1, Ordering::Relaxed);
            }
            log_line(&format!(
                "{peer} {method} {path} {} {:.3}s",
                resp.status().as_u16(),
                started.elapsed().as_secs_f64()
            ));
            Ok::<_, std::convert::Infallible>(resp)
        }
    });
    hyper_util::service::TowerToHyperService::new(svc)
}

/// One line to stderr (journald adds its own time stamps under systemd). A log
/// that cannot be written (a closed pipe, a full disk) is dropped: `eprintln!`
/// would panic in the task serving the request.
pub fn log_line(msg: &str) {
    use std::io::Write;
    let _ = writeln!(
        std::io::stderr().lock(),
        "{} {}",
        cairn_core::time::now_rfc3339(),
        one_line(msg)
    );
}

/// `msg` with its control characters escaped (`\n`, `\u{1b}`): names from
/// requests and snapshots (a file name may hold a newline) must not start a line
/// of their own that reads as the server's (QA r13: a forged "signed in" line).
fn one_line(msg: &str) -> std::borrow::Cow<'_, str> {
    if !msg.chars().any(char::is_control) {
        return msg.into();
    }
    msg.chars()
        .map(|c| {
            if c.is_control() {
                c.escape_default().to_string()
            } else {
                c.to_string()
            }
        })
        .collect::<String>()
        .into()
}

#[cfg(test)]
mod tests {
    #[test]
    fn a_log_line_stays_one_line() {
        assert_eq!(super::one_line("plain / ü"), "plain / ü");
        assert_eq!(
            super::one_line("a\nZ console: signed in\r\x1b[2J\t"),
            "a\\nZ console: signed in\\r\\u{1b}[2J\\t"
        );
    }

    /// docs/openapi.yaml names every route, and no route that does not exist.
    #[test]
    fn the_openapi_file_describes_every_route() {
        let doc = include_str!("../../../docs/openapi.yaml");
        let documented: Vec<&str> = doc
            .lines()
            .filter_map(|l| l.strip_prefix("  /"))
            .filter_map(|l| l.strip_suffix(':'))
            .collect();
        let mut routes: Vec<String> = super::ROUTES
            .iter()
            .map(|r| r.trim_start_matches('/').replace("{*name}", "{name}"))
            .collect();
        routes.sort();
        let mut documented: Vec<String> = documented.iter().map(|s| s.to_string()).collect();
        documented.sort();
        assert_eq!(routes, documented);
    }
}
