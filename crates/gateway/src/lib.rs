//! The mcpbox gateway: a relay for newline-delimited JSON-RPC (MCP over
//! stdio) between a host and one server, enforcing tool policy, approvals,
//! tool pinning, description screening, secret redaction, output limits and
//! the audit log on the way.
//!
//! Two layers (CONVENTIONS.md rule 11):
//!
//! - [`session::Session`], the protocol core: a state machine fed
//!   [`session::Event`]s with the time ([`session::Now`]) that returns
//!   [`session::Effect`]s (write to the host or the server, start, stop,
//!   check or kill the server, write an audit record or the pin file, ask
//!   the approval broker, answer an outside question, end) and says when
//!   to wake it next ([`session::Session::deadline`]). It performs no I/O,
//!   takes no lock, spawns nothing and reads no clock: the driver passes
//!   both clocks with every event ([`session::Now`]; the wall clock only
//!   stamps audit records' `time_ms`, approval expiry and the start of a
//!   call for `files_written`). Messages are parsed
//!   once into typed views ([`message`]); a line that needs no change is
//!   forwarded as the bytes that came in.
//! - Drivers that own a session each and perform its effects. The stdio
//!   driver behind [`Relay`] (one loop on the calling thread that polls the
//!   host's input, the server's stdout and its inbox's eventfd and reads
//!   the lines itself, non-blocking writes to the server's stdin with a
//!   writer thread for what a full pipe will not take, a stderr reader, one
//!   audit writer, one launcher thread); the HTTP gateway attaches the same driver per
//!   session ([`Relay::attach`]: [`HostFeed`] in, [`HostSink`] out).
//!
//! Approvals: every approval is registered with the process's one
//! [`broker::Broker`] ([`Relay::broker`]), where `mcpbox approvals` and the
//! web console see and answer it. With form elicitation (declared at
//! `initialize`, or per request in `_meta` under the 2026-07-28 revision)
//! the session also asks the host with `elicitation/create`; the first
//! answer wins. Without it, [`Config::approval_fallback`] holds the call or
//! refuses it with the approval's id. Either way the call is denied when
//! [`Config::approval_timeout`] passes. No thread per approval.
//!
//! Secret TTL: when the shortest TTL has passed and nothing is in flight or
//! waiting for approval, the server is stopped (stdin closed, then SIGTERM,
//! then SIGKILL, each after [`Config::shutdown_grace`], all timers, no
//! sleep) and started again with fresh values by the driver's launcher
//! thread; the host's `initialize` is replayed. Host messages arriving
//! meanwhile are **held, in order, and sent once the new server answered
//! the replayed `initialize`**; past 1024 messages or 16 MiB a request is
//! answered with [`CODE_SERVER_RESTARTING`] (reason `server.restarting`),
//! which a client may retry. Old secret values stay redacted.
//!
//! Wiring, as `mcpbox run` does it (the sandbox supplies its own
//! [`Launcher`]; [`CommandLauncher`] runs the server unsandboxed):
//!
//! ```no_run
//! use std::sync::Arc;
//! use mcpbox_gateway::{AllowAll, CommandLauncher, Config, Relay, Secrets};
//!
//! struct NoAudit;
//! impl mcpbox_audit::Sink for NoAudit {
//!     fn record(&self, _event: mcpbox_audit::Event) {}
//! }
//!
//! # fn main() -> Result<(), mcpbox_gateway::Error> {
//! let launcher = CommandLauncher::new("npx", ["-y", "@modelcontextprotocol/server-everything"]);
//! let outcome = Relay::new(Config::default(), Box::new(launcher))
//!     .policy(Arc::new(AllowAll))
//!     .secrets(Secrets::from_pairs([("API_TOKEN", "value from the policy's [secrets]")]))
//!     .audit(Arc::new(NoAudit))
//!     .run(Box::new(std::io::stdin()), Box::new(std::io::stdout()))?;
//! std::process::exit(outcome.server_exit.map_or(1, |e| e.status()));
//! # }
//! ```
//!
//! Other threads can ask the host a question through the same elicitation
//! path tool approvals use: [`Relay::host_asker`] gives a cloneable
//! [`HostAsker`] (the egress proxy's network approvals go through it).
//! With [`Config::output_dir`] set, each call's audit record lists the
//! files it wrote there ([`written`]).
//!
//! Error codes the relay itself answers with (outside the JSON-RPC reserved
//! range -32768..=-32000 except where JSON-RPC defines the meaning):
//!
//! | code | meaning |
//! |---|---|
//! | -32700 | host sent invalid JSON |
//! | -32600 | host sent a batch, a non-object, or a line over `max_line` |
//! | -32602 | `tools/call` without a tool name |
//! | [`CODE_POLICY_DENIED`] (-31001) | policy refusal, when `deny_as_error` is set |
//! | [`CODE_SERVER_EXITED`] (-31002) | the server exited with the request in flight |
//! | [`CODE_CALL_TIMEOUT`] (-31003) | the call exceeded `call_timeout` |
//! | [`CODE_RESPONSE_TOO_LARGE`] (-31004) | the server's response line was over `max_line` |
//! | [`CODE_SERVER_RESTARTING`] (-31005) | the server is restarting and too many messages wait for it; retry |
//! | [`CODE_INVALID_RESPONSE`] (-31006) | the server answered with a line that is not valid JSON-RPC (e.g. an object with a duplicate key); the line was dropped |
//!
//! Every error the relay makes carries `data.reason`, a code of the shared
//! catalogue ([`Reason`], `docs/reasons.md`).
#![forbid(unsafe_code)]
#![warn(missing_docs)]
#![cfg_attr(test, allow(clippy::unwrap_used, clippy::expect_used))]

