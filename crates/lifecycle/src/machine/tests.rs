//! The lifecycle core as event -> effects tables: each step is (seconds
//! since the start, event, the effects it leads to, rendered), with the
//! freezes and thaws it asks for answered as a backend would (every one
//! succeeds, or every one fails with `boom` once [`T::fail`] is set).
//! No clock is read: `now` is the start plus the step's seconds.

use std::time::{Duration, Instant};

use mcpbox_policy::serve::Idle;

use super::*;

/// `idle.pause` 10 s, `idle.stop` 60 s, `idle.destroy` 300 s.
fn idle() -> Idle {
    Idle {
        pause: Some(Duration::from_secs(10)),
        stop: Some(Duration::from_secs(60)),
        destroy: Some(Duration::from_secs(300)),
    }
}

struct T {
    m: Machine,
    t0: Instant,
    /// The backend's freezes and thaws fail with this.
    fail: Option<&'static str>,
}

impl T {
    fn new(state: State, freezer: bool) -> T {
        T::with(state, idle(), freezer)
    }

    fn with(state: State, idle: Idle, freezer: bool) -> T {
        let t0 = Instant::now();
        T {
            m: Machine::new(state, idle, freezer, t0),
            t0,
            fail: None,
        }
    }

    /// One event at `secs`, driven as the driver does.
    fn on(&mut self, secs: u64, event: Event) -> Vec<String> {
        let now = self.t0 + Duration::from_secs(secs);
        let fail = self.fail;
        let mut out = Vec::new();
        self.m.drive(event, now, &mut |e| {
            out.push(render(&e));
            let result = fail.map_or(Ok(()), |f| Err(f.to_string()));
            match e {
                Effect::Freeze(why) => Some(Event::Froze { why, result }),
                Effect::Thaw(why) => Some(Event::Thawed { why, result }),
                _ => None,
            }
        });
        out
    }

    /// A table of steps; each must lead to exactly its effects.
    fn steps(&mut self, table: &[(u64, Event, &[&str])]) {
        for (i, (secs, event, want)) in table.iter().enumerate() {
            let got = self.on(*secs, event.clone());
            assert_eq!(got, *want, "step {i}: {event:?} at {secs} s");
        }
    }
}

fn render(e: &Effect) -> String {
    match e {
        Effect::Freeze(w) => format!("freeze {}", w.as_str()),
        Effect::Thaw(w) => format!("thaw {}", w.as_str()),
        Effect::Park => "park".into(),
        Effect::Wake => "wake".into(),
        Effect::Destroy => "destroy".into(),
        Effect::Registry(s) => format!("registry {}", s.as_str()),
        Effect::Audit { action, why } => format!("audit {action} {}", why.as_str()),
        Effect::Paused(Paused::Already) => "answer paused already".into(),
        Effect::Paused(Paused::Froze { in_flight }) => format!("answer froze {in_flight}"),
        Effect::Refuse(r) => format!("refuse {r:?}"),
        Effect::Error(w, e) => format!("error {}: {e}", w.as_str()),
    }
}

const RUN_SESSION: &[&str] = &["registry running", "audit running session"];
const NOTHING: &[&str] = &[];

fn join(slot: u64) -> Event {
    Event::Join { slot }
}

fn status(slot: u64, busy: bool, parked: bool) -> Event {
    Event::Status { slot, busy, parked }
}

#[test]
fn a_busy_session_holds_the_idle_clock_then_idle_pause_freezes() {
    let mut t = T::new(State::Created, true);
    t.steps(&[
        (0, join(0), RUN_SESSION),
        // busy (opening): however long, never idle
        (1000, Event::Tick, NOTHING),
        (1000, status(0, false, false), NOTHING),
        (1009, Event::Tick, NOTHING),
        (
            1010,
            Event::Tick,
            &[
                "freeze idle.pause",
                "registry paused",
                "audit paused idle.pause",
            ],
        ),
        // paused: the clock asks nothing more until idle.stop
        (1011, Event::Tick, NOTHING),
    ]);
    assert_eq!(t.m.state(), State::Paused);
    assert_eq!(t.m.idle_for(t.t0 + Duration::from_secs(1015)).as_secs(), 15);
}

