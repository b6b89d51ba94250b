use crate::args::{Global, InitArgs};
use anyhow::{Context, Result, bail};
use cairn_core::progress::Progress;
use cairn_core::repo::info::RepositoryInfo;
use cairn_core::{InitOptions, Repository};
use cairn_format::config::{Compression, IndexPlacement};

pub fn parse_block_size(s: &str) -> Result<u32> {
    let t = s.trim().to_ascii_uppercase();
    let t = t.trim_end_matches("IB").trim_end_matches('B');
    let n: u32 = match t.strip_suffix('K') {
        Some(k) => k.parse::<u32>().map(|v| v * 1024),
        None => t.parse::<u32>(),
    }
    .map_err(|_| {
        super::bad_argument(format!(
            "invalid block size {s:?} (use 4K, 8K, 16K, 32K or 64K)"
        ))
    })?;
    if !cairn_format::consts::BLOCK_SIZES.contains(&n) {
        return Err(super::bad_argument(format!(
            "invalid block size {s:?} (use 4K, 8K, 16K, 32K or 64K)"
        )));
    }
    Ok(n)
}

pub fn init_repo(g: &Global, opts: &InitOptions, progress: &Progress) -> Result<Repository> {
    let location = super::repo_location(g)?;
    // A server serves repositories made on its storage and never makes one: the
    // attempt ended in "datastore X is not served ... an admin's `cairn init`",
    // telling the user to do what they had just done (QA r19).
    if matches!(
        cairn_core::repo::storage::Location::parse(&location),
        Ok(cairn_core::repo::storage::Location::Server(_))
    ) {
        bail!(
            "cairn init makes a repository on storage, not through a cairn server: run \
             `cairn init --repo PATH` on the server with the datastore's path or S3 location \
             (one served and not yet made is served within 15 s of it)"
        );
    }
    let password = if opts.encryption {
        Some(crate::ui::repo_source(g).new_password()?)
    } else {
        None
    };
    let repo = Repository::init_at(
        &location,
        &super::storage_options(g)?,
        password.as_deref(),
        opts,
        progress,
    )?;
    Ok(repo)
}

pub fn describe(g: &Global, repo: &Repository) -> Result<()> {
    let info = RepositoryInfo::of(repo);
    if g.json {
        return super::print_json(&info);
    }
    if g.quiet {
        return Ok(());
    }
    println!(
        "created cairn repository {} at {}",
        info.id.get(..10).unwrap_or(&info.id),
        info.repository
    );
    println!(
        "  block size   {} KiB average (chunks {}-{} KiB)",
        info.block_size / 1024,
        info.chunk_min / 1024,
        info.chunk_max / 1024
    );
    println!("  compression  {}", info.compression);
    println!("  encryption   {}", info.encryption);
    println!("  index        {}", info.index_placement);
    if info.encryption != "none" {
        println!("keep the password safe: without it the data cannot be read");
    }
    Ok(())
}

pub fn run(g: &Global, a: &InitArgs) -> Result<i32> {
    if a.index_path.is_some()
        && a.index_placement.parse::<IndexPlacement>().ok() == Some(IndexPlacement::Ram)
    {
        anyhow::bail!(
            "--index-path is where the index lives on local disk: it goes with \
             --index-placement ssd (a RAM index has no directory)"
        );
    }
    let opts = InitOptions {
        block_size: parse_block_size(a.block_size.as_deref().unwrap_or("16K"))?,
        compression: a
            .compression
            .parse::<Compression>()
            .map_err(super::bad_argument)?,
        encryption: !a.no_encryption,
        index_placement: a
            .index_placement
            .parse::<IndexPlacement>()
            .map_err(super::bad_argument)?,
        index_path: a
            .index_path
            .as_ref()
            .map(|p| super::index::absolute_path(p))
            .transpose()?,
        ..InitOptions::default()
    };
    let mut opts = opts;
    let p = super::progress(g);
    if let Some(from) = &a.copy_key_from {
        let src = super::open_at(
            g,
            from,
            || {
                super::copy::source_password(
                    a.from_password_file.as_deref(),
                    a.from_password_command.as_deref(),
                )
            },
            &p.progress,
        )
        .with_context(|| format!("opening {from}"))?;
        let shared = cairn_core::repo::SharedKey::of(&src, opts.encryption)?;
        // The chunker comes with the key (so that both cut files alike): a block
        // size asked for besides it would be silently another.
        if a.block_size.is_some() && opts.block_size != shared.chunker.avg_size {
            bail!(
                "--block-size {}: a repository made with --copy-key-from takes the source's \
                 block size ({} KiB), so that its chunks are the source's; leave --block-size out",
                a.block_size.as_deref().unwrap_or(""),
                shared.chunker.avg_size / 1024
            );
        }
        opts.shared = Some(shared);
    }
    // Checked before anything is created.
    let most = cairn_format::config::MAX_MAX_CONCURRENT_JOBS;
    if let Some(n) = a.max_concurrent_jobs
        && !(1..=most).contains(&n)
    {
        return Err(super::bad_argument(format!(
            "--max-concurrent-jobs {n}: give 1 to {most}"
        )));
    }
    let mut repo = init_repo(g, &opts, &p.progress)?;
    if let Some(n) = a.max_concurrent_jobs {
        repo.set_max_concurrent_jobs(n)?;
    }
    describe(g, &repo)?;
    Ok(0)
}
