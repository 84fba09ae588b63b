//! Package installs through mcpbox's egress proxy: the real `npm` and
//! `pip` run inside the sandbox (`mcpbox exec`) against a registry stand-in
//! that this test serves on 127.0.0.1 over plain HTTP. The registry names
//! (`registry.npmjs.org`, `pypi.org`, `files.pythonhosted.org`) are mapped
//! to 127.0.0.1 with `[network.hosts]`, so nothing ever leaves the machine,
//! and the proxy recognizes them as registries: the audit log must name
//! the package and version that was installed.
//!
//! The packages are built here on the host (an npm tarball and a wheel,
//! with their hashes) by /usr/bin/python3's standard library, so there is
//! no binary fixture to keep in sync.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use crate::common;

use std::path::{Path, PathBuf};
use std::process::{Command, Output};

use common::audit;
use common::http::Stub;
use common::pypi;
use common::{mcpbox, Workspace};
use serde_json::{json, Value};

const NPM_NAME: &str = "mcpbox-tiny";
const NPM_VERSION: &str = "1.0.3";
const PY_NAME: &str = "mcpbox_tiny";
const PY_VERSION: &str = "0.2.1";

/// Builds `npm.tgz` (an npm package tarball) in argv[1], and prints its
/// hashes as JSON: npm's `integrity` (sha512, base64) and `shasum` (sha1,
/// hex). The wheel is built by `common::pypi`.
const BUILD: &str = r#"
import base64, hashlib, io, json, os, sys, tarfile
out, npm_name, npm_ver = sys.argv[1:]

def tar_file(tf, name, data):
    info = tarfile.TarInfo(name)
    info.size, info.mode, info.mtime = len(data), 0o644, 1700000000
    tf.addfile(info, io.BytesIO(data))

buf = io.BytesIO()
with tarfile.open(fileobj=buf, mode="w:gz") as tf:
    pkg = {"name": npm_name, "version": npm_ver, "main": "index.js", "license": "MIT"}
    tar_file(tf, "package/package.json", json.dumps(pkg).encode())
    tar_file(tf, "package/index.js",
             b"exports.hello = () => 'hello from " + npm_name.encode() + b"';\n")
tgz = buf.getvalue()
with open(os.path.join(out, "npm.tgz"), "wb") as f:
    f.write(tgz)

print(json.dumps({
    "integrity": "sha512-" + base64.b64encode(hashlib.sha512(tgz).digest()).decode(),
    "shasum": hashlib.sha1(tgz).hexdigest(),
}))
"#;

/// The built packages and their hashes.
struct Built {
    tgz: Vec<u8>,
    wheel: pypi::Wheel,
    hashes: Value,
}

fn build_packages(dir: &Path) -> Built {
    let out = Command::new("/usr/bin/python3")
        .args(["-c", BUILD])
        .arg(dir)
        .args([NPM_NAME, NPM_VERSION])
        .output()
        .expect("run /usr/bin/python3 to build the test packages");
    assert!(
        out.status.success(),
        "building the test packages failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    Built {
        tgz: std::fs::read(dir.join("npm.tgz")).unwrap(),
        wheel: pypi::build_wheel(
            dir,
            PY_NAME,
            PY_VERSION,
            &format!("def hello():\n    return 'hello from {PY_NAME}'\n"),
            false,
        ),
        hashes: serde_json::from_slice(&out.stdout).unwrap(),
    }
}

/// A policy that lets the sandbox reach exactly `hosts`, each on the stub's
/// port and mapped to 127.0.0.1, with the audit log in the workspace.
fn registry_policy(ws: &Workspace, hosts: &[&str], port: u16) -> PathBuf {
    let allow: Vec<String> = hosts.iter().map(|h| format!("\"{h}:{port}\"")).collect();
    let map: String = hosts
        .iter()
        .map(|h| format!("\"{h}\" = \"127.0.0.1\"\n"))
        .collect();
    ws.policy(&format!(
        "[audit]\npath = \"audit.db\"\n[network]\nallow = [{}]\n[network.hosts]\n{map}",
        allow.join(", ")
    ))
}

