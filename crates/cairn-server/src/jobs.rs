//! Jobs the server runs on a schedule from its settings file: `scrub` (keyless),
//! `check`, `retention` (forget by a policy, then prune) and `copy` (replication to
//! another datastore, directory, S3 or cairn server), each with a history of
//! runs and their outcome (`GET /v1/jobs`; `POST /v1/jobs/{name}/run` starts one
//! now). `check` and `retention` need the datastore's password: the administrator
//! unlocks the datastore for the server with a password file, which gives the
//! server the key (docs/SERVER.md says what that means).
//!
//! ```toml
//! [datastore_passwords]
//! main = "/etc/cairn/main.password"
//!
//! [[jobs]]
//! name = "nightly-scrub"
//! kind = "scrub"
//! datastore = "main"
//! every = "24h"
//!
//! [[jobs]]
//! name = "retention"
//! kind = "retention"
//! datastore = "main"
//! every = "1d"
//! keep_daily = 7
//! keep_weekly = 4
//! ```

use crate::App;
use cairn_core::units::count;
use serde::{Deserialize, Serialize};
use std::collections::{BTreeMap, VecDeque};
use std::path::PathBuf;
use std::sync::{Arc, Mutex};
use std::time::Duration;

/// Runs kept per job.
const HISTORY: usize = 50;

#[derive(Clone, Debug, Deserialize, Serialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct JobSpec {
    pub name: String,
    /// `scrub`, `check` or `retention`.
    pub kind: String,
    pub datastore: String,
    /// `30m`, `6h`, `1d`...
    pub every: String,
    /// check: read this share of the data too (`10%`), or all of it (`100%`).
    #[serde(default)]
    pub read_data: Option<String>,
    #[serde(default)]
    pub keep_last: Option<i64>,
    #[serde(default)]
    pub keep_hourly: Option<i64>,
    #[serde(default)]
    pub keep_daily: Option<i64>,
    #[serde(default)]
    pub keep_weekly: Option<i64>,
    #[serde(default)]
    pub keep_monthly: Option<i64>,
    #[serde(default)]
    pub keep_yearly: Option<i64>,
    /// retention: every snapshot within this span (`1y2m3d4h`) of each group's
    /// newest, as `forget --keep-within`.
    // Shown as null when unset, as the other keep_* (QA r29: left out of
    // `GET /v1/jobs`).
    #[serde(default)]
    pub keep_within: Option<String>,
    /// copy: where to — a datastore of this server, or a location (directory,
    /// `s3:...`, `cairn+https://...` of another server).
    #[serde(default)]
    pub to: Option<String>,
    /// copy: the destination's password file (default: its entry under
    /// [datastore_passwords] when `to` names a datastore of this server).
    #[serde(default)]
    pub to_password_file: Option<PathBuf>,
    /// copy to another cairn server: its token file and certificate fingerprint.
    #[serde(default)]
    pub to_token_file: Option<PathBuf>,
    #[serde(default)]
    pub to_server_fingerprint: Option<String>,
    /// copy and retention: only the snapshots of these hosts (none: every host).
    #[serde(default)]
    pub hosts: Vec<String>,
    /// copy and retention: only snapshots carrying all tags of one entry
    /// (comma-separated within an entry), as `--tag`.
    #[serde(default)]
    pub tags: Vec<String>,
    /// copy: the destination's pack size for this job (`512K`: a slow link).
    #[serde(default)]
    pub pack_size: Option<String>,
}

/// `90s`, `30m`, `6h`, `1d`, `1h30m` into a duration (as the command line's
/// durations read), at least a minute.
/// The longest `every`: ten years.
const MAX_EVERY_SECS: u64 = 3650 * 86400;

pub fn parse_every(s: &str) -> Result<Duration, String> {
    // Bounded: the scheduler adds it to the clock, which must not overflow.
    let usage = "use a number with s, m, h or d (at least 1m, at most 3650d)";
    match cairn_core::units::parse_duration(s) {
        Ok(d) if (60..=MAX_EVERY_SECS).contains(&d.as_secs()) => Ok(d),
        Err(e) if e.contains("lower case") => {
            let lower = s.trim().to_ascii_lowercase();
            Err(format!(
                "every = {s:?}: units are written in lower case ({lower})"
            ))
        }
        _ => Err(format!("every = {s:?}: {usage}")),
    }
}

impl JobSpec {
    /// A `kind` job on `datastore` every `every`, with no other settings.
    pub fn new(name: &str, kind: &str, datastore: &str, every: &str) -> JobSpec {
        JobSpec {
            name: name.to_string(),
            kind: kind.to_string(),
            datastore: datastore.to_string(),
            every: every.to_string(),
            read_data: None,
            keep_last: None,
            keep_hourly: None,
            keep_daily: None,
            keep_weekly: None,
            keep_monthly: None,
            keep_yearly: None,
            keep_within: None,
            to: None,
            to_password_file: None,
            to_token_file: None,
            to_server_fingerprint: None,
            hosts: Vec::new(),
            tags: Vec::new(),
            pack_size: None,
        }
    }

    /// Checks the spec against the datastores and passwords the server has.
    pub fn validate(
        &self,
        datastores: &BTreeMap<String, String>,
        passwords: &BTreeMap<String, PathBuf>,
    ) -> Result<(), String> {
        let me = format!("job {:?}", self.name);
        if self.name.is_empty() || !crate::config::valid_datastore_name(&self.name) {
            return Err(format!(
                "{me}: a job name uses letters, digits, '-', '_', '.'"
            ));
        }
        // One-off jobs are named `DATASTORE-KIND-now` ([`start_now`]), and the
        // history is kept by name.
        if self.name.ends_with("-now") {
            return Err(format!(
                "{me}: names ending in \"-now\" are the console's one-off jobs; choose another"
            ));
        }
        parse_every(&self.every).map_err(|e| format!("{me}: {e}"))?;
        if !datastores.contains_key(&self.datastore) {
            return Err(format!("{me}: no datastore {:?}", self.datastore));
        }
        // Settings are checked now, not at the first run (which would fail every
        // time), and a setting the kind does not use is a mistake to say.
        if let Some(p) = &self.read_data {
            check_percent(p).map_err(|e| format!("{me}: {e}"))?;
        }
        if let Some(f) = &self.to_server_fingerprint {
            cairn_backend::parse_fingerprint(f).map_err(|e| format!("{me}: {e}"))?;
        }
        if let Some(p) = &self.pack_size {
            self.pack_size_bytes()
                .map_err(|e| format!("{me}: pack_size = {p:?}: {e}"))?;
        }
        for t in &self.tags {
            if t.split(',').any(|x| x.trim().is_empty()) {
                return Err(format!("{me}: tags = {t:?}: a tag is a non-empty name"));
            }
        }
        if let Some(w) = &self.keep_within {
            w.parse::<cairn_core::forget::CalendarDuration>()
                .map_err(|e| format!("{me}: keep_within: {e}"))?;
        }
        self.policy().validate().map_err(|e| format!("{me}: {e}"))?;
        let keeps = !self.policy().is_empty();
        let copy_settings = self.to.is_some()
            || self.to_password_file.is_some()
            || self.to_token_file.is_some()
            || self.to_server_fingerprint.is_some()
            || self.pack_size.is_some();
        let filters = !self.hosts.is_empty() || !self.tags.is_empty();
        let misplaced = match self.kind.as_str() {
            "scrub" | "prune" => [
                (self.read_data.is_some(), "read_data"),
                (keeps, "keep_*"),
                (copy_settings, "to* and pack_size"),
                (filters, "hosts and tags"),
            ]
            .into_iter()
            .find(|(set, _)| *set),
            "check" => [
                (keeps, "keep_*"),
                (copy_settings, "to* and pack_size"),
                (filters, "hosts and tags"),
            ]
            .into_iter()
            .find(|(set, _)| *set),
            "retention" => [
                (self.read_data.is_some(), "read_data"),
                (copy_settings, "to* and pack_size"),
            ]
            .into_iter()
            .find(|(set, _)| *set),
            "copy" => [(self.read_data.is_some(), "read_data"), (keeps, "keep_*")]
                .into_iter()
                .find(|(set, _)| *set),
            _ => None,
        };
        if let Some((_, what)) = misplaced {
            return Err(format!(
                "{me}: {what} does not apply to a {} job",
                self.kind
            ));
        }
        match self.kind.as_str() {
            "scrub" => {}
            "copy" => {
                if !passwords.contains_key(&self.datastore) {
                    return Err(format!(
                        "{me}: a copy job needs the source datastore's password under \
                         [datastore_passwords]"
                    ));
                }
                let Some(to) = &self.to else {
                    return Err(format!("{me}: a copy job needs `to`"));
                };
                if to == &self.datastore {
                    return Err(format!("{me}: `to` is the job's own datastore"));
                }
                // A bare name is a datastore's: taken as a path, it would be one
                // relative to wherever the server runs.
                if !datastores.contains_key(to) && !to.contains(['/', ':']) {
                    return Err(format!(
                        "{me}: `to` = {to:?} is no datastore of this server: give one of \
                         [datastores], or a location (/path, s3:..., cairn+https://...)"
                    ));
                }
                if self.to_password_file.is_none() && !passwords.contains_key(to) {
                    return Err(format!(
                        "{me}: give to_password_file, or the password of datastore {to:?} \
                         under [datastore_passwords]"
                    ));
                }
            }
            "check" | "retention" | "prune" => {
                if !passwords.contains_key(&self.datastore) {
                    return Err(format!(
                        "{me}: a {} job needs the datastore's password: add it under \
                         [datastore_passwords] (see docs/SERVER.md)",
                        self.kind
                    ));
                }
                if self.kind == "retention" && self.policy().is_empty() {
                    return Err(format!(
                        "{me}: a retention job needs at least one keep_* rule"
                    ));
                }
            }
            k => {
                return Err(format!(
                    "{me}: unknown kind {k:?} (scrub, check, prune, retention or copy)"
                ));
            }
        }
        Ok(())
    }

