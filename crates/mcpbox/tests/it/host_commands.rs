//! Commands mcpbox runs on the host (a secret's `from_command` and
//! `revoke`, `[approvals] notify`) attacked through the real binary: what
//! they inherit from mcpbox's environment, and whether what they start
//! outlives them. (`revoke` runs at a sandbox's teardown under `serve`:
//! its test is in lifecycle.rs.)
#![allow(clippy::unwrap_used, clippy::expect_used)]

use crate::common;

use std::path::Path;
use std::time::{Duration, Instant};

use common::mcp::Session;
use common::Workspace;
use serde_json::{json, Value};

/// Variables of mcpbox's environment that no host command may see: a
/// client's token variable, another secret.
const PLANTED: [(&str, &str); 2] = [
    ("MCPBOX_TOKEN_X", "client-token-4d1f7b2a9c"),
    ("SECRET_FOO", "foo-secret-81c2e6d0"),
];

/// The names a host command may see: the allowlist, what mcpbox passes on
/// purpose (`extra`), and what `sh` sets itself.
#[track_caller]
fn assert_only_allowed(dump: &Path, extra: &[&str]) {
    let text = std::fs::read_to_string(dump).unwrap();
    for (name, value) in PLANTED {
        assert!(!text.contains(name), "{name} reached the command:\n{text}");
        assert!(!text.contains(value), "{name}'s value reached it:\n{text}");
    }
    for line in text.lines() {
        let name = line.split('=').next().unwrap();
        assert!(
            ["PATH", "HOME", "LANG", "PWD", "SHLVL", "_", "OLDPWD"].contains(&name)
                || extra.contains(&name),
            "{name} reached the command:\n{text}"
        );
    }
}

/// `mcpbox run` of the `plain` server under `policy` (TOML added to the
/// workspace's policy), with [`PLANTED`] in its environment.
fn run(ws: &Workspace, policy: &str) -> Session {
    let p = ws.policy(policy);
    let state = ws.path().join("state").display().to_string();
    let args: Vec<String> = [
        "run",
        "--policy",
        p.to_str().unwrap(),
        "--",
        "/workspace/input/plain",
    ]
    .iter()
    .map(|s| s.to_string())
    .collect();
    let mut env = vec![("MCPBOX_STATE_DIR", state.as_str())];
    env.extend(PLANTED);
    Session::start_mcpbox(&args, &env)
}

#[test]
fn a_from_command_secret_source_sees_no_token_or_secret_of_mcpbox() {
    let ws = Workspace::with_server("plain");
    let dump = ws.path().join("env.txt");
    let mut s = run(
        &ws,
        &format!(
            "[secrets.API_KEY]\nfrom_command = [\"/bin/sh\", \"-c\", \"env > {}; echo value-from-command-5f3a\"]\n",
            dump.display()
        ),
    );
    s.initialize();
    let (status, err) = s.finish();
    assert!(status.success(), "{err}");
    assert_only_allowed(&dump, &[]);
}

