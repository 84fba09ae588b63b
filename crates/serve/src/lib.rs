//! The HTTP face of the mcpbox gateway (`mcpbox serve`): MCP Streamable
//! HTTP for many clients, each (client, server) session on a relay
//! session of its own ([`mcpbox_gateway::Relay`]), so policy, approvals,
//! pinning, redaction and the audit work exactly as for `mcpbox run`.
//!
//! Layers, from the top down (each module depends only on those below it;
//! the protocol's constants and id rewriting are [`mcpbox_policy::mcp`]'s):
//!
//! - [`http`]: one hyper service. Every request passes the same checks in
//!   a fixed order (Host and Origin against DNS rebinding, the bearer
//!   token, the server and the client's right to it, rate and concurrency
//!   limits, content type, accept, protocol version, body size and time)
//!   before any session sees it; one lookup of a session id and one GET
//!   and DELETE for both endpoints. Generic over the request body, so
//!   its tests call it without a socket.
//! - [`modern`]: the stateless revision (2026-07-28): one stateless session
//!   per client and server, requests under the gateway's own ids.
//! - [`aggregate`]: `/mcp`, one session over every server the client may
//!   use, names prefixed `<server>__`, over a pure core (`members.rs`:
//!   which member a request goes to, URI owners, merged answers, ids).
//! - `reply.rs`: what the endpoints share (refusals, the request's context,
//!   header checks, event streams, the one way an answer forwarded under
//!   our id is given back).
//! - [`session`]: one live MCP session ([`session::McpSession`]) per
//!   `Mcp-Session-Id`, and its [`session::Router`], the relay's
//!   [`mcpbox_gateway::HostSink`], which sends each message the relay has
//!   for the host where the pure [`route`] core says: the POST waiting for
//!   it or the session's GET stream.
//! - [`gate`]: Host, Origin, the bearer token and the session cookie, the
//!   first checks of both this service and the web console ([`console`]).
//! - [`Backend`]: how a session gets its relay. `mcpbox` gives each one a
//!   sandbox (and its egress proxy) of its own, or, for a remote server,
//!   an [`upstream::RemoteLauncher`]; tests give it a plain process.
//! - [`tls`]: the listener's TLS ([`serve_with`]) and the upstream
//!   client's.
//! - [`upstream`]: remote servers, reached as a Streamable HTTP client
//!   behind the relay's [`mcpbox_gateway::Launcher`] interface.
//!
//! Threads: the tokio runtime runs the HTTP side only. Each relay session
//! runs on a thread of its own ([`mcpbox_gateway::Attached::run`]), and
//! sandboxes are started by the relay's launcher thread through the
//! single-threaded sandbox helper, never from the runtime's threads.
//! Opening a session ([`Backend::open`]: reading the policy, starting the
//! egress proxy) runs on the runtime's blocking pool.
//!
//! Dependencies, each for one job: tokio (the runtime), hyper, hyper-util
//! and http-body-util (HTTP/1.1: the ecosystem's standard stack, so no
//! HTTP is parsed by hand; hyper's client and hyper-util's `client-legacy`
//! pool for remote upstreams), bytes (hyper's buffers), sha2 (token
//! digests, compared in constant time), rustls and tokio-rustls with the
//! ring provider and no default features (TLS 1.2/1.3 for the listener and
//! upstreams; aws-lc-rs would need cmake and a long C build; ring's C and
//! assembly build is most of the cost, about 13 s for all of these on 2
//! cores), rustls-pki-types (PEM certificates and keys, the maintained
//! successor of rustls-pemfile; already in rustls' tree), tower-service (the connector trait of hyper-util's client,
//! already in its tree).
#![forbid(unsafe_code)]
#![warn(missing_docs)]
#![cfg_attr(test, allow(clippy::unwrap_used, clippy::expect_used))]

pub mod aggregate;
pub mod body;
pub mod budget;
pub mod console;
pub mod gate;
pub mod http;
pub mod limits;
pub(crate) mod members;
pub mod metrics;
pub mod modern;
pub(crate) mod reply;
pub mod route;
pub mod session;
pub mod settings;
pub mod tls;
pub mod upstream;

