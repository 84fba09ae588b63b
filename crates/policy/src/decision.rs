//! The one decision vocabulary of mcpbox: every layer that lets something
//! through, asks a human or refuses (tool policy, the relay, the egress
//! proxy, the audit log) speaks in these types.
//!
//! - [`Verdict`] is ordered: `Allow < Approve < Deny`, so "the strictest
//!   wins" is `max`.
//! - [`Reason`] is the catalogue of machine-readable reason codes. Each code
//!   has a stable string (`as_str`, what clients, logs and the audit log
//!   see) and a one-line meaning; `docs/reasons.md` lists them all (a test
//!   keeps the two in step).
//! - [`Decision`] is a verdict with its reason and its source (the policy
//!   key or component that made it).

use serde::{Deserialize, Serialize};

pub use crate::source::Source;

/// What happens to a call, a connection or a message. Ordered from the
/// most to the least permissive: `Allow < Approve < Deny`.
#[derive(
    Debug,
    Clone,
    Copy,
    PartialEq,
    Eq,
    PartialOrd,
    Ord,
    Hash,
    Default,
    Serialize,
    Deserialize,
    schemars::JsonSchema,
)]
#[serde(rename_all = "lowercase")]
pub enum Verdict {
    /// Let it through.
    #[default]
    Allow,
    /// Hold it for a human; refused without an approval. In an audit
    /// record of a call that ran, it means a human approved it.
    Approve,
    /// Refuse it; it never reaches the other side.
    Deny,
}

impl Verdict {
    /// Every verdict, from the most to the least permissive.
    pub const ALL: [Verdict; 3] = [Verdict::Allow, Verdict::Approve, Verdict::Deny];

    /// The word used in policy files, audit records and on the wire.
    pub fn as_str(self) -> &'static str {
        match self {
            Verdict::Allow => "allow",
            Verdict::Approve => "approve",
            Verdict::Deny => "deny",
        }
    }

    /// The verdict named `s` (`allow`, `approve`, `deny`).
    pub fn from_name(s: &str) -> Option<Verdict> {
        Verdict::ALL.into_iter().find(|v| v.as_str() == s)
    }
}

impl std::str::FromStr for Verdict {
    type Err = String;

    /// Parses `allow`, `approve` or `deny`; the error names the valid words.
    fn from_str(s: &str) -> Result<Verdict, String> {
        Verdict::from_name(s)
            .ok_or_else(|| format!("unknown decision `{s}` (expected allow, approve or deny)"))
    }
}

