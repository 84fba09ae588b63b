//! Requests in flight: the host's requests the server has not answered yet,
//! `tools/call` decisions, call timeouts, and the server's answers on their
//! way back.

use mcpbox_policy::mcp::code;
use std::collections::HashMap;
use std::time::{Instant, SystemTime, UNIX_EPOCH};

use mcpbox_audit::Kind;
use mcpbox_policy::{Decision, Reason, Source, Verdict};
use serde_json::{json, Map, Value};

use super::approvals::{Channel, Retry};
use super::{ms, Effect, Record, Session};
use crate::digest::json_digest;
use crate::lines::Line;
use crate::message::{at, id_key, is_plain, sniff_id, to_line, IdKey, Invalid, Message};
use crate::redact::Redacted;
use crate::{
    CODE_CALL_TIMEOUT, CODE_INVALID_RESPONSE, CODE_POLICY_DENIED, CODE_RESPONSE_TOO_LARGE,
    CODE_SERVER_EXITED, META_DECISION,
};

/// Margin subtracted from a call's wall-clock start for `files_written`:
/// file times come from the kernel's coarse clock, which lags the precise
/// one by up to a tick (10 ms at HZ=100). Listing a file written just
/// before the call is the lesser error.
const COARSE_CLOCK_MARGIN: std::time::Duration = std::time::Duration::from_millis(20);

/// A decided (or, held while the driver runs its argument rules, still to
/// be decided) `tools/call`.
pub(crate) struct Held {
    id: Value,
    tool: String,
    args_digest: String,
    /// The tool's own decision, then the stricter of it and the rules'.
    decision: Decision,
    /// What the argument rules found, for the record.
    detail: Value,
    line: Vec<u8>,
    /// How the host can be asked, should the call need a human.
    channel: Channel,
    /// What the argument rules measured (an export's bytes): a human's
    /// approval is bound to it.
    measured: Option<u64>,
}

/// An allowed call waiting for its start record to be committed.
pub(crate) struct Starting {
    id: Value,
    call_ref: String,
    tool: String,
    args_digest: String,
    decision: Decision,
    detail: Value,
    line: Vec<u8>,
}

/// What an in-flight host request was, for handling its response.
pub(crate) enum Pending {
    ToolsCall(Call),
    ToolsList,
    Handshake,
    Other,
}

/// A forwarded tool call, until it ends.
pub(crate) struct Call {
    /// This call among the session's (`call-N`): in its record's
    /// `detail.call`, and in the records of the connections its sandbox
    /// opened meanwhile (`detail.calls`).
    pub(crate) call_ref: String,
    pub(crate) tool: String,
    pub(crate) args_digest: String,
    pub(crate) started: Instant,
    /// Wall-clock start, for `files_written` (None without an output dir).
    pub(crate) since: Option<SystemTime>,
    pub(crate) deadline: Option<Instant>,
    pub(crate) decision: Decision,
    /// What the argument rules found (command categories), for the audit.
    pub(crate) detail: Value,
}

pub(crate) struct InFlight {
    pub(crate) id: Value,
    pub(crate) pending: Pending,
}

/// The host's requests the server has not answered.
#[derive(Default)]
pub(crate) struct Calls {
    inflight: HashMap<IdKey, InFlight>,
    /// Moves whenever the set of tool calls in flight may have changed.
    gen: u64,
    /// The last call number given out.
    numbered: u64,
}

impl Calls {
    pub(crate) fn track(&mut self, id: Value, pending: Pending) {
        self.gen += 1;
        self.inflight.insert(id_key(&id), InFlight { id, pending });
    }

    pub(crate) fn gen(&self) -> u64 {
        self.gen
    }

    /// The next call's reference.
    fn next_ref(&mut self) -> String {
        self.numbered += 1;
        format!("call-{}", self.numbered)
    }

    /// The tool calls in flight, as (reference, tool), oldest first.
    pub(crate) fn tool_calls(&self) -> Vec<(String, String)> {
        let mut calls: Vec<(&Instant, &Call)> = self
            .inflight
            .values()
            .filter_map(|f| match &f.pending {
                Pending::ToolsCall(c) => Some((&c.started, c)),
                _ => None,
            })
            .collect();
        calls.sort_by_key(|(t, _)| **t);
        calls
            .into_iter()
            .map(|(_, c)| (c.call_ref.clone(), c.tool.clone()))
            .collect()
    }

