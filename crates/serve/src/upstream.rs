//! Remote upstreams: a [`Launcher`] whose "server process" is a Streamable
//! HTTP MCP client of a remote server (`url = "https://..."` in the serve
//! config, placement "outside": no sandbox).
//!
//! The relay sees what it sees of any server: a stdin it writes JSON-RPC
//! lines to, a stdout it reads lines from, a stderr it reads log lines
//! from (and redacts, as for any server), and a [`ProcessControl`]. Each
//! is one end of a unix socket pair; the other ends belong to one task on
//! the tokio runtime given to [`RemoteLauncher::new`], never the relay's
//! thread. That task:
//!
//! - POSTs every line to the URL, one JSON-RPC message each (`Accept:
//!   application/json, text/event-stream`, `Content-Type:
//!   application/json`), with the `Mcp-Session-Id` the upstream gave in
//!   its answer to `initialize` and, from then on, `MCP-Protocol-Version`;
//!   `initialize` is answered before the next line is read, everything
//!   after it runs concurrently;
//! - writes each answer to stdout as one line: a JSON body, or every
//!   `data:` event of an SSE body. Only bodies cross: the upstream's
//!   response headers (cookies, its own tokens) never reach the relay, so
//!   never the client. A request the upstream refuses (HTTP 4xx/5xx, or no
//!   connection) is answered with a JSON-RPC error naming the status; the
//!   body, if it is not a JSON-RPC error for that request, goes to stderr;
//! - opens a GET stream for the upstream's own messages once the session
//!   is initialized (405: the upstream offers none, which is fine);
//! - adds the policy's `[upstream]` header (the credential, rendered from
//!   the secrets the relay passes to [`Launcher::launch`]) to every
//!   request, marked sensitive. Nothing of the client's request but the
//!   JSON-RPC body reaches the upstream: the client's own `Authorization`
//!   is for the gateway only;
//! - connects only to an address the caller's [`AddressGuard`] accepts,
//!   resolved for every new connection (the check and the connect use the
//!   same address), or to the fixed address of a `[network.hosts]` entry.
//!
//! End: stdin closed (the relay's first stop step) waits for the answers
//! in flight, then DELETEs the upstream session; terminate does the DELETE
//! at once; kill drops everything (the DELETE is still tried, detached).
//! An upstream that forgets the session (404 to a request carrying it) ends
//! the "process", so the relay ends the client's session too.

use std::future::Future;
use std::io;
use std::net::{IpAddr, SocketAddr, ToSocketAddrs};
use std::os::unix::net::UnixStream as StdUnix;
use std::path::Path;
use std::pin::Pin;
use std::sync::{Arc, Condvar, Mutex};
use std::task::{Context, Poll};
use std::time::Duration;

use bytes::{Bytes, BytesMut};
use http_body_util::{BodyExt, Full};
use hyper::body::Incoming;
use hyper::header::{HeaderName, HeaderValue, ACCEPT, CONTENT_TYPE};
use hyper::{Method, Request, Response, StatusCode, Uri};
use hyper_util::client::legacy::connect::{Connected, Connection};
use hyper_util::client::legacy::Client;
use hyper_util::rt::{TokioExecutor, TokioIo, TokioTimer};
use mcpbox_gateway::{ExitInfo, Launcher, ProcessControl, ServerProcess};
use mcpbox_policy::UpstreamSettings;
use rustls::pki_types::ServerName;
use serde_json::Value;
use tokio::io::{AsyncBufReadExt, AsyncRead, AsyncWrite, AsyncWriteExt, BufReader, ReadBuf};
use tokio::net::TcpStream;
use tokio::sync::{mpsc, watch, Notify, OwnedSemaphorePermit, Semaphore};
use tokio::task::JoinSet;

/// Decides whether an address the upstream's name resolved to may be
/// reached: `Err` says why not ("a private network address").
pub type AddressGuard = Arc<dyn Fn(IpAddr) -> Result<(), String> + Send + Sync>;

/// Time to connect (TCP and TLS) to the upstream.
pub const CONNECT_TIMEOUT: Duration = Duration::from_secs(10);
/// Time the DELETE of the upstream session may take at the end.
pub const DELETE_TIMEOUT: Duration = Duration::from_secs(5);
/// Largest answer body (or one SSE event) taken from the upstream; the
/// relay refuses lines above the policy's `max_line` anyway.
pub const MAX_ANSWER: usize = 64 << 20;
/// How much of a refusal's body goes to the log.
const LOG_SNIPPET: usize = 512;
/// Bytes of the upstream's messages waiting for the relay, per session;
/// past it the upstream is read no further until the relay takes them.
/// A message larger than this (up to [`MAX_ANSWER`]) waits for all of it.
pub const UPSTREAM_BUFFER: usize = 16 << 20;
/// JSON-RPC error code for "the upstream did not answer this request".
pub const CODE_UPSTREAM: i64 = -32603;

