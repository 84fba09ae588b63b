//! `mcpbox serve` over TLS, and in front of remote upstreams: the real
//! binary, a stand-in upstream MCP server on 127.0.0.1 and curl as the
//! client. Loopback only.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use crate::common;

use std::io::{BufRead, BufReader, Read, Write};
use std::net::{TcpListener, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use serde_json::{json, Value};

const SECRET: &str = "up-s3cr3t-7f3a9c2e5b1d";
const CLIENT_TOKEN: &str = "alice-token-0123456789";

/// One request the stand-in upstream saw: method, headers (names
/// lowercased), body.
type Request = (String, Vec<(String, String)>, String);
type Seen = Mutex<Vec<Request>>;

/// The stand-in upstream: a Streamable HTTP MCP server on 127.0.0.1 that
/// refuses requests without the credential, and puts the credential in a
/// result, an error message and a response header.
struct Upstream {
    port: u16,
    /// Every request: (method, headers lowercased, body).
    seen: Arc<Seen>,
}

impl Upstream {
    fn start() -> Upstream {
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let port = listener.local_addr().unwrap().port();
        let seen: Arc<Mutex<Vec<_>>> = Arc::default();
        let s2 = seen.clone();
        std::thread::spawn(move || {
            for conn in listener.incoming().flatten() {
                let seen = s2.clone();
                std::thread::spawn(move || serve_upstream(conn, &seen));
            }
        });
        Upstream { port, seen }
    }

    fn seen(&self) -> Vec<Request> {
        self.seen.lock().unwrap().clone()
    }
}

fn serve_upstream(conn: TcpStream, seen: &Seen) {
    let mut r = BufReader::new(conn.try_clone().unwrap());
    let mut w = conn;
    loop {
        let mut line = String::new();
        if r.read_line(&mut line).unwrap_or(0) == 0 {
            return;
        }
        let method = line.split(' ').next().unwrap_or("").to_string();
        let mut headers = Vec::new();
        loop {
            let mut h = String::new();
            r.read_line(&mut h).unwrap();
            let h = h.trim_end();
            if h.is_empty() {
                break;
            }
            let (k, v) = h.split_once(':').unwrap();
            headers.push((k.trim().to_ascii_lowercase(), v.trim().to_string()));
        }
        let header = |k: &str| headers.iter().find(|(n, _)| n == k).map(|(_, v)| v.clone());
        let len: usize = header("content-length").map_or(0, |v| v.parse().unwrap());
        let mut body = vec![0; len];
        r.read_exact(&mut body).unwrap();
        let body = String::from_utf8(body).unwrap();
        seen.lock()
            .unwrap()
            .push((method.clone(), headers.clone(), body.clone()));
        let respond = |w: &mut TcpStream, status: &str, extra: &str, ctype: &str, body: &str| {
            let _ = write!(
                w,
                "HTTP/1.1 {status}\r\ncontent-type: {ctype}\r\ncontent-length: {}\r\nx-upstream-token: {SECRET}\r\nset-cookie: up={SECRET}\r\n{extra}\r\n{body}",
                body.len()
            );
        };
        if header("authorization").as_deref() != Some(&format!("Bearer {SECRET}")) {
            respond(
                &mut w,
                "401 Unauthorized",
                "",
                "text/plain",
                &format!("bad token, want {SECRET}"),
            );
            continue;
        }
        match method.as_str() {
            "GET" => {
                respond(&mut w, "405 Method Not Allowed", "", "text/plain", "");
                continue;
            }
            "DELETE" => {
                respond(&mut w, "200 OK", "", "text/plain", "");
                continue;
            }
            _ => {}
        }
        let msg: Value = serde_json::from_str(&body).unwrap();
        let id = msg.get("id").cloned();
        let m = msg["method"].as_str().unwrap_or("");
        let Some(id) = id.filter(|_| !m.is_empty()) else {
            respond(&mut w, "202 Accepted", "", "text/plain", "");
            continue;
        };
        let session_ok = header("mcp-session-id").as_deref() == Some("up-session-1")
            && header("mcp-protocol-version").as_deref() == Some("2025-06-18");
        let answer = match m {
            "initialize" => {
                let a = json!({"jsonrpc":"2.0","id":id,"result":{
                    "protocolVersion":"2025-06-18","capabilities":{"tools":{}},
                    "serverInfo":{"name":"stand-in","version":"1"}}});
                respond(
                    &mut w,
                    "200 OK",
                    "mcp-session-id: up-session-1\r\n",
                    "application/json",
                    &a.to_string(),
                );
                continue;
            }
            _ if !session_ok => {
                respond(&mut w, "400 Bad Request", "", "text/plain", "no session");
                continue;
            }
            "tools/list" => json!({"jsonrpc":"2.0","id":id,"result":{"tools":[
                {"name":"echo","description":"Echoes.","inputSchema":{"type":"object"}},
                {"name":"leak","description":"Leaks.","inputSchema":{"type":"object"}},
                {"name":"fail","description":"Fails.","inputSchema":{"type":"object"}},
                {"name":"danger","description":"Dangerous.","inputSchema":{"type":"object"}}]}}),
            "tools/call" => match msg["params"]["name"].as_str().unwrap() {
                "echo" => {
                    let text = format!(
                        "echo: {}",
                        msg["params"]["arguments"]["message"].as_str().unwrap_or("")
                    );
                    json!({"jsonrpc":"2.0","id":id,"result":{"content":[{"type":"text","text":text}]}})
                }
                "leak" => {
                    json!({"jsonrpc":"2.0","id":id,"result":{"content":[{"type":"text","text":format!("the token is {SECRET}")}]}})
                }
                "fail" => {
                    json!({"jsonrpc":"2.0","id":id,"error":{"code":-32000,"message":format!("failed with token {SECRET}")}})
                }
                other => {
                    json!({"jsonrpc":"2.0","id":id,"result":{"content":[{"type":"text","text":format!("{other} ran")}]}})
                }
            },
            _ => json!({"jsonrpc":"2.0","id":id,"result":{}}),
        };
        // answers as an event stream, as SDK servers do
        let sse = format!("event: message\ndata: {answer}\n\n");
        respond(&mut w, "200 OK", "", "text/event-stream", &sse);
    }
}

/// A running `mcpbox serve`, its stderr collected.
struct Gateway {
    child: Child,
    url: String,
    log: Arc<Mutex<String>>,
    _dir: tempfile::TempDir,
    state: PathBuf,
}

impl Drop for Gateway {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn write(dir: &Path, name: &str, text: &str) -> PathBuf {
    let p = dir.join(name);
    std::fs::write(&p, text).unwrap();
    p
}

/// Starts `mcpbox serve` with `config` (and `files` beside it); `Err`
/// holds its stderr when it refuses to start.
fn gateway(config: &str, files: &[(&str, &str)]) -> Result<Gateway, String> {
    let dir = tempfile::tempdir().unwrap();
    for (name, text) in files {
        write(dir.path(), name, text);
    }
    let cfg = write(dir.path(), "serve.toml", config);
    let state = dir.path().join("state");
    let mut child = Command::new(common::mcpbox())
        .args(["serve", "--config"])
        .arg(&cfg)
        .env("MCPBOX_STATE_DIR", &state)
        .env("MCPBOX_LOG", "debug")
        .env("ALICE_TOKEN", CLIENT_TOKEN)
        .env("TEST_TICKETS_TOKEN", SECRET)
        // the wrong credential of the refusing-upstream test (given to the
        // gateway, never set in this process: the tests share it)
        .env("TEST_WRONG_TOKEN", "not-the-token-but-long")
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let stderr = child.stderr.take().unwrap();
    let log = Arc::new(Mutex::new(String::new()));
    let (tx, rx) = std::sync::mpsc::channel();
    let l2 = log.clone();
    std::thread::spawn(move || {
        let mut tx = Some(tx);
        for line in BufReader::new(stderr).lines() {
            let Ok(line) = line else { break };
            if let Some(u) = line.strip_prefix("mcpbox: serving on ") {
                if let Some(tx) = tx.take() {
                    let _ = tx.send(u.to_string());
                }
            }
            let mut l = l2.lock().unwrap();
            l.push_str(&line);
            l.push('\n');
        }
    });
    match rx.recv_timeout(Duration::from_secs(30)) {
        Ok(url) => Ok(Gateway {
            child,
            url,
            log,
            _dir: dir,
            state,
        }),
        Err(_) => {
            let _ = child.wait();
            std::thread::sleep(Duration::from_millis(100));
            let text = log.lock().unwrap().clone();
            Err(text)
        }
    }
}

/// One request with curl: (status, headers, body).
fn curl(url: &str, extra: &[&str], body: Option<&Value>) -> (u16, String, String) {
    let mut cmd = Command::new("curl");
    cmd.args(["-sS", "-i", "--max-time", "20"]);
    cmd.args(extra);
    if let Some(b) = body {
        cmd.args([
            "-X",
            "POST",
            "-H",
            "content-type: application/json",
            "--data-binary",
        ]);
        cmd.arg(b.to_string());
    }
    cmd.arg(url);
    let out = cmd.output().expect("curl (apt install curl)");
    let text = String::from_utf8_lossy(&out.stdout).into_owned();
    let Some((head, body)) = text.split_once("\r\n\r\n") else {
        return (
            0,
            String::from_utf8_lossy(&out.stderr).into_owned(),
            String::new(),
        );
    };
    let status = head
        .split(' ')
        .nth(1)
        .and_then(|s| s.parse().ok())
        .unwrap_or(0);
    (status, head.to_string(), body.to_string())
}

/// The JSON-RPC message of a JSON or SSE body (the last data event).
fn message(body: &str) -> Value {
    if let Ok(v) = serde_json::from_str(body) {
        return v;
    }
    let data = body
        .lines()
        .rev()
        .find_map(|l| l.strip_prefix("data:"))
        .unwrap_or_else(|| panic!("no message in {body:?}"));
    serde_json::from_str(data.trim()).unwrap()
}

/// An MCP client over curl.
struct Client<'a> {
    url: String,
    tls: Vec<&'a str>,
    session: Option<String>,
    id: u64,
    /// Every response head and body seen, for the leak checks.
    seen: String,
}

impl<'a> Client<'a> {
    fn new(gw: &Gateway, path: &str, tls: Vec<&'a str>) -> Client<'a> {
        Client {
            url: format!("{}{path}", gw.url),
            tls,
            session: None,
            id: 0,
            seen: String::new(),
        }
    }

    fn post(&mut self, msg: &Value) -> (u16, String, String) {
        let auth = format!("authorization: Bearer {CLIENT_TOKEN}");
        let sid = self.session.clone().map(|s| format!("mcp-session-id: {s}"));
        let mut args: Vec<&str> = self.tls.clone();
        args.extend([
            "-H",
            &auth,
            "-H",
            "accept: application/json, text/event-stream",
        ]);
        args.extend(["-H", "mcp-protocol-version: 2025-06-18"]);
        if let Some(s) = &sid {
            args.extend(["-H", s]);
        }
        let r = curl(&self.url, &args, Some(msg));
        self.seen.push_str(&r.1);
        self.seen.push_str(&r.2);
        r
    }

    fn request(&mut self, method: &str, params: Value) -> Value {
        self.id += 1;
        let (status, head, body) =
            self.post(&json!({"jsonrpc":"2.0","id":self.id,"method":method,"params":params}));
        assert_eq!(status, 200, "{method}: {head}\n{body}");
        message(&body)
    }

    fn initialize(&mut self) -> Value {
        self.id += 1;
        let (status, head, body) = self.post(&json!({"jsonrpc":"2.0","id":self.id,"method":"initialize","params":{
            "protocolVersion":"2025-06-18","capabilities":{},"clientInfo":{"name":"curl","version":"1"}}}));
        assert_eq!(status, 200, "initialize: {head}\n{body}");
        let sid = head
            .lines()
            .find_map(|l| {
                let (k, v) = l.split_once(':')?;
                k.eq_ignore_ascii_case("mcp-session-id")
                    .then(|| v.trim().to_string())
            })
            .expect("session id");
        self.session = Some(sid);
        let (status, _, _) =
            self.post(&json!({"jsonrpc":"2.0","method":"notifications/initialized"}));
        assert_eq!(status, 202);
        message(&body)
    }
}

fn text_of(resp: &Value) -> String {
    resp["result"]["content"][0]["text"]
        .as_str()
        .unwrap_or_default()
        .to_string()
}

// ---- TLS on the listener ----

/// A self-signed certificate for 127.0.0.1 and localhost, by the openssl CLI.
fn self_signed(dir: &Path) -> (PathBuf, PathBuf) {
    let (cert, key) = (dir.join("cert.pem"), dir.join("key.pem"));
    let out = Command::new("openssl")
        .args([
            "req",
            "-x509",
            "-newkey",
            "ec",
            "-pkeyopt",
            "ec_paramgen_curve:prime256v1",
            "-nodes",
            "-days",
            "2",
            "-subj",
            "/CN=127.0.0.1",
        ])
        .args(["-addext", "subjectAltName=IP:127.0.0.1,DNS:localhost"])
        .arg("-keyout")
        .arg(&key)
        .arg("-out")
        .arg(&cert)
        .output()
        .expect("openssl (apt install openssl)");
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    (cert, key)
}

fn remote_policy(port: u16, extra: &str) -> String {
    format!(
        "[secrets]\nTICKETS_TOKEN = {{ from_env = \"TEST_TICKETS_TOKEN\" }}\n\n[upstream]\nheader = \"Authorization\"\nvalue = \"Bearer ${{TICKETS_TOKEN}}\"\n\n[network]\nallow = [\"127.0.0.1:{port}\"]\n\n[tools]\ndanger = \"deny\"\n\n[audit]\npath = \"audit.db\"\n{extra}"
    )
}

fn remote_config(url: &str, listen: &str) -> String {
    format!(
        "[listen]\naddress = \"127.0.0.1:0\"\n{listen}\n[[clients]]\nname = \"alice\"\ntoken = {{ from_env = \"ALICE_TOKEN\" }}\n\n[[servers]]\nname = \"tickets\"\nurl = \"{url}\"\npolicy = \"tickets.toml\"\n"
    )
}

#[test]
fn tls_listener_serves_mcp_and_a_plain_http_request_does_not_hurt_it() {
    let certs = tempfile::tempdir().unwrap();
    let (cert, key) = self_signed(certs.path());
    let up = Upstream::start();
    let listen = format!(
        "tls = {{ cert = \"{}\", key = \"{}\" }}\n",
        cert.display(),
        key.display()
    );
    let gw = gateway(
        &remote_config(&format!("http://127.0.0.1:{}/mcp", up.port), &listen),
        &[("tickets.toml", &remote_policy(up.port, ""))],
    )
    .unwrap();
    assert!(gw.url.starts_with("https://127.0.0.1:"), "{}", gw.url);
    let cacert = cert.display().to_string();

    // plain HTTP to the TLS port: refused by the handshake, nothing served
    let plain = gw.url.replacen("https://", "http://", 1);
    let (status, _, _) = curl(
        &format!("{plain}/servers/tickets/mcp"),
        &[],
        Some(&json!({})),
    );
    assert_eq!(status, 0, "a plain request got an HTTP answer");
    // a client that does not trust the certificate gets no answer either
    let (status, _, _) = curl(
        &format!("{}/servers/tickets/mcp", gw.url),
        &[],
        Some(&json!({})),
    );
    assert_eq!(status, 0);

    let mut c = Client::new(&gw, "/servers/tickets/mcp", vec!["--cacert", &cacert]);
    let init = c.initialize();
    assert_eq!(init["result"]["serverInfo"]["name"], "stand-in", "{init}");
    let r = c.request(
        "tools/call",
        json!({"name":"echo","arguments":{"message":"over tls"}}),
    );
    assert_eq!(text_of(&r), "echo: over tls", "{r}");
    // ALPN: the gateway offers http/1.1 only
    let (status, head, _) = curl(
        &format!("{}/servers/tickets/mcp", gw.url),
        &[
            "--cacert",
            &cacert,
            "--http2",
            "-H",
            &format!("authorization: Bearer {CLIENT_TOKEN}"),
        ],
        Some(&json!({"jsonrpc":"2.0","id":1,"method":"ping"})),
    );
    assert!(head.starts_with("HTTP/1.1"), "{status} {head}");
}

#[test]
fn tls_with_a_key_that_is_not_the_certificates_is_refused_at_start() {
    let a = tempfile::tempdir().unwrap();
    let b = tempfile::tempdir().unwrap();
    let (cert, _) = self_signed(a.path());
    let (_, other_key) = self_signed(b.path());
    let up = Upstream::start();
    let listen = format!(
        "tls = {{ cert = \"{}\", key = \"{}\" }}\n",
        cert.display(),
        other_key.display()
    );
    let err = gateway(
        &remote_config(&format!("http://127.0.0.1:{}/mcp", up.port), &listen),
        &[("tickets.toml", &remote_policy(up.port, ""))],
    )
    .err()
    .expect("a mismatched key must stop the start");
    assert!(err.contains("listen.tls"), "{err}");
    let listen = "tls = { cert = \"missing.pem\", key = \"missing-key.pem\" }\n";
    let err = gateway(
        &remote_config(&format!("http://127.0.0.1:{}/mcp", up.port), listen),
        &[("tickets.toml", &remote_policy(up.port, ""))],
    )
    .err()
    .expect("a missing cert must stop the start");
    assert!(
        err.contains("listen.tls.cert") && err.contains("missing.pem"),
        "{err}"
    );
}

// ---- remote upstreams ----

#[test]
fn remote_upstream_tools_work_and_the_credential_never_reaches_the_client() {
    let up = Upstream::start();
    let gw = gateway(
        &remote_config(&format!("http://127.0.0.1:{}/mcp", up.port), ""),
        &[("tickets.toml", &remote_policy(up.port, ""))],
    )
    .unwrap();
    let mut c = Client::new(&gw, "/servers/tickets/mcp", vec![]);
    c.initialize();
    let list = c.request("tools/list", json!({}));
    let names: Vec<&str> = list["result"]["tools"]
        .as_array()
        .unwrap()
        .iter()
        .map(|t| t["name"].as_str().unwrap())
        .collect();
    assert!(
        names.contains(&"echo") && !names.contains(&"danger"),
        "{list}"
    );

    let r = c.request(
        "tools/call",
        json!({"name":"echo","arguments":{"message":"hi"}}),
    );
    assert_eq!(text_of(&r), "echo: hi", "{r}");

    // the [tools] deny rule holds for the remote tool
    let r = c.request("tools/call", json!({"name":"danger","arguments":{}}));
    assert_eq!(r["result"]["isError"], true, "{r}");
    assert!(!text_of(&r).contains("danger ran"), "{r}");

    // the credential in a result and in an error message is redacted
    let r = c.request("tools/call", json!({"name":"leak","arguments":{}}));
    assert!(text_of(&r).contains("[REDACTED"), "{r}");
    let r = c.request("tools/call", json!({"name":"fail","arguments":{}}));
    assert!(
        r["error"]["message"]
            .as_str()
            .unwrap()
            .contains("[REDACTED"),
        "{r}"
    );

    // the upstream saw its credential on every request, with its session
    // after initialize, and never the client's token
    let seen = up.seen();
    assert!(seen.iter().all(|(_, h, _)| h
        .iter()
        .any(|(k, v)| k == "authorization" && v == &format!("Bearer {SECRET}"))));
    let all = format!("{seen:?}");
    assert!(
        !all.contains(CLIENT_TOKEN),
        "the client's token went upstream"
    );
    assert!(
        seen.iter().any(|(m, _, _)| m == "GET"),
        "no GET stream tried"
    );
    assert!(seen
        .iter()
        .filter(|(_, _, b)| b.contains("tools/call"))
        .all(|(_, h, _)| h
            .iter()
            .any(|(k, v)| k == "mcp-session-id" && v == "up-session-1")));

    // closing the client's session ends the upstream's
    let sid = c.session.clone().unwrap();
    let (status, _, _) = curl(
        &c.url,
        &[
            "-X",
            "DELETE",
            "-H",
            &format!("authorization: Bearer {CLIENT_TOKEN}"),
            "-H",
            &format!("mcp-session-id: {sid}"),
            "-H",
            "mcp-protocol-version: 2025-06-18",
        ],
        None,
    );
    assert!(status < 300, "DELETE answered {status}");
    let until = Instant::now() + Duration::from_secs(10);
    while !up.seen().iter().any(|(m, _, _)| m == "DELETE") && Instant::now() < until {
        std::thread::sleep(Duration::from_millis(50));
    }
    assert!(
        up.seen().iter().any(|(m, _, _)| m == "DELETE"),
        "the upstream session was not deleted"
    );

    // never in what the client saw (bodies and headers), the log, the audit
    assert!(
        !c.seen.contains(SECRET),
        "the client saw the credential:\n{}",
        c.seen
    );
    assert!(
        !c.seen.to_ascii_lowercase().contains("x-upstream-token"),
        "an upstream header reached the client"
    );
    std::thread::sleep(Duration::from_millis(300));
    let log = gw.log.lock().unwrap().clone();
    assert!(
        !log.contains(SECRET),
        "the credential is in mcpbox's log:\n{log}"
    );
    for f in ["audit.db", "audit.db-wal"] {
        let p = gw._dir.path().join(f);
        if let Ok(bytes) = std::fs::read(&p) {
            assert!(
                !bytes.windows(SECRET.len()).any(|w| w == SECRET.as_bytes()),
                "the credential is in {}",
                p.display()
            );
        }
    }
    assert!(gw._dir.path().join("audit.db").exists(), "no audit written");
    let _ = &gw.state;
}

#[test]
fn remote_upstream_refusing_the_credential_is_an_error_without_it() {
    let up = Upstream::start();
    let policy = remote_policy(up.port, "").replace("TEST_TICKETS_TOKEN", "TEST_WRONG_TOKEN");
    let cfg = remote_config(&format!("http://127.0.0.1:{}/mcp", up.port), "");
    let dir_files = [("tickets.toml", policy.as_str())];
    let gw = gateway(&cfg, &dir_files).unwrap();
    let mut c = Client::new(&gw, "/servers/tickets/mcp", vec![]);
    c.id += 1;
    let (status, head, body) = c.post(&json!({"jsonrpc":"2.0","id":1,"method":"initialize","params":{
        "protocolVersion":"2025-06-18","capabilities":{},"clientInfo":{"name":"curl","version":"1"}}}));
    // the 401 (whose body holds the real token) becomes an error naming the status
    assert!(
        !head.contains(SECRET) && !body.contains(SECRET),
        "{head}\n{body}"
    );
    if status == 200 {
        let m = message(&body);
        assert!(
            m["error"]["message"].as_str().unwrap_or("").contains("401"),
            "{m}"
        );
    }
    std::thread::sleep(Duration::from_millis(300));
    let log = gw.log.lock().unwrap().clone();
    assert!(!log.contains("not-the-token-but-long"), "{log}");
}

#[test]
fn remote_upstream_whose_host_the_network_policy_does_not_allow_is_refused_at_start() {
    let up = Upstream::start();
    // the policy allows another port only
    let policy =
        remote_policy(up.port, "").replace(&format!("127.0.0.1:{}", up.port), "127.0.0.1:1");
    let err = gateway(
        &remote_config(&format!("http://127.0.0.1:{}/mcp", up.port), ""),
        &[("tickets.toml", &policy)],
    )
    .err()
    .expect("an unlisted upstream must stop the start");
    assert!(
        err.contains("servers[0] (tickets)")
            && err.contains("[network]")
            && err.contains("network.allow"),
        "{err}"
    );
}

#[test]
fn remote_upstream_at_a_private_or_disguised_loopback_address_is_refused_at_start() {
    // written as loopback: allowed
    let up = Upstream::start();
    let policy = remote_policy(up.port, "").replace("127.0.0.1:", "localhost:");
    let gw = gateway(
        &remote_config(&format!("http://localhost:{}/mcp", up.port), ""),
        &[("tickets.toml", &policy)],
    );
    assert!(gw.is_ok(), "{:?}", gw.err());
    drop(gw);
    for (url, allow, why) in [
        (
            "https://10.1.2.3/mcp",
            "10.1.2.3",
            "a private network address",
        ),
        // loopback in an IPv4-mapped disguise is not "written as loopback"
        (
            "https://[::ffff:127.0.0.1]/mcp",
            "127.0.0.1",
            "a loopback address",
        ),
    ] {
        let policy = remote_policy(up.port, "").replace(
            &format!("\"127.0.0.1:{}\"", up.port),
            &format!("\"{allow}\""),
        );
        let err = gateway(&remote_config(url, ""), &[("tickets.toml", &policy)])
            .err()
            .unwrap_or_else(|| panic!("{url} must stop the start"));
        assert!(
            err.contains("servers[0] (tickets)") && err.contains(why),
            "{url}: {err}"
        );
    }
}
