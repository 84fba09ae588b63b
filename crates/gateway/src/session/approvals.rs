//! Calls (and results) waiting for a human, and questions put to the host.
//!
//! An `approve` call, or a result over `output.approve_over` or with
//! credential shapes under `output.approve_credential_shapes`, is held
//! here. With a broker (the driver has one: [`Effect::AskApprover`]) every
//! approval is registered there under an id derived from the session's
//! nonce, where `mcpbox approvals` and the console can answer it. With
//! form elicitation (declared at `initialize`, or in the request's `_meta`
//! in the 2026-07-28 era) the session also sends `elicitation/create` to
//! the host; the first answer wins, and the session tells the broker
//! ([`Effect::ApprovalClosed`]). Without elicitation, the broker holds the
//! call (`[approvals] fallback = "hold"`: the host gets a log notification
//! naming the approval) or refuses it at once with the id (`"refuse"`),
//! after which a human's approval lets the same call through once.
//! Either way the call is denied when `approval_timeout` passes first.
//! Questions from outside ([`Event::Ask`]) use the same elicitation path.
//!
//! When an approval arrives, the held call is re-checked before it is
//! sent: still waiting, its time not passed, its tool not withheld by a
//! pin change meanwhile.
//!
//! The ids of our requests to the host carry the session's nonce, so a
//! server can neither forge an answer nor collect one.
//!
//! [`Event::Ask`]: super::Event::Ask

use std::collections::HashMap;
use std::time::{Duration, Instant};

use mcpbox_audit::Kind;
use mcpbox_policy::{Decision, Reason, Source, Verdict};
use serde_json::{json, Map, Value};

use super::calls::Call;
use super::{Asked, Effect, Question, Session};
use crate::broker::{self, Binding, Closed, Fallback, Subject};
use crate::message::{at, id_key, to_line, IdKey, Message};
use crate::policy::ApprovalAnswer;

/// A decision and what the argument rules found (for the record).
pub(super) struct Decided {
    pub(super) decision: Decision,
    pub(super) detail: Value,
}

/// What is held until the answer.
pub(super) enum Hold {
    /// A call, not yet sent to the server: its line.
    Call { raw: Vec<u8> },
    /// A result, not yet sent to the host: the line for the host, and the
    /// call's record, written once the result went out (or was withheld).
    Result {
        line: Vec<u8>,
        call: Box<Call>,
        reason: Reason,
        bytes: u64,
        exit: Option<i32>,
    },
}

struct Waiting {
    hold: Hold,
    id: Value,
    tool: String,
    args_digest: String,
    /// What the argument rules found, for the call's record.
    detail: Value,
    /// The rule that asked.
    decision: Decision,
    /// The approval's id in the broker.
    approval: String,
    deadline: Instant,
    /// The id of our `elicitation/create`, once asked that way.
    elicit: Option<IdKey>,
    /// How the host is asked. A `Form` goes out once the broker holds the
    /// approval ([`Event::ApprovalHeld`]), not before, so that a grant (for
    /// the session, say) never flashes a moot form; an `InputRequired`
    /// form answers the call when the broker refuses it for now.
    ///
    /// [`Event::ApprovalHeld`]: super::Event::ApprovalHeld
    channel: Channel,
    /// What waits, and what the human reads (for a form).
    subject: Subject,
    preview: Value,
}

/// How the host itself can be asked about something held.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Channel {
    /// It cannot (no form elicitation): the broker's CLI and console only.
    None,
    /// `elicitation/create`, a request of ours to the host (2025 revisions).
    Form,
    /// An `InputRequiredResult` in answer to the call, whose form the
    /// host's human answers in the call's retry (2026-07-28, where a
    /// server sends the client no requests). Calls only: a result cannot
    /// be retried without running the call again.
    InputRequired,
}

/// A call answered with an `InputRequiredResult`, until its retry.
struct InputAsk {
    tool: String,
    args_digest: String,
    decision: Decision,
    preview: Value,
    deadline: Instant,
}

/// What a `tools/call` of the stateless revision carried for us.
pub(super) enum Retry {
    /// Nothing of ours (or an answer bound to another call): ask afresh.
    Fresh,
    /// Answered here (declined, lapsed, or the form sent again).
    Handled,
    /// The host's human said yes to `approval` for exactly this call:
    /// `line` is the call without our request state.
    Approved {
        line: Vec<u8>,
        approval: String,
        scope: broker::Scope,
    },
}

/// Forms of `InputRequiredResult`s a session keeps open at once: a host
/// that never retries cannot grow the table past this (the oldest goes).
const MAX_INPUT_ASKS: usize = 64;

/// What an `elicitation/create` of ours was for.
enum Purpose {
    /// The approval with this key.
    Approval(u64),
    /// The outside question with this ticket.
    Ask(u64),
}

struct Elicit {
    purpose: Purpose,
    deadline: Instant,
}