mod asker;
pub mod broker;
pub mod compact;
pub mod diff;
pub mod digest;
pub mod host_command;
pub mod launcher;
pub mod lines;
pub mod message;
pub mod pin;
pub mod pin_review;
pub mod policy;
pub mod redact;
pub mod reserved;
pub mod screen;
pub mod secrets;
pub mod session;
mod stdio;
#[cfg(test)]
mod test_rng;
pub mod touched;
pub mod written;

#[doc(hidden)]
pub mod fuzzing;

use std::path::PathBuf;
use std::time::Duration;

pub use asker::{HostAsker, NetworkAnswer};
pub use launcher::{
    CommandLauncher, ExitInfo, Launcher, ProcessControl, ServerProcess, ServerStdin, ServerStdout,
};
pub use mcpbox_policy::{Decision, Reason, ToolHints, Verdict};
pub use pin::{
    accept_pins, pending_path, pin_list, read_pins, tool_digest, Checked, Kept, PinError, PinStore,
    PinVerdict, PinWrite, Pins,
};
pub use policy::{AllowAll, ApprovalAnswer, ArgumentCheck, ToolPolicy};
pub use secrets::{load_secret, Secret, SecretError, SecretSource, Secrets};
pub use stdio::{
    background_priority, relay, Activity, Attached, FeedError, HostFeed, HostInput, HostSink,
    Relay, StderrHandler,
};

/// Policy refusal as a protocol error (only with [`Config::deny_as_error`];
/// by default a denied call gets a tool result with `isError: true`).
pub const CODE_POLICY_DENIED: i64 = -31001;
/// The server exited while the request was in flight.
pub const CODE_SERVER_EXITED: i64 = -31002;
/// The call exceeded [`Config::call_timeout`].
pub const CODE_CALL_TIMEOUT: i64 = -31003;
/// The server's response was longer than [`Config::max_line`].
pub const CODE_RESPONSE_TOO_LARGE: i64 = -31004;
/// The server is being restarted (secret TTL) and too many messages are
/// already waiting for it; retry the request.
pub const CODE_SERVER_RESTARTING: i64 = -31005;
/// The server's answer to the request was not valid JSON-RPC (invalid
/// JSON, or an object with a duplicate key, which could hide content from
/// screening) and was dropped; the server's fault.
pub const CODE_INVALID_RESPONSE: i64 = -31006;

/// Key under a result's `_meta` that carries mcpbox's decision.
pub const META_DECISION: &str = "mcpbox/decision";

/// Errors that end a relay session.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// The server could not be started (our side or the launcher's).
    #[error("cannot start mcp server {server}: {source}")]
    Launch {
        /// Server name.
        server: String,
        /// Underlying error.
        source: std::io::Error,
    },
    /// The pin file could not be opened.
    #[error(transparent)]
    Pin(#[from] PinError),
    /// A relay thread could not be started.
    #[error("cannot start relay thread: {0}")]
    Thread(std::io::Error),
}

/// The gateway's result alias.
pub type Result<T, E = Error> = std::result::Result<T, E>;

/// The tool calls a relay's server is working on, and who asked, kept up
/// to date by the relay's driver for others to read: the egress proxy puts
/// them in the records of the connections the sandbox opens meanwhile, so
/// a connection is tied to the call that caused it (or to every call in
/// flight when several are).
#[derive(Debug, Default)]
pub struct CallsInFlight {
    state: std::sync::Mutex<(String, Vec<(String, String)>)>,
}

impl CallsInFlight {
    /// The caller and the calls in flight, as (reference, tool).
    pub fn snapshot(&self) -> (String, Vec<(String, String)>) {
        self.state.lock().unwrap_or_else(|e| e.into_inner()).clone()
    }

    pub(crate) fn set(&self, caller: &str, calls: Vec<(String, String)>) {
        let mut s = self.state.lock().unwrap_or_else(|e| e.into_inner());
        s.0.clear();
        s.0.push_str(caller);
        s.1 = calls;
    }
}

