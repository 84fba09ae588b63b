//! How one `tools/call` is decided: the one place.
//!
//! [`CallRules::decide`] is the decision of a call, from the policy's
//! `[tools]` (name rules, `destructive`, `[[tools.arguments]]`,
//! `outside_paths`), its `[commands]` (the categories and programs of the
//! command lines a tool's declared arguments hold) and, when the server is
//! mcpbox's built-in one, that server's own argument checks. What needs the
//! world (a path resolved as the sandbox sees it, symlinks included; a
//! command line parsed in a child process with limits; a file measured on
//! the host) comes through [`World`], which the binary implements; the rest
//! is pure, and tested here as tables.
//!
//! The flow, in order:
//! 1. the tool's name ([`CallRules::decide_tool`]): the strictest matching
//!    `[tools]` pattern, else `tools.default`; a destructive hint may only
//!    raise it (`tools.destructive`). A deny ends here.
//! 2. its arguments ([`CallRules::decide_arguments`]), when any rule
//!    applies ([`CallRules::checks_arguments`]): host paths are made the
//!    sandbox's, then `[commands]` classifies declared command lines, the
//!    built-in server's checks run, then the argument rules; the strictest
//!    of these wins, with every detail for the audit.
//! 3. the two combined ([`combine`]): the stricter; the tool's on a tie.
//!
//! The relay's session core runs the same three steps with the second off
//! its thread (the argument step may do I/O): it calls
//! [`CallRules::decide_tool`] through its `ToolPolicy`, has its driver run
//! [`CallRules::decide_arguments`], and joins them with [`combine`]; a
//! test below checks the staged result is [`CallRules::decide`]'s.
//! What comes after a verdict (pins before, a human for `approve`, the
//! audit's commit before an allowed call goes on) is the relay's; they
//! speak the same [`Decision`] and [`crate::Reason`] vocabulary.

use serde_json::{json, Value};

use crate::arguments::{translate_host_paths, Resolve, Workspace};
use crate::commands::{Classifier, CommandRules, Input};
use crate::decision::{Decision, Reason, Source, ToolHints, Verdict};
use crate::paths::{confine_path, PathMap};
use crate::tools::ToolRules;

/// The workspace inside the built-in server's sandbox.
pub const BUILTIN_ROOT: &str = "/workspace";
/// The built-in server's tools whose `command`/`argv` arguments are command lines.
pub const BUILTIN_COMMAND_TOOLS: &[&str] = &["exec", "start_job"];
/// The built-in server's tools with a `cwd` argument.
pub const BUILTIN_CWD_TOOLS: &[&str] = &["exec", "run_code", "start_job"];
/// The built-in server's tools whose `path` argument names a file in the
/// workspace (checked by the gateway too).
pub const BUILTIN_PATH_TOOLS: &[&str] = &[
    "read_file",
    "write_file",
    "list_files",
    "delete_file",
    "export_artifact",
];
/// The `_meta` key of a call to `export_artifact` by which the gateway says
/// how many bytes it allows (the policy's max size, or what a human
/// approved). The gateway sets it on every such call and overwrites what
/// the host sent; without it the server's own limit applies.
pub const META_MAX_BYTES: &str = "io.mcpbox/max_bytes";

/// What deciding a call needs from the world. The binary's implementation
/// reads the sandbox's directories on the host; tests use tables.
pub trait World {
    /// Resolves a sandbox path as the sandbox would (`..`, symlinks).
    fn resolver(&self) -> &dyn Resolve;
    /// Classifies a command line or vector (the binary: in a child process).
    fn classifier(&self) -> &dyn Classifier;
    /// What a path argument may name: /workspace and the policy's mounts.
    fn dirs(&self) -> &[String];
    /// The host directories behind the sandbox's, for host paths in arguments.
    fn paths(&self) -> &PathMap;
    /// The size of the regular file at `path` (absolute, normalised, under
    /// [`BUILTIN_ROOT`]) as the host sees it, no link followed; why not
    /// when it cannot be measured.
    fn measure(&self, path: &str) -> Result<u64, String>;
}

/// The rules that decide a call to one server.
#[derive(Debug, Clone, Default)]
pub struct CallRules {
    /// `[tools]`, with `[[tools.arguments]]` and `outside_paths`.
    pub tools: ToolRules,
    /// `[commands]`, with the built-in server's command tools declared.
    pub commands: CommandRules,
    /// The built-in server's `artifacts.max_size`, when the server is it.
    pub builtin: Option<BuiltinRules>,
}

/// The built-in sandbox server's own argument rules.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct BuiltinRules {
    /// `artifacts.max_size`: a larger export needs a human.
    pub max_size: u64,
}

/// A call's decision, with what the audit record and the forwarded call
/// need besides.
#[derive(Debug, Clone)]
pub struct CallDecision {
    /// The verdict, its reason and its source.
    pub decision: Decision,
    /// What the rules found, for the call's audit record (command
    /// categories and program names, the argument and why; never values).
    pub detail: Value,
    /// `params._meta` entries the gateway sets on the call it forwards,
    /// replacing what the host sent under those keys.
    pub meta: Vec<(String, Value)>,
    /// The arguments forwarded instead of the host's (its host paths made
    /// the sandbox's); None forwards them as sent.
    pub arguments: Option<Value>,
    /// What the rules measured that a human would approve (the bytes of
    /// a file `export_artifact` copies): an approval covers no more.
    pub measured: Option<u64>,
}

