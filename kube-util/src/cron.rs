//! Cron schedules of CronJobs: parsing as upstream's `robfig/cron`
//! standard parser (5 fields, names, steps, `@hourly` ... `@yearly`), and
//! the next times in a time zone. The API server validates with
//! [`parse`]; the cronjob controller schedules with the same value.

use jiff::tz::TimeZone;
use jiff::Timestamp;

/// Why a schedule or time zone is refused.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum Error {
    /// `TZ=` / `CRON_TZ=` inside the schedule: upstream wants the
    /// `timeZone` field instead.
    #[error("cannot use TZ or CRON_TZ in schedule, use timeZone field instead")]
    TimeZoneInSchedule,
    /// Anything the standard parser refuses.
    #[error("{0}")]
    Invalid(String),
}

/// A parsed 5-field schedule.
#[derive(Debug, Clone)]
pub struct Schedule {
    cron: croner::Cron,
}

/// Parse a CronJob schedule.
///
/// # Errors
/// [`Error::TimeZoneInSchedule`] for a `TZ=` prefix, [`Error::Invalid`]
/// for anything else the standard parser refuses (croner's extensions
/// `L`, `W`, `#`, `?` and a seconds field are refused, since upstream's
/// parser does not know them).
pub fn parse(schedule: &str) -> Result<Schedule, Error> {
    let s = schedule.trim();
    if s.starts_with("TZ=") || s.starts_with("CRON_TZ=") {
        return Err(Error::TimeZoneInSchedule);
    }
    let pattern = match s.to_ascii_lowercase().as_str() {
        // croner lacks @midnight; robfig/cron has it as @daily.
        "@midnight" => "0 0 * * *".to_string(),
        d if d.starts_with('@') => {
            if !matches!(
                d,
                "@yearly" | "@annually" | "@monthly" | "@weekly" | "@daily" | "@hourly"
            ) {
                return Err(Error::Invalid(format!("unrecognized descriptor: {s}")));
            }
            s.to_string()
        }
        _ => {
            let fields: Vec<&str> = s.split_whitespace().collect();
            if fields.len() != 5 {
                return Err(Error::Invalid(format!(
                    "expected exactly 5 fields, found {}: {s}",
                    fields.len()
                )));
            }
            for f in &fields {
                check_field(f)?;
            }
            fields.join(" ")
        }
    };
    let cron = croner::Cron::new(&pattern)
        .parse()
        .map_err(|e| Error::Invalid(format!("{e}")))?;
    Ok(Schedule { cron })
}

/// Refuses croner's extensions that robfig/cron does not parse: every
/// alphabetic token must be a 3-letter month or weekday name.
fn check_field(f: &str) -> Result<(), Error> {
    if f.contains(['#', '?']) {
        return Err(Error::Invalid(format!("failed to parse int from {f}")));
    }
    for token in f.split([',', '-', '/']) {
        let alpha = token.chars().any(|c| c.is_ascii_alphabetic());
        if alpha && (token.len() != 3 || !token.chars().all(|c| c.is_ascii_alphabetic())) {
            return Err(Error::Invalid(format!("failed to parse int from {token}")));
        }
    }
    Ok(())
}

/// The IANA time zone `name` from jiff's database (bundled, so it works
/// without tzdata installed).
pub fn time_zone(name: &str) -> Option<TimeZone> {
    jiff::tz::db().get(name).ok()
}

impl Schedule {
    /// The first schedule time strictly after `t`, in `tz`.
    ///
    /// # Caveats
    /// croner works in chrono types: the search runs at `tz`'s offset at
    /// `t`, then again at the offset of the candidate when a DST change
    /// lies between, so a time a DST jump skips is not scheduled.
    pub fn next_after(&self, t: Timestamp, tz: &TimeZone) -> Option<Timestamp> {
        let first = tz.to_offset(t);
        let c1 = self.next_at_offset(t, first.seconds())?;
        let second = tz.to_offset(c1);
        if second == first {
            return Some(c1);
        }
        let c2 = self.next_at_offset(t, second.seconds())?;
        Some(if tz.to_offset(c2) == second { c2 } else { c1 })
    }

    // croner speaks only chrono: the conversion stays inside this
    // function, jiff everywhere else.
    #[allow(clippy::disallowed_types)]
    fn next_at_offset(&self, t: Timestamp, offset: i32) -> Option<Timestamp> {
        let fo = chrono::FixedOffset::east_opt(offset)?;
        let start = chrono::DateTime::from_timestamp(t.as_second(), 0)?.with_timezone(&fo);
        let next = self.cron.find_next_occurrence(&start, false).ok()?;
        Timestamp::from_second(next.timestamp()).ok()
    }
}

/// The schedule times a CronJob missed, as upstream's
/// `mostRecentScheduleTime`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Missed {
    /// The latest schedule time in `(earliest, now]`, if any.
    pub most_recent: Option<Timestamp>,
    /// How many schedule times lie in `(earliest, now]`; past 100 only
    /// "more than 100" is meaningful (upstream's TooManyMissedTimes).
    pub count: usize,
    /// The first schedule time after `now`.
    pub next: Option<Timestamp>,
}

