//! `mcpbox run` through the real binary: the project's own hostile servers
//! run inside the sandbox, a JSON-RPC client plays the host. Named after
//! the attack each tries.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use crate::common;

use std::path::{Path, PathBuf};

use common::mcp::{holds_reserved_meta, result_text, testserver, Session};
use common::{mcpbox, Workspace};
use serde_json::{json, Value};

/// The test server copied into input/ under a name unique to this test, so
/// that a scan of the host's processes finds only this test's server.
fn unique_server_ws(name: &str) -> (Workspace, String) {
    let ws = Workspace::new();
    let alias = format!(
        "{name}-{}",
        ws.path().file_name().unwrap().to_string_lossy()
    );
    std::fs::copy(testserver(name), ws.input().join(&alias)).unwrap();
    std::fs::set_permissions(
        ws.input().join(&alias),
        std::os::unix::fs::PermissionsExt::from_mode(0o755),
    )
    .unwrap();
    (ws, alias)
}

/// Host processes whose command line mentions `marker`.
fn processes_with(marker: &str) -> Vec<String> {
    std::fs::read_dir("/proc")
        .unwrap()
        .flatten()
        .filter_map(|e| std::fs::read(e.path().join("cmdline")).ok())
        .map(|c| String::from_utf8_lossy(&c).into_owned())
        .filter(|c| c.contains(marker))
        .collect()
}

/// A workspace with the given test server copied into input/.
fn server_ws(name: &str) -> Workspace {
    Workspace::with_server(name)
}

/// Policy with an audit log and a state dir inside the workspace.
fn policy(ws: &Workspace, extra: &str) -> PathBuf {
    ws.policy(&format!("[audit]\npath = \"audit.db\"\n{extra}"))
}

fn state_env(ws: &Workspace) -> (String, String) {
    (
        "MCPBOX_STATE_DIR".into(),
        ws.path().join("state").display().to_string(),
    )
}

fn start(ws: &Workspace, p: &Path, server: &str, env: &[(&str, &str)]) -> Session {
    let (k, v) = state_env(ws);
    let mut all: Vec<(&str, &str)> = vec![(k.as_str(), v.as_str())];
    all.extend_from_slice(env);
    let exe = format!("/workspace/input/{server}");
    Session::start(p, &[exe.as_str()], &all)
}

fn audit_json(ws: &Workspace) -> Vec<Value> {
    common::audit::events(&ws.path().join("audit.db"))
}

#[test]
fn denied_tool_never_reaches_the_sandboxed_server() {
    let ws = server_ws("plain");
    let p = policy(&ws, "[tools]\n\"write_*\" = \"deny\"\n");
    let mut s = start(&ws, &p, "plain", &[]);
    s.initialize();
    let names = s.tool_names();
    assert!(
        !names.contains(&"write_file".to_string()),
        "denied tool listed: {names:?}"
    );
    let r = s.call("write_file", json!({"path": "/workspace/output/x"}));
    assert_eq!(r["result"]["isError"], json!(true), "{r}");
    assert!(result_text(&r).contains("tool.rule"), "{r}");
    // The server's own record of calls: the denied one never arrived.
    let history = s.call("history", json!({}));
    assert!(!history.to_string().contains("write_file"), "{history}");
    let (status, _) = s.finish();
    assert!(status.success());
    let audit = audit_json(&ws);
    assert!(
        audit
            .iter()
            .any(|e| e["tool"] == json!("write_file") && e["decision"] == json!("deny")),
        "{audit:?}"
    );
}

#[test]
fn secret_is_redacted_from_results_errors_and_stderr() {
    let ws = server_ws("echo_secrets");
    let secret = "s3cr3t-VALUE-4242-xyz";
    let p = policy(
        &ws,
        "[secrets]\nAPI_TOKEN = { from_env = \"MCPBOX_TEST_TOKEN\" }\n",
    );
    let mut s = start(&ws, &p, "echo_secrets", &[("MCPBOX_TEST_TOKEN", secret)]);
    s.initialize();
    let names = s.tool_names();
    let tool = names
        .iter()
        .find(|n| !n.contains("error"))
        .cloned()
        .unwrap();
    let r = s.call(&tool, json!({"var": "API_TOKEN"}));
    let text = r.to_string();
    assert!(!text.contains(secret), "secret leaked: {text}");
    assert!(text.contains("[REDACTED:API_TOKEN]"), "{text}");
    if names.iter().any(|n| n == "leak_error") {
        let r = s.call("leak_error", json!({"var": "API_TOKEN"}));
        assert!(!r.to_string().contains(secret), "{r}");
    }
    let (_, stderr) = s.finish();
    assert!(
        !stderr.contains(secret),
        "secret in mcpbox's stderr: {stderr}"
    );
    // the server's stderr reaches ours by default, redacted
    assert!(
        stderr.contains("mcpbox: [policy] ") && stderr.contains("[REDACTED:API_TOKEN]"),
        "{stderr}"
    );
    // Nothing of it in the audit log either.
    let db = std::fs::read(ws.path().join("audit.db")).unwrap();
    assert!(!String::from_utf8_lossy(&db).contains(secret));
}

