//! `exec` and `run` fail the same way: the step that failed is named and
//! the exit code says whose failure it was (125 mcpbox's own, 126 cannot
//! run, 127 not found), even when the failure happens in the helper that
//! `run` starts its sandboxes through.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use crate::common;

use std::io::Write;
use std::path::PathBuf;
use std::process::{Command, Stdio};

use common::{mcpbox, Workspace};
use serde_json::{json, Value};

fn run_mcpbox(args: &[&str], ws: &Workspace) -> std::process::Output {
    let mut child = Command::new(mcpbox())
        .args(args)
        .env("MCPBOX_STATE_DIR", ws.path().join("state"))
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    // run reads the host's side of MCP from stdin; a closed stdin ends it.
    let _ = child.stdin.take().unwrap().write_all(b"");
    child.wait_with_output().unwrap()
}

#[test]
fn run_of_a_command_missing_in_the_sandbox_exits_127_and_names_it() {
    let ws = Workspace::new();
    let p = ws.policy("[audit]\npath = \"audit.db\"\n");
    let out = run_mcpbox(
        &[
            "run",
            "--policy",
            p.to_str().unwrap(),
            "--",
            "no-such-server",
        ],
        &ws,
    );
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(127), "{err}");
    assert!(
        err.contains("no-such-server") && err.contains("not found"),
        "{err}"
    );
}

#[test]
fn exec_of_a_command_missing_in_the_sandbox_exits_127_and_names_it() {
    let ws = Workspace::new();
    let p = ws.policy("");
    let out = run_mcpbox(
        &[
            "exec",
            "--policy",
            p.to_str().unwrap(),
            "--",
            "no-such-tool",
        ],
        &ws,
    );
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(127), "{err}");
    assert!(
        err.contains("no-such-tool") && err.contains("not found"),
        "{err}"
    );
}

#[test]
fn a_policy_refused_by_the_host_checks_exits_125_naming_the_step_in_exec_and_run() {
    let ws = Workspace::new();
    let p = ws.raw_policy("[filesystem]\ninput = \"does-not-exist\"\n");
    for cmd in ["exec", "run"] {
        let out = run_mcpbox(&[cmd, "--policy", p.to_str().unwrap(), "--", "true"], &ws);
        let err = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(125), "{cmd}: {err}");
        assert!(
            err.contains("mcpbox: policy: ") && err.contains("does not exist"),
            "{cmd}: {err}"
        );
    }
}

/// `exec` used to ignore `[secrets]`: a secret whose source was unset ran
/// with no value and exit 0, where `run` refuses the same policy.
#[test]
fn exec_injects_secrets_as_run_does_and_refuses_a_missing_source() {
    let ws = Workspace::new();
    let p = ws.raw_policy("[secrets.API_TOKEN]\nfrom_env = \"MCPBOX_TEST_EXEC_SECRET\"\n");
    // `mcpbox exec` of `command` with the secret's source set to `value`
    // (None: unset)
    let exec = |value: Option<&str>, command: &[&str]| {
        let mut cmd = Command::new(mcpbox());
        cmd.args(["exec", "--policy", p.to_str().unwrap(), "--"])
            .args(command)
            .env("MCPBOX_STATE_DIR", ws.path().join("state"));
        match value {
            Some(v) => cmd.env("MCPBOX_TEST_EXEC_SECRET", v),
            None => cmd.env_remove("MCPBOX_TEST_EXEC_SECRET"),
        };
        let out = cmd.output().unwrap();
        let err = String::from_utf8_lossy(&out.stderr).into_owned();
        (out, err)
    };
    let (out, err) = exec(
        Some("s3cret-value-77"),
        &["/bin/sh", "-c", "echo \"[$API_TOKEN]\""],
    );
    assert!(out.status.success(), "{err}");
    assert_eq!(String::from_utf8_lossy(&out.stdout), "[s3cret-value-77]\n");
    let (out, err) = exec(None, &["/bin/true"]);
    assert_eq!(out.status.code(), Some(125), "{err}");
    assert!(err.contains("secrets.API_TOKEN"), "{err}");
    // set but empty is refused too: nothing to inject or to redact
    let (out, err) = exec(Some(""), &["/bin/true"]);
    assert_eq!(out.status.code(), Some(125), "{err}");
    assert!(err.contains("empty value"), "{err}");
}

