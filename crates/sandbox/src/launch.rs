//! Starting a sandbox: the one linear sequence.
//!
//! Two processes take part besides the command:
//!
//! ```text
//! supervisor (single-threaded)   clones the init into new namespaces
//!  │                             (and its v2 cgroup), writes its id maps,
//!  │                             moves it into its other cgroups, waits
//!  └─ init (pid 1)               builds the root, then reaps and forwards
//!      └─ command                the last mile (lastmile.rs), then execve
//! ```
//!
//! The supervisor is `mcpbox exec` itself, which is single-threaded when it
//! forks (checked: [`spawn`] refuses otherwise), or the helper that a
//! multi-threaded `mcpbox run` re-executes (helper.rs). So no process with
//! a second thread ever forks a sandbox process.
//!
//! Everything the children need is prepared here, before the first fork
//! ([`Prepared`]): the mount plan compiled to system calls on C strings,
//! the Landlock ruleset as data, the seccomp program, argv and envp with
//! their pointer arrays, the rlimits, the cgroup v2 directory opened.
//! After fork the children only make system calls on that data.
//!
//! Each child dies with its parent (PR_SET_PDEATHSIG; the parents are
//! single-threaded, so "parent thread" and "parent process" are the same),
//! and the init's death kills the whole pid namespace, so killing the
//! supervisor by any signal leaves no process of the sandbox alive. Every
//! failure in a child is a fixed-size record on the report pipe
//! (report.rs) naming the step and the errno.

use std::ffi::{CString, OsStr, OsString};
use std::fs::File;
use std::io::Write;
use std::os::fd::{AsFd, AsRawFd, OwnedFd, RawFd};
use std::os::unix::ffi::OsStrExt;
use std::path::{Path, PathBuf};
use std::time::Instant;

use crate::cgroup::{Group, Layout, Parent};
use crate::lastmile::{self, Fds, LastMile, Session, StdioSetup, Then};
use crate::plan::{self, Access, HostFacts, Step};
use crate::report::{self, ChildStep, Record};
use crate::sys::{self, Fork, Wait};
use crate::{
    init, landlock, seccomp, Error, Result, Spec, Stdio, ROOT_RUN_HOST_ID, SANDBOX_UID, WORKSPACE,
};

/// How a sandbox ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Status {
    /// The command's exit code, or 128+N when it died of signal N.
    Exited(i32),
    /// The policy's timeout ran out and the sandbox was killed.
    TimedOut,
    /// The memory cgroup killed a process of the sandbox.
    OutOfMemory(i32),
}

impl Status {
    /// The exit code mcpbox passes on: the command's own, 124 on timeout
    /// (as timeout(1)).
    pub fn code(self) -> i32 {
        match self {
            Status::Exited(c) | Status::OutOfMemory(c) => c,
            Status::TimedOut => 124,
        }
    }
}

/// A running sandbox.
#[derive(Debug)]
pub struct Sandbox {
    /// The process waited for: the init, or, for a sandbox started through
    /// the helper, the helper.
    pub(crate) waited: libc::pid_t,
    pub(crate) init: libc::pid_t,
    /// The command's stdin, stdout and stderr with [`Stdio::Piped`].
    pub stdin: Option<File>,
    pub stdout: Option<File>,
    pub stderr: Option<File>,
    group: Option<Group>,
    /// Where the end is reported: the init's status pipe (a
    /// [`Record::Ended`] once the command and everything else in the
    /// sandbox are gone, before the init's own exit tears the namespaces
    /// down), or the helper's control socket (which also says timeout or
    /// out of memory).
    pub(crate) status_pipe: Option<File>,
    pub(crate) deadline: Option<Instant>,
    pub(crate) timed_out: bool,
    pub(crate) status: Option<Status>,
    /// Human-readable notes on weaker enforcement that was accepted.
    pub notes: Vec<String>,
    /// The degraded tier's host directory for tmp, held only to be removed
    /// when the sandbox is dropped.
    _tmp: Option<crate::degraded::TmpDir>,
    /// Started through the helper: `waited` is the helper's pid.
    through_helper: bool,
    /// Whether `waited` has been waited for.
    reaped: bool,
}

/// One operation of building the root: a system call on prepared C strings,
/// and the label an error shows.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct RootOp {
    pub(crate) label: String,
    pub(crate) call: Call,
}

/// The system calls the root is built with.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Call {
    Mount {
        source: Option<CString>,
        target: CString,
        fstype: Option<CString>,
        flags: libc::c_ulong,
        data: Option<CString>,
    },
    /// move_mount(2) of a detached mount tree the supervisor made (an
    /// idmapped read-only bind, idmap.rs): replaces the bind's `Mount`.
    Attach {
        tree: RawFd,
        target: CString,
    },
    /// mount_setattr(AT_RECURSIVE).
    SetAttr {
        target: CString,
        attrs: u64,
    },
    /// mkdir, accepting an existing directory (never a symlink), then chmod.
    Mkdir {
        path: CString,
        mode: u32,
    },
    /// Create an empty file unless something is there (a bind target).
    Touch {
        path: CString,
    },
    Write {
        path: CString,
        contents: Vec<u8>,
    },
    Symlink {
        target: CString,
        path: CString,
    },
    Chown {
        path: CString,
        uid: u32,
        gid: u32,
    },
    Chdir {
        path: CString,
    },
    PivotRoot {
        new_root: CString,
        put_old: CString,
    },
    Umount {
        target: CString,
        flags: libc::c_int,
    },
}

/// The egress bridge's part of the preparation.
pub(crate) struct BridgePrep {
    pub(crate) port: u16,
    pub(crate) bridge: crate::BridgeFn,
    pub(crate) socket: PathBuf,
    pub(crate) last: LastMile,
    /// The routes and the nftables rules of the transparent capture and of
    /// the audit of what it does not carry, as netlink messages (netns.rs).
    pub(crate) capture: [crate::netns::Exchange; 4],
    /// The NFLOG configuration of the bridge's socket for that audit.
    pub(crate) nflog: crate::netns::Exchange,
    /// `net.ipv4.ping_group_range` for the namespace: the sandbox's group.
    pub(crate) ping_groups: Vec<u8>,
}

/// Everything the children need, prepared before forking so that the
/// children only make system calls.
pub(crate) struct Prepared {
    pub(crate) root: Vec<RootOp>,
    pub(crate) args: sys::ExecArgs,
    pub(crate) candidates: Vec<CString>,
    /// The mount plan the root is built from, kept to explain an exec
    /// failure afterwards (`diagnose.rs`).
    pub(crate) view: Vec<Step>,
    pub(crate) command: LastMile,
    pub(crate) landlock: landlock::Plan,
    pub(crate) bridge: Option<BridgePrep>,
    pub(crate) filter: Vec<libc::sock_filter>,
    pub(crate) as_root: bool,
    pub(crate) piped: bool,
    pub(crate) abi: i64,
    /// The detached idmapped trees that `root`'s `Call::Attach` operations
    /// name, held open until the init has attached them (idmap.rs).
    pub(crate) idmapped: Vec<OwnedFd>,
}

fn env_value<'a>(env: &'a [(OsString, OsString)], key: &str) -> Option<&'a OsStr> {
    env.iter()
        .find(|(k, _)| k == key)
        .map(|(_, v)| v.as_os_str())
}

