//! The processes the server started: foreground `exec`/`run_code` calls,
//! which answer a request when they end, and background jobs, which the
//! agent polls. One table, driven by the server's one poll loop: pipes are
//! read without blocking, an exit is seen on the process's pidfd, limits
//! are checked on every turn.
//!
//! Each process leads a process group of its own (`setpgid(0, 0)` by
//! `Command::process_group`), so that a limit, a stop or the end of the
//! session kills what it started too (`kill(-pgid)`, kill(2)). A process
//! that leaves its group with `setsid` escapes that kill, not the
//! sandbox: the sandbox's own teardown kills everything in it.

use std::collections::VecDeque;
use std::fs::File;
use std::io::{ErrorKind, Read};
use std::os::fd::{AsFd, OwnedFd};
use std::os::unix::process::CommandExt;
use std::path::PathBuf;
use std::process::{Child, Command, ExitStatus, Stdio};
use std::time::{Duration, Instant};

use rustix::process::{kill_process_group, pidfd_open, Pid, PidfdFlags, Signal};
use serde_json::Value;

/// What a process is for.
pub enum Purpose {
    /// A foreground call: answer request `id` when it ends; remove `cleanup` then.
    Call { id: Value, cleanup: Option<PathBuf> },
    /// A background job, polled by its id.
    Job { id: String },
}

/// How a process ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum End {
    /// Exited with this code.
    Exited(i32),
    /// Killed by this signal (not by us).
    Signaled(i32),
    /// Stopped by us at its time limit.
    TimedOut,
    /// Stopped by us at its memory limit.
    Memory,
    /// Stopped by a `stop_job`, a cancellation or the end of the session.
    Stopped,
}

impl End {
    /// The state name in results.
    pub fn state(self) -> &'static str {
        match self {
            End::Exited(_) => "exited",
            End::Signaled(_) => "killed",
            End::TimedOut => "timeout",
            End::Memory => "memory",
            End::Stopped => "stopped",
        }
    }
}

/// Output kept from one stream: the first `cap` bytes (a call's result),
/// or the last `cap` (a job's, read by offset while it runs).
pub struct Kept {
    data: VecDeque<u8>,
    /// Offset in the stream of `data[0]`.
    base: u64,
    /// Bytes the stream produced.
    pub total: u64,
    cap: usize,
    keep_tail: bool,
}

impl Kept {
    fn new(cap: u64, keep_tail: bool) -> Kept {
        Kept {
            data: VecDeque::new(),
            base: 0,
            total: 0,
            cap: usize::try_from(cap).unwrap_or(usize::MAX),
            keep_tail,
        }
    }

    fn push(&mut self, bytes: &[u8]) {
        self.total += bytes.len() as u64;
        if self.keep_tail {
            self.data.extend(bytes);
            if self.data.len() > self.cap {
                let drop = self.data.len() - self.cap;
                self.data.drain(..drop);
                self.base += drop as u64;
            }
        } else {
            let room = self.cap.saturating_sub(self.data.len());
            self.data.extend(&bytes[..bytes.len().min(room)]);
        }
    }

    /// Whether bytes were dropped.
    pub fn truncated(&self) -> bool {
        self.total > self.data.len() as u64
    }

    /// Everything kept, as text (invalid UTF-8 replaced).
    pub fn text(&self) -> String {
        let (a, b) = self.data.as_slices();
        let mut v = Vec::with_capacity(self.data.len());
        v.extend_from_slice(a);
        v.extend_from_slice(b);
        String::from_utf8_lossy(&v).into_owned()
    }

    /// Up to `max` bytes from stream offset `from`: (text, where it
    /// started, the offset after it). An offset before what is kept starts
    /// at the oldest byte kept.
    pub fn read(&self, from: u64, max: usize) -> (String, u64, u64) {
        let start = from.clamp(self.base, self.base + self.data.len() as u64);
        let skip = usize::try_from(start - self.base).unwrap_or(usize::MAX);
        let bytes: Vec<u8> = self.data.iter().skip(skip).take(max).copied().collect();
        let next = start + bytes.len() as u64;
        (String::from_utf8_lossy(&bytes).into_owned(), start, next)
    }
}

/// One stream being read.
struct Pipe {
    file: Option<File>,
    kept: Kept,
}

