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

use hyper::header::HeaderMap;
use hyper::{Response, StatusCode};
use mcpbox_gateway::message::{to_line, Message, Shape};
use mcpbox_policy::mcp::code::{
    HEADER_MISMATCH, INVALID_PARAMS, LAST_TRANSPORT_MISMATCH, METHOD_NOT_FOUND,
};
use mcpbox_policy::mcp::{
    cancellation, IdPair, META_CLIENT_CAPS as META_CAPABILITIES, META_CLIENT_INFO,
    META_PROTOCOL_VERSION as META_VERSION, STATELESS_REVISION as MODERN,
};
use mcpbox_policy::Reason;
use serde_json::{json, Value};

use crate::body::Body;
use crate::limits::Slot;
use crate::reply::{
    accepted, ended_error, header, is_cacheable, json_response, open_refusal, request_stream,
    restore, send_refusal, Ctx, Refusal, VERSION_HEADER,
};
use crate::session::{McpSession, Out, Waiting};

/// The header that mirrors the body's method.
pub const METHOD_HEADER: &str = "mcp-method";
/// The header that mirrors the tool or prompt name, or the resource URI.
pub const NAME_HEADER: &str = "mcp-name";

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
pub(crate) async fn post(ctx: &Ctx, msg: Message, slot: Slot) -> Result<Response<Body>, Refusal> {
    let session = ctx
        .gw
        .stateless_session(&ctx.client.name, &ctx.server, ctx.task.as_deref())
        .await
        .map_err(open_refusal)?;
    if msg.shape == Shape::Notification {
        session.send(to_line(&msg.value)).map_err(send_refusal)?;
        return Ok(accepted());
    }
    let cacheable = msg.method().is_some_and(is_cacheable);
    let ids = IdPair {
        theirs: msg.id().cloned().unwrap_or(Value::Null),
        ours: ctx.gw.our_id(),
    };
    let mut value = msg.value;
    ids.forward(&mut value);
    let progress = value.pointer("/params/_meta/progressToken").cloned();
    let waiting = session
        .request(&ids.ours, progress.as_ref(), to_line(&value))
        .map_err(|e| send_refusal(e).id(ids.theirs.clone()))?;
    answer(session, waiting, ids, cacheable, slot).await
}

/// The HTTP status the 2026-07-28 transport gives an error answer.
fn status_of(answer: &[u8]) -> StatusCode {
    let code = serde_json::from_slice::<Value>(answer)
        .ok()
        .and_then(|v| v.pointer("/error/code").and_then(Value::as_i64));
    match code {
        Some(METHOD_NOT_FOUND) => StatusCode::NOT_FOUND,
        Some(LAST_TRANSPORT_MISMATCH..=HEADER_MISMATCH) => StatusCode::BAD_REQUEST,
        _ => StatusCode::OK,
    }
}

async fn answer(
    session: Arc<McpSession>,
    mut waiting: Waiting,
    ids: IdPair,
    cacheable: bool,
    slot: Slot,
) -> Result<Response<Body>, Refusal> {
    let stamp = Some(cacheable);
    let first = waiting.rx.recv().await;
    let first = match first {
        None => {
            return Ok(json_response(StatusCode::OK, ended_error(&ids.theirs)));
        }
        Some(Out::Final(m)) => {
            let (m, charge) = m.into_parts();
            let m = restore(&m, &ids, stamp);
            // charged to the session until hyper is done with the body
            return Ok(json_response(status_of(&m), m).map(|b| b.held(Box::new(charge))));
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
        move |m: Vec<u8>| restore(&m, &i1, stamp),
        move |m: Vec<u8>| restore(&m, &i2, stamp),
        move || cancel(&session, &ours),
    ))
}

/// The client left before the answer: the server is told to stop working
/// on the request (and a `subscriptions/listen` stream ends).
fn cancel(session: &McpSession, ours: &Value) {
    let note = cancellation(ours, "the client closed the stream");
    let _ = session.send(to_line(&note));
}

#[cfg(test)]
mod tests {
    use super::*;

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