#[test]
fn rug_pull_is_withheld_until_pin_accept() {
    let ws = server_ws("rugpull");
    let p = policy(&ws, "");
    let mut s = start(&ws, &p, "rugpull", &[]);
    s.initialize();
    let first = s.tool_names();
    let second = s.tool_names();
    assert!(
        !second.contains(&"exfil".to_string()),
        "a tool added after pinning must be withheld: {second:?}"
    );
    assert!(second.len() < first.len() + 1);
    let r = s.call("exfil", json!({}));
    assert!(r.to_string().contains("pin."), "{r}");
    s.finish();
    let audit = audit_json(&ws);
    assert!(
        audit.iter().any(|e| e["kind"] == json!("pin_change")),
        "{audit:?}"
    );
    // A human reviews the change, then accepts it; the next session shows it.
    let (k, v) = state_env(&ws);
    let pin = |op: &str| {
        let out = std::process::Command::new(mcpbox())
            .args(["pin", op, "--policy"])
            .arg(&p)
            .env(&k, &v)
            .output()
            .unwrap();
        assert!(
            out.status.success(),
            "pin {op}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        String::from_utf8_lossy(&out.stdout).into_owned()
    };
    let diff = pin("diff");
    assert!(diff.contains("+ exfil (new tool)"), "{diff}");
    let accepted = pin("accept");
    assert!(
        accepted.contains("+ exfil") && accepted.contains("accepted"),
        "{accepted}"
    );
    assert!(pin("list").contains("exfil"));
    assert!(pin("diff").contains("nothing pending"));
    let mut s = start(&ws, &p, "rugpull", &[]);
    s.initialize();
    let _ = s.tool_names();
    let again = s.tool_names();
    assert!(again.contains(&"exfil".to_string()), "{again:?}");
    s.finish();
    // reset forgets them: the next list is pinned as it comes
    assert!(pin("reset").contains("reset server"));
    assert!(pin("list").contains("no pins"));
}

/// Pins used to be keyed by the policy's name alone: a second server under
/// the same policy found the first one's pins, and every tool of its own
/// was withheld as new (and each overwrote the other's file).
#[test]
fn two_servers_sharing_one_policy_keep_pins_of_their_own() {
    let ws = server_ws("plain");
    std::fs::copy(testserver("echo_secrets"), ws.input().join("echo_secrets")).unwrap();
    let p = policy(&ws, "");
    let mut a = start(&ws, &p, "plain", &[]);
    a.initialize();
    let a_tools = a.tool_names();
    assert!(!a_tools.is_empty());
    a.finish();
    let mut b = start(&ws, &p, "echo_secrets", &[]);
    b.initialize();
    let b_tools = b.tool_names();
    assert!(
        !b_tools.is_empty(),
        "the second server's tools are withheld as new"
    );
    assert_ne!(a_tools, b_tools);
    b.finish();
    // the first server's pins are untouched: its tools are all still there
    let mut a = start(&ws, &p, "plain", &[]);
    a.initialize();
    assert_eq!(a.tool_names(), a_tools);
    a.finish();
    let pins: Vec<_> = std::fs::read_dir(ws.path().join("state/pins"))
        .unwrap()
        .flatten()
        .collect();
    assert_eq!(pins.len(), 1, "one directory for the policy: {pins:?}");
    let files = std::fs::read_dir(pins[0].path()).unwrap().count();
    assert_eq!(files, 2, "a pin file per server");
}

#[test]
fn server_crash_mid_call_answers_every_in_flight_request() {
    let ws = server_ws("crasher");
    let p = policy(&ws, "");
    let mut s = start(&ws, &p, "crasher", &[]);
    s.initialize();
    s.send(&json!({"jsonrpc": "2.0", "id": 100, "method": "tools/call", "params": {"name": "crash", "arguments": {}}}));
    s.send(&json!({"jsonrpc": "2.0", "id": 101, "method": "tools/call", "params": {"name": "echo", "arguments": {"text": "x"}}}));
    let mut answered = std::collections::HashSet::new();
    while answered.len() < 2 {
        let m = s.recv();
        if let Some(id) = m.get("id").and_then(Value::as_u64) {
            assert!(m.get("error").is_some() || m.get("result").is_some(), "{m}");
            answered.insert(id);
        }
    }
    assert!(answered.contains(&100) && answered.contains(&101));
    let (status, _) = s.finish();
    assert_eq!(
        status.code(),
        Some(3),
        "mcpbox passes the server's exit status on"
    );
}

#[test]
fn garbage_on_server_stdout_never_reaches_the_host() {
    let ws = server_ws("garbage");
    let p = policy(&ws, "");
    let mut s = start(&ws, &p, "garbage", &[]);
    let init = s.initialize();
    assert!(init.get("result").is_some(), "{init}");
    let names = s.tool_names();
    assert!(!names.is_empty());
    s.finish();
}

#[test]
fn flooding_result_is_truncated_with_a_marker() {
    let ws = server_ws("flood");
    let p = policy(&ws, "[output]\nmax_result = \"64KiB\"\n");
    let mut s = start(&ws, &p, "flood", &[]);
    s.initialize();
    let r = s.call("big", json!({"mib": 8}));
    let text = result_text(&r);
    assert!(
        text.len() < 128 * 1024,
        "result not truncated: {} bytes",
        text.len()
    );
    assert!(text.contains("truncated"), "no truncation marker");
    s.finish();
}

#[test]
fn batch_request_is_refused() {
    let ws = server_ws("plain");
    let p = policy(&ws, "");
    let mut s = start(&ws, &p, "plain", &[]);
    s.initialize();
    s.send_raw(r#"[{"jsonrpc":"2.0","id":7,"method":"tools/list"}]"#);
    let m = s.recv();
    assert_eq!(m["error"]["code"], json!(-32600), "{m}");
    s.finish();
}

#[test]
fn host_closing_stdin_stops_the_server_and_leaves_nothing_running() {
    let (ws, alias) = unique_server_ws("plain");
    let p = policy(&ws, "");
    let mut s = start(&ws, &p, &alias, &[]);
    s.initialize();
    assert!(
        !processes_with(&alias).is_empty(),
        "the server should be running"
    );
    let (status, _) = s.finish();
    assert!(status.success());
    assert_eq!(
        processes_with(&alias),
        Vec::<String>::new(),
        "left running after mcpbox exited"
    );
}

#[test]
fn audit_records_calls_with_digests_never_arguments() {
    let ws = server_ws("plain");
    let p = policy(&ws, "");
    let mut s = start(&ws, &p, "plain", &[]);
    s.initialize();
    let r = s.call("echo", json!({"text": "very-private-argument-9731"}));
    assert!(result_text(&r).contains("very-private-argument-9731"));
    s.finish();
    let audit = audit_json(&ws);
    let call = audit
        .iter()
        .find(|e| e["tool"] == json!("echo"))
        .expect("echo call audited");
    assert_eq!(call["decision"], json!("allow"));
    assert_eq!(
        call["args_digest"].as_str().map(str::len),
        Some(64),
        "{call}"
    );
    assert!(audit.iter().any(|e| e["kind"] == json!("session_start")));
    assert!(audit.iter().any(|e| e["kind"] == json!("session_end")));
    let db = std::fs::read(ws.path().join("audit.db")).unwrap();
    assert!(!String::from_utf8_lossy(&db).contains("very-private-argument-9731"));
    let verify = std::process::Command::new(mcpbox())
        .args(["audit", "--verify", "--db"])
        .arg(ws.path().join("audit.db"))
        .env("MCPBOX_STATE_DIR", ws.path().join("state"))
        .output()
        .unwrap();
    assert!(
        verify.status.success(),
        "{}",
        String::from_utf8_lossy(&verify.stdout)
    );
}

#[test]
fn session_records_say_what_ran_who_asked_and_which_protocol() {
    let ws = server_ws("plain");
    let p = policy(&ws, "");
    let mut s = start(&ws, &p, "plain", &[]);
    s.initialize();
    s.call("echo", json!({"text": "x"}));
    s.finish();
    let audit = audit_json(&ws);
    let start = audit
        .iter()
        .find(|e| e["kind"] == "session_start")
        .expect("session_start");
    let d = &start["detail"];
    assert_eq!(
        d["server"],
        json!(r#"command:["/workspace/input/plain"]"#),
        "{start}"
    );
    assert_eq!(d["policy"], "policy");
    assert_eq!(
        d["policy_sha256"].as_str().map(str::len),
        Some(64),
        "{start}"
    );
    // the host named itself at initialize: every later record says so
    let call = audit.iter().find(|e| e["kind"] == "tool_call").unwrap();
    assert_eq!(call["caller"], "stdio:mcpbox-test/0", "{call}");
    let end = audit.iter().find(|e| e["kind"] == "session_end").unwrap();
    assert_eq!(end["detail"]["protocol"], "2025-11-25", "{end}");
}

#[test]
fn deleting_the_newest_audit_records_and_rewriting_the_head_is_reported_by_verify() {
    let ws = server_ws("plain");
    let p = policy(&ws, "");
    let mut s = start(&ws, &p, "plain", &[]);
    s.initialize();
    for i in 0..3 {
        s.call("echo", json!({ "text": format!("call {i}") }));
    }
    s.finish();
    let db = ws.path().join("audit.db");
    let verify = || {
        std::process::Command::new(mcpbox())
            .args(["audit", "--verify", "--db"])
            .arg(&db)
            .env("MCPBOX_STATE_DIR", ws.path().join("state"))
            .output()
            .unwrap()
    };
    let ok = verify();
    let text = String::from_utf8_lossy(&ok.stdout).into_owned();
    assert!(
        ok.status.success() && text.contains("its head signed"),
        "{text}"
    );
    // verified with another key, the log says whose signature it carries
    let other = ws.path().join("other.key");
    std::fs::write(&other, "ab".repeat(32)).unwrap();
    let out = std::process::Command::new(mcpbox())
        .args(["audit", "--verify", "--db"])
        .arg(&db)
        .arg("--key")
        .arg(&other)
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&out.stdout).into_owned();
    assert_eq!(out.status.code(), Some(1), "{text}");
    assert!(
        text.contains("chain.key_unknown") && text.contains("another key"),
        "{text}"
    );
    // the editor removes what the last call did and makes the chain whole
    let conn = rusqlite::Connection::open(&db).unwrap();
    let last: i64 = conn
        .query_row("SELECT max(seq) FROM events", [], |r| r.get(0))
        .unwrap();
    let keep = last - 3;
    conn.execute("DELETE FROM events WHERE seq > ?1", [keep])
        .unwrap();
    conn.execute(
        "UPDATE chain_head SET seq = ?1, hash = (SELECT hash FROM events WHERE seq = ?1)",
        [keep],
    )
    .unwrap();
    drop(conn);
    let out = verify();
    let text = String::from_utf8_lossy(&out.stdout).into_owned();
    assert_eq!(out.status.code(), Some(1), "{text}");
    assert!(
        text.contains(&format!("BROKEN at seq {} (chain.head_forged)", keep + 1)),
        "{text}"
    );
}

#[test]
fn session_without_tools_list_does_not_pin_an_empty_tool_set() {
    // Regression: an initialize-only session once pinned "no tools", and
    // every later session withheld every tool as new.
    let ws = server_ws("plain");
    let p = policy(&ws, "");
    let mut s = start(&ws, &p, "plain", &[]);
    s.initialize();
    let r = s.call("echo", json!({"text": "before any list"}));
    assert_eq!(result_text(&r), "before any list");
    s.finish();
    let mut s = start(&ws, &p, "plain", &[]);
    s.initialize();
    let names = s.tool_names();
    assert!(
        names.contains(&"echo".to_string()),
        "tools withheld after an initialize-only session: {names:?}"
    );
    s.finish();
}

#[test]
fn call_to_a_tool_outside_the_pins_is_refused_even_without_a_list() {
    let ws = server_ws("rugpull");
    let p = policy(&ws, "");
    let mut s = start(&ws, &p, "rugpull", &[]);
    s.initialize();
    let first = s.tool_names();
    assert!(!first.contains(&"exfil".to_string()));
    s.finish();
    // A new session calls the unpinned tool straight away, never listing.
    let mut s = start(&ws, &p, "rugpull", &[]);
    s.initialize();
    let r = s.call("exfil", json!({"data": "x"}));
    assert_eq!(r["result"]["isError"], json!(true), "{r}");
    assert!(r.to_string().contains("pin.new"), "{r}");
    s.finish();
}

#[test]
fn sigterm_to_mcpbox_ends_the_session_without_losing_audit_records() {
    let (ws, alias) = unique_server_ws("plain");
    let p = policy(&ws, "");
    let mut s = start(&ws, &p, &alias, &[]);
    s.initialize();
    assert_eq!(result_text(&s.call("echo", json!({"text": "hi"}))), "hi");
    std::process::Command::new("kill")
        .arg("-TERM")
        .arg(s.child.id().to_string())
        .status()
        .unwrap();
    // mcpbox stops the server, answers, writes its last records, exits.
    let status = s.child.wait().unwrap();
    assert!(
        status.code().is_some(),
        "mcpbox should exit, not die of the signal: {status:?}"
    );
    let audit = audit_json(&ws);
    let kinds: Vec<&str> = audit.iter().filter_map(|e| e["kind"].as_str()).collect();
    assert!(
        kinds.contains(&"server_exit") && kinds.contains(&"session_end"),
        "{kinds:?}"
    );
    assert_eq!(
        processes_with(&alias),
        Vec::<String>::new(),
        "the server survived"
    );
}

/// A host that writes all its requests and closes its end at once (a shell
/// pipe, as `scripts/demo` does) gets every one answered by the server or
/// the policy, not "server stopped": the relay delivers what arrived while
/// the sandbox was starting before it closes the server's stdin.
#[test]
fn requests_piped_with_eof_right_behind_them_are_all_answered() {
    use std::io::Write;
    let ws = server_ws("plain");
    let p = policy(&ws, "[tools]\n\"delete_*\" = \"deny\"\n");
    let (k, v) = state_env(&ws);
    let mut child = std::process::Command::new(mcpbox())
        .args(["run", "--policy"])
        .arg(&p)
        .args(["--", "/workspace/input/plain"])
        .env(k, v)
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::null())
        .spawn()
        .unwrap();
    let input = [
        json!({"jsonrpc":"2.0","id":1,"method":"initialize","params":{"protocolVersion":"2025-11-25","capabilities":{},"clientInfo":{"name":"t","version":"0"}}}),
        json!({"jsonrpc":"2.0","method":"notifications/initialized"}),
        json!({"jsonrpc":"2.0","id":2,"method":"tools/call","params":{"name":"echo","arguments":{"text":"piped"}}}),
        json!({"jsonrpc":"2.0","id":3,"method":"tools/call","params":{"name":"delete_all","arguments":{}}}),
    ];
    let mut stdin = child.stdin.take().unwrap();
    for m in &input {
        writeln!(stdin, "{m}").unwrap();
    }
    drop(stdin);
    let out = child.wait_with_output().unwrap();
    let answers: Vec<Value> = String::from_utf8_lossy(&out.stdout)
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    let by_id = |id: i64| answers.iter().find(|a| a["id"] == json!(id)).cloned();
    assert_eq!(answers.len(), 3, "{answers:?}");
    assert!(by_id(1).unwrap()["result"]["serverInfo"].is_object());
    assert_eq!(result_text(&by_id(2).unwrap()), "piped");
    let denied = by_id(3).unwrap();
    assert_eq!(denied["result"]["isError"], json!(true), "{denied}");
}

#[test]
fn special_files_a_server_leaves_in_output_are_reported_and_audited() {
    let ws = server_ws("workspace");
    // the symlinks' targets are outside on purpose: the server plants them
    let p = policy(
        &ws,
        "[tools]\ndefault = \"allow\"\n[[tools.arguments]]\ntool = \"symlink\"\nargument = \"target\"\nnot_a_path = true\n",
    );
    let mut s = start(&ws, &p, "workspace", &[]);
    s.initialize();
    let o = "/workspace/output";
    for (tool, args) in [
        (
            "write",
            json!({"path": format!("{o}/plain.txt"), "text": "fine"}),
        ),
        (
            "symlink",
            json!({"path": format!("{o}/key"), "target": "/root/.ssh/id_ed25519"}),
        ),
        ("mkfifo", json!({"path": format!("{o}/pipe")})),
        (
            "hardlink",
            json!({"path": format!("{o}/twin"), "target": format!("{o}/plain.txt")}),
        ),
    ] {
        let r = s.call(tool, args);
        assert!(
            r.get("error").is_none() && r["result"]["isError"] != json!(true),
            "{tool}: {r}"
        );
    }
    let (status, stderr) = s.finish();
    assert!(status.success(), "{stderr}");
    for name in ["key", "pipe", "twin"] {
        assert!(
            stderr.contains(&format!("  {name}: ")),
            "{name} not reported:\n{stderr}"
        );
    }
    let audit = audit_json(&ws);
    let flag = audit
        .iter()
        .find(|e| e["reason"] == "output.special_file")
        .unwrap_or_else(|| panic!("no flag record: {audit:?}"));
    assert!(flag["detail"]["count"].as_u64().unwrap() >= 3, "{flag}");
}

#[test]
fn a_session_that_stays_open_has_its_old_records_removed_while_it_runs() {
    // a gateway or a long session never opens the log again: retention
    // must not wait for the next one
    let ws = server_ws("plain");
    let p = policy(&ws, "keep = \"3s\"\n");
    let mut s = start(&ws, &p, "plain", &[]);
    s.initialize();
    s.call("echo", json!({"text": "early"}));
    // past keep, and past the next retention (every keep/2) after it; the
    // late call is removed only by a retention 3 s after it, long after
    // the session ends
    std::thread::sleep(std::time::Duration::from_millis(4500));
    s.call("echo", json!({"text": "late"}));
    let retained_before_the_end = audit_json(&ws).iter().any(|e| e["kind"] == "retention");
    s.finish();
    assert!(
        retained_before_the_end,
        "retention ran while the session was open"
    );
    let audit = audit_json(&ws);
    let calls: Vec<_> = audit.iter().filter(|e| e["kind"] == "tool_call").collect();
    assert_eq!(
        calls.len(),
        1,
        "the early call is gone, the late kept: {audit:#?}"
    );
    let out = std::process::Command::new(mcpbox())
        .args(["audit", "--verify", "--db"])
        .arg(ws.path().join("audit.db"))
        .env("MCPBOX_STATE_DIR", ws.path().join("state"))
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success() && text.contains("retention removed 1 to"),
        "{text}"
    );
}

