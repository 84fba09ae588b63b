//! The config file of `mcpbox serve`, the HTTP gateway: where it listens, which
//! clients may connect with which token, and which servers it offers (each with
//! its sandbox policy, as for `mcpbox run`). See `docs/serve.md`.
//!
//! Parsing and validation are pure, like a policy's: [`ServeConfig::from_str`]
//! is given the text and the path, and returns a validated config or a
//! [`Diagnostic`] pointing at the file, line and key. Two functions read the
//! host, because the gateway and `mcpbox check` must load the same way:
//! [`ServeConfig::load`] reads the config file, and [`TokenSource::load`] reads
//! a client's token. Nothing here reads a referenced policy; the binary does
//! (`preflight::load`).

use std::collections::BTreeMap;
use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::path::{Path, PathBuf};
use std::time::Duration;

use schemars::{JsonSchema, Schema};
use serde::{Deserialize, Serialize};

use crate::diagnostic::Diagnostic;
use crate::locate::Locations;
use crate::units::{self, DurationOrOff, DurationText, SizeText};
use crate::validate::{check_valid_env_name, Ctx};
use crate::{serde_diagnostic, syntax_diagnostic, Result};

/// Joins a server's name and its tool's name on the aggregated endpoint `/mcp`:
/// `<server>__<tool>`. Server names cannot contain `_`, so the first `__` of a
/// prefixed name is always the separator ([`split_tool_name`]).
pub const NAME_SEPARATOR: &str = "__";
/// Longest server or client name.
pub const MAX_NAME: usize = 64;
/// Where the gateway listens unless told otherwise: loopback only.
pub const DEFAULT_ADDRESS: SocketAddr = SocketAddr::new(IpAddr::V4(Ipv4Addr::LOCALHOST), 8787);
/// Default `[limits] max_body`: 4 MiB.
pub const DEFAULT_MAX_BODY: u64 = 4 << 20;
/// Default `[limits] max_buffered_per_session`: 32 MiB (room for the
/// largest message a relay passes, `output.max_line`'s default 16 MiB).
pub const DEFAULT_MAX_BUFFERED_PER_SESSION: u64 = 32 << 20;
/// Default `[limits] max_buffered_total`: 512 MiB.
pub const DEFAULT_MAX_BUFFERED_TOTAL: u64 = 512 << 20;
/// Default `[limits] shutdown_grace`: 10 s.
pub const DEFAULT_SHUTDOWN_GRACE: Duration = Duration::from_secs(10);
/// Largest token file [`TokenSource::load`] reads: a token is short, so a
/// bigger file is the wrong file (or a device that never ends).
pub const MAX_TOKEN_FILE: u64 = 64 << 10;

/// Default `[idle] pause`: a sandbox is frozen after 5 minutes without a message.
pub const DEFAULT_IDLE_PAUSE: Duration = Duration::from_secs(5 * 60);
/// Default `[idle] stop`: its processes are stopped after 30 minutes.
pub const DEFAULT_IDLE_STOP: Duration = Duration::from_secs(30 * 60);

/// The top-level keys that make a TOML file a serve config: a policy has none
/// of them (its `[server]` is singular), so `mcpbox check` can tell the two apart.
pub const TOP_LEVEL_KEYS: [&str; 3] = ["listen", "clients", "servers"];

/// A validated `mcpbox serve` config: defaults filled in, paths resolved
/// against the config file's directory.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ServeConfig {
    /// The config file, as given.
    pub path: PathBuf,
    /// The `[listen]` table.
    pub listen: Listen,
    /// The `[limits]` table.
    pub limits: Limits,
    /// The `[[clients]]`, in file order (at least one).
    pub clients: Vec<Client>,
    /// The `[[servers]]`, in file order (at least one).
    pub servers: Vec<Server>,
    /// The `[idle]` table: the default for every sandboxed server.
    pub idle: Idle,
    /// The `[[templates]]`, in file order (possibly none).
    pub templates: Vec<Template>,
}

/// `[idle]`: the default for every sandboxed server; a server's own `idle = {...}` replaces it key by key.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Idle {
    /// Freeze the sandbox (cgroup freezer) after this long without a message to or from its servers. Default 5 minutes.
    pub pause: Option<Duration>,
    /// Stop its processes (the workspace is kept; the next call restarts the server on it) after this long. Default 30 minutes.
    pub stop: Option<Duration>,
    /// Destroy it (processes, cgroups, workspace; artifacts exported first) after this long. Default: never (None).
    pub destroy: Option<Duration>,
}

impl Default for Idle {
    fn default() -> Self {
        Idle {
            pause: Some(DEFAULT_IDLE_PAUSE),
            stop: Some(DEFAULT_IDLE_STOP),
            destroy: None,
        }
    }
}

/// Where a stdio server's sandbox lives.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "lowercase")]
pub enum Placement {
    /// One sandbox per (agent, server): the default, `placement = "sandbox"`.
    #[default]
    Sandbox,
    /// `placement = "shared"`: one sandbox per agent holding every shared server.
    Shared,
}

/// A `[[templates]]` entry: what a new workspace starts from, and its policy.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Template {
    /// Its name, `[a-z0-9-]`, unique; servers name it with `template = "..."`.
    pub name: String,
    /// What each new workspace's input starts from.
    pub base: TemplateBase,
    /// The policy of every server made from it, resolved against the config file's directory.
    pub policy: PathBuf,
    /// Workspaces made ahead of demand for each server made from it
    /// (`ready`, default [`DEFAULT_READY`], at most [`MAX_READY`]; 0 for none).
    pub ready: u32,
}

/// How many workspaces of a template are made ahead of demand, per server,
/// when `ready` is not given.
pub const DEFAULT_READY: u32 = 2;
/// The most `ready` may ask for: each holds a formatted volume image and a
/// copy of the base on disk until it is used.
pub const MAX_READY: u32 = 16;

/// What a template's workspaces start from. Paths are resolved against the
/// config file's directory; their existence is checked by `mcpbox check` and
/// at start, not here.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum TemplateBase {
    /// A directory, copied into each new workspace's input.
    Dir(PathBuf),
    /// A snapshot archive (`mcpbox sandboxes snapshot`), restored into each new workspace.
    Snapshot(PathBuf),
}

/// Where and how the gateway listens.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Listen {
    /// The bind address (default 127.0.0.1:8787). A non-loopback address needs
    /// `tls` unless `dangerously_allow_plaintext`.
    pub address: SocketAddr,
    /// Serve HTTPS with this certificate and key.
    pub tls: Option<Tls>,
    /// Accept a non-loopback address without TLS (tokens then cross the network
    /// in clear). Default false.
    pub dangerously_allow_plaintext: bool,
    /// Extra `Host` header values accepted, besides the bind address and, for a
    /// loopback bind, `localhost`, `127.0.0.1` and `[::1]` with the port.
    /// Lowercase, `host` or `host:port`. Default empty.
    pub allowed_hosts: Vec<String>,
    /// `Origin` values accepted (`scheme://host[:port]`, lowercase). Default
    /// empty: only the gateway's own origins.
    pub allowed_origins: Vec<String>,
}

impl Default for Listen {
    fn default() -> Self {
        Listen {
            address: DEFAULT_ADDRESS,
            tls: None,
            dangerously_allow_plaintext: false,
            allowed_hosts: Vec::new(),
            allowed_origins: Vec::new(),
        }
    }
}

impl Listen {
    /// True when the bind address is a loopback address (127.0.0.0/8, ::1).
    pub fn is_loopback(&self) -> bool {
        self.address.ip().is_loopback()
    }
}

/// A certificate chain and its private key, PEM files.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Tls {
    /// The certificate chain (PEM); resolved against the config file's directory.
    pub cert: PathBuf,
    /// The private key (PEM); resolved against the config file's directory.
    pub key: PathBuf,
}