    pub(crate) fn is_empty(&self) -> bool {
        self.inflight.is_empty()
    }

    pub(crate) fn take(&mut self, key: &str) -> Option<InFlight> {
        self.gen += 1;
        self.inflight.remove(key)
    }

    pub(crate) fn drain(&mut self) -> Vec<InFlight> {
        self.gen += 1;
        self.inflight.drain().map(|(_, f)| f).collect()
    }

    /// The earliest call timeout.
    pub(crate) fn deadline(&self) -> Option<Instant> {
        self.inflight
            .values()
            .filter_map(|f| match &f.pending {
                Pending::ToolsCall(c) => c.deadline,
                _ => None,
            })
            .min()
    }

    fn expired(&mut self, now: Instant) -> Vec<(Value, Call)> {
        let keys: Vec<IdKey> = self
            .inflight
            .iter()
            .filter(|(_, f)| {
                matches!(&f.pending, Pending::ToolsCall(Call { deadline: Some(t), .. }) if *t <= now)
            })
            .map(|(k, _)| k.clone())
            .collect();
        keys.into_iter()
            .filter_map(|k| {
                self.gen += 1;
                self.inflight.remove(&k)
            })
            .filter_map(|f| match f.pending {
                Pending::ToolsCall(c) => Some((f.id, c)),
                _ => None,
            })
            .collect()
    }
}

impl Session {
    /// A `tools/call` from the host: pinning, then policy, then maybe a
    /// human, then the server.
    pub(super) fn tools_call(&mut self, id: Value, msg: &Message, line: Vec<u8>) {
        let Some(tool) = msg
            .params()
            .and_then(|p| p.get("name"))
            .and_then(Value::as_str)
            .map(str::to_string)
        else {
            let data = json!({"reason": Reason::RequestNoTool.as_str()});
            return self.host_error(
                &id,
                code::INVALID_PARAMS,
                "tools/call without a tool name",
                Some(data),
            );
        };
        let args_digest = match msg.params().and_then(|p| p.get("arguments")) {
            Some(args) => json_digest(args),
            None => json_digest(&Value::Object(Map::new())),
        };
        // a name no rule can be written for safely: never sent
        if !super::tools::valid_tool_name(&tool) {
            let decision = Decision::deny(Reason::ToolNameInvalid, Source::Relay);
            return self.deny_call(&id, &tool, &args_digest, decision, &Value::Null);
        }
        // pinning first: a withheld tool is not the tool the policy knows
        if let Some(reason) = self.pin_refusal(&tool) {
            let source = Source::Pin(Some(
                self.config
                    .pin_file
                    .as_ref()
                    .map_or(String::new(), |p| p.display().to_string()),
            ));
            let decision = Decision::deny(reason, source);
            return self.deny_call(&id, &tool, &args_digest, decision, &Value::Null);
        }
        let hints = self.tools.hints(&tool);
        let held = Held {
            decision: self.decide(&tool, &hints),
            channel: self.channel_for(msg),
            id,
            tool,
            args_digest,
            detail: Value::Null,
            line,
            measured: None,
        };
        let arguments = msg.params().and_then(|p| p.get("arguments"));
        if held.decision.verdict == Verdict::Deny
            || !self.policy.checks_arguments(&held.tool, arguments)
        {
            return self.decided(held);
        }
        // the driver runs the argument rules (they may do I/O) and answers
        // with Event::ArgumentsChecked; the call waits here, with its
        // message for the `_meta` the rules may set
        let key = self.next_check;
        self.next_check += 1;
        self.out.push(Effect::CheckArguments {
            key,
            tool: held.tool.clone(),
            arguments: arguments.cloned(),
        });
        self.checking.insert(key, (held, msg.value.clone()));
    }

