//! The approval broker: the one table of everything that waits for a
//! human in one mcpbox process (`run`: its one session; `serve`: every
//! session of every client), and the one place an approval is answered.
//!
//! Who asks: the session core, for a call under an `approve` rule and for
//! a result over `output.approve_over` or with credential-shaped strings
//! ([`crate::session::Effect::AskApprover`], performed by the driver), and
//! the egress proxy's [`crate::HostAsker`] for an unlisted host under
//! `network.unlisted = "approve"`. Who answers: MCP elicitation (the
//! session settles the approval itself and tells the broker,
//! [`Broker::close`]), `mcpbox approvals` over the control socket, and the
//! web console ([`Broker::answer`]).
//!
//! # What an approval is bound to
//!
//! An approval has an id (`ap-` and 12 hex digits, derived from the
//! session's secret nonce: no server sees it before a human does) and is
//! bound to a [`Binding`]: caller, server, tool, the SHA-256 of the
//! canonical arguments and the policy's digest, plus its expiry. It is
//! single use:
//!
//! - **held** (the host has elicitation, or `[approvals] fallback =
//!   "hold"`): the call itself waits in its session; an answer is
//!   delivered to exactly that call, once, and the entry is gone.
//! - **refused** (`fallback = "refuse"`): the call is answered at once
//!   with an error that names the id and the command; the entry stays
//!   until it expires. Once a human approves it, it is a *grant*: the next
//!   ask with the same binding and subject kind consumes it (one call, the
//!   same arguments, the same policy, before the expiry). A call with
//!   other arguments has another digest and finds no grant.
//! - **allow for this session**: a grant on (session, subject kind, tool)
//!   for the rest of that relay session, whatever the arguments.
//!
//! An approval is also bound to what the gateway measured and the human
//! saw ([`Subject::measured`]: the bytes of a file `export_artifact`
//! would copy, of a held result): a grant, once or for the session, covers
//! an ask that measures no more ([`Subject::covers`]). The agent grows the
//! file and retries: that is a new question, never the old yes.
//!
//! Every request, answer, expiry, abandonment and use of a grant is an
//! audit record of kind `approval` (`detail.action`), written before the
//! answer is delivered.
//!
//! Locks: one mutex over the table; callbacks and audit writes happen
//! after it is released.

use std::collections::{BTreeMap, HashMap};
use std::sync::{Arc, Condvar, Mutex, MutexGuard, PoisonError};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use mcpbox_audit::{Event as AuditEvent, Kind, Sink};
use mcpbox_policy::{Decision, Reason, Verdict};
use serde::Serialize;
use serde_json::{json, Value};

/// What happens to an approval when the host cannot be asked through
/// elicitation (`[approvals] fallback`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Fallback {
    /// The call is answered at once with an error naming the approval and
    /// the command that approves it; once approved, the same call passes
    /// once.
    #[default]
    Refuse,
    /// The call waits, up to the approval timeout, while a human answers
    /// through `mcpbox approvals` or the console.
    Hold,
}

/// How far an approval reaches.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Scope {
    /// This one call (or connection, or result).
    Once,
    /// This tool (or host and port) for the rest of the relay session.
    Session,
}

/// What an approval is bound to. A grant is used only by an ask whose
/// binding is equal in every field.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Binding {
    /// Who called: the gateway's client, or the host's `clientInfo`.
    pub caller: String,
    /// The server, as the policy or serve config names it.
    pub server: String,
    /// The tool; `network` for a connection.
    pub tool: String,
    /// Hex SHA-256 of the canonical JSON of the arguments (for a
    /// connection, of `host:port`).
    pub args_digest: String,
    /// The policy's digest: an approval given under one policy is not
    /// used under another.
    pub policy_version: String,
}

