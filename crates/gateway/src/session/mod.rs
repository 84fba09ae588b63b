//! The relay's protocol core: one MCP session as a state machine that
//! performs no I/O (CONVENTIONS.md rule 11, after quinn-proto's
//! `Connection`).
//!
//! A driver feeds it [`Event`]s with the time ([`Now`]) and performs the
//! [`Effect`]s it returns, in order; after each batch it asks
//! [`Session::deadline`] when to wake the session with [`Event::Timer`]
//! (quinn's `poll_timeout`: arming a timer is not an effect). The session
//! never blocks, locks, spawns, reads a clock or touches a file: starting
//! and stopping the server, writing the pin file, asking a fallback
//! approver and answering a question from outside are all effects.
//!
//! Sub-states own their data: [`calls`] the requests in flight and their
//! timeouts, [`approvals`] the calls waiting for a human and the questions
//! put to the host, [`tools`] the pinned tool list and description
//! screening, [`output`] what is done to a result on its way to the host,
//! [`supervise`] the server's lifecycle (start, exit detection, shutdown
//! escalation, the secret TTL restart and the end of the session).
//!
//! Clocks: `now.mono` drives every timer; `now.wall` only stamps audit
//! records (`time_ms`), the expiry shown in approval prompts, and the start
//! of a call for its `files_written`. The driver reads both clocks once per
//! event ([`Now::system`]); tests pass made-up ones.

use std::collections::HashSet;
use std::sync::Arc;
use std::time::{Instant, SystemTime, UNIX_EPOCH};

use mcpbox_audit::{Event as AuditEvent, Kind};
use mcpbox_policy::{Decision, Reason, Source, ToolHints};
use serde_json::{json, Value};

use crate::launcher::ExitInfo;
use crate::lines::Line;
use crate::message::{at, error_line, id_key, to_line, Invalid, Message, Shape};
use crate::pin::{PinStore, PinWrite};
use crate::policy::{ApprovalAnswer, ToolPolicy};
use crate::redact::Redactor;
use crate::secrets::{Secret, Secrets};
use crate::{Config, EndReason, Outcome};

pub mod approvals;
pub mod calls;
mod host;
mod host_in;
pub mod output;
mod stderr;
pub mod supervise;
pub mod tools;

#[cfg(test)]
mod tests;

use approvals::{Approvals, Channel};
use calls::Calls;
use mcpbox_policy::mcp::STATELESS_REVISION;
use supervise::Supervisor;
use tools::ToolScreen;

/// `_meta` keys of the stateless revision ([`mcpbox_policy::mcp`]): a
/// request's protocol revision (its presence marks a request of that
/// revision, whose server sends the client no requests of its own;
/// elicitation rides in an `InputRequiredResult` instead) and its client
/// capabilities.
pub use mcpbox_policy::mcp::{META_CLIENT_CAPS, META_PROTOCOL_VERSION};

/// The two clocks, read once per event.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Now {
    /// Monotonic time: every deadline is in this clock.
    pub mono: Instant,
    /// Wall-clock time, for audit records and prompts only.
    pub wall: SystemTime,
}

impl Now {
    /// Both clocks of the system, now.
    pub fn system() -> Now {
        Now {
            mono: Instant::now(),
            wall: SystemTime::now(),
        }
    }

    /// Unix time in milliseconds.
    pub fn unix_ms(&self) -> i64 {
        self.wall
            .duration_since(UNIX_EPOCH)
            .map_or(0, |d| i64::try_from(d.as_millis()).unwrap_or(i64::MAX))
    }
}

