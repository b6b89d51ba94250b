use crate::args::{Global, StatsArgs};
use crate::ui;
use anyhow::Result;
use cairn_core::session::{IndexLoad, Read};

pub fn run(g: &Global, a: &StatsArgs) -> Result<i32> {
    let mut p = super::progress(g);
    let session = super::session::<Read>(g, "stats", IndexLoad::Placement, &p.progress)?;
    // Named snapshots are resolved among the host's ("latest" is its newest), as
    // `ls` and `restore` resolve them; no names: every snapshot of the hosts.
    let filter = cairn_core::forget::SnapshotFilter {
        hosts: a.host.clone(),
        ..Default::default()
    };
    // A token shown one host's snapshots sees a part: its figures are those of a
    // selection (QA: other hosts' data showed as "unused", as if prune would free it).
    let only_host = session.repo().backend().partial_view()?;
    let selected = if !a.snapshots.is_empty() {
        let mut ids = Vec::new();
        for s in &a.snapshots {
            ids.push(session.find_snapshot_matching(s, &filter)?.0);
        }
        Some(ids)
    } else if !a.host.is_empty() || only_host.is_some() {
        let (all, _) = session.snapshots()?;
        Some(
            all.iter()
                .filter(|(_, s)| filter.matches(s))
                .map(|(id, _)| *id)
                .collect(),
        )
    } else {
        None
    };
    p.start();
    let st = cairn_core::stats::stats(&session, selected.as_deref());
    p.finish();
    let st = st?;
    // Snapshots that cannot be read: left out, said, and the figures are of the
    // rest (done in part).
    for e in &st.unreadable_snapshots {
        ui::warn(format!(
            "{e}: left out of the figures (what only it needs counts as unused; `cairn \
             forget` it, or `cairn repair snapshots`)"
        ));
    }
    let code = if st.unreadable_snapshots.is_empty() {
        0
    } else {
        crate::EXIT_INCOMPLETE
    };
    if g.json {
        super::print_json_report(&st)?;
        return Ok(code);
    }
    let b = ui::bytes;
    let o = &st.overhead;
    if let Some(h) = &only_host {
        println!(
            "note: this token is shown only host {h:?}'s snapshots: the figures are theirs, \
             and the rest of the datastore counts as not needed by them"
        );
    }
    println!("snapshots:             {}", st.snapshots);
    if let Some(i) = &st.images {
        println!(
            "  of which images:     {}, {} of image in {}, {} changed since their parents, {} added by their backups",
            i.snapshots,
            b(i.image_bytes),
            ui::count(i.blocks, "block"),
            i.blocks_changed,
            b(i.data_added_packed)
        );
    }
    println!("stored data:           {}", b(st.stored_bytes));
    println!(
        "after deduplication:   {}  (dedup {})",
        b(st.unique_data_bytes),
        ui::percent(st.dedup_percent)
    );
    println!(
        "after compression:     {}  (compression {})",
        b(st.compressed_data_bytes),
        ui::percent(st.compression_percent)
    );
    println!(
        "overall reduction:     {}",
        ui::percent(st.reduction_percent)
    );
    match (st.needed_bytes, st.stored_to_needed) {
        // A subset: the space it needs is its figure; the repository's is beside it.
        (Some(needed), Some(ratio)) => println!(
            "space needed:          {}  (stored : needed = {ratio:.2} : 1; the repository occupies {})",
            b(needed),
            b(st.occupied_bytes),
        ),
        _ => println!(
            "space occupied:        {}  (stored : occupied = {:.2} : 1)",
            b(st.occupied_bytes),
            st.stored_to_occupied
        ),
    }
    // With a selection, "unused" is what the selected snapshots do not need: most
    // of it other snapshots' data, which prune keeps. It is not part of the space
    // they need, so it gets a line of its own.
    let unused = if selected.is_some() {
        String::new()
    } else {
        format!(", unused {}", b(o.unused_bytes))
    };
    println!(
        "  overhead {}: envelopes {}, trees and chunk lists {}, pack headers {}{unused}, index {}, snapshots {}, other {}",
        b(o.total()
            - if selected.is_some() {
                o.unused_bytes
            } else {
                0
            }),
        b(o.envelope_bytes),
        b(o.metadata_bytes),
        b(o.pack_header_bytes),
        b(o.index_bytes),
        b(o.snapshot_bytes),
        b(o.other_bytes)
    );
    if selected.is_some() {
        println!(
            "  not needed by these snapshots: {} (other snapshots' data, and data no snapshot uses)",
            b(o.unused_bytes)
        );
    }
    if o.duplicate_bytes > 0 {
        println!(
            "  of the unused: {} are second copies of needed data (stored twice by backups \
             running at the same time, or because the index could not be read); `cairn prune \
             --max-unused 0` reclaims them (a plain prune leaves up to 5% unused)",
            b(o.duplicate_bytes)
        );
    }
    println!(
        "unique chunks:         {}  (average {})",
        st.unique_chunks,
        b(st.average_chunk_bytes)
    );
    println!(
        "index:                 {} in {}, {} on disk, about {} of RAM{}",
        ui::count(st.index.blobs as u64, "blob"),
        ui::count(st.index.files as u64, "file"),
        b(st.index.bytes),
        b(st.index.ram_bytes),
        match st.index.local_disk_bytes {
            Some(d) => format!(" and {} of local disk (SSD placement)", b(d)),
            None => String::new(),
        }
    );
    let fill = match st.packs.fill_percent {
        Some(f) => format!("of a {} target ({f:.0}% full)", b(st.packs.target_bytes)),
        None => format!(
            "(written for a larger target than today's {})",
            b(st.packs.target_bytes)
        ),
    };
    println!(
        "packs:                 {} ({}), average {} {fill}, {:.1}% of pack bytes {}",
        st.packs.count,
        b(st.packs.bytes),
        b(st.packs.average_bytes),
        st.packs.used_percent,
        if selected.is_some() {
            "needed by these snapshots"
        } else {
            "in use"
        }
    );
    Ok(code)
}
