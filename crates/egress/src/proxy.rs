//! The proxy itself: accept loop, the per-connection check sequence, the
//! relay, and the one audit record per connection.
//!
//! The order of checks is the security argument, so it is one linear
//! sequence in [`Proxy::admit`]:
//!
//! 1. parse the target strictly (400 on anything odd, client's fault);
//! 2. refuse metadata service names outright;
//! 3. ask the policy about the name (or IP literal) and port; ask a human
//!    for `Ask`, remembering `Session` answers;
//! 4. for a loopback host on a port `network.local` names, the host's own
//!    loopback address(es), checked to be loopback; else the explicit
//!    `[network.hosts]` mapping if there is one (it may point at loopback or
//!    a private address, never at a metadata endpoint); otherwise resolve
//!    once and refuse if ANY answer is not public unicast;
//! 5. connect to exactly a checked address (never a fresh lookup);
//! 6. for a tunnel, check the TLS ClientHello's SNI against the CONNECT host
//!    before the first client byte goes upstream.

use std::collections::HashSet;
use std::io::{self, Read, Write};
use std::net::{IpAddr, Shutdown as How, SocketAddr, TcpStream};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use mcpbox_audit::{Event, Kind, Sink};
use mcpbox_policy::{Decision, NetworkAnswer, Reason, Source, Verdict};
use serde_json::{json, Map, Value};

use crate::addr::{classify, is_metadata_name};
use crate::exchange::{self, ExchangeError, Exchanged, Target};
use crate::http::{self, error_response, Fault, HeadError, Host, CONNECT_OK};
use crate::intercept::{self, InterceptError, Prefixed, SecretsOut};
use crate::package::{parse_package, registry_for_host};
use crate::pool::Pool;
use crate::stream::{pump, ClientStream, Listener, Socket, WakeTarget};
use crate::tls::{self, Hello, ALERT_ACCESS_DENIED};
use crate::traits::{Approver, Connector, EgressPolicy, Resolver};
use crate::{Error, Result};

/// Which sandbox and server the proxy serves; copied into every record.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Ids {
    /// Sandbox id.
    pub sandbox_id: String,
    /// Workspace id.
    pub workspace_id: String,
    /// Server name from the policy/config.
    pub server: String,
}

/// Who is asking and which tool calls are in flight, as the relay of the
/// proxy's sandbox knows them: a connection's record carries what was in
/// flight when it opened (`detail.calls`), and the caller.
pub trait CallContext: Send + Sync {
    /// The caller and the calls in flight, as (reference, tool).
    fn current(&self) -> (String, Vec<(String, String)>);
}

/// Stops [`Proxy::serve`]: set the flag and wake the blocked `accept`.
/// Clone it freely; every clone controls the same proxy.
#[derive(Debug, Clone, Default)]
pub struct Shutdown {
    inner: Arc<ShutdownInner>,
}

#[derive(Debug, Default)]
struct ShutdownInner {
    flag: AtomicBool,
    wake: Mutex<Vec<WakeTarget>>,
    /// Connections accepted and not yet recorded.
    active: Mutex<usize>,
    idle: std::sync::Condvar,
}

/// Held while one accepted connection is handled (see [`Shutdown::drain`]).
struct Active(Arc<ShutdownInner>);

impl Drop for Active {
    fn drop(&mut self) {
        let mut n = self.0.active.lock().unwrap_or_else(|p| p.into_inner());
        *n = n.saturating_sub(1);
        if *n == 0 {
            self.0.idle.notify_all();
        }
    }
}

impl Shutdown {
    /// A shutdown handle that has not fired.
    pub fn new() -> Self {
        Self::default()
    }

    /// Stops accepting. Connections already accepted run to completion.
    pub fn trigger(&self) {
        self.inner.flag.store(true, Ordering::SeqCst);
        let targets = match self.inner.wake.lock() {
            Ok(t) => t.clone(),
            Err(poisoned) => poisoned.into_inner().clone(),
        };
        for t in targets {
            t.poke();
        }
    }

    /// Waits until every accepted connection has been handled and recorded,
    /// at most `timeout`; returns whether they all were. Called after
    /// [`Shutdown::trigger`] by an owner about to exit, so that the audit
    /// records of the last connections are written before it does.
    pub fn drain(&self, timeout: Duration) -> bool {
        let deadline = Instant::now() + timeout;
        let mut n = self.inner.active.lock().unwrap_or_else(|p| p.into_inner());
        while *n > 0 {
            let left = deadline.saturating_duration_since(Instant::now());
            if left.is_zero() {
                return false;
            }
            n = match self.inner.idle.wait_timeout(n, left) {
                Ok((g, _)) => g,
                Err(p) => p.into_inner().0,
            };
        }
        true
    }

    fn enter(&self) -> Active {
        *self.inner.active.lock().unwrap_or_else(|p| p.into_inner()) += 1;
        Active(self.inner.clone())
    }

    /// Whether [`Shutdown::trigger`] was called.
    pub fn is_triggered(&self) -> bool {
        self.inner.flag.load(Ordering::SeqCst)
    }

    fn register(&self, target: WakeTarget) {
        match self.inner.wake.lock() {
            Ok(mut t) => t.push(target),
            Err(poisoned) => poisoned.into_inner().push(target),
        }
    }
}

/// The egress proxy. Cheap to clone (shared state behind an `Arc`).
#[derive(Clone)]
pub struct Proxy {
    inner: Arc<Inner>,
}

impl std::fmt::Debug for Proxy {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Proxy")
            .field("ids", &self.inner.ids)
            .finish_non_exhaustive()
    }
}