#[test]
fn a_host_message_thaws_a_paused_sandbox_and_restarts_the_clock() {
    let mut t = T::new(State::Created, true);
    t.steps(&[
        (0, join(0), RUN_SESSION),
        (0, status(0, false, false), NOTHING),
        (
            10,
            Event::Tick,
            &[
                "freeze idle.pause",
                "registry paused",
                "audit paused idle.pause",
            ],
        ),
        (
            20,
            Event::HostMessage,
            &["thaw call", "registry running", "audit running call"],
        ),
        // a message to a running sandbox only restarts the clock
        (25, Event::HostMessage, NOTHING),
        (34, Event::Tick, NOTHING),
        (
            35,
            Event::Tick,
            &[
                "freeze idle.pause",
                "registry paused",
                "audit paused idle.pause",
            ],
        ),
    ]);
}

#[test]
fn a_failed_thaw_on_a_call_leaves_it_paused_and_says_why() {
    let mut t = T::new(State::Created, true);
    t.steps(&[
        (0, join(0), RUN_SESSION),
        (0, status(0, false, false), NOTHING),
        (
            10,
            Event::Tick,
            &[
                "freeze idle.pause",
                "registry paused",
                "audit paused idle.pause",
            ],
        ),
    ]);
    t.fail = Some("boom");
    t.steps(&[(20, Event::HostMessage, &["thaw call", "error call: boom"])]);
    assert_eq!(t.m.state(), State::Paused);
}

#[test]
fn without_a_freezer_a_sandbox_is_never_paused_only_stopped() {
    let mut t = T::new(State::Created, false);
    t.steps(&[
        (0, join(0), RUN_SESSION),
        (0, status(0, false, false), NOTHING),
        (59, Event::Tick, NOTHING),
        (0, Event::Pause, &["refuse NoFreezer"]),
        (60, Event::Tick, &["park"]),
    ]);
}

#[test]
fn a_failed_idle_freeze_leaves_it_running() {
    let mut t = T::new(State::Created, true);
    t.steps(&[
        (0, join(0), RUN_SESSION),
        (0, status(0, false, false), NOTHING),
    ]);
    t.fail = Some("boom");
    t.steps(&[(
        10,
        Event::Tick,
        &["freeze idle.pause", "error idle.pause: boom"],
    )]);
    assert_eq!(t.m.state(), State::Running);
}

#[test]
fn idle_stop_thaws_then_parks_every_session_once() {
    let mut t = T::new(State::Created, true);
    t.steps(&[
        (0, join(0), RUN_SESSION),
        (0, join(1), NOTHING),
        (0, status(0, false, false), NOTHING),
        (0, status(1, false, false), NOTHING),
        (
            10,
            Event::Tick,
            &[
                "freeze idle.pause",
                "registry paused",
                "audit paused idle.pause",
            ],
        ),
        (
            60,
            Event::Tick,
            &[
                "thaw idle.stop",
                "registry running",
                "audit running idle.stop",
                "park",
            ],
        ),
        // asked once, until activity
        (61, Event::Tick, NOTHING),
        // one parked: still running
        (61, status(0, false, true), NOTHING),
        (
            62,
            status(1, false, true),
            &["registry stopped", "audit stopped idle.stop"],
        ),
        // every server parked: nothing to pause or stop
        (200, Event::Tick, NOTHING),
        // a host message to a stopped sandbox thaws nothing; its relay
        // starts its server again and says so
        (210, Event::HostMessage, NOTHING),
        (
            210,
            status(1, true, false),
            &["registry running", "audit running call"],
        ),
        (210, status(1, false, false), NOTHING),
        // the message re-armed idle.stop
        (270, Event::Tick, &["park"]),
    ]);
}

#[test]
fn idle_destroy_wins_and_a_torn_down_sandbox_takes_no_session() {
    let mut t = T::new(State::Created, true);
    t.steps(&[
        (0, join(0), RUN_SESSION),
        (
            0,
            status(0, false, true),
            &["registry stopped", "audit stopped idle.stop"],
        ),
        // every server parked, or no session at all: still destroyed
        (300, Event::Tick, &["destroy"]),
        (300, Event::DestroyBegin, NOTHING),
        // the teardown holds it: the clock leaves it alone
        (900, Event::Tick, NOTHING),
        (300, join(1), &["refuse Destroying"]),
        (300, Event::DestroyBegin, &["refuse Destroying"]),
        // the teardown's sessions end: no `stopped` under it
        (301, Event::Leave { slot: 0 }, NOTHING),
        (301, Event::Destroyed, NOTHING),
        (302, Event::Shutdown, NOTHING),
        (999, Event::Tick, NOTHING),
    ]);
    assert_eq!(t.m.state(), State::Destroyed);
    assert_eq!(t.m.sessions(), 0);
}

