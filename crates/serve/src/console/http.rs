//! The console's HTTP face: the accept loop with its limits, and every
//! request's checks in order (Host, then for a POST its Origin and
//! `Sec-Fetch-Site`, then the token), before `api.rs` sees it.

// A refusal is the response itself, built once per request: boxing it
// would buy nothing.
#![allow(clippy::result_large_err)]

use std::collections::HashMap;
use std::convert::Infallible;
use std::sync::Arc;

use crate::gate;
use bytes::Bytes;
use http_body_util::{BodyExt, Full, Limited};
use hyper::body::Incoming;
use hyper::header::{self, HeaderMap, HeaderValue};
use hyper::{Method, Request, Response, StatusCode};
use hyper_util::rt::{TokioIo, TokioTimer};
use serde_json::{json, Value};

use super::admission::{Admission, Id, Promote};
use super::Parts;

/// At most this many long polls wait in the broker at once (each holds a
/// blocking thread); more are answered at once.
pub const MAX_POLLS: usize = 8;
/// A request body's limit.
const MAX_BODY: usize = 64 * 1024;

const INDEX: &str = include_str!("assets/index.html");
const SCRIPT: &str = include_str!("assets/console.js");
const STYLE: &str = include_str!("assets/console.css");

/// No inline script or style, nothing from elsewhere, no framing, no form
/// posting anywhere.
const CSP: &str = "default-src 'self'; script-src 'self'; style-src 'self'; img-src 'self'; \
     connect-src 'self'; object-src 'none'; base-uri 'none'; form-action 'none'; \
     frame-ancestors 'none'";

/// The console's shared state.
pub struct Console {
    pub parts: Parts,
    /// The token (the cookie's value once traded), and its digest, which
    /// presented tokens are compared with.
    token: String,
    token_digest: [u8; 32],
    port: u16,
    /// `Host` values that name this console.
    hosts: Vec<String>,
    /// The session cookie's name: with the port, so that two consoles
    /// (cookies are not kept apart by port) do not overwrite each other's.
    cookie: String,
    pub polls: tokio::sync::Semaphore,
    /// Which connections hold which place (see `admission.rs`), and how to
    /// wake each pending one when it is pushed out.
    gate: std::sync::Mutex<Gate>,
}

/// The admission core and the driver's wake-ups for it.
struct Gate {
    core: Admission,
    wake: HashMap<Id, Arc<tokio::sync::Notify>>,
}

impl Console {
    pub fn new(parts: Parts, token: String, port: u16) -> Console {
        Console {
            parts,
            token_digest: gate::digest(token.as_bytes()),
            token,
            port,
            hosts: vec![
                format!("127.0.0.1:{port}"),
                format!("localhost:{port}"),
                format!("[::1]:{port}"),
            ],
            cookie: format!("mcpbox_console_{port}"),
            polls: tokio::sync::Semaphore::new(MAX_POLLS),
            gate: std::sync::Mutex::new(Gate {
                core: Admission::new(super::MAX_PENDING, super::MAX_CONNECTIONS),
                wake: HashMap::new(),
            }),
        }
    }

    fn gate(&self) -> std::sync::MutexGuard<'_, Gate> {
        self.gate.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// A new connection: its id and what wakes it when it is pushed out;
    /// the connection it pushes out (the oldest pending) is woken to close.
    fn admit(&self) -> (Id, Arc<tokio::sync::Notify>) {
        let mut g = self.gate();
        let (id, out) = g.core.accept();
        if let Some(w) = out.and_then(|o| g.wake.remove(&o)) {
            w.notify_one();
        }
        let wake = Arc::new(tokio::sync::Notify::new());
        g.wake.insert(id, wake.clone());
        (id, wake)
    }

    /// Connection `id` presented the token: it takes an owner place, or
    /// its request is answered 503 (and the connection closed).
    fn promote(&self, id: Id) -> Result<(), Response<Full<Bytes>>> {
        match self.gate().core.promote(id) {
            Promote::Owner => Ok(()),
            Promote::Full => Err(error(
                StatusCode::SERVICE_UNAVAILABLE,
                format!(
                    "the console has {} connections with the token already; close some",
                    super::MAX_CONNECTIONS
                ),
            )),
            Promote::Gone => Err(error(
                StatusCode::SERVICE_UNAVAILABLE,
                "this connection was closed to make room for newer ones; connect again",
            )),
        }
    }

