use crate::args::{BackupArgs, Global};
use crate::ui;
use anyhow::{Context, Result};
use cairn_core::backup::source;
use cairn_core::backup::{self, BackupOptions};
use cairn_core::pattern::{has_wildcard, unescape};
use cairn_core::session::{self, IndexLoad, Session};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};

pub(crate) fn read_exclude_files(files: &[PathBuf]) -> Result<Vec<String>> {
    let mut out = Vec::new();
    for f in files {
        out.extend(
            listed_lines(f, "exclude")?
                .into_iter()
                .map(|l| expand_env(&l, |k| std::env::var(k).ok())),
        );
    }
    Ok(out)
}

/// `$NAME` and `${NAME}` replaced by the variable's value (nothing when unset),
/// as restic expands exclude files (QA: a file written for restic with
/// `$HOME/.cache` excluded nothing); `$$` is a `$`.
fn expand_env(line: &str, var: impl Fn(&str) -> Option<String>) -> String {
    let mut out = String::with_capacity(line.len());
    let mut rest = line;
    while let Some(at) = rest.find('$') {
        out.push_str(&rest[..at]);
        let after = &rest[at + 1..];
        let (name, next) = if let Some(inner) = after.strip_prefix('{') {
            match inner.find('}') {
                Some(end) => (&inner[..end], &inner[end + 1..]),
                None => ("", after),
            }
        } else if let Some(r) = after.strip_prefix('$') {
            out.push('$');
            rest = r;
            continue;
        } else {
            let end = after
                .find(|c: char| !(c.is_ascii_alphanumeric() || c == '_'))
                .unwrap_or(after.len());
            (&after[..end], &after[end..])
        };
        if name.is_empty() {
            out.push('$');
            rest = after;
            continue;
        }
        out.push_str(&var(name).unwrap_or_default());
        rest = next;
    }
    out.push_str(rest);
    out
}

#[cfg(test)]
mod tests {
    use super::{expand_env, expand_pattern, has_wildcard, list_pattern, trim_list_line, unescape};

    #[test]
    fn a_list_line_takes_backslash_escapes_as_restic() {
        // The path it names, and the pattern to expand when it has a wildcard.
        let l = |s: &str| {
            let glob = list_pattern(s.as_bytes());
            (
                String::from_utf8(unescape(&glob)).unwrap(),
                has_wildcard(&glob).then(|| String::from_utf8(glob).unwrap()),
            )
        };
        assert_eq!(l("/srv/data"), ("/srv/data".into(), None));
        assert_eq!(trim_list_line(b"  a b\\  \r"), b"a b\\ ");
        assert_eq!(trim_list_line(b"a\\\\ "), b"a\\\\");
        assert_eq!(l("/srv/a\\*"), ("/srv/a*".into(), None));
        assert_eq!(l("/srv/c\\y"), ("/srv/cy".into(), None));
        assert_eq!(l("/srv/a\\\\b"), ("/srv/a\\b".into(), None));
        assert_eq!(l("/srv/end\\"), ("/srv/end\\".into(), None));
        assert_eq!(
            l("/srv/*.conf"),
            ("/srv/*.conf".into(), Some("/srv/*.conf".into()))
        );
        assert_eq!(
            l("/srv/a[^1]"),
            ("/srv/a[^1]".into(), Some("/srv/a[^1]".into()))
        );
        assert_eq!(
            l("/srv/\\[x\\]/{a,b}*"),
            (
                "/srv/[x]/{a,b}*".into(),
                Some("/srv/\\[x\\]/\\{a,b\\}*".into())
            )
        );
    }

    /// Names are matched by their bytes: one that is not UTF-8 is found (the
    /// `glob` crate passed over it), `[^1]` negates, braces are literal.
    #[test]
    fn patterns_expand_over_any_name() {
        use std::os::unix::ffi::OsStrExt;
        let tmp = tempfile::tempdir().unwrap();
        let d = tmp.path();
        for n in [&b"a1"[..], b"ab", b"a{x}", b"bad\xff", b"good"] {
            std::fs::write(d.join(std::ffi::OsStr::from_bytes(n)), b"").unwrap();
        }
        let names = |pat: &str| -> Vec<Vec<u8>> {
            expand_pattern(&list_pattern(format!("{}/{pat}", d.display()).as_bytes()))
                .unwrap()
                .0
                .iter()
                .map(|p| p.file_name().unwrap().as_bytes().to_vec())
                .collect()
        };
        assert_eq!(names("*d*"), [b"bad\xff".to_vec(), b"good".to_vec()]);
        assert_eq!(names("a[^1]*"), [b"ab".to_vec(), b"a{x}".to_vec()]);
        assert_eq!(names("a{x}*"), [b"a{x}".to_vec()]);
        assert!(names("zz*").is_empty());
    }