/// `sh -c SCRIPT` inside the sandbox.
fn exec_sh(policy: &Path, script: &str) -> Output {
    Command::new(mcpbox())
        .arg("exec")
        .arg("--policy")
        .arg(policy)
        .args(["--", "/bin/sh", "-c", script])
        .stdin(std::process::Stdio::null())
        .output()
        .expect("run mcpbox exec")
}

#[track_caller]
fn assert_ran(out: &Output, what: &str, stub: &Stub) -> String {
    let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
    assert!(
        out.status.success(),
        "{what} failed ({:?})\nstdout: {stdout}\nstderr: {}\nregistry saw: {:?}",
        out.status,
        String::from_utf8_lossy(&out.stderr),
        stub.requests()
    );
    stdout
}

/// The audited package downloads: (ecosystem, name, version) of every
/// network event that carries a `detail.package`.
fn audited_packages(ws: &Workspace) -> Vec<(String, String, String)> {
    audit::events(&ws.path().join("audit.db"))
        .iter()
        .filter(|e| e["kind"] == "network")
        .filter_map(|e| {
            let p = &e["detail"]["package"];
            Some((
                p["ecosystem"].as_str()?.to_string(),
                p["name"].as_str()?.to_string(),
                p["version"].as_str()?.to_string(),
            ))
        })
        .collect()
}

#[test]
fn npm_install_through_the_proxy_is_recorded_by_package_name() {
    let ws = Workspace::new();
    let built = build_packages(ws.path());
    let stub = Stub::start();
    let port = stub.port();
    let registry = format!("http://registry.npmjs.org:{port}");
    let tarball = format!("/{NPM_NAME}/-/{NPM_NAME}-{NPM_VERSION}.tgz");
    let packument = json!({
        "name": NPM_NAME,
        "dist-tags": {"latest": NPM_VERSION},
        "versions": {NPM_VERSION: {
            "name": NPM_NAME,
            "version": NPM_VERSION,
            "dist": {
                "tarball": format!("{registry}{tarball}"),
                "integrity": built.hashes["integrity"],
                "shasum": built.hashes["shasum"],
            },
        }},
    });
    stub.route(
        &format!("/{NPM_NAME}"),
        "application/json",
        packument.to_string(),
    );
    stub.route(&tarball, "application/octet-stream", built.tgz);
    let p = registry_policy(&ws, &["registry.npmjs.org"], port);

    // npm's proxy comes from the npm_config_proxy mcpbox sets; HOME (and so
    // npm's cache and logs) is in the sandbox's discarded tmp. Audit, fund
    // and update checks would ask other URLs; they are not the subject.
    let script = format!(
        "set -e\ncd /workspace/tmp\n\
         npm install --registry {registry}/ --no-audit --no-fund --no-update-notifier \
         --loglevel=error {NPM_NAME}\n\
         node -p \"require('{NPM_NAME}').hello() + ' ' + require('{NPM_NAME}/package.json').version\"\n"
    );
    let out = exec_sh(&p, &script);
    let stdout = assert_ran(&out, "npm install in the sandbox", &stub);
    assert!(
        stdout.contains(&format!("hello from {NPM_NAME} {NPM_VERSION}")),
        "the installed package did not load: {stdout}"
    );
    // The tarball went through the proxy to the stand-in, nowhere else.
    assert!(
        stub.requests().iter().any(|r| r.contains(&tarball)),
        "{:?}",
        stub.requests()
    );
    let packages = audited_packages(&ws);
    assert!(
        packages.contains(&("npm".into(), NPM_NAME.into(), NPM_VERSION.into())),
        "npm install not recorded by package: {packages:?}"
    );
    let events = audit::events(&ws.path().join("audit.db"));
    let registry_events = audit::network_to(&events, "registry.npmjs.org");
    assert!(
        registry_events.iter().all(|e| e["decision"] == "allow"),
        "{registry_events:?}"
    );
}

