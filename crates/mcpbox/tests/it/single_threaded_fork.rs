//! The sandbox's processes are forked only by single-threaded processes:
//! a fork in a process with other threads alive can leave a lock (the
//! allocator's, stdio's) held forever in the child, which still runs a few
//! dozen steps before execve. `mcpbox run` has threads (relay, egress
//! proxy, signals), so its sandboxes must descend from the helper it
//! re-executes, never from mcpbox itself.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use crate::common;

use std::time::{Duration, Instant};

use common::mcp::{result_text, testserver, Session};
use common::Workspace;
use serde_json::json;

/// `/proc/PID/status` as key/value pairs.
fn status(pid: u32) -> Option<Vec<(String, String)>> {
    let text = std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
    Some(
        text.lines()
            .filter_map(|l| l.split_once(':'))
            .map(|(k, v)| (k.to_string(), v.trim().to_string()))
            .collect(),
    )
}

fn field(pid: u32, key: &str) -> Option<String> {
    status(pid)?
        .into_iter()
        .find(|(k, _)| k == key)
        .map(|(_, v)| v)
}

fn ppid(pid: u32) -> Option<u32> {
    field(pid, "PPid")?.parse().ok()
}

fn threads(pid: u32) -> u32 {
    field(pid, "Threads")
        .and_then(|t| t.parse().ok())
        .unwrap_or(0)
}

fn cmdline(pid: u32) -> String {
    std::fs::read(format!("/proc/{pid}/cmdline"))
        .map(|c| String::from_utf8_lossy(&c).replace('\0', " "))
        .unwrap_or_default()
}

/// The pid 1 of a sandbox below `ancestor`: a descendant whose NSpid ends
/// in 1 (its own pid namespace's init), with the chain from it up to
/// `ancestor`, nearest first.
fn sandbox_init_below(ancestor: u32) -> Option<(u32, Vec<u32>)> {
    for entry in std::fs::read_dir("/proc").ok()?.flatten() {
        let Ok(pid) = entry.file_name().to_string_lossy().parse::<u32>() else {
            continue;
        };
        let Some(nspid) = field(pid, "NSpid") else {
            continue;
        };
        let ids: Vec<&str> = nspid.split_whitespace().collect();
        if ids.len() < 2 || ids.last() != Some(&"1") {
            continue;
        }
        let mut chain = Vec::new();
        let mut cur = pid;
        while let Some(parent) = ppid(cur) {
            if parent <= 1 {
                break;
            }
            chain.push(parent);
            if parent == ancestor {
                return Some((pid, chain));
            }
            cur = parent;
        }
    }
    None
}

/// `mcpbox run` with the plain test server under a name unique to this
/// test, with egress open (the proxy's threads exist), initialized.
fn start_run() -> (Workspace, String, Session) {
    let ws = Workspace::new();
    let alias = format!("plain-{}", ws.path().file_name().unwrap().to_string_lossy());
    std::fs::copy(testserver("plain"), ws.input().join(&alias)).unwrap();
    std::fs::set_permissions(
        ws.input().join(&alias),
        std::os::unix::fs::PermissionsExt::from_mode(0o755),
    )
    .unwrap();
    // [network] opens something, so the egress proxy's threads exist
    // before the sandbox is started.
    let p = ws.policy(
        "[audit]\npath = \"audit.db\"\n\
         [network]\nallow = [\"fetch.test:8080\"]\n[network.hosts]\n\"fetch.test\" = \"127.0.0.1\"\n",
    );
    let state = ws.path().join("state").display().to_string();
    let exe = format!("/workspace/input/{alias}");
    let mut s = Session::start(&p, &[exe.as_str()], &[("MCPBOX_STATE_DIR", state.as_str())]);
    s.initialize();
    assert_eq!(result_text(&s.call("echo", json!({"text": "hi"}))), "hi");
    (ws, alias, s)
}

/// Host processes whose command line contains `marker`.
fn processes_with(marker: &str) -> Vec<u32> {
    std::fs::read_dir("/proc")
        .unwrap()
        .flatten()
        .filter_map(|e| e.file_name().to_string_lossy().parse::<u32>().ok())
        .filter(|pid| cmdline(*pid).contains(marker))
        .collect()
}

