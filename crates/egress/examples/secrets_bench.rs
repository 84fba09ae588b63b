//! Secrets kept outside the sandbox: what the intercepting proxy costs, all
//! on loopback, in one run, against the pass-through tunnel and a direct
//! connection (issue 29's goal: added p50 under 1 ms per request on a
//! kept-alive connection, throughput at least 80% of the tunnel's).
//!
//! - latency: `REQUESTS` small GETs on one kept-alive HTTPS connection per
//!   path (after `WARMUP`), each carrying the placeholder in
//!   `Authorization`; p50 and p99 per request;
//! - throughput: one `BULK`-byte download per path.
//!
//! The paths: direct TLS to the upstream; CONNECT through the proxy with
//! TLS end to end (the tunnel every other host gets); CONNECT through the
//! proxy that opens the connection (TLS to the proxy with the sandbox's
//! CA, the proxy's own TLS to the upstream, the value swapped in, the
//! response scanned).
//!
//! Run: `cargo run --release -p mcpbox-egress --example secrets_bench`
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use std::io::{BufRead, BufReader, Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::sync::Arc;
use std::time::{Duration, Instant};

use mcpbox_egress::exchange::Host;
use mcpbox_egress::*;
use mcpbox_policy::HostRule;
use rustls::pki_types::ServerName;

const REQUESTS: usize = 2000;
const WARMUP: usize = 200;
const BULK: u64 = 256 << 20;
const PLACEHOLDER: &str = "ghp_PLACEHOLDERplaceholder0123456789ab";
const VALUE: &str = "ghp_REALVALUErealvalue9876543210zyxwvu";

/// The HTTPS upstream: `/bulk` is `BULK` bytes, anything else two.
fn upstream(config: Arc<rustls::ServerConfig>) -> u16 {
    let l = TcpListener::bind("127.0.0.1:0").unwrap();
    let port = l.local_addr().unwrap().port();
    std::thread::spawn(move || {
        for s in l.incoming() {
            let s = s.unwrap();
            s.set_nodelay(true).unwrap();
            let config = config.clone();
            std::thread::spawn(move || {
                let conn = rustls::ServerConnection::new(config).unwrap();
                let mut tls = rustls::StreamOwned::new(conn, s);
                let mut r = BufReader::new(&mut tls);
                loop {
                    let mut first = String::new();
                    if r.read_line(&mut first).unwrap_or(0) == 0 {
                        return;
                    }
                    let mut line = String::new();
                    while r.read_line(&mut line).map(|n| n > 2).unwrap_or(false) {
                        line.clear();
                    }
                    let w = r.get_mut();
                    if first.starts_with("GET /bulk") {
                        let _ = write!(w, "HTTP/1.1 200 OK\r\nContent-Length: {BULK}\r\n\r\n");
                        if common::send_bulk(w, BULK, 64 * 1024).is_err() {
                            return;
                        }
                    } else if w
                        .write_all(b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok")
                        .is_err()
                    {
                        return;
                    }
                    let _ = w.flush();
                }
            });
        }
    });
    port
}

fn proxy(secrets: Option<Arc<SecretsOut>>) -> SocketAddr {
    let mut p = common::proxy();
    if let Some(s) = secrets {
        p = p.with_secrets(s);
    }
    let tcp = TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = tcp.local_addr().unwrap();
    std::thread::spawn(move || p.serve(tcp, &Shutdown::new()));
    addr
}

type Tls = rustls::StreamOwned<rustls::ClientConnection, TcpStream>;

/// A TLS connection to bench.test:`port`, directly or through a CONNECT
/// to `via`, trusting `roots`.
fn open(via: Option<SocketAddr>, port: u16, roots: &Arc<rustls::ClientConfig>) -> Tls {
    let s = match via {
        None => TcpStream::connect(("127.0.0.1", port)).unwrap(),
        Some(p) => {
            let mut s = TcpStream::connect(p).unwrap();
            write!(
                s,
                "CONNECT bench.test:{port} HTTP/1.1\r\nHost: bench.test:{port}\r\n\r\n"
            )
            .unwrap();
            let mut head = Vec::new();
            let mut b = [0u8; 1];
            while !head.ends_with(b"\r\n\r\n") {
                s.read_exact(&mut b).unwrap();
                head.push(b[0]);
            }
            assert!(
                head.starts_with(b"HTTP/1.1 200"),
                "{}",
                String::from_utf8_lossy(&head)
            );
            s
        }
    };
    s.set_nodelay(true).unwrap();
    let name = ServerName::try_from("bench.test").unwrap();
    let conn = rustls::ClientConnection::new(roots.clone(), name).unwrap();
    let mut tls = rustls::StreamOwned::new(conn, s);
    while tls.conn.is_handshaking() {
        tls.conn.complete_io(&mut tls.sock).unwrap();
    }
    tls
}

/// One GET on `tls`; returns the body's length.
fn get(tls: &mut Tls, port: u16, path: &str, body: &mut [u8]) -> u64 {
    write!(
        tls,
        "GET {path} HTTP/1.1\r\nHost: bench.test:{port}\r\nAuthorization: token {PLACEHOLDER}\r\n\r\n"
    )
    .unwrap();
    tls.flush().unwrap();
    let mut head = Vec::new();
    let mut b = [0u8; 1];
    while !head.ends_with(b"\r\n\r\n") {
        tls.read_exact(&mut b).unwrap();
        head.push(b[0]);
    }
    let head = String::from_utf8(head).unwrap();
    let len: u64 = head
        .lines()
        .find_map(|l| l.strip_prefix("Content-Length: "))
        .unwrap()
        .trim()
        .parse()
        .unwrap();
    let mut left = len;
    while left > 0 {
        let n = (left as usize).min(body.len());
        tls.read_exact(&mut body[..n]).unwrap();
        left -= n as u64;
    }
    len
}

fn client_config(ca: &Authority) -> Arc<rustls::ClientConfig> {
    let file = tempfile_path("roots");
    std::fs::write(&file, ca.cert_pem()).unwrap();
    let c = mcpbox_egress::intercept::client_config(std::path::Path::new("/nonexistent"), &[&file])
        .unwrap();
    let _ = std::fs::remove_file(file);
    c
}

fn tempfile_path(what: &str) -> std::path::PathBuf {
    std::env::temp_dir().join(format!("secrets-bench-{what}-{}.pem", std::process::id()))
}

fn main() {
    let up_ca = Authority::new("bench upstream").unwrap();
    let port = upstream(
        up_ca
            .server_config(&Host::Name("bench.test".into()))
            .unwrap(),
    );
    let trust_upstream = client_config(&up_ca);

    // the proxy that opens connections to bench.test, with its own CA
    let sandbox_ca = Authority::new("bench sandbox").unwrap();
    let trust_sandbox = client_config(&sandbox_ca);
    let up_file = tempfile_path("upstream");
    std::fs::write(&up_file, up_ca.cert_pem()).unwrap();
    let out = SecretsOut::new(
        vec![SwapSecret {
            name: "TOKEN".into(),
            placeholder: PLACEHOLDER.into(),
            value: VALUE.into(),
            hosts: vec![HostRule::parse(&format!("bench.test:{port}")).unwrap()],
            bodies: false,
        }],
        sandbox_ca,
        mcpbox_egress::intercept::client_config(std::path::Path::new("/nonexistent"), &[&up_file])
            .unwrap(),
    )
    .unwrap();
    let _ = std::fs::remove_file(&up_file);
    let tunnel = proxy(None);
    let opened = proxy(Some(Arc::new(out)));

    let paths: [(&str, Option<SocketAddr>, &Arc<rustls::ClientConfig>); 3] = [
        ("direct", None, &trust_upstream),
        (
            "tunnel (CONNECT, TLS end to end)",
            Some(tunnel),
            &trust_upstream,
        ),
        ("opened (secret swapped in)", Some(opened), &trust_sandbox),
    ];
    let mut body = vec![0u8; 256 * 1024];
    let mut rows = Vec::new();
    for (name, via, roots) in paths {
        let mut tls = open(via, port, roots);
        let mut samples = Vec::with_capacity(REQUESTS);
        for i in 0..REQUESTS + WARMUP {
            let start = Instant::now();
            assert_eq!(get(&mut tls, port, "/small", &mut body), 2);
            if i >= WARMUP {
                samples.push(start.elapsed());
            }
        }
        samples.sort();
        let us = |d: Duration| d.as_secs_f64() * 1e6;
        let (p50, p99) = (
            us(samples[samples.len() / 2]),
            us(samples[samples.len() * 99 / 100]),
        );
        let mut tls = open(via, port, roots);
        let start = Instant::now();
        assert_eq!(get(&mut tls, port, "/bulk", &mut body), BULK);
        let mbs = BULK as f64 / start.elapsed().as_secs_f64() / 1e6;
        rows.push((name, p50, p99, mbs));
    }
    println!("path                                  p50_us   p99_us     MB/s");
    for (name, p50, p99, mbs) in &rows {
        println!("{name:<36} {p50:>8.1} {p99:>8.1} {mbs:>8.0}");
    }
    println!();
    let added = rows[2].1 - rows[1].1;
    let share = rows[2].3 / rows[1].3 * 100.0;
    println!(
        "added p50 per request, opened vs tunnel: {added:.1} us (goal < 1000: {})",
        if added < 1000.0 { "met" } else { "missed" }
    );
    println!(
        "throughput, opened vs tunnel: {share:.0}% (goal >= 80%: {})",
        if share >= 80.0 { "met" } else { "missed" }
    );
}
