//! A real `mcpbox serve` for a test: config and policies written into a
//! temporary directory, the gateway started on a free loopback port (the
//! port read from its "serving on" line), stopped with SIGTERM on drop.

use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

/// A running gateway.
pub struct Serve {
    pub child: Child,
    pub port: u16,
    pub dir: tempfile::TempDir,
    stderr: Arc<Mutex<String>>,
}

impl Serve {
    /// Writes `files` (name, text) into a fresh directory, then starts
    /// `mcpbox serve --config <dir>/serve.toml` with `env`. `serve.toml`
    /// must be among the files; its `listen.address` should use port 0.
    pub fn start(files: &[(&str, String)], env: &[(&str, &str)]) -> Serve {
        let dir = tempfile::Builder::new()
            .prefix("mcpbox-serve-")
            .tempdir()
            .expect("tempdir");
        for (name, text) in files {
            std::fs::write(dir.path().join(name), text).expect("write config file");
        }
        let mut cmd = Command::new(super::mcpbox());
        cmd.arg("serve")
            .arg("--config")
            .arg(dir.path().join("serve.toml"))
            .env("MCPBOX_STATE_DIR", dir.path().join("state"))
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::piped());
        for (k, v) in env {
            cmd.env(k, v);
        }
        let mut child = cmd.spawn().expect("start mcpbox serve");
        let stderr = Arc::new(Mutex::new(String::new()));
        let (tx, rx) = std::sync::mpsc::channel();
        let err = child.stderr.take().expect("stderr");
        let log = stderr.clone();
        std::thread::spawn(move || {
            for line in BufReader::new(err).lines().map_while(Result::ok) {
                if let Some(addr) = line.strip_prefix("mcpbox: serving on http://") {
                    let _ = tx.send(addr.rsplit(':').next().and_then(|p| p.parse::<u16>().ok()));
                }
                let mut l = log.lock().unwrap();
                l.push_str(&line);
                l.push('\n');
            }
        });
        let port = match rx.recv_timeout(Duration::from_secs(30)) {
            Ok(Some(p)) => p,
            _ => {
                let _ = child.kill();
                let _ = child.wait();
                std::thread::sleep(Duration::from_millis(100));
                panic!(
                    "mcpbox serve did not start; its stderr:\n{}",
                    stderr.lock().unwrap()
                );
            }
        };
        Serve {
            child,
            port,
            dir,
            stderr,
        }
    }

    /// `http://127.0.0.1:PORT` + `path`.
    pub fn url(&self, path: &str) -> String {
        format!("http://127.0.0.1:{}{path}", self.port)
    }

    /// What it logged so far.
    pub fn stderr(&self) -> String {
        self.stderr.lock().unwrap().clone()
    }

    /// The audit database of the gateway's state directory.
    pub fn audit_db(&self) -> PathBuf {
        self.dir.path().join("state/audit.db")
    }

    /// The config directory.
    pub fn path(&self) -> &Path {
        self.dir.path()
    }

    /// Sends SIGTERM and waits (up to 30 s) for the exit status.
    pub fn stop(&mut self) -> std::process::ExitStatus {
        let pid = self.child.id().to_string();
        let _ = Command::new("kill").args(["-TERM", &pid]).status();
        let until = Instant::now() + Duration::from_secs(30);
        loop {
            if let Ok(Some(s)) = self.child.try_wait() {
                return s;
            }
            if Instant::now() > until {
                let _ = self.child.kill();
                return self.child.wait().expect("wait");
            }
            std::thread::sleep(Duration::from_millis(20));
        }
    }
}

impl Drop for Serve {
    fn drop(&mut self) {
        if let Ok(None) = self.child.try_wait() {
            self.stop();
        }
    }
}

/// A policy that shows `binary` inside the sandbox at its host path.
pub fn binary_policy(name: &str, binary: &Path, tools: &str) -> String {
    format!(
        "[server]\nname = \"{name}\"\n{}\n[tools]\ndefault = \"allow\"\n{tools}\n",
        super::peers::mount_same_path(binary)
    )
}
