//! Human approval through every channel, through the real binary: the
//! broker of `mcpbox run` answered by `mcpbox approvals` over the control
//! socket (hold and refuse), by MCP elicitation, by nobody (timeout), and
//! abandoned by a session that dies; and the attacks on it: an approval
//! used twice, one approval presented with another call's arguments, an
//! expired approval, the sandboxed server at the control socket.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use crate::common;

use std::path::{Path, PathBuf};
use std::process::{Command, Output};
use std::time::{Duration, Instant};

use common::audit::events;
use common::mcp::{result_text, Session};
use common::{is_root, mcpbox, Workspace};
use serde_json::{json, Value};

/// A workspace with the plain server, a private runtime directory (so
/// that `mcpbox approvals` sees this test's mcpbox only) and state.
struct Box_ {
    ws: Workspace,
    policy: PathBuf,
}

impl Box_ {
    fn new(policy_extra: &str) -> Box_ {
        let ws = Workspace::with_server("plain");
        let xdg = ws.path().join("xdg");
        std::fs::create_dir(&xdg).unwrap();
        std::fs::set_permissions(&xdg, std::os::unix::fs::PermissionsExt::from_mode(0o700))
            .unwrap();
        let policy = ws.policy(&format!(
            "[tools]\ndefault = \"allow\"\n\"echo\" = \"approve\"\n{policy_extra}\n"
        ));
        Box_ { ws, policy }
    }

    fn env(&self) -> Vec<(String, String)> {
        vec![
            (
                "XDG_RUNTIME_DIR".into(),
                self.ws.path().join("xdg").display().to_string(),
            ),
            (
                "MCPBOX_STATE_DIR".into(),
                self.ws.path().join("state").display().to_string(),
            ),
        ]
    }

    fn start(&self) -> Session {
        let env = self.env();
        let env: Vec<(&str, &str)> = env.iter().map(|(k, v)| (k.as_str(), v.as_str())).collect();
        Session::start(&self.policy, &["/workspace/input/plain"], &env)
    }

    /// Starts a session whose host declares form elicitation.
    fn start_eliciting(&self) -> Session {
        let mut s = self.start();
        s.request(
            "initialize",
            json!({"protocolVersion": "2025-11-25", "capabilities": {"elicitation": {}},
                   "clientInfo": {"name": "elicit-host", "version": "0"}}),
        );
        s.send(&json!({"jsonrpc": "2.0", "method": "notifications/initialized"}));
        s
    }

    /// `mcpbox approvals ARGS`.
    fn cli(&self, args: &[&str]) -> Output {
        let mut cmd = Command::new(mcpbox());
        cmd.arg("approvals").args(args);
        for (k, v) in self.env() {
            cmd.env(k, v);
        }
        cmd.output().unwrap()
    }

    /// The approvals listed, as JSON.
    fn list(&self) -> Vec<Value> {
        let out = self.cli(&["list", "--json"]);
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
        serde_json::from_slice::<Value>(&out.stdout)
            .unwrap()
            .as_array()
            .cloned()
            .unwrap()
    }

