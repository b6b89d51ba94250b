//! Named points in the engine where the test suite can kill the process, so that
//! crash tests choose *where* a crash happens instead of guessing *when* (a kill
//! after a fixed delay lands somewhere else on a loaded machine, or after the
//! operation has ended).
//!
//! `CAIRN_TEST_KILL_AT=<point>:<n>`: the n-th time (counting from 1, over all threads
//! of the process) execution reaches `point`, the process writes
//! `cairn: test hook: killed at <point> (hit <n>)` on stderr and sends itself
//! SIGKILL. Not a clean exit: no destructor runs, no lock is removed, nothing is
//! flushed, as in a power cut or the OOM killer. The line on stderr and the signal
//! in the exit status together tell a test that the process died at that point and
//! not somewhere else.
//!
//! The hook exists only in builds with the `test-hooks` feature (the CLI's
//! integration tests enable it through a dev-dependency). In any other build
//! [`point`] is an empty inline function and the variable is ignored, with a
//! notice ([`check_env`]): a release binary cannot be made to kill itself.
//!
//! Every point is listed in [`POINTS`], with the state a kill there leaves. Engine
//! code marks a point with one line, `hooks::point("pack:stored")`; a unit test
//! keeps that list and the calls in the source in step.

use crate::error::Result;
use crate::progress::Progress;

/// The environment variable that arms a kill point.
pub const KILL_AT_VAR: &str = "CAIRN_TEST_KILL_AT";
/// `CAIRN_TEST_PAUSE_AT=<point>:<n>:<dir>`: the n-th time execution reaches
/// `point`, the process creates `<dir>/reached` and waits until `<dir>/go` exists
/// (at most two minutes), so that a test can act at that moment of an operation
/// (a backup committing between prune's plan and its deletions).
pub const PAUSE_AT_VAR: &str = "CAIRN_TEST_PAUSE_AT";

/// A place in the engine where a crash must leave the repository consistent
/// (docs/FORMAT.md, "Write ordering invariants" and "Prune and concurrent writers").
pub struct Point {
    pub name: &'static str,
    /// Where it is, and what the repository holds when the process dies there.
    pub state: &'static str,
}

/// Every kill point. The first part of a name is where it lives: `pack`, `index` and
/// `snapshot` points are shared by every operation that stores packs, index files or
/// snapshots (backup, copy, prune's repacking, repair); the others belong to one
/// operation.
pub const POINTS: &[Point] = &[
    Point {
        name: "lock:release",
        state: "a command is about to remove its repository lock (its refresher has \
                stopped); a kill here leaves the lock to go stale",
    },
    Point {
        name: "image-fs:verify",
        state: "`restore --image-fs --verify` has written a file's content and is \
                about to read it back; its mode and times are not set yet, and its \
                unfinished-restore mark is still there",
    },
    Point {
        name: "restore:inode-flags",
        state: "a restore has written every entry and its metadata and is setting \
                the inode flags (chattr) of those that have some, one at a time: some \
                are set, the rest not; its unfinished-restore mark is still there",
    },
    Point {
        name: "backup:link-open",
        state: "a backup is about to open the first name of a large hard-linked file, \
                whose other names take what is read of it; nothing of the file is \
                stored yet",
    },
    Point {
        name: "backup:link-open-small",
        state: "a backup's worker is about to open the first name of a small \
                hard-linked file, whose other names take what is read of it; \
                nothing of the file is stored yet",
    },
    Point {
        name: "backup:locked",
        state: "a backup holds its lock and has not read the index (nor asked a \
                server for its dedup plan); it has stored nothing",
    },
    Point {
        name: "image:planned",
        state: "an image backup has looked at its source (size, times) and opened \
                it; nothing of it is read or stored yet",
    },
    Point {
        name: "pack:stored",
        state: "an upload thread's put of a pack returned; the pack is in no index \
                file yet (an unindexed pack: prune's orphan)",
    },
    Point {
        name: "index:written",
        state: "an index file is stored (packs' entries, a snapshot record, prune's \
                replacement or rescue, repair's rebuild); what follows it is not",
    },
    Point {
        name: "snapshot:before-write",
        state: "every pack and index file a snapshot needs is stored and its writer's \
                lock was checked fresh; the snapshot object is not written (backup, \
                copy)",
    },
    Point {
        name: "snapshot:written",
        state: "the snapshot object is stored (the commit point); the index record \
                that announces it to check is not",
    },
    Point {
        name: "snapshot:recorded",
        state: "the index record announcing the committed snapshot is stored (the \
                backup's last write)",
    },
    Point {
        name: "prune:repacked",
        state: "prune copied the still-needed blobs of the packs it repacks into new, \
                indexed packs; the old index files still list the old packs too",
    },
    Point {
        name: "prune:index-replaced",
        state: "prune's replacement index files are stored, the last one superseding \
                every old file; no pending-deletion record is written",
    },
    Point {
        name: "prune:pending-record",
        state: "one pending-deletion record is stored; the retired packs of the records \
                not yet written are unindexed and undeleted",
    },
    Point {
        name: "prune:pending-written",
        state: "every pending-deletion record naming the retired and unindexed packs \
                is stored; the superseded index files are not deleted",
    },
    Point {
        name: "prune:superseded-deleted",
        state: "prune deleted one superseded index file; others may remain",
    },
    Point {
        name: "prune:pack-deleted",
        state: "prune deleted one pack of a pending record whose locks are gone; the \
                record's other packs and the record itself remain",
    },
    Point {
        name: "copy:before-file",
        state: "a copy is about to translate one file's content into the \
                destination: mid-snapshot, with earlier files' blobs queued or stored",
    },
    Point {
        name: "copy:before-snapshot",
        state: "a copy stored one snapshot's data and index and is about to look for \
                a copy another run made meanwhile, then write the snapshot",
    },
    Point {
        name: "copy:checked",
        state: "a copy holds its commit turn and found no copy of this snapshot in \
                the destination; it is about to write its own",
    },
    Point {
        name: "copy:snapshot-committed",
        state: "a copy wrote one snapshot (and its record) to the destination; the \
                next snapshot has not started",
    },
    Point {
        name: "key:stored",
        state: "a new key file is stored (`key add`, `key passwd`); for `key passwd` \
                the old key file is not deleted yet, so both passwords open",
    },
    Point {
        name: "key:before-remove",
        state: "`key remove` checked that the key may go; the key file is not \
                deleted",
    },
    Point {
        name: "repair:index-written",
        state: "`repair index` stored its rebuilt index, the last file superseding \
                every old one; the old files and pending records are not deleted",
    },
    Point {
        name: "repair:old-index-deleted",
        state: "`repair index` deleted one superseded index file; others may remain",
    },
];