impl CallDecision {
    /// A decision with nothing besides.
    pub fn of(decision: Decision) -> CallDecision {
        CallDecision {
            decision,
            detail: Value::Null,
            meta: Vec::new(),
            arguments: None,
            measured: None,
        }
    }

    /// The stricter of `prior` and `d` (`prior`'s on a tie), with both
    /// details and every meta entry.
    pub fn merge(
        prior: Option<CallDecision>,
        d: Decision,
        detail: Value,
        meta: Vec<(String, Value)>,
    ) -> CallDecision {
        match prior {
            None => CallDecision {
                detail,
                meta,
                ..CallDecision::of(d)
            },
            Some(mut p) => {
                p.decision = p.decision.stricter(d);
                if let (Some(a), Some(b)) = (p.detail.as_object_mut(), detail.as_object()) {
                    for (k, v) in b {
                        a.insert(k.clone(), v.clone());
                    }
                } else if p.detail.is_null() {
                    p.detail = detail;
                }
                p.meta.extend(meta);
                p
            }
        }
    }
}

/// Step 3: the tool's decision and its arguments' combined: the stricter
/// wins, the tool's on a tie; the arguments' detail, meta, rewritten
/// arguments and measure stay.
pub fn combine(tool: Decision, arguments: Option<CallDecision>) -> CallDecision {
    match arguments {
        None => CallDecision::of(tool),
        Some(mut a) => {
            a.decision = tool.stricter(a.decision);
            a
        }
    }
}

impl CallRules {
    /// The rules of a policy's `[tools]` and `[commands]`; with `builtin`
    /// when the server is the built-in one, whose command tools are then
    /// declared in `[commands]` (unless the policy declares them itself).
    pub fn new(
        tools: ToolRules,
        mut commands: CommandRules,
        builtin: Option<BuiltinRules>,
    ) -> CallRules {
        if builtin.is_some() {
            for t in BUILTIN_COMMAND_TOOLS {
                commands.declare_line(t, "command");
                commands.declare_argv(t, "argv");
            }
        }
        CallRules {
            tools,
            commands,
            builtin,
        }
    }

    /// THE decision of a call to `tool` with `arguments`: the three steps
    /// of the module's documentation, in order.
    pub fn decide(
        &self,
        tool: &str,
        hints: &ToolHints,
        arguments: Option<&Value>,
        world: &dyn World,
    ) -> CallDecision {
        let named = self.decide_tool(tool, hints);
        if named.verdict == Verdict::Deny || !self.checks_arguments(tool, arguments) {
            return CallDecision::of(named);
        }
        combine(named, self.decide_arguments(tool, arguments, world))
    }

    /// Step 1: the tool's name, with the server's (untrusted) hints,
    /// which can only tighten.
    pub fn decide_tool(&self, tool: &str, hints: &ToolHints) -> Decision {
        self.tools.decide(tool, hints)
    }

    /// Whether `tool` stays in `tools/list` results.
    pub fn visible(&self, tool: &str, hints: &ToolHints) -> bool {
        self.tools.visible_in_list(tool, hints)
    }

    /// Whether step 2 has anything to look at for this call: pure and
    /// quick, and true whenever [`CallRules::decide_arguments`] could find
    /// anything.
    pub fn checks_arguments(&self, tool: &str, arguments: Option<&Value>) -> bool {
        self.builtin.is_some()
            || self.commands.declares(tool)
            || self.tools.arguments.applies_to(tool, arguments)
    }

    /// Step 2: the rules over a call's arguments; None when none found
    /// anything to decide on.
    pub fn decide_arguments(
        &self,
        tool: &str,
        arguments: Option<&Value>,
        world: &dyn World,
    ) -> Option<CallDecision> {
        // a command line is the [commands] rules' to read, not a path
        let skip = |name: &str| self.commands.declares_argument(tool, name);
        let translated = arguments.and_then(|a| translate_host_paths(a, world.paths(), &skip));
        let arguments = translated.as_ref().or(arguments);
        let mut found = self
            .commands
            .decide_call_with(tool, arguments, world.classifier())
            .map(|c| CallDecision {
                detail: c.audit_detail(),
                ..CallDecision::of(c.decision.clone())
            });
        if let Some(b) = &self.builtin {
            found = b.check(tool, arguments, &self.commands, world, found);
        }
        let ws = Workspace {
            dirs: world.dirs(),
            resolve: world.resolver(),
        };
        if let Some(f) = self.tools.arguments.check(tool, arguments, &ws, &skip) {
            found = Some(CallDecision::merge(found, f.decision, f.detail, Vec::new()));
        }
        if translated.is_some() {
            let mut c = found.unwrap_or_else(|| {
                CallDecision::of(Decision::allow(Reason::ToolDefault, Source::ToolArguments))
            });
            if c.detail.is_null() {
                c.detail = json!({});
            }
            if let Some(d) = c.detail.as_object_mut() {
                d.insert("host_paths_translated".into(), Value::Bool(true));
            }
            c.arguments = translated;
            found = Some(c);
        }
        found
    }
}

