//! mcpbox's state directory through the real binary (issue 25): private
//! to its user (0700, nothing in it readable by another local user), never
//! given to a sandbox (as, inside or above any mount, input, output or
//! template base), and holding nothing of a secret: what mcpbox keeps of a
//! server's definitions (pins) is the redacted form, and so is everything
//! the console's API, `mcpbox pin` and `mcpbox audit` show. Each test is
//! named after the attack it tries.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use crate::common;

use std::io::{Read, Write};
use std::net::TcpStream;
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};
use std::time::{Duration, Instant};

use common::mcp::Session;
use common::{is_root, mcpbox, Workspace};
use serde_json::json;

/// A secret with characters every encoding treats differently.
const SECRET: &str = "Zq9/s3cr3t+VALUE 4242=xyz";

/// `mcpbox ARGS` with `env`, stdin closed.
fn mcpbox_env(args: &[&str], env: &[(&str, &str)]) -> Output {
    Command::new(mcpbox())
        .args(args)
        .envs(env.iter().copied())
        .stdin(Stdio::null())
        .output()
        .expect("run mcpbox")
}

fn text(out: &Output) -> String {
    format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    )
}

// ---------------------------------------------------------------------
// The state directory is no sandbox's to see
// ---------------------------------------------------------------------

/// A workspace with a state directory `state/` that exists and holds
/// what a used one holds (pins, the audit key), and a directory `elsewhere`
/// holding a policy's own audit database.
fn state_ws() -> (Workspace, PathBuf) {
    let ws = Workspace::new();
    let state = ws.path().join("state");
    std::fs::create_dir_all(state.join("pins/p")).unwrap();
    std::fs::write(state.join("audit.key"), "0".repeat(64)).unwrap();
    (ws, state)
}

/// Each policy body (TOML, paths relative to the workspace) must be
/// refused by `exec`, `run` and `check`, naming mcpbox's own state.
#[track_caller]
fn assert_refused_everywhere(ws: &Workspace, state: &Path, body: &str, names: &str) {
    let policy = ws.raw_policy(body);
    let p = policy.to_str().unwrap();
    let env = [("MCPBOX_STATE_DIR", state.to_str().unwrap())];
    for args in [
        vec!["exec", "--policy", p, "--", "true"],
        vec!["run", "--policy", p, "--", "true"],
    ] {
        let out = mcpbox_env(&args, &env);
        let said = text(&out);
        assert_eq!(
            out.status.code(),
            Some(125),
            "{args:?} under\n{body}\n{said}"
        );
        assert!(
            said.contains(names) && said.contains("refusing to give it to a sandbox"),
            "{args:?} under\n{body}\n{said}"
        );
    }
    let out = mcpbox_env(&["check", p], &env);
    assert_eq!(
        out.status.code(),
        Some(1),
        "check under\n{body}\n{}",
        text(&out)
    );
    assert!(text(&out).contains(names), "{}", text(&out));
}

#[test]
fn a_policy_cannot_give_a_sandbox_mcpbox_state_directory() {
    let (ws, state) = state_ws();
    let dir = "mcpbox's state directory";
    // the state directory itself, as input and as output
    assert_refused_everywhere(&ws, &state, "[filesystem]\ninput = \"state\"\n", dir);
    assert_refused_everywhere(&ws, &state, "[filesystem]\noutput = \"state\"\n", dir);
    // a directory above it (the workspace holds it)
    assert_refused_everywhere(&ws, &state, "[filesystem]\ninput = \".\"\n", dir);
    // a folder inside it, as an extra mount, even with the credentials
    // override (that is for the user's credentials, not mcpbox's own)
    assert_refused_everywhere(
        &ws,
        &state,
        "[[filesystem.mounts]]\nhost = \"state/pins\"\nat = \"/p\"\n\
         dangerously_allow_credentials = true\n",
        dir,
    );
    // the audit key, a file
    assert_refused_everywhere(
        &ws,
        &state,
        "[[filesystem.mounts]]\nhost = \"state/audit.key\"\nat = \"/k\"\n",
        dir,
    );
    // through a symlink, and through `..`
    std::os::unix::fs::symlink(&state, ws.path().join("innocent")).unwrap();
    assert_refused_everywhere(&ws, &state, "[filesystem]\ninput = \"innocent\"\n", dir);
    assert_refused_everywhere(
        &ws,
        &state,
        "[filesystem]\ninput = \"input/../state/pins/..\"\n",
        dir,
    );
    // the same directory named through a symlinked MCPBOX_STATE_DIR
    let policy = ws.raw_policy("[filesystem]\ninput = \"state\"\n");
    let via = ws.path().join("innocent");
    let out = mcpbox_env(
        &["exec", "--policy", policy.to_str().unwrap(), "--", "true"],
        &[("MCPBOX_STATE_DIR", via.to_str().unwrap())],
    );
    assert_eq!(out.status.code(), Some(125), "{}", text(&out));
}

