//! The control socket of `mcpbox serve`, and the CLI's side of it.
//!
//! # Protocol
//!
//! JSON lines over a unix stream socket, **one request per connection**:
//! the client connects, writes one line (a [`Request`]), reads one line
//! (a [`Response`]) and the server closes the connection. One request per
//! connection keeps the server simple (no per-connection state, nothing to
//! resynchronise after a malformed line) and a connection costs nothing on
//! a unix socket.
//!
//! ```text
//! → {"op":"list"}
//! → {"op":"show","id":"sb-0123456789abcdef"}          (also pause, resume,
//!                                                       destroy, artifacts)
//! → {"op":"snapshot","id":"sb-…","archive":"/abs/x.tar.zst","include_tmp":false}
//! → {"op":"restore","archive":"/abs/x.tar.zst","agent":"alice","server":"fs","task":null}
//! → {"op":"export","id":"sb-…","dest":"/abs/dir","approve_large":{"big.bin":4096}}
//! ← {"ok":true,"result":…}
//! ← {"ok":false,"error":"…"}
//! ```
//!
//! `include_tmp`, `approve_large` and `task` may be left out (false, none,
//! null). `approve_large` (also of `destroy`) names the artifacts over the
//! size limit a human approved, each at the size listed
//! ([`crate::artifacts::Approved`]). The `result` of each op is the serde JSON of what [`Control`]
//! returns: `list` an array of [`SandboxInfo`](crate::SandboxInfo); `show`,
//! `pause`, `resume`, `restore` one `SandboxInfo`; `snapshot` a
//! [`SnapshotInfo`](crate::SnapshotInfo); `destroy` a
//! [`Teardown`](crate::Teardown); `artifacts` an array of
//! [`Artifact`](crate::Artifact); `export` an array of
//! [`Exported`](crate::Exported).
//!
//! # What the server checks, in order
//!
//! 1. The socket is reachable only by its owner: its directory is made
//!    0700 when missing, and the socket is bound inside it and then
//!    chmod'ed 0600 (the mode does not depend on the umask, and the 0700
//!    directory closes the window between `bind` and `chmod`).
//! 2. The peer's uid (`SO_PEERCRED`, see unix(7)) is this process's
//!    effective uid or root; anyone else gets one error line and the
//!    connection is closed before a byte of theirs is read, by the accept
//!    loop itself: a refused peer never holds one of the handler threads.
//! 3. The request line arrives within [`READ_TIMEOUT`] and is at most
//!    [`MAX_REQUEST`] bytes; a silent or slow client loses its
//!    connection, and cannot hold more than one of the
//!    [`MAX_CONNECTIONS`] handler threads.
//! 4. The line parses as a [`Request`] with no unknown field, and its
//!    inputs are checked ([`Request::check`]) before [`Control`] sees them:
//!    ids have the shape of [`id::is_id`], paths are absolute, agent and
//!    server names are `[a-z0-9-]{1,63}`, the task passes
//!    [`id::check_task`].
//!
//! Architecture invariant: no request reaches [`Control`] unless it passed
//! all four; [`handle_line`] is the one place that maps a line to a
//! response, and it performs no I/O, so the checks are unit-tested
//! without a socket.

use std::io::{self, BufRead, BufReader, Read, Write};
use std::os::unix::fs::{DirBuilderExt, FileTypeExt, MetadataExt, PermissionsExt};
use std::os::unix::net::{UnixListener, UnixStream};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use serde::{Deserialize, Serialize};

use crate::{id, Control};

/// The longest request line the server reads, newline excluded.
pub const MAX_REQUEST: usize = 64 * 1024;
/// How long the server waits for a whole request line once a client has
/// connected (and for a response line to be taken).
pub const READ_TIMEOUT: Duration = Duration::from_secs(5);
/// Connections handled at once; the next one gets a "busy" error line.
pub const MAX_CONNECTIONS: usize = 16;
/// How long the client waits for a response: long, since a snapshot or an
/// export of a big workspace takes a while, but not forever.
pub const CLIENT_TIMEOUT: Duration = Duration::from_secs(600);

