//! The `mcpbox` binary: parses the command line, loads the policy, and wires
//! the libraries together. It is the only place that prints.
#![forbid(unsafe_code)]

mod approvals;
mod arguments;
mod arrows;
mod audit;
mod builtin;
mod check;
mod classify;
mod console;
mod doctor;
mod egress;
mod exec_args;
mod failure;
mod gvisor;
mod init;
mod launch;
mod learn;
mod lifecycle;
mod pins;
mod preflight;
mod run;
mod runtime;
mod sandboxes;
mod serve;
mod state;
mod volume;
mod wrap;

use failure::Failure;

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
    /// The pinned tools of each server under a policy, and what is pending.
    List {
        /// The servers' policy file.
        #[arg(long, short)]
        policy: PathBuf,
    },
    /// What a pending change adds, removes and changes, per server: the
    /// tools, a line diff of each description (terminal escapes stripped)
    /// and the input schema's keys added, removed and changed.
    Diff {
        /// The servers' policy file.
        #[arg(long, short)]
        policy: PathBuf,
    },
    /// Accept withheld changes into the pins (TOOL's, the instructions', or
    /// all), showing the diff; audited.
    Accept {
        /// The servers' policy file.
        #[arg(long, short)]
        policy: PathBuf,
        /// Only this tool's change (of every server under the policy).
        tool: Option<String>,
        /// Only the change of the server's instructions.
        #[arg(long, conflicts_with = "tool")]
        instructions: bool,
    },
    /// Reject withheld changes (TOOL's, the instructions', or all): the pins
    /// stay, the tool stays withheld while the server offers the rejected
    /// definition, and that definition is not proposed again; audited.
    Reject {
        /// The servers' policy file.
        #[arg(long, short)]
        policy: PathBuf,
        /// Only this tool's change (of every server under the policy).
        tool: Option<String>,
        /// Only the change of the server's instructions.
        #[arg(long, conflicts_with = "tool")]
        instructions: bool,
    },
    /// Forget the pins: each server's next tool list is pinned as it comes.
    Reset {
        /// The servers' policy file.
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
        /// Use a preset shipped in mcpbox as the policy (`mcpbox init --list`
        /// names them); its relative paths are relative to the current directory.
        #[arg(long, value_name = "NAME", conflicts_with = "policy")]
        preset: Option<String>,
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
        /// Use a preset shipped in mcpbox as the policy (`mcpbox init --list`
        /// names them); its relative paths are relative to the current directory.
        #[arg(long, value_name = "NAME", conflicts_with = "policy")]
        preset: Option<String>,
        /// Serve the web console on this loopback address (`--console`
        /// alone: 127.0.0.1 on a free port); its URL, with the token, is
        /// printed on stderr (docs/console.md).
        #[arg(long, value_name = "ADDR", num_args = 0..=1, require_equals = true,
              default_missing_value = "127.0.0.1:0")]
        console: Option<std::net::SocketAddr>,
        /// Run a server built into mcpbox instead of a command: `sandbox`
        /// (exec, run_code, files, background jobs, snapshots).
        #[arg(long, value_name = "NAME", conflicts_with = "command")]
        builtin: Option<String>,
        /// The server command and its arguments.
        #[arg(
            required_unless_present = "builtin",
            trailing_var_arg = true,
            allow_hyphen_values = true
        )]
        command: Vec<OsString>,
    },
    /// Run a stdio MCP server as `run` does, observing what it reads,
    /// writes, contacts and lists while the host drives it; when the
    /// session ends, write a least-privilege policy with a comment per rule
    /// saying what was seen, its tool list pinned (docs/learn.md).
    Learn {
        /// Base policy (TOML): its mounts, secrets and limits are what the
        /// server may use while learning; the proposal grants no more, but
        /// for the public hosts it contacted (allowed and recorded while
        /// learning).
        #[arg(long, short)]
        policy: Option<PathBuf>,
        /// Where to write the proposed policy (`-`: stdout, once the session
        /// ended). Default: BASE_STEM.learned.toml beside the base policy,
        /// else learned.toml here.
        #[arg(long, short)]
        output: Option<PathBuf>,
        /// Overwrite the output file if it exists.
        #[arg(long)]
        force: bool,
        /// The server command and its arguments.
        #[arg(required = true, trailing_var_arg = true, allow_hyphen_values = true)]
        command: Vec<OsString>,
    },
    /// Serve MCP over Streamable HTTP to many clients, with a sandbox of its
    /// own for every client session (`/servers/NAME/mcp`).
    Serve {
        /// The gateway's config file (TOML; `mcpbox check` validates it).
        #[arg(long, short)]
        config: PathBuf,
        /// Serve the web console on this loopback address (`--console`
        /// alone: 127.0.0.1 on a free port); its URL, with the token, is
        /// printed on stderr (docs/console.md).
        #[arg(long, value_name = "ADDR", num_args = 0..=1, require_equals = true,
              default_missing_value = "127.0.0.1:0")]
        console: Option<std::net::SocketAddr>,
    },
    /// Review the tool definitions pinned for a policy's servers: list,
    /// diff, accept or reject (a withheld new or changed tool), reset.
    Pin {
        #[command(subcommand)]
        action: PinAction,
    },
    /// Validate policies, or `mcpbox serve` configs and the policies they
    /// name, and print each effective file; runs nothing. Every file is
    /// checked; the exit status is 1 if any failed.
    Check {
        /// Policy files or serve configs (TOML); a file with a top-level
        /// listen, clients or servers key is a serve config; `preset:NAME`
        /// checks a shipped preset.
        #[arg(required_unless_present = "schema", value_name = "FILE")]
        files: Vec<PathBuf>,
        /// Print a JSON Schema instead: of the policy file (`--schema`), or
        /// of the serve config (`--schema serve`).
        #[arg(
            long,
            value_name = "FORMAT",
            num_args = 0..=1,
            default_missing_value = "policy"
        )]
        schema: Option<check::SchemaKind>,
    },
    /// Write a commented starter policy: every section with its safe
    /// default, or a preset (`--preset NAME`) to adapt.
    Init(init::Args),
    /// Report which kernel features work here and how to fix what is missing.
    Doctor,
    /// Query the audit log.
    Audit(audit::Args),
    /// The sandboxes of a running `mcpbox serve`: list, show, pause,
    /// resume, snapshot, restore, destroy (over its control socket).
    Sandboxes {
        #[command(subcommand)]
        action: sandboxes::SandboxAction,
        #[command(flatten)]
        common: sandboxes::Common,
    },
    /// The artifacts of a sandbox: list them, export them (only declared,
    /// checked, regular files leave).
    Artifacts {
        #[command(subcommand)]
        action: sandboxes::ArtifactAction,
        #[command(flatten)]
        common: sandboxes::Common,
    },
    /// Rewrite a host's MCP config (Claude Desktop, Claude Code, Cursor,
    /// VS Code, Codex) so that its stdio servers run under `mcpbox run`,
    /// each with a generated policy; `--undo` restores the original.
    Wrap(wrap::Args),
    /// What waits for a human in every running mcpbox of yours (calls,
    /// results, connections): list, show, approve, deny.
    Approvals(approvals::Args),
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
    // First of all, before the command line, logging or any thread: a
    // process started as the sandbox helper (`mcpbox run` re-executes
    // itself to fork sandboxes from a single-threaded process) becomes it
    // here and never returns.
    mcpbox_sandbox::helper::enter_if_requested(egress::bridge);
    // Inside a sandbox, as the built-in server (`builtin.rs` starts it so).
    let args: Vec<OsString> = std::env::args_os().collect();
    // The supervisor of a command run on the host (host_command.rs in
    // the gateway starts it so): it never returns either.
    if args.len() > 1 && args[1] == mcpbox_gateway::host_command::SUPERVISOR_ARG {
        return ExitCode::from(mcpbox_gateway::host_command::supervisor_main(&args[2..]));
    }
    // Every host command from here on runs under this binary as its
    // supervisor (kept alive however the command detaches: setsid, double
    // fork). /proc/self/exe: this very image, even if the file on disk
    // is replaced while mcpbox runs.
    mcpbox_gateway::host_command::set_supervisor("/proc/self/exe".into());
    // A child classifying one command line (classify.rs starts it so).
    if args.len() == 2 && args[1] == classify::ARG {
        return ExitCode::from(classify::child_main());
    }
    if args.len() == 3 && args[1] == mcpbox_builtin::ARG {
        return ExitCode::from(
            mcpbox_builtin::main(&args[2].to_string_lossy()).clamp(0, 255) as u8,
        );
    }
    // `exec`'s usual shapes are read without clap (exec_args.rs): its
    // start-up is a product figure, measured against bwrap.
    if let Some(exec) = exec_args::parse(&args) {
        return finish(sandboxed(Mode::Exec, exec.policy, exec.command));
    }
    let cli = Cli::parse();
    if let Command::Run {
        console: Some(addr),
        ..
    }
    | Command::Serve {
        console: Some(addr),
        ..
    } = &cli.command
    {
        console::request(*addr);
    }
    match cli.command {
        Command::Exec {
            policy,
            preset,
            command,
        } => finish(sandboxed(Mode::Exec, with_preset(policy, preset), command)),
        Command::Run {
            policy,
            preset,
            builtin: None,
            command,
            ..
        } => finish(sandboxed(Mode::Run, with_preset(policy, preset), command)),
        Command::Run {
            policy,
            preset,
            builtin: Some(name),
            ..
        } => finish(sandboxed(
            Mode::Builtin(name),
            with_preset(policy, preset),
            Vec::new(),
        )),
        Command::Learn {
            policy,
            output,
            force,
            command,
        } => finish(sandboxed(
            Mode::Learn(learn::Options { output, force }),
            policy,
            command,
        )),
        Command::Serve { config, .. } => finish(serve(&config)),
        Command::Check { files, schema } => check::run(&files, schema),
        Command::Init(args) => init::run(&args),
        Command::Pin { .. } | Command::Audit(_) | Command::Wrap(_) if private_state().is_err() => {
            ExitCode::from(1)
        }
        Command::Pin { action } => match action {
            PinAction::List { policy } => pins::run(pins::Op::List, &policy),
            PinAction::Diff { policy } => pins::run(pins::Op::Diff, &policy),
            PinAction::Accept {
                policy,
                tool,
                instructions,
            } => pins::run(
                pins::Op::Accept(pins::pick(tool.as_deref(), instructions)),
                &policy,
            ),
            PinAction::Reject {
                policy,
                tool,
                instructions,
            } => pins::run(
                pins::Op::Reject(pins::pick(tool.as_deref(), instructions)),
                &policy,
            ),
            PinAction::Reset { policy } => pins::run(pins::Op::Reset, &policy),
        },
        Command::Doctor => doctor::run(),
        Command::Audit(args) => audit::run(args),
        Command::Sandboxes { action, common } => sandboxes::sandboxes(action, &common),
        Command::Artifacts { action, common } => sandboxes::artifacts(action, &common),
        Command::Wrap(args) => wrap::run(args),
        Command::Approvals(args) => approvals::run(args),
    }
}

