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
    if full {
        println!("the full sandbox is available");
        ExitCode::SUCCESS
    } else {
        println!("the full sandbox is NOT available: see the FAIL lines above");
        ExitCode::from(1)
    }
}
