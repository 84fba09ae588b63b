//! Canonical JSON and the hash chain.
//!
//! Canonical form: object keys sorted by bytes, no whitespace, strings and
//! numbers as `serde_json` writes them. It is built here rather than relying on
//! `serde_json::Map` ordering, which changes when any crate in the build turns
//! on serde_json's `preserve_order` feature.

use std::io::Write as _;

use serde_json::Value;
use sha2::{Digest, Sha256};

use crate::Event;

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
    text(canonical_bytes(v))
}

/// What the canonical writers wrote, as text: only whole UTF-8 strings and
/// ASCII were written.
fn text(out: Vec<u8>) -> String {
    String::from_utf8(out).unwrap_or_else(|e| String::from_utf8_lossy(e.as_bytes()).into_owned())
}

/// The canonical JSON of a stored record: the event's fields without the
/// null ones, plus `seq`. Dropping nulls keeps old hashes valid when an
/// optional field is added to [`Event`] later.
///
/// SQLite integers are signed: the two unsigned counts are clamped to
/// `i64::MAX` here, as the row stores them, so that the stored row and the
/// hashed record agree (a no-op for a record read back from a row).
pub(crate) fn record_json(seq: i64, event: &Event) -> String {
    record_json_with(seq, event, &canonical_bytes(&event.detail))
}

/// [`record_json`] with the canonical JSON of `event.detail` already
/// written (the store writes it in its own column too, so it is built
/// once per record).
///
/// Written field by field, in the canonical (byte-sorted) key order,
/// rather than through a `serde_json::Value` that is then sorted: every
/// audited call passes through here twice, and the detour was a sixth of
/// the gateway's instructions per call. The output is byte for byte what
/// that detour wrote (`tests::the_direct_writer_matches_the_value_detour`,
/// and the pinned hash below); the exhaustive destructuring makes a new
/// field of [`Event`] a compile error here until it is written.
pub(crate) fn record_json_with(seq: i64, event: &Event, detail: &[u8]) -> String {
    let Event {
        time_ms,
        kind,
        sandbox_id,
        workspace_id,
        server,
        caller,
        tool,
        decision,
        reason,
        source,
        args_digest,
        result_bytes,
        exit_status,
        duration_ms,
        files_written,
        detail: detail_value,
    } = event;
    let mut out = Vec::with_capacity(320 + detail.len());
    let mut fields = Fields {
        out: &mut out,
        first: true,
    };
    // the keys in byte order: args_digest < caller < decision < detail <
    // duration_ms < exit_status < files_written < kind < reason <
    // result_bytes < sandbox_id < seq < server < source < time_ms < tool <
    // workspace_id (checked by `tests::the_direct_writer_matches_the_value_detour`)
    if let Some(v) = args_digest {
        fields.string("args_digest", v);
    }
    fields.string("caller", caller);
    if let Some(v) = decision {
        fields.string("decision", v.as_str());
    }
    if !detail_value.is_null() {
        fields.raw("detail", detail);
    }
    if let Some(v) = duration_ms {
        fields.number("duration_ms", clamp(*v));
    }
    if let Some(v) = exit_status {
        fields.number("exit_status", i64::from(*v));
    }
    fields.key("files_written");
    fields.out.push(b'[');
    for (i, path) in files_written.iter().enumerate() {
        if i > 0 {
            fields.out.push(b',');
        }
        write_string(path, fields.out);
    }
    fields.out.push(b']');
    if let Some(v) = kind {
        fields.string("kind", v.as_str());
    }
    if let Some(v) = reason {
        fields.string("reason", v);
    }
    if let Some(v) = result_bytes {
        fields.number("result_bytes", clamp(*v));
    }
    fields.string("sandbox_id", sandbox_id);
    fields.number("seq", seq);
    fields.string("server", server);
    if let Some(v) = source {
        fields.string("source", v);
    }
    fields.number("time_ms", *time_ms);
    if let Some(v) = tool {
        fields.string("tool", v);
    }
    fields.string("workspace_id", workspace_id);
    out.push(b'}');
    text(out)
}

/// An unsigned count as the row stores it: at most `i64::MAX`.
fn clamp(n: u64) -> i64 {
    i64::try_from(n).unwrap_or(i64::MAX)
}

/// The members of one object being written, `{` and commas included.
struct Fields<'a> {
    out: &'a mut Vec<u8>,
    first: bool,
}

impl Fields<'_> {
    fn key(&mut self, key: &str) {
        self.out.push(if self.first { b'{' } else { b',' });
        self.first = false;
        write_string(key, self.out);
        self.out.push(b':');
    }
    fn string(&mut self, key: &str, value: &str) {
        self.key(key);
        write_string(value, self.out);
    }
    fn number(&mut self, key: &str, value: i64) {
        self.key(key);
        let _ = write!(self.out, "{value}");
    }
    fn raw(&mut self, key: &str, json: &[u8]) {
        self.key(key);
        self.out.extend_from_slice(json);
    }
}