/// Held calls and open questions.
#[derive(Default)]
pub(crate) struct Approvals {
    waiting: HashMap<u64, Waiting>,
    elicits: HashMap<IdKey, Elicit>,
    /// Open `InputRequiredResult` forms, by approval id (the request state).
    inputs: HashMap<String, InputAsk>,
    next_key: u64,
    next_elicit: u64,
}

impl Approvals {
    pub(crate) fn is_empty(&self) -> bool {
        self.waiting.is_empty()
    }

    /// The earliest expiry of a held call or an open question.
    pub(crate) fn deadline(&self) -> Option<Instant> {
        let a = self.waiting.values().map(|w| w.deadline);
        let b = self.elicits.values().map(|e| e.deadline);
        a.chain(b).min()
    }
}

/// Longest string in an approval's preview, in chars.
const PREVIEW_STRING: usize = 240;
/// Items of an array, keys of an object, shown.
const PREVIEW_ITEMS: usize = 24;
/// Nesting shown.
const PREVIEW_DEPTH: usize = 4;
/// The preview's whole size, serialized.
const PREVIEW_BYTES: usize = 4096;

impl Session {
    /// The broker id of this session's approval `key`: derived from the
    /// secret nonce, so no server can predict it.
    fn approval_id(&self, key: u64) -> String {
        let d = crate::digest::sha256_hex(format!("approval:{}:{key}", self.nonce).as_bytes());
        format!("ap-{}", &d[..12])
    }

    /// What the human sees of `arguments`: secrets and credential shapes
    /// redacted, control characters (terminal escapes) made visible,
    /// strings, arrays, objects and depth cut, the whole at most
    /// [`PREVIEW_BYTES`]; plus what the argument rules found.
    pub(super) fn preview(&mut self, arguments: Option<&Value>, detail: &Value) -> Value {
        let redactor = self.redaction.redactor.clone();
        let mut counts = vec![0usize; redactor.names().len()];
        let mut args = arguments.cloned().unwrap_or(Value::Object(Map::new()));
        redactor.redact_json(&mut args, &mut counts);
        crate::redact::walk_strings(&mut args, &mut |s| {
            let hits = crate::redact::find_credentials(s);
            (!hits.is_empty()).then(|| crate::redact::redact_credentials(s, &hits))
        });
        let mut out = json!({"arguments": shrink(&args, 0)});
        if !detail.is_null() {
            out["found"] = shrink(detail, 0);
        }
        if serde_json::to_vec(&out).map_or(0, |v| v.len()) > PREVIEW_BYTES {
            let text = serde_json::to_string(&out["arguments"]).unwrap_or_default();
            out["arguments"] = json!(cut(&text, PREVIEW_BYTES / 2));
            out["cut"] = json!(true);
        }
        out
    }

    /// Holds something that needs a human and asks one. `subject` says
    /// what (a call before the server, a result before the host);
    /// `preview` is what the human reads.
    #[allow(clippy::too_many_arguments)]
    pub(super) fn ask_approval(
        &mut self,
        id: Value,
        tool: String,
        args_digest: String,
        decided: Decided,
        hold: Hold,
        channel: Channel,
        answered: Option<(String, broker::Scope)>,
        subject: Subject,
        preview: Value,
    ) {
        let Decided { decision, detail } = decided;
        if channel == Channel::None && !self.fallback_approver {
            // nobody to ask: no elicitation, no broker
            let d = Decision::deny(Reason::ApprovalRequired, decision.source);
            let w = Waiting {
                hold,
                id,
                tool,
                args_digest,
                detail,
                decision: d.clone(),
                approval: String::new(),
                deadline: self.now.mono,
                elicit: None,
                channel,
                subject,
                preview,
            };
            return self.refuse_waiting(w, d);
        }
        let key = self.approvals.next_key;
        self.approvals.next_key += 1;
        let approval = self.approval_id(key);
        let wait = self.config.approval_timeout;
        // an input-required form is answered in the call's retry: nothing
        // is held meanwhile, whatever the fallback
        let held = match channel {
            Channel::Form => true,
            Channel::InputRequired => false,
            Channel::None => self.config.approval_fallback == Fallback::Hold,
        };
        if self.fallback_approver {
            let ask = broker::Ask {
                id: approval.clone(),
                session: self.tag.clone(),
                sandbox_id: self.config.sandbox_id.clone(),
                binding: Binding {
                    caller: self.template.caller.clone(),
                    server: self.config.server_name.clone(),
                    tool: tool.clone(),
                    args_digest: args_digest.clone(),
                    policy_version: self.config.policy_version.clone(),
                },
                subject: subject.clone(),
                rule: decision.clone(),
                preview: preview.clone(),
                expires: self.now.wall + wait,
                hold: held,
                elicitation: channel != Channel::None,
                answered: answered.clone(),
            };
            self.out.push(Effect::AskApprover { key, ask });
        }
        if channel == Channel::None && held {
            // a call that asked for progress gets it: many hosts keep
            // waiting on a request while it makes progress
            let token = match &hold {
                Hold::Call { raw } => Message::parse(raw).ok().and_then(|m| {
                    m.params()
                        .and_then(|p| at(p, &["_meta", "progressToken"]))
                        .cloned()
                }),
                Hold::Result { .. } => None,
            };
            self.tell_host_it_waits(&approval, &tool, &subject, wait, token);
        }
        self.approvals.waiting.insert(
            key,
            Waiting {
                hold,
                id,
                tool,
                args_digest,
                detail,
                decision,
                approval,
                deadline: self.now.mono + wait,
                elicit: None,
                channel,
                subject,
                preview,
            },
        );
        if !self.fallback_approver {
            // no broker to consult: the host's form is the only channel,
            // and it is asked at once
            match channel {
                Channel::Form => self.approval_held(key),
                Channel::InputRequired => {
                    let answer = match answered {
                        Some(_) => ApprovalAnswer::Approved {
                            approver: "elicitation".into(),
                        },
                        None => ApprovalAnswer::Refused {
                            id: self.approval_id(key),
                        },
                    };
                    self.approval_answered(key, answer);
                }
                Channel::None => {} // refused above
            }
        }
    }

