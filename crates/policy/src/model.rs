//! The policy model: one set of types for the file, the schema and the
//! effective policy. Every field's doc comment is also its schema description.

use std::borrow::Cow;
use std::collections::BTreeMap;
use std::path::PathBuf;
use std::time::Duration;

use schemars::{JsonSchema, Schema, SchemaGenerator};
use serde::{Deserialize, Serialize};

use crate::commands::CommandRules;
use crate::examples::Example;
use crate::locate::Locations;
use crate::network::{HostRule, NetworkRules};
use crate::tools::ToolRules;
use crate::units::{self, DurationText, SizeText};
use crate::HINT_MARK;

/// Default size of the `/workspace/tmp` tmpfs: 64 MiB.
pub const DEFAULT_TMP: u64 = 64 << 20;
/// Default pids limit.
pub const DEFAULT_PIDS: u32 = 256;
/// Default limit on one tool result: 1 MiB.
pub const DEFAULT_MAX_RESULT: u64 = 1 << 20;
/// Default limit on one JSON-RPC line: 16 MiB.
pub const DEFAULT_MAX_LINE: u64 = 16 << 20;
/// Default `[artifacts] max_size`: 10 MiB.
pub const DEFAULT_MAX_ARTIFACT: u64 = 10 << 20;

fn default_tmp() -> u64 {
    DEFAULT_TMP
}
fn default_pids() -> u32 {
    DEFAULT_PIDS
}
fn default_max_result() -> u64 {
    DEFAULT_MAX_RESULT
}
fn default_max_line() -> u64 {
    DEFAULT_MAX_LINE
}
fn default_max_artifact() -> u64 {
    DEFAULT_MAX_ARTIFACT
}

/// An mcpbox policy: what one MCP server's sandbox may see and do.
/// Every section is optional; what is left out takes the strictest default.
#[derive(Debug, Clone, Default, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct Policy {
    /// The policy this one builds on: `"preset:NAME"` (a preset shipped in mcpbox) or a
    /// policy file relative to this one. Its tables are merged key by key under this
    /// file's; arrays and values are replaced; its `[[tests]]` and `server.name` are not
    /// inherited.
    #[serde(default, skip_serializing)]
    pub extends: Option<String>,
    /// Who this policy is for.
    #[serde(default)]
    pub server: Server,
    /// What of the host's filesystem the sandbox sees.
    #[serde(default)]
    pub filesystem: Filesystem,
    /// The sandbox's environment variables (it starts from an empty environment).
    #[serde(default)]
    pub env: Env,
    /// Process limits and the executable allowlist.
    #[serde(default)]
    pub process: Process,
    /// Sandbox strength settings.
    #[serde(default)]
    pub sandbox: Sandbox,
    /// Runtime discovery: what `run` and `exec` mount, read-only, for the command's own
    /// runtime (its interpreter, virtual environment, node_modules tree).
    #[serde(default)]
    pub runtime: Runtime,
    /// Egress through mcpbox's filtering proxy; none by default.
    #[serde(default)]
    pub network: NetworkRules,
    /// Secrets injected as environment variables at start: NAME = { from_env | from_file | from_command, ttl }.
    #[serde(default)]
    pub secrets: BTreeMap<String, Secret>,
    /// How `mcpbox serve` reaches this server when it is remote (`url = ...` in the
    /// serve config): the header that carries the upstream credential. Ignored for a
    /// server started in the sandbox.
    #[serde(default, skip_serializing_if = "UpstreamSettings::is_empty")]
    pub upstream: UpstreamSettings,
    /// Per-tool rules applied by the relay.
    #[serde(default)]
    pub tools: ToolRules,
    /// Shell-like tool arguments (a command line, an argument vector) classified by what
    /// their commands do, and a verdict per category or program. No effect until a tool
    /// argument is declared.
    #[serde(default)]
    pub commands: CommandRules,
    /// Background jobs and exec limits of mcpbox's built-in sandbox server.
    #[serde(default)]
    pub jobs: Jobs,
    /// Limits and screening of what the server sends back.
    #[serde(default)]
    pub output: Output,
    /// Which files of /workspace/output may leave the sandbox (be exported) when it is
    /// destroyed or on request; none by default.
    #[serde(default)]
    pub artifacts: Artifacts,
    /// The audit log.
    #[serde(default)]
    pub audit: Audit,
    /// How calls (and results, and connections) that need a human are asked when the
    /// host has no MCP elicitation, and how long they wait.
    #[serde(default)]
    pub approvals: Approvals,
    /// Example decisions checked when the policy is loaded: [[tests]] tables.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub tests: Vec<Example>,
    #[serde(skip)]
    #[schemars(skip)]
    pub(crate) locations: Locations,
}

