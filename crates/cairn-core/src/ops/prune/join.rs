//! Prune's decisions on the joined index ([`crate::ops::scan`]): which copy of
//! each needed blob is kept, the packs ranked by how much of them is needed, and
//! what repacking copies.

use crate::error::{Error, Result};
use crate::index::IdSet;
use crate::index::spill::Spill;
use crate::ops::restore::execute::{PackSpan, range_bounds, range_limit, ranges};
use crate::ops::scan::{Entry, NEEDED, Needed, PackRow, Scan, join};
use crate::repo::{Repository, blob};
use cairn_format::consts::PACK_TRAILER_LEN;
use cairn_format::index::IndexBlob;
use std::collections::{HashMap, HashSet};

/// A copy of a blob, whole: the pack's number in the scan and the index entry.
/// Two entries that differ in anything (id, place, length, encoding) are two
/// claims: one found true says nothing of the other.
type BlobCopy = (u32, IndexBlob);

/// Copies gathered (of blobs that have several) before they are read: a bound on
/// the memory the check holds, whatever the number of duplicates.
const CHECK_BATCH: usize = 1 << 20;
/// False copies prune holds in memory at most: beyond, it stops and asks for a
/// repair rather than spend gigabytes on a hostile index.
const MAX_FALSE_COPIES: usize = 4 << 20;

/// What the join decided, besides the counters in the scan's pack rows.
pub(super) struct Joined {
    pub used_blobs: usize,
    /// Needed blobs no kept pack holds but a pack an earlier prune retired does:
    /// deletion indexes such a pack again instead of deleting it.
    pub needed_from_pending: IdSet,
    /// Copies of needed blobs that were read and did not hold their blob.
    pub false_copies: usize,
    /// Copies of needed blobs read to check them before others were dropped.
    pub checked_copies: usize,
    needed: Spill<NEEDED>,
    rank: Vec<u32>,
    /// The copies in `false_copies`: never kept.
    bad: HashSet<BlobCopy>,
}

impl Joined {
    /// Whether the entry `b` of pack number `pack` was read and found false.
    pub fn found_false(&self, pack: u32, b: &IndexBlob) -> bool {
        !self.bad.is_empty() && self.bad.contains(&(pack, *b))
    }
}

/// The copy of a needed blob that is kept: in the best-ranked usable pack, of
/// the copies not found false (the first of equally ranked ones).
fn provider(
    copies: &[Entry],
    rank: &[u32],
    packs: &[PackRow],
    bad: &HashSet<BlobCopy>,
) -> Option<usize> {
    (0..copies.len())
        .filter(|&k| packs[copies[k].pack as usize].fits(&copies[k].blob))
        .filter(|&k| bad.is_empty() || !bad.contains(&(copies[k].pack, copies[k].blob)))
        .min_by_key(|&k| rank[copies[k].pack as usize])
}

/// A copy to read: the entry, which blob of the batch it is a copy of, and its
/// place in that blob's copies.
struct Candidate {
    blob: IndexBlob,
    of: usize,
    at: usize,
}

impl PackSpan for &Candidate {
    fn span(&self) -> (u32, u32) {
        (self.blob.offset, self.blob.length)
    }
}

