//! `mcpbox run`: a stdio MCP server in the sandbox, behind the relay.
//!
//! Our stdin/stdout are the MCP stream to the host; everything we log goes
//! to stderr. The relay (crates/gateway) starts the server through
//! [`SandboxLauncher`], again with fresh secrets when a secret's TTL runs out.

use std::ffi::OsString;
use std::path::PathBuf;
use std::sync::atomic::{AtomicI32, Ordering};
use std::sync::Arc;

use anyhow::Context;
use mcpbox_gateway::{
    Config, ExitInfo, Launcher, ProcessControl, Relay, Secret, SecretSource, Secrets,
    ServerProcess, ToolPolicy,
};
use mcpbox_policy::ToolRules;
use mcpbox_policy::{Decision, ToolHints};
use mcpbox_sandbox::{Sandbox, Spec, Status};

use crate::preflight::{self, Loaded};
use crate::state;

/// The policy's `[tools]` rules as the relay sees them: the same decision
/// types, so this only forwards.
struct Tools(ToolRules);

impl ToolPolicy for Tools {
    fn decide(&self, tool: &str, hints: &ToolHints) -> Decision {
        self.0.decide(tool, hints)
    }

    fn visible(&self, tool: &str, hints: &ToolHints) -> bool {
        self.0.visible_in_list(tool, hints)
    }
}

/// Starts the server in a fresh sandbox with the given extra environment.
pub struct SandboxLauncher {
    spec: Spec,
    /// The current sandbox's init pid, for the signal thread.
    current: Arc<AtomicI32>,
}

impl Launcher for SandboxLauncher {
    fn launch(&mut self, env: &[(String, String)]) -> std::io::Result<ServerProcess> {
        let mut spec = self.spec.clone();
        for (k, v) in env {
            let key = OsString::from(k);
            spec.env.retain(|(name, _)| *name != key);
            spec.env.push((key, v.into()));
        }
        let mut sb =
            mcpbox_sandbox::spawn(&spec).map_err(|e| std::io::Error::other(e.to_string()))?;
        for note in &sb.notes {
            tracing::warn!("{note}");
        }
        self.current.store(sb.init_pid(), Ordering::SeqCst);
        let (Some(stdin), Some(stdout), Some(stderr)) =
            (sb.stdin.take(), sb.stdout.take(), sb.stderr.take())
        else {
            return Err(std::io::Error::other("sandbox started without pipes"));
        };
        Ok(ServerProcess {
            stdin: Box::new(stdin),
            stdout: Box::new(stdout),
            stderr: Box::new(stderr),
            control: Box::new(Control(sb)),
        })
    }
}

/// Process control over a whole sandbox: its init forwards SIGTERM to the
/// server's process group, and SIGKILL of the init empties the namespace.
struct Control(Sandbox);

fn exit_info(s: Status) -> ExitInfo {
    match s {
        Status::Exited(c) | Status::OutOfMemory(c) if c > 128 && c < 128 + 65 => ExitInfo {
            code: None,
            signal: Some(c - 128),
        },
        Status::Exited(c) | Status::OutOfMemory(c) => ExitInfo {
            code: Some(c),
            signal: None,
        },
        Status::TimedOut => ExitInfo {
            code: Some(124),
            signal: None,
        },
    }
}

impl ProcessControl for Control {
    fn terminate(&mut self) -> std::io::Result<()> {
        self.0.signal(libc::SIGTERM);
        Ok(())
    }
    fn kill(&mut self) -> std::io::Result<()> {
        self.0.kill();
        Ok(())
    }
    fn try_wait(&mut self) -> std::io::Result<Option<ExitInfo>> {
        self.0
            .try_wait()
            .map(|s| s.map(exit_info))
            .map_err(|e| std::io::Error::other(e.to_string()))
    }
    fn wait(&mut self) -> std::io::Result<ExitInfo> {
        self.0
            .wait()
            .map(exit_info)
            .map_err(|e| std::io::Error::other(e.to_string()))
    }
}

/// Where the tool pins of this policy are kept.
pub fn pin_file(loaded: &Loaded) -> PathBuf {
    state::state_dir()
        .join("pins")
        .join(format!("{}.json", loaded.policy.name()))
}

