//! `[[tests]]`: example decisions written in the policy and checked at load,
//! so a policy documents its intent and a later edit that breaks it fails
//! `mcpbox check` instead of changing behaviour silently.

use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use crate::decision::{ToolHints, Verdict};
use crate::Policy;

/// One example decision (`[[tests]]`): exactly one of `tool` or `host`, and the expected action.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct Example {
    /// A tool name, decided by [tools].
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tool: Option<String>,
    /// A host, optionally with ":PORT" (default 443), decided by [network].
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub host: Option<String>,
    /// For a tool: the destructiveHint annotation the server claims.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub destructive: Option<bool>,
    /// For a tool: the readOnlyHint annotation the server claims.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub read_only: Option<bool>,
    /// The decision the policy must make: "allow", "deny" or "approve" (for a host: ask a human).
    pub expect: Verdict,
}

/// Splits "host", "host:port", "[v6]:port" or a bare IPv6 literal; port 443 by default.
fn split_host_port(s: &str) -> Option<(&str, u16)> {
    if let Some(rest) = s.strip_prefix('[') {
        let (host, after) = rest.split_once(']')?;
        return match after {
            "" => Some((host, 443)),
            p => p
                .strip_prefix(':')?
                .parse()
                .ok()
                .filter(|p| *p != 0)
                .map(|p| (host, p)),
        };
    }
    if s.matches(':').count() > 1 {
        return Some((s, 443));
    }
    match s.rsplit_once(':') {
        Some((h, p)) => p.parse().ok().filter(|p| *p != 0).map(|p| (h, p)),
        None => Some((s, 443)),
    }
}

/// Why an example failed: (key suffix, message, hint).
pub(crate) type Failure = (&'static str, String, String);

impl Example {
    /// Checks the example against the policy.
    pub(crate) fn check(&self, policy: &Policy) -> Result<(), Failure> {
        let (action, reason, source) = match (&self.tool, &self.host) {
            (Some(tool), None) => {
                let hints = ToolHints {
                    read_only: self.read_only,
                    destructive: self.destructive,
                    ..ToolHints::default()
                };
                // the call decision's first step, as the relay takes it
                let d = policy.call_rules(None).decide_tool(tool, &hints);
                (d.verdict, d.reason, d.source)
            }
            (None, Some(host)) => {
                if self.destructive.is_some() || self.read_only.is_some() {
                    return Err((
                        "",
                        "a host example takes no tool hints".into(),
                        "remove destructive/read_only".into(),
                    ));
                }
                let (name, port) = split_host_port(host).ok_or_else(|| {
                    (
                        "host",
                        format!("invalid host \"{}\"", host.escape_debug()),
                        "write \"name\" or \"name:port\"".to_string(),
                    )
                })?;
                let d = policy.network.decide(name, port);
                (d.verdict, d.reason, d.source)
            }
            _ => {
                return Err((
                    "",
                    "an example needs exactly one of tool or host".into(),
                    "write tool = \"name\" or host = \"name:port\"".into(),
                ))
            }
        };
        if action != self.expect {
            return Err((
                "expect",
                format!(
                    "example expects {} but the policy decides {} ({reason}, {source})",
                    self.expect.as_str(),
                    action.as_str()
                ),
                "change the rule or the example".into(),
            ));
        }
        Ok(())
    }
}