/// Something that happened, fed into [`Session::on`].
#[derive(Debug)]
pub enum Event {
    /// A line from the host ([`Line::Eof`]: the host closed its output,
    /// or reading it failed).
    Host(Line),
    /// Writing to the host failed: it went away.
    HostGone,
    /// A line from the server's stdout; [`Line::Eof`] when it closed.
    /// `gen` is the server generation the line came from (1 for the first
    /// start, +1 per restart); lines of an old generation are ignored.
    Server {
        /// Server generation.
        gen: u32,
        /// The line.
        line: Line,
    },
    /// The server process has exited (the answer to
    /// [`Effect::CheckServer`], or learnt otherwise).
    ServerExited {
        /// Server generation.
        gen: u32,
        /// How it ended.
        exit: ExitInfo,
    },
    /// [`Effect::StartServer`] succeeded. `secrets` are the values the
    /// server was started with (refreshed when the effect asked for it).
    ServerStarted {
        /// Server generation.
        gen: u32,
        /// The secrets as launched.
        secrets: Secrets,
        /// What the launch says of the server (its sandbox tier, how its
        /// files are known), added to the `session_start` record's detail;
        /// `Null` for nothing.
        facts: Value,
    },
    /// [`Effect::StartServer`] failed.
    ServerStartFailed {
        /// Server generation.
        gen: u32,
        /// What went wrong, for the log.
        error: String,
    },
    /// The server's stderr closed; `redactions` counts the secrets
    /// redacted from it, by name.
    StderrClosed {
        /// Server generation.
        gen: u32,
        /// `(secret name, count)` for each secret found.
        redactions: Vec<(String, usize)>,
        /// Its last lines, redacted and sanitized as logged (at most
        /// [`supervise::STDERR_TAIL_LINES`] lines of
        /// [`supervise::STDERR_TAIL_BYTES`] bytes in all, oldest first):
        /// the error of a request the server never answered carries them.
        tail: Vec<String>,
    },
    /// The audit sink's health changed: `false` when a record could not
    /// be written and waits in memory (a full disk, a locked or broken
    /// database), `true` once everything is written again. Logged; what
    /// refuses calls meanwhile is each call's own start record, which must
    /// be committed before the call goes ([`Effect::CommitAudit`]).
    AuditHealth {
        /// Whether every record handed over is written.
        ok: bool,
    },
    /// The answer to [`Effect::CommitAudit`] `key`: the record is in the
    /// log, or why it is not.
    AuditCommitted {
        /// The key of the request.
        key: u64,
        /// `Err`: nothing of the record was written (a full disk, a
        /// locked, unwritable or broken database).
        result: Result<(), mcpbox_audit::Unwritten>,
    },
    /// [`Session::deadline`] has passed.
    Timer,
    /// The argument rules answered [`Effect::CheckArguments`] `key`.
    ArgumentsChecked {
        /// The key of the request.
        key: u64,
        /// What they concluded (None: no rule applied). Boxed: events
        /// travel through the driver's channel and stay small.
        check: Option<Box<crate::ArgumentCheck>>,
    },
    /// The approval broker answered [`Effect::AskApprover`] `key` (at once
    /// from a grant or a refusal, or later from a human).
    Approval {
        /// The key of the request.
        key: u64,
        /// The answer.
        answer: ApprovalAnswer,
    },
    /// The approval broker holds [`Effect::AskApprover`] `key`: no grant
    /// answered it at once, so the host may now be asked through its form
    /// (a grant would have made that form moot).
    ApprovalHeld {
        /// The key of the request.
        key: u64,
    },
    /// A question from outside the session (a network approval from the
    /// egress proxy), to be put to the host through elicitation; answered
    /// by [`Effect::Answer`] with the same `ticket`.
    Ask {
        /// Chosen by the driver, unique among open questions.
        ticket: u64,
        /// The question.
        question: Question,
    },
    /// The lifecycle's idle stop: stop the server but keep the session;
    /// the next host message starts it again (ignored while anything is
    /// in flight).
    Park,
    /// Start a parked server now.
    Wake,
}

/// A question for the host, asked with `elicitation/create` (form mode).
#[derive(Debug, Clone)]
pub struct Question {
    /// Prefix of the request id (the session adds its nonce and a counter),
    /// e.g. `mcpbox-network`.
    pub prefix: &'static str,
    /// The text the human reads.
    pub message: String,
    /// The form's `requestedSchema`.
    pub schema: Value,
    /// How long the question may stay open.
    pub wait: std::time::Duration,
    /// Ask only if the host's last word was that it answers elicitation
    /// (questions not bound to a host request, such as network approvals);
    /// otherwise answer [`Asked::Unavailable`] at once.
    pub needs_capability: bool,
}

/// The answer to an outside [`Question`].
#[derive(Debug, Clone, PartialEq)]
pub enum Asked {
    /// The host's whole JSON-RPC response (result or error).
    Response(Value),
    /// The question could not be asked (no capability, host gone).
    Unavailable,
    /// Nobody answered in time.
    Timeout,
}

