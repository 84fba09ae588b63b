//! Presets, `mcpbox init`, `mcpbox check FILE...` and `extends`, through the
//! real binary; the presets' servers are the real ones from npm and PyPI
//! (`.local/peers`, MCPBOX_PEERS overrides). Until mcpbox mounts a command's
//! runtime by itself, the policies here extend a preset with the read-only
//! mount of the runtime the interop tests use (the venv, the npm prefix, at
//! their own paths): everything else comes from the preset.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use crate::common;

use std::path::Path;
use std::process::{Command, Output, Stdio};

use common::http::Stub;
use common::mcp::{result_text, Session};
use common::peers::{mount_same_path, peer};
use common::{audit, mcpbox, Workspace};
use serde_json::{json, Value};

/// `mcpbox ARGS` run in `dir`, its state directory in it.
fn mcpbox_in(dir: &Path, args: &[&str]) -> Output {
    mcpbox_in_state(dir, &dir.join("state"), args)
}

/// `mcpbox ARGS` run in `dir` with the state directory `state`: outside
/// `dir` for a preset that mounts the current directory (mcpbox refuses to
/// give a sandbox a directory that holds its state).
fn mcpbox_in_state(dir: &Path, state: &Path, args: &[&str]) -> Output {
    Command::new(mcpbox())
        .args(args)
        .current_dir(dir)
        .env("MCPBOX_STATE_DIR", state)
        .stdin(Stdio::null())
        .output()
        .expect("run mcpbox")
}

fn text(b: &[u8]) -> String {
    String::from_utf8_lossy(b).into_owned()
}

/// Asserts mcpbox exited with `code` and said `needle` on stderr.
#[track_caller]
fn assert_fails(out: &Output, code: i32, needle: &str) {
    let err = text(&out.stderr);
    assert_eq!(out.status.code(), Some(code), "{err}");
    assert!(err.contains(needle), "{needle:?} not in: {err}");
}

/// `mcpbox run --policy POLICY -- SERVER...` in `dir`, initialized.
fn start_in(dir: &Path, policy: &Path, server: &[String]) -> Session {
    let mut cmd = Command::new(mcpbox());
    cmd.arg("run")
        .arg("--policy")
        .arg(policy)
        .arg("--")
        .args(server)
        .current_dir(dir)
        .env("MCPBOX_STATE_DIR", dir.join("state"));
    let mut s = Session::start_command(cmd);
    let init = s.initialize();
    assert!(init.get("result").is_some(), "{init}\n{}", s.stderr());
    s
}

/// Asserts the relay refused the call for `reason`.
#[track_caller]
fn assert_refused_for(r: &Value, reason: &str) {
    assert_eq!(r["result"]["isError"], json!(true), "{r}");
    assert!(
        result_text(r).contains(reason),
        "not refused for {reason}: {r}"
    );
}

#[test]
fn init_writes_a_starter_that_passes_check_and_shows_every_section() {
    let ws = Workspace::new();
    let out = mcpbox_in(ws.path(), &["init"]);
    assert!(out.status.success(), "{}", text(&out.stderr));
    let starter = text(&out.stdout);
    for section in [
        "[server]",
        "[filesystem]",
        "[[filesystem.mounts]]",
        "[env]",
        "[secrets]",
        "[process]",
        "[network]",
        "[tools]",
        "[output]",
        "[sandbox]",
        "[audit]",
        "[[tests]]",
        "extends = \"preset:",
    ] {
        assert!(
            starter.contains(&format!("# {section}")),
            "{section} missing:\n{starter}"
        );
    }
    std::fs::write(ws.path().join("starter.toml"), &starter).unwrap();
    let out = mcpbox_in(ws.path(), &["check", "starter.toml"]);
    assert!(out.status.success(), "{}", text(&out.stderr));
    // as written, it is the strictest policy: no directory, no network
    let effective = text(&out.stdout);
    assert!(effective.contains("allow = []"), "{effective}");
    assert!(!effective.contains("input ="), "{effective}");
}

