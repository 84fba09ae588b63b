//! Interop: MCP servers and clients nobody here wrote, through `mcpbox run`.
//! The reference servers (npm: server-everything, server-filesystem; PyPI:
//! mcp-server-time, mcp-server-git) run inside the sandbox; the official Python SDK client
//! drives them, in both protocol eras. `scripts/install-peers.sh` installs
//! them (pinned) into .local/peers; `.ci/run` calls it. A missing peer is a
//! failure, not a skip.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use crate::common;

use std::path::PathBuf;
use std::process::Command;

use common::peers::{mount_same_path, peers};
use common::{mcpbox, Workspace};

fn client_script() -> PathBuf {
    std::env::var_os("MCPBOX_INTEROP_CLIENT")
        .map(PathBuf::from)
        .unwrap_or_else(|| {
            PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/interop/client.py")
        })
}

/// Runs the Python SDK client for `scenario` in `mode` against `server`.
pub(crate) fn drive(
    ws: &Workspace,
    scenario: &str,
    mode: &str,
    policy: &str,
    server: &[String],
    env: &[(&str, String)],
) {
    let p = ws.raw_policy(policy);
    let mut cmd = Command::new(peers().join("venv/bin/python"));
    cmd.arg(client_script())
        .args([scenario, mode])
        .arg(mcpbox())
        .arg(&p)
        .arg("--")
        .args(server);
    cmd.env("MCPBOX_STATE_DIR", ws.path().join("state"));
    for (k, v) in env {
        cmd.env(k, v);
    }
    let out = cmd.output().expect("run the python client");
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success() && stdout.contains("done"),
        "{scenario} ({mode}) failed:\n{stdout}\nstderr:\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
}

fn npm_mount() -> String {
    mount_same_path(&peers().join("npm"))
}

fn everything(mode: &str) {
    let ws = Workspace::new();
    let policy = format!(
        "[filesystem]\ninput = \"input\"\n{}\n[secrets]\nAPI_KEY = {{ from_env = \"MCPBOX_INTEROP_SECRET\" }}\n\
         [tools]\n\"get-sum\" = \"deny\"\n\"get-tiny-image\" = \"approve\"\n[audit]\npath = \"audit.db\"\n",
        npm_mount()
    );
    let server = vec![peers()
        .join("npm/bin/mcp-server-everything")
        .display()
        .to_string()];
    drive(
        &ws,
        "everything",
        mode,
        &policy,
        &server,
        &[("MCPBOX_INTEROP_SECRET", "sk-interop-7f3a9c1e55".into())],
    );
    let out = Command::new(mcpbox())
        .args(["audit", "--json", "--db"])
        .arg(ws.path().join("audit.db"))
        .output()
        .unwrap();
    let audit = String::from_utf8_lossy(&out.stdout);
    assert!(
        audit.contains("\"get-sum\"") && audit.contains("\"deny\""),
        "{audit}"
    );
    assert!(audit.contains("approval.pending"), "{audit}");
    assert!(
        !audit.contains("sk-interop-7f3a9c1e55"),
        "secret in the audit log"
    );
}

#[test]
fn server_everything_through_python_sdk_legacy_handshake() {
    everything("legacy");
}

#[test]
fn server_everything_through_python_sdk_auto_negotiation() {
    // server-everything 2026.8.31 speaks only the initialize era; in "auto"
    // mode the SDK tries the 2026-07-28 revision first and falls back, so
    // the relay sees both.
    everything("auto");
}

#[test]
fn server_filesystem_cannot_reach_outside_its_workspace() {
    let ws = Workspace::new();
    let secret = ws.path().join("host-secret.txt");
    std::fs::write(&secret, "top secret").unwrap();
    std::os::unix::fs::symlink(&secret, ws.input().join("escape-link")).unwrap();
    let policy = format!(
        "[filesystem]\ninput = \"input\"\noutput = \"output\"\n{}\n[tools]\n\"move_file\" = \"approve\"\n\
         [audit]\npath = \"audit.db\"\n",
        npm_mount()
    );
    let server = vec![
        peers()
            .join("npm/bin/mcp-server-filesystem")
            .display()
            .to_string(),
        "/workspace/input".into(),
        "/workspace/output".into(),
    ];
    drive(
        &ws,
        "filesystem",
        "legacy",
        &policy,
        &server,
        &[("MCPBOX_INTEROP_HOST_SECRET", secret.display().to_string())],
    );
    assert_eq!(
        std::fs::read_to_string(ws.output().join("written.txt")).unwrap(),
        "from the server"
    );
    assert!(!ws.input().join("evil.txt").exists());
    files_in_the_audit(&ws.path().join("audit.db"));
}

