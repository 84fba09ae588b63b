//! The control socket against a fake `Control` that records its calls,
//! over a real unix socket in a tempdir.
// Helpers outside #[test] fns unwrap too (as the other crates' tests do).
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::io::{Read, Write};
use std::os::unix::fs::PermissionsExt;
use std::os::unix::net::{UnixListener, UnixStream};
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use mcpbox_lifecycle::artifacts::Approved;
use mcpbox_lifecycle::control::{self, call, call_as, ClientError, Request, Response};
use mcpbox_lifecycle::{Artifact, Control, Exported, SandboxInfo, SnapshotInfo, State, Teardown};

const ID: &str = "sb-0123456789abcdef";
/// An id of the right shape the fake does not know.
const MISSING: &str = "sb-ffffffffffffffff";

#[derive(Default)]
struct Fake {
    calls: Mutex<Vec<String>>,
}

impl Fake {
    fn record(&self, call: String) {
        self.calls.lock().unwrap().push(call);
    }

    fn calls(&self) -> Vec<String> {
        self.calls.lock().unwrap().clone()
    }

    fn known(&self, id: &str) -> Result<(), String> {
        if id == ID {
            Ok(())
        } else {
            Err(format!("no sandbox {id}"))
        }
    }
}

fn info() -> SandboxInfo {
    SandboxInfo {
        id: ID.into(),
        agent: "alice".into(),
        server: "fs".into(),
        task: Some("t1".into()),
        template: None,
        state: State::Running,
        workspace: "/state/sb/sb-0123456789abcdef".into(),
        idle_seconds: 7,
        created: "2025-01-02T03:04:05Z".into(),
        sessions: 1,
        processes: 2,
        cpu_usec: None,
        memory_bytes: None,
        freezer: Some("v2".into()),
        note: None,
    }
}

fn exported() -> Vec<Exported> {
    vec![Exported {
        path: "report.txt".into(),
        size: 3,
        sha256: "ab".repeat(32),
    }]
}

impl Control for Fake {
    fn list(&self) -> Vec<SandboxInfo> {
        self.record("list".into());
        vec![info()]
    }

    fn show(&self, id: &str) -> Result<SandboxInfo, String> {
        self.record(format!("show {id}"));
        self.known(id).map(|()| info())
    }

    fn pause(&self, id: &str) -> Result<SandboxInfo, String> {
        self.record(format!("pause {id}"));
        self.known(id).map(|()| SandboxInfo {
            state: State::Paused,
            ..info()
        })
    }

    fn resume(&self, id: &str) -> Result<SandboxInfo, String> {
        self.record(format!("resume {id}"));
        self.known(id).map(|()| info())
    }

    fn snapshot(
        &self,
        id: &str,
        archive: &Path,
        include_tmp: bool,
        memory: bool,
    ) -> Result<SnapshotInfo, String> {
        let memory = if memory { " memory" } else { "" };
        self.record(format!(
            "snapshot {id} {} {include_tmp}{memory}",
            archive.display()
        ));
        self.known(id).map(|()| SnapshotInfo {
            archive: archive.to_owned(),
            entries: 4,
            bytes: 1000,
            manifest_sha256: "cd".repeat(32),
            skipped: vec![],
        })
    }

    fn restore(
        &self,
        archive: &Path,
        agent: &str,
        server: &str,
        task: Option<&str>,
    ) -> Result<SandboxInfo, String> {
        self.record(format!(
            "restore {} {agent} {server} {task:?}",
            archive.display()
        ));
        Ok(SandboxInfo {
            agent: agent.into(),
            server: server.into(),
            task: task.map(String::from),
            state: State::Created,
            ..info()
        })
    }

    fn destroy(&self, id: &str, _approved: &Approved) -> Result<Teardown, String> {
        self.record(format!("destroy {id}"));
        self.known(id).map(|()| Teardown {
            id: id.into(),
            exported: exported(),
            revoked: vec![("TOKEN".into(), "exit 0".into())],
            left: vec![],
        })
    }

    fn artifacts(&self, id: &str) -> Result<Vec<Artifact>, String> {
        self.record(format!("artifacts {id}"));
        self.known(id).map(|()| {
            vec![Artifact {
                path: "report.txt".into(),
                size: 3,
                refused: None,
            }]
        })
    }

