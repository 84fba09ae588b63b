//! The rules over tool arguments (`[[tools.arguments]]`, `tools.outside_paths`)
//! and the host paths a client knows, through the real `mcpbox run` and a
//! hostile test server (`workspace`: read, write, symlink; `plain`: asks the
//! client for its roots and echoes them). Each attack is a call that must
//! be refused at the gateway, before the server sees it.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use crate::common;

use common::mcp::{result_text, Session};
use common::Workspace;
use serde_json::{json, Value};

/// A workspace with test server `name` in input/, a policy with `extra`,
/// and `mcpbox run` started on it.
fn start(name: &str, extra: &str) -> (Workspace, Session) {
    let ws = Workspace::with_server(name);
    let p = ws.policy(&format!(
        "[audit]\npath = \"audit.db\"\n[tools]\ndefault = \"allow\"\n{extra}"
    ));
    let state = ws.path().join("state");
    let exe = format!("/workspace/input/{name}");
    let mut s = Session::start(
        &p,
        &[&exe],
        &[("MCPBOX_STATE_DIR", state.to_str().unwrap())],
    );
    s.initialize();
    (ws, s)
}

fn audit(ws: &Workspace) -> Vec<Value> {
    common::audit::events(&ws.path().join("audit.db"))
}

/// The refusal of a call: its reason and source, from the decision the
/// relay puts in the result's `_meta`.
fn refusal(r: &Value) -> (String, String) {
    assert_eq!(r["result"]["isError"], json!(true), "not refused: {r}");
    let d = &r["result"]["_meta"]["mcpbox/decision"];
    (
        d["reason"].as_str().unwrap_or_default().to_string(),
        d["source"].as_str().unwrap_or_default().to_string(),
    )
}

fn ok_text(r: &Value) -> String {
    assert!(
        r.get("error").is_none() && r["result"]["isError"] != json!(true),
        "refused: {r}"
    );
    result_text(r)
}

#[test]
fn path_arguments_outside_the_workspace_are_refused_at_the_gateway() {
    let (ws, mut s) = start("workspace", "");
    for path in [
        "/etc/passwd",
        "/workspace/../etc/passwd",
        "/workspace/input/../../etc/passwd",
        "../etc/passwd",
        "~/.ssh/id_ed25519",
        "file:///etc/passwd",
        "file://localhost/etc/passwd",
        "/workspacex/a",
    ] {
        let r = s.call("read", json!({ "path": path }));
        assert_eq!(
            refusal(&r),
            ("argument.path_outside".into(), "tools.outside_paths".into()),
            "{path}"
        );
        // the model is told why in words, not only by a code
        assert!(result_text(&r).contains("outside"), "{r}");
    }
    // inside, the call goes on
    assert_eq!(
        ok_text(&s.call("read", json!({"path": "/workspace/input/hello.txt"}))),
        "hello from the host\n"
    );
    let _ = s.finish();
    let denied: Vec<Value> = audit(&ws)
        .into_iter()
        .filter(|e| e["kind"] == "tool_call" && e["reason"] == "argument.path_outside")
        .collect();
    assert_eq!(denied.len(), 8, "every refusal is audited: {denied:?}");
    // the record names the argument, never its value
    assert!(
        denied.iter().all(|e| !e.to_string().contains("passwd")),
        "{denied:?}"
    );
}

