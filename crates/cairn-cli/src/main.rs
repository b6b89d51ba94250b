//! `cairn`: the command-line interface. Each subcommand lives in `commands/<verb>.rs`
//! and only parses, calls the engine and renders; errors print as one line.

// Output that never panics (see `out`): these shadow std's macros in every module
// of this crate, declared below them.
macro_rules! println {
    () => { $crate::out::out(format_args!(""), true) };
    ($($t:tt)*) => { $crate::out::out(format_args!($($t)*), true) };
}
#[allow(unused_macros)]
macro_rules! print {
    ($($t:tt)*) => { $crate::out::out(format_args!($($t)*), false) };
}
macro_rules! eprintln {
    () => { $crate::out::err(format_args!(""), true) };
    ($($t:tt)*) => { $crate::out::err(format_args!($($t)*), true) };
}
#[allow(unused_macros)]
macro_rules! eprint {
    ($($t:tt)*) => { $crate::out::err(format_args!($($t)*), false) };
}

mod args;
mod commands;
mod events;
mod out;
mod ui;

/// Exit codes (restic's where they exist): 1 error, 3 backup saved but some entries
/// could not be read (or changed while they were read), 10 no repository, 12 wrong password, 130 cancelled (SIGINT or
/// SIGTERM: the operation stopped at a safe point).
pub const EXIT_INCOMPLETE: i32 = 3;
/// A bad argument: nothing was done (clap's own, and values found bad later).
const EXIT_USAGE: i32 = 2;
const EXIT_NO_REPO: i32 = 10;
const EXIT_WRONG_PASSWORD: i32 = 12;
const EXIT_CANCELLED: i32 = 130;

fn exit_code(e: &anyhow::Error) -> i32 {
    for cause in e.chain() {
        if cause.downcast_ref::<commands::BadArgument>().is_some() {
            return EXIT_USAGE;
        }
        if let Some(ce) = cause.downcast_ref::<cairn_core::Error>() {
            return match ce.root() {
                cairn_core::Error::WrongPassword => EXIT_WRONG_PASSWORD,
                cairn_core::Error::RepositoryNotFound(_)
                | cairn_core::Error::NotARepository(_)
                | cairn_core::Error::ConfigMissing(_)
                | cairn_core::Error::OtherToolsRepository(..)
                | cairn_core::Error::InterruptedInit(_) => EXIT_NO_REPO,
                cairn_core::Error::Cancelled => EXIT_CANCELLED,
                // A forget with no policy (and no ids) misses its argument.
                cairn_core::Error::BadArgument(_) | cairn_core::Error::NoPolicy => EXIT_USAGE,
                _ => 1,
            };
        }
    }
    1
}