/// What waits.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(tag = "type", rename_all = "snake_case")]
pub enum Subject {
    /// A tool call, before it reaches the server.
    Call {
        /// What the gateway's argument checks measured and the human is
        /// shown: the bytes of the file `export_artifact` would copy. The
        /// approval covers no more.
        #[serde(skip_serializing_if = "Option::is_none")]
        bytes: Option<u64>,
    },
    /// A tool result, before it reaches the host.
    Result {
        /// Its size in bytes.
        bytes: u64,
        /// `output.approve_over`, when the size is why.
        #[serde(skip_serializing_if = "Option::is_none")]
        over: Option<u64>,
        /// The kinds of credential-shaped strings found in it, when they
        /// are why.
        #[serde(skip_serializing_if = "Vec::is_empty")]
        credential_shapes: Vec<String>,
    },
    /// A connection to a host the network policy does not list.
    Network {
        /// The host, as the server asked for it.
        host: String,
        /// The port.
        port: u16,
    },
}

impl Subject {
    fn kind(&self) -> &'static str {
        match self {
            Subject::Call { .. } => "call",
            Subject::Result { .. } => "result",
            Subject::Network { .. } => "network",
        }
    }

    /// The size the human was shown, where something was measured.
    pub fn measured(&self) -> Option<u64> {
        match self {
            Subject::Call { bytes } => *bytes,
            Subject::Result { bytes, .. } => Some(*bytes),
            Subject::Network { .. } => None,
        }
    }

    /// Whether an approval of `self` covers `other` (of the same kind and
    /// binding): the same host and port; no more bytes than were measured
    /// and shown; no credential shape the human was not told of. An
    /// approval given for something unmeasured covers nothing measured.
    pub fn covers(&self, other: &Subject) -> bool {
        match (self, other) {
            (Subject::Network { host: a, port: p }, Subject::Network { host: b, port: q }) => {
                a == b && p == q
            }
            (
                Subject::Result {
                    credential_shapes: seen,
                    ..
                },
                Subject::Result {
                    credential_shapes: now,
                    ..
                },
            ) if !now.iter().all(|k| seen.contains(k)) => false,
            _ => match (self.measured(), other.measured()) {
                (_, None) => true,
                (Some(approved), Some(now)) => now <= approved,
                (None, Some(_)) => false,
            },
        }
    }
}

/// One request for a human.
#[derive(Debug, Clone)]
pub struct Ask {
    /// Its id (`ap-` + 12 hex digits), unique in the process.
    pub id: String,
    /// The relay session's tag: session grants and abandonment go by it.
    pub session: String,
    /// For audit records.
    pub sandbox_id: String,
    /// What it is bound to.
    pub binding: Binding,
    /// What waits.
    pub subject: Subject,
    /// The rule that asked.
    pub rule: Decision,
    /// What the human needs to decide: a redacted, size-limited view of
    /// the arguments (and what the argument rules found).
    pub preview: Value,
    /// When it lapses.
    pub expires: SystemTime,
    /// Whether something waits for the answer (held) or the caller was
    /// refused and will retry (refused).
    pub hold: bool,
    /// Whether the host was also asked through elicitation.
    pub elicitation: bool,
    /// An approval of this same call that the host's human approved in
    /// the request itself (the 2026-07-28 revision's `inputResponses`
    /// answering the form of an `InputRequiredResult`), and how far: granted
    /// first, if it is still open and bound to this call, then used as any
    /// grant.
    pub answered: Option<(String, Scope)>,
}

/// A human's (or the session's) answer.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Answer {
    /// Allowed, by whom, how far.
    Approved {
        /// Who: `cli:uid=1000`, `console`, `elicitation`, ...
        by: String,
        /// How far.
        scope: Scope,
    },
    /// Refused by a human.
    Denied {
        /// Who.
        by: String,
    },
    /// Nobody answered in time.
    Expired,
}

/// Approvals one relay session may have open at once. More is a host (or
/// an agent talked into it) flooding the human with questions: refused
/// until some are answered or expire.
pub const MAX_OPEN_PER_SESSION: usize = 64;
/// Bytes of approvals (what each is bound to, its preview) one relay
/// session may have open at once: names a host or server chose can be
/// long, so the count alone does not bound the table.
pub const MAX_BYTES_PER_SESSION: usize = 1024 * 1024;
/// Bytes of approvals open in the whole process, every session together.
pub const MAX_BYTES_TOTAL: usize = 32 * 1024 * 1024;

