//! The three ways the CLI shows an operation's events ([`cairn_core::progress`]):
//! a progress bar on a terminal, one JSON object per line on stderr with `--json`
//! (like restic's status messages; only warnings with `--quiet` too), and plain
//! lines otherwise (scripts, `--quiet`): warnings always, notices unless quiet.

use crate::ui;
use cairn_core::progress::{CancelToken, Event, EventSink, Progress, Status, Ticker};
use indicatif::{ProgressBar, ProgressDrawTarget, ProgressStyle};
use std::io::Write;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, OnceLock};
use std::time::Duration;

/// How events are shown.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Mode {
    /// A progress bar on stderr (a terminal, neither --json nor --quiet).
    Bar,
    /// JSON lines on stderr (--json).
    Json,
    /// Warnings only, as JSON lines on stderr (--json --quiet: a script that
    /// wants the result and nothing of the way there, as restic's `--json -q`).
    JsonQuiet,
    /// Warnings and notices as text lines on stderr.
    Plain,
    /// Warnings only (--quiet).
    Quiet,
}

impl Mode {
    pub fn of(g: &crate::args::Global) -> Mode {
        if g.json && g.quiet {
            Mode::JsonQuiet
        } else if g.json {
            Mode::Json
        } else if g.quiet {
            Mode::Quiet
        } else if ui::interactive(g) {
            Mode::Bar
        } else {
            Mode::Plain
        }
    }
}

/// The process's cancellation token: SIGINT and SIGTERM set it (see `main`).
pub fn cancel_token() -> &'static CancelToken {
    static TOKEN: OnceLock<CancelToken> = OnceLock::new();
    TOKEN.get_or_init(CancelToken::new)
}

/// Shows events in one of the [`Mode`]s.
pub struct CliSink {
    mode: Mode,
    bar: Option<ProgressBar>,
    /// Serialises JSON lines from several engine threads.
    out: Mutex<()>,
    /// The bar switched to the upload (after everything was read).
    uploading: AtomicBool,
    /// Files listed are what a dry run would do: "would restore", "would
    /// update" (QA r29: "updated" beside "would delete").
    would: AtomicBool,
}

impl CliSink {
    /// A line of the command's output on stdout, as it happens (above the bar).
    fn stdout_line(&self, text: &str) {
        let print = || {
            let mut out = std::io::stdout().lock();
            let _ = writeln!(out, "{text}");
            let _ = out.flush();
        };
        match &self.bar {
            Some(b) => b.suspend(print),
            None => {
                let _g = self.out.lock().unwrap_or_else(|e| e.into_inner());
                print()
            }
        }
    }

    fn new(mode: Mode) -> CliSink {
        let bar = (mode == Mode::Bar).then(|| {
            let b = ProgressBar::with_draw_target(None, ProgressDrawTarget::stderr_with_hz(8));
            b.set_style(
                ProgressStyle::with_template(
                    "{elapsed_precise} {bar:30} {bytes}/{total_bytes} {bytes_per_sec} {prefix} {msg}",
                )
                .unwrap_or_else(|_| ProgressStyle::default_bar()),
            );
            b
        });
        CliSink {
            mode,
            bar,
            out: Mutex::new(()),
            uploading: AtomicBool::new(false),
            would: AtomicBool::new(false),
        }
    }

    fn line(&self, text: &str) {
        match &self.bar {
            Some(b) => b.suspend(|| eprintln!("{text}")),
            None => {
                let _g = self.out.lock().unwrap_or_else(|e| e.into_inner());
                eprintln!("{text}");
            }
        }
    }

