//! Runtime discovery (issue 13, docs/runtime.md): servers started with no
//! hand-written mounts, through the real binary. The reference servers
//! from npm (their node_modules tree in .local/peers/npm) and PyPI (the
//! peers' virtual environment) answer initialize and a real tools/call
//! under a policy that names only the workspace; a made-up pyenv layout
//! and a node_modules tree with a `#!/usr/bin/env node` script prove the
//! links, `pyvenv.cfg` and the tree are followed; a runtime inside a
//! credential location is refused; a home directory is never mounted
//! whole; `npx -y`, `uvx` and `pipx run` (the pinned uv and pipx of the
//! peers' venv) install from a registry stand-in on loopback and then
//! answer MCP, and fail at once, naming the fix, where the policy does not
//! allow their registry.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use crate::common;

use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use common::http::Stub;
use common::mcp::{result_text, Session};
use common::peers::peer;
use common::runtimes::{tiny_server_js, tiny_server_py};
use common::{mcpbox, Workspace};
use serde_json::json;

/// `mcpbox run --policy P -- ARGS` with the state in the workspace and
/// `env` added; initialized.
fn start(ws: &Workspace, policy: &Path, args: &[&str], env: &[(&str, &str)]) -> Session {
    let state = ws.path().join("state").display().to_string();
    let mut all = vec![("MCPBOX_STATE_DIR", state.as_str())];
    all.extend_from_slice(env);
    let mut s = Session::start(policy, args, &all);
    let init = s.initialize();
    assert!(init.get("result").is_some(), "{init}\n{}", s.stderr());
    s
}

/// Ends the session cleanly and returns its stderr.
fn finish(s: Session) -> String {
    let (status, stderr) = s.finish();
    assert!(status.success(), "mcpbox run failed: {stderr}");
    stderr
}

/// The `mcpbox: runtime: mounted ...` lines of a stderr.
fn mounted(stderr: &str) -> Vec<String> {
    stderr
        .lines()
        .filter_map(|l| l.strip_prefix("mcpbox: runtime: mounted "))
        .map(|l| l.split(' ').next().unwrap_or_default().to_string())
        .collect()
}

/// Calls `tool` and asserts its answer's text holds `needle`.
#[track_caller]
fn answers(s: &mut Session, tool: &str, args: serde_json::Value, needle: &str) {
    let r = s.call(tool, args);
    assert!(result_text(&r).contains(needle), "{r}\n{}", s.stderr());
}

/// A policy with the workspace only (and the audit log beside it).
fn workspace_policy(ws: &Workspace) -> PathBuf {
    ws.policy("[audit]\npath = \"audit.db\"\n")
}

#[test]
fn server_filesystem_from_its_node_modules_tree_runs_with_no_hand_written_mounts() {
    let ws = Workspace::new();
    let p = workspace_policy(&ws);
    let server = peer("npm/bin/mcp-server-filesystem").display().to_string();
    let mut s = start(
        &ws,
        &p,
        &[&server, "/workspace/input", "/workspace/output"],
        &[],
    );
    answers(
        &mut s,
        "read_text_file",
        json!({"path": "/workspace/input/hello.txt"}),
        "hello from the host",
    );
    let stderr = finish(s);
    // the bin link's directory and the package's node_modules tree, not
    // the whole npm prefix (issue 32: the package tree, nothing beside it)
    let bin = peer("npm/bin").display().to_string();
    let tree = peer("npm/lib/node_modules").display().to_string();
    assert_eq!(mounted(&stderr), vec![bin.clone(), tree], "{stderr}");
    assert!(
        stderr.contains("read-only (the node_modules tree of"),
        "{stderr}"
    );
    // and the session's record says what was mounted
    let start = common::audit::events(&ws.path().join("audit.db"))
        .into_iter()
        .find(|e| e["kind"] == "session_start")
        .expect("a session_start record");
    assert_eq!(start["detail"]["runtime"][0]["path"], json!(bin), "{start}");
}

