//! Network egress through mcpbox's proxy, end to end: `mcpbox exec` with a
//! `[network]` policy, a program inside the sandbox, a test server on the
//! host's loopback. Only loopback addresses are ever used: names are mapped
//! to 127.0.0.1 with `[network.hosts]`, and the refusal of other address
//! classes is tested in crates/egress with a recording connector.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use crate::common;

use std::io::{BufRead, BufReader, Read, Write};
use std::net::TcpListener;
use std::process::Command;

use common::{mcpbox, Workspace};

/// A one-thread HTTP server on 127.0.0.1 that answers every request with
/// `body`, until the test ends.
pub(crate) fn upstream(body: &'static str) -> u16 {
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let port = listener.local_addr().unwrap().port();
    std::thread::spawn(move || {
        for conn in listener.incoming() {
            let Ok(mut conn) = conn else { continue };
            let mut reader = BufReader::new(conn.try_clone().unwrap());
            let mut line = String::new();
            while reader.read_line(&mut line).map(|n| n > 2).unwrap_or(false) {
                line.clear();
            }
            let _ = write!(
                conn,
                "HTTP/1.1 200 OK\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
                body.len()
            );
        }
    });
    port
}

/// Python inside the sandbox fetching `url` through the proxy settings
/// mcpbox gives it; prints the body, or `HTTP <code> <reason header>`.
const FETCH: &str = r#"
import os, sys, urllib.request, urllib.error
# Loopback names bypass the proxy by default (the sandbox's loopback is its
# own); these tests want the proxy's answer for them too.
os.environ.pop("no_proxy", None); os.environ.pop("NO_PROXY", None)
try:
    print(urllib.request.urlopen(sys.argv[1], timeout=10).read().decode())
except urllib.error.HTTPError as e:
    print("HTTP", e.code, e.headers.get("X-Mcpbox-Reason"))
except Exception as e:
    print("ERROR", type(e).__name__, e)
"#;

fn fetch(ws: &Workspace, policy_extra: &str, url: &str) -> String {
    let p = ws.policy(&format!("[audit]\npath = \"audit.db\"\n{policy_extra}"));
    let out = exec_python(&p, FETCH, &[url]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).trim().to_string()
}

fn network(port: u16) -> String {
    format!("[network]\nallow = [\"fetch.test:{port}\"]\n[network.hosts]\n\"fetch.test\" = \"127.0.0.1\"\n")
}

/// The audit log as JSON Lines text.
fn audit(ws: &Workspace) -> String {
    common::audit::events(&ws.path().join("audit.db"))
        .iter()
        .map(|e| e.to_string() + "\n")
        .collect()
}

/// Runs `python3 -c script ARGS` in the sandbox under `policy`.
fn exec_python(policy: &std::path::Path, script: &str, args: &[&str]) -> std::process::Output {
    Command::new(mcpbox())
        .args([
            "exec",
            "--policy",
            policy.to_str().unwrap(),
            "--",
            "python3",
            "-c",
            script,
        ])
        .args(args)
        .output()
        .unwrap()
}

#[test]
fn allowed_name_reaches_a_local_server_through_the_proxy_and_is_audited() {
    let port = upstream("hello from upstream");
    let ws = Workspace::new();
    let body = fetch(
        &ws,
        &network(port),
        &format!("http://fetch.test:{port}/path"),
    );
    assert_eq!(body, "hello from upstream");
    let audit = audit(&ws);
    assert!(
        audit.contains("\"network\"") && audit.contains("fetch.test"),
        "{audit}"
    );
    assert!(audit.contains("\"allow\""), "{audit}");
}

/// A deny without a port used to cover only 80 and 443: beside an allow
/// of the same domain on another port, the denied host got through there.
#[test]
fn denied_host_without_a_port_is_refused_on_the_port_a_wildcard_allows() {
    let port = upstream("should not be seen");
    let ws = Workspace::new();
    let extra = format!(
        "[network]\nallow = [\"*.fetch.test:{port}\"]\ndeny = [\"uploads.fetch.test\"]\n\
         [network.hosts]\n\"uploads.fetch.test\" = \"127.0.0.1\"\n\"api.fetch.test\" = \"127.0.0.1\"\n"
    );
    let body = fetch(&ws, &extra, &format!("http://uploads.fetch.test:{port}/"));
    assert_eq!(body, "HTTP 403 network.deny");
    // the rest of the wildcard still works on that port
    let ws = Workspace::new();
    let body = fetch(&ws, &extra, &format!("http://api.fetch.test:{port}/"));
    assert_eq!(body, "should not be seen");
}