fn default_max_body() -> u64 {
    DEFAULT_MAX_BODY
}
fn default_max_concurrent() -> u32 {
    32
}
fn default_rate_per_second() -> u32 {
    200
}
fn default_burst() -> u32 {
    400
}
fn default_header_timeout() -> Duration {
    Duration::from_secs(10)
}
fn default_body_timeout() -> Duration {
    Duration::from_secs(30)
}
fn default_max_sessions_per_client() -> u32 {
    64
}
fn default_max_streams_per_client() -> u32 {
    1024
}
fn default_max_sandboxes_per_client() -> u32 {
    32
}
fn default_max_buffered_per_session() -> u64 {
    DEFAULT_MAX_BUFFERED_PER_SESSION
}
fn default_max_buffered_total() -> u64 {
    DEFAULT_MAX_BUFFERED_TOTAL
}
fn default_shutdown_grace() -> Duration {
    DEFAULT_SHUTDOWN_GRACE
}

/// The `[limits]` table: what one client may cost the gateway. Every key is
/// optional; each must be more than 0.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct Limits {
    /// Largest request body; a bigger one is refused with 413. Default "4MiB".
    #[serde(default = "default_max_body", with = "units::size")]
    #[schemars(with = "SizeText")]
    pub max_body: u64,
    /// Requests of one client in flight at once; more wait for none, they are
    /// refused with 429. Default 32.
    #[serde(default = "default_max_concurrent")]
    #[schemars(range(min = 1))]
    pub max_concurrent: u32,
    /// Requests per second of one client (token bucket refill). Default 200.
    #[serde(default = "default_rate_per_second")]
    #[schemars(range(min = 1))]
    pub rate_per_second: u32,
    /// Requests one client may send at once above the rate (bucket size). Default 400.
    #[serde(default = "default_burst")]
    #[schemars(range(min = 1))]
    pub burst: u32,
    /// Time a connection has to send the request head (slow clients). Default "10s".
    #[serde(default = "default_header_timeout", with = "units::duration")]
    #[schemars(with = "DurationText")]
    pub header_timeout: Duration,
    /// Time a request has to send its body. Default "30s".
    #[serde(default = "default_body_timeout", with = "units::duration")]
    #[schemars(with = "DurationText")]
    pub body_timeout: Duration,
    /// MCP sessions one client may hold open. Default 64.
    #[serde(default = "default_max_sessions_per_client")]
    #[schemars(range(min = 1))]
    pub max_sessions_per_client: u32,
    /// Open GET (SSE) streams of one client. Default 1024.
    #[serde(default = "default_max_streams_per_client")]
    #[schemars(range(min = 1))]
    pub max_streams_per_client: u32,
    /// Sandboxes one client may have (live or kept: each task its own, each
    /// with a workspace on disk); a session that would make one more is
    /// refused with 429 until one is destroyed. Default 32.
    #[serde(default = "default_max_sandboxes_per_client")]
    #[schemars(range(min = 1))]
    pub max_sandboxes_per_client: u32,
    /// Bytes one session may hold for its client: notifications waiting
    /// for a GET stream, a stream's and a request's queues, answers not yet
    /// written. Past it a notification is dropped (a backlog drops its
    /// oldest first), counted and audited; an answer that does not fit
    /// ends its request with `http.buffer_full`. Default "32MiB".
    #[serde(default = "default_max_buffered_per_session", with = "units::size")]
    #[schemars(with = "SizeText")]
    pub max_buffered_per_session: u64,
    /// Bytes all sessions together may hold for their clients (the same
    /// rule when it is full). Default "512MiB".
    #[serde(default = "default_max_buffered_total", with = "units::size")]
    #[schemars(with = "SizeText")]
    pub max_buffered_total: u64,
    /// How long a stop (SIGTERM, SIGINT, SIGHUP) waits for the requests in
    /// flight, until the last byte of each answer is written; what is left
    /// then ends with an `http.stopped` error before the servers' input is
    /// closed. Default "10s".
    #[serde(default = "default_shutdown_grace", with = "units::duration")]
    #[schemars(with = "DurationText")]
    pub shutdown_grace: Duration,
}

impl Default for Limits {
    fn default() -> Self {
        Limits {
            max_body: default_max_body(),
            max_concurrent: default_max_concurrent(),
            rate_per_second: default_rate_per_second(),
            burst: default_burst(),
            header_timeout: default_header_timeout(),
            body_timeout: default_body_timeout(),
            max_sessions_per_client: default_max_sessions_per_client(),
            max_streams_per_client: default_max_streams_per_client(),
            max_sandboxes_per_client: default_max_sandboxes_per_client(),
            max_buffered_per_session: default_max_buffered_per_session(),
            max_buffered_total: default_max_buffered_total(),
            shutdown_grace: default_shutdown_grace(),
        }
    }
}

/// One client of the gateway.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Client {
    /// Its name, `[a-z0-9-]`, unique: in the audit log and in errors.
    pub name: String,
    /// Where its bearer token comes from; `None` only when `dangerously_allow_anonymous`.
    pub token: Option<TokenSource>,
    /// The servers it may use; `None` = every server.
    pub servers: Option<Vec<String>>,
    /// No token: anyone who can reach the (loopback) listener is this client.
    pub dangerously_allow_anonymous: bool,
}

/// Where a client's token comes from. Holds a name or a path, never the value.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord)]
pub enum TokenSource {
    /// An environment variable of the gateway.
    Env(String),
    /// A file, resolved against the config file's directory.
    File(PathBuf),
}

/// Why a token could not be loaded. Names the variable or file, never the value.
#[derive(Debug, thiserror::Error)]
pub enum TokenError {
    /// The variable is not set where the gateway runs.
    #[error("environment variable {var} is not set: export it where mcpbox serve runs")]
    EnvUnset {
        /// The variable.
        var: String,
    },
    /// The variable's value is not UTF-8.
    #[error("environment variable {var} is not valid utf-8")]
    EnvNotUnicode {
        /// The variable.
        var: String,
    },
    /// The file could not be opened or read.
    #[error("cannot read token file {}: {source}", path.display())]
    Read {
        /// The file.
        path: PathBuf,
        /// What went wrong.
        source: std::io::Error,
    },
    /// The path is a directory, device or pipe.
    #[error("token file {} is not a regular file", path.display())]
    NotAFile {
        /// The file.
        path: PathBuf,
    },
    /// Group or others may read or write the file: another user could learn
    /// the token, or set it to one they know.
    #[error("token file {} is open to group or others (mode {mode:03o}): run chmod 600 {}", path.display(), path.display())]
    Exposed {
        /// The file.
        path: PathBuf,
        /// Its permission bits.
        mode: u32,
    },
    /// The file is larger than [`MAX_TOKEN_FILE`].
    #[error("token file {} is larger than 64KiB: point from_file at the file holding only the token", path.display())]
    TooLarge {
        /// The file.
        path: PathBuf,
    },
    /// The token is empty (after one trailing newline is trimmed).
    #[error("the token in {from} is empty")]
    Empty {
        /// "environment variable X" or "token file P".
        from: String,
    },
    /// The token holds a character an `Authorization: Bearer` header cannot carry.
    #[error("the token in {from} holds a space, control or non-ASCII character: a token travels in an Authorization: Bearer header, so use printable ASCII only (e.g. openssl rand -hex 32)")]
    NotHeaderSafe {
        /// "environment variable X" or "token file P".
        from: String,
    },
}

impl TokenSource {
    /// Reads the token: the variable's value, or the file's contents with one
    /// trailing newline trimmed. Refuses an empty token, one that cannot travel
    /// in an `Authorization: Bearer` header, and a file that group or others may
    /// read or write. The error never holds the value.
    pub fn load(&self) -> Result<String, TokenError> {
        let (value, source) = match self {
            TokenSource::Env(var) => {
                let value = std::env::var(var).map_err(|e| match e {
                    std::env::VarError::NotPresent => TokenError::EnvUnset { var: var.clone() },
                    std::env::VarError::NotUnicode(_) => {
                        TokenError::EnvNotUnicode { var: var.clone() }
                    }
                })?;
                (value, format!("environment variable {var}"))
            }
            TokenSource::File(path) => (
                read_token_file(path)?,
                format!("token file {}", path.display()),
            ),
        };
        let value = trim_one_newline(value);
        if value.is_empty() {
            return Err(TokenError::Empty { from: source });
        }
        if !value.bytes().all(|b| b.is_ascii_graphic()) {
            return Err(TokenError::NotHeaderSafe { from: source });
        }
        Ok(value)
    }

