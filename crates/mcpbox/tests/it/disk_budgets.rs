//! Disk budgets that hold (issue 26): a sandbox's writable space (under
//! `serve` its output and tmp together, under `run --builtin` the built-in
//! server's tmp) is one volume of the policy's `[filesystem] tmp` size, so
//! an agent that writes without end stops at its own limit with a clear
//! error, and never fills the filesystem of mcpbox's state (the audit log,
//! the registry, the other agents' workspaces). Through the real binary,
//! with the state directory on a small tmpfs the test mounts (root), and
//! rootless on the same volumes mounted by fuse2fs (where the state
//! directory is an ordinary one: the bound is what is checked).
#![allow(clippy::unwrap_used, clippy::expect_used)]

use crate::common;

use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::process::Command;

use common::audit::events;
use common::mcp::{result_text, Session};
use common::serve::{text_of, Gateway, Mcp, ALICE, BOB};
use common::smallfs::SmallFs;
use common::{is_root, mcpbox};
use serde_json::{json, Value};

/// The policy's bound in the tests: 4 MiB for output and tmp together.
const BOUND: u64 = 4 << 20;

/// The serve config, its policy and the `workspace` test server in `dir`.
fn serve_config(dir: &Path) -> String {
    let bin = dir.join("bin");
    std::fs::create_dir_all(&bin).unwrap();
    std::fs::set_permissions(&bin, std::fs::Permissions::from_mode(0o755)).unwrap();
    let server = bin.join("workspace");
    std::fs::copy(common::mcp::testserver("workspace"), &server).unwrap();
    std::fs::write(
        dir.join("ws.toml"),
        format!(
            "[server]\nname = \"ws\"\n{}\n[filesystem]\ntmp = \"4MiB\"\n[tools]\ndefault = \"allow\"\n",
            common::peers::mount_same_path(&bin)
        ),
    )
    .unwrap();
    format!(
        r#"[listen]
address = "127.0.0.1:0"
[[clients]]
name = "alice"
token = {{ from_env = "T_ALICE" }}
[[clients]]
name = "bob"
token = {{ from_env = "T_BOB" }}
[[servers]]
name = "ws"
policy = "{}"
command = ["{}"]
"#,
        dir.join("ws.toml").display(),
        server.display()
    )
}

fn tempdir(prefix: &str) -> tempfile::TempDir {
    let dir = tempfile::Builder::new().prefix(prefix).tempdir().unwrap();
    std::fs::set_permissions(dir.path(), std::fs::Permissions::from_mode(0o755)).unwrap();
    dir
}

/// "wrote N bytes, then: why" of the workspace server's `fill`.
fn filled(answer: &Value) -> (u64, String) {
    let text = answer.to_string();
    let n = text
        .split("wrote ")
        .nth(1)
        .and_then(|t| t.split(' ').next())
        .and_then(|n| n.parse().ok())
        .unwrap_or_else(|| panic!("no byte count in {answer}"));
    (n, text)
}

/// Every tool call in `db` of `tool` has its start and its record.
fn assert_every_call_recorded(db: &Path, tool: &str, calls: usize) {
    let all = events(db);
    let of = |kind: &str| {
        all.iter()
            .filter(|e| e["kind"] == kind && e["tool"] == tool)
            .count()
    };
    assert_eq!(of("call_start"), calls, "{tool}'s starts: {all:#?}");
    assert_eq!(of("tool_call"), calls, "{tool}'s records: {all:#?}");
}

fn verify(db: &Path, state: &Path) {
    let out = Command::new(mcpbox())
        .args(["audit", "--verify", "--db"])
        .arg(db)
        .env("MCPBOX_STATE_DIR", state)
        .output()
        .unwrap();
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    assert_eq!(out.status.code(), Some(0), "{text}");
}

