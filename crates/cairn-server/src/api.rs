//! The HTTP API (see docs/SERVER.md): the object calls a remote repository needs
//! (list, get with range, create-only and replacing put, delete), each decided by
//! [`crate::policy`] for the caller's token and checked before it reaches the
//! datastore's storage.

use crate::policy::{self, Action, Decision, Kind, Role};
use crate::tokens::TokenEntry;
use crate::{App, Datastore};
use axum::body::Bytes;
use axum::extract::State;
use axum::http::{HeaderMap, StatusCode, header};
use axum::response::{IntoResponse, Response};
use cairn_backend::{BackendError, BackendErrorKind};
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;
use std::sync::Arc;
use std::sync::atomic::Ordering;

/// An error answer: a status and `{"error": kind, "message": text}`.
#[derive(Debug)]
pub struct ApiError {
    pub status: StatusCode,
    pub kind: &'static str,
    pub message: String,
}

#[derive(Serialize, Deserialize)]
pub struct ErrorBody {
    pub error: String,
    pub message: String,
}

impl ApiError {
    pub fn new(status: StatusCode, kind: &'static str, message: impl Into<String>) -> ApiError {
        ApiError {
            status,
            kind,
            message: message.into(),
        }
    }
    fn forbidden(message: impl Into<String>) -> ApiError {
        ApiError::new(StatusCode::FORBIDDEN, "forbidden", message)
    }
    pub(crate) fn bad(message: impl Into<String>) -> ApiError {
        ApiError::new(StatusCode::BAD_REQUEST, "bad_request", message)
    }
}

/// How a storage failure that may heal is said to a client (503 `transient`).
pub(crate) const STORAGE_DOWN: &str = "the datastore's storage does not answer now: ";

impl From<BackendError> for ApiError {
    fn from(e: BackendError) -> ApiError {
        let (status, kind) = match e.kind {
            BackendErrorKind::NotFound => (StatusCode::NOT_FOUND, "not_found"),
            BackendErrorKind::AlreadyExists => (StatusCode::CONFLICT, "already_exists"),
            BackendErrorKind::TooLarge => (StatusCode::PAYLOAD_TOO_LARGE, "too_large"),
            BackendErrorKind::NoSpace => (StatusCode::INSUFFICIENT_STORAGE, "no_space"),
            BackendErrorKind::PermissionDenied => (StatusCode::FORBIDDEN, "forbidden"),
            BackendErrorKind::Transient | BackendErrorKind::Unreachable => {
                // Said in the log too, at most once a minute: an administrator
                // sees why clients get 503s (QA: a stopped S3 server showed nothing).
                static SAID: std::sync::atomic::AtomicI64 = std::sync::atomic::AtomicI64::new(0);
                let now = cairn_core::time::now_unix();
                let last = SAID.load(std::sync::atomic::Ordering::Relaxed);
                if now - last >= 60
                    && SAID
                        .compare_exchange(
                            last,
                            now,
                            std::sync::atomic::Ordering::Relaxed,
                            std::sync::atomic::Ordering::Relaxed,
                        )
                        .is_ok()
                {
                    crate::log_line(&format!(
                        "warning: a datastore's storage does not answer now ({}); its \
                         clients are told so (503) and retry",
                        e.message
                    ));
                }
                return ApiError::new(
                    StatusCode::SERVICE_UNAVAILABLE,
                    "transient",
                    format!("{STORAGE_DOWN}{}", e.message),
                );
            }
            BackendErrorKind::OutOfRange => (StatusCode::RANGE_NOT_SATISFIABLE, "out_of_range"),
            BackendErrorKind::NoRepository => (StatusCode::NOT_FOUND, "no_datastore"),
            BackendErrorKind::NotAFile => (StatusCode::INTERNAL_SERVER_ERROR, "not_an_object"),
            BackendErrorKind::Other => (StatusCode::INTERNAL_SERVER_ERROR, "storage"),
        };
        // Which object (its name in the datastore, never a server path): a bare
        // "No such file or directory (os error 2)" said nothing (QA r16).
        let message = if e.path.is_empty() || e.message.contains(&e.path) {
            e.message
        } else {
            format!("{}: {}", e.path, e.message)
        };
        ApiError::new(status, kind, message)
    }
}

/// The answer to a path no route takes.
pub async fn no_such_call(method: axum::http::Method, uri: axum::http::Uri) -> ApiError {
    ApiError::new(
        StatusCode::NOT_FOUND,
        "not_found",
        format!("no such call: {method} {}", uri.path()),
    )
}

/// The answer to a method a route does not take.
pub async fn method_not_allowed(method: axum::http::Method, uri: axum::http::Uri) -> ApiError {
    ApiError::new(
        StatusCode::METHOD_NOT_ALLOWED,
        "method_not_allowed",
        format!("{} does not take {method}", uri.path()),
    )
}

/// A query string, refused with the API's JSON error (axum's own answer is plain
/// text) when it does not parse: `?max=-1`, a missing field.
pub struct Query<T>(pub T);

impl<T: serde::de::DeserializeOwned, S: Send + Sync> axum::extract::FromRequestParts<S>
    for Query<T>
{
    type Rejection = ApiError;

    async fn from_request_parts(
        parts: &mut axum::http::request::Parts,
        state: &S,
    ) -> Result<Self, ApiError> {
        axum::extract::Query::<T>::from_request_parts(parts, state)
            .await
            .map(|axum::extract::Query(q)| Query(q))
            .map_err(|e| ApiError::bad(format!("the query string: {}", e.body_text())))
    }
}

/// Path parameters, refused with the API's JSON error (axum's own answer is plain
/// text) when they do not decode: a name that is not UTF-8 (`%ff`), say.
pub struct Path<T>(pub T);

impl<T: serde::de::DeserializeOwned + Send, S: Send + Sync> axum::extract::FromRequestParts<S>
    for Path<T>
{
    type Rejection = ApiError;

    async fn from_request_parts(
        parts: &mut axum::http::request::Parts,
        state: &S,
    ) -> Result<Self, ApiError> {
        axum::extract::Path::<T>::from_request_parts(parts, state)
            .await
            .map(|axum::extract::Path(p)| Path(p))
            .map_err(|e| ApiError::bad(format!("the path: {}", e.body_text())))
    }
}

/// A small JSON body read whole (at most [`crate::SMALL_BODY_LIMIT`]): a larger or
/// broken one is refused with the API's JSON error, like every other error.
pub struct SmallBody(pub Bytes);

impl<S: Send + Sync> axum::extract::FromRequest<S> for SmallBody {
    type Rejection = ApiError;

    async fn from_request(req: axum::extract::Request, state: &S) -> Result<Self, ApiError> {
        // A declared length over the limit is refused before any of the body is
        // waited for (a client announcing 1 GB and sending 10 bytes would otherwise
        // hold the request until its timeout).
        let declared = req
            .headers()
            .get(header::CONTENT_LENGTH)
            .and_then(|v| v.to_str().ok())
            .and_then(|v| v.parse::<u64>().ok());
        if declared.is_some_and(|n| n > crate::SMALL_BODY_LIMIT as u64) {
            return Err(ApiError::new(
                StatusCode::PAYLOAD_TOO_LARGE,
                "too_large",
                format!("the body may be at most {} bytes", crate::SMALL_BODY_LIMIT),
            ));
        }
        match Bytes::from_request(req, state).await {
            Ok(b) => Ok(SmallBody(b)),
            Err(e) => {
                let kind = if e.status() == StatusCode::PAYLOAD_TOO_LARGE {
                    "too_large"
                } else {
                    "bad_request"
                };
                Err(ApiError::new(e.status(), kind, e.body_text()))
            }
        }
    }
}

/// Where datastores are on the server, and how an answer names them instead:
/// a client learns the datastore's name, never the server's paths or storage
/// addresses (QA: a restore token saw the repository's directory in an error).
static HIDDEN: std::sync::RwLock<Vec<(String, String)>> = std::sync::RwLock::new(Vec::new());

/// Registers `location` (a datastore's or the state directory's) to be said as
/// `shown` in every error answer.
pub(crate) fn hide_location(location: &str, shown: &str) {
    let mut forms = vec![location.to_string()];
    if let Some(url) = location.strip_prefix("s3:") {
        forms.push(url.to_string());
    } else if let Ok(p) = std::fs::canonicalize(location) {
        forms.push(p.to_string_lossy().into_owned());
    }
    let mut hidden = HIDDEN.write().unwrap_or_else(|e| e.into_inner());
    for f in forms {
        // "/" or "." would eat every path separator or dot.
        if f.len() > 1 && !hidden.iter().any(|(h, _)| *h == f) {
            hidden.push((f, shown.to_string()));
        }
    }
    // Longest first: a datastore inside another's directory is named as itself.
    hidden.sort_by_key(|(h, _)| std::cmp::Reverse(h.len()));
}

/// `message` with every registered location replaced by its name.
pub(crate) fn hide_locations(message: &str) -> String {
    let hidden = HIDDEN.read().unwrap_or_else(|e| e.into_inner());
    let mut out = message.to_string();
    for (h, shown) in hidden.iter() {
        if out.contains(h.as_str()) {
            out = out.replace(h.as_str(), shown);
        }
    }
    out
}

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        let body = serde_json::to_vec(&ErrorBody {
            error: self.kind.to_string(),
            message: hide_locations(&self.message),
        })
        .unwrap_or_default();
        (
            self.status,
            [(header::CONTENT_TYPE, "application/json")],
            body,
        )
            .into_response()
    }
}

type ApiResult<T> = Result<T, ApiError>;

/// The caller, from `Authorization: Bearer <token>`, or `Session <id>` for a
/// console user's session (set by [`crate::signin::cookie_auth`]).
pub(crate) fn authenticate(app: &App, headers: &HeaderMap) -> ApiResult<TokenEntry> {
    let value = headers
        .get(header::AUTHORIZATION)
        .and_then(|v| v.to_str().ok());
    if let Some(id) = value.and_then(|v| v.strip_prefix("Session ")) {
        return session_user(app, id);
    }
    // The scheme's name is case-insensitive (RFC 9110, 11.1).
    let presented = value
        .and_then(|v| v.split_once(' '))
        .filter(|(scheme, _)| scheme.eq_ignore_ascii_case("bearer"))
        .map(|(_, token)| token.trim())
        .ok_or_else(|| {
            ApiError::new(
                StatusCode::UNAUTHORIZED,
                "unauthorized",
                "no token (send Authorization: Bearer <token>)",
            )
        })?;
    token_entry(app, presented)
}