struct Inner {
    policy: Arc<dyn EgressPolicy>,
    resolver: Arc<dyn Resolver>,
    connector: Arc<dyn Connector>,
    approver: Arc<dyn Approver>,
    audit: Arc<dyn Sink>,
    ids: Ids,
    /// The relay's calls in flight, when it tells.
    calls: Option<Arc<dyn CallContext>>,
    /// `host:port` pairs a human allowed for the session.
    session: Mutex<HashSet<(String, u16)>>,
    /// How long a client may take to send its request head (or to finish a
    /// ClientHello it started).
    head_timeout: Duration,
    /// Threads for connections and their client-to-upstream relays.
    pool: Pool,
    /// Secrets kept outside the sandbox, when the policy has any.
    secrets: Option<Arc<SecretsOut>>,
}

/// How long a connection opened for a secret waits, once done, for what the
/// client still sends before it closes, and at most how many bytes it reads.
const LINGER: Duration = Duration::from_secs(2);
const LINGER_BYTES: usize = 64 * 1024;

/// Default time a client has to send its request head.
pub const HEAD_TIMEOUT: Duration = Duration::from_secs(30);

/// A refusal, mapped to a response in one place ([`error_response`]).
struct Refusal {
    status: u16,
    reason: Reason,
    source: Source,
    fault: Fault,
    message: String,
}

impl Refusal {
    fn policy(reason: Reason, source: impl Into<Source>, message: String) -> Self {
        Self {
            status: 403,
            reason,
            source: source.into(),
            fault: Fault::Policy,
            message,
        }
    }
}

/// What is known about one connection; becomes its audit record.
struct Record {
    start: Instant,
    method: Option<String>,
    /// The proxy's own answer (200 for an open tunnel, or the refusal);
    /// `None` for a forwarded request, whose status is the upstream's.
    status: Option<u16>,
    host: Option<String>,
    port: Option<u16>,
    address: Option<SocketAddr>,
    mapped: bool,
    decision: Option<Decision>,
    /// What went wrong after the policy allowed the connection (upstream
    /// failures), or why nothing was decided (the client sent nothing).
    error: Option<Reason>,
    bytes_up: u64,
    bytes_down: u64,
    sni: Option<String>,
    extra: Map<String, Value>,
    /// The proxy's refusal, written to the client after the record.
    reply: Option<Vec<u8>>,
    /// The caller and the tool calls in flight when the connection opened.
    calls: Option<(String, Vec<(String, String)>)>,
}

impl Record {
    fn new() -> Self {
        Self {
            start: Instant::now(),
            method: None,
            status: None,
            host: None,
            port: None,
            address: None,
            mapped: false,
            decision: None,
            error: None,
            bytes_up: 0,
            bytes_down: 0,
            sni: None,
            extra: Map::new(),
            reply: None,
            calls: None,
        }
    }

    fn decide(&mut self, verdict: Verdict, reason: Reason, source: impl Into<Source>) {
        self.decision = Some(Decision::new(verdict, reason, source));
    }
}

/// The header of the proxy's answer to the bridge's `RESOLVE`: the public
/// IPv4 addresses the name resolved to, comma-separated; empty when the
/// bridge is to give the name a synthetic address.
pub const RESOLVED_HEADER: &str = "X-Mcpbox-Addresses";

/// How the request will be carried once admitted.
enum Mode {
    /// CONNECT: answer 200, check the ClientHello, then relay.
    Tunnel,
    /// Plain HTTP: send the rewritten head, then relay the rest.
    Forward { head: Vec<u8> },
    /// The sandbox's resolver asks whether a name may be given an address
    /// (`RESOLVE name`): 200 or the refusal, recorded; nothing connects.
    Resolve,
    /// The bridge reports a packet the sandbox's namespace refused
    /// (`REFUSED address:port`, its protocol in a header): recorded as
    /// denied, nothing connects.
    Refused {
        protocol: String,
        why: Option<String>,
    },
}

impl Proxy {
    /// A proxy over the given policy, resolver, connector, approver and
    /// audit sink, recording under `ids`.
    pub fn new(
        policy: Arc<dyn EgressPolicy>,
        resolver: Arc<dyn Resolver>,
        connector: Arc<dyn Connector>,
        approver: Arc<dyn Approver>,
        audit: Arc<dyn Sink>,
        ids: Ids,
    ) -> Self {
        Self::with_head_timeout(
            policy,
            resolver,
            connector,
            approver,
            audit,
            ids,
            HEAD_TIMEOUT,
        )
    }

    /// As [`Proxy::new`], with the time a client has to send its request head.
    pub fn with_head_timeout(
        policy: Arc<dyn EgressPolicy>,
        resolver: Arc<dyn Resolver>,
        connector: Arc<dyn Connector>,
        approver: Arc<dyn Approver>,
        audit: Arc<dyn Sink>,
        ids: Ids,
        head_timeout: Duration,
    ) -> Self {
        Self {
            inner: Arc::new(Inner {
                policy,
                resolver,
                connector,
                approver,
                audit,
                ids,
                calls: None,
                session: Mutex::new(HashSet::new()),
                head_timeout,
                pool: Pool::new("egress-conn"),
                secrets: None,
            }),
        }
    }

    /// Keeps `secrets` outside the sandbox: connections to their hosts are
    /// opened and their placeholders swapped (intercept.rs). Set before
    /// [`Proxy::serve`].
    pub fn with_secrets(mut self, secrets: Arc<SecretsOut>) -> Self {
        if let Some(inner) = Arc::get_mut(&mut self.inner) {
            inner.secrets = Some(secrets);
        }
        self
    }

