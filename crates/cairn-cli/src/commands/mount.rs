use crate::args::{Global, MountArgs};
use anyhow::{Context, Result};
use cairn_core::Repository;
use cairn_mount::{ErrorSink, MountError, MountOptions, Unmounted};
use std::sync::Arc;
use std::time::Duration;

/// A read through the mount waits for the storage a few seconds at most before it
/// fails with EIO: a program reading a file must not hang for the minute and a
/// half a backup would wait (unless `--retry-for` says otherwise). Retries stop
/// after [`MOUNT_SILENCE`] in all, and a storage that takes the connection but
/// says nothing is given up on after as long (QA: a stopped server held a read
/// for 135 s, 120 s of it one silent request).
const MOUNT_RETRY: cairn_backend::RetryPolicy = cairn_backend::RetryPolicy {
    attempts: 4,
    first_delay: Duration::from_millis(250),
    max_delay: Duration::from_secs(2),
    max_total: Some(MOUNT_SILENCE),
    patience: MOUNT_SILENCE,
    deadline: Some(MOUNT_SILENCE),
};

/// See [`MOUNT_RETRY`]. A mount asks for no job slot, the one request a server
/// holds for seconds before it answers.
const MOUNT_SILENCE: Duration = Duration::from_secs(10);

/// The content and tree caches: 64 MiB each by default; under `--memory-limit`, a
/// third each of what the index leaves (the rest is the kernel's requests,
/// read-ahead and the inodes the kernel holds), and an explicit `--cache-size`
/// that does not fit is refused. Also the inodes kept: a sixth of what the index
/// leaves unless `--max-inodes` says.
fn cache_sizes(
    repo: &Repository,
    cache_size: Option<u64>,
    max_inodes: Option<usize>,
    progress: &cairn_core::progress::Progress,
) -> Result<(u64, u64, usize)> {
    const DEFAULT: u64 = 64 << 20;
    let Some(plan) = repo.memory_plan(cairn_core::repo::memory::IndexUse::ForReads)? else {
        return Ok((
            cache_size.unwrap_or(DEFAULT),
            DEFAULT,
            max_inodes.unwrap_or(cairn_mount::DEFAULT_MAX_INODES),
        ));
    };
    let inodes = max_inodes.unwrap_or_else(|| {
        let bytes = plan.share(
            6,
            16_384 * cairn_mount::INODE_BYTES,
            cairn_mount::DEFAULT_MAX_INODES as u64 * cairn_mount::INODE_BYTES,
        );
        usize::try_from(bytes / cairn_mount::INODE_BYTES).unwrap_or(usize::MAX)
    });
    let trees = plan.share(3, 4 << 20, DEFAULT);
    let content = match cache_size {
        Some(c) if c + trees > plan.work_bytes => anyhow::bail!(
            "--cache-size {} does not fit in --memory-limit {}: the index takes about {} and the tree cache {}; at most {} is left for content",
            cairn_core::units::bytes(c, 1),
            cairn_core::units::bytes(plan.limit_bytes, 1),
            cairn_core::units::bytes(plan.index_bytes, 1),
            cairn_core::units::bytes(trees, 1),
            cairn_core::units::bytes(plan.work_bytes.saturating_sub(trees), 1)
        ),
        Some(c) => c,
        None => plan.share(3, 4 << 20, DEFAULT),
    };
    progress.notice(format!(
        "{}; the mount caches {} of file content and {} of directories, and keeps {} inodes",
        plan.describe(),
        cairn_core::units::bytes(content, 1),
        cairn_core::units::bytes(trees, 1),
        inodes
    ));
    Ok((content, trees, inodes))
}

