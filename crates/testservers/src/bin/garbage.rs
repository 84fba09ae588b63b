//! Writes non-JSON, binary, non-object and over-long lines to stdout before
//! every valid answer. `GARBAGE_LONG_MIB` sets the long line's size (default 2).
#![forbid(unsafe_code)]

use std::io;

use mcpbox_testservers::{main_for, text, tool, CallResult, Io, Server};
use serde_json::{json, Value};

struct Garbage {
    long: usize,
}

impl Server for Garbage {
    fn name(&self) -> &str {
        "garbage"
    }

    fn tools(&mut self) -> Vec<Value> {
        vec![tool(
            "echo",
            "Returns its text argument.",
            json!({"text": {"type": "string"}}),
        )]
    }

    fn call(&mut self, _io: &mut Io, _name: &str, args: &Value) -> CallResult {
        Ok(text(args.get("text").and_then(Value::as_str).unwrap_or("")))
    }

    fn before_response(&mut self, io: &mut Io) -> io::Result<()> {
        io.raw(b"this is not json\n")?;
        io.raw(&[0x00, 0xff, 0xfe, 0x1b, b'[', b'2', b'J', 0x80, b'\n'])?;
        io.raw(b"{\"jsonrpc\":\"2.0\",\"id\":\n")?;
        io.raw(b"[1,2,3]\n")?;
        io.raw(b"\"just a string\"\n")?;
        let mut long = vec![b'A'; self.long];
        long.push(b'\n');
        io.raw(&long)
    }
}

fn main() {
    let mib = std::env::var("GARBAGE_LONG_MIB")
        .ok()
        .and_then(|v| v.parse::<usize>().ok())
        .unwrap_or(2);
    main_for(&mut Garbage {
        long: mib * 1024 * 1024,
    });
}
