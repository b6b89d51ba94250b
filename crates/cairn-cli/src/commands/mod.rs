//! One module per subcommand. Each turns its flags into engine options, opens the
//! repository and a session through the engine, calls one operation and renders
//! the report it returns (`--json`: the report itself).

mod backup;
mod bench;
mod check;
mod config;
mod copy;
mod diff;
mod dump;
mod estimate;
mod export;
mod find;
mod forget;
mod generate;
mod imagefs;
mod index;
mod init;
mod inspect;
mod key;
mod ls;
mod mount;
mod prune;
mod repair;
mod restore;
mod rewrite;
mod serve;
mod snapshots;
mod stats;
mod tag;
mod unlock;

use crate::args::{Cli, Command, Global};
use crate::events::CliProgress;
use anyhow::{Context, Result, anyhow};
use cairn_backend::S3_SILENCE;
use cairn_core::Repository;
use cairn_core::progress::Progress;
use cairn_core::repo::storage::{CacheChoice, StorageOptions};
use cairn_core::session::{Access, IndexLoad, Session};
use std::time::Duration;

pub fn run(cli: Cli) -> Result<i32> {
    let g = &cli.global;
    apply_priority(g)?;
    // Long jobs end with what they used (with --json: in the report); an export
    // only when its archive does not go to standard output ("-" or none).
    let long_job = match &cli.command {
        Command::Backup(_)
        | Command::Restore(_)
        | Command::Copy(_)
        | Command::Check(_)
        | Command::Prune(_)
        | Command::Stats(_)
        | Command::Repair(_)
        | Command::Recover(_)
        | Command::Mount(_) => true,
        Command::Export(a) => a.output.as_ref().is_some_and(|o| o.as_os_str() != "-"),
        _ => false,
    };
    let code = match cli.command {
        Command::Init(a) => init::run(g, &a),
        Command::Backup(a) => backup::run(g, a),
        Command::Snapshots(a) => snapshots::run(g, &a),
        Command::Ls(a) => ls::run(g, &a),
        Command::Dump(a) => dump::run(g, &a),
        Command::Restore(a) => restore::run(g, &a),
        Command::Find(a) => find::run(g, &a),
        Command::Diff(a) => diff::run(g, &a),
        Command::Export(a) => export::run(g, &a),
        Command::Key(k) => key::run(g, k),
        Command::Config(a) => config::run(g, &a),
        Command::Check(a) => check::run(g, &a),
        Command::Prune(a) => prune::run(g, &a),
        Command::Unlock(a) => unlock::run(g, &a),
        Command::Repair(c) => repair::run(g, c),
        Command::Recover(a) => repair::recover(g, &a),
        Command::Stats(a) => stats::run(g, &a),
        Command::Bench(a) => bench::run(g, &a),
        Command::Estimate(a) => estimate::run(g, &a),
        Command::Index(a) => index::run(g, &a),
        Command::Forget(a) => forget::run(g, &a),
        Command::Copy(a) => copy::run(g, &a),
        Command::Tag(a) => tag::run(g, &a),
        Command::Rewrite(a) => rewrite::run(g, &a),
        Command::Serve(a) => serve::run(g, &a),
        Command::Mount(a) => mount::run(g, &a),
        Command::Generate(a) => generate::run(&a),
        Command::Version => version(g),
        Command::List(a) => inspect::list(g, &a),
        Command::Cat(a) => inspect::cat(g, &a),
    }?;
    if long_job && !g.json && !g.quiet {
        println!("resources: {}", Resources::now().line());
    }
    Ok(code)
}

/// `--priority` and `--threads`: set before any worker thread starts, so every
/// thread inherits the priorities (on Linux they are per thread).
fn apply_priority(g: &Global) -> Result<()> {
    let cores = std::thread::available_parallelism()
        .map(|n| n.get())
        .unwrap_or(2);
    let mut threads = g.threads;
    if threads == Some(0) {
        return Err(bad_argument("--threads 0: give 1 or more"));
    }
    // More than the machine has would only add threads (and their buffers) that
    // wait for a core.
    if let Some(n) = threads
        && n > cores
    {
        if !g.quiet {
            crate::ui::note(format!(
                "--threads {n}: this machine has {cores} cores; using {cores}"
            ));
        }
        threads = Some(cores);
    }
    match g.priority.as_deref() {
        None | Some("normal") => {}
        Some("low") => {
            set_nice(19)?;
            set_ioprio(IOPRIO_CLASS_IDLE, 0)?;
            threads.get_or_insert((cores / 2).max(1));
        }
        Some("high") => {
            set_nice(-5).context("--priority high needs root (CAP_SYS_NICE)")?;
            set_ioprio(IOPRIO_CLASS_BE, 0)?;
        }
        Some(p) => {
            return Err(bad_argument(format!(
                "--priority {p:?}: use low, normal or high"
            )));
        }
    }
    if let Some(n) = threads {
        cairn_core::threads::set_cores(n);
    }
    Ok(())
}

