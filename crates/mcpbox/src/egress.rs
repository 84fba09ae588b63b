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

/// A running proxy; stopping it (on drop) also removes its socket directory.
pub struct Running {
    shutdown: Shutdown,
    dir: PathBuf,
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
}

impl Bound {
    /// Starts the proxy's thread; dropping the result stops it.
    pub fn serve(self) -> anyhow::Result<Running> {
        let Bound {
            running,
            listener,
            proxy,
        } = self;
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
    rules: &NetworkRules,
    sink: Arc<dyn Sink>,
    ids: Ids,
    spec: &mut mcpbox_sandbox::Spec,
) -> anyhow::Result<Bound> {
    bind_with_approver(rules, sink, ids, spec, Arc::new(DenyAllApprover), None)
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
) -> anyhow::Result<Option<Running>> {
    if loaded.policy.network.is_closed() {
        return Ok(None);
    }
    let approver: Arc<dyn Approver> = Arc::new(approver.clone());
    let calls: Arc<dyn mcpbox_egress::CallContext> = Arc::new(RelayCalls(calls));
    bind_with_approver(
        &loaded.policy.network,
        sink,
        ids,
        spec,
        approver,
        Some(calls),
    )?
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

/// Removes the proxy directories (`sb-….PID.N`) of processes that are gone
/// (a kill -9 skips `Running`'s drop). Only names of that shape are touched,
/// and only where the pid no longer exists.
fn reclaim_stale_proxy_dirs(base: &std::path::Path) {
    let Ok(entries) = std::fs::read_dir(base) else {
        return;
    };
    for e in entries.filter_map(Result::ok) {
        let name = e.file_name();
        let Some(name) = name.to_str() else { continue };
        let mut parts = name.split('.');
        let (Some(id), Some(pid), Some(_), None) =
            (parts.next(), parts.next(), parts.next(), parts.next())
        else {
            continue;
        };
        // a lifecycle id (`sb-` and 16 hex digits) or `run`'s (12 hex digits)
        let hex = id.strip_prefix("sb-").unwrap_or(id);
        if hex.is_empty() || !hex.bytes().all(|b| matches!(b, b'0'..=b'9' | b'a'..=b'f')) {
            continue;
        }
        let Ok(pid) = pid.parse::<u32>() else {
            continue;
        };
        if pid != std::process::id() && !std::path::Path::new(&format!("/proc/{pid}")).exists() {
            let _ = std::fs::remove_dir_all(e.path());
        }
    }
}

fn bind_with_approver(
    rules: &NetworkRules,
    sink: Arc<dyn Sink>,
    ids: Ids,
    spec: &mut mcpbox_sandbox::Spec,
    approver: Arc<dyn Approver>,
    calls: Option<Arc<dyn mcpbox_egress::CallContext>>,
) -> anyhow::Result<Bound> {
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
    // session failed with EEXIST). The pid and a counter keep concurrent
    // proxies apart; what a killed process left behind is reclaimed first.
    reclaim_stale_proxy_dirs(&base);
    let dir = base.join(format!(
        "{}.{}.{}",
        ids.sandbox_id,
        std::process::id(),
        PROXY_SEQ.fetch_add(1, std::sync::atomic::Ordering::Relaxed)
    ));
    match std::fs::create_dir(&dir) {
        Ok(()) => {}
        // the same pid and counter as a dead process's leftover: ours now
        Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => {
            std::fs::remove_dir_all(&dir)
                .and_then(|()| std::fs::create_dir(&dir))
                .with_context(|| format!("creating {}", dir.display()))?;
        }
        Err(e) => return Err(e).with_context(|| format!("creating {}", dir.display())),
    }
    std::fs::set_permissions(&dir, std::fs::Permissions::from_mode(mode))
        .with_context(|| format!("securing {}", dir.display()))?;
    let running = Running {
        shutdown: Shutdown::new(),
        dir: dir.clone(),
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
    spec.egress = Some(mcpbox_sandbox::Egress {
        socket_dir: dir,
        port: BRIDGE_PORT,
        bridge: mcpbox_egress::bridge,
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
    Ok(Bound {
        running,
        listener,
        proxy,
    })
}