/// The command's candidate paths: as given when it contains a slash, else
/// each PATH entry of the sandbox's own environment, as execvp(3) would.
fn exec_candidates(argv0: &OsStr, env: &[(OsString, OsString)]) -> Result<Vec<CString>> {
    let bytes = argv0.as_bytes();
    let to_c =
        |p: &[u8]| sys::cstr(OsStr::from_bytes(p)).map_err(|e| Error::setup("command name", e));
    if bytes.contains(&b'/') {
        return Ok(vec![to_c(bytes)?]);
    }
    let path = env_value(env, "PATH").map_or(b"/usr/bin:/bin".as_slice(), |p| p.as_bytes());
    path.split(|b| *b == b':')
        .filter(|d| !d.is_empty())
        .map(|dir| {
            let mut full = dir.to_vec();
            full.push(b'/');
            full.extend_from_slice(bytes);
            to_c(&full)
        })
        .collect()
}

/// The environment as execve(2) takes it: `KEY=VALUE` strings.
pub(crate) fn envp(env: &[(OsString, OsString)]) -> Result<Vec<CString>> {
    env.iter()
        .map(|(k, v)| {
            let mut kv = k.as_bytes().to_vec();
            kv.push(b'=');
            kv.extend_from_slice(v.as_bytes());
            sys::cstr(OsStr::from_bytes(&kv))
        })
        .collect::<std::io::Result<Vec<_>>>()
        .map_err(|e| Error::setup("environment", e))
}

fn c(p: impl AsRef<OsStr>) -> Result<CString> {
    sys::cstr(p).map_err(|e| Error::setup("mount plan", e))
}

/// Compiles the mount plan into the system calls that build the root, with
/// the fixed steps before and after it. The order is argued inline; the
/// list is data, checked by unit tests.
pub(crate) fn compile_root(steps: &[Step]) -> Result<Vec<RootOp>> {
    let mut ops = Vec::new();
    let mut op = |label: String, call: Call| ops.push(RootOp { label, call });
    let new = |p: &Path| Path::new("/newroot").join(p.strip_prefix("/").unwrap_or(p));
    let old = |p: &Path| Path::new("/oldroot").join(p.strip_prefix("/").unwrap_or(p));
    // Nothing we mount may propagate back to the host (mount_namespaces(7)).
    op(
        "make / private".into(),
        Call::Mount {
            source: None,
            target: c("/")?,
            fstype: None,
            flags: libc::MS_REC | libc::MS_PRIVATE,
            data: None,
        },
    );
    // A staging tmpfs holds the new root and the old one during the build;
    // binds then name their sources under /oldroot, so a source under the
    // host's /tmp stays reachable.
    op(
        "staging tmpfs on /tmp".into(),
        Call::Mount {
            source: Some(c("mcpbox")?),
            target: c("/tmp")?,
            fstype: Some(c("tmpfs")?),
            flags: libc::MS_NOSUID | libc::MS_NODEV,
            data: Some(c("mode=0755,size=65536")?),
        },
    );
    for d in ["/tmp/newroot", "/tmp/oldroot"] {
        op(
            format!("mkdir {d}"),
            Call::Mkdir {
                path: c(d)?,
                mode: 0o755,
            },
        );
    }
    op(
        "root tmpfs".into(),
        Call::Mount {
            source: Some(c("mcpbox")?),
            target: c("/tmp/newroot")?,
            fstype: Some(c("tmpfs")?),
            flags: libc::MS_NOSUID | libc::MS_NODEV,
            data: Some(c("mode=0755,size=1048576")?),
        },
    );
    op("chdir /tmp".into(), Call::Chdir { path: c("/tmp")? });
    op(
        "pivot_root to staging".into(),
        Call::PivotRoot {
            new_root: c(".")?,
            put_old: c("oldroot")?,
        },
    );
    op("chdir /".into(), Call::Chdir { path: c("/")? });

    // The directory the step before made: a bind onto it needs no Touch.
    let mut made_dir: Option<&Path> = None;
    for step in steps {
        let dir_before = made_dir.take();
        match step {
            Step::Dir { path, mode } => {
                made_dir = Some(path);
                op(
                    format!("mkdir {}", path.display()),
                    Call::Mkdir {
                        path: c(new(path))?,
                        mode: *mode,
                    },
                )
            }
            Step::Tmpfs { path, size, mode } => op(
                format!("tmpfs {}", path.display()),
                Call::Mount {
                    source: Some(c("mcpbox")?),
                    target: c(new(path))?,
                    fstype: Some(c("tmpfs")?),
                    flags: libc::MS_NOSUID | libc::MS_NODEV,
                    data: Some(c(format!("size={size},mode={mode:o}"))?),
                },
            ),
            Step::Bind { host, path, access } => {
                let target = c(new(path))?;
                // The mount point: the directory just made, or an empty
                // file made now unless something is there already.
                if dir_before != Some(path.as_path()) {
                    op(
                        format!("bind target {}", path.display()),
                        Call::Touch {
                            path: target.clone(),
                        },
                    );
                }
                op(
                    format!("bind {} -> {}", host.display(), path.display()),
                    Call::Mount {
                        source: Some(c(old(host))?),
                        target: target.clone(),
                        fstype: None,
                        flags: libc::MS_BIND | libc::MS_REC,
                        data: None,
                    },
                );
                // Device nodes keep the host /dev mount's own flags (nosuid,
                // and necessarily not nodev).
                let attrs = match access {
                    Access::ReadOnly => Some(
                        sys::MOUNT_ATTR_RDONLY | sys::MOUNT_ATTR_NOSUID | sys::MOUNT_ATTR_NODEV,
                    ),
                    Access::ReadWrite => Some(sys::MOUNT_ATTR_NOSUID | sys::MOUNT_ATTR_NODEV),
                    Access::Device => None,
                };
                if let Some(attrs) = attrs {
                    op(
                        format!("mount attributes {}", path.display()),
                        Call::SetAttr { target, attrs },
                    );
                }
            }
            Step::Alias { from, path } => {
                let target = c(new(path))?;
                op(
                    format!("bind {} -> {}", from.display(), path.display()),
                    Call::Mount {
                        source: Some(c(new(from))?),
                        target: target.clone(),
                        fstype: None,
                        flags: libc::MS_BIND,
                        data: None,
                    },
                );
                op(
                    format!("mount attributes {}", path.display()),
                    Call::SetAttr {
                        target,
                        attrs: sys::MOUNT_ATTR_NOSUID | sys::MOUNT_ATTR_NODEV,
                    },
                );
            }
            Step::File { path, contents } => op(
                format!("write {}", path.display()),
                Call::Write {
                    path: c(new(path))?,
                    contents: contents.as_bytes().to_vec(),
                },
            ),
            Step::Symlink { path, target } => op(
                format!("symlink {}", path.display()),
                Call::Symlink {
                    target: c(target)?,
                    path: c(new(path))?,
                },
            ),
            Step::Proc { path } => op(
                format!("mount proc {}", path.display()),
                Call::Mount {
                    source: Some(c("proc")?),
                    target: c(new(path))?,
                    fstype: Some(c("proc")?),
                    flags: libc::MS_NOSUID | libc::MS_NODEV | libc::MS_NOEXEC,
                    data: None,
                },
            ),
            // mount_setattr(AT_RECURSIVE) sets noexec and clears nothing:
            // the mount keeps its read-write, nosuid and nodev.
            Step::NoExec { path } => op(
                format!("noexec {}", path.display()),
                Call::SetAttr {
                    target: c(new(path))?,
                    attrs: sys::MOUNT_ATTR_NOEXEC,
                },
            ),
            Step::Chown { path, uid, gid } => op(
                format!("chown {}", path.display()),
                Call::Chown {
                    path: c(new(path))?,
                    uid: *uid,
                    gid: *gid,
                },
            ),
        }
    }
    // Make the new root the only root: pivot onto it (the staging root,
    // with the host's tree below /oldroot, is stacked underneath), then
    // detach the staging root and everything under it in one umount. One
    // detach, not two: each one ends in an RCU grace period
    // (namespace_unlock), which costs more than the rest of the call.
    op(
        "chdir new root".into(),
        Call::Chdir {
            path: c("/newroot")?,
        },
    );
    op(
        "pivot_root".into(),
        Call::PivotRoot {
            new_root: c(".")?,
            put_old: c(".")?,
        },
    );
    op(
        "detach the staging root and the host's tree".into(),
        Call::Umount {
            target: c(".")?,
            flags: libc::MNT_DETACH,
        },
    );
    op("chdir /".into(), Call::Chdir { path: c("/")? });
    // The root itself (with /etc) becomes read-only; /workspace/tmp,
    // /workspace/output and /dev are separate mounts and keep their modes.
    op(
        "remount / read-only".into(),
        Call::Mount {
            source: None,
            target: c("/")?,
            fstype: None,
            flags: libc::MS_REMOUNT
                | libc::MS_BIND
                | libc::MS_RDONLY
                | libc::MS_NOSUID
                | libc::MS_NODEV,
            data: None,
        },
    );
    Ok(ops)
}