/// The `[server]` section.
#[derive(Debug, Clone, PartialEq, Eq, Default, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct Server {
    /// Name used in the audit log and in state paths: letters, digits, '.', '_' and '-',
    /// at most 64 characters. Default: the policy file's stem.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub name: Option<String>,
}

/// The `[filesystem]` section.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct Filesystem {
    /// Host directory mounted read-only at /workspace/input; relative to the policy file's
    /// directory. Default: none (no input).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub input: Option<PathBuf>,
    /// Host directory mounted read-write at /workspace/output; relative to the policy file's
    /// directory. Default: none (no output).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub output: Option<PathBuf>,
    /// Size of the empty tmpfs at /workspace/tmp, discarded at the end (also HOME).
    /// Under `serve` and `run --builtin` it bounds the whole writable workspace
    /// (tmp and output together). More than 0 and at most 64GiB. Default "64MiB".
    #[serde(default = "default_tmp", with = "units::size")]
    #[schemars(with = "SizeText")]
    pub tmp: u64,
    /// Extra bind mounts, as [[filesystem.mounts]] tables.
    #[serde(default)]
    pub mounts: Vec<Mount>,
}

impl Default for Filesystem {
    fn default() -> Self {
        Filesystem {
            input: None,
            output: None,
            tmp: DEFAULT_TMP,
            mounts: Vec::new(),
        }
    }
}

/// Read-only or read-write.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "lowercase")]
pub enum MountMode {
    /// Read-only (the default).
    #[default]
    Ro,
    /// Read-write.
    Rw,
}

/// One extra bind mount.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct Mount {
    /// Host path; relative to the policy file's directory. Credential locations
    /// (and their ancestors, such as a home directory) are refused.
    pub host: PathBuf,
    /// Absolute path inside the sandbox. Not "/", not under /proc, /dev or /sys, not
    /// /workspace or under /workspace/input, /workspace/output, /workspace/tmp; no "..".
    pub at: PathBuf,
    /// "ro" (default) or "rw".
    #[serde(default)]
    pub mode: MountMode,
    /// Mount this path even though it is or contains a credential location.
    /// Logged; meant for a deliberate, reviewed exception.
    #[serde(default)]
    pub dangerously_allow_credentials: bool,
}

/// The `[env]` section. The sandbox's environment holds only PATH, HOME, LANG, TERM
/// and what is listed here (plus secrets).
#[derive(Debug, Clone, PartialEq, Eq, Default, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct Env {
    /// Variables set to fixed values. Names must be valid environment names;
    /// dynamic-loader variables (LD_*) are refused.
    #[serde(default)]
    pub set: BTreeMap<String, String>,
    /// Variables passed through, by name, from mcpbox's own environment (skipped when unset).
    #[serde(default)]
    pub pass: Vec<String>,
}