#[test]
fn server_everything_found_on_the_callers_path_runs_with_no_hand_written_mounts() {
    let ws = Workspace::new();
    let p = workspace_policy(&ws);
    let path = format!(
        "{}:{}",
        peer("npm/bin").display(),
        std::env::var("PATH").unwrap_or_default()
    );
    let mut s = start(&ws, &p, &["mcp-server-everything"], &[("PATH", &path)]);
    answers(
        &mut s,
        "echo",
        json!({"message": "through discovery"}),
        "through discovery",
    );
    let stderr = finish(s);
    assert!(
        stderr.contains("running mcp-server-everything as") && stderr.contains("(found on PATH)"),
        "{stderr}"
    );
    // the server is who the user named, whatever PATH held: its pins and
    // its record keep the command as written
    let start = common::audit::events(&ws.path().join("audit.db"))
        .into_iter()
        .find(|e| e["kind"] == "session_start")
        .expect("a session_start record");
    assert_eq!(
        start["detail"]["server"],
        json!("command:[\"mcp-server-everything\"]"),
        "{start}"
    );
}

/// A PyPI server from the peers' venv, with no mount: its venv is found
/// from the script's `#!` line, its base interpreter from `pyvenv.cfg`.
fn venv_server(ws: &Workspace, policy: &Path, args: &[&str]) -> Session {
    let mut s = start(ws, policy, args, &[]);
    let tools = s.tool_names();
    assert!(!tools.is_empty(), "{}", s.stderr());
    s
}

#[test]
fn mcp_server_time_from_a_venv_runs_with_no_hand_written_mounts() {
    let ws = Workspace::new();
    let p = workspace_policy(&ws);
    let server = peer("venv/bin/mcp-server-time").display().to_string();
    let mut s = venv_server(&ws, &p, &[&server, "--local-timezone", "UTC"]);
    answers(
        &mut s,
        "get_current_time",
        json!({"timezone": "UTC"}),
        "\"timezone\": \"UTC\"",
    );
    let stderr = finish(s);
    assert_eq!(
        mounted(&stderr),
        vec![peer("venv").display().to_string()],
        "{stderr}"
    );
}

#[test]
fn mcp_server_git_from_a_venv_runs_with_no_hand_written_mounts() {
    let ws = Workspace::new();
    let git = |args: &[&str]| {
        let out = Command::new("git")
            .args(["-c", "user.name=t", "-c", "user.email=t@localhost"])
            .args(args)
            .current_dir(ws.input())
            .output()
            .unwrap();
        assert!(out.status.success(), "git {args:?}: {out:?}");
    };
    git(&["init", "-q", "-b", "main"]);
    git(&["add", "hello.txt"]);
    git(&["commit", "-q", "-m", "discovered"]);
    let p = workspace_policy(&ws);
    let server = peer("venv/bin/mcp-server-git").display().to_string();
    let mut s = venv_server(&ws, &p, &[&server, "--repository", "/workspace/input"]);
    answers(
        &mut s,
        "git_log",
        json!({"repo_path": "/workspace/input"}),
        "discovered",
    );
    finish(s);
}

#[test]
fn mcp_server_fetch_from_a_venv_runs_with_no_hand_written_mounts() {
    let stub = Stub::start();
    stub.route(
        "/page.html",
        "text/html; charset=utf-8",
        "<html><body><article><h1>Found</h1><p>The fetch server was found by runtime \
         discovery and reached this page through the proxy.</p></article></body></html>",
    );
    let ws = Workspace::new();
    let p = ws.policy(&format!(
        "[audit]\npath = \"audit.db\"\n[network]\nallow = [\"docs.test:{}\"]\n\
         [network.hosts]\n\"docs.test\" = \"127.0.0.1\"\n",
        stub.port()
    ));
    let server = peer("venv/bin/mcp-server-fetch").display().to_string();
    // The allowed name is mapped to 127.0.0.1: the sandbox's resolver
    // gives it a stand-in address (issue 31), which the server's own
    // guard refuses as it would 127.0.0.1; the proxy checks the mapping.
    let mut s = venv_server(&ws, &p, &[&server, "--allow-private-ips"]);
    let url = format!("http://docs.test:{}/page.html", stub.port());
    answers(
        &mut s,
        "fetch",
        json!({"url": url}),
        "found by runtime discovery",
    );
    finish(s);
}

