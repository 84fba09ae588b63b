//! The weaker tier, for hosts without user namespaces (Ubuntu 24.04's
//! AppArmor restriction, `user.max_user_namespaces = 0`, some containers).
//!
//! Only what an unprivileged process can still do to itself holds here:
//! Landlock (read-only vs read-write paths, no TCP, scoped signals and
//! abstract sockets where the kernel has them), seccomp, no_new_privs,
//! dropped capabilities, a new session and rlimits. There is no new root:
//! the command sees host paths (told through `MCPBOX_INPUT`,
//! `MCPBOX_OUTPUT`, `MCPBOX_TMP`), the host's `/etc` and `/proc`, and the
//! host's network stack for UDP. A policy gets this tier only when it says
//! `sandbox.dangerously_allow_degraded = true`; mcpbox says so on stderr.

use std::ffi::OsString;
use std::os::fd::{AsRawFd, RawFd};
use std::os::unix::ffi::OsStrExt;
use std::path::PathBuf;
use std::time::Instant;

use crate::lastmile::{self, Fds, LastMile, Session, StdioSetup, Then};
use crate::launch::{Prepared, Sandbox};
use crate::report::{self, ChildStep};
use crate::sys::{self, Fork};
use crate::{landlock, Error, Result, Spec, ROOT_RUN_HOST_ID};

/// What the degraded tier cannot give, said once on stderr.
pub const NOTE: &str = "user namespaces are unavailable here: running in the degraded tier \
    (Landlock, seccomp, no_new_privs, rlimits; host paths and /proc are visible read-only, \
    UDP is not blocked, processes that leave the session can outlive mcpbox); see `mcpbox doctor`";

/// What `process.allow_exec` cannot hold in this tier, said on stderr.
pub const NOTE_ALLOW_EXEC: &str = "allow_exec in the degraded tier: a program written to tmp or \
    output can still be run through the dynamic loader (ld.so FILE), since no mount can be made \
    noexec here";

/// Host directories the command may read (and execute) in this tier.
const SYSTEM_READ: &[&str] = &[
    "/usr", "/bin", "/sbin", "/lib", "/lib32", "/lib64", "/libx32", "/etc", "/proc",
];

/// The host directory standing in for /workspace/tmp: a per-sandbox one,
/// removed when the sandbox is dropped, or the spec's `tmp_dir`, kept
/// (`.1` is whether to remove it).
#[derive(Debug)]
pub struct TmpDir(pub PathBuf, bool);

impl Drop for TmpDir {
    fn drop(&mut self) {
        if self.1 {
            let _ = std::fs::remove_dir_all(&self.0);
        }
    }
}

fn count_own_processes(uid: u32) -> u64 {
    use std::os::unix::fs::MetadataExt;
    let Ok(entries) = std::fs::read_dir("/proc") else {
        return 0;
    };
    entries
        .flatten()
        .filter(|e| e.file_name().as_bytes().iter().all(u8::is_ascii_digit))
        .filter(|e| e.metadata().map(|m| m.uid() == uid).unwrap_or(false))
        .count() as u64
}

