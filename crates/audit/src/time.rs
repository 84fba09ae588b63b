//! Unix milliseconds to and from UTC civil time, for record timestamps,
//! `mcpbox audit --since/--until` and retention: the calendar is jiff's.

use jiff::civil::{Date, DateTime};
use jiff::tz::TimeZone;
use jiff::Timestamp;

use crate::{Error, Result};

const MS_PER_DAY: i64 = 86_400_000;

/// The current Unix time in milliseconds (0 if the clock is before 1970).
pub fn now_ms() -> i64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| i64::try_from(d.as_millis()).unwrap_or(i64::MAX))
        .unwrap_or(0)
}

/// Formats Unix milliseconds as UTC ISO 8601, e.g. `2026-11-29T10:00:00.123Z`
/// (always three fractional digits, so the text sorts as the time does).
pub fn format_time(ms: i64) -> String {
    match Timestamp::from_millisecond(ms) {
        Ok(t) => t.strftime("%Y-%m-%dT%H:%M:%S%.3fZ").to_string(),
        // outside jiff's range (years -9999..=9999): no audit time is
        Err(_) => format!("@{ms}ms"),
    }
}

/// Parses a time for `mcpbox audit --since/--until` into Unix milliseconds.
///
/// Accepts:
/// - RFC 3339-ish: `2026-11-29T10:00:00Z`, with optional fractional seconds
///   (`.5`, `.123`), a `+02:00`/`-0500` offset instead of `Z`, a space or
///   lowercase `t` instead of `T`, and no offset at all (read as UTC); minutes
///   alone (`2026-11-29T10:00`) are fine too;
/// - a date `2026-11-29` (midnight UTC);
/// - a time relative to `now_ms`: `-30s`, `-30m`, `-1h`, `-7d`, `-2w` (the
///   leading `-` may be left out: it always means "ago"), and `now`.
pub fn parse_time(s: &str, now_ms: i64) -> Result<i64> {
    let bad = |why: &'static str| Error::BadTime {
        input: s.to_owned(),
        why,
    };
    let t = s.trim();
    if t.is_empty() {
        return Err(bad("empty"));
    }
    if t.eq_ignore_ascii_case("now") {
        return Ok(now_ms);
    }
    let rel = t.strip_prefix('-').unwrap_or(t);
    if let Some(unit) = rel.chars().last().filter(|c| c.is_ascii_alphabetic()) {
        let num = &rel[..rel.len() - unit.len_utf8()];
        if !num.is_empty() && num.bytes().all(|b| b.is_ascii_digit()) {
            let n: i64 = num.parse().map_err(|_| bad("number too large"))?;
            let unit_ms: i64 = match unit {
                's' => 1_000,
                'm' => 60_000,
                'h' => 3_600_000,
                'd' => MS_PER_DAY,
                'w' => 7 * MS_PER_DAY,
                _ => return Err(bad("unknown unit: use s, m, h, d or w")),
            };
            let ago = n
                .checked_mul(unit_ms)
                .ok_or_else(|| bad("number too large"))?;
            return now_ms
                .checked_sub(ago)
                .ok_or_else(|| bad("number too large"));
        }
    }
    parse_absolute(t).ok_or_else(|| bad("not a date, a date-time or a relative time"))
}

