//! Terminal helpers: byte formatting, whether output is interactive, and the
//! password prompts. The progress display is in `events`.

use anyhow::{Context, Result, bail};
use std::io::IsTerminal;
use std::path::{Path, PathBuf};

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
