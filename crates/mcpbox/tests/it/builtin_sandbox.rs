//! The built-in sandbox server through the real binary, driven by the
//! official MCP Python SDK: `mcpbox run --builtin sandbox` over stdio, and
//! `builtin = "sandbox"` under `mcpbox serve` for two agents.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use crate::common;

use std::process::Command;

use common::audit::events;
use common::mcp::{result_text, Session};
use common::peers::peers;
use common::serve::{Gateway, ALICE, BOB};
use common::{interop_script, mcpbox, Workspace};
use serde_json::json;

/// The policy of the tests: two jobs at once, a small memory limit, curl
/// refused by name, privilege changes by category (the default). No
/// `[process]` cgroup limits: the rootless pass cannot set them on this
/// machine's v1 hierarchies (the job limits are the server's own).
const POLICY: &str = r#"
[filesystem]
output = "output"
[jobs]
max_running = 2
max_memory = "64MiB"
max_time = "60s"
exec_timeout = "30s"
[commands.programs]
curl = "deny"
# read_file's path is left to the built-in server's own checks (lexical
# confinement at the gateway, RESOLVE_BENEATH in the server), so that the
# refusals scenario sees the server refuse a planted symlink; every other
# path argument keeps the gateway's default rule, which follows links
[[tools.arguments]]
tool = "read_file"
argument = "path"
paths = ["/"]
"#;

/// `mcpbox run --builtin sandbox --policy POLICY`, its state in `state`.
fn start_builtin(policy: &std::path::Path, state: &std::path::Path) -> Session {
    let args: Vec<String> = ["run", "--builtin", "sandbox", "--policy"]
        .iter()
        .map(|a| a.to_string())
        .chain([policy.display().to_string()])
        .collect();
    Session::start_mcpbox(&args, &[("MCPBOX_STATE_DIR", state.to_str().unwrap())])
}

fn drive_stdio(ws: &Workspace, scenario: &str) {
    drive_stdio_policy(
        ws,
        scenario,
        &format!("[server]\nname = \"sandbox\"\n{POLICY}"),
        &[],
    );
}

/// A scenario of builtin.py against `mcpbox run --builtin` under `policy`.
fn drive_stdio_policy(ws: &Workspace, scenario: &str, policy: &str, env: &[(&str, &str)]) {
    let policy = ws.raw_policy(policy);
    let out = Command::new(peers().join("venv/bin/python"))
        .arg(interop_script("builtin.py"))
        .args([scenario, "stdio"])
        .arg(mcpbox())
        .arg(&policy)
        .env("MCPBOX_STATE_DIR", ws.path().join("state"))
        .envs(env.iter().copied())
        .current_dir(ws.path())
        .output()
        .expect("run the python client");
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success() && stdout.trim_end().ends_with("done"),
        "{scenario} failed:\n{stdout}\nstderr:\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
}

#[test]
fn builtin_multi_step_task_through_the_python_sdk() {
    let ws = Workspace::new();
    drive_stdio(&ws, "task");
    // the artifact is on the host, in the policy's output directory
    let artifact = std::fs::read_to_string(ws.output().join("result.txt")).unwrap();
    assert_eq!(artifact, "42\n");
    // every call is in the audit, the command lines with their categories
    let recs = events(&ws.path().join("state/audit.db"));
    let calls: Vec<_> = recs.iter().filter(|r| r["kind"] == "tool_call").collect();
    assert!(calls.len() >= 20, "one record per call: {}", calls.len());
    let exec = calls
        .iter()
        .find(|r| r["tool"] == "exec")
        .expect("an exec record");
    assert!(
        exec["detail"]["categories"].is_array(),
        "an exec record names its command categories: {exec}"
    );
    let failed = calls
        .iter()
        .find(|r| r["tool"] == "exec" && r["exit_status"] == 3);
    assert!(failed.is_some(), "an exec's exit status is in its record");
    let run_code = calls.iter().find(|r| r["tool"] == "run_code").unwrap();
    assert_eq!(run_code["detail"]["commands"][0]["program"], "python3");
}

