//! The server's lifecycle, driven by events and timers only:
//!
//! - **start**: [`Effect::StartServer`]; until [`Event::ServerStarted`]
//!   the host's messages are held (in order) and sent once it is up.
//! - **exit detection**: the driver is asked to check the process
//!   ([`Effect::CheckServer`]) every [`EXIT_POLL`], every [`FAST_POLL`]
//!   once stdout closed or a stop began. While nothing at all happens the
//!   interval doubles up to [`IDLE_POLL`] (a gateway holding hundreds of
//!   idle or paused sandboxes would otherwise wake for each four times a
//!   second); any message from the host or the server brings it back. An
//!   exit is still seen at once through stdout's end; only a server whose
//!   grandchild holds stdout open is found by the poll alone. The server is *down* when it has
//!   exited and its stdout is closed; a process gone with stdout held open
//!   (a grandchild) gets [`DRAIN`] to finish, a process that closed stdout
//!   but lives on gets [`DRAIN`] before it is terminated.
//! - **stop**: close stdin; after `shutdown_grace` SIGTERM; after another
//!   `shutdown_grace` SIGKILL. Never a sleep: each step is a deadline.
//! - **secret TTL restart**: once the TTL passed *and* nothing is in flight
//!   or waiting for approval, the server is stopped as above and started
//!   again with fresh values (loaded by the driver, off its loop). Host
//!   messages arriving meanwhile are held and sent once the new server
//!   answered the replayed `initialize` (or after [`REINIT_WAIT`]); past
//!   [`HOLD_MAX_MESSAGES`] / [`HOLD_MAX_BYTES`] a request is answered with
//!   [`CODE_SERVER_RESTARTING`] (retryable) instead.
//! - **park** ([`Event::Park`], the lifecycle's idle stop): when nothing
//!   is in flight or held for approval, the server is stopped as above and
//!   the session stays, with no process. The next host message (or
//!   [`Event::Wake`]) starts the next generation on the same workspace,
//!   replays `initialize` and then sends what the host sent, as a TTL
//!   restart does; the host sees only latency.
//! - **end**: when the server is down for good, the stderr reader gets up
//!   to [`STDERR_WAIT`] to report its redactions and its last lines, then
//!   the requests in flight are answered with [`CODE_SERVER_EXITED`] and
//!   those lines (a server that exits at start says why: "boom: missing
//!   config file", not only "exited (status 1)"), then the last audit
//!   records and [`Effect::End`].
//!
//! [`Event::ServerStarted`]: super::Event::ServerStarted
//! [`Event::Park`]: super::Event::Park
//! [`Event::Wake`]: super::Event::Wake

use std::collections::VecDeque;
use std::time::{Duration, Instant};

use mcpbox_audit::Kind;
use mcpbox_policy::Reason;
use serde_json::{json, Value};

use super::calls::Pending;
use super::stderr::with_tail;
pub use super::stderr::{
    bounded_tail, STDERR_TAIL_BYTES, STDERR_TAIL_LINES, STDERR_TAIL_LINE_BYTES,
};
use super::{outcome, Effect, Session};
use crate::launcher::ExitInfo;
use crate::message::{id_key, to_line, IdKey, Message, Shape};
use crate::secrets::Secrets;
use crate::{EndReason, CODE_SERVER_EXITED, CODE_SERVER_RESTARTING};

