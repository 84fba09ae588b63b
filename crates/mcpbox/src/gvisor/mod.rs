//! The gVisor tier (`[sandbox] isolation = "gvisor"`, docs/isolation.md):
//! a server's sandbox is an OCI bundle mcpbox writes ([`bundle`]) and
//! gVisor's `runsc` runs, so the server's system calls go to gVisor's own
//! kernel, not the host's.
//!
//! - **Which runsc**: `MCPBOX_RUNSC` when set, else the first `runsc` on
//!   mcpbox's PATH, else `/usr/bin/runsc` or `/usr/local/bin/runsc`
//!   ([`Runsc::find`]). It runs as root (`runsc` needs it for its own
//!   namespaces, chroot and cgroups here), with `--platform=ptrace` (works
//!   on any kernel that allows ptrace; `kvm` needs /dev/kvm) and
//!   `--network=none` (gVisor's loopback only) when the policy has no
//!   `[network]`. With egress, `--network=host` in a network namespace
//!   that holds only `lo` and the way to mcpbox's proxy
//!   ([`network_holder`]): gVisor's sockets are that namespace's, so the
//!   namespaces tier's capture, resolver and proxy decide every
//!   connection, with the same records.
//! - **How**: `runsc --root R --platform=ptrace --network=none run
//!   --bundle B ID` directly (no shell), with an empty environment, its
//!   stdio the server's, SIGKILL on its death when the thread that started
//!   it ends ([`mcpbox_sandbox::kill_with_parent`]); runsc's own sandbox
//!   and gofer processes die with it. After it ends, `runsc delete
//!   --force ID` and the bundle's removal; what a killed mcpbox left is
//!   swept at the next start ([`sweep`]): `runsc list` is the source, and
//!   a container's lock ([`lock_path`]) says whether its mcpbox lives.
//! - **State**: `<state>/gvisor/runsc` (runsc's root) and
//!   `<state>/gvisor/bundles/ID`; ids are `mcpbox-PID-N`, PID mcpbox's.

pub mod bundle;

use std::io;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use mcpbox_gateway::{ExitInfo, ProcessControl, ServerProcess};
use mcpbox_sandbox::Spec;

/// The runsc this tier uses.
#[derive(Debug, Clone)]
pub struct Runsc {
    pub path: PathBuf,
    /// The first line of `runsc --version`.
    pub version: String,
    /// mcpbox is not root: every runsc command gets `--rootless
    /// --ignore-cgroups` (runsc makes a user namespace of the caller's
    /// own; no cgroup).
    pub rootless: bool,
    /// `--platform`: `ptrace` (any kernel that allows ptrace); `doctor`
    /// also tries `kvm`.
    pub platform: &'static str,
}

impl Runsc {
    /// runsc with its global flags: the state's root, and rootless where
    /// mcpbox is not root. An empty environment, stdin from nothing.
    fn command(&self, root: &Path) -> Command {
        let mut c = Command::new(&self.path);
        c.arg("--root").arg(root);
        if self.rootless {
            c.args(["--rootless", "--ignore-cgroups"]);
        }
        c.env_clear().stdin(Stdio::null());
        c
    }
}

/// Finds runsc and reads its version; the error says what to install.
pub fn find() -> Result<Runsc, String> {
    let path = locate().ok_or_else(|| {
        "runsc (gVisor) is not installed: `apt-get install runsc` (Debian, Ubuntu), or gVisor's \
         release from https://gvisor.dev/docs/user_guide/install/, or set MCPBOX_RUNSC to its path"
            .to_string()
    })?;
    let out = Command::new(&path)
        .arg("--version")
        .env_clear()
        .stdin(Stdio::null())
        .stderr(Stdio::null())
        .output()
        .map_err(|e| format!("cannot run {}: {e}", path.display()))?;
    let version = String::from_utf8_lossy(&out.stdout)
        .lines()
        .next()
        .unwrap_or("")
        .trim()
        .to_string();
    if !out.status.success() || version.is_empty() {
        return Err(format!(
            "{} --version failed ({}): is it gVisor's runsc?",
            path.display(),
            out.status
        ));
    }
    Ok(Runsc {
        path,
        version,
        rootless: !crate::preflight::is_root(),
        platform: "ptrace",
    })
}

fn locate() -> Option<PathBuf> {
    let executable = |p: &Path| {
        use std::os::unix::fs::PermissionsExt;
        std::fs::metadata(p).is_ok_and(|m| m.is_file() && m.permissions().mode() & 0o111 != 0)
    };
    if let Some(p) = std::env::var_os("MCPBOX_RUNSC").filter(|p| !p.is_empty()) {
        return Some(PathBuf::from(p));
    }
    let path = std::env::var_os("PATH").unwrap_or_default();
    std::env::split_paths(&path)
        .map(|d| d.join("runsc"))
        .chain(["/usr/bin/runsc".into(), "/usr/local/bin/runsc".into()])
        .find(|p| p.is_absolute() && executable(p))
}