#[test]
fn builtin_refuses_paths_outside_denied_categories_and_jobs_over_limits() {
    let ws = Workspace::new();
    drive_stdio(&ws, "refusals");
    let recs = events(&ws.path().join("state/audit.db"));
    let denied: Vec<_> = recs
        .iter()
        .filter(|r| r["kind"] == "tool_call" && r["decision"] == "deny")
        .map(|r| r["reason"].as_str().unwrap_or("").to_string())
        .collect();
    for reason in [
        "argument.path_outside",
        "command.category",
        "approval.pending",
        "command.program",
    ] {
        assert!(
            denied.iter().any(|r| r == reason),
            "a refusal with {reason} is audited: {denied:?}"
        );
    }
}

#[test]
fn builtin_two_agents_never_see_each_other_nor_other_servers_secrets() {
    two_agents_under_serve("");
}

/// The same two agents under `serve` with the built-in server on gVisor:
/// each agent's sandbox holds a runsc container of its own.
#[test]
fn builtin_two_agents_under_gvisor_never_see_each_other_nor_other_servers_secrets() {
    if !crate::isolation::runsc_or_skip(
        "builtin_two_agents_under_gvisor_never_see_each_other_nor_other_servers_secrets",
    ) || !common::is_root()
    {
        return;
    }
    two_agents_under_serve("[sandbox]\nisolation = \"gvisor\"\n");
}

/// Two agents on one built-in server under `serve`, the server's policy
/// with `tier` (its `[sandbox]` lines) added.
fn two_agents_under_serve(tier: &str) {
    let dir = tempfile::Builder::new()
        .prefix("mcpbox-serve-")
        .tempdir()
        .unwrap();
    let secret = "builtin-own-secret-51d2";
    // under serve, the sandbox's workspace holds its output
    let jobs = POLICY
        .replace("[filesystem]\noutput = \"output\"\n", "")
        .replace("max_memory = \"64MiB\"", "max_memory = \"256MiB\"");
    let policy = format!(
        "[server]\nname = \"sandbox\"\n{tier}{jobs}\n[secrets.OWN_TOKEN]\nfrom_env = \"T_OWN\"\n"
    );
    let other = "[server]\nname = \"other\"\n[secrets.OTHER_TOKEN]\nfrom_env = \"T_OTHER\"\n";
    std::fs::write(dir.path().join("sandbox.toml"), policy).unwrap();
    std::fs::write(dir.path().join("other.toml"), other).unwrap();
    let config = format!(
        "[listen]\naddress = \"127.0.0.1:0\"\n\
         [[clients]]\nname = \"alice\"\ntoken = {{ from_env = \"T_ALICE\" }}\n\
         [[clients]]\nname = \"bob\"\ntoken = {{ from_env = \"T_BOB\" }}\n\
         [[servers]]\nname = \"sandbox\"\nbuiltin = \"sandbox\"\npolicy = \"{}\"\n\
         [[servers]]\nname = \"other\"\nbuiltin = \"sandbox\"\npolicy = \"{}\"\n",
        dir.path().join("sandbox.toml").display(),
        dir.path().join("other.toml").display(),
    );
    let gw = Gateway::start_config_env(
        dir,
        &config,
        &[("T_OWN", secret), ("T_OTHER", "other-server-secret-9e1c")],
    );
    let url = gw.url("/servers/sandbox/mcp");
    let out = Command::new(peers().join("venv/bin/python"))
        .arg(interop_script("builtin.py"))
        .args(["isolation", "http", &url, ALICE, &url, BOB])
        .env("BUILTIN_SECRET", secret)
        .output()
        .expect("run the python client");
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success() && stdout.trim_end().ends_with("done"),
        "isolation failed:\n{stdout}\nstderr:\n{}\ngateway:\n{}",
        String::from_utf8_lossy(&out.stderr),
        gw.stderr()
    );
    // two sandboxes, one per agent
    let list = gw.cli_json(&["sandboxes", "list"]);
    let owners: Vec<String> = list
        .as_array()
        .unwrap()
        .iter()
        .map(|s| s["agent"].as_str().unwrap_or("").to_string())
        .collect();
    assert!(
        owners.contains(&"alice".to_string()) && owners.contains(&"bob".to_string()),
        "{list}"
    );
}