    /// Where the token comes from, for messages: "environment variable X" or "token file P".
    pub fn describe(&self) -> String {
        match self {
            TokenSource::Env(var) => format!("environment variable {var}"),
            TokenSource::File(path) => format!("token file {}", path.display()),
        }
    }
}

fn read_token_file(path: &Path) -> Result<String, TokenError> {
    use std::io::Read;
    use std::os::unix::fs::PermissionsExt;
    let read_err = |source| TokenError::Read {
        path: path.to_path_buf(),
        source,
    };
    // Looked at before opening, so a FIFO never blocks the open.
    let meta = std::fs::metadata(path).map_err(read_err)?;
    if !meta.is_file() {
        return Err(TokenError::NotAFile {
            path: path.to_path_buf(),
        });
    }
    let file = std::fs::File::open(path).map_err(read_err)?;
    // The mode of the file that was opened, not of whatever the path names now.
    let meta = file.metadata().map_err(read_err)?;
    let mode = meta.permissions().mode() & 0o777;
    if mode & 0o066 != 0 {
        return Err(TokenError::Exposed {
            path: path.to_path_buf(),
            mode,
        });
    }
    let mut bytes = Vec::new();
    file.take(MAX_TOKEN_FILE + 1)
        .read_to_end(&mut bytes)
        .map_err(read_err)?;
    if bytes.len() as u64 > MAX_TOKEN_FILE {
        return Err(TokenError::TooLarge {
            path: path.to_path_buf(),
        });
    }
    // Not UTF-8 means not printable ASCII either: the same refusal.
    String::from_utf8(bytes).map_err(|_| TokenError::NotHeaderSafe {
        from: format!("token file {}", path.display()),
    })
}

fn trim_one_newline(mut s: String) -> String {
    if s.ends_with('\n') {
        s.pop();
        if s.ends_with('\r') {
            s.pop();
        }
    }
    s
}

/// One MCP server the gateway offers, at `/servers/<name>/mcp` and with its
/// tools as `<name>__<tool>` on `/mcp`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Server {
    /// Its name, `[a-z0-9-]`, unique.
    pub name: String,
    /// Its policy file, resolved against the config file's directory (for a
    /// server made from a template, the template's policy).
    pub policy: PathBuf,
    /// How to reach it.
    pub upstream: Upstream,
    /// Where its sandbox lives (always [`Placement::Sandbox`] for a `url` server).
    pub placement: Placement,
    /// The `[[templates]]` entry it is made from, by name.
    pub template: Option<String>,
    /// Its effective idle timeouts: the config's `[idle]` overlaid by the server's own.
    pub idle: Idle,
}

/// How the gateway reaches a server.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Upstream {
    /// A stdio server started in a sandbox built from the policy: the program
    /// (looked up inside the sandbox) and its arguments. Never empty.
    Command(Vec<String>),
    /// A remote Streamable HTTP MCP server (placement "outside": no sandbox;
    /// the policy's `[tools]`, `[secrets]` and `[network]` apply). `https://`,
    /// or `http://` to a loopback host; as written in the file.
    Url(String),
    /// A server built into mcpbox, run in the sandbox like a command
    /// server: its name (`sandbox`, the only one; [`BUILTINS`]).
    Builtin(String),
}

/// The servers built into mcpbox (`builtin = "..."`).
pub const BUILTINS: &[&str] = &["sandbox"];

impl ServeConfig {
    /// Reads and validates the config file. Relative paths in it resolve against
    /// its directory, made absolute, so the effective config holds absolute paths.
    pub fn load(path: &Path) -> Result<ServeConfig> {
        let text = std::fs::read_to_string(path).map_err(|e| {
            Diagnostic::new(path, None, "", format!("cannot read the serve config: {e}"))
                .with_hint("check the path of the config file")
        })?;
        let abs = std::path::absolute(path).unwrap_or_else(|_| path.to_path_buf());
        parse(&text, path, base_dir(&abs))
    }

    /// Validates a config given as text. `path` names the file in diagnostics;
    /// its parent directory is the base for relative paths (lexically, no I/O:
    /// pass an absolute path to get absolute paths back).
    #[allow(clippy::should_implement_trait)] // two arguments; not FromStr
    pub fn from_str(text: &str, path: &Path) -> Result<ServeConfig> {
        parse(text, path, base_dir(path))
    }

    /// The client of this name.
    pub fn client(&self, name: &str) -> Option<&Client> {
        self.clients.iter().find(|c| c.name == name)
    }

    /// The server of this name.
    pub fn server(&self, name: &str) -> Option<&Server> {
        self.servers.iter().find(|s| s.name == name)
    }

    /// The template of this name.
    pub fn template(&self, name: &str) -> Option<&Template> {
        self.templates.iter().find(|t| t.name == name)
    }

    /// Whether `client` may use the server named `server`: it exists, and the
    /// client's `servers` list (when it has one) names it.
    pub fn may_use(&self, client: &Client, server: &str) -> bool {
        self.server(server).is_some()
            && match &client.servers {
                None => true,
                Some(list) => list.iter().any(|s| s == server),
            }
    }

    /// The servers `client` may use, in file order (what `/mcp` aggregates for it).
    pub fn servers_for<'a>(&'a self, client: &'a Client) -> impl Iterator<Item = &'a Server> + 'a {
        self.servers
            .iter()
            .filter(move |s| self.may_use(client, &s.name))
    }

    /// The effective config as TOML: defaults filled in, paths resolved. It
    /// parses again to the same config.
    pub fn to_toml(&self) -> String {
        match toml::to_string(&ConfigFile::from(self)) {
            Ok(s) => s,
            Err(e) => format!("# could not print the effective config: {e}\n"),
        }
    }
}

/// The name a tool of `server` has on the aggregated endpoint: `<server>__<tool>`.
pub fn tool_name(server: &str, tool: &str) -> String {
    format!("{server}{NAME_SEPARATOR}{tool}")
}

/// Splits an aggregated tool name at its first `__` into (server, tool).
/// `None` when there is no separator or either side is empty.
pub fn split_tool_name(name: &str) -> Option<(&str, &str)> {
    let (server, tool) = name.split_once(NAME_SEPARATOR)?;
    (!server.is_empty() && !tool.is_empty()).then_some((server, tool))
}

/// True when `text` is TOML with a top-level `listen`, `clients` or `servers`
/// key: a serve config, not a policy. False for anything else, including text
/// that is not TOML (the policy parser then reports the syntax error).
pub fn is_serve_config(text: &str) -> bool {
    toml::from_str::<toml::Table>(text)
        .map(|t| TOP_LEVEL_KEYS.iter().any(|k| t.contains_key(*k)))
        .unwrap_or(false)
}

/// The JSON Schema of the serve config, generated from the types it is parsed with.
pub fn json_schema() -> serde_json::Value {
    let mut schema = schemars::schema_for!(ConfigFile).to_value();
    crate::strip_null(&mut schema);
    schema
}

fn base_dir(path: &Path) -> PathBuf {
    path.parent().map(Path::to_path_buf).unwrap_or_default()
}

// ---- the file as written ----

/// An `mcpbox serve` config: the HTTP gateway's listener, limits, clients and servers.
#[derive(Debug, Default, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
#[schemars(rename = "ServeConfig")]
struct ConfigFile {
    /// Where and how the gateway listens.
    #[serde(default)]
    listen: ListenFile,
    /// What one client may cost the gateway.
    #[serde(default)]
    limits: Limits,
    /// When an idle sandbox is paused, stopped and destroyed: the default for every
    /// sandboxed server (a server's own idle = { ... } replaces it key by key).
    #[serde(default)]
    idle: IdleFile,
    /// Who may connect: [[clients]] tables, at least one.
    #[serde(default)]
    clients: Vec<ClientFile>,
    /// What the gateway offers: [[servers]] tables, at least one.
    #[serde(default)]
    servers: Vec<ServerFile>,
    /// What a server's workspace starts from, and its policy: [[templates]] tables,
    /// named by a server's template = "...".
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    templates: Vec<TemplateFile>,
}

