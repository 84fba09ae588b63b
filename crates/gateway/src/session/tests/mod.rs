//! The session core without processes: each test feeds events with a
//! made-up clock and compares the effects, summarised one per line, with a
//! table. Named after the behaviour or attack: `calls.rs` (policy,
//! approvals, protocol eras, pass-through, framing), `output.rs` (redaction,
//! shapes, limits, the tool list), `lifecycle.rs` (timeouts, exits, stops,
//! the TTL restart).

mod calls;
mod lifecycle;
mod output;

use std::sync::Arc;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use mcpbox_policy::{Decision, Reason, ToolHints, Verdict};
use serde_json::{json, Value};

use super::{Asked, Effect, Event, Now, Question, Session};
use crate::launcher::ExitInfo;
use crate::lines::Line;
use crate::pin::PinStore;
use crate::policy::{ApprovalAnswer, ToolPolicy};
use crate::secrets::{Secret, Secrets};
use crate::Config;

/// Rules by name or `prefix*`, first match wins, default allow.
pub(super) struct Rules(Vec<(&'static str, Verdict)>);

impl ToolPolicy for Rules {
    fn decide(&self, tool: &str, _hints: &ToolHints) -> Decision {
        for (pat, verdict) in &self.0 {
            let hit = match pat.strip_suffix('*') {
                Some(p) => tool.starts_with(p),
                None => tool == *pat,
            };
            if hit {
                return Decision::new(*verdict, Reason::ToolRule, format!("tools.\"{pat}\""));
            }
        }
        Decision::allow(Reason::ToolDefault, "tools.default")
    }
}

pub(super) const NONCE: &str = "n0nce";

/// A session under test and its clock.
pub(super) struct T {
    pub(super) s: Session,
    pub(super) base: Instant,
    pub(super) ms: u64,
    /// The effects of the last step, unsummarised.
    pub(super) last: Vec<Effect>,
    /// How the log answers a call's start ([`Effect::CommitAudit`]): at
    /// once, as the driver does, with this result (the commit then shows
    /// in no summary: its record is in `starts`); `None`: the test
    /// answers itself and sees the effect.
    pub(super) commits: Option<Result<(), mcpbox_audit::Unwritten>>,
    /// The start records committed so far by the automatic answer.
    pub(super) starts: Vec<mcpbox_audit::Event>,
}

pub(super) fn config() -> Config {
    Config {
        server_name: "srv".into(),
        shutdown_grace: Duration::from_millis(100),
        approval_timeout: Duration::from_secs(10),
        ..Config::default()
    }
}

pub(super) fn rules(r: Vec<(&'static str, Verdict)>) -> Arc<dyn ToolPolicy> {
    Arc::new(Rules(r))
}

impl T {
    pub(super) fn new(config: Config, policy: Arc<dyn ToolPolicy>) -> T {
        T::with(config, policy, Secrets::default(), None, false)
    }

    pub(super) fn with(
        config: Config,
        policy: Arc<dyn ToolPolicy>,
        secrets: Secrets,
        pins: Option<PinStore>,
        fallback: bool,
    ) -> T {
        let base = Instant::now();
        let now = Now {
            mono: base,
            wall: UNIX_EPOCH + Duration::from_secs(1_000_000),
        };
        let s = Session::new(
            config,
            policy,
            secrets.clone(),
            pins,
            fallback,
            NONCE.into(),
            now,
        );
        let mut t = T {
            s,
            base,
            ms: 0,
            last: Vec::new(),
            commits: Some(Ok(())),
            starts: Vec::new(),
        };
        let start = t.s.start(t.now());
        assert_eq!(summary(&start, false), ["start 1"]);
        let up = t.on(Event::ServerStarted {
            gen: 1,
            secrets,
            facts: Value::Null,
        });
        assert_eq!(up, ["audit SessionStart"]);
        t
    }

    pub(super) fn now(&self) -> Now {
        Now {
            mono: self.base + Duration::from_millis(self.ms),
            wall: UNIX_EPOCH + Duration::from_secs(1_000_000) + Duration::from_millis(self.ms),
        }
    }

    /// Feeds one event; the effects, summarised (server checks left out).
    pub(super) fn on(&mut self, e: Event) -> Vec<String> {
        let now = self.now();
        let mut effects = self.s.on(e, now);
        let Some(result) = self.commits.clone() else {
            self.last = effects;
            return summary(&self.last, false);
        };
        // as the driver does: the effects in order, then the answers to
        // the commits among them
        let mut out = Vec::new();
        loop {
            let mut keys = Vec::new();
            for effect in effects {
                match effect {
                    Effect::CommitAudit { key, event } => {
                        self.starts.push(event);
                        keys.push(key);
                    }
                    other => out.push(other),
                }
            }
            if keys.is_empty() {
                break;
            }
            effects = Vec::new();
            for key in keys {
                let result = result.clone();
                effects.extend(self.s.on(Event::AuditCommitted { key, result }, now));
            }
        }
        self.last = out;
        summary(&self.last, false)
    }

    pub(super) fn host(&mut self, line: &str) -> Vec<String> {
        self.on(Event::Host(Line::Data(line.as_bytes().to_vec())))
    }

    pub(super) fn server(&mut self, line: &str) -> Vec<String> {
        self.on(Event::Server {
            gen: self.s.server_gen(),
            line: Line::Data(line.as_bytes().to_vec()),
        })
    }

    /// Moves the clock and lets the timers run.
    pub(super) fn after(&mut self, ms: u64) -> Vec<String> {
        self.ms += ms;
        self.on(Event::Timer)
    }

    /// The lines written to the host by the last step, parsed.
    pub(super) fn to_host(&self) -> Vec<Value> {
        self.last
            .iter()
            .filter_map(|e| match e {
                Effect::WriteHost(l) => serde_json::from_slice(l).ok(),
                _ => None,
            })
            .collect()
    }

    /// Initializes, declaring `caps`.
    pub(super) fn init(&mut self, caps: Value) {
        let init = json!({"jsonrpc":"2.0","id":0,"method":"initialize","params":{"protocolVersion":"2025-11-25","capabilities":caps}}).to_string();
        assert_eq!(self.host(&init), [format!("server {init}")]);
        let answer = r#"{"jsonrpc":"2.0","id":0,"result":{"protocolVersion":"2025-11-25","capabilities":{}}}"#;
        assert_eq!(self.server(answer), [format!("host {answer}")]);
    }

    /// The server's stdout closes and its process is found exited.
    pub(super) fn server_dies(&mut self, code: i32) -> Vec<String> {
        let gen = self.s.server_gen();
        let mut out = self.on(Event::Server {
            gen,
            line: Line::Eof,
        });
        assert!(
            summary(&self.last, true).contains(&format!("check {gen}")),
            "stdout closed: the exit is looked for at once"
        );
        out.extend(self.on(Event::ServerExited {
            gen,
            exit: ExitInfo {
                code: Some(code),
                signal: None,
            },
        }));
        out
    }
}

pub(super) fn call(id: i64, tool: &str, args: Value) -> String {
    json!({"jsonrpc":"2.0","id":id,"method":"tools/call","params":{"name":tool,"arguments":args}})
        .to_string()
}

pub(super) fn text_result(id: i64, texts: &[&str]) -> String {
    let content: Vec<Value> = texts
        .iter()
        .map(|t| json!({"type":"text","text":t}))
        .collect();
    json!({"jsonrpc":"2.0","id":id,"result":{"content":content}}).to_string()
}

/// One line per effect; `checks` keeps the periodic server checks.
pub(super) fn summary(effects: &[Effect], checks: bool) -> Vec<String> {
    effects
        .iter()
        .filter(|e| checks || !matches!(e, Effect::CheckServer { .. }))
        .map(describe)
        .collect()
}

pub(super) fn describe(e: &Effect) -> String {
    match e {
        Effect::WriteHost(l) => {
            let text = String::from_utf8_lossy(l).to_string();
            let Ok(v) = serde_json::from_slice::<Value>(l) else {
                return format!("host {text}");
            };
            if let Some(err) = v.get("error") {
                let reason = err.pointer("/data/reason").and_then(Value::as_str);
                return format!(
                    "host error {} {} id={}",
                    err["code"],
                    reason.unwrap_or("-"),
                    v["id"]
                );
            }
            if v.pointer("/result/resultType") == Some(&json!("input_required")) {
                let state = v.pointer("/result/requestState").and_then(Value::as_str);
                return format!(
                    "host input-required {} id={}",
                    state.map_or("-", |s| &s[..3]),
                    v["id"]
                );
            }
            if let Some(d) = v.pointer("/result/_meta/mcpbox~1decision") {
                return format!(
                    "host denied {} id={}",
                    d["reason"].as_str().unwrap_or("-"),
                    v["id"]
                );
            }
            if v["method"] == "elicitation/create" {
                return format!("host elicit id={}", v["id"]);
            }
            format!("host {text}")
        }
        Effect::WriteServer { line, .. } => format!("server {}", String::from_utf8_lossy(line)),
        Effect::CloseServerStdin { gen } => format!("close {gen}"),
        Effect::TerminateServer { gen } => format!("term {gen}"),
        Effect::KillServer { gen } => format!("kill {gen}"),
        Effect::CheckServer { gen } => format!("check {gen}"),
        Effect::StartServer { gen, refresh, .. } => {
            format!("start {gen}{}", if *refresh { " refresh" } else { "" })
        }
        Effect::Audit(r) => {
            let e = &r.event;
            let mut s = format!("audit {:?}", e.kind.expect("kind"));
            if let Some(d) = e.decision {
                s.push_str(&format!(" {d:?}").to_lowercase());
            }
            if let Some(r) = &e.reason {
                s.push(' ');
                s.push_str(r);
            }
            s
        }
        Effect::CommitAudit { key, event } => format!(
            "commit {key} {:?} {}",
            event.kind.expect("kind"),
            event.tool.as_deref().unwrap_or("-")
        ),
        Effect::WritePins(w) => format!(
            "pins {}",
            w.path
                .file_name()
                .map_or(String::new(), |n| n.to_string_lossy().into())
        ),
        Effect::AskApprover { key, ask } => format!("approver {key} {}", ask.binding.tool),
        Effect::ApprovalClosed { id, how } => format!("closed {} {how:?}", &id[..3]),
        Effect::CheckArguments { key, tool, .. } => format!("check-arguments {key} {tool}"),
        Effect::Answer { ticket, answer } => match answer {
            Asked::Response(_) => format!("answer {ticket} response"),
            Asked::Unavailable => format!("answer {ticket} unavailable"),
            Asked::Timeout => format!("answer {ticket} timeout"),
        },
        Effect::End(o) => format!("end {:?}", o.reason),
    }
}

pub(super) fn s(v: &[&str]) -> Vec<String> {
    v.iter().map(|x| x.to_string()).collect()
}