#[test]
fn a_policy_cannot_give_a_sandbox_its_own_audit_database() {
    let (ws, state) = state_ws();
    std::fs::create_dir(ws.path().join("logs")).unwrap();
    // the log beside the input: the folder that holds it, mounted
    assert_refused_everywhere(
        &ws,
        &state,
        "[audit]\npath = \"logs/audit.db\"\n[filesystem]\ninput = \"logs\"\n",
        "mcpbox's audit database",
    );
    // the log inside the output (not created yet: refused all the same)
    assert_refused_everywhere(
        &ws,
        &state,
        "[audit]\npath = \"output/deep/audit.db\"\n[filesystem]\noutput = \"output\"\n",
        "mcpbox's audit database",
    );
    // its write-ahead log alone
    std::fs::write(ws.path().join("logs/audit.db-wal"), "").unwrap();
    assert_refused_everywhere(
        &ws,
        &state,
        "[audit]\npath = \"logs/audit.db\"\n[[filesystem.mounts]]\nhost = \"logs/audit.db-wal\"\nat = \"/w\"\n",
        "mcpbox's audit database",
    );
}

#[test]
fn a_serve_config_cannot_give_a_sandbox_mcpbox_state() {
    let (ws, state) = state_ws();
    let env = [
        ("MCPBOX_STATE_DIR", state.to_str().unwrap()),
        ("T_ALICE", "alice-token"),
    ];
    let clients = "[[clients]]\nname = \"alice\"\ntoken = { from_env = \"T_ALICE\" }\n";
    std::fs::create_dir(ws.path().join("logs")).unwrap();
    // server a keeps its log in logs/; server b mounts logs/: b's sandbox
    // would read a's log
    std::fs::write(
        ws.path().join("a.toml"),
        "[server]\nname = \"a\"\n[audit]\npath = \"logs/a.db\"\n",
    )
    .unwrap();
    std::fs::write(
        ws.path().join("b.toml"),
        "[server]\nname = \"b\"\n[[filesystem.mounts]]\nhost = \"logs\"\nat = \"/logs\"\n",
    )
    .unwrap();
    let servers = "[[servers]]\nname = \"a\"\npolicy = \"a.toml\"\ncommand = [\"true\"]\n\
                   [[servers]]\nname = \"b\"\npolicy = \"b.toml\"\ncommand = [\"true\"]\n";
    let config = ws.path().join("serve.toml");
    std::fs::write(
        &config,
        format!("[listen]\naddress = \"127.0.0.1:0\"\n{clients}{servers}"),
    )
    .unwrap();
    let c = config.to_str().unwrap();
    let out = mcpbox_env(&["check", c], &env);
    assert_eq!(out.status.code(), Some(1), "{}", text(&out));
    assert!(
        text(&out).contains("mcpbox's audit database"),
        "{}",
        text(&out)
    );
    let out = mcpbox_env(&["serve", "--config", c], &env);
    assert!(!out.status.success(), "{}", text(&out));
    assert!(
        text(&out).contains("mcpbox's audit database"),
        "{}",
        text(&out)
    );

    // a template whose base holds the state directory: copied whole into
    // every workspace made from it
    std::fs::write(ws.path().join("c.toml"), "[server]\nname = \"c\"\n").unwrap();
    std::fs::write(
        &config,
        format!(
            "[listen]\naddress = \"127.0.0.1:0\"\n{clients}\
             [[templates]]\nname = \"t\"\nbase = \".\"\npolicy = \"c.toml\"\n\
             [[servers]]\nname = \"c\"\ncommand = [\"true\"]\ntemplate = \"t\"\n"
        ),
    )
    .unwrap();
    let out = mcpbox_env(&["check", c], &env);
    assert_eq!(out.status.code(), Some(1), "{}", text(&out));
    assert!(
        text(&out).contains("mcpbox's state directory"),
        "{}",
        text(&out)
    );
    let out = mcpbox_env(&["serve", "--config", c], &env);
    assert!(!out.status.success(), "{}", text(&out));
    assert!(
        text(&out).contains("mcpbox's state directory"),
        "{}",
        text(&out)
    );
}