/// The `[idle]` table, or a server's idle = { ... }: how long a sandbox may go without
/// a message to or from its servers before each step. Where set, pause < stop < destroy.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
#[schemars(rename = "Idle")]
struct IdleFile {
    /// Freeze the sandbox (cgroup freezer; memory kept, no CPU) after this long, e.g.
    /// "5m"; "off": never. Default "5m".
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pause: Option<DurationOrOff>,
    /// Stop its processes after this long (the workspace is kept; the next call restarts
    /// the server on it); "off": never. Default "30m".
    #[serde(default, skip_serializing_if = "Option::is_none")]
    stop: Option<DurationOrOff>,
    /// Destroy it after this long (processes, cgroups and workspace; declared artifacts
    /// are exported first); "off": never. Default "off".
    #[serde(default, skip_serializing_if = "Option::is_none")]
    destroy: Option<DurationOrOff>,
}

impl IdleFile {
    /// `base` with the keys this table sets replaced.
    fn overlay(&self, base: Idle) -> Idle {
        Idle {
            pause: self.pause.map_or(base.pause, |d| d.0),
            stop: self.stop.map_or(base.stop, |d| d.0),
            destroy: self.destroy.map_or(base.destroy, |d| d.0),
        }
    }

    /// Every key set: what the effective config prints.
    fn full(idle: Idle) -> IdleFile {
        IdleFile {
            pause: Some(DurationOrOff(idle.pause)),
            stop: Some(DurationOrOff(idle.stop)),
            destroy: Some(DurationOrOff(idle.destroy)),
        }
    }
}

/// One `[[templates]]` table: name, policy and exactly one of base and snapshot.
#[derive(Debug, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
#[schemars(rename = "Template", transform = template_one_of)]
struct TemplateFile {
    /// Unique name: 1 to 64 of a-z, 0-9 and '-'. A server uses it with template = "name".
    #[serde(default)]
    #[schemars(length(min = 1, max = 64), pattern(r"^[a-z0-9-]+$"))]
    name: String,
    /// A directory copied into each new workspace's input; relative to the config file.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    base: Option<PathBuf>,
    /// A snapshot archive (made by `mcpbox sandboxes snapshot`) restored into each new
    /// workspace; relative to the config file.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    snapshot: Option<PathBuf>,
    /// The sandbox policy of every server made from this template, as for `mcpbox run`;
    /// relative to the config file.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    policy: Option<PathBuf>,
    /// Workspaces made ahead of demand, for each server made from this template: its
    /// folders, its volume image formatted and the base copied in, so that a new task's
    /// sandbox takes one instead of making its own; each is used once. 0 makes none.
    /// Default 2.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 0, max = 16))]
    ready: Option<u32>,
}

fn template_one_of(schema: &mut Schema) {
    require(schema, &["name", "policy"]);
    schema.insert(
        "oneOf".into(),
        serde_json::json!([{ "required": ["base"] }, { "required": ["snapshot"] }]),
    );
}

fn default_address_text() -> String {
    DEFAULT_ADDRESS.to_string()
}

/// The `[listen]` table.
#[derive(Debug, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
#[schemars(rename = "Listen")]
struct ListenFile {
    /// IP address and port to bind, e.g. "127.0.0.1:8787" or "[::1]:8787" (host names
    /// are not resolved). Default "127.0.0.1:8787": loopback only. A non-loopback
    /// address needs tls unless dangerously_allow_plaintext = true.
    #[serde(default = "default_address_text")]
    address: String,
    /// Serve HTTPS: { cert = "cert.pem", key = "key.pem" }, relative to the config file.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    tls: Option<TlsFile>,
    /// Accept a non-loopback address without tls: tokens and tool traffic then cross
    /// the network in clear. Default false.
    #[serde(default)]
    dangerously_allow_plaintext: bool,
    /// Extra Host header values accepted ("host" or "host:port"), e.g. a DNS name the
    /// gateway is reached by. Always accepted: the bind address and, for a loopback
    /// bind, localhost, 127.0.0.1 and [::1] with the port. Default none (DNS rebinding
    /// protection).
    #[serde(default)]
    allowed_hosts: Vec<String>,
    /// Origin header values accepted ("scheme://host[:port]") for browser clients.
    /// Default none: only the gateway's own origins.
    #[serde(default)]
    allowed_origins: Vec<String>,
}

impl Default for ListenFile {
    fn default() -> Self {
        ListenFile {
            address: default_address_text(),
            tls: None,
            dangerously_allow_plaintext: false,
            allowed_hosts: Vec::new(),
            allowed_origins: Vec::new(),
        }
    }
}

/// A certificate and its key, PEM files.
#[derive(Debug, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
#[schemars(rename = "Tls")]
struct TlsFile {
    /// Certificate chain (PEM); relative to the config file.
    cert: PathBuf,
    /// Private key (PEM); relative to the config file.
    key: PathBuf,
}

/// One `[[clients]]` table: exactly one of token and dangerously_allow_anonymous = true.
#[derive(Debug, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
#[schemars(rename = "Client", transform = client_one_of)]
struct ClientFile {
    /// Unique name: 1 to 64 of a-z, 0-9 and '-'. Shown in the audit log.
    #[serde(default)]
    #[schemars(length(min = 1, max = 64), pattern(r"^[a-z0-9-]+$"))]
    name: String,
    /// The client's bearer token: { from_env = "VAR" } or { from_file = "path" }.
    /// Compared in constant time, never logged.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    token: Option<TokenFile>,
    /// Names of the servers this client may use. Default: every server.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    servers: Option<Vec<String>>,
    /// No token: anyone who can reach the listener is this client. Refused unless
    /// listen.address is loopback. Default false.
    #[serde(default)]
    dangerously_allow_anonymous: bool,
}

/// Marks keys required in a schema. They are optional to serde (`default`) only
/// so that validation can say which table lacks them, with its line.
fn require(schema: &mut Schema, keys: &[&str]) {
    if let Some(props) = schema
        .get_mut("properties")
        .and_then(serde_json::Value::as_object_mut)
    {
        for key in keys {
            if let Some(serde_json::Value::Object(p)) = props.get_mut(*key) {
                p.remove("default");
            }
        }
    }
    schema.insert("required".into(), serde_json::json!(keys));
}

fn client_one_of(schema: &mut Schema) {
    require(schema, &["name"]);
    schema.insert(
        "oneOf".into(),
        serde_json::json!([
            { "required": ["token"] },
            {
                "required": ["dangerously_allow_anonymous"],
                "properties": { "dangerously_allow_anonymous": { "const": true } }
            }
        ]),
    );
}

/// A token source: exactly one of from_env and from_file.
#[derive(Debug, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
#[schemars(rename = "Token", transform = token_one_of)]
struct TokenFile {
    /// Environment variable of the gateway holding the token.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    from_env: Option<String>,
    /// File holding the token (one trailing newline trimmed), relative to the config
    /// file; it must not be readable or writable by group or others.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    from_file: Option<PathBuf>,
}

fn token_one_of(schema: &mut Schema) {
    schema.insert(
        "oneOf".into(),
        serde_json::json!([{ "required": ["from_env"] }, { "required": ["from_file"] }]),
    );
}

