//! A real MCP server that needs the network, `mcp-server-fetch` (PyPI,
//! installed pinned into .local/peers/venv by `scripts/install-peers.sh`),
//! under `mcpbox run` with an allowlist: a name the policy allows reaches a
//! local test server through mcpbox's proxy; a name it does not allow is
//! refused by the proxy, and its server never sees a request.
//!
//! How the server's traffic goes through the proxy: it uses httpx, which
//! honours the HTTP_PROXY/HTTPS_PROXY variables mcpbox sets in the sandbox.
//! Its own private-address guard (on unless `--allow-private-ips`) resolves
//! each host with getaddrinfo before the request, through the sandbox's
//! resolver (issue 31, docs/policy.md). A public name gets its real,
//! public address there, so the server runs with its default flags: the
//! last test here shows it in a network namespace of its own
//! (common/public_net.rs), where the name is 1.2.3.4. The loopback tests
//! map their names to 127.0.0.1 with `[network.hosts]`; such a name gets a
//! synthetic address from 198.18.0.0/15, which the guard refuses, as it
//! would refuse 127.0.0.1 itself, so they run with `--allow-private-ips`
//! and the proxy alone decides what is reachable. Only 127.0.0.1 and the
//! test's own namespace are ever contacted.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use crate::common;

use common::audit;
use common::http::Stub;
use common::mcp::{result_text, Session};
use common::peers::{mount_same_path, peer};
use common::Workspace;
use serde_json::{json, Value};

const ALLOWED: &str = "docs.test";
const UNLISTED: &str = "intranet.test";

const PAGE: &str = "<!DOCTYPE html><html><head><title>Sandboxed fetch</title></head><body>\
<article><h1>Release notes</h1>\
<p>The quick sandboxed fox fetched this page through the egress proxy, and every \
connection it made was written to the audit log with its host and port.</p>\
<p>Nothing else on this machine was reachable from inside the sandbox.</p>\
</article></body></html>";

/// `mcpbox run` over mcp-server-fetch (with `flags`), its venv mounted at
/// the same path, `ALLOWED` on the allowed stub's port and `UNLISTED`
/// mapped but not allowed.
fn start(ws: &Workspace, allowed_port: u16, flags: &[&str]) -> Session {
    let venv = peer("venv");
    let p = ws.raw_policy(&format!(
        "{}[network]\nallow = [\"{ALLOWED}:{allowed_port}\"]\n\
         [network.hosts]\n\"{ALLOWED}\" = \"127.0.0.1\"\n\"{UNLISTED}\" = \"127.0.0.1\"\n\
         [audit]\npath = \"audit.db\"\n",
        mount_same_path(&venv)
    ));
    let server = peer("venv/bin/mcp-server-fetch").display().to_string();
    let state = ws.path().join("state").display().to_string();
    let mut args = vec![server.as_str()];
    args.extend_from_slice(flags);
    let mut s = Session::start(&p, &args, &[("MCPBOX_STATE_DIR", &state)]);
    let init = s.initialize();
    assert!(init.get("result").is_some(), "{init}\n{}", s.stderr());
    assert!(s.tool_names().contains(&"fetch".to_string()));
    s
}

fn fetch(s: &mut Session, url: &str) -> Value {
    s.call("fetch", json!({"url": url}))
}

/// Fetches `url` (serving `PAGE`), checks the page's text came back
/// (simplified to Markdown by the server), and ends the session cleanly.
fn fetch_page(mut s: Session, url: &str) {
    let r = fetch(&mut s, url);
    let text = result_text(&r);
    assert_ne!(r["result"]["isError"], json!(true), "{r}\n{}", s.stderr());
    assert!(
        text.contains("quick sandboxed fox fetched this page"),
        "{r}\n{}",
        s.stderr()
    );
    let (status, _) = s.finish();
    assert!(status.success());
}

