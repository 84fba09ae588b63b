//! Starting a sandbox: the one linear sequence.
//!
//! Three processes take part besides the command:
//!
//! ```text
//! supervisor (mcpbox)            holds the cgroup, writes the id maps, waits
//!  └─ holder                     unshares the namespaces, waits for the init
//!      └─ init (pid 1)           builds the root, then reaps and forwards
//!          └─ command            drops everything, then execve
//! ```
//!
//! Each child dies with its parent (PR_SET_PDEATHSIG), and the init's death
//! kills the whole pid namespace, so killing mcpbox by any signal leaves no
//! process of the sandbox alive. Every failure in a child is written to the
//! report pipe as one line naming the step, read by the supervisor.
//!
//! The order of the command's last steps matters and is argued inline:
//! identity, capabilities, no_new_privs, Landlock, then seccomp last (it
//! would otherwise forbid the calls that come before it).

use std::ffi::{CString, OsStr, OsString};
use std::fs::File;
use std::io::{BufRead, BufReader, Write};
use std::os::fd::{AsRawFd, OwnedFd, RawFd};
use std::os::unix::ffi::OsStrExt;
use std::path::{Path, PathBuf};
use std::time::Instant;

use crate::cgroup::{Group, Layout};
use crate::plan::{self, Access, HostFacts, Step};
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
    holder: libc::pid_t,
    init: libc::pid_t,
    /// The command's stdin, stdout and stderr with [`Stdio::Piped`].
    pub stdin: Option<File>,
    pub stdout: Option<File>,
    pub stderr: Option<File>,
    group: Option<Group>,
    /// The holder writes `S<code>` here as soon as the init is gone, before
    /// its own (slow) exit tears the namespaces down; see `holder`.
    status_pipe: Option<File>,
    deadline: Option<Instant>,
    timed_out: bool,
    status: Option<Status>,
    /// Human-readable notes on weaker enforcement that was accepted.
    pub notes: Vec<String>,
    /// The degraded tier's host directory for tmp, held only to be removed
    /// when the sandbox is dropped.
    _tmp: Option<crate::degraded::TmpDir>,
}

