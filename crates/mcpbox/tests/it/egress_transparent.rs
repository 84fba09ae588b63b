//! Transparent egress (issue 31), end to end through `mcpbox exec`:
//! programs that ignore the proxy variables (Node 20's `fetch` and
//! `http.get`, a raw socket, `curl --noproxy '*'`) resolve names through
//! the sandbox's resolver and connect through the capture, and get the
//! proxy's decisions and records. Only loopback is ever reached: the
//! allowed name is mapped to 127.0.0.1 with `[network.hosts]`, and every
//! attack below targets an address the sandbox's namespace has no way to
//! (it has no device but `lo`).
#![allow(clippy::unwrap_used, clippy::expect_used)]

use crate::common;

use std::io::{BufRead, BufReader};
use std::process::{Command, Output};

use common::{mcpbox, Workspace};
use serde_json::Value;

use crate::egress::upstream;

/// `dev.test:PORT` allowed and mapped to the host's loopback, audited.
fn policy(ws: &Workspace, port: u16) -> std::path::PathBuf {
    ws.policy(&format!(
        "[audit]\npath = \"audit.db\"\n[network]\nallow = [\"dev.test:{port}\"]\n[network.hosts]\n\"dev.test\" = \"127.0.0.1\"\n"
    ))
}

/// Runs `argv` in the sandbox under `policy` with every proxy variable
/// removed (`env -u`), so that nothing but the capture can carry it.
fn exec_without_proxy(policy: &std::path::Path, argv: &[&str]) -> Output {
    let all = exec_without_proxy_argv(policy, argv);
    Command::new(&all[0]).args(&all[1..]).output().unwrap()
}

/// The command line of [`exec_without_proxy`].
fn exec_without_proxy_argv(policy: &std::path::Path, argv: &[&str]) -> Vec<String> {
    let unset = [
        "HTTP_PROXY",
        "HTTPS_PROXY",
        "http_proxy",
        "https_proxy",
        "ALL_PROXY",
        "all_proxy",
        "NODE_USE_ENV_PROXY",
        "npm_config_proxy",
        "npm_config_https_proxy",
    ];
    let mut all: Vec<String> = vec![mcpbox().display().to_string()];
    all.extend(["exec", "--policy", policy.to_str().unwrap(), "--", "env"].map(String::from));
    for v in unset {
        all.extend(["-u".to_string(), v.to_string()]);
    }
    all.extend(argv.iter().map(|a| a.to_string()));
    all
}

fn stdout(out: &Output) -> String {
    String::from_utf8_lossy(&out.stdout).into_owned()
}

fn network_events(ws: &Workspace) -> Vec<Value> {
    common::audit::events(&ws.path().join("audit.db"))
        .into_iter()
        .filter(|e| e["kind"] == "network")
        .collect()
}

/// The records whose host is `host`, as "METHOD decision reason".
fn records_for(events: &[Value], host: &str) -> Vec<String> {
    events
        .iter()
        .filter(|e| e["detail"]["host"] == host)
        .map(|e| {
            format!(
                "{} {} {}",
                e["detail"]["method"].as_str().unwrap_or("-"),
                e["decision"].as_str().unwrap_or("-"),
                e["reason"].as_str().unwrap_or("-")
            )
        })
        .collect()
}

/// The audit says `allowed` was connected to (allowed by the policy) and
/// `unlisted` was refused when the sandbox looked it up.
pub(crate) fn assert_reached_and_refused(ws: &Workspace, allowed: &str, unlisted: &str) {
    let events = network_events(ws);
    let reached = records_for(&events, allowed);
    assert!(
        reached.iter().any(|r| r == "CONNECT allow network.allow"),
        "{allowed}: {reached:?}"
    );
    let refused = records_for(&events, unlisted);
    assert!(
        refused.iter().any(|r| r == "RESOLVE deny network.unlisted"),
        "{unlisted}: {refused:?}"
    );
}

const NODE: &str = r#"
const http = require('http');
const [port] = process.argv.slice(1);
async function viaFetch(host) {
  try { const r = await fetch(`http://${host}:${port}/f`); console.log('fetch', host, r.status, await r.text()); }
  catch (e) { console.log('fetch', host, 'ERROR', (e.cause && e.cause.code) || e.code || e.message); }
}
function viaGet(host) {
  return new Promise((done) => {
    http.get(`http://${host}:${port}/g`, (res) => {
      let body = ''; res.on('data', (c) => body += c);
      res.on('end', () => { console.log('get', host, res.statusCode, body); done(); });
    }).on('error', (e) => { console.log('get', host, 'ERROR', e.code || e.message); done(); });
  });
}
(async () => {
  await viaFetch('dev.test'); await viaGet('dev.test');
  await viaFetch('other.test'); await viaGet('other.test');
})();
"#;

