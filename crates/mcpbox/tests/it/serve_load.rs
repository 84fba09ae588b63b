//! `mcpbox serve` under concurrent load, through the real binary: many
//! clients, each an MCP session of its own on its own keep-alive
//! connection, call echo at once, and every answer must hold exactly the
//! calling client's own value and counter. A gateway that routed an answer
//! by JSON-RPC id instead of by session (every client here uses the same
//! ids) would hand one client another's data.
//!
//! The small version (10 clients x 100 calls, the fast `plain` test server)
//! runs in the suite; `bench/load.py` is the full one (100 x 1,000 against
//! server-everything) that `bench/run`'s serve section runs and reports.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use crate::common;

use std::io::{BufRead, BufReader, Read, Write};
use std::net::TcpStream;
use std::time::Duration;

use common::mcp::testserver;
use common::serve::{binary_policy, Gateway as Serve};
use serde_json::{json, Value};

/// One HTTP response: status, lowercase headers, whole body.
struct Response {
    status: u16,
    headers: Vec<(String, String)>,
    body: Vec<u8>,
}

impl Response {
    fn header(&self, name: &str) -> Option<&str> {
        self.headers
            .iter()
            .find(|(k, _)| k == name)
            .map(|(_, v)| v.as_str())
    }

    /// The JSON-RPC messages: the body as JSON, or each event's data.
    fn messages(&self) -> Vec<Value> {
        let ctype = self.header("content-type").unwrap_or("");
        if ctype.starts_with("application/json") {
            return vec![serde_json::from_slice(&self.body).expect("JSON body")];
        }
        assert!(
            ctype.starts_with("text/event-stream"),
            "content type {ctype}"
        );
        let text = String::from_utf8(self.body.clone()).expect("UTF-8 stream");
        text.split("\n\n")
            .filter_map(|event| {
                let data: Vec<&str> = event
                    .lines()
                    .filter_map(|l| l.strip_prefix("data:"))
                    .map(str::trim_start)
                    .collect();
                let data = data.join("\n");
                (!data.trim().is_empty()).then(|| serde_json::from_str(&data).expect("JSON event"))
            })
            .collect()
    }
}

/// A client: one connection, one session.
struct Client {
    conn: BufReader<TcpStream>,
    port: u16,
    path: String,
    session: Option<String>,
    version: Option<String>,
}

impl Client {
    fn connect(port: u16, path: &str) -> Client {
        let s = TcpStream::connect(("127.0.0.1", port)).expect("connect");
        s.set_nodelay(true).unwrap();
        s.set_read_timeout(Some(Duration::from_secs(60))).unwrap();
        Client {
            conn: BufReader::new(s),
            port,
            path: path.to_string(),
            session: None,
            version: None,
        }
    }

    fn post(&mut self, msg: &Value) -> Response {
        let body = serde_json::to_vec(msg).unwrap();
        let mut head = format!(
            "POST {} HTTP/1.1\r\nHost: 127.0.0.1:{}\r\nContent-Type: application/json\r\n\
             Accept: application/json, text/event-stream\r\nContent-Length: {}\r\n",
            self.path,
            self.port,
            body.len()
        );
        if let Some(s) = &self.session {
            head.push_str(&format!("Mcp-Session-Id: {s}\r\n"));
        }
        if let Some(v) = &self.version {
            head.push_str(&format!("MCP-Protocol-Version: {v}\r\n"));
        }
        head.push_str("\r\n");
        let s = self.conn.get_mut();
        s.write_all(head.as_bytes()).unwrap();
        s.write_all(&body).unwrap();
        self.read_response()
    }

    fn line(&mut self) -> String {
        let mut l = String::new();
        self.conn.read_line(&mut l).expect("read a line");
        assert!(!l.is_empty(), "the gateway closed the connection");
        l.trim_end_matches(['\r', '\n']).to_string()
    }

