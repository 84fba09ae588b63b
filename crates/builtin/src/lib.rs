//! mcpbox's built-in sandbox server: an MCP server over stdio that runs
//! *inside* a sandbox (the `mcpbox` binary, bound read-only into it, run
//! as `mcpbox __builtin-sandbox CONFIG`), and gives an agent a place to run
//! commands and code, keep files, run background jobs and checkpoint its
//! workspace.
//!
//! It is not the boundary. The sandbox is (mounts, namespaces, Landlock,
//! seccomp, cgroups), and the relay in front of it applies the policy
//! (`[tools]`, `[commands]` over `exec`'s command line, paths outside
//! /workspace, approvals), redaction and the audit, as for any server.
//! What this server enforces itself (the job limits, RESOLVE_BENEATH on
//! file paths) is a second line and a courtesy to the agent: clear errors
//! instead of a sandbox limit's blunt kill. The agent's own code runs
//! beside it as the same user; the server makes itself non-dumpable
//! (prctl(2) PR_SET_DUMPABLE) so that code cannot read or write its memory
//! through /proc, and what the agent can do by killing it is end its own
//! session.
//!
//! One thread, one poll(2) loop over stdin, the pipes of the processes it
//! started and their pidfds: requests are answered as their work ends, so a
//! long `exec` does not hold up a `job_status`.

#![forbid(unsafe_code)]

mod files;
mod procs;
mod snap;
mod tools;

use std::io::{Read, Write};
use std::os::fd::AsFd;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

use mcpbox_policy::Reason;
use rustix::event::{PollFd, PollFlags, Timespec};
use serde::{Deserialize, Serialize};
use serde_json::{json, Map, Value};

pub use files::Refusal;
pub use snap::STATE_DIR;
pub use tools::PATH_TOOLS;

use files::Root;
use procs::{Bounds, End, Proc, Purpose};
use snap::Checkpoints;

/// The argument mcpbox runs itself with to become this server.
pub const ARG: &str = "__builtin-sandbox";
/// The `_meta` key of a call to `export_artifact` by which the gateway says
/// how many bytes it allows; defined beside the call decision that sets it.
pub use mcpbox_policy::call::META_MAX_BYTES;
/// The server's name in `initialize`.
pub const SERVER_NAME: &str = "mcpbox-sandbox";

/// The limits, from the policy's `[jobs]` and `[artifacts]`, passed as JSON
/// on the command line.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Config {
    pub max_running: u32,
    pub max_time_ms: u64,
    pub max_memory: u64,
    pub exec_timeout_ms: u64,
    pub max_output: u64,
    pub job_output: u64,
    pub artifact_max_size: u64,
    /// The workspace ("/workspace" in the sandbox).
    #[serde(default = "default_root")]
    pub root: String,
}

fn default_root() -> String {
    "/workspace".into()
}

/// The protocol versions this server speaks, newest first: the ones with
/// an `initialize` handshake.
const VERSIONS: &[&str] = &mcpbox_policy::mcp::SESSION_REVISIONS;
/// The longest request line read from stdin (a `write_file` of a large file).
const MAX_LINE: usize = 64 << 20;
/// How often memory is sampled while a job has a limit.
const SAMPLE: Duration = Duration::from_millis(100);
/// Finished jobs kept for job_status and job_output.
const KEEP_FINISHED: usize = 64;

/// Runs the server on stdin/stdout until stdin closes; returns the exit code.
pub fn main(config_json: &str) -> i32 {
    let config: Config = match serde_json::from_str(config_json) {
        Ok(c) => c,
        Err(e) => {
            eprintln!("mcpbox-sandbox: bad config: {e}");
            return 2;
        }
    };
    // Not dumpable: the agent's processes (same uid, our descendants)
    // cannot open /proc/<us>/mem or ptrace us (ptrace(2), "ptrace access
    // mode checking": a non-dumpable target needs CAP_SYS_PTRACE).
    if let Err(e) =
        rustix::process::set_dumpable_behavior(rustix::process::DumpableBehavior::NotDumpable)
    {
        eprintln!("mcpbox-sandbox: cannot make itself non-dumpable: {e}");
        return 2;
    }
    let mut server = match Server::new(config) {
        Ok(s) => s,
        Err(e) => {
            eprintln!("mcpbox-sandbox: {e}");
            return 2;
        }
    };
    server.run();
    0
}

