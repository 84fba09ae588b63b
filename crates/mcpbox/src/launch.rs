//! How a relay's server starts in a sandbox of this machine: [`spawn`]
//! (the sandbox, its pipes, its file watch), [`Control`] (the gateway's
//! `ProcessControl` over it), and for `mcpbox run` [`SandboxLauncher`]
//! (the gateway's `Launcher`). `serve` starts its servers through the
//! lifecycle's `Backend` (`lifecycle::backend::Launch`), whose local
//! backend calls [`spawn`].
//!
//! `run` and `serve` are multi-threaded, so every sandbox, the first and
//! each restart after a secret's TTL, starts through the single-threaded
//! sandbox helper (`mcpbox_sandbox::helper`); no thread of ours ever forks
//! a sandbox process.

use std::ffi::OsString;
use std::sync::atomic::{AtomicI32, Ordering};
use std::sync::Arc;

use mcpbox_gateway::{ExitInfo, Launcher, ProcessControl, ServerProcess};
use mcpbox_sandbox::{Sandbox, Spec, Status};

/// Starts the server in a fresh sandbox with the given extra environment.
pub struct SandboxLauncher {
    pub spec: Spec,
    /// The current sandbox's init pid, for the signal thread (under
    /// gVisor, runsc's: its death ends the sandbox).
    pub current: Arc<AtomicI32>,
    /// `[sandbox] isolation = "gvisor"`: each sandbox is runsc's
    /// (crate::gvisor), not this machine's namespaces.
    pub gvisor: bool,
}

impl Launcher for SandboxLauncher {
    fn launch(&mut self, env: &[(String, String)]) -> std::io::Result<ServerProcess> {
        let spec = with_env(&self.spec, env);
        let (server, init) = if self.gvisor {
            {
                let (server, init, _) = crate::gvisor::spawn(&spec, None, None)?;
                (server, init)
            }
        } else {
            spawn(&spec)?
        };
        self.current.store(init, Ordering::SeqCst);
        Ok(server)
    }
}

/// `spec` with `env` (a launch's secrets) added, each replacing a
/// variable of the same name.
pub fn with_env(spec: &Spec, env: &[(String, String)]) -> Spec {
    let mut spec = spec.clone();
    for (k, v) in env {
        let key = OsString::from(k);
        spec.env.retain(|(name, _)| *name != key);
        spec.env.push((key, v.into()));
    }
    spec
}

/// Starts `spec`'s server in a fresh sandbox of this machine: its stdio,
/// its control, its file watch, and its init's pid (for a signal thread).
pub fn spawn(spec: &Spec) -> std::io::Result<(ServerProcess, libc::pid_t)> {
    // The sandbox error stays inside the io::Error, so its step and
    // exit code reach main (crate::Failure).
    let mut sb = mcpbox_sandbox::helper::spawn(spec).map_err(std::io::Error::other)?;
    grow_host_stdout();
    for note in &sb.notes {
        tracing::warn!("{note}");
    }
    let init = sb.init_pid();
    let (Some(stdin), Some(stdout), Some(stderr)) =
        (sb.stdin.take(), sb.stdout.take(), sb.stderr.take())
    else {
        return Err(std::io::Error::other("sandbox started without pipes"));
    };
    let files = watch_files(spec, init);
    // the programs it executes, for `learn` only (a no-op otherwise)
    crate::learn::execs::watch(spec, init);
    let tier = Some(sb.tier());
    let server = ServerProcess {
        stdin: Box::new(stdin),
        stdout: Box::new(stdout),
        stderr: Box::new(stderr),
        control: Box::new(Control(sb)),
        files,
        tier,
    };
    Ok((server, init))
}

