//! The one way mcpbox runs a command on the host, outside any sandbox: a
//! secret's `from_command` and `revoke`, `[approvals] notify`, and the
//! command-line checker (`mcpbox __classify`).
//!
//! Such a command runs as the user who runs mcpbox, so what it inherits
//! and how long it lives are the whole of its confinement:
//!
//! - **Environment**: cleared, then [`INHERITED`] (`PATH`, `HOME`, `LANG`)
//!   copied from mcpbox's own, then what the caller passes on purpose
//!   ([`HostCommand::env`], documented where each caller is). Nothing else:
//!   under `serve` mcpbox's environment holds every client's token
//!   variable and the secrets read `from_env`, none of which a notifier or
//!   a revoke script has any business seeing.
//! - **Process group**: the command leads a new process group
//!   (`setpgid(0, 0)` in the child, via std's `process_group(0)`, which
//!   posix_spawn(3) does without a fork of this multi-threaded process),
//!   and its whole group is killed (`kill(-pgid, SIGKILL)`) when it
//!   ends, at its timeout, and at mcpbox's exit ([`kill_running`]):
//!   whatever it started in the background, possibly with a secret's value
//!   in its environment, does not outlive it. The group is killed while
//!   the leader is still a zombie (waitid(2) with `WNOWAIT`), so its id
//!   cannot have been reused by then. A process that leaves the group
//!   on purpose (setsid(2), a double fork into a new session) escapes
//!   this; a cgroup would not let it, and is a possible next step.
//! - **stdio**: stdin is `/dev/null` unless the caller gives bytes; stdout
//!   is captured (up to a limit) or discarded; stderr is discarded.
//!
//! The caller gets an [`Outcome`]: how the command ended, which is what
//! the audit records (never a value, never the output).

use std::io::{self, Read, Write};
use std::os::fd::AsFd;
use std::os::unix::process::{CommandExt, ExitStatusExt};
use std::process::{Child, Command, ExitStatus, Stdio};
use std::sync::Mutex;
use std::time::{Duration, Instant};

use rustix::process::{Pid, Signal, WaitId, WaitIdOptions};

/// The variables a host command gets from mcpbox's environment, when set:
/// where to find programs, whose home (the config of `gh`, `op`, ...),
/// and the language of its messages.
pub const INHERITED: [&str; 3] = ["PATH", "HOME", "LANG"];

/// How often a command without captured output is checked on.
const TICK: Duration = Duration::from_millis(20);

/// A command to run on the host.
#[derive(Debug, Clone)]
pub struct HostCommand {
    argv: Vec<String>,
    env: Vec<(String, String)>,
    stdin: Option<Vec<u8>>,
    capture: Option<usize>,
    timeout: Duration,
}

/// How a host command ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Ended {
    /// It exited with this code.
    Exited(i32),
    /// A signal ended it (not mcpbox's timeout).
    Signaled(i32),
    /// It ran past its timeout; its process group was killed.
    TimedOut(Duration),
    /// It wrote more than the capture limit (bytes); its process group was
    /// killed then.
    TooMuchOutput(usize),
}

/// What a host command did: how it ended, and its stdout when captured.
#[derive(Debug, Clone)]
pub struct Outcome {
    /// How it ended.
    pub ended: Ended,
    /// Its standard output, at most the capture limit.
    pub stdout: Vec<u8>,
    /// It wrote more than the capture limit (the rest was read and dropped).
    pub stdout_over: bool,
}

impl Ended {
    /// Exited with 0.
    pub fn success(&self) -> bool {
        *self == Ended::Exited(0)
    }

    /// For a record or a message: `ok`, `exit 3`, `killed by signal 9`,
    /// `timed out after 10s (its process group was killed)`.
    pub fn describe(&self) -> String {
        match self {
            Ended::Exited(0) => "ok".into(),
            Ended::Exited(c) => format!("exit {c}"),
            Ended::Signaled(s) => format!("killed by signal {s}"),
            Ended::TimedOut(t) => format!(
                "timed out after {}s (its process group was killed)",
                t.as_secs_f64()
            ),
            Ended::TooMuchOutput(n) => {
                format!("wrote more than {n} bytes (its process group was killed)")
            }
        }
    }
}

impl HostCommand {
    /// `argv[0]` with the rest as arguments (no shell), bounded by
    /// `timeout`. `None` when `argv` or its program is empty.
    pub fn new(argv: &[String], timeout: Duration) -> Option<HostCommand> {
        if argv.first().is_none_or(String::is_empty) {
            return None;
        }
        Some(HostCommand {
            argv: argv.to_vec(),
            env: Vec::new(),
            stdin: None,
            capture: None,
            timeout,
        })
    }

