//! The generator's unit tests: observations in, policy text out, and the
//! text always passes the policy parser (what `mcpbox check` runs).
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::path::{Path, PathBuf};

use super::*;

fn base(text: &str) -> Policy {
    crate::parse(text, Path::new("/srv/learn/base.toml")).expect("base parses")
}

const WORKSPACE: &str = "[filesystem]\ninput = \"/srv/in\"\noutput = \"/srv/out\"\n";

fn proposed(base: &Policy, seen: &Observed) -> (String, Policy) {
    let text = propose(base, "learned", seen).expect("propose");
    let policy = crate::parse(&text, Path::new("/srv/learn/learned.toml"))
        .unwrap_or_else(|e| panic!("the proposal does not parse: {e}\n{text}"));
    (text, policy)
}

fn file(path: &str, read: bool, written: bool) -> FileSeen {
    FileSeen {
        path: path.into(),
        read,
        written,
    }
}

fn call(tool: &str, files: Vec<FileSeen>) -> Call {
    Call {
        tool: tool.into(),
        allowed: true,
        files,
        truncated: false,
        span: None,
    }
}

fn kernel() -> Observed {
    Observed {
        command: "server /workspace/input".into(),
        files_mode: Some("kernel".into()),
        ..Observed::default()
    }
}

/// The lines that are not comments: what the policy grants.
fn rules(text: &str) -> String {
    text.lines()
        .filter(|l| !l.trim_start().starts_with('#'))
        .collect::<Vec<_>>()
        .join("\n")
}

#[test]
fn no_files_seen_proposes_no_mounts_and_no_network() {
    let b = base(WORKSPACE);
    let (text, p) = proposed(&b, &kernel());
    assert_eq!(p.filesystem.input, None, "{text}");
    assert_eq!(p.filesystem.output, None, "{text}");
    assert!(
        p.network.allow.is_empty() && p.network.is_closed(),
        "{text}"
    );
    assert!(
        text.contains("# not proposed: input = \"/srv/in\" (no file under /workspace/input was touched during a call)"),
        "{text}"
    );
    assert!(
        text.contains("# no connection was made: no egress"),
        "{text}"
    );
}

#[test]
fn reads_only_give_a_read_only_input_and_no_output() {
    let b = base(WORKSPACE);
    let mut seen = kernel();
    seen.calls = vec![
        call(
            "read_text_file",
            vec![file("/workspace/input/notes.txt", true, false)],
        ),
        call(
            "read_text_file",
            vec![
                file("/workspace/input/a/b.txt", true, false),
                file("/workspace/input/notes.txt", true, false),
            ],
        ),
    ];
    let (text, p) = proposed(&b, &seen);
    assert_eq!(p.filesystem.input.as_deref(), Some(Path::new("/srv/in")));
    assert_eq!(p.filesystem.output, None, "{text}");
    assert!(
        text.contains("# read 2 files under here during tools/call read_text_file (first: /workspace/input/a/b.txt, /workspace/input/notes.txt)\ninput = \"/srv/in\""),
        "{text}"
    );
}

#[test]
fn writes_keep_the_output_and_a_writable_mount_only_read_becomes_read_only() {
    let b = base(&format!(
        "{WORKSPACE}[[filesystem.mounts]]\nhost = \"/srv/cache\"\nat = \"/cache\"\nmode = \"rw\"\n\
         [[filesystem.mounts]]\nhost = \"/srv/scratch\"\nat = \"/scratch\"\nmode = \"rw\"\n\
         [[filesystem.mounts]]\nhost = \"/opt/node\"\nat = \"/opt/node\"\n"
    ));
    let mut seen = kernel();
    seen.calls = vec![call(
        "write_file",
        vec![
            file("/workspace/output/out.txt", false, true),
            file("/cache/index", true, false),
        ],
    )];
    let (text, p) = proposed(&b, &seen);
    assert_eq!(p.filesystem.output.as_deref(), Some(Path::new("/srv/out")));
    assert_eq!(p.filesystem.input, None, "{text}");
    let mounts: Vec<(String, MountMode)> = p
        .filesystem
        .mounts
        .iter()
        .map(|m| (m.at.display().to_string(), m.mode))
        .collect();
    assert_eq!(
        mounts,
        vec![
            ("/cache".to_string(), MountMode::Ro),
            ("/opt/node".to_string(), MountMode::Ro)
        ],
        "{text}"
    );
    assert!(text.contains("# wrote 1 file under here during tools/call write_file (first: /workspace/output/out.txt)\noutput = \"/srv/out\""), "{text}");
    assert!(text.contains("(no write: read-only)"), "{text}");
    assert!(
        text.contains("# not proposed: the writable mount \"/srv/scratch\""),
        "{text}"
    );
    assert!(text.contains("read-only mounts are not watched"), "{text}");
}

