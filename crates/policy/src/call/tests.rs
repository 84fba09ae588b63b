//! The call decision as tables: tool rule × argument rule × command
//! category (and the built-in server's checks) → verdict, reason, source.
//! Pure: the world is a table too (lexical paths, in-process classifier,
//! file sizes from a map).

use std::collections::BTreeMap;
use std::path::Path;

use serde_json::{json, Value};

use super::*;
use crate::arguments::Lexical;
use crate::commands::InProcess;

const POLICY: &str = r#"
[tools]
destructive = "approve"
outside_paths = "deny"
"delete_*" = "deny"
"write_*" = "approve"
run_shell = "allow"

[[tools.arguments]]
tool = "fetch"
argument = "url"
hosts = ["api.github.com"]
otherwise = "approve"

[commands]
tools = ["run_shell.cmd"]

[commands.categories]
delete = "approve"

[commands.programs]
curl = "deny"
"#;

/// The world as a table.
struct Table {
    dirs: Vec<String>,
    map: PathMap,
    sizes: BTreeMap<&'static str, u64>,
}

impl World for Table {
    fn resolver(&self) -> &dyn Resolve {
        &Lexical
    }
    fn classifier(&self) -> &dyn Classifier {
        &InProcess
    }
    fn dirs(&self) -> &[String] {
        &self.dirs
    }
    fn paths(&self) -> &PathMap {
        &self.map
    }
    fn measure(&self, path: &str) -> Result<u64, String> {
        self.sizes
            .get(path)
            .copied()
            .ok_or_else(|| format!("{path}: no such file"))
    }
}

fn world() -> Table {
    Table {
        dirs: vec![BUILTIN_ROOT.to_string()],
        map: PathMap::new([("/home/u/proj", "/workspace/input")]),
        sizes: BTreeMap::from([
            ("/workspace/output/big.tar", 500),
            ("/workspace/output/small.txt", 10),
        ]),
    }
}

fn rules(builtin: Option<BuiltinRules>) -> CallRules {
    let p = crate::parse(POLICY, Path::new("/p/policy.toml")).expect("the table's policy");
    CallRules::new(p.tools, p.commands, builtin)
}

const NONE: ToolHints = ToolHints {
    read_only: None,
    destructive: None,
    idempotent: None,
    open_world: None,
};
const DESTRUCTIVE: ToolHints = ToolHints {
    destructive: Some(true),
    ..NONE
};

type Row = (
    &'static str,
    ToolHints,
    Value,
    Verdict,
    Reason,
    &'static str,
);

/// Checks every row against [`CallRules::decide`], and that the relay's
/// staged path (step 1 on the session core, step 2 by its driver, joined
/// with [`combine`]) reaches the same decision.
fn check(rules: &CallRules, rows: &[Row]) -> Vec<CallDecision> {
    let w = world();
    let mut out = Vec::new();
    for (tool, hints, args, verdict, reason, source) in rows {
        let args = Some(args).filter(|a| !a.is_null());
        let got = rules.decide(tool, hints, args, &w);
        assert_eq!(
            (
                got.decision.verdict,
                got.decision.reason,
                got.decision.source.to_string()
            ),
            (*verdict, *reason, source.to_string()),
            "{tool} {args:?}"
        );
        let named = rules.decide_tool(tool, hints);
        let staged = if named.verdict == Verdict::Deny || !rules.checks_arguments(tool, args) {
            CallDecision::of(named)
        } else {
            combine(named, rules.decide_arguments(tool, args, &w))
        };
        assert_eq!(staged.decision, got.decision, "{tool} staged");
        assert_eq!(staged.detail, got.detail, "{tool} staged detail");
        out.push(got);
    }
    out
}

