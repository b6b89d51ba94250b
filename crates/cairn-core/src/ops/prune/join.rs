//! Prune's decisions on the joined index ([`crate::ops::scan`]): which copy of
//! each needed blob is kept, the packs ranked by how much of them is needed, and
//! what repacking copies.

use crate::error::{Error, Result};
use crate::index::IdSet;
use crate::index::spill::Spill;
use crate::ops::scan::{Entry, NEEDED, Needed, PackRow, Scan, join};
use cairn_format::index::IndexBlob;
use std::collections::HashMap;

/// What the join decided, besides the counters in the scan's pack rows.
pub(super) struct Joined {
    pub used_blobs: usize,
    /// Needed blobs no kept pack holds but a pack an earlier prune retired does:
    /// deletion indexes such a pack again instead of deleting it.
    pub needed_from_pending: IdSet,
    needed: Spill<NEEDED>,
    rank: Vec<u32>,
}

/// The copy of a needed blob that is kept: in the best-ranked usable pack.
fn provider(copies: &[Entry], rank: &[u32], packs: &[PackRow]) -> Option<usize> {
    (0..copies.len())
        .filter(|&k| packs[copies[k].pack as usize].usable())
        .min_by_key(|&k| rank[copies[k].pack as usize])
}

/// Counts, per pack, its blobs, their extent and how many are needed; ranks the
/// packs (entirely needed first, then the fullest); then chooses each needed
/// blob's kept copy and adds up the bytes used and unused per pack. Fails when a
/// needed blob has no readable copy and no retired pack holds it.
pub(super) fn join_needed(scan: &mut Scan, needed: Needed) -> Result<Joined> {
    let mut needed = needed.into_spill()?;
    join(scan, &mut needed, &mut |j, packs| {
        let (copies, is_needed) = (j.copies, j.needed);
        for e in copies {
            let row = &mut packs[e.pack as usize];
            row.blobs += 1;
            row.end = row
                .end
                .max(u64::from(e.blob.offset) + u64::from(e.blob.length));
            if is_needed {
                row.need += 1;
            }
        }
        Ok(())
    })?;
    let mut order: Vec<u32> = (0..scan.packs.len() as u32).collect();
    let fill = |r: &PackRow| r.need as f64 / r.blobs.max(1) as f64;
    order.sort_by(|a, b| fill(&scan.packs[*b as usize]).total_cmp(&fill(&scan.packs[*a as usize])));
    let mut rank = vec![0u32; scan.packs.len()];
    for (r, n) in order.into_iter().enumerate() {
        rank[n as usize] = r as u32;
    }
    let mut used_blobs = 0;
    let mut needed_from_pending = IdSet::default();
    join(scan, &mut needed, &mut |j, packs| {
        let (id, copies, is_needed) = (j.id, j.copies, j.needed);
        let kept = if is_needed {
            used_blobs += 1;
            provider(copies, &rank, packs)
        } else {
            None
        };
        if is_needed && kept.is_none() {
            if !j.pending {
                return Err(Error::Invalid(format!(
                    "blob {} is needed by a snapshot but no readable pack holds it; \
                     run `cairn check` and `cairn repair` before prune",
                    id.to_hex()
                )));
            }
            needed_from_pending.insert(*id);
        }
        for (k, e) in copies.iter().enumerate() {
            let row = &mut packs[e.pack as usize];
            if Some(k) == kept {
                row.used_bytes += u64::from(e.blob.length);
            } else {
                row.unused_bytes += u64::from(e.blob.length);
            }
        }
        Ok(())
    })?;
    Ok(Joined {
        used_blobs,
        needed_from_pending,
        needed,
        rank,
    })
}

/// The kept copies that lie in the packs `repack` selects, by pack, in each
/// pack's order: what repacking copies.
pub(super) fn repack_lists(
    scan: &mut Scan,
    joined: &mut Joined,
    repack: &dyn Fn(usize) -> bool,
) -> Result<HashMap<u32, Vec<IndexBlob>>> {
    let mut lists: HashMap<u32, Vec<IndexBlob>> = HashMap::new();
    let rank = std::mem::take(&mut joined.rank);
    join(scan, &mut joined.needed, &mut |j, packs| {
        let (copies, is_needed) = (j.copies, j.needed);
        if !is_needed {
            return Ok(());
        }
        if let Some(k) = provider(copies, &rank, packs)
            && repack(copies[k].pack as usize)
        {
            lists
                .entry(copies[k].pack)
                .or_default()
                .push(copies[k].blob);
        }
        Ok(())
    })?;
    for l in lists.values_mut() {
        l.sort_by_key(|b| b.offset);
    }
    Ok(lists)
}