#[test]
fn an_agent_writing_without_end_under_serve_fills_its_own_volume_never_the_state_directory() {
    let dir = tempdir("mcpbox-disk-");
    // the state directory (as root): 24 MiB, for the audit log, the
    // registry and two workspaces of 4 MiB each; rootless an ordinary one
    let fs = is_root().then(|| SmallFs::mount_at(&dir.path().join("state"), "24m", "0700"));
    let config = serve_config(dir.path());
    let gw = Gateway::start_config(dir, &config);
    let state = gw.state();
    let mut a = gw.mcp("ws", Some(ALICE));
    a.initialize();
    let mut b = gw.mcp("ws", Some(BOB));
    b.initialize();
    let free_before = fs.as_ref().map(SmallFs::free);
    assert_created_bound(&gw);
    // the whole bound is reserved: mkfs's zeroing punches holes in the
    // image, which her first writes would otherwise take from the state
    // directory's filesystem
    assert_wholly_reserved(&state.join("sandboxes"), 2);

    // alice writes without end in tmp, then in output: both stop, together
    // within her bound, with ENOSPC
    let (in_tmp, why) = filled(&a.call("fill", json!({"path": "/workspace/tmp/big"})));
    assert!(why.contains("No space left on device"), "{why}");
    assert!(
        in_tmp > BOUND / 2 && in_tmp <= BOUND,
        "{in_tmp} bytes in tmp"
    );
    let (in_output, why) = filled(&a.call("fill", json!({"path": "/workspace/output/big"})));
    assert!(why.contains("No space left on device"), "{why}");
    assert!(in_tmp + in_output <= BOUND, "{in_tmp} + {in_output} bytes");
    // the space was reserved when her sandbox was made: the state
    // directory's filesystem lost nothing to her writes (the audit log's
    // few records aside)
    if let (Some(fs), Some(before)) = (&fs, free_before) {
        assert!(
            fs.free() + BOUND / 8 >= before,
            "the state directory lost {} bytes",
            before.saturating_sub(fs.free())
        );
    }

    // bob and the gateway go on; alice's sandbox too, once she deletes
    let r = b.call(
        "write",
        json!({"path": "/workspace/output/bob.txt", "text": "bob's"}),
    );
    assert_eq!(text_of(&r), "wrote /workspace/output/bob.txt", "{r}");
    let r = b.call("read", json!({"path": "/workspace/output/bob.txt"}));
    assert_eq!(text_of(&r), "bob's", "{r}");
    let r = a.call("remove", json!({"path": "/workspace/tmp/big"}));
    assert_eq!(text_of(&r), "ok", "{r}");
    let r = a.call(
        "write",
        json!({"path": "/workspace/tmp/small", "text": "fits"}),
    );
    assert_eq!(text_of(&r), "wrote /workspace/tmp/small", "{r}");

    // nothing is lost from the audit
    let db = state.join("audit.db");
    let _ = gw.cli_json(&["sandboxes", "list"]);
    drop(a);
    drop(b);
    let dir = gw.kill9();
    assert_every_call_recorded(&db, "fill", 2);
    assert_every_call_recorded(&db, "write", 2);
    verify(&db, &state);
    // start again: the volumes are found mounted and reused, alice's files
    // are where she left them; then a clean stop unmounts them
    let gw = Gateway::start_config(dir, &config);
    let mut a = gw.mcp("ws", Some(ALICE));
    a.initialize();
    let r = a.call("read", json!({"path": "/workspace/tmp/small"}));
    assert_eq!(text_of(&r), "fits", "{r}");
    drop(a);
    let dir = stop(gw);
    assert_eq!(mounts_under(&state), Vec::<String>::new());
    assert_eq!(fuse2fs_under(&state), Vec::<String>::new());
    drop(fs);
    drop(dir);
}

/// Stops the gateway as a user would (SIGTERM) and keeps its directory.
fn stop(mut gw: Gateway) -> tempfile::TempDir {
    gw.sigterm();
    let status = gw.wait(std::time::Duration::from_secs(30));
    assert!(status.success(), "{status:?}\n{}", gw.stderr());
    gw.kill9()
}

