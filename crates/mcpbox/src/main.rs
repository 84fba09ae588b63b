//! The `mcpbox` binary: parses the command line, loads the policy, and wires
//! the libraries together. It is the only place that prints.
#![forbid(unsafe_code)]

mod audit;
mod check;
mod doctor;
mod egress;
mod preflight;
mod run;
mod state;

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
enum PinAction {
    /// Accept the pending tool list recorded by `mcpbox run`.
    Accept {
        /// The server's policy file.
        #[arg(long, short)]
        policy: PathBuf,
    },
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
    /// Run a stdio MCP server in the sandbox, speaking MCP on our stdin/stdout
    /// through the policy-enforcing relay.
    Run {
        /// Policy file (TOML). Without it, the strictest default applies.
        #[arg(long, short)]
        policy: Option<PathBuf>,
        /// The server command and its arguments.
        #[arg(required = true, trailing_var_arg = true, allow_hyphen_values = true)]
        command: Vec<OsString>,
    },
    /// Accept the current tool definitions of a policy's server after a
    /// change was withheld (a new or changed tool).
    Pin {
        #[command(subcommand)]
        action: PinAction,
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
    /// Query the audit log.
    Audit(audit::Args),
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
        Command::Run { policy, command } => {
            init_logging();
            match run::run(policy, command) {
                Ok(code) => ExitCode::from(code.clamp(0, 255) as u8),
                Err(e) => {
                    eprintln!("mcpbox: {e:#}");
                    ExitCode::from(125)
                }
            }
        }
        Command::Pin {
            action: PinAction::Accept { policy },
        } => pin_accept(&policy),
        Command::Doctor => doctor::run(),
        Command::Audit(args) => audit::run(args),
    }
}

/// Opens the audit log and starts the egress proxy for `spec`.
fn start_egress(
    loaded: &preflight::Loaded,
    spec: &mut mcpbox_sandbox::Spec,
) -> anyhow::Result<egress::Running> {
    let store = state::open_audit(&loaded.policy)?;
    let ids = mcpbox_egress::Ids {
        sandbox_id: state::new_id(),
        workspace_id: state::workspace_id(spec),
        server: loaded.policy.name().to_string(),
    };
    egress::start(&loaded.policy.network, store, ids, spec)
}

fn pin_accept(policy: &std::path::Path) -> ExitCode {
    let loaded = match preflight::load(Some(policy)) {
        Ok(l) => l,
        Err(e) => {
            eprintln!("mcpbox: {e}");
            return ExitCode::from(1);
        }
    };
    let file = run::pin_file(&loaded);
    match mcpbox_gateway::accept_pins(&file) {
        Ok(true) => {
            println!(
                "accepted the pending tool definitions for {}",
                loaded.policy.name()
            );
            ExitCode::SUCCESS
        }
        Ok(false) => {
            println!(
                "nothing pending for {} ({})",
                loaded.policy.name(),
                file.display()
            );
            ExitCode::SUCCESS
        }
        Err(e) => {
            eprintln!("mcpbox: {e}");
            ExitCode::from(1)
        }
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
    let mut spec = match preflight::spec(&loaded, command, mcpbox_sandbox::Stdio::Inherit) {
        Ok(s) => s,
        Err(e) => {
            eprintln!("mcpbox: {e}");
            return 125;
        }
    };
    // Egress, when the policy opens any: the proxy runs on a thread of ours,
    // and every connection is audited. Signals are blocked first so that the
    // proxy thread inherits the mask and they reach the sandbox loop.
    let _proxy = if loaded.policy.network.is_closed() {
        None
    } else {
        if let Err(e) = mcpbox_sandbox::block_forwarded_signals() {
            eprintln!("mcpbox: {e}");
            return 125;
        }
        match start_egress(&loaded, &mut spec) {
            Ok(p) => Some(p),
            Err(e) => {
                eprintln!("mcpbox: egress: {e:#}");
                return 125;
            }
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
