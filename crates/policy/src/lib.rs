//! mcpbox policy: the policy model, parsing, validation and the pure decision
//! engines for tools and network egress.
//!
//! This crate does no I/O. [`parse`] is given the text of a policy file and its
//! path (used to resolve relative paths lexically and to name the file in
//! errors) and returns a validated [`Policy`] or a [`Diagnostic`] that points
//! at the file, line, column and key. It never panics on input.
//!
//! [`serve`] is the config of `mcpbox serve` (the HTTP gateway), parsed and
//! validated the same way; its two loaders ([`serve::ServeConfig::load`],
//! [`serve::TokenSource::load`]) are the crate's only I/O.
#![forbid(unsafe_code)]
// tests may unwrap: a panic there is a failed test, not a crash on input
#![cfg_attr(test, allow(clippy::unwrap_used, clippy::expect_used))]

mod arguments;
mod artifacts;
pub mod call;
mod commands;
mod credentials;
mod decision;
mod diagnostic;
mod examples;
pub mod extends;
pub mod hex;
pub mod learn;
mod locate;
pub mod mcp;
mod model;
mod network;
mod paths;
pub mod preset;
pub mod procfs;
pub mod serve;
mod source;
pub mod terminal;
pub mod toml_text;
mod tools;
mod units;
pub mod url;
mod validate;

use std::ops::Range;
use std::path::Path;

pub use artifacts::path_match as artifact_match;
/// The artifact pattern matcher and checker, for the lifecycle's export walk.
pub mod artifact_patterns {
    pub use crate::artifacts::{check, may_contain, path_match};
}
pub use arguments::{
    is_path_name, translate_host_paths, ArgumentFinding, ArgumentRule, ArgumentRules, Lexical,
    Resolve, Workspace, WORKSPACE,
};
pub use call::{combine, BuiltinRules, CallDecision, CallRules, World};
pub use commands::{
    classify, classify_argv, classify_line, Category, Classified, Classifier, CommandDecision,
    CommandRules, InProcess, Input, Parsed, ToolArg, MAX_DEPTH as MAX_COMMAND_DEPTH,
    MAX_INPUT as MAX_COMMAND_INPUT,
};
pub use credentials::{credential_kind, CREDENTIAL_LOCATIONS};
pub use decision::{Decision, NetworkAnswer, Reason, Source, ToolHints, Verdict};
pub use diagnostic::{Diagnostic, Location};
pub use examples::Example;
pub use model::{
    ApprovalFallback, Approvals, Artifacts, Audit, Durability, Env, Filesystem, Isolation, Jobs,
    Mount, MountMode, OnAuditFailure, Output, Policy, Process, Runtime, Sandbox, Secret,
    SecretSource, Server, UpstreamSettings, ValuePart, DEFAULT_EXEC_OUTPUT, DEFAULT_EXEC_TIMEOUT,
    DEFAULT_JOB_MEMORY, DEFAULT_JOB_OUTPUT, DEFAULT_JOB_TIME, DEFAULT_MAX_ARTIFACT,
    DEFAULT_MAX_JOBS, DEFAULT_MAX_LINE, DEFAULT_MAX_RESULT, DEFAULT_PIDS, DEFAULT_TMP,
};
pub use network::{HostPattern, HostRule, NetworkRules, Unlisted};
pub use paths::{confine_path, PathMap};
pub use tools::{glob_match, valid_tool_name, ToolRule, ToolRules};
pub use units::{format_duration, format_size, parse_duration, parse_size};
pub use validate::{name_from_file, CA_VARIABLES, MAX_TMP, PROXY_VARIABLES};

use diagnostic::offset_to_location;
use locate::Locations;

/// The crate's result type.
pub type Result<T, E = Diagnostic> = std::result::Result<T, E>;

/// Separates a message from its hint inside serde custom errors, which carry one string.
pub(crate) const HINT_MARK: &str = "\u{1f}hint\u{1f}";
/// Brackets a key-path suffix (`[3]`, `."name"`) at the start of a serde custom error,
/// for errors in array elements and map keys, which toml reports with the span of the
/// enclosing value.
pub(crate) const SUB_MARK: char = '\u{1e}';

/// Prefixes `message` with a key-path suffix for [`serde_diagnostic`].
pub(crate) fn with_sub_key(suffix: &str, message: impl std::fmt::Display) -> String {
    format!("{SUB_MARK}{suffix}{SUB_MARK}{message}")
}