    /// The broker holds approval `key` (or there is no broker): a host
    /// with form elicitation is asked now.
    pub(super) fn approval_held(&mut self, key: u64) {
        let Some(w) = self.approvals.waiting.get(&key) else {
            return; // answered or gone meanwhile
        };
        if w.channel != Channel::Form || w.elicit.is_some() {
            return;
        }
        let wait = w.deadline.saturating_duration_since(self.now.mono);
        let (message, schema) = approval_form(
            &self.config.server_name,
            &w.tool,
            &w.args_digest,
            &w.approval,
            &w.subject,
            &w.decision,
            &w.preview,
            wait,
            self.fallback_approver,
        );
        let id = self.elicit(
            "mcpbox-approval",
            message,
            schema,
            wait,
            Purpose::Approval(key),
        );
        if let Some(w) = self.approvals.waiting.get_mut(&key) {
            w.elicit = Some(id);
        }
    }

    /// Answers a call with an `InputRequiredResult` (2026-07-28) whose one
    /// input request is the approval form, and whose request state is the
    /// approval's id; the host's human answers it and the host retries
    /// the call with the answer ([`Session::input_retry`]).
    fn send_input_required(&mut self, host_id: &Value, approval: String, mut ask: InputAsk) {
        // the same approval asked again keeps its first deadline (the
        // broker's expiry does not move either)
        if let Some(earlier) = self.approvals.inputs.get(&approval) {
            ask.deadline = ask.deadline.min(earlier.deadline);
        }
        let wait = ask.deadline.saturating_duration_since(self.now.mono);
        let (message, schema) = approval_form(
            &self.config.server_name,
            &ask.tool,
            &ask.args_digest,
            &approval,
            &Subject::Call { bytes: None },
            &ask.decision,
            &ask.preview,
            wait,
            self.fallback_approver,
        );
        tracing::info!(server = %self.config.server_name, tool = %ask.tool, %approval, "asking the host's human in an input-required result");
        let mut requests = Map::new();
        requests.insert(
            approval.clone(),
            json!({
                "method": "elicitation/create",
                "params": {"mode": "form", "message": message, "requestedSchema": schema}
            }),
        );
        let mut result = json!({
            "resultType": "input_required",
            "inputRequests": requests,
            "requestState": approval,
            "_meta": {}
        });
        result["_meta"][crate::META_DECISION] = json!({
            "action": "ask",
            "reason": ask.decision.reason.as_str(),
            "source": ask.decision.source,
            "approval": approval,
        });
        self.host_value(&json!({"jsonrpc": "2.0", "id": host_id, "result": result}));
        // bounded: lapsed forms go first, then the oldest
        let now = self.now.mono;
        self.approvals.inputs.retain(|_, a| a.deadline > now);
        while self.approvals.inputs.len() >= MAX_INPUT_ASKS {
            let oldest = self
                .approvals
                .inputs
                .iter()
                .min_by_key(|(_, a)| a.deadline)
                .map(|(k, _)| k.clone());
            match oldest {
                Some(k) => self.approvals.inputs.remove(&k),
                None => break,
            };
        }
        self.approvals.inputs.insert(approval, ask);
    }

