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
//!   cannot have been reused by then.
//! - **Supervisor**: a process group does not hold a process that leaves
//!   it on purpose (setsid(2), a double fork into a new session). So the
//!   binary registers itself ([`set_supervisor`]) and each command then
//!   runs under `mcpbox __host-command` ([`supervisor_main`]), a small
//!   process that makes itself the child subreaper of everything the
//!   command starts (prctl(2) `PR_SET_CHILD_SUBREAPER`): an orphan,
//!   whatever its session or group, is re-parented to it, not to init.
//!   When the command ends, or when mcpbox lets go of it (mcpbox closes
//!   the read end of a pipe the supervisor holds as its stderr: at the
//!   command's timeout, at its output limit, and when mcpbox exits for
//!   any reason, `kill -9` included, since the kernel closes the pipe
//!   then), the supervisor kills the command's group and then, round
//!   after round, every process re-parented to it, until it has no child
//!   left. No signal handler is needed: the supervisor only polls its
//!   pipe and waits for its children. mcpbox's own group kill stays as
//!   the backstop, after [`GRACE`].
//! - **stdio**: stdin is `/dev/null` unless the caller gives bytes; stdout
//!   is captured (up to a limit) or discarded; stderr is discarded.
//!
//! The caller gets an [`Outcome`]: how the command ended, which is what
//! the audit records (never a value, never the output).

use std::ffi::OsString;
use std::io::{self, Read, Write};
use std::os::fd::AsFd;
use std::os::unix::process::{CommandExt, ExitStatusExt};
use std::path::PathBuf;
use std::process::{Child, Command, ExitStatus, Stdio};
use std::sync::{Mutex, OnceLock};
use std::time::{Duration, Instant};

use rustix::process::{Pid, Signal, WaitId, WaitIdOptions, WaitOptions};

/// The variables a host command gets from mcpbox's environment, when set:
/// where to find programs, whose home (the config of `gh`, `op`, ...),
/// and the language of its messages.
pub const INHERITED: [&str; 3] = ["PATH", "HOME", "LANG"];

/// How often a command without captured output is checked on (and how
/// often the supervisor looks at its pipe).
const TICK: Duration = Duration::from_millis(20);

/// How long mcpbox waits for a supervisor it let go of to finish killing
/// what the command started, before it kills the supervisor's group.
pub const GRACE: Duration = Duration::from_secs(5);

/// The first argument that makes the binary a supervisor
/// ([`supervisor_main`]).
pub const SUPERVISOR_ARG: &str = "__host-command";

/// The program that supervises host commands, once registered.
static SUPERVISOR: OnceLock<PathBuf> = OnceLock::new();

/// Registers `program` (the mcpbox binary, which dispatches
/// [`SUPERVISOR_ARG`] to [`supervisor_main`]) as the supervisor of every
/// host command run after this. Without it (a library's own tests),
/// commands run without one, held by their process group only.
pub fn set_supervisor(program: PathBuf) {
    let _ = SUPERVISOR.set(program);
}

