//! `GET /metrics` in Prometheus' text format: requests, bytes in and out, requests
//! running, and per datastore what its storage holds (objects and bytes by kind,
//! from a listing made at most once a minute), and for a datastore unlocked on the
//! server its stored and unique data (`cairn stats`, computed again at most once
//! a minute after a change); each job's last run. No token: point Prometheus at
//! it on a trusted network.

use crate::App;
use axum::extract::State;
use axum::http::header;
use axum::response::IntoResponse;
use std::collections::BTreeMap;
use std::fmt::Write;
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

/// Objects and bytes of a datastore by kind.
#[derive(Clone, Debug, Default)]
pub struct Census {
    pub by_kind: BTreeMap<&'static str, (u64, u64)>,
    pub other: (u64, u64),
}

const CENSUS_MAX_AGE: Duration = Duration::from_secs(60);

fn take_census(backend: &dyn cairn_backend::Backend) -> Result<Census, String> {
    let mut c = Census::default();
    for o in backend.list("").map_err(|e| e.to_string())? {
        let slot = match crate::policy::classify(&o.name) {
            Ok(k) => c.by_kind.entry(k.as_str()).or_default(),
            Err(_) => &mut c.other,
        };
        slot.0 += 1;
        slot.1 += o.size;
    }
    Ok(c)
}

/// The datastore's census, listed again when the last is older than a minute.
/// An error says why the storage could not be listed (the last census, if any, is
/// kept).
pub async fn census_of(ds: &crate::Datastore) -> Result<Census, String> {
    let mut cached = ds.census.lock().await;
    if let Some((t, c)) = cached.as_ref()
        && t.elapsed() < CENSUS_MAX_AGE
    {
        return Ok(c.clone());
    }
    let backend = ds.backend.clone();
    match tokio::task::spawn_blocking(move || take_census(backend.as_ref())).await {
        Ok(Ok(c)) => {
            *cached = Some((Instant::now(), c.clone()));
            Ok(c)
        }
        Ok(Err(e)) => Err(e),
        Err(e) => Err(e.to_string()),
    }
}