/// [`state::ensure_private`] for the commands that read or write the
/// state directory without starting a sandbox, the failure printed.
fn private_state() -> Result<(), ()> {
    state::ensure_private().map(drop).map_err(|e| {
        eprintln!("mcpbox: {e:#}");
    })
}

/// `--preset NAME` is the policy `preset:NAME` (clap keeps it apart from
/// `--policy`); `preflight::load` resolves it.
fn with_preset(policy: Option<PathBuf>, preset: Option<String>) -> Option<PathBuf> {
    match preset {
        Some(name) => Some(PathBuf::from(format!(
            "{}{name}",
            mcpbox_policy::preset::PREFIX
        ))),
        None => policy,
    }
}

/// The two commands that start a sandbox.
#[derive(Debug, Clone, PartialEq, Eq)]
enum Mode {
    Exec,
    Run,
    /// `run --builtin NAME`.
    Builtin(String),
    /// `learn`: `run` under an observing variant of the policy.
    Learn(learn::Options),
}

/// The one prepare path of `exec` and `run`: signals, logging, the policy
/// and its host checks, the sandbox spec; then each its own way.
fn sandboxed(mode: Mode, policy: Option<PathBuf>, command: Vec<OsString>) -> Result<i32, Failure> {
    // Before any thread exists (clap starts none), so that every thread
    // inherits the mask and the forwarded signals reach the one place that
    // waits for them: exec's wait loop, or run's signal thread. The only
    // place mcpbox blocks them.
    mcpbox_sandbox::block_forwarded_signals()?;
    init_logging();
    let stdio = match mode {
        Mode::Exec => mcpbox_sandbox::Stdio::Inherit,
        Mode::Run | Mode::Builtin(_) | Mode::Learn(_) => mcpbox_sandbox::Stdio::Piped,
    };
    if let Mode::Builtin(name) = &mode {
        builtin::check_name(name).map_err(|e| Failure::at("builtin", e))?;
    }
    // before anything is written in it (the audit log, pins, caches)
    state::ensure_private().map_err(|e| Failure::at("state", e))?;
    let mut loaded = preflight::load(policy.as_deref()).map_err(|e| Failure::at("policy", e))?;
    if let Mode::Learn(options) = &mode {
        let learning = learn::prepare(&mut loaded, options).map_err(|e| Failure::at("learn", e))?;
        let mut spec =
            preflight::spec(&loaded, command, stdio).map_err(|e| Failure::at("policy", e))?;
        // the server runs exactly as `run` runs it: its runtime discovered
        runtime_for(&mut loaded, &mut spec, true)?;
        return learning.run(loaded, spec);
    }
    let command = match mode {
        Mode::Builtin(_) => builtin::argv(&loaded.policy).map_err(|e| Failure::at("builtin", e))?,
        _ => command,
    };
    let mut spec =
        preflight::spec(&loaded, command, stdio).map_err(|e| Failure::at("policy", e))?;
    if !matches!(mode, Mode::Builtin(_)) {
        runtime_for(&mut loaded, &mut spec, mode == Mode::Run)?;
    }
    match mode {
        Mode::Exec => exec(&loaded, spec),
        Mode::Run | Mode::Learn(_) => run::run(loaded, spec, false).map_err(Failure::from_run),
        Mode::Builtin(_) => {
            builtin::add_binary(&mut spec).map_err(|e| Failure::at("builtin", e))?;
            run::run(loaded, spec, true).map_err(Failure::from_run)
        }
    }
}