/// One request line.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "op", rename_all = "snake_case", deny_unknown_fields)]
pub enum Request {
    /// Every sandbox the lifecycle knows (`{"op":"list"}`; a struct
    /// variant so that `deny_unknown_fields` holds for it too).
    List {},
    /// One sandbox.
    Show { id: String },
    /// Freezes its processes.
    Pause { id: String },
    /// Thaws them.
    Resume { id: String },
    /// Tears it down: processes, cgroups, workspace. `approve_large`: the
    /// artifacts over the size limit a human approved, each at the size
    /// it was listed at; any other (or grown since) keeps the workspace.
    Destroy {
        id: String,
        #[serde(default)]
        approve_large: crate::artifacts::Approved,
    },
    /// The files of `output` the policy's artifact patterns match.
    Artifacts { id: String },
    /// Archives the workspace.
    Snapshot {
        id: String,
        /// Absolute path of the archive to write.
        archive: PathBuf,
        /// Also archive `tmp` (off: `tmp` is scratch).
        #[serde(default)]
        include_tmp: bool,
        /// Also the memory of its running servers (gVisor's checkpoint).
        #[serde(default)]
        memory: bool,
    },
    /// A new sandbox from an archive.
    Restore {
        /// Absolute path of the archive to read.
        archive: PathBuf,
        agent: String,
        server: String,
        #[serde(default)]
        task: Option<String>,
    },
    /// The approvals waiting for a human (`{"op":"approvals"}`).
    Approvals {},
    /// Approves one: this call only, or with `session` the tool for the
    /// rest of its session.
    Approve {
        id: String,
        #[serde(default)]
        session: bool,
    },
    /// Denies one.
    Deny { id: String },
    /// Copies the exportable artifacts out.
    Export {
        id: String,
        /// Absolute path of the destination directory.
        dest: PathBuf,
        /// Files over the size limit a human approved, each at the size
        /// it was listed at (grown since: left out).
        #[serde(default)]
        approve_large: crate::artifacts::Approved,
    },
}

impl Request {
    /// The op's name, as on the wire.
    pub fn op(&self) -> &'static str {
        match self {
            Request::List {} => "list",
            Request::Show { .. } => "show",
            Request::Pause { .. } => "pause",
            Request::Resume { .. } => "resume",
            Request::Destroy { .. } => "destroy",
            Request::Artifacts { .. } => "artifacts",
            Request::Snapshot { .. } => "snapshot",
            Request::Restore { .. } => "restore",
            Request::Export { .. } => "export",
            Request::Approvals {} => "approvals",
            Request::Approve { .. } => "approve",
            Request::Deny { .. } => "deny",
        }
    }

    /// Checks every input of the request before it reaches [`Control`]:
    /// the error is the text the client gets.
    pub fn check(&self) -> Result<(), String> {
        match self {
            Request::List {} | Request::Approvals {} => Ok(()),
            Request::Approve { id, .. } | Request::Deny { id } => check_approval_id(id),
            Request::Show { id }
            | Request::Pause { id }
            | Request::Resume { id }
            | Request::Destroy { id, .. }
            | Request::Artifacts { id } => check_id(id),
            Request::Snapshot { id, archive, .. } => {
                check_id(id)?;
                check_path("archive", archive)
            }
            Request::Restore {
                archive,
                agent,
                server,
                task,
            } => {
                check_path("archive", archive)?;
                check_name("agent", agent)?;
                check_name("server", server)?;
                match task {
                    Some(t) => id::check_task(t),
                    None => Ok(()),
                }
            }
            Request::Export { id, dest, .. } => {
                check_id(id)?;
                check_path("dest", dest)
            }
        }
    }
}

