//! Fuzzing entry points, for `fuzz/fuzz_targets/*.rs` (cargo-fuzz); not an
//! API. A target is one line:
//!
//! ```ignore
//! libfuzzer_sys::fuzz_target!(|data: &[u8]| mcpbox_gateway::fuzzing::fuzz_session(data));
//! ```

use std::sync::Arc;
use std::time::{Duration, Instant, UNIX_EPOCH};

use mcpbox_policy::{Decision, Reason, ToolHints};
use serde_json::Value;

use crate::launcher::ExitInfo;
use crate::lines::Line;
use crate::policy::{ApprovalAnswer, ToolPolicy};
use crate::secrets::{Secret, Secrets};
use crate::session::{Effect, Event, Now, Question, Session};
use crate::Config;

/// Deny `rm*`, ask for `write*`, allow the rest.
struct FuzzPolicy;

impl ToolPolicy for FuzzPolicy {
    fn decide(&self, tool: &str, hints: &ToolHints) -> Decision {
        if tool.starts_with("rm") || hints.destructive == Some(true) {
            Decision::deny(Reason::ToolRule, "fuzz.rm")
        } else if tool.starts_with("write") {
            Decision::approve(Reason::ToolRule, "fuzz.write")
        } else {
            Decision::allow(Reason::ToolDefault, "fuzz.default")
        }
    }
}

/// Message shapes the fuzzer fills in, so that it reaches the session's
/// deeper states (approvals, restarts) and not only the JSON parser.
/// `@` is replaced by a fuzzed id, `~` by a fuzzed word.
const HOST_TEMPLATES: &[&str] = &[
    r#"{"jsonrpc":"2.0","id":@,"method":"initialize","params":{"capabilities":{"elicitation":{}}}}"#,
    r#"{"jsonrpc":"2.0","id":@,"method":"tools/call","params":{"name":"~","arguments":{"a":"~"}}}"#,
    r#"{"jsonrpc":"2.0","id":@,"method":"tools/call","params":{"name":"write~","_meta":{"io.modelcontextprotocol/clientCapabilities":{"elicitation":{}}}}}"#,
    r#"{"jsonrpc":"2.0","id":@,"method":"tools/call","params":{"name":"write~","requestState":"~","inputResponses":{"~":{"action":"accept","content":{"approve":true}}},"_meta":{"io.modelcontextprotocol/protocolVersion":"2026-07-28","io.modelcontextprotocol/clientCapabilities":{"elicitation":{}}}}}"#,
    r#"{"jsonrpc":"2.0","id":@,"method":"tools/list"}"#,
    r#"{"jsonrpc":"2.0","method":"notifications/cancelled","params":{"requestId":@}}"#,
    r#"{"jsonrpc":"2.0","id":"mcpbox-approval-fuzz-@","result":{"action":"accept","content":{"approve":true}}}"#,
    r#"{"jsonrpc":"2.0","id":"mcpbox-network-fuzz-@","result":{"action":"~"}}"#,
    r#"[{"jsonrpc":"2.0","id":@}]"#,
];
const SERVER_TEMPLATES: &[&str] = &[
    r#"{"jsonrpc":"2.0","id":@,"result":{"content":[{"type":"text","text":"~"},{"type":"text","text":"~"}]}}"#,
    r#"{"jsonrpc":"2.0","id":@,"result":{"tools":[{"name":"~","description":"~","annotations":{"destructiveHint":true}}]}}"#,
    r#"{"jsonrpc":"2.0","id":@,"result":{"instructions":"~"}}"#,
    r#"{"jsonrpc":"2.0","id":@,"error":{"code":-1,"message":"~"}}"#,
    r#"{"jsonrpc":"2.0","id":"mcpbox-reinit-fuzz-@","result":{}}"#,
    r#"{"jsonrpc":"2.0","id":@,"method":"elicitation/create","params":{}}"#,
    r#"{"jsonrpc":"2.0","method":"notifications/message","params":{"data":"~"}}"#,
    r#"{"jsonrpc":"2.0","id":@,"result":{"content":[{"type":"text","text":"~fuzz-secret-value~"}]}}"#,
    r#"{"jsonrpc":"2.0","id":@,"result":{"content":[{"type":"text","text":"~fuzz-secr"},{"type":"text","text":"et-value~"}],"structuredContent":{"~fuzz-secret-value":1}}}"#,
    r#"{"jsonrpc":"2.0","id":@,"error":{"code":-1,"message":"\u0066uzz-secret-value~"}}"#,
    r#"{"jsonrpc":"2.0","id":@,"result":{"content":[{"type":"text","text":"fuzz-secret-value"}]},"result":{}}"#,
];

