//! Sizes for people: the one formatter behind the engine's messages and the CLI.

/// `n` and a noun in the number it takes ("1 snapshot", "2 snapshots", "3 entries").
pub fn count(n: u64, noun: &str) -> String {
    if n == 1 {
        format!("1 {noun}")
    } else if noun.ends_with(['s', 'x']) || noun.ends_with("sh") || noun.ends_with("ch") {
        format!("{n} {noun}es")
    } else if let Some(stem) = noun.strip_suffix("ry") {
        format!("{n} {stem}ries")
    } else {
        format!("{n} {noun}s")
    }
}

/// A span of time in words, to the unit that says it: "40 s", "12 min", "2 h 5
/// min", "3 days".
pub fn duration_words(secs: u64) -> String {
    match secs {
        0..120 => format!("{secs} s"),
        120..7200 => format!("{} min", secs / 60),
        7200..172_800 => match (secs / 3600, secs % 3600 / 60) {
            (h, 0) => format!("{h} h"),
            (h, m) => format!("{h} h {m} min"),
        },
        _ => count(secs / 86_400, "day"),
    }
}

/// "1 pack is", "2 packs are".
pub fn count_is(n: u64, noun: &str) -> String {
    format!("{} {}", count(n, noun), if n == 1 { "is" } else { "are" })
}

/// `n` bytes in binary units with `decimals` places ("1.5 GiB"; plain bytes below
/// 1 KiB).
pub fn bytes(n: u64, decimals: usize) -> String {
    const UNITS: [&str; 6] = ["B", "KiB", "MiB", "GiB", "TiB", "PiB"];
    let mut v = n as f64;
    let mut u = 0;
    // Up a unit also where the value would be printed as 1024 of this one
    // (1 GiB - 1 byte read "1024.00 MiB", QA).
    let limit = 1024.0 - 0.5 / 10f64.powi(decimals.min(9) as i32);
    while v >= 1024.0 && u + 1 < UNITS.len() || u > 0 && v >= limit && u + 1 < UNITS.len() {
        v /= 1024.0;
        u += 1;
    }
    if u == 0 {
        format!("{n} B")
    } else {
        format!("{v:.decimals$} {}", UNITS[u])
    }
}

/// A size: a number with K, M, G or T (binary units, a B after them optional:
/// `512K`, `1.5G`), or bytes.
pub fn parse_size(s: &str) -> Result<u64, String> {
    let bad = || format!("invalid size {s:?}: use a number with K, M, G or T");
    let t = s.trim();
    let t = t
        .strip_suffix(['B', 'b'])
        .filter(|r| !r.is_empty())
        .unwrap_or(t);
    // `80MiB` as well as `80M` and `80MB` (binary units, whichever spelling).
    let t = t
        .strip_suffix('i')
        .filter(|r| r.ends_with(|c: char| c.is_ascii_alphabetic()))
        .unwrap_or(t);
    let (num, mult) = match t.char_indices().last() {
        Some((i, c)) if c.is_ascii_alphabetic() => {
            let m: u64 = match c.to_ascii_uppercase() {
                'K' => 1 << 10,
                'M' => 1 << 20,
                'G' => 1 << 30,
                'T' => 1 << 40,
                _ => return Err(bad()),
            };
            (&t[..i], m)
        }
        _ => (t, 1),
    };
    let v: f64 = num.trim().parse().map_err(|_| bad())?;
    if !v.is_finite() || v < 0.0 {
        return Err(format!("invalid size {s:?}"));
    }
    let bytes = v * mult as f64;
    // Past 2^64 bytes the cast would quietly give 16 EiB.
    if bytes >= u64::MAX as f64 {
        return Err(format!("size {s:?} is too large"));
    }
    Ok(bytes as u64)
}

