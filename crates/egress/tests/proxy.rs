//! The proxy, attacked through its front door on loopback. Refusal tests use
//! a resolver that returns inside addresses and a connector that records
//! attempts, so a bug can never send a packet off this machine.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use std::collections::HashMap;
use std::io::{Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::sync::mpsc;
use std::time::Duration;

use common::*;
use mcpbox_audit::{Kind, Verdict};
use mcpbox_egress::*;
use mcpbox_policy::NetworkAnswer;
use serde_json::json;

fn allow(hosts: &[&str]) -> TestPolicy {
    TestPolicy {
        allow: hosts.iter().map(|h| h.to_string()).collect(),
        ..TestPolicy::default()
    }
}

fn allow_mapped(hosts: &[&str]) -> TestPolicy {
    let mut p = allow(hosts);
    for h in hosts {
        p.mapped.insert(h.to_string(), loopback());
    }
    p
}

fn resolver(entries: &[(&str, &[&str])]) -> FakeResolver {
    let mut answers = HashMap::new();
    for (name, ips) in entries {
        answers.insert(name.to_string(), vec![ips.iter().map(|s| ip(s)).collect()]);
    }
    FakeResolver {
        answers,
        ..FakeResolver::default()
    }
}

#[test]
fn allowed_name_reaches_local_server() {
    let port = echo_server();
    let h = start(allow_mapped(&["api.test"]), FakeResolver::default());
    let (mut s, head) = connect(h.addr, &format!("api.test:{port}"));
    assert_eq!(status(&head), 200, "{head}");
    s.write_all(b"hello").unwrap();
    s.shutdown(std::net::Shutdown::Write).unwrap();
    assert_eq!(read_all(&mut s), b"hello");

    let events = h.sink.wait_for(1);
    let e = &events[0];
    assert_eq!(e.kind, Some(Kind::Network));
    assert_eq!(e.decision, Some(Verdict::Allow));
    assert_eq!(e.source.as_deref(), Some("policy:network.allow[0]"));
    assert_eq!((e.sandbox_id.as_str(), e.server.as_str()), ("sb-1", "srv"));
    assert_eq!(detail(e, "host"), "api.test");
    assert_eq!(detail(e, "address"), &json!(format!("127.0.0.1:{port}")));
    assert_eq!(detail(e, "mapped"), true);
    assert_eq!(detail(e, "bytes_up"), 5);
    assert_eq!(detail(e, "bytes_down"), 5);
    assert!(
        h.resolver.calls.lock().unwrap().is_empty(),
        "a mapping never asks dns"
    );
}

/// `network.local`: a loopback host on an opened port reaches the host's
/// loopback without DNS and without the loopback refusal, and its record
/// says so.
#[test]
fn a_local_port_reaches_the_hosts_loopback_without_dns() {
    let port = echo_server();
    let mut p = allow(&[]);
    p.local.insert("localhost".into(), vec![loopback()]);
    let h = start(p, FakeResolver::default());
    let (mut s, head) = connect(h.addr, &format!("localhost:{port}"));
    assert_eq!(status(&head), 200, "{head}");
    s.write_all(b"hi").unwrap();
    s.shutdown(std::net::Shutdown::Write).unwrap();
    assert_eq!(read_all(&mut s), b"hi");
    let e = &h.sink.wait_for(1)[0];
    assert_eq!(e.decision, Some(Verdict::Allow));
    assert_eq!(e.reason.as_deref(), Some("network.local"));
    assert_eq!(detail(e, "local"), true);
    assert_eq!(detail(e, "address"), &json!(format!("127.0.0.1:{port}")));
    assert!(h.resolver.calls.lock().unwrap().is_empty());
}

/// `network.local` opens the host's loopback and nothing else: an address
/// that is not loopback, whatever the policy implementation answered, is
/// refused before any connection.
#[test]
fn a_local_entry_never_leads_off_the_loopback() {
    let mut p = allow(&[]);
    p.local.insert("localhost".into(), vec![ip("10.0.0.5")]);
    let h = start(p, FakeResolver::default());
    let (mut s, head) = connect(h.addr, "localhost:8080");
    assert_eq!(status(&head), 403, "{head}");
    let _ = read_all(&mut s);
    assert!(h.connector.attempts.lock().unwrap().is_empty());
    let e = &h.sink.wait_for(1)[0];
    assert_eq!(e.decision, Some(Verdict::Deny));
}

#[test]
fn unlisted_name_is_refused_with_reason() {
    let h = start(
        allow(&["api.test"]),
        resolver(&[("other.test", &["1.1.1.1"])]),
    );
    let (mut s, head) = connect(h.addr, "other.test:443");
    assert_eq!(status(&head), 403, "{head}");
    assert_eq!(header(&head, "X-Mcpbox-Reason"), Some("network.unlisted"));
    let _ = read_all(&mut s);
    assert!(
        h.resolver.calls.lock().unwrap().is_empty(),
        "refused before resolution"
    );
    assert!(h.connector.attempts.lock().unwrap().is_empty());
    let e = &h.sink.wait_for(1)[0];
    assert_eq!(e.decision, Some(Verdict::Deny));
    assert_eq!(e.reason.as_deref(), Some("network.unlisted"));
}

/// A client that exits as soon as it reads its 403 (npm does) may take the
/// whole sandbox, and mcpbox, down with it: the refusal must be on record
/// before the client can read it.
#[test]
fn refusal_is_recorded_before_the_client_reads_it() {
    let h = start(allow(&["api.test"]), FakeResolver::default());
    for round in 0..20 {
        let (mut s, head) = connect(h.addr, "other.test:443");
        assert_eq!(status(&head), 403, "{head}");
        let _ = read_all(&mut s);
        let events = h.sink.events.lock().unwrap().clone();
        assert_eq!(events.len(), round + 1, "the refusal was not recorded yet");
        assert_eq!(events[round].reason.as_deref(), Some("network.unlisted"));
    }
}

/// Stopping the proxy waits for what it accepted to be recorded.
#[test]
fn drain_waits_for_accepted_connections_to_be_recorded() {
    let h = start(allow(&["api.test"]), FakeResolver::default());
    let mut s = std::net::TcpStream::connect(h.addr).unwrap();
    // accepted, but its head is not complete: the handler is still reading
    s.write_all(b"CONNECT other.test:443 HTTP/1.1\r\n").unwrap();
    std::thread::sleep(Duration::from_millis(100));
    h.shutdown.trigger();
    assert!(
        !h.shutdown.drain(Duration::from_millis(50)),
        "still reading"
    );
    s.write_all(b"\r\n").unwrap();
    assert!(h.shutdown.drain(Duration::from_secs(20)));
    assert_eq!(h.sink.events.lock().unwrap().len(), 1);
}

#[test]
fn name_resolving_to_private_address_is_refused() {
    let cases: [(&str, &[&str], &str); 6] = [
        ("lan.test", &["10.0.0.7"], "network.private_address"),
        (
            "mixed.test",
            &["1.1.1.1", "192.168.1.10"],
            "network.private_address",
        ),
        ("cgnat.test", &["100.64.3.4"], "network.private_address"),
        ("ula.test", &["fd12:3456::1"], "network.private_address"),
        (
            "mapped.test",
            &["::ffff:172.16.0.1"],
            "network.private_address",
        ),
        ("lo.test", &["127.0.0.1"], "network.loopback_address"),
    ];
    let names: Vec<&str> = cases.iter().map(|c| c.0).collect();
    let entries: Vec<(&str, &[&str])> = cases.iter().map(|c| (c.0, c.1)).collect();
    let h = start(allow(&names), resolver(&entries));
    for (name, _, reason) in cases {
        let (_, head) = connect(h.addr, &format!("{name}:443"));
        assert_eq!(status(&head), 403, "{name}: {head}");
        assert_eq!(header(&head, "X-Mcpbox-Reason"), Some(reason), "{name}");
        assert_eq!(
            header(&head, "X-Mcpbox-Source"),
            Some("egress:address_guard")
        );
    }
    assert!(
        h.connector.attempts.lock().unwrap().is_empty(),
        "no connection attempt to a refused address"
    );
}

#[test]
fn name_resolving_to_metadata_address_is_refused() {
    let h = start(
        allow(&[
            "aws.test",
            "aws6.test",
            "ali.test",
            "metadata.google.internal",
        ]),
        resolver(&[
            ("aws.test", &["169.254.169.254"]),
            ("aws6.test", &["fd00:ec2::254"]),
            ("ali.test", &["100.100.100.200"]),
            ("metadata.google.internal", &["1.1.1.1"]),
        ]),
    );
    for name in [
        "aws.test",
        "aws6.test",
        "ali.test",
        "metadata.google.internal",
        "METADATA.google.internal.",
    ] {
        let (_, head) = connect(h.addr, &format!("{name}:80"));
        assert_eq!(status(&head), 403, "{name}: {head}");
        assert_eq!(
            header(&head, "X-Mcpbox-Reason"),
            Some("network.metadata_endpoint"),
            "{name}"
        );
    }
    assert!(h.connector.attempts.lock().unwrap().is_empty());
    assert!(
        !h.resolver
            .calls
            .lock()
            .unwrap()
            .iter()
            .any(|n| n.contains("metadata")),
        "a metadata name is refused before resolution"
    );
}

/// `rebind.test`: public at the first lookup, loopback at every later one.
fn rebinding_resolver() -> FakeResolver {
    let mut answers = HashMap::new();
    answers.insert(
        "rebind.test".to_string(),
        vec![vec![ip("1.1.1.1")], vec![ip("127.0.0.1")]],
    );
    FakeResolver {
        answers,
        ..FakeResolver::default()
    }
}

#[test]
fn dns_rebinding_second_answer_is_never_used() {
    let port = echo_server();
    let h = start(allow(&["rebind.test"]), rebinding_resolver());
    *h.connector.redirect.lock().unwrap() = Some(SocketAddr::new(loopback(), port));
    let (mut s, head) = connect(h.addr, &format!("rebind.test:{port}"));
    assert_eq!(status(&head), 200, "{head}");
    s.write_all(b"x").unwrap();
    s.shutdown(std::net::Shutdown::Write).unwrap();
    assert_eq!(read_all(&mut s), b"x");
    assert_eq!(
        *h.resolver.calls.lock().unwrap(),
        vec!["rebind.test".to_string()]
    );
    assert_eq!(
        *h.connector.attempts.lock().unwrap(),
        vec![SocketAddr::new(ip("1.1.1.1"), port)],
        "the connector got exactly the checked address"
    );
    let e = &h.sink.wait_for(1)[0];
    assert_eq!(detail(e, "address"), &json!(format!("1.1.1.1:{port}")));
}

#[test]
fn ip_literal_is_refused_unless_listed() {
    let port = echo_server();
    let h = start(
        allow(&["1.1.1.1", "10.0.0.1", "2606:4700::1111"]),
        FakeResolver::default(),
    );
    *h.connector.redirect.lock().unwrap() = Some(SocketAddr::new(loopback(), port));

    let (_, head) = connect(h.addr, "9.9.9.9:443");
    assert_eq!(status(&head), 403);
    assert_eq!(header(&head, "X-Mcpbox-Reason"), Some("network.unlisted"));

    // Listed, but private: the guard applies to literals too.
    let (_, head) = connect(h.addr, "10.0.0.1:443");
    assert_eq!(
        header(&head, "X-Mcpbox-Reason"),
        Some("network.private_address")
    );
    // A different spelling of a private literal is not the listed one.
    let (_, head) = connect(h.addr, "[::ffff:10.0.0.1]:443");
    assert_eq!(status(&head), 403);
    // A numeric name that a resolver would read as 127.0.0.1 is malformed.
    let (_, head) = connect(h.addr, "2130706433:443");
    assert_eq!(status(&head), 400);
    assert!(h.connector.attempts.lock().unwrap().is_empty());

    let (_, head) = connect(h.addr, &format!("1.1.1.1:{port}"));
    assert_eq!(status(&head), 200, "{head}");
    let (_, head) = connect(h.addr, &format!("[2606:4700::1111]:{port}"));
    assert_eq!(status(&head), 200, "{head}");
    assert!(
        h.resolver.calls.lock().unwrap().is_empty(),
        "literals are never resolved"
    );
}

/// A server that counts what it receives and reports it when the peer closes.
fn counting_server() -> (u16, mpsc::Receiver<Vec<u8>>) {
    let l = TcpListener::bind("127.0.0.1:0").unwrap();
    let port = l.local_addr().unwrap().port();
    let (tx, rx) = mpsc::channel();
    std::thread::spawn(move || {
        for s in l.incoming() {
            let mut s = s.unwrap();
            let tx = tx.clone();
            std::thread::spawn(move || tx.send(read_all(&mut s)).unwrap());
        }
    });
    (port, rx)
}

#[test]
fn connect_sni_mismatch_is_refused() {
    let (port, received) = counting_server();
    let h = start(allow_mapped(&["good.test"]), FakeResolver::default());
    let (mut s, head) = connect(h.addr, &format!("good.test:{port}"));
    assert_eq!(status(&head), 200);
    s.write_all(&client_hello(Some("evil.test"))).unwrap();
    assert_eq!(
        read_all(&mut s),
        ALERT_ACCESS_DENIED,
        "the tls client gets an access_denied alert"
    );
    let got = received.recv_timeout(Duration::from_secs(20)).unwrap();
    assert!(
        got.is_empty(),
        "not one byte of the fronted hello went upstream"
    );
    let e = &h.sink.wait_for(1)[0];
    assert_eq!(e.decision, Some(Verdict::Deny));
    assert_eq!(e.reason.as_deref(), Some("network.sni_mismatch"));
    assert_eq!(e.source.as_deref(), Some("egress:sni_check"));
    assert_eq!(detail(e, "sni"), "evil.test");
}

#[test]
fn connect_sni_match_is_relayed() {
    let port = echo_server();
    let h = start(allow_mapped(&["good.test"]), FakeResolver::default());
    let (mut s, head) = connect(h.addr, &format!("good.test:{port}"));
    assert_eq!(status(&head), 200);
    let hello = client_hello(Some("GOOD.test"));
    // Sent in two pieces: the proxy must wait for the whole hello.
    s.write_all(&hello[..7]).unwrap();
    std::thread::sleep(Duration::from_millis(20));
    s.write_all(&hello[7..]).unwrap();
    s.shutdown(std::net::Shutdown::Write).unwrap();
    assert_eq!(read_all(&mut s), hello);
    let e = &h.sink.wait_for(1)[0];
    assert_eq!(e.decision, Some(Verdict::Allow));
    assert_eq!(detail(e, "sni"), "good.test");
}

#[test]
fn large_download_streams_without_buffering() {
    const FIRST: usize = 1 << 20;
    const TOTAL: u64 = 256 << 20;
    assert_eq!(RELAY_BUFFER, 64 * 1024);
    let l = TcpListener::bind("127.0.0.1:0").unwrap();
    let port = l.local_addr().unwrap().port();
    let (got_first_tx, got_first_rx) = mpsc::channel::<()>();
    std::thread::spawn(move || {
        let (mut s, _) = l.accept().unwrap();
        let chunk = vec![0x5au8; 1 << 20];
        s.write_all(&chunk[..FIRST]).unwrap();
        // The rest is sent only once the client holds the first MiB: a proxy
        // that buffered the whole body would never get here (deadlock guard).
        got_first_rx.recv_timeout(Duration::from_secs(30)).unwrap();
        let mut left = TOTAL - FIRST as u64;
        while left > 0 {
            let n = left.min(chunk.len() as u64) as usize;
            s.write_all(&chunk[..n]).unwrap();
            left -= n as u64;
        }
    });
    let h = start(allow_mapped(&["big.test"]), FakeResolver::default());
    let (mut s, head) = connect(h.addr, &format!("big.test:{port}"));
    assert_eq!(status(&head), 200);
    let mut buf = vec![0u8; 1 << 16];
    let mut total = 0u64;
    let mut signalled = false;
    loop {
        let n = s.read(&mut buf).unwrap();
        if n == 0 {
            break;
        }
        total += n as u64;
        if !signalled && total >= FIRST as u64 {
            got_first_tx.send(()).unwrap();
            signalled = true;
        }
    }
    assert_eq!(total, TOTAL);
    drop(s);
    let e = &h.sink.wait_for(1)[0];
    assert_eq!(detail(e, "bytes_down"), TOTAL);
}

#[test]
fn many_concurrent_connections_work() {
    const N: usize = 200;
    let port = echo_server();
    let h = start(allow_mapped(&["echo.test"]), FakeResolver::default());
    let mut open = Vec::new();
    for _ in 0..N {
        let (s, head) = connect(h.addr, &format!("echo.test:{port}"));
        assert_eq!(status(&head), 200);
        open.push(s);
    }
    // All N tunnels are open at once; each carries its own bytes.
    for (i, s) in open.iter_mut().enumerate() {
        s.write_all(format!("msg-{i:04}").as_bytes()).unwrap();
    }
    for (i, s) in open.iter_mut().enumerate() {
        let mut b = [0u8; 8];
        s.read_exact(&mut b).unwrap();
        assert_eq!(&b, format!("msg-{i:04}").as_bytes());
    }
    drop(open);
    assert_eq!(h.sink.wait_for(N).len(), N);
}

/// A one-shot HTTP server: reports the request head it got, answers `body`.
fn http_server(body: &'static [u8]) -> (u16, mpsc::Receiver<String>) {
    let l = TcpListener::bind("127.0.0.1:0").unwrap();
    let port = l.local_addr().unwrap().port();
    let (tx, rx) = mpsc::channel();
    std::thread::spawn(move || {
        for s in l.incoming() {
            let mut s = s.unwrap();
            let head = read_head(&mut s);
            tx.send(head).unwrap();
            write!(
                s,
                "HTTP/1.1 200 OK\r\nContent-Length: {}\r\nConnection: close\r\n\r\n",
                body.len()
            )
            .unwrap();
            s.write_all(body).unwrap();
        }
    });
    (port, rx)
}

fn get(proxy: SocketAddr, url: &str, extra: &str) -> String {
    let mut s = TcpStream::connect(proxy).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(20))).unwrap();
    write!(s, "GET {url} HTTP/1.1\r\n{extra}\r\n").unwrap();
    String::from_utf8_lossy(&read_all(&mut s)).into_owned()
}