/// Answers the next `elicitation/create` with `approve`; returns its message.
fn answer_elicitation(s: &mut Session, approve: bool) -> String {
    loop {
        let m = s.recv();
        if m["method"] == "elicitation/create" {
            let answer = if approve {
                json!({"action": "accept", "content": {"approve": true}})
            } else {
                json!({"action": "decline"})
            };
            s.send(&json!({"jsonrpc": "2.0", "id": m["id"], "result": answer}));
            return m["params"]["message"].as_str().unwrap_or("").to_string();
        }
    }
}

#[test]
fn builtin_export_over_the_limit_needs_a_human_and_a_forged_limit_is_overwritten() {
    let ws = Workspace::new();
    let policy = ws.raw_policy(
        "[server]\nname = \"sandbox\"\n[filesystem]\noutput = \"output\"\n[artifacts]\nmax_size = \"1KiB\"\n",
    );
    let state = ws.path().join("state");
    let mut s = start_builtin(&policy, &state);
    s.request(
        "initialize",
        json!({"protocolVersion": "2025-11-25", "capabilities": {"elicitation": {}},
               "clientInfo": {"name": "mcpbox-test", "version": "0"}}),
    );
    s.send(&json!({"jsonrpc": "2.0", "method": "notifications/initialized"}));
    let big = "x".repeat(4096);
    let r = s.call(
        "write_file",
        json!({"path": "/workspace/tmp/big.bin", "content": big}),
    );
    assert_eq!(r["result"]["isError"], false, "{r}");
    let r = s.call(
        "write_file",
        json!({"path": "/workspace/tmp/small.txt", "content": "small"}),
    );
    assert_eq!(r["result"]["isError"], false, "{r}");

    // within the limit: no human asked
    let r = s.call(
        "export_artifact",
        json!({"path": "/workspace/tmp/small.txt"}),
    );
    assert_eq!(r["result"]["structuredContent"]["bytes"], 5, "{r}");

    // over it, with the host forging the size limit in _meta: the gateway
    // measures the file itself, asks, and the human declines
    s.send(
        &json!({"jsonrpc": "2.0", "id": 900, "method": "tools/call", "params": {
        "name": "export_artifact", "arguments": {"path": "/workspace/tmp/big.bin"},
        "_meta": {"io.mcpbox/max_bytes": 1_000_000_000u64}}}),
    );
    let asked = answer_elicitation(&mut s, false);
    assert!(asked.contains("export_artifact"), "{asked}");
    let r = loop {
        let m = s.recv();
        if m["id"] == 900 {
            break m;
        }
    };
    assert_eq!(r["result"]["isError"], true, "{r}");
    assert!(result_text(&r).contains("approval.declined"), "{r}");
    assert!(
        !ws.output().join("big.bin").exists(),
        "a declined export wrote nothing"
    );

    // the same call approved: exported, at the size that was approved
    s.send(
        &json!({"jsonrpc": "2.0", "id": 901, "method": "tools/call", "params": {
        "name": "export_artifact", "arguments": {"path": "/workspace/tmp/big.bin"}}}),
    );
    answer_elicitation(&mut s, true);
    let r = loop {
        let m = s.recv();
        if m["id"] == 901 {
            break m;
        }
    };
    assert_eq!(r["result"]["structuredContent"]["bytes"], 4096, "{r}");
    assert_eq!(
        std::fs::read(ws.output().join("big.bin")).unwrap().len(),
        4096
    );

    // a link, planted by the agent, is refused before the server sees it
    let r = s.call(
        "exec",
        json!({"command": "ln -s /etc/passwd /workspace/tmp/pw"}),
    );
    assert_eq!(r["result"]["structuredContent"]["exit_code"], 0, "{r}");
    let r = s.call("export_artifact", json!({"path": "/workspace/tmp/pw"}));
    assert!(result_text(&r).contains("artifact.refused"), "{r}");
    drop(s);
    let recs = events(&state.join("audit.db"));
    let large: Vec<_> = recs
        .iter()
        .filter(|e| {
            e["kind"] == "tool_call"
                && e["tool"] == "export_artifact"
                && e["detail"]["bytes"] == 4096
        })
        .collect();
    assert_eq!(
        large.len(),
        2,
        "both large exports are audited with the size: {recs:?}"
    );
}