/// Reads, for every needed blob with several copies, its copies in the order
/// [`provider`] prefers them until one decodes to the blob's id, and marks those
/// before it false, so that [`provider`] then chooses a copy that was read and
/// found true.
///
/// Why: an index entry is only a claim. A writer that holds the key but may
/// only add (a backup token of `cairn serve`) can store a small pack and an
/// index file claiming that it holds blobs that real packs hold. Trusting the
/// claim, prune would keep those copies and delete or repack away the real ones,
/// and every snapshot needing them would be lost. A copy decodes to its id only
/// if its bytes are the blob's (the id is a keyed hash of the plaintext), so
/// reading it settles the claim. Only blobs with several usable copies are read:
/// a blob with one loses nothing by trusting it. Legitimate duplicates (two
/// writers stored the same blob, a killed prune's repacked blobs) are read once,
/// the one copy that is kept; the memory held is bounded by [`CHECK_BATCH`].
fn check_kept_copies(
    repo: &Repository,
    scan: &mut Scan,
    needed: &mut Spill<NEEDED>,
    rank: &[u32],
) -> Result<(HashSet<BlobCopy>, usize)> {
    let mut bad: HashSet<BlobCopy> = HashSet::new();
    let mut checked = 0usize;
    // Per blob: its usable copies, best first (pack number and entry).
    let mut batch: Vec<Vec<BlobCopy>> = Vec::new();
    let mut copies = 0usize;
    join(scan, needed, &mut |j, packs| {
        if !j.needed || (j.copies.len() < 2 && !j.pending) {
            return Ok(());
        }
        let mut usable: Vec<usize> = (0..j.copies.len())
            .filter(|&k| packs[j.copies[k].pack as usize].fits(&j.copies[k].blob))
            .collect();
        // One live copy and a retired one: the live one is read too. If it is
        // false (indexed after the retiring prune by an append-only writer), the
        // retired pack is the blob's only true copy and must be indexed again,
        // not deleted.
        if usable.len() < 2 && !(j.pending && usable.len() == 1) {
            return Ok(());
        }
        // Stable: equally ranked copies stay in the order `provider` meets them.
        usable.sort_by_key(|&k| rank[j.copies[k].pack as usize]);
        copies += usable.len();
        batch.push(
            usable
                .into_iter()
                .map(|k| (j.copies[k].pack, j.copies[k].blob))
                .collect(),
        );
        if copies >= CHECK_BATCH {
            checked += read_copies(repo, packs, &mut batch, &mut bad)?;
            copies = 0;
        }
        Ok(())
    })?;
    checked += read_copies(repo, &scan.packs, &mut batch, &mut bad)?;
    Ok((bad, checked))
}

/// [`check_kept_copies`] for one batch, which it empties: rounds of reads, each
/// reading, of every blob none of whose copies was found true yet, its next copies
/// that lie in one pack (a pack's copies are next to each other in the order: one
/// rank per pack). So a blob claimed falsely many times in one pack costs one
/// round, and rounds grow only with the packs claiming it. Returns the number of
/// copies read.
fn read_copies(
    repo: &Repository,
    packs: &[PackRow],
    batch: &mut Vec<Vec<BlobCopy>>,
    bad: &mut HashSet<BlobCopy>,
) -> Result<usize> {
    let limit = range_limit(repo);
    let mut next = vec![0usize; batch.len()];
    let mut open: Vec<usize> = (0..batch.len()).collect();
    let mut read = 0usize;
    while !open.is_empty() {
        let mut by_pack: HashMap<u32, Vec<Candidate>> = HashMap::new();
        // Per open blob: where this round's run of copies (one pack's) ends.
        let mut ends: HashMap<usize, usize> = HashMap::with_capacity(open.len());
        for &of in &open {
            let copies = &batch[of][next[of]..];
            let pack = copies[0].0;
            let run = copies.iter().take_while(|c| c.0 == pack).count();
            ends.insert(of, next[of] + run);
            for (at, (_, blob)) in copies[..run].iter().enumerate() {
                by_pack.entry(pack).or_default().push(Candidate {
                    blob: *blob,
                    of,
                    at: next[of] + at,
                });
            }
        }
        // Packs are read several at a time, as a restore reads them: the reads
        // wait for the storage, the decoding keeps the cores busy.
        let groups: Vec<(u32, Vec<Candidate>)> = by_pack.into_iter().collect();
        let results = crate::threads::parallel_map(
            &groups,
            crate::ops::restore::execute::threads(),
            |(pack, list)| -> Result<Vec<(usize, usize, bool)>> {
                let mut list: Vec<&Candidate> = list.iter().collect();
                list.sort_by_key(|c| c.blob.offset);
                let row = &packs[*pack as usize];
                let id = row.id;
                // A copy its pack's own header does not list is no copy.
                let vouched = match row.stored_size {
                    Some(size) => super::vouched(repo, &id, size)?,
                    None => HashSet::new(),
                };
                let mut out = Vec::with_capacity(list.len());
                for range in ranges(&list, limit) {
                    let (start, end) = range_bounds(range);
                    let bytes = repo.read_pack_range(&id, start.into(), (end - start).into())?;
                    for c in range {
                        let b = &c.blob;
                        let at = (b.offset - start) as usize;
                        let sealed = bytes.get(at..at + b.length as usize).unwrap_or_default();
                        let key = repo.key();
                        let true_copy = vouched.contains(b)
                            && blob::decode(key, &b.id, sealed, b.raw_length, b.compression)
                                .is_ok();
                        out.push((c.of, c.at, true_copy));
                    }
                }
                Ok(out)
            },
        );
        // Blobs of which this round found a true copy. Every copy read and found
        // false is marked: `provider` then chooses a true one (the copies ranked
        // before it were all read), and the new index leaves the false ones out.
        let mut found_true: HashSet<usize> = HashSet::new();
        for result in results {
            for (of, at, true_copy) in result? {
                read += 1;
                if true_copy {
                    found_true.insert(of);
                } else {
                    bad.insert(batch[of][at]);
                }
            }
        }
        if bad.len() > MAX_FALSE_COPIES {
            return Err(Error::Invalid(format!(
                "more than {MAX_FALSE_COPIES} index entries name blobs their packs do not \
                 hold; run `cairn check --read-data` and `cairn repair index` before prune"
            )));
        }
        let mut still = Vec::new();
        for of in open {
            if found_true.contains(&of) {
                continue;
            }
            next[of] = ends[&of];
            if next[of] < batch[of].len() {
                still.push(of);
            }
        }
        open = still;
    }
    batch.clear();
    Ok(read)
}