    /// A `tools/call` of the stateless revision that a policy rule sends to
    /// a human: if it carries the request state of one of our forms, bound
    /// to this very tool and these arguments, the host's answer in
    /// `inputResponses` decides (once: the form is spent). A state of
    /// another call, or none, asks afresh; a state we never issued is not
    /// ours to read.
    pub(super) fn input_retry(
        &mut self,
        id: &Value,
        tool: &str,
        args_digest: &str,
        line: &[u8],
    ) -> Retry {
        let Ok(mut msg) = Message::parse(line) else {
            return Retry::Fresh;
        };
        let Some(state) = msg
            .params()
            .and_then(|p| p.get("requestState"))
            .and_then(Value::as_str)
            .map(str::to_string)
        else {
            return Retry::Fresh;
        };
        // a yes to call A never passes call B
        let ask = match self.approvals.inputs.remove(&state) {
            Some(a) if a.tool == tool && a.args_digest == args_digest => a,
            Some(a) => {
                self.approvals.inputs.insert(state, a);
                return Retry::Fresh;
            }
            None => return Retry::Fresh,
        };
        let detail = json!({"approval": state});
        if self.now.mono >= ask.deadline {
            let d = Decision::deny(
                Reason::ApprovalTimeout,
                Source::Approval(Some(state.to_string())),
            );
            self.deny_call(id, tool, args_digest, d, &detail);
            return Retry::Handled;
        }
        let response = msg
            .params()
            .and_then(|p| p.get("inputResponses"))
            .and_then(|r| r.get(&state))
            .cloned();
        let Some(response) = response else {
            // The host retried without answering its form. A human may
            // have approved through the CLI or console meanwhile: the
            // broker knows (it grants, or refuses with this same pending
            // approval, whose form goes out again). Without a broker, the
            // same form again.
            if self.fallback_approver {
                self.approvals.inputs.insert(state, ask);
                return Retry::Fresh;
            }
            self.send_input_required(id, state, ask);
            return Retry::Handled;
        };
        let response = json!({ "result": response });
        match elicitation_answer(&response) {
            ApprovalAnswer::Approved { .. } => {
                // the server sees the call, not our round trip
                if let Some(p) = msg.value.get_mut("params").and_then(Value::as_object_mut) {
                    p.remove("requestState");
                    let empty = match p.get_mut("inputResponses").and_then(Value::as_object_mut) {
                        Some(r) => {
                            r.remove(&state);
                            r.is_empty()
                        }
                        None => false,
                    };
                    if empty {
                        p.remove("inputResponses");
                    }
                }
                Retry::Approved {
                    line: to_line(&msg.value),
                    approval: state,
                    scope: elicited_scope(&response, &Subject::Call { bytes: None }),
                }
            }
            _ => {
                if self.fallback_approver {
                    self.out.push(Effect::ApprovalClosed {
                        id: state.clone(),
                        how: Closed::Answered(broker::Answer::Denied {
                            by: "elicitation".into(),
                        }),
                    });
                }
                let d = Decision::deny(
                    Reason::ApprovalDeclined,
                    Source::Approval(Some("elicitation".into())),
                );
                self.deny_call(id, tool, args_digest, d, &detail);
                Retry::Handled
            }
        }
    }

    /// A held call without elicitation: the host (and through it the
    /// human, in most hosts' logs) learns which approval it waits for and
    /// how to give it.
    fn tell_host_it_waits(
        &mut self,
        approval: &str,
        tool: &str,
        subject: &Subject,
        wait: Duration,
        progress_token: Option<Value>,
    ) {
        let what = match subject {
            Subject::Result { .. } => "the result of a call to",
            _ => "a call to",
        };
        let text = format!(
            "mcpbox: {what} tool `{tool}` on server `{}` waits for a human approval ({approval}, for {}s): `{}` or `mcpbox approvals deny {approval}`, or the mcpbox console",
            self.config.server_name,
            wait.as_secs(),
            broker::approve_command(approval)
        );
        tracing::warn!(server = %self.config.server_name, tool, approval, "{text}");
        self.host_value(&json!({
            "jsonrpc": "2.0",
            "method": "notifications/message",
            "params": {"level": "warning", "logger": "mcpbox", "data": text}
        }));
        if let Some(token) = progress_token {
            self.host_value(&json!({
                "jsonrpc": "2.0",
                "method": "notifications/progress",
                "params": {"progressToken": token, "progress": 0, "message": text}
            }));
        }
    }

    /// Sends one `elicitation/create` to the host with an id no server
    /// can guess; returns that id's key.
    fn elicit(
        &mut self,
        prefix: &str,
        message: String,
        schema: Value,
        wait: Duration,
        purpose: Purpose,
    ) -> IdKey {
        let id = Value::String(format!(
            "{prefix}-{}-{}",
            self.nonce, self.approvals.next_elicit
        ));
        self.approvals.next_elicit += 1;
        let request = json!({
            "jsonrpc": "2.0",
            "id": id,
            "method": "elicitation/create",
            "params": {"mode": "form", "message": message, "requestedSchema": schema}
        });
        self.host_value(&request);
        let key = id_key(&id);
        self.approvals.elicits.insert(
            key.clone(),
            Elicit {
                purpose,
                deadline: self.now.mono + wait,
            },
        );
        key
    }

