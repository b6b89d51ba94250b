use crate::args::{Global, MountArgs};
use anyhow::{Context, Result};
use cairn_core::Repository;
use cairn_mount::{ErrorSink, MountError, MountOptions, Unmounted};
use std::sync::Arc;
use std::time::Duration;

/// A read through the mount waits for the storage a few seconds at most before it
/// fails with EIO: a program reading a file must not hang for the minute and a
/// half a backup would wait (unless `--retry-for` says otherwise).
const MOUNT_RETRY: cairn_backend::RetryPolicy = cairn_backend::RetryPolicy {
    attempts: 4,
    first_delay: Duration::from_millis(250),
    max_delay: Duration::from_secs(2),
    max_total: None,
};

pub fn run(g: &Global, a: &MountArgs) -> Result<i32> {
    let p = super::progress(g);
    let cache_bytes = super::parse_size(&a.cache_size).context("--cache-size")?;
    let location = super::repo_location(g)?;
    let mut storage = super::storage_options(g)?;
    // `--retry-for` is the user's own bound; else a reader waits seconds, not minutes.
    if g.remote.retry_for.is_none() {
        storage.retry = MOUNT_RETRY;
    }
    // The password is asked once: the mount keeps the key and reopens sessions
    // with it.
    let repo = Repository::open_at(
        &location,
        &storage,
        || crate::ui::password(g).map_err(|e| cairn_core::Error::Invalid(format!("{e:#}"))),
        &p.progress,
    )?;
    super::remember_traffic(&repo);
    let opts = MountOptions {
        snapshot: a.snapshot.clone(),
        allow_other: a.allow_other,
        cache_bytes: usize::try_from(cache_bytes).unwrap_or(usize::MAX),
        session_idle: Duration::from_secs(a.idle_secs.max(1)),
        threads: a.threads.clamp(1, 64),
        xattrs: !a.no_xattrs,
        ..MountOptions::default()
    };
    let sink: ErrorSink = Arc::new(|m: &str| eprintln!("cairn mount: error: {m}"));
    let dir = a.dir.display().to_string();
    let mounted = cairn_mount::mount(repo, &a.dir, &opts, sink).map_err(|e| match e {
        MountError::Engine(e) => anyhow::Error::from(e),
        e @ MountError::Mount { .. } => anyhow::Error::from(e)
            .context("FUSE needs /dev/fuse and fusermount3 (Debian: apt install fuse3)"),
        e => anyhow::Error::from(e),
    })?;
    let what = match mounted.snapshot {
        Some(id) => format!("snapshot {}", id.short()),
        None => "snapshots (hosts/, snapshots/, latest)".to_string(),
    };
    if !g.quiet {
        eprintln!(
            "mounted {what} of {location} at {dir} (read-only); unmount with \
             `fusermount3 -u {dir}` or Ctrl-C"
        );
    }
    // SIGINT and SIGTERM set the token (main installs the handler); an unmount from
    // outside ends the session loop.
    let token = crate::events::cancel_token();
    while !token.is_cancelled() && !mounted.is_finished() {
        std::thread::sleep(Duration::from_millis(100));
    }
    match mounted.unmount()? {
        Unmounted::Clean => {}
        Unmounted::Detached => eprintln!(
            "cairn mount: {dir} was still in use: detached it (programs inside it get errors \
             from now on)"
        ),
    }
    Ok(0)
}