    /// The program (`argv[0]`), for messages.
    pub fn program(&self) -> &str {
        &self.argv[0]
    }

    /// One more argument.
    pub fn arg(mut self, a: impl Into<String>) -> HostCommand {
        self.argv.push(a.into());
        self
    }

    /// Passes `name=value` on purpose, besides [`INHERITED`].
    pub fn env(mut self, name: impl Into<String>, value: impl Into<String>) -> HostCommand {
        self.env.push((name.into(), value.into()));
        self
    }

    /// Passes these of mcpbox's own variables on purpose, those that are set.
    pub fn inherit(mut self, names: &[&str]) -> HostCommand {
        for n in names {
            if let Some(v) = std::env::var_os(n).and_then(|v| v.into_string().ok()) {
                self.env.push(((*n).to_string(), v));
            }
        }
        self
    }

    /// Writes `bytes` to its stdin, then closes it.
    pub fn stdin(mut self, bytes: Vec<u8>) -> HostCommand {
        self.stdin = Some(bytes);
        self
    }

    /// Captures its stdout, keeping at most `limit` bytes.
    pub fn capture(mut self, limit: usize) -> HostCommand {
        self.capture = Some(limit);
        self
    }

    /// The `Command` this runs: environment cleared and allowlisted, a
    /// process group of its own, stdio as asked.
    fn command(&self) -> Command {
        let mut cmd = Command::new(&self.argv[0]);
        cmd.args(&self.argv[1..]);
        cmd.env_clear();
        for name in INHERITED {
            if let Some(v) = std::env::var_os(name) {
                cmd.env(name, v);
            }
        }
        cmd.envs(self.env.iter().map(|(k, v)| (k, v)));
        cmd.process_group(0);
        cmd.stdin(if self.stdin.is_some() {
            Stdio::piped()
        } else {
            Stdio::null()
        });
        cmd.stdout(if self.capture.is_some() {
            Stdio::piped()
        } else {
            Stdio::null()
        });
        cmd.stderr(Stdio::null());
        cmd
    }

    /// Runs it to its end or its timeout; its process group is gone when
    /// this returns. An error only when it could not be started.
    pub fn run(&self) -> io::Result<Outcome> {
        let mut child = self.command().spawn()?;
        let pid = Pid::from_child(&child);
        RUNNING.lock().unwrap_or_else(|p| p.into_inner()).push(pid);
        let result = self.watch(&mut child, pid);
        // Killed while the leader is unreaped (a zombie at worst), so the
        // group id is still ours: leftovers of a finished command, or all
        // of one that timed out (or whose watch failed), die here.
        kill_group(pid);
        RUNNING
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .retain(|p| *p != pid);
        let status = child.wait();
        let (stop, mut out) = result?;
        if let Some(r) = child.stdout.as_mut() {
            // what it wrote before it ended; a leftover that escaped the
            // group may hold the pipe open, so no waiting for its end
            drain(r, &mut out, self.capture.unwrap_or(0));
        }
        let limit = self.capture.unwrap_or(0);
        let ended = match stop {
            Stop::TimedOut => Ended::TimedOut(self.timeout),
            Stop::Over => Ended::TooMuchOutput(limit),
            Stop::Exited => ended(status?),
        };
        let stdout_over = out.len() > limit;
        out.truncate(limit);
        Ok(Outcome {
            ended,
            stdout: out,
            stdout_over,
        })
    }