    /// A question from outside the session.
    pub(super) fn ask(&mut self, ticket: u64, q: Question) {
        let unavailable = self.host.closed.is_some()
            || self.host.gone
            || !self.config.approval_elicitation
            || (q.needs_capability && !self.host.last_elicitation);
        if unavailable {
            self.out.push(Effect::Answer {
                ticket,
                answer: Asked::Unavailable,
            });
            return;
        }
        // An outside question quotes what the sandboxed server asked for (a
        // host name, for a network approval): the server chose those bytes,
        // so they are screened for secrets like everything else it sends.
        let redactor = self.redaction.redactor.clone();
        let mut counts = vec![0usize; redactor.names().len()];
        let message = redactor.redact_str(&q.message, &mut counts).into_owned();
        let mut schema = q.schema;
        redactor.redact_json(&mut schema, &mut counts);
        self.audit_redactions(redactor.names(), &counts, None, "question");
        self.elicit(q.prefix, message, schema, q.wait, Purpose::Ask(ticket));
    }

    /// If `key` is one of our open elicitations, takes the host's answer.
    pub(super) fn elicitation_answered(&mut self, key: &str, msg: &Message) -> bool {
        let Some(e) = self.approvals.elicits.remove(key) else {
            return false;
        };
        match e.purpose {
            Purpose::Ask(ticket) => self.out.push(Effect::Answer {
                ticket,
                answer: Asked::Response(msg.value.clone()),
            }),
            Purpose::Approval(k) => {
                let answer = elicitation_answer(&msg.value);
                let subject = self.approvals.waiting.get(&k).map(|w| &w.subject);
                let scope = subject.map_or(broker::Scope::Once, |s| elicited_scope(&msg.value, s));
                let how = match &answer {
                    ApprovalAnswer::Approved { approver } => {
                        Closed::Answered(broker::Answer::Approved {
                            by: approver.clone(),
                            scope,
                        })
                    }
                    _ => Closed::Answered(broker::Answer::Denied {
                        by: "elicitation".into(),
                    }),
                };
                self.close_approval(k, how);
                self.approval_answered(k, answer);
            }
        }
        true
    }

    /// Tells the broker that this session settled approval `key` itself.
    fn close_approval(&mut self, key: u64, how: Closed) {
        if !self.fallback_approver {
            return;
        }
        if let Some(w) = self.approvals.waiting.get(&key) {
            self.out.push(Effect::ApprovalClosed {
                id: w.approval.clone(),
                how,
            });
        }
    }

    /// The answer for the held call or result `key` (from elicitation,
    /// the broker or the timeout).
    pub(super) fn approval_answered(&mut self, key: u64, answer: ApprovalAnswer) {
        let Some(w) = self.approvals.waiting.remove(&key) else {
            return; // cancelled, timed out or answered already
        };
        if let Some(e) = &w.elicit {
            // answered elsewhere first, or expired: the host's form is moot
            if self.approvals.elicits.remove(e).is_some() {
                let why = match answer {
                    ApprovalAnswer::Timeout => "the approval expired",
                    _ => "answered through mcpbox",
                };
                self.host_value(&json!({
                    "jsonrpc": "2.0",
                    "method": "notifications/cancelled",
                    "params": {"requestId": e_value(e), "reason": why}
                }));
            }
        }
        match answer {
            ApprovalAnswer::Approved { approver } => {
                // re-checked before it goes on: its time, and the pins (a
                // tool withheld since it was asked is not the tool the
                // human approved)
                if self.now.mono > w.deadline {
                    let d = Decision::deny(
                        Reason::ApprovalTimeout,
                        Source::Approval(Some(w.approval.to_string())),
                    );
                    return self.refuse_waiting(w, d);
                }
                if let (Hold::Call { .. }, Some(reason)) = (&w.hold, self.pin_refusal(&w.tool)) {
                    let d = Decision::deny(reason, Source::Pin(None));
                    return self.refuse_waiting(w, d);
                }
                tracing::info!(server = %self.config.server_name, tool = %w.tool, %approver, approval = %w.approval, "approved");
                let source = Source::Approval(Some(approver.to_string()));
                let mut detail = w.detail;
                if !w.approval.is_empty() {
                    set_detail(&mut detail, "approval", json!(w.approval));
                }
                match w.hold {
                    Hold::Call { raw } => {
                        let decision = Decision::approve(Reason::ApprovalGranted, source);
                        self.forward_call(w.id, w.tool, w.args_digest, decision, detail, raw);
                    }
                    Hold::Result {
                        line,
                        mut call,
                        reason,
                        bytes,
                        exit,
                    } => {
                        self.send_host(line);
                        set_detail(&mut call.detail, "result_approval", json!(w.approval));
                        set_detail(
                            &mut call.detail,
                            "result_approved_by",
                            json!(source.to_string()),
                        );
                        self.record_call(*call, reason, |e| {
                            e.result_bytes = Some(bytes);
                            e.exit_status = exit;
                        });
                    }
                }
            }
            other => {
                let (reason, source) = match &other {
                    ApprovalAnswer::Declined => (
                        Reason::ApprovalDeclined,
                        Source::Approval(Some("human".into())),
                    ),
                    ApprovalAnswer::Timeout => (
                        Reason::ApprovalTimeout,
                        Source::Approval(Some("timeout".into())),
                    ),
                    // the rule that asked stays the source; the id is in
                    // the detail and the decision's `_meta`
                    ApprovalAnswer::Refused { .. } => {
                        (Reason::ApprovalPending, w.decision.source.clone())
                    }
                    _ => (Reason::ApprovalRequired, w.decision.source.clone()),
                };
                let mut w = w;
                if let ApprovalAnswer::Refused { id } = &other {
                    if w.channel == Channel::InputRequired {
                        // the host's human answers in the call's retry
                        let ask = InputAsk {
                            tool: w.tool,
                            args_digest: w.args_digest,
                            decision: w.decision,
                            preview: w.preview,
                            deadline: w.deadline,
                        };
                        return self.send_input_required(&w.id, id.clone(), ask);
                    }
                    // an earlier approval of this same call may be the one
                    w.approval = id.clone();
                }
                let d = Decision::deny(reason, source);
                self.refuse_waiting(w, d);
            }
        }
    }

