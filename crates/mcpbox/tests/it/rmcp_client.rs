//! `mcpbox run` driven by the official Rust MCP SDK (`rmcp`) as the host:
//! the SDK spawns mcpbox over stdio, exactly as a host application would,
//! and must not be able to tell the relay from the server, except where
//! policy speaks. Servers: the project's `plain` test server (initialize
//! era), the npm reference server `@modelcontextprotocol/server-everything`
//! (the SDK's automatic era negotiation, falling back) and the PyPI
//! `mcp-server-time` (the stateless 2026-07-28 revision), the last two
//! installed pinned by `scripts/install-peers.sh` (a missing peer fails).
#![allow(clippy::unwrap_used, clippy::expect_used)]

use crate::common;

use std::path::{Path, PathBuf};
use std::process::Stdio;

use common::audit;
use common::mcp::testserver;
use common::peers::{mount_same_path, peer};
use common::{mcpbox, Workspace};
use rmcp::model::{CallToolRequestParams, CallToolResult, ClientConfig, ProtocolVersion};
use rmcp::service::RunningService;
use rmcp::transport::TokioChildProcess;
use rmcp::{ClientLifecycleMode, ClientServiceExt, RoleClient};
use serde_json::{json, Value};

/// The SDK's do-nothing client: no elicitation, sampling or roots declared.
type Client = RunningService<RoleClient, ClientConfig>;

/// A workspace with the `plain` test server copied into input/.
fn plain_ws() -> Workspace {
    let ws = Workspace::new();
    let dst = ws.input().join("plain");
    std::fs::copy(testserver("plain"), &dst).unwrap();
    std::fs::set_permissions(&dst, std::os::unix::fs::PermissionsExt::from_mode(0o755)).unwrap();
    ws
}

/// The `mcpbox run` command the SDK spawns: policy and a pin-state dir in
/// the workspace.
fn mcpbox_run(ws: &Workspace, policy: &Path, server: &[String]) -> tokio::process::Command {
    let mut cmd = tokio::process::Command::new(mcpbox());
    cmd.arg("run")
        .arg("--policy")
        .arg(policy)
        .arg("--")
        .args(server)
        .env("MCPBOX_STATE_DIR", ws.path().join("state"));
    cmd
}

fn stderr_path(ws: &Workspace) -> PathBuf {
    ws.path().join("mcpbox.stderr")
}

fn stderr_of(ws: &Workspace) -> String {
    std::fs::read_to_string(stderr_path(ws)).unwrap_or_default()
}

/// Starts the SDK client over `mcpbox run` with the given lifecycle.
async fn connect(
    ws: &Workspace,
    policy: &Path,
    server: &[String],
    lifecycle: ClientLifecycleMode,
) -> Client {
    // mcpbox's stderr (its log) goes to a file, for failure messages.
    let log = std::fs::File::create(stderr_path(ws)).unwrap();
    let (transport, _) = TokioChildProcess::builder(mcpbox_run(ws, policy, server))
        .stderr(Stdio::from(log))
        .spawn()
        .expect("spawn mcpbox");
    // rmcp's default client info names the newest revision even in
    // `initialize`; a host pinned to the initialize era names 2025-11-25.
    let info = ClientConfig::default().with_protocol_version(ProtocolVersion::V_2025_11_25);
    match info.serve_with_lifecycle(transport, lifecycle).await {
        Ok(client) => client,
        Err(e) => panic!(
            "the SDK could not connect: {e}\nmcpbox stderr:\n{}",
            stderr_of(ws)
        ),
    }
}

async fn call(client: &Client, ws: &Workspace, tool: &str, args: Value) -> CallToolResult {
    let Value::Object(args) = args else {
        panic!("arguments must be an object")
    };
    let params = CallToolRequestParams::new(tool.to_string()).with_arguments(args);
    match client.call_tool(params).await {
        Ok(r) => r,
        Err(e) => panic!(
            "tools/call {tool} failed: {e}\nmcpbox stderr:\n{}",
            stderr_of(ws)
        ),
    }
}

