//! The two isolation tiers (`[sandbox] isolation`, docs/isolation.md)
//! against one table of escape cases, each run through the real binary
//! (`mcpbox exec` with the probe inside) under the namespaces tier and
//! under gVisor; one kernel-facing difference seen from the host; a real
//! server (server-filesystem, npm) under gVisor through `mcpbox run`,
//! driven by the Python SDK.
//!
//! The gVisor tier needs runsc and root. Where runsc is missing the gVisor
//! tests fail under CI (`CI=true`, as `.ci/run` sets it) and say why; a
//! developer's machine without it skips them with a line on stderr. As an
//! ordinary user they check that mcpbox refuses the tier with the reason.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use crate::common;

use std::net::TcpListener;
use std::path::PathBuf;
use std::process::{Command, Output, Stdio};

use common::{is_root, mcpbox, Workspace};

/// One tier: the policy lines that choose it.
#[derive(Clone, Copy)]
struct Tier {
    name: &'static str,
    sandbox: &'static str,
}

const NAMESPACES: Tier = Tier {
    name: "namespaces",
    sandbox: "[sandbox]\nisolation = \"namespaces\"\n",
};
const GVISOR: Tier = Tier {
    name: "gvisor",
    sandbox: "[sandbox]\nisolation = \"gvisor\"\n",
};

/// Whether runsc is installed (as mcpbox finds it); when not, a CI run
/// fails here and a local run is told the gVisor tests did not run.
pub(crate) fn runsc_or_skip(test: &str) -> bool {
    let found = std::env::var_os("MCPBOX_RUNSC")
        .map(PathBuf::from)
        .into_iter()
        .chain(["/usr/bin/runsc".into(), "/usr/local/bin/runsc".into()])
        .any(|p| p.exists());
    if found {
        return true;
    }
    let ci = std::env::var("CI").is_ok_and(|v| v == "true" || v == "1");
    assert!(
        !ci,
        "{test}: runsc (gVisor) is not installed, so the gVisor tier's tests cannot run: \
         scripts/install-test-deps.sh installs it (apt runsc)"
    );
    eprintln!("{test}: SKIPPED, runsc (gVisor) is not installed here");
    false
}

/// Runs the probe under `tier` with `extra` policy lines (after the
/// tier's `[sandbox]`), `env` added to mcpbox's environment.
fn probe(ws: &Workspace, tier: Tier, extra: &str, args: &[&str], env: &[(&str, &str)]) -> Output {
    let p = ws.policy(&format!("{}{extra}", tier.sandbox));
    let mut cmd = Command::new(mcpbox());
    cmd.arg("exec")
        .arg("--policy")
        .arg(&p)
        .arg("--")
        .arg("/workspace/input/probe")
        .args(args)
        .env("MCPBOX_STATE_DIR", ws.path().join("state"))
        .stdin(Stdio::null());
    for (k, v) in env {
        cmd.env(k, v);
    }
    cmd.output().expect("run mcpbox")
}

fn stdout(o: &Output) -> String {
    String::from_utf8_lossy(&o.stdout).trim().to_string()
}

fn explain(o: &Output) -> String {
    format!(
        "status {:?}\nstdout: {}\nstderr: {}",
        o.status,
        String::from_utf8_lossy(&o.stdout),
        String::from_utf8_lossy(&o.stderr)
    )
}

/// The probe ran (exit 0) and answered `err ...`: the attempt was refused.
fn refused(o: &Output) -> Result<(), String> {
    let line = stdout(o);
    if o.status.code() == Some(0) && line.starts_with("err ") {
        Ok(())
    } else {
        Err(format!("expected a refusal:\n{}", explain(o)))
    }
}

type Case = fn(&Workspace, Tier) -> Result<(), String>;

