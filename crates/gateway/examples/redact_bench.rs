//! Times each stage the relay puts a large tool result through, in
//! process (no pipes, no sandbox): the cost per stage of one server line.
//! A measurement, never a test.
//!
//!   cargo run --release -p mcpbox-gateway --example redact_bench [MIB] [RUNS]
//!
//! Results: 64 MiB (default) of text, one secret configured, in three
//! shapes: the flood test server's (`é` repeated: non-ASCII), ASCII prose,
//! and ASCII with the secret in it four times. Stages, in relay order:
//! read the line (`LineReader`), parse, credential shapes over every
//! string (`find_credentials`), `sanitize` of the text, secret redaction
//! (the relay's walk + `redact_across`, and `redact_json`), serialise;
//! then the parts of parsing apart, and `lines::parse_json`.
//! Each figure is the median of RUNS (default 5).
#![forbid(unsafe_code)]

use std::borrow::Cow;
use std::io::Cursor;
use std::time::{Duration, Instant};

use mcpbox_gateway::lines::{Line, LineReader};
use mcpbox_gateway::redact::{find_credentials, walk_strings, Redactor};
use mcpbox_gateway::screen::sanitize;
use serde_json::{json, Value};

const SECRET: &str = "bench-secret-value-not-real-4f1c9a";

fn median(mut v: Vec<Duration>) -> Duration {
    v.sort();
    v[v.len() / 2]
}

fn time<T>(runs: usize, mut f: impl FnMut() -> T) -> Duration {
    let mut samples = Vec::with_capacity(runs);
    for _ in 0..runs {
        let t0 = Instant::now();
        std::hint::black_box(f());
        samples.push(t0.elapsed());
    }
    median(samples)
}

/// relay.rs's redact_secrets without the audit records.
fn relay_redact(r: &Redactor, v: &mut Value, counts: &mut [usize]) -> bool {
    let mut changed = walk_strings(v, &mut |s| match r.redact_str(s, counts) {
        Cow::Borrowed(_) => None,
        Cow::Owned(o) => Some(o),
    });
    if let Some(Value::Array(items)) = v.pointer_mut("/result/content") {
        let mut texts: Vec<&mut String> = items
            .iter_mut()
            .filter_map(|item| match item.get_mut("text") {
                Some(Value::String(t)) => Some(t),
                _ => None,
            })
            .collect();
        changed |= r.redact_across(&mut texts, counts);
    }
    changed
}

fn mbps(bytes: usize, d: Duration) -> f64 {
    bytes as f64 / d.as_secs_f64() / 1e6
}

fn main() {
    let args: Vec<String> = std::env::args().collect();
    let mib: usize = args.get(1).and_then(|a| a.parse().ok()).unwrap_or(64);
    let runs: usize = args.get(2).and_then(|a| a.parse().ok()).unwrap_or(5);
    let bytes = mib << 20;
    let redactor = Redactor::new([("API_KEY", SECRET.as_bytes())]);
    let prose = "The quick brown fox jumps over the lazy dog; results: 42, ok.\n";
    let shapes: Vec<(&str, String)> = vec![
        ("flood é", "é".repeat(bytes / 2)),
        ("ascii", prose.repeat(bytes / prose.len())),
        ("ascii+secret x4", {
            let mut t = prose.repeat(bytes / prose.len() / 4);
            t.push_str(SECRET);
            t.repeat(4)
        }),
    ];
    println!("redact_bench: {mib} MiB text, 1 secret, median of {runs}; ms (MB/s of the line)");
    println!(
        "{:<16} {:>14} {:>14} {:>14} {:>14} {:>14} {:>14} {:>14}",
        "text",
        "read line",
        "parse",
        "credentials",
        "sanitize",
        "relay redact",
        "redact_json",
        "serialise"
    );
    let mut extra = Vec::new();
    for (name, text) in shapes {
        let msg = json!({"jsonrpc": "2.0", "id": 7, "result": {
            "content": [{"type": "text", "text": text}], "isError": false}});
        let mut line = serde_json::to_vec(&msg).unwrap_or_default();
        let n = line.len();
        line.push(b'\n');
        let read = time(runs, || {
            let mut r = LineReader::with_compaction(Cursor::new(&line), 128 << 20, 1 << 20);
            match r.next_line() {
                Ok(Line::Data(d)) => d.len(),
                _ => 0,
            }
        });
        let parse = time(runs, || {
            serde_json::from_slice::<Value>(&line[..n]).map_or(0, |v| v.is_object() as usize)
        });
        let ignored = time(runs, || {
            serde_json::from_slice::<serde::de::IgnoredAny>(&line[..n]).is_ok()
        });
        let utf8 = time(runs, || std::str::from_utf8(&line[..n]).is_ok());
        let strict = time(runs, || {
            mcpbox_gateway::lines::parse_json(&line[..n]).map_or(0, |v| v.is_object() as usize)
        });
        let v: Value = serde_json::from_slice(&line[..n]).unwrap_or(Value::Null);
        let mut walked = v.clone();
        let creds = time(runs, || {
            let mut hits = 0;
            if let Some(result) = walked.get_mut("result") {
                walk_strings(result, &mut |s| {
                    hits += find_credentials(s).len();
                    None
                });
            }
            hits
        });
        // the redaction stages work on a copy: time the copy apart and subtract it
        let clone = time(runs, || v.clone());
        let text_ref = v.pointer("/result/content/0/text").and_then(Value::as_str);
        let san = time(runs, || text_ref.map(|t| sanitize(t).1.any()));
        let relay = time(runs, || {
            let mut v = v.clone();
            relay_redact(&redactor, &mut v, &mut [0])
        })
        .saturating_sub(clone);
        let rj = time(runs, || {
            let mut v = v.clone();
            redactor.redact_json(&mut v, &mut [0])
        })
        .saturating_sub(clone);
        let ser = time(runs, || serde_json::to_vec(&v).map_or(0, |b| b.len()));
        let cell = |d: Duration| format!("{:.1} ({:.0})", d.as_secs_f64() * 1e3, mbps(n, d));
        extra.push(format!(
            "{:<16} {:>14} {:>14} {:>14} {:>14}",
            name,
            cell(ignored),
            cell(utf8),
            cell(clone),
            cell(strict)
        ));
        println!(
            "{:<16} {:>14} {:>14} {:>14} {:>14} {:>14} {:>14} {:>14}",
            name,
            cell(read),
            cell(parse),
            cell(creds),
            cell(san),
            cell(relay),
            cell(rj),
            cell(ser)
        );
    }
    println!();
    println!("what parsing costs, apart: validating only (IgnoredAny), UTF-8 only, a Value clone,");
    println!("and lines::parse_json (the parse refusing duplicate keys)");
    println!(
        "{:<16} {:>14} {:>14} {:>14} {:>14}",
        "text", "IgnoredAny", "from_utf8", "Value clone", "parse_json"
    );
    for row in extra {
        println!("{row}");
    }
}