/// A script in the workspace whose `#!` interpreter is on the host but not
/// mounted in the sandbox: execve says ENOENT, which used to read "command
/// not found" for a program that is plainly there (issue 11). The error
/// now names the interpreter and the mount to add, in `exec` and `run`
/// alike, and with that mount the script runs. (Runtime discovery, issue
/// 13, mounts it by itself: this is the explanation where it is off.)
#[test]
fn a_script_whose_interpreter_is_not_mounted_names_the_interpreter_and_the_mount() {
    use std::os::unix::fs::PermissionsExt;
    let ws = Workspace::new();
    // "a venv" outside every mount: a copy of the host's sh
    let venv = ws.path().join("venv");
    std::fs::create_dir_all(venv.join("bin")).unwrap();
    let sh = venv.join("bin/sh");
    std::fs::copy("/bin/sh", &sh).unwrap();
    std::fs::set_permissions(&sh, std::fs::Permissions::from_mode(0o755)).unwrap();
    let script = ws.input().join("server.sh");
    std::fs::write(
        &script,
        format!("#!{}\necho ran-by-venv-sh\n", sh.display()),
    )
    .unwrap();
    std::fs::set_permissions(&script, std::fs::Permissions::from_mode(0o755)).unwrap();

    let p = ws.policy("[audit]\npath = \"audit.db\"\n[runtime]\ndiscover = false\n");
    for cmd in ["exec", "run"] {
        let out = run_mcpbox(
            &[
                cmd,
                "--policy",
                p.to_str().unwrap(),
                "--",
                "/workspace/input/server.sh",
            ],
            &ws,
        );
        let err = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(127), "{cmd}: {err}");
        assert!(
            err.contains("the program /workspace/input/server.sh exists")
                && err.contains(&format!(
                    "its interpreter {} is not in the sandbox",
                    sh.display()
                ))
                && err.contains(&format!("add a read-only mount of {}", venv.display())),
            "{cmd}: {err}"
        );
        assert!(!err.contains("command not found"), "{cmd}: {err}");
    }

    // runs the script under a policy of `extra`: it must run by venv's sh
    let runs = |extra: &str| {
        let p = ws.policy(extra);
        let out = run_mcpbox(
            &[
                "exec",
                "--policy",
                p.to_str().unwrap(),
                "--",
                "/workspace/input/server.sh",
            ],
            &ws,
        );
        let err = String::from_utf8_lossy(&out.stderr).into_owned();
        assert!(out.status.success(), "{err}");
        assert_eq!(String::from_utf8_lossy(&out.stdout), "ran-by-venv-sh\n");
        err
    };
    // the mount it asks for is the fix
    runs(&format!(
        "[[filesystem.mounts]]\nhost = \"{0}\"\nat = \"{0}\"\n",
        venv.display()
    ));
    // and with discovery on (the default), no mount is needed at all
    let err = runs("");
    assert!(
        err.contains(&format!(
            "mcpbox: runtime: mounted {} read-only",
            venv.join("bin").display()
        )),
        "{err}"
    );
}

/// The interpreter named by the `#!` line exists nowhere: said so, no
/// mount suggested.
#[test]
fn a_script_whose_interpreter_exists_nowhere_says_so() {
    use std::os::unix::fs::PermissionsExt;
    let ws = Workspace::new();
    let script = ws.input().join("tool");
    std::fs::write(
        &script,
        "#!/nonexistent/mcpbox-test/bin/python3\nprint(1)\n",
    )
    .unwrap();
    std::fs::set_permissions(&script, std::fs::Permissions::from_mode(0o755)).unwrap();
    let p = ws.policy("");
    let out = run_mcpbox(
        &[
            "exec",
            "--policy",
            p.to_str().unwrap(),
            "--",
            "/workspace/input/tool",
        ],
        &ws,
    );
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(127), "{err}");
    assert!(
        err.contains("its interpreter /nonexistent/mcpbox-test/bin/python3 does not exist"),
        "{err}"
    );
}

/// `mcpbox run` of `sh -c SCRIPT` that fails after reading the host's
/// first line (its `initialize`, so that it is in flight): the host's
/// answer to it.
fn initialize_error_of_a_failing_server(policy: &str, script: &str, env: &[(&str, &str)]) -> Value {
    let ws = Workspace::new();
    let p = ws.policy(policy);
    let state = ws.path().join("state");
    let mut env = env.to_vec();
    env.push(("MCPBOX_STATE_DIR", state.to_str().unwrap()));
    let mut s = common::mcp::Session::start(&p, &["/bin/sh", "-c", script], &env);
    let answer = s.request(
        "initialize",
        json!({"protocolVersion": "2025-11-25", "capabilities": {}, "clientInfo": {"name": "t", "version": "1"}}),
    );
    let _ = s.child.kill();
    let _ = s.child.wait();
    answer
}

/// Issue 11: a server that exits at start reached the host as "mcp server
/// exited (status 1)", with the reason only on mcpbox's own stderr, which
/// a host like an editor hides. Its last stderr lines are now in the error.
#[test]
fn a_server_that_exits_at_start_tells_the_host_why() {
    let answer = initialize_error_of_a_failing_server(
        "[audit]\npath = \"audit.db\"\n",
        "read line; echo 'loading config' >&2; echo 'boom: missing config file' >&2; exit 1",
        &[],
    );
    let error = &answer["error"];
    let message = error["message"].as_str().unwrap_or_default();
    assert!(
        message.contains("exited (status 1)") && message.contains("boom: missing config file"),
        "{answer}"
    );
    assert_eq!(
        error["data"]["stderr"],
        json!(["loading config", "boom: missing config file"]),
        "{answer}"
    );
}