/// The user of console session `id`, as the user file says now.
pub(crate) fn session_user(app: &App, id: &str) -> ApiResult<TokenEntry> {
    let expired = || {
        ApiError::new(
            StatusCode::UNAUTHORIZED,
            "session_expired",
            "the session ended (signed out, unused for too long, or the server restarted): \
             sign in again",
        )
    };
    let Some((crate::signin::Identity::User(name, hash), _)) = app.signins.get(id) else {
        return Err(expired());
    };
    match app.users.get(&name) {
        Ok(Some(u)) if u.hash == hash => Ok(u.principal()),
        // The same name with another password: changed (`user passwd`), or the user
        // removed and added again. Whoever holds this cookie signed in as before.
        Ok(Some(_)) => {
            app.signins.remove(id);
            Err(ApiError::new(
                StatusCode::UNAUTHORIZED,
                "session_expired",
                format!("the password of user {name:?} changed since this sign-in: sign in again"),
            ))
        }
        Ok(None) => {
            app.signins.remove(id);
            Err(ApiError::new(
                StatusCode::UNAUTHORIZED,
                "session_expired",
                format!("user {name:?} was removed: this session ended"),
            ))
        }
        Err(e) => Err(users_unreadable(e)),
    }
}

/// The user file cannot be read (damaged, unreadable): failing closed, the
/// details (the state directory's path) in the server's log, not to a client that
/// may not have signed in.
fn users_unreadable(e: crate::users::UserError) -> ApiError {
    crate::log_line(&format!("console sign-in refused: {e}"));
    ApiError::new(
        StatusCode::SERVICE_UNAVAILABLE,
        "server",
        "console sign-in is unavailable: the server cannot read its user file (its log says \
         why); tokens work",
    )
}

/// The token `presented` stands for, if it is one the server knows.
fn token_entry(app: &App, presented: &str) -> ApiResult<TokenEntry> {
    match app.tokens.authenticate(presented) {
        Ok(Some(t)) => Ok(t),
        Ok(None) => Err(ApiError::new(
            StatusCode::UNAUTHORIZED,
            "unauthorized",
            "unknown or removed token",
        )),
        Err(e @ crate::tokens::TokenError::Expired { .. }) => Err(ApiError::new(
            StatusCode::UNAUTHORIZED,
            "token_expired",
            e.to_string(),
        )),
        // Failing closed; the details (the state directory's path) go to the
        // server's log, not to a client that has not been authenticated.
        Err(e) => {
            crate::log_line(&format!("cannot authenticate: {e}"));
            Err(ApiError::new(
                StatusCode::INTERNAL_SERVER_ERROR,
                "server",
                "the server cannot read its tokens (its log says why)",
            ))
        }
    }
}

/// The datastore a token opens, which must be the one named in the path.
pub(crate) fn datastore(app: &App, token: &TokenEntry, name: &str) -> ApiResult<Arc<Datastore>> {
    if let Some(d) = app.datastores.get(name) {
        d.stats.requests.fetch_add(1, Ordering::Relaxed);
    }
    if !token.opens(name) {
        return Err(ApiError::forbidden(format!(
            "this {} is for datastore {:?}, not {name:?}",
            if token.user { "user" } else { "token" },
            token.datastore
        )));
    }
    let d = app.datastores.get(name).cloned().ok_or_else(|| {
        ApiError::new(
            StatusCode::NOT_FOUND,
            "no_datastore",
            format!("this server has no datastore {name:?}"),
        )
    })?;
    if !d.ready.load(Ordering::Acquire) {
        let why = d
            .not_served
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .clone();
        if let Some(why) = why {
            // Not transient: a client would retry for a minute and a half what
            // only an admin can mend (QA).
            return Err(ApiError::new(
                StatusCode::NOT_FOUND,
                "no_repository",
                format!(
                    "datastore {name} is not served: {why}; this is mended on the server's \
                     storage (an admin's `cairn init` or `check --repo` with the datastore's \
                     path), and the server serves it within 15 s of that"
                ),
            ));
        }
        return Err(ApiError::new(
            StatusCode::SERVICE_UNAVAILABLE,
            "transient",
            format!(
                "datastore {name} is not served yet: its storage did not answer, or held \
                 no valid repository, when last tried (the server's log says which); it \
                 is served once that is mended"
            ),
        ));
    }
    Ok(d)
}

/// Measures again, at most once a minute, the room `store` keeps for forget and
/// prune (its index's size: `cairn_core::repo::room`). A listing that fails
/// leaves the last measure.
async fn measure_room(store: &Arc<crate::Datastore>) {
    {
        let mut measured = store
            .room_measured
            .lock()
            .unwrap_or_else(|e| e.into_inner());
        if measured.is_some_and(|m| m.elapsed() < ROOM_MEASURED_EVERY) {
            return;
        }
        *measured = Some(std::time::Instant::now());
    }
    let s = store.clone();
    let _ = tokio::task::spawn_blocking(move || {
        if let Ok(Some(bytes)) = cairn_core::repo::room::room_for_prune(s.backend.as_ref()) {
            s.room.keep(bytes);
        }
    })
    .await;
}

const ROOM_MEASURED_EVERY: std::time::Duration = std::time::Duration::from_secs(60);

/// Runs blocking work (storage calls, engine sessions) off the async threads.
pub(crate) async fn blocking<T: Send + 'static, E: Into<ApiError> + Send + 'static>(
    f: impl FnOnce() -> Result<T, E> + Send + 'static,
) -> ApiResult<T> {
    match tokio::task::spawn_blocking(f).await {
        Ok(r) => r.map_err(Into::into),
        Err(e) => Err(ApiError::new(
            StatusCode::INTERNAL_SERVER_ERROR,
            "server",
            format!("request failed: {e}"),
        )),
    }
}

#[derive(Serialize)]
pub struct WhoAmI {
    pub name: String,
    pub datastore: String,
    pub role: Role,
    /// The host a host-bound token stores and sees snapshots as.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub host: Option<String>,
    /// Whether the object API lists and serves every snapshot to this token: not
    /// for a host-bound backup or restore token (an admin sees all, host or not).
    /// A client that sees part must not judge what is unused (prune, repair).
    pub sees_every_snapshot: bool,
}

pub async fn whoami(State(app): State<Arc<App>>, headers: HeaderMap) -> ApiResult<Response> {
    let t = authenticate(&app, &headers)?;
    Ok(axum::Json(WhoAmI {
        sees_every_snapshot: t.view_host().is_none(),
        name: t.name,
        datastore: t.datastore,
        role: t.role,
        host: t.host,
    })
    .into_response())
}

#[derive(Deserialize)]
pub struct ListQuery {
    #[serde(default)]
    prefix: String,
}

#[derive(Serialize, Deserialize)]
pub struct ListEntry {
    pub name: String,
    pub size: u64,
}

pub async fn list(
    State(app): State<Arc<App>>,
    Path(ds): Path<String>,
    Query(q): Query<ListQuery>,
    headers: HeaderMap,
) -> ApiResult<Response> {
    let t = authenticate(&app, &headers)?;
    let store = datastore(&app, &t, &ds)?;
    if !policy::valid_prefix(&q.prefix) {
        return Err(ApiError::bad(format!(
            "{:?} is not a listing prefix of a repository",
            q.prefix
        )));
    }
    let backend = store.backend.clone();
    let host = t.view_host().map(str::to_string);
    let s = store.clone();
    let name = ds.clone();
    let items = blocking(move || {
        let listed = backend.list(&q.prefix)?;
        // Nothing listed where the repository itself is gone (its directory
        // deleted, the bucket emptied) is not "no snapshots" (QA r13: `[]` while
        // the config answered 500).
        if listed.is_empty() {
            match backend.size(cairn_backend::names::CONFIG) {
                Ok(_) => {}
                Err(e) if e.is_not_found() => {
                    return Err(ApiError::new(
                        StatusCode::NOT_FOUND,
                        "no_repository",
                        format!(
                            "datastore {name} holds no repository any more (its config is \
                             gone): this is mended on the server's storage"
                        ),
                    ));
                }
                Err(e) => return Err(e.into()),
            }
        }
        match &host {
            // A host-bound token sees only its host's snapshots (`hosts`).
            Some(h) => Ok(s.hosts.filter(backend.as_ref(), listed, h)?),
            None => Ok(listed),
        }
    })
    .await?;
    let out: Vec<ListEntry> = items
        .into_iter()
        .map(|o| ListEntry {
            name: o.name,
            size: o.size,
        })
        .collect();
    Ok(axum::Json(out).into_response())
}

/// Whether the datastore holds an object of that name (none of it read).
async fn exists(store: &Arc<Datastore>, name: String) -> ApiResult<bool> {
    Ok(stored_up_to(store, name, 0).await?.is_some())
}

/// Why a host-bound token is refused the server's records about snapshots.
const RECORDS_HIDDEN: &str = "a host-bound token may not read or change the server's \
     records about snapshots (`hosts/`, `received/`, `forgotten/`), its own host's included: \
     the server keeps them";

/// Decides whether `t` may do `action` to `name` and returns the object's kind.
/// A lock of another token, or one too old to refresh, is refused here too.
fn allow(
    app: &App,
    store: &Datastore,
    t: &TokenEntry,
    name: &str,
    action: Action,
) -> ApiResult<Kind> {
    let kind = policy::classify(name).map_err(|e| ApiError::bad(e.to_string()))?;
    if kind.snapshot_record() && t.host.is_some() && t.role != Role::Admin {
        return Err(ApiError::forbidden(RECORDS_HIDDEN));
    }
    let decision = policy::decide(t.role, kind, action);
    if decision == Decision::Deny {
        // Why, in the terms of the command the user ran: everything else a
        // non-admin token is refused is what those commands do.
        let why = if t.role == Role::Restore && matches!(action, Action::Create | Action::Replace) {
            " (a restore token may only read: backups need a backup or admin token; forget, \
             prune, repair, rewrite, tag, key and config changes an admin token)"
        } else {
            " (forget, prune, repair, rewrite, tag, key and config changes need an admin token)"
        };
        return Err(ApiError::forbidden(format!(
            "a {} token may not {} {name}{why}",
            t.role.as_str(),
            action.verb()
        )));
    }
    if decision == Decision::OwnLockOnly {
        if !crate::locks::owned_by(name, &t.id) {
            return Err(ApiError::forbidden(format!(
                "{name} does not belong to this token (its locks' ids start with {})",
                hex::encode(cairn_backend::lock_owner_prefix(&t.id))
            )));
        }
        // Created again after a removal, a lock keeps its age: prune waits for
        // locks by id. Only writes are remembered (a removal or a read of a name
        // never stored would otherwise grow the record).
        if matches!(action, Action::Create | Action::Replace)
            && let age = store.owners.written(name)
            && age > app.config.max_lock_age_hours as i64 * 3600
        {
            return Err(ApiError::forbidden(format!(
                "{name} is {} hours old, more than the {} a {} token's lock may live",
                age / 3600,
                app.config.max_lock_age_hours,
                t.role.as_str()
            )));
        }
    }
    let writes = matches!(action, Action::Create | Action::Replace | Action::Delete);
    if writes && t.role != Role::Admin && !store.admin_names.load(Ordering::Acquire) {
        return Err(ApiError::forbidden(format!(
            "datastore {:?} was created before cairn marked admin objects by name, so \
             the server cannot keep a {} token from hiding data: only admin tokens may \
             write to it (see docs/SERVER.md, \"Older datastores\")",
            store.name,
            t.role.as_str()
        )));
    }
    Ok(kind)
}