impl std::fmt::Display for Verdict {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

/// Declares [`Reason`] with its code string and meaning in one table, so
/// that a code cannot exist without its documentation.
macro_rules! reasons {
    ($($(#[$attr:meta])* $variant:ident = $code:literal, $meaning:literal;)*) => {
        /// A machine-readable reason code. The string form (`as_str`) is
        /// stable: clients, scripts and the audit log match on it.
        #[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
        pub enum Reason {
            $(
                #[doc = $meaning]
                $(#[$attr])*
                $variant,
            )*
        }

        impl Reason {
            /// Every reason code, in catalogue order.
            pub const ALL: &'static [Reason] = &[$(Reason::$variant),*];

            /// The stable code, e.g. `tool.rule`.
            pub fn as_str(self) -> &'static str {
                match self {
                    $(Reason::$variant => $code,)*
                }
            }

            /// What the code means, in one sentence.
            pub fn meaning(self) -> &'static str {
                match self {
                    $(Reason::$variant => $meaning,)*
                }
            }

            /// The reason whose code is `code`.
            pub fn from_code(code: &str) -> Option<Reason> {
                match code {
                    $($code => Some(Reason::$variant),)*
                    _ => None,
                }
            }
        }
    };
}

reasons! {
    // ---- tool policy
    ToolRule = "tool.rule", "a `[tools]` pattern matched the tool; the source names the pattern";
    ToolDefault = "tool.default", "no `[tools]` pattern matched; `tools.default` decided";
    ToolDefaultAllow = "tool.default_allow", "no policy was given: every tool is allowed";
    ToolNameInvalid = "tool.name_invalid", "a tool name outside the MCP specification's characters (ASCII letters, digits, `_`, `-`, `.`; 1 to 128): withheld from the host's list and refused when called, so that a look-alike (`dеploy` with a Cyrillic е, full-width letters, an invisible character) never sidesteps a rule on the real name";
    ToolDestructiveHint = "tool.destructive_hint", "the server marked the tool destructive and `tools.destructive` is stricter than the rule that matched";
    // ---- command policy (`[commands]`) and tool arguments
    CommandCategory = "command.category", "a `[commands.categories]` verdict decided: the strictest over the categories of the command (the source names the category)";
    CommandProgram = "command.program", "a `[commands.programs]` entry for the command's program decided, overriding its categories";
    CommandDefault = "command.default", "the command's program is in no category and has no `[commands.programs]` entry; `commands.default` decided";
    CommandUnparsed = "command.unparsed", "the command could not be classified (a syntax error, a computed program name, `eval`, nesting too deep); `commands.unparsed` decided";
    ArgumentInvalid = "argument.invalid", "an argument that `[commands]` declares (or mcpbox's built-in server expects) has the wrong JSON type";
    ArgumentPathOutside = "argument.path_outside", "a path argument resolves outside the workspace (`tools.outside_paths`) or outside a rule's `paths`, symlinks followed as the sandbox sees them";
    ArgumentHostOutside = "argument.host_outside", "a URL argument names a host a `[[tools.arguments]]` rule's `hosts` does not list (or is not a plain http(s)/ws(s) URL)";
    ArgumentValueRefused = "argument.value_refused", "an argument's value is not one of a `[[tools.arguments]]` rule's `one_of`";
    ArgumentTooLong = "argument.too_long", "an argument's value is longer than a `[[tools.arguments]]` rule's `max_length`";
    RootOutside = "root.outside", "a root the client offered is not under a host directory the sandbox mounts: the server never sees it (nor its host path)";
    // ---- background jobs of the built-in sandbox server (`[jobs]`)
    JobLimit = "job.limit", "a background job was refused: `jobs.max_running` jobs are running already";
    JobTimeout = "job.timeout", "a background job was stopped at its time limit (`jobs.max_time`)";
    JobMemory = "job.memory", "a background job was stopped at its memory limit (`jobs.max_memory`)";
    // ---- the audit log
    AuditUnavailable = "audit.unavailable", "the call's start could not be committed to the audit log (a full disk, a locked, unwritable or broken database; the message names which): the call is refused and never sent, unless `[audit] on_failure = \"continue\"`";
    // ---- approvals
    ApprovalRequired = "approval.required", "the call needs a human approval and no approval channel is available";
    ApprovalGranted = "approval.granted", "a human approved this exact call";
    ApprovalGrantedOnce = "approval.granted_once", "a human allowed this one network connection";
    ApprovalGrantedSession = "approval.granted_session", "a human allowed this host and port for the rest of the session";
    ApprovalDeclined = "approval.declined", "the human declined or cancelled the approval";
    ApprovalDenied = "approval.denied", "the human answered the network question with deny";
    ApprovalTimeout = "approval.timeout", "nobody answered the approval before it expired";
    ApprovalPending = "approval.pending", "the call needs a human approval and the host has no elicitation: it was refused with the approval's id (`[approvals] fallback = \"refuse\"`); once a human approves it, the same call with the same arguments passes once";
    ApprovalAbandoned = "approval.abandoned", "the session ended (host gone, server down) while the call waited for a human";
    ResultApproval = "output.approve", "the result is held for a human: larger than `output.approve_over`, or holding credential-shaped strings under `output.approve_credential_shapes`";
    // ---- tool pinning
    PinNew = "pin.new", "the tool appeared after the tool list was pinned; withheld until `mcpbox pin accept`";
    PinChanged = "pin.changed", "the tool's definition differs from its pin (a possible rug pull); withheld until `mcpbox pin accept`";
    PinInstructionsChanged = "pin.instructions_changed", "the server's instructions differ from the pinned ones; they are removed until `mcpbox pin accept`";
    // ---- how a forwarded call ended
    CallError = "call.error", "the server answered the call with an error or a result with `isError`";
    CallTimeout = "call.timeout", "the call exceeded `process.call_timeout`; the server was sent a cancellation";
    ResultTooLarge = "result.too_large", "the server's response line was longer than `output.max_line`";
    // ---- host protocol errors
    BatchRefused = "batch.refused", "the host sent a JSON-RPC batch, which MCP does not use";
    RequestInvalid = "request.invalid", "the host sent invalid JSON, a non-object, or a message that is neither request, notification nor response";
    RequestTooLarge = "request.too_large", "the host sent a line longer than `output.max_line`";
    RequestNoTool = "request.no_tool", "the host sent `tools/call` without a tool name";
    ServerRestarting = "server.restarting", "the server is being restarted (a secret's TTL ran out); the call may be retried";
    // ---- server lifecycle
    ServerExited = "server.exited", "the server exited on its own (with requests in flight, each gets this error)";
    ServerStopped = "server.stopped", "mcpbox stopped the server at the end of the session";
    HostGone = "host.gone", "the host stopped reading mcpbox's output";
    SecretTtlRestart = "secret.ttl_restart", "the server was restarted to load fresh secret values after a TTL";
    IdleStopped = "idle.stopped", "the sandbox was idle for `idle.stop`: its server was stopped, the workspace kept; the next call starts it again";
    // ---- server output screening
    ServerInvalidJson = "server.invalid_json", "the server wrote a line to stdout that is not a JSON-RPC object; dropped";
    ServerLineTooLong = "server.line_too_long", "the server wrote a line longer than `output.max_line`; dropped";
    ServerLineCompacted = "server.line_compacted", "the server wrote an over-long line whose long strings were cut to fit";
    ArtifactRefused = "artifact.refused", "a file of a sandbox's output matched `[artifacts] patterns` but was not exported: not a regular file with one link, inside output, within `max_size` (or not approved)";
    ArtifactLarge = "artifact.large", "a call of the built-in sandbox server's `export_artifact` names a file over `[artifacts] max_size`: it waits for a human's approval, and the server copies no more than the size approved";
    OutputSpecialFile = "output.special_file", "`mcpbox run`: the server left a symlink, hardlink, fifo, socket or device in the output directory (reported, not removed)";
    RedactionSecret = "redaction.secret", "a secret's value (or an encoding of it) was replaced in the server's output: in a string, an object key, or a number's decimal text (the number becomes the redacted string)";
    RedactionRefused = "redaction.refused", "a server message held a secret in the digits of a number mcpbox cannot keep exactly (an integer past 64 bits, a fraction or an exponent); it cannot be redacted in place, so it was refused: an answer to the host's request becomes an error, anything else is dropped";
    ServerReservedMeta = "server.reserved_meta", "the server wrote `_meta` entries under mcpbox's own names (`mcpbox/...`, `io.mcpbox/...`); they were removed before the host saw the message";
    ServerRequestLimit = "server.request_limit", "the server has as many requests waiting for the host's answer as the relay keeps (256): the oldest is forgotten, and the host's late answer to it dropped";
    AggregateNameTaken = "aggregate.name_taken", "on `/mcp`, a server listed a resource URI or URI template that an earlier server (in the config's order) owns; the later entry is withheld from the list (and named in the list's `_meta[\"mcpbox/withheld\"]`), and reads go to the owner";
    // ---- credential shapes found in results
    CredentialGithubPat = "credential.github_pat", "a GitHub fine-grained personal access token";
    CredentialGithub = "credential.github", "a GitHub token (`ghp_`, `gho_`, `ghu_`, `ghs_`, `ghr_`)";
    CredentialAnthropic = "credential.anthropic", "an Anthropic API key";
    CredentialOpenai = "credential.openai", "an OpenAI API key";
    CredentialStripe = "credential.stripe", "a Stripe secret or restricted key";
    CredentialSlack = "credential.slack", "a Slack token or webhook";
    CredentialAwsAccessKey = "credential.aws_access_key", "an AWS access key id";
    CredentialGoogleApiKey = "credential.google_api_key", "a Google API key";
    CredentialGitlab = "credential.gitlab", "a GitLab personal access token";
    CredentialNpm = "credential.npm", "an npm access token";
    CredentialPrivateKey = "credential.private_key", "a PEM private key block";
    // ---- text screening (descriptions, instructions, results)
    TextTerminalEscape = "text.terminal_escape", "terminal escape sequences were stripped";
    TextControlCharacter = "text.control_character", "control characters were stripped";
    TextInvisibleUnicode = "text.invisible_unicode", "invisible or bidirectional Unicode was stripped";
    InstructionOverride = "instruction.override", "text tells the model to ignore or override its instructions";
    InstructionConceal = "instruction.conceal", "text tells the model to hide something from the user";
    InstructionFakeSystem = "instruction.fake_system", "text poses as a system or developer message";
    InstructionCredentialAccess = "instruction.credential_access", "text tells the model to read credentials or key files";
    InstructionCrossTool = "instruction.cross_tool", "text tells the model how to use other tools or servers";
    InstructionExfiltration = "instruction.exfiltration", "text tells the model to send data somewhere";
    // ---- network policy and the egress proxy
    NetworkAllow = "network.allow", "a `network.allow` entry matched the host and port";
    NetworkDeny = "network.deny", "a `network.deny` entry matched the host";
    NetworkUnlisted = "network.unlisted", "no `network.allow` entry matched and `network.unlisted` refuses (or asks)";
    NetworkLocal = "network.local", "a `network.local` entry opened this port of the host's own loopback";
    NetworkLocalUnlisted = "network.local_unlisted", "a loopback host (the machine mcpbox runs on) on a port no `network.local` entry names; refused without asking";
    NetworkInvalidHost = "network.invalid_host", "the requested host name is not a valid DNS name or address";
    NetworkApprovedOnce = "network.approved_once", "a human allowed this one connection";
    NetworkApprovedSession = "network.approved_session", "a human allowed this host and port earlier in the session";
    NetworkApprovalDenied = "network.approval_denied", "a human refused the connection, or nobody could be asked";
    NetworkLoopbackAddress = "network.loopback_address", "the host resolved to a loopback address";
    NetworkPrivateAddress = "network.private_address", "the host resolved to a private (RFC 1918, ULA) address";
    NetworkLinkLocalAddress = "network.link_local_address", "the host resolved to a link-local address";
    NetworkMulticastAddress = "network.multicast_address", "the host resolved to a multicast address";
    NetworkUnspecifiedAddress = "network.unspecified_address", "the host resolved to the unspecified address";
    NetworkBroadcastAddress = "network.broadcast_address", "the host resolved to the broadcast address";
    NetworkDocumentationAddress = "network.documentation_address", "the host resolved to a documentation (TEST-NET) address";
    NetworkReservedAddress = "network.reserved_address", "the host resolved to a reserved or otherwise non-public address";
    NetworkMetadataEndpoint = "network.metadata_endpoint", "the host is a cloud metadata endpoint";
    NetworkSniMismatch = "network.sni_mismatch", "the TLS server name differs from the host the tunnel was opened for";
    NetworkTlsMalformed = "network.tls_malformed", "the client's first bytes in a tunnel are not a TLS ClientHello";
    NetworkNotCarried = "network.not_carried", "a packet the sandbox sent that egress does not carry (UDP other than its own resolver, IPv6, a ping): refused inside the sandbox";
    UpstreamResolveFailed = "upstream.resolve_failed", "the proxy could not resolve the host name";
    UpstreamTlsFailed = "upstream.tls_failed", "on a connection the proxy opened to put a secret in, the upstream's TLS handshake failed or its certificate was not trusted";
    SecretPlaceholderElsewhere = "secret.placeholder_elsewhere", "a secret's placeholder was sent to a host the secret is not for; it went as the placeholder, never the value";
    SecretRequestRefused = "secret.request_refused", "on a connection the proxy opened to put a secret in, a request was refused (another host, an upgrade, framing two parsers could read differently)";
    SecretResponseRefused = "secret.response_refused", "on a connection the proxy opened to put a secret in, the upstream's response could not be relayed with the value kept out (compressed, malformed)";
    SecretTlsFailed = "secret.tls_failed", "the sandbox's TLS handshake with the proxy failed (a client that does not trust the sandbox's CA, or offers only HTTP/2)";
    UpstreamConnectFailed = "upstream.connect_failed", "the proxy could not connect to the checked address";
    RequestEmpty = "request.empty", "the client closed the proxy connection before sending a request";
    RequestReadFailed = "request.read_failed", "reading the client's proxy request failed";
    RequestMalformed = "request.malformed", "the client sent a malformed proxy request";
    // ---- the HTTP gateway (`mcpbox serve`)
    HttpTokenMissing = "http.token_missing", "the request carried no bearer token and no anonymous client is configured";
    HttpTokenInvalid = "http.token_invalid", "the bearer token matches no configured client";
    HttpServerForbidden = "http.server_forbidden", "the client may not use this server (`clients.servers`)";
    HttpServerUnknown = "http.server_unknown", "no server of that name is configured";
    HttpSessionUnknown = "http.session_unknown", "the `Mcp-Session-Id` names no live session of this client (ended, never existed, or another client's)";
    HttpSessionRequired = "http.session_required", "the request needs an `Mcp-Session-Id` (only `initialize` opens a session)";
    HttpSessionLimit = "http.session_limit", "the client has as many open sessions as `limits.max_sessions_per_client` allows";
    HttpStreamLimit = "http.stream_limit", "the client has as many open streams as `limits.max_streams_per_client` allows";
    HttpHostRefused = "http.host_refused", "the `Host` header names no address the gateway serves (DNS rebinding)";
    HttpOriginRefused = "http.origin_refused", "the `Origin` header names a site the gateway does not accept (DNS rebinding, cross-site request)";
    HttpBodyTooLarge = "http.body_too_large", "the request body was larger than `limits.max_body`";
    HttpBodyTimeout = "http.body_timeout", "the client did not send the request body within `limits.body_timeout`";
    HttpContentType = "http.content_type", "a POST body that is not `application/json`";
    HttpAccept = "http.accept", "the `Accept` header does not allow what the endpoint answers with (JSON and an event stream)";
    HttpProtocolVersion = "http.protocol_version", "the `MCP-Protocol-Version` header names a revision the gateway does not speak";
    HttpRateLimited = "http.rate_limited", "the client sent requests faster than `limits.rate_per_second` (and `burst`) allow";
    HttpTooManyInFlight = "http.too_many_in_flight", "the client has `limits.max_concurrent` requests in flight already";
    HttpSessionBusy = "http.session_busy", "the session's input queue is full; retry shortly";
    HttpSessionFailed = "http.session_failed", "the server's sandbox or relay could not be started for the session";
    HttpDuplicateId = "http.duplicate_id", "a request reused the id of a request of the same session that is still in flight";
    HttpSandboxDestroying = "http.sandbox_destroying", "the session's sandbox is being torn down (artifacts exported, secrets revoked, workspace removed): no session joins it; retry, and once it is gone a new one is made";
    HttpSandboxLimit = "http.sandbox_limit", "the client has as many sandboxes as `limits.max_sandboxes_per_client` allows (live or kept); destroy one first";
    HttpTaskInvalid = "http.task_invalid", "the `Mcpbox-Task` header or `_meta` task is not a task name (1 to 64 of `[A-Za-z0-9._-]`, not starting with a dot), or the two differ";
    HttpShuttingDown = "http.shutting_down", "the gateway is stopping and takes no new requests";
    HttpStopped = "http.stopped", "the gateway stopped while the request was still in flight, at the end of `limits.shutdown_grace`";
    HttpBufferFull = "http.buffer_full", "a message for the client did not fit the bytes the gateway holds for it (`limits.max_buffered_per_session`, `limits.max_buffered_total`): a notification was dropped, or a response ended its request with this error";
    // ---- mcpbox's own failures
    ClientGone = "client.gone", "the sandboxed client closed the proxy connection";
    McpboxThreadSpawnFailed = "mcpbox.thread_spawn_failed", "mcpbox could not start a thread to serve a connection";
    McpboxCloneFailed = "mcpbox.clone_failed", "mcpbox could not duplicate a socket to serve a connection";
}

impl Reason {
    /// The reason catalogue as a Markdown document (`docs/reasons.md` is
    /// this text; a test keeps it so).
    pub fn catalogue_markdown() -> String {
        let mut out = String::from(
            "# Reason codes\n\n\
             Every decision, refusal, flag and end of a session that mcpbox reports carries a\n\
             machine-readable reason code: in the `_meta[\"mcpbox/decision\"]` of a refused\n\
             call, in JSON-RPC error `data.reason`, in the egress proxy's `X-Mcpbox-Reason`\n\
             header, and in the audit log's `reason` column. The codes are stable; match on\n\
             them, not on messages. This file is generated from the catalogue in\n\
             `crates/policy/src/decision.rs` (`MCPBOX_BLESS=1 cargo test -p mcpbox-policy\n\
             reasons_doc` rewrites it).\n\n\
             | code | meaning |\n|---|---|\n",
        );
        for r in Reason::ALL {
            out.push_str(&format!("| `{}` | {} |\n", r.as_str(), r.meaning()));
        }
        out.push_str(
            "\n## Reserved metadata\n\n\
             The `_meta` names `mcpbox` and `io.mcpbox`, and every name that starts with\n\
             either followed by `/` or `.` (`mcpbox/decision`, `mcpbox/withheld`,\n\
             `io.mcpbox/task`, `io.mcpbox/max_bytes`), are mcpbox's own. mcpbox removes\n\
             them from everything a server sends (results, errors and their `data`,\n\
             notifications, the server's requests, and the `_meta` of anything nested in\n\
             them) before it writes its own, in both protocol eras, over stdio and both\n\
             HTTP endpoints (flagged `server.reserved_meta`). What a host reads under\n\
             these names is mcpbox's word, never a server's.\n",
        );
        out
    }
}

impl std::fmt::Display for Reason {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

impl Serialize for Reason {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_str(self.as_str())
    }
}

impl<'de> Deserialize<'de> for Reason {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Reason, D::Error> {
        let code = String::deserialize(d)?;
        Reason::from_code(&code)
            .ok_or_else(|| serde::de::Error::custom(format!("unknown reason code `{code}`")))
    }
}

/// A verdict with the reason that explains it and its source: the policy
/// key (`tools."delete_*"`, `network.allow[0]`) or the component
/// (`pin`, `approval:elicitation`, `relay`) that made it, as a typed
/// [`Source`] that serializes to that text.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Decision {
    /// Allow, approve or deny.
    pub verdict: Verdict,
    /// Why, as a catalogued code.
    pub reason: Reason,
    /// Who decided.
    pub source: Source,
}

impl Decision {
    /// A decision.
    pub fn new(verdict: Verdict, reason: Reason, source: impl Into<Source>) -> Decision {
        Decision {
            verdict,
            reason,
            source: source.into(),
        }
    }