/// `mcpbox exec --policy P -- ARGS` with `env` added.
fn exec(policy: &Path, args: &[&str], env: &[(&str, &str)]) -> std::process::Output {
    let mut cmd = Command::new(mcpbox());
    cmd.arg("exec")
        .arg("--policy")
        .arg(policy)
        .arg("--")
        .args(args);
    for (k, v) in env {
        cmd.env(k, v);
    }
    cmd.stdin(Stdio::null()).output().expect("run mcpbox exec")
}

fn make_executable(p: &Path, body: &str) {
    std::fs::create_dir_all(p.parent().unwrap()).unwrap();
    std::fs::write(p, body).unwrap();
    std::fs::set_permissions(p, std::fs::Permissions::from_mode(0o755)).unwrap();
}

#[test]
fn a_venv_whose_python_links_into_a_pyenv_prefix_outside_usr_runs() {
    // a pyenv-like prefix under the test's directory: a copy of the
    // system interpreter in `versions/3.11.2/bin`, its stdlib reached
    // through `lib/python3.11` (a link into /usr, as a real prefix's own
    // copy would be); a venv whose python links there, with pyvenv.cfg's
    // home naming it, and a module in its site-packages
    let ws = Workspace::new();
    let prefix = ws.path().join("fakehome/.pyenv/versions/3.11.2");
    std::fs::create_dir_all(prefix.join("bin")).unwrap();
    std::fs::create_dir_all(prefix.join("lib")).unwrap();
    let real = std::fs::canonicalize("/usr/bin/python3").unwrap();
    let version = real.file_name().unwrap().to_str().unwrap().to_string();
    std::fs::copy(&real, prefix.join("bin").join(&version)).unwrap();
    std::os::unix::fs::symlink(
        Path::new("/usr/lib").join(&version),
        prefix.join("lib").join(&version),
    )
    .unwrap();
    let venv = ws.path().join("proj/.venv");
    std::fs::create_dir_all(venv.join("bin")).unwrap();
    std::os::unix::fs::symlink(prefix.join("bin").join(&version), venv.join("bin/python")).unwrap();
    std::fs::write(
        venv.join("pyvenv.cfg"),
        format!(
            "home = {}\ninclude-system-site-packages = false\n",
            prefix.join("bin").display()
        ),
    )
    .unwrap();
    let site = venv.join("lib").join(&version).join("site-packages");
    std::fs::create_dir_all(&site).unwrap();
    std::fs::write(site.join("tinymod.py"), "WORD = 'from the venv'\n").unwrap();
    let script = venv.join("bin/show");
    make_executable(
        &script,
        &format!(
            "#!{}\nimport sys, tinymod\nprint(sys.prefix, sys.base_prefix, tinymod.WORD)\n",
            venv.join("bin/python").display()
        ),
    );
    let p = ws.policy("");
    let out = exec(&p, &[script.to_str().unwrap()], &[]);
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{stdout}\n{stderr}");
    assert_eq!(
        stdout.trim(),
        format!("{} {} from the venv", venv.display(), prefix.display()),
        "{stderr}"
    );
    let m = mounted(&stderr);
    assert!(
        m.contains(&venv.display().to_string()) && m.contains(&prefix.display().to_string()),
        "{stderr}"
    );
}