#[test]
fn init_of_every_preset_passes_check_where_its_host_paths_exist() {
    let ws = Workspace::new();
    let list = mcpbox_in(ws.path(), &["init", "--list"]);
    assert!(list.status.success());
    let names: Vec<String> = text(&list.stdout)
        .lines()
        .map(|l| l.split_whitespace().next().unwrap().to_string())
        .collect();
    assert!(names.len() >= 10, "{names:?}");
    // the presets that mount the current directory: the state beside it
    let project = ws.path().join("project");
    std::fs::create_dir(&project).unwrap();
    let state = ws.path().join("state");
    for name in &names {
        let file = format!("{name}.toml");
        let out = mcpbox_in_state(
            &project,
            &state,
            &["init", "--preset", name, "--output", &file],
        );
        assert!(out.status.success(), "{name}: {}", text(&out.stderr));
        let check = || {
            mcpbox_in_state(
                &project,
                &state,
                &["check", &file, &format!("preset:{name}")],
            )
        };
        let out = check();
        if name == "playwright" {
            // its output folder must exist; said, then made
            let err = text(&out.stderr);
            assert!(
                !out.status.success() && err.contains("playwright-output does not exist"),
                "{err}"
            );
            std::fs::create_dir(project.join("playwright-output")).unwrap();
            let out = check();
            assert!(out.status.success(), "{name}: {}", text(&out.stderr));
            continue;
        }
        if name == "postgres" && !Path::new("/var/run/postgresql").exists() {
            // the socket directory is the one host path a preset names
            let err = text(&out.stderr);
            assert!(
                !out.status.success() && err.contains("/var/run/postgresql does not exist"),
                "{err}"
            );
            continue;
        }
        assert!(out.status.success(), "{name}: {}", text(&out.stderr));
    }
}

#[test]
fn init_output_refuses_to_overwrite_without_force_and_leaves_the_file_untouched() {
    let ws = Workspace::new();
    let file = ws.path().join("mine.toml");
    std::fs::write(&file, "# my own policy\n").unwrap();
    let out = mcpbox_in(
        ws.path(),
        &["init", "--preset", "git", "--output", "mine.toml"],
    );
    assert_fails(
        &out,
        1,
        "mine.toml exists and was left as it is: pass --force",
    );
    assert_eq!(std::fs::read_to_string(&file).unwrap(), "# my own policy\n");
    // an unknown preset writes nothing either
    let out = mcpbox_in(
        ws.path(),
        &["init", "--preset", "gti", "--output", "new.toml"],
    );
    assert_fails(&out, 1, "known presets are");
    assert!(!ws.path().join("new.toml").exists());
    // --force replaces it with the preset, keeping its permissions
    use std::os::unix::fs::PermissionsExt;
    std::fs::set_permissions(&file, std::fs::Permissions::from_mode(0o640)).unwrap();
    let out = mcpbox_in(
        ws.path(),
        &[
            "init",
            "--preset",
            "git",
            "--output",
            "mine.toml",
            "--force",
        ],
    );
    assert!(out.status.success(), "{}", text(&out.stderr));
    assert!(std::fs::read_to_string(&file)
        .unwrap()
        .contains("name = \"git\""));
    let mode = std::fs::metadata(&file).unwrap().permissions().mode() & 0o777;
    assert_eq!(mode, 0o640);
}

#[test]
fn check_of_several_files_reports_every_failure_and_fails() {
    let ws = Workspace::new();
    std::fs::write(ws.path().join("a.toml"), "[process]\npids = 32\n").unwrap();
    std::fs::write(ws.path().join("bad.toml"), "[filesystem]\ninptu = \"x\"\n").unwrap();
    std::fs::write(ws.path().join("worse.toml"), "extends = \"preset:gti\"\n").unwrap();
    let out = mcpbox_in(
        ws.path(),
        &["check", "a.toml", "bad.toml", "worse.toml", "preset:time"],
    );
    assert_eq!(out.status.code(), Some(1));
    let err = text(&out.stderr);
    assert!(
        err.contains("bad.toml:2:1: filesystem.inptu: unknown key `inptu`"),
        "{err}"
    );
    assert!(
        err.contains("worse.toml:1:1: extends: unknown preset \"gti\"")
            && err.contains("known presets: everything, fetch, filesystem, git"),
        "{err}"
    );
    assert!(
        err.contains("2 of 4 files failed the check: bad.toml, worse.toml"),
        "{err}"
    );
    // the good ones are still checked and printed
    let stdout = text(&out.stdout);
    assert!(stdout.contains("# effective policy for a.toml"), "{stdout}");
    assert!(
        stdout.contains("# effective policy for preset:time"),
        "{stdout}"
    );
    let out = mcpbox_in(ws.path(), &["check", "a.toml", "preset:time"]);
    assert!(out.status.success(), "{}", text(&out.stderr));
}

