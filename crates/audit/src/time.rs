//! Unix milliseconds to and from UTC civil time, without a time crate.
//!
//! The day arithmetic is Howard Hinnant's `days_from_civil` /
//! `civil_from_days` (proleptic Gregorian calendar), valid far beyond any
//! audit timestamp.

use crate::{Error, Result};

const MS_PER_DAY: i64 = 86_400_000;

/// The current Unix time in milliseconds (0 if the clock is before 1970).
pub fn now_ms() -> i64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| i64::try_from(d.as_millis()).unwrap_or(i64::MAX))
        .unwrap_or(0)
}

/// Days since 1970-01-01 for a proleptic Gregorian date.
fn days_from_civil(y: i64, m: i64, d: i64) -> i64 {
    let y = if m <= 2 { y - 1 } else { y };
    let era = y.div_euclid(400);
    let yoe = y - era * 400; // [0, 399]
    let mp = (m + 9) % 12; // March = 0
    let doy = (153 * mp + 2) / 5 + d - 1; // [0, 365]
    let doe = yoe * 365 + yoe / 4 - yoe / 100 + doy; // [0, 146096]
    era * 146_097 + doe - 719_468
}

/// (year, month, day) for days since 1970-01-01.
fn civil_from_days(z: i64) -> (i64, i64, i64) {
    let z = z + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z - era * 146_097;
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let y = yoe + era * 400;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let d = doy - (153 * mp + 2) / 5 + 1;
    let m = if mp < 10 { mp + 3 } else { mp - 9 };
    (if m <= 2 { y + 1 } else { y }, m, d)
}

fn days_in_month(y: i64, m: i64) -> i64 {
    match m {
        1 | 3 | 5 | 7 | 8 | 10 | 12 => 31,
        4 | 6 | 9 | 11 => 30,
        _ if (y % 4 == 0 && y % 100 != 0) || y % 400 == 0 => 29,
        _ => 28,
    }
}

/// Formats Unix milliseconds as UTC ISO 8601, e.g. `2026-11-29T10:00:00.123Z`.
pub fn format_time(ms: i64) -> String {
    let days = ms.div_euclid(MS_PER_DAY);
    let rem = ms.rem_euclid(MS_PER_DAY);
    let (y, m, d) = civil_from_days(days);
    let secs = rem / 1000;
    format!(
        "{y:04}-{m:02}-{d:02}T{:02}:{:02}:{:02}.{:03}Z",
        secs / 3600,
        secs / 60 % 60,
        secs % 60,
        rem % 1000
    )
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

/// A small cursor over ASCII digits.
struct Cursor<'a> {
    b: &'a [u8],
    i: usize,
}

impl Cursor<'_> {
    fn digits(&mut self, n: usize) -> Option<i64> {
        let end = self.i.checked_add(n)?;
        let chunk = self.b.get(self.i..end)?;
        if !chunk.iter().all(u8::is_ascii_digit) {
            return None;
        }
        self.i = end;
        Some(
            chunk
                .iter()
                .fold(0, |acc, d| acc * 10 + i64::from(d - b'0')),
        )
    }
    fn eat(&mut self, c: u8) -> bool {
        if self.b.get(self.i) == Some(&c) {
            self.i += 1;
            true
        } else {
            false
        }
    }
    fn peek(&self) -> Option<u8> {
        self.b.get(self.i).copied()
    }
    fn done(&self) -> bool {
        self.i == self.b.len()
    }
}

fn parse_absolute(t: &str) -> Option<i64> {
    let mut c = Cursor {
        b: t.as_bytes(),
        i: 0,
    };
    let y = c.digits(4)?;
    if !c.eat(b'-') {
        return None;
    }
    let mo = c.digits(2)?;
    if !c.eat(b'-') {
        return None;
    }
    let d = c.digits(2)?;
    if !(1..=12).contains(&mo) || d < 1 || d > days_in_month(y, mo) {
        return None;
    }
    let day_ms = days_from_civil(y, mo, d).checked_mul(MS_PER_DAY)?;
    if c.done() {
        return Some(day_ms);
    }
    if !(c.eat(b'T') || c.eat(b't') || c.eat(b' ')) {
        return None;
    }
    let h = c.digits(2)?;
    if !c.eat(b':') {
        return None;
    }
    let mi = c.digits(2)?;
    let mut sec = 0;
    let mut frac_ms = 0;
    if c.eat(b':') {
        sec = c.digits(2)?;
        if c.eat(b'.') || c.eat(b',') {
            let start = c.i;
            let mut scale = 100;
            while let Some(b) = c.peek().filter(u8::is_ascii_digit) {
                frac_ms += i64::from(b - b'0') * scale;
                scale /= 10;
                c.i += 1;
            }
            if c.i == start {
                return None;
            }
        }
    }
    // 60 allows a leap second; it lands on the next minute.
    if h > 23 || mi > 59 || sec > 60 {
        return None;
    }
    let mut offset_min = 0;
    match c.peek() {
        None => {}
        Some(b'Z' | b'z') => c.i += 1,
        Some(sign @ (b'+' | b'-')) => {
            c.i += 1;
            let oh = c.digits(2)?;
            c.eat(b':');
            let om = c.digits(2)?;
            if oh > 23 || om > 59 {
                return None;
            }
            offset_min = (oh * 60 + om) * if sign == b'+' { 1 } else { -1 };
        }
        Some(_) => return None,
    }
    if !c.done() {
        return None;
    }
    let local = day_ms + ((h * 60 + mi) * 60 + sec) * 1000 + frac_ms;
    Some(local - offset_min * 60_000)
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

    #[test]
    fn civil_arithmetic_agrees_day_by_day() {
        // Every day from 1960 to 2100 round-trips and advances by one.
        let start = days_from_civil(1960, 1, 1);
        let mut prev = civil_from_days(start - 1);
        for z in start..days_from_civil(2100, 1, 1) {
            let (y, m, d) = civil_from_days(z);
            assert_eq!(days_from_civil(y, m, d), z);
            assert!(d >= 1 && d <= days_in_month(y, m));
            assert!((y, m, d) > prev);
            prev = (y, m, d);
        }
    }
}
