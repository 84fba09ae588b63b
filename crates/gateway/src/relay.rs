//! The session loop: one thread owns all state; reader threads feed it
//! through one bounded channel.

use std::collections::{HashMap, HashSet};
use std::io::{BufWriter, Read, Write};
use std::path::PathBuf;
use std::sync::mpsc::{self, Receiver, RecvTimeoutError, Sender};
use std::sync::Arc;
use std::sync::{Condvar, Mutex, MutexGuard, Weak};
use std::thread;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use mcpbox_audit::{Event as AuditEvent, Kind, Sink};
use serde_json::{json, Map, Value};

use crate::digest::json_digest;
use crate::launcher::{ExitInfo, Launcher, ProcessControl};
use crate::lines::{Line, LineReader};
use crate::pin::{PinStore, PinVerdict};
use crate::policy::{
    Action, ApprovalAnswer, ApprovalRequest, Approver, Decision, ToolHints, ToolPolicy,
};
use crate::redact::{find_credentials, redact_credentials, Redactor, StreamRedactor};
use crate::screen::{flag_instructions, sanitize};
use crate::secrets::Secrets;
use crate::{
    Config, EndReason, Error, Outcome, Result, CODE_CALL_TIMEOUT, CODE_POLICY_DENIED,
    CODE_RESPONSE_TOO_LARGE, CODE_SERVER_EXITED, META_DECISION,
};

/// `_meta` key carrying per-request client capabilities (2026-07-28).
const META_CLIENT_CAPS: &str = "io.modelcontextprotocol/clientCapabilities";

/// How often the loop checks whether the server died without closing stdout.
const EXIT_POLL: Duration = Duration::from_millis(250);

enum Ev {
    Host(Line),
    HostError(std::io::Error),
    Server {
        gen: u32,
        line: Line,
    },
    ServerError {
        gen: u32,
    },
    ApprovalDone {
        key: u64,
        answer: ApprovalAnswer,
    },
    /// Send an `elicitation/create` to the host and route its answer back.
    Elicit(ElicitRequest),
}

/// One question for the host, sent by a thread outside the session.
struct ElicitRequest {
    /// Prefix of the request id (the session adds its nonce and a counter).
    prefix: &'static str,
    message: String,
    /// The form's `requestedSchema`.
    schema: Value,
    expires: Instant,
    /// Ask only if the host's last word was that it answers elicitation
    /// (for questions not bound to a host request, such as network
    /// approvals); otherwise answer [`Elicited::Unavailable`] at once.
    needs_capability: bool,
    reply: Sender<Elicited>,
}

/// What came back for an [`ElicitRequest`].
enum Elicited {
    /// The host's whole JSON-RPC response (result or error).
    Response(Value),
    /// The question could not be asked (no capability, host gone).
    Unavailable,
}

/// A relay session, configured with a builder.
pub struct Relay {
    shared: Arc<Shared>,
    config: Config,
    launcher: Box<dyn Launcher>,
    policy: Arc<dyn ToolPolicy>,
    secrets: Secrets,
    audit: Arc<dyn Sink>,
    approver: Option<Arc<dyn Approver>>,
    stderr: StderrHandler,
}

/// Receives each (redacted, sanitized) line of the server's stderr.
pub type StderrHandler = Arc<dyn Fn(&str, &str) + Send + Sync>;

fn log_stderr(server: &str, line: &str) {
    tracing::info!(target: "mcpbox::server_stderr", server = %server, "{line}");
}

struct NullSink;
impl Sink for NullSink {
    fn record(&self, _event: AuditEvent) {}
}

impl Relay {
    /// A relay for the server `launcher` starts, allowing every tool, with
    /// no secrets and no audit sink until set.
    pub fn new(config: Config, launcher: Box<dyn Launcher>) -> Relay {
        Relay {
            shared: Arc::new(Shared {
                session: Mutex::new(None),
                cv: Condvar::new(),
                audit: Arc::new(Deferred::new()),
            }),
            config,
            launcher,
            policy: Arc::new(crate::policy::AllowAll),
            secrets: Secrets::default(),
            audit: Arc::new(NullSink),
            approver: None,
            stderr: Arc::new(log_stderr),
        }
    }

    /// Sets where the server's stderr lines go (server name, line). By
    /// default they are logged with `tracing` (target
    /// `mcpbox::server_stderr`); they never enter the MCP stream. Lines
    /// are already redacted and stripped of terminal escapes.
    pub fn stderr_handler(mut self, handler: StderrHandler) -> Relay {
        self.stderr = handler;
        self
    }

    /// Sets the tool policy.
    pub fn policy(mut self, policy: Arc<dyn ToolPolicy>) -> Relay {
        self.policy = policy;
        self
    }

    /// Sets the secrets injected into (and redacted from) the server.
    pub fn secrets(mut self, secrets: Secrets) -> Relay {
        self.secrets = secrets;
        self
    }

    /// Sets the audit sink.
    pub fn audit(mut self, audit: Arc<dyn Sink>) -> Relay {
        self.audit = audit;
        self
    }

    /// Sets the approver used for `approve` calls when the host did not
    /// declare elicitation (console, CLI). Without one such calls are
    /// denied with `approval.required`.
    pub fn fallback_approver(mut self, approver: Arc<dyn Approver>) -> Relay {
        self.approver = Some(approver);
        self
    }

    /// A handle through which other threads (the egress proxy's) can ask
    /// the host a question through MCP elicitation while this relay runs.
    /// Before [`Relay::run`] starts and after it returns, every question
    /// gets [`NetworkAnswer::Unavailable`].
    pub fn host_asker(&self) -> HostAsker {
        HostAsker {
            dispatch: Dispatch(Arc::downgrade(&self.shared)),
            server: self.config.server_name.clone(),
            timeout: self.config.approval_timeout,
        }
    }

    /// Runs the session until the host closes its input or the server
    /// exits. Returns only after the server process has ended.
    pub fn run(
        self,
        host_in: Box<dyn Read + Send>,
        host_out: Box<dyn Write + Send>,
    ) -> Result<Outcome> {
        let shared = Session::start(self, host_in, host_out)?;
        run_timer(&shared)
    }
}

/// Runs one relay session (shorthand for [`Relay`]).
pub fn relay(
    config: Config,
    policy: Arc<dyn ToolPolicy>,
    secrets: Secrets,
    launcher: Box<dyn Launcher>,
    host_in: Box<dyn Read + Send>,
    host_out: Box<dyn Write + Send>,
    audit: Arc<dyn Sink>,
) -> Result<Outcome> {
    Relay::new(config, launcher)
        .policy(policy)
        .secrets(secrets)
        .audit(audit)
        .run(host_in, host_out)
}

/// The session behind a mutex: each reader thread handles its own messages
/// under the lock (no hand-off to another thread on the hot path); the
/// calling thread runs the timers and ends the session.
struct Shared {
    session: Mutex<Option<Session>>,
    cv: Condvar,
    /// Audit records made under the session lock, written after it is
    /// released (see [`Deferred`]).
    audit: Arc<Deferred>,
}

/// Audit records queued under the session lock and written by whichever
/// thread released it, in the order they were made. A tool call's record
/// (a SQLite transaction) then no longer holds up the next message, which
/// waits on the session lock; the window in which a crash could lose a
/// queued record is the few microseconds between unlock and write.
struct Deferred {
    inner: Mutex<Option<Arc<dyn Sink>>>,
    /// The host output directory, for the `files_written` of call records.
    output_dir: Mutex<Option<PathBuf>>,
    /// Records, each with the start of its call for a call record: its
    /// `files_written` is filled in when it is written, outside the session
    /// lock (the walk of the output directory is the slow part of a record).
    /// It lists what changed from the call's start to that moment, a few
    /// microseconds after the response, so a call overlapping the next one
    /// may list the other's files too (as overlapping calls always could).
    queue: Mutex<std::collections::VecDeque<(AuditEvent, Option<SystemTime>)>>,
    /// Held while writing, so that two threads never reorder records.
    writer: Mutex<()>,
}

/// Locks, going on with the data of a thread that panicked while holding
/// the lock (the queue stays consistent: each operation is one call).
fn locked<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
}

impl Deferred {
    fn new() -> Deferred {
        Deferred {
            inner: Mutex::new(None),
            output_dir: Mutex::new(None),
            queue: Mutex::new(std::collections::VecDeque::new()),
            writer: Mutex::new(()),
        }
    }

    fn set_inner(&self, sink: Arc<dyn Sink>, output_dir: Option<PathBuf>) {
        *locked(&self.inner) = Some(sink);
        *locked(&self.output_dir) = output_dir;
    }

    /// Queues a finished call's record; its `files_written` is filled in
    /// with the files changed since `since` when it is written.
    fn record_call(&self, event: AuditEvent, since: SystemTime) {
        locked(&self.queue).push_back((event, Some(since)));
    }

