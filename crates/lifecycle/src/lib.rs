//! The lifecycle of agent sandboxes, apart from the processes themselves.
//!
//! A *sandbox* here is what outlives one server process: an identity
//! ([`id::Key`]: agent, server or shared group, optional task), a
//! workspace folder under the state directory (`input`, `output`, `tmp`),
//! a cgroup parent that every server process of it runs under, and a
//! state ([`State`]). The binary (`crates/mcpbox/src/lifecycle/`) drives
//! the state machine (its timer, its control operations, its workspaces)
//! and talks to the processes through its `Backend`
//! (`lifecycle/backend.rs`); this crate holds the parts that need no
//! process:
//!
//! - [`machine`]: the state machine of one sandbox, I/O-free
//!   (`Machine::on(Event, now) -> Vec<Effect>`), and the one drawing of
//!   its states;
//! - [`id`]: the sandbox id of an identity, and the task name check;
//! - [`registry`]: the sandboxes recorded in SQLite, so a restarted
//!   `serve` re-adopts or cleans up what the last run left;
//! - [`snapshot`]: a workspace as a compressed archive with a manifest,
//!   and a restore that checks every entry before it writes one;
//! - [`artifacts`]: the declared files of `output`, copied out only when
//!   they are plain regular files inside it;
//! - [`control`]: the control socket (unix, 0600, peer uid checked) and
//!   its JSON-lines protocol, server and client.

use std::path::PathBuf;

use serde::{Deserialize, Serialize};

pub mod artifacts;
pub mod control;
pub mod glob;
pub mod id;
pub mod machine;
#[cfg(feature = "registry")]
pub mod registry;
pub mod render;
pub mod snapshot;
pub mod walk;

/// Where a sandbox is in its life; the transitions are [`machine`]'s
/// (its module doc draws them).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum State {
    /// Recorded, workspace made, no process yet.
    Created,
    /// A server process runs (or is starting).
    Running,
    /// Its processes are frozen (cgroup freezer); memory is kept.
    Paused,
    /// No process; the workspace is kept for the next call.
    Stopped,
    /// Gone: processes, cgroups, workspace.
    Destroyed,
}

impl State {
    /// The stable name (`running`, `paused`, ...).
    pub fn as_str(self) -> &'static str {
        match self {
            State::Created => "created",
            State::Running => "running",
            State::Paused => "paused",
            State::Stopped => "stopped",
            State::Destroyed => "destroyed",
        }
    }

    /// The state named `s`.
    pub fn parse(s: &str) -> Option<State> {
        Some(match s {
            "created" => State::Created,
            "running" => State::Running,
            "paused" => State::Paused,
            "stopped" => State::Stopped,
            "destroyed" => State::Destroyed,
            _ => return None,
        })
    }
}

/// One sandbox as `mcpbox sandboxes list|show --json` prints it.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct SandboxInfo {
    pub id: String,
    pub agent: String,
    /// The server, or the shared group's name for `placement = "shared"`.
    pub server: String,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub task: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub template: Option<String>,
    pub state: State,
    pub workspace: PathBuf,
    /// Seconds since the last message to or from any of its servers.
    pub idle_seconds: u64,
    /// RFC 3339, UTC.
    pub created: String,
    /// Live MCP sessions attached to it.
    pub sessions: usize,
    /// Processes in its cgroup now.
    pub processes: usize,
    /// CPU time its processes used, in microseconds, when a cgroup counts it.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub cpu_usec: Option<u64>,
    /// Memory its processes use now, in bytes (the cgroup's
    /// `memory.current` on v2, else the sum of their resident sets), when
    /// it can be read.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub memory_bytes: Option<u64>,
    /// `v1` or `v2`: the cgroup interface its freezer uses, if any.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub freezer: Option<String>,
    /// What an operation that asked for a state found: why the sandbox is
    /// in the one above (`pause`: paused; paused already; or running
    /// again, a call woke it).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub note: Option<String>,
}

/// A file of `output` that matches the policy's artifact patterns.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Artifact {
    /// Relative to `/workspace/output`.
    pub path: String,
    pub size: u64,
    /// Why it would not be exported (a symlink, a hardlink, a fifo, over
    /// the size limit without approval, ...); `None` if it would be.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub refused: Option<String>,
}