#[derive(Deserialize)]
pub struct GetQuery {
    max: Option<u64>,
}

pub async fn get(
    State(app): State<Arc<App>>,
    Path((ds, name)): Path<(String, String)>,
    Query(q): Query<GetQuery>,
    headers: HeaderMap,
) -> ApiResult<Response> {
    let t = authenticate(&app, &headers)?;
    let store = datastore(&app, &t, &ds)?;
    let kind = allow(&app, &store, &t, &name, Action::Read)?;
    heard(&store, &t, &headers);
    if let (Some(host), Kind::Snapshot) = (t.view_host(), kind) {
        let (s, id) = (
            store.clone(),
            policy::id_of(&name).unwrap_or("").to_string(),
        );
        let owner = blocking(move || s.hosts.host_of(s.backend.as_ref(), &id)).await?;
        if owner.as_deref() != Some(host) {
            // As if absent: a host-bound token does not learn other hosts' snapshots.
            return Err(ApiError::new(
                StatusCode::NOT_FOUND,
                "not_found",
                format!("{name}: no such snapshot for host {host:?}"),
            ));
        }
    }
    let range = match headers.get(header::RANGE) {
        Some(v) => Some(parse_range(v.to_str().unwrap_or(""))?),
        None => None,
    };
    let backend = store.backend.clone();
    // A large object or range of one that never changes under its name is sent
    // a piece at a time: read whole, each slow reader held it in memory (QA r13:
    // 20 readers at 5 KiB/s took the server from 47 to 378 MB, and a paced one
    // waited 15 s for its first byte; audit r33: 60 readers of a whole pack's
    // range that never took it, 1 GB).
    let immutable = matches!(
        kind,
        Kind::Pack | Kind::Index | Kind::AdminIndex | Kind::Snapshot
    );
    // Pieces of a datastore on object storage are larger: each is a request.
    let piece = if store.remote {
        4 * STREAM_PIECE
    } else {
        STREAM_PIECE
    };
    if immutable && range.is_none_or(|(_, len)| len > piece) {
        let (b, n) = (backend.clone(), name.clone());
        let size = blocking(move || b.size(&n)).await;
        if name.starts_with(cairn_backend::names::INDEX)
            && matches!(&size, Err(e) if e.kind == "not_found")
        {
            store.dedup.index_file_missing(&name);
        }
        let size = size?;
        match range {
            None => {
                if let Some(max) = q.max
                    && size > max
                {
                    return Err(
                        cairn_backend::BackendError::too_large("get", &name, size, max).into(),
                    );
                }
                if size > piece {
                    return stream_object(&app, &store, &t.id, name, (0, size), piece, false).await;
                }
            }
            // A range past the object's end is refused below, as any range.
            Some((off, len)) if off.checked_add(len).is_some_and(|end| end <= size) => {
                return stream_object(&app, &store, &t.id, name, (off, len), piece, true).await;
            }
            Some(_) => {}
        }
    }
    let n = name.clone();
    // A range goes into a kept buffer: a restore reads thousands of a few MiB.
    let answer = range.map(|(_, len)| app.bodies.for_answer(len));
    let got = blocking(move || match (range, answer, q.max) {
        (Some((off, len)), Some(mut b), _) => backend
            .get_range_into(&n, off, len, &mut b)
            .map(|()| Bytes::from_owner(b)),
        (Some((off, len)), None, _) => backend.get_range(&n, off, len).map(Bytes::from),
        (None, _, Some(max)) => backend.get_bounded(&n, max).map(Bytes::from),
        (None, _, None) => backend.get(&n).map(Bytes::from),
    })
    .await;
    // An index file gone (a prune that did not go through this server): the dedup
    // view may still name it, and the client that asks the plan again after this
    // must get one built anew.
    if name.starts_with(cairn_backend::names::INDEX)
        && matches!(&got, Err(e) if e.kind == "not_found")
    {
        store.dedup.index_file_missing(&name);
    }
    let data: Bytes = got?;
    app.stats
        .bytes_out
        .fetch_add(data.len() as u64, Ordering::Relaxed);
    store
        .stats
        .bytes_out
        .fetch_add(data.len() as u64, Ordering::Relaxed);
    let status = if range.is_some() {
        StatusCode::PARTIAL_CONTENT
    } else {
        StatusCode::OK
    };
    if app.downloads_paced() {
        return Ok(paced_answer(&app, &t.id, data, status));
    }
    Ok((
        status,
        [(header::CONTENT_TYPE, "application/octet-stream")],
        data,
    )
        .into_response())
}

/// `data` answered a frame at a time, each paced by the download limits, with
/// its length said first ([`App::downloads_paced`]).
fn paced_answer(app: &Arc<App>, token: &str, data: Bytes, status: StatusCode) -> Response {
    let len = data.len() as u64;
    let (tx, body) = crate::pipe::pipe(1, app.stall());
    let (app, token) = (app.clone(), token.to_string());
    tokio::spawn(async move {
        if send_paced(&app, &token, &tx, data).await.is_ok() {
            let _ = tx.end().await;
        }
    });
    piped_answer(body, status, len, len)
}

/// The answer whose `len` bytes of object data come through the pipe `body`,
/// holding `weight` of the server's memory at most ([`crate::answers`]).
fn piped_answer(
    body: crate::pipe::PipeBody,
    status: StatusCode,
    len: u64,
    weight: u64,
) -> Response {
    let mut r = Response::new(axum::body::Body::new(body));
    r.extensions_mut().insert(crate::answers::Weight(weight));
    *r.status_mut() = status;
    let h = r.headers_mut();
    h.insert(
        header::CONTENT_TYPE,
        axum::http::HeaderValue::from_static("application/octet-stream"),
    );
    h.insert(header::CONTENT_LENGTH, axum::http::HeaderValue::from(len));
    r
}

/// Sends `data` into `tx`: whole when downloads are not paced, else a frame at
/// a time, each waiting for the limits first.
async fn send_paced(
    app: &App,
    token: &str,
    tx: &crate::pipe::PipeTx,
    data: Bytes,
) -> Result<(), crate::pipe::Stop> {
    if !app.downloads_paced() {
        return tx.send(data).await;
    }
    let (mut rest, frame) = (data, app.download_frame());
    while !rest.is_empty() {
        let frame = rest.split_to(rest.len().min(frame));
        app.pace_transfer(token, false, frame.len() as u64).await;
        tx.send(frame).await?;
    }
    Ok(())
}

/// What a whole object larger than this is sent in: pieces read as the client
/// takes them.
const STREAM_PIECE: u64 = 1 << 20;

/// Answers `size` bytes at `start` of object `name` (immutable: a pack, an
/// index file, a snapshot) a `piece` at a time, paced per frame, so that a
/// reader holds about two pieces of the server's memory however slow it is;
/// `partial`: a range was asked for (206). The first piece is read before the
/// answer starts, so that a pack gone or damaged at once is answered with its
/// status as before (review r34); a read that fails later ends the answer short
/// of its `Content-Length`: the client sees a broken transfer, never a short
/// object. A client that takes nothing for [`App::stall`] is given up
/// ([`crate::pipe`]: over HTTP/2 a stream can stall while its connection goes on).
async fn stream_object(
    app: &Arc<App>,
    store: &Arc<Datastore>,
    token: &str,
    name: String,
    (start, size): (u64, u64),
    piece: u64,
    partial: bool,
) -> Result<Response, ApiError> {
    let first_len = piece.min(size);
    let first = read_piece(app, store, &name, start, first_len).await?;
    let (tx, body) = crate::pipe::pipe(1, app.stall());
    let (app, store, token) = (app.clone(), store.clone(), token.to_string());
    tokio::spawn(async move {
        let (mut data, mut off) = (first, first_len);
        loop {
            let len = data.len() as u64;
            app.stats.bytes_out.fetch_add(len, Ordering::Relaxed);
            store.stats.bytes_out.fetch_add(len, Ordering::Relaxed);
            match send_paced(&app, &token, &tx, data).await {
                Ok(()) => {}
                Err(crate::pipe::Stop::Gone) => return,
                Err(crate::pipe::Stop::Stalled(after)) => {
                    crate::log_line(&format!(
                        "datastore {}: sending {name}: the client took none of it for {} s; \
                         given up",
                        store.name,
                        after.as_secs()
                    ));
                    return;
                }
            }
            if off == size {
                break;
            }
            let len = piece.min(size - off);
            data = match read_piece(&app, &store, &name, start + off, len).await {
                Ok(d) => d,
                Err(e) => {
                    let e = e.message;
                    crate::log_line(&format!("datastore {}: sending {name}: {e}", store.name));
                    tx.fail(std::io::Error::other(e)).await;
                    return;
                }
            };
            off += len;
        }
        let _ = tx.end().await;
    });
    let status = if partial {
        StatusCode::PARTIAL_CONTENT
    } else {
        StatusCode::OK
    };
    // What it holds at once: the piece being sent, one in the pipe, the next
    // being read.
    Ok(piped_answer(body, status, size, size.min(3 * piece)))
}

/// `len` bytes at `at` of object `name`, in a kept buffer (as a restore's
/// ranges are).
async fn read_piece(
    app: &App,
    store: &Datastore,
    name: &str,
    at: u64,
    len: u64,
) -> ApiResult<Bytes> {
    let (b, n) = (store.backend.clone(), name.to_string());
    let mut buf = app.bodies.for_answer(len);
    let buf = blocking(move || b.get_range_into(&n, at, len, &mut buf).map(|()| buf)).await?;
    Ok(Bytes::from_owner(buf))
}