/// The `[process]` section.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct Process {
    /// Memory limit for the whole sandbox, e.g. "512MiB". Default: none.
    #[serde(
        default,
        with = "units::opt_size",
        skip_serializing_if = "Option::is_none"
    )]
    #[schemars(with = "Option<SizeText>")]
    pub memory: Option<u64>,
    /// Maximum number of processes and threads, 1 to 65536. Default 256.
    #[serde(default = "default_pids")]
    #[schemars(range(min = 1, max = 65536))]
    pub pids: u32,
    /// CPU limit in cores, more than 0 and at most 1024 (e.g. 1.5). Default: none.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cpu: Option<f64>,
    /// Wall-clock limit for the whole sandbox, e.g. "1h". Default: none.
    #[serde(
        default,
        with = "units::opt_duration",
        skip_serializing_if = "Option::is_none"
    )]
    #[schemars(with = "Option<DurationText>")]
    pub timeout: Option<Duration>,
    /// Limit for one tool call, enforced by the relay, e.g. "60s". Default: none.
    #[serde(
        default,
        with = "units::opt_duration",
        skip_serializing_if = "Option::is_none"
    )]
    #[schemars(with = "Option<DurationText>")]
    pub call_timeout: Option<Duration>,
    /// When present, only these absolute paths (inside the sandbox) may be executed.
    /// Default: absent (any executable the sandbox can see).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub allow_exec: Option<Vec<PathBuf>>,
}

impl Default for Process {
    fn default() -> Self {
        Process {
            memory: None,
            pids: DEFAULT_PIDS,
            cpu: None,
            timeout: None,
            call_timeout: None,
            allow_exec: None,
        }
    }
}

/// The `[sandbox]` section.
#[derive(Debug, Clone, PartialEq, Eq, Default, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct Sandbox {
    /// Accept the weaker tier where user namespaces or cgroups are unavailable
    /// (Landlock, seccomp, no_new_privs and rlimits only). Default false: refuse to start.
    #[serde(default)]
    pub dangerously_allow_degraded: bool,
    /// What stands between the server and the host's kernel: "namespaces" (the default:
    /// Linux namespaces, Landlock and seccomp on the host's kernel) or "gvisor" (gVisor's
    /// `runsc`: the server's system calls go to gVisor's own kernel; docs/isolation.md).
    #[serde(default)]
    pub isolation: Isolation,
}

/// `[sandbox] isolation`: which tier runs the sandbox.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "lowercase")]
pub enum Isolation {
    /// Linux namespaces, Landlock and seccomp on the host's kernel (the default).
    #[default]
    Namespaces,
    /// gVisor (`runsc --platform=ptrace`): a second kernel between the server and the host's.
    Gvisor,
}

/// The `[runtime]` section.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct Runtime {
    /// Find what the command needs to run as the host would (PATH, `#!` lines, symlinks,
    /// a virtual environment's `pyvenv.cfg`, the enclosing node_modules tree) and mount
    /// it read-only at the same path, each mount reported; credential locations and home
    /// directories are never mounted this way. Also gives `npx -y`, `uvx` and `pipx run`
    /// a per-server cache. Default true; false: only what the policy mounts.
    #[serde(default = "default_true")]
    pub discover: bool,
}

fn default_true() -> bool {
    true
}

impl Default for Runtime {
    fn default() -> Self {
        Runtime { discover: true }
    }
}

/// Where a secret's value comes from. The gateway loads it
/// (`mcpbox_gateway::load_secret`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum SecretSource {
    /// mcpbox's own environment variable of this name.
    Env(String),
    /// The contents of this host file (trailing newline trimmed by the binary).
    File(PathBuf),
    /// The standard output of this command (program and arguments).
    Command(Vec<String>),
}

