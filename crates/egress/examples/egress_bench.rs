//! Egress proxy benchmark, all on loopback, in one run:
//! (a) throughput of a 1 GiB download, direct vs through the proxy (CONNECT
//!     over TCP) vs the production path (bridge TCP -> Unix socket -> proxy),
//!     beside a bare relay (the proxy's splice relay and nothing else: no
//!     request, no policy), the ceiling of any design with one relay hop;
//! (b) connect latency (TCP connect, CONNECT + 200 where proxied, one byte
//!     echoed) over 2000 connections: median and p99, and the added cost.
//!
//! Run: `cargo run --release -p mcpbox-egress --example egress_bench`
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use std::io::{self, Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::os::unix::net::UnixListener;
use std::time::{Duration, Instant};

use mcpbox_egress::*;

const BULK: u64 = 1 << 30;
const CONNS: usize = 2000;
const WARMUP: usize = 100;

fn bulk_server() -> u16 {
    let l = TcpListener::bind("127.0.0.1:0").unwrap();
    let port = l.local_addr().unwrap().port();
    std::thread::spawn(move || {
        for s in l.incoming() {
            let mut s = s.unwrap();
            std::thread::spawn(move || {
                let _ = common::send_bulk(&mut s, BULK, 256 * 1024);
            });
        }
    });
    port
}

fn echo_server() -> u16 {
    let l = TcpListener::bind("127.0.0.1:0").unwrap();
    let port = l.local_addr().unwrap().port();
    std::thread::spawn(move || {
        for s in l.incoming() {
            let mut s = s.unwrap();
            s.set_nodelay(true).unwrap();
            std::thread::spawn(move || {
                let mut b = [0u8; 1];
                while let Ok(1) = s.read(&mut b) {
                    if s.write_all(&b).is_err() {
                        return;
                    }
                }
            });
        }
    });
    port
}

/// A bare relay to `port`: each connection, taken by one of a few waiting
/// threads (no thread started per connection, as the proxy's pool), is
/// joined to a new one to the target with [`relay_tcp`], the proxy's
/// splice relay.
fn bare_relay(port: u16) -> SocketAddr {
    let l = TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = l.local_addr().unwrap();
    for _ in 0..4 {
        let l = l.try_clone().unwrap();
        std::thread::spawn(move || loop {
            let (s, _) = l.accept().unwrap();
            s.set_nodelay(true).unwrap();
            let t = TcpStream::connect(("127.0.0.1", port)).unwrap();
            t.set_nodelay(true).unwrap();
            let _ = relay_tcp(s, t);
        });
    }
    addr
}

#[derive(Clone, Copy)]
enum Path {
    Direct,
    /// Bare relays: the bulk server's port, the relay to it, the relay to
    /// the echo server.
    Bare(u16, SocketAddr, SocketAddr),
    Proxy(SocketAddr),
    Bridge(SocketAddr),
}

impl Path {
    fn name(self) -> &'static str {
        match self {
            Self::Direct => "direct",
            Self::Bare(..) => "bare relay (1 hop)",
            Self::Proxy(_) => "proxy (tcp)",
            Self::Bridge(_) => "bridge+unix+proxy",
        }
    }

    /// Opens a connection; returns it and how many payload bytes arrived
    /// together with the proxy's 200.
    fn open(self, port: u16) -> io::Result<(TcpStream, usize)> {
        let target = SocketAddr::from(([127, 0, 0, 1], port));
        if let Self::Bare(bulk_port, bulk, echo) = self {
            let s = TcpStream::connect(if port == bulk_port { bulk } else { echo })?;
            s.set_nodelay(true)?;
            return Ok((s, 0));
        }
        let (Self::Proxy(via) | Self::Bridge(via)) = self else {
            let s = TcpStream::connect(target)?;
            s.set_nodelay(true)?;
            return Ok((s, 0));
        };
        let mut s = TcpStream::connect(via)?;
        s.set_nodelay(true)?;
        s.write_all(
            format!("CONNECT bench.test:{port} HTTP/1.1\r\nHost: bench.test:{port}\r\n\r\n")
                .as_bytes(),
        )?;
        let mut head = Vec::new();
        let mut buf = [0u8; 128];
        let end = loop {
            if let Some(p) = head.windows(4).position(|w| w == b"\r\n\r\n") {
                break p + 4;
            }
            let n = s.read(&mut buf)?;
            if n == 0 {
                return Err(io::Error::other("proxy closed"));
            }
            head.extend_from_slice(&buf[..n]);
        };
        if !head.starts_with(b"HTTP/1.1 200") {
            return Err(io::Error::other(
                String::from_utf8_lossy(&head).into_owned(),
            ));
        }
        Ok((s, head.len() - end))
    }
}

