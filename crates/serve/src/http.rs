//! The HTTP requests: checks in a fixed order, then the MCP endpoint.
//!
//! Order, each step refusing before the next runs: `/healthz`; `Host`
//! (403, DNS rebinding); `Origin` (403); the bearer token (401 with
//! `WWW-Authenticate`); `/metrics`; the endpoint and the server (404), the
//! client's right to it (403, audited); the client's rate (429) and
//! requests in flight (429); then the method. A POST's `Content-Type`
//! (415), `Accept` (406), `MCP-Protocol-Version` (400) and body (413 past
//! `limits.max_body`, 408 past `limits.body_timeout`, 400 for what is not
//! one JSON-RPC message) come before any session sees it. A session id of
//! another client gets the same 404 as an unknown one (and is audited),
//! so ids cannot be probed.

use std::convert::Infallible;
use std::sync::Arc;
use std::time::{Duration, Instant};

use bytes::Bytes;
use http_body_util::BodyExt;
use hyper::body::Incoming;
use hyper::header::{HeaderMap, HeaderValue, ACCEPT, CONTENT_TYPE, HOST, ORIGIN};
use hyper::{Method, Request, Response, StatusCode};
use mcpbox_audit::{Event as AuditEvent, Kind, Verdict};
use mcpbox_gateway::message::{Invalid, Message, Shape};
use mcpbox_policy::Reason;
use serde_json::{json, Value};

use crate::body::{sse_event, Body, Chunk, KEEPALIVE};
use crate::budget::Held;
use crate::session::{McpSession, Out, SendError, StreamError, Waiting};
use crate::settings::{digest, ClientSettings};
use crate::Gateway;

/// The header that carries the session id.
pub const SESSION_HEADER: &str = "mcp-session-id";
/// The header that carries the protocol revision.
pub const VERSION_HEADER: &str = "mcp-protocol-version";
/// Protocol revisions the HTTP face accepts in `MCP-Protocol-Version`.
pub const SUPPORTED_VERSIONS: [&str; 5] = [
    "2024-11-05",
    "2025-03-26",
    "2025-06-18",
    "2025-11-25",
    "2026-07-28",
];
/// Events between a stream's task and hyper (each charged to its
/// session's budget until hyper takes it).
const SSE_CHUNKS: usize = 64;
/// An SSE comment goes out when a stream was quiet this long.
pub(crate) const KEEPALIVE_EVERY: Duration = Duration::from_secs(15);

/// JSON-RPC: invalid JSON.
pub(crate) const PARSE_ERROR: i64 = -32700;
/// JSON-RPC: not a valid request object.
pub(crate) const INVALID_REQUEST: i64 = -32600;
/// Implementation-defined server error: the transport refused the request.
pub(crate) const TRANSPORT_ERROR: i64 = -32000;
/// The session id names no live session (what the SDKs answer).
pub(crate) const SESSION_NOT_FOUND: i64 = -32001;

/// A refusal: an HTTP status with a JSON-RPC error body (boxed: it is the
/// error side of most results here, and the common side stays small).
pub(crate) struct Refusal(Box<Refused>);

struct Refused {
    status: StatusCode,
    code: i64,
    reason: Reason,
    message: String,
    headers: Vec<(&'static str, String)>,
    id: Value,
    data: Option<Value>,
}

impl Refusal {
    pub(crate) fn new(
        status: StatusCode,
        code: i64,
        reason: Reason,
        message: impl Into<String>,
    ) -> Refusal {
        Refusal(Box::new(Refused {
            status,
            code,
            reason,
            message: message.into(),
            headers: Vec::new(),
            id: Value::Null,
            data: None,
        }))
    }

    /// More detail in `error.data`, beside the reason and source.
    pub(crate) fn data(mut self, extra: Value) -> Refusal {
        self.0.data = Some(extra);
        self
    }

    pub(crate) fn header(mut self, name: &'static str, value: impl Into<String>) -> Refusal {
        self.0.headers.push((name, value.into()));
        self
    }

    pub(crate) fn id(mut self, id: Value) -> Refusal {
        self.0.id = id;
        self
    }