/// Whether `ask` would take its session past [`MAX_OPEN_PER_SESSION`]
/// or [`MAX_BYTES_PER_SESSION`], or the process past [`MAX_BYTES_TOTAL`]:
/// then it is not asked (a flood of questions, or of long names, stops
/// at its own session's share).
fn over_budget(t: &Table, ask: &Ask) -> bool {
    let bytes = cost(ask);
    let (mut open, mut session, mut total) = (0, 0, 0);
    for e in t.entries.values() {
        total += e.bytes;
        if e.ask.session == ask.session {
            open += 1;
            session += e.bytes;
        }
    }
    open >= MAX_OPEN_PER_SESSION
        || session + bytes > MAX_BYTES_PER_SESSION
        || total + bytes > MAX_BYTES_TOTAL
}

/// What an approval costs the table, in bytes: its binding, subject and
/// preview as JSON (the size the CLI and console are given), its ids.
fn cost(ask: &Ask) -> usize {
    let json =
        serde_json::to_vec(&(&ask.binding, &ask.subject, &ask.preview)).map_or(0, |v| v.len());
    json + ask.id.len() + ask.session.len() + ask.sandbox_id.len()
}

/// Delivers the answer to a held ask, exactly once.
pub type Deliver = Box<dyn FnOnce(Answer) + Send>;

/// What [`Broker::ask`] concluded at once.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Asked {
    /// A grant matched: go ahead now.
    Granted {
        /// The approval whose grant was used.
        id: String,
        /// Who gave it.
        by: String,
        /// How far it reached.
        scope: Scope,
    },
    /// It waits; the answer comes through the `Deliver` callback.
    Held,
    /// Not even asked: the session has [`MAX_OPEN_PER_SESSION`] approvals
    /// open already.
    TooMany,
    /// Refused for now: a human approves `id`, then the caller retries.
    Refused {
        /// The pending approval (an earlier one when this exact call was
        /// refused before and is still pending).
        id: String,
    },
    /// The approval named in [`Ask::answered`] is no longer open: a
    /// human denied it through the CLI or the console first (or it
    /// lapsed). The host's later yes does not revive it.
    Closed {
        /// That approval.
        id: String,
    },
}

/// How a session settled an approval itself ([`Broker::close`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Closed {
    /// Answered through elicitation.
    Answered(Answer),
    /// Its time passed in the session.
    Expired,
    /// The session ended (host gone, server down) while it waited.
    Abandoned,
    /// The host cancelled the request that waited.
    Cancelled,
}

/// An approval as the CLI and the console show it.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct View {
    /// Its id.
    pub id: String,
    /// `pending`, or `approved` (a grant waiting for the retry).
    pub state: &'static str,
    /// Whether a call waits for it (else the caller was refused and
    /// retries once it is approved).
    pub held: bool,
    /// Whether the host was asked through elicitation too.
    pub elicitation: bool,
    /// What it is bound to.
    #[serde(flatten)]
    pub binding: Binding,
    /// What waits.
    pub subject: Subject,
    /// The rule's reason code.
    pub reason: String,
    /// The rule that asked.
    pub rule: String,
    /// What the human needs to decide.
    pub preview: Value,
    /// Unix ms.
    pub created_ms: u64,
    /// Unix ms.
    pub expires_ms: u64,
    /// Who approved it (a grant).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub approved_by: Option<String>,
    /// The command that approves it.
    pub approve_command: String,
    /// The relay session it belongs to.
    pub session: String,
}

/// Why [`Broker::answer`] refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum AnswerError {
    /// No approval with this id (never, or answered, used, expired).
    #[error(
        "no pending approval {0} (it was answered, used, or expired, or belongs to another mcpbox)"
    )]
    Unknown(String),
    /// Approved already, waiting for the caller's retry.
    #[error("approval {0} was approved already; it waits for the caller to retry the same call")]
    AlreadyApproved(String),
    /// The id is not of the shape `ap-` + 12 hex digits.
    #[error("{0:?} is not an approval id (ap- and 12 hex digits)")]
    Malformed(String),
}

