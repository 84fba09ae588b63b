//! Canonical JSON and the hash chain.
//!
//! Canonical form: object keys sorted by bytes, no whitespace, strings and
//! numbers as `serde_json` writes them. It is built here rather than relying on
//! `serde_json::Map` ordering, which changes when any crate in the build turns
//! on serde_json's `preserve_order` feature.

use std::io::Write as _;

use serde_json::Value;
use sha2::{Digest, Sha256};

use crate::{Event, Result};

/// The `prev_hash` of the first record.
pub(crate) const GENESIS: &str = "0000000000000000000000000000000000000000000000000000000000000000";

/// Writes `v` in canonical form, straight into `out`: every audited call
/// passes through here (its record, its arguments' digest), so nothing is
/// allocated per string or number.
fn write_canonical(v: &Value, out: &mut Vec<u8>) {
    match v {
        Value::Null => out.extend_from_slice(b"null"),
        Value::Bool(b) => out.extend_from_slice(if *b { b"true" } else { b"false" }),
        // `Number`'s Display is what serde_json writes
        Value::Number(n) => {
            let _ = write!(out, "{n}");
        }
        Value::String(s) => write_string(s, out),
        Value::Array(items) => {
            out.push(b'[');
            for (i, item) in items.iter().enumerate() {
                if i > 0 {
                    out.push(b',');
                }
                write_canonical(item, out);
            }
            out.push(b']');
        }
        Value::Object(map) => {
            // sorted by the keys' bytes (`str`'s order), whatever order
            // the map keeps
            let mut entries: Vec<(&String, &Value)> = map.iter().collect();
            entries.sort_unstable_by(|a, b| a.0.cmp(b.0));
            out.push(b'{');
            for (i, (k, v)) in entries.into_iter().enumerate() {
                if i > 0 {
                    out.push(b',');
                }
                write_string(k, out);
                out.push(b':');
                write_canonical(v, out);
            }
            out.push(b'}');
        }
    }
}

/// A JSON string literal, escaped exactly as serde_json escapes it (its own
/// writer: one escaper for the whole project).
fn write_string(s: &str, out: &mut Vec<u8>) {
    // Writing a str into a Vec cannot fail; an empty literal rather than a
    // panic if it ever did.
    let mark = out.len();
    if serde_json::to_writer(&mut *out, s).is_err() {
        out.truncate(mark);
        out.extend_from_slice(b"\"\"");
    }
}

/// Canonical JSON of a value: object keys sorted by bytes, no whitespace.
/// The relay's argument digests and tool pins use it too.
pub fn canonical_json(v: &Value) -> String {
    let mut out = Vec::new();
    write_canonical(v, &mut out);
    // Only whole UTF-8 strings and ASCII were written.
    String::from_utf8(out).unwrap_or_else(|e| String::from_utf8_lossy(e.as_bytes()).into_owned())
}

/// The canonical JSON of a stored record: the event's fields without the
/// null ones, plus `seq`. Dropping nulls keeps old hashes valid when an
/// optional field is added to [`Event`] later.
///
/// SQLite integers are signed: the two unsigned counts are clamped to
/// `i64::MAX` here, as the row stores them, so that the stored row and the
/// hashed record agree (a no-op for a record read back from a row).
pub(crate) fn record_json(seq: i64, event: &Event) -> Result<String> {
    let mut value = serde_json::to_value(event)?;
    if let Value::Object(map) = &mut value {
        map.retain(|_, v| !v.is_null());
        for count in ["result_bytes", "duration_ms"] {
            if let Some(v) = map.get_mut(count) {
                if v.as_u64().is_some_and(|n| n > i64::MAX.unsigned_abs()) {
                    *v = Value::from(i64::MAX);
                }
            }
        }
        map.insert("seq".to_owned(), Value::from(seq));
    }
    Ok(canonical_json(&value))
}

