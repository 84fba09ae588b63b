//! Where a message the relay has for the host goes: the routing decision
//! of one session, pure (no channel, no lock, no I/O), so it is tested as
//! a table. [`crate::session::Router`] keeps a [`Table`] of the requests
//! in flight and performs what [`Table::target`] decides.
//!
//! - a response or error goes to the request of its id ([`Target::Answer`]);
//! - a notification of a `subscriptions/listen` stream goes to the listen
//!   request it names, a progress notification to the request whose
//!   `progressToken` it carries;
//! - requests and notifications that belong to a request in flight
//!   (sampling, elicitation, roots, logging, progress, ping) go to the
//!   newest request still waiting. A stdio server does not say which
//!   request a message belongs to, so with several requests in flight
//!   this is a best guess; the message still reaches the right session,
//!   which is what isolation needs;
//! - everything else goes to the GET stream ([`Target::Stream`]), or to
//!   the newest request when no stream is open (a session of the
//!   stateless revision has no stream: it goes nowhere).

use std::collections::HashMap;

use mcpbox_gateway::message::{id_key, IdKey, Message, Shape};
use mcpbox_policy::mcp::SUBSCRIPTION_POINTER;
use serde_json::Value;

/// Where one message goes.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Target {
    /// The answer of this request (it ends).
    Answer(IdKey),
    /// A message of this request, before its answer.
    Request(IdKey),
    /// The session's GET stream (or its backlog).
    Stream,
    /// Nowhere: an answer nobody waits for, or, on a stateless session, a
    /// message of no request.
    Nowhere,
}

/// The requests of one session in flight, with `W` what waits for each.
#[derive(Debug)]
pub struct Table<W> {
    pending: HashMap<IdKey, W>,
    /// Requests in flight, oldest first.
    order: Vec<IdKey>,
    /// Progress token (its JSON text) → request.
    tokens: HashMap<String, IdKey>,
}

impl<W> Default for Table<W> {
    fn default() -> Self {
        Table {
            pending: HashMap::new(),
            order: Vec::new(),
            tokens: HashMap::new(),
        }
    }
}

/// A request with this id is in flight already.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Duplicate;

impl<W> Table<W> {
    /// Registers request `key` (with its `progressToken`, if any).
    pub fn insert(&mut self, key: IdKey, progress: Option<&Value>, w: W) -> Result<(), Duplicate> {
        if self.pending.contains_key(&key) {
            return Err(Duplicate);
        }
        self.pending.insert(key.clone(), w);
        self.order.push(key.clone());
        if let Some(t) = progress {
            self.tokens.insert(t.to_string(), key);
        }
        Ok(())
    }

    /// Forgets request `key` (answered, or its client left).
    pub fn forget(&mut self, key: &IdKey) -> Option<W> {
        let w = self.pending.remove(key);
        self.order.retain(|k| k != key);
        self.tokens.retain(|_, v| v != key);
        w
    }

    /// What waits for request `key`.
    pub fn get(&self, key: &IdKey) -> Option<&W> {
        self.pending.get(key)
    }

    /// Requests in flight.
    pub fn len(&self) -> usize {
        self.order.len()
    }

    /// Whether none is.
    pub fn is_empty(&self) -> bool {
        self.order.is_empty()
    }

    /// Forgets every request; returns what waited for them.
    pub fn drain(&mut self) -> Vec<W> {
        self.order.clear();
        self.tokens.clear();
        self.pending.drain().map(|(_, w)| w).collect()
    }

    /// Where `msg` goes. `stream_open`: a GET stream is open; `stateless`:
    /// the session takes requests of the stateless revision (no stream).
    pub fn target(&self, msg: &Message, stream_open: bool, stateless: bool) -> Target {
        match msg.shape {
            Shape::Response | Shape::Error | Shape::Other => {
                let key = msg.value.get("id").map(id_key).unwrap_or_default();
                if self.pending.contains_key(&key) {
                    Target::Answer(key)
                } else {
                    Target::Nowhere
                }
            }
            Shape::Request | Shape::Notification => {
                let method = msg.method().unwrap_or("");
                let subscription = msg
                    .value
                    .pointer(SUBSCRIPTION_POINTER)
                    .map(id_key)
                    .filter(|k| self.pending.contains_key(k));
                let token = (method == "notifications/progress")
                    .then(|| msg.value.pointer("/params/progressToken"))
                    .flatten()
                    .and_then(|t| self.tokens.get(&t.to_string()).cloned());
                let named = subscription.or(token);
                let target = match named {
                    Some(k) => Some(k),
                    None if belongs_to_request(method) => self.order.last().cloned(),
                    None if stream_open || stateless => None,
                    None => self.order.last().cloned(),
                };
                match target.filter(|k| self.pending.contains_key(k)) {
                    Some(k) => Target::Request(k),
                    None if stateless => Target::Nowhere,
                    None => Target::Stream,
                }
            }
        }
    }
}

