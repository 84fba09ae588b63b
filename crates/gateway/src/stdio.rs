//! The stdio driver: runs one [`Session`] between a host on a byte stream
//! (mcpbox's own stdin/stdout) and a server started by a [`Launcher`].
//!
//! What the driver holds for the host is bounded in bytes: the message it
//! writes (at most [`Config::max_line`]) and the 64 KiB buffer of a stdio
//! host's output. Writing to a stdio host blocks the loop, so a host that
//! stops reading stops the reads from the server instead of growing a
//! queue; a [`HostSink`] must not block and bounds what it keeps itself
//! (the HTTP gateway's byte budgets).
//!
//! Threads, each blocking on one thing:
//!
//! - **driver** (the caller of [`Relay::run`]): owns the session; waits in
//!   one `poll` for the host's input, the server's stdout and the wake-up
//!   of its bounded input queue, or for the session's deadline. It reads
//!   the host's and the server's lines itself (`stdio/source.rs`), takes
//!   what other threads queued, feeds each as an [`Event`] and performs
//!   the [`Effect`]s: writes to the host (flushed once per input), writes
//!   lines to the server's stdin (see below), signals the server, and
//!   queues audit records; a call's start record it writes itself, at
//!   once, through the sink's `commit`, and tells the session whether it
//!   is committed before the session sends the call
//!   ([`Effect::CommitAudit`]). No lock is held while it does (but the
//!   store's own, for that one transaction).
//! - **stderr reader**: the server's stderr lines are redacted and handed
//!   to the [`StderrHandler`] there; they never reach the MCP stream, but
//!   for the last few (redacted) in the error of a request the server
//!   left unanswered when it exited.
//! - **server stdin writer**: so that a server that stops reading blocks
//!   only its own pipe, never the driver. Our end of that pipe is
//!   non-blocking (`O_NONBLOCK`, set at attach): while the writer has
//!   nothing queued the driver writes a line itself, and hands the writer
//!   only what the pipe would not take (`EAGAIN`); from then on every
//!   line goes through the writer's queue until it has written them all,
//!   so lines reach the server in order. The writer waits for room with
//!   `poll(POLLOUT)`. The driver never waits on the pipe.
//! - **audit writer**: writes records in order, after the host output of
//!   the same input was flushed (a SQLite transaction and the
//!   `files_written` walk stay off the host path).
//! - **launcher**: starts servers ([`Launcher::launch`], and for a TTL
//!   restart the secret refresh, which may run a command) so that neither
//!   holds up the driver.
//!
//! A message from the host wakes the driver, which reads it and writes it
//! to the server's stdin itself while the pipe has room (one channel, to
//! the stdin writer, only when it has not); a message from the server
//! wakes the driver, which reads it and writes it to the host itself.
//! Each thread hand-off is a wake-up of a sleeping thread, the bulk of
//! what the relay adds to a round trip, so the common case has none
//! besides the driver's own (issue 7: a reader thread per direction, and
//! a channel from each to the driver, cost two more per round trip).
//! Unchanged lines are written as they were read.

mod effects;
mod feed;
mod server_in;
mod source;
mod threads;

pub use feed::{Attached, FeedError, HostFeed, HostSink};
pub use threads::background_priority;

pub(crate) use threads::make_nonce;
use threads::{spawn_audit, spawn_launcher, spawn_stderr};

use std::collections::{HashMap, VecDeque};
use std::io::{BufWriter, Read, Write};
use std::os::fd::AsFd;
use std::sync::mpsc::{self, Receiver, Sender};
use std::sync::Arc;
use std::thread;
use std::time::{Duration, Instant};

use mcpbox_audit::{Event as AuditEvent, Sink};

use crate::asker::{Dispatch, HostAsker, Outside};
use crate::broker::Broker;
use crate::launcher::{ExitInfo, Launcher, ProcessControl, ServerProcess};
use crate::lines::write_line;
use crate::pin::PinStore;
use crate::policy::{AllowAll, ToolPolicy};
use crate::secrets::Secrets;
use crate::session::{Asked, Effect, Event, Now, Record, Session};
use crate::{Config, Error, Outcome, Result};
use server_in::ServerIn;
use source::{Inbox, Source};

