//! What the endpoints answer with, shared by `/servers/<name>/mcp`
//! ([`crate::http`]), the stateless revision ([`crate::modern`]) and `/mcp`
//! ([`crate::aggregate`]): refusals ([`Refusal`]), the request's context
//! once it passed the gate ([`Ctx`]), the header checks every endpoint
//! makes the same way, a request's event stream ([`request_stream`]), the
//! GET stream ([`event_stream`]) and the one way an answer forwarded under
//! our id is given back ([`restore`]).
//!
//! It sits below the endpoints and depends on none of them: `http` →
//! `modern`, `aggregate` → `reply` → `session` → `route`.

use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use hyper::header::{HeaderMap, HeaderValue, ACCEPT, CONTENT_TYPE};
use hyper::{Response, StatusCode};
use mcpbox_gateway::message::{to_line, Message};
use mcpbox_policy::mcp::code::{INVALID_REQUEST, SESSION_NOT_FOUND, TRANSPORT_ERROR};
use mcpbox_policy::mcp::{self, IdPair};
use mcpbox_policy::Reason;
use serde_json::{json, Value};
use tokio::sync::mpsc;

use crate::body::{sse_event, Body, Chunk, KEEPALIVE};
use crate::budget::Held;
use crate::session::{Out, SendError, Waiting};
use crate::settings::ClientSettings;
use crate::Gateway;

/// The header that carries the session id.
pub const SESSION_HEADER: &str = "mcp-session-id";
/// The header that carries the protocol revision.
pub const VERSION_HEADER: &str = "mcp-protocol-version";