/// One `[[servers]]` table: exactly one of command, url and builtin.
#[derive(Debug, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
#[schemars(rename = "Server", transform = server_one_of)]
struct ServerFile {
    /// Unique name: 1 to 64 of a-z, 0-9 and '-' (no '_', so "<server>__<tool>" splits
    /// at its first "__"). In the URL /servers/<name>/mcp and as the tool prefix on /mcp.
    #[serde(default)]
    #[schemars(length(min = 1, max = 64), pattern(r"^[a-z0-9-]+$"))]
    name: String,
    /// The server's sandbox policy, as for `mcpbox run`; relative to the config file.
    /// Exactly one of policy and template.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    policy: Option<PathBuf>,
    /// The [[templates]] entry this server is made from, by name: its workspace starts
    /// from the template's base and the template's policy applies. Exactly one of
    /// policy and template; not for a url server.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    template: Option<String>,
    /// A stdio server run in the sandbox: program and arguments, no shell.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    command: Option<Vec<String>>,
    /// A remote Streamable HTTP MCP server (runs outside any sandbox; the policy's
    /// [tools], [secrets] and [network] apply): https://, or http:// to a loopback host.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    url: Option<String>,
    /// A server built into mcpbox, run in the sandbox as a command server is:
    /// "sandbox" (exec, run_code, files, background jobs, snapshots; docs/builtin.md).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(extend("enum" = ["sandbox"]))]
    builtin: Option<String>,
    /// Where a command server's sandbox lives: "sandbox" (default: its own sandbox per
    /// agent) or "shared" (one sandbox per agent holding every shared server). A url
    /// server has no sandbox, so "shared" is refused for it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    placement: Option<Placement>,
    /// This server's own idle timeouts: each key set replaces that key of [idle].
    /// Not for a url server.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    idle: Option<IdleFile>,
}

fn server_one_of(schema: &mut Schema) {
    require(schema, &["name"]);
    schema.insert(
        "oneOf".into(),
        serde_json::json!([{ "required": ["command"] }, { "required": ["url"] }, { "required": ["builtin"] }]),
    );
    schema.insert(
        "allOf".into(),
        serde_json::json!([{ "oneOf": [{ "required": ["policy"] }, { "required": ["template"] }] }]),
    );
}

impl From<&ServeConfig> for ConfigFile {
    fn from(c: &ServeConfig) -> Self {
        let l = &c.listen;
        ConfigFile {
            listen: ListenFile {
                address: l.address.to_string(),
                tls: l.tls.as_ref().map(|t| TlsFile {
                    cert: t.cert.clone(),
                    key: t.key.clone(),
                }),
                dangerously_allow_plaintext: l.dangerously_allow_plaintext,
                allowed_hosts: l.allowed_hosts.clone(),
                allowed_origins: l.allowed_origins.clone(),
            },
            limits: c.limits,
            idle: IdleFile::full(c.idle),
            clients: c
                .clients
                .iter()
                .map(|cl| ClientFile {
                    name: cl.name.clone(),
                    token: cl.token.as_ref().map(|t| match t {
                        TokenSource::Env(v) => TokenFile {
                            from_env: Some(v.clone()),
                            from_file: None,
                        },
                        TokenSource::File(p) => TokenFile {
                            from_env: None,
                            from_file: Some(p.clone()),
                        },
                    }),
                    servers: cl.servers.clone(),
                    dangerously_allow_anonymous: cl.dangerously_allow_anonymous,
                })
                .collect(),
            servers: c
                .servers
                .iter()
                .map(|s| {
                    let (command, url, builtin, placement) = match &s.upstream {
                        Upstream::Command(argv) => {
                            (Some(argv.clone()), None, None, Some(s.placement))
                        }
                        Upstream::Url(u) => (None, Some(u.clone()), None, None),
                        Upstream::Builtin(b) => (None, None, Some(b.clone()), Some(s.placement)),
                    };
                    // the template brings the policy: printing both would be refused
                    let policy = match s.template {
                        Some(_) => None,
                        None => Some(s.policy.clone()),
                    };
                    // a server's own idle is printed, whole, only where it differs
                    let idle = (url.is_none() && s.idle != c.idle).then(|| IdleFile::full(s.idle));
                    ServerFile {
                        name: s.name.clone(),
                        policy,
                        template: s.template.clone(),
                        command,
                        url,
                        builtin,
                        placement,
                        idle,
                    }
                })
                .collect(),
            templates: c
                .templates
                .iter()
                .map(|t| {
                    let (base, snapshot) = match &t.base {
                        TemplateBase::Dir(p) => (Some(p.clone()), None),
                        TemplateBase::Snapshot(p) => (None, Some(p.clone())),
                    };
                    TemplateFile {
                        name: t.name.clone(),
                        base,
                        snapshot,
                        policy: Some(t.policy.clone()),
                        ready: Some(t.ready),
                    }
                })
                .collect(),
        }
    }
}

// ---- validation ----

fn parse(text: &str, path: &Path, base: PathBuf) -> Result<ServeConfig> {
    const SYNTAX_HINT: &str = "see docs/serve.md for the serve config syntax";
    let locs = Locations::build(text)
        .map_err(|e| syntax_diagnostic(text, path, &e).with_hint(SYNTAX_HINT))?;
    let file: ConfigFile =
        toml::from_str(text).map_err(|e| serde_diagnostic(text, path, &locs, &e))?;
    let ctx = Ctx {
        file: path,
        locs: &locs,
        base,
        kind: "config file",
    };
    validate(file, path, &ctx)
}

impl Ctx<'_> {
    /// A refusal at `key`, shown at `key`'s line or, when the key is absent
    /// (a missing key), at its table's.
    fn err_in(
        &self,
        key: &str,
        table: &str,
        message: impl Into<String>,
        hint: impl Into<String>,
    ) -> Diagnostic {
        let location = self.locs.get(key).or_else(|| self.locs.get(table));
        Diagnostic::new(self.file, location, key, message).with_hint(hint)
    }
}

const NAME_HINT: &str = "use 1 to 64 of a-z, 0-9 and '-': names appear in URLs (/servers/<name>/mcp) and as the tool prefix <server>__<tool>, and leaving out '_' keeps that split unambiguous";

fn check_name(ctx: &Ctx, table: &str, name: &str, what: &str) -> Result<()> {
    check_name_with(ctx, table, name, what, NAME_HINT)
}

const TEMPLATE_NAME_HINT: &str =
    "use 1 to 64 of a-z, 0-9 and '-', e.g. name = \"py\"; a server names it with template = \"py\"";

fn check_name_with(ctx: &Ctx, table: &str, name: &str, what: &str, hint: &str) -> Result<()> {
    let key = format!("{table}.name");
    if name.is_empty() {
        return Err(ctx.err_in(
            &key,
            table,
            format!("{what} has no name"),
            format!("add name = \"...\"; {hint}"),
        ));
    }
    let ok = name.len() <= MAX_NAME
        && name
            .bytes()
            .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-');
    if !ok {
        return Err(ctx.err(
            &key,
            format!("invalid {what} name \"{}\"", name.escape_debug()),
            hint,
        ));
    }
    Ok(())
}