/// One secret, validated: exactly one source.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(try_from = "SecretTable", into = "SecretTable")]
pub struct Secret {
    /// Where the value comes from.
    pub source: SecretSource,
    /// Refresh the value (restarting the server) after this long.
    pub ttl: Option<Duration>,
    /// A command (program and arguments, no shell) run on the host when the sandbox is
    /// torn down, given the value in `MCPBOX_SECRET_VALUE` and the name in
    /// `MCPBOX_SECRET_NAME`. Never empty.
    pub revoke: Option<Vec<String>>,
    /// The hosts the value is for (`[network]` patterns). When set, the
    /// value never enters the sandbox: the server gets a placeholder, and
    /// the egress proxy puts the value in requests to these hosts only.
    pub hosts: Vec<HostRule>,
    /// More CA certificates (PEM) the proxy trusts when it opens a
    /// connection to one of `hosts` (an internal service's CA); the
    /// system's roots are always trusted. Only with `hosts`.
    pub ca_file: Option<PathBuf>,
    /// Whether the proxy also puts the value in place of the placeholder
    /// in request bodies (streamed, same length). Only with `hosts`.
    pub bodies: bool,
}

/// A secret as written in the file: exactly one of `from_env`, `from_file`, `from_command`.
#[derive(Debug, Clone, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
#[schemars(rename = "Secret")]
pub(crate) struct SecretTable {
    /// Name of an environment variable of mcpbox (the gateway) holding the value.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    from_env: Option<String>,
    /// Host file holding the value; relative to the policy file's directory.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    from_file: Option<PathBuf>,
    /// Command (program and arguments, no shell) whose standard output is the value. It
    /// runs on the host with PATH, HOME and LANG only, in a process group of its own that
    /// is killed after 60 s.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    from_command: Option<Vec<String>>,
    /// Refresh the value after this long (the server is restarted with the fresh value).
    #[serde(
        default,
        with = "units::opt_duration",
        skip_serializing_if = "Option::is_none"
    )]
    #[schemars(with = "Option<DurationText>")]
    ttl: Option<Duration>,
    /// Command (program and arguments, no shell) run on the host when the sandbox is torn
    /// down, to revoke the value: it gets the value in the environment variable
    /// MCPBOX_SECRET_VALUE and the secret's name in MCPBOX_SECRET_NAME, besides PATH, HOME
    /// and LANG (nothing else), in a process group of its own killed after 10 s. Default:
    /// none.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    revoke: Option<Vec<String>>,
    /// Hosts the value is for, in `[network]` syntax ("api.github.com"), each allowed by
    /// `[network]`. The value then never enters the sandbox: the server gets a placeholder
    /// of the same shape, and the egress proxy puts the real value in place of it in the
    /// headers and URL of requests to these hosts only (HTTPS through a CA of the
    /// sandbox's own). Default: none (the value is in the server's environment).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    hosts: Vec<HostRule>,
    /// PEM file of CA certificates the proxy trusts, besides the system's, when it opens a
    /// connection to one of `hosts` (an internal service's CA); relative to the policy
    /// file's directory. Only with `hosts`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    ca_file: Option<PathBuf>,
    /// Also put the value in place of the placeholder in the bodies of requests to `hosts`
    /// (a form's `client_secret`, a JSON body's key): streamed, the same length, no body
    /// held. Only with `hosts`. Default: false (headers and URL only).
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    bodies: bool,
}

const SECRET_HINT: &str =
    "write exactly one of from_env = \"VAR\", from_file = \"path\" or from_command = [\"prog\", \"arg\"]";

impl TryFrom<SecretTable> for Secret {
    type Error = String;
    fn try_from(t: SecretTable) -> Result<Self, String> {
        let mut sources = Vec::new();
        if let Some(v) = t.from_env {
            sources.push(SecretSource::Env(v));
        }
        if let Some(v) = t.from_file {
            sources.push(SecretSource::File(v));
        }
        if let Some(v) = t.from_command {
            sources.push(SecretSource::Command(v));
        }
        if sources.len() > 1 {
            return Err(format!(
                "secret has {} sources{HINT_MARK}{SECRET_HINT}",
                sources.len()
            ));
        }
        match sources.pop() {
            Some(source) => Ok(Secret {
                source,
                ttl: t.ttl,
                revoke: t.revoke,
                hosts: t.hosts,
                ca_file: t.ca_file,
                bodies: t.bodies,
            }),
            None => Err(format!("secret has no source{HINT_MARK}{SECRET_HINT}")),
        }
    }
}

