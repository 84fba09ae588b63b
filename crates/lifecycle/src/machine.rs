//! The state machine of one sandbox, without I/O: [`Machine::on`] takes an
//! [`Event`] (a session joins or leaves, a host message, a relay's status,
//! the timer's tick, an operator's command, the answer of a freeze or thaw
//! it asked for) at a time `now`, and returns the [`Effect`]s its driver
//! carries out (freeze, thaw, park, wake, tear down, write the registry,
//! audit). It reads no clock, touches no process,
//! cgroup, file or lock: the driver (`crates/mcpbox/src/lifecycle/`: the
//! timer thread, the local cgroup backend, the control socket's
//! operations, the workspace) holds one `Machine` per sandbox under the
//! sandbox's lock and feeds it.
//!
//! This is the one drawing of the lifecycle's states; ARCHITECTURE.md,
//! docs/serve.md and [`crate::State`] point here.
//!
//! ```text
//!                  a join                     idle.pause, `pause` (with a freezer)
//!   created ──────────────────────▶ running ─────────────────────────────────▶ paused
//!   (a new sandbox: recorded,      ▲  │    ◀─────────────────────────────────  │
//!    its workspace made)           │  │     a host message, `resume`, a join   │
//!                                  │  │     (thawed)                           │
//!     a join; a host message or    │  │ idle.stop (every session parks its     │ idle.stop
//!     `resume` (a relay starts its │  │ server: stopped once all are parked);  │ (thawed,
//!     server again, initialize     │  │ the last session left; serve stopped   │  then as
//!     replayed)                    │  ▼                                        │  running)
//!                                 stopped ◀────────────────────────────────────┘
//!                                  ▲
//!     a restart re-adopts every recorded sandbox as stopped (its processes killed)
//!
//!   any state ── idle.destroy, `destroy` ──▶ destroyed: sessions closed, artifacts
//!     exported, secrets revoked, processes killed, cgroups and workspace removed,
//!     then checked from the host and audited (the driver's teardown); an
//!     artifact not exported keeps the workspace and the record (stopped)
//! ```
//!
//! Rules the tables in the tests hold it to:
//!
//! - a sandbox is idle only while no session is busy (a call in flight or
//!   waiting for approval holds the clock); the idle clock is the time
//!   since the last host message, join or busy session;
//! - `idle.destroy` wins over `idle.stop`, which wins over `idle.pause`;
//!   `idle.stop` and `idle.pause` need a session whose server is not
//!   parked; `idle.pause` needs a freezer;
//! - a paused sandbox is thawed before a host message can reach its server
//!   ([`Event::HostMessage`] asks for the thaw; the driver calls it on the
//!   relay's thread before the message goes on);
//! - a freeze or thaw is asked for ([`Effect::Freeze`], [`Effect::Thaw`])
//!   and its outcome comes back ([`Event::Froze`], [`Event::Thawed`]): the
//!   state changes only on a success (a session that joins a paused
//!   sandbox makes it running either way, as it always did);
//! - a sandbox being torn down or snapshotted is left alone by the clock;
//!   a torn-down one takes no session ([`Refusal::Destroying`]).
//!
//! [`Machine::drive`] is the one loop that applies an event's effects in
//! order and feeds each freeze or thaw's outcome back at once (depth
//! first), for the driver and the tests alike.

use std::collections::HashMap;
use std::time::{Duration, Instant};

use mcpbox_policy::serve::Idle;

use crate::State;

/// Why a state changed or a freeze or thaw was asked for: the `why` of the
/// `lifecycle` audit record.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Why {
    /// A session joined.
    Session,
    /// A host message (or a relay's server that started again).
    Call,
    /// `idle.pause`.
    IdlePause,
    /// `idle.stop`.
    IdleStop,
    /// `mcpbox sandboxes pause`.
    Pause,
    /// `mcpbox sandboxes resume`.
    Resume,
    /// A snapshot reads it frozen.
    Snapshot,
    /// Its last session ended.
    LastSession,
    /// `serve` is stopping.
    ServeStopped,
}

