//! Terminal output: byte formatting, the progress display, and the password prompt.
//! Progress shows only when stderr is a terminal and neither --quiet nor --json is set.

use anyhow::{Context, Result, bail};
use cairn_core::progress::{BackupProgress, RestoreProgress};
use indicatif::{ProgressBar, ProgressDrawTarget, ProgressStyle};
use std::io::IsTerminal;
use std::path::{Path, PathBuf};
use std::sync::Mutex;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

pub fn bytes(n: u64) -> String {
    const UNITS: [&str; 6] = ["B", "KiB", "MiB", "GiB", "TiB", "PiB"];
    let mut v = n as f64;
    let mut u = 0;
    while v >= 1024.0 && u + 1 < UNITS.len() {
        v /= 1024.0;
        u += 1;
    }
    if u == 0 {
        format!("{n} B")
    } else {
        format!("{v:.2} {}", UNITS[u])
    }
}

pub fn rate(n: u64, secs: f64) -> String {
    if secs <= 0.0 {
        return "-".into();
    }
    format!("{}/s", bytes((n as f64 / secs) as u64))
}

pub fn interactive(global: &crate::args::Global) -> bool {
    !global.quiet && !global.json && std::io::stderr().is_terminal()
}

/// Password from CAIRN_PASSWORD, --password-file, or a prompt on a terminal.
pub fn password(global: &crate::args::Global) -> Result<String> {
    if let Ok(p) = std::env::var("CAIRN_PASSWORD") {
        return Ok(p);
    }
    if let Some(f) = &global.password_file {
        return read_password_file(f);
    }
    if std::io::stdin().is_terminal() {
        return rpassword::prompt_password("enter password for repository: ")
            .context("reading password");
    }
    bail!("no password given: set CAIRN_PASSWORD, use --password-file, or run on a terminal")
}

pub fn read_password_file(f: &Path) -> Result<String> {
    let s = std::fs::read_to_string(f)
        .with_context(|| format!("reading password file {}", f.display()))?;
    Ok(s.lines().next().unwrap_or("").to_string())
}

/// A new password (init, key add/passwd): from a file, CAIRN_NEW_PASSWORD /
/// CAIRN_PASSWORD, or asked twice on a terminal.
pub fn new_password(file: Option<&PathBuf>, allow_current_env: bool) -> Result<String> {
    if let Some(f) = file {
        return read_password_file(f);
    }
    if let Ok(p) = std::env::var("CAIRN_NEW_PASSWORD") {
        return Ok(p);
    }
    if allow_current_env && let Ok(p) = std::env::var("CAIRN_PASSWORD") {
        return Ok(p);
    }
    if !std::io::stdin().is_terminal() {
        bail!(
            "no new password given: set CAIRN_NEW_PASSWORD, use --new-password-file, or run on a terminal"
        );
    }
    let a = rpassword::prompt_password("enter new password: ").context("reading password")?;
    let b = rpassword::prompt_password("enter the password again: ").context("reading password")?;
    if a != b {
        bail!("the passwords do not match");
    }
    if a.is_empty() {
        bail!("an empty password is not allowed");
    }
    Ok(a)
}

/// Progress for backup and restore: counters updated by engine threads, drawn by
/// indicatif at a fixed rate.
pub struct Progress {
    bar: Option<ProgressBar>,
    bytes: AtomicU64,
    entries: AtomicU64,
    total_bytes: AtomicU64,
    current: Mutex<PathBuf>,
    pub warnings: Mutex<Vec<String>>,
}

impl Progress {
    pub fn new(show: bool) -> Self {
        let bar = show.then(|| {
            let b = ProgressBar::with_draw_target(Some(0), ProgressDrawTarget::stderr_with_hz(8));
            b.set_style(
                ProgressStyle::with_template(
                    "{elapsed_precise} {bar:30} {bytes}/{total_bytes} {bytes_per_sec} ETA {eta} {msg}",
                )
                .unwrap_or_else(|_| ProgressStyle::default_bar()),
            );
            b.enable_steady_tick(Duration::from_millis(250));
            b
        });
        Progress {
            bar,
            bytes: AtomicU64::new(0),
            entries: AtomicU64::new(0),
            total_bytes: AtomicU64::new(0),
            current: Mutex::new(PathBuf::new()),
            warnings: Mutex::new(Vec::new()),
        }
    }

    pub fn set_total(&self, bytes: u64) {
        self.total_bytes.store(bytes, Ordering::Relaxed);
        if let Some(b) = &self.bar {
            b.set_length(bytes);
        }
    }

    fn warn(&self, path: &Path, message: &str) {
        let line = format!("warning: {}: {message}", path.display());
        // Warnings go to stderr even with --quiet: they mean data was left out.
        match &self.bar {
            Some(b) => b.suspend(|| eprintln!("{line}")),
            None => eprintln!("{line}"),
        }
        self.warnings
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .push(line);
    }

    fn tick(&self) {
        if let Some(b) = &self.bar {
            b.set_position(self.bytes.load(Ordering::Relaxed));
            let files = self.entries.load(Ordering::Relaxed);
            let cur = self.current.lock().unwrap_or_else(|e| e.into_inner());
            let name = cur.to_string_lossy();
            let short: String = if name.chars().count() > 40 {
                let tail: String = name
                    .chars()
                    .rev()
                    .take(39)
                    .collect::<Vec<_>>()
                    .into_iter()
                    .rev()
                    .collect();
                format!("…{tail}")
            } else {
                name.into_owned()
            };
            b.set_message(format!("{files} entries {short}"));
        }
    }

    pub fn finish(&self) {
        if let Some(b) = &self.bar {
            b.finish_and_clear();
        }
    }
}

impl Progress {
    fn add_bytes(&self, n: u64) {
        self.bytes.fetch_add(n, Ordering::Relaxed);
        self.tick();
    }
    fn add_entry(&self) {
        self.entries.fetch_add(1, Ordering::Relaxed);
    }
}

impl BackupProgress for Progress {
    fn file_started(&self, path: &Path) {
        if self.bar.is_some() {
            *self.current.lock().unwrap_or_else(|e| e.into_inner()) = path.to_path_buf();
        }
    }
    fn bytes_done(&self, n: u64) {
        self.add_bytes(n);
    }
    fn entry_done(&self) {
        self.add_entry();
    }
    fn warning(&self, path: &Path, message: &str) {
        self.warn(path, message);
    }
}

impl RestoreProgress for Progress {
    fn bytes_done(&self, n: u64) {
        self.add_bytes(n);
    }
    fn entry_done(&self) {
        self.add_entry();
    }
    fn warning(&self, path: &Path, message: &str) {
        self.warn(path, message);
    }
}