    /// Writes every queued record, oldest first.
    fn flush(&self) {
        let _writer = locked(&self.writer);
        let sink = locked(&self.inner).clone();
        let dir = locked(&self.output_dir).clone();
        loop {
            let next = locked(&self.queue).pop_front();
            let Some((mut e, since)) = next else { break };
            if let (Some(since), Some(dir)) = (since, &dir) {
                // Bounded (see [`crate::written`]).
                let w = crate::written::files_written_since(dir, since);
                e.files_written = w.paths;
                if w.truncated {
                    e.detail = json!({"files_written_truncated": true});
                }
            }
            if let Some(sink) = &sink {
                sink.record(e);
            }
        }
    }
}

impl Sink for Deferred {
    fn record(&self, event: AuditEvent) {
        locked(&self.queue).push_back((event, None));
    }
}

impl Shared {
    fn lock(&self) -> MutexGuard<'_, Option<Session>> {
        self.session
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }
}

/// A handle the threads use to feed events into the session. Weak, so the
/// session (which holds one) does not keep itself alive.
#[derive(Clone)]
struct Dispatch(Weak<Shared>);

impl Dispatch {
    /// Handles `ev` under the session lock. Returns false once the session
    /// has ended (the calling thread should stop).
    fn send(&self, ev: Ev) -> bool {
        let Some(shared) = self.0.upgrade() else {
            return false;
        };
        let mut guard = shared.lock();
        let Some(session) = guard.as_mut() else {
            return false;
        };
        if session.ended.is_some() {
            return false;
        }
        let go_on = match session.handle(ev).and_then(|()| session.tick()) {
            Err(end) => {
                session.ended = Some(end);
                shared.cv.notify_all();
                false
            }
            Ok(()) => {
                if session.next_deadline() < session.wake_at {
                    shared.cv.notify_all();
                }
                true
            }
        };
        drop(guard);
        shared.audit.flush();
        go_on
    }
}

/// Runs the timers until the session ends, then shuts it down.
fn run_timer(shared: &Arc<Shared>) -> Result<Outcome> {
    let mut guard = shared.lock();
    loop {
        let Some(session) = guard.as_mut() else {
            return Err(Error::Thread(std::io::Error::other("session vanished")));
        };
        if session.ended.is_none() {
            if let Err(end) = session.tick() {
                session.ended = Some(end);
            }
        }
        if session.ended.is_some() {
            break;
        }
        let deadline = session.next_deadline();
        session.wake_at = deadline;
        let wait = deadline.saturating_duration_since(Instant::now());
        drop(guard);
        shared.audit.flush();
        guard = shared.lock();
        // Unlocked while flushing: a thread may have moved a deadline
        // earlier (its notify is then lost), so check before sleeping.
        if guard
            .as_ref()
            .is_some_and(|s| s.ended.is_none() && s.next_deadline() >= deadline)
        {
            guard = shared
                .cv
                .wait_timeout(guard, wait)
                .map_or_else(|e| e.into_inner().0, |(g, _)| g);
        }
    }
    let session = guard.take();
    drop(guard);
    let outcome = match session {
        Some(mut session) => {
            let reason = session.ended.take().unwrap_or(EndReason::HostClosed);
            session.finish(reason)
        }
        None => Err(Error::Thread(std::io::Error::other("session vanished"))),
    };
    shared.audit.flush();
    outcome
}

/// What an in-flight host request was, for handling its response.
enum Pending {
    ToolsCall(Call),
    ToolsList,
    Handshake,
    Other,
}

/// A forwarded tool call, until it ends.
struct Call {
    tool: String,
    args_digest: String,
    started: Instant,
    /// The start on the file systems' clock, for `files_written`.
    since: SystemTime,
    deadline: Option<Instant>,
    decision: Decision,
}

struct InFlight {
    id: Value,
    pending: Pending,
}

struct WaitingApproval {
    raw: Vec<u8>,
    id: Value,
    tool: String,
    args_digest: String,
    decision: Decision,
    via: &'static str,
}

struct Server {
    gen: u32,
    stdin: Option<Sender<Vec<u8>>>,
    control: Box<dyn ProcessControl>,
    stdout_closed: bool,
    exited: Option<ExitInfo>,
    /// When the loop first saw the process gone while stdout stayed open.
    gone_since: Option<Instant>,
    /// When the loop first saw stdout closed while the process still ran.
    closed_since: Option<Instant>,
}

struct Session {
    config: Config,
    launcher: Box<dyn Launcher>,
    policy: Arc<dyn ToolPolicy>,
    secrets: Secrets,
    audit: Arc<Deferred>,
    approver: Option<Arc<dyn Approver>>,
    stderr: StderrHandler,
    stderr_done: Option<Receiver<()>>,
    dispatch: Dispatch,
    ended: Option<EndReason>,
    /// When the timer thread will next wake up on its own.
    wake_at: Instant,
    host_out: BufWriter<Box<dyn Write + Send>>,
    server: Server,
    launches: u32,
    redactor: Arc<Redactor>,
    inflight: HashMap<String, InFlight>,
    approvals: HashMap<u64, WaitingApproval>,
    next_key: u64,
    next_elicit: u64,
    elicits: HashMap<String, (Sender<Elicited>, Instant)>,
    nonce: String,
    /// Elicitation as declared at `initialize`.
    host_elicitation: bool,
    /// Elicitation as the host last declared it, at `initialize` or in a
    /// request's `_meta` (2026-07-28): what questions outside a request go by.
    last_elicitation: bool,
    hints: HashMap<String, ToolHints>,
    withheld: HashMap<String, &'static str>,
    pins: Option<PinStore>,
    pin_establishing: bool,
    flagged: HashSet<(String, &'static str)>,
    host_closed: Option<Instant>,
    terminated_at: Option<Instant>,
    killed: bool,
    ttl_due: Option<Instant>,
    initialize_params: Option<Value>,
    retired: Vec<(String, String)>,
}

fn now_ms() -> i64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| i64::try_from(d.as_millis()).unwrap_or(i64::MAX))
}

fn id_key(id: &Value) -> String {
    id.to_string()
}

/// An unguessable per-session nonce for the ids of mcpbox's own requests
/// to the host, so a server cannot forge an approval answer by reusing an id.
fn make_nonce() -> String {
    let mut seed = [0u8; 16];
    let random = std::fs::File::open("/dev/urandom")
        .and_then(|mut f| f.read_exact(&mut seed))
        .is_ok();
    let mut material = seed.to_vec();
    if !random {
        let t = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .unwrap_or_default();
        material.extend_from_slice(format!("{t:?}{}", std::process::id()).as_bytes());
    }
    crate::digest::sha256_hex(&material)[..24].to_string()
}

fn spawn_named<F: FnOnce() + Send + 'static>(name: &str, f: F) -> Result<()> {
    thread::Builder::new()
        .name(name.to_string())
        .spawn(f)
        .map(|_| ())
        .map_err(Error::Thread)
}

impl Session {
    fn start(
        relay: Relay,
        host_in: Box<dyn Read + Send>,
        host_out: Box<dyn Write + Send>,
    ) -> Result<Arc<Shared>> {
        let Relay {
            shared,
            config,
            launcher,
            policy,
            secrets,
            audit,
            approver,
            stderr,
        } = relay;
        secrets.warn_short();
        // The session writes audit records through the deferred queue; the
        // threads flush it after releasing the session lock.
        shared.audit.set_inner(audit, config.output_dir.clone());
        let audit = shared.audit.clone();
        let dispatch = Dispatch(Arc::downgrade(&shared));
        let pins = match &config.pin_file {
            Some(p) => Some(PinStore::open(p)?),
            None => None,
        };
        let pin_establishing = pins.as_ref().is_some_and(|p| !p.established());
        let redactor = Arc::new(Redactor::new(
            secrets
                .0
                .iter()
                .map(|s| (s.name.as_str(), s.value.as_bytes())),
        ));
        let ttl_due = secrets.min_ttl().map(|t| Instant::now() + t);
        let mut session = Session {
            config,
            launcher,
            policy,
            secrets,
            audit,
            approver,
            stderr,
            stderr_done: None,
            dispatch,
            ended: None,
            wake_at: Instant::now(),
            host_out: BufWriter::with_capacity(64 * 1024, host_out),
            server: Server {
                gen: 0,
                stdin: None,
                control: Box::new(NoProcess),
                stdout_closed: true,
                exited: None,
                gone_since: None,
                closed_since: None,
            },
            launches: 0,
            redactor,
            inflight: HashMap::new(),
            approvals: HashMap::new(),
            next_key: 0,
            next_elicit: 0,
            elicits: HashMap::new(),
            nonce: make_nonce(),
            host_elicitation: false,
            last_elicitation: false,
            hints: HashMap::new(),
            withheld: HashMap::new(),
            pins,
            pin_establishing,
            flagged: HashSet::new(),
            host_closed: None,
            terminated_at: None,
            killed: false,
            ttl_due,
            initialize_params: None,
            retired: Vec::new(),
        };
        session.launch()?;
        session.audit_event(Kind::SessionStart, |_| {});
        let dispatch = session.dispatch.clone();
        let max_line = session.config.max_line;
        *shared.lock() = Some(session);
        spawn_named("mcpbox-host-in", move || {
            let mut reader = LineReader::new(host_in, max_line);
            loop {
                match reader.next_line() {
                    Ok(Line::Eof) => {
                        dispatch.send(Ev::Host(Line::Eof));
                        return;
                    }
                    Ok(line) => {
                        if !dispatch.send(Ev::Host(line)) {
                            return;
                        }
                    }
                    Err(e) => {
                        dispatch.send(Ev::HostError(e));
                        return;
                    }
                }
            }
        })?;
        Ok(shared)
    }