const IOPRIO_CLASS_BE: u32 = 2;
const IOPRIO_CLASS_IDLE: u32 = 3;

fn set_nice(nice: i32) -> Result<()> {
    #[allow(unsafe_code)]
    // SAFETY: setpriority takes plain integers; 0 names the calling thread.
    let r = unsafe { libc::setpriority(libc::PRIO_PROCESS, 0, nice) };
    if r != 0 {
        return Err(std::io::Error::last_os_error()).context(format!("setting nice {nice}"));
    }
    Ok(())
}

fn set_ioprio(class: u32, level: u32) -> Result<()> {
    const IOPRIO_WHO_PROCESS: libc::c_long = 1;
    let prio = ((class << 13) | level) as libc::c_long;
    #[allow(unsafe_code)]
    // SAFETY: ioprio_set takes plain integers; who 0 is the calling thread.
    let r = unsafe { libc::syscall(libc::SYS_ioprio_set, IOPRIO_WHO_PROCESS, 0, prio) };
    if r != 0 {
        return Err(std::io::Error::last_os_error()).context("setting the I/O priority");
    }
    Ok(())
}

/// What the process used, reported at the end of long operations: its peak memory
/// (resident set) and CPU time.
#[derive(Clone, Copy, Debug, serde::Serialize)]
pub struct Resources {
    pub peak_rss_bytes: u64,
    pub cpu_user_secs: f64,
    pub cpu_system_secs: f64,
}

impl Resources {
    pub fn now() -> Resources {
        let mut ru = std::mem::MaybeUninit::<libc::rusage>::zeroed();
        #[allow(unsafe_code)]
        // SAFETY: getrusage fills the struct (zeroed beforehand) and only reads
        // its first argument.
        let ru = unsafe {
            libc::getrusage(libc::RUSAGE_SELF, ru.as_mut_ptr());
            ru.assume_init()
        };
        let secs = |t: libc::timeval| t.tv_sec as f64 + t.tv_usec as f64 / 1e6;
        Resources {
            // Linux reports kilobytes.
            peak_rss_bytes: own_peak_rss()
                .unwrap_or_else(|| u64::try_from(ru.ru_maxrss).unwrap_or(0) * 1024),
            cpu_user_secs: secs(ru.ru_utime),
            cpu_system_secs: secs(ru.ru_stime),
        }
    }

    /// "peak memory 210.3 MiB, CPU 12.4 s user + 3.1 s system"
    pub fn line(&self) -> String {
        format!(
            "peak memory {}, CPU {:.1} s user + {:.1} s system",
            crate::ui::bytes(self.peak_rss_bytes),
            self.cpu_user_secs,
            self.cpu_system_secs
        )
    }
}

/// The peak resident set of this program alone: `VmHWM`, the high-water mark of
/// the address space `exec` gave it. `getrusage`'s `ru_maxrss` is not that: Linux
/// carries the peak of the image the process replaced into it, so cairn started
/// by a 300 MiB program (a test harness, a script's interpreter) reported 300 MiB
/// whatever it used itself.
fn own_peak_rss() -> Option<u64> {
    let status = std::fs::read_to_string("/proc/self/status").ok()?;
    let kib = status
        .lines()
        .find_map(|l| l.strip_prefix("VmHWM:"))?
        .trim()
        .strip_suffix("kB")?
        .trim()
        .parse::<u64>()
        .ok()?;
    kib.checked_mul(1024)
}

/// A report as JSON with what the process used added (`"resources"`).
pub fn print_json_report<T: serde::Serialize>(v: &T) -> Result<()> {
    let mut j = serde_json::to_value(v)?;
    if let Some(m) = j.as_object_mut() {
        m.insert("resources".into(), serde_json::to_value(Resources::now())?);
    }
    print_json(&j)
}

/// `cairn version`: the version and the system it was built for, as restic's
/// `version` prints its own.
fn version(g: &Global) -> Result<i32> {
    let v = env!("CARGO_PKG_VERSION");
    let (os, arch) = (std::env::consts::OS, std::env::consts::ARCH);
    if g.json {
        print_json(&serde_json::json!({
            "version": v,
            "os": os,
            "arch": arch,
        }))?;
    } else {
        println!("cairn {v} on {os}/{arch}");
    }
    Ok(0)
}

