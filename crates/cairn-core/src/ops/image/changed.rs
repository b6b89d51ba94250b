//! Changed-block lists (`backup --image --changed-blocks FILE`): which byte ranges of
//! a disk changed since the parent snapshot, as change-tracking tools report them.
//! Only those ranges are read; every other block is the parent's.
//!
//! A list is untrusted input: ranges past the end of the source are refused (the
//! list is for another disk or another size), and unsorted or overlapping ranges are
//! sorted and merged. A list that leaves out a changed range cannot be detected
//! here: the snapshot would hold the parent's bytes there. That is the contract of
//! changed-block tracking, and why the docs say where each format comes from.

use crate::error::{Error, Result};

/// The formats understood (`--changed-blocks-format`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ChangedFormat {
    /// Decided from the first non-blank character: `[` JSON, `<` thin_delta XML,
    /// anything else text ranges.
    Auto,
    /// Text: one `OFFSET LENGTH` pair per line (or `OFFSET,LENGTH`, as a CSV
    /// export writes it), in bytes, decimal or `0x` hex; blank lines and `#`
    /// comments ignored.
    Ranges,
    /// JSON: `[{"offset": N, "length": N}, ...]` (`start` is taken for `offset`, not beside it;
    /// an entry with `"dirty": false` is skipped).
    Json,
    /// `qemu-img map --output=json` over a dirty bitmap (`x-dirty-bitmap=...`):
    /// qemu reports dirty extents as `"data": false` there.
    QemuDirtyMap,
    /// `thin_delta` XML (LVM thin snapshots): `different`, `left_only` and
    /// `right_only` ranges, in units of the pool's `data_block_size` sectors.
    ThinDelta,
}

impl std::str::FromStr for ChangedFormat {
    type Err = String;
    fn from_str(s: &str) -> std::result::Result<Self, String> {
        Ok(match s {
            "auto" => ChangedFormat::Auto,
            "ranges" | "text" => ChangedFormat::Ranges,
            "json" => ChangedFormat::Json,
            "qemu-dirty-map" => ChangedFormat::QemuDirtyMap,
            "thin-delta" => ChangedFormat::ThinDelta,
            other => {
                return Err(format!(
                    "unknown changed-block format {other:?} (auto, ranges, json, qemu-dirty-map, thin-delta)"
                ));
            }
        })
    }
}

/// Sorted, merged, non-empty byte ranges `[start, end)`.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct ChangedRanges {
    ranges: Vec<(u64, u64)>,
}

/// Bytes of list read at most (a list of 16 M ranges is far beyond any real one).
const MAX_LIST_BYTES: u64 = 1 << 30;

impl ChangedRanges {
    /// Reads and checks a list against the source's size.
    pub fn load(path: &std::path::Path, format: ChangedFormat, size: u64) -> Result<Self> {
        use std::io::Read;
        let unreadable = |e: std::io::Error| {
            Error::Invalid(format!(
                "changed-block list {}: {}",
                path.display(),
                if e.kind() == std::io::ErrorKind::InvalidData {
                    "not text (a list of ranges, JSON or thin_delta XML)".to_string()
                } else {
                    e.to_string()
                }
            ))
        };
        // `-` is standard input (`thin_delta ... | cairn backup --changed-blocks -`).
        let f: Box<dyn Read> = if path == std::path::Path::new("-") {
            Box::new(std::io::stdin().lock())
        } else {
            Box::new(std::fs::File::open(path).map_err(unreadable)?)
        };
        let mut text = String::new();
        f.take(MAX_LIST_BYTES + 1)
            .read_to_string(&mut text)
            .map_err(unreadable)?;
        if text.len() as u64 > MAX_LIST_BYTES {
            return Err(Error::Invalid(format!(
                "changed-block list {}: larger than 1 GiB",
                path.display()
            )));
        }
        Self::parse(&text, format, size)
            .map_err(|e| Error::Invalid(format!("changed-block list {}: {e}", path.display())))
    }

