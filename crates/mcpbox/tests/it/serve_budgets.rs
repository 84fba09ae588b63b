//! Issue 25 through the real binary: what `mcpbox serve` holds for a
//! client is bounded in bytes (a server flooding a client that never reads
//! cannot grow the gateway, and other clients keep working), and a stop
//! drains: a streamed answer is written whole before any server's input is
//! closed, and what outlives the grace ends with a clear error.
//!
//! The test server is `concurrent` (crates/testservers): it handles each
//! call on a thread of its own and exits once its input ends, the SDK
//! pattern; its `slow` answer says whether its input was still open.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use crate::common;

use std::time::{Duration, Instant};

use common::http::{self, Conn};
use common::serve::{text_of, Gateway, Mcp, Server, ALICE, BOB};
use serde_json::{json, Value};

fn gateway(limits: &str) -> Gateway {
    Gateway::start(limits, &[Server::test("conc", "concurrent", "")])
}

/// Posts `msg` on a connection of its own and reads the head of the
/// answer (an event stream).
fn post_stream(m: &Mcp, msg: &Value) -> Conn {
    let mut c = Conn::open(m.port);
    c.write(&m.bytes_with(msg.to_string().as_bytes(), |_| {}))
        .unwrap();
    let head = c.head().expect("the answer's head");
    assert_eq!(head.status, 200, "{head:?}");
    c
}

/// Events of the stream until the answer to `id`.
fn answer_of(c: &mut Conn, id: &Value, gw: &Gateway) -> Value {
    loop {
        match c.event() {
            Ok(Some(e)) if e.get("id") == Some(id) && e.get("method").is_none() => return e,
            Ok(Some(_)) => continue,
            other => panic!(
                "the stream ended without the answer: {other:?}\ngateway log:\n{}",
                gw.stderr()
            ),
        }
    }
}

/// The gateway's resident memory (VmRSS), in KiB.
fn rss_kib(pid: u32) -> u64 {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap();
    status
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
        .expect("VmRSS in /proc/PID/status")
}

/// A counter of `/metrics` (0 while absent).
fn metric(gw: &Gateway, name: &str) -> u64 {
    let auth = format!("Bearer {ALICE}");
    let r = http::send(
        gw.port,
        "GET",
        "/metrics",
        &[("Host", &gw.host()), ("Authorization", &auth)],
        b"",
    );
    assert_eq!(r.status, 200, "{}", r.text());
    r.text()
        .lines()
        .find_map(|l| l.strip_prefix(name))
        .and_then(|v| v.trim().parse().ok())
        .unwrap_or(0)
}

const MIB: u64 = 1024;

/// The budgets of the flood test: 8 MiB a session, 16 MiB in all.
const FLOOD_LIMITS: &str = "max_buffered_per_session = \"8MiB\"\nmax_buffered_total = \"16MiB\"\n";
/// What the gateway may grow by over its budget: a few messages being
/// relayed (read, parsed, screened, written again) at once, the
/// allocator's slack, the second client's sessions. Fixed, whatever the
/// flood's size; the flood is 25 times the budget.
const MARGIN_KIB: u64 = 96 * MIB;
const FLOOD_NOTES: u64 = 800;
const FLOOD_KIB: u64 = 512;