/// The repository location as given (`--repo` / `CAIRN_REPO`).
pub fn repo_location(g: &Global) -> Result<String> {
    g.repo
        .clone()
        .filter(|r| !r.is_empty())
        .ok_or_else(|| anyhow!("no repository given: use --repo or set CAIRN_REPO"))
}

/// A value of an option that cannot be taken, found after the arguments were
/// parsed (a size, a rate, a choice): nothing was done, and the exit status is
/// 2 as for any other bad argument, so that a script does not take a typo for a
/// restore done in part (exit 1; QA).
#[derive(Debug)]
pub struct BadArgument(pub String);

impl std::fmt::Display for BadArgument {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.0)
    }
}

impl std::error::Error for BadArgument {}

/// `e` as a [`BadArgument`] (its message names the option).
pub fn bad_argument(e: impl std::fmt::Display) -> anyhow::Error {
    anyhow::Error::new(BadArgument(e.to_string()))
}

/// A rate flag's value in bytes per second (`None`: not given).
pub fn rate_flag(v: &Option<String>, flag: &str) -> Result<Option<u64>> {
    v.as_deref()
        .map(|s| cairn_core::units::parse_rate(s).map_err(|e| bad_argument(format!("{flag}: {e}"))))
        .transpose()
}

/// A fingerprint flag's value, checked now: one that is not a SHA-256
/// fingerprint is a bad argument (exit 2), as a bad rate is (QA r31: exit 1).
pub fn fingerprint_flag(v: &Option<String>, flag: &str) -> Result<Option<String>> {
    if let Some(f) = v {
        cairn_backend::parse_fingerprint(f).map_err(|e| bad_argument(format!("{flag}: {e}")))?;
    }
    Ok(v.clone())
}

/// The storage options the global flags ask for.
pub fn storage_options(g: &Global) -> Result<StorageOptions> {
    let r = &g.remote;
    let retry_for = r
        .retry_for
        .as_deref()
        .map(parse_duration)
        .transpose()
        .map_err(|e| bad_argument(format!("--retry-for: {e}")))?;
    // A request that hears nothing is given up on within what --retry-for allows
    // (at least 10 s: a busy server can take seconds), not after the minute or two
    // of silence a plain run waits, so that each attempt fits in it.
    let silence = retry_for.map(|d| d.clamp(Duration::from_secs(10), S3_SILENCE));
    Ok(StorageOptions {
        s3: cairn_backend::S3Options {
            region: r.s3_region.clone(),
            virtual_host: r.s3_virtual_host,
            profile: r.s3_profile.clone(),
            ca_cert: r.cacert.clone(),
            insecure_tls: r.insecure_tls,
            silence,
        },
        limit_upload: rate_flag(&r.limit_upload, "--limit-upload")?,
        limit_download: rate_flag(&r.limit_download, "--limit-download")?,
        cache: if r.no_cache {
            CacheChoice::Off
        } else {
            match &r.cache_dir {
                Some(d) => CacheChoice::Dir(d.clone()),
                None => CacheChoice::Default,
            }
        },
        retry: cairn_backend::RetryPolicy {
            max_total: retry_for,
            ..Default::default()
        },
        server: cairn_backend::ServerOptions {
            token: server_token(r)?,
            fingerprint: fingerprint_flag(&r.server_fingerprint, "--server-fingerprint")?,
            ca_cert: r.cacert.clone(),
            insecure_tls: r.insecure_tls,
            // A job slot's request waits up to 20 s on the server before it answers.
            silence: silence.map(|s| s.max(cairn_backend::SERVER_SILENCE_MIN)),
        },
        dry_run: false,
        ride_s3_restarts: true,
    })
}

/// The cairn server token: `--token-file` (first line) wins over `CAIRN_TOKEN`.
fn server_token(r: &crate::args::RemoteArgs) -> Result<Option<String>> {
    token_from(r.token_file.as_deref(), "CAIRN_TOKEN")
}

/// A cairn server token: the first line of `file`, else the variable `env`.
pub fn token_from(file: Option<&std::path::Path>, env: &str) -> Result<Option<String>> {
    if let Some(path) = file {
        let text = std::fs::read_to_string(path)
            .with_context(|| format!("cannot read the token file {}", path.display()))?;
        let token = text.lines().next().unwrap_or("").trim().to_string();
        if token.is_empty() {
            return Err(anyhow!("the token file {} is empty", path.display()));
        }
        return Ok(Some(token));
    }
    Ok(std::env::var(env).ok().filter(|t| !t.trim().is_empty()))
}

