//! `mcpbox serve` through the real binary: a gateway per test in a
//! tempdir of its own (config, policies, the test servers, the state
//! directory with the audit log and workspaces), on a port the kernel
//! picks, and an MCP client over [`super::http`].
#![allow(dead_code, clippy::unwrap_used, clippy::expect_used)]

use std::io::{BufRead, BufReader};
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Stdio};
use std::sync::mpsc;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use serde_json::{json, Value};

use super::http::{self, Conn, Response};

/// The clients every test gateway has: alice and bob may use every
/// server, carol none but `other` (present only when a test adds it).
pub const ALICE: &str = "alice-token-3f9a5e";
pub const BOB: &str = "bob-token-77c1d0";
pub const CAROL: &str = "carol-token-0d2e4b";
const CLIENTS: &str = r#"
[[clients]]
name = "alice"
token = { from_env = "T_ALICE" }
[[clients]]
name = "bob"
token = { from_env = "T_BOB" }
[[clients]]
name = "carol"
token = { from_env = "T_CAROL" }
servers = ["other"]
"#;

/// The protocol revision the tests speak.
pub const VERSION: &str = "2025-11-25";

/// One `[[servers]]` entry: its name, the crates/testservers binary (or
/// an absolute command) it runs, and TOML added to its policy.
pub struct Server<'a> {
    pub name: &'a str,
    pub command: Vec<String>,
    pub policy: &'a str,
}

impl<'a> Server<'a> {
    /// A test server from crates/testservers.
    pub fn test(name: &'a str, bin: &str, policy: &'a str) -> Server<'a> {
        Server {
            name,
            command: vec![format!("@{bin}")],
            policy,
        }
    }
}

/// A running gateway; killed when dropped.
pub struct Gateway {
    child: Child,
    pub port: u16,
    pub dir: tempfile::TempDir,
    stderr: Arc<Mutex<String>>,
}

impl Gateway {
    /// A gateway with the standard clients, `[limits]` set to `limits`
    /// (TOML lines), and `servers`.
    pub fn start(limits: &str, servers: &[Server]) -> Gateway {
        Gateway::start_env(limits, servers, &[])
    }

    /// [`Gateway::start`] with `env` added to the gateway's environment
    /// (for the policies' `[secrets]`).
    pub fn start_env(limits: &str, servers: &[Server], env: &[(&str, &str)]) -> Gateway {
        let dir = tempfile::Builder::new()
            .prefix("mcpbox-serve-")
            .tempdir()
            .expect("tempdir");
        std::fs::set_permissions(dir.path(), std::fs::Permissions::from_mode(0o755)).unwrap();
        // for a policy's `filesystem.output = "output"` (each session gets a
        // workspace of its own instead)
        std::fs::create_dir(dir.path().join("output")).unwrap();
        if super::is_root() {
            std::os::unix::fs::chown(dir.path().join("output"), Some(65534), Some(65534)).unwrap();
        }
        let bin = dir.path().join("bin");
        std::fs::create_dir(&bin).unwrap();
        std::fs::set_permissions(&bin, std::fs::Permissions::from_mode(0o755)).unwrap();
        let mut config =
            format!("[listen]\naddress = \"127.0.0.1:0\"\n[limits]\n{limits}\n{CLIENTS}\n");
        let other = Server::test("other", "plain", "");
        let all = servers
            .iter()
            .chain((!servers.iter().any(|s| s.name == "other")).then_some(&other));
        for s in all {
            let mut command = s.command.clone();
            let mut mounts = Vec::new();
            if let Some(name) = command[0].strip_prefix('@').map(str::to_string) {
                // a copy in the test's own directory: readable by the
                // sandbox user even in the rootless run
                let to = bin.join(&name);
                if !to.exists() {
                    std::fs::copy(super::mcp::testserver(&name), &to).unwrap();
                }
                command[0] = to.display().to_string();
                mounts.push(bin.clone());
            }
            let mounts: String = mounts
                .iter()
                .map(|m| super::peers::mount_same_path(m))
                .collect();
            let policy = dir.path().join(format!("{}.toml", s.name));
            std::fs::write(
                &policy,
                format!("[server]\nname = \"{}\"\n{}\n{mounts}\n", s.name, s.policy),
            )
            .unwrap();
            config.push_str(&format!(
                "[[servers]]\nname = \"{}\"\npolicy = \"{}\"\ncommand = {}\n",
                s.name,
                policy.display(),
                serde_json::to_string(&command).unwrap()
            ));
        }
        Gateway::start_config_env(dir, &config, env)
    }