/// With `[network]` on, the proxy's git entry used to be appended as a
/// second `GIT_CONFIG_*` entry 0 beside the policy's, so one of them was
/// lost: now the policy's come first and the proxy's follows them.
#[test]
fn policy_git_config_survives_the_proxy_environment() {
    let ws = Workspace::new();
    let p = ws.policy(&format!(
        "{}[env]\nset = {{ GIT_CONFIG_COUNT = \"1\", GIT_CONFIG_KEY_0 = \"user.name\", GIT_CONFIG_VALUE_0 = \"agent\" }}\n",
        network(8080)
    ));
    let out = common::run(&[
        "exec",
        "--policy",
        p.to_str().unwrap(),
        "--",
        "/bin/sh",
        "-c",
        "echo $GIT_CONFIG_COUNT $GIT_CONFIG_KEY_0=$GIT_CONFIG_VALUE_0 $GIT_CONFIG_KEY_1=$GIT_CONFIG_VALUE_1; env | grep -c '^GIT_CONFIG_COUNT='",
    ]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let text = String::from_utf8_lossy(&out.stdout);
    let mut lines = text.lines();
    let first = lines.next().unwrap_or("");
    assert!(
        first.starts_with("2 user.name=agent http.proxy=http://127.0.0.1:"),
        "{text}"
    );
    assert_eq!(lines.next(), Some("1"), "one count: {text}");
}

#[test]
fn unlisted_name_is_refused_with_the_rule_and_reason() {
    let port = upstream("should not be seen");
    let ws = Workspace::new();
    let extra = format!("{}\"other.test\" = \"127.0.0.1\"\n", network(port));
    let body = fetch(&ws, &extra, &format!("http://other.test:{port}/"));
    assert_eq!(body, "HTTP 403 network.unlisted");
    assert!(audit(&ws).contains("\"deny\""));
    // the refusal is on mcpbox's stderr too, with its reason, not the host
    let p = ws.policy(&format!("[audit]\npath = \"audit.db\"\n{extra}"));
    let out = exec_python(&p, FETCH, &[&format!("http://other.test:{port}/")]);
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("egress refused a connection") && err.contains("network.unlisted"),
        "{err}"
    );
    assert!(!err.contains("other.test"), "{err}");
}

#[test]
fn allowed_name_resolving_to_loopback_is_refused() {
    // "localhost" is allowed by name, but resolves to a loopback address:
    // the proxy refuses after resolving, before connecting.
    let port = upstream("should not be seen");
    let ws = Workspace::new();
    let extra = format!("[network]\nallow = [\"localhost:{port}\"]\n");
    let body = fetch(&ws, &extra, &format!("http://localhost:{port}/"));
    assert_eq!(body, "HTTP 403 network.loopback_address");
}

/// Python inside the sandbox fetching `url` with the environment mcpbox
/// gives it, as a server would (no proxy setting changed); prints the body,
/// `HTTP <code> <reason header> <body>`, or the error.
const FETCH_AS_GIVEN: &str = r#"
import sys, urllib.request, urllib.error
try:
    print(urllib.request.urlopen(sys.argv[1], timeout=10).read().decode())
except urllib.error.HTTPError as e:
    print("HTTP", e.code, e.headers.get("X-Mcpbox-Reason"), e.read().decode())
except Exception as e:
    print("ERROR", type(e).__name__, e)
"#;