    /// Feeds stdin and reads stdout until the leader exits (left
    /// unreaped), it writes more than the capture limit, or the timeout:
    /// why it stopped, and stdout so far.
    fn watch(&self, child: &mut Child, pid: Pid) -> io::Result<(Stop, Vec<u8>)> {
        let deadline = Instant::now() + self.timeout;
        let limit = self.capture.unwrap_or(0);
        let mut out = Vec::new();
        let mut input: &[u8] = self.stdin.as_deref().unwrap_or(&[]);
        if let Some(w) = &child.stdin {
            rustix::io::ioctl_fionbio(w.as_fd(), true)?;
        }
        if let Some(r) = &child.stdout {
            rustix::io::ioctl_fionbio(r.as_fd(), true)?;
        }
        loop {
            // stdin: what the pipe takes now; closed once all is written
            if let Some(w) = child.stdin.as_mut() {
                match w.write(input) {
                    Ok(n) => input = &input[n..],
                    Err(e) if e.kind() == io::ErrorKind::WouldBlock => {}
                    Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                    // it closed its stdin: it will not read the rest
                    Err(_) => input = &[],
                }
                if input.is_empty() {
                    child.stdin = None;
                }
            }
            let open = match child.stdout.as_mut() {
                Some(r) => drain(r, &mut out, limit),
                None => false,
            };
            if out.len() > limit {
                return Ok((Stop::Over, out));
            }
            let exited = rustix::process::waitid(
                WaitId::Pid(pid),
                WaitIdOptions::EXITED | WaitIdOptions::NOHANG | WaitIdOptions::NOWAIT,
            )?;
            if exited.is_some() {
                return Ok((Stop::Exited, out));
            }
            let left = deadline.saturating_duration_since(Instant::now());
            if left.is_zero() {
                return Ok((Stop::TimedOut, out));
            }
            let wait = left.min(TICK);
            match (open, child.stdout.as_ref()) {
                // woken early by output or its end
                (true, Some(r)) => {
                    let ts = rustix::event::Timespec {
                        tv_sec: 0,
                        tv_nsec: i64::from(wait.subsec_nanos()),
                    };
                    let mut fds = [rustix::event::PollFd::new(r, rustix::event::PollFlags::IN)];
                    match rustix::event::poll(&mut fds, Some(&ts)) {
                        Ok(_) | Err(rustix::io::Errno::INTR) => {}
                        Err(e) => return Err(e.into()),
                    }
                }
                _ => std::thread::sleep(wait),
            }
        }
    }
}

/// Why [`HostCommand::watch`] stopped watching.
enum Stop {
    Exited,
    TimedOut,
    Over,
}

/// Reads what `r` has now into `out` (past `limit`, only the length
/// grows: one byte over says it was over); whether it is still open.
fn drain(r: &mut impl Read, out: &mut Vec<u8>, limit: usize) -> bool {
    let mut chunk = [0u8; 16384];
    loop {
        match r.read(&mut chunk) {
            Ok(0) => return false,
            Ok(n) => {
                let room = (limit + 1).saturating_sub(out.len());
                out.extend_from_slice(&chunk[..n.min(room)]);
            }
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => return true,
            Err(_) => return false,
        }
    }
}

fn ended(status: ExitStatus) -> Ended {
    match (status.code(), status.signal()) {
        (Some(c), _) => Ended::Exited(c),
        (None, Some(s)) => Ended::Signaled(s),
        (None, None) => Ended::Exited(-1),
    }
}

/// SIGKILL to the whole group `pid` leads (gone already: fine).
fn kill_group(pid: Pid) {
    match rustix::process::kill_process_group(pid, Signal::KILL) {
        Ok(()) | Err(rustix::io::Errno::SRCH) => {}
        Err(e) => tracing::warn!("host command: killing process group {pid:?}: {e}"),
    }
}

/// The process groups of the host commands running now: each is in this
/// list from its spawn until it was killed, before its leader is reaped.
static RUNNING: Mutex<Vec<Pid>> = Mutex::new(Vec::new());

