//! Hostile (and one well-behaved) stdio MCP servers for the mcpbox tests.
//!
//! Each binary in `src/bin/` implements [`Server`] and calls [`serve`]: a
//! newline-delimited JSON-RPC loop answering `initialize`,
//! `server/discover`, `ping`, `tools/list` and `tools/call`.
#![forbid(unsafe_code)]
#![warn(missing_docs)]

use std::io::{self, BufRead, BufReader, Stdin, Stdout, Write};

use serde_json::{json, Value};

/// The protocol versions the test servers claim.
pub const VERSIONS: &[&str] = &["2026-07-28", "2025-11-25", "2025-06-18"];

/// The server's side of the connection.
pub struct Io {
    reader: BufReader<Stdin>,
    out: Stdout,
    next_id: u64,
    /// Id of the request being answered.
    pub current_id: Value,
}

impl Io {
    /// Writes one JSON message and a newline.
    pub fn send(&mut self, v: &Value) -> io::Result<()> {
        let mut line = serde_json::to_vec(v).map_err(io::Error::other)?;
        line.push(b'\n');
        self.raw(&line)
    }

    /// Writes raw bytes (garbage, partial lines) and flushes.
    pub fn raw(&mut self, bytes: &[u8]) -> io::Result<()> {
        let mut lock = self.out.lock();
        lock.write_all(bytes)?;
        lock.flush()
    }

    /// Sends a server-to-client request and waits for its response (other
    /// lines read meanwhile are ignored).
    pub fn request(&mut self, method: &str, params: Value) -> io::Result<Value> {
        self.next_id += 1;
        let id = format!("srv-{}", self.next_id);
        self.send(&json!({"jsonrpc": "2.0", "id": id, "method": method, "params": params}))?;
        loop {
            let Some(msg) = self.read()? else {
                return Err(io::Error::new(
                    io::ErrorKind::UnexpectedEof,
                    "client closed",
                ));
            };
            if msg.get("id") == Some(&Value::String(id.clone())) && msg.get("method").is_none() {
                return Ok(msg);
            }
        }
    }

    /// Reads the next JSON message from the client (`None` at end of input).
    pub fn read(&mut self) -> io::Result<Option<Value>> {
        loop {
            let mut line = Vec::new();
            if self.reader.read_until(b'\n', &mut line)? == 0 {
                return Ok(None);
            }
            if let Ok(v) = serde_json::from_slice::<Value>(&line) {
                return Ok(Some(v));
            }
        }
    }
}

/// A tool call's outcome: a result object or a JSON-RPC error.
pub type CallResult = Result<Value, (i64, String)>;

/// One test server.
pub trait Server {
    /// Name for `serverInfo`.
    fn name(&self) -> &str;
    /// `instructions` for initialize / discover.
    fn instructions(&self) -> Option<String> {
        None
    }
    /// The tools for this `tools/list` (called once per list).
    fn tools(&mut self) -> Vec<Value>;
    /// Runs one tool. `Ok(Value::Null)` means the tool wrote its own
    /// response line (for wire-level tricks).
    fn call(&mut self, io: &mut Io, name: &str, args: &Value) -> CallResult;
    /// Answers a method the loop does not know; `None` means "method not found".
    fn other(&mut self, _io: &mut Io, _method: &str, _params: &Value) -> Option<Value> {
        None
    }
    /// Called before every response is written (to inject garbage).
    fn before_response(&mut self, _io: &mut Io) -> io::Result<()> {
        Ok(())
    }
}

/// A tool call's string argument `key`, or "" when it is missing or not a
/// string.
pub fn str_arg<'a>(args: &'a Value, key: &str) -> &'a str {
    args.get(key).and_then(Value::as_str).unwrap_or("")
}

/// A text tool result.
pub fn text(s: impl Into<String>) -> Value {
    json!({"content": [{"type": "text", "text": s.into()}]})
}

/// A tool definition with an object input schema.
pub fn tool(name: &str, description: &str, properties: Value) -> Value {
    json!({"name": name, "description": description, "inputSchema": {"type": "object", "properties": properties}})
}

/// Serves `server` on stdin/stdout until stdin closes.
pub fn serve(server: &mut dyn Server) -> io::Result<()> {
    let mut io = Io {
        reader: BufReader::new(io::stdin()),
        out: io::stdout(),
        next_id: 0,
        current_id: Value::Null,
    };
    while let Some(msg) = io.read()? {
        let Some(method) = msg
            .get("method")
            .and_then(Value::as_str)
            .map(str::to_string)
        else {
            continue; // a response to nothing we wait for
        };
        let Some(id) = msg.get("id").cloned() else {
            continue; // notification
        };
        let params = msg.get("params").cloned().unwrap_or(Value::Null);
        io.current_id = id.clone();
        let info = json!({"name": server.name(), "version": "0.1.0"});
        let caps = json!({"tools": {"listChanged": true}});
        let outcome: CallResult = match method.as_str() {
            "initialize" => {
                let version = params
                    .get("protocolVersion")
                    .cloned()
                    .unwrap_or(json!("2025-11-25"));
                let mut r =
                    json!({"protocolVersion": version, "capabilities": caps, "serverInfo": info});
                if let Some(i) = server.instructions() {
                    r["instructions"] = json!(i);
                }
                Ok(r)
            }
            "server/discover" => {
                // The 2026-07-28 shape: a complete, privately cacheable result
                // with the server's identity in _meta (as the Python SDK's
                // servers answer).
                let mut r = json!({
                    "resultType": "complete",
                    "ttlMs": 0,
                    "cacheScope": "private",
                    "supportedVersions": VERSIONS,
                    "capabilities": caps,
                    "_meta": {"io.modelcontextprotocol/serverInfo": info},
                });
                if let Some(i) = server.instructions() {
                    r["instructions"] = json!(i);
                }
                Ok(r)
            }
            "ping" => Ok(json!({})),
            "tools/list" => Ok(json!({"tools": server.tools()})),
            "tools/call" => {
                let name = params
                    .get("name")
                    .and_then(Value::as_str)
                    .unwrap_or_default()
                    .to_string();
                let args = params.get("arguments").cloned().unwrap_or(json!({}));
                server.call(&mut io, &name, &args)
            }
            other => server
                .other(&mut io, other, &params)
                .ok_or((-32601, format!("method not found: {other}"))),
        };
        server.before_response(&mut io)?;
        if outcome == Ok(Value::Null) {
            continue; // the server wrote its own response
        }
        let response = match outcome {
            Ok(result) => json!({"jsonrpc": "2.0", "id": id, "result": result}),
            Err((code, message)) => {
                json!({"jsonrpc": "2.0", "id": id, "error": {"code": code, "message": message}})
            }
        };
        io.send(&response)?;
    }
    Ok(())
}

/// Runs `server`, exiting with status 1 on an I/O error other than a
/// closed pipe.
pub fn main_for(server: &mut dyn Server) {
    if let Err(e) = serve(server) {
        if e.kind() != io::ErrorKind::BrokenPipe {
            eprintln!("{}: {e}", server.name());
            std::process::exit(1);
        }
    }
}