fn check_id(id: &str) -> Result<(), String> {
    if id::is_id(id) {
        Ok(())
    } else {
        Err(format!(
            "{id:?} is not a sandbox id (sb- and 16 lowercase hex digits)"
        ))
    }
}

fn check_path(what: &str, path: &Path) -> Result<(), String> {
    if !path.is_absolute() {
        return Err(format!("{what} {path:?} is not an absolute path"));
    }
    if path.as_os_str().as_encoded_bytes().contains(&0) {
        return Err(format!("{what} {path:?} contains a NUL byte"));
    }
    Ok(())
}

/// An approval id: `ap-` and 12 lowercase hex digits.
fn check_approval_id(id: &str) -> Result<(), String> {
    let ok = id.len() == 15
        && id.starts_with("ap-")
        && id[3..]
            .bytes()
            .all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b));
    if ok {
        Ok(())
    } else {
        Err(format!(
            "{:?} is not an approval id (ap- and 12 lowercase hex digits)",
            id.chars().take(40).collect::<String>()
        ))
    }
}

/// An agent or server name: `[a-z0-9-]{1,63}`.
fn check_name(what: &str, name: &str) -> Result<(), String> {
    let ok = !name.is_empty()
        && name.len() <= 63
        && name
            .bytes()
            .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-');
    if ok {
        Ok(())
    } else {
        Err(format!("{what} name {name:?} is not 1 to 63 of [a-z0-9-]"))
    }
}

/// One response line: `{"ok":true,"result":…}` or `{"ok":false,"error":"…"}`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Response {
    pub ok: bool,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub result: Option<serde_json::Value>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub error: Option<String>,
}

impl Response {
    pub fn ok(result: serde_json::Value) -> Response {
        Response {
            ok: true,
            result: Some(result),
            error: None,
        }
    }

    pub fn error(message: impl Into<String>) -> Response {
        Response {
            ok: false,
            result: None,
            error: Some(message.into()),
        }
    }

    /// The line as sent, newline included.
    pub fn to_line(&self) -> String {
        let mut s = serde_json::to_string(self).unwrap_or_else(|_| {
            r#"{"ok":false,"error":"internal: the response did not serialise"}"#.to_owned()
        });
        s.push('\n');
        s
    }
}

/// Maps one request line (newline excluded) to its response: parse, check,
/// call [`Control`]. The one place errors become responses; no I/O.
pub fn handle_line(control: &dyn Control, line: &[u8]) -> Response {
    handle_line_from(control, line, "cli")
}

/// [`handle_line`] for a peer named `by` (in an approval's record: who
/// answered).
pub fn handle_line_from(control: &dyn Control, line: &[u8], by: &str) -> Response {
    let request: Request = match serde_json::from_slice(line) {
        Ok(r) => r,
        Err(e) => return Response::error(format!("malformed request: {e}")),
    };
    if let Err(e) = request.check() {
        tracing::warn!(op = request.op(), error = %e, "control request refused");
        return Response::error(format!("refused: {e}"));
    }
    handle(control, &request, by)
}