#[test]
fn an_empty_sandbox_is_destroyed_after_idle_destroy_and_otherwise_left() {
    let mut t = T::new(State::Stopped, true);
    t.steps(&[
        (10, Event::Tick, NOTHING),
        (299, Event::Tick, NOTHING),
        (300, Event::Tick, &["destroy"]),
    ]);
    let never = Idle {
        destroy: None,
        ..idle()
    };
    let mut t = T::with(State::Stopped, never, true);
    t.steps(&[(100_000, Event::Tick, NOTHING)]);
}

#[test]
fn the_last_session_to_leave_stops_the_sandbox() {
    let mut t = T::new(State::Created, true);
    t.steps(&[
        (0, join(0), RUN_SESSION),
        (0, join(1), NOTHING),
        (1, Event::Leave { slot: 0 }, NOTHING),
        (
            2,
            Event::Leave { slot: 1 },
            &["registry stopped", "audit stopped last session ended"],
        ),
        // the next session runs it again, on its kept workspace
        (3, join(2), RUN_SESSION),
    ]);
    assert!(t.m.has_session(2) && !t.m.has_session(0));
}

#[test]
fn a_session_joining_a_paused_sandbox_runs_it_even_when_the_thaw_fails() {
    let mut t = T::new(State::Created, true);
    t.steps(&[
        (0, join(0), RUN_SESSION),
        (0, status(0, false, false), NOTHING),
        (
            0,
            Event::Pause,
            &[
                "freeze mcpbox sandboxes pause",
                "registry paused",
                "audit paused mcpbox sandboxes pause",
                "answer froze 0",
            ],
        ),
        (
            1,
            join(1),
            &["thaw session", "registry running", "audit running session"],
        ),
        (
            2,
            Event::Pause,
            &[
                "freeze mcpbox sandboxes pause",
                "registry paused",
                "audit paused mcpbox sandboxes pause",
                // session 1 is still opening
                "answer froze 1",
            ],
        ),
    ]);
    t.fail = Some("boom");
    t.steps(&[(
        3,
        join(2),
        &[
            "thaw session",
            "error session: boom",
            "registry running",
            "audit running session",
        ],
    )]);
}

#[test]
fn operator_pause_answers_what_it_did_or_why_not() {
    let mut t = T::new(State::Created, true);
    t.steps(&[
        (0, Event::Pause, &["refuse NothingRuns(Created)"]),
        (0, join(0), RUN_SESSION),
        (
            0,
            Event::Pause,
            &[
                "freeze mcpbox sandboxes pause",
                "registry paused",
                "audit paused mcpbox sandboxes pause",
                "answer froze 1",
            ],
        ),
        (0, Event::Pause, &["answer paused already"]),
        (
            1,
            Event::Resume,
            &[
                "thaw mcpbox sandboxes resume",
                "registry running",
                "audit running mcpbox sandboxes resume",
            ],
        ),
        // running: nothing to resume
        (1, Event::Resume, NOTHING),
    ]);
    t.fail = Some("boom");
    t.steps(&[(
        2,
        Event::Pause,
        &["freeze mcpbox sandboxes pause", "refuse Failed(\"boom\")"],
    )]);
    assert_eq!(t.m.state(), State::Running);
    let mut t = T::new(State::Stopped, true);
    t.steps(&[(0, Event::Pause, &["refuse NothingRuns(Stopped)"])]);
}

