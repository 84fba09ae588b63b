//! `mcpbox serve --config FILE`: the HTTP gateway (crates/serve) with the
//! sandbox lifecycle (crate::lifecycle) behind it.
//!
//! At start the state directory is locked (`<state>/serve.lock`: one
//! gateway per state directory, a second refused before it touches
//! anything), every server's policy is loaded and checked, every client's
//! token read, the sandboxes a previous run left re-adopted (or cleaned
//! up), the control socket opened and the listen address bound; any
//! failure stops here with the config key that caused it. Each session
//! then joins the sandbox of its (client, server or shared group, task):
//! its workspace (`<state>/sandboxes/<id>/{input,output,tmp}`: one client
//! never sees another's files), its cgroup parent, the server's policy,
//! its own egress proxy when the policy opens the network, and a relay
//! whose audit `caller` is the client's name and whose activity drives
//! the sandbox's idle clock.
//!
//! A server with `url = ...` is remote (placement "outside"): no sandbox,
//! no workspace; its relay talks to it through
//! [`mcpbox_serve::upstream::RemoteLauncher`], so the policy's `[tools]`,
//! `[secrets]` (the `[upstream]` credential) and `[output]` apply as for a
//! sandboxed server. Its host must be allowed by the policy's `[network]`
//! and resolve to a public address (a loopback URL may reach loopback).

use std::collections::HashMap;
use std::ffi::OsString;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use anyhow::{bail, Context};
use mcpbox_audit::Sink;
use mcpbox_gateway::broker::Broker;
use mcpbox_gateway::Relay;
use mcpbox_policy::serve::{ServeConfig, Upstream};
use mcpbox_serve::upstream::{AddressGuard, Remote, RemoteLauncher};
use mcpbox_serve::{Backend, ClientSettings, Gateway, Open, Opened, Settings};

use crate::lifecycle::{self, Lifecycle, ServerLife, SessionGuard};
use crate::preflight::{self, Loaded};
use crate::state;

/// One configured server, checked.
struct Server {
    loaded: Loaded,
    place: Place,
    /// Its policy's audit store, shared by all its sessions (one writer
    /// per database keeps its hash chain linear).
    audit: Arc<mcpbox_audit::SqliteStore>,
}

/// Where a server runs.
enum Place {
    /// In a sandbox of its own per session: this command; `builtin` when
    /// it is the built-in server (the binary is bound in, and the
    /// gateway checks its tools' arguments).
    Sandbox {
        argv: Vec<OsString>,
        builtin: bool,
        /// What runtime discovery made of the command's spec, once at
        /// start (None for the built-in server, which is bound in).
        runtime: Option<Runtime>,
    },
    /// Elsewhere, reached over Streamable HTTP.
    Remote(Arc<Remote>),
}

/// A server's command as runtime discovery left its spec (docs/runtime.md):
/// the command (a bare name found on PATH runs by its path), the
/// environment (PATH, a runner's cache) and the mounts. Discovered once at
/// start, as `run` does at its start; each session's spec, made by the same
/// `preflight::spec`, takes these three.
#[derive(Debug, Clone)]
struct Runtime {
    argv: Vec<OsString>,
    env: Vec<(OsString, OsString)>,
    mounts: Vec<mcpbox_sandbox::BindMount>,
}

/// Opens sessions, each in the sandbox of its client, server and task.
struct Sandboxes {
    servers: HashMap<String, Server>,
    /// The gateway's own records (refused requests).
    audit: Arc<dyn Sink>,
    life: Arc<Lifecycle>,
    backend: Arc<dyn lifecycle::Backend>,
    /// The one approval broker of the gateway, shared by every session.
    broker: Arc<Broker>,
}

