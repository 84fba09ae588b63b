//! `[tools]`: per-tool rules over tool names and the decision engine.
//!
//! The strictest matching rule wins (deny > approve > allow); the default
//! applies only when no pattern matches. Annotations come from the untrusted
//! server, so they may only make a decision stricter, never looser, and only
//! where the policy has not named the tool: a rule that names a tool exactly
//! is the policy author's decision about that tool, and the server's
//! `destructiveHint` does not override it (docs/policy.md, "How a call is
//! decided"). The relay and `[[tests]]` both decide through
//! [`ToolRules::decide`], so an example checks the decision a call gets.

use std::borrow::Cow;
use std::fmt;

use schemars::{json_schema, JsonSchema, Schema, SchemaGenerator};
use serde::de::{self, MapAccess, Visitor};
use serde::ser::SerializeMap;
use serde::{Deserialize, Deserializer, Serialize, Serializer};

use crate::arguments::ArgumentRules;
use crate::decision::{Decision, Reason, Source, ToolHints, Verdict};
use crate::locate::key_segment;
use crate::{with_sub_key, HINT_MARK};

/// One `"pattern" = "action"` entry of `[tools]`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ToolRule {
    /// A glob over tool names: `*` matches any run of characters, `?` one character.
    pub pattern: String,
    /// What a matching call gets.
    pub action: Verdict,
}

/// The `[tools]` section.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct ToolRules {
    /// Verdict for a tool no pattern matches; "allow" by default.
    pub default: Verdict,
    /// Keep denied tools in `tools/list` (calls are still refused).
    pub show_denied: bool,
    /// Decision floor for tools whose annotations say `destructiveHint = true`.
    pub destructive: Verdict,
    /// The pattern rules, in file order.
    pub rules: Vec<ToolRule>,
    /// `[[tools.arguments]]` and `outside_paths`: rules over argument values.
    pub arguments: ArgumentRules,
}

/// Keys of `[tools]` that are settings, not patterns.
pub(crate) const TOOL_SETTINGS: &[&str] = &[
    "default",
    "show_denied",
    "destructive",
    "outside_paths",
    "arguments",
];

/// Matches a glob (`*`, `?`) against a tool name, over characters, iteratively
/// (no backtracking blow-up on hostile names). The one `*`/`?` matcher: tool
/// and argument rules use it, and so does each segment of an artifact pattern.
pub fn glob_match(pattern: &str, name: &str) -> bool {
    let p: Vec<char> = pattern.chars().collect();
    let n: Vec<char> = name.chars().collect();
    let (mut pi, mut ni) = (0, 0);
    let mut star: Option<(usize, usize)> = None;
    while ni < n.len() {
        match p.get(pi) {
            Some('*') => {
                star = Some((pi, ni));
                pi += 1;
            }
            Some(&c) if c == '?' || c == n[ni] => {
                pi += 1;
                ni += 1;
            }
            _ => match star {
                Some((sp, sn)) => {
                    pi = sp + 1;
                    ni = sn + 1;
                    star = Some((sp, sn + 1));
                }
                None => return false,
            },
        }
    }
    p[pi..].iter().all(|&c| c == '*')
}

/// The tool-name characters of the MCP specification (2025-11-25, "Tool
/// names"): 1 to 128 of ASCII letters, digits, `_`, `-` and `.`. Anything
/// else can look like another name to a human and to a rule.
pub fn valid_tool_name(name: &str) -> bool {
    (1..=128).contains(&name.len())
        && name
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'_' | b'-' | b'.'))
}