/// A command to run on the host.
#[derive(Debug, Clone)]
pub struct HostCommand {
    argv: Vec<String>,
    env: Vec<(String, String)>,
    stdin: Option<Vec<u8>>,
    capture: Option<usize>,
    timeout: Duration,
    supervised: bool,
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
            supervised: true,
        })
    }

    /// Runs it without a supervisor: only for mcpbox's own children that
    /// start nothing (the command-line checker), where the supervisor
    /// would be one more process start per check for nothing.
    pub fn unsupervised(mut self) -> HostCommand {
        self.supervised = false;
        self
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
    /// process group of its own, stdio as asked. `term_first`: a daemon's
    /// supervisor asks it to end (SIGTERM) before it kills.
    fn command(&self, term_first: bool) -> Command {
        let supervisor = self.supervisor();
        let mut cmd = match supervisor {
            Some(program) => {
                let mut cmd = Command::new(program);
                cmd.arg(SUPERVISOR_ARG);
                if term_first {
                    cmd.arg(TERM_FIRST_ARG);
                }
                cmd.arg("--").args(&self.argv);
                cmd
            }
            None => {
                let mut cmd = Command::new(&self.argv[0]);
                cmd.args(&self.argv[1..]);
                cmd
            }
        };
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
        // the supervisor's stderr is its leash (see the module's doc);
        // the command's own stderr is discarded by the supervisor
        cmd.stderr(if supervisor.is_some() {
            Stdio::piped()
        } else {
            Stdio::null()
        });
        cmd
    }

    /// The supervisor this command runs under, if any.
    fn supervisor(&self) -> Option<&'static PathBuf> {
        if self.supervised {
            SUPERVISOR.get()
        } else {
            None
        }
    }

    /// Runs it to its end or its timeout; its process group is gone when
    /// this returns. An error only when it could not be started.
    pub fn run(&self) -> io::Result<Outcome> {
        let mut child = self.command(false).spawn()?;
        let pid = Pid::from_child(&child);
        RUNNING
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .push((pid, self.supervisor().is_some()));
        let result = self.watch(&mut child, pid);
        // A supervisor ends on its own once the command did, after killing
        // what it left; otherwise it is let go of here (its pipe closed)
        // and given GRACE to kill everything the command started.
        let leash = child.stderr.take();
        let mut not_started = None;
        if let Some(mut leash) = leash {
            if matches!(result, Ok((Stop::Exited, _))) {
                not_started = start_failure(&mut leash);
            } else {
                drop(leash);
                let _ = wait_exit(pid, GRACE);
            }
        }
        // Killed while the leader is unreaped (a zombie at worst), so the
        // group id is still ours: leftovers of a finished command, or all
        // of one that timed out (or whose watch failed), die here.
        kill_group(pid);
        RUNNING
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .retain(|(p, _)| *p != pid);
        let status = child.wait();
        if let Some(e) = not_started {
            return Err(e);
        }
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
        let mut exit_fd = exit_fd(pid);
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
            let exited = exit_fd.waited(|| {
                rustix::process::waitid(
                    WaitId::Pid(pid),
                    WaitIdOptions::EXITED | WaitIdOptions::NOHANG | WaitIdOptions::NOWAIT,
                )
            })?;
            if exited.is_some() {
                return Ok((Stop::Exited, out));
            }
            let left = deadline.saturating_duration_since(Instant::now());
            if left.is_zero() {
                return Ok((Stop::TimedOut, out));
            }
            // woken early by output, its end, or the leader's exit
            let stdout = child.stdout.as_ref().filter(|_| open).map(|r| r.as_fd());
            wait_for(&[exit_fd.fd(), stdout], left.min(TICK))?;
        }
    }

    /// Starts it as a daemon: it runs, with no timeout, until
    /// [`Daemon::stop`] (or the `Daemon`'s drop, or mcpbox's exit, `kill
    /// -9` included) lets go of it. Then it is asked to end first
    /// (SIGTERM to its group: a filesystem daemon unmounts and writes
    /// what it holds), and after [`TERM_GRACE`] everything it started is
    /// killed, as for any host command. Its stdout is discarded (no
    /// capture), its stdin `/dev/null`.
    pub fn start_daemon(&self) -> io::Result<Daemon> {
        let mut plain = self.clone();
        plain.stdin = None;
        plain.capture = None;
        let mut child = plain.command(true).spawn()?;
        let pid = Pid::from_child(&child);
        let supervised = plain.supervisor().is_some();
        RUNNING
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .push((pid, supervised));
        let leash = child.stderr.take();
        Ok(Daemon {
            child,
            pid,
            leash,
            supervised,
        })
    }
}