    /// The argument rules' answer for held call `key`: the stricter of
    /// the tool's decision and theirs wins (the tool's on a tie).
    pub(super) fn arguments_checked(&mut self, key: u64, check: Option<crate::ArgumentCheck>) {
        let Some((mut h, mut message)) = self.checking.remove(&key) else {
            return;
        };
        if let Some(check) = check {
            // the call decision's last step (mcpbox_policy::call): the
            // stricter of the tool's and the arguments', the tool's on a tie
            let check = mcpbox_policy::combine(h.decision.clone(), Some(check));
            h.decision = check.decision;
            h.detail = check.detail;
            h.measured = check.measured;
            let mut rewritten = false;
            if let Some(args) = check.arguments {
                if let Some(p) = message.get_mut("params").and_then(Value::as_object_mut) {
                    p.insert("arguments".into(), args);
                    rewritten = true;
                }
            }
            if rewritten || !check.meta.is_empty() {
                h.line = with_meta(&message, &check.meta);
            }
        }
        self.decided(h);
        self.stop_if_host_done();
    }

    /// Acts on a call's final decision.
    fn decided(&mut self, h: Held) {
        match h.decision.verdict {
            Verdict::Allow => {
                self.forward_call(h.id, h.tool, h.args_digest, h.decision, h.detail, h.line)
            }
            Verdict::Deny => self.deny_call(&h.id, &h.tool, &h.args_digest, h.decision, &h.detail),
            Verdict::Approve => {
                let mut line = h.line;
                let mut answered = None;
                if h.channel == Channel::InputRequired {
                    // the retry of a call we answered with a form: the
                    // host's answer rides in the request
                    match self.input_retry(&h.id, &h.tool, &h.args_digest, &line) {
                        Retry::Handled => return,
                        Retry::Approved {
                            line: l,
                            approval,
                            scope,
                        } => {
                            line = l;
                            answered = Some((approval, scope));
                        }
                        Retry::Fresh => {}
                    }
                }
                let arguments = Message::parse(&line)
                    .ok()
                    .and_then(|m| m.params().and_then(|p| p.get("arguments")).cloned());
                let preview = self.preview(arguments.as_ref(), &h.detail);
                let decided = super::approvals::Decided {
                    decision: h.decision,
                    detail: h.detail,
                };
                let hold = super::approvals::Hold::Call { raw: line };
                self.ask_approval(
                    h.id,
                    h.tool,
                    h.args_digest,
                    decided,
                    hold,
                    h.channel,
                    answered,
                    crate::broker::Subject::Call { bytes: h.measured },
                    preview,
                );
            }
        }
    }

    /// Sends an allowed call on, its start first: nothing runs unrecorded.
    /// The call's start record ([`Kind::CallStart`]: its decision) must
    /// be committed to the log before the call reaches the server, so the
    /// call waits here for [`Event::AuditCommitted`] and goes on only
    /// then (`audit_committed`); a log that cannot take it refuses the
    /// call, with the cause. Under `[audit] on_failure = "continue"` the
    /// start is an ordinary record (queued while the log fails) and the
    /// call goes on at once.
    ///
    /// [`Event::AuditCommitted`]: super::Event::AuditCommitted
    pub(super) fn forward_call(
        &mut self,
        id: Value,
        tool: String,
        args_digest: String,
        decision: Decision,
        detail: Value,
        line: Vec<u8>,
    ) {
        let s = Starting {
            id,
            call_ref: self.calls.next_ref(),
            tool,
            args_digest,
            decision,
            detail,
            line,
        };
        let start = self.audit_event(Kind::CallStart, |e| {
            e.tool = Some(s.tool.clone());
            e.decision = Some(s.decision.verdict);
            e.reason = Some(s.decision.reason.as_str().to_string());
            e.source = Some(s.decision.source.to_string());
            e.args_digest = Some(s.args_digest.clone());
            let mut detail = match &s.detail {
                Value::Object(m) => m.clone(),
                _ => Map::new(),
            };
            detail.insert("call".into(), Value::String(s.call_ref.clone()));
            detail.insert("session".into(), Value::String(self.tag.clone()));
            e.detail = Value::Object(detail);
        });
        if self.config.run_unaudited {
            self.out.push(Effect::Audit(Record {
                event: start,
                files_since: None,
                files: None,
            }));
            return self.send_call(s);
        }
        let key = self.next_commit;
        self.next_commit += 1;
        self.out.push(Effect::CommitAudit { key, event: start });
        self.starting.insert(key, s);
    }