#[test]
fn plain_http_request_is_forwarded_in_origin_form() {
    let (port, heads) = http_server(b"ok");
    let h = start(allow_mapped(&["web.test"]), FakeResolver::default());
    let resp = get(
        h.addr,
        &format!("http://Web.Test:{port}/a/b?c=1"),
        "Host: elsewhere.test\r\nProxy-Authorization: Basic Zm9vOmJhcg==\r\nProxy-Connection: keep-alive\r\nConnection: keep-alive, X-Hop\r\nX-Hop: 1\r\nX-Keep: yes\r\n",
    );
    assert!(resp.starts_with("HTTP/1.1 200 OK"), "{resp}");
    assert!(resp.ends_with("ok"));
    let upstream = heads.recv_timeout(Duration::from_secs(20)).unwrap();
    assert_eq!(
        upstream,
        format!("GET /a/b?c=1 HTTP/1.1\r\nHost: web.test:{port}\r\nX-Keep: yes\r\nConnection: close\r\n\r\n")
    );
    let e = &h.sink.wait_for(1)[0];
    assert_eq!(detail(e, "method"), "GET");
    assert_eq!(
        detail(e, "bytes_down").as_u64().unwrap() as usize,
        resp.len()
    );
}

#[test]
fn npm_tarball_request_is_recorded_by_package() {
    let (port, _heads) = http_server(b"tarball");
    let h = start(
        allow_mapped(&["registry.npmjs.org"]),
        FakeResolver::default(),
    );
    let resp = get(
        h.addr,
        &format!("http://registry.npmjs.org:{port}/left-pad/-/left-pad-1.3.0.tgz"),
        "",
    );
    assert!(resp.ends_with("tarball"), "{resp}");
    let e = &h.sink.wait_for(1)[0];
    assert_eq!(detail(e, "registry"), "npm");
    assert_eq!(
        detail(e, "package"),
        &json!({"ecosystem": "npm", "name": "left-pad", "version": "1.3.0"})
    );
}