#[test]
fn audit_prune_applies_the_policys_retention_now_and_verify_still_holds() {
    let ws = server_ws("plain");
    let p = policy(&ws, "");
    let mut s = start(&ws, &p, "plain", &[]);
    s.initialize();
    for i in 0..150 {
        s.call("echo", json!({ "text": format!("call {i}") }));
    }
    s.finish();
    let (k, v) = state_env(&ws);
    let audit = |args: &[&str]| {
        let out = std::process::Command::new(mcpbox())
            .arg("audit")
            .args(args)
            .env(&k, &v)
            .output()
            .unwrap();
        (
            out.status.code(),
            String::from_utf8_lossy(&out.stdout).into_owned(),
            String::from_utf8_lossy(&out.stderr).into_owned(),
        )
    };
    let pol = p.to_str().unwrap();
    // no retention in the policy: a clear refusal, nothing removed
    let (code, _, err) = audit(&["--prune", "--policy", pol]);
    assert_eq!(code, Some(2), "{err}");
    assert!(err.contains("sets no retention"), "{err}");
    let before = audit_json(&ws).len();
    let p = policy(&ws, "max_size = \"16KiB\"\n");
    let (code, out, err) = audit(&["--prune", "--policy", p.to_str().unwrap()]);
    assert_eq!(code, Some(0), "{err}");
    assert!(
        out.contains("removed") && out.contains("records (through seq"),
        "{out}"
    );
    let after = audit_json(&ws);
    assert!(after.len() < before, "{} of {before} left", after.len());
    assert!(after.iter().any(|e| e["kind"] == "retention"), "{after:#?}");
    let (code, out, err) = audit(&["--verify", "--policy", p.to_str().unwrap()]);
    assert_eq!(code, Some(0), "{out}{err}");
    assert!(out.contains("retention removed 1 to"), "{out}");
    // a retention by age that nothing is past removes nothing
    let p = policy(&ws, "keep = \"30d\"\n");
    let (code, out, _) = audit(&["--prune", "--policy", p.to_str().unwrap()]);
    assert_eq!(code, Some(0));
    assert!(out.contains("nothing is past the retention"), "{out}");
}

