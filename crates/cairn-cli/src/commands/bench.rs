use crate::args::{BenchArgs, Global};
use anyhow::Result;

pub fn run(g: &Global, a: &BenchArgs) -> Result<i32> {
    let size = super::parse_size(&a.size)?;
    if !(1 << 20..=4 << 30).contains(&size) {
        anyhow::bail!("--size must be between 1M and 4G");
    }
    let m = cairn_core::machine::measure(size as usize);
    if g.json {
        super::print_json(&m)?;
        return Ok(0);
    }
    println!(
        "{} cores, {} encryption, {} MB of test data per stage (half random, half text)",
        m.cores,
        m.encryption,
        m.data_bytes / 1_000_000
    );
    println!("\none core:");
    for s in &m.stages {
        println!("  {:<32} {:>9.0} MB/s", s.stage, s.mb_per_s);
    }
    println!(
        "  {:<32} {:>9.1} M/s",
        "index lookups (RAM placement)",
        m.index_lookups_per_s / 1e6
    );
    println!("\nexpected on all cores (CPU only; storage not included):");
    println!(
        "  {:<7} {:<12} {:>11} {:>14} {:>15}",
        "block", "compression", "size after", "backup MB/s", "restore MB/s"
    );
    for e in &m.expected {
        println!(
            "  {:<7} {:<12} {:>10.0}% {:>14.0} {:>15.0}",
            format!("{}K", e.block_size / 1024),
            e.compression,
            e.compressed_ratio * 100.0,
            e.backup_mb_per_s,
            e.restore_mb_per_s
        );
    }
    Ok(0)
}