/// Calls [`Control`] for a request that passed [`Request::check`].
fn handle(control: &dyn Control, request: &Request, by: &str) -> Response {
    fn reply<T: Serialize>(r: Result<T, String>) -> Response {
        match r {
            Ok(v) => match serde_json::to_value(v) {
                Ok(v) => Response::ok(v),
                Err(e) => Response::error(format!("internal: the result did not serialise: {e}")),
            },
            Err(e) => Response::error(e),
        }
    }
    match request {
        Request::List {} => reply(Ok(control.list())),
        Request::Show { id } => reply(control.show(id)),
        Request::Pause { id } => reply(control.pause(id)),
        Request::Resume { id } => reply(control.resume(id)),
        Request::Destroy { id, approve_large } => reply(control.destroy(id, approve_large)),
        Request::Artifacts { id } => reply(control.artifacts(id)),
        Request::Snapshot {
            id,
            archive,
            include_tmp,
            memory,
        } => reply(control.snapshot(id, archive, *include_tmp, *memory)),
        Request::Restore {
            archive,
            agent,
            server,
            task,
        } => reply(control.restore(archive, agent, server, task.as_deref())),
        Request::Export {
            id,
            dest,
            approve_large,
        } => reply(control.export(id, dest, approve_large)),
        Request::Approvals {} => match control.desk() {
            Some(d) => reply(Ok(d.pending())),
            None => Response::error(NO_DESK),
        },
        Request::Approve { id, session } => match control.desk() {
            Some(d) => reply(d.answer(id, true, *session, by)),
            None => Response::error(NO_DESK),
        },
        Request::Deny { id } => match control.desk() {
            Some(d) => reply(d.answer(id, false, false, by)),
            None => Response::error(NO_DESK),
        },
    }
}

const NO_DESK: &str = "this mcpbox has no approval broker";

/// What can go wrong setting up the control socket.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("creating the control socket directory {path}: {source}")]
    Dir { path: PathBuf, source: io::Error },
    #[error("the control socket path {path} has no parent directory")]
    NoParent { path: PathBuf },
    #[error("another mcpbox serve holds {path}")]
    Held { path: PathBuf },
    #[error("{path} exists and is not a socket: not removing it")]
    NotSocket { path: PathBuf },
    #[error("inspecting the control socket path {path}: {source}")]
    Inspect { path: PathBuf, source: io::Error },
    #[error("removing the stale control socket {path}: {source}")]
    RemoveStale { path: PathBuf, source: io::Error },
    #[error("binding the control socket {path}: {source}")]
    Bind { path: PathBuf, source: io::Error },
    #[error("setting mode 0600 on the control socket {path}: {source}")]
    Chmod { path: PathBuf, source: io::Error },
    #[error("starting the accept thread of the control socket {path}: {source}")]
    Thread { path: PathBuf, source: io::Error },
}

/// This module's result.
pub type Result<T, E = Error> = std::result::Result<T, E>;

/// A listening control socket. Dropping it (or [`Server::stop`]) stops
/// accepting, waits for the accept thread and removes the socket file if
/// it is still the one this server bound. Connections being handled then
/// finish on their own threads.
pub struct Server {
    path: PathBuf,
    listener: Arc<UnixListener>,
    stopping: Arc<AtomicBool>,
    thread: Option<JoinHandle<()>>,
    /// (dev, ino) of the socket file bound, so a socket that replaced ours
    /// is not removed.
    bound: (u64, u64),
}

impl Server {
    /// The socket's path.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Stops accepting and removes the socket file.
    pub fn stop(self) {
        drop(self)
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        self.stopping.store(true, Ordering::SeqCst);
        // shutdown(2) on a listening socket wakes a blocked accept(2) on
        // Linux (it returns EINVAL); a connect is the fallback wake-up.
        if rustix::net::shutdown(&*self.listener, rustix::net::Shutdown::Both).is_err() {
            let _ = UnixStream::connect(&self.path);
        }
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
        match std::fs::symlink_metadata(&self.path) {
            Ok(m) if (m.dev(), m.ino()) == self.bound => {
                if let Err(e) = std::fs::remove_file(&self.path) {
                    tracing::warn!(path = %self.path.display(), error = %e, "removing the control socket");
                }
            }
            Ok(_) => tracing::warn!(
                path = %self.path.display(),
                "the control socket was replaced; leaving the new one"
            ),
            Err(_) => {}
        }
    }
}