#[test]
fn fetch_server_reaches_an_allowed_name_through_the_proxy() {
    let stub = Stub::start();
    stub.route("/notes.html", "text/html; charset=utf-8", PAGE);
    let ws = Workspace::new();
    // robots.txt is fetched first (404 here, so allowed). The server's own
    // private-address guard is off: the name is mapped to 127.0.0.1,
    // which it refuses in any form (see the module's comment).
    let s = start(&ws, stub.port(), &["--allow-private-ips"]);
    let url = format!("http://{ALLOWED}:{}/notes.html", stub.port());
    fetch_page(s, &url);
    assert!(
        stub.requests()
            .iter()
            .any(|l| l.starts_with("GET /notes.html ")),
        "{:?}",
        stub.requests()
    );

    let events = audit::events(&ws.path().join("audit.db"));
    let to_allowed = audit::network_to(&events, ALLOWED);
    assert!(!to_allowed.is_empty(), "{events:#?}");
    for e in &to_allowed {
        assert_eq!(e["decision"], "allow", "{e}");
        assert_eq!(e["detail"]["port"], stub.port(), "{e}");
    }
    let call = events
        .iter()
        .find(|e| e["kind"] == "tool_call" && e["tool"] == "fetch" && e["decision"] == "allow")
        .unwrap_or_else(|| panic!("{events:#?}"));
    // each connection is tied to the call that made it, and to its caller
    let call_ref = call["detail"]["call"]
        .as_str()
        .expect("the call's reference");
    for e in &to_allowed {
        assert_eq!(
            e["detail"]["calls"],
            json!([{"call": call_ref, "tool": "fetch"}]),
            "{e}"
        );
        assert_eq!(e["caller"], call["caller"], "{e}");
        assert_eq!(e["caller"], "stdio:mcpbox-test/0", "{e}");
    }
    // and the same log as OCSF events, valid against the schema
    let report = audit::assert_valid_ocsf(&ws.path().join("audit.db"));
    assert!(
        report.contains("api_activity") && report.contains("network_activity"),
        "{report}"
    );
}

#[test]
fn fetch_server_is_refused_an_unlisted_name_that_never_sees_a_request() {
    let allowed = Stub::start();
    let unlisted = Stub::start();
    unlisted.route(
        "/secret.html",
        "text/html",
        "<html><body>internal only</body></html>",
    );
    let ws = Workspace::new();
    // Without --ignore-robots-txt the server would stop at the refused
    // robots.txt; with it, the page request itself meets the proxy.
    let mut s = start(&ws, allowed.port(), &["--ignore-robots-txt"]);
    let url = format!("http://{UNLISTED}:{}/secret.html", unlisted.port());
    let r = fetch(&mut s, &url);
    let text = result_text(&r);
    // The proxy answers 403; the server turns that into an error result.
    assert_eq!(r["result"]["isError"], json!(true), "{r}\n{}", s.stderr());
    assert!(
        text.contains("secret.html") && text.contains("status code 403"),
        "{r}"
    );
    assert!(!text.contains("internal only"), "{r}");
    s.finish();
    assert!(
        unlisted.requests().is_empty(),
        "the unlisted server was reached: {:?}",
        unlisted.requests()
    );

    let events = audit::events(&ws.path().join("audit.db"));
    let to_unlisted = audit::network_to(&events, UNLISTED);
    assert!(!to_unlisted.is_empty(), "{events:#?}");
    for e in &to_unlisted {
        assert_eq!(e["decision"], "deny", "{e}");
        assert_eq!(e["reason"], "network.unlisted", "{e}");
    }
    // a refused connection is a valid OCSF Network Activity: Refuse
    let report = audit::assert_valid_ocsf(&ws.path().join("audit.db"));
    assert!(report.contains("network_activity"), "{report}");
}

/// The fetch preset's real-world path: mcp-server-fetch with its default
/// flags (its own private-address guard on, robots.txt checked) fetches a
/// page from a name with a public address. Its guard asks the sandbox's
/// resolver, which answers with the address the proxy resolved on the
/// host; a synthetic address here would make the guard refuse every URL.
#[test]
fn fetch_server_with_default_flags_reaches_a_public_name() {
    use common::public_net;
    if !public_net::available() {
        eprintln!("skipped: needs root to make a network namespace with a public address");
        return;
    }
    let ws = Workspace::new();
    let venv = peer("venv");
    let port = public_net::PORT;
    let p = ws.raw_policy(&format!(
        "{}[network]\nallow = [\"pub.test:{port}\"]\n[audit]\npath = \"audit.db\"\n",
        mount_same_path(&venv)
    ));
    let server = peer("venv/bin/mcp-server-fetch").display().to_string();
    let state = ws.path().join("state").display().to_string();
    let mcpbox = common::mcpbox().display().to_string();
    let policy = p.display().to_string();
    let argv = [mcpbox.as_str(), "run", "--policy", &policy, "--", &server];
    let mut cmd = public_net::command(&ws.path().join("net"), &["pub.test"], PAGE, &argv);
    cmd.env("MCPBOX_STATE_DIR", &state);
    let mut s = Session::start_command(cmd);
    let init = s.initialize();
    assert!(init.get("result").is_some(), "{init}\n{}", s.stderr());
    fetch_page(s, &format!("http://pub.test:{port}/notes.html"));
    let events = audit::events(&ws.path().join("audit.db"));
    let to_allowed = audit::network_to(&events, "pub.test");
    assert!(!to_allowed.is_empty(), "{events:#?}");
    for e in &to_allowed {
        assert_eq!(e["decision"], "allow", "{e}");
        assert_eq!(
            e["detail"]["address"],
            format!("{}:{port}", public_net::ADDRESS),
            "{e}"
        );
    }
}