// ---------------------------------------------------------------------
// The state directory is its user's alone
// ---------------------------------------------------------------------

fn mode(p: &Path) -> u32 {
    std::fs::symlink_metadata(p).unwrap().permissions().mode() & 0o7777
}

#[test]
fn a_loose_state_directory_left_by_an_older_mcpbox_is_tightened() {
    let ws = Workspace::new();
    let state = ws.path().join("state");
    let pins = state.join("pins/policy");
    std::fs::create_dir_all(&pins).unwrap();
    for d in [&state, &state.join("pins"), &pins] {
        std::fs::set_permissions(d, std::fs::Permissions::from_mode(0o755)).unwrap();
    }
    let pin = pins.join("0123456789abcdef.json");
    std::fs::write(&pin, "{\"version\":2,\"tools\":{}}").unwrap();
    std::fs::set_permissions(&pin, std::fs::Permissions::from_mode(0o644)).unwrap();
    let exe = state.join("tool.sh");
    std::fs::write(&exe, "#!/bin/sh\n").unwrap();
    std::fs::set_permissions(&exe, std::fs::Permissions::from_mode(0o755)).unwrap();
    let policy = ws.raw_policy("[server]\nname = \"policy\"\n");
    let out = mcpbox_env(
        &["pin", "list", "--policy", policy.to_str().unwrap()],
        &[("MCPBOX_STATE_DIR", state.to_str().unwrap())],
    );
    assert!(out.status.success(), "{}", text(&out));
    assert_eq!(mode(&state), 0o700);
    assert_eq!(mode(&state.join("pins")), 0o700);
    assert_eq!(mode(&pins), 0o700);
    assert_eq!(mode(&pin), 0o600);
    // the owner's own bits stay: an executable stays one
    assert_eq!(mode(&exe), 0o700);
}

#[test]
fn a_new_state_directory_and_its_pins_are_private() {
    let ws = Workspace::with_server("echo_secrets");
    let state = ws.path().join("state");
    let policy = ws.policy("");
    let mut s = Session::start(
        &policy,
        &["/workspace/input/echo_secrets"],
        &[("MCPBOX_STATE_DIR", state.to_str().unwrap())],
    );
    s.initialize();
    s.tool_names();
    let (status, err) = s.finish();
    assert!(status.success(), "{err}");
    let found = loose_entries(&state);
    assert!(found.is_empty(), "readable by others: {found:?}");
    let pin_files: Vec<PathBuf> = walk(&state)
        .into_iter()
        .filter(|p| p.extension().is_some_and(|e| e == "json"))
        .collect();
    assert!(
        !pin_files.is_empty(),
        "no pin file under {}",
        state.display()
    );
}

#[test]
fn a_state_directory_of_another_user_is_refused() {
    if !is_root() {
        eprintln!("skipped: needs root to give a directory to another user");
        return;
    }
    let ws = Workspace::new();
    let state = ws.path().join("state");
    std::fs::create_dir(&state).unwrap();
    std::os::unix::fs::chown(&state, Some(65534), Some(65534)).unwrap();
    let out = mcpbox_env(
        &["exec", "--", "true"],
        &[("MCPBOX_STATE_DIR", state.to_str().unwrap())],
    );
    assert_eq!(out.status.code(), Some(125), "{}", text(&out));
    let said = text(&out);
    assert!(
        said.contains("belongs to uid 65534") && said.contains("chown"),
        "{said}"
    );
    // nothing was written into it
    assert_eq!(std::fs::read_dir(&state).unwrap().count(), 0);
}