enum State {
    Pending { deliver: Option<Deliver> },
    Granted { by: String, scope: Scope },
}

struct Entry {
    ask: Ask,
    created: SystemTime,
    state: State,
    /// [`cost`] of `ask`.
    bytes: usize,
}

#[derive(Default)]
struct Table {
    /// By id.
    entries: BTreeMap<String, Entry>,
    /// (session, subject kind, tool or host:port) allowed for the rest of
    /// a session, with the subject the human approved: a later ask passes
    /// when that subject covers it (no more bytes than were shown).
    session_grants: HashMap<(String, &'static str, String), Subject>,
    /// Bumped on every change, for the console's live view.
    version: u64,
}

/// The broker. One per process; share it with [`Arc`].
pub struct Broker {
    table: Mutex<Table>,
    changed: Condvar,
    audit: Arc<dyn Sink>,
    notifier: std::sync::OnceLock<Notifier>,
    /// The time expiries are judged by: the system clock, or a test's.
    clock: Clock,
}

/// Where the broker reads the time ([`Broker::with_clock`]).
pub type Clock = Box<dyn Fn() -> SystemTime + Send + Sync>;

impl std::fmt::Debug for Broker {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Broker").finish_non_exhaustive()
    }
}

/// Whether `s` has the shape of an approval id.
pub fn is_id(s: &str) -> bool {
    s.len() == 15
        && s.starts_with("ap-")
        && s[3..]
            .bytes()
            .all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b))
}

/// The command that approves `id`.
pub fn approve_command(id: &str) -> String {
    format!("mcpbox approvals approve {id}")
}

fn unix_ms(t: SystemTime) -> u64 {
    t.duration_since(UNIX_EPOCH)
        .map_or(0, |d| u64::try_from(d.as_millis()).unwrap_or(u64::MAX))
}

/// Side effects decided under the lock, performed after it.
#[derive(Default)]
struct After {
    records: Vec<AuditEvent>,
    deliveries: Vec<(Deliver, Answer)>,
    /// New approvals a human outside the host must answer.
    new: Vec<View>,
}

/// Told of each new approval that no host form asks about (held without
/// elicitation, or refused): the binary runs `[approvals] notify` there.
pub type Notifier = Box<dyn Fn(&View) + Send + Sync>;

impl Broker {
    /// A broker writing its records to `audit`.
    pub fn new(audit: Arc<dyn Sink>) -> Arc<Broker> {
        Self::with_clock(audit, Box::new(SystemTime::now))
    }

    /// A broker that judges expiry by `clock` (tests move it instead of
    /// sleeping).
    pub fn with_clock(audit: Arc<dyn Sink>, clock: Clock) -> Arc<Broker> {
        Arc::new(Broker {
            table: Mutex::new(Table::default()),
            changed: Condvar::new(),
            audit,
            notifier: std::sync::OnceLock::new(),
            clock,
        })
    }

    fn now(&self) -> SystemTime {
        (self.clock)()
    }

    /// Sets who is told of new approvals a human outside the host must
    /// answer (the first call wins). Called after the records are written,
    /// outside the broker's lock.
    pub fn set_notifier(&self, notifier: Notifier) {
        let _ = self.notifier.set(notifier);
    }

    fn lock(&self) -> MutexGuard<'_, Table> {
        self.table.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Writes the records, then delivers; wakes the console's waiters.
    fn finish(&self, after: After) {
        if !after.records.is_empty() {
            self.audit.record_all(after.records);
        }
        for (deliver, answer) in after.deliveries {
            deliver(answer);
        }
        if let Some(n) = self.notifier.get() {
            for v in &after.new {
                n(v);
            }
        }
        self.changed.notify_all();
    }