    /// Accepts clients on `listener` until `shutdown` fires, one thread per
    /// connection. Returns `Ok` on shutdown; connections already accepted
    /// keep running to completion on their own threads.
    pub fn serve(&self, listener: impl Into<Listener>, shutdown: &Shutdown) -> Result<()> {
        let listener = listener.into();
        if let Some(target) = listener.wake_target().map_err(Error::Listener)? {
            shutdown.register(target);
        }
        loop {
            if shutdown.is_triggered() {
                return Ok(());
            }
            let stream = match listener.accept() {
                Ok(s) => s,
                Err(e) if is_transient(&e) => {
                    tracing::warn!(error = %e, "egress accept failed; retrying");
                    std::thread::sleep(Duration::from_millis(20));
                    continue;
                }
                Err(e) => return Err(Error::Accept(e)),
            };
            if shutdown.is_triggered() {
                return Ok(());
            }
            let proxy = self.clone();
            let active = shutdown.enter();
            if let Err(e) = self.inner.pool.run(move || {
                proxy.handle(stream);
                drop(active);
            }) {
                tracing::warn!(error = %e, "egress could not start a connection thread; dropping it");
            }
        }
    }

    /// Ties each connection's record to the tool calls in flight when it
    /// opened, and names their caller. Before the proxy is shared (right
    /// after [`Proxy::new`]); later it changes nothing.
    pub fn with_calls(mut self, calls: Arc<dyn CallContext>) -> Self {
        if let Some(inner) = Arc::get_mut(&mut self.inner) {
            inner.calls = Some(calls);
        }
        self
    }

    /// Handles one client connection to completion and records it. `serve`
    /// calls this on a fresh thread; it is public for callers that accept
    /// connections themselves.
    pub fn handle(&self, mut client: ClientStream) {
        let mut rec = Record::new();
        rec.calls = self.inner.calls.as_ref().map(|c| c.current());
        self.handle_inner(&mut client, &mut rec);
        match rec.reply.take() {
            Some(reply) => {
                // A refusal is recorded before the client reads it: a
                // client that exits on its 403 (and mcpbox, ending with the
                // sandbox) cannot outrun the record of what it was refused.
                self.emit(rec);
                let _ = client.write_all(&reply);
                client.shutdown_socket(How::Both);
            }
            None => {
                client.shutdown_socket(How::Both);
                self.emit(rec);
            }
        }
    }