/// Executes the compiled root in the init: system calls only. Returns the
/// index of the operation that failed.
///
/// The umask is 0 while the root is built, so every directory and file gets
/// exactly the mode the plan gives it (no chmod after each mkdir, and no
/// caller's umask 077 making /etc/passwd unreadable to the sandbox user);
/// the caller's is put back after, for the command to inherit.
fn build_root(ops: &[RootOp]) -> Result<(), (usize, std::io::Error)> {
    let caller_umask = sys::umask(0);
    for (i, op) in ops.iter().enumerate() {
        let done = match &op.call {
            Call::Mount {
                source,
                target,
                fstype,
                flags,
                data,
            } => sys::mount(
                source.as_deref(),
                target,
                fstype.as_deref(),
                *flags,
                data.as_deref(),
            ),
            Call::Attach { tree, target } => sys::move_mount_attach(*tree, target),
            Call::SetAttr { target, attrs } => sys::mount_setattr_recursive(target, *attrs),
            Call::Mkdir { path, mode } => match sys::mkdir(path, *mode) {
                // Made with exactly `mode` (umask 0; mkdir(2) keeps the
                // sticky bit).
                Ok(()) => Ok(()),
                // Never chmod through a symlink of the new root: it would
                // resolve against the staging root.
                Err(e) if e.raw_os_error() == Some(libc::EEXIST) => match sys::lstat_is_dir(path) {
                    Ok(true) => sys::chmod(path, *mode),
                    Ok(false) => Err(std::io::Error::from_raw_os_error(libc::ENOTDIR)),
                    Err(e) => Err(e),
                },
                Err(e) => Err(e),
            },
            Call::Touch { path } => sys::touch(path),
            Call::Write { path, contents } => sys::write_file(path, contents),
            Call::Symlink { target, path } => sys::symlink(target, path),
            Call::Chown { path, uid, gid } => sys::chown(path, *uid, *gid),
            Call::Chdir { path } => sys::chdir(path),
            Call::PivotRoot { new_root, put_old } => sys::pivot_root(new_root, put_old),
            Call::Umount { target, flags } => sys::umount2(target, *flags),
        };
        done.map_err(|e| (i, e))?;
    }
    sys::umask(caller_umask);
    Ok(())
}

/// The last mile of the full tier's command.
pub(crate) fn command_last_mile(
    rlimits: Vec<(libc::__rlimit_resource_t, u64)>,
    as_root: bool,
    last_cap: u32,
) -> LastMile {
    LastMile {
        session: Session::OwnGroup,
        stdio: StdioSetup::Keep,
        chdir: CString::new(WORKSPACE).ok(),
        rlimits,
        fds: Fds::CloseOnExec,
        last_cap,
        strict_bounding: true,
        // setgroups is allowed only in a namespace made by root.
        clear_groups: as_root,
        uid: Some(SANDBOX_UID),
        landlock: true,
    }
}

/// The last mile of the egress bridge: no capability, the same seccomp
/// filter; no stdio of the command, no descriptor but its listener.
pub(crate) fn bridge_last_mile(as_root: bool, last_cap: u32) -> LastMile {
    LastMile {
        session: Session::Inherit,
        stdio: StdioSetup::Null,
        chdir: None,
        rlimits: Vec::new(),
        fds: Fds::CloseAllButListener,
        last_cap,
        strict_bounding: true,
        clear_groups: as_root,
        uid: Some(SANDBOX_UID),
        landlock: false,
    }
}

pub(crate) fn prepare(spec: &Spec) -> Result<Prepared> {
    let Some(argv0) = spec.argv.first() else {
        return Err(Error::Exec {
            command: String::new(),
            detail: "no command given".into(),
            code: 125,
        });
    };
    let argv = spec
        .argv
        .iter()
        .map(sys::cstr)
        .collect::<std::io::Result<Vec<_>>>()
        .map_err(|e| Error::setup("command arguments", e))?;
    let envp = envp(&spec.env)?;
    let facts = HostFacts::read(spec);
    let mut rlimits = vec![(libc::RLIMIT_CORE, 0)];
    if let Some(pids) = spec.limits.pids {
        rlimits.push((libc::RLIMIT_NPROC, pids));
    }
    let as_root = sys::is_host_root();
    let last_cap = sys::last_cap();
    // The Landlock ABI decides the ruleset's rights now; the init builds it
    // from this plan once the new root exists.
    let abi = sys::landlock_abi_version().unwrap_or(0);
    let landlock = landlock::Plan::required(
        abi,
        landlock::Tier::Full,
        &plan::readable_paths(spec),
        &plan::writable_paths(spec),
        spec.allow_exec.as_deref(),
    )?;
    let bridge = spec.egress.as_ref().map(|e| BridgePrep {
        port: e.port,
        bridge: e.bridge,
        socket: Path::new(crate::EGRESS_DIR).join("egress.sock"),
        last: bridge_last_mile(as_root, last_cap),
        capture: crate::netns::capture(crate::CAPTURE_PORT),
        nflog: crate::netns::nflog_config(),
        ping_groups: format!("{SANDBOX_UID} {SANDBOX_UID}").into_bytes(),
    });
    let view = plan::plan(spec, &facts);
    Ok(Prepared {
        root: compile_root(&view)?,
        args: sys::ExecArgs::new(argv, envp),
        candidates: exec_candidates(argv0, &spec.env)?,
        view,
        command: command_last_mile(rlimits, as_root, last_cap),
        landlock,
        bridge,
        filter: seccomp::compile(&seccomp::rules(spec.allow_exec.is_some())),
        as_root,
        piped: spec.stdio == Stdio::Piped,
        abi,
        idmapped: Vec::new(),
    })
}