/// `bytes=START-END` (inclusive end) into offset and length. `bytes=START-` with
/// an empty end is refused: a client always knows what it wants.
pub(crate) fn parse_range(v: &str) -> ApiResult<(u64, u64)> {
    let bad = || ApiError::bad(format!("unsupported Range {v:?} (use bytes=START-END)"));
    let spec = v.strip_prefix("bytes=").ok_or_else(bad)?;
    let (a, b) = spec.split_once('-').ok_or_else(bad)?;
    let start: u64 = a.parse().map_err(|_| bad())?;
    let end: u64 = b.parse().map_err(|_| bad())?;
    if end < start {
        // An empty range (length 0) is written as START-(START-1).
        if end.checked_add(1) == Some(start) {
            return Ok((start, 0));
        }
        return Err(bad());
    }
    // `0-18446744073709551615` is 2^64 bytes: more than any object, so past its
    // end (416) as any range too long is; it must not wrap to an empty one.
    Ok((start, (end - start).saturating_add(1)))
}

#[derive(Deserialize)]
pub struct PutQuery {
    /// `new` (create-only, the default) or `replace`.
    #[serde(default)]
    mode: Option<String>,
}

pub async fn put(
    State(app): State<Arc<App>>,
    Path((ds, name)): Path<(String, String)>,
    Query(q): Query<PutQuery>,
    headers: HeaderMap,
    body: axum::body::Body,
) -> ApiResult<Response> {
    // Token, datastore, policy and size first: a body is read only for a request
    // that may store it, and never beyond what its kind may be.
    let t = authenticate(&app, &headers)?;
    let store = datastore(&app, &t, &ds)?;
    let action = match q.mode.as_deref() {
        None | Some("new") => Action::Create,
        Some("replace") => Action::Replace,
        Some(m) => return Err(ApiError::bad(format!("unknown put mode {m:?}"))),
    };
    // A lock's write is remembered in the state directory (a file write under
    // the lock records' mutex): off the async threads, which it would stall for
    // every other request they serve (audit r33 #4).
    let kind = if name.starts_with(cairn_backend::names::LOCKS) {
        let (a, st, tk, n) = (app.clone(), store.clone(), t.clone(), name.clone());
        blocking(move || allow(&a, &st, &tk, &n, action)).await?
    } else {
        allow(&app, &store, &t, &name, action)?
    };
    heard(&store, &t, &headers);
    let max = kind.max_size(app.config.max_object_size);
    // `n`: the announced length; none for a body sent without one (chunked)
    // that went on past the limit.
    let too_large = |n: Option<u64>| {
        let sent = n.map_or_else(|| "the body sent".to_string(), |n| format!("{n} bytes"));
        ApiError::new(
            StatusCode::PAYLOAD_TOO_LARGE,
            "too_large",
            format!(
                "{name}: {sent} is more than the {max} bytes allowed{}",
                pack_hint(kind)
            ),
        )
    };
    let length = headers
        .get(header::CONTENT_LENGTH)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.parse::<u64>().ok());
    if let Some(len) = length
        && len > max
    {
        return Err(too_large(Some(len)));
    }
    if kind == Kind::Index && action == Action::Create {
        refuse_copy_of_admin_index(&store, &name).await?;
    }
    // A new lock of a non-admin token: within its cap. A refresh of a name not
    // stored is a new lock too (QA: 1,000 locks stored as "refreshes").
    let new_lock = kind == Kind::Lock
        && t.role != Role::Admin
        && match action {
            Action::Create => true,
            Action::Replace => stored_up_to(&store, name.clone(), 1).await?.is_none(),
            _ => false,
        };
    // A write that needs a job slot is refused before any of the upload budget is
    // reserved or a body read: a client without one (or without a session) must
    // not hold memory others wait for. (Checked again after the body: a slot can
    // lapse during a long upload.)
    if t.role != Role::Admin && action == Action::Create && kind.needs_job_slot() {
        need_slot(&store, &t, &headers)?;
    }
    // Held until the body is stored (see `body::UploadBudget`). A wait of more
    // than a few seconds is logged: the token's (or everyone's) uploads fill the
    // memory set aside for bodies, and an admin looking at a slow client should
    // see why. The request's timeout bounds the wait.
    let admin = t.role == Role::Admin;
    let reserve = app.uploads.reserve(&t.id, admin, length.unwrap_or(max));
    tokio::pin!(reserve);
    let reserved = match tokio::time::timeout(UPLOAD_WAIT_LOGGED, &mut reserve).await {
        Ok(r) => r,
        Err(_) => {
            crate::log_line(&format!(
                "token {:?}: an upload of {} to datastore {:?} waits for room in the \
                 memory for uploads being received (this token's other uploads, or \
                 everyone's, fill it)",
                t.name,
                length.map_or_else(|| "unknown size".to_string(), |l| format!("{l} bytes")),
                store.name
            ));
            reserve.await
        }
    };
    let mut memory = reserved
        .ok_or_else(|| ApiError::new(StatusCode::SERVICE_UNAVAILABLE, "transient", "stopping"))?;
    // Paced as it is received (`BodyPool::read`).
    let (paced, token_id) = (app.clone(), t.id.clone());
    let pace = move |n: u64| paced.pace(&token_id, true, n);
    let pace = app
        .uploads_paced()
        .then_some(&pace as &(dyn Fn(u64) -> std::time::Duration + Send + Sync));
    let body = match app
        .bodies
        .read(body, max, length, Some(&mut memory), pace)
        .await
    {
        Ok(b) => b,
        Err(crate::body::ReadError::TooLarge) => return Err(too_large(None)),
        Err(crate::body::ReadError::Busy) => {
            crate::log_line(&format!(
                "token {:?}: an upload to datastore {:?} was ended after waiting {} s for \
                 room in the memory for uploads being received (the client sends it again)",
                t.name,
                store.name,
                crate::body::GROW_WAIT.as_secs()
            ));
            return Err(ApiError::new(
                StatusCode::SERVICE_UNAVAILABLE,
                "transient",
                format!(
                    "{name}: the server's memory for uploads being received is full; \
                     send it again later"
                ),
            ));
        }
        Err(crate::body::ReadError::Stalled(e)) => {
            return Err(ApiError::new(
                StatusCode::REQUEST_TIMEOUT,
                "timeout",
                format!("{name}: the upload stalled: {e}"),
            ));
        }
        Err(crate::body::ReadError::Broken(e)) => {
            return Err(ApiError::bad(format!("{name}: the upload broke off: {e}")));
        }
    };
    app.stats
        .bytes_in
        .fetch_add(body.len() as u64, Ordering::Relaxed);
    store
        .stats
        .bytes_in
        .fetch_add(body.len() as u64, Ordering::Relaxed);
    check_body(kind, &name, &body, app.config.max_object_size)?;
    let list = if kind == Kind::DedupList {
        Some(check_dedup_list(&store, &t, &name, &body).await?)
    } else {
        None
    };
    if t.role != Role::Admin && action == Action::Create && kind.needs_job_slot() {
        need_slot(&store, &t, &headers)?;
    }
    if kind == Kind::Snapshot && t.role != Role::Admin {
        // The records first: a crash between them and the snapshot leaves records
        // without a snapshot (ignored), never a host-bound snapshot its host
        // cannot see, or one without its time of arrival.
        //
        // A snapshot already stored (by another token, or a direct client) gets
        // no record from storing its bytes again: that would move it into this
        // host's listing and retention, or make it look stored just now.
        if exists(&store, name.clone()).await? {
            return Err(ApiError::new(
                StatusCode::CONFLICT,
                "already_exists",
                format!("{name} exists"),
            ));
        }
        // A snapshot a key holder forgot stays forgotten: a hijacked client
        // that saved its bytes cannot bring it back (an admin still can).
        let record = cairn_backend::names::forgotten_record(policy::id_of(&name).unwrap_or(""));
        if exists(&store, record).await? {
            return Err(ApiError::forbidden(format!(
                "{name} was forgotten (`cairn forget`, or replaced by tag, rewrite or repair): \
                 only an admin token may store it again"
            )));
        }
        let id = policy::id_of(&name).unwrap_or("").to_string();
        if let Some(host) = &t.host {
            let (s, id, h) = (store.clone(), id.clone(), host.clone());
            if !blocking(move || s.hosts.record(s.backend.as_ref(), &id, &h)).await? {
                return Err(ApiError::forbidden(format!(
                    "{name} is recorded for another host"
                )));
            }
        }
        // When it arrived, by this server's clock: retention does not let a
        // snapshot stored after a newer one of its group take that one's place
        // (`cairn_core::forget`), so a hijacked client cannot date junk into past
        // days to push its host's real backups out.
        let b = store.backend.clone();
        blocking(move || crate::hosts::record_received(b.as_ref(), &id)).await?;
    }
    let is_lock = matches!(kind, Kind::Lock | Kind::AdminLock);
    // What adds data leaves the room a prune needs; an admin's writes may use it
    // (its prune repacks before it deletes). Index files, dedup lists and
    // snapshots too: a backup token filled the room with junk index files once
    // packs were refused (QA). Not locks: a restore must still be able to take
    // one on a full disk, and a token's locks are few and small (`make_room_for_lock`,
    // `MAX_LOCK_SIZE`: 4 MiB at most).
    let adds = matches!(
        kind,
        Kind::Pack | Kind::Index | Kind::DedupList | Kind::Snapshot
    );
    let room =
        (adds && t.role != Role::Admin && action == Action::Create).then(|| store.room.clone());
    if room.is_some() {
        measure_room(&store).await;
    }
    let backend = store.backend.clone();
    let n = name.clone();
    let (s, token_id) = (store.clone(), t.id.clone());
    let non_admin_lock = kind == Kind::Lock && t.role != Role::Admin;
    let (at_cap, removed) = blocking(move || {
        let _claim = match &room {
            Some(room) => Some(room.claim(backend.as_ref(), &n, body.len() as u64, 0)?),
            None => None,
        };
        // Counted with the write, one at a time per datastore: parallel
        // requests each found room for one more when it was counted before.
        let _creating =
            new_lock.then(|| s.owners.creating.lock().unwrap_or_else(|e| e.into_inner()));
        let mut removed = Vec::new();
        if new_lock {
            let (held, gone) =
                crate::locks::make_room_for_lock(backend.as_ref(), &s.owners, &token_id)?;
            removed = gone;
            if held >= crate::locks::MAX_LOCKS_PER_TOKEN {
                return Ok::<_, BackendError>((Some(held), removed));
            }
        }
        match action {
            Action::Replace => backend.put(&n, &body),
            _ if is_lock => {
                // Locks are named at random by their holder, not by content:
                // create means "no lock of that name yet", so nobody takes over
                // another's.
                let max = cairn_format::consts::MAX_SMALL_OBJECT_SIZE as u64;
                match backend.get_bounded(&n, max) {
                    Err(e) if e.is_not_found() => backend.put(&n, &body),
                    Err(e) if e.kind != BackendErrorKind::TooLarge => Err(e),
                    _ => Err(BackendError::already_exists("put", &n)),
                }
            }
            _ => backend.put_new(&n, &body),
        }?;
        if non_admin_lock {
            s.owners.saw(&n, &body);
        }
        Ok((None, removed))
    })
    .await?;
    if !removed.is_empty() {
        crate::log_line(&format!(
            "token {:?}: removed {} of its locks on datastore {:?} unchanged for {} \
             minutes (left by processes that ended without removing them), to make room \
             for a new one",
            t.name,
            removed.len(),
            store.name,
            crate::locks::GONE_AFTER_SECS / 60
        ));
    }
    if let Some(held) = at_cap {
        return Err(too_many_locks(&store, held));
    }
    if is_lock {
        store.dedup.lock_written();
        // Whose it is: deleted if that client goes silent (`sweep_lost_sessions`).
        // (Off the async workers: it may rewrite the lock state file.)
        if let Ok(key) = session_key(&t, &headers) {
            let (s, n) = (store.clone(), name.clone());
            let _ = tokio::task::spawn_blocking(move || s.owners.made_by(&key, &n)).await;
        }
    }
    if kind == Kind::Config {
        reread_config(&store).await;
    }
    if let Some((index_name, list)) = list {
        store.dedup.list_stored(&index_name, &list);
    }
    if kind == Kind::Index {
        store.dedup.index_stored(&name, &t.id);
    }
    if !matches!(kind, Kind::Pack | Kind::DedupList) && !is_lock {
        store.content.changed();
    }
    if kind == Kind::Snapshot
        && let Ok(key) = session_key(&t, &headers)
    {
        store
            .slots
            .stored_snapshot(&key, policy::id_of(&name).unwrap_or(""));
    }
    Ok(StatusCode::CREATED.into_response())
}

