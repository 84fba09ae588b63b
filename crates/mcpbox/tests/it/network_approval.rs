//! `network.unlisted = "approve"` under `mcpbox run`, through the real
//! binary: a connection from the sandboxed server to an unlisted host is
//! held while the host is asked through MCP elicitation (the path tool
//! approvals use), then allowed once, for the session, or refused. Also the
//! audit's `files_written` for each call.
//!
//! The server is a small Python MCP server written into the workspace; the
//! upstream is a test HTTP server on 127.0.0.1, reached through a
//! `[network.hosts]` mapping. Loopback only.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use crate::common;

use std::io::{BufRead, BufReader, Write};
use std::net::TcpListener;
use std::path::PathBuf;
use std::sync::{Arc, Mutex};

use common::mcp::{result_text, Session};
use common::Workspace;
use serde_json::{json, Value};

/// A stdio MCP server with two tools: `fetch {url}` (through the proxy
/// settings mcpbox gives it) and `write {path, text}` (under
/// /workspace/output).
const SERVER: &str = r#"
import json, os, sys, urllib.request, urllib.error
# loopback names would bypass the proxy; these tests want the proxy
for k in ("no_proxy", "NO_PROXY"):
    os.environ.pop(k, None)
TOOLS = [
    {"name": "fetch", "description": "Fetches a URL.",
     "inputSchema": {"type": "object", "properties": {"url": {"type": "string"}}, "required": ["url"]}},
    {"name": "write", "description": "Writes a file under /workspace/output.",
     "inputSchema": {"type": "object", "properties": {"path": {"type": "string"}, "text": {"type": "string"}}, "required": ["path"]}},
]
def send(msg):
    sys.stdout.write(json.dumps(msg) + "\n")
    sys.stdout.flush()
for line in sys.stdin:
    msg = json.loads(line)
    mid, method = msg.get("id"), msg.get("method")
    if mid is None or method is None:
        continue
    params = msg.get("params") or {}
    if method == "initialize":
        send({"jsonrpc": "2.0", "id": mid, "result": {"protocolVersion": params.get("protocolVersion"),
              "capabilities": {"tools": {}}, "serverInfo": {"name": "py", "version": "0"}}})
    elif method == "tools/list":
        send({"jsonrpc": "2.0", "id": mid, "result": {"tools": TOOLS}})
    elif method == "tools/call":
        args = params.get("arguments") or {}
        if params.get("name") == "fetch":
            try:
                text = urllib.request.urlopen(args["url"], timeout=60).read().decode()
            except urllib.error.HTTPError as e:
                text = "HTTP %d %s" % (e.code, e.headers.get("X-Mcpbox-Reason"))
            except Exception as e:
                text = "ERROR %s %s" % (type(e).__name__, e)
        else:
            path = os.path.join("/workspace/output", args["path"])
            os.makedirs(os.path.dirname(path), exist_ok=True)
            with open(path, "w") as f:
                f.write(args.get("text", ""))
            text = "wrote " + args["path"]
        send({"jsonrpc": "2.0", "id": mid, "result": {"content": [{"type": "text", "text": text}]}})
    else:
        send({"jsonrpc": "2.0", "id": mid, "error": {"code": -32601, "message": "method not found"}})
"#;

/// An HTTP server on 127.0.0.1 answering every request with `body`; the
/// request lines it received are kept.
fn upstream(body: &'static str) -> (u16, Arc<Mutex<Vec<String>>>) {
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let port = listener.local_addr().unwrap().port();
    let seen = Arc::new(Mutex::new(Vec::new()));
    let log = seen.clone();
    std::thread::spawn(move || {
        for conn in listener.incoming() {
            let Ok(mut conn) = conn else { continue };
            let mut reader = BufReader::new(conn.try_clone().unwrap());
            let mut line = String::new();
            let _ = reader.read_line(&mut line);
            log.lock().unwrap().push(line.trim_end().to_string());
            let mut header = String::new();
            while reader
                .read_line(&mut header)
                .map(|n| n > 2)
                .unwrap_or(false)
            {
                header.clear();
            }
            let _ = write!(
                conn,
                "HTTP/1.1 200 OK\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
                body.len()
            );
        }
    });
    (port, seen)
}

