//! The mcpbox Linux sandbox.
//!
//! [`Spec`] says what one sandbox may see and use; [`spawn`] builds it and
//! starts the command from this process, which must be single-threaded
//! (`mcpbox exec`); [`helper::spawn`] does the same from a process with
//! threads (`mcpbox run`) by re-executing the binary as a single-threaded
//! helper that runs [`spawn`]. Either way the set-up is one linear,
//! synchronous sequence run in children forked from a single-threaded
//! process (see ARCHITECTURE.md, "The sandbox sequence"); what the children
//! run is prepared before the fork as data (the mount plan, [`plan::plan`],
//! compiled to system calls; the last mile; the Landlock ruleset), so it can
//! be unit-tested without root.
//!
//! Every `unsafe` block of the project is in [`sys`].
#![deny(unsafe_code)]

pub mod cgroup;
mod degraded;
mod diagnose;
pub mod doctor;
pub mod exec_watch;
pub mod fanotify;
pub mod helper;
mod idmap;
mod init;
mod landlock;
mod lastmile;
mod launch;
pub mod mountinfo;
mod netns;
pub mod plan;
mod report;
pub mod seccomp;
mod sys;
pub mod volume;
mod wire;

use std::ffi::OsString;
use std::path::PathBuf;
use std::time::Duration;

pub use diagnose::{interpreter, normalize, Interpreter};
pub use idmap::{idmapped_when_root, root_run_access_problem};
pub use launch::{spawn, Sandbox, Status};
pub use report::ChildStep;
pub use sys::kill_with_parent;

/// The egress bridge's entry point: serves the sockets the init bound for
/// it, carrying connections to the unix socket at the path; returns only on
/// a fatal error.
pub type BridgeFn = fn(BridgeSockets, &std::path::Path) -> std::io::Result<()>;

/// The sockets the init binds on the sandbox's loopback for the bridge
/// (binding port 53 needs the init's capabilities, which the bridge no
/// longer has), each handed over open.
#[derive(Debug)]
pub struct BridgeSockets {
    /// `127.0.0.1:PORT` ([`Egress::port`]): the proxy the proxy variables
    /// name.
    pub proxy: std::net::TcpListener,
    /// `127.0.0.1:`[`CAPTURE_PORT`]: every other outbound TCP connection of
    /// the sandbox, redirected here (netns.rs); `SO_ORIGINAL_DST` tells
    /// where it was going.
    pub capture: std::net::TcpListener,
    /// `127.0.0.1:53` over UDP: the sandbox's resolver, named in its
    /// /etc/resolv.conf.
    pub dns_udp: std::net::UdpSocket,
    /// `127.0.0.1:53` over TCP, for resolvers that retry there.
    pub dns_tcp: std::net::TcpListener,
    /// A netlink socket bound to the namespace's NFLOG group of the packets
    /// the capture does not carry (UDP other than the resolver, IPv6),
    /// which the nftables rules copy there (netns.rs): each is audited.
    pub nflog: std::os::fd::OwnedFd,
}

/// The port on the sandbox's loopback that the capture sends outbound TCP to.
pub const CAPTURE_PORT: u16 = 3129;

/// The sandbox's resolver port, on its loopback.
pub const DNS_PORT: u16 = 53;

/// Blocks the signals that are forwarded to a sandbox, in the calling
/// thread; call it once, first thing, before starting any thread, so that
/// the threads inherit the mask and the signals reach
/// [`Sandbox::wait_forwarding_signals`] (or a thread in
/// [`wait_forwarded_signal`]) instead of killing the process.
pub fn block_forwarded_signals() -> Result<()> {
    sys::block_signals(&init::waited()).map_err(|e| Error::setup("block signals", e))
}

/// Waits for the next of the signals [`block_forwarded_signals`] blocked
/// (SIGTERM, SIGINT, SIGHUP, ..., SIGCHLD) and returns its number. For a
/// thread that turns signals into an orderly shutdown.
pub fn wait_forwarded_signal() -> Result<i32> {
    let set = init::waited();
    loop {
        if let Some(sig) =
            sys::sigtimedwait(&set, None).map_err(|e| Error::setup("sigtimedwait", e))?
        {
            return Ok(sig);
        }
    }
}