/// Inside the sandbox, with the port of the allowed upstream as argv[1].
const EGRESS_SCRIPT: &str = r#"
import platform, sys, urllib.request
port = sys.argv[1]
direct = urllib.request.build_opener(urllib.request.ProxyHandler({}))
print("proxy", urllib.request.urlopen("http://dev.test:%s/" % port, timeout=10).read().decode())
print("capture", direct.open("http://dev.test:%s/" % port, timeout=10).read().decode())
for label, url in [("unlisted", "http://other.test/"), ("literal", "http://10.1.2.3/"),
                   ("other-port", "http://dev.test:1/")]:
    try:
        direct.open(url, timeout=10)
        print(label, "REACHED")
    except Exception:
        print(label, "refused")
print("kernel", platform.release())
"#;

/// The escape cases both tiers must hold, by the attack they try.
const CASES: &[(&str, Case)] = &[
    (
        "a_server_cannot_read_a_host_file_outside_its_mounts",
        |ws, t| {
            let secret = ws.path().join("host-secret.txt");
            std::fs::write(&secret, "top secret").unwrap();
            for path in [secret.to_str().unwrap(), "/etc/shadow", "/root/.bashrc"] {
                let o = probe(ws, t, "", &["read", path], &[]);
                refused(&o).map_err(|e| format!("{path}: {e}"))?;
                if stdout(&o).contains("top secret") {
                    return Err(format!("{path} was read"));
                }
            }
            // the control: what it is given, it reads
            let o = probe(ws, t, "", &["read", "/workspace/input/hello.txt"], &[]);
            if !stdout(&o).contains("hello from the host") {
                return Err(format!("the input is not readable:\n{}", explain(&o)));
            }
            Ok(())
        },
    ),
    ("a_server_cannot_write_a_read_only_mount", |ws, t| {
        for path in [
            "/workspace/input/evil.txt",
            "/usr/evil.txt",
            "/etc/evil.txt",
        ] {
            refused(&probe(ws, t, "", &["write", path], &[]))
                .map_err(|e| format!("{path}: {e}"))?;
        }
        if ws.input().join("evil.txt").exists() || std::path::Path::new("/usr/evil.txt").exists() {
            return Err("a file appeared on the host".into());
        }
        // the control: the output is writable, and the host sees the file
        let o = probe(ws, t, "", &["write", "/workspace/output/fine.txt"], &[]);
        if !stdout(&o).starts_with("ok") || !ws.output().join("fine.txt").exists() {
            return Err(format!("the output is not writable:\n{}", explain(&o)));
        }
        Ok(())
    }),
    ("a_server_cannot_see_host_processes", |ws, t| {
        let o = probe(ws, t, "", &["pids"], &[]);
        let line = stdout(&o);
        let pids: Vec<&str> = line
            .strip_prefix("ok ")
            .unwrap_or("")
            .split(',')
            .filter(|p| !p.is_empty())
            .collect();
        // itself, and the tier's init: a handful, never the host's
        if pids.is_empty() || pids.len() > 4 {
            return Err(format!("sees {} processes:\n{}", pids.len(), explain(&o)));
        }
        let mine = std::process::id().to_string();
        if pids.contains(&mine.as_str()) && std::process::id() > 4 {
            return Err("sees the test's own pid".into());
        }
        Ok(())
    }),
    ("a_server_cannot_reach_the_network_directly", |ws, t| {
        // a listener on the host's loopback: the sandbox's loopback is its own
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        listener.set_nonblocking(true).unwrap();
        let addr = listener.local_addr().unwrap().to_string();
        refused(&probe(ws, t, "", &["connect", &addr], &[]))?;
        refused(&probe(ws, t, "", &["connect", "192.0.2.1:80"], &[]))?;
        if listener.accept().is_ok() {
            return Err("the host's listener was reached".into());
        }
        Ok(())
    }),
    (
        "a_server_reaches_the_allowed_host_and_nothing_else",
        |ws, t| {
            // With egress, both tiers go through the same capture, resolver
            // and proxy (under gVisor: runsc's sockets in a network
            // namespace that holds them): by the proxy variable and without
            // it, the allowed host answers; an unlisted name, a literal
            // address and another port of the allowed host do not.
            let port = crate::egress::upstream("hello through mcpbox");
            let p = ws.policy(&format!(
                "{}[audit]\npath = \"audit.db\"\n[network]\nallow = [\"dev.test:{port}\"]\n\
                 [network.hosts]\n\"dev.test\" = \"127.0.0.1\"\n",
                t.sandbox
            ));
            let o = Command::new(mcpbox())
                .args(["exec", "--policy", p.to_str().unwrap(), "--"])
                .args(["/usr/bin/python3", "-c", EGRESS_SCRIPT, &port.to_string()])
                .env("MCPBOX_STATE_DIR", ws.path().join("state"))
                .stdin(Stdio::null())
                .output()
                .expect("run mcpbox");
            if t.name == "gvisor" && !is_root() {
                // rootless runsc cannot enter the egress namespace: refused
                // before anything runs, with the reason
                let err = String::from_utf8_lossy(&o.stderr);
                if !o.status.success() && err.contains("needs mcpbox to run as root") {
                    return Ok(());
                }
                return Err(format!("rootless egress not refused:\n{}", explain(&o)));
            }
            let out = stdout(&o);
            for want in [
                "proxy hello through mcpbox",
                "capture hello through mcpbox",
                "unlisted refused",
                "literal refused",
                "other-port refused",
            ] {
                if !out.lines().any(|l| l == want) {
                    return Err(format!("no {want:?}:\n{}", explain(&o)));
                }
            }
            // Which kernel answered: gVisor's own under gVisor.
            let host = std::fs::read_to_string("/proc/sys/kernel/osrelease").unwrap();
            let inside = out
                .lines()
                .find_map(|l| l.strip_prefix("kernel "))
                .unwrap_or("");
            if (inside == host.trim()) != (t.name == "namespaces") {
                return Err(format!(
                    "kernel {inside:?} under {}, the host's {host:?}",
                    t.name
                ));
            }
            // The refusals are the proxy's, recorded.
            let events = common::audit::events(&ws.path().join("audit.db"));
            let denied = |host: &str| {
                events.iter().any(|e| {
                    e["kind"] == "network" && e["detail"]["host"] == host && e["decision"] == "deny"
                })
            };
            for host in ["other.test", "10.1.2.3", "dev.test"] {
                if !denied(host) {
                    return Err(format!("no refusal of {host} in the audit: {events:#?}"));
                }
            }
            Ok(())
        },
    ),
    ("a_server_cannot_read_another_secret", |ws, t| {
        let extra = "[secrets]\nMINE = { from_env = \"MCPBOX_ISO_MINE\" }\n";
        let o = probe(
            ws,
            t,
            extra,
            &["env"],
            &[
                ("MCPBOX_ISO_MINE", "given-7c1f"),
                ("MCPBOX_ISO_OTHER", "not-given-93ab"),
            ],
        );
        let line = stdout(&o);
        if !line.contains("MINE=given-7c1f") {
            return Err(format!("its own secret is missing:\n{}", explain(&o)));
        }
        if line.contains("not-given-93ab") || line.contains("MCPBOX_ISO_OTHER") {
            return Err(format!("another secret reached it:\n{}", explain(&o)));
        }
        Ok(())
    }),
    ("a_server_cannot_exceed_the_pids_limit", |ws, t| {
        let o = probe(ws, t, "[process]\npids = 32\n", &["fork", "1000"], &[]);
        if stdout(&o).contains("ok forked 1000") {
            return Err(format!("1000 processes under pids = 32:\n{}", explain(&o)));
        }
        // the control: a few fit
        let o = probe(ws, t, "[process]\npids = 32\n", &["fork", "8"], &[]);
        if !stdout(&o).contains("ok forked 8") {
            return Err(format!(
                "8 processes under pids = 32 failed:\n{}",
                explain(&o)
            ));
        }
        Ok(())
    }),
    ("a_server_cannot_exceed_the_memory_limit", |ws, t| {
        // Rootless without a delegated cgroup (this machine's v1 memory
        // controller) the limit is an rlimit, which the policy must accept
        // (exec_attacks.rs's memory test does the same).
        // (`extra` follows the tier's `[sandbox]` table, so a first line
        // without a header belongs to it.)
        let limit = if is_root() {
            "[process]\nmemory = \"128MiB\"\n"
        } else {
            "dangerously_allow_degraded = true\n[process]\nmemory = \"128MiB\"\n"
        };
        let o = probe(ws, t, limit, &["alloc", "1024"], &[]);
        if stdout(&o).contains("ok allocated 1024") {
            return Err(format!("1 GiB under memory = 128MiB:\n{}", explain(&o)));
        }
        let o = probe(ws, t, limit, &["alloc", "8"], &[]);
        if !stdout(&o).contains("ok allocated 8") {
            return Err(format!(
                "8 MiB under memory = 128MiB failed:\n{}",
                explain(&o)
            ));
        }
        Ok(())
    }),
];