#[test]
fn an_env_node_script_in_a_node_modules_tree_finds_its_dependency() {
    // app/node_modules/.bin/tiny -> ../tiny/bin/tiny.js (#!/usr/bin/env
    // node), which requires a sibling package of the same tree
    let ws = Workspace::new();
    let nm = ws.path().join("app/node_modules");
    make_executable(
        &nm.join("tiny/bin/tiny.js"),
        &tiny_server_js("require('tiny-greeting').text"),
    );
    std::fs::write(
        nm.join("tiny/package.json"),
        r#"{"name":"tiny","version":"1.0.0"}"#,
    )
    .unwrap();
    std::fs::create_dir_all(nm.join("tiny-greeting")).unwrap();
    std::fs::write(
        nm.join("tiny-greeting/index.js"),
        "exports.text = 'hello from the tree';\n",
    )
    .unwrap();
    std::fs::create_dir_all(nm.join(".bin")).unwrap();
    std::os::unix::fs::symlink("../tiny/bin/tiny.js", nm.join(".bin/tiny")).unwrap();
    let p = workspace_policy(&ws);
    let bin = nm.join(".bin/tiny").display().to_string();
    let mut s = start(&ws, &p, &[&bin], &[]);
    let r = s.call("greet", json!({"name": "sandbox"}));
    assert_eq!(
        result_text(&r),
        "hello from the tree, sandbox",
        "{r}\n{}",
        s.stderr()
    );
    let stderr = finish(s);
    assert_eq!(mounted(&stderr), vec![nm.display().to_string()], "{stderr}");
}

#[test]
fn a_runtime_inside_a_credential_location_is_refused_not_mounted() {
    let ws = Workspace::new();
    let tool = ws.path().join("backup/.ssh/tools/server");
    make_executable(&tool, "#!/bin/sh\necho started\n");
    let p = ws.policy("");
    let out = exec(&p, &[tool.to_str().unwrap()], &[]);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(125), "{stderr}");
    assert!(!String::from_utf8_lossy(&out.stdout).contains("started"));
    assert!(
        stderr.contains(&format!("refusing to mount {}", tool.display()))
            && stderr.contains("credential location .ssh")
            && stderr.contains("dangerously_allow_credentials = true"),
        "{stderr}"
    );
    assert!(mounted(&stderr).is_empty(), "{stderr}");
}

#[test]
fn discovery_never_mounts_the_home_directory_wholesale() {
    // a script kept directly in $HOME, beside a private file: the script
    // alone is mounted, never the home it sits in
    let ws = Workspace::new();
    let home = ws.path().join("users/me");
    std::fs::create_dir_all(&home).unwrap();
    std::fs::write(home.join("private.txt"), "not for the sandbox").unwrap();
    let script = home.join("server.sh");
    make_executable(
        &script,
        &format!(
            "#!/bin/sh\ncat {}/private.txt || echo unreadable\n",
            home.display()
        ),
    );
    let p = ws.policy("");
    let out = exec(
        &p,
        &[script.to_str().unwrap()],
        &[("HOME", home.to_str().unwrap())],
    );
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{stdout}\n{stderr}");
    assert!(
        stdout.contains("unreadable") && !stdout.contains("not for the sandbox"),
        "{stdout}"
    );
    assert_eq!(
        mounted(&stderr),
        vec![script.display().to_string()],
        "{stderr}"
    );
}

#[test]
fn runtime_discover_false_mounts_nothing_but_still_checks_a_runners_registry() {
    let ws = Workspace::new();
    let p = ws.policy("[runtime]\ndiscover = false\n");
    let server = peer("venv/bin/mcp-server-time").display().to_string();
    let out = exec(&p, &[&server, "--help"], &[]);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(127), "{stderr}");
    assert!(!stderr.contains("mcpbox: runtime:"), "{stderr}");
    // a runner's registry is still checked: that mounts nothing
    let out = exec(&p, &["npx", "-y", "some-server"], &[]);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(125), "{stderr}");
    assert!(stderr.contains("npx -y needs the npm registry"), "{stderr}");
}