/// Listens on `path` and serves `control` on a background thread, one
/// short-lived thread per connection (at most [`MAX_CONNECTIONS`]).
pub fn serve(path: &Path, control: Arc<dyn Control>) -> Result<Server> {
    let parent = match path.parent() {
        Some(p) if !p.as_os_str().is_empty() => p,
        _ => {
            return Err(Error::NoParent {
                path: path.to_owned(),
            })
        }
    };
    if !parent.exists() {
        std::fs::DirBuilder::new()
            .recursive(true)
            .mode(0o700)
            .create(parent)
            .map_err(|source| Error::Dir {
                path: parent.to_owned(),
                source,
            })?;
    } else if let Ok(m) = std::fs::metadata(parent) {
        if m.mode() & 0o022 != 0 {
            tracing::warn!(
                dir = %parent.display(),
                "the control socket's directory is writable by others; the peer uid check still applies"
            );
        }
    }
    remove_stale(path)?;
    let listener = UnixListener::bind(path).map_err(|source| Error::Bind {
        path: path.to_owned(),
        source,
    })?;
    // After bind, so the mode does not depend on the umask.
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(0o600)).map_err(|source| {
        let _ = std::fs::remove_file(path);
        Error::Chmod {
            path: path.to_owned(),
            source,
        }
    })?;
    let bound = std::fs::symlink_metadata(path)
        .map(|m| (m.dev(), m.ino()))
        .map_err(|source| Error::Inspect {
            path: path.to_owned(),
            source,
        })?;
    let listener = Arc::new(listener);
    let stopping = Arc::new(AtomicBool::new(false));
    let thread = {
        let listener = Arc::clone(&listener);
        let stopping = Arc::clone(&stopping);
        std::thread::Builder::new()
            .name("mcpbox-control".into())
            .spawn(move || accept_loop(&listener, &stopping, control))
            .map_err(|source| {
                let _ = std::fs::remove_file(path);
                Error::Thread {
                    path: path.to_owned(),
                    source,
                }
            })?
    };
    Ok(Server {
        path: path.to_owned(),
        listener,
        stopping,
        thread: Some(thread),
        bound,
    })
}

/// Removes a socket left by a `serve` that died, and nothing else: not a
/// file that is not a socket, not a socket someone answers on.
fn remove_stale(path: &Path) -> Result<()> {
    let meta = match std::fs::symlink_metadata(path) {
        Ok(m) => m,
        Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(()),
        Err(source) => {
            return Err(Error::Inspect {
                path: path.to_owned(),
                source,
            })
        }
    };
    if !meta.file_type().is_socket() {
        return Err(Error::NotSocket {
            path: path.to_owned(),
        });
    }
    match UnixStream::connect(path) {
        Ok(_) => Err(Error::Held {
            path: path.to_owned(),
        }),
        Err(e) if e.kind() == io::ErrorKind::ConnectionRefused => {
            tracing::info!(path = %path.display(), "removing a stale control socket");
            std::fs::remove_file(path).map_err(|source| Error::RemoveStale {
                path: path.to_owned(),
                source,
            })
        }
        Err(source) => Err(Error::Inspect {
            path: path.to_owned(),
            source,
        }),
    }
}

fn accept_loop(listener: &UnixListener, stopping: &AtomicBool, control: Arc<dyn Control>) {
    let active = Arc::new(AtomicUsize::new(0));
    loop {
        let accepted = listener.accept();
        if stopping.load(Ordering::SeqCst) {
            return;
        }
        let stream = match accepted {
            Ok((s, _)) => s,
            Err(e) => {
                tracing::warn!(error = %e, "accepting on the control socket");
                // EMFILE and friends: do not spin.
                std::thread::sleep(Duration::from_millis(50));
                continue;
            }
        };
        let _ = stream.set_write_timeout(Some(READ_TIMEOUT));
        // The peer is checked here, before it may take one of the
        // handler threads: a refused peer gets its error line and is
        // closed at once, and never counts against MAX_CONNECTIONS. (The
        // check reads no byte of the peer's and does not block:
        // SO_PEERCRED and a readlink in /proc.)
        let by = match check_peer(&stream) {
            Ok(by) => by,
            Err(e) => {
                tracing::warn!(error = %e, "control connection refused");
                send(stream, &Response::error(format!("refused: {e}")));
                continue;
            }
        };
        if active.fetch_add(1, Ordering::SeqCst) >= MAX_CONNECTIONS {
            active.fetch_sub(1, Ordering::SeqCst);
            tracing::warn!("control socket busy: refusing a connection");
            send(
                stream,
                &Response::error(format!(
                    "busy: {MAX_CONNECTIONS} control requests are being handled; try again"
                )),
            );
            continue;
        }
        let guard = Active(Arc::clone(&active));
        let control = Arc::clone(&control);
        let spawned = std::thread::Builder::new()
            .name("mcpbox-control-conn".into())
            .spawn(move || {
                let _guard = guard;
                connection(stream, &*control, &by);
            });
        if let Err(e) = spawned {
            // The closure, its guard and the stream were dropped with it.
            tracing::warn!(error = %e, "spawning a control connection thread");
        }
    }
}