    /// Removes what expired by `now`: pending entries (a held one is
    /// answered [`Answer::Expired`]) and unused grants.
    fn expire(table: &mut Table, now: SystemTime, after: &mut After) {
        let due: Vec<String> = table
            .entries
            .iter()
            .filter(|(_, e)| e.ask.expires <= now)
            .map(|(id, _)| id.clone())
            .collect();
        for id in due {
            if let Some(e) = table.entries.remove(&id) {
                table.version += 1;
                let unused = matches!(e.state, State::Granted { .. });
                after.records.push(record(
                    &e.ask,
                    "expired",
                    Verdict::Deny,
                    Reason::ApprovalTimeout,
                    "approval:broker",
                    json!({"unused_grant": unused}),
                ));
                if let State::Pending { deliver: Some(d) } = e.state {
                    after.deliveries.push((d, Answer::Expired));
                }
            }
        }
    }

    /// Registers `ask`, or answers it at once from a grant. `deliver` is
    /// called once with the answer of a held ask (from any thread; never
    /// under the broker's lock); it is dropped unused otherwise.
    pub fn ask(&self, ask: Ask, deliver: Deliver) -> Asked {
        let now = self.now();
        let mut after = After::default();
        let asked = {
            let mut t = self.lock();
            Self::expire(&mut t, now, &mut after);
            let kind = ask.subject.kind();
            let session_key = ask.session_key();
            // The host answered yes in the retried request: that grants
            // the approval it answered, if that is still open and bound to
            // exactly this call (a yes to call A never passes call B).
            let mut closed = None;
            let mut session_grant = false;
            if let Some((prior, scope)) = &ask.answered {
                match t.entries.get_mut(prior) {
                    Some(e)
                        if e.ask.binding == ask.binding
                            && e.ask.subject.kind() == kind
                            && e.ask.subject.covers(&ask.subject)
                            && matches!(e.state, State::Pending { deliver: None }) =>
                    {
                        e.state = State::Granted {
                            by: "elicitation".into(),
                            scope: *scope,
                        };
                        after.records.push(record(
                            &e.ask,
                            "approved",
                            Verdict::Allow,
                            Reason::ApprovalGranted,
                            "approval:elicitation",
                            json!({"scope": scope, "by": "elicitation"}),
                        ));
                        session_grant = *scope == Scope::Session;
                        t.version += 1;
                    }
                    // approved through the CLI or console already: used below
                    Some(e)
                        if e.ask.binding == ask.binding
                            && e.ask.subject.kind() == kind
                            && e.ask.subject.covers(&ask.subject)
                            && matches!(e.state, State::Granted { .. }) => {}
                    // denied, lapsed, another call, or it measures more
                    // now than the human saw: the host's yes is not for this
                    _ => closed = Some(prior.clone()),
                }
            }
            if session_grant {
                t.session_grants
                    .insert(session_key.clone(), ask.subject.clone());
            }
            let grant = t
                .entries
                .iter()
                .find(|(_, e)| {
                    matches!(e.state, State::Granted { .. })
                        && e.ask.binding == ask.binding
                        && e.ask.subject.kind() == kind
                        && e.ask.subject.covers(&ask.subject)
                })
                .map(|(id, _)| id.clone());
            // the answered approval is the grant this call uses
            let grant = match (&ask.answered, &closed) {
                (Some((prior, _)), None) => Some(prior.clone()),
                _ => grant,
            };
            if let Some(id) = closed {
                Asked::Closed { id }
            } else if ask.answered.is_none()
                && t.session_grants
                    .get(&session_key)
                    .is_some_and(|seen| seen.covers(&ask.subject))
            {
                after.records.push(record(
                    &ask,
                    "used",
                    Verdict::Allow,
                    Reason::ApprovalGranted,
                    "approval:session",
                    json!({"scope": "session"}),
                ));
                Asked::Granted {
                    id: ask.id.clone(),
                    by: "session".into(),
                    scope: Scope::Session,
                }
            } else if let Some((id, granted, by, scope)) =
                grant.and_then(|id| match t.entries.remove(&id) {
                    Some(Entry {
                        ask,
                        state: State::Granted { by, scope },
                        ..
                    }) => Some((id, ask, by, scope)),
                    _ => None, // filtered on Granted above
                })
            {
                t.version += 1;
                after.records.push(record(
                    &granted,
                    "used",
                    Verdict::Allow,
                    Reason::ApprovalGranted,
                    &format!("approval:{by}"),
                    json!({"scope": scope, "by": by}),
                ));
                Asked::Granted { id, by, scope }
            } else if over_budget(&t, &ask) {
                Asked::TooMany
            } else if !ask.hold {
                // The same call refused before and still pending: the same
                // id again, so that a host retrying in a loop does not
                // fill the table (and the human sees one entry).
                let earlier = t
                    .entries
                    .iter()
                    .find(|(_, e)| {
                        matches!(e.state, State::Pending { deliver: None })
                            && e.ask.binding == ask.binding
                            && e.ask.subject.kind() == kind
                            && e.ask.subject.covers(&ask.subject)
                    })
                    .map(|(id, _)| id.clone());
                match earlier {
                    Some(id) => Asked::Refused { id },
                    None => {
                        let id = ask.id.clone();
                        after.records.push(requested(&ask));
                        let e = Entry {
                            bytes: cost(&ask),
                            ask,
                            created: now,
                            state: State::Pending { deliver: None },
                        };
                        if !e.ask.elicitation {
                            // asked in the host already (an input-required
                            // form): no second notice
                            after.new.push(view(&e, None));
                        }
                        t.entries.insert(id.clone(), e);
                        t.version += 1;
                        Asked::Refused { id }
                    }
                }
            } else {
                after.records.push(requested(&ask));
                let e = Entry {
                    bytes: cost(&ask),
                    ask,
                    created: now,
                    state: State::Pending {
                        deliver: Some(deliver),
                    },
                };
                if !e.ask.elicitation {
                    after.new.push(view(&e, None));
                }
                t.entries.insert(e.ask.id.clone(), e);
                t.version += 1;
                Asked::Held
            }
        };
        self.finish(after);
        asked
    }