impl From<Secret> for SecretTable {
    fn from(s: Secret) -> Self {
        let mut t = SecretTable {
            from_env: None,
            from_file: None,
            from_command: None,
            ttl: s.ttl,
            revoke: s.revoke,
            hosts: s.hosts,
            ca_file: s.ca_file,
            bodies: s.bodies,
        };
        match s.source {
            SecretSource::Env(v) => t.from_env = Some(v),
            SecretSource::File(v) => t.from_file = Some(v),
            SecretSource::Command(v) => t.from_command = Some(v),
        }
        t
    }
}

impl JsonSchema for Secret {
    fn schema_name() -> Cow<'static, str> {
        SecretTable::schema_name()
    }
    fn json_schema(g: &mut SchemaGenerator) -> Schema {
        let mut schema = SecretTable::json_schema(g);
        if let Some(obj) = schema.as_object_mut() {
            obj.insert(
                "oneOf".into(),
                serde_json::json!([
                    { "required": ["from_env"] },
                    { "required": ["from_file"] },
                    { "required": ["from_command"] }
                ]),
            );
        }
        schema
    }
}

/// The `[upstream]` section: the credential `mcpbox serve` adds to every request to a
/// remote server. The value names secrets of `[secrets]` as `${NAME}`, so the credential
/// itself never sits in the policy file; the relay redacts those values from whatever
/// the server sends back.
#[derive(Debug, Clone, PartialEq, Eq, Default, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct UpstreamSettings {
    /// HTTP header that carries the credential, e.g. "Authorization" or "X-Api-Key".
    /// Not one the gateway sets itself (Host, Content-Type, Accept, Mcp-Session-Id, ...).
    /// Needs `value`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub header: Option<String>,
    /// The header's value, naming at least one secret as `${NAME}`, e.g.
    /// "Bearer ${TICKETS_TOKEN}". Printable ASCII; needs `header`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub value: Option<String>,
}

/// One piece of an `[upstream] value`: literal text or a secret's name.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ValuePart<'a> {
    /// Text as written.
    Text(&'a str),
    /// `${NAME}`: the value of secret NAME.
    Secret(&'a str),
}

impl UpstreamSettings {
    /// True when the section is absent or empty.
    pub fn is_empty(&self) -> bool {
        self.header.is_none() && self.value.is_none()
    }

    /// The header name and value with every `${NAME}` replaced by `lookup(NAME)`.
    /// `None` when there is no header; an error names a secret `lookup` does not
    /// know, or whose value cannot travel in a header (never the value itself).
    pub fn render<'a>(
        &self,
        lookup: impl Fn(&str) -> Option<&'a str>,
    ) -> Option<Result<(String, String), String>> {
        let header = self.header.as_ref()?;
        let value = self.value.as_deref().unwrap_or("");
        let parts = match parse_value(value) {
            Ok(p) => p,
            Err(e) => return Some(Err(e)),
        };
        let mut out = String::new();
        for part in parts {
            match part {
                ValuePart::Text(t) => out.push_str(t),
                ValuePart::Secret(name) => match lookup(name) {
                    None => return Some(Err(format!("secret {name} has no value"))),
                    Some(v) if !v.bytes().all(header_value_byte) || v.is_empty() => {
                        return Some(Err(format!(
                            "secret {name} is empty or holds a character an HTTP header cannot carry"
                        )))
                    }
                    Some(v) => out.push_str(v),
                },
            }
        }
        Some(Ok((header.clone(), out)))
    }
}

/// Bytes an HTTP header value may hold here: visible ASCII, space and tab.
pub(crate) fn header_value_byte(b: u8) -> bool {
    b == b' ' || b == b'\t' || b.is_ascii_graphic()
}