use std::collections::HashMap;
use std::future::Future;
use std::io::Read;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use hyper::server::conn::http1;
use hyper::service::service_fn;
use hyper_util::rt::{TokioIo, TokioTimer};
use mcpbox_audit::Event as AuditEvent;
use mcpbox_gateway::{HostFeed, Relay};
use mcpbox_policy::Reason;
use tokio::net::TcpListener;

pub use metrics::Metrics;
pub use settings::{ClientSettings, Limits, Settings};

use limits::ClientLimits;
use session::{McpSession, Router};

/// What [`Backend::open`] is asked for.
#[derive(Debug, Clone)]
pub struct Open {
    /// The client's name (the audit's `caller`).
    pub client: String,
    /// The server's name.
    pub server: String,
    /// The new session's id (not a secret to the backend, but never log it
    /// where other clients can read it).
    pub session_id: String,
    /// The task the client named (`Mcpbox-Task` header or
    /// `params._meta["io.mcpbox/task"]` of `initialize`), checked by
    /// `mcpbox_lifecycle::id::check_task`.
    pub task: Option<String>,
    /// Wrap the relay's audit sink with [`Metrics::sink`] to count denials.
    pub metrics: Arc<Metrics>,
}

/// Called with a session's feed once it is attached ([`Opened::attached`]).
pub type OnAttach = Box<dyn FnOnce(&HostFeed) + Send>;

/// The stateless session of each (client, server, task).
type StatelessKey = (String, String, Option<String>);

/// A relay, ready to run, for one session.
pub struct Opened {
    /// The relay, configured (caller, sandbox id, policy, audit, ...).
    pub relay: Relay,
    /// The sandbox's id, for logs.
    pub sandbox_id: String,
    /// Whatever must live as long as the session (the egress proxy); it
    /// is dropped once the relay has ended.
    pub keep: Box<dyn Send>,
    /// Called once with the session's feed when it is attached, before
    /// any message: the lifecycle parks, wakes and closes the session
    /// through it.
    pub attached: Option<OnAttach>,
}

impl std::fmt::Debug for Opened {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Opened")
            .field("sandbox_id", &self.sandbox_id)
            .finish_non_exhaustive()
    }
}

/// Why a backend did not open a session.
#[derive(Debug)]
pub enum OpenError {
    /// The server could not be started (for the gateway's log; the client
    /// is told only that, 503 `http.session_failed`).
    Failed(String),
    /// The client has as many sandboxes as it may (429
    /// `http.sandbox_limit`; the text is for the client and the log).
    SandboxLimit(String),
    /// The session's sandbox is being torn down (503 with `Retry-After`,
    /// `http.sandbox_destroying`): no session joins a sandbox whose
    /// workspace is about to go.
    Destroying(String),
}

impl std::fmt::Display for OpenError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            OpenError::Failed(s) | OpenError::SandboxLimit(s) | OpenError::Destroying(s) => {
                f.write_str(s)
            }
        }
    }
}

impl From<String> for OpenError {
    fn from(s: String) -> Self {
        OpenError::Failed(s)
    }
}

/// Why a session was not opened, for the client: the reason, and for a
/// server that could not be started the step that failed
/// ([`client_step`]).
#[derive(Debug)]
pub(crate) struct OpenRefused {
    pub(crate) reason: Reason,
    pub(crate) step: Option<String>,
}

impl From<Reason> for OpenRefused {
    fn from(reason: Reason) -> Self {
        OpenRefused { reason, step: None }
    }
}

/// The step that failed, as a client may see it (issue 32: a client was
/// told only "the server could not be started"): the outermost line of the
/// backend's error (its chain, after ": ", stays in the gateway's log), a
/// host path shown by its last component only (the layout of the
/// operator's machine is not the client's business), terminal-safe, at
/// most 200 characters.
fn client_step(error: &str) -> String {
    let first = error.split(": ").next().unwrap_or(error);
    let words: Vec<String> = first
        .split(' ')
        .map(|w| match w.strip_prefix('/') {
            Some(rest) if !rest.is_empty() => {
                let last = rest.rsplit('/').next().unwrap_or(rest);
                format!("…/{last}")
            }
            _ => w.to_string(),
        })
        .collect();
    let step: String = words
        .join(" ")
        .chars()
        .filter(|&c| !mcpbox_policy::terminal::is_unsafe(c))
        .take(200)
        .collect();
    step
}