#[test]
fn pip_wheel_request_is_recorded_by_package() {
    let (port, _heads) = http_server(b"wheel");
    let h = start(
        allow_mapped(&["files.pythonhosted.org"]),
        FakeResolver::default(),
    );
    let url = format!("http://files.pythonhosted.org:{port}/packages/3b/1a/0c9f/mcp_server_fetch-0.6.2-py3-none-any.whl");
    assert!(get(h.addr, &url, "").ends_with("wheel"));
    let e = &h.sink.wait_for(1)[0];
    assert_eq!(
        detail(e, "package"),
        &json!({"ecosystem": "pypi", "name": "mcp_server_fetch", "version": "0.6.2"})
    );
}

#[test]
fn tls_tunnel_to_registry_records_host_only() {
    let port = echo_server();
    let h = start(
        allow_mapped(&["registry.npmjs.org"]),
        FakeResolver::default(),
    );
    let (_, head) = connect(h.addr, &format!("registry.npmjs.org:{port}"));
    assert_eq!(status(&head), 200);
    let e = &h.sink.wait_for(1)[0];
    assert_eq!(detail(e, "registry"), "npm");
    assert!(detail(e, "package").is_null());
    assert!(detail(e, "package_note").is_string());
}

#[test]
fn approval_once_allows_only_one_connection() {
    let port = echo_server();
    let mut policy = TestPolicy {
        ask_unlisted: true,
        ..TestPolicy::default()
    };
    policy.mapped.insert("new.test".into(), loopback());
    let approver = FakeApprover::default();
    approver
        .answers
        .lock()
        .unwrap()
        .extend([NetworkAnswer::Once, NetworkAnswer::Declined]);
    let h = start_with(policy, FakeResolver::default(), approver);
    let (_, head) = connect(h.addr, &format!("new.test:{port}"));
    assert_eq!(status(&head), 200);
    let (_, head) = connect(h.addr, &format!("new.test:{port}"));
    assert_eq!(status(&head), 403);
    assert_eq!(
        header(&head, "X-Mcpbox-Reason"),
        Some("network.approval_denied")
    );
    assert_eq!(
        h.approver.asked.lock().unwrap().len(),
        2,
        "once is not remembered"
    );
    let events = h.sink.wait_for(2);
    assert!(events.iter().any(|e| e.decision == Some(Verdict::Approve)));
}

