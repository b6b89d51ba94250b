use crate::args::{BenchArgs, Global};
use anyhow::Result;

pub fn run(g: &Global, a: &BenchArgs) -> Result<i32> {
    if let Some(n) = &a.index {
        return index(g, a, n);
    }
    let size = super::parse_size(&a.size)?;
    if !(1 << 20..=4 << 30).contains(&size) {
        anyhow::bail!("--size must be between 1M and 4G");
    }
    let m = cairn_plan::machine::measure(size as usize);
    // Lookups in each placement on an index of synthetic blobs (a million at the
    // default size).
    let dir = tempfile_dir(&std::env::temp_dir())?;
    let placements = cairn_plan::machine::index_bench((size / 64).clamp(10_000, 1_000_000), &dir);
    let _ = std::fs::remove_dir_all(&dir);
    let placements = placements?;
    if g.json {
        super::print_json(&cairn_plan::machine::BenchReport {
            machine: m,
            index_placements: placements,
        })?;
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
    for p in &placements {
        println!(
            "  {:<32} {:>9.2} M/s present, {:.2} M/s absent, {:.2} M/s in pack order ({:.2} B of RAM per blob)",
            format!("index lookups ({} placement)", p.placement),
            p.present_per_s / 1e6,
            p.absent_per_s / 1e6,
            p.present_in_order_per_s / 1e6,
            p.ram_bytes_per_blob
        );
    }
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

/// Counts such as 100M are decimal here (blobs, not bytes).
fn parse_count(s: &str) -> Result<u64> {
    let t = s.trim();
    let (num, mult) = match t.chars().last() {
        Some('K' | 'k') => (&t[..t.len() - 1], 1e3),
        Some('M' | 'm') => (&t[..t.len() - 1], 1e6),
        Some('G' | 'g') => (&t[..t.len() - 1], 1e9),
        _ => (t, 1.0),
    };
    let v: f64 = num
        .parse()
        .map_err(|_| anyhow::anyhow!("invalid count {s:?} (e.g. 100M)"))?;
    if !(1.0..=1e10).contains(&(v * mult)) {
        anyhow::bail!("--index must be between 1 and 10G blobs");
    }
    Ok((v * mult) as u64)
}

fn index(g: &Global, a: &BenchArgs, n: &str) -> Result<i32> {
    let n = parse_count(n)?;
    let dir = tempfile_dir(&a.index_dir)?;
    let r = match a.placement.as_deref() {
        None => cairn_plan::machine::index_bench(n, &dir),
        Some("ram") => cairn_plan::machine::index_bench_ram(n).map(|r| vec![r]),
        Some("ssd") => cairn_plan::machine::index_bench_ssd(n, &dir).map(|r| vec![r]),
        Some(p) => anyhow::bail!("unknown placement {p:?} (expected ram or ssd)"),
    };
    let _ = std::fs::remove_dir_all(&dir);
    let r = r?;
    if g.json {
        super::print_json(&r)?;
        return Ok(0);
    }
    println!(
        "  {:<6} {:>12} {:>9} {:>11} {:>12} {:>14} {:>14} {:>16}",
        "place",
        "blobs",
        "build s",
        "RAM B/blob",
        "disk",
        "present/s",
        "absent/s",
        "in pack order/s"
    );
    for p in &r {
        println!(
            "  {:<6} {:>12} {:>9.1} {:>11.2} {:>12} {:>14.0} {:>14.0} {:>16.0}",
            p.placement,
            p.blobs,
            p.build_seconds,
            p.ram_bytes_per_blob,
            crate::ui::bytes(p.disk_bytes),
            p.present_per_s,
            p.absent_per_s,
            p.present_in_order_per_s
        );
    }
    for p in r.iter().filter(|p| p.update_seconds.is_some()) {
        println!(
            "  {}: after one more index file of 200,000 blobs, the next open took {:.1} s",
            p.placement,
            p.update_seconds.unwrap_or(0.0)
        );
    }
    Ok(0)
}

/// A fresh directory under `base` for one run.
fn tempfile_dir(base: &std::path::Path) -> Result<std::path::PathBuf> {
    use anyhow::Context;
    let d = base.join(format!("cairn-index-bench-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&d);
    std::fs::create_dir_all(&d).with_context(|| format!("creating {}", d.display()))?;
    Ok(d)
}
