//! The web console through the real binary (`mcpbox run --console`): who
//! may read it and change anything through it, and that the sandboxed
//! server cannot reach it. Each test is named after the attack it tries.
//! The browser's side (live approvals, rendering) is tests/console_browser.rs.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use crate::common;

use std::io::{Read, Write};
use std::net::TcpStream;
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use common::mcp::Session;
use common::Workspace;
use serde_json::{json, Value};

/// `mcpbox run --console` with the `plain` test server, its state and
/// runtime directories inside the workspace.
struct Console {
    session: Session,
    ws: Workspace,
    url: String,
    port: u16,
    token: String,
}

fn policy(ws: &Workspace, extra: &str) -> PathBuf {
    ws.policy(&format!(
        "[audit]\npath = \"audit.db\"\n[approvals]\nfallback = \"hold\"\n\
         [tools]\n\"echo\" = \"approve\"\n{extra}"
    ))
}

fn runtime_dir(ws: &Workspace) -> PathBuf {
    let d = ws.path().join("run");
    std::fs::create_dir_all(&d).unwrap();
    std::fs::set_permissions(&d, std::fs::Permissions::from_mode(0o700)).unwrap();
    d
}

impl Console {
    fn start() -> Console {
        let ws = Workspace::with_server("plain");
        let p = policy(&ws, "");
        let state = ws.path().join("state").display().to_string();
        let run = runtime_dir(&ws).display().to_string();
        let args: Vec<String> = [
            "run",
            "--console",
            "--policy",
            p.to_str().unwrap(),
            "--",
            "/workspace/input/plain",
        ]
        .iter()
        .map(|s| s.to_string())
        .collect();
        let mut session = Session::start_mcpbox(
            &args,
            &[("MCPBOX_STATE_DIR", &state), ("XDG_RUNTIME_DIR", &run)],
        );
        let url = wait_for_url(&session);
        session.initialize();
        let rest = url.strip_prefix("http://127.0.0.1:").unwrap();
        let port = rest.split('/').next().unwrap().parse().unwrap();
        let token = url.split("#token=").nth(1).unwrap().to_string();
        Console {
            session,
            ws,
            url,
            port,
            token,
        }
    }

    fn origin(&self) -> String {
        format!("http://127.0.0.1:{}", self.port)
    }

    fn bearer(&self) -> String {
        format!("Bearer {}", self.token)
    }

    fn get(&self, path: &str) -> Reply {
        request(
            self.port,
            "GET",
            path,
            &[("Authorization", &self.bearer())],
            "",
        )
    }
}

/// The console's URL, from the one line it prints on stderr.
fn wait_for_url(session: &Session) -> String {
    let until = Instant::now() + Duration::from_secs(20);
    loop {
        let err = session.stderr();
        if let Some(line) = err.lines().find(|l| l.starts_with("mcpbox: console at ")) {
            return line["mcpbox: console at ".len()..].trim().to_string();
        }
        assert!(Instant::now() < until, "no console line on stderr: {err}");
        std::thread::sleep(Duration::from_millis(50));
    }
}

struct Reply {
    status: u16,
    body: String,
}

fn request(port: u16, method: &str, path: &str, headers: &[(&str, &str)], body: &str) -> Reply {
    let mut s = TcpStream::connect(("127.0.0.1", port)).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(30))).unwrap();
    let mut req = format!("{method} {path} HTTP/1.1\r\nConnection: close\r\n");
    if !headers.iter().any(|(k, _)| k.eq_ignore_ascii_case("host")) {
        req.push_str(&format!("Host: 127.0.0.1:{port}\r\n"));
    }
    for (k, v) in headers {
        req.push_str(&format!("{k}: {v}\r\n"));
    }
    req.push_str(&format!("Content-Length: {}\r\n\r\n{body}", body.len()));
    s.write_all(req.as_bytes()).unwrap();
    let mut out = Vec::new();
    let _ = s.read_to_end(&mut out);
    let text = String::from_utf8_lossy(&out).into_owned();
    let (head, body) = text.split_once("\r\n\r\n").unwrap_or((&text, ""));
    Reply {
        status: head
            .split(' ')
            .nth(1)
            .and_then(|c| c.parse().ok())
            .unwrap_or(0),
        body: body.to_string(),
    }
}

