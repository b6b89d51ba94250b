use crate::args::{EstimateArgs, Global};
use crate::ui;
use anyhow::{Context, Result};
use cairn_plan::estimate::{Estimate, EstimateOptions, Reason};
use std::fmt::Write as _;

pub fn run(g: &Global, a: &EstimateArgs) -> Result<i32> {
    let mut block_sizes = Vec::new();
    for s in &a.block_sizes {
        block_sizes.push(super::parse_size(s)? as u32);
    }
    let ram = match &a.ram {
        Some(r) => super::parse_size(r)?,
        None => cairn_plan::estimate::machine_ram()
            .context("cannot read this machine's RAM from /proc/meminfo; give --ram")?,
    };
    let scale = a.scale.as_deref().map(super::parse_size).transpose()?;
    let memory = super::parse_size(&a.memory)?;
    if memory < 16 << 20 {
        anyhow::bail!("--memory must be at least 16M");
    }
    let opts = EstimateOptions {
        block_sizes,
        scale,
        ram,
        memory,
        excludes: a.excludes.clone(),
        one_file_system: a.one_file_system,
        // Twice the cores: a thread waiting for a read leaves its core to another.
        threads: 2 * std::thread::available_parallelism()
            .map(|n| n.get())
            .unwrap_or(2),
    };
    // The report's file is opened before the sampling, which can take an hour:
    // a path that cannot be written is said at once, not after it. One made here
    // is removed again if the estimate fails.
    let report = match &a.html {
        Some(path) => {
            let existed = std::fs::symlink_metadata(path).is_ok();
            let file = std::fs::OpenOptions::new()
                .write(true)
                .create(true)
                .truncate(false)
                .open(path)
                .with_context(|| format!("cannot write the report to {}", path.display()))?;
            Some((path, file, existed))
        }
        None => None,
    };
    let mut p = super::progress(g);
    p.start();
    let est = cairn_plan::estimate::estimate(&a.paths, &opts, &p.progress);
    p.finish();
    let est = match est {
        Ok(est) => est,
        Err(e) => {
            if let Some((path, _, false)) = &report {
                let _ = std::fs::remove_file(path);
            }
            return Err(e.into());
        }
    };
    if let Some((path, mut file, _)) = report {
        use std::io::Write as _;
        file.set_len(0)
            .and_then(|()| file.write_all(html(&est, &a.paths).as_bytes()))
            .with_context(|| format!("writing {}", path.display()))?;
    }
    if g.json {
        super::print_json(&est)?;
    } else {
        print_text(&est);
    }
    Ok(if est.skipped > 0 { 3 } else { 0 })
}

fn kib(b: u32) -> String {
    format!("{}K", b / 1024)
}

fn share(s: f64) -> String {
    // A share that rounds to one in one is all of it ("1/1" says nothing).
    if s <= 0.0 {
        "none".into()
    } else if 1.0 / s < 1.5 {
        "all".into()
    } else {
        format!("1/{:.0}", 1.0 / s)
    }
}

/// The sample shares of the block sizes: one word when they are all the same, else
/// each with its block size ("4K 1/3, 8K 1/2, 16K all").
fn shares(e: &Estimate, f: impl Fn(&cairn_plan::estimate::BlockEstimate) -> f64) -> String {
    let v: Vec<(u32, String)> = e
        .block_sizes
        .iter()
        .map(|x| (x.block_size, share(f(x))))
        .collect();
    match v.first() {
        Some((_, first)) if v.iter().all(|(_, s)| s == first) => first.clone(),
        _ => v
            .iter()
            .map(|(b, s)| format!("{} {s}", kib(*b)))
            .collect::<Vec<_>>()
            .join(", "),
    }
}

/// A difference in reduction that goes against the reason's word ("more" or
/// "less"), said the right way round: "1.2 points less", or `none` when it is nil.
fn points_other_way(points: f64, word: &str, none: &str) -> String {
    if points <= -0.05 {
        format!("{:.1} points {word}", -points)
    } else {
        none.to_string()
    }
}

/// Said when the projection reaches far beyond what was read: deduplication across
/// that much data (more copies of the same files, more versions) is usually higher
/// than in a sample, and the sample may not be typical.
fn small_sample(e: &Estimate) -> Option<String> {
    let ratio = e.scale_bytes as f64 / e.bytes.max(1) as f64;
    (ratio >= 100.0).then(|| {
        format!(
            "the {} read is 1/{:.0} of the {} projected: the figures below scale the sample, \
             and deduplication across the whole is usually higher; read a larger, typical \
             part of the data for a firmer estimate",
            ui::bytes(e.bytes),
            ratio,
            ui::bytes(e.scale_bytes)
        )
    })
}