fn too_many_locks(store: &Datastore, held: usize) -> ApiError {
    ApiError::new(
        StatusCode::TOO_MANY_REQUESTS,
        "too_many_locks",
        format!(
            "this token holds {held} locks on datastore {:?}, the most one token may hold \
             at once: wait for its other commands to end; `cairn unlock` removes those of \
             commands that were killed (at once on the machine that ran them, else once \
             they are 30 minutes old), and the server removes them at 35",
            store.name
        ),
    )
}

/// Whether `name` is stored, and how large, found without reading more than
/// `need` bytes of it (an honest, large enough object is not read at all): `None`
/// when it is not stored, its size when smaller than `need`, else `need`.
async fn stored_up_to(store: &Arc<Datastore>, name: String, need: u64) -> ApiResult<Option<u64>> {
    let backend = store.backend.clone();
    blocking(
        move || match backend.get_bounded(&name, need.saturating_sub(1)) {
            Ok(small) => Ok(Some((small.len() as u64).min(need))),
            Err(e) if e.kind == BackendErrorKind::TooLarge => Ok(Some(need)),
            Err(e) if e.is_not_found() => Ok(None),
            Err(e) => Err(e),
        },
    )
    .await
}

/// The fewest bytes an index file spends on one entry: its blob id alone is 32
/// (random, so it does not compress).
const MIN_INDEX_ENTRY_BYTES: u64 = 32;

/// Refuses a plain index file whose admin-named twin is stored. The bytes of
/// `index/admin-X` also pass as `index/X` (the name is their hash), but under the
/// plain name its supersede list is ignored, so readers would see again what it
/// retired, and the server would have two files of one id (docs/SERVER.md).
async fn refuse_copy_of_admin_index(store: &Arc<Datastore>, name: &str) -> ApiResult<()> {
    let Some(id) = policy::id_of(name) else {
        return Ok(());
    };
    let admin = cairn_backend::names::admin_index(id);
    if exists(store, admin).await? {
        return Err(ApiError::new(
            StatusCode::CONFLICT,
            "already_exists",
            format!("{name} is stored already, as an admin index file"),
        ));
    }
    Ok(())
}

/// A dedup list from a non-admin token must describe a plain index file that is
/// stored, with no supersede list: such a list can only add ids, and only an admin
/// may describe a file that removes some (docs/FORMAT.md, "Dedup lists"). Returns
/// the index file's name and the list.
async fn check_dedup_list(
    store: &Arc<Datastore>,
    t: &TokenEntry,
    name: &str,
    body: &[u8],
) -> ApiResult<(String, cairn_format::dedup::DedupList)> {
    let list = cairn_format::dedup::DedupList::decode(body)
        .map_err(|e| ApiError::bad(format!("{name}: {e}")))?;
    let hex_id = hex::encode(list.index.0);
    let index_name = if list.admin {
        cairn_backend::names::admin_index(&hex_id)
    } else {
        cairn_backend::names::index(&hex_id)
    };
    if t.role != Role::Admin && (list.admin || !list.supersedes.is_empty()) {
        return Err(ApiError::forbidden(format!(
            "a {} token may not describe an index file that supersedes others",
            t.role.as_str()
        )));
    }
    // Only the token that stored the index file through this server (in this
    // run) describes it; a file whose writer is not known here (stored before
    // a restart, or through another server) gets its list from an admin only
    // (QA: after a restart, another backup token could describe a victim's
    // index file, and queries then answered "stored" for what it named). The
    // client that stored it goes on without the list: its chunks count as
    // unknown until an admin's next index rewrite.
    let writer_check = || -> ApiResult<()> {
        if t.role == Role::Admin {
            return Ok(());
        }
        match store.dedup.writer_of(&index_name) {
            Some(writer) if writer == t.id => Ok(()),
            Some(_) => Err(ApiError::forbidden(format!(
                "{index_name} was stored by another token: only its writer describes it"
            ))),
            None => Err(ApiError::forbidden(format!(
                "{index_name} was not stored through this server since it started: \
                 only an admin token describes it"
            ))),
        }
    };
    // The index file must be large enough to list that many blobs and packs: the
    // server keeps every listed id (and pack) in memory and holds the packs
    // against the datastore's at every plan, and a list naming millions of them
    // for a tiny index file would cost it that for nothing stored.
    let entries = match &list.packs {
        Some(packs) => packs.iter().map(|p| p.ids.len() + 1).sum::<usize>(),
        None => list.ids.len(),
    };
    let need = (entries as u64).saturating_mul(MIN_INDEX_ENTRY_BYTES);
    match stored_up_to(store, index_name.clone(), need).await? {
        None => Err(ApiError::new(
            StatusCode::CONFLICT,
            "no_index_file",
            format!("{name}: {index_name} is not stored (a list follows its index file)"),
        )),
        Some(_) if let Err(e) = writer_check() => Err(e),
        Some(size) if size < need => Err(ApiError::new(
            StatusCode::UNPROCESSABLE_ENTITY,
            "content_mismatch",
            format!(
                "{name}: names {entries} chunks and packs, more than {index_name} ({size} \
                 bytes) can list"
            ),
        )),
        Some(_) => Ok((index_name, list)),
    }
}

/// Notes that the client behind a request is alive (its claims on chunks and its
/// job slot stand).
fn heard(store: &Datastore, t: &TokenEntry, headers: &HeaderMap) {
    if let Ok(key) = session_key(t, headers) {
        store.dedup.touch(&key);
        store.slots.touch(&key);
        store.owners.heard(&key);
    }
}

/// How long an upload waits for the upload budget before the log says so.
const UPLOAD_WAIT_LOGGED: std::time::Duration = std::time::Duration::from_secs(5);

/// A non-admin write of data, an index file, a list or a snapshot: its session must
/// hold a job slot ([`crate::slots`]).
fn need_slot(store: &Datastore, t: &TokenEntry, headers: &HeaderMap) -> ApiResult<()> {
    let key = session_key(t, headers).map_err(|_| no_slot(store))?;
    if store.slots.holds(&key) {
        Ok(())
    } else {
        Err(no_slot(store))
    }
}

fn no_slot(store: &Datastore) -> ApiError {
    ApiError::new(
        StatusCode::TOO_MANY_REQUESTS,
        "no_job_slot",
        format!(
            "this session holds no job slot on datastore {:?} (at most {} jobs write at \
             once): ask with POST /v1/datastores/{}/slots and X-Cairn-Session",
            store.name,
            store.max_jobs.load(Ordering::Relaxed),
            store.name
        ),
    )
}

/// An admin replaced the config: its job limit may have changed.
async fn reread_config(store: &Arc<Datastore>) {
    let s = store.clone();
    if let Ok(Ok(summary)) =
        blocking(move || Ok::<_, ApiError>(crate::read_config_summary(s.backend.as_ref()))).await
    {
        store
            .max_jobs
            .store(summary.max_concurrent_jobs, Ordering::Relaxed);
    }
}

/// The caller's session as the dedup service and the job slots know it: the token's
/// id and the client's `X-Cairn-Session`.
fn session_key(t: &TokenEntry, headers: &HeaderMap) -> ApiResult<String> {
    Ok(format!("{}-{}", t.id, session_of(headers)?))
}

/// `X-Cairn-Session`: names a client's claims (any short token of its choosing).
fn session_of(headers: &HeaderMap) -> ApiResult<String> {
    let s = headers
        .get("x-cairn-session")
        .and_then(|v| v.to_str().ok())
        .unwrap_or("");
    if s.is_empty() || s.len() > 64 || !s.bytes().all(|b| b.is_ascii_alphanumeric()) {
        return Err(ApiError::bad(
            "this request needs X-Cairn-Session: 1 to 64 letters or digits",
        ));
    }
    Ok(s.to_string())
}

/// The token and datastore of a dedup call: backup and admin tokens (a query
/// claims chunks, which only a writer needs).
fn dedup_caller(
    app: &App,
    headers: &HeaderMap,
    ds: &str,
    writer: bool,
) -> ApiResult<(TokenEntry, Arc<Datastore>)> {
    let t = authenticate(app, headers)?;
    let store = datastore(app, &t, ds)?;
    if writer && t.role == Role::Restore {
        return Err(ApiError::forbidden(
            "a restore token may not send dedup queries (they are for backups)",
        ));
    }
    if writer && !store.admin_names.load(Ordering::Acquire) {
        // Its plain index files may supersede others: the lists cannot be trusted.
        return Err(unavailable(
            "the datastore predates admin names (docs/SERVER.md)".into(),
        ));
    }
    Ok((t, store))
}