/// Runtime discovery for `exec`, `run` and `learn` (docs/runtime.md,
/// [`runtime::prepare`]), each line of its report on stderr; the record
/// of the mounts kept for `session_start`, and the command as given when
/// it now runs by another path. `asks`: an unlisted registry can be put
/// to the host.
fn runtime_for(
    loaded: &mut preflight::Loaded,
    spec: &mut mcpbox_sandbox::Spec,
    asks: bool,
) -> Result<(), Failure> {
    // the degraded tier has no mount namespace: the command sees the
    // host's paths and nothing can be mounted (asked only of a policy that
    // accepts that tier, before any thread exists)
    let degraded = loaded.policy.sandbox.dangerously_allow_degraded
        && !mcpbox_sandbox::doctor::user_namespaces_work();
    let discover = loaded.policy.runtime.discover && !degraded;
    let given = spec.argv.clone();
    let path = std::env::var_os("PATH").unwrap_or_default();
    let done = runtime::prepare(&loaded.policy, spec, asks, discover, true, &path)
        .map_err(|e| Failure::at("runtime", e))?;
    for line in &done.lines {
        eprintln!("mcpbox: runtime: {line}");
    }
    loaded.runtime = done.audit;
    loaded.argv = (given != spec.argv).then_some(given);
    Ok(())
}

