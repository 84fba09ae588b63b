//! The relay's view of tool policy and approvals, in the shared decision
//! vocabulary of `mcpbox_policy` ([`Verdict`], [`Decision`], [`Reason`],
//! [`ToolHints`]). The binary implements [`ToolPolicy`] over the policy's
//! `ToolRules`; approvals go through [`crate::broker::Broker`].

use mcpbox_policy::{Decision, Reason, ToolHints, Verdict};
use serde_json::Value;

/// Tool rules: the relay's view of the one call decision,
/// `mcpbox_policy::CallRules` (the binary implements this trait over it,
/// with its `World`): [`ToolPolicy::decide`] is its first step,
/// [`ToolPolicy::check_arguments`] its second, and the session joins them
/// with `mcpbox_policy::combine`.
pub trait ToolPolicy: Send + Sync {
    /// Decides a call to `tool`.
    fn decide(&self, tool: &str, hints: &ToolHints) -> Decision;
    /// Whether `tool` stays in `tools/list` results. Defaults to "not
    /// denied".
    fn visible(&self, tool: &str, hints: &ToolHints) -> bool {
        self.decide(tool, hints).verdict != Verdict::Deny
    }
    /// Whether this call to `tool`, with these arguments, has argument
    /// rules to run: then the session holds the call and asks its driver
    /// to run [`ToolPolicy::check_arguments`]
    /// ([`crate::session::Effect::CheckArguments`]), which may do I/O (the
    /// binary parses a command line in a child process and measures an
    /// artifact on disk); the session core itself does none. Must be pure
    /// and quick, and true whenever `check_arguments` could find anything.
    fn checks_arguments(&self, _tool: &str, _arguments: Option<&Value>) -> bool {
        false
    }
    /// Rules over a call's arguments (a command line's categories, a path
    /// outside the workspace); None when none apply to `tool`. The session
    /// takes the stricter of this and [`ToolPolicy::decide`]. Called by the
    /// driver, off the session core, for a tool [`ToolPolicy::checks_arguments`]
    /// names.
    fn check_arguments(&self, _tool: &str, _arguments: Option<&Value>) -> Option<ArgumentCheck> {
        None
    }
}

/// What the rules over one call's arguments concluded: the policy
/// crate's [`mcpbox_policy::CallDecision`] (its decision, the audit
/// detail, the `_meta` entries and rewritten arguments the gateway
/// forwards, and what a human's approval covers).
pub type ArgumentCheck = mcpbox_policy::CallDecision;

/// A policy that allows everything (source `default`).
#[derive(Debug, Clone, Copy, Default)]
pub struct AllowAll;

impl ToolPolicy for AllowAll {
    fn decide(&self, _tool: &str, _hints: &ToolHints) -> Decision {
        Decision::allow(Reason::ToolDefaultAllow, mcpbox_policy::Source::NoPolicy)
    }
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
    /// Refused for now with the approval's id: the host has no
    /// elicitation and `[approvals] fallback = "refuse"` (reason
    /// `approval.pending`); once a human approves `id`, the same call
    /// passes once.
    Refused {
        /// The pending approval.
        id: String,
    },
}
