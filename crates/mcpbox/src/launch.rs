//! How `mcpbox run`'s relay starts the server: [`SandboxLauncher`] (the
//! gateway's `Launcher`) and [`Control`] (its `ProcessControl`).
//!
//! `run` is multi-threaded, so every sandbox, the first and each restart
//! after a secret's TTL, starts through the single-threaded sandbox helper
//! (`mcpbox_sandbox::helper`); no thread of ours ever forks a sandbox
//! process.

use std::ffi::OsString;
use std::sync::atomic::{AtomicI32, Ordering};
use std::sync::Arc;

use mcpbox_gateway::{ExitInfo, Launcher, ProcessControl, ServerProcess};
use mcpbox_sandbox::{Sandbox, Spec, Status};

/// Starts the server in a fresh sandbox with the given extra environment.
pub struct SandboxLauncher {
    pub spec: Spec,
    /// The current sandbox's init pid, for the signal thread.
    pub current: Arc<AtomicI32>,
}

impl Launcher for SandboxLauncher {
    fn launch(&mut self, env: &[(String, String)]) -> std::io::Result<ServerProcess> {
        let mut spec = self.spec.clone();
        for (k, v) in env {
            let key = OsString::from(k);
            spec.env.retain(|(name, _)| *name != key);
            spec.env.push((key, v.into()));
        }
        // The sandbox error stays inside the io::Error, so its step and
        // exit code reach main (crate::Failure).
        let mut sb = mcpbox_sandbox::helper::spawn(&spec).map_err(std::io::Error::other)?;
        grow_host_stdout();
        for note in &sb.notes {
            tracing::warn!("{note}");
        }
        self.current.store(sb.init_pid(), Ordering::SeqCst);
        let (Some(stdin), Some(stdout), Some(stderr)) =
            (sb.stdin.take(), sb.stdout.take(), sb.stderr.take())
        else {
            return Err(std::io::Error::other("sandbox started without pipes"));
        };
        let files = watch_files(&spec, sb.init_pid());
        let tier = Some(sb.tier());
        Ok(ServerProcess {
            stdin: Box::new(stdin),
            stdout: Box::new(stdout),
            stderr: Box::new(stderr),
            control: Box::new(Control(sb)),
            files,
            tier,
        })
    }
}

/// The kernel's watch on the files the server reads and writes: the
/// sandbox's input, output and writable policy mounts, reached through its init's
/// root (`mcpbox_sandbox::fanotify`). `None` without the privilege it
/// needs (rootless: the relay then lists written files by their times),
/// in the degraded tier (no mounts of its own, init < 0), or with nothing
/// mounted.
fn watch_files(spec: &Spec, init: libc::pid_t) -> Option<mcpbox_gateway::touched::FileWatch> {
    if init <= 0 || !mcpbox_sandbox::is_host_root() {
        return None;
    }
    let root = std::path::PathBuf::from(format!("/proc/{init}/root"));
    let mut paths = Vec::new();
    if spec.input.is_some() {
        paths.push(root.join("workspace/input"));
    }
    if spec.output.is_some() {
        paths.push(root.join("workspace/output"));
    }
    // writable policy mounts only: a read-only one is mostly the server's
    // own installation (node_modules, a venv), whose loads are no record's
    for m in spec.mounts.iter().filter(|m| m.writable) {
        paths.push(root.join(m.at.strip_prefix("/").unwrap_or(&m.at)));
    }
    if paths.is_empty() {
        return None;
    }
    match mcpbox_sandbox::fanotify::FileWatch::on_mounts(&paths) {
        Ok(w) => Some(Box::new(Watch(w))),
        Err(e) => {
            tracing::warn!("files read and written are listed by their times only: {e}");
            None
        }
    }
}

/// The sandbox's watch, as the relay takes it.
#[derive(Debug)]
struct Watch(mcpbox_sandbox::fanotify::FileWatch);

impl mcpbox_gateway::touched::FileEvents for Watch {
    fn fd(&self) -> std::os::fd::BorrowedFd<'_> {
        self.0.fd()
    }
    fn drain(&self, each: &mut dyn FnMut(mcpbox_gateway::touched::Access)) -> bool {
        self.0.drain(|file, path, written| {
            each(mcpbox_gateway::touched::Access {
                file,
                path: mcpbox_gateway::written::display(&path),
                written,
            })
        })
    }
}

/// The buffer asked for mcpbox's stdout when it is a pipe (the default
/// /proc/sys/fs/pipe-max-size).
const HOST_PIPE_SIZE: usize = 1 << 20;

/// Grows mcpbox's stdout, when it is a pipe, to [`HOST_PIPE_SIZE`], once:
/// a large result then reaches the host in a sixteenth of the wake-ups
/// (64 KiB is the kernel's default). The pipe is the host's; it may be
/// refused (EPERM past pipe-max-size or the user's pipe-user-pages-soft,
/// EBADF/EINVAL when stdout is a file or a terminal), and then it keeps
/// the size it has: an optimisation only.
fn grow_host_stdout() {
    static ONCE: std::sync::Once = std::sync::Once::new();
    ONCE.call_once(|| {
        let _ = rustix::pipe::fcntl_setpipe_size(std::io::stdout(), HOST_PIPE_SIZE);
    });
}

/// Process control over a whole sandbox: its init forwards SIGTERM to the
/// server's process group, and SIGKILL of the init (and of the helper)
/// empties the namespace.
pub struct Control(pub Sandbox);

fn exit_info(s: Status) -> ExitInfo {
    match s {
        Status::Exited(c) | Status::OutOfMemory(c) if c > 128 && c < 128 + 65 => ExitInfo {
            code: None,
            signal: Some(c - 128),
        },
        Status::Exited(c) | Status::OutOfMemory(c) => ExitInfo {
            code: Some(c),
            signal: None,
        },
        Status::TimedOut => ExitInfo {
            code: Some(124),
            signal: None,
        },
    }
}

impl ProcessControl for Control {
    fn terminate(&mut self) -> std::io::Result<()> {
        self.0.signal(libc::SIGTERM);
        Ok(())
    }
    fn kill(&mut self) -> std::io::Result<()> {
        self.0.kill();
        Ok(())
    }
    fn try_wait(&mut self) -> std::io::Result<Option<ExitInfo>> {
        self.0
            .try_wait()
            .map(|s| s.map(exit_info))
            .map_err(std::io::Error::other)
    }
    fn wait(&mut self) -> std::io::Result<ExitInfo> {
        self.0.wait().map(exit_info).map_err(std::io::Error::other)
    }
}