/// A workspace with the server script, and a policy that lists no host
/// but asks about unlisted ones; `ask.test` points at the loopback upstream.
fn setup() -> (Workspace, PathBuf) {
    let ws = Workspace::new();
    std::fs::write(ws.input().join("server.py"), SERVER).unwrap();
    let p = ws.policy(
        "[audit]\npath = \"audit.db\"\n\
         [network]\nallow = []\nunlisted = \"approve\"\n\
         [network.hosts]\n\"ask.test\" = \"127.0.0.1\"\n",
    );
    (ws, p)
}

fn start(ws: &Workspace, p: &std::path::Path) -> Session {
    let state = ws.path().join("state").display().to_string();
    Session::start(
        p,
        &["python3", "/workspace/input/server.py"],
        &[("MCPBOX_STATE_DIR", state.as_str())],
    )
}

fn initialize(s: &mut Session, capabilities: Value) {
    let r = s.request(
        "initialize",
        json!({"protocolVersion": "2025-11-25", "capabilities": capabilities,
               "clientInfo": {"name": "mcpbox-test", "version": "0"}}),
    );
    assert!(r.get("result").is_some(), "{r}");
    s.send(&json!({"jsonrpc": "2.0", "method": "notifications/initialized"}));
}

/// Calls a tool, answering every `elicitation/create` on the way with
/// `decision` (None: the test host has no such capability, and any
/// question fails the test). Returns the response and the questions.
fn call_answering(
    s: &mut Session,
    id: u64,
    tool: &str,
    args: Value,
    decision: Option<&str>,
) -> (Value, Vec<Value>) {
    s.send(&json!({"jsonrpc": "2.0", "id": id, "method": "tools/call",
                   "params": {"name": tool, "arguments": args}}));
    let mut questions = Vec::new();
    loop {
        let msg = s.recv();
        if msg["method"] == "elicitation/create" {
            let Some(decision) = decision else {
                panic!("a host without elicitation was asked: {msg}");
            };
            s.send(&json!({"jsonrpc": "2.0", "id": msg["id"],
                "result": {"action": "accept", "content": {"decision": decision}}}));
            questions.push(msg);
        } else if msg["id"] == json!(id) && msg.get("method").is_none() {
            return (msg, questions);
        }
    }
}

fn audit(ws: &Workspace) -> Vec<Value> {
    common::audit::events(&ws.path().join("audit.db"))
}

fn network_to(events: &[Value], host: &str) -> Vec<Value> {
    events
        .iter()
        .filter(|e| e["kind"] == "network" && e["detail"]["host"] == host)
        .cloned()
        .collect()
}