    /// What a copy job needs that is not there now: a destination on this
    /// machine that does not exist, a password or token file that cannot be
    /// read. Said at start (QA r33: a typo showed at the first run, a day
    /// later), not refused: a file on a mount may appear later.
    pub fn missing_now(&self, datastores: &BTreeMap<String, String>) -> Vec<String> {
        let mut out = Vec::new();
        if self.kind != "copy" {
            return out;
        }
        if let Some(to) = &self.to
            && !datastores.contains_key(to)
            && to.starts_with('/')
            && !std::path::Path::new(to).join("config").exists()
        {
            out.push(format!("`to` = {to:?} holds no repository now"));
        }
        for (what, f) in [
            ("to_password_file", &self.to_password_file),
            ("to_token_file", &self.to_token_file),
        ] {
            if let Some(f) = f
                && let Err(e) = std::fs::File::open(f)
            {
                out.push(format!("{what} {} cannot be read ({e})", f.display()));
            }
        }
        out
    }

    /// The snapshots a copy or retention job considers (`hosts`, `tags`).
    fn filter(&self) -> cairn_core::forget::SnapshotFilter {
        cairn_core::forget::SnapshotFilter {
            hosts: self.hosts.clone(),
            tags: self.tags.clone(),
            paths: Vec::new(),
        }
    }

    /// `pack_size` in bytes, within what a client may choose.
    fn pack_size_bytes(&self) -> Result<Option<u64>, String> {
        let Some(p) = &self.pack_size else {
            return Ok(None);
        };
        let n = cairn_core::units::parse_size(p)?;
        if !(cairn_core::repo::CLIENT_PACK_SIZE_MIN..=cairn_core::repo::PACK_SIZE_MAX).contains(&n)
        {
            return Err("between 128K and 256M".into());
        }
        Ok(Some(n))
    }

    fn policy(&self) -> cairn_core::forget::Policy {
        cairn_core::forget::Policy {
            last: self.keep_last,
            hourly: self.keep_hourly,
            daily: self.keep_daily,
            weekly: self.keep_weekly,
            monthly: self.keep_monthly,
            yearly: self.keep_yearly,
            // Checked by `validate` before any job runs.
            within: (self.keep_within.as_deref()).and_then(|w| w.parse().ok()),
            ..Default::default()
        }
    }
}

/// Why a console schedule was not made, changed or removed.
#[derive(Debug, thiserror::Error)]
pub enum ScheduleError {
    /// The settings file defines a job of that name.
    #[error("{0}")]
    Clash(String),
    /// `schedules.json` could not be read or written (a full disk, a damaged file).
    #[error("{0}")]
    File(crate::statefile::StateError),
}

/// One run of a job.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct Run {
    pub started: String,
    pub ended: String,
    pub secs: f64,
    /// `ok`, `problems` (the job ran and found damage) or `failed` (it could not run).
    pub outcome: String,
    pub summary: String,
    /// `schedule`, or `manual by token NAME` (or `user NAME`): a job started
    /// through the API (`POST /v1/jobs/{name}/run`, `POST /v1/jobs`), which is
    /// what the console calls too.
    pub trigger: String,
}

#[derive(Clone, Debug, Serialize)]
pub struct JobStatus {
    #[serde(flatten)]
    pub spec: JobSpec,
    pub running: bool,
    /// Started from the console or the API, not from a schedule.
    pub adhoc: bool,
    /// Where the job is defined: `settings` (the settings file's `[[jobs]]`),
    /// `console` (a schedule made in the console, `PUT /v1/schedules/{name}`;
    /// editable there) or `once` (started now, no schedule).
    pub source: &'static str,
    /// While it runs: phase, bytes (done, total), files, rate, ETA.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub progress: Option<cairn_core::progress::Status>,
    pub runs: Vec<Run>,
}

/// The jobs, their histories (kept in `jobs-history.json` in the state directory)
/// and which are running.
pub struct Jobs {
    /// From the settings file (read-only here).
    pub specs: Vec<JobSpec>,
    /// Schedules made in the console (`schedules.json` in the state directory).
    console: crate::statefile::StateFile<ScheduleFile>,
    passwords: BTreeMap<String, PathBuf>,
    /// `jobs-history.json`: each job's last runs.
    history: crate::statefile::StateFile<History>,
    /// `jobs-running.json`: the jobs running now, so that a run the server did
    /// not live to record (killed, the machine lost power) is recorded at the
    /// next start as interrupted instead of missing from the history.
    started_file: crate::statefile::StateFile<BTreeMap<String, Started>>,
    state: Mutex<State>,
}

/// A running job, as `jobs-running.json` keeps it until its run is recorded.
#[derive(Clone, Debug, Serialize, Deserialize)]
struct Started {
    started: String,
    trigger: String,
    /// The process running it: a server on the same host and boot whose pid is
    /// gone (or is another process: pid 1 of a container restarted), or any on an
    /// earlier boot, no longer runs it.
    host: String,
    boot: String,
    pid: u32,
    /// The process's start, in clock ticks since boot (0: unknown).
    #[serde(default)]
    pid_started: u64,
}

impl Started {
    fn now(trigger: &str) -> Started {
        Started {
            started: cairn_core::time::now_rfc3339(),
            trigger: trigger.to_string(),
            host: cairn_backend::process::hostname(),
            boot: cairn_backend::process::boot_id(),
            pid: std::process::id(),
            pid_started: cairn_backend::process::start_ticks(std::process::id()).unwrap_or(0),
        }
    }

    /// Whether the process that ran the job is certainly gone. A server on
    /// another host sharing the state directory is never judged.
    fn abandoned(&self) -> bool {
        let another_process = || {
            self.pid_started != 0
                && cairn_backend::process::start_ticks(self.pid)
                    .is_some_and(|t| t != self.pid_started)
        };
        self.host == cairn_backend::process::hostname()
            && (self.boot != cairn_backend::process::boot_id()
                || !cairn_backend::process::alive(self.pid)
                || another_process())
    }
}

#[derive(Default, Serialize, Deserialize)]
struct ScheduleFile {
    version: u32,
    jobs: Vec<JobSpec>,
}

/// Kinds of job a schedule made in the console may run (a copy needs files named
/// in the settings file).
pub const CONSOLE_KINDS: [&str; 4] = ["check", "scrub", "prune", "retention"];

#[derive(Default)]
struct State {
    history: History,
    /// The jobs running now, with their progress.
    running: Vec<(String, cairn_core::progress::Progress)>,
    /// Jobs started now rather than by the schedule (`POST …/jobs`), by name.
    adhoc: BTreeMap<String, JobSpec>,
    /// When each scheduled job is next due.
    due: BTreeMap<String, std::time::Instant>,
    /// Console schedules changed since their `due` was set: due `every` from the
    /// change, whenever they last ran.
    changed: std::collections::BTreeSet<String>,
    /// Each running job's start (RFC 3339 and instant) and trigger, for its record.
    started: BTreeMap<String, (String, std::time::Instant, String)>,
    /// The server is stopping: no job starts any more.
    stopping: bool,
}

/// Each job's last runs, oldest first.
type History = BTreeMap<String, VecDeque<Run>>;