struct Server {
    config: Config,
    root: Root,
    checkpoints: Checkpoints,
    procs: Vec<Proc>,
    next_job: u64,
    out: std::io::Stdout,
    last_sample: Instant,
}

impl Server {
    fn new(config: Config) -> std::io::Result<Server> {
        let root = Root::open(&config.root)?;
        let checkpoints = Checkpoints::new(Path::new(&config.root));
        if let Err(e) = checkpoints.ensure_origin() {
            // reset will say so; the rest works
            eprintln!(
                "mcpbox-sandbox: no origin snapshot for reset: {}",
                e.message
            );
        }
        let next_job = 1;
        Ok(Server {
            config,
            root,
            checkpoints,
            procs: Vec::new(),
            next_job,
            out: std::io::stdout(),
            last_sample: Instant::now(),
        })
    }

    fn run(&mut self) {
        let stdin = std::io::stdin();
        let mut stdin_open = true;
        let mut buf: Vec<u8> = Vec::new();
        let mut chunk = vec![0u8; 1 << 16];
        loop {
            if !stdin_open
                && !self
                    .procs
                    .iter()
                    .any(|p| p.end.is_none() && matches!(p.purpose, Purpose::Call { .. }))
            {
                break;
            }
            let timeout = self.next_wake().map(|d| Timespec {
                tv_sec: i64::try_from(d.as_secs()).unwrap_or(i64::MAX),
                tv_nsec: i64::from(d.subsec_nanos()),
            });
            let stdin_ready = {
                let stdin_fd = stdin.as_fd();
                let mut fds: Vec<PollFd<'_>> = Vec::new();
                if stdin_open {
                    fds.push(PollFd::new(&stdin_fd, PollFlags::IN));
                }
                for p in &self.procs {
                    for fd in p.fds() {
                        fds.push(PollFd::from_borrowed_fd(fd, PollFlags::IN));
                    }
                }
                match rustix::event::poll(&mut fds, timeout.as_ref()) {
                    Ok(_) | Err(rustix::io::Errno::INTR) => {}
                    Err(e) => {
                        eprintln!("mcpbox-sandbox: poll: {e}");
                        break;
                    }
                }
                stdin_open && !fds[0].revents().is_empty()
            };
            if stdin_ready {
                // read(2) on the descriptor itself: no buffer of std's
                // may hold bytes that poll(2) then no longer reports
                match rustix::io::read(stdin.as_fd(), &mut chunk) {
                    Ok(0) => stdin_open = false,
                    Ok(n) => buf.extend_from_slice(&chunk[..n]),
                    Err(rustix::io::Errno::INTR) | Err(rustix::io::Errno::AGAIN) => {}
                    Err(_) => stdin_open = false,
                }
                while let Some(i) = buf.iter().position(|&b| b == b'\n') {
                    let line: Vec<u8> = buf.drain(..=i).collect();
                    self.on_line(&line);
                }
                if buf.len() > MAX_LINE {
                    eprintln!("mcpbox-sandbox: request line over {MAX_LINE} bytes dropped");
                    buf.clear();
                }
            }
            self.turn();
        }
        // The session is over: what it started ends with it.
        for p in &mut self.procs {
            p.stop(End::Stopped);
        }
        let deadline = Instant::now() + Duration::from_secs(2);
        while self.procs.iter().any(|p| p.end.is_none()) && Instant::now() < deadline {
            std::thread::sleep(Duration::from_millis(10));
            let now = Instant::now();
            for p in &mut self.procs {
                p.turn(now, false);
            }
        }
    }

