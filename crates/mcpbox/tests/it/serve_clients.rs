//! `mcpbox serve` driven by real MCP clients over Streamable HTTP, each
//! with a bearer token: the official Python SDK (`mcp` 2.3.0, its
//! `streamable_http_client`), the MCP Inspector's CLI
//! (`@modelcontextprotocol/inspector` 2.12.0) and the Rust SDK (`rmcp`,
//! its reqwest transport without TLS). Servers: the project's `plain` and
//! the npm `server-everything`. `scripts/install-peers.sh` installs the
//! peers (pinned); a missing one skips its test with a message, or fails it
//! when `CI` is set.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use crate::common;

use std::path::Path;
use std::process::Command;

use common::peers::{mount_same_path, peer};
use common::serve::{Gateway, Server, ALICE};
use serde_json::Value;

fn plain() -> Server<'static> {
    Server::test("plain", "plain", "[tools]\n\"add\" = \"deny\"\n")
}

/// The endpoint of `server`; `""` is the aggregated `/mcp`.
fn url(gw: &Gateway, server: &str) -> String {
    if server.is_empty() {
        return format!("http://127.0.0.1:{}/mcp", gw.port);
    }
    format!("http://127.0.0.1:{}/servers/{server}/mcp", gw.port)
}

/// Runs the Python SDK scenario against `server` on `gw` and checks it
/// passed every check.
fn python(gw: &Gateway, scenario: &str, server: &str) {
    gw.python_client("http_client.py", &[scenario, &url(gw, server), ALICE]);
}

#[test]
fn python_sdk_over_http_lists_and_calls_plain_and_answers_its_roots_request() {
    let gw = Gateway::start("", &[plain()]);
    python(&gw, "plain", "plain");
    let events = gw.audit_until("the denied add", |e| {
        e["tool"] == "add" && e["decision"] == "deny"
    });
    assert!(
        events
            .iter()
            .any(|e| e["tool"] == "add" && e["caller"] == "alice"),
        "the denial is not recorded as alice's"
    );
}

#[test]
fn python_sdk_over_http_drives_server_everything_with_sampling() {
    let npm = peer("npm");
    let bin = npm.join("bin/mcp-server-everything");
    let policy = format!("[tools]\n\"get-sum\" = \"deny\"\n{}", mount_same_path(&npm));
    let gw = Gateway::start(
        "",
        &[Server {
            name: "everything",
            command: vec![bin.display().to_string()],
            policy: &policy,
        }],
    );
    python(&gw, "everything", "everything");
}

/// `mcp-inspector --cli URL --transport http --header ... ARGS`: its JSON
/// output.
fn inspector(gw: &Gateway, bin: &Path, server: &str, token: &str, args: &[&str]) -> Value {
    let out = Command::new(bin)
        .arg("--cli")
        // the URL first: --tool-arg takes every word after it
        .arg(url(gw, server))
        .args(["--transport", "http", "--header"])
        .arg(format!("Authorization: Bearer {token}"))
        .args(args)
        // its catalog of servers, kept out of HOME
        .env(
            "MCP_CATALOG_PATH",
            gw.dir.path().join("inspector-catalog.json"),
        )
        .output()
        .expect("run mcp-inspector");
    // results on stdout, errors (as JSON too) on stderr
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    let printed = if out.status.success() {
        &stdout
    } else {
        &stderr
    };
    serde_json::from_str(printed.trim()).unwrap_or_else(|e| {
        panic!("mcp-inspector printed no JSON ({e}):\n{stdout}\nstderr:\n{stderr}")
    })
}

/// The inspector CLI lists and calls `echo` (named `echo_name` at
/// `server`'s endpoint) through the gateway.
fn inspector_lists_and_calls(server: &str, echo_name: &str) {
    let bin = peer("npm/bin/mcp-inspector");
    let gw = Gateway::start("", &[plain()]);
    let list = inspector(&gw, &bin, server, ALICE, &["--method", "tools/list"]);
    let names: Vec<&str> = list["tools"]
        .as_array()
        .unwrap_or_else(|| panic!("no tools: {list}"))
        .iter()
        .filter_map(|t| t["name"].as_str())
        .collect();
    assert!(names.contains(&echo_name), "{names:?}");
    // plain's `add` is denied (the other server's is not)
    let denied = echo_name.replace("echo", "add");
    assert!(
        !names.contains(&denied.as_str()),
        "denied tool listed: {names:?}"
    );
    let call = inspector(
        &gw,
        &bin,
        server,
        ALICE,
        &[
            "--method",
            "tools/call",
            "--tool-name",
            echo_name,
            "--tool-arg",
            "text=hi-from-inspector",
        ],
    );
    assert_eq!(call["content"][0]["text"], "hi-from-inspector", "{call}");
    // a wrong token gets nowhere (the inspector then wants OAuth)
    let refused = inspector(&gw, &bin, server, "wrong", &["--method", "tools/list"]);
    assert!(refused.get("tools").is_none(), "{refused}");
    assert!(refused.get("error").is_some(), "{refused}");
}