    pub fn parse(
        text: &str,
        format: ChangedFormat,
        size: u64,
    ) -> std::result::Result<Self, String> {
        let format = match format {
            ChangedFormat::Auto => match text.trim_start().chars().next() {
                Some('[') => {
                    if text.contains("\"dirty\"") || !text.contains("\"data\"") {
                        ChangedFormat::Json
                    } else {
                        // Plain `qemu-img map` output lists allocated extents as
                        // `"data": true`; over a dirty bitmap, dirty ones as
                        // `"data": false`. Guessing wrong would read the wrong half.
                        return Err("this looks like `qemu-img map` output: say \
                                    --changed-blocks-format qemu-dirty-map if it was made over a \
                                    dirty bitmap (x-dirty-bitmap)"
                            .into());
                    }
                }
                Some('<') => ChangedFormat::ThinDelta,
                Some('{') => {
                    return Err("a JSON object: the json format is an array of ranges \
                                ([{\"offset\": N, \"length\": N}, ...])"
                        .into());
                }
                _ => ChangedFormat::Ranges,
            },
            f => f,
        };
        let raw = match format {
            ChangedFormat::Ranges | ChangedFormat::Auto => parse_text(text)?,
            ChangedFormat::Json => parse_json(text, false)?.0,
            ChangedFormat::QemuDirtyMap => {
                let (ranges, covered) = parse_qemu_map(text)?;
                // qemu maps the whole disk, clean and dirty extents alike: a map
                // that ends elsewhere is of another disk (or of this one before it
                // was resized), and what it leaves out would be taken as unchanged.
                // qemu counts in 512-byte sectors: a size between is rounded up.
                if covered < size || covered > size.div_ceil(512) * 512 {
                    return Err(format!(
                        "the map covers {covered} bytes but the source is {size} bytes: \
                         is it for this disk, made after its last resize?"
                    ));
                }
                ranges
                    .into_iter()
                    .filter(|&(off, _)| off < size)
                    .map(|(off, len)| (off, len.min(size - off)))
                    .collect()
            }
            ChangedFormat::ThinDelta => {
                // thin_delta counts in the pool's chunks: a thin volume whose size
                // is not a multiple of them has a last chunk that runs past its
                // end, and a change there is listed whole. Cut at the end; a
                // range further out is of another volume, and refused below.
                let (ranges, unit) = parse_thin_delta(text)?;
                ranges
                    .into_iter()
                    .map(|(off, len)| match off.checked_add(len) {
                        Some(end) if off < size && end > size && end - size < unit => {
                            (off, size - off)
                        }
                        _ => (off, len),
                    })
                    .collect()
            }
        };
        Self::from_ranges(raw, size)
    }

    /// `(offset, length)` pairs, in any order, checked against `size`.
    pub fn from_ranges(
        raw: Vec<(u64, u64)>,
        size: u64,
    ) -> std::result::Result<ChangedRanges, String> {
        let mut v = Vec::with_capacity(raw.len());
        for (off, len) in raw {
            if len == 0 {
                // Nothing changed there, but a place past the end says the list
                // is not for this source, as a longer range would.
                if off > size {
                    return Err(format!(
                        "range {off}+0 starts past the end of the source ({size} bytes): \
                         is the list for this disk?"
                    ));
                }
                continue;
            }
            let end = off
                .checked_add(len)
                .ok_or_else(|| format!("range {off}+{len} overflows"))?;
            if end > size {
                return Err(format!(
                    "range {off}+{len} ends past the end of the source ({size} bytes): \
                     is the list for this disk?"
                ));
            }
            v.push((off, end));
        }
        v.sort_unstable();
        let mut out: Vec<(u64, u64)> = Vec::with_capacity(v.len());
        for (s, e) in v {
            match out.last_mut() {
                Some(last) if s <= last.1 => last.1 = last.1.max(e),
                _ => out.push((s, e)),
            }
        }
        Ok(ChangedRanges { ranges: out })
    }

    /// Whether any changed byte lies in `[start, end)`.
    pub fn intersects(&self, start: u64, end: u64) -> bool {
        let i = self.ranges.partition_point(|r| r.1 <= start);
        self.ranges.get(i).is_some_and(|r| r.0 < end)
    }

