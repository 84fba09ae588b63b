//! The in-sandbox bridge: TCP on loopback carried over the proxy's Unix socket.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::os::unix::net::UnixListener;
use std::sync::Arc;

use common::*;
use mcpbox_egress::*;

/// A proxy on a Unix socket under `dir`, and a bridge in front of it.
fn proxy_and_bridge(
    dir: &std::path::Path,
    policy: TestPolicy,
) -> (SocketAddr, Arc<MemSink>, std::path::PathBuf, Shutdown) {
    let path = dir.join("egress.sock");
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
    std::thread::spawn(move || proxy.serve(unix, &s2));
    let tcp = TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = tcp.local_addr().unwrap();
    let p = path.clone();
    std::thread::spawn(move || bridge(tcp, &p));
    (addr, sink, path, shutdown)
}

#[test]
fn bridge_hands_each_connection_to_the_unix_socket_with_one_marker_byte() {
    // What the proxy receives: one byte and the accepted socket itself, so
    // that it reads and writes the sandbox's connection directly.
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("egress.sock");
    let unix = UnixListener::bind(&path).unwrap();
    let tcp = TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = tcp.local_addr().unwrap();
    let p = path.clone();
    std::thread::spawn(move || bridge(tcp, &p));
    for i in 0..3 {
        let mut s = TcpStream::connect(addr).unwrap();
        let (conn, _) = unix.accept().unwrap();
        let mut space = [std::mem::MaybeUninit::uninit(); rustix::cmsg_space!(ScmRights(1))];
        let mut control = rustix::net::RecvAncillaryBuffer::new(&mut space);
        let mut byte = [9u8; 1];
        let got = rustix::net::recvmsg(
            &conn,
            &mut [std::io::IoSliceMut::new(&mut byte)],
            &mut control,
            rustix::net::RecvFlags::CMSG_CLOEXEC,
        )
        .unwrap();
        assert_eq!((got.bytes, byte[0]), (1, 0), "one NUL marker byte");
        let mut fds = Vec::new();
        for m in control.drain() {
            if let rustix::net::RecvAncillaryMessage::ScmRights(f) = m {
                fds.extend(f);
            }
        }
        assert_eq!(fds.len(), 1, "exactly one descriptor");
        let mut handed = TcpStream::from(fds.pop().unwrap());
        let msg = format!("through the handoff {i}");
        s.write_all(msg.as_bytes()).unwrap();
        s.shutdown(std::net::Shutdown::Write).unwrap();
        let mut got = String::new();
        handed.read_to_string(&mut got).unwrap();
        assert_eq!(got, msg, "the bridge keeps no copy that could hold it open");
        handed.write_all(b"reply").unwrap();
        drop(handed);
        let mut back = String::new();
        s.read_to_string(&mut back).unwrap();
        assert_eq!(back, "reply");
        let mut rest = Vec::new();
        let mut conn = conn;
        conn.read_to_end(&mut rest).unwrap();
        assert!(rest.is_empty(), "nothing else crosses the unix socket");
    }
}

#[test]
fn a_handed_over_tunnel_passes_half_close_both_ways_and_counts_bytes() {
    let port = echo_server();
    let dir = tempfile::tempdir().unwrap();
    let mut policy = TestPolicy::default();
    policy.allow.push("api.test".into());
    policy.mapped.insert("api.test".into(), loopback());
    let (addr, sink, _path, shutdown) = proxy_and_bridge(dir.path(), policy);
    let (mut s, head) = connect(addr, &format!("api.test:{port}"));
    assert_eq!(status(&head), 200, "{head}");
    let data: Vec<u8> = (0..3_000_000u32).map(|i| (i * 7 % 253) as u8).collect();
    let mut w = s.try_clone().unwrap();
    let sent = data.clone();
    let writer = std::thread::spawn(move || {
        w.write_all(&sent).unwrap();
        w.shutdown(std::net::Shutdown::Write).unwrap();
    });
    // The echo server answers until it reads end of file, then closes: the
    // client's half-close went upstream, and the upstream's came back.
    let got = read_all(&mut s);
    writer.join().unwrap();
    assert!(got == data, "the echo came back whole and in order");
    let rec = sink.wait_for(1).pop().unwrap();
    assert_eq!(rec.detail["bytes_up"], data.len() as u64);
    assert_eq!(rec.detail["bytes_down"], data.len() as u64);
    shutdown.trigger();
}

#[test]
fn a_forged_handoff_from_inside_the_sandbox_is_refused_as_a_malformed_request() {
    // Anything in the sandbox can connect to the proxy's socket. A marker
    // byte with a descriptor that is not a TCP socket (a pipe end here) is
    // not a handoff: the proxy answers 400 on the Unix socket, closes the
    // descriptor and records the refusal; no policy is asked.
    let dir = tempfile::tempdir().unwrap();
    let mut policy = TestPolicy::default();
    policy.allow.push("api.test".into());
    let (_addr, sink, path, shutdown) = proxy_and_bridge(dir.path(), policy);
    let mut s = std::os::unix::net::UnixStream::connect(&path).unwrap();
    let (pipe_r, pipe_w) = rustix::pipe::pipe().unwrap();
    let fds = [std::os::fd::AsFd::as_fd(&pipe_w)];
    let mut space = [std::mem::MaybeUninit::uninit(); rustix::cmsg_space!(ScmRights(1))];
    let mut control = rustix::net::SendAncillaryBuffer::new(&mut space);
    assert!(control.push(rustix::net::SendAncillaryMessage::ScmRights(&fds)));
    rustix::net::sendmsg(
        &s,
        &[std::io::IoSlice::new(&[0])],
        &mut control,
        rustix::net::SendFlags::empty(),
    )
    .unwrap();
    drop(pipe_w);
    let mut reply = String::new();
    s.read_to_string(&mut reply).unwrap();
    assert!(reply.starts_with("HTTP/1.1 400"), "{reply}");
    let rec = sink.wait_for(1).pop().unwrap();
    assert_eq!(rec.reason.as_deref(), Some("request.malformed"), "{rec:?}");
    // The proxy kept no copy of the pipe's write end: end of file.
    let mut rest = Vec::new();
    std::fs::File::from(pipe_r).read_to_end(&mut rest).unwrap();
    assert!(rest.is_empty());
    shutdown.trigger();
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
    std::thread::spawn(move || bridge(tcp, &p));

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