#[test]
fn retention_removes_old_records_and_more_deleted_behind_it_is_reported_by_verify() {
    let ws = server_ws("plain");
    let p = policy(&ws, "max_size = \"64KiB\"\n");
    let db = ws.path().join("audit.db");
    // two sessions: the second opens a log over its size and trims it
    for round in 0..2 {
        let mut s = start(&ws, &p, "plain", &[]);
        s.initialize();
        for i in 0..150 {
            s.call("echo", json!({ "text": format!("round {round} call {i}") }));
        }
        s.finish();
    }
    let verify = || {
        let out = std::process::Command::new(mcpbox())
            .args(["audit", "--verify", "--db"])
            .arg(&db)
            .env("MCPBOX_STATE_DIR", ws.path().join("state"))
            .output()
            .unwrap();
        (
            out.status.success(),
            String::from_utf8_lossy(&out.stdout).into_owned(),
        )
    };
    let (ok, text) = verify();
    assert!(ok && text.contains("retention removed 1 to"), "{text}");
    assert!(text.contains("its head signed"), "{text}");
    let audit = audit_json(&ws);
    let retention = audit
        .iter()
        .find(|e| e["kind"] == "retention")
        .unwrap_or_else(|| panic!("retention is a record too: {audit:#?}"));
    let through = retention["detail"]["through_seq"].as_i64().unwrap();
    assert!(through > 0, "{retention}");
    // the editor deletes older records still and moves the base to match:
    // the base's signature does not
    let conn = rusqlite::Connection::open(&db).unwrap();
    let cut = through + 10;
    let hash: String = conn
        .query_row("SELECT hash FROM events WHERE seq = ?1", [cut], |r| {
            r.get(0)
        })
        .unwrap();
    conn.execute("DELETE FROM events WHERE seq <= ?1", [cut])
        .unwrap();
    conn.execute(
        "UPDATE chain_base SET seq = ?1, hash = ?2 WHERE id = 1",
        rusqlite::params![cut, hash],
    )
    .unwrap();
    let (ok, text) = verify();
    assert!(!ok && text.contains("chain.base_forged"), "{text}");
    assert!(text.contains(&format!("seq {cut}")), "{text}");
}