#[test]
fn approval_for_session_is_remembered_per_host_and_port() {
    let port = echo_server();
    let mut policy = TestPolicy {
        ask_unlisted: true,
        ..TestPolicy::default()
    };
    policy.mapped.insert("new.test".into(), loopback());
    let approver = FakeApprover::default();
    approver
        .answers
        .lock()
        .unwrap()
        .push_back(NetworkAnswer::Session);
    let h = start_with(policy, FakeResolver::default(), approver);
    for _ in 0..3 {
        let (_, head) = connect(h.addr, &format!("new.test:{port}"));
        assert_eq!(status(&head), 200);
    }
    assert_eq!(h.approver.asked.lock().unwrap().len(), 1);
    // Another port is another question (and is denied by the empty script).
    let (_, head) = connect(h.addr, "new.test:1");
    assert_eq!(status(&head), 403);
    assert_eq!(h.approver.asked.lock().unwrap().len(), 2);
}

#[test]
fn denial_response_names_rule_and_reason() {
    let h = start(allow(&["api.test"]), FakeResolver::default());
    let (mut s, head) = connect(h.addr, "blocked.test:443");
    assert!(head.starts_with("HTTP/1.1 403 Forbidden\r\n"), "{head}");
    assert_eq!(header(&head, "X-Mcpbox-Reason"), Some("network.unlisted"));
    assert_eq!(
        header(&head, "X-Mcpbox-Source"),
        Some("policy:network.unlisted")
    );
    assert_eq!(header(&head, "X-Mcpbox-Fault"), Some("policy"));
    let body = String::from_utf8(read_all(&mut s)).unwrap();
    assert_eq!(
        header(&head, "Content-Length")
            .unwrap()
            .parse::<usize>()
            .unwrap(),
        body.len()
    );
    assert!(body.contains("blocked.test:443"), "{body}");
    assert!(
        body.contains("policy:network.unlisted") && body.contains("network.unlisted"),
        "{body}"
    );
    let e = &h.sink.wait_for(1)[0];
    assert_eq!(e.decision, Some(Verdict::Deny));
    assert_eq!(e.reason.as_deref(), Some("network.unlisted"));
    assert_eq!(e.source.as_deref(), Some("policy:network.unlisted"));
    assert_eq!(detail(e, "status"), 403);
}

