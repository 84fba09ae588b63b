//! Who made a [`crate::Decision`]: the policy key or the component.
//!
//! [`Source`] is typed so that the code that decides says which rule it
//! applied, and so that a reader finds every source in one enum. Its text
//! (`Display`, and its serialized form) is what the audit log's `source`
//! column, a refused call's `_meta["mcpbox/decision"]` and the egress
//! proxy's replies carry; it is the same text those carried when the
//! source was a free string, so nothing a client or a script reads
//! changed. Two sources are equal when their texts are (a source parsed
//! back from the wire equals the one that was written).

use std::fmt;

use serde::{Deserialize, Serialize};

use crate::commands::Category;
use crate::locate::key_segment;

/// The rule or component behind a decision.
#[derive(Debug, Clone)]
pub enum Source {
    /// No policy was given: `default`.
    NoPolicy,
    /// A `[tools]` pattern: `tools.<pattern>` (quoted when not a bare key).
    ToolRule(String),
    /// `tools.default`.
    ToolDefault,
    /// `tools.destructive` (a destructive hint raised the decision).
    ToolDestructive,
    /// `tools.arguments`: the argument rules found nothing, but host paths
    /// in the arguments were made the sandbox's.
    ToolArguments,
    /// A `[[tools.arguments]]` rule, by index: `tools.arguments[i]`.
    ArgumentRule(usize),
    /// `tools.outside_paths`.
    OutsidePaths,
    /// A `[commands.programs]` entry: `commands.programs.<program>`.
    CommandProgram(String),
    /// A `[commands.categories]` verdict: `commands.categories.<category>`.
    CommandCategory(Category),
    /// `commands.default`.
    CommandDefault,
    /// `commands.unparsed`.
    CommandUnparsed,
    /// A declared command-line argument of the wrong type: `commands.tools`.
    CommandLineTools,
    /// A declared argv argument of the wrong type: `commands.argv_tools`.
    CommandArgvTools,
    /// The built-in server's check of a tool's `path`: `builtin.<tool>.path`.
    BuiltinPath(&'static str),
    /// The built-in server's check of a tool's `cwd`: `builtin.<tool>.cwd`.
    BuiltinCwd(&'static str),
    /// The built-in server's artifact export: `builtin.export_artifact`.
    BuiltinExport,
    /// `artifacts.max_size`.
    ArtifactsMaxSize,
    /// `output.approve_over`.
    OutputApproveOver,
    /// `output.approve_credential_shapes`.
    OutputApproveCredentialShapes,
    /// The relay itself (a tool name it refuses): `relay`.
    Relay,
    /// The audit log (a start record that could not be committed): `audit`.
    Audit,
    /// The screening of a server's instructions: `instructions`.
    Instructions,
    /// The screening of a tool's description: `description`.
    Description,
    /// The HTTP face (`mcpbox serve`): `serve`.
    Serve,
    /// The HTTP face's aggregate endpoint: `serve:/mcp`.
    ServeAggregate,
    /// mcpbox itself, in a JSON-RPC error it writes: `mcpbox`.
    Mcpbox,
    /// The tool pins, with the pin file: `pin:<file>`, or `pin`.
    Pin(Option<String>),
    /// An approval, with who or what answered: `approval:<by>`, or
    /// `approval`.
    Approval(Option<String>),
    /// `network` (a host name that is not one).
    Network,
    /// A `[network] deny` entry: `network.deny[i] "<entry>"`.
    NetworkDeny(u32, String),
    /// A `[network] local` entry: `network.local[i] "<entry>"`.
    NetworkLocal(u32, String),
    /// A `[network] allow` entry: `network.allow[i] "<entry>"`.
    NetworkAllow(u32, String),
    /// `network.local` (the machine mcpbox runs on, unlisted).
    NetworkLocalUnlisted,
    /// `network.unlisted`.
    NetworkUnlisted,
    /// One of the egress proxy's own checks: `egress:<check>`.
    Egress(&'static str),
    /// A source outside this catalogue (a test's policy, an embedder's
    /// own [`crate::Decision`]), as written.
    Other(String),
}

impl Source {
    /// Whether the text is empty (only an [`Source::Other`] can be; the
    /// fuzz targets check no decision comes without a source).
    pub fn is_empty(&self) -> bool {
        matches!(self, Source::Other(s) if s.is_empty())
    }

    /// The source whose text is `s`: the catalogued one when there is one
    /// (so `Source::from("tools.default") == Source::ToolDefault`),
    /// [`Source::Other`] otherwise. `Source::parse(&s.to_string())` is
    /// always equal to `s`.
    pub fn parse(s: &str) -> Source {
        let fixed = match s {
            "default" => Some(Source::NoPolicy),
            "tools.default" => Some(Source::ToolDefault),
            "tools.destructive" => Some(Source::ToolDestructive),
            "tools.arguments" => Some(Source::ToolArguments),
            "tools.outside_paths" => Some(Source::OutsidePaths),
            "commands.default" => Some(Source::CommandDefault),
            "commands.unparsed" => Some(Source::CommandUnparsed),
            "commands.tools" => Some(Source::CommandLineTools),
            "commands.argv_tools" => Some(Source::CommandArgvTools),
            "builtin.export_artifact" => Some(Source::BuiltinExport),
            "artifacts.max_size" => Some(Source::ArtifactsMaxSize),
            "output.approve_over" => Some(Source::OutputApproveOver),
            "output.approve_credential_shapes" => Some(Source::OutputApproveCredentialShapes),
            "relay" => Some(Source::Relay),
            "audit" => Some(Source::Audit),
            "instructions" => Some(Source::Instructions),
            "description" => Some(Source::Description),
            "serve" => Some(Source::Serve),
            "serve:/mcp" => Some(Source::ServeAggregate),
            "mcpbox" => Some(Source::Mcpbox),
            "pin" => Some(Source::Pin(None)),
            "approval" => Some(Source::Approval(None)),
            "network" => Some(Source::Network),
            "network.local" => Some(Source::NetworkLocalUnlisted),
            "network.unlisted" => Some(Source::NetworkUnlisted),
            _ => None,
        };
        if let Some(f) = fixed {
            return f;
        }
        let typed = if let Some(c) = s.strip_prefix("commands.categories.") {
            Category::from_name(c).map(Source::CommandCategory)
        } else if let Some(p) = s.strip_prefix("pin:") {
            Some(Source::Pin(Some(p.to_string())))
        } else if let Some(a) = s.strip_prefix("approval:") {
            Some(Source::Approval(Some(a.to_string())))
        } else if let Some(i) = s
            .strip_prefix("tools.arguments[")
            .and_then(|r| r.strip_suffix(']'))
        {
            i.parse().ok().map(Source::ArgumentRule)
        } else {
            None
        };
        // anything else keeps its text (a quoted key, a network entry, a
        // test's own source): equal on the wire, which is what counts
        typed.unwrap_or_else(|| Source::Other(s.to_string()))
    }
}

impl fmt::Display for Source {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Source::NoPolicy => f.write_str("default"),
            Source::ToolRule(p) => write!(f, "tools.{}", key_segment(p)),
            Source::ToolDefault => f.write_str("tools.default"),
            Source::ToolDestructive => f.write_str("tools.destructive"),
            Source::ToolArguments => f.write_str("tools.arguments"),
            Source::ArgumentRule(i) => write!(f, "tools.arguments[{i}]"),
            Source::OutsidePaths => f.write_str("tools.outside_paths"),
            Source::CommandProgram(p) => write!(f, "commands.programs.{}", key_segment(p)),
            Source::CommandCategory(c) => write!(f, "commands.categories.{}", c.as_str()),
            Source::CommandDefault => f.write_str("commands.default"),
            Source::CommandUnparsed => f.write_str("commands.unparsed"),
            Source::CommandLineTools => f.write_str("commands.tools"),
            Source::CommandArgvTools => f.write_str("commands.argv_tools"),
            Source::BuiltinPath(tool) => write!(f, "builtin.{tool}.path"),
            Source::BuiltinCwd(tool) => write!(f, "builtin.{tool}.cwd"),
            Source::BuiltinExport => f.write_str("builtin.export_artifact"),
            Source::ArtifactsMaxSize => f.write_str("artifacts.max_size"),
            Source::OutputApproveOver => f.write_str("output.approve_over"),
            Source::OutputApproveCredentialShapes => {
                f.write_str("output.approve_credential_shapes")
            }
            Source::Relay => f.write_str("relay"),
            Source::Audit => f.write_str("audit"),
            Source::Instructions => f.write_str("instructions"),
            Source::Description => f.write_str("description"),
            Source::Serve => f.write_str("serve"),
            Source::ServeAggregate => f.write_str("serve:/mcp"),
            Source::Mcpbox => f.write_str("mcpbox"),
            Source::Pin(None) => f.write_str("pin"),
            Source::Pin(Some(file)) => write!(f, "pin:{file}"),
            Source::Approval(None) => f.write_str("approval"),
            Source::Approval(Some(by)) => write!(f, "approval:{by}"),
            Source::Network => f.write_str("network"),
            Source::NetworkDeny(i, e) => write!(f, "network.deny[{i}] \"{}\"", e.escape_debug()),
            Source::NetworkLocal(i, e) => {
                write!(f, "network.local[{i}] \"{}\"", e.escape_debug())
            }
            Source::NetworkAllow(i, e) => {
                write!(f, "network.allow[{i}] \"{}\"", e.escape_debug())
            }
            Source::NetworkLocalUnlisted => f.write_str("network.local"),
            Source::NetworkUnlisted => f.write_str("network.unlisted"),
            Source::Egress(check) => write!(f, "egress:{check}"),
            Source::Other(s) => f.write_str(s),
        }
    }
}

impl PartialEq for Source {
    /// Equal when the texts are: what the wire and the audit log tell apart.
    fn eq(&self, other: &Source) -> bool {
        self.to_string() == other.to_string()
    }
}

impl Eq for Source {}

// the text is the comparison: rendering it is the point (clippy would
// have `*self == other`, which is this impl again)
#[allow(clippy::cmp_owned)]
impl PartialEq<str> for Source {
    fn eq(&self, other: &str) -> bool {
        self.to_string() == other
    }
}

#[allow(clippy::cmp_owned)]
impl PartialEq<&str> for Source {
    fn eq(&self, other: &&str) -> bool {
        self.to_string() == *other
    }
}

impl From<&str> for Source {
    fn from(s: &str) -> Source {
        Source::parse(s)
    }
}

impl From<String> for Source {
    fn from(s: String) -> Source {
        Source::parse(&s)
    }
}

impl From<&String> for Source {
    fn from(s: &String) -> Source {
        Source::parse(s)
    }
}

impl From<&Source> for Source {
    fn from(s: &Source) -> Source {
        s.clone()
    }
}

impl Serialize for Source {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.collect_str(self)
    }
}