#[test]
fn a_server_flooding_a_client_that_never_reads_cannot_grow_the_gateway() {
    let gw = gateway(FLOOD_LIMITS);
    let pid = gw.pid();
    let mut victim = gw.mcp("conc", Some(ALICE));
    victim.initialize();
    let mut other = gw.mcp("conc", Some(BOB));
    other.initialize();
    let before = rss_kib(pid);
    // 400 MiB of notifications that belong to no request, for a client
    // that never opens its GET stream: before, each session kept up to
    // 1024 of them whatever their size
    let r = victim.call("notes", json!({"count": FLOOD_NOTES, "kib": FLOOD_KIB}));
    assert!(text_of(&r).starts_with("sending"), "{r}");
    let budget = 16 * MIB;
    let mut peak = before;
    let mut calls = 0;
    let until = Instant::now() + Duration::from_secs(300);
    // the flood is over when all but what fits the session's budget was
    // dropped (and counted)
    let fits = 8 * MIB / FLOOD_KIB;
    loop {
        peak = peak.max(rss_kib(pid));
        assert!(
            peak <= before + budget + MARGIN_KIB,
            "the gateway grew by {} KiB under the flood; budget {budget} KiB + margin {MARGIN_KIB} KiB",
            peak - before
        );
        // the other client's calls keep working meanwhile
        let a = other.call("slow", json!({"ms": 0, "kib": 1, "notes": 0}));
        assert_eq!(
            text_of(&a).len(),
            1024,
            "{a}\ngateway log:\n{}",
            gw.stderr()
        );
        calls += 1;
        let dropped = metric(&gw, "mcpbox_dropped_messages_total{queue=\"backlog\"}");
        if dropped + fits >= FLOOD_NOTES {
            break;
        }
        assert!(
            Instant::now() < until,
            "the flood did not end: {dropped} dropped\ngateway log:\n{}",
            gw.stderr()
        );
        std::thread::sleep(Duration::from_millis(50));
    }
    peak = peak.max(rss_kib(pid));
    eprintln!(
        "gateway RSS: {before} KiB before, {peak} KiB at most during a flood of {} MiB ({calls} calls of the other client meanwhile)",
        FLOOD_NOTES * FLOOD_KIB / MIB
    );
    assert!(
        peak <= before + budget + MARGIN_KIB,
        "the gateway grew by {} KiB under the flood; budget {budget} KiB + margin {MARGIN_KIB} KiB",
        peak - before
    );
    assert!(metric(&gw, "mcpbox_buffered_bytes") <= 16 << 20);
    // the drop is audited, with its totals, not once per message
    let events = gw.audit_until("buffer_full flag", |e| {
        e["kind"] == "flag" && e["reason"] == "http.buffer_full" && e["caller"] == "alice"
    });
    let flags = events
        .iter()
        .filter(|e| e["reason"] == "http.buffer_full")
        .count();
    assert!(flags < 40, "{flags} audit records for one flood");
    // the victim's session still works, and its stream gets the newest
    // messages (the oldest were dropped)
    let (mut stream, head) = victim.open_stream();
    assert_eq!(head.status, 200);
    let first = stream.event().unwrap().unwrap();
    assert_eq!(
        first["method"], "notifications/resources/updated",
        "{first}"
    );
    let uri = first["params"]["uri"].as_str().unwrap();
    let n: u64 = uri.trim_start_matches("flood://").parse().unwrap();
    assert!(n >= FLOOD_NOTES - fits - 1, "oldest kept is {uri}");
}

#[test]
fn an_answer_larger_than_the_sessions_budget_ends_its_request_with_a_clear_error() {
    let gw = gateway("max_buffered_per_session = \"1MiB\"\n");
    let mut m = gw.mcp("conc", Some(ALICE));
    m.initialize();
    let r = m.call("slow", json!({"ms": 0, "kib": 2048, "notes": 0}));
    assert_eq!(r["error"]["data"]["reason"], "http.buffer_full", "{r}");
    // the session goes on
    let r = m.call("slow", json!({"ms": 0, "kib": 64, "notes": 0}));
    assert_eq!(text_of(&r).len(), 64 * 1024, "{r}");
}

/// SIGTERM while an answer is streaming: before, the request stopped
/// counting as in flight when its handler returned the stream, so the stop
/// closed the server's input (and then cut the call) at once.
#[test]
fn sigterm_waits_for_a_streaming_answer_before_closing_the_servers_input() {
    sigterm_during_a_streaming_answer("/servers/conc/mcp", "slow");
}

/// The same through the aggregated endpoint `/mcp`.
#[test]
fn sigterm_waits_for_a_streaming_answer_on_the_aggregated_endpoint() {
    sigterm_during_a_streaming_answer("/mcp", "conc__slow");
}