    fn export(&self, id: &str, dest: &Path, approved: &Approved) -> Result<Vec<Exported>, String> {
        self.record(format!("export {id} {} {approved:?}", dest.display()));
        self.known(id).map(|()| exported())
    }
}

struct Setup {
    _dir: tempfile::TempDir,
    socket: PathBuf,
    fake: Arc<Fake>,
    server: control::Server,
}

fn setup() -> Setup {
    let dir = tempfile::tempdir().unwrap();
    let socket = dir.path().join("run").join("control.sock");
    let fake = Arc::new(Fake::default());
    let server = control::serve(&socket, fake.clone()).unwrap();
    Setup {
        _dir: dir,
        socket,
        fake,
        server,
    }
}

/// Sends raw bytes and reads the one response line.
fn raw(socket: &Path, bytes: &[u8]) -> Response {
    let mut s = UnixStream::connect(socket).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(30))).unwrap();
    // The server may stop reading (and close) before we are done writing.
    let _ = s.write_all(bytes);
    let mut answer = String::new();
    s.read_to_string(&mut answer).unwrap();
    assert!(answer.ends_with('\n'), "{answer:?}");
    serde_json::from_str(answer.trim_end()).unwrap()
}

fn refusal(r: Result<serde_json::Value, ClientError>) -> String {
    match r {
        Err(ClientError::Refused { message }) => message,
        other => panic!("expected a refusal, got {other:?}"),
    }
}

#[test]
fn control_socket_is_private_to_its_owner() {
    let s = setup();
    let mode = |p: &Path| std::fs::metadata(p).unwrap().permissions().mode() & 0o7777;
    assert_eq!(mode(&s.socket), 0o600);
    assert_eq!(mode(s.socket.parent().unwrap()), 0o700);
    assert!(s.fake.calls().is_empty());
}

#[test]
fn a_peer_with_another_uid_is_refused() {
    use std::os::unix::process::CommandExt;

    if !rustix::process::geteuid().is_root() {
        eprintln!(
            "skipped: a_peer_with_another_uid_is_refused needs root to run a client as uid 65534"
        );
        return;
    }
    let python = Path::new("/usr/bin/python3");
    if !python.exists() {
        assert!(
            std::env::var("CI").as_deref() != Ok("true"),
            "/usr/bin/python3 is needed for the uid 65534 client under CI"
        );
        eprintln!("skipped: a_peer_with_another_uid_is_refused needs /usr/bin/python3 as a client");
        return;
    }
    let s = setup();
    // Let uid 65534 reach and connect to the socket, so that the check
    // under test is the SO_PEERCRED one and not the file modes.
    let set = |p: &Path, m: u32| std::fs::set_permissions(p, std::fs::Permissions::from_mode(m));
    set(s.socket.parent().unwrap().parent().unwrap(), 0o711).unwrap();
    set(s.socket.parent().unwrap(), 0o711).unwrap();
    set(&s.socket, 0o666).unwrap();
    let client = r#"
import socket, sys
s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
s.settimeout(30)
s.connect(sys.argv[1])
try:
    s.sendall(b'{"op":"list"}\n')
except OSError:
    pass
sys.stdout.write(s.makefile().readline())
"#;
    let out = std::process::Command::new(python)
        .arg("-c")
        .arg(client)
        .arg(&s.socket)
        .current_dir("/")
        .env_clear()
        .uid(65534)
        .gid(65534)
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "client failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let response: Response = serde_json::from_slice(&out.stdout).unwrap();
    assert!(!response.ok);
    let error = response.error.unwrap();
    assert!(error.contains("uid 65534"), "{error}");
    assert!(s.fake.calls().is_empty(), "{:?}", s.fake.calls());
}