    /// Bytes of the blocks of `block` bytes the list touches, up to `size` (what
    /// a backup reads for it).
    pub fn block_bytes(&self, block: u64, size: u64) -> u64 {
        let block = block.max(1);
        let (mut total, mut end_so_far) = (0u64, 0u64);
        for &(s, e) in &self.ranges {
            let start = (s / block * block).max(end_so_far);
            let end = e.div_ceil(block).saturating_mul(block).min(size);
            if end > start {
                total += end - start;
                end_so_far = end;
            }
        }
        total
    }

    /// Bytes named by the list.
    pub fn bytes(&self) -> u64 {
        self.ranges.iter().map(|r| r.1 - r.0).sum()
    }

    pub fn ranges(&self) -> &[(u64, u64)] {
        &self.ranges
    }
}

fn number(s: &str) -> std::result::Result<u64, String> {
    let s = s.trim();
    let r = match s.strip_prefix("0x").or_else(|| s.strip_prefix("0X")) {
        Some(h) => u64::from_str_radix(h, 16),
        None => s.parse(),
    };
    r.map_err(|_| format!("{s:?} is not a byte count"))
}

fn parse_text(text: &str) -> std::result::Result<Vec<(u64, u64)>, String> {
    let mut out = Vec::new();
    for (n, line) in text.lines().enumerate() {
        let line = line.split('#').next().unwrap_or("").trim();
        if line.is_empty() {
            continue;
        }
        let mut it = line
            .split(|c: char| c.is_whitespace() || c == ',')
            .filter(|s| !s.is_empty());
        let (Some(a), Some(b), None) = (it.next(), it.next(), it.next()) else {
            return Err(format!("line {}: expected `OFFSET LENGTH`", n + 1));
        };
        out.push((
            number(a).map_err(|e| format!("line {}: {e}", n + 1))?,
            number(b).map_err(|e| format!("line {}: {e}", n + 1))?,
        ));
    }
    Ok(out)
}

/// The dirty ranges of a `qemu-img map` over a dirty bitmap, and how many bytes
/// the map covers: its extents must follow each other from 0 without gaps.
fn parse_qemu_map(text: &str) -> std::result::Result<(Vec<(u64, u64)>, u64), String> {
    let (dirty, extents) = parse_json(text, true)?;
    let mut end = 0u64;
    for (i, (off, len)) in extents.into_iter().enumerate() {
        if off != end {
            return Err(format!(
                "entry {i} starts at {off}, not where the one before ended ({end}): \
                 a qemu-img map lists the whole disk in order"
            ));
        }
        end = off
            .checked_add(len)
            .ok_or_else(|| format!("entry {i}: {off}+{len} overflows"))?;
    }
    Ok((dirty, end))
}

/// One entry of a JSON list, an object whose members are each given once: of
/// `{"offset": 0, "offset": 4096}` no one can say which the tool meant (a JSON
/// map would keep the last silently).
struct Members(serde_json::Map<String, serde_json::Value>);

impl<'de> serde::Deserialize<'de> for Members {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> std::result::Result<Self, D::Error> {
        struct Each;
        impl<'de> serde::de::Visitor<'de> for Each {
            type Value = Members;
            fn expecting(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
                f.write_str("an object")
            }
            fn visit_map<A: serde::de::MapAccess<'de>>(
                self,
                mut m: A,
            ) -> std::result::Result<Members, A::Error> {
                let mut out = serde_json::Map::new();
                while let Some((k, v)) = m.next_entry::<String, serde_json::Value>()? {
                    if out.contains_key(&k) {
                        return Err(serde::de::Error::custom(format!(
                            "an entry gives \"{k}\" twice"
                        )));
                    }
                    out.insert(k, v);
                }
                Ok(Members(out))
            }
        }
        d.deserialize_map(Each)
    }
}

