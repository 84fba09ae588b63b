//! `[[tools.arguments]]` and `tools.outside_paths`: rules over the values of
//! a call's arguments, and host paths translated to the sandbox's.
//!
//! - A rule names a tool (a glob) and one of its top-level arguments, and
//!   constrains the value: `paths` (sandbox directories it must resolve
//!   under), `hosts` (the hosts a URL may name), `one_of` (the values it may
//!   take), `max_length`. A violation gets the rule's `otherwise` verdict.
//! - The default rule: an argument whose *name* says it is a path (`path`,
//!   `file`, `dir`, `*_path`, `uri`, ...; see [`is_path_name`]), and any
//!   string value that is a `file://` URI, must resolve inside the
//!   workspace when it is absolute, `~`-relative or has a `..` segment;
//!   else `outside_paths` applies. A rule on the argument replaces it.
//!
//! Paths are resolved as the sandbox sees them, symlinks included, by a
//! [`Resolve`] the caller provides (the binary follows links through the
//! host directories behind the sandbox's mounts); this module does the
//! lexical part only. The check is coordination, not the boundary: a
//! server can still race its own symlinks, and reaches only what its
//! sandbox mounts.

use std::collections::BTreeSet;

use schemars::JsonSchema;
use serde::{Deserialize, Serialize};
use serde_json::{json, Value};

use crate::decision::{Decision, Reason, Source, Verdict};
use crate::network::HostRule;
use crate::paths::{file_uri_path, normalise_abs, strip_file_scheme, PathMap};
use crate::tools::glob_match;

/// One `[[tools.arguments]]` table.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct ArgumentRule {
    /// A glob over tool names (`*`, `?`), as the keys of `[tools]`.
    pub tool: String,
    /// The name of a top-level argument of the call.
    pub argument: String,
    /// Sandbox directories the value must resolve under (symlinks
    /// followed as the sandbox sees them). A string, or a list of strings
    /// (each checked); relative values are taken from /workspace.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub paths: Option<Vec<String>>,
    /// Hosts an http(s)/ws(s) URL value may name, in `[network]` syntax
    /// (a pattern without a port covers 80 and 443). A URL with user
    /// information (`user@host`) never matches.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub hosts: Option<Vec<HostRule>>,
    /// The values the argument may take (strings, numbers, booleans,
    /// compared exactly).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub one_of: Option<Vec<Value>>,
    /// Longest value: characters of a string, items of a list, bytes of
    /// the JSON text of anything else.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_length: Option<u64>,
    /// The argument is not a path, whatever its name says: the default rule
    /// (`outside_paths`) does not look at it.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub not_a_path: bool,
    /// What a call that breaks the rule gets: "deny" (default), "approve"
    /// or "allow" (recorded only).
    #[serde(default = "deny")]
    pub otherwise: Verdict,
}

fn deny() -> Verdict {
    Verdict::Deny
}

/// Resolves an absolute sandbox path as the sandbox would: `..` and
/// symlinks, component by component. Returns the normalised absolute path,
/// or why it cannot be resolved (too many links, a link target that is
/// not text): a path that cannot be resolved counts as outside.
pub trait Resolve {
    fn resolve(&self, path: &str) -> Result<String, String>;
}

/// Resolution on the text alone (no symlinks), for tests and for a server
/// with no sandbox behind it.
pub struct Lexical;

impl Resolve for Lexical {
    fn resolve(&self, path: &str) -> Result<String, String> {
        Ok(normalise_abs(path))
    }
}

/// What the argument rules concluded about one call.
#[derive(Debug, Clone)]
pub struct ArgumentFinding {
    pub decision: Decision,
    /// For the audit record: the argument and why (never its value).
    pub detail: Value,
}

/// The sandbox directories a call's paths may name, and how they resolve.
pub struct Workspace<'a> {
    /// Absolute sandbox directories ("/workspace" and the policy's mounts).
    pub dirs: &'a [String],
    pub resolve: &'a dyn Resolve,
}