/// `sha256(prev_hash || record_json)`, hex.
pub(crate) fn chain_hash(prev_hash: &str, record_json: &str) -> String {
    let mut h = Sha256::new();
    h.update(prev_hash.as_bytes());
    h.update(record_json.as_bytes());
    mcpbox_policy::hex::encode(&h.finalize())
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn canonical_sorts_keys_at_every_depth() {
        let v = json!({"b": 1, "a": {"z": [1, {"y": null, "x": "q"}], "c": true}});
        assert_eq!(
            canonical_json(&v),
            r#"{"a":{"c":true,"z":[1,{"x":"q","y":null}]},"b":1}"#
        );
    }

    #[test]
    fn canonical_escapes_control_characters() {
        let v = json!({"k\n": "\u{1b}[31m\"x\""});
        assert_eq!(canonical_json(&v), r#"{"k\n":"\u001b[31m\"x\""}"#);
    }

    #[test]
    fn record_json_drops_nulls_and_adds_seq() {
        let e = Event {
            time_ms: 5,
            server: "s".into(),
            ..Event::default()
        };
        let j = record_json(7, &e).unwrap();
        assert!(!j.contains("null"), "{j}");
        assert!(j.contains(r#""seq":7"#), "{j}");
    }

    #[test]
    fn record_json_clamps_counts_as_the_row_stores_them() {
        let e = Event {
            result_bytes: Some(u64::MAX),
            duration_ms: Some(7),
            ..Event::default()
        };
        let j = record_json(1, &e).unwrap();
        assert!(
            j.contains(&format!(r#""result_bytes":{}"#, i64::MAX)),
            "{j}"
        );
        assert!(j.contains(r#""duration_ms":7"#), "{j}");
    }

    #[test]
    fn canonical_writes_numbers_and_literals_as_serde_json_does() {
        let v = json!([
            1.5,
            -3,
            18446744073709551615u64,
            true,
            false,
            null,
            "é\u{7f}"
        ]);
        assert_eq!(canonical_json(&v), serde_json::to_string(&v).unwrap());
    }

    /// A record and its hash pinned as the code that wrote the first logs
    /// wrote them (the hash checked against Python's `json.dumps(...,
    /// sort_keys=True, separators=(",", ":"), ensure_ascii=False)`): a
    /// faster canonical writer must leave every stored hash valid.
    #[test]
    fn a_record_hashes_as_logs_already_written_do() {
        let e = Event {
            time_ms: 1_700_000_000_123,
            kind: Some(crate::Kind::ToolCall),
            server: "files".into(),
            tool: Some("read_file".into()),
            decision: Some(crate::Verdict::Deny),
            reason: Some("argument.path_outside".into()),
            result_bytes: Some(u64::MAX),
            files_written: vec!["out/a.txt".into()],
            detail: json!({"b": [1, 2.5, "x\n\u{1b}\"", -7], "a": {"z": null, "\u{e9}": "q"}, "B": true}),
            ..Event::default()
        };
        let json = record_json(42, &e).unwrap();
        assert_eq!(
            json,
            concat!(
                r#"{"caller":"","decision":"deny","detail":{"B":true,"a":{"z":null,"é":"q"},"#,
                r#""b":[1,2.5,"x\n\u001b\"",-7]},"files_written":["out/a.txt"],"kind":"tool_call","#,
                r#""reason":"argument.path_outside","result_bytes":9223372036854775807,"sandbox_id":"","#,
                r#""seq":42,"server":"files","time_ms":1700000000123,"tool":"read_file","workspace_id":""}"#
            )
        );
        assert_eq!(
            chain_hash(GENESIS, &json),
            "0f668ec8638cd21dd429f4de43de37eaa704afbb8c0b90d5e3a1a512b8c77b1c"
        );
    }

    #[test]
    fn chain_hash_depends_on_prev_and_record() {
        let a = chain_hash(GENESIS, "{}");
        assert_eq!(a.len(), 64);
        assert_ne!(a, chain_hash(&a, "{}"));
        assert_ne!(a, chain_hash(GENESIS, "{ }"));
        assert_eq!(mcpbox_policy::hex::encode(&[0, 0xff, 0x1a]), "00ff1a");
    }
}
