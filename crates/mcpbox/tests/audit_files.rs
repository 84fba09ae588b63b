//! The files a call read and wrote, in its audit record, from the kernel
//! (fanotify mount marks on the sandbox's workspace) when mcpbox runs as
//! root; through the real `mcpbox run` and the hostile `workspace` test
//! server, which tries to hide its reads and writes, to flood the list, and
//! to have another process's writes blamed on it. Rootless, the kernel
//! will not give these marks: the written files are then listed by their
//! times, and these tests check that fallback instead.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use common::mcp::Session;
use common::Workspace;
use serde_json::{json, Value};

fn start() -> (Workspace, Session) {
    start_with("[filesystem]\ninput = \"input\"\noutput = \"output\"\n")
}

/// The `workspace` server under a policy of `filesystem` and the audit
/// log, with a data file in input.
fn start_with(filesystem: &str) -> (Workspace, Session) {
    let ws = Workspace::with_server("workspace");
    std::fs::write(ws.input().join("data.txt"), "data for the server\n").unwrap();
    let p = ws.raw_policy(&format!("{filesystem}[audit]\npath = \"audit.db\"\n"));
    let state = ws.path().join("state");
    let mut s = Session::start(
        &p,
        &["/workspace/input/workspace"],
        &[("MCPBOX_STATE_DIR", state.to_str().unwrap())],
    );
    s.initialize();
    (ws, s)
}

/// The tool_call records, in order, after the session ended.
fn calls(ws: &Workspace, s: Session) -> Vec<Value> {
    let (status, stderr) = s.finish();
    assert!(status.success(), "{stderr}");
    common::audit::events(&ws.path().join("audit.db"))
        .into_iter()
        .filter(|e| e["kind"] == "tool_call")
        .collect()
}

fn paths(call: &Value) -> Vec<String> {
    call["detail"]["files"]
        .as_array()
        .unwrap_or_else(|| panic!("no files in {call}"))
        .iter()
        .map(|f| f["path"].as_str().unwrap().to_string())
        .collect()
}

fn watched() -> bool {
    common::is_root()
}

#[test]
fn a_read_through_mmap_without_read_is_still_recorded() {
    let (ws, mut s) = start();
    let r = s.call("mmap_read", json!({"path": "/workspace/input/data.txt"}));
    assert_eq!(common::mcp::result_text(&r), "data for the server\n", "{r}");
    let calls = calls(&ws, s);
    if !watched() {
        assert_eq!(calls[0]["files_written"], json!([]));
        return;
    }
    assert_eq!(
        calls[0]["detail"]["files"],
        json!([{"path": "/workspace/input/data.txt", "read": true, "written": false, "size": 20,
            "sha256": "b6e45114b233a0541617565f32a0e5a2383800beab683e794dcd53eef6f44dda"}]),
        "{}",
        calls[0]
    );
}

#[test]
fn a_call_is_not_given_the_files_of_the_call_before_it() {
    let (ws, mut s) = start();
    s.call(
        "write",
        json!({"path": "/workspace/output/a.txt", "text": "aaa"}),
    );
    s.call("read", json!({"path": "/workspace/input/data.txt"}));
    s.call("count", json!({}));
    let calls = calls(&ws, s);
    let start = common::audit::events(&ws.path().join("audit.db"))
        .into_iter()
        .find(|e| e["kind"] == "session_start")
        .unwrap();
    assert_eq!(start["detail"]["sandbox_tier"], json!("full"), "{start}");
    let how = if watched() { "kernel" } else { "times" };
    assert_eq!(start["detail"]["files"], json!(how), "{start}");
    assert_eq!(calls[0]["files_written"], json!(["a.txt"]), "{}", calls[0]);
    if !watched() {
        // the walk by times may give a file written a clock tick before a
        // call to that call too (crate::written): the weakness the
        // kernel's marks remove
        return;
    }
    assert_eq!(calls[1]["files_written"], json!([]), "{}", calls[1]);
    assert_eq!(
        paths(&calls[0]),
        ["/workspace/output/a.txt"],
        "{}",
        calls[0]
    );
    assert_eq!(calls[0]["detail"]["files"][0]["written"], json!(true));
    assert_eq!(
        calls[0]["detail"]["files"][0]["sha256"],
        json!("9834876dcfb05cb167a5c24953eba58c4ac89b1adf57f28f2f9d09af107ee8f0")
    );
    assert_eq!(
        paths(&calls[1]),
        ["/workspace/input/data.txt"],
        "{}",
        calls[1]
    );
    assert_eq!(paths(&calls[2]), Vec::<String>::new(), "{}", calls[2]);
}

#[test]
fn a_flood_of_files_in_one_call_is_flagged_as_cut_not_cut_silently() {
    let (ws, mut s) = start();
    let r = s.call(
        "write_many",
        json!({"path": "/workspace/output", "count": 300}),
    );
    assert_eq!(common::mcp::result_text(&r), "wrote 300", "{r}");
    let calls = calls(&ws, s);
    if !watched() {
        return;
    }
    assert_eq!(paths(&calls[0]).len(), 256, "the list's bound");
    assert_eq!(
        calls[0]["detail"]["files_truncated"],
        json!(true),
        "{}",
        calls[0]
    );
}

#[test]
fn another_process_writing_the_output_directory_is_not_blamed_on_the_server() {
    let (ws, mut s) = start();
    // the call is in flight (the server sleeps) while this process, on the
    // host, writes into the same directory
    s.send(&json!({"jsonrpc": "2.0", "id": 900, "method": "tools/call",
        "params": {"name": "sleep", "arguments": {"ms": 700}}}));
    std::thread::sleep(std::time::Duration::from_millis(100));
    std::fs::write(ws.output().join("by-the-host.txt"), "not the server's").unwrap();
    let r = s.recv();
    assert_eq!(r["id"], json!(900), "{r}");
    let calls = calls(&ws, s);
    if !watched() {
        // the walk by times cannot tell who wrote: the known weakness the
        // kernel's marks remove
        return;
    }
    assert_eq!(calls[0]["files_written"], json!([]), "{}", calls[0]);
    assert_eq!(paths(&calls[0]), Vec::<String>::new(), "{}", calls[0]);
}

#[test]
fn reads_are_recorded_without_an_output_directory_too() {
    // input only: no walk would run, and the kernel's list must neither be
    // skipped nor kept past the call (held descriptors would pile up)
    let (ws, mut s) = start_with("[filesystem]\ninput = \"input\"\n");
    for _ in 0..2 {
        s.call("read", json!({"path": "/workspace/input/data.txt"}));
    }
    let calls = calls(&ws, s);
    assert_eq!(calls.len(), 2, "{calls:#?}");
    for call in &calls {
        assert_eq!(call["files_written"], json!([]), "{call}");
        if watched() {
            assert_eq!(paths(call), ["/workspace/input/data.txt"], "{call}");
            assert_eq!(call["detail"]["files"][0]["size"], json!(20), "{call}");
        }
    }
}