/// Why a remote upstream cannot be set up.
#[derive(Debug, thiserror::Error)]
pub enum UpstreamError {
    /// The URL is not an absolute http(s) URL.
    #[error("url \"{url}\": {why}")]
    Url {
        /// The URL as written.
        url: String,
        /// What is wrong with it.
        why: String,
    },
    /// The TLS client could not be configured.
    #[error(transparent)]
    Tls(#[from] crate::tls::TlsError),
}

/// One remote MCP server: where it is, how to reach it, what to add.
pub struct Remote {
    url: Uri,
    host: String,
    port: u16,
    tls: Option<(tokio_rustls::TlsConnector, ServerName<'static>)>,
    fixed: Option<IpAddr>,
    guard: AddressGuard,
    credential: UpstreamSettings,
}

impl std::fmt::Debug for Remote {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Remote")
            .field("url", &self.url)
            .field("fixed", &self.fixed)
            .finish_non_exhaustive()
    }
}

impl Remote {
    /// The upstream's URL, as configured (for its pins' identity).
    pub fn url(&self) -> String {
        self.url.to_string()
    }

    /// A remote server at `url` (`https://`, or `http://`): `credential`
    /// is the policy's `[upstream]`, `ca_file` the roots that verify an
    /// https upstream ([`crate::tls::SYSTEM_CA_FILE`]), `fixed` the address
    /// of a `[network.hosts]` mapping (connected to without resolving),
    /// `guard` the check every resolved address passes.
    pub fn new(
        url: &str,
        credential: UpstreamSettings,
        ca_file: &Path,
        fixed: Option<IpAddr>,
        guard: AddressGuard,
    ) -> Result<Remote, UpstreamError> {
        let (uri, https, host, port) = parse_url(url)?;
        let bad = |why: &str| UpstreamError::Url {
            url: url.to_string(),
            why: why.to_string(),
        };
        let tls = if https {
            let config = crate::tls::client_config(ca_file)?;
            let name = ServerName::try_from(host.clone())
                .map_err(|_| bad("host is not a valid TLS server name"))?;
            Some((tokio_rustls::TlsConnector::from(config), name))
        } else {
            None
        };
        Ok(Remote {
            url: uri,
            host,
            port,
            tls,
            fixed,
            guard,
            credential,
        })
    }

    /// The host, lowercase, without brackets.
    pub fn host(&self) -> &str {
        &self.host
    }

    /// The port (the scheme's default when the URL names none).
    pub fn port(&self) -> u16 {
        self.port
    }

    /// Resolves the host now (blocking) and returns the address a
    /// connection would use, or why there is none: the check at start.
    pub fn check_address(&self) -> Result<SocketAddr, String> {
        if let Some(ip) = self.fixed {
            return Ok(SocketAddr::new(ip, self.port));
        }
        let addrs: Vec<SocketAddr> = (self.host.as_str(), self.port)
            .to_socket_addrs()
            .map_err(|e| format!("cannot resolve {}: {e}", self.host))?
            .collect();
        self.pick(&addrs)
    }

    fn pick(&self, addrs: &[SocketAddr]) -> Result<SocketAddr, String> {
        let mut refused = Vec::new();
        for a in addrs {
            match (self.guard)(a.ip()) {
                Ok(()) => return Ok(*a),
                Err(why) => refused.push(format!("{} is {why}", a.ip())),
            }
        }
        if refused.is_empty() {
            Err(format!("{} resolves to no address", self.host))
        } else {
            Err(format!(
                "{} resolves only to refused addresses ({})",
                self.host,
                refused.join(", ")
            ))
        }
    }

    async fn connect(&self) -> io::Result<Stream> {
        let addr = match self.fixed {
            Some(ip) => SocketAddr::new(ip, self.port),
            None => {
                let addrs: Vec<SocketAddr> =
                    tokio::net::lookup_host((self.host.as_str(), self.port))
                        .await?
                        .collect();
                self.pick(&addrs)
                    .map_err(|e| io::Error::new(io::ErrorKind::PermissionDenied, e))?
            }
        };
        let connect = async {
            let tcp = TcpStream::connect(addr).await?;
            let _ = tcp.set_nodelay(true);
            match &self.tls {
                None => Ok(Stream::Plain(tcp)),
                Some((connector, name)) => {
                    let tls = connector.connect(name.clone(), tcp).await?;
                    Ok(Stream::Tls(Box::new(tls)))
                }
            }
        };
        tokio::time::timeout(CONNECT_TIMEOUT, connect)
            .await
            .map_err(|_| {
                io::Error::new(
                    io::ErrorKind::TimedOut,
                    format!("connecting to {addr} timed out"),
                )
            })?
    }
}

/// The host (lowercase, without brackets) and port of an http(s) URL, read
/// strictly ([`mcpbox_policy::url::host_port`]) before hyper parses it.
pub fn host_port(url: &str) -> Result<(String, u16), UpstreamError> {
    parse_url(url).map(|(_, _, h, p)| (h, p))
}

fn parse_url(url: &str) -> Result<(Uri, bool, String, u16), UpstreamError> {
    let bad = |why: &str| UpstreamError::Url {
        url: url.to_string(),
        why: why.to_string(),
    };
    // the one strict reader first (mcpbox_policy::url): hyper's Uri takes
    // user information and reads the host after it
    mcpbox_policy::url::host_port(url).map_err(|why| bad(&why))?;
    let uri: Uri = url.parse().map_err(|_| bad("not a URL"))?;
    let https = match uri.scheme_str() {
        Some(s) if s.eq_ignore_ascii_case("https") => true,
        Some(s) if s.eq_ignore_ascii_case("http") => false,
        _ => return Err(bad("not an http(s) URL")),
    };
    let host = uri.host().ok_or_else(|| bad("no host"))?;
    let host = host
        .strip_prefix('[')
        .and_then(|h| h.strip_suffix(']'))
        .unwrap_or(host)
        .to_ascii_lowercase();
    let port = uri.port_u16().unwrap_or(if https { 443 } else { 80 });
    Ok((uri, https, host, port))
}

/// A connection to the upstream, plain or TLS.
enum Stream {
    Plain(TcpStream),
    Tls(Box<tokio_rustls::client::TlsStream<TcpStream>>),
}

impl AsyncRead for Stream {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        match self.get_mut() {
            Stream::Plain(s) => Pin::new(s).poll_read(cx, buf),
            Stream::Tls(s) => Pin::new(s.as_mut()).poll_read(cx, buf),
        }
    }
}

