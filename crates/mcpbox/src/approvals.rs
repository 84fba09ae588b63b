//! `mcpbox approvals list|show|approve|deny`, and the control socket every
//! `mcpbox run` and `mcpbox serve` listens on for them.
//!
//! Each running mcpbox binds `<runtime>/control/<pid>.sock`
//! (`$XDG_RUNTIME_DIR/mcpbox/control`, else `/tmp/mcpbox-UID/control`;
//! the directory 0700, the socket 0600), speaking the lifecycle's control
//! protocol (`mcpbox_lifecycle::control`: one JSON line each way, the
//! peer's uid and user namespace checked before a byte is read). Its ops
//! `approvals`, `approve` and `deny` reach the process's approval broker
//! (`mcpbox_gateway::broker`). The CLI asks every socket in that
//! directory (or the one `--socket` names) and merges the answers, so one
//! command sees what every mcpbox of the user waits for. A socket nobody
//! answers on (its mcpbox died) is skipped; the next mcpbox with that pid
//! replaces it.

use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::sync::Arc;

use clap::Subcommand;
use mcpbox_gateway::broker::{Broker, Scope};
use mcpbox_lifecycle::control::{self, ClientError, Request};
use mcpbox_lifecycle::render::escape;
use mcpbox_lifecycle::{
    Artifact, Control, Desk, Exported, SandboxInfo, SnapshotInfo, Teardown, NO_SANDBOXES,
};
use serde_json::Value;

/// The directory of every mcpbox's control socket for this user.
pub fn control_dir() -> PathBuf {
    crate::egress::runtime_base().join("control")
}

/// This process's control socket.
fn own_socket() -> PathBuf {
    control_dir().join(format!("{}.sock", std::process::id()))
}

/// The broker as the control socket sees it.
pub struct BrokerDesk(pub Arc<Broker>);

impl Desk for BrokerDesk {
    fn pending(&self) -> Vec<Value> {
        self.0
            .list()
            .into_iter()
            .filter_map(|v| serde_json::to_value(v).ok())
            .collect()
    }

    fn answer(&self, id: &str, approve: bool, session: bool, by: &str) -> Result<Value, String> {
        let scope = if session { Scope::Session } else { Scope::Once };
        let view = self
            .0
            .answer(id, approve, scope, by)
            .map_err(|e| e.to_string())?;
        serde_json::to_value(view).map_err(|e| format!("internal: {e}"))
    }
}

/// `run`'s control: approvals only.
struct RunControl(BrokerDesk);

impl Control for RunControl {
    fn desk(&self) -> Option<&dyn Desk> {
        Some(&self.0)
    }
    fn list(&self) -> Vec<SandboxInfo> {
        Vec::new()
    }
    fn show(&self, _id: &str) -> Result<SandboxInfo, String> {
        Err(NO_SANDBOXES.into())
    }
    fn pause(&self, _id: &str) -> Result<SandboxInfo, String> {
        Err(NO_SANDBOXES.into())
    }
    fn resume(&self, _id: &str) -> Result<SandboxInfo, String> {
        Err(NO_SANDBOXES.into())
    }
    fn snapshot(&self, _: &str, _: &Path, _: bool, _: bool) -> Result<SnapshotInfo, String> {
        Err(NO_SANDBOXES.into())
    }
    fn restore(&self, _: &Path, _: &str, _: &str, _: Option<&str>) -> Result<SandboxInfo, String> {
        Err(NO_SANDBOXES.into())
    }
    fn destroy(
        &self,
        _id: &str,
        _: &mcpbox_lifecycle::artifacts::Approved,
    ) -> Result<Teardown, String> {
        Err(NO_SANDBOXES.into())
    }
    fn artifacts(&self, _id: &str) -> Result<Vec<Artifact>, String> {
        Err(NO_SANDBOXES.into())
    }
    fn export(
        &self,
        _: &str,
        _: &Path,
        _: &mcpbox_lifecycle::artifacts::Approved,
    ) -> Result<Vec<Exported>, String> {
        Err(NO_SANDBOXES.into())
    }
}

/// `run`'s control socket, for its broker. A socket that cannot be bound
/// is a warning, not a failure: elicitation and the console still work,
/// and `refuse` still names the approval.
pub fn listen_run(broker: Arc<Broker>) -> Option<control::Server> {
    listen(Arc::new(RunControl(BrokerDesk(broker))))
}

/// Binds this process's control socket for `control`.
pub fn listen(control: Arc<dyn Control>) -> Option<control::Server> {
    let path = own_socket();
    match control::serve(&path, control) {
        Ok(s) => Some(s),
        Err(e) => {
            tracing::warn!("no control socket for `mcpbox approvals`: {e}");
            None
        }
    }
}