/// Where the workspace is inside the sandbox; relative paths start here.
pub const WORKSPACE: &str = "/workspace";

/// Whether an argument's name says it holds a path. The name is compared
/// without case, `_` or `-` (`filePath`, `file_path` and `file-path` are
/// one name).
pub fn is_path_name(name: &str) -> bool {
    let n: String = name
        .chars()
        .filter(|c| *c != '_' && *c != '-')
        .flat_map(char::to_lowercase)
        .collect();
    const EXACT: &[&str] = &[
        "path",
        "paths",
        "file",
        "files",
        "filename",
        "filenames",
        "dir",
        "dirs",
        "directory",
        "directories",
        "folder",
        "folders",
        "cwd",
        "root",
        "roots",
        "uri",
        "uris",
        "source",
        "sources",
        "destination",
        "dest",
        "target",
        "src",
        "dst",
        "repository",
        "workdir",
        "location",
    ];
    const ENDS: &[&str] = &["path", "paths", "dir", "directory", "file", "files", "uri"];
    EXACT.contains(&n.as_str()) || ENDS.iter().any(|e| n.ends_with(e))
}

/// Whether a string value is a path the default rule looks at: absolute,
/// `~`-relative, a `file://` URI, or with a `..` segment.
/// Surrounding whitespace is ignored (a server may trim it), and any
/// `file:` value counts, written with `//` or not.
fn is_path_like(s: &str) -> bool {
    let s = s.trim();
    s.starts_with('/')
        || s.starts_with('~')
        || is_file_uri(s)
        || s.split(['/', '\\']).any(|seg| seg == "..")
}

/// Whether `s` starts with the `file:` scheme, in any case.
fn is_file_uri(s: &str) -> bool {
    s.get(..5).is_some_and(|h| h.eq_ignore_ascii_case("file:"))
}

/// The absolute sandbox path a value names, before resolution.
fn sandbox_text(s: &str) -> Result<String, String> {
    let s = s.trim();
    if s.is_empty() {
        return Err("empty path".into());
    }
    if s.contains('\0') {
        return Err("path contains a NUL byte".into());
    }
    if s.starts_with('~') {
        return Err("a path from a home directory (~) is outside the workspace".into());
    }
    let p = match strip_file_scheme(s) {
        Some(rest) => file_uri_path(rest)?,
        None if is_file_uri(s) => {
            return Err("a file URI must be written file:///path".into());
        }
        None => s.to_string(),
    };
    Ok(if p.starts_with('/') {
        p
    } else {
        format!("{WORKSPACE}/{p}")
    })
}

/// Whether `path` is one of `dirs` or under one, segment-wise.
fn under(path: &str, dirs: &[String]) -> bool {
    dirs.iter().any(|d| {
        let d = d.trim_end_matches('/');
        d.is_empty() || path == d || path.strip_prefix(d).is_some_and(|r| r.starts_with('/'))
    })
}

/// Checks one path value against `dirs`: Ok, or why it is outside.
fn check_path(s: &str, dirs: &[String], resolve: &dyn Resolve) -> Result<(), String> {
    let abs = sandbox_text(s)?;
    let resolved = resolve.resolve(&abs)?;
    if under(&resolved, dirs) {
        Ok(())
    } else if resolved != normalise_abs(&abs) {
        Err("the path leads outside the allowed directories through a symlink".into())
    } else {
        Err(format!("the path is outside {}", dirs.join(", ")))
    }
}

/// The rules of `[tools]` over argument values.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ArgumentRules {
    pub rules: Vec<ArgumentRule>,
    /// The default rule's verdict for a path-named argument outside the
    /// workspace ("deny" by default).
    pub outside_paths: Verdict,
}

impl Default for ArgumentRules {
    fn default() -> Self {
        ArgumentRules {
            rules: Vec::new(),
            outside_paths: Verdict::Deny,
        }
    }
}

