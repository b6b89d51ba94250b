//! Terminal helpers: byte formatting, whether output is interactive, and the
//! password prompts. The progress display is in `events`.

use anyhow::{Context, Result, bail};
use std::io::IsTerminal;
use std::path::{Path, PathBuf};

pub fn bytes(n: u64) -> String {
    cairn_core::units::bytes(n, 2)
}

/// "1 file", "2 files": a count with its noun, singular or plural (`noun` is the
/// singular; the plural adds an "s", or "es" after s, x, sh and ch; "-ry" becomes "-ries").
pub use cairn_core::units::count;

/// [`count`] with its verb: "1 pack is", "3 packs are".
pub use cairn_core::units::count_is;

/// A percentage with one decimal, except that a figure one decimal would round to
/// 0.0% or 100.0% without being it gets two (99.98%, not "100.0%" for dedup that
/// is not total).
pub fn percent(v: f64) -> String {
    let near_an_end = (v > 0.0 && v < 0.05) || (v > 99.95 && v < 100.0);
    if near_an_end {
        // Two decimals, never rounded up to the end itself.
        let two = if v > 50.0 {
            (v * 100.0).floor() / 100.0
        } else {
            (v * 100.0).ceil() / 100.0
        };
        format!("{two:.2}%")
    } else {
        format!("{v:.1}%")
    }
}

pub fn rate(n: u64, secs: f64) -> String {
    if secs <= 0.0 {
        return "-".into();
    }
    format!("{}/s", bytes((n as f64 / secs) as u64))
}

/// `text` (a name from a snapshot, a source or a server) with its control
/// characters written out (`\n`, `\t`, `\r`, `\x1b`, `\u{85}`) and a backslash
/// doubled, as `ls -b` does: a file name holding a newline would read as two
/// entries, and one holding an escape sequence would drive the terminal it is
/// shown on (retitle it, rewrite what is on screen); the backslash keeps a name
/// with a newline apart from one with `\` and `n`. Characters that are invisible
/// or reorder what follows them (zero-width space, byte-order mark, the
/// bidirectional marks and overrides) are written out too: `web01\u{200b}` is not
/// `web01`, and a name holding U+202E would show `gpj.exe` as `exe.jpg`.
/// `--json` carries names as they are.
pub fn printable(text: &str) -> std::borrow::Cow<'_, str> {
    let raw = cairn_core::ls::raw_byte;
    if !text
        .chars()
        .any(|c| c.is_control() || hidden(c) || joiner(c) || c == '\\' || raw(c).is_some())
    {
        return std::borrow::Cow::Borrowed(text);
    }
    let mut out = String::with_capacity(text.len() + 8);
    let chars: Vec<char> = text.chars().collect();
    // Beside a character of ASCII (or at an end), a joiner joins nothing a
    // script or an emoji needs: it only hides.
    let ascii = |i: Option<usize>| i.and_then(|i| chars.get(i)).is_none_or(char::is_ascii);
    for (i, &c) in chars.iter().enumerate() {
        match c {
            c if joiner(c) && (ascii(i.checked_sub(1)) || ascii(Some(i + 1))) => {
                out.push_str(&format!("\\u{{{:x}}}", c as u32))
            }
            // A byte of a name that is not UTF-8 (its stand-in), as `ls -b` shows it.
            c if let Some(b) = raw(c) => out.push_str(&format!("\\x{b:02x}")),
            '\\' => out.push_str("\\\\"),
            '\n' => out.push_str("\\n"),
            '\t' => out.push_str("\\t"),
            '\r' => out.push_str("\\r"),
            c if c.is_control() && (c as u32) < 0x80 => {
                out.push_str(&format!("\\x{:02x}", c as u32));
            }
            c if c.is_control() || hidden(c) => out.push_str(&format!("\\u{{{:x}}}", c as u32)),
            c => out.push(c),
        }
    }
    std::borrow::Cow::Owned(out)
}