/// Inputs queued for the driver before it hands them to the session.
/// Readers block when it is full, which is the back-pressure on a flooding
/// server or host.
const INPUT_QUEUE: usize = 256;

/// The host's input for [`Relay::run`]: a descriptor (stdin, a pipe or
/// socket end) that the driver waits for in its own `poll` and reads
/// itself, so a `Read` wrapper's buffering would be bypassed: pass the
/// descriptor, not a `BufReader`. It is never made non-blocking (a
/// terminal or a shared pipe end keeps its flags).
pub trait HostInput: AsFd + Send {}
impl<T: AsFd + Send> HostInput for T {}

/// Receives each (redacted, sanitized) line of the server's stderr.
pub type StderrHandler = Arc<dyn Fn(&str, &str) + Send + Sync>;

fn log_stderr(server: &str, line: &str) {
    tracing::info!(target: "mcpbox::server_stderr", server = %server, "{line}");
}

struct NullSink;
impl Sink for NullSink {
    fn record(&self, _event: AuditEvent) {}
}

/// What the sandbox lifecycle learns from a running session, on the
/// session's own thread (calls must be quick; a thaw of a frozen cgroup
/// is).
pub trait Activity: Send + Sync {
    /// A host message (or the host's end) is about to be handled: a
    /// frozen server is thawed here, before the message can reach it (or
    /// the stop it causes).
    fn host_message(&self);
    /// After each event: whether anything is under way
    /// ([`crate::session::Session::busy`]) and whether the server is
    /// parked (stopped for idleness, no process).
    fn status(&self, busy: bool, parked: bool);
}

/// A relay session over stdio, configured with a builder.
pub struct Relay {
    dispatch: Dispatch,
    activity: Option<Arc<dyn Activity>>,
    in_flight: Option<Arc<crate::CallsInFlight>>,
    config: Config,
    launcher: Box<dyn Launcher>,
    policy: Arc<dyn ToolPolicy>,
    secrets: Secrets,
    audit: Arc<dyn Sink>,
    broker: Option<Arc<Broker>>,
    stderr: StderrHandler,
}

impl Relay {
    /// A relay for the server `launcher` starts, allowing every tool, with
    /// no secrets and no audit sink until set.
    pub fn new(config: Config, launcher: Box<dyn Launcher>) -> Relay {
        Relay {
            dispatch: Dispatch::default(),
            activity: None,
            in_flight: None,
            config,
            launcher,
            policy: Arc::new(AllowAll),
            secrets: Secrets::default(),
            audit: Arc::new(NullSink),
            broker: None,
            stderr: Arc::new(log_stderr),
        }
    }

    /// Sets where the server's stderr lines go (server name, line). By
    /// default they are logged with `tracing` (target
    /// `mcpbox::server_stderr`); they never enter the MCP stream (the last
    /// few, redacted, come with the error of a request left unanswered when
    /// the server exits, whatever the handler). Lines are already redacted
    /// and stripped of terminal escapes.
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

    /// Sets the approval broker: every approval of this session is
    /// registered there (where `mcpbox approvals` and the console answer
    /// it), and without elicitation [`Config::approval_fallback`] applies.
    /// Without a broker, an approval the host cannot elicit is denied with
    /// `approval.required`.
    pub fn broker(mut self, broker: Arc<Broker>) -> Relay {
        self.broker = Some(broker);
        self
    }

    /// Sets who learns of the session's activity (the lifecycle's idle
    /// clock and the thaw of a paused sandbox).
    pub fn activity(mut self, activity: Arc<dyn Activity>) -> Relay {
        self.activity = Some(activity);
        self
    }

    /// Keeps `calls` up to date with the tool calls in flight and the
    /// caller, for the egress proxy's records.
    pub fn calls_in_flight(mut self, calls: Arc<crate::CallsInFlight>) -> Relay {
        self.in_flight = Some(calls);
        self
    }

