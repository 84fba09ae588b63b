//! Shared helpers for the integration tests: locate the real binaries, make
//! a workspace on the host, write a policy, run `mcpbox exec` with the
//! probe inside.
#![allow(dead_code, clippy::unwrap_used, clippy::expect_used)]

pub mod audit;
pub mod http;
pub mod mcp;
pub mod peers;
pub mod public_net;
pub mod pypi;
pub mod runtimes;
pub mod serve;
pub mod smallfs;

use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};

/// The mcpbox binary under test (MCPBOX_BIN overrides, for the rootless run).
pub fn mcpbox() -> PathBuf {
    std::env::var_os("MCPBOX_BIN")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from(env!("CARGO_BIN_EXE_mcpbox")))
}

/// A client script of `tests/interop` (MCPBOX_INTEROP_DIR overrides the
/// directory, for the rootless run, whose user may not read the checkout).
pub fn interop_script(name: &str) -> PathBuf {
    std::env::var_os("MCPBOX_INTEROP_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|| Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/interop"))
        .join(name)
}

/// The probe binary (built by `cargo build --workspace`).
pub fn probe() -> PathBuf {
    if let Some(p) = std::env::var_os("MCPBOX_PROBE") {
        return PathBuf::from(p);
    }
    let p = Path::new(env!("CARGO_BIN_EXE_mcpbox")).with_file_name("mcpbox-probe");
    assert!(
        p.exists(),
        "{} is missing: build it with `cargo build -p mcpbox-probe`",
        p.display()
    );
    p
}

/// Raises this test process's soft limit of open files to its hard one:
/// the test binary is one process for every module (the rootless pass
/// runs it with two test threads), and a test that holds a thousand
/// connections must not take the last descriptors of a test beside it.
pub fn raise_fd_limit() {
    use rustix::process::{getrlimit, setrlimit, Resource, Rlimit};
    let limit = getrlimit(Resource::Nofile);
    let _ = setrlimit(
        Resource::Nofile,
        Rlimit {
            current: limit.maximum,
            maximum: limit.maximum,
        },
    );
}

pub fn is_root() -> bool {
    use std::os::unix::fs::MetadataExt;
    std::fs::metadata("/proc/self")
        .map(|m| m.uid() == 0)
        .unwrap_or(false)
}

/// A host directory laid out for one test: `input/` (with the probe in
/// it), `output/`, and room for host-only files next to them.
pub struct Workspace {
    pub dir: tempfile::TempDir,
}

impl Workspace {
    pub fn new() -> Workspace {
        let dir = tempfile::Builder::new()
            .prefix("mcpbox-test-")
            .tempdir()
            .expect("tempdir");
        let ws = Workspace { dir };
        std::fs::set_permissions(ws.path(), std::fs::Permissions::from_mode(0o755)).expect("chmod");
        std::fs::create_dir(ws.input()).expect("mkdir input");
        std::fs::create_dir(ws.output()).expect("mkdir output");
        std::fs::copy(probe(), ws.input().join("probe")).expect("copy probe");
        std::fs::set_permissions(
            ws.input().join("probe"),
            std::fs::Permissions::from_mode(0o755),
        )
        .expect("chmod");
        std::fs::write(ws.input().join("hello.txt"), "hello from the host\n").expect("write");
        if is_root() {
            // The sandbox runs as host nobody when mcpbox is root.
            std::os::unix::fs::chown(ws.output(), Some(65534), Some(65534)).expect("chown output");
        }
        ws
    }

    pub fn path(&self) -> &Path {
        self.dir.path()
    }
    pub fn input(&self) -> PathBuf {
        self.path().join("input")
    }
    pub fn output(&self) -> PathBuf {
        self.path().join("output")
    }

    /// A workspace with the test server `name` copied into input/ (run it
    /// as `/workspace/input/NAME`).
    pub fn with_server(name: &str) -> Workspace {
        let ws = Workspace::new();
        let dst = ws.input().join(name);
        std::fs::copy(mcp::testserver(name), &dst).expect("copy the test server");
        std::fs::set_permissions(&dst, std::fs::Permissions::from_mode(0o755)).expect("chmod");
        ws
    }