/// Runs `argv` and the upstream's port in a sandbox whose policy allows
/// `dev.test` on an upstream answering `body`, with no proxy variable;
/// checks that each line of `expect` is in what it printed, and that the
/// audit shows `dev.test` reached and `other.test` refused at lookup.
fn reaches_only_the_allowed_name(body: &'static str, argv: &[&str], expect: &[&str]) {
    let port = upstream(body);
    let ws = Workspace::new();
    let p = policy(&ws, port);
    let port = port.to_string();
    let mut all = argv.to_vec();
    all.push(&port);
    let out = exec_without_proxy(&p, &all);
    let text = stdout(&out);
    for line in expect {
        assert!(
            text.lines().any(|l| l == *line),
            "{line:?} not in:\n{text}\n{}",
            String::from_utf8_lossy(&out.stderr)
        );
    }
    assert_reached_and_refused(&ws, "dev.test", "other.test");
}

/// The unlisted name has no address in the sandbox: the resolver said
/// NXDOMAIN, and the proxy recorded why.
#[test]
fn node20_fetch_and_http_get_reach_an_allowed_host_without_proxy_support() {
    reaches_only_the_allowed_name(
        "hello node",
        &["node", "-e", NODE],
        &[
            "fetch dev.test 200 hello node",
            "get dev.test 200 hello node",
            "fetch other.test ERROR ENOTFOUND",
            "get other.test ERROR ENOTFOUND",
        ],
    );
}

const PYTHON: &str = r#"
import socket, sys, urllib.request
port = int(sys.argv[1])
opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))
for host in ["dev.test", "other.test"]:
    try:
        print("urllib", host, opener.open(f"http://{host}:{port}/u", timeout=10).read().decode())
    except Exception as e:
        print("urllib", host, "ERROR", type(e).__name__)
    try:
        s = socket.create_connection((host, port), timeout=10)
        s.sendall(b"GET /raw HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
        data = b""
        while chunk := s.recv(4096):
            data += chunk
        print("socket", host, data.split(b"\r\n\r\n", 1)[1].decode())
    except Exception as e:
        print("socket", host, "ERROR", type(e).__name__)
"#;

#[test]
fn python_urllib_and_a_raw_socket_reach_an_allowed_host_without_proxy_support() {
    reaches_only_the_allowed_name(
        "hello python",
        &["python3", "-c", PYTHON],
        &[
            "urllib dev.test hello python",
            "socket dev.test hello python",
            "urllib other.test ERROR URLError",
            "socket other.test ERROR gaierror",
        ],
    );
}

#[test]
fn curl_noproxy_reaches_an_allowed_host_and_not_another_port_of_it() {
    let port = upstream("hello curl");
    let other = upstream("not this one");
    let ws = Workspace::new();
    let p = policy(&ws, port);
    let curl = |port: u16| {
        let url = format!("http://dev.test:{port}/c");
        exec_without_proxy(
            &p,
            &["curl", "-sS", "--noproxy", "*", "--max-time", "10", &url],
        )
    };
    let out = curl(port);
    assert_eq!(
        stdout(&out),
        "hello curl",
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    // The name resolves, but the proxy decides each connection with its
    // port: another port of the allowed name is refused (a reset).
    let out = curl(other);
    assert!(!out.status.success());
    assert!(!stdout(&out).contains("not this one"));
    let events = network_events(&ws);
    let records = records_for(&events, "dev.test");
    assert!(
        records.iter().any(|r| r == "CONNECT deny network.unlisted"),
        "{records:?}"
    );
    assert!(
        events.iter().any(|e| e["detail"]["host"] == "dev.test"
            && e["detail"]["port"] == other
            && e["decision"] == "deny"),
        "{events:?}"
    );
}

/// Attacks from inside: each must fail inside the namespace, and the ones
/// that reach the bridge are refused with a record.
const ATTACKS: &str = r#"
import socket, struct
def attempt(label, f):
    try:
        print(label, "OK", f())
    except Exception as e:
        print(label, "REFUSED", type(e).__name__)

# The only device is loopback: nothing can leave, whatever the routes say.
print("devices", sorted(n for _, n in socket.if_nameindex()))

def query(name, qtype=1):
    q = struct.pack(">HHHHHH", 0x4242, 0x0100, 1, 0, 0, 0)
    for label in name.split("."):
        q += bytes([len(label)]) + label.encode()
    return q + b"\0" + struct.pack(">HH", qtype, 1)

def ask(server, packet):
    s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    s.settimeout(5)
    s.connect((server, 53))
    s.send(packet)
    return s.recv(2048)

# DNS to an outside resolver: refused at once by the namespace itself.
attempt("dns-outside", lambda: ask("192.0.2.53", query("dev.test")))
# UDP out to anywhere else.
def udp():
    s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM); s.settimeout(5)
    s.connect(("192.0.2.1", 443)); s.send(b"x"); return s.recv(10)
attempt("udp-out", udp)
# IPv6 out: a local route and no listener, refused at once (and audited).
def v6():
    s = socket.socket(socket.AF_INET6); s.settimeout(5)
    s.connect(("2001:db8::1", 443)); return "connected"
attempt("ipv6-out", v6)
# ICMP: no raw socket (no CAP_NET_RAW); a ping socket opens, and its echo
# request is dropped (and audited) in the namespace, over IPv4 and IPv6.
attempt("icmp-raw", lambda: socket.socket(socket.AF_INET, socket.SOCK_RAW, socket.IPPROTO_ICMP))
def ping(family, proto, kind, to):
    s = socket.socket(family, socket.SOCK_DGRAM, proto); s.settimeout(2)
    s.sendto(bytes([kind, 0, 0, 0, 0, 0, 0, 1]) + b"mcpbox", (to, 0))
    return s.recv(100)
attempt("icmp-ping", lambda: ping(socket.AF_INET, socket.IPPROTO_ICMP, 8, "192.0.2.7"))
attempt("icmp6-ping", lambda: ping(socket.AF_INET6, socket.IPPROTO_ICMPV6, 128, "2001:db8::7"))
# Literal addresses: metadata, private, and an allowed name's own address
# under no name: the capture carries them to the proxy, which refuses.
def tcp(ip, port):
    s = socket.create_connection((ip, port), timeout=10)
    s.sendall(b"GET / HTTP/1.1\r\nHost: dev.test\r\n\r\n")
    data = s.recv(100)
    if not data:
        raise ConnectionResetError("closed")
    return data
attempt("metadata", lambda: tcp("169.254.169.254", 80))
attempt("private", lambda: tcp("10.0.0.1", 80))
attempt("synthetic-unknown", lambda: tcp("198.19.1.1", 443))
# A name longer than DNS allows: the resolver answers FORMERR.
long_name = ".".join(["a" * 63] * 5)
print("long-name rcode", ask("127.0.0.1", query(long_name))[3] & 15)
# A name with a byte no host name has: NXDOMAIN, never asked about.
print("bad-bytes rcode", ask("127.0.0.1", query("a b.test"))[3] & 15)
# A lookup flood of distinct unlisted names (more than the resolver's socket
# buffer holds), then the allowed name still resolves to its synthetic
# address.
s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM); s.settimeout(10)
s.connect(("127.0.0.1", 53))
for i in range(500):
    s.send(query(f"flood{i}.test"))
