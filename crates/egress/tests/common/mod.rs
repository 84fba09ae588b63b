//! Fakes and helpers for the egress tests. Nothing here ever connects to an
//! address other than loopback: the connector records every attempt and
//! only dials loopback (or a loopback redirect the test sets).
#![allow(dead_code, clippy::unwrap_used, clippy::expect_used)]

use std::collections::{HashMap, VecDeque};
use std::io::{self, Read, Write};
use std::net::{IpAddr, SocketAddr, TcpListener, TcpStream};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use mcpbox_audit::{Event, Sink};
use mcpbox_egress::*;
use mcpbox_policy::{Decision, NetworkAnswer, Reason};

#[derive(Default)]
pub struct TestPolicy {
    pub allow: Vec<String>,
    pub mapped: HashMap<String, IpAddr>,
    pub ask_unlisted: bool,
    /// `network.local` as the proxy sees it: host -> addresses it answers
    /// (the test may put a non-loopback address here, as a broken policy
    /// implementation would).
    pub local: HashMap<String, Vec<IpAddr>>,
}

impl EgressPolicy for TestPolicy {
    fn decide(&self, host: &str, _port: u16) -> Decision {
        if self.local.contains_key(host) {
            Decision::allow(Reason::NetworkLocal, "policy:network.local[0]")
        } else if let Some(i) = self.allow.iter().position(|h| h == host) {
            Decision::allow(Reason::NetworkAllow, format!("policy:network.allow[{i}]"))
        } else if self.ask_unlisted {
            Decision::approve(Reason::NetworkUnlisted, "policy:network.unlisted")
        } else {
            Decision::deny(Reason::NetworkUnlisted, "policy:network.unlisted")
        }
    }
    fn mapped_address(&self, host: &str) -> Option<IpAddr> {
        self.mapped.get(host).copied()
    }
    fn local_addresses(&self, host: &str, _port: u16) -> Option<Vec<IpAddr>> {
        self.local.get(host).cloned()
    }
}

/// Answers from a script: the first call gets `answers[0]`, later calls the
/// last entry. Records every call.
#[derive(Default)]
pub struct FakeResolver {
    pub answers: HashMap<String, Vec<Vec<IpAddr>>>,
    pub calls: Mutex<Vec<String>>,
}

impl Resolver for FakeResolver {
    fn resolve(&self, host: &str, port: u16) -> io::Result<Vec<SocketAddr>> {
        let mut calls = self.calls.lock().unwrap();
        let n = calls.iter().filter(|h| *h == host).count();
        calls.push(host.to_string());
        let script = self
            .answers
            .get(host)
            .ok_or_else(|| io::Error::new(io::ErrorKind::NotFound, "no such host"))?;
        let answer = script.get(n).or(script.last()).cloned().unwrap_or_default();
        Ok(answer
            .into_iter()
            .map(|ip| SocketAddr::new(ip, port))
            .collect())
    }
}

/// Records every attempt. Dials loopback addresses; a non-loopback address
/// is dialled only through `redirect` (itself loopback), otherwise refused.
#[derive(Default)]
pub struct RecordingConnector {
    pub attempts: Mutex<Vec<SocketAddr>>,
    pub redirect: Mutex<Option<SocketAddr>>,
}

impl Connector for RecordingConnector {
    fn connect(&self, addr: SocketAddr) -> io::Result<TcpStream> {
        self.attempts.lock().unwrap().push(addr);
        if addr.ip().is_loopback() {
            return TcpStream::connect(addr);
        }
        match *self.redirect.lock().unwrap() {
            Some(r) => {
                assert!(r.ip().is_loopback(), "test redirect must be loopback");
                TcpStream::connect(r)
            }
            None => Err(io::Error::new(
                io::ErrorKind::ConnectionRefused,
                "recording connector: refused",
            )),
        }
    }
}

#[derive(Default)]
pub struct FakeApprover {
    pub answers: Mutex<VecDeque<NetworkAnswer>>,
    pub asked: Mutex<Vec<(String, u16)>>,
}

impl Approver for FakeApprover {
    fn ask(&self, host: &str, port: u16) -> NetworkAnswer {
        self.asked.lock().unwrap().push((host.to_string(), port));
        self.answers
            .lock()
            .unwrap()
            .pop_front()
            .unwrap_or(NetworkAnswer::Timeout)
    }
}

#[derive(Default)]
pub struct MemSink {
    pub events: Mutex<Vec<Event>>,
}