    fn is_owner(&self, id: Id) -> bool {
        self.gate().core.is_owner(id)
    }

    /// A pending connection's time is up: whether it must close.
    fn expire(&self, id: Id) -> bool {
        let mut g = self.gate();
        g.wake.remove(&id);
        g.core.expire(id)
    }

    fn close(&self, id: Id) {
        let mut g = self.gate();
        g.wake.remove(&id);
        g.core.close(id);
    }
}

/// Serves until `stop` fires.
///
/// Every connection is admitted (`admission.rs`): it starts pending, and
/// only a request with the token makes it an owner connection, kept alive.
/// A pending connection is closed after its first answer, after
/// [`PENDING_TIME`](super::PENDING_TIME) whatever it is doing (idle, a head
/// or a body one byte at a time), or at once when a newer connection
/// pushes it out. So connections without the token, however many and
/// however slow, never hold a place the owner needs.
pub async fn serve(
    console: Arc<Console>,
    listener: tokio::net::TcpListener,
    mut stop: tokio::sync::oneshot::Receiver<()>,
) {
    loop {
        tokio::select! {
            accepted = listener.accept() => {
                let stream = match accepted {
                    Ok((s, _)) => s,
                    Err(e) => {
                        tracing::warn!("console: accept failed: {e}");
                        tokio::time::sleep(std::time::Duration::from_millis(50)).await;
                        continue;
                    }
                };
                let (id, pushed_out) = console.admit();
                let c = console.clone();
                let svc = hyper::service::service_fn(move |req| {
                    let c = c.clone();
                    async move { Ok::<_, Infallible>(answer(c, id, req).await) }
                });
                let c = console.clone();
                tokio::spawn(async move {
                    let conn = hyper::server::conn::http1::Builder::new()
                        .timer(TokioTimer::new())
                        .header_read_timeout(super::HEADER_TIMEOUT)
                        .serve_connection(TokioIo::new(stream), svc);
                    tokio::pin!(conn);
                    let deadline = async {
                        tokio::select! {
                            () = pushed_out.notified() => {}
                            () = tokio::time::sleep(super::PENDING_TIME) => {}
                        }
                    };
                    let ended = tokio::select! {
                        r = conn.as_mut() => Some(r),
                        () = deadline => None,
                    };
                    let result = match ended {
                        Some(r) => r,
                        // still pending: dropping the connection closes it
                        None if c.expire(id) => return c.close(id),
                        // an owner connection: no deadline but hyper's
                        None => conn.await,
                    };
                    if let Err(e) = result {
                        tracing::debug!("console: connection ended: {e}");
                    }
                    c.close(id);
                });
                // Let the new connection read its head before the next
                // accept: on this one-thread runtime a burst of accepts
                // could otherwise push the owner's fresh connection out
                // before its request, already sent, is read.
                tokio::task::yield_now().await;
            }
            _ = &mut stop => break,
        }
    }
}

/// One request on connection `id`; the answer to any connection that does
/// not hold an owner place says `Connection: close`, and hyper closes it
/// once the answer is written.
async fn answer(c: Arc<Console>, id: Id, req: Request<Incoming>) -> Response<Full<Bytes>> {
    let mut r = handle(c.clone(), id, req).await;
    if !c.is_owner(id) {
        r.headers_mut()
            .insert(header::CONNECTION, HeaderValue::from_static("close"));
    }
    r
}

/// A response with the console's headers.
pub fn respond(
    status: StatusCode,
    content_type: &str,
    body: impl Into<Bytes>,
) -> Response<Full<Bytes>> {
    let mut r = Response::new(Full::new(body.into()));
    *r.status_mut() = status;
    let h = r.headers_mut();
    let set = |h: &mut HeaderMap, k: header::HeaderName, v: &str| {
        if let Ok(v) = HeaderValue::from_str(v) {
            h.insert(k, v);
        }
    };
    set(h, header::CONTENT_TYPE, content_type);
    set(h, header::CONTENT_SECURITY_POLICY, CSP);
    set(h, header::X_CONTENT_TYPE_OPTIONS, "nosniff");
    set(h, header::REFERRER_POLICY, "no-referrer");
    set(h, header::CACHE_CONTROL, "no-store");
    set(h, header::X_FRAME_OPTIONS, "DENY");
    set(
        h,
        header::HeaderName::from_static("cross-origin-opener-policy"),
        "same-origin",
    );
    set(
        h,
        header::HeaderName::from_static("cross-origin-resource-policy"),
        "same-origin",
    );
    r
}