/// Something for the driver to do, returned by [`Session::on`] in the
/// order it must be done.
#[derive(Debug)]
pub enum Effect {
    /// Write one line (without its newline) to the host.
    WriteHost(Vec<u8>),
    /// Write one line (without its newline) to the stdin of server `gen`.
    WriteServer {
        /// Server generation.
        gen: u32,
        /// The line.
        line: Vec<u8>,
    },
    /// Close the stdin of server `gen` (the polite stop).
    CloseServerStdin {
        /// Server generation.
        gen: u32,
    },
    /// Ask server `gen` to stop (SIGTERM).
    TerminateServer {
        /// Server generation.
        gen: u32,
    },
    /// Kill server `gen` and what it started.
    KillServer {
        /// Server generation.
        gen: u32,
    },
    /// Check, without blocking, whether server `gen` has exited; if it
    /// has, feed [`Event::ServerExited`].
    CheckServer {
        /// Server generation.
        gen: u32,
    },
    /// Start server generation `gen` with `secrets` in its environment,
    /// after loading fresh values when `refresh` is set (that may run a
    /// command: do it off the driver loop). Answer with
    /// [`Event::ServerStarted`] or [`Event::ServerStartFailed`].
    StartServer {
        /// Server generation.
        gen: u32,
        /// The secrets to inject.
        secrets: Secrets,
        /// Load fresh values first (secret TTL).
        refresh: bool,
    },
    /// Write an audit record (off the host path, in order).
    Audit(Record),
    /// Write this record now and say whether it is committed, with
    /// [`Event::AuditCommitted`] `key`, before anything else of the
    /// session happens: a call's start ([`mcpbox_audit::Kind::CallStart`]),
    /// which must be in the log before the call goes to the server (the
    /// call waits for the answer and is refused if it is not).
    CommitAudit {
        /// Echoed in the answer.
        key: u64,
        /// The record, `time_ms` filled in.
        event: AuditEvent,
    },
    /// Write the pin file or its pending twin.
    WritePins(PinWrite),
    /// Run the policy's argument rules on a held call
    /// ([`crate::ToolPolicy::check_arguments`]); answer with
    /// [`Event::ArgumentsChecked`].
    CheckArguments {
        /// Echoed in the answer.
        key: u64,
        /// The tool.
        tool: String,
        /// The call's arguments, as sent.
        arguments: Option<Value>,
    },
    /// Register the approval with the broker; its answer comes back as
    /// [`Event::Approval`] with `key` (at once for a grant or a refusal).
    AskApprover {
        /// Echoed in the answer.
        key: u64,
        /// The approval.
        ask: crate::broker::Ask,
    },
    /// The session settled approval `id` itself (elicitation answered, its
    /// time passed, the host cancelled the call, the session ended): the
    /// broker forgets it and records how.
    ApprovalClosed {
        /// The approval.
        id: String,
        /// How it ended.
        how: crate::broker::Closed,
    },
    /// Answer the outside question `ticket` ([`Event::Ask`]).
    Answer {
        /// The ticket of the question.
        ticket: u64,
        /// The answer.
        answer: Asked,
    },
    /// The session is over; nothing more will come. The server has exited.
    End(Outcome),
}

/// One audit record.
#[derive(Debug, Clone)]
pub struct Record {
    /// The record, `time_ms` filled in.
    pub event: AuditEvent,
    /// For a finished `tools/call` with an output directory configured:
    /// when the call started, so the writer can list the files it wrote
    /// (`files_written`, [`crate::written`]) when it writes the record.
    pub files_since: Option<SystemTime>,
    /// The files the kernel saw the call touch ([`crate::touched`]),
    /// filled in by the driver where it watches them; they then replace
    /// the walk.
    pub files: Option<crate::touched::CallFiles>,
}

/// Secret values and their redactor, old values included.
struct Redaction {
    secrets: Secrets,
    /// Values replaced by a TTL refresh: a server may have cached them.
    retired: Vec<(String, String)>,
    redactor: Arc<Redactor>,
}

impl Redaction {
    fn new(secrets: Secrets) -> Redaction {
        let redactor = Arc::new(Redactor::new(
            secrets
                .0
                .iter()
                .flat_map(Secret::redacted)
                .map(|(n, v)| (n, v.as_bytes())),
        ));
        Redaction {
            secrets,
            retired: Vec::new(),
            redactor,
        }
    }