/// Runs the gateway until SIGTERM, SIGINT or SIGHUP.
pub fn run(config: &Path) -> anyhow::Result<i32> {
    let cfg = ServeConfig::load(config).map_err(|e| anyhow::anyhow!("{e}"))?;
    // one gateway per state directory, decided before anything in it is
    // read or changed: the lifecycle's start kills what it finds of the
    // recorded sandboxes and removes the ready workspaces, which would be
    // a live gateway's if this one were its twin
    let held = StateLock::take(&state::state_dir())?;
    raise_open_file_limit();
    let (mut settings, backend, life) = prepare(&cfg, &held)?;
    // where no volume can bound a workspace, said once at start (and in
    // each sandbox's `created` record), never silently
    if let crate::volume::Bound::Unbounded(why) = crate::volume::bound() {
        eprintln!("mcpbox: warning: [filesystem] tmp does not bound the sandboxes' workspaces here, and new sandboxes are refused unless their policy sets sandbox.dangerously_allow_degraded: {why}");
    }
    // (a second gateway never gets here: the lock above refused it; the
    // control socket's own check of a live socket stays, for a gateway of
    // a version before the lock)
    let socket = held.dir.join("control.sock");
    let control = mcpbox_lifecycle::control::serve(&socket, life.clone())
        .with_context(|| format!("opening the control socket {}", socket.display()))?;
    // the same control on the per-user socket `mcpbox approvals` looks in
    let approvals_control = crate::approvals::listen(life.clone());
    // `--console`: the web console (docs/console.md), on its own thread,
    // over the gateway's broker
    let broker = life.desk.get().map(|d| d.0.clone());
    let _console = crate::console::for_serve(broker, life.clone(), &cfg)?;
    let tls = match &cfg.listen.tls {
        Some(t) => Some(mcpbox_serve::tls::Acceptor::load(&t.cert, &t.key)?),
        None => None,
    };
    let scheme = if tls.is_some() { "https" } else { "http" };
    let listen = settings.listen;
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .thread_name("mcpbox-serve")
        // opening sessions (policy, sandbox spec, egress proxy) blocks; a
        // bounded pool keeps a burst of opens from growing threads without end
        .max_blocking_threads(64)
        .enable_io()
        .enable_time()
        .build()
        .context("starting the async runtime")?;
    let (stop_tx, stop_rx) = tokio::sync::oneshot::channel::<()>();
    spawn_signal_thread(stop_tx)?;
    runtime.block_on(async move {
        let listener = tokio::net::TcpListener::bind(listen)
            .await
            .with_context(|| format!("listen.address: cannot listen on {listen}"))?;
        let bound = listener.local_addr().unwrap_or(listen);
        // the accepted Host and Origin values name the port really bound
        // (port 0 in the config: the kernel's choice)
        settings.rebind(bound);
        let gw = Gateway::new(settings, backend);
        // the one line a script waits for (tests read the port from it)
        eprintln!("mcpbox: serving on {scheme}://{bound}");
        let shutdown = async move {
            let _ = stop_rx.await;
        };
        let grace = gw.settings.limits.shutdown_grace;
        mcpbox_serve::serve_with(gw, listener, tls, shutdown, grace)
            .await
            .context("serving")
    })?;
    drop(control);
    drop(approvals_control);
    life.shutdown();
    // released only now that every sandbox is torn down and every ready
    // workspace removed (on an error return above, the process exits
    // right after, and the kernel releases it with the descriptor)
    drop(held);
    eprintln!("mcpbox: stopped");
    Ok(0)
}

/// The name of the lock file in the state directory that one `serve` at a
/// time holds.
const LOCK_FILE: &str = "serve.lock";

/// The state directory of this gateway, held: an exclusive flock(2) on
/// `<state>/serve.lock` for as long as this value lives.
///
/// The lock is on the open file description, not a pid written in a file:
/// the kernel releases it when the process ends however it ends (`kill
/// -9` included), so a crashed gateway never blocks the next start, and a
/// pid in another pid namespace (a container) cannot fool it. The file
/// itself is left in place; its presence means nothing.
struct StateLock {
    dir: PathBuf,
    _file: std::fs::File,
}

