use crate::args::{Global, InitArgs};
use anyhow::{Context, Result, bail};
use cairn_core::{InitOptions, Repository};
use cairn_format::config::{Compression, IndexPlacement};

pub fn parse_block_size(s: &str) -> Result<u32> {
    let t = s.trim().to_ascii_uppercase();
    let t = t.trim_end_matches("IB").trim_end_matches('B');
    let n: u32 = match t.strip_suffix('K') {
        Some(k) => k.parse::<u32>().map(|v| v * 1024),
        None => t.parse::<u32>(),
    }
    .map_err(|_| anyhow::anyhow!("invalid block size {s:?} (use 4K, 8K, 16K, 32K or 64K)"))?;
    if !cairn_format::consts::BLOCK_SIZES.contains(&n) {
        bail!("invalid block size {s:?} (use 4K, 8K, 16K, 32K or 64K)");
    }
    Ok(n)
}

pub fn init_repo(g: &Global, opts: &InitOptions) -> Result<Repository> {
    let location = super::repo_location(g)?;
    let password = if opts.encryption {
        Some(match &g.password_file {
            Some(f) => crate::ui::read_password_file(f)?,
            None => crate::ui::new_password(None, true)?,
        })
    } else {
        None
    };
    if let Some(path) = super::local_dir(&location) {
        std::fs::create_dir_all(&path).map_err(|e| {
            anyhow::anyhow!("cannot create repository directory {}: {e}", path.display())
        })?;
    }
    let repo = Repository::init(super::backend(g)?, password.as_deref(), opts)?;
    Ok(repo)
}

pub fn describe(g: &Global, repo: &Repository) -> Result<()> {
    let c = repo.config();
    if g.json {
        super::print_json(&serde_json::json!({
            "repository": super::repo_location(g)?,
            "id": c.id,
            "block_size": c.chunker.avg_size,
            "chunk_min": c.chunker.min_size,
            "chunk_max": c.chunker.max_size,
            "compression": c.compression.name(),
            "encryption": c.encryption.name(),
            "index_placement": c.index_placement.name(),
            "format_version": c.version,
        }))
    } else if !g.quiet {
        println!(
            "created cairn repository {} at {}",
            &c.id[..10],
            super::repo_location(g)?
        );
        println!(
            "  block size   {} KiB average (chunks {}-{} KiB)",
            c.chunker.avg_size / 1024,
            c.chunker.min_size / 1024,
            c.chunker.max_size / 1024
        );
        println!("  compression  {}", c.compression.name());
        println!("  encryption   {}", c.encryption.name());
        println!("  index        {}", c.index_placement.name());
        if c.encryption != cairn_format::envelope::Encryption::None {
            println!("keep the password safe: without it the data cannot be read");
        }
        Ok(())
    } else {
        Ok(())
    }
}

pub fn run(g: &Global, a: &InitArgs) -> Result<i32> {
    let opts = InitOptions {
        block_size: parse_block_size(&a.block_size)?,
        compression: a
            .compression
            .parse::<Compression>()
            .map_err(anyhow::Error::msg)?,
        encryption: !a.no_encryption,
        index_placement: a
            .index_placement
            .parse::<IndexPlacement>()
            .map_err(anyhow::Error::msg)?,
        index_path: a
            .index_path
            .as_ref()
            .map(|p| super::index::absolute_path(p))
            .transpose()?,
        ..InitOptions::default()
    };
    let mut opts = opts;
    if let Some(from) = &a.copy_key_from {
        let src = super::open_at(g, from, || {
            super::copy::source_password(a.from_password_file.as_deref())
        })
        .with_context(|| format!("opening {from}"))?;
        opts.shared = Some(cairn_core::repo::SharedKey::of(&src, opts.encryption)?);
    }
    let repo = init_repo(g, &opts)?;
    describe(g, &repo)?;
    Ok(0)
}