/// Whether this tier can run here, cheaply (before each start): runsc
/// found (as root, or rootless: `--rootless --ignore-cgroups`). [`probe`]
/// also starts a trivial container.
pub fn usable() -> Result<Runsc, String> {
    find()
}

/// A sandbox of `argv` and nothing else: the system directories, a 1 MiB
/// tmp, no workspace, mount, limit, network or stdio of anyone's.
fn bare(argv: &[&str]) -> Spec {
    Spec {
        argv: argv.iter().map(Into::into).collect(),
        env: vec![("PATH".into(), "/usr/bin:/bin".into())],
        input: None,
        output: None,
        tmp_size: 1 << 20,
        tmp_dir: None,
        mounts: Vec::new(),
        limits: mcpbox_sandbox::Limits::default(),
        allow_exec: None,
        allow_degraded: false,
        stdio: mcpbox_sandbox::Stdio::Piped,
        egress: None,
        cgroup_parent: None,
    }
}

/// [`usable`], and a trivial container (`true` in a bundle of the system
/// directories) started with `--platform=ptrace`: what `mcpbox doctor`
/// and `mcpbox check` report.
pub fn probe() -> Result<Runsc, String> {
    let runsc = usable()?;
    starts(&runsc, Duration::from_secs(30))?;
    Ok(runsc)
}

/// Whether a trivial container starts and ends well under `runsc`'s
/// platform within `limit` (killed at it: `kvm` hangs where nested
/// virtualisation is off).
pub fn starts(runsc: &Runsc, limit: Duration) -> Result<(), String> {
    let spec = bare(&["true"]);
    let how = format!(
        "runsc{} --platform={}",
        if runsc.rootless { " --rootless" } else { "" },
        runsc.platform
    );
    let mut started = start(runsc, &spec, StdioOf::Null, None, None)
        .map_err(|e| format!("{how} could not start a trivial sandbox: {e}"))?;
    match started.wait_deadline(Some(limit)) {
        Ok(info) if info.code == Some(0) => Ok(()),
        Ok(info) if info.code == Some(124) => Err(format!(
            "a trivial sandbox under {how} did not end within {} s",
            limit.as_secs()
        )),
        Ok(info) => Err(format!(
            "a trivial sandbox under {how} ended with {info}{}",
            started.log_tail()
        )),
        Err(e) => Err(format!("{how}: {e}")),
    }
}

/// Where runsc keeps its state, and the bundles.
fn dirs() -> (PathBuf, PathBuf) {
    let base = crate::state::state_dir().join("gvisor");
    (base.join("runsc"), base.join("bundles"))
}

/// A fresh container id: `mcpbox-PID-N`, and `-SANDBOX` after it for a
/// server of a `serve` sandbox, so that the lifecycle finds a sandbox's
/// containers by its id, a previous mcpbox's included.
fn new_id(sandbox: Option<&str>) -> String {
    static N: AtomicU64 = AtomicU64::new(0);
    let id = format!(
        "mcpbox-{}-{}",
        std::process::id(),
        N.fetch_add(1, Ordering::SeqCst)
    );
    match sandbox {
        Some(sb) => format!("{id}-{sb}"),
        None => id,
    }
}

/// Whether container `id` is one of sandbox `sandbox`'s ([`new_id`]:
/// `mcpbox-PID-N-SANDBOX`).
fn of_sandbox(id: &str, sandbox: &str) -> bool {
    let digits = |s: &str| !s.is_empty() && s.bytes().all(|b| b.is_ascii_digit());
    let parts: Vec<&str> = id.splitn(4, '-').collect();
    parts.len() == 4
        && parts[0] == "mcpbox"
        && digits(parts[1])
        && digits(parts[2])
        && parts[3] == sandbox
}

/// The server's stdio.
pub enum StdioOf {
    /// Pipes, handed to the relay.
    Piped,
    /// mcpbox's own stdin, and pipes for stdout and stderr that `exec`
    /// copies to its own: gVisor writes a donated regular file from its
    /// own offset 0, not the descriptor's (`mcpbox exec ... >> log`
    /// overwrote what the file held), so no file of the caller's is
    /// handed to it for writing.
    Inherit,
    /// Nothing (the probe).
    Null,
}

impl StdioOf {
    fn get(&self) -> Stdio {
        match self {
            StdioOf::Piped => Stdio::piped(),
            StdioOf::Inherit => Stdio::inherit(),
            StdioOf::Null => Stdio::null(),
        }
    }
}