/// A character [`printable`] writes out though it is not a control character:
/// Unicode's default-ignorable code points (invisible: a host "web01" plus a
/// word joiner looks like "web01"; console pentest) and those that reorder the
/// text after them. The joiners and variation selectors ([`joiner`]) emoji and
/// some scripts need are written out only where they join nothing. The line and
/// paragraph separators (U+2028, U+2029) end a line in some log viewers and
/// editors: a name holding one could fake a line of its own (QA). The console's
/// `shown` writes out the same.
fn hidden(c: char) -> bool {
    matches!(
        c,
        '\u{ad}'
            | '\u{34f}'
            | '\u{61c}'
            | '\u{115f}'
            | '\u{1160}'
            | '\u{17b4}'
            | '\u{17b5}'
            | '\u{180b}'..='\u{180f}'
            | '\u{200b}'
            | '\u{200e}'
            | '\u{200f}'
            | '\u{2028}'..='\u{202e}'
            | '\u{2060}'..='\u{206f}'
            | '\u{3164}'
            | '\u{feff}'
            | '\u{ffa0}'
            | '\u{fff0}'..='\u{fff8}'
            | '\u{1bca0}'..='\u{1bca3}'
            | '\u{1d173}'..='\u{1d17a}'
            | '\u{e0000}'..='\u{e0fff}'
    )
}

/// Zero-width (non-)joiners and variation selectors: needed between the
/// characters of some scripts and emoji, invisible anywhere else.
fn joiner(c: char) -> bool {
    matches!(c, '\u{200c}' | '\u{200d}' | '\u{fe00}'..='\u{fe0f}')
}

pub fn interactive(global: &crate::args::Global) -> bool {
    !global.quiet && !global.json && std::io::stderr().is_terminal()
}

/// Where a password comes from, in the order every command asks (one rule
/// everywhere): a file named by a flag, else the environment variable with the
/// password, else one naming a file, else a prompt on a terminal. An explicit flag
/// always wins over the environment, and a named file that cannot be read is an
/// error, never skipped.
pub struct Source<'a> {
    /// The flag's file (`--password-file`, `--from-password-file`,
    /// `--new-password-file`).
    pub flag: Option<&'a Path>,
    /// The flag's command (`--password-command`, `--from-password-command`):
    /// run, and its output's first line is the password.
    pub command: Option<&'a str>,
    /// The variable holding such a command (`CAIRN_PASSWORD_COMMAND`, ...), when
    /// this password has one.
    pub env_command: Option<&'static str>,
    /// The variable holding the password itself (`CAIRN_PASSWORD`, ...).
    pub env: &'static str,
    /// The variable naming a file (`CAIRN_PASSWORD_FILE`, ...).
    pub env_file: &'static str,
    /// The prompt's words ("the repository", "the source repository").
    pub what: &'static str,
    /// The flags to name when no password is given.
    pub flags: &'static str,
}

