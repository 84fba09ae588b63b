//! One MCP session of the HTTP face: a client's session with one server,
//! backed by one relay session ([`mcpbox_gateway::Relay`]) on its own
//! thread, and the routing of what that relay says back.
//!
//! The relay speaks one ordered stream of messages to "the host". Over
//! Streamable HTTP the host's side is many requests: each POSTed request
//! waits for its answer, and the session may also have GET streams for
//! messages nobody asked for. [`Router`] (the relay's [`HostSink`], called
//! on the relay's thread, never blocking) sends each message where the
//! pure routing core ([`crate::route`]) says it belongs: to the POST
//! waiting for it (dropped if that client went away), or to the GET
//! stream (`Outbox`), which, while none is open, keeps it in a bounded
//! backlog (the oldest is dropped past [`BACKLOG`]).
//!
//! Every message held for the client is charged to the session's byte
//! budget and the gateway's ([`crate::budget`]) until it is written out.
//! When one does not fit: the backlog drops its oldest messages to make
//! room (then the new one, if it still does not fit); a GET stream or a
//! request's queue drops the new notification (those before it are on
//! their way); a response ends its request with an `http.buffer_full`
//! error. Each drop is counted and audited ([`Budget::dropped`]).

use std::collections::VecDeque;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};

use mcpbox_gateway::message::{id_key, IdKey, Message};
use mcpbox_gateway::{FeedError, HostFeed, HostSink};
use mcpbox_policy::mcp::code::TRANSPORT_ERROR;
use mcpbox_policy::Reason;
use serde_json::Value;
use tokio::sync::mpsc;

use crate::budget::{Budget, Held};
use crate::limits::Slot;
use crate::route::{Table, Target};

/// Messages kept for a GET stream that is not open.
pub const BACKLOG: usize = 1024;
/// Messages queued for one POST's stream before more are dropped (the
/// final answer is never dropped).
pub const PER_REQUEST: usize = 4096;
/// Events queued for a GET stream before more are dropped.
pub const STREAM_QUEUE: usize = 1024;

/// What reaches a waiting POST.
#[derive(Debug)]
pub enum Out {
    /// A message before the answer (the answer becomes an event stream).
    Message(Held),
    /// The answer: the last message.
    Final(Held),
}

/// The receiving end a POST holds.
#[derive(Debug)]
pub struct Waiting {
    /// Messages for this request, in order.
    pub rx: mpsc::UnboundedReceiver<Out>,
    queued: Arc<AtomicUsize>,
    /// Gives the request's entry back when the POST is done or gone.
    _entry: Entry,
}

impl Waiting {
    /// Marks one received message as written out.
    pub fn took(&self) {
        self.queued.fetch_sub(1, Ordering::AcqRel);
    }
}

#[derive(Debug)]
struct Waiter {
    tx: mpsc::UnboundedSender<Out>,
    queued: Arc<AtomicUsize>,
    /// The request's id, for an answer of mcpbox's own.
    id: Value,
}

#[derive(Debug)]
struct Routes {
    /// The requests in flight.
    table: Table<Waiter>,
    /// The GET streams (or the aggregate that reads this session) and the
    /// backlog.
    outbox: Outbox,
    ended: bool,
    /// Stateless requests (2026-07-28): a message goes to the request it
    /// names or belongs to, or nowhere (there is no GET stream to wait for).
    modern: bool,
    /// What the session may hold for the client, in bytes.
    budget: Budget,
}

impl Routes {
    /// Ends every request in flight with an `http.stopped` error.
    fn cut(&mut self) {
        for w in self.table.drain() {
            let e = error_line(
                &w.id,
                TRANSPORT_ERROR,
                Reason::HttpStopped,
                "the gateway stopped before the server answered (limits.shutdown_grace)",
            );
            let _ = w.tx.send(Out::Final(Held::own(e)));
        }
    }
}

/// What a session (or an aggregate) holds for its GET streams: the open
/// streams, oldest first (a message goes to the newest, as the transport
/// says a message goes to one stream only), and the backlog kept while
/// none is open. Whole messages, framed by whoever writes them out.
#[derive(Debug, Default)]
pub(crate) struct Outbox {
    streams: Vec<mpsc::Sender<Held>>,
    backlog: VecDeque<Held>,
}