/// The files each call touched, in its record: the kernel's word
/// (fanotify), each file with its size and digest.
fn files_in_the_audit(db: &std::path::Path) {
    let calls: Vec<serde_json::Value> = common::audit::events(db)
        .into_iter()
        .filter(|e| e["kind"] == "tool_call" && e["decision"] == "allow")
        .collect();
    let call = |tool: &str, n: usize| -> &serde_json::Value {
        calls
            .iter()
            .filter(|e| e["tool"] == tool)
            .nth(n)
            .unwrap_or_else(|| panic!("no call {n} of {tool}: {calls:#?}"))
    };
    let (read, write) = (call("read_text_file", 0), call("write_file", 0));
    assert_eq!(
        write["files_written"],
        serde_json::json!(["written.txt"]),
        "{write}"
    );
    assert_eq!(read["files_written"], serde_json::json!([]), "{read}");
    assert_eq!(
        read["detail"]["files"],
        serde_json::json!([{"path": "/workspace/input/hello.txt", "read": true, "written": false,
            "moved_from": null, "deleted": false,
            "size": 20, "sha256": "e4a985feba6c291b0de2319ce53b41e44d6a1413c535c586a649e896ac623743"}]),
        "{read}"
    );
    let written = write["detail"]["files"].as_array().expect("files");
    assert!(
        written.contains(&serde_json::json!({"path": "/workspace/output/written.txt",
            "read": false, "written": true, "moved_from": null, "deleted": false, "size": 15,
            "sha256": "18e4bd3407731c1af610efc8a14c8262e872e6c871d34554e5167080d669e384"})),
        "{write}"
    );
    // the refused reads (outside the workspace, through the link) read nothing
    for refused in calls
        .iter()
        .filter(|e| e["tool"] == "read_text_file")
        .skip(1)
    {
        let files = refused["detail"]["files"]
            .as_array()
            .cloned()
            .unwrap_or_default();
        assert!(
            files
                .iter()
                .all(|f| f["path"] != "/workspace/input/hello.txt"),
            "a later call is not given the first one's read: {refused}"
        );
    }
}

#[test]
fn server_filesystem_takes_the_hosts_roots_as_sandbox_paths() {
    let ws = Workspace::new();
    let policy = format!(
        "[filesystem]\ninput = \"input\"\noutput = \"output\"\n{}\n[audit]\npath = \"audit.db\"\n",
        npm_mount()
    );
    // no directories on its command line: it waits for the client's roots
    let server = vec![peers()
        .join("npm/bin/mcp-server-filesystem")
        .display()
        .to_string()];
    let (input, output) = (ws.input(), ws.output());
    let roots = format!(
        "file://{} file://{} file:///etc",
        input.display(),
        output.display()
    );
    drive(
        &ws,
        "filesystem_roots",
        "legacy",
        &policy,
        &server,
        &[
            ("MCPBOX_INTEROP_ROOTS", roots),
            ("MCPBOX_INTEROP_HOST_INPUT", input.display().to_string()),
            ("MCPBOX_INTEROP_HOST_OUTPUT", output.display().to_string()),
        ],
    );
    assert_eq!(
        std::fs::read_to_string(output.join("via-host-path.txt")).unwrap(),
        "translated"
    );
    let flagged = common::audit::events(&ws.path().join("audit.db"))
        .into_iter()
        .any(|e| e["reason"] == "root.outside" && e["detail"]["dropped"] == serde_json::json!(1));
    assert!(flagged, "the dropped root is audited");
    // the move keeps its source in the record, with the content's digest
    assert_eq!(
        std::fs::read_to_string(output.join("final.txt")).unwrap(),
        "draft"
    );
    let moved = common::audit::events(&ws.path().join("audit.db"))
        .into_iter()
        .find(|e| e["kind"] == "tool_call" && e["tool"] == "move_file")
        .expect("a move_file record");
    assert_eq!(
        moved["files_written"],
        serde_json::json!(["final.txt"]),
        "{moved}"
    );
    let files = moved["detail"]["files"].as_array().expect("files");
    assert!(
        files.contains(&serde_json::json!({"path": "/workspace/output/final.txt",
            "read": false, "written": false, "moved_from": "/workspace/output/draft.txt",
            "deleted": false, "size": 5,
            "sha256": "7743ce348d9284d677a185f33295b92266cc435a5b5f775029b300066d26693a"})),
        "{moved}"
    );
}

fn time_server(mode: &str) {
    let ws = Workspace::new();
    let venv = peers().join("venv");
    let policy = format!("{}[audit]\npath = \"audit.db\"\n", mount_same_path(&venv));
    let server = vec![
        venv.join("bin/mcp-server-time").display().to_string(),
        "--local-timezone".into(),
        "UTC".into(),
    ];
    drive(&ws, "time", mode, &policy, &server, &[]);
}

#[test]
fn python_time_server_runs_sandboxed_legacy_handshake() {
    time_server("legacy");
}

#[test]
fn python_time_server_runs_sandboxed_stateless_2026_revision() {
    // mcp-server-time (Python SDK 2.x) speaks the stateless revision:
    // server/discover and per-request _meta pass through the relay.
    time_server("2026-07-28");
}

/// Issue 11: as root, a root-owned git repository given as the input is
/// shown through an idmapped mount, so the sandbox user owns it and git
/// answers instead of refusing "dubious ownership" (before the idmap, the
/// repository's owner was root and the sandbox user host nobody).
#[test]
fn git_server_answers_on_a_root_owned_repository_as_root() {
    if !common::is_root() {
        eprintln!(
            "skipped: the root-owned repository case exists only when mcpbox runs as root \
             (rootless, the sandbox user is the caller, who owns the repository)"
        );
        return;
    }
    let ws = Workspace::new();
    let repo = ws.path().join("repo");
    common::git_repo(&repo);
    // root-owned and private, as a repository under /root would be
    use std::os::unix::fs::PermissionsExt;
    std::fs::set_permissions(&repo, std::fs::Permissions::from_mode(0o700)).unwrap();
    let venv = peers().join("venv");
    let policy = format!(
        "[filesystem]\ninput = \"repo\"\n{}[audit]\npath = \"audit.db\"\n",
        mount_same_path(&venv)
    );
    let server = vec![
        venv.join("bin/mcp-server-git").display().to_string(),
        "--repository".into(),
        "/workspace/input".into(),
    ];
    drive(
        &ws,
        "git",
        "legacy",
        &policy,
        &server,
        &[("MCPBOX_INTEROP_REPO", "/workspace/input".into())],
    );
}