    /// A gateway on `config` (written to `dir/serve.toml`).
    pub fn start_config(dir: tempfile::TempDir, config: &str) -> Gateway {
        Gateway::start_config_env(dir, config, &[])
    }

    /// A gateway on `config` with `env` added to its environment.
    pub fn start_config_env(dir: tempfile::TempDir, config: &str, env: &[(&str, &str)]) -> Gateway {
        let path = dir.path().join("serve.toml");
        std::fs::write(&path, config).unwrap();
        let mut child = Command::new(super::mcpbox())
            .envs(env.iter().copied())
            .arg("serve")
            .arg("--config")
            .arg(&path)
            .env("MCPBOX_STATE_DIR", dir.path().join("state"))
            .env("T_ALICE", ALICE)
            .env("T_BOB", BOB)
            .env("T_CAROL", CAROL)
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .expect("spawn mcpbox serve");
        let stderr = Arc::new(Mutex::new(String::new()));
        let (tx, rx) = mpsc::channel();
        let sink = stderr.clone();
        let pipe = child.stderr.take().unwrap();
        std::thread::spawn(move || {
            for line in BufReader::new(pipe).lines() {
                let Ok(line) = line else { break };
                if let Some(addr) = line.strip_prefix("mcpbox: serving on http://") {
                    let _ = tx.send(addr.rsplit(':').next().unwrap_or("").parse::<u16>());
                }
                let mut s = sink.lock().unwrap();
                s.push_str(&line);
                s.push('\n');
            }
        });
        let port = match rx.recv_timeout(Duration::from_secs(30)) {
            Ok(Ok(p)) => p,
            _ => {
                let _ = child.kill();
                let _ = child.wait();
                std::thread::sleep(Duration::from_millis(100));
                panic!(
                    "mcpbox serve did not start; stderr:\n{}",
                    stderr.lock().unwrap()
                );
            }
        };
        Gateway {
            child,
            port,
            dir,
            stderr,
        }
    }

    /// A gateway on `files` (name, text) written into a fresh directory;
    /// `serve.toml` must be among them. The standard clients' tokens are in
    /// the environment (`T_ALICE`, `T_BOB`, `T_CAROL`) for configs that
    /// name them.
    pub fn start_files(files: &[(&str, String)]) -> Gateway {
        let dir = tempfile::Builder::new()
            .prefix("mcpbox-serve-")
            .tempdir()
            .expect("tempdir");
        let mut config = String::new();
        for (name, text) in files {
            if *name == "serve.toml" {
                config = text.clone();
            } else {
                std::fs::write(dir.path().join(name), text).unwrap();
            }
        }
        Gateway::start_config(dir, &config)
    }

    pub fn state(&self) -> PathBuf {
        self.dir.path().join("state")
    }

    /// Runs `mcpbox ARGS` against this gateway's state directory (its
    /// control socket).
    pub fn cli(&self, args: &[&str]) -> std::process::Output {
        Command::new(super::mcpbox())
            .args(args)
            .env("MCPBOX_STATE_DIR", self.state())
            .stdin(Stdio::null())
            .output()
            .expect("run mcpbox")
    }

    /// `mcpbox ARGS --json`, which must succeed: its JSON.
    pub fn cli_json(&self, args: &[&str]) -> Value {
        let mut a = args.to_vec();
        a.push("--json");
        let out = self.cli(&a);
        assert!(
            out.status.success(),
            "mcpbox {a:?}: {}\n{}\ngateway log:\n{}",
            out.status,
            String::from_utf8_lossy(&out.stderr),
            self.stderr()
        );
        serde_json::from_slice(&out.stdout).unwrap_or_else(|e| {
            panic!(
                "mcpbox {a:?}: not JSON ({e}): {}",
                String::from_utf8_lossy(&out.stdout)
            )
        })
    }

    /// Kills the gateway with SIGKILL (no clean-up of its own runs) and
    /// hands back its directory, for a gateway started again on it.
    /// Kills the gateway (SIGKILL: nothing of it runs to clean up) and
    /// gives its directory back, for a restart on the same state. A test
    /// that does not restart ends with [`unmount_volumes`] on it: the
    /// workspace volumes a killed `serve` leaves mounted are for its next
    /// start to reuse.
    pub fn kill9(mut self) -> tempfile::TempDir {
        let _ = self.child.kill();
        let _ = self.child.wait();
        std::mem::replace(&mut self.dir, tempfile::tempdir().unwrap())
    }

