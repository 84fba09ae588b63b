//! `mcpbox check` and `mcpbox doctor` through the real binary.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

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
    ] {
        assert!(text.contains(name), "doctor does not report {name}: {text}");
    }
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
