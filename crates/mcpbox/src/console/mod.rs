//! The web console: what waits for a human (approvals, live), the
//! sandboxes, the audit log with its chain's status and the pinned tools,
//! in a browser, served by `mcpbox serve --console` and `mcpbox run
//! --console` ([docs/console.md](../../../../docs/console.md)).
//!
//! # Shape
//!
//! [`start`] binds a loopback address, prints the one line
//! `mcpbox: console at http://127.0.0.1:PORT/#token=TOKEN` on stderr,
//! writes the same URL to `console.url` (0600) in a 0700 directory of this
//! process under the runtime directory, and serves on a thread of its own
//! with a small current-thread tokio runtime: `run` has no runtime, and
//! the relay's thread must never wait on a browser. [`Running`] stops it
//! and removes the file when dropped.
//!
//! The page is one small single-page app (`assets/`: HTML, CSS and JS,
//! embedded with `include_str!`; nothing is fetched from anywhere else)
//! over a JSON API (`http.rs` routes and checks, `api.rs` answers,
//! `pins.rs` adapts the pin store).
//!
//! # Security model (each point has an attack test in tests/console.rs)
//!
//! - loopback only: [`start`] refuses any other address;
//! - a token of 32 random bytes from `/dev/urandom`, compared in constant
//!   time, as `Authorization: Bearer` or as the `HttpOnly; SameSite=Strict`
//!   cookie the page gets by POSTing the URL fragment's token to `/login`
//!   (a fragment is never sent to a server nor put in a Referer);
//! - `Host` must name this console (`127.0.0.1:PORT`, `localhost:PORT`,
//!   `[::1]:PORT`): a DNS-rebound name gets 421;
//! - a state change is a POST whose `Origin` is exactly this console's
//!   (a POST without one is refused) and whose `Sec-Fetch-Site`, when
//!   present, is `same-origin`; GET changes nothing;
//! - a strict CSP with no inline script, `nosniff`, `no-referrer`,
//!   `no-store`, no framing;
//! - whatever a server or agent chose is put in the page as text
//!   (`textContent`), never parsed as HTML;
//! - bodies are at most 64 KiB, at most 8 long polls waiting at once;
//! - connections are admitted in two pools (`admission.rs`): at most 64
//!   that have not shown the token, each closed after its first answer,
//!   5 s after its accept, or when a newer one needs its place (the
//!   oldest goes), and at most 32 that have, kept alive (10 s to send each
//!   next head). Connections without the token, idle or slow, however
//!   many, never hold a place the owner needs (another local user can
//!   connect to loopback).
//!
//! Why no new crates: hyper, hyper-util, http-body-util and bytes are the
//! versions `crates/serve` already builds; the token comes from
//! `/dev/urandom` as the rest of mcpbox's ids do.

mod admission;
mod api;
mod http;
pub mod pins;

use std::net::SocketAddr;
use std::os::unix::fs::{OpenOptionsExt, PermissionsExt};
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use anyhow::{bail, Context};
use mcpbox_gateway::broker::Broker;

/// At most this many connections with the token (owner connections, kept
/// alive) at once; a request with the token past them is answered 503.
const MAX_CONNECTIONS: usize = 32;
/// At most this many connections that have not shown the token yet; a new
/// one closes the oldest of them (`admission.rs`).
const MAX_PENDING: usize = 64;
/// How long a connection may take, from its accept, to show the token in
/// a request (head and body); after that it is closed. The owner's browser
/// and the CLI send theirs at once.
const PENDING_TIME: Duration = Duration::from_secs(5);
/// Time to send a request's head (an owner connection's next request).
const HEADER_TIMEOUT: Duration = Duration::from_secs(10);

/// What the console shows and acts on.
pub struct Parts {
    /// The process's approval broker (the relay's, or serve's).
    pub broker: Arc<Broker>,
    /// The sandbox lifecycle (`serve`); `None` under `run`, which has no
    /// sandbox that outlives it.
    pub control: Option<Arc<dyn mcpbox_lifecycle::Control>>,
    /// The audit databases to show (one per distinct `[audit] path`; the
    /// first is the default).
    pub audit_dbs: Vec<PathBuf>,
    /// The state directory: its `pins/` and its `audit.key`.
    pub state_dir: PathBuf,
    /// Where a decision on a policy's pins is audited: the audit log of
    /// the policy of that name (else the first of `audit_dbs`).
    pub pin_audit: Vec<(String, PathBuf)>,
    /// `run` or `serve`, for the page's header.
    pub mode: &'static str,
}

