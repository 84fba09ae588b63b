//! The stateless revision of MCP (2026-07-28) on the HTTP face.
//!
//! A request of that revision carries its own protocol version, client
//! capabilities and identity in `params._meta` (the envelope) and no
//! `Mcp-Session-Id`; there is no `initialize`. The gateway:
//!
//! - tells the eras apart as the specification's classifier does: a body
//!   whose `_meta` names `io.modelcontextprotocol/protocolVersion` (the
//!   claim) is modern; an `initialize` without a claim is the legacy
//!   handshake (refused with a modern `MCP-Protocol-Version` header); a
//!   modern header on a body without the claim is refused (400, -32602);
//! - checks the envelope (protocol version a string, client capabilities
//!   an object) and that the headers agree with the body
//!   (`MCP-Protocol-Version`, `Mcp-Method`: 400, -32020) before any server
//!   sees it;
//! - forwards it under an id of its own to the client's one stateless
//!   session on the server (`Gateway::stateless_session`), since
//!   independent requests of one client may reuse an id, and puts the
//!   client's id back on every message it returns (and on the
//!   `subscriptionId` of a `subscriptions/listen` stream's notifications);
//! - answers with JSON when the server's first word is the answer, with
//!   the status the specification gives its error (-32601: 404; -32020,
//!   -32021, -32022: 400), and otherwise with an event stream; a client
//!   that leaves a stream before its answer has the request cancelled
//!   (`notifications/cancelled`).

use std::sync::Arc;

use hyper::header::{HeaderMap, HeaderValue, CONTENT_TYPE};
use hyper::{Response, StatusCode};
use mcpbox_gateway::message::{to_line, Message, Shape};
use mcpbox_policy::Reason;
use serde_json::{json, Value};

use crate::body::Body;
use crate::http::{
    ended_error, header, open_refusal, plain, request_stream, send_refusal, Ctx, Refusal,
    VERSION_HEADER,
};
use crate::limits::Slot;
use crate::session::{McpSession, Out, Waiting, SUBSCRIPTION_POINTER};

/// The revision this module speaks.
pub const MODERN: &str = "2026-07-28";
/// The envelope's keys under `params._meta`.
pub const META_VERSION: &str = "io.modelcontextprotocol/protocolVersion";
/// The client's capabilities, per request.
pub const META_CAPABILITIES: &str = "io.modelcontextprotocol/clientCapabilities";
/// The client's name and version, per request.
pub const META_CLIENT_INFO: &str = "io.modelcontextprotocol/clientInfo";
/// The header that mirrors the body's method.
pub const METHOD_HEADER: &str = "mcp-method";
/// The header that mirrors the tool or prompt name, or the resource URI.
pub const NAME_HEADER: &str = "mcp-name";

/// JSON-RPC: invalid params (a bad envelope).
const INVALID_PARAMS: i64 = -32602;
/// The headers and the body disagree (2026-07-28).
const HEADER_MISMATCH: i64 = -32020;

fn meta(msg: &Message) -> Option<&serde_json::Map<String, Value>> {
    msg.value
        .pointer("/params/_meta")
        .and_then(Value::as_object)
}

fn mismatch(header: &str, body: &str, what: &str) -> Refusal {
    Refusal::new(
        StatusCode::BAD_REQUEST,
        HEADER_MISMATCH,
        Reason::HttpProtocolVersion,
        format!("Bad Request: the request headers and body disagree: {what}"),
    )
    .data(json!({"mismatch": {"header": header, "body": body}}))
}

fn bad_envelope(message: String, envelope: Value) -> Refusal {
    Refusal::new(
        StatusCode::BAD_REQUEST,
        INVALID_PARAMS,
        Reason::RequestInvalid,
        message,
    )
    .data(json!({"envelope": envelope}))
}