/// Every case under `tier`; every failure reported, not only the first.
fn escape_cases_hold(tier: Tier) {
    let mut failed = Vec::new();
    for (name, case) in CASES {
        let ws = Workspace::new();
        if let Err(e) = case(&ws, tier) {
            failed.push(format!("{name} under {}: {e}", tier.name));
        }
    }
    assert!(failed.is_empty(), "{}", failed.join("\n\n"));
}

#[test]
fn escape_cases_hold_under_the_namespaces_tier() {
    escape_cases_hold(NAMESPACES);
}

#[test]
fn escape_cases_hold_under_the_gvisor_tier() {
    if !runsc_or_skip("escape_cases_hold_under_the_gvisor_tier") {
        return;
    }
    // rootless too: runsc --rootless --ignore-cgroups
    escape_cases_hold(GVISOR);
}

/// The kernel-facing difference, seen from the host: under the namespaces
/// tier the server is a process of the host's kernel (its argv in the
/// host's /proc); under gVisor no host process runs the server's program
/// at all: gVisor's kernel runs it in its own address spaces, and the
/// host sees only runsc's processes.
#[test]
fn under_gvisor_the_servers_program_is_no_host_process() {
    if !runsc_or_skip("under_gvisor_the_servers_program_is_no_host_process") || !is_root() {
        return;
    }
    for (tier, on_host) in [(NAMESPACES, true), (GVISOR, false)] {
        let ws = Workspace::new();
        let p = ws.policy(tier.sandbox);
        let marker = format!("{}", 7000 + std::process::id() % 1000);
        let mut child = Command::new(mcpbox())
            .arg("exec")
            .arg("--policy")
            .arg(&p)
            .arg("--")
            .args(["/workspace/input/probe", "sleep", &marker])
            .env("MCPBOX_STATE_DIR", ws.path().join("state"))
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap();
        // the server is running once the host sees it (namespaces) or once
        // gVisor's sandbox process has started its first address space
        let wanted = format!("/workspace/input/probe\0sleep\0{marker}\0");
        let mut seen = false;
        let mut gvisor_up = false;
        for _ in 0..200 {
            for entry in std::fs::read_dir("/proc").unwrap().flatten() {
                let cmdline = std::fs::read(entry.path().join("cmdline")).unwrap_or_default();
                let text = String::from_utf8_lossy(&cmdline);
                if text == wanted {
                    seen = true;
                }
                if text.starts_with("runsc-sandbox")
                    && text.contains(&ws.path().join("state").display().to_string())
                {
                    gvisor_up = true;
                }
            }
            if seen || gvisor_up {
                break;
            }
            std::thread::sleep(std::time::Duration::from_millis(50));
        }
        // gVisor's server runs a moment after its sandbox process starts:
        // look a while longer for a host process with its argv
        if gvisor_up {
            for _ in 0..20 {
                for entry in std::fs::read_dir("/proc").unwrap().flatten() {
                    let cmdline = std::fs::read(entry.path().join("cmdline")).unwrap_or_default();
                    if String::from_utf8_lossy(&cmdline) == wanted {
                        seen = true;
                    }
                }
                std::thread::sleep(std::time::Duration::from_millis(50));
            }
        }
        let _ = child.kill();
        let out = child.wait_with_output().unwrap();
        // mcpbox was killed: runsc died with it, its state did not (the
        // next mcpbox on this state directory sweeps it; this one is gone)
        let root = ws.path().join("state/gvisor/runsc");
        if root.exists() {
            let listed = Command::new("runsc")
                .arg("--root")
                .arg(&root)
                .args(["list", "-quiet"])
                .output()
                .unwrap();
            for id in String::from_utf8_lossy(&listed.stdout).split_whitespace() {
                let _ = Command::new("runsc")
                    .arg("--root")
                    .arg(&root)
                    .args(["delete", "--force", id])
                    .status();
            }
        }
        assert_eq!(
            seen,
            on_host,
            "{}: the server's argv in the host's /proc: {seen}\nstderr: {}",
            tier.name,
            String::from_utf8_lossy(&out.stderr)
        );
        if !on_host {
            assert!(gvisor_up, "gVisor's sandbox process never showed");
        }
    }
}