    /// Takes the values a server was (re)started with; old ones stay
    /// redacted.
    fn update(&mut self, fresh: Secrets) {
        let same = fresh.0.len() == self.secrets.0.len()
            && fresh
                .0
                .iter()
                .zip(&self.secrets.0)
                .all(|(a, b)| a.name == b.name && a.value == b.value);
        if same {
            return;
        }
        for s in &self.secrets.0 {
            for (name, value) in s.redacted() {
                if !self.retired.iter().any(|(n, v)| n == name && v == value) {
                    self.retired.push((name.to_string(), value.to_string()));
                }
            }
        }
        self.secrets = fresh;
        let mut all = self.retired.clone();
        all.extend(
            self.secrets
                .0
                .iter()
                .flat_map(Secret::redacted)
                .map(|(n, v)| (n.to_string(), v.to_string())),
        );
        self.redactor = Arc::new(Redactor::new(
            all.iter().map(|(n, v)| (n.as_str(), v.as_bytes())),
        ));
    }
}

/// What the host told us about itself.
#[derive(Default)]
struct HostState {
    /// When the host closed its output.
    closed: Option<Instant>,
    /// Writing to the host failed.
    gone: bool,
    /// Form elicitation as declared at `initialize`.
    elicitation: bool,
    /// Whether a request of ours (`elicitation/create`) can reach the host,
    /// as it last said, at `initialize` or in a request's `_meta`: what
    /// questions outside a request and held results go by. Never for a
    /// host of the stateless revision, which takes no such requests.
    last_elicitation: bool,
    /// The host's `initialize` params, replayed to a restarted server.
    initialize_params: Option<Value>,
    /// The protocol revision the session speaks, for its end record: what
    /// the server answered `initialize` with, or the stateless revision
    /// when the host discovered instead.
    protocol: Option<String>,
}

/// One relay session. See the module docs.
pub struct Session {
    config: Config,
    policy: Arc<dyn ToolPolicy>,
    /// Whether an approval broker exists (the driver asks it).
    fallback_approver: bool,
    /// This session's name in the approval broker: public, unlike the
    /// nonce it is derived from.
    tag: String,
    /// Unguessable, per session: in the ids of our own requests to the
    /// host, so a server cannot forge an answer by reusing an id.
    nonce: String,
    host: HostState,
    calls: Calls,
    /// Calls held while the driver runs their argument rules, with their
    /// message.
    checking: std::collections::HashMap<u64, (calls::Held, Value)>,
    next_check: u64,
    /// The server's requests the host has yet to answer, under ids of
    /// ours ([`calls::ServerAsks`]).
    server_asks: calls::ServerAsks,
    /// Allowed calls waiting for their start record to be committed
    /// ([`Effect::CommitAudit`]), by key.
    starting: std::collections::HashMap<u64, calls::Starting>,
    next_commit: u64,
    approvals: Approvals,
    tools: ToolScreen,
    server: Supervisor,
    redaction: Redaction,
    /// Whether the audit log took the last record handed to it
    /// ([`Event::AuditHealth`], [`Event::AuditCommitted`]): for the log
    /// lines of its changes.
    audit_ok: bool,
    /// `(tool, rule)` pairs already flagged, to flag each once.
    flagged: HashSet<(String, Reason)>,
    template: AuditEvent,
    /// Effects of the event being handled.
    out: Vec<Effect>,
    /// The current event's clocks.
    now: Now,
}