#[test]
fn tool_rules_arguments_and_commands_decide_a_call() {
    use Reason::*;
    use Verdict::*;
    let rows: Vec<Row> = vec![
        // the name alone
        (
            "read_file",
            NONE,
            json!({}),
            Allow,
            ToolDefault,
            "tools.default",
        ),
        (
            "delete_x",
            NONE,
            json!({}),
            Deny,
            ToolRule,
            "tools.\"delete_*\"",
        ),
        (
            "write_x",
            NONE,
            json!({}),
            Approve,
            ToolRule,
            "tools.\"write_*\"",
        ),
        // a destructive hint raises a glob's or the default's decision...
        (
            "nuke",
            DESTRUCTIVE,
            json!({}),
            Approve,
            ToolDestructiveHint,
            "tools.destructive",
        ),
        // ...never an exact rule's
        (
            "run_shell",
            DESTRUCTIVE,
            json!({"cmd": "ls"}),
            Allow,
            ToolRule,
            "tools.run_shell",
        ),
        // a denied name ends the decision: its arguments are not read
        (
            "delete_x",
            NONE,
            json!({"path": "/etc"}),
            Deny,
            ToolRule,
            "tools.\"delete_*\"",
        ),
        // command categories under an allowing tool rule (the tool's on a tie)
        (
            "run_shell",
            NONE,
            json!({"cmd": "ls -la"}),
            Allow,
            ToolRule,
            "tools.run_shell",
        ),
        (
            "run_shell",
            NONE,
            json!({"cmd": "rm -rf x"}),
            Approve,
            CommandCategory,
            "commands.categories.delete",
        ),
        (
            "run_shell",
            NONE,
            json!({"cmd": "sudo ls"}),
            Deny,
            CommandCategory,
            "commands.categories.privilege",
        ),
        (
            "run_shell",
            NONE,
            json!({"cmd": "ls && sudo ls"}),
            Deny,
            CommandCategory,
            "commands.categories.privilege",
        ),
        (
            "run_shell",
            NONE,
            json!({"cmd": "curl https://x"}),
            Deny,
            CommandProgram,
            "commands.programs.curl",
        ),
        (
            "run_shell",
            NONE,
            json!({"cmd": "echo 'open"}),
            Approve,
            CommandUnparsed,
            "commands.unparsed",
        ),
        (
            "run_shell",
            NONE,
            json!({"cmd": 3}),
            Deny,
            ArgumentInvalid,
            "commands.tools",
        ),
        (
            "run_shell",
            NONE,
            json!("ls"),
            Deny,
            ArgumentInvalid,
            "commands.tools",
        ),
        // argument rules
        (
            "fetch",
            NONE,
            json!({"url": "https://api.github.com/x"}),
            Allow,
            ToolDefault,
            "tools.default",
        ),
        (
            "fetch",
            NONE,
            json!({"url": "https://evil.example/x"}),
            Approve,
            ArgumentHostOutside,
            "tools.arguments[0]",
        ),
        (
            "read_file",
            NONE,
            json!({"path": "/etc/passwd"}),
            Deny,
            ArgumentPathOutside,
            "tools.outside_paths",
        ),
        (
            "read_file",
            NONE,
            json!({"path": "/workspace/../etc"}),
            Deny,
            ArgumentPathOutside,
            "tools.outside_paths",
        ),
        (
            "read_file",
            NONE,
            json!({"path": "/workspace/a"}),
            Allow,
            ToolDefault,
            "tools.default",
        ),
        // the stricter of the name's approve and the arguments' deny
        (
            "write_x",
            NONE,
            json!({"path": "/etc/passwd"}),
            Deny,
            ArgumentPathOutside,
            "tools.outside_paths",
        ),
        (
            "write_x",
            NONE,
            json!({"path": "/workspace/a"}),
            Approve,
            ToolRule,
            "tools.\"write_*\"",
        ),
        // a host path the sandbox mounts is the sandbox's: inside
        (
            "read_file",
            NONE,
            json!({"path": "/home/u/proj/a.rs"}),
            Allow,
            ToolDefault,
            "tools.default",
        ),
        // no arguments at all
        (
            "read_file",
            NONE,
            Value::Null,
            Allow,
            ToolDefault,
            "tools.default",
        ),
    ];
    let got = check(&rules(None), &rows);
    // the host path was rewritten for the server, and the audit says so
    let translated = &got[21];
    assert_eq!(
        translated.arguments,
        Some(json!({"path": "/workspace/input/a.rs"}))
    );
    assert_eq!(translated.detail["host_paths_translated"], json!(true));
    // the audit detail names the categories, never the line
    assert_eq!(got[7].detail["categories"], json!(["delete"]));
}