/// The job `name` names when it is one started now (`{datastore}-{kind}-now`)
/// and no configured job has that name: listed again after a restart with its
/// runs. Its options (a check's read_data) are not kept: a run again from the
/// list is a plain one.
fn adhoc_spec(name: &str, specs: &[JobSpec]) -> Option<(String, JobSpec)> {
    if specs.iter().any(|s| s.name == name) {
        return None;
    }
    let (ds, kind) = name.strip_suffix("-now")?.rsplit_once('-')?;
    (!ds.is_empty() && ADHOC_KINDS.contains(&kind))
        .then(|| (name.to_string(), JobSpec::new(name, kind, ds, "")))
}

impl Jobs {
    pub fn new(
        specs: Vec<JobSpec>,
        passwords: BTreeMap<String, PathBuf>,
        state_dir: &std::path::Path,
    ) -> Jobs {
        let file = crate::statefile::StateFile::new(state_dir.join("jobs-history.json"));
        // A history that cannot be read starts again empty (it is a record, not a
        // setting), said, and a damaged one is kept aside rather than overwritten
        // by the next run.
        let history: History = match file.load() {
            Ok(h) => h,
            Err(e) => {
                let mut note = format!("warning: jobs' history not read, starting a new one: {e}");
                if let crate::statefile::StateError::Damaged { path, .. } = &e {
                    let aside = path.with_extension("json.damaged");
                    if std::fs::rename(path, &aside).is_ok() {
                        note.push_str(&format!(" (kept as {})", aside.display()));
                    }
                }
                crate::log_line(&note);
                Default::default()
            }
        };
        // Jobs started now (`{datastore}-{kind}-now`) before the restart: listed
        // again with their runs, which would otherwise be in the history file
        // and nowhere else (QA: a scrub that found damage vanished from the
        // console after a restart).
        let adhoc = history
            .keys()
            .filter_map(|n| adhoc_spec(n, &specs))
            .collect();
        let jobs = Jobs {
            specs,
            console: crate::statefile::StateFile::new(state_dir.join("schedules.json")),
            passwords,
            history: file,
            started_file: crate::statefile::StateFile::new(state_dir.join("jobs-running.json")),
            state: Mutex::new(State {
                history,
                adhoc,
                ..Default::default()
            }),
        };
        jobs.record_abandoned();
        jobs
    }

    /// Records as interrupted the runs `jobs-running.json` names whose server is
    /// gone (killed, or the machine stopped): nothing else would say they ran.
    fn record_abandoned(&self) {
        let gone = self.started_file.update(|m| {
            let gone: Vec<(String, Started)> = m
                .iter()
                .filter(|(_, s)| s.abandoned())
                .map(|(n, s)| (n.clone(), s.clone()))
                .collect();
            for (n, _) in &gone {
                m.remove(n);
            }
            Ok::<_, crate::statefile::StateError>(gone)
        });
        let gone = match gone {
            Ok(g) => g,
            Err(e) => {
                // A record, not a setting: set aside, so that runs from now on
                // are noted again.
                let mut note = format!("warning: jobs running at the last stop not read: {e}");
                if let crate::statefile::StateError::Damaged { path, .. } = &e {
                    let aside = path.with_extension("json.damaged");
                    if std::fs::rename(path, &aside).is_ok() {
                        note.push_str(&format!(
                            " (kept as {}; a new one is started)",
                            aside.display()
                        ));
                    }
                }
                crate::log_line(&note);
                return;
            }
        };
        let mut s = self.state.lock().unwrap_or_else(|e| e.into_inner());
        for (name, st) in gone {
            crate::log_line(&format!(
                "job {name}: interrupted: the server stopped without recording it (killed, or \
                 the machine stopped) while it ran, since {}",
                st.started
            ));
            // Its end is not known: the record spans to now, at most.
            let secs = cairn_core::time::parse_rfc3339(&st.started)
                .map_or(0.0, |t| (cairn_core::time::now_unix() - t).max(0) as f64);
            let run = Run {
                started: st.started,
                ended: cairn_core::time::now_rfc3339(),
                secs,
                outcome: "interrupted".into(),
                summary: "the server was killed (or the machine stopped) while it ran; \
                          recorded at the next start, so its end is not known (it ended \
                          by then): what it committed stays, the rest was not committed; \
                          its next run does it"
                    .into(),
                trigger: st.trigger,
            };
            // A job started now whose first run this is: listed with it (QA r20:
            // only the next restart listed it).
            if let Some((n, spec)) = adhoc_spec(&name, &self.specs) {
                s.adhoc.entry(n).or_insert(spec);
            }
            self.record(&mut s, &name, run);
        }
    }

    /// The schedules made in the console, as the file says now (none if it cannot
    /// be read: the error is logged by [`Jobs::check_console_file`] at start).
    pub fn console_specs(&self) -> Vec<JobSpec> {
        self.console
            .current()
            .map(|f| f.jobs.clone())
            .unwrap_or_default()
    }

    /// Why the console's schedule file cannot be read now, if it cannot.
    pub fn console_file_error(&self) -> Option<crate::statefile::StateError> {
        self.console.current().err()
    }

    /// Reads the console's schedule file once, so that a damaged one is reported
    /// when the server starts.
    pub fn check_console_file(&self) -> Result<(), crate::statefile::StateError> {
        self.console.load().map(|_| ())
    }

    /// Every scheduled job: the settings file's, then the console's. A console
    /// schedule named like a job of the settings file (added to the file after the
    /// schedule was made) is left out: the file's job is the one that runs, and the
    /// clash is logged at start ([`Jobs::shadowed`]).
    pub fn scheduled(&self) -> Vec<(JobSpec, &'static str)> {
        let console = self.console_specs().into_iter();
        self.specs
            .iter()
            .map(|s| (s.clone(), "settings"))
            .chain(
                console
                    .filter(|c| !self.specs.iter().any(|s| s.name == c.name))
                    .map(|s| (s, "console")),
            )
            .collect()
    }

    /// Console schedules named like a job of the settings file, which do not run.
    pub fn shadowed(&self) -> Vec<String> {
        self.console_specs()
            .into_iter()
            .filter(|c| self.specs.iter().any(|s| s.name == c.name))
            .map(|c| c.name)
            .collect()
    }

    /// The scheduled job `name`, and where it is defined.
    pub fn find(&self, name: &str) -> Option<(JobSpec, &'static str)> {
        self.scheduled().into_iter().find(|(s, _)| s.name == name)
    }

    /// Adds or replaces a console schedule; refuses a name the settings file uses.
    pub fn put_console(&self, spec: JobSpec) -> Result<bool, ScheduleError> {
        if self.specs.iter().any(|s| s.name == spec.name) {
            return Err(ScheduleError::Clash(format!(
                "job {:?} is defined in the settings file: change it there",
                spec.name
            )));
        }
        let name = spec.name.clone();
        let existed = self
            .console
            .update(|file| {
                let existed = file.jobs.iter().any(|s| s.name == spec.name);
                file.jobs.retain(|s| s.name != spec.name);
                file.jobs.push(spec);
                file.version = 1;
                Ok::<_, crate::statefile::StateError>(existed)
            })
            .map_err(ScheduleError::File)?;
        // A changed interval counts from now (not from the last run, as at start).
        let mut s = self.lock();
        s.due.remove(&name);
        s.changed.insert(name);
        Ok(existed)
    }

