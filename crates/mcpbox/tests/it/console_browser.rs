//! The web console in headless Chromium, driven by Playwright for Python
//! (tests/interop/console_browser.py): a held call appears live and "Allow
//! once" completes it, "Deny" refuses it, HTML and script in a call's
//! arguments render inert, every page renders, a rug pull shows on the
//! pins page with its diff and is rejected there, and `serve`'s sandboxes are listed,
//! paused and resumed.
//!
//! Needs Debian's `chromium` and PyPI `playwright` in the peers' venv
//! (`scripts/install-test-deps.sh` installs both, pinned). When either is
//! missing the test fails under `CI` and is skipped, saying why, without.
//! `MCPBOX_CONSOLE_SCREENSHOTS=docs/console` writes the docs' screenshots.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use crate::common;

use std::ffi::OsStr;
use std::os::unix::fs::PermissionsExt;
use std::path::PathBuf;
use std::process::Command;

use common::Workspace;

const CHROMIUM: &str = "/usr/bin/chromium";

/// The Python with Playwright, or why there is none.
fn python() -> Result<PathBuf, String> {
    let peers = std::env::var_os("MCPBOX_PEERS")
        .map(PathBuf::from)
        .unwrap_or_else(|| {
            PathBuf::from(env!("CARGO_MANIFEST_DIR"))
                .join("../..")
                .join(".local/peers")
        });
    let py = peers.join("venv/bin/python");
    if !py.exists() {
        return Err(format!("no peers' venv at {}", py.display()));
    }
    let ok = Command::new(&py)
        .args(["-c", "import playwright.sync_api"])
        .output()
        .map(|o| o.status.success())
        .unwrap_or(false);
    if !ok {
        return Err(format!("playwright is not installed in {}", py.display()));
    }
    if !std::path::Path::new(CHROMIUM).exists() {
        return Err(format!("{CHROMIUM} is missing (Debian's chromium)"));
    }
    Ok(py)
}

/// The Python with Playwright; `None` (the test skips) when it or
/// Chromium is missing outside CI; a failure under CI.
fn python_or_skip() -> Option<PathBuf> {
    match python() {
        Ok(p) => Some(p),
        Err(why) if std::env::var_os("CI").is_some() => {
            panic!("{why}: run scripts/install-test-deps.sh")
        }
        Err(why) => {
            eprintln!("skipped: {why} (scripts/install-test-deps.sh installs it)");
            None
        }
    }
}

/// Runs the browser script with `mode` (`--policy FILE` or
/// `--serve-config FILE`), its state and runtime in `dir`; returns where
/// the screenshots went.
fn drive(
    py: &std::path::Path,
    dir: &std::path::Path,
    mode: &[&std::ffi::OsStr],
    env: &[(&str, &str)],
) -> PathBuf {
    let runtime = dir.join("run");
    std::fs::create_dir_all(&runtime).unwrap();
    std::fs::set_permissions(&runtime, std::fs::Permissions::from_mode(0o700)).unwrap();
    let shots = std::env::var_os("MCPBOX_CONSOLE_SCREENSHOTS")
        .map(PathBuf::from)
        .unwrap_or_else(|| dir.join("shots"));
    let out = Command::new(py)
        .arg(common::interop_script("console_browser.py"))
        .arg("--mcpbox")
        .arg(common::mcpbox())
        .args(mode)
        .arg("--state")
        .arg(dir.join("state"))
        .arg("--runtime")
        .arg(&runtime)
        .arg("--shots")
        .arg(&shots)
        .arg("--chromium")
        .arg(CHROMIUM)
        .env("HOME", dir)
        .envs(env.iter().copied())
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        out.status.success(),
        "the browser test failed\nstdout:\n{stdout}\nstderr:\n{stderr}"
    );
    assert!(stdout.contains("all checks held"), "{stdout}");
    shots
}

#[test]
fn console_in_a_browser_approves_denies_and_renders_hostile_previews_inert() {
    let Some(py) = python_or_skip() else { return };
    let ws = Workspace::with_server("plain");
    let policy = ws.policy(
        "[server]\nname = \"notes\"\n[audit]\npath = \"audit.db\"\n\
         [approvals]\nfallback = \"hold\"\ntimeout = \"10m\"\n\
         [tools]\n\"echo\" = \"approve\"\n",
    );
    let shots = drive(
        &py,
        ws.path(),
        &[OsStr::new("--policy"), policy.as_os_str()],
        &[],
    );
    for shot in ["approvals.png", "audit.png", "sandboxes-run.png"] {
        assert!(shots.join(shot).exists(), "no screenshot {shot}");
    }
}

#[test]
fn console_in_a_browser_shows_a_rug_pull_with_its_diff_and_rejects_it() {
    let Some(py) = python_or_skip() else { return };
    let ws = Workspace::with_server("rugpull");
    let policy = ws.policy("[server]\nname = \"calc\"\n[audit]\npath = \"audit.db\"\n");
    let shots = drive(
        &py,
        ws.path(),
        &[
            OsStr::new("--scenario"),
            OsStr::new("pins"),
            OsStr::new("--policy"),
            policy.as_os_str(),
        ],
        &[],
    );
    assert!(shots.join("pins.png").exists());
}

#[test]
fn console_under_serve_lists_pauses_and_resumes_a_sandbox() {
    let Some(py) = python_or_skip() else { return };
    let dir = tempfile::Builder::new()
        .prefix("mcpbox-console-serve-")
        .tempdir()
        .unwrap();
    let plain = common::mcp::testserver("plain");
    std::fs::write(
        dir.path().join("plain.toml"),
        common::serve::binary_policy("plain", &plain, ""),
    )
    .unwrap();
    let config = dir.path().join("serve.toml");
    std::fs::write(
        &config,
        format!(
            "[listen]\naddress = \"127.0.0.1:0\"\n\n\
             [[clients]]\nname = \"alice\"\ntoken = {{ from_env = \"T_ALICE\" }}\n\n\
             [[servers]]\nname = \"plain\"\npolicy = \"plain.toml\"\ncommand = [{:?}]\n",
            plain.display().to_string()
        ),
    )
    .unwrap();
    let shots = drive(
        &py,
        dir.path(),
        &[OsStr::new("--serve-config"), config.as_os_str()],
        &[("T_ALICE", common::serve::ALICE)],
    );
    assert!(shots.join("sandboxes.png").exists());
}