#[test]
fn console_url_is_printed_and_kept_in_a_private_file_removed_at_exit() {
    let c = Console::start();
    assert!(c.url.starts_with("http://127.0.0.1:"), "{}", c.url);
    assert_eq!(c.token.len(), 64, "32 random bytes, hex");
    let dir =
        c.ws.path()
            .join("run/mcpbox")
            .join(format!("console-{}", c.session.child.id()));
    let file = dir.join("console.url");
    let meta = std::fs::metadata(&file).unwrap();
    assert_eq!(meta.permissions().mode() & 0o777, 0o600);
    assert_eq!(
        std::fs::metadata(&dir).unwrap().permissions().mode() & 0o777,
        0o700
    );
    assert_eq!(std::fs::read_to_string(&file).unwrap().trim(), c.url);
    let Console { session, ws, .. } = c;
    let (status, err) = session.finish();
    assert!(status.success(), "{err}");
    assert!(!file.exists(), "console.url is left behind");
    drop(ws);
}

/// Issue 32: `approvals list` named the consoles of processes killed with
/// -9 for ever. A console directory whose pid is gone is neither listed nor
/// kept; one whose pid was reused by another program is not listed.
#[test]
fn approvals_list_names_live_consoles_only() {
    let c = Console::start();
    let run = c.ws.path().join("run/mcpbox");
    let mut gone = std::process::Command::new("true").spawn().unwrap();
    let dead = gone.id();
    gone.wait().unwrap();
    let stale = |pid: u32, port: u16| {
        let d = run.join(format!("console-{pid}"));
        std::fs::create_dir(&d).unwrap();
        std::fs::write(
            d.join("console.url"),
            format!("http://127.0.0.1:{port}/#token=00\n"),
        )
        .unwrap();
        d
    };
    let dead_dir = stale(dead, 1);
    // this test's own process: alive, but not an mcpbox with a console
    let reused_dir = stale(std::process::id(), 2);
    let out = std::process::Command::new(common::mcpbox())
        .args(["approvals", "list"])
        .env("XDG_RUNTIME_DIR", c.ws.path().join("run"))
        .env("MCPBOX_STATE_DIR", c.ws.path().join("state"))
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(text.contains(&format!("console: {}", c.url)), "{text}");
    assert!(
        !text.contains("127.0.0.1:1/"),
        "a dead console is listed: {text}"
    );
    assert!(
        !text.contains("127.0.0.1:2/"),
        "a reused pid is listed: {text}"
    );
    assert!(!dead_dir.exists(), "a dead console's directory is kept");
    assert!(
        reused_dir.exists(),
        "a live process's directory was removed"
    );
}

#[test]
fn console_without_the_token_gets_401_and_no_data() {
    let c = Console::start();
    for path in [
        "/api/approvals",
        "/api/sandboxes",
        "/api/audit",
        "/api/audit/verify",
        "/api/pins",
        "/api/info",
    ] {
        let zeros = format!("Bearer {}", "0".repeat(64));
        for auth in [None, Some("Bearer 00"), Some(zeros.as_str())] {
            let h: Vec<(&str, &str)> = auth.iter().map(|a| ("Authorization", *a)).collect();
            let r = request(c.port, "GET", path, &h, "");
            assert_eq!(r.status, 401, "{path} {auth:?}: {}", r.body);
            assert!(!r.body.contains("records") && !r.body.contains("approvals\""));
        }
    }
    let cookie = format!("mcpbox_console_{}=nope", c.port);
    let r = request(c.port, "GET", "/api/audit", &[("Cookie", &cookie)], "");
    assert_eq!(r.status, 401);
}

impl Console {
    /// Sends a `tools/call` of `echo` (under `approve`, held) without
    /// waiting, and returns the id of the approval the console shows.
    fn held_call(&mut self, id: u64, text: &str) -> String {
        self.session.send(&json!({
            "jsonrpc": "2.0", "id": id, "method": "tools/call",
            "params": {"name": "echo", "arguments": {"text": text}}
        }));
        let until = Instant::now() + Duration::from_secs(20);
        loop {
            let a: Value = serde_json::from_str(&self.get("/api/approvals").body).unwrap();
            if let Some(v) = a["approvals"].as_array().and_then(|l| l.first()) {
                assert_eq!(v["tool"], "echo", "{v}");
                assert_eq!(v["state"], "pending", "{v}");
                return v["id"].as_str().unwrap().to_string();
            }
            assert!(
                Instant::now() < until,
                "no approval appeared; stderr: {}",
                self.session.stderr()
            );
            std::thread::sleep(Duration::from_millis(100));
        }
    }