    #[test]
    fn exclude_files_expand_variables_as_restic_does() {
        let var = |k: &str| match k {
            "HOME" => Some("/home/al".to_string()),
            "X_1" => Some("x".to_string()),
            _ => None,
        };
        for (line, want) in [
            ("$HOME/.cache", "/home/al/.cache"),
            ("${HOME}x/$X_1", "/home/alx/x"),
            ("/a/$UNSET/b", "/a//b"),
            ("cost$$", "cost$"),
            ("a$", "a$"),
            ("${open", "${open"),
            ("*.tmp", "*.tmp"),
        ] {
            assert_eq!(expand_env(line, var), want, "{line}");
        }
    }
}

/// The lines of a file of patterns or snapshot paths (`what`: "exclude",
/// "include"), trimmed, without empty lines and `#` comments: bytes that are not
/// UTF-8 kept as the engine's stand-ins ([`cairn_core::ls::escape_arg`]), as
/// arguments are, so that a name of any bytes can be named.
pub(crate) fn listed_lines(file: &Path, what: &str) -> Result<Vec<String>> {
    let bytes =
        std::fs::read(file).with_context(|| format!("reading {what} file {}", file.display()))?;
    Ok(bytes
        .split(|&b| b == b'\n')
        .map(<[u8]>::trim_ascii)
        .filter(|l| !l.is_empty() && !l.starts_with(b"#"))
        .map(cairn_core::ls::escape_arg)
        .collect())
}

/// How a `--files-from*` file lists its paths.
#[derive(Clone, Copy, PartialEq)]
enum ListKind {
    /// A path or glob pattern a line; `#` comments and empty lines skipped.
    Patterns,
    /// A path a line, as it is.
    Verbatim,
    /// Paths separated by NUL bytes.
    Raw,
}

/// The paths the `--files-from*` files list, in order. A pattern is expanded
/// against the file system (sorted); one that matches nothing is a warning, as
/// restic has it (a list kept by hand outlives some of its paths).
fn read_path_lists(
    a: &BackupArgs,
    progress: &cairn_core::progress::Progress,
) -> Result<Vec<PathBuf>> {
    use std::os::unix::ffi::OsStringExt;
    let lists = (a.files_from.iter().map(|f| (f, ListKind::Patterns)))
        .chain(
            a.files_from_verbatim
                .iter()
                .map(|f| (f, ListKind::Verbatim)),
        )
        .chain(a.files_from_raw.iter().map(|f| (f, ListKind::Raw)));
    let mut out = Vec::new();
    for (file, kind) in lists {
        let bytes = if file.as_os_str() == "-" {
            let mut v = Vec::new();
            std::io::Read::read_to_end(&mut std::io::stdin(), &mut v)
                .context("reading the list of paths from standard input")?;
            v
        } else {
            std::fs::read(file)
                .with_context(|| format!("reading the list of paths {}", file.display()))?
        };
        let sep = if kind == ListKind::Raw { b'\0' } else { b'\n' };
        for item in bytes.split(|&b| b == sep) {
            let item = match kind {
                ListKind::Patterns => trim_list_line(item),
                ListKind::Verbatim => item.strip_suffix(b"\r").unwrap_or(item),
                ListKind::Raw => item,
            };
            if item.is_empty() || (kind == ListKind::Patterns && item.starts_with(b"#")) {
                continue;
            }
            if kind != ListKind::Patterns {
                out.push(PathBuf::from(std::ffi::OsString::from_vec(item.to_vec())));
                continue;
            }
            let glob = list_pattern(item);
            if !has_wildcard(&glob) {
                out.push(PathBuf::from(std::ffi::OsString::from_vec(unescape(&glob))));
                continue;
            }
            let shown = String::from_utf8_lossy(item);
            let (found, unlisted) = expand_pattern(&glob)
                .map_err(|e| anyhow::anyhow!("{}: pattern \"{shown}\": {e}", file.display()))?;
            // What could not be looked into is said: files may be there (QA: an
            // unreadable directory was only "matches nothing").
            for (dir, e) in unlisted {
                progress.warning_msg(format!(
                    "{}: the pattern \"{shown}\" could not look into {}: {e}",
                    file.display(),
                    dir.display()
                ));
            }
            // A warning, which -q keeps (restic says it with -q too).
            if found.is_empty() {
                progress.warning_msg(format!(
                    "{}: the pattern \"{shown}\" matches nothing, skipped",
                    file.display()
                ));
            }
            out.extend(found);
        }
    }
    Ok(out)
}