impl StateLock {
    /// Takes the lock of state directory `dir` (which exists: made
    /// private by the caller), or fails at once, naming `dir`, if another
    /// process holds it. Never waits: a second gateway started by mistake
    /// must say so, not hang until the first one stops.
    fn take(dir: &Path) -> anyhow::Result<StateLock> {
        use std::os::unix::fs::OpenOptionsExt;
        let path = dir.join(LOCK_FILE);
        // O_NOFOLLOW: a link planted at the name is refused, never
        // followed to create or lock a file elsewhere; O_NONBLOCK: a fifo
        // planted there fails the open instead of hanging it (refused
        // below as not a regular file); O_CLOEXEC: no sandbox or host
        // command inherits the lock and keeps it past our death
        let file = std::fs::OpenOptions::new()
            .write(true)
            .create(true)
            .mode(0o600)
            .custom_flags(libc::O_NOFOLLOW | libc::O_CLOEXEC | libc::O_NONBLOCK)
            .open(&path)
            .with_context(|| format!("opening the state directory's lock {}", path.display()))?;
        let meta = file
            .metadata()
            .with_context(|| format!("checking {}", path.display()))?;
        if !meta.is_file() {
            bail!(
                "{} is not a regular file: it is the lock one `mcpbox serve` holds on its state directory; remove it",
                path.display()
            );
        }
        match rustix::fs::flock(&file, rustix::fs::FlockOperation::NonBlockingLockExclusive) {
            Ok(()) => Ok(StateLock {
                dir: dir.to_path_buf(),
                _file: file,
            }),
            Err(e) if e == rustix::io::Errno::WOULDBLOCK => bail!(
                "the state directory {} is in use by another `mcpbox serve` (it holds {}); its sandboxes and workspaces were left alone. Stop that gateway first, or give this one a state directory of its own with MCPBOX_STATE_DIR",
                dir.display(),
                path.display()
            ),
            Err(e) => Err(std::io::Error::from(e))
                .with_context(|| format!("locking {}", path.display())),
        }
    }
}

/// Checks every server's policy and every client's token, and builds the
/// gateway's settings and backend. Takes the held state directory, so the
/// lifecycle (whose start recovers what it finds there) never starts on
/// one this process does not hold.
fn prepare(
    cfg: &ServeConfig,
    held: &StateLock,
) -> anyhow::Result<(Settings, Arc<dyn Backend>, Arc<Lifecycle>)> {
    let tls = cfg.listen.tls.is_some();
    let mut settings = Settings::new(
        cfg.listen.address,
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
        max_buffered_per_session: usize::try_from(l.max_buffered_per_session).unwrap_or(usize::MAX),
        max_buffered_total: usize::try_from(l.max_buffered_total).unwrap_or(usize::MAX),
        shutdown_grace: l.shutdown_grace,
    };
    let mut servers = HashMap::new();
    let mut lives = HashMap::new();
    let mut stores: HashMap<PathBuf, Arc<mcpbox_audit::SqliteStore>> = HashMap::new();
    let mut all = Vec::with_capacity(cfg.servers.len());
    for (i, s) in cfg.servers.iter().enumerate() {
        let at = format!("servers[{i}] ({})", s.name);
        all.push(
            preflight::load(Some(&s.policy))
                .with_context(|| format!("{at}: policy {}", s.policy.display()))?,
        );
    }
    // mcpbox's own locations, every server's audit database among them: no
    // server's sandbox may see another's log either
    let private = state::private_locations(all.iter().map(|l| &l.policy));
    // every sandboxed server checked before any log is opened or created
    for ((i, s), loaded) in cfg.servers.iter().enumerate().zip(&all) {
        let at = format!("servers[{i}] ({})", s.name);
        let argv = match &s.upstream {
            Upstream::Command(argv) => argv.iter().map(OsString::from).collect::<Vec<_>>(),
            Upstream::Builtin(_) => {
                crate::builtin::argv(&loaded.policy).with_context(|| at.clone())?
            }
            Upstream::Url(_) => continue,
        };
        check_sandboxed(&at, s, loaded, &argv, &private)?;
        // a template's base is copied whole into every workspace made from it
        let base = s
            .template
            .as_ref()
            .and_then(|name| cfg.templates.iter().find(|t| &t.name == name));
        if let Some(t) = base {
            if let mcpbox_policy::serve::TemplateBase::Dir(p) = &t.base {
                state::refuse_private_base(p, &private)
                    .with_context(|| format!("templates ({}): base", t.name))?;
            }
        }
    }
    for ((i, s), mut loaded) in cfg.servers.iter().enumerate().zip(all) {
        let at = format!("servers[{i}] ({})", s.name);
        let place = match &s.upstream {
            Upstream::Command(argv) => {
                let argv = argv.iter().map(OsString::from).collect::<Vec<_>>();
                let runtime = discover_runtime(&at, s, &mut loaded, &argv)?;
                Place::Sandbox {
                    argv,
                    builtin: false,
                    runtime: Some(runtime),
                }
            }
            Upstream::Builtin(_) => Place::Sandbox {
                argv: crate::builtin::argv(&loaded.policy).with_context(|| at.clone())?,
                builtin: true,
                runtime: None,
            },
            Upstream::Url(url) => Place::Remote(Arc::new(
                remote(&loaded, url).with_context(|| format!("{at}: url {url}"))?,
            )),
        };
        let path = state::audit_path(&loaded.policy);
        let audit = match stores.get(&path) {
            Some(a) => Arc::clone(a),
            None => {
                let a = state::open_audit(&loaded.policy).with_context(|| at.clone())?;
                state::keep_retaining(&a, &loaded.policy.audit);
                stores.insert(path, a.clone());
                a
            }
        };
        settings.servers.push(s.name.clone());
        if matches!(place, Place::Sandbox { .. }) {
            lives.insert(s.name.clone(), server_life(cfg, s, &loaded, audit.clone())?);
        }
        servers.insert(
            s.name.clone(),
            Server {
                loaded,
                place,
                audit,
            },
        );
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
        // two clients with one token would be one client to the gateway,
        // with the looser of the two rights
        if client.token_digest.is_some()
            && settings
                .clients
                .iter()
                .any(|other| other.token_digest == client.token_digest)
        {
            bail!("clients[{i}] ({}): token: the same token as another client; give every client its own", c.name);
        }
        settings.clients.push(client);
    }
    let default = held.dir.join("audit.db");
    let audit: Arc<dyn Sink> = match stores.get(&default) {
        Some(a) => a.clone(),
        None => state::open_default_audit()?,
    };
    let local: Arc<dyn lifecycle::Backend> = Arc::new(lifecycle::backend::Local::new());
    let max = usize::try_from(cfg.limits.max_sandboxes_per_client).unwrap_or(usize::MAX);
    let life = Lifecycle::start(&held.dir, local.clone(), lives, audit.clone(), max)
        .context("the sandbox lifecycle")?;
    // approval records go to the gateway's own audit store
    let broker = Broker::new(audit.clone());
    // `[approvals] notify` of each server's policy, by the server's name
    let notify: HashMap<String, Vec<String>> = servers
        .iter()
        .filter_map(|(name, s)| {
            let argv = s.loaded.policy.approvals.notify.clone()?;
            Some((name.clone(), argv))
        })
        .collect();
    if !notify.is_empty() {
        broker.set_notifier(crate::approvals::notifier(notify, audit.clone()));
    }
    let _ = life.desk.set(crate::approvals::BrokerDesk(broker.clone()));
    let backend = Sandboxes {
        servers,
        audit,
        life: life.clone(),
        backend: local,
        broker,
    };
    Ok((settings, Arc::new(backend), life))
}

