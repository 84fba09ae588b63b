//! `mcpbox run`: a stdio MCP server in the sandbox, behind the relay.
//!
//! Our stdin/stdout are the MCP stream to the host; everything we log goes
//! to stderr. The relay (crates/gateway) starts the server through
//! [`SandboxLauncher`], again with fresh secrets when a secret's TTL runs out.

use std::path::PathBuf;
use std::sync::atomic::{AtomicI32, Ordering};
use std::sync::Arc;

use anyhow::Context;
use mcpbox_gateway::{ArgumentCheck, Config, Relay, Secret, Secrets, ToolPolicy};
use mcpbox_policy::{CallRules, Decision, ToolHints, World};
use mcpbox_sandbox::Spec;
use serde_json::Value;

use crate::launch::SandboxLauncher;
use crate::preflight::Loaded;
use crate::state;

/// The policy's call decision ([`CallRules`], the one place a call is
/// decided) as the relay sees it, with the world it needs: paths resolved
/// as the sandbox sees them (`view`), command lines classified in a child
/// process (`classify.rs`), the built-in server's artifacts measured on the
/// host (`host`).
struct Tools {
    rules: CallRules,
    view: crate::arguments::SandboxView,
    host: Option<crate::builtin::Checks>,
}

impl ToolPolicy for Tools {
    fn decide(&self, tool: &str, hints: &ToolHints) -> Decision {
        self.rules.decide_tool(tool, hints)
    }

    fn visible(&self, tool: &str, hints: &ToolHints) -> bool {
        self.rules.visible(tool, hints)
    }

    fn checks_arguments(&self, tool: &str, arguments: Option<&Value>) -> bool {
        self.rules.checks_arguments(tool, arguments)
    }

    fn check_arguments(&self, tool: &str, arguments: Option<&Value>) -> Option<ArgumentCheck> {
        self.rules.decide_arguments(tool, arguments, self)
    }
}

impl World for Tools {
    fn resolver(&self) -> &dyn mcpbox_policy::Resolve {
        &self.view
    }

    fn classifier(&self) -> &dyn mcpbox_policy::Classifier {
        &crate::classify::Child
    }

    fn dirs(&self) -> &[String] {
        self.view.dirs()
    }

    fn paths(&self) -> &mcpbox_policy::PathMap {
        self.view.map()
    }

    fn measure(&self, path: &str) -> Result<u64, String> {
        match &self.host {
            Some(h) => h.measure(path),
            None => Err("no built-in server".into()),
        }
    }
}

/// The directory of the tool pins of this policy's servers.
pub fn pin_dir(loaded: &Loaded) -> PathBuf {
    state::state_dir().join("pins").join(loaded.policy.name())
}

/// Where the tool pins of the server `identity` (its command, `url:` and
/// its URL, or `builtin:` and its name) under this policy are kept:
/// `pins/<policy name>/<digest of the identity>.json`. Keyed by the policy's
/// name alone, two servers sharing one policy overwrote each other's pins
/// and blocked each other's tools as new. A pin file of that older layout
/// (`pins/<name>.json`) is the starting point of a server that has none
/// yet, so pins survive the upgrade.
pub fn pin_file(loaded: &Loaded, identity: &str) -> PathBuf {
    use sha2::Digest;
    let digest = sha2::Sha256::digest(identity.as_bytes());
    let hex = mcpbox_policy::hex::encode(&digest[..8]);
    let file = pin_dir(loaded).join(format!("{hex}.json"));
    let legacy = state::state_dir()
        .join("pins")
        .join(format!("{}.json", loaded.policy.name()));
    if !file.exists() && legacy.is_file() {
        if let Some(dir) = file.parent() {
            let _ = state::private_dir(dir);
        }
        // a copy keeps the old file's mode (0644 before pins were private)
        let copied = std::fs::copy(&legacy, &file).and_then(|_| {
            use std::os::unix::fs::PermissionsExt;
            std::fs::set_permissions(&file, std::fs::Permissions::from_mode(0o600))
        });
        if let Err(e) = copied {
            tracing::warn!(
                "pins: copying {} to {}: {e}",
                legacy.display(),
                file.display()
            );
        }
    }
    file
}

/// The identity of a server started from `argv`, for its pins.
pub fn command_identity(argv: &[std::ffi::OsString]) -> String {
    let parts: Vec<String> = argv
        .iter()
        .map(|a| a.to_string_lossy().into_owned())
        .collect();
    format!(
        "command:{}",
        serde_json::to_string(&parts).unwrap_or_default()
    )
}