/// One running gVisor sandbox: the `runsc run` process and what to
/// remove after it.
pub struct Started {
    pub child: Child,
    /// Its lock ([`lock_path`]), removed last.
    lock: Option<(PathBuf, std::fs::File)>,
    /// With egress: the sandbox that holds its network namespace, and
    /// that namespace, open (see [`network_holder`]).
    holder: Option<(mcpbox_sandbox::Sandbox, std::fs::File)>,
    /// The checkpoint image it was restored from, used up.
    image: Option<PathBuf>,
    runsc: Runsc,
    root: PathBuf,
    bundle: PathBuf,
    id: String,
    /// The exit, once reaped; the state is then deleted.
    ended: Option<ExitInfo>,
    /// The end of runsc's log when it failed, kept from the bundle's
    /// removal for the error.
    log: String,
}

/// Writes the bundle of `spec` and starts it; `sandbox`: the `serve`
/// sandbox it belongs to; `restore`: a checkpoint's image directory to
/// start it from (`runsc restore`: the server's memory as it was), else a
/// fresh start (`runsc run`). runsc reads the image after this returns:
/// it is removed with the container's state when the container ends.
pub fn start(
    runsc: &Runsc,
    spec: &Spec,
    stdio: StdioOf,
    sandbox: Option<&str>,
    restore: Option<&Path>,
) -> io::Result<Started> {
    if let Some(sb) = sandbox {
        // runsc's container ids: [\w+.-]; mcpbox's sandbox ids are
        // `sb-` and hex
        if sb.is_empty() || !sb.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'-') {
            return Err(io::Error::other(format!("not a sandbox id: {sb:?}")));
        }
    }
    let (root, bundles) = dirs();
    for d in [&root, &bundles] {
        crate::state::private_dir(d)?;
    }
    sweep(runsc, &root, &bundles);
    if let Some(tmp) = &spec.tmp_dir {
        home_in_kept_tmp(tmp)?;
    }
    let id = new_id(sandbox);
    // held from before its bundle exists until its state is deleted: what
    // another mcpbox's sweep looks at
    let lock = lock_container(&bundles, &id)?;
    let facts = mcpbox_sandbox::plan::HostFacts::read(spec);
    let steps = mcpbox_sandbox::plan::plan(spec, &facts);
    let cgroup = format!("/mcpbox-gvisor/{id}");
    let holder = match spec.egress {
        // check refuses this first (the holder's network namespace belongs
        // to a user namespace runsc's own cannot enter)
        Some(_) if runsc.rootless => {
            return Err(io::Error::other(ROOTLESS_EGRESS));
        }
        Some(_) => Some(network_holder(spec)?),
        None => None,
    };
    // runsc opens the namespace by this path: mcpbox's own descriptor of
    // it (this pid cannot be reused while mcpbox runs, where the
    // holder's could once it died).
    let netns = holder.as_ref().map(|(_, ns)| {
        use std::os::fd::AsRawFd;
        PathBuf::from(format!(
            "/proc/{}/fd/{}",
            std::process::id(),
            ns.as_raw_fd()
        ))
    });
    let host = bundle::Host {
        cgroup: &cgroup,
        netns: netns.as_deref(),
        rootless: runsc.rootless,
    };
    let built = bundle::build(spec, &steps, &host)
        .map_err(|e| io::Error::other(format!("the gVisor tier cannot express {e}")))?;
    let dir = bundles.join(&id);
    std::fs::create_dir(&dir)?;
    // the bundle is read by runsc's gofer (root): private to root
    let rootfs = dir.join("rootfs");
    std::fs::create_dir(&rootfs)?;
    {
        use std::os::unix::fs::PermissionsExt;
        std::fs::set_permissions(&rootfs, std::fs::Permissions::from_mode(0o755))?;
    }
    let result = (|| {
        bundle::write_rootfs(&rootfs, &built.rootfs)?;
        let config = serde_json::to_vec_pretty(&built.config).map_err(io::Error::other)?;
        std::fs::write(dir.join("config.json"), config)?;
        let mut cmd = runsc.command(&root);
        cmd.arg(format!("--platform={}", runsc.platform))
            .arg(if netns.is_some() {
                "--network=host"
            } else {
                "--network=none"
            })
            // runsc's own log goes to a file of the bundle, never to the
            // server's stdout (its default)
            .arg("--log")
            .arg(dir.join("runsc.log"));
        match restore {
            Some(image) => cmd.arg("restore").arg("--image-path").arg(image),
            None => cmd.arg("run"),
        };
        cmd.arg("--bundle")
            .arg(&dir)
            .arg(&id)
            .stdin(stdio.get())
            .stdout(match stdio {
                StdioOf::Inherit => Stdio::piped(),
                _ => stdio.get(),
            })
            .stderr(match stdio {
                StdioOf::Null | StdioOf::Inherit => Stdio::piped(),
                _ => stdio.get(),
            });
        mcpbox_sandbox::kill_with_parent(&mut cmd);
        spawn_from_keeper(cmd)
    })();
    match result {
        Ok(child) => Ok(Started {
            child,
            lock: Some(lock),
            holder,
            image: restore.map(Path::to_path_buf),
            runsc: runsc.clone(),
            root,
            bundle: dir,
            id,
            ended: None,
            log: String::new(),
        }),
        Err(e) => {
            let _ = std::fs::remove_dir_all(&dir);
            let _ = std::fs::remove_file(&lock.0);
            Err(e)
        }
    }
}

