//! One audit log shared by a gateway and many `mcpbox run` processes, as
//! it is by default (every policy without `[audit] path` writes to the
//! state directory's `audit.db`), with processes killed with -9 among
//! them (issue 32: the log once read "database disk image is malformed"
//! while calls still ran). Through the real binaries.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use crate::common;

use std::collections::HashMap;
use std::process::Command;

use common::audit::events;
use common::mcp::Session;
use common::serve::{Gateway, Server, ALICE};
use common::{mcpbox, Workspace};
use serde_json::json;

#[test]
fn runs_and_a_gateway_killed_with_9_among_them_never_corrupt_the_log_nor_lose_a_call() {
    let gw = Gateway::start("", &[Server::test("gw", "plain", "")]);
    let state = gw.dir.path().join("state");
    let db = state.join("audit.db");
    let ws = Workspace::with_server("plain");
    // answered calls, by server name
    let mut answered: HashMap<String, usize> = HashMap::new();
    // the servers whose process ended on its own (not killed)
    let mut ended: Vec<String> = Vec::new();
    let mut http = gw.mcp("gw", Some(ALICE));
    http.initialize();
    for round in 0..3 {
        let mut runs: Vec<(String, Session)> = (0..4)
            .map(|i| {
                let name = format!("r{round}x{i}");
                let policy = ws.raw_policy(&format!(
                    "[server]\nname = \"{name}\"\n[filesystem]\ninput = \"input\"\n\
                     [tools]\ndefault = \"allow\"\n"
                ));
                let policy_named = ws.path().join(format!("{name}.toml"));
                std::fs::rename(&policy, &policy_named).unwrap();
                let mut s = Session::start(
                    &policy_named,
                    &["/workspace/input/plain"],
                    &[("MCPBOX_STATE_DIR", state.to_str().unwrap())],
                );
                s.initialize();
                (name, s)
            })
            .collect();
        for n in 0..6 {
            for (name, s) in runs.iter_mut() {
                let r = s.call("echo", json!({"text": format!("{name} {n}")}));
                assert!(r.get("result").is_some(), "{name}: {r}\n{}", s.stderr());
                *answered.entry(name.clone()).or_default() += 1;
            }
            let r = http.call("echo", json!({"text": format!("gw {round} {n}")}));
            assert!(r.get("result").is_some(), "gateway: {r}");
            *answered.entry("gw".into()).or_default() += 1;
        }
        // two die with -9 (no destructor, no checkpoint, no close), two end
        for (i, (name, mut s)) in runs.drain(..).enumerate() {
            if i % 2 == 0 {
                s.child.kill().unwrap();
                s.child.wait().unwrap();
            } else {
                let (status, err) = s.finish();
                assert!(status.success(), "{err}");
                ended.push(name);
            }
        }
    }
    let log = gw.stderr();
    assert!(!log.contains("malformed"), "gateway log:\n{log}");
    drop(http);
    // the gateway dies with -9 too; its directory (and the log) stays
    let dir = gw.kill9();
    // Every answered call has its record: its start (the decision), which
    // was committed before the call reached the server, so not even a
    // kill -9 just after the answer loses it (issue 26: the outcome
    // follows the answer, and a process killed in between loses only
    // that). Every outcome names a start; a process that ended on its
    // own has every outcome too.
    let all = events(&db);
    let of = |kind: &str, server: &str| -> Vec<&serde_json::Value> {
        all.iter()
            .filter(|e| e["kind"] == kind && e["server"] == server && e["tool"] == "echo")
            .collect()
    };
    for (server, n) in &answered {
        let starts = of("call_start", server);
        assert!(
            starts.len() >= *n,
            "{server}: {n} calls answered, {} recorded",
            starts.len()
        );
        let outcomes = of("tool_call", server);
        for o in &outcomes {
            let linked = starts.iter().any(|s| {
                s["detail"]["call"] == o["detail"]["call"]
                    && s["detail"]["session"] == o["detail"]["session"]
                    && s["args_digest"] == o["args_digest"]
            });
            assert!(linked, "{server}: an outcome without its start: {o}");
        }
        if ended.contains(server) {
            assert_eq!(
                outcomes.len(),
                *n,
                "{server}: {n} calls answered, {} outcomes recorded",
                outcomes.len()
            );
        }
    }
    let out = Command::new(mcpbox())
        .args(["audit", "--verify", "--db"])
        .arg(&db)
        .env("MCPBOX_STATE_DIR", &state)
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    let check: String = rusqlite_integrity(&db);
    assert_eq!(check, "ok");
    common::serve::unmount_volumes(dir.path());
}

/// `PRAGMA integrity_check` through Python's sqlite3 (another process,
/// another SQLite build).
fn rusqlite_integrity(db: &std::path::Path) -> String {
    let out = Command::new("python3")
        .args([
            "-c",
            "import sqlite3,sys; print(sqlite3.connect(sys.argv[1]).execute('PRAGMA integrity_check').fetchone()[0])",
        ])
        .arg(db)
        .output()
        .unwrap();
    String::from_utf8_lossy(&out.stdout).trim().to_string()
}