/// How often a running server is checked for an exit it did not announce
/// by closing stdout.
pub const EXIT_POLL: Duration = Duration::from_millis(250);
/// The longest interval between exit checks of an idle server.
pub const IDLE_POLL: Duration = Duration::from_secs(4);
/// How often it is checked once its exit is near.
pub const FAST_POLL: Duration = Duration::from_millis(5);
/// How long the last lines may drain after the process is gone (a
/// grandchild may hold stdout open), and how long a process that closed
/// stdout may live on before it is terminated.
pub const DRAIN: Duration = Duration::from_millis(500);
/// How long the stderr reader may take to report after the server is down.
pub const STDERR_WAIT: Duration = Duration::from_secs(1);
/// How long a restarted server may take to answer the replayed
/// `initialize` before held messages are sent anyway.
pub const REINIT_WAIT: Duration = Duration::from_secs(10);
/// Most host messages held while the server (re)starts.
pub const HOLD_MAX_MESSAGES: usize = 1024;
/// Most bytes of host messages held while the server (re)starts.
pub const HOLD_MAX_BYTES: usize = 16 * 1024 * 1024;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Phase {
    /// [`Effect::StartServer`] is out.
    Starting,
    /// Running (perhaps stopping).
    Up,
    /// Parked: stopped for idleness, no process; the next host message
    /// starts it again.
    Parked,
    /// Down for good; waiting for stderr before the end.
    Ending,
    /// [`Effect::End`] was returned.
    Ended,
}

/// The server process as the session sees it.
pub(crate) struct Supervisor {
    gen: u32,
    launches: u32,
    phase: Phase,
    stdout_closed: bool,
    exited: Option<ExitInfo>,
    /// When its exit was seen while stdout stayed open.
    gone_since: Option<Instant>,
    /// When stdout closed while the process still ran.
    closed_since: Option<Instant>,
    /// When we closed its stdin (the stop began).
    stdin_closed: Option<Instant>,
    terminated: Option<Instant>,
    killed: bool,
    next_check: Instant,
    /// The current interval between exit checks (backs off while idle).
    poll: Duration,
    stderr_closed: bool,
    /// The last stderr lines of the current generation, once it closed.
    pub(super) stderr_tail: Vec<String>,
    /// Why the current generation could not be started.
    start_error: Option<String>,
    /// When the shortest secret TTL runs out.
    ttl_due: Option<Instant>,
    /// The stop under way is a TTL restart.
    restarting: bool,
    /// The stop under way parks the server (idle stop).
    parking: bool,
    /// The replayed `initialize` of a restarted server, until answered.
    reinit: Option<(IdKey, Instant)>,
    /// Host messages held while the server is not up.
    held: VecDeque<Vec<u8>>,
    held_bytes: usize,
    /// Why the session ends, and since when it waits for stderr.
    ending: Option<(EndReason, Instant)>,
}

impl Supervisor {
    pub(crate) fn new(now: Instant) -> Supervisor {
        Supervisor {
            gen: 0,
            launches: 0,
            phase: Phase::Starting,
            stdout_closed: false,
            exited: None,
            gone_since: None,
            closed_since: None,
            stdin_closed: None,
            terminated: None,
            killed: false,
            next_check: now,
            poll: EXIT_POLL,
            stderr_closed: false,
            stderr_tail: Vec::new(),
            start_error: None,
            ttl_due: None,
            restarting: false,
            parking: false,
            reinit: None,
            held: VecDeque::new(),
            held_bytes: 0,
            ending: None,
        }
    }

    pub(crate) fn gen(&self) -> u32 {
        self.gen
    }

    pub(crate) fn ended(&self) -> bool {
        self.phase == Phase::Ended
    }

    /// Something happened (a message either way): exit checks go back to
    /// [`EXIT_POLL`].
    pub(crate) fn active(&mut self, now: Instant) {
        self.poll = EXIT_POLL;
        if self.phase == Phase::Up && self.next_check > now + EXIT_POLL {
            self.next_check = now + EXIT_POLL;
        }
    }

    pub(crate) fn has_held(&self) -> bool {
        !self.held.is_empty()
    }

    /// Whether the server is parked (no process, by [`Event::Park`]).
    ///
    /// [`Event::Park`]: super::Event::Park
    pub(crate) fn parked(&self) -> bool {
        self.phase == Phase::Parked
    }

    /// True when host messages can go to the server now.
    pub(crate) fn is_up(&self) -> bool {
        self.phase == Phase::Up
            && self.stdin_closed.is_none()
            && self.reinit.is_none()
            && !self.restarting
    }