/// A policy the tier cannot honour is refused at check, with the reason:
/// the exec allowlist (Landlock in the namespaces tier); rootless, egress
/// and a memory limit without sandbox.dangerously_allow_degraded. As root
/// it honours both.
#[test]
fn check_refuses_what_the_gvisor_tier_cannot_enforce() {
    let ws = Workspace::new();
    // (policy lines, the key refused as root, and rootless; None:
    // accepted, as egress is as root)
    for (extra, as_root, rootless) in [
        (
            "[process]\nallow_exec = [\"/usr/bin/true\"]\n",
            Some("process.allow_exec"),
            Some("process.allow_exec"),
        ),
        (
            "[network]\nallow = [\"example.com\"]\n",
            None,
            Some("network"),
        ),
        (
            "[process]\nmemory = \"64MiB\"\n",
            None,
            Some("process.memory"),
        ),
    ] {
        let p = ws.policy(&format!("{}{extra}", GVISOR.sandbox));
        let o = Command::new(mcpbox())
            .arg("check")
            .arg(&p)
            .env("MCPBOX_STATE_DIR", ws.path().join("state"))
            .output()
            .unwrap();
        let err = String::from_utf8_lossy(&o.stderr);
        // rootless: runsc --rootless cannot enter the egress namespace and
        // has no cgroup
        let refused = if is_root() { as_root } else { rootless };
        match refused {
            Some(key) => {
                assert_eq!(o.status.code(), Some(1), "{extra}: {err}");
                assert!(
                    err.contains(key) && err.contains("gVisor"),
                    "{extra}: {err}"
                );
            }
            None => assert_eq!(o.status.code(), Some(0), "{extra}: {err}"),
        }
    }
}