/// An artifact copied out.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Exported {
    /// Relative to `/workspace/output` (and to the destination).
    pub path: String,
    pub size: u64,
    /// Hex SHA-256 of the bytes copied.
    pub sha256: String,
}

/// What a snapshot wrote.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct SnapshotInfo {
    /// The archive's path.
    pub archive: PathBuf,
    /// Entries in its manifest (files and directories).
    pub entries: usize,
    /// Sum of the files' sizes.
    pub bytes: u64,
    /// Hex SHA-256 of the manifest (which holds every file's digest).
    pub manifest_sha256: String,
    /// What the workspace held that was not archived (symlinks, fifos,
    /// sockets, devices, ...), as the manifest lists it.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub skipped: Vec<snapshot::Skipped>,
}

/// What a teardown found once it was done, checked from the host.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Teardown {
    pub id: String,
    /// Artifacts exported on the way out.
    pub exported: Vec<Exported>,
    /// Secrets whose `revoke` command ran, and how each ended.
    pub revoked: Vec<(String, String)>,
    /// What was still there afterwards; empty when the teardown is clean.
    pub left: Vec<String>,
}

impl Teardown {
    /// Nothing was left behind.
    pub fn clean(&self) -> bool {
        self.left.is_empty()
    }
}

/// The lifecycle's operations, as the control socket offers them.
pub trait Control: Send + Sync + 'static {
    /// The approvals waiting for a human in this process, when it has a
    /// broker (`run` and `serve` do): the control socket's `approvals`,
    /// `approve` and `deny` ops go there.
    fn desk(&self) -> Option<&dyn Desk> {
        None
    }
    fn list(&self) -> Vec<SandboxInfo>;
    fn show(&self, id: &str) -> Result<SandboxInfo, String>;
    fn pause(&self, id: &str) -> Result<SandboxInfo, String>;
    fn resume(&self, id: &str) -> Result<SandboxInfo, String>;
    /// Writes the workspace (`output`, and `tmp` when asked) to `archive`;
    /// with `memory`, also the memory of the sandbox's running servers
    /// where its backend can checkpoint them (part `memory`).
    fn snapshot(
        &self,
        id: &str,
        archive: &std::path::Path,
        include_tmp: bool,
        memory: bool,
    ) -> Result<SnapshotInfo, String>;
    /// A new sandbox for (agent, server, task) whose workspace is the
    /// archive's content; refused when that sandbox exists.
    fn restore(
        &self,
        archive: &std::path::Path,
        agent: &str,
        server: &str,
        task: Option<&str>,
    ) -> Result<SandboxInfo, String>;
    /// Tears it down; artifacts over the size limit are exported only as
    /// `approved` names them, at no more than the size approved (any other
    /// keeps the workspace: none is lost).
    fn destroy(&self, id: &str, approved: &artifacts::Approved) -> Result<Teardown, String>;
    fn artifacts(&self, id: &str) -> Result<Vec<Artifact>, String>;
    /// Copies the sandbox's exportable artifacts into `dest` (created, must
    /// not exist or be empty); files over the size limit only as
    /// `approved` names them (a human at the CLI, at the size listed).
    fn export(
        &self,
        id: &str,
        dest: &std::path::Path,
        approved: &artifacts::Approved,
    ) -> Result<Vec<Exported>, String>;
}

/// The approval broker as the control socket sees it (the binary wraps
/// `mcpbox_gateway::broker::Broker`; this crate does not depend on the
/// relay). Values are the broker's JSON views.
pub trait Desk: Send + Sync {
    /// Everything that waits for a human, oldest first.
    fn pending(&self) -> Vec<serde_json::Value>;
    /// Answers `id`: approve (for this one call, or with `session` for the
    /// tool for the rest of its session) or deny. `by` names who, from
    /// the peer's credentials (`cli:uid=1000`).
    fn answer(
        &self,
        id: &str,
        approve: bool,
        session: bool,
        by: &str,
    ) -> Result<serde_json::Value, String>;
}

/// What `run` answers the lifecycle's ops with: it has no sandboxes that
/// outlive it.
pub const NO_SANDBOXES: &str =
    "this mcpbox has no sandboxes to manage (it is `mcpbox run`; `mcpbox serve` has them)";