impl AsyncWrite for Stream {
    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        match self.get_mut() {
            Stream::Plain(s) => Pin::new(s).poll_write(cx, buf),
            Stream::Tls(s) => Pin::new(s.as_mut()).poll_write(cx, buf),
        }
    }
    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        match self.get_mut() {
            Stream::Plain(s) => Pin::new(s).poll_flush(cx),
            Stream::Tls(s) => Pin::new(s.as_mut()).poll_flush(cx),
        }
    }
    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        match self.get_mut() {
            Stream::Plain(s) => Pin::new(s).poll_shutdown(cx),
            Stream::Tls(s) => Pin::new(s.as_mut()).poll_shutdown(cx),
        }
    }
}

impl Connection for Stream {
    fn connected(&self) -> Connected {
        Connected::new()
    }
}

/// hyper-util's connector: every connection goes to the one upstream,
/// whatever the request's URI says.
#[derive(Clone)]
struct Connector(Arc<Remote>);

impl tower_service::Service<Uri> for Connector {
    type Response = TokioIo<Stream>;
    type Error = io::Error;
    type Future = Pin<Box<dyn Future<Output = io::Result<TokioIo<Stream>>> + Send>>;

    fn poll_ready(&mut self, _cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, _uri: Uri) -> Self::Future {
        let remote = self.0.clone();
        Box::pin(async move { remote.connect().await.map(TokioIo::new) })
    }
}

type HttpClient = Client<Connector, Full<Bytes>>;

/// Starts a [`Remote`]'s client as the relay's server process.
#[derive(Debug)]
pub struct RemoteLauncher {
    remote: Arc<Remote>,
    runtime: tokio::runtime::Handle,
}

impl RemoteLauncher {
    /// A launcher whose clients run on `runtime`.
    pub fn new(remote: Arc<Remote>, runtime: tokio::runtime::Handle) -> RemoteLauncher {
        RemoteLauncher { remote, runtime }
    }
}

impl Launcher for RemoteLauncher {
    fn launch(&mut self, env: &[(String, String)]) -> io::Result<ServerProcess> {
        let credential = match self
            .remote
            .credential
            .render(|name| env.iter().find(|(k, _)| k == name).map(|(_, v)| v.as_str()))
        {
            None => None,
            Some(Err(e)) => return Err(io::Error::other(format!("upstream.value: {e}"))),
            Some(Ok((name, value))) => {
                let name = HeaderName::try_from(name)
                    .map_err(|_| io::Error::other("upstream.header: not a header name"))?;
                let mut value = HeaderValue::try_from(value)
                    .map_err(|_| io::Error::other("upstream.value: not a header value"))?;
                value.set_sensitive(true);
                Some((name, value))
            }
        };
        let (relay_in, our_in) = StdUnix::pair()?;
        let (relay_out, our_out) = StdUnix::pair()?;
        let (relay_err, our_err) = StdUnix::pair()?;
        for s in [&our_in, &our_out, &our_err] {
            s.set_nonblocking(true)?;
        }
        let client: HttpClient = Client::builder(TokioExecutor::new())
            .pool_timer(TokioTimer::new())
            .pool_idle_timeout(Duration::from_secs(30))
            .build(Connector(self.remote.clone()));
        let (stop_tx, stop_rx) = watch::channel(Stop::Running);
        let exit = Arc::new(ExitCell::default());
        let conn = Arc::new(Conn {
            remote: self.remote.clone(),
            client,
            credential,
            session: Mutex::new(None),
            version: Mutex::new(None),
        });
        let exit2 = exit.clone();
        self.runtime.spawn(async move {
            let info = run(conn, our_in, our_out, our_err, stop_rx).await;
            exit2.set(info);
        });
        Ok(ServerProcess {
            stdin: Box::new(relay_in),
            stdout: Box::new(relay_out),
            stderr: Box::new(relay_err),
            control: Box::new(RemoteControl {
                stop: stop_tx,
                exit,
            }),
            files: None,
            tier: None,
        })
    }
}