    fn launch(&mut self) -> Result<()> {
        let env = self.secrets.env();
        let proc = self.launcher.launch(&env).map_err(|source| Error::Launch {
            server: self.config.server_name.clone(),
            source,
        })?;
        self.launches += 1;
        let gen = self.server.gen + 1;
        let (stdin_tx, stdin_rx) = mpsc::channel::<Vec<u8>>();
        let mut stdin = proc.stdin;
        spawn_named("mcpbox-server-in", move || {
            for msg in stdin_rx {
                if stdin.write_all(&msg).and_then(|()| stdin.flush()).is_err() {
                    return;
                }
            }
        })?;
        let dispatch = self.dispatch.clone();
        let max_line = self.config.max_line;
        // strings in an over-long line are cut to a bit under max_result,
        // so that the result's own truncation marker still fits
        let keep = self.config.max_result.saturating_sub(64).max(64);
        let stdout = proc.stdout;
        spawn_named("mcpbox-server-out", move || {
            let mut reader = LineReader::with_compaction(stdout, max_line, keep);
            loop {
                match reader.next_line() {
                    Ok(Line::Eof) => {
                        dispatch.send(Ev::Server {
                            gen,
                            line: Line::Eof,
                        });
                        return;
                    }
                    Ok(line) => {
                        if !dispatch.send(Ev::Server { gen, line }) {
                            return;
                        }
                    }
                    Err(_) => {
                        dispatch.send(Ev::ServerError { gen });
                        return;
                    }
                }
            }
        })?;
        let mut stderr = proc.stderr;
        let redactor = (*self.redactor).clone();
        let audit = self.audit.clone();
        let template = self.template();
        let server = self.config.server_name.clone();
        let handler = self.stderr.clone();
        let (done_tx, done_rx) = mpsc::channel();
        self.stderr_done = Some(done_rx);
        spawn_named("mcpbox-server-err", move || {
            let mut stream = StreamRedactor::new(redactor.clone(), 8 * 1024);
            let mut buf = [0u8; 8192];
            let log = |line: &[u8]| {
                let text = String::from_utf8_lossy(line);
                let (clean, _) = sanitize(&text);
                handler(&server, &clean);
            };
            loop {
                match stderr.read(&mut buf) {
                    Ok(0) | Err(_) => break,
                    Ok(n) => stream.push(&buf[..n], log),
                }
            }
            stream.finish(log);
            for (i, count) in stream.counts.iter().enumerate() {
                if *count > 0 {
                    let mut e = template.clone();
                    e.time_ms = now_ms();
                    e.kind = Some(Kind::Redaction);
                    e.reason = Some("redaction.secret".into());
                    e.source = Some("stderr".into());
                    e.detail =
                        json!({"secret": redactor.names()[i], "count": count, "stream": "stderr"});
                    audit.record(e);
                }
            }
            let _ = done_tx.send(());
        })?;
        self.server = Server {
            gen,
            stdin: Some(stdin_tx),
            control: proc.control,
            stdout_closed: false,
            exited: None,
            gone_since: None,
            closed_since: None,
        };
        Ok(())
    }

    fn template(&self) -> AuditEvent {
        AuditEvent {
            sandbox_id: self.config.sandbox_id.clone(),
            workspace_id: self.config.workspace_id.clone(),
            server: self.config.server_name.clone(),
            caller: self.config.caller.clone(),
            detail: Value::Null,
            ..AuditEvent::default()
        }
    }

    fn audit_event(&self, kind: Kind, fill: impl FnOnce(&mut AuditEvent)) {
        self.audit.record(self.event(kind, fill));
    }

    fn event(&self, kind: Kind, fill: impl FnOnce(&mut AuditEvent)) -> AuditEvent {
        let mut e = self.template();
        e.time_ms = now_ms();
        e.kind = Some(kind);
        fill(&mut e);
        e
    }

    /// Queues the audit record of a call that ended: the tool, how it was
    /// decided, how it ended (`reason`), its duration, what `fill` adds
    /// (result size, exit status), and, when written, the files it wrote.
    fn record_call(&self, call: Call, reason: String, fill: impl FnOnce(&mut AuditEvent)) {
        let e = self.event(Kind::ToolCall, |e| {
            e.tool = Some(call.tool);
            e.decision = Some(audit_decision(call.decision.action));
            e.reason = Some(reason);
            e.source = Some(call.decision.source);
            e.args_digest = Some(call.args_digest);
            e.duration_ms = Some(ms(call.started.elapsed()));
            fill(e);
        });
        self.audit.record_call(e, call.since);
    }

    fn flag(&mut self, tool: Option<&str>, rule: &'static str, source: &str) {
        let key = (tool.unwrap_or("").to_string(), rule);
        if !self.flagged.insert(key) {
            return;
        }
        tracing::warn!(server = %self.config.server_name, tool = tool.unwrap_or(""), rule, "flagged");
        self.audit_event(Kind::Flag, |e| {
            e.tool = tool.map(str::to_string);
            e.reason = Some(rule.to_string());
            e.source = Some(source.to_string());
        });
    }

    // ---- output ------------------------------------------------------

    /// Writes one line to the host. Returns false when the host is gone.
    fn send_host(&mut self, line: &[u8]) -> bool {
        let ok = self
            .host_out
            .write_all(line)
            .and_then(|()| self.host_out.write_all(b"\n"))
            .and_then(|()| self.host_out.flush())
            .is_ok();
        if !ok {
            tracing::warn!("host output closed");
        }
        ok
    }

    fn send_host_value(&mut self, v: &Value) -> bool {
        match serde_json::to_vec(v) {
            Ok(bytes) => self.send_host(&bytes),
            Err(_) => true,
        }
    }

    fn host_error(&mut self, id: &Value, code: i64, message: &str, data: Option<Value>) -> bool {
        let mut err = json!({"code": code, "message": message});
        if let Some(d) = data {
            err["data"] = d;
        }
        self.send_host_value(&json!({"jsonrpc": "2.0", "id": id, "error": err}))
    }

    fn send_server(&mut self, line: &[u8]) {
        if let Some(tx) = &self.server.stdin {
            let mut msg = Vec::with_capacity(line.len() + 1);
            msg.extend_from_slice(line);
            msg.push(b'\n');
            let _ = tx.send(msg);
        }
    }

    // ---- main loop ---------------------------------------------------

    fn next_deadline(&self) -> Instant {
        let now = Instant::now();
        let mut d = now + EXIT_POLL;
        for f in self.inflight.values() {
            if let Pending::ToolsCall(Call {
                deadline: Some(t), ..
            }) = f.pending
            {
                d = d.min(t);
            }
        }
        for (_, t) in self.elicits.values() {
            d = d.min(*t);
        }
        if let Some(t) = self.ttl_due {
            d = d.min(t);
        }
        if self.server.exited.is_none() && self.server.stdout_closed {
            // stdout is closed: the exit is near, poll for it closely
            d = d.min(now + Duration::from_millis(5));
        }
        let grace = self.config.shutdown_grace;
        if let (Some(t), None) = (self.host_closed, self.terminated_at) {
            d = d.min(t + grace);
        }
        if let (Some(t), false) = (self.terminated_at, self.killed) {
            d = d.min(t + grace);
        }
        d
    }

    fn handle(&mut self, ev: Ev) -> Result<(), EndReason> {
        match ev {
            Ev::Host(Line::Eof) => self.host_eof(),
            Ev::HostError(e) => {
                tracing::warn!("reading host input failed: {e}");
                self.host_eof()
            }
            Ev::Host(Line::TooLong { len, .. } | Line::Compacted { len, .. }) => {
                tracing::warn!(len, "host line over max_line refused");
                req(self.host_error(
                    &Value::Null,
                    -32600,
                    "request too large",
                    Some(json!({"max_line": self.config.max_line})),
                ))
            }
            Ev::Host(Line::Data(line)) => self.on_host_line(line),
            Ev::Server { gen, line } if gen == self.server.gen => match line {
                Line::Eof => {
                    self.server.stdout_closed = true;
                    Ok(())
                }
                Line::TooLong { len, prefix } => self.server_too_long(len, &prefix),
                Line::Data(line) => self.on_server_line(line, None),
                Line::Compacted { line, len } => {
                    tracing::warn!(server = %self.config.server_name, len, "server line over max_line: long strings cut");
                    self.flag(None, "server.line_compacted", "relay");
                    self.on_server_line(line, Some(len))
                }
            },
            Ev::ServerError { gen } if gen == self.server.gen => {
                self.server.stdout_closed = true;
                Ok(())
            }
            Ev::Server { .. } | Ev::ServerError { .. } => Ok(()),
            Ev::ApprovalDone { key, answer } => self.approval_done(key, answer),
            Ev::Elicit(q) => self.elicit(q),
        }
    }