/// Command lines that panicked, allocated without end or backtracked for
/// minutes inside the shell parser (found by the command_line fuzz
/// target; its seeds): each is refused as unparsed, and the same relay
/// then runs the next call.
#[test]
fn exec_lines_that_broke_the_parser_are_unparsed_and_the_relay_lives() {
    let ws = Workspace::new();
    let policy = ws.raw_policy("[server]\nname = \"sandbox\"\n[commands]\nunparsed = \"deny\"\n");
    let state = ws.path().join("state");
    let mut s = start_builtin(&policy, &state);
    s.initialize();
    // compiled in: the rootless pass may not read the checkout
    let seeds: [(&str, &[u8]); 4] = [
        (
            "io-number-overflow",
            include_bytes!("../../../../fuzz/corpus/command_line/io-number-overflow"),
        ),
        (
            "heredoc-in-substitution-oom",
            include_bytes!("../../../../fuzz/corpus/command_line/heredoc-in-substitution-oom"),
        ),
        (
            "unbalanced-nesting-timeout",
            include_bytes!("../../../../fuzz/corpus/command_line/unbalanced-nesting-timeout"),
        ),
        (
            "nested-expansions-slow",
            include_bytes!("../../../../fuzz/corpus/command_line/nested-expansions-slow"),
        ),
    ];
    for (name, bytes) in seeds {
        let line = String::from_utf8_lossy(bytes).into_owned();
        let r = s.call("exec", json!({"command": line}));
        assert!(
            result_text(&r).contains("commands.unparsed"),
            "{name}: {r}\n{}",
            s.stderr()
        );
    }
    let r = s.call("exec", json!({"command": "echo still here | tr a-z A-Z"}));
    assert_eq!(
        r["result"]["structuredContent"]["stdout"], "STILL HERE\n",
        "{r}"
    );
}

