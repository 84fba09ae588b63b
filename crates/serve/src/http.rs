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

//!
//! This module is the top of the HTTP face: it depends on the endpoints
//! ([`crate::modern`], [`crate::aggregate`]) and on what they share
//! (`reply.rs`); none of them depends on it. One lookup of a
//! session id (`find`) and one GET and one DELETE serve both a server's
//! endpoint and `/mcp`.

use std::convert::Infallible;
use std::sync::Arc;
use std::time::Instant;

use bytes::Bytes;
use http_body_util::BodyExt;
use hyper::header::{HeaderMap, HeaderValue, CONTENT_TYPE, HOST};
use hyper::{Method, Request, Response, StatusCode};
use mcpbox_audit::{Event as AuditEvent, Kind, Verdict};
use mcpbox_gateway::message::{Invalid, Message, Shape};
use mcpbox_policy::mcp::code::{INVALID_REQUEST, PARSE_ERROR, TRANSPORT_ERROR};
use mcpbox_policy::Reason;
use serde_json::{json, Value};

use crate::aggregate::Aggregate;
use crate::body::Body;
use crate::reply::{
    accepted, accepts, bad_task, check_version, event_stream, header, initialize_task, one_line,
    open_refusal, plain, request_stream, send_refusal, session_not_found, Ctx, Refusal,
};
use crate::session::{McpSession, SendError, StreamError, Waiting};
use crate::settings::{digest, ClientSettings};
use crate::Gateway;

pub use crate::reply::{SESSION_HEADER, VERSION_HEADER};

/// What a request body must be to be served: hyper's, or in tests a
/// whole body ([`http_body_util::Full`]), so the service is called
/// without a socket.
pub trait RequestBody: hyper::body::Body<Data = Bytes, Error = Self::Err> + Send + 'static {
    /// The body's error.
    type Err: Into<Box<dyn std::error::Error + Send + Sync>>;
}

impl<B> RequestBody for B
where
    B: hyper::body::Body<Data = Bytes> + Send + 'static,
    B::Error: Into<Box<dyn std::error::Error + Send + Sync>>,
{
    type Err = B::Error;
}