    fn read_response(&mut self) -> Response {
        let status_line = self.line();
        let status: u16 = status_line
            .split(' ')
            .nth(1)
            .and_then(|s| s.parse().ok())
            .unwrap_or_else(|| panic!("status line {status_line:?}"));
        let mut headers = Vec::new();
        loop {
            let l = self.line();
            if l.is_empty() {
                break;
            }
            let (k, v) = l.split_once(':').expect("header line");
            headers.push((k.trim().to_ascii_lowercase(), v.trim().to_string()));
        }
        let mut r = Response {
            status,
            headers,
            body: Vec::new(),
        };
        if r.header("transfer-encoding")
            .is_some_and(|t| t.contains("chunked"))
        {
            loop {
                let size = usize::from_str_radix(self.line().split(';').next().unwrap(), 16)
                    .expect("chunk size");
                if size == 0 {
                    while !self.line().is_empty() {} // trailers
                    break;
                }
                let mut chunk = vec![0; size + 2];
                self.conn.read_exact(&mut chunk).unwrap();
                r.body.extend_from_slice(&chunk[..size]);
            }
        } else if let Some(n) = r.header("content-length") {
            let mut body = vec![0; n.parse().unwrap()];
            self.conn.read_exact(&mut body).unwrap();
            r.body = body;
        }
        r
    }

    /// The result for request `id` in the response, or why there is none.
    fn result(r: &Response, id: u64) -> Result<Value, String> {
        if r.status != 200 {
            return Err(format!(
                "HTTP {}: {}",
                r.status,
                String::from_utf8_lossy(&r.body)
            ));
        }
        r.messages()
            .into_iter()
            .find(|m| m["id"] == json!(id) && m.get("method").is_none())
            .ok_or_else(|| format!("no answer with id {id}"))
            .and_then(|m| match m.get("result") {
                Some(res) => Ok(res.clone()),
                None => Err(format!("error answer {m}")),
            })
    }

    fn initialize(&mut self) {
        let r = self.post(
            &json!({"jsonrpc": "2.0", "id": 1, "method": "initialize", "params": {
            "protocolVersion": "2025-11-25", "capabilities": {},
            "clientInfo": {"name": "serve-load", "version": "0"}}}),
        );
        let result = Self::result(&r, 1).expect("initialize");
        self.session = Some(r.header("mcp-session-id").expect("session id").to_string());
        self.version = result["protocolVersion"].as_str().map(str::to_string);
        let r = self.post(&json!({"jsonrpc": "2.0", "method": "notifications/initialized"}));
        assert!(
            (200..300).contains(&r.status),
            "initialized: HTTP {}",
            r.status
        );
    }
}

/// 64 random bits as hex: a value no other client can have by chance.
fn random_hex() -> String {
    let mut b = [0u8; 8];
    std::fs::File::open("/dev/urandom")
        .unwrap()
        .read_exact(&mut b)
        .unwrap();
    mcpbox_policy::hex::encode(&b)
}

/// What one client saw: good answers, and the bad ones (with why).
struct Outcome {
    value: String,
    ok: usize,
    errors: Vec<String>,
    bodies: Vec<Vec<u8>>,
}