    /// Shorthand for an allowing decision.
    pub fn allow(reason: Reason, source: impl Into<Source>) -> Decision {
        Decision::new(Verdict::Allow, reason, source)
    }

    /// Shorthand for a decision that asks a human.
    pub fn approve(reason: Reason, source: impl Into<Source>) -> Decision {
        Decision::new(Verdict::Approve, reason, source)
    }

    /// Shorthand for a refusing decision.
    pub fn deny(reason: Reason, source: impl Into<Source>) -> Decision {
        Decision::new(Verdict::Deny, reason, source)
    }

    /// The stricter of two decisions; on a tie, `self`.
    pub fn stricter(self, other: Decision) -> Decision {
        if other.verdict > self.verdict {
            other
        } else {
            self
        }
    }
}

/// A human's answer to a network question: may the sandbox reach a host
/// that its policy does not list (`network.unlisted = "approve"`)? Asked by
/// the egress proxy, answered through the relay (MCP elicitation) or any
/// other approval channel. Only `Once` and `Session` let the connection
/// through.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum NetworkAnswer {
    /// Allow this one connection.
    Once,
    /// Allow this host and port for the rest of the session.
    Session,
    /// The human accepted the form and chose to deny (or sent a choice
    /// that is not one of the offered ones).
    Denied,
    /// The human declined or cancelled the form, or the host answered
    /// with an error.
    Declined,
    /// Nobody answered before the approval timeout.
    Timeout,
    /// The question could not be asked: no approval channel (the host did
    /// not declare form elicitation), the session is not running, or the
    /// host is gone.
    Unavailable,
}