/// Everything the children need, prepared before forking so that the
/// children only execute.
pub(crate) struct Prepared {
    pub(crate) steps: Vec<Step>,
    pub(crate) argv: Vec<CString>,
    pub(crate) envp: Vec<CString>,
    pub(crate) candidates: Vec<CString>,
    pub(crate) readable: Vec<PathBuf>,
    pub(crate) writable: Vec<PathBuf>,
    pub(crate) allow_exec: Option<Vec<PathBuf>>,
    pub(crate) filter: Vec<libc::sock_filter>,
    pub(crate) rlimits: Vec<(libc::__rlimit_resource_t, u64)>,
    pub(crate) as_root: bool,
    pub(crate) egress: Option<crate::Egress>,
    pub(crate) piped: bool,
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

fn prepare(spec: &Spec) -> Result<Prepared> {
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
    Ok(Prepared {
        steps: plan::plan(spec, &facts),
        argv,
        envp,
        candidates: exec_candidates(argv0, &spec.env)?,
        readable: plan::readable_paths(spec),
        writable: plan::writable_paths(spec),
        allow_exec: spec.allow_exec.clone(),
        filter: seccomp::compile(seccomp::RULES),
        rlimits,
        as_root: sys::is_host_root(),
        egress: spec.egress.clone(),
        piped: spec.stdio == Stdio::Piped,
    })
}

/// A child's report of a failed step, written to the report pipe.
pub(crate) fn report(fd: RawFd, step: &str, err: &std::io::Error) -> ! {
    let line = format!("E{step}\x1f{err}\n");
    let _ = sys::write_all(fd, line.as_bytes());
    sys::exit_now(125)
}

/// Creates the cgroup `spec` needs, or refuses, or accepts rlimits when the
/// policy allows the weaker tier.
fn limits_group(
    spec: &Spec,
    prepared: &mut Prepared,
    notes: &mut Vec<String>,
) -> Result<Option<Group>> {
    if crate::cgroup::needed(&spec.limits).is_empty() {
        return Ok(None);
    }
    let name = format!("mcpbox-{}", sys::getpid());
    match Group::create(&Layout::read(), &spec.limits, &name) {
        Ok(group) => Ok(group),
        Err(e) if spec.allow_degraded => {
            if let Some(mem) = spec.limits.memory {
                prepared.rlimits.push((libc::RLIMIT_AS, mem));
                notes.push(format!(
                    "memory limit is per-process address space (RLIMIT_AS), not a cgroup: {e}"
                ));
            }
            if spec.limits.cpu.is_some() {
                notes.push(format!("cpu limit is not enforced: {e}"));
            }
            Ok(None)
        }
        Err(e) => Err(e),
    }
}

/// Builds the sandbox and starts the command in it. Where user namespaces
/// are unavailable, falls back to the degraded tier if the policy accepts it.
pub fn spawn(spec: &Spec) -> Result<Sandbox> {
    match spawn_full(spec) {
        Err(Error::NoUserNamespaces(why)) if spec.allow_degraded => {
            tracing::debug!(%why, "user namespaces unavailable; degraded tier accepted by the policy");
            let mut prepared = prepare(spec)?;
            let mut notes = Vec::new();
            if let Some(mem) = spec.limits.memory {
                prepared.rlimits.push((libc::RLIMIT_AS, mem));
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

pub(crate) fn make_stdio(prepared: &Prepared) -> Result<StdioPipes> {
    if !prepared.piped {
        return Ok(None);
    }
    let (in_r, in_w) = sys::pipe().map_err(|e| Error::setup("stdin pipe", e))?;
    let (out_r, out_w) = sys::pipe().map_err(|e| Error::setup("stdout pipe", e))?;
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

/// Reads the report pipe to EOF (the command's execve closed it); a line
/// before that is a failed step, and the start is undone.
pub(crate) fn await_exec(sb: &mut Sandbox, report_r: OwnedFd) -> Result<()> {
    let mut text = String::new();
    let read = std::io::Read::read_to_string(&mut File::from(report_r), &mut text);
    let failure = match read {
        Err(e) => Some(Error::setup("reading the report pipe", e)),
        Ok(_) => text.lines().next().map(child_error),
    };
    match failure {
        None => Ok(()),
        Some(e) => {
            sb.kill();
            let _ = sys::waitpid(sb.holder, false);
            sb.status = Some(Status::Exited(125));
            Err(e)
        }
    }
}

fn spawn_full(spec: &Spec) -> Result<Sandbox> {
    let mut prepared = prepare(spec)?;
    let mut notes = Vec::new();
    let group = limits_group(spec, &mut prepared, &mut notes)?;
    let deadline = spec.limits.timeout.map(|t| Instant::now() + t);

    let (report_r, report_w) = sys::pipe().map_err(|e| Error::setup("report pipe", e))?;
    let (sync_r, sync_w) = sys::pipe().map_err(|e| Error::setup("sync pipe", e))?;
    let (status_r, status_w) = sys::pipe().map_err(|e| Error::setup("status pipe", e))?;
    let stdio = make_stdio(&prepared)?;
    let supervisor = sys::getpid();

    match sys::fork().map_err(|e| Error::setup("fork", e))? {
        Fork::Child => {
            let child_stdio = stdio.map(|[a, b, c]| {
                drop((a.0, b.0, c.0));
                [a.1, b.1, c.1]
            });
            drop(report_r);
            drop(sync_w);
            drop(status_r);
            holder(
                &prepared,
                group.as_ref(),
                supervisor,
                report_w,
                sync_r,
                status_w,
                child_stdio,
            )
        }
        Fork::Parent(holder_pid) => {
            drop(report_w);
            drop(sync_r);
            drop(status_w);
            let (stdin, stdout, stderr) = parent_stdio(stdio);
            let mut sb = Sandbox {
                holder: holder_pid,
                init: 0,
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
            };
            match supervise_startup(&mut sb, &prepared, report_r, sync_w) {
                Ok(()) => Ok(sb),
                Err(e) => {
                    let _ = sys::kill(holder_pid, libc::SIGKILL);
                    let _ = sys::waitpid(holder_pid, false);
                    sb.status = Some(Status::Exited(125));
                    Err(e)
                }
            }
        }
    }
}

/// The supervisor's side of start-up: id maps, then the init's pid, then
/// EOF on the report pipe once the command has exec'd.
fn supervise_startup(
    sb: &mut Sandbox,
    prepared: &Prepared,
    report_r: OwnedFd,
    sync_w: OwnedFd,
) -> Result<()> {
    let mut lines = BufReader::new(File::from(report_r));
    let mut line = String::new();
    let mut next = |line: &mut String| -> Result<Option<String>> {
        line.clear();
        match lines.read_line(line) {
            Ok(0) => Ok(None),
            Ok(_) => Ok(Some(line.trim_end_matches('\n').to_string())),
            Err(e) => Err(Error::setup("reading the report pipe", e)),
        }
    };
    // 1. The holder has unshared; write its id maps.
    match next(&mut line)? {
        Some(l) if l == "U" => {}
        Some(l) => return Err(child_error(&l)),
        None => {
            return Err(Error::Child {
                step: "start".into(),
                detail: "holder exited".into(),
            })
        }
    }
    write_id_maps(sb.holder, prepared.as_root)?;
    let mut sync = File::from(sync_w);
    sync.write_all(b"G")
        .map_err(|e| Error::setup("sync pipe", e))?;
    drop(sync);
    // 2. The init's pid, as seen from here.
    match next(&mut line)? {
        Some(l) if l.starts_with('P') => {
            sb.init = l[1..].parse().map_err(|_| Error::Child {
                step: "init".into(),
                detail: l.clone(),
            })?;
        }
        Some(l) => return Err(child_error(&l)),
        None => {
            return Err(Error::Child {
                step: "init".into(),
                detail: "holder exited".into(),
            })
        }
    }
    // 3. EOF: every write end is closed, the last one by execve.
    match next(&mut line)? {
        None => Ok(()),
        Some(l) => Err(child_error(&l)),
    }
}

fn child_error(line: &str) -> Error {
    if let Some(rest) = line.strip_prefix('X') {
        let mut parts = rest.splitn(3, '\x1f');
        let code = parts.next().and_then(|c| c.parse().ok()).unwrap_or(126);
        let command = parts.next().unwrap_or("").to_string();
        let detail = parts.next().unwrap_or("").to_string();
        return Error::Exec {
            command,
            detail,
            code,
        };
    }
    let rest = line.strip_prefix('E').unwrap_or(line);
    let (step, detail) = rest.split_once('\x1f').unwrap_or((rest, ""));
    if step == "unshare" {
        return Error::NoUserNamespaces(detail.to_string());
    }
    Error::Child {
        step: step.to_string(),
        detail: detail.to_string(),
    }
}

/// Writes the holder's uid/gid maps. Unprivileged: our own ids appear as
/// the sandbox user (the only mapping an ordinary user may write,
/// user_namespaces(7)). As root: inside root maps to host root only so the
/// init can reach bind sources; the sandbox user maps to host nobody, so
/// the command never owns a host file it did not create.
fn write_id_maps(holder: libc::pid_t, as_root: bool) -> Result<()> {
    let dir = PathBuf::from(format!("/proc/{holder}"));
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

/// The holder: joins the cgroup, unshares, waits for its id maps, forks the
/// init and waits for it. Never returns.
fn holder(
    prepared: &Prepared,
    group: Option<&Group>,
    supervisor: libc::pid_t,
    report_w: OwnedFd,
    sync_r: OwnedFd,
    status_w: OwnedFd,
    stdio: Option<[OwnedFd; 3]>,
) -> ! {
    let rep = report_w.as_raw_fd();
    // Die with the supervisor; if it is already gone, stop here.
    if let Err(e) = sys::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL as libc::c_ulong, 0) {
        report(rep, "pdeathsig", &e);
    }
    if sys::getppid() != supervisor {
        sys::exit_now(125);
    }
    if let Some(fds) = stdio {
        for (i, fd) in fds.into_iter().enumerate() {
            if let Err(e) = sys::dup2(fd.as_raw_fd(), i as RawFd) {
                report(rep, "stdio", &e);
            }
        }
    }
    if let Some(group) = group {
        if let Err(e) = group.join(sys::getpid()) {
            report(rep, "cgroup join", &std::io::Error::other(e.to_string()));
        }
    }
    // Namespaces: user first in the same call, so the others are owned by it
    // (unshare(2)); the cgroup namespace after joining the group, so the
    // group is the sandbox's cgroup root.
    let flags = libc::CLONE_NEWUSER
        | libc::CLONE_NEWNS
        | libc::CLONE_NEWPID
        | libc::CLONE_NEWNET
        | libc::CLONE_NEWIPC
        | libc::CLONE_NEWUTS
        | libc::CLONE_NEWCGROUP;
    if let Err(e) = sys::unshare(flags) {
        report(rep, "unshare", &e);
    }
    let _ = sys::write_all(rep, b"U\n");
    let mut byte = [0u8; 1];
    match sys::read(sync_r.as_raw_fd(), &mut byte) {
        Ok(1) => {}
        _ => sys::exit_now(125),
    }
    drop(sync_r);
    // The init learns of our death through this pipe's EOF, closing the race
    // between its fork and its own PR_SET_PDEATHSIG.
    let (alive_r, alive_w) = match sys::pipe() {
        Ok(p) => p,
        Err(e) => report(rep, "alive pipe", &e),
    };
    match sys::fork() {
        Err(e) => report(rep, "fork init", &e),
        Ok(Fork::Child) => {
            drop(alive_w);
            init_process(prepared, report_w, alive_r)
        }
        Ok(Fork::Parent(pid)) => {
            drop(alive_r);
            let _ = sys::write_all(rep, format!("P{pid}\n").as_bytes());
            drop(report_w);
            detach_stdio();
            let code = match sys::waitpid(pid, false) {
                Ok(Wait::Exited(_, code)) => code,
                Ok(Wait::Signaled(_, sig)) => 128 + sig,
                _ => 125,
            };
            // Report the status first: our own exit drops the last reference
            // to the mount and network namespaces, and their teardown
            // (synchronize_rcu, netns cleanup) takes milliseconds that the
            // supervisor need not wait for.
            let _ = sys::write_all(status_w.as_raw_fd(), format!("S{code}\n").as_bytes());
            drop(alive_w);
            sys::exit_now(code)
        }
    }
}

/// Points 0, 1 and 2 at /dev/null so that only the command holds the real
/// stdio (EOF then means the command and its children are gone).
fn detach_stdio() {
    if let Ok(null) = File::options().read(true).write(true).open("/dev/null") {
        for fd in 0..3 {
            let _ = sys::dup2(null.as_raw_fd(), fd);
        }
    }
}

/// pid 1: builds the new root, forks the command, then reaps.
fn init_process(prepared: &Prepared, report_w: OwnedFd, alive_r: OwnedFd) -> ! {
    let rep = report_w.as_raw_fd();
    if let Err(e) = sys::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL as libc::c_ulong, 0) {
        report(rep, "pdeathsig", &e);
    }
    // If the holder died before PR_SET_PDEATHSIG took effect, its end of the
    // alive pipe is closed: stop now.
    if sys::poll_hup(alive_r.as_raw_fd()) {
        sys::exit_now(125);
    }
    if let Err(e) = sys::setsid() {
        report(rep, "setsid", &e);
    }
    if let Err(e) = sys::block_signals(&init::waited()) {
        report(rep, "block signals", &e);
    }
    if let Err((step, e)) = build_root(&prepared.steps) {
        report(rep, &step, &e);
    }
    if let Err(e) = sys::sethostname("mcpbox") {
        report(rep, "sethostname", &e);
    }
    if let Err(e) = sys::loopback_up() {
        report(rep, "loopback up", &e);
    }
    if let Some(egress) = &prepared.egress {
        start_bridge(prepared, egress, rep);
    }
    match sys::fork() {
        Err(e) => report(rep, "fork command", &e),
        Ok(Fork::Child) => command_process(prepared, rep),
        Ok(Fork::Parent(pid)) => {
            drop(report_w);
            drop(alive_r);
            detach_stdio();
            init::run(pid)
        }
    }
}

/// Executes the plan against a fresh tmpfs and pivots into it. Returns the
/// step that failed.
fn build_root(steps: &[Step]) -> Result<(), (String, std::io::Error)> {
    let at = |what: &str, p: &Path| format!("{what} {}", p.display());
    // Nothing we mount may propagate back to the host (mount_namespaces(7)).
    sys::mount(
        None,
        Path::new("/"),
        None,
        libc::MS_REC | libc::MS_PRIVATE,
        None,
    )
    .map_err(|e| ("make / private".to_string(), e))?;
    // A staging tmpfs holds the new root and the old one during the build;
    // binds then name their sources under /oldroot, so a source under the
    // host's /tmp stays reachable.
    let base = Path::new("/tmp");
    sys::mount(
        Some(Path::new("mcpbox")),
        base,
        Some("tmpfs"),
        libc::MS_NOSUID | libc::MS_NODEV,
        Some("mode=0755,size=65536"),
    )
    .map_err(|e| ("staging tmpfs on /tmp".to_string(), e))?;
    for d in ["/tmp/newroot", "/tmp/oldroot"] {
        std::fs::create_dir(d).map_err(|e| (at("mkdir", Path::new(d)), e))?;
    }
    sys::mount(
        Some(Path::new("mcpbox")),
        Path::new("/tmp/newroot"),
        Some("tmpfs"),
        libc::MS_NOSUID | libc::MS_NODEV,
        Some("mode=0755,size=1048576"),
    )
    .map_err(|e| ("root tmpfs".to_string(), e))?;
    sys::chdir(base).map_err(|e| ("chdir /tmp".to_string(), e))?;
    sys::pivot_root(Path::new("."), Path::new("oldroot"))
        .map_err(|e| ("pivot_root to staging".to_string(), e))?;
    sys::chdir(Path::new("/")).map_err(|e| ("chdir /".to_string(), e))?;

    let new = |p: &Path| Path::new("/newroot").join(p.strip_prefix("/").unwrap_or(p));
    let old = |p: &Path| Path::new("/oldroot").join(p.strip_prefix("/").unwrap_or(p));
    for step in steps {
        match step {
            Step::Dir { path, mode } => {
                let target = new(path);
                match std::fs::create_dir(&target) {
                    Ok(()) => {}
                    Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => {
                        // Never chmod through a symlink of the new root: it
                        // would resolve against the staging root.
                        let is_dir = std::fs::symlink_metadata(&target)
                            .map(|m| m.is_dir())
                            .unwrap_or(false);
                        if !is_dir {
                            return Err((at("mkdir (exists and is not a directory)", path), e));
                        }
                    }
                    Err(e) => return Err((at("mkdir", path), e)),
                }
                use std::os::unix::fs::PermissionsExt;
                std::fs::set_permissions(&target, std::fs::Permissions::from_mode(*mode))
                    .map_err(|e| (at("chmod", path), e))?;
            }
            Step::Tmpfs { path, size, mode } => {
                let data = format!("size={size},mode={mode:o}");
                sys::mount(
                    Some(Path::new("mcpbox")),
                    &new(path),
                    Some("tmpfs"),
                    libc::MS_NOSUID | libc::MS_NODEV,
                    Some(&data),
                )
                .map_err(|e| (at("tmpfs", path), e))?;
            }
            Step::Bind { host, path, access } => {
                let target = new(path);
                if !target.exists() {
                    File::create(&target).map_err(|e| (at("bind target", path), e))?;
                }
                sys::mount(
                    Some(&old(host)),
                    &target,
                    None,
                    libc::MS_BIND | libc::MS_REC,
                    None,
                )
                .map_err(|e| (format!("bind {} -> {}", host.display(), path.display()), e))?;
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
                    sys::mount_setattr_recursive(&target, attrs)
                        .map_err(|e| (at("mount attributes", path), e))?;
                }
            }
            Step::Alias { from, path } => {
                let target = new(path);
                sys::mount(Some(&new(from)), &target, None, libc::MS_BIND, None)
                    .map_err(|e| (format!("bind {} -> {}", from.display(), path.display()), e))?;
                sys::mount_setattr_recursive(
                    &target,
                    sys::MOUNT_ATTR_NOSUID | sys::MOUNT_ATTR_NODEV,
                )
                .map_err(|e| (at("mount attributes", path), e))?;
            }
            Step::File { path, contents } => {
                std::fs::write(new(path), contents).map_err(|e| (at("write", path), e))?;
            }
            Step::Symlink { path, target } => {
                std::os::unix::fs::symlink(target, new(path))
                    .map_err(|e| (at("symlink", path), e))?;
            }
            Step::Proc { path } => {
                sys::mount(
                    Some(Path::new("proc")),
                    &new(path),
                    Some("proc"),
                    libc::MS_NOSUID | libc::MS_NODEV | libc::MS_NOEXEC,
                    None,
                )
                .map_err(|e| (at("mount proc", path), e))?;
            }
            Step::Chown { path, uid, gid } => {
                sys::chown(&new(path), *uid, *gid).map_err(|e| (at("chown", path), e))?;
            }
        }
    }
    // Make the new root the only root: pivot onto it (the staging root,
    // with the host's tree below /oldroot, is stacked underneath), then
    // detach the staging root and everything under it in one umount. One
    // detach, not two: each one ends in an RCU grace period
    // (namespace_unlock), which costs more than the rest of the call.
    sys::chdir(Path::new("/newroot")).map_err(|e| ("chdir new root".to_string(), e))?;
    sys::pivot_root(Path::new("."), Path::new(".")).map_err(|e| ("pivot_root".to_string(), e))?;
    sys::umount2(Path::new("."), libc::MNT_DETACH)
        .map_err(|e| ("detach the staging root and the host's tree".to_string(), e))?;
    sys::chdir(Path::new("/")).map_err(|e| ("chdir /".to_string(), e))?;
    // The root itself (with /etc) becomes read-only; /workspace/tmp,
    // /workspace/output and /dev are separate mounts and keep their modes.
    sys::mount(
        None,
        Path::new("/"),
        None,
        libc::MS_REMOUNT | libc::MS_BIND | libc::MS_RDONLY | libc::MS_NOSUID | libc::MS_NODEV,
        None,
    )
    .map_err(|e| ("remount / read-only".to_string(), e))?;
    Ok(())
}

/// Starts the egress bridge as a child of the init: it listens on the
/// sandbox's own loopback and carries each connection to the proxy's unix
/// socket. It keeps no capability and runs under the same seccomp filter
/// as the command; the init kills it with everything else at the end.
fn start_bridge(prepared: &Prepared, egress: &crate::Egress, rep: RawFd) {
    let listener = match std::net::TcpListener::bind(("127.0.0.1", egress.port)) {
        Ok(l) => l,
        Err(e) => report(rep, "bind the egress bridge", &e),
    };
    match sys::fork() {
        Err(e) => report(rep, "fork egress bridge", &e),
        Ok(Fork::Parent(_)) => drop(listener),
        Ok(Fork::Child) => {
            let _ = sys::unblock_all_signals();
            sys::reset_signal_dispositions();
            detach_stdio();
            // This process never execs: close every inherited descriptor
            // (the report pipe above all, whose EOF the supervisor awaits)
            // but the listener.
            let keep = listener.as_raw_fd() as u32;
            if sys::close_range(3, keep - 1).is_err()
                || sys::close_range(keep + 1, u32::MAX).is_err()
            {
                sys::exit_now(125);
            }
            if drop_privileges(prepared.as_root, Some(SANDBOX_UID), true).is_err()
                || sys::seccomp_load(&prepared.filter).is_err()
            {
                sys::exit_now(125);
            }
            let socket = Path::new(crate::EGRESS_DIR).join("egress.sock");
            let code = match (egress.bridge)(listener, &socket) {
                Ok(()) => 0,
                Err(_) => 1,
            };
            sys::exit_now(code)
        }
    }
}

/// Gives up every privilege, in the order that makes each step possible:
/// the bounding set first (needs CAP_SETPCAP, which we may still have), then
/// ambient, then groups and ids, then whatever capabilities are left,
/// cleared explicitly: an unprivileged caller's uid never was 0, so
/// setresuid alone would not clear anything (capabilities(7), "Effect of
/// user ID changes on capabilities"). Last, no_new_privs: execve can never
/// grant privileges again (setuid bits, file capabilities), and an
/// unprivileged seccomp filter needs it.
///
/// `clear_groups` where setgroups is allowed (a namespace made by root);
/// `uid` to switch to (both uid and gid); `strict` makes a bounding-set
/// failure other than EINVAL an error (the degraded tier may have no
/// CAP_SETPCAP to drop with, and then has no capabilities to drop either).
pub(crate) fn drop_privileges(
    clear_groups: bool,
    uid: Option<u32>,
    strict: bool,
) -> Result<(), (&'static str, std::io::Error)> {
    for cap in 0..=sys::last_cap() {
        if let Err(e) = sys::prctl(libc::PR_CAPBSET_DROP, cap.into(), 0) {
            if strict && e.raw_os_error() != Some(libc::EINVAL) {
                return Err(("drop bounding set", e));
            }
        }
    }
    let clear_all = libc::PR_CAP_AMBIENT_CLEAR_ALL as libc::c_ulong;
    sys::prctl(libc::PR_CAP_AMBIENT, clear_all, 0)
        .map_err(|e| ("clear ambient capabilities", e))?;
    if clear_groups {
        sys::clear_groups().map_err(|e| ("setgroups", e))?;
    }
    if let Some(id) = uid {
        sys::set_ids(id, id).map_err(|e| ("setresuid", e))?;
    }
    sys::clear_capabilities().map_err(|e| ("capset", e))?;
    sys::prctl(libc::PR_SET_NO_NEW_PRIVS, 1, 0).map_err(|e| ("no_new_privs", e))?;
    Ok(())
}

/// The command: from here on nothing is given back. Never returns.
fn command_process(prepared: &Prepared, rep: RawFd) -> ! {
    let _ = sys::unblock_all_signals();
    sys::reset_signal_dispositions();
    if let Err(e) = sys::setpgid_self() {
        report(rep, "setpgid", &e);
    }
    if let Err(e) = sys::chdir(Path::new(WORKSPACE)) {
        report(rep, "chdir /workspace", &e);
    }
    for (resource, value) in &prepared.rlimits {
        if let Err(e) = sys::setrlimit(*resource, *value) {
            report(rep, "setrlimit", &e);
        }
    }
    // Every descriptor but stdio closes at execve; the report pipe stays
    // usable until then (CLOSE_RANGE_CLOEXEC, close_range(2)).
    if let Err(e) = sys::cloexec_fds_from(3) {
        report(rep, "close fds", &e);
    }
    if let Err((step, e)) = drop_privileges(prepared.as_root, Some(SANDBOX_UID), true) {
        report(rep, step, &e);
    }
    match landlock::restrict(
        landlock::Tier::Full,
        &prepared.readable,
        &prepared.writable,
        prepared.allow_exec.as_deref(),
    ) {
        Ok(landlock::Enforced::Fully) | Ok(landlock::Enforced::Partially) => {}
        Ok(landlock::Enforced::Not) => report(
            rep,
            "landlock",
            &std::io::Error::other("landlock is not supported by this kernel"),
        ),
        Err(e) => report(rep, "landlock", &std::io::Error::other(e)),
    }
    // seccomp last: the filter refuses calls (mount, unshare...) that the
    // steps above needed.
    if let Err(e) = sys::seccomp_load(&prepared.filter) {
        report(rep, "seccomp", &e);
    }
    exec_command(prepared, rep)
}

/// execve with execvp(3)'s PATH search over the prepared candidates; on
/// failure reports 127 (not found) or 126 (not executable). Never returns.
pub(crate) fn exec_command(prepared: &Prepared, rep: RawFd) -> ! {
    let mut last = std::io::Error::from_raw_os_error(libc::ENOENT);
    for candidate in &prepared.candidates {
        let err = sys::execve(candidate, &prepared.argv, &prepared.envp);
        // Keep looking on "not here"; anything else is the answer (execvp(3)).
        match err.raw_os_error() {
            Some(libc::ENOENT) | Some(libc::ENOTDIR) => {}
            _ => {
                last = err;
                if last.raw_os_error() != Some(libc::EACCES) {
                    break;
                }
            }
        }
    }
    let code = if last.raw_os_error() == Some(libc::ENOENT) {
        127
    } else {
        126
    };
    let name = String::from_utf8_lossy(prepared.argv[0].as_bytes()).into_owned();
    let detail = if code == 127 {
        "command not found in the sandbox".to_string()
    } else {
        last.to_string()
    };
    let _ = sys::write_all(rep, format!("X{code}\x1f{name}\x1f{detail}\n").as_bytes());
    sys::exit_now(code)
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
            holder: pid,
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
        }
    }

    pub(crate) fn set_deadline(&mut self, deadline: Option<Instant>) {
        self.deadline = deadline;
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
    pub fn kill(&self) {
        let _ = sys::kill(self.init, libc::SIGKILL);
        let _ = sys::kill(self.holder, libc::SIGKILL);
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
        let mut buf = [0u8; 16];
        let n =
            sys::read(pipe.as_raw_fd(), &mut buf).map_err(|e| Error::setup("status pipe", e))?;
        let code = std::str::from_utf8(&buf[..n])
            .ok()
            .and_then(|t| t.trim().strip_prefix('S'))
            .and_then(|c| c.parse::<i32>().ok());
        self.status_pipe = None;
        match code {
            Some(code) => {
                // The holder is still tearing the namespaces down; reap it if
                // it is already done, otherwise later.
                let _ = sys::waitpid(self.holder, true);
                Ok(self.record(Wait::Exited(self.holder, code)))
            }
            // EOF without a status: the holder itself died (killed).
            None => {
                let w = sys::waitpid(self.holder, false).map_err(|e| Error::setup("waitpid", e))?;
                Ok(self.record(w))
            }
        }
    }

    /// Without a status pipe (degraded tier, or after it closed): waitpid,
    /// polling every few milliseconds while a timeout is given.
    fn poll_child(&mut self, timeout_ms: Option<u64>) -> Result<Option<Status>> {
        let Some(ms) = timeout_ms else {
            let w = sys::waitpid(self.holder, false).map_err(|e| Error::setup("waitpid", e))?;
            return Ok(self.record(w));
        };
        let until = Instant::now() + std::time::Duration::from_millis(ms);
        loop {
            let w = sys::waitpid(self.holder, true).map_err(|e| Error::setup("waitpid", e))?;
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
            self.kill();
            let _ = sys::waitpid(self.holder, false);
        }
    }
}

/// `mcpbox exec`: runs the command with mcpbox's own stdio, forwards
/// signals, enforces the timeout, and returns how it ended.
pub fn exec(spec: &Spec, on_start: impl FnOnce(&[String])) -> Result<Status> {
    // Block the forwarded signals before forking, so none is lost between
    // fork and the wait loop; the init keeps them blocked (it waits for them
    // too) and the command unblocks them before execve. They arrive here
    // through a signalfd, polled together with the status pipe.
    let set = init::waited();
    sys::block_signals(&set).map_err(|e| Error::setup("block signals", e))?;
    let sigfd = sys::signalfd(&set).map_err(|e| Error::setup("signalfd", e))?;
    let sb = spawn(spec);
    // Whatever happens next, the caller's signals are its own again after.
    let mut sb = match sb {
        Ok(sb) => sb,
        Err(e) => {
            let _ = sys::unblock_all_signals();
            return Err(e);
        }
    };
    on_start(&sb.notes);
    loop {
        if let Some(s) = sb.try_wait()? {
            return Ok(s);
        }
        let timeout = sb
            .deadline
            .map(|d| d.saturating_duration_since(Instant::now()).as_millis() as u64);
        let mut fds = vec![sigfd.as_raw_fd()];
        if let Some(p) = &sb.status_pipe {
            fds.push(p.as_raw_fd());
        }
        let ready = sys::poll_readable(&fds, timeout).map_err(|e| Error::setup("poll", e))?;
        if ready[0] {
            match sys::read_signal(sigfd.as_raw_fd()).map_err(|e| Error::setup("signalfd", e))? {
                Some(libc::SIGCHLD) | None => {}
                Some(sig) => sb.signal(sig),
            }
        }
        if !ready.iter().any(|r| *r) && sb.deadline.is_some_and(|d| Instant::now() >= d) {
            sb.timed_out = true;
            sb.kill();
        }
    }
}