#[test]
fn check_of_an_extending_policy_prints_the_merged_policy_and_points_at_its_own_errors() {
    let ws = Workspace::new();
    // the git preset mounts the current directory: the state beside it
    let repo = ws.path().join("repo");
    std::fs::create_dir(&repo).unwrap();
    std::fs::write(
        repo.join("repo.toml"),
        "extends = \"preset:git\"\n[tools]\ngit_commit = \"approve\"\n",
    )
    .unwrap();
    let out = mcpbox_in_state(&repo, &ws.path().join("state"), &["check", "repo.toml"]);
    assert!(out.status.success(), "{}", text(&out.stderr));
    let stdout = text(&out.stdout);
    assert!(stdout.contains("extends preset:git"), "{stdout}");
    assert!(stdout.contains("git_commit = \"approve\""), "{stdout}");
    assert!(stdout.contains("git_reset = \"deny\""), "{stdout}");
    // the name is the file's own, not the preset's
    assert!(stdout.contains("name = \"repo\""), "{stdout}");
    // a cycle through files is refused, naming the chain
    std::fs::write(ws.path().join("a.toml"), "extends = \"b.toml\"\n").unwrap();
    std::fs::write(ws.path().join("b.toml"), "extends = \"a.toml\"\n").unwrap();
    let out = mcpbox_in(ws.path(), &["check", "a.toml"]);
    assert_fails(&out, 1, "extends makes a cycle");
    // the preset's input = "." next to a credential folder: refused, and the
    // error says the key came from the preset (the file has no such line)
    let home = ws.path().join("home");
    std::fs::create_dir_all(home.join(".ssh")).unwrap();
    std::fs::write(home.join("fs.toml"), "extends = \"preset:filesystem\"\n").unwrap();
    let out = mcpbox_in_state(&home, &ws.path().join("state"), &["check", "fs.toml"]);
    assert_fails(
        &out,
        1,
        "refusing to mount it (inherited from extends = \"preset:filesystem\")",
    );
}

#[test]
fn a_serve_config_may_name_a_preset_as_a_servers_policy() {
    let ws = Workspace::new();
    let config = "[listen]\naddress = \"127.0.0.1:0\"\n\
        [[clients]]\nname = \"alice\"\ntoken = { from_env = \"ALICE_TOKEN\" }\n\
        [[servers]]\nname = \"time\"\npolicy = \"preset:time\"\ncommand = [\"mcp-server-time\"]\n";
    std::fs::write(ws.path().join("serve.toml"), config).unwrap();
    let out = mcpbox_in(ws.path(), &["check", "serve.toml"]);
    assert!(out.status.success(), "{}", text(&out.stderr));
    std::fs::write(
        ws.path().join("serve.toml"),
        config.replace("preset:time", "preset:tiem"),
    )
    .unwrap();
    let out = mcpbox_in(ws.path(), &["check", "serve.toml"]);
    assert_fails(&out, 1, "unknown preset \"tiem\"");
}

#[test]
fn preset_and_policy_together_are_refused() {
    let ws = Workspace::new();
    std::fs::write(ws.path().join("p.toml"), "").unwrap();
    let out = mcpbox_in(
        ws.path(),
        &[
            "run", "--preset", "time", "--policy", "p.toml", "--", "true",
        ],
    );
    assert_fails(&out, 2, "cannot be used with");
    let out = mcpbox_in(ws.path(), &["exec", "--preset", "nope", "--", "true"]);
    assert_fails(&out, 125, "unknown preset \"nope\"");
}

#[test]
fn exec_with_the_filesystem_preset_reads_the_current_directory_and_cannot_change_it() {
    let ws = Workspace::new();
    let dir = ws.input();
    let exec = |script: &str| {
        mcpbox_in_state(
            &dir,
            &ws.path().join("state"),
            &["exec", "--preset", "filesystem", "--", "sh", "-c", script],
        )
    };
    let out = exec("cat /workspace/input/hello.txt");
    assert_eq!(out.status.code(), Some(0), "{}", text(&out.stderr));
    assert_eq!(text(&out.stdout), "hello from the host\n");
    let out = exec("echo planted > /workspace/input/planted.txt");
    assert_ne!(out.status.code(), Some(0), "the input was writable");
    assert!(!dir.join("planted.txt").exists());
    // the parent of the current directory is not in the sandbox at all
    std::fs::write(ws.path().join("host-secret.txt"), "top secret").unwrap();
    let out = exec(&format!("cat {}/host-secret.txt", ws.path().display()));
    assert_ne!(out.status.code(), Some(0));
    assert!(!text(&out.stdout).contains("top secret"));
}