#[test]
fn a_sandbox_that_cannot_reserve_its_volume_is_refused_naming_the_free_space() {
    if !is_root() {
        eprintln!("skipped: it mounts a small tmpfs as the state directory, which needs root");
        return;
    }
    let dir = tempdir("mcpbox-disk-");
    // room for one 4 MiB workspace (and the 1 MiB kept free), not two
    let fs = SmallFs::mount_at(&dir.path().join("state"), "7m", "0700");
    let config = serve_config(dir.path());
    let gw = Gateway::start_config(dir, &config);
    let mut a = gw.mcp("ws", Some(ALICE));
    a.initialize();
    let r = a.call("count", json!({}));
    assert_eq!(text_of(&r), "1", "{r}");
    let mut b = gw.mcp("ws", Some(BOB));
    let msg = b.message(
        "initialize",
        json!({"protocolVersion": common::serve::VERSION, "capabilities": {},
               "clientInfo": {"name": "t", "version": "0"}}),
    );
    let r = b.post(&msg);
    let text = r.text();
    assert!(text.contains("MiB free of"), "{}: {text}", r.status);
    // alice goes on, and the audit log can still be written
    let r = a.call("count", json!({}));
    assert_eq!(text_of(&r), "2", "{r}");
    let state = gw.state();
    drop(a);
    let dir = stop(gw);
    verify(&state.join("audit.db"), &state);
    drop(fs);
    drop(dir);
}

/// The `created` record of the first sandbox says what bounds it: a
/// volume on a loop device as root, fuse2fs rootless, and no warning.
fn assert_created_bound(gw: &Gateway) {
    assert!(
        !gw.stderr()
            .contains("[filesystem] tmp does not bound the sandboxes' workspaces here"),
        "{}",
        gw.stderr()
    );
    let created = gw.audit_until("the sandbox's creation", |e| {
        e["kind"] == "lifecycle" && e["detail"]["action"] == "created"
    });
    let rec = created
        .iter()
        .find(|e| e["kind"] == "lifecycle" && e["detail"]["action"] == "created")
        .unwrap();
    assert_eq!(rec["detail"]["disk"]["bound"], json!(BOUND), "{rec}");
    let by = if is_root() { "volume" } else { "fuse2fs" };
    assert_eq!(rec["detail"]["disk"]["by"], json!(by), "{rec}");
}

/// Each of the `count` workspace images under `sandboxes` has every
/// block of its length allocated (no hole for a write to fill later).
fn assert_wholly_reserved(sandboxes: &Path, count: usize) {
    use std::os::unix::fs::MetadataExt;
    let mut seen = 0;
    for entry in std::fs::read_dir(sandboxes).unwrap() {
        let image = entry.unwrap().path().join("volume.img");
        let Ok(meta) = std::fs::symlink_metadata(&image) else {
            continue;
        };
        assert!(
            meta.blocks() * 512 >= meta.len(),
            "{} has {} of its {} bytes allocated",
            image.display(),
            meta.blocks() * 512,
            meta.len()
        );
        seen += 1;
    }
    assert_eq!(
        seen,
        count,
        "workspace images under {}",
        sandboxes.display()
    );
}

/// The mounts left under `dir` in this (the host's) mount namespace.
fn mounts_under(dir: &Path) -> Vec<String> {
    std::fs::read_to_string("/proc/self/mountinfo")
        .unwrap()
        .lines()
        .filter(|l| l.contains(&format!(" {}/", dir.display())))
        .map(str::to_string)
        .collect()
}

/// The fuse2fs processes whose image is under `dir`.
fn fuse2fs_under(dir: &Path) -> Vec<String> {
    let mut out = Vec::new();
    for e in std::fs::read_dir("/proc").unwrap().flatten() {
        let Ok(cmd) = std::fs::read(e.path().join("cmdline")) else {
            continue;
        };
        let cmd = String::from_utf8_lossy(&cmd).replace('\0', " ");
        if cmd.contains("fuse2fs") && cmd.contains(&dir.display().to_string()) {
            out.push(cmd);
        }
    }
    out
}

/// The policy of the `run --builtin` tests.
fn builtin_policy(dir: &Path) -> PathBuf {
    let p = dir.join("sandbox.toml");
    std::fs::write(
        &p,
        "[server]\nname = \"sandbox\"\n[filesystem]\ntmp = \"4MiB\"\n",
    )
    .unwrap();
    p
}