    /// The generation to write to, while its stdin is open.
    pub(crate) fn writable(&self) -> Option<u32> {
        (self.phase == Phase::Up && self.stdin_closed.is_none()).then_some(self.gen)
    }

    fn stopping(&self) -> bool {
        self.stdin_closed.is_some() || self.terminated.is_some()
    }
}

impl Session {
    /// Asks for the next server generation.
    pub(super) fn start_server(&mut self, refresh: bool) {
        let s = &mut self.server;
        s.gen += 1;
        s.phase = Phase::Starting;
        s.stdout_closed = false;
        s.exited = None;
        s.gone_since = None;
        s.closed_since = None;
        s.stdin_closed = None;
        s.terminated = None;
        s.killed = false;
        s.stderr_closed = false;
        s.stderr_tail.clear();
        s.start_error = None;
        s.reinit = None;
        let gen = s.gen;
        self.out.push(Effect::StartServer {
            gen,
            secrets: self.redaction.secrets.clone(),
            refresh,
        });
    }

    pub(super) fn server_started(&mut self, gen: u32, secrets: Secrets, facts: Value) {
        if gen != self.server.gen || self.server.phase != Phase::Starting {
            return;
        }
        let now = self.now.mono;
        self.redaction.update(secrets);
        // the requests of the server before this one will never be answered
        // to it: a late answer to one is dropped, not sent to this server
        self.server_asks.clear();
        let s = &mut self.server;
        s.launches += 1;
        s.phase = Phase::Up;
        s.poll = EXIT_POLL;
        s.next_check = now + EXIT_POLL;
        s.ttl_due = self.redaction.secrets.min_ttl().map(|t| now + t);
        let first = s.launches == 1;
        if first {
            // a secret written into the server's command line is the
            // policy's too: redacted here as anywhere
            let mut detail = self.config.session_detail.clone();
            if let (Some(d), Value::Object(f)) = (detail.as_object_mut(), facts) {
                d.extend(f);
            }
            let redactor = self.redaction.redactor.clone();
            let mut counts = vec![0usize; redactor.names().len()];
            redactor.redact_json(&mut detail, &mut counts);
            self.audit(Kind::SessionStart, |e| e.detail = detail);
        }
        if self.host.gone {
            return self.begin_stop();
        }
        // A host that closed its input while the server started still gets
        // what it sent before: `release_held` closes the server's stdin
        // once the held messages are out.
        match self.host.initialize_params.clone() {
            Some(params) if !first => {
                // replay the host's handshake; the response is swallowed
                let id = format!("mcpbox-reinit-{}-{}", self.nonce, self.server.launches);
                let init =
                    json!({"jsonrpc": "2.0", "id": id, "method": "initialize", "params": params});
                self.send_server(to_line(&init));
                self.server.reinit = Some((id_key(&Value::String(id)), now + REINIT_WAIT));
            }
            _ => self.release_held(),
        }
    }

    pub(super) fn server_start_failed(&mut self, gen: u32, error: &str) {
        if gen != self.server.gen || self.server.phase != Phase::Starting {
            return;
        }
        tracing::error!(server = %self.config.server_name, error, "starting the server failed");
        self.server.stdout_closed = true;
        self.server.stderr_closed = true;
        self.server.start_error = Some(error.to_string());
        self.server.restarting = false;
        self.server_down();
    }

    pub(super) fn server_exited(&mut self, gen: u32, exit: ExitInfo) {
        let s = &mut self.server;
        if gen != s.gen || s.phase != Phase::Up || s.exited.is_some() {
            return;
        }
        s.exited = Some(exit);
        if !s.stdout_closed {
            s.gone_since = Some(self.now.mono);
        }
    }

    pub(super) fn stdout_closed(&mut self) {
        let s = &mut self.server;
        if !s.stdout_closed {
            s.stdout_closed = true;
            s.closed_since = Some(self.now.mono);
            // the exit is near: look now
            s.next_check = self.now.mono;
        }
    }