#[test]
fn time_preset_runs_the_pypi_time_server_and_refuses_a_tool_it_does_not_list() {
    let ws = Workspace::new();
    let venv = peer("venv");
    let policy = ws.raw_policy(&format!(
        "extends = \"preset:time\"\n{}[audit]\npath = \"audit.db\"\n",
        mount_same_path(&venv)
    ));
    let server = vec![
        venv.join("bin/mcp-server-time").display().to_string(),
        "--local-timezone".into(),
        "UTC".into(),
    ];
    let mut s = start_in(ws.path(), &policy, &server);
    let r = s.call("convert_time", json!({"source_timezone": "Europe/Paris", "time": "12:00", "target_timezone": "Asia/Tokyo"}));
    assert_ne!(r["result"]["isError"], json!(true), "{r}\n{}", s.stderr());
    let answer = result_text(&r);
    assert!(
        answer.contains("Asia/Tokyo") && answer.contains("T20:00"),
        "{answer}"
    );
    // the preset denies by default: a tool it does not name never reaches the server
    let r = s.call("set_time", json!({}));
    assert_refused_for(&r, "tool.default");
    let (status, err) = s.finish();
    assert!(status.success(), "{status:?}: {err}");
    let events = audit::events(&ws.path().join("audit.db"));
    let start = events
        .iter()
        .find(|e| e["kind"] == "session_start")
        .unwrap();
    assert_eq!(start["detail"]["policy"], "policy", "{start}");
}

#[test]
fn filesystem_preset_serves_the_policys_directory_read_only_and_nothing_outside_it() {
    let ws = Workspace::new();
    let secret = ws.path().join("host-secret.txt");
    std::fs::write(&secret, "top secret").unwrap();
    std::os::unix::fs::symlink(&secret, ws.input().join("escape-link")).unwrap();
    // the policy sits in the directory it serves: the preset's input = "."
    let policy = ws.input().join("mcpbox.toml");
    std::fs::write(
        &policy,
        format!(
            "extends = \"preset:filesystem\"\n{}",
            mount_same_path(&peer("npm"))
        ),
    )
    .unwrap();
    let server = vec![
        "node".to_string(),
        peer("npm/lib/node_modules/@modelcontextprotocol/server-filesystem/dist/index.js")
            .display()
            .to_string(),
        "/workspace/input".into(),
    ];
    let mut s = start_in(ws.path(), &policy, &server);
    let r = s.call(
        "read_text_file",
        json!({"path": "/workspace/input/hello.txt"}),
    );
    assert_eq!(result_text(&r), "hello from the host\n", "{r}");
    // writing is refused on the wire by the preset, and nothing is written
    let r = s.call(
        "write_file",
        json!({"path": "/workspace/input/evil.txt", "content": "x"}),
    );
    assert_refused_for(&r, "tool.rule");
    assert!(!ws.input().join("evil.txt").exists());
    // outside the input: the host path, and a symlink planted to reach it
    for path in [
        secret.display().to_string(),
        "/workspace/input/escape-link".into(),
    ] {
        let r = s.call("read_text_file", json!({"path": path}));
        assert!(!r.to_string().contains("top secret"), "{path}: {r}");
    }
    let (status, err) = s.finish();
    assert!(status.success(), "{err}");
}

#[test]
fn git_preset_reads_history_and_refuses_reset_and_commit() {
    let ws = Workspace::new();
    let repo = ws.path().join("repo");
    std::fs::create_dir(&repo).unwrap();
    let git = |args: &[&str]| common::git(&repo, args);
    git(&["init", "-q", "-b", "main"]);
    std::fs::write(repo.join("README"), "first\n").unwrap();
    git(&["add", "README"]);
    git(&["commit", "-q", "-m", "the first commit"]);
    std::fs::write(repo.join("README"), "changed, not committed\n").unwrap();
    let venv = peer("venv");
    let policy = ws.raw_policy(&format!(
        "extends = \"preset:git\"\n[filesystem]\ninput = \"repo\"\n{}",
        mount_same_path(&venv)
    ));
    let server = vec![
        venv.join("bin/mcp-server-git").display().to_string(),
        "--repository".into(),
        "/workspace/input".into(),
    ];
    let mut s = start_in(ws.path(), &policy, &server);
    let r = s.call("git_log", json!({"repo_path": "/workspace/input"}));
    assert!(
        result_text(&r).contains("the first commit"),
        "{r}\n{}",
        s.stderr()
    );
    for (tool, args) in [
        ("git_reset", json!({"repo_path": "/workspace/input"})),
        (
            "git_checkout",
            json!({"repo_path": "/workspace/input", "branch_name": "main"}),
        ),
        (
            "git_commit",
            json!({"repo_path": "/workspace/input", "message": "x"}),
        ),
    ] {
        let r = s.call(tool, args);
        assert_refused_for(&r, "tool.rule");
    }
    s.finish();
    // the uncommitted change survived: reset and checkout never ran
    assert_eq!(
        std::fs::read_to_string(repo.join("README")).unwrap(),
        "changed, not committed\n"
    );
}