/// A running console; dropping it stops the server and removes
/// `console.url`.
pub struct Running {
    #[cfg_attr(not(test), allow(dead_code))]
    url: String,
    stop: Option<tokio::sync::oneshot::Sender<()>>,
    thread: Option<std::thread::JoinHandle<()>>,
    dir: Option<PathBuf>,
}

impl Running {
    /// The URL with the token in its fragment.
    #[cfg_attr(not(test), allow(dead_code))]
    pub fn url(&self) -> &str {
        &self.url
    }
}

impl Drop for Running {
    fn drop(&mut self) {
        if let Some(stop) = self.stop.take() {
            let _ = stop.send(());
        }
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
        if let Some(dir) = self.dir.take() {
            let _ = std::fs::remove_dir_all(dir);
        }
    }
}

/// The address `--console` asked for, set by `main` before `run` or
/// `serve` starts (so that their signatures, shared with other work, stay
/// as they are).
static REQUESTED: std::sync::OnceLock<SocketAddr> = std::sync::OnceLock::new();

/// `--console [ADDR]` was given.
pub fn request(addr: SocketAddr) {
    let _ = REQUESTED.set(addr);
}

/// Starts the console when `--console` asked for it, with the parts
/// `parts` makes (called only then).
pub fn start_requested(
    parts: impl FnOnce() -> anyhow::Result<Parts>,
) -> anyhow::Result<Option<Running>> {
    match REQUESTED.get() {
        Some(addr) => Ok(Some(start(*addr, parts()?)?)),
        None => Ok(None),
    }
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

/// Starts the console on `addr` (loopback only; port 0: the kernel's
/// choice), prints its URL on stderr and writes it to `console.url`.
pub fn start(addr: SocketAddr, parts: Parts) -> anyhow::Result<Running> {
    if !addr.ip().is_loopback() {
        bail!(
            "console: {addr} is not a loopback address; the console listens on 127.0.0.1 or [::1] only \
             (anyone who can reach it could answer approvals)"
        );
    }
    let listener = std::net::TcpListener::bind(addr)
        .with_context(|| format!("console: cannot listen on {addr}"))?;
    listener
        .set_nonblocking(true)
        .context("console: listener")?;
    let bound = listener.local_addr().context("console: listener")?;
    let token = random_token().context("console: a token from /dev/urandom")?;
    let host = match bound {
        SocketAddr::V4(a) => format!("{}:{}", a.ip(), a.port()),
        SocketAddr::V6(a) => format!("[{}]:{}", a.ip(), a.port()),
    };
    let url = format!("http://{host}/#token={token}");
    let console = Arc::new(http::Console::new(parts, token, bound.port()));
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_io()
        .enable_time()
        .max_blocking_threads(http::MAX_POLLS + 8)
        .thread_name("mcpbox-console")
        .build()
        .context("console: its runtime")?;
    let (stop_tx, stop_rx) = tokio::sync::oneshot::channel::<()>();
    let thread = std::thread::Builder::new()
        .name("console".into())
        .spawn(move || {
            runtime.block_on(async move {
                match tokio::net::TcpListener::from_std(listener) {
                    Ok(l) => http::serve(console, l, stop_rx).await,
                    Err(e) => tracing::error!("console: {e}"),
                }
            });
            // long polls still waiting in the broker are not waited for
            runtime.shutdown_background();
        })
        .context("console: starting its thread")?;
    let dir = match write_url_file(&url) {
        Ok(d) => Some(d),
        Err(e) => {
            tracing::warn!("console: {e:#}");
            None
        }
    };
    eprintln!("mcpbox: console at {url}");
    Ok(Running {
        url,
        stop: Some(stop_tx),
        thread: Some(thread),
        dir,
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

/// 32 random bytes, hex.
fn random_token() -> std::io::Result<String> {
    use std::io::Read;
    let mut bytes = [0u8; 32];
    std::fs::File::open("/dev/urandom")?.read_exact(&mut bytes)?;
    Ok(mcpbox_policy::hex::encode(&bytes))
}

#[cfg(test)]
mod tests;