/// Events between a stream's task and hyper (each charged to its
/// session's budget until hyper takes it).
const SSE_CHUNKS: usize = 64;
/// An SSE comment goes out when a stream was quiet this long.
pub(crate) const KEEPALIVE_EVERY: Duration = Duration::from_secs(15);

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

    pub(crate) fn into_response(self, gw: &Gateway) -> Response<Body> {
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

pub(crate) fn header(headers: &HeaderMap, name: impl hyper::header::AsHeaderName) -> Option<&str> {
    headers.get(name).and_then(|v| v.to_str().ok())
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

pub(crate) fn bad_task(why: String) -> Refusal {
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
        Some(v) if mcp::is_revision(v.trim()) => Ok(Some(v.trim().to_string())),
        Some(v) => Err(Refusal::new(
            StatusCode::BAD_REQUEST,
            TRANSPORT_ERROR,
            Reason::HttpProtocolVersion,
            format!(
                "unsupported MCP-Protocol-Version {v:?}; supported: {}",
                mcp::REVISIONS.join(", ")
            ),
        )),
    }
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
        SendError::Ended => session_not_found(),
    }
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

/// 202: a notification or a response taken.
pub(crate) fn accepted() -> Response<Body> {
    Response::builder()
        .status(StatusCode::ACCEPTED)
        .body(Body::empty())
        .unwrap_or_else(|_| plain(StatusCode::ACCEPTED, ""))
}

/// One JSON document.
pub(crate) fn json_response(status: StatusCode, bytes: Vec<u8>) -> Response<Body> {
    let mut r = Response::new(Body::full(bytes));
    *r.status_mut() = status;
    r.headers_mut()
        .insert(CONTENT_TYPE, HeaderValue::from_static("application/json"));
    r
}

/// One event stream with one answer (and the session id it opened).
pub(crate) fn single(answer: &Value, sid: Option<&str>) -> Response<Body> {
    let (tx, rx) = mpsc::channel::<Chunk>(1);
    let _ = tx.try_send(Chunk::own(sse_event(&to_line(answer))));
    let mut r = sse_response(rx);
    if let Some(v) = sid.and_then(|s| HeaderValue::from_str(s).ok()) {
        r.headers_mut().insert(SESSION_HEADER, v);
    }
    r
}

/// The way back of a request forwarded under our id: the client's id on
/// the answer and on a `subscriptions/listen` stream's notifications
/// ([`IdPair::back`]); for a request of the stateless revision (`stamp`:
/// whether its result is cacheable), the answer's result completed as that
/// revision requires ([`complete_result`]). Both the stateless endpoint
/// and `/mcp` give answers back through here.
pub(crate) fn restore(line: &[u8], ids: &IdPair, stamp: Option<bool>) -> Vec<u8> {
    let Ok(mut v) = serde_json::from_slice::<Value>(line) else {
        return line.to_vec();
    };
    if ids.back(&mut v) {
        if let Some(cacheable) = stamp {
            complete_result(&mut v, cacheable);
        }
    }
    to_line(&v)
}

/// The methods whose results the stateless revision makes cacheable
/// (`ttlMs`, `cacheScope` required).
pub(crate) fn is_cacheable(method: &str) -> bool {
    matches!(
        method,
        "tools/list"
            | "prompts/list"
            | "resources/list"
            | "resources/templates/list"
            | "resources/read"
            | "server/discover"
    )
}

/// Completes an answer's result as the stateless revision requires, where
/// a server of an older one left it out: `resultType` (`complete`) and,
/// on a cacheable result, `ttlMs` 0 and `cacheScope` `private` (not
/// cached: what a client sees is filtered for it by policy). An error is
/// left as it is.
pub(crate) fn complete_result(answer: &mut Value, cacheable: bool) {
    if let Some(r) = answer.get_mut("result").and_then(Value::as_object_mut) {
        r.entry("resultType")
            .or_insert_with(|| Value::String("complete".into()));
        if cacheable && r.get("resultType") == Some(&json!("complete")) {
            r.entry("ttlMs").or_insert_with(|| json!(0));
            r.entry("cacheScope").or_insert_with(|| json!("private"));
        }
    }
}

/// Whether `msg` carries the stateless revision's envelope.
pub(crate) fn is_stateless_request(msg: &Message) -> bool {
    msg.value
        .pointer("/params/_meta")
        .is_some_and(|m| m.get(mcp::META_PROTOCOL_VERSION).is_some())
}

/// The one 404 for a session id that names no live session of this client.
pub(crate) fn session_not_found() -> Refusal {
    Refusal::new(
        StatusCode::NOT_FOUND,
        SESSION_NOT_FOUND,
        Reason::HttpSessionUnknown,
        "Session not found",
    )
}

impl Gateway {
    /// A fresh id for a request the gateway forwards under its own.
    pub(crate) fn our_id(&self) -> Value {
        json!(format!("mcpbox-{}", self.next_id()))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ids() -> IdPair {
        IdPair {
            theirs: json!(1),
            ours: json!("mcpbox-7"),
        }
    }

    fn back(body: &[u8], stamp: Option<bool>) -> Value {
        serde_json::from_slice(&restore(body, &ids(), stamp)).unwrap()
    }

    #[test]
    fn the_clients_id_comes_back_and_only_ours_is_replaced() {
        // (what the server sent, stamp, the JSON pointer, what it holds after)
        let cases: [(&[u8], Option<bool>, &str, Value); 5] = [
            (br#"{"jsonrpc":"2.0","id":"mcpbox-7","result":{}}"#, None, "/id", json!(1)),
            (br#"{"jsonrpc":"2.0","id":"x","result":{}}"#, Some(true), "/id", json!("x")),
            (br#"{"jsonrpc":"2.0","id":"x","result":{}}"#, Some(true), "/result/resultType", Value::Null),
            // the subscription id of a listen stream, on both endpoints
            (
                br#"{"jsonrpc":"2.0","method":"notifications/tools/list_changed","params":{"_meta":{"io.modelcontextprotocol/subscriptionId":"mcpbox-7"}}}"#,
                None,
                "/params/_meta/io.modelcontextprotocol~1subscriptionId",
                json!(1),
            ),
            (br#"{"jsonrpc":"2.0","id":"mcpbox-7","result":{}}"#, None, "/result/resultType", Value::Null),
        ];
        for (body, stamp, pointer, want) in cases {
            let v = back(body, stamp);
            assert_eq!(
                v.pointer(pointer).cloned().unwrap_or(Value::Null),
                want,
                "{v}"
            );
        }
        assert_eq!(restore(b"not json", &ids(), None), b"not json");
    }

    #[test]
    fn the_docs_list_the_revisions_the_gateway_accepts() {
        let docs = include_str!("../../../docs/serve.md").replace("\n  ", " ");
        let listed = format!("({})", mcp::REVISIONS.join(", "));
        assert!(docs.contains(&listed), "docs/serve.md should list {listed}");
    }

    #[test]
    fn an_older_servers_result_gets_the_result_type_this_revision_requires() {
        let v = back(
            br#"{"jsonrpc":"2.0","id":"mcpbox-7","result":{"content":[]}}"#,
            Some(false),
        );
        assert_eq!(v["result"]["resultType"], "complete");
        assert!(v["result"].get("ttlMs").is_none());
        // a list: not to be cached, and for this client only
        let v = back(
            br#"{"jsonrpc":"2.0","id":"mcpbox-7","result":{"tools":[]}}"#,
            Some(true),
        );
        assert_eq!(v["result"]["ttlMs"], 0);
        assert_eq!(v["result"]["cacheScope"], "private");
        let v = back(
            br#"{"jsonrpc":"2.0","id":"mcpbox-7","result":{"tools":[],"ttlMs":5000,"cacheScope":"public"}}"#,
            Some(true),
        );
        assert_eq!(v["result"]["ttlMs"], 5000);
        // one the server set is kept (an input_required of its own)
        let v = back(
            br#"{"jsonrpc":"2.0","id":"mcpbox-7","result":{"resultType":"input_required"}}"#,
            Some(true),
        );
        assert_eq!(v["result"]["resultType"], "input_required");
        // errors and other messages are not results
        let v = back(
            br#"{"jsonrpc":"2.0","id":"mcpbox-7","error":{"code":1,"message":"m"}}"#,
            Some(true),
        );
        assert!(v.get("result").is_none());
    }
}