/// The kernel's watch on the files the server reads and writes
/// (`mcpbox_sandbox::fanotify`):
///
/// - as root, mount marks on the sandbox's input, output and writable
///   policy mounts, reached through its init's root (reads and writes, the
///   sandbox's only), and inode marks on every directory of the writable
///   ones (renames and removals, which mount marks cannot report);
/// - rootless (the kernel refuses mount marks), inode marks on every
///   directory of all of them, for reads and writes too.
///
/// `None` in the degraded tier (no mounts of its own, init < 0), with
/// nothing mounted, or when the kernel refuses both (the relay then lists
/// written files by their times).
fn watch_files(spec: &Spec, init: libc::pid_t) -> Option<mcpbox_gateway::touched::FileWatch> {
    use mcpbox_sandbox::fanotify::{DirRoot, DirWatch, FileWatch};
    if init <= 0 {
        return None;
    }
    // (host path, the sandbox's name, writable); read-only policy mounts
    // are left out: mostly the server's own installation (node_modules, a
    // venv), whose loads are no record's
    let mut trees: Vec<(std::path::PathBuf, std::path::PathBuf, bool)> = Vec::new();
    if let Some(input) = &spec.input {
        trees.push((input.clone(), "/workspace/input".into(), false));
    }
    if let Some(output) = &spec.output {
        trees.push((output.clone(), "/workspace/output".into(), true));
    }
    for m in spec.mounts.iter().filter(|m| m.writable) {
        trees.push((m.host.clone(), m.at.clone(), true));
    }
    if trees.is_empty() {
        return None;
    }
    let mut mounts = None;
    if mcpbox_sandbox::is_host_root() {
        let root = std::path::PathBuf::from(format!("/proc/{init}/root"));
        let paths: Vec<_> = trees
            .iter()
            .map(|(_, at, _)| root.join(at.strip_prefix("/").unwrap_or(at)))
            .collect();
        match FileWatch::on_mounts(&paths) {
            Ok(w) => mounts = Some(w),
            Err(e) => tracing::warn!("files are watched by directory, not by mount: {e}"),
        }
    }
    // with the mount marks, the directories only for what happens to
    // their entries, and only where the server may change them
    let accesses = mounts.is_none();
    let roots: Vec<DirRoot> = trees
        .into_iter()
        .filter(|(_, _, writable)| accesses || *writable)
        .map(|(host, sandbox, _)| DirRoot { host, sandbox })
        .collect();
    let mut dirs = None;
    if !roots.is_empty() {
        match DirBudget::take(accesses) {
            None => tracing::warn!(
                "renames and removals of files are not recorded for this sandbox: \
                 {} sandboxes of this process already use a second fanotify group, a \
                 quarter of fs.fanotify.max_user_groups (raise it with sysctl for more)",
                DIR_WATCHES.load(Ordering::SeqCst)
            ),
            Some(budget) => match DirWatch::on_trees(&roots, accesses) {
                Ok(w) => dirs = Some((w, budget)),
                Err(e) => tracing::warn!("renames and removals of files are not recorded: {e}"),
            },
        }
    }
    if mounts.is_none() && dirs.is_none() {
        tracing::warn!("files read and written are listed by their times only");
        return None;
    }
    // nothing writable: nothing to rename or remove
    let renames = dirs.is_some() || roots.is_empty();
    Some(Box::new(Watch {
        mounts,
        dirs,
        renames,
    }))
}

/// Directory watches alive in this process as a second group beside
/// mount marks (as root).
static DIR_WATCHES: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(0);

/// A share of the user's fanotify groups (fs.fanotify.max_user_groups,
/// 128 by default, counted over all of the user's processes): as root each
/// sandbox's reads and writes take one group (mount marks) and its renames
/// and removals a second (directory marks), so the second is given only
/// while a quarter of the limit is not used by this process's second
/// groups; a `serve` with many sessions keeps the reads and writes of
/// three times as many. Rootless the directory watch is the only group
/// and always tried.
#[derive(Debug)]
struct DirBudget {
    /// Counted in [`DIR_WATCHES`] (not when it is the only group).
    counted: bool,
}

