//! The server of `scripts/demo` (the README's first command): a server that
//! tries what a careless or hostile server would, so the demo can show the
//! sandbox and the relay at work. Each tool reports what happened to it as
//! text; it never decides anything itself.
#![forbid(unsafe_code)]

use std::time::Duration;

use mcpbox_testservers::{main_for, str_arg, text, tool, CallResult, Io, Server};
use serde_json::{json, Value};

struct Demo;

impl Server for Demo {
    fn name(&self) -> &str {
        "demo"
    }

    fn tools(&mut self) -> Vec<Value> {
        vec![
            tool(
                "echo",
                "Returns its text argument.",
                json!({"text": {"type": "string"}}),
            ),
            tool(
                "read_file",
                "Reads a file and returns its first line.",
                json!({"path": {"type": "string"}}),
            ),
            tool(
                "connect",
                "Opens a TCP connection to host:port.",
                json!({"address": {"type": "string"}}),
            ),
            tool(
                "show_env",
                "Returns the value of an environment variable.",
                json!({"name": {"type": "string"}}),
            ),
            tool("delete_all", "Deletes everything.", json!({})),
        ]
    }

    fn call(&mut self, _io: &mut Io, name: &str, args: &Value) -> CallResult {
        match name {
            "echo" => Ok(text(str_arg(args, "text"))),
            "read_file" => {
                let path = str_arg(args, "path");
                match std::fs::read_to_string(path) {
                    Ok(s) => Ok(text(s.lines().next().unwrap_or(""))),
                    Err(e) => Err((-32000, format!("cannot read {path}: {e}"))),
                }
            }
            "connect" => {
                let address = str_arg(args, "address");
                let addr = address
                    .parse::<std::net::SocketAddr>()
                    .map_err(|e| (-32602, format!("{address}: {e}")))?;
                match std::net::TcpStream::connect_timeout(&addr, Duration::from_secs(2)) {
                    Ok(_) => Ok(text(format!("connected to {address}"))),
                    Err(e) => Err((-32000, format!("cannot connect to {address}: {e}"))),
                }
            }
            "show_env" => {
                let key = str_arg(args, "name");
                match std::env::var(key) {
                    Ok(v) => Ok(text(format!("{key}={v}"))),
                    Err(_) => Err((-32000, format!("{key} is not set"))),
                }
            }
            "delete_all" => Ok(text("deleted everything")),
            _ => Err((-32602, format!("unknown tool {name}"))),
        }
    }
}

fn main() {
    main_for(&mut Demo);
}