    fn draw(&self, b: &ProgressBar, s: &Status) {
        // Everything is read but packs are still on their way (a throttled or slow
        // link): the bar follows the upload, so it does not sit at 100% with an ETA
        // of 0s while the backup goes on for minutes.
        if s.uploading() {
            // Packs are counted when stored whole, so no rate or ETA is shown for
            // them: the bar and what is still to send say where the upload is.
            if !self.uploading.swap(true, Ordering::Relaxed)
                && let Ok(style) = ProgressStyle::with_template("{elapsed_precise} {bar:30} {msg}")
            {
                b.set_style(style);
            }
            b.set_length(s.upload_queued_bytes);
            b.set_position(s.upload_done_bytes);
            b.set_message(format!(
                "everything read; uploading: {} of {} stored",
                ui::bytes(s.upload_done_bytes),
                ui::bytes(s.upload_queued_bytes)
            ));
            return;
        }
        match s.bytes_total {
            Some(t) => b.set_length(t),
            None => b.unset_length(),
        }
        b.set_position(s.bytes_done);
        // The engine's estimate, which follows a slow upload (the bar's own would
        // follow the read alone).
        b.set_prefix(match s.eta_secs {
            Some(e) => format!("ETA {}", eta(e)),
            None => String::new(),
        });
        b.set_message(status_message(s));
    }
    fn finish(&self) {
        if let Some(b) = &self.bar {
            b.finish_and_clear();
        }
    }
}

/// The bar's message while reading: files and entries done, and what waits for the
/// upload. A slow or throttled link holds the read back in steps (a bundle of
/// files at a time, once the upload has room), so the counters stand still for
/// seconds; the bytes waiting say why.
fn status_message(s: &Status) -> String {
    let mut msg = if s.files_done > 0 {
        format!(
            "{}, {}",
            ui::count(s.files_done, "file"),
            ui::count(s.entries_done, "entry")
        )
    } else {
        ui::count(s.entries_done, "entry")
    };
    let waiting = s.upload_queued_bytes.saturating_sub(s.upload_done_bytes);
    if waiting > 0 {
        msg.push_str(&format!(", {} waiting to upload", ui::bytes(waiting)));
    }
    if let Some(c) = &s.current {
        msg.push(' ');
        msg.push_str(&tail(&ui::printable(c), 40));
    }
    msg
}

/// "45s", "3m 05s", "2h 10m".
fn eta(secs: f64) -> String {
    let s = secs.max(0.0).round() as u64;
    match s {
        0..60 => format!("{s}s"),
        60..3600 => format!("{}m {:02}s", s / 60, s % 60),
        _ => format!("{}h {:02}m", s / 3600, s % 3600 / 60),
    }
}

/// The last `max` characters of a path, for a one-line display.
fn tail(name: &str, max: usize) -> String {
    let n = name.chars().count();
    if n <= max {
        return name.to_string();
    }
    let t: String = name.chars().skip(n - (max - 1)).collect();
    format!("…{t}")
}

impl EventSink for CliSink {
    fn event(&self, event: &Event) {
        match self.mode {
            // A committed copy is part of the result, not of the way there: a run
            // killed later has said it.
            // So is a file listed because --verbose asked for it.
            Mode::JsonQuiet
                if !matches!(
                    event,
                    Event::Warning(_) | Event::SnapshotCopied { .. } | Event::File { .. }
                ) => {}
            Mode::Json | Mode::JsonQuiet => {
                if let Ok(line) = serde_json::to_string(event) {
                    let _g = self.out.lock().unwrap_or_else(|e| e.into_inner());
                    let mut err = std::io::stderr().lock();
                    let _ = writeln!(err, "{line}");
                }
            }
            Mode::Bar | Mode::Plain | Mode::Quiet => match event {
                // Warnings go to stderr even with --quiet: they mean data was left out.
                // They name files of the source or the snapshot: written out
                // (`ui::printable`).
                Event::Warning(w) => {
                    let line = match &w.path {
                        Some(p) => format!("warning: {p}: {}", w.message),
                        None => format!("warning: {}", w.message),
                    };
                    self.line(&ui::printable(&line));
                }
                Event::Notice { message } if self.mode != Mode::Quiet => self.line(message),
                // On standard output, where the report goes, when it happens.
                Event::SnapshotCopied { source, target } if self.mode != Mode::Quiet => {
                    self.stdout_line(&format!(
                        "copied snapshot {} as {}",
                        source.get(..8).unwrap_or(source),
                        target.get(..8).unwrap_or(target)
                    ));
                }
                // `backup --verbose`, as restic's -vv: "new       /path".
                Event::File { action, path, .. } => {
                    let line = match (self.would.load(Ordering::Relaxed), action.name()) {
                        (true, "restored") => format!("would restore {}", ui::printable(path)),
                        (true, "updated") => format!("would update  {}", ui::printable(path)),
                        (true, "deleted") => format!("would delete  {}", ui::printable(path)),
                        (_, name) => format!("{name:<10}{}", ui::printable(path)),
                    };
                    self.stdout_line(&line);
                }
                Event::Status(s) => {
                    if let Some(b) = &self.bar {
                        self.draw(b, s);
                    }
                }
                _ => {}
            },
        }
    }
}

