//! `/mcp`, the aggregated endpoint of `mcpbox serve`: every server a client
//! may use behind one session, names prefixed `<server>__`, each server in
//! a sandbox of the client's own.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use crate::common;

use std::io::{Read, Write};
use std::net::TcpStream;

use common::mcp::testserver;
use common::serve::{binary_policy, Gateway as Serve, ALICE, BOB};
use serde_json::{json, Value};

/// Two clients (alice may use both servers, bob only `plain`), `plain`
/// with `add` denied, and the conformance fixture.
fn gateway() -> Serve {
    let plain = testserver("plain");
    let fixture = testserver("conformance");
    let config = format!(
        "[listen]\naddress = \"127.0.0.1:0\"\n\n\
         [[clients]]\nname = \"alice\"\ntoken = {{ from_env = \"T_ALICE\" }}\n\n\
         [[clients]]\nname = \"bob\"\ntoken = {{ from_env = \"T_BOB\" }}\nservers = [\"plain\"]\n\n\
         [[servers]]\nname = \"plain\"\npolicy = \"plain.toml\"\ncommand = [{:?}]\n\n\
         [[servers]]\nname = \"conformance\"\npolicy = \"fixture.toml\"\ncommand = [{:?}]\n",
        plain.display().to_string(),
        fixture.display().to_string()
    );
    Serve::start_files(&[
        (
            "plain.toml",
            binary_policy("plain", &plain, "\"add\" = \"deny\""),
        ),
        ("fixture.toml", binary_policy("conformance", &fixture, "")),
        ("serve.toml", config),
    ])
}

/// One POST on its own connection: (status, headers, body).
fn post(gw: &Serve, token: &str, session: Option<&str>, body: &Value) -> (u16, String, String) {
    let body = body.to_string();
    let mut s = TcpStream::connect(("127.0.0.1", gw.port)).unwrap();
    let sid = session
        .map(|s| format!("Mcp-Session-Id: {s}\r\n"))
        .unwrap_or_default();
    write!(
        s,
        "POST /mcp HTTP/1.1\r\nHost: 127.0.0.1:{}\r\nAuthorization: Bearer {token}\r\n{sid}\
         Content-Type: application/json\r\nAccept: application/json, text/event-stream\r\n\
         Content-Length: {}\r\nConnection: close\r\n\r\n{body}",
        gw.port,
        body.len()
    )
    .unwrap();
    let mut out = String::new();
    s.read_to_string(&mut out).unwrap();
    let (head, rest) = out.split_once("\r\n\r\n").unwrap_or((&out, ""));
    let status = head
        .split_whitespace()
        .nth(1)
        .unwrap_or("0")
        .parse()
        .unwrap();
    (status, head.to_ascii_lowercase(), rest.to_string())
}

/// The JSON of the last `data:` line of an event-stream body.
fn answer(body: &str) -> Value {
    let data = body
        .lines()
        .filter_map(|l| l.strip_prefix("data: "))
        .next_back()
        .unwrap_or_else(|| panic!("no event in {body:?}"));
    serde_json::from_str(data).unwrap()
}

fn open(gw: &Serve, token: &str) -> String {
    let init = json!({"jsonrpc": "2.0", "id": 1, "method": "initialize", "params": {
        "protocolVersion": "2025-11-25", "capabilities": {}, "clientInfo": {"name": "t", "version": "1"}}});
    let (status, head, body) = post(gw, token, None, &init);
    assert_eq!(status, 200, "{head}{body}");
    let sid = head
        .lines()
        .find_map(|l| l.strip_prefix("mcp-session-id: "))
        .expect("a session id")
        .trim()
        .to_string();
    let note = json!({"jsonrpc": "2.0", "method": "notifications/initialized"});
    assert_eq!(post(gw, token, Some(&sid), &note).0, 202);
    sid
}

fn call(gw: &Serve, token: &str, sid: &str, tool: &str, args: Value) -> Value {
    let req = json!({"jsonrpc": "2.0", "id": 2, "method": "tools/call", "params": {"name": tool, "arguments": args}});
    let (status, head, body) = post(gw, token, Some(sid), &req);
    assert_eq!(status, 200, "{head}{body}");
    answer(&body)
}

#[test]
fn python_sdk_lists_and_calls_every_server_through_the_aggregated_endpoint() {
    let gw = gateway();
    gw.python_client(
        "http_aggregate.py",
        &[&gw.url("/mcp"), ALICE, "marker-a1b2c3"],
    );
}

#[test]
fn a_client_sees_only_the_servers_it_may_use_on_the_aggregate() {
    let gw = gateway();
    let sid = open(&gw, BOB);
    let list = json!({"jsonrpc": "2.0", "id": 3, "method": "tools/list"});
    let (_, _, body) = post(&gw, BOB, Some(&sid), &list);
    let names: Vec<String> = answer(&body)["result"]["tools"]
        .as_array()
        .unwrap()
        .iter()
        .map(|t| t["name"].as_str().unwrap().to_string())
        .collect();
    assert!(names.iter().any(|n| n == "plain__echo"), "{names:?}");
    assert!(names.iter().all(|n| n.starts_with("plain__")), "{names:?}");
    let r = call(&gw, BOB, &sid, "conformance__test_simple_text", json!({}));
    assert!(
        r.get("error").is_some(),
        "bob reached a server he may not use: {r}"
    );
}

#[test]
fn another_clients_aggregate_session_id_gets_404_and_is_audited() {
    let gw = gateway();
    let alice = open(&gw, ALICE);
    let stolen = json!({"jsonrpc": "2.0", "id": 9, "method": "tools/list"});
    let (status, _, body) = post(&gw, BOB, Some(&alice), &stolen);
    assert_eq!(status, 404, "{body}");
    assert!(!body.contains("plain__echo"), "{body}");
    // alice's session is unharmed
    let r = call(
        &gw,
        ALICE,
        &alice,
        "plain__echo",
        json!({"text": "still mine"}),
    );
    assert_eq!(r["result"]["content"][0]["text"], "still mine", "{r}");
    let events = common::audit::events(&gw.state().join("audit.db"));
    assert!(
        events.iter().any(|e| e["kind"] == "access"
            && e["caller"] == "bob"
            && e["reason"] == "http.session_unknown"),
        "{events:?}"
    );
}

#[test]
fn two_clients_on_the_aggregate_never_share_a_server_process() {
    let gw = gateway();
    let alice = open(&gw, ALICE);
    let bob = open(&gw, BOB);
    let r = call(
        &gw,
        ALICE,
        &alice,
        "plain__echo",
        json!({"text": "alice-secret-77"}),
    );
    assert_eq!(r["result"]["content"][0]["text"], "alice-secret-77");
    // `history` lists the calls its process received: bob's is another one
    let h = call(&gw, BOB, &bob, "plain__history", json!({}));
    assert!(
        !h.to_string().contains("alice-secret-77"),
        "bob saw alice's call: {h}"
    );
    let h = call(&gw, ALICE, &alice, "plain__history", json!({}));
    assert!(h.to_string().contains("alice-secret-77"), "{h}");
}

#[test]
fn python_sdk_in_the_stateless_revision_lists_and_calls_through_the_aggregated_endpoint() {
    let gw = gateway();
    gw.python_client("http_stateless.py", &[&gw.url("/mcp"), ALICE]);
}