fn start_builtin(policy: &Path, state: &Path) -> Session {
    let args: Vec<String> = ["run", "--builtin", "sandbox", "--policy"]
        .iter()
        .map(|a| a.to_string())
        .chain([policy.display().to_string()])
        .collect();
    Session::start_mcpbox(&args, &[("MCPBOX_STATE_DIR", state.to_str().unwrap())])
}

/// The working spaces `run --builtin` has in `state`.
fn run_spaces(state: &Path) -> Vec<String> {
    let mut names: Vec<String> = std::fs::read_dir(state.join("builtin"))
        .map(|d| {
            d.flatten()
                .map(|e| e.file_name().to_string_lossy().into_owned())
                .collect()
        })
        .unwrap_or_default();
    names.sort();
    names
}

#[test]
fn the_builtin_server_writing_without_end_stops_at_its_tmp_bound_with_a_clear_error() {
    let dir = tempdir("mcpbox-disk-");
    let state = dir.path().join("state");
    let fs = is_root().then(|| SmallFs::mount_at(&state, "16m", "0700"));
    let policy = builtin_policy(dir.path());
    let mut s = start_builtin(&policy, &state);
    s.initialize();
    let block = "x".repeat(256 << 10);
    let mut wrote = 0u64;
    let mut calls = 0;
    let full = loop {
        let r = s.call(
            "write_file",
            json!({"path": "/workspace/tmp/big", "content": block, "append": true}),
        );
        calls += 1;
        let text = result_text(&r);
        if r["result"]["isError"] == json!(true) || r.get("error").is_some() {
            break text;
        }
        wrote += block.len() as u64;
        assert!(wrote <= BOUND, "wrote {wrote} bytes past the bound");
    };
    assert!(full.contains("the workspace is full"), "{full}");
    assert!(wrote > BOUND / 2, "{wrote}");
    // the server and the gateway go on
    let r = s.call(
        "write_file",
        json!({"path": "/workspace/tmp/big", "content": "small"}),
    );
    calls += 1;
    assert!(r["result"]["isError"] != json!(true), "{r}");
    if let Some(fs) = &fs {
        assert!(fs.free() > 1 << 20, "the state directory is full");
    }
    s.close_stdin();
    let (status, stderr) = s.finish();
    assert!(status.success(), "{stderr}");
    // its working space is gone with it
    assert_eq!(run_spaces(&state), Vec::<String>::new());
    let db = state.join("audit.db");
    assert_every_call_recorded(&db, "write_file", calls);
    verify(&db, &state);
    drop(fs);
}

#[test]
fn a_kill_9_of_run_builtin_leaves_a_working_space_the_next_run_reclaims() {
    let dir = tempdir("mcpbox-disk-");
    let state = dir.path().join("state");
    let policy = builtin_policy(dir.path());
    let mut s = start_builtin(&policy, &state);
    s.initialize();
    let r = s.call(
        "write_file",
        json!({"path": "/workspace/tmp/secret.txt", "content": "the agent's"}),
    );
    assert!(r["result"]["isError"] != json!(true), "{r}");
    let left = run_spaces(&state);
    assert_eq!(left.len(), 2, "a space and its lock: {left:?}");
    // a second run beside it does not take the live one's space
    let mut other = start_builtin(&policy, &state);
    other.initialize();
    assert_eq!(run_spaces(&state).len(), 4, "{:?}", run_spaces(&state));
    other.close_stdin();
    let (status, stderr) = other.finish();
    assert!(status.success(), "{stderr}");
    assert_eq!(run_spaces(&state), left);
    // SIGKILL: nothing of mcpbox runs to clean up
    s.child.kill().unwrap();
    let _ = s.child.wait();
    assert_eq!(run_spaces(&state), left, "the killed run's space is left");
    // rootless, its fuse2fs dies with it (and unmounts): nothing of a
    // killed mcpbox runs on
    let until = std::time::Instant::now() + std::time::Duration::from_secs(10);
    while !fuse2fs_under(&state).is_empty() && std::time::Instant::now() < until {
        std::thread::sleep(std::time::Duration::from_millis(20));
    }
    assert_eq!(fuse2fs_under(&state), Vec::<String>::new());
    let mut next = start_builtin(&policy, &state);
    next.initialize();
    let now = run_spaces(&state);
    assert_eq!(now.len(), 2, "{now:?}");
    assert!(
        now.iter().all(|n| !left.contains(n)),
        "the killed run's space was not reclaimed: {now:?}"
    );
    next.close_stdin();
    let (status, stderr) = next.finish();
    assert!(status.success(), "{stderr}");
    assert_eq!(run_spaces(&state), Vec::<String>::new());
    assert_eq!(mounts_under(&state), Vec::<String>::new());
    assert_eq!(fuse2fs_under(&state), Vec::<String>::new());
}