/// A query or confirmation: its caller (a writer), datastore, session (token id and
/// the client's session header) and ids.
async fn dedup_request(
    app: &App,
    headers: &HeaderMap,
    ds: &str,
    body: axum::body::Body,
) -> ApiResult<(TokenEntry, Arc<Datastore>, String, Vec<[u8; 32]>)> {
    let (t, store) = dedup_caller(app, headers, ds, true)?;
    let session = session_key(&t, headers)?;
    let ids = ids_of(body).await?;
    Ok((t, store, session, ids))
}

/// Ids from a request body: 32 bytes each, at most [`dedup::MAX_IDS_PER_REQUEST`].
async fn ids_of(body: axum::body::Body) -> ApiResult<Vec<[u8; 32]>> {
    let max = crate::dedup::MAX_IDS_PER_REQUEST * 32;
    let body = axum::body::to_bytes(body, max).await.map_err(|_| {
        ApiError::new(
            StatusCode::PAYLOAD_TOO_LARGE,
            "too_large",
            format!(
                "at most {} ids per request",
                crate::dedup::MAX_IDS_PER_REQUEST
            ),
        )
    })?;
    if body.len() % 32 != 0 {
        return Err(ApiError::bad("the body is not a list of 32-byte ids"));
    }
    Ok(body
        .chunks_exact(32)
        .map(|c| {
            let mut id = [0u8; 32];
            id.copy_from_slice(c);
            id
        })
        .collect())
}

fn unavailable(reason: String) -> ApiError {
    ApiError::new(StatusCode::CONFLICT, "dedup_unavailable", reason)
}

/// `GET /v1/datastores/{ds}/dedup`: whether the server answers dedup queries and
/// which index files a backup client must still read.
pub async fn dedup_plan(
    State(app): State<Arc<App>>,
    Path(ds): Path<String>,
    headers: HeaderMap,
) -> ApiResult<Response> {
    let (_, store) = dedup_caller(&app, &headers, &ds, false)?;
    let plan = if store.admin_names.load(Ordering::Acquire) {
        let s = store.clone();
        blocking(move || s.dedup.plan(s.backend.as_ref())).await?
    } else {
        crate::dedup::Plan {
            available: false,
            reason: Some("the datastore predates admin names (docs/SERVER.md)".into()),
            index_files: Vec::new(),
            chunks: 0,
            missing_packs: Vec::new(),
            epoch: String::new(),
        }
    };
    Ok(axum::Json(plan).into_response())
}

/// `POST /v1/datastores/{ds}/dedup/query`: one byte per id (0 send, 1 stored, 2
/// in flight from another client).
pub async fn dedup_query(
    State(app): State<Arc<App>>,
    Path(ds): Path<String>,
    headers: HeaderMap,
    body: axum::body::Body,
) -> ApiResult<Response> {
    let (t, store, session, ids) = dedup_request(&app, &headers, &ds, body).await?;
    app.pace_transfer(&t.id, true, ids.len() as u64 * 32).await;
    let s = store.clone();
    let answers = blocking(move || s.dedup.query(s.backend.as_ref(), &session, &ids))
        .await?
        .map_err(unavailable)?;
    let out: Vec<u8> = answers.iter().map(|a| a.to_byte()).collect();
    Ok(out.into_response())
}

/// How long a confirmation waits at most for other clients' chunks.
const CONFIRM_WAIT: std::time::Duration = crate::dedup::CLAIM_TTL;

/// `POST /v1/datastores/{ds}/dedup/confirm`: waits until each id is stored or
/// nobody else is sending it any more; answers the ids the caller must send.
pub async fn dedup_confirm(
    State(app): State<Arc<App>>,
    Path(ds): Path<String>,
    headers: HeaderMap,
    body: axum::body::Body,
) -> ApiResult<Response> {
    let (_, store, session, ids) = dedup_request(&app, &headers, &ds, body).await?;
    let started = std::time::Instant::now();
    let mut pause = std::time::Duration::from_millis(100);
    loop {
        let last = started.elapsed() >= CONFIRM_WAIT;
        let (s, ses, i) = (store.clone(), session.clone(), ids.clone());
        let round =
            blocking(move || s.dedup.confirm_round(s.backend.as_ref(), &ses, &i, last)).await?;
        if round.waiting == 0 {
            return Ok(round.missing.concat().into_response());
        }
        tokio::time::sleep(pause).await;
        pause = (pause * 2).min(std::time::Duration::from_secs(2));
    }
}

/// For a pack over the server's `max_object_size`: the two ways out (QA r35: a
/// backup failed on every pack without a word of either).
fn pack_hint(kind: Kind) -> &'static str {
    if kind == Kind::Pack {
        " (the server's max_object_size): back up with smaller packs (`backup \
         --pack-size`; an admin can set the datastore's with `cairn config \
         --pack-size`), or have the server's max_object_size raised"
    } else {
        ""
    }
}

/// What the server can check of an upload without the key: its size, and
/// [`policy::verify`].
fn check_body(kind: Kind, name: &str, body: &[u8], max_object: u64) -> ApiResult<()> {
    let max = kind.max_size(max_object);
    if body.len() as u64 > max {
        return Err(ApiError::new(
            StatusCode::PAYLOAD_TOO_LARGE,
            "too_large",
            format!(
                "{name}: {} bytes is more than the {max} bytes allowed{}",
                body.len(),
                pack_hint(kind)
            ),
        ));
    }
    policy::verify(kind, name, body).map_err(|m| {
        ApiError::new(
            StatusCode::UNPROCESSABLE_ENTITY,
            "content_mismatch",
            format!("{name}: {m}"),
        )
    })
}

pub async fn delete(
    State(app): State<Arc<App>>,
    Path((ds, name)): Path<(String, String)>,
    headers: HeaderMap,
) -> ApiResult<Response> {
    let t = authenticate(&app, &headers)?;
    let store = datastore(&app, &t, &ds)?;
    let kind = allow(&app, &store, &t, &name, Action::Delete)?;
    let is_lock = matches!(kind, Kind::Lock | Kind::AdminLock);
    let backend = store.backend.clone();
    let n = name.clone();
    blocking(move || backend.delete(&n)).await?;
    if kind == Kind::Snapshot {
        let (s, id) = (
            store.clone(),
            policy::id_of(&name).unwrap_or("").to_string(),
        );
        blocking(move || {
            s.hosts.forget(s.backend.as_ref(), &id)?;
            crate::hosts::forget_received(s.backend.as_ref(), &id)
        })
        .await?;
    }
    // A removed lock's name stays remembered (see `locks`).
    if is_lock {
        let (s, n) = (store.clone(), name.clone());
        let _ = tokio::task::spawn_blocking(move || s.owners.removed(&n)).await;
    } else {
        store.content.changed();
    }
    Ok(StatusCode::NO_CONTENT.into_response())
}

/// The jobs of the datastores the caller administers, with their runs (newest first).
pub async fn jobs(State(app): State<Arc<App>>, headers: HeaderMap) -> ApiResult<Response> {
    let t = authenticate(&app, &headers)?;
    if t.role != Role::Admin {
        return Err(ApiError::forbidden("only admin tokens see jobs"));
    }
    let list: Vec<crate::jobs::JobStatus> = app
        .jobs
        .status()
        .into_iter()
        .filter(|j| t.opens(&j.spec.datastore))
        .collect();
    Ok(axum::Json(list).into_response())
}

#[derive(Deserialize)]
pub struct StartJob {
    kind: String,
    #[serde(default)]
    read_data: Option<String>,
}

/// `POST /v1/datastores/{ds}/jobs` `{"kind": "check"|"scrub"|"prune", "read_data":
/// "10%"}` (admin): runs it now; 202 with its name, to follow in `GET /v1/jobs`.
pub async fn start_job(
    State(app): State<Arc<App>>,
    Path(ds): Path<String>,
    headers: HeaderMap,
    SmallBody(body): SmallBody,
) -> ApiResult<Response> {
    let t = authenticate(&app, &headers)?;
    let store = datastore(&app, &t, &ds)?;
    if t.role != Role::Admin {
        return Err(ApiError::forbidden(
            "only an admin (token or user) may start jobs",
        ));
    }
    let b: StartJob = serde_json::from_slice(&body)
        .map_err(|e| ApiError::bad(format!("send {{\"kind\": \"check\"}}: {e}")))?;
    // A kind the server does not run is the request's fault, locked or not.
    if !crate::jobs::ADHOC_KINDS.contains(&b.kind.as_str()) {
        return Err(ApiError::bad(format!(
            "kind {:?}: start check, scrub or prune",
            b.kind
        )));
    }
    if b.kind != "scrub"
        && store.content.unlocked().is_none()
        && (store.content.key_withheld() || !app.config.datastore_passwords.contains_key(&ds))
    {
        return Err(ApiError::new(
            StatusCode::CONFLICT,
            "locked",
            format!(
                "a {} needs the datastore's key: unlock the datastore first",
                b.kind
            ),
        ));
    }
    let trigger = format!("manual by {}", t.who());
    match crate::jobs::start_now(&app, &ds, &b.kind, b.read_data, &trigger) {
        // Logged by the job itself ("started (manual by ...)").
        Ok(name) => Ok((
            StatusCode::ACCEPTED,
            axum::Json(serde_json::json!({ "name": name })),
        )
            .into_response()),
        Err(e) if e.ends_with("is running") => {
            Err(ApiError::new(StatusCode::CONFLICT, "already_exists", e))
        }
        Err(e) => Err(ApiError::bad(e)),
    }
}

/// Starts a job now (202), unless it is running (409).
pub async fn run_job(
    State(app): State<Arc<App>>,
    Path(name): Path<String>,
    headers: HeaderMap,
) -> ApiResult<Response> {
    let t = authenticate(&app, &headers)?;
    // Before looking, and another datastore's job is not found: the answer tells
    // no one which jobs exist elsewhere, nor whose they are (QA r19: a 403 named
    // the datastore of a job its caller could not see).
    if t.role != Role::Admin {
        return Err(ApiError::forbidden("only an admin may run jobs"));
    }
    let Some(_) = app.jobs.find(&name).filter(|(s, _)| t.opens(&s.datastore)) else {
        // A one-off job (listed by GET /v1/jobs) is started again its own way.
        let hint = if name.ends_with("-now") {
            ": a one-off job is started with POST /v1/datastores/{ds}/jobs {\"kind\": …}"
        } else {
            ""
        };
        return Err(ApiError::new(
            StatusCode::NOT_FOUND,
            "not_found",
            format!("no scheduled job {name:?}{hint}"),
        ));
    };
    if crate::jobs::start(&app, &name, &format!("manual by {}", t.who())) {
        Ok(StatusCode::ACCEPTED.into_response())
    } else {
        Err(ApiError::new(
            StatusCode::CONFLICT,
            "already_exists",
            format!("job {name:?} is running"),
        ))
    }
}