/// Where sessions get their relays, and gateway-level records go.
pub trait Backend: Send + Sync + 'static {
    /// A relay for a new session of `open.client` on `open.server`. The
    /// error is for the gateway's log (the client is told only that the
    /// server could not be started).
    fn open(&self, open: &Open) -> Result<Opened, OpenError>;

    /// Records a refused request (kind `access`).
    fn audit(&self, event: AuditEvent);
}

/// The live sessions, by id.
#[derive(Debug, Default)]
pub struct Sessions {
    map: Mutex<HashMap<String, Arc<McpSession>>>,
}

impl Sessions {
    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<String, Arc<McpSession>>> {
        self.map.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// The session with this id.
    pub fn get(&self, id: &str) -> Option<Arc<McpSession>> {
        self.lock().get(id).cloned()
    }

    /// Live sessions.
    pub fn len(&self) -> usize {
        self.lock().len()
    }

    /// Whether there are none.
    pub fn is_empty(&self) -> bool {
        self.lock().is_empty()
    }

    fn insert(&self, s: Arc<McpSession>) {
        self.lock().insert(s.id.clone(), s);
    }

    fn remove(&self, id: &str) -> Option<Arc<McpSession>> {
        self.lock().remove(id)
    }

    fn all(&self) -> Vec<Arc<McpSession>> {
        self.lock().values().cloned().collect()
    }
}

/// The gateway: settings, sessions, counters.
pub struct Gateway {
    /// What it runs with.
    pub settings: Settings,
    /// Its counters.
    pub metrics: Arc<Metrics>,
    /// The live sessions.
    pub sessions: Arc<Sessions>,
    /// What the sessions may hold for their clients, in bytes.
    pub budgets: budget::Budgets,
    backend: Arc<dyn Backend>,
    limits: HashMap<String, Arc<ClientLimits>>,
    /// The live sessions on `/mcp`, by id.
    aggregates: Mutex<HashMap<String, Arc<aggregate::Aggregate>>>,
    /// The session that takes a client's requests of the stateless
    /// revision (2026-07-28) on a server: (client, server) → session id.
    stateless: tokio::sync::Mutex<HashMap<StatelessKey, String>>,
    next_id: std::sync::atomic::AtomicU64,
    stopping: AtomicBool,
    busy: Arc<AtomicUsize>,
    threads: Mutex<Vec<std::thread::JoinHandle<()>>>,
}

impl std::fmt::Debug for Gateway {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Gateway")
            .field("settings", &self.settings)
            .finish_non_exhaustive()
    }
}

/// Counts a POST in flight for the orderly stop.
pub(crate) struct Busy(Arc<AtomicUsize>);

impl Drop for Busy {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::AcqRel);
    }
}

impl Gateway {
    /// A gateway with these settings, opening sessions through `backend`.
    pub fn new(settings: Settings, backend: Arc<dyn Backend>) -> Arc<Gateway> {
        let now = Instant::now();
        let limits = settings
            .clients
            .iter()
            .map(|c| {
                (
                    c.name.clone(),
                    Arc::new(ClientLimits::new(&settings.limits, now)),
                )
            })
            .collect();
        let metrics = Arc::new(Metrics::default());
        let budgets = budget::Budgets::new(
            settings.limits.max_buffered_total,
            settings.limits.max_buffered_per_session,
            metrics.clone(),
        );
        Arc::new(Gateway {
            settings,
            metrics,
            budgets,
            sessions: Arc::new(Sessions::default()),
            backend,
            limits,
            aggregates: Mutex::new(HashMap::new()),
            stateless: tokio::sync::Mutex::new(HashMap::new()),
            next_id: std::sync::atomic::AtomicU64::new(1),
            stopping: AtomicBool::new(false),
            busy: Arc::new(AtomicUsize::new(0)),
            threads: Mutex::new(Vec::new()),
        })
    }

    pub(crate) fn stopping(&self) -> bool {
        self.stopping.load(Ordering::Acquire)
    }

