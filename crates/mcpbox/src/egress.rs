//! Network egress for one sandbox: mcpbox's filtering proxy on a unix
//! socket outside, decided by the policy's `[network]` rules, and the
//! settings that point programs inside at the bridge.

use std::os::unix::fs::PermissionsExt;
use std::path::PathBuf;
use std::sync::{Arc, OnceLock};

use anyhow::Context;
use mcpbox_audit::Sink;
use mcpbox_egress::{
    Approver, DenyAllApprover, EgressPolicy, Ids, Proxy, Shutdown, SystemConnector, SystemResolver,
};
use mcpbox_gateway::HostAsker;
use mcpbox_policy::{Decision, NetworkAnswer, NetworkRules};

/// The bridge's port on the sandbox's own loopback.
pub const BRIDGE_PORT: u16 = 3128;

/// The policy's network rules as the proxy sees them.
struct Rules(NetworkRules);

impl EgressPolicy for Rules {
    fn decide(&self, host: &str, port: u16) -> Decision {
        self.0.decide(host, port)
    }

    fn mapped_address(&self, host: &str) -> Option<std::net::IpAddr> {
        self.0.mapped_address(host)
    }

    fn decide_name(&self, host: &str) -> Decision {
        self.0.decide_name(host)
    }

    fn local_addresses(&self, host: &str, port: u16) -> Option<Vec<std::net::IpAddr>> {
        self.0.local_addresses(host, port)
    }
}

/// Asks the host about unlisted hosts (`network.unlisted = "approve"`)
/// through the relay's elicitation path, the one tool approvals use. The
/// relay is made after the proxy (the sandbox spec the proxy fills in goes
/// into the relay's launcher), so the asker is set once it exists; until
/// then, and whenever the host cannot or does not say yes, the answer is
/// deny.
#[derive(Clone, Default)]
pub struct HostApprover {
    asker: Arc<OnceLock<HostAsker>>,
    /// `mcpbox learn`: every unlisted host is allowed (and recorded)
    /// without asking; the proxy still refuses loopback, private,
    /// link-local and metadata addresses after resolving.
    record_and_allow: bool,
}

impl HostApprover {
    /// An approver that denies until [`HostApprover::connect`] is called.
    pub fn new() -> HostApprover {
        HostApprover::default()
    }

    /// `mcpbox learn`'s approver: says yes for the session to every host
    /// the rules leave unlisted, so that what the server contacts can be
    /// observed; the proxy's address-class refusals still apply.
    pub fn record_and_allow() -> HostApprover {
        HostApprover {
            record_and_allow: true,
            ..HostApprover::default()
        }
    }

    /// Routes questions to `asker` from now on (the first call wins).
    pub fn connect(&self, asker: HostAsker) {
        let _ = self.asker.set(asker);
    }
}

impl Approver for HostApprover {
    fn ask(&self, host: &str, port: u16) -> NetworkAnswer {
        if self.record_and_allow {
            tracing::info!(host, port, "learning: unlisted host allowed and recorded");
            return NetworkAnswer::Session;
        }
        let Some(asker) = self.asker.get() else {
            tracing::info!(host, port, "network approval: no host channel yet; denied");
            return NetworkAnswer::Unavailable;
        };
        let answer = asker.ask_network(host, port);
        if !answer.allows() {
            tracing::info!(host, port, reason = %answer.reason(), "network approval denied");
        }
        answer
    }
}

/// The bridge as the sandbox starts it: the sockets its init bound, handed
/// to `mcpbox_egress::bridge` (the two crates do not know each other).
pub(crate) fn bridge(
    s: mcpbox_sandbox::BridgeSockets,
    target: &std::path::Path,
) -> std::io::Result<()> {
    mcpbox_egress::bridge(
        mcpbox_egress::BridgeSockets {
            proxy: s.proxy,
            capture: s.capture,
            dns_udp: s.dns_udp,
            dns_tcp: s.dns_tcp,
            nflog: s.nflog,
        },
        target,
    )
}