answered = 0
try:
    for i in range(500):
        r = s.recv(2048); answered += 1
except socket.timeout:
    pass
print("flood answered", answered)
print("after-flood", socket.gethostbyname("dev.test"))
print("aaaa", ask("127.0.0.1", query("dev.test", 28))[7])
"#;

#[test]
fn attacks_on_the_capture_and_the_resolver_are_refused_inside_the_namespace() {
    let port = upstream("should not be seen");
    let ws = Workspace::new();
    let p = policy(&ws, port);
    // As root, mcpbox itself runs in a namespace of the test's own
    // (common/public_net.rs), so that even a proxy that let a literal
    // address through could not send a packet off this machine; the
    // rootless pass cannot make one, and runs it as it is.
    let out = if common::public_net::available() {
        let inner = exec_without_proxy_argv(&p, &["python3", "-c", ATTACKS]);
        let inner: Vec<&str> = inner.iter().map(String::as_str).collect();
        common::public_net::command(&ws.path().join("net"), &["pub.test"], "-", &inner)
            .output()
            .unwrap()
    } else {
        exec_without_proxy(&p, &["python3", "-c", ATTACKS])
    };
    let text = stdout(&out);
    let line = |label: &str| {
        text.lines()
            .find(|l| l.starts_with(label))
            .unwrap_or_else(|| {
                panic!(
                    "no {label} in {text}\n{}",
                    String::from_utf8_lossy(&out.stderr)
                )
            })
            .to_string()
    };
    assert_eq!(line("devices"), "devices ['lo']");
    assert_eq!(
        line("dns-outside"),
        "dns-outside REFUSED ConnectionRefusedError"
    );
    assert_eq!(line("udp-out"), "udp-out REFUSED ConnectionRefusedError");
    assert_eq!(line("ipv6-out"), "ipv6-out REFUSED ConnectionRefusedError");
    assert_eq!(line("icmp-raw"), "icmp-raw REFUSED PermissionError");
    // Dropped on the way out, so no echo reply from the namespace's own
    // local route: sendto fails with EPERM over IPv4; the IPv6 ping socket
    // does not pass the drop's error on (ping_v6_sendmsg), so its reply
    // never comes.
    assert_eq!(line("icmp-ping"), "icmp-ping REFUSED PermissionError");
    assert_eq!(line("icmp6-ping"), "icmp6-ping REFUSED TimeoutError");
    for label in ["metadata", "private", "synthetic-unknown"] {
        assert!(line(label).contains("REFUSED"), "{text}");
    }
    assert_eq!(line("long-name rcode"), "long-name rcode 1");
    assert_eq!(line("bad-bytes rcode"), "bad-bytes rcode 3");
    // A flood waits in the resolver socket's receive buffer and the kernel
    // drops what does not fit: some are answered, none costs memory of
    // ours, and the resolver still works after it.
    let answered: usize = line("flood answered")
        .rsplit(' ')
        .next()
        .unwrap()
        .parse()
        .unwrap();
    assert!(answered > 0 && answered <= 500, "{text}");
    assert_eq!(line("after-flood"), "after-flood 198.18.0.1");
    assert_eq!(line("aaaa"), "aaaa 0", "AAAA of an allowed name: no data");
    let events = network_events(&ws);
    // What the capture does not carry is refused inside the namespace and
    // reported by the bridge from its NFLOG socket: each is in the audit
    // with its protocol and destination. (A raw socket has no record: the
    // sandbox cannot open one, so no packet exists.)
    for (host, port, protocol) in [
        ("192.0.2.53", 53, "udp"),
        ("192.0.2.1", 443, "udp"),
        ("2001:db8::1", 443, "tcp6"),
        ("192.0.2.7", 0, "icmp"),
        ("2001:db8::7", 0, "icmp6"),
    ] {
        assert!(
            events.iter().any(|e| e["detail"]["host"]
                .as_str()
                .is_some_and(|h| h.trim_matches(['[', ']']) == host)
                && e["detail"]["port"] == port
                && e["detail"]["method"] == "REFUSED"
                && e["detail"]["protocol"] == protocol
                && e["decision"] == "deny"
                && e["reason"] == "network.not_carried"),
            "no refusal of {protocol} to {host}:{port} in {events:#?}"
        );
    }
    // The kernel's own answers (the "port unreachable" that refuses a UDP
    // datagram) are not attempts of the sandbox: no record but the pings'.
    let icmp_hosts: Vec<&str> = events
        .iter()
        .filter(|e| {
            e["detail"]["protocol"]
                .as_str()
                .is_some_and(|p| p.starts_with("icmp"))
        })
        .filter_map(|e| e["detail"]["host"].as_str())
        .map(|h| h.trim_matches(['[', ']']))
        .collect();
    assert!(
        icmp_hosts
            .iter()
            .all(|h| *h == "192.0.2.7" || *h == "2001:db8::7"),
        "{icmp_hosts:?}"
    );
    // The queries the resolver could not take are recorded with why.
    for why in [
        "a name longer than DNS allows (255 bytes)",
        "a name with bytes no host name has",
    ] {
        assert!(
            events.iter().any(|e| e["detail"]["method"] == "REFUSED"
                && e["detail"]["protocol"] == "dns"
                && e["detail"]["why"] == why
                && e["reason"] == "network.invalid_host"),
            "no refusal of {why:?} in {events:#?}"
        );
    }
    for host in ["169.254.169.254", "10.0.0.1", "198.19.1.1"] {
        let r = records_for(&events, host);
        assert!(
            r.iter().any(|r| r.starts_with("CONNECT deny")),
            "{host}: {r:?}"
        );
    }
    let flood = events
        .iter()
        .filter(|e| {
            e["detail"]["method"] == "RESOLVE"
                && e["detail"]["host"]
                    .as_str()
                    .is_some_and(|h| h.starts_with("flood"))
        })
        .count();
    assert!(
        (answered..=500).contains(&flood),
        "every answered refusal is recorded: {flood} records, {answered} answers"
    );
}

