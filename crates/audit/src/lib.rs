//! The mcpbox audit log: one structured record per event, stored so that a
//! crash loses no committed record, and readable back with filters.
//!
//! This file fixes the record shape that the gateway and the egress proxy
//! emit; the stores behind [`Sink`] live in their own modules:
//!
//! - [`SqliteStore`]: the default, an embedded SQLite database with a
//!   tamper-evident hash chain ([`SqliteStore::verify`]) and filters
//!   ([`SqliteStore::query`]).
//! - [`JsonlStore`]: an append-only JSON Lines file, one `fsync` per record.
//! - [`MemorySink`]: a vector, for the tests of other crates.
//!
//! The CLI helpers ([`parse_time`], [`format_table`], [`to_json_line`]) only
//! build strings: the binary decides what reaches the terminal.
//!
//! Architecture invariant: there is no column and no field for raw tool
//! arguments, results, prompts, file contents or secret values. Only digests,
//! sizes and names are stored.
#![forbid(unsafe_code)]

mod anchor;
pub use anchor::{HeadKey, Signature};
mod canonical;
pub use canonical::canonical_json;
mod error;
mod format;
mod group;
mod jsonl;
mod memory;
mod ocsf;
pub use ocsf::{to_ocsf, OCSF_VERSION};
mod pending;
mod query;
mod sqlite;
mod time;

use std::sync::Arc;

use serde::{Deserialize, Serialize};

pub use error::{Cause, Error, Result, Unwritten};
pub use format::{format_table, to_json_line};
pub use jsonl::JsonlStore;
pub use memory::MemorySink;
pub use query::Query;
pub use sqlite::{Pruned, Record, SqliteStore, VerifyReport, SCHEMA_VERSION};
pub use time::{format_time, now_ms, parse_time};

/// What happened. Kept as a short, stable, lowercase string in the store.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Kind {
    /// A host connected and a session with a server began.
    SessionStart,
    /// A session ended (host closed, server exited, teardown).
    SessionEnd,
    /// A `tools/call`, with its decision and how it ended (written when
    /// it ended, or when it was refused).
    ToolCall,
    /// A `tools/list` answer passed to the host.
    ToolList,
    /// A pinned tool definition changed (a possible rug pull) or was accepted.
    PinChange,
    /// A secret value (or one of its encodings) was redacted.
    Redaction,
    /// Something suspicious was flagged (hidden instructions, token-shaped output).
    Flag,
    /// The server process exited.
    ServerExit,
    /// An egress connection through the proxy, allowed or denied.
    Network,
    /// A request to the HTTP gateway refused before it reached a session
    /// (a wrong token, another client's session id, a server the client
    /// may not use).
    Access,
    /// A sandbox changed state (created, paused, resumed, stopped, restored,
    /// snapshotted, destroyed, cleaned up after a crash); `detail.action`
    /// says which, a teardown's `detail.left` what it found left.
    Lifecycle,
    /// A file copied out of a sandbox's output (`detail`: path, size,
    /// sha256), or refused (`reason`).
    Artifact,
    /// Old records were removed by the retention the policy asks for
    /// (`detail`: records, through_seq, older_than_ms, max_bytes).
    Retention,
    /// Something waited for a human (a call, a result, a connection):
    /// `detail.action` is requested, approved, denied, expired, abandoned,
    /// cancelled or used (a grant consumed by the retried call), with the
    /// approval's id and what it was bound to (never the arguments).
    Approval,
    /// A `tools/call` about to go to the server: its decision, committed
    /// to the log before the call is forwarded (the relay refuses a call
    /// whose start cannot be written). `detail.call` and `detail.session`
    /// name it; the call's `tool_call` record, written when it ends, names
    /// the same pair.
    CallStart,
}

impl Kind {
    /// Every kind, in declaration order.
    pub const ALL: [Kind; 15] = [
        Kind::SessionStart,
        Kind::SessionEnd,
        Kind::ToolCall,
        Kind::ToolList,
        Kind::PinChange,
        Kind::Redaction,
        Kind::Flag,
        Kind::ServerExit,
        Kind::Network,
        Kind::Access,
        Kind::Lifecycle,
        Kind::Artifact,
        Kind::Retention,
        Kind::Approval,
        Kind::CallStart,
    ];

    /// The stable string stored in the database and printed by the CLI.
    pub fn as_str(self) -> &'static str {
        match self {
            Kind::SessionStart => "session_start",
            Kind::SessionEnd => "session_end",
            Kind::ToolCall => "tool_call",
            Kind::ToolList => "tool_list",
            Kind::PinChange => "pin_change",
            Kind::Redaction => "redaction",
            Kind::Flag => "flag",
            Kind::ServerExit => "server_exit",
            Kind::Network => "network",
            Kind::Access => "access",
            Kind::Lifecycle => "lifecycle",
            Kind::Artifact => "artifact",
            Kind::Retention => "retention",
            Kind::Approval => "approval",
            Kind::CallStart => "call_start",
        }
    }
}

impl std::fmt::Display for Kind {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

impl std::str::FromStr for Kind {
    type Err = Error;

    fn from_str(s: &str) -> Result<Self> {
        Kind::ALL
            .into_iter()
            .find(|k| k.as_str() == s)
            .ok_or_else(|| Error::UnknownValue {
                what: "kind",
                value: s.to_owned(),
            })
    }
}

/// When a record counts as written (see [`SqliteStore::open_with`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Durability {
    /// In the write-ahead log: survives a crash of the process.
    #[default]
    Process,
    /// Flushed to disk: survives a crash of the machine.
    Machine,
}