    /// How long poll may sleep.
    fn next_wake(&self) -> Option<Duration> {
        let now = Instant::now();
        let mut at: Option<Instant> = self.procs.iter().filter_map(Proc::wake_at).min();
        if self.procs.iter().any(Proc::samples_memory) {
            let s = self.last_sample + SAMPLE;
            at = Some(at.map_or(s, |a| a.min(s)));
        }
        at.map(|t| t.saturating_duration_since(now))
    }

    /// Reads pipes, reaps, applies limits, answers the calls that ended.
    fn turn(&mut self) {
        let now = Instant::now();
        let sample = now >= self.last_sample + SAMPLE;
        if sample {
            self.last_sample = now;
        }
        let mut answers = Vec::new();
        for p in &mut self.procs {
            if p.turn(now, sample) {
                if let Purpose::Call { id, cleanup } = &p.purpose {
                    answers.push((id.clone(), run_result(p)));
                    if let Some(f) = cleanup {
                        let _ = std::fs::remove_file(f);
                    }
                }
            }
        }
        self.procs
            .retain(|p| !(p.end.is_some() && matches!(p.purpose, Purpose::Call { .. })));
        // keep the newest finished jobs only
        let finished = self.procs.iter().filter(|p| p.end.is_some()).count();
        if finished > KEEP_FINISHED {
            let mut drop = finished - KEEP_FINISHED;
            self.procs.retain(|p| {
                if drop > 0 && p.end.is_some() {
                    drop -= 1;
                    false
                } else {
                    true
                }
            });
        }
        for (id, result) in answers {
            self.reply(&id, result);
        }
    }

    fn send(&mut self, v: &Value) {
        let mut line = serde_json::to_vec(v).unwrap_or_default();
        line.push(b'\n');
        let _ = self.out.write_all(&line);
        let _ = self.out.flush();
    }

    fn reply(&mut self, id: &Value, result: Value) {
        self.send(&json!({"jsonrpc": "2.0", "id": id, "result": result}));
    }

    fn error(&mut self, id: &Value, code: i64, message: &str) {
        self.send(
            &json!({"jsonrpc": "2.0", "id": id, "error": {"code": code, "message": message}}),
        );
    }

    fn on_line(&mut self, line: &[u8]) {
        let text = String::from_utf8_lossy(line);
        if text.trim().is_empty() {
            return;
        }
        let msg: Value = match serde_json::from_str(&text) {
            Ok(v) => v,
            Err(e) => {
                return self.send(&json!({"jsonrpc": "2.0", "id": null,
                    "error": {"code": mcpbox_policy::mcp::code::PARSE_ERROR, "message": format!("parse error: {e}")}}));
            }
        };
        let method = msg.get("method").and_then(Value::as_str).unwrap_or("");
        let params = msg.get("params").cloned().unwrap_or(Value::Null);
        let Some(id) = msg.get("id").cloned() else {
            if method == "notifications/cancelled" {
                if let Some(rid) = params.get("requestId") {
                    self.cancel(rid);
                }
            }
            return;
        };
        if method.is_empty() {
            return; // an answer: we ask nothing
        }
        match method {
            "initialize" => {
                let asked = params
                    .get("protocolVersion")
                    .and_then(Value::as_str)
                    .unwrap_or("");
                let version = VERSIONS
                    .iter()
                    .find(|v| **v == asked)
                    .copied()
                    .unwrap_or(VERSIONS[0]);
                self.reply(
                    &id,
                    json!({
                        "protocolVersion": version,
                        "capabilities": {"tools": {"listChanged": false}},
                        "serverInfo": {"name": SERVER_NAME, "title": "mcpbox sandbox", "version": env!("CARGO_PKG_VERSION")},
                        "instructions": "A sandbox of your own: run commands (exec) and code (run_code), keep files under /workspace (input is the template, read-only; write under /workspace/tmp, and put what should leave in /workspace/output), run background jobs, and snapshot, restore or reset the workspace. The network, programs and commands you may use are set by the policy.",
                    }),
                );
            }
            "ping" => self.reply(&id, json!({})),
            "tools/list" => self.reply(&id, json!({"tools": tools::list()})),
            "tools/call" => self.call(id, &params),
            _ => self.error(
                &id,
                mcpbox_policy::mcp::code::METHOD_NOT_FOUND,
                &format!("method not found: {method}"),
            ),
        }
    }