const NPM_NAME: &str = "mcpbox-tiny-server";
const NPM_VERSION: &str = "2.0.1";

/// Packs `server.js` as an npm package (a bin of the package's name) and
/// prints the tarball's integrity and shasum (/usr/bin/python3's stdlib).
const PACK: &str = r#"
import base64, hashlib, io, json, sys, tarfile
out, name, version, server = sys.argv[1:]
def add(tf, path, data, mode):
    info = tarfile.TarInfo(path)
    info.size, info.mode, info.mtime = len(data), mode, 1700000000
    tf.addfile(info, io.BytesIO(data))
buf = io.BytesIO()
with tarfile.open(fileobj=buf, mode="w:gz") as tf:
    pkg = {"name": name, "version": version, "bin": {name: "server.js"}, "license": "MIT"}
    add(tf, "package/package.json", json.dumps(pkg).encode(), 0o644)
    add(tf, "package/server.js", open(server, "rb").read(), 0o755)
tgz = buf.getvalue()
open(out, "wb").write(tgz)
print(json.dumps({
    "integrity": "sha512-" + base64.b64encode(hashlib.sha512(tgz).digest()).decode(),
    "shasum": hashlib.sha1(tgz).hexdigest(),
}))
"#;

#[test]
fn npx_y_installs_from_a_local_registry_stand_in_and_answers_mcp() {
    let ws = Workspace::new();
    let js = ws.path().join("server.js");
    std::fs::write(&js, tiny_server_js("'hello from npx'")).unwrap();
    let tgz = ws.path().join("pkg.tgz");
    let out = Command::new("/usr/bin/python3")
        .args(["-c", PACK])
        .arg(&tgz)
        .args([NPM_NAME, NPM_VERSION])
        .arg(&js)
        .output()
        .unwrap();
    assert!(out.status.success(), "{out:?}");
    let hashes: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    let stub = Stub::start();
    let port = stub.port();
    let registry = format!("http://registry.npmjs.org:{port}");
    let tarball = format!("/{NPM_NAME}/-/{NPM_NAME}-{NPM_VERSION}.tgz");
    let packument = json!({
        "name": NPM_NAME,
        "dist-tags": {"latest": NPM_VERSION},
        "versions": {NPM_VERSION: {
            "name": NPM_NAME, "version": NPM_VERSION,
            "bin": {NPM_NAME: "server.js"},
            "dist": {"tarball": format!("{registry}{tarball}"),
                     "integrity": hashes["integrity"], "shasum": hashes["shasum"]},
        }},
    });
    stub.route(
        &format!("/{NPM_NAME}"),
        "application/json",
        packument.to_string(),
    );
    stub.route(
        &tarball,
        "application/octet-stream",
        std::fs::read(&tgz).unwrap(),
    );
    let p = ws.policy(&format!(
        "[audit]\npath = \"audit.db\"\n[network]\nallow = [\"registry.npmjs.org:{port}\"]\n\
         [network.hosts]\n\"registry.npmjs.org\" = \"127.0.0.1\"\n\
         [env]\nset = {{ npm_config_update_notifier = \"false\" }}\n"
    ));
    let reg_flag = format!("--registry={registry}/");
    let mut s = start(&ws, &p, &["npx", &reg_flag, "-y", NPM_NAME], &[]);
    let r = s.call("greet", json!({"name": "registry"}));
    assert_eq!(
        result_text(&r),
        "hello from npx, registry",
        "{r}\n{}\nregistry saw: {:?}",
        s.stderr(),
        stub.requests()
    );
    let stderr = finish(s);
    assert!(
        stub.requests().iter().any(|r| r.contains(&tarball)),
        "{:?}",
        stub.requests()
    );
    // the download went into this server's own cache, private to its owner
    let cache = std::fs::canonicalize(ws.path().join("state/cache/policy/npm")).unwrap();
    assert!(
        stderr.contains(&format!("mounted {} read-write", cache.display())),
        "{stderr}"
    );
    let mode = std::fs::metadata(&cache).unwrap().permissions().mode();
    assert_eq!(mode & 0o777, 0o700);
    assert!(
        cache.join("_npx").is_dir(),
        "npx used another cache: {stderr}"
    );
}