/// Splits an `[upstream] value` into text and `${NAME}` references.
pub(crate) fn parse_value(value: &str) -> Result<Vec<ValuePart<'_>>, String> {
    let mut parts = Vec::new();
    let mut rest = value;
    while let Some(at) = rest.find("${") {
        if at > 0 {
            parts.push(ValuePart::Text(&rest[..at]));
        }
        let after = &rest[at + 2..];
        let Some(end) = after.find('}') else {
            return Err("\"${\" without a closing \"}\"".into());
        };
        parts.push(ValuePart::Secret(&after[..end]));
        rest = &after[end + 1..];
    }
    if !rest.is_empty() {
        parts.push(ValuePart::Text(rest));
    }
    Ok(parts)
}

/// The `[output]` section.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct Output {
    /// Tool results larger than this are truncated with a marker. Default "1MiB".
    #[serde(default = "default_max_result", with = "units::size")]
    #[schemars(with = "SizeText")]
    pub max_result: u64,
    /// JSON-RPC lines larger than this are refused. Default "16MiB".
    #[serde(default = "default_max_line", with = "units::size")]
    #[schemars(with = "SizeText")]
    pub max_line: u64,
    /// Also redact (not only flag in the audit log) token-shaped strings in results. Default false.
    #[serde(default)]
    pub redact_credential_shapes: bool,
    /// A result larger than this (after redaction, before truncation to `max_result`) is
    /// held until a human approves it (a large export), e.g. "256KiB". Default: none.
    #[serde(
        default,
        with = "units::opt_size",
        skip_serializing_if = "Option::is_none"
    )]
    #[schemars(with = "Option<SizeText>")]
    pub approve_over: Option<u64>,
    /// A result holding credential-shaped strings (tokens, private keys) is held until a
    /// human approves it. Default false (they are flagged in the audit log, and redacted
    /// with `redact_credential_shapes`).
    #[serde(default)]
    pub approve_credential_shapes: bool,
}

impl Default for Output {
    fn default() -> Self {
        Output {
            max_result: DEFAULT_MAX_RESULT,
            max_line: DEFAULT_MAX_LINE,
            redact_credential_shapes: false,
            approve_over: None,
            approve_credential_shapes: false,
        }
    }
}

/// Default `[approvals] timeout`: 120 seconds.
pub const DEFAULT_APPROVAL_TIMEOUT: Duration = Duration::from_secs(120);

fn default_approval_timeout() -> Duration {
    DEFAULT_APPROVAL_TIMEOUT
}

/// `[approvals] fallback`: what happens when the host has no MCP elicitation.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "lowercase")]
pub enum ApprovalFallback {
    /// The host gets an error at once naming the approval's id and the command that
    /// approves it (`mcpbox approvals approve ID`); once approved, the same call with the
    /// same arguments passes once. The default: no host call hangs on a human.
    #[default]
    Refuse,
    /// The call waits, up to `timeout`, while a human answers with `mcpbox approvals` or
    /// the console; a log line and an MCP log notification name the approval.
    Hold,
}

/// The `[approvals]` section.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct Approvals {
    /// When the host has no MCP elicitation: "refuse" (default) or "hold".
    #[serde(default)]
    pub fallback: ApprovalFallback,
    /// How long an approval stays open (a held call waits, a refused call's approval can
    /// be given and then used), e.g. "10m". Default "120s"; at least 1s, at most 24h.
    #[serde(default = "default_approval_timeout", with = "units::duration")]
    #[schemars(with = "DurationText")]
    pub timeout: Duration,
    /// A command run (outside the sandbox, as you, no shell) for each new approval a human
    /// must answer outside the host, with two more arguments: a title and a text naming
    /// the approval and the command that approves it, e.g. ["notify-send",
    /// "--app-name=mcpbox"]. It gets PATH, HOME, LANG and the desktop session's variables
    /// only, in a process group of its own killed after 10 s. Default: none (the log line
    /// and the MCP log notification).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub notify: Option<Vec<String>>,
    /// Whether the host may answer an approval through MCP elicitation (its own form).
    /// Default true. false: only a human at `mcpbox approvals` or the console approves,
    /// whatever the host declares (for hosts that answer forms on their own, such as an
    /// auto-approve mode); the host is treated as having no elicitation, so `fallback`
    /// applies.
    #[serde(default = "default_true")]
    pub elicitation: bool,
}

