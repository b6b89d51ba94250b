//! Writing to standard output and standard error without panicking.
//!
//! `println!` and `eprintln!` panic when the write fails: a restore whose stderr
//! went to a full disk or a closed pipe died with a backtrace half-way through its
//! tree. The crate's own `println!`, `print!`, `eprintln!` and `eprint!` (macros in
//! `main.rs`, which shadow std's everywhere in this crate) come here instead:
//!
//! - a reader of stdout that went away ends the process quietly, as SIGPIPE would
//!   (`cairn ls | head`);
//! - any other stdout failure (a full disk) is remembered, the work goes on, and
//!   the command ends with exit 1 and one line naming it;
//! - a stderr failure is ignored: a diagnostic that cannot be written must not stop
//!   the work it describes, and there is nowhere left to say so.

use std::fmt;
use std::io::{self, Write};
use std::sync::OnceLock;

static STDOUT_FAILED: OnceLock<String> = OnceLock::new();

fn stdout_failed(e: io::Error) {
    if e.kind() == io::ErrorKind::BrokenPipe {
        crate::exit_broken_pipe();
    }
    let _ = STDOUT_FAILED.set(e.to_string());
}

/// `args` to stdout, with a newline when `newline`.
pub fn out(args: fmt::Arguments<'_>, newline: bool) {
    let mut o = io::stdout().lock();
    let r = o
        .write_fmt(args)
        .and_then(|()| if newline { o.write_all(b"\n") } else { Ok(()) });
    if let Err(e) = r {
        stdout_failed(e);
    }
}

/// `args` to stderr, with a newline when `newline`; failures are ignored.
pub fn err(args: fmt::Arguments<'_>, newline: bool) {
    let mut o = io::stderr().lock();
    let _ = o
        .write_fmt(args)
        .and_then(|()| if newline { o.write_all(b"\n") } else { Ok(()) });
}

/// Flushes stdout and says whether anything written to it was lost (not for a
/// closed pipe, which has ended the process already).
pub fn stdout_error() -> Option<String> {
    if let Err(e) = io::stdout().lock().flush() {
        stdout_failed(e);
    }
    STDOUT_FAILED.get().cloned()
}