/// The call decision is one typed function now (`mcpbox_policy::call`);
/// what a host and the audit log read of it must not move: each refusal
/// names the rule that made it, as the policy key it always was, on the
/// wire (`_meta["mcpbox/decision"]`) and in the call's audit record alike.
#[test]
fn builtin_refusals_name_their_rule_on_the_wire_and_in_the_audit() {
    let ws = Workspace::new();
    let policy = ws.raw_policy(&format!("[server]\nname = \"sandbox\"\n{POLICY}"));
    let state = ws.path().join("state");
    let mut s = start_builtin(&policy, &state);
    s.initialize();
    let cases = [
        (
            "exec",
            json!({"command": "sudo id"}),
            "command.category",
            "commands.categories.privilege",
        ),
        (
            "exec",
            json!({"command": "curl https://x"}),
            "command.program",
            "commands.programs.curl",
        ),
        (
            "exec",
            json!({"command": "ls", "cwd": 5}),
            "argument.invalid",
            "builtin.exec.cwd",
        ),
        (
            "exec",
            json!({"argv": ["ls", 1]}),
            "argument.invalid",
            "commands.argv_tools",
        ),
        (
            "list_files",
            json!({"path": "/etc"}),
            "argument.path_outside",
            "builtin.list_files.path",
        ),
        (
            "export_artifact",
            json!({"path": "/workspace/output/none"}),
            "artifact.refused",
            "builtin.export_artifact",
        ),
    ];
    for (tool, args, reason, source) in &cases {
        let r = s.call(tool, args.clone());
        assert_eq!(r["result"]["isError"], json!(true), "{tool} {args}: {r}");
        let d = &r["result"]["_meta"]["mcpbox/decision"];
        assert_eq!(
            (d["reason"].as_str(), d["source"].as_str()),
            (Some(*reason), Some(*source)),
            "{tool} {args}: {r}"
        );
    }
    let (_, _) = s.finish();
    let denied: Vec<(String, String)> = events(&state.join("audit.db"))
        .iter()
        .filter(|r| r["kind"] == "tool_call" && r["decision"] == "deny")
        .map(|r| {
            (
                r["reason"].as_str().unwrap_or("").to_string(),
                r["source"].as_str().unwrap_or("").to_string(),
            )
        })
        .collect();
    let want: Vec<(String, String)> = cases
        .iter()
        .map(|(_, _, reason, source)| (reason.to_string(), source.to_string()))
        .collect();
    assert_eq!(denied, want);
}

#[test]
fn builtin_unknown_name_is_a_clear_error() {
    let out = Command::new(mcpbox())
        .args(["run", "--builtin", "nosuch"])
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(125), "{err}");
    assert!(
        err.contains("no such built-in server") && err.contains("sandbox"),
        "{err}"
    );
}

/// Issue 32: the README's example (no `[filesystem] output`) printed `no
/// origin snapshot for reset` at every start, and reset then failed. Now it
/// starts clean, and snapshot, restore and reset work on tmp alone.
#[test]
fn builtin_without_an_output_folder_starts_clean_and_resets() {
    let ws = Workspace::new();
    let policy = ws.raw_policy("[server]\nname = \"sandbox\"\n[tools]\ndefault = \"allow\"\n");
    let state = ws.path().join("state");
    let mut s = start_builtin(&policy, &state);
    s.initialize();
    let write = |s: &mut Session, text: &str| {
        let r = s.call(
            "write_file",
            json!({"path": "/workspace/tmp/notes.txt", "content": text}),
        );
        assert!(r["result"]["isError"] != json!(true), "{r}");
    };
    let read = |s: &mut Session| {
        let r = s.call("read_file", json!({"path": "/workspace/tmp/notes.txt"}));
        r.to_string()
    };
    write(&mut s, "first");
    let r = s.call("snapshot", json!({"name": "one"}));
    assert!(r["result"]["isError"] != json!(true), "{r}");
    write(&mut s, "second");
    let r = s.call("restore", json!({"name": "one"}));
    assert!(r["result"]["isError"] != json!(true), "{r}");
    assert!(read(&mut s).contains("first"), "{}", read(&mut s));
    let r = s.call("reset", json!({}));
    assert!(r["result"]["isError"] != json!(true), "{r}");
    assert!(!read(&mut s).contains("first"), "reset kept the file");
    let err = s.stderr();
    assert!(!err.contains("mcpbox-sandbox:"), "{err}");
}