/// A crashing server's stderr reaches the host only as mcpbox's stderr
/// reader redacted it: a secret it prints is never in the error.
#[test]
fn a_secret_a_crashing_server_prints_is_redacted_in_the_hosts_error() {
    let value = "s3cret-crash-value-4242";
    let answer = initialize_error_of_a_failing_server(
        "[secrets]\nAPI_TOKEN = { from_env = \"MCPBOX_TEST_CRASH_TOKEN\" }\n",
        "read line; echo \"fatal: token $API_TOKEN rejected\" >&2; exit 2",
        &[("MCPBOX_TEST_CRASH_TOKEN", value)],
    );
    let text = answer.to_string();
    assert!(!text.contains(value), "{text}");
    assert!(
        text.contains("fatal: token [REDACTED:API_TOKEN] rejected"),
        "{text}"
    );
}

#[test]
fn a_full_disk_under_the_audit_log_refuses_calls_rather_than_run_them_unrecorded() {
    if !common::is_root() {
        eprintln!(
            "a_full_disk_under_the_audit_log_refuses_calls_rather_than_run_them_unrecorded: \
             skipped: mounting a small tmpfs for the audit log needs root"
        );
        return;
    }
    let ws = Workspace::with_server("plain");
    // the audit log on a 1 MiB tmpfs of a private mount namespace (unseen
    // by the rest of the machine), which the test fills through
    // /proc/PID/root while the session runs
    let fs = ws.path().join("auditfs");
    std::fs::create_dir(&fs).unwrap();
    let policy = ws.policy(&format!("[audit]\npath = \"{}/audit.db\"\n", fs.display()));
    let mut cmd = Command::new("unshare");
    cmd.args(["--mount", "--propagation", "private", "/bin/sh", "-ec"])
        .arg("mount -t tmpfs -o size=1m tmpfs \"$FS\"; exec \"$MCPBOX\" run --policy \"$POLICY\" -- /workspace/input/plain")
        .env("FS", &fs)
        .env("MCPBOX", mcpbox())
        .env("POLICY", &policy)
        .env("MCPBOX_STATE_DIR", ws.path().join("state"));
    let mut s = common::mcp::Session::start_command(cmd);
    s.initialize();
    let ok = s.call("echo", json!({"text": "before"}));
    assert_eq!(common::mcp::result_text(&ok), "before");
    // fill it: every write from here fails with ENOSPC
    let pid = s.child.id();
    let inside = PathBuf::from(format!("/proc/{pid}/root{}", fs.display()));
    let mut filler = std::fs::File::create(inside.join("filler")).unwrap();
    for size in [64 * 1024, 4096, 1] {
        let chunk = vec![0u8; size];
        while filler.write_all(&chunk).is_ok() {}
    }
    drop(filler);
    // the very first call after it is refused (its start cannot be
    // written, issue 26), with the reason and the cause, and never
    // reaches the server
    let r = s.call("echo", json!({"text": "during"}));
    assert_eq!(r["result"]["isError"], json!(true), "{r}\n{}", s.stderr());
    assert!(common::mcp::result_text(&r).contains("disk full"), "{r}");
    assert_eq!(
        r["result"]["_meta"]["mcpbox/decision"]["reason"], "audit.unavailable",
        "{r}"
    );
    // logged too (stderr is read by another thread: give it a moment)
    for _ in 0..100 {
        if s.stderr().contains("audit") {
            break;
        }
        std::thread::sleep(std::time::Duration::from_millis(50));
    }
    assert!(s.stderr().contains("audit"), "{}", s.stderr());
    // room again: the next refusal's record is the log's retry, and then
    // calls go on, with what waited in memory written first
    std::fs::remove_file(inside.join("filler")).unwrap();
    let mut again = false;
    for i in 0..100 {
        let r = s.call("echo", json!({ "text": format!("after {i}") }));
        if r["result"]["isError"] != json!(true) {
            again = true;
            break;
        }
        std::thread::sleep(std::time::Duration::from_millis(50));
    }
    assert!(
        again,
        "calls never went on after the disk had room again; stderr:\n{}",
        s.stderr()
    );
    let _ = s.finish();
}

#[test]
fn a_corrupt_audit_database_stops_the_run_before_anything_starts_and_is_kept() {
    let ws = Workspace::new();
    let db = ws.path().join("audit.db");
    let garbage = "not a database ".repeat(400);
    std::fs::write(&db, &garbage).unwrap();
    let policy = ws.policy(&format!("[audit]\npath = \"{}\"\n", db.display()));
    let out = Command::new(mcpbox())
        .args(["run", "--policy"])
        .arg(&policy)
        .args(["--", "/bin/true"])
        .env("MCPBOX_STATE_DIR", ws.path().join("state"))
        .stdin(Stdio::null())
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(125), "{err}");
    assert!(
        err.contains("opening the audit log") && err.contains("move it"),
        "{err}"
    );
    // the file is as it was: never recreated over
    assert_eq!(std::fs::read_to_string(&db).unwrap(), garbage);
}