/// What the relay asked of the client.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Stop {
    Running,
    Terminate,
    Kill,
}

#[derive(Default)]
struct ExitCell {
    state: Mutex<Option<ExitInfo>>,
    cv: Condvar,
}

impl ExitCell {
    fn set(&self, info: ExitInfo) {
        *self.state.lock().unwrap_or_else(|p| p.into_inner()) = Some(info);
        self.cv.notify_all();
    }
}

struct RemoteControl {
    stop: watch::Sender<Stop>,
    exit: Arc<ExitCell>,
}

impl ProcessControl for RemoteControl {
    fn terminate(&mut self) -> io::Result<()> {
        self.stop.send_if_modified(|s| {
            let changed = *s == Stop::Running;
            if changed {
                *s = Stop::Terminate;
            }
            changed
        });
        Ok(())
    }
    fn kill(&mut self) -> io::Result<()> {
        self.stop.send_replace(Stop::Kill);
        Ok(())
    }
    fn try_wait(&mut self) -> io::Result<Option<ExitInfo>> {
        Ok(*self.exit.state.lock().unwrap_or_else(|p| p.into_inner()))
    }
    fn wait(&mut self) -> io::Result<ExitInfo> {
        let mut state = self.exit.state.lock().unwrap_or_else(|p| p.into_inner());
        loop {
            if let Some(info) = *state {
                return Ok(info);
            }
            state = self.exit.cv.wait(state).unwrap_or_else(|p| p.into_inner());
        }
    }
}

/// What every request to the upstream shares.
struct Conn {
    remote: Arc<Remote>,
    client: HttpClient,
    credential: Option<(HeaderName, HeaderValue)>,
    session: Mutex<Option<HeaderValue>>,
    version: Mutex<Option<HeaderValue>>,
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

impl Conn {
    fn request(
        &self,
        method: Method,
        body: Option<Vec<u8>>,
        last_event: Option<&str>,
    ) -> Option<Request<Full<Bytes>>> {
        let accept = if body.is_some() {
            "application/json, text/event-stream"
        } else {
            "text/event-stream"
        };
        let mut b = Request::builder()
            .method(method)
            .uri(self.remote.url.clone())
            .header(ACCEPT, accept);
        if body.is_some() {
            b = b.header(CONTENT_TYPE, "application/json");
        }
        if let Some(id) = lock(&self.session).clone() {
            b = b.header("mcp-session-id", id);
        }
        if let Some(v) = lock(&self.version).clone() {
            b = b.header("mcp-protocol-version", v);
        }
        if let Some((name, value)) = &self.credential {
            b = b.header(name, value.clone());
        }
        if let Some(id) = last_event {
            b = b.header("last-event-id", id);
        }
        b.body(Full::new(Bytes::from(body.unwrap_or_default())))
            .ok()
    }

    async fn send(
        &self,
        method: Method,
        body: Option<Vec<u8>>,
    ) -> Result<Response<Incoming>, String> {
        self.send_resuming(method, body, None).await
    }

    /// [`Conn::send`], with `Last-Event-ID` when resuming a stream.
    async fn send_resuming(
        &self,
        method: Method,
        body: Option<Vec<u8>>,
        last_event: Option<&str>,
    ) -> Result<Response<Incoming>, String> {
        let req = self
            .request(method, body, last_event)
            .ok_or("cannot build the request")?;
        self.client.request(req).await.map_err(|e| {
            // hyper-util's error hides the connector's reason in its source
            let mut msg = e.to_string();
            let mut src = std::error::Error::source(&e);
            while let Some(s) = src {
                msg.push_str(": ");
                msg.push_str(&s.to_string());
                src = s.source();
            }
            msg
        })
    }

    /// Ends the upstream session, if there is one.
    async fn delete(&self) {
        if lock(&self.session).is_none() {
            return;
        }
        let _ = tokio::time::timeout(DELETE_TIMEOUT, self.send(Method::DELETE, None)).await;
    }
}

/// One session's client: the task behind a launched "process".
struct Session {
    conn: Arc<Conn>,
    /// Messages for the relay.
    out: Outbox,
    log: mpsc::UnboundedSender<String>,
    expired: Notify,
    get_started: std::sync::atomic::AtomicBool,
    /// The GET stream's task, stopped with the session.
    get_task: Mutex<Option<tokio::task::AbortHandle>>,
}

/// What a line from the relay is.
struct Line {
    bytes: Vec<u8>,
    /// The id of a request (a message with a method and an id).
    request_id: Option<Value>,
    method: Option<String>,
}

impl Line {
    fn of(bytes: Vec<u8>) -> Line {
        let v: Option<Value> = serde_json::from_slice(&bytes).ok();
        let method = v
            .as_ref()
            .and_then(|v| v.get("method"))
            .and_then(Value::as_str)
            .map(str::to_string);
        let request_id = match (&method, v.as_ref().and_then(|v| v.get("id"))) {
            (Some(_), Some(id)) => Some(id.clone()),
            _ => None,
        };
        Line {
            bytes,
            request_id,
            method,
        }
    }
}

impl Session {
    fn log(&self, msg: String) {
        let _ = self.log.send(msg);
    }