fn text(r: &CallToolResult) -> String {
    r.content
        .iter()
        .filter_map(|c| c.as_text().map(|t| t.text.clone()))
        .collect::<Vec<_>>()
        .join("\n")
}

async fn tool_names(client: &Client, ws: &Workspace) -> Vec<String> {
    match client.list_all_tools().await {
        Ok(tools) => tools.iter().map(|t| t.name.to_string()).collect(),
        Err(e) => panic!("tools/list failed: {e}\nmcpbox stderr:\n{}", stderr_of(ws)),
    }
}

/// Ends the session the way a host does (close stdin, wait for the exit)
/// and returns the audit log, which mcpbox has closed by then.
async fn finish(client: Client, ws: &Workspace) -> Vec<Value> {
    client.cancel().await.expect("close the session");
    audit::events(&ws.path().join("audit.db"))
}

#[track_caller]
fn assert_audited(events: &[Value], tool: &str, decision: &str, reason: &str) {
    assert!(
        events
            .iter()
            .any(|e| e["tool"] == tool && e["decision"] == decision && e["reason"] == reason),
        "no {decision} ({reason}) record for {tool} in {events:#?}"
    );
}

#[tokio::test]
async fn rmcp_client_full_session_with_plain_server_denied_call_never_arrives() {
    // The whole session against `plain`: the handshake, the filtered list,
    // an allowed call, a denied one that never reaches the server, an
    // approve rule with no way to ask, and the audit.
    let ws = plain_ws();
    let p = ws.policy(
        "[audit]\npath = \"audit.db\"\n[tools]\n\"write_*\" = \"deny\"\n\"delete_all\" = \"approve\"\n",
    );
    let client = connect(
        &ws,
        &p,
        &["/workspace/input/plain".into()],
        ClientLifecycleMode::Initialize,
    )
    .await;

    let info = client.peer_info().expect("server info after the handshake");
    assert_eq!(info.protocol_version, ProtocolVersion::V_2025_11_25);
    assert_eq!(
        info.server_info.as_ref().map(|i| i.name.as_str()),
        Some("plain")
    );
    assert!(
        info.instructions
            .as_deref()
            .is_some_and(|s| s.contains("plain test server")),
        "{info:?}"
    );

    let names = tool_names(&client, &ws).await;
    assert!(names.iter().any(|n| n == "add"), "{names:?}");
    assert!(
        !names.iter().any(|n| n == "write_file"),
        "a denied tool is listed: {names:?}"
    );

    let r = call(&client, &ws, "add", json!({"a": 2, "b": 40})).await;
    assert_ne!(r.is_error, Some(true), "{r:?}");
    assert_eq!(text(&r).trim(), "42");

    // Denied: an error result the model can read, never a protocol error
    // that would make the SDK throw.
    let r = call(
        &client,
        &ws,
        "write_file",
        json!({"path": "/workspace/output/x"}),
    )
    .await;
    assert_eq!(r.is_error, Some(true), "{r:?}");
    assert!(text(&r).contains("tool.rule"), "{r:?}");

    // Approve without elicitation (this client declares none): refused,
    // and the result says why.
    let r = call(&client, &ws, "delete_all", json!({})).await;
    assert_eq!(r.is_error, Some(true), "{r:?}");
    assert!(text(&r).contains("approval"), "{r:?}");

    // The server's own record: neither refused call arrived.
    let history = text(&call(&client, &ws, "history", json!({})).await);
    assert!(history.contains("\"add\""), "{history}");
    assert!(
        !history.contains("write_file") && !history.contains("delete_all"),
        "{history}"
    );

    let events = finish(client, &ws).await;
    assert_audited(&events, "add", "allow", "tool.default");
    assert_audited(&events, "write_file", "deny", "tool.rule");
    assert_audited(&events, "delete_all", "deny", "approval.pending");
    for kind in ["session_start", "session_end"] {
        assert!(events.iter().any(|e| e["kind"] == kind), "{events:#?}");
    }
}