/// Creates the cgroups `spec` needs (for its limits, and below its
/// lifecycle parent), or refuses, or accepts rlimits when the policy allows
/// the weaker tier.
fn limits_group(
    spec: &Spec,
    prepared: &mut Prepared,
    notes: &mut Vec<String>,
) -> Result<Option<Group>> {
    let parent = match &spec.cgroup_parent {
        Some(name) => {
            crate::cgroup::check_parent_name(name)?;
            Some(Parent::open(name).ok_or_else(|| {
                Error::CgroupParent {
                    name: name.clone(),
                    detail: "does not exist in any freezer hierarchy (the lifecycle creates it \
                         with Parent::create before launching)"
                        .into(),
                }
            })?)
        }
        None => None,
    };
    if crate::cgroup::needed(&spec.limits).is_empty() && parent.is_none() {
        return Ok(None);
    }
    let name = format!("mcpbox-{}", sys::getpid());
    let layout = Layout::read();
    match Group::create_in(&layout, &spec.limits, &name, parent.as_ref()) {
        Ok(group) => Ok(group),
        // A missing parent group is no limit to weaken.
        Err(e @ Error::Cgroup { .. }) if parent.is_some() => Err(e),
        Err(e) if spec.allow_degraded => {
            if let Some(mem) = spec.limits.memory {
                prepared.command.rlimits.push((libc::RLIMIT_AS, mem));
                notes.push(format!(
                    "memory limit is per-process address space (RLIMIT_AS), not a cgroup: {e}"
                ));
            }
            if spec.limits.cpu.is_some() {
                notes.push(format!("cpu limit is not enforced: {e}"));
            }
            // The parent's groups still, without the limits.
            match &parent {
                Some(p) => Group::create_in(&layout, &Default::default(), &name, Some(p)),
                None => Ok(None),
            }
        }
        Err(e) => Err(e),
    }
}

/// Refuses to fork from a process with more than one thread: a child of
/// such a process may inherit a lock (the allocator's, stdio's) held by a
/// thread that does not exist in the child. A multi-threaded caller
/// (`mcpbox run`) goes through [`crate::helper::spawn`] instead.
fn ensure_single_threaded() -> Result<()> {
    match sys::thread_count() {
        Ok(1) => Ok(()),
        Ok(threads) => Err(Error::Threaded { threads }),
        Err(e) => Err(Error::setup("counting this process's threads", e)),
    }
}

/// Builds the sandbox and starts the command in it, from this process,
/// which must be single-threaded. The one place the tier is chosen: the
/// full tier, unless the clone into new namespaces failed (user namespaces are
/// unavailable here), then the degraded tier if the policy accepts it.
pub fn spawn(spec: &Spec) -> Result<Sandbox> {
    ensure_single_threaded()?;
    match spawn_full(spec) {
        Err(Error::Child {
            step: ChildStep::Unshare,
            errno,
            ..
        }) => {
            if !spec.allow_degraded {
                return Err(Error::NoUserNamespaces { errno });
            }
            tracing::debug!(
                errno,
                "user namespaces unavailable; degraded tier accepted by the policy"
            );
            let mut prepared = prepare(spec)?;
            // No new root in this tier: the command sees the host's paths,
            // so an exec failure is explained on those.
            prepared.view = vec![Step::Bind {
                host: PathBuf::from("/"),
                path: PathBuf::from("/"),
                access: Access::ReadOnly,
            }];
            let mut notes = Vec::new();
            if let Some(mem) = spec.limits.memory {
                prepared.command.rlimits.push((libc::RLIMIT_AS, mem));
                notes.push(
                    "memory limit is per-process address space (RLIMIT_AS) in the degraded tier"
                        .into(),
                );
            }
            if spec.limits.cpu.is_some() {
                notes.push("cpu limit is not enforced in the degraded tier".into());
            }
            crate::degraded::spawn(spec, prepared, notes)
        }
        other => other,
    }
}

/// Pipes for stdio with [`Stdio::Piped`]: (parent end, child end) for each
/// of 0, 1 and 2.
pub(crate) type StdioPipes = Option<[(OwnedFd, OwnedFd); 3]>;

/// The buffer asked for the server's stdout pipe (the default
/// /proc/sys/fs/pipe-max-size, so unprivileged callers get it too).
pub(crate) const STDOUT_PIPE_SIZE: usize = 1 << 20;

pub(crate) fn make_stdio(piped: bool) -> Result<StdioPipes> {
    if !piped {
        return Ok(None);
    }
    let (in_r, in_w) = sys::pipe().map_err(|e| Error::setup("stdin pipe", e))?;
    let (out_r, out_w) = sys::pipe().map_err(|e| Error::setup("stdout pipe", e))?;
    // The server's answers come through this pipe: at the default 64 KiB a
    // large result costs the reader (and the server) a wake-up per 64 KiB.
    // A larger buffer is an optimisation only: refused (EPERM past
    // pipe-max-size or the user's pipe-user-pages-soft), the pipe keeps its
    // default size.
    let _ = sys::set_pipe_size(out_r.as_fd(), STDOUT_PIPE_SIZE);
    let (err_r, err_w) = sys::pipe().map_err(|e| Error::setup("stderr pipe", e))?;
    Ok(Some([(in_w, in_r), (out_r, out_w), (err_r, err_w)]))
}

/// The supervisor's ends of the stdio pipes (the children's ends closed).
pub(crate) fn parent_stdio(stdio: StdioPipes) -> (Option<File>, Option<File>, Option<File>) {
    match stdio {
        Some([a, b, c]) => {
            drop((a.1, b.1, c.1));
            (
                Some(File::from(a.0)),
                Some(File::from(b.0)),
                Some(File::from(c.0)),
            )
        }
        None => (None, None, None),
    }
}

/// The error a child's record stands for. `root` labels a failed root
/// operation; `argv0` names the command.
pub(crate) fn child_error(record: Record, root: &[RootOp], argv0: &CString) -> Error {
    match record {
        Record::Failed { step, errno, arg } => Error::Child {
            step,
            at: (step == ChildStep::Root)
                .then(|| usize::try_from(arg).ok())
                .flatten()
                .and_then(|i| root.get(i))
                .map(|op| op.label.clone()),
            errno,
        },
        Record::ExecFailed { code, errno } => Error::Exec {
            command: String::from_utf8_lossy(argv0.as_bytes()).into_owned(),
            detail: if code == 127 {
                "command not found in the sandbox".to_string()
            } else {
                std::io::Error::from_raw_os_error(errno).to_string()
            },
            code,
        },
        other => Error::setup(
            "reading the report pipe",
            std::io::Error::other(format!("unexpected record {other:?}")),
        ),
    }
}

/// A "not found" of a program that is there is its interpreter's: the
/// error then names the interpreter and the mount to add
/// (`diagnose.rs`, run here in the supervisor, after the fact).
pub(crate) fn explain_exec(error: Error, prepared: &Prepared) -> Error {
    match error {
        Error::Exec {
            command,
            detail,
            code: 127,
        } => {
            let candidates: Vec<PathBuf> = prepared
                .candidates
                .iter()
                .map(|c| PathBuf::from(OsStr::from_bytes(c.as_bytes())))
                .collect();
            let detail =
                crate::diagnose::missing_interpreter(&candidates, &prepared.view).unwrap_or(detail);
            Error::Exec {
                command,
                detail,
                code: 127,
            }
        }
        other => other,
    }
}

/// Reads the report pipe to EOF (the command's execve closed it); a record
/// before that is a failed step, and the start is undone.
pub(crate) fn await_exec(sb: &mut Sandbox, report_r: OwnedFd, prepared: &Prepared) -> Result<()> {
    let failure = match report::read(report_r.as_raw_fd()) {
        Err(e) => Some(Error::setup("reading the report pipe", e)),
        Ok(None) => None,
        Ok(Some(r)) => Some(explain_exec(
            child_error(r, &prepared.root, &prepared.args.argv()[0]),
            prepared,
        )),
    };
    match failure {
        None => Ok(()),
        Some(e) => {
            sb.kill();
            let _ = sys::waitpid(sb.waited, false);
            sb.status = Some(Status::Exited(125));
            Err(e)
        }
    }
}