    fn handle_inner(&self, client: &mut ClientStream, rec: &mut Record) {
        let _ = client.read_timeout(Some(self.inner.head_timeout));
        let mut buf = Vec::new();
        let parsed = http::read_head(client, &mut buf).and_then(|n| {
            let head = http::parse_head(&buf[..n])?;
            rec.method = Some(head.method.clone());
            if head.method == crate::bridge::RESOLVE_METHOD {
                // The bridge's resolver asking about a name (no port).
                let (host, _) = http::parse_authority(&head.target, 0)?;
                Ok((host, 0, Mode::Resolve, None, n))
            } else if head.method == crate::bridge::REFUSED_METHOD {
                let (host, port) = http::parse_authority(&head.target, 0)?;
                // The bridge writes a few fixed words (nflog.rs, dns.rs);
                // anything else is kept to a bounded, plain spelling (a
                // sandboxed program can reach this socket too).
                let plain = |name: &str, max: usize| {
                    head.headers
                        .iter()
                        .find(|(k, _)| k.eq_ignore_ascii_case(name))
                        .map(|(_, v)| {
                            v.chars()
                                .filter(|c| c.is_ascii_alphanumeric() || " -().".contains(*c))
                                .take(max)
                                .collect::<String>()
                        })
                };
                let protocol =
                    plain(crate::bridge::PROTOCOL_HEADER, 16).unwrap_or_else(|| "unknown".into());
                let why = plain(crate::bridge::WHY_HEADER, 80);
                Ok((host, port, Mode::Refused { protocol, why }, None, n))
            } else if head.method == "CONNECT" {
                let (host, port) = http::parse_authority(&head.target, 443)?;
                Ok((host, port, Mode::Tunnel, None, n))
            } else {
                let fwd = http::rewrite_absolute(&head)?;
                Ok((
                    fwd.host,
                    fwd.port,
                    Mode::Forward { head: fwd.head },
                    Some(fwd.path),
                    n,
                ))
            }
        });
        let (host, port, mode, path, head_len) = match parsed {
            Ok(p) => p,
            Err(HeadError::Empty) => {
                rec.error = Some(Reason::RequestEmpty);
                return;
            }
            Err(e) => {
                let reason = match e {
                    HeadError::Read(_) => Reason::RequestReadFailed,
                    _ => Reason::RequestMalformed,
                };
                let r = Refusal {
                    status: 400,
                    reason,
                    source: Source::Egress("parser"),
                    fault: Fault::Client,
                    message: format!(
                        "the client's request was refused before any policy check: {e}"
                    ),
                };
                self.refuse(rec, &r, None);
                return;
            }
        };
        let leftover = buf[head_len..].to_vec();
        drop(buf);
        let name = host.policy_form();
        rec.host = Some(name.clone());
        if let Mode::Resolve = mode {
            self.resolve_name(&host, rec);
            return;
        }
        rec.port = Some(port);
        if let Mode::Refused { protocol, why } = mode {
            // Recorded as the refusal it was; the answer only says so. A
            // query the sandbox's resolver refused is an invalid name; any
            // other report is a packet the capture does not carry.
            let (reason, source) = if protocol == "dns" {
                (Reason::NetworkInvalidHost, Source::Egress("resolver"))
            } else {
                (Reason::NetworkNotCarried, Source::Egress("capture"))
            };
            rec.extra.insert("protocol".into(), protocol.clone().into());
            if let Some(w) = why {
                rec.extra.insert("why".into(), w.into());
            }
            rec.decide(Verdict::Deny, reason, source);
            tracing::warn!(%reason, %protocol, "egress refused what the sandbox sent (`mcpbox audit --kind network` says what)");
            rec.reply = Some(b"HTTP/1.1 200 Recorded\r\nContent-Length: 0\r\n\r\n".to_vec());
            return;
        }
        if let Some(eco) = registry_for_host(&name) {
            rec.extra.insert("registry".into(), eco.as_str().into());
            match &path {
                Some(p) => {
                    if let Some(pkg) = parse_package(&name, p) {
                        rec.extra.insert("package".into(), pkg.to_json());
                    }
                }
                None => {
                    rec.extra.insert(
                        "package_note".into(),
                        "tls tunnel: only the registry host is known, not the package".into(),
                    );
                }
            }
        }

        let upstream = match self.admit(&host, port, rec) {
            Ok(s) => s,
            Err(r) => {
                let display = format!("{}:{port}", host.authority_form());
                self.refuse(rec, &r, Some(&display));
                return;
            }
        };
        let _ = client.read_timeout(None);
        // A host some secret is for: the connection is opened (its value
        // put in, the responses scrubbed) instead of tunnelled or forwarded.
        let opened = self
            .inner
            .secrets
            .as_ref()
            .filter(|out| out.swaps().intercepts(&name, port))
            .cloned();
        if let (None, Some(out), Mode::Forward { head }) = (&opened, &self.inner.secrets, &mode) {
            // Plain HTTP to a host no secret is for: a placeholder in its
            // head goes as it is (useless there) and is recorded.
            let elsewhere = out.swaps().placeholders_in(head);
            if !elsewhere.is_empty() {
                note_elsewhere(rec, &elsewhere);
            }
        }
        match mode {
            Mode::Tunnel => {
                if client.write_all(CONNECT_OK).is_err() {
                    rec.error = Some(Reason::ClientGone);
                    upstream.shutdown_socket(How::Both);
                    return;
                }
                rec.status = Some(200);
                match opened {
                    Some(out) => {
                        let target = Target { host, port };
                        self.open(client, leftover, upstream, &target, &out, rec, true);
                    }
                    None => self.relay(client, upstream, leftover, Some(host), false, rec),
                }
            }
            Mode::Forward { head } => {
                let mut first = head;
                first.extend_from_slice(&leftover);
                match opened {
                    Some(out) => {
                        let target = Target { host, port };
                        self.open(client, first, upstream, &target, &out, rec, false);
                    }
                    None => self.relay(client, upstream, first, None, true, rec),
                }
            }
            // Answered before admit.
            Mode::Resolve | Mode::Refused { .. } => upstream.shutdown_socket(How::Both),
        }
    }