/// Every entry under `dir` (not following symlinks).
fn walk(dir: &Path) -> Vec<PathBuf> {
    let mut out = Vec::new();
    let mut todo = vec![dir.to_path_buf()];
    while let Some(d) = todo.pop() {
        let Ok(entries) = std::fs::read_dir(&d) else {
            continue;
        };
        for e in entries.flatten() {
            let p = e.path();
            if e.file_type().is_ok_and(|t| t.is_dir()) {
                todo.push(p.clone());
            }
            out.push(p);
        }
    }
    out
}

/// Entries of the state directory (itself included) that a group or
/// other user may use, outside the sandboxes' own folders (a workspace's
/// input, output and tmp, a runner's cache) whose 0700 parents fence them.
fn loose_entries(state: &Path) -> Vec<String> {
    let mut all = vec![state.to_path_buf()];
    all.extend(walk(state));
    all.into_iter()
        .filter(|p| {
            let rel = p.strip_prefix(state).unwrap();
            let parts: Vec<_> = rel.iter().collect();
            let sandbox_owned = (parts.first().is_some_and(|f| *f == "sandboxes")
                && parts.len() > 2)
                || (parts.first().is_some_and(|f| *f == "cache") && parts.len() > 3);
            !sandbox_owned
                && !std::fs::symlink_metadata(p)
                    .unwrap()
                    .file_type()
                    .is_symlink()
                && mode(p) & 0o077 != 0
        })
        .map(|p| format!("{} {:o}", p.display(), mode(&p)))
        .collect()
}

/// The unprivileged user the local-user test reads as.
const PEEK: &str = "mcpbox-peek";