/// The policy's tool and command rules, for a relay; `builtin` when the
/// server is the built-in one.
pub fn tool_policy(
    loaded: &Loaded,
    builtin: Option<crate::builtin::Checks>,
    view: crate::arguments::SandboxView,
) -> Arc<dyn ToolPolicy> {
    let rules = loaded
        .policy
        .call_rules(builtin.as_ref().map(crate::builtin::Checks::rules));
    Arc::new(Tools {
        rules,
        view,
        host: builtin,
    })
}

/// The relay's settings from the policy (output limits, call timeout,
/// pins, the output directory the sandbox mounts, if any); the caller
/// names the session.
pub fn relay_config(
    loaded: &Loaded,
    identity: &str,
    output_dir: Option<PathBuf>,
    sandbox_id: String,
    workspace_id: String,
) -> anyhow::Result<Config> {
    let p = &loaded.policy;
    let pins = pin_file(loaded, identity);
    if let Some(dir) = pins.parent() {
        state::private_dir(dir).with_context(|| format!("creating {}", dir.display()))?;
    }
    // which server the file pins, for `mcpbox pin` and the console's list
    // (the credential-free form the session_start record shows)
    if let Err(e) = mcpbox_gateway::pin_review::write_server_label(&pins, &server_label(identity)) {
        tracing::warn!("pins: {e}");
    }
    Ok(Config {
        server_name: p.name().to_string(),
        sandbox_id,
        workspace_id,
        max_line: usize::try_from(p.output.max_line).unwrap_or(usize::MAX),
        max_result: usize::try_from(p.output.max_result).unwrap_or(usize::MAX),
        call_timeout: p.process.call_timeout,
        redact_credential_shapes: p.output.redact_credential_shapes,
        approval_timeout: p.approvals.timeout,
        approval_fallback: match p.approvals.fallback {
            mcpbox_policy::ApprovalFallback::Hold => mcpbox_gateway::broker::Fallback::Hold,
            mcpbox_policy::ApprovalFallback::Refuse => mcpbox_gateway::broker::Fallback::Refuse,
        },
        approval_elicitation: p.approvals.elicitation,
        policy_version: mcpbox_gateway::digest::sha256_hex(p.to_toml().as_bytes()),
        approve_over: p.output.approve_over,
        approve_credential_shapes: p.output.approve_credential_shapes,
        pin_file: Some(pins),
        output_dir,
        session_detail: session_detail(loaded, identity),
        run_unaudited: p.audit.on_failure == mcpbox_policy::OnAuditFailure::Continue,
        ..Config::default()
    })
}

/// What the `session_start` record says ran: the server (its command, URL
/// or built-in name, as its pins know it; a URL without user information,
/// query or fragment, which can carry credentials), the policy's name and
/// the SHA-256 of the effective policy (`mcpbox check` prints that text).
fn session_detail(loaded: &Loaded, identity: &str) -> Value {
    let server = server_label(identity);
    let digest = mcpbox_gateway::digest::sha256_hex(loaded.policy.to_toml().as_bytes());
    let mut detail = serde_json::json!({
        "server": server,
        "policy": loaded.policy.name(),
        "policy_file": loaded.file.as_ref().map(|f| f.display().to_string()),
        "policy_sha256": digest,
    });
    // what runtime discovery mounted (docs/runtime.md), when it did
    if let (Some(d), false) = (detail.as_object_mut(), loaded.runtime.is_null()) {
        d.insert("runtime".into(), loaded.runtime.clone());
    }
    detail
}

/// The server `identity` names, without the parts of a URL that can carry
/// credentials.
fn server_label(identity: &str) -> String {
    match identity.strip_prefix("url:") {
        Some(url) => format!("url:{}", url_without_credentials(url)),
        None => identity.to_string(),
    }
}

/// `url` without `user:pass@`, `?query` and `#fragment`.
fn url_without_credentials(url: &str) -> String {
    let cut = url.find(['?', '#']).map_or(url, |i| &url[..i]);
    match cut.split_once("://") {
        Some((scheme, rest)) => {
            let (authority, path) = rest.split_at(rest.find('/').unwrap_or(rest.len()));
            let host = authority.rsplit_once('@').map_or(authority, |(_, h)| h);
            format!("{scheme}://{host}{path}")
        }
        None => cut.to_string(),
    }
}

/// `relay` with the policy's tool rules, `secrets` (from [`secrets`], the
/// ones the sandbox's egress proxy was given) and `audit`.
pub fn with_policy(
    relay: Relay,
    loaded: &Loaded,
    secrets: Secrets,
    audit: Arc<dyn mcpbox_audit::Sink>,
    builtin: Option<crate::builtin::Checks>,
    view: crate::arguments::SandboxView,
) -> anyhow::Result<Relay> {
    Ok(relay
        .policy(tool_policy(loaded, builtin, view))
        .secrets(secrets)
        .audit(audit))
}