#[test]
fn an_id_that_escapes_is_refused_before_the_backend_sees_it() {
    let s = setup();
    let bad = "sb-../../x";
    let requests = [
        Request::Show { id: bad.into() },
        Request::Pause { id: bad.into() },
        Request::Resume { id: bad.into() },
        Request::Destroy {
            id: bad.into(),
            approve_large: Approved::new(),
        },
        Request::Artifacts {
            id: "../../../etc".into(),
        },
        Request::Snapshot {
            id: "sb-0123456789ABCDEF".into(),
            archive: "/tmp/a.tar".into(),
            include_tmp: false,
            memory: false,
        },
        Request::Export {
            id: format!("{ID}/.."),
            dest: "/tmp/out".into(),
            approve_large: Approved::new(),
        },
    ];
    for r in &requests {
        let message = refusal(call(&s.socket, r));
        assert!(message.contains("is not a sandbox id"), "{message}");
    }
    // Names and tasks of a restore are checked as well.
    for (agent, server, task) in [
        ("../alice", "fs", None),
        ("alice", "FS", None),
        ("alice", &"x".repeat(64)[..], None),
        ("alice", "fs", Some("../t")),
        ("alice", "fs", Some(".hidden")),
    ] {
        let r = Request::Restore {
            archive: "/tmp/a.tar".into(),
            agent: agent.into(),
            server: server.into(),
            task: task.map(String::from),
        };
        assert!(refusal(call(&s.socket, &r)).starts_with("refused: "));
    }
    assert!(s.fake.calls().is_empty(), "{:?}", s.fake.calls());
}

#[test]
fn relative_paths_are_refused() {
    let s = setup();
    let requests = [
        Request::Snapshot {
            id: ID.into(),
            archive: "a.tar".into(),
            include_tmp: false,
            memory: false,
        },
        Request::Restore {
            archive: "../a.tar".into(),
            agent: "alice".into(),
            server: "fs".into(),
            task: None,
        },
        Request::Export {
            id: ID.into(),
            dest: "out".into(),
            approve_large: Approved::from([("big.bin".to_string(), 4096)]),
        },
        Request::Export {
            id: ID.into(),
            dest: "".into(),
            approve_large: Approved::new(),
        },
    ];
    for r in &requests {
        let message = refusal(call(&s.socket, r));
        assert!(message.contains("is not an absolute path"), "{message}");
    }
    assert!(s.fake.calls().is_empty(), "{:?}", s.fake.calls());
}

#[test]
fn unknown_fields_are_refused() {
    let s = setup();
    for line in [
        r#"{"op":"list","all":true}"#,
        r#"{"op":"show","id":"sb-0123456789abcdef","force":true}"#,
        r#"{"op":"export","id":"sb-0123456789abcdef","dest":"/x","approve_large":{},"dangerously_follow_symlinks":true}"#,
        r#"{"op":"format_disk"}"#,
        r#"{"id":"sb-0123456789abcdef"}"#,
        r#"{"op":"show"}"#,
        "not json",
    ] {
        let r = raw(&s.socket, format!("{line}\n").as_bytes());
        assert!(!r.ok, "{line}");
        assert!(
            r.error
                .as_deref()
                .unwrap()
                .starts_with("malformed request: "),
            "{line}: {r:?}"
        );
    }
    assert!(s.fake.calls().is_empty(), "{:?}", s.fake.calls());
}

#[test]
fn an_overlong_request_is_refused() {
    let s = setup();
    let padding = "x".repeat(control::MAX_REQUEST);
    let line = format!("{{\"op\":\"show\",\"id\":\"{padding}\"}}\n");
    let r = raw(&s.socket, line.as_bytes());
    assert!(!r.ok);
    assert!(
        r.error.as_deref().unwrap().contains("at most 65536 bytes"),
        "{r:?}"
    );
    assert!(s.fake.calls().is_empty());
    // A line of exactly the limit is read (and then fails as JSON).
    let line = format!("{}\n", "y".repeat(control::MAX_REQUEST));
    let r = raw(&s.socket, line.as_bytes());
    assert!(r.error.unwrap().starts_with("malformed request"));
}