    /// Sends one `elicitation/create` to the host, with an id no server
    /// can guess, and remembers where its answer goes.
    fn elicit(&mut self, q: ElicitRequest) -> Result<(), EndReason> {
        if self.host_closed.is_some() || (q.needs_capability && !self.last_elicitation) {
            let _ = q.reply.send(Elicited::Unavailable);
            return Ok(());
        }
        let id = format!("{}-{}-{}", q.prefix, self.nonce, self.next_elicit);
        self.next_elicit += 1;
        let request = json!({
            "jsonrpc": "2.0",
            "id": id,
            "method": "elicitation/create",
            "params": {
                "mode": "form",
                "message": q.message,
                "requestedSchema": q.schema,
            }
        });
        self.elicits
            .insert(id_key(&Value::String(id)), (q.reply, q.expires));
        req(self.send_host_value(&request))
    }

    fn host_eof(&mut self) -> Result<(), EndReason> {
        if self.host_closed.is_none() {
            tracing::debug!("host closed input; closing server stdin");
            self.host_closed = Some(Instant::now());
            self.server.stdin = None;
            self.approvals.clear();
            // nobody will answer now: wake the threads waiting on the host
            self.elicits.clear();
        }
        Ok(())
    }

    /// Timers: call timeouts, elicitation expiry, server exit, shutdown
    /// escalation, secret TTL.
    fn tick(&mut self) -> Result<(), EndReason> {
        let now = Instant::now();
        // call timeouts
        let expired: Vec<String> = self
            .inflight
            .iter()
            .filter(|(_, f)| matches!(f.pending, Pending::ToolsCall(Call { deadline: Some(t), .. }) if t <= now))
            .map(|(k, _)| k.clone())
            .collect();
        for key in expired {
            if let Some(f) = self.inflight.remove(&key) {
                if let Pending::ToolsCall(call) = f.pending {
                    let limit = self.config.call_timeout.unwrap_or_default();
                    let cancel = json!({"jsonrpc": "2.0", "method": "notifications/cancelled",
                        "params": {"requestId": f.id, "reason": "mcpbox: call timed out"}});
                    if let Ok(b) = serde_json::to_vec(&cancel) {
                        self.send_server(&b);
                    }
                    self.record_call(call, "call.timeout".into(), |_| {});
                    let msg = format!("tool call timed out after {limit:?}");
                    let ok = self.host_error(
                        &f.id,
                        CODE_CALL_TIMEOUT,
                        &msg,
                        Some(json!({"reason": "call.timeout"})),
                    );
                    req(ok)?;
                }
            }
        }
        // elicitations whose approver gave up
        self.elicits.retain(|_, (_, t)| *t > now);
        // server exit detection
        if self.server.exited.is_none() {
            match self.server.control.try_wait() {
                Ok(Some(info)) => {
                    if self.server.stdout_closed {
                        self.server.exited = Some(info);
                    } else {
                        // let the last lines drain, but not forever (a
                        // grandchild may hold stdout open)
                        let since = *self.server.gone_since.get_or_insert(now);
                        if now.duration_since(since) > EXIT_POLL * 2 {
                            self.server.exited = Some(info);
                            self.server.stdout_closed = true;
                        }
                    }
                }
                Ok(None) => {
                    let stale = self.server.stdout_closed && {
                        let since = *self.server.closed_since.get_or_insert(now);
                        now.duration_since(since) > EXIT_POLL * 2
                    };
                    if self.server.stdout_closed
                        && stale
                        && self.host_closed.is_none()
                        && self.terminated_at.is_none()
                    {
                        // closed stdout long ago but still running: it cannot
                        // answer anymore
                        let _ = self.server.control.terminate();
                        self.terminated_at = Some(now);
                    }
                }
                Err(_) => {
                    self.server.exited = Some(ExitInfo {
                        code: None,
                        signal: None,
                    });
                }
            }
        }
        if let Some(info) = self.server.exited {
            if self.server.stdout_closed {
                self.answer_inflight(info)?;
                return Err(if self.host_closed.is_some() {
                    EndReason::HostClosed
                } else {
                    EndReason::ServerExited
                });
            }
        }
        // shutdown escalation after host EOF (or after a self-inflicted terminate)
        let grace = self.config.shutdown_grace;
        if let Some(t) = self.host_closed {
            if self.terminated_at.is_none() && now.duration_since(t) >= grace {
                tracing::debug!("server still running after stdin closed; sending SIGTERM");
                let _ = self.server.control.terminate();
                self.terminated_at = Some(now);
            }
        }
        if let Some(t) = self.terminated_at {
            if !self.killed && now.duration_since(t) >= grace {
                tracing::debug!("server still running after SIGTERM; sending SIGKILL");
                let _ = self.server.control.kill();
                self.killed = true;
            }
        }
        // secret TTL: restart between calls
        if let Some(due) = self.ttl_due {
            if now >= due
                && self.inflight.is_empty()
                && self.approvals.is_empty()
                && self.host_closed.is_none()
            {
                self.restart_for_ttl()?;
            }
        }
        Ok(())
    }

    fn answer_inflight(&mut self, info: ExitInfo) -> Result<(), EndReason> {
        let msg = format!("mcp server exited ({info})");
        let mut ok = true;
        let drained: Vec<InFlight> = self.inflight.drain().map(|(_, f)| f).collect();
        for f in drained {
            if let Pending::ToolsCall(call) = f.pending {
                self.record_call(call, "server.exited".into(), |e| {
                    e.exit_status = Some(info.status());
                });
            }
            if self.host_closed.is_none() || ok {
                ok &= self.host_error(
                    &f.id,
                    CODE_SERVER_EXITED,
                    &msg,
                    Some(json!({"reason": "server.exited", "status": info.status()})),
                );
            }
        }
        let waiting: Vec<WaitingApproval> = self.approvals.drain().map(|(_, a)| a).collect();
        for a in waiting {
            ok &= self.host_error(
                &a.id,
                CODE_SERVER_EXITED,
                &msg,
                Some(json!({"reason": "server.exited"})),
            );
        }
        req(ok || self.host_closed.is_some())
    }

    fn restart_for_ttl(&mut self) -> Result<(), EndReason> {
        tracing::info!(server = %self.config.server_name, "secret ttl expired; restarting server with fresh values");
        // old values stay redacted too: a server may have cached them
        for s in &self.secrets.0 {
            if !self
                .retired
                .iter()
                .any(|(n, v)| *n == s.name && *v == s.value)
            {
                self.retired.push((s.name.clone(), s.value.clone()));
            }
        }
        for e in self.secrets.refresh() {
            tracing::warn!("{e}");
        }
        let mut all = self.retired.clone();
        all.extend(
            self.secrets
                .0
                .iter()
                .map(|s| (s.name.clone(), s.value.clone())),
        );
        self.redactor = Arc::new(Redactor::new(
            all.iter().map(|(n, v)| (n.as_str(), v.as_bytes())),
        ));
        self.stop_server();
        self.wait_stderr();
        let exited = self.server.exited;
        self.audit_event(Kind::ServerExit, |e| {
            e.reason = Some("secret.ttl_restart".into());
            e.exit_status = exited.map(|i| i.status());
        });
        if self.launch().is_err() {
            tracing::error!(server = %self.config.server_name, "restart after secret ttl failed");
            return Err(EndReason::ServerExited);
        }
        self.terminated_at = None;
        self.killed = false;
        self.ttl_due = self.secrets.min_ttl().map(|t| Instant::now() + t);
        if let Some(params) = self.initialize_params.clone() {
            // replay the host's handshake; the response is swallowed
            let id = format!("mcpbox-reinit-{}-{}", self.nonce, self.launches);
            let init =
                json!({"jsonrpc": "2.0", "id": id, "method": "initialize", "params": params});
            if let Ok(b) = serde_json::to_vec(&init) {
                self.send_server(&b);
            }
            let done = json!({"jsonrpc": "2.0", "method": "notifications/initialized"});
            if let Ok(b) = serde_json::to_vec(&done) {
                self.send_server(&b);
            }
        }
        Ok(())
    }