/// A running proxy; stopping it (on drop) also removes its socket directory.
pub struct Running {
    shutdown: Shutdown,
    dir: PathBuf,
    /// `DIR.lock` beside the directory, flock(2)ed for the proxy's whole
    /// life ([`reclaim_stale_proxy_dirs`]).
    lock: Option<(PathBuf, std::fs::File)>,
}

/// How long stopping the proxy waits for the connections it accepted to be
/// recorded. The sandbox has ended by then, so its connections are closing.
const DRAIN: std::time::Duration = std::time::Duration::from_secs(2);

impl Drop for Running {
    fn drop(&mut self) {
        self.shutdown.trigger();
        if !self.shutdown.drain(DRAIN) {
            tracing::warn!(
                "egress proxy: connections still open at exit; their audit records may be missing"
            );
        }
        let _ = std::fs::remove_dir_all(&self.dir);
        if let Some((path, _held)) = self.lock.take() {
            let _ = std::fs::remove_file(path);
        }
    }
}

/// Where per-sandbox socket directories live: `$XDG_RUNTIME_DIR/mcpbox`,
/// else `/tmp/mcpbox-UID`.
pub(crate) fn runtime_base() -> PathBuf {
    match std::env::var_os("XDG_RUNTIME_DIR") {
        Some(d) if !d.is_empty() => PathBuf::from(d).join("mcpbox"),
        _ => std::env::temp_dir().join(format!("mcpbox-{}", crate::preflight::uid())),
    }
}

/// The proxy's socket, bound and ready, with no thread started yet: `exec`
/// forks its sandbox in between (a sandbox is forked only while the process
/// is single-threaded), and connections wait in the listen backlog.
pub struct Bound {
    running: Running,
    listener: std::os::unix::net::UnixListener,
    proxy: Proxy,
    /// The rotation of secrets kept outside, started with the proxy's
    /// thread (never before `exec`'s fork).
    rotation: Option<Rotation>,
}

impl Bound {
    /// Starts the proxy's thread; dropping the result stops it.
    pub fn serve(self) -> anyhow::Result<Running> {
        let Bound {
            running,
            listener,
            proxy,
            rotation,
        } = self;
        if let Some(r) = rotation {
            r.start();
        }
        let shutdown = running.shutdown.clone();
        std::thread::Builder::new()
            .name("egress-proxy".into())
            .spawn(move || {
                if let Err(e) = proxy.serve(listener, &shutdown) {
                    tracing::error!(error = %e, "egress proxy stopped");
                }
            })
            .context("starting the egress proxy thread")?;
        Ok(running)
    }
}

/// Binds the proxy for `rules` and points `spec` at it: the sandbox gets
/// the bridge and the proxy environment. Unlisted hosts are refused even
/// under `network.unlisted = "approve"`: `exec` has no channel to a human
/// (network.approval_denied).
pub fn bind(
    loaded: &crate::preflight::Loaded,
    sink: Arc<dyn Sink>,
    ids: Ids,
    spec: &mut mcpbox_sandbox::Spec,
    secrets: &mcpbox_gateway::Secrets,
) -> anyhow::Result<Bound> {
    bind_with_approver(
        loaded,
        sink,
        ids,
        spec,
        Arc::new(DenyAllApprover),
        None,
        secrets,
    )
}

/// The egress proxy for a sandbox of `loaded`'s policy, bound and serving,
/// when its `[network]` opens anything (`None` otherwise). Unlisted hosts
/// are asked about through `approver` when the policy says
/// `network.unlisted = "approve"` (its sandboxes start through the helper,
/// so the proxy's threads may exist before them); each connection's record
/// names the relay's calls in flight (`calls`).
pub fn for_policy(
    loaded: &crate::preflight::Loaded,
    sink: Arc<dyn Sink>,
    ids: Ids,
    spec: &mut mcpbox_sandbox::Spec,
    approver: &HostApprover,
    calls: Arc<mcpbox_gateway::CallsInFlight>,
    secrets: &mcpbox_gateway::Secrets,
) -> anyhow::Result<Option<Running>> {
    if loaded.policy.network.is_closed() {
        return Ok(None);
    }
    let approver: Arc<dyn Approver> = Arc::new(approver.clone());
    let calls: Arc<dyn mcpbox_egress::CallContext> = Arc::new(RelayCalls(calls));
    bind_with_approver(loaded, sink, ids, spec, approver, Some(calls), secrets)?
        .serve()
        .map(Some)
}

