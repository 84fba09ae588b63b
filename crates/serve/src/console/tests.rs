//! The console in-process, over a real socket, against a broker with a
//! held ask: the approve/deny flow and the request checks. The same
//! attacks run through the real binary in tests/console.rs.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::io::{Read, Write};
use std::net::TcpStream;
use std::sync::mpsc;
use std::sync::Arc;
use std::time::{Duration, SystemTime};

use mcpbox_audit::MemorySink;
use mcpbox_gateway::broker::{Answer, Ask, Asked, Binding, Broker, Scope, Subject};
use mcpbox_policy::{Decision, Reason};
use serde_json::{json, Value};

use super::{start, Parts, Running};

struct Fixture {
    console: Running,
    _state: tempfile::TempDir,
    broker: Arc<Broker>,
    port: u16,
    token: String,
}

fn fixture() -> Fixture {
    let broker = Broker::new(Arc::new(MemorySink::new()));
    let state = tempfile::tempdir().unwrap();
    let console = start(
        "127.0.0.1:0".parse().unwrap(),
        Parts {
            broker: broker.clone(),
            control: None,
            audit_dbs: vec![state.path().join("audit.db")],
            state_dir: state.path().to_path_buf(),
            pin_audit: Vec::new(),
            mode: "run",
        },
    )
    .unwrap();
    let url = console.url().to_string();
    let port: u16 = url
        .trim_start_matches("http://127.0.0.1:")
        .split('/')
        .next()
        .unwrap()
        .parse()
        .unwrap();
    let token = url.split("#token=").nth(1).unwrap().to_string();
    Fixture {
        console,
        _state: state,
        broker,
        port,
        token,
    }
}

/// A held ask whose answer arrives on the returned channel.
fn hold(broker: &Broker, id: &str, preview: Value) -> mpsc::Receiver<Answer> {
    let (tx, rx) = mpsc::channel();
    let asked = broker.ask(
        Ask {
            id: id.into(),
            session: "s-1".into(),
            sandbox_id: String::new(),
            binding: Binding {
                caller: "host".into(),
                server: "fs".into(),
                tool: "delete".into(),
                args_digest: "d".into(),
                policy_version: "p".into(),
            },
            subject: Subject::Call { bytes: None },
            rule: Decision::approve(Reason::ToolRule, "policy:tools.delete"),
            preview,
            expires: SystemTime::now() + Duration::from_secs(60),
            hold: true,
            elicitation: false,
            answered: None,
        },
        Box::new(move |a| {
            let _ = tx.send(a);
        }),
    );
    assert_eq!(asked, Asked::Held);
    rx
}

struct Reply {
    status: u16,
    head: String,
    body: String,
}

impl Reply {
    fn json(&self) -> Value {
        serde_json::from_str(&self.body).unwrap_or(Value::Null)
    }
}

fn request(port: u16, method: &str, path: &str, headers: &[(&str, &str)], body: &str) -> Reply {
    let mut s = TcpStream::connect(("127.0.0.1", port)).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(40))).unwrap();
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
    let status = head
        .split(' ')
        .nth(1)
        .and_then(|c| c.parse().ok())
        .unwrap_or(0);
    Reply {
        status,
        head: head.to_string(),
        body: body.to_string(),
    }
}

impl Fixture {
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
    fn post(&self, path: &str, body: &str) -> Reply {
        request(
            self.port,
            "POST",
            path,
            &[
                ("Authorization", &self.bearer()),
                ("Origin", &self.origin()),
            ],
            body,
        )
    }
}

#[test]
fn allow_once_from_the_console_reaches_the_held_call() {
    let f = fixture();
    let rx = hold(&f.broker, "ap-000000000001", json!({"path": "/x"}));
    let list = f.get("/api/approvals").json();
    assert_eq!(list["approvals"][0]["id"], "ap-000000000001");
    assert_eq!(list["approvals"][0]["tool"], "delete");
    let r = f.post(
        "/api/approvals/ap-000000000001/approve",
        r#"{"scope":"once"}"#,
    );
    assert_eq!(r.status, 200, "{}", r.body);
    assert_eq!(
        rx.recv_timeout(Duration::from_secs(5)).unwrap(),
        Answer::Approved {
            by: "console".into(),
            scope: Scope::Once
        }
    );
    assert!(f.broker.list().is_empty());
    drop(f.console);
}

#[test]
fn deny_from_the_console_reaches_the_held_call() {
    let f = fixture();
    let rx = hold(&f.broker, "ap-000000000002", json!({}));
    let r = f.post("/api/approvals/ap-000000000002/deny", "");
    assert_eq!(r.status, 200, "{}", r.body);
    assert_eq!(
        rx.recv_timeout(Duration::from_secs(5)).unwrap(),
        Answer::Denied {
            by: "console".into()
        }
    );
}