    /// A human's answer to `id` (`approve` with `scope`, or deny), `by`
    /// naming the channel and who (`cli:uid=1000`, `console`). A held
    /// call gets the answer at once; a refused call's approval becomes a
    /// grant for its retry.
    pub fn answer(
        &self,
        id: &str,
        approve: bool,
        scope: Scope,
        by: &str,
    ) -> Result<View, AnswerError> {
        if !is_id(id) {
            return Err(AnswerError::Malformed(id.chars().take(40).collect()));
        }
        let now = self.now();
        let mut after = After::default();
        let result = {
            let mut t = self.lock();
            Self::expire(&mut t, now, &mut after);
            let found = match t.entries.remove(id) {
                None => Err(AnswerError::Unknown(id.to_string())),
                Some(e) if matches!(e.state, State::Granted { .. }) => {
                    // put back untouched: approved already, waiting for the retry
                    t.entries.insert(id.to_string(), e);
                    Err(AnswerError::AlreadyApproved(id.to_string()))
                }
                Some(e) => Ok(e),
            };
            match found {
                Err(e) => Err(e),
                Ok(mut e) => {
                    t.version += 1;
                    let source = format!("approval:{by}");
                    if approve {
                        after.records.push(record(
                            &e.ask,
                            "approved",
                            Verdict::Allow,
                            Reason::ApprovalGranted,
                            &source,
                            json!({"scope": scope, "by": by}),
                        ));
                        if scope == Scope::Session {
                            t.session_grants
                                .insert(e.ask.session_key(), e.ask.subject.clone());
                        }
                    } else {
                        after.records.push(record(
                            &e.ask,
                            "denied",
                            Verdict::Deny,
                            Reason::ApprovalDeclined,
                            &source,
                            json!({"by": by}),
                        ));
                    }
                    let answer = if approve {
                        Answer::Approved {
                            by: by.to_string(),
                            scope,
                        }
                    } else {
                        Answer::Denied { by: by.to_string() }
                    };
                    let state = std::mem::replace(&mut e.state, State::Pending { deliver: None });
                    match state {
                        State::Pending { deliver: Some(d) } => {
                            after.deliveries.push((d, answer));
                            Ok(view(&e, Some("answered")))
                        }
                        _ if approve && scope == Scope::Once => {
                            // refused earlier: now a grant for the retry
                            e.state = State::Granted {
                                by: by.to_string(),
                                scope,
                            };
                            let v = view(&e, None);
                            t.entries.insert(id.to_string(), e);
                            Ok(v)
                        }
                        _ => Ok(view(&e, Some("answered"))),
                    }
                }
            }
        };
        self.finish(after);
        result
    }