/// Answers one request and counts it.
pub async fn handle<B: RequestBody>(
    gw: Arc<Gateway>,
    req: Request<B>,
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

async fn route<B: RequestBody>(
    gw: &Arc<Gateway>,
    req: Request<B>,
) -> Result<Response<Body>, Refusal> {
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
    if crate::gate::host(headers, &gw.settings.allowed_hosts).is_none() {
        let host = header(headers, HOST).unwrap_or("");
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
    if let Err(origin) = crate::gate::origin(headers, &gw.settings.allowed_origins) {
        tracing::warn!(origin = ?origin, "request from a foreign origin refused");
        return Err(Refusal::new(
            StatusCode::FORBIDDEN,
            TRANSPORT_ERROR,
            Reason::HttpOriginRefused,
            "Origin not accepted (see listen.allowed_origins)",
        )
        .header("connection", "close"));
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
        Method::GET => get(&ctx, req.headers()),
        Method::DELETE => delete(&ctx, req.headers()),
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
    let presented = match crate::gate::bearer(headers) {
        Ok(token) => token.map(|t| digest(t.as_bytes())),
        Err(crate::gate::Malformed) => {
            return Err(unauthorized(
                Reason::HttpTokenInvalid,
                "Authorization must be `Bearer <token>`",
            ))
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

/// What a session id names on the request's endpoint: a session of a
/// server, or an aggregate on `/mcp`.
enum Endpoint {
    Session(Arc<McpSession>),
    Aggregate(Arc<Aggregate>),
}

impl Endpoint {
    /// Whose it is: (client, server; empty for `/mcp`).
    fn owner(&self) -> (&str, &str) {
        match self {
            Endpoint::Session(s) => (&s.client, &s.server),
            Endpoint::Aggregate(a) => (&a.client, ""),
        }
    }

    fn ended(&self) -> bool {
        match self {
            Endpoint::Session(s) => s.ended(),
            Endpoint::Aggregate(a) => a.ended(),
        }
    }
}

/// The live session the request names, if it is this client's on this
/// endpoint (`/servers/<name>/mcp` or `/mcp`); anything else is the same
/// 404 (and audited when the id is another's), so ids cannot be probed.
fn find(ctx: &Ctx, headers: &HeaderMap) -> Result<Endpoint, Refusal> {
    let Some(sid) = header(headers, SESSION_HEADER) else {
        return Err(Refusal::new(
            StatusCode::BAD_REQUEST,
            TRANSPORT_ERROR,
            Reason::HttpSessionRequired,
            "Bad Request: Mcp-Session-Id header is required (send initialize first)",
        ));
    };
    let aggregated = ctx.server.is_empty();
    let found = if aggregated {
        ctx.gw.aggregate(sid).map(Endpoint::Aggregate)
    } else {
        ctx.gw.sessions.get(sid).map(Endpoint::Session)
    };
    let Some(found) = found else {
        return Err(session_not_found());
    };
    let (client, server) = found.owner();
    let theirs = client == ctx.client.name && server == ctx.server;
    if theirs && !found.ended() {
        return Ok(found);
    }
    if !theirs {
        let mut detail = json!({"session_of_other_client": client != ctx.client.name});
        if aggregated {
            detail["endpoint"] = json!("/mcp");
        }
        ctx.gw.audit_access(
            &ctx.client.name,
            &ctx.server,
            Reason::HttpSessionUnknown,
            detail,
        );
    }
    if let Endpoint::Aggregate(a) = &found {
        if a.ended() {
            ctx.gw.forget_aggregate(&a.id);
        }
    }
    Err(session_not_found())
}

async fn read_body<B: RequestBody>(ctx: &Ctx, req: Request<B>) -> Result<Bytes, Refusal> {
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
async fn read_message<B: RequestBody>(
    ctx: &Ctx,
    req: Request<B>,
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

/// A POST, on either endpoint: the stateless revision's requests, the
/// `initialize` that opens a session, or a message of a session.
async fn post<B: RequestBody>(
    ctx: &Ctx,
    req: Request<B>,
    slot: crate::limits::Slot,
) -> Result<Response<Body>, Refusal> {
    let (headers, msg, bytes) = read_message(ctx, req).await?;
    let aggregated = ctx.server.is_empty();
    if crate::modern::is_modern(&msg, &headers)? {
        // an unknown revision in a 2026-07-28 envelope is the server's to
        // refuse, with the versions it speaks (-32022)
        return if aggregated {
            crate::aggregate::stateless(ctx, msg, &bytes, slot).await
        } else {
            crate::modern::post(ctx, msg, slot).await
        };
    }
    let msg_id = msg.id().cloned().unwrap_or(Value::Null);
    check_version(&headers).map_err(|r| r.id(msg_id.clone()))?;
    let is_init = msg.shape == Shape::Request && msg.method() == Some("initialize");
    if is_init && header(&headers, SESSION_HEADER).is_some() {
        return Err(Refusal::new(
            StatusCode::BAD_REQUEST,
            INVALID_REQUEST,
            Reason::RequestInvalid,
            "initialize opens a new session: send it without Mcp-Session-Id",
        )
        .id(msg_id));
    }
    if is_init && aggregated {
        return crate::aggregate::initialize(ctx, msg).await;
    }
    let (session, opened) = if is_init {
        let task = initialize_task(ctx, &msg).map_err(|r| r.id(msg_id.clone()))?;
        (open_session(ctx, task.as_deref()).await?, true)
    } else {
        // any revision the gateway speaks is taken in the header (clients
        // and the conformance suite send older ones on a newer session)
        match find(ctx, &headers)? {
            Endpoint::Aggregate(agg) => {
                return crate::aggregate::post(ctx, agg, msg, &bytes, slot).await
            }
            Endpoint::Session(s) => (s, false),
        }
    };
    let bytes = one_line(&bytes, &msg);
    let id = msg.id().cloned().unwrap_or(Value::Null);
    let sent = if msg.shape == Shape::Request {
        let progress = msg.value.pointer("/params/_meta/progressToken");
        session.request(&id, progress, bytes).map(Some)
    } else {
        session.send(bytes).map(|()| None)
    };
    let waiting = match sent {
        Ok(Some(w)) => w,
        Ok(None) => return Ok(accepted()),
        Err(e) => {
            if opened {
                ctx.gw.close_session(&session);
            }
            return Err(send_refusal(e).id(id));
        }
    };
    answer(ctx, session, waiting, id, opened, slot).await
}

/// Opens a session for the client on the server: a relay and a sandbox of
/// their own.
async fn open_session(ctx: &Ctx, task: Option<&str>) -> Result<Arc<McpSession>, Refusal> {
    ctx.gw
        .open_session(&ctx.client.name, &ctx.server, task, false)
        .await
        .map_err(open_refusal)
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

/// GET, on either endpoint: the session's stream of messages nobody
/// asked for (a session may have several, each message goes to the
/// newest; an aggregate one, 409 for a second).
fn get(ctx: &Ctx, headers: &HeaderMap) -> Result<Response<Body>, Refusal> {
    if !accepts(headers, "text/event-stream") {
        return Err(Refusal::new(
            StatusCode::NOT_ACCEPTABLE,
            TRANSPORT_ERROR,
            Reason::HttpAccept,
            "Not Acceptable: Accept must list text/event-stream",
        ));
    }
    check_version(headers)?;
    let found = find(ctx, headers)?;
    let Some(slot) = ctx.gw.limits_of(&ctx.client.name).stream() else {
        return Err(Refusal::new(
            StatusCode::TOO_MANY_REQUESTS,
            TRANSPORT_ERROR,
            Reason::HttpStreamLimit,
            "this client has too many open streams",
        ));
    };
    let opened = match &found {
        Endpoint::Session(s) => s.open_stream(),
        Endpoint::Aggregate(a) => a.open_stream(),
    };
    match opened {
        Ok(events) => Ok(event_stream(events, slot)),
        Err(StreamError::Ended) => Err(send_refusal(SendError::Ended)),
        Err(StreamError::Taken) => Err(Refusal::new(
            StatusCode::CONFLICT,
            TRANSPORT_ERROR,
            Reason::HttpStreamLimit,
            "Conflict: this session has an open stream already",
        )),
    }
}

/// DELETE, on either endpoint: the client ends its session; the sandbox
/// (every member's, on `/mcp`) is torn down.
fn delete(ctx: &Ctx, headers: &HeaderMap) -> Result<Response<Body>, Refusal> {
    match find(ctx, headers)? {
        Endpoint::Session(s) => ctx.gw.close_session(&s),
        Endpoint::Aggregate(a) => {
            ctx.gw.forget_aggregate(&a.id);
            a.close(&ctx.gw);
        }
    }
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

/// The service called directly, without a socket (as axum's tests call a
/// router with tower's `oneshot`): each check of the gate, in order.
#[cfg(test)]
mod tests {
    use std::sync::Mutex;

    use http_body_util::Full;

    use super::*;
    use crate::settings::Settings;
    use crate::{Backend, Open, OpenError, Opened};

    /// A backend whose servers never start, and which keeps its records.
    #[derive(Default)]
    struct Failing {
        audits: Mutex<Vec<AuditEvent>>,
    }

    impl Backend for Failing {
        fn open(&self, _open: &Open) -> Result<Opened, OpenError> {
            Err(OpenError::Failed(
                "creating /tmp/mcpbox-0/sb-1: File exists (os error 17)".into(),
            ))
        }

        fn audit(&self, event: AuditEvent) {
            self.audits.lock().unwrap().push(event);
        }
    }

    const HOST: &str = "127.0.0.1:8787";
    const TOKEN: &str = "t0ken";

    fn gateway() -> (Arc<Gateway>, Arc<Failing>) {
        let mut s = Settings::new(HOST.parse().unwrap(), false, &[], &[]);
        s.servers = vec!["a".into(), "b".into()];
        s.clients = vec![ClientSettings::with_token("alice", TOKEN, vec!["a".into()])];
        let backend = Arc::new(Failing::default());
        (Gateway::new(s, backend.clone()), backend)
    }

    /// A request with the headers a well-behaved client sends, then
    /// `extra` (a header given an empty value is left out).
    fn request(
        method: &str,
        path: &str,
        extra: &[(&str, &str)],
        body: &str,
    ) -> Request<Full<Bytes>> {
        let mut headers = vec![
            ("host", HOST.to_string()),
            ("authorization", format!("Bearer {TOKEN}")),
            ("content-type", "application/json".into()),
            ("accept", "application/json, text/event-stream".into()),
        ];
        for (k, v) in extra {
            headers.retain(|(h, _)| h != k);
            if !v.is_empty() {
                headers.push((k, v.to_string()));
            }
        }
        let mut b = Request::builder().method(method).uri(path);
        for (k, v) in headers {
            b = b.header(k, v);
        }
        b.body(Full::new(Bytes::from(body.to_string()))).unwrap()
    }

    async fn call(gw: &Arc<Gateway>, req: Request<Full<Bytes>>) -> (StatusCode, HeaderMap, Value) {
        let resp = handle(gw.clone(), req).await.unwrap();
        let (parts, body) = resp.into_parts();
        let bytes = body.collect().await.unwrap().to_bytes();
        let v = serde_json::from_slice(&bytes).unwrap_or(Value::Null);
        (parts.status, parts.headers, v)
    }

    /// (method, path, headers changed, body, status, reason)
    type Case<'a> = (
        &'a str,
        &'a str,
        &'a [(&'a str, &'a str)],
        &'a str,
        u16,
        &'a str,
    );

    const LIST: &str = r#"{"jsonrpc":"2.0","id":1,"method":"tools/list"}"#;

    #[tokio::test]
    async fn each_check_of_the_gate_refuses_with_its_status_and_reason() {
        let (gw, _) = gateway();
        let s = "/servers/a/mcp";
        // (method, path, headers changed, body, status, reason)
        let cases: &[Case] = &[
            (
                "POST",
                s,
                &[("host", "evil.example:8787")],
                LIST,
                403,
                "http.host_refused",
            ),
            (
                "POST",
                s,
                &[("origin", "http://evil.example")],
                LIST,
                403,
                "http.origin_refused",
            ),
            (
                "POST",
                s,
                &[("authorization", "")],
                LIST,
                401,
                "http.token_missing",
            ),
            (
                "POST",
                s,
                &[("authorization", "Bearer nope")],
                LIST,
                401,
                "http.token_invalid",
            ),
            (
                "POST",
                s,
                &[("authorization", "Basic x")],
                LIST,
                401,
                "http.token_invalid",
            ),
            (
                "POST",
                "/servers/zz/mcp",
                &[],
                LIST,
                404,
                "http.server_unknown",
            ),
            (
                "POST",
                "/servers/b/mcp",
                &[],
                LIST,
                403,
                "http.server_forbidden",
            ),
            (
                "POST",
                s,
                &[("content-type", "text/plain")],
                LIST,
                415,
                "http.content_type",
            ),
            (
                "POST",
                s,
                &[("accept", "application/json")],
                LIST,
                406,
                "http.accept",
            ),
            (
                "POST",
                s,
                &[("mcp-protocol-version", "1999-01-01")],
                LIST,
                400,
                "http.protocol_version",
            ),
            ("POST", s, &[], "[1]", 400, "batch.refused"),
            ("POST", s, &[], "{", 400, "request.invalid"),
            ("POST", s, &[], LIST, 400, "http.session_required"),
            (
                "POST",
                s,
                &[("mcp-session-id", "00ff")],
                LIST,
                404,
                "http.session_unknown",
            ),
            (
                "POST",
                "/mcp",
                &[("mcp-session-id", "00ff")],
                LIST,
                404,
                "http.session_unknown",
            ),
            (
                "GET",
                s,
                &[("accept", "application/json")],
                "",
                406,
                "http.accept",
            ),
            (
                "GET",
                s,
                &[("accept", "text/event-stream")],
                "",
                400,
                "http.session_required",
            ),
            (
                "GET",
                "/mcp",
                &[("accept", "text/event-stream"), ("mcp-session-id", "00ff")],
                "",
                404,
                "http.session_unknown",
            ),
            ("DELETE", s, &[], "", 400, "http.session_required"),
            (
                "DELETE",
                "/mcp",
                &[("mcp-session-id", "00ff")],
                "",
                404,
                "http.session_unknown",
            ),
            (
                "POST",
                s,
                &[("mcpbox-task", "../x")],
                LIST,
                400,
                "http.task_invalid",
            ),
        ];
        for (method, path, extra, body, status, reason) in cases {
            let (got, _, v) = call(&gw, request(method, path, extra, body)).await;
            assert_eq!(got.as_u16(), *status, "{method} {path} {extra:?}: {v}");
            assert_eq!(
                v["error"]["data"]["reason"], *reason,
                "{method} {path} {extra:?}"
            );
            assert_eq!(v["error"]["data"]["source"], "mcpbox");
        }
    }

    #[tokio::test]
    async fn a_refusal_before_the_client_is_known_closes_the_connection() {
        let (gw, _) = gateway();
        let (status, headers, _) = call(
            &gw,
            request("POST", "/servers/a/mcp", &[("authorization", "")], LIST),
        )
        .await;
        assert_eq!(status, StatusCode::UNAUTHORIZED);
        assert_eq!(header(&headers, "connection"), Some("close"));
        assert_eq!(
            header(&headers, "www-authenticate"),
            Some(r#"Bearer realm="mcpbox""#)
        );
        let (status, headers, _) = call(&gw, request("GET", "/healthz", &[("host", "")], "")).await;
        assert_eq!(status, StatusCode::OK);
        assert_eq!(header(&headers, "connection"), None);
        let (status, headers, _) = call(&gw, request("PUT", "/mcp", &[], "")).await;
        assert_eq!(status, StatusCode::METHOD_NOT_ALLOWED);
        assert_eq!(header(&headers, "allow"), Some("GET, POST, DELETE"));
    }

    #[tokio::test]
    async fn a_foreign_server_is_audited_and_a_failed_start_names_only_its_step() {
        let (gw, backend) = gateway();
        call(&gw, request("POST", "/servers/b/mcp", &[], LIST)).await;
        {
            let audits = backend.audits.lock().unwrap();
            assert_eq!(audits.len(), 1);
            assert_eq!(audits[0].caller, "alice");
            assert_eq!(audits[0].server, "b");
            assert_eq!(audits[0].reason.as_deref(), Some("http.server_forbidden"));
        }
        let init = r#"{"jsonrpc":"2.0","id":7,"method":"initialize","params":{"protocolVersion":"2025-11-25","capabilities":{},"clientInfo":{"name":"t","version":"0"}}}"#;
        for path in ["/servers/a/mcp", "/mcp"] {
            let (status, headers, v) = call(&gw, request("POST", path, &[], init)).await;
            assert_eq!(status, StatusCode::SERVICE_UNAVAILABLE, "{path}: {v}");
            assert_eq!(
                v["error"]["data"]["reason"], "http.session_failed",
                "{path}"
            );
            let text = v["error"]["message"].as_str().unwrap();
            assert!(text.contains("creating …/sb-1"), "{text}");
            assert!(!text.contains("/tmp"), "{text}");
            assert_eq!(header(&headers, SESSION_HEADER), None);
        }
        assert!(gw.sessions.is_empty());
        // initialize with a session id is refused before anything opens
        let (status, _, v) = call(
            &gw,
            request("POST", "/mcp", &[("mcp-session-id", "00ff")], init),
        )
        .await;
        assert_eq!(status, StatusCode::BAD_REQUEST);
        assert_eq!(v["id"], 7);
    }
}
