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