impl Default for Approvals {
    fn default() -> Self {
        Approvals {
            fallback: ApprovalFallback::Refuse,
            timeout: DEFAULT_APPROVAL_TIMEOUT,
            notify: None,
            elicitation: true,
        }
    }
}

/// Default `[jobs] max_running`.
pub const DEFAULT_MAX_JOBS: u32 = 4;
/// Default `[jobs] max_time`: 10 minutes.
pub const DEFAULT_JOB_TIME: Duration = Duration::from_secs(600);
/// Default `[jobs] max_memory`: 512 MiB.
pub const DEFAULT_JOB_MEMORY: u64 = 512 << 20;
/// Default `[jobs] exec_timeout`: 60 seconds.
pub const DEFAULT_EXEC_TIMEOUT: Duration = Duration::from_secs(60);
/// Default `[jobs] max_output`: 64 KiB.
pub const DEFAULT_EXEC_OUTPUT: u64 = 64 << 10;
/// Default `[jobs] job_output`: 8 MiB.
pub const DEFAULT_JOB_OUTPUT: u64 = 8 << 20;

fn default_max_jobs() -> u32 {
    DEFAULT_MAX_JOBS
}
fn default_job_time() -> Duration {
    DEFAULT_JOB_TIME
}
fn default_job_memory() -> u64 {
    DEFAULT_JOB_MEMORY
}
fn default_exec_timeout() -> Duration {
    DEFAULT_EXEC_TIMEOUT
}
fn default_exec_output() -> u64 {
    DEFAULT_EXEC_OUTPUT
}
fn default_job_output() -> u64 {
    DEFAULT_JOB_OUTPUT
}

/// The `[jobs]` section: limits of mcpbox's built-in sandbox server on its `exec` and
/// `run_code` calls and on the background jobs they start. Every limit is bounded, so a
/// model cannot make a job run forever or fill memory with its output.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct Jobs {
    /// Background jobs running at once, 1 to 64; one more is refused (`job.limit`). Default 4.
    #[serde(default = "default_max_jobs")]
    #[schemars(range(min = 1, max = 64))]
    pub max_running: u32,
    /// A background job running longer than this is stopped (`job.timeout`). More than 0
    /// and at most 24h. Default "10m".
    #[serde(default = "default_job_time", with = "units::duration")]
    #[schemars(with = "DurationText")]
    pub max_time: Duration,
    /// A background job whose resident memory grows past this is stopped (`job.memory`).
    /// More than 0 and at most 1TiB. Default "512MiB".
    #[serde(default = "default_job_memory", with = "units::size")]
    #[schemars(with = "SizeText")]
    pub max_memory: u64,
    /// The default and the ceiling of the timeout of one `exec` or `run_code` call (a
    /// longer timeout asked for is cut to this). More than 0 and at most 1h. Default "60s".
    #[serde(default = "default_exec_timeout", with = "units::duration")]
    #[schemars(with = "DurationText")]
    pub exec_timeout: Duration,
    /// Of stdout and of stderr, each, at most this much is returned by one `exec` call.
    /// More than 0 and at most 16MiB. Default "64KiB".
    #[serde(default = "default_exec_output", with = "units::size")]
    #[schemars(with = "SizeText")]
    pub max_output: u64,
    /// Of stdout and of stderr, each, at most this much is kept per background job.
    /// More than 0 and at most 256MiB. Default "8MiB".
    #[serde(default = "default_job_output", with = "units::size")]
    #[schemars(with = "SizeText")]
    pub job_output: u64,
}