    /// Writes one message to the relay as one line. Raw newlines cannot be
    /// inside JSON strings, so turning them into spaces keeps the JSON as
    /// it was.
    ///
    /// What waits for the relay is bounded in bytes ([`UPSTREAM_BUFFER`]):
    /// past it this waits, so the upstream's answer is read no faster than
    /// the relay takes it (TCP's flow control holds the rest at the
    /// upstream), and nothing is dropped.
    async fn emit(&self, mut msg: Vec<u8>) {
        for b in &mut msg {
            if *b == b'\n' || *b == b'\r' {
                *b = b' ';
            }
        }
        if msg.iter().all(u8::is_ascii_whitespace) {
            return;
        }
        self.out.push(msg).await;
    }

    async fn answer_error(&self, id: &Value, message: String) {
        let e = serde_json::json!({
            "jsonrpc": "2.0",
            "id": id,
            "error": { "code": CODE_UPSTREAM, "message": message },
        });
        self.emit(e.to_string().into_bytes()).await;
    }

    /// Emits a body that is one JSON message (or a batch of them), and
    /// notes the protocol version an `initialize` answer carries.
    async fn emit_json(&self, body: Vec<u8>, initialize: bool) {
        match serde_json::from_slice::<Value>(&body) {
            Ok(Value::Array(items)) => {
                for item in items {
                    self.emit(item.to_string().into_bytes()).await;
                }
            }
            Ok(v) => {
                if initialize {
                    self.note_version(&v);
                }
                self.emit(body).await;
            }
            // the relay drops it as garbage, with its own record
            Err(_) => self.emit(body).await,
        }
    }

    fn note_version(&self, v: &Value) {
        let version = v
            .get("result")
            .and_then(|r| r.get("protocolVersion"))
            .and_then(Value::as_str)
            .and_then(|s| HeaderValue::try_from(s).ok());
        if let Some(version) = version {
            *lock(&self.conn.version) = Some(version);
        }
    }

    /// POSTs one line and writes what comes back.
    async fn post(self: Arc<Self>, line: Line) {
        let initialize = line.method.as_deref() == Some("initialize");
        let initialized = line.method.as_deref() == Some("notifications/initialized");
        let had_session = lock(&self.conn.session).is_some();
        let what = line.method.clone().unwrap_or_else(|| "a response".into());
        let resp = match self.conn.send(Method::POST, Some(line.bytes)).await {
            Ok(r) => r,
            Err(e) => {
                self.log(format!("upstream: POST {what}: {e}"));
                if let Some(id) = &line.request_id {
                    self.answer_error(id, "upstream unreachable".into()).await;
                }
                return;
            }
        };
        let status = resp.status();
        if initialize && status.is_success() {
            if let Some(id) = resp.headers().get("mcp-session-id") {
                *lock(&self.conn.session) = Some(id.clone());
            }
        }
        if status == StatusCode::ACCEPTED || (status.is_success() && line.request_id.is_none()) {
            if initialized
                && !self
                    .get_started
                    .swap(true, std::sync::atomic::Ordering::AcqRel)
            {
                let task = tokio::spawn(self.clone().get_stream());
                *lock(&self.get_task) = Some(task.abort_handle());
            }
            return;
        }
        if status.is_success() {
            let sse = is_sse(&resp);
            let body = resp.into_body();
            if sse {
                let ended = self.sse(body, initialize, line.request_id.as_ref()).await;
                if let (false, Some(id)) = (ended.answered, &line.request_id) {
                    self.resume(id, ended).await;
                }
            } else {
                match read_limited(body, MAX_ANSWER).await {
                    Ok(b) => self.emit_json(b, initialize).await,
                    Err(e) => {
                        self.log(format!("upstream: answer to {what}: {e}"));
                        if let Some(id) = &line.request_id {
                            self.answer_error(id, format!("upstream answer unreadable: {e}"))
                                .await;
                        }
                    }
                }
            }
            return;
        }
        // a refusal: pass on a JSON-RPC error for this very request, else
        // say the status and log the body
        let body = read_limited(resp.into_body(), LOG_SNIPPET * 8)
            .await
            .unwrap_or_default();
        if let Some(id) = &line.request_id {
            let passed = serde_json::from_slice::<Value>(&body)
                .ok()
                .filter(|v| v.get("error").is_some() && v.get("id") == Some(id));
            match passed {
                Some(_) => self.emit(body).await,
                None => {
                    self.log(format!(
                        "upstream: HTTP {status} to {what}: {}",
                        snippet(&body)
                    ));
                    self.answer_error(id, format!("upstream answered HTTP {}", status.as_u16()))
                        .await;
                }
            }
        } else {
            self.log(format!(
                "upstream: HTTP {status} to {what}: {}",
                snippet(&body)
            ));
        }
        if status == StatusCode::NOT_FOUND && had_session {
            self.log("upstream: the upstream session is gone; ending".into());
            self.expired.notify_one();
        }
    }