/// How long a daemon let go of has to end on SIGTERM before its
/// supervisor kills everything it started (within [`GRACE`], which is
/// how long mcpbox waits for the supervisor).
pub const TERM_GRACE: Duration = Duration::from_secs(3);

/// The supervisor's option that makes it end its command with SIGTERM,
/// then [`TERM_GRACE`], then SIGKILL (a daemon's), instead of SIGKILL.
const TERM_FIRST_ARG: &str = "--term-first";

/// A host command started by [`HostCommand::start_daemon`].
pub struct Daemon {
    child: Child,
    pid: Pid,
    /// The supervisor's stderr: closing it lets go of the daemon.
    leash: Option<std::process::ChildStderr>,
    supervised: bool,
}

impl Daemon {
    /// Whether it has ended on its own (left unreaped, so its group id
    /// stays ours until [`Daemon::stop`]).
    pub fn exited(&self) -> bool {
        matches!(
            rustix::process::waitid(
                WaitId::Pid(self.pid),
                WaitIdOptions::EXITED | WaitIdOptions::NOHANG | WaitIdOptions::NOWAIT,
            ),
            Ok(Some(_)) | Err(_)
        )
    }

    /// Waits up to `limit` for it to end on its own; whether it did.
    pub fn wait_exit(&self, limit: Duration) -> bool {
        wait_exit(self.pid, limit)
    }

    /// Lets go of it and waits until it and everything it started are
    /// gone: how it ended, or the error that kept it from starting.
    pub fn stop(mut self) -> io::Result<Ended> {
        self.end()
    }

    fn end(&mut self) -> io::Result<Ended> {
        let mut not_started = None;
        match self.leash.take() {
            Some(mut leash) if self.exited() => not_started = start_failure(&mut leash),
            Some(leash) => {
                drop(leash);
                let _ = wait_exit(self.pid, GRACE);
            }
            None if !self.supervised && !self.exited() => {
                // no supervisor to ask it: asked here, the same way
                let _ = rustix::process::kill_process_group(self.pid, Signal::TERM);
                let _ = wait_exit(self.pid, TERM_GRACE);
            }
            None => {}
        }
        kill_group(self.pid);
        RUNNING
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .retain(|(p, _)| *p != self.pid);
        let status = self.child.wait()?;
        match not_started {
            Some(e) => Err(e),
            None => Ok(ended(status)),
        }
    }
}