/// The relay's calls in flight, as the proxy asks for them.
struct RelayCalls(Arc<mcpbox_gateway::CallsInFlight>);

impl mcpbox_egress::CallContext for RelayCalls {
    fn current(&self) -> (String, Vec<(String, String)>) {
        self.0.snapshot()
    }
}

/// Numbers the proxies of this process, for their directories' names.
static PROXY_SEQ: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);

/// Removes the proxy directories of proxies that are gone (a kill -9 skips
/// `Running`'s drop). Each proxy holds an exclusive flock(2) on
/// `NAME.lock` beside its directory `NAME` for its whole life, taken before
/// the directory exists; a lock this process can take belongs to no live
/// proxy, so its directory and the lock file go. Liveness is never read
/// from a pid: mcpbox may run in a pid namespace of its own (a test's
/// `unshare --pid`, a container), where another namespace's pids mean
/// nothing, and the pid check once removed a live gateway's socket from
/// under its sandbox (its resolver then answered SERVFAIL: stop 38's CI).
/// Only names of the proxy's shape are touched.
fn reclaim_stale_proxy_dirs(base: &std::path::Path) {
    let Ok(entries) = std::fs::read_dir(base) else {
        return;
    };
    for e in entries.filter_map(Result::ok) {
        let name = e.file_name();
        let Some(stem) = name.to_str().and_then(|n| n.strip_suffix(".lock")) else {
            continue;
        };
        if !proxy_dir_name(stem) {
            continue;
        }
        if crate::state::lock_is_free(&e.path()) {
            let _ = std::fs::remove_dir_all(base.join(stem));
            let _ = std::fs::remove_file(e.path());
        }
    }
}

/// `ID.PID.N.RANDOM`: a sandbox id (a lifecycle id, `sb-` and hex, or
/// `run`'s hex), this process's pid and proxy number (for the reader), and
/// 12 random hex digits (no two proxies share a name, in whatever pid
/// namespaces they run).
fn proxy_dir_name(name: &str) -> bool {
    let hex = |s: &str| !s.is_empty() && s.bytes().all(|b| matches!(b, b'0'..=b'9' | b'a'..=b'f'));
    let digits = |s: &str| !s.is_empty() && s.bytes().all(|b| b.is_ascii_digit());
    let parts: Vec<&str> = name.split('.').collect();
    let [id, pid, n, random] = parts.as_slice() else {
        return false;
    };
    hex(id.strip_prefix("sb-").unwrap_or(id)) && digits(pid) && digits(n) && hex(random)
}