    fn cancel(&mut self, request: &Value) {
        for p in &mut self.procs {
            if matches!(&p.purpose, Purpose::Call { id, .. } if id == request) {
                p.stop(End::Stopped);
            }
        }
    }

    fn call(&mut self, id: Value, params: &Value) {
        let name = params
            .get("name")
            .and_then(Value::as_str)
            .unwrap_or("")
            .to_string();
        let empty = Value::Object(Map::new());
        let args = params.get("arguments").unwrap_or(&empty);
        if !args.is_object() {
            return self.reply(
                &id,
                refused(&Refusal::invalid("arguments must be an object".into())),
            );
        }
        let result = match name.as_str() {
            "exec" | "run_code" => match self.start(&name, args, Some(id.clone())) {
                Ok(()) => return, // answered when it ends
                Err(r) => Err(r),
            },
            "start_job" => self
                .start(&name, args, None)
                .map(|()| self.procs.last().map(job_state).unwrap_or(Value::Null)),
            "job_status" => self.job_status(args),
            "job_output" => self.job_output(args),
            "stop_job" => self.stop_job(args),
            "read_file" => {
                let max = u64_arg(args, "max_bytes")
                    .unwrap_or(self.config.max_output)
                    .min(self.config.max_output.max(1));
                self.root.read(
                    str_arg(args, "path").unwrap_or(""),
                    u64_arg(args, "offset").unwrap_or(0),
                    max,
                )
            }
            "write_file" => self.write_file(args),
            "list_files" => self.root.list(
                str_arg(args, "path").unwrap_or("/workspace"),
                bool_arg(args, "recursive"),
            ),
            "delete_file" => self.root.delete(
                str_arg(args, "path").unwrap_or(""),
                bool_arg(args, "recursive"),
            ),
            "snapshot" => {
                let name = match str_arg(args, "name") {
                    Some(n) => n.to_string(),
                    None => format!("snapshot-{}", self.checkpoints.names().len() + 1),
                };
                self.checkpoints.take(&name, bool_arg(args, "replace"))
            }
            "restore" => match str_arg(args, "name") {
                None => Ok(json!({"snapshots": self.checkpoints.names()})),
                Some(n) => {
                    self.stop_all_jobs();
                    self.checkpoints.restore(n)
                }
            },
            "reset" => {
                self.stop_all_jobs();
                self.checkpoints.restore(snap::ORIGIN)
            }
            "export_artifact" => self.export(params, args),
            other => Err(Refusal::invalid(format!("no tool named {other}"))),
        };
        let answer = match result {
            Ok(v) => ok(v),
            Err(r) => refused(&r),
        };
        self.reply(&id, answer);
    }

    fn write_file(&self, args: &Value) -> Result<Value, Refusal> {
        let path = str_arg(args, "path").unwrap_or("");
        let data = match (str_arg(args, "content"), str_arg(args, "content_base64")) {
            (Some(t), None) => t.as_bytes().to_vec(),
            (None, Some(b)) => decode_base64(b)?,
            (None, None) => Vec::new(),
            (Some(_), Some(_)) => {
                return Err(Refusal::invalid(
                    "give content or content_base64, not both".into(),
                ))
            }
        };
        let create_dirs = args
            .get("create_dirs")
            .and_then(Value::as_bool)
            .unwrap_or(true);
        self.root
            .write(path, &data, bool_arg(args, "append"), create_dirs)
    }