impl DirBudget {
    fn take(only_group: bool) -> Option<DirBudget> {
        if only_group {
            return Some(DirBudget { counted: false });
        }
        let max = std::fs::read_to_string("/proc/sys/fs/fanotify/max_user_groups")
            .ok()
            .and_then(|t| t.trim().parse::<usize>().ok())
            .unwrap_or(128);
        let taken = DIR_WATCHES.fetch_add(1, Ordering::SeqCst);
        if taken < max / 4 {
            Some(DirBudget { counted: true })
        } else {
            DIR_WATCHES.fetch_sub(1, Ordering::SeqCst);
            None
        }
    }
}

impl Drop for DirBudget {
    fn drop(&mut self) {
        if self.counted {
            DIR_WATCHES.fetch_sub(1, Ordering::SeqCst);
        }
    }
}

/// The sandbox's watches, as the relay takes them.
#[derive(Debug)]
struct Watch {
    mounts: Option<mcpbox_sandbox::fanotify::FileWatch>,
    /// The directory watch, and its share of the fanotify groups (given
    /// back when it goes).
    dirs: Option<(mcpbox_sandbox::fanotify::DirWatch, DirBudget)>,
    /// Renames and removals are watched (or nothing is writable).
    renames: bool,
}

impl mcpbox_gateway::touched::FileEvents for Watch {
    fn fds(&self) -> [Option<std::os::fd::BorrowedFd<'_>>; 2] {
        [
            self.mounts.as_ref().map(|w| w.fd()),
            self.dirs.as_ref().map(|(w, _)| w.fd()),
        ]
    }

    fn drain(&mut self, each: &mut dyn FnMut(mcpbox_gateway::touched::Access)) -> bool {
        use mcpbox_gateway::touched::Access;
        use mcpbox_gateway::written::display;
        use mcpbox_sandbox::fanotify::DirEvent;
        let mut lost = false;
        // the mount marks' reads and writes first: a rename drained after
        // them finds the file under the name it had
        if let Some(w) = &self.mounts {
            lost |= w.drain(|e| {
                let path = display(&e.path);
                let removed = e.removed.then(|| path.clone());
                each(Access::File {
                    file: e.file,
                    path,
                    written: e.written,
                });
                // removed before the queue was read (its directory may have
                // gone unwatched): known from the file itself
                if let Some(path) = removed {
                    each(Access::Deleted { path });
                }
            });
        }
        if let Some((w, _)) = &mut self.dirs {
            lost |= w.drain(|e| {
                each(match e {
                    DirEvent::Access {
                        file,
                        path,
                        written,
                    } => Access::File {
                        file,
                        path: display(&path),
                        written,
                    },
                    DirEvent::Moved { from, to, file } => Access::Moved {
                        from: display(&from),
                        to: display(&to),
                        file,
                    },
                    DirEvent::Deleted { path } => Access::Deleted {
                        path: display(&path),
                    },
                })
            });
        }
        lost
    }

    fn mode(&self) -> &'static str {
        if self.mounts.is_some() {
            "kernel"
        } else {
            "kernel-dirs"
        }
    }

    fn unwatched(&self) -> usize {
        self.dirs.as_ref().map_or(0, |(w, _)| w.unwatched())
    }

    fn renames(&self) -> bool {
        self.renames
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn many_sandboxes_as_root_keep_their_mount_marks_before_their_directory_marks() {
        let max = std::fs::read_to_string("/proc/sys/fs/fanotify/max_user_groups")
            .ok()
            .and_then(|t| t.trim().parse::<usize>().ok())
            .unwrap_or(128);
        let held: Vec<_> = (0..max / 4).map(|_| DirBudget::take(false)).collect();
        assert!(held.iter().all(Option::is_some), "a quarter is given");
        assert!(DirBudget::take(false).is_none(), "and no more");
        // rootless the directory watch is the only group: always tried
        assert!(DirBudget::take(true).is_some());
        drop(held);
        assert!(DirBudget::take(false).is_some(), "given back when dropped");
    }
}
