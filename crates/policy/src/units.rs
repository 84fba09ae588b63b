//! Sizes ("256MiB") and durations ("60s"): parsing, printing and the serde glue
//! that makes a wrong type say what a valid value looks like.

use std::borrow::Cow;
use std::fmt;
use std::time::Duration;

use schemars::{json_schema, JsonSchema, Schema, SchemaGenerator};
use serde::de::{self, Visitor};
use serde::{Deserialize, Deserializer, Serialize, Serializer};

use crate::HINT_MARK;

/// Hint shown for any malformed size.
pub(crate) const SIZE_HINT: &str =
    "write a whole number with a unit: B, KiB, MiB, GiB, TiB (powers of 1024) or KB, MB, GB, TB (powers of 1000), e.g. \"256MiB\"";
/// Hint shown for any malformed duration.
pub(crate) const DURATION_HINT: &str =
    "write a whole number with a unit: ms, s, m, h or d, e.g. \"250ms\", \"60s\", \"5m\", \"1h\"";

const UNITS: &[(&str, u64)] = &[
    ("b", 1),
    ("kib", 1 << 10),
    ("mib", 1 << 20),
    ("gib", 1 << 30),
    ("tib", 1 << 40),
    ("kb", 1_000),
    ("mb", 1_000_000),
    ("gb", 1_000_000_000),
    ("tb", 1_000_000_000_000),
];

/// Splits "256MiB" into ("256", "MiB"), allowing one run of spaces between.
fn split_number(s: &str) -> Option<(u64, &str)> {
    let digits_end = s.find(|c: char| !c.is_ascii_digit()).unwrap_or(s.len());
    let (num, rest) = s.split_at(digits_end);
    if num.is_empty() || num.len() > 20 {
        return None;
    }
    let value = num.parse::<u64>().ok()?;
    Some((value, rest.trim_start_matches(' ')))
}

/// Parses a size: `"256MiB"`, `"1GiB"`, `"512KiB"`, `"100B"`, a plain number of
/// bytes (`"1048576"`), or `KB`/`MB`/`GB`/`TB` as powers of 1000. Units are
/// case-insensitive; fractions and negative numbers are refused.
pub fn parse_size(s: &str) -> Result<u64, String> {
    let bad = || format!("invalid size \"{}\"", s.escape_debug());
    let (value, unit) = split_number(s).ok_or_else(bad)?;
    if unit.is_empty() {
        return Ok(value);
    }
    let lower = unit.to_ascii_lowercase();
    let factor = UNITS
        .iter()
        .find(|(name, _)| *name == lower)
        .map(|(_, f)| *f)
        .ok_or_else(|| {
            format!(
                "invalid size \"{}\": unknown unit \"{}\"",
                s.escape_debug(),
                unit.escape_debug()
            )
        })?;
    value
        .checked_mul(factor)
        .ok_or_else(|| format!("size \"{}\" is too large", s.escape_debug()))
}

/// Parses a duration: `"250ms"`, `"60s"`, `"5m"`, `"1h"`, `"2d"`. A unit is
/// required: a bare number is ambiguous and refused.
pub fn parse_duration(s: &str) -> Result<Duration, String> {
    let bad = || format!("invalid duration \"{}\"", s.escape_debug());
    let (value, unit) = split_number(s).ok_or_else(bad)?;
    let too_large = || format!("duration \"{}\" is too large", s.escape_debug());
    match unit {
        "" => Err(format!("duration \"{}\" has no unit", s.escape_debug())),
        "ms" => Ok(Duration::from_millis(value)),
        "s" => Ok(Duration::from_secs(value)),
        "m" => value
            .checked_mul(60)
            .map(Duration::from_secs)
            .ok_or_else(too_large),
        "h" => value
            .checked_mul(3600)
            .map(Duration::from_secs)
            .ok_or_else(too_large),
        "d" => value
            .checked_mul(86_400)
            .map(Duration::from_secs)
            .ok_or_else(too_large),
        other => Err(format!(
            "invalid duration \"{}\": unknown unit \"{}\"",
            s.escape_debug(),
            other.escape_debug()
        )),
    }
}

/// Prints a size in the largest binary unit that represents it exactly.
pub fn format_size(bytes: u64) -> String {
    for (unit, factor) in [
        ("TiB", 1u64 << 40),
        ("GiB", 1 << 30),
        ("MiB", 1 << 20),
        ("KiB", 1 << 10),
    ] {
        if bytes >= factor && bytes.checked_rem(factor) == Some(0) {
            return format!("{}{unit}", bytes / factor);
        }
    }
    format!("{bytes}B")
}