/// A `--files-from` line read as restic reads it: `\` takes the next character as
/// it is (`\*` a literal star, `\\` a backslash), `[^a]` and `[!a]` negate, and
/// braces are themselves. Returned as a pattern in cairn's glob syntax (`\`
/// before every literal wildcard, brace or backslash): a path when it has no
/// wildcard ([`has_wildcard`], then [`unescape`]), else what [`expand_pattern`]
/// expands.
fn list_pattern(line: &[u8]) -> Vec<u8> {
    let mut glob = Vec::with_capacity(line.len());
    let mut bytes = line.iter().copied();
    while let Some(b) = bytes.next() {
        match b {
            // A backslash at the end stands for itself.
            b'\\' => {
                let c = bytes.next().unwrap_or(b'\\');
                if is_special(c) {
                    glob.push(b'\\');
                }
                glob.push(c);
            }
            b'{' | b'}' => glob.extend([b'\\', b]),
            _ => glob.push(b),
        }
    }
    glob
}

/// A `--files-from` line without the white space around it, but a space the
/// line escapes at its end (`name\ `) stays: it is part of the name.
fn trim_list_line(line: &[u8]) -> &[u8] {
    let line = line.trim_ascii_start();
    let mut end = line.len();
    while end > 0 && line[end - 1].is_ascii_whitespace() {
        let slashes = line[..end - 1]
            .iter()
            .rev()
            .take_while(|&&b| b == b'\\')
            .count();
        if slashes % 2 == 1 {
            break;
        }
        end -= 1;
    }
    &line[..end]
}

/// What cairn's glob syntax reads as other than itself.
fn is_special(c: u8) -> bool {
    matches!(c, b'*' | b'?' | b'[' | b']' | b'{' | b'}' | b'\\')
}

/// The paths a `--files-from` pattern names, one directory level at a time,
/// sorted in each directory. Names are matched by their bytes, so a name that
/// is not UTF-8 is found as restic finds it (the `glob` crate passed over them
/// silently: QA). A component without wildcards is taken as it is (it may be
/// any bytes); one with wildcards must be UTF-8. Also returns the directories
/// that could not be listed, with why (not those that are not there).
type Expanded = (Vec<PathBuf>, Vec<(PathBuf, std::io::Error)>);
fn expand_pattern(pattern: &[u8]) -> std::result::Result<Expanded, String> {
    use std::os::unix::ffi::{OsStrExt, OsStringExt};
    let mut unlisted = Vec::new();
    let mut current = vec![if pattern.starts_with(b"/") {
        PathBuf::from("/")
    } else {
        PathBuf::new()
    }];
    for component in pattern.split(|&b| b == b'/').filter(|c| !c.is_empty()) {
        let mut next = Vec::new();
        if !has_wildcard(component) {
            let name = std::ffi::OsString::from_vec(unescape(component));
            next.extend(current.iter().map(|base| base.join(&name)));
        } else {
            let text = std::str::from_utf8(component).map_err(|_| {
                "a name with wildcards that is not UTF-8 (list such paths with \
                 --files-from-verbatim)"
                    .to_string()
            })?;
            let glob = cairn_core::pattern::Glob::new(text, true, false)?;
            for base in &current {
                let dir = if base.as_os_str().is_empty() {
                    Path::new(".")
                } else {
                    base.as_path()
                };
                let entries = match std::fs::read_dir(dir) {
                    Ok(e) => e,
                    Err(e)
                        if matches!(
                            e.kind(),
                            std::io::ErrorKind::NotFound | std::io::ErrorKind::NotADirectory
                        ) =>
                    {
                        continue;
                    }
                    Err(e) => {
                        unlisted.push((dir.to_path_buf(), e));
                        continue;
                    }
                };
                let mut names: Vec<std::ffi::OsString> = entries
                    .filter_map(std::result::Result::ok)
                    .map(|e| e.file_name())
                    .filter(|n| glob.is_match_bytes(n.as_bytes()))
                    .collect();
                names.sort();
                next.extend(names.into_iter().map(|n| base.join(n)));
            }
        }
        current = next;
    }
    let found = current
        .into_iter()
        .filter(|p| !p.as_os_str().is_empty() && std::fs::symlink_metadata(p).is_ok())
        .collect();
    Ok((found, unlisted))
}