impl ToolRules {
    /// Decides a call to `tool`. The strictest matching pattern wins; with none,
    /// the default applies. A destructive hint can then only raise the result,
    /// and only when no rule names the tool exactly: an exact rule is the
    /// author's decision about this tool, made knowing what it does, while a
    /// glob (`"browser_*"`, `"*"`) or `default` decides tools the author may
    /// never have looked at, which the server's own warning may tighten.
    pub fn decide(&self, tool: &str, hints: &ToolHints) -> Decision {
        let strictest = self
            .rules
            .iter()
            .filter(|r| glob_match(&r.pattern, tool))
            // max_by_key keeps the last of equals; rev() makes the first in file order win ties
            .rev()
            .max_by_key(|r| r.action);
        let mut decision = match strictest {
            Some(rule) => Decision::new(
                rule.action,
                Reason::ToolRule,
                Source::ToolRule(rule.pattern.clone()),
            ),
            None => Decision::new(self.default, Reason::ToolDefault, Source::ToolDefault),
        };
        if hints.destructive == Some(true)
            && self.destructive > decision.verdict
            && !self.names(tool)
        {
            decision = Decision::new(
                self.destructive,
                Reason::ToolDestructiveHint,
                Source::ToolDestructive,
            );
        }
        decision
    }

    /// Whether a rule names `tool` exactly (a pattern without `*` or `?`
    /// equal to it), which puts its decision beyond the server's hints.
    pub fn names(&self, tool: &str) -> bool {
        self.rules
            .iter()
            .any(|r| r.pattern == tool && !r.pattern.contains(['*', '?']))
    }

    /// Whether `tool` should appear in `tools/list`: denied tools are hidden unless `show_denied`.
    pub fn visible_in_list(&self, tool: &str, hints: &ToolHints) -> bool {
        self.show_denied || self.decide(tool, hints).verdict != Verdict::Deny
    }
}

/// Checks a tool-name pattern; returns a message on error.
pub(crate) fn check_pattern(p: &str) -> Result<(), String> {
    if p.is_empty() {
        return Err("empty tool pattern".into());
    }
    if p.chars().any(|c| c.is_control() || c.is_whitespace()) {
        return Err(format!(
            "tool pattern \"{}\" contains whitespace or control characters",
            p.escape_debug()
        ));
    }
    Ok(())
}

impl<'de> Deserialize<'de> for ToolRules {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        d.deserialize_map(ToolsVisitor)
    }
}

struct ToolsVisitor;

impl<'de> Visitor<'de> for ToolsVisitor {
    type Value = ToolRules;
    fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
        f.write_str("a table of tool-name patterns to \"allow\", \"deny\" or \"approve\"")
    }
    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<ToolRules, A::Error> {
        let mut out = ToolRules::default();
        while let Some(key) = map.next_key::<String>()? {
            match key.as_str() {
                "default" => out.default = map.next_value()?,
                "destructive" => out.destructive = map.next_value()?,
                "show_denied" => out.show_denied = map.next_value()?,
                "outside_paths" => out.arguments.outside_paths = map.next_value()?,
                "arguments" => out.arguments.rules = map.next_value()?,
                _ => {
                    if let Err(m) = check_pattern(&key) {
                        let msg = format!(
                            "{m}{HINT_MARK}a key of [tools] is a glob over tool names (`*`, `?`) or one of: {}",
                            TOOL_SETTINGS.join(", ")
                        );
                        return Err(de::Error::custom(with_sub_key(
                            &format!(".{}", key_segment(&key)),
                            msg,
                        )));
                    }
                    let action: Verdict = map.next_value()?;
                    out.rules.push(ToolRule {
                        pattern: key,
                        action,
                    });
                }
            }
        }
        Ok(out)
    }
}

impl Serialize for ToolRules {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        let mut m = s.serialize_map(Some(5 + self.rules.len()))?;
        m.serialize_entry("default", &self.default)?;
        m.serialize_entry("show_denied", &self.show_denied)?;
        m.serialize_entry("destructive", &self.destructive)?;
        m.serialize_entry("outside_paths", &self.arguments.outside_paths)?;
        m.serialize_entry("arguments", &self.arguments.rules)?;
        for r in &self.rules {
            m.serialize_entry(&r.pattern, &r.action)?;
        }
        m.end()
    }
}