/// A transfer rate in bytes per second: `500K`, `5M`, `1.5G` (binary units, with an
/// optional `B`, `iB` or `/s`: `5MiB/s`), a plain number of bytes, or bits per second
/// with `bit` (`100Mbit`, `1Gbit`: decimal, as network links are sold). Zero and
/// negative rates are refused: "no limit" is leaving the flag out.
pub fn parse_rate(s: &str) -> Result<u64, String> {
    let bad = || {
        format!(
            "rate {s:?}: use bytes per second (500K, 5M, 1G, or a number) or bits per second (100Mbit)"
        )
    };
    let t = s.trim();
    let t = t.strip_suffix("/s").unwrap_or(t).trim();
    let lower = t.to_ascii_lowercase();
    let (num, mult) = if let Some(n) = lower
        .strip_suffix("bit")
        .or_else(|| lower.strip_suffix("bps"))
    {
        let (n, m) = match n.chars().last() {
            Some('k') => (&n[..n.len() - 1], 1e3),
            Some('m') => (&n[..n.len() - 1], 1e6),
            Some('g') => (&n[..n.len() - 1], 1e9),
            _ => (n, 1.0),
        };
        (n.to_string(), m / 8.0)
    } else {
        let n = lower
            .strip_suffix("ib")
            .or_else(|| lower.strip_suffix('b'))
            .unwrap_or(&lower);
        match n.chars().last() {
            Some('k') => (n[..n.len() - 1].to_string(), 1024.0),
            Some('m') => (n[..n.len() - 1].to_string(), 1024.0 * 1024.0),
            Some('g') => (n[..n.len() - 1].to_string(), 1024.0 * 1024.0 * 1024.0),
            _ => (n.to_string(), 1.0),
        }
    };
    let v: f64 = num.trim().parse().map_err(|_| bad())?;
    if !v.is_finite() {
        return Err(bad());
    }
    if v <= 0.0 {
        return Err(format!(
            "rate {s:?}: a rate must be above 0 (leave the limit out for none)"
        ));
    }
    // Below 1 KiB/s one pack takes days: a typo (`0.1`, `1bit`), not a limit.
    let rate = v * mult;
    if rate < 1024.0 {
        return Err(format!(
            "rate {s:?} is below 1K (1024 bytes per second): give 1K or more"
        ));
    }
    if rate >= u64::MAX as f64 {
        return Err(format!("rate {s:?} is too large"));
    }
    Ok(rate as u64)
}

#[cfg(test)]
mod tests {
    #[test]
    fn durations_in_words() {
        use super::duration_words as w;
        assert_eq!(w(40), "40 s");
        assert_eq!(w(720), "12 min");
        assert_eq!(w(7200), "2 h");
        assert_eq!(w(7500), "2 h 5 min");
        assert_eq!(w(3 * 86_400 + 5), "3 days");
    }

    #[test]
    fn sizes_with_and_without_units() {
        use super::parse_size;
        assert_eq!(parse_size("512K"), Ok(512 << 10));
        assert_eq!(parse_size("512KB"), Ok(512 << 10));
        assert_eq!(parse_size("1.5G"), Ok(3 << 29));
        assert_eq!(parse_size("100"), Ok(100));
        assert_eq!(parse_size("100B"), Ok(100));
        assert_eq!(parse_size("80MiB"), Ok(80 << 20));
        assert_eq!(parse_size("2GiB"), Ok(2 << 30));
        assert!(parse_size("iB").is_err());
        assert!(parse_size("80i").is_err());
        assert!(parse_size("B").is_err());
        assert!(parse_size("12X").is_err());
        assert!(parse_size("-1M").is_err());
    }

    #[test]
    fn rates_in_bytes_and_bits() {
        use super::parse_rate;
        assert_eq!(parse_rate("5M"), Ok(5 << 20));
        assert_eq!(parse_rate("5MiB/s"), Ok(5 << 20));
        assert_eq!(parse_rate("500k"), Ok(500 << 10));
        assert_eq!(parse_rate("1048576"), Ok(1 << 20));
        assert_eq!(parse_rate("100Mbit"), Ok(12_500_000));
        assert_eq!(parse_rate("1 Gbit/s"), Ok(125_000_000));
        assert!(parse_rate("0").unwrap_err().contains("above 0"));
        assert!(parse_rate("-5M").unwrap_err().contains("above 0"));
        assert!(parse_rate("5X").unwrap_err().contains("bits per second"));
        assert_eq!(parse_rate("1K"), Ok(1024));
        for tiny in ["0.1", "1bit", "1e-300", "0.0001K", "1000"] {
            assert!(parse_rate(tiny).unwrap_err().contains("below 1K"), "{tiny}");
        }
        assert!(parse_rate("1e30G").unwrap_err().contains("too large"));
        assert!(
            super::parse_size("99999999999999999999T")
                .unwrap_err()
                .contains("too large")
        );
    }

    #[test]
    fn binary_units() {
        assert_eq!(super::bytes(512, 2), "512 B");
        assert_eq!(super::bytes(1536, 1), "1.5 KiB");
        assert_eq!(super::bytes(3 << 30, 2), "3.00 GiB");
    }
}