/// `mcpbox serve`: signals blocked before any thread, as for `run`.
fn serve(config: &std::path::Path) -> Result<i32, Failure> {
    mcpbox_sandbox::block_forwarded_signals()?;
    init_logging();
    state::ensure_private().map_err(|e| Failure::at("state", e))?;
    serve::run(config).map_err(Failure::from_run)
}

/// Prints a failure and turns the code into the process's exit status.
fn finish(result: Result<i32, Failure>) -> ExitCode {
    // a host command still running (a notifier, a revoke) ends with us:
    // its whole process group (host_command.rs)
    mcpbox_gateway::host_command::kill_running();
    let code = match result {
        Ok(code) => code,
        Err(f) => {
            eprintln!("mcpbox: {f}");
            f.code
        }
    };
    ExitCode::from(code.clamp(0, 255) as u8)
}

/// Opens the audit log and binds the egress proxy for `spec`; its thread
/// starts later ([`egress::Bound::serve`]).
fn bind_egress(
    loaded: &preflight::Loaded,
    spec: &mut mcpbox_sandbox::Spec,
    secrets: &mcpbox_gateway::Secrets,
) -> anyhow::Result<egress::Bound> {
    let store = state::open_audit(&loaded.policy)?;
    let ids = mcpbox_egress::Ids {
        sandbox_id: state::new_id(),
        workspace_id: state::workspace_id(spec),
        server: loaded.policy.name().to_string(),
    };
    egress::bind(loaded, store, ids, spec, secrets)
}

