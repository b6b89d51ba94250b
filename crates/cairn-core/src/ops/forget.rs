//! Retention policies: which snapshots `forget` keeps and which it removes.
//!
//! Pure logic over snapshot metadata, so every rule can be tested with made-up times;
//! deleting the snapshot objects is the caller's business. The rules follow restic's
//! `forget`, because people move between the two tools with their cron lines intact:
//!
//! - Snapshots are first narrowed by a [`SnapshotFilter`] (the rest are left alone),
//!   then split into groups by [`GroupBy`]; each group is judged on its own, so one
//!   machine's backups can never push out another's.
//! - Within a group, snapshots are walked newest first. A snapshot is kept when any
//!   rule wants it; every rule that does adds a reason.
//! - `last N` keeps the N newest. `hourly`/`daily`/`weekly`/`monthly`/`yearly N` keep
//!   the newest snapshot of each of the N most recent hours/days/ISO weeks/months/years
//!   that have a snapshot at all. Calendar buckets are taken in the time zone each
//!   snapshot was taken in (recorded with it, as restic has it), because "one per
//!   day" means that machine's day, and a dry run in another zone must agree with
//!   the cron job; a snapshot from before cairn recorded it is counted in the
//!   local time zone. A count of -1 means no limit.
//! - If a bucket rule still has count left when the walk reaches the oldest snapshot,
//!   that snapshot is kept too ("oldest daily snapshot"), so a young history is not
//!   cut shorter than the policy asked for.
//! - `within D` keeps every snapshot newer than D before the group's newest snapshot
//!   (not before now: a machine that stopped backing up keeps its last ones); a
//!   snapshot dated in the future is kept by it but is not the newest it counts
//!   back from.
//! - A snapshot dated more than an hour in the future is kept and takes no rule's
//!   slot (restic counts it, so it can push real snapshots out).
//! - A snapshot `cairn serve` received after a snapshot of its group dated later
//!   ("stored late": junk a hijacked client dates into past days, but also copies
//!   and long backups) takes no slot from the others: the policy decides the
//!   others without the late ones, then the late ones with everything counted
//!   ([`apply`]; docs/FORMAT.md, "Server records").
//! - `keep_tags` keeps every snapshot carrying all tags of any one entry.

use crate::error::{Error, Result};
use cairn_format::SnapshotId;
use cairn_format::snapshot::Snapshot;
use chrono::{
    DateTime, Datelike, FixedOffset, Local, NaiveDate, Offset, TimeDelta, TimeZone, Timelike, Utc,
};
use serde::Serialize;
use std::collections::{BTreeMap, HashMap, HashSet};
use std::fmt;
use std::str::FromStr;

/// A span of calendar time for `keep-within`, written like `1y2m3d4h` (any subset, any
/// order, each unit at most once). Years, months and days are calendar steps, so
/// "1m" before March 31 is March 3 (February 31 rolls over), as in restic.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct CalendarDuration {
    pub years: u32,
    pub months: u32,
    pub days: u32,
    pub hours: u32,
}

impl CalendarDuration {
    pub fn is_zero(&self) -> bool {
        *self == CalendarDuration::default()
    }

    /// The instant `self` before `t`: years, months and days are stepped back on the
    /// calendar of `t`'s zone (overflowing days roll into the next month), then hours
    /// are taken off as elapsed time. `None` when the result is outside the
    /// representable range, which callers treat as "before every snapshot".
    pub fn before<Tz: TimeZone>(&self, t: &DateTime<Tz>) -> Option<DateTime<Tz>> {
        let local = t.naive_local();
        let months = i64::from(local.year()) * 12 + i64::from(local.month0())
            - i64::from(self.years) * 12
            - i64::from(self.months);
        let year = i32::try_from(months.div_euclid(12)).ok()?;
        let month = u32::try_from(months.rem_euclid(12)).ok()? + 1;
        let first = NaiveDate::from_ymd_opt(year, month, 1)?;
        let day_offset = i64::from(local.day()) - 1 - i64::from(self.days);
        let date = first.checked_add_signed(TimeDelta::try_days(day_offset)?)?;
        let naive = date.and_time(local.time());
        let tz = t.timezone();
        let stepped = match tz.from_local_datetime(&naive).earliest() {
            Some(x) => x,
            // The wall-clock time does not exist there (skipped by a DST change):
            // read it with the offset `t` had.
            None => {
                let offset = TimeDelta::try_seconds(i64::from(t.offset().fix().local_minus_utc()))?;
                tz.from_utc_datetime(&naive.checked_sub_signed(offset)?)
            }
        };
        stepped.checked_sub_signed(TimeDelta::try_hours(i64::from(self.hours))?)
    }
}

impl FromStr for CalendarDuration {
    type Err = Error;

    fn from_str(s: &str) -> Result<Self> {
        let err = |reason: String| Error::InvalidDuration {
            input: s.to_string(),
            reason,
        };
        if s.is_empty() {
            return Err(err(
                "it is empty; write a number and a unit, e.g. 7d or 1y6m".into(),
            ));
        }
        let bytes = s.as_bytes();
        let mut out = CalendarDuration::default();
        let mut seen = [false; 4];
        let mut i = 0;
        while i < bytes.len() {
            // `i` only ever moves over ASCII bytes, so it is always a char boundary.
            let start = i;
            while i < bytes.len() && bytes[i].is_ascii_digit() {
                i += 1;
            }
            let rest = &s[start..];
            if i == start {
                return Err(err(format!(
                    "expected a number at {rest:?}; units are y, m, d and h"
                )));
            }
            let digits = &s[start..i];
            let n: u32 = digits
                .parse()
                .map_err(|_| err(format!("{digits} is too large")))?;
            let Some(unit) = s[i..].chars().next() else {
                return Err(err(format!(
                    "{digits} has no unit; add y (years), m (months), d (days) or h (hours)"
                )));
            };
            // Months after days or hours read as minutes ("1h30m"): refused,
            // not taken for thirty months (QA r12).
            if unit == 'm' && (seen[2] || seen[3]) {
                return Err(err(
                    "m means months, and minutes are no unit here (the smallest is h): \
                     write months before days and hours, e.g. 1m2d"
                        .into(),
                ));
            }
            let (slot, field) = match unit {
                'y' => (0, &mut out.years),
                'm' => (1, &mut out.months),
                'd' => (2, &mut out.days),
                'h' => (3, &mut out.hours),
                'w' => return Err(err("weeks are not a unit; write 7d for a week".into())),
                'M' => return Err(err("units are lowercase; m means months".into())),
                other => {
                    return Err(err(format!(
                        "unknown unit {other:?}; use y (years), m (months), d (days) or h (hours)"
                    )));
                }
            };
            if seen[slot] {
                return Err(err(format!("the unit {unit} is given twice")));
            }
            seen[slot] = true;
            *field = n;
            i += 1;
        }
        Ok(out)
    }
}

impl fmt::Display for CalendarDuration {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.is_zero() {
            return f.write_str("0h");
        }
        for (n, unit) in [
            (self.years, 'y'),
            (self.months, 'm'),
            (self.days, 'd'),
            (self.hours, 'h'),
        ] {
            if n > 0 {
                write!(f, "{n}{unit}")?;
            }
        }
        Ok(())
    }
}

/// What to keep. Counts: `None` or `Some(0)` means the rule is off, `Some(-1)` means
/// no limit. A snapshot is kept if any rule keeps it.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Policy {
    pub last: Option<i64>,
    pub hourly: Option<i64>,
    pub daily: Option<i64>,
    pub weekly: Option<i64>,
    pub monthly: Option<i64>,
    pub yearly: Option<i64>,
    pub within: Option<CalendarDuration>,
    /// `--keep-within-hourly` .. `--keep-within-yearly`: the newest snapshot of
    /// each hour (day, ISO week, month, year) within this span of the newest,
    /// however many that is (restic's flags): hourly snapshots for two days,
    /// daily for a month, without counting how many a day had.
    pub within_hourly: Option<CalendarDuration>,
    pub within_daily: Option<CalendarDuration>,
    pub within_weekly: Option<CalendarDuration>,
    pub within_monthly: Option<CalendarDuration>,
    pub within_yearly: Option<CalendarDuration>,
    /// Each entry is a comma-separated tag list; a snapshot carrying every tag of one
    /// entry is kept. An empty entry matches snapshots without tags.
    pub keep_tags: Vec<String>,
}

impl Policy {
    fn counts(&self) -> [(&'static str, Option<i64>); 6] {
        [
            ("last", self.last),
            ("hourly", self.hourly),
            ("daily", self.daily),
            ("weekly", self.weekly),
            ("monthly", self.monthly),
            ("yearly", self.yearly),
        ]
    }

    /// The `within_*` spans with their rules, set or not.
    fn within_rules(&self) -> [(Rule, Option<CalendarDuration>); 5] {
        [
            (Rule::Hourly, self.within_hourly),
            (Rule::Daily, self.within_daily),
            (Rule::Weekly, self.within_weekly),
            (Rule::Monthly, self.within_monthly),
            (Rule::Yearly, self.within_yearly),
        ]
    }

    /// True when no rule is switched on. Such a policy would keep nothing explicitly,
    /// and removing everything by omission is never what was meant.
    pub fn is_empty(&self) -> bool {
        self.counts()
            .iter()
            .all(|(_, c)| matches!(c, None | Some(0)))
            && self.within.is_none_or(|w| w.is_zero())
            && (self.within_rules().iter()).all(|(_, w)| w.is_none_or(|w| w.is_zero()))
            && self.keep_tags.is_empty()
    }

    /// Counts below -1 are rejected rather than read as "off" or "unlimited".
    pub fn validate(&self) -> Result<()> {
        for (name, c) in self.counts() {
            if let Some(n) = c
                && n < -1
            {
                return Err(Error::BadArgument(format!(
                    "keep-{name} {n} is not a count: use 0 or more, or -1 for unlimited"
                )));
            }
        }
        Ok(())
    }
}

impl fmt::Display for Policy {
    /// A one-line summary such as "keep the 3 latest, 7 daily snapshots, all weekly
    /// snapshots, snapshots within 2d, snapshots tagged important".
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let mut parts = Vec::new();
        for (name, c) in self.counts() {
            let what = if name == "last" {
                "latest snapshots".to_string()
            } else {
                format!("{name} snapshots")
            };
            match c {
                Some(-1) => parts.push(format!("all {what}")),
                Some(n) if n > 0 => parts.push(format!("{n} {what}")),
                _ => {}
            }
        }
        if let Some(w) = self.within.filter(|w| !w.is_zero()) {
            parts.push(format!("snapshots within {w} of the newest"));
        }
        for (rule, w) in self.within_rules() {
            if let Some(w) = w.filter(|w| !w.is_zero()) {
                parts.push(format!("{}s within {w} of the newest", rule.reason()));
            }
        }
        for t in &self.keep_tags {
            let wanted = tag_list(t);
            parts.push(if wanted.is_empty() {
                "untagged snapshots".to_string()
            } else {
                format!("snapshots tagged {}", wanted.join(","))
            });
        }
        if parts.is_empty() {
            f.write_str("keep nothing in particular")
        } else {
            write!(f, "keep {}", parts.join(", "))
        }
    }
}

