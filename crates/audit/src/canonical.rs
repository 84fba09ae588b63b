//! Canonical JSON and the hash chain.
//!
//! Canonical form: object keys sorted by bytes, no whitespace, strings and
//! numbers as `serde_json` writes them. It is built here rather than relying on
//! `serde_json::Map` ordering, which changes when any crate in the build turns
//! on serde_json's `preserve_order` feature.

use serde_json::Value;
use sha2::{Digest, Sha256};

use crate::{Event, Result};

/// The `prev_hash` of the first record.
pub(crate) const GENESIS: &str = "0000000000000000000000000000000000000000000000000000000000000000";

/// Writes `v` in canonical form.
pub(crate) fn write_canonical(v: &Value, out: &mut String) {
    match v {
        Value::Null => out.push_str("null"),
        Value::Bool(b) => out.push_str(if *b { "true" } else { "false" }),
        Value::Number(n) => out.push_str(&n.to_string()),
        Value::String(s) => write_string(s, out),
        Value::Array(items) => {
            out.push('[');
            for (i, item) in items.iter().enumerate() {
                if i > 0 {
                    out.push(',');
                }
                write_canonical(item, out);
            }
            out.push(']');
        }
        Value::Object(map) => {
            let mut keys: Vec<&String> = map.keys().collect();
            keys.sort();
            out.push('{');
            for (i, k) in keys.into_iter().enumerate() {
                if i > 0 {
                    out.push(',');
                }
                write_string(k, out);
                out.push(':');
                if let Some(v) = map.get(k) {
                    write_canonical(v, out);
                }
            }
            out.push('}');
        }
    }
}

fn write_string(s: &str, out: &mut String) {
    // Serializing a str cannot fail; fall back to an empty string literal anyway
    // rather than panic.
    match serde_json::to_string(s) {
        Ok(quoted) => out.push_str(&quoted),
        Err(_) => out.push_str("\"\""),
    }
}

/// Canonical JSON of a value: object keys sorted by bytes, no whitespace.
/// The relay's argument digests and tool pins use it too.
pub fn canonical_json(v: &Value) -> String {
    let mut out = String::new();
    write_canonical(v, &mut out);
    out
}

/// The canonical JSON of a stored record: the event's fields without the
/// null ones, plus `seq`. Dropping nulls keeps old hashes valid when an
/// optional field is added to [`Event`] later.
pub(crate) fn record_json(seq: i64, event: &Event) -> Result<String> {
    let mut value = serde_json::to_value(event)?;
    if let Value::Object(map) = &mut value {
        map.retain(|_, v| !v.is_null());
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
    fn chain_hash_depends_on_prev_and_record() {
        let a = chain_hash(GENESIS, "{}");
        assert_eq!(a.len(), 64);
        assert_ne!(a, chain_hash(&a, "{}"));
        assert_ne!(a, chain_hash(GENESIS, "{ }"));
        assert_eq!(mcpbox_policy::hex::encode(&[0, 0xff, 0x1a]), "00ff1a");
    }
}