/// The secret of the fuzzed session.
const SECRET: &str = "fuzz-secret-value";

/// The host never says the secret itself (else the relay's echo of, say, a
/// refused tool's name would look like a leak).
fn scrub(mut line: Vec<u8>) -> Vec<u8> {
    let s = SECRET.as_bytes();
    let mut i = 0;
    while i + s.len() <= line.len() {
        if &line[i..i + s.len()] == s {
            line[i] = b'F';
        }
        i += 1;
    }
    line
}

/// Reads fuzz input as a sequence of operations.
struct Ops<'a>(&'a [u8]);

impl Ops<'_> {
    fn byte(&mut self) -> Option<u8> {
        let (b, rest) = self.0.split_first()?;
        self.0 = rest;
        Some(*b)
    }

    /// A length-prefixed chunk (at most 255 bytes).
    fn chunk(&mut self) -> Vec<u8> {
        let n = usize::from(self.byte().unwrap_or(0)).min(self.0.len());
        let (c, rest) = self.0.split_at(n);
        self.0 = rest;
        c.to_vec()
    }

    fn word(&mut self) -> String {
        // JSON-escaped, so the template stays one object
        let w = String::from_utf8_lossy(&self.chunk()).to_string();
        let quoted = Value::String(w).to_string();
        quoted[1..quoted.len() - 1].to_string()
    }

    fn fill(&mut self, template: &str) -> Vec<u8> {
        let mut out = String::new();
        for c in template.chars() {
            match c {
                '@' => out.push_str(&u32::from(self.byte().unwrap_or(0) % 8).to_string()),
                '~' => out.push_str(&self.word()),
                c => out.push(c),
            }
        }
        out.into_bytes()
    }
}