impl Source<'_> {
    fn given(&self) -> Result<Option<String>> {
        match (self.flag, self.command) {
            (Some(_), Some(_)) => bail!(
                "give the password by a file or by a command, not both ({})",
                self.flags
            ),
            (Some(f), None) => return read_password_file(f).map(Some),
            (None, Some(c)) => return run_password_command(c).map(Some),
            (None, None) => {}
        }
        // A file or a command wins over the password itself, as restic's
        // RESTIC_PASSWORD_FILE does: a file named but missing is said, not
        // passed over.
        let file = std::env::var_os(self.env_file).filter(|f| !f.is_empty());
        let command = (self.env_command)
            .and_then(|v| std::env::var(v).ok().map(|c| (v, c)))
            .filter(|(_, c)| !c.trim().is_empty());
        match (file, command) {
            (Some(_), Some((v, _))) => bail!(
                "{} and {v} are both set: the password comes from one of them (unset the other)",
                self.env_file
            ),
            (Some(f), None) => {
                return read_password_file(Path::new(&f))
                    .with_context(|| format!("{} names it", self.env_file))
                    .map(Some);
            }
            (None, Some((v, c))) => {
                return run_password_command(&c)
                    .with_context(|| format!("{v} names it"))
                    .map(Some);
            }
            (None, None) => {}
        }
        // Set but empty (a unit file's `Environment=CAIRN_PASSWORD=`) is unset: no
        // password is empty, and trying "" would only say "wrong password".
        match std::env::var(self.env) {
            Ok(p) if !p.is_empty() => Ok(Some(p)),
            Err(std::env::VarError::NotUnicode(_)) => bail!(
                "{} is set, but not to UTF-8 text: a password is text (this terminal's \
                 or script's encoding may differ; {} reads one from a UTF-8 file)",
                self.env,
                self.flags
            ),
            _ => Ok(None),
        }
    }

    /// Said when the password variable is set but empty (an empty password
    /// never exists, so it counts as unset).
    fn empty_note(&self) -> String {
        if std::env::var(self.env).is_ok_and(|p| p.is_empty()) {
            format!(
                " ({} is set to an empty password, which counts as unset)",
                self.env
            )
        } else {
            String::new()
        }
    }

    /// A password to open a repository with.
    pub fn password(&self) -> Result<String> {
        let p = self.password_as_given()?;
        EDGE_SPACE.store(has_edge_space(&p), std::sync::atomic::Ordering::Relaxed);
        Ok(p)
    }

    fn password_as_given(&self) -> Result<String> {
        if let Some(p) = self.given()? {
            return Ok(p);
        }
        if std::io::stdin().is_terminal() {
            return rpassword::prompt_password(format!("enter password for {}: ", self.what))
                .context("reading password");
        }
        if let Some(p) = password_from_stdin()? {
            return Ok(p);
        }
        bail!(
            "no password given for {}: use {}, set {} or {}, {}or run on a terminal{}",
            self.what,
            self.flags,
            self.env,
            self.env_file,
            if STDIN_IS_DATA.load(std::sync::atomic::Ordering::Relaxed) {
                "" // standard input is the data
            } else {
                "pipe it to standard input, "
            },
            self.empty_note()
        )
    }

    /// A new password (init, key add/passwd): never empty; asked twice on a
    /// terminal.
    pub fn new_password(&self) -> Result<String> {
        let p = match self.given()? {
            Some(p) => p,
            None if !std::io::stdin().is_terminal() => match password_from_stdin()? {
                Some(p) => p,
                None => bail!(
                    "no new password given: use {}, set {} or {}, pipe it to standard input, \
                     or run on a terminal{}",
                    self.flags,
                    self.env,
                    self.env_file,
                    self.empty_note()
                ),
            },
            None => {
                let a = rpassword::prompt_password("enter new password: ")
                    .context("reading password")?;
                let b = rpassword::prompt_password("enter the password again: ")
                    .context("reading password")?;
                if a != b {
                    bail!("the passwords do not match");
                }
                a
            }
        };
        if p.is_empty() {
            bail!("an empty password is not allowed");
        }
        if has_edge_space(&p) {
            warn(
                "the new password begins or ends with a space or tab, which is part of it: \
                 it must be given so every time",
            );
        }
        // From a variable (`CAIRN_NEW_PASSWORD=$(cat f)` keeps no newline, but
        // `"$(printf 'pw\n')"` or a here-string can): a key whose password ends in
        // a line break would not open from a password file, which drops it.
        if p.ends_with(['\n', '\r']) {
            bail!(
                "the new password ends with a line break, which a password file would not \
                 give back: remove it (a password file drops its trailing newline itself)"
            );
        }
        Ok(p)
    }
}

/// Whether the password last given to open a repository began or ended with
/// spaces or tabs: a wrong-password error then says that they count (QA: a
/// password file's trailing spaces made "wrong password" a mystery). They are not
/// taken away: a password made with them must still open.
pub static EDGE_SPACE: std::sync::atomic::AtomicBool = std::sync::atomic::AtomicBool::new(false);

fn has_edge_space(p: &str) -> bool {
    p.starts_with([' ', '\t']) || p.ends_with([' ', '\t'])
}

/// The repository's password (`--password-file`, `CAIRN_PASSWORD`,
/// `CAIRN_PASSWORD_FILE`, a prompt).
pub fn repo_source(global: &crate::args::Global) -> Source<'_> {
    Source {
        flag: global.password_file.as_deref(),
        command: global.password_command.as_deref(),
        env_command: Some("CAIRN_PASSWORD_COMMAND"),
        env: "CAIRN_PASSWORD",
        env_file: "CAIRN_PASSWORD_FILE",
        what: "the repository",
        flags: "--password-file or --password-command",
    }
}

/// Password to open the repository with.
pub fn password(global: &crate::args::Global) -> Result<String> {
    repo_source(global).password()
}

/// The most a password command may print (its first line is the password):
/// one that prints without end (`yes`) is stopped, not read into memory.
const PASSWORD_COMMAND_OUTPUT_MAX: u64 = 64 << 10;