    /// Forwards every `data:` event of an SSE body; says how the stream
    /// ended (the last event id and retry delay it gave, and whether the
    /// answer to `want` came).
    async fn sse(&self, mut body: Incoming, initialize: bool, want: Option<&Value>) -> Ended {
        let mut buf = BytesMut::new();
        let mut data: Vec<u8> = Vec::new();
        let mut has_data = false;
        let mut ended = Ended::default();
        loop {
            let frame = match body.frame().await {
                Some(Ok(f)) => f,
                Some(Err(e)) => {
                    self.log(format!("upstream: event stream broke: {e}"));
                    break;
                }
                None => break,
            };
            let Ok(chunk) = frame.into_data() else {
                continue;
            };
            buf.extend_from_slice(&chunk);
            while let Some(nl) = buf.iter().position(|&b| b == b'\n') {
                let raw = buf.split_to(nl + 1);
                let mut line = &raw[..nl];
                if line.last() == Some(&b'\r') {
                    line = &line[..line.len() - 1];
                }
                if line.is_empty() {
                    if has_data {
                        let msg = std::mem::take(&mut data);
                        if initialize || want.is_some() {
                            if let Ok(v) = serde_json::from_slice::<Value>(&msg) {
                                if initialize {
                                    self.note_version(&v);
                                }
                                if want.is_some()
                                    && v.get("id") == want
                                    && v.get("method").is_none()
                                {
                                    ended.answered = true;
                                }
                            }
                        }
                        self.emit(msg).await;
                    }
                    has_data = false;
                } else if let Some(rest) = line.strip_prefix(b"data:") {
                    let rest = rest.strip_prefix(b" ").unwrap_or(rest);
                    if has_data {
                        data.push(b'\n');
                    }
                    data.extend_from_slice(rest);
                    has_data = true;
                } else if let Some(rest) = line.strip_prefix(b"id:") {
                    // kept to resume the stream (SEP-1699); never forwarded
                    let id = String::from_utf8_lossy(rest).trim().to_string();
                    ended.last_id = (!id.is_empty()).then_some(id);
                } else if let Some(rest) = line.strip_prefix(b"retry:") {
                    ended.retry = String::from_utf8_lossy(rest)
                        .trim()
                        .parse::<u64>()
                        .ok()
                        .map(|ms| Duration::from_millis(ms.min(MAX_RETRY_MS)));
                }
                // event: and comments carry nothing the relay needs
            }
            if buf.len() + data.len() > MAX_ANSWER {
                self.log("upstream: an event is larger than 64MiB; stream dropped".into());
                return ended;
            }
        }
        if has_data {
            self.emit(data).await;
        }
        ended
    }

    /// A POST's stream ended before its answer: resume it with GET and
    /// `Last-Event-ID` after the delay the upstream asked for, as the
    /// 2025-11-25 transport lets a server close a stream mid-request
    /// (polling); gives up after [`MAX_RESUMES`] and answers with an error.
    async fn resume(&self, id: &Value, mut ended: Ended) {
        for _ in 0..MAX_RESUMES {
            let Some(last) = ended.last_id.clone() else {
                break;
            };
            tokio::time::sleep(ended.retry.unwrap_or(Duration::from_secs(1))).await;
            let resp = match self
                .conn
                .send_resuming(Method::GET, None, Some(&last))
                .await
            {
                Ok(r) if r.status().is_success() && is_sse(&r) => r,
                Ok(r) => {
                    self.log(format!("upstream: resuming a stream: HTTP {}", r.status()));
                    break;
                }
                Err(e) => {
                    self.log(format!("upstream: resuming a stream: {e}"));
                    break;
                }
            };
            let next = self.sse(resp.into_body(), false, Some(id)).await;
            if next.answered {
                return;
            }
            ended = Ended {
                last_id: next.last_id.or(Some(last)),
                retry: next.retry.or(ended.retry),
                answered: false,
            };
        }
        self.answer_error(
            id,
            "the upstream's event stream ended before its answer".into(),
        )
        .await;
    }