impl Pipe {
    /// Reads what is there without blocking; closes at end of file.
    fn drain(&mut self) {
        let Some(f) = self.file.as_mut() else { return };
        let mut buf = [0u8; 65536];
        loop {
            match f.read(&mut buf) {
                Ok(0) => {
                    self.file = None;
                    return;
                }
                Ok(n) => self.kept.push(&buf[..n]),
                Err(e) if e.kind() == ErrorKind::Interrupted => continue,
                Err(e) if e.kind() == ErrorKind::WouldBlock => return,
                Err(_) => {
                    self.file = None;
                    return;
                }
            }
        }
    }
}

/// A process the server started.
pub struct Proc {
    pub purpose: Purpose,
    child: Child,
    pidfd: Option<OwnedFd>,
    pgid: Pid,
    pub started: Instant,
    pub wall_start_ms: u64,
    deadline: Instant,
    memory: u64,
    out: Pipe,
    err: Pipe,
    /// Set once it ended (and its group was killed).
    pub end: Option<End>,
    /// Why we are stopping it, once we are.
    stopping: Option<End>,
    /// When the main process exited, for the grace given to its pipes.
    exited_at: Option<Instant>,
    /// The main process's status, once reaped.
    status: Option<ExitStatus>,
    pub duration: Duration,
}

/// After the main process exits, how long its pipes may stay open (held by
/// something it left running) before the group is killed.
const PIPE_GRACE: Duration = Duration::from_millis(200);

/// How often a process without a pidfd is checked for its exit.
const NO_PIDFD_POLL: Duration = Duration::from_millis(5);

/// How a process is to be limited.
pub struct Bounds {
    pub timeout: Duration,
    pub memory: u64,
    pub keep: u64,
    pub keep_tail: bool,
}

impl Proc {
    /// Starts `cmd` (already given its argv, cwd and environment) in a new
    /// process group with its stdin closed and both outputs piped.
    pub fn spawn(mut cmd: Command, purpose: Purpose, b: &Bounds) -> std::io::Result<Proc> {
        cmd.stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .process_group(0);
        let mut child = cmd.spawn()?;
        let pid = Pid::from_raw(i32::try_from(child.id()).unwrap_or(i32::MAX))
            .ok_or_else(|| std::io::Error::other("no pid"))?;
        let pipe = |f: Option<OwnedFd>, b: &Bounds| -> std::io::Result<Pipe> {
            let file = match f {
                Some(fd) => {
                    rustix::io::ioctl_fionbio(&fd, true)?;
                    Some(File::from(fd))
                }
                None => None,
            };
            Ok(Pipe {
                file,
                kept: Kept::new(b.keep, b.keep_tail),
            })
        };
        let out = pipe(child.stdout.take().map(OwnedFd::from), b)?;
        let err = pipe(child.stderr.take().map(OwnedFd::from), b)?;
        // A pidfd polls readable when the process exits (pidfd_open(2)):
        // no SIGCHLD handler, no busy wait.
        let pidfd = pidfd_open(pid, PidfdFlags::empty()).ok();
        let now = Instant::now();
        Ok(Proc {
            purpose,
            child,
            pidfd,
            pgid: pid,
            started: now,
            wall_start_ms: now_ms(),
            deadline: now + b.timeout,
            memory: b.memory,
            out,
            err,
            end: None,
            stopping: None,
            exited_at: None,
            status: None,
            duration: Duration::ZERO,
        })
    }

