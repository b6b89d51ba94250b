//! The crash harnesses' tools (maintenance.rs, crash.rs): run a cairn command and
//! kill it, either at a named kill point (`CAIRN_TEST_KILL_AT`, listed in
//! `cairn_core::hooks::POINTS`) or after a random delay, and count per operation
//! what happened, for the summary that scripts/crash-trials.sh adds up.
//!
//! Kill points sit where crash safety is argued (docs/FORMAT.md), so every trial
//! that uses one asserts that the process died by SIGKILL at that very point: a
//! trial cannot pass by dying somewhere else or by finishing first. Random delays
//! stay for the places no one named; how many of them land while the operation
//! still runs depends on the machine's speed and load, so that is counted and
//! printed, never asserted; to keep most of them useful on a busy machine, their
//! scale follows the last run that finished ([`Tally::pace`]).

use crate::util::{Rng, StderrLines};
use std::collections::BTreeMap;
use std::os::unix::process::ExitStatusExt;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

/// A count or seed from the environment (scripts/crash-trials.sh sets them).
pub fn env_u64(var: &str, default: u64) -> u64 {
    match std::env::var(var) {
        Ok(v) => v
            .parse()
            .unwrap_or_else(|_| panic!("{var}={v:?} is not a number")),
        Err(_) => default,
    }
}