    /// Steps 2 to 5 of the check sequence; returns a connected upstream.
    fn admit(&self, host: &Host, port: u16, rec: &mut Record) -> Result<TcpStream, Refusal> {
        let name = host.policy_form();
        let guard = Source::Egress("address_guard");
        if let Host::Name(n) = host {
            if is_metadata_name(n) {
                return Err(Refusal::policy(
                    Reason::NetworkMetadataEndpoint,
                    guard,
                    format!("{n} is a cloud metadata service name, never reachable from a sandbox"),
                ));
            }
        }

        let decision = self.inner.policy.decide(&name, port);
        match decision.verdict {
            Verdict::Allow => rec.decision = Some(decision),
            Verdict::Deny if decision.reason == Reason::NetworkLocalUnlisted => {
                // Said in full: the server sees a bare refusal otherwise,
                // and the fix is one line of the policy.
                return Err(Refusal::policy(
                    decision.reason,
                    decision.source.clone(),
                    format!(
                        "{name}:{port} is the machine mcpbox runs on, and no network.local entry opens port {port}; to let the server reach a service there, add [network] local = [\"localhost:{port}\"] to the policy"
                    ),
                ));
            }
            Verdict::Deny => {
                return Err(Refusal::policy(
                    decision.reason,
                    decision.source.clone(),
                    format!("the network policy does not allow {name}:{port}"),
                ))
            }
            Verdict::Approve => {
                let source = decision.source;
                rec.extra.insert("asked_by".into(), source.clone().into());
                let key = (name.clone(), port);
                let remembered = self.session_contains(&key);
                if remembered {
                    rec.decide(
                        Verdict::Approve,
                        Reason::NetworkApprovedSession,
                        Source::Approval(Some("session".into())),
                    );
                } else {
                    let answer = self.inner.approver.ask(&name, port);
                    rec.extra
                        .insert("answer".into(), answer.reason().as_str().into());
                    match answer {
                        NetworkAnswer::Once => rec.decide(
                            Verdict::Approve,
                            Reason::NetworkApprovedOnce,
                            Source::Approval(None),
                        ),
                        NetworkAnswer::Session => {
                            self.session_insert(key);
                            rec.decide(
                                Verdict::Approve,
                                Reason::NetworkApprovedSession,
                                Source::Approval(None),
                            )
                        }
                        NetworkAnswer::Denied
                        | NetworkAnswer::Declined
                        | NetworkAnswer::Timeout
                        | NetworkAnswer::Unavailable => {
                            return Err(Refusal::policy(
                                Reason::NetworkApprovalDenied,
                                Source::Approval(None),
                                format!(
                                "{name}:{port} is not listed and the approval was not given ({})",
                                answer.reason()
                            ),
                            ))
                        }
                    }
                }
            }
        }

        let candidates: Vec<SocketAddr> = if let Some(ips) =
            self.inner.policy.local_addresses(&name, port)
        {
            // `network.local`: this port of the host's own loopback, and
            // nothing else; an address that is not loopback is refused
            // whatever the policy implementation said.
            rec.extra.insert("local".into(), true.into());
            if let Some(ip) = ips
                .iter()
                .find(|ip| classify(**ip) != Some(crate::addr::AddressClass::Loopback))
            {
                return Err(Refusal::policy(
                    Reason::NetworkReservedAddress,
                    guard,
                    format!("network.local named {ip}, which is not a loopback address"),
                ));
            }
            ips.into_iter()
                .map(|ip| SocketAddr::new(ip, port))
                .collect()
        } else if let Some(ip) = self.inner.policy.mapped_address(&name) {
            rec.mapped = true;
            if let Some(class) = classify(ip).filter(|c| !c.allowed_for_mapping()) {
                return Err(Refusal::policy(
                    class.reason(),
                    guard,
                    format!("the mapping of {name} points at {ip}, {}", class.describe()),
                ));
            }
            vec![SocketAddr::new(ip, port)]
        } else {
            let addrs: Vec<IpAddr> = match host {
                Host::Ip(ip) => vec![*ip],
                Host::Name(n) => match self.inner.resolver.resolve(n, port) {
                    Ok(a) if !a.is_empty() => a.into_iter().map(|s| s.ip()).collect(),
                    Ok(_) => return Err(resolve_failed(n, "no addresses")),
                    Err(e) => return Err(resolve_failed(n, &e.to_string())),
                },
            };
            if let Some((ip, class)) = addrs.iter().find_map(|ip| classify(*ip).map(|c| (*ip, c))) {
                rec.address = Some(SocketAddr::new(ip, port));
                let fix = if class == crate::addr::AddressClass::Loopback {
                    format!("a service on the machine mcpbox runs on is opened with [network] local = [\"localhost:{port}\"]")
                } else {
                    "an internal service needs an explicit [network.hosts] mapping".to_string()
                };
                return Err(Refusal::policy(
                    class.reason(),
                    guard,
                    format!(
                        "{name} resolved to {ip}, {}; allowed names may only reach public addresses ({fix})",
                        class.describe()
                    ),
                ));
            }
            addrs
                .into_iter()
                .map(|ip| SocketAddr::new(ip, port))
                .collect()
        };

        let mut last = None;
        for addr in candidates {
            rec.address = Some(addr);
            match self.inner.connector.connect(addr) {
                Ok(s) => return Ok(s),
                Err(e) => last = Some(format!("{addr}: {e}")),
            }
        }
        Err(Refusal {
            status: 502,
            reason: Reason::UpstreamConnectFailed,
            source: Source::Egress("connect"),
            fault: Fault::Upstream,
            message: format!(
                "the upstream server {name}:{port} could not be reached ({}); the fault is on the upstream side, not the client's or mcpbox's",
                last.unwrap_or_default()
            ),
        })
    }

    /// Answers the bridge's resolver (ARCHITECTURE.md, "Transparent
    /// egress"). A name the policy refuses on every port gets the refusal a
    /// connection would get, recorded. A name it allows is resolved here,
    /// on the host, and the answer carries its public IPv4 addresses
    /// ([`RESOLVED_HEADER`]), so that a program's own checks see what it
    /// would see without mcpbox (mcp-server-fetch refuses a name whose
    /// address is not public); a name that resolves to any address that is
    /// not public is refused as its connection would be. A name with a
    /// `[network.hosts]` mapping, one that only a human can allow (nothing
    /// leaves the host before they agree: a lookup is itself a message to
    /// whoever runs the name's DNS), or one with no IPv4 address gets a 200
    /// without addresses: the bridge gives it a synthetic address. An
    /// allowed answer leaves no record; the connection that follows has one.
    fn resolve_name(&self, host: &Host, rec: &mut Record) {
        let n = match host {
            Host::Ip(ip) => {
                let r = Refusal::policy(
                    Reason::NetworkInvalidHost,
                    Source::Egress("resolver"),
                    format!("{ip} is an address, not a name to resolve"),
                );
                return self.refuse(rec, &r, Some(&host.authority_form()));
            }
            Host::Name(n) => n,
        };
        match self.resolvable(n) {
            Ok(addrs) => {
                // No host and no decision: `emit` writes no record.
                rec.host = None;
                let list: Vec<String> = addrs.iter().map(ToString::to_string).collect();
                rec.reply = Some(
                    format!(
                        "HTTP/1.1 200 Resolvable\r\n{RESOLVED_HEADER}: {}\r\nContent-Length: 0\r\n\r\n",
                        list.join(",")
                    )
                    .into_bytes(),
                );
            }
            Err(r) => self.refuse(rec, &r, Some(&host.authority_form())),
        }
    }