/// What the lifecycle needs of a sandboxed server: its group, idle
/// times, template, artifact rules, secrets to revoke, audit store.
fn server_life(
    cfg: &ServeConfig,
    s: &mcpbox_policy::serve::Server,
    loaded: &Loaded,
    audit: Arc<dyn Sink>,
) -> anyhow::Result<ServerLife> {
    let group = match s.placement {
        mcpbox_policy::serve::Placement::Sandbox => s.name.clone(),
        mcpbox_policy::serve::Placement::Shared => lifecycle::SHARED.to_string(),
    };
    let (template, ready) = match &s.template {
        None => (None, 0),
        Some(name) => {
            let t = cfg
                .templates
                .iter()
                .find(|t| &t.name == name)
                .with_context(|| format!("servers ({}): no template {name}", s.name))?;
            match &t.base {
                mcpbox_policy::serve::TemplateBase::Dir(p) => {
                    if !p.is_dir() {
                        bail!(
                            "templates ({name}): base: {} is not a directory: make the template's base, or fix the path",
                            p.display()
                        );
                    }
                }
                mcpbox_policy::serve::TemplateBase::Snapshot(p) => {
                    let limits = mcpbox_lifecycle::snapshot::Limits::default();
                    mcpbox_lifecycle::snapshot::verify(p, &limits)
                        .map_err(|e| anyhow::anyhow!("templates ({name}): snapshot: {e}"))?;
                }
            }
            (Some((name.clone(), t.base.clone())), t.ready as usize)
        }
    };
    let p = &loaded.policy;
    let revoke = p
        .secrets
        .iter()
        .filter_map(|(name, secret)| {
            secret
                .revoke
                .clone()
                .map(|argv| (name.clone(), secret.source.clone(), argv))
        })
        .collect();
    Ok(ServerLife {
        group,
        workspace_size: p.filesystem.tmp,
        allow_unbounded_disk: p.sandbox.dangerously_allow_degraded,
        idle: s.idle,
        template,
        ready,
        artifacts: (p.artifacts.patterns.clone(), p.artifacts.max_size),
        revoke,
        audit,
    })
}