#[test]
fn malformed_request_is_the_clients_fault() {
    let h = start(allow(&["api.test"]), FakeResolver::default());
    for req in [
        "CONNECT user@api.test:443 HTTP/1.1\r\n\r\n",
        "GET /relative HTTP/1.1\r\nHost: api.test\r\n\r\n",
        "GET http://api.test/ HTTP/1.1\r\nX : y\r\n\r\n",
        "POST http://api.test/ HTTP/1.1\r\nContent-Length: 3\r\nTransfer-Encoding: chunked\r\n\r\n",
    ] {
        let mut s = TcpStream::connect(h.addr).unwrap();
        s.write_all(req.as_bytes()).unwrap();
        let head = read_head(&mut s);
        assert_eq!(status(&head), 400, "{req:?}");
        assert_eq!(header(&head, "X-Mcpbox-Fault"), Some("client"));
    }
    assert!(h.connector.attempts.lock().unwrap().is_empty());
}

/// Request smuggling shapes that an upstream and the proxy could frame
/// differently never reach an upstream: a repeated or non-numeric
/// Content-Length, a bare LF line end, too many fields.
#[test]
fn smuggling_heads_never_reach_an_upstream() {
    let h = start(
        allow(&["api.test"]),
        resolver(&[("api.test", &["1.1.1.1"])]),
    );
    let many: String = (0..200).map(|i| format!("X-{i}: v\r\n")).collect();
    for req in [
        "POST http://api.test/ HTTP/1.1\r\nContent-Length: 3\r\nContent-Length: 3\r\n\r\nabc"
            .to_string(),
        "POST http://api.test/ HTTP/1.1\r\nContent-Length: 3, 3\r\n\r\nabc".to_string(),
        "GET http://api.test/ HTTP/1.1\r\nX: y\nHost: api.test\r\n\r\n".to_string(),
        format!("GET http://api.test/ HTTP/1.1\r\n{many}\r\n"),
    ] {
        let mut s = TcpStream::connect(h.addr).unwrap();
        s.write_all(req.as_bytes()).unwrap();
        let head = read_head(&mut s);
        assert_eq!(status(&head), 400, "{req:?}");
        assert_eq!(header(&head, "X-Mcpbox-Fault"), Some("client"));
    }
    assert!(h.connector.attempts.lock().unwrap().is_empty());
}

