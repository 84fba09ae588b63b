//! The broker's rules, one test per way an approval could be misused.

use std::sync::mpsc;
use std::sync::Arc;
use std::time::{Duration, SystemTime};

use mcpbox_audit::{Kind, MemorySink};
use mcpbox_policy::{Decision, Reason};
use serde_json::json;

use super::*;

fn ask(id: &str, digest: &str, hold: bool, wait: Duration) -> Ask {
    Ask {
        id: id.into(),
        session: "s-1".into(),
        sandbox_id: String::new(),
        binding: Binding {
            caller: "alice".into(),
            server: "fs".into(),
            tool: "delete".into(),
            args_digest: digest.into(),
            policy_version: "p1".into(),
        },
        subject: Subject::Call { bytes: None },
        rule: Decision::approve(Reason::ToolRule, "policy:tools.delete"),
        preview: json!({"path": "/workspace/output/x"}),
        expires: SystemTime::now() + wait,
        hold,
        elicitation: false,
        answered: None,
    }
}

fn broker() -> (Arc<Broker>, Arc<MemorySink>) {
    let sink = Arc::new(MemorySink::new());
    (Broker::new(sink.clone()), sink)
}

/// A clock the test moves: the broker's idea of now, from the real time
/// it starts at.
#[derive(Clone)]
struct TestClock(Arc<std::sync::Mutex<SystemTime>>);

impl TestClock {
    fn advance(&self, d: Duration) {
        *self.0.lock().unwrap() += d;
    }

    /// [`ask`], expiring `wait` after this clock's now.
    fn ask(&self, id: &str, digest: &str, hold: bool, wait: Duration) -> Ask {
        let mut a = ask(id, digest, hold, wait);
        a.expires = *self.0.lock().unwrap() + wait;
        a
    }
}

/// A broker on a [`TestClock`], which starts at the system clock's now.
fn broker_on_a_clock() -> (Arc<Broker>, Arc<MemorySink>, TestClock) {
    let sink = Arc::new(MemorySink::new());
    let clock = TestClock(Arc::new(std::sync::Mutex::new(SystemTime::now())));
    let c = clock.clone();
    let b = Broker::with_clock(sink.clone(), Box::new(move || *c.0.lock().unwrap()));
    (b, sink, clock)
}

fn actions(sink: &MemorySink) -> Vec<String> {
    sink.events()
        .iter()
        .filter(|e| e.kind == Some(Kind::Approval))
        .map(|e| e.detail["action"].as_str().unwrap_or("").to_string())
        .collect()
}

const A: &str = "ap-00000000000a";
const B: &str = "ap-00000000000b";
const MIN: Duration = Duration::from_secs(60);

#[test]
fn held_call_gets_the_answer_once() {
    let (b, sink) = broker();
    let (tx, rx) = mpsc::channel();
    assert_eq!(
        b.ask(
            ask(A, "d1", true, MIN),
            Box::new(move |a| tx.send(a).unwrap())
        ),
        Asked::Held
    );
    assert_eq!(b.list().len(), 1);
    b.answer(A, true, Scope::Once, "cli:uid=0").unwrap();
    assert!(matches!(rx.recv().unwrap(), Answer::Approved { .. }));
    // a second answer finds nothing: single use
    assert_eq!(
        b.answer(A, true, Scope::Once, "cli:uid=0"),
        Err(AnswerError::Unknown(A.into()))
    );
    assert!(b.list().is_empty());
    assert_eq!(actions(&sink), ["requested", "approved"]);
}

#[test]
fn refused_call_approved_passes_once_with_the_same_arguments() {
    let (b, sink) = broker();
    assert_eq!(
        b.ask(ask(A, "d1", false, MIN), Box::new(|_| {})),
        Asked::Refused { id: A.into() }
    );
    // the same call again before anyone answered: the same id
    assert_eq!(
        b.ask(ask(B, "d1", false, MIN), Box::new(|_| {})),
        Asked::Refused { id: A.into() }
    );
    b.answer(A, true, Scope::Once, "console").unwrap();
    assert_eq!(b.list()[0].state, "approved");
    let granted = b.ask(ask(B, "d1", false, MIN), Box::new(|_| {}));
    assert!(
        matches!(granted, Asked::Granted { ref id, .. } if id == A),
        "{granted:?}"
    );
    // used twice: the grant is gone, so the call is refused again
    assert!(matches!(
        b.ask(ask(B, "d1", false, MIN), Box::new(|_| {})),
        Asked::Refused { .. }
    ));
    assert_eq!(
        actions(&sink),
        ["requested", "approved", "used", "requested"]
    );
}