impl NetworkAnswer {
    /// Whether the connection may go ahead.
    pub fn allows(self) -> bool {
        matches!(self, NetworkAnswer::Once | NetworkAnswer::Session)
    }

    /// The reason code of this answer, for logs and audit detail.
    pub fn reason(self) -> Reason {
        match self {
            NetworkAnswer::Once => Reason::ApprovalGrantedOnce,
            NetworkAnswer::Session => Reason::ApprovalGrantedSession,
            NetworkAnswer::Denied => Reason::ApprovalDenied,
            NetworkAnswer::Declined => Reason::ApprovalDeclined,
            NetworkAnswer::Timeout => Reason::ApprovalTimeout,
            NetworkAnswer::Unavailable => Reason::ApprovalRequired,
        }
    }
}

/// Tool annotations as the (untrusted) server declared them in
/// `tools/list`. A policy may use them to make a decision stricter, never
/// looser.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Hash)]
pub struct ToolHints {
    /// `annotations.readOnlyHint`. Never loosens a decision; recorded only.
    pub read_only: Option<bool>,
    /// `annotations.destructiveHint`. `Some(true)` raises a decision made
    /// by a glob or `tools.default` to `tools.destructive`; a rule naming
    /// the tool exactly stands ([`crate::ToolRules::decide`]).
    pub destructive: Option<bool>,
    /// `annotations.idempotentHint`.
    pub idempotent: Option<bool>,
    /// `annotations.openWorldHint`.
    pub open_world: Option<bool>,
}