/// Issue 32: concurrent sessions of one agent on the built-in server under
/// serve, with network egress, a tmp size and a secret in its policy, all
/// share its one sandbox.
#[test]
fn builtin_under_serve_takes_many_sessions_of_one_agent_at_once() {
    let dir = tempfile::Builder::new()
        .prefix("mcpbox-serve-")
        .tempdir()
        .unwrap();
    let policy = "[server]\nname = \"sandbox\"\n[filesystem]\ntmp = \"16MiB\"\n\
                  [network]\nallow = [\"dev.test:18971\"]\n\
                  [secrets.OWN_TOKEN]\nfrom_env = \"T_OWN\"\n[tools]\ndefault = \"allow\"\n";
    std::fs::write(dir.path().join("sandbox.toml"), policy).unwrap();
    let config = format!(
        "[listen]\naddress = \"127.0.0.1:0\"\n\
         [[clients]]\nname = \"alice\"\ntoken = {{ from_env = \"T_ALICE\" }}\n\
         [[servers]]\nname = \"sandbox\"\nbuiltin = \"sandbox\"\npolicy = \"{}\"\n",
        dir.path().join("sandbox.toml").display(),
    );
    let gw = Gateway::start_config_env(dir, &config, &[("T_OWN", "builtin-secret-77a1")]);
    let mut sessions: Vec<_> = (0..3)
        .map(|_| {
            let mut m = gw.mcp("sandbox", Some(ALICE));
            m.initialize();
            m
        })
        .collect();
    for (i, m) in sessions.iter_mut().enumerate() {
        let r = m.call(
            "write_file",
            json!({"path": format!("/workspace/tmp/c{i}.txt"), "content": format!("c{i}")}),
        );
        assert!(
            r["result"]["isError"] != json!(true),
            "{r}\n{}",
            gw.stderr()
        );
    }
    for m in sessions.iter_mut() {
        for i in 0..3 {
            let r = m.call(
                "read_file",
                json!({"path": format!("/workspace/tmp/c{i}.txt")}),
            );
            assert!(r.to_string().contains(&format!("c{i}")), "{r}");
        }
    }
}

/// A snapshot archive, crafted as an attacker would: well-formed, every
/// digest right, and holding `tmp/.mcpbox/x`, the server's own state.
fn crafted_checkpoint() -> Vec<u8> {
    let script = r#"
import hashlib, io, json, sys, tarfile
data = b"planted"
entries = [
    {"path": "output", "kind": "dir", "size": 0, "mode": "0755"},
    {"path": "tmp", "kind": "dir", "size": 0, "mode": "0755"},
    {"path": "tmp/.mcpbox", "kind": "dir", "size": 0, "mode": "0755"},
    {"path": "tmp/.mcpbox/x", "kind": "file", "size": len(data), "mode": "0644",
     "sha256": hashlib.sha256(data).hexdigest()},
]
manifest = json.dumps({"format": "mcpbox-snapshot/1", "parts": ["output", "tmp"],
                       "entries": entries}).encode()
buf = io.BytesIO()
with tarfile.open(fileobj=buf, mode="w:gz", format=tarfile.GNU_FORMAT) as t:
    def add(name, body=None):
        i = tarfile.TarInfo(name)
        if body is None:
            i.type, i.mode = tarfile.DIRTYPE, 0o755
            t.addfile(i)
        else:
            i.size, i.mode = len(body), 0o644
            t.addfile(i, io.BytesIO(body))
    add("MANIFEST.json", manifest)
    for e in entries:
        add(e["path"], data if e["kind"] == "file" else None)
sys.stdout.buffer.write(buf.getvalue())
"#;
    let out = Command::new("python3")
        .args(["-c", script])
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    out.stdout
}

