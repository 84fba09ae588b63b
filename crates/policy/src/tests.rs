//! Parsing and validation tests: every refusal is named after what it rejects.

use std::path::{Path, PathBuf};
use std::time::Duration;

use super::*;

const FILE: &str = "/p/policy.toml";

fn ok(text: &str) -> Policy {
    match parse(text, Path::new(FILE)) {
        Ok(p) => p,
        Err(d) => panic!("expected a valid policy, got:\n{d}\n---\n{text}"),
    }
}

fn err(text: &str) -> Diagnostic {
    match parse(text, Path::new(FILE)) {
        Ok(p) => panic!("expected a refusal, got {:?}\n---\n{text}", p.to_toml()),
        Err(d) => d,
    }
}

/// Asserts a refusal at `key`, on `line`, whose message or hint contains `needle`.
fn refused(text: &str, key: &str, line: usize, needle: &str) -> Diagnostic {
    let d = err(text);
    assert_eq!(d.key, key, "wrong key in:\n{d}");
    assert_eq!(
        d.location.map(|l| l.line),
        Some(line),
        "wrong line in:\n{d}"
    );
    assert_eq!(d.file, PathBuf::from(FILE));
    let all = format!("{} {}", d.message, d.hint.clone().unwrap_or_default());
    assert!(all.contains(needle), "{needle:?} not in:\n{d}");
    assert!(d.hint.is_some(), "no hint in:\n{d}");
    d
}

const EXAMPLES: &[(&str, &str)] = &[
    (
        "default.toml",
        include_str!("../../../examples/default.toml"),
    ),
    (
        "filesystem-server.toml",
        include_str!("../../../examples/filesystem-server.toml"),
    ),
    (
        "everything.toml",
        include_str!("../../../examples/everything.toml"),
    ),
    (
        "lifecycle/notes.toml",
        include_str!("../../../examples/lifecycle/notes.toml"),
    ),
];

/// Every `.toml` under `examples/`, recursively.
fn example_files(dir: &Path, out: &mut Vec<PathBuf>) {
    let mut entries: Vec<PathBuf> = std::fs::read_dir(dir)
        .unwrap_or_else(|e| panic!("{}: {e}", dir.display()))
        .map(|e| e.unwrap().path())
        .collect();
    entries.sort();
    for path in entries {
        if path.is_dir() {
            example_files(&path, out);
        } else if path.extension().is_some_and(|x| x == "toml") {
            out.push(path);
        }
    }
}

#[test]
fn every_file_in_the_examples_directory_loads() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../examples");
    let mut files = Vec::new();
    example_files(&root, &mut files);
    let mut serve_configs = 0;
    // as the binary reads them: a file an example extends is read
    let mut read = |p: &Path| std::fs::read_to_string(p);
    for file in &files {
        let text = std::fs::read_to_string(file).unwrap();
        if serve::is_serve_config(&text) {
            let c = serve::ServeConfig::load(file).unwrap_or_else(|d| panic!("{d}"));
            // what the binary checks before starting: the policies and bases exist
            for s in &c.servers {
                let policy = std::fs::read_to_string(&s.policy)
                    .unwrap_or_else(|e| panic!("{}: {e}", s.policy.display()));
                parse_with(&policy, &s.policy, &mut read).unwrap_or_else(|d| panic!("{d}"));
            }
            for t in &c.templates {
                match &t.base {
                    serve::TemplateBase::Dir(d) => assert!(d.is_dir(), "{}", d.display()),
                    serve::TemplateBase::Snapshot(f) => assert!(f.is_file(), "{}", f.display()),
                }
            }
            serve_configs += 1;
        } else if let Err(d) = parse_with(&text, file, &mut read) {
            panic!("example {} does not parse:\n{d}", file.display());
        }
    }
    let names: Vec<String> = files
        .iter()
        .map(|f| f.strip_prefix(&root).unwrap().display().to_string())
        .collect();
    for name in EXAMPLES
        .iter()
        .map(|(n, _)| *n)
        .chain(["lifecycle/serve.toml"])
    {
        assert!(names.iter().any(|n| n == name), "{name} not in {names:?}");
    }
    assert!(serve_configs >= 1, "no serve config among {names:?}");
}

#[test]
fn lifecycle_example_declares_artifacts_and_a_revoked_secret() {
    let p = parse(
        EXAMPLES[3].1,
        Path::new("/repo/examples/lifecycle/notes.toml"),
    )
    .expect("parses");
    assert_eq!(p.artifacts.patterns, ["report.md", "dist/**"]);
    assert_eq!(p.artifacts.max_size, DEFAULT_MAX_ARTIFACT);
    assert!(p.artifacts.matches("dist/app/index.js"));
    assert!(!p.artifacts.matches("scratch.txt"));
    let s = &p.secrets["NOTES_TOKEN"];
    assert_eq!(
        s.revoke,
        Some(vec!["notes-admin".to_string(), "revoke-token".to_string()])
    );
}

#[test]
fn every_example_parses() {
    for (name, text) in EXAMPLES {
        let file = Path::new("/repo/examples").join(name);
        if let Err(d) = parse(text, &file) {
            panic!("example {name} does not parse:\n{d}");
        }
    }
}

#[test]
fn default_example_is_the_default_policy_plus_a_workspace() {
    let p = parse(EXAMPLES[0].1, Path::new("/repo/examples/default.toml")).expect("parses");
    assert_eq!(
        p.filesystem.input,
        Some(PathBuf::from("/repo/examples/workspace/input"))
    );
    assert_eq!(p.filesystem.output, None);
    let d = default_policy();
    assert_eq!(p.server, d.server);
    assert_eq!(p.filesystem.tmp, d.filesystem.tmp);
    assert_eq!(p.filesystem.mounts, d.filesystem.mounts);
    assert_eq!(p.env, d.env);
    assert_eq!(p.process, d.process);
    assert_eq!(p.sandbox, d.sandbox);
    assert_eq!(p.network, d.network);
    assert_eq!(p.secrets, d.secrets);
    assert_eq!(p.tools, d.tools);
    assert_eq!(p.output, d.output);
    assert_eq!(p.artifacts, d.artifacts);
    assert_eq!(p.audit, d.audit);
}

#[test]
fn everything_example_has_a_secret_and_a_deny_rule() {
    let p = parse(EXAMPLES[2].1, Path::new("/repo/examples/everything.toml")).expect("parses");
    let s = &p.secrets["DEMO_TOKEN"];
    assert_eq!(s.source, SecretSource::Env("MCPBOX_DEMO_TOKEN".into()));
    assert_eq!(s.ttl, Some(Duration::from_secs(3600)));
    let d = p
        .tools
        .decide("longRunningOperation", &ToolHints::default());
    assert_eq!(d.verdict, Verdict::Deny);
    assert_eq!(d.source, "tools.longRunningOperation");
}

#[test]
fn default_policy_is_the_strictest() {
    let p = default_policy();
    assert_eq!(p.name(), "default");
    assert_eq!(p.filesystem.input, None);
    assert_eq!(p.filesystem.output, None);
    assert_eq!(p.filesystem.tmp, 64 << 20);
    assert!(p.filesystem.mounts.is_empty());
    assert!(p.network.is_closed());
    assert!(p.network.hosts.is_empty());
    assert!(p.secrets.is_empty());
    assert!(p.env.set.is_empty() && p.env.pass.is_empty());
    assert_eq!(p.process.pids, 256);
    assert!(!p.sandbox.dangerously_allow_degraded);
    assert_eq!(p.sandbox.isolation, crate::Isolation::Namespaces);
    assert_eq!(p.output.max_result, 1 << 20);
    assert_eq!(p.output.max_line, 16 << 20);
    // an empty file is the same policy, named after the file
    let e = ok("");
    assert_eq!(e.name(), "policy");
    assert_eq!(e.to_toml(), {
        let mut d = default_policy();
        d.server.name = Some("policy".into());
        d.to_toml()
    });
}

#[test]
fn server_name_defaults_to_the_file_stem() {
    let p = parse("", Path::new("/x/my fs.toml")).expect("parses");
    assert_eq!(p.name(), "my-fs");
    let p = parse("", Path::new("/x/.toml")).expect("parses");
    assert_eq!(p.name(), "toml");
    let p = parse("", Path::new("")).expect("parses");
    assert_eq!(p.name(), "policy");
}