/// A workspace whose policy allows `pub.test` on the namespace's port,
/// audited, and the argv of `mcpbox exec` running `python3 -c script PORT`
/// with no proxy variable (common/public_net.rs); `None`, said on stderr,
/// where the namespace cannot be made (not root).
fn public_exec(script: &str) -> Option<(Workspace, Vec<String>)> {
    if !common::public_net::available() {
        eprintln!("skipped: needs root to make a network namespace with a public address");
        return None;
    }
    let ws = Workspace::new();
    let port = common::public_net::PORT;
    let p = ws.policy(&format!(
        "[audit]\npath = \"audit.db\"\n[network]\nallow = [\"pub.test:{port}\"]\n"
    ));
    let argv = exec_without_proxy_argv(&p, &["python3", "-c", script, &port.to_string()]);
    Some((ws, argv))
}

/// What a program that ignores the proxy variables sees of an allowed name
/// with a public address (common/public_net.rs: mcpbox in a namespace of
/// the test's own, where `pub.test` is 1.2.3.4 and nothing can leave).
const PUBLIC: &str = r#"
import socket, sys, urllib.request
port = int(sys.argv[1])
def attempt(label, f):
    try:
        print(label, "OK", f())
    except Exception as e:
        print(label, "REFUSED", type(e).__name__)