#[test]
fn unreachable_upstream_is_a_502_naming_the_upstream() {
    let h = start(
        allow(&["down.test", "nxdomain.test"]),
        resolver(&[("down.test", &["1.1.1.1"])]),
    );
    // No redirect: the recording connector refuses, as an unreachable host would.
    let (_, head) = connect(h.addr, "down.test:443");
    assert_eq!(status(&head), 502);
    assert_eq!(
        header(&head, "X-Mcpbox-Reason"),
        Some("upstream.connect_failed")
    );
    assert_eq!(header(&head, "X-Mcpbox-Fault"), Some("upstream"));
    let (_, head) = connect(h.addr, "nxdomain.test:443");
    assert_eq!(status(&head), 502);
    assert_eq!(
        header(&head, "X-Mcpbox-Reason"),
        Some("upstream.resolve_failed")
    );
    assert_eq!(
        *h.connector.attempts.lock().unwrap(),
        vec!["1.1.1.1:443".parse().unwrap()]
    );
}

#[test]
fn shutdown_stops_serving() {
    let policy = allow(&[]);
    let sink = std::sync::Arc::new(MemSink::default());
    let proxy = Proxy::new(
        std::sync::Arc::new(policy),
        std::sync::Arc::new(FakeResolver::default()),
        std::sync::Arc::new(RecordingConnector::default()),
        std::sync::Arc::new(DenyAllApprover),
        sink,
        Ids::default(),
    );
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let shutdown = Shutdown::new();
    let s = shutdown.clone();
    let t = std::thread::spawn(move || proxy.serve(listener, &s));
    shutdown.trigger();
    t.join().unwrap().unwrap();
}