/// `clients` clients, each initialized, then all calling `tool` `calls`
/// times at once with `{arg: "<value>:<n>"}`, every call id n in every
/// client.
fn load(
    port: u16,
    path: &str,
    tool: &str,
    arg: &str,
    clients: usize,
    calls: u64,
) -> Vec<Result<Outcome, String>> {
    let barrier = std::sync::Arc::new(std::sync::Barrier::new(clients));
    let threads: Vec<_> = (0..clients)
        .map(|_| {
            let (path, tool, arg, barrier) = (
                path.to_string(),
                tool.to_string(),
                arg.to_string(),
                barrier.clone(),
            );
            std::thread::spawn(move || {
                // a client whose start fails still reaches the barrier, so
                // the others are not left waiting there for ever; it then
                // fails the test with its own message
                let started = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
                    let mut c = Client::connect(port, &path);
                    c.initialize();
                    c
                }));
                barrier.wait();
                let mut c = match started {
                    Ok(c) => c,
                    Err(e) => std::panic::resume_unwind(e),
                };
                let value = random_hex();
                let mut out = Outcome {
                    value: value.clone(),
                    ok: 0,
                    errors: Vec::new(),
                    bodies: Vec::new(),
                };
                for n in 1..=calls {
                    let want = format!("{value}:{n}");
                    let r = c.post(&json!({"jsonrpc": "2.0", "id": n, "method": "tools/call",
                        "params": {"name": tool, "arguments": {arg.as_str(): want}}}));
                    let text = Client::result(&r, n).map(|res| {
                        (
                            res["isError"].as_bool().unwrap_or(false),
                            res["content"][0]["text"].as_str().unwrap_or("").to_string(),
                        )
                    });
                    match text {
                        Ok((false, t)) if t == want => out.ok += 1,
                        Ok(other) => out.errors.push(format!("call {n}: answered {other:?}")),
                        Err(e) => out.errors.push(format!("call {n}: {e}")),
                    }
                    out.bodies.push(r.body);
                }
                out
            })
        })
        .collect();
    threads
        .into_iter()
        .map(|t| {
            t.join().map_err(|e| {
                e.downcast_ref::<String>()
                    .cloned()
                    .or_else(|| e.downcast_ref::<&str>().map(|s| s.to_string()))
                    .unwrap_or_else(|| "a client panicked".into())
            })
        })
        .collect()
}

/// Ten clients x 100 calls of `tool` at `path`, each answer checked.
fn ten_clients_at(path: &str, tool: &str) {
    let plain = testserver("plain");
    let gw = Serve::start_files(&[
        ("plain.toml", binary_policy("plain", &plain, "")),
        (
            "serve.toml",
            format!(
                // one client for all sessions: its rate limit raised above the load
                "[listen]\naddress = \"127.0.0.1:0\"\n\n[limits]\nrate_per_second = 100000\n\
                     burst = 100000\n\n[[clients]]\nname = \"load\"\n\
                     dangerously_allow_anonymous = true\n\n[[servers]]\nname = \"plain\"\n\
                     policy = \"plain.toml\"\ncommand = [{:?}]\n",
                plain.display().to_string()
            ),
        ),
    ]);
    let (clients, calls) = (10, 100);
    let outcomes = load(gw.port, path, tool, "text", clients, calls);
    let failed: Vec<&String> = outcomes.iter().filter_map(|o| o.as_ref().err()).collect();
    assert!(
        failed.is_empty(),
        "{} of {clients} clients failed, first: {}\ngateway log:\n{}",
        failed.len(),
        failed[0],
        gw.stderr()
    );
    let outcomes: Vec<Outcome> = outcomes.into_iter().flatten().collect();
    let errors: Vec<&String> = outcomes.iter().flat_map(|o| &o.errors).collect();
    assert!(
        errors.is_empty(),
        "{} of {} calls failed, first: {:?}\ngateway log:\n{}",
        errors.len(),
        clients as u64 * calls,
        &errors[..errors.len().min(5)],
        gw.stderr()
    );
    assert_eq!(
        outcomes.iter().map(|o| o.ok).sum::<usize>(),
        clients * calls as usize
    );
    // no byte of any answer a client received holds another client's value
    for o in &outcomes {
        for other in outcomes.iter().filter(|x| x.value != o.value) {
            let leaked = o
                .bodies
                .iter()
                .filter(|b| String::from_utf8_lossy(b).contains(&other.value))
                .count();
            assert_eq!(
                leaked, 0,
                "client {} received {leaked} answers holding client {}'s value",
                o.value, other.value
            );
        }
    }
}

#[test]
fn ten_concurrent_clients_each_receive_only_their_own_echoes() {
    ten_clients_at("/servers/plain/mcp", "echo");
}

#[test]
fn ten_concurrent_clients_on_the_aggregate_each_receive_only_their_own_echoes() {
    ten_clients_at("/mcp", "plain__echo");
}