/// Counts a connection being handled until dropped.
struct Active(Arc<AtomicUsize>);

impl Drop for Active {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::SeqCst);
    }
}

/// One connection of a peer that passed [`check_peer`] (`by`).
fn connection(mut stream: UnixStream, control: &dyn Control, by: &str) {
    let response = match read_line(&mut stream, Instant::now() + READ_TIMEOUT) {
        Ok(line) => handle_line_from(control, &line, by),
        Err(e) => {
            tracing::warn!(error = %e, "control request not read");
            Response::error(e)
        }
    };
    send(stream, &response);
}

/// The peer must be this process's user or root (unix(7), SO_PEERCRED:
/// the credentials are the peer's at connect time, not forgeable), and
/// must live in this process's user namespace. The second rule is what
/// keeps a sandboxed server out when mcpbox runs unprivileged: inside its
/// own user namespace the server's uid maps to the caller's, so the uid
/// alone would let it in had a policy mounted this directory. A peer whose
/// pid this process cannot see (pid 0: another pid namespace) is refused
/// too. Returns who the peer is, for the records (`cli:uid=N`).
fn check_peer(stream: &UnixStream) -> Result<String, String> {
    let cred = rustix::net::sockopt::socket_peercred(stream)
        .map_err(|e| format!("reading the peer's credentials: {e}"))?;
    let ours = rustix::process::geteuid();
    let theirs = cred.uid;
    if !(theirs == ours || theirs.is_root()) {
        return Err(format!(
            "the peer's uid {} is neither this server's ({}) nor root",
            theirs.as_raw(),
            ours.as_raw()
        ));
    }
    let pid = cred.pid.as_raw_nonzero().get();
    if pid <= 0 {
        return Err("the peer's process is not visible from here (another pid namespace)".into());
    }
    let own = std::fs::read_link("/proc/self/ns/user")
        .map_err(|e| format!("reading this process's user namespace: {e}"))?;
    let peer = std::fs::read_link(format!("/proc/{pid}/ns/user"))
        .map_err(|e| format!("reading the peer's user namespace: {e}"))?;
    if own != peer {
        return Err(
            "the peer runs in another user namespace (a sandbox cannot use the control socket)"
                .into(),
        );
    }
    Ok(format!("cli:uid={}", theirs.as_raw()))
}