/// A PIN of ten digits (fits 64 bits) and an account number of 25 (does
/// not: the parser keeps 17 of its digits).
const PIN: &str = "9071553018";
const ACCOUNT: &str = "4929123456789012345678901";

/// Every message mcpbox sends until the answer with `id` (included).
fn until_answer(s: &mut Session, id: u64) -> Vec<Value> {
    let mut seen = Vec::new();
    loop {
        let msg = s.recv();
        let done = msg.get("id") == Some(&json!(id)) && msg.get("method").is_none();
        seen.push(msg);
        if done {
            return seen;
        }
    }
}

#[test]
fn a_secret_of_digits_sent_as_a_json_number_never_reaches_the_host() {
    let ws = server_ws("forger");
    let p = policy(
        &ws,
        "[secrets]\nPIN = { from_env = \"T_PIN\" }\nACCOUNT = { from_env = \"T_ACCOUNT\" }\n",
    );
    let mut s = start(&ws, &p, "forger", &[("T_PIN", PIN), ("T_ACCOUNT", ACCOUNT)]);
    s.initialize();
    // in a result, its structured content, its _meta and an object key
    let r = s.call("number", json!({"var": "PIN"}));
    let text = r.to_string();
    assert!(!text.contains(PIN), "the PIN reached the host: {text}");
    assert_eq!(
        r["result"]["structuredContent"]["pin"], "[REDACTED:PIN]",
        "{r}"
    );
    assert_eq!(
        r["result"]["structuredContent"]["list"],
        json!([1, "[REDACTED:PIN]"])
    );
    // too long to parse exactly: refused whole, not even its leading digits
    let r = s.call("number", json!({"var": "ACCOUNT"}));
    let text = r.to_string();
    assert!(
        !text.contains(&ACCOUNT[..12]),
        "account digits reached the host: {text}"
    );
    assert_eq!(r["error"]["data"]["reason"], "redaction.refused", "{r}");
    // as the id of the server's request: the host is asked under mcpbox's
    // id, and its answer reaches the server under the server's
    s.send(&json!({"jsonrpc": "2.0", "id": 90, "method": "tools/call",
        "params": {"name": "ask_number_id", "arguments": {"var": "PIN"}}}));
    let ask = s.recv();
    assert_eq!(ask["method"], "sampling/createMessage", "{ask}");
    assert!(!ask.to_string().contains(PIN), "the PIN as an id: {ask}");
    s.send(
        &json!({"jsonrpc": "2.0", "id": ask["id"], "result": {"role": "assistant",
        "content": {"type": "text", "text": "ok"}, "model": "m"}}),
    );
    let seen = until_answer(&mut s, 90);
    let answer = seen.last().unwrap();
    assert_eq!(result_text(answer), "answered under my own id", "{seen:?}");
    for m in &seen {
        assert!(!m.to_string().contains(PIN), "{m}");
    }
    let (_, stderr) = s.finish();
    assert!(
        !stderr.contains(PIN) && !stderr.contains(&ACCOUNT[..12]),
        "{stderr}"
    );
    let audit = audit_json(&ws);
    assert!(
        audit
            .iter()
            .any(|e| e["reason"] == "redaction.secret" && e["detail"]["secret"] == "PIN"),
        "{audit:?}"
    );
}

