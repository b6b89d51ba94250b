//! RFC 3339 timestamps in UTC without a calendar dependency. Snapshots store times as
//! `YYYY-MM-DDTHH:MM:SS.nnnnnnnnnZ`, fixed width, so they sort as strings.

use std::time::{SystemTime, UNIX_EPOCH};

/// Days since 1970-01-01 -> (year, month, day); Howard Hinnant's civil-from-days.
fn civil_from_days(z: i64) -> (i64, u32, u32) {
    let z = z + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z.rem_euclid(146_097);
    let yoe = (doe - doe / 1460 + doe / 36524 - doe / 146_096) / 365;
    let y = yoe + era * 400;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let d = (doy - (153 * mp + 2) / 5 + 1) as u32;
    let m = if mp < 10 { mp + 3 } else { mp - 9 } as u32;
    (if m <= 2 { y + 1 } else { y }, m, d)
}

/// Seconds since the epoch -> (year, month, day, hour, minute, second) in UTC.
pub fn civil_utc(secs: i64) -> (i64, u8, u8, u8, u8, u8) {
    let rem = secs.rem_euclid(86_400);
    let (y, m, d) = civil_from_days(secs.div_euclid(86_400));
    (
        y,
        m as u8,
        d as u8,
        (rem / 3600) as u8,
        ((rem / 60) % 60) as u8,
        (rem % 60) as u8,
    )
}

pub fn format_unix(secs: i64, nanos: u32) -> String {
    let days = secs.div_euclid(86_400);
    let rem = secs.rem_euclid(86_400);
    let (y, m, d) = civil_from_days(days);
    format!(
        "{y:04}-{m:02}-{d:02}T{:02}:{:02}:{:02}.{nanos:09}Z",
        rem / 3600,
        (rem / 60) % 60,
        rem % 60
    )
}

/// How far past now a snapshot's time may lie before retention stops counting it
/// and `latest` passes it over (clocks of different hosts disagree by seconds to
/// minutes; a snapshot taken now is never this far ahead).
pub const FUTURE_SLACK_HOURS: i64 = 1;

/// Whether a time (Unix seconds) lies more than [`FUTURE_SLACK_HOURS`] ahead of
/// now: a snapshot dated so is passed over by `latest`.
pub fn in_the_future(secs: i64) -> bool {
    secs > now_unix() + FUTURE_SLACK_HOURS * 3600
}

pub fn now_unix() -> i64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_secs() as i64)
        .unwrap_or(0)
}

pub fn now_rfc3339() -> String {
    let t = now_timestamp();
    format_unix(t.secs, t.nanos)
}

/// Now, as a tree records times (an entry cairn makes itself: standard input, the
/// directories `recover` gathers trees under).
pub fn now_timestamp() -> cairn_format::tree::Timestamp {
    let d = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap_or_default();
    cairn_format::tree::Timestamp {
        secs: d.as_secs() as i64,
        nanos: d.subsec_nanos(),
    }
}

/// The offset from UTC, in seconds east, of this machine's time zone at the RFC
/// 3339 time `s` (a snapshot's, recorded with it: retention counts a snapshot's
/// days in the zone it was taken in, as restic does).
pub fn local_offset_at(s: &str) -> Option<i32> {
    parse_rfc3339(s).map(local_offset_of)
}

/// The offset from UTC, in seconds east, of this machine's time zone at `secs`
/// seconds since the epoch (0 for a time chrono cannot hold).
pub fn local_offset_of(secs: i64) -> i32 {
    use chrono::{Offset, TimeZone};
    chrono::DateTime::from_timestamp(secs, 0).map_or(0, |t| {
        chrono::Local
            .offset_from_utc_datetime(&t.naive_utc())
            .fix()
            .local_minus_utc()
    })
}

/// The offset a time given as RFC 3339 names (`--time 2024-03-01T00:30:00+05:30`),
/// in seconds east of UTC; `None` for a local time without one.
pub fn given_offset(s: &str) -> Option<i32> {
    use chrono::Offset;
    chrono::DateTime::parse_from_rfc3339(s.trim())
        .ok()
        .map(|t| t.offset().fix().local_minus_utc())
}

/// Seconds since the epoch of an RFC 3339 time (a snapshot's), if it is one.
pub fn parse_rfc3339(s: &str) -> Option<i64> {
    chrono::DateTime::parse_from_rfc3339(s)
        .ok()
        .map(|t| t.timestamp())
}

/// A recorded time (RFC 3339) as text output shows it: `YYYY-MM-DD HH:MM:SS` in
/// this machine's time zone, the zone retention's days and weeks are counted in
/// (JSON keeps UTC). A time that does not parse is shown as it is.
pub fn local_display(time: &str) -> String {
    match chrono::DateTime::parse_from_rfc3339(time) {
        Ok(t) => t
            .with_timezone(&chrono::Local)
            .format("%Y-%m-%d %H:%M:%S")
            .to_string(),
        Err(_) => time.get(..19).unwrap_or(time).replace('T', " "),
    }
}