#[derive(Debug, clap::Args)]
pub struct Args {
    #[command(subcommand)]
    action: Action,
    /// Print JSON (`list`: an array with each approval's `id`, `server`,
    /// `tool`, `caller`, `subject`, `preview`, `expires_ms`, ...).
    #[arg(long, global = true)]
    json: bool,
    /// Talk to this control socket only (default: every running mcpbox of
    /// yours, in $XDG_RUNTIME_DIR/mcpbox/control or /tmp/mcpbox-UID/control).
    #[arg(long, global = true, value_name = "PATH", conflicts_with = "pid")]
    socket: Option<PathBuf>,
    /// Talk to the mcpbox with this process id only.
    #[arg(long, global = true, value_name = "PID")]
    pid: Option<u32>,
}

#[derive(Debug, Subcommand)]
enum Action {
    /// What waits for a human: calls, results and connections.
    List,
    /// One approval in detail: the rule that asked, the preview.
    Show { id: String },
    /// Let it go ahead: this one call (or result, or connection), or with
    /// --session the tool (or host) for the rest of its session.
    Approve {
        id: String,
        /// Allow the tool (or host and port) for the rest of the session.
        #[arg(long)]
        session: bool,
    },
    /// Refuse it.
    Deny { id: String },
}

/// The sockets to ask.
fn sockets(args: &Args) -> Vec<PathBuf> {
    if let Some(s) = &args.socket {
        return vec![s.clone()];
    }
    if let Some(pid) = args.pid {
        return vec![control_dir().join(format!("{pid}.sock"))];
    }
    let dir = control_dir();
    let Ok(entries) = std::fs::read_dir(&dir) else {
        return Vec::new();
    };
    let mut out: Vec<PathBuf> = entries
        .filter_map(Result::ok)
        .map(|e| e.path())
        .filter(|p| p.extension().is_some_and(|x| x == "sock"))
        .collect();
    out.sort();
    out
}

/// Every pending approval of every socket, with the socket's path.
fn gather(sockets: &[PathBuf]) -> (Vec<Value>, Vec<String>) {
    let mut all = Vec::new();
    let mut errors = Vec::new();
    for s in sockets {
        match control::call(s, &Request::Approvals {}) {
            Ok(Value::Array(items)) => {
                for mut v in items {
                    if let Some(m) = v.as_object_mut() {
                        m.insert("socket".into(), Value::String(s.display().to_string()));
                    }
                    all.push(v);
                }
            }
            Ok(_) => errors.push(format!("{}: a malformed answer", s.display())),
            // its mcpbox is gone: nothing waits there
            Err(ClientError::NotRunning { .. }) => {}
            Err(e) => errors.push(format!("{}: {e}", s.display())),
        }
    }
    (all, errors)
}

fn text<'a>(v: &'a Value, key: &str) -> std::borrow::Cow<'a, str> {
    escape(v.get(key).and_then(Value::as_str).unwrap_or(""))
}

fn expires_in(v: &Value) -> String {
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as u64);
    let at = v.get("expires_ms").and_then(Value::as_u64).unwrap_or(0);
    format!("{}s", at.saturating_sub(now) / 1000)
}

fn what(v: &Value) -> String {
    let s = &v["subject"];
    match s.get("type").and_then(Value::as_str) {
        Some("network") => format!(
            "connect {}:{}",
            escape(s.get("host").and_then(Value::as_str).unwrap_or("")),
            s.get("port").and_then(Value::as_u64).unwrap_or(0)
        ),
        Some("result") => format!(
            "result {} B",
            s.get("bytes").and_then(Value::as_u64).unwrap_or(0)
        ),
        _ => "call".into(),
    }
}