    /// Stops the current server synchronously: close stdin, grace, SIGTERM,
    /// grace, SIGKILL.
    fn stop_server(&mut self) {
        self.server.stdin = None;
        let grace = self.config.shutdown_grace;
        let deadline = Instant::now() + grace;
        let mut info = None;
        while Instant::now() < deadline {
            if let Ok(Some(i)) = self.server.control.try_wait() {
                info = Some(i);
                break;
            }
            thread::sleep(Duration::from_millis(5));
        }
        if info.is_none() {
            let _ = self.server.control.terminate();
            let deadline = Instant::now() + grace;
            while Instant::now() < deadline {
                if let Ok(Some(i)) = self.server.control.try_wait() {
                    info = Some(i);
                    break;
                }
                thread::sleep(Duration::from_millis(5));
            }
        }
        if info.is_none() {
            let _ = self.server.control.kill();
            info = self.server.control.wait().ok();
        }
        self.server.exited = info;
    }

    /// Lets the stderr thread drain the last lines (bounded: a grandchild
    /// may hold the pipe open).
    fn wait_stderr(&mut self) {
        if let Some(done) = self.stderr_done.take() {
            let _ = done.recv_timeout(Duration::from_secs(1));
        }
    }

    fn finish(mut self, reason: EndReason) -> Result<Outcome> {
        if self.server.exited.is_none() {
            self.stop_server();
        }
        let info = self.server.exited;
        self.wait_stderr();
        self.audit_event(Kind::ServerExit, |e| {
            e.exit_status = info.map(|i| i.status());
            e.reason = Some(
                match reason {
                    EndReason::HostClosed => "server.stopped",
                    EndReason::ServerExited => "server.exited",
                    EndReason::HostGone => "host.gone",
                }
                .into(),
            );
        });
        self.audit_event(Kind::SessionEnd, |e| {
            e.exit_status = info.map(|i| i.status())
        });
        let _ = self.host_out.flush();
        Ok(Outcome {
            reason,
            server_exit: info,
            launches: self.launches,
        })
    }

    // ---- host -> server ----------------------------------------------

    fn on_host_line(&mut self, line: Vec<u8>) -> Result<(), EndReason> {
        let first = line.iter().position(|b| !b.is_ascii_whitespace());
        let Some(first) = first else { return Ok(()) };
        if line[first] == b'[' {
            let ok = self.host_error(
                &Value::Null,
                -32600,
                "batch requests are not supported",
                Some(json!({"reason": "batch.refused"})),
            );
            return req(ok);
        }
        let v: Value = match serde_json::from_slice(&line) {
            Ok(v) => v,
            Err(_) => return req(self.host_error(&Value::Null, -32700, "parse error", None)),
        };
        let Value::Object(obj) = &v else {
            return req(self.host_error(&Value::Null, -32600, "invalid request", None));
        };
        let method = obj.get("method").and_then(Value::as_str);
        let id = obj.get("id").filter(|i| !i.is_null());
        match (method, id) {
            (Some(method), Some(id)) => {
                let id = id.clone();
                self.host_request(method.to_string(), id, &v, line)
            }
            (Some(method), None) => {
                if method == "notifications/cancelled" {
                    if let Some(rid) = v.pointer("/params/requestId") {
                        let key = id_key(rid);
                        let before = self.approvals.len();
                        self.approvals.retain(|_, a| id_key(&a.id) != key);
                        if self.approvals.len() != before {
                            return Ok(());
                        }
                    }
                }
                self.send_server(&line);
                Ok(())
            }
            (None, Some(id)) => {
                let key = id_key(id);
                if let Some((reply, _)) = self.elicits.remove(&key) {
                    let _ = reply.send(Elicited::Response(v));
                    return Ok(());
                }
                if key.contains(&self.nonce) {
                    return Ok(()); // a late answer to one of our own requests
                }
                self.send_server(&line);
                Ok(())
            }
            (None, None) => req(self.host_error(&Value::Null, -32600, "invalid request", None)),
        }
    }

    fn host_request(
        &mut self,
        method: String,
        id: Value,
        v: &Value,
        line: Vec<u8>,
    ) -> Result<(), EndReason> {
        let params = v.get("params");
        if let Some(caps) = params
            .and_then(|p| p.get("_meta"))
            .and_then(|m| m.get(META_CLIENT_CAPS))
        {
            self.last_elicitation = caps
                .get("elicitation")
                .is_some_and(supports_form_elicitation);
        }
        match method.as_str() {
            "initialize" => {
                self.host_elicitation = params
                    .and_then(|p| p.pointer("/capabilities/elicitation"))
                    .is_some_and(supports_form_elicitation);
                self.last_elicitation = self.host_elicitation;
                self.initialize_params = params.cloned();
                self.track(id, Pending::Handshake);
                self.send_server(&line);
            }
            "server/discover" => {
                self.track(id, Pending::Handshake);
                self.send_server(&line);
            }
            "tools/list" => {
                self.track(id, Pending::ToolsList);
                self.send_server(&line);
            }
            "tools/call" => return self.tools_call(id, v, line),
            _ => {
                self.track(id, Pending::Other);
                self.send_server(&line);
            }
        }
        Ok(())
    }

    fn track(&mut self, id: Value, pending: Pending) {
        self.inflight.insert(id_key(&id), InFlight { id, pending });
    }

    /// Whether the host can answer elicitation for this request: the
    /// request's own `_meta` capabilities (2026-07-28) win over the ones
    /// declared at `initialize`.
    fn elicitation_for(&self, v: &Value) -> bool {
        match v
            .pointer("/params/_meta")
            .and_then(|m| m.get(META_CLIENT_CAPS))
        {
            Some(caps) => caps
                .get("elicitation")
                .is_some_and(supports_form_elicitation),
            None => self.host_elicitation,
        }
    }

    fn tools_call(&mut self, id: Value, v: &Value, line: Vec<u8>) -> Result<(), EndReason> {
        let Some(tool) = v
            .pointer("/params/name")
            .and_then(Value::as_str)
            .map(str::to_string)
        else {
            return req(self.host_error(&id, -32602, "tools/call without a tool name", None));
        };
        let args = v
            .pointer("/params/arguments")
            .cloned()
            .unwrap_or(Value::Object(Map::new()));
        let args_digest = json_digest(&args);
        // pinning first: a withheld tool is not the tool the policy knows
        if let Some(reason) = self.pin_refusal(&tool) {
            let source = format!(
                "pin:{}",
                self.config
                    .pin_file
                    .as_ref()
                    .map_or(String::new(), |p| p.display().to_string())
            );
            let decision = Decision::new(Action::Deny, reason, source);
            return self.deny_call(&id, &tool, &args_digest, decision);
        }
        let hints = self.hints.get(&tool).copied().unwrap_or_default();
        let decision = self.decide(&tool, &hints);
        match decision.action {
            Action::Allow => {
                self.forward_call(id, tool, args_digest, decision, &line);
                Ok(())
            }
            Action::Deny => self.deny_call(&id, &tool, &args_digest, decision),
            Action::Approve => {
                let elicit = self.elicitation_for(v);
                let approver: Option<(Arc<dyn Approver>, &'static str)> = if elicit {
                    Some((
                        Arc::new(ElicitationApprover {
                            dispatch: self.dispatch.clone(),
                        }),
                        "approval:elicitation",
                    ))
                } else {
                    self.approver.clone().map(|a| (a, "approval:fallback"))
                };
                let Some((approver, via)) = approver else {
                    let d = Decision::new(Action::Deny, "approval.required", decision.source);
                    return self.deny_call(&id, &tool, &args_digest, d);
                };
                let key = self.next_key;
                self.next_key += 1;
                let request = ApprovalRequest {
                    server: self.config.server_name.clone(),
                    tool: tool.clone(),
                    args_digest: args_digest.clone(),
                    expires_at: SystemTime::now() + self.config.approval_timeout,
                    decision: decision.clone(),
                };
                self.approvals.insert(
                    key,
                    WaitingApproval {
                        raw: line,
                        id,
                        tool,
                        args_digest,
                        decision,
                        via,
                    },
                );
                let dispatch = self.dispatch.clone();
                let spawned = spawn_named("mcpbox-approval", move || {
                    let answer = approver.approve(&request);
                    dispatch.send(Ev::ApprovalDone { key, answer });
                });
                if spawned.is_err() {
                    if let Some(a) = self.approvals.remove(&key) {
                        let d = Decision::new(Action::Deny, "approval.required", a.decision.source);
                        return self.deny_call(&a.id, &a.tool, &a.args_digest, d);
                    }
                }
                Ok(())
            }
        }
    }

    /// The policy's decision, made with and without the server's hints;
    /// the stricter one wins, so untrusted annotations can only tighten.
    fn decide(&self, tool: &str, hints: &ToolHints) -> Decision {
        let with = self.policy.decide(tool, hints);
        if *hints == ToolHints::default() {
            return with;
        }
        let without = self.policy.decide(tool, &ToolHints::default());
        if strictness(without.action) > strictness(with.action) {
            without
        } else {
            with
        }
    }