#[test]
fn the_builtin_servers_checks_join_the_policys() {
    use Reason::*;
    use Verdict::*;
    let rows: Vec<Row> = vec![
        (
            "read_file",
            NONE,
            json!({"path": "/workspace/a"}),
            Allow,
            ToolDefault,
            "tools.default",
        ),
        (
            "read_file",
            NONE,
            json!({"path": "/etc/passwd"}),
            Deny,
            ArgumentPathOutside,
            "builtin.read_file.path",
        ),
        (
            "read_file",
            NONE,
            json!({"path": "../../etc"}),
            Deny,
            ArgumentPathOutside,
            "builtin.read_file.path",
        ),
        (
            "exec",
            NONE,
            json!({"command": "ls", "cwd": 5}),
            Deny,
            ArgumentInvalid,
            "builtin.exec.cwd",
        ),
        (
            "exec",
            NONE,
            json!({"command": "ls", "cwd": "/tmp"}),
            Deny,
            ArgumentPathOutside,
            "builtin.exec.cwd",
        ),
        // exec and start_job are declared command tools
        (
            "exec",
            NONE,
            json!({"command": "sudo id"}),
            Deny,
            CommandCategory,
            "commands.categories.privilege",
        ),
        (
            "start_job",
            NONE,
            json!({"argv": ["rm", "-r", "x"]}),
            Approve,
            CommandCategory,
            "commands.categories.delete",
        ),
        (
            "exec",
            NONE,
            json!({"argv": ["ls", 1]}),
            Deny,
            ArgumentInvalid,
            "commands.argv_tools",
        ),
        // run_code is its interpreter, or the shell line it is
        (
            "run_code",
            NONE,
            json!({"language": "sh", "code": "rm -rf /w"}),
            Approve,
            CommandCategory,
            "commands.categories.delete",
        ),
        (
            "run_code",
            NONE,
            json!({"language": "python", "code": "import os"}),
            Allow,
            ToolDefault,
            "tools.default",
        ),
        // an artifact over the limit asks a human for its size
        (
            "export_artifact",
            NONE,
            json!({"path": "/workspace/output/big.tar"}),
            Approve,
            ArtifactLarge,
            "artifacts.max_size",
        ),
        (
            "export_artifact",
            NONE,
            json!({"path": "/workspace/output/small.txt"}),
            Allow,
            ToolDefault,
            "tools.default",
        ),
        (
            "export_artifact",
            NONE,
            json!({"path": "/workspace/output/gone"}),
            Deny,
            ArtifactRefused,
            "builtin.export_artifact",
        ),
        (
            "export_artifact",
            NONE,
            json!({"path": "/etc/shadow"}),
            Deny,
            ArgumentPathOutside,
            "builtin.export_artifact.path",
        ),
    ];
    let got = check(&rules(Some(BuiltinRules { max_size: 100 })), &rows);
    let max_bytes = |c: &CallDecision| {
        c.meta
            .iter()
            .find(|(k, _)| k == META_MAX_BYTES)
            .map(|(_, v)| v.clone())
    };
    // the size a human approves is the most the server copies
    assert_eq!(max_bytes(&got[10]), Some(json!(500)));
    assert_eq!(got[10].measured, Some(500));
    // under the limit: the limit
    assert_eq!(max_bytes(&got[11]), Some(json!(100)));
    // unmeasured: nothing
    assert_eq!(max_bytes(&got[12]), Some(json!(0)));
    assert_eq!(got[12].measured, None);
}

#[test]
fn no_policy_allows_every_call_by_its_tools_default() {
    let rules = CallRules::default();
    let d = rules.decide(
        "anything",
        &DESTRUCTIVE,
        Some(&json!({"path": "/etc"})),
        &world(),
    );
    // the default policy denies paths outside the workspace
    assert_eq!(d.decision.verdict, Verdict::Deny);
    assert_eq!(d.decision.source, Source::OutsidePaths);
    let d = rules.decide("anything", &NONE, None, &world());
    assert_eq!(
        (d.decision.verdict, d.decision.source),
        (Verdict::Allow, Source::ToolDefault)
    );
}