impl ToolHints {
    /// Reads hints from a tool definition's `annotations` (a `tools/list`
    /// entry); absent or non-boolean values are `None`.
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn verdicts_are_ordered_from_allow_to_deny() {
        assert!(Verdict::Allow < Verdict::Approve);
        assert!(Verdict::Approve < Verdict::Deny);
        assert_eq!(
            [Verdict::Deny, Verdict::Allow, Verdict::Approve]
                .into_iter()
                .max(),
            Some(Verdict::Deny)
        );
        for v in Verdict::ALL {
            assert_eq!(Verdict::from_name(v.as_str()), Some(v));
        }
    }

    #[test]
    fn every_reason_code_round_trips_and_is_unique() {
        let mut seen = std::collections::HashSet::new();
        for r in Reason::ALL {
            assert!(seen.insert(r.as_str()), "duplicate code {}", r.as_str());
            assert_eq!(Reason::from_code(r.as_str()), Some(*r));
            assert!(!r.meaning().is_empty());
            let json = serde_json::to_string(r).unwrap();
            assert_eq!(serde_json::from_str::<Reason>(&json).unwrap(), *r);
        }
        assert_eq!(Reason::from_code("no.such_code"), None);
    }

    #[test]
    fn reasons_doc_lists_every_code_with_its_meaning() {
        let path = concat!(env!("CARGO_MANIFEST_DIR"), "/../../docs/reasons.md");
        let want = Reason::catalogue_markdown();
        if std::env::var_os("MCPBOX_BLESS").is_some() {
            std::fs::write(path, &want).unwrap();
        }
        let have = std::fs::read_to_string(path).unwrap_or_default();
        assert!(
            have == want,
            "docs/reasons.md is out of date with the catalogue: run MCPBOX_BLESS=1 cargo test -p mcpbox-policy reasons_doc"
        );
    }