    /// The public IPv4 addresses to give the sandbox for `name` (empty: a
    /// synthetic one), or why the name is refused.
    fn resolvable(&self, name: &str) -> Result<Vec<std::net::Ipv4Addr>, Refusal> {
        let guard = Source::Egress("address_guard");
        if is_metadata_name(name) {
            return Err(Refusal::policy(
                Reason::NetworkMetadataEndpoint,
                guard,
                format!("{name} is a cloud metadata service name, never reachable from a sandbox"),
            ));
        }
        let decision = self.inner.policy.decide_name(name);
        match decision.verdict {
            Verdict::Deny => {
                return Err(Refusal::policy(
                    decision.reason,
                    decision.source.clone(),
                    format!("the network policy does not allow {name} on any port, so the sandbox's resolver does not know it"),
                ))
            }
            Verdict::Approve => return Ok(Vec::new()),
            Verdict::Allow => {}
        }
        if self.inner.policy.mapped_address(name).is_some() {
            return Ok(Vec::new());
        }
        let addrs = self
            .inner
            .resolver
            .resolve(name, 0)
            .map_err(|e| resolve_failed(name, &e.to_string()))?;
        if addrs.is_empty() {
            return Err(resolve_failed(name, "no addresses"));
        }
        // The same refusal its connection would get (`admit`), and for
        // the same reason: a name that points inside is never handed out.
        if let Some((ip, class)) = addrs
            .iter()
            .find_map(|a| classify(a.ip()).map(|c| (a.ip(), c)))
        {
            return Err(Refusal::policy(
                class.reason(),
                guard,
                format!(
                    "{name} resolved to {ip}, {}; allowed names may only reach public addresses (an internal service needs an explicit [network.hosts] mapping)",
                    class.describe()
                ),
            ));
        }
        let mut v4: Vec<std::net::Ipv4Addr> = Vec::new();
        for a in &addrs {
            if let std::net::IpAddr::V4(ip) = a.ip() {
                if !v4.contains(&ip) && v4.len() < crate::dns::MAX_ANSWERS {
                    v4.push(ip);
                }
            }
        }
        Ok(v4)
    }

    fn session_contains(&self, key: &(String, u16)) -> bool {
        match self.inner.session.lock() {
            Ok(s) => s.contains(key),
            Err(p) => p.into_inner().contains(key),
        }
    }

    fn session_insert(&self, key: (String, u16)) {
        match self.inner.session.lock() {
            Ok(mut s) => s.insert(key),
            Err(p) => p.into_inner().insert(key),
        };
    }

    /// Records a refusal and keeps its response for [`Proxy::handle`],
    /// which writes it once the record is out.
    fn refuse(&self, rec: &mut Record, r: &Refusal, target: Option<&str>) {
        let body = match target {
            Some(t) => format!(
                "mcpbox egress: {t} refused by {} (reason {}): {}",
                r.source, r.reason, r.message
            ),
            None => format!(
                "mcpbox egress: refused by {} (reason {}): {}",
                r.source, r.reason, r.message
            ),
        };
        rec.reply = Some(error_response(
            r.status,
            r.reason.as_str(),
            &r.source.to_string(),
            r.fault,
            &body,
        ));
        rec.status = Some(r.status);
        if r.status == 403 || r.status == 400 {
            rec.decide(Verdict::Deny, r.reason, r.source.clone());
            // On stderr by default (it used to reach only the audit and a
            // response header most servers drop), without the host: a
            // server can write a secret into the name it asks for; the
            // audit record has it.
            if r.reason == Reason::NetworkLocalUnlisted {
                // The fix is known and names no host: say it where the
                // user looks, not only in a 403 body the server may drop.
                tracing::warn!(reason = %r.reason, source = %r.source, "egress refused a connection to this machine's loopback: add its port to `[network] local` (e.g. local = [\"localhost:PORT\"]); `mcpbox audit --kind network` names the port");
            } else {
                tracing::warn!(reason = %r.reason, source = %r.source, "egress refused a connection (`mcpbox audit --kind network` names the host)");
            }
        } else {
            // The policy allowed it; the failure is recorded beside that.
            rec.error = Some(r.reason);
            tracing::debug!(status = r.status, reason = %r.reason, source = %r.source, "egress connection failed");
        }
    }

    /// Relays both ways: this thread carries upstream→client, one extra
    /// thread carries client→upstream, each through one fixed buffer. For a
    /// tunnel (`sni_host` set) the first client bytes are checked as a TLS
    /// ClientHello before anything goes upstream.
    fn relay(
        &self,
        client: &mut ClientStream,
        upstream: TcpStream,
        first: Vec<u8>,
        sni_host: Option<Host>,
        close_after_down: bool,
        rec: &mut Record,
    ) {
        let (mut c_read, mut u_write) = match (client.clone_socket(), upstream.clone_socket()) {
            (Ok(c), Ok(u)) => (c, u),
            _ => {
                rec.error = Some(Reason::McpboxCloneFailed);
                upstream.shutdown_socket(How::Both);
                return;
            }
        };
        let head_timeout = self.inner.head_timeout;
        let (done_tx, done_rx) = std::sync::mpsc::sync_channel::<UpResult>(1);
        let spawned = self.inner.pool.run(move || {
            let mut up = UpResult::default();
            let mut buf = Vec::new();
            let res = (|| -> io::Result<()> {
                let first = match &sni_host {
                    Some(h) => match gate(&mut c_read, first, h, head_timeout, &mut up)? {
                        Some(bytes) => {
                            c_read.read_timeout(None)?;
                            bytes
                        }
                        None => {
                            // Refused: tell the TLS client, then close both.
                            let _ = c_read.write_all(ALERT_ACCESS_DENIED);
                            c_read.shutdown_socket(How::Both);
                            u_write.shutdown_socket(How::Both);
                            return Ok(());
                        }
                    },
                    None => first,
                };
                u_write.write_all(&first)?;
                up.bytes += first.len() as u64;
                pump(&mut c_read, &mut u_write, &mut buf, &mut up.bytes)
            })();
            match res {
                Ok(()) => u_write.shutdown_socket(How::Write),
                Err(_) => {
                    c_read.shutdown_socket(How::Both);
                    u_write.shutdown_socket(How::Both);
                }
            }
            let _ = done_tx.send(up);
        });
        if let Err(e) = spawned {
            tracing::warn!(error = %e, "egress could not start a relay thread");
            rec.error = Some(Reason::McpboxThreadSpawnFailed);
            upstream.shutdown_socket(How::Both);
            return;
        }
        let mut u_read = upstream;
        let mut buf = Vec::new();
        let mut down = 0u64;
        match pump(&mut u_read, client, &mut buf, &mut down) {
            Ok(()) if !close_after_down => client.shutdown_socket(How::Write),
            _ => {
                // Plain HTTP is one request per connection: when the upstream
                // is done, so is the client. Errors close both ends.
                client.shutdown_socket(How::Both);
                u_read.shutdown_socket(How::Both);
            }
        }
        let up = done_rx.recv().unwrap_or_default();
        rec.bytes_up = up.bytes;
        rec.bytes_down = down;
        rec.sni = up.sni;
        if let Some((reason, message)) = up.refused {
            rec.status = Some(403);
            rec.decide(Verdict::Deny, reason, Source::Egress("sni_check"));
            rec.extra.insert("refusal".into(), message.into());
        }
    }

