//! The protocol's constants and its one id rewriting, shared by the relay
//! (`mcpbox-gateway`), the HTTP face (`mcpbox-serve`) and the built-in
//! server (`mcpbox-builtin`): every place that names a revision, a
//! JSON-RPC code, an envelope key or rewrites an id reads it here, so no
//! two of them can disagree (they once listed the revisions in four
//! places, and one of serve's id rewrites forgot the subscription id).
//!
//! It lives in the policy crate because that is the one crate all three
//! depend on already; it holds no state and does no I/O.

use serde_json::Value;

/// Every protocol revision mcpbox speaks, oldest first.
pub const REVISIONS: [&str; 5] = [
    "2024-11-05",
    "2025-03-26",
    "2025-06-18",
    "2025-11-25",
    STATELESS_REVISION,
];

/// The stateless revision: no `initialize`, no session; every request
/// carries its envelope in `params._meta`.
pub const STATELESS_REVISION: &str = "2026-07-28";

/// The revisions with a session (an `initialize` handshake), newest first:
/// what the built-in server negotiates.
pub const SESSION_REVISIONS: [&str; 4] = [REVISIONS[3], REVISIONS[2], REVISIONS[1], REVISIONS[0]];

/// The newest revision with a session (what is assumed when a client's
/// `initialize` names none).
pub const LATEST_SESSION_REVISION: &str = SESSION_REVISIONS[0];

/// Whether mcpbox speaks `revision`.
pub fn is_revision(revision: &str) -> bool {
    REVISIONS.contains(&revision)
}

/// `_meta` key naming a request's protocol revision (stateless revision):
/// its presence marks a request of that revision.
pub const META_PROTOCOL_VERSION: &str = "io.modelcontextprotocol/protocolVersion";
/// `_meta` key carrying per-request client capabilities (stateless revision).
pub const META_CLIENT_CAPS: &str = "io.modelcontextprotocol/clientCapabilities";
/// `_meta` key carrying the client's name and version, per request.
pub const META_CLIENT_INFO: &str = "io.modelcontextprotocol/clientInfo";
/// `_meta` key of a result carrying the server's name and version.
pub const META_SERVER_INFO: &str = "io.modelcontextprotocol/serverInfo";
/// Where a notification of a `subscriptions/listen` stream names its
/// listen request (stateless revision).
pub const SUBSCRIPTION_POINTER: &str = "/params/_meta/io.modelcontextprotocol~1subscriptionId";

/// JSON-RPC error codes, and the ones the revisions add.
pub mod code {
    /// JSON-RPC: invalid JSON.
    pub const PARSE_ERROR: i64 = -32700;
    /// JSON-RPC: not a valid request object.
    pub const INVALID_REQUEST: i64 = -32600;
    /// JSON-RPC: no such method.
    pub const METHOD_NOT_FOUND: i64 = -32601;
    /// JSON-RPC: invalid params.
    pub const INVALID_PARAMS: i64 = -32602;
    /// JSON-RPC: internal error.
    pub const INTERNAL_ERROR: i64 = -32603;
    /// Implementation-defined server error: the transport refused the request.
    pub const TRANSPORT_ERROR: i64 = -32000;
    /// The session id names no live session (what the SDKs answer).
    pub const SESSION_NOT_FOUND: i64 = -32001;
    /// The headers and the body disagree (stateless revision).
    pub const HEADER_MISMATCH: i64 = -32020;
    /// The last of the stateless revision's transport errors (-32020..=-32022).
    pub const LAST_TRANSPORT_MISMATCH: i64 = -32022;
}

/// A request forwarded under an id of the forwarder's own: the id its
/// sender gave it (`theirs`) and the one it travels under (`ours`).
/// Independent senders may reuse an id, and a sender's id is its own text
/// (it could name a request of someone else's); so whoever merges senders
/// onto one peer forwards under its own ids and maps them back.
#[derive(Debug, Clone, PartialEq)]
pub struct IdPair {
    /// The sender's id.
    pub theirs: Value,
    /// The forwarder's id.
    pub ours: Value,
}

impl IdPair {
    /// Puts our id on the request `message` (the way out).
    pub fn forward(&self, message: &mut Value) {
        set_id(message, self.ours.clone());
    }