    /// exec, run_code and start_job: one way to start a process.
    fn start(&mut self, tool: &str, args: &Value, reply: Option<Value>) -> Result<(), Refusal> {
        let is_job = reply.is_none();
        if is_job {
            let running = self
                .procs
                .iter()
                .filter(|p| p.end.is_none() && matches!(p.purpose, Purpose::Job { .. }))
                .count();
            if running >= self.config.max_running as usize {
                return Err(Refusal {
                    reason: Some(Reason::JobLimit),
                    message: format!(
                        "{running} background jobs are running, the most the policy allows (jobs.max_running); stop one or wait for one to end"
                    ),
                });
            }
        }
        let cwd = match str_arg(args, "cwd") {
            Some(c) => c.to_string(),
            None => format!("{}/tmp", self.root.path),
        };
        let cwd_rel = self.root.rel(&cwd)?;
        let cwd_abs = PathBuf::from(self.root.show(&cwd_rel));
        let mut cleanup = None;
        let mut cmd = if tool == "run_code" {
            let lang = str_arg(args, "language").unwrap_or("");
            let code = str_arg(args, "code").unwrap_or("");
            let (prog, ext) = match lang {
                "python" => ("python3", "py"),
                "node" | "javascript" => ("node", "js"),
                "sh" => ("sh", "sh"),
                other => {
                    return Err(Refusal::invalid(format!(
                        "language {other:?}: use python, node or sh"
                    )))
                }
            };
            let dir = PathBuf::from(format!("{}/tmp/{}/code", self.root.path, snap::STATE_DIR));
            std::fs::create_dir_all(&dir)
                .map_err(|e| Refusal::invalid(format!("{}: {e}", dir.display())))?;
            self.next_job += 1;
            let file = dir.join(format!(
                "snippet-{}-{}.{ext}",
                std::process::id(),
                self.next_job
            ));
            std::fs::write(&file, code)
                .map_err(|e| Refusal::invalid(format!("{}: {e}", file.display())))?;
            let mut c = Command::new(prog);
            c.arg(&file);
            cleanup = Some(file);
            c
        } else {
            command_of(args)?
        };
        cmd.current_dir(&cwd_abs);
        if let Some(env) = args.get("env") {
            let Some(env) = env.as_object() else {
                return Err(Refusal::invalid("env must be an object of strings".into()));
            };
            for (k, v) in env {
                let Some(v) = v.as_str() else {
                    return Err(Refusal::invalid(format!("env.{k} must be a string")));
                };
                if k.is_empty() || k.contains('=') || k.contains('\0') || v.contains('\0') {
                    return Err(Refusal::invalid(format!("env.{k}: not a valid variable")));
                }
                cmd.env(k, v);
            }
        }
        let ceiling = if is_job {
            self.config.max_time_ms
        } else {
            self.config.exec_timeout_ms
        };
        let asked = args
            .get("timeout_seconds")
            .and_then(Value::as_f64)
            .filter(|t| *t > 0.0);
        let timeout_ms = asked.map_or(ceiling, |t| ((t * 1000.0) as u64).clamp(1, ceiling));
        let bounds = Bounds {
            timeout: Duration::from_millis(timeout_ms),
            memory: self.config.max_memory,
            keep: if is_job {
                self.config.job_output
            } else {
                self.config.max_output
            },
            keep_tail: is_job,
        };
        let purpose = match reply {
            Some(id) => Purpose::Call {
                id,
                cleanup: cleanup.clone(),
            },
            None => {
                let id = format!("job-{}", self.next_job);
                self.next_job += 1;
                Purpose::Job { id }
            }
        };
        match Proc::spawn(cmd, purpose, &bounds) {
            Ok(p) => {
                self.procs.push(p);
                Ok(())
            }
            Err(e) => {
                if let Some(f) = cleanup {
                    let _ = std::fs::remove_file(f);
                }
                Err(Refusal {
                    reason: None,
                    message: spawn_error(tool, args, &e),
                })
            }
        }
    }

    fn find_job(&self, args: &Value) -> Result<usize, Refusal> {
        let want = str_arg(args, "job_id").unwrap_or("");
        self.procs
            .iter()
            .position(|p| matches!(&p.purpose, Purpose::Job { id } if id == want))
            .ok_or_else(|| Refusal::invalid(format!("no job {want:?} (job_status lists them)")))
    }