pub fn run(args: Args) -> ExitCode {
    let sockets = sockets(&args);
    match &args.action {
        Action::List => {
            let (all, errors) = gather(&sockets);
            for e in &errors {
                eprintln!("mcpbox: {}", escape(e));
            }
            if args.json {
                println!("{}", Value::Array(all));
                return ExitCode::SUCCESS;
            }
            if all.is_empty() {
                println!("no approvals waiting ({} mcpbox running)", sockets.len());
                for url in console_urls() {
                    println!("console: {}", escape(&url));
                }
                return ExitCode::SUCCESS;
            }
            println!(
                "{:<15}  {:<12}  {:<20}  {:<14}  {:<22}  {:<8}  {:>7}  RULE",
                "ID", "SERVER", "TOOL", "CALLER", "WHAT", "STATE", "EXPIRES"
            );
            for v in &all {
                println!(
                    "{:<15}  {:<12}  {:<20}  {:<14}  {:<22}  {:<8}  {:>7}  {}",
                    text(v, "id"),
                    text(v, "server"),
                    text(v, "tool"),
                    text(v, "caller"),
                    what(v),
                    text(v, "state"),
                    expires_in(v),
                    text(v, "rule"),
                );
            }
            println!(
                "approve: mcpbox approvals approve ID [--session]   deny: mcpbox approvals deny ID"
            );
            for url in console_urls() {
                println!("console: {}", escape(&url));
            }
            ExitCode::SUCCESS
        }
        Action::Show { id } => {
            let (all, errors) = gather(&sockets);
            let Some(v) = all
                .iter()
                .find(|v| v.get("id").and_then(Value::as_str) == Some(id))
            else {
                for e in &errors {
                    eprintln!("mcpbox: {}", escape(e));
                }
                eprintln!(
                    "mcpbox: no approval {} is waiting (answered, used or expired?); `mcpbox approvals list` shows what is",
                    escape(id)
                );
                return ExitCode::from(1);
            };
            if args.json {
                println!("{v}");
                return ExitCode::SUCCESS;
            }
            println!("approval  {}", text(v, "id"));
            println!(
                "state     {}{}",
                text(v, "state"),
                if v["held"] == Value::Bool(true) {
                    " (the call waits)"
                } else {
                    " (the caller was refused; it retries once approved)"
                }
            );
            println!("server    {}", text(v, "server"));
            println!("tool      {}", text(v, "tool"));
            println!("caller    {}", text(v, "caller"));
            println!("what      {}", what(v));
            println!("rule      {} ({})", text(v, "rule"), text(v, "reason"));
            println!("expires   in {}", expires_in(v));
            println!("digest    {}", text(v, "args_digest"));
            // serde_json escapes control characters in strings: inert
            let preview = serde_json::to_string_pretty(&v["preview"]).unwrap_or_default();
            println!("preview   {}", preview.replace('\n', "\n          "));
            println!(
                "approve:  mcpbox approvals approve {} [--session]",
                text(v, "id")
            );
            ExitCode::SUCCESS
        }
        Action::Approve { id, .. } | Action::Deny { id } => {
            let request = match &args.action {
                Action::Approve { session, .. } => Request::Approve {
                    id: id.clone(),
                    session: *session,
                },
                _ => Request::Deny { id: id.clone() },
            };
            let mut last = None;
            for s in &sockets {
                match control::call(s, &request) {
                    Ok(v) => {
                        if args.json {
                            println!("{v}");
                        } else {
                            let verb = if matches!(request, Request::Deny { .. }) {
                                "denied"
                            } else if v.get("state").and_then(Value::as_str) == Some("approved") {
                                "approved: the caller's retry of the same call passes once"
                            } else {
                                "approved"
                            };
                            println!(
                                "{} {verb} ({} on {})",
                                text(&v, "id"),
                                text(&v, "tool"),
                                text(&v, "server")
                            );
                        }
                        return ExitCode::SUCCESS;
                    }
                    Err(ClientError::NotRunning { .. }) => {}
                    Err(e) => last = Some(e.to_string()),
                }
            }
            match last {
                Some(e) => eprintln!("mcpbox: {e}"),
                None => eprintln!(
                    "mcpbox: no running mcpbox answered on {} (is the server still running?)",
                    control_dir().display()
                ),
            }
            ExitCode::from(1)
        }
    }
}

/// The web consoles of this user's running mcpbox processes, from their
/// `console-PID/console.url` files (0600, in the 0700 runtime directory).
/// Only live ones (issue 32: a console killed with -9 left its file, and
/// its URL was listed for ever): the directory's pid must be a running
/// process started with `--console`; a directory whose pid is gone is
/// removed (it is ours: the runtime directory is private).
fn console_urls() -> Vec<String> {
    let Ok(entries) = std::fs::read_dir(crate::egress::runtime_base()) else {
        return Vec::new();
    };
    let mut urls = Vec::new();
    for e in entries.filter_map(Result::ok) {
        let name = e.file_name();
        let Some(pid) = name
            .to_str()
            .and_then(|n| n.strip_prefix("console-"))
            .and_then(|p| p.parse::<u32>().ok())
        else {
            continue;
        };
        match console_process(pid) {
            Liveness::Gone => {
                let _ = std::fs::remove_dir_all(e.path());
                continue;
            }
            Liveness::Other => continue,
            Liveness::Console => {}
        }
        let Ok(url) = std::fs::read_to_string(e.path().join("console.url")) else {
            continue;
        };
        let url = url.trim();
        if url.starts_with("http://") {
            urls.push(url.to_string());
        }
    }
    urls.sort();
    urls
}

/// What runs under a console directory's pid.
enum Liveness {
    /// No such process.
    Gone,
    /// A process, but not an mcpbox with a console (the pid was reused).
    Other,
    /// A process started with `--console`.
    Console,
}