/// Asks as the sandbox's resolver does (`RESOLVE name`, bridge.rs).
fn resolve(proxy: SocketAddr, name: &str) -> String {
    let mut s = TcpStream::connect(proxy).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(20))).unwrap();
    write!(s, "{RESOLVE_METHOD} {name} HTTP/1.1\r\n\r\n").unwrap();
    read_head(&mut s)
}

/// The sandbox's resolver gets a name's real, public IPv4 addresses (what
/// a program's own address checks expect to see), never an address inside:
/// a name that resolves to one is refused as its connection would be.
#[test]
fn the_sandbox_resolver_gets_public_addresses_and_never_one_inside() {
    let h = start(
        allow(&["pub.test", "lan.test", "lo.test", "mixed.test", "v6.test"]),
        resolver(&[
            ("pub.test", &["1.1.1.1", "2606:4700::1111", "1.0.0.1"]),
            ("lan.test", &["10.0.0.7"]),
            ("lo.test", &["127.0.0.1"]),
            ("mixed.test", &["1.1.1.1", "169.254.169.254"]),
            ("v6.test", &["2606:4700::1111"]),
        ]),
    );
    let head = resolve(h.addr, "pub.test");
    assert_eq!(status(&head), 200, "{head}");
    assert_eq!(
        header(&head, RESOLVED_HEADER),
        Some("1.1.1.1,1.0.0.1"),
        "IPv4 only, in order"
    );
    // No IPv4 address: the bridge gives it a synthetic one.
    let head = resolve(h.addr, "v6.test");
    assert_eq!(header(&head, RESOLVED_HEADER), Some(""), "{head}");
    for (name, reason) in [
        ("lan.test", "network.private_address"),
        ("lo.test", "network.loopback_address"),
        ("mixed.test", "network.metadata_endpoint"),
    ] {
        let head = resolve(h.addr, name);
        assert_eq!(status(&head), 403, "{name}: {head}");
        assert_eq!(header(&head, "X-Mcpbox-Reason"), Some(reason), "{name}");
        assert_eq!(header(&head, RESOLVED_HEADER), None);
    }
    // An allowed answer leaves no record; each refusal leaves one.
    let events = h.sink.wait_for(3);
    assert_eq!(events.len(), 3);
    assert!(events.iter().all(|e| e.decision == Some(Verdict::Deny)));
    assert!(h.connector.attempts.lock().unwrap().is_empty());
}