#[test]
fn server_name_that_escapes_state_dir_is_refused() {
    refused(
        "[server]\nname = \"../etc\"\n",
        "server.name",
        2,
        "invalid server name",
    );
    refused(
        "[server]\nname = \"\"\n",
        "server.name",
        2,
        "invalid server name",
    );
}

// ---- unknown keys and wrong types ----

#[test]
fn unknown_key_is_refused_with_the_valid_keys() {
    let d = refused(
        "[filesystem]\ninput = \"a\"\ninptu = \"./repo\"\n",
        "filesystem.inptu",
        3,
        "unknown key `inptu`",
    );
    assert_eq!(d.location, Some(Location { line: 3, column: 1 }));
    assert_eq!(
        d.hint.as_deref(),
        Some("valid keys here: input, output, tmp, mounts")
    );
    assert_eq!(
        d.to_string(),
        "/p/policy.toml:3:1: filesystem.inptu: unknown key `inptu`\n  hint: valid keys here: input, output, tmp, mounts"
    );
}

#[test]
fn runtime_discovery_is_on_unless_the_policy_turns_it_off() {
    assert!(ok("").runtime.discover);
    assert!(!ok("[runtime]\ndiscover = false\n").runtime.discover);
    refused(
        "[runtime]\ndiscovr = false\n",
        "runtime.discovr",
        2,
        "unknown key `discovr`",
    );
    // printed with the effective policy, so `mcpbox check` shows it
    assert!(ok("").to_toml().contains("[runtime]\ndiscover = true"));
}

#[test]
fn unknown_section_is_refused() {
    let d = refused(
        "\n[filesytem]\ninput = \"a\"\n",
        "filesytem",
        2,
        "unknown key `filesytem`",
    );
    assert!(d.hint.unwrap_or_default().contains("filesystem"));
}

#[test]
fn unknown_key_in_mount_secret_and_network_is_refused() {
    refused(
        "[[filesystem.mounts]]\nhost = \"/opt\"\nat = \"/data\"\nreadonly = true\n",
        "filesystem.mounts[0].readonly",
        4,
        "mode",
    );
    refused(
        "[secrets]\nA = { from_env = \"B\", tll = \"1h\" }\n",
        "secrets.A.tll",
        2,
        "ttl",
    );
    refused(
        "[network]\nallowed = []\n",
        "network.allowed",
        2,
        "allow, deny, unlisted, hosts",
    );
    refused(
        "[process]\nmemroy = \"1GiB\"\n",
        "process.memroy",
        2,
        "memory",
    );
}

#[test]
fn wrong_type_for_a_size_says_what_a_size_looks_like() {
    let d = refused(
        "[filesystem]\ntmp = 256\n",
        "filesystem.tmp",
        2,
        "a size like \"256MiB\"",
    );
    assert!(d.message.contains("integer"), "{d}");
}

#[test]
fn wrong_types_are_refused_with_the_expected_type() {
    refused(
        "[process]\npids = \"64\"\n",
        "process.pids",
        2,
        "whole number",
    );
    refused("[env]\npass = \"TZ\"\n", "env.pass", 2, "a list such as");
    refused(
        "[filesystem.mounts]\nhost = \"/a\"\n",
        "filesystem.mounts",
        1,
        "[[name]]",
    );
    refused(
        "[sandbox]\ndangerously_allow_degraded = \"yes\"\n",
        "sandbox.dangerously_allow_degraded",
        2,
        "boolean",
    );
    refused(
        "[sandbox]\nisolation = \"firecracker\"\n",
        "sandbox.isolation",
        2,
        "gvisor",
    );
    refused(
        "[sandbox]\nisolation = \"GVISOR\"\n",
        "sandbox.isolation",
        2,
        "namespaces",
    );
    refused(
        "[tools]\nshow_denied = 1\n",
        "tools.show_denied",
        2,
        "boolean",
    );
    refused("filesystem = 3\n", "filesystem", 1, "wrong type");
    refused(
        "[process]\ntimeout = 60\n",
        "process.timeout",
        2,
        "a duration like",
    );
}

#[test]
fn invalid_toml_reports_its_line() {
    let d = err("[filesystem]\ninput = \"a\"\noutput = \n");
    assert_eq!(d.location.map(|l| l.line), Some(3), "{d}");
    assert!(d.message.starts_with("invalid TOML"), "{d}");
    let d = err("[a]\n[a]\n");
    assert_eq!(d.location.map(|l| l.line), Some(2), "{d}");
}

// ---- sizes, durations and limits ----

#[test]
fn bad_size_is_refused() {
    refused(
        "[filesystem]\ntmp = \"12XB\"\n",
        "filesystem.tmp",
        2,
        "unknown unit",
    );
    refused(
        "[process]\nmemory = \"1.5GiB\"\n",
        "process.memory",
        2,
        "KiB",
    );
    refused(
        "[output]\nmax_result = \"lots\"\n",
        "output.max_result",
        2,
        "invalid size",
    );
}

#[test]
fn tmp_of_zero_or_above_64gib_is_refused() {
    refused(
        "[filesystem]\ntmp = \"0MiB\"\n",
        "filesystem.tmp",
        2,
        "64GiB",
    );
    refused(
        "[filesystem]\ntmp = \"65GiB\"\n",
        "filesystem.tmp",
        2,
        "64GiB",
    );
    assert_eq!(
        ok("[filesystem]\ntmp = \"64GiB\"\n").filesystem.tmp,
        64 << 30
    );
}

#[test]
fn bad_duration_is_refused() {
    refused(
        "[process]\ntimeout = \"60\"\n",
        "process.timeout",
        2,
        "no unit",
    );
    refused(
        "[process]\ncall_timeout = \"1 week\"\n",
        "process.call_timeout",
        2,
        "ms, s, m, h",
    );
    refused(
        "[process]\ntimeout = \"0s\"\n",
        "process.timeout",
        2,
        "timeout is 0",
    );
}

#[test]
fn pids_out_of_range_are_refused() {
    refused("[process]\npids = 0\n", "process.pids", 2, "1 to 65536");
    refused("[process]\npids = 65537\n", "process.pids", 2, "1 to 65536");
    refused("[process]\npids = -1\n", "process.pids", 2, "not negative");
    assert_eq!(ok("[process]\npids = 65536\n").process.pids, 65536);
}

#[test]
fn cpu_out_of_range_is_refused() {
    for bad in ["0", "-1.0", "1024.5", "nan", "inf"] {
        refused(
            &format!("[process]\ncpu = {bad}\n"),
            "process.cpu",
            2,
            "cpu",
        );
    }
    assert_eq!(ok("[process]\ncpu = 2\n").process.cpu, Some(2.0));
    assert_eq!(ok("[process]\ncpu = 1.5\n").process.cpu, Some(1.5));
}

#[test]
fn zero_memory_and_tiny_line_limit_are_refused() {
    refused(
        "[process]\nmemory = \"0B\"\n",
        "process.memory",
        2,
        "memory limit is 0",
    );
    refused(
        "[output]\nmax_result = \"0B\"\n",
        "output.max_result",
        2,
        "max_result",
    );
    refused(
        "[output]\nmax_line = \"100B\"\n",
        "output.max_line",
        2,
        "1KiB",
    );
}

#[test]
fn limits_are_read() {
    let p = ok(
        "[process]\nmemory = \"512MiB\"\npids = 64\ntimeout = \"1h\"\ncall_timeout = \"250ms\"\n",
    );
    assert_eq!(p.process.memory, Some(512 << 20));
    assert_eq!(p.process.pids, 64);
    assert_eq!(p.process.timeout, Some(Duration::from_secs(3600)));
    assert_eq!(p.process.call_timeout, Some(Duration::from_millis(250)));
}

// ---- filesystem ----