    /// The response to request `id` (other messages skipped).
    fn response(&mut self, id: u64) -> Value {
        loop {
            let msg = self.session.recv();
            if msg.get("id") == Some(&json!(id)) {
                return msg;
            }
        }
    }

    fn pending(&self) -> usize {
        let a: Value = serde_json::from_str(&self.get("/api/approvals").body).unwrap();
        a["approvals"].as_array().unwrap().len()
    }
}

#[test]
fn console_post_from_another_origin_is_refused() {
    let mut c = Console::start();
    let id = c.held_call(7, "hello through the console");
    let approve = format!("/api/approvals/{id}/approve");
    for origin in [
        "http://evil.example".to_string(),
        "null".to_string(),
        format!("http://127.0.0.1:{}", c.port + 1),
        format!("https://127.0.0.1:{}", c.port),
    ] {
        let r = request(
            c.port,
            "POST",
            &approve,
            &[("Authorization", &c.bearer()), ("Origin", &origin)],
            r#"{"scope":"once"}"#,
        );
        assert_eq!(r.status, 403, "{origin}: {}", r.body);
    }
    // the right Origin with a cross-site fetch (a form on another site)
    let r = request(
        c.port,
        "POST",
        &approve,
        &[
            ("Authorization", &c.bearer()),
            ("Origin", &c.origin()),
            ("Sec-Fetch-Site", "cross-site"),
        ],
        r#"{"scope":"once"}"#,
    );
    assert_eq!(r.status, 403, "{}", r.body);
    assert_eq!(c.pending(), 1, "the approval is still pending");
    // the console's own page may: the held call completes
    let r = request(
        c.port,
        "POST",
        &approve,
        &[("Authorization", &c.bearer()), ("Origin", &c.origin())],
        r#"{"scope":"once"}"#,
    );
    assert_eq!(r.status, 200, "{}", r.body);
    let answer = c.response(7);
    assert_eq!(
        common::mcp::result_text(&answer),
        "hello through the console",
        "{answer}"
    );
    assert_eq!(c.pending(), 0);
}

#[test]
fn console_deny_refuses_the_held_call() {
    let mut c = Console::start();
    let id = c.held_call(8, "never echoed");
    let r = request(
        c.port,
        "POST",
        &format!("/api/approvals/{id}/deny"),
        &[("Authorization", &c.bearer()), ("Origin", &c.origin())],
        "",
    );
    assert_eq!(r.status, 200, "{}", r.body);
    let answer = c.response(8);
    assert_ne!(
        common::mcp::result_text(&answer),
        "never echoed",
        "{answer}"
    );
    assert!(
        answer.get("error").is_some() || answer["result"]["isError"] == true,
        "{answer}"
    );
    // audited: requested, then denied by the console
    let events = common::audit::events(&c.ws.path().join("audit.db"));
    let denied = events.iter().find(|e| {
        e["kind"] == "approval"
            && e["detail"]["action"] == "denied"
            && e["detail"]["by"] == "console"
    });
    assert!(denied.is_some(), "{events:?}");
}

#[test]
fn console_post_without_an_origin_is_refused() {
    let c = Console::start();
    for path in [
        "/api/approvals/ap-000000000000/deny",
        "/login",
        "/api/pins/accept",
    ] {
        let r = request(
            c.port,
            "POST",
            path,
            &[("Authorization", &c.bearer())],
            &json!({"token": c.token, "id": "x"}).to_string(),
        );
        assert_eq!(r.status, 403, "{path}: {}", r.body);
    }
}

#[test]
fn console_with_a_rebound_host_is_refused() {
    let c = Console::start();
    for host in [
        "attacker.example".to_string(),
        format!("attacker.example:{}", c.port),
        "127.0.0.1".to_string(),
        format!("127.0.0.1:{}", c.port + 1),
    ] {
        for path in ["/", "/api/approvals"] {
            let r = request(
                c.port,
                "GET",
                path,
                &[("Host", &host), ("Authorization", &c.bearer())],
                "",
            );
            assert_eq!(r.status, 421, "{host} {path}");
        }
    }
}