#[test]
fn hosts_contacted_are_proposed_exactly_and_refused_ones_are_comments() {
    let b = base("[network]\nunlisted = \"approve\"\ndeny = [\"uploads.example.com\"]\n[network.hosts]\n\"registry.local\" = \"10.1.2.3\"\n\"other.local\" = \"10.1.2.4\"\n");
    let mut seen = kernel();
    let conn = |host: &str, port: u16, connected: bool| Connection {
        host: host.into(),
        port,
        connected,
        refused: (!connected).then(|| "network.private_address".to_string()),
        tools: vec!["fetch".into()],
    };
    seen.connections = vec![
        conn("API.example.com", 443, true),
        conn("api.example.com", 443, true),
        conn("registry.local", 8080, true),
        conn("metadata.internal", 80, false),
        conn("*.example.com", 443, true),
    ];
    let (text, p) = proposed(&b, &seen);
    let allow: Vec<String> = p.network.allow.iter().map(|r| r.canonical()).collect();
    assert_eq!(
        allow,
        vec!["api.example.com port 443", "registry.local port 8080"],
        "{text}"
    );
    assert_eq!(p.network.unlisted, crate::Unlisted::Deny);
    assert_eq!(
        p.network.hosts.len(),
        1,
        "only the mapping of a host contacted: {text}"
    );
    assert_eq!(p.network.deny.len(), 1, "{text}");
    assert!(
        text.contains("# contacted 2 times during tools/call fetch"),
        "{text}"
    );
    assert!(
        text.contains("# not proposed: metadata.internal:80 was refused while learning (network.private_address)"),
        "{text}"
    );
    assert!(
        text.contains("# not proposed: 1 connection to names that are not one exact host"),
        "{text}"
    );
}

#[test]
fn tools_called_are_allowed_the_rest_ask_and_the_bases_stricter_rules_stay() {
    let b = base(
        "[tools]\n\"delete_*\" = \"deny\"\n\"read_*\" = \"allow\"\noutside_paths = \"deny\"\n",
    );
    let mut seen = kernel();
    seen.listed = Some(vec![
        "read_file".into(),
        "write_file".into(),
        "delete_file".into(),
    ]);
    seen.pin_file = Some("/state/pins/learned/abcd.json".into());
    seen.calls = vec![
        call("read_file", vec![]),
        Call {
            allowed: false,
            ..call("delete_file", vec![])
        },
    ];
    let (text, p) = proposed(&b, &seen);
    let hints = crate::ToolHints::default();
    assert_eq!(
        p.tools.decide("read_file", &hints).verdict,
        Verdict::Allow,
        "{text}"
    );
    assert_eq!(
        p.tools.decide("write_file", &hints).verdict,
        Verdict::Approve,
        "{text}"
    );
    assert_eq!(
        p.tools.decide("delete_file", &hints).verdict,
        Verdict::Deny,
        "{text}"
    );
    assert!(
        !rules(&text).contains("read_*"),
        "the base's broad allow is not kept: {text}"
    );
    assert!(
        text.contains("# called 1 time while learning\nread_file = \"allow\""),
        "{text}"
    );
    assert!(
        text.contains("tools listed but not called (2) ask a human first: delete_file, write_file"),
        "{text}"
    );
    assert!(
        text.contains("# not proposed: delete_file (refused 1 time while learning)"),
        "{text}"
    );
    assert!(
        text.contains(
            "pinned (3 tools, as listed while learning) in /state/pins/learned/abcd.json"
        ),
        "{text}"
    );
}

