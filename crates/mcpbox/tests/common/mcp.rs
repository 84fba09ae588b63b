//! A minimal newline-delimited JSON-RPC client driving `mcpbox run` through
//! the real binary, for tests with the project's own (hostile) servers.
#![allow(dead_code, clippy::unwrap_used, clippy::expect_used)]

use std::io::{BufRead, BufReader, Write};
use std::path::{Path, PathBuf};
use std::process::{Child, ChildStdin, Command, Stdio};
use std::sync::mpsc::{Receiver, RecvTimeoutError};
use std::time::Duration;

use serde_json::{json, Value};

/// A test server binary from crates/testservers (MCPBOX_TESTSERVERS
/// overrides the directory, for the rootless run).
pub fn testserver(name: &str) -> PathBuf {
    let dir = std::env::var_os("MCPBOX_TESTSERVERS")
        .map(PathBuf::from)
        .unwrap_or_else(|| super::mcpbox().parent().unwrap().to_path_buf());
    let p = dir.join(name);
    assert!(
        p.exists(),
        "{} is missing: build it with `cargo build -p mcpbox-testservers`",
        p.display()
    );
    p
}

/// `mcpbox run` with a JSON-RPC conversation on its stdio.
pub struct Session {
    pub child: Child,
    stdin: Option<ChildStdin>,
    lines: Receiver<String>,
    pub stderr: std::sync::Arc<std::sync::Mutex<String>>,
    next_id: u64,
}

impl Session {
    /// Starts `mcpbox run --policy POLICY -- ARGS` with `env` added.
    pub fn start(policy: &Path, args: &[&str], env: &[(&str, &str)]) -> Session {
        let mut all = vec!["run".to_string(), "--policy".into()];
        all.push(policy.display().to_string());
        all.push("--".into());
        all.extend(args.iter().map(|a| a.to_string()));
        Session::start_mcpbox(&all, env)
    }

    /// Starts `mcpbox ARGS` with `env` added.
    pub fn start_mcpbox(args: &[String], env: &[(&str, &str)]) -> Session {
        let mut cmd = Command::new(super::mcpbox());
        cmd.args(args);
        for (k, v) in env {
            cmd.env(k, v);
        }
        Session::start_command(cmd)
    }

    /// Starts `cmd` (which runs an `mcpbox run` somehow) with its stdio
    /// piped to the conversation.
    pub fn start_command(mut cmd: Command) -> Session {
        cmd.stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped());
        let mut child = cmd.spawn().expect("spawn mcpbox run");
        let stdout = child.stdout.take().unwrap();
        let (tx, lines) = std::sync::mpsc::channel();
        std::thread::spawn(move || {
            for line in BufReader::new(stdout).lines() {
                let Ok(line) = line else { break };
                if tx.send(line).is_err() {
                    break;
                }
            }
        });
        let stderr_text = std::sync::Arc::new(std::sync::Mutex::new(String::new()));
        let sink = stderr_text.clone();
        let stderr = child.stderr.take().unwrap();
        std::thread::spawn(move || {
            for line in BufReader::new(stderr).lines() {
                let Ok(line) = line else { break };
                let mut s = sink.lock().unwrap();
                s.push_str(&line);
                s.push('\n');
            }
        });
        Session {
            stdin: child.stdin.take(),
            child,
            lines,
            stderr: stderr_text,
            next_id: 1,
        }
    }

    pub fn send(&mut self, msg: &Value) {
        let stdin = self.stdin.as_mut().expect("stdin open");
        writeln!(stdin, "{msg}").unwrap();
        stdin.flush().unwrap();
    }

    pub fn send_raw(&mut self, line: &str) {
        let stdin = self.stdin.as_mut().expect("stdin open");
        writeln!(stdin, "{line}").unwrap();
        stdin.flush().unwrap();
    }

    /// The next message from mcpbox, within 20 seconds.
    pub fn recv(&mut self) -> Value {
        match self.lines.recv_timeout(Duration::from_secs(20)) {
            Ok(line) => {
                serde_json::from_str(&line).unwrap_or_else(|e| panic!("not JSON ({e}): {line}"))
            }
            Err(RecvTimeoutError::Timeout) => {
                panic!("no message within 20s; stderr:\n{}", self.stderr())
            }
            Err(RecvTimeoutError::Disconnected) => {
                panic!("mcpbox closed stdout; stderr:\n{}", self.stderr())
            }
        }
    }

    /// Sends a request and returns its response (other messages skipped).
    pub fn request(&mut self, method: &str, params: Value) -> Value {
        let id = self.next_id;
        self.next_id += 1;
        self.send(&json!({"jsonrpc": "2.0", "id": id, "method": method, "params": params}));
        loop {
            let msg = self.recv();
            if msg.get("id") == Some(&json!(id)) && msg.get("method").is_none() {
                return msg;
            }
        }
    }

    pub fn initialize(&mut self) -> Value {
        let r = self.request(
            "initialize",
            json!({"protocolVersion": "2025-11-25", "capabilities": {}, "clientInfo": {"name": "mcpbox-test", "version": "0"}}),
        );
        self.send(&json!({"jsonrpc": "2.0", "method": "notifications/initialized"}));
        r
    }

    pub fn call(&mut self, tool: &str, args: Value) -> Value {
        self.request("tools/call", json!({"name": tool, "arguments": args}))
    }

    pub fn tool_names(&mut self) -> Vec<String> {
        let r = self.request("tools/list", json!({}));
        r["result"]["tools"]
            .as_array()
            .unwrap_or_else(|| panic!("no tools in {r}"))
            .iter()
            .map(|t| t["name"].as_str().unwrap_or_default().to_string())
            .collect()
    }

    pub fn stderr(&self) -> String {
        self.stderr.lock().unwrap().clone()
    }

    /// Closes mcpbox's stdin (the host is done sending); its output is
    /// still read.
    pub fn close_stdin(&mut self) {
        drop(self.stdin.take());
    }

    /// Closes stdin and waits for mcpbox to exit.
    pub fn finish(mut self) -> (std::process::ExitStatus, String) {
        drop(self.stdin.take());
        let status = self.child.wait().unwrap();
        std::thread::sleep(Duration::from_millis(50));
        let err = self.stderr();
        (status, err)
    }
}

/// The text of a tool result's content items, joined.
pub fn result_text(resp: &Value) -> String {
    resp["result"]["content"]
        .as_array()
        .map(|items| {
            items
                .iter()
                .filter_map(|i| i["text"].as_str())
                .collect::<Vec<_>>()
                .join("\n")
        })
        .unwrap_or_default()
}

/// Whether `v` holds a `_meta` key under mcpbox's names, anywhere.
pub fn holds_reserved_meta(v: &Value) -> bool {
    match v {
        Value::Object(m) => {
            m.get("_meta")
                .and_then(Value::as_object)
                .is_some_and(|meta| {
                    meta.keys()
                        .any(|k| k.starts_with("mcpbox") || k.starts_with("io.mcpbox"))
                })
                || m.values().any(holds_reserved_meta)
        }
        Value::Array(a) => a.iter().any(holds_reserved_meta),
        _ => false,
    }
}