#[test]
fn console_pages_and_apis_answer_with_the_token() {
    let c = Console::start();
    for host in ["127.0.0.1", "localhost"] {
        let h = format!("{host}:{}", c.port);
        let r = request(c.port, "GET", "/", &[("Host", &h)], "");
        assert_eq!(r.status, 200);
        assert!(r.body.contains("<script src=\"/console.js\""));
    }
    for path in ["/console.js", "/console.css"] {
        assert_eq!(c.get(path).status, 200, "{path}");
    }
    let info: Value = serde_json::from_str(&c.get("/api/info").body).unwrap();
    assert_eq!(info["mode"], "run");
    let a: Value = serde_json::from_str(&c.get("/api/approvals").body).unwrap();
    assert!(a["approvals"].is_array() && a["version"].is_u64(), "{a}");
    let s: Value = serde_json::from_str(&c.get("/api/sandboxes").body).unwrap();
    assert_eq!(s["available"], false, "run has no sandboxes to manage: {s}");
    assert!(s["why"].as_str().unwrap().contains("mcpbox run"));
    let au: Value = serde_json::from_str(&c.get("/api/audit?kind=session_start").body).unwrap();
    assert!(
        au["records"]
            .as_array()
            .unwrap()
            .iter()
            .any(|r| r["event"]["kind"] == "session_start"),
        "{au}"
    );
    let v: Value = serde_json::from_str(&c.get("/api/audit/verify").body).unwrap();
    assert_eq!(v["status"], "intact", "{v}");
    let p = c.get("/api/pins");
    assert_eq!(p.status, 200, "{}", p.body);
    let bad = c.get("/api/audit?decision=maybe");
    assert_eq!(bad.status, 400);
}

#[test]
fn console_on_a_non_loopback_address_is_refused() {
    let ws = Workspace::with_server("plain");
    let p = policy(&ws, "");
    let state = ws.path().join("state");
    for addr in ["0.0.0.0:0", "[::]:0"] {
        let out = std::process::Command::new(common::mcpbox())
            .args(["run", &format!("--console={addr}"), "--policy"])
            .arg(&p)
            .args(["--", "/workspace/input/plain"])
            .env("MCPBOX_STATE_DIR", &state)
            .stdin(std::process::Stdio::null())
            .output()
            .unwrap();
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(!out.status.success(), "{addr}: {err}");
        assert!(err.contains("not a loopback address"), "{addr}: {err}");
    }
}

/// Python inside the sandbox trying the console's port: directly, and
/// through the egress proxy with CONNECT and with a plain GET, by address
/// and by name.
const REACH: &str = r#"
import os, socket, sys
port = int(sys.argv[1])
def direct(host):
    try:
        socket.create_connection((host, port), timeout=3).close(); print("REACHED direct", host)
    except OSError as e:
        print("refused direct", host, type(e).__name__)
proxy = os.environ.get("HTTP_PROXY") or os.environ.get("http_proxy")
print("proxy", proxy)
def via_proxy(line):
    host, _, pport = proxy.split("//")[1].rstrip("/").rpartition(":")
    try:
        s = socket.create_connection((host, int(pport)), timeout=5)
        s.sendall(line.encode())
        answer = s.recv(200).decode(errors="replace").split("\r\n")[0]
        print("proxy answered", repr(line.split("\r\n")[0]), answer)
    except OSError as e:
        print("proxy refused", type(e).__name__)
for h in ["127.0.0.1", "localhost", "::1"]:
    direct(h)
for target in ["127.0.0.1", "localhost", "[::1]"]:
    via_proxy(f"CONNECT {target}:{port} HTTP/1.1\r\nHost: {target}:{port}\r\n\r\n")
    via_proxy(f"GET http://{target}:{port}/api/approvals HTTP/1.1\r\nHost: {target}:{port}\r\n\r\n")
"#;