/// The host checks `run` makes, once, before anyone connects.
fn check_sandboxed(
    at: &str,
    s: &mcpbox_policy::serve::Server,
    loaded: &Loaded,
    argv: &[OsString],
    private: &[(&'static str, PathBuf)],
) -> anyhow::Result<()> {
    preflight::spec_among(loaded, argv.to_vec(), mcpbox_sandbox::Stdio::Piped, private)
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
    Ok(())
}

/// Runtime discovery for a server's command, as `run` makes it
/// ([`crate::runtime::prepare`]), each line said once on stderr with the
/// server's name; the mounts recorded in every session's `session_start`.
fn discover_runtime(
    at: &str,
    s: &mcpbox_policy::serve::Server,
    loaded: &mut Loaded,
    argv: &[OsString],
) -> anyhow::Result<Runtime> {
    let mut spec = preflight::spec(loaded, argv.to_vec(), mcpbox_sandbox::Stdio::Piped)
        .with_context(|| format!("{at}: policy {}", s.policy.display()))?;
    let degraded = loaded.policy.sandbox.dangerously_allow_degraded
        && !mcpbox_sandbox::doctor::user_namespaces_work();
    let discover = loaded.policy.runtime.discover && !degraded;
    let path = std::env::var_os("PATH").unwrap_or_default();
    let done = crate::runtime::prepare(&loaded.policy, &mut spec, true, discover, false, &path)
        .with_context(|| format!("{at}: runtime"))?;
    for line in &done.lines {
        eprintln!("mcpbox: {at}: runtime: {line}");
    }
    loaded.runtime = done.audit;
    loaded.argv = (spec.argv != argv).then(|| argv.to_vec());
    Ok(Runtime {
        argv: spec.argv,
        env: spec.env,
        mounts: spec.mounts,
    })
}

/// The roots that verify an https upstream: `SSL_CERT_FILE` when set (as
/// OpenSSL and most TLS clients read it), else the system bundle.
fn ca_file() -> PathBuf {
    std::env::var_os("SSL_CERT_FILE")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from(mcpbox_serve::tls::SYSTEM_CA_FILE))
}

/// True for a URL host written as loopback: `localhost`, 127.0.0.0/8, ::1.
fn written_as_loopback(host: &str) -> bool {
    host.eq_ignore_ascii_case("localhost")
        || host
            .parse::<std::net::IpAddr>()
            .is_ok_and(|ip| ip.is_loopback())
}

/// A remote upstream, checked against its policy's `[network]`: the host
/// and port allowed, and the address it resolves to now public (or
/// loopback for a URL written as loopback, or a `[network.hosts]`
/// mapping), as the egress proxy checks a sandbox's connections.
fn remote(loaded: &Loaded, url: &str) -> anyhow::Result<Remote> {
    let network = &loaded.policy.network;
    let (host, port) = mcpbox_serve::upstream::host_port(url)?;
    let remote_with = |fixed, guard: AddressGuard| {
        Remote::new(
            url,
            loaded.policy.upstream.clone(),
            &ca_file(),
            fixed,
            guard,
        )
    };
    let host = host.as_str();
    let decision = network.decide(host, port);
    match decision.verdict {
        mcpbox_policy::Verdict::Allow => {}
        mcpbox_policy::Verdict::Approve => bail!(
            "{host}:{port} is not in the policy's network.allow (network.unlisted = \"approve\" cannot ask anyone for a remote upstream): add \"{host}:{port}\" to network.allow"
        ),
        mcpbox_policy::Verdict::Deny => bail!(
            "the policy's [network] does not allow {host}:{port} ({}, {}): add \"{host}:{port}\" to network.allow",
            decision.reason.as_str(),
            decision.source
        ),
    }
    let fixed = network.mapped_address(host);
    if let Some(ip) = fixed {
        if let Some(class) = mcpbox_egress::classify(ip).filter(|c| !c.allowed_for_mapping()) {
            bail!(
                "network.hosts maps {host} to {ip}, {}, which no upstream may be",
                class.describe()
            );
        }
    }
    let loopback_ok = written_as_loopback(host);
    let guard: AddressGuard = Arc::new(move |ip| match mcpbox_egress::classify(ip) {
        None => Ok(()),
        Some(mcpbox_egress::AddressClass::Loopback) if loopback_ok => Ok(()),
        Some(class) => Err(class.describe().to_string()),
    });
    let remote = remote_with(fixed, guard)?;
    remote
        .check_address()
        .map_err(|e| anyhow::anyhow!("{e}; only public addresses are reached (a URL written as loopback may reach loopback, a network.hosts mapping its address)"))?;
    Ok(remote)
}

impl Backend for Sandboxes {
    fn open(&self, open: &Open) -> Result<Opened, mcpbox_serve::OpenError> {
        let server = self
            .servers
            .get(&open.server)
            .ok_or_else(|| format!("no server {}", open.server))?;
        match &server.place {
            Place::Sandbox {
                argv,
                builtin,
                runtime,
            } => open_sandbox(self, server, argv, *builtin, runtime.as_ref(), open),
            Place::Remote(remote) => open_remote(server, remote, open, &self.broker),
        }
        .map_err(|e| {
            if let Some(limit) = e.downcast_ref::<lifecycle::SandboxLimit>() {
                mcpbox_serve::OpenError::SandboxLimit(limit.0.clone())
            } else if let Some(d) = e.downcast_ref::<lifecycle::Destroying>() {
                mcpbox_serve::OpenError::Destroying(d.to_string())
            } else {
                mcpbox_serve::OpenError::Failed(format!("{e:#}"))
            }
        })
    }

    fn audit(&self, event: mcpbox_audit::Event) {
        self.audit.record(event);
    }
}

/// A relay on a remote upstream: no sandbox, no workspace, no egress
/// proxy (the gateway itself connects, to the address checked at start
/// or, on a new connection, checked again).
fn open_remote(
    server: &Server,
    remote: &Arc<Remote>,
    open: &Open,
    broker: &Arc<Broker>,
) -> anyhow::Result<Opened> {
    let loaded = &server.loaded;
    let runtime = tokio::runtime::Handle::try_current()
        .context("a remote upstream needs the gateway's runtime")?;
    let sandbox_id = state::new_id();
    let audit: Arc<dyn Sink> = open.metrics.sink(server.audit.clone());
    let workspace_id = format!("remote-{}", open.server);
    let identity = format!("url:{}", remote.url());
    let mut config =
        crate::run::relay_config(loaded, &identity, None, sandbox_id.clone(), workspace_id)?;
    config.server_name = open.server.clone();
    config.caller = open.client.clone();
    // the gateway drains a session's requests itself (limits.shutdown_grace)
    // before it closes the session, and a client that ended its session
    // (DELETE) takes no more answers: the server's input closed, the
    // usual grace before SIGTERM
    config.drain_grace = config.shutdown_grace;
    let launcher = RemoteLauncher::new(remote.clone(), runtime);
    // no sandbox: no host directory is behind anything, so client roots
    // are all dropped and absolute path arguments are outside
    let view = crate::arguments::SandboxView::none();
    config.paths = Some(view.map().clone());
    let relay = crate::run::with_policy(
        Relay::new(config, Box::new(launcher)).broker(broker.clone()),
        loaded,
        crate::run::secrets(loaded, crate::run::SecretsFor::Mcpbox)?,
        audit,
        None,
        view,
    )?;
    Ok(Opened {
        relay,
        sandbox_id,
        keep: Box::new(()),
        attached: None,
    })
}

fn open_sandbox(
    backend: &Sandboxes,
    server: &Server,
    argv: &[OsString],
    builtin: bool,
    runtime: Option<&Runtime>,
    open: &Open,
) -> anyhow::Result<Opened> {
    let loaded = &server.loaded;
    let mut spec = preflight::spec(loaded, argv.to_vec(), mcpbox_sandbox::Stdio::Piped)?;
    if let Some(rt) = runtime {
        spec.argv = rt.argv.clone();
        spec.env = rt.env.clone();
        spec.mounts = rt.mounts.clone();
    }
    if builtin {
        crate::builtin::add_binary(&mut spec)?;
    }
    let (sb, slot) = backend
        .life
        .join(&open.client, &open.server, open.task.as_deref())?;
    // from here on, leaving (an error included) gives the slot back
    let guard = SessionGuard {
        sb: sb.clone(),
        slot,
    };
    let ws = &sb.workspace;
    spec.output = Some(ws.output());
    spec.tmp_dir = Some(ws.tmp());
    if sb.has_template() {
        spec.input = Some(ws.input());
    }
    let checks = builtin.then(|| crate::builtin::Checks::for_spec(&spec, &loaded.policy));
    let sandbox_id = sb.id.clone();
    let workspace_id = state::workspace_id(&spec);
    let audit: Arc<dyn Sink> = open.metrics.sink(server.audit.clone());
    let approver = crate::egress::HostApprover::new();
    let ids = mcpbox_egress::Ids {
        sandbox_id: sandbox_id.clone(),
        workspace_id: workspace_id.clone(),
        server: open.server.clone(),
    };
    let calls = Arc::new(mcpbox_gateway::CallsInFlight::default());
    // placeholders per session: each session's proxy keeps its own
    let secrets = crate::run::secrets(loaded, crate::run::SecretsFor::Sandbox)?;
    let proxy = crate::egress::for_policy(
        loaded,
        audit.clone(),
        ids,
        &mut spec,
        &approver,
        calls.clone(),
        &secrets,
    )?;
    let identity = if builtin {
        crate::builtin::PIN_IDENTITY.to_string()
    } else {
        crate::run::command_identity(argv)
    };
    let mut config = crate::run::relay_config(
        loaded,
        &identity,
        spec.output.clone(),
        sandbox_id.clone(),
        workspace_id,
    )?;
    config.server_name = open.server.clone();
    config.caller = open.client.clone();
    // the gateway drains a session's requests itself (limits.shutdown_grace)
    // before it closes the session, and a client that ended its session
    // (DELETE) takes no more answers: the server's input closed, the
    // usual grace before SIGTERM
    config.drain_grace = config.shutdown_grace;
    let view = crate::arguments::SandboxView::for_spec(&spec);
    config.paths = Some(view.map().clone());
    let launcher = lifecycle::backend::Launch::new(
        backend.backend.clone(),
        &sb.id,
        &open.server,
        spec,
        loaded.policy.sandbox.isolation,
    );
    let relay = Relay::new(config, Box::new(launcher))
        .activity(sb.activity(slot))
        .calls_in_flight(calls)
        .broker(backend.broker.clone());
    approver.connect(relay.host_asker().with_broker(backend.broker.clone()));
    let relay = crate::run::with_policy(relay, loaded, secrets, audit, checks, view)?;
    let attach_to = sb.clone();
    Ok(Opened {
        relay,
        sandbox_id,
        // the proxy first: it goes before the sandbox says it is left
        keep: Box::new((proxy, guard)),
        attached: Some(Box::new(move |feed| attach_to.attach(slot, feed))),
    })
}

/// Raises the soft limit on open files to the hard one (as servers do):
/// every connection and event stream is a descriptor, and the usual soft
/// default of 1024 would refuse the thousand-first client with EMFILE. The
/// hard limit, which a sandboxed server could raise its own soft limit to
/// anyway, is unchanged. Best effort: a failure leaves the limit as it was.
fn raise_open_file_limit() {
    use rustix::process::{getrlimit, setrlimit, Resource};
    let mut limit = getrlimit(Resource::Nofile);
    if limit.current < limit.maximum {
        limit.current = limit.maximum;
        if let Err(e) = setrlimit(Resource::Nofile, limit) {
            tracing::warn!("cannot raise the open-file limit: {e}");
        }
    }
    let now = getrlimit(Resource::Nofile).current;
    if now.is_some_and(|n| n < 4096) {
        tracing::warn!(
            limit = now,
            "the open-file limit bounds the connections and streams this gateway can hold"
        );
    }
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
                    None => {
                        mcpbox_gateway::host_command::kill_running();
                        std::process::exit(130)
                    }
                }
            }
        })
        .context("starting the signal thread")?;
    Ok(())
}