#[test]
fn the_bases_limits_secrets_and_audit_are_kept() {
    let b = base("[process]\nmemory = \"256MiB\"\npids = 32\n[secrets]\nTOKEN = { from_env = \"MY_TOKEN\" }\n[audit]\npath = \"/srv/audit.db\"\n");
    let (text, p) = proposed(&b, &kernel());
    assert_eq!(p.process.memory, Some(256 << 20), "{text}");
    assert_eq!(p.process.pids, 32);
    assert!(p.secrets.contains_key("TOKEN"), "{text}");
    assert_eq!(p.audit.path.as_deref(), Some(Path::new("/srv/audit.db")));
    assert!(
        text.contains("whether the server read it cannot be observed"),
        "{text}"
    );
    assert_eq!(p.name(), "learned");
}

#[test]
fn a_server_that_floods_paths_and_names_credentials_gets_no_broad_grant() {
    let b = base(WORKSPACE);
    let mut seen = kernel();
    let mut files: Vec<FileSeen> = (0..10_000)
        .map(|i| file(&format!("/workspace/output/flood/{i}.txt"), false, true))
        .collect();
    files.push(file("/etc/shadow", true, false));
    files.push(file("/root/.ssh/id_rsa", true, false));
    files.push(file("/workspace/input/../../etc/passwd", true, false));
    files.push(file("/workspace/inputx/evil", true, false));
    seen.calls = vec![Call {
        truncated: true,
        ..call("write_file", files)
    }];
    seen.connections = (0..1000)
        .map(|i| Connection {
            host: format!("h{i}.example.com"),
            port: 443,
            connected: true,
            refused: None,
            tools: vec![],
        })
        .collect();
    let (text, p) = proposed(&b, &seen);
    let granted = rules(&text);
    for bad in ["/etc", "/root", ".ssh", "inputx", "flood"] {
        assert!(!granted.contains(bad), "{bad} granted:\n{granted}");
    }
    assert_eq!(p.filesystem.input, None, "{text}");
    assert!(p.filesystem.mounts.is_empty(), "{text}");
    assert_eq!(p.filesystem.output.as_deref(), Some(Path::new("/srv/out")));
    assert!(
        text.contains("# wrote 10000 files under here during tools/call write_file"),
        "{text}"
    );
    assert!(text.contains("the kernel's list was cut short"), "{text}");
    assert!(
        text.contains(
            "# not proposed: 4 paths outside the base's mounts or at a credential location"
        ),
        "{text}"
    );
    assert_eq!(p.network.allow.len(), MAX_HOSTS, "{text}");
    assert!(
        text.contains(&format!("# not proposed: {} more hosts", 1000 - MAX_HOSTS)),
        "{text}"
    );
    assert!(
        text.lines().count() < 400,
        "the flood is aggregated, not listed"
    );
}

#[test]
fn hostile_names_cannot_break_out_of_a_comment_or_a_key() {
    let b = base(WORKSPACE);
    let mut seen = kernel();
    seen.command = "srv\n[network]\nallow = [\"evil.com\"]".into();
    seen.calls = vec![call(
        "a\"b\n= \"allow\"",
        vec![file(
            "/workspace/input/x\n[network]\nallow=[\"evil.com\"]",
            true,
            false,
        )],
    )];
    let (text, p) = proposed(&b, &seen);
    assert!(p.network.allow.is_empty(), "{text}");
    assert_eq!(
        p.tools
            .decide("a\"b\n= \"allow\"", &crate::ToolHints::default())
            .verdict,
        Verdict::Approve,
        "{text}"
    );
    assert!(text.contains("(not a valid MCP tool name)"), "{text}");
}

#[test]
fn without_the_kernels_watch_the_bases_mounts_are_kept_and_said_so() {
    let b = base(WORKSPACE);
    let mut seen = kernel();
    seen.files_mode = Some("times".into());
    let (text, p) = proposed(&b, &seen);
    assert!(
        p.filesystem.input.is_some() && p.filesystem.output.is_some(),
        "{text}"
    );
    assert!(
        text.contains("kept from the base: files were not watched"),
        "{text}"
    );
}