#[tokio::test]
async fn rmcp_client_stateless_2026_revision_with_python_time_server() {
    // server/discover, then every request carries its own _meta (protocol
    // version, client capabilities): the relay passes that through to a
    // server built on the Python SDK 2.x, and still enforces the rules.
    let ws = Workspace::new();
    let venv = peer("venv");
    let p = ws.raw_policy(&format!(
        "{}[tools]\n\"convert_time\" = \"deny\"\n[audit]\npath = \"audit.db\"\n",
        mount_same_path(&venv)
    ));
    let server = vec![
        peer("venv/bin/mcp-server-time").display().to_string(),
        "--local-timezone".into(),
        "UTC".into(),
    ];
    let client = connect(
        &ws,
        &p,
        &server,
        ClientLifecycleMode::Discover {
            preferred_versions: vec![ProtocolVersion::V_2026_07_28],
        },
    )
    .await;
    let info = client.peer_info().unwrap();
    assert_eq!(info.protocol_version, ProtocolVersion::V_2026_07_28);

    let names = tool_names(&client, &ws).await;
    assert!(names.iter().any(|n| n == "get_current_time"), "{names:?}");
    assert!(!names.iter().any(|n| n == "convert_time"), "{names:?}");

    let r = call(&client, &ws, "get_current_time", json!({"timezone": "UTC"})).await;
    assert_ne!(r.is_error, Some(true), "{r:?}");
    assert!(text(&r).contains("UTC"), "{r:?}");

    let r = call(
        &client,
        &ws,
        "convert_time",
        json!({"source_timezone": "UTC", "time": "12:00", "target_timezone": "UTC"}),
    )
    .await;
    assert_eq!(r.is_error, Some(true), "{r:?}");
    assert!(text(&r).contains("tool.rule"), "{r:?}");

    let events = finish(client, &ws).await;
    assert_audited(&events, "get_current_time", "allow", "tool.default");
    assert_audited(&events, "convert_time", "deny", "tool.rule");
}

#[tokio::test]
async fn rmcp_client_drives_server_everything_with_a_denied_tool() {
    let ws = Workspace::new();
    let npm = peer("npm");
    let p = ws.raw_policy(&format!(
        "[filesystem]\ninput = \"input\"\n{}[tools]\n\"get-sum\" = \"deny\"\n[audit]\npath = \"audit.db\"\n",
        mount_same_path(&npm)
    ));
    let server = vec![peer("npm/bin/mcp-server-everything").display().to_string()];
    // Auto: the SDK tries the 2026-07-28 revision first; server-everything
    // (2026.8.31) answers only the initialize era, so the SDK falls back
    // through the relay within the same process.
    let client = connect(
        &ws,
        &p,
        &server,
        ClientLifecycleMode::Auto {
            preferred_versions: vec![ProtocolVersion::V_2026_07_28],
            legacy_version: Some(ProtocolVersion::V_2025_11_25),
        },
    )
    .await;
    let info = client.peer_info().unwrap();
    assert!(info.protocol_version.has_initialize(), "{info:?}");

    let names = tool_names(&client, &ws).await;
    assert!(names.iter().any(|n| n == "echo"), "{names:?}");
    assert!(!names.iter().any(|n| n == "get-sum"), "{names:?}");

    let r = call(&client, &ws, "echo", json!({"message": "hello from rmcp"})).await;
    assert_ne!(r.is_error, Some(true), "{r:?}");
    assert!(text(&r).contains("hello from rmcp"), "{r:?}");

    let r = call(&client, &ws, "get-sum", json!({"a": 1, "b": 2})).await;
    assert_eq!(r.is_error, Some(true), "{r:?}");
    assert!(text(&r).contains("tool.rule"), "{r:?}");
    assert!(!text(&r).contains('3'), "the server answered: {r:?}");

    let events = finish(client, &ws).await;
    assert_audited(&events, "echo", "allow", "tool.default");
    assert_audited(&events, "get-sum", "deny", "tool.rule");
}