/// Methods that belong to the request the server is working on.
fn belongs_to_request(method: &str) -> bool {
    matches!(
        method,
        "sampling/createMessage"
            | "elicitation/create"
            | "roots/list"
            | "notifications/message"
            | "notifications/progress"
            | "ping"
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn table(requests: &[(Value, Option<Value>)]) -> Table<()> {
        let mut t = Table::default();
        for (id, progress) in requests {
            t.insert(id_key(id), progress.as_ref(), ()).unwrap();
        }
        t
    }

    fn key(v: Value) -> IdKey {
        id_key(&v)
    }

    #[test]
    fn each_message_goes_where_it_belongs() {
        // requests 1 (progress token "p1"), then "b" (the newest)
        let t = table(&[(json!(1), Some(json!("p1"))), (json!("b"), None)]);
        let sub = |id: Value| json!({"jsonrpc": "2.0", "method": "notifications/resources/updated", "params": {"_meta": {"io.modelcontextprotocol/subscriptionId": id}}});
        let progress = |tok: Value| json!({"jsonrpc": "2.0", "method": "notifications/progress", "params": {"progressToken": tok, "progress": 1}});
        let other = json!({"jsonrpc": "2.0", "method": "notifications/tools/list_changed"});
        let elicit =
            json!({"jsonrpc": "2.0", "id": 9, "method": "elicitation/create", "params": {}});
        // (message, stream open, stateless, where it goes)
        let cases = [
            (
                json!({"jsonrpc": "2.0", "id": 1, "result": {}}),
                false,
                false,
                Target::Answer(key(json!(1))),
            ),
            (
                json!({"jsonrpc": "2.0", "id": "b", "error": {"code": 1, "message": "m"}}),
                true,
                false,
                Target::Answer(key(json!("b"))),
            ),
            (
                json!({"jsonrpc": "2.0", "id": 7, "result": {}}),
                false,
                false,
                Target::Nowhere,
            ),
            // a number 1 and a string "1" are different requests
            (
                json!({"jsonrpc": "2.0", "id": "1", "result": {}}),
                false,
                false,
                Target::Nowhere,
            ),
            (sub(json!(1)), true, false, Target::Request(key(json!(1)))),
            (sub(json!(1)), true, true, Target::Request(key(json!(1)))),
            (sub(json!(5)), true, false, Target::Stream),
            (sub(json!(5)), false, true, Target::Nowhere),
            (
                progress(json!("p1")),
                true,
                false,
                Target::Request(key(json!(1))),
            ),
            // an unknown token: the newest request's, as any progress
            (
                progress(json!("zz")),
                true,
                false,
                Target::Request(key(json!("b"))),
            ),
            (
                elicit.clone(),
                true,
                false,
                Target::Request(key(json!("b"))),
            ),
            (elicit, true, true, Target::Request(key(json!("b")))),
            (other.clone(), true, false, Target::Stream),
            (
                other.clone(),
                false,
                false,
                Target::Request(key(json!("b"))),
            ),
            (other, false, true, Target::Nowhere),
        ];
        for (i, (msg, stream_open, stateless, want)) in cases.into_iter().enumerate() {
            let m = Message::parse(&serde_json::to_vec(&msg).unwrap()).unwrap();
            assert_eq!(
                t.target(&m, stream_open, stateless),
                want,
                "case {i}: {msg}"
            );
        }
    }

    #[test]
    fn with_nothing_in_flight_messages_go_to_the_stream_or_nowhere() {
        let t: Table<()> = Table::default();
        let cases = [
            (
                json!({"jsonrpc": "2.0", "method": "notifications/message", "params": {}}),
                false,
                Target::Stream,
            ),
            (
                json!({"jsonrpc": "2.0", "id": 3, "method": "ping"}),
                false,
                Target::Stream,
            ),
            (
                json!({"jsonrpc": "2.0", "id": 3, "method": "ping"}),
                true,
                Target::Nowhere,
            ),
            (
                json!({"jsonrpc": "2.0", "id": 3, "result": {}}),
                false,
                Target::Nowhere,
            ),
        ];
        for (msg, stateless, want) in cases {
            let m = Message::parse(&serde_json::to_vec(&msg).unwrap()).unwrap();
            assert_eq!(t.target(&m, false, stateless), want, "{msg}");
        }
    }

    #[test]
    fn a_forgotten_request_takes_its_token_and_place_with_it() {
        let mut t = table(&[(json!(1), Some(json!("p"))), (json!(2), None)]);
        assert_eq!(t.insert(key(json!(1)), None, ()), Err(Duplicate));
        assert!(t.forget(&key(json!(2))).is_some());
        let progress = json!({"jsonrpc": "2.0", "method": "notifications/progress", "params": {"progressToken": "p"}});
        let m = Message::parse(&serde_json::to_vec(&progress).unwrap()).unwrap();
        assert_eq!(t.target(&m, true, false), Target::Request(key(json!(1))));
        t.forget(&key(json!(1)));
        assert_eq!(t.target(&m, true, false), Target::Stream);
        assert!(t.is_empty());
        assert_eq!(t.drain().len(), 0);
    }
}