    pub(super) fn stderr_closed(
        &mut self,
        gen: u32,
        redactions: Vec<(String, usize)>,
        tail: Vec<String>,
    ) {
        for (name, count) in redactions {
            if count > 0 {
                self.audit(Kind::Redaction, |e| {
                    e.reason = Some(Reason::RedactionSecret.as_str().into());
                    e.source = Some("stderr".into());
                    e.detail = json!({"secret": name, "count": count, "stream": "stderr"});
                });
            }
        }
        if gen == self.server.gen {
            self.server.stderr_closed = true;
            self.server.stderr_tail = bounded_tail(tail);
        }
    }

    pub(super) fn host_closed(&mut self) {
        if self.host.closed.is_some() {
            return;
        }
        tracing::debug!("host closed input; closing server stdin");
        self.host.closed = Some(self.now.mono);
        self.drop_questions();
        if self.server.phase == Phase::Parked {
            return self.end_parked();
        }
        if self.server.phase == Phase::Starting || self.server.reinit.is_some() {
            // The server is coming up: what the host sent before it closed
            // (a script piping its requests, say) still goes to the server,
            // whose stdin is closed once those are out (`release_held`).
            return;
        }
        self.refuse_held(Reason::ServerStopped);
        self.server.restarting = false;
        // calls whose arguments are being checked still go out first
        // (`stop_if_host_done`)
        if self.checking.is_empty() {
            self.begin_stop();
        }
    }

    pub(super) fn host_gone(&mut self) {
        if self.host.gone {
            return;
        }
        tracing::warn!("host output closed");
        self.host.gone = true;
        self.drop_questions();
        self.server.held.clear();
        self.server.held_bytes = 0;
        self.server.restarting = false;
        self.server.parking = false;
        if self.server.phase == Phase::Parked {
            return self.end_parked();
        }
        self.begin_stop();
    }

    /// Parks the server when nothing would be cut short: stops it and
    /// keeps the session ([`Event::Park`]). Otherwise nothing happens; the
    /// lifecycle asks again later.
    ///
    /// [`Event::Park`]: super::Event::Park
    pub(super) fn park(&mut self) {
        let idle = self.server.is_up()
            && self.calls.is_empty()
            && self.approvals.is_empty()
            && self.server.held.is_empty()
            && self.host.closed.is_none()
            && !self.host.gone;
        if !idle {
            tracing::debug!(server = %self.config.server_name, "park asked while busy: ignored");
            return;
        }
        tracing::info!(server = %self.config.server_name, "idle: stopping the server, keeping the session");
        self.server.parking = true;
        self.begin_stop();
    }

    /// Starts a parked server without waiting for a host message
    /// ([`Event::Wake`]).
    ///
    /// [`Event::Wake`]: super::Event::Wake
    pub(super) fn wake(&mut self) {
        if self.server.phase == Phase::Parked && !self.host.gone && self.host.closed.is_none() {
            self.start_parked();
        }
    }

    /// Starts a parked server; with fresh secret values when a TTL ran out
    /// while it was parked.
    fn start_parked(&mut self) {
        let expired = self.server.ttl_due.is_some_and(|t| self.now.mono >= t);
        self.start_server(expired);
    }

    /// The host left while the server was parked: nothing runs, nothing
    /// waits; the session ends.
    fn end_parked(&mut self) {
        let reason = if self.host.gone {
            EndReason::HostGone
        } else {
            EndReason::HostClosed
        };
        self.server.held.clear();
        self.server.held_bytes = 0;
        self.server.ending = Some((reason, self.now.mono));
        self.finish();
    }

    /// Closes the server's stdin; the timers take it from there.
    fn begin_stop(&mut self) {
        let s = &mut self.server;
        if s.phase == Phase::Up && s.stdin_closed.is_none() {
            s.stdin_closed = Some(self.now.mono);
            s.next_check = self.now.mono + FAST_POLL;
            let gen = s.gen;
            self.out.push(Effect::CloseServerStdin { gen });
        }
    }

