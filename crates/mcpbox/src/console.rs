//! `--console` of `run` and `serve`: the parts the web console shows
//! (`mcpbox_serve::console`, beside the HTTP face it shares its checks
//! with), and where its URL is written for `mcpbox approvals` users.

use std::net::SocketAddr;
use std::os::unix::fs::{OpenOptionsExt, PermissionsExt};
use std::path::PathBuf;
use std::sync::Arc;

use anyhow::{bail, Context};
use mcpbox_gateway::broker::Broker;
use mcpbox_serve::console::{start, Parts, Running};

/// The address `--console` asked for, set by `main` before `run` or
/// `serve` starts (so that their signatures, shared with other work, stay
/// as they are).
static REQUESTED: std::sync::OnceLock<SocketAddr> = std::sync::OnceLock::new();

/// `--console [ADDR]` was given.
pub fn request(addr: SocketAddr) {
    let _ = REQUESTED.set(addr);
}

/// Starts the console when `--console` asked for it, with the parts
/// `parts` makes (called only then); prints its URL on stderr and writes
/// it to `console.url`.
pub fn start_requested(
    parts: impl FnOnce() -> anyhow::Result<Parts>,
) -> anyhow::Result<Option<Running>> {
    let Some(addr) = REQUESTED.get() else {
        return Ok(None);
    };
    let mut running = start(*addr, parts()?)?;
    match write_url_file(running.url()) {
        Ok(dir) => running.remove_on_stop(dir),
        Err(e) => tracing::warn!("console: {e:#}"),
    }
    eprintln!("mcpbox: console at {}", running.url());
    Ok(Some(running))
}

/// `mcpbox run --console`: the relay's broker, no sandboxes to manage,
/// the policy's audit log.
pub fn for_run(
    broker: Arc<Broker>,
    policy: &mcpbox_policy::Policy,
) -> anyhow::Result<Option<Running>> {
    start_requested(|| {
        Ok(Parts {
            broker,
            control: None,
            audit_dbs: vec![crate::state::audit_path(policy)],
            state_dir: crate::state::state_dir(),
            pin_audit: vec![(policy.name().to_string(), crate::state::audit_path(policy))],
            mode: "run",
        })
    })
}

/// `mcpbox serve --console`: the gateway's broker (the lifecycle's desk;
/// `None`, which serve never passes: one of its own over the state
/// directory's audit log), its lifecycle, and every audit log its servers write (the state
/// directory's first).
pub fn for_serve(
    broker: Option<Arc<Broker>>,
    life: Arc<crate::lifecycle::Lifecycle>,
    cfg: &mcpbox_policy::serve::ServeConfig,
) -> anyhow::Result<Option<Running>> {
    start_requested(|| {
        let broker = match broker {
            Some(b) => b,
            None => Broker::new(crate::state::open_default_audit()?),
        };
        let mut audit_dbs = vec![crate::state::state_dir().join("audit.db")];
        let mut pin_audit = Vec::new();
        for s in &cfg.servers {
            // loaded and checked already by serve's start
            if let Ok(loaded) = crate::preflight::load(Some(&s.policy)) {
                let p = crate::state::audit_path(&loaded.policy);
                pin_audit.push((loaded.policy.name().to_string(), p.clone()));
                if !audit_dbs.contains(&p) {
                    audit_dbs.push(p);
                }
            }
        }
        Ok(Parts {
            broker,
            control: Some(life),
            audit_dbs,
            state_dir: crate::state::state_dir(),
            pin_audit,
            mode: "serve",
        })
    })
}

/// Writes `url` to `<runtime>/console-<pid>/console.url` (directory 0700,
/// file 0600), for `mcpbox approvals` users to find; returns the directory.
fn write_url_file(url: &str) -> anyhow::Result<PathBuf> {
    let base = crate::egress::runtime_base();
    std::fs::create_dir_all(&base).with_context(|| format!("creating {}", base.display()))?;
    let meta =
        std::fs::symlink_metadata(&base).with_context(|| format!("checking {}", base.display()))?;
    if !meta.is_dir() || std::os::unix::fs::MetadataExt::uid(&meta) != crate::preflight::uid() {
        bail!(
            "{} is not a directory owned by this user; the console's URL is not written there",
            base.display()
        );
    }
    let dir = base.join(format!("console-{}", std::process::id()));
    match std::fs::create_dir(&dir) {
        Ok(()) => {}
        Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => {}
        Err(e) => return Err(e).with_context(|| format!("creating {}", dir.display())),
    }
    std::fs::set_permissions(&dir, std::fs::Permissions::from_mode(0o700))
        .with_context(|| format!("securing {}", dir.display()))?;
    let file = dir.join("console.url");
    let _ = std::fs::remove_file(&file);
    let mut f = std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(0o600)
        .open(&file)
        .with_context(|| format!("creating {}", file.display()))?;
    std::io::Write::write_all(&mut f, format!("{url}\n").as_bytes())
        .with_context(|| format!("writing {}", file.display()))?;
    Ok(dir)
}