/// Issue 26: a checkpoint that names the server's own state passed the
/// checks, the workspace was emptied, and the restore failed half-way. Now
/// it is refused with the workspace exactly as it was.
#[test]
fn a_crafted_checkpoint_naming_the_servers_state_is_refused_with_nothing_removed() {
    let ws = Workspace::new();
    let policy = ws.raw_policy("[server]\nname = \"sandbox\"\n[tools]\ndefault = \"allow\"\n");
    let state = ws.path().join("state");
    let mut s = start_builtin(&policy, &state);
    s.initialize();
    let b64 = {
        use base64::Engine;
        base64::engine::general_purpose::STANDARD.encode(crafted_checkpoint())
    };
    let r = s.call(
        "write_file",
        json!({"path": "/workspace/tmp/evil.tar.gz", "content_base64": b64}),
    );
    assert!(r["result"]["isError"] != json!(true), "{r}");
    let r = s.call(
        "exec",
        json!({"command": "mkdir -p /workspace/tmp/.mcpbox/snapshots && cp /workspace/tmp/evil.tar.gz /workspace/tmp/.mcpbox/snapshots/evil.tar.gz && echo planted"}),
    );
    assert!(r.to_string().contains("planted"), "{r}");
    let r = s.call(
        "write_file",
        json!({"path": "/workspace/tmp/work.txt", "content": "acknowledged work"}),
    );
    assert!(r["result"]["isError"] != json!(true), "{r}");
    let r = s.call("restore", json!({"name": "evil"}));
    assert!(
        r["result"]["isError"] == json!(true) && r.to_string().contains("own state"),
        "{r}"
    );
    let r = s.call("read_file", json!({"path": "/workspace/tmp/work.txt"}));
    assert!(r.to_string().contains("acknowledged work"), "{r}");
}

/// Issue 26: a human approves `export_artifact` of a file at the size
/// mcpbox measured and showed (4096 bytes); the agent grows the file and
/// retries the very same call. The approval was for 4096 bytes: the retry
/// is a new question, and nothing larger leaves the sandbox under the
/// old yes. The same size, retried, uses the approval.
#[test]
fn an_export_approved_at_one_size_does_not_export_the_file_grown_after() {
    let ws = Workspace::new();
    let policy = ws.raw_policy(
        "[server]\nname = \"sandbox\"\n[filesystem]\noutput = \"output\"\n[artifacts]\nmax_size = \"1KiB\"\n[approvals]\nfallback = \"refuse\"\n",
    );
    let state = ws.path().join("state");
    let xdg = ws.path().join("xdg");
    std::fs::create_dir(&xdg).unwrap();
    std::fs::set_permissions(&xdg, std::os::unix::fs::PermissionsExt::from_mode(0o700)).unwrap();
    let env = [
        ("MCPBOX_STATE_DIR", state.to_str().unwrap()),
        ("XDG_RUNTIME_DIR", xdg.to_str().unwrap()),
    ];
    let args: Vec<String> = ["run", "--builtin", "sandbox", "--policy"]
        .iter()
        .map(|a| a.to_string())
        .chain([policy.display().to_string()])
        .collect();
    let mut s = Session::start_mcpbox(&args, &env);
    s.initialize();
    let approve = |id: &str| {
        let out = Command::new(mcpbox())
            .args(["approvals", "approve", id])
            .envs(env)
            .output()
            .unwrap();
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
    };
    let pending = |r: &serde_json::Value| -> String {
        let d = &r["result"]["_meta"]["mcpbox/decision"];
        assert_eq!(d["reason"], "approval.pending", "{r}");
        d["approval"].as_str().unwrap().to_string()
    };
    let write = |s: &mut Session, n: usize| {
        let r = s.call(
            "write_file",
            json!({"path": "/workspace/tmp/big.bin", "content": "x".repeat(n)}),
        );
        assert_eq!(r["result"]["isError"], false, "{r}");
    };
    let export = json!({"path": "/workspace/tmp/big.bin"});

    write(&mut s, 4096);
    let first = pending(&s.call("export_artifact", export.clone()));
    approve(&first);
    // the agent grows the file, then retries the approved call
    write(&mut s, 1 << 20);
    let r = s.call("export_artifact", export.clone());
    let second = pending(&r);
    assert_ne!(second, first, "a grown file is a new question: {r}");
    assert!(
        !ws.output().join("big.bin").exists(),
        "nothing left the sandbox under the old approval"
    );
    // shrunk back to what the human saw: the first approval is used, once
    write(&mut s, 4096);
    let r = s.call("export_artifact", export.clone());
    assert_eq!(r["result"]["structuredContent"]["bytes"], 4096, "{r}");
    assert_eq!(
        std::fs::read(ws.output().join("big.bin")).unwrap().len(),
        4096
    );
    drop(s);
    let listed: Vec<_> = events(&state.join("audit.db"))
        .into_iter()
        .filter(|e| e["kind"] == "approval" && e["detail"]["action"] == "requested")
        .collect();
    assert_eq!(listed.len(), 2, "two questions were asked: {listed:?}");
}