impl Sink for MemSink {
    fn record(&self, event: Event) {
        self.events.lock().unwrap().push(event);
    }
}

impl MemSink {
    /// Waits (deadlock guard, not a timing assertion) until `n` records exist.
    pub fn wait_for(&self, n: usize) -> Vec<Event> {
        let deadline = Instant::now() + Duration::from_secs(20);
        loop {
            let events = self.events.lock().unwrap().clone();
            if events.len() >= n || Instant::now() > deadline {
                return events;
            }
            std::thread::sleep(Duration::from_millis(5));
        }
    }
}

pub struct Harness {
    pub addr: SocketAddr,
    pub shutdown: Shutdown,
    pub resolver: Arc<FakeResolver>,
    pub connector: Arc<RecordingConnector>,
    pub approver: Arc<FakeApprover>,
    pub sink: Arc<MemSink>,
    pub proxy: Proxy,
}

impl Drop for Harness {
    fn drop(&mut self) {
        self.shutdown.trigger();
    }
}

pub fn start(policy: TestPolicy, resolver: FakeResolver) -> Harness {
    start_with(policy, resolver, FakeApprover::default())
}

pub fn start_with(policy: TestPolicy, resolver: FakeResolver, approver: FakeApprover) -> Harness {
    let resolver = Arc::new(resolver);
    let connector = Arc::new(RecordingConnector::default());
    let approver = Arc::new(approver);
    let sink = Arc::new(MemSink::default());
    let proxy = Proxy::with_head_timeout(
        Arc::new(policy),
        resolver.clone(),
        connector.clone(),
        approver.clone(),
        sink.clone(),
        Ids {
            sandbox_id: "sb-1".into(),
            workspace_id: "ws-1".into(),
            server: "srv".into(),
        },
        Duration::from_secs(5),
    );
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = listener.local_addr().unwrap();
    let shutdown = Shutdown::new();
    let (p, s) = (proxy.clone(), shutdown.clone());
    std::thread::spawn(move || p.serve(listener, &s).unwrap());
    Harness {
        addr,
        shutdown,
        resolver,
        connector,
        approver,
        sink,
        proxy,
    }
}

pub fn loopback() -> IpAddr {
    "127.0.0.1".parse().unwrap()
}

pub fn ip(s: &str) -> IpAddr {
    s.parse().unwrap()
}

/// Reads a response head byte by byte (so no tunnel byte is consumed).
pub fn read_head(s: &mut impl Read) -> String {
    let mut head = Vec::new();
    let mut b = [0u8];
    while !head.ends_with(b"\r\n\r\n") {
        if s.read(&mut b).unwrap() == 0 {
            break;
        }
        head.push(b[0]);
    }
    String::from_utf8(head).unwrap()
}

pub fn status(head: &str) -> u16 {
    head.split(' ')
        .nth(1)
        .and_then(|s| s.parse().ok())
        .unwrap_or(0)
}

pub fn header<'a>(head: &'a str, name: &str) -> Option<&'a str> {
    head.lines().find_map(|l| {
        let (n, v) = l.split_once(':')?;
        n.eq_ignore_ascii_case(name).then(|| v.trim())
    })
}

/// Sends `CONNECT target` and returns the stream and the response head.
pub fn connect(proxy: SocketAddr, target: &str) -> (TcpStream, String) {
    let mut s = TcpStream::connect(proxy).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(20))).unwrap();
    write!(s, "CONNECT {target} HTTP/1.1\r\nHost: {target}\r\n\r\n").unwrap();
    let head = read_head(&mut s);
    (s, head)
}

/// An echo server on loopback; returns its port.
pub fn echo_server() -> u16 {
    let l = TcpListener::bind("127.0.0.1:0").unwrap();
    let port = l.local_addr().unwrap().port();
    std::thread::spawn(move || {
        for s in l.incoming() {
            let Ok(mut s) = s else { return };
            std::thread::spawn(move || {
                let mut r = s.try_clone().unwrap();
                let _ = io::copy(&mut r, &mut s);
                let _ = s.shutdown(std::net::Shutdown::Write);
            });
        }
    });
    port
}

pub fn read_all(s: &mut impl Read) -> Vec<u8> {
    let mut v = Vec::new();
    let _ = s.read_to_end(&mut v);
    v
}

pub fn detail<'a>(e: &'a Event, key: &str) -> &'a serde_json::Value {
    &e.detail[key]
}