    /// The log's answer for the start of call `key`: committed, the call
    /// goes to the server; not, it is refused (`audit.unavailable`, the
    /// cause in its message and record) and the server never sees it.
    pub(super) fn audit_committed(
        &mut self,
        key: u64,
        result: Result<(), mcpbox_audit::Unwritten>,
    ) {
        let Some(s) = self.starting.remove(&key) else {
            return;
        };
        match result {
            Ok(()) => {
                self.audit_health(true);
                self.send_call(s);
            }
            Err(why) => {
                self.audit_health(false);
                tracing::error!(server = %self.config.server_name, tool = %s.tool, "call refused: its start could not be written to the audit log ({why})");
                let mut detail = match s.detail {
                    Value::Object(m) => m,
                    _ => Map::new(),
                };
                detail.insert("audit_error".into(), Value::String(why.to_string()));
                let decision = Decision::deny(Reason::AuditUnavailable, Source::Audit);
                self.deny_call(
                    &s.id,
                    &s.tool,
                    &s.args_digest,
                    decision,
                    &Value::Object(detail),
                );
            }
        }
        if self.server.has_held() && self.starting.is_empty() {
            // held messages after the call, whose release it stopped
            self.release_held();
        } else {
            self.stop_if_host_done();
        }
    }

    /// Sends a call whose start is recorded to the server and starts its
    /// clock.
    fn send_call(&mut self, s: Starting) {
        let now = self.now.mono;
        let since = self.config.output_dir.is_some().then(|| {
            self.now
                .wall
                .checked_sub(COARSE_CLOCK_MARGIN)
                .unwrap_or(UNIX_EPOCH)
        });
        let call = Call {
            call_ref: s.call_ref,
            tool: s.tool,
            args_digest: s.args_digest,
            started: now,
            since,
            deadline: self.config.call_timeout.map(|t| now + t),
            decision: s.decision,
            detail: s.detail,
        };
        if self.server.writable().is_none() {
            // the server went down while the start was being written (a
            // driver that answers later than at once): the call never
            // reaches it, and its record says so
            let data = json!({"reason": Reason::ServerStopped.as_str()});
            self.record_call(call, Reason::ServerStopped, |_| {});
            return self.host_error(&s.id, CODE_SERVER_EXITED, "mcp server stopped", Some(data));
        }
        self.calls.track(s.id, Pending::ToolsCall(call));
        self.send_server(s.line);
    }

    /// Refuses a call: one audit record, one answer, nothing to the server.
    pub(super) fn deny_call(
        &mut self,
        id: &Value,
        tool: &str,
        args_digest: &str,
        d: Decision,
        detail: &Value,
    ) {
        tracing::info!(server = %self.config.server_name, tool, reason = d.reason.as_str(), source = %d.source, "tool call denied");
        self.audit(Kind::ToolCall, |e| {
            e.tool = Some(tool.to_string());
            e.decision = Some(mcpbox_policy::Verdict::Deny);
            e.reason = Some(d.reason.as_str().to_string());
            e.source = Some(d.source.to_string());
            e.args_digest = Some(args_digest.to_string());
            if !detail.is_null() {
                e.detail = detail.clone();
            }
        });
        let mut meta = json!({"action": "deny", "reason": d.reason.as_str(), "source": d.source});
        if let Some(a) = detail.get("approval").filter(|a| !a.is_null()) {
            // a client (or a script) can read which approval to ask for
            meta["approval"] = a.clone();
        }
        let text = deny_text(&self.config.server_name, tool, &d, detail);
        if self.config.deny_as_error {
            self.host_error(id, CODE_POLICY_DENIED, &text, Some(meta));
        } else {
            // `resultType` is required of a result in the 2026-07-28
            // revision (a client of that era rejects a result without it)
            // and is an ignored extra field before it
            let mut result = json!({
                "content": [{"type": "text", "text": text}],
                "isError": true,
                "resultType": "complete",
                "_meta": {}
            });
            result["_meta"][META_DECISION] = meta;
            self.host_value(&json!({"jsonrpc": "2.0", "id": id, "result": result}));
        }
    }