#[test]
fn approval_for_call_a_is_not_used_by_call_b() {
    let (b, _) = broker();
    b.ask(ask(A, "digest-of-a", false, MIN), Box::new(|_| {}));
    b.answer(A, true, Scope::Once, "cli:uid=0").unwrap();
    let other = b.ask(ask(B, "digest-of-b", false, MIN), Box::new(|_| {}));
    assert_eq!(other, Asked::Refused { id: B.into() });
    // nor by another caller, nor under another policy
    let mut x = ask(B, "digest-of-a", false, MIN);
    x.binding.caller = "mallory".into();
    assert!(matches!(b.ask(x, Box::new(|_| {})), Asked::Refused { .. }));
    let mut y = ask(B, "digest-of-a", false, MIN);
    y.binding.policy_version = "p2".into();
    assert!(matches!(b.ask(y, Box::new(|_| {})), Asked::Refused { .. }));
    // the rightful retry still works
    assert!(matches!(
        b.ask(ask(B, "digest-of-a", false, MIN), Box::new(|_| {})),
        Asked::Granted { .. }
    ));
}

#[test]
fn expired_approval_cannot_be_answered_or_used() {
    let (b, sink, clock) = broker_on_a_clock();
    b.ask(
        clock.ask(A, "d1", false, Duration::from_millis(30)),
        Box::new(|_| {}),
    );
    clock.advance(Duration::from_millis(60));
    assert_eq!(
        b.answer(A, true, Scope::Once, "cli:uid=0"),
        Err(AnswerError::Unknown(A.into()))
    );
    // approved in time, but retried too late
    b.ask(
        clock.ask(B, "d2", false, Duration::from_millis(50)),
        Box::new(|_| {}),
    );
    b.answer(B, true, Scope::Once, "cli:uid=0").unwrap();
    clock.advance(Duration::from_millis(80));
    assert!(matches!(
        b.ask(
            clock.ask("ap-00000000000c", "d2", false, MIN),
            Box::new(|_| {})
        ),
        Asked::Refused { .. }
    ));
    assert_eq!(
        actions(&sink),
        [
            "requested",
            "expired",
            "requested",
            "approved",
            "expired",
            "requested"
        ]
    );
}

#[test]
fn held_call_expires_with_an_answer() {
    let (b, _, clock) = broker_on_a_clock();
    let (tx, rx) = mpsc::channel();
    b.ask(
        clock.ask(A, "d1", true, Duration::from_millis(20)),
        Box::new(move |a| tx.send(a).unwrap()),
    );
    clock.advance(Duration::from_millis(40));
    assert!(b.list().is_empty());
    assert_eq!(rx.recv().unwrap(), Answer::Expired);
}

#[test]
fn session_grant_covers_the_tool_for_that_session_only() {
    let (b, _) = broker();
    let (tx, _rx) = mpsc::channel();
    b.ask(
        ask(A, "d1", true, MIN),
        Box::new(move |a| tx.send(a).unwrap()),
    );
    b.answer(A, true, Scope::Session, "console").unwrap();
    assert!(matches!(
        b.ask(ask(B, "other-args", true, MIN), Box::new(|_| {})),
        Asked::Granted {
            scope: Scope::Session,
            ..
        }
    ));
    let mut other = ask("ap-00000000000c", "d1", true, MIN);
    other.session = "s-2".into();
    assert_eq!(b.ask(other, Box::new(|_| {})), Asked::Held);
    b.end_session("s-1");
    assert_eq!(
        b.ask(ask("ap-00000000000d", "d1", false, MIN), Box::new(|_| {})),
        Asked::Refused {
            id: "ap-00000000000d".into()
        }
    );
}

#[test]
fn session_end_abandons_what_waits_and_says_so() {
    let (b, sink) = broker();
    let (tx, rx) = mpsc::channel();
    b.ask(
        ask(A, "d1", true, MIN),
        Box::new(move |a| tx.send(a).unwrap()),
    );
    b.end_session("s-1");
    assert_eq!(rx.recv().unwrap(), Answer::Expired);
    assert!(b.list().is_empty());
    let ev = sink.events();
    let last = ev.last().unwrap();
    assert_eq!(last.detail["action"], "abandoned");
    assert_eq!(last.reason.as_deref(), Some("approval.abandoned"));
}