#[test]
fn fetch_preset_asks_for_an_unlisted_host_and_without_an_answer_never_reaches_it() {
    let intranet = Stub::start();
    intranet.route(
        "/secret.html",
        "text/html",
        "<html><body>internal only</body></html>",
    );
    let ws = Workspace::new();
    let venv = peer("venv");
    // the name is mapped to the stub, but the preset does not allow it: it
    // is asked for, and this client has no elicitation to answer with
    let policy = ws.raw_policy(&format!(
        "extends = \"preset:fetch\"\n{}[network.hosts]\n\"intranet.test\" = \"127.0.0.1\"\n\
         [audit]\npath = \"audit.db\"\n",
        mount_same_path(&venv)
    ));
    let server = vec![
        venv.join("bin/mcp-server-fetch").display().to_string(),
        "--ignore-robots-txt".into(),
        // The name is mapped to 127.0.0.1, so the sandbox's resolver gives
        // it a stand-in address (issue 31), which the server's own guard
        // would refuse (as it would 127.0.0.1) before the proxy is asked;
        // the proxy's checks of the mapping stand in for it.
        "--allow-private-ips".into(),
    ];
    let mut s = start_in(ws.path(), &policy, &server);
    let url = format!("http://intranet.test:{}/secret.html", intranet.port());
    let r = s.call("fetch", json!({"url": url}));
    assert_eq!(r["result"]["isError"], json!(true), "{r}\n{}", s.stderr());
    assert!(!r.to_string().contains("internal only"), "{r}");
    s.finish();
    assert!(intranet.requests().is_empty(), "{:?}", intranet.requests());
    let events = audit::events(&ws.path().join("audit.db"));
    let to = audit::network_to(&events, "intranet.test");
    assert!(!to.is_empty(), "{events:#?}");
    assert!(to.iter().all(|e| e["decision"] == "deny"), "{to:#?}");
}

/// Issue 32, as a user met it: the real fetch server, told to fetch a page
/// of a development server on this machine, failed with a bare connection
/// error (its request went straight to the sandbox's own loopback) and the
/// audit had no record. Now the request reaches the proxy: refused with a
/// record and mcpbox naming the key, and answered once `[network] local`
/// names the port.
#[test]
fn fetch_preset_reaches_a_dev_server_on_this_machine_only_through_network_local() {
    let dev = Stub::start();
    dev.route(
        "/",
        "text/html",
        "<html><body><p>local dev page</p></body></html>",
    );
    let venv = peer("venv");
    // the server refuses loopback itself unless told otherwise
    let server = vec![
        venv.join("bin/mcp-server-fetch").display().to_string(),
        "--ignore-robots-txt".into(),
        "--allow-private-ips".into(),
    ];
    let url = format!("http://localhost:{}/", dev.port());
    for open in [false, true] {
        let ws = Workspace::new();
        let local = if open {
            // merged into the preset's [network], which keeps its other keys
            format!("[network]\nlocal = [\"localhost:{}\"]\n", dev.port())
        } else {
            String::new()
        };
        let policy = ws.raw_policy(&format!(
            "extends = \"preset:fetch\"\n{}{local}[audit]\npath = \"audit.db\"\n",
            mount_same_path(&venv)
        ));
        let mut s = start_in(ws.path(), &policy, &server);
        let r = s.call("fetch", json!({"url": url}));
        let (_, stderr) = s.finish();
        let events = audit::events(&ws.path().join("audit.db"));
        let to = audit::network_to(&events, "localhost");
        assert_eq!(to.len(), 1, "{events:#?}");
        if open {
            assert!(result_text(&r).contains("local dev page"), "{r}\n{stderr}");
            assert_eq!(to[0]["reason"], "network.local", "{to:#?}");
        } else {
            assert_eq!(r["result"]["isError"], json!(true), "{r}");
            assert!(!r.to_string().contains("local dev page"), "{r}");
            assert_eq!(to[0]["decision"], "deny", "{to:#?}");
            assert_eq!(to[0]["reason"], "network.local_unlisted", "{to:#?}");
            assert!(stderr.contains("[network] local"), "{stderr}");
            assert!(dev.requests().is_empty(), "{:?}", dev.requests());
        }
    }
    assert_eq!(dev.requests().len(), 1, "{:?}", dev.requests());
}