/// The built-in server on gVisor, the documented choice for running code
/// an agent wrote (docs/isolation.md): both scenarios through the Python
/// SDK, with the jobs' memory limit raised for gVisor's larger resident
/// figures (Node reports about 110 MB there, 45 MB on the host's kernel).
#[test]
fn builtin_scenarios_run_under_gvisor_through_the_python_sdk() {
    if !crate::isolation::runsc_or_skip("builtin_scenarios_run_under_gvisor_through_the_python_sdk")
        || !common::is_root()
    {
        return;
    }
    let policy = format!(
        "[server]\nname = \"sandbox\"\n[sandbox]\nisolation = \"gvisor\"\n{}",
        POLICY.replace("max_memory = \"64MiB\"", "max_memory = \"256MiB\"")
    );
    for scenario in ["task", "refusals"] {
        let ws = Workspace::new();
        drive_stdio_policy(&ws, scenario, &policy, &[("MCPBOX_TEST_TIER", "gvisor")]);
        if scenario == "task" {
            let artifact = std::fs::read_to_string(ws.output().join("result.txt")).unwrap();
            assert_eq!(artifact, "42\n");
        }
    }
}

/// examples/builtin-coding's gVisor variant as shipped (only its listen
/// address changed): an agent's session runs the template's tests with
/// `run_code` on gVisor, and its sandbox is a runsc container.
#[test]
fn the_builtin_coding_example_on_gvisor_runs_its_template_tests() {
    if !crate::isolation::runsc_or_skip(
        "the_builtin_coding_example_on_gvisor_runs_its_template_tests",
    ) || !common::is_root()
    {
        return;
    }
    let example =
        std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../../examples/builtin-coding");
    let dir = tempfile::Builder::new()
        .prefix("mcpbox-example-")
        .tempdir()
        .unwrap();
    let copied = Command::new("cp")
        .arg("-r")
        .arg(example.join("."))
        .arg(dir.path())
        .status()
        .unwrap();
    assert!(copied.success());
    let config = std::fs::read_to_string(dir.path().join("serve-gvisor.toml"))
        .unwrap()
        .replace("127.0.0.1:8787", "127.0.0.1:0");
    let gw = Gateway::start_config_env(dir, &config, &[("ALICE_TOKEN", ALICE)]);
    let mut m = gw.mcp("sandbox", Some(ALICE));
    let init = m.initialize();
    assert!(init.get("result").is_some(), "{init}\n{}", gw.stderr());
    let code = "import subprocess, sys\n\
                r = subprocess.run([sys.executable, '-m', 'unittest', '-q', 'test_calc'],\n\
                    cwd='/workspace/input/project', capture_output=True, text=True)\n\
                print('tests', r.returncode, r.stderr.strip().splitlines()[-1:])";
    let r = m.call("run_code", json!({"language": "python", "code": code}));
    let out = r["result"]["structuredContent"]["stdout"]
        .as_str()
        .unwrap_or_else(|| panic!("{r}\n{}", gw.stderr()))
        .to_string();
    assert!(out.starts_with("tests 0 "), "{out}\n{r}");
    let list = gw.cli_json(&["sandboxes", "list"]);
    let id = list[0]["id"].as_str().unwrap().to_string();
    assert_eq!(
        crate::lifecycle::gvisor_containers(&gw, &id).len(),
        1,
        "{list}"
    );
}
