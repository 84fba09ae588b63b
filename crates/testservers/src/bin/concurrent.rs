//! A well-behaved server in the shape the SDKs give servers: each request
//! is handled on a thread of its own, and when its input ends it finishes
//! the requests it has (answering them) and exits 0.
//!
//! Tools:
//! - `slow {ms, kib, notes}`: `notes` progress notifications (when the
//!   call carries a progress token) or log messages, then, `ms`
//!   milliseconds after the call, a text of `kib` KiB. Its
//!   `structuredContent` says whether the server's input was still open
//!   when it answered (`stdin_open`), so a test can tell that the one
//!   who stopped it waited for the answer before closing its input.
//! - `notes {count, kib}`: answers at once, then sends `count`
//!   `notifications/resources/updated` of `kib` KiB each (a flood of
//!   messages that belong to no request: over HTTP they wait for a GET
//!   stream), then `notifications/message` "flood done".
#![forbid(unsafe_code)]

use std::io::{BufRead, Write};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use serde_json::{json, Value};

type Out = Arc<Mutex<std::io::Stdout>>;

fn send(out: &Out, v: &Value) -> bool {
    let mut line = serde_json::to_vec(v).unwrap_or_default();
    line.push(b'\n');
    let mut o = out.lock().unwrap_or_else(|p| p.into_inner());
    o.write_all(&line).and_then(|()| o.flush()).is_ok()
}

fn arg(args: &Value, name: &str, default: u64) -> u64 {
    args.get(name).and_then(Value::as_u64).unwrap_or(default)
}

fn tools() -> Value {
    json!({"tools": [
        {"name": "slow", "description": "Answers after a while.",
         "inputSchema": {"type": "object", "properties": {
             "ms": {"type": "number"}, "kib": {"type": "number"}, "notes": {"type": "number"}}}},
        {"name": "notes", "description": "Sends many notifications.",
         "inputSchema": {"type": "object", "properties": {
             "count": {"type": "number"}, "kib": {"type": "number"}}}},
    ]})
}

fn call(out: &Out, open: &AtomicBool, id: &Value, params: &Value) {
    let name = params.get("name").and_then(Value::as_str).unwrap_or("");
    let args = params.get("arguments").cloned().unwrap_or(json!({}));
    let token = params.pointer("/_meta/progressToken").cloned();
    match name {
        "slow" => {
            let (ms, kib, notes) = (
                arg(&args, "ms", 1000),
                arg(&args, "kib", 1),
                arg(&args, "notes", 1),
            );
            for n in 0..notes {
                let note = match &token {
                    Some(t) => json!({"jsonrpc": "2.0", "method": "notifications/progress",
                        "params": {"progressToken": t, "progress": n, "total": notes}}),
                    None => json!({"jsonrpc": "2.0", "method": "notifications/message",
                        "params": {"level": "info", "data": format!("working {n}")}}),
                };
                send(out, &note);
                std::thread::sleep(Duration::from_millis(ms / notes.max(1)));
            }
            let text = "x".repeat(usize::try_from(kib).unwrap_or(1) * 1024);
            let stdin_open = open.load(Ordering::Acquire);
            send(
                out,
                &json!({"jsonrpc": "2.0", "id": id, "result": {
                    "content": [{"type": "text", "text": text}],
                    "structuredContent": {"stdin_open": stdin_open, "bytes": text.len()},
                }}),
            );
        }
        "notes" => {
            let (count, kib) = (arg(&args, "count", 100), arg(&args, "kib", 64));
            send(
                out,
                &json!({"jsonrpc": "2.0", "id": id, "result": {
                    "content": [{"type": "text", "text": format!("sending {count}")}]}}),
            );
            let filler = "n".repeat(usize::try_from(kib).unwrap_or(1) * 1024);
            for n in 0..count {
                let note = json!({"jsonrpc": "2.0", "method": "notifications/resources/updated",
                    "params": {"uri": format!("flood://{n}"), "filler": filler}});
                if !send(out, &note) {
                    return;
                }
            }
            send(
                out,
                &json!({"jsonrpc": "2.0", "method": "notifications/message",
                    "params": {"level": "info", "data": "flood done"}}),
            );
        }
        _ => {
            send(
                out,
                &json!({"jsonrpc": "2.0", "id": id,
                    "error": {"code": -32602, "message": format!("unknown tool {name}")}}),
            );
        }
    }
}

fn main() {
    let out: Out = Arc::new(Mutex::new(std::io::stdout()));
    let open = Arc::new(AtomicBool::new(true));
    let mut workers = Vec::new();
    for line in std::io::stdin().lock().lines() {
        let Ok(line) = line else { break };
        let Ok(msg) = serde_json::from_str::<Value>(&line) else {
            continue;
        };
        let (Some(id), Some(method)) = (
            msg.get("id").cloned(),
            msg.get("method").and_then(Value::as_str),
        ) else {
            continue;
        };
        let result = match method {
            "initialize" => {
                let version = msg
                    .pointer("/params/protocolVersion")
                    .cloned()
                    .unwrap_or(json!("2025-06-18"));
                json!({"protocolVersion": version, "capabilities": {"tools": {}, "logging": {}},
                    "serverInfo": {"name": "concurrent", "version": "1"}})
            }
            "tools/list" => tools(),
            "ping" => json!({}),
            "tools/call" => {
                let (out, open) = (out.clone(), open.clone());
                let params = msg.get("params").cloned().unwrap_or(json!({}));
                workers.push(std::thread::spawn(move || call(&out, &open, &id, &params)));
                continue;
            }
            _ => {
                send(
                    &out,
                    &json!({"jsonrpc": "2.0", "id": id,
                        "error": {"code": -32601, "message": "method not found"}}),
                );
                continue;
            }
        };
        send(&out, &json!({"jsonrpc": "2.0", "id": id, "result": result}));
    }
    // input ended: finish what was asked, then exit
    open.store(false, Ordering::Release);
    for w in workers {
        let _ = w.join();
    }
}