/// Parses and validates a policy. `file` names the policy in diagnostics; its
/// parent directory is the base for relative paths (pass an absolute path to get
/// absolute paths back). Unknown keys, wrong types and invalid values are errors.
/// `extends = "preset:NAME"` is followed; `extends = "FILE"` needs
/// [`parse_with`], which is given the means to read it.
pub fn parse(text: &str, file: &Path) -> Result<Policy> {
    parse_with(text, file, &mut |path: &Path| {
        Err(std::io::Error::new(
            std::io::ErrorKind::Unsupported,
            format!("{} is a file, and files are not read here", path.display()),
        ))
    })
}

/// [`parse`], with `read` to load the policy files `extends` names (the
/// crate itself does no I/O). See [`extends`] for the merge.
pub fn parse_with(text: &str, file: &Path, read: &mut extends::ReadFile) -> Result<Policy> {
    let base = file.parent().map(Path::to_path_buf).unwrap_or_default();
    parse_layers(text, file, &base, read)
}

/// [`parse`] with relative paths resolved against `base` instead of the
/// file's directory (a preset is text without a directory of its own).
pub(crate) fn parse_in(text: &str, file: &Path, base: &Path) -> Result<Policy> {
    parse_layers(text, file, base, &mut |path: &Path| {
        Err(std::io::Error::new(
            std::io::ErrorKind::Unsupported,
            format!("{} is a file, and a preset extends no file", path.display()),
        ))
    })
}

fn parse_layers(
    text: &str,
    file: &Path,
    base: &Path,
    read: &mut extends::ReadFile,
) -> Result<Policy> {
    let mut chain = vec![validate::resolve(
        base,
        Path::new(file.file_name().unwrap_or_default()),
    )];
    let layered = extends::layer(text, file, base, read, &mut chain)?;
    let (mut policy, extended) = match layered.merged {
        None => (layered.own, None),
        Some((table, extended)) => {
            let policy = toml::Value::Table(table)
                .try_into::<Policy>()
                .map_err(|e| {
                    Diagnostic::new(
                        file,
                        layered.locs.get("extends"),
                        "extends",
                        format!(
                            "this file merged over \"{}\" is not a valid policy: {}",
                            extended.escape_debug(),
                            e.message().trim()
                        ),
                    )
                    .with_hint("see docs/policy.md#extends for how the merge works")
                })?;
            (policy, Some(extended))
        }
    };
    validate::validate_in(&mut policy, file, base, &layered.locs).map_err(|mut d| {
        // a key this file does not have came from what it extends
        if let (None, Some(ext)) = (d.location, &extended) {
            if !d.key.is_empty() {
                d.message = format!(
                    "{} (inherited from extends = \"{}\")",
                    d.message,
                    ext.escape_debug()
                );
            }
        }
        d
    })?;
    policy.extends = extended;
    policy.locations = layered.locs;
    Ok(policy)
}

/// The strictest policy, used without `--policy`: no input, no output, a 64MiB
/// tmp only, no network, no secrets, default limits, every tool allowed (there is
/// nothing outside the sandbox for a tool to reach).
pub fn default_policy() -> Policy {
    let mut p = Policy::default();
    p.server.name = Some("default".into());
    p
}

/// The JSON Schema of the policy file, generated from the same types.
pub fn json_schema() -> serde_json::Value {
    let mut schema = schemars::schema_for!(Policy).to_value();
    strip_null(&mut schema);
    schema
}

/// TOML has no null: an optional field is simply left out, so the `null`
/// alternatives schemars adds for `Option` are removed.
pub(crate) fn strip_null(v: &mut serde_json::Value) {
    use serde_json::Value;
    if let Value::Object(obj) = v {
        if let Some(Value::Array(types)) = obj.get_mut("type") {
            types.retain(|t| t != "null");
            if types.len() == 1 {
                let only = types.remove(0);
                obj.insert("type".into(), only);
            }
        }
        if let Some(Value::Array(alts)) = obj.get_mut("anyOf") {
            alts.retain(|a| a.get("type").and_then(Value::as_str) != Some("null"));
            if alts.len() == 1 {
                let only = alts.remove(0);
                obj.remove("anyOf");
                if let Value::Object(inner) = only {
                    for (k, val) in inner {
                        obj.entry(k).or_insert(val);
                    }
                }
            }
        }
        obj.values_mut().for_each(strip_null);
    } else if let Value::Array(items) = v {
        items.iter_mut().for_each(strip_null);
    }
}

impl Policy {
    /// The rules that decide a call under this policy ([`CallRules`]); with
    /// `builtin` when the server is mcpbox's built-in one.
    pub fn call_rules(&self, builtin: Option<BuiltinRules>) -> CallRules {
        CallRules::new(self.tools.clone(), self.commands.clone(), builtin)
    }