fn validate(f: ConfigFile, path: &Path, ctx: &Ctx) -> Result<ServeConfig> {
    let listen = validate_listen(f.listen, ctx)?;
    validate_limits(&f.limits, ctx)?;
    let idle = validate_idle(ctx, &f.idle)?;
    let templates = validate_templates(ctx, f.templates)?;

    // [[servers]]
    if f.servers.is_empty() {
        return Err(ctx.err(
            "servers",
            "no server is configured",
            "add a [[servers]] table with name, policy and command (or url); see docs/serve.md",
        ));
    }
    let mut servers: Vec<Server> = Vec::with_capacity(f.servers.len());
    for (i, s) in f.servers.into_iter().enumerate() {
        let table = format!("servers[{i}]");
        check_name(ctx, &table, &s.name, "server")?;
        if let Some(first) = servers.iter().position(|o| o.name == s.name) {
            return Err(ctx.err(
                &format!("{table}.name"),
                format!("server name \"{}\" is also servers[{first}]", s.name),
                "give each server its own name",
            ));
        }
        if let Some(b) = &s.builtin {
            let key = format!("{table}.builtin");
            if s.command.is_some() || s.url.is_some() {
                return Err(ctx.err_in(
                    &key,
                    &table,
                    "a server has builtin and also command or url",
                    "keep one: builtin = \"sandbox\" (mcpbox's own server), command (a stdio server) or url (a remote one)",
                ));
            }
            if !BUILTINS.contains(&b.as_str()) {
                return Err(ctx.err(
                    &key,
                    format!("no built-in server named \"{}\"", b.escape_debug()),
                    format!("use one of: {}", BUILTINS.join(", ")),
                ));
            }
        }
        let upstream = match (s.command, s.url) {
            (None, None) if s.builtin.is_some() => Upstream::Builtin(s.builtin.unwrap_or_default()),
            (Some(_), Some(_)) => {
                return Err(ctx.err_in(
                    &format!("{table}.url"),
                    &table,
                    "a server has both command and url",
                    "keep command (a stdio server run in the sandbox) or url (a remote server), not both",
                ))
            }
            (None, None) => {
                return Err(ctx.err_in(
                    &format!("{table}.command"),
                    &table,
                    format!("server \"{}\" has neither command nor url", s.name),
                    "add command = [\"program\", \"arg\"] for a stdio server run in the sandbox, url = \"https://...\" for a remote one, or builtin = \"sandbox\" for mcpbox's own sandbox server",
                ))
            }
            (Some(argv), None) => {
                let key = format!("{table}.command");
                if !matches!(argv.first(), Some(p) if !p.is_empty()) {
                    return Err(ctx.err(
                        &key,
                        "command needs a program",
                        "write the program and its arguments, e.g. [\"node\", \"server.js\"]",
                    ));
                }
                if argv.iter().any(|a| a.contains('\0')) {
                    return Err(ctx.err(
                        &key,
                        "command contains a NUL character",
                        "arguments cannot hold NUL",
                    ));
                }
                Upstream::Command(argv)
            }
            (None, Some(url)) => {
                check_url(ctx, &format!("{table}.url"), &url)?;
                Upstream::Url(url)
            }
        };
        let is_url = matches!(upstream, Upstream::Url(_));
        let policy_key = format!("{table}.policy");
        let template_key = format!("{table}.template");
        let (policy, template) = match (s.policy, s.template) {
            (Some(_), Some(_)) => {
                return Err(ctx.err(
                    &template_key,
                    format!("server \"{}\" has both policy and template", s.name),
                    "the template brings the policy: remove policy = ..., or remove template = ... and keep the policy",
                ))
            }
            (Some(p), None) => (ctx.host_path(&policy_key, &p)?, None),
            (None, Some(name)) => {
                if is_url {
                    return Err(ctx.err(
                        &template_key,
                        format!("url server \"{}\" has a template", s.name),
                        "a remote server has no sandbox and so no workspace to start from: remove template and give policy = \"NAME.toml\"",
                    ));
                }
                let Some(t) = templates.iter().find(|t| t.name == name) else {
                    let hint = if templates.is_empty() {
                        "no [[templates]] is configured: add one with name, base (or snapshot) and policy, or give the server policy = \"NAME.toml\" instead".to_string()
                    } else {
                        let known: Vec<&str> = templates.iter().map(|t| t.name.as_str()).collect();
                        format!("configured templates: {}", known.join(", "))
                    };
                    return Err(ctx.err(
                        &template_key,
                        format!("no template is named \"{}\"", name.escape_debug()),
                        hint,
                    ));
                };
                (t.policy.clone(), Some(name))
            }
            (None, None) => {
                return Err(ctx.err_in(
                    &policy_key,
                    &table,
                    format!("server \"{}\" has no policy", s.name),
                    "add policy = \"NAME.toml\": the sandbox policy, as for mcpbox run (its [tools], [secrets] and [network] also apply to a url server); or template = \"NAME\" to take a [[templates]] entry's policy",
                ))
            }
        };
        let placement = s.placement.unwrap_or_default();
        if is_url && placement != Placement::Sandbox {
            return Err(ctx.err(
                &format!("{table}.placement"),
                format!("url server \"{}\" has placement = \"shared\"", s.name),
                "a remote server runs outside any sandbox, so it has no placement: remove the key",
            ));
        }
        let idle = match &s.idle {
            None => idle,
            Some(own) => {
                if is_url {
                    return Err(ctx.err(
                        &format!("{table}.idle"),
                        format!("url server \"{}\" has idle timeouts", s.name),
                        "a remote server has no sandbox to pause, stop or destroy: remove the key",
                    ));
                }
                let effective = own.overlay(idle);
                check_idle_order(
                    ctx,
                    &format!("{table}.idle"),
                    own,
                    effective,
                    "inherited from [idle]",
                )?;
                effective
            }
        };
        servers.push(Server {
            name: s.name,
            policy,
            upstream,
            placement,
            template,
            idle,
        });
    }

    // [[clients]]
    if f.clients.is_empty() {
        return Err(ctx.err(
            "clients",
            "no client is configured",
            "add a [[clients]] table with name and token = { from_env = \"VAR\" }; see docs/serve.md",
        ));
    }
    let mut clients: Vec<Client> = Vec::with_capacity(f.clients.len());
    let mut token_owner: BTreeMap<TokenSource, usize> = BTreeMap::new();
    for (i, c) in f.clients.into_iter().enumerate() {
        let table = format!("clients[{i}]");
        check_name(ctx, &table, &c.name, "client")?;
        if let Some(first) = clients.iter().position(|o| o.name == c.name) {
            return Err(ctx.err(
                &format!("{table}.name"),
                format!("client name \"{}\" is also clients[{first}]", c.name),
                "give each client its own name",
            ));
        }
        let anon_key = format!("{table}.dangerously_allow_anonymous");
        let token = match (c.token, c.dangerously_allow_anonymous) {
            (Some(_), true) => {
                return Err(ctx.err(
                    &anon_key,
                    format!("client \"{}\" has a token and dangerously_allow_anonymous = true", c.name),
                    "remove the token (an anonymous client needs none) or remove dangerously_allow_anonymous",
                ))
            }
            (None, false) => {
                return Err(ctx.err_in(
                    &format!("{table}.token"),
                    &table,
                    format!("client \"{}\" has no token", c.name),
                    "add token = { from_env = \"VAR\" } or token = { from_file = \"path\" }; dangerously_allow_anonymous = true lets a loopback client in without one",
                ))
            }
            (None, true) => {
                if !listen.is_loopback() {
                    return Err(ctx.err(
                        &anon_key,
                        format!(
                            "anonymous client \"{}\" on the non-loopback address {}",
                            c.name, listen.address
                        ),
                        "give the client a token, or listen on a loopback address such as 127.0.0.1:8787 (anyone who can reach the listener would be this client)",
                    ));
                }
                None
            }
            (Some(t), false) => {
                let source = token_source(ctx, &format!("{table}.token"), t)?;
                if let Some(first) = token_owner.insert(source.clone(), i) {
                    return Err(ctx.err(
                        &format!("{table}.token"),
                        format!("clients[{first}] has the same token ({})", source.describe()),
                        "give each client its own token, so the token says who is calling",
                    ));
                }
                Some(source)
            }
        };
        if let Some(list) = &c.servers {
            let key = format!("{table}.servers");
            if list.is_empty() {
                return Err(ctx.err(
                    &key,
                    format!("client \"{}\" may use no server", c.name),
                    "list the servers it may use, or leave servers out to allow every server",
                ));
            }
            for (j, name) in list.iter().enumerate() {
                let item = format!("{key}[{j}]");
                if !servers.iter().any(|s| &s.name == name) {
                    let known: Vec<&str> = servers.iter().map(|s| s.name.as_str()).collect();
                    return Err(ctx.err(
                        &item,
                        format!("no server is named \"{}\"", name.escape_debug()),
                        format!("configured servers: {}", known.join(", ")),
                    ));
                }
                if list[..j].contains(name) {
                    return Err(ctx.err(
                        &item,
                        format!("{name} is listed twice"),
                        "list each server once",
                    ));
                }
            }
        }
        clients.push(Client {
            name: c.name,
            token,
            servers: c.servers,
            dangerously_allow_anonymous: c.dangerously_allow_anonymous,
        });
    }

    Ok(ServeConfig {
        path: path.to_path_buf(),
        listen,
        limits: f.limits,
        clients,
        servers,
        idle,
        templates,
    })
}