/// Runs `mcpbox ARGS` and waits at most `limit` for it to end; panics
/// (killing it) if it does not.
fn ends_within(args: &[&str], state: &Path, limit: Duration) -> std::process::Output {
    let mut child = Command::new(mcpbox())
        .args(args)
        .env("MCPBOX_STATE_DIR", state)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let started = Instant::now();
    while child.try_wait().unwrap().is_none() {
        if started.elapsed() > limit {
            let _ = child.kill();
            let out = child.wait_with_output().unwrap();
            panic!(
                "mcpbox {args:?} was still waiting; stderr: {}",
                String::from_utf8_lossy(&out.stderr)
            );
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    child.wait_with_output().unwrap()
}

#[test]
fn npx_y_without_the_registry_allowed_fails_at_once_naming_the_fix() {
    let ws = Workspace::new();
    let p = ws.policy("").display().to_string();
    let state = ws.path().join("state");
    // generous: the point is that it ends by itself, not how fast
    let limit = Duration::from_secs(60);
    let out = ends_within(
        &[
            "run",
            "--policy",
            &p,
            "--",
            "npx",
            "-y",
            "@modelcontextprotocol/server-everything",
        ],
        &state,
        limit,
    );
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(125), "{stderr}");
    assert!(
        stderr.contains("npx -y needs the npm registry (registry.npmjs.org)")
            && stderr.contains("allow = [\"registry.npmjs.org\"]")
            && stderr.contains("node_modules"),
        "{stderr}"
    );
    for (cmd, host) in [
        (
            &["uvx", "mcp-server-time"][..],
            "pypi.org, files.pythonhosted.org",
        ),
        (
            &["pipx", "run", "mcp-server-time"][..],
            "pypi.org, files.pythonhosted.org",
        ),
        (&["npx", "mcp-server-x"][..], "registry.npmjs.org"),
    ] {
        let mut args = vec!["exec", "--policy", &p, "--"];
        args.extend_from_slice(cmd);
        let out = ends_within(&args, &state, limit);
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(125), "{cmd:?}: {stderr}");
        assert!(
            stderr.contains(host) && stderr.contains("[network]"),
            "{cmd:?}: {stderr}"
        );
    }
}

#[test]
fn a_registry_url_that_hides_its_host_behind_a_backslash_is_refused_at_once() {
    // To npm (a WHATWG URL parser) `\` is `/`: this registry is evil.test.
    // Read as "the host after the last @" it was registry.npmjs.org, which
    // the policy allows, and the runner was let start; read strictly, the
    // URL is refused before anything runs.
    let ws = Workspace::new();
    let p = ws
        .policy("[network]\nallow = [\"registry.npmjs.org\"]\n")
        .display()
        .to_string();
    let state = ws.path().join("state");
    for registry in [
        "--registry=https://evil.test\\@registry.npmjs.org/",
        "--registry=https://registry.npmjs.org:443@evil.test/",
    ] {
        let out = ends_within(
            &["exec", "--policy", &p, "--", "npx", registry, "-y", "pkg"],
            &state,
            Duration::from_secs(60),
        );
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(125), "{registry}: {stderr}");
        assert!(
            stderr.contains("registry URL mcpbox cannot read strictly")
                && (stderr.contains("backslash") || stderr.contains("user information")),
            "{registry}: {stderr}"
        );
    }
}

const PY_SERVER: &str = "mcpbox-tiny-mcp";
const PY_SERVER_VERSION: &str = "0.3.2";