/// `mcpbox exec`: this process is the sandbox's supervisor. It is
/// single-threaded when it forks (mcpbox_sandbox::spawn checks): with
/// egress, the proxy's socket is bound first and its thread started only
/// after the fork; connections made meanwhile wait in the backlog.
fn exec(loaded: &preflight::Loaded, mut spec: mcpbox_sandbox::Spec) -> Result<i32, Failure> {
    // `[secrets]` as `run` injects them, with the same refusal when a
    // source is missing (they were silently left out; exec has no relay,
    // so the command's output is not redacted: it is the caller's own)
    let secrets =
        run::secrets(loaded, run::SecretsFor::Sandbox).map_err(|e| Failure::at("secrets", e))?;
    for (name, inside) in secrets.env() {
        let key = std::ffi::OsString::from(name);
        spec.env.retain(|(name, _)| *name != key);
        spec.env.push((key, inside.into()));
    }
    let bound = if loaded.policy.network.is_closed() {
        None
    } else {
        Some(bind_egress(loaded, &mut spec, &secrets).map_err(|e| Failure::at("egress", e))?)
    };
    if loaded.policy.sandbox.isolation == mcpbox_policy::Isolation::Gvisor {
        return exec_gvisor(&spec, bound);
    }
    let mut sb = mcpbox_sandbox::spawn(&spec)?;
    for n in &sb.notes {
        eprintln!("mcpbox: warning: {n}");
    }
    let _proxy = match bound {
        Some(b) => Some(b.serve().map_err(|e| Failure::at("egress", e))?),
        None => None,
    };
    let status = sb.wait_forwarding_signals()?;
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
    Ok(status.code())
}

/// `mcpbox exec` under gVisor: runsc runs the sandbox with mcpbox's stdio
/// (preflight refused what this tier cannot do); with egress, the proxy
/// bound before serves once the sandbox and its network holder exist. Ctrl-C
/// reaches runsc in the terminal's process group, and its death ends the
/// sandbox; `process.timeout` kills it here.
fn exec_gvisor(spec: &mcpbox_sandbox::Spec, bound: Option<egress::Bound>) -> Result<i32, Failure> {
    let runsc = gvisor::usable().map_err(|e| Failure::at("gvisor", anyhow::anyhow!(e)))?;
    let mut started = gvisor::start(&runsc, spec, gvisor::StdioOf::Inherit, None, None)
        .map_err(|e| Failure::at("gvisor", e))?;
    // its output, copied to ours as it comes (gvisor::StdioOf::Inherit)
    let copy = |from: Option<Box<dyn std::io::Read + Send>>,
                to: fn() -> Box<dyn std::io::Write>| {
        from.map(|mut from| {
            std::thread::spawn(move || {
                let mut to = to();
                let _ = std::io::copy(&mut from, &mut to);
                let _ = to.flush();
            })
        })
    };
    let copies = [
        copy(
            started
                .child
                .stdout
                .take()
                .map(|o| Box::new(o) as Box<dyn std::io::Read + Send>),
            || Box::new(std::io::stdout()),
        ),
        copy(
            started
                .child
                .stderr
                .take()
                .map(|o| Box::new(o) as Box<dyn std::io::Read + Send>),
            || Box::new(std::io::stderr()),
        ),
    ];
    let _proxy = match bound {
        Some(b) => Some(b.serve().map_err(|e| Failure::at("egress", e))?),
        None => None,
    };
    let info = started
        .wait_deadline(spec.limits.timeout)
        .map_err(|e| Failure::at("gvisor", e))?;
    for c in copies.into_iter().flatten() {
        let _ = c.join();
    }
    if info.code == Some(124) && spec.limits.timeout.is_some() {
        eprintln!(
            "mcpbox: process.timeout of {} reached; the sandbox was killed",
            spec.limits
                .timeout
                .map(mcpbox_policy::format_duration)
                .unwrap_or_default()
        );
    }
    Ok(info.status())
}