/// Waits for `file` to hold a pid.
fn pid_in(file: &Path, s: &Session) -> String {
    let until = Instant::now() + Duration::from_secs(30);
    loop {
        let pid = std::fs::read_to_string(file).unwrap_or_default();
        if !pid.trim().is_empty() {
            return pid.trim().to_string();
        }
        assert!(
            Instant::now() < until,
            "no pid in {}: {}",
            file.display(),
            s.stderr()
        );
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// Whether process `pid` runs (exists and is no zombie).
fn running(pid: &str) -> bool {
    std::fs::read_to_string(format!("/proc/{pid}/stat")).is_ok_and(|s| {
        let state = s.rsplit(") ").next().unwrap_or("").chars().next();
        !matches!(state, Some('Z' | 'X'))
    })
}

/// Waits a little for `pid` to stop running (SIGKILL was sent already;
/// its reaping is init's).
fn ends(pid: &str) -> bool {
    for _ in 0..300 {
        if !running(pid) {
            return true;
        }
        std::thread::sleep(Duration::from_millis(10));
    }
    false
}

/// A notifier that dumps its environment, starts a grandchild in the
/// background (its pid written down) and sleeps past its timeout.
fn notify_policy(dump: &Path, pid: &Path) -> String {
    format!(
        "[audit]\npath = \"audit.db\"\n[approvals]\nfallback = \"hold\"\n\
         notify = [\"/bin/sh\", \"-c\", \"env > {}; sleep 1000 & echo $! > {}; sleep 1000\", \"sh\"]\n\
         [tools]\n\"echo\" = \"approve\"\n",
        dump.display(),
        pid.display()
    )
}

fn held_call(s: &mut Session) {
    s.initialize();
    s.send(&json!({
        "jsonrpc": "2.0", "id": 5, "method": "tools/call",
        "params": {"name": "echo", "arguments": {"text": "wait for a human"}}
    }));
}

#[test]
fn a_notify_command_and_what_it_started_end_when_mcpbox_exits() {
    let ws = Workspace::with_server("plain");
    let (dump, pidfile) = (ws.path().join("env.txt"), ws.path().join("pid"));
    let mut s = run(&ws, &notify_policy(&dump, &pidfile));
    held_call(&mut s);
    let pid = pid_in(&pidfile, &s);
    assert!(running(&pid), "the grandchild {pid} is not running");
    assert_only_allowed(
        &dump,
        &[
            "DBUS_SESSION_BUS_ADDRESS",
            "XDG_RUNTIME_DIR",
            "DISPLAY",
            "WAYLAND_DISPLAY",
        ],
    );
    // the host goes away while the notifier still runs
    let (_, err) = s.finish();
    assert!(
        ends(&pid),
        "the notifier's grandchild {pid} outlived mcpbox: {err}"
    );
}

#[test]
fn a_notify_command_past_its_timeout_is_killed_with_what_it_started() {
    let ws = Workspace::with_server("plain");
    let (dump, pidfile) = (ws.path().join("env.txt"), ws.path().join("pid"));
    let mut s = run(&ws, &notify_policy(&dump, &pidfile));
    held_call(&mut s);
    let pid = pid_in(&pidfile, &s);
    // its outcome is audited once it ended: at its timeout (10 s)
    let db = ws.path().join("audit.db");
    let until = Instant::now() + Duration::from_secs(60);
    let notified: Value = loop {
        let events = common::audit::events(&db);
        if let Some(e) = events
            .iter()
            .find(|e| e["kind"] == "approval" && e["detail"]["action"] == "notified")
        {
            break e.clone();
        }
        assert!(Instant::now() < until, "no notified record: {}", s.stderr());
        std::thread::sleep(Duration::from_millis(500));
    };
    let outcome = notified["detail"]["outcome"].as_str().unwrap();
    assert!(outcome.starts_with("timed out after 10s"), "{notified}");
    assert!(
        ends(&pid),
        "the notifier's grandchild {pid} outlived its timeout"
    );
    // the record names how it ended, never what it printed or was given
    assert!(
        !notified.to_string().contains("wait for a human"),
        "{notified}"
    );
    let (status, err) = s.finish();
    assert!(status.success(), "{err}");
}

/// A notifier whose background child leaves its process group and
/// session (setsid(1): a new session, as a daemon would), its pid written
/// down, then sleeps past its timeout.
fn detaching_notify_policy(pid: &Path) -> String {
    format!(
        "[audit]\npath = \"audit.db\"\n[approvals]\nfallback = \"hold\"\n\
         notify = [\"/bin/sh\", \"-c\", \"setsid sleep 1000 & echo $! > {}; sleep 1000\", \"sh\"]\n\
         [tools]\n\"echo\" = \"approve\"\n",
        pid.display()
    )
}

/// The session of process `pid` (field 6 of /proc/PID/stat).
fn session_of(pid: &str) -> String {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap_or_default();
    let rest = stat.rsplit_once(')').map(|(_, r)| r).unwrap_or("");
    rest.split_whitespace().nth(3).unwrap_or("").to_string()
}

#[test]
fn a_notify_command_that_escapes_into_a_new_session_dies_when_mcpbox_is_killed() {
    let ws = Workspace::with_server("plain");
    let pidfile = ws.path().join("pid");
    let mut s = run(&ws, &detaching_notify_policy(&pidfile));
    held_call(&mut s);
    let pid = pid_in(&pidfile, &s);
    assert!(running(&pid), "the detached child {pid} is not running");
    // it really left: a session of its own, out of reach of a group kill
    assert_eq!(session_of(&pid), pid, "setsid did not detach {pid}");
    // mcpbox dies without a chance to clean up
    s.child.kill().unwrap();
    s.child.wait().unwrap();
    assert!(
        ends(&pid),
        "the notifier's detached child {pid} outlived a kill -9 of mcpbox"
    );
}

#[test]
fn a_notify_command_that_escapes_into_a_new_session_dies_at_its_timeout() {
    let ws = Workspace::with_server("plain");
    let pidfile = ws.path().join("pid");
    let mut s = run(&ws, &detaching_notify_policy(&pidfile));
    held_call(&mut s);
    let pid = pid_in(&pidfile, &s);
    assert_eq!(session_of(&pid), pid, "setsid did not detach {pid}");
    let db = ws.path().join("audit.db");
    let until = Instant::now() + Duration::from_secs(60);
    loop {
        let events = common::audit::events(&db);
        if events
            .iter()
            .any(|e| e["kind"] == "approval" && e["detail"]["action"] == "notified")
        {
            break;
        }
        assert!(Instant::now() < until, "no notified record: {}", s.stderr());
        std::thread::sleep(Duration::from_millis(500));
    }
    // mcpbox is still running: the notifier's end killed it, not an exit
    assert!(running(&s.child.id().to_string()));
    assert!(
        ends(&pid),
        "the notifier's detached child {pid} outlived its timeout"
    );
    let (status, err) = s.finish();
    assert!(status.success(), "{err}");
}

#[test]
fn a_secret_source_that_leaves_a_daemon_behind_has_it_killed_when_it_ends() {
    let ws = Workspace::with_server("plain");
    let pidfile = ws.path().join("pid");
    let policy = format!(
        "[secrets.API_KEY]\nfrom_command = [\"/bin/sh\", \"-c\", \
         \"setsid sleep 1000 & echo $! > {}; echo value-from-command-77e1\"]\n",
        pidfile.display()
    );
    let mut s = run(&ws, &policy);
    s.initialize();
    let pid = pid_in(&pidfile, &s);
    assert!(
        ends(&pid),
        "the secret source's detached child {pid} outlived it"
    );
    let (status, err) = s.finish();
    assert!(status.success(), "{err}");
}