def raw(host, name):
    s = socket.create_connection((host, port), timeout=10)
    s.sendall(f"GET /raw HTTP/1.1\r\nHost: {name}\r\nConnection: close\r\n\r\n".encode())
    data = b""
    while chunk := s.recv(4096):
        data += chunk
    if not data:
        raise ConnectionResetError("closed")
    return data.split(b"\r\n\r\n", 1)[1].decode()
# Before any lookup: the allowed name's address, as a literal under another
# name, is no name the policy allows.
attempt("literal-first", lambda: raw("1.2.3.4", "evil.test"))
print("lookup", socket.gethostbyname("pub.test"))
opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))
attempt("urllib", lambda: opener.open(f"http://pub.test:{port}/u", timeout=10).read().decode())
attempt("socket", lambda: raw("pub.test", "pub.test"))
attempt("unlisted", lambda: socket.gethostbyname("other.test"))
"#;

/// The real-world path: an allowed name that resolves to a public address
/// is answered with that address (so a program's own "is this address
/// public" check passes, as it would without mcpbox), and a connection to
/// it is carried to the proxy under the name it was looked up by. An
/// address that was never looked up is a literal the policy must name.
#[test]
fn a_public_name_resolves_to_its_real_address_and_is_reached_by_name() {
    use common::public_net;
    let Some((ws, inner)) = public_exec(PUBLIC) else {
        return;
    };
    let port = public_net::PORT;
    let inner: Vec<&str> = inner.iter().map(String::as_str).collect();
    let out = public_net::command(
        &ws.path().join("net"),
        &["pub.test", "other.test"],
        "hello public",
        &inner,
    )
    .output()
    .unwrap();
    let text = stdout(&out);
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(text.contains("literal-first REFUSED"), "{text}\n{err}");
    assert!(
        text.contains("lookup 1.2.3.4"),
        "the real address: {text}\n{err}"
    );
    assert!(text.contains("urllib OK hello public"), "{text}\n{err}");
    assert!(text.contains("socket OK hello public"), "{text}\n{err}");
    assert!(text.contains("unlisted REFUSED gaierror"), "{text}\n{err}");
    let events = network_events(&ws);
    let by_name = records_for(&events, "pub.test");
    assert!(
        by_name.iter().any(|r| r == "CONNECT allow network.allow"),
        "{by_name:?}"
    );
    let literal = records_for(&events, "1.2.3.4");
    assert!(
        literal.iter().any(|r| r.starts_with("CONNECT deny")),
        "{literal:?}"
    );
    assert!(
        records_for(&events, "other.test")
            .iter()
            .any(|r| r == "RESOLVE deny network.unlisted"),
        "{events:?}"
    );

    // Node 20's fetch, which honours no proxy variable at all.
    let ws = Workspace::new();
    let p = ws.policy(&format!(
        "[audit]\npath = \"audit.db\"\n[network]\nallow = [\"pub.test:{port}\"]\n"
    ));
    let js = format!(
        "fetch('http://pub.test:{port}/n').then(async r => console.log('node', r.status, await r.text())).catch(e => console.log('node ERROR', (e.cause && e.cause.code) || e.message))"
    );
    let inner = exec_without_proxy_argv(&p, &["node", "-e", &js]);
    let inner: Vec<&str> = inner.iter().map(String::as_str).collect();
    let out = public_net::command(&ws.path().join("net"), &["pub.test"], "hello node", &inner)
        .output()
        .unwrap();
    assert_eq!(
        stdout(&out).trim(),
        "node 200 hello node",
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
}

/// A bare repository with one commit whose `greeting` is `hello git`,
/// served as plain files (git's "dumb" HTTP protocol) by a stub on
/// 127.0.0.1.
fn git_repo_stub() -> common::http::Stub {
    let dir = tempfile::tempdir().unwrap();
    let work = dir.path().join("work");
    let bare = dir.path().join("repo.git");
    let git = |args: &[&str], cwd: &std::path::Path| {
        let out = Command::new("git")
            .args(args)
            .current_dir(cwd)
            .env("GIT_CONFIG_GLOBAL", "/dev/null")
            .env("GIT_CONFIG_NOSYSTEM", "1")
            .output()
            .unwrap();
        assert!(out.status.success(), "git {args:?}: {out:?}");
    };
    std::fs::create_dir_all(&work).unwrap();
    git(&["init", "-q", "-b", "main"], &work);
    std::fs::write(work.join("greeting"), "hello git\n").unwrap();
    git(&["add", "greeting"], &work);
    git(
        &[
            "-c",
            "user.name=t",
            "-c",
            "user.email=t@t",
            "commit",
            "-q",
            "-m",
            "one",
        ],
        &work,
    );
    git(
        &[
            "clone",
            "-q",
            "--bare",
            work.to_str().unwrap(),
            bare.to_str().unwrap(),
        ],
        dir.path(),
    );
    git(&["update-server-info"], &bare);
    let stub = common::http::Stub::start();
    let mut stack = vec![bare.clone()];
    while let Some(d) = stack.pop() {
        for entry in std::fs::read_dir(&d).unwrap() {
            let path = entry.unwrap().path();
            if path.is_dir() {
                stack.push(path);
            } else {
                let rel = path.strip_prefix(&bare).unwrap().display().to_string();
                stub.route(
                    &format!("/repo.git/{rel}"),
                    "application/octet-stream",
                    std::fs::read(&path).unwrap(),
                );
            }
        }
    }
    // A dumb server ignores the query of git's first request, which asks
    // whether it speaks the smart protocol: plain text means it does not.
    stub.route(
        "/repo.git/info/refs?service=git-upload-pack",
        "text/plain",
        std::fs::read(bare.join("info/refs")).unwrap(),
    );
    stub
}

/// git over HTTP and Python's `requests` with the proxy variables ignored
/// (`requests` with `trust_env = False`; git with none set and the proxy
/// mcpbox gives it in its config emptied, `-c http.proxy=`): both resolve
/// the allowed name in the sandbox and reach it through the capture; an
/// unlisted name is not found.
#[test]
fn git_over_http_and_python_requests_reach_an_allowed_host_without_proxy_support() {
    let stub = git_repo_stub();
    let port = stub.port();
    let ws = Workspace::new();
    let venv = common::peers::peer("venv");
    let p = ws.raw_policy(&format!(
        "{}[audit]\npath = \"audit.db\"\n[network]\nallow = [\"dev.test:{port}\"]\n[network.hosts]\n\"dev.test\" = \"127.0.0.1\"\n",
        common::peers::mount_same_path(&venv)
    ));
    let script = format!(
        "git -c http.proxy= clone -q http://dev.test:{port}/repo.git /tmp/r && cat /tmp/r/greeting; \
         git -c http.proxy= clone -q http://other.test:{port}/repo.git /tmp/o 2>&1 | head -1"
    );
    let out = exec_without_proxy(&p, &["sh", "-c", &script]);
    let text = stdout(&out);
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(text.starts_with("hello git\n"), "{text}\n{err}");
    assert!(
        text.contains("Could not resolve host: other.test"),
        "{text}\n{err}"
    );

    let python = venv.join("bin/python3").display().to_string();
    let code = format!(
        "import requests\ns = requests.Session()\ns.trust_env = False\n\
         print('requests', s.get('http://dev.test:{port}/repo.git/HEAD', timeout=10).text.strip())\n\
         try:\n    s.get('http://other.test:{port}/repo.git/HEAD', timeout=10)\n\
         except requests.exceptions.ConnectionError as e:\n    print('other', 'NameResolutionError' in repr(e) or 'resolve' in repr(e))\n"
    );
    let out = exec_without_proxy(&p, &[&python, "-c", &code]);
    let text = stdout(&out);
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        text.contains("requests ref: refs/heads/main"),
        "{text}\n{err}"
    );
    assert!(text.contains("other True"), "{text}\n{err}");
    assert_reached_and_refused(&ws, "dev.test", "other.test");
}