impl Session {
    /// A session for one server. `pins` is the opened pin store (the driver
    /// reads the file); `nonce` must be unguessable by the server (the
    /// driver draws it from the OS); `fallback_approver` says whether the
    /// driver has an approval broker to perform [`Effect::AskApprover`].
    pub fn new(
        config: Config,
        policy: Arc<dyn ToolPolicy>,
        secrets: Secrets,
        pins: Option<PinStore>,
        fallback_approver: bool,
        nonce: String,
        now: Now,
    ) -> Session {
        let template = AuditEvent {
            sandbox_id: config.sandbox_id.clone(),
            workspace_id: config.workspace_id.clone(),
            server: config.server_name.clone(),
            caller: config.caller.clone(),
            detail: Value::Null,
            ..AuditEvent::default()
        };
        let tools = ToolScreen::new(pins);
        Session {
            policy,
            fallback_approver,
            tag: format!(
                "s-{}",
                &crate::digest::sha256_hex(format!("session-tag:{nonce}").as_bytes())[..12]
            ),
            nonce,
            host: HostState::default(),
            calls: Calls::default(),
            checking: std::collections::HashMap::new(),
            next_check: 0,
            server_asks: calls::ServerAsks::default(),
            starting: std::collections::HashMap::new(),
            next_commit: 0,
            approvals: Approvals::default(),
            tools,
            server: Supervisor::new(now.mono),
            redaction: Redaction::new(secrets),
            audit_ok: true,
            flagged: HashSet::new(),
            template,
            out: Vec::new(),
            now,
            config,
        }
    }

    /// Starts the session: asks for the first server.
    pub fn start(&mut self, now: Now) -> Vec<Effect> {
        self.now = now;
        self.start_server(false);
        std::mem::take(&mut self.out)
    }

    /// Handles one event at `now`; returns what to do, in order.
    pub fn on(&mut self, event: Event, now: Now) -> Vec<Effect> {
        self.now = now;
        if self.server.ended() {
            // Nothing after the end, except answers owed to outsiders.
            if let Event::Ask { ticket, .. } = event {
                self.out.push(Effect::Answer {
                    ticket,
                    answer: Asked::Unavailable,
                });
            }
            return std::mem::take(&mut self.out);
        }
        if matches!(event, Event::Host(_) | Event::Server { .. }) {
            self.server.active(now.mono);
        }
        match event {
            Event::Host(line) => self.on_host(line),
            Event::HostGone => self.host_gone(),
            Event::Server { gen, line } => {
                if gen == self.server.gen() {
                    self.server.heard(now.mono);
                    self.on_server(line);
                }
            }
            Event::ServerExited { gen, exit } => self.server_exited(gen, exit),
            Event::ServerStarted {
                gen,
                secrets,
                facts,
            } => self.server_started(gen, secrets, facts),
            Event::ServerStartFailed { gen, error } => self.server_start_failed(gen, &error),
            Event::AuditHealth { ok } => self.audit_health(ok),
            Event::AuditCommitted { key, result } => self.audit_committed(key, result),
            Event::StderrClosed {
                gen,
                redactions,
                tail,
            } => self.stderr_closed(gen, redactions, tail),
            Event::Timer => {}
            Event::Approval { key, answer } => self.approval_answered(key, answer),
            Event::ApprovalHeld { key } => self.approval_held(key),
            Event::ArgumentsChecked { key, check } => {
                self.arguments_checked(key, check.map(|c| *c))
            }
            Event::Ask { ticket, question } => self.ask(ticket, question),
            Event::Park => self.park(),
            Event::Wake => self.wake(),
        }
        self.tick();
        std::mem::take(&mut self.out)
    }

    /// This session's tag in the approval broker (`s-` and 12 hex digits).
    pub fn tag(&self) -> &str {
        &self.tag
    }

    /// When to feed [`Event::Timer`] next; `None` once the session ended.
    pub fn deadline(&self) -> Option<Instant> {
        if self.server.ended() {
            return None;
        }
        let mut d = self.server_deadline();
        for t in [self.calls.deadline(), self.approvals.deadline()]
            .into_iter()
            .flatten()
        {
            d = Some(d.map_or(t, |d: Instant| d.min(t)));
        }
        d
    }

    /// The tool calls the server is working on, as (reference, tool),
    /// oldest first.
    pub fn calls_in_flight(&self) -> Vec<(String, String)> {
        self.calls.tool_calls()
    }

    /// A generation that moves whenever [`Session::calls_in_flight`] may
    /// have changed, so that a driver copies the set only then.
    pub fn calls_gen(&self) -> u64 {
        self.calls.gen()
    }

    /// Who the records name as the caller (the host's name once it gave
    /// one at `initialize`).
    pub fn caller(&self) -> &str {
        &self.template.caller
    }

    /// Whether anything is under way: a request in flight, a call held for
    /// approval, host messages waiting for the server. The lifecycle's
    /// idle clock runs only while this is false.
    pub fn busy(&self) -> bool {
        !self.calls.is_empty()
            || !self.approvals.is_empty()
            || !self.starting.is_empty()
            || self.server.has_held()
    }