impl Outbox {
    /// Opens a stream: what waited in the backlog first. `exclusive`: at
    /// most one may be open ([`StreamError::Taken`] otherwise).
    pub(crate) fn open(&mut self, exclusive: bool) -> Result<mpsc::Receiver<Held>, StreamError> {
        self.streams.retain(|s| !s.is_closed());
        if exclusive && !self.streams.is_empty() {
            return Err(StreamError::Taken);
        }
        let (tx, rx) = mpsc::channel(STREAM_QUEUE);
        while let Some(e) = self.backlog.pop_front() {
            if let Err(mpsc::error::TrySendError::Full(e)) = tx.try_send(e) {
                self.backlog.push_front(e);
                break;
            }
        }
        self.streams.push(tx);
        Ok(rx)
    }

    /// Whether a stream is open.
    pub(crate) fn is_open(&self) -> bool {
        self.streams.iter().any(|s| !s.is_closed())
    }

    /// Puts an event on the newest open stream, or in the backlog, within
    /// `budget`.
    pub(crate) fn push(&mut self, budget: &Budget, event: Vec<u8>) {
        let mut event = match charge_making_room(budget, &mut self.backlog, event) {
            Ok(h) => h,
            Err(()) => return,
        };
        while let Some(s) = self.streams.last() {
            match s.try_send(event) {
                Ok(()) => return,
                Err(mpsc::error::TrySendError::Full(e)) => {
                    tracing::warn!("a slow client's event stream is full: message dropped");
                    budget.dropped("stream", e.len());
                    return;
                }
                Err(mpsc::error::TrySendError::Closed(e)) => {
                    self.streams.pop();
                    event = e;
                }
            }
        }
        push_backlog(budget, &mut self.backlog, event);
    }

    fn clear(&mut self) {
        self.streams.clear();
        self.backlog.clear();
    }
}

/// Removes a request's routes when its POST is done or was dropped.
#[derive(Debug)]
struct Entry {
    routes: Arc<Mutex<Routes>>,
    key: IdKey,
}

impl Drop for Entry {
    fn drop(&mut self) {
        lock(&self.routes).table.forget(&self.key);
    }
}

fn lock(routes: &Mutex<Routes>) -> MutexGuard<'_, Routes> {
    // a panic elsewhere must not take the session's routing down with it
    routes.lock().unwrap_or_else(|p| p.into_inner())
}

/// Why a message could not be handed to the session.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SendError {
    /// A request with this id is in flight already.
    DuplicateId,
    /// The session's queue is full.
    Busy,
    /// The session has ended.
    Ended,
}

/// Why a GET stream could not be opened.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum StreamError {
    /// The session has ended.
    Ended,
    /// The session allows one stream, and it is open.
    Taken,
}

/// A live session.
pub struct McpSession {
    /// Its `Mcp-Session-Id`.
    pub id: String,
    /// The client it belongs to.
    pub client: String,
    /// The server it talks to.
    pub server: String,
    /// The sandbox behind it (for logs and metrics; the audit has it too).
    pub sandbox_id: String,
    feed: HostFeed,
    routes: Arc<Mutex<Routes>>,
    /// The protocol revision agreed at `initialize`.
    version: Mutex<Option<String>>,
    _slot: Slot,
}

impl std::fmt::Debug for McpSession {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("McpSession")
            .field("client", &self.client)
            .field("server", &self.server)
            .field("sandbox_id", &self.sandbox_id)
            .finish_non_exhaustive()
    }
}

impl McpSession {
    /// A session for `feed`; `routes` are its [`Router`]'s
    /// ([`Router::routes`]).
    pub fn new(
        id: String,
        client: String,
        server: String,
        sandbox_id: String,
        feed: HostFeed,
        routes: Routing,
        slot: Slot,
    ) -> McpSession {
        McpSession {
            id,
            client,
            server,
            sandbox_id,
            feed,
            routes: routes.0,
            version: Mutex::new(None),
            _slot: slot,
        }
    }