#[test]
fn a_silent_client_does_not_block_others() {
    let s = setup();
    let mut silent = UnixStream::connect(&s.socket).unwrap();
    let list: Vec<SandboxInfo> = call_as(&s.socket, &Request::List {}).unwrap();
    assert_eq!(list, vec![info()]);
    // The list was answered while the silent client still waited for its
    // own answer: nothing has come back to it yet.
    silent.set_nonblocking(true).unwrap();
    let mut buf = [0u8; 256];
    let early = silent.read(&mut buf);
    assert!(
        matches!(&early, Err(e) if e.kind() == std::io::ErrorKind::WouldBlock),
        "{early:?}"
    );
    // It loses its connection after the read timeout, with a reason.
    silent.set_nonblocking(false).unwrap();
    silent
        .set_read_timeout(Some(control::READ_TIMEOUT * 4))
        .unwrap();
    let mut answer = String::new();
    silent.read_to_string(&mut answer).unwrap();
    let r: Response = serde_json::from_str(answer.trim_end()).unwrap();
    assert!(r.error.unwrap().contains("no complete request line"));
}

#[test]
fn connections_over_the_cap_are_told_the_server_is_busy() {
    let s = setup();
    let silent: Vec<UnixStream> = (0..control::MAX_CONNECTIONS)
        .map(|_| UnixStream::connect(&s.socket).unwrap())
        .collect();
    // Connections are counted as the accept thread takes them, in order:
    // the next one is over the cap until one of the silent ones times out.
    let message = refusal(call(&s.socket, &Request::List {}));
    assert!(message.starts_with("busy: "), "{message}");
    drop(silent);
    assert!(s.fake.calls().is_empty());
}

#[test]
fn a_stale_socket_is_replaced_and_a_live_one_is_not() {
    let dir = tempfile::tempdir().unwrap();
    let socket = dir.path().join("control.sock");
    // A socket whose server died: the file stays, nobody accepts.
    drop(UnixListener::bind(&socket).unwrap());
    assert!(matches!(
        call(&socket, &Request::List {}),
        Err(ClientError::NotRunning { .. })
    ));
    let fake = Arc::new(Fake::default());
    let server = control::serve(&socket, fake.clone()).unwrap();
    assert!(call(&socket, &Request::List {}).is_ok());
    // A second serve on a live socket is refused and leaves it working.
    let err = control::serve(&socket, Arc::new(Fake::default()))
        .err()
        .unwrap();
    assert_eq!(
        err.to_string(),
        format!("another mcpbox serve holds {}", socket.display())
    );
    assert!(call(&socket, &Request::List {}).is_ok());
    assert_eq!(fake.calls(), ["list", "list"]);
    // Stopping removes the socket file.
    server.stop();
    assert!(!socket.exists());
    // What is not a socket is never removed.
    std::fs::write(&socket, "precious").unwrap();
    let err = control::serve(&socket, Arc::new(Fake::default()))
        .err()
        .unwrap();
    assert!(matches!(err, control::Error::NotSocket { .. }), "{err}");
    assert_eq!(std::fs::read_to_string(&socket).unwrap(), "precious");
}

#[test]
fn client_says_no_server_is_running() {
    let dir = tempfile::tempdir().unwrap();
    let socket = dir.path().join("nothing.sock");
    let err = call(&socket, &Request::List {}).unwrap_err();
    assert!(matches!(err, ClientError::NotRunning { .. }));
    assert_eq!(
        err.to_string(),
        format!(
            "no mcpbox serve is running with control socket {}: start one, or pass --state-dir / MCPBOX_STATE_DIR",
            socket.display()
        )
    );
}

#[test]
fn a_failed_operation_reaches_the_client_as_the_backends_error() {
    let s = setup();
    let message = refusal(call(&s.socket, &Request::Show { id: MISSING.into() }));
    assert_eq!(message, format!("no sandbox {MISSING}"));
}

