//! Timeouts, exits, stops and the TTL restart.

use std::time::Duration;

use serde_json::json;

use super::*;

// ---- timeouts and lifecycle ------------------------------------------------------------

#[test]
fn call_timeout_cancels_at_the_server_and_answers_the_host() {
    let cfg = Config {
        call_timeout: Some(Duration::from_secs(2)),
        ..config()
    };
    let mut t = T::new(cfg, rules(vec![]));
    t.host(&call(5, "slow", json!({})));
    assert_eq!(
        t.s.deadline(),
        Some(t.base + Duration::from_millis(250)),
        "exit poll first"
    );
    t.after(1_999);
    let out = t.after(1);
    assert_eq!(
        out,
        s(&[
            r#"server {"jsonrpc":"2.0","method":"notifications/cancelled","params":{"reason":"mcpbox: call timed out","requestId":5}}"#,
            "audit ToolCall allow call.timeout",
            "host error -31003 call.timeout id=5"
        ])
    );
    // the late answer goes nowhere
    assert_eq!(t.server(&text_result(5, &["late"])), Vec::<String>::new());
}

#[test]
fn crash_with_calls_in_flight_answers_each_and_audits_it() {
    let mut t = T::new(config(), rules(vec![]));
    t.host(&call(1, "a", json!({})));
    t.host(&call(2, "b", json!({})));
    // the answers wait (bounded) for stderr: its last lines say why
    assert_eq!(t.server_dies(3), Vec::<String>::new());
    let mut out = t.on(Event::StderrClosed {
        gen: 1,
        redactions: vec![("TOKEN".into(), 2)],
        tail: vec![],
    });
    // the calls in flight are answered in no particular order
    out[1..5].sort();
    assert_eq!(
        out,
        s(&[
            "audit Redaction redaction.secret",
            "audit ToolCall allow server.exited",
            "audit ToolCall allow server.exited",
            "host error -31002 server.exited id=1",
            "host error -31002 server.exited id=2",
            "audit ServerExit server.exited",
            "audit SessionEnd",
            "end ServerExited"
        ])
    );
    assert!(t.s.is_ended() && t.s.deadline().is_none());
}

