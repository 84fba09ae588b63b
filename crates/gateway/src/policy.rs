//! The relay's view of tool policy and approvals. The policy crate (or the
//! binary) implements [`ToolPolicy`]; the gateway does not depend on it.

use std::time::SystemTime;

/// What to do with a tool call.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Action {
    /// Forward the call.
    Allow,
    /// Refuse the call; it never reaches the server.
    Deny,
    /// Forward only after a human approved this exact call.
    Approve,
}

/// A decision with its machine-readable reason and its source.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Decision {
    /// The action.
    pub action: Action,
    /// Machine-readable reason, e.g. `tool.deny_rule`.
    pub reason: String,
    /// Where the decision came from, e.g. `policy:tools."delete_*"`.
    pub source: String,
}

impl Decision {
    /// Shorthand constructor.
    pub fn new(action: Action, reason: impl Into<String>, source: impl Into<String>) -> Decision {
        Decision {
            action,
            reason: reason.into(),
            source: source.into(),
        }
    }
}

/// Tool annotations as the (untrusted) server declared them. A policy may
/// use them to make a decision stricter, never looser.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct ToolHints {
    /// `annotations.readOnlyHint`.
    pub read_only: Option<bool>,
    /// `annotations.destructiveHint`.
    pub destructive: Option<bool>,
    /// `annotations.idempotentHint`.
    pub idempotent: Option<bool>,
    /// `annotations.openWorldHint`.
    pub open_world: Option<bool>,
}

impl ToolHints {
    /// Reads hints from a tool definition's `annotations`.
    pub fn from_tool(tool: &serde_json::Value) -> ToolHints {
        let a = tool.get("annotations");
        let get = |k: &str| {
            a.and_then(|a| a.get(k))
                .and_then(serde_json::Value::as_bool)
        };
        ToolHints {
            read_only: get("readOnlyHint"),
            destructive: get("destructiveHint"),
            idempotent: get("idempotentHint"),
            open_world: get("openWorldHint"),
        }
    }
}

/// Tool rules. Implemented over the policy crate by the binary.
pub trait ToolPolicy: Send + Sync {
    /// Decides a call to `tool`.
    fn decide(&self, tool: &str, hints: &ToolHints) -> Decision;
    /// Whether `tool` stays in `tools/list` results. Defaults to "not
    /// denied".
    fn visible(&self, tool: &str, hints: &ToolHints) -> bool {
        self.decide(tool, hints).action != Action::Deny
    }
}

/// A policy that allows everything (source `default`).
#[derive(Debug, Clone, Copy, Default)]
pub struct AllowAll;

impl ToolPolicy for AllowAll {
    fn decide(&self, _tool: &str, _hints: &ToolHints) -> Decision {
        Decision::new(Action::Allow, "tool.default_allow", "default")
    }
}

/// One call waiting for a human.
#[derive(Debug, Clone)]
pub struct ApprovalRequest {
    /// Server name from the config.
    pub server: String,
    /// Tool name.
    pub tool: String,
    /// Hex SHA-256 of the canonical JSON of the arguments.
    pub args_digest: String,
    /// When the approval lapses (then it is denied).
    pub expires_at: SystemTime,
    /// The policy decision that asked for approval.
    pub decision: Decision,
}

/// The answer to an approval.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ApprovalAnswer {
    /// Approved: forward this call.
    Approved {
        /// Who approved (e.g. `elicitation`, `console:alice`).
        approver: String,
    },
    /// Refused by the human (reason `approval.declined`).
    Declined,
    /// Nobody answered in time (reason `approval.timeout`).
    Timeout,
    /// No way to ask (reason `approval.required`).
    Unavailable,
}

/// Something that can ask a human about one call. `approve` blocks (it is
/// run on its own thread) and must return by `request.expires_at`.
/// Elicitation through the host is one implementation, built into the
/// relay; a console or CLI approver plugs in through
/// [`crate::Relay::fallback_approver`].
pub trait Approver: Send + Sync {
    /// Asks about one call and waits for the answer.
    fn approve(&self, request: &ApprovalRequest) -> ApprovalAnswer;
}