    /// A session budget whose drops are audited as `client`'s on `server`.
    pub(crate) fn session_budget(&self, client: &str, server: &str) -> budget::Budget {
        let (backend, client, server) =
            (self.backend.clone(), client.to_string(), server.to_string());
        self.budgets.session(Box::new(move |d: budget::Dropped| {
            backend.audit(AuditEvent {
                kind: Some(mcpbox_audit::Kind::Flag),
                caller: client.clone(),
                server: server.clone(),
                reason: Some(Reason::HttpBufferFull.as_str().to_string()),
                source: Some(mcpbox_policy::Source::Serve.to_string()),
                detail: serde_json::json!({
                    "queue": d.queue,
                    "dropped": d.count,
                    "dropped_bytes": d.bytes,
                    "max_buffered_per_session": d.session_cap,
                    "max_buffered_total": d.gateway_cap,
                }),
                ..AuditEvent::default()
            });
        }))
    }

    pub(crate) fn busy(&self) -> Busy {
        self.busy.fetch_add(1, Ordering::AcqRel);
        Busy(self.busy.clone())
    }

    pub(crate) fn limits_of(&self, client: &str) -> Arc<ClientLimits> {
        match self.limits.get(client) {
            Some(l) => l.clone(),
            // every configured client has counters; an unknown name cannot
            // pass authentication, so this only keeps the type total
            None => Arc::new(ClientLimits::new(&Limits::default(), Instant::now())),
        }
    }

    fn aggregates(&self) -> std::sync::MutexGuard<'_, HashMap<String, Arc<aggregate::Aggregate>>> {
        self.aggregates.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// The aggregate session with this id.
    pub(crate) fn aggregate(&self, id: &str) -> Option<Arc<aggregate::Aggregate>> {
        self.aggregates().get(id).cloned()
    }

    pub(crate) fn insert_aggregate(&self, a: Arc<aggregate::Aggregate>) {
        self.aggregates().insert(a.id.clone(), a);
    }

    pub(crate) fn forget_aggregate(&self, id: &str) {
        self.aggregates().remove(id);
    }

    /// A fresh id for a request the gateway forwards under its own id.
    pub(crate) fn next_id(&self) -> u64 {
        self.next_id.fetch_add(1, Ordering::Relaxed)
    }

    /// The session that takes `client`'s stateless requests (2026-07-28)
    /// on `server`, opened on first use: requests of that revision carry
    /// no session id, so each client has one relay (and one sandbox) per
    /// server for all of them; it lives while it is used and the gateway
    /// runs.
    pub(crate) async fn stateless_session(
        self: &Arc<Self>,
        client: &str,
        server: &str,
        task: Option<&str>,
    ) -> Result<Arc<McpSession>, OpenRefused> {
        let key = (
            client.to_string(),
            server.to_string(),
            task.map(String::from),
        );
        // held while a session opens, so that concurrent first requests
        // share one sandbox
        let mut map = self.stateless.lock().await;
        if let Some(s) = map.get(&key).and_then(|id| self.sessions.get(id)) {
            if !s.ended() {
                return Ok(s);
            }
        }
        let s = self.open_session(client, server, task, true).await?;
        map.insert(key, s.id.clone());
        Ok(s)
    }