fn exec_reach(ws: &Workspace, policy: &Path, port: u16) -> String {
    let out = std::process::Command::new(common::mcpbox())
        .args(["exec", "--policy", policy.to_str().unwrap(), "--"])
        .args(["python3", "-c", REACH, &port.to_string()])
        .env("MCPBOX_STATE_DIR", ws.path().join("state"))
        .stdin(std::process::Stdio::null())
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
    assert!(
        out.status.success(),
        "{stdout}\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    stdout
}

#[test]
fn sandboxed_code_cannot_reach_the_console() {
    let c = Console::start();
    // the policy even lists the console's address: loopback is refused
    // after resolution whatever the allowlist says
    let ws = Workspace::new();
    let p = ws.policy(&format!(
        "[audit]\npath = \"audit.db\"\n[network]\nallow = [\"127.0.0.1:{0}\", \"localhost:{0}\", \"[::1]:{0}\"]\n",
        c.port
    ));
    let out = exec_reach(&ws, &p, c.port);
    assert!(!out.contains("REACHED"), "{out}");
    assert_eq!(out.matches("refused direct").count(), 3, "{out}");
    assert!(
        out.contains("proxy http://"),
        "the proxy was not set up: {out}"
    );
    let answers: Vec<&str> = out
        .lines()
        .filter(|l| l.starts_with("proxy answered"))
        .collect();
    assert_eq!(answers.len(), 6, "{out}");
    for a in answers {
        // the status line after the request line (whose port may hold
        // "401" or " 200 " by chance)
        let status = a.rsplit_once("' ").map_or(a, |(_, s)| s);
        assert!(!status.contains(" 200 ") && !status.contains(" 401"), "{a}");
        assert!(status.contains(" 403 ") || status.contains(" 400 "), "{a}");
    }
    // the console saw none of it: still fine, and nothing answered
    assert_eq!(c.get("/api/approvals").status, 200);
}

/// Another local user's attack on the console's connections, in Python so
/// that the same program runs as any user: `N` connections, a quarter
/// each idle, sending a head one byte at a time (slowloris), sending a
/// request without the token, and one with a wrong token, each reopened
/// as soon as the console closes it, until stdin ends. It prints
/// `holding N` once they are open, and at the end how many answers it got
/// and how many of them said `Connection: close` and were followed by
/// the connection's end.
const HOLD: &str = r#"
import os, socket, sys, threading, time
port, n = int(sys.argv[1]), int(sys.argv[2])
head = f"GET /api/approvals HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\n"
first = [b"", b"G", (head + "\r\n").encode(), (head + "Authorization: Bearer " + "0" * 64 + "\r\n\r\n").encode()]
stats = {"opened": 0, "answers": 0, "closing_answers": 0, "closed": 0}
def open_one(kind):
    s = socket.socket()
    s.settimeout(5)
    try:
        s.connect(("127.0.0.1", port))
        s.sendall(first[kind])
    except OSError:
        s.close()
        return None
    s.setblocking(False)
    stats["opened"] += 1
    return [kind, s, b""]
conns = [c for c in (open_one(i % 4) for i in range(n)) if c]
print("holding", len(conns), os.getuid(), flush=True)
stop = threading.Event()
threading.Thread(target=lambda: (sys.stdin.read(), stop.set()), daemon=True).start()
# Once told to stop, it keeps watching until it has seen a connection
# closed, or 15 s: the console closes a pending connection at the latest
# after PENDING_TIME (5 s), and on a loaded machine the owner can be done
# before the attacker's loop saw the first close (a CI run once stopped
# with 0 closed). The assertions stay the same.
grace_end = None
while True:
    if stop.is_set():
        if grace_end is None:
            grace_end = time.monotonic() + 15
        if stats["closed"] > 0 or time.monotonic() > grace_end:
            break
    for c in conns:
        kind, s, got = c
        closed = False
        try:
            while True:
                d = s.recv(65536)
                if not d:
                    closed = True
                    break
                c[2] = got = got + d
        except BlockingIOError:
            pass
        except OSError:
            closed = True
        if not closed and kind == 1:
            try:
                s.send(b"E")
            except OSError:
                closed = True
        if closed:
            stats["closed"] += 1
            if got:
                stats["answers"] += 1
                if b"connection: close" in got.lower():
                    stats["closing_answers"] += 1
            s.close()
            fresh = open_one(kind)
            if fresh:
                c[:] = fresh
    time.sleep(0.05)
print("stats", stats["opened"], stats["answers"], stats["closing_answers"], stats["closed"], flush=True)
"#;

/// The attacker above, started with `wrap` in front of `python3` (e.g.
/// `runuser -u USER --`), once it holds its connections.
struct Attacker {
    child: std::process::Child,
    /// The uid it runs as.
    uid: u32,
    out: std::io::BufReader<std::process::ChildStdout>,
}

impl Attacker {
    fn start(wrap: &[&str], port: u16, n: usize) -> Attacker {
        use std::io::BufRead;
        let mut argv: Vec<String> = wrap.iter().map(|s| s.to_string()).collect();
        argv.extend(["python3", "-c", HOLD].map(String::from));
        argv.extend([port.to_string(), n.to_string()]);
        let mut child = std::process::Command::new(&argv[0])
            .args(&argv[1..])
            .stdin(std::process::Stdio::piped())
            .stdout(std::process::Stdio::piped())
            .spawn()
            .unwrap();
        let mut out = std::io::BufReader::new(child.stdout.take().unwrap());
        let mut line = String::new();
        out.read_line(&mut line).unwrap();
        let words: Vec<&str> = line
            .strip_prefix("holding ")
            .unwrap_or_else(|| panic!("the attacker did not start: {line:?}"))
            .split_whitespace()
            .collect();
        let held: usize = words[0].parse().unwrap();
        assert_eq!(held, n, "every attacking connection was accepted");
        let uid = words[1].parse().unwrap();
        Attacker { child, uid, out }
    }

    /// Stops it: (opened, answers, answers that said close, closed).
    fn stop(mut self) -> [u64; 4] {
        use std::io::BufRead;
        drop(self.child.stdin.take());
        let mut line = String::new();
        self.out.read_line(&mut line).unwrap();
        let _ = self.child.wait();
        let v: Vec<u64> = line
            .strip_prefix("stats ")
            .unwrap_or_else(|| panic!("no stats: {line:?}"))
            .split_whitespace()
            .map(|x| x.parse().unwrap())
            .collect();
        [v[0], v[1], v[2], v[3]]
    }
}

/// While connections without the token are held (more than the console
/// has places for), the owner lists the approvals, approves a held call,
/// and the call completes.
fn owner_approves_while(attacker: Attacker, c: &mut Console, id: u64) {
    let approval = c.held_call(id, "approved despite the crowd");
    let r = request(
        c.port,
        "POST",
        &format!("/api/approvals/{approval}/approve"),
        &[("Authorization", &c.bearer()), ("Origin", &c.origin())],
        r#"{"scope":"once"}"#,
    );
    assert_eq!(r.status, 200, "{}", r.body);
    let answer = c.response(id);
    assert_eq!(
        common::mcp::result_text(&answer),
        "approved despite the crowd",
        "{answer}"
    );
    // the owner can still read the API, again and again
    for _ in 0..20 {
        assert_eq!(c.get("/api/approvals").status, 200);
    }
    let [opened, answers, closing, closed] = attacker.stop();
    eprintln!("attacker: {opened} opened, {answers} answered, {closing} of them with close, {closed} closed");
    // the console closed the attacker's connections, not only answered
    // them: with the answer when there was one, and that answer said so
    assert!(closed > 0, "no attacking connection was closed");
    assert!(opened > 100, "{opened}");
    assert_eq!(
        answers, closing,
        "an answer without the token kept its connection open"
    );
}

#[test]
fn connections_without_the_token_cannot_lock_the_owner_out_of_the_console() {
    let mut c = Console::start();
    let attacker = Attacker::start(&[], c.port, 200);
    owner_approves_while(attacker, &mut c, 11);
}

/// The local user the console's lockout test runs as (created when
/// missing; an existing one is used).
const LOCAL_USER: &str = "mcpbox-lockout";

#[test]
fn another_local_user_cannot_lock_the_owner_out_of_the_console() {
    if !common::is_root() {
        eprintln!("skipped: creating another local user needs root");
        return;
    }
    let made = std::process::Command::new("useradd")
        .args([
            "--system",
            "--no-create-home",
            "--shell",
            "/usr/sbin/nologin",
            LOCAL_USER,
        ])
        .output()
        .unwrap();
    // 9: the user exists already
    assert!(
        made.status.success() || made.status.code() == Some(9),
        "useradd: {}",
        String::from_utf8_lossy(&made.stderr)
    );
    let mut c = Console::start();
    let attacker = Attacker::start(&["runuser", "-u", LOCAL_USER, "--"], c.port, 200);
    assert_ne!(attacker.uid, 0, "the attacker runs as another user");
    owner_approves_while(attacker, &mut c, 12);
}