/// As root the gVisor tier's server runs as host uid nobody with no
/// idmapped mount (docs/isolation.md): the peers' tree must be readable by
/// everyone, which a checkout under a private home is not. Says so and
/// answers true when `dir` is not.
fn private_peers(dir: &std::path::Path) -> bool {
    let private = dir.ancestors().find(|d| {
        use std::os::unix::fs::PermissionsExt;
        std::fs::metadata(d).is_ok_and(|m| m.permissions().mode() & 0o001 == 0)
    });
    if let Some(private) = private {
        eprintln!(
            "skipped: {} is not searchable by others, so the gVisor tier's server (uid nobody) cannot use the peers below it",
            private.display()
        );
    }
    private.is_some()
}

/// The `git` scenario's repository at `repo`, owned by uid 65534: the
/// gVisor tier's server as root, with no idmapped mount to make a
/// root-owned one its own.
fn owned_by_nobody_repo(repo: &std::path::Path) {
    common::git_repo(repo);
    let owned = Command::new("chown")
        .args(["-R", "65534:65534"])
        .arg(repo)
        .status()
        .unwrap();
    assert!(owned.success());
}

/// mcp-server-git (PyPI) under gVisor through `mcpbox run`, driven by the
/// Python SDK, on a repository its user (nobody) owns: gVisor has no
/// idmapped mount to make a root-owned one its own, so git would refuse
/// "dubious ownership" there (the namespaces tier's case, interop.rs).
#[test]
fn mcp_server_git_runs_under_gvisor_through_python_sdk() {
    if !runsc_or_skip("mcp_server_git_runs_under_gvisor_through_python_sdk") || !is_root() {
        return;
    }
    use common::peers::{mount_same_path, peers};
    let venv = peers().join("venv");
    if private_peers(&venv) {
        return;
    }
    let ws = Workspace::new();
    let repo = ws.path().join("repo");
    owned_by_nobody_repo(&repo);
    let policy = format!(
        "{}[filesystem]\ninput = \"repo\"\n{}[audit]\npath = \"audit.db\"\n",
        GVISOR.sandbox,
        mount_same_path(&venv)
    );
    let server = vec![
        venv.join("bin/mcp-server-git").display().to_string(),
        "--repository".into(),
        "/workspace/input".into(),
    ];
    crate::interop::drive(
        &ws,
        "git",
        "legacy",
        &policy,
        &server,
        &[("MCPBOX_INTEROP_REPO", "/workspace/input".into())],
    );
}