/// A refused name, a mapped one and one only a human can allow are never
/// looked up on the host: a lookup is itself a message to whoever runs the
/// name's DNS (a server could spell a secret into a name of its own), and
/// a mapping is the user's answer already.
#[test]
fn the_sandbox_resolver_looks_up_nothing_a_connection_could_not_reach_unasked() {
    let mut policy = allow_mapped(&["dev.test"]);
    policy.ask_unlisted = true;
    let h = start(policy, resolver(&[]));
    let head = resolve(h.addr, "dev.test");
    assert_eq!(header(&head, RESOLVED_HEADER), Some(""), "{head}");
    let head = resolve(h.addr, "c2VjcmV0.attacker.test");
    assert_eq!(status(&head), 200, "{head}");
    assert_eq!(header(&head, RESOLVED_HEADER), Some(""));
    assert!(h.resolver.calls.lock().unwrap().is_empty());
    assert!(
        h.approver.asked.lock().unwrap().is_empty(),
        "a lookup asks no human"
    );

    let h = start(allow(&["api.test"]), resolver(&[]));
    let head = resolve(h.addr, "c2VjcmV0.attacker.test");
    assert_eq!(status(&head), 403, "{head}");
    assert_eq!(header(&head, "X-Mcpbox-Reason"), Some("network.unlisted"));
    assert!(h.resolver.calls.lock().unwrap().is_empty());
    let head = resolve(h.addr, "127.0.0.1");
    assert_eq!(status(&head), 403, "{head}");
}

/// DNS rebinding through the sandbox's resolver: the name looked public
/// when the sandbox asked, then points inside; the connection that follows
/// is decided by the name, resolved again and refused.
#[test]
fn dns_rebinding_after_the_sandbox_lookup_is_refused_at_connect() {
    let h = start(allow(&["rebind.test"]), rebinding_resolver());
    let head = resolve(h.addr, "rebind.test");
    assert_eq!(header(&head, RESOLVED_HEADER), Some("1.1.1.1"), "{head}");
    let (_, head) = connect(h.addr, "rebind.test:443");
    assert_eq!(status(&head), 403, "{head}");
    assert_eq!(
        header(&head, "X-Mcpbox-Reason"),
        Some("network.loopback_address")
    );
    assert!(h.connector.attempts.lock().unwrap().is_empty());
}