    /// Refuses what waited: a call gets the denial, a result is withheld
    /// (the host gets an error result in its place); both are recorded.
    fn refuse_waiting(&mut self, w: Waiting, d: Decision) {
        let mut detail = w.detail;
        if !w.approval.is_empty() {
            set_detail(&mut detail, "approval", json!(w.approval));
            if d.reason == Reason::ApprovalPending {
                set_detail(
                    &mut detail,
                    "approve_command",
                    json!(broker::approve_command(&w.approval)),
                );
                set_detail(
                    &mut detail,
                    "expires_in_s",
                    json!(self.config.approval_timeout.as_secs()),
                );
            }
        }
        match w.hold {
            Hold::Call { .. } => self.deny_call(&w.id, &w.tool, &w.args_digest, d, &detail),
            Hold::Result {
                mut call,
                bytes,
                exit,
                ..
            } => {
                let text = super::calls::deny_text(&self.config.server_name, &w.tool, &d, &detail)
                    .replace("refused the call to", "withheld the result of the call to");
                set_detail(
                    &mut call.detail,
                    "result_withheld",
                    json!(d.reason.as_str()),
                );
                if !w.approval.is_empty() {
                    set_detail(&mut call.detail, "result_approval", json!(w.approval));
                }
                let meta =
                    json!({"action": "withhold", "reason": d.reason.as_str(), "source": d.source});
                let mut result = json!({
                    "content": [{"type": "text", "text": text}],
                    "isError": true,
                    "resultType": "complete",
                    "_meta": {}
                });
                result["_meta"][crate::META_DECISION] = meta;
                self.host_value(&json!({"jsonrpc": "2.0", "id": w.id, "result": result}));
                call.decision = Decision::deny(d.reason, d.source);
                self.record_call(*call, d.reason, |e| {
                    e.result_bytes = Some(bytes);
                    e.exit_status = exit;
                });
            }
        }
    }

    /// `notifications/cancelled` for a held call: forgotten, unanswered
    /// (a cancelled request gets no response). Returns whether it was one.
    pub(super) fn cancel_approval(&mut self, request_key: &str) -> bool {
        let key = self
            .approvals
            .waiting
            .iter()
            .find(|(_, w)| id_key(&w.id) == request_key)
            .map(|(k, _)| *k);
        let Some(key) = key else { return false };
        self.close_approval(key, Closed::Cancelled);
        if let Some(w) = self.approvals.waiting.remove(&key) {
            tracing::info!(server = %self.config.server_name, tool = %w.tool, "call waiting for approval cancelled by the host");
            if let Some(e) = &w.elicit {
                self.approvals.elicits.remove(e);
            }
            let source = Source::Approval(Some("host-cancelled".into()));
            self.record_abandoned(&w, Reason::ApprovalDeclined, &source);
        }
        true
    }

    /// Held calls and open questions past their time.
    pub(super) fn approval_timeouts(&mut self) {
        let now = self.now.mono;
        let late: Vec<u64> = self
            .approvals
            .waiting
            .iter()
            .filter(|(_, w)| w.deadline <= now)
            .map(|(k, _)| *k)
            .collect();
        for key in late {
            self.close_approval(key, Closed::Expired);
            self.approval_answered(key, ApprovalAnswer::Timeout);
        }
        let late: Vec<IdKey> = self
            .approvals
            .elicits
            .iter()
            .filter(|(_, e)| e.deadline <= now)
            .map(|(k, _)| k.clone())
            .collect();
        for key in late {
            if let Some(Elicit {
                purpose: Purpose::Ask(ticket),
                ..
            }) = self.approvals.elicits.remove(&key)
            {
                self.out.push(Effect::Answer {
                    ticket,
                    answer: Asked::Timeout,
                });
            }
        }
    }

