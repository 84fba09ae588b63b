//! The web console: what waits for a human (approvals, live), the
//! sandboxes, the audit log with its chain's status and the pinned tools,
//! in a browser, served by `mcpbox serve --console` and `mcpbox run
//! --console` ([docs/console.md](../../../../docs/console.md)).
//!
//! # Shape
//!
//! [`start`] binds a loopback address and serves on a thread of its own
//! with a small current-thread tokio runtime: `run` has no runtime, and
//! the relay's thread must never wait on a browser. The binary
//! (`crates/mcpbox/src/console.rs`) prints the one line
//! `mcpbox: console at http://127.0.0.1:PORT/#token=TOKEN` on stderr and
//! writes the same URL to `console.url` (0600) in a 0700 directory of this
//! process under the runtime directory. [`Running`] stops the console and
//! removes that directory when dropped.
//!
//! It lives beside the gateway's HTTP face because the two share their
//! first checks ([`crate::gate`]: Host, Origin, the bearer token or the
//! session cookie, compared in constant time).
//!
//! The page is one small single-page app (`assets/`: HTML, CSS and JS,
//! embedded with `include_str!`; nothing is fetched from anywhere else)
//! over a JSON API (`http.rs` routes and checks, `api.rs` answers,
//! `pins.rs` adapts the pin store).
//!
//! # Security model (each point has an attack test in crates/mcpbox/tests/it/console.rs)
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
mod pins;

use std::net::SocketAddr;
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
    url: String,
    stop: Option<tokio::sync::oneshot::Sender<()>>,
    thread: Option<std::thread::JoinHandle<()>>,
    dir: Option<PathBuf>,
}

impl Running {
    /// The URL with the token in its fragment.
    pub fn url(&self) -> &str {
        &self.url
    }

    /// Removes `dir` (where the URL was written) when the console stops.
    pub fn remove_on_stop(&mut self, dir: PathBuf) {
        self.dir = Some(dir);
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

/// Starts the console on `addr` (loopback only; port 0: the kernel's
/// choice); its URL, with the token, is [`Running::url`].
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
    Ok(Running {
        url,
        stop: Some(stop_tx),
        thread: Some(thread),
        dir: None,
    })
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