fn bind_with_approver(
    loaded: &crate::preflight::Loaded,
    sink: Arc<dyn Sink>,
    ids: Ids,
    spec: &mut mcpbox_sandbox::Spec,
    approver: Arc<dyn Approver>,
    calls: Option<Arc<dyn mcpbox_egress::CallContext>>,
    secrets: &mcpbox_gateway::Secrets,
) -> anyhow::Result<Bound> {
    let rules = &loaded.policy.network;
    let root = crate::preflight::is_root();
    let base = runtime_base();
    std::fs::create_dir_all(&base).with_context(|| format!("creating {}", base.display()))?;
    // In a shared /tmp another user could have made this directory first
    // and own what is put in it: refuse anything not ours and not a real
    // directory.
    let meta =
        std::fs::symlink_metadata(&base).with_context(|| format!("checking {}", base.display()))?;
    if !meta.is_dir() || std::os::unix::fs::MetadataExt::uid(&meta) != crate::preflight::uid() {
        anyhow::bail!(
            "{} is not a directory owned by this user; remove it or set XDG_RUNTIME_DIR",
            base.display()
        );
    }
    // The socket directory is bind-mounted into the sandbox; the sandbox
    // user (host uid 65534 when we are root) must be able to traverse it.
    let mode = if root { 0o711 } else { 0o700 };
    std::fs::set_permissions(&base, std::fs::Permissions::from_mode(mode))
        .with_context(|| format!("securing {}", base.display()))?;
    // One directory per proxy, not per sandbox: under `serve` every session
    // of an agent's sandbox has a proxy of its own (issue 32: a second
    // session failed with EEXIST). A random part keeps concurrent proxies
    // apart; what a killed proxy left behind is reclaimed first, by its
    // lock (reclaim_stale_proxy_dirs).
    reclaim_stale_proxy_dirs(&base);
    let name = format!(
        "{}.{}.{}.{}",
        ids.sandbox_id,
        std::process::id(),
        PROXY_SEQ.fetch_add(1, std::sync::atomic::Ordering::Relaxed),
        crate::state::new_id()
    );
    // the lock first, held before the directory exists
    let lock_path = base.join(format!("{name}.lock"));
    let lock = crate::state::hold_lock(&lock_path)
        .with_context(|| format!("creating and locking {}", lock_path.display()))?;
    let dir = base.join(&name);
    if let Err(e) = std::fs::create_dir(&dir) {
        let _ = std::fs::remove_file(&lock_path);
        return Err(e).with_context(|| format!("creating {}", dir.display()));
    }
    std::fs::set_permissions(&dir, std::fs::Permissions::from_mode(mode))
        .with_context(|| format!("securing {}", dir.display()))?;
    let running = Running {
        shutdown: Shutdown::new(),
        dir: dir.clone(),
        lock: Some((lock_path, lock)),
    };
    let socket = dir.join("egress.sock");
    let listener = std::os::unix::net::UnixListener::bind(&socket)
        .with_context(|| format!("binding the egress proxy at {}", socket.display()))?;
    if root {
        std::os::unix::fs::chown(
            &socket,
            Some(mcpbox_sandbox::ROOT_RUN_HOST_ID),
            Some(mcpbox_sandbox::ROOT_RUN_HOST_ID),
        )
        .context("handing the proxy socket to the sandbox user")?;
    }
    std::fs::set_permissions(&socket, std::fs::Permissions::from_mode(0o600))
        .context("securing the proxy socket")?;
    let sandbox_id = ids.sandbox_id.clone();
    let mut proxy = Proxy::new(
        Arc::new(Rules(rules.clone())),
        Arc::new(SystemResolver),
        Arc::new(SystemConnector::default()),
        approver,
        sink,
        ids,
    );
    if let Some(c) = calls {
        proxy = proxy.with_calls(c);
    }
    let kept_out = keep_outside(loaded, secrets, &sandbox_id, &dir)?;
    if let Some(out) = &kept_out {
        proxy = proxy.with_secrets(out.clone());
    }
    spec.egress = Some(mcpbox_sandbox::Egress {
        socket_dir: dir,
        port: BRIDGE_PORT,
        bridge,
    });
    // The proxy variables (a policy may not set them: `check` refuses),
    // then git's config entries: the policy's own first, the proxy's after
    // them, one count (they used to be appended as a second entry 0).
    let is_git = |k: &str| k.starts_with("GIT_CONFIG_");
    let env = mcpbox_egress::proxy_env(BRIDGE_PORT);
    let mut git: Vec<(String, String)> = spec
        .env
        .iter()
        .filter(|(k, _)| k.to_str().is_some_and(is_git))
        .map(|(k, v)| {
            (
                k.to_string_lossy().into_owned(),
                v.to_string_lossy().into_owned(),
            )
        })
        .collect();
    spec.env.retain(|(k, _)| !k.to_str().is_some_and(is_git));
    mcpbox_egress::merge_git_config(&mut git, BRIDGE_PORT);
    spec.env.extend(
        env.into_iter()
            .filter(|(k, _)| !is_git(k))
            .chain(git)
            .map(|(k, v)| (k.into(), v.into())),
    );
    if kept_out.is_some() {
        // the sandbox's CA, with the system's roots, for every runtime
        // that reads one file (a policy may not set these: `check` refuses)
        let bundle = format!("{}/{CA_BUNDLE}", mcpbox_sandbox::EGRESS_DIR);
        for var in mcpbox_policy::CA_VARIABLES {
            spec.env.retain(|(k, _)| k != var);
            spec.env.push((var.into(), bundle.clone().into()));
        }
    }
    let rotation = kept_out.and_then(|out| rotation(loaded, out));
    Ok(Bound {
        running,
        listener,
        proxy,
        rotation,
    })
}