/// A PyPI stand-in serving the test wheel, a policy that reaches it, and
/// the script that installs the wheel and imports it.
struct PipRegistry {
    stub: Stub,
    policy: PathBuf,
    script: String,
    wheel_path: String,
}

fn pip_registry(ws: &Workspace) -> PipRegistry {
    let built = build_packages(ws.path());
    let stub = Stub::start();
    let port = stub.port();
    // pypi.org's pages link to its file host, as the real ones do
    let wheel_path = pypi::serve_wheel(
        &stub,
        &built.wheel,
        &format!("http://files.pythonhosted.org:{port}"),
    );
    let policy = registry_policy(ws, &["pypi.org", "files.pythonhosted.org"], port);
    // Debian's /usr/bin/python3 carries pip. Plain HTTP indexes need
    // --trusted-host (pip ignores them otherwise); pip's proxy comes from
    // PIP_PROXY. --target keeps the install in the discarded tmp (and is
    // not refused as an externally managed environment).
    let script = format!(
        "set -e\n\
         python3 -m pip install --disable-pip-version-check --no-cache-dir --no-input -q \
         --index-url http://pypi.org:{port}/simple \
         --trusted-host pypi.org --trusted-host files.pythonhosted.org \
         --target /workspace/tmp/t {PY_NAME}\n\
         PYTHONPATH=/workspace/tmp/t python3 -c \"import {PY_NAME}; print({PY_NAME}.hello())\"\n"
    );
    PipRegistry {
        stub,
        policy,
        script,
        wheel_path,
    }
}

#[test]
fn pip_install_through_the_proxy_is_recorded_by_package_name() {
    let ws = Workspace::new();
    let PipRegistry {
        stub,
        policy: p,
        script,
        wheel_path,
    } = pip_registry(&ws);
    let out = exec_sh(&p, &script);
    let stdout = assert_ran(&out, "pip install in the sandbox", &stub);
    assert!(
        stdout.contains(&format!("hello from {PY_NAME}")),
        "the installed package did not import: {stdout}"
    );
    assert!(
        stub.requests().iter().any(|r| r.contains(&wheel_path)),
        "{:?}",
        stub.requests()
    );
    let packages = audited_packages(&ws);
    assert!(
        packages.contains(&("pypi".into(), PY_NAME.into(), PY_VERSION.into())),
        "pip install not recorded by package: {packages:?}"
    );
    // The index page is a lookup, not a download: audited as a connection
    // to pypi.org, without a package.
    let events = audit::events(&ws.path().join("audit.db"));
    let index_events = audit::network_to(&events, "pypi.org");
    assert!(!index_events.is_empty(), "{events:?}");
    assert!(
        index_events
            .iter()
            .all(|e| e["decision"] == "allow" && e["detail"]["package"].is_null()),
        "{index_events:?}"
    );
}