/// Counts, per pack, its blobs, their extent and how many are needed; ranks the
/// packs (entirely needed first, then the fullest); then chooses each needed
/// blob's kept copy (reading it first when the blob has others, see
/// [`check_kept_copies`]) and adds up the bytes used and unused per pack. Fails
/// when a needed blob has no readable copy and no retired pack holds it.
pub(super) fn join_needed(repo: &Repository, scan: &mut Scan, needed: Needed) -> Result<Joined> {
    let mut needed = needed.into_spill()?;
    let mut several = 0usize;
    join(scan, &mut needed, &mut |j, packs| {
        let (copies, is_needed) = (j.copies, j.needed);
        if is_needed && (copies.len() > 1 || j.pending && !copies.is_empty()) {
            several += 1;
        }
        for e in copies {
            let row = &mut packs[e.pack as usize];
            row.blobs += 1;
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
    // One more pass over the index, only when some needed blob has copies to
    // choose between.
    let (bad, checked_copies) = if several > 0 {
        check_kept_copies(repo, scan, &mut needed, &rank)?
    } else {
        (HashSet::new(), 0)
    };
    let mut used_blobs = 0;
    let mut needed_from_pending = IdSet::default();
    join(scan, &mut needed, &mut |j, packs| {
        let (id, copies, is_needed) = (j.id, j.copies, j.needed);
        let kept = if is_needed {
            used_blobs += 1;
            provider(copies, &rank, packs, &bad)
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
                row.used_blobs += 1;
            } else {
                row.unused_bytes += u64::from(e.blob.length);
            }
        }
        Ok(())
    })?;
    // Entries of one pack can claim the same bytes (an append-only writer can
    // list a pack's blobs again under other lengths or ids): counted as unused,
    // they would make every prune repack the whole repository. A pack's unused
    // bytes are at most what its used blobs leave of it.
    for row in &mut scan.packs {
        if let Some(size) = row.stored_size {
            let free = size.saturating_sub(row.used_bytes + PACK_TRAILER_LEN as u64);
            row.unused_bytes = row.unused_bytes.min(free);
        }
    }
    Ok(Joined {
        used_blobs,
        needed_from_pending,
        false_copies: bad.len(),
        checked_copies,
        needed,
        rank,
        bad,
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
        if let Some(k) = provider(copies, &rank, packs, &joined.bad)
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