fn spawn_full(spec: &Spec) -> Result<Sandbox> {
    let mut prepared = prepare(spec)?;
    // As root, the caller's read-only directories become idmapped trees,
    // made here in the host's namespaces and attached by the init.
    prepared.idmapped = crate::idmap::attach(spec, &mut prepared.root, prepared.as_root)?;
    let mut notes = Vec::new();
    let group = limits_group(spec, &mut prepared, &mut notes)?;
    let deadline = spec.limits.timeout.map(|t| Instant::now() + t);

    let (report_r, report_w) = sys::pipe().map_err(|e| Error::setup("report pipe", e))?;
    let (sync_r, sync_w) = sys::pipe().map_err(|e| Error::setup("sync pipe", e))?;
    let (status_r, status_w) = sys::pipe().map_err(|e| Error::setup("status pipe", e))?;
    let stdio = make_stdio(prepared.piped)?;

    // Every namespace but the cgroup one, in the clone itself: user first,
    // so the others are owned by it (clone(2)). The cgroup namespace comes
    // later, from the init, once it is in its cgroup, so that the group is
    // the sandbox's cgroup root.
    let flags = libc::CLONE_NEWUSER
        | libc::CLONE_NEWNS
        | libc::CLONE_NEWPID
        | libc::CLONE_NEWNET
        | libc::CLONE_NEWIPC
        | libc::CLONE_NEWUTS;
    // Born in its cgroup v2 group where the kernel can (clone3 with
    // CLONE_INTO_CGROUP), instead of moved there by the supervisor: the
    // move waits for an RCU grace period (sys.rs has the figure). Where
    // clone3 is refused the init is cloned as before and moved.
    let v2 = group.as_ref().and_then(Group::v2_dir).and_then(|dir| {
        use std::os::unix::fs::OpenOptionsExt;
        std::fs::File::options()
            .read(true)
            .custom_flags(libc::O_DIRECTORY)
            .open(dir)
            .ok()
            .map(|f| (OwnedFd::from(f), dir.to_path_buf()))
    });
    // (a flag, not the path: the child makes system calls only)
    let mut born = false;
    let cloned = match &v2 {
        Some((fd, _)) => match sys::clone3_into_namespaces(flags, fd.as_fd()) {
            Ok(fork) => {
                born = true;
                Ok(fork)
            }
            Err(e) if matches!(e.raw_os_error(), Some(libc::EAGAIN | libc::ENOMEM)) => Err(e),
            // any other refusal: the way that works everywhere, whose
            // own errors are the ones reported (this one is logged: the
            // fallback ends the same, only slower, so a broken clone3
            // would otherwise show nowhere)
            Err(e) => {
                tracing::debug!(error = %e, "clone3 into the cgroup refused; cloning, then moving");
                sys::clone_into_namespaces(flags)
            }
        },
        None => sys::clone_into_namespaces(flags),
    };
    let init_pid = match cloned {
        // Out of processes or memory: not a matter of namespaces.
        Err(e) if matches!(e.raw_os_error(), Some(libc::EAGAIN | libc::ENOMEM)) => {
            return Err(Error::setup("clone", e));
        }
        // EPERM, EINVAL, ENOSPC, EUSERS: user namespaces are unavailable
        // here, which `spawn` turns into the degraded tier or a refusal.
        Err(e) => {
            return Err(Error::Child {
                step: ChildStep::Unshare,
                at: None,
                errno: e.raw_os_error().unwrap_or(0),
            })
        }
        Ok(Fork::Child) => {
            // the host's cgroup directory stays outside (its fd closed; its
            // path left as it is: after clone, system calls only)
            if let Some((fd, dir)) = v2 {
                drop(fd);
                std::mem::forget(dir);
            }
            let child_stdio = stdio.map(|[a, b, c]| {
                drop((a.0, b.0, c.0));
                [a.1, b.1, c.1]
            });
            drop(report_r);
            drop(sync_w);
            drop(status_r);
            init_process(&prepared, report_w, sync_r, status_w, child_stdio)
        }
        Ok(Fork::Parent(pid)) => pid,
    };
    let v2_dir = v2.map(|(fd, dir)| {
        drop(fd);
        dir
    });
    let born_in = v2_dir.as_deref().filter(|_| born);
    drop(report_w);
    drop(sync_r);
    drop(status_w);
    let (stdin, stdout, stderr) = parent_stdio(stdio);
    let mut sb = Sandbox {
        waited: init_pid,
        init: init_pid,
        stdin,
        stdout,
        stderr,
        group,
        status_pipe: Some(File::from(status_r)),
        deadline,
        timed_out: false,
        status: None,
        notes,
        _tmp: None,
        through_helper: false,
        reaped: false,
    };
    match supervise_startup(&mut sb, &prepared, born_in, report_r, sync_w) {
        Ok(()) => Ok(sb),
        Err(e) => {
            let _ = sys::kill(init_pid, libc::SIGKILL);
            let _ = sys::waitpid(init_pid, false);
            sb.reaped = true;
            sb.status = Some(Status::Exited(125));
            Err(e)
        }
    }
}

/// The supervisor's side of start-up: the init's id maps and cgroup, the
/// go-ahead on the sync pipe, then EOF on the report pipe once the command
/// has exec'd.
fn supervise_startup(
    sb: &mut Sandbox,
    prepared: &Prepared,
    born_in: Option<&Path>,
    report_r: OwnedFd,
    sync_w: OwnedFd,
) -> Result<()> {
    // 1. The init waits on the sync pipe: its id maps (only a process
    //    outside its user namespace may write them, user_namespaces(7)),
    //    then its cgroups, moved by pid as cgroup.procs takes it
    //    (cgroups(7)), before it makes its cgroup namespace; all but the
    //    v2 group it was born in, if any.
    write_id_maps(sb.init, prepared.as_root)?;
    if let Some(g) = &sb.group {
        g.add(sb.init, born_in)?;
    }
    let mut sync = File::from(sync_w);
    sync.write_all(b"G")
        .map_err(|e| Error::setup("sync pipe", e))?;
    drop(sync);
    // 2. EOF: every write end is closed, the last one by execve.
    let argv0 = &prepared.args.argv()[0];
    match report::read(report_r.as_raw_fd())
        .map_err(|e| Error::setup("reading the report pipe", e))?
    {
        None => Ok(()),
        Some(r) => Err(explain_exec(
            child_error(r, &prepared.root, argv0),
            prepared,
        )),
    }
}

/// Writes the init's uid/gid maps. Unprivileged: our own ids appear as
/// the sandbox user (the only mapping an ordinary user may write,
/// user_namespaces(7)). As root: inside root maps to host root only so the
/// init can reach bind sources; the sandbox user maps to host nobody, so
/// the command never owns a host file it did not create (the caller's
/// read-only directories are shown to it through idmapped mounts instead,
/// idmap.rs).
fn write_id_maps(init: libc::pid_t, as_root: bool) -> Result<()> {
    let dir = PathBuf::from(format!("/proc/{init}"));
    let w = |file: &str, text: &str| {
        std::fs::write(dir.join(file), text).map_err(|e| Error::setup(format!("writing {file}"), e))
    };
    if as_root {
        w(
            "uid_map",
            &format!("0 0 1\n{SANDBOX_UID} {ROOT_RUN_HOST_ID} 1\n"),
        )?;
        w(
            "gid_map",
            &format!("0 0 1\n{SANDBOX_UID} {ROOT_RUN_HOST_ID} 1\n"),
        )?;
    } else {
        w("setgroups", "deny")?;
        w("uid_map", &format!("{SANDBOX_UID} {} 1\n", sys::geteuid()))?;
        w("gid_map", &format!("{SANDBOX_UID} {} 1\n", sys::getegid()))?;
    }
    Ok(())
}