    /// Queues the audit record of a call that ended: the tool, how it was
    /// decided, how it ended (`reason`), its duration, what `fill` adds.
    pub(super) fn record_call(
        &mut self,
        call: Call,
        reason: Reason,
        fill: impl FnOnce(&mut mcpbox_audit::Event),
    ) {
        let duration = self.now.mono.saturating_duration_since(call.started);
        let since = call.since;
        let e = self.audit_event(Kind::ToolCall, |e| {
            e.tool = Some(call.tool);
            e.decision = Some(call.decision.verdict);
            e.reason = Some(reason.as_str().to_string());
            e.source = Some(call.decision.source.to_string());
            e.args_digest = Some(call.args_digest);
            e.duration_ms = Some(ms(duration));
            let mut detail = match call.detail {
                Value::Object(m) => m,
                _ => Map::new(),
            };
            detail.insert("call".into(), Value::String(call.call_ref));
            // the pair its `call_start` names too
            detail.insert("session".into(), Value::String(self.tag.clone()));
            e.detail = Value::Object(detail);
            fill(e);
        });
        self.out.push(Effect::Audit(Record {
            event: e,
            files_since: since,
            files: None,
        }));
    }

    /// Calls past their timeout: the server is told to stop, the host gets
    /// [`CODE_CALL_TIMEOUT`].
    pub(super) fn call_timeouts(&mut self) {
        for (id, call) in self.calls.expired(self.now.mono) {
            let cancel = json!({"jsonrpc": "2.0", "method": "notifications/cancelled",
                "params": {"requestId": id, "reason": "mcpbox: call timed out"}});
            self.send_server(to_line(&cancel));
            self.record_call(call, Reason::CallTimeout, |_| {});
            let limit = self.config.call_timeout.unwrap_or_default();
            let data = json!({"reason": Reason::CallTimeout.as_str()});
            self.host_error(
                &id,
                CODE_CALL_TIMEOUT,
                &format!("tool call timed out after {limit:?}"),
                Some(data),
            );
        }
    }

    // ---- server -> host ---------------------------------------------

    /// One line from the current server's stdout.
    pub(super) fn on_server(&mut self, line: Line) {
        match line {
            Line::Eof => self.stdout_closed(),
            Line::TooLong { len, prefix } => self.server_too_long(len, &prefix),
            Line::Data(line) => self.server_line(line, None),
            Line::Compacted { line, len } => {
                tracing::warn!(server = %self.config.server_name, len, "server line over max_line: long strings cut");
                self.flag(None, Reason::ServerLineCompacted, Source::Relay);
                self.server_line(line, Some(len));
            }
        }
    }

    fn server_too_long(&mut self, len: usize, prefix: &[u8]) {
        tracing::warn!(server = %self.config.server_name, len, "server line over max_line dropped");
        self.flag(None, Reason::ServerLineTooLong, Source::Relay);
        let Some(f) = sniff_id(prefix).and_then(|key| self.calls.take(&key)) else {
            return;
        };
        if let Pending::ToolsCall(call) = f.pending {
            self.record_call(call, Reason::ResultTooLarge, |e| {
                e.result_bytes = Some(len as u64);
            });
        }
        let msg = format!(
            "mcp server response too large ({len} bytes, limit {})",
            self.config.max_line
        );
        let data = json!({"reason": Reason::ResultTooLarge.as_str()});
        self.host_error(&f.id, CODE_RESPONSE_TOO_LARGE, &msg, Some(data));
    }

    /// A server line that is not valid JSON-RPC is never forwarded; when it
    /// names a request in flight (found as `server_too_long` finds it),
    /// that request gets an error now instead of waiting for an answer
    /// that will not come. A line with a duplicate key lands here: its
    /// parsed value would not hold every byte the host would be sent.
    fn answer_invalid(&mut self, line: &[u8]) {
        let Some(f) = sniff_id(line).and_then(|key| self.calls.take(&key)) else {
            return;
        };
        if let Pending::ToolsCall(call) = f.pending {
            self.record_call(call, Reason::ServerInvalidJson, |e| {
                e.result_bytes = Some(line.len() as u64);
            });
        }
        let data = json!({"reason": Reason::ServerInvalidJson.as_str()});
        self.host_error(
            &f.id,
            CODE_INVALID_RESPONSE,
            "mcp server sent an invalid response (not a JSON-RPC object, or a duplicate key); dropped",
            Some(data),
        );
    }