/// A minimal MCP server on Node 20 (stdio, newline-delimited JSON-RPC)
/// whose one tool, `get`, fetches a URL with Node's own `fetch`, which
/// honours no proxy variable: the kind of server issue 31 is about.
pub(crate) const NODE_SERVER: &str = r#"
const rl = require('readline').createInterface({ input: process.stdin });
const send = (m) => process.stdout.write(JSON.stringify(m) + '\n');
rl.on('line', async (line) => {
  const m = JSON.parse(line);
  if (m.method === 'initialize') {
    send({ jsonrpc: '2.0', id: m.id, result: { protocolVersion: m.params.protocolVersion,
      capabilities: { tools: {} }, serverInfo: { name: 'node-get', version: '1.0.0' } } });
  } else if (m.method === 'tools/list') {
    send({ jsonrpc: '2.0', id: m.id, result: { tools: [{ name: 'get', description: 'GET a URL',
      inputSchema: { type: 'object', properties: { url: { type: 'string' } }, required: ['url'] } }] } });
  } else if (m.method === 'tools/call') {
    let text;
    try { const r = await fetch(m.params.arguments.url); text = `${r.status} ${await r.text()}`; }
    catch (e) { text = `ERROR ${(e.cause && e.cause.code) || e.message}`; }
    send({ jsonrpc: '2.0', id: m.id, result: { content: [{ type: 'text', text }] } });
  } else if (m.id !== undefined) {
    send({ jsonrpc: '2.0', id: m.id, error: { code: -32601, message: 'no such method' } });
  }
});
"#;