    /// Waits until `n` approvals are listed; returns them.
    fn wait_listed(&self, n: usize) -> Vec<Value> {
        let end = Instant::now() + Duration::from_secs(20);
        loop {
            let l = self.list();
            if l.len() >= n {
                return l;
            }
            assert!(Instant::now() < end, "no approval listed within 20s: {l:?}");
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    /// Starts the session, sends call `id` with `text` and waits until
    /// its approval is listed; returns the session and the approval's id.
    fn held_call(&self, id: u64, text: &str) -> (Session, String) {
        let mut s = self.start();
        s.initialize();
        s.send(&call_msg(id, text));
        let approval = self.wait_listed(1)[0]["id"].as_str().unwrap().to_string();
        (s, approval)
    }

    fn approve(&self, id: &str) -> Output {
        self.cli(&["approve", id])
    }

    fn audit(&self) -> Vec<Value> {
        events(&self.ws.path().join("state/audit.db"))
    }
}

fn call_msg(id: u64, text: &str) -> Value {
    json!({"jsonrpc": "2.0", "id": id, "method": "tools/call",
           "params": {"name": "echo", "arguments": {"text": text}}})
}

/// The next response with `id`, skipping notifications.
fn response(s: &mut Session, id: u64) -> Value {
    loop {
        let m = s.recv();
        if m.get("id") == Some(&json!(id)) && m.get("method").is_none() {
            return m;
        }
    }
}

fn decision(r: &Value) -> &Value {
    &r["result"]["_meta"]["mcpbox/decision"]
}

fn approval_actions(b: &Box_) -> Vec<String> {
    b.audit()
        .iter()
        .filter(|e| e["kind"] == "approval")
        .map(|e| e["detail"]["action"].as_str().unwrap_or("").to_string())
        .collect()
}

fn ok(out: &Output) -> String {
    assert!(
        out.status.success(),
        "mcpbox approvals failed: {}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).into_owned()
}

#[test]
fn held_call_waits_until_the_cli_approves_it() {
    let b = Box_::new("[approvals]\nfallback = \"hold\"\ntimeout = \"60s\"\n");
    let mut s = b.start();
    s.initialize();
    let mut msg = call_msg(7, "ship it to /workspace/output/report.md");
    msg["params"]["_meta"] = json!({"progressToken": "p-7"});
    s.send(&msg);
    let listed = b.wait_listed(1);
    let a = &listed[0];
    assert_eq!(a["tool"], "echo");
    assert_eq!(a["server"], "policy");
    assert_eq!(a["held"], true);
    assert_eq!(a["subject"]["type"], "call");
    // what the human decides on: the arguments, previewed
    assert_eq!(
        a["preview"]["arguments"]["text"],
        "ship it to /workspace/output/report.md"
    );
    // the table view names it too
    let table = ok(&b.cli(&["list"]));
    assert!(table.contains(a["id"].as_str().unwrap()), "{table}");
    let shown = ok(&b.cli(&["show", a["id"].as_str().unwrap()]));
    assert!(shown.contains("report.md"), "{shown}");
    // the host was told which approval it waits for
    let note = s.recv();
    assert_eq!(note["method"], "notifications/message", "{note}");
    assert!(note["params"]["data"]
        .as_str()
        .unwrap()
        .contains(a["id"].as_str().unwrap()));
    // and, since the call asked for progress, a progress notification
    let progress = s.recv();
    assert_eq!(progress["method"], "notifications/progress", "{progress}");
    assert_eq!(progress["params"]["progressToken"], "p-7");
    let out = ok(&b.approve(a["id"].as_str().unwrap()));
    assert!(out.contains("approved"), "{out}");
    let r = response(&mut s, 7);
    assert_eq!(result_text(&r), "ship it to /workspace/output/report.md");
    assert!(b.list().is_empty());
    s.finish();
    let audit = b.audit();
    let call = audit
        .iter()
        .find(|e| e["kind"] == "tool_call" && e["tool"] == "echo")
        .unwrap();
    assert_eq!(call["reason"], "approval.granted");
    assert!(
        call["source"]
            .as_str()
            .unwrap()
            .starts_with("approval:cli:uid="),
        "{call}"
    );
    assert_eq!(approval_actions(&b), ["requested", "approved"]);
}

#[test]
fn a_bidi_override_in_held_arguments_is_shown_escaped_to_the_approver() {
    // U+202E reverses what follows on screen: "pay \u{202e}001$ ..." reads
    // as a different amount to the human deciding. The preview escaped
    // only control characters; it now escapes the terminal set
    // (mcpbox_policy::terminal), invisible and bidi characters included.
    let b = Box_::new("[approvals]\nfallback = \"hold\"\ntimeout = \"60s\"\n");
    let text = "pay \u{202e}0001$ to \u{2066}mallory\u{2069} \u{200b}now \u{1b}[2J";
    let (mut s, id) = b.held_call(3, text);
    let listed = b.list();
    let shown = listed[0]["preview"]["arguments"]["text"].as_str().unwrap();
    assert_eq!(
        shown,
        "pay \\u{202e}0001$ to \\u{2066}mallory\\u{2069} \\u{200b}now \\u{1b}[2J"
    );
    for view in [ok(&b.cli(&["list"])), ok(&b.cli(&["show", &id]))] {
        assert!(
            !view.contains(['\u{202e}', '\u{2066}', '\u{2069}', '\u{200b}', '\u{1b}']),
            "{view:?}"
        );
    }
    ok(&b.cli(&["deny", &id]));
    let _ = response(&mut s, 3);
    s.finish();
}

#[test]
fn held_call_denied_from_the_cli_never_reaches_the_server() {
    let b = Box_::new("[approvals]\nfallback = \"hold\"\n");
    let (mut s, id) = b.held_call(3, "rm -rf");
    ok(&b.cli(&["deny", &id]));
    let r = response(&mut s, 3);
    assert_eq!(decision(&r)["reason"], "approval.declined");
    let h = s.call("history", json!({}));
    assert!(!result_text(&h).contains("rm -rf"), "{h}");
    s.finish();
    assert_eq!(approval_actions(&b), ["requested", "denied"]);
}

#[test]
fn refused_call_approved_then_retried_passes_exactly_once() {
    let b = Box_::new("");
    let mut s = b.start();
    s.initialize();
    let r = s.call("echo", json!({"text": "deploy"}));
    let d = decision(&r);
    assert_eq!(d["reason"], "approval.pending", "{r}");
    let id = d["approval"].as_str().unwrap().to_string();
    let text = result_text(&r);
    assert!(
        text.contains(&format!("mcpbox approvals approve {id}")),
        "{text}"
    );
    // retried before anyone answered: the same approval, still refused
    let again = s.call("echo", json!({"text": "deploy"}));
    assert_eq!(decision(&again)["approval"], json!(id));
    let out = ok(&b.approve(&id));
    assert!(out.contains("retry"), "{out}");
    let passed = s.call("echo", json!({"text": "deploy"}));
    assert_eq!(result_text(&passed), "deploy");
    // used twice: the approval is spent, the next one is a new question
    let twice = s.call("echo", json!({"text": "deploy"}));
    assert_eq!(decision(&twice)["reason"], "approval.pending");
    assert_ne!(decision(&twice)["approval"], json!(id));
    // and approving the spent id again does nothing
    assert!(!b.approve(&id).status.success());
    s.finish();
    let actions = approval_actions(&b);
    assert_eq!(actions[..4], ["requested", "approved", "used", "requested"]);
}

#[test]
fn approval_for_one_call_is_not_used_by_a_call_with_other_arguments() {
    let b = Box_::new("");
    let mut s = b.start();
    s.initialize();
    let a = s.call(
        "echo",
        json!({"text": "send the report to alice@example.com"}),
    );
    let id = decision(&a)["approval"].as_str().unwrap().to_string();
    ok(&b.approve(&id));
    // call B: same tool, other arguments (the recipient swapped)
    let other = s.call(
        "echo",
        json!({"text": "send the report to mallory@example.net"}),
    );
    assert_eq!(decision(&other)["reason"], "approval.pending", "{other}");
    assert_ne!(decision(&other)["approval"], json!(id));
    let h = s.call("history", json!({}));
    assert!(!result_text(&h).contains("mallory"), "{h}");
    // the approved call itself still passes
    let a2 = s.call(
        "echo",
        json!({"text": "send the report to alice@example.com"}),
    );
    assert_eq!(result_text(&a2), "send the report to alice@example.com");
    s.finish();
}

#[test]
fn expired_approval_can_be_neither_given_nor_used() {
    let b = Box_::new("[approvals]\ntimeout = \"1s\"\n");
    let mut s = b.start();
    s.initialize();
    let r = s.call("echo", json!({"text": "late"}));
    let id = decision(&r)["approval"].as_str().unwrap().to_string();
    std::thread::sleep(Duration::from_millis(1500));
    let out = b.approve(&id);
    assert!(!out.status.success());
    assert!(
        String::from_utf8_lossy(&out.stderr).contains("no pending approval"),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    // approved in time, retried too late
    let r2 = s.call("echo", json!({"text": "late"}));
    let id2 = decision(&r2)["approval"].as_str().unwrap().to_string();
    assert_ne!(id2, id);
    ok(&b.approve(&id2));
    std::thread::sleep(Duration::from_millis(1500));
    let r3 = s.call("echo", json!({"text": "late"}));
    assert_eq!(decision(&r3)["reason"], "approval.pending", "{r3}");
    s.finish();
    let actions = approval_actions(&b);
    assert!(
        actions.iter().filter(|a| *a == "expired").count() >= 2,
        "{actions:?}"
    );
    assert!(!actions.contains(&"used".to_string()), "{actions:?}");
}

#[test]
fn held_call_nobody_answers_times_out() {
    let b = Box_::new("[approvals]\nfallback = \"hold\"\ntimeout = \"1s\"\n");
    let mut s = b.start();
    s.initialize();
    s.send(&call_msg(5, "x"));
    let r = response(&mut s, 5);
    assert_eq!(decision(&r)["reason"], "approval.timeout", "{r}");
    s.finish();
    assert_eq!(approval_actions(&b), ["requested", "expired"]);
}

#[test]
fn session_that_dies_while_its_call_waits_is_audited_as_abandoned() {
    let b = Box_::new("[approvals]\nfallback = \"hold\"\ntimeout = \"60s\"\n");
    let (s, id) = b.held_call(9, "wait for me");
    // the host goes away with the call waiting
    let (status, _) = s.finish();
    assert!(status.success() || status.code().is_some());
    let audit = b.audit();
    let call = audit
        .iter()
        .find(|e| e["kind"] == "tool_call" && e["tool"] == "echo")
        .expect("the waiting call has a record");
    assert_eq!(call["reason"], "approval.abandoned", "{call}");
    assert_eq!(call["detail"]["approval"], json!(id));
    assert_eq!(approval_actions(&b), ["requested", "abandoned"]);
    // and nothing of it is left to approve
    assert!(b.list().is_empty());
}

#[test]
fn elicitation_and_the_cli_answer_the_same_approval_first_wins() {
    let b = Box_::new("");
    let mut s = b.start_eliciting();
    // 1: the host answers its form
    s.send(&call_msg(11, "one"));
    let ask = s.recv();
    assert_eq!(ask["method"], "elicitation/create", "{ask}");
    let listed = b.wait_listed(1);
    assert_eq!(listed[0]["elicitation"], true);
    s.send(&json!({"jsonrpc": "2.0", "id": ask["id"],
                   "result": {"action": "accept", "content": {"approve": true}}}));
    assert_eq!(result_text(&response(&mut s, 11)), "one");
    assert!(
        b.list().is_empty(),
        "the broker forgot the answered approval"
    );
    // 2: the CLI answers first; the host's form is withdrawn
    s.send(&call_msg(12, "two"));
    let ask2 = s.recv();
    assert_eq!(ask2["method"], "elicitation/create");
    let id = b.wait_listed(1)[0]["id"].as_str().unwrap().to_string();
    ok(&b.approve(&id));
    let mut cancelled = false;
    let r = loop {
        let m = s.recv();
        if m["method"] == "notifications/cancelled" && m["params"]["requestId"] == ask2["id"] {
            cancelled = true;
        } else if m.get("id") == Some(&json!(12)) {
            break m;
        }
    };
    assert!(cancelled, "the host's open form was withdrawn");
    assert_eq!(result_text(&r), "two");
    // the late answer to the withdrawn form runs nothing more
    s.send(&json!({"jsonrpc": "2.0", "id": ask2["id"],
                   "result": {"action": "accept", "content": {"approve": true}}}));
    let h = s.call("history", json!({}));
    assert_eq!(result_text(&h).matches("\"two\"").count(), 1, "{h}");
    s.finish();
    let audit = b.audit();
    let sources: Vec<&str> = audit
        .iter()
        .filter(|e| e["kind"] == "tool_call" && e["tool"] == "echo")
        .map(|e| e["source"].as_str().unwrap())
        .collect();
    assert_eq!(sources[0], "approval:elicitation");
    assert!(sources[1].starts_with("approval:cli:uid="), "{sources:?}");
}

#[test]
fn host_form_answered_for_the_session_passes_the_tools_later_calls_without_asking() {
    let b = Box_::new("");
    let mut s = b.start_eliciting();
    s.send(&call_msg(21, "first"));
    let ask = s.recv();
    assert_eq!(ask["method"], "elicitation/create", "{ask}");
    // the form offers once, for this session, or no
    let form = &ask["params"]["requestedSchema"]["properties"];
    assert!(
        form["approve"].is_object() && form["session"].is_object(),
        "{form}"
    );
    s.send(&json!({"jsonrpc": "2.0", "id": ask["id"],
                   "result": {"action": "accept", "content": {"approve": true, "session": true}}}));
    assert_eq!(result_text(&response(&mut s, 21)), "first");
    // other arguments, same tool, same session: no form, no listing
    s.send(&call_msg(22, "second"));
    let r = s.recv();
    assert_eq!(r["id"], json!(22), "a form was sent again: {r}");
    assert_eq!(result_text(&r), "second");
    assert!(b.list().is_empty());
    s.finish();
    // a new session of the same host is asked again
    let mut s2 = b.start_eliciting();
    s2.send(&call_msg(23, "third"));
    assert_eq!(s2.recv()["method"], "elicitation/create");
    drop(s2);
    let actions = approval_actions(&b);
    assert_eq!(
        actions[..3],
        ["requested", "approved", "used"],
        "{actions:?}"
    );
}

#[test]
fn with_elicitation_off_a_host_that_answers_forms_itself_cannot_approve() {
    let b = Box_::new("[approvals]\nelicitation = false\n");
    let mut s = b.start_eliciting();
    s.send(&call_msg(31, "wire the money"));
    // no form: refused at once, naming the approval, as for a host
    // without elicitation
    let r = s.recv();
    assert_eq!(r["id"], json!(31), "the host was sent something else: {r}");
    assert_eq!(decision(&r)["reason"], "approval.pending", "{r}");
    let id = decision(&r)["approval"].as_str().unwrap().to_string();
    // the host answers a form it was never sent, under every id it could
    // guess: nothing passes
    for guess in ["mcpbox-approval-0", id.as_str()] {
        s.send(&json!({"jsonrpc": "2.0", "id": guess,
                       "result": {"action": "accept", "content": {"approve": true}}}));
    }
    let again = s.call("echo", json!({"text": "wire the money"}));
    assert_eq!(decision(&again)["reason"], "approval.pending", "{again}");
    // a human outside the host can
    ok(&b.approve(&id));
    let passed = s.call("echo", json!({"text": "wire the money"}));
    assert_eq!(result_text(&passed), "wire the money");
    s.finish();
}

#[test]
fn large_result_waits_for_a_human_before_the_host_sees_it() {
    let b = Box_::new("[output]\napprove_over = \"1KiB\"\n[approvals]\nfallback = \"hold\"\n");
    let mut s = b.start();
    s.initialize();
    // a small result passes as usual
    let small = s.call("add", json!({"a": 1, "b": 2}));
    assert!(small["result"].is_object(), "{small}");
    let big = "x".repeat(4096);
    s.send(&json!({"jsonrpc": "2.0", "id": 21, "method": "tools/call",
                   "params": {"name": "history", "arguments": {}}}));
    let _ = response(&mut s, 21);
    // echo is under `approve` too: approve the call, then its result
    s.send(&call_msg(22, &big));
    let first = b.wait_listed(1);
    assert_eq!(first[0]["subject"]["type"], "call");
    ok(&b.approve(first[0]["id"].as_str().unwrap()));
    let end = Instant::now() + Duration::from_secs(20);
    let held = loop {
        let l = b.list();
        if let Some(r) = l.iter().find(|a| a["subject"]["type"] == "result") {
            break r.clone();
        }
        assert!(Instant::now() < end, "the result was not held");
        std::thread::sleep(Duration::from_millis(50));
    };
    assert!(held["subject"]["bytes"].as_u64().unwrap() > 4096, "{held}");
    assert_eq!(held["subject"]["over"], 1024);
    ok(&b.approve(held["id"].as_str().unwrap()));
    let r = response(&mut s, 22);
    assert_eq!(result_text(&r).len(), 4096);
    s.finish();
}

#[test]
fn credential_shaped_result_is_withheld_when_the_human_denies_it() {
    let b =
        Box_::new("[output]\napprove_credential_shapes = true\n[approvals]\nfallback = \"hold\"\n");
    // only the result is under approval here
    let policy = std::fs::read_to_string(&b.policy)
        .unwrap()
        .replace("\"echo\" = \"approve\"", "");
    std::fs::write(&b.policy, policy).unwrap();
    let mut s = b.start();
    s.initialize();
    let token = format!("ghp_{}", "a1B2c3D4e5F6g7H8i9J0k1L2m3N4o5P6q7R8");
    s.send(&call_msg(31, &format!("here is the key: {token}")));
    let held = b.wait_listed(1);
    assert_eq!(held[0]["subject"]["type"], "result");
    assert!(
        !held[0].to_string().contains(&token),
        "the token is not shown in the approval"
    );
    ok(&b.cli(&["deny", held[0]["id"].as_str().unwrap()]));
    let r = response(&mut s, 31);
    assert_eq!(r["result"]["isError"], true, "{r}");
    assert!(!r.to_string().contains(&token), "{r}");
    assert!(result_text(&r).contains("withheld"), "{r}");
    s.finish();
    let audit = b.audit();
    let call = audit
        .iter()
        .find(|e| e["kind"] == "tool_call" && e["tool"] == "echo")
        .unwrap();
    assert_eq!(
        call["detail"]["result_withheld"], "approval.declined",
        "{call}"
    );
}

/// A policy for the probe that mounts `dir` (the control sockets) into
/// the sandbox at the same path.
fn probe_policy(ws: &Workspace, dir: &Path) -> PathBuf {
    let text = format!(
        "[filesystem]\ninput = \"input\"\n\n[[filesystem.mounts]]\nhost = \"{0}\"\nat = \"{0}\"\n",
        dir.display()
    );
    let p = ws.path().join("probe.toml");
    std::fs::write(&p, text).unwrap();
    p
}

#[test]
fn sandboxed_server_cannot_approve_through_the_control_socket() {
    let b = Box_::new("[approvals]\nfallback = \"hold\"\ntimeout = \"60s\"\n");
    let (s, id) = b.held_call(41, "needs a human");
    let dir = b.ws.path().join("xdg/mcpbox/control");
    let socket = std::fs::read_dir(&dir)
        .unwrap()
        .map(|e| e.unwrap().path())
        .find(|p| p.extension().is_some_and(|x| x == "sock"))
        .unwrap();
    // even with the directory and socket opened to everyone, the peer
    // check is what refuses (as root the sandbox's uid is nobody; as an
    // ordinary user it is the caller's, and the user namespace differs)
    use std::os::unix::fs::PermissionsExt;
    for p in [
        b.ws.path().join("xdg"),
        b.ws.path().join("xdg/mcpbox"),
        dir.clone(),
    ] {
        std::fs::set_permissions(&p, std::fs::Permissions::from_mode(0o755)).unwrap();
    }
    std::fs::set_permissions(&socket, std::fs::Permissions::from_mode(0o666)).unwrap();
    let policy = probe_policy(&b.ws, &dir);
    let request = format!("{{\"op\":\"approve\",\"id\":\"{id}\"}}");
    let out =
        b.ws.probe(&policy, &["unix-call", socket.to_str().unwrap(), &request]);
    let line = String::from_utf8_lossy(&out.stdout).to_string();
    assert!(
        line.contains("refused") || line.starts_with("err"),
        "the sandbox reached the broker: {line} {}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(!line.contains("\"ok\":true"), "{line}");
    if !is_root() {
        assert!(line.contains("user namespace"), "{line}");
    }
    let list = b.list();
    assert_eq!(list.len(), 1, "still pending: {list:?}");
    assert_eq!(list[0]["id"], json!(id));
    s.finish();
}

#[test]
fn approvals_cli_with_nothing_running_says_so() {
    let b = Box_::new("");
    let out = ok(&b.cli(&["list"]));
    assert!(out.contains("no approvals waiting"), "{out}");
    let bad = b.approve("ap-000000000000");
    assert!(!bad.status.success());
    let malformed = b.cli(&["approve", "../../etc/passwd"]);
    assert!(!malformed.status.success());
}

#[test]
fn approvals_list_names_the_console_of_a_run_that_has_one() {
    let b = Box_::new("[approvals]\nfallback = \"hold\"\n");
    let env = b.env();
    let env: Vec<(&str, &str)> = env.iter().map(|(k, v)| (k.as_str(), v.as_str())).collect();
    let args: Vec<String> = [
        "run",
        "--console",
        "--policy",
        b.policy.to_str().unwrap(),
        "--",
        "/workspace/input/plain",
    ]
    .iter()
    .map(|s| s.to_string())
    .collect();
    let mut s = Session::start_mcpbox(&args, &env);
    s.initialize();
    s.send(&call_msg(51, "via the console"));
    b.wait_listed(1);
    let table = ok(&b.cli(&["list"]));
    assert!(table.contains("console: http://127.0.0.1:"), "{table}");
    assert!(table.contains("#token="), "{table}");
    s.finish();
}

#[test]
fn notify_command_names_each_new_approval_and_how_to_answer_it() {
    let b = Box_::new("");
    let out = b.ws.path().join("notified.txt");
    let policy = std::fs::read_to_string(&b.policy).unwrap()
        + &format!(
            "[approvals]\nfallback = \"hold\"\nnotify = [\"/bin/sh\", \"-c\", 'printf \"%s|%s\\n\" \"$0\" \"$1\" >> {}']\n",
            out.display()
        );
    std::fs::write(&b.policy, policy).unwrap();
    let (mut s, id) = b.held_call(61, "notify me");
    let end = Instant::now() + Duration::from_secs(20);
    let text = loop {
        let t = std::fs::read_to_string(&out).unwrap_or_default();
        if !t.is_empty() {
            break t;
        }
        assert!(
            Instant::now() < end,
            "the notify command never ran: {}",
            s.stderr()
        );
        std::thread::sleep(Duration::from_millis(50));
    };
    assert!(
        text.starts_with(&format!("mcpbox: approval {id}|")),
        "{text}"
    );
    assert!(
        text.contains("a call to tool echo on server policy"),
        "{text}"
    );
    assert!(
        text.contains(&format!("mcpbox approvals approve {id}")),
        "{text}"
    );
    ok(&b.approve(&id));
    assert_eq!(result_text(&response(&mut s, 61)), "notify me");
    s.finish();
    // one approval, one notification
    assert_eq!(std::fs::read_to_string(&out).unwrap().lines().count(), 1);
}

/// A `tools/call` of echo in the stateless revision (2026-07-28), from a
/// host that declares form elicitation in the request; `extra` goes into
/// the params (a retry's request state and answers).
fn stateless_call(id: u64, text: &str, extra: Value) -> Value {
    let mut m = call_msg(id, text);
    m["params"]["_meta"] = json!({
        "io.modelcontextprotocol/protocolVersion": "2026-07-28",
        "io.modelcontextprotocol/clientCapabilities": {"elicitation": {}}
    });
    if let (Some(p), Some(x)) = (m["params"].as_object_mut(), extra.as_object()) {
        p.extend(x.clone());
    }
    m
}

/// The retry of the form `state` with the host's human saying yes.
fn said_yes(id: u64, text: &str, state: &str) -> Value {
    stateless_call(
        id,
        text,
        json!({"requestState": state,
               "inputResponses": {state: {"action": "accept", "content": {"approve": true}}}}),
    )
}

/// The form an input-required result asks, and its request state.
fn input_required(r: &Value) -> (String, Value) {
    assert_eq!(r["result"]["resultType"], "input_required", "{r}");
    let state = r["result"]["requestState"].as_str().unwrap().to_string();
    let form = r["result"]["inputRequests"][&state].clone();
    (state, form)
}

#[test]
fn stateless_host_is_asked_in_an_input_required_result_and_its_yes_passes_once() {
    let b = Box_::new("");
    let mut s = b.start();
    s.initialize();
    s.send(&stateless_call(1, "deploy v2", json!({})));
    let (state, form) = input_required(&response(&mut s, 1));
    // a host of this revision takes no request of ours: the form rides in
    // the result, and names the approval for the CLI and console too
    assert_eq!(form["method"], "elicitation/create");
    let message = form["params"]["message"].as_str().unwrap();
    assert!(
        message.contains("echo") && message.contains(&state),
        "{message}"
    );
    let listed = b.list();
    assert_eq!(listed[0]["id"], json!(state));
    assert_eq!(listed[0]["elicitation"], true);
    // the yes for "deploy v2" presented with other arguments: not used
    s.send(&said_yes(2, "deploy v3", &state));
    let (other, _) = input_required(&response(&mut s, 2));
    assert_ne!(other, state);
    let h = s.call("history", json!({}));
    assert!(!result_text(&h).contains("deploy"), "{h}");
    // the rightful retry runs, once
    s.send(&said_yes(3, "deploy v2", &state));
    let r = response(&mut s, 3);
    assert_eq!(result_text(&r), "deploy v2", "{r}");
    s.send(&said_yes(4, "deploy v2", &state));
    let (again, _) = input_required(&response(&mut s, 4));
    assert_ne!(again, state);
    let h = s.call("history", json!({}));
    assert_eq!(result_text(&h).matches("deploy v2").count(), 1, "{h}");
    s.finish();
    let actions = approval_actions(&b);
    assert_eq!(
        actions[..5],
        ["requested", "requested", "approved", "used", "requested"]
    );
}

#[test]
fn stateless_host_retrying_after_the_cli_approved_runs_the_call() {
    let b = Box_::new("");
    let mut s = b.start();
    s.initialize();
    s.send(&stateless_call(1, "rotate keys", json!({})));
    let (state, _) = input_required(&response(&mut s, 1));
    ok(&b.approve(&state));
    // the host's retry carries no answer of its own: the human's stands
    s.send(&stateless_call(
        2,
        "rotate keys",
        json!({"requestState": state}),
    ));
    assert_eq!(result_text(&response(&mut s, 2)), "rotate keys");
    s.finish();
}

#[test]
fn stateless_hosts_yes_after_the_cli_denied_does_not_run_the_call() {
    let b = Box_::new("");
    let mut s = b.start();
    s.initialize();
    s.send(&stateless_call(1, "drop table", json!({})));
    let (state, _) = input_required(&response(&mut s, 1));
    ok(&b.cli(&["deny", &state]));
    s.send(&said_yes(2, "drop table", &state));
    let r = response(&mut s, 2);
    assert_eq!(decision(&r)["reason"], "approval.declined", "{r}");
    let h = s.call("history", json!({}));
    assert!(!result_text(&h).contains("drop table"), "{h}");
    s.finish();
}

/// Issue 26: a human approved a held result of the size mcpbox showed;
/// the call is retried after the result grew (the server's history has
/// one more entry). The approval was for the size shown: the larger
/// result is a new question, not the old yes.
#[test]
fn an_approved_result_does_not_let_a_larger_result_of_the_same_call_through() {
    let b = Box_::new("[output]\napprove_over = \"200B\"\n");
    let mut s = b.start();
    s.initialize();
    for i in 0..8 {
        s.call("add", json!({"a": i, "b": 1}));
    }
    let r = s.call("history", json!({}));
    let d = decision(&r);
    assert_eq!(d["reason"], "approval.pending", "{r}");
    let first = approval_named(&r);
    ok(&b.approve(&first));
    // the result grows: one more call in the history
    s.call("add", json!({"a": 100, "b": 1}));
    let r = s.call("history", json!({}));
    let d = decision(&r);
    assert_eq!(
        d["reason"], "approval.pending",
        "a larger result passed: {r}"
    );
    assert_ne!(approval_named(&r), first, "{r}");
    assert!(!result_text(&r).contains("100"), "{r}");
    s.finish();
}

/// The approval id a withheld result's text names.
fn approval_named(r: &Value) -> String {
    let text = result_text(r);
    let at = text
        .find("ap-")
        .unwrap_or_else(|| panic!("no approval named: {r}"));
    text[at..at + 15].to_string()
}