    /// The session settled `id` itself (elicitation answered, its timer,
    /// its end, a cancel). No-op when the broker no longer has it.
    pub fn close(&self, id: &str, how: Closed) {
        let mut after = After::default();
        {
            let mut t = self.lock();
            let Some(e) = t.entries.remove(id) else {
                return;
            };
            t.version += 1;
            if let Closed::Answered(Answer::Approved {
                scope: Scope::Session,
                ..
            }) = &how
            {
                // the host's form said "for this session": the tool's
                // later calls in this session pass, as after `--session`
                t.session_grants
                    .insert(e.ask.session_key(), e.ask.subject.clone());
            }
            let (action, verdict, reason, source, detail) = match &how {
                Closed::Answered(Answer::Approved { by, scope }) => (
                    "approved",
                    Verdict::Allow,
                    Reason::ApprovalGranted,
                    format!("approval:{by}"),
                    json!({"scope": scope, "by": by}),
                ),
                Closed::Answered(Answer::Denied { by }) => (
                    "denied",
                    Verdict::Deny,
                    Reason::ApprovalDeclined,
                    format!("approval:{by}"),
                    json!({"by": by}),
                ),
                Closed::Answered(Answer::Expired) | Closed::Expired => (
                    "expired",
                    Verdict::Deny,
                    Reason::ApprovalTimeout,
                    "approval:broker".into(),
                    Value::Null,
                ),
                Closed::Abandoned => (
                    "abandoned",
                    Verdict::Deny,
                    Reason::ApprovalAbandoned,
                    "approval:session".into(),
                    Value::Null,
                ),
                Closed::Cancelled => (
                    "cancelled",
                    Verdict::Deny,
                    Reason::ApprovalDeclined,
                    "approval:host".into(),
                    Value::Null,
                ),
            };
            after
                .records
                .push(record(&e.ask, action, verdict, reason, &source, detail));
        }
        self.finish(after);
    }

    /// A relay session ended: whatever of it still waits is abandoned
    /// (audited), its grants are gone.
    pub fn end_session(&self, session: &str) {
        let mut after = After::default();
        {
            let mut t = self.lock();
            let ids: Vec<String> = t
                .entries
                .iter()
                .filter(|(_, e)| e.ask.session == session)
                .map(|(id, _)| id.clone())
                .collect();
            for id in ids {
                if let Some(e) = t.entries.remove(&id) {
                    let unused = matches!(e.state, State::Granted { .. });
                    after.records.push(record(
                        &e.ask,
                        "abandoned",
                        Verdict::Deny,
                        Reason::ApprovalAbandoned,
                        "approval:session",
                        json!({"unused_grant": unused}),
                    ));
                    if let State::Pending { deliver: Some(d) } = e.state {
                        after.deliveries.push((d, Answer::Expired));
                    }
                }
            }
            t.session_grants.retain(|(s, _, _), _| s != session);
            t.version += 1;
        }
        self.finish(after);
    }

    /// Everything that waits for a human, oldest first (expired entries
    /// are removed, and audited, first).
    pub fn list(&self) -> Vec<View> {
        let mut after = After::default();
        let views = {
            let mut t = self.lock();
            Self::expire(&mut t, self.now(), &mut after);
            let mut v: Vec<View> = t.entries.values().map(|e| view(e, None)).collect();
            v.sort_by(|a, b| a.created_ms.cmp(&b.created_ms).then(a.id.cmp(&b.id)));
            v
        };
        self.finish(after);
        views
    }

    /// One approval.
    pub fn get(&self, id: &str) -> Option<View> {
        self.list().into_iter().find(|v| v.id == id)
    }

    /// The table's version: it changes whenever anything is asked,
    /// answered, used or expires.
    pub fn version(&self) -> u64 {
        self.lock().version
    }