/// The standard output of a command run by `--stdin-from-command`, read as the
/// file to back up. Its end is an end only once the command has exited with
/// success: a failure then is a read error, and the backup saves no snapshot
/// (a dump cut short by its program's failure looks like a whole one otherwise).
struct CommandOutput {
    child: std::process::Child,
    out: std::process::ChildStdout,
    shown: String,
    exited: bool,
}

impl CommandOutput {
    fn spawn(words: &[PathBuf]) -> Result<CommandOutput> {
        let shown = words
            .iter()
            .map(|w| w.to_string_lossy())
            .collect::<Vec<_>>()
            .join(" ");
        let mut cmd = std::process::Command::new(&words[0]);
        // Not handed the repository's secrets (passwords, tokens, their files): a
        // dump program has no use for them.
        for (k, _) in std::env::vars_os() {
            if k.to_str().is_some_and(|k| {
                k.starts_with("CAIRN_") && (k.contains("PASSWORD") || k.contains("TOKEN"))
            }) {
                cmd.env_remove(k);
            }
        }
        // Its own process group, so that a stop ends the command and whatever it
        // started (`sh -c 'pg_dump ...'`), not only the shell.
        use std::os::unix::process::CommandExt;
        let mut child = cmd
            .args(&words[1..])
            .process_group(0)
            .stdin(std::process::Stdio::null())
            .stdout(std::process::Stdio::piped())
            .spawn()
            .with_context(|| format!("--stdin-from-command: starting {shown:?}"))?;
        let out = child
            .stdout
            .take()
            .context("--stdin-from-command: no pipe from the command")?;
        Ok(CommandOutput {
            child,
            out,
            shown,
            exited: false,
        })
    }
}

/// Waits until `fd` has something to read (or its end), looking at the
/// process's cancellation every 200 ms: a read blocked on a pipe would otherwise
/// keep a stopped backup waiting for the input's end (QA: Ctrl-C on a backup of
/// `--stdin-from-command -- sh -c 'sleep 15'` ended it 15 s later). Cancelled:
/// an error (never an end, which would save what was read as the whole).
fn wait_readable(fd: std::os::fd::BorrowedFd<'_>) -> std::io::Result<()> {
    use nix::poll::{PollFd, PollFlags, PollTimeout, poll};
    loop {
        if crate::events::cancel_token().is_cancelled() {
            return Err(std::io::Error::other("cancelled"));
        }
        let mut fds = [PollFd::new(fd, PollFlags::POLLIN)];
        match poll(&mut fds, PollTimeout::from(200u16)) {
            Ok(0) | Err(nix::errno::Errno::EINTR) => continue,
            Ok(_) => return Ok(()),
            Err(e) => return Err(e.into()),
        }
    }
}

/// Standard input, read so that Ctrl-C stops the backup at once ([`wait_readable`]).
struct Stdin(std::io::Stdin);

impl std::io::Read for Stdin {
    fn read(&mut self, buf: &mut [u8]) -> std::io::Result<usize> {
        use std::os::fd::AsFd;
        wait_readable(self.0.as_fd())?;
        self.0.read(buf)
    }
}

impl std::io::Read for CommandOutput {
    fn read(&mut self, buf: &mut [u8]) -> std::io::Result<usize> {
        use std::os::fd::AsFd;
        wait_readable(self.out.as_fd())?;
        let n = self.out.read(buf)?;
        if n == 0 && !buf.is_empty() && !self.exited {
            let status = self.child.wait()?;
            self.exited = true;
            if !status.success() {
                return Err(std::io::Error::other(format!(
                    "the command {:?} failed ({status}): its output is not saved",
                    self.shown
                )));
            }
        }
        Ok(n)
    }
}

impl Drop for CommandOutput {
    /// A backup that ends early (an error, Ctrl-C) leaves no command running.
    fn drop(&mut self) {
        if !self.exited {
            // The group the command leads: the shell and what it started.
            let group = nix::unistd::Pid::from_raw(self.child.id() as i32);
            let _ = nix::sys::signal::killpg(group, nix::sys::signal::Signal::SIGTERM);
            let _ = self.child.kill();
            let _ = self.child.wait();
        }
    }
}