/// Creates [`PEEK`] (tolerating that it exists); false where that cannot
/// be done here (not root).
fn peek_user() -> bool {
    if !is_root() {
        return false;
    }
    let out = Command::new("useradd")
        .args([
            "--system",
            "--no-create-home",
            "--shell",
            "/usr/sbin/nologin",
            PEEK,
        ])
        .output()
        .expect("useradd");
    // 9: the user exists already
    assert!(
        out.status.success() || out.status.code() == Some(9),
        "useradd: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    true
}

/// `runuser -u mcpbox-peek -- ARGS`: its output and whether it worked.
fn as_peek(args: &[&str]) -> (bool, String) {
    let out = Command::new("runuser")
        .args(["-u", PEEK, "--"])
        .args(args)
        .stdin(Stdio::null())
        .output()
        .expect("runuser");
    (
        out.status.success(),
        String::from_utf8_lossy(&out.stdout).into_owned(),
    )
}

#[test]
fn another_local_user_reads_nothing_under_the_state_directory() {
    // as root (CI's first pass) it always runs: `peek_user` fails the
    // test when the user cannot be made
    if !peek_user() {
        eprintln!("skipped: needs root to create the user {PEEK}");
        return;
    }
    // a state directory where another user could walk to it: the
    // workspace is 0755 under /tmp
    let ws = Workspace::with_server("echo_secrets");
    let (dir, config) = serve_dir();
    let state = dir.path().join("state");
    let policy = ws.policy(
        "[secrets]\nAPI_TOKEN = { from_env = \"MCPBOX_TEST_TOKEN\" }\n\
         [env]\nset = { ECHO_SECRETS_DESCRIBE = \"API_TOKEN\" }\n",
    );
    // `run`: pins, the audit log and its key
    let mut s = Session::start(
        &policy,
        &["/workspace/input/echo_secrets"],
        &[
            ("MCPBOX_STATE_DIR", state.to_str().unwrap()),
            ("MCPBOX_TEST_TOKEN", SECRET),
        ],
    );
    s.initialize();
    s.tool_names();
    let (status, err) = s.finish();
    assert!(status.success(), "{err}");
    // `serve` on the same state directory: the sandbox registry, a
    // workspace and the control socket
    let gw = common::serve::Gateway::start_config(dir, &config);
    let mut mcp = gw.mcp("echo", Some(common::serve::ALICE));
    mcp.initialize();
    mcp.request("tools/list", json!({}));
    assert!(state.join("sandboxes.db").exists(), "{}", gw.stderr());
    let mut entries = vec![state.clone()];
    entries.extend(walk(&state));
    assert!(entries.len() > 5, "{entries:?}");
    for p in &entries {
        let p = p.to_str().unwrap();
        let (listed, out) = as_peek(&["ls", "-a", p]);
        assert!(!listed && out.is_empty(), "{PEEK} listed {p}: {out}");
        let (read, out) = as_peek(&["cat", p]);
        assert!(!read && out.is_empty(), "{PEEK} read {p}: {out}");
    }
    let (found, out) = as_peek(&["find", state.to_str().unwrap()]);
    assert!(
        !found && out.lines().count() <= 1,
        "{PEEK} walked the state directory: {out}"
    );
    drop(gw);
}

/// A folder for `mcpbox serve` with one `echo_secrets` server (its state
/// directory will be `state/` in it), and the config.
fn serve_dir() -> (tempfile::TempDir, String) {
    let dir = tempfile::Builder::new()
        .prefix("mcpbox-serve-")
        .tempdir()
        .unwrap();
    std::fs::set_permissions(dir.path(), std::fs::Permissions::from_mode(0o755)).unwrap();
    let bin = dir.path().join("bin");
    std::fs::create_dir(&bin).unwrap();
    std::fs::set_permissions(&bin, std::fs::Permissions::from_mode(0o755)).unwrap();
    let exe = bin.join("echo_secrets");
    std::fs::copy(common::mcp::testserver("echo_secrets"), &exe).unwrap();
    let policy = dir.path().join("echo.toml");
    std::fs::write(
        &policy,
        format!(
            "[server]\nname = \"echo\"\n{}",
            common::peers::mount_same_path(&bin)
        ),
    )
    .unwrap();
    let config = format!(
        "[listen]\naddress = \"127.0.0.1:0\"\n\
         [[clients]]\nname = \"alice\"\ntoken = {{ from_env = \"T_ALICE\" }}\n\
         [[servers]]\nname = \"echo\"\npolicy = \"{}\"\ncommand = [\"{}\"]\n",
        policy.display(),
        exe.display()
    );
    (dir, config)
}

// ---------------------------------------------------------------------
// Nothing of a secret at rest or in any API
// ---------------------------------------------------------------------

/// `data` in base64, by the base64 crate: a reference independent of the
/// redactor's own encoder, which this sweep checks.
fn b64(data: &[u8], url: bool, pad: bool) -> String {
    use base64::engine::general_purpose::{STANDARD, STANDARD_NO_PAD, URL_SAFE, URL_SAFE_NO_PAD};
    use base64::Engine;
    match (url, pad) {
        (false, true) => STANDARD.encode(data),
        (false, false) => STANDARD_NO_PAD.encode(data),
        (true, true) => URL_SAFE.encode(data),
        (true, false) => URL_SAFE_NO_PAD.encode(data),
    }
}

fn url_encoded(data: &[u8], upper: bool) -> String {
    data.iter()
        .map(|&b| {
            if b.is_ascii_alphanumeric() || b"-_.~".contains(&b) {
                (b as char).to_string()
            } else if upper {
                format!("%{b:02X}")
            } else {
                format!("%{b:02x}")
            }
        })
        .collect()
}

/// The secret in every encoding the redactor matches
/// (crates/gateway/src/redact.rs): the value, hex in both cases,
/// URL-encoding in both cases and with `+` for space, base64 in both
/// alphabets with and without padding, and the characters of base64 that
/// depend only on the value at each of the three stream alignments.
fn encodings(secret: &str) -> Vec<(String, String)> {
    let v = secret.as_bytes();
    let hex = mcpbox_policy::hex::encode(v);
    let mut out = vec![
        ("plain".to_string(), secret.to_string()),
        ("hex".into(), hex.clone()),
        ("HEX".into(), hex.to_uppercase()),
        ("url".into(), url_encoded(v, true)),
        ("url-lower".into(), url_encoded(v, false)),
        ("form".into(), url_encoded(v, true).replace("%20", "+")),
    ];
    for (name, url) in [("base64", false), ("base64url", true)] {
        out.push((format!("{name} padded"), b64(v, url, true)));
        out.push((name.to_string(), b64(v, url, false)));
        for shift in 0..3usize {
            let mut buf = vec![0u8; shift];
            buf.extend_from_slice(v);
            let enc = b64(&buf, url, false);
            let first = (8 * shift).div_ceil(6);
            let last = (8 * (shift + v.len())) / 6;
            out.push((format!("{name} at {shift}"), enc[first..last].to_string()));
        }
    }
    out
}

/// Where (file or route, encoding) the secret appears in `bytes`.
fn hits(place: &str, bytes: &[u8], forms: &[(String, String)]) -> Vec<String> {
    forms
        .iter()
        .filter(|(_, f)| bytes.windows(f.len()).any(|w| w == f.as_bytes()))
        .map(|(name, _)| format!("{place}: {name}"))
        .collect()
}

/// Every file under `dir`, byte for byte (SQLite files and their
/// write-ahead logs included).
fn sweep_dir(dir: &Path, forms: &[(String, String)]) -> Vec<String> {
    let mut found = Vec::new();
    for p in walk(dir) {
        let meta = std::fs::symlink_metadata(&p).unwrap();
        if meta.is_file() {
            let bytes = std::fs::read(&p).unwrap();
            found.extend(hits(&p.display().to_string(), &bytes, forms));
        }
    }
    found
}

fn console_get(port: u16, token: &str, path: &str) -> (u16, String) {
    let mut s = TcpStream::connect(("127.0.0.1", port)).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(30))).unwrap();
    let req = format!(
        "GET {path} HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\nAuthorization: Bearer {token}\r\n\
         Connection: close\r\n\r\n"
    );
    s.write_all(req.as_bytes()).unwrap();
    let mut out = Vec::new();
    let _ = s.read_to_end(&mut out);
    let text = String::from_utf8_lossy(&out).into_owned();
    let status = text
        .split(' ')
        .nth(1)
        .and_then(|c| c.parse().ok())
        .unwrap_or(0);
    (status, text)
}