impl Why {
    /// The words of the audit record.
    pub fn as_str(self) -> &'static str {
        match self {
            Why::Session => "session",
            Why::Call => "call",
            Why::IdlePause => "idle.pause",
            Why::IdleStop => "idle.stop",
            Why::Pause => "mcpbox sandboxes pause",
            Why::Resume => "mcpbox sandboxes resume",
            Why::Snapshot => "snapshot",
            Why::LastSession => "last session ended",
            Why::ServeStopped => "serve stopped",
        }
    }
}

/// What happens to one sandbox.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Event {
    /// A session joined, as `slot` (busy: it is opening).
    Join { slot: u64 },
    /// Session `slot` ended (its relay returned).
    Leave { slot: u64 },
    /// A host message is about to reach a server of it.
    HostMessage,
    /// Session `slot`'s relay reports: a request under way or not, its
    /// server parked or not.
    Status { slot: u64, busy: bool, parked: bool },
    /// The timer looks at the idle clock.
    Tick,
    /// `mcpbox sandboxes pause`.
    Pause,
    /// `mcpbox sandboxes resume`.
    Resume,
    /// A snapshot is about to read the workspace: frozen if it runs.
    SnapshotBegin,
    /// The snapshot is written.
    SnapshotEnd,
    /// A teardown begins (idle or `destroy`).
    DestroyBegin,
    /// The teardown is over.
    Destroyed,
    /// `serve` is stopping: its sessions ended, its processes killed.
    Shutdown,
    /// The outcome of an [`Effect::Freeze`].
    Froze {
        why: Why,
        result: Result<(), String>,
    },
    /// The outcome of an [`Effect::Thaw`].
    Thawed {
        why: Why,
        result: Result<(), String>,
    },
}

/// What the driver does, in this order.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Effect {
    /// Freeze every process of it; answer with [`Event::Froze`].
    Freeze(Why),
    /// Thaw them; answer with [`Event::Thawed`].
    Thaw(Why),
    /// Ask every session to park its server (stopped when nothing is in
    /// flight; the next host message starts it again).
    Park,
    /// Let every session's server start again (a stopped sandbox resumed).
    Wake,
    /// Tear it down (`idle.destroy`): export, revoke, destroy, check.
    Destroy,
    /// Write its state in the registry.
    Registry(State),
    /// A `lifecycle` audit record: `action` (the state's name), `why`.
    Audit { action: &'static str, why: Why },
    /// The answer to [`Event::Pause`].
    Paused(Paused),
    /// The event is refused, and why.
    Refuse(Refusal),
    /// Something failed that refuses nothing: log it.
    Error(Why, String),
}

/// What [`Event::Pause`] did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Paused {
    /// It was paused already.
    Already,
    /// Frozen now, with this many sessions in the middle of a request.
    Froze { in_flight: usize },
}

impl Paused {
    /// What `mcpbox sandboxes pause` says: the state the sandbox is in at
    /// the answer (`now`, read after the pause) and why. The driver lets
    /// the sandbox's lock go between the two, and a host message thaws a
    /// paused sandbox before it reaches the server, so a pause can end with
    /// the sandbox running.
    pub fn note(self, now: State) -> String {
        match (self, now) {
            (Paused::Already, State::Paused) => "paused already".into(),
            (Paused::Froze { in_flight: 0 }, State::Paused) => "paused".into(),
            (Paused::Froze { in_flight }, State::Paused) => format!(
                "paused with {in_flight} session(s) in the middle of a request: it waits until the sandbox is resumed"
            ),
            (_, State::Running) => "running: paused, then a call woke it (a client's message thaws the sandbox before it reaches the server); pause it again when it is idle".into(),
            (_, other) => format!("{}: it changed after it was paused", other.as_str()),
        }
    }
}

/// Why an event was refused.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Refusal {
    /// It is being (or has been) torn down.
    Destroying,
    /// `pause` of a sandbox in this state: nothing runs.
    NothingRuns(State),
    /// `pause` where there is no freezer.
    NoFreezer,
    /// The backend failed.
    Failed(String),
}

/// One session's place in its sandbox.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Session {
    busy: bool,
    parked: bool,
}

/// One sandbox's state machine.
#[derive(Debug, Clone)]
pub struct Machine {
    state: State,
    idle: Idle,
    /// Whether its backend gave it a freezer.
    freezer: bool,
    sessions: HashMap<u64, Session>,
    last_active: Instant,
    /// `idle.stop` asked the sessions to park; cleared by activity.
    parking: bool,
    destroying: bool,
    /// A snapshot froze it and reads it: the idle clock leaves it alone.
    snapshotting: bool,
}