fn print_text(e: &Estimate) {
    let b = ui::bytes;
    println!(
        "read {}, {} in {:.1} s ({:.0} MB/s){}",
        ui::count(e.files, "file"),
        b(e.bytes),
        e.seconds,
        e.mb_per_s,
        if e.skipped > 0 {
            format!("; {} could not be read", ui::count(e.skipped, "entry"))
        } else {
            String::new()
        }
    );
    println!(
        "sampled by chunk hash: {} chunks for dedup; compression measured on {} of the unique chunks at standard, {} at max",
        share(e.dedup_share),
        shares(e, |x| x.standard_sample_share),
        shares(e, |x| x.max_sample_share)
    );
    // QA: an image file estimated as a file read 19% short of `backup --image`.
    println!(
        "as a file backup cuts it (content-defined chunks); `backup --image` cuts disk images in \
         fixed blocks, which deduplicate differently"
    );
    println!("\non the data read ({}):", b(e.bytes));
    println!(
        "  {:<6} {:>10} {:>7} {:>17} {:>17} {:>12}",
        "block", "avg chunk", "dedup", "compression", "reduction", "datastore"
    );
    println!(
        "  {:<6} {:>10} {:>7} {:>8} {:>8} {:>8} {:>8} {:>12}",
        "", "", "", "std", "max", "std", "max", "std"
    );
    for x in &e.block_sizes {
        println!(
            "  {:<6} {:>10} {:>6.1}% {:>7.1}% {:>7.1}% {:>7.1}% {:>7.1}% {:>12}",
            kib(x.block_size),
            b(x.average_chunk_bytes),
            x.dedup_percent,
            x.compression_standard_percent,
            x.compression_max_percent,
            x.reduction_standard_percent,
            x.reduction_max_percent,
            b(x.sample.datastore_standard_bytes)
        );
    }
    println!("\nat {} of protected data:", b(e.scale_bytes));
    if let Some(note) = small_sample(e) {
        println!("  note: {note}");
    }
    println!(
        "  {:<6} {:>14} {:>12} {:>14} {:>24} {:>12} {:>12}",
        "block",
        "unique chunks",
        "index disk",
        "RAM placement",
        "SSD placement RAM/disk",
        "store std",
        "store max"
    );
    for x in &e.block_sizes {
        let s = &x.scaled;
        println!(
            "  {:<6} {:>14} {:>12} {:>14} {:>24} {:>12} {:>12}",
            kib(x.block_size),
            s.unique_chunks,
            b(s.index_bytes),
            b(s.ram_placement_ram_bytes),
            format!(
                "{} / {}",
                b(s.ssd_placement_ram_bytes),
                b(s.ssd_placement_disk_bytes)
            ),
            b(s.datastore_standard_bytes),
            b(s.datastore_max_bytes)
        );
    }
    let r = &e.recommendation;
    println!(
        "\nrecommended for {} of RAM: {} blocks, index in {}",
        b(e.ram_bytes),
        kib(r.block_size),
        r.placement.to_uppercase()
    );
    for reason in &r.reasons {
        println!("  - {}", wording(reason));
    }
}