#[test]
fn doctor_says_how_workspaces_are_bounded_here() {
    let state = tempdir("mcpbox-disk-");
    let out = Command::new(mcpbox())
        .arg("doctor")
        .env("MCPBOX_STATE_DIR", state.path())
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&out.stdout);
    let line = text
        .lines()
        .find(|l| l.starts_with("disk:"))
        .unwrap_or_else(|| panic!("no disk line:\n{text}"));
    let how = if is_root() {
        "on a loop device"
    } else {
        "mounted by fuse2fs"
    };
    assert!(line.contains("are bounded by [filesystem] tmp"), "{line}");
    assert!(line.contains(how), "{line}");
}

/// A gateway whose state directory (`MCPBOX_STATE_DIR`, `<dir>/state`)
/// is a symlink to `<dir>/real`, as `/var/lib/mcpbox` may be one to a
/// bigger disk: the gateway, the real directory (canonical), and what
/// unmounts the volumes left there when the test fails (dropped last:
/// a volume left mounted would outlive the test).
fn symlinked_state_gateway() -> (Unmount, Gateway, PathBuf, String) {
    let dir = tempdir("mcpbox-disk-");
    let real = std::fs::canonicalize(dir.path()).unwrap().join("real");
    std::fs::create_dir(&real).unwrap();
    std::fs::set_permissions(&real, std::fs::Permissions::from_mode(0o700)).unwrap();
    std::os::unix::fs::symlink(&real, dir.path().join("state")).unwrap();
    let guard = Unmount(real.clone());
    let config = serve_config(dir.path());
    let gw = Gateway::start_config(dir, &config);
    (guard, gw, real, config)
}

/// Unmounts whatever is left mounted under its directory when dropped,
/// then removes the test's directory above it (which the gateway's own
/// removal could not empty while something was mounted in it).
struct Unmount(PathBuf);

impl Drop for Unmount {
    fn drop(&mut self) {
        common::serve::unmount_volumes(&self.0);
        if let Some(test_dir) = self.0.parent() {
            let _ = std::fs::remove_dir_all(test_dir);
        }
    }
}

/// How many mounts /proc/self/mountinfo has stacked at `at` (its mount
/// point field: the kernel's name, symlinks resolved).
fn mounts_at(at: &Path) -> usize {
    std::fs::read_to_string("/proc/self/mountinfo")
        .unwrap()
        .lines()
        .filter(|l| l.split(' ').nth(4) == Some(&*at.to_string_lossy()))
        .count()
}

/// A session of `token` on `ws`, its sandbox started; when it cannot
/// start, the failure says what is mounted under `real` and what the
/// gateway logged.
fn open(gw: &Gateway, token: &str, real: &Path) -> Mcp {
    let mut m = gw.mcp("ws", Some(token));
    let msg = m.message(
        "initialize",
        json!({"protocolVersion": common::serve::VERSION, "capabilities": {},
               "clientInfo": {"name": "t", "version": "0"}}),
    );
    let r = m.post(&msg);
    let text = r.text();
    assert!(
        r.status == 200 && !text.contains("\"error\""),
        "the sandbox did not start: {} {text}\nmounted under {}: {:#?}\ngateway log:\n{}",
        r.status,
        real.display(),
        mounts_under(real),
        gw.stderr()
    );
    m.session = Some(r.header("mcp-session-id").unwrap().to_string());
    let n = m.post(&json!({"jsonrpc": "2.0", "method": "notifications/initialized"}));
    assert_eq!(n.status, 202, "initialized: {}", n.text());
    m
}