impl ArgumentRules {
    /// Whether [`ArgumentRules::check`] (or [`translate_host_paths`]) could
    /// find anything in this call, on the text alone: a rule for `tool`
    /// whose argument is present, or, with the default rule on, a value it
    /// looks at (or arguments too large to tell). Pure and quick: a call
    /// for which it is false is not held for a check.
    pub fn applies_to(&self, tool: &str, args: Option<&Value>) -> bool {
        let Some(obj) = args.and_then(Value::as_object) else {
            return false;
        };
        if self
            .rules
            .iter()
            .any(|r| glob_match(&r.tool, tool) && obj.contains_key(&r.argument))
        {
            return true;
        }
        let mut budget = WALK_BUDGET;
        self.outside_paths != Verdict::Allow
            && obj
                .iter()
                .any(|(name, v)| looked_at(name, v, 0, &mut budget))
    }

    /// Checks a call's arguments. `skip` names arguments others check (a
    /// command line declared in `[commands]`): the default rule does not
    /// look at them. None when nothing was found to decide on.
    pub fn check(
        &self,
        tool: &str,
        args: Option<&Value>,
        ws: &Workspace,
        skip: &dyn Fn(&str) -> bool,
    ) -> Option<ArgumentFinding> {
        let obj = args.and_then(Value::as_object)?;
        let mut found: Option<ArgumentFinding> = None;
        let mut ruled: BTreeSet<&str> = BTreeSet::new();
        for (i, rule) in self.rules.iter().enumerate() {
            if !glob_match(&rule.tool, tool) {
                continue;
            }
            ruled.insert(rule.argument.as_str());
            let Some(value) = obj.get(&rule.argument) else {
                continue;
            };
            if let Some((reason, why)) = rule.violation(value, ws) {
                let d = Decision::new(rule.otherwise, reason, Source::ArgumentRule(i));
                found = Some(worse(
                    found,
                    d,
                    json!({"argument": rule.argument, "why": why}),
                ));
            }
        }
        if self.outside_paths == Verdict::Allow {
            return found;
        }
        let mut budget = WALK_BUDGET;
        for (name, value) in obj {
            if ruled.contains(name.as_str()) || skip(name) {
                continue;
            }
            if let Some(why) = default_violation(name, value, ws, 0, &mut budget) {
                let d = Decision::new(
                    self.outside_paths,
                    Reason::ArgumentPathOutside,
                    Source::OutsidePaths,
                );
                found = Some(worse(found, d, json!({"argument": name, "why": why})));
            }
        }
        found
    }
}

/// The call's arguments with the host paths they name made the sandbox's
/// (`/home/u/proj/a.rs` -> `/workspace/input/a.rs`), where `map` holds
/// them: the values the default rule looks at (a path-named argument's
/// absolute path, a `file://` URI anywhere). A path already under a
/// sandbox directory is left as it is. None when nothing changed.
pub fn translate_host_paths(
    args: &Value,
    map: &PathMap,
    skip: &dyn Fn(&str) -> bool,
) -> Option<Value> {
    let obj = args.as_object()?;
    let mut sandbox: Vec<String> = map.sandbox_dirs().map(str::to_string).collect();
    sandbox.push(WORKSPACE.to_string());
    let mut out = obj.clone();
    let mut changed = false;
    let mut budget = WALK_BUDGET;
    for (name, value) in out.iter_mut() {
        if !skip(name) {
            changed |= translate_value(name, value, map, &sandbox, 0, &mut budget);
        }
    }
    changed.then_some(Value::Object(out))
}