    /// Removes a console schedule (its history stays); false if there is none.
    pub fn delete_console(&self, name: &str) -> Result<bool, ScheduleError> {
        let removed = self
            .console
            .update(|file| {
                let before = file.jobs.len();
                file.jobs.retain(|s| s.name != name);
                Ok::<_, crate::statefile::StateError>(file.jobs.len() != before)
            })
            .map_err(ScheduleError::File)?;
        if removed {
            self.lock().due.remove(name);
        }
        Ok(removed)
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    pub fn status(&self) -> Vec<JobStatus> {
        let scheduled = self.scheduled();
        let s = self.lock();
        let adhoc: Vec<_> = s
            .adhoc
            .values()
            .filter(|a| !scheduled.iter().any(|(spec, _)| spec.name == a.name))
            .map(|spec| (spec.clone(), "once"))
            .collect();
        scheduled
            .into_iter()
            .chain(adhoc)
            .map(|(spec, source)| {
                let progress = s
                    .running
                    .iter()
                    .find(|(n, _)| *n == spec.name)
                    .map(|(_, p)| p.status());
                JobStatus {
                    running: progress.is_some(),
                    adhoc: source == "once",
                    source,
                    progress,
                    runs: s
                        .history
                        .get(&spec.name)
                        .map(|h| h.iter().rev().cloned().collect())
                        .unwrap_or_default(),
                    spec,
                }
            })
            .collect()
    }

    /// Marks the job running with `progress`; false if it already is.
    fn begin(&self, name: &str, progress: &cairn_core::progress::Progress, trigger: &str) -> bool {
        let mut s = self.state.lock().unwrap_or_else(|e| e.into_inner());
        if s.stopping || s.running.iter().any(|(n, _)| n == name) {
            return false;
        }
        s.running.push((name.to_string(), progress.clone()));
        let st = Started::now(trigger);
        s.started.insert(
            name.to_string(),
            (
                st.started.clone(),
                std::time::Instant::now(),
                trigger.to_string(),
            ),
        );
        let noted = self.started_file.update(|m| {
            m.insert(name.to_string(), st);
            Ok::<_, crate::statefile::StateError>(())
        });
        if let Err(e) = noted {
            crate::log_line(&format!(
                "job {name}: not noted as running ({e}): if the server is killed during \
                 it, its run is missing from the history"
            ));
        }
        true
    }

    /// The server stops with jobs still running (an upload that does not end at
    /// once): each is recorded as interrupted, so its run is not lost from the
    /// history. What it committed stays; the rest was not committed.
    pub fn record_interrupted(&self) {
        let names: Vec<String> = {
            let s = self.state.lock().unwrap_or_else(|e| e.into_inner());
            s.running.iter().map(|(n, _)| n.clone()).collect()
        };
        for name in names {
            crate::log_line(&format!("job {name}: interrupted: the server stopped"));
            self.finish(
                &name,
                "interrupted",
                "the server stopped while it ran: what it committed stays, the rest was \
                 not committed; its next run does it"
                    .into(),
            );
        }
    }

    /// The server is stopping: every running job is asked to stop (each ends at
    /// its next safe point, as a cancelled command does, and its run is recorded).
    pub fn cancel_all(&self) -> usize {
        let mut s = self.state.lock().unwrap_or_else(|e| e.into_inner());
        // None starts after this (a schedule falling due during the stop).
        s.stopping = true;
        for (_, p) in &s.running {
            p.cancel_token().cancel();
        }
        s.running.len()
    }

    /// The server is stopping (no job starts).
    pub fn is_stopping(&self) -> bool {
        self.state
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .stopping
    }

    /// Jobs running now.
    pub fn running(&self) -> usize {
        self.state
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .running
            .len()
    }

    /// Records the end of `name`'s run (once: a run already recorded as
    /// interrupted is not recorded again, and false says so).
    fn finish(&self, name: &str, outcome: &str, summary: String) -> bool {
        let mut s = self.state.lock().unwrap_or_else(|e| e.into_inner());
        if !s.running.iter().any(|(n, _)| n == name) {
            return false;
        }
        s.running.retain(|(n, _)| n != name);
        let (started, t0, trigger) = s.started.remove(name).unwrap_or_else(|| {
            (
                cairn_core::time::now_rfc3339(),
                std::time::Instant::now(),
                String::new(),
            )
        });
        let run = Run {
            started,
            ended: cairn_core::time::now_rfc3339(),
            secs: t0.elapsed().as_secs_f64(),
            outcome: outcome.to_string(),
            summary,
            trigger,
        };
        self.record(&mut s, name, run);
        let _ = self.started_file.update(|m| {
            m.remove(name);
            Ok::<_, crate::statefile::StateError>(())
        });
        true
    }

    /// Adds `run` to `name`'s history, in memory and on disk.
    fn record(&self, s: &mut State, name: &str, run: Run) {
        // Another server sharing the state directory may have recorded runs of
        // its own jobs since: theirs are kept, ours added (runs told apart by their
        // start and end), the file locked from the read to the write.
        let merged = self.history.update(|disk| {
            for (job, runs) in std::mem::take(disk) {
                let h = s.history.entry(job).or_default();
                for r in runs {
                    if !h
                        .iter()
                        .any(|x| x.started == r.started && x.ended == r.ended)
                    {
                        h.push_back(r);
                    }
                }
                h.make_contiguous()
                    .sort_by(|a, b| a.started.cmp(&b.started));
            }
            s.history
                .entry(name.to_string())
                .or_default()
                .push_back(run.clone());
            for h in s.history.values_mut() {
                while h.len() > HISTORY {
                    h.pop_front();
                }
            }
            disk.clone_from(&s.history);
            Ok::<_, crate::statefile::StateError>(())
        });
        if let Err(e) = merged {
            // Kept in memory at least (the file could not be read or written).
            let h = s.history.entry(name.to_string()).or_default();
            if !h
                .iter()
                .any(|x| x.started == run.started && x.ended == run.ended)
            {
                h.push_back(run);
                if h.len() > HISTORY {
                    h.pop_front();
                }
            }
            // A damaged file is a record, not a setting: what this server knows
            // replaces it.
            let saved = match e {
                crate::statefile::StateError::Damaged { .. } => self.history.save(&s.history),
                e => Err(e),
            };
            if let Err(e) = saved {
                crate::log_line(&format!("job {name}: its run is not kept on disk: {e}"));
            }
        }
    }
}

/// Kinds of job an admin may start now, on a datastore of this server.
pub const ADHOC_KINDS: [&str; 3] = ["check", "scrub", "prune"];

/// Starts a `kind` job on datastore `ds` now (named "`kind`-now", one of each
/// kind per datastore at a time): its name, or why not. `trigger` is recorded
/// with the run.
pub fn start_now(
    app: &Arc<App>,
    ds: &str,
    kind: &str,
    read_data: Option<String>,
    trigger: &str,
) -> Result<String, String> {
    if !ADHOC_KINDS.contains(&kind) {
        return Err(format!("kind {kind:?}: start check, scrub or prune"));
    }
    if let Some(p) = &read_data {
        // As a schedule is refused it (QA r13: a scrub with read_data was started).
        if kind != "check" {
            return Err(format!("read_data does not apply to a {kind} job"));
        }
        check_percent(p)?;
    }
    let name = format!("{ds}-{kind}-now");
    let spec = JobSpec {
        read_data,
        ..JobSpec::new(&name, kind, ds, "")
    };
    {
        let mut s = app.jobs.state.lock().unwrap_or_else(|e| e.into_inner());
        if s.running.iter().any(|(n, _)| *n == name) {
            return Err(format!("{name} is running"));
        }
        s.adhoc.insert(name.clone(), spec.clone());
    }
    if start_spec(app, spec, trigger) {
        Ok(name)
    } else if app.jobs.is_stopping() {
        Err("the server is stopping".into())
    } else {
        Err(format!("{name} is running"))
    }
}

/// `10%` into a share of the packs.
pub fn check_percent(p: &str) -> Result<Option<f64>, String> {
    match p {
        "100%" | "all" => Ok(None),
        p => {
            let pct: f64 = p
                .trim_end_matches('%')
                .parse()
                .map_err(|_| format!("read_data = {p:?}: use a percentage"))?;
            if !(pct > 0.0 && pct <= 100.0) {
                return Err(format!(
                    "read_data = {p:?}: more than 0% and at most 100% (leave it out to read no data)"
                ));
            }
            Ok(Some(pct))
        }
    }
}

/// Starts a run of `name` in the background; false if there is no such job or it
/// is running already.
pub fn start(app: &Arc<App>, name: &str, trigger: &str) -> bool {
    let Some((spec, _)) = app.jobs.find(name) else {
        return false;
    };
    start_spec(app, spec, trigger)
}

/// Starts a run of `spec` in the background; false if it is running already.
fn start_spec(app: &Arc<App>, spec: JobSpec, trigger: &str) -> bool {
    let progress = cairn_core::progress::Progress::new(
        Arc::new(cairn_core::progress::NullSink),
        cairn_core::progress::CancelToken::new(),
    );
    if !app.jobs.begin(&spec.name, &progress, trigger) {
        return false;
    }
    let app = app.clone();
    let trigger = trigger.to_string();
    tokio::spawn(async move {
        crate::log_line(&format!("job {}: started ({trigger})", spec.name));
        let a = app.clone();
        let s = spec.clone();
        let progress_cancelled = progress.clone();
        let result = tokio::task::spawn_blocking(move || run_job(&a, &s, &progress))
            .await
            .unwrap_or_else(|e| Err(format!("the job stopped: {e}")));
        // What the job changed (a retention or prune here; a copy into another
        // of this server's datastores) is read again by the console, whose
        // figures were kept from before (QA: a prune's effect not shown). A check
        // or scrub changes nothing: its figures stay.
        let changed = match spec.kind.as_str() {
            "retention" | "prune" => Some(&spec.datastore),
            "copy" => spec.to.as_ref(),
            _ => None,
        };
        if let Some(d) = changed.and_then(|name| app.datastores.get(name)) {
            d.content.changed();
        }
        let (outcome, summary) = match result {
            Ok((true, s)) => ("ok", s),
            Ok((false, s)) => ("problems", s),
            // Cancelled: the server is stopping (nothing else cancels a job).
            Err(_) if progress_cancelled.is_cancelled() => (
                "interrupted",
                "the server stopped: the job ended at a safe point; nothing it \
                 committed is lost, and its next run picks up from there"
                    .to_string(),
            ),
            Err(e) => ("failed", e),
        };
        let line = format!("job {}: {outcome}: {summary}", spec.name);
        if app.jobs.finish(&spec.name, outcome, summary) {
            crate::log_line(&line);
        } else {
            // Recorded as interrupted when the server stopped without waiting
            // for it: its end is said, the record stays.
            crate::log_line(&format!("{line} (after it was recorded as interrupted)"));
        }
    });
    true
}

/// The schedule: each job runs `every` after its last recorded run (at once if
/// that is past; `every` after the server started if it never ran, or after its
/// schedule was made or changed in the console), then every `every` (a run still
/// going when the next is due is not started twice). Schedules are looked at every
/// few seconds, so one made, changed or removed in the console takes effect
/// without a restart.
pub fn schedule(app: &Arc<App>) {
    let app = app.clone();
    tokio::spawn(async move {
        let mut tick = tokio::time::interval(Duration::from_secs(2));
        // (Unreadable at start: said then.)
        let mut unreadable = app.jobs.console_file_error().map(|e| e.to_string());
        loop {
            tick.tick().await;
            // The console's schedules damaged (or mended) while the server runs.
            let now = app.jobs.console_file_error().map(|e| e.to_string());
            if now != unreadable {
                crate::log_line(&match &now {
                    Some(e) => format!(
                        "warning: the console's schedules cannot be read ({e}): none of them \
                         runs until the file is mended or removed"
                    ),
                    None => "the console's schedules can be read again: they run".to_string(),
                });
                unreadable = now;
            }
            for name in due_now(&app.jobs, std::time::Instant::now()) {
                if !start(&app, &name, "schedule") && !app.jobs.is_stopping() {
                    crate::log_line(&format!(
                        "job {name}: due, but its previous run is still going: this run is skipped"
                    ));
                }
            }
        }
    });
}

/// How long ago (by `wall`, the clock's Unix time at `now`) job `name`'s last
/// recorded run started; `None` without one, or when it started in that clock's
/// future (the clock was set back: its beat then counts from now).
fn since_last_run(history: &History, name: &str, wall: i64) -> Option<Duration> {
    let last = history
        .get(name)?
        .iter()
        .filter_map(|r| cairn_core::time::parse_rfc3339(&r.started))
        .max()?;
    u64::try_from(wall.checked_sub(last)?)
        .ok()
        .map(Duration::from_secs)
}

/// The scheduled jobs due at `now`, each then set due again `every` later.
fn due_now(jobs: &Jobs, now: std::time::Instant) -> Vec<String> {
    due_at(jobs, now, cairn_core::time::now_unix())
}

/// [`due_now`] with the wall clock's Unix time at `now`, which dates runs.
fn due_at(jobs: &Jobs, now: std::time::Instant, wall: i64) -> Vec<String> {
    let scheduled = jobs.scheduled();
    let mut s = jobs.lock();
    s.due
        .retain(|name, _| scheduled.iter().any(|(j, _)| &j.name == name));
    let mut out = Vec::new();
    for (spec, _) in scheduled {
        let Ok(every) = parse_every(&spec.every) else {
            continue;
        };
        // `every` is bounded (ten years), so these additions cannot overflow; a
        // clock that could not take one skips the job rather than stop every other.
        let Some(first) = now.checked_add(every) else {
            continue;
        };
        // First seen (the server started): `every` after its last run, which may
        // be now. Counted from the start instead, a server restarted more often
        // than `every` (an update, a reboot a night) never ran it.
        let changed = s.changed.remove(&spec.name);
        let first = match since_last_run(&s.history, &spec.name, wall) {
            _ if changed => first,
            Some(since) if since >= every => now,
            Some(since) => now.checked_add(every - since).unwrap_or(first),
            None => first,
        };
        let due = s.due.entry(spec.name.clone()).or_insert(first);
        if *due <= now {
            // On the schedule's own beat (the scheduler looks every few seconds,
            // which must not push every run later), past any beats missed.
            while *due <= now {
                match due.checked_add(every) {
                    Some(next) => *due = next,
                    None => break,
                }
            }
            out.push(spec.name);
        }
    }
    out
}

/// Whether two locations name the same place (a path written with a trailing
/// `/` or through `.`/`..` is the same directory).
fn same_location(a: &str, b: &str) -> bool {
    if a == b {
        return true;
    }
    let (pa, pb) = (std::path::Path::new(a), std::path::Path::new(b));
    pa.is_absolute()
        && pb.is_absolute()
        && matches!(
            (std::fs::canonicalize(pa), std::fs::canonicalize(pb)),
            (Ok(x), Ok(y)) if x == y
        )
}

/// Runs one job to its end (blocking): (clean, one-line summary), or why it could
/// not run.
fn run_job(
    app: &App,
    spec: &JobSpec,
    progress: &cairn_core::progress::Progress,
) -> Result<(bool, String), String> {
    let ds = app
        .datastores
        .get(&spec.datastore)
        .ok_or_else(|| format!("no datastore {}", spec.datastore))?;
    if spec.kind == "scrub" {
        let r = crate::scrub::scrub(ds.backend.as_ref(), 2, progress).map_err(|e| e.to_string())?;
        // Packs whose content does not match their name: backups through this
        // server are no longer told their chunks are stored (a scrub read every
        // pack, so this is the whole set).
        ds.dedup.scrub_found(
            (r.problems.iter())
                .filter(|p| p.problem != "vanished")
                .map(|p| p.name.as_str()),
        );
        let damaged = r
            .problems
            .iter()
            .filter(|p| p.problem != "vanished")
            .count();
        return Ok((
            r.is_clean(),
            format!(
                "{}, {} read, {damaged} damaged{}",
                count(r.objects_checked, "object"),
                cairn_core::units::bytes(r.bytes_read, 1),
                r.problems
                    .iter()
                    .filter(|p| p.problem != "vanished")
                    .take(3)
                    .map(|p| format!("; {}: {}", p.name, p.problem))
                    .collect::<String>()
            ),
        ));
    }
    let progress = progress.clone();
    // The key the server holds if the datastore is unlocked, else its password file.
    let repo = match ds.content.repository() {
        Some(r) => r.map_err(|e| e.to_string())?,
        None if ds.content.key_withheld() => {
            return Err(
                "the datastore was locked by an admin: its key (and password file) \
                 is not used until it is unlocked again"
                    .into(),
            );
        }
        None => {
            let password_file = app
                .jobs
                .passwords
                .get(&spec.datastore)
                .ok_or(
                    "the datastore is locked: unlock it in the console or give its password file",
                )?
                .clone();
            let opts = cairn_core::repo::storage::StorageOptions {
                cache: cairn_core::repo::storage::CacheChoice::Off,
                ..Default::default()
            };
            cairn_core::Repository::open_at(
                &ds.location,
                &opts,
                password_from(password_file),
                &progress,
            )
            .map_err(|e| e.to_string())?
        }
    };
    if spec.kind == "retention" || spec.kind == "prune" {
        // The console's read session would hold up the prune.
        ds.content.end_session();
    }
    use cairn_core::session::{Read, Write};
    use cairn_core::{IndexLoad, Session};
    match spec.kind.as_str() {
        "check" => {
            let subset = match spec.read_data.as_deref() {
                None => None,
                Some(p) => check_percent(p)?.map(cairn_core::check::Subset::Percent),
            };
            let mut session = Session::<Read>::open(repo, "check", IndexLoad::Deferred, &progress)
                .map_err(|e| e.to_string())?;
            let r = cairn_core::check::check(
                &mut session,
                &cairn_core::check::CheckOptions {
                    read_data: spec.read_data.is_some(),
                    subset,
                },
            )
            .map_err(|e| e.to_string())?;
            // The first problems by name, as `check` prints them: a run that only
            // said "3 problems" left the admin to run check again to learn which.
            const NAMED: usize = 3;
            let mut named: Vec<String> = r
                .problems
                .iter()
                .take(NAMED)
                .map(|p| p.describe())
                .collect();
            if r.problems.len() > NAMED {
                named.push(format!("and {} more", r.problems.len() - NAMED));
            }
            Ok((
                r.problems.is_empty(),
                format!(
                    "{}, {} ({} read), {}{}",
                    count(r.snapshots as u64, "snapshot"),
                    count(r.packs as u64, "pack"),
                    r.packs_read,
                    count(r.problems.len() as u64, "problem"),
                    if named.is_empty() {
                        String::new()
                    } else {
                        format!(": {}", named.join("; "))
                    }
                ),
            ))
        }
        "retention" => {
            let session = Session::<Write>::open(repo, "forget", IndexLoad::None, &progress)
                .map_err(|e| e.to_string())?;
            let f = cairn_core::forget::forget(
                &session,
                &cairn_core::forget::ForgetRequest::Policy {
                    policy: Box::new(spec.policy()),
                    group_by: Default::default(),
                    filter: spec.filter(),
                },
                false,
            )
            .map_err(|e| e.to_string())?;
            let removed = f.removed;
            let late: usize = f.groups.iter().map(|g| g.stored_late.len()).sum();
            // What forget removed is said even when prune then fails: the run is
            // the only record of it.
            let forgot = || {
                let ids: Vec<String> = f
                    .groups
                    .iter()
                    .flat_map(|g| g.remove.iter().map(|e| e.short_id.clone()))
                    .collect();
                let mut s = format!("forgot {}", count(removed as u64, "snapshot"));
                if !ids.is_empty() {
                    s.push_str(&format!(" ({})", ids.join(", ")));
                }
                if !f.failed.is_empty() {
                    s.push_str(&format!(
                        ", {} could not be removed",
                        count(f.failed.len() as u64, "snapshot")
                    ));
                }
                s
            };
            let summary = prune_now(session.into_repo(), &progress)
                .map_err(|e| format!("{}; prune failed: {e}", forgot()))?;
            // Snapshots stored late are worth an admin's look: a client may be
            // backdating junk (they took no slot from real backups).
            let late = if late > 0 {
                format!(
                    " ({} stored late, after a newer one of their group: not counted against the others)",
                    count(late as u64, "snapshot")
                )
            } else {
                String::new()
            };
            Ok((
                f.failed.is_empty(),
                format!("{}{late}; prune {summary}", forgot()),
            ))
        }
        "prune" => Ok((true, prune_now(repo, &progress)?)),
        "copy" => {
            let to = spec.to.clone().ok_or("no destination")?;
            // A datastore of this server by name, else a location.
            // A datastore of this server named by its location is the same one.
            let named = app
                .datastores
                .get(&to)
                .or_else(|| (app.datastores.values()).find(|d| same_location(&d.location, &to)));
            let (location, pw_file) = match named {
                // Locked by an admin, a datastore of this server is not opened by
                // the server for anything, as a copy's destination neither (QA r33:
                // the job wrote into it with its password file).
                Some(d) if d.content.key_withheld() => {
                    return Err(format!(
                        "the destination datastore {to} was locked by an admin: the server \
                         does not open it until it is unlocked again"
                    ));
                }
                Some(d) => (
                    d.location.clone(),
                    spec.to_password_file
                        .clone()
                        .or_else(|| app.jobs.passwords.get(&d.name).cloned()),
                ),
                None => (to.clone(), spec.to_password_file.clone()),
            };
            let pw_file = pw_file.ok_or("no password for the destination")?;
            let token = match &spec.to_token_file {
                Some(f) => Some(
                    std::fs::read_to_string(f)
                        .map_err(|e| format!("cannot read {}: {e}", f.display()))?
                        .trim()
                        .to_string(),
                ),
                None => None,
            };
            let dst_opts = cairn_core::repo::storage::StorageOptions {
                cache: cairn_core::repo::storage::CacheChoice::Off,
                server: cairn_backend::ServerOptions {
                    token,
                    fingerprint: spec.to_server_fingerprint.clone(),
                    ..Default::default()
                },
                ..Default::default()
            };
            let dst = cairn_core::Repository::open_at(
                &location,
                &dst_opts,
                password_from(pw_file),
                &progress,
            )
            .map_err(|e| format!("the destination {to}: {e}"))?;
            let mut src = Session::<Read>::open(repo, "copy", IndexLoad::Deferred, &progress)
                .map_err(|e| e.to_string())?;
            // Said as the destination's (QA: a restore token there read as if
            // the source had refused).
            let mut dst = Session::<cairn_core::session::Backup>::open(
                dst,
                "copy",
                IndexLoad::Deferred,
                &progress,
            )
            .map_err(|e| format!("the destination {to}: {e}"))?;
            let r = cairn_core::copy::copy(
                &mut src,
                &mut dst,
                &[],
                &cairn_core::copy::CopyOptions {
                    threads: 2,
                    map_dir: Some(app.config.state_dir.join("copy-maps")),
                    filter: spec.filter(),
                    pack_size: spec.pack_size_bytes()?,
                },
            )
            .map_err(|e| e.to_string())?;
            Ok(copy_summary(&r, &to))
        }
        k => Err(format!("unknown job kind {k}")),
    }
}

/// A copy run's outcome (false: problems) and summary. What went wrong is named,
/// the first few of each kind, as a check run names its problems (QA: a run
/// said "problems" and "copied 1 snapshot", and the admin had to guess which
/// source snapshot could not be read).
fn copy_summary(r: &cairn_core::copy::CopyReport, to: &str) -> (bool, String) {
    const NAMED: usize = 3;
    let mut problems: Vec<String> = Vec::new();
    let mut name = |what: Vec<String>| {
        let n = what.len();
        problems.extend(what.into_iter().take(NAMED));
        if n > NAMED {
            problems.push(format!("and {} more", n - NAMED));
        }
    };
    name(
        r.failed
            .iter()
            .map(|f| format!("snapshot {} not copied: {}", f.source.short(), f.error))
            .collect(),
    );
    name(
        r.unreadable_source_snapshots
            .iter()
            .map(|e| format!("not read from the source: {e}"))
            .collect(),
    );
    name(r.warnings.clone());
    let mut summary = format!(
        "copied {} to {to}, {} sent",
        count(r.snapshots_copied as u64, "snapshot"),
        cairn_core::units::bytes(r.bytes_sent, 1),
    );
    if !r.failed.is_empty() {
        summary.push_str(&format!(", {} failed", r.failed.len()));
    }
    if !problems.is_empty() {
        summary.push_str("; ");
        summary.push_str(&problems.join("; "));
    }
    (problems.is_empty(), summary)
}

/// Prunes (blocking); a one-line summary.
fn prune_now(
    repo: cairn_core::Repository,
    progress: &cairn_core::progress::Progress,
) -> Result<String, String> {
    use cairn_core::session::{Exclusive, IndexLoad, Session};
    let mut session = Session::<Exclusive>::open(repo, "prune", IndexLoad::None, progress)
        .map_err(|e| e.to_string())?;
    let p =
        cairn_core::prune::prune(&mut session, &Default::default()).map_err(|e| e.to_string())?;
    Ok(format!(
        "deleted {} ({}), {} waiting for running jobs",
        count(p.deleted_packs as u64, "pack"),
        cairn_core::units::bytes(p.deleted_bytes, 1),
        p.deferred_packs
    ))
}

/// Reads the first line of a password file when the repository asks for it.
pub(crate) fn password_from(file: PathBuf) -> impl FnOnce() -> cairn_core::Result<String> {
    move || {
        let text = std::fs::read_to_string(&file).map_err(|e| {
            cairn_core::Error::Invalid(format!(
                "cannot read the password file {}: {e}",
                file.display()
            ))
        })?;
        Ok(text.lines().next().unwrap_or("").to_string())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn intervals() {
        assert_eq!(parse_every("90s").unwrap(), Duration::from_secs(90));
        assert_eq!(parse_every("6h").unwrap(), Duration::from_secs(6 * 3600));
        assert_eq!(parse_every("1d").unwrap(), Duration::from_secs(86400));
        assert_eq!(
            parse_every("3650d").unwrap(),
            Duration::from_secs(3650 * 86400)
        );
        // Past ten years, or past what a u64 holds: refused, never an overflow of
        // the scheduler's clock.
        for bad in [
            "",
            "10s",
            "5",
            "1w",
            "xh",
            "3651d",
            "18446744073709551615s",
            "200000000000000d",
            "1é",
            "é",
        ] {
            assert!(parse_every(bad).is_err(), "{bad}");
        }
        // A stray space is forgiven; an upper-case unit is answered with the form
        // meant (QA r13: " 1d" taken, "1D" refused blankly).
        assert_eq!(parse_every(" 1d").unwrap(), Duration::from_secs(86400));
        let e = parse_every("1D").unwrap_err();
        assert!(e.contains("units are written in lower case (1d)"), "{e}");
    }

    fn spec(name: &str, kind: &str, every: &str) -> JobSpec {
        JobSpec::new(name, kind, "main", every)
    }

    #[test]
    fn two_servers_on_one_state_directory_keep_each_others_runs() {
        let dir = tempfile::tempdir().unwrap();
        let one = Jobs::new(vec![spec("a", "scrub", "1h")], BTreeMap::new(), dir.path());
        let two = Jobs::new(vec![spec("b", "scrub", "1h")], BTreeMap::new(), dir.path());
        let p = cairn_core::progress::Progress::none();
        assert!(one.begin("a", &p, "schedule"));
        one.finish("a", "ok", "first".into());
        assert!(two.begin("b", &p, "schedule"));
        two.finish("b", "ok", "second".into());
        let again = Jobs::new(
            vec![spec("a", "scrub", "1h"), spec("b", "scrub", "1h")],
            BTreeMap::new(),
            dir.path(),
        );
        let runs: Vec<usize> = again.status().iter().map(|j| j.runs.len()).collect();
        assert_eq!(runs, [1, 1]);
    }

    /// A job started now (a "Scrub now") is listed with its runs after a
    /// restart, as a one-off, once; a settings job of such a name stays that.
    #[test]
    fn jobs_started_now_are_listed_again_after_a_restart() {
        let dir = tempfile::tempdir().unwrap();
        let one = Jobs::new(
            vec![spec("x-check-now", "check", "1h")],
            BTreeMap::new(),
            dir.path(),
        );
        let p = cairn_core::progress::Progress::none();
        for name in ["main-scrub-now", "my-ds-prune-now", "x-check-now", "other"] {
            one.state
                .lock()
                .unwrap()
                .adhoc
                .insert(name.into(), JobSpec::new(name, "scrub", "main", ""));
            assert!(one.begin(name, &p, "console"));
            one.finish(name, "problems", "2 damaged".into());
        }
        let again = Jobs::new(
            vec![spec("x-check-now", "check", "1h")],
            BTreeMap::new(),
            dir.path(),
        );
        let listed: Vec<(String, String, String, bool, usize)> = again
            .status()
            .into_iter()
            .map(|j| {
                (
                    j.spec.name,
                    j.spec.kind,
                    j.spec.datastore,
                    j.adhoc,
                    j.runs.len(),
                )
            })
            .collect();
        let want = |n: &str, k: &str, d: &str, a: bool| (n.into(), k.into(), d.into(), a, 1);
        assert_eq!(
            listed,
            [
                want("x-check-now", "check", "main", false),
                want("main-scrub-now", "scrub", "main", true),
                want("my-ds-prune-now", "prune", "my-ds", true),
            ]
        );
    }

    /// A copy job's files and local destination that are not there are named
    /// at start; what is there, and a destination elsewhere, are not.
    #[test]
    fn a_copy_jobs_missing_files_are_named_at_start() {
        let dir = tempfile::tempdir().unwrap();
        let pw = dir.path().join("pw");
        std::fs::write(&pw, "x\n").unwrap();
        std::fs::create_dir(dir.path().join("repo")).unwrap();
        std::fs::write(dir.path().join("repo").join("config"), "x").unwrap();
        let ds: BTreeMap<String, String> = [("main".to_string(), "/x".to_string())].into();
        let mut j = spec("j", "copy", "1d");
        j.to = Some(dir.path().join("nope").display().to_string());
        j.to_password_file = Some(dir.path().join("pw-typo"));
        j.to_token_file = Some(pw.clone());
        let m = j.missing_now(&ds);
        assert_eq!(m.len(), 2, "{m:?}");
        assert!(m[0].contains("holds no repository now"), "{m:?}");
        assert!(
            m[1].contains("to_password_file") && m[1].contains("pw-typo"),
            "{m:?}"
        );
        j.to = Some(dir.path().join("repo").display().to_string());
        j.to_password_file = Some(pw);
        assert!(j.missing_now(&ds).is_empty());
        j.to = Some("cairn+https://h:1/x".into());
        assert!(j.missing_now(&ds).is_empty());
        j.to = Some("main".into());
        assert!(j.missing_now(&ds).is_empty());
    }

    #[test]
    fn settings_are_checked_at_start_not_at_the_first_run() {
        let ds: BTreeMap<String, String> = [("main".to_string(), "/x".to_string())].into();
        let pw: BTreeMap<String, PathBuf> = [("main".to_string(), PathBuf::from("/p"))].into();
        let check = |f: &dyn Fn(&mut JobSpec), kind: &str| {
            let mut j = spec("j", kind, "1h");
            f(&mut j);
            j.validate(&ds, &pw)
        };
        assert!(check(&|_| {}, "check").is_ok());
        let e = check(&|j| j.read_data = Some("150%".into()), "check").unwrap_err();
        assert!(e.contains("150%"), "{e}");
        let e = check(&|j| j.keep_last = Some(3), "scrub").unwrap_err();
        assert!(e.contains("keep_* does not apply to a scrub job"), "{e}");
        let e = check(&|j| j.read_data = Some("10%".into()), "scrub").unwrap_err();
        assert!(e.contains("read_data"), "{e}");
        let e = check(
            &|j| {
                j.to = Some("cairn+https://h:1/x".into());
                j.to_password_file = Some("/q".into());
                j.to_server_fingerprint = Some("zzz".into());
            },
            "copy",
        )
        .unwrap_err();
        assert!(e.contains("zzz"), "{e}");
        // Host and tag filters for copy and retention only; a pack size for copy
        // only, within what a client may choose.
        let copy_to = |j: &mut JobSpec| {
            j.to = Some("/r".into());
            j.to_password_file = Some("/q".into());
        };
        let e = check(&|j| j.hosts = vec!["web01".into()], "scrub").unwrap_err();
        assert!(e.contains("hosts and tags does not apply"), "{e}");
        let e = check(
            &|j| {
                j.keep_last = Some(1);
                j.pack_size = Some("1M".into());
            },
            "retention",
        )
        .unwrap_err();
        assert!(e.contains("pack_size"), "{e}");
        let e = check(
            &|j| {
                copy_to(j);
                j.pack_size = Some("64K".into());
            },
            "copy",
        )
        .unwrap_err();
        assert!(e.contains("between 128K and 256M"), "{e}");
        let e = check(
            &|j| {
                copy_to(j);
                j.tags = vec!["a,,b".into()];
            },
            "copy",
        )
        .unwrap_err();
        assert!(e.contains("a tag is a non-empty name"), "{e}");
        // keep_within is a span as --keep-within's, and a rule of its own.
        let e = check(&|j| j.keep_within = Some("2w".into()), "retention").unwrap_err();
        assert!(e.contains("keep_within") && e.contains("7d"), "{e}");
        assert!(check(&|j| j.keep_within = Some("14d".into()), "retention").is_ok());
        let e = check(&|j| j.keep_within = Some("14d".into()), "check").unwrap_err();
        assert!(e.contains("keep_*"), "{e}");
        // A bare name is a datastore's, never a path relative to the server's
        // working directory (a datastore removed from the settings).
        let e = check(
            &|j| {
                copy_to(j);
                j.to = Some("offsite".into());
            },
            "copy",
        )
        .unwrap_err();
        assert!(e.contains("is no datastore of this server"), "{e}");
        assert!(
            check(
                &|j| {
                    copy_to(j);
                    j.hosts = vec!["web01".into()];
                    j.tags = vec!["daily".into()];
                    j.pack_size = Some("512K".into());
                },
                "copy"
            )
            .is_ok()
        );
    }

    #[test]
    fn console_schedules_are_made_changed_removed_and_fall_due() {
        let dir = tempfile::tempdir().unwrap();
        let jobs = Jobs::new(
            vec![spec("nightly", "scrub", "1d")],
            BTreeMap::new(),
            dir.path(),
        );
        assert_eq!(
            jobs.put_console(spec("hourly", "check", "2h")).ok(),
            Some(false)
        );
        assert_eq!(
            jobs.put_console(spec("hourly", "check", "1h")).ok(),
            Some(true)
        );
        assert!(jobs.put_console(spec("nightly", "check", "1h")).is_err());
        let all = jobs.scheduled();
        assert_eq!(all.len(), 2);
        assert_eq!(all[1], (spec("hourly", "check", "1h"), "console"));
        let progress = cairn_core::progress::Progress::none();
        assert!(jobs.begin("hourly", &progress, "schedule"));
        jobs.finish("hourly", "ok", "fine".into());
        // Recorded once: a second end of the same run (after the server recorded
        // it as interrupted) is not another run.
        jobs.finish("hourly", "failed", "late".into());
        // Kept across a restart (another Jobs on the same state directory): the
        // schedule and its runs.
        let again = Jobs::new(Vec::new(), BTreeMap::new(), dir.path());
        assert_eq!(again.console_specs(), vec![spec("hourly", "check", "1h")]);
        let status = again.status();
        assert_eq!(status[0].runs.len(), 1);
        assert_eq!(status[0].runs[0].summary, "fine");
        // After a restart a job is due `every` after its last run, not after the
        // start: 20 minutes after an hourly run, 40 minutes on; two hours after
        // it, at once (a server restarted more often than `every` ran it never).
        let (t1, wall) = (std::time::Instant::now(), cairn_core::time::now_unix());
        let min = Duration::from_secs(60);
        assert!(due_at(&again, t1, wall + 20 * 60).is_empty());
        assert!(due_at(&again, t1 + 39 * min, wall + 59 * 60).is_empty());
        assert_eq!(due_at(&again, t1 + 41 * min, wall + 61 * 60), ["hourly"]);
        let third = Jobs::new(Vec::new(), BTreeMap::new(), dir.path());
        assert_eq!(due_at(&third, t1, wall + 2 * 3600), ["hourly"]);
        assert!(due_at(&third, t1 + 59 * min, wall + 3 * 3600).is_empty());
        // A clock set back before the last run: one interval from now.
        let fourth = Jobs::new(Vec::new(), BTreeMap::new(), dir.path());
        assert!(due_at(&fourth, t1, wall - 3600).is_empty());
        assert!(due_at(&fourth, t1 + 59 * min, wall).is_empty());
        assert_eq!(due_at(&fourth, t1 + 61 * min, wall), ["hourly"]);

        let t0 = std::time::Instant::now();
        let hour = Duration::from_secs(3600);
        assert!(due_now(&jobs, t0).is_empty(), "first due one interval in");
        assert_eq!(due_now(&jobs, t0 + hour), ["hourly"]);
        assert!(due_now(&jobs, t0 + hour + Duration::from_secs(1)).is_empty());
        // Looked at 2 s late: the next run is still on the hour, not 2 s later.
        assert!(due_now(&jobs, t0 + 2 * hour - Duration::from_secs(1)).is_empty());
        assert_eq!(
            due_now(&jobs, t0 + 2 * hour + Duration::from_secs(2)),
            ["hourly"]
        );
        assert_eq!(due_now(&jobs, t0 + 3 * hour), ["hourly"]);
        let day = Duration::from_secs(86400);
        assert_eq!(due_now(&jobs, t0 + day), ["nightly", "hourly"]);
        // Changed: due one new interval after the change.
        jobs.put_console(spec("hourly", "check", "2h")).unwrap();
        let later = t0 + day + Duration::from_secs(10);
        assert!(due_now(&jobs, later).is_empty());
        assert_eq!(due_now(&jobs, later + 2 * hour), ["hourly"]);
        assert_eq!(jobs.delete_console("hourly").ok(), Some(true));
        assert_eq!(jobs.delete_console("hourly").ok(), Some(false));
        assert!(due_now(&jobs, later + 10 * hour).is_empty());
        assert_eq!(jobs.scheduled().len(), 1);
    }

    #[test]
    fn one_name_one_job_and_a_damaged_history_is_kept_aside() {
        let dir = tempfile::tempdir().unwrap();
        let jobs = Jobs::new(Vec::new(), BTreeMap::new(), dir.path());
        jobs.put_console(spec("r1", "retention", "1h")).unwrap();
        // The settings file gets a job of that name later: it runs, the console's
        // does not (listed once), and the console's can still be removed.
        let jobs = Jobs::new(vec![spec("r1", "scrub", "1d")], BTreeMap::new(), dir.path());
        assert_eq!(jobs.shadowed(), ["r1"]);
        let scheduled = jobs.scheduled();
        assert_eq!(scheduled.len(), 1);
        assert_eq!(
            (scheduled[0].0.kind.as_str(), scheduled[0].1),
            ("scrub", "settings")
        );
        // The names of one-off jobs are not for schedules.
        let ds: BTreeMap<String, String> = [("main".to_string(), "/x".to_string())].into();
        let e = spec("main-scrub-now", "scrub", "1d")
            .validate(&ds, &BTreeMap::new())
            .unwrap_err();
        assert!(e.contains("one-off"), "{e}");
        // A damaged history: said, kept aside, a new one started.
        std::fs::write(dir.path().join("jobs-history.json"), b"{garbage").unwrap();
        let again = Jobs::new(Vec::new(), BTreeMap::new(), dir.path());
        assert!(again.status().iter().all(|j| j.runs.is_empty()));
        assert_eq!(
            std::fs::read(dir.path().join("jobs-history.json.damaged")).unwrap(),
            b"{garbage"
        );
    }

    /// A run the server did not live to record (killed with SIGKILL, the machine
    /// lost power) is recorded as interrupted at the next start; a run of a server
    /// still running (this process) or on another host is left alone.
    #[test]
    fn a_run_the_server_did_not_live_to_record_is_recorded_at_the_next_start() {
        let dir = tempfile::tempdir().unwrap();
        let specs = || {
            ["copy", "live", "container"]
                .map(|n| spec(n, "scrub", "1d"))
                .to_vec()
        };
        let jobs = Jobs::new(specs(), BTreeMap::new(), dir.path());
        let p = cairn_core::progress::Progress::none();
        assert!(jobs.begin("live", &p, "schedule"));
        assert!(jobs.begin("copy", &p, "manual"));
        drop(jobs);
        // "copy" ran in a server that is gone now (a pid that ended), and a third
        // job in a server on another host sharing the directory.
        let path = dir.path().join("jobs-running.json");
        let mut m: BTreeMap<String, Started> =
            serde_json::from_slice(&std::fs::read(&path).unwrap()).unwrap();
        let mut child = std::process::Command::new("true").spawn().unwrap();
        let gone = child.id();
        child.wait().unwrap();
        m.get_mut("copy").unwrap().pid = gone;
        let mut elsewhere = m["copy"].clone();
        elsewhere.host = "another-host".into();
        m.insert("theirs".into(), elsewhere);
        // A server that was pid 1 of its container, as the next one is: the same
        // pid, another process (started at another time).
        let mut container = m["live"].clone();
        container.pid_started += 1;
        m.insert("container".into(), container);
        // A job started now (from the console or the API), killed in its first
        // run: listed with that run at once (QA r20: at the restart after).
        let adhoc = m["copy"].clone();
        m.insert("main-scrub-now".into(), adhoc);
        std::fs::write(&path, serde_json::to_vec(&m).unwrap()).unwrap();

        let again = Jobs::new(specs(), BTreeMap::new(), dir.path());
        let runs = |name: &str| {
            again
                .status()
                .into_iter()
                .find(|j| j.spec.name == name)
                .map(|j| j.runs)
                .unwrap_or_default()
        };
        let copy = runs("copy");
        assert_eq!(copy.len(), 1);
        assert_eq!(
            (copy[0].outcome.as_str(), copy[0].trigger.as_str()),
            ("interrupted", "manual")
        );
        assert!(copy[0].summary.contains("killed"), "{}", copy[0].summary);
        assert!(runs("live").is_empty(), "this process still runs it");
        assert_eq!(runs("container")[0].outcome, "interrupted");
        assert_eq!(runs("main-scrub-now")[0].outcome, "interrupted");
        let left: BTreeMap<String, Started> =
            serde_json::from_slice(&std::fs::read(&path).unwrap()).unwrap();
        assert_eq!(left.keys().collect::<Vec<_>>(), ["live", "theirs"]);
        // A run that ends is no longer listed.
        assert!(again.begin("copy", &p, "schedule"));
        let left: BTreeMap<String, Started> =
            serde_json::from_slice(&std::fs::read(&path).unwrap()).unwrap();
        assert_eq!(left.keys().collect::<Vec<_>>(), ["copy", "live", "theirs"]);
        again.finish("copy", "ok", "done".into());
        let left: BTreeMap<String, Started> =
            serde_json::from_slice(&std::fs::read(&path).unwrap()).unwrap();
        assert_eq!(left.keys().collect::<Vec<_>>(), ["live", "theirs"]);
        // A damaged file is set aside, and runs are noted again.
        std::fs::write(&path, b"garb{").unwrap();
        let again = Jobs::new(specs(), BTreeMap::new(), dir.path());
        assert_eq!(
            std::fs::read(dir.path().join("jobs-running.json.damaged")).unwrap(),
            b"garb{"
        );
        assert!(again.begin("copy", &p, "schedule"));
        let left: BTreeMap<String, Started> =
            serde_json::from_slice(&std::fs::read(&path).unwrap()).unwrap();
        assert_eq!(left.keys().collect::<Vec<_>>(), ["copy"]);
    }
}