    #[test]
    fn every_reason_is_documented_and_every_documented_reason_exists() {
        let path = concat!(env!("CARGO_MANIFEST_DIR"), "/../../docs/reasons.md");
        let doc = std::fs::read_to_string(path).unwrap();
        // the table's codes: rows `| `code` | meaning |`
        let documented: Vec<&str> = doc
            .lines()
            .filter_map(|l| l.strip_prefix("| `"))
            .filter_map(|l| l.split_once('`').map(|(code, _)| code))
            .collect();
        for r in Reason::ALL {
            assert!(
                documented.contains(&r.as_str()),
                "{} is not in docs/reasons.md",
                r.as_str()
            );
        }
        for code in &documented {
            assert!(
                Reason::from_code(code).is_some(),
                "docs/reasons.md lists `{code}`, which no Reason has"
            );
        }
        assert_eq!(documented.len(), Reason::ALL.len());
    }

    #[test]
    fn stricter_decision_wins_and_ties_keep_the_first() {
        let allow = Decision::allow(Reason::ToolRule, "tools.a");
        let deny = Decision::deny(Reason::ToolDefault, "tools.default");
        assert_eq!(allow.clone().stricter(deny.clone()), deny);
        assert_eq!(deny.clone().stricter(allow.clone()), deny);
        let other = Decision::allow(Reason::ToolDefault, "tools.default");
        assert_eq!(allow.clone().stricter(other), allow);
    }

    #[test]
    fn hints_are_read_from_annotations() {
        let tool = serde_json::json!({"name": "rm", "annotations": {"destructiveHint": true, "readOnlyHint": "yes"}});
        let h = ToolHints::from_tool(&tool);
        assert_eq!(h.destructive, Some(true));
        assert_eq!(h.read_only, None);
    }
}