/// `mcpbox run` over a Node MCP server that fetches with Node's `fetch`:
/// the tool call reaches the allowed host through the capture, and an
/// unlisted host is not found, with the refusal in the audit log tied to
/// nothing but the policy.
#[test]
fn a_node_mcp_server_using_fetch_reaches_an_allowed_host_under_run() {
    use common::mcp::{result_text, Session};
    let port = upstream("hello from upstream");
    let ws = Workspace::new();
    let p = policy(&ws, port);
    let mut s = Session::start(&p, &["node", "-e", NODE_SERVER], &[]);
    let init = s.initialize();
    assert!(init.get("result").is_some(), "{init}\n{}", s.stderr());
    let r = s.call(
        "get",
        serde_json::json!({"url": format!("http://dev.test:{port}/x")}),
    );
    assert_eq!(
        result_text(&r),
        "200 hello from upstream",
        "{r}\n{}",
        s.stderr()
    );
    let r = s.call(
        "get",
        serde_json::json!({"url": format!("http://other.test:{port}/x")}),
    );
    assert_eq!(result_text(&r), "ERROR ENOTFOUND", "{r}\n{}", s.stderr());
    let (status, err) = s.finish();
    assert!(status.success(), "{err}");
    assert_reached_and_refused(&ws, "dev.test", "other.test");
}

/// The same server behind `mcpbox serve`: a session's sandbox gets the
/// resolver and the capture as `run`'s does.
#[test]
fn a_node_mcp_server_using_fetch_reaches_an_allowed_host_under_serve() {
    use common::serve::{Gateway, Server, ALICE};
    let port = upstream("hello from serve");
    let policy = format!(
        "[network]\nallow = [\"dev.test:{port}\"]\n[network.hosts]\n\"dev.test\" = \"127.0.0.1\"\n"
    );
    let gw = Gateway::start(
        "",
        &[Server {
            name: "nodeget",
            command: ["node", "-e", NODE_SERVER].map(String::from).to_vec(),
            policy: &policy,
        }],
    );
    let mut m = gw.mcp("nodeget", Some(ALICE));
    let init = m.initialize();
    assert!(init.get("result").is_some(), "{init}\n{}", gw.stderr());
    let get = |m: &mut common::serve::Mcp, host: &str| {
        let r = m.call(
            "get",
            serde_json::json!({"url": format!("http://{host}:{port}/s")}),
        );
        r["result"]["content"][0]["text"]
            .as_str()
            .unwrap_or_else(|| panic!("{r}\n{}", gw.stderr()))
            .to_string()
    };
    let reached = get(&mut m, "dev.test");
    assert_eq!(reached, "200 hello from serve", "{}", gw.stderr());
    let refused = get(&mut m, "other.test");
    assert_eq!(refused, "ERROR ENOTFOUND", "{}", gw.stderr());
}

/// A Go program with a transport of its own (`Proxy: nil`: no proxy
/// variable is read) and Go's own resolver (`PreferGo`), built when a Go
/// toolchain is installed; none is on this kind of machine and none is in
/// the packages the test suite installs, so it is skipped here with that
/// reason.
#[test]
fn a_go_program_with_its_own_transport_reaches_an_allowed_host() {
    let Ok(go) = which("go") else {
        eprintln!("skipped: no Go toolchain on PATH (scripts/install-test-deps.sh installs none)");
        return;
    };
    let port = upstream("hello go");
    let ws = Workspace::new();
    let src = ws.path().join("input/main.go");
    std::fs::write(
        &src,
        r#"package main
import ("context"; "fmt"; "io"; "net"; "net/http"; "os")
func main() {
	net.DefaultResolver.PreferGo = true
	c := &http.Client{Transport: &http.Transport{Proxy: nil, DialContext: (&net.Dialer{}).DialContext}}
	for _, host := range []string{"dev.test", "other.test"} {
		r, err := c.Get("http://" + host + ":" + os.Args[1] + "/go")
		if err != nil { fmt.Println(host, "ERROR"); continue }
		b, _ := io.ReadAll(r.Body)
		fmt.Println(host, r.StatusCode, string(b))
	}
	_ = context.Background
}
"#,
    )
    .unwrap();
    let bin = ws.path().join("input/goget");
    let built = Command::new(go)
        .args(["build", "-o", bin.to_str().unwrap(), src.to_str().unwrap()])
        .env("CGO_ENABLED", "0")
        .output()
        .unwrap();
    assert!(built.status.success(), "{built:?}");
    let p = policy(&ws, port);
    let out = exec_without_proxy(&p, &["/workspace/input/goget", &port.to_string()]);
    let text = stdout(&out);
    assert!(text.contains("dev.test 200 hello go"), "{text}");
    assert!(text.contains("other.test ERROR"), "{text}");
}