    /// Opens a session of `client` on `server`: a relay on a thread of its
    /// own, registered under a fresh unguessable id. `modern`: a session
    /// for stateless requests (messages go only to the request they belong
    /// to; there is no GET stream).
    pub(crate) async fn open_session(
        self: &Arc<Self>,
        client: &str,
        server: &str,
        task: Option<&str>,
        modern: bool,
    ) -> Result<Arc<McpSession>, OpenRefused> {
        let slot = self
            .limits_of(client)
            .session()
            .ok_or(Reason::HttpSessionLimit)?;
        let id = session_id();
        let open = Open {
            client: client.to_string(),
            server: server.to_string(),
            session_id: id.clone(),
            task: task.map(String::from),
            metrics: self.metrics.clone(),
        };
        let backend = self.backend.clone();
        let opened = tokio::task::spawn_blocking(move || backend.open(&open))
            .await
            .map_err(|_| Reason::HttpSessionFailed)?;
        let opened = match opened {
            Ok(o) => o,
            Err(OpenError::SandboxLimit(e)) => {
                tracing::warn!(client, server, "session refused: {e}");
                return Err(Reason::HttpSandboxLimit.into());
            }
            Err(OpenError::Destroying(e)) => {
                tracing::info!(client, server, "session refused: {e}");
                return Err(Reason::HttpSandboxDestroying.into());
            }
            Err(OpenError::Failed(e)) => {
                tracing::error!(client, server, "cannot open a session: {e}");
                return Err(OpenRefused {
                    reason: Reason::HttpSessionFailed,
                    step: Some(client_step(&e)),
                });
            }
        };
        let registry = self.sessions.clone();
        let gone = id.clone();
        let router = Router::new(
            modern,
            self.session_budget(client, server),
            Box::new(move || {
                registry.remove(&gone);
            }),
        );
        let Opened {
            relay,
            sandbox_id,
            keep,
            attached: on_attach,
        } = opened;
        let routes = router.routes();
        let (feed, attached) = relay.attach(Box::new(router));
        if let Some(f) = on_attach {
            f(&feed);
        }
        let session = Arc::new(McpSession::new(
            id,
            client.to_string(),
            server.to_string(),
            sandbox_id.clone(),
            feed,
            routes,
            slot,
        ));
        self.sessions.insert(session.clone());
        self.metrics.session_opened();
        let (c, s) = (client.to_string(), server.to_string());
        let thread = std::thread::Builder::new()
            .name(format!("mcpbox-http-{server}"))
            .spawn(move || {
                match attached.run() {
                    Ok(o) => tracing::info!(client = %c, server = %s, sandbox = %sandbox_id, reason = ?o.reason, "session ended"),
                    Err(e) => tracing::error!(client = %c, server = %s, sandbox = %sandbox_id, "session failed: {e}"),
                }
                drop(keep);
            });
        match thread {
            Ok(t) => {
                let mut threads = self.threads.lock().unwrap_or_else(|p| p.into_inner());
                threads.retain(|t| !t.is_finished());
                threads.push(t);
                Ok(session)
            }
            Err(e) => {
                tracing::error!("cannot start a session thread: {e}");
                self.sessions.remove(&session.id);
                Err(Reason::HttpSessionFailed.into())
            }
        }
    }

    /// Ends a session: no new requests reach it; the relay stops the
    /// server and writes its last records on its own thread.
    pub(crate) fn close_session(&self, session: &Arc<McpSession>) {
        self.sessions.remove(&session.id);
        let s = session.clone();
        // `close` may wait for room in the relay's queue
        tokio::task::spawn_blocking(move || s.close());
    }
}

/// How long the errors that end the requests left at the end of the grace
/// may take to be written (a client that does not read is not waited for).
const CUT_WAIT: Duration = Duration::from_secs(2);

/// A fresh session id: 128 random bits as hex.
pub(crate) fn session_id() -> String {
    let mut bytes = [0u8; 16];
    let ok = std::fs::File::open("/dev/urandom")
        .and_then(|mut f| f.read_exact(&mut bytes))
        .is_ok();
    if !ok {
        // no randomness, no unguessable ids: refuse to go on guessable ones
        panic!("cannot read /dev/urandom for a session id");
    }
    mcpbox_policy::hex::encode(&bytes)
}

/// Serves `listener` until `shutdown` completes, then stops in order: no
/// new connections or requests; the requests in flight answered, each
/// until the last byte of its answer is written (up to `drain`, then what
/// is left ends with an `http.stopped` error); only then every session
/// closed (servers' input closed, servers stopped, audit flushed); and
/// returns once every relay has ended.
pub async fn serve(
    gw: Arc<Gateway>,
    listener: TcpListener,
    shutdown: impl Future<Output = ()>,
    drain: Duration,
) -> std::io::Result<()> {
    serve_with(gw, listener, None, shutdown, drain).await
}