pub fn run(g: &Global, a: BackupArgs) -> Result<i32> {
    // First: the warnings about the arguments go through it too (JSON events
    // with --json, shown with -q).
    let mut p = crate::events::CliProgress::listing(g, a.verbose);
    if a.stdin_from_command
        && (a.paths.is_empty()
            || a.image.is_some()
            || !a.files_from.is_empty()
            || !a.files_from_verbatim.is_empty()
            || !a.files_from_raw.is_empty())
    {
        anyhow::bail!(
            "--stdin-from-command runs the command given after the options \
             (cairn backup --stdin-from-command --stdin-name db.sql -- pg_dump mydb); \
             it takes no paths, --image or --files-from"
        );
    }
    // Standard input is the data, not a password (restic refuses both at once).
    let dash = |l: &[std::path::PathBuf]| {
        l.iter().any(|f| {
            ["-", "/dev/stdin", "/dev/fd/0", "/proc/self/fd/0"].contains(&f.to_str().unwrap_or(""))
        })
    };
    let list_on_stdin = a
        .changed_blocks
        .as_ref()
        .is_some_and(|l| dash(std::slice::from_ref(l)));
    if a.stdin
        || list_on_stdin
        || dash(&a.files_from)
        || dash(&a.files_from_verbatim)
        || dash(&a.files_from_raw)
    {
        crate::ui::STDIN_IS_DATA.store(true, std::sync::atomic::Ordering::Relaxed);
    }
    if a.stdin && !a.paths.is_empty() {
        return Err(super::bad_argument("--stdin cannot be combined with paths"));
    }
    if a.image.is_some() && (a.stdin || !a.paths.is_empty()) {
        return Err(super::bad_argument(
            "--image backs up one image: it cannot be combined with paths or --stdin",
        ));
    }
    if a.image.is_some() {
        // They choose files of a tree; an image is read whole, so taking them
        // silently would let a user believe something was left out (QA).
        let selecting = [
            ("--files-from", !a.files_from.is_empty()),
            ("--files-from-verbatim", !a.files_from_verbatim.is_empty()),
            ("--files-from-raw", !a.files_from_raw.is_empty()),
            ("--exclude", !a.excludes.is_empty()),
            ("--exclude-file", !a.exclude_files.is_empty()),
            ("--iexclude", !a.iexcludes.is_empty()),
            ("--iexclude-file", !a.iexclude_files.is_empty()),
            ("--exclude-if-present", !a.exclude_if_present.is_empty()),
            ("--exclude-caches", a.exclude_caches),
            ("--exclude-larger-than", a.exclude_larger_than.is_some()),
            ("--one-file-system", a.one_file_system),
        ];
        if let Some((flag, _)) = selecting.iter().find(|(_, given)| *given) {
            return Err(super::bad_argument(format!(
                "{flag} chooses files to back up, and --image reads the whole image: \
                 they cannot be combined"
            )));
        }
    }
    let image = match &a.image {
        Some(source) => Some(cairn_core::ops::image::ImageOptions {
            source: source.clone(),
            name: a.name.clone(),
            changed_blocks: match &a.changed_blocks {
                Some(f) => Some((
                    f.clone(),
                    a.changed_blocks_format.parse().map_err(|e: String| {
                        super::bad_argument(format!("--changed-blocks-format: {e}"))
                    })?,
                )),
                None => None,
            },
        }),
        None => None,
    };
    let mut patterns = a.excludes.clone();
    patterns.extend(read_exclude_files(&a.exclude_files)?);
    let mut ipatterns = a.iexcludes.clone();
    ipatterns.extend(read_exclude_files(&a.iexclude_files)?);
    let excludes = source::ExcludeRules {
        patterns,
        ipatterns,
        if_present: a.exclude_if_present.clone(),
        caches: a.exclude_caches,
        larger_than: a
            .exclude_larger_than
            .as_deref()
            .map(super::parse_size)
            .transpose()
            .context("--exclude-larger-than")?,
        // The engine adds the repository's own directory.
        own_dirs: Vec::new(),
        below: false,
    };
    let listed = !(a.files_from.is_empty()
        && a.files_from_verbatim.is_empty()
        && a.files_from_raw.is_empty());
    if listed && (a.stdin || a.image.is_some()) {
        return Err(super::bad_argument(
            "--files-from lists paths: it cannot be combined with --stdin or --image",
        ));
    }
    let mut paths = if a.stdin_from_command {
        Vec::new()
    } else {
        a.paths.clone()
    };
    paths.extend(read_path_lists(&a, &p.progress)?);
    if listed && paths.is_empty() {
        anyhow::bail!("the --files-from lists name no path to back up");
    }
    if let Some(t) = &a.time
        && cairn_core::time::parse_user_time(t).is_none()
    {
        return Err(super::bad_argument(format!(
            "--time {t:?}: {}",
            cairn_core::time::user_time_problem(t)
        )));
    }
    if let Some(t) = a
        .time
        .as_deref()
        .and_then(cairn_core::time::parse_user_time)
        && cairn_core::time::parse_rfc3339(&t).is_some_and(cairn_core::time::in_the_future)
    {
        p.progress.warning_msg(format!(
            "--time {t} is in the future: until then `latest` passes this snapshot over \
             and retention keeps it without counting it"
        ));
    }
    let read_limit = super::rate_flag(&a.read_limit, "--read-limit")?;
    let location = super::repo_location(g)?;
    let storage = super::storage_options(g)?;
    let exists = cairn_core::repo::storage::repository_exists(
        &cairn_core::repo::storage::open_storage(&location, &storage, &p.progress)?,
    )?;
    if a.dry_run && !exists {
        anyhow::bail!("no repository at {location}: a dry run compares with one that exists");
    }
    let repo = if a.dry_run {
        let storage = cairn_core::repo::storage::StorageOptions {
            dry_run: true,
            ..storage
        };
        super::open_with(g, &location, &storage, || ui::password(g), &p.progress)?
    } else if a.init && !exists {
        let r = super::init::init_repo(g, &cairn_core::InitOptions::default(), &p.progress)?;
        if !g.quiet && !g.json {
            eprintln!("created repository at {location}");
        }
        r
    } else {
        super::open(g, &p.progress)?
    };
    // The session waits for a job slot before loading the index: the jobs ahead
    // are then finished, and this one deduplicates against what they stored.
    let session: Session<session::Backup> =
        Session::open(repo, "backup", IndexLoad::Backup, &p.progress).map_err(|e| match e {
            // Stopped while the repository was opened (QA: it said only "cancelled").
            cairn_core::Error::Cancelled => anyhow::Error::from(e)
                .context("backup cancelled before it read anything; no snapshot was saved"),
            e => e.into(),
        })?;
    // The command starts once the repository is open (a wrong password runs nothing).
    let stdin: Option<(String, Box<dyn std::io::Read + Send>)> = if a.stdin_from_command {
        Some((
            a.stdin_name.clone(),
            Box::new(CommandOutput::spawn(&a.paths)?),
        ))
    } else {
        a.stdin.then(|| {
            (
                a.stdin_name.clone(),
                Box::new(Stdin(std::io::stdin())) as Box<dyn std::io::Read + Send>,
            )
        })
    };
    let opts = BackupOptions {
        paths,
        stdin,
        image,
        tags: a.tags.clone(),
        host: a.host.clone(),
        excludes,
        one_file_system: a.one_file_system,
        parent: a.parent.clone(),
        force: a.force,
        skip_if_unchanged: a.skip_if_unchanged,
        change_detection: backup::ChangeDetection {
            ignore_inode: a.ignore_inode,
            ignore_ctime: a.ignore_ctime,
        },
        read_concurrency: a.read_concurrency.map(|n| n as usize),
        pack_size: super::pack_size_flag(&a.pack_size)?,
        read_limit,
        time: a.time.clone(),
        list_files: a.verbose,
    };
    // For the bar's ETA, and for --json readers (the status lines' total): the
    // sizes below the paths, added up beside the backup.
    let total_scan = ((ui::interactive(g) || g.json)
        && !a.no_scan
        && !a.stdin
        && !a.stdin_from_command
        && a.image.is_none())
    .then(|| backup::excludes(session.repo(), &opts.excludes))
    .and_then(Result::ok)
    .map(|ex| (opts.paths.clone(), ex, opts.one_file_system));
    p.start();
    let done = AtomicBool::new(false);
    let result = std::thread::scope(|s| {
        if let Some((paths, ex, one_fs)) = &total_scan {
            let (progress, done) = (&p.progress, &done);
            s.spawn(move || {
                let stop = || progress.is_cancelled() || done.load(Ordering::Relaxed);
                source::scan_total(paths, ex, *one_fs, progress, &stop);
            });
        }
        let r = backup::backup(&session, opts);
        done.store(true, Ordering::Relaxed);
        r
    });
    p.finish();
    let r = result.map_err(|e| match e {
        e if e.is_no_space() => anyhow::anyhow!(
            "{e}: the backup was not saved; earlier snapshots are intact (free space, then run the backup again)"
        ),
        cairn_core::Error::Cancelled => anyhow::Error::from(e).context(
            "backup cancelled; no snapshot was saved (what was stored so far is reused by the next backup)",
        ),
        // A value that cannot be taken: nothing was started (exit 2).
        e @ cairn_core::Error::BadArgument(_) => anyhow::Error::from(e),
        e => anyhow::Error::from(e).context("backup failed; no snapshot was saved"),
    })?;
    super::warn_index_repaired(&p.progress, r.index_repaired.as_deref());
    if let Some(f) = &r.index_lookup_failures {
        p.progress.warning_msg(format!(
            "{} lookups in the SSD index failed ({}); the chunks they asked about \
             were taken as new and stored again where needed, so the snapshot is complete, \
             but such copies are not deduplicated until prune",
            f.count, f.error
        ));
    }
    let s = &r.summary;
    // An empty dump is most often a producer that was missing or failed in a
    // pipe (whose status the backup cannot see): saved, as restic does, but said.
    if (a.stdin || a.stdin_from_command) && s.total_bytes == 0 {
        p.progress.warning_msg(format!(
            "standard input was empty: the snapshot holds an empty {} (did the \
             command writing it fail?)",
            a.stdin_name
        ));
    }
    if g.json && a.dry_run {
        let mut j = serde_json::to_value(&r)?;
        if let Some(m) = j.as_object_mut() {
            m.insert("dry_run".into(), true.into());
            // No snapshot was saved: there is no id to give.
            m.remove("snapshot_id");
        }
        super::print_json_report(&j)?;
    } else if g.json {
        super::print_json_report(&r)?;
    } else if !g.quiet && r.snapshot.image.is_some() {
        print_image_summary(&r, a.dry_run);
    } else if !g.quiet {
        let d = s.duration_secs;
        println!(
            "files:     {} new, {} changed, {} unchanged",
            s.files_new, s.files_changed, s.files_unchanged
        );
        match (s.dirs_new, s.dirs_changed, s.dirs_unchanged) {
            (Some(n), Some(c), Some(u)) => println!(
                "dirs:      {n} new, {c} changed, {u} unchanged; other entries: {}",
                s.other_entries
            ),
            _ => println!("dirs:      {}, other entries: {}", s.dirs, s.other_entries),
        }
        print_read_added(&r, a.dry_run);
        if let Some(d) = &r.concurrent_duplicates {
            println!(
                "           of which {} ({}) a backup running at the same time stored too \
                 (each of the two counts it); `cairn prune` reclaims the second copy",
                ui::bytes(d.bytes),
                ui::count(d.chunks, "chunk")
            );
        }
        if let Some(sd) = &r.server_dedup {
            println!(
                "dedup:     asked the server about {} (it already held {} of them; the \
                 datastore held {} at the start; {} remembered here from earlier backups); \
                 read {} listing trees, not the whole index",
                ui::count(sd.chunks_asked, "chunk"),
                sd.chunks_answered_stored,
                ui::count(sd.chunks_known, "chunk"),
                sd.chunks_remembered,
                ui::count(sd.index_files_read as u64, "index file")
            );
        }
        println!(
            "duration:  {:.2}s{}, {} read, {} processed, {:.0} files/s",
            d,
            if r.slot_wait_secs >= 0.05 {
                format!(" (after {:.1}s waiting for a job slot)", r.slot_wait_secs)
            } else {
                String::new()
            },
            ui::rate(s.bytes_read, d),
            ui::rate(s.total_bytes, d),
            r.files_per_sec
        );
        if s.entries_skipped > 0 {
            println!(
                "skipped:   {} could not be read (see warnings above)",
                ui::count(s.entries_skipped, "entry")
            );
        }
        if !r.changed_while_read.is_empty() {
            println!(
                "changed:   {} changed while they were read: saved as read (see warnings above)",
                ui::count(r.changed_while_read.len() as u64, "file")
            );
        }
        print_saved(&r, a.dry_run);
    }
    let image_incomplete = r
        .snapshot
        .image
        .as_ref()
        .is_some_and(|i| !i.unreadable.is_empty() || i.size_at_end.is_some());
    Ok(
        if s.entries_skipped > 0 || !r.changed_while_read.is_empty() || image_incomplete {
            crate::EXIT_INCOMPLETE
        } else {
            0
        },
    )
}