/// The mount point must be a directory that is there: said before the password is
/// asked for, and not blamed on FUSE's installation. A FUSE mount whose process
/// ended (killed) answers "transport endpoint is not connected" until unmounted.
fn check_mount_point(dir: &std::path::Path) -> Result<()> {
    let d = dir.display();
    match std::fs::metadata(dir) {
        Ok(m) if m.is_dir() => {
            // A second mount on a live one hides it (QA r23: stacked, unsaid).
            if top_mount(dir).is_some_and(|(kind, source)| {
                source == "cairn" && (kind == "fuse" || kind.starts_with("fuse."))
            }) {
                anyhow::bail!(
                    "{d} holds a running cairn mount already: unmount it first \
                     (`fusermount3 -u {d}`) or choose another directory"
                );
            }
            Ok(())
        }
        Ok(_) => anyhow::bail!("the mount point {d} is not a directory"),
        Err(e) if e.raw_os_error() == Some(libc::ENOTCONN) => anyhow::bail!(
            "{d} is a FUSE mount whose process ended: unmount it first (`fusermount3 -u {d}`)"
        ),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
            anyhow::bail!("the mount point {d} does not exist (make an empty directory)")
        }
        Err(e) => Err(anyhow::Error::from(e).context(format!("the mount point {d}"))),
    }
}

/// The file system type and source of the mount on top at `dir`
/// (`/proc/self/mountinfo`), if `dir` is a mount point. A cairn mount is
/// `fuse` (or `fuse.cairn`) from `cairn`.
fn top_mount(dir: &std::path::Path) -> Option<(String, String)> {
    use std::os::unix::ffi::OsStrExt;
    let at = std::fs::canonicalize(dir).ok()?;
    let table = std::fs::read_to_string("/proc/self/mountinfo").ok()?;
    // Field 5 is the mount point, octal-escaped (`\040` for a space); the type
    // and the source follow the " - " separator. The last line for a point is
    // the top mount.
    table
        .lines()
        .filter_map(|line| {
            let (before, after) = line.split_once(" - ")?;
            let point = before.split(' ').nth(4)?;
            let mut rest = after.split(' ');
            Some((unescape_mount_field(point), rest.next()?, rest.next()?))
        })
        .rfind(|(point, _, _)| point.as_slice() == at.as_os_str().as_bytes())
        .map(|(_, kind, source)| (kind.to_string(), source.to_string()))
}

/// A mountinfo field with its `\NNN` octal escapes undone.
fn unescape_mount_field(field: &str) -> Vec<u8> {
    let b = field.as_bytes();
    let mut out = Vec::with_capacity(b.len());
    let mut i = 0;
    while i < b.len() {
        let octal = b
            .get(i + 1..i + 4)
            .filter(|d| b[i] == b'\\' && d.iter().all(|c| (b'0'..=b'7').contains(c)));
        match octal {
            Some(d) => {
                out.push(
                    d.iter()
                        .fold(0u8, |n, c| n.wrapping_mul(8).wrapping_add(c - b'0')),
                );
                i += 4;
            }
            None => {
                out.push(b[i]);
                i += 1;
            }
        }
    }
    out
}

/// Whether `/dev/fuse` and `fusermount3` (on `PATH`) are there.
fn fuse_installed() -> bool {
    std::path::Path::new("/dev/fuse").exists()
        && std::env::var_os("PATH")
            .is_some_and(|p| std::env::split_paths(&p).any(|d| d.join("fusermount3").is_file()))
}