    /// Whether the server is parked ([`Event::Park`]): no process.
    pub fn parked(&self) -> bool {
        self.server.parked()
    }

    /// The redactor for the server's stderr (current and retired secret
    /// values).
    pub fn redactor(&self) -> Arc<Redactor> {
        self.redaction.redactor.clone()
    }

    /// True once [`Effect::End`] was returned.
    pub fn is_ended(&self) -> bool {
        self.server.ended()
    }

    /// The current server generation.
    pub fn server_gen(&self) -> u32 {
        self.server.gen()
    }

    /// Runs the timers due at `self.now`.
    fn tick(&mut self) {
        self.call_timeouts();
        self.approval_timeouts();
        self.supervise();
    }

    // ---- output helpers ---------------------------------------------

    /// Writes one line to the host (unless it is gone).
    fn send_host(&mut self, line: Vec<u8>) {
        if !self.host.gone {
            self.out.push(Effect::WriteHost(line));
        }
    }

    fn host_value(&mut self, v: &Value) {
        self.send_host(to_line(v));
    }

    fn host_error(&mut self, id: &Value, code: i64, message: &str, data: Option<Value>) {
        self.send_host(error_line(id, code, message, data));
    }

    /// Writes one line to the current server, if its stdin is open.
    fn send_server(&mut self, line: Vec<u8>) {
        if let Some(gen) = self.server.writable() {
            self.out.push(Effect::WriteServer { gen, line });
        }
    }

    fn audit(&mut self, kind: Kind, fill: impl FnOnce(&mut AuditEvent)) {
        let e = self.audit_event(kind, fill);
        self.out.push(Effect::Audit(Record {
            event: e,
            files_since: None,
            files: None,
        }));
    }

    fn audit_event(&self, kind: Kind, fill: impl FnOnce(&mut AuditEvent)) -> AuditEvent {
        let mut e = self.template.clone();
        e.time_ms = self.now.unix_ms();
        e.kind = Some(kind);
        fill(&mut e);
        e
    }

    /// The audit log's state changed (the writer's word, or a commit's):
    /// said once per change.
    fn audit_health(&mut self, ok: bool) {
        if ok != self.audit_ok {
            if ok {
                tracing::warn!(server = %self.config.server_name, "the audit log is written again: calls are accepted");
            } else if self.config.run_unaudited {
                tracing::error!(server = %self.config.server_name, "the audit log cannot be written: calls go on, their records wait in memory ([audit] on_failure = \"continue\")");
            } else {
                tracing::error!(server = %self.config.server_name, "the audit log cannot be written: calls are refused until it can ([audit] on_failure)");
            }
        }
        self.audit_ok = ok;
    }

    /// Flags `rule` for `tool` once per session (log and audit).
    fn flag(&mut self, tool: Option<&str>, rule: Reason, source: Source) {
        let key = (tool.unwrap_or("").to_string(), rule);
        if !self.flagged.insert(key) {
            return;
        }
        tracing::warn!(server = %self.config.server_name, tool = tool.unwrap_or(""), rule = rule.as_str(), "flagged");
        self.audit(Kind::Flag, |e| {
            e.tool = tool.map(str::to_string);
            e.reason = Some(rule.as_str().to_string());
            e.source = Some(source.to_string());
        });
    }

    /// The policy's decision, made with and without the server's hints;
    /// the stricter one wins, so untrusted annotations can only tighten.
    fn decide(&self, tool: &str, hints: &ToolHints) -> Decision {
        let with = self.policy.decide(tool, hints);
        if *hints == ToolHints::default() {
            return with;
        }
        // on a tie the decision made with the hints is kept (it names the
        // hint rule that applied)
        with.stricter(self.policy.decide(tool, &ToolHints::default()))
    }
}

fn ms(d: std::time::Duration) -> u64 {
    u64::try_from(d.as_millis()).unwrap_or(u64::MAX)
}

/// The end of a session, for [`Effect::End`].
fn outcome(reason: EndReason, server_exit: Option<ExitInfo>, launches: u32) -> Outcome {
    Outcome {
        reason,
        server_exit,
        launches,
    }
}