    /// Waits until the version differs from `seen`, at most `wait`;
    /// returns the version then (the console's live updates). An approval
    /// lapsing is a change too: the wait ends at the earliest expiry, which
    /// is then applied (and audited) like any other.
    pub fn wait_changed(&self, seen: u64, wait: Duration) -> u64 {
        let deadline = std::time::Instant::now() + wait;
        loop {
            let t = self.lock();
            let now = std::time::Instant::now();
            if t.version != seen || now >= deadline {
                return t.version;
            }
            let left = deadline - now;
            // a little past the expiry, so that it has passed when looked at
            let step = t
                .entries
                .values()
                .map(|e| e.ask.expires)
                .min()
                .map(|x| x.duration_since(self.now()).unwrap_or_default())
                .map_or(left, |d| left.min(d + Duration::from_millis(5)));
            let (t, _) = self
                .changed
                .wait_timeout_while(t, step, |t| t.version == seen)
                .unwrap_or_else(PoisonError::into_inner);
            if t.version != seen {
                return t.version;
            }
            drop(t);
            // whatever lapsed meanwhile goes (bumping the version)
            let mut after = After::default();
            {
                let mut t = self.lock();
                Self::expire(&mut t, self.now(), &mut after);
            }
            self.finish(after);
        }
    }
}

impl Ask {
    /// What "allow for this session" covers: this tool's calls (or
    /// results) whatever their arguments, or this one host and port.
    fn session_key(&self) -> (String, &'static str, String) {
        let what = match &self.subject {
            Subject::Network { host, port } => format!("{host}:{port}"),
            _ => self.binding.tool.clone(),
        };
        (self.session.clone(), self.subject.kind(), what)
    }
}

fn view(e: &Entry, answered: Option<&'static str>) -> View {
    let (state, approved_by) = match (&e.state, answered) {
        (_, Some(s)) => (s, None),
        (State::Granted { by, .. }, None) => ("approved", Some(by.clone())),
        (State::Pending { .. }, None) => ("pending", None),
    };
    View {
        id: e.ask.id.clone(),
        state,
        held: e.ask.hold,
        elicitation: e.ask.elicitation,
        binding: e.ask.binding.clone(),
        subject: e.ask.subject.clone(),
        reason: e.ask.rule.reason.to_string(),
        rule: e.ask.rule.source.to_string(),
        preview: e.ask.preview.clone(),
        created_ms: unix_ms(e.created),
        expires_ms: unix_ms(e.ask.expires),
        approved_by,
        approve_command: approve_command(&e.ask.id),
        session: e.ask.session.clone(),
    }
}

fn requested(ask: &Ask) -> AuditEvent {
    record(
        ask,
        "requested",
        Verdict::Approve,
        ask.rule.reason,
        &ask.rule.source.to_string(),
        json!({
            "hold": ask.hold,
            "elicitation": ask.elicitation,
            "expires_ms": unix_ms(ask.expires),
        }),
    )
}

/// One `approval` record. Never the arguments: their digest, the
/// subject's kind (a network subject names its host and port, which the
/// network records name too).
fn record(
    ask: &Ask,
    action: &str,
    verdict: Verdict,
    reason: Reason,
    source: &str,
    extra: Value,
) -> AuditEvent {
    let mut detail = json!({
        "action": action,
        "approval": ask.id,
        "session": ask.session,
        "subject": ask.subject,
        "policy_version": ask.binding.policy_version,
    });
    if let (Some(d), Value::Object(x)) = (detail.as_object_mut(), extra) {
        d.extend(x);
    }
    AuditEvent {
        kind: Some(Kind::Approval),
        sandbox_id: ask.sandbox_id.clone(),
        server: ask.binding.server.clone(),
        caller: ask.binding.caller.clone(),
        tool: Some(ask.binding.tool.clone()),
        decision: Some(verdict),
        reason: Some(reason.to_string()),
        source: Some(source.to_string()),
        args_digest: Some(ask.binding.args_digest.clone()),
        detail,
        ..AuditEvent::default()
    }
}

#[cfg(test)]
mod tests;
