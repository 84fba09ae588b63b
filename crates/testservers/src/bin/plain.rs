//! A well-behaved server: echo, add, a call history, a tool that asks the
//! client (server-to-client request), and an echo for unknown methods.
#![forbid(unsafe_code)]

use mcpbox_testservers::{main_for, text, tool, CallResult, Io, Server};
use serde_json::{json, Value};

#[derive(Default)]
struct Plain {
    history: Vec<Value>,
}

impl Server for Plain {
    fn name(&self) -> &str {
        "plain"
    }

    fn instructions(&self) -> Option<String> {
        Some("A plain test server.".into())
    }

    fn tools(&mut self) -> Vec<Value> {
        vec![
            tool(
                "echo",
                "Returns its text argument.",
                json!({"text": {"type": "string"}}),
            ),
            tool(
                "add",
                "Adds two numbers.",
                json!({"a": {"type": "number"}, "b": {"type": "number"}}),
            ),
            tool(
                "history",
                "Lists the tool calls this server received.",
                json!({}),
            ),
            tool("ask_client", "Asks the client for its roots.", json!({})),
            json!({"name": "delete_all", "description": "Deletes everything.", "inputSchema": {"type": "object"},
                   "annotations": {"readOnlyHint": true, "destructiveHint": false}}),
            tool(
                "write_file",
                "Writes a file.",
                json!({"path": {"type": "string"}, "text": {"type": "string"}}),
            ),
            tool(
                "sleep",
                "Sleeps for `ms` milliseconds.",
                json!({"ms": {"type": "number"}}),
            ),
        ]
    }

    fn call(&mut self, io: &mut Io, name: &str, args: &Value) -> CallResult {
        if name != "history" {
            self.history.push(json!({"name": name, "arguments": args}));
        }
        match name {
            // a path in the sandbox's output is written for real, so tests
            // can see whose workspace a file landed in; any other path is
            // only echoed (the in-process tests run this server unsandboxed)
            "write_file"
                if args
                    .get("path")
                    .and_then(Value::as_str)
                    .is_some_and(|p| p.starts_with("/workspace/output/")) =>
            {
                let path = args.get("path").and_then(Value::as_str).unwrap_or("");
                let body = args.get("text").and_then(Value::as_str).unwrap_or("");
                match std::fs::write(path, body) {
                    Ok(()) => Ok(text(format!("wrote {path}"))),
                    Err(e) => Err((-32000, format!("cannot write {path}: {e}"))),
                }
            }
            "echo" | "write_file" | "delete_all" => Ok(text(
                args.get("text").and_then(Value::as_str).unwrap_or(name),
            )),
            "sleep" => {
                let ms = args.get("ms").and_then(Value::as_u64).unwrap_or(0);
                std::thread::sleep(std::time::Duration::from_millis(ms));
                Ok(text("slept"))
            }
            "add" => {
                let a = args.get("a").and_then(Value::as_f64).unwrap_or(0.0);
                let b = args.get("b").and_then(Value::as_f64).unwrap_or(0.0);
                Ok(text(format!("{}", a + b)))
            }
            "history" => Ok(
                json!({"content": [{"type": "text", "text": Value::Array(self.history.clone()).to_string()}],
                                   "structuredContent": {"calls": self.history}}),
            ),
            "ask_client" => match io.request("roots/list", json!({"_meta": {"x-test": 1}})) {
                Ok(resp) => Ok(text(
                    resp.get("result")
                        .cloned()
                        .unwrap_or(Value::Null)
                        .to_string(),
                )),
                Err(e) => Err((-32000, e.to_string())),
            },
            _ => Err((-32602, format!("unknown tool {name}"))),
        }
    }

    fn other(&mut self, io: &mut Io, method: &str, params: &Value) -> Option<Value> {
        if let Some(token) = params.pointer("/_meta/progressToken") {
            let note = json!({"jsonrpc": "2.0", "method": "notifications/progress",
                "params": {"progressToken": token, "progress": 1, "total": 2, "_meta": {"vendor/x": [1, "two"]}}});
            let _ = io.send(&note);
        }
        Some(json!({"method": method, "params": params}))
    }
}

fn main() {
    main_for(&mut Plain::default());
}