pub fn run(g: &Global, a: &MountArgs) -> Result<i32> {
    let p = super::progress(g);
    let cache_size = a
        .cache_size
        .as_deref()
        .map(super::parse_size)
        .transpose()
        .context("--cache-size")?;
    if a.max_inodes
        .is_some_and(|n| n < cairn_mount::MIN_MAX_INODES)
    {
        return Err(super::bad_argument(format!(
            "--max-inodes must be at least {} (a directory listed at once needs its entries)",
            cairn_mount::MIN_MAX_INODES
        )));
    }
    check_mount_point(&a.dir)?;
    let location = super::repo_location(g)?;
    let mut storage = super::storage_options(g)?;
    // `--retry-for` is the user's own bound; else a reader waits seconds, not minutes.
    if g.remote.retry_for.is_none() {
        storage.retry = MOUNT_RETRY;
        storage.s3.silence = Some(MOUNT_SILENCE);
        storage.server.silence = Some(MOUNT_SILENCE);
    }
    // The password is asked once: the mount keeps the key and reopens sessions
    // with it.
    let repo = Repository::open_at(
        &location,
        &storage,
        || crate::ui::password(g).map_err(|e| cairn_core::Error::Invalid(crate::one_line(&e))),
        &p.progress,
    )?;
    super::remember_traffic(&repo);
    // A mount point among the repository's own files would hide them from every
    // other command (QA r16: a prune then saw no snapshot and retired every pack)
    // and have the mount read through itself.
    if let Some(repo_dir) = cairn_core::restore::inside_repository(&repo, &a.dir) {
        anyhow::bail!(
            "{} is inside the repository being mounted{repo_dir}: the mount would hide \
             the repository's own files; mount it somewhere outside the repository",
            a.dir.display()
        );
    }
    let mut repo = repo;
    repo.set_memory_limit(super::memory_limit(g, &repo)?);
    let (cache_bytes, tree_cache_bytes, max_inodes) =
        cache_sizes(&repo, cache_size, a.max_inodes, &p.progress)?;
    let opts = MountOptions {
        snapshot: a.snapshot.clone(),
        allow_other: a.allow_other,
        cache_bytes: usize::try_from(cache_bytes).unwrap_or(usize::MAX),
        tree_cache_bytes: usize::try_from(tree_cache_bytes).unwrap_or(usize::MAX),
        session_idle: Duration::from_secs(a.idle_secs.max(1)),
        listing_refresh: Duration::from_secs(a.refresh_secs.max(1)),
        threads: a.fuse_threads.clamp(1, 64),
        xattrs: !a.no_xattrs,
        max_inodes,
        ..MountOptions::default()
    };
    // With `--json`, every line on standard error is an event (QA r35).
    let json = g.json;
    let sink: ErrorSink = Arc::new(move |m: &str| {
        if json {
            eprintln!("{}", serde_json::json!({"type": "error", "message": m}));
        } else {
            eprintln!("cairn mount: error: {m}");
        }
    });
    let dir = a.dir.display().to_string();
    let mounted = cairn_mount::mount(repo, &a.dir, &opts, sink).map_err(|e| match e {
        MountError::Engine(e) => anyhow::Error::from(e),
        e @ MountError::Mount { .. } if !fuse_installed() => anyhow::Error::from(e)
            .context("FUSE needs /dev/fuse and fusermount3 (Debian: apt install fuse3)"),
        e => anyhow::Error::from(e),
    })?;
    for w in &mounted.warnings {
        p.progress.warning_msg(w.clone());
    }
    let what = match mounted.snapshot {
        Some(id) => format!("snapshot {}", id.short()),
        None => "snapshots (hosts/, snapshots/, latest)".to_string(),
    };
    let message = format!(
        "mounted {what} of {location} at {dir} (read-only); unmount with \
         `fusermount3 -u {dir}` or Ctrl-C"
    );
    if g.json {
        eprintln!(
            "{}",
            serde_json::json!({"type": "mounted", "dir": dir, "message": message})
        );
    } else if !g.quiet {
        eprintln!("{message}");
    }
    // SIGINT and SIGTERM set the token (main installs the handler); an unmount from
    // outside ends the session loop.
    let token = crate::events::cancel_token();
    while !token.is_cancelled() && !mounted.is_finished() {
        std::thread::sleep(Duration::from_millis(100));
    }
    let (inodes_now, inodes_peak) = mounted.inodes();
    let how = mounted.unmount()?;
    if let Unmounted::Detached = how {
        crate::ui::warn(format!(
            "{dir} was still in use: detached it (programs inside it get errors from now on)"
        ));
    }
    if g.json {
        println!(
            "{}",
            serde_json::json!({
                "dir": dir,
                "detached": matches!(how, Unmounted::Detached),
                "inodes_at_end": inodes_now,
                "inodes_peak": inodes_peak,
                "max_inodes": max_inodes,
            })
        );
    }
    Ok(0)
}