    /// The upstream's own messages, for as long as it keeps the stream.
    async fn get_stream(self: Arc<Self>) {
        loop {
            let resp = match self.conn.send(Method::GET, None).await {
                Ok(r) => r,
                Err(e) => {
                    self.log(format!("upstream: GET stream: {e}"));
                    return;
                }
            };
            let status = resp.status();
            if status == StatusCode::METHOD_NOT_ALLOWED {
                return;
            }
            if !status.is_success() || !is_sse(&resp) {
                self.log(format!("upstream: GET stream refused: HTTP {status}"));
                return;
            }
            self.sse(resp.into_body(), false, None).await;
            // the upstream closed it; open it again after a breath
            tokio::time::sleep(Duration::from_secs(1)).await;
        }
    }
}

/// How an event stream ended.
#[derive(Debug, Default)]
struct Ended {
    /// The last `id:` it gave, to resume from.
    last_id: Option<String>,
    /// The `retry:` delay it asked for.
    retry: Option<Duration>,
    /// Whether the answer awaited came.
    answered: bool,
}

/// Times a POST's stream is resumed before its request is answered with an
/// error.
const MAX_RESUMES: usize = 16;
/// The longest `retry:` delay honoured, in milliseconds.
const MAX_RETRY_MS: u64 = 30_000;

fn is_sse(resp: &Response<Incoming>) -> bool {
    resp.headers()
        .get(CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .is_some_and(|v| {
            v.trim_start()
                .to_ascii_lowercase()
                .starts_with("text/event-stream")
        })
}

async fn read_limited(mut body: Incoming, limit: usize) -> Result<Vec<u8>, String> {
    let mut out = Vec::new();
    while let Some(frame) = body.frame().await {
        let frame = frame.map_err(|e| e.to_string())?;
        if let Ok(d) = frame.into_data() {
            if out.len() + d.len() > limit {
                return Err(format!("body larger than {limit} bytes"));
            }
            out.extend_from_slice(&d);
        }
    }
    Ok(out)
}

/// The start of a body, printable, for the log (which the relay redacts):
/// what is unsafe for a terminal ([`mcpbox_policy::terminal::is_unsafe`])
/// becomes a space.
fn snippet(body: &[u8]) -> String {
    let s = String::from_utf8_lossy(&body[..body.len().min(LOG_SNIPPET)]);
    s.chars()
        .map(|c| {
            if mcpbox_policy::terminal::is_unsafe(c) {
                ' '
            } else {
                c
            }
        })
        .collect()
}

async fn write_lines<T: Into<Vec<u8>>>(mut rx: mpsc::UnboundedReceiver<T>, sock: StdUnix) {
    let Ok(mut w) = tokio::net::UnixStream::from_std(sock) else {
        return;
    };
    while let Some(line) = rx.recv().await {
        let mut line: Vec<u8> = line.into();
        line.push(b'\n');
        if w.write_all(&line).await.is_err() {
            return;
        }
    }
    let _ = w.shutdown().await;
}

/// The messages of an upstream on their way to the relay, bounded in
/// bytes: [`Outbox::push`] waits while `cap` bytes wait already, and each
/// message's room is given back once [`write_messages`] wrote it.
struct Outbox {
    tx: mpsc::UnboundedSender<(Vec<u8>, OwnedSemaphorePermit)>,
    room: Arc<Semaphore>,
    cap: usize,
}

type Outgoing = mpsc::UnboundedReceiver<(Vec<u8>, OwnedSemaphorePermit)>;

impl Outbox {
    fn new(cap: usize) -> (Outbox, Outgoing) {
        let (tx, rx) = mpsc::unbounded_channel();
        let room = Arc::new(Semaphore::new(cap));
        (Outbox { tx, room, cap }, rx)
    }

    /// Queues `msg` once there is room for it (a message larger than the
    /// whole box waits for all of it).
    async fn push(&self, msg: Vec<u8>) {
        let n = u32::try_from(msg.len().min(self.cap)).unwrap_or(u32::MAX);
        let Ok(permit) = self.room.clone().acquire_many_owned(n).await else {
            return;
        };
        let _ = self.tx.send((msg, permit));
    }
}

/// The messages for the relay: each one's room in the buffer is given
/// back once it is written.
async fn write_messages(mut rx: Outgoing, sock: StdUnix) {
    let Ok(mut w) = tokio::net::UnixStream::from_std(sock) else {
        return;
    };
    while let Some((mut line, room)) = rx.recv().await {
        line.push(b'\n');
        let written = w.write_all(&line).await;
        drop(room);
        if written.is_err() {
            return;
        }
    }
    let _ = w.shutdown().await;
}

/// The client's life: read lines until stdin closes or the relay stops
/// it, then end the upstream session.
async fn run(
    conn: Arc<Conn>,
    stdin: StdUnix,
    stdout: StdUnix,
    stderr: StdUnix,
    mut stop: watch::Receiver<Stop>,
) -> ExitInfo {
    let (outbox, out_rx) = Outbox::new(UPSTREAM_BUFFER);
    let (log_tx, log_rx) = mpsc::unbounded_channel::<String>();
    let writers = [
        tokio::spawn(write_messages(out_rx, stdout)),
        tokio::spawn(write_lines(log_rx, stderr)),
    ];
    let session = Arc::new(Session {
        conn: conn.clone(),
        out: outbox,
        log: log_tx,
        expired: Notify::new(),
        get_started: std::sync::atomic::AtomicBool::new(false),
        get_task: Mutex::new(None),
    });
    let mut tasks = JoinSet::new();
    let end = match tokio::net::UnixStream::from_std(stdin) {
        Err(e) => {
            session.log(format!("upstream: cannot read the relay's messages: {e}"));
            Stop::Terminate
        }
        Ok(stdin) => {
            let mut lines = BufReader::new(stdin).split(b'\n');
            loop {
                tokio::select! {
                    seg = lines.next_segment() => match seg {
                        Ok(Some(bytes)) => {
                            if bytes.iter().all(u8::is_ascii_whitespace) {
                                continue;
                            }
                            while tasks.try_join_next().is_some() {}
                            let line = Line::of(bytes);
                            if line.method.as_deref() == Some("initialize") {
                                // the session id comes with its answer: nothing
                                // else may go before it
                                let init = session.clone().post(line);
                                tokio::pin!(init);
                                tokio::select! {
                                    () = &mut init => {}
                                    _ = stop.changed() => break *stop.borrow(),
                                }
                            } else {
                                tasks.spawn(session.clone().post(line));
                            }
                        }
                        // stdin closed: the relay's first stop step
                        Ok(None) | Err(_) => break Stop::Running,
                    },
                    _ = stop.changed() => break *stop.borrow(),
                    () = session.expired.notified() => break Stop::Terminate,
                }
            }
        }
    };
    let end = if end == Stop::Running {
        // answer what is in flight first, unless told to stop meanwhile
        let drained = async { while tasks.join_next().await.is_some() {} };
        tokio::select! {
            () = drained => Stop::Running,
            _ = stop.changed() => *stop.borrow(),
        }
    } else {
        end
    };
    tasks.abort_all();
    if let Some(get) = lock(&session.get_task).take() {
        get.abort();
    }
    match end {
        Stop::Kill => {
            // nobody waits for the upstream any more; still tell it
            let c = conn.clone();
            tokio::spawn(async move { c.delete().await });
        }
        _ => conn.delete().await,
    }
    drop(tasks);
    drop(session);
    for w in writers {
        let abort = w.abort_handle();
        if tokio::time::timeout(Duration::from_secs(2), w)
            .await
            .is_err()
        {
            abort.abort();
        }
    }
    match end {
        Stop::Running => ExitInfo {
            code: Some(0),
            signal: None,
        },
        Stop::Terminate => ExitInfo {
            code: None,
            signal: Some(15),
        },
        Stop::Kill => ExitInfo {
            code: None,
            signal: Some(9),
        },
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_upstream_url_is_read_strictly_before_hyper_reads_it() {
        assert_eq!(
            host_port("https://Up.test:8443/mcp").unwrap(),
            ("up.test".into(), 8443)
        );
        assert_eq!(host_port("http://[::1]/").unwrap(), ("::1".into(), 80));
        // hyper's Uri takes each of these; the host a rule would be checked
        // against is not the one every parser connects to, or the URL
        // carries a credential into logs
        for url in [
            "https://good.test@evil.test/mcp",
            "https://u:p@up.test/mcp",
            "https://up.test/m\\cp",
            "https://up.test:0/",
        ] {
            assert!(host_port(url).is_err(), "{url}");
        }
    }

    #[test]
    fn a_line_knows_requests_from_notifications_and_responses() {
        let l = Line::of(br#"{"jsonrpc":"2.0","id":7,"method":"tools/list"}"#.to_vec());
        assert_eq!(l.request_id, Some(Value::from(7)));
        let l = Line::of(br#"{"jsonrpc":"2.0","method":"notifications/initialized"}"#.to_vec());
        assert!(l.request_id.is_none());
        let l = Line::of(br#"{"jsonrpc":"2.0","id":1,"result":{}}"#.to_vec());
        assert!(l.request_id.is_none() && l.method.is_none());
    }

    #[test]
    fn an_upstream_is_read_no_faster_than_the_relay_takes_its_messages() {
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_time()
            .build()
            .unwrap();
        rt.block_on(async {
            let (outbox, mut rx) = Outbox::new(100);
            outbox.push(vec![b'a'; 60]).await;
            // 60 + 60 > 100: the second waits for the relay
            let second =
                tokio::time::timeout(Duration::from_millis(50), outbox.push(vec![b'b'; 60]));
            assert!(
                second.await.is_err(),
                "a push past the box's bytes did not wait"
            );
            let (first, room) = rx.recv().await.unwrap();
            assert_eq!(first[0], b'a');
            drop(room);
            outbox.push(vec![b'b'; 60]).await;
            // one larger than the whole box waits for all of it, then passes
            let big = tokio::time::timeout(Duration::from_millis(50), outbox.push(vec![b'c'; 500]));
            assert!(big.await.is_err());
            drop(rx.recv().await.unwrap());
            outbox.push(vec![b'c'; 500]).await;
            assert_eq!(rx.recv().await.unwrap().0.len(), 500);
        });
    }

    #[test]
    fn a_snippet_has_no_line_breaks() {
        assert_eq!(snippet(b"a\nb\r\x1b"), "a b  ");
    }
}