/// The password a command prints (`--password-command "pass show backup"`): its
/// output's first line. Run by `/bin/sh -c` with this terminal's error output;
/// its input is the terminal when there is one (a pinentry or a token prompt
/// works), else nothing: standard input may be what `backup --stdin` saves (QA:
/// a command reading a line took the stream's first line). A command that
/// fails, prints no password or too much is an error, never an empty password
/// tried.
pub fn run_password_command(cmd: &str) -> Result<String> {
    use std::io::Read as _;
    use std::process::{Command, Stdio};
    let input = if std::io::stdin().is_terminal() {
        Stdio::inherit()
    } else {
        Stdio::null()
    };
    let mut child = Command::new("/bin/sh")
        .arg("-c")
        .arg(cmd)
        .stdin(input)
        .stderr(Stdio::inherit())
        .stdout(Stdio::piped())
        .spawn()
        .with_context(|| format!("running the password command {cmd:?}"))?;
    let mut printed = Vec::new();
    let read = match child.stdout.take() {
        Some(out) => out
            .take(PASSWORD_COMMAND_OUTPUT_MAX + 1)
            .read_to_end(&mut printed)
            .map(|_| ()),
        None => Ok(()),
    };
    if printed.len() as u64 > PASSWORD_COMMAND_OUTPUT_MAX {
        let _ = child.kill();
        let _ = child.wait();
        bail!(
            "the password command {cmd:?} printed more than {} KiB: that is no password",
            PASSWORD_COMMAND_OUTPUT_MAX >> 10
        );
    }
    read.with_context(|| format!("reading what the password command {cmd:?} printed"))?;
    let status = child
        .wait()
        .with_context(|| format!("running the password command {cmd:?}"))?;
    if !status.success() {
        bail!("the password command {cmd:?} failed ({status}): no password");
    }
    let text = String::from_utf8(printed).map_err(|_| {
        anyhow::anyhow!("the password command {cmd:?} printed bytes that are not UTF-8 text")
    })?;
    match password_line(&text) {
        Some(p) => Ok(p.to_string()),
        None => {
            bail!("the password command {cmd:?} printed no password (its first line is empty)")
        }
    }
}

/// Set from `--json` at start: [`warn`] and [`note`] then write event lines.
pub static JSON_OUTPUT: std::sync::atomic::AtomicBool = std::sync::atomic::AtomicBool::new(false);

/// A warning on standard error, outside an operation's progress events: `warning:
/// TEXT`, or with `--json` the same event line a progress warning is
/// (`{"type":"warning","message":...}`), so that every line on standard error
/// stays JSON (QA: forget and copy mixed plain lines in).
pub fn warn(message: impl AsRef<str>) {
    emit("warning", "warning: ", message.as_ref());
}

/// An entry the command could not handle, on standard error as it goes on
/// (`error: TEXT`; with `--json` an `error` event line, so that standard error
/// stays JSON: QA r37, `ls`, `diff` and `--image-fs` wrote plain lines there).
pub fn entry_error(message: impl AsRef<str>) {
    emit("error", "error: ", message.as_ref());
}

/// A note on standard error (`note: TEXT`; with `--json` a `notice` event line).
pub fn note(message: impl AsRef<str>) {
    emit("notice", "note: ", message.as_ref());
}

fn emit(kind: &str, prefix: &str, message: &str) {
    use std::io::Write;
    let mut err = std::io::stderr().lock();
    if JSON_OUTPUT.load(std::sync::atomic::Ordering::Relaxed) {
        let line = serde_json::json!({"type": kind, "message": message});
        let _ = writeln!(err, "{line}");
    } else {
        let _ = writeln!(err, "{}", printable(&format!("{prefix}{message}")));
    }
}

/// Set when standard input carries the command's data (`backup --stdin`,
/// `--files-from -`): no password is read from it then.
pub static STDIN_IS_DATA: std::sync::atomic::AtomicBool = std::sync::atomic::AtomicBool::new(false);

/// A password piped to standard input (not a terminal), as restic reads one:
/// its first line. `None` when standard input is the command's data, or holds
/// nothing (cron's /dev/null).
fn password_from_stdin() -> Result<Option<String>> {
    if STDIN_IS_DATA.load(std::sync::atomic::Ordering::Relaxed) {
        return Ok(None);
    }
    // At most a line of 64 KiB, as restic's: `cat /dev/zero | cairn ...` must not
    // read until memory runs out (QA).
    const MAX: u64 = 64 * 1024;
    let mut line = Vec::new();
    let mut limited = std::io::Read::take(std::io::stdin().lock(), MAX + 1);
    std::io::BufRead::read_until(&mut limited, b'\n', &mut line)
        .context("reading the password from standard input")?;
    if line.len() as u64 > MAX {
        bail!("the password piped to standard input is longer than 64 KiB (no line break)");
    }
    if line.is_empty() {
        return Ok(None); // nothing there (/dev/null)
    }
    let line = String::from_utf8(line)
        .map_err(|_| anyhow::anyhow!("the password piped to standard input is not UTF-8 text"))?;
    match password_line(&line) {
        Some(p) => Ok(Some(p.to_string())),
        None => bail!(
            "the password piped to standard input is an empty line (an empty password is not allowed)"
        ),
    }
}