#[test]
fn relative_paths_resolve_against_the_policy_directory() {
    let p = ok(r#"
[filesystem]
input = "./repo"
output = "out/../x"
[[filesystem.mounts]]
host = "data"
at = "/data/./set/"
[secrets]
S = { from_file = "./secret.txt" }
[audit]
path = "/var/lib/a.db"
"#);
    assert_eq!(p.filesystem.input, Some(PathBuf::from("/p/repo")));
    assert_eq!(p.filesystem.output, Some(PathBuf::from("/p/out/../x")));
    assert_eq!(p.filesystem.mounts[0].host, PathBuf::from("/p/data"));
    assert_eq!(p.filesystem.mounts[0].at, PathBuf::from("/data/set"));
    assert_eq!(p.filesystem.mounts[0].mode, MountMode::Ro);
    assert_eq!(
        p.secrets["S"].source,
        SecretSource::File(PathBuf::from("/p/secret.txt"))
    );
    assert_eq!(p.audit.path, Some(PathBuf::from("/var/lib/a.db")));
    let p = parse("[audit]\npath = \"a.db\"\n", Path::new("rel.toml")).expect("parses");
    assert_eq!(p.audit.path, Some(PathBuf::from("a.db")));
}

#[test]
fn tilde_and_empty_paths_are_refused() {
    refused(
        "[filesystem]\ninput = \"~/repo\"\n",
        "filesystem.input",
        2,
        "not expanded",
    );
    refused(
        "[filesystem]\noutput = \"\"\n",
        "filesystem.output",
        2,
        "empty path",
    );
    refused(
        "[audit]\npath = \"~/a.db\"\n",
        "audit.path",
        2,
        "not expanded",
    );
}

#[test]
fn output_same_as_input_is_refused() {
    refused(
        "[filesystem]\ninput = \"./w\"\noutput = \"w\"\n",
        "filesystem.output",
        3,
        "same directory",
    );
}

#[test]
fn mount_target_on_reserved_path_is_refused() {
    for (at, needle) in [
        ("/", "sandbox root"),
        ("/proc", "/proc"),
        ("/proc/self", "/proc"),
        ("/dev", "/dev"),
        ("/dev/shm", "/dev"),
        ("/sys/fs", "/sys"),
        ("/workspace", "/workspace"),
        ("/workspace/input", "workspace directory"),
        ("/workspace/output/x", "workspace directory"),
        ("/workspace/tmp", "workspace directory"),
        ("//proc", "/proc"),
        ("/./dev", "/dev"),
    ] {
        let text = format!("[[filesystem.mounts]]\nhost = \"/opt/data\"\nat = \"{at}\"\n");
        refused(&text, "filesystem.mounts[0].at", 3, needle);
    }
    ok("[[filesystem.mounts]]\nhost = \"/opt/data\"\nat = \"/workspace/extra\"\n");
}

#[test]
fn mount_target_with_dotdot_or_relative_is_refused() {
    refused(
        "[[filesystem.mounts]]\nhost = \"/opt\"\nat = \"/data/../proc\"\n",
        "filesystem.mounts[0].at",
        3,
        "\"..\"",
    );
    refused(
        "[[filesystem.mounts]]\nhost = \"/opt\"\nat = \"data\"\n",
        "filesystem.mounts[0].at",
        3,
        "absolute",
    );
}

#[test]
fn duplicate_mount_targets_are_refused() {
    let text = "[[filesystem.mounts]]\nhost = \"/a\"\nat = \"/data\"\n\n[[filesystem.mounts]]\nhost = \"/b\"\nat = \"/data/\"\n";
    let d = refused(text, "filesystem.mounts[1].at", 7, "mounts[0]");
    assert_eq!(d.location, Some(Location { line: 7, column: 1 }));
}

#[test]
fn mount_without_host_or_with_bad_mode_is_refused() {
    let d = err("[[filesystem.mounts]]\nat = \"/data\"\n");
    assert!(d.message.contains("missing required key `host`"), "{d}");
    assert!(d.key.starts_with("filesystem.mounts"), "{d}");
    refused(
        "[[filesystem.mounts]]\nhost = \"/a\"\nat = \"/d\"\nmode = \"rx\"\n",
        "filesystem.mounts[0].mode",
        4,
        "ro, rw",
    );
}

#[test]
fn credential_folder_mount_is_refused_unless_dangerously_allowed() {
    let d = refused(
        "[[filesystem.mounts]]\nhost = \"/home/u/.ssh\"\nat = \"/keys\"\n",
        "filesystem.mounts[0].host",
        2,
        "dangerously_allow_credentials",
    );
    assert!(d.message.contains(".ssh"), "{d}");
    refused(
        "[[filesystem.mounts]]\nhost = \"/root\"\nat = \"/r\"\n",
        "filesystem.mounts[0].host",
        2,
        ".ssh",
    );
    let p = ok("[[filesystem.mounts]]\nhost = \"/home/u/.aws\"\nat = \"/aws\"\ndangerously_allow_credentials = true\n");
    assert!(p.filesystem.mounts[0].dangerously_allow_credentials);
}

#[test]
fn home_directory_as_input_is_refused() {
    refused(
        "[filesystem]\ninput = \"/home/alice\"\n",
        "filesystem.input",
        2,
        ".ssh",
    );
    refused(
        "[filesystem]\noutput = \"/home/alice/.config\"\n",
        "filesystem.output",
        2,
        "gcloud",
    );
    // relative to a policy that sits in a home directory
    let d = parse(
        "[filesystem]\ninput = \".\"\n",
        Path::new("/home/alice/fs.toml"),
    )
    .expect_err("refused");
    assert_eq!(d.key, "filesystem.input");
}

// ---- env ----

#[test]
fn invalid_env_names_are_refused() {
    refused(
        "[env]\nset = { \"1BAD\" = \"x\" }\n",
        "env.set.1BAD",
        2,
        "invalid environment variable name",
    );
    refused(
        "[env]\nset = { \"A-B\" = \"x\" }\n",
        "env.set.A-B",
        2,
        "letters, digits",
    );
    refused(
        "[env]\npass = [\"OK\", \"NOT OK\"]\n",
        "env.pass[1]",
        2,
        "invalid environment variable name",
    );
}

#[test]
fn ld_preload_injection_is_refused() {
    refused(
        "[env]\nset = { LD_PRELOAD = \"/tmp/evil.so\" }\n",
        "env.set.LD_PRELOAD",
        2,
        "LD_PRELOAD",
    );
    refused(
        "[env]\n\npass = [\"LD_LIBRARY_PATH\"]\n",
        "env.pass[0]",
        3,
        "dynamic-loader",
    );
    refused(
        "[env.set]\nLD_AUDIT = \"x\"\n",
        "env.set.LD_AUDIT",
        2,
        "dynamic-loader",
    );
    refused(
        "[secrets]\nLD_PRELOAD = { from_env = \"X\" }\n",
        "secrets.LD_PRELOAD",
        2,
        "dynamic-loader",
    );
}

/// With egress on, the proxy's variables used to replace the policy's
/// silently: now the policy may not set them, but git's config variables.
#[test]
fn env_variable_the_egress_proxy_sets_is_refused_with_network_on() {
    let net = "[network]\nallow = [\"api.example.com\"]\n";
    refused(
        &format!("{net}[env]\nset = {{ HTTPS_PROXY = \"http://corp:3128\" }}\n"),
        "env.set.HTTPS_PROXY",
        4,
        "egress proxy",
    );
    refused(
        &format!("{net}[env]\npass = [\"npm_config_proxy\"]\n"),
        "env.pass[0]",
        4,
        "egress proxy",
    );
    refused(
        &format!("{net}[secrets.ALL_PROXY]\nfrom_env = \"X\"\n"),
        "secrets.ALL_PROXY",
        3,
        "egress proxy",
    );
    // NO_PROXY is not mcpbox's (loopback names go through the proxy): a
    // server that talks to its own loopback service may set it
    ok(&format!(
        "{net}[env]\nset = {{ NO_PROXY = \"localhost\" }}\n"
    ));
    // without egress nothing sets them, and git's are merged either way
    ok("[env]\nset = { HTTPS_PROXY = \"http://corp:3128\" }\n");
    ok(&format!(
        "{net}[env]\nset = {{ GIT_CONFIG_COUNT = \"1\", GIT_CONFIG_KEY_0 = \"user.name\", GIT_CONFIG_VALUE_0 = \"agent\" }}\n"
    ));
}

#[test]
fn env_both_set_and_passed_is_refused() {
    refused(
        "[env]\nset = { TZ = \"UTC\" }\npass = [\"TZ\"]\n",
        "env.pass[0]",
        3,
        "both set and passed",
    );
    refused(
        "[env]\npass = [\"TZ\", \"TZ\"]\n",
        "env.pass[1]",
        2,
        "twice",
    );
}

// ---- secrets ----

#[test]
fn secret_with_no_source_is_refused() {
    refused(
        "[secrets]\nTOKEN = { ttl = \"1h\" }\n",
        "secrets.TOKEN",
        2,
        "no source",
    );
}

#[test]
fn secret_with_two_sources_is_refused() {
    refused(
        "[secrets]\nTOKEN = { from_env = \"A\", from_file = \"b\" }\n",
        "secrets.TOKEN",
        2,
        "2 sources",
    );
    refused(
        "[secrets.TOKEN]\nfrom_env = \"A\"\nfrom_file = \"b\"\nfrom_command = [\"x\"]\n",
        "secrets.TOKEN",
        1,
        "exactly one of",
    );
}

#[test]
fn bad_secret_fields_are_refused() {
    refused(
        "[secrets]\n\"my-token\" = { from_env = \"A\" }\n",
        "secrets.my-token",
        2,
        "invalid environment variable name",
    );
    refused(
        "[secrets]\nT = { from_env = \"$A\" }\n",
        "secrets.T.from_env",
        2,
        "invalid environment variable name",
    );
    refused(
        "[secrets]\nT = { from_command = [] }\n",
        "secrets.T.from_command",
        2,
        "needs a program",
    );
    refused(
        "[secrets]\nT = { from_command = [\"\", \"x\"] }\n",
        "secrets.T.from_command",
        2,
        "needs a program",
    );
    refused(
        "[secrets]\nT = { from_env = \"A\", ttl = \"0s\" }\n",
        "secrets.T.ttl",
        2,
        "ttl is 0",
    );
    refused(
        "[secrets]\nT = { from_env = \"A\", ttl = \"soon\" }\n",
        "secrets.T.ttl",
        2,
        "invalid duration",
    );
    refused(
        "[env]\nset = { T = \"x\" }\n[secrets]\nT = { from_env = \"A\" }\n",
        "secrets.T",
        4,
        "both a secret and an env",
    );
}

#[test]
fn secrets_of_each_kind_are_read() {
    let p = ok(r#"
[secrets]
GITHUB_TOKEN = { from_env = "GH_READONLY_TOKEN", ttl = "1h" }
DB_PASS = { from_file = "./secret.txt" }
API_KEY = { from_command = ["op", "read", "op://vault/item"] }
"#);
    assert_eq!(
        p.secrets["GITHUB_TOKEN"].source,
        SecretSource::Env("GH_READONLY_TOKEN".into())
    );
    assert_eq!(
        p.secrets["DB_PASS"].source,
        SecretSource::File("/p/secret.txt".into())
    );
    assert_eq!(
        p.secrets["API_KEY"].source,
        SecretSource::Command(vec!["op".into(), "read".into(), "op://vault/item".into()])
    );
}

#[test]
fn secret_revoke_command_is_read_and_printed() {
    let p = ok(r#"
[secrets.GITHUB_TOKEN]
from_command = ["gh", "auth", "token"]
revoke = ["/usr/local/bin/revoke-token", "--github"]
[secrets.PLAIN]
from_env = "PLAIN"
"#);
    assert_eq!(
        p.secrets["GITHUB_TOKEN"].revoke,
        Some(vec![
            "/usr/local/bin/revoke-token".to_string(),
            "--github".to_string()
        ])
    );
    assert_eq!(p.secrets["PLAIN"].revoke, None);
    let printed = p.to_toml();
    assert!(
        printed.contains("revoke = [\"/usr/local/bin/revoke-token\", \"--github\"]"),
        "{printed}"
    );
    assert_eq!(parse(&printed, Path::new(FILE)).unwrap().secrets, p.secrets);
}

#[test]
fn secret_revoke_that_runs_nothing_is_refused() {
    refused(
        "[secrets]\nT = { from_env = \"A\", revoke = [] }\n",
        "secrets.T.revoke",
        2,
        "empty command",
    );
    refused(
        "[secrets.T]\nfrom_env = \"A\"\nrevoke = [\"\", \"x\"]\n",
        "secrets.T.revoke",
        3,
        "needs a program",
    );
    refused(
        "[secrets.T]\nfrom_env = \"A\"\nrevoke = [\"x\", \"a\\u0000b\"]\n",
        "secrets.T.revoke",
        3,
        "NUL",
    );
    refused(
        "[secrets.T]\nfrom_env = \"A\"\nrevoke = \"gh auth logout\"\n",
        "secrets.T.revoke",
        3,
        "list",
    );
}

// ---- artifacts ----

#[test]
fn artifacts_default_to_nothing_leaving_with_a_10mib_limit() {
    let p = ok("");
    assert!(p.artifacts.patterns.is_empty());
    assert_eq!(p.artifacts.max_size, 10 << 20);
    assert_eq!(p.artifacts, Artifacts::default());
    assert!(!p.artifacts.matches("report.md"));
    assert!(p
        .to_toml()
        .contains("[artifacts]\npatterns = []\nmax_size = \"10MiB\"\n"));
}

#[test]
fn artifacts_patterns_and_max_size_are_read() {
    let p = ok(
        "[artifacts]\npatterns = [\"report.md\", \"dist/**\", \"*.csv\"]\nmax_size = \"1GiB\"\n",
    );
    assert_eq!(p.artifacts.patterns, ["report.md", "dist/**", "*.csv"]);
    assert_eq!(p.artifacts.max_size, 1 << 30);
    assert!(p.artifacts.matches("report.md"));
    assert!(p.artifacts.matches("dist/js/app.js"));
    assert!(p.artifacts.matches("data.csv"));
    assert!(!p.artifacts.matches("sub/data.csv"));
    assert!(!p.artifacts.matches("notes.txt"));
    let printed = p.to_toml();
    assert!(printed.contains("max_size = \"1GiB\""), "{printed}");
    assert_eq!(
        parse(&printed, Path::new(FILE)).unwrap().artifacts,
        p.artifacts
    );
}

#[test]
fn artifact_pattern_escaping_the_output_directory_is_refused() {
    refused(
        "[artifacts]\npatterns = [\"report.md\", \"/etc/shadow\"]\n",
        "artifacts.patterns[1]",
        2,
        "is absolute",
    );
    refused(
        "[artifacts]\npatterns = [\"../../home/u/.ssh/id_ed25519\"]\n",
        "artifacts.patterns[0]",
        2,
        "outside /workspace/output",
    );
    refused(
        "[artifacts]\npatterns = [\"dist/**/../x\"]\n",
        "artifacts.patterns[0]",
        2,
        "\"..\"",
    );
}

#[test]
fn artifact_pattern_malformed_is_refused() {
    for (pattern, needle) in [
        ("a//b", "empty segment"),
        ("dist/", "empty segment"),
        ("", "empty pattern"),
        ("./a", "\".\" segment"),
        ("a**", "inside a segment"),
        ("a\\u0000b", "NUL"),
    ] {
        refused(
            &format!("[artifacts]\npatterns = [\"{pattern}\"]\n"),
            "artifacts.patterns[0]",
            2,
            needle,
        );
    }
    refused(
        "[artifacts]\nmax_size = 10\n",
        "artifacts.max_size",
        2,
        "MiB",
    );
    refused(
        "[artifacts]\npattern = [\"a\"]\n",
        "artifacts.pattern",
        2,
        "patterns",
    );
}

// ---- process ----

#[test]
fn allow_exec_must_be_absolute_and_non_empty() {
    refused(
        "[process]\nallow_exec = []\n",
        "process.allow_exec",
        2,
        "nothing run",
    );
    refused(
        "[process]\nallow_exec = [\"/usr/bin/node\", \"node\"]\n",
        "process.allow_exec[1]",
        2,
        "absolute",
    );
    refused(
        "[process]\nallow_exec = [\n  \"/usr/bin/../../tmp/x\",\n]\n",
        "process.allow_exec[0]",
        3,
        "\"..\"",
    );
    let p = ok("[process]\nallow_exec = [\"/usr/bin/node\", \"/usr//bin/git\"]\n");
    assert_eq!(
        p.process.allow_exec,
        Some(vec![
            PathBuf::from("/usr/bin/node"),
            PathBuf::from("/usr/bin/git")
        ])
    );
}

// ---- network ----

#[test]
fn network_pattern_matching_everything_is_refused() {
    refused(
        "[network]\nallow = [\"api.github.com\",\n  \"*\"]\n",
        "network.allow[1]",
        3,
        "every host",
    );
    refused(
        "[network]\nallow = [\"*.com\"]\n",
        "network.allow[0]",
        2,
        "top-level domain",
    );
    refused(
        "[network]\nallow = [\"*.*\"]\n",
        "network.allow[0]",
        2,
        "wildcard",
    );
    refused(
        "[network]\ndeny = [\"0.0.0.0/0\"]\n",
        "network.deny[0]",
        2,
        "every address",
    );
}

#[test]
fn network_bad_patterns_are_refused() {
    refused(
        "[network]\nallow = [\"a.com:0\"]\n",
        "network.allow[0]",
        2,
        "port 0",
    );
    refused(
        "[network]\nallow = [\"10.0.0.0/33\"]\n",
        "network.allow[0]",
        2,
        "longer than 32",
    );
    refused(
        "[network]\nallow = [\"10.0.0.1/8\"]\n",
        "network.allow[0]",
        2,
        "host bits",
    );
    refused(
        "[network]\nallow = [\"https://a.com/x\"]\n",
        "network.allow[0]",
        2,
        "URL",
    );
    refused(
        "[network]\nallow = [\"a.*.com\"]\n",
        "network.allow[0]",
        2,
        "leftmost",
    );
    refused(
        "[network]\nallow = [3]\n",
        "network.allow[0]",
        2,
        "wrong type",
    );
}

#[test]
fn network_entry_both_allowed_and_denied_is_refused() {
    refused(
        "[network]\nallow = [\"a.com\"]\ndeny = [\"b.com\", \"A.com.\"]\n",
        "network.deny[1]",
        3,
        "both allowed and denied",
    );
    // different ports are different entries
    ok("[network]\nallow = [\"a.com:8080\"]\ndeny = [\"a.com\"]\n");
}

#[test]
fn network_local_opens_one_loopback_port_and_nothing_else() {
    let p = ok("[network]\nlocal = [\"localhost:8080\", \"[::1]:9090\"]\n");
    assert!(!p.network.is_closed(), "local alone turns egress on");
    // every loopback spelling of a listed port, nothing else
    for host in [
        "localhost",
        "LOCALHOST.",
        "127.0.0.1",
        "127.0.0.2",
        "::1",
        "[::1]",
    ] {
        let d = p.network.decide(host, 8080);
        assert_eq!(
            (d.verdict, d.reason, &*d.source.to_string()),
            (
                Verdict::Allow,
                Reason::NetworkLocal,
                "network.local[0] \"localhost:8080\""
            ),
            "{host}"
        );
    }
    assert_eq!(p.network.decide("localhost", 9090).verdict, Verdict::Allow);
    // another port of the loopback: refused without asking, even where
    // unlisted hosts are asked for
    let asks = ok("[network]\nlocal = [\"localhost:8080\"]\nunlisted = \"approve\"\n");
    let d = asks.network.decide("localhost", 8081);
    assert_eq!(
        (d.verdict, d.reason, &*d.source.to_string()),
        (Verdict::Deny, Reason::NetworkLocalUnlisted, "network.local")
    );
    assert_eq!(asks.network.decide("127.0.0.1", 22).verdict, Verdict::Deny);
    assert_eq!(
        asks.network.decide("example.com", 443).verdict,
        Verdict::Approve
    );
    // a name that is not a loopback spelling is not opened by local
    assert_eq!(
        p.network.decide("localhost.example.com", 8080).verdict,
        Verdict::Deny
    );
    assert_eq!(p.network.local_addresses("example.com", 8080), None);
    // where the proxy connects: the address named, localhost to both
    assert_eq!(
        p.network.local_addresses("localhost", 8080),
        Some(vec!["127.0.0.1".parse().unwrap(), "::1".parse().unwrap()])
    );
    assert_eq!(
        p.network.local_addresses("127.0.0.1", 8080),
        Some(vec!["127.0.0.1".parse().unwrap()])
    );
    assert_eq!(p.network.local_addresses("localhost", 8081), None);
    // deny still wins
    let denied = ok("[network]\nlocal = [\"localhost:8080\"]\ndeny = [\"localhost\"]\n");
    assert_eq!(
        denied.network.decide("localhost", 8080).verdict,
        Verdict::Deny
    );
    // an allow entry keeps deciding mcpbox's own connections to loopback (a
    // remote upstream); the egress proxy's address guard still refuses it
    let upstream = ok("[network]\nallow = [\"127.0.0.1:9000\"]\n");
    assert_eq!(
        upstream.network.decide("127.0.0.1", 9000).reason,
        Reason::NetworkAllow
    );
    assert_eq!(
        upstream.network.decide("localhost", 9000).reason,
        Reason::NetworkLocalUnlisted
    );
    assert_eq!(p.network.local_summary().len(), 2);
    refused(
        "[network]\nlocal = [\"example.com:8080\"]\n",
        "network.local[0]",
        2,
        "not a loopback host",
    );
    refused(
        "[network]\nlocal = [\"localhost\"]\n",
        "network.local[0]",
        2,
        "has no port",
    );
    refused(
        "[network]\nlocal = [\"127.0.0.0/8:80\"]\n",
        "network.local[0]",
        2,
        "not a loopback host",
    );
}

#[test]
fn network_hosts_mapping_is_checked() {
    let p = ok(
        "[network]\nallow = [\"internal.api\"]\n[network.hosts]\n\"internal.api\" = \"10.1.2.3\"\n",
    );
    assert_eq!(
        p.network.mapped_address("internal.api"),
        "10.1.2.3".parse().ok()
    );
    refused(
        "[network.hosts]\n\"internal.api\" = \"10.1.2\"\n",
        "network.hosts.\"internal.api\"",
        2,
        "IP address",
    );
    refused(
        "[network.hosts]\n\"bad name\" = \"10.1.2.3\"\n",
        "network.hosts.\"bad name\"",
        2,
        "invalid host name",
    );
    refused(
        "[network.hosts]\n\"a.b\" = \"0.0.0.0\"\n",
        "network.hosts.\"a.b\"",
        2,
        "not a host address",
    );
}

#[test]
fn network_unlisted_must_be_deny_or_approve() {
    refused(
        "[network]\nunlisted = \"allow\"\n",
        "network.unlisted",
        2,
        "deny, approve",
    );
    assert_eq!(
        ok("[network]\nunlisted = \"approve\"\n").network.unlisted,
        Unlisted::Approve
    );
}

// ---- tools ----

#[test]
fn tools_bad_action_is_refused_with_valid_actions() {
    refused(
        "[tools]\n\"write_*\" = \"maybe\"\n",
        "tools.\"write_*\"",
        2,
        "allow, approve, deny",
    );
    refused(
        "[tools]\ndefault = \"ask\"\n",
        "tools.default",
        2,
        "allow, approve, deny",
    );
    refused(
        "[tools]\n\"\" = \"deny\"\n",
        "tools.\"\"",
        2,
        "empty tool pattern",
    );
}

#[test]
fn tools_rules_are_read_in_order() {
    let p = ok("[tools]\ndefault = \"deny\"\nshow_denied = true\ndestructive = \"approve\"\n\"write_*\" = \"approve\"\n\"delete_*\" = \"deny\"\n");
    assert_eq!(p.tools.default, Verdict::Deny);
    assert!(p.tools.show_denied);
    assert_eq!(p.tools.destructive, Verdict::Approve);
    let pats: Vec<&str> = p.tools.rules.iter().map(|r| r.pattern.as_str()).collect();
    assert_eq!(pats, ["write_*", "delete_*"]);
    assert_eq!(
        p.location("tools.\"delete_*\""),
        Some(Location { line: 6, column: 1 })
    );
}

// ---- locations, printing, schema ----

#[test]
fn locations_of_keys_in_the_source() {
    let text = "[filesystem]\ninput = \"./repo\"\n\n[[filesystem.mounts]]\nhost = \"/a\"\nat = \"/a\"\n\n[[filesystem.mounts]]\n  host = \"/b\"\nat = \"/b\"\n";
    let p = ok(text);
    assert_eq!(
        p.location("filesystem.input"),
        Some(Location { line: 2, column: 1 })
    );
    assert_eq!(
        p.location("filesystem.mounts[1].host"),
        Some(Location { line: 9, column: 3 })
    );
    assert_eq!(p.location("filesystem.output"), None);
    assert_eq!(p.location("nonsense"), None);
}

#[test]
fn effective_policy_round_trips() {
    for (name, text) in EXAMPLES {
        let file = Path::new("/repo/examples").join(name);
        let a = parse(text, &file).expect("parses");
        let printed = a.to_toml();
        let b = match parse(&printed, &file) {
            Ok(b) => b,
            Err(d) => panic!("effective policy of {name} does not parse:\n{d}\n---\n{printed}"),
        };
        assert_eq!(printed, b.to_toml(), "{name}");
        assert_eq!(a.filesystem, b.filesystem);
        assert_eq!(a.secrets, b.secrets);
        assert_eq!(a.tools, b.tools);
        assert_eq!(a.network, b.network);
        assert_eq!(a.process, b.process);
    }
}

#[test]
fn effective_policy_shows_defaults_and_absolute_paths() {
    let t = parse(
        "[filesystem]\ninput = \"repo\"\n",
        Path::new("/srv/p/fs.toml"),
    )
    .expect("parses")
    .to_toml();
    for needle in [
        "name = \"fs\"",
        "input = \"/srv/p/repo\"",
        "tmp = \"64MiB\"",
        "pids = 256",
        "unlisted = \"deny\"",
        "max_line = \"16MiB\"",
        "default = \"allow\"",
    ] {
        assert!(t.contains(needle), "{needle:?} missing in:\n{t}");
    }
}

#[test]
fn json_schema_covers_every_section() {
    let s = json_schema();
    let props = s["properties"].as_object().expect("properties");
    for section in [
        "server",
        "filesystem",
        "env",
        "process",
        "sandbox",
        "runtime",
        "network",
        "secrets",
        "tools",
        "output",
        "artifacts",
        "audit",
        "tests",
        "commands",
        "jobs",
    ] {
        assert!(props.contains_key(section), "schema lacks {section}");
        assert!(
            props[section].get("description").is_some(),
            "{section} has no description"
        );
    }
    assert_eq!(s["additionalProperties"], serde_json::Value::Bool(false));
    assert!(!s.to_string().contains("null"), "toml has no null");
    assert_eq!(
        s["$defs"]["Secret"]["oneOf"].as_array().map(Vec::len),
        Some(3)
    );
    let text = s.to_string();
    for needle in [
        "dangerously_allow_credentials",
        "from_command",
        "call_timeout",
        "redact_credential_shapes",
        "a size",
        "show_denied",
        "revoke",
        "MCPBOX_SECRET_VALUE",
        "max_size",
        "argv_tools",
        "vcs_write",
        "tool.argument",
        "exec_timeout",
        "job_output",
    ] {
        assert!(text.contains(needle), "schema lacks {needle}");
    }
}

// ---- robustness ----

/// A tiny deterministic generator (no extra crates): xorshift64.
pub(crate) struct Rng(pub(crate) u64);

impl Rng {
    pub(crate) fn next(&mut self) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0
    }
    pub(crate) fn below(&mut self, n: usize) -> usize {
        (self.next() % n.max(1) as u64) as usize
    }
}

#[test]
fn garbage_input_never_panics() {
    const PIECES: &[&str] = &[
        "[",
        "]",
        "[[",
        "]]",
        "=",
        "\"",
        "'",
        "\n",
        "{",
        "}",
        ",",
        ".",
        "*",
        "é",
        "\u{0}",
        "\u{202e}",
        "-1",
        "1e999",
        "nan",
        "[filesystem]",
        "[[filesystem.mounts]]",
        "at = \"/\"",
        "tmp = \"99999999999999999999TiB\"",
        "\"*\"",
        "[tools]",
        "\"a\" = ",
        "[network]",
        "allow = [\"",
        "[::1]:0",
        "from_env",
        "ttl = \"1h\"",
        "\\u0000",
        "#",
        "[artifacts]",
        "patterns = [\"",
        "**/",
        "../",
        "revoke = [",
    ];
    let mut rng = Rng(0x9e37_79b9_7f4a_7c15);
    let mut accepted = 0;
    for round in 0..2000 {
        let (_, base) = EXAMPLES[round % EXAMPLES.len()];
        let mut chars: Vec<char> = base.chars().collect();
        for _ in 0..1 + rng.below(6) {
            let at = rng.below(chars.len() + 1);
            match rng.below(4) {
                0 if at < chars.len() => {
                    chars.remove(at);
                }
                1 if at < chars.len() => {
                    let end = (at + rng.below(40)).min(chars.len());
                    chars.drain(at..end);
                }
                2 => {
                    let piece = PIECES[rng.below(PIECES.len())];
                    for (i, c) in piece.chars().enumerate() {
                        chars.insert(at + i, c);
                    }
                }
                _ => {
                    let c = char::from_u32((rng.next() % 0x3000) as u32).unwrap_or('x');
                    chars.insert(at, c);
                }
            }
        }
        let text: String = chars.into_iter().collect();
        match parse(&text, Path::new("/fuzz/p.toml")) {
            Ok(p) => {
                accepted += 1;
                let _ = p.to_toml();
            }
            Err(d) => {
                let _ = d.to_string();
            }
        }
    }
    // the mutations are small: some inputs must still be valid, or the test tests nothing
    assert!(accepted > 0);
    // pure noise too
    for len in 0..200 {
        let text: String = (0..len)
            .map(|_| char::from_u32((rng.next() % 0x80) as u32).unwrap_or(' '))
            .collect();
        let _ = parse(&text, Path::new(""));
    }
}

#[test]
fn deep_nesting_is_refused_without_overflowing_the_stack() {
    for open in ["[", "{a="] {
        let text = format!("x = {}", open.repeat(100_000));
        let d = err(&text);
        assert!(d.message.starts_with("invalid TOML"), "{d}");
    }
    let d = err(&format!("{}= 1", "a.".repeat(10_000)));
    assert!(!d.message.is_empty());
}

#[test]
fn docs_full_example_parses() {
    let doc = include_str!("../../../docs/policy.md");
    let start = doc.find("```toml\n").expect("a toml block") + "```toml\n".len();
    let end = start + doc[start..].find("```").expect("block end");
    let p = parse(&doc[start..end], Path::new("/srv/policies/fs.toml"))
        .unwrap_or_else(|d| panic!("{d}"));
    assert_eq!(p.name(), "fs");
    assert_eq!(
        p.filesystem.input,
        Some(PathBuf::from("/srv/policies/repo"))
    );
    assert!(matches!(
        p.network.decide("internal.api", 8443),
        Decision {
            verdict: Verdict::Allow,
            ..
        }
    ));
    assert!(matches!(
        p.network.decide("uploads.example.com", 443),
        Decision {
            verdict: Verdict::Deny,
            ..
        }
    ));
    assert_eq!(
        p.tools.decide("delete_all", &ToolHints::default()).verdict,
        Verdict::Deny
    );
    let call = |cmd: &str| {
        p.commands
            .decide_call("run_shell", Some(&serde_json::json!({ "cmd": cmd })))
            .map(|d| d.decision.verdict)
    };
    assert_eq!(call("rm -rf build"), Some(Verdict::Approve));
    assert_eq!(call("curl x"), Some(Verdict::Deny));
    assert_eq!(call("ls"), Some(Verdict::Allow));
    assert_eq!(p.jobs.max_running, 4);
}

#[test]
fn docs_commands_and_jobs_examples_parse() {
    let doc = include_str!("../../../docs/policy.md");
    for head in ["```toml\n[commands]\n", "```toml\n[jobs]\n"] {
        let start = doc.find(head).expect("an example block") + "```toml\n".len();
        let end = start + doc[start..].find("```").expect("block end");
        let p = parse(&doc[start..end], Path::new(FILE)).unwrap_or_else(|d| panic!("{d}"));
        assert_eq!(
            p.jobs,
            Jobs::default(),
            "the documented values are the defaults"
        );
        if head.contains("commands") {
            assert_eq!(p.commands.line_args.len(), 1);
            assert_eq!(p.commands.argv_args.len(), 1);
        }
    }
}

// ---- [[tests]] examples ----

#[test]
fn examples_in_the_policy_are_checked_at_load() {
    let base = "[tools]\n\"delete_*\" = \"deny\"\ndestructive = \"approve\"\n[network]\nallow = [\"api.github.com\", \"[::1]:8080\"]\n";
    ok(&format!(
        "{base}[[tests]]\ntool = \"delete_all\"\nexpect = \"deny\"\n[[tests]]\ntool = \"rm\"\ndestructive = true\nexpect = \"approve\"\n\
         [[tests]]\nhost = \"api.github.com\"\nexpect = \"allow\"\n[[tests]]\nhost = \"[::1]:8080\"\nexpect = \"allow\"\n\
         [[tests]]\nhost = \"api.github.com:22\"\nexpect = \"deny\"\n"
    ));
}

#[test]
fn example_that_the_policy_contradicts_is_refused() {
    let base = "[tools]\n\"delete_*\" = \"deny\"\n";
    refused(
        &format!("{base}\n[[tests]]\ntool = \"delete_all\"\nexpect = \"allow\"\n"),
        "tests[0].expect",
        6,
        "tools.\"delete_*\"",
    );
    refused(
        "[[tests]]\nhost = \"example.com\"\nexpect = \"allow\"\n",
        "tests[0].expect",
        3,
        "network.unlisted",
    );
    refused(
        "[[tests]]\nexpect = \"allow\"\n",
        "tests[0]",
        1,
        "exactly one of tool or host",
    );
    refused(
        "[[tests]]\ntool = \"a\"\nhost = \"b\"\nexpect = \"allow\"\n",
        "tests[0]",
        1,
        "exactly one",
    );
    refused(
        "[[tests]]\nhost = \"a.com:0\"\nexpect = \"deny\"\n",
        "tests[0].host",
        2,
        "invalid host",
    );
    refused(
        "[[tests]]\nhost = \"a.com\"\ndestructive = true\nexpect = \"deny\"\n",
        "tests[0]",
        1,
        "no tool hints",
    );
}

#[test]
fn garbage_values_never_panic_the_engines() {
    const ALPHABET: &[char] = &[
        'a', 'z', '0', '9', '.', ':', '[', ']', '/', '*', '?', '-', '_', '%', ' ', 'é', '\u{0}',
        'K', 'i', 'B', 'm', 's', 'h', '~',
    ];
    let mut rng = Rng(0x1234_5678_9abc_def1);
    let p = parse(EXAMPLES[1].1, Path::new("/repo/examples/fs.toml")).expect("parses");
    let mut net = p.network.clone();
    net.allow
        .push(HostRule::parse("*.example.com").expect("valid"));
    net.allow
        .push(HostRule::parse("10.0.0.0/8").expect("valid"));
    for _ in 0..5000 {
        let len = rng.below(24);
        let s: String = (0..len)
            .map(|_| ALPHABET[rng.below(ALPHABET.len())])
            .collect();
        let _ = HostRule::parse(&s);
        let _ = parse_size(&s);
        let _ = parse_duration(&s);
        let _ = credential_kind(Path::new(&s));
        let _ = glob_match(&s, "write_file");
        let _ = glob_match("w*e_?i*", &s);
        let _ = net.decide(&s, rng.below(65_536) as u16);
        let _ = net.mapped_address(&s);
        let _ = p.tools.decide(
            &s,
            &ToolHints {
                read_only: Some(true),
                destructive: Some(true),
                ..ToolHints::default()
            },
        );
    }
}

const TOKEN_SECRET: &str = "[secrets]\nTICKETS_TOKEN = { from_env = \"T\" }\n";

#[test]
fn upstream_header_renders_its_secret() {
    let p = ok(&format!(
        "{TOKEN_SECRET}[upstream]\nheader = \"Authorization\"\nvalue = \"Bearer ${{TICKETS_TOKEN}}\"\n"
    ));
    let (h, v) = p
        .upstream
        .render(|n| (n == "TICKETS_TOKEN").then_some("s3cr3t-value"))
        .unwrap()
        .unwrap();
    assert_eq!(
        (h.as_str(), v.as_str()),
        ("Authorization", "Bearer s3cr3t-value")
    );
    // a value that cannot travel in a header is named, not shown
    let e = p
        .upstream
        .render(|_| Some("bad\nvalue"))
        .unwrap()
        .unwrap_err();
    assert!(e.contains("TICKETS_TOKEN") && !e.contains("bad"), "{e}");
    assert!(ok("").upstream.render(|_| None).is_none());
}

#[test]
fn upstream_value_naming_no_secret_is_refused() {
    refused(
        &format!(
            "{TOKEN_SECRET}[upstream]\nheader = \"Authorization\"\nvalue = \"Bearer abc123\"\n"
        ),
        "upstream.value",
        5,
        "names no secret",
    );
    refused(
        &format!(
            "{TOKEN_SECRET}[upstream]\nheader = \"Authorization\"\nvalue = \"Bearer ${{OTHER}}\"\n"
        ),
        "upstream.value",
        5,
        "names no secret of [secrets]",
    );
    refused(
        &format!("{TOKEN_SECRET}[upstream]\nheader = \"Authorization\"\nvalue = \"Bearer ${{TICKETS_TOKEN\"\n"),
        "upstream.value",
        5,
        "closing",
    );
}

#[test]
fn upstream_header_the_gateway_sets_or_a_bad_name_is_refused() {
    for h in [
        "Host",
        "mcp-session-id",
        "Content-Type",
        "Proxy-Authorization",
        "Bad Header",
        "",
    ] {
        let d = err(&format!(
            "{TOKEN_SECRET}[upstream]\nheader = \"{h}\"\nvalue = \"${{TICKETS_TOKEN}}\"\n"
        ));
        assert_eq!(d.key, "upstream.header", "{h}: {d}");
    }
    refused(
        &format!("{TOKEN_SECRET}[upstream]\nvalue = \"${{TICKETS_TOKEN}}\"\n"),
        "upstream.value",
        4,
        "without header",
    );
}

// ---- [commands] and [jobs]

#[test]
fn commands_section_is_read_over_its_defaults() {
    let p = ok("[commands]\ntools = [\"run_shell.cmd\"]\nargv_tools = [\"spawn.argv\"]\ndefault = \"approve\"\nunparsed = \"deny\"\n[commands.categories]\ndelete = \"approve\"\n[commands.programs]\ncurl = \"deny\"\n");
    let c = &p.commands;
    assert_eq!(
        c.line_args,
        vec![ToolArg {
            tool: "run_shell".into(),
            argument: "cmd".into()
        }]
    );
    assert_eq!(c.argv_args[0].to_string(), "spawn.argv");
    assert_eq!(c.default, Verdict::Approve);
    assert_eq!(c.unparsed, Verdict::Deny);
    assert_eq!(c.categories[&Category::Delete], Verdict::Approve);
    // left out: the defaults
    assert_eq!(c.categories[&Category::Privilege], Verdict::Deny);
    assert_eq!(c.categories[&Category::Listener], Verdict::Approve);
    assert_eq!(c.categories[&Category::Network], Verdict::Allow);
    assert_eq!(c.programs["curl"], Verdict::Deny);
    let d = c
        .decide_call("run_shell", Some(&serde_json::json!({"cmd": "curl x"})))
        .unwrap();
    assert_eq!(d.decision.source, "commands.programs.curl");
    // no section: no effect
    assert!(ok("").commands.is_empty());
    assert_eq!(ok("").commands, CommandRules::default());
}

#[test]
fn commands_unparsed_allow_is_refused_at_its_line() {
    let d = refused(
        "[commands]\ntools = [\"a.b\"]\nunparsed = \"allow\"\n",
        "commands.unparsed",
        3,
        "approve",
    );
    assert!(
        d.to_string()
            .starts_with("/p/policy.toml:3:1: commands.unparsed: "),
        "{d}"
    );
}

#[test]
fn commands_unknown_category_is_refused_with_the_valid_ones() {
    let d = refused(
        "[commands.categories]\ndelete = \"approve\"\nexfiltrate = \"deny\"\n",
        "commands.categories.exfiltrate",
        3,
        "vcs_write",
    );
    assert!(d.message.contains("unknown category"), "{d}");
    refused(
        "[commands.categories]\ndelete = \"maybe\"\n",
        "commands.categories.delete",
        2,
        "approve",
    );
}

#[test]
fn commands_tool_argument_needs_exactly_one_dot() {
    for bad in ["nodot", "a.b.c", ".cmd", "tool.", "a b.c", ""] {
        refused(
            &format!("[commands]\ntools = [\"ok.cmd\", \"{bad}\"]\n"),
            "commands.tools[1]",
            2,
            "tool.argument",
        );
    }
    refused(
        "[commands]\nargv_tools = [\"x\"]\n",
        "commands.argv_tools[0]",
        2,
        "one '.'",
    );
    refused(
        "[commands]\ntools = [\"a.b\"]\nargv_tools = [\"a.b\"]\n",
        "commands.argv_tools[0]",
        3,
        "already declared",
    );
}

#[test]
fn commands_program_names_are_basenames() {
    for bad in ["\"/bin/rm\"", "\"a b\"", "\"\""] {
        let d = err(&format!("[commands.programs]\n{bad} = \"deny\"\n"));
        assert!(d.key.starts_with("commands.programs."), "{d}");
        assert_eq!(d.location.map(|l| l.line), Some(2), "{d}");
    }
    refused(
        "[commands.programs]\ncurl = \"never\"\n",
        "commands.programs.curl",
        2,
        "deny",
    );
}

#[test]
fn jobs_default_and_read() {
    let j = ok("").jobs;
    assert_eq!(j, Jobs::default());
    assert_eq!(j.max_running, 4);
    assert_eq!(j.max_time, Duration::from_secs(600));
    assert_eq!(j.max_memory, 512 << 20);
    assert_eq!(j.exec_timeout, Duration::from_secs(60));
    assert_eq!(j.max_output, 64 << 10);
    assert_eq!(j.job_output, 8 << 20);
    let j = ok("[jobs]\nmax_running = 64\nmax_time = \"24h\"\nmax_memory = \"1GiB\"\nexec_timeout = \"1h\"\nmax_output = \"16MiB\"\njob_output = \"256MiB\"\n").jobs;
    assert_eq!(j.max_running, 64);
    assert_eq!(j.max_time, Duration::from_secs(86_400));
    assert_eq!(j.exec_timeout, Duration::from_secs(3600));
    assert_eq!(j.job_output, 256 << 20);
}

#[test]
fn jobs_out_of_range_are_refused() {
    for (text, key) in [
        ("max_running = 0", "jobs.max_running"),
        ("max_running = 65", "jobs.max_running"),
        ("max_time = \"0s\"", "jobs.max_time"),
        ("max_time = \"25h\"", "jobs.max_time"),
        ("max_memory = \"0B\"", "jobs.max_memory"),
        ("max_memory = \"2TiB\"", "jobs.max_memory"),
        ("exec_timeout = \"0ms\"", "jobs.exec_timeout"),
        ("exec_timeout = \"61m\"", "jobs.exec_timeout"),
        ("max_output = \"0B\"", "jobs.max_output"),
        ("max_output = \"17MiB\"", "jobs.max_output"),
        ("job_output = \"0B\"", "jobs.job_output"),
        ("job_output = \"257MiB\"", "jobs.job_output"),
    ] {
        refused(&format!("[jobs]\n{text}\n"), key, 2, "");
    }
    refused("[jobs]\nmax_memory = 5\n", "jobs.max_memory", 2, "a size");
    refused("[jobs]\nmax_time = \"10\"\n", "jobs.max_time", 2, "unit");
    refused("[jobs]\nnope = 1\n", "jobs.nope", 2, "max_running");
}

#[test]
fn effective_policy_shows_commands_and_jobs() {
    let p = ok("[commands]\ntools = [\"run.cmd\"]\n[commands.programs]\ncurl = \"deny\"\n");
    let t = p.to_toml();
    for needle in [
        "[commands]",
        "tools = [\"run.cmd\"]",
        "unparsed = \"approve\"",
        "[commands.categories]",
        "privilege = \"deny\"",
        "listener = \"approve\"",
        "curl = \"deny\"",
        "[jobs]",
        "max_running = 4",
        "max_time = \"10m\"",
        "job_output = \"8MiB\"",
    ] {
        assert!(t.contains(needle), "{needle:?} missing in:\n{t}");
    }
    let again = parse(&t, Path::new(FILE)).expect("the effective policy parses");
    assert_eq!(again.commands, p.commands);
    assert_eq!(again.jobs, p.jobs);
}

#[test]
fn argument_rules_parse_with_their_defaults() {
    let p = ok(r#"
[tools]
outside_paths = "approve"

[[tools.arguments]]
tool = "write_*"
argument = "path"
paths = ["/workspace/output/", "/data"]

[[tools.arguments]]
tool = "fetch"
argument = "url"
hosts = ["*.example.com", "api.github.com:8443"]
otherwise = "approve"

[[tools.arguments]]
tool = "deploy"
argument = "env"
one_of = ["staging", "prod", 3, true]
max_length = 10

[[tools.arguments]]
tool = "http_get"
argument = "path"
not_a_path = true
"#);
    let a = &p.tools.arguments;
    assert_eq!(a.outside_paths, Verdict::Approve);
    assert_eq!(a.rules.len(), 4);
    assert_eq!(
        a.rules[0].paths.as_deref().unwrap(),
        ["/workspace/output".to_string(), "/data".to_string()]
    );
    assert_eq!(a.rules[0].otherwise, Verdict::Deny);
    assert_eq!(a.rules[1].otherwise, Verdict::Approve);
    assert!(a.rules[3].not_a_path);
    // a policy without them denies paths outside by default
    assert_eq!(ok("").tools.arguments.outside_paths, Verdict::Deny);
}

#[test]
fn argument_rules_are_refused_at_their_line() {
    refused(
        "[[tools.arguments]]\ntool = \"w\"\nargument = \"path\"\n",
        "tools.arguments[0]",
        1,
        "paths, hosts",
    );
    refused(
        "[[tools.arguments]]\ntool = \"w\"\nargument = \"path\"\npaths = [\"output\"]\n",
        "tools.arguments[0].paths[0]",
        4,
        "absolute",
    );
    refused(
        "[[tools.arguments]]\ntool = \"w\"\nargument = \"path\"\npaths = [\"/workspace/../etc\"]\n",
        "tools.arguments[0].paths[0]",
        4,
        "..",
    );
    refused(
        "[[tools.arguments]]\ntool = \"w x\"\nargument = \"path\"\nmax_length = 3\n",
        "tools.arguments[0].tool",
        2,
        "glob",
    );
    refused(
        "[[tools.arguments]]\ntool = \"w\"\nargument = \"p\"\none_of = [[1]]\n",
        "tools.arguments[0].one_of[0]",
        4,
        "string",
    );
    refused(
        "[[tools.arguments]]\ntool = \"w\"\nargument = \"p\"\nhosts = [\"https://x.com/\"]\n",
        "tools.arguments[0].hosts",
        4,
        "host",
    );
    refused(
        "[[tools.arguments]]\ntool = \"w\"\nargument = \"p\"\nmax_len = 3\n",
        "tools.arguments[0].max_len",
        4,
        "max_length",
    );
}

// ---- [approvals] and the result approvals of [output] ----

#[test]
fn approvals_section_parses_with_safe_defaults() {
    let p = ok("");
    assert_eq!(p.approvals.fallback, crate::ApprovalFallback::Refuse);
    assert_eq!(p.approvals.timeout, std::time::Duration::from_secs(120));
    assert_eq!(p.output.approve_over, None);
    assert!(!p.output.approve_credential_shapes);
    let p = ok("[approvals]\nfallback = \"hold\"\ntimeout = \"10m\"\n[output]\napprove_over = \"256KiB\"\napprove_credential_shapes = true\n");
    assert_eq!(p.approvals.fallback, crate::ApprovalFallback::Hold);
    assert_eq!(p.approvals.timeout, std::time::Duration::from_secs(600));
    assert_eq!(p.output.approve_over, Some(256 << 10));
    assert!(p.output.approve_credential_shapes);
    assert!(
        p.approvals.elicitation,
        "the host's form is a channel by default"
    );
    let p = ok("[approvals]
elicitation = false
");
    assert!(!p.approvals.elicitation);
}

#[test]
fn approvals_section_refuses_what_would_not_work() {
    for (text, key) in [
        ("[approvals]\nfallback = \"ask\"\n", "fallback"),
        ("[approvals]\ntimeout = \"0s\"\n", "approvals.timeout"),
        ("[approvals]\ntimeout = \"2d\"\n", "approvals.timeout"),
        ("[approvals]\nwait = \"1m\"\n", "wait"),
        ("[output]\napprove_over = \"0\"\n", "output.approve_over"),
        ("[approvals]\nnotify = []\n", "approvals.notify"),
        ("[approvals]\nnotify = [\"\"]\n", "approvals.notify"),
    ] {
        let d = err(text);
        assert!(d.to_string().contains(key), "{text}: {d}");
    }
}

#[test]
fn a_policy_chooses_the_gvisor_tier_and_the_effective_policy_says_so() {
    let p = ok("[sandbox]\nisolation = \"gvisor\"\n");
    assert_eq!(p.sandbox.isolation, crate::Isolation::Gvisor);
    assert!(p.to_toml().contains("isolation = \"gvisor\""));
    // the default is written out too: a reviewer sees which tier runs it
    assert!(ok("").to_toml().contains("isolation = \"namespaces\""));
}