pub async fn metrics(State(app): State<Arc<App>>) -> impl IntoResponse {
    let mut out = String::new();
    let counter = |out: &mut String, name: &str, help: &str, kind: &str, v: u64| {
        let _ = writeln!(
            out,
            "# HELP {name} {help}\n# TYPE {name} {kind}\n{name} {v}"
        );
    };
    let s = &app.stats;
    counter(
        &mut out,
        "cairn_requests_total",
        "HTTP requests answered.",
        "counter",
        s.requests.load(Ordering::Relaxed),
    );
    counter(
        &mut out,
        "cairn_request_errors_total",
        "Requests answered with a server error (5xx).",
        "counter",
        s.errors.load(Ordering::Relaxed),
    );
    counter(
        &mut out,
        "cairn_received_bytes_total",
        "Object bytes clients uploaded.",
        "counter",
        s.bytes_in.load(Ordering::Relaxed),
    );
    counter(
        &mut out,
        "cairn_sent_bytes_total",
        "Object bytes sent to clients.",
        "counter",
        s.bytes_out.load(Ordering::Relaxed),
    );
    counter(
        &mut out,
        "cairn_active_requests",
        "Requests being answered now.",
        "gauge",
        s.active.load(Ordering::Relaxed),
    );
    counter(
        &mut out,
        "cairn_answer_held_bytes",
        "Memory the answers built and not yet taken by their clients hold (as weighed: answer_memory_mib).",
        "gauge",
        app.answers.held_bytes(),
    );
    counter(
        &mut out,
        "cairn_answers_refused_total",
        "Answers refused (429 answers_not_taken) for want of room in answer_memory_mib or a caller's share.",
        "counter",
        app.answers.refused(),
    );
    if let Some(t) = app.cert.get().and_then(|c| c.not_after()) {
        counter(
            &mut out,
            "cairn_tls_certificate_expiry_seconds",
            "When the served TLS certificate expires (unix seconds): alert on it.",
            "gauge",
            t.max(0) as u64,
        );
    }

    let mut per_ds = String::new();
    let mut census = String::new();
    let _ = writeln!(
        per_ds,
        "# HELP cairn_datastore_requests_total Requests naming the datastore.\n# TYPE cairn_datastore_requests_total counter"
    );
    let _ = writeln!(
        census,
        "# HELP cairn_datastore_objects Objects in the datastore's storage by kind.\n# TYPE cairn_datastore_objects gauge"
    );
    let mut bytes = String::from(
        "# HELP cairn_datastore_bytes Bytes in the datastore's storage by kind.\n# TYPE cairn_datastore_bytes gauge\n",
    );
    let mut occupied = String::from(
        "# HELP cairn_datastore_occupied_bytes Bytes the datastore occupies.\n# TYPE cairn_datastore_occupied_bytes gauge\n",
    );
    let mut stored = String::from(
        "# HELP cairn_datastore_stored_bytes Data the datastore's snapshots hold, before deduplication and compression (unlocked datastores only).\n# TYPE cairn_datastore_stored_bytes gauge\n",
    );
    let mut unique = String::from(
        "# HELP cairn_datastore_unique_bytes Distinct data after deduplication, before compression (unlocked datastores only).\n# TYPE cairn_datastore_unique_bytes gauge\n",
    );
    let mut packed = String::from(
        "# HELP cairn_datastore_unique_compressed_bytes Distinct data after deduplication and compression (unlocked datastores only).\n# TYPE cairn_datastore_unique_compressed_bytes gauge\n",
    );
    let mut snapshots = String::from(
        "# HELP cairn_datastore_snapshots Snapshots in the datastore (unlocked datastores only).\n# TYPE cairn_datastore_snapshots gauge\n",
    );
    let mut jobs = String::from(
        "# HELP cairn_datastore_locks Locks held (each running job holds one).\n# TYPE cairn_datastore_locks gauge\n",
    );
    let mut bio = String::from(
        "# HELP cairn_datastore_received_bytes_total Object bytes uploaded to the datastore.\n# TYPE cairn_datastore_received_bytes_total counter\n",
    );
    // One string per metric family: the format wants each family's lines together.
    let mut dedup = String::from(
        "# HELP cairn_dedup_queries_total Dedup query requests answered.\n# TYPE cairn_dedup_queries_total counter\n",
    );
    let mut dedup_chunks = String::from(
        "# HELP cairn_dedup_chunks_total Chunk ids asked about, by answer (stored, send, in_flight; confirmed_missing: held chunks whose sender never delivered).\n# TYPE cairn_dedup_chunks_total counter\n",
    );
    let mut view_chunks = String::from(
        "# HELP cairn_dedup_view_chunks Chunk ids in the server's dedup view of the datastore (0 until it is built: at the server's start, in the background).\n# TYPE cairn_dedup_view_chunks gauge\n",
    );
    let mut view_bytes = String::from(
        "# HELP cairn_dedup_view_bytes Memory the dedup view holds for those ids.\n# TYPE cairn_dedup_view_bytes gauge\n",
    );
    let mut missing_packs = String::from(
        "# HELP cairn_dedup_missing_packs Packs the datastore's dedup lists name that it lacks or holds cut short, as the last backup's plan found them (datastores on the server's file systems; docs/SERVER.md).\n# TYPE cairn_dedup_missing_packs gauge\n",
    );
    let mut running = String::from(
        "# HELP cairn_jobs_running Jobs holding a job slot on the datastore.\n# TYPE cairn_jobs_running gauge\n",
    );
    let mut queued = String::from(
        "# HELP cairn_jobs_queued Jobs waiting for a job slot.\n# TYPE cairn_jobs_queued gauge\n",
    );
    let mut max_jobs = String::from(
        "# HELP cairn_jobs_max The datastore's max-concurrent-jobs.\n# TYPE cairn_jobs_max gauge\n",
    );
    for (name, ds) in &app.datastores {
        let (r, q) = ds.slots.jobs();
        let _ = writeln!(
            running,
            "cairn_jobs_running{{datastore=\"{name}\"}} {}",
            r.len()
        );
        let _ = writeln!(
            queued,
            "cairn_jobs_queued{{datastore=\"{name}\"}} {}",
            q.len()
        );
        let _ = writeln!(
            max_jobs,
            "cairn_jobs_max{{datastore=\"{name}\"}} {}",
            ds.max_jobs.load(Ordering::Relaxed)
        );
        let d = &ds.dedup.stats;
        let _ = writeln!(
            dedup,
            "cairn_dedup_queries_total{{datastore=\"{name}\"}} {}",
            d.queries.load(Ordering::Relaxed)
        );
        for (answer, v) in [
            ("stored", &d.stored),
            ("send", &d.send),
            ("in_flight", &d.in_flight),
            ("confirmed_missing", &d.confirmed_missing),
        ] {
            let _ = writeln!(
                dedup_chunks,
                "cairn_dedup_chunks_total{{datastore=\"{name}\",answer=\"{answer}\"}} {}",
                v.load(Ordering::Relaxed)
            );
        }
        let (view_n, view_b) = ds.dedup.view_size();
        let _ = writeln!(
            view_chunks,
            "cairn_dedup_view_chunks{{datastore=\"{name}\"}} {view_n}"
        );
        let _ = writeln!(
            view_bytes,
            "cairn_dedup_view_bytes{{datastore=\"{name}\"}} {view_b}"
        );
        let _ = writeln!(
            missing_packs,
            "cairn_dedup_missing_packs{{datastore=\"{name}\"}} {}",
            ds.dedup.missing_packs()
        );
        let _ = writeln!(
            per_ds,
            "cairn_datastore_requests_total{{datastore=\"{name}\"}} {}",
            ds.stats.requests.load(Ordering::Relaxed)
        );
        let _ = writeln!(
            bio,
            "cairn_datastore_received_bytes_total{{datastore=\"{name}\"}} {}",
            ds.stats.bytes_in.load(Ordering::Relaxed)
        );
        if let Some(f) = crate::content::figures_for_metrics(ds) {
            let _ = writeln!(
                stored,
                "cairn_datastore_stored_bytes{{datastore=\"{name}\"}} {}",
                f.stored_bytes
            );
            let _ = writeln!(
                unique,
                "cairn_datastore_unique_bytes{{datastore=\"{name}\"}} {}",
                f.unique_data_bytes
            );
            let _ = writeln!(
                packed,
                "cairn_datastore_unique_compressed_bytes{{datastore=\"{name}\"}} {}",
                f.compressed_data_bytes
            );
            let _ = writeln!(
                snapshots,
                "cairn_datastore_snapshots{{datastore=\"{name}\"}} {}",
                f.snapshots
            );
        }
        if let Err(e) = census_of(ds).await {
            crate::log_line(&format!("metrics: cannot list datastore {name}: {e}"));
        }
        let cached = ds.census.lock().await;
        if let Some((_, c)) = cached.as_ref() {
            let mut total = c.other.1;
            for (kind, (n, b)) in &c.by_kind {
                let _ = writeln!(
                    census,
                    "cairn_datastore_objects{{datastore=\"{name}\",kind=\"{kind}\"}} {n}"
                );
                let _ = writeln!(
                    bytes,
                    "cairn_datastore_bytes{{datastore=\"{name}\",kind=\"{kind}\"}} {b}"
                );
                total += b;
            }
            let locks = c.by_kind.get("lock").map_or(0, |x| x.0)
                + c.by_kind.get("admin_lock").map_or(0, |x| x.0);
            let _ = writeln!(
                occupied,
                "cairn_datastore_occupied_bytes{{datastore=\"{name}\"}} {total}"
            );
            let _ = writeln!(
                jobs,
                "cairn_datastore_locks{{datastore=\"{name}\"}} {locks}"
            );
        }
    }
    let job_families = job_metrics(&app);
    for part in [
        per_ds,
        bio,
        census,
        bytes,
        occupied,
        stored,
        unique,
        packed,
        snapshots,
        jobs,
        running,
        queued,
        max_jobs,
        dedup,
        dedup_chunks,
        view_chunks,
        view_bytes,
        missing_packs,
        job_families,
    ] {
        out.push_str(&part);
    }
    ([(header::CONTENT_TYPE, "text/plain; version=0.0.4")], out)
}