    /// The descriptors to poll: the open pipes and the pidfd while running.
    pub fn fds(&self) -> Vec<std::os::fd::BorrowedFd<'_>> {
        let mut v = Vec::new();
        if let Some(f) = &self.out.file {
            v.push(f.as_fd());
        }
        if let Some(f) = &self.err.file {
            v.push(f.as_fd());
        }
        if self.exited_at.is_none() {
            if let Some(p) = &self.pidfd {
                v.push(p.as_fd());
            }
        }
        v
    }

    /// When this needs looking at without an event: its deadline, or the
    /// end of the pipes' grace.
    pub fn wake_at(&self) -> Option<Instant> {
        if self.end.is_some() {
            return None;
        }
        Some(match self.exited_at {
            Some(t) => (t + PIPE_GRACE).min(self.deadline),
            // no pidfd (an old kernel): the exit is only seen by polling
            None if self.pidfd.is_none() => (Instant::now() + NO_PIDFD_POLL).min(self.deadline),
            None => self.deadline,
        })
    }

    /// Whether a memory limit means the table must sample.
    pub fn samples_memory(&self) -> bool {
        self.end.is_none() && self.memory > 0
    }

    pub fn stdout(&self) -> &Kept {
        &self.out.kept
    }

    pub fn stderr(&self) -> &Kept {
        &self.err.kept
    }

    /// Stops it for `why`: kills its whole group (SIGKILL: a stop is not a
    /// request) and records why, so its end reads as ours.
    pub fn stop(&mut self, why: End) {
        if self.end.is_some() {
            return;
        }
        if self.stopping.is_none() {
            self.stopping = Some(why);
        }
        let _ = kill_process_group(self.pgid, Signal::KILL);
    }

    /// One turn: read the pipes, reap, apply the limits. True when it has
    /// just ended.
    pub fn turn(&mut self, now: Instant, sample: bool) -> bool {
        if self.end.is_some() {
            return false;
        }
        self.out.drain();
        self.err.drain();
        if self.exited_at.is_none() {
            match self.child.try_wait() {
                Ok(Some(status)) => {
                    self.exited_at = Some(now);
                    self.duration = now.saturating_duration_since(self.started);
                    self.status = Some(status);
                }
                Ok(None) => {}
                Err(_) => {}
            }
        }
        if self.exited_at.is_none() && self.stopping.is_none() {
            if now >= self.deadline {
                self.stop(End::TimedOut);
            } else if sample && self.memory > 0 && group_rss(self.pgid) > self.memory {
                self.stop(End::Memory);
            }
        }
        let Some(exited) = self.exited_at else {
            return false;
        };
        let pipes_done = self.out.file.is_none() && self.err.file.is_none();
        if !pipes_done && now < exited + PIPE_GRACE {
            return false;
        }
        // What it left in its group goes with it (use start_job for
        // background work); then whatever is still buffered is read.
        let _ = kill_process_group(self.pgid, Signal::KILL);
        self.out.drain();
        self.err.drain();
        self.out.file = None;
        self.err.file = None;
        self.pidfd = None;
        let status = self.status.take();
        self.end = Some(match (self.stopping, status) {
            (Some(why), _) => why,
            (None, Some(s)) => from_status(s),
            (None, None) => End::Stopped,
        });
        true
    }
}

fn from_status(s: ExitStatus) -> End {
    use std::os::unix::process::ExitStatusExt;
    match (s.code(), s.signal()) {
        (Some(c), _) => End::Exited(c),
        (None, Some(sig)) => End::Signaled(sig),
        (None, None) => End::Stopped,
    }
}

/// Milliseconds since the epoch.
pub fn now_ms() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| u64::try_from(d.as_millis()).unwrap_or(u64::MAX))
        .unwrap_or(0)
}

/// The resident memory of every process in group `pgid`, in bytes, from
/// /proc/PID/stat (proc(5): field 5 pgrp, field 24 rss in pages). A
/// sample: a job can pass its limit between two samples; the sandbox's
/// cgroup memory limit is the bound that holds at every instant.
fn group_rss(pgid: Pid) -> u64 {
    let want = pgid.as_raw_nonzero().get();
    let page = rustix::param::page_size() as u64;
    let Ok(dir) = std::fs::read_dir("/proc") else {
        return 0;
    };
    let mut total = 0u64;
    for e in dir.flatten() {
        let name = e.file_name();
        let Some(pid) = name
            .to_str()
            .filter(|s| s.bytes().all(|b| b.is_ascii_digit()))
        else {
            continue;
        };
        let Ok(stat) = std::fs::read_to_string(format!("/proc/{pid}/stat")) else {
            continue;
        };
        // proc(5): pgrp is field 5, rss field 24
        let field = |n| mcpbox_policy::procfs::stat_field(&stat, n);
        let pgrp = field(5).and_then(|f| f.parse::<i32>().ok());
        let rss = field(24).and_then(|f| f.parse::<u64>().ok());
        if pgrp == Some(want) {
            total += rss.unwrap_or(0) * page;
        }
    }
    total
}