    /// The way back: where `message` names the request by our id (its own
    /// `id`, the answer; a `subscriptions/listen` stream's subscription
    /// id), it names it by theirs. Anything else is left alone. Returns
    /// whether the message was the answer.
    pub fn back(&self, message: &mut Value) -> bool {
        // only an answer (no method): a request that reuses our id's text
        // is the forwarder's to map, not this pair's
        let answer = message.get("method").is_none() && message.get("id") == Some(&self.ours);
        if answer {
            set_id(message, self.theirs.clone());
        }
        if let Some(sub) = message.pointer_mut(SUBSCRIPTION_POINTER) {
            if *sub == self.ours {
                *sub = self.theirs.clone();
            }
        }
        answer
    }
}

/// Sets a message's `id` (a message that is not an object is left alone).
pub fn set_id(message: &mut Value, id: Value) {
    if let Some(o) = message.as_object_mut() {
        o.insert("id".into(), id);
    }
}

/// The request a `notifications/cancelled` names, if `message` is one.
pub fn cancelled_request(message: &Value) -> Option<&Value> {
    if message.get("method").and_then(Value::as_str) != Some("notifications/cancelled") {
        return None;
    }
    message.pointer("/params/requestId")
}

/// Renames the request a `notifications/cancelled` names (a message of
/// another kind is left alone).
pub fn set_cancelled_request(message: &mut Value, id: Value) {
    if cancelled_request(message).is_some() {
        message["params"]["requestId"] = id;
    }
}

/// A `notifications/cancelled` for request `id`.
pub fn cancellation(id: &Value, reason: &str) -> Value {
    serde_json::json!({
        "jsonrpc": "2.0",
        "method": "notifications/cancelled",
        "params": {"requestId": id, "reason": reason},
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn revisions_are_listed_once_in_order() {
        let mut sorted = REVISIONS;
        sorted.sort_unstable();
        assert_eq!(sorted, REVISIONS, "oldest first");
        assert_eq!(REVISIONS[4], STATELESS_REVISION);
        assert_eq!(LATEST_SESSION_REVISION, "2025-11-25");
        assert!(SESSION_REVISIONS.iter().all(|r| is_revision(r)));
        assert!(!SESSION_REVISIONS.contains(&STATELESS_REVISION));
        assert!(!is_revision("2025-01-01"));
    }

    #[test]
    fn the_way_back_renames_the_answer_and_the_subscription_only() {
        let ids = IdPair {
            theirs: json!(1),
            ours: json!("mcpbox-7"),
        };
        // (message, whether it is the answer, the message after)
        let table = [
            (
                json!({"jsonrpc": "2.0", "id": "mcpbox-7", "result": {}}),
                true,
                json!({"jsonrpc": "2.0", "id": 1, "result": {}}),
            ),
            (
                json!({"jsonrpc": "2.0", "id": "x", "result": {}}),
                false,
                json!({"jsonrpc": "2.0", "id": "x", "result": {}}),
            ),
            (
                json!({"jsonrpc": "2.0", "method": "n", "params": {"_meta": {"io.modelcontextprotocol/subscriptionId": "mcpbox-7"}}}),
                false,
                json!({"jsonrpc": "2.0", "method": "n", "params": {"_meta": {"io.modelcontextprotocol/subscriptionId": 1}}}),
            ),
            (
                json!({"jsonrpc": "2.0", "method": "n", "params": {"_meta": {"io.modelcontextprotocol/subscriptionId": "other"}}}),
                false,
                json!({"jsonrpc": "2.0", "method": "n", "params": {"_meta": {"io.modelcontextprotocol/subscriptionId": "other"}}}),
            ),
            // a server's request that reuses our id's text is not the answer
            (
                json!({"jsonrpc": "2.0", "id": "mcpbox-7", "method": "roots/list"}),
                false,
                json!({"jsonrpc": "2.0", "id": "mcpbox-7", "method": "roots/list"}),
            ),
            (json!([1, 2]), false, json!([1, 2])),
        ];
        for (mut msg, answer, after) in table {
            assert_eq!(ids.back(&mut msg), answer, "{msg}");
            assert_eq!(msg, after);
        }
        let mut req = json!({"jsonrpc": "2.0", "id": 1, "method": "tools/list"});
        ids.forward(&mut req);
        assert_eq!(req["id"], "mcpbox-7");
    }

    #[test]
    fn a_cancellation_is_renamed_only_when_it_is_one() {
        let mut c = cancellation(&json!(3), "gone");
        assert_eq!(cancelled_request(&c), Some(&json!(3)));
        set_cancelled_request(&mut c, json!("mcpbox-1"));
        assert_eq!(c["params"]["requestId"], "mcpbox-1");
        let mut other = json!({"jsonrpc": "2.0", "method": "notifications/progress", "params": {"requestId": 3}});
        set_cancelled_request(&mut other, json!("x"));
        assert_eq!(other["params"]["requestId"], 3);
    }
}