/// The id of `agent`'s one sandbox.
fn sandbox_id(gw: &Gateway, agent: &str) -> String {
    let all = gw.cli_json(&["sandboxes", "list"]);
    let mine: Vec<&Value> = all
        .as_array()
        .unwrap()
        .iter()
        .filter(|s| s["agent"] == agent)
        .collect();
    assert_eq!(mine.len(), 1, "{all}");
    mine[0]["id"].as_str().unwrap().to_string()
}

/// Mount recognition compares paths with /proc/self/mountinfo, which
/// names the real directory: through a symlinked state directory a live
/// volume was not seen, its workspace was emptied through the mount point
/// (EBUSY then), and the mount and its loop device were left behind.
#[test]
fn a_volume_under_a_symlinked_state_dir_is_unmounted_before_its_workspace_is_removed() {
    let (_guard, gw, real, _) = symlinked_state_gateway();
    let mut a = open(&gw, ALICE, &real);
    let r = a.call(
        "write",
        json!({"path": "/workspace/output/a.txt", "text": "alice's"}),
    );
    assert_eq!(text_of(&r), "wrote /workspace/output/a.txt", "{r}");
    assert_created_bound(&gw);
    let id = sandbox_id(&gw, "alice");
    let workspace = real.join("sandboxes").join(&id);
    assert_eq!(mounts_at(&workspace.join("volume")), 1, "{}", gw.stderr());
    drop(a);
    let t = gw.cli_json(&["sandboxes", "destroy", &id]);
    assert_eq!(t["left"], json!([]), "teardown left: {t}");
    assert_eq!(mounts_under(&real), Vec::<String>::new());
    assert!(!workspace.exists(), "{} is left", workspace.display());
    // and serve stopping unmounts the volumes it keeps
    let mut b = open(&gw, BOB, &real);
    let r = b.call("count", json!({}));
    assert_eq!(text_of(&r), "1", "{r}");
    drop(b);
    let dir = stop(gw);
    assert_eq!(mounts_under(&real), Vec::<String>::new());
    assert_eq!(fuse2fs_under(&real), Vec::<String>::new());
    drop(dir);
}

/// A volume already mounted is recognized and kept (as its sandbox
/// starts, and when a `serve` started again finds what a killed one left
/// mounted): through a symlinked state directory it was not, and the
/// image was mounted a second time over the first (two ext4 instances
/// writing one image; the new sandbox's folders hidden under the second).
#[test]
fn a_volume_under_a_symlinked_state_dir_is_never_mounted_twice() {
    let (_guard, gw, real, config) = symlinked_state_gateway();
    let mut a = open(&gw, ALICE, &real);
    let r = a.call(
        "write",
        json!({"path": "/workspace/output/a.txt", "text": "alice's"}),
    );
    assert_eq!(text_of(&r), "wrote /workspace/output/a.txt", "{r}");
    let volume = real
        .join("sandboxes")
        .join(sandbox_id(&gw, "alice"))
        .join("volume");
    assert_eq!(mounts_at(&volume), 1, "{}", gw.stderr());
    drop(a);
    let dir = gw.kill9();
    let gw = Gateway::start_config(dir, &config);
    let mut a = open(&gw, ALICE, &real);
    let r = a.call("read", json!({"path": "/workspace/output/a.txt"}));
    assert_eq!(text_of(&r), "alice's", "{r}");
    assert_eq!(mounts_at(&volume), 1, "{}", gw.stderr());
    drop(a);
    let dir = stop(gw);
    assert_eq!(mounts_under(&real), Vec::<String>::new());
    assert_eq!(fuse2fs_under(&real), Vec::<String>::new());
    drop(dir);
}