    /// Where a key path (`filesystem.input`, `filesystem.mounts[1].host`,
    /// `tools."delete_*"`) sits in the source; `None` for a default or an unknown key.
    pub fn location(&self, key: &str) -> Option<Location> {
        self.locations.get(key)
    }

    /// The effective policy as TOML: defaults filled in, paths resolved.
    pub fn to_toml(&self) -> String {
        match toml::to_string(self) {
            Ok(s) => s,
            Err(e) => format!("# could not print the effective policy: {e}\n"),
        }
    }

    /// The server name (set from the file stem when the policy does not give one).
    pub fn name(&self) -> &str {
        self.server.name.as_deref().unwrap_or("default")
    }
}

pub(crate) fn syntax_diagnostic(text: &str, file: &Path, e: &toml::de::Error) -> Diagnostic {
    let location = e.span().map(|s| offset_to_location(text, s.start));
    Diagnostic::new(
        file,
        location,
        "",
        format!("invalid TOML: {}", e.message().trim().replace('\n', "; ")),
    )
    .with_hint("see docs/policy.md for the policy syntax")
}

/// Splits "`a`, `b` or `c`" style lists from serde into "a, b, c".
fn plain_list(s: &str) -> String {
    s.replace("one of ", "")
        .replace(" or ", ", ")
        .replace('`', "")
}

/// Says serde's type names the way a policy author thinks of them.
fn plain_type(expected: &str) -> String {
    match expected {
        "u32" | "u64" | "u16" => "a whole number, not negative".into(),
        "a sequence" => {
            "a list such as [\"a\", \"b\"] (a list of tables is written [[name]])".into()
        }
        "a map" => "a table".into(),
        "f64" => "a number".into(),
        other => other.into(),
    }
}

pub(crate) fn serde_diagnostic(
    text: &str,
    file: &Path,
    locs: &Locations,
    e: &toml::de::Error,
) -> Diagnostic {
    let span: Option<Range<usize>> = e.span();
    let mut location = span.as_ref().map(|s| offset_to_location(text, s.start));
    let mut key = span
        .as_ref()
        .and_then(|s| locs.key_at(s))
        .unwrap_or_default();
    let mut raw = e.message().trim_end_matches('\n');
    // a suffix for an array element or a map key, when the error carries one
    if let Some(rest) = raw.strip_prefix(SUB_MARK) {
        if let Some((suffix, message)) = rest.split_once(SUB_MARK) {
            key.push_str(suffix);
            if let Some(loc) = locs.get(&key) {
                location = Some(loc);
            }
            raw = message;
        }
    }
    let (message, hint) = match raw.split_once(HINT_MARK) {
        Some((m, h)) => (m.to_string(), Some(h.to_string())),
        None => rewrite_serde_message(raw),
    };
    let mut d = Diagnostic::new(file, location, key, message);
    d.hint = hint;
    d
}

/// Turns serde's stock messages into ours: what is wrong, then what is valid.
fn rewrite_serde_message(raw: &str) -> (String, Option<String>) {
    if let Some(rest) = raw.strip_prefix("unknown field `") {
        if let Some((name, expected)) = rest.split_once("`, ") {
            let hint = match expected.strip_prefix("expected ") {
                Some(list) => format!("valid keys here: {}", plain_list(list)),
                None => "this table takes no keys".to_string(),
            };
            return (format!("unknown key `{name}`"), Some(hint));
        }
    }
    if let Some(rest) = raw.strip_prefix("unknown variant `") {
        if let Some((name, expected)) = rest.split_once("`, expected ") {
            return (
                format!("invalid value \"{name}\""),
                Some(format!("valid values: {}", plain_list(expected))),
            );
        }
    }
    if let Some(rest) = raw.strip_prefix("invalid type: ") {
        if let Some((found, expected)) = rest.split_once(", expected ") {
            return (
                format!("wrong type: found {found}"),
                Some(format!("expected {}", plain_type(expected))),
            );
        }
    }
    if let Some(rest) = raw.strip_prefix("invalid value: ") {
        if let Some((found, expected)) = rest.split_once(", expected ") {
            return (
                format!("invalid value: {found}"),
                Some(format!("expected {}", plain_type(expected))),
            );
        }
    }
    if raw == "invalid IP address syntax" {
        return (
            raw.to_string(),
            Some("write an IPv4 or IPv6 address, e.g. \"10.1.2.3\" or \"fd00::1\"".into()),
        );
    }
    if let Some(rest) = raw.strip_prefix("missing field `") {
        let name = rest.trim_end_matches('`');
        return (
            format!("missing required key `{name}`"),
            Some(format!("add {name} = ... to this table")),
        );
    }
    (raw.to_string(), None)
}

#[cfg(test)]
mod tests;