/// A JSON response.
pub fn json_response(status: StatusCode, v: &Value) -> Response<Full<Bytes>> {
    respond(status, "application/json", v.to_string())
}

/// `{"error": msg}` with `status`.
pub fn error(status: StatusCode, msg: impl std::fmt::Display) -> Response<Full<Bytes>> {
    json_response(status, &json!({ "error": msg.to_string() }))
}

impl Console {
    /// Whether `given` is the token: compared as digests, in constant
    /// time, as the gateway compares its clients' tokens.
    fn is_token(&self, given: &str) -> bool {
        gate::token_matches(&self.token_digest, given)
    }

    /// The request's `Host`, when it names this console (lowercased).
    fn host(&self, h: &HeaderMap) -> Option<String> {
        gate::host(h, &self.hosts).map(String::from)
    }

    /// Whether the request carries the token, as a bearer or a cookie.
    fn authorized(&self, h: &HeaderMap) -> bool {
        gate::has_token(h, &self.token_digest, Some(&self.cookie))
    }

    /// A state change's checks: `Origin` exactly this console's origin as
    /// the browser reached it, `Sec-Fetch-Site` (when sent) same-origin.
    fn same_origin(&self, h: &HeaderMap, host: &str) -> Result<(), &'static str> {
        if h.get(header::ORIGIN).is_none() {
            return Err("a POST without an Origin header is refused");
        }
        if gate::origin(h, &[format!("http://{host}")]).is_err() {
            return Err("a POST from another origin is refused");
        }
        match h.get("sec-fetch-site").map(HeaderValue::as_bytes) {
            None | Some(b"same-origin") => Ok(()),
            Some(_) => Err("a POST that is not same-origin (Sec-Fetch-Site) is refused"),
        }
    }

    fn set_cookie(&self, value: &str, max_age: Option<u64>) -> String {
        let age = max_age.map_or(String::new(), |a| format!("; Max-Age={a}"));
        format!(
            "{}={value}; HttpOnly; SameSite=Strict; Path=/{age}",
            self.cookie
        )
    }
}

/// The query string as a map (last value wins; percent-decoded).
pub fn query(uri: &hyper::Uri) -> HashMap<String, String> {
    uri.query()
        .unwrap_or("")
        .split('&')
        .filter(|p| !p.is_empty())
        .map(|p| {
            let (k, v) = p.split_once('=').unwrap_or((p, ""));
            (decode(k), decode(v))
        })
        .collect()
}

/// `application/x-www-form-urlencoded` decoding (`+` and `%XX`); bad
/// escapes are kept as they are.
fn decode(s: &str) -> String {
    let b = s.as_bytes();
    let mut out = Vec::with_capacity(b.len());
    let mut i = 0;
    while i < b.len() {
        match b[i] {
            b'+' => out.push(b' '),
            b'%' if i + 2 < b.len() => match (
                mcpbox_policy::hex::digit(b[i + 1]),
                mcpbox_policy::hex::digit(b[i + 2]),
            ) {
                (Some(h), Some(l)) => {
                    out.push(h << 4 | l);
                    i += 2;
                }
                _ => out.push(b'%'),
            },
            c => out.push(c),
        }
        i += 1;
    }
    String::from_utf8_lossy(&out).into_owned()
}

/// Reads a JSON body (at most [`MAX_BODY`]); an empty body is `null`.
async fn body_json(req: Request<Incoming>) -> Result<Value, Response<Full<Bytes>>> {
    let bytes = match Limited::new(req.into_body(), MAX_BODY).collect().await {
        Ok(b) => b.to_bytes(),
        Err(_) => {
            return Err(error(
                StatusCode::PAYLOAD_TOO_LARGE,
                format!("the body is over {MAX_BODY} bytes or was cut short"),
            ))
        }
    };
    if bytes.iter().all(u8::is_ascii_whitespace) {
        return Ok(Value::Null);
    }
    serde_json::from_slice(&bytes).map_err(|e| {
        error(
            StatusCode::BAD_REQUEST,
            format!("the body is not JSON: {e}"),
        )
    })
}