fn translate_value(
    name: &str,
    value: &mut Value,
    map: &PathMap,
    sandbox: &[String],
    depth: usize,
    budget: &mut usize,
) -> bool {
    if *budget == 0 || depth > WALK_DEPTH {
        return false; // the check that follows refuses what is this deep
    }
    *budget -= 1;
    match value {
        Value::String(s) => {
            let new = if strip_file_scheme(s).is_some() {
                let inside = sandbox_text(s).is_ok_and(|p| under(&normalise_abs(&p), sandbox));
                (!inside).then(|| map.uri_to_sandbox(s)).flatten()
            } else if is_path_name(name) && s.starts_with('/') && !under(&normalise_abs(s), sandbox)
            {
                map.to_sandbox(s)
            } else {
                None
            };
            match new {
                Some(n) => {
                    *s = n;
                    true
                }
                None => false,
            }
        }
        Value::Array(items) => items.iter_mut().fold(false, |c, v| {
            translate_value(name, v, map, sandbox, depth + 1, budget) | c
        }),
        Value::Object(m) => m.iter_mut().fold(false, |c, (k, v)| {
            translate_value(k, v, map, sandbox, depth + 1, budget) | c
        }),
        _ => false,
    }
}

/// How many values the default rule looks at in one call, and how deep:
/// a hostile host cannot make the check walk without end.
const WALK_BUDGET: usize = 10_000;
const WALK_DEPTH: usize = 16;

/// Whether the default rule (or host-path translation) looks at anything in
/// this argument: the walk of [`default_violation`] without the checks.
/// Past the budget or the depth it says yes, as the check then refuses.
fn looked_at(name: &str, value: &Value, depth: usize, budget: &mut usize) -> bool {
    if *budget == 0 || depth > WALK_DEPTH {
        return true;
    }
    *budget -= 1;
    match value {
        Value::String(s) => (is_path_name(name) && is_path_like(s)) || is_file_uri(s.trim()),
        Value::Array(items) => items.iter().any(|v| looked_at(name, v, depth + 1, budget)),
        Value::Object(map) => map.iter().any(|(k, v)| looked_at(k, v, depth + 1, budget)),
        _ => false,
    }
}

/// The default rule over one argument, at any depth: a path-named key's
/// string (or list of strings) that is path-like, and any `file://` string.
fn default_violation(
    name: &str,
    value: &Value,
    ws: &Workspace,
    depth: usize,
    budget: &mut usize,
) -> Option<String> {
    if *budget == 0 || depth > WALK_DEPTH {
        return Some("the arguments are too large or too deeply nested to check".into());
    }
    *budget -= 1;
    let path_name = is_path_name(name);
    match value {
        Value::String(s) => {
            let looked_at = (path_name && is_path_like(s)) || is_file_uri(s.trim());
            looked_at
                .then(|| check_path(s, ws.dirs, ws.resolve).err())
                .flatten()
        }
        Value::Array(items) => items.iter().find_map(|v| {
            // a list keeps its key's name: `paths = ["/a", "/b"]`
            default_violation(name, v, ws, depth + 1, budget)
        }),
        Value::Object(map) => map
            .iter()
            .find_map(|(k, v)| default_violation(k, v, ws, depth + 1, budget)),
        _ => None,
    }
}

impl ArgumentRule {
    /// The first constraint `value` breaks: (reason, why).
    fn violation(&self, value: &Value, ws: &Workspace) -> Option<(Reason, String)> {
        if let Some(max) = self.max_length {
            let len = match value {
                Value::String(s) => s.chars().count(),
                Value::Array(a) => a.len(),
                other => other.to_string().len(),
            };
            if len as u64 > max {
                return Some((
                    Reason::ArgumentTooLong,
                    format!("the value is {len} long, over max_length {max}"),
                ));
            }
        }
        if let Some(values) = &self.one_of {
            if !values.contains(value) {
                return Some((
                    Reason::ArgumentValueRefused,
                    "the value is not one of the rule's one_of".into(),
                ));
            }
        }
        let strings = || -> Result<Vec<&str>, String> {
            match value {
                Value::String(s) => Ok(vec![s.as_str()]),
                Value::Array(a) => a
                    .iter()
                    .map(|v| {
                        v.as_str()
                            .ok_or_else(|| "a list item is not a string".into())
                    })
                    .collect(),
                _ => Err("the value is not a string".into()),
            }
        };
        if let Some(dirs) = &self.paths {
            let checked = strings().and_then(|list| {
                list.into_iter()
                    .try_for_each(|s| check_path(s, dirs, ws.resolve))
            });
            if let Err(why) = checked {
                return Some((Reason::ArgumentPathOutside, why));
            }
        }
        if let Some(hosts) = &self.hosts {
            let checked = strings().and_then(|list| {
                list.into_iter().try_for_each(|s| {
                    let (host, port) = crate::url::host_port(s)?;
                    if hosts.iter().any(|h| h.covers(&host, port)) {
                        Ok(())
                    } else {
                        Err("the URL names a host the rule does not list".into())
                    }
                })
            });
            if let Err(why) = checked {
                return Some((Reason::ArgumentHostOutside, why));
            }
        }
        None
    }
}