fn main() {
    // SIGPIPE stays ignored (Rust's default): a network peer that goes away while a
    // request is being written must be an error the retries handle, not the end of
    // the process. Output to a reader that went away (`cairn ls | head`) ends
    // quietly instead, with the status a SIGPIPE death would have had.
    quiet_on_closed_stdout();
    // A write past the file-size limit (`ulimit -f`) must be an error (EFBIG) a
    // restore or export reports and cleans up after, as a full disk is, not a
    // SIGXFSZ that ends the process with a partial file left behind.
    #[allow(unsafe_code)]
    // SAFETY: setting a signal's disposition to SIG_IGN, before threads start.
    unsafe {
        libc::signal(libc::SIGXFSZ, libc::SIG_IGN);
    }
    // Large buffers (4 MiB chunk batches, 16 MiB packs) come and go all the time; with
    // glibc's dynamic mmap threshold they end up in arenas that do not shrink, which
    // raised peak RSS by tens of MiB. A fixed threshold returns them on free. Eight
    // arenas: a backup runs ~25 threads (scanners, 16 readers, uploaders); with four,
    // lock waits in malloc cost ~4% of a million-small-file backup (+5 MiB RSS).
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    #[allow(unsafe_code)]
    // SAFETY: mallopt only changes allocator tuning; called before any allocation-heavy
    // work and before threads start.
    unsafe {
        libc::mallopt(libc::M_MMAP_THRESHOLD, 1 << 20);
        libc::mallopt(libc::M_ARENA_MAX, 8);
    }
    // Backups keep directories open for the scanner and reader threads, and
    // restores keep files open while their chunks arrive: use the hard limit on open
    // files rather than the soft one (often 1024), as Go programs do at startup.
    if let Ok((soft, hard)) =
        nix::sys::resource::getrlimit(nix::sys::resource::Resource::RLIMIT_NOFILE)
        && soft < hard
    {
        let _ = nix::sys::resource::setrlimit(
            nix::sys::resource::Resource::RLIMIT_NOFILE,
            hard.min(1 << 20),
            hard,
        );
    }
    let cli = args::parse();
    // Operations that stop cleanly when asked are asked; every other command
    // ends at once, which is safe, and says so.
    if matches!(
        cli.command,
        args::Command::Backup(_)
            | args::Command::Restore(_)
            | args::Command::Copy(_)
            | args::Command::Check(_)
            | args::Command::Prune(_)
            | args::Command::Stats(_)
            | args::Command::Mount(_)
    ) {
        save_terminal();
        cancel_on_signals();
    } else if !matches!(cli.command, args::Command::Serve(_)) {
        save_terminal();
        // (`serve` shuts down gracefully on SIGTERM by itself.)
        stop_on_signals(cli.global.json);
    }
    let json = cli.global.json;
    ui::JSON_OUTPUT.store(json, std::sync::atomic::Ordering::Relaxed);
    let result = commands::run(cli);
    commands::report_traffic();
    if let Some(e) = out::stdout_error() {
        let code = match &result {
            Ok(0) | Ok(EXIT_INCOMPLETE) => 1,
            Ok(c) => *c,
            Err(e) => exit_code(e),
        };
        report_error(json, &format!("writing to standard output: {e}"), code);
        if let Err(e) = &result {
            report_error(json, &one_line(e), code);
        }
        std::process::exit(code);
    }
    match result {
        Ok(code) => std::process::exit(code),
        Err(e) if is_closed_stdout(&e) => exit_broken_pipe(),
        Err(e) => {
            let code = exit_code(&e);
            let mut message = one_line(&e);
            // Commands with no advice of their own for a full repository (key,
            // config, tag, rewrite, repair) say it here; those with one (backup,
            // prune, copy, a lock) give it in a message of their own, which no
            // longer carries the storage's error as a cause.
            // A server's refusal for the token's role, said as such rather than
            // after the object the command was writing (QA r29: "put
            // index/admin-…: server: a backup token may not create …").
            if let Some(why) = refused_by_server(&e) {
                message = format!("the server refused this to the token given: {why}");
            }
            if repository_full(&e) {
                message.push_str(
                    "; free space on the repository's storage, then run the command again",
                );
            }
            // Data the index lacks (QA: restore, dump and ls said so and nothing
            // more, while `check` knew the index files were lost).
            if lost_data(&e) && !message.contains("cairn check") {
                message.push_str(
                    "; `cairn check --read-data` says what the repository lacks or holds \
                     damaged, and what repairs it (`cairn repair index` when index files \
                     were lost)",
                );
            }
            if code == EXIT_WRONG_PASSWORD
                && ui::EDGE_SPACE.load(std::sync::atomic::Ordering::Relaxed)
            {
                message.push_str(
                    " (the password given begins or ends with a space or tab, which counts \
                     as part of it)",
                );
            }
            if config_damaged(&e) && message.contains("cairn repair config") {
                message.push_str(
                    "; or put back a copy of the file `config` from a backup of this \
                     storage (a disk or volume snapshot, a file-level copy)",
                );
            } else if config_damaged(&e) {
                message.push_str(
                    "; the data is intact, but nothing in the repository can be read without \
                     its config (written by `cairn init`, rewritten only by `cairn config`): put \
                     back a copy of the file `config` from a backup of this storage (a disk or \
                     volume snapshot, a file-level copy), or restore from a replica made with \
                     `cairn copy`",
                );
            }
            report_error(json, &message, code);
            std::process::exit(code);
        }
    }
}

/// The server's words when it refused the token an operation for its role.
fn refused_by_server(e: &anyhow::Error) -> Option<String> {
    e.chain().find_map(|cause| {
        let b = match cause.downcast_ref::<cairn_core::Error>().map(|c| c.root()) {
            Some(cairn_core::Error::Backend(b)) => b,
            _ => cause.downcast_ref::<cairn_backend::BackendError>()?,
        };
        (b.kind == cairn_backend::BackendErrorKind::PermissionDenied
            && b.message.contains(" token may not "))
        .then(|| b.message.trim_start_matches("server: ").to_string())
    })
}

/// Whether the error is a repository config that does not parse or authenticate
/// (not one this user may not read, nor a newer cairn's).
fn config_damaged(e: &anyhow::Error) -> bool {
    e.chain().any(|cause| {
        cause
            .downcast_ref::<cairn_core::Error>()
            .is_some_and(cairn_core::Error::is_config_damage)
    })
}