    /// Holds a host message until the server is up; a parked server is
    /// started for it.
    pub(super) fn hold(&mut self, line: Vec<u8>, msg: &Message) {
        if self.server.phase == Phase::Parked {
            tracing::info!(server = %self.config.server_name, "a message for a parked server: starting it");
            self.start_parked();
        }
        let s = &mut self.server;
        if s.held.len() < HOLD_MAX_MESSAGES && s.held_bytes + line.len() <= HOLD_MAX_BYTES {
            s.held_bytes += line.len();
            s.held.push_back(line);
            return;
        }
        tracing::warn!(server = %self.config.server_name, "too many host messages while the server restarts");
        if let (Shape::Request, Some(id)) = (msg.shape, msg.id()) {
            let data = json!({"reason": Reason::ServerRestarting.as_str()});
            self.host_error(
                id,
                CODE_SERVER_RESTARTING,
                "mcp server is restarting; retry the request",
                Some(data),
            );
        }
    }

    /// Sends the held host messages, in order; when the host has closed
    /// its input meanwhile, then closes the server's stdin.
    fn release_held(&mut self) {
        while self.server.is_up() {
            let Some(line) = self.server.held.pop_front() else {
                break;
            };
            self.server.held_bytes -= line.len();
            if let Ok(msg) = Message::parse(&line) {
                self.host_message(line, msg);
            }
        }
        // a released call whose arguments the driver is checking goes to
        // the server when the check answers (`arguments_checked`), and
        // the server's stdin is closed after it
        if self.host.closed.is_some() && self.server.is_up() && self.checking.is_empty() {
            self.begin_stop();
        }
    }

    /// After a held call's argument check: when the host closed its input
    /// while the call waited, the server's stdin is closed once the last
    /// such call is out (as `release_held` does for held messages).
    pub(super) fn stop_if_host_done(&mut self) {
        if self.host.closed.is_some()
            && self.checking.is_empty()
            && self.server.held.is_empty()
            && self.server.is_up()
        {
            self.begin_stop();
        }
    }

    /// Answers the held requests that will never reach a server.
    fn refuse_held(&mut self, reason: Reason) {
        let held = std::mem::take(&mut self.server.held);
        self.server.held_bytes = 0;
        for line in held {
            let Ok(msg) = Message::parse(&line) else {
                continue;
            };
            if let (Shape::Request, Some(id)) = (msg.shape, msg.id()) {
                let mut data = json!({"reason": reason.as_str()});
                // Why it never got there: the start's error, or what the
                // server said on stderr before it exited.
                let tail = self.stderr_tail();
                let text = match &self.server.start_error {
                    Some(e) => format!("mcp server could not be started: {e}"),
                    None if !tail.is_empty() => {
                        data["stderr"] = json!(tail);
                        with_tail("mcp server stopped".into(), &tail)
                    }
                    None => "mcp server stopped".to_string(),
                };
                self.host_error(id, CODE_SERVER_EXITED, &text, Some(data));
            }
        }
    }

    /// Whether `key` answers our replayed `initialize` (then swallowed).
    pub(super) fn reinit_answered(&mut self, key: &str) -> bool {
        if self.server.reinit.as_ref().is_some_and(|(k, _)| k == key) {
            self.finish_reinit();
            return true;
        }
        key.starts_with("\"mcpbox-reinit-")
    }

    fn finish_reinit(&mut self) {
        self.server.reinit = None;
        let done = json!({"jsonrpc": "2.0", "method": "notifications/initialized"});
        self.send_server(to_line(&done));
        self.release_held();
    }