    fn pin_refusal(&self, tool: &str) -> Option<&'static str> {
        if let Some(r) = self.withheld.get(tool) {
            return Some(r);
        }
        let store = self.pins.as_ref()?;
        let pins = store.pins()?;
        // A call to a tool outside a pinned set is refused even when the host
        // never listed tools in this session (a pinned set may be empty).
        if !self.pin_establishing && pins.tools_pinned && !pins.tools.contains_key(tool) {
            return Some("pin.new");
        }
        None
    }

    fn forward_call(
        &mut self,
        id: Value,
        tool: String,
        args_digest: String,
        decision: Decision,
        line: &[u8],
    ) {
        let now = Instant::now();
        let deadline = self.config.call_timeout.map(|t| now + t);
        let since = if self.config.output_dir.is_some() {
            crate::written::coarse_now()
        } else {
            UNIX_EPOCH
        };
        self.track(
            id,
            Pending::ToolsCall(Call {
                tool,
                args_digest,
                started: now,
                since,
                deadline,
                decision,
            }),
        );
        self.send_server(line);
    }

    fn deny_call(
        &mut self,
        id: &Value,
        tool: &str,
        args_digest: &str,
        decision: Decision,
    ) -> Result<(), EndReason> {
        tracing::info!(server = %self.config.server_name, tool, reason = %decision.reason, source = %decision.source, "tool call denied");
        self.audit_event(Kind::ToolCall, |e| {
            e.tool = Some(tool.to_string());
            e.decision = Some(mcpbox_audit::Decision::Deny);
            e.reason = Some(decision.reason.clone());
            e.source = Some(decision.source.clone());
            e.args_digest = Some(args_digest.to_string());
        });
        let meta = json!({"action": "deny", "reason": decision.reason, "source": decision.source});
        let text = deny_text(&self.config.server_name, tool, &decision);
        let ok = if self.config.deny_as_error {
            self.host_error(id, CODE_POLICY_DENIED, &text, Some(meta))
        } else {
            let mut result = json!({
                "content": [{"type": "text", "text": text}],
                "isError": true,
                "_meta": {}
            });
            result["_meta"][META_DECISION] = meta;
            self.send_host_value(&json!({"jsonrpc": "2.0", "id": id, "result": result}))
        };
        req(ok)
    }

    fn approval_done(&mut self, key: u64, answer: ApprovalAnswer) -> Result<(), EndReason> {
        let Some(a) = self.approvals.remove(&key) else {
            return Ok(());
        };
        match answer {
            ApprovalAnswer::Approved { approver } => {
                tracing::info!(server = %self.config.server_name, tool = %a.tool, %approver, "tool call approved");
                let decision = Decision::new(
                    Action::Approve,
                    "approval.granted",
                    format!("{}:{approver}", a.via),
                );
                self.forward_call(a.id, a.tool, a.args_digest, decision, &a.raw);
                Ok(())
            }
            other => {
                let reason = match other {
                    ApprovalAnswer::Declined => "approval.declined",
                    ApprovalAnswer::Timeout => "approval.timeout",
                    _ => "approval.required",
                };
                let d = Decision::new(Action::Deny, reason, a.via);
                self.deny_call(&a.id, &a.tool, &a.args_digest, d)
            }
        }
    }

    // ---- server -> host ----------------------------------------------

    fn server_too_long(&mut self, len: usize, prefix: &[u8]) -> Result<(), EndReason> {
        tracing::warn!(server = %self.config.server_name, len, "server line over max_line dropped");
        self.flag(None, "server.line_too_long", "relay");
        if let Some(key) = sniff_id(prefix) {
            if let Some(f) = self.inflight.remove(&key) {
                if let Pending::ToolsCall(call) = f.pending {
                    self.record_call(call, "result.too_large".into(), |e| {
                        e.result_bytes = Some(len as u64);
                    });
                }
                let msg = format!(
                    "mcp server response too large ({len} bytes, limit {})",
                    self.config.max_line
                );
                let ok = self.host_error(
                    &f.id,
                    CODE_RESPONSE_TOO_LARGE,
                    &msg,
                    Some(json!({"reason": "result.too_large"})),
                );
                return req(ok);
            }
        }
        Ok(())
    }

    /// Handles one line from the server; `original_len` is set when the
    /// line was compacted from a longer one.
    fn on_server_line(
        &mut self,
        line: Vec<u8>,
        original_len: Option<usize>,
    ) -> Result<(), EndReason> {
        if line.iter().all(u8::is_ascii_whitespace) {
            return Ok(());
        }
        let mut v: Value = match serde_json::from_slice(&line) {
            Ok(v @ Value::Object(_)) => v,
            _ => {
                tracing::warn!(server = %self.config.server_name, len = line.len(), "server wrote a non-json-rpc line to stdout; dropped");
                self.flag(None, "server.invalid_json", "relay");
                return Ok(());
            }
        };
        let has_method = v.get("method").is_some();
        let mut changed = false;
        if original_len.is_some() {
            changed |= self.strip_cut_secrets(&mut v);
        }
        let mut tool_name = None;
        // a finished call's record, written once the response is out
        let mut finished: Option<(Call, String, u64)> = None;
        if !has_method {
            let Some(id) = v.get("id") else {
                tracing::warn!(server = %self.config.server_name, "server message without id or method dropped");
                return Ok(());
            };
            let key = id_key(id);
            let Some(f) = self.inflight.remove(&key) else {
                if key.starts_with("\"mcpbox-reinit-") {
                    return Ok(());
                }
                tracing::warn!(server = %self.config.server_name, "server response to no pending request dropped");
                return Ok(());
            };
            match f.pending {
                Pending::ToolsList => changed |= self.screen_tool_list(&mut v),
                Pending::Handshake => changed |= self.screen_instructions(&mut v),
                Pending::ToolsCall(call) => {
                    changed |= self.screen_result(&mut v, &call.tool);
                    let is_error = v.get("error").is_some()
                        || v.pointer("/result/isError") == Some(&Value::Bool(true));
                    let reason = if is_error {
                        "call.error".to_string()
                    } else {
                        call.decision.reason.clone()
                    };
                    let bytes = original_len.unwrap_or(line.len()) as u64;
                    tool_name = Some(call.tool.clone());
                    finished = Some((call, reason, bytes));
                }
                Pending::Other => {}
            }
        }
        changed |= self.redact_secrets(&mut v, tool_name.as_deref());
        let ok = if changed {
            self.send_host_value(&v)
        } else {
            self.send_host(&line)
        };
        if let Some((call, reason, bytes)) = finished {
            self.record_call(call, reason, |e| e.result_bytes = Some(bytes));
        }
        req(ok)
    }

    /// In strings cut by compaction, removes a partial secret left just
    /// before the cut.
    fn strip_cut_secrets(&mut self, v: &mut Value) -> bool {
        if self.redactor.is_empty() {
            return false;
        }
        let redactor = self.redactor.clone();
        let mut counts = vec![0usize; redactor.names().len()];
        let marker = format!("\n{}", crate::compact::MARKER_PREFIX);
        walk_strings(v, &mut |s| {
            let at = s.rfind(&marker)?;
            let fixed = redactor.strip_partial_tail(&s[..at], &mut counts)?;
            Some(format!("{fixed}{}", &s[at..]))
        })
    }

    fn redact_secrets(&mut self, v: &mut Value, tool: Option<&str>) -> bool {
        if self.redactor.is_empty() {
            return false;
        }
        let mut counts = vec![0usize; self.redactor.names().len()];
        let redactor = self.redactor.clone();
        let mut changed = walk_strings(v, &mut |s| match redactor.redact_str(s, &mut counts) {
            std::borrow::Cow::Borrowed(_) => None,
            std::borrow::Cow::Owned(o) => Some(o),
        });
        if let Some(Value::Array(items)) = v.pointer_mut("/result/content") {
            let mut texts: Vec<&mut String> = items
                .iter_mut()
                .filter_map(|item| match item.get_mut("text") {
                    Some(Value::String(t)) => Some(t),
                    _ => None,
                })
                .collect();
            changed |= redactor.redact_across(&mut texts, &mut counts);
        }
        for (i, count) in counts.iter().enumerate() {
            if *count > 0 {
                let name = redactor.names()[i].clone();
                tracing::warn!(server = %self.config.server_name, secret = %name, count, "secret redacted from server output");
                self.audit_event(Kind::Redaction, |e| {
                    e.tool = tool.map(str::to_string);
                    e.reason = Some("redaction.secret".into());
                    e.source = Some("stdout".into());
                    e.detail = json!({"secret": name, "count": count});
                });
            }
        }
        changed
    }

    fn screen_result(&mut self, v: &mut Value, tool: &str) -> bool {
        let mut changed = false;
        // credential shapes anywhere in the result
        let redact = self.config.redact_credential_shapes;
        let mut rules: Vec<&'static str> = Vec::new();
        if let Some(result) = v.get_mut("result") {
            changed |= walk_strings(result, &mut |s| {
                let hits = find_credentials(s);
                if hits.is_empty() {
                    return None;
                }
                for h in &hits {
                    if !rules.contains(&h.2) {
                        rules.push(h.2);
                    }
                }
                redact.then(|| redact_credentials(s, &hits))
            });
        }
        for rule in rules {
            self.audit_event(Kind::Flag, |e| {
                e.tool = Some(tool.to_string());
                e.reason = Some(rule.to_string());
                e.source = Some("result".into());
                e.detail = json!({"redacted": redact});
            });
        }
        // text content: strip terminal escapes, then truncate
        let mut budget = self.config.max_result;
        if let Some(Value::Array(items)) = v.pointer_mut("/result/content") {
            for item in items {
                if item.get("type").and_then(Value::as_str) != Some("text") {
                    continue;
                }
                let Some(Value::String(text)) = item.get_mut("text") else {
                    continue;
                };
                if let (std::borrow::Cow::Owned(clean), _) = sanitize(text) {
                    *text = clean;
                    changed = true;
                }
                if text.len() <= budget {
                    budget -= text.len();
                } else {
                    let mut cut = budget;
                    while !text.is_char_boundary(cut) {
                        cut -= 1;
                    }
                    let dropped = text.len() - cut;
                    text.truncate(cut);
                    if !text.is_empty() {
                        text.push('\n');
                    }
                    text.push_str(&format!("[mcpbox: truncated {dropped} bytes]"));
                    budget = 0;
                    changed = true;
                }
            }
        }
        changed
    }

    fn screen_instructions(&mut self, v: &mut Value) -> bool {
        let Some(Value::String(text)) = v.pointer("/result/instructions").cloned() else {
            return false;
        };
        let mut changed = false;
        if let Some(store) = self.pins.as_mut() {
            match store.check_instructions(
                &text,
                self.pin_establishing,
                self.config.accept_pin_changes,
            ) {
                Ok(None) => {}
                Ok(Some((old, new))) => {
                    if let Some(r) = v.get_mut("result").and_then(Value::as_object_mut) {
                        r.remove("instructions");
                    }
                    self.audit_event(Kind::PinChange, |e| {
                        e.reason = Some("pin.instructions_changed".into());
                        e.source = Some("pin".into());
                        e.detail = json!({"instructions": true, "old": old, "new": new});
                    });
                    return true;
                }
                Err(e) => tracing::error!("{e}"),
            }
        }
        let (clean, stripped) = sanitize(&text);
        for rule in stripped.rules() {
            self.flag(None, rule, "instructions");
        }
        for rule in flag_instructions(&clean) {
            self.flag(None, rule, "instructions");
        }
        if let std::borrow::Cow::Owned(c) = clean {
            v["result"]["instructions"] = Value::String(c);
            changed = true;
        }
        changed
    }

    fn screen_tool_list(&mut self, v: &mut Value) -> bool {
        let last_page = v.pointer("/result/nextCursor").is_none_or(Value::is_null);
        let Some(Value::Array(tools)) = v.pointer_mut("/result/tools").map(std::mem::take) else {
            return false;
        };
        let verdicts = match self.pins.as_mut() {
            Some(store) => match store.check_tools(
                &tools,
                self.pin_establishing,
                self.config.accept_pin_changes,
            ) {
                Ok(v) => Some(v),
                Err(e) => {
                    tracing::error!("{e}");
                    None
                }
            },
            None => None,
        };
        if last_page {
            self.pin_establishing = false;
        }
        let mut kept = Vec::with_capacity(tools.len());
        let mut changed = false;
        for (i, mut tool) in tools.into_iter().enumerate() {
            let Some(name) = tool.get("name").and_then(Value::as_str).map(str::to_string) else {
                changed = true;
                continue;
            };
            let hints = ToolHints::from_tool(&tool);
            self.hints.insert(name.clone(), hints);
            if let Some(verdict) = verdicts.as_ref().and_then(|vs| vs.get(i)) {
                let accepted = self.config.accept_pin_changes;
                match verdict {
                    PinVerdict::Pinned => {
                        self.withheld.remove(&name);
                    }
                    other => {
                        let (old, new) = match other {
                            PinVerdict::Changed { old, new } => (Some(old.clone()), new.clone()),
                            PinVerdict::New { new } => (None, new.clone()),
                            PinVerdict::Pinned => (None, String::new()),
                        };
                        let reason = other.reason().unwrap_or("pin.changed");
                        let first_time = self.withheld.get(&name) != Some(&reason) || accepted;
                        if first_time {
                            tracing::warn!(server = %self.config.server_name, tool = %name, reason, accepted, "tool definition differs from pin");
                            self.audit_event(Kind::PinChange, |e| {
                                e.tool = Some(name.clone());
                                e.reason = Some(reason.to_string());
                                e.source = Some(
                                    if accepted {
                                        "config:accept_pin_changes"
                                    } else {
                                        "pin"
                                    }
                                    .into(),
                                );
                                e.decision = Some(if accepted {
                                    mcpbox_audit::Decision::Allow
                                } else {
                                    mcpbox_audit::Decision::Deny
                                });
                                e.detail = json!({"old": old, "new": new});
                            });
                        }
                        if !accepted {
                            self.withheld.insert(name.clone(), reason);
                            changed = true;
                            continue;
                        }
                    }
                }
            }
            if !self.policy.visible(&name, &hints)
                || !self.policy.visible(&name, &ToolHints::default())
            {
                changed = true;
                continue;
            }
            changed |= self.screen_tool(&mut tool, &name);
            kept.push(tool);
        }
        let given = kept.len();
        let withheld: Vec<String> = self.withheld.keys().cloned().collect();
        self.audit_event(Kind::ToolList, |e| {
            e.result_bytes = None;
            e.detail = json!({"tools": given, "withheld": withheld});
        });
        if let Some(slot) = v.pointer_mut("/result/tools") {
            *slot = Value::Array(kept);
        }
        changed
    }

    fn screen_tool(&mut self, tool: &mut Value, name: &str) -> bool {
        let mut changed = false;
        let mut stripped_rules: Vec<&'static str> = Vec::new();
        let mut texts = String::new();
        let mut clean_field = |slot: Option<&mut Value>, texts: &mut String| {
            if let Some(Value::String(s)) = slot {
                let (clean, stripped) = sanitize(s);
                for r in stripped.rules() {
                    if !stripped_rules.contains(&r) {
                        stripped_rules.push(r);
                    }
                }
                texts.push_str(&clean);
                texts.push('\n');
                if let std::borrow::Cow::Owned(c) = clean {
                    *s = c;
                    changed = true;
                }
            }
        };
        clean_field(tool.get_mut("description"), &mut texts);
        clean_field(tool.get_mut("title"), &mut texts);
        clean_field(tool.pointer_mut("/annotations/title"), &mut texts);
        for schema in ["inputSchema", "outputSchema"] {
            if let Some(s) = tool.get_mut(schema) {
                clean_schema(s, &mut |slot, t| clean_field(Some(slot), t), &mut texts);
            }
        }
        for r in stripped_rules {
            self.flag(Some(name), r, "description");
        }
        for r in flag_instructions(&texts) {
            self.flag(Some(name), r, "description");
        }
        changed
    }
}