/// Issue 32: a service on the user's own machine is opened by naming its
/// port in `[network] local`; the request goes through the proxy (loopback
/// names no longer bypass it) and is recorded with the rule that opened it.
#[test]
fn network_local_lets_the_server_reach_a_service_on_this_machine_through_the_proxy() {
    let port = upstream("hello from the developer's machine");
    let ws = Workspace::new();
    let p = ws.policy(&format!(
        "[audit]\npath = \"audit.db\"\n[network]\nlocal = [\"localhost:{port}\"]\n"
    ));
    for url in [
        format!("http://localhost:{port}/"),
        format!("http://127.0.0.1:{port}/"),
    ] {
        let out = exec_python(&p, FETCH_AS_GIVEN, &[&url]);
        let body = String::from_utf8_lossy(&out.stdout);
        assert_eq!(
            body.trim(),
            "hello from the developer's machine",
            "{url}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
    }
    let events = common::audit::events(&ws.path().join("audit.db"));
    for host in ["localhost", "127.0.0.1"] {
        let to = common::audit::network_to(&events, host);
        assert_eq!(to.len(), 1, "{events:#?}");
        assert_eq!(to[0]["decision"], "allow", "{to:#?}");
        assert_eq!(to[0]["reason"], "network.local", "{to:#?}");
        assert_eq!(
            to[0]["source"],
            format!("network.local[0] \"localhost:{port}\""),
            "{to:#?}"
        );
    }
    // `mcpbox check` says what the key opens
    let out = common::run(&["check", p.to_str().unwrap()]);
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{err}");
    assert!(
        err.contains(&format!("network.local[0] \"localhost:{port}\" lets the sandbox reach port {port} on this machine's loopback")),
        "{err}"
    );
}

/// Issue 32: a fetch of a page on the user's machine used to fail inside the
/// server with a bare "connection refused" (it went straight to the
/// sandbox's own empty loopback), with nothing on mcpbox's side and no
/// record. Now it reaches the proxy, which refuses it with a reason, a
/// record, and the key to add.
#[test]
fn a_loopback_port_the_policy_does_not_open_is_refused_with_a_record_naming_network_local() {
    let port = upstream("should not be seen");
    let ws = Workspace::new();
    // network on (an unrelated host, and unlisted hosts asked for): loopback
    // is still refused at once, never put to a human
    let p = ws.policy(&format!(
        "[audit]\npath = \"audit.db\"\n[network]\nallow = [\"api.example.com\"]\nunlisted = \"approve\"\nlocal = [\"localhost:{}\"]\n",
        if port == 1 { 2 } else { port - 1 }
    ));
    let out = exec_python(
        &p,
        FETCH_AS_GIVEN,
        &[&format!("http://localhost:{port}/page")],
    );
    let body = String::from_utf8_lossy(&out.stdout);
    assert!(
        body.starts_with("HTTP 403 network.local_unlisted"),
        "{body}\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(
        body.contains(&format!("[network] local = [\"localhost:{port}\"]")),
        "the refusal names the key to add: {body}"
    );
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("network.local_unlisted") && err.contains("[network] local"),
        "mcpbox says it too: {err}"
    );
    let events = common::audit::events(&ws.path().join("audit.db"));
    let to = common::audit::network_to(&events, "localhost");
    assert_eq!(to.len(), 1, "{events:#?}");
    assert_eq!(to[0]["decision"], "deny", "{to:#?}");
    assert_eq!(to[0]["reason"], "network.local_unlisted", "{to:#?}");
    assert_eq!(to[0]["source"], "network.local", "{to:#?}");
}

#[test]
fn ip_literal_is_refused_unless_listed() {
    let port = upstream("should not be seen");
    let ws = Workspace::new();
    let body = fetch(&ws, &network(port), &format!("http://127.0.0.1:{port}/"));
    assert!(body.starts_with("HTTP 403"), "{body}");
}

/// Without proxy settings, the sandbox's loopback is its own (a direct
/// connection to the host's loopback port finds nothing), and an allowed
/// name goes through the transparent capture to the proxy (issue 31; it
/// used to fail with no resolver).
#[test]
fn direct_connection_to_loopback_stays_inside_and_a_name_goes_through_the_capture() {
    let port = upstream("through the capture");
    let ws = Workspace::new();
    let p = ws.policy(&format!("[audit]\npath = \"audit.db\"\n{}", network(port)));
    let script = format!(
        "import socket\nfor target in [('127.0.0.1', {port}), ('fetch.test', {port})]:\n    \
         try:\n        s = socket.create_connection(target, timeout=5)\n        \
         s.sendall(b'GET / HTTP/1.1\\r\\nHost: fetch.test\\r\\n\\r\\n')\n        \
         data = b''\n        \
         while chunk := s.recv(4096): data += chunk\n        \
         print('connected', target[0], data.split(b'\\r\\n\\r\\n', 1)[1].decode())\n    \
         except OSError as e:\n        print('refused', target[0], type(e).__name__)\n"
    );
    let out = exec_python(&p, &script, &[]);
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        stdout.contains("refused 127.0.0.1 ConnectionRefusedError"),
        "{stdout}"
    );
    assert!(
        stdout.contains("connected fetch.test through the capture"),
        "{stdout}"
    );
    assert!(audit(&ws).contains("\"CONNECT\""), "{}", audit(&ws));
}