    /// Timers of the lifecycle, run after every event.
    pub(super) fn supervise(&mut self) {
        let now = self.now.mono;
        let grace = self.config.shutdown_grace;
        match self.server.phase {
            Phase::Starting | Phase::Parked | Phase::Ended => return,
            Phase::Ending => {
                let waited = self
                    .server
                    .ending
                    .is_some_and(|(_, since)| now.duration_since(since) >= STDERR_WAIT);
                if self.server.stderr_closed || waited {
                    self.finish();
                }
                return;
            }
            Phase::Up => {}
        }
        let s = &mut self.server;
        let drained = s.gone_since.is_some_and(|t| now.duration_since(t) >= DRAIN);
        if s.exited.is_some() && !s.stdout_closed && drained {
            s.stdout_closed = true;
        }
        if s.exited.is_none()
            && s.stdout_closed
            && !s.stopping()
            && s.closed_since
                .is_some_and(|t| now.duration_since(t) >= DRAIN)
        {
            // closed stdout long ago but still running: it cannot answer
            s.terminated = Some(now);
            let gen = s.gen;
            self.out.push(Effect::TerminateServer { gen });
        }
        let s = &mut self.server;
        if s.exited.is_some() && s.stdout_closed {
            return self.server_down();
        }
        if let Some(t) = s.stdin_closed {
            if s.terminated.is_none() && now.duration_since(t) >= grace {
                tracing::debug!("server still running after stdin closed; sending SIGTERM");
                s.terminated = Some(now);
                let gen = s.gen;
                self.out.push(Effect::TerminateServer { gen });
            }
        }
        let s = &mut self.server;
        if let Some(t) = s.terminated {
            if !s.killed && now.duration_since(t) >= grace {
                tracing::debug!("server still running after SIGTERM; sending SIGKILL");
                s.killed = true;
                let gen = s.gen;
                self.out.push(Effect::KillServer { gen });
            }
        }
        let s = &mut self.server;
        if s.exited.is_none() && now >= s.next_check {
            let fast = s.stdout_closed || s.stopping();
            s.next_check = now + if fast { FAST_POLL } else { s.poll };
            if !fast {
                s.poll = (s.poll * 2).min(IDLE_POLL);
            }
            let gen = s.gen;
            self.out.push(Effect::CheckServer { gen });
        }
        if self.server.reinit.as_ref().is_some_and(|(_, t)| now >= *t) {
            tracing::warn!(server = %self.config.server_name, "restarted server did not answer initialize; going on");
            self.finish_reinit();
        }
        if self.ttl_restart_due() {
            tracing::info!(server = %self.config.server_name, "secret ttl expired; restarting server with fresh values");
            self.server.restarting = true;
            self.begin_stop();
        }
    }

    /// The TTL ran out and nothing would be cut short by a restart.
    fn ttl_restart_due(&self) -> bool {
        let s = &self.server;
        s.ttl_due.is_some_and(|t| self.now.mono >= t)
            && s.is_up()
            && self.calls.is_empty()
            && self.approvals.is_empty()
            && self.host.closed.is_none()
            && !self.host.gone
    }

    /// The server has exited and its stdout is closed.
    fn server_down(&mut self) {
        let info = self.server.exited;
        if self.server.restarting {
            self.server.restarting = false;
            self.audit(Kind::ServerExit, |e| {
                e.reason = Some(Reason::SecretTtlRestart.as_str().into());
                e.exit_status = info.map(|i| i.status());
            });
            return self.start_server(true);
        }
        if self.server.parking && !self.host.gone && self.host.closed.is_none() {
            self.server.parking = false;
            self.audit(Kind::ServerExit, |e| {
                e.reason = Some(Reason::IdleStopped.as_str().into());
                e.exit_status = info.map(|i| i.status());
            });
            // a call that slipped in while it stopped (none should) is not
            // left waiting
            self.answer_inflight(info.unwrap_or(ExitInfo {
                code: None,
                signal: None,
            }));
            self.server.phase = Phase::Parked;
            // what arrived while it stopped starts it again
            if !self.server.held.is_empty() {
                self.start_parked();
            }
            return;
        }
        self.server.parking = false;
        // The requests in flight are answered in `finish`, once stderr has
        // closed (or [`STDERR_WAIT`] passed): its last lines say why.
        let reason = if self.host.gone {
            EndReason::HostGone
        } else if self.host.closed.is_some() {
            EndReason::HostClosed
        } else {
            EndReason::ServerExited
        };
        self.server.phase = Phase::Ending;
        self.server.ending = Some((reason, self.now.mono));
        if self.server.stderr_closed {
            self.finish();
        }
    }