/// Canonical JSON of a value as bytes, for [`record_json_with`] and the
/// store's `detail` column.
pub(crate) fn canonical_bytes(v: &Value) -> Vec<u8> {
    let mut out = Vec::new();
    write_canonical(v, &mut out);
    out
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
        let j = record_json(7, &e);
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
        let j = record_json(1, &e);
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
        let json = record_json(42, &e);
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

    /// The record's canonical JSON as it was first built: the event
    /// through `serde_json::Value`, nulls dropped, counts clamped, `seq`
    /// added, then sorted. The oracle of the direct writer.
    fn record_json_via_value(seq: i64, event: &Event) -> String {
        let mut value = serde_json::to_value(event).unwrap();
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
        canonical_json(&value)
    }

    /// A small deterministic generator (xorshift), so the events below
    /// are the same in every run and need no crate.
    struct Gen(u64);
    impl Gen {
        fn next(&mut self) -> u64 {
            self.0 ^= self.0 << 13;
            self.0 ^= self.0 >> 7;
            self.0 ^= self.0 << 17;
            self.0
        }
        fn pick<T: Clone>(&mut self, from: &[T]) -> T {
            from[(self.next() % from.len() as u64) as usize].clone()
        }
        fn text(&mut self) -> String {
            let pieces = [
                "",
                "a",
                "read_file",
                "\"",
                "\\",
                "\n",
                "\u{1b}[31m",
                "\u{7f}",
                "é",
                "\u{2028}",
                "😀",
                "\u{0}",
                "/",
                "sb-1",
                " ",
                "\t",
            ];
            (0..self.next() % 4).map(|_| self.pick(&pieces)).collect()
        }
        fn maybe<T>(&mut self, f: impl FnOnce(&mut Gen) -> T) -> Option<T> {
            if self.next().is_multiple_of(3) {
                None
            } else {
                Some(f(self))
            }
        }
        fn detail(&mut self, depth: u32) -> Value {
            match self.next() % if depth > 2 { 5 } else { 7 } {
                0 => Value::Null,
                1 => Value::Bool(self.next().is_multiple_of(2)),
                2 => json!(self.pick(&[0i64, -1, i64::MIN, i64::MAX])),
                3 => json!(self.pick(&[0.5f64, -2.25, 1e300])),
                4 => Value::String(self.text()),
                5 => Value::Array(
                    (0..self.next() % 3)
                        .map(|_| self.detail(depth + 1))
                        .collect(),
                ),
                _ => Value::Object(
                    (0..self.next() % 4)
                        .map(|_| (self.text(), self.detail(depth + 1)))
                        .collect(),
                ),
            }
        }
    }

    #[test]
    fn the_direct_writer_matches_the_value_detour() {
        let mut g = Gen(0x9e37_79b9_7f4a_7c15);
        let counts = [0u64, 1, i64::MAX as u64, i64::MAX as u64 + 1, u64::MAX];
        for i in 0..5000 {
            let event = Event {
                time_ms: g.pick(&[0i64, 1_700_000_000_123, -1, i64::MIN, i64::MAX]),
                kind: g.maybe(|g| g.pick(&crate::Kind::ALL)),
                sandbox_id: g.text(),
                workspace_id: g.text(),
                server: g.text(),
                caller: g.text(),
                tool: g.maybe(Gen::text),
                decision: g.maybe(|g| {
                    g.pick(&[
                        crate::Verdict::Allow,
                        crate::Verdict::Approve,
                        crate::Verdict::Deny,
                    ])
                }),
                reason: g.maybe(Gen::text),
                source: g.maybe(Gen::text),
                args_digest: g.maybe(Gen::text),
                result_bytes: g.maybe(|g| g.pick(&counts)),
                exit_status: g.maybe(|g| g.pick(&[0, -1, 137, i32::MIN, i32::MAX])),
                duration_ms: g.maybe(|g| g.pick(&counts)),
                files_written: (0..g.next() % 3).map(|_| g.text()).collect(),
                detail: g.detail(0),
            };
            let seq = g.pick(&[1i64, 42, i64::MAX]);
            let direct = record_json(seq, &event);
            assert_eq!(
                direct,
                record_json_via_value(seq, &event),
                "event {i}: {event:?}"
            );
            // and it is canonical: parsed and written again, the same bytes
            let parsed: Value = serde_json::from_str(&direct).unwrap();
            assert_eq!(canonical_json(&parsed), direct, "event {i}");
        }
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