    /// A handle through which other threads (the egress proxy's) can ask
    /// the host a question through MCP elicitation while this relay runs.
    /// Before [`Relay::run`] starts and after it returns, every question
    /// gets [`crate::NetworkAnswer::Unavailable`].
    pub fn host_asker(&self) -> HostAsker {
        HostAsker {
            dispatch: self.dispatch.clone(),
            server: self.config.server_name.clone(),
            timeout: self.config.approval_timeout,
            broker: None,
            caller: self.config.caller.clone(),
            sandbox_id: self.config.sandbox_id.clone(),
            policy_version: self.config.policy_version.clone(),
            hold: self.config.approval_fallback == crate::broker::Fallback::Hold,
        }
    }

    /// Runs the session until the host closes its input or the server
    /// exits. Returns only after the server process has ended and every
    /// audit record was written.
    pub fn run(
        self,
        host_in: Box<dyn HostInput>,
        host_out: Box<dyn Write + Send>,
    ) -> Result<Outcome> {
        let dispatch = self.dispatch.clone();
        let (tx, rx) = mpsc::sync_channel::<Input>(INPUT_QUEUE);
        let inbox = Inbox::new(tx);
        let host_out = HostOut::Stream(BufWriter::with_capacity(64 * 1024, host_out));
        let result = Driver::run(self, Some(host_in), host_out, inbox, rx);
        dispatch.disconnect();
        result
    }

    /// Prepares the session for a host that is not a byte stream (the
    /// HTTP gateway): messages reach it through the returned
    /// [`HostFeed`], and every message for the host goes to `sink`, on the
    /// thread that calls [`Attached::run`] (the caller picks the thread,
    /// and what it does once the session has ended).
    pub fn attach(self, sink: Box<dyn HostSink>) -> (HostFeed, Attached) {
        let (tx, rx) = mpsc::sync_channel::<Input>(INPUT_QUEUE);
        let inbox = Inbox::new(tx);
        let feed = HostFeed {
            inbox: inbox.clone(),
            max_line: self.config.max_line,
        };
        let attached = Attached {
            relay: self,
            sink,
            inbox,
            rx,
        };
        (feed, attached)
    }
}

/// Runs one relay session (shorthand for [`Relay`]).
pub fn relay(
    config: Config,
    policy: Arc<dyn ToolPolicy>,
    secrets: Secrets,
    launcher: Box<dyn Launcher>,
    host_in: Box<dyn HostInput>,
    host_out: Box<dyn Write + Send>,
    audit: Arc<dyn Sink>,
) -> Result<Outcome> {
    Relay::new(config, launcher)
        .policy(policy)
        .secrets(secrets)
        .audit(audit)
        .run(host_in, host_out)
}

/// What the threads send the driver.
enum Input {
    Event(Event),
    Ask(Outside),
    Launched {
        gen: u32,
        /// Boxed: the inbox's messages stay small.
        result: std::io::Result<Box<ServerProcess>>,
        secrets: Secrets,
    },
}

/// The running server, as the driver holds it.
struct Current {
    gen: u32,
    stdin: Option<ServerIn>,
    control: Option<Box<dyn ProcessControl>>,
}

/// Where the host's messages go.
enum HostOut {
    /// A byte stream (stdout): newline-delimited.
    Stream(BufWriter<Box<dyn Write + Send>>),
    /// One message at a time ([`Relay::attach`]).
    Sink(Box<dyn HostSink>),
}

impl HostOut {
    fn write(&mut self, line: &[u8]) -> std::io::Result<()> {
        match self {
            HostOut::Stream(w) if line.len() < w.capacity() => {
                w.write_all(line).and_then(|()| w.write_all(b"\n"))
            }
            HostOut::Stream(w) => w.flush().and_then(|()| write_line(w.get_mut(), line)),
            HostOut::Sink(s) => s.message(line),
        }
    }

    fn flush(&mut self) -> std::io::Result<()> {
        match self {
            HostOut::Stream(w) => w.flush(),
            HostOut::Sink(s) => s.flush(),
        }
    }
}

