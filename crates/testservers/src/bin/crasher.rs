//! Exits with status 3 in the middle of a `crash` tool call: it first waits
//! for the next request (so two are in flight), then writes half a response
//! line and dies.
#![forbid(unsafe_code)]

use mcpbox_testservers::{main_for, text, tool, CallResult, Io, Server};
use serde_json::{json, Value};

struct Crasher;

impl Server for Crasher {
    fn name(&self) -> &str {
        "crasher"
    }

    fn tools(&mut self) -> Vec<Value> {
        vec![
            tool("crash", "Crashes.", json!({})),
            tool("echo", "Echoes.", json!({})),
        ]
    }

    fn call(&mut self, io: &mut Io, name: &str, _args: &Value) -> CallResult {
        if name == "crash" {
            let _ = io.read();
            let _ = io.raw(b"{\"jsonrpc\":\"2.0\",\"id\":1,\"result\":{\"content\":[");
            std::process::exit(3);
        }
        Ok(text("ok"))
    }
}

fn main() {
    main_for(&mut Crasher);
}