#[test]
fn denied_is_final() {
    let (b, _) = broker();
    b.ask(ask(A, "d1", false, MIN), Box::new(|_| {}));
    b.answer(A, false, Scope::Once, "cli:uid=0").unwrap();
    assert!(b.list().is_empty());
    assert!(
        matches!(b.ask(ask(B, "d1", false, MIN), Box::new(|_| {})), Asked::Refused { ref id } if id == B)
    );
}

#[test]
fn malformed_ids_are_refused() {
    let (b, _) = broker();
    for bad in ["", "ap-", "ap-0000000000zz", "../../etc", "AP-00000000000A"] {
        assert!(matches!(
            b.answer(bad, true, Scope::Once, "x"),
            Err(AnswerError::Malformed(_))
        ));
    }
}

#[test]
fn close_from_the_session_is_audited_once() {
    let (b, sink) = broker();
    b.ask(ask(A, "d1", true, MIN), Box::new(|_| {}));
    b.close(
        A,
        Closed::Answered(Answer::Approved {
            by: "elicitation".into(),
            scope: Scope::Once,
        }),
    );
    b.close(A, Closed::Expired);
    assert_eq!(actions(&sink), ["requested", "approved"]);
}

#[test]
fn session_grant_for_one_host_does_not_open_another() {
    let (b, _) = broker();
    let net = |id: &str, host: &str| {
        let mut a = ask(id, &format!("digest-{host}"), true, MIN);
        a.binding.tool = "network".into();
        a.subject = Subject::Network {
            host: host.into(),
            port: 443,
        };
        a
    };
    b.ask(net(A, "api.example.com"), Box::new(|_| {}));
    b.answer(A, true, Scope::Session, "console").unwrap();
    assert!(matches!(
        b.ask(net(B, "api.example.com"), Box::new(|_| {})),
        Asked::Granted { .. }
    ));
    assert_eq!(
        b.ask(net("ap-00000000000c", "evil.example.net"), Box::new(|_| {})),
        Asked::Held
    );
}

#[test]
fn approvals_with_huge_names_are_bounded_in_bytes_per_session() {
    let (b, _) = broker();
    let mut held = 0;
    for i in 0..MAX_OPEN_PER_SESSION {
        let mut a = ask(&format!("ap-{i:012x}"), &format!("d{i}"), false, MIN);
        // a tool name the server chose, 256 KiB long
        a.binding.tool = "t".repeat(256 * 1024);
        match b.ask(a, Box::new(|_| {})) {
            Asked::Refused { .. } => held += 1,
            Asked::TooMany => break,
            other => panic!("{other:?}"),
        }
    }
    assert!(held < MAX_OPEN_PER_SESSION && held > 0, "{held}");
    let open: usize = b.list().iter().map(|v| v.binding.tool.len()).sum();
    assert!(open <= MAX_BYTES_PER_SESSION, "{open}");
    // another session still gets its own share
    let mut other = ask("ap-fffffffffffe", "d0", false, MIN);
    other.session = "s-2".into();
    assert!(matches!(
        b.ask(other, Box::new(|_| {})),
        Asked::Refused { .. }
    ));
}

#[test]
fn a_session_flooding_approvals_is_cut_off_and_the_table_stays_bounded() {
    let (b, _) = broker();
    for i in 0..MAX_OPEN_PER_SESSION {
        let id = format!("ap-{i:012x}");
        assert!(matches!(
            b.ask(ask(&id, &format!("d{i}"), false, MIN), Box::new(|_| {})),
            Asked::Refused { .. }
        ));
    }
    let over = b.ask(
        ask("ap-ffffffffffff", "one-more", false, MIN),
        Box::new(|_| {}),
    );
    assert_eq!(over, Asked::TooMany);
    assert_eq!(b.list().len(), MAX_OPEN_PER_SESSION);
    // another session is not starved by this one
    let mut other = ask("ap-fffffffffffe", "d0", false, MIN);
    other.session = "s-2".into();
    assert!(matches!(
        b.ask(other, Box::new(|_| {})),
        Asked::Refused { .. }
    ));
}