fn sigterm_during_a_streaming_answer(path: &str, tool: &str) {
    let mut gw = gateway("");
    let mut m = gw.mcp("conc", Some(ALICE));
    m.path = path.to_string();
    m.initialize();
    let mut call = m.message(
        "tools/call",
        json!({"name": tool, "arguments": {"ms": 3000, "kib": 256, "notes": 3}}),
    );
    call["params"]["_meta"] = json!({"progressToken": "p1"});
    let mut c = post_stream(&m, &call);
    // the answer is streaming: its first progress event is out
    let first = c.event().unwrap().unwrap();
    assert_eq!(first["method"], "notifications/progress", "{first}");
    gw.sigterm();
    let answer = answer_of(&mut c, &call["id"], &gw);
    assert!(answer.get("error").is_none(), "{answer}");
    assert_eq!(text_of(&answer).len(), 256 * 1024);
    assert_eq!(
        answer["result"]["structuredContent"]["stdin_open"], true,
        "the server's input was closed before it answered: {answer}"
    );
    let status = gw.wait(Duration::from_secs(30));
    assert_eq!(status.code(), Some(0), "stderr:\n{}", gw.stderr());
}

#[test]
fn a_call_still_running_when_the_grace_ends_gets_a_clear_error() {
    let mut gw = gateway("shutdown_grace = \"1s\"\n");
    let mut m = gw.mcp("conc", Some(ALICE));
    m.initialize();
    let mut call = m.message(
        "tools/call",
        json!({"name": "slow", "arguments": {"ms": 60000, "kib": 1, "notes": 60}}),
    );
    call["params"]["_meta"] = json!({"progressToken": "p1"});
    let mut c = post_stream(&m, &call);
    let first = c.event().unwrap().unwrap();
    assert_eq!(first["method"], "notifications/progress", "{first}");
    gw.sigterm();
    let answer = answer_of(&mut c, &call["id"], &gw);
    assert_eq!(
        answer["error"]["data"]["reason"], "http.stopped",
        "{answer}"
    );
    let status = gw.wait(Duration::from_secs(30));
    assert_eq!(status.code(), Some(0), "stderr:\n{}", gw.stderr());
}

/// The same for a request of the stateless revision (2026-07-28), which
/// has no session and runs on the client's stateless session.
#[test]
fn sigterm_waits_for_a_streaming_answer_in_the_stateless_revision() {
    let mut gw = gateway("");
    let m = gw.mcp("conc", Some(ALICE));
    let call = json!({"jsonrpc": "2.0", "id": 41, "method": "tools/call", "params": {
    "name": "slow", "arguments": {"ms": 3000, "kib": 256, "notes": 3},
    "_meta": {
        "progressToken": "p1",
        "io.modelcontextprotocol/protocolVersion": "2026-07-28",
        "io.modelcontextprotocol/clientCapabilities": {},
        "io.modelcontextprotocol/clientInfo": {"name": "mcpbox-test", "version": "0"},
    }}});
    let mut c = Conn::open(m.port);
    c.write(&m.bytes_with(call.to_string().as_bytes(), |h| {
        h.push(("MCP-Protocol-Version".into(), "2026-07-28".into()));
        h.push(("Mcp-Method".into(), "tools/call".into()));
        h.push(("Mcp-Name".into(), "slow".into()));
    }))
    .unwrap();
    let head = c.head().expect("the answer's head");
    assert_eq!(head.status, 200, "{head:?}\n{}", gw.stderr());
    let first = c.event().unwrap().unwrap();
    assert_eq!(first["method"], "notifications/progress", "{first}");
    gw.sigterm();
    let answer = answer_of(&mut c, &call["id"], &gw);
    assert!(answer.get("error").is_none(), "{answer}");
    assert_eq!(text_of(&answer).len(), 256 * 1024);
    assert_eq!(
        answer["result"]["structuredContent"]["stdin_open"], true,
        "the server's input was closed before it answered: {answer}"
    );
    let status = gw.wait(Duration::from_secs(30));
    assert_eq!(status.code(), Some(0), "stderr:\n{}", gw.stderr());
}