/// Starts the command in the degraded tier.
pub fn spawn(spec: &Spec, mut prepared: Prepared, mut notes: Vec<String>) -> Result<Sandbox> {
    if !spec.mounts.is_empty() {
        return Err(Error::Unenforceable(
            "filesystem.mounts need a mount namespace, which this host does not allow (degraded tier); \
             remove the extra mounts or enable user namespaces (see `mcpbox doctor`)"
                .into(),
        ));
    }
    if spec.egress.is_some() {
        return Err(Error::Unenforceable(
            "network.allow needs a network namespace for the egress proxy, which this host does not allow \
             (degraded tier); remove network.allow or enable user namespaces (see `mcpbox doctor`)"
                .into(),
        ));
    }
    notes.push(NOTE.into());
    if spec.allow_exec.is_some() {
        // No mount namespace, so no mount of ours to make noexec: Landlock
        // still refuses execve of an unlisted file and seccomp memfd_create,
        // but the dynamic loader maps what it is given (docs/threat-model.md,
        // Limitations).
        notes.push(NOTE_ALLOW_EXEC.into());
    }
    let tmp = match &spec.tmp_dir {
        Some(dir) => TmpDir(dir.clone(), false),
        None => {
            let base = std::env::temp_dir().join(format!("mcpbox-{}-{}", sys::getpid(), unique()));
            std::fs::create_dir(&base)
                .map_err(|e| Error::setup(format!("create {}", base.display()), e))?;
            TmpDir(base, true)
        }
    };
    let home = tmp.0.join("home");
    match std::fs::symlink_metadata(&home) {
        Ok(m) if m.is_dir() => {}
        Ok(_) => {
            return Err(Error::setup(
                "create HOME",
                std::io::Error::from_raw_os_error(libc::ENOTDIR),
            ))
        }
        Err(_) => std::fs::create_dir(&home).map_err(|e| Error::setup("create HOME", e))?,
    }
    let host_root = sys::is_host_root();
    if host_root {
        for dir in [&tmp.0, &home] {
            sys::cstr(dir)
                .and_then(|d| sys::chown(&d, ROOT_RUN_HOST_ID, ROOT_RUN_HOST_ID))
                .map_err(|e| Error::setup("chown tmp", e))?;
        }
    }

    // Environment: the workspace lives at host paths here.
    let mut env: Vec<(OsString, OsString)> = spec
        .env
        .iter()
        .filter(|(k, _)| k != "HOME")
        .cloned()
        .collect();
    env.push(("HOME".into(), home.clone().into()));
    env.push(("TMPDIR".into(), tmp.0.clone().into()));
    env.push(("MCPBOX_TMP".into(), tmp.0.clone().into()));
    if let Some(i) = &spec.input {
        env.push(("MCPBOX_INPUT".into(), i.clone().into()));
    }
    if let Some(o) = &spec.output {
        env.push(("MCPBOX_OUTPUT".into(), o.clone().into()));
    }
    prepared.args =
        crate::sys::ExecArgs::new(prepared.args.argv().to_vec(), crate::launch::envp(&env)?);

    let mut readable: Vec<PathBuf> = SYSTEM_READ.iter().map(PathBuf::from).collect();
    readable.extend(spec.input.iter().cloned());
    let mut writable = vec![tmp.0.clone()];
    writable.extend(spec.output.iter().cloned());
    let cwd = spec.output.clone().unwrap_or_else(|| tmp.0.clone());

    // RLIMIT_NPROC counts every process of the uid here (no user namespace
    // of our own): allow what the user already runs plus the policy's pids.
    let uid = if host_root {
        ROOT_RUN_HOST_ID
    } else {
        sys::geteuid()
    };
    let mut rlimits = prepared.command.rlimits.clone();
    for (res, value) in rlimits.iter_mut() {
        if *res == libc::RLIMIT_NPROC {
            *value += count_own_processes(uid);
        }
    }
    // The ruleset names host paths here, so this process builds it before
    // forking; the command restricts itself with it.
    let ruleset = landlock::Plan::required(
        prepared.abi,
        landlock::Tier::Degraded,
        &readable,
        &writable,
        spec.allow_exec.as_deref(),
    )?
    .build()
    .map_err(|e| Error::setup("landlock ruleset", e))?;

    let (report_r, report_w) = sys::pipe().map_err(|e| Error::setup("report pipe", e))?;
    let stdio = crate::launch::make_stdio(prepared.piped)?;
    let last = command_last_mile(
        rlimits,
        stdio
            .as_ref()
            .map(|[a, b, c]| [a.1.as_raw_fd(), b.1.as_raw_fd(), c.1.as_raw_fd()]),
        sys::cstr(&cwd).map_err(|e| Error::setup("chdir", e))?,
        host_root,
        prepared.command.last_cap,
    );
    let supervisor = sys::getpid();
    match sys::fork().map_err(|e| Error::setup("fork", e))? {
        Fork::Child => {
            drop(report_r);
            let rep: RawFd = report_w.as_raw_fd();
            // Runs after fork: system calls only.
            if let Err(e) = sys::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL as libc::c_ulong, 0) {
                report::fail(rep, ChildStep::Pdeathsig, &e);
            }
            if sys::getppid() != supervisor {
                sys::exit_now(125);
            }
            lastmile::run(
                &last,
                Some(ruleset.as_raw_fd()),
                &prepared.filter,
                Then::Exec {
                    candidates: &prepared.candidates,
                    args: &prepared.args,
                },
                rep,
            )
        }
        Fork::Parent(pid) => {
            drop(report_w);
            drop(ruleset);
            let (stdin, stdout, stderr) = crate::launch::parent_stdio(stdio);
            let mut sb = Sandbox::degraded(pid, stdin, stdout, stderr, notes, tmp);
            sb.set_deadline(spec.limits.timeout.map(|t| Instant::now() + t));
            crate::launch::await_exec(&mut sb, report_r, &prepared)?;
            Ok(sb)
        }
    }
}

fn unique() -> u64 {
    use std::sync::atomic::{AtomicU64, Ordering};
    static N: AtomicU64 = AtomicU64::new(0);
    N.fetch_add(1, Ordering::Relaxed)
}

/// The last mile of the degraded tier's command: a new session (no init
/// here), the pipes as stdio, the workspace's host directory as cwd; as
/// host root, also the identity of host nobody. Capabilities are dropped
/// where we have any (root, or root of an outer user namespace).
pub(crate) fn command_last_mile(
    rlimits: Vec<(libc::__rlimit_resource_t, u64)>,
    pipes: Option<[RawFd; 3]>,
    cwd: std::ffi::CString,
    host_root: bool,
    last_cap: u32,
) -> LastMile {
    LastMile {
        session: Session::Setsid,
        stdio: pipes.map_or(StdioSetup::Keep, StdioSetup::Dup),
        chdir: Some(cwd),
        rlimits,
        fds: Fds::CloseOnExec,
        last_cap,
        strict_bounding: false,
        clear_groups: host_root,
        uid: host_root.then_some(ROOT_RUN_HOST_ID),
        landlock: true,
    }
}