/// Makes HOME in a kept tmp (a host directory the server writes: `serve`'s
/// workspace, `run --builtin`'s working space), owned by the sandbox's
/// user, as the namespaces tier's init makes it inside its sandbox. mcpbox
/// runs as root here and the directory is the server's, so nothing is
/// followed: `mkdirat` beneath a descriptor of tmp, then the new entry
/// opened `O_DIRECTORY | O_NOFOLLOW` and changed through that descriptor
/// only. One that exists stays as it is (the server's, from before); a
/// symlink or a file there is refused, and ends only this start.
fn home_in_kept_tmp(tmp: &Path) -> io::Result<()> {
    use rustix::fs::{Mode, OFlags};
    let name = Path::new(mcpbox_sandbox::HOME)
        .strip_prefix(mcpbox_sandbox::TMP)
        .map_err(io::Error::other)?;
    let dir = rustix::fs::open(
        tmp,
        OFlags::PATH | OFlags::DIRECTORY | OFlags::NOFOLLOW | OFlags::CLOEXEC,
        Mode::empty(),
    )?;
    let made = match rustix::fs::mkdirat(&dir, name, Mode::from_raw_mode(0o700)) {
        Ok(()) => true,
        Err(rustix::io::Errno::EXIST) => false,
        Err(e) => return Err(e.into()),
    };
    let home = rustix::fs::openat(
        &dir,
        name,
        OFlags::RDONLY | OFlags::DIRECTORY | OFlags::NOFOLLOW | OFlags::CLOEXEC,
        Mode::empty(),
    )
    .map_err(|e| {
        io::Error::other(format!(
            "{} in the kept tmp {} is not a directory ({e}): the server made something else there",
            mcpbox_sandbox::HOME,
            tmp.display()
        ))
    })?;
    // Rootless, the caller's own directory is the server's (uid 0 of
    // runsc's user namespace) as it is.
    if made && crate::preflight::is_root() {
        let user = Some(rustix::fs::Uid::from_raw(bundle::USER));
        let group = Some(rustix::fs::Gid::from_raw(bundle::USER));
        rustix::fs::fchown(&home, user, group)?;
        rustix::fs::fchmod(&home, Mode::from_raw_mode(0o700))?;
    }
    Ok(())
}

/// Starts `cmd` from one thread that lives as long as mcpbox. runsc gets
/// SIGKILL when the *thread* that started it ends (PR_SET_PDEATHSIG,
/// prctl(2); `kill_with_parent`), and the thread that starts a server may
/// end before it: a restart after a secret's TTL runs on whichever thread
/// runs the session then. From this thread, the signal comes only with
/// mcpbox's own end.
fn spawn_from_keeper(cmd: Command) -> io::Result<Child> {
    type Job = (Command, std::sync::mpsc::Sender<io::Result<Child>>);
    static KEEPER: std::sync::OnceLock<Option<std::sync::mpsc::Sender<Job>>> =
        std::sync::OnceLock::new();
    let keeper = KEEPER.get_or_init(|| {
        let (tx, rx) = std::sync::mpsc::channel::<Job>();
        std::thread::Builder::new()
            .name("runsc-keeper".into())
            .spawn(move || {
                for (mut cmd, back) in rx {
                    let _ = back.send(cmd.spawn());
                }
            })
            .ok()
            .map(|_| tx)
    });
    let Some(keeper) = keeper else {
        return Err(io::Error::other(
            "cannot start the thread that starts runsc",
        ));
    };
    let (back, answer) = std::sync::mpsc::channel();
    keeper
        .send((cmd, back))
        .map_err(|_| io::Error::other("the thread that starts runsc is gone"))?;
    answer
        .recv()
        .map_err(|_| io::Error::other("the thread that starts runsc is gone"))?
}

impl Started {
    fn runsc(&self) -> Command {
        let mut c = self.runsc.command(&self.root);
        c.stdout(Stdio::null()).stderr(Stdio::null());
        c
    }

    /// Sends `signal` to the server (gVisor's pid 1 of the sandbox).
    pub fn signal(&self, signal: &str) {
        let _ = self.runsc().arg("kill").arg(&self.id).arg(signal).status();
    }

    /// The end of runsc's log, for an error message (kept at the end).
    fn log_tail(&self) -> String {
        if self.ended.is_some() {
            return self.log.clone();
        }
        let text = std::fs::read_to_string(self.bundle.join("runsc.log")).unwrap_or_default();
        let lines: Vec<&str> = text.lines().rev().take(3).collect();
        if lines.is_empty() {
            String::new()
        } else {
            let mut l = lines;
            l.reverse();
            format!(" (runsc: {})", l.join(" | "))
        }
    }