/// The password in a file's or a command's text: its first line, without its
/// end (`\n`, `\r\n`, or a lone `\r`: an old Mac's, or a file cut after one);
/// `None` when that is empty.
fn password_line(text: &str) -> Option<&str> {
    let first = text.lines().next().unwrap_or("");
    let first = first.strip_suffix('\r').unwrap_or(first);
    (!first.is_empty()).then_some(first)
}

pub fn read_password_file(f: &Path) -> Result<String> {
    let s = std::fs::read_to_string(f)
        .with_context(|| format!("reading password file {}", f.display()))?;
    match password_line(&s) {
        Some(p) => Ok(p.to_string()),
        None => bail!(
            "the password file {} has an empty first line (the password is its first line)",
            f.display()
        ),
    }
}

/// A new password for `key add` / `key passwd`: `--new-password-file`,
/// `CAIRN_NEW_PASSWORD`, `CAIRN_NEW_PASSWORD_FILE`, or asked twice on a terminal.
pub fn new_password(file: Option<&PathBuf>) -> Result<String> {
    Source {
        flag: file.map(PathBuf::as_path),
        command: None,
        env_command: None,
        env: "CAIRN_NEW_PASSWORD",
        env_file: "CAIRN_NEW_PASSWORD_FILE",
        what: "the new key",
        flags: "--new-password-file",
    }
    .new_password()
}

/// The width of a table column holding `cells`: the widest, in characters, but
/// at least `min` (its heading's room) and at most 64 (a long tag or host name
/// then runs over rather than pushing every row out).
pub fn column_width<S: AsRef<str>>(cells: impl Iterator<Item = S>, min: usize) -> usize {
    cells
        // As shown: a cell is written out with `printable` (QA: a tag holding
        // U+2028 pushed the columns after it out of line).
        .map(|c| printable(c.as_ref()).chars().count())
        .max()
        .unwrap_or(0)
        .clamp(min, 64)
}

#[cfg(test)]
mod tests {
    use super::{percent, printable};

    #[test]
    fn a_percentage_never_rounds_to_an_end_it_is_not() {
        assert_eq!(percent(99.98), "99.98%");
        assert_eq!(percent(99.999), "99.99%");
        assert_eq!(percent(100.0), "100.0%");
        assert_eq!(percent(0.001), "0.01%");
        assert_eq!(percent(0.0), "0.0%");
        assert_eq!(percent(42.26), "42.3%");
    }

    #[test]
    fn invisible_and_reordering_characters_are_written_out() {
        assert_eq!(printable("web01"), "web01");
        assert_eq!(printable("web01\u{200b}"), "web01\\u{200b}");
        assert_eq!(printable("a\u{202e}gpj.exe"), "a\\u{202e}gpj.exe");
        assert_eq!(printable("a\u{2028}b\u{2029}"), "a\\u{2028}b\\u{2029}");
        assert_eq!(printable("\u{feff}x\u{2067}"), "\\u{feff}x\\u{2067}");
        assert_eq!(printable("a\nb\\c"), "a\\nb\\\\c");
        // Joiners stay: emoji sequences and some scripts are built with them.
        assert_eq!(printable("👩\u{200d}💻"), "👩\u{200d}💻");
        assert_eq!(printable("क\u{200d}ष"), "क\u{200d}ष");
        // Other default-ignorable characters, and joiners beside ASCII, hide
        // (console pentest: hosts that looked like "web01").
        for (name, out) in [
            ("web01\u{2060}", "web01\\u{2060}"),
            ("vm\u{ad}", "vm\\u{ad}"),
            ("web\u{61c}01", "web\\u{61c}01"),
            ("web01\u{e0020}", "web01\\u{e0020}"),
            ("web01\u{200d}", "web01\\u{200d}"),
            ("\u{200c}web01", "\\u{200c}web01"),
            ("web01\u{fe0f}x", "web01\\u{fe0f}x"),
        ] {
            assert_eq!(printable(name), out);
        }
    }
}