fn console_process(pid: u32) -> Liveness {
    match std::fs::read(format!("/proc/{pid}/cmdline")) {
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Liveness::Gone,
        Err(_) => Liveness::Other,
        // an exited but unreaped process has an empty command line
        Ok(c) if c.is_empty() => Liveness::Gone,
        Ok(c) if c.split(|b| *b == 0).any(|a| a == b"--console") => Liveness::Console,
        Ok(_) => Liveness::Other,
    }
}

/// Longest text passed to a notify command, in chars.
const NOTIFY_TEXT: usize = 300;
/// How long a notify command may run before it is killed.
const NOTIFY_TIME: std::time::Duration = std::time::Duration::from_secs(10);

/// Text for a notification: control, invisible and bidi characters
/// ([`mcpbox_policy::terminal::is_unsafe`]) dropped (no terminal or
/// markup tricks from a name a host or server chose), `<`, `>` and `&`
/// replaced (some notification daemons read markup), cut to length.
fn notify_text(s: &str) -> String {
    s.chars()
        .filter(|&c| !mcpbox_policy::terminal::is_unsafe(c))
        .map(|c| match c {
            '<' => '‹',
            '>' => '›',
            '&' => '+',
            c => c,
        })
        .take(NOTIFY_TEXT)
        .collect()
}

/// The variables of mcpbox's environment a notifier gets on purpose,
/// besides `PATH`, `HOME` and `LANG` (host_command.rs): what a desktop
/// notification needs to find the user's session bus and display.
pub const NOTIFY_ENV: [&str; 4] = [
    "DBUS_SESSION_BUS_ADDRESS",
    "XDG_RUNTIME_DIR",
    "DISPLAY",
    "WAYLAND_DISPLAY",
];

/// The broker's notifier for `[approvals] notify`: `commands` maps a
/// server's name to its policy's command. Each new approval a human must
/// answer outside the host runs that command (no shell, as this user,
/// outside any sandbox, stdin and stdout closed: stdout is the MCP stream
/// under `run`) with a title and a text as two more arguments, as a
/// [`HostCommand`](mcpbox_gateway::host_command::HostCommand): `PATH`,
/// `HOME`, `LANG` and [`NOTIFY_ENV`] only, its own process group, killed
/// whole after [`NOTIFY_TIME`]. A thread waits for it; how it ended is
/// written to `audit` (an `approval` record, action `notified`).
pub fn notifier(
    commands: std::collections::HashMap<String, Vec<String>>,
    audit: Arc<dyn mcpbox_audit::Sink>,
) -> mcpbox_gateway::broker::Notifier {
    use mcpbox_gateway::broker::Subject;
    use mcpbox_gateway::host_command::HostCommand;
    Box::new(move |v: &mcpbox_gateway::broker::View| {
        let Some(cmd) = commands
            .get(&v.binding.server)
            .and_then(|argv| HostCommand::new(argv, NOTIFY_TIME))
        else {
            return;
        };
        let what = match &v.subject {
            Subject::Network { host, port } => format!("a connection to {host}:{port}"),
            Subject::Result { bytes, .. } => {
                format!("a {bytes}-byte result of tool {}", v.binding.tool)
            }
            Subject::Call { bytes: None } => format!("a call to tool {}", v.binding.tool),
            Subject::Call { bytes: Some(n) } => {
                format!("a call to tool {} ({n} bytes measured)", v.binding.tool)
            }
        };
        let title = notify_text(&format!("mcpbox: approval {}", v.id));
        let text = notify_text(&format!(
            "{what} on server {} (caller {}) waits for you: mcpbox approvals approve {} (or deny)",
            v.binding.server, v.binding.caller, v.id
        ));
        let cmd = cmd.arg(title).arg(text).inherit(&NOTIFY_ENV);
        let audit = audit.clone();
        let (id, server, caller, tool) = (
            v.id.clone(),
            v.binding.server.clone(),
            v.binding.caller.clone(),
            v.binding.tool.clone(),
        );
        let waited = std::thread::Builder::new()
            .name("mcpbox-notify".into())
            .spawn(move || {
                let outcome = match cmd.run() {
                    Ok(out) => out.ended.describe(),
                    Err(e) => format!("failed to start {}: {e}", cmd.program()),
                };
                if outcome != "ok" {
                    tracing::warn!("[approvals] notify: {}: {outcome}", cmd.program());
                }
                audit.record(mcpbox_audit::Event {
                    kind: Some(mcpbox_audit::Kind::Approval),
                    server,
                    caller,
                    tool: Some(tool),
                    detail: serde_json::json!({
                        "action": "notified",
                        "approval": id,
                        "outcome": outcome,
                    }),
                    ..mcpbox_audit::Event::default()
                });
            });
        if let Err(e) = waited {
            tracing::warn!("[approvals] notify: no thread to run it: {e}");
        }
    })
}