impl JsonSchema for ToolRules {
    fn schema_name() -> Cow<'static, str> {
        "Tools".into()
    }
    fn json_schema(g: &mut SchemaGenerator) -> Schema {
        let action = g.subschema_for::<Verdict>();
        let rule = g.subschema_for::<crate::arguments::ArgumentRule>();
        json_schema!({
            "type": "object",
            "description": "per-tool rules: every key other than the settings below is a glob (`*`, `?`) over tool names mapped to an action; the strictest matching rule wins (deny > approve > allow)",
            "properties": {
                "default": { "allOf": [action], "default": "allow", "description": "action for a tool no pattern matches" },
                "show_denied": { "type": "boolean", "default": false, "description": "keep denied tools in tools/list (calls are still refused)" },
                "destructive": { "allOf": [action], "default": "allow", "description": "decision floor for tools whose untrusted annotations say destructiveHint = true; it can only make a decision stricter" },
                "outside_paths": { "allOf": [action], "default": "deny", "description": "for an argument whose name says it is a path (path, file, dir, *_path, uri, ...) or any file:// value, when it is absolute, ~-relative or has a .. segment and resolves outside /workspace and the policy's mounts (symlinks followed as the sandbox sees them)" },
                "arguments": { "type": "array", "items": rule, "default": [], "description": "rules over one argument of the tools a glob names: paths, hosts, one_of, max_length; a violation gets `otherwise`" }
            },
            "additionalProperties": action
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{Reason, Verdict};

    fn rules(default: Verdict, r: &[(&str, Verdict)]) -> ToolRules {
        ToolRules {
            default,
            rules: r
                .iter()
                .map(|(p, a)| ToolRule {
                    pattern: (*p).into(),
                    action: *a,
                })
                .collect(),
            ..Default::default()
        }
    }

    const NONE: ToolHints = ToolHints {
        idempotent: None,
        open_world: None,
        read_only: None,
        destructive: None,
    };

    #[test]
    fn glob_matching() {
        assert!(glob_match("write_*", "write_file"));
        assert!(glob_match("write_*", "write_"));
        assert!(!glob_match("write_*", "overwrite_file"));
        assert!(glob_match("*_file", "read_file"));
        assert!(glob_match("re?d", "read"));
        assert!(!glob_match("re?d", "reaad"));
        assert!(glob_match("*", ""));
        assert!(glob_match("a*b*c", "aXXbYYc"));
        assert!(!glob_match("a*b*c", "aXXbYY"));
        assert!(glob_match("é?", "éé"));
        // pathological pattern finishes quickly (linear-ish matcher)
        assert!(!glob_match(&"*a".repeat(50), &"a".repeat(40)));
    }

    #[test]
    fn strictest_matching_rule_wins() {
        let r = rules(
            Verdict::Allow,
            &[
                ("*", Verdict::Allow),
                ("delete_*", Verdict::Deny),
                ("*_file", Verdict::Approve),
            ],
        );
        let d = r.decide("delete_file", &NONE);
        assert_eq!(
            d,
            Decision {
                verdict: Verdict::Deny,
                reason: Reason::ToolRule,
                source: "tools.\"delete_*\"".into()
            }
        );
        let d = r.decide("write_file", &NONE);
        assert_eq!(
            (d.verdict, &*d.source.to_string()),
            (Verdict::Approve, "tools.\"*_file\"")
        );
        let d = r.decide("list", &NONE);
        assert_eq!((d.verdict, d.reason), (Verdict::Allow, Reason::ToolRule));
    }

    #[test]
    fn default_applies_only_without_a_match() {
        let r = rules(Verdict::Deny, &[("read_*", Verdict::Allow)]);
        assert_eq!(r.decide("read_file", &NONE).verdict, Verdict::Allow);
        let d = r.decide("write_file", &NONE);
        assert_eq!(
            d,
            Decision {
                verdict: Verdict::Deny,
                reason: Reason::ToolDefault,
                source: "tools.default".into()
            }
        );
    }

    #[test]
    fn empty_rules_with_default_deny_block_everything() {
        let r = rules(Verdict::Deny, &[]);
        for t in ["", "read", "anything", "*"] {
            assert_eq!(r.decide(t, &NONE).verdict, Verdict::Deny);
            assert!(!r.visible_in_list(t, &NONE));
        }
    }

    #[test]
    fn hints_only_make_decisions_stricter() {
        let mut r = rules(
            Verdict::Deny,
            &[("safe", Verdict::Allow), ("boom", Verdict::Deny)],
        );
        r.destructive = Verdict::Approve;
        let benign = ToolHints {
            read_only: Some(true),
            destructive: Some(false),
            ..ToolHints::default()
        };
        // a read-only claim never opens a denied tool
        assert_eq!(r.decide("other", &benign).verdict, Verdict::Deny);
        assert_eq!(r.decide("boom", &benign).verdict, Verdict::Deny);
        // a destructive claim raises allow to approve...
        let destructive = ToolHints {
            read_only: Some(true),
            destructive: Some(true),
            ..ToolHints::default()
        };
        r.rules.push(ToolRule {
            pattern: "sa*".into(),
            action: Verdict::Allow,
        });
        let d = r.decide("sample", &destructive);
        assert_eq!(
            d,
            Decision {
                verdict: Verdict::Approve,
                reason: Reason::ToolDestructiveHint,
                source: "tools.destructive".into()
            }
        );
        // ...and never lowers deny
        assert_eq!(r.decide("boom", &destructive).verdict, Verdict::Deny);
        // default floor (allow) changes nothing
        let plain = rules(Verdict::Allow, &[]);
        assert_eq!(plain.decide("x", &destructive).reason, Reason::ToolDefault);
    }

    #[test]
    fn an_exact_rule_stands_against_a_destructive_hint_a_glob_or_default_does_not() {
        let mut r = rules(
            Verdict::Allow,
            &[
                ("browser_navigate", Verdict::Allow),
                ("browser_*", Verdict::Allow),
                ("danger", Verdict::Deny),
            ],
        );
        r.destructive = Verdict::Approve;
        let destructive = ToolHints {
            destructive: Some(true),
            ..ToolHints::default()
        };
        // named exactly: the author's allow stands (the relay and [[tests]] agree)
        let d = r.decide("browser_navigate", &destructive);
        assert_eq!(
            (d.verdict, d.reason, &*d.source.to_string()),
            (Verdict::Allow, Reason::ToolRule, "tools.browser_navigate")
        );
        // a glob and the default are raised by the hint
        let d = r.decide("browser_click", &destructive);
        assert_eq!(
            (d.verdict, d.reason),
            (Verdict::Approve, Reason::ToolDestructiveHint)
        );
        assert_eq!(r.decide("other", &destructive).verdict, Verdict::Approve);
        // a hint never lowers an exact deny, nor does an exact allow beat a
        // stricter glob that also matches
        assert_eq!(r.decide("danger", &destructive).verdict, Verdict::Deny);
        r.rules.push(ToolRule {
            pattern: "browser_nav*".into(),
            action: Verdict::Deny,
        });
        assert_eq!(
            r.decide("browser_navigate", &destructive).verdict,
            Verdict::Deny
        );
        // `?` is a glob too
        let mut q = rules(Verdict::Allow, &[("tool?", Verdict::Allow)]);
        q.destructive = Verdict::Deny;
        assert_eq!(q.decide("tool1", &destructive).verdict, Verdict::Deny);
    }

    #[test]
    fn denied_tools_hidden_unless_show_denied() {
        let mut r = rules(
            Verdict::Allow,
            &[("delete_*", Verdict::Deny), ("write_*", Verdict::Approve)],
        );
        assert!(!r.visible_in_list("delete_all", &NONE));
        assert!(r.visible_in_list("write_file", &NONE));
        r.show_denied = true;
        assert!(r.visible_in_list("delete_all", &NONE));
    }
}