/// One sentence for a reason of the recommendation.
fn wording(r: &Reason) -> String {
    let h = |b: u64| cairn_core::units::bytes(b, 1);
    match r {
        Reason::NothingFits {
            block_size,
            scale_bytes,
            ssd_ram_bytes,
            ram_bytes,
        } => format!(
            "even at {} blocks the index for {} needs {} of RAM in the SSD placement, more than half of {}: plan more RAM or split the data over several datastores",
            kib(*block_size),
            h(*scale_bytes),
            h(*ssd_ram_bytes),
            h(*ram_bytes)
        ),
        Reason::IndexFits {
            scale_bytes,
            ram_needed_bytes,
            placement,
            ram_bytes,
            ram_placement_bytes,
            ssd_disk_bytes,
        } => format!(
            "at {} of protected data its index needs {} of RAM in the {} placement, within half of {} ({})",
            h(*scale_bytes),
            h(*ram_needed_bytes),
            placement,
            h(*ram_bytes),
            match (ram_placement_bytes, ssd_disk_bytes) {
                (Some(r), Some(d)) => format!(
                    "the RAM placement would need {}; the SSD placement keeps {} on local disk",
                    h(*r),
                    h(*d)
                ),
                _ => "no SSD needed".to_string(),
            }
        ),
        Reason::Reduction {
            reduction_percent,
            dedup_percent,
            compression_percent,
            datastore_bytes,
        } => format!(
            "overall reduction {reduction_percent:.1}% (dedup {dedup_percent:.1}%, compression {compression_percent:.1}%): datastore about {}",
            h(*datastore_bytes)
        ),
        Reason::SmallerReducesMore {
            block_size,
            more_points,
            ram_needed_bytes,
            extra_ram_bytes,
            extra_index_bytes,
        } if *more_points < 0.05 => format!(
            "{} would not reduce more ({}), and needs {} more RAM and {} more index",
            kib(*block_size),
            points_other_way(*more_points, "less", "the same"),
            h(*extra_ram_bytes),
            h(*extra_index_bytes)
        ),
        Reason::SmallerReducesMore {
            block_size,
            more_points,
            ram_needed_bytes,
            extra_ram_bytes,
            extra_index_bytes,
        } => format!(
            "{} would reduce {more_points:.1} points more, {}",
            kib(*block_size),
            match ram_needed_bytes {
                Some(n) => format!("its index would need {} of RAM", h(*n)),
                None => format!(
                    "for {} more RAM, slower restores and {} more index",
                    h(*extra_ram_bytes),
                    h(*extra_index_bytes)
                ),
            }
        ),
        Reason::LargerReducesLess {
            block_size,
            fewer_points,
            saved_ram_bytes,
            ..
        } if *fewer_points < 0.05 => format!(
            "{} would reduce {} and save {} of RAM",
            kib(*block_size),
            points_other_way(*fewer_points, "more", "as much"),
            h(*saved_ram_bytes)
        ),
        Reason::LargerReducesLess {
            block_size,
            fewer_points,
            larger_datastore_bytes,
            saved_ram_bytes,
        } => format!(
            "{} would reduce {fewer_points:.1} points less (datastore {} larger) to save {} of RAM",
            kib(*block_size),
            h(*larger_datastore_bytes),
            h(*saved_ram_bytes)
        ),
    }
}

fn esc(s: &str) -> String {
    s.replace('&', "&amp;")
        .replace('<', "&lt;")
        .replace('>', "&gt;")
        .replace('"', "&quot;")
}

const W: f64 = 560.0;
const H: f64 = 300.0;
const LEFT: f64 = 60.0;
const RIGHT: f64 = 150.0;
const TOP: f64 = 20.0;
const BOTTOM: f64 = 40.0;

/// An SVG line chart of percentages by block size.
fn line_chart(e: &Estimate) -> String {
    let n = e.block_sizes.len().max(1);
    let pw = W - LEFT - RIGHT;
    let ph = H - TOP - BOTTOM;
    let x = |i: usize| {
        LEFT + if n == 1 {
            pw / 2.0
        } else {
            pw * i as f64 / (n - 1) as f64
        }
    };
    let y = |p: f64| TOP + ph * (1.0 - p.clamp(0.0, 100.0) / 100.0);
    let mut s = format!(
        r#"<svg xmlns="http://www.w3.org/2000/svg" width="{W}" height="{H}" font-family="sans-serif" font-size="12">"#
    );
    for p in (0..=100).step_by(20) {
        let yy = y(p as f64);
        let _ = write!(
            s,
            r##"<line x1="{LEFT}" x2="{}" y1="{yy}" y2="{yy}" stroke="#ddd"/><text x="{}" y="{}" text-anchor="end">{p}%</text>"##,
            LEFT + pw,
            LEFT - 6.0,
            yy + 4.0
        );
    }
    for (i, b) in e.block_sizes.iter().enumerate() {
        let _ = write!(
            s,
            r#"<text x="{}" y="{}" text-anchor="middle">{}</text>"#,
            x(i),
            H - BOTTOM + 18.0,
            kib(b.block_size)
        );
    }
    type Pick = fn(&cairn_plan::estimate::BlockEstimate) -> f64;
    let series: [(&str, &str, Pick); 5] = [
        ("overall, max", "#6a3d9a", |b| b.reduction_max_percent),
        ("overall, standard", "#1f78b4", |b| {
            b.reduction_standard_percent
        }),
        ("dedup", "#33a02c", |b| b.dedup_percent),
        ("compression, max", "#e31a1c", |b| b.compression_max_percent),
        ("compression, standard", "#ff7f00", |b| {
            b.compression_standard_percent
        }),
    ];
    for (k, (name, color, pick)) in series.iter().enumerate() {
        let pts: Vec<String> = e
            .block_sizes
            .iter()
            .enumerate()
            .map(|(i, b)| format!("{:.1},{:.1}", x(i), y(pick(b))))
            .collect();
        let _ = write!(
            s,
            r#"<polyline fill="none" stroke="{color}" stroke-width="2" points="{}"/>"#,
            pts.join(" ")
        );
        for (i, b) in e.block_sizes.iter().enumerate() {
            let _ = write!(
                s,
                r#"<circle cx="{:.1}" cy="{:.1}" r="3" fill="{color}"><title>{name} at {}: {:.1}%</title></circle>"#,
                x(i),
                y(pick(b)),
                kib(b.block_size),
                pick(b)
            );
        }
        let ly = TOP + 16.0 * k as f64;
        let _ = write!(
            s,
            r#"<rect x="{}" y="{}" width="12" height="3" fill="{color}"/><text x="{}" y="{}">{name}</text>"#,
            W - RIGHT + 12.0,
            ly + 4.0,
            W - RIGHT + 28.0,
            ly + 9.0
        );
    }
    let _ = write!(
        s,
        r#"<text x="{}" y="{}" text-anchor="middle">block size</text></svg>"#,
        LEFT + pw / 2.0,
        H - 4.0
    );
    s
}