#[test]
fn a_symlink_planted_in_output_that_leads_out_is_refused_at_the_gateway() {
    // the server plants a link to /etc in output (its own target argument
    // is outside on purpose: not_a_path), then is asked to read through it
    let (ws, mut s) = start(
        "workspace",
        "[[tools.arguments]]\ntool = \"symlink\"\nargument = \"target\"\nnot_a_path = true\n",
    );
    ok_text(&s.call(
        "symlink",
        json!({"path": "/workspace/output/etc", "target": "/etc"}),
    ));
    ok_text(&s.call(
        "symlink",
        json!({"path": "/workspace/output/up", "target": "../input/.."}),
    ));
    for path in [
        "/workspace/output/etc/passwd",
        "/workspace/output/etc",
        "/workspace/output/up/../etc/passwd",
    ] {
        let r = s.call("read", json!({ "path": path }));
        assert_eq!(refusal(&r).0, "argument.path_outside", "{path}: {r}");
    }
    // writing through it is refused the same way
    let r = s.call(
        "write",
        json!({"path": "/workspace/output/etc/x", "text": "x"}),
    );
    assert_eq!(refusal(&r).0, "argument.path_outside");
    // a link that stays inside is followed and allowed
    ok_text(&s.call(
        "symlink",
        json!({"path": "/workspace/output/in", "target": "/workspace/input"}),
    ));
    assert_eq!(
        ok_text(&s.call("read", json!({"path": "/workspace/output/in/hello.txt"}))),
        "hello from the host\n"
    );
    let _ = s.finish();
    let why: Vec<String> = audit(&ws)
        .iter()
        .filter(|e| e["reason"] == "argument.path_outside")
        .map(|e| e["detail"].to_string())
        .collect();
    assert!(why.iter().any(|d| d.contains("symlink")), "{why:?}");
}

#[test]
fn a_paths_rule_confines_an_argument_and_its_otherwise_decides() {
    let (_ws, mut s) = start(
        "workspace",
        "[[tools.arguments]]\ntool = \"write\"\nargument = \"path\"\npaths = [\"/workspace/output/reports\"]\notherwise = \"approve\"\n",
    );
    std::fs::create_dir_all(_ws.output().join("reports")).unwrap();
    if common::is_root() {
        std::os::unix::fs::chown(_ws.output().join("reports"), Some(65534), Some(65534)).unwrap();
    }
    ok_text(&s.call(
        "write",
        json!({"path": "/workspace/output/reports/r.md", "text": "r"}),
    ));
    // elsewhere in output: approval, and this host has no elicitation
    let r = s.call(
        "write",
        json!({"path": "/workspace/output/other.md", "text": "x"}),
    );
    assert_eq!(
        refusal(&r),
        ("approval.pending".into(), "tools.arguments[0]".into())
    );
    assert!(!_ws.output().join("other.md").exists());
}

#[test]
fn url_enum_and_length_rules_refuse_what_they_do_not_list() {
    // plain's echo takes any argument and echoes `text`; the rules make
    // its arguments a URL, an enum and a bounded text
    let (ws, mut s) = start(
        "plain",
        r#"
[[tools.arguments]]
tool = "echo"
argument = "url"
hosts = ["*.example.com"]

[[tools.arguments]]
tool = "echo"
argument = "env"
one_of = ["staging", "prod"]

[[tools.arguments]]
tool = "echo"
argument = "text"
max_length = 8
"#,
    );
    assert_eq!(
        ok_text(&s.call(
            "echo",
            json!({"text": "ok", "url": "https://api.example.com/x", "env": "prod"})
        )),
        "ok"
    );
    for (args, reason) in [
        (
            json!({"text": "x", "url": "https://evil.com/"}),
            "argument.host_outside",
        ),
        // user information makes the host evil.com, whatever comes first
        (
            json!({"text": "x", "url": "https://api.example.com@evil.com/"}),
            "argument.host_outside",
        ),
        (
            json!({"text": "x", "url": "https://evil.com\\@api.example.com/"}),
            "argument.host_outside",
        ),
        (
            json!({"text": "x", "env": "production"}),
            "argument.value_refused",
        ),
        (json!({"text": "much too long"}), "argument.too_long"),
    ] {
        let r = s.call("echo", args.clone());
        assert_eq!(refusal(&r).0, reason, "{args}");
    }
    let _ = s.finish();
    let reasons: Vec<String> = audit(&ws)
        .iter()
        .filter(|e| e["kind"] == "tool_call" && e["decision"] == "deny")
        .map(|e| e["reason"].as_str().unwrap_or_default().to_string())
        .collect();
    assert_eq!(reasons.len(), 5, "{reasons:?}");
}