impl Drop for Daemon {
    fn drop(&mut self) {
        if self.leash.is_some() || self.child.try_wait().ok().flatten().is_none() {
            let _ = self.end();
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

/// What a supervisor that has exited wrote on its leash: `E<errno>` when
/// it could not start the command (then the error), nothing otherwise.
fn start_failure(leash: &mut impl Read) -> Option<io::Error> {
    let mut text = Vec::new();
    let _ = leash.take(64).read_to_end(&mut text);
    let text = String::from_utf8_lossy(&text);
    let errno = text.strip_prefix('E')?.trim().parse::<i32>().ok()?;
    Some(io::Error::from_raw_os_error(errno))
}

/// A descriptor of child `pid` that polls readable once it has exited
/// (pidfd_open(2), Linux 5.3), so a wait ends when the process does
/// rather than at the next [`TICK`]; `None` where the kernel has none
/// (then the waits below fall back to sleeping a tick).
fn exit_fd(pid: Pid) -> ExitFd {
    ExitFd(rustix::process::pidfd_open(pid, rustix::process::PidfdFlags::empty()).ok())
}

/// A command's pidfd (pidfd_open(2)), which polls readable once it has
/// exited: the waits below poll it so that they wake at once instead of
/// at the next [`TICK`]. None where the kernel has no pidfds (the waits
/// tick), or once it was found useless (see [`ExitFd::waited`]).
struct ExitFd(Option<std::os::fd::OwnedFd>);

impl ExitFd {
    fn fd(&self) -> Option<std::os::fd::BorrowedFd<'_>> {
        self.0.as_ref().map(|f| f.as_fd())
    }

    /// Runs `wait`, a look for the command's exit that does not block, and
    /// returns what it found. When the pidfd had said, just before, that
    /// the command exited and the look found nothing, that is an exit this
    /// process cannot wait for: a leader ptraced by another process is a
    /// zombie only its tracer can wait for (wait(2): "a zombie ptracee is
    /// only visible to its ptracer") while its pidfd stays readable, so
    /// polling it would return at once, round after round, at full CPU.
    /// The pidfd then goes; the waits tick, as without pidfds, until the
    /// tracer lets go.
    fn waited<T, E>(
        &mut self,
        wait: impl FnOnce() -> Result<Option<T>, E>,
    ) -> Result<Option<T>, E> {
        let fired = self.fired();
        let found = wait();
        if fired && matches!(found, Ok(None)) {
            self.0 = None;
        }
        found
    }

    /// Whether the pidfd says the command exited now (a poll that does
    /// not wait).
    fn fired(&self) -> bool {
        let Some(fd) = &self.0 else { return false };
        let mut fds = [rustix::event::PollFd::new(fd, rustix::event::PollFlags::IN)];
        let zero = rustix::event::Timespec {
            tv_sec: 0,
            tv_nsec: 0,
        };
        matches!(rustix::event::poll(&mut fds, Some(&zero)), Ok(n) if n > 0)
    }
}

/// Waits up to `wait` (under a second) for one of `fds` to poll readable
/// or hung up; sleeps `wait` when there is none. Interrupted is not an
/// error: the caller looks at everything again anyway.
fn wait_for(fds: &[Option<std::os::fd::BorrowedFd<'_>>], wait: Duration) -> io::Result<()> {
    let mut polled: Vec<rustix::event::PollFd<'_>> = fds
        .iter()
        .flatten()
        .map(|fd| rustix::event::PollFd::new(fd, rustix::event::PollFlags::IN))
        .collect();
    if polled.is_empty() {
        std::thread::sleep(wait);
        return Ok(());
    }
    let ts = rustix::event::Timespec {
        tv_sec: 0,
        tv_nsec: i64::from(wait.min(Duration::from_millis(999)).subsec_nanos()),
    };
    match rustix::event::poll(&mut polled, Some(&ts)) {
        Ok(_) | Err(rustix::io::Errno::INTR) => Ok(()),
        Err(e) => Err(e.into()),
    }
}

/// Waits up to `limit` for child `pid` to exit (left unreaped); whether
/// it did.
fn wait_exit(pid: Pid, limit: Duration) -> bool {
    let until = Instant::now() + limit;
    let mut exit_fd = exit_fd(pid);
    loop {
        match exit_fd.waited(|| {
            rustix::process::waitid(
                WaitId::Pid(pid),
                WaitIdOptions::EXITED | WaitIdOptions::NOHANG | WaitIdOptions::NOWAIT,
            )
        }) {
            Ok(Some(_)) => return true,
            Ok(None) => {}
            Err(_) => return false,
        }
        let left = until.saturating_duration_since(Instant::now());
        if left.is_zero() {
            return false;
        }
        if wait_for(&[exit_fd.fd()], left.min(TICK)).is_err() {
            std::thread::sleep(left.min(TICK));
        }
    }
}

/// The supervisor (`mcpbox __host-command -- ARGV...`, started by
/// [`HostCommand::run`] when a supervisor is registered): starts ARGV with
/// the environment and stdin/stdout it was given, adopts every orphan of
/// the command's tree, and when the command ends or its stderr pipe (the
/// leash) loses its reader, kills the command's group and every process
/// re-parented to it. Exits as the command did: its code, or the signal
/// that killed it. With `--term-first` before `--` (a daemon's,
/// [`HostCommand::start_daemon`]), a command let go of gets SIGTERM and
/// [`TERM_GRACE`] to end before the kill.
pub fn supervisor_main(args: &[OsString]) -> u8 {
    let (term_first, args) = match args.split_first() {
        Some((first, rest)) if first == TERM_FIRST_ARG => (true, rest),
        _ => (false, args),
    };
    let Some((dash, argv)) = args.split_first() else {
        return 125;
    };
    if dash != "--" || argv.is_empty() {
        return 125;
    }
    let me = rustix::process::getpid();
    // prctl(2) PR_SET_CHILD_SUBREAPER: orphans of any depth, in any session
    // or group, become this process's children, not init's
    if rustix::process::set_child_subreaper(Some(me)).is_err() {
        return 125;
    }
    let leash = io::stderr();
    let child = Command::new(&argv[0])
        .args(&argv[1..])
        .process_group(0)
        .stderr(Stdio::null())
        .spawn();
    let child = match child {
        Ok(c) => c,
        Err(e) => {
            let _ = write!(leash.lock(), "E{}", e.raw_os_error().unwrap_or(0));
            return 127;
        }
    };
    let cpid = Pid::from_child(&child);
    let mut exit_fd = exit_fd(cpid);
    let status = loop {
        if let Ok(Some(status)) = reap_watched(&mut exit_fd, cpid) {
            break Some(status);
        }
        if leash_dropped(&leash, exit_fd.fd()) {
            break None;
        }
    };
    if status.is_none() && term_first {
        // a daemon let go of: asked to end (a FUSE daemon unmounts and
        // writes back what it holds), killed below if it has not within
        // TERM_GRACE
        let _ = rustix::process::kill_process_group(cpid, Signal::TERM);
        let until = Instant::now() + TERM_GRACE;
        while Instant::now() < until {
            if let Ok(Some(_)) = reap_watched(&mut exit_fd, cpid) {
                break;
            }
            if wait_for(&[exit_fd.fd()], TICK).is_err() {
                std::thread::sleep(TICK);
            }
        }
    }
    // what the command left running (its group, then every orphan)
    let _ = rustix::process::kill_process_group(cpid, Signal::KILL);
    sweep();
    let Some(status) = status else {
        // let go of by mcpbox: it decided how the command ended
        return 125;
    };
    if let Some(code) = status.exit_status() {
        return u8::try_from(code & 0xff).unwrap_or(1);
    }
    if let Some(sig) = status.terminating_signal() {
        // ended the same way, so that mcpbox sees the signal (a core
        // dump of the supervisor would be noise)
        let _ = rustix::process::setrlimit(
            rustix::process::Resource::Core,
            rustix::process::Rlimit {
                current: Some(0),
                maximum: Some(0),
            },
        );
        if let Some(s) = FATAL.iter().find(|s| s.as_raw() == sig) {
            let _ = rustix::process::kill_process(me, *s);
        }
        return u8::try_from((128 + sig) & 0xff).unwrap_or(1);
    }
    1
}

/// The signals whose default action ends a process, to re-raise.
const FATAL: [Signal; 18] = [
    Signal::HUP,
    Signal::INT,
    Signal::QUIT,
    Signal::ILL,
    Signal::TRAP,
    Signal::ABORT,
    Signal::BUS,
    Signal::FPE,
    Signal::KILL,
    Signal::USR1,
    Signal::SEGV,
    Signal::USR2,
    Signal::PIPE,
    Signal::ALARM,
    Signal::TERM,
    Signal::XCPU,
    Signal::XFSZ,
    Signal::SYS,
];

/// [`reap_until`] as a look of [`ExitFd::waited`].
fn reap_watched(
    exit_fd: &mut ExitFd,
    cpid: Pid,
) -> Result<Option<rustix::process::WaitStatus>, std::convert::Infallible> {
    exit_fd.waited(|| Ok(reap_until(cpid)))
}

/// Reaps whatever has ended among this process's children (adopted
/// orphans included); the command's status once it is among them.
fn reap_until(cpid: Pid) -> Option<rustix::process::WaitStatus> {
    loop {
        match rustix::process::wait(WaitOptions::NOHANG) {
            Ok(Some((pid, status))) if pid == cpid => return Some(status),
            Ok(Some(_)) => continue,
            Ok(None) | Err(_) => return None,
        }
    }
}

/// Waits up to [`TICK`] for the leash (stderr, a pipe's write end) to
/// lose its reader: poll(2) reports `POLLERR` on such a pipe, whatever
/// the events asked for. Whether it did (or stderr is not usable). Ends
/// early, with false, when `exit_fd` (the command's pidfd) says the
/// command exited: the caller reaps it at once instead of a tick later.
fn leash_dropped(leash: &io::Stderr, exit_fd: Option<std::os::fd::BorrowedFd<'_>>) -> bool {
    let ts = rustix::event::Timespec {
        tv_sec: 0,
        tv_nsec: i64::from(TICK.subsec_nanos()),
    };
    let mut fds = vec![rustix::event::PollFd::new(
        leash,
        rustix::event::PollFlags::empty(),
    )];
    if let Some(fd) = &exit_fd {
        fds.push(rustix::event::PollFd::new(fd, rustix::event::PollFlags::IN));
    }
    match rustix::event::poll(&mut fds, Some(&ts)) {
        Ok(0) | Err(rustix::io::Errno::INTR) => false,
        Ok(_) => !fds[0].revents().is_empty(),
        Err(_) => true,
    }
}

/// Kills every child of this process (adopted orphans: the subreaper's)
/// and reaps them, round after round, until none is left: a killed
/// process's own children are re-parented here for the next round.
fn sweep() {
    let me = rustix::process::getpid();
    // bounded: a tree re-parents one level per round
    for _ in 0..10_000 {
        for pid in children_of(me) {
            let _ = rustix::process::kill_process(pid, Signal::KILL);
        }
        loop {
            match rustix::process::wait(WaitOptions::NOHANG) {
                Ok(Some(_)) => continue,
                Ok(None) => break,
                // ECHILD: nothing left
                Err(_) => return,
            }
        }
        std::thread::sleep(Duration::from_millis(1));
    }
}

/// The processes whose parent is `me`, from `/proc/<pid>/stat` (field 4,
/// ppid; proc(5)).
fn children_of(me: Pid) -> Vec<Pid> {
    let Ok(dir) = std::fs::read_dir("/proc") else {
        return Vec::new();
    };
    let mut out = Vec::new();
    for entry in dir.flatten() {
        let Some(pid) = entry
            .file_name()
            .to_str()
            .and_then(|n| n.parse::<i32>().ok())
            .and_then(Pid::from_raw)
        else {
            continue;
        };
        let Ok(stat) = std::fs::read_to_string(entry.path().join("stat")) else {
            continue;
        };
        let ppid = mcpbox_policy::procfs::stat_field(&stat, 4).and_then(|p| p.parse::<i32>().ok());
        if ppid == Some(me.as_raw_nonzero().get()) {
            out.push(pid);
        }
    }
    out
}

/// SIGKILL to the whole group `pid` leads (gone already: fine).
fn kill_group(pid: Pid) {
    match rustix::process::kill_process_group(pid, Signal::KILL) {
        Ok(()) | Err(rustix::io::Errno::SRCH) => {}
        Err(e) => tracing::warn!("host command: killing process group {pid:?}: {e}"),
    }
}

/// The process groups of the host commands running now, and whether a
/// supervisor leads each: in this list from its spawn until it was
/// killed, before its leader is reaped.
static RUNNING: Mutex<Vec<(Pid, bool)>> = Mutex::new(Vec::new());

/// Kills the process group of every host command still running without a
/// supervisor: called when mcpbox exits (its threads waiting for them are
/// not waited for). A supervised one is not killed here: a SIGKILL would
/// end its supervisor before its sweep; mcpbox's exit closes its leash,
/// and the supervisor then kills all the command started.
pub fn kill_running() {
    let running = RUNNING.lock().unwrap_or_else(|p| p.into_inner());
    for (pid, supervised) in running.iter() {
        if !supervised {
            kill_group(*pid);
        }
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

    /// The CPU ticks (user + system) of the calling thread so far.
    fn thread_ticks() -> u64 {
        let stat = std::fs::read_to_string("/proc/thread-self/stat").unwrap();
        let after = stat.rsplit_once(')').unwrap().1;
        let f: Vec<&str> = after.split_whitespace().collect();
        // after the comm: state(3) ... utime(14) stime(15)
        f[11].parse::<u64>().unwrap() + f[12].parse::<u64>().unwrap()
    }

    #[test]
    fn a_command_whose_zombie_is_held_by_its_tracer_does_not_make_the_wait_spin() {
        // The command's child seizes it with ptrace(2) and holds on for
        // 1.5 s after the command exits: the command is then a zombie
        // that only its tracer can wait for, while its pidfd polls
        // readable. A wait that kept polling the pidfd would spin at full
        // CPU for those 1.5 s.
        let script = r#"
import ctypes, os, sys, time
libc = ctypes.CDLL(None, use_errno=True)
r, w = os.pipe()
if os.fork() == 0:
    ok = libc.ptrace(0x4206, os.getppid(), None, None)  # PTRACE_SEIZE
    os.write(w, b"y" if ok == 0 else b"n")
    time.sleep(1.5)
    os._exit(0)
print(os.read(r, 1).decode(), flush=True)
"#;
        let argv = vec!["/usr/bin/python3".into(), "-c".into(), script.into()];
        let cmd = HostCommand::new(&argv, Duration::from_secs(20))
            .unwrap()
            .capture(64);
        let before = thread_ticks();
        let start = Instant::now();
        let out = run(cmd);
        let ticks = thread_ticks() - before;
        let took = start.elapsed();
        let said = String::from_utf8_lossy(&out.stdout).trim().to_string();
        if said == "n" {
            eprintln!("skipped: ptrace(PTRACE_SEIZE) of the parent is refused here");
            return;
        }
        assert_eq!(said, "y", "{:?}", out.ended);
        assert!(out.ended.success(), "{:?}", out.ended);
        assert!(
            took >= Duration::from_secs(1),
            "the tracer let go early: {took:?}"
        );
        // a tick is 10 ms (USER_HZ 100): a spinning wait takes ~150 of them
        assert!(ticks < 50, "the wait took {ticks} ticks of CPU in {took:?}");
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
    fn a_daemon_runs_until_let_go_of_then_is_asked_to_end_and_its_children_die() {
        let dir = tempfile::tempdir().unwrap();
        let said = dir.path().join("said");
        let child = dir.path().join("child");
        // it leaves a background child that ignores SIGTERM: the kill after
        // the grace takes it
        let script = format!(
            "trap 'echo term > {}; exit 0' TERM; (trap '' TERM; exec sleep 1000) & echo $! > {}; while :; do sleep 0.02; done",
            said.display(),
            child.display()
        );
        let d = HostCommand::new(&sh(&script), Duration::from_millis(1))
            .unwrap()
            .start_daemon()
            .unwrap();
        // no timeout applies to a daemon
        std::thread::sleep(Duration::from_millis(300));
        assert!(!d.exited());
        let pid = std::fs::read_to_string(&child).unwrap().trim().to_string();
        let ended = d.stop().unwrap();
        assert_eq!(ended, Ended::Exited(0), "it ended on SIGTERM, by itself");
        assert_eq!(std::fs::read_to_string(&said).unwrap(), "term\n");
        assert!(gone_or_zombie(&pid), "its child {pid} survived");
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