/// pid 1, cloned by the supervisor into the new namespaces: waits for its
/// id maps and cgroup, makes its cgroup namespace, builds the new root and
/// the Landlock ruleset, starts the bridge, forks the command, then reaps;
/// at the end it reports the command's status before its own exit tears
/// the namespaces down. Runs after clone: system calls only.
fn init_process(
    prepared: &Prepared,
    report_w: OwnedFd,
    sync_r: OwnedFd,
    status_w: OwnedFd,
    stdio: Option<[OwnedFd; 3]>,
) -> ! {
    let rep = report_w.as_raw_fd();
    // Die with the supervisor. If it died before this took effect, its end
    // of the sync pipe is closed and the read below ends us.
    if let Err(e) = sys::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL as libc::c_ulong, 0) {
        report::fail(rep, ChildStep::Pdeathsig, &e);
    }
    if let Some(fds) = stdio {
        for (i, fd) in fds.into_iter().enumerate() {
            if let Err(e) = sys::dup2(fd.as_raw_fd(), i as RawFd) {
                report::fail(rep, ChildStep::Stdio, &e);
            }
        }
    }
    let mut byte = [0u8; 1];
    match sys::read(sync_r.as_raw_fd(), &mut byte) {
        Ok(1) => {}
        _ => sys::exit_now(125),
    }
    drop(sync_r);
    // Now in its cgroup (the supervisor moved it): that group becomes the
    // root of what the sandbox sees of cgroups.
    if let Err(e) = sys::unshare(libc::CLONE_NEWCGROUP) {
        report::fail(rep, ChildStep::CgroupNamespace, &e);
    }
    if let Err(e) = sys::setsid() {
        report::fail(rep, ChildStep::Setsid, &e);
    }
    if let Err(e) = sys::block_signals(&init::waited()) {
        report::fail(rep, ChildStep::BlockSignals, &e);
    }
    if let Err((i, e)) = build_root(&prepared.root) {
        report::fail_at(rep, ChildStep::Root, i32::try_from(i).unwrap_or(-1), &e);
    }
    if let Err(e) = sys::sethostname("mcpbox") {
        report::fail(rep, ChildStep::Sethostname, &e);
    }
    if let Err(e) = sys::loopback_up() {
        report::fail(rep, ChildStep::LoopbackUp, &e);
    }
    // With egress, every outbound TCP connection goes to the bridge's
    // capture listener (ARCHITECTURE.md, "Transparent egress"). Written
    // now, while the init holds its capabilities over the namespace; the
    // bridge binds its listener below, before the command exists.
    if let Some(bridge) = &prepared.bridge {
        for exchange in &bridge.capture {
            // An optional one (the IPv6 route) refused leaves the
            // namespace as it was: no route, so no packet to audit.
            if let Err(e) = crate::netns::run(exchange) {
                if !exchange.optional {
                    report::fail(rep, ChildStep::NetCapture, &e);
                }
            }
        }
        // A new network namespace starts with ping sockets closed to
        // every group (net.ipv4.ping_group_range "1 0", icmp(7)), so an
        // ICMP attempt would fail at socket(2), with no packet for the
        // audit chain to see. Opened to the sandbox's own group only, an
        // echo request becomes a packet that the chain logs and drops
        // (netns.rs). Raw sockets stay refused: no CAP_NET_RAW. Refused
        // (an older kernel), ICMP stays refused, only unaudited.
        let _ = sys::write_file(c"/proc/sys/net/ipv4/ping_group_range", &bridge.ping_groups);
    }
    // The ruleset names paths of the new root, so it is built now; the
    // command restricts itself with it in its last mile.
    let ruleset = match prepared.landlock.build() {
        Ok(fd) => fd,
        Err(e) => report::fail(rep, ChildStep::LandlockRuleset, &e),
    };
    if let Some(bridge) = &prepared.bridge {
        start_bridge(prepared, bridge, rep);
    }
    match sys::fork() {
        Err(e) => report::fail(rep, ChildStep::ForkCommand, &e),
        Ok(Fork::Child) => lastmile::run(
            &prepared.command,
            Some(ruleset.as_raw_fd()),
            &prepared.filter,
            Then::Exec {
                candidates: &prepared.candidates,
                args: &prepared.args,
            },
            rep,
        ),
        Ok(Fork::Parent(pid)) => {
            drop(ruleset);
            drop(report_w);
            lastmile::detach_stdio();
            init::run(pid, status_w)
        }
    }
}

/// Starts the egress bridge as a child of the init: it listens on the
/// sandbox's own loopback and carries each connection to the proxy's unix
/// socket. Its last mile leaves it no capability and the same seccomp
/// filter as the command; the init kills it with everything else at the
/// end.
fn start_bridge(prepared: &Prepared, bridge: &BridgePrep, rep: RawFd) {
    // SocketAddrs, not strings: std binds them with socket, setsockopt,
    // bind (and listen), allocating nothing.
    let at = |port| std::net::SocketAddrV4::new(std::net::Ipv4Addr::LOCALHOST, port);
    let bound = std::net::TcpListener::bind(at(bridge.port)).and_then(|proxy| {
        Ok(crate::BridgeSockets {
            proxy,
            capture: std::net::TcpListener::bind(at(crate::CAPTURE_PORT))?,
            dns_udp: std::net::UdpSocket::bind(at(crate::DNS_PORT))?,
            dns_tcp: std::net::TcpListener::bind(at(crate::DNS_PORT))?,
            nflog: crate::netns::nflog_bind(&bridge.nflog)?,
        })
    });
    let sockets = match bound {
        Ok(s) => s,
        Err(e) => report::fail(rep, ChildStep::BindBridge, &e),
    };
    match sys::fork() {
        Err(e) => report::fail(rep, ChildStep::ForkBridge, &e),
        Ok(Fork::Parent(_)) => drop(sockets),
        // This process never execs: its last mile closes every inherited
        // descriptor (the report pipe above all, whose EOF the supervisor
        // awaits) but the listener; a failure after that goes unreported
        // and ends the bridge with 125.
        Ok(Fork::Child) => lastmile::run(
            &bridge.last,
            None,
            &prepared.filter,
            Then::Bridge {
                bridge: bridge.bridge,
                sockets,
                socket: &bridge.socket,
            },
            rep,
        ),
    }
}

impl Sandbox {
    /// A degraded-tier sandbox: the command is our direct child and leads
    /// its own session and process group, which stands in for the init.
    pub(crate) fn degraded(
        pid: libc::pid_t,
        stdin: Option<File>,
        stdout: Option<File>,
        stderr: Option<File>,
        notes: Vec<String>,
        tmp: crate::degraded::TmpDir,
    ) -> Sandbox {
        Sandbox {
            waited: pid,
            init: -pid,
            stdin,
            stdout,
            stderr,
            group: None,
            status_pipe: None,
            deadline: None,
            timed_out: false,
            status: None,
            notes,
            _tmp: Some(tmp),
            through_helper: false,
            reaped: false,
        }
    }