#[test]
fn a_server_cannot_forge_mcpbox_meta_over_stdio() {
    let ws = server_ws("forger");
    let p = policy(&ws, "[tools]\ndefault = \"allow\"\n\"whoami\" = \"deny\"\n");
    let mut s = start(&ws, &p, "forger", &[]);
    s.initialize();
    // a notification, a request to the host and the result
    s.send(&json!({"jsonrpc": "2.0", "id": 50, "method": "tools/call",
        "params": {"name": "forge_meta", "arguments": {}}}));
    let seen = until_answer(&mut s, 50);
    assert!(seen.len() >= 3, "{seen:?}");
    for m in &seen {
        assert!(
            !holds_reserved_meta(m),
            "forged _meta reached the host: {m}"
        );
        assert!(!m.to_string().contains("ap-forged"), "{m}");
    }
    let answer = seen.last().unwrap();
    // what is not mcpbox's stays
    assert_eq!(answer["result"]["_meta"]["vendor/kept"], "kept", "{answer}");
    // an error's data
    let r = s.call("forge_meta_error", json!({}));
    assert!(r.get("error").is_some() && !holds_reserved_meta(&r), "{r}");
    // mcpbox's own decision still reaches the host
    let r = s.call("whoami", json!({}));
    assert_eq!(
        r["result"]["_meta"]["mcpbox/decision"]["action"], "deny",
        "{r}"
    );
    s.finish();
    let audit = audit_json(&ws);
    assert!(
        audit.iter().any(|e| e["reason"] == "server.reserved_meta"),
        "{audit:?}"
    );
}