    /// A connection opened to put a secret in: TLS on both sides (`tls`,
    /// a CONNECT) or plain HTTP (`first` is the rewritten head), then the
    /// exchanges; what went through and any refusal go to the record.
    #[allow(clippy::too_many_arguments)]
    fn open(
        &self,
        client: &mut ClientStream,
        first: Vec<u8>,
        upstream: TcpStream,
        target: &Target,
        out: &SecretsOut,
        rec: &mut Record,
        tls: bool,
    ) {
        let mut done = Exchanged::default();
        // a keep-alive connection waits at most this long for its next request
        let _ = client.read_timeout(Some(self.inner.head_timeout));
        let result = if tls {
            intercept::intercept(client, first, upstream, target, out, &mut done)
        } else {
            let mut prefixed = Prefixed::new(first, &mut *client);
            exchange::relay(&mut prefixed, &upstream, target, &out.swaps(), &mut done)
                .map_err(InterceptError::from)
        };
        // A lingering close (RFC 9112 §9.6): our side ends first, then
        // what the client still sends (its TLS close_notify) is read and
        // dropped, bounded in bytes and time, before the socket goes. Closing
        // both ways at once made the bridge's write of that close_notify
        // fail (EPIPE), and the in-sandbox bridge stopped with it.
        client.shutdown_socket(How::Write);
        let _ = client.read_timeout(Some(LINGER));
        let mut sink = [0u8; 4096];
        let mut left = LINGER_BYTES;
        while left > 0 {
            match client.read(&mut sink) {
                Ok(0) | Err(_) => break,
                Ok(n) => left = left.saturating_sub(n),
            }
        }
        client.shutdown_socket(How::Both);
        rec.bytes_up = done.bytes_up;
        rec.bytes_down = done.bytes_down;
        let list = |set: &std::collections::BTreeSet<String>| {
            Value::Array(set.iter().map(|n| Value::from(n.as_str())).collect())
        };
        rec.extra.insert(
            "secrets".into(),
            json!({
                "opened": if done.tls { "tls" } else { "http" },
                "requests": done.requests,
                "secrets_added": list(&done.added),
                "scrubbed_from_responses": list(&done.scrubbed),
            }),
        );
        if !done.elsewhere.is_empty() {
            let names: Vec<String> = done.elsewhere.iter().cloned().collect();
            note_elsewhere(rec, &names);
        }
        let Err(e) = result else {
            return;
        };
        let reason = match &e {
            InterceptError::SniMismatch { .. } => {
                rec.decide(
                    Verdict::Deny,
                    Reason::NetworkSniMismatch,
                    Source::Egress("sni_check"),
                );
                Reason::NetworkSniMismatch
            }
            InterceptError::ClientHandshake(_) => Reason::SecretTlsFailed,
            InterceptError::UpstreamHandshake(_) => Reason::UpstreamTlsFailed,
            InterceptError::Exchange(ExchangeError::Request(_))
            | InterceptError::Exchange(ExchangeError::Misdirected { .. }) => {
                Reason::SecretRequestRefused
            }
            InterceptError::Exchange(ExchangeError::Response(_)) => Reason::SecretResponseRefused,
            InterceptError::Exchange(ExchangeError::Client(_)) => Reason::ClientGone,
            InterceptError::Exchange(ExchangeError::Upstream(_)) => Reason::UpstreamConnectFailed,
            InterceptError::Certificate(_)
            | InterceptError::CaFile { .. }
            | InterceptError::Config(_) => Reason::UpstreamTlsFailed,
        };
        tracing::warn!(%reason, error = %e, host = %target.host.policy_form(), "egress: a connection opened for a secret ended on a refusal or failure");
        rec.error = Some(reason);
        rec.extra.insert(
            "refusal".into(),
            e.to_string().chars().take(300).collect::<String>().into(),
        );
    }