    /// A sandbox supervised by the helper process `helper`: its end comes as
    /// a record on `control`; the helper enforces the timeout.
    pub(crate) fn through_helper(
        helper: libc::pid_t,
        init: libc::pid_t,
        stdio: (Option<File>, Option<File>, Option<File>),
        control: File,
        notes: Vec<String>,
    ) -> Sandbox {
        Sandbox {
            waited: helper,
            init,
            stdin: stdio.0,
            stdout: stdio.1,
            stderr: stdio.2,
            group: None,
            status_pipe: Some(control),
            deadline: None,
            timed_out: false,
            status: None,
            notes,
            _tmp: None,
            through_helper: true,
            reaped: false,
        }
    }

    pub(crate) fn set_deadline(&mut self, deadline: Option<Instant>) {
        self.deadline = deadline;
    }

    /// The tier it runs in: `full` (namespaces, its own root) or
    /// `degraded` (Landlock, seccomp and rlimits on the host's root).
    pub fn tier(&self) -> &'static str {
        if self.init > 0 {
            "full"
        } else {
            "degraded"
        }
    }

    /// The sandbox's pid 1, as seen from mcpbox.
    pub fn init_pid(&self) -> libc::pid_t {
        self.init
    }

    /// Sends `sig` to the init, which forwards it to the command's group.
    pub fn signal(&self, sig: libc::c_int) {
        let _ = sys::kill(self.init, sig);
    }

    /// Kills the whole sandbox: the init's death empties the namespace.
    /// Through the helper, only the init is killed: the helper sees the end,
    /// reports it and removes the cgroup; dropping the sandbox before its
    /// end kills the helper too.
    pub fn kill(&self) {
        let _ = sys::kill(self.init, libc::SIGKILL);
        if !self.through_helper {
            let _ = sys::kill(self.waited, libc::SIGKILL);
        }
    }

    /// The deadline set by the policy's timeout, if any.
    pub fn deadline(&self) -> Option<Instant> {
        self.deadline
    }

    /// Waits up to `timeout_ms` (None: forever) for the sandbox to end and
    /// records its status. Ok(None) when it is still running.
    fn poll_status(&mut self, timeout_ms: Option<u64>) -> Result<Option<Status>> {
        if let Some(s) = self.status {
            return Ok(Some(s));
        }
        let Some(pipe) = self.status_pipe.as_mut() else {
            return self.poll_child(timeout_ms);
        };
        let ready = sys::poll_readable(&[pipe.as_raw_fd()], timeout_ms)
            .map_err(|e| Error::setup("poll", e))?;
        if !ready[0] {
            return Ok(None);
        }
        let record = report::read(pipe.as_raw_fd());
        self.status_pipe = None;
        match record {
            Ok(Some(Record::Ended(code))) => {
                // The init is still tearing the namespaces down (the
                // helper, removing the cgroup); reap it if it is already
                // done, otherwise on drop (helper) or never mind: `exec`
                // exits right after.
                self.reaped = matches!(
                    sys::waitpid(self.waited, true),
                    Ok(Wait::Exited(..) | Wait::Signaled(..))
                );
                Ok(self.record(Wait::Exited(self.waited, code)))
            }
            // Through the helper, which knows why its sandbox ended.
            Ok(Some(Record::TimedOut)) => {
                let _ = sys::waitpid(self.waited, false);
                self.reaped = true;
                self.status = Some(Status::TimedOut);
                Ok(self.status)
            }
            Ok(Some(Record::OutOfMemory(code))) => {
                let _ = sys::waitpid(self.waited, false);
                self.reaped = true;
                self.status = Some(Status::OutOfMemory(code));
                Ok(self.status)
            }
            // EOF (or garbage) without a status: the init or the helper
            // itself died (killed).
            _ => {
                let w = sys::waitpid(self.waited, false).map_err(|e| Error::setup("waitpid", e))?;
                self.reaped = true;
                Ok(self.record(w))
            }
        }
    }

    /// Without a status pipe (degraded tier, or after it closed): waitpid,
    /// polling every few milliseconds while a timeout is given.
    fn poll_child(&mut self, timeout_ms: Option<u64>) -> Result<Option<Status>> {
        let Some(ms) = timeout_ms else {
            let w = sys::waitpid(self.waited, false).map_err(|e| Error::setup("waitpid", e))?;
            return Ok(self.record(w));
        };
        let until = Instant::now() + std::time::Duration::from_millis(ms);
        loop {
            let w = sys::waitpid(self.waited, true).map_err(|e| Error::setup("waitpid", e))?;
            if let Some(s) = self.record(w) {
                return Ok(Some(s));
            }
            if Instant::now() >= until {
                return Ok(None);
            }
            std::thread::sleep(std::time::Duration::from_millis(2));
        }
    }

    /// Non-blocking: the status if the sandbox has ended.
    pub fn try_wait(&mut self) -> Result<Option<Status>> {
        self.poll_status(Some(0))
    }

    /// Blocks until the sandbox ends, enforcing the timeout.
    pub fn wait(&mut self) -> Result<Status> {
        loop {
            let left = self
                .deadline
                .map(|d| d.saturating_duration_since(Instant::now()).as_millis() as u64);
            if let Some(s) = self.poll_status(left)? {
                return Ok(s);
            }
            if self.deadline.is_some_and(|d| Instant::now() >= d) {
                self.timed_out = true;
                self.kill();
            }
        }
    }

    fn record(&mut self, w: Wait) -> Option<Status> {
        let code = match w {
            Wait::Exited(_, c) => c,
            Wait::Signaled(_, s) => 128 + s,
            Wait::None => return None,
        };
        let status = if self.timed_out {
            Status::TimedOut
        } else if self.group.as_ref().is_some_and(|g| g.oom_killed()) {
            Status::OutOfMemory(code)
        } else {
            Status::Exited(code)
        };
        self.status = Some(status);
        Some(status)
    }
}

impl Drop for Sandbox {
    fn drop(&mut self) {
        if self.status.is_none() {
            let _ = sys::kill(self.init, libc::SIGKILL);
            let _ = sys::kill(self.waited, libc::SIGKILL);
            let _ = sys::waitpid(self.waited, false);
        } else if self.through_helper && !self.reaped {
            // The helper exits right after its report (once its cgroup is
            // removed): reap it, so that a long `run` with TTL restarts
            // leaves no zombies. Not the init of an in-process sandbox,
            // whose namespace teardown `exec` need not wait for.
            let _ = sys::waitpid(self.waited, false);
        }
    }
}

impl Sandbox {
    /// `mcpbox exec`'s wait: forwards the signals [`crate::block_forwarded_signals`]
    /// blocked (read through a signalfd) to the init, enforces the timeout,
    /// and returns how the sandbox ended. The caller blocked them first
    /// thing, before any thread and before the fork, so none is lost: a
    /// signal that arrived meanwhile is pending and read here.
    pub fn wait_forwarding_signals(&mut self) -> Result<Status> {
        let set = init::waited();
        if !sys::signals_blocked(&set) {
            return Err(Error::setup(
                "signalfd",
                std::io::Error::other(
                    "the forwarded signals are not blocked (block_forwarded_signals first)",
                ),
            ));
        }
        let sigfd = sys::signalfd(&set).map_err(|e| Error::setup("signalfd", e))?;
        supervise(self, sigfd.as_raw_fd(), |sb| {
            match sys::read_signal(sigfd.as_raw_fd()).map_err(|e| Error::setup("signalfd", e))? {
                Some(libc::SIGCHLD) | None => {}
                Some(sig) => sb.signal(sig),
            }
            Ok(true)
        })
    }
}