/// Whether the error is a blob the index lacks or a pack storage lacks.
fn lost_data(e: &anyhow::Error) -> bool {
    e.chain().any(|cause| {
        cause.downcast_ref::<cairn_core::Error>().is_some_and(|ce| {
            matches!(
                ce.root(),
                cairn_core::Error::BlobNotFound(_) | cairn_core::Error::PackMissing { .. }
            )
        })
    })
}

/// Whether the error is the repository's storage refusing a write for want of
/// space (not a restore target's: that is the target's own message).
fn repository_full(e: &anyhow::Error) -> bool {
    let full = |b: &cairn_backend::BackendError| b.kind == cairn_backend::BackendErrorKind::NoSpace;
    e.chain().any(|cause| {
        cause
            .downcast_ref::<cairn_core::Error>()
            .is_some_and(|ce| matches!(ce.root(), cairn_core::Error::Backend(b) if full(b)))
            || cause
                .downcast_ref::<cairn_backend::BackendError>()
                .is_some_and(full)
    })
}

/// The error a command ended with, on stderr: `cairn: error: ...`, or with
/// `--json` one more event line (`{"type":"error","message":...,"exit_code":N}`),
/// so that a script reading stderr line by line as JSON reads it too.
pub(crate) fn report_error(json: bool, message: &str, code: i32) {
    if json {
        let line = serde_json::json!({"type": "error", "message": message, "exit_code": code});
        eprintln!("{line}");
    } else {
        eprintln!("cairn: error: {message}");
    }
}

/// An error and its causes on one line, `outer: cause: cause`, each cause said once:
/// the engine's errors already name their cause in their own message (`PATH: No
/// such file or directory`), and printing the chain again repeated it.
pub(crate) fn one_line(e: &anyhow::Error) -> String {
    let mut out = String::new();
    for cause in e.chain() {
        let text = cause.to_string();
        if text.is_empty() || out.contains(&text) {
            continue;
        }
        if !out.is_empty() {
            out.push_str(": ");
        }
        out.push_str(&text);
    }
    out
}

/// Exit status of a process ended by SIGPIPE, as shells report it.
const EXIT_BROKEN_PIPE: i32 = 128 + 13;

/// Ends the process quietly, as SIGPIPE would have, when the reader of its output
/// went away; the repository locks it holds are removed first (`exit` skips their
/// drop).
pub(crate) fn exit_broken_pipe() -> ! {
    cairn_core::repo::lock::release_held();
    std::process::exit(EXIT_BROKEN_PIPE)
}

/// Printing to a closed stdout panics in `println!`: end quietly instead.
fn quiet_on_closed_stdout() {
    let default = std::panic::take_hook();
    std::panic::set_hook(Box::new(move |info| {
        let msg = info
            .payload()
            .downcast_ref::<String>()
            .map(String::as_str)
            .or_else(|| info.payload().downcast_ref::<&str>().copied())
            .unwrap_or("");
        if msg.starts_with("failed printing to stdout") && msg.contains("Broken pipe") {
            exit_broken_pipe();
        }
        default(info);
    }));
}

/// Whether the error is output going to a reader that went away.
fn is_closed_stdout(e: &anyhow::Error) -> bool {
    e.chain().any(|c| {
        c.downcast_ref::<std::io::Error>()
            .is_some_and(|io| io.kind() == std::io::ErrorKind::BrokenPipe)
    })
}

/// The controlling terminal (its descriptor) and its settings as the process
/// found them: a password prompt turns echo off while it reads, and a process
/// ended by a signal there must put it back (QA: Ctrl-C at a prompt left the
/// shell typing blind; restic puts it back too).
static TTY_FD: std::sync::atomic::AtomicI32 = std::sync::atomic::AtomicI32::new(-1);
static TTY_SAVED: std::sync::OnceLock<libc::termios> = std::sync::OnceLock::new();

fn save_terminal() {
    #[allow(unsafe_code)]
    // SAFETY: open, tcgetattr and close on a descriptor this function owns; the
    // termios is read only once tcgetattr filled it.
    unsafe {
        let fd = libc::open(
            c"/dev/tty".as_ptr(),
            libc::O_RDWR | libc::O_NOCTTY | libc::O_CLOEXEC,
        );
        if fd < 0 {
            return;
        }
        let mut t = std::mem::MaybeUninit::<libc::termios>::zeroed();
        if libc::tcgetattr(fd, t.as_mut_ptr()) != 0 || TTY_SAVED.set(t.assume_init()).is_err() {
            libc::close(fd);
            return;
        }
        TTY_FD.store(fd, std::sync::atomic::Ordering::SeqCst);
    }
}