/// Feeds arbitrary host lines, server lines, exits, restarts, approvals,
/// questions and timer ticks into one [`Session`]. Panics only when the
/// session breaks one of its promises: an effect after the end (other than
/// answering an outsider), a line to the host that is not a JSON object,
/// the secret's value in a line to the host (raw or once decoded; the
/// host's own lines never hold it, so it can only come from the server), or
/// a deadline already past after an event was handled.
pub fn fuzz_session(data: &[u8]) {
    let config = Config {
        call_timeout: Some(Duration::from_millis(700)),
        approval_timeout: Duration::from_millis(900),
        shutdown_grace: Duration::from_millis(50),
        max_result: 64,
        ..Config::default()
    };
    let secrets = Secrets(vec![Secret {
        name: "TOKEN".into(),
        value: SECRET.into(),
        ttl: Some(Duration::from_millis(1500)),
        source: None,
        placeholder: None,
    }]);
    let base = Instant::now();
    let mut ms: u64 = 0;
    let now = |ms: u64| Now {
        mono: base + Duration::from_millis(ms),
        wall: UNIX_EPOCH + Duration::from_millis(ms),
    };
    let mut s = Session::new(
        config,
        Arc::new(FuzzPolicy),
        secrets.clone(),
        None,
        true,
        "fuzz".into(),
        now(0),
    );
    check(&s.start(now(0)), false);
    let mut ops = Ops(data);
    let mut ticket = 0;
    loop {
        let gen = s.server_gen();
        let Some(op) = ops.byte() else { break };
        let event = match op % 16 {
            0 => Event::Host(Line::Data(scrub(ops.chunk()))),
            1 | 2 => {
                let i = usize::from(ops.byte().unwrap_or(0)) % HOST_TEMPLATES.len();
                Event::Host(Line::Data(scrub(ops.fill(HOST_TEMPLATES[i]))))
            }
            3 => Event::Server {
                gen,
                line: Line::Data(ops.chunk()),
            },
            4 | 5 => {
                let i = usize::from(ops.byte().unwrap_or(0)) % SERVER_TEMPLATES.len();
                Event::Server {
                    gen,
                    line: Line::Data(ops.fill(SERVER_TEMPLATES[i])),
                }
            }
            6 => Event::Server {
                gen,
                line: Line::TooLong {
                    len: 1 << 30,
                    prefix: ops.chunk(),
                },
            },
            7 => Event::Server {
                gen,
                line: Line::Compacted {
                    line: ops.chunk(),
                    len: 1 << 30,
                },
            },
            8 => Event::Server {
                gen,
                line: Line::Eof,
            },
            9 => Event::ServerExited {
                gen: gen.saturating_sub(u32::from(ops.byte().unwrap_or(0) % 2)),
                exit: ExitInfo {
                    code: Some(1),
                    signal: None,
                },
            },
            10 => Event::ServerStarted {
                gen,
                secrets: secrets.clone(),
                facts: Value::Null,
            },
            11 => Event::Approval {
                key: u64::from(ops.byte().unwrap_or(0) % 4),
                answer: match ops.byte().unwrap_or(0) % 4 {
                    0 => ApprovalAnswer::Approved {
                        approver: "fuzz".into(),
                    },
                    1 => ApprovalAnswer::Declined,
                    2 => ApprovalAnswer::Refused {
                        id: "ap-00000000000f".into(),
                    },
                    _ => ApprovalAnswer::Timeout,
                },
            },
            12 => {
                ticket += 1;
                Event::Ask {
                    ticket,
                    question: Question {
                        prefix: "mcpbox-network",
                        message: ops.word(),
                        schema: Value::Null,
                        wait: Duration::from_millis(400),
                        needs_capability: ops.byte().unwrap_or(0) % 2 == 0,
                    },
                }
            }
            13 => Event::StderrClosed {
                gen,
                redactions: vec![("TOKEN".into(), 1)],
                // as if the reader had missed it: the core redacts again
                tail: vec![format!("fatal: {SECRET} {}", ops.word())],
            },
            14 => match ops.byte().unwrap_or(0) % 8 {
                0 => Event::Host(Line::Eof),
                1 => Event::HostGone,
                2 | 3 => Event::ApprovalHeld {
                    key: u64::from(ops.byte().unwrap_or(0) % 4),
                },
                // a call's start committed to the audit log, or not
                4 | 5 => Event::AuditCommitted {
                    key: u64::from(ops.byte().unwrap_or(0) % 4),
                    result: match ops.byte().unwrap_or(0) % 2 {
                        0 => Ok(()),
                        _ => Err(mcpbox_audit::Unwritten {
                            cause: mcpbox_audit::Cause::DiskFull,
                            detail: "database or disk is full".into(),
                        }),
                    },
                },
                _ => Event::ServerStartFailed {
                    gen,
                    error: String::new(),
                },
            },
            _ => {
                ms += u64::from(ops.byte().unwrap_or(0)) * 10;
                Event::Timer
            }
        };
        let ended_before = s.is_ended();
        check(&s.on(event, now(ms)), ended_before);
        match s.deadline() {
            None => {}
            // the timers ran with the event: nothing is left overdue, so a
            // driver never spins on a deadline in the past
            Some(d) => assert!(d > now(ms).mono, "a deadline in the past"),
        }
        if s.is_ended() {
            assert!(s.deadline().is_none(), "an ended session has no timers");
        }
    }
}

/// The promises every batch of effects keeps.
fn check(effects: &[Effect], ended_before: bool) {
    for e in effects {
        match e {
            Effect::WriteHost(line) => {
                let v: Result<Value, _> = serde_json::from_slice(line);
                assert!(
                    matches!(v, Ok(Value::Object(_))),
                    "the host got a line that is not a JSON object: {:?}",
                    String::from_utf8_lossy(line)
                );
                assert!(!ended_before, "host output after the end");
                let decoded = v.map(|v| v.to_string()).unwrap_or_default();
                let raw = String::from_utf8_lossy(line);
                assert!(
                    !raw.contains(SECRET) && !decoded.contains(SECRET),
                    "the secret reached the host: {raw}"
                );
            }
            Effect::Answer { .. } => {}
            _ => assert!(!ended_before, "an effect after the end: {e:?}"),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// xorshift64*: deterministic pseudo-random inputs.
    fn inputs(n: usize) -> Vec<Vec<u8>> {
        let mut x: u64 = 0x9E37_79B9_7F4A_7C15;
        let mut next = move || {
            x ^= x >> 12;
            x ^= x << 25;
            x ^= x >> 27;
            x.wrapping_mul(0x2545_F491_4F6C_DD1D)
        };
        (0..n)
            .map(|i| {
                let len = 16 + (next() % (64 + 8 * i as u64)) as usize;
                (0..len).map(|_| (next() >> 56) as u8).collect()
            })
            .collect()
    }

    #[test]
    fn session_survives_pseudo_random_event_streams() {
        for input in inputs(400) {
            fuzz_session(&input);
        }
        fuzz_session(&[]);
        fuzz_session(&[1; 300]);
        fuzz_session(&[15, 255, 15, 255, 15, 255, 8, 9, 0, 15, 255, 13]);
    }
}