/// The decision attached to an event: the one vocabulary of
/// `mcpbox-policy` ([`Verdict`], stored as `allow`, `approve` or `deny`).
pub use mcpbox_policy::{Decision, Reason, Verdict};

/// One audit record. Never raw arguments, results, file contents or secret
/// values: only digests, sizes and names.
///
/// Adding a field later: make it an `Option` (or skip it when it holds its
/// default) with `#[serde(default)]`, so that records written before it keep
/// their hash (the chain hashes the record without its null fields).
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct Event {
    /// Unix time in milliseconds; filled by the store when zero.
    pub time_ms: i64,
    /// What happened.
    pub kind: Option<Kind>,
    /// The sandbox the event belongs to.
    pub sandbox_id: String,
    /// The workspace the sandbox uses.
    pub workspace_id: String,
    /// The MCP server's name, as the policy or config names it.
    pub server: String,
    /// Who asked: the agent or host identity the gateway authenticated.
    pub caller: String,
    /// The tool, for tool events.
    pub tool: Option<String>,
    /// The verdict, when a decision was taken.
    pub decision: Option<Verdict>,
    /// Machine-readable reason code from the catalogue ([`Reason`]), e.g.
    /// `tool.rule`. A string, so that records of older versions still read.
    pub reason: Option<String>,
    /// Where the decision came from, e.g. `policy:tools."delete_*"`.
    pub source: Option<String>,
    /// Hex SHA-256 of the canonical JSON of the arguments.
    pub args_digest: Option<String>,
    /// Size of the result in bytes (after redaction and truncation).
    pub result_bytes: Option<u64>,
    /// Exit status of the server or command, for exit events.
    pub exit_status: Option<i32>,
    /// How long the call took, in milliseconds.
    pub duration_ms: Option<u64>,
    /// Paths (relative to /workspace/output) written during the call.
    pub files_written: Vec<String>,
    /// Free-form structured detail (pin digests, network host/port, ...).
    /// Must never hold secrets, arguments or results.
    pub detail: serde_json::Value,
}

/// Anything that takes audit events. The gateway and the egress proxy write
/// through this; the binary decides which store is behind it.
pub trait Sink: Send + Sync {
    /// Records one event durably before returning.
    fn record(&self, event: Event);

    /// Records `events`, in order, durably before returning, as that many
    /// `record` calls would. A store may write them together (the SQLite
    /// store: one transaction, a fraction of the cost of one each); the
    /// default records each in turn.
    fn record_all(&self, events: Vec<Event>) {
        for e in events {
            self.record(e);
        }
    }

    /// Whether every record handed over so far is written: false while
    /// some wait in memory after a failed write (a full disk, a locked or
    /// broken database). The relay refuses calls meanwhile rather than run
    /// them unrecorded. A sink that cannot fail says true.
    fn healthy(&self) -> bool {
        true
    }

    /// Writes `event` now, after every record queued before it, and
    /// returns only once it is committed, or with why it could not be.
    /// On an error nothing of `event` is written and it is not kept: the
    /// caller decides (the relay refuses the call the record was for, or,
    /// where the policy runs calls unaudited, hands it to
    /// [`Sink::record`]). The relay calls this for a call's start before
    /// the call goes to the server. A sink that cannot fail keeps this
    /// default, which is [`Sink::record`].
    fn commit(&self, event: Event) -> std::result::Result<(), Unwritten> {
        self.record(event);
        Ok(())
    }
}

impl<S: Sink + ?Sized> Sink for Arc<S> {
    fn record(&self, event: Event) {
        (**self).record(event)
    }
    fn record_all(&self, events: Vec<Event>) {
        (**self).record_all(events)
    }
    fn healthy(&self) -> bool {
        (**self).healthy()
    }
    fn commit(&self, event: Event) -> std::result::Result<(), Unwritten> {
        (**self).commit(event)
    }
}

impl<S: Sink + ?Sized> Sink for Box<S> {
    fn record(&self, event: Event) {
        (**self).record(event)
    }
    fn record_all(&self, events: Vec<Event>) {
        (**self).record_all(events)
    }
    fn healthy(&self) -> bool {
        (**self).healthy()
    }
    fn commit(&self, event: Event) -> std::result::Result<(), Unwritten> {
        (**self).commit(event)
    }
}

impl<S: Sink + ?Sized> Sink for &S {
    fn record(&self, event: Event) {
        (**self).record(event)
    }
    fn record_all(&self, events: Vec<Event>) {
        (**self).record_all(events)
    }
    fn healthy(&self) -> bool {
        (**self).healthy()
    }
    fn commit(&self, event: Event) -> std::result::Result<(), Unwritten> {
        (**self).commit(event)
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    #[test]
    fn kind_and_decision_strings_match_serde() {
        for k in Kind::ALL {
            let json = serde_json::to_value(k).unwrap();
            assert_eq!(json, serde_json::Value::String(k.as_str().into()));
            assert_eq!(k.as_str().parse::<Kind>().unwrap(), k);
        }
        for d in Verdict::ALL {
            let json = serde_json::to_value(d).unwrap();
            assert_eq!(json, serde_json::Value::String(d.as_str().into()));
            assert_eq!(d.as_str().parse::<Verdict>().unwrap(), d);
        }
        assert!("Allow".parse::<Verdict>().is_err());
        assert!("".parse::<Kind>().is_err());
    }

    #[test]
    fn arc_dyn_sink_is_a_sink() {
        let mem = Arc::new(MemorySink::new());
        let sink: Arc<dyn Sink> = mem.clone();
        sink.record(Event::default());
        assert_eq!(mem.len(), 1);
    }
}