    fn job_status(&self, args: &Value) -> Result<Value, Refusal> {
        if str_arg(args, "job_id").is_some() {
            let i = self.find_job(args)?;
            return Ok(json!({"jobs": [job_state(&self.procs[i])]}));
        }
        let jobs: Vec<Value> = self
            .procs
            .iter()
            .filter(|p| matches!(p.purpose, Purpose::Job { .. }))
            .map(job_state)
            .collect();
        Ok(json!({"jobs": jobs}))
    }

    fn job_output(&self, args: &Value) -> Result<Value, Refusal> {
        let i = self.find_job(args)?;
        let p = &self.procs[i];
        let max = usize::try_from(
            u64_arg(args, "max_bytes")
                .unwrap_or(self.config.max_output)
                .min(self.config.max_output.max(1)),
        )
        .unwrap_or(usize::MAX);
        let (out, out_from, out_next) = p
            .stdout()
            .read(u64_arg(args, "stdout_offset").unwrap_or(0), max);
        let (err, err_from, err_next) = p
            .stderr()
            .read(u64_arg(args, "stderr_offset").unwrap_or(0), max);
        let mut v = job_state(p);
        if let Some(m) = v.as_object_mut() {
            m.insert("stdout".into(), json!(out));
            m.insert("stderr".into(), json!(err));
            m.insert("stdout_from".into(), json!(out_from));
            m.insert("stderr_from".into(), json!(err_from));
            m.insert("stdout_next".into(), json!(out_next));
            m.insert("stderr_next".into(), json!(err_next));
        }
        Ok(v)
    }

    fn stop_job(&mut self, args: &Value) -> Result<Value, Refusal> {
        let i = self.find_job(args)?;
        self.procs[i].stop(End::Stopped);
        let deadline = Instant::now() + Duration::from_secs(2);
        while self.procs[i].end.is_none() && Instant::now() < deadline {
            std::thread::sleep(Duration::from_millis(5));
            self.procs[i].turn(Instant::now(), false);
        }
        Ok(job_state(&self.procs[i]))
    }

    fn stop_all_jobs(&mut self) {
        let now = Instant::now();
        for p in &mut self.procs {
            if matches!(p.purpose, Purpose::Job { .. }) {
                p.stop(End::Stopped);
            }
        }
        let deadline = now + Duration::from_secs(2);
        while self
            .procs
            .iter()
            .any(|p| p.end.is_none() && matches!(p.purpose, Purpose::Job { .. }))
            && Instant::now() < deadline
        {
            std::thread::sleep(Duration::from_millis(5));
            let now = Instant::now();
            for p in &mut self.procs {
                if matches!(p.purpose, Purpose::Job { .. }) {
                    p.turn(now, false);
                }
            }
        }
    }

    /// Copies a regular file into /workspace/output, at most the bytes the
    /// gateway allows: what a human approved is what is copied, even if
    /// the file grew since.
    fn export(&self, params: &Value, args: &Value) -> Result<Value, Refusal> {
        let path = str_arg(args, "path").unwrap_or("");
        let allowed = params
            .get("_meta")
            .and_then(|m| m.get(META_MAX_BYTES))
            .and_then(Value::as_u64)
            .unwrap_or(self.config.artifact_max_size);
        let (mut src, size, rel) = self.root.open_regular(path)?;
        if size > allowed {
            return Err(Refusal {
                reason: Some(Reason::ArtifactRefused),
                message: format!("{path}: {size} bytes, over the {allowed} allowed (artifacts.max_size, or what was approved)"),
            });
        }
        let name = match str_arg(args, "name") {
            Some(n) => n.to_string(),
            None => rel.rsplit('/').next().unwrap_or("artifact").to_string(),
        };
        let dest = self
            .root
            .rel(&format!("{}/output/{}", self.root.path, name))?;
        if !dest.starts_with("output/") || dest == rel {
            return Err(Refusal::invalid(format!(
                "name {name:?}: must be a path inside /workspace/output, not the file itself"
            )));
        }
        let mut data = Vec::new();
        (&mut src)
            .take(allowed.saturating_add(1))
            .read_to_end(&mut data)
            .map_err(|e| Refusal::invalid(format!("{path}: {e}")))?;
        if data.len() as u64 > allowed {
            return Err(Refusal {
                reason: Some(Reason::ArtifactRefused),
                message: format!(
                    "{path}: grew past the {allowed} bytes allowed while being copied"
                ),
            });
        }
        let written = self
            .root
            .write(&self.root.show(&dest), &data, false, true)?;
        use sha2::Digest;
        let sha = sha2::Sha256::digest(&data);
        let hex = mcpbox_policy::hex::encode(&sha);
        Ok(json!({"path": written["path"], "bytes": data.len(), "sha256": hex}))
    }
}