/// A PyPI stand-in serving the tiny Python server (wheel files on the same
/// host as the index, so the policy allows that one name), and a policy
/// that allows only `pypi.org` on the stand-in's port, mapped to it, with
/// `env_set` as its `[env] set`. Returns the stub, the policy, the index
/// URL as a user would give it, and the wheel's path on the stub.
fn pypi_stand_in(ws: &Workspace, env_set: &str) -> (Stub, PathBuf, String, String) {
    let wheel = common::pypi::build_wheel(
        ws.path(),
        PY_SERVER,
        PY_SERVER_VERSION,
        &tiny_server_py(&format!("{:?}", format!("hello from {PY_SERVER}"))),
        true,
    );
    let stub = Stub::start();
    let port = stub.port();
    let base = format!("http://pypi.org:{port}");
    let wheel_path = common::pypi::serve_wheel(&stub, &wheel, &base);
    let p = ws.policy(&format!(
        "[audit]\npath = \"audit.db\"\n[network]\nallow = [\"pypi.org:{port}\"]\n\
         [network.hosts]\n\"pypi.org\" = \"127.0.0.1\"\n\
         [env]\nset = {{ {env_set} }}\n"
    ));
    (stub, p, format!("{base}/simple"), wheel_path)
}

/// `PATH` with the peers' venv (where `uv`/`uvx` and `pipx` are
/// installed, pinned) in front, as a user who installed them would have.
fn path_with_peers_venv() -> String {
    format!(
        "{}:{}",
        peer("venv/bin").display(),
        std::env::var("PATH").unwrap_or_default()
    )
}

/// Calls the tiny Python server's tool, ends the session, checks the
/// wheel came from the stand-in, and returns stderr and the cache
/// directory (checked to be mounted read-write and private).
fn greets_from_the_stand_in(
    ws: &Workspace,
    mut s: Session,
    stub: &Stub,
    wheel_path: &str,
    cache: &str,
) -> (String, PathBuf) {
    let r = s.call("greet", json!({"name": "registry"}));
    assert_eq!(
        result_text(&r),
        format!("hello from {PY_SERVER}, registry"),
        "{r}\n{}\nregistry saw: {:?}",
        s.stderr(),
        stub.requests()
    );
    let stderr = finish(s);
    assert!(
        stub.requests().iter().any(|r| r.contains(wheel_path)),
        "{:?}",
        stub.requests()
    );
    let cache = std::fs::canonicalize(ws.path().join("state/cache/policy").join(cache)).unwrap();
    assert!(
        stderr.contains(&format!("mounted {} read-write", cache.display())),
        "{stderr}"
    );
    let mode = std::fs::metadata(&cache).unwrap().permissions().mode();
    assert_eq!(mode & 0o777, 0o700);
    (stderr, cache)
}

/// Every file under `dir` whose name contains `needle`.
fn files_named(dir: &Path, needle: &str) -> Vec<PathBuf> {
    let mut found = Vec::new();
    let mut todo = vec![dir.to_path_buf()];
    while let Some(d) = todo.pop() {
        let Ok(entries) = std::fs::read_dir(&d) else {
            continue;
        };
        for e in entries.flatten() {
            let path = e.path();
            if e.file_type().is_ok_and(|t| t.is_dir()) {
                todo.push(path.clone());
            }
            if e.file_name().to_string_lossy().contains(needle) {
                found.push(path);
            }
        }
    }
    found
}

#[test]
fn uvx_installs_from_a_local_pypi_stand_in_and_answers_mcp() {
    // issue 13: `uvx PKG` works when the policy allows its registry, with
    // a per-server cache. The index is given on the command line, as a
    // user would; uv runs the package with the sandbox's /usr/bin/python3
    // (UV_PYTHON_DOWNLOADS=never: see docs/runtime.md).
    let ws = Workspace::new();
    let (stub, p, index, wheel_path) = pypi_stand_in(&ws, "UV_PYTHON_DOWNLOADS = \"never\"");
    let path = path_with_peers_venv();
    let s = start(
        &ws,
        &p,
        &["uvx", "--index-url", &index, PY_SERVER],
        &[("PATH", &path)],
    );
    let (stderr, cache) = greets_from_the_stand_in(&ws, s, &stub, &wheel_path, "uv");
    let module = PY_SERVER.replace('-', "_");
    assert!(
        !files_named(&cache, &module).is_empty(),
        "uvx used another cache: {stderr}"
    );
}