/// A schedule as the console sends it (`PUT /v1/schedules/{name}`).
#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ScheduleBody {
    kind: String,
    datastore: String,
    every: String,
    #[serde(default)]
    read_data: Option<String>,
    #[serde(default)]
    keep_last: Option<i64>,
    #[serde(default)]
    keep_hourly: Option<i64>,
    #[serde(default)]
    keep_daily: Option<i64>,
    #[serde(default)]
    keep_weekly: Option<i64>,
    #[serde(default)]
    keep_monthly: Option<i64>,
    #[serde(default)]
    keep_yearly: Option<i64>,
    #[serde(default)]
    keep_within: Option<String>,
}

/// `PUT /v1/schedules/{name}` (admin of the datastore): makes or changes a
/// schedule of a check, scrub, prune or retention; 201 made, 200 changed. The
/// settings file's jobs are changed there, not here (409).
pub async fn put_schedule(
    State(app): State<Arc<App>>,
    Path(name): Path<String>,
    headers: HeaderMap,
    SmallBody(body): SmallBody,
) -> ApiResult<Response> {
    let t = authenticate(&app, &headers)?;
    let b: ScheduleBody = serde_json::from_slice(&body).map_err(|e| {
        ApiError::bad(format!(
            "send {{\"kind\", \"datastore\", \"every\", ...}}: {e}"
        ))
    })?;
    let store = datastore(&app, &t, &b.datastore)?;
    if t.role != Role::Admin {
        return Err(ApiError::forbidden("only an admin may schedule jobs"));
    }
    if !crate::jobs::CONSOLE_KINDS.contains(&b.kind.as_str()) {
        return Err(ApiError::bad(format!(
            "kind {:?}: schedule check, scrub, prune or retention here (copy jobs go in \
             the settings file)",
            b.kind
        )));
    }
    let spec = crate::jobs::JobSpec {
        read_data: b.read_data.filter(|r| !r.trim().is_empty()),
        keep_last: b.keep_last,
        keep_hourly: b.keep_hourly,
        keep_daily: b.keep_daily,
        keep_weekly: b.keep_weekly,
        keep_monthly: b.keep_monthly,
        keep_yearly: b.keep_yearly,
        keep_within: b.keep_within.filter(|w| !w.trim().is_empty()),
        ..crate::jobs::JobSpec::new(&name, &b.kind, &b.datastore, b.every.trim())
    };
    // A job that needs the key: the password file, or the datastore unlocked now
    // (then it runs while the server holds the key, and says so when it does not).
    let mut passwords = app.config.datastore_passwords.clone();
    if store.content.unlocked().is_some() {
        passwords
            .entry(b.datastore.clone())
            .or_insert_with(|| "(unlocked in the console)".into());
    }
    let names: BTreeMap<String, String> = app
        .datastores
        .keys()
        .map(|k| (k.clone(), String::new()))
        .collect();
    spec.validate(&names, &passwords).map_err(ApiError::bad)?;
    if let Some(r) = &spec.read_data {
        crate::jobs::check_percent(r).map_err(ApiError::bad)?;
    }
    if let Some((old, _)) = app.jobs.find(&name)
        && !t.opens(&old.datastore)
    {
        // Names are the server's, not a datastore's: taken, but not said whose.
        return Err(ApiError::new(
            StatusCode::CONFLICT,
            "conflict",
            format!(
                "the name {name:?} is taken by a job of a datastore this token does not \
                 administer: choose another"
            ),
        ));
    }
    let s = app.clone();
    let existed = blocking(move || s.jobs.put_console(spec).map_err(schedule_error)).await?;
    crate::log_line(&format!(
        "schedule {name}: {} by {}",
        if existed { "changed" } else { "made" },
        t.name
    ));
    let status = if existed {
        StatusCode::OK
    } else {
        StatusCode::CREATED
    };
    Ok(status.into_response())
}

/// A schedule's name clash is a conflict; its file's trouble is the server's
/// (507 when the state directory's disk is full: QA had 409 "conflict" for it).
fn schedule_error(e: crate::jobs::ScheduleError) -> ApiError {
    use crate::jobs::ScheduleError;
    match e {
        ScheduleError::Clash(m) => ApiError::new(StatusCode::CONFLICT, "conflict", m),
        ScheduleError::File(e) if e.is_no_space() => ApiError::new(
            StatusCode::INSUFFICIENT_STORAGE,
            "no_space",
            format!("{e}: free space in the server's state directory"),
        ),
        ScheduleError::File(e) => {
            ApiError::new(StatusCode::INTERNAL_SERVER_ERROR, "server", e.to_string())
        }
    }
}