/// Issue 11: a server that exits at start reached the host as "mcp
/// server exited (status 1)" and nothing else; its last stderr lines (as
/// the reader redacted them) now come with the error, in the message and
/// in `data.stderr`.
#[test]
fn a_server_that_exits_before_answering_says_why_in_the_error() {
    let mut t = T::new(config(), rules(vec![]));
    t.host(r#"{"jsonrpc":"2.0","id":1,"method":"initialize","params":{}}"#);
    t.server_dies(1);
    t.on(Event::StderrClosed {
        gen: 1,
        redactions: vec![],
        tail: vec!["starting".into(), "boom: missing config file".into()],
    });
    let err = t.to_host().remove(0);
    assert_eq!(err["id"], 1);
    assert_eq!(
        err["error"]["message"],
        "mcp server exited (status 1); its last stderr lines:\nstarting\nboom: missing config file"
    );
    assert_eq!(
        err["error"]["data"]["stderr"],
        json!(["starting", "boom: missing config file"])
    );
}

/// A server whose stderr stays open (a grandchild holds it) still has its
/// requests answered, without lines, once [`STDERR_WAIT`] passed.
#[test]
fn the_answers_wait_for_stderr_no_longer_than_stderr_wait() {
    let mut t = T::new(config(), rules(vec![]));
    t.host(&call(1, "a", json!({})));
    t.server_dies(1);
    assert_eq!(t.after(999), Vec::<String>::new());
    assert_eq!(
        t.after(1),
        s(&[
            "audit ToolCall allow server.exited",
            "host error -31002 server.exited id=1",
            "audit ServerExit server.exited",
            "audit SessionEnd",
            "end ServerExited"
        ])
    );
}

#[test]
fn the_stderr_tail_is_bounded_and_credential_shapes_are_redacted() {
    use crate::session::supervise::{
        bounded_tail, STDERR_TAIL_BYTES, STDERR_TAIL_LINES, STDERR_TAIL_LINE_BYTES,
    };
    let many: Vec<String> = (0..50).map(|i| format!("line {i}")).collect();
    let kept = bounded_tail(many);
    assert_eq!(kept.len(), STDERR_TAIL_LINES);
    assert_eq!(kept.last().unwrap(), "line 49");
    let long: Vec<String> = (0..10).map(|_| "é".repeat(1000)).collect();
    let kept = bounded_tail(long);
    assert!(kept.iter().all(|l| l.len() <= STDERR_TAIL_LINE_BYTES));
    assert!(kept.iter().map(String::len).sum::<usize>() <= STDERR_TAIL_BYTES);

    let cfg = Config {
        redact_credential_shapes: true,
        ..config()
    };
    let mut t = T::new(cfg, rules(vec![]));
    t.host(&call(1, "a", json!({})));
    t.server_dies(1);
    let key = "AKIAIOSFODNN7EXAMPLE";
    t.on(Event::StderrClosed {
        gen: 1,
        redactions: vec![],
        tail: vec![format!("crashed with key {key}")],
    });
    let text = json!(t.to_host()).to_string();
    assert!(
        text.contains("crashed with key") && !text.contains(key),
        "{text}"
    );
}

#[test]
fn host_eof_stops_the_server_politely_then_firmly() {
    let cfg = Config {
        drain_grace: Duration::from_millis(1_000),
        ..config()
    };
    let mut t = T::new(cfg, rules(vec![]));
    t.host(&call(1, "a", json!({})));
    assert_eq!(t.on(Event::Host(Line::Eof)), ["close 1"]);
    // it owes an answer: it gets the drain grace, not the short one
    assert_eq!(t.after(999), Vec::<String>::new());
    assert_eq!(t.after(1), ["term 1"]);
    assert_eq!(t.after(100), ["kill 1"]);
    let mut out = t.server_dies(137);
    out.extend(t.after(1_000));
    assert_eq!(
        out,
        s(&[
            "audit ToolCall allow server.exited",
            "host error -31002 server.exited id=1",
            "audit ServerExit server.stopped",
            "audit SessionEnd",
            "end HostClosed"
        ])
    );
}

#[test]
fn a_server_that_owes_nothing_gets_the_short_grace_after_host_eof() {
    let mut t = T::new(config(), rules(vec![]));
    assert_eq!(t.on(Event::Host(Line::Eof)), ["close 1"]);
    assert_eq!(t.after(99), Vec::<String>::new());
    assert_eq!(t.after(1), ["term 1"]);
}

/// The MCP stdio shutdown (issue 25): the host closes its input right
/// after a request; the server still answers it and then exits on its
/// own. Before, it got SIGTERM `shutdown_grace` after its stdin closed,
/// answer or not.
#[test]
fn a_server_answering_after_host_eof_is_not_cut_short() {
    let mut t = T::new(config(), rules(vec![]));
    t.host(&call(1, "a", json!({})));
    assert_eq!(t.on(Event::Host(Line::Eof)), ["close 1"]);
    // well past shutdown_grace (100 ms), the call is still owed
    assert_eq!(t.after(3_000), Vec::<String>::new());
    let out = t.server(&text_result(1, &["late"]));
    assert!(out.iter().any(|e| e.starts_with("host ")), "{out:?}");
    // what it writes after its answer is still forwarded; the short grace
    // counts from its last line
    assert_eq!(t.after(99), Vec::<String>::new());
    assert_eq!(t.after(1), ["term 1"]);
}

#[test]
fn a_server_that_never_answers_after_host_eof_is_terminated_at_the_drain_grace() {
    let mut t = T::new(config(), rules(vec![]));
    t.host(&call(1, "a", json!({})));
    assert_eq!(t.on(Event::Host(Line::Eof)), ["close 1"]);
    assert_eq!(t.after(9_999), Vec::<String>::new());
    assert_eq!(t.after(1), ["term 1"]);
}

#[test]
fn server_that_closes_stdout_but_lives_is_terminated() {
    let mut t = T::new(config(), rules(vec![]));
    t.on(Event::Server {
        gen: 1,
        line: Line::Eof,
    });
    assert_eq!(t.after(499), Vec::<String>::new());
    assert_eq!(t.after(1), ["term 1"]);
}

#[test]
fn host_gone_ends_the_session_as_such() {
    let mut t = T::new(config(), rules(vec![]));
    assert_eq!(t.on(Event::HostGone), ["close 1"]);
    let mut out = t.server_dies(0);
    out.extend(t.on(Event::StderrClosed {
        gen: 1,
        redactions: vec![],
        tail: vec![],
    }));
    assert_eq!(
        out,
        s(&[
            "audit ServerExit host.gone",
            "audit SessionEnd",
            "end HostGone"
        ])
    );
}

#[test]
fn ttl_restart_waits_for_idle_holds_calls_and_replays_initialize() {
    let secrets = Secrets(vec![Secret {
        name: "TOKEN".into(),
        value: "old-secret-value-42".into(),
        ttl: Some(Duration::from_secs(1)),
        source: None,
        placeholder: None,
    }]);
    let mut t = T::with(config(), rules(vec![]), secrets, None, false);
    t.init(json!({}));
    t.host(&call(1, "a", json!({})));
    // due, but a call is in flight: no restart, and no busy deadline
    assert_eq!(t.after(1_500), Vec::<String>::new());
    assert!(t.s.deadline().unwrap() > t.now().mono);
    let answer = text_result(1, &["done"]);
    assert_eq!(
        t.server(&answer),
        [
            format!("host {answer}"),
            "audit ToolCall allow tool.default".into(),
            "close 1".into()
        ]
    );
    // arriving while the server restarts: held, in order
    let c2 = call(2, "b", json!({}));
    let ping = r#"{"jsonrpc":"2.0","id":3,"method":"ping"}"#;
    assert_eq!(t.host(&c2), Vec::<String>::new());
    assert_eq!(t.host(ping), Vec::<String>::new());
    assert_eq!(
        t.server_dies(0),
        s(&["audit ServerExit secret.ttl_restart", "start 2 refresh"])
    );
    let fresh = Secrets(vec![Secret {
        name: "TOKEN".into(),
        value: "new-secret-value-43".into(),
        ttl: Some(Duration::from_secs(1)),
        source: None,
        placeholder: None,
    }]);
    let out = t.on(Event::ServerStarted {
        gen: 2,
        secrets: fresh,
        facts: Value::Null,
    });
    assert_eq!(out.len(), 1);
    assert!(
        out[0].starts_with(
            r#"server {"id":"mcpbox-reinit-n0nce-2","jsonrpc":"2.0","method":"initialize""#
        ),
        "{out:?}"
    );
    // lines of the old generation are ignored
    assert_eq!(
        t.on(Event::Server {
            gen: 1,
            line: Line::Data(text_result(2, &["stale"]).into_bytes())
        }),
        Vec::<String>::new()
    );
    let reinit = r#"{"jsonrpc":"2.0","id":"mcpbox-reinit-n0nce-2","result":{"capabilities":{}}}"#;
    assert_eq!(
        t.server(reinit),
        [
            r#"server {"jsonrpc":"2.0","method":"notifications/initialized"}"#.to_string(),
            format!("server {c2}"),
            format!("server {ping}")
        ]
    );
    // the old value stays redacted: the new server may have cached it
    t.server(&text_result(
        2,
        &["old-secret-value-42 new-secret-value-43"],
    ));
    let sent = t.to_host()[0].to_string();
    assert!(
        !sent.contains("old-secret") && !sent.contains("new-secret"),
        "{sent}"
    );
}

#[test]
fn failed_restart_ends_the_session_and_answers_held_requests() {
    let secrets = Secrets(vec![Secret {
        name: "TOKEN".into(),
        value: "old-secret-value-42".into(),
        ttl: Some(Duration::from_secs(1)),
        source: None,
        placeholder: None,
    }]);
    let mut t = T::with(config(), rules(vec![]), secrets, None, false);
    assert_eq!(t.after(1_000), ["close 1"]);
    t.server_dies(0);
    t.host(&call(7, "a", json!({})));
    assert_eq!(
        t.on(Event::ServerStartFailed {
            gen: 2,
            error: "no".into()
        }),
        s(&[
            "host error -31002 server.exited id=7",
            "audit ServerExit server.exited",
            "audit SessionEnd",
            "end ServerExited"
        ])
    );
}

#[test]
fn too_many_held_messages_get_a_retryable_error() {
    let secrets = Secrets(vec![Secret {
        name: "TOKEN".into(),
        value: "old-secret-value-42".into(),
        ttl: Some(Duration::from_secs(1)),
        source: None,
        placeholder: None,
    }]);
    let mut t = T::with(config(), rules(vec![]), secrets, None, false);
    // the restart begins and does not finish
    assert_eq!(t.after(1_000), ["close 1"]);
    for i in 0..crate::session::supervise::HOLD_MAX_MESSAGES {
        assert!(t.host(&call(i as i64, "a", json!({}))).is_empty());
    }
    assert_eq!(
        t.host(&call(-1, "a", json!({}))),
        ["host error -31005 server.restarting id=-1"]
    );
}

#[test]
fn events_after_the_end_do_nothing_but_answer_outsiders() {
    let mut t = T::new(config(), rules(vec![]));
    t.server_dies(0);
    t.after(1_000);
    assert!(t.s.is_ended());
    assert_eq!(t.host(&call(1, "a", json!({}))), Vec::<String>::new());
    let q = Question {
        prefix: "p",
        message: String::new(),
        schema: json!({}),
        wait: Duration::from_secs(1),
        needs_capability: false,
    };
    assert_eq!(
        t.on(Event::Ask {
            ticket: 9,
            question: q
        }),
        ["answer 9 unavailable"]
    );
    let _ = SystemTime::now();
}

/// A script (or a host) that writes its requests and closes its output at
/// once, before the server is even up: every request still reaches the
/// server or the policy, and the server's stdin is closed only after them.
#[test]
fn requests_piped_before_the_server_is_up_are_all_handled_before_its_stdin_closes() {
    let base = Instant::now();
    let now = Now {
        mono: base,
        wall: UNIX_EPOCH + Duration::from_secs(1_000_000),
    };
    let mut session = Session::new(
        config(),
        rules(vec![("delete_*", Verdict::Deny)]),
        Secrets::default(),
        None,
        false,
        NONCE.into(),
        now,
    );
    assert_eq!(summary(&session.start(now), false), ["start 1"]);
    let init = r#"{"jsonrpc":"2.0","id":1,"method":"initialize","params":{"capabilities":{}}}"#;
    let echo = call(2, "echo", json!({"text": "hi"}));
    let delete = call(3, "delete_all", json!({}));
    for line in [init, &echo, &delete] {
        let out = session.on(Event::Host(Line::Data(line.as_bytes().to_vec())), now);
        assert!(summary(&out, false).is_empty(), "held while starting");
    }
    assert!(summary(&session.on(Event::Host(Line::Eof), now), false).is_empty());
    let up = session.on(
        Event::ServerStarted {
            gen: 1,
            secrets: Secrets::default(),
            facts: Value::Null,
        },
        now,
    );
    // the call's start is committed before it goes, and what was sent
    // after it waits for that
    assert_eq!(
        summary(&up, false),
        s(&[
            "audit SessionStart",
            &format!("server {init}"),
            "commit 0 CallStart echo",
        ])
    );
    let committed = session.on(
        Event::AuditCommitted {
            key: 0,
            result: Ok(()),
        },
        now,
    );
    assert_eq!(
        summary(&committed, false),
        s(&[
            &format!("server {echo}"),
            "audit ToolCall deny tool.rule",
            "host denied tool.rule id=3",
            "close 1",
        ])
    );
}

// ---- the lifecycle's idle stop (park) ------------------------------------------------

#[test]
fn park_is_ignored_while_a_call_is_in_flight() {
    let mut t = T::new(config(), rules(vec![]));
    t.init(json!({}));
    t.host(&call(1, "a", json!({})));
    assert!(t.s.busy());
    assert_eq!(t.on(Event::Park), Vec::<String>::new());
    assert!(!t.s.parked());
}

#[test]
fn parked_server_restarts_on_the_next_call_and_replays_initialize() {
    let mut t = T::new(config(), rules(vec![]));
    t.init(json!({}));
    assert!(!t.s.busy());
    assert_eq!(t.on(Event::Park), ["close 1"]);
    assert_eq!(t.server_dies(0), s(&["audit ServerExit idle.stopped"]));
    assert!(t.s.parked() && !t.s.is_ended());
    // parked: no timer at all, no process to watch
    assert_eq!(t.s.deadline(), None);
    let c2 = call(2, "b", json!({}));
    assert_eq!(t.host(&c2), ["start 2"]);
    let out = t.on(Event::ServerStarted {
        gen: 2,
        secrets: Secrets::default(),
        facts: Value::Null,
    });
    assert_eq!(out.len(), 1);
    assert!(
        out[0].starts_with(
            r#"server {"id":"mcpbox-reinit-n0nce-2","jsonrpc":"2.0","method":"initialize""#
        ),
        "{out:?}"
    );
    let reinit = r#"{"jsonrpc":"2.0","id":"mcpbox-reinit-n0nce-2","result":{"capabilities":{}}}"#;
    assert_eq!(
        t.server(reinit),
        [
            r#"server {"jsonrpc":"2.0","method":"notifications/initialized"}"#.to_string(),
            format!("server {c2}"),
        ]
    );
}

#[test]
fn host_leaving_a_parked_session_ends_it_without_a_server() {
    let mut t = T::new(config(), rules(vec![]));
    t.init(json!({}));
    t.on(Event::Park);
    t.server_dies(0);
    assert_eq!(
        t.on(Event::Host(Line::Eof)),
        s(&[
            "audit ServerExit server.stopped",
            "audit SessionEnd",
            "end HostClosed"
        ])
    );
    assert!(t.s.is_ended());
}

#[test]
fn wake_starts_a_parked_server() {
    let mut t = T::new(config(), rules(vec![]));
    t.init(json!({}));
    t.on(Event::Park);
    t.server_dies(0);
    assert_eq!(t.on(Event::Wake), ["start 2"]);
    // wake of a running server does nothing
    let mut t = T::new(config(), rules(vec![]));
    t.init(json!({}));
    assert_eq!(t.on(Event::Wake), Vec::<String>::new());
}

#[test]
fn exit_checks_of_an_idle_server_back_off_and_a_message_brings_them_back() {
    let mut t = T::new(config(), rules(vec![]));
    t.init(json!({}));
    // each check with nothing in between doubles the wait, up to IDLE_POLL
    let mut waits = Vec::new();
    for _ in 0..8 {
        let wait = t.s.deadline().unwrap() - t.now().mono;
        waits.push(wait.as_millis() as u64);
        t.after(wait.as_millis() as u64);
        assert!(summary(&t.last, true).contains(&"check 1".to_string()));
    }
    assert_eq!(waits, [250, 250, 500, 1000, 2000, 4000, 4000, 4000]);
    // a message from the host: the next check is within EXIT_POLL again
    t.host(&call(1, "a", json!({})));
    let wait = t.s.deadline().unwrap() - t.now().mono;
    assert!(wait <= Duration::from_millis(250), "{wait:?}");
}

/// A server that could not be started (its interpreter missing, say)
/// leaves the host's held request with the reason, not only "stopped".
#[test]
fn a_request_held_for_a_server_that_could_not_start_gets_the_reason() {
    // a restart's start is the one that fails here: stop, then start 2
    let secrets = Secrets(vec![Secret {
        name: "TOKEN".into(),
        value: "old-secret-value-42".into(),
        ttl: Some(Duration::from_secs(1)),
        source: None,
        placeholder: None,
    }]);
    let mut t = T::with(config(), rules(vec![]), secrets, None, false);
    t.after(1_000);
    t.server_dies(0);
    t.host(&call(7, "a", json!({})));
    t.on(Event::ServerStartFailed {
        gen: 2,
        error: "cannot run server.py: its interpreter /opt/venv/bin/python is not in the sandbox"
            .into(),
    });
    let err = t.to_host().remove(0);
    assert_eq!(err["id"], 7);
    assert_eq!(
        err["error"]["message"],
        "mcp server could not be started: cannot run server.py: its interpreter \
         /opt/venv/bin/python is not in the sandbox"
    );
}