/// A time a user gives (`backup --time`): RFC 3339 (`2026-05-01T02:00:00Z`,
/// with any offset), or `YYYY-MM-DD HH:MM[:SS]` in this machine's time zone (as
/// restic takes it). As a snapshot records it: UTC, nine fractional digits.
pub fn parse_user_time(s: &str) -> Option<String> {
    use chrono::TimeZone;
    let s = s.trim();
    let utc = if let Ok(t) = chrono::DateTime::parse_from_rfc3339(s) {
        t.with_timezone(&chrono::Utc)
    } else {
        let naive = ["%Y-%m-%d %H:%M:%S", "%Y-%m-%d %H:%M", "%Y-%m-%dT%H:%M:%S"]
            .iter()
            .find_map(|f| chrono::NaiveDateTime::parse_from_str(s, f).ok())?;
        // A local time a daylight-saving change repeats is two times: not
        // guessed (give it with its offset), as one it skips is none. Only
        // instants that read back as the time given count: the library's
        // answer is off by one at the edges of a change (QA: 03:00 on the day
        // Berlin's clocks go back was refused as repeated, and 02:00 on the day
        // they skip an hour was taken).
        let candidates: Vec<chrono::DateTime<chrono::Utc>> =
            match chrono::Local.from_local_datetime(&naive) {
                chrono::LocalResult::Single(t) => vec![t.with_timezone(&chrono::Utc)],
                chrono::LocalResult::Ambiguous(a, b) => {
                    vec![a.with_timezone(&chrono::Utc), b.with_timezone(&chrono::Utc)]
                }
                chrono::LocalResult::None => Vec::new(),
            };
        let real: Vec<_> = candidates
            .into_iter()
            .filter(|t| t.with_timezone(&chrono::Local).naive_local() == naive)
            .collect();
        match real[..] {
            [t] => t,
            _ => return None,
        }
    };
    // A snapshot's time is RFC 3339, whose year has four digits: a time that
    // comes to year 10000 in UTC would be unreadable later.
    if !(1..=9999).contains(&chrono::Datelike::year(&utc)) {
        return None;
    }
    // A leap second (`:60`) comes back as a nanosecond count past one second,
    // which the fixed nine digits cannot hold.
    if utc.timestamp_subsec_nanos() >= 1_000_000_000 {
        return None;
    }
    Some(format_unix(utc.timestamp(), utc.timestamp_subsec_nanos()))
}

/// Why [`parse_user_time`] refuses `s`, in words for the user: a local time a
/// daylight-saving change skips or repeats is told apart from one that does not
/// read at all.
pub fn user_time_problem(s: &str) -> String {
    use chrono::TimeZone;
    let s = s.trim();
    let naive = ["%Y-%m-%d %H:%M:%S", "%Y-%m-%d %H:%M", "%Y-%m-%dT%H:%M:%S"]
        .iter()
        .find_map(|f| chrono::NaiveDateTime::parse_from_str(s, f).ok());
    let Some(naive) = naive else {
        if chrono::DateTime::parse_from_rfc3339(s).is_ok() {
            return "it is outside the years 1 to 9999 in UTC, or a leap second".into();
        }
        return "give an RFC 3339 time (2026-05-01T02:00:00Z, 2026-05-01T04:00:00+02:00) \
                or \"YYYY-MM-DD HH:MM[:SS]\" in this machine's time zone"
            .into();
    };
    let real = |t: chrono::DateTime<chrono::Local>| t.naive_local() == naive;
    let example = naive.format("%Y-%m-%dT%H:%M:%S");
    match chrono::Local.from_local_datetime(&naive) {
        chrono::LocalResult::Ambiguous(a, b) if real(a) && real(b) => format!(
            "this local time happens twice (the clocks go back then): give it with its UTC \
             offset, {example}{} or {example}{}",
            a.format("%:z"),
            b.format("%:z")
        ),
        chrono::LocalResult::Single(t) if real(t) => {
            "it is outside the years 1 to 9999 in UTC".into()
        }
        _ => "this local time does not exist (the clocks skip it): give it with its UTC \
              offset, or an hour later"
            .into(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn user_times() {
        assert_eq!(
            parse_user_time("2026-05-01T04:00:00+02:00").as_deref(),
            Some("2026-05-01T02:00:00.000000000Z")
        );
        assert_eq!(
            parse_user_time("2026-05-01T02:00:00.5Z").as_deref(),
            Some("2026-05-01T02:00:00.500000000Z")
        );
        assert!(parse_user_time("2026-05-01 02:00").is_some());
        assert!(parse_user_time("yesterday").is_none());
        assert!(parse_user_time("2026-13-01 02:00:00").is_none());
        // Past year 9999 in UTC (a snapshot's time would not read back).
        assert!(parse_user_time("9999-12-31T23:59:59-00:01").is_none());
        assert!(parse_user_time("9999-12-31T23:59:59Z").is_some());
        assert!(parse_user_time("2026-06-30T23:59:60Z").is_none());
    }

    #[test]
    fn known_dates() {
        assert_eq!(format_unix(0, 0), "1970-01-01T00:00:00.000000000Z");
        assert_eq!(
            format_unix(1_795_000_000, 5),
            "2026-11-18T11:06:40.000000005Z"
        );
        assert_eq!(
            format_unix(951_782_400, 0),
            "2000-02-29T00:00:00.000000000Z"
        );
        assert_eq!(format_unix(-1, 0), "1969-12-31T23:59:59.000000000Z");
    }
}