#[test]
fn the_directory_of_the_servers_program_is_kept_though_it_runs_before_any_call() {
    let b = base(&format!(
        "{WORKSPACE}[[filesystem.mounts]]\nhost = \"/srv/tools\"\nat = \"/tools\"\nmode = \"rw\"\n"
    ));
    let mut seen = kernel();
    seen.program = Some("/workspace/input/server".into());
    let (text, p) = proposed(&b, &seen);
    assert_eq!(
        p.filesystem.input.as_deref(),
        Some(Path::new("/srv/in")),
        "{text}"
    );
    assert!(
        text.contains("# the server's program is here (/workspace/input/server)"),
        "{text}"
    );
    assert_eq!(p.filesystem.output, None, "{text}");
    assert!(p.filesystem.mounts.is_empty(), "{text}");
    seen.program = Some("/tools/bin/server".into());
    let (text, p) = proposed(&b, &seen);
    assert_eq!(p.filesystem.input, None, "{text}");
    assert_eq!(p.filesystem.mounts.len(), 1, "{text}");
    assert_eq!(p.filesystem.mounts[0].mode, MountMode::Ro, "{text}");
    // a program at a credential location keeps nothing
    seen.program = Some("/workspace/input/.ssh/x".into());
    let (text, p) = proposed(&b, &seen);
    assert_eq!(p.filesystem.input, None, "{text}");
}

fn programs(seen: &[(&str, i64)]) -> Programs {
    Programs {
        mode: Some("mounts".into()),
        refused: None,
        seen: seen.iter().map(|(p, t)| (p.to_string(), *t)).collect(),
        cut: false,
        own: vec!["/usr/bin/node".into(), "/srv/app/server.js".into()],
        dirs: vec![],
        read_only: vec![],
    }
}

fn with_call_at(tool: &str, start: i64, end: i64) -> Call {
    Call {
        span: Some((start, end)),
        ..call(tool, vec![])
    }
}

#[test]
fn programs_seen_become_allow_exec_each_with_when_it_ran() {
    let b = base(&format!(
        "{WORKSPACE}[process]\npids = 64\nallow_exec = [\"/usr/bin/node\", \"/usr/bin/curl\"]\n"
    ));
    let mut seen = kernel();
    seen.calls = vec![with_call_at("run_git", 1000, 2000)];
    seen.programs = Some(programs(&[("/usr/bin/git", 1500), ("/usr/bin/env", 50)]));
    let (text, p) = proposed(&b, &seen);
    let list: Vec<String> = p
        .process
        .allow_exec
        .unwrap()
        .iter()
        .map(|p| p.display().to_string())
        .collect();
    assert_eq!(
        list,
        [
            "/usr/bin/node",
            "/srv/app/server.js",
            "/usr/bin/env",
            "/usr/bin/git"
        ],
        "{text}"
    );
    assert!(
        text.contains("  # first executed during tools/call run_git\n  \"/usr/bin/git\","),
        "{text}"
    );
    assert!(
        text.contains("  # executed outside any call\n  \"/usr/bin/env\","),
        "{text}"
    );
    assert!(
        text.contains("# the server's program or its interpreter"),
        "{text}"
    );
    assert!(!rules(&text).contains("curl"), "never seen: {text}");
    assert_eq!(p.process.pids, 64, "the base's limits stay: {text}");
}

#[test]
fn a_cut_or_refused_watch_keeps_the_base_allow_exec_and_says_why() {
    let b = base(&format!(
        "{WORKSPACE}[process]\nallow_exec = [\"/usr/bin/node\", \"/usr/bin/curl\"]\n"
    ));
    let mut seen = kernel();
    let mut cut = programs(&[("/usr/bin/git", 5)]);
    cut.cut = true;
    seen.programs = Some(cut);
    let (text, p) = proposed(&b, &seen);
    assert_eq!(p.process.allow_exec, b.process.allow_exec, "{text}");
    assert!(text.contains("not observed whole"), "{text}");
    assert!(!rules(&text).contains("git"), "{text}");

    let mut refused = programs(&[]);
    refused.refused = Some("the watch was refused: EMFILE".into());
    seen.programs = Some(refused);
    let (text, p) = proposed(&b, &seen);
    assert_eq!(p.process.allow_exec, b.process.allow_exec, "{text}");
    assert!(text.contains("the watch was refused"), "{text}");

    // no base list: left out (any program), with why
    let open = base(WORKSPACE);
    let (text, p) = proposed(&open, &seen);
    assert_eq!(p.process.allow_exec, None, "{text}");
    assert!(text.contains("the watch was refused"), "{text}");
}

