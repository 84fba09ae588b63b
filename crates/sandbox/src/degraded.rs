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
use std::os::fd::{AsRawFd, OwnedFd, RawFd};
use std::os::unix::ffi::OsStrExt;
use std::path::{Path, PathBuf};
use std::time::Instant;

use crate::launch::{Prepared, Sandbox};
use crate::sys::{self, Fork};
use crate::{landlock, Error, Result, Spec, ROOT_RUN_HOST_ID};

/// What the degraded tier cannot give, said once on stderr.
pub const NOTE: &str = "user namespaces are unavailable here: running in the degraded tier \
    (Landlock, seccomp, no_new_privs, rlimits; host paths and /proc are visible read-only, \
    UDP is not blocked, processes that leave the session can outlive mcpbox); see `mcpbox doctor`";

/// Host directories the command may read (and execute) in this tier.
const SYSTEM_READ: &[&str] = &[
    "/usr", "/bin", "/sbin", "/lib", "/lib32", "/lib64", "/libx32", "/etc", "/proc",
];

/// A per-sandbox directory on the host standing in for /workspace/tmp,
/// removed when the sandbox is dropped.
#[derive(Debug)]
pub struct TmpDir(pub PathBuf);

impl Drop for TmpDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
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
    let base = std::env::temp_dir().join(format!("mcpbox-{}-{}", sys::getpid(), unique()));
    std::fs::create_dir(&base)
        .map_err(|e| Error::setup(format!("create {}", base.display()), e))?;
    let tmp = TmpDir(base);
    let home = tmp.0.join("home");
    std::fs::create_dir(&home).map_err(|e| Error::setup("create HOME", e))?;
    let host_root = sys::is_host_root();
    if host_root {
        for dir in [&tmp.0, &home] {
            sys::chown(dir, ROOT_RUN_HOST_ID, ROOT_RUN_HOST_ID)
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
    prepared.envp = crate::launch::envp(&env)?;

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
    for (res, value) in prepared.rlimits.iter_mut() {
        if *res == libc::RLIMIT_NPROC {
            *value += count_own_processes(uid);
        }
    }

    let (report_r, report_w) = sys::pipe().map_err(|e| Error::setup("report pipe", e))?;
    let stdio = crate::launch::make_stdio(&prepared)?;
    let supervisor = sys::getpid();
    match sys::fork().map_err(|e| Error::setup("fork", e))? {
        Fork::Child => {
            drop(report_r);
            let child = stdio.map(|[a, b, c]| {
                drop((a.0, b.0, c.0));
                [a.1, b.1, c.1]
            });
            command(
                &prepared, supervisor, report_w, child, &readable, &writable, &cwd, host_root,
            )
        }
        Fork::Parent(pid) => {
            drop(report_w);
            let (stdin, stdout, stderr) = crate::launch::parent_stdio(stdio);
            let mut sb = Sandbox::degraded(pid, stdin, stdout, stderr, notes, tmp);
            sb.set_deadline(spec.limits.timeout.map(|t| Instant::now() + t));
            crate::launch::await_exec(&mut sb, report_r)?;
            Ok(sb)
        }
    }
}

fn unique() -> u64 {
    use std::sync::atomic::{AtomicU64, Ordering};
    static N: AtomicU64 = AtomicU64::new(0);
    N.fetch_add(1, Ordering::Relaxed)
}

/// The command in the degraded tier. Never returns.
#[allow(clippy::too_many_arguments)]
fn command(
    prepared: &Prepared,
    supervisor: libc::pid_t,
    report_w: OwnedFd,
    stdio: Option<[OwnedFd; 3]>,
    readable: &[PathBuf],
    writable: &[PathBuf],
    cwd: &Path,
    host_root: bool,
) -> ! {
    let rep: RawFd = report_w.as_raw_fd();
    let fail = |step: &str, e: std::io::Error| crate::launch::report(rep, step, &e);
    if let Err(e) = sys::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL as libc::c_ulong, 0) {
        fail("pdeathsig", e);
    }
    if sys::getppid() != supervisor {
        sys::exit_now(125);
    }
    let _ = sys::unblock_all_signals();
    sys::reset_signal_dispositions();
    // A new session: no controlling terminal (CVE-2017-5226), and a process
    // group the supervisor can kill as a whole.
    if let Err(e) = sys::setsid() {
        fail("setsid", e);
    }
    if let Some(fds) = stdio {
        for (i, fd) in fds.into_iter().enumerate() {
            if let Err(e) = sys::dup2(fd.as_raw_fd(), i as RawFd) {
                fail("stdio", e);
            }
        }
    }
    if let Err(e) = sys::chdir(cwd) {
        fail("chdir", e);
    }
    for (resource, value) in &prepared.rlimits {
        if let Err(e) = sys::setrlimit(*resource, *value) {
            fail("setrlimit", e);
        }
    }
    if let Err(e) = sys::cloexec_fds_from(3) {
        fail("close fds", e);
    }
    // Capabilities, where we have any (root, or root of an outer user
    // namespace); as host root, also the identity of host nobody.
    let uid = host_root.then_some(ROOT_RUN_HOST_ID);
    if let Err((step, e)) = crate::launch::drop_privileges(host_root, uid, false) {
        fail(step, e);
    }
    match landlock::restrict(
        landlock::Tier::Degraded,
        readable,
        writable,
        prepared.allow_exec.as_deref(),
    ) {
        Ok(landlock::Enforced::Fully) | Ok(landlock::Enforced::Partially) => {}
        Ok(landlock::Enforced::Not) => fail(
            "landlock",
            std::io::Error::other("landlock is not supported by this kernel"),
        ),
        Err(e) => fail("landlock", std::io::Error::other(e)),
    }
    if let Err(e) = sys::seccomp_load(&prepared.filter) {
        fail("seccomp", e);
    }
    crate::launch::exec_command(prepared, rep)
}