/// server-filesystem (npm) under gVisor through `mcpbox run`, driven by
/// the Python SDK: reads its workspace, writes its output, is refused
/// outside them, as under the namespaces tier.
#[test]
fn server_filesystem_runs_under_gvisor_through_python_sdk() {
    if !runsc_or_skip("server_filesystem_runs_under_gvisor_through_python_sdk") || !is_root() {
        return;
    }
    use common::peers::{mount_same_path, peers};
    let npm = peers().join("npm");
    if private_peers(&npm) {
        return;
    }
    let ws = Workspace::new();
    let secret = ws.path().join("host-secret.txt");
    std::fs::write(&secret, "top secret").unwrap();
    std::os::unix::fs::symlink(&secret, ws.input().join("escape-link")).unwrap();
    let policy = format!(
        "[filesystem]\ninput = \"input\"\noutput = \"output\"\n{}\n{}[tools]\n\"move_file\" = \"approve\"\n\
         [audit]\npath = \"audit.db\"\n",
        mount_same_path(&npm),
        GVISOR.sandbox
    );
    let p = ws.raw_policy(&policy);
    let out = Command::new(peers().join("venv/bin/python"))
        .arg(
            std::env::var_os("MCPBOX_INTEROP_CLIENT")
                .map(PathBuf::from)
                .unwrap_or_else(|| common::interop_script("client.py")),
        )
        .args(["filesystem", "legacy"])
        .arg(mcpbox())
        .arg(&p)
        .arg("--")
        .arg(peers().join("npm/bin/mcp-server-filesystem"))
        .args(["/workspace/input", "/workspace/output"])
        .env("MCPBOX_STATE_DIR", ws.path().join("state"))
        .env("MCPBOX_INTEROP_HOST_SECRET", &secret)
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success() && stdout.contains("done"),
        "{stdout}\nstderr:\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert_eq!(
        std::fs::read_to_string(ws.output().join("written.txt")).unwrap(),
        "from the server"
    );
    // the tier is recorded: the session ran under gVisor
    let audit = Command::new(mcpbox())
        .args(["audit", "--json", "--db"])
        .arg(ws.path().join("audit.db"))
        .output()
        .unwrap();
    let audit = String::from_utf8_lossy(&audit.stdout);
    assert!(
        audit.contains("gvisor"),
        "the session_start does not name the tier: {audit}"
    );
    // nothing left in runsc's root
    let listed = Command::new("runsc")
        .arg("--root")
        .arg(ws.path().join("state/gvisor/runsc"))
        .args(["list", "-quiet"])
        .output()
        .unwrap();
    assert_eq!(
        String::from_utf8_lossy(&listed.stdout).trim(),
        "",
        "runsc state left"
    );
}