/// The CA bundle's name in the proxy's directory (`/run/mcpbox` inside).
pub const CA_BUNDLE: &str = "ca-bundle.pem";

/// The proxy's side of the secrets with `hosts`: their placeholders and
/// values, a CA of this sandbox's own, the roots upstreams are verified
/// against; the bundle the sandbox trusts (system roots and that CA)
/// written into the proxy's directory, readable inside. `None` when no
/// secret stays outside.
fn keep_outside(
    loaded: &crate::preflight::Loaded,
    secrets: &mcpbox_gateway::Secrets,
    sandbox_id: &str,
    dir: &std::path::Path,
) -> anyhow::Result<Option<Arc<mcpbox_egress::SecretsOut>>> {
    let mut swaps = Vec::new();
    let mut ca_files = Vec::new();
    for s in &secrets.0 {
        let Some(placeholder) = &s.placeholder else {
            continue;
        };
        let Some(policy) = loaded.policy.secrets.get(&s.name) else {
            continue;
        };
        if let Some(ca) = &policy.ca_file {
            ca_files.push(ca.clone());
        }
        swaps.push(mcpbox_egress::SwapSecret {
            name: s.name.clone(),
            placeholder: placeholder.clone(),
            value: s.value.clone(),
            hosts: policy.hosts.clone(),
            bodies: policy.bodies,
        });
    }
    if swaps.is_empty() {
        return Ok(None);
    }
    let authority = mcpbox_egress::Authority::new(sandbox_id)
        .context("making the sandbox's certificate authority")?;
    let extra: Vec<&std::path::Path> = ca_files.iter().map(PathBuf::as_path).collect();
    let system = std::path::Path::new(mcpbox_egress::intercept::SYSTEM_CA_FILE);
    let client = mcpbox_egress::intercept::client_config(system, &extra)
        .context("the roots the proxy verifies the secrets' hosts with")?;
    let bundle = mcpbox_egress::intercept::bundle(&authority, system);
    let out = mcpbox_egress::SecretsOut::new(swaps, authority, client)
        .context("the secrets kept outside the sandbox")?;
    let path = dir.join(CA_BUNDLE);
    std::fs::write(&path, bundle).with_context(|| format!("writing {}", path.display()))?;
    // public certificates only: readable by the sandbox's user (host uid
    // 65534 as root; this user rootless), written by nobody inside (the
    // directory is mounted read-only)
    std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o644))
        .with_context(|| format!("securing {}", path.display()))?;
    Ok(Some(Arc::new(out)))
}

/// The secrets kept outside that have a `ttl`, and the proxy state whose
/// values they rotate.
struct Rotation {
    out: std::sync::Weak<mcpbox_egress::SecretsOut>,
    rotating: Vec<(String, mcpbox_policy::SecretSource, std::time::Duration)>,
}

/// What [`Rotation::start`] will rotate; `None` when no such secret has a ttl.
fn rotation(
    loaded: &crate::preflight::Loaded,
    out: Arc<mcpbox_egress::SecretsOut>,
) -> Option<Rotation> {
    let rotating: Vec<(String, mcpbox_policy::SecretSource, std::time::Duration)> = out
        .swaps()
        .secrets()
        .iter()
        .filter_map(|s| {
            let p = loaded.policy.secrets.get(&s.name)?;
            Some((s.name.clone(), p.source.clone(), p.ttl?))
        })
        .collect();
    if rotating.is_empty() {
        return None;
    }
    Some(Rotation {
        out: Arc::downgrade(&out),
        rotating,
    })
}