/// An SVG bar chart of the index RAM at the projected scale, with the RAM budget.
fn index_chart(e: &Estimate) -> String {
    let n = e.block_sizes.len().max(1);
    let pw = W - LEFT - RIGHT;
    let ph = H - TOP - BOTTOM;
    let budget = e.ram_bytes / 2;
    let top = e
        .block_sizes
        .iter()
        .map(|b| b.scaled.ram_placement_ram_bytes)
        .max()
        .unwrap_or(0)
        .max(budget)
        .max(1) as f64;
    let y = |v: u64| TOP + ph * (1.0 - v as f64 / top);
    let slot = pw / n as f64;
    let mut s = format!(
        r#"<svg xmlns="http://www.w3.org/2000/svg" width="{W}" height="{H}" font-family="sans-serif" font-size="12">"#
    );
    let _ = write!(
        s,
        r##"<line x1="{LEFT}" x2="{}" y1="{}" y2="{}" stroke="#333"/>"##,
        LEFT + pw,
        TOP + ph,
        TOP + ph
    );
    for (i, b) in e.block_sizes.iter().enumerate() {
        let x0 = LEFT + slot * i as f64 + slot * 0.15;
        let bw = slot * 0.35;
        for (j, (v, color, what)) in [
            (
                b.scaled.ram_placement_ram_bytes,
                "#1f78b4",
                "RAM, RAM placement",
            ),
            (b.scaled.index_bytes, "#a6cee3", "index on disk"),
        ]
        .into_iter()
        .enumerate()
        {
            let _ = write!(
                s,
                r#"<rect x="{:.1}" y="{:.1}" width="{:.1}" height="{:.1}" fill="{color}"><title>{}: {what} {}</title></rect>"#,
                x0 + bw * j as f64,
                y(v),
                bw,
                (TOP + ph - y(v)).max(0.0),
                kib(b.block_size),
                esc(&ui::bytes(v))
            );
        }
        let _ = write!(
            s,
            r#"<text x="{:.1}" y="{}" text-anchor="middle">{}</text><text x="{:.1}" y="{:.1}" text-anchor="middle" font-size="10">{}</text>"#,
            x0 + bw,
            H - BOTTOM + 18.0,
            kib(b.block_size),
            x0 + bw,
            y(b.scaled.ram_placement_ram_bytes) - 4.0,
            esc(&ui::bytes(b.scaled.ram_placement_ram_bytes))
        );
    }
    let by = y(budget);
    let _ = write!(
        s,
        r##"<line x1="{LEFT}" x2="{}" y1="{by:.1}" y2="{by:.1}" stroke="#e31a1c" stroke-dasharray="6 4"/><text x="{}" y="{:.1}" fill="#e31a1c">half the RAM: {}</text>"##,
        LEFT + pw,
        LEFT + pw + 6.0,
        by + 4.0,
        esc(&ui::bytes(budget))
    );
    for (k, (name, color)) in [
        ("RAM (RAM placement)", "#1f78b4"),
        ("index on disk", "#a6cee3"),
    ]
    .iter()
    .enumerate()
    {
        let ly = TOP + 24.0 + 16.0 * k as f64;
        let _ = write!(
            s,
            r#"<rect x="{}" y="{}" width="12" height="10" fill="{color}"/><text x="{}" y="{}">{name}</text>"#,
            W - RIGHT + 12.0,
            ly,
            W - RIGHT + 28.0,
            ly + 9.0
        );
    }
    s.push_str("</svg>");
    s
}