    /// Writes `policy.toml` with `input`/`output` set, plus `extra` TOML
    /// (which may add keys to [filesystem] by starting with them).
    pub fn policy(&self, extra: &str) -> PathBuf {
        let text = format!("[filesystem]\ninput = \"input\"\noutput = \"output\"\n{extra}\n");
        let path = self.path().join("policy.toml");
        std::fs::write(&path, text).expect("write policy");
        path
    }

    /// Writes a policy file with exactly `text`.
    pub fn raw_policy(&self, text: &str) -> PathBuf {
        let path = self.path().join("policy.toml");
        std::fs::write(&path, text).expect("write policy");
        path
    }

    /// Runs the probe in the sandbox under `policy`.
    pub fn probe(&self, policy: &Path, args: &[&str]) -> Output {
        let mut cmd = Command::new(mcpbox());
        cmd.arg("exec")
            .arg("--policy")
            .arg(policy)
            .arg("--")
            .arg("/workspace/input/probe")
            .args(args);
        cmd.stdin(Stdio::null());
        cmd.output().expect("run mcpbox")
    }

    /// The probe's one-line answer, checked for a clean exit of mcpbox.
    pub fn probe_line(&self, policy: &Path, args: &[&str]) -> String {
        let out = self.probe(policy, args);
        let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
        assert!(
            out.status.code() == Some(0),
            "mcpbox exited with {:?}\nstdout: {stdout}\nstderr: {}",
            out.status,
            String::from_utf8_lossy(&out.stderr)
        );
        stdout.trim().to_string()
    }
}

/// Asserts the probe reported a refusal (and not success).
#[track_caller]
pub fn assert_refused(line: &str) {
    assert!(
        line.starts_with("err "),
        "expected the attempt to be refused, got: {line}"
    );
}

/// Asserts the probe reported success.
#[track_caller]
pub fn assert_worked(line: &str) {
    assert!(
        line.starts_with("ok"),
        "expected the attempt to work, got: {line}"
    );
}

/// Runs `mcpbox exec -- true` under `policy`, asserts that mcpbox refused
/// to start (exit 125), and returns its error message.
#[track_caller]
pub fn refused_start(policy: &Path) -> String {
    let out = run(&[
        "exec",
        "--policy",
        policy.to_str().expect("utf-8 path"),
        "--",
        "true",
    ]);
    assert_eq!(
        out.status.code(),
        Some(125),
        "mcpbox should refuse to start"
    );
    String::from_utf8_lossy(&out.stderr).into_owned()
}

/// Runs `mcpbox` with arbitrary arguments.
pub fn run(args: &[&str]) -> Output {
    Command::new(mcpbox())
        .args(args)
        .stdin(Stdio::null())
        .output()
        .expect("run mcpbox")
}

/// Runs `git ARGS` in `repo` with a fixed identity (commits need one and
/// the test machine may have none); panics if git fails.
pub fn git(repo: &Path, args: &[&str]) {
    let out = Command::new("git")
        .args([
            "-c",
            "user.name=mcpbox-test",
            "-c",
            "user.email=test@localhost",
        ])
        .args(args)
        .current_dir(repo)
        .output()
        .expect("run git");
    assert!(out.status.success(), "git {args:?}: {out:?}");
}

/// A git repository at `repo` (made here) as client.py's `git` scenario
/// expects it: one commit, "first commit from root", of README, and an
/// untracked file.
pub fn git_repo(repo: &Path) {
    std::fs::create_dir(repo).unwrap();
    git(repo, &["init", "-q", "-b", "main"]);
    std::fs::write(repo.join("README"), "a repository\n").unwrap();
    git(repo, &["add", "README"]);
    git(repo, &["commit", "-q", "-m", "first commit from root"]);
    std::fs::write(repo.join("untracked.txt"), "new\n").unwrap();
}