    /// Runs the Python SDK client script `script` (of `tests/interop`) with
    /// `args` and checks it passed every check (its last line is `done`).
    pub fn python_client(&self, script: &str, args: &[&str]) {
        let out = Command::new(super::peers::peer("venv/bin/python"))
            .arg(super::interop_script(script))
            .args(args)
            .output()
            .expect("run the python client");
        let stdout = String::from_utf8_lossy(&out.stdout);
        assert!(
            out.status.success() && stdout.trim_end().ends_with("done"),
            "{script} {args:?} failed:\n{stdout}\nstderr:\n{}\ngateway log:\n{}",
            String::from_utf8_lossy(&out.stderr),
            self.stderr()
        );
    }

    /// `http://127.0.0.1:PORT` + `path`.
    pub fn url(&self, path: &str) -> String {
        format!("http://127.0.0.1:{}{path}", self.port)
    }

    /// `Host` as a client on the loopback names it.
    pub fn host(&self) -> String {
        format!("127.0.0.1:{}", self.port)
    }

    /// An MCP client for `server` with `token` (or none).
    pub fn mcp(&self, server: &str, token: Option<&str>) -> Mcp {
        Mcp {
            port: self.port,
            path: format!("/servers/{server}/mcp"),
            token: token.map(str::to_string),
            session: None,
            next_id: 1,
        }
    }

    pub fn stderr(&self) -> String {
        self.stderr.lock().unwrap().clone()
    }

    /// Whether the process is still running.
    pub fn alive(&mut self) -> bool {
        self.child.try_wait().unwrap().is_none()
    }

    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    /// Sends SIGTERM.
    pub fn sigterm(&self) {
        let ok = Command::new("kill")
            .args(["-TERM", &self.child.id().to_string()])
            .status()
            .unwrap()
            .success();
        assert!(ok, "kill -TERM failed");
    }