/// Puts back the terminal's settings [`save_terminal`] found, if they changed
/// (echo turned off), from a signal handler: only async-signal-safe calls, and
/// only while this process is in the foreground (from the background, setting
/// them would stop the process with SIGTTOU).
fn restore_terminal() {
    let fd = TTY_FD.load(std::sync::atomic::Ordering::SeqCst);
    let Some(saved) = TTY_SAVED.get() else {
        return;
    };
    if fd < 0 {
        return;
    }
    #[allow(unsafe_code)]
    // SAFETY: tcgetpgrp, getpgrp, tcgetattr and tcsetattr are async-signal-safe;
    // `now` is read only once tcgetattr filled it.
    unsafe {
        if libc::tcgetpgrp(fd) != libc::getpgrp() {
            return;
        }
        let mut now = std::mem::MaybeUninit::<libc::termios>::zeroed();
        if libc::tcgetattr(fd, now.as_mut_ptr()) != 0 {
            return;
        }
        if now.assume_init().c_lflag != saved.c_lflag {
            libc::tcsetattr(fd, libc::TCSANOW, saved);
        }
    }
}

/// For commands that have no safe point to stop at of their own (forget, tag,
/// rewrite, key, repair, recover, ...), SIGINT and SIGTERM end the process at
/// once, which is as safe as a crash (every change is written new, then
/// committed), and say so: ended by the signal itself, they had said nothing
/// (QA). The status is 130, as for the operations that stop cleanly.
fn stop_on_signals(json: bool) {
    use nix::sys::signal::{SaFlags, Signal};
    use std::sync::atomic::{AtomicBool, Ordering};
    static AS_JSON: AtomicBool = AtomicBool::new(false);
    const TEXT: &[u8] = b"cairn: error: interrupted: stopped at once, which is as safe as \
        a crash (nothing it had committed is lost; run the command again to finish)\n";
    const JSON: &[u8] = b"{\"type\":\"error\",\"message\":\"interrupted: stopped at once, \
        which is as safe as a crash (nothing it had committed is lost; run the command again \
        to finish)\",\"exit_code\":130}\n";
    AS_JSON.store(json, Ordering::SeqCst);
    extern "C" fn on_signal(_: libc::c_int) {
        let m = if AS_JSON.load(Ordering::SeqCst) {
            JSON
        } else {
            TEXT
        };
        restore_terminal();
        #[allow(unsafe_code)]
        // SAFETY: write and _exit are async-signal-safe; `m` is static.
        unsafe {
            libc::write(2, m.as_ptr().cast(), m.len());
            libc::_exit(EXIT_CANCELLED)
        }
    }
    // The handler only loads an atomic and makes async-signal-safe calls.
    on_signals(
        on_signal,
        SaFlags::empty(),
        &[Signal::SIGINT, Signal::SIGTERM],
    );
}

/// Sets `handler` for `signals`. Every handler given here must make only
/// async-signal-safe calls (atomics, write, unlink, tcsetattr, _exit).
pub(crate) fn on_signals(
    handler: extern "C" fn(libc::c_int),
    flags: nix::sys::signal::SaFlags,
    signals: &[nix::sys::signal::Signal],
) {
    use nix::sys::signal::{SigAction, SigHandler, SigSet, sigaction};
    let action = SigAction::new(SigHandler::Handler(handler), flags, SigSet::empty());
    for sig in signals {
        #[allow(unsafe_code)]
        // SAFETY: the handlers given here are async-signal-safe (see above).
        unsafe {
            let _ = sigaction(*sig, &action);
        }
    }
}

/// The first SIGINT or SIGTERM asks the running operation to stop at its next safe
/// point (a backup saves no snapshot, a restore stops between files, a prune
/// before it changes anything); a second one ends the process at once, which is
/// as safe as a crash.
fn cancel_on_signals() {
    use nix::sys::signal::{SaFlags, Signal};
    // Created before the handler can run: the handler only reads it.
    let token = events::cancel_token();
    cairn_backend::stop_waits_on(token.flag().clone());
    extern "C" fn on_signal(_: libc::c_int) {
        let token = events::cancel_token();
        if token.is_cancelled() {
            restore_terminal();
            #[allow(unsafe_code)]
            // SAFETY: _exit is async-signal-safe.
            unsafe {
                libc::_exit(EXIT_CANCELLED)
            }
        }
        token.cancel();
    }
    // The handler only loads and stores atomics (and puts the terminal back
    // and calls _exit).
    on_signals(
        on_signal,
        SaFlags::SA_RESTART,
        &[Signal::SIGINT, Signal::SIGTERM],
    );
}