fn throughput(path: Path, port: u16) -> f64 {
    let start = Instant::now();
    let (mut s, extra) = path.open(port).unwrap();
    let mut buf = vec![0u8; 256 * 1024];
    let mut total = extra as u64;
    loop {
        let n = s.read(&mut buf).unwrap();
        if n == 0 {
            break;
        }
        total += n as u64;
    }
    assert_eq!(total, BULK);
    BULK as f64 / start.elapsed().as_secs_f64() / 1e9
}

/// Connect latencies for every path, interleaved connection by connection so
/// that background load (this machine is shared) hits all paths alike.
fn latencies(paths: &[Path], port: u16) -> Vec<(f64, f64)> {
    let mut samples = vec![Vec::with_capacity(CONNS); paths.len()];
    for i in 0..CONNS + WARMUP {
        for (k, path) in paths.iter().enumerate() {
            let start = Instant::now();
            let (mut s, _) = path.open(port).unwrap();
            s.write_all(b"x").unwrap();
            let mut b = [0u8; 1];
            s.read_exact(&mut b).unwrap();
            let d = start.elapsed();
            drop(s);
            if i >= WARMUP {
                samples[k].push(d);
            }
        }
    }
    let us = |d: Duration| d.as_secs_f64() * 1e6;
    samples
        .iter_mut()
        .map(|v| {
            v.sort();
            (us(v[v.len() / 2]), us(v[v.len() * 99 / 100]))
        })
        .collect()
}

fn main() {
    let proxy = common::proxy();
    let shutdown = Shutdown::new();
    let tcp = TcpListener::bind("127.0.0.1:0").unwrap();
    let proxy_addr = tcp.local_addr().unwrap();
    let (p, s) = (proxy.clone(), shutdown.clone());
    std::thread::spawn(move || p.serve(tcp, &s));

    let dir = std::env::temp_dir().join(format!("egress-bench-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let sock = dir.join("egress.sock");
    let unix = UnixListener::bind(&sock).unwrap();
    let (p, s) = (proxy.clone(), shutdown.clone());
    std::thread::spawn(move || p.serve(unix, &s));
    let bridge_l = TcpListener::bind("127.0.0.1:0").unwrap();
    let bridge_addr = bridge_l.local_addr().unwrap();
    let sock2 = sock.clone();
    // The capture and resolver sockets are unused here (no network
    // namespace to redirect in): any free loopback ports.
    let sockets = mcpbox_egress::BridgeSockets {
        proxy: bridge_l,
        capture: TcpListener::bind("127.0.0.1:0").unwrap(),
        dns_udp: std::net::UdpSocket::bind("127.0.0.1:0").unwrap(),
        dns_tcp: TcpListener::bind("127.0.0.1:0").unwrap(),
        // stands in for the NFLOG socket: nothing arrives on it
        nflog: std::net::UdpSocket::bind("127.0.0.1:0").unwrap().into(),
    };
    std::thread::spawn(move || bridge(sockets, &sock2));

    let bulk = bulk_server();
    let echo = echo_server();
    let paths = [
        Path::Direct,
        Path::Bare(bulk, bare_relay(bulk), bare_relay(echo)),
        Path::Proxy(proxy_addr),
        Path::Bridge(bridge_addr),
    ];

    // Interleave rounds so drift hits every path alike; keep the best of 3.
    let mut tput = [0f64; 4];
    let rounds = if std::env::var_os("EGRESS_BENCH_LATENCY_ONLY").is_some() {
        0
    } else {
        3
    };
    for _ in 0..rounds {
        for (i, p) in paths.iter().enumerate() {
            tput[i] = tput[i].max(throughput(*p, bulk));
        }
    }
    let lat = latencies(&paths, echo);

    println!("egress_bench: loopback, {} cores, 1 GiB download (best of 3), {CONNS} connections (+{WARMUP} warm-up)", std::thread::available_parallelism().map_or(0, |n| n.get()));
    println!();
    println!(
        "{:<20} {:>14} {:>12} {:>12} {:>14} {:>14}",
        "path", "throughput", "vs direct", "connect p50", "connect p99", "added p50"
    );
    for (i, p) in paths.iter().enumerate() {
        println!(
            "{:<20} {:>9.2} GB/s {:>11.1}% {:>9.1} us {:>11.1} us {:>11.1} us",
            p.name(),
            tput[i],
            tput[i] / tput[0] * 100.0,
            lat[i].0,
            lat[i].1,
            lat[i].0 - lat[0].0,
        );
    }
    println!();
    println!("targets (issue 28): >= 90% of direct throughput; <= 50 us added per new connection at the median");

    shutdown.trigger();
    let _ = std::fs::remove_file(&sock);
    let _ = std::fs::remove_dir(&dir);
}