/// The stricter of `prior` and `d`; details are kept per argument.
fn worse(prior: Option<ArgumentFinding>, d: Decision, detail: Value) -> ArgumentFinding {
    match prior {
        None => ArgumentFinding {
            decision: d,
            detail: json!({"arguments": [detail]}),
        },
        Some(mut p) => {
            p.decision = p.decision.stricter(d);
            if let Some(list) = p.detail.get_mut("arguments").and_then(Value::as_array_mut) {
                list.push(detail);
            }
            p
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ws_dirs() -> Vec<String> {
        vec!["/workspace".into(), "/data".into()]
    }

    fn check(rules: &ArgumentRules, tool: &str, args: Value) -> Option<ArgumentFinding> {
        let dirs = ws_dirs();
        let ws = Workspace {
            dirs: &dirs,
            resolve: &Lexical,
        };
        rules.check(tool, Some(&args), &ws, &|_| false)
    }

    fn rule(tool: &str, argument: &str) -> ArgumentRule {
        ArgumentRule {
            tool: tool.into(),
            argument: argument.into(),
            paths: None,
            hosts: None,
            one_of: None,
            max_length: None,
            not_a_path: false,
            otherwise: Verdict::Deny,
        }
    }

    #[test]
    fn path_names_are_recognised_whatever_their_spelling() {
        for n in [
            "path",
            "filePath",
            "file_path",
            "file-path",
            "repo_path",
            "cwd",
            "uri",
            "destination",
            "output_dir",
            "paths",
        ] {
            assert!(is_path_name(n), "{n}");
        }
        for n in ["content", "command", "query", "url", "message", "env"] {
            assert!(!is_path_name(n), "{n}");
        }
    }

    #[test]
    fn the_default_rule_refuses_paths_outside_the_workspace() {
        let r = ArgumentRules::default();
        for (k, v) in [
            ("path", "/etc/passwd"),
            ("path", "/workspace/../etc/passwd"),
            ("file", "../../etc/shadow"),
            ("dir", "~/.ssh"),
            ("path", "/workspacex/a"),
            ("content", "file:///etc/passwd"),
            ("uri", "FILE:///etc/passwd"),
            ("target", "file://localhost/root/x"),
            ("path", " /etc/passwd"),
            ("path", "file:/etc/passwd"),
            ("note", "file:etc/passwd"),
            ("path", "file:///workspace/%2e%2e/etc/passwd"),
        ] {
            let f = check(&r, "read", json!({ k: v })).unwrap_or_else(|| panic!("{k}={v}"));
            assert_eq!(f.decision.verdict, Verdict::Deny, "{k}={v}");
            assert_eq!(f.decision.reason, Reason::ArgumentPathOutside);
            assert_eq!(f.decision.source, "tools.outside_paths");
            // the detail names the argument, never its value
            assert!(!f.detail.to_string().contains(v), "{}", f.detail);
        }
    }

    #[test]
    fn the_default_rule_lets_workspace_paths_and_non_paths_through() {
        let r = ArgumentRules::default();
        for (k, v) in [
            ("path", "/workspace/input/a.txt"),
            ("path", "/data/x"),
            ("path", "src/main.rs"),
            ("path", "a/../b"),
            ("file", "file:///workspace/output/r.md"),
            // not a path by name: its text is never read as one
            ("content", "/etc/passwd is where users live"),
            ("command", "/bin/ls /"),
            ("timezone", "America/New_York"),
        ] {
            assert!(check(&r, "t", json!({ k: v })).is_none(), "{k}={v}");
        }
    }

    #[test]
    fn the_default_rule_looks_into_lists_and_nested_objects() {
        let r = ArgumentRules::default();
        let f = check(&r, "t", json!({"paths": ["/workspace/a", "/etc/passwd"]}));
        assert!(f.is_some());
        let f = check(&r, "t", json!({"edits": [{"file_path": "/root/.bashrc"}]}));
        assert!(f.is_some());
        let f = check(&r, "t", json!({"opts": {"note": "file:///etc/x"}}));
        assert!(f.is_some());
    }

    #[test]
    fn a_hostile_nesting_is_refused_not_walked_forever() {
        let r = ArgumentRules::default();
        let mut v = json!("x");
        for _ in 0..100 {
            v = json!({ "a": v });
        }
        let f = check(&r, "t", json!({ "deep": v })).unwrap();
        assert_eq!(f.decision.verdict, Verdict::Deny);
    }

    #[test]
    fn outside_paths_allow_turns_the_default_rule_off() {
        let r = ArgumentRules {
            outside_paths: Verdict::Allow,
            ..ArgumentRules::default()
        };
        let args = json!({"path": "/etc/passwd"});
        assert!(!r.applies_to("read", Some(&args)));
        assert!(check(&r, "read", args).is_none());
    }

    #[test]
    fn a_call_is_held_for_a_check_whenever_the_check_could_find_anything() {
        let mut m = rule("send", "body");
        m.max_length = Some(3);
        let r = ArgumentRules {
            rules: vec![m],
            ..ArgumentRules::default()
        };
        let mut deep = json!("x");
        for _ in 0..100 {
            deep = json!({ "a": deep });
        }
        let cases = [
            ("echo", json!({"message": "hello", "n": 3}), false),
            ("echo", json!({"content": "/etc/passwd is text"}), false),
            ("echo", json!({"path": "src/a.rs"}), false),
            ("send", json!({"to": "x"}), false),
            ("send", json!({"body": "hi"}), true),
            ("echo", json!({"path": "/etc/passwd"}), true),
            ("echo", json!({"opts": {"files": ["../x"]}}), true),
            ("echo", json!({"note": " file:/etc/x"}), true),
            ("echo", json!({ "deep": deep }), true),
        ];
        for (tool, args, held) in cases {
            assert_eq!(r.applies_to(tool, Some(&args)), held, "{tool} {args}");
            // nothing found where nothing is held
            if !held {
                assert!(check(&r, tool, args).is_none());
            }
        }
        assert!(!r.applies_to("echo", None));
    }

    #[test]
    fn a_rule_on_an_argument_replaces_the_default_rule() {
        let mut nap = rule("http_get", "path");
        nap.not_a_path = true;
        let r = ArgumentRules {
            rules: vec![nap],
            ..ArgumentRules::default()
        };
        assert!(check(&r, "http_get", json!({"path": "/v1/users"})).is_none());
        // only for that tool
        assert!(check(&r, "read", json!({"path": "/v1/users"})).is_some());
    }

    #[test]
    fn a_paths_rule_confines_to_its_directories() {
        let mut pr = rule("write_*", "path");
        pr.paths = Some(vec!["/workspace/output".into()]);
        pr.otherwise = Verdict::Approve;
        let r = ArgumentRules {
            rules: vec![pr],
            ..ArgumentRules::default()
        };
        assert!(check(&r, "write_file", json!({"path": "/workspace/output/a"})).is_none());
        // relative: from /workspace
        let f = check(&r, "write_file", json!({"path": "input/a"})).unwrap();
        assert_eq!(f.decision.verdict, Verdict::Approve);
        assert_eq!(f.decision.source, "tools.arguments[0]");
        let f = check(
            &r,
            "write_file",
            json!({"path": ["/workspace/output/a", "/x"]}),
        );
        assert!(f.is_some());
        let f = check(&r, "write_file", json!({"path": 3})).unwrap();
        assert_eq!(f.decision.reason, Reason::ArgumentPathOutside);
    }

    #[test]
    fn a_symlink_that_leads_out_is_outside() {
        struct Links;
        impl Resolve for Links {
            fn resolve(&self, path: &str) -> Result<String, String> {
                Ok(normalise_abs(path).replace("/workspace/output/link", "/etc"))
            }
        }
        let dirs = ws_dirs();
        let ws = Workspace {
            dirs: &dirs,
            resolve: &Links,
        };
        let r = ArgumentRules::default();
        let args = json!({"path": "/workspace/output/link/passwd"});
        let f = r.check("read", Some(&args), &ws, &|_| false).unwrap();
        assert!(f.detail.to_string().contains("symlink"), "{}", f.detail);
    }

    #[test]
    fn hosts_one_of_and_max_length() {
        let mut h = rule("fetch", "url");
        h.hosts = Some(vec![HostRule::parse("*.example.com").unwrap()]);
        let mut e = rule("deploy", "env");
        e.one_of = Some(vec![json!("staging"), json!("prod")]);
        let mut m = rule("send", "body");
        m.max_length = Some(5);
        let r = ArgumentRules {
            rules: vec![h, e, m],
            ..ArgumentRules::default()
        };
        assert!(check(&r, "fetch", json!({"url": "https://api.example.com/x"})).is_none());
        for bad in [
            "https://example.com/",
            "https://api.example.com:8443/",
            "https://api.example.com@evil.com/",
            "https://evil.com\\@api.example.com/",
            "ftp://api.example.com/",
            "api.example.com",
        ] {
            let f = check(&r, "fetch", json!({ "url": bad })).unwrap_or_else(|| panic!("{bad}"));
            assert_eq!(f.decision.reason, Reason::ArgumentHostOutside, "{bad}");
        }
        assert!(check(&r, "deploy", json!({"env": "prod"})).is_none());
        let f = check(&r, "deploy", json!({"env": "prod "})).unwrap();
        assert_eq!(f.decision.reason, Reason::ArgumentValueRefused);
        assert!(check(&r, "send", json!({"body": "héllo"})).is_none());
        let f = check(&r, "send", json!({"body": "hello!"})).unwrap();
        assert_eq!(f.decision.reason, Reason::ArgumentTooLong);
    }

    #[test]
    fn host_paths_in_arguments_become_the_sandbox_paths() {
        let map = PathMap::new([("/home/u/proj", "/workspace/input")]);
        let args = json!({
            "path": "/home/u/proj/src/a.rs",
            "paths": ["/home/u/proj/b", "/workspace/input/c", "/etc/x"],
            "content": "/home/u/proj/not-a-path-argument",
            "nested": {"uri": "file:///home/u/proj/d%20e"},
            "command": "/home/u/proj/run",
        });
        let skip = |n: &str| n == "command";
        let out = translate_host_paths(&args, &map, &skip).unwrap();
        assert_eq!(out["path"], "/workspace/input/src/a.rs");
        assert_eq!(
            out["paths"],
            json!(["/workspace/input/b", "/workspace/input/c", "/etc/x"])
        );
        assert_eq!(out["content"], args["content"]);
        assert_eq!(out["nested"]["uri"], "file:///workspace/input/d%20e");
        assert_eq!(out["command"], args["command"]);
        assert!(translate_host_paths(&json!({"path": "/etc/x"}), &map, &skip).is_none());
    }
}
