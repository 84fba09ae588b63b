//! Starting the MCP server. The relay only sees pipes and a
//! [`ProcessControl`]; the sandbox crate provides its own [`Launcher`].

use std::io::{self, Read};
use std::os::fd::AsFd;
use std::process::{Child, Command, Stdio};

/// How the server process ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ExitInfo {
    /// Exit code, when it exited normally.
    pub code: Option<i32>,
    /// Signal number, when a signal ended it.
    pub signal: Option<i32>,
}

impl ExitInfo {
    /// A single number for the audit log: the code, or 128 + signal.
    pub fn status(&self) -> i32 {
        match (self.code, self.signal) {
            (Some(c), _) => c,
            (None, Some(s)) => 128 + s,
            (None, None) => -1,
        }
    }
}

impl std::fmt::Display for ExitInfo {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match (self.code, self.signal) {
            (Some(c), _) => write!(f, "status {c}"),
            (None, Some(s)) => write!(f, "signal {s}"),
            (None, None) => write!(f, "unknown status"),
        }
    }
}

/// Control over a running server process.
pub trait ProcessControl: Send {
    /// Asks the server to stop (SIGTERM).
    fn terminate(&mut self) -> io::Result<()>;
    /// Stops the server and everything it started (SIGKILL, or killing the
    /// sandbox's process tree).
    fn kill(&mut self) -> io::Result<()>;
    /// Returns the exit information if the server has exited; never blocks.
    fn try_wait(&mut self) -> io::Result<Option<ExitInfo>>;
    /// Blocks until the server has exited.
    fn wait(&mut self) -> io::Result<ExitInfo>;
}

/// Our end of the server's stdin: a pipe (or socket) that only the relay
/// writes to. The relay sets `O_NONBLOCK` on it and writes to the file
/// descriptor itself (see the stdio driver), so a `Write` wrapper's own
/// buffering would be bypassed: pass the pipe end, not a `BufWriter`.
pub trait ServerStdin: AsFd + Send + Sync {}
impl<T: AsFd + Send + Sync> ServerStdin for T {}

/// Our end of the server's stdout: a pipe (or socket). The relay's driver
/// waits for it in its own `poll` and reads the descriptor itself (no
/// reader thread, see the stdio driver), so a `Read` wrapper's buffering
/// would be bypassed: pass the pipe end, not a `BufReader`.
pub trait ServerStdout: AsFd + Send {}
impl<T: AsFd + Send> ServerStdout for T {}

/// A started server: its three pipes and its control handle.
pub struct ServerProcess {
    /// The server's stdin (ours alone: the relay makes it non-blocking).
    pub stdin: Box<dyn ServerStdin>,
    /// The server's stdout (read by the relay's driver itself).
    pub stdout: Box<dyn ServerStdout>,
    /// The server's stderr.
    pub stderr: Box<dyn Read + Send>,
    /// Signals and waiting.
    pub control: Box<dyn ProcessControl>,
    /// The kernel's word on the files the server reads and writes
    /// ([`crate::touched`]); `None` where it cannot watch them.
    pub files: Option<crate::touched::FileWatch>,
    /// The sandbox tier the server runs in (`full`, `degraded`), for the
    /// `session_start` record; `None` outside a sandbox.
    pub tier: Option<&'static str>,
}

/// Starts the server, possibly several times in one session (secret TTL
/// restarts). `env` holds the secrets to inject.
pub trait Launcher: Send {
    /// Starts one instance of the server with `env` added to its environment.
    fn launch(&mut self, env: &[(String, String)]) -> io::Result<ServerProcess>;
}

/// Starts the server as a plain child process (no sandbox): for tests and
/// for platforms without the sandbox. The child leads its own process group
/// and signals go to the whole group, so helpers it started (`npx` starts
/// `node`) are stopped with it.
#[derive(Debug, Clone)]
pub struct CommandLauncher {
    /// Program to run.
    pub program: String,
    /// Its arguments.
    pub args: Vec<String>,
    /// Extra environment (beyond the secrets) for every launch.
    pub env: Vec<(String, String)>,
    /// Clear the inherited environment first (keeps only `PATH`).
    pub clear_env: bool,
}

impl CommandLauncher {
    /// A launcher for `program args...` that inherits the environment.
    pub fn new(
        program: impl Into<String>,
        args: impl IntoIterator<Item = impl Into<String>>,
    ) -> CommandLauncher {
        CommandLauncher {
            program: program.into(),
            args: args.into_iter().map(Into::into).collect(),
            env: Vec::new(),
            clear_env: false,
        }
    }
}

struct ChildControl(Child);

fn exit_info(status: std::process::ExitStatus) -> ExitInfo {
    use std::os::unix::process::ExitStatusExt;
    ExitInfo {
        code: status.code(),
        signal: status.signal(),
    }
}

impl ChildControl {
    /// Signals the child's process group (the child leads it), so helpers
    /// it started go too.
    fn signal_group(&mut self, signal: rustix::process::Signal) -> io::Result<()> {
        let raw = i32::try_from(self.0.id()).unwrap_or(0);
        let Some(pid) = rustix::process::Pid::from_raw(raw) else {
            return Ok(());
        };
        match rustix::process::kill_process_group(pid, signal) {
            // the group is already gone
            Err(rustix::io::Errno::SRCH) => Ok(()),
            other => other.map_err(io::Error::from),
        }
    }
}

impl ProcessControl for ChildControl {
    fn terminate(&mut self) -> io::Result<()> {
        self.signal_group(rustix::process::Signal::TERM)
    }
    fn kill(&mut self) -> io::Result<()> {
        let _ = self.signal_group(rustix::process::Signal::KILL);
        match self.0.kill() {
            Err(e) if e.kind() == io::ErrorKind::InvalidInput => Ok(()),
            other => other,
        }
    }
    fn try_wait(&mut self) -> io::Result<Option<ExitInfo>> {
        Ok(self.0.try_wait()?.map(exit_info))
    }
    fn wait(&mut self) -> io::Result<ExitInfo> {
        Ok(exit_info(self.0.wait()?))
    }
}

impl Launcher for CommandLauncher {
    fn launch(&mut self, env: &[(String, String)]) -> io::Result<ServerProcess> {
        let mut cmd = Command::new(&self.program);
        cmd.args(&self.args);
        if self.clear_env {
            let path = std::env::var_os("PATH");
            cmd.env_clear();
            if let Some(p) = path {
                cmd.env("PATH", p);
            }
        }
        cmd.envs(self.env.iter().map(|(k, v)| (k, v)));
        cmd.envs(env.iter().map(|(k, v)| (k, v)));
        cmd.stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped());
        std::os::unix::process::CommandExt::process_group(&mut cmd, 0);
        let mut child = cmd.spawn()?;
        let missing = || io::Error::other("child pipe missing");
        let stdin = child.stdin.take().ok_or_else(missing)?;
        let stdout = child.stdout.take().ok_or_else(missing)?;
        let stderr = child.stderr.take().ok_or_else(missing)?;
        Ok(ServerProcess {
            stdin: Box::new(stdin),
            stdout: Box::new(stdout),
            stderr: Box::new(stderr),
            control: Box::new(ChildControl(child)),
            files: None,
            tier: None,
        })
    }
}