/// An absolute time: RFC 3339 with an offset (`Z`, `+02:00`, `-0500`), or
/// a civil date-time or date without one, read as UTC. The shape is checked
/// here (four-digit year, two-digit fields, a fraction with digits) before
/// jiff reads it, so nothing looser than the help promises is accepted.
fn parse_absolute(t: &str) -> Option<i64> {
    let b = t.as_bytes();
    let digits =
        |r: std::ops::Range<usize>| b.get(r).is_some_and(|s| s.iter().all(u8::is_ascii_digit));
    if !(digits(0..4)
        && b.get(4) == Some(&b'-')
        && digits(5..7)
        && b.get(7) == Some(&b'-')
        && digits(8..10))
    {
        return None;
    }
    if b.len() == 10 {
        let date: Date = t.parse().ok()?;
        let ts = TimeZone::UTC
            .to_timestamp(date.to_datetime(jiff::civil::Time::midnight()))
            .ok()?;
        return Some(ts.as_millisecond());
    }
    let clock = matches!(b.get(10), Some(b'T' | b't' | b' '))
        && digits(11..13)
        && b.get(13) == Some(&b':')
        && digits(14..16);
    if !clock {
        return None;
    }
    if let Some(dot) = t.find(['.', ',']) {
        // a fraction needs a digit
        if !digits(dot + 1..dot + 2) {
            return None;
        }
    }
    let sign = t[16..].find(['+', '-']).map(|i| i + 16);
    if let Some(i) = sign {
        // an offset within a day (jiff would take up to 25:59)
        let hours = t.get(i + 1..i + 3).and_then(|h| h.parse::<u8>().ok());
        if hours.is_none_or(|h| h > 23) {
            return None;
        }
    }
    let offset = sign.is_some() || t[16..].contains(['Z', 'z']);
    let ts = if offset {
        t.parse::<Timestamp>().ok()?
    } else {
        let dt: DateTime = t.parse().ok()?;
        TimeZone::UTC.to_timestamp(dt).ok()?
    };
    Some(ts.as_millisecond())
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    const NOW: i64 = 1_796_467_200_000; // 2026-12-05T10:40:00Z

    #[test]
    fn rfc3339_utc_parses() {
        assert_eq!(
            parse_time("2026-11-29T10:00:00Z", 0).unwrap(),
            1_795_946_400_000
        );
        assert_eq!(parse_time("1970-01-01T00:00:00Z", 0).unwrap(), 0);
        assert_eq!(
            parse_time("2000-03-01T00:00:00Z", 0).unwrap(),
            951_868_800_000
        );
    }

    #[test]
    fn rfc3339_variants_parse() {
        let base = parse_time("2026-11-29T10:00:00Z", 0).unwrap();
        assert_eq!(parse_time("2026-11-29t10:00:00z", 0).unwrap(), base);
        assert_eq!(parse_time("2026-11-29 10:00:00", 0).unwrap(), base);
        assert_eq!(parse_time("2026-11-29T10:00", 0).unwrap(), base);
        assert_eq!(
            parse_time("2026-11-29T10:00:00.123Z", 0).unwrap(),
            base + 123
        );
        assert_eq!(parse_time("2026-11-29T10:00:00.5Z", 0).unwrap(), base + 500);
        assert_eq!(parse_time("2026-11-29T12:00:00+02:00", 0).unwrap(), base);
        assert_eq!(parse_time("2026-11-29T05:00:00-0500", 0).unwrap(), base);
    }

    #[test]
    fn date_alone_is_midnight_utc() {
        assert_eq!(parse_time("2026-11-29", 0).unwrap(), 1_795_910_400_000);
        assert_eq!(parse_time("2024-02-29", 0).unwrap(), 1_709_164_800_000);
    }

    #[test]
    fn relative_times_count_back_from_now() {
        assert_eq!(parse_time("-1h", NOW).unwrap(), NOW - 3_600_000);
        assert_eq!(parse_time("-30m", NOW).unwrap(), NOW - 1_800_000);
        assert_eq!(parse_time("-7d", NOW).unwrap(), NOW - 7 * 86_400_000);
        assert_eq!(parse_time("-10s", NOW).unwrap(), NOW - 10_000);
        assert_eq!(parse_time("-2w", NOW).unwrap(), NOW - 14 * 86_400_000);
        assert_eq!(parse_time("1h", NOW).unwrap(), NOW - 3_600_000);
        assert_eq!(parse_time("now", NOW).unwrap(), NOW);
    }

    #[test]
    fn malformed_times_are_refused_not_guessed() {
        for bad in [
            "",
            "yesterday",
            "-1y",
            "-h",
            "--1h",
            "-1.5h",
            "2026-13-01",
            "2026-02-30",
            "2025-02-29",
            "2026-11-29T24:00:00Z",
            "2026-11-29T10:60:00Z",
            "2026-11-29T10:00:00+25:00",
            "2026-11-29T10:00:00Zjunk",
            "2026-11-29T10:00:00.Z",
            "2026-11-29T10:00é",
            "2026-11-29T10:00:00+é",
            "2026-1-29",
            "99999999999999999999d",
            "-9999999999999999w",
        ] {
            assert!(parse_time(bad, NOW).is_err(), "{bad:?} parsed");
        }
    }

    #[test]
    fn format_time_round_trips_through_parse() {
        for ms in [
            0,
            1,
            951_868_800_000,
            1_795_946_400_123,
            4_102_444_799_999,
            -1,
        ] {
            let s = format_time(ms);
            assert_eq!(parse_time(&s, 0).unwrap(), ms, "{s}");
        }
        assert_eq!(format_time(1_795_946_400_123), "2026-11-29T10:00:00.123Z");
        assert_eq!(format_time(-1), "1969-12-31T23:59:59.999Z");
    }
}