/// Each job's state and last run, so that a failing scheduled job can be alerted
/// on: running, when the last run ended, whether it was `ok` (1) or not (0:
/// problems, failed, interrupted), and how long it took.
fn job_metrics(app: &App) -> String {
    let mut running = String::from(
        "# HELP cairn_job_running Whether the job runs now.\n# TYPE cairn_job_running gauge\n",
    );
    let mut ended = String::from(
        "# HELP cairn_job_last_run_end_timestamp_seconds When the job's last run ended.\n# TYPE cairn_job_last_run_end_timestamp_seconds gauge\n",
    );
    let mut ok = String::from(
        "# HELP cairn_job_last_run_ok 1 if the job's last run ended ok, 0 if it found problems, failed or was interrupted.\n# TYPE cairn_job_last_run_ok gauge\n",
    );
    let mut secs = String::from(
        "# HELP cairn_job_last_run_duration_seconds How long the job's last run took.\n# TYPE cairn_job_last_run_duration_seconds gauge\n",
    );
    for j in app.jobs.status() {
        let labels = format!(
            "job=\"{}\",kind=\"{}\",datastore=\"{}\"",
            label(&j.spec.name),
            label(&j.spec.kind),
            label(&j.spec.datastore)
        );
        let _ = writeln!(
            running,
            "cairn_job_running{{{labels}}} {}",
            u8::from(j.running)
        );
        // Newest first.
        let Some(last) = j.runs.first() else {
            continue;
        };
        if let Some(t) = cairn_core::time::parse_rfc3339(&last.ended) {
            let _ = writeln!(
                ended,
                "cairn_job_last_run_end_timestamp_seconds{{{labels}}} {t}"
            );
        }
        let _ = writeln!(
            ok,
            "cairn_job_last_run_ok{{{labels}}} {}",
            u8::from(last.outcome == "ok")
        );
        let _ = writeln!(
            secs,
            "cairn_job_last_run_duration_seconds{{{labels}}} {}",
            last.secs
        );
    }
    running + &ended + &ok + &secs
}

/// A label value as the text format wants it: `\`, `"` and newlines escaped.
fn label(v: &str) -> String {
    v.replace('\\', "\\\\")
        .replace('"', "\\\"")
        .replace('\n', "\\n")
}
