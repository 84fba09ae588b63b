//! Human approval over HTTP: a tool the policy says to `approve` is asked
//! about through MCP elicitation on the request's own event stream, exactly
//! as over stdio, with the official Python SDK client as the human's side.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use common::mcp::testserver;
use common::serve::{binary_policy, Gateway as Serve, ALICE};

fn gateway() -> Serve {
    let plain = testserver("plain");
    let config = format!(
        "[listen]\naddress = \"127.0.0.1:0\"\n\n\
         [[clients]]\nname = \"alice\"\ntoken = {{ from_env = \"T_ALICE\" }}\n\n\
         [[servers]]\nname = \"plain\"\npolicy = \"plain.toml\"\ncommand = [{:?}]\n",
        plain.display().to_string()
    );
    Serve::start_files(&[
        (
            "plain.toml",
            binary_policy("plain", &plain, "\"echo\" = \"approve\""),
        ),
        ("serve.toml", config),
    ])
}

fn human(gw: &Serve, path: &str, answer: &str, tool: &str) {
    gw.python_client("http_approval.py", &[&gw.url(path), ALICE, answer, tool]);
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