    /// The record of something that waited for a human and will never
    /// be answered (the session ended under it, or the host cancelled it).
    fn record_abandoned(&mut self, w: &Waiting, reason: Reason, source: &Source) {
        let mut detail = w.detail.clone();
        set_detail(&mut detail, "approval", json!(w.approval));
        if matches!(w.hold, Hold::Result { .. }) {
            set_detail(&mut detail, "result_withheld", json!(reason.as_str()));
        }
        self.audit(Kind::ToolCall, |e| {
            e.tool = Some(w.tool.clone());
            e.decision = Some(Verdict::Deny);
            e.reason = Some(reason.as_str().to_string());
            e.source = Some(source.to_string());
            e.args_digest = Some(w.args_digest.clone());
            e.detail = detail;
        });
    }

    /// The session is ending under what waits (the host closed or went,
    /// the server is down): each held call or result is abandoned, in
    /// the audit log and in the broker, and its id returned for an error
    /// answer where the host can still read one.
    pub(super) fn abandon_waiting(&mut self) -> Vec<Value> {
        self.approvals
            .elicits
            .retain(|_, e| !matches!(e.purpose, Purpose::Approval(_)));
        let mut keys: Vec<u64> = self.approvals.waiting.keys().copied().collect();
        keys.sort_unstable();
        let mut ids = Vec::new();
        for key in keys {
            self.close_approval(key, Closed::Abandoned);
            if let Some(w) = self.approvals.waiting.remove(&key) {
                tracing::warn!(server = %self.config.server_name, tool = %w.tool, approval = %w.approval, "the session ended while a call waited for approval");
                let source = Source::Approval(Some("session-ended".into()));
                self.record_abandoned(&w, Reason::ApprovalAbandoned, &source);
                ids.push(w.id);
            }
        }
        ids
    }

    /// The host closed: nobody will answer now. Held calls are abandoned
    /// (the host cannot read an answer it will not wait for), outside
    /// questions answered `Unavailable`.
    pub(super) fn drop_questions(&mut self) {
        self.abandon_waiting();
        for (_, e) in self.approvals.elicits.drain() {
            if let Purpose::Ask(ticket) = e.purpose {
                self.out.push(Effect::Answer {
                    ticket,
                    answer: Asked::Unavailable,
                });
            }
        }
    }

    /// After a result was screened: hold it for a human when it is larger
    /// than `output.approve_over` or holds credential shapes under
    /// `output.approve_credential_shapes`. Returns the line back when it
    /// may go to the host now.
    #[allow(clippy::too_many_arguments)]
    pub(super) fn hold_result(
        &mut self,
        id: Value,
        line: Vec<u8>,
        call: Call,
        reason: Reason,
        bytes: u64,
        exit: Option<i32>,
        shapes: Vec<String>,
        channel: Channel,
    ) -> Option<(Vec<u8>, Call)> {
        let over = self.config.approve_over.filter(|max| bytes > *max);
        let shapes = if self.config.approve_credential_shapes {
            shapes
        } else {
            Vec::new()
        };
        if (over.is_none() && shapes.is_empty()) || reason == Reason::CallError {
            return Some((line, call));
        }
        let source = if over.is_some() {
            Source::OutputApproveOver
        } else {
            Source::OutputApproveCredentialShapes
        };
        let decision = Decision::approve(Reason::ResultApproval, source);
        let subject = Subject::Result {
            bytes,
            over,
            credential_shapes: shapes.clone(),
        };
        let preview = json!({
            "result_bytes": bytes,
            "approve_over": over,
            "credential_shapes": shapes,
            "note": "the result itself is not shown here: approving sends it to the agent",
        });
        let decided = Decided {
            decision,
            detail: Value::Null,
        };
        let tool = call.tool.clone();
        let args_digest = call.args_digest.clone();
        let hold = Hold::Result {
            line,
            call: Box::new(call),
            reason,
            bytes,
            exit,
        };
        self.ask_approval(
            id,
            tool,
            args_digest,
            decided,
            hold,
            channel,
            None,
            subject,
            preview,
        );
        None
    }
}

/// Sets `key` in an object detail (a null detail becomes an object).
fn set_detail(detail: &mut Value, key: &str, v: Value) {
    if !detail.is_object() {
        *detail = Value::Object(Map::new());
    }
    if let Some(m) = detail.as_object_mut() {
        m.insert(key.to_string(), v);
    }
}

/// An elicitation's id back from its key (ours are strings).
fn e_value(key: &str) -> Value {
    serde_json::from_str(key).unwrap_or_else(|_| Value::String(key.to_string()))
}