fn secrets(loaded: &Loaded) -> anyhow::Result<Secrets> {
    let mut out = Vec::new();
    for (name, secret) in &loaded.policy.secrets {
        let source = match &secret.source {
            mcpbox_policy::SecretSource::Env(v) => SecretSource::Env(v.clone()),
            mcpbox_policy::SecretSource::File(p) => SecretSource::File(p.clone()),
            mcpbox_policy::SecretSource::Command(c) => SecretSource::Command(c.clone()),
        };
        let value = mcpbox_gateway::load_secret(name, &source)
            .with_context(|| format!("secrets.{name}"))?;
        out.push(Secret {
            name: name.clone(),
            value,
            ttl: secret.ttl,
            source: Some(source),
        });
    }
    Ok(Secrets(out))
}

/// Runs the relay until the host closes stdin or the server ends.
/// Turns SIGTERM, SIGINT and SIGHUP into an orderly end: the first asks
/// the server to stop (the relay then answers what is in flight and writes
/// the session's last audit records before mcpbox exits); a second one
/// kills the sandbox. The signals were blocked in every thread before this
/// one started, so only this thread sees them.
fn spawn_signal_thread(current: Arc<AtomicI32>) -> anyhow::Result<()> {
    std::thread::Builder::new()
        .name("signals".into())
        .spawn(move || {
            let mut asked = false;
            while let Ok(sig) = mcpbox_sandbox::wait_forwarded_signal() {
                if ![libc::SIGTERM, libc::SIGINT, libc::SIGHUP].contains(&sig) {
                    continue;
                }
                let pid = current.load(Ordering::SeqCst);
                tracing::info!(sig, "signal received: stopping the server");
                mcpbox_sandbox::signal_init(pid, if asked { libc::SIGKILL } else { libc::SIGTERM });
                asked = true;
            }
        })
        .context("starting the signal thread")?;
    Ok(())
}

pub fn run(policy: Option<PathBuf>, command: Vec<OsString>) -> anyhow::Result<i32> {
    // Before any thread exists, so every thread inherits the mask.
    mcpbox_sandbox::block_forwarded_signals()?;
    let current = Arc::new(AtomicI32::new(0));
    spawn_signal_thread(current.clone())?;
    let loaded = preflight::load(policy.as_deref())?;
    let mut spec = preflight::spec(&loaded, command, mcpbox_sandbox::Stdio::Piped)?;
    let sandbox_id = state::new_id();
    let workspace_id = state::workspace_id(&spec);
    let audit = state::open_audit(&loaded.policy)?;
    // unlisted hosts are asked about through the relay's host channel
    let approver = crate::egress::HostApprover::new();
    let _proxy = if loaded.policy.network.is_closed() {
        None
    } else {
        let ids = mcpbox_egress::Ids {
            sandbox_id: sandbox_id.clone(),
            workspace_id: workspace_id.clone(),
            server: loaded.policy.name().to_string(),
        };
        Some(crate::egress::start_with_approver(
            &loaded.policy.network,
            audit.clone(),
            ids,
            &mut spec,
            Arc::new(approver.clone()),
        )?)
    };
    let p = &loaded.policy;
    let pins = pin_file(&loaded);
    if let Some(dir) = pins.parent() {
        std::fs::create_dir_all(dir).with_context(|| format!("creating {}", dir.display()))?;
    }
    let config = Config {
        server_name: p.name().to_string(),
        sandbox_id,
        workspace_id,
        max_line: usize::try_from(p.output.max_line).unwrap_or(usize::MAX),
        max_result: usize::try_from(p.output.max_result).unwrap_or(usize::MAX),
        call_timeout: p.process.call_timeout,
        redact_credential_shapes: p.output.redact_credential_shapes,
        pin_file: Some(pins),
        output_dir: spec.output.clone(),
        ..Config::default()
    };
    let relay = Relay::new(config, Box::new(SandboxLauncher { spec, current }));
    approver.connect(relay.host_asker());
    let outcome = relay
        .policy(Arc::new(Tools(p.tools.clone())))
        .secrets(secrets(&loaded)?)
        .audit(audit)
        .run(Box::new(std::io::stdin()), Box::new(std::io::stdout()))
        .context("relay")?;
    Ok(outcome.server_exit.map_or(0, |e| e.status()))
}
