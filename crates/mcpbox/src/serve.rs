//! `mcpbox serve --config FILE`: the HTTP gateway (crates/serve) with a
//! sandbox of its own for every client session.
//!
//! At start every server's policy is loaded and checked, every client's
//! token read, and the listen address bound; any failure stops here with
//! the config key that caused it. Each session then gets: a fresh sandbox
//! id, the server's policy, its own workspace output directory
//! (`<state>/workspaces/<client>/<server>/output`: one client never sees
//! another's files), its own egress proxy when the policy opens the
//! network, and a relay whose audit `caller` is the client's name.

use std::collections::HashMap;
use std::ffi::OsString;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::atomic::AtomicI32;
use std::sync::Arc;
use std::time::Duration;

use anyhow::{bail, Context};
use mcpbox_audit::Sink;
use mcpbox_gateway::Relay;
use mcpbox_policy::serve::{ServeConfig, Upstream};
use mcpbox_serve::{Backend, ClientSettings, Gateway, Open, Opened, Settings};

use crate::launch::SandboxLauncher;
use crate::preflight::{self, Loaded};
use crate::state;

/// How long a stopping gateway lets requests in flight finish.
const DRAIN: Duration = Duration::from_secs(10);

/// One configured server, checked.
struct Server {
    loaded: Loaded,
    argv: Vec<OsString>,
}

/// Opens sessions: a sandbox per session, as `mcpbox run` starts one.
struct Sandboxes {
    servers: HashMap<String, Server>,
    /// The gateway's own records (refused requests).
    audit: Arc<dyn Sink>,
}

/// Runs the gateway until SIGTERM, SIGINT or SIGHUP.
pub fn run(config: &Path) -> anyhow::Result<i32> {
    let cfg = ServeConfig::load(config).map_err(|e| anyhow::anyhow!("{e}"))?;
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .thread_name("mcpbox-serve")
        .enable_io()
        .enable_time()
        .build()
        .context("starting the async runtime")?;
    // Bound before the settings are made: the accepted Host and Origin
    // values carry the port, which for port 0 only the kernel knows.
    // (tokio's bind, for its listen backlog of 1024: std's 128 refuses
    // connections under a burst of clients.)
    let listen = cfg.listen.address;
    let listener = runtime
        .block_on(tokio::net::TcpListener::bind(listen))
        .with_context(|| format!("listen.address: cannot listen on {listen}"))?;
    let bound = listener.local_addr().unwrap_or(listen);
    let (settings, backend) = prepare(&cfg, bound)?;
    let (stop_tx, stop_rx) = tokio::sync::oneshot::channel::<()>();
    spawn_signal_thread(stop_tx)?;
    runtime.block_on(async move {
        let gw = Gateway::new(settings, backend);
        // the one line a script waits for (tests read the port from it)
        eprintln!("mcpbox: serving on http://{bound}");
        let shutdown = async move {
            let _ = stop_rx.await;
        };
        mcpbox_serve::serve(gw, listener, shutdown, DRAIN)
            .await
            .context("serving")
    })?;
    eprintln!("mcpbox: stopped");
    Ok(0)
}

/// Checks every server's policy and every client's token, and builds the
/// gateway's settings (for the address `bound`) and backend.
fn prepare(cfg: &ServeConfig, bound: SocketAddr) -> anyhow::Result<(Settings, Arc<dyn Backend>)> {
    let tls = cfg.listen.tls.is_some();
    if tls {
        bail!("listen.tls: TLS is not built into this mcpbox yet; bind to loopback and put a TLS proxy in front");
    }
    let mut settings = Settings::new(
        bound,
        tls,
        &cfg.listen.allowed_hosts,
        &cfg.listen.allowed_origins,
    );
    let l = &cfg.limits;
    settings.limits = mcpbox_serve::Limits {
        max_body: usize::try_from(l.max_body).unwrap_or(usize::MAX),
        max_concurrent: l.max_concurrent,
        rate_per_second: l.rate_per_second,
        burst: l.burst,
        header_timeout: l.header_timeout,
        body_timeout: l.body_timeout,
        max_sessions_per_client: l.max_sessions_per_client,
        max_streams_per_client: l.max_streams_per_client,
    };
    let mut servers = HashMap::new();
    for (i, s) in cfg.servers.iter().enumerate() {
        let at = format!("servers[{i}] ({})", s.name);
        let argv = match &s.upstream {
            Upstream::Command(argv) => argv.iter().map(OsString::from).collect::<Vec<_>>(),
            Upstream::Url(_) => {
                bail!("{at}: remote upstreams (url) are not built into this mcpbox yet")
            }
        };
        let loaded = preflight::load(Some(&s.policy))
            .with_context(|| format!("{at}: policy {}", s.policy.display()))?;
        // the host checks `run` makes, once, before anyone connects
        preflight::spec(&loaded, argv.clone(), mcpbox_sandbox::Stdio::Piped)
            .with_context(|| format!("{at}: policy {}", s.policy.display()))?;
        if let Some(m) = loaded
            .policy
            .filesystem
            .mounts
            .iter()
            .find(|m| m.mode == mcpbox_policy::MountMode::Rw)
        {
            bail!(
                "{at}: policy {} mounts {} read-write; under `serve` every client gets a workspace of its own, and a shared writable mount would let one client's server change what another's reads. Mount it read-only, or use filesystem.output",
                s.policy.display(),
                m.host.display()
            );
        }
        settings.servers.push(s.name.clone());
        servers.insert(s.name.clone(), Server { loaded, argv });
    }
    for (i, c) in cfg.clients.iter().enumerate() {
        let may: Vec<String> = match &c.servers {
            Some(list) => list.clone(),
            None => settings.servers.clone(),
        };
        let client = match &c.token {
            Some(source) => {
                let token = source
                    .load()
                    .map_err(|e| anyhow::anyhow!("clients[{i}] ({}): token: {e}", c.name))?;
                ClientSettings::with_token(&c.name, &token, may)
            }
            None => ClientSettings::anonymous(&c.name, may),
        };
        settings.clients.push(client);
    }
    let audit = state::open_default_audit()?;
    let backend = Sandboxes { servers, audit };
    Ok((settings, Arc::new(backend)))
}