#[test]
fn host_paths_in_arguments_reach_the_server_as_sandbox_paths() {
    let (ws, mut s) = start("workspace", "");
    let host = ws.input().join("hello.txt");
    assert_eq!(
        ok_text(&s.call("read", json!({"path": host}))),
        "hello from the host\n"
    );
    // a host path outside what the sandbox mounts is not translated, and
    // is outside
    let r = s.call("read", json!({"path": ws.path().join("policy.toml")}));
    assert_eq!(refusal(&r).0, "argument.path_outside");
    let _ = s.finish();
    // what the server receives, as plain's history shows it
    let (ws, mut s) = start("plain", "");
    let input = ws.input().display().to_string();
    ok_text(&s.call(
        "echo",
        json!({
            "text": "t",
            "file_path": format!("{input}/src/a.rs"),
            "uri": format!("file://{input}/b%20c"),
            "paths": [format!("{input}/d"), "/workspace/output/e"],
            "content": format!("{input}/is text, not a path"),
        }),
    ));
    let h = s.call("history", json!({}));
    let got = &h["result"]["structuredContent"]["calls"][0]["arguments"];
    assert_eq!(got["file_path"], "/workspace/input/src/a.rs", "{h}");
    assert_eq!(got["uri"], "file:///workspace/input/b%20c");
    assert_eq!(
        got["paths"],
        json!(["/workspace/input/d", "/workspace/output/e"])
    );
    assert_eq!(got["content"], format!("{input}/is text, not a path"));
    let _ = s.finish();
    let translated = audit(&ws)
        .into_iter()
        .filter(|e| e["tool"] == "echo" && e["kind"] == "tool_call")
        .any(|e| e["detail"]["host_paths_translated"] == json!(true));
    assert!(
        translated,
        "the call's record says its paths were translated"
    );
}

/// Asks `plain` for the client's roots, answering its `roots/list` with
/// `roots`; returns the roots the server received.
fn roots_the_server_sees(s: &mut Session, roots: Value) -> Value {
    s.send(&json!({"jsonrpc": "2.0", "id": 900, "method": "tools/call",
                   "params": {"name": "ask_client", "arguments": {}}}));
    let ask = s.recv();
    assert_eq!(ask["method"], "roots/list", "{ask}");
    s.send(
        &json!({"jsonrpc": "2.0", "id": ask["id"], "result": {"roots": roots, "extra": "/home/u"}}),
    );
    let r = s.recv();
    serde_json::from_str(&ok_text(&r)).unwrap()
}

#[test]
fn client_roots_are_translated_and_those_outside_the_sandbox_never_reach_the_server() {
    let (ws, mut s) = start("plain", "");
    let input = ws.input();
    let got = roots_the_server_sees(
        &mut s,
        json!([
            {"uri": format!("file://{}", input.display()), "name": "project"},
            {"uri": format!("file://{}/sub%20dir", input.display())},
            {"uri": "file:///workspace/output", "name": "already the sandbox's"},
            {"uri": "file:///home/someone/.ssh", "name": "outside"},
            {"uri": format!("file://{}", ws.path().display())},
            {"uri": "https://example.com/"},
        ]),
    );
    assert_eq!(
        got,
        json!({"roots": [
            {"uri": "file:///workspace/input", "name": "project"},
            {"uri": "file:///workspace/input/sub%20dir"},
            {"uri": "file:///workspace/output", "name": "already the sandbox's"},
        ]}),
        "only sandbox paths, and nothing else of the answer"
    );
    assert!(!got.to_string().contains(&ws.path().display().to_string()));
    let _ = s.finish();
    let flags: Vec<Value> = audit(&ws)
        .into_iter()
        .filter(|e| e["reason"] == "root.outside")
        .collect();
    assert_eq!(flags.len(), 1, "{flags:?}");
    assert_eq!(flags[0]["detail"]["dropped"], json!(3));
}