#[test]
fn github_preset_refuses_to_start_without_its_token_and_passes_only_that_token() {
    let ws = Workspace::new();
    let env = |token: Option<&str>| {
        let mut cmd = Command::new(mcpbox());
        cmd.args(["exec", "--preset", "github", "--", "env"])
            .current_dir(ws.path())
            .env("MCPBOX_STATE_DIR", ws.path().join("state"))
            .env("AWS_SECRET_ACCESS_KEY", "host-only-7d1e")
            .env_remove("GITHUB_PERSONAL_ACCESS_TOKEN");
        if let Some(t) = token {
            cmd.env("GITHUB_PERSONAL_ACCESS_TOKEN", t);
        }
        cmd.stdin(Stdio::null()).output().unwrap()
    };
    assert_fails(
        &env(None),
        125,
        "environment variable GITHUB_PERSONAL_ACCESS_TOKEN is not set",
    );
    let out = env(Some("ghp_test_5f2a"));
    assert_eq!(out.status.code(), Some(0), "{}", text(&out.stderr));
    let inside = text(&out.stdout);
    assert!(
        inside.contains("GITHUB_PERSONAL_ACCESS_TOKEN=ghp_test_5f2a"),
        "{inside}"
    );
    assert!(
        !inside.contains("host-only-7d1e"),
        "a host variable leaked: {inside}"
    );
}

/// A stdio MCP server whose three tools all declare `destructiveHint: true`;
/// each call answers with the tool's name.
const HINTED_SERVER: &str = r#"
import json, sys
TOOLS = [{"name": n, "description": "A tool.", "inputSchema": {"type": "object"},
          "annotations": {"destructiveHint": True, "readOnlyHint": False}}
         for n in ("named_tool", "globbed_tool", "other_tool")]
def send(msg):
    sys.stdout.write(json.dumps(msg) + "\n")
    sys.stdout.flush()
for line in sys.stdin:
    msg = json.loads(line)
    mid, method = msg.get("id"), msg.get("method")
    if mid is None or method is None:
        continue
    params = msg.get("params") or {}
    if method == "initialize":
        send({"jsonrpc": "2.0", "id": mid, "result": {"protocolVersion": params.get("protocolVersion"),
              "capabilities": {"tools": {}}, "serverInfo": {"name": "hinted", "version": "0"}}})
    elif method == "tools/list":
        send({"jsonrpc": "2.0", "id": mid, "result": {"tools": TOOLS}})
    elif method == "tools/call":
        send({"jsonrpc": "2.0", "id": mid, "result": {"content": [{"type": "text", "text": "ran " + params["name"]}]}})
    else:
        send({"jsonrpc": "2.0", "id": mid, "error": {"code": -32601, "message": "method not found"}})
"#;