/// [`serve`], with TLS when `tls` is given: each accepted connection does
/// its handshake on its own task within the header timeout, then is served
/// as a plain one.
pub async fn serve_with(
    gw: Arc<Gateway>,
    listener: TcpListener,
    tls: Option<tls::Acceptor>,
    shutdown: impl Future<Output = ()>,
    drain: Duration,
) -> std::io::Result<()> {
    let graceful = hyper_util::server::graceful::GracefulShutdown::new();
    tokio::pin!(shutdown);
    loop {
        tokio::select! {
            accepted = listener.accept() => {
                let (stream, _peer) = match accepted {
                    Ok(a) => a,
                    Err(e) => {
                        // EMFILE and the like: wait a moment rather than spin
                        tracing::warn!("accept failed: {e}");
                        tokio::time::sleep(Duration::from_millis(50)).await;
                        continue;
                    }
                };
                let _ = stream.set_nodelay(true);
                let gw2 = gw.clone();
                let svc = service_fn(move |req| http::handle(gw2.clone(), req));
                let mut builder = http1::Builder::new();
                builder
                    .timer(TokioTimer::new())
                    .header_read_timeout(gw.settings.limits.header_timeout)
                    .keep_alive(true);
                let Some(tls) = &tls else {
                    let conn = builder.serve_connection(TokioIo::new(stream), svc);
                    let conn = graceful.watch(conn);
                    tokio::spawn(async move {
                        if let Err(e) = conn.await {
                            tracing::debug!("connection ended: {e}");
                        }
                    });
                    continue;
                };
                let (acceptor, watcher) = (tls.inner().clone(), graceful.watcher());
                let handshake_timeout = gw.settings.limits.header_timeout;
                tokio::spawn(async move {
                    let stream = match tokio::time::timeout(handshake_timeout, acceptor.accept(stream)).await {
                        Ok(Ok(s)) => s,
                        Ok(Err(e)) => return tracing::debug!("tls handshake failed: {e}"),
                        Err(_) => return tracing::debug!("tls handshake timed out"),
                    };
                    let conn = builder.serve_connection(TokioIo::new(stream), svc);
                    if let Err(e) = watcher.watch(conn).await {
                        tracing::debug!("connection ended: {e}");
                    }
                });
            }
            () = &mut shutdown => break,
        }
    }
    drop(listener);
    gw.stopping.store(true, Ordering::Release);
    // A request is in flight until the last byte of its answer is
    // written: its place ([`Busy`]) lives in its response body, which
    // hyper drops once the stream has ended (or the client left).
    tracing::info!("stopping: answering the requests in flight");
    let until = Instant::now() + drain;
    while gw.busy.load(Ordering::Acquire) > 0 && Instant::now() < until {
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let left = gw.busy.load(Ordering::Acquire);
    if left > 0 {
        // the grace ran out: what is left is answered with a clear error
        // (`http.stopped`) before any server's input is closed
        tracing::warn!(
            requests = left,
            "stopping: the grace ran out; ending the requests in flight"
        );
        for s in gw.sessions.all() {
            s.cut();
        }
        let until = Instant::now() + CUT_WAIT;
        while gw.busy.load(Ordering::Acquire) > 0 && Instant::now() < until {
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }
    gw.aggregates().clear();
    let sessions = gw.sessions.all();
    tracing::info!(sessions = sessions.len(), "stopping the sessions");
    for s in &sessions {
        gw.close_session(s);
    }
    let _ = tokio::time::timeout(Duration::from_secs(5), graceful.shutdown()).await;
    let threads = std::mem::take(&mut *gw.threads.lock().unwrap_or_else(|p| p.into_inner()));
    let _ = tokio::task::spawn_blocking(move || {
        for t in threads {
            let _ = t.join();
        }
    })
    .await;
    Ok(())
}

#[cfg(test)]
mod open_refused_tests {
    use super::client_step;

    #[test]
    fn a_client_sees_the_failed_step_without_the_hosts_paths_or_the_chain() {
        let e = "creating /tmp/mcpbox-0/sb-0123456789abcdef.7.0: File exists (os error 17)";
        assert_eq!(client_step(e), "creating …/sb-0123456789abcdef.7.0");
        let e = "/run/user/1000/mcpbox is not a directory owned by this user; remove it";
        assert_eq!(
            client_step(e),
            "…/mcpbox is not a directory owned by this user; remove it"
        );
        assert_eq!(client_step("bad\u{1b}[31m step"), "bad[31m step");
        assert_eq!(client_step(&"x".repeat(500)).chars().count(), 200);
    }
}