fn command_of(args: &Value) -> Result<Command, Refusal> {
    match (args.get("command"), args.get("argv")) {
        (Some(Value::String(line)), None) => {
            let mut c = Command::new("/bin/sh");
            c.arg("-c").arg(line);
            Ok(c)
        }
        (None, Some(Value::Array(items))) if !items.is_empty() => {
            let mut argv = Vec::new();
            for i in items {
                match i.as_str() {
                    Some(s) if !s.contains('\0') => argv.push(s.to_string()),
                    _ => return Err(Refusal::invalid("argv must be an array of strings".into())),
                }
            }
            let mut c = Command::new(&argv[0]);
            c.args(&argv[1..]);
            Ok(c)
        }
        (None, None) => Err(Refusal::invalid(
            "give command (a command line) or argv (an array)".into(),
        )),
        (Some(_), Some(_)) => Err(Refusal::invalid("give command or argv, not both".into())),
        _ => Err(Refusal::invalid(
            "command must be a string, argv a non-empty array of strings".into(),
        )),
    }
}

/// A start that failed, said so the agent can act: a missing program or
/// interpreter is named as missing from this sandbox.
fn spawn_error(tool: &str, args: &Value, e: &std::io::Error) -> String {
    let prog = if tool == "run_code" {
        match str_arg(args, "language") {
            Some("python") => "python3".to_string(),
            Some("sh") => "sh".to_string(),
            _ => "node".to_string(),
        }
    } else {
        args.get("argv")
            .and_then(|a| a.get(0))
            .and_then(Value::as_str)
            .unwrap_or("/bin/sh")
            .to_string()
    };
    if e.kind() == std::io::ErrorKind::NotFound {
        format!("{prog}: not found in this sandbox (the template or policy does not provide it; mount it or use another)")
    } else if e.kind() == std::io::ErrorKind::PermissionDenied {
        format!("{prog}: not allowed to run here (process.allow_exec, or not executable)")
    } else {
        format!("{prog}: cannot start: {e}")
    }
}

/// The reason code of an end we caused, for results.
fn end_reason(p: &Proc) -> Value {
    match p.end {
        Some(End::TimedOut) => json!(Reason::JobTimeout.as_str()),
        Some(End::Memory) => json!(Reason::JobMemory.as_str()),
        _ => Value::Null,
    }
}

fn end_fields(p: &Proc) -> (Value, Value, &'static str) {
    match p.end {
        Some(End::Exited(c)) => (json!(c), Value::Null, "exited"),
        Some(End::Signaled(s)) => (Value::Null, json!(s), "killed"),
        Some(e) => (Value::Null, Value::Null, e.state()),
        None => (Value::Null, Value::Null, "running"),
    }
}

fn run_result(p: &Proc) -> Value {
    let (code, signal, state) = end_fields(p);
    let structured = json!({
        "state": state,
        "exit_code": code,
        "signal": signal,
        "stdout": p.stdout().text(),
        "stderr": p.stderr().text(),
        "stdout_truncated": p.stdout().truncated(),
        "stderr_truncated": p.stderr().truncated(),
        "duration_ms": u64::try_from(p.duration.as_millis()).unwrap_or(u64::MAX),
        "reason": end_reason(p),
    });
    let mut text = match p.end {
        Some(End::Exited(c)) => format!("exit status {c}"),
        Some(End::Signaled(s)) => format!("killed by signal {s}"),
        Some(End::TimedOut) => "stopped: its time limit was reached".to_string(),
        Some(End::Memory) => "stopped: its memory limit (jobs.max_memory) was reached".to_string(),
        _ => "stopped".to_string(),
    };
    for (name, k) in [("stdout", p.stdout()), ("stderr", p.stderr())] {
        if k.total > 0 {
            text.push_str(&format!(
                "\n--- {name}{}\n{}",
                if k.truncated() { " (cut)" } else { "" },
                k.text()
            ));
        }
    }
    // a command that failed is a result, not a tool error: the agent reads
    // its exit status and output either way
    json!({"content": [{"type": "text", "text": text}], "structuredContent": structured, "isError": false})
}