/// Issue 32: the playwright preset said `browser_navigate = "allow"` and its
/// `[[tests]]` agreed, but the server's `destructiveHint` made the relay ask
/// a human for every navigate, click and type. One precedence now holds in
/// both: a rule naming the tool exactly stands against the hint; a glob or
/// `default` is raised by it. The examples state the hints the server
/// declares, `mcpbox check` accepts them, and the relay decides the same.
#[test]
fn an_exact_allow_for_a_destructive_hinted_tool_passes_the_relay_as_its_tests_say() {
    let ws = Workspace::new();
    std::fs::write(ws.input().join("server.py"), HINTED_SERVER).unwrap();
    let policy = ws.policy(
        "[audit]\npath = \"audit.db\"\n\
         [tools]\ndefault = \"allow\"\ndestructive = \"approve\"\n\
         named_tool = \"allow\"\n\"globbed_*\" = \"allow\"\n\
         [[tests]]\ntool = \"named_tool\"\ndestructive = true\nexpect = \"allow\"\n\
         [[tests]]\ntool = \"globbed_tool\"\ndestructive = true\nexpect = \"approve\"\n\
         [[tests]]\ntool = \"other_tool\"\ndestructive = true\nexpect = \"approve\"\n",
    );
    let check = mcpbox_in(ws.path(), &["check", policy.to_str().unwrap()]);
    assert_eq!(check.status.code(), Some(0), "{}", text(&check.stderr));

    let server = vec!["python3".to_string(), "/workspace/input/server.py".into()];
    let mut s = start_in(ws.path(), &policy, &server);
    // the relay learns the hints from the list, as it does for any host
    assert_eq!(s.tool_names().len(), 3);
    let named = s.call("named_tool", json!({}));
    assert_eq!(
        result_text(&named),
        "ran named_tool",
        "{named}\n{}",
        s.stderr()
    );
    assert_ne!(named["result"]["isError"], json!(true), "{named}");
    // no elicitation here: what asks a human is refused, and never runs
    for tool in ["globbed_tool", "other_tool"] {
        let r = s.call(tool, json!({}));
        assert_eq!(r["result"]["isError"], json!(true), "{tool}: {r}");
        assert!(!result_text(&r).contains("ran "), "{tool} ran: {r}");
    }
    s.finish();
    let events = audit::events(&ws.path().join("audit.db"));
    let call = |tool: &str| {
        events
            .iter()
            .find(|e| e["kind"] == "tool_call" && e["tool"] == tool)
            .unwrap_or_else(|| panic!("no call of {tool}: {events:#?}"))
            .clone()
    };
    let named = call("named_tool");
    assert_eq!(
        (&named["decision"], &named["reason"], &named["source"]),
        (
            &json!("allow"),
            &json!("tool.rule"),
            &json!("tools.named_tool")
        ),
        "{named}"
    );
    for tool in ["globbed_tool", "other_tool"] {
        // held for a human by the hint's floor, not refused by a rule
        let e = call(tool);
        assert_eq!(e["source"], "tools.destructive", "{e}");
    }
}

/// The page the browser test drives: a button that rewrites the heading.
const PAGE: &str = "<!doctype html><html><head><title>mcpbox browser test</title></head>\
<body style=\"background:#2a7\"><h1 id=\"h\">before</h1>\
<button id=\"press\" onclick=\"document.getElementById('h').textContent='clicked by the agent'\">Press me</button>\
</body></html>";

/// The playwright preset over the real `@playwright/mcp` (pinned in
/// scripts/install-peers.sh) and Debian's Chromium, with the test's page
/// opened by `[network] local` and the server's runtime mounted.
fn playwright_policy(ws: &Workspace, port: u16, extra: &str) -> std::path::PathBuf {
    let npm = peer("npm");
    std::fs::create_dir_all(ws.path().join("playwright-output")).unwrap();
    // as root the sandbox user is uid 65534: the output must be writable by it
    #[cfg(unix)]
    {
        use std::os::unix::fs::PermissionsExt;
        std::fs::set_permissions(
            ws.path().join("playwright-output"),
            std::fs::Permissions::from_mode(0o777),
        )
        .unwrap();
    }
    ws.raw_policy(&format!(
        "extends = \"preset:playwright\"\n{}[network]\nlocal = [\"localhost:{port}\"]\n\
         {extra}[audit]\npath = \"audit.db\"\n",
        mount_same_path(&npm)
    ))
}

fn playwright_server() -> Vec<String> {
    vec![peer("npm/bin/playwright-mcp").display().to_string()]
}