/// Where the secrets are used: by a server in a sandbox (a secret with
/// `hosts` then gets a placeholder, its value kept by the egress proxy),
/// or by mcpbox itself (a remote upstream's credential: values as they are).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SecretsFor {
    /// A sandboxed server.
    Sandbox,
    /// mcpbox's own use (`[upstream]` of a remote server).
    Mcpbox,
}

/// The policy's secrets, loaded from their sources; for a sandbox, each
/// one with `hosts` gets a fresh placeholder (mcpbox_egress::placeholder_for,
/// from /dev/urandom), refused with the reason when its value cannot have one.
pub fn secrets(loaded: &Loaded, for_: SecretsFor) -> anyhow::Result<Secrets> {
    let mut out = Vec::new();
    for (name, secret) in &loaded.policy.secrets {
        let source = secret.source.clone();
        let value = mcpbox_gateway::load_secret(name, &source)
            .with_context(|| format!("secrets.{name}"))?;
        let placeholder = if for_ == SecretsFor::Sandbox && !secret.hosts.is_empty() {
            let mut random = std::fs::File::open("/dev/urandom")
                .context("opening /dev/urandom for a secret's placeholder")?;
            let mut failed = None;
            let p = mcpbox_egress::placeholder_for(&value, |buf: &mut [u8]| {
                if let Err(e) = std::io::Read::read_exact(&mut random, buf) {
                    // never a placeholder from a broken source: refused below
                    failed = Some(e);
                    buf.fill(0);
                }
            });
            if let Some(e) = failed {
                return Err(e).context("reading /dev/urandom for a secret's placeholder");
            }
            Some(p.map_err(|e| anyhow::anyhow!("secrets.{name}: {e}"))?)
        } else {
            None
        };
        out.push(Secret {
            name: name.clone(),
            value,
            ttl: secret.ttl,
            source: Some(source),
            placeholder,
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

/// `loaded` and `spec` come from main's prepare path, which blocked the
/// forwarded signals before any thread existed.
pub fn run(loaded: Loaded, spec: Spec, builtin: bool) -> anyhow::Result<i32> {
    run_with(loaded, spec, builtin, crate::egress::HostApprover::new())
}

/// [`run`] with the approver of unlisted hosts (`mcpbox learn` passes one
/// that allows and records them).
pub fn run_with(
    loaded: Loaded,
    mut spec: Spec,
    builtin: bool,
    approver: crate::egress::HostApprover,
) -> anyhow::Result<i32> {
    let current = Arc::new(AtomicI32::new(0));
    spawn_signal_thread(current.clone())?;
    let sandbox_id = state::new_id();
    let workspace_id = state::workspace_id(&spec);
    let audit = state::open_audit(&loaded.policy)?;
    state::keep_retaining(&audit, &loaded.policy.audit);
    // unlisted hosts are asked about through the relay's host channel
    let ids = mcpbox_egress::Ids {
        sandbox_id: sandbox_id.clone(),
        workspace_id: workspace_id.clone(),
        server: loaded.policy.name().to_string(),
    };
    // the connections' records name the calls in flight (detail.calls)
    let calls = Arc::new(mcpbox_gateway::CallsInFlight::default());
    let secrets = secrets(&loaded, SecretsFor::Sandbox)?;
    let _proxy = crate::egress::for_policy(
        &loaded,
        audit.clone(),
        ids,
        &mut spec,
        &approver,
        calls.clone(),
        &secrets,
    )?;
    let output = spec.output.clone();
    // The built-in server's tmp is a host directory (not a tmpfs) for this
    // run, so that the gateway can measure an artifact in it: a working
    // space in mcpbox's state, bounded by the policy's tmp (a volume as
    // root, fuse2fs rootless), removed when the run ends and reclaimed by the next run
    // after a SIGKILL (crate::volume::RunSpace).
    let builtin_tmp = if builtin {
        let bound = crate::volume::bound();
        crate::volume::require(&bound, loaded.policy.sandbox.dangerously_allow_degraded)?;
        if let crate::volume::Bound::Unbounded(why) = bound {
            eprintln!("mcpbox: warning: [filesystem] tmp does not bound the built-in server's tmp here (the policy allows it: sandbox.dangerously_allow_degraded): {why}");
        }
        let space =
            crate::volume::RunSpace::make(&state::ensure_private()?, loaded.policy.filesystem.tmp)
                .context("the built-in server's working space")?;
        spec.tmp_dir = Some(space.tmp());
        Some(space)
    } else {
        None
    };
    let checks = builtin.then(|| crate::builtin::Checks::for_spec(&spec, &loaded.policy));
    // the built-in server's argv carries its limits: its identity is its name
    let identity = if builtin {
        crate::builtin::PIN_IDENTITY.to_string()
    } else {
        command_identity(loaded.argv.as_ref().unwrap_or(&spec.argv))
    };
    let view = crate::arguments::SandboxView::for_spec(&spec);
    let mut config = relay_config(
        &loaded,
        &identity,
        spec.output.clone(),
        sandbox_id.clone(),
        workspace_id.clone(),
    )?;
    config.paths = Some(view.map().clone());
    // The server's stderr, redacted and stripped of escapes, on ours, where
    // a stdio host logs it (it used to need MCPBOX_LOG=info); never on the
    // MCP stream. (`serve` logs it at info: many servers share its stderr.)
    let relay = Relay::new(
        config,
        Box::new(SandboxLauncher {
            spec,
            current,
            gvisor: loaded.policy.sandbox.isolation == mcpbox_policy::Isolation::Gvisor,
        }),
    )
    .calls_in_flight(calls)
    .stderr_handler(Arc::new(|server: &str, line: &str| {
        eprintln!("mcpbox: [{server}] {line}")
    }));
    // one approval broker for the process, answerable over the control
    // socket (`mcpbox approvals`) and the console
    let broker = mcpbox_gateway::broker::Broker::new(audit.clone());
    if let Some(argv) = &loaded.policy.approvals.notify {
        let name = loaded.policy.name().to_string();
        broker.set_notifier(crate::approvals::notifier(
            [(name, argv.clone())].into_iter().collect(),
            audit.clone(),
        ));
    }
    let relay = relay.broker(broker.clone());
    let _control = crate::approvals::listen_run(broker.clone());
    // `--console`: the web console (docs/console.md), on its own thread
    let _console = crate::console::for_run(broker.clone(), &loaded.policy)?;
    approver.connect(relay.host_asker().with_broker(broker.clone()));
    let sink: Arc<dyn mcpbox_audit::Sink> = audit.clone();
    let outcome = with_policy(relay, &loaded, secrets, audit, checks, view)?
        .run(Box::new(std::io::stdin()), Box::new(std::io::stdout()))
        .context("relay")?;
    drop(builtin_tmp);
    if let Some(dir) = output {
        report_special_files(&dir, &sink, &loaded, &sandbox_id, &workspace_id);
    }
    Ok(outcome.server_exit.map_or(0, |e| e.status()))
}

/// Most special files named one by one on stderr.
const SPECIAL_SHOWN: usize = 20;

/// `run` writes to the host's output directory directly (one host, its
/// own directory): what the server left there that is not a plain file
/// (a symlink, a hardlink, a fifo, a socket, a device) is reported on
/// stderr and audited (`flag`, `output.special_file`), so the host does
/// not meet it unwarned. Under `serve`, only artifacts leave at all.
fn report_special_files(
    dir: &std::path::Path,
    audit: &Arc<dyn mcpbox_audit::Sink>,
    loaded: &Loaded,
    sandbox_id: &str,
    workspace_id: &str,
) {
    let all = vec!["**".to_string()];
    let listed = match mcpbox_lifecycle::artifacts::list(dir, &all, u64::MAX) {
        Ok(l) => l,
        Err(e) => {
            tracing::warn!("cannot check {} for special files: {e}", dir.display());
            return;
        }
    };
    let special: Vec<_> = listed.into_iter().filter(|a| a.refused.is_some()).collect();
    if special.is_empty() {
        return;
    }
    eprintln!(
        "mcpbox: the server left {} special file(s) in {} (not plain files; check before you use them):",
        special.len(),
        dir.display()
    );
    for a in special.iter().take(SPECIAL_SHOWN) {
        eprintln!(
            "mcpbox:   {}: {}",
            mcpbox_lifecycle::render::escape(&a.path),
            mcpbox_lifecycle::render::escape(a.refused.as_deref().unwrap_or(""))
        );
    }
    let mut e = mcpbox_audit::Event {
        kind: Some(mcpbox_audit::Kind::Flag),
        sandbox_id: sandbox_id.to_string(),
        workspace_id: workspace_id.to_string(),
        server: loaded.policy.name().to_string(),
        reason: Some(mcpbox_policy::Reason::OutputSpecialFile.as_str().into()),
        ..Default::default()
    };
    e.detail = serde_json::json!({
        "count": special.len(),
        "files": special.iter().take(100).map(|a| serde_json::json!({"path": a.path, "why": a.refused})).collect::<Vec<_>>(),
    });
    audit.record(e);
}

#[cfg(test)]
mod tests {
    #[test]
    fn a_urls_credentials_never_reach_the_session_record() {
        assert_eq!(
            super::url_without_credentials("https://u:p@h.example:8443/mcp?token=x#f"),
            "https://h.example:8443/mcp"
        );
        assert_eq!(
            super::url_without_credentials("https://h/mcp"),
            "https://h/mcp"
        );
        assert_eq!(super::url_without_credentials("https://h"), "https://h");
    }
}