/// Which snapshot attributes must be equal for two snapshots to share a group.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct GroupBy {
    pub host: bool,
    pub paths: bool,
    pub tags: bool,
}

impl Default for GroupBy {
    /// Host and paths: one backup job per group, like restic.
    fn default() -> Self {
        GroupBy {
            host: true,
            paths: true,
            tags: false,
        }
    }
}

impl FromStr for GroupBy {
    type Err = Error;

    /// `host,paths,tags` in any combination; the empty string puts every snapshot in
    /// one group.
    fn from_str(s: &str) -> Result<Self> {
        let mut g = GroupBy {
            host: false,
            paths: false,
            tags: false,
        };
        for part in s.split(',').map(str::trim).filter(|p| !p.is_empty()) {
            match part {
                "host" | "hosts" => g.host = true,
                "path" | "paths" => g.paths = true,
                "tag" | "tags" => g.tags = true,
                other => {
                    return Err(Error::BadArgument(format!(
                        "cannot group by {other:?}: use host, paths and/or tags"
                    )));
                }
            }
        }
        Ok(g)
    }
}

/// Which snapshots a policy applies to; all given conditions must hold, an empty list
/// is no condition. Snapshots that do not match are neither kept nor removed.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct SnapshotFilter {
    /// The snapshot's host is one of these.
    pub hosts: Vec<String>,
    /// The snapshot carries every tag of at least one entry (comma-separated lists;
    /// an empty entry matches untagged snapshots).
    pub tags: Vec<String>,
    /// The snapshot includes every one of these paths.
    pub paths: Vec<String>,
}

impl SnapshotFilter {
    /// No condition at all.
    pub fn is_empty(&self) -> bool {
        self.hosts.is_empty() && self.tags.is_empty() && self.paths.is_empty()
    }

    /// The conditions as flags: `--host a --tag x,y --path /srv`.
    pub fn describe(&self) -> String {
        let mut parts = Vec::new();
        for (flag, values) in [
            ("host", &self.hosts),
            ("tag", &self.tags),
            ("path", &self.paths),
        ] {
            for v in values {
                parts.push(format!("--{flag} {v}"));
            }
        }
        parts.join(" ")
    }

    pub fn matches(&self, s: &Snapshot) -> bool {
        (self.hosts.is_empty() || self.hosts.contains(&s.hostname))
            && (self.tags.is_empty() || self.tags.iter().any(|t| has_tag_list(s, t)))
            && self.paths.iter().all(|p| {
                // Spelled any way (a retention script that forgets nothing, and
                // says so quietly, is worse than none).
                let p = crate::ops::ls::normalise(p);
                s.paths.iter().any(|sp| crate::ops::ls::normalise(sp) == p)
            })
    }
}

fn tag_list(list: &str) -> Vec<&str> {
    list.split(',')
        .map(str::trim)
        .filter(|t| !t.is_empty())
        .collect()
}

/// True when `s` carries every tag of the comma-separated `list`; an empty list means
/// "has no tags at all", so untagged snapshots can be selected.
fn has_tag_list(s: &Snapshot, list: &str) -> bool {
    let wanted = tag_list(list);
    if wanted.is_empty() {
        s.tags.is_empty()
    } else {
        wanted.iter().all(|w| s.tags.iter().any(|t| t == w))
    }
}

fn tag_reason(list: &str) -> String {
    let wanted = tag_list(list);
    match wanted.len() {
        0 => "no tags".into(),
        // restic's words, which scripts may match.
        _ => format!("has tags [{}]", wanted.join(", ")),
    }
}

/// What a group's snapshots share. A field is `None` when the grouping does not use
/// it; paths and tags are sorted so their order in a snapshot does not matter.
#[derive(Clone, Debug, Default, PartialEq, Eq, PartialOrd, Ord, Serialize)]
pub struct GroupKey {
    pub host: Option<String>,
    pub paths: Option<Vec<String>>,
    pub tags: Option<Vec<String>>,
}

impl GroupKey {
    /// The key of `s`'s group under `by`.
    pub fn of(s: &Snapshot, by: GroupBy) -> Self {
        let sorted = |v: &[String]| {
            let mut v = v.to_vec();
            v.sort();
            v.dedup();
            v
        };
        GroupKey {
            host: by.host.then(|| s.hostname.clone()),
            paths: by.paths.then(|| sorted(&s.paths)),
            tags: by.tags.then(|| sorted(&s.tags)),
        }
    }
}

impl fmt::Display for GroupKey {
    /// "host h, paths [/a /b], tags [x]", or "all snapshots" when nothing groups.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let mut parts = Vec::new();
        if let Some(h) = &self.host {
            parts.push(format!("host {h}"));
        }
        if let Some(p) = &self.paths {
            parts.push(format!("paths [{}]", p.join(" ")));
        }
        if let Some(t) = &self.tags {
            parts.push(format!("tags [{}]", t.join(",")));
        }
        if parts.is_empty() {
            f.write_str("all snapshots")
        } else {
            f.write_str(&parts.join(", "))
        }
    }
}

/// The decision for one group. Both lists are oldest first, like the snapshot list.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ForgetGroup {
    pub key: GroupKey,
    /// Kept snapshots with every reason that kept them, e.g. "daily snapshot".
    pub keep: Vec<(SnapshotId, Vec<String>)>,
    pub remove: Vec<SnapshotId>,
    /// Snapshots `cairn serve` received after a snapshot of this group dated
    /// later: they took no slot from the others (oldest first).
    pub stored_late: Vec<SnapshotId>,
}

/// Applies `policy` to the snapshots matching `filter`, group by group, with calendar
/// buckets in the local time zone. Groups come sorted by key.
///
/// Fails with [`Error::NoPolicy`] for an empty policy, [`Error::Invalid`] for a count
/// below -1, [`Error::InvalidSnapshotTime`] if a considered snapshot's time is
/// unreadable, and [`Error::WouldRemoveAll`] if a group would lose every snapshot.
pub fn plan(
    snapshots: &[(SnapshotId, Snapshot)],
    policy: &Policy,
    group_by: GroupBy,
    filter: &SnapshotFilter,
) -> Result<Vec<ForgetGroup>> {
    plan_in(snapshots, policy, group_by, filter, &Local)
}

/// [`plan`] with calendar buckets taken in `tz`; tests use fixed zones.
pub fn plan_in<Tz: TimeZone>(
    snapshots: &[(SnapshotId, Snapshot)],
    policy: &Policy,
    group_by: GroupBy,
    filter: &SnapshotFilter,
    tz: &Tz,
) -> Result<Vec<ForgetGroup>> {
    plan_received_in(snapshots, &Received::new(), policy, group_by, filter, tz)
}

/// When `cairn serve` received snapshots stored through it by non-admin tokens
/// ([`crate::repo::Repository::received_times`]).
pub type Received = std::collections::HashMap<SnapshotId, DateTime<Utc>>;

/// [`plan_in`] knowing when the server received snapshots: one stored after a
/// newer snapshot of its group is judged apart ([`ForgetGroup::stored_late`]).
pub fn plan_received_in<Tz: TimeZone>(
    snapshots: &[(SnapshotId, Snapshot)],
    received: &Received,
    policy: &Policy,
    group_by: GroupBy,
    filter: &SnapshotFilter,
    tz: &Tz,
) -> Result<Vec<ForgetGroup>> {
    policy.validate()?;
    if policy.is_empty() {
        return Err(Error::NoPolicy);
    }
    let mut groups: BTreeMap<GroupKey, Vec<Entry<'_>>> = BTreeMap::new();
    for (id, s) in snapshots.iter().filter(|(_, s)| filter.matches(s)) {
        let time = DateTime::parse_from_rfc3339(&s.time)
            .map_err(|_| Error::InvalidSnapshotTime {
                id: id.to_hex(),
                time: s.time.clone(),
            })?
            .with_timezone(&Utc);
        groups
            .entry(GroupKey::of(s, group_by))
            .or_default()
            .push(Entry {
                id: *id,
                snap: s,
                time,
                received: received.get(id).copied(),
            });
    }
    let mut out = Vec::with_capacity(groups.len());
    let mut emptied = Vec::new();
    for (key, entries) in groups {
        let group = apply(key, entries, policy, tz);
        if group.keep.is_empty() {
            emptied.push(group.key.to_string());
        }
        out.push(group);
    }
    if !emptied.is_empty() {
        return Err(Error::WouldRemoveAll { groups: emptied });
    }
    Ok(out)
}

#[derive(Clone)]
struct Entry<'a> {
    id: SnapshotId,
    snap: &'a Snapshot,
    time: DateTime<Utc>,
    /// When `cairn serve` received it, if it was stored through the server.
    received: Option<DateTime<Utc>>,
}

/// The calendar rules, in the order their reasons are listed.
#[derive(Clone, Copy)]
enum Rule {
    Last,
    Hourly,
    Daily,
    Weekly,
    Monthly,
    Yearly,
}

impl Rule {
    fn reason(self) -> &'static str {
        match self {
            Rule::Last => "last snapshot",
            Rule::Hourly => "hourly snapshot",
            Rule::Daily => "daily snapshot",
            Rule::Weekly => "weekly snapshot",
            Rule::Monthly => "monthly snapshot",
            Rule::Yearly => "yearly snapshot",
        }
    }

    /// The bucket a snapshot falls in; two snapshots compete only within one bucket.
    /// `Last` gives every snapshot its own bucket (its position).
    fn bucket<Tz: TimeZone>(self, t: &DateTime<Tz>, position: usize) -> i64 {
        let (y, m, d, h) = (
            i64::from(t.year()),
            i64::from(t.month()),
            i64::from(t.day()),
            i64::from(t.hour()),
        );
        match self {
            Rule::Last => position as i64,
            Rule::Hourly => ((y * 100 + m) * 100 + d) * 100 + h,
            Rule::Daily => (y * 100 + m) * 100 + d,
            Rule::Weekly => {
                let w = t.iso_week();
                i64::from(w.year()) * 100 + i64::from(w.week())
            }
            Rule::Monthly => y * 100 + m,
            Rule::Yearly => y,
        }
    }
}

pub use crate::time::FUTURE_SLACK_HOURS;

/// The reason given for a snapshot dated in the future: kept, not counted.
pub const FUTURE_REASON: &str = "dated in the future (kept, not counted by the policy)";