/// Applies `f` to every `description`/`title` string in a JSON schema.
fn clean_schema(v: &mut Value, f: &mut dyn FnMut(&mut Value, &mut String), texts: &mut String) {
    match v {
        Value::Object(m) => {
            for (k, child) in m.iter_mut() {
                if (k == "description" || k == "title") && child.is_string() {
                    f(child, texts);
                } else {
                    clean_schema(child, f, texts);
                }
            }
        }
        Value::Array(a) => {
            for child in a {
                clean_schema(child, f, texts);
            }
        }
        _ => {}
    }
}

/// Calls `f` on every string (object keys included); replaces the ones for
/// which it returns a new value. Returns whether anything changed.
fn walk_strings(v: &mut Value, f: &mut dyn FnMut(&str) -> Option<String>) -> bool {
    match v {
        Value::String(s) => match f(s) {
            Some(n) => {
                *s = n;
                true
            }
            None => false,
        },
        Value::Array(a) => {
            let mut changed = false;
            for x in a {
                changed |= walk_strings(x, f);
            }
            changed
        }
        Value::Object(m) => {
            let mut changed = false;
            let renames: Vec<(String, String)> = m
                .keys()
                .filter_map(|k| f(k).map(|n| (k.clone(), n)))
                .collect();
            for (old, new) in renames {
                if let Some(x) = m.remove(&old) {
                    m.insert(new, x);
                    changed = true;
                }
            }
            for (_, x) in m.iter_mut() {
                changed |= walk_strings(x, f);
            }
            changed
        }
        _ => false,
    }
}

/// Whether an `elicitation` capability covers form mode: `{}` (before
/// modes existed, form was the only one) or an object with `form`.
fn supports_form_elicitation(caps: &Value) -> bool {
    match caps {
        Value::Object(m) => m.is_empty() || m.contains_key("form"),
        _ => false,
    }
}