impl Backend for Sandboxes {
    fn open(&self, open: &Open) -> Result<Opened, String> {
        let server = self
            .servers
            .get(&open.server)
            .ok_or_else(|| format!("no server {}", open.server))?;
        open_sandbox(server, open).map_err(|e| format!("{e:#}"))
    }

    fn audit(&self, event: mcpbox_audit::Event) {
        self.audit.record(event);
    }
}

/// The workspace output of `client` on `server`, created private (and, as
/// root, owned by the uid the sandbox runs as).
fn workspace_output(client: &str, server: &str) -> anyhow::Result<PathBuf> {
    let dir = state::state_dir()
        .join("workspaces")
        .join(client)
        .join(server)
        .join("output");
    std::fs::create_dir_all(&dir).with_context(|| format!("creating {}", dir.display()))?;
    use std::os::unix::fs::PermissionsExt;
    std::fs::set_permissions(&dir, std::fs::Permissions::from_mode(0o700))
        .with_context(|| format!("chmod {}", dir.display()))?;
    if preflight::is_root() {
        let id = mcpbox_sandbox::ROOT_RUN_HOST_ID;
        std::os::unix::fs::chown(&dir, Some(id), Some(id))
            .with_context(|| format!("chown {}", dir.display()))?;
    }
    Ok(dir)
}

fn open_sandbox(server: &Server, open: &Open) -> anyhow::Result<Opened> {
    let loaded = &server.loaded;
    let mut spec = preflight::spec(loaded, server.argv.clone(), mcpbox_sandbox::Stdio::Piped)?;
    if spec.output.is_some() {
        spec.output = Some(workspace_output(&open.client, &open.server)?);
    }
    let sandbox_id = state::new_id();
    let workspace_id = state::workspace_id(&spec);
    let audit: Arc<dyn Sink> = open.metrics.sink(state::open_audit(&loaded.policy)?);
    let approver = crate::egress::HostApprover::new();
    let proxy = if loaded.policy.network.is_closed() {
        None
    } else {
        let ids = mcpbox_egress::Ids {
            sandbox_id: sandbox_id.clone(),
            workspace_id: workspace_id.clone(),
            server: open.server.clone(),
        };
        Some(crate::egress::start_with_approver(
            &loaded.policy.network,
            audit.clone(),
            ids,
            &mut spec,
            Arc::new(approver.clone()),
        )?)
    };
    let mut config = crate::run::relay_config(loaded, &spec, sandbox_id.clone(), workspace_id)?;
    config.server_name = open.server.clone();
    config.caller = open.client.clone();
    let launcher = SandboxLauncher {
        spec,
        current: Arc::new(AtomicI32::new(0)),
    };
    let relay = Relay::new(config, Box::new(launcher));
    approver.connect(relay.host_asker());
    let relay = relay
        .policy(crate::run::tool_policy(loaded))
        .secrets(crate::run::secrets(loaded)?)
        .audit(audit);
    Ok(Opened {
        relay,
        sandbox_id,
        keep: Box::new(proxy),
    })
}

/// The first SIGTERM, SIGINT or SIGHUP stops the gateway in order; the
/// relays stop their sandboxes. The signals were blocked before any thread
/// started (main), so only this thread sees them.
fn spawn_signal_thread(stop: tokio::sync::oneshot::Sender<()>) -> anyhow::Result<()> {
    std::thread::Builder::new()
        .name("signals".into())
        .spawn(move || {
            let mut stop = Some(stop);
            while let Ok(sig) = mcpbox_sandbox::wait_forwarded_signal() {
                if ![libc::SIGTERM, libc::SIGINT, libc::SIGHUP].contains(&sig) {
                    continue;
                }
                tracing::info!(sig, "signal received: stopping");
                match stop.take() {
                    Some(s) => {
                        let _ = s.send(());
                    }
                    // a second signal: the orderly stop is taking too long
                    None => std::process::exit(130),
                }
            }
        })
        .context("starting the signal thread")?;
    Ok(())
}