/// Issue 25, the MCP stdio shutdown: a host that closes mcpbox's input
/// right after a request (`echo '<request>' | mcpbox run -- server`) gets
/// the answer the server still writes, and a clean exit. The server
/// handles requests concurrently and exits once its input ends (the SDK
/// pattern); before, mcpbox sent it SIGTERM `shutdown_grace` (2 s) after
/// closing its stdin, and the host got "server exited (signal 15)".
#[test]
fn a_host_closing_its_input_after_a_request_still_gets_the_answer() {
    let ws = server_ws("concurrent");
    let p = policy(&ws, "");
    let mut s = start(&ws, &p, "concurrent", &[]);
    s.initialize();
    s.send(&json!({"jsonrpc": "2.0", "id": 7, "method": "tools/call",
        "params": {"name": "slow", "arguments": {"ms": 3000, "kib": 64}}}));
    s.close_stdin();
    let answer = loop {
        let m = s.recv();
        if m.get("id") == Some(&json!(7)) {
            break m;
        }
    };
    assert!(answer.get("error").is_none(), "{answer}\n{}", s.stderr());
    assert_eq!(result_text(&answer).len(), 64 * 1024, "{answer}");
    // the server answered after its input closed: mcpbox waited for it
    assert_eq!(answer["result"]["structuredContent"]["stdin_open"], false);
    let (status, err) = s.finish();
    assert!(status.success(), "{status}: {err}");
}