    /// Waits (up to `d`) for the process to exit.
    pub fn wait(&mut self, d: Duration) -> ExitStatus {
        let until = Instant::now() + d;
        loop {
            if let Some(s) = self.child.try_wait().unwrap() {
                return s;
            }
            assert!(
                Instant::now() < until,
                "mcpbox serve still running after {d:?}; stderr:\n{}",
                self.stderr()
            );
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    /// Every audit record so far.
    pub fn audit(&self) -> Vec<Value> {
        super::audit::events(&self.state().join("audit.db"))
    }

    /// The audit records, once one matches `want` (records are written by
    /// a background thread; 10 s at most).
    pub fn audit_until(&self, what: &str, want: impl Fn(&Value) -> bool) -> Vec<Value> {
        let until = Instant::now() + Duration::from_secs(10);
        loop {
            let events = self.audit();
            if events.iter().any(&want) {
                return events;
            }
            assert!(
                Instant::now() < until,
                "no audit record {what}; have:\n{}",
                events
                    .iter()
                    .map(Value::to_string)
                    .collect::<Vec<_>>()
                    .join("\n")
            );
            std::thread::sleep(Duration::from_millis(100));
        }
    }
}

impl Drop for Gateway {
    /// Stops the gateway as a user would (SIGTERM: its sandboxes' cgroups
    /// are removed on the way out), and kills it if it has not ended in 10 s.
    fn drop(&mut self) {
        if let Ok(None) = self.child.try_wait() {
            let _ = Command::new("kill")
                .args(["-TERM", &self.child.id().to_string()])
                .status();
            let until = Instant::now() + Duration::from_secs(10);
            while Instant::now() < until {
                if let Ok(Some(_)) = self.child.try_wait() {
                    return;
                }
                std::thread::sleep(Duration::from_millis(20));
            }
        }
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Unmounts the workspace volumes (docs/serve.md, "Disk budget") a killed
/// gateway left mounted under `dir`, so that removing `dir` removes them.
pub fn unmount_volumes(dir: &Path) {
    let mounts = std::fs::read_to_string("/proc/self/mountinfo").unwrap_or_default();
    for m in mounts.lines().filter_map(|l| l.split(' ').nth(4)) {
        if Path::new(m).starts_with(dir) {
            let _ = Command::new("umount").arg(m).status();
        }
    }
}

/// An MCP client over Streamable HTTP, one connection per request.
pub struct Mcp {
    pub port: u16,
    pub path: String,
    pub token: Option<String>,
    pub session: Option<String>,
    pub next_id: u64,
}

impl Mcp {
    /// The headers a well-behaved client sends with a POST.
    pub fn headers(&self) -> Vec<(String, String)> {
        let mut h = vec![
            ("Host".to_string(), format!("127.0.0.1:{}", self.port)),
            ("Content-Type".into(), "application/json".into()),
            (
                "Accept".into(),
                "application/json, text/event-stream".into(),
            ),
        ];
        if let Some(t) = &self.token {
            h.push(("Authorization".into(), format!("Bearer {t}")));
        }
        if let Some(s) = &self.session {
            h.push(("Mcp-Session-Id".into(), s.clone()));
            h.push(("MCP-Protocol-Version".into(), VERSION.into()));
        }
        h
    }

    /// Sends `method` with the standard headers changed by `edit`.
    pub fn send_with(
        &self,
        method: &str,
        body: &[u8],
        edit: impl FnOnce(&mut Vec<(String, String)>),
    ) -> Response {
        let mut h = self.headers();
        edit(&mut h);
        let h: Vec<(&str, &str)> = h.iter().map(|(k, v)| (k.as_str(), v.as_str())).collect();
        http::send(self.port, method, &self.path, &h, body)
    }

    /// The request bytes a POST of `body` with the standard headers
    /// changed by `edit` would send.
    pub fn bytes_with(
        &self,
        body: &[u8],
        edit: impl FnOnce(&mut Vec<(String, String)>),
    ) -> Vec<u8> {
        let mut h = self.headers();
        edit(&mut h);
        let h: Vec<(&str, &str)> = h.iter().map(|(k, v)| (k.as_str(), v.as_str())).collect();
        http::request_bytes("POST", &self.path, &h, body)
    }

    pub fn post(&self, msg: &Value) -> Response {
        self.send_with("POST", msg.to_string().as_bytes(), |_| {})
    }

    /// A request message with a fresh id.
    pub fn message(&mut self, method: &str, params: Value) -> Value {
        let id = self.next_id;
        self.next_id += 1;
        json!({"jsonrpc": "2.0", "id": id, "method": method, "params": params})
    }

    /// `initialize` and `notifications/initialized`: the session is open.
    pub fn initialize(&mut self) -> Value {
        self.session = None;
        let msg = self.message(
            "initialize",
            json!({"protocolVersion": VERSION, "capabilities": {"roots": {}},
                   "clientInfo": {"name": "mcpbox-serve-test", "version": "0"}}),
        );
        let r = self.post(&msg);
        assert_eq!(r.status, 200, "initialize: {} {}", r.status, r.text());
        self.session = Some(
            r.header("mcp-session-id")
                .unwrap_or_else(|| panic!("no session id: {r:?}"))
                .to_string(),
        );
        let n = self.post(&json!({"jsonrpc": "2.0", "method": "notifications/initialized"}));
        assert_eq!(n.status, 202, "initialized: {}", n.text());
        r.json()
    }

    /// A request's answer; panics unless the status is 200.
    pub fn request(&mut self, method: &str, params: Value) -> Value {
        let msg = self.message(method, params);
        let r = self.post(&msg);
        assert_eq!(r.status, 200, "{method}: {} {}", r.status, r.text());
        let answer = r.json();
        assert_eq!(answer["id"], msg["id"], "{answer}");
        answer
    }

    pub fn call(&mut self, tool: &str, args: Value) -> Value {
        self.request("tools/call", json!({"name": tool, "arguments": args}))
    }

    /// Opens the session's GET stream and reads its head.
    pub fn open_stream(&self) -> (Conn, Response) {
        let mut c = Conn::open(self.port);
        let mut h = self.headers();
        h.retain(|(k, _)| k != "Content-Type");
        h.iter_mut()
            .filter(|(k, _)| k == "Accept")
            .for_each(|(_, v)| *v = "text/event-stream".into());
        h.push(("Connection".into(), "keep-alive".into()));
        let h: Vec<(&str, &str)> = h.iter().map(|(k, v)| (k.as_str(), v.as_str())).collect();
        c.write(&http::request_bytes("GET", &self.path, &h, b""))
            .unwrap();
        let head = c.head().expect("the stream's head");
        (c, head)
    }
}

/// The text of a tool result's content items, joined.
pub fn text_of(answer: &Value) -> String {
    super::mcp::result_text(answer)
}

/// A path's files, recursively (for workspace checks).
pub fn files_under(dir: &Path) -> Vec<PathBuf> {
    let mut out = Vec::new();
    let Ok(rd) = std::fs::read_dir(dir) else {
        return out;
    };
    for e in rd.flatten() {
        let p = e.path();
        if p.is_dir() {
            out.extend(files_under(&p));
        } else {
            out.push(p);
        }
    }
    out
}

/// A policy that shows `binary` inside the sandbox at its host path, with
/// `tools` (TOML lines) under `[tools]`, whose default is allow.
pub fn binary_policy(name: &str, binary: &Path, tools: &str) -> String {
    format!(
        "[server]\nname = \"{name}\"\n{}\n[tools]\ndefault = \"allow\"\n{tools}\n",
        super::peers::mount_same_path(binary)
    )
}
