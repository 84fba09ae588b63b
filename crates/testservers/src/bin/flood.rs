//! Floods: `big` returns a result of `mib` MiB made of `char` (default a
//! two-byte character, so a cut can land inside one); `spam` writes
//! notifications until the pipe breaks.
#![forbid(unsafe_code)]

use mcpbox_testservers::{main_for, text, tool, CallResult, Io, Server};
use serde_json::{json, Value};

struct Flood;

impl Server for Flood {
    fn name(&self) -> &str {
        "flood"
    }

    fn tools(&mut self) -> Vec<Value> {
        vec![
            tool(
                "big",
                "Returns a large text.",
                json!({"mib": {"type": "number"}, "char": {"type": "string"}}),
            ),
            tool("spam", "Writes notifications forever.", json!({})),
        ]
    }

    fn call(&mut self, io: &mut Io, name: &str, args: &Value) -> CallResult {
        match name {
            "big" => {
                let mib = args.get("mib").and_then(Value::as_f64).unwrap_or(1.0);
                let unit = args.get("char").and_then(Value::as_str).unwrap_or("é");
                let bytes = (mib * 1024.0 * 1024.0) as usize;
                let s = unit.repeat(bytes / unit.len().max(1));
                Ok(text(s))
            }
            "spam" => {
                let mut n: u64 = 0;
                loop {
                    n += 1;
                    let note = json!({"jsonrpc": "2.0", "method": "notifications/message",
                        "params": {"level": "info", "data": format!("spam {n}")}});
                    if io.send(&note).is_err() {
                        std::process::exit(0);
                    }
                }
            }
            _ => Err((-32602, format!("unknown tool {name}"))),
        }
    }
}

fn main() {
    main_for(&mut Flood);
}