#[test]
fn every_op_round_trips() {
    let s = setup();
    let p = &s.socket;
    let got: Vec<SandboxInfo> = call_as(p, &Request::List {}).unwrap();
    assert_eq!(got, vec![info()]);
    let got: SandboxInfo = call_as(p, &Request::Show { id: ID.into() }).unwrap();
    assert_eq!(got, info());
    let got: SandboxInfo = call_as(p, &Request::Pause { id: ID.into() }).unwrap();
    assert_eq!(got.state, State::Paused);
    let got: SandboxInfo = call_as(p, &Request::Resume { id: ID.into() }).unwrap();
    assert_eq!(got, info());
    let got: SnapshotInfo = call_as(
        p,
        &Request::Snapshot {
            id: ID.into(),
            archive: "/backups/a.tar.zst".into(),
            include_tmp: true,
            memory: false,
        },
    )
    .unwrap();
    assert_eq!(got.archive, Path::new("/backups/a.tar.zst"));
    assert_eq!((got.entries, got.bytes), (4, 1000));
    let got: SandboxInfo = call_as(
        p,
        &Request::Restore {
            archive: "/backups/a.tar.zst".into(),
            agent: "bob".into(),
            server: "git-2".into(),
            task: Some("issue-42".into()),
        },
    )
    .unwrap();
    assert_eq!(
        (got.agent.as_str(), got.server.as_str(), got.task.as_deref()),
        ("bob", "git-2", Some("issue-42"))
    );
    let got: Vec<Artifact> = call_as(p, &Request::Artifacts { id: ID.into() }).unwrap();
    assert_eq!(got.len(), 1);
    let got: Vec<Exported> = call_as(
        p,
        &Request::Export {
            id: ID.into(),
            dest: "/home/op/out".into(),
            approve_large: Approved::new(),
        },
    )
    .unwrap();
    assert_eq!(got, exported());
    let got: Teardown = call_as(
        p,
        &Request::Destroy {
            id: ID.into(),
            approve_large: Approved::new(),
        },
    )
    .unwrap();
    assert!(got.clean());
    assert_eq!(got.revoked, [("TOKEN".to_owned(), "exit 0".to_owned())]);
    assert_eq!(
        s.fake.calls(),
        [
            "list".to_owned(),
            format!("show {ID}"),
            format!("pause {ID}"),
            format!("resume {ID}"),
            format!("snapshot {ID} /backups/a.tar.zst true"),
            "restore /backups/a.tar.zst bob git-2 Some(\"issue-42\")".to_owned(),
            format!("artifacts {ID}"),
            format!("export {ID} /home/op/out {{}}"),
            format!("destroy {ID}"),
        ]
    );
    drop(s.server);
}

#[test]
fn requests_have_the_documented_wire_shape() {
    let line = |r: &Request| serde_json::to_string(r).unwrap();
    assert_eq!(line(&Request::List {}), r#"{"op":"list"}"#);
    assert_eq!(
        line(&Request::Show { id: ID.into() }),
        format!(r#"{{"op":"show","id":"{ID}"}}"#)
    );
    assert_eq!(
        line(&Request::Snapshot {
            id: ID.into(),
            archive: "/a".into(),
            include_tmp: false,
            memory: true,
        }),
        format!(
            r#"{{"op":"snapshot","id":"{ID}","archive":"/a","include_tmp":false,"memory":true}}"#
        )
    );
    // an older client's line, without `memory`: no memory
    let old: Request = serde_json::from_str(&format!(
        r#"{{"op":"snapshot","id":"{ID}","archive":"/a","include_tmp":false}}"#
    ))
    .unwrap();
    assert!(matches!(old, Request::Snapshot { memory: false, .. }));
    assert_eq!(
        line(&Request::Restore {
            archive: "/a".into(),
            agent: "alice".into(),
            server: "fs".into(),
            task: None
        }),
        r#"{"op":"restore","archive":"/a","agent":"alice","server":"fs","task":null}"#
    );
    assert_eq!(
        line(&Request::Export {
            id: ID.into(),
            dest: "/d".into(),
            approve_large: Approved::from([("big.bin".to_string(), 4096)])
        }),
        format!(r#"{{"op":"export","id":"{ID}","dest":"/d","approve_large":{{"big.bin":4096}}}}"#)
    );
    // The optional fields may be left out.
    let r: Request =
        serde_json::from_str(r#"{"op":"restore","archive":"/a","agent":"a","server":"s"}"#)
            .unwrap();
    assert_eq!(
        r,
        Request::Restore {
            archive: "/a".into(),
            agent: "a".into(),
            server: "s".into(),
            task: None
        }
    );
    assert_eq!(
        Response::ok(serde_json::json!([])).to_line(),
        "{\"ok\":true,\"result\":[]}\n"
    );
    assert_eq!(
        Response::error("no").to_line(),
        "{\"ok\":false,\"error\":\"no\"}\n"
    );
}