    /// Handles one line from the server; `original_len` is set when the
    /// line was compacted from a longer one. Unchanged lines go to the host
    /// as they came.
    fn server_line(&mut self, line: Vec<u8>, original_len: Option<usize>) {
        let mut msg = match Message::parse(&line) {
            Ok(m) => m,
            Err(Invalid::Blank) => return,
            Err(_) => {
                tracing::warn!(server = %self.config.server_name, len = line.len(), "server wrote a non-json-rpc line to stdout; dropped");
                self.flag(None, Reason::ServerInvalidJson, Source::Relay);
                return self.answer_invalid(&line);
            }
        };
        // mcpbox's own `_meta` names are its word to the host: whatever a
        // server put under them goes, before anything of ours is added
        let mut changed = self.strip_reserved_meta(&mut msg.value, &line);
        if original_len.is_some() {
            changed |= self.strip_cut_secrets(&mut msg.value);
        }
        let plain = (original_len.is_none() && is_plain(&line)).then_some(line.as_slice());
        let mut tool = None;
        // a finished call's record, written once the response is out
        let mut finished: Option<(Call, Reason, u64, Option<i32>)> = None;
        // the credential shapes found in a result, by kind
        let mut shapes: Vec<String> = Vec::new();
        // the host's id on an answer to its request: the host chose it, so
        // it is put back after redaction, whatever the digits
        let mut host_id: Option<Value> = None;
        if msg.is_answer() {
            let key = msg.id().map(id_key).unwrap_or_default();
            if self.reinit_answered(&key) {
                return;
            }
            let Some(f) = self.calls.take(&key) else {
                tracing::warn!(server = %self.config.server_name, "server response to no pending request dropped");
                return;
            };
            host_id = Some(f.id.clone());
            match f.pending {
                Pending::ToolsList => changed |= self.screen_tool_list(&mut msg.value),
                Pending::Handshake => {
                    if let Some(v) =
                        at(&msg.value, &["result", "protocolVersion"]).and_then(Value::as_str)
                    {
                        self.host.protocol = Some(v.chars().take(32).collect());
                    }
                    changed |= self.screen_instructions(&mut msg.value)
                }
                Pending::ToolsCall(call) => {
                    let (screened, found) = self.screen_result(&mut msg.value, &call.tool, plain);
                    changed |= screened;
                    shapes = found;
                    let v = &msg.value;
                    let is_error = v.get("error").is_some()
                        || at(v, &["result", "isError"]) == Some(&Value::Bool(true));
                    let reason = if is_error {
                        Reason::CallError
                    } else {
                        call.decision.reason
                    };
                    let bytes = original_len.unwrap_or(line.len()) as u64;
                    // a command tool's exit status (the argument rules
                    // applied to it), as its result says
                    let exit = (!call.detail.is_null())
                        .then(|| at(v, &["result", "structuredContent", "exit_code"]))
                        .flatten()
                        .and_then(Value::as_i64)
                        .and_then(|c| i32::try_from(c).ok());
                    tool = Some(call.tool.clone());
                    finished = Some((call, reason, bytes, exit));
                }
                Pending::Other => {}
            }
        } else if let Some(theirs) = msg.id().cloned() {
            // A server-to-client request goes to the host under an id of
            // ours: the server's id is the server's text (it could carry a
            // secret's digits, or an id of one of mcpbox's own questions),
            // and the host's answer must come back to us to be mapped.
            let (ours, forgot) =
                self.server_asks
                    .ask(theirs, msg.method(), self.config.paths.is_some());
            if forgot {
                tracing::warn!(server = %self.config.server_name, "too many server requests unanswered by the host; the oldest forgotten");
                self.flag(None, Reason::ServerRequestLimit, Source::Relay);
            }
            mcpbox_policy::mcp::set_id(&mut msg.value, ours);
            changed = true;
        } else if msg.method() == Some("notifications/cancelled") {
            // the server cancels one of its requests: by our id, as the
            // host knows it
            let rid = msg.value.pointer("/params/requestId").cloned();
            if let Some(ours) = rid.and_then(|r| self.server_asks.ours_for(&r)) {
                mcpbox_policy::mcp::set_cancelled_request(&mut msg.value, ours);
                changed = true;
            }
        }
        match self.redact_secrets(&mut msg.value, &line, tool.as_deref()) {
            Redacted::Unchanged => {}
            Redacted::Changed => changed = true,
            Redacted::Refused => return self.refuse_unredactable(msg, host_id, finished),
        }
        if let Some(id) = host_id {
            msg.value["id"] = id;
        }
        let line = if changed { to_line(&msg.value) } else { line };
        // a result a human must see first (output.approve_over,
        // output.approve_credential_shapes) waits, its record with it
        let finished = match finished {
            Some((call, reason, bytes, exit)) => {
                let id = msg.id().cloned().unwrap_or(Value::Null);
                // a result's form can only be a request of ours: a host of
                // the stateless revision answers through the broker
                let channel = if self.host.last_elicitation && self.config.approval_elicitation {
                    Channel::Form
                } else {
                    Channel::None
                };
                match self.hold_result(id, line, call, reason, bytes, exit, shapes, channel) {
                    Some((line, call)) => {
                        self.send_host(line);
                        Some((call, reason, bytes, exit))
                    }
                    None => None,
                }
            }
            None => {
                self.send_host(line);
                None
            }
        };
        if let Some((call, reason, bytes, exit)) = finished {
            self.record_call(call, reason, |e| {
                e.result_bytes = Some(bytes);
                e.exit_status = exit;
            });
        }
    }
}