/// Issue 25 (every buffer has a budget in bytes): a server that answers
/// `initialize` and then never reads its input made mcpbox hold whatever
/// the host sent it, without end. Past 16 MiB unread the server is taken
/// for hung and stopped (and `run` ends, as for a server that exited),
/// and mcpbox never held much more than that, however much the host sent.
#[test]
fn a_server_that_stops_reading_its_input_cannot_make_mcpbox_hold_without_end() {
    use std::io::{BufRead, BufReader, Write};
    let ws = Workspace::new();
    std::fs::write(
        ws.input().join("deaf.py"),
        "import json, sys, time\n\
         line = sys.stdin.readline()\n\
         req = json.loads(line)\n\
         print(json.dumps({'jsonrpc': '2.0', 'id': req['id'], 'result': {\n\
             'protocolVersion': '2025-11-25', 'capabilities': {'tools': {}},\n\
             'serverInfo': {'name': 'deaf', 'version': '0'}}}), flush=True)\n\
         time.sleep(600)\n",
    )
    .unwrap();
    let p = policy(&ws, "[tools]\ndefault = \"allow\"\n");
    let mut child = std::process::Command::new(common::mcpbox())
        .args(["run", "--policy"])
        .arg(&p)
        .args(["--", "/usr/bin/python3", "/workspace/input/deaf.py"])
        .env("MCPBOX_STATE_DIR", ws.path().join("state"))
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let pid = child.id();
    // the highest resident set seen while it runs
    let peak = std::sync::Arc::new(std::sync::atomic::AtomicU64::new(0));
    let watch = {
        let peak = peak.clone();
        std::thread::spawn(move || loop {
            let Ok(status) = std::fs::read_to_string(format!("/proc/{pid}/status")) else {
                return;
            };
            let kib: u64 = status
                .lines()
                .find_map(|l| l.strip_prefix("VmRSS:"))
                .and_then(|v| v.split_whitespace().next()?.parse().ok())
                .unwrap_or(0);
            if kib == 0 {
                return;
            }
            peak.fetch_max(kib, std::sync::atomic::Ordering::Relaxed);
            std::thread::sleep(std::time::Duration::from_millis(5));
        })
    };
    let mut stdin = child.stdin.take().unwrap();
    let mut out = BufReader::new(child.stdout.take().unwrap());
    writeln!(
        stdin,
        "{}",
        json!({"jsonrpc": "2.0", "id": 1, "method": "initialize",
        "params": {"protocolVersion": "2025-11-25", "capabilities": {},
                   "clientInfo": {"name": "t", "version": "0"}}})
    )
    .unwrap();
    let mut line = String::new();
    out.read_line(&mut line).unwrap();
    assert!(line.contains("deaf"), "{line}");
    writeln!(
        stdin,
        "{}",
        json!({"jsonrpc": "2.0", "method": "notifications/initialized"})
    )
    .unwrap();
    // up to 64 MiB in calls the server never reads; mcpbox may end first
    let big = "x".repeat(512 << 10);
    for id in 0..128u64 {
        let msg = json!({"jsonrpc": "2.0", "id": 1000 + id, "method": "tools/call",
            "params": {"name": "echo", "arguments": {"text": big}}});
        if writeln!(stdin, "{msg}").is_err() {
            break;
        }
    }
    drop(stdin);
    let mut rest = String::new();
    let _ = std::io::Read::read_to_string(&mut out, &mut rest);
    let output = child.wait_with_output().unwrap();
    watch.join().unwrap();
    let err = String::from_utf8_lossy(&output.stderr);
    assert!(err.contains("stopped as hung"), "{err}");
    let peak = peak.load(std::sync::atomic::Ordering::Relaxed);
    // the budget (16 MiB) plus a fixed margin for the process itself
    assert!(peak < 80 << 10, "mcpbox held {peak} KiB at its peak");
}
