//! In-process relay driven over a socket pair, against the test servers.
#![allow(dead_code, clippy::unwrap_used, clippy::expect_used)]

use std::io::{BufRead, BufReader, Write};
use std::os::unix::net::UnixStream;
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::Duration;

use mcpbox_audit::{Event, Kind, Sink};
use mcpbox_gateway::{
    CommandLauncher, Config, Decision, Outcome, Reason, Relay, ToolHints, ToolPolicy, Verdict,
};
use serde_json::{json, Value};

/// Audit events kept in memory.
#[derive(Default)]
pub struct MemSink(pub Mutex<Vec<Event>>);

impl Sink for MemSink {
    fn record(&self, event: Event) {
        self.0.lock().unwrap().push(event);
    }
}

impl MemSink {
    pub fn events(&self) -> Vec<Event> {
        self.0.lock().unwrap().clone()
    }
    pub fn of(&self, kind: Kind) -> Vec<Event> {
        self.events()
            .into_iter()
            .filter(|e| e.kind == Some(kind))
            .collect()
    }
}

/// Tool rules by name or `prefix*`, first match wins, default allow.
pub struct Rules(pub Vec<(&'static str, Verdict)>);

/// The reason [`Rules`] gives for a matched pattern (what the policy
/// crate's `ToolRules` gives too).
pub const RULE_REASON: &str = "tool.rule";

impl ToolPolicy for Rules {
    fn decide(&self, tool: &str, _hints: &ToolHints) -> Decision {
        for (pat, action) in &self.0 {
            let hit = match pat.strip_suffix('*') {
                Some(prefix) => tool.starts_with(prefix),
                None => tool == *pat,
            };
            if hit {
                return Decision::new(*action, Reason::ToolRule, format!("policy:tools.\"{pat}\""));
            }
        }
        Decision::allow(Reason::ToolDefault, "policy:tools.default")
    }
}

pub fn bin(name: &str) -> String {
    match name {
        "plain" => env!("CARGO_BIN_EXE_plain").into(),
        "rugpull" => env!("CARGO_BIN_EXE_rugpull").into(),
        "flood" => env!("CARGO_BIN_EXE_flood").into(),
        "garbage" => env!("CARGO_BIN_EXE_garbage").into(),
        "crasher" => env!("CARGO_BIN_EXE_crasher").into(),
        "echo_secrets" => env!("CARGO_BIN_EXE_echo_secrets").into(),
        "poisoned" => env!("CARGO_BIN_EXE_poisoned").into(),
        other => other.into(),
    }
}

pub fn config() -> Config {
    Config {
        server_name: "test".into(),
        sandbox_id: "sb-1".into(),
        workspace_id: "ws-1".into(),
        shutdown_grace: Duration::from_millis(300),
        ..Config::default()
    }
}

pub struct Host {
    pub sock: UnixStream,
    reader: BufReader<UnixStream>,
    pub handle: Option<JoinHandle<mcpbox_gateway::Result<Outcome>>>,
    pub audit: Arc<MemSink>,
    /// Messages received while waiting for a specific response.
    pub others: Vec<Value>,
}

/// Starts a relay for test server `name` (or a program path) with `args`.
pub fn start(
    name: &str,
    args: &[&str],
    build: impl FnOnce(Relay) -> Relay,
    config: Config,
) -> Host {
    let launcher = CommandLauncher::new(bin(name), args.iter().map(|s| s.to_string()));
    let audit = Arc::new(MemSink::default());
    let relay = build(Relay::new(config, Box::new(launcher)).audit(audit.clone()));
    let (ours, theirs) = UnixStream::pair().unwrap();
    let relay_in = theirs.try_clone().unwrap();
    let handle = std::thread::spawn(move || relay.run(Box::new(relay_in), Box::new(theirs)));
    ours.set_read_timeout(Some(Duration::from_secs(30)))
        .unwrap();
    let reader = BufReader::new(ours.try_clone().unwrap());
    Host {
        sock: ours,
        reader,
        handle: Some(handle),
        audit,
        others: Vec::new(),
    }
}

pub fn plain_start(name: &str, config: Config) -> Host {
    start(name, &[], |r| r, config)
}

impl Host {
    pub fn send(&mut self, line: &str) {
        self.sock.write_all(line.as_bytes()).unwrap();
        self.sock.write_all(b"\n").unwrap();
    }

    pub fn send_value(&mut self, v: &Value) {
        self.send(&v.to_string());
    }

    pub fn recv_line(&mut self) -> String {
        let mut line = String::new();
        let n = self
            .reader
            .read_line(&mut line)
            .expect("relay answered in time");
        assert!(n > 0, "relay closed its output");
        line.trim_end_matches('\n').to_string()
    }

    pub fn recv(&mut self) -> Value {
        let line = self.recv_line();
        serde_json::from_str(&line)
            .unwrap_or_else(|e| panic!("relay sent invalid json ({e}): {line:?}"))
    }

    /// Waits for the response to `id`, keeping other messages in `others`.
    pub fn wait_for(&mut self, id: &Value) -> Value {
        loop {
            let v = self.recv();
            if v.get("id") == Some(id) && v.get("method").is_none() {
                return v;
            }
            self.others.push(v);
        }
    }

    /// Sends a request and waits for its response.
    pub fn request(&mut self, id: Value, method: &str, params: Value) -> Value {
        self.send_value(&json!({"jsonrpc": "2.0", "id": id, "method": method, "params": params}));
        self.wait_for(&id)
    }

    pub fn init(&mut self, capabilities: Value) -> Value {
        let r = self.request(
            json!(0),
            "initialize",
            json!({"protocolVersion": "2025-11-25", "capabilities": capabilities, "clientInfo": {"name": "t", "version": "1"}}),
        );
        self.send(r#"{"jsonrpc":"2.0","method":"notifications/initialized"}"#);
        r
    }

    pub fn list(&mut self, id: i64) -> Vec<Value> {
        let r = self.request(json!(id), "tools/list", json!({}));
        r["result"]["tools"].as_array().cloned().unwrap_or_default()
    }

    pub fn call(&mut self, id: i64, tool: &str, args: Value) -> Value {
        self.request(
            json!(id),
            "tools/call",
            json!({"name": tool, "arguments": args}),
        )
    }

    /// Closes our output (the relay sees EOF) and waits for the relay.
    pub fn close(mut self) -> Outcome {
        self.sock.shutdown(std::net::Shutdown::Write).unwrap();
        self.handle
            .take()
            .unwrap()
            .join()
            .unwrap()
            .expect("relay ran")
    }

    /// Waits for the relay to end on its own.
    pub fn join(mut self) -> Outcome {
        self.handle
            .take()
            .unwrap()
            .join()
            .unwrap()
            .expect("relay ran")
    }
}

pub fn names(tools: &[Value]) -> Vec<String> {
    tools
        .iter()
        .map(|t| t["name"].as_str().unwrap().to_string())
        .collect()
}

pub fn decision_meta(resp: &Value) -> &Value {
    &resp["result"]["_meta"]["mcpbox/decision"]
}

pub fn history(host: &mut Host, id: i64) -> Vec<Value> {
    let r = host.call(id, "history", json!({}));
    r["result"]["structuredContent"]["calls"]
        .as_array()
        .cloned()
        .unwrap()
}