/// A kill point and which hit of it kills: `("pack:stored", 2)` dies when the
/// second pack has been stored.
pub type Spec = (&'static str, u64);

/// Every backup trial stores new data: one data pack and one tree pack, the index
/// file listing both, then the snapshot and the index record announcing it.
pub const BACKUP_POINTS: &[Spec] = &[
    ("pack:stored", 1),
    ("pack:stored", 2),
    ("index:written", 1),
    ("snapshot:before-write", 1),
    ("snapshot:written", 1),
    ("snapshot:recorded", 1),
];

/// Whether a backup killed at `spec` (one of [`BACKUP_POINTS`]) has committed: the
/// snapshot object is the commit point, and nothing before it may show.
pub fn backup_committed_at(spec: Spec) -> bool {
    matches!(spec, ("snapshot:written", 1) | ("snapshot:recorded", 1))
}

#[derive(Clone, Debug)]
pub enum Kill {
    /// Armed through `CAIRN_TEST_KILL_AT=<point>:<n>`.
    At(Spec),
    /// SIGKILL from the harness after this long, if the process still runs.
    After(Duration),
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Outcome {
    /// Died by SIGKILL at its kill point (the hook's line on stderr says which).
    DiedAtPoint,
    /// Killed by the harness while it ran.
    KilledMidRun,
    /// Ended successfully before the delay ran out, after this long.
    Finished(Duration),
}

/// Runs `cmd` under `kill` and says how it ended. Fails the test when a kill point
/// was not what ended the process, and when the command failed by itself: an error
/// after earlier crashes is damage, not bad luck.
pub fn run(mut cmd: Command, kill: &Kill, label: &str) -> Outcome {
    cmd.stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::piped());
    match kill {
        Kill::At((point, n)) => {
            let out = cmd
                .env(cairn_core::hooks::KILL_AT_VAR, format!("{point}:{n}"))
                .output()
                .unwrap();
            let err = String::from_utf8_lossy(&out.stderr);
            let said = format!("cairn: test hook: killed at {point} (hit {n})");
            assert!(
                out.status.signal() == Some(libc::SIGKILL) && err.contains(&said),
                "{label}: expected death by SIGKILL at {point}:{n}, but it ended with \
                 {:?}; stderr:\n{err}",
                out.status
            );
            Outcome::DiedAtPoint
        }
        Kill::After(delay) => {
            let start = Instant::now();
            let mut child = cmd.spawn().unwrap();
            // Read on a thread: a full pipe must not stall the child.
            let err = StderrLines::of(&mut child);
            // The delay is the point of the trial, not a wait for anything: poll
            // only to stop early when the command ends first.
            while child.try_wait().unwrap().is_none() && start.elapsed() < *delay {
                std::thread::sleep(Duration::from_millis(2));
            }
            let _ = child.kill();
            let status = child.wait().unwrap();
            let err = err.all();
            if status.signal() == Some(libc::SIGKILL) {
                Outcome::KilledMidRun
            } else {
                assert!(
                    status.success(),
                    "{label}: failed by itself ({status:?}):\n{err}"
                );
                Outcome::Finished(start.elapsed())
            }
        }
    }
}

#[derive(Default)]
struct OpCount {
    trials: u64,
    at_points: u64,
    random: u64,
    random_mid_run: u64,
    failures: u64,
    points: BTreeMap<String, u64>,
    /// How long an uninterrupted run takes, as last seen.
    pace: Duration,
}

/// Per-operation counts of one harness, printed when it ends (also when a trial
/// fails: the failing trial's operation then shows one failure), as lines that
/// scripts/crash-trials.sh adds up:
/// `crash-trials: <harness> op=<op> trials=.. at-points=.. random=.. random-mid-run=.. failures=..`
/// and `crash-trials: <harness> op=<op> points <point>:<n>=<kills> ...`.
pub struct Tally {
    harness: &'static str,
    ops: BTreeMap<&'static str, OpCount>,
    /// The operation of the trial in progress, until it has passed its checks.
    open: Option<&'static str>,
}

impl Tally {
    pub fn new(harness: &'static str) -> Tally {
        Tally {
            harness,
            ops: BTreeMap::new(),
            open: None,
        }
    }

    /// A trial of `op` begins; it counts as failed unless [`Tally::passed`] follows.
    pub fn begin(&mut self, op: &'static str) {
        self.ops.entry(op).or_default().trials += 1;
        self.open = Some(op);
    }

    pub fn passed(&mut self) {
        self.open = None;
    }

    /// How long `op` takes when nothing stops it, from a run outside the trials;
    /// random trials that finish keep it current.
    pub fn pace(&mut self, op: &'static str, took: Duration) {
        self.ops.entry(op).or_default().pace = took;
    }

    /// The kill for the current trial of `op`: two trials in three die at the point
    /// of `reachable` hit least so far (so every point comes round), the third (and
    /// any trial with no reachable point) after a delay drawn from `rng` between
    /// nothing and 1.3 times the pace: from "just started" to "already done".
    pub fn choose(&self, op: &'static str, reachable: &[Spec], rng: &mut Rng) -> Kill {
        let c = &self.ops[op];
        let least = reachable
            .iter()
            .min_by_key(|s| c.points.get(&key(**s)).copied().unwrap_or(0));
        match least {
            Some(s) if !c.trials.is_multiple_of(3) => Kill::At(*s),
            _ => {
                let scale = c.pace.as_micros() as u64 * 13 / 10;
                Kill::After(Duration::from_micros(rng.below(scale + 1)))
            }
        }
    }

    pub fn record(&mut self, op: &'static str, kill: &Kill, outcome: Outcome) {
        let c = self.ops.entry(op).or_default();
        match kill {
            Kill::At(s) => {
                c.at_points += 1;
                *c.points.entry(key(*s)).or_default() += 1;
            }
            Kill::After(_) => {
                c.random += 1;
                match outcome {
                    Outcome::KilledMidRun => c.random_mid_run += 1,
                    Outcome::Finished(took) => c.pace = took,
                    Outcome::DiedAtPoint => {}
                }
            }
        }
    }

    /// Fails unless every one of `points` killed `op` at least once, when there were
    /// enough trials at points for that (one per point, in [`Tally::choose`]'s
    /// order). For points every trial of `op` can reach.
    pub fn assert_all_hit(&self, op: &'static str, points: &[Spec]) {
        let Some(c) = self.ops.get(op) else { return };
        if c.at_points < points.len() as u64 {
            return;
        }
        let missed: Vec<String> = points
            .iter()
            .map(|s| key(*s))
            .filter(|k| !c.points.contains_key(k))
            .collect();
        assert!(
            missed.is_empty(),
            "{}: {op} was never killed at {missed:?} in {} trials at points",
            self.harness,
            c.at_points
        );
    }
}

fn key((point, n): Spec) -> String {
    format!("{point}:{n}")
}

impl Drop for Tally {
    fn drop(&mut self) {
        if let Some(op) = self.open.take()
            && std::thread::panicking()
        {
            self.ops.entry(op).or_default().failures += 1;
        }
        for (op, c) in &self.ops {
            eprintln!(
                "crash-trials: {} op={op} trials={} at-points={} random={} random-mid-run={} failures={}",
                self.harness, c.trials, c.at_points, c.random, c.random_mid_run, c.failures
            );
            let points: Vec<String> = c.points.iter().map(|(k, v)| format!("{k}={v}")).collect();
            eprintln!(
                "crash-trials: {} op={op} points {}",
                self.harness,
                points.join(" ")
            );
        }
    }
}