#[test]
fn large_download_streams_through_the_proxy() {
    // 32 MiB from the host through bridge, unix socket and proxy.
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let port = listener.local_addr().unwrap().port();
    std::thread::spawn(move || {
        for conn in listener.incoming() {
            let Ok(mut conn) = conn else { continue };
            let mut buf = [0u8; 4096];
            let _ = conn.read(&mut buf);
            let size = 32usize << 20;
            let _ = write!(
                conn,
                "HTTP/1.1 200 OK\r\nContent-Length: {size}\r\nConnection: close\r\n\r\n"
            );
            let chunk = vec![b'x'; 1 << 20];
            for _ in 0..32 {
                if conn.write_all(&chunk).is_err() {
                    break;
                }
            }
        }
    });
    let ws = Workspace::new();
    let p = ws.policy(&format!("[audit]\npath = \"audit.db\"\n{}", network(port)));
    let script = format!(
        "import urllib.request\nn=0\nr=urllib.request.urlopen('http://fetch.test:{port}/big', timeout=30)\n\
         while True:\n    b=r.read(1<<16)\n    if not b: break\n    n+=len(b)\nprint(n)\n"
    );
    let out = exec_python(&p, &script, &[]);
    assert_eq!(
        String::from_utf8_lossy(&out.stdout).trim(),
        (32u64 << 20).to_string(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
}

#[test]
fn proxy_socket_directory_planted_by_another_user_is_refused() {
    if !common::is_root() {
        return; // only root can make a directory owned by someone else here
    }
    let ws = Workspace::new();
    let runtime = ws.path().join("runtime");
    std::fs::create_dir_all(runtime.join("mcpbox")).unwrap();
    // Another user got there first and owns the directory.
    std::os::unix::fs::chown(runtime.join("mcpbox"), Some(65534), Some(65534)).unwrap();
    let p = ws.policy(&format!("[audit]\npath = \"audit.db\"\n{}", network(8080)));
    let out = Command::new(mcpbox())
        .args(["exec", "--policy", p.to_str().unwrap(), "--", "true"])
        .env("XDG_RUNTIME_DIR", &runtime)
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(125));
    assert!(String::from_utf8_lossy(&out.stderr).contains("not a directory owned by this user"));
}

#[test]
fn egress_bridge_inside_the_sandbox_keeps_no_privileges() {
    // The bridge is our code, but it lives inside the sandbox next to the
    // server: it must hold nothing the server could borrow.
    let ws = Workspace::new();
    let p = ws.policy(&format!("[audit]\npath = \"audit.db\"\n{}", network(8080)));
    let script = "import os\nfor pid in sorted(int(p) for p in os.listdir('/proc') if p.isdigit()):\n    \
                  if pid in (1, os.getpid()): continue\n    \
                  s = dict(l.split(':', 1) for l in open(f'/proc/{pid}/status') if ':' in l)\n    \
                  print(pid, s['Name'].strip(), s['CapEff'].strip(), s['CapBnd'].strip(), s['NoNewPrivs'].strip(), s['Seccomp'].strip())\n";
    let out = exec_python(&p, script, &[]);
    let stdout = String::from_utf8_lossy(&out.stdout);
    let bridge: Vec<&str> = stdout.lines().filter(|l| l.contains(" mcpbox ")).collect();
    assert_eq!(bridge.len(), 1, "one bridge process expected: {stdout}");
    assert_eq!(
        bridge[0].split_whitespace().skip(2).collect::<Vec<_>>(),
        ["0000000000000000", "0000000000000000", "1", "2"],
        "bridge: {}",
        bridge[0]
    );
}