    fn reaped(&mut self, status: std::process::ExitStatus) -> ExitInfo {
        use std::os::unix::process::ExitStatusExt;
        let info = ExitInfo {
            code: status.code(),
            signal: status.signal(),
        };
        if !status.success() {
            self.log = self.log_tail();
        }
        self.cleanup();
        self.ended = Some(info);
        info
    }

    /// The state and bundle of an ended sandbox removed, and its network
    /// holder ended.
    fn cleanup(&mut self) {
        if let Some((mut sb, _)) = self.holder.take() {
            sb.kill();
            let _ = sb.wait();
        }
        if let Some(image) = self.image.take() {
            let _ = std::fs::remove_dir_all(image);
        }
        let _ = self
            .runsc()
            .arg("delete")
            .arg("--force")
            .arg(&self.id)
            .status();
        let _ = std::fs::remove_dir_all(&self.bundle);
        if let Some((path, _held)) = self.lock.take() {
            let _ = std::fs::remove_file(path);
        }
    }

    /// Waits for the end, killing the sandbox at `deadline` (`process.timeout`).
    pub fn wait_deadline(&mut self, limit: Option<Duration>) -> io::Result<ExitInfo> {
        if let Some(info) = self.ended {
            return Ok(info);
        }
        let Some(limit) = limit else {
            let status = self.child.wait()?;
            return Ok(self.reaped(status));
        };
        let until = Instant::now() + limit;
        loop {
            if let Some(status) = self.child.try_wait()? {
                return Ok(self.reaped(status));
            }
            if Instant::now() >= until {
                let _ = self.child.kill();
                let status = self.child.wait()?;
                let _ = self.reaped(status);
                return Ok(ExitInfo {
                    code: Some(124),
                    signal: None,
                });
            }
            std::thread::sleep(Duration::from_millis(20));
        }
    }
}

impl Drop for Started {
    fn drop(&mut self) {
        if self.ended.is_none() {
            let _ = self.child.kill();
            let _ = self.child.wait();
            self.cleanup();
        }
    }
}

impl ProcessControl for Started {
    fn terminate(&mut self) -> io::Result<()> {
        self.signal("TERM");
        Ok(())
    }
    fn kill(&mut self) -> io::Result<()> {
        // runsc's sandbox and gofer die with it (their death signal)
        match self.child.kill() {
            Err(e) if e.kind() != io::ErrorKind::InvalidInput => Err(e),
            _ => Ok(()),
        }
    }
    fn try_wait(&mut self) -> io::Result<Option<ExitInfo>> {
        if let Some(info) = self.ended {
            return Ok(Some(info));
        }
        match self.child.try_wait()? {
            Some(status) => Ok(Some(self.reaped(status))),
            None => Ok(None),
        }
    }
    fn wait(&mut self) -> io::Result<ExitInfo> {
        self.wait_deadline(None)
    }
}

/// Starts `spec`'s server under gVisor for a relay: its pipes and control.
/// No file watch: fanotify on the host sees gVisor's gofer, not the
/// server (docs/isolation.md); the relay lists written files by their
/// times.
/// Also its container id.
pub fn spawn(
    spec: &Spec,
    sandbox: Option<&str>,
    restore: Option<&Path>,
) -> io::Result<(ServerProcess, libc::pid_t, String)> {
    let runsc = usable().map_err(io::Error::other)?;
    let mut started = start(&runsc, spec, StdioOf::Piped, sandbox, restore)?;
    let id = started.id.clone();
    let pid = libc::pid_t::try_from(started.child.id()).unwrap_or(0);
    let (Some(stdin), Some(stdout), Some(stderr)) = (
        started.child.stdin.take(),
        started.child.stdout.take(),
        started.child.stderr.take(),
    ) else {
        return Err(io::Error::other("runsc started without pipes"));
    };
    let server = ServerProcess {
        stdin: Box::new(stdin),
        stdout: Box::new(stdout),
        stderr: Box::new(stderr),
        control: Box::new(started),
        files: None,
        tier: Some("gvisor"),
    };
    Ok((server, pid, id))
}

/// The network namespace of a gVisor sandbox with egress: a namespaces
/// tier sandbox of its own whose command only waits, holding `lo`, the
/// transparent capture, the bridge and its resolver, as every sandbox
/// with egress has (ARCHITECTURE.md, "Transparent egress"); runsc then
/// runs with `--network=host` in it. Debian's runsc cannot start its own
/// netstack here, and this way gVisor's connections meet exactly the
/// namespaces tier's decisions and records. Started through the sandbox
/// helper (`run` is multi-threaded); it dies with mcpbox like any
/// sandbox, and [`Started::cleanup`] ends it with the gVisor sandbox.
/// Returns it with its network namespace open.
fn network_holder(spec: &Spec) -> io::Result<(mcpbox_sandbox::Sandbox, std::fs::File)> {
    let holder = Spec {
        egress: spec.egress.clone(),
        ..bare(&["sleep", "infinity"])
    };
    let mut sb = mcpbox_sandbox::helper::spawn(&holder).map_err(io::Error::other)?;
    drop((sb.stdin.take(), sb.stdout.take(), sb.stderr.take()));
    let ns = std::fs::File::open(format!("/proc/{}/ns/net", sb.init_pid()));
    // Still running after the open: the namespace is the holder's, not
    // that of a process that took its pid.
    match (ns, sb.try_wait()) {
        (Ok(ns), Ok(None)) => Ok((sb, ns)),
        (Err(e), _) => {
            sb.kill();
            Err(io::Error::other(format!(
                "the gVisor sandbox's network holder: {e}"
            )))
        }
        (Ok(_), _) => Err(io::Error::other(
            "the gVisor sandbox's network holder ended at its start",
        )),
    }
}