/// Marks a kill point (see the module documentation). Does nothing unless the
/// `test-hooks` feature is on and `CAIRN_TEST_KILL_AT` names this point.
#[cfg(feature = "test-hooks")]
pub fn point(name: &'static str) {
    armed::reached(name);
}

/// Marks a kill point. Without the `test-hooks` feature: nothing at all.
#[cfg(not(feature = "test-hooks"))]
#[inline(always)]
pub fn point(_name: &'static str) {}

/// Checks `CAIRN_TEST_KILL_AT` when storage is opened (before any point can be
/// reached): with the feature, a malformed value or an unknown point is an error,
/// so a misspelt test fails instead of running to the end unkilled; without it, a
/// set variable gets a notice that it is ignored.
#[cfg(feature = "test-hooks")]
pub fn check_env(_: &Progress) -> Result<()> {
    match std::env::var(KILL_AT_VAR) {
        Ok(v) if !v.is_empty() => parse(&v)
            .map(|_| ())
            .map_err(|e| crate::Error::Invalid(format!("{KILL_AT_VAR}: {e}"))),
        _ => Ok(()),
    }
}

#[cfg(not(feature = "test-hooks"))]
pub fn check_env(progress: &Progress) -> Result<()> {
    // Once per process: a command may open storage more than once.
    static TOLD: std::sync::Once = std::sync::Once::new();
    if std::env::var_os(KILL_AT_VAR).is_some_and(|v| !v.is_empty()) {
        TOLD.call_once(|| {
            progress.notice(format!(
                "{KILL_AT_VAR} is ignored: kill points exist only in test builds of cairn"
            ));
        });
    }
    Ok(())
}

/// `<point>:<n>` -> the point's name and n (at least 1).
#[cfg_attr(not(feature = "test-hooks"), allow(dead_code))]
fn parse(spec: &str) -> std::result::Result<(&'static str, u64), String> {
    let (name, n) = spec
        .rsplit_once(':')
        .ok_or_else(|| format!("{spec:?} is not <point>:<n>"))?;
    let n: u64 = n
        .parse()
        .ok()
        .filter(|n| *n >= 1)
        .ok_or_else(|| format!("{n:?} is not a count of at least 1"))?;
    let point = POINTS
        .iter()
        .find(|p| p.name == name)
        .ok_or_else(|| format!("no kill point is called {name:?}"))?;
    Ok((point.name, n))
}

#[cfg(feature = "test-hooks")]
mod armed {
    use std::sync::OnceLock;
    use std::sync::atomic::{AtomicU64, Ordering};

    struct KillAt {
        point: &'static str,
        n: u64,
        hits: AtomicU64,
    }

    /// Read once: the variable does not change while the process runs.
    fn kill_at() -> Option<&'static KillAt> {
        static ARMED: OnceLock<Option<KillAt>> = OnceLock::new();
        ARMED
            .get_or_init(|| {
                let v = std::env::var(super::KILL_AT_VAR).ok()?;
                let (point, n) = super::parse(&v).ok()?;
                Some(KillAt {
                    point,
                    n,
                    hits: AtomicU64::new(0),
                })
            })
            .as_ref()
    }

    struct PauseAt {
        point: String,
        n: u64,
        dir: std::path::PathBuf,
        hits: AtomicU64,
    }

    fn pause_at() -> Option<&'static PauseAt> {
        static ARMED: OnceLock<Option<PauseAt>> = OnceLock::new();
        ARMED
            .get_or_init(|| {
                let v = std::env::var(super::PAUSE_AT_VAR).ok()?;
                let (spec, dir) = v.rsplit_once(':')?;
                let (point, n) = super::parse(spec).ok()?;
                Some(PauseAt {
                    point: point.to_string(),
                    n,
                    dir: dir.into(),
                    hits: AtomicU64::new(0),
                })
            })
            .as_ref()
    }

    fn pause(name: &'static str) {
        let Some(p) = pause_at() else { return };
        if p.point != name || p.hits.fetch_add(1, Ordering::SeqCst) + 1 != p.n {
            return;
        }
        let _ = std::fs::write(p.dir.join("reached"), name);
        let until = std::time::Instant::now() + std::time::Duration::from_secs(120);
        while !p.dir.join("go").exists() && std::time::Instant::now() < until {
            std::thread::sleep(std::time::Duration::from_millis(10));
        }
    }

    pub(super) fn reached(name: &'static str) {
        pause(name);
        let Some(k) = kill_at() else { return };
        if k.point != name || k.hits.fetch_add(1, Ordering::SeqCst) + 1 != k.n {
            return;
        }
        eprintln!("cairn: test hook: killed at {name} (hit {})", k.n);
        use nix::sys::signal::{Signal, kill};
        let _ = kill(nix::unistd::Pid::this(), Signal::SIGKILL);
        // SIGKILL cannot be caught or ignored; should sending it fail, dying by
        // another signal still stops here and shows in the test as the wrong death.
        std::process::abort();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn specs_name_a_known_point_and_a_count() {
        assert_eq!(parse("pack:stored:3"), Ok(("pack:stored", 3)));
        assert_eq!(
            parse("snapshot:before-write:1"),
            Ok(("snapshot:before-write", 1))
        );
        assert!(parse("pack:stored").is_err(), "no count");
        assert!(parse("pack:stored:0").is_err(), "hits count from 1");
        assert!(parse("pack:stord:1").is_err(), "misspelt");
        assert!(parse("").is_err());
    }

    /// [`POINTS`] is the one list of kill points: every name in it is marked by
    /// exactly one `point("…")` call in the engine, and every call names a listed
    /// point. A textual check (like `tests::layers`), so that a point added without
    /// its documentation, or one whose call was deleted, fails here.
    #[test]
    fn every_point_is_listed_and_marked_once() {
        let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
        let mut calls: Vec<String> = Vec::new();
        let mut stack = vec![root];
        while let Some(dir) = stack.pop() {
            for e in std::fs::read_dir(&dir).unwrap() {
                let p = e.unwrap().path();
                if p.is_dir() {
                    stack.push(p);
                    continue;
                }
                if p.file_name().is_some_and(|n| n == "hooks.rs") {
                    continue;
                }
                let text = std::fs::read_to_string(&p).unwrap();
                let code = text.split("#[cfg(test)]").next().unwrap_or("");
                for part in code.split("hooks::point(\"").skip(1) {
                    calls.push(part.split('"').next().unwrap().to_string());
                }
            }
        }
        calls.sort();
        let mut listed: Vec<String> = POINTS.iter().map(|p| p.name.to_string()).collect();
        listed.sort();
        assert_eq!(
            calls, listed,
            "hooks::POINTS and the engine's point() calls"
        );
    }
}