/// Prints a duration in the largest unit that represents it exactly
/// (sub-millisecond precision cannot be written in a policy, so it is dropped).
pub fn format_duration(d: Duration) -> String {
    let ms = d.as_millis();
    for (unit, factor) in [
        ("d", 86_400_000u128),
        ("h", 3_600_000),
        ("m", 60_000),
        ("s", 1_000),
    ] {
        if ms >= factor && ms.checked_rem(factor) == Some(0) {
            return format!("{}{unit}", ms / factor);
        }
    }
    format!("{ms}ms")
}

struct SizeVisitor;

impl Visitor<'_> for SizeVisitor {
    type Value = u64;
    fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
        f.write_str("a size like \"256MiB\"")
    }
    fn visit_str<E: de::Error>(self, v: &str) -> Result<u64, E> {
        parse_size(v).map_err(|m| E::custom(format!("{m}{HINT_MARK}{SIZE_HINT}")))
    }
}

struct DurationVisitor;

impl Visitor<'_> for DurationVisitor {
    type Value = Duration;
    fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
        f.write_str("a duration like \"60s\"")
    }
    fn visit_str<E: de::Error>(self, v: &str) -> Result<Duration, E> {
        parse_duration(v).map_err(|m| E::custom(format!("{m}{HINT_MARK}{DURATION_HINT}")))
    }
}

/// serde glue for a required size field.
pub(crate) mod size {
    use super::*;
    pub fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<u64, D::Error> {
        d.deserialize_str(SizeVisitor)
    }
    pub fn serialize<S: Serializer>(v: &u64, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_str(&format_size(*v))
    }
}

/// serde glue for an optional size field.
pub(crate) mod opt_size {
    use super::*;
    pub fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<Option<u64>, D::Error> {
        d.deserialize_str(SizeVisitor).map(Some)
    }
    pub fn serialize<S: Serializer>(v: &Option<u64>, s: S) -> Result<S::Ok, S::Error> {
        match v {
            Some(v) => s.serialize_str(&format_size(*v)),
            None => s.serialize_none(),
        }
    }
}

/// serde glue for a required duration field.
pub(crate) mod duration {
    use super::*;
    pub fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<Duration, D::Error> {
        d.deserialize_str(DurationVisitor)
    }
    pub fn serialize<S: Serializer>(v: &Duration, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_str(&format_duration(*v))
    }
}

/// serde glue for an optional duration field.
pub(crate) mod opt_duration {
    use super::*;
    pub fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<Option<Duration>, D::Error> {
        d.deserialize_str(DurationVisitor).map(Some)
    }
    pub fn serialize<S: Serializer>(v: &Option<Duration>, s: S) -> Result<S::Ok, S::Error> {
        match v {
            Some(v) => s.serialize_str(&format_duration(*v)),
            None => s.serialize_none(),
        }
    }
}

/// Hint shown for a malformed duration where `"off"` is also accepted.
pub(crate) const DURATION_OR_OFF_HINT: &str =
    "write a whole number with a unit: ms, s, m, h or d, e.g. \"5m\", \"30m\", \"24h\", or \"off\" for never";

/// A duration that may also be written `"off"` (never): `None`. Printed back
/// the same way, so an effective config with `"off"` parses again.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct DurationOrOff(pub(crate) Option<Duration>);

struct DurationOrOffVisitor;

impl Visitor<'_> for DurationOrOffVisitor {
    type Value = DurationOrOff;
    fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
        f.write_str("a duration like \"5m\" or \"off\"")
    }
    fn visit_str<E: de::Error>(self, v: &str) -> Result<DurationOrOff, E> {
        if v == "off" {
            return Ok(DurationOrOff(None));
        }
        parse_duration(v)
            .map(|d| DurationOrOff(Some(d)))
            .map_err(|m| E::custom(format!("{m}{HINT_MARK}{DURATION_OR_OFF_HINT}")))
    }
}

impl<'de> Deserialize<'de> for DurationOrOff {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        d.deserialize_str(DurationOrOffVisitor)
    }
}

impl Serialize for DurationOrOff {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        match self.0 {
            Some(d) => s.serialize_str(&format_duration(d)),
            None => s.serialize_str("off"),
        }
    }
}