/// Why a gVisor policy with `[network]` rules needs root.
pub const ROOTLESS_EGRESS: &str = "egress under the gVisor tier needs mcpbox to run as root: \
     runsc runs in the network namespace that holds the way to mcpbox's proxy, and rootless, \
     that namespace belongs to a user namespace runsc's own cannot enter";

/// The lifecycle's operations on the gVisor containers of one `serve`
/// sandbox (`lifecycle::backend::Local`), each through runsc by container
/// id; `runsc list` is the source of which exist, so a previous mcpbox's
/// are found too.
pub struct Containers {
    runsc: Runsc,
    root: PathBuf,
}

/// One container as `runsc list -format=json` shows it.
#[derive(Debug, Clone, PartialEq, Eq, serde::Deserialize)]
pub struct Listed {
    pub id: String,
    #[serde(default)]
    pub status: String,
}

impl Containers {
    /// Where the tier can run here; `None` otherwise (nothing of it can
    /// exist then).
    /// What a killed mcpbox left is deleted now ([`sweep`]).
    pub fn here() -> Option<Containers> {
        let runsc = usable().ok()?;
        let (root, bundles) = dirs();
        sweep(&runsc, &root, &bundles);
        Some(Containers { runsc, root })
    }

    /// Runs `runsc ARGS`; the error is its stderr's last line.
    fn run(&self, args: &[&str]) -> Result<Vec<u8>, String> {
        let out = self
            .runsc
            .command(&self.root)
            .args(args)
            .output()
            .map_err(|e| format!("runsc {}: {e}", args.join(" ")))?;
        if out.status.success() {
            return Ok(out.stdout);
        }
        let err = String::from_utf8_lossy(&out.stderr);
        Err(format!(
            "runsc {}: {}",
            args.join(" "),
            err.lines().last().unwrap_or("failed").trim()
        ))
    }

    /// Whether runsc runs rootless here.
    pub fn rootless(&self) -> bool {
        self.runsc.rootless
    }

    /// Every container in runsc's state.
    fn all(&self) -> Vec<Listed> {
        let Ok(out) = self.run(&["list", "-format=json"]) else {
            return Vec::new();
        };
        // `null` when there is none
        let all: Option<Vec<Listed>> = serde_json::from_slice(&out).unwrap_or_default();
        all.unwrap_or_default()
    }

    /// The containers of `sandbox`.
    pub fn of(&self, sandbox: &str) -> Vec<Listed> {
        self.all()
            .into_iter()
            .filter(|c| of_sandbox(&c.id, sandbox))
            .collect()
    }

    /// Pauses every running container of `sandbox` (gVisor's kernel stops
    /// its tasks: `runsc pause`).
    pub fn pause(&self, sandbox: &str) -> Result<(), String> {
        for c in self.of(sandbox) {
            if c.status == "running" {
                self.run(&["pause", &c.id])?;
            }
        }
        Ok(())
    }

    /// Resumes every paused one.
    pub fn resume(&self, sandbox: &str) -> Result<(), String> {
        for c in self.of(sandbox) {
            if c.status == "paused" {
                self.run(&["resume", &c.id])?;
            }
        }
        Ok(())
    }

    /// Writes the memory of running container `id` into `image`, a new
    /// directory (`runsc checkpoint`), which ends the container: this
    /// runsc's `--leave-running` fails ("stopping container: context
    /// deadline exceeded", measured), and it crashes, taking the container
    /// with it, when asked to checkpoint a paused one, so a paused
    /// container is resumed first. The caller keeps other operations on
    /// the sandbox out meanwhile (`lifecycle::backend::Local`).
    pub fn checkpoint(&self, id: &str, image: &Path) -> Result<(), String> {
        let Some(c) = self.all().into_iter().find(|c| c.id == id) else {
            return Err(format!("gVisor container {id} is gone"));
        };
        match c.status.as_str() {
            "running" => {}
            "paused" => {
                self.run(&["resume", id])?;
            }
            other => return Err(format!("gVisor container {id} is {other}")),
        }
        let path = image.to_string_lossy();
        self.run(&["checkpoint", "--image-path", &path, id])
            .map(drop)
    }