/// The dirty ranges of a JSON list, and every entry's `(offset, length)`.
#[allow(clippy::type_complexity)]
fn parse_json(
    text: &str,
    qemu: bool,
) -> std::result::Result<(Vec<(u64, u64)>, Vec<(u64, u64)>), String> {
    let v: Vec<Members> =
        serde_json::from_str(text).map_err(|e| format!("not a JSON array of ranges: {e}"))?;
    let mut out = Vec::with_capacity(v.len());
    let mut all = Vec::with_capacity(if qemu { v.len() } else { 0 });
    for (i, Members(e)) in v.iter().enumerate() {
        // The first of `names` the entry has, which must be a byte count.
        let field = |names: &[&str]| -> std::result::Result<u64, String> {
            let Some((k, v)) = names.iter().find_map(|k| e.get(*k).map(|v| (k, v))) else {
                let names: Vec<String> = names.iter().map(|k| format!("{k:?}")).collect();
                return Err(format!("entry {i}: no {}", names.join(" or ")));
            };
            v.as_u64().ok_or_else(|| {
                format!("entry {i}: \"{k}\" is {v}, not a byte count (a whole number from 0)")
            })
        };
        // In `qemu-img map` output `start` is the guest offset and `offset` where
        // the data lies in the image file.
        let off = if qemu {
            field(&["start", "offset"])?
        } else if e.get("offset").is_some() && e.get("start").is_some() {
            // Which one is the disk's offset? In `qemu-img map` output it is
            // `start`; guessing wrong reads the wrong blocks (QA).
            return Err(format!(
                "entry {i} has both \"offset\" and \"start\": give one (the offset in \
                 the disk), or --changed-blocks-format qemu-dirty-map for qemu-img's map"
            ));
        } else {
            field(&["offset", "start"])?
        };
        let len = field(&["length"])?;
        let dirty = if qemu {
            match e.get("data") {
                Some(serde_json::Value::Bool(data)) => !data,
                Some(other) => {
                    return Err(format!("entry {i}: \"data\" is {other}, not true or false"));
                }
                None => return Err(format!("entry {i}: no \"data\" member")),
            }
        } else {
            e.get("dirty")
                .and_then(serde_json::Value::as_bool)
                .unwrap_or(true)
        };
        if dirty {
            out.push((off, len));
        }
        if qemu {
            all.push((off, len));
        }
    }
    Ok((out, all))
}

/// The value of `name="..."` in one XML tag.
fn attr(tag: &str, name: &str) -> Option<String> {
    let pat = format!("{name}=\"");
    let mut from = 0;
    while let Some(i) = tag[from..].find(&pat) {
        let at = from + i;
        let before = tag[..at].chars().last();
        if before.is_none_or(char::is_whitespace) {
            let rest = &tag[at + pat.len()..];
            return rest.find('"').map(|j| rest[..j].to_string());
        }
        from = at + pat.len();
    }
    None
}

