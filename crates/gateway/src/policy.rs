//! The relay's view of tool policy and approvals, in the shared decision
//! vocabulary of `mcpbox_policy` ([`Verdict`], [`Decision`], [`Reason`],
//! [`ToolHints`]). The binary implements [`ToolPolicy`] over the policy's
//! `ToolRules`; [`ApprovalWorker`] runs a blocking [`Approver`] for any
//! driver (stdio today, HTTP later).

use std::sync::mpsc::{self, Sender};
use std::sync::Arc;
use std::time::SystemTime;

use mcpbox_policy::{Decision, Reason, ToolHints, Verdict};
use serde_json::Value;

/// Tool rules. Implemented over the policy crate by the binary.
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

/// What the rules over one call's arguments concluded.
#[derive(Debug, Clone)]
pub struct ArgumentCheck {
    /// Their decision.
    pub decision: Decision,
    /// What they found, for the call's audit record (command categories
    /// and program names; never argument values).
    pub detail: Value,
    /// `params._meta` entries the gateway sets on the call it forwards,
    /// replacing what the host sent under those keys.
    pub meta: Vec<(String, Value)>,
    /// The arguments forwarded instead of the host's (its host paths made
    /// the sandbox's); None forwards them as sent. The audit's argument
    /// digest stays the host's.
    pub arguments: Option<Value>,
}

/// A policy that allows everything (source `default`).
#[derive(Debug, Clone, Copy, Default)]
pub struct AllowAll;

impl ToolPolicy for AllowAll {
    fn decide(&self, _tool: &str, _hints: &ToolHints) -> Decision {
        Decision::allow(Reason::ToolDefaultAllow, "default")
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
    /// What the argument rules found (command categories), shown to the
    /// human; Null when none applied.
    pub detail: Value,
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
/// run on the [`ApprovalWorker`]'s thread) and should return by
/// `request.expires_at`; the session denies the call then anyway.
/// Elicitation through the host is built into the session core; a console
/// or CLI approver plugs in through [`crate::Relay::fallback_approver`].
pub trait Approver: Send + Sync {
    /// Asks about one call and waits for the answer.
    fn approve(&self, request: &ApprovalRequest) -> ApprovalAnswer;
}

/// Runs a blocking [`Approver`] on one long-lived thread, so that no driver
/// spawns a thread per approval and none blocks its loop on a human.
/// Requests are asked one at a time, in order (one human at a console
/// answers one question at a time); a request that expired while it waited
/// its turn is answered [`ApprovalAnswer::Timeout`] without being asked.
/// Each answer goes to the callback given at spawn, with the request's key.
pub struct ApprovalWorker {
    tx: Sender<(u64, ApprovalRequest)>,
}

impl ApprovalWorker {
    /// Starts the worker thread. `answered(key, answer)` is called on it.
    pub fn spawn(
        approver: Arc<dyn Approver>,
        answered: impl Fn(u64, ApprovalAnswer) + Send + 'static,
    ) -> std::io::Result<ApprovalWorker> {
        let (tx, rx) = mpsc::channel::<(u64, ApprovalRequest)>();
        std::thread::Builder::new()
            .name("mcpbox-approver".into())
            .spawn(move || {
                for (key, request) in rx {
                    let answer = if SystemTime::now() >= request.expires_at {
                        ApprovalAnswer::Timeout
                    } else {
                        approver.approve(&request)
                    };
                    answered(key, answer);
                }
            })?;
        Ok(ApprovalWorker { tx })
    }

    /// Queues one request; false when the worker is gone.
    pub fn ask(&self, key: u64, request: ApprovalRequest) -> bool {
        self.tx.send((key, request)).is_ok()
    }
}