/// The `[idle]` table over the defaults: no 0 (that is "off"), and in order.
fn validate_idle(ctx: &Ctx, f: &IdleFile) -> Result<Idle> {
    let effective = f.overlay(Idle::default());
    check_idle_order(ctx, "idle", f, effective, "the default")?;
    Ok(effective)
}

/// Checks an idle table `own` (at `table`) whose effective value is `effective`:
/// no key set to 0, and where set, pause < stop < destroy. A refusal names a key
/// `own` sets, the later one of the pair that breaks the order when `own` sets it;
/// `inherited_from` says where the keys `own` leaves out come from.
fn check_idle_order(
    ctx: &Ctx,
    table: &str,
    own: &IdleFile,
    effective: Idle,
    inherited_from: &str,
) -> Result<()> {
    let steps = [
        ("pause", own.pause.is_some(), effective.pause),
        ("stop", own.stop.is_some(), effective.stop),
        ("destroy", own.destroy.is_some(), effective.destroy),
    ];
    for (name, set, value) in steps {
        if set && value.is_some_and(|d| d.is_zero()) {
            return Err(ctx.err(
                &format!("{table}.{name}"),
                format!("idle {name} is 0"),
                format!("write a duration such as \"5m\", or {name} = \"off\" to never {name}"),
            ));
        }
    }
    for later in 1..steps.len() {
        for earlier in 0..later {
            let (a, a_set, a_value) = steps[earlier];
            let (b, b_set, b_value) = steps[later];
            let (Some(av), Some(bv)) = (a_value, b_value) else {
                continue;
            };
            if av < bv {
                continue;
            }
            // point at what this table wrote: the later key if it wrote it
            let (key, other, other_set) = if b_set { (b, a, a_set) } else { (a, b, b_set) };
            let note = if other_set {
                String::new()
            } else {
                format!("; {other} is {inherited_from}")
            };
            return Err(ctx.err(
                &format!("{table}.{key}"),
                format!(
                    "idle {b} ({}) is not after {a} ({}){note}",
                    units::format_duration(bv),
                    units::format_duration(av),
                ),
                format!("each step comes after the one before: pause < stop < destroy; make {b} longer than {a}, or set one of them to \"off\""),
            ));
        }
    }
    Ok(())
}

/// The `[[templates]]`: names, exactly one base, a policy.
fn validate_templates(ctx: &Ctx, files: Vec<TemplateFile>) -> Result<Vec<Template>> {
    let mut templates: Vec<Template> = Vec::with_capacity(files.len());
    for (i, t) in files.into_iter().enumerate() {
        let table = format!("templates[{i}]");
        check_name_with(ctx, &table, &t.name, "template", TEMPLATE_NAME_HINT)?;
        if let Some(first) = templates.iter().position(|o| o.name == t.name) {
            return Err(ctx.err(
                &format!("{table}.name"),
                format!("template name \"{}\" is also templates[{first}]", t.name),
                "give each template its own name",
            ));
        }
        const BASE_HINT: &str = "write exactly one of base = \"dir\" (a directory copied into each new workspace's input) or snapshot = \"file.tar.gz\" (an archive made by mcpbox sandboxes snapshot)";
        let base = match (t.base, t.snapshot) {
            (Some(_), Some(_)) => {
                return Err(ctx.err(
                    &format!("{table}.snapshot"),
                    format!("template \"{}\" has both base and snapshot", t.name),
                    BASE_HINT,
                ))
            }
            (None, None) => {
                return Err(ctx.err_in(
                    &format!("{table}.base"),
                    &table,
                    format!("template \"{}\" has neither base nor snapshot", t.name),
                    BASE_HINT,
                ))
            }
            (Some(dir), None) => TemplateBase::Dir(ctx.host_path(&format!("{table}.base"), &dir)?),
            (None, Some(file)) => {
                TemplateBase::Snapshot(ctx.host_path(&format!("{table}.snapshot"), &file)?)
            }
        };
        let policy_key = format!("{table}.policy");
        let policy = match t.policy {
            Some(p) => ctx.host_path(&policy_key, &p)?,
            None => {
                return Err(ctx.err_in(
                    &policy_key,
                    &table,
                    format!("template \"{}\" has no policy", t.name),
                    "add policy = \"NAME.toml\": the sandbox policy of every server made from this template",
                ))
            }
        };
        let ready = t.ready.unwrap_or(DEFAULT_READY);
        if ready > MAX_READY {
            return Err(ctx.err(
                &format!("{table}.ready"),
                format!("template \"{}\" asks for {ready} ready workspaces, more than {MAX_READY}", t.name),
                format!("each ready workspace holds a volume image and a copy of the base on disk until a new task uses it: ask for at most {MAX_READY} (0 for none)"),
            ));
        }
        templates.push(Template {
            name: t.name,
            base,
            policy,
            ready,
        });
    }
    Ok(templates)
}

fn token_source(ctx: &Ctx, key: &str, t: TokenFile) -> Result<TokenSource> {
    const HINT: &str =
        "write exactly one of token = { from_env = \"VAR\" } or token = { from_file = \"path\" }";
    match (t.from_env, t.from_file) {
        (Some(_), Some(_)) => Err(ctx.err(key, "token has two sources", HINT)),
        (None, None) => Err(ctx.err(key, "token has no source", HINT)),
        (Some(var), None) => {
            check_valid_env_name(ctx, &format!("{key}.from_env"), &var)?;
            Ok(TokenSource::Env(var))
        }
        (None, Some(p)) => Ok(TokenSource::File(
            ctx.host_path(&format!("{key}.from_file"), &p)?,
        )),
    }
}

fn validate_listen(l: ListenFile, ctx: &Ctx) -> Result<Listen> {
    let address = parse_address(ctx, &l.address)?;
    let tls = match l.tls {
        Some(t) => Some(Tls {
            cert: ctx.host_path("listen.tls.cert", &t.cert)?,
            key: ctx.host_path("listen.tls.key", &t.key)?,
        }),
        None => None,
    };
    if tls.is_some() && l.dangerously_allow_plaintext {
        return Err(ctx.err(
            "listen.dangerously_allow_plaintext",
            "dangerously_allow_plaintext is set and so is tls",
            "remove dangerously_allow_plaintext: with tls the gateway serves HTTPS only",
        ));
    }
    if tls.is_none() && !address.ip().is_loopback() && !l.dangerously_allow_plaintext {
        return Err(ctx.err_in(
            "listen.address",
            "listen",
            format!("{address} is not a loopback address and [listen] has no tls"),
            "add tls = { cert = \"cert.pem\", key = \"key.pem\" }, or listen on 127.0.0.1; dangerously_allow_plaintext = true sends tokens in clear",
        ));
    }
    let mut allowed_hosts = Vec::with_capacity(l.allowed_hosts.len());
    for (i, h) in l.allowed_hosts.iter().enumerate() {
        allowed_hosts.push(check_host_value(
            ctx,
            &format!("listen.allowed_hosts[{i}]"),
            h,
        )?);
    }
    let mut allowed_origins = Vec::with_capacity(l.allowed_origins.len());
    for (i, o) in l.allowed_origins.iter().enumerate() {
        allowed_origins.push(check_origin(
            ctx,
            &format!("listen.allowed_origins[{i}]"),
            o,
        )?);
    }
    Ok(Listen {
        address,
        tls,
        dangerously_allow_plaintext: l.dangerously_allow_plaintext,
        allowed_hosts,
        allowed_origins,
    })
}