/// `DELETE /v1/schedules/{name}` (admin of its datastore): removes a schedule made
/// in the console (its run history stays).
pub async fn delete_schedule(
    State(app): State<Arc<App>>,
    Path(name): Path<String>,
    headers: HeaderMap,
) -> ApiResult<Response> {
    let t = authenticate(&app, &headers)?;
    // Before looking: a non-admin learns nothing of which schedules exist, and
    // an admin nothing of other datastores' (QA r13: 403 for some names and 404
    // for others told them apart).
    if t.role != Role::Admin {
        return Err(ApiError::forbidden("only an admin may remove schedules"));
    }
    // The console's own first: one the settings file shadows can still go.
    let found = (app.jobs.console_specs().into_iter())
        .find(|s| s.name == name)
        .map(|s| (s, "console"))
        .or_else(|| app.jobs.find(&name))
        .filter(|(s, _)| t.opens(&s.datastore));
    let Some((_, source)) = found else {
        // Not "no such schedule" when the file that would list it is unreadable.
        if let Some(e) = app.jobs.console_file_error() {
            return Err(schedule_error(crate::jobs::ScheduleError::File(e)));
        }
        return Err(ApiError::new(
            StatusCode::NOT_FOUND,
            "not_found",
            format!("no schedule {name:?}"),
        ));
    };
    if source != "console" {
        return Err(ApiError::new(
            StatusCode::CONFLICT,
            "conflict",
            format!("job {name:?} is defined in the settings file: remove it there"),
        ));
    }
    let s = app.clone();
    let n = name.clone();
    blocking(move || s.jobs.delete_console(&n).map_err(schedule_error)).await?;
    crate::log_line(&format!("schedule {name}: removed by {}", t.name));
    Ok(StatusCode::NO_CONTENT.into_response())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ranges() {
        assert_eq!(parse_range("bytes=0-0").unwrap(), (0, 1));
        assert_eq!(parse_range("bytes=10-19").unwrap(), (10, 10));
        assert_eq!(parse_range("bytes=5-4").unwrap(), (5, 0));
        for bad in [
            "bytes=5-",
            "bytes=-5",
            "bytes=9-3",
            "items=0-1",
            "bytes=a-b",
            "",
        ] {
            assert!(parse_range(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn uploads_are_checked_against_their_names() {
        let body = b"some sealed bytes".to_vec();
        let id = blake3::hash(&body).to_hex().to_string();
        let name = format!("index/{id}");
        check_body(Kind::Index, &name, &body, 1 << 20).unwrap();
        let e = check_body(Kind::Index, &name, b"other bytes", 1 << 20).unwrap_err();
        assert_eq!(e.status, StatusCode::UNPROCESSABLE_ENTITY);
        // A pack must end in its trailer.
        let pname = format!("data/{}/{id}", &id[..2]);
        let e = check_body(Kind::Pack, &pname, &body, 1 << 20).unwrap_err();
        assert!(e.message.contains("trailer"), "{}", e.message);
        let mut pack = vec![1u8; 100];
        pack.extend_from_slice(&50u32.to_le_bytes());
        pack.extend_from_slice(b"CAIRNPK1");
        let pid = blake3::hash(&pack).to_hex().to_string();
        check_body(
            Kind::Pack,
            &format!("data/{}/{pid}", &pid[..2]),
            &pack,
            1 << 20,
        )
        .unwrap();
        let e =
            check_body(Kind::Pack, &format!("data/{}/{pid}", &pid[..2]), &pack, 10).unwrap_err();
        assert_eq!(e.status, StatusCode::PAYLOAD_TOO_LARGE);
    }
}

/// What a client asks a job slot for (`POST .../slots`); both fields only describe
/// the job to others waiting.
#[derive(Deserialize, Default)]
pub struct SlotAsk {
    #[serde(default)]
    operation: String,
    #[serde(default)]
    host: String,
    /// Sent with each heartbeat: how far the job is.
    #[serde(default)]
    progress: Option<crate::slots::ClientProgress>,
}

#[derive(Serialize)]
struct SlotReply {
    granted: bool,
    /// The datastore's limit.
    max: u32,
    /// How often a holder must be heard from (any request, or this one again).
    heartbeat_secs: u64,
    running: Vec<crate::slots::JobView>,
    /// Queued before this client (for a `GET`: every queued job).
    ahead: Vec<crate::slots::JobView>,
    /// `GET` only: client jobs that ended, newest first.
    #[serde(skip_serializing_if = "Option::is_none")]
    recent: Option<Vec<crate::slots::EndedJob>>,
    /// Slots the asking token holds, and the most one token may hold: a client
    /// waiting because its own token is at that bound is told so.
    token_running: usize,
    per_token: usize,
}

impl SlotReply {
    fn new(
        store: &Datastore,
        t: &TokenEntry,
        granted: bool,
        running: Vec<crate::slots::JobView>,
        ahead: Vec<crate::slots::JobView>,
    ) -> SlotReply {
        let max = store.max_jobs.load(Ordering::Relaxed);
        SlotReply {
            granted,
            max,
            heartbeat_secs: (store.slots.idle().as_secs() / 3).max(1),
            token_running: running.iter().filter(|j| j.token == t.name).count(),
            per_token: crate::slots::per_token(max.max(1) as usize),
            running: visible(t, running),
            ahead: visible(t, ahead),
            recent: None,
        }
    }
}

/// What a token may see of other clients' jobs: a host-bound token does not learn
/// other hosts' names.
fn visible(t: &TokenEntry, mut jobs: Vec<crate::slots::JobView>) -> Vec<crate::slots::JobView> {
    if let Some(host) = t.view_host() {
        for j in &mut jobs {
            if j.host != host {
                j.host = "(another host)".into();
                j.token = "(another token)".into();
                j.progress = None;
            }
        }
    }
    jobs
}

fn short_text(s: &str) -> String {
    s.chars().filter(|c| !c.is_control()).take(64).collect()
}

#[derive(Deserialize)]
pub struct SlotQuery {
    /// Seconds to wait for a slot before answering "queued" (at most 20).
    wait: Option<u64>,
}

/// `POST /v1/datastores/{ds}/slots`: a job slot for this session now, or after a
/// wait of up to 20 s the jobs ahead of it (ask again).
pub async fn slot_request(
    State(app): State<Arc<App>>,
    Path(ds): Path<String>,
    Query(q): Query<SlotQuery>,
    headers: HeaderMap,
    SmallBody(body): SmallBody,
) -> ApiResult<Response> {
    let t = authenticate(&app, &headers)?;
    let store = datastore(&app, &t, &ds)?;
    if t.role == Role::Restore {
        return Err(ApiError::forbidden(
            "a restore token may only read: back up with a backup \
             or admin token",
        ));
    }
    let ask: SlotAsk = if body.is_empty() {
        SlotAsk::default()
    } else {
        serde_json::from_slice(&body).map_err(|e| ApiError::bad(format!("slot request: {e}")))?
    };
    let key = session_key(&t, &headers)?;
    // A client's heartbeats keep its claims on chunks too: one pack may take
    // minutes to upload over a slow link, with no other request meanwhile (QA: a
    // second client sent the same chunks 15 s into the first one's pack).
    store.dedup.touch(&key);
    store.owners.heard(&key);
    let request = crate::slots::Request {
        key,
        token_id: t.id.clone(),
        token_name: t.name.clone(),
        host: t.host.clone().unwrap_or_else(|| short_text(&ask.host)),
        operation: short_text(&ask.operation),
        progress: ask.progress.map(crate::slots::ClientProgress::sanitized),
    };
    let max = store.max_jobs.load(Ordering::Relaxed);
    let answer = store
        .slots
        .request(
            max,
            &request,
            q.wait
                .map_or(crate::slots::LONG_POLL, std::time::Duration::from_secs)
                .min(crate::slots::LONG_POLL),
            &|id: &str| principal_exists(&app, id),
        )
        .await;
    let reply = match answer {
        // What runs now, this job included (QA: a granted answer said the token
        // held no slot).
        crate::slots::Answer::Granted => {
            let (running, _) = store.slots.jobs();
            SlotReply::new(&store, &t, true, running, Vec::new())
        }
        crate::slots::Answer::Queued { running, ahead } => {
            SlotReply::new(&store, &t, false, running, ahead)
        }
    };
    Ok(axum::Json(reply).into_response())
}

/// Whether the token, or console user (`user-<name>`), of this id exists now.
/// When the server's state cannot be read: yes, no job is ended for that.
fn principal_exists(app: &App, id: &str) -> bool {
    match id.strip_prefix("user-") {
        Some(name) => app.users.get(name).map_or(true, |u| u.is_some()),
        None => app.tokens.exists(id).unwrap_or(true),
    }
}

/// `DELETE /v1/datastores/{ds}/slots`: this session's job is over.
pub async fn slot_release(
    State(app): State<Arc<App>>,
    Path(ds): Path<String>,
    headers: HeaderMap,
) -> ApiResult<Response> {
    let t = authenticate(&app, &headers)?;
    let store = datastore(&app, &t, &ds)?;
    let key = session_key(&t, &headers)?;
    store.slots.release(&key);
    store.dedup.end_session(&key);
    Ok(StatusCode::NO_CONTENT.into_response())
}

/// `GET /v1/datastores/{ds}/slots`: the running and the queued jobs.
pub async fn slots_list(
    State(app): State<Arc<App>>,
    Path(ds): Path<String>,
    headers: HeaderMap,
) -> ApiResult<Response> {
    let t = authenticate(&app, &headers)?;
    let store = datastore(&app, &t, &ds)?;
    store.slots.end_removed(&|id| principal_exists(&app, id));
    let (running, queued) = store.slots.jobs();
    let mut reply = SlotReply::new(&store, &t, false, running, queued);
    let mut recent = store.slots.recent();
    if let Some(host) = t.view_host() {
        recent.retain(|e| e.job.host == host);
    }
    reply.recent = Some(recent);
    Ok(axum::Json(reply).into_response())
}

/// What `GET`/`POST /v1/session` answer: who is signed in, and the CSRF token the
/// page must send with every change.
#[derive(Serialize)]
struct SessionReply {
    name: String,
    /// A datastore, or `*` for all of them.
    datastore: String,
    role: Role,
    /// `token` or `user`.
    kind: &'static str,
    #[serde(skip_serializing_if = "Option::is_none")]
    host: Option<String>,
    csrf: String,
    /// Seconds of disuse after which the session ends.
    idle_secs: u64,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SignInBody {
    #[serde(default)]
    token: Option<String>,
    #[serde(default)]
    user: Option<String>,
    #[serde(default)]
    password: Option<String>,
}

/// A user's password against the user file: who, or why not.
async fn user_sign_in(
    app: &Arc<App>,
    name: String,
    password: String,
) -> ApiResult<(TokenEntry, String)> {
    // Each try costs ~19 MiB and tens of milliseconds: a few at a time.
    let _permit = app.hashing.acquire().await.map_err(|_| {
        ApiError::new(
            StatusCode::SERVICE_UNAVAILABLE,
            "transient",
            "shutting down",
        )
    })?;
    let a = app.clone();
    let n = name.clone();
    let outcome =
        blocking(move || a.users.sign_in(&n, &password).map_err(users_unreadable)).await?;
    match outcome {
        crate::users::SignInOutcome::Ok(u) => Ok((u.principal(), u.hash.clone())),
        crate::users::SignInOutcome::Refused => {
            crate::log_line(&format!("console: user {name:?}: sign-in refused"));
            Err(ApiError::new(
                StatusCode::UNAUTHORIZED,
                "unauthorized",
                "unknown user or wrong password",
            ))
        }
        crate::users::SignInOutcome::Wait(w) => Err(ApiError::new(
            StatusCode::TOO_MANY_REQUESTS,
            "too_many_attempts",
            format!(
                "too many wrong passwords for {name:?}: try again in {} s",
                w.as_secs() + 1
            ),
        )),
    }
}

/// `POST /v1/session` `{"token"}` or `{"user", "password"}`: signs in; the answer
/// sets the session cookie.
pub async fn session_post(
    State(app): State<Arc<App>>,
    headers: HeaderMap,
    SmallBody(body): SmallBody,
) -> ApiResult<Response> {
    // JSON only: another site's page cannot send that without a CORS preflight,
    // which this server never grants, so it cannot sign a browser in.
    let json = headers
        .get(header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .is_some_and(|v| {
            // The media type itself, before any parameter (`; charset=utf-8`).
            let media = v.split(';').next().unwrap_or("").trim();
            media.eq_ignore_ascii_case("application/json")
        });
    if !json {
        return Err(ApiError::bad("sign in with Content-Type: application/json"));
    }
    let b: SignInBody =
        serde_json::from_slice(&body).map_err(|e| ApiError::bad(format!("sign-in: {e}")))?;
    let (t, who) = match (b.token, b.user, b.password) {
        (Some(token), None, None) => {
            let presented = token.trim().to_string();
            let t = token_entry(&app, &presented)?;
            (t, crate::signin::Identity::Token(presented))
        }
        (None, Some(user), Some(password)) => {
            let (t, hash) = user_sign_in(&app, user.clone(), password).await?;
            (t, crate::signin::Identity::User(user, hash))
        }
        _ => {
            return Err(ApiError::bad(
                "sign in with {\"token\"} or with {\"user\", \"password\"}",
            ));
        }
    };
    let signed_in = match &who {
        crate::signin::Identity::User(name, _) => format!("user {name:?}"),
        crate::signin::Identity::Token(_) => format!("token {:?}", t.name),
    };
    // (Only a server that holds no session at all could be out of places.)
    let (id, csrf) = app.signins.create(who).ok_or_else(|| {
        ApiError::new(
            StatusCode::SERVICE_UNAVAILABLE,
            "transient",
            "no session can be made now: try again later",
        )
    })?;
    // Said once the session exists (a refused one was logged as signed in);
    // tokens too, so that a token signing in over and over is seen.
    crate::log_line(&format!("console: {signed_in} signed in"));
    let secure = if app.config.tls == crate::config::Tls::InsecureHttp {
        ""
    } else {
        "; Secure"
    };
    let cookie = format!(
        "{}={id}; Path=/; HttpOnly; SameSite=Strict{secure}",
        crate::signin::COOKIE
    );
    let reply = session_reply(&app, t, csrf);
    Ok(([(header::SET_COOKIE, cookie)], axum::Json(reply)).into_response())
}

fn session_reply(app: &App, t: TokenEntry, csrf: String) -> SessionReply {
    SessionReply {
        name: t.name,
        datastore: t.datastore,
        role: t.role,
        kind: if t.user { "user" } else { "token" },
        host: t.host,
        csrf,
        idle_secs: app.signins.idle().as_secs(),
    }
}

/// `GET /v1/session`: the signed-in user (and the CSRF token again, for a page that
/// was reloaded).
pub async fn session_get(State(app): State<Arc<App>>, headers: HeaderMap) -> ApiResult<Response> {
    // A cookie the sign-in layer did not turn into a token: its session ended
    // (said as on every other route, not as "no token").
    if !headers.contains_key(header::AUTHORIZATION)
        && crate::signin::cookie(&headers, crate::signin::COOKIE).is_some()
    {
        return Err(crate::signin::expired());
    }
    let t = authenticate(&app, &headers)?;
    let csrf = crate::signin::cookie(&headers, crate::signin::COOKIE)
        .and_then(|id| app.signins.get(&id))
        .map(|(_, csrf)| csrf)
        .ok_or_else(|| ApiError::new(StatusCode::UNAUTHORIZED, "unauthorized", "not signed in"))?;
    Ok(axum::Json(session_reply(&app, t, csrf)).into_response())
}

/// `DELETE /v1/session`: signs out (the cookie is cleared).
pub async fn session_delete(
    State(app): State<Arc<App>>,
    headers: HeaderMap,
) -> ApiResult<Response> {
    if let Some(id) = crate::signin::cookie(&headers, crate::signin::COOKIE) {
        app.signins.remove(&id);
    }
    let clear = format!(
        "{}=; Path=/; HttpOnly; SameSite=Strict; Max-Age=0",
        crate::signin::COOKIE
    );
    Ok(([(header::SET_COOKIE, clear)], StatusCode::NO_CONTENT).into_response())
}