    /// Hands a request to the session and returns where its answer will
    /// arrive. `progress` is the request's `_meta.progressToken`, if any.
    pub fn request(
        &self,
        id: &Value,
        progress: Option<&Value>,
        message: Vec<u8>,
    ) -> Result<Waiting, SendError> {
        let key = id_key(id);
        let (tx, rx) = mpsc::unbounded_channel();
        let queued = Arc::new(AtomicUsize::new(0));
        {
            let mut r = lock(&self.routes);
            if r.ended {
                return Err(SendError::Ended);
            }
            let waiter = Waiter {
                tx,
                queued: queued.clone(),
                id: id.clone(),
            };
            r.table
                .insert(key.clone(), progress, waiter)
                .map_err(|_| SendError::DuplicateId)?;
        }
        let entry = Entry {
            routes: self.routes.clone(),
            key,
        };
        self.send(message)?;
        Ok(Waiting {
            rx,
            queued,
            _entry: entry,
        })
    }

    /// Hands a notification or a response (to the server's request) to
    /// the session.
    pub fn send(&self, message: Vec<u8>) -> Result<(), SendError> {
        self.feed.send(message).map_err(|e| match e {
            FeedError::Busy => SendError::Busy,
            FeedError::Closed => SendError::Ended,
        })
    }

    /// Opens a GET stream of the session: what was waiting in the backlog
    /// first. A session may have several (the client's cap bounds them);
    /// each message goes to the newest one open, as the transport says a
    /// message goes to one stream only. A stream ends when its receiver is
    /// dropped (the client went away) or the session ends.
    pub fn open_stream(&self) -> Result<mpsc::Receiver<Held>, StreamError> {
        let mut r = lock(&self.routes);
        if r.ended {
            return Err(StreamError::Ended);
        }
        r.outbox.open(false)
    }

    /// Whether the relay behind the session has ended.
    pub fn ended(&self) -> bool {
        lock(&self.routes).ended
    }

    /// Tells the relay the client is done (DELETE, shutdown): the server is
    /// stopped and the session's last records written. Blocks while the
    /// relay's queue is full: call it from a blocking thread.
    pub fn close(&self) {
        self.feed.close();
    }

    /// Records the protocol revision agreed at `initialize`.
    pub fn set_version(&self, v: &str) {
        *self.version.lock().unwrap_or_else(|p| p.into_inner()) = Some(v.to_string());
    }

    /// The protocol revision agreed at `initialize`.
    pub fn version(&self) -> Option<String> {
        self.version
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .clone()
    }

    /// Requests of this session in flight.
    pub fn in_flight(&self) -> usize {
        lock(&self.routes).table.len()
    }

    /// Ends every request in flight with an `http.stopped` error (the
    /// gateway's grace ran out); what the server answers later goes
    /// nowhere. The session itself is closed after.
    pub fn cut(&self) {
        lock(&self.routes).cut();
    }

    /// Bytes the session holds for the client now.
    pub fn buffered(&self) -> usize {
        lock(&self.routes).budget.used()
    }
}

/// A JSON-RPC error of mcpbox's own for request `id`.
pub(crate) fn error_line(id: &Value, code: i64, reason: Reason, message: &str) -> Vec<u8> {
    let e = serde_json::json!({
        "jsonrpc": "2.0",
        "id": id,
        "error": {
            "code": code,
            "message": message,
            "data": {"reason": reason.as_str(), "source": mcpbox_policy::Source::Mcpbox},
        },
    });
    serde_json::to_vec(&e).unwrap_or_default()
}

/// The relay's sink for one session.
pub struct Router {
    routes: Arc<Mutex<Routes>>,
    on_end: Option<Box<dyn FnOnce() + Send>>,
}

impl std::fmt::Debug for Router {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Router").finish_non_exhaustive()
    }
}

/// A [`Router`]'s routing table, shared with its [`McpSession`].
#[derive(Debug)]
pub struct Routing(Arc<Mutex<Routes>>);

impl Router {
    /// Its routing table, for the session.
    pub fn routes(&self) -> Routing {
        Routing(self.routes.clone())
    }

    /// A router that calls `on_end` once the relay is done with it (the
    /// session ended, whoever ended it). `modern`: for stateless requests.
    /// What it holds for the client is charged to `budget`.
    pub fn new(modern: bool, budget: Budget, on_end: Box<dyn FnOnce() + Send>) -> Router {
        let routes = Routes {
            table: Table::default(),
            outbox: Outbox::default(),
            ended: false,
            modern,
            budget,
        };
        Router {
            routes: Arc::new(Mutex::new(routes)),
            on_end: Some(on_end),
        }
    }
}