impl Session {
    /// A server message that holds a secret the relay cannot cut out
    /// ([`Redacted::Refused`]): never forwarded. An answer to the host's
    /// request becomes an error (its call recorded so); a server request
    /// is answered with an error, so the server does not wait; anything
    /// else is dropped.
    fn refuse_unredactable(
        &mut self,
        msg: Message,
        host_id: Option<Value>,
        finished: Option<(Call, Reason, u64, Option<i32>)>,
    ) {
        tracing::warn!(server = %self.config.server_name, "server message with a secret in a number's digits refused");
        self.flag(None, Reason::RedactionRefused, Source::Relay);
        if let Some((call, _, bytes, _)) = finished {
            self.record_call(call, Reason::RedactionRefused, |e| {
                e.result_bytes = Some(bytes);
            });
        }
        let data = json!({"reason": Reason::RedactionRefused.as_str()});
        if let Some(id) = host_id {
            return self.host_error(
                &id,
                CODE_INVALID_RESPONSE,
                "mcp server answered with a secret in a number mcpbox cannot redact; refused",
                Some(data),
            );
        }
        if msg.shape == crate::message::Shape::Request {
            // its id is ours by now: the server's own goes back to it
            let ours = msg.id().cloned().unwrap_or(Value::Null);
            if let Some(theirs) = self.server_asks.answered(&id_key(&ours)) {
                let line = crate::message::error_line(
                    &theirs.theirs,
                    code::INTERNAL_ERROR,
                    "mcpbox refused this request: it holds a secret it cannot redact",
                    Some(data),
                );
                self.send_server(line);
            }
        }
    }
}

/// Most requests of the server waiting for the host's answer; past it the
/// oldest is forgotten (the host's late answer to it is dropped, never sent
/// on unmapped), so a host that leaves some unanswered cannot stop the
/// server's later requests.
pub(crate) const SERVER_ASKS: usize = 256;

/// A request of the server on its way to the host, under an id of ours.
pub(crate) struct ServerAsk {
    /// Our id's key (what the host answers).
    ours: IdKey,
    /// Our id.
    ours_id: Value,
    /// The server's id (what its answer must carry).
    pub(crate) theirs: Value,
    /// A `roots/list` whose answer is translated ([`Config::paths`]).
    pub(crate) roots: bool,
}

/// The server's requests the host has yet to answer, oldest first, at most
/// [`SERVER_ASKS`]; ours are `mcpbox-s` and a counter, distinct from the
/// ids of mcpbox's own questions (which carry the session's nonce).
#[derive(Default)]
pub(crate) struct ServerAsks {
    open: std::collections::VecDeque<ServerAsk>,
    next: u64,
}

impl ServerAsks {
    /// Our id for the server's request `theirs`, and whether the oldest
    /// open request was forgotten to make room. `translate_roots`: a
    /// `roots/list` answer will be translated.
    fn ask(&mut self, theirs: Value, method: Option<&str>, translate_roots: bool) -> (Value, bool) {
        let forgot = self.open.len() >= SERVER_ASKS;
        if forgot {
            self.open.pop_front();
        }
        self.next += 1;
        let ours_id = Value::String(format!("mcpbox-s{}", self.next));
        self.open.push_back(ServerAsk {
            ours: id_key(&ours_id),
            ours_id: ours_id.clone(),
            theirs,
            roots: translate_roots && method == Some("roots/list"),
        });
        (ours_id, forgot)
    }