struct Driver {
    config: Config,
    /// The tool rules, for [`Effect::CheckArguments`].
    policy: Arc<dyn ToolPolicy>,
    activity: Option<Arc<dyn Activity>>,
    /// Kept up to date with the session's calls in flight.
    in_flight: Option<Arc<crate::CallsInFlight>>,
    /// The files the current server touches, per call in flight
    /// ([`crate::touched`]).
    files: Option<crate::touched::Tracker>,
    /// The generation of the session's calls in flight last given to
    /// `in_flight` and `files`.
    calls_seen: u64,
    inbox: Inbox,
    /// The host's input, read by the driver (none for [`Relay::attach`]:
    /// the host's messages come through the inbox).
    host_in: Option<Source>,
    /// The current server's stdout, read by the driver, with its
    /// generation.
    server_out: Option<(u32, Source)>,
    /// Which of the two is looked at first, alternately (fairness).
    host_first: bool,
    host_out: HostOut,
    host_failed: bool,
    host_dirty: bool,
    server: Current,
    audit_tx: Option<Sender<Vec<Record>>>,
    audit_batch: Vec<Record>,
    /// The sink itself, for [`Effect::CommitAudit`] (written on this
    /// thread; everything else goes through the writer thread).
    audit: Arc<dyn Sink>,
    launch_tx: Sender<(u32, Secrets, bool)>,
    broker: Option<Arc<Broker>>,
    replies: HashMap<u64, Sender<Asked>>,
    next_ticket: u64,
    stderr: StderrHandler,
    /// A started server's stderr, until its reader is started.
    new_stderr: Option<(u32, Box<dyn Read + Send>)>,
    outcome: Option<Outcome>,
}

fn spawn_named<F: FnOnce() + Send + 'static>(name: &str, f: F) -> Result<thread::JoinHandle<()>> {
    thread::Builder::new()
        .name(name.to_string())
        .spawn(f)
        .map_err(Error::Thread)
}

impl Driver {
    fn run(
        relay: Relay,
        host_in: Option<Box<dyn HostInput>>,
        host_out: HostOut,
        inbox: Inbox,
        rx: Receiver<Input>,
    ) -> Result<Outcome> {
        let Relay {
            dispatch,
            activity,
            in_flight,
            config,
            launcher,
            policy,
            secrets,
            audit,
            broker,
            stderr,
        } = relay;
        secrets.warn_short();
        let pins = match &config.pin_file {
            Some(p) => Some(PinStore::open(p)?),
            None => None,
        };
        let (audit_tx, audit_thread) =
            spawn_audit(audit.clone(), config.output_dir.clone(), inbox.clone())?;
        let launch_tx = spawn_launcher(launcher, inbox.clone())?;
        let fallback = broker.is_some();
        let mut session = Session::new(
            config.clone(),
            policy.clone(),
            secrets,
            pins,
            fallback,
            make_nonce(),
            Now::system(),
        );
        let max_line = config.max_line;
        let mut driver = Driver {
            config,
            policy,
            activity,
            in_flight,
            files: None,
            calls_seen: u64::MAX,
            inbox: inbox.clone(),
            host_in: host_in.map(|fd| Source::new(fd, max_line, None)),
            server_out: None,
            host_first: false,
            host_out,
            host_failed: false,
            host_dirty: false,
            server: Current {
                gen: 0,
                stdin: None,
                control: None,
            },
            audit_tx: Some(audit_tx),
            audit_batch: Vec::new(),
            audit,
            launch_tx,
            broker,
            replies: HashMap::new(),
            next_ticket: 0,
            stderr,
            new_stderr: None,
            outcome: None,
        };
        dispatch.connect(Box::new(move |q| inbox.send(Input::Ask(q))));
        dispatch.set_tag(session.tag());
        let mut follow = VecDeque::new();
        let effects = session.start(Now::system());
        driver.perform(effects, &mut follow);
        let result = driver.run_loop(&mut session, &rx, follow);
        if let Some(b) = &driver.broker {
            // nothing of this session may wait on in the broker, nor its
            // grants outlive it
            b.end_session(session.tag());
        }
        if result.is_err() {
            // we could not go on (a thread would not start): the server
            // must not outlive the session
            if let Some(c) = driver.server.control.as_mut() {
                let _ = c.kill();
                let _ = c.wait();
            }
        }
        // every record written before we return
        drop(driver.audit_tx.take());
        let _ = audit_thread.join();
        result
    }