impl HostSink for Router {
    fn message(&mut self, line: &[u8]) -> std::io::Result<()> {
        let Ok(msg) = Message::parse(line) else {
            // the relay writes only what it parsed; nothing to route
            tracing::debug!("unroutable message from the relay dropped");
            return Ok(());
        };
        let mut guard = lock(&self.routes);
        let r = &mut *guard;
        let target = r.table.target(&msg, r.outbox.is_open(), r.modern);
        match target {
            Target::Answer(key) => {
                let Some(w) = r.table.forget(&key) else {
                    return Ok(());
                };
                let answer = match r.budget.charge(line.to_vec()) {
                    Ok(h) => h,
                    Err(line) => {
                        // the client is not told less than it asked for:
                        // the request ends, and says why
                        r.budget.dropped("response", line.len());
                        Held::own(error_line(
                            &w.id,
                            TRANSPORT_ERROR,
                            Reason::HttpBufferFull,
                            "the answer is larger than what the gateway may hold for this session (limits.max_buffered_per_session, limits.max_buffered_total)",
                        ))
                    }
                };
                let _ = w.tx.send(Out::Final(answer));
            }
            Target::Request(key) => {
                let Some(w) = r.table.get(&key) else {
                    return Ok(());
                };
                if w.queued.load(Ordering::Acquire) >= PER_REQUEST {
                    tracing::warn!(
                        method = msg.method(),
                        "a slow client's stream is full: message dropped"
                    );
                    r.budget.dropped("request", line.len());
                } else {
                    match r.budget.charge(line.to_vec()) {
                        Ok(h) => {
                            w.queued.fetch_add(1, Ordering::AcqRel);
                            let _ = w.tx.send(Out::Message(h));
                        }
                        Err(m) => r.budget.dropped("request", m.len()),
                    }
                }
            }
            Target::Stream => r.outbox.push(&r.budget, line.to_vec()),
            Target::Nowhere if msg.method().is_some() => tracing::debug!(
                method = msg.method(),
                "stateless session: a message for no request dropped"
            ),
            Target::Nowhere => {
                let key = msg.value.get("id").map(id_key).unwrap_or_default();
                tracing::debug!(id = %key, "answer for a request nobody waits for");
            }
        }
        Ok(())
    }
}

/// Charges `event` to `budget`, dropping the oldest messages of `backlog`
/// while it does not fit; when it still does not (the session's other
/// queues or the gateway hold the rest), it is dropped. Every drop is
/// counted.
pub(crate) fn charge_making_room(
    budget: &Budget,
    backlog: &mut VecDeque<Held>,
    mut event: Vec<u8>,
) -> Result<Held, ()> {
    loop {
        match budget.charge(event) {
            Ok(h) => return Ok(h),
            Err(e) => {
                event = e;
                match backlog.pop_front() {
                    Some(old) => budget.dropped("backlog", old.len()),
                    None => {
                        budget.dropped("backlog", event.len());
                        return Err(());
                    }
                }
            }
        }
    }
}

/// Appends to a backlog of at most [`BACKLOG`] messages (the oldest goes).
pub(crate) fn push_backlog(budget: &Budget, backlog: &mut VecDeque<Held>, event: Held) {
    if backlog.len() >= BACKLOG {
        if let Some(old) = backlog.pop_front() {
            tracing::warn!("no event stream open: the oldest waiting message dropped");
            budget.dropped("backlog", old.len());
        }
    }
    backlog.push_back(event);
}

