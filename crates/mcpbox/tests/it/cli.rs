//! `mcpbox check` and `mcpbox doctor` through the real binary.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use crate::common;

use common::{is_root, run, Workspace};

fn stderr(out: &std::process::Output) -> String {
    String::from_utf8_lossy(&out.stderr).into_owned()
}

#[test]
fn check_prints_the_effective_policy() {
    let ws = Workspace::new();
    let p =
        ws.policy("[process]\nmemory = \"64MiB\"\n[sandbox]\ndangerously_allow_degraded = true\n");
    let out = run(&["check", p.to_str().unwrap()]);
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(
        text.contains(&format!("input = \"{}\"", ws.input().display())),
        "{text}"
    );
    assert!(
        text.contains("pids = 256"),
        "defaults are filled in: {text}"
    );
    assert!(text.contains("tmp = \"64MiB\""), "{text}");
}

#[test]
fn check_warns_where_a_deny_without_a_port_overrides_an_allow_on_another_port() {
    let ws = Workspace::new();
    let p = ws.raw_policy(
        "[network]\nallow = [\"*.example.com:8443\"]\ndeny = [\"uploads.example.com\"]\n",
    );
    let out = run(&["check", p.to_str().unwrap()]);
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    let err = stderr(&out);
    assert!(
        err.contains("warning: network.deny[0]") && err.contains("every port"),
        "{err}"
    );
}

#[test]
fn check_names_file_line_and_key_of_an_unknown_key() {
    let ws = Workspace::new();
    let p = ws.raw_policy("[filesystem]\ntmp = \"1MiB\"\ninptu = \"x\"\n");
    let out = run(&["check", p.to_str().unwrap()]);
    assert_eq!(out.status.code(), Some(1));
    let err = stderr(&out);
    assert!(err.contains("policy.toml:3:"), "{err}");
    assert!(err.contains("inptu"), "{err}");
    assert!(
        err.contains("hint:") && err.contains("input"),
        "the hint lists valid keys: {err}"
    );
}

#[test]
fn check_explains_a_wrong_type() {
    let ws = Workspace::new();
    let p = ws.raw_policy("[process]\nmemory = 512\n");
    let out = run(&["check", p.to_str().unwrap()]);
    assert_eq!(out.status.code(), Some(1));
    let err = stderr(&out);
    assert!(
        err.contains("policy.toml:2:") && err.contains("process.memory"),
        "{err}"
    );
    assert!(err.contains("MiB"), "says what a size looks like: {err}");
}

#[test]
fn check_refuses_a_missing_directory_and_a_credential_folder() {
    let ws = Workspace::new();
    let p = ws.raw_policy("[filesystem]\noutput = \"missing\"\n");
    let out = run(&["check", p.to_str().unwrap()]);
    assert_eq!(out.status.code(), Some(1));
    assert!(stderr(&out).contains("filesystem.output") && stderr(&out).contains("does not exist"));

    std::fs::create_dir_all(ws.path().join("x/.gnupg")).unwrap();
    let p = ws.raw_policy("[filesystem]\ninput = \"x/.gnupg\"\n");
    let out = run(&["check", p.to_str().unwrap()]);
    assert_eq!(out.status.code(), Some(1));
    assert!(stderr(&out).contains(".gnupg"), "{}", stderr(&out));
}

#[test]
fn check_refuses_a_limit_that_cannot_be_enforced_here() {
    if is_root() {
        return; // root can make cgroups on this machine; the refusal is the rootless case
    }
    let ws = Workspace::new();
    let p = ws.raw_policy("[process]\ncpu = 1.5\n");
    let out = run(&["check", p.to_str().unwrap()]);
    assert_eq!(out.status.code(), Some(1));
    assert!(
        stderr(&out).contains("process.cpu") && stderr(&out).contains("cannot be enforced"),
        "{}",
        stderr(&out)
    );
}

#[test]
fn check_never_runs_anything() {
    let ws = Workspace::new();
    let marker = ws.path().join("ran");
    let p = ws.raw_policy(&format!(
        "[secrets]\nTOKEN = {{ from_command = [\"touch\", \"{}\"] }}\n",
        marker.display()
    ));
    let out = run(&["check", p.to_str().unwrap()]);
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    assert!(!marker.exists(), "check ran the secret's command");
}

#[test]
fn check_schema_is_json_with_every_section() {
    let out = run(&["check", "--schema"]);
    assert_eq!(out.status.code(), Some(0));
    let schema: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    let props = schema["properties"].as_object().unwrap();
    for section in [
        "filesystem",
        "env",
        "process",
        "network",
        "sandbox",
        "secrets",
        "tools",
    ] {
        assert!(props.contains_key(section), "schema lacks {section}");
    }
}