/// A duration as restic's (Go's) read: `30s`, `10m`, `1h30m`, `500ms`, `1.5h`,
/// `2d`, or a bare number of seconds; at most 100 years, never negative.
pub fn parse_duration(s: &str) -> Result<std::time::Duration, String> {
    parse_duration_as_written(s).map_err(|e| {
        // `1D`, `6H`: the unit meant is plain; said rather than refused blankly
        // (while a stray space is forgiven).
        let lower = s.trim().to_ascii_lowercase();
        if lower != s.trim() && parse_duration_as_written(&lower).is_ok() {
            format!("invalid duration {s:?}: units are written in lower case ({lower})")
        } else {
            e
        }
    })
}

fn parse_duration_as_written(s: &str) -> Result<std::time::Duration, String> {
    let bad = || {
        format!(
            "invalid duration {s:?}: use a number with ms, s, m, h or d, or several \
             (30s, 10m, 1h30m, 2d; at most 100 years)"
        )
    };
    let t = s.trim();
    // A bare number is seconds.
    if let Ok(v) = t.parse::<f64>() {
        return seconds(v).ok_or_else(bad);
    }
    // As Go's durations read (restic's): `1h30m`, `500ms`, `1.5h`.
    let mut total = 0.0;
    let mut rest = t;
    if rest.is_empty() {
        return Err(bad());
    }
    while !rest.is_empty() {
        let num_end = rest
            .find(|c: char| !(c.is_ascii_digit() || c == '.'))
            .ok_or_else(bad)?;
        let v: f64 = rest[..num_end].parse().map_err(|_| bad())?;
        rest = &rest[num_end..];
        let unit_end = rest
            .find(|c: char| c.is_ascii_digit() || c == '.')
            .unwrap_or(rest.len());
        let per = match &rest[..unit_end] {
            "ms" => 0.001,
            "s" => 1.0,
            "m" => 60.0,
            "h" => 3600.0,
            "d" => 86400.0,
            _ => return Err(bad()),
        };
        total += v * per;
        rest = &rest[unit_end..];
    }
    seconds(total).ok_or_else(bad)
}

/// `v` seconds as a duration, within 100 years (a longer wait is a typo, and
/// past what a `Duration` from a float holds it would not be one at all).
fn seconds(v: f64) -> Option<std::time::Duration> {
    const MAX: f64 = 100.0 * 366.0 * 86400.0;
    (v.is_finite() && (0.0..=MAX).contains(&v)).then(|| std::time::Duration::from_secs_f64(v))
}

#[cfg(test)]
mod duration_tests {
    use super::parse_duration;
    use std::time::Duration;

    #[test]
    fn durations_read_as_restic_reads_them_and_stay_bounded() {
        for (text, secs) in [
            ("30", 30.0),
            ("30s", 30.0),
            ("10m", 600.0),
            ("2h", 7200.0),
            ("1h30m", 5400.0),
            ("2h45m30s", 9930.0),
            ("1.5h", 5400.0),
            ("500ms", 0.5),
            ("2d", 172_800.0),
            (" 0 ", 0.0),
        ] {
            assert_eq!(
                parse_duration(text).unwrap(),
                Duration::from_secs_f64(secs),
                "{text}"
            );
        }
        // Refused with a message, never a panic (QA: huge ones panicked).
        for bad in [
            "",
            "x",
            "5y",
            "-5s",
            "1e30",
            "1e30s",
            "18446744073709551615s",
            "5124095576030431h",
            "inf",
            "NaN",
            "1h30",
            "h",
            "1..5s",
        ] {
            let e = parse_duration(bad).unwrap_err();
            assert!(e.contains("invalid duration"), "{bad}: {e}");
            assert!(!e.contains("lower case"), "{bad}: {e}");
        }
        // An upper-case unit is refused with the form meant.
        let e = parse_duration(" 1D").unwrap_err();
        assert!(e.contains("units are written in lower case (1d)"), "{e}");
        let e = parse_duration("1H30M").unwrap_err();
        assert!(e.contains("(1h30m)"), "{e}");
    }

    /// A value that would print as 1024 of a unit is given in the next (QA).
    #[test]
    fn sizes_never_read_1024_of_a_unit() {
        use super::bytes;
        assert_eq!(bytes(1023, 2), "1023 B");
        assert_eq!(bytes(1024, 2), "1.00 KiB");
        assert_eq!(bytes((1 << 20) - 1, 2), "1.00 MiB");
        assert_eq!(bytes((1 << 30) - 1, 2), "1.00 GiB");
        assert_eq!(bytes((1 << 30) - (6 << 20), 2), "1018.00 MiB");
        assert_eq!(bytes(1_048_000, 2), "1023.44 KiB");
        assert_eq!(bytes((1 << 20) - 1, 0), "1 MiB");
    }
}