impl BuiltinRules {
    /// Adds the built-in server's own rules to what `[commands]` found:
    /// - a `path` or `cwd` argument outside /workspace is refused before
    ///   the server sees it (the server resolves paths with
    ///   RESOLVE_BENEATH besides, which catches the symlinks);
    /// - `run_code` is classified as its interpreter (a shell snippet as
    ///   the command line it is);
    /// - `export_artifact`'s file is measured on the host: over
    ///   `max_size` the call needs a human, and the size allowed is set in
    ///   the call's `_meta` ([`META_MAX_BYTES`]), so the server copies no
    ///   more than was approved.
    fn check(
        &self,
        tool: &str,
        args: Option<&Value>,
        commands: &CommandRules,
        world: &dyn World,
        prior: Option<CallDecision>,
    ) -> Option<CallDecision> {
        let mut out = prior;
        let args = args.unwrap_or(&Value::Null);
        let mut keys: Vec<&str> = Vec::new();
        if BUILTIN_PATH_TOOLS.contains(&tool) {
            keys.push("path");
        }
        if BUILTIN_CWD_TOOLS.contains(&tool) {
            keys.push("cwd");
        }
        // the tool's name as the lists hold it, for the source
        let listed = BUILTIN_PATH_TOOLS
            .iter()
            .chain(BUILTIN_CWD_TOOLS)
            .find(|t| **t == tool)
            .copied()
            .unwrap_or("");
        for key in keys {
            let source = || match key {
                "path" => Source::BuiltinPath(listed),
                _ => Source::BuiltinCwd(listed),
            };
            match args.get(key) {
                None => {}
                Some(Value::String(p)) => {
                    if let Err(why) = confine_path(p, BUILTIN_ROOT) {
                        let d = Decision::deny(Reason::ArgumentPathOutside, source());
                        let detail = json!({"argument": key, "why": why});
                        return Some(CallDecision::merge(out, d, detail, Vec::new()));
                    }
                }
                Some(_) => {
                    let d = Decision::deny(Reason::ArgumentInvalid, source());
                    let detail = json!({"argument": key});
                    return Some(CallDecision::merge(out, d, detail, Vec::new()));
                }
            }
        }
        if tool == "run_code" && !commands.is_empty() {
            // a shell snippet is a command line like exec's: its commands
            // are classified, or `sudo` denied in exec would pass here;
            // Python and Node code is its interpreter's category (`build`)
            let code = args.get("code").and_then(Value::as_str).unwrap_or("");
            let input = match args.get("language").and_then(Value::as_str) {
                Some("sh") => Input::Line(code.to_string()),
                Some("python") => Input::Argv(vec!["python3".into()]),
                _ => Input::Argv(vec!["node".into()]),
            };
            let cd = commands.decide(world.classifier().classify(&input));
            let detail = cd.audit_detail();
            out = Some(CallDecision::merge(out, cd.decision, detail, Vec::new()));
        }
        if tool == "export_artifact" {
            let path = args.get("path").and_then(Value::as_str).unwrap_or("");
            let (d, detail, size) = self.measure(path, world);
            let mut c = CallDecision::merge(out, d, detail, Vec::new());
            // A human who approves this export (over the limit, or under
            // an `approve` rule) approves this size: the broker binds the
            // approval to it, so a retry after the file grew is a new
            // question, and the server copies no more than it
            // (META_MAX_BYTES), however the file grows meanwhile.
            let allowed = match size {
                None => 0,
                Some(n) if c.decision.verdict == Verdict::Approve => n,
                Some(n) => n.max(self.max_size),
            };
            c.meta.push((META_MAX_BYTES.to_string(), json!(allowed)));
            c.measured = size;
            out = Some(c);
        }
        out
    }

    /// Measures an artifact: (decision, detail, its size when it could be
    /// measured).
    fn measure(&self, path: &str, world: &dyn World) -> (Decision, Value, Option<u64>) {
        let refuse = |why: String| {
            (
                Decision::deny(Reason::ArtifactRefused, Source::BuiltinExport),
                json!({"artifact": path, "why": why}),
                None,
            )
        };
        let size = match confine_path(path, BUILTIN_ROOT).and_then(|abs| world.measure(&abs)) {
            Ok(s) => s,
            Err(why) => return refuse(why),
        };
        let detail = json!({"artifact": path, "bytes": size, "max_size": self.max_size});
        if size > self.max_size {
            // the human approves this size; the server copies no more
            let d = Decision::approve(Reason::ArtifactLarge, Source::ArtifactsMaxSize);
            (d, detail, Some(size))
        } else {
            let d = Decision::allow(Reason::ToolDefault, Source::BuiltinExport);
            (d, detail, Some(size))
        }
    }
}

#[cfg(test)]
mod tests;