#[test]
fn npm_tarball_redirected_to_an_unlisted_host_is_refused_and_never_fetched() {
    // A registry answer (compromised or spoofed) that points the tarball at
    // another host: the allowlist is per host, so the download is refused
    // by the proxy and the other host never sees a request.
    let ws = Workspace::new();
    let built = build_packages(ws.path());
    let registry = Stub::start();
    let mirror = Stub::start();
    let tarball = format!("/{NPM_NAME}/-/{NPM_NAME}-{NPM_VERSION}.tgz");
    mirror.route(&tarball, "application/octet-stream", built.tgz);
    let packument = json!({
        "name": NPM_NAME,
        "dist-tags": {"latest": NPM_VERSION},
        "versions": {NPM_VERSION: {
            "name": NPM_NAME,
            "version": NPM_VERSION,
            "dist": {
                "tarball": format!("http://mirror.test:{}{tarball}", mirror.port()),
                "integrity": built.hashes["integrity"],
            },
        }},
    });
    registry.route(
        &format!("/{NPM_NAME}"),
        "application/json",
        packument.to_string(),
    );
    let p = ws.policy(&format!(
        "[audit]\npath = \"audit.db\"\n[network]\nallow = [\"registry.npmjs.org:{}\"]\n\
         [network.hosts]\n\"registry.npmjs.org\" = \"127.0.0.1\"\n\"mirror.test\" = \"127.0.0.1\"\n",
        registry.port()
    ));
    let script = format!(
        "cd /workspace/tmp\n\
         npm install --registry http://registry.npmjs.org:{}/ --no-audit --no-fund \
         --no-update-notifier --fetch-retries=0 --loglevel=error {NPM_NAME}\n\
         echo npm-exit=$?\n\
         test -e node_modules/{NPM_NAME} && echo installed || echo absent\n",
        registry.port()
    );
    let out = exec_sh(&p, &script);
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        !stdout.contains("npm-exit=0") && stdout.contains("absent"),
        "npm installed from an unlisted host:\n{stdout}\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(
        mirror.requests().is_empty(),
        "the unlisted host was reached: {:?}",
        mirror.requests()
    );
    let events = audit::events(&ws.path().join("audit.db"));
    let to_mirror = audit::network_to(&events, "mirror.test");
    assert!(
        !to_mirror.is_empty()
            && to_mirror
                .iter()
                .all(|e| e["decision"] == "deny" && e["reason"] == "network.unlisted"),
        "{events:#?}"
    );
    assert!(
        audited_packages(&ws).is_empty(),
        "a refused download recorded as installed: {:?}",
        audited_packages(&ws)
    );
}

#[test]
fn a_package_installed_during_a_tool_call_is_tied_to_that_call_and_its_caller() {
    // the built-in sandbox server runs pip for a tool call: the download's
    // network record must name that call (the same reference as the call's
    // own record) and the host that asked for it
    let ws = Workspace::new();
    let reg = pip_registry(&ws);
    let state = ws.path().join("state");
    let args: Vec<String> = ["run", "--builtin", "sandbox", "--policy"]
        .iter()
        .map(|s| s.to_string())
        .chain([reg.policy.display().to_string()])
        .collect();
    let mut s =
        common::mcp::Session::start_mcpbox(&args, &[("MCPBOX_STATE_DIR", state.to_str().unwrap())]);
    s.request(
        "initialize",
        json!({"protocolVersion": "2025-11-25", "capabilities": {},
               "clientInfo": {"name": "pkg-agent", "version": "1.2"}}),
    );
    s.send(&json!({"jsonrpc": "2.0", "method": "notifications/initialized"}));
    let r = s.call("exec", json!({"command": reg.script}));
    let text = common::mcp::result_text(&r);
    assert!(
        text.contains(&format!("hello from {PY_NAME}")),
        "{r}\nregistry saw: {:?}",
        reg.stub.requests()
    );
    let (status, stderr) = s.finish();
    assert!(status.success(), "{stderr}");

    let events = audit::events(&ws.path().join("audit.db"));
    let call = events
        .iter()
        .find(|e| e["kind"] == "tool_call" && e["tool"] == "exec")
        .unwrap_or_else(|| panic!("no exec call: {events:#?}"));
    assert_eq!(call["exit_status"], json!(0), "{call}");
    assert_eq!(call["caller"], json!("stdio:pkg-agent/1.2"), "{call}");
    let reference = call["detail"]["call"].as_str().expect("a call reference");
    let download = events
        .iter()
        .find(|e| e["kind"] == "network" && e["detail"]["package"]["name"] == PY_NAME)
        .unwrap_or_else(|| panic!("no package download: {events:#?}"));
    assert_eq!(download["detail"]["package"]["version"], json!(PY_VERSION));
    assert_eq!(
        download["detail"]["calls"],
        json!([{"call": reference, "tool": "exec"}]),
        "{download}"
    );
    assert_eq!(
        download["caller"],
        json!("stdio:pkg-agent/1.2"),
        "{download}"
    );
    // the index lookup belongs to the same call
    for lookup in audit::network_to(&events, "pypi.org") {
        assert_eq!(
            lookup["detail"]["calls"][0]["call"],
            json!(reference),
            "{lookup}"
        );
    }
}