/// The console's URL, from the one line it prints on stderr.
fn console_url(session: &Session) -> String {
    let until = Instant::now() + Duration::from_secs(20);
    loop {
        let err = session.stderr();
        if let Some(line) = err.lines().find(|l| l.starts_with("mcpbox: console at ")) {
            return line["mcpbox: console at ".len()..].trim().to_string();
        }
        assert!(Instant::now() < until, "no console line on stderr: {err}");
        std::thread::sleep(Duration::from_millis(50));
    }
}

#[test]
fn a_secret_a_server_puts_in_its_tool_definitions_is_stored_and_served_only_redacted() {
    let ws = Workspace::with_server("echo_secrets");
    let state = ws.path().join("state");
    let run_dir = ws.path().join("run");
    std::fs::create_dir(&run_dir).unwrap();
    std::fs::set_permissions(&run_dir, std::fs::Permissions::from_mode(0o700)).unwrap();
    let forms = encodings(SECRET);
    // the server's definitions carry the secret it was given through the
    // policy's [secrets]; the audit log is the state directory's
    let body = "[secrets]\nAPI_TOKEN = { from_env = \"MCPBOX_TEST_TOKEN\" }\n\
                [env]\nset = { ECHO_SECRETS_DESCRIBE = \"API_TOKEN\", ECHO_SECRETS_VARIANT = \"@V@\" }\n";
    let policy = ws.policy(&body.replace("@V@", ""));
    let p = policy.to_str().unwrap().to_string();
    let env = [
        ("MCPBOX_STATE_DIR", state.to_str().unwrap()),
        ("XDG_RUNTIME_DIR", run_dir.to_str().unwrap()),
        ("MCPBOX_TEST_TOKEN", SECRET),
    ];
    let args: Vec<String> = [
        "run",
        "--console",
        "--policy",
        &p,
        "--",
        "/workspace/input/echo_secrets",
    ]
    .iter()
    .map(|s| s.to_string())
    .collect();
    let mut s = Session::start_mcpbox(&args, &env);
    let url = console_url(&s);
    let init = s.initialize();
    let list = s.request("tools/list", json!({}));
    // the host sees the redacted form (and the test server did describe
    // itself with the secret)
    assert!(
        list.to_string().contains("[REDACTED:API_TOKEN]"),
        "the server did not put the secret in its tools: {list}"
    );
    let mut found = hits("tools/list", list.to_string().as_bytes(), &forms);
    found.extend(hits("initialize", init.to_string().as_bytes(), &forms));
    s.call("leak", json!({"var": "API_TOKEN"}));
    let port: u16 = url
        .strip_prefix("http://127.0.0.1:")
        .unwrap()
        .split('/')
        .next()
        .unwrap()
        .parse()
        .unwrap();
    let token = url.split("#token=").nth(1).unwrap().to_string();
    // every route of the console's API that reads
    for route in [
        "/api/info",
        "/api/approvals",
        "/api/sandboxes",
        "/api/pins",
        "/api/audit",
        "/api/audit?limit=500",
        "/api/audit?db=0",
        "/api/audit/verify",
    ] {
        let (status, reply) = console_get(port, &token, route);
        assert!(status != 0 && status != 401, "{route}: {reply}");
        found.extend(hits(route, reply.as_bytes(), &forms));
    }
    let (_, pins) = console_get(port, &token, "/api/pins");
    let (status, err) = s.finish();
    assert!(status.success(), "{err}");
    found.extend(hits("mcpbox's stderr", err.as_bytes(), &forms));

    // a rug pull: the changed definition is withheld and kept as pending
    ws.policy(&body.replace("@V@", " (v2)"));
    let mut s = Session::start(&policy, &["/workspace/input/echo_secrets"], &env);
    s.initialize();
    s.tool_names();
    let (status, err) = s.finish();
    assert!(status.success(), "{err}");
    let pending: Vec<PathBuf> = walk(&state)
        .into_iter()
        .filter(|f| f.to_string_lossy().ends_with(".pending"))
        .collect();
    assert!(
        !pending.is_empty(),
        "no pending change under {}",
        state.display()
    );

    // the CLI's views of the pins and the audit log
    for args in [
        vec!["pin", "list", "--policy", &p],
        vec!["pin", "diff", "--policy", &p],
        vec!["audit", "--policy", &p],
        vec!["audit", "--policy", &p, "--json"],
        vec!["audit", "--policy", &p, "--ocsf"],
        vec!["audit", "--policy", &p, "--verify"],
    ] {
        let out = mcpbox_env(&args, &env);
        assert!(out.status.success(), "{args:?}: {}", text(&out));
        found.extend(hits(
            &format!("mcpbox {}", args.join(" ")),
            text(&out).as_bytes(),
            &forms,
        ));
    }
    let diff = text(&mcpbox_env(&["pin", "diff", "--policy", &p], &env));

    // every byte of every file the state directory holds
    found.extend(sweep_dir(&state, &forms));
    assert!(found.is_empty(), "the secret is in clear: {found:#?}");
    // and the pinned and proposed definitions are there to see, redacted
    assert!(diff.contains("[REDACTED:API_TOKEN]"), "{diff}");
    assert!(
        pins.contains("[REDACTED:API_TOKEN]"),
        "no pinned definition shown: {pins}"
    );
    // the sweep can find: the same secret written in clear is found in
    // each encoding
    let probe = ws.path().join("probe-dir");
    std::fs::create_dir(&probe).unwrap();
    for (name, form) in &forms {
        std::fs::write(probe.join(name.replace(' ', "_")), form).unwrap();
    }
    assert!(sweep_dir(&probe, &forms).len() >= forms.len());
}