    fn run_loop(
        &mut self,
        session: &mut Session,
        rx: &Receiver<Input>,
        mut follow: VecDeque<Event>,
    ) -> Result<Outcome> {
        loop {
            let event = match follow.pop_front() {
                Some(e) => e,
                None => self.next_event(session, rx)?.unwrap_or(Event::Timer),
            };
            // any word from the host, its end included: a frozen server
            // must be able to read a message, or to exit when told to
            let from_host = matches!(event, Event::Host(_) | Event::HostGone);
            if let (true, Some(a)) = (from_host, &self.activity) {
                a.host_message();
            }
            let effects = session.on(event, Now::system());
            if let Some(a) = &self.activity {
                a.status(session.busy(), session.parked());
            }
            // before the effects: a call forwarded now is in the set before
            // the server can open a connection for it or touch a file; and
            // what the kernel queued goes to the calls it was queued under
            // before the set changes (a call's events are all queued before
            // its response)
            let gen = session.calls_gen();
            if gen != self.calls_seen && (self.in_flight.is_some() || self.files.is_some()) {
                self.calls_seen = gen;
                let calls = session.calls_in_flight();
                if let Some(files) = &mut self.files {
                    files.in_flight(&calls);
                }
                if let Some(c) = &self.in_flight {
                    c.set(session.caller(), calls);
                }
            }
            if let Some((gen, stderr)) = self.new_stderr.take() {
                let redactor = (*session.redactor()).clone();
                spawn_stderr(
                    stderr,
                    redactor,
                    gen,
                    self.config.server_name.clone(),
                    self.stderr.clone(),
                    self.inbox.clone(),
                )?;
            }
            self.perform(effects, &mut follow);
            if let Some(outcome) = self.outcome.take() {
                return Ok(outcome);
            }
        }
    }

    /// The next event: what other threads queued, else a line the host
    /// or the server has ready, else whichever comes first of those and
    /// the session's deadline (`None`: the deadline passed).
    fn next_event(&mut self, session: &Session, rx: &Receiver<Input>) -> Result<Option<Event>> {
        loop {
            // disconnected cannot happen: we hold a sender (the inbox)
            if let Ok(input) = rx.try_recv() {
                return self.admit(input).map(Some);
            }
            if let Some(event) = self.read_line() {
                return Ok(Some(event));
            }
            let timeout = match session.deadline() {
                Some(d) => match d.checked_duration_since(Instant::now()) {
                    Some(wait) if !wait.is_zero() => Some(wait),
                    _ => return Ok(None),
                },
                None => None,
            };
            self.wait(timeout);
        }
    }

    /// One line from the host or the current server, whichever has one
    /// (taking turns), without blocking.
    fn read_line(&mut self) -> Option<Event> {
        self.host_first = !self.host_first;
        for host in [self.host_first, !self.host_first] {
            if host {
                if let Some(line) = self.host_in.as_mut().and_then(|s| s.next("host input")) {
                    return Some(Event::Host(line));
                }
            } else if let Some((gen, s)) = self.server_out.as_mut() {
                if let Some(line) = s.next("server stdout") {
                    return Some(Event::Server { gen: *gen, line });
                }
            }
        }
        None
    }