#[test]
fn a_waiter_learns_of_an_expiry_when_it_happens() {
    let (b, sink) = broker();
    b.ask(
        ask(A, "d1", false, Duration::from_millis(100)),
        Box::new(|_| {}),
    );
    let seen = b.version();
    let start = std::time::Instant::now();
    let v = b.wait_changed(seen, Duration::from_secs(20));
    assert_ne!(v, seen);
    assert!(
        start.elapsed() < Duration::from_secs(10),
        "woke at the expiry, not the timeout"
    );
    assert!(b.list().is_empty());
    assert_eq!(actions(&sink), ["requested", "expired"]);
    // with nothing open, the wait is the timeout
    let seen = b.version();
    assert_eq!(b.wait_changed(seen, Duration::from_millis(30)), seen);
}

/// An ask that says the host's human approved `prior` in the request.
fn answering(id: &str, digest: &str, prior: &str) -> Ask {
    let mut a = ask(id, digest, false, MIN);
    a.elicitation = true;
    a.answered = Some((prior.into(), Scope::Once));
    a
}

#[test]
fn a_yes_in_the_retry_grants_its_own_approval_and_is_used_once() {
    let (b, sink) = broker();
    let mut first = ask(A, "d1", false, MIN);
    first.elicitation = true;
    assert_eq!(
        b.ask(first, Box::new(|_| {})),
        Asked::Refused { id: A.into() }
    );
    let granted = b.ask(answering(B, "d1", A), Box::new(|_| {}));
    assert!(
        matches!(granted, Asked::Granted { ref id, ref by, .. } if id == A && by == "elicitation"),
        "{granted:?}"
    );
    assert!(b.list().is_empty());
    // the same yes replayed: nothing left to grant
    assert_eq!(
        b.ask(answering(B, "d1", A), Box::new(|_| {})),
        Asked::Closed { id: A.into() }
    );
    assert_eq!(actions(&sink), ["requested", "approved", "used"]);
}

#[test]
fn a_yes_in_the_retry_for_call_a_does_not_pass_call_b() {
    let (b, _) = broker();
    b.ask(ask(A, "digest-of-a", false, MIN), Box::new(|_| {}));
    assert_eq!(
        b.ask(answering(B, "digest-of-b", A), Box::new(|_| {})),
        Asked::Closed { id: A.into() }
    );
    // A is untouched, still pending for its own call
    assert_eq!(b.list()[0].id, A);
    assert_eq!(b.list()[0].state, "pending");
}

#[test]
fn a_yes_in_the_retry_after_a_human_denied_does_not_revive_it() {
    let (b, _) = broker();
    b.ask(ask(A, "d1", false, MIN), Box::new(|_| {}));
    b.answer(A, false, Scope::Once, "cli:uid=0").unwrap();
    assert_eq!(
        b.ask(answering(B, "d1", A), Box::new(|_| {})),
        Asked::Closed { id: A.into() }
    );
}

#[test]
fn a_yes_in_the_retry_after_the_cli_approved_uses_that_grant() {
    let (b, sink) = broker();
    b.ask(ask(A, "d1", false, MIN), Box::new(|_| {}));
    b.answer(A, true, Scope::Once, "cli:uid=0").unwrap();
    let granted = b.ask(answering(B, "d1", A), Box::new(|_| {}));
    assert!(
        matches!(granted, Asked::Granted { ref id, ref by, .. } if id == A && by == "cli:uid=0"),
        "{granted:?}"
    );
    assert_eq!(actions(&sink), ["requested", "approved", "used"]);
}

#[test]
fn a_yes_for_the_session_in_the_retry_covers_the_tools_later_calls_in_that_session_only() {
    let (b, _) = broker();
    b.ask(ask(A, "d1", false, MIN), Box::new(|_| {}));
    let mut yes = answering(B, "d1", A);
    yes.answered = Some((A.into(), Scope::Session));
    assert!(matches!(b.ask(yes, Box::new(|_| {})), Asked::Granted { ref id, .. } if id == A));
    // another call of the tool in the same session: granted
    let later = b.ask(ask("ap-00000000000c", "d2", false, MIN), Box::new(|_| {}));
    assert!(
        matches!(later, Asked::Granted { ref by, .. } if by == "session"),
        "{later:?}"
    );
    // in another session: asked
    let mut elsewhere = ask("ap-00000000000d", "d2", false, MIN);
    elsewhere.session = "s-2".into();
    assert!(matches!(
        b.ask(elsewhere, Box::new(|_| {})),
        Asked::Refused { .. }
    ));
}