/// Issue 32: the preset works as shipped with Debian's Chromium. The agent
/// navigates to a page on this machine, clicks its button and saves a
/// screenshot into the output folder, without a human being asked for
/// anything: navigate and click carry destructiveHint, the preset allows
/// them by name, and Chromium's background requests are refused by the
/// preset's deny list instead of raising approval prompts mid-call.
#[test]
fn playwright_preset_drives_debian_chromium_to_a_local_page_clicks_and_saves_a_screenshot() {
    let page = Stub::start();
    page.route("/", "text/html", PAGE);
    let ws = Workspace::new();
    // denied tools listed too, to see the server's whole set
    let policy = playwright_policy(&ws, page.port(), "[tools]\nshow_denied = true\n");
    let mut s = start_in(ws.path(), &policy, &playwright_server());
    let tools = s.tool_names();
    for t in [
        "browser_navigate",
        "browser_click",
        "browser_take_screenshot",
    ] {
        assert!(tools.iter().any(|n| n == t), "{t} not in {tools:?}");
    }
    // the preset names every tool of the pinned version: none is left to
    // `default` (a renamed or new tool shows up here, not as a surprise)
    let preset = include_str!("../../../policy/presets/playwright.toml");
    let unnamed: Vec<&String> = tools
        .iter()
        .filter(|t| !preset.contains(&format!("\n\"{t}\"")))
        .collect();
    assert!(unnamed.is_empty(), "not named by the preset: {unnamed:?}");
    assert_eq!(tools.len(), 25, "{tools:?}");
    let url = format!("http://localhost:{}/", page.port());
    let r = s.call("browser_navigate", json!({"url": url}));
    assert_ne!(r["result"]["isError"], json!(true), "{r}\n{}", s.stderr());
    assert!(result_text(&r).contains("mcpbox browser test"), "{r}");
    let r = s.call(
        "browser_click",
        json!({"element": "Press me button", "target": "#press"}),
    );
    assert_ne!(r["result"]["isError"], json!(true), "{r}\n{}", s.stderr());
    let r = s.call("browser_snapshot", json!({}));
    assert!(result_text(&r).contains("clicked by the agent"), "{r}");
    let r = s.call("browser_take_screenshot", json!({}));
    assert_ne!(r["result"]["isError"], json!(true), "{r}\n{}", s.stderr());
    s.finish();

    // the screenshot is in the output folder on the host: a PNG of the viewport
    let shots: Vec<_> = std::fs::read_dir(ws.path().join("playwright-output"))
        .unwrap()
        .filter_map(Result::ok)
        .map(|e| e.path())
        .filter(|p| p.extension().is_some_and(|x| x == "png"))
        .collect();
    assert_eq!(shots.len(), 1, "{shots:?}");
    let png = std::fs::read(&shots[0]).unwrap();
    assert!(png.starts_with(b"\x89PNG\r\n\x1a\n"), "not a PNG");
    assert_eq!(&png[12..16], b"IHDR");
    let width = u32::from_be_bytes(png[16..20].try_into().unwrap());
    let height = u32::from_be_bytes(png[20..24].try_into().unwrap());
    assert!(
        (320..=4096).contains(&width) && (200..=4096).contains(&height),
        "{width}x{height}"
    );
    assert!(png.len() > 1000, "{} bytes", png.len());
    assert!(
        page.requests().iter().any(|r| r.starts_with("GET / ")),
        "{:?}",
        page.requests()
    );

    let events = audit::events(&ws.path().join("audit.db"));
    // the page came through the proxy, opened by network.local
    let to_page = audit::network_to(&events, "localhost");
    assert!(!to_page.is_empty(), "{events:#?}");
    assert!(
        to_page.iter().all(|e| e["reason"] == "network.local"),
        "{to_page:#?}"
    );
    // nothing was put to a human: no connection waited for an answer, and
    // every call was allowed outright
    for e in events.iter().filter(|e| e["kind"] == "network") {
        assert_ne!(e["decision"], "approve", "{e}");
        assert!(
            e["reason"] == "network.local" || e["reason"] == "network.deny",
            "{e}"
        );
    }
    for e in events.iter().filter(|e| e["kind"] == "tool_call") {
        assert_eq!(e["decision"], "allow", "{e}");
    }
}

/// Issue 32: why the preset turns Chromium's own sandbox off, shown rather
/// than claimed: asked to use it, Chromium cannot start inside mcpbox (it
/// needs a new user namespace, which mcpbox's seccomp filter refuses, or a
/// setuid helper, which no_new_privs rules out). mcpbox's sandbox around
/// the whole browser is what replaces it (docs/presets.md).
#[test]
fn chromiums_own_sandbox_cannot_start_inside_mcpbox_so_the_preset_turns_it_off() {
    let page = Stub::start();
    page.route("/", "text/html", PAGE);
    let ws = Workspace::new();
    let policy = playwright_policy(
        &ws,
        page.port(),
        "[env]\nset = { PLAYWRIGHT_MCP_SANDBOX = \"true\" }\n",
    );
    let mut s = start_in(ws.path(), &policy, &playwright_server());
    let url = format!("http://localhost:{}/", page.port());
    let r = s.call("browser_navigate", json!({"url": url}));
    assert_eq!(r["result"]["isError"], json!(true), "{r}");
    let t = result_text(&r);
    assert!(
        t.contains("sandboxing failed") || t.contains("No usable sandbox"),
        "{t}"
    );
    s.finish();
    assert!(page.requests().is_empty(), "{:?}", page.requests());
}