/// Reads one line (newline excluded; end of stream also ends a non-empty
/// line) by `deadline`, of at most [`MAX_REQUEST`] bytes.
fn read_line(stream: &mut UnixStream, deadline: Instant) -> Result<Vec<u8>, String> {
    let mut line = Vec::new();
    let mut chunk = [0u8; 8192];
    loop {
        let now = Instant::now();
        if now >= deadline {
            return Err(timed_out());
        }
        stream
            .set_read_timeout(Some(deadline - now))
            .map_err(|e| format!("setting the read timeout: {e}"))?;
        let n = match stream.read(&mut chunk) {
            Ok(n) => n,
            Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
            Err(e)
                if matches!(
                    e.kind(),
                    io::ErrorKind::WouldBlock | io::ErrorKind::TimedOut
                ) =>
            {
                return Err(timed_out())
            }
            Err(e) => return Err(format!("reading the request: {e}")),
        };
        if n == 0 {
            if line.is_empty() {
                return Err("the connection closed before a request".into());
            }
            return Ok(line);
        }
        let (part, done) = match chunk[..n].iter().position(|&b| b == b'\n') {
            Some(i) => (&chunk[..i], true),
            None => (&chunk[..n], false),
        };
        if line.len() + part.len() > MAX_REQUEST {
            return Err(format!("a request line is at most {MAX_REQUEST} bytes"));
        }
        line.extend_from_slice(part);
        if done {
            return Ok(line);
        }
    }
}

fn timed_out() -> String {
    format!(
        "no complete request line within {} seconds",
        READ_TIMEOUT.as_secs()
    )
}

/// Writes the response line and closes; a client that left is not an error
/// worth more than a debug line.
fn send(mut stream: UnixStream, response: &Response) {
    if let Err(e) = stream.write_all(response.to_line().as_bytes()) {
        tracing::debug!(error = %e, "writing a control response");
    }
    let _ = stream.shutdown(std::net::Shutdown::Both);
}

/// What can go wrong calling the control socket.
#[derive(Debug, thiserror::Error)]
pub enum ClientError {
    #[error("no mcpbox serve is running with control socket {path}: start one, or pass --state-dir / MCPBOX_STATE_DIR")]
    NotRunning { path: PathBuf },
    #[error("connecting to the control socket {path}: {source}")]
    Connect { path: PathBuf, source: io::Error },
    #[error("talking to the control socket {path}: {source}")]
    Io { path: PathBuf, source: io::Error },
    #[error("the control socket {path} answered with a malformed line: {}", crate::render::escape(.detail))]
    Malformed { path: PathBuf, detail: String },
    /// The server refused or the operation failed: its error text, as
    /// sent in `message`; displayed with control characters escaped, since
    /// it may quote a task name or a path a sandbox chose.
    #[error("{}", crate::render::escape(.message))]
    Refused { message: String },
}

/// Sends one request to the `serve` listening on `path` and returns the
/// response's `result`.
pub fn call(path: &Path, request: &Request) -> Result<serde_json::Value, ClientError> {
    let mut stream = UnixStream::connect(path).map_err(|source| match source.kind() {
        io::ErrorKind::NotFound | io::ErrorKind::ConnectionRefused => ClientError::NotRunning {
            path: path.to_owned(),
        },
        _ => ClientError::Connect {
            path: path.to_owned(),
            source,
        },
    })?;
    let io_err = |source| ClientError::Io {
        path: path.to_owned(),
        source,
    };
    stream
        .set_write_timeout(Some(READ_TIMEOUT))
        .map_err(io_err)?;
    stream
        .set_read_timeout(Some(CLIENT_TIMEOUT))
        .map_err(io_err)?;
    let mut line = serde_json::to_vec(request).map_err(|e| ClientError::Malformed {
        path: path.to_owned(),
        detail: format!("the request did not serialise: {e}"),
    })?;
    line.push(b'\n');
    // A server that refuses the peer answers and closes before reading: a
    // failed write then still leaves its answer to read.
    let written = stream.write_all(&line);
    let mut answer = Vec::new();
    let read = BufReader::new(&stream)
        .take(16 * 1024 * 1024)
        .read_until(b'\n', &mut answer);
    if answer.is_empty() {
        written.map_err(io_err)?;
        read.map_err(io_err)?;
        return Err(ClientError::Malformed {
            path: path.to_owned(),
            detail: "the connection closed without an answer".into(),
        });
    }
    let response: Response =
        serde_json::from_slice(&answer).map_err(|e| ClientError::Malformed {
            path: path.to_owned(),
            detail: e.to_string(),
        })?;
    match (response.ok, response.result, response.error) {
        (true, result, _) => Ok(result.unwrap_or(serde_json::Value::Null)),
        (false, _, error) => Err(ClientError::Refused {
            message: error.unwrap_or_else(|| "the server gave no reason".into()),
        }),
    }
}

