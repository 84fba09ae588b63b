//! Questions from outside the session (the egress proxy's network
//! approvals), put to the host through MCP elicitation.
//!
//! A [`HostAsker`] blocks its caller (a proxy thread): it hands the
//! question to the running driver ([`Dispatch`]) with a reply channel and
//! waits on that channel, never longer than the approval timeout. The
//! session core sends the `elicitation/create` and routes the host's answer
//! back ([`crate::session::Event::Ask`], [`crate::session::Effect::Answer`]).

use std::sync::mpsc::{self, RecvTimeoutError, Sender};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use serde_json::{json, Value};

use crate::broker::{self, Broker};
use crate::session::{Asked, Question};

/// A question on its way to a driver, with where the answer goes.
pub struct Outside {
    /// The question.
    pub question: Question,
    /// Gets exactly one answer (or is dropped when the session ends).
    pub reply: Sender<Asked>,
}

/// Hands a question to a running driver; false when it is gone.
type Route = Box<dyn Fn(Outside) -> bool + Send>;

/// Where questions go: the driver's input, while a session runs. Set by
/// the driver when it starts and cleared when it ends.
#[derive(Clone, Default)]
pub struct Dispatch(Arc<Mutex<Option<Route>>>, Arc<Mutex<String>>);

impl Dispatch {
    /// Routes questions to `send` (false when the session is gone).
    pub fn connect(&self, send: Route) {
        *self.0.lock().unwrap_or_else(PoisonError::into_inner) = Some(send);
    }

    /// The running session's tag in the approval broker.
    pub fn set_tag(&self, tag: &str) {
        *self.1.lock().unwrap_or_else(PoisonError::into_inner) = tag.to_string();
    }

    fn tag(&self) -> String {
        self.1
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .clone()
    }

    /// Stops routing: every later question is `Unavailable`.
    pub fn disconnect(&self) {
        *self.0.lock().unwrap_or_else(PoisonError::into_inner) = None;
    }

    /// Hands a question to the session; false when none runs.
    fn send(&self, q: Outside) -> bool {
        // The lock only guards the slot: questions are rare, and the host
        // path never takes it.
        match &*self.0.lock().unwrap_or_else(PoisonError::into_inner) {
            Some(send) => send(q),
            None => false,
        }
    }

    /// Asks and waits, at most `q.wait`.
    pub(crate) fn ask(&self, question: Question) -> Asked {
        let wait = question.wait;
        let (reply, rx) = mpsc::channel();
        let expires = Instant::now() + wait;
        if !self.send(Outside { question, reply }) {
            return Asked::Unavailable;
        }
        match rx.recv_timeout(wait) {
            Ok(a) => a,
            Err(RecvTimeoutError::Timeout) => Asked::Timeout,
            // the session dropped the question: it ended first
            Err(RecvTimeoutError::Disconnected) => {
                if Instant::now() >= expires {
                    Asked::Timeout
                } else {
                    Asked::Unavailable
                }
            }
        }
    }
}

/// The host's answer to a network question ([`HostAsker::ask_network`]):
/// the decision vocabulary's own type, which the egress proxy's approver
/// returns too.
pub use mcpbox_policy::NetworkAnswer;

/// A cloneable, thread-safe handle that asks the host a question through
/// MCP elicitation (form mode) on behalf of a running [`crate::Relay`];
/// made with [`crate::Relay::host_asker`]. Each question goes out as its own
/// `elicitation/create` request with an id bound to this session (a nonce
/// the server cannot guess), names the server, and lapses after the relay's
/// `approval_timeout`.
#[derive(Clone)]
pub struct HostAsker {
    pub(crate) dispatch: Dispatch,
    pub(crate) server: String,
    pub(crate) timeout: Duration,
    /// Where the question goes when the host has no elicitation.
    pub(crate) broker: Option<Arc<Broker>>,
    pub(crate) caller: String,
    pub(crate) sandbox_id: String,
    pub(crate) policy_version: String,
    /// `[approvals] fallback = "hold"`: the connection waits for a human.
    pub(crate) hold: bool,
}

impl std::fmt::Debug for HostAsker {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("HostAsker")
            .field("server", &self.server)
            .field("timeout", &self.timeout)
            .finish_non_exhaustive()
    }
}

/// Longest host name quoted in a question.
const MAX_QUOTED_HOST: usize = 253;

impl HostAsker {
    /// Also asks through `broker` when the host cannot be asked through
    /// elicitation: the connection waits (`fallback = "hold"`) or is
    /// refused until a human approves it (`"refuse"`; the server's retry
    /// then passes once).
    pub fn with_broker(mut self, broker: Arc<Broker>) -> HostAsker {
        self.broker = Some(broker);
        self
    }