/// Waits for `sb` to end, enforcing its timeout, while watching `watch`
/// (a signalfd, or the helper's control socket): `on_watch` runs when it is
/// readable, and returns whether to keep watching it.
pub(crate) fn supervise(
    sb: &mut Sandbox,
    watch: RawFd,
    mut on_watch: impl FnMut(&mut Sandbox) -> Result<bool>,
) -> Result<Status> {
    let mut watching = true;
    loop {
        if let Some(s) = sb.try_wait()? {
            return Ok(s);
        }
        let timeout = sb
            .deadline
            .map(|d| d.saturating_duration_since(Instant::now()).as_millis() as u64);
        let mut fds = Vec::with_capacity(2);
        if watching {
            fds.push(watch);
        }
        if let Some(p) = &sb.status_pipe {
            fds.push(p.as_raw_fd());
        }
        let ready = sys::poll_readable(&fds, timeout).map_err(|e| Error::setup("poll", e))?;
        if watching && ready[0] {
            watching = on_watch(sb)?;
        }
        if !ready.iter().any(|r| *r) && sb.deadline.is_some_and(|d| Instant::now() >= d) {
            sb.timed_out = true;
            sb.kill();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::plan::Step;

    fn steps() -> Vec<Step> {
        vec![
            Step::Dir {
                path: "/usr".into(),
                mode: 0o755,
            },
            Step::Bind {
                host: "/usr".into(),
                path: "/usr".into(),
                access: Access::ReadOnly,
            },
            Step::File {
                path: "/etc/hostname".into(),
                contents: "mcpbox\n".into(),
            },
            Step::Bind {
                host: "/dev/null".into(),
                path: "/dev/null".into(),
                access: Access::Device,
            },
        ]
    }

    #[test]
    fn the_root_starts_private_and_ends_read_only_with_one_detach() {
        let ops = compile_root(&steps()).unwrap();
        assert_eq!(ops.first().unwrap().label, "make / private");
        assert_eq!(ops.last().unwrap().label, "remount / read-only");
        let detaches = ops
            .iter()
            .filter(|o| matches!(o.call, Call::Umount { flags, .. } if flags == libc::MNT_DETACH))
            .count();
        assert_eq!(detaches, 1, "one RCU grace period, not two");
    }

    #[test]
    fn a_read_only_bind_onto_its_new_dir_is_mounted_from_oldroot_then_made_read_only() {
        let ops = compile_root(&steps()).unwrap();
        let i = ops
            .iter()
            .position(|o| o.label == "bind /usr -> /usr")
            .unwrap();
        // The directory made just before is the mount point: no Touch.
        assert!(
            matches!(&ops[i - 1].call, Call::Mkdir { path, .. } if path.as_bytes() == b"/newroot/usr")
        );
        match &ops[i].call {
            Call::Mount { source, flags, .. } => {
                assert_eq!(source.as_deref().unwrap().to_bytes(), b"/oldroot/usr");
                assert_eq!(*flags, libc::MS_BIND | libc::MS_REC);
            }
            other => panic!("{other:?}"),
        }
        assert!(matches!(&ops[i + 1].call, Call::SetAttr { attrs, .. }
            if attrs & sys::MOUNT_ATTR_RDONLY != 0 && attrs & sys::MOUNT_ATTR_NOSUID != 0));
    }

    #[test]
    fn a_device_bind_keeps_the_hosts_flags() {
        let ops = compile_root(&steps()).unwrap();
        let i = ops
            .iter()
            .position(|o| o.label == "bind /dev/null -> /dev/null")
            .unwrap();
        // No directory made for it: its mount point is touched first.
        assert!(
            matches!(&ops[i - 1].call, Call::Touch { path } if path.as_bytes() == b"/newroot/dev/null")
        );
        assert!(!matches!(ops[i + 1].call, Call::SetAttr { .. }));
    }

    #[test]
    fn a_failed_root_operation_is_named_by_its_label() {
        let ops = compile_root(&steps()).unwrap();
        let i = ops
            .iter()
            .position(|o| o.label == "write /etc/hostname")
            .unwrap();
        let err = child_error(
            Record::Failed {
                step: ChildStep::Root,
                errno: libc::EROFS,
                arg: i as i32,
            },
            &ops,
            &CString::new("true").unwrap(),
        );
        let text = err.to_string();
        assert!(
            text.contains("build the root") && text.contains("write /etc/hostname"),
            "{text}"
        );
        assert!(text.contains("Read-only file system"), "{text}");
    }

    #[test]
    fn exec_failures_map_to_127_and_126() {
        let argv0 = CString::new("nope").unwrap();
        let not_found = child_error(
            Record::ExecFailed {
                code: 127,
                errno: libc::ENOENT,
            },
            &[],
            &argv0,
        );
        assert_eq!(not_found.exit_code(), 127);
        let denied = child_error(
            Record::ExecFailed {
                code: 126,
                errno: libc::EACCES,
            },
            &[],
            &argv0,
        );
        assert_eq!(denied.exit_code(), 126);
        assert!(denied.to_string().contains("Permission denied"));
    }

    #[test]
    fn the_last_miles_differ_only_as_data() {
        let command = command_last_mile(vec![(libc::RLIMIT_CORE, 0)], false, 40);
        let bridge = bridge_last_mile(false, 40);
        let degraded = crate::degraded::command_last_mile(
            vec![(libc::RLIMIT_CORE, 0)],
            Some([5, 6, 7]),
            CString::new("/tmp/x").unwrap(),
            true,
            40,
        );
        // The command: its own group, /workspace, close-on-exec, the
        // sandbox user, Landlock; strict about the bounding set.
        assert_eq!(command.session, Session::OwnGroup);
        assert_eq!(
            command.chdir.as_deref(),
            CString::new(WORKSPACE).ok().as_deref()
        );
        assert_eq!(command.fds, Fds::CloseOnExec);
        assert_eq!(command.uid, Some(SANDBOX_UID));
        assert!(command.landlock && command.strict_bounding && !command.clear_groups);
        // The bridge: no stdio of the command, nothing but its listener,
        // no capability, no Landlock (it must reach the proxy's socket).
        assert_eq!(bridge.stdio, StdioSetup::Null);
        assert_eq!(bridge.fds, Fds::CloseAllButListener);
        assert_eq!(bridge.uid, Some(SANDBOX_UID));
        assert!(!bridge.landlock && bridge.rlimits.is_empty());
        // The degraded command: a session of its own (no init), its pipes,
        // host nobody when run as root, lenient bounding set.
        assert_eq!(degraded.session, Session::Setsid);
        assert_eq!(degraded.stdio, StdioSetup::Dup([5, 6, 7]));
        assert_eq!(degraded.uid, Some(ROOT_RUN_HOST_ID));
        assert!(degraded.landlock && !degraded.strict_bounding && degraded.clear_groups);
    }

    #[test]
    fn spawn_refuses_to_fork_while_other_threads_are_alive() {
        let (tx, rx) = std::sync::mpsc::channel::<()>();
        let t = std::thread::spawn(move || {
            let _ = rx.recv();
        });
        let spec = Spec {
            argv: vec!["true".into()],
            env: Vec::new(),
            input: None,
            output: None,
            tmp_size: 1 << 20,
            mounts: Vec::new(),
            limits: crate::Limits::default(),
            allow_exec: None,
            allow_degraded: false,
            stdio: Stdio::Piped,
            egress: None,
            tmp_dir: None,
            cgroup_parent: None,
        };
        let err = spawn(&spec).unwrap_err();
        drop(tx);
        t.join().unwrap();
        assert!(
            matches!(err, Error::Threaded { threads } if threads >= 2),
            "{err}"
        );
    }
}
