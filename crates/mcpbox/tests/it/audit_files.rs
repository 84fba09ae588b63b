//! The files a call read, wrote, renamed and removed, in its audit record,
//! from the kernel: as root, fanotify mount marks on the sandbox's
//! workspace (the sandbox's accesses only) and inode marks on its
//! directories (renames and removals); rootless, where the kernel refuses
//! mount marks, the inode marks for all of it (`files: "kernel-dirs"`,
//! which cannot tell the sandbox from another process of the user).
//! Through the real `mcpbox run` and the hostile `workspace` test server,
//! which tries to hide its reads and writes (through mmap, by renaming or
//! removing what it wrote, in a directory made during the call), to flood
//! the list, and to have another process's writes blamed on it.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use crate::common;

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

/// What the session's start record must say of the watch.
fn mode() -> &'static str {
    if common::is_root() {
        "kernel"
    } else {
        "kernel-dirs"
    }
}

/// The entry of `path` in a call's files.
fn entry<'a>(call: &'a Value, path: &str) -> &'a Value {
    call["detail"]["files"]
        .as_array()
        .and_then(|a| a.iter().find(|f| f["path"] == path))
        .unwrap_or_else(|| panic!("no {path} in {call}"))
}

#[test]
fn a_read_through_mmap_without_read_is_still_recorded() {
    let (ws, mut s) = start();
    let r = s.call("mmap_read", json!({"path": "/workspace/input/data.txt"}));
    assert_eq!(common::mcp::result_text(&r), "data for the server\n", "{r}");
    let calls = calls(&ws, s);
    assert_eq!(
        calls[0]["detail"]["files"],
        json!([{"path": "/workspace/input/data.txt", "read": true, "written": false,
            "moved_from": null, "deleted": false, "size": 20,
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
    assert_eq!(start["detail"]["files"], json!(mode()), "{start}");
    assert_eq!(calls[0]["files_written"], json!(["a.txt"]), "{}", calls[0]);
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
    std::fs::write(ws.output().join("host-draft.txt"), "the host's").unwrap();
    // the call is in flight (the server sleeps) while this process, on the
    // host, writes into the same directory and renames there (the
    // directory marks see any process; as root one alive in mcpbox's own
    // pid namespace is the host's)
    s.send(&json!({"jsonrpc": "2.0", "id": 900, "method": "tools/call",
        "params": {"name": "sleep", "arguments": {"ms": 700}}}));
    std::thread::sleep(std::time::Duration::from_millis(100));
    std::fs::write(ws.output().join("by-the-host.txt"), "not the server's").unwrap();
    std::fs::rename(
        ws.output().join("host-draft.txt"),
        ws.output().join("host-final.txt"),
    )
    .unwrap();
    let r = s.recv();
    assert_eq!(r["id"], json!(900), "{r}");
    let calls = calls(&ws, s);
    if mode() != "kernel" {
        // inode marks cannot tell who wrote (an unprivileged group is told
        // no other process's pid): the documented weakness of kernel-dirs
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
        assert_eq!(paths(call), ["/workspace/input/data.txt"], "{call}");
        assert_eq!(call["detail"]["files"][0]["size"], json!(20), "{call}");
    }
}

#[test]
fn a_file_renamed_keeps_the_name_it_came_from_in_the_record() {
    let (ws, mut s) = start();
    s.call(
        "write",
        json!({"path": "/workspace/output/draft.txt", "text": "aaa"}),
    );
    let r = s.call(
        "rename",
        json!({"path": "/workspace/output/draft.txt", "target": "/workspace/output/final.txt"}),
    );
    assert_eq!(common::mcp::result_text(&r), "ok", "{r}");
    let calls = calls(&ws, s);
    assert_eq!(
        calls[1]["files_written"],
        json!(["final.txt"]),
        "{}",
        calls[1]
    );
    let moved = entry(&calls[1], "/workspace/output/final.txt");
    assert_eq!(
        moved["moved_from"],
        json!("/workspace/output/draft.txt"),
        "{moved}"
    );
    assert_eq!(moved["deleted"], json!(false), "{moved}");
    assert_eq!(
        moved["sha256"],
        json!("9834876dcfb05cb167a5c24953eba58c4ac89b1adf57f28f2f9d09af107ee8f0"),
        "the content, under its new name: {moved}"
    );
    assert_eq!(paths(&calls[1]).len(), 1, "{}", calls[1]);
}

#[test]
fn a_file_written_then_renamed_and_removed_in_one_call_leaves_its_trail() {
    // the server hides what it wrote: written, renamed, removed, all in
    // one call, so no walk after the call finds anything
    let (ws, mut s) = start();
    let r = s.call(
        "hide",
        json!({"path": "/workspace/output/stage", "target": "/workspace/output/moved"}),
    );
    assert_eq!(common::mcp::result_text(&r), "ok", "{r}");
    let calls = calls(&ws, s);
    let hide = &calls[0];
    assert_eq!(hide["files_written"], json!([]), "nothing is left: {hide}");
    if mode() == "kernel" {
        // rootless, the new directory is gone before its mark could be
        // placed (marks are placed as the queue is read): the documented
        // weakness of kernel-dirs; the directory's own trail remains
        let loot = entry(hide, "/workspace/output/moved/loot.txt");
        assert_eq!(loot["written"], json!(true), "{loot}");
        assert_eq!(loot["deleted"], json!(true), "{loot}");
        assert_eq!(
            loot["sha256"],
            json!("5c52b6deb3631a09d8c4f642675052e28acb2e7fff38a3e86067a25ef23b796a"),
            "what it held: {loot}"
        );
    }
    let dir = entry(hide, "/workspace/output/moved");
    assert_eq!(dir["moved_from"], json!("/workspace/output/stage"), "{dir}");
    assert_eq!(dir["deleted"], json!(true), "{dir}");
}

#[test]
fn a_file_written_in_a_directory_made_during_the_call_is_recorded() {
    // made and written before any mark could reach the new directory
    let (ws, mut s) = start();
    let r = s.call(
        "write_many",
        json!({"path": "/workspace/output", "count": 0}),
    );
    assert_eq!(common::mcp::result_text(&r), "wrote 0", "{r}");
    s.call("mkdir", json!({"path": "/workspace/output/a/b"}));
    s.call(
        "write",
        json!({"path": "/workspace/output/a/b/c.txt", "text": "aaa"}),
    );
    s.call("read", json!({"path": "/workspace/output/a/b/c.txt"}));
    let calls = calls(&ws, s);
    assert_eq!(
        calls[2]["files_written"],
        json!(["a/b/c.txt"]),
        "{}",
        calls[2]
    );
    assert_eq!(
        entry(&calls[3], "/workspace/output/a/b/c.txt")["read"],
        json!(true),
        "{}",
        calls[3]
    );
}

#[test]
fn a_flood_of_directories_past_the_marks_bound_leaves_every_later_list_flagged() {
    // the server spends the directory marks, then renames where no mark
    // reaches: no later call may claim a whole list
    let (ws, mut s) = start();
    let r = s.call(
        "mkdir_many",
        json!({"path": "/workspace/output/flood", "count": 4200}),
    );
    assert_eq!(common::mcp::result_text(&r), "made 4200", "{r}");
    s.call(
        "write",
        json!({"path": "/workspace/output/flood/d04199/a.txt", "text": "a"}),
    );
    let r = s.call(
        "rename",
        json!({"path": "/workspace/output/flood/d04199/a.txt",
            "target": "/workspace/output/flood/d04199/b.txt"}),
    );
    assert_eq!(common::mcp::result_text(&r), "ok", "{r}");
    let calls = calls(&ws, s);
    assert_eq!(calls.len(), 3, "{calls:#?}");
    for call in &calls {
        assert_eq!(call["detail"]["files_truncated"], json!(true), "{call}");
    }
}