/// A Node MCP server that fetches with Node 20's `fetch` (no proxy
/// support) under gVisor through `mcpbox run`: the tool call reaches the
/// allowed host through the same capture and resolver as the namespaces
/// tier's, an unlisted name is not found, and both are in the audit.
#[test]
fn a_node_mcp_server_using_fetch_reaches_an_allowed_host_under_gvisor() {
    use common::mcp::{result_text, Session};
    if !runsc_or_skip("a_node_mcp_server_using_fetch_reaches_an_allowed_host_under_gvisor")
        || !is_root()
    {
        return;
    }
    let port = crate::egress::upstream("hello from upstream");
    let ws = Workspace::new();
    let p = ws.policy(&format!(
        "{}[audit]\npath = \"audit.db\"\n[network]\nallow = [\"dev.test:{port}\"]\n\
         [network.hosts]\n\"dev.test\" = \"127.0.0.1\"\n",
        GVISOR.sandbox
    ));
    let state = ws.path().join("state");
    let env = [("MCPBOX_STATE_DIR", state.to_str().unwrap())];
    let mut s = Session::start(
        &p,
        &[
            "/usr/bin/node",
            "-e",
            crate::egress_transparent::NODE_SERVER,
        ],
        &env,
    );
    let init = s.initialize();
    assert!(init.get("result").is_some(), "{init}\n{}", s.stderr());
    let get = |s: &mut Session, host: &str| {
        let r = s.call(
            "get",
            serde_json::json!({"url": format!("http://{host}:{port}/x")}),
        );
        result_text(&r).to_string()
    };
    assert_eq!(
        get(&mut s, "dev.test"),
        "200 hello from upstream",
        "{}",
        s.stderr()
    );
    assert_eq!(
        get(&mut s, "other.test"),
        "ERROR ENOTFOUND",
        "{}",
        s.stderr()
    );
    let (status, err) = s.finish();
    assert!(status.success(), "{err}");
    crate::egress_transparent::assert_reached_and_refused(&ws, "dev.test", "other.test");
}

/// `mcpbox exec` with its output going to a file after other output: the
/// sandbox's output is added where the file stands, under both tiers.
/// gVisor writes a file handed to it from its own offset 0, so it used to
/// write over what the file held ("first" was lost); mcpbox now copies
/// gVisor's output through pipes.
#[test]
fn exec_output_into_a_file_is_added_after_what_it_holds_not_over_it() {
    for tier in [NAMESPACES, GVISOR] {
        if tier.name == "gvisor"
            && !runsc_or_skip("exec_output_into_a_file_is_added_after_what_it_holds_not_over_it")
        {
            continue;
        }
        let ws = Workspace::new();
        let p = ws.policy(tier.sandbox);
        let file = ws.path().join("out.txt");
        let script = format!(
            "echo first; '{}' exec --policy '{}' -- /bin/sh -c 'echo second; echo third >&2'",
            mcpbox().display(),
            p.display()
        );
        let status = Command::new("sh")
            .arg("-c")
            .arg(&script)
            .stdout(std::fs::File::create(&file).unwrap())
            .stderr(std::fs::File::create(ws.path().join("err.txt")).unwrap())
            .env("MCPBOX_STATE_DIR", ws.path().join("state"))
            .status()
            .unwrap();
        assert!(status.success(), "{}", tier.name);
        assert_eq!(
            std::fs::read_to_string(&file).unwrap(),
            "first\nsecond\n",
            "{}",
            tier.name
        );
        let err = std::fs::read_to_string(ws.path().join("err.txt")).unwrap();
        assert!(err.ends_with("third\n"), "{}: {err}", tier.name);
    }
}