/// Traffic of every repository opened, reported at exit when
/// `CAIRN_TRAFFIC_REPORT` is set (a diagnostic: proves what the cache saves).
static TRAFFIC: std::sync::Mutex<Vec<(String, std::sync::Arc<cairn_backend::Traffic>)>> =
    std::sync::Mutex::new(Vec::new());

fn remember_traffic(repo: &Repository) {
    if let Some(t) = repo.traffic() {
        TRAFFIC
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .push((repo.location().to_string(), t.clone()));
    }
}

pub fn report_traffic() {
    if std::env::var_os("CAIRN_TRAFFIC_REPORT").is_none() {
        return;
    }
    for (loc, t) in TRAFFIC.lock().unwrap_or_else(|p| p.into_inner()).iter() {
        eprintln!(
            "traffic: {loc}: uploaded {} bytes, downloaded {} bytes, {} requests",
            t.uploaded(),
            t.downloaded(),
            t.requests()
        );
    }
}

/// Opens the repository at `location` with the global storage flags; `password` is
/// asked only when it is encrypted.
pub fn open_at(
    g: &Global,
    location: &str,
    password: impl FnOnce() -> Result<String>,
    progress: &Progress,
) -> Result<Repository> {
    open_with(g, location, &storage_options(g)?, password, progress)
}

/// [`open_at`] with the storage options given.
pub fn open_with(
    g: &Global,
    location: &str,
    storage: &StorageOptions,
    password: impl FnOnce() -> Result<String>,
    progress: &Progress,
) -> Result<Repository> {
    // Checked before the password is asked for.
    let lock_wait = (g.remote.retry_lock.as_deref())
        .map(parse_duration)
        .transpose()
        .map_err(|e| bad_argument(format!("--retry-lock: {e}")))?;
    let repo = Repository::open_at(
        location,
        storage,
        || password().map_err(|e| cairn_core::Error::Invalid(crate::one_line(&e))),
        progress,
    )?;
    remember_traffic(&repo);
    let mut repo = repo;
    repo.set_memory_limit(memory_limit(g, &repo)?);
    if let Some(w) = lock_wait {
        repo.set_lock_wait(w);
    }
    Ok(repo)
}

/// `--memory-limit` (or `CAIRN_MEMORY_LIMIT`), else the repository's default.
pub fn memory_limit(g: &Global, repo: &Repository) -> Result<Option<u64>> {
    Ok(match g.memory_limit.as_deref() {
        Some("none") => None,
        Some(s) => match parse_size(s).context("--memory-limit")? {
            // Not "no limit" in disguise: that is `none`.
            0 => {
                return Err(bad_argument(format!(
                    "--memory-limit {s:?}: give a size (2G, 512M) or none"
                )));
            }
            n => Some(n),
        },
        None => repo.config().memory_limit,
    })
}

/// Opens `--repo` (asking for the password only if it is encrypted).
pub fn open(g: &Global, progress: &Progress) -> Result<Repository> {
    open_at(g, &repo_location(g)?, || crate::ui::password(g), progress)
}

/// Opens `--repo` and a session of kind `A` for `operation`.
pub fn session<A: Access>(
    g: &Global,
    operation: &str,
    index: IndexLoad,
    progress: &Progress,
) -> Result<Session<A>> {
    let repo = open(g, progress)?;
    Ok(Session::open(repo, operation, index, progress)?)
}

/// Says the damage a run met in the local SSD index and mended (backup and
/// restore report it as `index_repaired`).
pub fn warn_index_repaired(progress: &cairn_core::progress::Progress, why: Option<&str>) {
    if let Some(why) = why {
        progress.warning_msg(format!(
            "the local SSD index was damaged ({why}); it was rebuilt from the repository \
             (if this happens again, check the disk it is on)"
        ));
    }
}

/// A progress display for the global flags' mode.
pub fn progress(g: &Global) -> CliProgress {
    CliProgress::new(g)
}

/// Writes one line of a listing (`ls`, `find`, `diff`), its names' control
/// characters written out ([`crate::ui::printable`]); the end of the process if it
/// cannot be written: quietly with SIGPIPE's status when the reader went away
/// (`cairn ls | head`), with an error otherwise. For output written from inside a
/// walk that cannot return an error.
pub fn out_line(out: &mut impl std::io::Write, line: &str) {
    out_raw_line(out, &crate::ui::printable(line));
}