    /// Asks whether the sandboxed server may connect to `host:port`, which
    /// the network policy does not list. Blocks until the host answers or
    /// the approval timeout passes; never longer.
    pub fn ask_network(&self, host: &str, port: u16) -> NetworkAnswer {
        // the name comes from the sandboxed server: quote it inertly
        let mut quoted: String = host
            .chars()
            .take(MAX_QUOTED_HOST)
            .flat_map(char::escape_default)
            .collect();
        if host.chars().count() > MAX_QUOTED_HOST {
            quoted.push_str("...");
        }
        let expires_unix = SystemTime::now()
            .checked_add(self.timeout)
            .and_then(|t| t.duration_since(UNIX_EPOCH).ok())
            .map_or(0, |d| d.as_secs());
        let message = format!(
            "mcpbox: server `{}` wants to connect to {quoted} port {port}, which its network policy does not list.\nonce: allow this one connection; session: allow {quoted}:{port} until the server stops; deny: refuse it.\nexpires: unix time {expires_unix} (in {}s)",
            self.server,
            self.timeout.as_secs()
        );
        let schema = json!({
            "type": "object",
            "properties": {
                "decision": {
                    "type": "string",
                    "title": format!("Allow a connection to {quoted}:{port}?"),
                    "description": "once: this connection only; session: every connection to this host and port until the server stops; deny: refuse",
                    "enum": ["once", "session", "deny"],
                    "default": "deny"
                }
            },
            "required": ["decision"]
        });
        let answer = match self.dispatch.ask(Question {
            prefix: "mcpbox-network",
            message,
            schema,
            wait: self.timeout,
            needs_capability: true,
        }) {
            Asked::Response(v) => network_answer(&v),
            Asked::Unavailable => match &self.broker {
                Some(b) => self.ask_broker(b, &quoted, port),
                None => NetworkAnswer::Unavailable,
            },
            Asked::Timeout => NetworkAnswer::Timeout,
        };
        tracing::info!(server = %self.server, host = %quoted, port, answer = %answer.reason(), "network approval");
        answer
    }
}

/// Reads the host's answer to a network question.
fn network_answer(v: &Value) -> NetworkAnswer {
    if v.pointer("/result/action").and_then(Value::as_str) != Some("accept") {
        return NetworkAnswer::Declined;
    }
    match v
        .pointer("/result/content/decision")
        .and_then(Value::as_str)
    {
        Some("once") => NetworkAnswer::Once,
        Some("session") => NetworkAnswer::Session,
        _ => NetworkAnswer::Denied,
    }
}

impl HostAsker {
    /// The broker's way: registered as a `network` approval bound to this
    /// host and port; held until answered, or refused with its id.
    fn ask_broker(&self, broker: &Broker, quoted: &str, port: u16) -> NetworkAnswer {
        let target = format!("{quoted}:{port}");
        let nonce = crate::stdio::make_nonce();
        let ask = broker::Ask {
            id: format!("ap-{}", &nonce[..12]),
            session: self.dispatch.tag(),
            sandbox_id: self.sandbox_id.clone(),
            binding: broker::Binding {
                caller: self.caller.clone(),
                server: self.server.clone(),
                tool: "network".into(),
                args_digest: crate::digest::sha256_hex(target.as_bytes()),
                policy_version: self.policy_version.clone(),
            },
            subject: broker::Subject::Network {
                host: quoted.to_string(),
                port,
            },
            rule: mcpbox_policy::Decision::approve(
                mcpbox_policy::Reason::NetworkUnlisted,
                "network.unlisted",
            ),
            preview: json!({"host": quoted, "port": port}),
            expires: SystemTime::now() + self.timeout,
            hold: self.hold,
            elicitation: false,
            answered: None,
        };
        let (tx, rx) = mpsc::channel();
        let deliver: broker::Deliver = Box::new(move |a| {
            let _ = tx.send(a);
        });
        let scope_answer = |scope: broker::Scope| match scope {
            broker::Scope::Once => NetworkAnswer::Once,
            broker::Scope::Session => NetworkAnswer::Session,
        };
        match broker.ask(ask, deliver) {
            broker::Asked::Granted { scope, .. } => scope_answer(scope),
            broker::Asked::TooMany => NetworkAnswer::Unavailable,
            // never asked with `answered`: listed for completeness
            broker::Asked::Closed { .. } => NetworkAnswer::Denied,
            broker::Asked::Refused { id } => {
                tracing::warn!(server = %self.server, %target, approval = %id, "connection refused until a human approves it: {}", broker::approve_command(&id));
                NetworkAnswer::Unavailable
            }
            broker::Asked::Held => {
                tracing::warn!(server = %self.server, %target, "connection waits for a human approval (mcpbox approvals list)");
                match rx.recv_timeout(self.timeout) {
                    Ok(broker::Answer::Approved { scope, .. }) => scope_answer(scope),
                    Ok(broker::Answer::Denied { .. }) => NetworkAnswer::Denied,
                    Ok(broker::Answer::Expired) | Err(_) => NetworkAnswer::Timeout,
                }
            }
        }
    }
}