/// `s` cut to at most `max` chars, with a marker.
fn cut(s: &str, max: usize) -> String {
    if s.chars().count() <= max {
        return s.to_string();
    }
    let mut out: String = s.chars().take(max).collect();
    out.push_str(&format!("… ({} bytes)", s.len()));
    out
}

/// A bounded copy of `v` for a human: control, invisible and bidi
/// characters ([`mcpbox_policy::terminal::is_unsafe`]; `\n` and `\t` kept)
/// made visible (`\u{1b}`, `\u{202e}`), long strings and lists cut, deep
/// values elided.
fn shrink(v: &Value, depth: usize) -> Value {
    match v {
        Value::String(s) => {
            let visible: String = s
                .chars()
                .flat_map(|c| {
                    if mcpbox_policy::terminal::is_unsafe(c) && c != '\n' && c != '\t' {
                        c.escape_default().collect::<Vec<_>>()
                    } else {
                        vec![c]
                    }
                })
                .collect();
            Value::String(cut(&visible, PREVIEW_STRING))
        }
        Value::Array(items) if depth >= PREVIEW_DEPTH => json!(format!("[{} items]", items.len())),
        Value::Object(m) if depth >= PREVIEW_DEPTH => json!(format!("{{{} keys}}", m.len())),
        Value::Array(items) => {
            let mut out: Vec<Value> = items
                .iter()
                .take(PREVIEW_ITEMS)
                .map(|x| shrink(x, depth + 1))
                .collect();
            if items.len() > PREVIEW_ITEMS {
                out.push(json!(format!("… {} more", items.len() - PREVIEW_ITEMS)));
            }
            Value::Array(out)
        }
        Value::Object(m) => {
            let mut out = Map::new();
            for (k, x) in m.iter().take(PREVIEW_ITEMS) {
                let k = match shrink(&Value::String(k.clone()), PREVIEW_DEPTH) {
                    Value::String(k) => cut(&k, 64),
                    _ => String::new(),
                };
                out.insert(k, shrink(x, depth + 1));
            }
            if m.len() > PREVIEW_ITEMS {
                out.insert(
                    "…".into(),
                    json!(format!("{} more keys", m.len() - PREVIEW_ITEMS)),
                );
            }
            Value::Object(out)
        }
        other => other.clone(),
    }
}

/// The prompt and form of an approval asked through elicitation.
#[allow(clippy::too_many_arguments)]
fn approval_form(
    server: &str,
    tool: &str,
    args_digest: &str,
    approval: &str,
    subject: &Subject,
    decision: &Decision,
    preview: &Value,
    wait: Duration,
    broker: bool,
) -> (String, Value) {
    let what = match subject {
        Subject::Result { .. } => "send the result of one call",
        _ => "approve one call",
    };
    let shown = serde_json::to_string_pretty(preview).unwrap_or_default();
    let mut message = format!(
        "mcpbox: {what} to tool `{tool}` on server `{server}`?\nrule: {} ({})\n{shown}\narguments sha256: {args_digest}\nexpires in {}s",
        decision.reason,
        decision.source,
        wait.as_secs()
    );
    if broker {
        message.push_str(&format!(
            "\napproval {approval}: also answerable with `{}` or the mcpbox console",
            broker::approve_command(approval)
        ));
    }
    let mut schema = json!({
        "type": "object",
        "properties": {
            "approve": {
                "type": "boolean",
                "title": "Approve",
                "description": "true lets exactly this go ahead once; anything else denies it",
                "default": false
            }
        },
        "required": ["approve"]
    });
    if broker && matches!(subject, Subject::Call { .. }) {
        // session grants live in the broker: without one, nothing to offer
        schema["properties"]["session"] = json!({
            "type": "boolean",
            "title": "For this session",
            "description": format!("with Approve: also allow `{tool}`, with any arguments, for the rest of this session"),
            "default": false
        });
    }
    (message, schema)
}

/// How far an approving elicitation response about `subject` reaches:
/// this call, or with `session: true` the tool for the rest of the
/// session. Only as far as the form offered ([`approval_form`]: for a call
/// only): a host's `session` on a held result's form grants that result
/// alone.
fn elicited_scope(v: &Value, subject: &Subject) -> broker::Scope {
    let asked = at(v, &["result", "content", "session"]) == Some(&Value::Bool(true));
    if asked && matches!(subject, Subject::Call { .. }) {
        broker::Scope::Session
    } else {
        broker::Scope::Once
    }
}

/// Reads an elicitation response: only `accept` with `approve: true` approves.
fn elicitation_answer(v: &Value) -> ApprovalAnswer {
    let accepted = at(v, &["result", "action"]).and_then(Value::as_str) == Some("accept")
        && at(v, &["result", "content", "approve"]) == Some(&Value::Bool(true));
    if accepted {
        ApprovalAnswer::Approved {
            approver: "elicitation".into(),
        }
    } else {
        ApprovalAnswer::Declined
    }
}
