//! Terminal output: byte formatting, the progress display, and the password prompt.
//! Progress shows only when stderr is a terminal and neither --quiet nor --json is set.

use anyhow::{Context, Result, bail};
use cairn_core::progress::{BackupProgress, EstimateProgress, RestoreProgress};
use indicatif::{ProgressBar, ProgressDrawTarget, ProgressStyle};
use std::io::IsTerminal;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

pub fn bytes(n: u64) -> String {
    cairn_core::units::bytes(n, 2)
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

/// Progress for backup and restore, drawn by indicatif at a fixed rate. Byte counts
/// go straight to the bar (an atomic add); the message (entries, current file) is
/// rebuilt only when a file starts or every 256 entries, never per chunk.
pub struct Progress {
    bar: Option<ProgressBar>,
    entries: AtomicU64,
}

/// The last `max` characters of a path, for a one-line display.
fn tail(path: &Path, max: usize) -> String {
    let name = path.to_string_lossy();
    let n = name.chars().count();
    if n <= max {
        return name.into_owned();
    }
    let t: String = name.chars().skip(n - (max - 1)).collect();
    format!("…{t}")
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
            entries: AtomicU64::new(0),
        }
    }

    pub fn set_total(&self, bytes: u64) {
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
    }

    pub fn finish(&self) {
        if let Some(b) = &self.bar {
            b.finish_and_clear();
        }
    }

    fn add_bytes(&self, n: u64) {
        if let Some(b) = &self.bar {
            b.inc(n);
        }
    }

    fn add_entry(&self) {
        if let Some(b) = &self.bar {
            let e = self.entries.fetch_add(1, Ordering::Relaxed) + 1;
            if e.is_multiple_of(256) {
                b.set_message(format!("{e} entries"));
            }
        }
    }
}

impl BackupProgress for Progress {
    fn file_started(&self, path: &Path) {
        if let Some(b) = &self.bar {
            let e = self.entries.load(Ordering::Relaxed);
            b.set_message(format!("{e} entries {}", tail(path, 40)));
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

impl EstimateProgress for Progress {
    fn walked(&self, files: u64, bytes: u64) {
        self.set_total(bytes);
        if let Some(b) = &self.bar {
            b.set_message(format!("{files} files"));
        }
    }
    fn bytes_done(&self, n: u64) {
        self.add_bytes(n);
    }
    fn file_done(&self) {
        self.add_entry();
    }
    fn warning(&self, path: &Path, message: &str) {
        self.warn(path, message);
    }
}