impl<'de> Deserialize<'de> for Source {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Source, D::Error> {
        Ok(Source::parse(&String::deserialize(d)?))
    }
}

impl From<Source> for serde_json::Value {
    fn from(s: Source) -> serde_json::Value {
        serde_json::Value::String(s.to_string())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// One of each variant, with the text the audit log and the wire
    /// carried before the source was typed.
    fn catalogue() -> Vec<(Source, &'static str)> {
        vec![
            (Source::NoPolicy, "default"),
            (Source::ToolRule("delete_*".into()), "tools.\"delete_*\""),
            (Source::ToolRule("read_file".into()), "tools.read_file"),
            (Source::ToolDefault, "tools.default"),
            (Source::ToolDestructive, "tools.destructive"),
            (Source::ToolArguments, "tools.arguments"),
            (Source::ArgumentRule(2), "tools.arguments[2]"),
            (Source::OutsidePaths, "tools.outside_paths"),
            (
                Source::CommandProgram("curl".into()),
                "commands.programs.curl",
            ),
            (
                Source::CommandProgram("a b".into()),
                "commands.programs.\"a b\"",
            ),
            (
                Source::CommandCategory(Category::VcsWrite),
                "commands.categories.vcs_write",
            ),
            (Source::CommandDefault, "commands.default"),
            (Source::CommandUnparsed, "commands.unparsed"),
            (Source::CommandLineTools, "commands.tools"),
            (Source::CommandArgvTools, "commands.argv_tools"),
            (Source::BuiltinCwd("exec"), "builtin.exec.cwd"),
            (Source::BuiltinPath("read_file"), "builtin.read_file.path"),
            (Source::BuiltinExport, "builtin.export_artifact"),
            (Source::ArtifactsMaxSize, "artifacts.max_size"),
            (Source::OutputApproveOver, "output.approve_over"),
            (
                Source::OutputApproveCredentialShapes,
                "output.approve_credential_shapes",
            ),
            (Source::Relay, "relay"),
            (Source::Audit, "audit"),
            (Source::Instructions, "instructions"),
            (Source::Description, "description"),
            (Source::Serve, "serve"),
            (Source::ServeAggregate, "serve:/mcp"),
            (Source::Mcpbox, "mcpbox"),
            (Source::Pin(None), "pin"),
            (Source::Pin(Some("/p/x.json".into())), "pin:/p/x.json"),
            (Source::Approval(None), "approval"),
            (
                Source::Approval(Some("elicitation".into())),
                "approval:elicitation",
            ),
            (Source::Network, "network"),
            (
                Source::NetworkDeny(0, "secret.example.com".into()),
                "network.deny[0] \"secret.example.com\"",
            ),
            (
                Source::NetworkLocal(1, "localhost:5432".into()),
                "network.local[1] \"localhost:5432\"",
            ),
            (
                Source::NetworkAllow(3, "*.github.com".into()),
                "network.allow[3] \"*.github.com\"",
            ),
            (Source::NetworkLocalUnlisted, "network.local"),
            (Source::NetworkUnlisted, "network.unlisted"),
            (Source::Egress("sni_check"), "egress:sni_check"),
            (Source::Other("fuzz.rm".into()), "fuzz.rm"),
        ]
    }

    #[test]
    fn every_source_keeps_the_text_it_had_as_a_string() {
        for (source, text) in catalogue() {
            assert_eq!(source.to_string(), text);
            assert_eq!(
                serde_json::to_value(&source).unwrap(),
                serde_json::json!(text)
            );
            // read back from the wire, it is the same source
            let back: Source = serde_json::from_value(serde_json::json!(text)).unwrap();
            assert_eq!(back, source, "{text}");
            assert_eq!(back.to_string(), text);
        }
    }

    #[test]
    fn a_source_is_no_bigger_than_four_words() {
        // a Decision rides in every in-flight call of the relay
        assert!(std::mem::size_of::<Source>() <= 32);
    }

    #[test]
    fn catalogued_texts_parse_to_their_variant() {
        assert!(matches!(
            Source::parse("tools.default"),
            Source::ToolDefault
        ));
        assert!(matches!(
            Source::parse("commands.categories.delete"),
            Source::CommandCategory(Category::Delete)
        ));
        assert!(matches!(
            Source::parse("tools.arguments[7]"),
            Source::ArgumentRule(7)
        ));
        assert!(matches!(
            Source::parse("approval:console:alice"),
            Source::Approval(Some(ref by)) if by == "console:alice"
        ));
        assert!(matches!(
            Source::parse("commands.categories.nosuch"),
            Source::Other(_)
        ));
        assert!(Source::parse("").is_empty());
        assert!(!Source::ToolDefault.is_empty());
    }
}