impl Machine {
    /// A sandbox in `state` (created, or as the registry had it), with its
    /// server's idle limits, a freezer or not, idle since `now`.
    pub fn new(state: State, idle: Idle, freezer: bool, now: Instant) -> Machine {
        Machine {
            state,
            idle,
            freezer,
            sessions: HashMap::new(),
            last_active: now,
            parking: false,
            destroying: false,
            snapshotting: false,
        }
    }

    /// Its state.
    pub fn state(&self) -> State {
        self.state
    }

    /// Its sessions now.
    pub fn sessions(&self) -> usize {
        self.sessions.len()
    }

    /// Whether session `slot` is in it.
    pub fn has_session(&self, slot: u64) -> bool {
        self.sessions.contains_key(&slot)
    }

    /// Whether a teardown holds it.
    pub fn destroying(&self) -> bool {
        self.destroying
    }

    /// How long it has been idle at `now` (zero while a session is busy).
    pub fn idle_for(&self, now: Instant) -> Duration {
        if self.sessions.values().any(|s| s.busy) {
            return Duration::ZERO;
        }
        now.saturating_duration_since(self.last_active)
    }

    /// The effects of `event` at `now`.
    pub fn on(&mut self, event: Event, now: Instant) -> Vec<Effect> {
        let mut out = Vec::new();
        match event {
            Event::Join { slot } => {
                // checked under the sandbox's own lock: a teardown that
                // began since the session looked has stopped (or will stop)
                // the sessions it saw, and this one would be left in a
                // removed workspace
                if self.destroying {
                    out.push(Effect::Refuse(Refusal::Destroying));
                    return out;
                }
                self.sessions.insert(
                    slot,
                    Session {
                        busy: true,
                        parked: false,
                    },
                );
                self.last_active = now;
                self.parking = false;
                if self.state == State::Paused {
                    // running once the thaw is answered, thawed or not
                    out.push(Effect::Thaw(Why::Session));
                } else {
                    self.set(State::Running, Why::Session, &mut out);
                }
            }
            Event::Leave { slot } => {
                self.sessions.remove(&slot);
                if self.sessions.is_empty() && self.state != State::Destroyed && !self.destroying {
                    self.set(State::Stopped, Why::LastSession, &mut out);
                }
            }
            Event::HostMessage => {
                self.last_active = now;
                self.parking = false;
                if self.state == State::Paused {
                    out.push(Effect::Thaw(Why::Call));
                }
            }
            Event::Status { slot, busy, parked } => {
                let Some(s) = self.sessions.get_mut(&slot) else {
                    return out;
                };
                if s.busy == busy && s.parked == parked {
                    return out;
                }
                s.busy = busy;
                s.parked = parked;
                if busy {
                    self.last_active = now;
                }
                let all_parked = self.sessions.values().all(|s| s.parked);
                match self.state {
                    State::Running if all_parked => {
                        self.set(State::Stopped, Why::IdleStop, &mut out)
                    }
                    State::Stopped | State::Created if !all_parked => {
                        self.set(State::Running, Why::Call, &mut out)
                    }
                    _ => {}
                }
            }
            Event::Tick => self.tick(now, &mut out),
            Event::Pause => match self.state {
                State::Paused => out.push(Effect::Paused(Paused::Already)),
                State::Running if !self.freezer => out.push(Effect::Refuse(Refusal::NoFreezer)),
                State::Running => out.push(Effect::Freeze(Why::Pause)),
                s => out.push(Effect::Refuse(Refusal::NothingRuns(s))),
            },
            Event::Resume => match self.state {
                State::Paused => out.push(Effect::Thaw(Why::Resume)),
                State::Stopped => {
                    self.last_active = now;
                    self.parking = false;
                    out.push(Effect::Wake);
                }
                _ => {}
            },
            Event::SnapshotBegin => {
                if self.state == State::Running && self.freezer {
                    out.push(Effect::Freeze(Why::Snapshot));
                }
            }
            Event::SnapshotEnd => {
                if self.snapshotting {
                    self.snapshotting = false;
                    out.push(Effect::Thaw(Why::Snapshot));
                }
            }
            Event::DestroyBegin => {
                if self.destroying {
                    out.push(Effect::Refuse(Refusal::Destroying));
                } else {
                    self.destroying = true;
                }
            }
            // the teardown wrote the registry and audited `destroyed`
            // itself (clean or not): only the state here
            Event::Destroyed => self.state = State::Destroyed,
            Event::Shutdown => {
                if self.state != State::Destroyed {
                    self.set(State::Stopped, Why::ServeStopped, &mut out);
                }
            }
            Event::Froze { why, result } => self.froze(why, result, &mut out),
            Event::Thawed { why, result } => self.thawed(why, result, now, &mut out),
        }
        out
    }

