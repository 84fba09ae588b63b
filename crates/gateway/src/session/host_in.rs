//! What the host sends, on its way to the server: lines framed, messages
//! parsed once, notifications and answers passed through, requests decided
//! (tool policy, approvals, the protocol era's rules).

use super::*;
use mcpbox_policy::mcp::code;

impl Session {
    pub(super) fn on_host(&mut self, line: Line) {
        match line {
            Line::Eof => self.host_closed(),
            Line::TooLong { len, .. } | Line::Compacted { len, .. } => {
                tracing::warn!(len, "host line over max_line refused");
                let data = json!({"max_line": self.config.max_line, "reason": Reason::RequestTooLarge.as_str()});
                self.host_error(
                    &Value::Null,
                    code::INVALID_REQUEST,
                    "request too large",
                    Some(data),
                );
            }
            Line::Data(line) => self.host_line(line),
        }
    }

    pub(super) fn host_line(&mut self, line: Vec<u8>) {
        let msg = match Message::parse(&line) {
            Ok(m) => m,
            Err(Invalid::Blank) => return,
            Err(Invalid::Batch) => {
                let data = json!({"reason": Reason::BatchRefused.as_str()});
                return self.host_error(
                    &Value::Null,
                    code::INVALID_REQUEST,
                    "batch requests are not supported",
                    Some(data),
                );
            }
            Err(Invalid::Json) => {
                let data = json!({"reason": Reason::RequestInvalid.as_str()});
                return self.host_error(&Value::Null, code::PARSE_ERROR, "parse error", Some(data));
            }
            Err(Invalid::NotMessage) => {
                let data = json!({"reason": Reason::RequestInvalid.as_str()});
                return self.host_error(
                    &Value::Null,
                    code::INVALID_REQUEST,
                    "invalid request",
                    Some(data),
                );
            }
        };
        // Answers to our own questions are ours, whatever the server does.
        if msg.is_answer() {
            if let Some(id) = msg.id() {
                let key = id_key(id);
                if self.elicitation_answered(&key, &msg) {
                    return;
                }
                if key.contains(&self.nonce) {
                    return; // a late answer to one of our own requests
                }
            }
        }
        // While the server (re)starts, everything else waits its turn.
        if !self.server.is_up() {
            return self.hold(line, &msg);
        }
        self.host_message(line, msg);
    }

    /// Handles one host message while the server is up.
    pub(super) fn host_message(&mut self, line: Vec<u8>, msg: Message) {
        match msg.shape {
            Shape::Request => self.host_request(line, msg),
            Shape::Notification => {
                if msg.method() == Some("notifications/cancelled") {
                    if let Some(rid) = msg.params().and_then(|p| p.get("requestId")) {
                        if self.cancel_approval(&id_key(rid)) {
                            return; // the server never saw that call
                        }
                    }
                }
                self.send_server(line);
            }
            // an answer to a server-to-client request: it went out under
            // our id, and goes back under the server's
            Shape::Response | Shape::Error | Shape::Other => {
                let key = msg.id().map(id_key).unwrap_or_default();
                let Some(ask) = self.server_asks.answered(&key) else {
                    tracing::debug!(server = %self.config.server_name, "host answer to no request of the server dropped");
                    return;
                };
                let mut msg = msg;
                msg.value["id"] = ask.theirs;
                if ask.roots {
                    self.roots_answered(msg);
                } else {
                    self.send_server(to_line(&msg.value));
                }
            }
        }
    }

    pub(super) fn host_request(&mut self, line: Vec<u8>, msg: Message) {
        let Some(id) = msg.id().cloned() else { return };
        let params = msg.params();
        let meta = params.and_then(|p| p.get("_meta"));
        let stateless = meta.is_some_and(|m| m.get(META_PROTOCOL_VERSION).is_some());
        // a host of the stateless revision takes no request of ours
        if stateless {
            self.host.last_elicitation = false;
        } else if let Some(caps) = meta.and_then(|m| m.get(META_CLIENT_CAPS)) {
            self.host.last_elicitation = caps
                .get("elicitation")
                .is_some_and(supports_form_elicitation);
        }
        match msg.method().unwrap_or_default() {
            "initialize" => {
                self.host.elicitation = params
                    .and_then(|p| at(p, &["capabilities", "elicitation"]))
                    .is_some_and(supports_form_elicitation);
                self.host.last_elicitation = self.host.elicitation;
                self.host.initialize_params = params.cloned();
                self.caller_from_client_info(params);
                self.calls.track(id, calls::Pending::Handshake);
                self.send_server(line);
            }
            "server/discover" => {
                self.host.protocol = Some(STATELESS_REVISION.to_string());
                self.calls.track(id, calls::Pending::Handshake);
                self.send_server(line);
            }
            "tools/list" => {
                self.calls.track(id, calls::Pending::ToolsList);
                self.send_server(line);
            }
            "tools/call" => self.tools_call(id, &msg, line),
            _ => {
                self.calls.track(id, calls::Pending::Other);
                self.send_server(line);
            }
        }
    }

    /// How the host can be asked about this request: the request's own
    /// `_meta` capabilities win over the ones declared at `initialize`; a
    /// request of the stateless revision (2026-07-28) takes no request of
    /// ours, so its form comes back as an `InputRequiredResult`. With
    /// `[approvals] elicitation = false`, never the host.
    pub(super) fn channel_for(&self, msg: &Message) -> Channel {
        if !self.config.approval_elicitation {
            // the policy lets only a human outside the host approve
            return Channel::None;
        }
        let meta = msg.params().and_then(|p| p.get("_meta"));
        let stateless = meta.is_some_and(|m| m.get(META_PROTOCOL_VERSION).is_some());
        let form = match meta.and_then(|m| m.get(META_CLIENT_CAPS)) {
            Some(caps) => caps
                .get("elicitation")
                .is_some_and(supports_form_elicitation),
            None => self.host.elicitation && !stateless,
        };
        match (form, stateless) {
            (false, _) => Channel::None,
            (true, false) => Channel::Form,
            (true, true) => Channel::InputRequired,
        }
    }
}

/// Whether an `elicitation` capability covers form mode: `{}` (before
/// modes existed, form was the only one) or an object with `form`.
fn supports_form_elicitation(caps: &Value) -> bool {
    match caps {
        Value::Object(m) => m.is_empty() || m.contains_key("form"),
        _ => false,
    }
}