/// [`call`], with the result as the type the op returns (see the module
/// docs: `list` gives `Vec<SandboxInfo>`, and so on).
pub fn call_as<T: serde::de::DeserializeOwned>(
    path: &Path,
    request: &Request,
) -> Result<T, ClientError> {
    let value = call(path, request)?;
    serde_json::from_value(value).map_err(|e| ClientError::Malformed {
        path: path.to_owned(),
        detail: format!(
            "the result of {} is not what it should be: {e}",
            request.op()
        ),
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{Artifact, Exported, SandboxInfo, SnapshotInfo, Teardown};

    /// A backend no test request may reach.
    struct Unreachable;

    impl Control for Unreachable {
        fn list(&self) -> Vec<SandboxInfo> {
            Vec::new()
        }
        fn show(&self, id: &str) -> Result<SandboxInfo, String> {
            panic!("show {id:?} reached the backend")
        }
        fn pause(&self, id: &str) -> Result<SandboxInfo, String> {
            panic!("pause {id:?} reached the backend")
        }
        fn resume(&self, id: &str) -> Result<SandboxInfo, String> {
            panic!("resume {id:?} reached the backend")
        }
        fn snapshot(&self, id: &str, _: &Path, _: bool, _: bool) -> Result<SnapshotInfo, String> {
            panic!("snapshot {id:?} reached the backend")
        }
        fn restore(
            &self,
            archive: &Path,
            _: &str,
            _: &str,
            _: Option<&str>,
        ) -> Result<SandboxInfo, String> {
            panic!("restore {archive:?} reached the backend")
        }
        fn destroy(
            &self,
            id: &str,
            _approved: &crate::artifacts::Approved,
        ) -> Result<Teardown, String> {
            panic!("destroy {id:?} reached the backend")
        }
        fn artifacts(&self, id: &str) -> Result<Vec<Artifact>, String> {
            panic!("artifacts {id:?} reached the backend")
        }
        fn export(
            &self,
            id: &str,
            _: &Path,
            _: &crate::artifacts::Approved,
        ) -> Result<Vec<Exported>, String> {
            panic!("export {id:?} reached the backend")
        }
    }

    #[test]
    fn handle_line_checks_every_input_before_the_backend_without_a_socket() {
        for line in [
            r#"{"op":"destroy","id":"sb-../../x"}"#,
            r#"{"op":"snapshot","id":"sb-0123456789abcdef","archive":"rel.tar"}"#,
            r#"{"op":"snapshot","id":"sb-0123456789abcdef","archive":"/a\u0000b"}"#,
            r#"{"op":"restore","archive":"/a","agent":"a/b","server":"s"}"#,
            r#"{"op":"restore","archive":"/a","agent":"a","server":"s","task":"\u001b[2J"}"#,
            r#"{"op":"export","id":"sb-0123456789abcdef","dest":"/d","approve_large":{"a":"yes"}}"#,
        ] {
            let r = handle_line(&Unreachable, line.as_bytes());
            assert!(!r.ok, "{line}");
            assert!(r.result.is_none());
        }
        let r = handle_line(&Unreachable, br#"{"op":"list"}"#);
        assert_eq!(r, Response::ok(serde_json::json!([])));
    }

    #[test]
    fn a_refusal_quoting_a_hostile_name_displays_escaped() {
        let e = ClientError::Refused {
            message: "no sandbox for task \x1b[2J".into(),
        };
        assert!(!e.to_string().contains('\x1b'), "{e}");
    }
}
