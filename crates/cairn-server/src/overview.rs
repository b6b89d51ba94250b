//! `GET /v1/datastores`: what the console's datastore table shows, from what the
//! server can see without a key — the repository's plaintext config, a listing of
//! its storage, and the job slots. Stored data, deduplication and compression need
//! the key: for a datastore an admin unlocked, `GET …/stats` has them
//! ([`crate::content`]); for a locked one the answer says why instead of guessing.

use crate::api::{ApiError, authenticate};
use crate::policy::Role;
use crate::{App, Datastore};
use axum::extract::State;
use axum::http::HeaderMap;
use axum::response::{IntoResponse, Response};
use serde::Serialize;
use std::collections::BTreeMap;
use std::sync::Arc;
use std::sync::atomic::Ordering;

#[derive(Serialize)]
pub struct Summary {
    pub name: String,
    /// Where it lives (admin tokens only).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub location: Option<String>,
    /// The storage answered the listing.
    pub reachable: bool,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub error: Option<String>,
    /// Content figures need the key, which the server holds only while an admin
    /// has the datastore unlocked (`…/unlock`, or a password file).
    pub locked: bool,
    /// Why it is locked (empty when it is not).
    pub locked_reason: String,
    /// How it was unlocked, and since when.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub unlocked: Option<crate::content::UnlockState>,
    /// From the repository's config (plaintext).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub config: Option<serde_json::Value>,
    /// Bytes the datastore occupies in its storage.
    pub occupied_bytes: u64,
    /// Bytes of index files (the index on disk).
    pub index_bytes: u64,
    /// Objects and bytes by kind (`pack`, `index`, `snapshot`, ...).
    pub objects: BTreeMap<String, KindCount>,
    /// Snapshots stored (not shown to host-bound tokens).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub snapshots: Option<u64>,
    pub jobs_running: usize,
    pub jobs_queued: usize,
    pub max_concurrent_jobs: u32,
}

#[derive(Serialize)]
pub struct KindCount {
    pub count: u64,
    pub bytes: u64,
}

/// The plaintext config's settings the table shows.
fn config_of(backend: &dyn cairn_backend::Backend) -> Option<serde_json::Value> {
    let c = crate::read_config_json(backend).ok()?;
    let mut out = serde_json::Map::new();
    for key in [
        "id",
        "created",
        "encryption",
        "compression",
        "pack_size",
        "max_concurrent_jobs",
        "index_placement",
        "features",
    ] {
        if let Some(x) = c.get(key) {
            out.insert(key.into(), x.clone());
        }
    }
    if let Some(ch) = c.get("chunker") {
        for (from, to) in [
            ("avg_size", "block_size"),
            ("min_size", "block_min"),
            ("max_size", "block_max"),
        ] {
            if let Some(x) = ch.get(from) {
                out.insert(to.into(), x.clone());
            }
        }
    }
    Some(serde_json::Value::Object(out))
}

async fn summary(ds: &Arc<Datastore>, role: Role, host_bound: bool) -> Summary {
    let census = crate::metrics::census_of(ds).await;
    let backend = ds.backend.clone();
    let config = tokio::task::spawn_blocking(move || config_of(backend.as_ref()))
        .await
        .ok()
        .flatten();
    let (running, queued) = ds.slots.jobs();
    // Listed but without a config: not a datastore any more (its disk not
    // mounted, or deleted), which an empty, healthy row made look like data
    // lost (QA).
    let census = match census {
        Ok(_) if config.is_none() => Err("the datastore holds no readable config: is its \
             file system mounted? (or the repository was deleted)"
            .to_string()),
        c => c,
    };
    let mut s = Summary {
        name: ds.name.clone(),
        location: (role == Role::Admin).then(|| ds.location.clone()),
        reachable: census.is_ok(),
        error: census.as_ref().err().cloned(),
        locked: true,
        locked_reason: match ds.content.unlock_error() {
            // The error names how it was tried (a password file's path, an admin
            // token's name): the admins' to know.
            Some(e) if role == Role::Admin => format!("unlocking failed: {e}"),
            Some(_) => "unlocking failed (an admin sees why)".into(),
            None => "stored data, deduplication, compression and the snapshots need the \
                     datastore's key, which this server does not hold until an admin unlocks \
                     the datastore"
                .into(),
        },
        unlocked: None,
        config,
        occupied_bytes: 0,
        index_bytes: 0,
        objects: BTreeMap::new(),
        snapshots: None,
        jobs_running: running.len(),
        jobs_queued: queued.len(),
        max_concurrent_jobs: ds.max_jobs.load(Ordering::Relaxed),
    };
    if ds.content.unlocked().is_some() {
        s.locked = false;
        s.locked_reason.clear();
        let mut state = crate::content::state_of(ds);
        // How it was unlocked (a password file's path, an admin token's name) is
        // the admins' to know.
        if role != Role::Admin {
            state.how = None;
        }
        s.unlocked = Some(state);
    }
    if let Ok(c) = census {
        s.occupied_bytes = c.other.1 + c.by_kind.values().map(|x| x.1).sum::<u64>();
        s.index_bytes = ["index", "admin_index"]
            .iter()
            .filter_map(|k| c.by_kind.get(k))
            .map(|x| x.1)
            .sum();
        if !host_bound {
            s.snapshots = Some(c.by_kind.get("snapshot").map_or(0, |x| x.0));
        }
        for (k, (count, bytes)) in &c.by_kind {
            if host_bound
                && matches!(
                    *k,
                    "snapshot" | "host_record" | "received_record" | "forgotten_record"
                )
            {
                continue;
            }
            s.objects.insert(
                k.to_string(),
                KindCount {
                    count: *count,
                    bytes: *bytes,
                },
            );
        }
    }
    s
}

/// `GET /v1/datastores`: the datastores this token or user opens (its own, or all).
pub async fn datastores(
    State(app): State<Arc<App>>,
    headers: HeaderMap,
) -> Result<Response, ApiError> {
    let t = authenticate(&app, &headers)?;
    let mut out = Vec::new();
    let host_bound = t.view_host().is_some();
    for ds in app.datastores.values().filter(|d| t.opens(&d.name)) {
        out.push(summary(ds, t.role, host_bound).await);
    }
    Ok(axum::Json(out).into_response())
}