    fn into_response(self, gw: &Gateway) -> Response<Body> {
        let this = *self.0;
        gw.metrics.refused(this.reason.as_str());
        let mut data =
            json!({"reason": this.reason.as_str(), "source": mcpbox_policy::Source::Mcpbox});
        if let (Some(Value::Object(extra)), Some(d)) = (this.data, data.as_object_mut()) {
            d.extend(extra);
        }
        let body = json!({
            "jsonrpc": "2.0",
            "id": this.id,
            "error": {
                "code": this.code,
                "message": this.message,
                "data": data,
            },
        });
        let mut r = Response::builder()
            .status(this.status)
            .header(CONTENT_TYPE, "application/json");
        for (k, v) in this.headers {
            r = r.header(k, v);
        }
        r.body(Body::full(serde_json::to_vec(&body).unwrap_or_default()))
            .unwrap_or_else(|_| plain(StatusCode::INTERNAL_SERVER_ERROR, ""))
    }
}

pub(crate) fn plain(status: StatusCode, text: &'static str) -> Response<Body> {
    let mut r = Response::new(Body::full(text));
    *r.status_mut() = status;
    r
}

/// Answers one request and counts it.
pub async fn handle(
    gw: Arc<Gateway>,
    req: Request<Incoming>,
) -> Result<Response<Body>, Infallible> {
    let started = Instant::now();
    let method = req.method().clone();
    let resp = match route(&gw, req).await {
        Ok(r) => r,
        Err(refusal) => refusal.into_response(&gw),
    };
    gw.metrics
        .observe(method.as_str(), resp.status().as_u16(), started.elapsed());
    Ok(resp)
}

pub(crate) fn header(headers: &HeaderMap, name: impl hyper::header::AsHeaderName) -> Option<&str> {
    headers.get(name).and_then(|v| v.to_str().ok())
}

async fn route(gw: &Arc<Gateway>, req: Request<Incoming>) -> Result<Response<Body>, Refusal> {
    let path = req.uri().path().to_string();
    if path == "/healthz" && req.method() == Method::GET {
        return Ok(plain(StatusCode::OK, "ok\n"));
    }
    if gw.stopping() {
        return Err(Refusal::new(
            StatusCode::SERVICE_UNAVAILABLE,
            TRANSPORT_ERROR,
            Reason::HttpShuttingDown,
            "the gateway is stopping",
        ));
    }
    let headers = req.headers();
    // A request refused before it is known whose it is (Host, Origin, no or
    // a wrong token) is answered with `Connection: close`, and hyper closes
    // the connection once the answer is written: a peer without a token
    // holds no connection open (a new one must send its head within
    // `limits.header_timeout`).
    // DNS rebinding: a page on another site that resolves its own name to
    // this address sends that name as Host, and its own site as Origin.
    let host = header(headers, HOST).unwrap_or("");
    if !gw.settings.host_allowed(host) {
        tracing::warn!(
            host,
            "request for a host the gateway does not serve refused"
        );
        return Err(Refusal::new(
            StatusCode::FORBIDDEN,
            TRANSPORT_ERROR,
            Reason::HttpHostRefused,
            "Host header not accepted: the gateway serves only its own address (see listen.allowed_hosts)",
        )
        .header("connection", "close"));
    }
    if let Some(origin) = headers.get(ORIGIN) {
        let ok = origin.to_str().is_ok_and(|o| gw.settings.origin_allowed(o));
        if !ok {
            tracing::warn!(origin = ?origin, "request from a foreign origin refused");
            return Err(Refusal::new(
                StatusCode::FORBIDDEN,
                TRANSPORT_ERROR,
                Reason::HttpOriginRefused,
                "Origin not accepted (see listen.allowed_origins)",
            )
            .header("connection", "close"));
        }
    }
    let client = authenticate(gw, headers)?;
    if path == "/metrics" && req.method() == Method::GET {
        let text = gw.metrics.render(gw.sessions.len(), gw.budgets.used());
        let mut r = Response::new(Body::full(text));
        r.headers_mut().insert(
            CONTENT_TYPE,
            HeaderValue::from_static("text/plain; version=0.0.4"),
        );
        return Ok(r);
    }
    let server = match path
        .strip_prefix("/servers/")
        .and_then(|r| r.strip_suffix("/mcp"))
    {
        // the aggregate of every server the client may use
        None if path == "/mcp" => String::new(),
        Some(name) if gw.settings.servers.iter().any(|s| s == name) => name.to_string(),
        Some(_) => {
            return Err(Refusal::new(
                StatusCode::NOT_FOUND,
                TRANSPORT_ERROR,
                Reason::HttpServerUnknown,
                "no server of that name",
            ))
        }
        None => return Ok(plain(StatusCode::NOT_FOUND, "not found\n")),
    };
    if !server.is_empty() && !client.may_use(&server) {
        gw.audit_access(
            &client.name,
            &server,
            Reason::HttpServerForbidden,
            json!({}),
        );
        return Err(Refusal::new(
            StatusCode::FORBIDDEN,
            TRANSPORT_ERROR,
            Reason::HttpServerForbidden,
            "this client may not use this server",
        ));
    }
    let limits = gw.limits_of(&client.name);
    if !limits.admit(Instant::now()) {
        return Err(Refusal::new(
            StatusCode::TOO_MANY_REQUESTS,
            TRANSPORT_ERROR,
            Reason::HttpRateLimited,
            "too many requests: slow down",
        )
        .header("retry-after", "1"));
    }
    let task = task_header(req.headers())?;
    let ctx = Ctx {
        gw: gw.clone(),
        client,
        server,
        task,
    };
    match *req.method() {
        Method::POST => {
            let Some(slot) = limits.request() else {
                return Err(Refusal::new(
                    StatusCode::TOO_MANY_REQUESTS,
                    TRANSPORT_ERROR,
                    Reason::HttpTooManyInFlight,
                    "too many requests in flight for this client",
                )
                .header("retry-after", "1"));
            };
            // in flight until the body's last byte is out, not until the
            // handler returns (a streamed answer outlives it)
            let busy = gw.busy();
            let resp = match post(&ctx, req, slot).await {
                Ok(r) => r,
                Err(refusal) => refusal.into_response(gw),
            };
            Ok(resp.map(|b| b.held(Box::new(busy))))
        }
        Method::GET if ctx.server.is_empty() => crate::aggregate::get(&ctx, &req),
        Method::DELETE if ctx.server.is_empty() => crate::aggregate::delete(&ctx, &req),
        Method::GET => get(&ctx, &req),
        Method::DELETE => delete(&ctx, &req).await,
        _ => Ok(Response::builder()
            .status(StatusCode::METHOD_NOT_ALLOWED)
            .header("allow", "GET, POST, DELETE")
            .body(Body::empty())
            .unwrap_or_else(|_| plain(StatusCode::METHOD_NOT_ALLOWED, ""))),
    }
}

/// Who is asking: the client whose token the request bears (every token
/// compared in constant time), or the anonymous client for a request
/// without one.
fn authenticate(gw: &Gateway, headers: &HeaderMap) -> Result<ClientSettings, Refusal> {
    let auth = headers.get(hyper::header::AUTHORIZATION);
    let presented = match auth {
        None => None,
        Some(v) => {
            let token = v
                .to_str()
                .ok()
                .and_then(|s| {
                    s.strip_prefix("Bearer ")
                        .or_else(|| s.strip_prefix("bearer "))
                })
                .map(str::trim);
            match token {
                Some(t) if !t.is_empty() => Some(digest(t.as_bytes())),
                _ => {
                    return Err(unauthorized(
                        Reason::HttpTokenInvalid,
                        "Authorization must be `Bearer <token>`",
                    ))
                }
            }
        }
    };
    match gw.settings.client_for(presented.as_ref()) {
        Some(c) => Ok(c.clone()),
        None if presented.is_none() => Err(unauthorized(
            Reason::HttpTokenMissing,
            "this gateway needs a bearer token (Authorization: Bearer <token>)",
        )),
        None => {
            // no name to log: the token is not one we know, and is never logged
            tracing::warn!("request with an unknown bearer token refused");
            Err(unauthorized(
                Reason::HttpTokenInvalid,
                "the bearer token is not valid",
            ))
        }
    }
}

fn unauthorized(reason: Reason, message: &str) -> Refusal {
    let challenge = match reason {
        Reason::HttpTokenMissing => r#"Bearer realm="mcpbox""#.to_string(),
        _ => r#"Bearer realm="mcpbox", error="invalid_token""#.to_string(),
    };
    Refusal::new(StatusCode::UNAUTHORIZED, TRANSPORT_ERROR, reason, message)
        .header("www-authenticate", challenge)
        .header("connection", "close")
}

/// The request's context once it passed the gate (`server` is empty on
/// the aggregated endpoint).
#[derive(Clone)]
pub(crate) struct Ctx {
    pub(crate) gw: Arc<Gateway>,
    pub(crate) client: ClientSettings,
    pub(crate) server: String,
    /// The task the client named (`Mcpbox-Task`), for a sandbox of its
    /// own per task.
    pub(crate) task: Option<String>,
}

/// The task named by the `Mcpbox-Task` header, checked: a name that could
/// reach a path or a terminal is refused, not cleaned up.
fn task_header(headers: &HeaderMap) -> Result<Option<String>, Refusal> {
    let Some(v) = headers.get(mcpbox_lifecycle::id::TASK_HEADER) else {
        return Ok(None);
    };
    let task = v.to_str().map_err(|_| bad_task("not ASCII".into()))?;
    mcpbox_lifecycle::id::check_task(task).map_err(bad_task)?;
    Ok(Some(task.to_string()))
}

fn bad_task(why: String) -> Refusal {
    Refusal::new(
        StatusCode::BAD_REQUEST,
        INVALID_REQUEST,
        Reason::HttpTaskInvalid,
        format!("Mcpbox-Task: {why}"),
    )
}

/// The task of an `initialize`: the header's, or else
/// `params._meta["io.mcpbox/task"]`; both, differing, is refused.
pub(crate) fn initialize_task(ctx: &Ctx, msg: &Message) -> Result<Option<String>, Refusal> {
    let meta = msg
        .value
        .pointer("/params/_meta")
        .and_then(|m| m.get(mcpbox_lifecycle::id::TASK_META));
    let meta = match meta {
        None => None,
        Some(Value::String(t)) => {
            mcpbox_lifecycle::id::check_task(t).map_err(bad_task)?;
            Some(t.clone())
        }
        Some(_) => return Err(bad_task("the _meta task is not a string".into())),
    };
    match (&ctx.task, meta) {
        (Some(h), Some(m)) if *h != m => Err(bad_task(
            "the header and params._meta name different tasks".into(),
        )),
        (Some(h), _) => Ok(Some(h.clone())),
        (None, m) => Ok(m),
    }
}

/// `Accept` lists `want` (or a wildcard that covers it).
pub(crate) fn accepts(headers: &HeaderMap, want: &str) -> bool {
    let Some(accept) = header(headers, ACCEPT) else {
        return false;
    };
    let (kind, _) = want.split_once('/').unwrap_or((want, ""));
    accept.split(',').any(|part| {
        let media = part
            .split(';')
            .next()
            .unwrap_or("")
            .trim()
            .to_ascii_lowercase();
        media == want || media == "*/*" || media == format!("{kind}/*")
    })
}

pub(crate) fn check_version(headers: &HeaderMap) -> Result<Option<String>, Refusal> {
    match header(headers, VERSION_HEADER) {
        None => Ok(None),
        Some(v) if SUPPORTED_VERSIONS.contains(&v.trim()) => Ok(Some(v.trim().to_string())),
        Some(v) => Err(Refusal::new(
            StatusCode::BAD_REQUEST,
            TRANSPORT_ERROR,
            Reason::HttpProtocolVersion,
            format!(
                "unsupported MCP-Protocol-Version {v:?}; supported: {}",
                SUPPORTED_VERSIONS.join(", ")
            ),
        )),
    }
}

/// The live session the request names, if it is this client's on this
/// server; anything else is the same 404 (and audited when the id exists).
fn find_session(ctx: &Ctx, headers: &HeaderMap) -> Result<Arc<McpSession>, Refusal> {
    let Some(sid) = header(headers, SESSION_HEADER) else {
        return Err(Refusal::new(
            StatusCode::BAD_REQUEST,
            TRANSPORT_ERROR,
            Reason::HttpSessionRequired,
            "Bad Request: Mcp-Session-Id header is required (send initialize first)",
        ));
    };
    let found = ctx.gw.sessions.get(sid);
    match found {
        Some(s) if s.client == ctx.client.name && s.server == ctx.server && !s.ended() => Ok(s),
        other => {
            if let Some(s) = other {
                if s.client != ctx.client.name || s.server != ctx.server {
                    ctx.gw.audit_access(
                        &ctx.client.name,
                        &ctx.server,
                        Reason::HttpSessionUnknown,
                        json!({"session_of_other_client": s.client != ctx.client.name}),
                    );
                }
            }
            Err(Refusal::new(
                StatusCode::NOT_FOUND,
                SESSION_NOT_FOUND,
                Reason::HttpSessionUnknown,
                "Session not found",
            ))
        }
    }
}

async fn read_body(ctx: &Ctx, req: Request<Incoming>) -> Result<Bytes, Refusal> {
    let limit = ctx.gw.settings.limits.max_body;
    let too_large = || {
        Refusal::new(
            StatusCode::PAYLOAD_TOO_LARGE,
            INVALID_REQUEST,
            Reason::HttpBodyTooLarge,
            format!("request body over {limit} bytes"),
        )
    };
    let declared =
        header(req.headers(), hyper::header::CONTENT_LENGTH).and_then(|v| v.parse::<u64>().ok());
    if declared.is_some_and(|n| n > limit as u64) {
        return Err(too_large());
    }
    let body = http_body_util::Limited::new(req.into_body(), limit);
    match tokio::time::timeout(ctx.gw.settings.limits.body_timeout, body.collect()).await {
        Err(_) => Err(Refusal::new(
            StatusCode::REQUEST_TIMEOUT,
            INVALID_REQUEST,
            Reason::HttpBodyTimeout,
            "the request body did not arrive in time",
        )),
        Ok(Err(e))
            if e.downcast_ref::<http_body_util::LengthLimitError>()
                .is_some() =>
        {
            Err(too_large())
        }
        Ok(Err(_)) => Err(Refusal::new(
            StatusCode::BAD_REQUEST,
            INVALID_REQUEST,
            Reason::RequestInvalid,
            "the request body could not be read",
        )),
        Ok(Ok(collected)) => Ok(collected.to_bytes()),
    }
}

/// A POST's checks (content type, accept, body size and time) and its one
/// JSON-RPC message, with the body's bytes.
pub(crate) async fn read_message(
    ctx: &Ctx,
    req: Request<Incoming>,
) -> Result<(HeaderMap, Message, Bytes), Refusal> {
    let headers = req.headers().clone();
    let json_type = header(&headers, CONTENT_TYPE).is_some_and(|c| {
        c.split(';')
            .next()
            .is_some_and(|m| m.trim().eq_ignore_ascii_case("application/json"))
    });
    if !json_type {
        return Err(Refusal::new(
            StatusCode::UNSUPPORTED_MEDIA_TYPE,
            TRANSPORT_ERROR,
            Reason::HttpContentType,
            "Unsupported Media Type: Content-Type must be application/json",
        ));
    }
    if !(accepts(&headers, "application/json") && accepts(&headers, "text/event-stream")) {
        return Err(Refusal::new(
            StatusCode::NOT_ACCEPTABLE,
            TRANSPORT_ERROR,
            Reason::HttpAccept,
            "Not Acceptable: Accept must list both application/json and text/event-stream",
        ));
    }
    let bytes = read_body(ctx, req).await?;
    let msg = match Message::parse(&bytes) {
        Ok(m) => m,
        Err(Invalid::Batch) => {
            return Err(Refusal::new(
                StatusCode::BAD_REQUEST,
                INVALID_REQUEST,
                Reason::BatchRefused,
                "JSON-RPC batches are not supported",
            ))
        }
        Err(Invalid::NotMessage) => {
            return Err(Refusal::new(
                StatusCode::BAD_REQUEST,
                INVALID_REQUEST,
                Reason::RequestInvalid,
                "not a JSON-RPC request, notification or response",
            ))
        }
        Err(Invalid::Json | Invalid::Blank) => {
            return Err(Refusal::new(
                StatusCode::BAD_REQUEST,
                PARSE_ERROR,
                Reason::RequestInvalid,
                "Parse error: the body is not JSON (or has a duplicate key)",
            ))
        }
    };
    Ok((headers, msg, bytes))
}

/// The relay frames messages by line: a body spread over several lines is
/// written out again on one.
pub(crate) fn one_line(bytes: &[u8], msg: &Message) -> Vec<u8> {
    if bytes.iter().any(|&b| b == b'\n' || b == b'\r') {
        mcpbox_gateway::message::to_line(&msg.value)
    } else {
        bytes.to_vec()
    }
}

async fn post(
    ctx: &Ctx,
    req: Request<Incoming>,
    slot: crate::limits::Slot,
) -> Result<Response<Body>, Refusal> {
    let (headers, msg, bytes) = read_message(ctx, req).await?;
    if ctx.server.is_empty() {
        return crate::aggregate::post(ctx, &headers, msg, &bytes, slot).await;
    }
    if crate::modern::is_modern(&msg, &headers)? {
        // an unknown revision in a 2026-07-28 envelope is the server's to
        // refuse, with the versions it speaks (-32022)
        return crate::modern::post(ctx, msg, &headers, slot).await;
    }
    check_version(&headers).map_err(|r| r.id(msg.id().cloned().unwrap_or(Value::Null)))?;
    let bytes = one_line(&bytes, &msg);
    let is_init = msg.shape == Shape::Request && msg.method() == Some("initialize");
    let (session, opened) = if is_init {
        if header(&headers, SESSION_HEADER).is_some() {
            return Err(Refusal::new(
                StatusCode::BAD_REQUEST,
                INVALID_REQUEST,
                Reason::RequestInvalid,
                "initialize opens a new session: send it without Mcp-Session-Id",
            )
            .id(msg.id().cloned().unwrap_or(Value::Null)));
        }
        let task = initialize_task(ctx, &msg)
            .map_err(|r| r.id(msg.id().cloned().unwrap_or(Value::Null)))?;
        (open_session(ctx, task.as_deref()).await?, true)
    } else {
        // any revision the gateway speaks is taken in the header (clients
        // and the conformance suite send older ones on a newer session)
        (find_session(ctx, &headers)?, false)
    };
    let id = msg.id().cloned().unwrap_or(Value::Null);
    let sent = if msg.shape == Shape::Request {
        let progress = msg.value.pointer("/params/_meta/progressToken");
        session.request(&id, progress, bytes).map(Some)
    } else {
        session.send(bytes).map(|()| None)
    };
    let waiting = match sent {
        Ok(Some(w)) => w,
        Ok(None) => {
            return Ok(Response::builder()
                .status(StatusCode::ACCEPTED)
                .body(Body::empty())
                .unwrap_or_else(|_| plain(StatusCode::ACCEPTED, "")))
        }
        Err(e) => {
            if opened {
                ctx.gw.close_session(&session);
            }
            return Err(send_refusal(e).id(id));
        }
    };
    answer(ctx, session, waiting, id, opened, slot).await
}

pub(crate) fn send_refusal(e: SendError) -> Refusal {
    match e {
        SendError::DuplicateId => Refusal::new(
            StatusCode::BAD_REQUEST,
            INVALID_REQUEST,
            Reason::HttpDuplicateId,
            "a request with this id is in flight already",
        ),
        SendError::Busy => Refusal::new(
            StatusCode::SERVICE_UNAVAILABLE,
            TRANSPORT_ERROR,
            Reason::HttpSessionBusy,
            "the session is busy: retry shortly",
        )
        .header("retry-after", "1"),
        SendError::Ended => Refusal::new(
            StatusCode::NOT_FOUND,
            SESSION_NOT_FOUND,
            Reason::HttpSessionUnknown,
            "Session not found",
        ),
    }
}

/// Opens a session for the client on the server: a relay and a sandbox of
/// their own.
async fn open_session(ctx: &Ctx, task: Option<&str>) -> Result<Arc<McpSession>, Refusal> {
    ctx.gw
        .open_session(&ctx.client.name, &ctx.server, task, false)
        .await
        .map_err(open_refusal)
}

/// Why a session could not be opened, for the client.
pub(crate) fn open_refusal(refused: crate::OpenRefused) -> Refusal {
    let crate::OpenRefused { reason, step } = refused;
    match reason {
        Reason::HttpSessionLimit => Refusal::new(
            StatusCode::TOO_MANY_REQUESTS,
            TRANSPORT_ERROR,
            reason,
            "this client has too many open sessions: end one (DELETE) first",
        ),
        Reason::HttpSandboxLimit => Refusal::new(
            StatusCode::TOO_MANY_REQUESTS,
            TRANSPORT_ERROR,
            reason,
            "this client has as many sandboxes as limits.max_sandboxes_per_client allows: destroy one (mcpbox sandboxes destroy) or reuse a task",
        ),
        Reason::HttpSandboxDestroying => Refusal::new(
            StatusCode::SERVICE_UNAVAILABLE,
            TRANSPORT_ERROR,
            reason,
            "the sandbox of this client and task is being destroyed: retry once it is gone (a new one is made)",
        )
        .header("retry-after", "1"),
        _ => Refusal::new(
            StatusCode::SERVICE_UNAVAILABLE,
            TRANSPORT_ERROR,
            reason,
            match step {
                Some(step) => format!(
                    "the server could not be started ({step}); the gateway's log says more"
                ),
                None => "the server could not be started; the gateway's log says why".into(),
            },
        ),
    }
}

/// Streams the request's messages as server-sent events, ending with its
/// answer. Always a stream, even for an answer that is ready at once: the
/// messages a server sends before it (progress, logging, sampling,
/// elicitation) then have a place to go, and clients must accept both.
async fn answer(
    ctx: &Ctx,
    session: Arc<McpSession>,
    waiting: Waiting,
    id: Value,
    opened: bool,
    slot: crate::limits::Slot,
) -> Result<Response<Body>, Refusal> {
    let gw = ctx.gw.clone();
    let sid = HeaderValue::from_str(&session.id).ok();
    let on_answer = move |m: Vec<u8>| {
        if opened && !initialized(&session, &m) {
            gw.close_session(&session);
        }
        m
    };
    let mut r = request_stream(waiting, slot, id, None, |m: Vec<u8>| m, on_answer, || {});
    if let (true, Some(v)) = (opened, sid) {
        r.headers_mut().insert(SESSION_HEADER, v);
    }
    Ok(r)
}

/// A request's event stream: `first` (a message already taken) and every
/// message before the answer, each through `message`, then the answer
/// through `answer`; an SSE comment when it was quiet for
/// [`KEEPALIVE_EVERY`]. `gone` runs when the client left before the
/// answer (dropping `waiting` then forgets the request).
pub(crate) fn request_stream(
    mut waiting: Waiting,
    slot: crate::limits::Slot,
    id: Value,
    first: Option<Held>,
    mut message: impl FnMut(Vec<u8>) -> Vec<u8> + Send + 'static,
    mut answer: impl FnMut(Vec<u8>) -> Vec<u8> + Send + 'static,
    gone: impl FnOnce() + Send + 'static,
) -> Response<Body> {
    let (tx, rx) = tokio::sync::mpsc::channel::<Chunk>(SSE_CHUNKS);
    tokio::spawn(async move {
        let _slot = slot;
        if let Some(m) = first {
            let (m, charge) = m.into_parts();
            if tx
                .send(Chunk::new(sse_event(&message(m)), charge))
                .await
                .is_err()
            {
                gone();
                return;
            }
        }
        loop {
            // a client that left is noticed at once, not at the next event
            let next = tokio::select! {
                () = tx.closed() => {
                    gone();
                    return;
                }
                next = tokio::time::timeout(KEEPALIVE_EVERY, waiting.rx.recv()) => next,
            };
            let (event, last) = match next {
                Err(_) => (Chunk::own(Bytes::from_static(KEEPALIVE)), false),
                // the session ended without answering
                Ok(None) => (Chunk::own(sse_event(&ended_error(&id))), true),
                Ok(Some(Out::Message(m))) => {
                    waiting.took();
                    let (m, charge) = m.into_parts();
                    (Chunk::new(sse_event(&message(m)), charge), false)
                }
                Ok(Some(Out::Final(m))) => {
                    let (m, charge) = m.into_parts();
                    (Chunk::new(sse_event(&answer(m)), charge), true)
                }
            };
            if tx.send(event).await.is_err() {
                if !last {
                    gone();
                }
                return;
            }
            if last {
                return;
            }
        }
    });
    sse_response(rx)
}

/// A stream of whole messages nobody asked for (a GET stream), as
/// server-sent events, with an SSE comment when it was quiet for
/// [`KEEPALIVE_EVERY`]; it ends when `events` does.
pub(crate) fn event_stream(
    mut events: tokio::sync::mpsc::Receiver<Held>,
    slot: crate::limits::Slot,
) -> Response<Body> {
    let (tx, rx) = tokio::sync::mpsc::channel::<Chunk>(SSE_CHUNKS);
    tokio::spawn(async move {
        let _slot = slot;
        loop {
            let next = tokio::select! {
                () = tx.closed() => return,
                next = tokio::time::timeout(KEEPALIVE_EVERY, events.recv()) => next,
            };
            let event = match next {
                Err(_) => Chunk::own(Bytes::from_static(KEEPALIVE)),
                Ok(None) => return,
                Ok(Some(m)) => {
                    let (m, charge) = m.into_parts();
                    Chunk::new(sse_event(&m), charge)
                }
            };
            if tx.send(event).await.is_err() {
                return;
            }
        }
    });
    sse_response(rx)
}

/// For `initialize`: whether the answer opened the session (a result with
/// a protocol version, which is then recorded).
fn initialized(session: &McpSession, answer: &[u8]) -> bool {
    let v: Value = serde_json::from_slice(answer).unwrap_or(Value::Null);
    match v.pointer("/result/protocolVersion").and_then(Value::as_str) {
        Some(version) => {
            session.set_version(version);
            true
        }
        None => false,
    }
}

pub(crate) fn ended_error(id: &Value) -> Vec<u8> {
    let e = json!({
        "jsonrpc": "2.0",
        "id": id,
        "error": {
            "code": mcpbox_gateway::CODE_SERVER_EXITED,
            "message": "the session ended before the server answered",
            "data": {"reason": Reason::ServerExited.as_str(), "source": mcpbox_policy::Source::Mcpbox},
        },
    });
    serde_json::to_vec(&e).unwrap_or_default()
}

pub(crate) fn sse_response(rx: tokio::sync::mpsc::Receiver<Chunk>) -> Response<Body> {
    let mut r = Response::new(Body::stream(rx));
    let h = r.headers_mut();
    h.insert(CONTENT_TYPE, HeaderValue::from_static("text/event-stream"));
    h.insert("cache-control", HeaderValue::from_static("no-cache"));
    r
}

/// GET: the session's stream of messages nobody asked for.
fn get(ctx: &Ctx, req: &Request<Incoming>) -> Result<Response<Body>, Refusal> {
    let headers = req.headers();
    if !accepts(headers, "text/event-stream") {
        return Err(Refusal::new(
            StatusCode::NOT_ACCEPTABLE,
            TRANSPORT_ERROR,
            Reason::HttpAccept,
            "Not Acceptable: Accept must list text/event-stream",
        ));
    }
    check_version(headers)?;
    let session = find_session(ctx, headers)?;
    let Some(slot) = ctx.gw.limits_of(&ctx.client.name).stream() else {
        return Err(Refusal::new(
            StatusCode::TOO_MANY_REQUESTS,
            TRANSPORT_ERROR,
            Reason::HttpStreamLimit,
            "this client has too many open streams",
        ));
    };
    let events = match session.open_stream() {
        Ok(rx) => rx,
        Err(StreamError::Ended) => return Err(send_refusal(SendError::Ended)),
    };
    Ok(event_stream(events, slot))
}

/// DELETE: the client ends its session; the sandbox is torn down.
async fn delete(ctx: &Ctx, req: &Request<Incoming>) -> Result<Response<Body>, Refusal> {
    let session = find_session(ctx, req.headers())?;
    ctx.gw.close_session(&session);
    Ok(plain(StatusCode::OK, ""))
}

impl Gateway {
    /// Records a request refused after the client was known.
    pub(crate) fn audit_access(&self, client: &str, server: &str, reason: Reason, detail: Value) {
        tracing::warn!(client, server, reason = reason.as_str(), "request refused");
        self.backend.audit(AuditEvent {
            kind: Some(Kind::Access),
            caller: client.to_string(),
            server: server.to_string(),
            decision: Some(Verdict::Deny),
            reason: Some(reason.as_str().to_string()),
            source: Some(mcpbox_policy::Source::Serve.to_string()),
            detail,
            ..AuditEvent::default()
        });
    }
}