#[test]
fn pipx_run_installs_from_a_local_pypi_stand_in_and_answers_mcp() {
    // issue 13: `pipx run PKG` works when the policy allows its registry,
    // with a per-server cache. The index is given on the command line
    // (pipx passes it to pip, or to `uv tool run` with its uv backend,
    // which it picks by itself when uv is installed beside it, as here;
    // both backends are run). With the pip
    // backend a plain-HTTP index must be a trusted host, and pipx's
    // shared pip is the interpreter's bundled one (its auto-upgrade would
    // fetch pip itself, which the stand-in does not serve).
    let ws = Workspace::new();
    let (stub, p, index, wheel_path) = pypi_stand_in(
        &ws,
        "PIP_TRUSTED_HOST = \"pypi.org\", PIPX_DISABLE_SHARED_LIBS_AUTO_UPGRADE = \"1\", \
         UV_PYTHON_DOWNLOADS = \"never\"",
    );
    let path = path_with_peers_venv();
    let module = PY_SERVER.replace('-', "_");
    // uv's cache (the uv backend), then pipx's own (pip's)
    for (backend, under) in [("uv", "uv"), ("pip", ".cache")] {
        let s = start(
            &ws,
            &p,
            &[
                "pipx",
                "run",
                "--backend",
                backend,
                "--index-url",
                &index,
                PY_SERVER,
            ],
            &[("PATH", &path)],
        );
        let (stderr, cache) = greets_from_the_stand_in(&ws, s, &stub, &wheel_path, "pipx");
        assert!(
            !files_named(&cache.join(under), &module).is_empty(),
            "pipx --backend {backend} used another cache: {stderr}"
        );
    }
}

/// Issue 32: `serve` opens each session's sandbox with the runtime
/// discovered as `run` does (once, at the gateway's start): `node FILE`
/// (its package tree and node_modules) and a venv of a pyenv Python (the
/// venv and the prefix its python links to) answer a real call under a
/// policy that names no mount; before, both were "not found".
#[test]
fn serve_starts_node_file_and_a_pyenv_venv_server_with_no_hand_written_mounts() {
    use common::serve::{Gateway, Server, ALICE};
    let installs = tempfile::Builder::new()
        .prefix("mcpbox-installs-")
        .tempdir()
        .unwrap();
    let node = common::runtimes::node_file_server(installs.path(), "");
    let venv = common::runtimes::venv_server(installs.path());
    std::fs::set_permissions(installs.path(), std::fs::Permissions::from_mode(0o755)).unwrap();
    let command = |s: &common::runtimes::Shape| {
        let mut c = vec![s.command.clone()];
        c.extend(s.args.iter().cloned());
        c
    };
    let gw = Gateway::start(
        "",
        &[
            Server {
                name: "nodefile",
                command: command(&node),
                policy: "",
            },
            Server {
                name: "venv",
                command: command(&venv),
                policy: "",
            },
        ],
    );
    for (server, answer) in [
        ("nodefile", "node file key unset, sandbox"),
        ("venv", venv.answer.as_str()),
    ] {
        let mut m = gw.mcp(server, Some(ALICE));
        let init = m.initialize();
        assert!(init.get("result").is_some(), "{init}\n{}", gw.stderr());
        let r = m.call("greet", json!({"name": "sandbox"}));
        assert_eq!(result_text(&r), answer, "{r}\n{}", gw.stderr());
    }
    let stderr = gw.stderr();
    let tree = installs.path().join("node-project").display().to_string();
    assert!(
        stderr.contains(&format!("(nodefile): runtime: mounted {tree} read-only")),
        "{stderr}"
    );
}