/// An operation's progress for the CLI: the sink for the mode, the process's
/// cancellation token, and a ticker sampling the counters while it lives.
pub struct CliProgress {
    pub progress: Progress,
    sink: Arc<CliSink>,
    ticker: Option<Ticker>,
}

impl CliProgress {
    pub fn new(g: &crate::args::Global) -> CliProgress {
        Self::with_mode(Mode::of(g))
    }

    /// [`CliProgress::new`], or for a command that lists as it goes (`backup
    /// -v`, `restore -v`: `listing`) no bar on a terminal, where each line
    /// would clear and redraw it (a million files, two million redraws); the
    /// lines are the progress.
    pub fn listing(g: &crate::args::Global, listing: bool) -> CliProgress {
        Self::with_mode(match Mode::of(g) {
            Mode::Bar if listing => Mode::Plain,
            m => m,
        })
    }

    fn with_mode(mode: Mode) -> CliProgress {
        let sink = Arc::new(CliSink::new(mode));
        let progress = Progress::new(sink.clone(), cancel_token().clone());
        CliProgress {
            progress,
            sink,
            ticker: None,
        }
    }

    /// Files listed are what a dry run would do (`restore --dry-run -v`).
    pub fn would(&self) {
        self.sink.would.store(true, Ordering::Relaxed);
    }

    /// Starts sampling counters (a bar redraws 8 times a second; JSON lines once
    /// a second). Call it when the long part of the operation begins.
    pub fn start(&mut self) {
        let every = match self.sink.mode {
            Mode::Bar => Duration::from_millis(125),
            Mode::Json => Duration::from_secs(1),
            Mode::Plain | Mode::Quiet | Mode::JsonQuiet => return,
        };
        if self.ticker.is_none() {
            self.ticker = Some(self.progress.ticker(every));
        }
    }

    /// Stops the ticker (one last sample), ends the phase and clears the bar.
    pub fn finish(&mut self) {
        self.ticker = None;
        self.progress.finish();
        self.sink.finish();
    }
}

impl Drop for CliProgress {
    fn drop(&mut self) {
        self.finish();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The counters say files and entries in words, and a read held back by the
    /// upload says how much waits for it.
    #[test]
    fn the_status_line_counts_files_and_says_what_waits_for_the_upload() {
        let mut s = Status {
            entries_done: 1,
            ..Default::default()
        };
        assert_eq!(status_message(&s), "1 entry");
        s.files_done = 256;
        s.entries_done = 257;
        assert_eq!(status_message(&s), "256 files, 257 entries");
        s.upload_queued_bytes = 48 << 20;
        s.upload_done_bytes = 16 << 20;
        assert_eq!(
            status_message(&s),
            "256 files, 257 entries, 32.00 MiB waiting to upload"
        );
        s.upload_done_bytes = 48 << 20;
        assert_eq!(status_message(&s), "256 files, 257 entries");
        assert_eq!(
            [eta(0.2), eta(59.4), eta(185.0), eta(7800.0)],
            ["0s", "59s", "3m 05s", "2h 10m"]
        );
    }
}