/// Whether `msg` is a request or notification of the stateless revision;
/// a message that mixes the eras, or whose envelope is broken, is refused.
pub(crate) fn is_modern(msg: &Message, headers: &HeaderMap) -> Result<bool, Refusal> {
    let id = msg.id().cloned().unwrap_or(Value::Null);
    let header_version = header(headers, VERSION_HEADER).map(str::trim);
    let header_modern = header_version == Some(MODERN);
    let method = msg.method().unwrap_or("");
    let claim = meta(msg).and_then(|m| m.get(META_VERSION));
    if !matches!(msg.shape, Shape::Request | Shape::Notification) {
        return Ok(false);
    }
    let Some(claim) = claim else {
        if msg.shape == Shape::Request && method == "initialize" && header_modern {
            return Err(mismatch(
                MODERN,
                "initialize",
                "an initialize request (the legacy handshake) with a 2026-07-28 MCP-Protocol-Version header",
            )
            .id(id));
        }
        if header_modern && msg.shape == Shape::Request {
            return Err(bad_envelope(
                format!("Invalid params: the MCP-Protocol-Version header names {MODERN}, but the request has no `_meta` envelope ({META_VERSION}, {META_CAPABILITIES})"),
                json!({"missing": [META_VERSION, META_CAPABILITIES]}),
            )
            .id(id));
        }
        return Ok(header_modern);
    };
    let Some(claimed) = claim.as_str() else {
        return Err(bad_envelope(
            format!("Invalid _meta envelope: {META_VERSION}: expected a protocol version string"),
            json!({"key": META_VERSION, "problem": "expected a string"}),
        )
        .id(id));
    };
    if msg.shape == Shape::Request {
        let m = meta(msg);
        let caps = m.and_then(|m| m.get(META_CAPABILITIES));
        match caps {
            None => {
                return Err(bad_envelope(
                    format!("Invalid _meta envelope: {META_CAPABILITIES}: missing"),
                    json!({"key": META_CAPABILITIES, "problem": "missing"}),
                )
                .id(id))
            }
            Some(c) if !c.is_object() => {
                return Err(bad_envelope(
                    format!("Invalid _meta envelope: {META_CAPABILITIES}: expected an object"),
                    json!({"key": META_CAPABILITIES, "problem": "expected an object"}),
                )
                .id(id))
            }
            Some(_) => {}
        }
        if let Some(info) = m.and_then(|m| m.get(META_CLIENT_INFO)) {
            if !info.is_object() {
                return Err(bad_envelope(
                    format!("Invalid _meta envelope: {META_CLIENT_INFO}: expected an object"),
                    json!({"key": META_CLIENT_INFO, "problem": "expected an object"}),
                )
                .id(id));
            }
        }
    }
    if let Some(h) = header_version {
        if h != claimed {
            return Err(mismatch(
                h,
                claimed,
                &format!("the body's envelope names protocol version {claimed} but the MCP-Protocol-Version header names {h}"),
            )
            .id(id));
        }
    }
    // the headers that mirror the body are required (SEP-2243): an
    // intermediary routes on them, so an omitted one is as bad as a wrong one
    let method_header = header(headers, METHOD_HEADER)
        .map(str::trim)
        .unwrap_or("(missing)");
    {
        let h = method_header;
        if h != method {
            return Err(mismatch(
                h,
                method,
                &format!("the body names method {method} but the Mcp-Method header names {h}"),
            )
            .id(id));
        }
    }
    if let Some(field) = name_field(method) {
        let h = header(headers, NAME_HEADER)
            .map(str::trim)
            .unwrap_or("(missing)");
        let body = msg
            .value
            .pointer(&format!("/params/{field}"))
            .and_then(Value::as_str)
            .unwrap_or("");
        if h != body {
            return Err(mismatch(
                h,
                body,
                &format!("the body names {field} {body:?} but the Mcp-Name header names {h:?}"),
            )
            .id(id));
        }
    }
    Ok(true)
}

/// The body field the `Mcp-Name` header mirrors, for the methods that have one.
fn name_field(method: &str) -> Option<&'static str> {
    match method {
        "tools/call" | "prompts/get" => Some("name"),
        "resources/read" => Some("uri"),
        _ => None,
    }
}