/// Sends `sig` to a sandbox's init (see [`Sandbox::init_pid`]), which
/// forwards it to the command's process group; SIGKILL ends the sandbox.
pub fn signal_init(init_pid: i32, sig: i32) {
    if init_pid > 0 {
        let _ = sys::kill(init_pid, sig);
    }
}

/// Whether mcpbox runs as root of the host (euid 0 in the initial user
/// namespace): then the sandbox user maps to host uid [`ROOT_RUN_HOST_ID`].
pub fn is_host_root() -> bool {
    sys::is_host_root()
}

/// The uid and gid the command runs as inside the sandbox.
pub const SANDBOX_UID: u32 = 1000;
/// The host uid/gid the sandbox user maps to when mcpbox runs as root: never
/// host root, so that a hostile server owns nothing of the host. The
/// caller's read-only directories are shown to it through idmapped mounts
/// (on-disk uid 0 appears as this id; see [`idmapped_when_root`]).
pub const ROOT_RUN_HOST_ID: u32 = 65534;

/// Where things appear inside the sandbox.
pub const WORKSPACE: &str = "/workspace";
pub const INPUT: &str = "/workspace/input";
pub const OUTPUT: &str = "/workspace/output";
pub const TMP: &str = "/workspace/tmp";
pub const HOME: &str = "/workspace/tmp/home";

/// One extra bind mount.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BindMount {
    /// Host path (already canonical and checked by the caller).
    pub host: PathBuf,
    /// Absolute path inside the sandbox.
    pub at: PathBuf,
    pub writable: bool,
}

/// Resource limits. `None` means not limited.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Limits {
    pub memory: Option<u64>,
    pub pids: Option<u64>,
    /// CPU in cores (1.5 = one and a half cores).
    pub cpu: Option<f64>,
    /// Wall-clock limit for the whole sandbox.
    pub timeout: Option<Duration>,
}

/// Where the sandbox's network egress goes: a unix socket of mcpbox's
/// proxy, outside, reached through a bridge inside the sandbox's network
/// namespace listening on `127.0.0.1:port`.
#[derive(Debug, Clone)]
pub struct Egress {
    /// Host directory holding the proxy's socket `egress.sock`; it appears
    /// read-only at [`EGRESS_DIR`] inside.
    pub socket_dir: PathBuf,
    /// Port of the bridge on the sandbox's own loopback.
    pub port: u16,
    /// The bridge: forwards each accepted connection to the socket at the
    /// given path. Runs in a small process of its own inside the sandbox,
    /// without capabilities; returns only on a fatal error.
    pub bridge: BridgeFn,
}

/// Where the proxy's socket directory appears inside the sandbox.
pub const EGRESS_DIR: &str = "/run/mcpbox";

/// How the command's stdio is connected.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Stdio {
    /// The command uses mcpbox's own stdin, stdout and stderr.
    Inherit,
    /// Pipes, returned in [`Sandbox`], for the relay.
    Piped,
}