    /// Kills every process of every container of `sandbox`; their `runsc
    /// run` then ends, and with it the network holder.
    pub fn kill(&self, sandbox: &str) {
        for c in self.of(sandbox) {
            if c.status == "paused" {
                let _ = self.run(&["resume", &c.id]);
            }
            if let Err(e) = self.run(&["kill", "--all", &c.id, "KILL"]) {
                tracing::debug!(container = c.id, "{e}");
            }
        }
    }

    /// Deletes every container of `sandbox` (`runsc delete --force`) and
    /// its bundle.
    pub fn delete(&self, sandbox: &str) -> Result<(), String> {
        let bundles = dirs().1;
        let mut failed = Vec::new();
        for c in self.of(sandbox) {
            if let Err(e) = self.run(&["delete", "--force", &c.id]) {
                failed.push(e);
            }
            let _ = std::fs::remove_dir_all(bundles.join(&c.id));
        }
        if failed.is_empty() {
            Ok(())
        } else {
            Err(failed.join("; "))
        }
    }

    /// Processes (host tasks), CPU and memory of `sandbox`'s running
    /// containers, from runsc's own cgroup of each (`runsc events
    /// --stats`), and whether any is paused.
    pub fn stats(&self, sandbox: &str) -> (usize, u64, u64, bool) {
        let (mut procs, mut cpu_ns, mut memory, mut paused) = (0usize, 0u64, 0u64, false);
        for c in self.of(sandbox) {
            paused |= c.status == "paused";
            if c.status == "stopped" {
                continue;
            }
            let Ok(out) = self.run(&["events", "--stats", &c.id]) else {
                continue;
            };
            let v: serde_json::Value = serde_json::from_slice(&out).unwrap_or_default();
            let d = &v["data"];
            procs += d["pids"]["current"].as_u64().unwrap_or(0) as usize;
            cpu_ns += d["cpu"]["usage"]["total"].as_u64().unwrap_or(0);
            memory += d["memory"]["usage"]["usage"].as_u64().unwrap_or(0);
        }
        (procs, cpu_ns / 1000, memory, paused)
    }
}

/// Removes what an mcpbox that is gone left in runsc's root (killed with
/// `kill -9`: its runsc processes died with it, their state did not):
/// `runsc list`'s ids of a pid that no longer runs, and their bundles.
pub fn sweep(runsc: &Runsc, root: &Path, bundles: &Path) {
    for id in list(runsc, root) {
        if owner_gone(bundles, &id) {
            let _ = runsc
                .command(root)
                .args(["delete", "--force", &id])
                .stdout(Stdio::null())
                .stderr(Stdio::null())
                .status();
            let _ = std::fs::remove_file(lock_path(bundles, &id));
        }
    }
    if let Ok(entries) = std::fs::read_dir(bundles) {
        for e in entries.flatten() {
            let name = e.file_name().to_string_lossy().into_owned();
            let id = name.strip_suffix(".lock").unwrap_or(&name);
            if owner_gone(bundles, id) {
                let _ = std::fs::remove_dir_all(bundles.join(id));
                let _ = std::fs::remove_file(lock_path(bundles, id));
            }
        }
    }
}

/// Container `id`'s lock: `BUNDLES/ID.lock`, held (flock(2), exclusive)
/// by the mcpbox that runs it from before its bundle exists until its
/// state is deleted.
fn lock_path(bundles: &Path, id: &str) -> PathBuf {
    bundles.join(format!("{id}.lock"))
}

/// Takes container `id`'s lock for the container's life ([`lock_path`]).
fn lock_container(bundles: &Path, id: &str) -> io::Result<(PathBuf, std::fs::File)> {
    let path = lock_path(bundles, id);
    let file = crate::state::hold_lock(&path)?;
    Ok((path, file))
}

/// Whether container `id` (one of mcpbox's, `mcpbox-…`) belongs to no
/// live mcpbox: nobody holds its lock, or it has none. Never read from
/// the pid in its name: mcpbox may run in a pid namespace of its own (a
/// container, a test's `unshare --pid`), where another namespace's pids
/// mean nothing (the egress proxy's directories had that bug: a live
/// gateway's socket was removed from under its sandbox).
fn owner_gone(bundles: &Path, id: &str) -> bool {
    id.starts_with("mcpbox-")
        && !id.contains('/')
        && crate::state::lock_is_free(&lock_path(bundles, id))
}