/// Answers a stateless request or notification.
pub(crate) async fn post(
    ctx: &Ctx,
    msg: Message,
    _headers: &HeaderMap,
    slot: Slot,
) -> Result<Response<Body>, Refusal> {
    let session = ctx
        .gw
        .stateless_session(&ctx.client.name, &ctx.server, ctx.task.as_deref())
        .await
        .map_err(open_refusal)?;
    if msg.shape == Shape::Notification {
        session.send(to_line(&msg.value)).map_err(send_refusal)?;
        return Ok(Response::builder()
            .status(StatusCode::ACCEPTED)
            .body(Body::empty())
            .unwrap_or_else(|_| plain(StatusCode::ACCEPTED, "")));
    }
    let theirs = msg.id().cloned().unwrap_or(Value::Null);
    let cacheable = msg.method().is_some_and(is_cacheable);
    let ours = json!(format!("mcpbox-{}", ctx.gw.next_id()));
    let mut value = msg.value;
    value["id"] = ours.clone();
    let progress = value.pointer("/params/_meta/progressToken").cloned();
    let waiting = session
        .request(&ours, progress.as_ref(), to_line(&value))
        .map_err(|e| send_refusal(e).id(theirs.clone()))?;
    let ids = Ids {
        theirs,
        ours,
        cacheable,
    };
    answer(session, waiting, ids, slot).await
}

/// The methods whose results this revision makes cacheable (`ttlMs`,
/// `cacheScope` required).
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

/// Completes an answer's result as this revision requires, where a
/// server of an older one left it out: `resultType` (`complete`) and, on
/// a cacheable result, `ttlMs` 0 and `cacheScope` `private` (not cached:
/// what a client sees is filtered for it by policy). An error is left as
/// it is.
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

/// A forwarded request's ids, the client's and ours, and what its
/// answer's result must carry.
#[derive(Clone)]
struct Ids {
    theirs: Value,
    ours: Value,
    cacheable: bool,
}

/// Puts the client's id back on a message the server sent under ours,
/// and completes the answer's result ([`complete_result`]): a client of
/// this revision rejects a result without what it requires.
fn restore(message: &[u8], ids: &Ids) -> Vec<u8> {
    let (theirs, ours) = (&ids.theirs, &ids.ours);
    let Ok(mut v) = serde_json::from_slice::<Value>(message) else {
        return message.to_vec();
    };
    if v.get("id") == Some(ours) {
        v["id"] = theirs.clone();
        complete_result(&mut v, ids.cacheable);
    }
    if let Some(sub) = v.pointer_mut(SUBSCRIPTION_POINTER) {
        if sub == ours {
            *sub = theirs.clone();
        }
    }
    to_line(&v)
}

/// The HTTP status the 2026-07-28 transport gives an error answer.
fn status_of(answer: &[u8]) -> StatusCode {
    let code = serde_json::from_slice::<Value>(answer)
        .ok()
        .and_then(|v| v.pointer("/error/code").and_then(Value::as_i64));
    match code {
        Some(-32601) => StatusCode::NOT_FOUND,
        Some(-32022..=-32020) => StatusCode::BAD_REQUEST,
        _ => StatusCode::OK,
    }
}

async fn answer(
    session: Arc<McpSession>,
    mut waiting: Waiting,
    ids: Ids,
    slot: Slot,
) -> Result<Response<Body>, Refusal> {
    let first = waiting.rx.recv().await;
    let first = match first {
        None => {
            return Ok(json(StatusCode::OK, ended_error(&ids.theirs)));
        }
        Some(Out::Final(m)) => {
            let (m, charge) = m.into_parts();
            let m = restore(&m, &ids);
            // charged to the session until hyper is done with the body
            return Ok(json(status_of(&m), m).map(|b| b.held(Box::new(charge))));
        }
        Some(Out::Message(m)) => {
            waiting.took();
            m
        }
    };
    let (i1, i2, ours) = (ids.clone(), ids.clone(), ids.ours.clone());
    Ok(request_stream(
        waiting,
        slot,
        ids.theirs,
        Some(first),
        move |m: Vec<u8>| restore(&m, &i1),
        move |m: Vec<u8>| restore(&m, &i2),
        move || cancel(&session, &ours),
    ))
}