fn req(ok: bool) -> Result<(), EndReason> {
    if ok {
        Ok(())
    } else {
        Err(EndReason::HostGone)
    }
}

fn strictness(a: Action) -> u8 {
    match a {
        Action::Allow => 0,
        Action::Approve => 1,
        Action::Deny => 2,
    }
}

fn audit_decision(a: Action) -> mcpbox_audit::Decision {
    match a {
        Action::Allow => mcpbox_audit::Decision::Allow,
        Action::Deny => mcpbox_audit::Decision::Deny,
        Action::Approve => mcpbox_audit::Decision::Approve,
    }
}

fn ms(d: Duration) -> u64 {
    u64::try_from(d.as_millis()).unwrap_or(u64::MAX)
}

/// The text a model reads when a call is refused.
fn deny_text(server: &str, tool: &str, d: &Decision) -> String {
    let why = match d.reason.as_str() {
        "approval.required" => "this tool needs a human approval for each call, and no approval channel is available (the host did not declare elicitation support). Ask the user to run it or to change the policy".to_string(),
        "approval.declined" => "the human approver declined this call".to_string(),
        "approval.timeout" => "nobody approved this call in time".to_string(),
        "pin.changed" => "the tool's definition changed since it was pinned; it stays blocked until the change is reviewed (`mcpbox pin accept`)".to_string(),
        "pin.new" => "this tool appeared after the tool list was pinned; it stays blocked until it is reviewed (`mcpbox pin accept`)".to_string(),
        _ => "the policy does not allow this tool".to_string(),
    };
    format!("mcpbox refused the call to tool `{tool}` on server `{server}`: {why} (reason: {}, source: {})", d.reason, d.source)
}

/// Reads an elicitation response: only `accept` with `approve: true` approves.
fn elicitation_answer(v: &Value) -> ApprovalAnswer {
    let accepted = v.pointer("/result/action").and_then(Value::as_str) == Some("accept")
        && v.pointer("/result/content/approve") == Some(&Value::Bool(true));
    if accepted {
        ApprovalAnswer::Approved {
            approver: "elicitation".into(),
        }
    } else {
        ApprovalAnswer::Declined
    }
}

/// Finds `"id":<value>` near the start of a (truncated) JSON line. Only used
/// to answer the matching in-flight request, so a wrong guess that matches
/// nothing is harmless.
fn sniff_id(prefix: &[u8]) -> Option<String> {
    let text = String::from_utf8_lossy(prefix);
    let at = text.find("\"id\"")?;
    let rest = text[at + 4..].trim_start().strip_prefix(':')?.trim_start();
    let end = if rest.starts_with('"') {
        let mut esc = false;
        let mut end = None;
        for (i, c) in rest.char_indices().skip(1) {
            if esc {
                esc = false;
            } else if c == '\\' {
                esc = true;
            } else if c == '"' {
                end = Some(i + 1);
                break;
            }
        }
        end?
    } else {
        rest.find(|c: char| {
            !(c.is_ascii_digit() || c == '-' || c == '.' || c == 'e' || c == 'E' || c == '+')
        })
        .unwrap_or(rest.len())
    };
    let v: Value = serde_json::from_str(&rest[..end]).ok()?;
    Some(id_key(&v))
}

/// Asks the host through MCP elicitation. Runs on an approval thread; the
/// session loop sends the request and routes the host's answer back.
struct ElicitationApprover {
    dispatch: Dispatch,
}

impl Approver for ElicitationApprover {
    fn approve(&self, request: &ApprovalRequest) -> ApprovalAnswer {
        let secs = request
            .expires_at
            .duration_since(SystemTime::now())
            .unwrap_or_default();
        let expires_unix = request
            .expires_at
            .duration_since(UNIX_EPOCH)
            .map_or(0, |d| d.as_secs());
        let message = format!(
            "mcpbox: approve one call to tool `{}` on server `{}`?\narguments sha256: {}\npolicy: {} ({})\nexpires: unix time {} (in {}s)",
            request.tool, request.server, request.args_digest, request.decision.reason, request.decision.source, expires_unix, secs.as_secs()
        );
        let schema = json!({
            "type": "object",
            "properties": {
                "approve": {
                    "type": "boolean",
                    "title": "Approve this tool call",
                    "description": "true runs exactly this call once; anything else denies it",
                    "default": false
                }
            },
            "required": ["approve"]
        });
        match ask_host(
            &self.dispatch,
            "mcpbox-approval",
            message,
            schema,
            secs,
            false,
        ) {
            Asked::Response(v) => elicitation_answer(&v),
            Asked::Unavailable => ApprovalAnswer::Unavailable,
            Asked::Timeout => ApprovalAnswer::Timeout,
        }
    }
}

/// How [`ask_host`] ended.
enum Asked {
    Response(Value),
    Unavailable,
    Timeout,
}

/// Sends one elicitation through the session and waits for the host's
/// answer, at most `wait`.
fn ask_host(
    dispatch: &Dispatch,
    prefix: &'static str,
    message: String,
    schema: Value,
    wait: Duration,
    needs_capability: bool,
) -> Asked {
    let (reply, rx) = mpsc::channel();
    let expires = Instant::now() + wait;
    let sent = dispatch.send(Ev::Elicit(ElicitRequest {
        prefix,
        message,
        schema,
        expires,
        needs_capability,
        reply,
    }));
    if !sent {
        return Asked::Unavailable;
    }
    match rx.recv_timeout(wait) {
        Ok(Elicited::Response(v)) => Asked::Response(v),
        Ok(Elicited::Unavailable) => Asked::Unavailable,
        Err(RecvTimeoutError::Timeout) => Asked::Timeout,
        // the session dropped the question: it expired, or the host or
        // the session went away first
        Err(RecvTimeoutError::Disconnected) => {
            if Instant::now() >= expires {
                Asked::Timeout
            } else {
                Asked::Unavailable
            }
        }
    }
}

/// The host's answer to a network question ([`HostAsker::ask_network`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum NetworkAnswer {
    /// Allow this one connection.
    Once,
    /// Allow this host and port for the rest of the session.
    Session,
    /// The human accepted the form and chose to deny (or sent a choice
    /// that is not one of the offered ones).
    Denied,
    /// The human declined or cancelled the form, or the host answered
    /// with an error.
    Declined,
    /// Nobody answered before the approval timeout.
    Timeout,
    /// The question could not be asked: the host did not declare form
    /// elicitation (at `initialize` or, in the 2026-07-28 era, in the last
    /// request's `_meta`), the session is not running, or the host is gone.
    Unavailable,
}

impl NetworkAnswer {
    /// Machine-readable reason, for logs and audit detail.
    pub fn reason(self) -> &'static str {
        match self {
            NetworkAnswer::Once => "approval.granted_once",
            NetworkAnswer::Session => "approval.granted_session",
            NetworkAnswer::Denied => "approval.denied",
            NetworkAnswer::Declined => "approval.declined",
            NetworkAnswer::Timeout => "approval.timeout",
            NetworkAnswer::Unavailable => "approval.required",
        }
    }
}

/// A cloneable, thread-safe handle that asks the host a question through
/// MCP elicitation (form mode) on behalf of a running [`Relay`]; made with
/// [`Relay::host_asker`]. Each question goes out as its own
/// `elicitation/create` request with an id bound to this session (a nonce
/// the server cannot guess), names the server, and lapses after the relay's
/// `approval_timeout`.
#[derive(Clone)]
pub struct HostAsker {
    dispatch: Dispatch,
    server: String,
    timeout: Duration,
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
        let answer = match ask_host(
            &self.dispatch,
            "mcpbox-network",
            message,
            schema,
            self.timeout,
            true,
        ) {
            Asked::Response(v) => network_answer(&v),
            Asked::Unavailable => NetworkAnswer::Unavailable,
            Asked::Timeout => NetworkAnswer::Timeout,
        };
        tracing::info!(server = %self.server, host = %quoted, port, answer = answer.reason(), "network approval");
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

/// Placeholder control before the first launch.
struct NoProcess;
impl ProcessControl for NoProcess {
    fn terminate(&mut self) -> std::io::Result<()> {
        Ok(())
    }
    fn kill(&mut self) -> std::io::Result<()> {
        Ok(())
    }
    fn try_wait(&mut self) -> std::io::Result<Option<ExitInfo>> {
        Ok(Some(ExitInfo {
            code: Some(0),
            signal: None,
        }))
    }
    fn wait(&mut self) -> std::io::Result<ExitInfo> {
        Ok(ExitInfo {
            code: Some(0),
            signal: None,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sniff_id_finds_number_and_string_ids() {
        assert_eq!(
            sniff_id(br#"{"jsonrpc":"2.0","id":17,"result":{"content":[{"te"#),
            Some("17".into())
        );
        assert_eq!(
            sniff_id(br#"{"id" : "a\"b","result""#),
            Some(r#""a\"b""#.into())
        );
        assert_eq!(sniff_id(br#"{"result":"#), None);
    }
}