/// Kills the process group of every host command still running: called
/// when mcpbox exits (its threads waiting for them are not waited for).
pub fn kill_running() {
    let running = RUNNING.lock().unwrap_or_else(|p| p.into_inner());
    for pid in running.iter() {
        kill_group(*pid);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sh(script: &str) -> Vec<String> {
        vec!["/bin/sh".into(), "-c".into(), script.into()]
    }

    fn run(cmd: HostCommand) -> Outcome {
        cmd.run().unwrap()
    }

    #[test]
    fn the_environment_is_the_allowlist_and_what_is_passed() {
        let cmd = HostCommand::new(&sh("env"), Duration::from_secs(20))
            .unwrap()
            .env("MCPBOX_ON_PURPOSE", "yes")
            .capture(1 << 20);
        let out = run(cmd);
        assert!(out.ended.success(), "{:?}", out.ended);
        let text = String::from_utf8(out.stdout).unwrap();
        for line in text.lines() {
            let name = line.split('=').next().unwrap();
            // sh itself sets PWD (and some set SHLVL, _)
            assert!(
                INHERITED.contains(&name)
                    || ["MCPBOX_ON_PURPOSE", "PWD", "SHLVL", "_", "OLDPWD"].contains(&name),
                "{name} reached the command:\n{text}"
            );
        }
        assert!(text.contains("MCPBOX_ON_PURPOSE=yes"), "{text}");
        if std::env::var_os("PATH").is_some() {
            assert!(text.contains("PATH="), "{text}");
        }
    }

    #[test]
    fn it_leads_its_own_process_group() {
        let cmd = HostCommand::new(
            &sh("echo $$; ps -o pgid= -p $$ 2>/dev/null || cut -d' ' -f5 /proc/$$/stat"),
            Duration::from_secs(20),
        )
        .unwrap()
        .capture(4096);
        let out = run(cmd);
        let text = String::from_utf8(out.stdout).unwrap();
        let mut words = text.split_whitespace();
        let pid = words.next().unwrap();
        let pgid = words.next().unwrap();
        assert_eq!(pid, pgid, "{text}");
    }

    #[test]
    fn at_its_timeout_everything_it_started_is_killed() {
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("pid");
        let script = format!("sleep 1000 & echo $! > {}; sleep 1000", file.display());
        let cmd = HostCommand::new(&sh(&script), Duration::from_millis(500)).unwrap();
        let out = run(cmd);
        assert_eq!(out.ended, Ended::TimedOut(Duration::from_millis(500)));
        assert!(out.ended.describe().starts_with("timed out"));
        let pid = std::fs::read_to_string(&file).unwrap().trim().to_string();
        assert!(!pid.is_empty());
        // killed with SIGKILL before run returned; reaped by init (or a
        // subreaper) soon: it is gone, or a zombie
        assert!(gone_or_zombie(&pid), "the grandchild {pid} survived");
    }

    #[test]
    fn what_a_finished_command_left_running_is_killed() {
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("pid");
        let script = format!("sleep 1000 & echo $! > {}", file.display());
        let out = run(HostCommand::new(&sh(&script), Duration::from_secs(20)).unwrap());
        assert!(out.ended.success(), "{:?}", out.ended);
        let pid = std::fs::read_to_string(&file).unwrap().trim().to_string();
        assert!(gone_or_zombie(&pid), "the background {pid} survived");
    }

    /// Whether `/proc/PID` is gone or a zombie (state `Z`), after a
    /// moment for init to reap it: SIGKILL was sent already.
    fn gone_or_zombie(pid: &str) -> bool {
        for _ in 0..200 {
            match std::fs::read_to_string(format!("/proc/{pid}/stat")) {
                Err(_) => return true,
                Ok(s) => {
                    let state = s.rsplit(") ").next().unwrap_or("").chars().next();
                    if state == Some('Z') || state == Some('X') {
                        return true;
                    }
                }
            }
            std::thread::sleep(Duration::from_millis(10));
        }
        false
    }

    #[test]
    fn outcomes_are_described_without_output() {
        let out = run(
            HostCommand::new(&sh("echo secret-value; exit 3"), Duration::from_secs(20)).unwrap(),
        );
        assert_eq!(out.ended, Ended::Exited(3));
        assert_eq!(out.ended.describe(), "exit 3");
        assert!(out.stdout.is_empty(), "not captured");
        let out = run(HostCommand::new(&sh("kill -9 $$"), Duration::from_secs(20)).unwrap());
        assert_eq!(out.ended, Ended::Signaled(9));
        assert_eq!(out.ended.describe(), "killed by signal 9");
    }

    #[test]
    fn stdin_is_fed_whole_and_stdout_captured() {
        // more than a pipe holds: written as the command reads
        let big = vec![b'x'; 300_000];
        let out = run(HostCommand::new(
            &["wc".to_string(), "-c".to_string()],
            Duration::from_secs(20),
        )
        .unwrap()
        .stdin(big)
        .capture(1000));
        assert!(out.ended.success(), "{:?}", out.ended);
        assert_eq!(String::from_utf8(out.stdout).unwrap().trim(), "300000");
        assert!(!out.stdout_over);
    }

    #[test]
    fn a_command_that_floods_its_output_is_killed_at_the_limit() {
        let out = run(
            HostCommand::new(&["yes".to_string()], Duration::from_secs(60))
                .unwrap()
                .capture(1 << 16),
        );
        assert_eq!(out.ended, Ended::TooMuchOutput(1 << 16));
        assert!(out.stdout_over);
        assert_eq!(out.stdout.len(), 1 << 16);
    }

    #[test]
    fn an_empty_command_or_a_missing_program_is_refused() {
        assert!(HostCommand::new(&[], Duration::from_secs(1)).is_none());
        assert!(HostCommand::new(&[String::new()], Duration::from_secs(1)).is_none());
        let e = HostCommand::new(&["/nonexistent/program".into()], Duration::from_secs(1))
            .unwrap()
            .run();
        assert!(e.is_err());
    }
}