fn print_image_summary(r: &backup::BackupReport, dry_run: bool) {
    let (Some(i), s) = (&r.snapshot.image, &r.summary) else {
        return;
    };
    let d = s.duration_secs;
    println!(
        "image:     {} ({}), {} of {}{}",
        i.source,
        ui::bytes(i.size),
        ui::count(i.blocks, "block"),
        ui::bytes(u64::from(i.block_size)),
        if i.changed_blocks_input {
            " (changed-block list)"
        } else {
            ""
        }
    );
    // Holes of a sparse source count among the blocks read (as zeros) in the
    // snapshot's record, and were not read from the disk: each part said apart
    // (QA: "4096 read" beside "read: 7.64 MiB of 64 MiB", then "3072 read (3012
    // of them in holes)").
    // Blocks wholly in holes: one partly data was read (QA r18: 48 KiB of holes
    // inside four read blocks were said as three blocks in holes).
    let in_holes = i.blocks_in_holes.min(i.blocks_read);
    let mut parts = vec![format!("{} read from the source", i.blocks_read - in_holes)];
    if in_holes > 0 {
        parts.push(format!("{in_holes} in holes (zeros, not read)"));
    }
    if i.blocks > i.blocks_read {
        parts.push(format!(
            "{} taken from the parent unread",
            i.blocks - i.blocks_read
        ));
    }
    println!(
        "blocks:    {} in all: {}; {} {}, {} zero{}",
        i.blocks,
        parts.join(", "),
        i.blocks_changed,
        if r.parent.is_some() {
            "changed since the parent"
        } else {
            "new (no parent)"
        },
        i.blocks_zero,
        if i.blocks > i.blocks_read {
            " among those read"
        } else {
            ""
        }
    );
    if i.bytes_in_holes > 0 {
        println!(
            "holes:     {} of the file are holes: zeros, not read from the disk",
            ui::bytes(i.bytes_in_holes)
        );
    }
    print_read_added(r, dry_run);
    println!(
        "duration:  {:.2}s, {} read, {} of image covered",
        d,
        ui::rate(s.bytes_read, d),
        ui::rate(s.total_bytes, d)
    );
    if !i.unreadable.is_empty() {
        println!(
            "unreadable: {} saved as zeros (see warnings above)",
            ui::count(i.unreadable.len() as u64, "range")
        );
    }
    if let Some(now) = i.size_at_end {
        println!(
            "changed:   the source is now {now} bytes; the image was saved at {} (see warning above)",
            i.size
        );
    }
    print_saved(r, dry_run);
}