/// server-filesystem (npm) and mcp-server-git (PyPI) as gVisor servers
/// behind `mcpbox serve`, each driven by the Python SDK over Streamable
/// HTTP: each session's server is a runsc container of the agent's
/// sandbox.
#[test]
fn real_servers_run_under_gvisor_behind_serve_through_python_sdk() {
    if !runsc_or_skip("real_servers_run_under_gvisor_behind_serve_through_python_sdk") || !is_root()
    {
        return;
    }
    use common::peers::{mount_same_path, peers};
    use common::serve::{Gateway, ALICE};
    let (npm, venv) = (peers().join("npm"), peers().join("venv"));
    if private_peers(&npm) || private_peers(&venv) {
        return;
    }
    let dir = tempfile::Builder::new()
        .prefix("mcpbox-gvisor-serve-")
        .tempdir()
        .unwrap();
    {
        use std::os::unix::fs::PermissionsExt;
        std::fs::set_permissions(dir.path(), std::fs::Permissions::from_mode(0o755)).unwrap();
    }
    let repo = dir.path().join("repo");
    owned_by_nobody_repo(&repo);
    let fs_policy = dir.path().join("fs.toml");
    std::fs::write(
        &fs_policy,
        format!(
            "[server]\nname = \"fs\"\n{}{}",
            GVISOR.sandbox,
            mount_same_path(&npm)
        ),
    )
    .unwrap();
    let git_policy = dir.path().join("git.toml");
    std::fs::write(
        &git_policy,
        format!(
            "[server]\nname = \"git\"\n{}{}{}",
            GVISOR.sandbox,
            mount_same_path(&venv),
            mount_same_path(&repo)
        ),
    )
    .unwrap();
    let config = format!(
        "[listen]\naddress = \"127.0.0.1:0\"\n\
         [[clients]]\nname = \"alice\"\ntoken = {{ from_env = \"T_ALICE\" }}\n\
         [[servers]]\nname = \"fs\"\npolicy = \"{}\"\ncommand = [\"{}\", \"/workspace/output\"]\n\
         [[servers]]\nname = \"git\"\npolicy = \"{}\"\ncommand = [\"{}\", \"--repository\", \"{}\"]\n",
        fs_policy.display(),
        npm.join("bin/mcp-server-filesystem").display(),
        git_policy.display(),
        venv.join("bin/mcp-server-git").display(),
        repo.display()
    );
    let gw = Gateway::start_config(dir, &config);
    for (scenario, server) in [("filesystem_serve", "fs"), ("git", "git")] {
        let out = Command::new(peers().join("venv/bin/python"))
            .arg(common::interop_script("client.py"))
            .args([
                scenario,
                "http",
                &gw.url(&format!("/servers/{server}/mcp")),
                ALICE,
            ])
            .env("MCPBOX_INTEROP_REPO", &repo)
            .output()
            .unwrap();
        let stdout = String::from_utf8_lossy(&out.stdout);
        assert!(
            out.status.success() && stdout.contains("done"),
            "{scenario}:\n{stdout}\nstderr:\n{}\ngateway:\n{}",
            String::from_utf8_lossy(&out.stderr),
            gw.stderr()
        );
    }
    // each session's server started under gVisor, as its record says
    let events = gw.audit();
    for server in ["fs", "git"] {
        assert!(
            events
                .iter()
                .any(|e| e["server"] == server
                    && e.to_string().contains("\"sandbox_tier\":\"gvisor\"")),
            "no gVisor start of {server} in {events:#?}"
        );
    }
}