/// The container ids in runsc's root (`runsc list -q`).
pub fn list(runsc: &Runsc, root: &Path) -> Vec<String> {
    let Ok(out) = runsc
        .command(root)
        .args(["list", "-quiet"])
        .stderr(Stdio::null())
        .output()
    else {
        return Vec::new();
    };
    String::from_utf8_lossy(&out.stdout)
        .lines()
        .map(str::trim)
        .filter(|l| !l.is_empty())
        .map(str::to_string)
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_sandbox_finds_its_own_containers_and_no_other() {
        let mine = new_id(Some("sb-a1b2c3"));
        assert!(of_sandbox(&mine, "sb-a1b2c3"), "{mine}");
        assert!(!of_sandbox(&mine, "a1b2c3"));
        assert!(!of_sandbox(&mine, "sb-a1b2c"));
        assert!(!of_sandbox(&new_id(None), "sb-a1b2c3"));
        assert!(!of_sandbox("mcpbox-1-2-x-sb-a1b2c3", "sb-a1b2c3"));
        assert!(!of_sandbox("mcpbox-1-x-sb-a1b2c3", "sb-a1b2c3"));
        assert!(!of_sandbox("other-1-2-sb-a1b2c3", "sb-a1b2c3"));
        // a sandbox id that is not one is refused before runsc sees it
        let spec_err = start(
            &Runsc {
                path: "/nonexistent".into(),
                version: String::new(),
                rootless: false,
                platform: "ptrace",
            },
            &bundle::tests::spec(),
            StdioOf::Null,
            Some("a/b"),
            None,
        )
        .err()
        .unwrap();
        assert!(
            spec_err.to_string().contains("not a sandbox id"),
            "{spec_err}"
        );
    }

    /// The thread that starts a gVisor sandbox may end first (a restart
    /// on a session's thread): the sandbox lives on, and still dies with
    /// mcpbox (its death signal is the keeper thread's).
    #[test]
    fn a_sandbox_outlives_the_thread_that_started_it() {
        let Ok(runsc) = usable() else {
            eprintln!("skipped: the gVisor tier cannot run here (needs runsc and root)");
            return;
        };
        let mut spec = bundle::tests::spec();
        spec.argv = vec!["/bin/sleep".into(), "30".into()];
        spec.input = None;
        spec.output = None;
        spec.mounts = Vec::new();
        let state = tempfile::tempdir().unwrap();
        std::env::set_var("MCPBOX_STATE_DIR", state.path());
        let mut started =
            std::thread::spawn(move || start(&runsc, &spec, StdioOf::Null, None, None))
                .join()
                .unwrap()
                .unwrap();
        std::thread::sleep(Duration::from_millis(500));
        assert!(
            started.child.try_wait().unwrap().is_none(),
            "{}",
            started.log_tail()
        );
        ProcessControl::kill(&mut started).unwrap();
        assert!(started.wait().unwrap().signal.is_some());
    }

    /// HOME in a kept tmp: made once, the sandbox user's; a symlink the
    /// server planted there is refused and nothing is followed.
    #[test]
    fn home_in_a_kept_tmp_is_made_beneath_it_and_a_planted_link_is_refused() {
        use std::os::unix::fs::MetadataExt;
        let tmp = tempfile::tempdir().unwrap();
        home_in_kept_tmp(tmp.path()).unwrap();
        let home = tmp.path().join("home");
        let md = std::fs::symlink_metadata(&home).unwrap();
        assert!(md.is_dir());
        assert_eq!(md.mode() & 0o777, 0o700);
        if crate::preflight::is_root() {
            assert_eq!(md.uid(), bundle::USER);
        }
        // again: kept as it is
        std::fs::write(home.join("f"), "x").unwrap();
        home_in_kept_tmp(tmp.path()).unwrap();
        assert!(home.join("f").exists());
        // a link planted where HOME goes: refused, its target untouched
        let target = tempfile::tempdir().unwrap();
        let before = std::fs::metadata(target.path()).unwrap();
        let tmp2 = tempfile::tempdir().unwrap();
        std::os::unix::fs::symlink(target.path(), tmp2.path().join("home")).unwrap();
        let err = home_in_kept_tmp(tmp2.path()).unwrap_err();
        assert!(err.to_string().contains("not a directory"), "{err}");
        let after = std::fs::metadata(target.path()).unwrap();
        assert_eq!((before.uid(), before.mode()), (after.uid(), after.mode()));
    }

    /// A container is swept only when nobody holds its lock: a live one
    /// stays whatever pid its name says, a foreign name is never touched.
    #[test]
    fn a_container_of_a_live_or_foreign_owner_is_not_swept() {
        let bundles = tempfile::tempdir().unwrap();
        let b = bundles.path();
        // a pid that runs nowhere, but its owner holds the lock: live
        let live = format!("mcpbox-{}-0", u32::MAX - 1);
        let held = lock_container(b, &live).unwrap();
        assert!(!owner_gone(b, &live));
        assert!(!owner_gone(b, "someone-elses"));
        assert!(!owner_gone(b, "mcpbox-../x"));
        // no lock: nobody's
        assert!(owner_gone(b, "mcpbox-1-0"));
        // a second lock of the same container is refused
        assert!(lock_container(b, &live).is_err());
        drop(held);
        assert!(owner_gone(b, &live));
    }
}