    /// Every request in flight gets [`CODE_SERVER_EXITED`] (and a call its
    /// audit record), with the server's last stderr lines when it has
    /// them; so does every call waiting for approval.
    fn answer_inflight(&mut self, info: ExitInfo) {
        let tail = self.stderr_tail();
        let msg = with_tail(format!("mcp server exited ({info})"), &tail);
        for f in self.calls.drain() {
            if let Pending::ToolsCall(call) = f.pending {
                self.record_call(call, Reason::ServerExited, |e| {
                    e.exit_status = Some(info.status());
                });
            }
            let mut data =
                json!({"reason": Reason::ServerExited.as_str(), "status": info.status()});
            if !tail.is_empty() {
                data["stderr"] = json!(tail);
            }
            self.host_error(&f.id, CODE_SERVER_EXITED, &msg, Some(data));
        }
        for id in self.abandon_waiting() {
            let data = json!({"reason": Reason::ServerExited.as_str()});
            self.host_error(&id, CODE_SERVER_EXITED, &msg, Some(data));
        }
    }

    /// The requests still owed an answer, the last records and the end.
    fn finish(&mut self) {
        let reason = self
            .server
            .ending
            .map_or(EndReason::ServerExited, |(r, _)| r);
        let info = self.server.exited;
        self.answer_inflight(info.unwrap_or(ExitInfo {
            code: None,
            signal: None,
        }));
        self.refuse_held(Reason::ServerExited);
        self.audit(Kind::ServerExit, |e| {
            e.exit_status = info.map(|i| i.status());
            e.reason = Some(
                match reason {
                    EndReason::HostClosed => Reason::ServerStopped,
                    EndReason::ServerExited => Reason::ServerExited,
                    EndReason::HostGone => Reason::HostGone,
                }
                .as_str()
                .into(),
            );
        });
        let protocol = self.host.protocol.clone();
        self.audit(Kind::SessionEnd, |e| {
            e.exit_status = info.map(|i| i.status());
            if let Some(p) = protocol {
                e.detail = json!({ "protocol": p });
            }
        });
        self.server.phase = Phase::Ended;
        let launches = self.server.launches;
        self.out.push(Effect::End(outcome(reason, info, launches)));
    }

    /// The lifecycle's next deadline.
    pub(super) fn server_deadline(&self) -> Option<Instant> {
        let s = &self.server;
        let grace = self.config.shutdown_grace;
        let mut d: Option<Instant> = None;
        let mut at = |t: Instant| d = Some(d.map_or(t, |d| d.min(t)));
        match s.phase {
            Phase::Starting | Phase::Parked | Phase::Ended => {}
            Phase::Ending => {
                if let Some((_, since)) = s.ending {
                    at(since + STDERR_WAIT);
                }
            }
            Phase::Up => {
                if s.exited.is_none() {
                    at(s.next_check);
                }
                if let (Some(t), false) = (s.gone_since, s.stdout_closed) {
                    at(t + DRAIN);
                }
                if let (Some(t), None) = (s.stdin_closed, s.terminated) {
                    at(t + grace);
                }
                if let (Some(t), false) = (s.terminated, s.killed) {
                    at(t + grace);
                }
                if let Some((_, t)) = s.reinit {
                    at(t);
                }
                // a due TTL waits for the session to go idle, which is an
                // event of its own: no deadline in the past meanwhile
                if let Some(t) = s.ttl_due {
                    if t > self.now.mono {
                        at(t);
                    }
                }
            }
        }
        d
    }
}
