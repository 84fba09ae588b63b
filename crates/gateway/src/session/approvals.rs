//! Calls waiting for a human, and questions put to the host.
//!
//! An `approve` call is held here until it is answered. With form
//! elicitation (declared at `initialize`, or in the request's `_meta` in
//! the 2026-07-28 era) the session itself sends `elicitation/create` to the
//! host and reads the answer; otherwise the driver's fallback approver is
//! asked ([`Effect::AskApprover`]) and answers with [`Event::Approval`].
//! Either way the call is denied when `approval_timeout` passes first.
//! Questions from outside ([`Event::Ask`]) use the same elicitation path.
//!
//! The ids of our requests to the host carry the session's nonce, so a
//! server can neither forge an answer nor collect one.
//!
//! [`Event::Approval`]: super::Event::Approval
//! [`Event::Ask`]: super::Event::Ask

use std::collections::HashMap;
use std::time::{Duration, Instant};

use mcpbox_policy::{Decision, Reason};
use serde_json::{json, Value};

use super::{Asked, Effect, Question, Session};
use crate::message::{at, id_key, IdKey, Message};
use crate::policy::{ApprovalAnswer, ApprovalRequest};

/// A call waiting for a human.
/// A decision and what the argument rules found (for the record).
pub(super) struct Decided {
    pub(super) decision: Decision,
    pub(super) detail: Value,
}

struct Waiting {
    raw: Vec<u8>,
    id: Value,
    tool: String,
    args_digest: String,
    /// What the argument rules found, for the call's record.
    detail: Value,
    /// `approval:elicitation` or `approval:fallback`.
    via: &'static str,
    deadline: Instant,
    /// The id of our `elicitation/create`, when asked that way.
    elicit: Option<IdKey>,
}

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

    /// The ids of held calls, for the error answers when the server exits.
    pub(crate) fn drain_ids(&mut self) -> Vec<Value> {
        self.elicits
            .retain(|_, e| !matches!(e.purpose, Purpose::Approval(_)));
        self.waiting.drain().map(|(_, w)| w.id).collect()
    }
}

impl Session {
    /// Holds a call that needs a human and asks one.
    pub(super) fn ask_approval(
        &mut self,
        id: Value,
        tool: String,
        args_digest: String,
        decided: Decided,
        raw: Vec<u8>,
        elicit: bool,
    ) {
        let Decided { decision, detail } = decided;
        let via = if elicit {
            "approval:elicitation"
        } else if self.fallback_approver {
            "approval:fallback"
        } else {
            let d = Decision::deny(Reason::ApprovalRequired, decision.source);
            return self.deny_call(&id, &tool, &args_digest, d, &detail);
        };
        let key = self.approvals.next_key;
        self.approvals.next_key += 1;
        let wait = self.config.approval_timeout;
        let request = ApprovalRequest {
            server: self.config.server_name.clone(),
            tool: tool.clone(),
            args_digest: args_digest.clone(),
            expires_at: self.now.wall + wait,
            decision: decision.clone(),
            detail: detail.clone(),
        };
        let elicit_id = if elicit {
            let (message, schema) = approval_form(&request, wait);
            Some(self.elicit(
                "mcpbox-approval",
                message,
                schema,
                wait,
                Purpose::Approval(key),
            ))
        } else {
            self.out.push(Effect::AskApprover { key, request });
            None
        };
        self.approvals.waiting.insert(
            key,
            Waiting {
                raw,
                id,
                tool,
                args_digest,
                detail,
                via,
                deadline: self.now.mono + wait,
                elicit: elicit_id,
            },
        );
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
                self.approval_answered(k, answer);
            }
        }
        true
    }

    /// Whether `key` is the id of one of our open requests to the host.
    pub(super) fn is_our_question(&self, key: &str) -> bool {
        self.approvals.elicits.contains_key(key) || key.contains(&self.nonce)
    }

    /// The answer for the held call `key` (from elicitation, the fallback
    /// approver or the timeout).
    pub(super) fn approval_answered(&mut self, key: u64, answer: ApprovalAnswer) {
        let Some(w) = self.approvals.waiting.remove(&key) else {
            return; // cancelled, timed out or answered already
        };
        if let Some(e) = &w.elicit {
            self.approvals.elicits.remove(e);
        }
        match answer {
            ApprovalAnswer::Approved { approver } => {
                tracing::info!(server = %self.config.server_name, tool = %w.tool, %approver, "tool call approved");
                let decision =
                    Decision::approve(Reason::ApprovalGranted, format!("{}:{approver}", w.via));
                self.forward_call(w.id, w.tool, w.args_digest, decision, w.detail, w.raw);
            }
            other => {
                let reason = match other {
                    ApprovalAnswer::Declined => Reason::ApprovalDeclined,
                    ApprovalAnswer::Timeout => Reason::ApprovalTimeout,
                    _ => Reason::ApprovalRequired,
                };
                let d = Decision::deny(reason, w.via);
                self.deny_call(&w.id, &w.tool, &w.args_digest, d, &w.detail);
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
        if let Some(w) = self.approvals.waiting.remove(&key) {
            tracing::info!(server = %self.config.server_name, tool = %w.tool, "call waiting for approval cancelled by the host");
            if let Some(e) = &w.elicit {
                self.approvals.elicits.remove(e);
            }
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

    /// The host closed: nobody will answer now. Held calls are dropped
    /// (the host cannot read an answer it will not wait for), outside
    /// questions answered `Unavailable`.
    pub(super) fn drop_questions(&mut self) {
        self.approvals.waiting.clear();
        for (_, e) in self.approvals.elicits.drain() {
            if let Purpose::Ask(ticket) = e.purpose {
                self.out.push(Effect::Answer {
                    ticket,
                    answer: Asked::Unavailable,
                });
            }
        }
    }
}

/// The prompt and form of an approval asked through elicitation.
fn approval_form(request: &ApprovalRequest, wait: Duration) -> (String, Value) {
    let expires_unix = request
        .expires_at
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_secs());
    let mut message = format!(
        "mcpbox: approve one call to tool `{}` on server `{}`?\narguments sha256: {}\npolicy: {} ({})\nexpires: unix time {} (in {}s)",
        request.tool,
        request.server,
        request.args_digest,
        request.decision.reason,
        request.decision.source,
        expires_unix,
        wait.as_secs()
    );
    if let Some(cats) = request.detail.get("categories").and_then(Value::as_array) {
        let cats: Vec<&str> = cats.iter().filter_map(Value::as_str).collect();
        message.push_str(&format!("\ncommand categories: {}", cats.join(", ")));
    }
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
    (message, schema)
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