#[test]
fn inspector_cli_over_http_lists_and_calls_with_a_bearer_header() {
    inspector_lists_and_calls("plain", "echo");
}

#[test]
fn inspector_cli_lists_and_calls_through_the_aggregated_endpoint() {
    inspector_lists_and_calls("", "plain__echo");
}

mod rmcp_http {
    use super::*;
    use rmcp::model::{CallToolRequestParams, ClientConfig, ProtocolVersion};
    use rmcp::transport::streamable_http_client::StreamableHttpClientTransportConfig;
    use rmcp::transport::StreamableHttpClientTransport;
    use rmcp::{ClientLifecycleMode, ClientServiceExt};

    /// rmcp lists and calls `echo` (named `echo_name` at `server`'s
    /// endpoint) through the gateway.
    async fn lists_and_calls(server: &str, echo_name: &str) {
        let gw = Gateway::start("", &[plain()]);
        let config = StreamableHttpClientTransportConfig::with_uri(url(&gw, server))
            // rmcp adds the `Bearer ` itself
            .auth_header(ALICE);
        let transport = StreamableHttpClientTransport::from_config(config);
        let info = ClientConfig::default().with_protocol_version(ProtocolVersion::V_2025_11_25);
        let client = match info
            .serve_with_lifecycle(transport, ClientLifecycleMode::Initialize)
            .await
        {
            Ok(c) => c,
            Err(e) => panic!("rmcp could not connect: {e}\ngateway:\n{}", gw.stderr()),
        };
        let tools = client.list_all_tools().await.expect("tools/list");
        let names: Vec<String> = tools.iter().map(|t| t.name.to_string()).collect();
        assert!(names.iter().any(|n| n == echo_name), "{names:?}");
        let denied = echo_name.replace("echo", "add");
        assert!(!names.contains(&denied), "{names:?}");
        let Value::Object(args) = serde_json::json!({"text": "hi from rmcp"}) else {
            unreachable!()
        };
        let r = client
            .call_tool(CallToolRequestParams::new(echo_name.to_string()).with_arguments(args))
            .await
            .expect("tools/call");
        let text: Vec<String> = r
            .content
            .iter()
            .filter_map(|c| c.as_text().map(|t| t.text.clone()))
            .collect();
        assert_eq!(text, ["hi from rmcp"]);
        client.cancel().await.expect("close the session");
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn rmcp_client_over_http_lists_and_calls_with_a_bearer_token() {
        lists_and_calls("plain", "echo").await;
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn rmcp_client_lists_and_calls_through_the_aggregated_endpoint() {
        lists_and_calls("", "plain__echo").await;
    }
}

/// Issue 32: with network egress in the server's policy, a second session
/// of an agent (a second window, the inspector beside a client that keeps
/// its session) failed with "File exists". The Python SDK's default-mode
/// client (which probes with a session of its own first) and the inspector
/// CLI, twice, all work while an HTTP session of the same agent stays open.
#[test]
fn inspector_and_python_sdk_beside_an_open_session_on_a_server_with_egress() {
    let bin = peer("npm/bin/mcp-inspector");
    let gw = Gateway::start(
        "",
        &[Server::test(
            "plain",
            "plain",
            "[tools]\n\"add\" = \"deny\"\n[network]\nallow = [\"dev.test:18971\"]\n",
        )],
    );
    let mut open = gw.mcp("plain", Some(ALICE));
    open.initialize();
    for _ in 0..2 {
        let call = inspector(
            &gw,
            &bin,
            "plain",
            ALICE,
            &[
                "--method",
                "tools/call",
                "--tool-name",
                "echo",
                "--tool-arg",
                "text=beside",
            ],
        );
        assert_eq!(
            call["content"][0]["text"],
            "beside",
            "{call}\n{}",
            gw.stderr()
        );
    }
    python(&gw, "plain", "plain");
    let r = open.call("echo", serde_json::json!({"text": "still here"}));
    assert_eq!(r["result"]["content"][0]["text"], "still here", "{r}");
}