#[test]
fn rootless_with_the_servers_program_outside_the_watched_directories_keeps_the_base() {
    let b = base(WORKSPACE);
    let mut seen = kernel();
    let mut p = programs(&[("/usr/bin/git", 5)]);
    p.mode = Some("dirs".into());
    p.dirs = vec!["/usr/bin".into()];
    seen.programs = Some(p.clone());
    let (text, policy) = proposed(&b, &seen);
    assert_eq!(policy.process.allow_exec, None, "{text}");
    assert!(
        text.contains(
            "not observed: rootless, and a program outside the watched directories (/srv/app/server.js)"
        ),
        "{text}"
    );
    // every one of its own programs in a watched directory: proposed
    p.dirs.push("/srv/app".into());
    seen.programs = Some(p);
    let (text, policy) = proposed(&b, &seen);
    assert_eq!(policy.process.allow_exec.unwrap().len(), 3, "{text}");
    assert!(
        text.contains("rootless: only programs directly in"),
        "{text}"
    );
}

#[test]
fn a_program_run_from_a_writable_mount_is_a_comment_never_an_executable_rule() {
    let b = base(&format!(
        "{WORKSPACE}[[filesystem.mounts]]\nhost = \"/srv/data\"\nat = \"/data\"\nmode = \"rw\"\n"
    ));
    let mut seen = kernel();
    seen.programs = Some(programs(&[
        ("/workspace/output/dropper", 5),
        ("/workspace/tmp/x", 6),
        ("/data/tool", 7),
        ("/usr/bin/../../tmp/y", 8),
        ("/usr/bin/ok\n[evil]", 9),
    ]));
    let (text, p) = proposed(&b, &seen);
    let granted = rules(&text);
    for bad in ["dropper", "/workspace/tmp", "/data/tool", "..", "evil"] {
        assert!(!granted.contains(bad), "{bad} granted:\n{text}");
    }
    assert!(
        text.contains("# not proposed: /workspace/output/dropper (on a writable mount: allow_exec makes every writable mount noexec"),
        "{text}"
    );
    assert_eq!(p.process.allow_exec.unwrap().len(), 2, "{text}");
}

#[test]
fn a_server_whose_own_program_is_on_a_writable_mount_keeps_the_base_list() {
    let b = base(WORKSPACE);
    let mut seen = kernel();
    let mut p = programs(&[("/usr/bin/git", 5)]);
    p.own = vec!["/workspace/output/server".into()];
    seen.programs = Some(p);
    let (text, policy) = proposed(&b, &seen);
    assert_eq!(policy.process.allow_exec, None, "{text}");
    assert!(text.contains("so no list could let it start"), "{text}");
    assert!(!rules(&text).contains("/workspace/output/server"), "{text}");
}

/// Issue 32: a runtime under the host's /tmp is mounted read-only at the
/// same path, inside the sandbox's writable /tmp. The innermost mount
/// decides: the program on it is proposed; one beside it, in the
/// sandbox's own /tmp, is not.
#[test]
fn a_program_on_a_read_only_mount_inside_the_sandboxs_tmp_is_proposed() {
    let b = base(WORKSPACE);
    let mut seen = kernel();
    let mut p = programs(&[("/tmp/clone/peers/bin/tool", 5), ("/tmp/dropped", 6)]);
    p.own = vec![
        "/usr/bin/node".into(),
        "/tmp/clone/peers/npm/bin/server".into(),
    ];
    p.read_only = vec!["/tmp/clone/peers".into()];
    seen.programs = Some(p);
    let (text, policy) = proposed(&b, &seen);
    let list = policy.process.allow_exec.unwrap_or_default();
    assert!(
        list.contains(&PathBuf::from("/tmp/clone/peers/npm/bin/server"))
            && list.contains(&PathBuf::from("/tmp/clone/peers/bin/tool")),
        "{text}"
    );
    assert!(!rules(&text).contains("/tmp/dropped"), "{text}");
    assert!(
        text.contains("# not proposed: /tmp/dropped (on a writable mount"),
        "{text}"
    );
}
