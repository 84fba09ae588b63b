//! Human approval over HTTP: a tool the policy says to `approve` is asked
//! about through MCP elicitation on the request's own event stream, exactly
//! as over stdio, with the official Python SDK client as the human's side.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use crate::common;

use common::mcp::testserver;
use common::serve::{binary_policy, Gateway as Serve, ALICE};

fn gateway() -> Serve {
    gateway_with("")
}

/// The gateway with `plain` under a policy that approves `echo`, plus
/// `extra` policy text.
fn gateway_with(extra: &str) -> Serve {
    let plain = testserver("plain");
    let config = format!(
        "[listen]\naddress = \"127.0.0.1:0\"\n\n\
         [[clients]]\nname = \"alice\"\ntoken = {{ from_env = \"T_ALICE\" }}\n\n\
         [[servers]]\nname = \"plain\"\npolicy = \"plain.toml\"\ncommand = [{:?}]\n",
        plain.display().to_string()
    );
    let policy = binary_policy("plain", &plain, "\"echo\" = \"approve\"") + extra;
    Serve::start_files(&[("plain.toml", policy), ("serve.toml", config)])
}

fn human(gw: &Serve, path: &str, answer: &str, tool: &str) {
    gw.python_client("http_approval.py", &[&gw.url(path), ALICE, answer, tool]);
}

/// The same, with the SDK's client of the stateless revision, which takes
/// no server-to-client request: it is asked in an `InputRequiredResult`.
fn stateless_human(gw: &Serve, path: &str, answer: &str, tool: &str) {
    gw.python_client(
        "http_approval.py",
        &[&gw.url(path), ALICE, answer, tool, "2026-07-28"],
    );
}

#[test]
fn an_approve_rule_asks_the_http_client_and_runs_the_call_it_approves() {
    human(&gateway(), "/servers/plain/mcp", "approve", "echo");
}

#[test]
fn a_declined_approval_over_http_refuses_the_call() {
    human(&gateway(), "/servers/plain/mcp", "decline", "echo");
}

#[test]
fn an_http_client_without_elicitation_gets_the_pending_approval_id() {
    human(&gateway(), "/servers/plain/mcp", "none", "echo");
}

#[test]
fn an_approval_through_the_aggregated_endpoint_reaches_the_client() {
    human(&gateway(), "/mcp", "approve", "plain__echo");
}

#[test]
fn a_stateless_client_is_asked_in_an_input_required_result_and_its_yes_runs_the_call() {
    stateless_human(&gateway(), "/servers/plain/mcp", "approve", "echo");
}

#[test]
fn a_stateless_clients_no_refuses_the_call() {
    stateless_human(&gateway(), "/servers/plain/mcp", "decline", "echo");
}

#[test]
fn a_stateless_client_without_elicitation_gets_the_pending_approval_id() {
    stateless_human(&gateway(), "/servers/plain/mcp", "none", "echo");
}

#[test]
fn a_stateless_clients_approval_through_the_aggregated_endpoint_runs_the_call() {
    stateless_human(&gateway(), "/mcp", "approve", "plain__echo");
}

/// A gateway whose `plain` server holds `echo` calls for a human when
/// the client has no elicitation.
fn holding_gateway() -> Serve {
    gateway_with("\n[approvals]\nfallback = \"hold\"\ntimeout = \"60s\"\n")
}

#[test]
fn an_http_client_without_elicitation_waits_while_the_cli_approves_over_the_gateways_socket() {
    let gw = holding_gateway();
    let mut mcp = gw.mcp("plain", Some(ALICE));
    mcp.initialize();
    let socket = gw.state().join("control.sock");
    let socket = socket.to_str().unwrap().to_string();
    let msg = mcp.message(
        "tools/call",
        serde_json::json!({"name": "echo", "arguments": {"text": "held over http"}}),
    );
    let waiting = std::thread::spawn(move || mcp.post(&msg).json());
    let end = std::time::Instant::now() + std::time::Duration::from_secs(30);
    let approval = loop {
        let list = gw.cli_json(&["approvals", "--socket", &socket, "list"]);
        if let Some(a) = list.as_array().and_then(|l| l.first()) {
            break a.clone();
        }
        assert!(
            std::time::Instant::now() < end,
            "no approval listed: {list}"
        );
        std::thread::sleep(std::time::Duration::from_millis(50));
    };
    assert_eq!(approval["caller"], "alice", "{approval}");
    assert_eq!(approval["server"], "plain");
    let out = gw.cli(&[
        "approvals",
        "--socket",
        &socket,
        "approve",
        approval["id"].as_str().unwrap(),
    ]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let answer = waiting.join().unwrap();
    assert_eq!(
        common::serve::text_of(&answer),
        "held over http",
        "{answer}"
    );
    let audit = gw.audit();
    assert!(
        audit
            .iter()
            .any(|e| e["kind"] == "approval" && e["detail"]["action"] == "approved"),
        "{audit:?}"
    );
}