#[test]
fn operator_resume_restarts_the_clock_wakes_a_stopped_one_and_says_a_failed_thaw() {
    let mut t = T::new(State::Created, true);
    t.steps(&[
        (0, join(0), RUN_SESSION),
        (0, status(0, false, false), NOTHING),
        (
            10,
            Event::Tick,
            &[
                "freeze idle.pause",
                "registry paused",
                "audit paused idle.pause",
            ],
        ),
        (
            50,
            Event::Resume,
            &[
                "thaw mcpbox sandboxes resume",
                "registry running",
                "audit running mcpbox sandboxes resume",
            ],
        ),
        (59, Event::Tick, NOTHING),
        (
            60,
            Event::Tick,
            &[
                "freeze idle.pause",
                "registry paused",
                "audit paused idle.pause",
            ],
        ),
    ]);
    t.fail = Some("boom");
    t.steps(&[(
        61,
        Event::Resume,
        &["thaw mcpbox sandboxes resume", "refuse Failed(\"boom\")"],
    )]);
    t.fail = None;
    t.steps(&[
        (
            200,
            Event::Tick,
            &[
                "thaw idle.stop",
                "registry running",
                "audit running idle.stop",
                "park",
            ],
        ),
        (
            200,
            status(0, false, true),
            &["registry stopped", "audit stopped idle.stop"],
        ),
        (250, Event::Resume, &["wake"]),
    ]);
    assert_eq!(t.m.idle_for(t.t0 + Duration::from_secs(251)).as_secs(), 1);
}

#[test]
fn a_snapshot_freezes_a_running_sandbox_without_a_state_and_holds_the_clock() {
    let mut t = T::new(State::Created, true);
    t.steps(&[
        (0, join(0), RUN_SESSION),
        (0, status(0, false, false), NOTHING),
        (1, Event::SnapshotBegin, &["freeze snapshot"]),
        (500, Event::Tick, NOTHING),
        (500, Event::SnapshotEnd, &["thaw snapshot"]),
        (500, Event::SnapshotEnd, NOTHING),
        (500, Event::Tick, &["destroy"]),
    ]);
    assert_eq!(t.m.state(), State::Running);
    // not running, or no freezer: read as it is
    for (state, freezer) in [(State::Stopped, true), (State::Created, false)] {
        let mut t = T::new(state, freezer);
        t.steps(&[
            (0, Event::SnapshotBegin, NOTHING),
            (0, Event::SnapshotEnd, NOTHING),
        ]);
    }
    // a freeze that failed is not thawed, and leaves the clock on
    let mut t = T::new(State::Created, true);
    t.steps(&[
        (0, join(0), RUN_SESSION),
        (0, status(0, false, false), NOTHING),
    ]);
    t.fail = Some("boom");
    t.steps(&[
        (1, Event::SnapshotBegin, &["freeze snapshot"]),
        (2, Event::SnapshotEnd, NOTHING),
        (300, Event::Tick, &["destroy"]),
    ]);
}

#[test]
fn serve_stopping_stops_what_is_not_destroyed() {
    let mut t = T::new(State::Created, true);
    t.steps(&[
        (0, join(0), RUN_SESSION),
        (
            1,
            Event::Shutdown,
            &["registry stopped", "audit stopped serve stopped"],
        ),
        (2, Event::Shutdown, NOTHING),
    ]);
}

#[test]
fn a_status_of_a_session_that_left_changes_nothing() {
    let mut t = T::new(State::Created, true);
    t.steps(&[
        (0, join(0), RUN_SESSION),
        (0, join(1), NOTHING),
        (1, Event::Leave { slot: 1 }, NOTHING),
        (1, status(1, false, true), NOTHING),
        (1, status(0, false, false), NOTHING),
        // the same status again: nothing
        (1, status(0, false, false), NOTHING),
    ]);
}

/// `sandboxes pause` once said `running` with no word of why: a call
/// had thawed the sandbox between the freeze and the answer.
#[test]
fn a_pause_that_a_call_undid_says_so() {
    let n = Paused::Froze { in_flight: 0 }.note(State::Running);
    assert!(
        n.starts_with("running: ") && n.contains("a call woke it"),
        "{n}"
    );
    assert_eq!(Paused::Froze { in_flight: 0 }.note(State::Paused), "paused");
    assert_eq!(Paused::Already.note(State::Paused), "paused already");
    let n = Paused::Froze { in_flight: 2 }.note(State::Paused);
    assert!(n.contains("2 session(s) in the middle of a request"), "{n}");
    let n = Paused::Already.note(State::Stopped);
    assert!(n.starts_with("stopped: "), "{n}");
}