/// One request, checked in order.
pub async fn handle(c: Arc<Console>, id: Id, req: Request<Incoming>) -> Response<Full<Bytes>> {
    let Some(host) = c.host(req.headers()) else {
        // DNS rebinding: a name of the attacker's that resolves to us
        return error(
            StatusCode::MISDIRECTED_REQUEST,
            format!(
                "this console answers to 127.0.0.1:{0}, localhost:{0} and [::1]:{0} only",
                c.port
            ),
        );
    };
    let method = req.method().clone();
    let path = req.uri().path().to_string();
    if method == Method::POST {
        if let Err(why) = c.same_origin(req.headers(), &host) {
            return error(StatusCode::FORBIDDEN, why);
        }
    } else if method == Method::GET || method == Method::HEAD {
        // a page of another site reading the API through the cookie
        // (SameSite=Strict keeps it from being sent anyway)
        let site = req
            .headers()
            .get("sec-fetch-site")
            .map(HeaderValue::as_bytes);
        if path.starts_with("/api/") && !matches!(site, None | Some(b"same-origin" | b"none")) {
            return error(StatusCode::FORBIDDEN, "a cross-site read is refused");
        }
    } else {
        return error(StatusCode::METHOD_NOT_ALLOWED, "GET or POST only");
    }
    // the token, wherever the request is going, makes this connection the
    // owner's (kept alive); past the checks above only
    if c.authorized(req.headers()) {
        if let Err(r) = c.promote(id) {
            return r;
        }
    }
    // the page itself holds no data: served without the token, which it
    // then sends to /login from the URL's fragment
    if method != Method::POST {
        match path.as_str() {
            "/" | "/index.html" => {
                return respond(StatusCode::OK, "text/html; charset=utf-8", INDEX)
            }
            "/console.js" => {
                return respond(StatusCode::OK, "text/javascript; charset=utf-8", SCRIPT)
            }
            "/console.css" => return respond(StatusCode::OK, "text/css; charset=utf-8", STYLE),
            _ => {}
        }
    }
    if method == Method::POST && path == "/login" {
        let body = match body_json(req).await {
            Ok(b) => b,
            Err(r) => return r,
        };
        let given = body.get("token").and_then(Value::as_str).unwrap_or("");
        if !c.is_token(given) {
            return error(StatusCode::UNAUTHORIZED, "wrong token");
        }
        if let Err(r) = c.promote(id) {
            return r;
        }
        let mut r = json_response(StatusCode::OK, &json!({"ok": true}));
        if let Ok(v) = HeaderValue::from_str(&c.set_cookie(&c.token, None)) {
            r.headers_mut().insert(header::SET_COOKIE, v);
        }
        return r;
    }
    if method == Method::POST && path == "/logout" {
        let mut r = json_response(StatusCode::OK, &json!({"ok": true}));
        if let Ok(v) = HeaderValue::from_str(&c.set_cookie("", Some(0))) {
            r.headers_mut().insert(header::SET_COOKIE, v);
        }
        return r;
    }
    if !path.starts_with("/api/") {
        return error(StatusCode::NOT_FOUND, "no such page");
    }
    if !c.authorized(req.headers()) {
        let mut r = error(
            StatusCode::UNAUTHORIZED,
            "missing or wrong token: open the URL mcpbox printed (with #token=...)",
        );
        r.headers_mut()
            .insert(header::WWW_AUTHENTICATE, HeaderValue::from_static("Bearer"));
        return r;
    }
    let q = query(req.uri());
    let segments: Vec<String> = path
        .trim_start_matches("/api/")
        .split('/')
        .map(decode)
        .collect();
    if method == Method::POST {
        let body = match body_json(req).await {
            Ok(b) => b,
            Err(r) => return r,
        };
        super::api::post(&c, &segments, body).await
    } else {
        super::api::get(&c, &segments, &q).await
    }
}

/// The embedded script, for the test that no HTML sink is used.
#[cfg(test)]
pub fn tests_script() -> &'static str {
    SCRIPT
}

#[cfg(test)]
mod tests {
    #[test]
    fn decoding_a_query() {
        assert_eq!(super::decode("a%20b+c"), "a b c");
        assert_eq!(super::decode("%zz%"), "%zz%");
        assert_eq!(super::decode("%3C"), "<");
    }
}