    /// Applies `event` and everything it leads to: each effect goes to
    /// `apply` in order; what `apply` answers (the outcome of a freeze or
    /// thaw) is handed back to the machine at once, its effects applied
    /// before the next one of `event`.
    pub fn drive(
        &mut self,
        event: Event,
        now: Instant,
        apply: &mut dyn FnMut(Effect) -> Option<Event>,
    ) {
        for effect in self.on(event, now) {
            if let Some(next) = apply(effect) {
                self.drive(next, now, apply);
            }
        }
    }

    fn tick(&mut self, now: Instant, out: &mut Vec<Effect>) {
        if self.destroying || self.snapshotting || self.state == State::Destroyed {
            return;
        }
        if self.sessions.values().any(|s| s.busy) {
            self.last_active = now;
            return;
        }
        let idle = now.saturating_duration_since(self.last_active);
        if self.idle.destroy.is_some_and(|d| idle >= d) {
            // the teardown marks it (`DestroyBegin`)
            out.push(Effect::Destroy);
            return;
        }
        let live = self.sessions.values().any(|s| !s.parked);
        if !live {
            return;
        }
        if self.idle.stop.is_some_and(|d| idle >= d) {
            if !self.parking {
                // thawed first: a frozen server cannot stop
                if self.state == State::Paused {
                    out.push(Effect::Thaw(Why::IdleStop));
                }
                self.parking = true;
                out.push(Effect::Park);
            }
            return;
        }
        if self.state == State::Running
            && self.freezer
            && self.idle.pause.is_some_and(|d| idle >= d)
        {
            out.push(Effect::Freeze(Why::IdlePause));
        }
    }

    fn froze(&mut self, why: Why, result: Result<(), String>, out: &mut Vec<Effect>) {
        match (why, result) {
            (Why::Snapshot, r) => self.snapshotting = r.is_ok(),
            (Why::Pause, Ok(())) => {
                self.set(State::Paused, why, out);
                let in_flight = self.sessions.values().filter(|s| s.busy).count();
                out.push(Effect::Paused(Paused::Froze { in_flight }));
            }
            (Why::Pause, Err(e)) => out.push(Effect::Refuse(Refusal::Failed(e))),
            (_, Ok(())) => self.set(State::Paused, why, out),
            (_, Err(e)) => out.push(Effect::Error(why, e)),
        }
    }

    fn thawed(
        &mut self,
        why: Why,
        result: Result<(), String>,
        now: Instant,
        out: &mut Vec<Effect>,
    ) {
        match (why, result) {
            // the snapshot's freeze never changed the state
            (Why::Snapshot, _) => {}
            (Why::Session, r) => {
                if let Err(e) = r {
                    out.push(Effect::Error(why, e));
                }
                self.set(State::Running, why, out);
            }
            (Why::Resume, Err(e)) => out.push(Effect::Refuse(Refusal::Failed(e))),
            (_, Err(e)) => out.push(Effect::Error(why, e)),
            (_, Ok(())) => {
                if self.state == State::Paused {
                    self.set(State::Running, why, out);
                }
                if why == Why::Resume {
                    self.last_active = now;
                }
            }
        }
    }

    /// Moves to `state`: the registry written and the change audited.
    fn set(&mut self, state: State, why: Why, out: &mut Vec<Effect>) {
        if self.state == state {
            return;
        }
        self.state = state;
        out.push(Effect::Registry(state));
        out.push(Effect::Audit {
            action: state.as_str(),
            why,
        });
    }
}

#[cfg(test)]
mod tests;
