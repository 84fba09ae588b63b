//! The in-sandbox bridge: TCP on loopback carried over the proxy's Unix socket.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use std::io::{Read, Write};
use std::net::{TcpListener, TcpStream};
use std::os::unix::net::UnixListener;
use std::sync::Arc;

use common::*;
use mcpbox_egress::*;

/// The bridge's sockets with `proxy` as its proxy listener; the capture
/// and resolver sockets are unused here (no namespace redirects to them).
fn sockets(proxy: TcpListener) -> mcpbox_egress::BridgeSockets {
    mcpbox_egress::BridgeSockets {
        proxy,
        capture: TcpListener::bind("127.0.0.1:0").unwrap(),
        dns_udp: std::net::UdpSocket::bind("127.0.0.1:0").unwrap(),
        dns_tcp: TcpListener::bind("127.0.0.1:0").unwrap(),
        // stands in for the NFLOG socket: nothing arrives on it
        nflog: std::net::UdpSocket::bind("127.0.0.1:0").unwrap().into(),
    }
}

#[test]
fn bridge_forwards_tcp_to_unix_socket() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("egress.sock");
    let unix = UnixListener::bind(&path).unwrap();
    std::thread::spawn(move || {
        for s in unix.incoming() {
            let mut s = s.unwrap();
            std::thread::spawn(move || {
                let mut r = s.try_clone().unwrap();
                let _ = std::io::copy(&mut r, &mut s);
                let _ = s.shutdown(std::net::Shutdown::Write);
            });
        }
    });
    let tcp = TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = tcp.local_addr().unwrap();
    let p = path.clone();
    std::thread::spawn(move || bridge(sockets(tcp), &p));
    for i in 0..3 {
        let mut s = TcpStream::connect(addr).unwrap();
        let msg = format!("through the bridge {i}");
        s.write_all(msg.as_bytes()).unwrap();
        s.shutdown(std::net::Shutdown::Write).unwrap();
        let mut got = String::new();
        s.read_to_string(&mut got).unwrap();
        assert_eq!(
            got, msg,
            "half-close passes through and the reply comes back"
        );
    }
}

#[test]
fn sandbox_path_reaches_proxy_through_bridge_and_unix_socket() {
    let port = echo_server();
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("egress.sock");
    let mut policy = TestPolicy::default();
    policy.allow.push("api.test".into());
    policy.mapped.insert("api.test".into(), loopback());
    let sink = Arc::new(MemSink::default());
    let proxy = Proxy::new(
        Arc::new(policy),
        Arc::new(FakeResolver::default()),
        Arc::new(RecordingConnector::default()),
        Arc::new(DenyAllApprover),
        sink.clone(),
        Ids::default(),
    );
    let unix = UnixListener::bind(&path).unwrap();
    let shutdown = Shutdown::new();
    let s2 = shutdown.clone();
    let server = std::thread::spawn(move || proxy.serve(unix, &s2));

    let tcp = TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = tcp.local_addr().unwrap();
    let p = path.clone();
    std::thread::spawn(move || bridge(sockets(tcp), &p));

    let (mut s, head) = connect(addr, &format!("api.test:{port}"));
    assert_eq!(status(&head), 200, "{head}");
    s.write_all(b"ping").unwrap();
    s.shutdown(std::net::Shutdown::Write).unwrap();
    assert_eq!(read_all(&mut s), b"ping");
    let (_, head) = connect(addr, "blocked.test:443");
    assert_eq!(status(&head), 403);
    assert_eq!(sink.wait_for(2).len(), 2);

    shutdown.trigger();
    server.join().unwrap().unwrap();
}
