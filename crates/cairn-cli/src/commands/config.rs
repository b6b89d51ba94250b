use crate::args::{ConfigArgs, Global};
use anyhow::{Context, Result};
use cairn_core::repo::info::RepositoryInfo;
use cairn_format::config::Compression;

pub fn run(g: &Global, a: &ConfigArgs) -> Result<i32> {
    if let Some(b) = &a.block_size {
        anyhow::bail!(
            "--block-size {b}: the block size is fixed when a repository is created (every \
             chunk is cut by it, and deduplication needs new data cut the same way); create \
             one with `cairn init --block-size {b}` and `cairn copy` the snapshots into it"
        );
    }
    if a.no_encryption {
        anyhow::bail!(
            "--no-encryption: encryption is chosen when a repository is created; create an \
             unencrypted one with `cairn init --no-encryption` and `cairn copy` the snapshots \
             into it (the password can be changed with `cairn key passwd`)"
        );
    }
    let p = super::progress(g);
    let mut repo = super::open(g, &p.progress)?;
    let changes = a.compression.is_some()
        || a.pack_size.is_some()
        || a.max_concurrent_jobs.is_some()
        || (g.memory_limit.is_some() && g.memory_limit_flag);
    // Said up front, not as the lock the server refuses (QA r33).
    if changes && !repo.backend().may_remove()? {
        anyhow::bail!(
            "config changes replace the repository's settings: this token may not (an admin \
             token can)"
        );
    }
    if let Some(c) = &a.compression {
        let c: Compression = c.parse().map_err(super::bad_argument)?;
        repo.set_compression(c)?;
    }
    if let Some(s) = &a.pack_size {
        repo.set_pack_size(super::parse_size(s).context("--pack-size")?)?;
    }
    // The global flag, given to `config`, sets the repository's default
    // (`CAIRN_MEMORY_LIMIT` is a limit for one run, and changes nothing here).
    if let Some(m) = g.memory_limit.as_ref().filter(|_| g.memory_limit_flag) {
        let limit = if m == "none" {
            None
        } else {
            Some(super::parse_size(m).context("--memory-limit")?)
        };
        repo.set_default_memory_limit(limit)?;
    }
    if let Some(n) = a.max_concurrent_jobs {
        repo.set_max_concurrent_jobs(n)?;
        if n > 16 {
            crate::ui::warn(format!(
                "max-concurrent-jobs {n}: more than 16 jobs writing at once mostly \
                 compete for CPU, memory and storage bandwidth, and each holds its own \
                 copy of the index in memory"
            ));
        }
    }
    let c = RepositoryInfo::of(&repo);
    if g.json {
        super::print_json(&c)?;
    } else if !g.quiet {
        println!("repository    {}", c.id);
        println!("created       {}", c.created);
        println!("block size    {} KiB", c.block_size / 1024);
        println!("compression   {}", c.compression);
        println!("encryption    {}", c.encryption);
        println!(
            "pack size     {} MiB",
            c.pack_size as f64 / (1 << 20) as f64
        );
        println!("max jobs      {} concurrent backups", c.max_concurrent_jobs);
        match (c.index_placement, &c.index_path) {
            ("ssd", Some(p)) => println!("index         ssd, in {p}"),
            (placement, _) => println!("index         {placement}"),
        }
        println!(
            "memory limit  {}",
            c.memory_limit.map_or(
                "none (--memory-limit sets one per run)".to_string(),
                crate::ui::bytes
            )
        );
    }
    Ok(0)
}