fn which(name: &str) -> Result<std::path::PathBuf, ()> {
    std::env::var_os("PATH")
        .into_iter()
        .flat_map(|p| std::env::split_paths(&p).collect::<Vec<_>>())
        .map(|d| d.join(name))
        .find(|p| p.is_file())
        .ok_or(())
}

/// The built-in sandbox server: a command its `exec` tool runs reaches an
/// allowed host through the capture with no proxy variable honoured
/// (urllib told to use none), and an unlisted name is not found.
#[test]
fn builtin_exec_reaches_an_allowed_host_without_proxy_support() {
    use common::mcp::Session;
    let port = upstream("hello builtin");
    let ws = Workspace::new();
    let p = ws.raw_policy(&format!(
        "[server]\nname = \"sandbox\"\n[network]\nallow = [\"dev.test:{port}\"]\n[network.hosts]\n\"dev.test\" = \"127.0.0.1\"\n"
    ));
    let state = ws.path().join("state");
    let args: Vec<String> = ["run", "--builtin", "sandbox", "--policy"]
        .map(String::from)
        .into_iter()
        .chain([p.display().to_string()])
        .collect();
    let mut s = Session::start_mcpbox(&args, &[("MCPBOX_STATE_DIR", state.to_str().unwrap())]);
    let init = s.initialize();
    assert!(init.get("result").is_some(), "{init}\n{}", s.stderr());
    let code = format!(
        "import urllib.request\no = urllib.request.build_opener(urllib.request.ProxyHandler({{}}))\n\
         print(o.open('http://dev.test:{port}/b', timeout=10).read().decode())\n\
         try:\n    o.open('http://other.test:{port}/b', timeout=10)\nexcept Exception as e:\n    print('other', type(e).__name__)\n"
    );
    let r = s.call("exec", serde_json::json!({"argv": ["python3", "-c", code]}));
    let out = r["result"]["structuredContent"]["stdout"]
        .as_str()
        .unwrap_or_else(|| panic!("{r}\n{}", s.stderr()))
        .to_string();
    assert_eq!(out, "hello builtin\nother URLError\n", "{r}");
    let _ = s.finish();
}

/// DNS rebinding through the sandbox's resolver, end to end: the program
/// looks `pub.test` up (its public address), then the name is made to
/// point at the host's loopback before it connects to the address it was
/// given. The capture sends the connection to the proxy by name, the
/// proxy resolves it again, meets the loopback address and refuses; the
/// program never reaches the server on that address.
const REBIND: &str = r#"
import os, socket, sys, time
port = int(sys.argv[1])
print("lookup", socket.gethostbyname("pub.test"), flush=True)
for _ in range(400):
    if os.path.exists("/workspace/input/rebound"):
        break
    time.sleep(0.05)
try:
    s = socket.create_connection(("1.2.3.4", port), timeout=10)
    s.sendall(b"GET / HTTP/1.1\r\nHost: pub.test\r\nConnection: close\r\n\r\n")
    data = b""
    while chunk := s.recv(4096):
        data += chunk
    print("connect", "OK" if data else "REFUSED", flush=True)
except Exception as e:
    print("connect REFUSED", type(e).__name__, flush=True)
"#;

#[test]
fn dns_rebinding_between_the_sandbox_lookup_and_its_connection_is_refused() {
    use common::public_net;
    use std::io::Read;
    use std::process::Stdio;
    let Some((ws, inner)) = public_exec(REBIND) else {
        return;
    };
    let inner: Vec<&str> = inner.iter().map(String::as_str).collect();
    let net = ws.path().join("net");
    let mut child = public_net::command(&net, &["pub.test"], "must not be read", &inner)
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let mut out = BufReader::new(child.stdout.take().unwrap());
    let mut first = String::new();
    out.read_line(&mut first).unwrap();
    assert_eq!(first.trim(), "lookup 1.2.3.4", "the public address first");
    // Rebind: the same file (bind-mounted over /etc/hosts inside), now
    // naming the loopback, which the proxy reads at its next lookup.
    std::fs::write(net.join("hosts"), "127.0.0.1\tlocalhost pub.test\n").unwrap();
    std::fs::write(ws.path().join("input/rebound"), "").unwrap();
    let mut rest = String::new();
    out.read_to_string(&mut rest).unwrap();
    let mut err = String::new();
    child
        .stderr
        .take()
        .unwrap()
        .read_to_string(&mut err)
        .unwrap();
    child.wait().unwrap();
    assert!(rest.contains("connect REFUSED"), "{rest}\n{err}");
    let records = records_for(&network_events(&ws), "pub.test");
    assert!(
        records
            .iter()
            .any(|r| r == "CONNECT deny network.loopback_address"),
        "{records:?}"
    );
}