#[test]
fn doctor_reports_the_full_sandbox_on_this_machine() {
    let out = run(&["doctor"]);
    let text = String::from_utf8_lossy(&out.stdout);
    for name in [
        "user namespaces",
        "landlock",
        "seccomp",
        "cgroups",
        "cgroup memory",
        "overlayfs",
        "file audit",
    ] {
        assert!(text.contains(name), "doctor does not report {name}: {text}");
    }
    // the same watch the relay places: mount marks as root, directory
    // marks rootless (kernel 5.13+ on these machines)
    let files = if is_root() {
        "(files: kernel)"
    } else {
        "(files: kernel-dirs)"
    };
    assert!(text.contains(files), "{text}");
    // These machines have user namespaces, Landlock and seccomp: the full
    // sandbox must be reported available (exit 0), as root and rootless.
    assert_eq!(out.status.code(), Some(0), "{text}");
}

#[test]
fn policy_file_that_does_not_exist_is_a_clear_error() {
    let out = run(&["exec", "--policy", "/nonexistent/policy.toml", "--", "true"]);
    assert_eq!(out.status.code(), Some(125));
    assert!(stderr(&out).contains("/nonexistent/policy.toml"));
}

// ---- `mcpbox check` on an `mcpbox serve` config ----

/// A directory holding `serve.toml` and the given policy files.
fn serve_dir(config: &str, policies: &[(&str, &str)]) -> (tempfile::TempDir, std::path::PathBuf) {
    let dir = tempfile::Builder::new()
        .prefix("mcpbox-serve-test-")
        .tempdir()
        .unwrap();
    for (name, text) in policies {
        std::fs::write(dir.path().join(name), text).unwrap();
    }
    let file = dir.path().join("serve.toml");
    std::fs::write(&file, config).unwrap();
    (dir, file)
}

const SERVE_CONFIG: &str = r#"
[listen]
address = "127.0.0.1:8787"

[[clients]]
name  = "alice"
token = { from_env = "MCPBOX_TEST_UNSET_ALICE_TOKEN" }

[[clients]]
name  = "bob"
token = { from_file = "bob.token" }
servers = ["everything"]

[[clients]]
name = "conformance"
dangerously_allow_anonymous = true

[[servers]]
name    = "everything"
policy  = "everything.toml"
command = ["node", "/workspace/input/server-everything/dist/index.js", "stdio"]

[[servers]]
name   = "tickets"
url    = "https://tickets.internal/mcp"
policy = "tickets.toml"
"#;

const SERVE_POLICIES: &[(&str, &str)] = &[
    ("everything.toml", "[tools]\ndefault = \"allow\"\n"),
    ("tickets.toml", "[tools]\n\"delete_*\" = \"deny\"\n"),
];

#[test]
fn check_serve_prints_the_effective_config_and_never_a_token() {
    use std::os::unix::fs::PermissionsExt;
    let (dir, file) = serve_dir(SERVE_CONFIG, SERVE_POLICIES);
    let token = dir.path().join("bob.token");
    std::fs::write(&token, "bob-s3cr3t-token\n").unwrap();
    std::fs::set_permissions(&token, std::fs::Permissions::from_mode(0o600)).unwrap();
    let out = run(&["check", file.to_str().unwrap()]);
    let err = stderr(&out);
    assert_eq!(out.status.code(), Some(0), "{err}");
    let text = String::from_utf8_lossy(&out.stdout);
    for needle in [
        "# effective serve config",
        "address = \"127.0.0.1:8787\"",
        "max_body = \"4MiB\"",
        "header_timeout = \"10s\"",
        "max_streams_per_client = 1024",
        "url = \"https://tickets.internal/mcp\"",
    ] {
        assert!(text.contains(needle), "{needle:?} missing in:\n{text}");
    }
    let policy = dir.path().join("everything.toml");
    assert!(
        text.contains(&format!("policy = \"{}\"", policy.display())),
        "paths resolved: {text}"
    );
    assert!(text.contains(&format!("from_file = \"{}\"", token.display())));
    // an unset variable is a warning (it may be set only where serve runs)
    assert!(
        err.contains("warning") && err.contains("MCPBOX_TEST_UNSET_ALICE_TOKEN"),
        "{err}"
    );
    assert!(
        !text.contains("bob-s3cr3t") && !err.contains("bob-s3cr3t"),
        "a token value was printed"
    );

    // a token file others can read: a warning naming the fix, not the value
    std::fs::set_permissions(&token, std::fs::Permissions::from_mode(0o644)).unwrap();
    let out = run(&["check", file.to_str().unwrap()]);
    let err = stderr(&out);
    assert_eq!(out.status.code(), Some(0), "{err}");
    assert!(
        err.contains("chmod 600") && err.contains("clients[1] (bob)"),
        "{err}"
    );
    assert!(!err.contains("bob-s3cr3t"), "{err}");
}