impl Default for Jobs {
    fn default() -> Self {
        Jobs {
            max_running: DEFAULT_MAX_JOBS,
            max_time: DEFAULT_JOB_TIME,
            max_memory: DEFAULT_JOB_MEMORY,
            exec_timeout: DEFAULT_EXEC_TIMEOUT,
            max_output: DEFAULT_EXEC_OUTPUT,
            job_output: DEFAULT_JOB_OUTPUT,
        }
    }
}

/// The `[artifacts]` section: the files of /workspace/output that may be exported
/// (`mcpbox artifacts ...`, and before a sandbox is destroyed). Nothing else leaves.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct Artifacts {
    /// Glob patterns relative to /workspace/output: `*` matches within one path segment,
    /// `?` one character, a `**` segment any number of segments, e.g. ["report.md",
    /// "dist/**"]. Not absolute, no "." or ".." segment, no empty segment. Default none:
    /// nothing leaves.
    #[serde(default)]
    pub patterns: Vec<String>,
    /// An artifact larger than this is exported only with a human's approval. Default "10MiB".
    #[serde(default = "default_max_artifact", with = "units::size")]
    #[schemars(with = "SizeText")]
    pub max_size: u64,
}

impl Default for Artifacts {
    fn default() -> Self {
        Artifacts {
            patterns: Vec::new(),
            max_size: DEFAULT_MAX_ARTIFACT,
        }
    }
}

impl Artifacts {
    /// True when `path` (relative to /workspace/output, '/'-separated, no leading
    /// '/') matches one of the patterns.
    pub fn matches(&self, path: &str) -> bool {
        self.patterns
            .iter()
            .any(|p| crate::artifacts::path_match(p, path))
    }
}

/// The `[audit]` section.
#[derive(Debug, Clone, PartialEq, Eq, Default, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct Audit {
    /// Audit database file; relative to the policy file's directory. Default: chosen by
    /// mcpbox in its state directory.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub path: Option<PathBuf>,
    /// When a record counts as written: "process" (default: committed to the
    /// database's write-ahead log, so a crash of mcpbox loses nothing) or "machine"
    /// (also flushed to disk before the call goes on, so a power loss loses nothing;
    /// costs a disk flush per event).
    #[serde(default)]
    pub durability: Durability,
    /// What happens to calls while a record cannot be written (a full disk, a locked
    /// or broken database): "refuse" (default: each call is refused with reason
    /// audit.unavailable until the log is written again, so nothing runs unrecorded)
    /// or "continue" (calls go on; their records wait in memory, bounded).
    #[serde(default)]
    pub on_failure: OnAuditFailure,
    /// Retention by age: records older than this are removed when a session
    /// opens the log and while run or serve keeps it open, e.g. "90d".
    /// Default: none (kept forever).
    #[serde(
        default,
        with = "units::opt_duration",
        skip_serializing_if = "Option::is_none"
    )]
    #[schemars(with = "Option<DurationText>")]
    pub keep: Option<Duration>,
    /// Retention by size: while the log holds more than this, its oldest
    /// records are removed when a session opens it and while run or serve
    /// keeps it open, e.g. "1GiB". Default: none.
    #[serde(
        default,
        with = "units::opt_size",
        skip_serializing_if = "Option::is_none"
    )]
    #[schemars(with = "Option<SizeText>")]
    pub max_size: Option<u64>,
}

impl Audit {
    /// A retention is set (`keep` or `max_size`).
    pub fn retains(&self) -> bool {
        self.keep.is_some() || self.max_size.is_some()
    }
}

/// What calls do while the audit log cannot be written.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "lowercase")]
pub enum OnAuditFailure {
    /// Refuse them: nothing runs unrecorded.
    #[default]
    Refuse,
    /// Run them; their records wait in memory until the log is writable.
    Continue,
}

/// How durable an audit record is when the relay moves on.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "lowercase")]
pub enum Durability {
    /// Survives a crash of mcpbox (SQLite WAL, synchronous=NORMAL).
    #[default]
    Process,
    /// Survives a crash of the machine (synchronous=FULL: an fsync per event).
    Machine,
}