fn job_state(p: &Proc) -> Value {
    let (code, signal, state) = end_fields(p);
    let id = match &p.purpose {
        Purpose::Job { id } => id.clone(),
        Purpose::Call { .. } => String::new(),
    };
    let mut v = json!({
        "job_id": id,
        "state": state,
        "exit_code": code,
        "signal": signal,
        "started_ms": p.wall_start_ms,
        "stdout_bytes": p.stdout().total,
        "stderr_bytes": p.stderr().total,
        "reason": end_reason(p),
    });
    let d = if p.end.is_some() {
        p.duration
    } else {
        p.started.elapsed()
    };
    v["duration_ms"] = json!(u64::try_from(d.as_millis()).unwrap_or(u64::MAX));
    v
}

fn ok(structured: Value) -> Value {
    let text = serde_json::to_string_pretty(&structured).unwrap_or_default();
    json!({"content": [{"type": "text", "text": text}], "structuredContent": structured, "isError": false})
}

fn refused(r: &Refusal) -> Value {
    let mut v = json!({
        "content": [{"type": "text", "text": r.message}],
        "isError": true,
    });
    if let Some(reason) = r.reason {
        // in the text only: `_meta` names under `io.mcpbox` are the
        // gateway's, and the relay removes them from any server's answer
        // (this server's too; crates/gateway/src/reserved.rs)
        v["content"][0]["text"] = json!(format!("{} (reason: {})", r.message, reason.as_str()));
    }
    v
}

/// Standard base64 (RFC 4648 §4), padded or not, for file contents.
const BASE64: base64::engine::GeneralPurpose = base64::engine::GeneralPurpose::new(
    &base64::alphabet::STANDARD,
    base64::engine::GeneralPurposeConfig::new()
        .with_decode_padding_mode(base64::engine::DecodePaddingMode::Indifferent),
);

/// Base64 as an agent writes it: padded or not, wrapped or not.
fn decode_base64(text: &str) -> Result<Vec<u8>, Refusal> {
    use base64::Engine;
    let compact: String = text.chars().filter(|c| !c.is_ascii_whitespace()).collect();
    BASE64
        .decode(compact)
        .map_err(|e| Refusal::invalid(format!("content_base64: {e}")))
}

/// `data` as padded standard base64.
pub(crate) fn encode_base64(data: &[u8]) -> String {
    use base64::Engine;
    BASE64.encode(data)
}

fn str_arg<'a>(args: &'a Value, key: &str) -> Option<&'a str> {
    args.get(key).and_then(Value::as_str)
}

fn u64_arg(args: &Value, key: &str) -> Option<u64> {
    args.get(key).and_then(Value::as_u64)
}

fn bool_arg(args: &Value, key: &str) -> bool {
    args.get(key).and_then(Value::as_bool).unwrap_or(false)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn base64_round_trips_and_takes_unpadded_or_wrapped_text() {
        for n in 0..10 {
            let data: Vec<u8> = (0..n).map(|i| (i * 37 + 200) as u8).collect();
            assert_eq!(decode_base64(&encode_base64(&data)).ok(), Some(data));
        }
        assert_eq!(encode_base64(b"fo"), "Zm8=");
        assert_eq!(decode_base64("Zm8").ok(), Some(b"fo".to_vec()));
        assert_eq!(decode_base64("Zm9v\nYmFy\n").ok(), Some(b"foobar".to_vec()));
        assert!(decode_base64("a*b").is_err());
    }
}