#[test]
fn check_serve_names_file_line_and_key_of_an_unknown_key() {
    let config = SERVE_CONFIG.replace(
        "policy = \"tickets.toml\"",
        "policy = \"tickets.toml\"\nurll = \"x\"",
    );
    let (_dir, file) = serve_dir(&config, SERVE_POLICIES);
    let out = run(&["check", file.to_str().unwrap()]);
    assert_eq!(out.status.code(), Some(1));
    let err = stderr(&out);
    assert!(
        err.contains("serve.toml:27:") && err.contains("servers[1].urll"),
        "{err}"
    );
    assert!(err.contains("hint:") && err.contains("url"), "{err}");
    assert!(err.contains("read as an `mcpbox serve` config"), "{err}");
}

#[test]
fn check_serve_reports_a_broken_policy_with_the_server_name() {
    let (_dir, file) = serve_dir(
        SERVE_CONFIG,
        &[
            ("everything.toml", "[filesystem]\ninptu = \"x\"\n"),
            ("tickets.toml", "[tools]\n"),
        ],
    );
    let out = run(&["check", file.to_str().unwrap()]);
    assert_eq!(out.status.code(), Some(1));
    let err = stderr(&out);
    assert!(
        err.contains("servers[0] (everything): policy ")
            && err.contains("everything.toml:2:")
            && err.contains("inptu"),
        "{err}"
    );

    // the host checks of a policy apply too, and every server is reported
    let (_dir, file) = serve_dir(
        SERVE_CONFIG,
        &[("everything.toml", "[filesystem]\noutput = \"missing\"\n")],
    );
    let out = run(&["check", file.to_str().unwrap()]);
    assert_eq!(out.status.code(), Some(1));
    let err = stderr(&out);
    assert!(
        err.contains("servers[0] (everything)") && err.contains("filesystem.output"),
        "{err}"
    );
    assert!(
        err.contains("servers[1] (tickets)") && err.contains("tickets.toml"),
        "{err}"
    );
}

#[test]
fn check_serve_refuses_an_anonymous_client_on_a_non_loopback_bind() {
    let config = SERVE_CONFIG.replace(
        "address = \"127.0.0.1:8787\"",
        "address = \"0.0.0.0:8787\"\ndangerously_allow_plaintext = true",
    );
    let (_dir, file) = serve_dir(&config, SERVE_POLICIES);
    let out = run(&["check", file.to_str().unwrap()]);
    assert_eq!(out.status.code(), Some(1));
    let err = stderr(&out);
    assert!(
        err.contains("serve.toml:17:")
            && err.contains("clients[2].dangerously_allow_anonymous")
            && err.contains("loopback"),
        "{err}"
    );
}

#[test]
fn check_schema_serve_is_the_serve_config_schema() {
    let out = run(&["check", "--schema", "serve"]);
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    let schema: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    let props = schema["properties"].as_object().unwrap();
    for key in ["listen", "limits", "clients", "servers"] {
        assert!(props.contains_key(key), "schema lacks {key}");
    }
    // `--schema` alone is still the policy's
    let out = run(&["check", "--schema"]);
    let schema: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert!(schema["properties"].get("filesystem").is_some());
}

#[test]
fn audit_since_takes_a_relative_time_as_the_help_writes_it() {
    // `--since -1h` once failed with "unexpected argument '-1'": clap read
    // the value as an option
    let dir = tempfile::tempdir().unwrap();
    let db = dir.path().join("audit.db");
    let out = run(&[
        "audit",
        "--since",
        "-1h",
        "--until",
        "-0s",
        "--db",
        db.to_str().unwrap(),
    ]);
    let err = stderr(&out);
    assert!(!err.contains("unexpected argument"), "{err}");
    assert!(err.contains("no audit log at"), "{err}");
}

/// Issue 32: doctor says where state and audit go, from which variable,
/// and that a host's mcpbox does not see a shell's MCPBOX_STATE_DIR.
#[test]
fn doctor_says_where_state_and_audit_go_and_that_hosts_start_with_their_own_environment() {
    let ws = Workspace::new();
    let state = ws.path().join("state");
    let out = std::process::Command::new(common::mcpbox())
        .arg("doctor")
        .env("MCPBOX_STATE_DIR", &state)
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(
        text.contains(&format!(
            "state: {} (from MCPBOX_STATE_DIR)",
            state.display()
        )),
        "{text}"
    );
    assert!(
        text.contains(&format!("audit: {}", state.join("audit.db").display())),
        "{text}"
    );
    assert!(
        text.contains("MCPBOX_STATE_DIR set in a shell does not reach it"),
        "{text}"
    );
    let out = std::process::Command::new(common::mcpbox())
        .arg("doctor")
        .env_remove("MCPBOX_STATE_DIR")
        .env_remove("XDG_STATE_HOME")
        .env("HOME", ws.path())
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(
        text.contains(&format!(
            "state: {} (from the default, $HOME/.local/state/mcpbox)",
            ws.path().join(".local/state/mcpbox").display()
        )),
        "{text}"
    );
}