/// Relay settings. Defaults are the safe ones.
#[derive(Debug, Clone)]
pub struct Config {
    /// Server name, for audit records and approval prompts.
    pub server_name: String,
    /// Sandbox id, for audit records.
    pub sandbox_id: String,
    /// Workspace id, for audit records.
    pub workspace_id: String,
    /// Caller identity, for audit records (e.g. `stdio`).
    pub caller: String,
    /// Longest accepted line, either direction, in bytes. Longer host lines
    /// get -32600; longer server lines are dropped (an in-flight request
    /// whose id is found gets [`CODE_RESPONSE_TOO_LARGE`]).
    pub max_line: usize,
    /// Largest text content, summed over a tool result's `content`, in
    /// bytes; more is cut at a char boundary with a marker.
    pub max_result: usize,
    /// Per-`tools/call` timeout; `None` waits forever.
    pub call_timeout: Option<Duration>,
    /// How long an approval may wait for a human before it is denied.
    pub approval_timeout: Duration,
    /// What happens to an approval when the host has no elicitation
    /// (`[approvals] fallback`), with a broker ([`Relay::broker`]).
    pub approval_fallback: broker::Fallback,
    /// Whether the host may answer approvals through MCP elicitation
    /// (`[approvals] elicitation`); without it the host is treated as
    /// having none, and only the broker's CLI and console approve.
    pub approval_elicitation: bool,
    /// The policy's digest, to which approvals are bound.
    pub policy_version: String,
    /// A result larger than this (bytes, as the server sent it) waits for
    /// a human (`output.approve_over`).
    pub approve_over: Option<u64>,
    /// A result with credential-shaped strings waits for a human
    /// (`output.approve_credential_shapes`).
    pub approve_credential_shapes: bool,
    /// Grace between closing the server's stdin, SIGTERM and SIGKILL; a
    /// server whose stdin is closed gets it after its last line.
    pub shutdown_grace: Duration,
    /// How long a server whose stdin was closed (the host closed its
    /// input, or the gateway stops) may still take to answer the requests
    /// it has before SIGTERM (the MCP stdio shutdown: close the input,
    /// wait for the exit, then signal).
    pub drain_grace: Duration,
    /// Redact credential-shaped strings in results (they are flagged either way).
    pub redact_credential_shapes: bool,
    /// Where tool pins are kept; `None` disables pinning.
    pub pin_file: Option<PathBuf>,
    /// Accept changed or new tools into the pins instead of withholding them.
    pub accept_pin_changes: bool,
    /// Answer denied calls with a [`CODE_POLICY_DENIED`] protocol error
    /// instead of a tool result with `isError: true`.
    pub deny_as_error: bool,
    /// Host path of the server's output directory (`/workspace/output`
    /// inside the sandbox). When set, each finished `tools/call` is audited
    /// with the regular files in it changed during the call
    /// ([`written::files_written_since`]); `None` records none.
    pub output_dir: Option<PathBuf>,
    /// The host directories behind the sandbox's (input, output, mounts).
    /// When set, the roots a client offers (its answer to the server's
    /// `roots/list`) are translated to the sandbox's paths, and those
    /// under none of them are dropped and flagged (`root.outside`): the
    /// host's paths never reach the server. `None` passes roots as sent.
    pub paths: Option<mcpbox_policy::PathMap>,
    /// What ran, for the `session_start` record's detail: the server's
    /// command or URL, the policy's name and digest, where it runs. Never
    /// a secret (the binary builds it from the policy and argv).
    pub session_detail: serde_json::Value,
    /// Forward calls while the audit log cannot be written (their records
    /// wait in memory): a call's start is then an ordinary record, not
    /// committed before the call goes. The default sends a call only once
    /// its start is committed ([`session::Effect::CommitAudit`]) and
    /// refuses it otherwise (`audit.unavailable`), so that nothing runs
    /// unrecorded.
    pub run_unaudited: bool,
}

impl Default for Config {
    fn default() -> Config {
        Config {
            server_name: "server".to_string(),
            sandbox_id: String::new(),
            workspace_id: String::new(),
            caller: "stdio".to_string(),
            max_line: 16 * 1024 * 1024,
            max_result: 1024 * 1024,
            call_timeout: None,
            approval_timeout: Duration::from_secs(120),
            approval_fallback: broker::Fallback::Refuse,
            approval_elicitation: true,
            policy_version: String::new(),
            approve_over: None,
            approve_credential_shapes: false,
            shutdown_grace: Duration::from_secs(2),
            drain_grace: Duration::from_secs(10),
            redact_credential_shapes: true,
            pin_file: None,
            accept_pin_changes: false,
            deny_as_error: false,
            output_dir: None,
            paths: None,
            session_detail: serde_json::Value::Null,
            run_unaudited: false,
        }
    }
}

/// Why a session ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum EndReason {
    /// The host closed our stdin (normal end).
    HostClosed,
    /// The server exited or closed its stdout on its own.
    ServerExited,
    /// Writing to the host failed (it went away).
    HostGone,
}

/// How a session ended.
#[derive(Debug, Clone)]
pub struct Outcome {
    /// Why it ended.
    pub reason: EndReason,
    /// How the (last) server process ended, if known.
    pub server_exit: Option<ExitInfo>,
    /// Number of times the server was started (1 + TTL restarts).
    pub launches: u32,
}