impl Rotation {
    /// Every ttl the value is loaded again and only the proxy's copy
    /// changes (the server keeps its placeholder; no restart). The thread
    /// ends with the proxy (it holds it weakly). A failed load keeps the
    /// old value and says so.
    fn start(self) {
        let Rotation {
            out: weak,
            rotating,
        } = self;
        let started = std::thread::Builder::new()
        .name("secret-rotation".into())
        .spawn(move || {
            let tick = std::time::Duration::from_millis(250);
            let mut due: Vec<std::time::Instant> = rotating
                .iter()
                .map(|(_, _, ttl)| std::time::Instant::now() + *ttl)
                .collect();
            loop {
                std::thread::sleep(tick);
                let Some(out) = weak.upgrade() else {
                    return;
                };
                for (i, (name, source, ttl)) in rotating.iter().enumerate() {
                    if std::time::Instant::now() < due[i] {
                        continue;
                    }
                    due[i] = std::time::Instant::now() + *ttl;
                    match mcpbox_gateway::load_secret(name, source) {
                        Ok(v) => match out.set_value(name, &v) {
                            Ok(()) => tracing::info!(secret = %name, "secret rotated in the egress proxy (the server keeps its placeholder)"),
                            Err(e) => tracing::warn!(secret = %name, error = %e, "secret rotation failed; the old value stays"),
                        },
                        Err(e) => tracing::warn!(error = %e, "secret rotation: loading failed; the old value stays"),
                    }
                }
            }
        });
        if let Err(e) = started {
            tracing::warn!(error = %e, "secret rotation thread could not start; values stay as loaded");
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A proxy directory goes only when nobody holds its lock: a live
    /// proxy's stays whatever its name's pid says (another pid namespace's
    /// pid is no evidence), and names of another shape are left alone.
    #[test]
    fn a_live_proxys_directory_is_never_reclaimed_whatever_its_pid() {
        let base = tempfile::tempdir().unwrap();
        let make = |name: &str| {
            std::fs::create_dir(base.path().join(name)).unwrap();
            std::fs::File::create(base.path().join(format!("{name}.lock"))).unwrap()
        };
        // pid 4000000 runs nowhere here, yet its lock is held: live
        let live = "sb-0123456789abcdef.4000000.0.a1b2c3d4e5f6";
        let held = make(live);
        rustix::fs::flock(&held, rustix::fs::FlockOperation::NonBlockingLockExclusive).unwrap();
        // a killed proxy: nobody holds its lock, whatever pid it names
        let gone = format!("0123456789ab.{}.1.00ff00ff00ff", std::process::id());
        drop(make(&gone));
        // not a proxy's name: untouched
        let other = "sb-0123456789abcdef.12.0";
        drop(make(other));
        reclaim_stale_proxy_dirs(base.path());
        assert!(base.path().join(live).is_dir());
        assert!(!base.path().join(&gone).exists());
        assert!(!base.path().join(format!("{gone}.lock")).exists());
        assert!(base.path().join(other).is_dir());
        // once it ends, it goes
        drop(held);
        reclaim_stale_proxy_dirs(base.path());
        assert!(!base.path().join(live).exists());
    }

    #[test]
    fn proxy_names_have_one_shape() {
        assert!(proxy_dir_name("sb-0123456789abcdef.12.0.a1b2c3d4e5f6"));
        assert!(proxy_dir_name("0123456789ab.12.3.a1b2c3d4e5f6"));
        for bad in [
            "sb-0123456789abcdef.12.0",
            "sb-xyz.12.0.a1b2",
            "sb-01.12.x.a1b2",
            "sb-01.12.0.A1B2",
            "../x.1.2.ab",
            "sb-01.1.2.ab.cd",
        ] {
            assert!(!proxy_dir_name(bad), "{bad}");
        }
    }
}