/// The helper below `mcpbox`.
fn helper_of(mcpbox: u32) -> u32 {
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        if let Some(pid) = processes_with("__sandbox-helper")
            .into_iter()
            .find(|p| ppid(*p) == Some(mcpbox))
        {
            return pid;
        }
        assert!(Instant::now() < deadline, "no helper below mcpbox {mcpbox}");
        std::thread::sleep(Duration::from_millis(20));
    }
}

fn wait_gone(pids: &[u32], what: &str) {
    let deadline = Instant::now() + Duration::from_secs(10);
    // A zombie has no cmdline and no Threads: gone for our purpose.
    let alive = |p: &u32| field(*p, "State").is_some_and(|s| !s.starts_with('Z'));
    while pids.iter().any(alive) && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(20));
    }
    let left: Vec<u32> = pids.iter().copied().filter(alive).collect();
    assert!(left.is_empty(), "{what} survived: {left:?}");
}

fn kill(pid: u32, sig: &str) {
    std::process::Command::new("kill")
        .arg(format!("-{sig}"))
        .arg(pid.to_string())
        .status()
        .unwrap();
}

#[test]
fn sandbox_started_from_a_threaded_process_descends_from_the_single_threaded_helper() {
    let (_ws, _alias, s) = start_run();
    let mcpbox = s.child.id();

    let deadline = Instant::now() + Duration::from_secs(10);
    let found = loop {
        if let Some(found) = sandbox_init_below(mcpbox) {
            break found;
        }
        assert!(
            Instant::now() < deadline,
            "no sandbox init found below mcpbox {mcpbox}"
        );
        std::thread::sleep(Duration::from_millis(20));
    };
    let (init, chain) = found;
    assert!(
        threads(mcpbox) > 1,
        "mcpbox run should have several threads here (relay, proxy, signals): {}",
        threads(mcpbox)
    );
    // chain: the init's parent, its parent, ..., mcpbox. The init's parent
    // cloned it into the new namespaces: the sandbox's forker, which must
    // have been single-threaded.
    assert!(!chain.is_empty(), "init {init}: chain {chain:?}");
    let forker = chain[0];
    assert_eq!(
        threads(forker),
        1,
        "process {forker} ({}) made the sandbox (init {init}) with {} threads alive; chain {chain:?}",
        cmdline(forker),
        threads(forker)
    );
    // The init's parent is the helper mcpbox re-executed, not mcpbox.
    assert_ne!(
        forker, mcpbox,
        "mcpbox made the sandbox's init itself: chain {chain:?}"
    );
    assert!(
        cmdline(forker).contains("__sandbox-helper"),
        "the init's parent {forker} is not the helper: {:?}; chain {chain:?}",
        cmdline(forker)
    );
    assert_eq!(ppid(forker), Some(mcpbox), "chain {chain:?}");
    let (status, _) = s.finish();
    assert!(status.code().is_some(), "{status:?}");
}

#[test]
fn killing_mcpbox_run_with_sigkill_takes_the_helper_and_the_sandbox_with_it() {
    let (_ws, alias, mut s) = start_run();
    let helper = helper_of(s.child.id());
    let server = processes_with(&alias);
    assert!(!server.is_empty(), "the server should be running");
    kill(s.child.id(), "KILL");
    let _ = s.child.wait();
    // The helper sees EOF on its control socket and kills its sandbox.
    wait_gone(&[helper], "the helper");
    wait_gone(&server, "the sandboxed server");
}

#[test]
fn killing_the_helper_takes_its_sandbox_with_it() {
    let (_ws, alias, s) = start_run();
    let helper = helper_of(s.child.id());
    let server = processes_with(&alias);
    assert!(!server.is_empty(), "the server should be running");
    // The init's PR_SET_PDEATHSIG on the (single-threaded) helper empties
    // the namespace.
    kill(helper, "KILL");
    wait_gone(&server, "the sandboxed server");
    // mcpbox sees its server gone and ends the session.
    let (status, _) = s.finish();
    assert!(status.code().is_some(), "{status:?}");
}