/// The summary's last line: the snapshot saved, or why none was.
fn print_saved(r: &backup::BackupReport, dry_run: bool) {
    let parent = r.parent.map(|p| p.short()).unwrap_or_default();
    match (r.snapshot_id, dry_run) {
        (_, true) if r.unchanged => println!(
            "dry run: nothing was saved (nothing changed since snapshot {parent}: \
             --skip-if-unchanged would save no snapshot)"
        ),
        (_, true) => println!("dry run: nothing was saved"),
        (Some(id), false) => println!("snapshot {} saved", id.short()),
        (None, false) => println!(
            "nothing changed since snapshot {parent}: no snapshot saved (--skip-if-unchanged)"
        ),
    }
}

/// The `read:` and `added:` lines, shared by file and image backups. `added`
/// is what the repository grew by (what `stats` will show), its compressed data
/// named apart (QA: the data alone was given as "added").
fn print_read_added(r: &cairn_core::backup::BackupReport, dry_run: bool) {
    let s = &r.summary;
    println!(
        "read:      {} of {} in the snapshot",
        ui::bytes(s.bytes_read),
        ui::bytes(s.total_bytes)
    );
    if dry_run {
        println!(
            "would add: {} of data compressed and sealed ({} before compression), plus pack \
             headers and index",
            ui::bytes(s.data_added_packed),
            ui::bytes(s.data_added)
        );
    } else {
        println!(
            "added:     {} to the repository: {} of data compressed and sealed ({} before \
             compression), the rest pack headers and index",
            ui::bytes(r.bytes_stored),
            ui::bytes(s.data_added_packed),
            ui::bytes(s.data_added)
        );
    }
}