impl Drop for Router {
    fn drop(&mut self) {
        {
            let mut r = lock(&self.routes);
            r.ended = true;
            // waiting POSTs see their channel close and answer so
            r.table.drain();
            r.outbox.clear();
        }
        if let Some(f) = self.on_end.take() {
            f();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::budget::Budgets;
    use crate::Metrics;
    use serde_json::json;

    /// A router on a session budget of `per_session` bytes (the gateway's
    /// ten times that), the budgets and their metrics.
    fn router_with(per_session: usize) -> (Router, Budgets, Arc<Metrics>) {
        let metrics = Arc::new(Metrics::default());
        let budgets = Budgets::new(per_session * 10, per_session, metrics.clone());
        let budget = budgets.session(Box::new(|_| {}));
        (
            Router::new(false, budget, Box::new(|| {})),
            budgets,
            metrics,
        )
    }

    fn router(per_session: usize) -> (Router, Budgets) {
        let (r, b, _) = router_with(per_session);
        (r, b)
    }

    fn note(n: usize, pad: usize) -> Vec<u8> {
        serde_json::to_vec(
            &json!({"jsonrpc": "2.0", "method": "notifications/resources/updated",
            "params": {"uri": format!("n://{n}"), "pad": "p".repeat(pad)}}),
        )
        .unwrap()
    }

    /// A request in flight, as [`McpSession::request`] registers it.
    fn waiting(r: &Router, id: Value) -> mpsc::UnboundedReceiver<Out> {
        let (tx, rx) = mpsc::unbounded_channel();
        let mut routes = lock(&r.routes);
        let key = id_key(&id);
        let w = Waiter {
            tx,
            queued: Arc::new(AtomicUsize::new(0)),
            id,
        };
        routes.table.insert(key, None, w).unwrap();
        rx
    }

    fn backlog_uris(r: &Router) -> Vec<String> {
        lock(&r.routes)
            .outbox
            .backlog
            .iter()
            .map(|h| {
                let v: Value = serde_json::from_slice(&h.bytes).unwrap();
                v["params"]["uri"].as_str().unwrap().to_string()
            })
            .collect()
    }

    #[test]
    fn a_flood_for_a_client_without_a_stream_keeps_only_the_newest_within_the_budget() {
        // every message the same length: uris n://10 to n://99
        let one = note(10, 1000).len();
        let (mut r, budgets, metrics) = router_with(one * 3);
        for n in 10..100 {
            r.message(&note(n, 1000)).unwrap();
        }
        assert_eq!(backlog_uris(&r), ["n://97", "n://98", "n://99"]);
        assert_eq!(budgets.used(), one * 3);
        let text = metrics.render(0, budgets.used());
        assert!(
            text.contains("mcpbox_dropped_messages_total{queue=\"backlog\"} 87"),
            "{text}"
        );
    }

    #[test]
    fn an_answer_that_does_not_fit_ends_the_request_with_buffer_full() {
        let (mut r, budgets) = router(1000);
        let mut rx = waiting(&r, json!(7));
        let big = serde_json::to_vec(&json!({"jsonrpc": "2.0", "id": 7,
            "result": {"content": [{"type": "text", "text": "x".repeat(5000)}]}}))
        .unwrap();
        r.message(&big).unwrap();
        let Some(Out::Final(h)) = rx.try_recv().ok() else {
            panic!("no final answer")
        };
        let v: Value = serde_json::from_slice(&h.bytes).unwrap();
        assert_eq!(v["id"], 7);
        assert_eq!(v["error"]["data"]["reason"], "http.buffer_full", "{v}");
        assert_eq!(budgets.used(), 0);
    }

    #[test]
    fn a_held_message_is_charged_until_it_is_dropped() {
        let (mut r, budgets) = router(100_000);
        let mut rx = waiting(&r, json!(1));
        let progress =
            serde_json::to_vec(&json!({"jsonrpc": "2.0", "method": "notifications/message",
            "params": {"level": "info", "data": "d".repeat(500)}}))
            .unwrap();
        r.message(&progress).unwrap();
        assert_eq!(budgets.used(), progress.len());
        let m = rx.try_recv().unwrap();
        assert_eq!(budgets.used(), progress.len());
        drop(m);
        assert_eq!(budgets.used(), 0);
    }

    #[test]
    fn a_cut_answers_every_request_in_flight_with_stopped() {
        let (r, _budgets) = router(1000);
        let mut one = waiting(&r, json!(1));
        let mut two = waiting(&r, json!("b"));
        lock(&r.routes).cut();
        for (rx, id) in [(&mut one, json!(1)), (&mut two, json!("b"))] {
            let Some(Out::Final(h)) = rx.try_recv().ok() else {
                panic!("no answer for {id}")
            };
            let v: Value = serde_json::from_slice(&h.bytes).unwrap();
            assert_eq!(v["id"], id);
            assert_eq!(v["error"]["data"]["reason"], "http.stopped", "{v}");
        }
        assert!(lock(&r.routes).table.is_empty());
    }
}