fn parse_address(ctx: &Ctx, s: &str) -> Result<SocketAddr> {
    if let Ok(a) = s.parse::<SocketAddr>() {
        return Ok(a);
    }
    const KEY: &str = "listen.address";
    let shown = s.escape_debug();
    match s.parse::<IpAddr>() {
        Ok(IpAddr::V4(_)) => {
            return Err(ctx.err(
                KEY,
                format!("\"{shown}\" has no port"),
                "write an IP address and a port, e.g. \"127.0.0.1:8787\"",
            ))
        }
        Ok(IpAddr::V6(_)) => {
            return Err(ctx.err(
                KEY,
                format!("\"{shown}\" has no port"),
                "write an IPv6 address in brackets, then the port, e.g. \"[::1]:8787\"",
            ))
        }
        Err(_) => {}
    }
    let (host, port) = s.rsplit_once(':').unwrap_or((s, ""));
    let port = if port.parse::<u16>().is_ok() {
        port
    } else {
        "8787"
    };
    let hint = if host.eq_ignore_ascii_case("localhost") {
        format!("host names are not resolved: write \"127.0.0.1:{port}\" (or \"[::1]:{port}\")")
    } else if host.contains(':') && !host.starts_with('[') {
        "write an IPv6 address in brackets, e.g. \"[::1]:8787\"".to_string()
    } else {
        format!(
            "write an IP address and a port, e.g. \"127.0.0.1:{port}\" or \"[::1]:{port}\"; host names are not resolved"
        )
    };
    Err(ctx.err(KEY, format!("\"{shown}\" is not an ip:port address"), hint))
}

fn validate_limits(l: &Limits, ctx: &Ctx) -> Result<()> {
    let zero: [(&str, bool); 12] = [
        ("max_body", l.max_body == 0),
        ("max_concurrent", l.max_concurrent == 0),
        ("rate_per_second", l.rate_per_second == 0),
        ("burst", l.burst == 0),
        ("header_timeout", l.header_timeout.is_zero()),
        ("body_timeout", l.body_timeout.is_zero()),
        ("max_sessions_per_client", l.max_sessions_per_client == 0),
        ("max_streams_per_client", l.max_streams_per_client == 0),
        ("max_sandboxes_per_client", l.max_sandboxes_per_client == 0),
        ("max_buffered_per_session", l.max_buffered_per_session == 0),
        ("max_buffered_total", l.max_buffered_total == 0),
        ("shutdown_grace", l.shutdown_grace.is_zero()),
    ];
    for (name, is_zero) in zero {
        if is_zero {
            return Err(ctx.err(
                &format!("limits.{name}"),
                format!("{name} is 0, which would refuse every request"),
                "use a value above 0, or leave the key out for the default (docs/serve.md)",
            ));
        }
    }
    if l.max_buffered_per_session > l.max_buffered_total {
        return Err(ctx.err(
            "limits.max_buffered_per_session",
            format!(
                "max_buffered_per_session ({}) is more than max_buffered_total ({})",
                l.max_buffered_per_session, l.max_buffered_total
            ),
            "one session cannot hold more than the whole gateway: lower it or raise max_buffered_total",
        ));
    }
    Ok(())
}

/// The parts of an `http(s)://host[:port]...` URL this module needs.
struct UrlParts<'a> {
    https: bool,
    /// Without brackets for IPv6.
    host: &'a str,
    /// What follows the authority (path, query, fragment).
    rest: &'a str,
}

/// Splits a URL, or says what is wrong with it (message, hint): the
/// config checker's messages for the common mistakes, then
/// [`crate::url::host_port`]'s check.
fn split_url(s: &str) -> std::result::Result<UrlParts<'_>, (String, String)> {
    let shown = s.escape_debug();
    const EXAMPLE: &str = "write a URL such as \"https://tickets.internal/mcp\"";
    if s.chars().any(|c| c.is_whitespace() || c.is_control()) {
        return Err((
            format!("\"{shown}\" contains a space or control character"),
            EXAMPLE.into(),
        ));
    }
    let Some((scheme, after)) = s.split_once("://") else {
        return Err((format!("\"{shown}\" is not a URL"), EXAMPLE.into()));
    };
    let https = if scheme.eq_ignore_ascii_case("https") {
        true
    } else if scheme.eq_ignore_ascii_case("http") {
        false
    } else {
        return Err((
            format!("unsupported scheme \"{}\"", scheme.escape_debug()),
            "use https:// (or http:// to a loopback host)".into(),
        ));
    };
    let end = after.find(['/', '?', '#']).unwrap_or(after.len());
    let (authority, rest) = after.split_at(end);
    if authority.contains('@') {
        return Err((
            "the URL holds credentials (user@ or user:password@)".into(),
            "remove them: a URL ends up in logs; put the upstream credential in the server policy's [secrets]".into(),
        ));
    }
    let bad_host = || {
        (
            format!("\"{shown}\" has no valid host"),
            "write a host name or IP address after the scheme, e.g. \"https://tickets.internal:8443/mcp\"".to_string(),
        )
    };
    let (host, port) = if let Some(v6) = authority.strip_prefix('[') {
        let (host, after) = v6.split_once(']').ok_or_else(bad_host)?;
        if host.parse::<std::net::Ipv6Addr>().is_err() {
            return Err(bad_host());
        }
        let port = match after {
            "" => None,
            p => Some(p.strip_prefix(':').ok_or_else(bad_host)?),
        };
        (host, port)
    } else {
        match authority.split_once(':') {
            Some((h, p)) => (h, Some(p)),
            None => (authority, None),
        }
    };
    let host_ok = !host.is_empty()
        && (host.contains(':')
            || host
                .bytes()
                .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'.' | b'-' | b'_')));
    if !host_ok {
        return Err(bad_host());
    }
    if let Some(p) = port {
        if !matches!(p.parse::<u16>(), Ok(n) if n > 0) {
            return Err((
                format!("\"{shown}\" has an invalid port"),
                "write a port from 1 to 65535, e.g. \"https://tickets.internal:8443/mcp\"".into(),
            ));
        }
    }
    // Last, the one strict reader (crate::url) that decisions use: what it
    // refuses (a backslash anywhere, say) is refused here too, so that a
    // URL this check lets through is read the same way everywhere.
    if let Err(why) = crate::url::host_port(s) {
        return Err((format!("\"{shown}\": {why}"), EXAMPLE.into()));
    }
    Ok(UrlParts { https, host, rest })
}

/// True for localhost, 127.0.0.0/8 and ::1.
fn is_loopback_host(host: &str) -> bool {
    host.eq_ignore_ascii_case("localhost")
        || host.parse::<IpAddr>().is_ok_and(|ip| ip.is_loopback())
}

fn check_url(ctx: &Ctx, key: &str, url: &str) -> Result<()> {
    let parts = split_url(url).map_err(|(m, h)| ctx.err(key, m, h))?;
    if !parts.https && !is_loopback_host(parts.host) {
        return Err(ctx.err(
            key,
            format!("plain http to {}, which is not a loopback host", parts.host),
            "use https:// (http:// is accepted only for localhost, 127.0.0.0/8 and [::1]): the upstream credential and every tool call would cross the network in clear",
        ));
    }
    Ok(())
}

/// A `Host` header value: `host` or `host:port`, lowercased.
fn check_host_value(ctx: &Ctx, key: &str, h: &str) -> Result<String> {
    let lower = h.to_ascii_lowercase();
    // reuse the URL splitter: a Host value is a URL's authority
    let as_url = format!("http://{lower}");
    match split_url(&as_url) {
        Ok(p) if p.rest.is_empty() && !h.contains('@') => Ok(lower),
        _ => Err(ctx.err(
            key,
            format!("\"{}\" is not a Host header value", h.escape_debug()),
            "write a host name, optionally with its port, e.g. \"mcp.example.com\" or \"mcp.example.com:8443\" (no scheme, no path)",
        )),
    }
}

/// An `Origin` value: `scheme://host[:port]`, lowercased.
fn check_origin(ctx: &Ctx, key: &str, o: &str) -> Result<String> {
    let lower = o.to_ascii_lowercase();
    match split_url(&lower) {
        Ok(p) if p.rest.is_empty() => Ok(lower),
        _ => Err(ctx.err(
            key,
            format!("\"{}\" is not an origin", o.escape_debug()),
            "write scheme://host[:port] with no path or trailing '/', e.g. \"https://app.example.com\"",
        )),
    }
}

#[cfg(test)]
mod tests;