    /// Forgets every open request (a new server generation asked none of
    /// them); ids are never reused.
    pub(crate) fn clear(&mut self) {
        self.open.clear();
    }

    /// Our id for the server's id `theirs`, if that request is open.
    fn ours_for(&self, theirs: &Value) -> Option<Value> {
        self.open
            .iter()
            .find(|a| a.theirs == *theirs)
            .map(|a| a.ours_id.clone())
    }

    /// The request the host answered (`ours`: the answer's id key), closed.
    pub(crate) fn answered(&mut self, ours: &str) -> Option<ServerAsk> {
        let at = self.open.iter().position(|a| a.ours == ours)?;
        self.open.remove(at)
    }
}

/// The text a model reads when a call is refused.
pub(super) fn deny_text(server: &str, tool: &str, d: &Decision, detail: &Value) -> String {
    if d.reason == Reason::ApprovalPending {
        let id = detail
            .get("approval")
            .and_then(Value::as_str)
            .unwrap_or("?");
        let secs = detail
            .get("expires_in_s")
            .and_then(Value::as_u64)
            .unwrap_or(0);
        return format!(
            "mcpbox held back the call to tool `{tool}` on server `{server}`: it needs a human approval, and this host cannot ask for one (no MCP elicitation). Approval {id} is pending: ask the user to run `mcpbox approvals approve {id}` (or to approve it in the mcpbox console) within {secs}s, then retry this exact call with the same arguments; it will pass once. (reason: {}, source: {})",
            d.reason, d.source
        );
    }
    let why = match d.reason {
        Reason::ApprovalRequired => "this tool needs a human approval for each call, and no approval channel is available (the host did not declare elicitation support). Ask the user to run it or to change the policy",
        Reason::ApprovalDeclined => "the human approver declined this call",
        Reason::ApprovalTimeout => "nobody approved this call in time",
        Reason::ApprovalAbandoned => "the session ended while the call waited for a human",
        Reason::ResultApproval => "the result needs a human approval",
        Reason::PinChanged => "the tool's definition changed since it was pinned; it stays blocked until the change is reviewed (`mcpbox pin accept`)",
        Reason::PinNew => "this tool appeared after the tool list was pinned; it stays blocked until it is reviewed (`mcpbox pin accept`)",
        Reason::CommandCategory | Reason::CommandProgram | Reason::CommandDefault => "the policy's [commands] rules do not allow this command line",
        Reason::CommandUnparsed => "the command line could not be read as shell syntax (or names its program by an expansion), so its commands cannot be checked; write it plainly",
        Reason::ArgumentPathOutside => "a path argument points outside /workspace",
        Reason::ArgumentInvalid => "an argument the policy checks has the wrong type",
        Reason::ToolNameInvalid => "the tool's name has characters outside those MCP allows (a look-alike of another name); it is withheld",
        Reason::AuditUnavailable => {
            let cause = detail
                .get("audit_error")
                .and_then(Value::as_str)
                .unwrap_or("a full disk, a locked or broken database");
            return format!(
                "mcpbox refused the call to tool `{tool}` on server `{server}`: the audit log cannot be written ({cause}), and the policy refuses to run calls unrecorded; try again once it is fixed (reason: {}, source: {})",
                d.reason, d.source
            );
        }
        Reason::ArtifactRefused => "the file may not leave the sandbox as an artifact (not a regular file, or not matched by artifacts.patterns)",
        _ => "the policy does not allow this tool",
    };
    format!(
        "mcpbox refused the call to tool `{tool}` on server `{server}`: {why} (reason: {}, source: {})",
        d.reason, d.source
    )
}

/// The call's line with `meta` set in `params._meta`, replacing whatever
/// the host put under those keys: they are the gateway's word to the
/// server, and a host must not be able to speak it.
fn with_meta(msg: &Value, meta: &[(String, Value)]) -> Vec<u8> {
    let mut v = msg.clone();
    if let Some(params) = v.get_mut("params").and_then(Value::as_object_mut) {
        let m = params
            .entry("_meta")
            .or_insert_with(|| Value::Object(Map::new()));
        if !m.is_object() {
            *m = Value::Object(Map::new());
        }
        if let Some(m) = m.as_object_mut() {
            for (k, val) in meta {
                m.insert(k.clone(), val.clone());
            }
        }
    }
    to_line(&v)
}