/// The client left before the answer: the server is told to stop working
/// on the request (and a `subscriptions/listen` stream ends).
fn cancel(session: &McpSession, ours: &Value) {
    let note = json!({
        "jsonrpc": "2.0",
        "method": "notifications/cancelled",
        "params": {"requestId": ours, "reason": "the client closed the stream"},
    });
    let _ = session.send(to_line(&note));
}

fn json(status: StatusCode, bytes: Vec<u8>) -> Response<Body> {
    let mut r = Response::new(Body::full(bytes));
    *r.status_mut() = status;
    r.headers_mut()
        .insert(CONTENT_TYPE, HeaderValue::from_static("application/json"));
    r
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_clients_id_comes_back_and_only_ours_is_replaced() {
        let ids = Ids {
            theirs: json!(1),
            ours: json!("mcpbox-7"),
            cacheable: false,
        };
        let out = restore(br#"{"jsonrpc":"2.0","id":"mcpbox-7","result":{}}"#, &ids);
        assert_eq!(
            serde_json::from_slice::<Value>(&out).unwrap()["id"],
            json!(1)
        );
        let other = restore(br#"{"jsonrpc":"2.0","id":"x","result":{}}"#, &ids);
        assert_eq!(
            serde_json::from_slice::<Value>(&other).unwrap()["id"],
            json!("x")
        );
        let note = restore(
            br#"{"jsonrpc":"2.0","method":"notifications/tools/list_changed","params":{"_meta":{"io.modelcontextprotocol/subscriptionId":"mcpbox-7"}}}"#,
            &ids,
        );
        let v: Value = serde_json::from_slice(&note).unwrap();
        assert_eq!(v.pointer(SUBSCRIPTION_POINTER), Some(&json!(1)));
    }

    #[test]
    fn an_older_servers_result_gets_the_result_type_this_revision_requires() {
        let mut ids = Ids {
            theirs: json!(1),
            ours: json!("mcpbox-7"),
            cacheable: false,
        };
        let answer =
            |body: &[u8], ids: &Ids| serde_json::from_slice::<Value>(&restore(body, ids)).unwrap();
        let v = answer(
            br#"{"jsonrpc":"2.0","id":"mcpbox-7","result":{"content":[]}}"#,
            &ids,
        );
        assert_eq!(v["result"]["resultType"], "complete");
        assert!(v["result"].get("ttlMs").is_none());
        // a list: not to be cached, and for this client only
        ids.cacheable = true;
        let v = answer(
            br#"{"jsonrpc":"2.0","id":"mcpbox-7","result":{"tools":[]}}"#,
            &ids,
        );
        assert_eq!(v["result"]["ttlMs"], 0);
        assert_eq!(v["result"]["cacheScope"], "private");
        let v = answer(
            br#"{"jsonrpc":"2.0","id":"mcpbox-7","result":{"tools":[],"ttlMs":5000,"cacheScope":"public"}}"#,
            &ids,
        );
        assert_eq!(v["result"]["ttlMs"], 5000);
        // one the server set is kept (an input_required of its own)
        let v = answer(
            br#"{"jsonrpc":"2.0","id":"mcpbox-7","result":{"resultType":"input_required"}}"#,
            &ids,
        );
        assert_eq!(v["result"]["resultType"], "input_required");
        // errors and other messages are not results
        let v = answer(
            br#"{"jsonrpc":"2.0","id":"mcpbox-7","error":{"code":1,"message":"m"}}"#,
            &ids,
        );
        assert!(v.get("result").is_none());
    }

    #[test]
    fn error_statuses_follow_the_2026_transport() {
        let e =
            |c: i64| format!(r#"{{"jsonrpc":"2.0","id":1,"error":{{"code":{c},"message":"m"}}}}"#);
        assert_eq!(status_of(e(-32601).as_bytes()), StatusCode::NOT_FOUND);
        for c in [-32020, -32021, -32022] {
            assert_eq!(status_of(e(c).as_bytes()), StatusCode::BAD_REQUEST);
        }
        assert_eq!(status_of(e(-32603).as_bytes()), StatusCode::OK);
        assert_eq!(
            status_of(br#"{"jsonrpc":"2.0","id":1,"result":{}}"#),
            StatusCode::OK
        );
    }
}