/// Everything one sandbox is given. Paths are host paths the caller has
/// canonicalised and checked; the sandbox trusts them.
#[derive(Debug, Clone)]
pub struct Spec {
    pub argv: Vec<OsString>,
    /// The complete environment of the command (nothing else is passed).
    pub env: Vec<(OsString, OsString)>,
    pub input: Option<PathBuf>,
    pub output: Option<PathBuf>,
    /// Size of the tmpfs at /workspace/tmp (and /dev/shm), in bytes; for
    /// /workspace/tmp ignored when `tmp_dir` is set.
    pub tmp_size: u64,
    /// A host directory shown read-write at /workspace/tmp instead of a
    /// tmpfs, so that a long-lived sandbox's tmp (and HOME in it) survives
    /// a restart of its server and can be snapshotted. The init chowns it
    /// to the sandbox user (host nobody when mcpbox runs as root), as it
    /// does the tmpfs, and makes HOME in it if missing. Its contents are
    /// the sandbox's: whoever reads them on the host must not follow their
    /// symlinks. None: a fresh tmpfs of `tmp_size` per launch.
    pub tmp_dir: Option<PathBuf>,
    pub mounts: Vec<BindMount>,
    pub limits: Limits,
    /// When set, only these paths (inside the sandbox) may be executed
    /// (Landlock), every writable mount is noexec (plan.rs), so that a file
    /// the command writes cannot be run through the dynamic loader or
    /// mapped as code either, and `memfd_create` is refused (seccomp.rs).
    pub allow_exec: Option<Vec<PathBuf>>,
    /// Accept the weaker tier (rlimits for memory, no cgroup for cpu).
    pub allow_degraded: bool,
    pub stdio: Stdio,
    /// Egress through mcpbox's proxy; None: loopback only.
    pub egress: Option<Egress>,
    /// The name of a lifecycle parent ([`cgroup::Parent`]), which must
    /// exist: each launch then gets its own group below it in each of the
    /// parent's hierarchies (freezer, CPU accounting), even when `limits`
    /// needs no cgroup, so that freezing the parent freezes the whole
    /// sandbox and its CPU counter counts it. None: no parent.
    pub cgroup_parent: Option<String>,
}

/// Errors of the sandbox, each naming the step that failed.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// A step of the supervisor (this process, or the helper).
    #[error("{step}: {source}")]
    Setup {
        step: String,
        #[source]
        source: std::io::Error,
    },
    /// A step of a child (init, command, bridge), or the clone that makes
    /// the init, failed with `errno`; `at` names the root operation for
    /// [`ChildStep::Root`].
    #[error("sandbox set-up failed at {step}{}: {}", at.as_ref().map(|a| format!(" ({a})")).unwrap_or_default(), std::io::Error::from_raw_os_error(*errno))]
    Child {
        step: ChildStep,
        at: Option<String>,
        errno: i32,
    },
    #[error("cannot run {command}: {detail}")]
    Exec {
        command: String,
        detail: String,
        code: i32,
    },
    #[error("{0}")]
    Unenforceable(String),
    #[error(
        "cannot create the sandbox's namespaces: {}; user namespaces look unavailable here \
         (run `mcpbox doctor` for the cause and the fix, or set \
         sandbox.dangerously_allow_degraded = true to accept the weaker tier)",
        std::io::Error::from_raw_os_error(*errno)
    )]
    NoUserNamespaces { errno: i32 },
    #[error("cgroup {path}: {source}")]
    Cgroup {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    /// A lifecycle cgroup parent is refused, missing, or cannot be made.
    #[error("cgroup parent {name}: {detail}")]
    CgroupParent { name: String, detail: String },
    /// [`spawn`] was called from a process with other threads alive.
    #[error(
        "refusing to fork a sandbox from a process with {threads} threads \
         (a multi-threaded caller starts sandboxes through the helper)"
    )]
    Threaded { threads: u64 },
}

impl Error {
    pub(crate) fn setup(step: impl Into<String>, source: std::io::Error) -> Error {
        Error::Setup {
            step: step.into(),
            source,
        }
    }

    /// The step that failed, as a short name.
    pub fn step(&self) -> String {
        match self {
            Error::Setup { step, .. } => step.clone(),
            Error::Child { step, .. } => step.name().to_string(),
            Error::Exec { .. } => "execve".into(),
            Error::Unenforceable(_) => "policy".into(),
            Error::NoUserNamespaces { .. } => ChildStep::Unshare.name().into(),
            Error::Cgroup { .. } | Error::CgroupParent { .. } => "cgroup".into(),
            Error::Threaded { .. } => "fork".into(),
        }
    }

    /// The exit code mcpbox should use for this error: 127 command not
    /// found, 126 not executable, 125 for mcpbox's own failures (as env(1)).
    pub fn exit_code(&self) -> i32 {
        match self {
            Error::Exec { code, .. } => *code,
            _ => 125,
        }
    }
}

pub type Result<T, E = Error> = std::result::Result<T, E>;