/// A self-contained page: no scripts, no external files.
fn html(e: &Estimate, paths: &[std::path::PathBuf]) -> String {
    let b = ui::bytes;
    let mut s = String::from(
        "<!DOCTYPE html><html><head><meta charset=\"utf-8\"><title>cairn estimate</title><style>body{font-family:sans-serif;margin:2em;max-width:1000px}table{border-collapse:collapse;margin:1em 0}td,th{border:1px solid #ccc;padding:4px 8px;text-align:right}th{background:#f4f4f4}td:first-child{text-align:left}.rec{background:#eef6ee;padding:1em;border-left:4px solid #33a02c}</style></head><body>",
    );
    let names: Vec<String> = paths
        .iter()
        .map(|p| esc(&p.display().to_string()))
        .collect();
    let _ = write!(
        s,
        "<h1>cairn estimate</h1><p>{}, {} read from <code>{}</code> in {:.1} s ({:.0} MB/s). Projected to {} of protected data for a machine with {} of RAM.</p>",
        ui::count(e.files, "file"),
        esc(&b(e.bytes)),
        names.join("</code>, <code>"),
        e.seconds,
        e.mb_per_s,
        esc(&b(e.scale_bytes)),
        esc(&b(e.ram_bytes))
    );
    let r = &e.recommendation;
    let _ = write!(
        s,
        "<div class=\"rec\"><b>Recommended: {} blocks, index in the {} placement.</b><ul>",
        kib(r.block_size),
        r.placement.to_uppercase()
    );
    for reason in &r.reasons {
        let _ = write!(s, "<li>{}</li>", esc(&wording(reason)));
    }
    s.push_str("</ul></div><h2>Reduction by block size</h2>");
    s.push_str(&line_chart(e));
    let _ = write!(
        s,
        "<h2>Index at {} of protected data</h2>",
        esc(&b(e.scale_bytes))
    );
    s.push_str(&index_chart(e));
    s.push_str("<h2>Figures</h2><table><tr><th>block</th><th>avg chunk</th><th>dedup</th><th>compression std</th><th>compression max</th><th>reduction std</th><th>reduction max</th><th>unique chunks at scale</th><th>index on disk</th><th>RAM, RAM placement</th><th>RAM / disk, SSD placement</th><th>datastore std</th><th>datastore max</th></tr>");
    for x in &e.block_sizes {
        let sc = &x.scaled;
        let _ = write!(
            s,
            "<tr><td>{}</td><td>{}</td><td>{:.1}%</td><td>{:.1}%</td><td>{:.1}%</td><td>{:.1}%</td><td>{:.1}%</td><td>{}</td><td>{}</td><td>{}</td><td>{} / {}</td><td>{}</td><td>{}</td></tr>",
            kib(x.block_size),
            esc(&b(x.average_chunk_bytes)),
            x.dedup_percent,
            x.compression_standard_percent,
            x.compression_max_percent,
            x.reduction_standard_percent,
            x.reduction_max_percent,
            sc.unique_chunks,
            esc(&b(sc.index_bytes)),
            esc(&b(sc.ram_placement_ram_bytes)),
            esc(&b(sc.ssd_placement_ram_bytes)),
            esc(&b(sc.ssd_placement_disk_bytes)),
            esc(&b(sc.datastore_standard_bytes)),
            esc(&b(sc.datastore_max_bytes))
        );
    }
    let _ = write!(
        s,
        "</table><p>Sampled by chunk hash: {} of chunks for deduplication; compression measured on {} of the unique chunks at standard, {} at max.</p></body></html>",
        share(e.dedup_share),
        shares(e, |x| x.standard_sample_share),
        shares(e, |x| x.max_sample_share)
    );
    s
}