/// The limit past which upstream warns of too many missed start times.
pub const TOO_MANY_MISSED: usize = 100;

/// The schedule times after `earliest` up to `now`: the most recent, how
/// many (counting stops past [`TOO_MANY_MISSED`]), and the next after
/// `now`.
pub fn missed(s: &Schedule, tz: &TimeZone, earliest: Timestamp, now: Timestamp) -> Missed {
    let mut count = 0;
    let mut most_recent = None;
    let mut t = earliest;
    while let Some(n) = s.next_after(t, tz) {
        if n > now {
            return Missed {
                most_recent,
                count,
                next: Some(n),
            };
        }
        most_recent = Some(n);
        count += 1;
        t = n;
        if count > TOO_MANY_MISSED {
            break;
        }
    }
    if count <= TOO_MANY_MISSED {
        return Missed {
            most_recent,
            count,
            next: None,
        };
    }
    // Too many to walk: the most recent lies in a window before now
    // that grows until it holds one (or reaches where the walk stopped).
    let mut window = jiff::SignedDuration::from_hours(1);
    loop {
        let from = now.checked_sub(window).unwrap_or(t).max(t);
        let mut last = None;
        let mut at = from;
        let mut next = None;
        while let Some(n) = s.next_after(at, tz) {
            if n > now {
                next = Some(n);
                break;
            }
            last = Some(n);
            at = n;
        }
        if last.is_some() || from == t {
            return Missed {
                most_recent: last.or(most_recent),
                count,
                next,
            };
        }
        window = window.checked_mul(24).unwrap_or(window);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ts(s: &str) -> Timestamp {
        s.parse().unwrap()
    }

    #[test]
    fn parses_standard_syntax() {
        for ok in [
            "* * * * *",
            "*/5 1-3 1,15 JAN-MAR MON-FRI",
            "0 0 * * SUN",
            "@yearly",
            "@annually",
            "@monthly",
            "@weekly",
            "@daily",
            "@midnight",
            "@hourly",
        ] {
            assert!(parse(ok).is_ok(), "{ok}");
        }
        for bad in [
            "* * * *",
            "0 * * * * *",
            "61 * * * *",
            "0 0 L * *",
            "0 0 * * 5#2",
            "@every 5m",
            "foo",
        ] {
            assert!(parse(bad).is_err(), "{bad}");
        }
        assert_eq!(
            parse("TZ=UTC 0 * * * *").unwrap_err(),
            Error::TimeZoneInSchedule
        );
        assert_eq!(
            parse("CRON_TZ=UTC 0 * * * *").unwrap_err().to_string(),
            "cannot use TZ or CRON_TZ in schedule, use timeZone field instead"
        );
    }

    #[test]
    fn dom_or_dow_when_both_restricted() {
        // 2026-12-04 is a Friday: "the 1st or a Monday" next is Monday the 7th.
        let s = parse("0 0 1 * MON").unwrap();
        let n = s
            .next_after(ts("2026-12-04T00:00:00Z"), &TimeZone::UTC)
            .unwrap();
        assert_eq!(n, ts("2026-12-07T00:00:00Z"));
    }

    #[test]
    fn next_in_time_zone() {
        let tz = time_zone("Europe/Berlin").unwrap();
        let s = parse("0 9 * * *").unwrap();
        let n = s.next_after(ts("2026-12-04T00:00:00Z"), &tz).unwrap();
        assert_eq!(n, ts("2026-12-04T08:00:00Z"));
        // Summer time: 09:00 CEST is 07:00 UTC.
        let n = s.next_after(ts("2026-07-01T00:00:00Z"), &tz).unwrap();
        assert_eq!(n, ts("2026-07-01T07:00:00Z"));
        assert!(time_zone("Mars/Olympus").is_none());
    }

    #[test]
    fn missed_times() {
        let s = parse("*/10 * * * *").unwrap();
        let m = missed(
            &s,
            &TimeZone::UTC,
            ts("2026-12-04T10:00:00Z"),
            ts("2026-12-04T10:35:00Z"),
        );
        assert_eq!(m.count, 3);
        assert_eq!(m.most_recent, Some(ts("2026-12-04T10:30:00Z")));
        assert_eq!(m.next, Some(ts("2026-12-04T10:40:00Z")));
        let m = missed(
            &s,
            &TimeZone::UTC,
            ts("2026-12-04T10:00:00Z"),
            ts("2026-12-04T10:05:00Z"),
        );
        assert_eq!((m.count, m.most_recent), (0, None));
        // Every minute for a week: more than 100, the most recent still exact.
        let s = parse("* * * * *").unwrap();
        let m = missed(
            &s,
            &TimeZone::UTC,
            ts("2026-11-27T10:00:00Z"),
            ts("2026-12-04T10:35:30Z"),
        );
        assert!(m.count > TOO_MANY_MISSED);
        assert_eq!(m.most_recent, Some(ts("2026-12-04T10:35:00Z")));
        assert_eq!(m.next, Some(ts("2026-12-04T10:36:00Z")));
    }
}