/// [`out_line`] for text already safe to print as it is (JSON, whose strings
/// escape what a terminal would act on).
pub fn out_raw_line(out: &mut impl std::io::Write, line: &str) {
    if let Err(e) = writeln!(out, "{line}") {
        if e.kind() == std::io::ErrorKind::BrokenPipe {
            crate::exit_broken_pipe();
        }
        eprintln!("cairn: error: writing the output: {e}");
        cairn_core::repo::lock::release_held();
        std::process::exit(1);
    }
}

/// A JSON document written as a walk goes: `head` (which opens a list), one
/// element a line, then the rest (which closes the list and the document). The
/// head is written with the first element, so that a command that fails before
/// it (a path not found) leaves nothing half written.
pub struct JsonStream {
    head: String,
    started: bool,
}

impl JsonStream {
    pub fn new(head: String) -> JsonStream {
        JsonStream {
            head,
            started: false,
        }
    }

    /// One element, already serialised.
    pub fn item(&mut self, out: &mut impl std::io::Write, json: &str) {
        if std::mem::replace(&mut self.started, true) {
            out_raw_line(out, &format!(", {json}"));
        } else {
            out_raw_line(out, &self.head);
            out_raw_line(out, &format!("  {json}"));
        }
    }

    /// The end: `tail` closes the list and the document.
    pub fn finish(self, out: &mut impl std::io::Write, tail: &str) {
        if !self.started {
            out_raw_line(out, &self.head);
        }
        out_raw_line(out, tail);
    }

    pub fn started(&self) -> bool {
        self.started
    }
}

/// Flushes buffered command output: quietly with SIGPIPE's status when the
/// reader went away, an error otherwise.
pub fn flush_output(out: &mut impl std::io::Write) -> Result<()> {
    if let Err(e) = out.flush() {
        if e.kind() == std::io::ErrorKind::BrokenPipe {
            crate::exit_broken_pipe();
        }
        anyhow::bail!("writing the output: {e}");
    }
    Ok(())
}

pub fn print_json<T: serde::Serialize>(v: &T) -> Result<()> {
    println!("{}", serde_json::to_string_pretty(v)?);
    Ok(())
}

/// Parses a duration such as `30s`, `10m`, `2h` or `90` (seconds).
pub fn parse_duration(s: &str) -> Result<std::time::Duration> {
    cairn_core::units::parse_duration(s).map_err(anyhow::Error::msg)
}

/// Parses a size such as `500M`, `2G`, `1.5T` or `4096` (bytes; binary units).
pub fn parse_size(s: &str) -> Result<u64> {
    cairn_core::units::parse_size(s).map_err(bad_argument)
}

/// `--pack-size` in bytes (`None`: not given).
pub fn pack_size_flag(v: &Option<String>) -> Result<Option<u64>> {
    v.as_deref()
        .map(parse_size)
        .transpose()
        .context("--pack-size")
}

/// Of two exit codes, the one that says most: an error (1) over done in part (3)
/// over success (0).
pub fn worst(a: i32, b: i32) -> i32 {
    match (a, b) {
        (0, c) | (c, 0) => c,
        (1, _) | (_, 1) => 1,
        (a, b) => a.max(b),
    }
}

/// For a command that read an image snapshot's bytes as data (restore, dump,
/// export of the image file; `--image-fs`): says on standard error which ranges
/// of the image the source could not read at backup time, so hold zeros, and
/// returns the exit code for an incomplete result. `ranges` is empty when nothing
/// read touched them.
pub fn image_zeros_warning(ranges: &[(u64, u64)], what: &str, repaired: bool) -> i32 {
    if ranges.is_empty() {
        return 0;
    }
    crate::ui::warn(format!(
        "{what} includes {} of the image that {} and hold zeros: {}",
        crate::ui::count(ranges.len() as u64, "range"),
        unreadable_why(repaired),
        ranges
            .iter()
            .map(|(o, l)| format!("{o}..{}", o.saturating_add(*l)))
            .collect::<Vec<_>>()
            .join(", ")
    ));
    crate::EXIT_INCOMPLETE
}

/// The unreadable ranges of `snap`'s image, if it is an image snapshot.
pub fn image_unreadable(snap: &cairn_format::snapshot::Snapshot) -> &[(u64, u64)] {
    snap.image.as_ref().map_or(&[], |i| i.unreadable.as_slice())
}

/// Why an image's recorded ranges hold zeros: the source could not be read
/// there, or, in a snapshot `repair snapshots` wrote (`repaired`), the
/// repository also lost blocks it recorded the same way (QA: such ranges were
/// said to be unreadable "at backup").
pub fn unreadable_why(repaired: bool) -> &'static str {
    if repaired {
        "could not be read at backup or was lost in the repository (zeroed by `repair \
         snapshots`)"
    } else {
        "could not be read at backup time"
    }
}