#[test]
fn a_long_poll_returns_when_an_approval_arrives() {
    let f = fixture();
    let v = f.get("/api/approvals").json()["version"].as_u64().unwrap();
    let port = f.port;
    let bearer = f.bearer();
    let t = std::thread::spawn(move || {
        request(
            port,
            "GET",
            &format!("/api/approvals?since={v}"),
            &[("Authorization", &bearer)],
            "",
        )
    });
    std::thread::sleep(Duration::from_millis(300));
    let _rx = hold(&f.broker, "ap-000000000003", json!({}));
    let r = t.join().unwrap().json();
    assert_eq!(r["approvals"][0]["id"], "ap-000000000003");
    assert!(r["version"].as_u64().unwrap() > v);
}

#[test]
fn console_post_from_another_origin_is_refused() {
    let f = fixture();
    let _rx = hold(&f.broker, "ap-000000000004", json!({}));
    for origin in ["http://evil.example", "null", "http://127.0.0.1:1"] {
        let r = request(
            f.port,
            "POST",
            "/api/approvals/ap-000000000004/approve",
            &[("Authorization", &f.bearer()), ("Origin", origin)],
            r#"{"scope":"once"}"#,
        );
        assert_eq!(r.status, 403, "{origin}: {}", r.body);
    }
    let r = request(
        f.port,
        "POST",
        "/api/approvals/ap-000000000004/deny",
        &[("Authorization", &f.bearer())],
        "",
    );
    assert_eq!(r.status, 403, "no Origin: {}", r.body);
    let r = request(
        f.port,
        "POST",
        "/api/approvals/ap-000000000004/deny",
        &[
            ("Authorization", &f.bearer()),
            ("Origin", &f.origin()),
            ("Sec-Fetch-Site", "cross-site"),
        ],
        "",
    );
    assert_eq!(r.status, 403, "cross-site: {}", r.body);
    assert_eq!(f.broker.list().len(), 1, "the approval is still pending");
}

#[test]
fn console_without_the_token_gets_401_and_no_data() {
    let f = fixture();
    let _rx = hold(&f.broker, "ap-000000000005", json!({"secret-ish": "x"}));
    for auth in [None, Some("Bearer nope"), Some("Basic abc")] {
        let headers: Vec<(&str, &str)> = auth.iter().map(|a| ("Authorization", *a)).collect();
        let r = request(f.port, "GET", "/api/approvals", &headers, "");
        assert_eq!(r.status, 401);
        assert!(!r.body.contains("ap-000000000005"));
    }
    let wrong_cookie = format!("mcpbox_console_{}=0000", f.port);
    let r = request(
        f.port,
        "GET",
        "/api/approvals",
        &[("Cookie", &wrong_cookie)],
        "",
    );
    assert_eq!(r.status, 401);
}

#[test]
fn console_login_sets_a_strict_httponly_cookie_that_works() {
    let f = fixture();
    let r = request(
        f.port,
        "POST",
        "/login",
        &[("Origin", &f.origin())],
        &json!({"token": f.token}).to_string(),
    );
    assert_eq!(r.status, 200, "{}", r.body);
    let cookie_line = r
        .head
        .lines()
        .find(|l| l.to_ascii_lowercase().starts_with("set-cookie:"))
        .unwrap();
    assert!(cookie_line.contains("HttpOnly"));
    assert!(cookie_line.contains("SameSite=Strict"));
    let cookie = cookie_line
        .split_once(':')
        .unwrap()
        .1
        .split(';')
        .next()
        .unwrap()
        .trim()
        .to_string();
    let r = request(f.port, "GET", "/api/approvals", &[("Cookie", &cookie)], "");
    assert_eq!(r.status, 200);
    let r = request(
        f.port,
        "POST",
        "/login",
        &[("Origin", &f.origin())],
        r#"{"token":"wrong"}"#,
    );
    assert_eq!(r.status, 401);
}

#[test]
fn console_with_a_rebound_host_is_refused() {
    let f = fixture();
    for host in [
        "evil.example",
        "evil.example:80",
        "127.0.0.1",
        "127.0.0.2:1",
    ] {
        let r = request(
            f.port,
            "GET",
            "/api/approvals",
            &[("Host", host), ("Authorization", &f.bearer())],
            "",
        );
        assert_eq!(r.status, 421, "{host}");
    }
    let r = request(
        f.port,
        "GET",
        "/",
        &[("Host", &format!("localhost:{}", f.port))],
        "",
    );
    assert_eq!(r.status, 200);
}