#[test]
fn policy_that_asks_about_unlisted_hosts_passes_check() {
    let (_ws, p) = setup();
    let out = common::run(&["check", p.to_str().unwrap()]);
    assert!(
        out.status.success(),
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
}

#[test]
fn unlisted_host_is_fetched_after_the_host_approves_once() {
    let (port, seen) = upstream("hello from the unlisted host");
    let (ws, p) = setup();
    let mut s = start(&ws, &p);
    initialize(&mut s, json!({"elicitation": {}}));
    let url = format!("http://ask.test:{port}/first");
    let (r, questions) = call_answering(&mut s, 10, "fetch", json!({"url": url}), Some("once"));
    assert_eq!(result_text(&r), "hello from the unlisted host", "{r}");
    assert_eq!(questions.len(), 1, "{questions:?}");
    let q = &questions[0];
    assert_eq!(q["params"]["mode"], "form");
    let message = q["params"]["message"].as_str().unwrap();
    assert!(
        message.contains("ask.test") && message.contains(&port.to_string()),
        "{message}"
    );
    assert!(
        q["id"].as_str().unwrap().starts_with("mcpbox-network-"),
        "{q}"
    );
    // "once" is one connection: the next one is asked about again
    let url = format!("http://ask.test:{port}/second");
    let (r, questions) = call_answering(&mut s, 11, "fetch", json!({"url": url}), Some("once"));
    assert_eq!(result_text(&r), "hello from the unlisted host", "{r}");
    assert_eq!(questions.len(), 1);
    let (status, err) = s.finish();
    assert!(status.success(), "{err}");
    assert_eq!(seen.lock().unwrap().len(), 2);

    let events = audit(&ws);
    let net = network_to(&events, "ask.test");
    assert_eq!(net.len(), 2, "{net:?}");
    for e in &net {
        assert_eq!(e["decision"], "approve", "{e}");
        assert_eq!(e["reason"], "network.approved_once", "{e}");
    }
}

#[test]
fn unlisted_host_approved_for_the_session_is_not_asked_again() {
    let (port, seen) = upstream("session body");
    let (ws, p) = setup();
    let mut s = start(&ws, &p);
    initialize(&mut s, json!({"elicitation": {"form": {}}}));
    let url = format!("http://ask.test:{port}/");
    let (r, questions) = call_answering(&mut s, 10, "fetch", json!({"url": url}), Some("session"));
    assert_eq!(result_text(&r), "session body");
    assert_eq!(questions.len(), 1);
    // a second question would fail the call with None
    let (r, _) = call_answering(&mut s, 11, "fetch", json!({"url": url}), None);
    assert_eq!(result_text(&r), "session body");
    s.finish();
    assert_eq!(seen.lock().unwrap().len(), 2);
    let reasons: Vec<Value> = network_to(&audit(&ws), "ask.test")
        .iter()
        .map(|e| e["reason"].clone())
        .collect();
    assert_eq!(
        reasons,
        vec![
            json!("network.approved_session"),
            json!("network.approved_session")
        ]
    );
}

#[test]
fn unlisted_host_is_refused_when_the_host_denies() {
    let (port, seen) = upstream("must not be fetched");
    let (ws, p) = setup();
    let mut s = start(&ws, &p);
    initialize(&mut s, json!({"elicitation": {}}));
    let url = format!("http://ask.test:{port}/secret");
    let (r, questions) = call_answering(&mut s, 10, "fetch", json!({"url": url}), Some("deny"));
    assert_eq!(questions.len(), 1);
    assert_eq!(result_text(&r), "HTTP 403 network.approval_denied", "{r}");
    s.finish();
    assert!(
        seen.lock().unwrap().is_empty(),
        "{:?}",
        seen.lock().unwrap()
    );
    let net = network_to(&audit(&ws), "ask.test");
    assert_eq!(net.len(), 1, "{net:?}");
    assert_eq!(net[0]["decision"], "deny");
    assert_eq!(net[0]["reason"], "network.approval_denied");
}

#[test]
fn unlisted_host_is_refused_without_elicitation_support() {
    let (port, seen) = upstream("must not be fetched");
    let (ws, p) = setup();
    let mut s = start(&ws, &p);
    initialize(&mut s, json!({}));
    let url = format!("http://ask.test:{port}/");
    let (r, _) = call_answering(&mut s, 10, "fetch", json!({"url": url}), None);
    assert_eq!(result_text(&r), "HTTP 403 network.approval_denied", "{r}");
    s.finish();
    assert!(seen.lock().unwrap().is_empty());
    let net = network_to(&audit(&ws), "ask.test");
    assert_eq!(net.len(), 1, "{net:?}");
    assert_eq!(net[0]["decision"], "deny");
    assert_eq!(net[0]["reason"], "network.approval_denied");
}

#[test]
fn audit_lists_files_the_call_wrote() {
    let (ws, p) = setup();
    std::fs::write(ws.output().join("before.txt"), "written before the session").unwrap();
    let mut s = start(&ws, &p);
    initialize(&mut s, json!({}));
    let (r, _) = call_answering(
        &mut s,
        10,
        "write",
        json!({"path": "a.txt", "text": "one"}),
        None,
    );
    assert_eq!(result_text(&r), "wrote a.txt", "{r}");
    // file times come from a clock that advances once per kernel tick (at
    // most 10 ms); let a.txt's time fall behind the next call's start
    std::thread::sleep(std::time::Duration::from_millis(50));
    let (r, _) = call_answering(
        &mut s,
        11,
        "write",
        json!({"path": "sub/dir/b.txt", "text": "two"}),
        None,
    );
    assert_eq!(result_text(&r), "wrote sub/dir/b.txt", "{r}");
    s.finish();
    let calls: Vec<Value> = audit(&ws)
        .into_iter()
        .filter(|e| e["kind"] == "tool_call")
        .collect();
    assert_eq!(calls.len(), 2, "{calls:?}");
    assert_eq!(calls[0]["files_written"], json!(["a.txt"]), "{}", calls[0]);
    assert_eq!(
        calls[1]["files_written"],
        json!(["sub/dir/b.txt"]),
        "{}",
        calls[1]
    );
}

/// `setup`, plus `extra` policy text, and a private runtime directory for
/// the control socket `mcpbox approvals` talks to.
fn setup_broker(extra: &str) -> (Workspace, PathBuf, Vec<(String, String)>) {
    let ws = Workspace::new();
    std::fs::write(ws.input().join("server.py"), SERVER).unwrap();
    let p = ws.policy(&format!(
        "[audit]\npath = \"audit.db\"\n\
         [network]\nallow = []\nunlisted = \"approve\"\n\
         [network.hosts]\n\"ask.test\" = \"127.0.0.1\"\n{extra}\n"
    ));
    let xdg = ws.path().join("xdg");
    std::fs::create_dir(&xdg).unwrap();
    std::fs::set_permissions(&xdg, std::os::unix::fs::PermissionsExt::from_mode(0o700)).unwrap();
    let env = vec![
        ("XDG_RUNTIME_DIR".to_string(), xdg.display().to_string()),
        (
            "MCPBOX_STATE_DIR".to_string(),
            ws.path().join("state").display().to_string(),
        ),
    ];
    (ws, p, env)
}

fn approvals_cli(env: &[(String, String)], args: &[&str]) -> std::process::Output {
    let mut cmd = std::process::Command::new(common::mcpbox());
    cmd.arg("approvals").args(args);
    for (k, v) in env {
        cmd.env(k, v);
    }
    cmd.output().unwrap()
}

/// Waits for the first network approval listed.
fn wait_network_approval(env: &[(String, String)]) -> Value {
    let end = std::time::Instant::now() + std::time::Duration::from_secs(30);
    loop {
        let out = approvals_cli(env, &["list", "--json"]);
        let list: Value = serde_json::from_slice(&out.stdout).unwrap_or(json!([]));
        if let Some(a) = list
            .as_array()
            .and_then(|l| l.iter().find(|a| a["subject"]["type"] == "network"))
        {
            return a.clone();
        }
        assert!(
            std::time::Instant::now() < end,
            "no network approval listed: {list}"
        );
        std::thread::sleep(std::time::Duration::from_millis(50));
    }
}

fn start_env(p: &std::path::Path, env: &[(String, String)]) -> Session {
    let env: Vec<(&str, &str)> = env.iter().map(|(k, v)| (k.as_str(), v.as_str())).collect();
    Session::start(p, &["python3", "/workspace/input/server.py"], &env)
}

#[test]
fn unlisted_host_without_elicitation_waits_until_the_cli_approves_it() {
    let (port, seen) = upstream("hello after the CLI said yes");
    let (_ws, p, env) = setup_broker("[approvals]\nfallback = \"hold\"\ntimeout = \"60s\"\n");
    let mut s = start_env(&p, &env);
    initialize(&mut s, json!({}));
    let url = format!("http://ask.test:{port}/held");
    s.send(&json!({"jsonrpc": "2.0", "id": 5, "method": "tools/call",
                   "params": {"name": "fetch", "arguments": {"url": url}}}));
    let a = wait_network_approval(&env);
    assert_eq!(a["subject"]["host"], "ask.test", "{a}");
    assert_eq!(a["subject"]["port"], json!(port));
    assert!(
        seen.lock().unwrap().is_empty(),
        "nothing reached the host before the approval"
    );
    let out = approvals_cli(&env, &["approve", a["id"].as_str().unwrap()]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let r = loop {
        let m = s.recv();
        if m["id"] == json!(5) {
            break m;
        }
    };
    assert_eq!(result_text(&r), "hello after the CLI said yes", "{r}");
    s.finish();
}

#[test]
fn unlisted_host_refused_until_approved_then_one_retry_connects() {
    let (port, seen) = upstream("hello on the retry");
    let (_ws, p, env) = setup_broker("");
    let mut s = start_env(&p, &env);
    initialize(&mut s, json!({}));
    let url = format!("http://ask.test:{port}/refused");
    let (r, _) = call_answering(&mut s, 6, "fetch", json!({"url": url}), None);
    assert!(result_text(&r).starts_with("HTTP 403"), "{r}");
    let a = wait_network_approval(&env);
    assert_eq!(a["held"], false);
    let out = approvals_cli(&env, &["approve", a["id"].as_str().unwrap()]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let (r2, _) = call_answering(&mut s, 7, "fetch", json!({"url": url}), None);
    assert_eq!(result_text(&r2), "hello on the retry", "{r2}");
    // once: the next connection is a new question
    let (r3, _) = call_answering(&mut s, 8, "fetch", json!({"url": url}), None);
    assert!(result_text(&r3).starts_with("HTTP 403"), "{r3}");
    assert_eq!(seen.lock().unwrap().len(), 1);
    s.finish();
}