struct Counter {
    rule: Rule,
    /// Snapshots this rule may still keep; -1 is unlimited.
    left: i64,
    /// Bucket of the last snapshot this rule kept.
    last_bucket: Option<i64>,
    /// A `within_*` rule (no count): its span, and the instant snapshots must
    /// be newer than (`None`: all of them are within it).
    span: Option<(CalendarDuration, Option<DateTime<Utc>>)>,
}

/// The snapshots of a group that `cairn serve` received after it had received a
/// snapshot of the group dated later: stored late. Honest clients store
/// snapshots in the order they date them, except for a long backup overlapping a
/// shorter one, and copies of old snapshots; a hijacked client dating junk into
/// past days, so that it takes the place of real backups, always stores late.
///
/// A snapshot with no record (stored directly, or by an admin token) counts as
/// received when it is dated. Snapshots dated in the future are left out: they
/// take no slot anyway, and one far ahead would make every later one late.
///
/// Snapshots received at the same recorded time (whole seconds, as servers
/// before 2026-12-07 wrote them) are in no known order: one of them dated
/// before another counts as late, since either may have come first (QA r35:
/// junk stored within the second after the real backup took its day). Taking
/// an honest one for late costs only a warning: the policy keeps it as before.
fn stored_late(entries: &[Entry<'_>], future: DateTime<Utc>) -> HashSet<SnapshotId> {
    let mut by_arrival: Vec<(DateTime<Utc>, &Entry<'_>)> = entries
        .iter()
        .filter(|e| e.time <= future)
        .map(|e| (e.received.unwrap_or(e.time), e))
        .collect();
    by_arrival.sort_by_key(|a| a.0);
    let mut late = HashSet::new();
    // The latest date among snapshots received strictly before the current run
    // of equal arrival times.
    let mut newest_before: Option<DateTime<Utc>> = None;
    let mut i = 0;
    while i < by_arrival.len() {
        let at = by_arrival[i].0;
        let mut j = i;
        while j < by_arrival.len() && by_arrival[j].0 == at {
            j += 1;
        }
        let newest_here = by_arrival[i..j].iter().map(|(_, e)| e.time).max();
        let newest = newest_before.max(newest_here);
        for (_, e) in &by_arrival[i..j] {
            if e.received.is_some() && newest.is_some_and(|n| n > e.time) {
                late.insert(e.id);
            }
        }
        for (_, e) in &by_arrival[i..j] {
            newest_before = Some(newest_before.map_or(e.time, |n| n.max(e.time)));
        }
        i = j;
    }
    late
}

/// Judges one group. Snapshots stored late ([`stored_late`]) cannot take a slot
/// from the others: the policy first decides the others as if the late ones did
/// not exist, then decides the late ones with everything counted. Whatever the
/// one-pass policy keeps is still kept (leaving snapshots out only ever lets a
/// rule keep more of the rest), so this keeps a superset of it.
fn apply<Tz: TimeZone>(
    key: GroupKey,
    entries: Vec<Entry<'_>>,
    policy: &Policy,
    tz: &Tz,
) -> ForgetGroup {
    let now = Utc::now();
    let late = stored_late(&entries, now + TimeDelta::hours(FUTURE_SLACK_HOURS));
    if late.is_empty() {
        return judge(key, entries, policy, tz, now);
    }
    let order: HashMap<SnapshotId, (DateTime<Utc>, SnapshotId)> =
        entries.iter().map(|e| (e.id, (e.time, e.id))).collect();
    let in_order: Vec<Entry<'_>> = entries
        .iter()
        .filter(|e| !late.contains(&e.id))
        .cloned()
        .collect();
    let first = judge(key.clone(), in_order, policy, tz, now);
    let all = judge(key, entries, policy, tz, now);
    let mut keep = first.keep;
    keep.extend(all.keep.into_iter().filter(|(id, _)| late.contains(id)));
    let mut remove = first.remove;
    remove.extend(all.remove.into_iter().filter(|id| late.contains(id)));
    keep.sort_by_key(|(id, _)| order[id]);
    remove.sort_by_key(|id| order[id]);
    let mut stored_late: Vec<SnapshotId> = late.into_iter().collect();
    stored_late.sort_by_key(|id| order[id]);
    ForgetGroup {
        key: all.key,
        keep,
        remove,
        stored_late,
    }
}

/// One pass of the policy over a group's snapshots.
fn judge<Tz: TimeZone>(
    key: GroupKey,
    mut entries: Vec<Entry<'_>>,
    policy: &Policy,
    tz: &Tz,
    now: DateTime<Utc>,
) -> ForgetGroup {
    // Newest first; among equal times as [`crate::repo::snapshot_order`] has it.
    entries.sort_by(|a, b| {
        b.time
            .cmp(&a.time)
            .then(b.snap.original.is_some().cmp(&a.snap.original.is_some()))
            .then(b.id.cmp(&a.id))
    });
    let mut counters: Vec<Counter> = [
        (Rule::Last, policy.last),
        (Rule::Hourly, policy.hourly),
        (Rule::Daily, policy.daily),
        (Rule::Weekly, policy.weekly),
        (Rule::Monthly, policy.monthly),
        (Rule::Yearly, policy.yearly),
    ]
    .into_iter()
    .filter_map(|(rule, n)| match n {
        Some(n) if n != 0 => Some(Counter {
            rule,
            left: n,
            last_bucket: None,
            span: None,
        }),
        _ => None,
    })
    .collect();
    let within = policy.within.filter(|w| !w.is_zero());
    // Everything newer than this is kept by `within`; `None` inside means the span
    // reaches before the representable range, so everything is within it.
    // The newest snapshot not dated in the future (as restic has it): one host
    // with a clock years ahead must not put every real snapshot "out of" the span.
    // Within the hour of slack the rest of the policy allows (QA r12: a clock
    // ten minutes fast moved the window back to the snapshot before).
    let newest = entries
        .iter()
        .find(|e| e.time <= now + TimeDelta::hours(FUTURE_SLACK_HOURS))
        .or_else(|| entries.first());
    // Days and months are stepped back on the newest snapshot's own calendar
    // (the zone it was taken in, when recorded), as restic does: not the zone
    // forget runs in (QA: `--keep-within 29d` kept a snapshot in UTC and not in
    // New York).
    let start_of = |w: CalendarDuration| {
        newest.and_then(
            |newest| match newest.snap.utc_offset.and_then(FixedOffset::east_opt) {
                Some(own) => w
                    .before(&newest.time.with_timezone(&own))
                    .map(|t| t.with_timezone(&Utc)),
                None => w
                    .before(&newest.time.with_timezone(tz))
                    .map(|t| t.with_timezone(&Utc)),
            },
        )
    };
    let within_from = within.map(start_of);
    // The `within_*` rules, after the counted ones (as restic lists them): each
    // keeps the newest snapshot of every bucket inside its span, counting no
    // slots.
    counters.extend(
        (policy.within_rules().into_iter())
            .filter_map(|(rule, w)| w.filter(|w| !w.is_zero()).map(|w| (rule, w)))
            .map(|(rule, span)| Counter {
                rule,
                left: -1,
                last_bucket: None,
                span: Some((span, start_of(span))),
            }),
    );

    let oldest = entries.len().saturating_sub(1);
    let mut keep = Vec::new();
    let mut remove = Vec::new();
    let future = now + TimeDelta::hours(FUTURE_SLACK_HOURS);
    for (pos, e) in entries.iter().enumerate() {
        // Dated in the future: kept, and no rule's slot taken. Counted, such
        // snapshots would be the "newest" and push real ones out: a clock years
        // ahead, or a client that may only add backups (a backup token of `cairn
        // serve`) dating junk ahead so that routine retention deletes a host's
        // real backups.
        if e.time > future {
            keep.push((e.id, vec![FUTURE_REASON.to_string()]));
            continue;
        }
        let mut reasons: Vec<String> = Vec::new();
        for t in &policy.keep_tags {
            if has_tag_list(e.snap, t) {
                reasons.push(tag_reason(t));
            }
        }
        if let (Some(w), Some(from)) = (within, within_from)
            && from.is_none_or(|from| e.time > from)
        {
            reasons.push(format!("within {w}"));
        }
        // Its hours, days and weeks as where it was taken (as restic counts them),
        // else as here.
        let own = (e.snap.utc_offset)
            .and_then(FixedOffset::east_opt)
            .map(|o| e.time.with_timezone(&o));
        let local = e.time.with_timezone(tz);
        let bucket_of = |rule: Rule| match &own {
            Some(t) => rule.bucket(t, pos),
            None => rule.bucket(&local, pos),
        };
        for c in counters.iter_mut().filter(|c| c.left != 0) {
            let reason = match c.span {
                // Outside a within rule's span: not its to keep.
                Some((_, Some(from))) if e.time <= from => continue,
                // "daily within 3d", as restic's.
                Some((span, _)) => format!(
                    "{} within {span}",
                    c.rule.reason().trim_end_matches(" snapshot")
                ),
                None => c.rule.reason().to_string(),
            };
            let bucket = bucket_of(c.rule);
            // The group's oldest is kept too while a counted rule has slots
            // left, for the longest history; a within rule keeps only each
            // bucket's newest (as restic's: QA r12, two snapshots of one ISO
            // week both kept by --keep-within-weekly).
            let reason = if c.last_bucket != Some(bucket) {
                reason
            } else if pos == oldest && c.span.is_none() {
                format!("oldest {reason}")
            } else {
                continue;
            };
            reasons.push(reason);
            c.last_bucket = Some(bucket);
            if c.left > 0 {
                c.left -= 1;
            }
        }
        if reasons.is_empty() {
            remove.push(e.id);
        } else {
            keep.push((e.id, reasons));
        }
    }
    keep.reverse();
    remove.reverse();
    ForgetGroup {
        key,
        keep,
        remove,
        stored_late: Vec::new(),
    }
}

/// What `forget` is asked to remove.
#[derive(Clone, Debug)]
pub enum ForgetRequest {
    /// These snapshots (`latest` or id prefixes), all resolved before any is removed.
    Ids(Vec<String>),
    /// What a retention policy does not keep.
    Policy {
        policy: Box<Policy>,
        group_by: GroupBy,
        filter: SnapshotFilter,
    },
}

/// A snapshot as `forget` reports it.
#[derive(Clone, Debug, Serialize)]
pub struct SnapshotEntry {
    pub id: SnapshotId,
    pub short_id: String,
    pub time: String,
    pub host: String,
    /// The host again, under the name restic's `forget --json` gives it.
    pub hostname: String,
    pub paths: Vec<String>,
    pub tags: Vec<String>,
    /// Why a kept snapshot is kept.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub reasons: Option<Vec<String>>,
}

/// One group's decision, as `forget --json` prints it: cairn's `group` and
/// per-snapshot `reasons`, and restic's fields beside them (`host`, `paths` and
/// `tags` of the group, `""` or null where the grouping leaves one out, and a
/// `reasons` list of `{snapshot, matches}`), so that a script written for
/// either reads it.
#[derive(Clone, Debug, Serialize)]
pub struct GroupReport {
    pub group: GroupKey,
    pub host: String,
    pub paths: Option<Vec<String>>,
    pub tags: Option<Vec<String>>,
    /// Oldest first here; `--json` lists these three newest first, as restic.
    #[serde(serialize_with = "newest_first")]
    pub keep: Vec<SnapshotEntry>,
    #[serde(serialize_with = "newest_first")]
    pub remove: Vec<SnapshotEntry>,
    #[serde(serialize_with = "newest_first")]
    pub reasons: Vec<KeepReason>,
    /// Snapshots `cairn serve` received after a snapshot of the group dated
    /// later; they took no slot from the others ([`ForgetGroup::stored_late`]).
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub stored_late: Vec<LateEntry>,
}

/// Writes a list kept oldest first as restic's `forget --json` does: newest first.
fn newest_first<S: serde::Serializer, T: Serialize>(v: &[T], s: S) -> Result<S::Ok, S::Error> {
    s.collect_seq(v.iter().rev())
}

/// Why a snapshot is kept, in restic's shape.
#[derive(Clone, Debug, Serialize)]
pub struct KeepReason {
    pub snapshot: SnapshotEntry,
    pub matches: Vec<String>,
}

/// A snapshot stored late: its date (written by the client) and when `cairn
/// serve` received it.
#[derive(Clone, Debug, Serialize)]
pub struct LateEntry {
    pub id: SnapshotId,
    pub short_id: String,
    pub time: String,
    pub received: String,
}

/// What `forget` decided and did. `--json` prints the groups (restic's shape).
#[derive(Clone, Debug, Serialize)]
#[serde(transparent)]
pub struct ForgetReport {
    pub groups: Vec<GroupReport>,
    /// Whether a policy chose (else ids were named).
    #[serde(skip)]
    pub by_policy: bool,
    #[serde(skip)]
    pub dry_run: bool,
    /// Snapshots removed.
    #[serde(skip)]
    pub removed: usize,
    /// Snapshots whose removal failed, with why.
    #[serde(skip)]
    pub failed: Vec<(SnapshotId, String)>,
    /// Snapshot objects that could not be read (left alone).
    #[serde(skip)]
    pub unreadable: Vec<String>,
    /// Snapshots that name another bound token's host than the one `cairn serve`
    /// recorded for the token that stored them: the policy counted them as the
    /// recorded host's ([`crate::repo::Repository::attribute_hosts`]).
    #[serde(skip)]
    pub host_claims: Vec<HostClaim>,
}

/// A snapshot whose named host is not the one its token was bound to.
#[derive(Clone, Debug, Serialize)]
pub struct HostClaim {
    pub id: SnapshotId,
    pub short_id: String,
    /// The host the snapshot names (written by the client).
    pub claimed: String,
    /// The host the server recorded (the storing token's).
    pub recorded: String,
}

impl ForgetReport {
    pub fn planned(&self) -> usize {
        self.groups.iter().map(|g| g.remove.len()).sum()
    }
}

/// Decides what to remove and, unless `dry_run`, removes it: the snapshot objects
/// only (their data stays until prune). A dry run takes a read session, so that
/// it works where no lock can be written (a repository on a read-only mount).
pub fn forget<A: crate::session::Access>(
    session: &crate::session::Session<A>,
    request: &ForgetRequest,
    dry_run: bool,
) -> Result<ForgetReport> {
    if !dry_run && A::READ_ONLY {
        return Err(Error::Invalid(
            "forget: only a dry run may use a read-only session".into(),
        ));
    }
    // Before the snapshots are read and the policy applied (QA r33: refused at
    // the end, naming the admin index file the server would not take).
    if !dry_run && !session.repo().backend().may_remove()? {
        return Err(Error::Invalid(
            "forget removes snapshots: this token may not (an admin token can; --dry-run \
             shows what would go)"
                .into(),
        ));
    }
    let mut host_claims = Vec::new();
    let mut received = Received::new();
    let (snaps, groups, unreadable) = match request {
        ForgetRequest::Ids(specs) => {
            // Every id resolved before anything is removed: one typo removes nothing.
            let mut snaps: Vec<(SnapshotId, Snapshot)> = Vec::new();
            // Named objects that cannot be read (damage, or junk an append-only
            // token stored under a snapshot's name): forgetting one by its id is
            // the way to remove it, so it is not refused for being unreadable.
            let mut unreadable: Vec<SnapshotId> = Vec::new();
            for spec in specs {
                let id = match session.find_snapshot(spec) {
                    Ok((id, s)) => {
                        if !snaps.iter().any(|(i, _)| *i == id) {
                            snaps.push((id, s));
                        }
                        continue;
                    }
                    Err(Error::Damaged { .. }) if spec != "latest" => {
                        crate::repo::resolve_snapshot_prefix(spec, session.snapshot_ids())?
                    }
                    Err(e) => return Err(e),
                };
                if !unreadable.contains(&id) {
                    unreadable.push(id);
                }
            }
            snaps.sort_by(|a, b| crate::repo::snapshot_order((&a.0, &a.1), (&b.0, &b.1)));
            let group = ForgetGroup {
                key: GroupKey::default(),
                keep: Vec::new(),
                remove: snaps
                    .iter()
                    .map(|(id, _)| *id)
                    .chain(unreadable.iter().copied())
                    .collect(),
                stored_late: Vec::new(),
            };
            (snaps, vec![group], Vec::new())
        }
        ForgetRequest::Policy {
            policy,
            group_by,
            filter,
        } => {
            let (snaps, bad) = session.snapshots()?;
            let mut snaps = snaps.clone();
            for (id, claimed) in session.repo().attribute_hosts(&mut snaps)? {
                let recorded = snaps
                    .iter()
                    .find(|(i, _)| *i == id)
                    .map(|(_, s)| s.hostname.clone())
                    .unwrap_or_default();
                host_claims.push(HostClaim {
                    id,
                    short_id: id.short(),
                    claimed,
                    recorded,
                });
            }
            received = session.repo().received_times(&snaps)?;
            let groups = plan_received_in(&snaps, &received, policy, *group_by, filter, &Local)?;
            (snaps, groups, bad.iter().map(|e| e.to_string()).collect())
        }
    };
    let by_id: std::collections::HashMap<SnapshotId, &Snapshot> =
        snaps.iter().map(|(i, s)| (*i, s)).collect();
    let entry = |id: &SnapshotId, reasons: Option<&[String]>| {
        let s = by_id.get(id);
        SnapshotEntry {
            id: *id,
            short_id: id.short(),
            time: s.map(|s| s.time.clone()).unwrap_or_default(),
            host: s.map(|s| s.hostname.clone()).unwrap_or_default(),
            hostname: s.map(|s| s.hostname.clone()).unwrap_or_default(),
            paths: s.map(|s| s.paths.clone()).unwrap_or_default(),
            tags: s.map(|s| s.tags.clone()).unwrap_or_default(),
            reasons: reasons.map(<[String]>::to_vec),
        }
    };
    let mut report = ForgetReport {
        groups: groups
            .iter()
            .map(|g| GroupReport {
                group: g.key.clone(),
                host: g.key.host.clone().unwrap_or_default(),
                paths: g.key.paths.clone(),
                tags: g.key.tags.clone(),
                keep: g.keep.iter().map(|(id, r)| entry(id, Some(r))).collect(),
                remove: g.remove.iter().map(|id| entry(id, None)).collect(),
                reasons: g
                    .keep
                    .iter()
                    .map(|(id, r)| KeepReason {
                        snapshot: entry(id, None),
                        matches: r.clone(),
                    })
                    .collect(),
                stored_late: g
                    .stored_late
                    .iter()
                    .map(|id| LateEntry {
                        id: *id,
                        short_id: id.short(),
                        time: by_id.get(id).map(|s| s.time.clone()).unwrap_or_default(),
                        received: received
                            .get(id)
                            .map(|t| t.to_rfc3339_opts(chrono::SecondsFormat::Secs, true))
                            .unwrap_or_default(),
                    })
                    .collect(),
            })
            .collect(),
        by_policy: matches!(request, ForgetRequest::Policy { .. }),
        dry_run,
        removed: 0,
        failed: Vec::new(),
        unreadable,
        host_claims,
    };
    if !dry_run {
        let ids: Vec<SnapshotId> = groups
            .iter()
            .flat_map(|g| g.remove.iter().copied())
            .collect();
        for (id, r) in session.repo().forget_snapshots(&ids)? {
            match r {
                Ok(()) => report.removed += 1,
                Err(e) => report.failed.push((id, e.to_string())),
            }
        }
    }
    Ok(report)
}

#[cfg(test)]
mod tests {
    use super::*;
    use cairn_format::snapshot::SnapshotSummary;

    fn snap(time: &str, host: &str, paths: &[&str], tags: &[&str]) -> Snapshot {
        Snapshot {
            version: 1,
            time: time.into(),
            utc_offset: None,
            hostname: host.into(),
            username: "u".into(),
            paths: paths.iter().map(|p| p.to_string()).collect(),
            tags: tags.iter().map(|t| t.to_string()).collect(),
            tree: "ab".repeat(32),
            parent: None,
            excludes: vec![],
            original: None,
            copied_from: None,
            program_version: "cairn test".into(),
            image: None,
            summary: SnapshotSummary::default(),
        }
    }

    /// Snapshots on one host and path at the given UTC times (seconds may be omitted),
    /// in the order given; ids are distinct and unrelated to time order.
    fn at(times: &[&str]) -> Vec<(SnapshotId, Snapshot)> {
        times
            .iter()
            .enumerate()
            .map(|(i, t)| (id(i), snap(&full(t), "h", &["/data"], &[])))
            .collect()
    }

    fn id(i: usize) -> SnapshotId {
        let mut b = [0u8; 32];
        b[0] = (i * 37 % 251) as u8;
        b[1] = i as u8;
        SnapshotId(b)
    }

    /// "2026-01-02 03:04" -> "2026-01-02T03:04:00.000000000Z".
    fn full(t: &str) -> String {
        let t = t.replace(' ', "T");
        match t.len() {
            10 => format!("{t}T00:00:00.000000000Z"),
            16 => format!("{t}:00.000000000Z"),
            19 => format!("{t}.000000000Z"),
            _ => t,
        }
    }

    fn run(snaps: &[(SnapshotId, Snapshot)], p: &Policy) -> Vec<ForgetGroup> {
        plan_in(
            snaps,
            p,
            GroupBy::default(),
            &SnapshotFilter::default(),
            &Utc,
        )
        .unwrap()
    }

    fn time_of(snaps: &[(SnapshotId, Snapshot)], id: &SnapshotId) -> String {
        snaps.iter().find(|(i, _)| i == id).unwrap().1.time.clone()
    }

    /// Expected times, in the short form the tests are written in.
    fn ts(times: &[&str]) -> Vec<String> {
        times.iter().map(|t| full(t)).collect()
    }

    /// An expected kept snapshot: its time and reasons.
    fn k(time: &str, reasons: &[&str]) -> (String, Vec<String>) {
        (full(time), reasons.iter().map(|r| r.to_string()).collect())
    }

    /// Kept snapshots of the only group as (short time, reasons), oldest first.
    fn kept(snaps: &[(SnapshotId, Snapshot)], p: &Policy) -> Vec<(String, Vec<String>)> {
        let g = run(snaps, p);
        assert_eq!(g.len(), 1);
        g[0].keep
            .iter()
            .map(|(i, r)| (time_of(snaps, i), r.clone()))
            .collect()
    }

    fn kept_times(snaps: &[(SnapshotId, Snapshot)], p: &Policy) -> Vec<String> {
        kept(snaps, p).into_iter().map(|(t, _)| t).collect()
    }

    fn removed_times(snaps: &[(SnapshotId, Snapshot)], p: &Policy) -> Vec<String> {
        let g = run(snaps, p);
        g[0].remove.iter().map(|i| time_of(snaps, i)).collect()
    }

    /// `--keep-within` counts back from a newest snapshot dated a few minutes
    /// ahead (inside the slack every other rule allows), not from the one
    /// before it (QA r12).
    #[test]
    fn within_counts_back_from_a_newest_a_few_minutes_ahead() {
        let now = Utc::now();
        let fmt = |t: DateTime<Utc>| t.format("%Y-%m-%dT%H:%M:%S.000000000Z").to_string();
        let times = [
            fmt(now - TimeDelta::days(3)),
            fmt(now - TimeDelta::days(2)),
            fmt(now + TimeDelta::minutes(10)),
        ];
        let s = at(&times.iter().map(String::as_str).collect::<Vec<_>>());
        let p = Policy {
            within: Some("1d".parse().unwrap()),
            ..Default::default()
        };
        assert_eq!(kept_times(&s, &p), vec![times[2].clone()]);
    }

    /// `1h30m` is refused: m is months, and read after hours it looks like
    /// minutes (QA r12: kept "within 30m1h").
    #[test]
    fn months_after_days_or_hours_are_refused() {
        for bad in ["1h30m", "2d1m"] {
            let e = bad.parse::<CalendarDuration>().unwrap_err().to_string();
            assert!(e.contains("minutes are no unit"), "{bad}: {e}");
        }
        assert!("1y2m3d4h".parse::<CalendarDuration>().is_ok());
    }

    #[test]
    fn within_rules_keep_each_buckets_newest_inside_their_span() {
        // Every six hours for four days; the newest is 2026-11-04 18:00.
        let times: Vec<String> = (1..=4)
            .flat_map(|d| [0, 6, 12, 18].map(|h| format!("2026-11-{d:02} {h:02}:00")))
            .collect();
        let s = at(&times.iter().map(String::as_str).collect::<Vec<_>>());
        let p = Policy {
            within_daily: Some("2d".parse().unwrap()),
            within_hourly: Some("12h".parse().unwrap()),
            ..Default::default()
        };
        // Daily: the newest of each day after 11-02 18:00 (that one is exactly two
        // days back, so not within); hourly: every snapshot after 11-04 06:00.
        assert_eq!(
            kept(&s, &p),
            vec![
                k("2026-11-03 18:00", &["daily within 2d"]),
                k("2026-11-04 12:00", &["hourly within 12h"]),
                k(
                    "2026-11-04 18:00",
                    &["hourly within 12h", "daily within 2d"]
                ),
            ]
        );
        assert_eq!(removed_times(&s, &p).len(), 13);
        // Only each bucket's newest, the group's oldest not besides (as
        // restic's within rules).
        let s = at(&["2024-05-01 08:00", "2024-05-10 08:00", "2024-05-20 08:00"]);
        let p = Policy {
            within_monthly: Some("1y".parse().unwrap()),
            ..Default::default()
        };
        assert_eq!(
            kept(&s, &p),
            vec![k("2024-05-20 08:00", &["monthly within 1y"])]
        );
        // No count limits them: thirty days of dailies are thirty snapshots.
        let days: Vec<String> = (1..=30).map(|d| format!("2026-11-{d:02} 10:00")).collect();
        let s = at(&days.iter().map(String::as_str).collect::<Vec<_>>());
        let p = Policy {
            within_daily: Some("1m".parse().unwrap()),
            ..Default::default()
        };
        assert_eq!(kept(&s, &p).len(), 30);
        assert!(!p.is_empty());
        assert_eq!(
            p.to_string(),
            "keep daily snapshots within 1m of the newest"
        );
    }

    fn ten_days() -> Vec<(SnapshotId, Snapshot)> {
        at(&[
            "2026-11-01 10:00",
            "2026-11-02 10:00",
            "2026-11-03 10:00",
            "2026-11-04 10:00",
            "2026-11-05 10:00",
            "2026-11-06 10:00",
            "2026-11-07 10:00",
            "2026-11-08 10:00",
            "2026-11-09 10:00",
            "2026-11-10 10:00",
        ])
    }

    #[test]
    fn keep_last_3_of_10() {
        let s = ten_days();
        let p = Policy {
            last: Some(3),
            ..Default::default()
        };
        let g = run(&s, &p);
        assert_eq!(g.len(), 1);
        assert_eq!(
            kept(&s, &p),
            vec![
                k("2026-11-08 10:00", &["last snapshot"]),
                k("2026-11-09 10:00", &["last snapshot"]),
                k("2026-11-10 10:00", &["last snapshot"]),
            ]
        );
        assert_eq!(g[0].remove.len(), 7);
        assert_eq!(time_of(&s, &g[0].remove[0]), full("2026-11-01 10:00"));
    }

    #[test]
    fn order_of_input_does_not_matter() {
        let mut s = ten_days();
        s.reverse();
        s.swap(2, 7);
        let p = Policy {
            last: Some(2),
            ..Default::default()
        };
        assert_eq!(
            kept_times(&s, &p),
            ts(&["2026-11-09 10:00", "2026-11-10 10:00"])
        );
    }

    #[test]
    fn keep_last_more_than_there_are_keeps_all() {
        let s = ten_days();
        let p = Policy {
            last: Some(50),
            ..Default::default()
        };
        assert_eq!(kept_times(&s, &p).len(), 10);
        let p = Policy {
            last: Some(-1),
            ..Default::default()
        };
        assert_eq!(kept_times(&s, &p).len(), 10);
        assert!(run(&s, &p)[0].remove.is_empty());
    }

    fn several_per_day() -> Vec<(SnapshotId, Snapshot)> {
        at(&[
            "2026-11-20 08:00",
            "2026-11-20 12:00",
            "2026-11-20 18:00",
            "2026-11-21 09:00",
            "2026-11-21 23:59",
            "2026-11-22 00:00",
            "2026-11-22 00:01",
        ])
    }

    #[test]
    fn daily_takes_the_newest_of_each_day() {
        let s = several_per_day();
        let p = Policy {
            daily: Some(2),
            ..Default::default()
        };
        assert_eq!(
            kept_times(&s, &p),
            ts(&["2026-11-21 23:59", "2026-11-22 00:01"])
        );
        assert_eq!(
            removed_times(&s, &p),
            ts(&[
                "2026-11-20 08:00",
                "2026-11-20 12:00",
                "2026-11-20 18:00",
                "2026-11-21 09:00",
                "2026-11-22 00:00"
            ])
        );
    }

    #[test]
    fn daily_with_count_left_also_keeps_the_oldest() {
        let s = several_per_day();
        let p = Policy {
            daily: Some(5),
            ..Default::default()
        };
        assert_eq!(
            kept(&s, &p),
            vec![
                k("2026-11-20 08:00", &["oldest daily snapshot"]),
                k("2026-11-20 18:00", &["daily snapshot"]),
                k("2026-11-21 23:59", &["daily snapshot"]),
                k("2026-11-22 00:01", &["daily snapshot"]),
            ]
        );
        // Exactly used up: no extra oldest.
        let p = Policy {
            daily: Some(3),
            ..Default::default()
        };
        assert_eq!(
            kept_times(&s, &p),
            ts(&["2026-11-20 18:00", "2026-11-21 23:59", "2026-11-22 00:01"])
        );
    }

    #[test]
    fn unlimited_daily_keeps_one_per_day_forever() {
        let s = several_per_day();
        let p = Policy {
            daily: Some(-1),
            ..Default::default()
        };
        assert_eq!(
            kept_times(&s, &p),
            ts(&[
                "2026-11-20 08:00",
                "2026-11-20 18:00",
                "2026-11-21 23:59",
                "2026-11-22 00:01"
            ])
        );
    }

    #[test]
    fn hourly_buckets_are_clock_hours() {
        let s = at(&[
            "2026-11-22 10:05",
            "2026-11-22 10:55",
            "2026-11-22 11:00",
            "2026-11-22 11:59",
            "2026-11-22 12:00",
        ]);
        let p = Policy {
            hourly: Some(2),
            ..Default::default()
        };
        assert_eq!(
            kept_times(&s, &p),
            ts(&["2026-11-22 11:59", "2026-11-22 12:00"])
        );
        let p = Policy {
            hourly: Some(3),
            ..Default::default()
        };
        assert_eq!(
            kept_times(&s, &p),
            ts(&["2026-11-22 10:55", "2026-11-22 11:59", "2026-11-22 12:00"])
        );
    }

    #[test]
    fn weekly_uses_iso_weeks_across_year_ends() {
        // ISO weeks: 2018-12-30 is 2018-W52, 2018-12-31 is 2019-W01, 2019-12-29 is
        // 2019-W52, 2019-12-30 and 2020-01-01 are 2020-W01, 2020-12-28 and
        // 2021-01-03 are 2020-W53, 2021-01-04 is 2021-W01.
        let s = at(&[
            "2018-12-30 12:00",
            "2018-12-31 12:00",
            "2019-12-29 12:00",
            "2019-12-30 12:00",
            "2020-01-01 12:00",
            "2020-12-28 12:00",
            "2021-01-03 12:00",
            "2021-01-04 12:00",
        ]);
        let p = Policy {
            weekly: Some(-1),
            ..Default::default()
        };
        assert_eq!(
            kept_times(&s, &p),
            ts(&[
                "2018-12-30 12:00",
                "2018-12-31 12:00",
                "2019-12-29 12:00",
                "2020-01-01 12:00",
                "2021-01-03 12:00",
                "2021-01-04 12:00"
            ])
        );
        assert_eq!(
            removed_times(&s, &p),
            ts(&["2019-12-30 12:00", "2020-12-28 12:00"])
        );
        let p = Policy {
            weekly: Some(3),
            ..Default::default()
        };
        assert_eq!(
            kept_times(&s, &p),
            ts(&["2020-01-01 12:00", "2021-01-03 12:00", "2021-01-04 12:00"])
        );
    }

    #[test]
    fn monthly_and_yearly() {
        let s = at(&[
            "2023-06-01",
            "2024-02-10",
            "2024-02-29",
            "2024-11-30",
            "2025-01-01",
            "2025-01-31 23:59",
            "2025-03-01",
            "2025-03-15",
        ]);
        let p = Policy {
            monthly: Some(3),
            ..Default::default()
        };
        assert_eq!(
            kept_times(&s, &p),
            ts(&["2024-11-30", "2025-01-31 23:59", "2025-03-15"])
        );
        let p = Policy {
            yearly: Some(2),
            ..Default::default()
        };
        assert_eq!(kept_times(&s, &p), ts(&["2024-11-30", "2025-03-15"]));
        let p = Policy {
            yearly: Some(10),
            ..Default::default()
        };
        assert_eq!(
            kept(&s, &p),
            vec![
                k("2023-06-01", &["yearly snapshot"]),
                k("2024-11-30", &["yearly snapshot"]),
                k("2025-03-15", &["yearly snapshot"]),
            ]
        );
    }

    #[test]
    fn within_counts_back_from_the_newest_not_in_the_future() {
        let s = at(&[
            "2020-11-20 12:00",
            "2020-11-22 11:00",
            "2020-11-22 12:00",
            "2200-01-01 00:00",
        ]);
        let p = Policy {
            within: Some("1d".parse().unwrap()),
            ..Default::default()
        };
        assert_eq!(
            kept(&s, &p),
            vec![
                k("2020-11-22 11:00", &["within 1d"]),
                k("2020-11-22 12:00", &["within 1d"]),
                k("2200-01-01 00:00", &[FUTURE_REASON]),
            ]
        );
    }

    /// "2026-11-01 03:00" as a receive time.
    fn utc(t: &str) -> DateTime<Utc> {
        DateTime::parse_from_rfc3339(&full(t)).unwrap().to_utc()
    }

    /// The kept snapshots' times with receive records given per position.
    fn kept_received(
        snaps: &[(SnapshotId, Snapshot)],
        received: &[(usize, &str)],
        p: &Policy,
    ) -> (Vec<String>, Vec<String>) {
        let rec: Received = received
            .iter()
            .map(|(i, t)| (snaps[*i].0, utc(t)))
            .collect();
        let g = plan_received_in(
            snaps,
            &rec,
            p,
            GroupBy::default(),
            &SnapshotFilter::default(),
            &Utc,
        )
        .unwrap();
        (
            g[0].keep.iter().map(|(i, _)| time_of(snaps, i)).collect(),
            g[0].stored_late.iter().map(|i| time_of(snaps, i)).collect(),
        )
    }

    /// A hijacked backup client that dates junk at the end of past days, stored
    /// through `cairn serve` after the real backups of those days, does not take
    /// their daily slots (without the receive records it does).
    #[test]
    fn snapshots_stored_late_take_no_slot_from_those_stored_in_order() {
        let mut times = Vec::new();
        let mut received = Vec::new();
        for d in 1..=10 {
            received.push((times.len(), format!("2026-11-{d:02} 03:00")));
            times.push(format!("2026-11-{d:02} 02:00"));
        }
        for d in 1..=9 {
            received.push((times.len(), "2026-11-11 12:00".to_string()));
            times.push(format!("2026-11-{d:02} 23:59"));
        }
        let s = at(&times.iter().map(String::as_str).collect::<Vec<_>>());
        let received: Vec<(usize, &str)> = received.iter().map(|(i, t)| (*i, t.as_str())).collect();
        let p = Policy {
            daily: Some(7),
            ..Default::default()
        };
        let real: Vec<String> = (4..=10)
            .map(|d| full(&format!("2026-11-{d:02} 02:00")))
            .collect();
        let old = kept_times(&s, &p);
        assert!(
            !old.contains(&real[0]),
            "one pass: junk takes the days: {old:?}"
        );
        let (kept, late) = kept_received(&s, &received, &p);
        for r in &real {
            assert!(kept.contains(r), "{r} lost: {kept:?}");
        }
        // The junk of those days is kept too (the one-pass policy keeps it): a
        // superset, never less than before.
        for o in &old {
            assert!(kept.contains(o), "{o} lost: {kept:?}");
        }
        assert_eq!(kept.len(), 13, "{kept:?}");
        assert_eq!(
            late,
            (1..=9)
                .map(|d| full(&format!("2026-11-{d:02} 23:59")))
                .collect::<Vec<_>>()
        );
    }

    /// Honest late stores: a copy of older snapshots, and a long backup that
    /// ends after a shorter, later one, are kept as the policy keeps them.
    #[test]
    fn copies_and_long_backups_stored_late_are_kept_by_the_policy() {
        let s = at(&[
            "2026-11-01 02:00", // copied in on the 11th
            "2026-11-02 02:00", // copied in on the 11th
            "2026-11-05 02:00",
            "2026-11-06 12:00", // a long backup, ends on the 7th at 04:00
            "2026-11-07 01:00",
        ]);
        let received = [
            (0, "2026-11-11 00:00"),
            (1, "2026-11-11 00:00"),
            (2, "2026-11-05 03:00"),
            (3, "2026-11-07 04:00"),
            (4, "2026-11-07 02:00"),
        ];
        let p = Policy {
            daily: Some(10),
            ..Default::default()
        };
        let (kept, late) = kept_received(&s, &received, &p);
        assert_eq!(kept.len(), 5, "{kept:?}");
        assert_eq!(
            late,
            ts(&["2026-11-01 02:00", "2026-11-02 02:00", "2026-11-06 12:00"])
        );
        let p = Policy {
            daily: Some(2),
            ..Default::default()
        };
        // The long backup is the 6th's daily; the snapshots stored in order are
        // judged without it, so the 5th stays as their second day: one more kept
        // than a single pass would.
        let (kept, _) = kept_received(&s, &received, &p);
        assert_eq!(
            kept,
            ts(&["2026-11-05 02:00", "2026-11-06 12:00", "2026-11-07 01:00"])
        );
    }

    /// Snapshots without a record (stored directly or by an admin) are never
    /// late, and a record-less snapshot counts as received when dated; of those
    /// received at the same recorded time, any dated before another is late
    /// (either may have come first).
    #[test]
    fn only_recorded_snapshots_received_after_a_later_dated_one_are_late() {
        let s = at(&[
            "2026-11-01 02:00", // direct, after the 03:00 one: not late
            "2026-11-01 03:00", // direct
            "2026-11-01 01:00", // recorded at 02:30: after 02:00 was "received"
            "2026-11-02 01:00", // recorded together with the next: late
            "2026-11-02 02:00",
        ]);
        let received = [
            (2, "2026-11-01 02:30"),
            (3, "2026-11-03 00:00"),
            (4, "2026-11-03 00:00"),
        ];
        let p = Policy {
            last: Some(1),
            ..Default::default()
        };
        let (_, late) = kept_received(&s, &received, &p);
        assert_eq!(late, ts(&["2026-11-01 01:00", "2026-11-02 01:00"]));
    }

    /// QA r35: a backup, then within the same second junk dated at the end of
    /// the day before. With whole-second records the junk is late all the same;
    /// with the server's nanoseconds the records tell the order.
    #[test]
    fn junk_stored_in_the_same_second_as_the_real_backup_is_late() {
        let s = at(&[
            "2026-12-05 10:00",
            "2026-12-06 10:00",
            "2026-12-05 23:59", // junk, stored right after the 6th's backup
        ]);
        let p = Policy {
            daily: Some(2),
            ..Default::default()
        };
        for junk_at in ["2026-12-06 10:05", "2026-12-06 10:05:00.25Z"] {
            let rec: Received = [
                (0, utc("2026-12-05 10:05")),
                (1, utc("2026-12-06 10:05")),
                (2, utc(junk_at)),
            ]
            .into_iter()
            .map(|(i, t)| (s[i].0, t))
            .collect();
            let g = plan_received_in(
                &s,
                &rec,
                &p,
                GroupBy::default(),
                &SnapshotFilter::default(),
                &Utc,
            )
            .unwrap();
            let kept: Vec<String> = g[0].keep.iter().map(|(i, _)| time_of(&s, i)).collect();
            assert!(
                kept.contains(&full("2026-12-05 10:00")),
                "{junk_at}: {kept:?}"
            );
            let late: Vec<String> = g[0].stored_late.iter().map(|i| time_of(&s, i)).collect();
            assert_eq!(late, ts(&["2026-12-05 23:59"]), "{junk_at}");
        }
    }

    /// Whatever the one-pass policy keeps, the two-pass one keeps too, for any
    /// receive times (seeded random histories, every rule).
    #[test]
    fn receive_records_only_ever_keep_more() {
        let mut x: u64 = 0x9e37_79b9_7f4a_7c15;
        let mut next = |n: u64| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            x % n
        };
        let (mut late_seen, mut more_kept) = (0, 0);
        for round in 0..300 {
            let n = 1 + next(30) as usize;
            let base = utc("2026-01-01 00:00").timestamp();
            let mut times = Vec::new();
            let mut rec = Vec::new();
            for i in 0..n {
                let t = base + next(90 * 86400) as i64;
                times.push(DateTime::from_timestamp(t, 0).unwrap());
                if next(3) > 0 {
                    rec.push((i, t + next(20 * 86400) as i64));
                }
            }
            let strs: Vec<String> = times
                .iter()
                .map(|t| t.to_rfc3339_opts(chrono::SecondsFormat::Nanos, true))
                .collect();
            let s = at(&strs.iter().map(String::as_str).collect::<Vec<_>>());
            let received: Received = rec
                .iter()
                .map(|(i, t)| (s[*i].0, DateTime::from_timestamp(*t, 0).unwrap()))
                .collect();
            let mut c = || match next(4) {
                0 => None,
                _ => Some(1 + next(6) as i64),
            };
            let p = Policy {
                last: c(),
                hourly: c(),
                daily: c(),
                weekly: c(),
                monthly: c(),
                yearly: c(),
                ..Default::default()
            };
            if p.is_empty() {
                continue;
            }
            let one =
                plan_in(&s, &p, GroupBy::default(), &SnapshotFilter::default(), &Utc).unwrap();
            let two = plan_received_in(
                &s,
                &received,
                &p,
                GroupBy::default(),
                &SnapshotFilter::default(),
                &Utc,
            )
            .unwrap();
            let kept2: HashSet<SnapshotId> = two[0].keep.iter().map(|(i, _)| *i).collect();
            for (id, _) in &one[0].keep {
                assert!(kept2.contains(id), "round {round}: {id:?} lost");
            }
            assert_eq!(two[0].keep.len() + two[0].remove.len(), n, "round {round}");
            late_seen += two[0].stored_late.len();
            more_kept += two[0].keep.len() - one[0].keep.len();
        }
        // The histories do exercise the second pass.
        assert!(late_seen > 300 && more_kept > 20, "{late_seen} {more_kept}");
    }

    /// Snapshots dated ahead (a client that may only add backups, forging times)
    /// take no slot: the real ones keep theirs.
    #[test]
    fn snapshots_dated_in_the_future_take_no_slot() {
        let s = at(&[
            "2020-11-20 12:00",
            "2020-11-21 12:00",
            "2020-11-22 12:00",
            "2030-01-01 00:00",
            "2030-01-02 00:00",
            "2030-01-03 00:00",
        ]);
        for p in [
            Policy {
                daily: Some(3),
                ..Default::default()
            },
            Policy {
                last: Some(3),
                ..Default::default()
            },
        ] {
            let got = kept_times(&s, &p);
            assert_eq!(got.len(), 6, "{got:?}");
        }
        let p = Policy {
            last: Some(1),
            ..Default::default()
        };
        assert_eq!(
            kept_times(&s, &p),
            ts(&[
                "2020-11-22 12:00",
                "2030-01-01 00:00",
                "2030-01-02 00:00",
                "2030-01-03 00:00"
            ])
        );
    }

    #[test]
    fn within_one_day_of_the_newest_not_of_now() {
        let s = at(&[
            "2020-11-20 12:00",
            "2020-11-21 12:00",
            "2020-11-21 12:00:01",
            "2020-11-22 11:00",
            "2020-11-22 12:00",
        ]);
        let w: CalendarDuration = "1d".parse().unwrap();
        let p = Policy {
            within: Some(w),
            ..Default::default()
        };
        // Exactly one day before the newest is not "within" (strictly newer only).
        assert_eq!(
            kept(&s, &p),
            vec![
                k("2020-11-21 12:00:01", &["within 1d"]),
                k("2020-11-22 11:00", &["within 1d"]),
                k("2020-11-22 12:00", &["within 1d"]),
            ]
        );
    }

    #[test]
    fn within_one_month_steps_the_calendar() {
        // One month before March 31 is "February 31", which rolls over to March 3.
        let s = at(&[
            "2026-02-28 12:00",
            "2026-03-03 09:59",
            "2026-03-03 10:00:01",
            "2026-03-31 10:00",
        ]);
        let p = Policy {
            within: Some("1m".parse().unwrap()),
            ..Default::default()
        };
        assert_eq!(
            kept_times(&s, &p),
            ts(&["2026-03-03 10:00:01", "2026-03-31 10:00"])
        );
    }

    #[test]
    fn calendar_duration_before() {
        let t = Utc.with_ymd_and_hms(2026, 3, 31, 10, 0, 0).unwrap();
        let d: CalendarDuration = "1y2m3d4h".parse().unwrap();
        // 2025-01-31 minus 3 days = 2025-01-28 10:00, minus 4 hours.
        assert_eq!(
            d.before(&t).unwrap(),
            Utc.with_ymd_and_hms(2025, 1, 28, 6, 0, 0).unwrap()
        );
        let d: CalendarDuration = "40d".parse().unwrap();
        assert_eq!(
            d.before(&t).unwrap(),
            Utc.with_ymd_and_hms(2026, 2, 19, 10, 0, 0).unwrap()
        );
        let d: CalendarDuration = "25h".parse().unwrap();
        assert_eq!(
            d.before(&t).unwrap(),
            Utc.with_ymd_and_hms(2026, 3, 30, 9, 0, 0).unwrap()
        );
        // Far beyond the calendar: no instant, which means "everything is within".
        let d: CalendarDuration = "4000000000y".parse().unwrap();
        assert!(d.before(&t).is_none());
    }

    #[test]
    fn within_beyond_the_calendar_keeps_everything() {
        let s = ten_days();
        let p = Policy {
            within: Some("4000000000y".parse().unwrap()),
            ..Default::default()
        };
        assert_eq!(kept_times(&s, &p).len(), 10);
    }

    #[test]
    fn keep_tag_lists() {
        let s = vec![
            (id(0), snap(&full("2026-01-01"), "h", &["/d"], &["foo"])),
            (id(1), snap(&full("2026-01-02"), "h", &["/d"], &["a"])),
            (id(2), snap(&full("2026-01-03"), "h", &["/d"], &["a", "b"])),
            (id(3), snap(&full("2026-01-04"), "h", &["/d"], &[])),
            (id(4), snap(&full("2026-01-05"), "h", &["/d"], &["bar"])),
        ];
        let p = Policy {
            keep_tags: vec!["foo".into(), "a,b".into()],
            ..Default::default()
        };
        assert_eq!(
            kept(&s, &p),
            vec![
                k("2026-01-01", &["has tags [foo]"]),
                k("2026-01-03", &["has tags [a, b]"]),
            ]
        );
        let p = Policy {
            keep_tags: vec!["".into()],
            ..Default::default()
        };
        assert_eq!(kept(&s, &p), vec![k("2026-01-04", &["no tags"])]);
    }

    #[test]
    fn keep_tag_matching_nothing_refuses_to_empty_a_group() {
        let s = ten_days();
        let p = Policy {
            keep_tags: vec!["tpyo".into()],
            ..Default::default()
        };
        let e = plan_in(&s, &p, GroupBy::default(), &SnapshotFilter::default(), &Utc).unwrap_err();
        assert!(matches!(e, Error::WouldRemoveAll { .. }), "{e}");
        assert!(e.to_string().contains("host h, paths [/data]"), "{e}");

        // Every group that would be emptied is named, not only the first; a group
        // that keeps something is not.
        let mut s = ten_days();
        s[3].1.hostname = "g".into();
        s[5].1.hostname = "k".into();
        s[5].1.tags = vec!["tpyo".into()];
        let e = plan_in(&s, &p, GroupBy::default(), &SnapshotFilter::default(), &Utc).unwrap_err();
        let m = e.to_string();
        assert!(m.starts_with("in 2 groups no snapshot matches"), "{m}");
        assert!(
            m.contains("host g, paths [/data]; host h, paths [/data]"),
            "{m}"
        );
        assert!(!m.contains("host k"), "{m}");
    }

    #[test]
    fn several_rules_give_several_reasons() {
        let mut s = at(&["2025-12-30 10:00", "2026-01-01 10:00", "2026-01-01 11:00"]);
        s[2].1.tags = vec!["keep".into()];
        let p = Policy {
            last: Some(1),
            hourly: Some(1),
            daily: Some(1),
            weekly: Some(1),
            monthly: Some(2),
            yearly: Some(5),
            within: Some("2h".parse().unwrap()),
            keep_tags: vec!["keep".into()],
            ..Default::default()
        };
        assert_eq!(
            kept(&s, &p),
            vec![
                k("2025-12-30 10:00", &["monthly snapshot", "yearly snapshot"]),
                k("2026-01-01 10:00", &["within 2h"]),
                k(
                    "2026-01-01 11:00",
                    &[
                        "has tags [keep]",
                        "within 2h",
                        "last snapshot",
                        "hourly snapshot",
                        "daily snapshot",
                        "weekly snapshot",
                        "monthly snapshot",
                        "yearly snapshot"
                    ]
                ),
            ]
        );
    }

    fn mixed_hosts() -> Vec<(SnapshotId, Snapshot)> {
        vec![
            (id(0), snap(&full("2026-01-01"), "a", &["/x"], &["t1"])),
            (id(1), snap(&full("2026-01-02"), "a", &["/x"], &["t2"])),
            (id(2), snap(&full("2026-01-03"), "a", &["/y"], &["t1"])),
            (id(3), snap(&full("2026-01-04"), "b", &["/x"], &["t1"])),
            (id(4), snap(&full("2026-01-05"), "b", &["/x"], &["t2"])),
            (id(5), snap(&full("2026-01-06"), "a", &["/y", "/x"], &[])),
            (id(6), snap(&full("2026-01-07"), "a", &["/x", "/y"], &[])),
        ]
    }

    fn last1(s: &[(SnapshotId, Snapshot)], by: GroupBy, f: &SnapshotFilter) -> Vec<ForgetGroup> {
        let p = Policy {
            last: Some(1),
            ..Default::default()
        };
        plan_in(s, &p, by, f, &Utc).unwrap()
    }

    #[test]
    fn groups_by_host_and_paths() {
        let s = mixed_hosts();
        let g = last1(&s, GroupBy::default(), &SnapshotFilter::default());
        let keys: Vec<String> = g.iter().map(|g| g.key.to_string()).collect();
        // Path order inside a snapshot does not split a group.
        assert_eq!(
            keys,
            [
                "host a, paths [/x]",
                "host a, paths [/x /y]",
                "host a, paths [/y]",
                "host b, paths [/x]"
            ]
        );
        let kept: Vec<Vec<SnapshotId>> = g
            .iter()
            .map(|g| g.keep.iter().map(|(i, _)| *i).collect())
            .collect();
        assert_eq!(
            kept,
            vec![vec![id(1)], vec![id(6)], vec![id(2)], vec![id(4)]]
        );
        assert_eq!(g[0].remove, vec![id(0)]);
        assert_eq!(g[1].remove, vec![id(5)]);
        assert!(g[2].remove.is_empty());
        assert_eq!(g[3].remove, vec![id(3)]);
    }

    #[test]
    fn other_groupings() {
        let s = mixed_hosts();
        let none: GroupBy = "".parse().unwrap();
        let g = last1(&s, none, &SnapshotFilter::default());
        assert_eq!(g.len(), 1);
        assert_eq!(g[0].key.to_string(), "all snapshots");
        assert_eq!(g[0].keep.len(), 1);
        assert_eq!(g[0].remove.len(), 6);

        let by_host: GroupBy = "host".parse().unwrap();
        let g = last1(&s, by_host, &SnapshotFilter::default());
        assert_eq!(g.len(), 2);
        assert_eq!(g[0].keep[0].0, id(6));
        assert_eq!(g[1].keep[0].0, id(4));

        let by_tags: GroupBy = "tags".parse().unwrap();
        let g = last1(&s, by_tags, &SnapshotFilter::default());
        let keys: Vec<String> = g.iter().map(|g| g.key.to_string()).collect();
        assert_eq!(keys, ["tags []", "tags [t1]", "tags [t2]"]);
        assert_eq!(
            g[1].key,
            GroupKey {
                host: None,
                paths: None,
                tags: Some(vec!["t1".into()])
            }
        );
    }

    #[test]
    fn filters_leave_other_snapshots_alone() {
        let s = mixed_hosts();
        let f = SnapshotFilter {
            hosts: vec!["b".into()],
            ..Default::default()
        };
        let g = last1(&s, GroupBy::default(), &f);
        assert_eq!(g.len(), 1);
        assert_eq!(g[0].keep[0].0, id(4));
        assert_eq!(g[0].remove, vec![id(3)]);

        let f = SnapshotFilter {
            tags: vec!["t1".into()],
            ..Default::default()
        };
        let g = last1(&s, "".parse().unwrap(), &f);
        assert_eq!(g[0].keep[0].0, id(3));
        assert_eq!(g[0].remove, vec![id(0), id(2)]);

        // All given paths must be in the snapshot; how a path is spelled does not
        // matter (a trailing slash, `//`, `.`, `..`).
        for paths in [["/x/", "/y"], ["//x", "/z/../y/."]] {
            let f = SnapshotFilter {
                paths: paths.iter().map(|p| p.to_string()).collect(),
                ..Default::default()
            };
            let g = last1(&s, "".parse().unwrap(), &f);
            assert_eq!(g[0].keep[0].0, id(6), "{paths:?}");
            assert_eq!(g[0].remove, vec![id(5)], "{paths:?}");
        }

        let f = SnapshotFilter {
            hosts: vec!["a".into(), "b".into()],
            tags: vec!["t2".into(), "".into()],
            paths: vec!["/x".into()],
        };
        let g = last1(&s, "".parse().unwrap(), &f);
        assert_eq!(g[0].keep[0].0, id(6));
        assert_eq!(g[0].remove, vec![id(1), id(4), id(5)]);

        let f = SnapshotFilter {
            hosts: vec!["nobody".into()],
            ..Default::default()
        };
        assert!(last1(&s, GroupBy::default(), &f).is_empty());
    }

    #[test]
    fn empty_policy_is_an_error() {
        let s = ten_days();
        let none = |p: Policy| {
            plan_in(&s, &p, GroupBy::default(), &SnapshotFilter::default(), &Utc).unwrap_err()
        };
        assert!(matches!(none(Policy::default()), Error::NoPolicy));
        assert!(matches!(
            none(Policy {
                last: Some(0),
                daily: Some(0),
                within: Some("0d".parse().unwrap()),
                ..Default::default()
            }),
            Error::NoPolicy
        ));
        assert_eq!(
            Error::NoPolicy.to_string(),
            "no policy given: nothing would be removed"
        );
        // Even with nothing to judge.
        let e = plan_in(
            &[],
            &Policy::default(),
            GroupBy::default(),
            &SnapshotFilter::default(),
            &Utc,
        )
        .unwrap_err();
        assert!(matches!(e, Error::NoPolicy));
    }

    #[test]
    fn counts_below_minus_one_are_rejected() {
        let p = Policy {
            weekly: Some(-2),
            ..Default::default()
        };
        let e = plan_in(
            &ten_days(),
            &p,
            GroupBy::default(),
            &SnapshotFilter::default(),
            &Utc,
        )
        .unwrap_err();
        assert!(e.to_string().contains("keep-weekly -2"), "{e}");
    }

    #[test]
    fn unreadable_time_is_an_error_not_a_guess() {
        let mut s = ten_days();
        s[4].1.time = "yesterday".into();
        let p = Policy {
            last: Some(1),
            ..Default::default()
        };
        let e = plan_in(&s, &p, GroupBy::default(), &SnapshotFilter::default(), &Utc).unwrap_err();
        assert!(matches!(e, Error::InvalidSnapshotTime { .. }), "{e}");
        // A snapshot the filter excludes is not looked at.
        let f = SnapshotFilter {
            hosts: vec!["other".into()],
            ..Default::default()
        };
        s[4].1.hostname = "unrelated".into();
        assert!(
            plan_in(&s, &p, GroupBy::default(), &f, &Utc)
                .unwrap()
                .is_empty()
        );
    }

    #[test]
    fn buckets_use_the_given_time_zone() {
        // 21:30Z and 22:30Z are one day in UTC but two days at UTC+2.
        let s = at(&["2026-11-21 21:30", "2026-11-21 22:30"]);
        let p = Policy {
            daily: Some(1),
            ..Default::default()
        };
        let plus2 = FixedOffset::east_opt(2 * 3600).unwrap();
        let utc = plan_in(&s, &p, GroupBy::default(), &SnapshotFilter::default(), &Utc).unwrap();
        let local = plan_in(
            &s,
            &p,
            GroupBy::default(),
            &SnapshotFilter::default(),
            &plus2,
        )
        .unwrap();
        assert_eq!(utc[0].keep.len(), 1);
        assert_eq!(local[0].keep.len(), 1);
        let p = Policy {
            daily: Some(2),
            ..Default::default()
        };
        let utc = plan_in(&s, &p, GroupBy::default(), &SnapshotFilter::default(), &Utc).unwrap();
        let local = plan_in(
            &s,
            &p,
            GroupBy::default(),
            &SnapshotFilter::default(),
            &plus2,
        )
        .unwrap();
        // UTC: one day, the older is only kept as "oldest"; UTC+2: two days.
        assert_eq!(utc[0].keep[0].1, ["oldest daily snapshot"]);
        assert_eq!(local[0].keep[0].1, ["daily snapshot"]);
    }

    /// A snapshot that recorded the zone it was taken in is counted in that zone,
    /// wherever `forget` runs (QA: a dry run in the shell and the cron job in UTC
    /// kept different snapshots). At +05:30: 23:00 on the 29th, 04:00 and 12:00
    /// on the 30th; `--keep-daily 2` drops the 04:00 one, as restic does.
    #[test]
    fn buckets_use_the_zone_each_snapshot_was_taken_in() {
        let mut s = at(&["2026-11-29 17:30", "2026-11-29 22:30", "2026-11-30 06:30"]);
        let p = Policy {
            daily: Some(2),
            ..Default::default()
        };
        let four_am = s[1].0;
        let plan = |s: &[(SnapshotId, Snapshot)], tz: &FixedOffset| {
            plan_in(s, &p, GroupBy::default(), &SnapshotFilter::default(), tz).unwrap()
        };
        let utc = FixedOffset::east_opt(0).unwrap();
        let kolkata = FixedOffset::east_opt(19800).unwrap();
        // Not recorded: counted where forget runs.
        assert_eq!(plan(&s, &kolkata)[0].remove, [four_am]);
        assert_eq!(plan(&s, &utc)[0].remove, [s[0].0]);
        for (_, snap) in &mut s {
            snap.utc_offset = Some(19800);
        }
        for tz in [utc, kolkata, FixedOffset::west_opt(10 * 3600).unwrap()] {
            assert_eq!(plan(&s, &tz)[0].remove, [four_am], "{tz}");
        }
    }

    #[test]
    fn nanoseconds_and_equal_times_are_ordered() {
        let s = at(&[
            "2026-01-01T00:00:00.000000002Z",
            "2026-01-01T00:00:00.000000001Z",
            "2026-01-01T00:00:00.000000002Z",
        ]);
        let p = Policy {
            last: Some(1),
            ..Default::default()
        };
        let g = run(&s, &p);
        // Same time: the larger id counts as newer, as in the snapshot list.
        let newer = if id(0) > id(2) { id(0) } else { id(2) };
        assert_eq!(g[0].keep[0].0, newer);
        assert_eq!(g[0].remove[0], id(1));
    }

    #[test]
    fn plan_uses_local_time_without_failing() {
        let p = Policy {
            daily: Some(3),
            ..Default::default()
        };
        let g = plan(
            &ten_days(),
            &p,
            GroupBy::default(),
            &SnapshotFilter::default(),
        )
        .unwrap();
        assert_eq!(g[0].keep.len() + g[0].remove.len(), 10);
    }

    #[test]
    fn duration_parses() {
        let d = |s: &str| s.parse::<CalendarDuration>().unwrap();
        assert_eq!(
            d("1y2m3d4h"),
            CalendarDuration {
                years: 1,
                months: 2,
                days: 3,
                hours: 4
            }
        );
        assert_eq!(
            d("2d"),
            CalendarDuration {
                days: 2,
                ..Default::default()
            }
        );
        assert_eq!(d("4h1y"), d("1y4h"));
        assert_eq!(d("007d").days, 7);
        assert!(d("0d").is_zero());
        for s in ["1y2m3d4h", "2d", "6m", "1y12h", "0h"] {
            assert_eq!(d(s).to_string(), s);
        }
        assert_eq!(d("4h1y").to_string(), "1y4h");
    }

    #[test]
    fn duration_errors_say_what_is_wrong() {
        let e = |s: &str| s.parse::<CalendarDuration>().unwrap_err().to_string();
        assert!(e("").contains("empty"), "{}", e(""));
        assert!(e("5").contains("5 has no unit"), "{}", e("5"));
        assert!(e("1d5").contains("5 has no unit"), "{}", e("1d5"));
        assert!(e("1w").contains("7d"), "{}", e("1w"));
        assert!(e("1M").contains("lowercase"), "{}", e("1M"));
        assert!(e("1x").contains("unknown unit 'x'"), "{}", e("1x"));
        assert!(e("1é").contains("unknown unit 'é'"), "{}", e("1é"));
        assert!(e("d").contains("expected a number"), "{}", e("d"));
        assert!(e("-1d").contains("expected a number"), "{}", e("-1d"));
        assert!(
            e("1d 2h").contains("expected a number at \" 2h\""),
            "{}",
            e("1d 2h")
        );
        assert!(e("1d1d").contains("given twice"), "{}", e("1d1d"));
        assert!(
            e("99999999999d").contains("too large"),
            "{}",
            e("99999999999d")
        );
        assert!(
            e("1x").starts_with("invalid duration \"1x\": "),
            "{}",
            e("1x")
        );
    }

    #[test]
    fn group_by_parses() {
        let g = |s: &str| s.parse::<GroupBy>();
        assert_eq!(g("host,paths").unwrap(), GroupBy::default());
        assert_eq!(
            g("tags,host").unwrap(),
            GroupBy {
                host: true,
                paths: false,
                tags: true
            }
        );
        assert_eq!(
            g("").unwrap(),
            GroupBy {
                host: false,
                paths: false,
                tags: false
            }
        );
        let e = g("host,time").unwrap_err().to_string();
        assert!(e.contains("\"time\""), "{e}");
    }

    #[test]
    fn policy_describes_itself() {
        let p = Policy {
            last: Some(3),
            daily: Some(7),
            weekly: Some(-1),
            within: Some("2d".parse().unwrap()),
            keep_tags: vec!["a".into(), "x,y".into()],
            ..Default::default()
        };
        assert_eq!(
            p.to_string(),
            "keep 3 latest snapshots, 7 daily snapshots, all weekly snapshots, \
             snapshots within 2d of the newest, snapshots tagged a, snapshots tagged x,y"
        );
    }
}
