//! The `mcpbox` binary: parses the command line, loads the policy, and wires
//! the libraries together. It is the only place that prints.
#![forbid(unsafe_code)]

mod check;
mod doctor;
mod preflight;

use std::ffi::OsString;
use std::path::PathBuf;
use std::process::ExitCode;

use clap::{Parser, Subcommand};

/// Run MCP servers in Linux sandboxes behind a policy-enforcing relay.
#[derive(Debug, Parser)]
#[command(name = "mcpbox", version, about, disable_help_subcommand = true)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Debug, Subcommand)]
enum Command {
    /// Run CMD in a fresh sandbox; its exit code passes through (128+N when
    /// killed by signal N, 124 on timeout, 125 when mcpbox itself fails).
    Exec {
        /// Policy file (TOML). Without it, the strictest default applies.
        #[arg(long, short)]
        policy: Option<PathBuf>,
        /// The command and its arguments.
        #[arg(required = true, trailing_var_arg = true, allow_hyphen_values = true)]
        command: Vec<OsString>,
    },
    /// Validate a policy and print the effective policy; runs nothing.
    Check {
        /// Policy file (TOML).
        #[arg(required_unless_present = "schema")]
        file: Option<PathBuf>,
        /// Print the policy file's JSON Schema instead.
        #[arg(long)]
        schema: bool,
    },
    /// Report which kernel features work here and how to fix what is missing.
    Doctor,
}

fn init_logging() {
    let filter = std::env::var("MCPBOX_LOG").unwrap_or_default();
    let level = match filter.as_str() {
        "trace" => tracing::Level::TRACE,
        "debug" => tracing::Level::DEBUG,
        "info" => tracing::Level::INFO,
        "error" => tracing::Level::ERROR,
        _ => tracing::Level::WARN,
    };
    use std::io::IsTerminal;
    tracing_subscriber::fmt()
        .with_ansi(std::io::stderr().is_terminal())
        .with_writer(std::io::stderr)
        .with_max_level(level)
        .with_target(false)
        .init();
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    match cli.command {
        Command::Exec { policy, command } => {
            let code = exec(policy, command);
            ExitCode::from(code.clamp(0, 255) as u8)
        }
        Command::Check { file, schema } => check::run(file.as_deref(), schema),
        Command::Doctor => doctor::run(),
    }
}

fn exec(policy: Option<PathBuf>, command: Vec<OsString>) -> i32 {
    init_logging();
    let loaded = match preflight::load(policy.as_deref()) {
        Ok(l) => l,
        Err(e) => {
            eprintln!("mcpbox: {e}");
            return 125;
        }
    };
    let spec = match preflight::spec(&loaded, command, mcpbox_sandbox::Stdio::Inherit) {
        Ok(s) => s,
        Err(e) => {
            eprintln!("mcpbox: {e}");
            return 125;
        }
    };
    let warn = |notes: &[String]| {
        for n in notes {
            eprintln!("mcpbox: warning: {n}");
        }
    };
    match mcpbox_sandbox::exec(&spec, warn) {
        Ok(status) => {
            match status {
                mcpbox_sandbox::Status::TimedOut => eprintln!(
                    "mcpbox: process.timeout of {} reached; the sandbox was killed",
                    spec.limits.timeout.map(mcpbox_policy::format_duration).unwrap_or_default()
                ),
                mcpbox_sandbox::Status::OutOfMemory(_) => eprintln!(
                    "mcpbox: process.memory limit of {} reached; the kernel killed a process of the sandbox",
                    spec.limits.memory.map(mcpbox_policy::format_size).unwrap_or_default()
                ),
                mcpbox_sandbox::Status::Exited(_) => {}
            }
            status.code()
        }
        Err(e) => {
            eprintln!("mcpbox: {e}");
            e.exit_code()
        }
    }
}