#[test]
fn console_refuses_a_non_loopback_address() {
    let broker = Broker::new(Arc::new(MemorySink::new()));
    let err = start(
        "0.0.0.0:0".parse().unwrap(),
        Parts {
            broker,
            control: None,
            audit_dbs: Vec::new(),
            state_dir: std::env::temp_dir(),
            pin_audit: Vec::new(),
            mode: "run",
        },
    )
    .err()
    .unwrap();
    assert!(err.to_string().contains("not a loopback address"), "{err}");
}

#[test]
fn console_pages_carry_the_security_headers_and_no_inline_script() {
    let f = fixture();
    let r = request(f.port, "GET", "/", &[], "");
    assert_eq!(r.status, 200);
    let head = r.head.to_ascii_lowercase();
    for h in [
        "content-security-policy: default-src 'self'",
        "frame-ancestors 'none'",
        "x-content-type-options: nosniff",
        "referrer-policy: no-referrer",
        "cache-control: no-store",
    ] {
        assert!(head.contains(h), "missing {h} in {head}");
    }
    assert!(!r.body.contains("<script>"), "inline script in the page");
    let script = super::http::tests_script();
    for sink in [
        ".innerHTML",
        ".outerHTML",
        "insertAdjacentHTML",
        "document.write",
        "eval(",
    ] {
        assert!(!script.contains(sink), "console.js uses {sink}");
    }
}

#[test]
fn console_bad_json_and_big_bodies_are_refused() {
    let f = fixture();
    let _rx = hold(&f.broker, "ap-000000000006", json!({}));
    let r = f.post("/api/approvals/ap-000000000006/approve", "{nope");
    assert_eq!(r.status, 400);
    let r = f.post(
        "/api/approvals/ap-000000000006/approve",
        r#"{"scope":"forever"}"#,
    );
    assert_eq!(r.status, 400);
    let big = format!(r#"{{"scope":"once","x":"{}"}}"#, "a".repeat(100_000));
    let r = f.post("/api/approvals/ap-000000000006/approve", &big);
    assert_eq!(r.status, 413);
    assert_eq!(f.broker.list().len(), 1);
    let r = f.post("/api/approvals/ap-00000000000z/deny", "");
    assert_eq!(r.status, 400);
    let r = f.post("/api/approvals/ap-0000000000ff/deny", "");
    assert_eq!(r.status, 404);
}

#[test]
fn console_get_never_changes_anything() {
    let f = fixture();
    let _rx = hold(&f.broker, "ap-000000000007", json!({}));
    let r = f.get("/api/approvals/ap-000000000007/approve");
    assert_eq!(r.status, 404);
    assert_eq!(f.broker.list().len(), 1);
}

#[test]
fn console_connections_without_the_token_never_lock_the_owner_out() {
    let f = fixture();
    // idle connections, more than both pools hold
    let mut held: Vec<TcpStream> = (0..super::MAX_PENDING + super::MAX_CONNECTIONS)
        .map(|_| TcpStream::connect(("127.0.0.1", f.port)).unwrap())
        .collect();
    // the owner is served meanwhile
    assert_eq!(f.get("/api/approvals").status, 200);
    // the oldest idle ones were closed to make room
    let first = &mut held[0];
    first
        .set_read_timeout(Some(Duration::from_secs(5)))
        .unwrap();
    let mut buf = [0u8; 16];
    assert_eq!(first.read(&mut buf).unwrap_or(0), 0, "still open");
}

#[test]
fn console_answers_a_request_without_the_token_and_closes_its_connection() {
    let f = fixture();
    for path in ["/api/approvals", "/"] {
        let mut s = TcpStream::connect(("127.0.0.1", f.port)).unwrap();
        s.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
        // keep-alive asked for; the answer closes anyway
        let req = format!("GET {path} HTTP/1.1\r\nHost: 127.0.0.1:{}\r\n\r\n", f.port);
        s.write_all(req.as_bytes()).unwrap();
        let mut out = Vec::new();
        let _ = s.read_to_end(&mut out);
        let text = String::from_utf8_lossy(&out).to_ascii_lowercase();
        assert!(text.contains("connection: close"), "{path}: {text}");
    }
    // with the token, the connection stays open for the next request
    let mut s = TcpStream::connect(("127.0.0.1", f.port)).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
    let req = format!(
        "GET /api/info HTTP/1.1\r\nHost: 127.0.0.1:{}\r\nAuthorization: Bearer {}\r\n\r\n",
        f.port, f.token
    );
    for _ in 0..2 {
        s.write_all(req.as_bytes()).unwrap();
        let mut buf = [0u8; 4096];
        let n = s.read(&mut buf).unwrap();
        let text = String::from_utf8_lossy(&buf[..n]).to_ascii_lowercase();
        assert!(text.starts_with("http/1.1 200"), "{text}");
        assert!(!text.contains("connection: close"), "{text}");
    }
}