#[test]
fn a_form_answered_for_the_session_grants_the_session() {
    let (b, _) = broker();
    b.ask(ask(A, "d1", true, MIN), Box::new(|_| {}));
    b.close(
        A,
        Closed::Answered(Answer::Approved {
            by: "elicitation".into(),
            scope: Scope::Session,
        }),
    );
    let later = b.ask(ask(B, "d2", true, MIN), Box::new(|_| {}));
    assert!(
        matches!(later, Asked::Granted { ref by, .. } if by == "session"),
        "{later:?}"
    );
}

fn measured(id: &str, bytes: u64) -> Ask {
    Ask {
        subject: Subject::Call { bytes: Some(bytes) },
        ..ask(id, "d1", false, MIN)
    }
}

const C: &str = "ap-00000000000c";

/// Issue 26: a human approved an export of 4096 bytes; the agent grows
/// the file and retries the very same call. The grant is for what was
/// measured: the retry is a new question; a retry measuring no more
/// uses the grant.
#[test]
fn a_grant_for_a_measured_call_does_not_cover_a_retry_that_measures_more() {
    let (b, _sink) = broker();
    assert_eq!(
        b.ask(measured(A, 4096), Box::new(|_| {})),
        Asked::Refused { id: A.into() }
    );
    b.answer(A, true, Scope::Once, "cli:uid=0").unwrap();
    // grown: not granted, and not folded into the approved entry either
    assert_eq!(
        b.ask(measured(B, 8192), Box::new(|_| {})),
        Asked::Refused { id: B.into() }
    );
    // the same size as approved: the grant is used
    assert!(matches!(
        b.ask(measured(C, 4096), Box::new(|_| {})),
        Asked::Granted { id, .. } if id == A
    ));
}

#[test]
fn a_pending_question_is_not_reused_for_a_call_that_measures_more() {
    let (b, _sink) = broker();
    assert_eq!(
        b.ask(measured(A, 10), Box::new(|_| {})),
        Asked::Refused { id: A.into() }
    );
    // the human would see 10 bytes under A: a grown retry asks anew
    assert_eq!(
        b.ask(measured(B, 11), Box::new(|_| {})),
        Asked::Refused { id: B.into() }
    );
    assert_eq!(
        b.ask(measured(C, 10), Box::new(|_| {})),
        Asked::Refused { id: A.into() }
    );
}

#[test]
fn a_session_grant_covers_no_more_than_the_size_it_was_given_for() {
    let (b, _sink) = broker();
    b.ask(measured(A, 100), Box::new(|_| {}));
    b.answer(A, true, Scope::Session, "cli:uid=0").unwrap();
    assert!(matches!(
        b.ask(measured(B, 50), Box::new(|_| {})),
        Asked::Granted { .. }
    ));
    assert_eq!(
        b.ask(measured(C, 101), Box::new(|_| {})),
        Asked::Refused { id: C.into() }
    );
}

#[test]
fn a_grant_for_a_held_result_does_not_cover_a_larger_or_more_secret_result() {
    let result = |id: &str, bytes: u64, shapes: &[&str]| Ask {
        subject: Subject::Result {
            bytes,
            over: Some(10),
            credential_shapes: shapes.iter().map(|s| s.to_string()).collect(),
        },
        ..ask(id, "d1", false, MIN)
    };
    let (b, _sink) = broker();
    b.ask(result(A, 100, &["aws"]), Box::new(|_| {}));
    b.answer(A, true, Scope::Once, "cli:uid=0").unwrap();
    assert_eq!(
        b.ask(result(B, 101, &["aws"]), Box::new(|_| {})),
        Asked::Refused { id: B.into() }
    );
    assert_eq!(
        b.ask(result(C, 100, &["aws", "github"]), Box::new(|_| {})),
        Asked::Refused { id: C.into() }
    );
    assert!(matches!(
        b.ask(result("ap-00000000000d", 90, &[]), Box::new(|_| {})),
        Asked::Granted { id, .. } if id == A
    ));
}

#[test]
fn a_yes_in_the_retry_does_not_cover_a_retry_that_measures_more() {
    let (b, _sink) = broker();
    b.ask(measured(A, 100), Box::new(|_| {}));
    let retry = Ask {
        answered: Some((A.to_string(), Scope::Once)),
        ..measured(B, 200)
    };
    assert_eq!(
        b.ask(retry, Box::new(|_| {})),
        Asked::Closed { id: A.into() }
    );
}
