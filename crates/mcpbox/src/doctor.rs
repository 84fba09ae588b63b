//! `mcpbox doctor`: print what the kernel offers and what it means.

use std::process::ExitCode;

use mcpbox_sandbox::doctor::{self, Level};

pub fn run() -> ExitCode {
    let checks = doctor::run();
    let who = if crate::preflight::is_root() {
        "root"
    } else {
        "an ordinary user"
    };
    println!("mcpbox doctor (running as {who})\n");
    let mut full = true;
    for c in &checks {
        let mark = match c.level {
            Level::Ok => "ok  ",
            Level::Warn => "warn",
            Level::Fail => {
                full = false;
                "FAIL"
            }
        };
        println!("[{mark}] {:<16} {}", c.name, c.detail);
        println!("       {:<16} {}", "", c.advice);
    }
    print_gvisor();
    println!();
    print_state();
    println!();
    if full {
        println!("the full sandbox is available");
        ExitCode::SUCCESS
    } else {
        println!("the full sandbox is NOT available: see the FAIL lines above");
        ExitCode::from(1)
    }
}

/// Where state and audit go, and why a host's mcpbox may not agree with
/// this shell's: hosts start servers with an environment of their own.
fn print_state() {
    let set = |k: &str| std::env::var_os(k).is_some_and(|v| !v.is_empty());
    let from = if set("MCPBOX_STATE_DIR") {
        "MCPBOX_STATE_DIR"
    } else if set("XDG_STATE_HOME") {
        "$XDG_STATE_HOME/mcpbox"
    } else if set("HOME") {
        "the default, $HOME/.local/state/mcpbox"
    } else {
        "the default without HOME"
    };
    let dir = crate::state::state_dir();
    println!("state: {} (from {from})", dir.display());
    println!(
        "audit: {}, unless a policy's [audit] path names another",
        dir.join("audit.db").display()
    );
    println!(
        "       a host (Claude Desktop, Claude Code, Cursor, ...) starts mcpbox with an \
         environment of its own, often only PATH and HOME: MCPBOX_STATE_DIR set in a shell \
         does not reach it, and its mcpbox keeps state and audit under that HOME's \
         .local/state/mcpbox; `mcpbox wrap` run with MCPBOX_STATE_DIR set writes it into \
         each entry it rewrites (docs/wrap.md)"
    );
    match crate::volume::bound() {
        crate::volume::Bound::Volume => println!(
            "disk:  the workspaces of `serve` and `run --builtin` are bounded by [filesystem] tmp \
             (an ext4 volume on a loop device each, its space reserved)"
        ),
        crate::volume::Bound::Fuse => println!(
            "disk:  the workspaces of `serve` and `run --builtin` are bounded by [filesystem] tmp \
             (an ext4 image each, its space reserved, mounted by fuse2fs)"
        ),
        crate::volume::Bound::Unbounded(why) => {
            println!(
                "disk:  the workspaces of `serve` and `run --builtin` are NOT bounded, and policies \
                 are refused unless they set sandbox.dangerously_allow_degraded: {why}"
            )
        }
    }
}

/// The gVisor tier (`[sandbox] isolation = "gvisor"`): runsc found, its
/// version, and whether a trivial sandbox starts with `--platform=ptrace`
/// (the platform mcpbox uses: `kvm` needs /dev/kvm and hangs where nested
/// virtualisation is off). Optional: its absence is a warning, and only
/// gVisor policies are refused for it.
fn print_gvisor() {
    let (mark, detail, advice) = match crate::gvisor::probe() {
        Ok(r) => (
            "ok  ",
            format!(
                "{} at {}: --platform=ptrace{} starts a sandbox",
                r.version,
                r.path.display(),
                if r.rootless { " --rootless" } else { "" }
            ),
            if r.rootless {
                "policies may set [sandbox] isolation = \"gvisor\" (exec, run, serve), \
                 rootless here: no [network] egress (it needs root), and process.memory and \
                 cpu only with sandbox.dangerously_allow_degraded (no cgroup: memory becomes \
                 RLIMIT_AS), and no `sandboxes snapshot --memory` (runsc --rootless cannot \
                 restore): docs/isolation.md"
                    .to_string()
            } else {
                "policies may set [sandbox] isolation = \"gvisor\" (exec, run, serve with \
                 pause and resume through runsc, egress through the proxy, `sandboxes \
                 snapshot --memory`): docs/isolation.md"
                    .to_string()
            },
        ),
        Err(why) => (
            "warn",
            why,
            "policies with [sandbox] isolation = \"gvisor\" are refused here; the namespaces \
             tier is unaffected"
                .to_string(),
        ),
    };
    println!("[{mark}] {:<16} {detail}", "gvisor");
    println!("       {:<16} {advice}", "");
    // the other platform, for the record: mcpbox uses ptrace
    if let Ok(r) = crate::gvisor::usable() {
        let kvm = if !std::path::Path::new("/dev/kvm").exists() {
            "no /dev/kvm".to_string()
        } else {
            let kvm = crate::gvisor::Runsc {
                platform: "kvm",
                ..r
            };
            match crate::gvisor::starts(&kvm, std::time::Duration::from_secs(5)) {
                Ok(()) => "starts a sandbox".to_string(),
                Err(why) => why,
            }
        };
        println!(
            "       {:<16} --platform=kvm: {kvm} (mcpbox uses ptrace)",
            ""
        );
    }
}