    /// Waits until the inbox was woken, the host's input or the server's
    /// stdout is ready, or `timeout` passed (`None`: no limit).
    fn wait(&mut self, timeout: Option<Duration>) {
        use rustix::event::{poll, PollFd, PollFlags};
        // without its eventfd (it could not be made) the inbox is looked
        // at every few milliseconds instead
        let timeout = match self.inbox.wake_fd() {
            Some(_) => timeout,
            None => Some(timeout.map_or(source::NO_WAKE_POLL, |t| t.min(source::NO_WAKE_POLL))),
        };
        let timespec = timeout.map(|d| rustix::time::Timespec {
            tv_sec: i64::try_from(d.as_secs()).unwrap_or(i64::MAX),
            tv_nsec: i64::from(d.subsec_nanos()),
        });
        let host = self.host_in.as_ref().filter(|s| s.waits());
        let server = self
            .server_out
            .as_ref()
            .map(|(_, s)| s)
            .filter(|s| s.waits());
        let [files_a, files_b] = self
            .files
            .as_ref()
            .map_or([None, None], crate::touched::Tracker::fds);
        let all = [
            self.inbox.wake_fd(),
            host.map(Source::fd),
            server.map(Source::fd),
            files_a,
            files_b,
        ];
        let mut fds: Vec<PollFd<'_>> = Vec::with_capacity(all.len());
        let mut slots = [None; 5];
        for (slot, fd) in all.iter().enumerate() {
            if let Some(fd) = fd {
                slots[slot] = Some(fds.len());
                fds.push(PollFd::new(fd, PollFlags::IN));
            }
        }
        match poll(&mut fds, timespec.as_ref()) {
            Ok(_) | Err(rustix::io::Errno::INTR) => {}
            Err(e) => {
                // cannot happen with valid descriptors; do not spin
                tracing::error!("poll failed: {e}");
                thread::sleep(source::NO_WAKE_POLL);
            }
        }
        let ready: [bool; 5] = slots.map(|s| s.is_some_and(|i| !fds[i].revents().is_empty()));
        drop(fds);
        if ready[0] {
            self.inbox.reset();
        }
        if ready[1] {
            if let Some(s) = self.host_in.as_mut() {
                s.ready();
            }
        }
        if ready[2] {
            if let Some((_, s)) = self.server_out.as_mut() {
                s.ready();
            }
        }
        if ready[3] || ready[4] {
            if let Some(f) = self.files.as_mut() {
                f.drain();
            }
        }
    }

    /// Turns a thread's input into a session event (driver work first).
    fn admit(&mut self, input: Input) -> Result<Event> {
        Ok(match input {
            Input::Event(e) => e,
            Input::Ask(o) => {
                let ticket = self.next_ticket;
                self.next_ticket += 1;
                self.replies.insert(ticket, o.reply);
                Event::Ask {
                    ticket,
                    question: o.question,
                }
            }
            Input::Launched {
                gen,
                result,
                secrets,
            } => match result {
                Ok(proc) => {
                    // the stderr reader starts once the session took the
                    // new values into its redactor (see `run_loop`)
                    let facts = crate::touched::launch_facts(proc.tier, proc.files.as_ref());
                    let stderr = self.attach(gen, *proc)?;
                    self.new_stderr = Some((gen, stderr));
                    Event::ServerStarted {
                        gen,
                        secrets,
                        facts,
                    }
                }
                Err(source) if gen == 1 => {
                    return Err(Error::Launch {
                        server: self.config.server_name.clone(),
                        source,
                    })
                }
                Err(e) => Event::ServerStartFailed {
                    gen,
                    error: e.to_string(),
                },
            },
        })
    }

    /// Takes over a started server's stdin, stdout and control; returns its
    /// stderr for the reader started later.
    fn attach(&mut self, gen: u32, proc: ServerProcess) -> Result<Box<dyn Read + Send>> {
        let stdin = ServerIn::start(proc.stdin)?;
        // strings in an over-long line are cut to a bit under max_result,
        // so that the result's own truncation marker still fits
        let keep = self.config.max_result.saturating_sub(64).max(64);
        // the previous generation's stdout, if any, is at its end (a
        // server is started again only once it is down) and is closed
        self.server_out = Some((
            gen,
            Source::new(proc.stdout, self.config.max_line, Some(keep)),
        ));
        self.server = Current {
            gen,
            stdin: Some(stdin),
            control: Some(proc.control),
        };
        // a new sandbox, new mounts: the old one's watch goes with it
        self.files = proc.files.map(crate::touched::Tracker::new);
        self.calls_seen = u64::MAX;
        Ok(proc.stderr)
    }
}