/// `thin_delta`'s XML. A list that says less than the changes lets the backup take
/// changed blocks from the parent, so only a whole document counts: every tag
/// closed, the `<diff>` and the `<superblock>` closed at the end, and no element
/// `thin_delta` does not write (a cut-off or hand-edited file is refused).
/// The ranges in bytes, and the pool's chunk size they are counted in.
fn parse_thin_delta(text: &str) -> std::result::Result<(Vec<(u64, u64)>, u64), String> {
    let mut unit: Option<u64> = None;
    let mut out = Vec::new();
    let (mut diff_closed, mut superblock_closed) = (false, false);
    for piece in text.split('<').skip(1) {
        let Some((tag, _)) = piece.split_once('>') else {
            return Err(format!(
                "the document ends inside a tag (<{}): the list is cut off",
                piece.trim_end()
            ));
        };
        if superblock_closed && !tag.starts_with("!--") {
            return Err("elements after </superblock>".into());
        }
        let name = tag
            .split(|c: char| c.is_whitespace() || c == '/')
            .next()
            .unwrap_or("");
        if let Some(closing) = tag.strip_prefix('/') {
            match closing.trim() {
                "diff" => diff_closed = true,
                "superblock" => superblock_closed = true,
                other => return Err(format!("</{other}> is not thin_delta output")),
            }
            continue;
        }
        match name {
            "superblock" => {
                let sectors =
                    attr(tag, "data_block_size").ok_or("the superblock has no data_block_size")?;
                let sectors = number(&sectors)?;
                if sectors == 0 {
                    return Err("data_block_size is 0".into());
                }
                unit = Some(
                    sectors
                        .checked_mul(512)
                        .ok_or("data_block_size past any disk size")?,
                );
            }
            "different" | "left_only" | "right_only" => {
                let unit = unit.ok_or("a range before the superblock (no data_block_size)")?;
                let begin = number(&attr(tag, "begin").ok_or("a range without begin")?)?;
                let length = number(&attr(tag, "length").unwrap_or_else(|| "1".into()))?;
                let off = begin
                    .checked_mul(unit)
                    .ok_or("a range past any disk size")?;
                let len = length
                    .checked_mul(unit)
                    .ok_or("a range past any disk size")?;
                out.push((off, len));
            }
            "diff" | "same" => {}
            _ if tag.starts_with("?xml") || tag.starts_with("!--") => {}
            other => return Err(format!("<{other}> is not thin_delta output")),
        }
    }
    let Some(unit) = unit else {
        return Err("no <superblock data_block_size=...> found: not thin_delta output".into());
    };
    if !diff_closed || !superblock_closed {
        return Err(
            "the document does not end with </diff></superblock>: the list is cut off".into(),
        );
    }
    Ok((out, unit))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn text_is_sorted_merged_and_checked() {
        let t = "# changed\n8192 4096\n0x0 100\n\n50 100 # overlaps\n1000000 0\n";
        let r = ChangedRanges::parse(t, ChangedFormat::Auto, 1 << 20).unwrap();
        assert_eq!(r.ranges(), &[(0, 150), (8192, 12288)]);
        assert!(r.intersects(149, 200));
        assert!(!r.intersects(150, 8192));
        assert!(r.intersects(12287, 99999));
        assert_eq!(r.bytes(), 150 + 4096);
        // Blocks of 4 KiB: [0, 4096) and [8192, 12288); of 100 KiB: one block.
        assert_eq!(r.block_bytes(4096, 1 << 20), 8192);
        assert_eq!(r.block_bytes(100 << 10, 1 << 20), 100 << 10);
        assert_eq!(r.block_bytes(4096, 10_000), 4096 + (10_000 - 8192));
        let e = ChangedRanges::parse("0 4097\n", ChangedFormat::Ranges, 4096).unwrap_err();
        assert!(e.contains("past the end"), "{e}");
        let e = ChangedRanges::parse("8192 0\n", ChangedFormat::Ranges, 4096).unwrap_err();
        assert!(e.contains("past the end"), "{e}");
        assert!(ChangedRanges::parse("4096 0\n", ChangedFormat::Ranges, 4096).is_ok());
        let e = ChangedRanges::parse("12 x\n", ChangedFormat::Ranges, 4096).unwrap_err();
        assert!(e.contains("line 1"), "{e}");
        let e = ChangedRanges::parse(&format!("{} 2\n", u64::MAX), ChangedFormat::Ranges, 9)
            .unwrap_err();
        assert!(e.contains("overflows"), "{e}");
    }

    #[test]
    fn json_and_qemu_maps() {
        let j = r#"[{"offset": 4096, "length": 4096}, {"start": 0, "length": 10, "dirty": false}]"#;
        let r = ChangedRanges::parse(j, ChangedFormat::Auto, 1 << 20).unwrap();
        assert_eq!(r.ranges(), &[(4096, 8192)]);
        let q = r#"[{"start": 0, "length": 65536, "depth": 0, "present": true, "zero": false, "data": true, "offset": 0},
                    {"start": 65536, "length": 65536, "depth": 0, "present": false, "zero": true, "data": false}]"#;
        // Ambiguous without the format: plain map output means the opposite.
        assert!(ChangedRanges::parse(q, ChangedFormat::Auto, 1 << 20).is_err());
        let r = ChangedRanges::parse(q, ChangedFormat::QemuDirtyMap, 131072).unwrap();
        assert_eq!(r.ranges(), &[(65536, 131072)]);
        // A map of another size of disk, or with a hole, would leave changes out.
        let e = ChangedRanges::parse(q, ChangedFormat::QemuDirtyMap, 1 << 20).unwrap_err();
        assert!(
            e.contains("covers 131072 bytes but the source is 1048576"),
            "{e}"
        );
        // A raw image of 131000 bytes is mapped as 256 whole sectors.
        let r = ChangedRanges::parse(q, ChangedFormat::QemuDirtyMap, 131_000).unwrap();
        assert_eq!(r.ranges(), &[(65536, 131_000)]);
        let gap = q.replace("\"start\": 65536", "\"start\": 70000");
        let e = ChangedRanges::parse(&gap, ChangedFormat::QemuDirtyMap, 135536).unwrap_err();
        assert!(e.contains("entry 1 starts at 70000"), "{e}");
        // A "data" that is there but not a boolean is said as such (QA r23: it
        // was "no data member").
        let quoted = q.replace("\"data\": false", "\"data\": \"false\"");
        let e = ChangedRanges::parse(&quoted, ChangedFormat::QemuDirtyMap, 131072).unwrap_err();
        assert!(
            e.contains("entry 1: \"data\" is \"false\", not true or false"),
            "{e}"
        );
        // What is wrong is said: a value that is not a byte count, a missing member,
        // an object where an array belongs.
        for (bad, says) in [
            (
                r#"[{"offset": -1, "length": 10}]"#,
                "\"offset\" is -1, not a byte count",
            ),
            (
                r#"[{"start": 1.5, "length": 10}]"#,
                "\"start\" is 1.5, not a byte count",
            ),
            (r#"[{"length": 10}]"#, "entry 0: no \"offset\" or \"start\""),
            (
                r#"[{"start": 409600, "length": 4096, "offset": 5308416}]"#,
                "entry 0 has both \"offset\" and \"start\"",
            ),
            (r#"[{"offset": 0, "length": "9"}]"#, "\"length\" is \"9\""),
            (r#"{"offset": 0, "length": 9}"#, "a JSON object"),
            (
                r#"[{"offset": 0, "length": 9, "offset": 4096}]"#,
                "an entry gives \"offset\" twice",
            ),
        ] {
            let e = ChangedRanges::parse(bad, ChangedFormat::Auto, 1 << 20).unwrap_err();
            assert!(e.contains(says), "{bad}: {e}");
        }
    }

    #[test]
    fn thin_delta() {
        let x = r#"<superblock uuid="" time="1" transaction="2" data_block_size="128" nr_data_blocks="100">
  <diff left="1" right="2">
    <same begin="0" length="4"/>
    <different begin="4" length="2"/>
    <right_only begin="10" length="1"/>
  </diff>
</superblock>"#;
        let r = ChangedRanges::parse(x, ChangedFormat::Auto, 100 * 65536).unwrap();
        assert_eq!(
            r.ranges(),
            &[(4 * 65536, 6 * 65536), (10 * 65536, 11 * 65536)]
        );
        assert!(ChangedRanges::parse("<diff/>", ChangedFormat::ThinDelta, 10).is_err());
        // A volume that ends inside its last pool chunk: a change there is cut at
        // the end; one a chunk further out is of another volume.
        let size = 10 * 65536 + 1000;
        let r = ChangedRanges::parse(x, ChangedFormat::Auto, size).unwrap();
        assert_eq!(r.ranges(), &[(4 * 65536, 6 * 65536), (10 * 65536, size)]);
        assert!(ChangedRanges::parse(x, ChangedFormat::Auto, 10 * 65536).is_err());
        // Cut off anywhere, or holding what thin_delta never writes: refused.
        let cut = x.find("</diff>").unwrap();
        for bad in [
            &x[..cut],
            &x[..x.find("length=\"2\"").unwrap()],
            &x[..x.rfind('<').unwrap()],
            r#"<superblock data_block_size="128">"#,
            &x.replace("<same", "<bogus"),
            &format!("{x}<different begin=\"1\"/>"),
        ] {
            assert!(
                ChangedRanges::parse(bad, ChangedFormat::Auto, 100 * 65536).is_err(),
                "{bad}"
            );
        }
    }
}