impl JsonSchema for DurationOrOff {
    fn schema_name() -> Cow<'static, str> {
        "DurationOrOff".into()
    }
    fn json_schema(_: &mut SchemaGenerator) -> Schema {
        json_schema!({
            "type": "string",
            "description": "a duration: a whole number with a unit ms, s, m, h or d, e.g. \"5m\"; or \"off\" for never",
            "pattern": "^([0-9]+ *(ms|s|m|h|d)|off)$"
        })
    }
}

/// Schema stand-in for a size string.
pub(crate) struct SizeText;

impl JsonSchema for SizeText {
    fn schema_name() -> Cow<'static, str> {
        "Size".into()
    }
    fn json_schema(_: &mut SchemaGenerator) -> Schema {
        json_schema!({
            "type": "string",
            "description": "a size: a whole number with a unit B, KiB, MiB, GiB, TiB (1024-based) or KB, MB, GB, TB (1000-based), e.g. \"256MiB\"",
            "pattern": "^[0-9]+ *([KkMmGgTt][Ii]?)?[Bb]?$"
        })
    }
}

/// Schema stand-in for a duration string.
pub(crate) struct DurationText;

impl JsonSchema for DurationText {
    fn schema_name() -> Cow<'static, str> {
        "Duration".into()
    }
    fn json_schema(_: &mut SchemaGenerator) -> Schema {
        json_schema!({
            "type": "string",
            "description": "a duration: a whole number with a unit ms, s, m, h or d, e.g. \"60s\"",
            "pattern": "^[0-9]+ *(ms|s|m|h|d)$"
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sizes_in_binary_and_decimal_units() {
        assert_eq!(parse_size("256MiB"), Ok(256 << 20));
        assert_eq!(parse_size("1GiB"), Ok(1 << 30));
        assert_eq!(parse_size("512KiB"), Ok(512 << 10));
        assert_eq!(parse_size("100B"), Ok(100));
        assert_eq!(parse_size("1048576"), Ok(1_048_576));
        assert_eq!(parse_size("1KB"), Ok(1000));
        assert_eq!(parse_size("2MB"), Ok(2_000_000));
        assert_eq!(parse_size("3GB"), Ok(3_000_000_000));
        assert_eq!(parse_size("64 mib"), Ok(64 << 20));
    }

    #[test]
    fn malformed_sizes_are_refused() {
        for bad in [
            "",
            "MiB",
            "-1MiB",
            "1.5GiB",
            "12XB",
            "1 GiB extra",
            " 1MiB",
            "1M",
            "99999999999999999999999",
            "18446744073709551615KiB",
            "1e9",
        ] {
            assert!(parse_size(bad).is_err(), "{bad:?} should be refused");
        }
    }

    #[test]
    fn durations_need_a_unit() {
        assert_eq!(parse_duration("250ms"), Ok(Duration::from_millis(250)));
        assert_eq!(parse_duration("60s"), Ok(Duration::from_secs(60)));
        assert_eq!(parse_duration("5m"), Ok(Duration::from_secs(300)));
        assert_eq!(parse_duration("1h"), Ok(Duration::from_secs(3600)));
        assert_eq!(parse_duration("2d"), Ok(Duration::from_secs(172_800)));
        for bad in [
            "60",
            "",
            "s",
            "1.5s",
            "-1s",
            "5 minutes",
            "18446744073709551615h",
            "1S",
        ] {
            assert!(parse_duration(bad).is_err(), "{bad:?} should be refused");
        }
    }

    #[test]
    fn off_is_a_duration_that_never_comes() {
        #[derive(Deserialize, Serialize)]
        struct T {
            d: DurationOrOff,
        }
        let t: T = toml::from_str("d = \"off\"").unwrap();
        assert_eq!(t.d, DurationOrOff(None));
        assert_eq!(toml::to_string(&t).unwrap().trim(), "d = \"off\"");
        let t: T = toml::from_str("d = \"5m\"").unwrap();
        assert_eq!(t.d, DurationOrOff(Some(Duration::from_secs(300))));
        for bad in ["\"Off\"", "\"never\"", "\"5\"", "5"] {
            assert!(toml::from_str::<T>(&format!("d = {bad}")).is_err(), "{bad}");
        }
    }

    #[test]
    fn printing_round_trips() {
        for s in ["64MiB", "1GiB", "100B", "1000B", "3KiB", "1TiB"] {
            assert_eq!(format_size(parse_size(s).unwrap_or(0)), s);
        }
        for s in ["250ms", "1m", "5m", "1h", "2d", "90s", "1500ms"] {
            assert_eq!(format_duration(parse_duration(s).unwrap_or_default()), s);
        }
    }
}