    fn emit(&self, rec: Record) {
        let duration = rec.start.elapsed();
        let mut detail = rec.extra;
        detail.insert("host".into(), json!(rec.host));
        detail.insert("port".into(), json!(rec.port));
        detail.insert("method".into(), json!(rec.method));
        detail.insert("address".into(), json!(rec.address.map(|a| a.to_string())));
        detail.insert("mapped".into(), json!(rec.mapped));
        detail.insert("status".into(), json!(rec.status));
        detail.insert("bytes_up".into(), json!(rec.bytes_up));
        detail.insert("bytes_down".into(), json!(rec.bytes_down));
        detail.insert(
            "duration_us".into(),
            json!(u64::try_from(duration.as_micros()).unwrap_or(u64::MAX)),
        );
        if let Some(e) = rec.error {
            detail.insert("error".into(), e.as_str().into());
        }
        if let Some(s) = rec.sni {
            detail.insert("sni".into(), s.into());
        }
        let mut caller = String::new();
        if let Some((who, calls)) = rec.calls {
            caller = who;
            let list: Vec<Value> = calls
                .into_iter()
                .map(|(call, tool)| json!({"call": call, "tool": tool}))
                .collect();
            detail.insert("calls".into(), Value::Array(list));
        }
        if rec.decision.is_none() && rec.host.is_none() {
            // A connection that never sent a request: nothing to record.
            return;
        }
        let ids = &self.inner.ids;
        let (decision, reason, source) = match rec.decision {
            Some(d) => (
                Some(d.verdict),
                Some(d.reason.as_str().to_string()),
                Some(d.source.to_string()),
            ),
            None => (None, None, None),
        };
        self.inner.audit.record(Event {
            kind: Some(Kind::Network),
            sandbox_id: ids.sandbox_id.clone(),
            workspace_id: ids.workspace_id.clone(),
            server: ids.server.clone(),
            caller,
            decision,
            reason,
            source,
            duration_ms: Some(u64::try_from(duration.as_millis()).unwrap_or(u64::MAX)),
            detail: Value::Object(detail),
            ..Event::default()
        });
    }
}

/// Records that placeholders of `names` were sent to a host they are not
/// for (they went as they were).
fn note_elsewhere(rec: &mut Record, names: &[String]) {
    tracing::warn!(secrets = ?names, host = ?rec.host, "egress: a secret's placeholder was sent to a host it is not for (it went as the placeholder)");
    rec.extra
        .insert("placeholder_elsewhere".into(), json!(names));
    if rec.error.is_none() {
        rec.error = Some(Reason::SecretPlaceholderElsewhere);
    }
}

#[derive(Default)]
struct UpResult {
    bytes: u64,
    sni: Option<String>,
    refused: Option<(Reason, String)>,
}

/// Reads the first client bytes of a tunnel until they are known to be a
/// complete ClientHello or not TLS at all. `Ok(Some(bytes))`: forward them
/// and carry on; `Ok(None)`: refused (recorded in `up`).
fn gate(
    client: &mut ClientStream,
    mut first: Vec<u8>,
    host: &Host,
    head_timeout: Duration,
    up: &mut UpResult,
) -> io::Result<Option<Vec<u8>>> {
    let mut chunk = vec![0u8; 16 * 1024];
    loop {
        match tls::inspect(&first) {
            Hello::NotTls => return Ok(Some(first)),
            Hello::ClientHello { sni } => {
                up.sni = sni.clone();
                let want = host.policy_form();
                return Ok(match sni {
                    Some(s) if !matches!(host, Host::Name(n) if *n == s) => {
                        up.refused = Some((
                            Reason::NetworkSniMismatch,
                            format!("tls server name {s} differs from the CONNECT host {want} (domain fronting)"),
                        ));
                        None
                    }
                    _ => Some(first),
                });
            }
            Hello::Malformed(why) => {
                up.refused = Some((
                    Reason::NetworkTlsMalformed,
                    format!("unreadable tls client hello: {why}"),
                ));
                return Ok(None);
            }
            Hello::Incomplete => {}
        }
        if first.len() >= tls::MAX_HELLO {
            up.refused = Some((
                Reason::NetworkTlsMalformed,
                "tls client hello too large".into(),
            ));
            return Ok(None);
        }
        // A silent client may be waiting for a server-first protocol: no
        // timeout until it has started a TLS record, then the head timeout.
        client.read_timeout(if first.is_empty() {
            None
        } else {
            Some(head_timeout)
        })?;
        let n = loop {
            match std::io::Read::read(client, &mut chunk) {
                Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
                other => break other?,
            }
        };
        if n == 0 {
            if first.is_empty() {
                return Ok(Some(first)); // closed without a byte: nothing to check
            }
            up.refused = Some((
                Reason::NetworkTlsMalformed,
                "client closed inside its tls client hello".into(),
            ));
            return Ok(None);
        }
        first.extend_from_slice(&chunk[..n]);
    }
}

fn resolve_failed(name: &str, why: &str) -> Refusal {
    Refusal {
        status: 502,
        reason: Reason::UpstreamResolveFailed,
        source: Source::Egress("resolver"),
        fault: Fault::Upstream,
        message: format!(
            "{name} could not be resolved ({why}); the fault is on the upstream (dns) side"
        ),
    }
}

fn is_transient(e: &io::Error) -> bool {
    matches!(
        e.kind(),
        io::ErrorKind::ConnectionAborted
            | io::ErrorKind::ConnectionReset
            | io::ErrorKind::Interrupted
            | io::ErrorKind::WouldBlock
            | io::ErrorKind::TimedOut
            | io::ErrorKind::OutOfMemory
    ) || matches!(e.raw_os_error(), Some(23 | 24 | 105)) // ENFILE, EMFILE, ENOBUFS
}
