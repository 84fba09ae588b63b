//! The sandbox as the gateway sees it, for the rules over tool arguments
//! (`[[tools.arguments]]`, `tools.outside_paths`) and for host paths:
//! which sandbox directories stand for which host directories.
//!
//! - Paths in arguments are resolved as the sandbox would resolve them,
//!   symlinks included: each component is looked up (`lstat`, `readlink`)
//!   in the host directory behind the sandbox directory that holds it, so a
//!   symlink the server planted in /workspace/output that points at /etc
//!   is caught here too, not only by the sandbox.
//! - The host paths a client knows (`/home/u/proj/src/a.rs`, its roots)
//!   become the sandbox's (`/workspace/input/src/a.rs`).
//!
//! The check is coordination, not the boundary: between this check and the
//! server's use of the path the server can change its own links. What it
//! then reaches is what its sandbox mounts, no more.

use std::collections::VecDeque;
use std::path::PathBuf;

use mcpbox_policy::{PathMap, Resolve, WORKSPACE};
use mcpbox_sandbox::Spec;

/// Most symlinks followed in one path, as the kernel's limit (40, see
/// path_resolution(7)): more is an error, as ELOOP is.
const MAX_LINKS: usize = 40;

/// The sandbox directories a server was given, and the host directories
/// behind them.
#[derive(Debug, Clone, Default)]
pub struct SandboxView {
    /// (sandbox directory, host directory), longest sandbox path first.
    mounts: Vec<(String, PathBuf)>,
    /// What a path argument may name: /workspace and the policy's mounts.
    dirs: Vec<String>,
    map: PathMap,
}

impl SandboxView {
    /// The view of a sandbox started from `spec`: its input, output and tmp
    /// directories and its bind mounts (not mcpbox's own binary).
    pub fn for_spec(spec: &Spec) -> SandboxView {
        let mut mounts: Vec<(String, PathBuf)> = Vec::new();
        for (at, host) in [
            ("input", &spec.input),
            ("output", &spec.output),
            ("tmp", &spec.tmp_dir),
        ] {
            if let Some(h) = host {
                mounts.push((format!("{WORKSPACE}/{at}"), h.clone()));
            }
        }
        let mut dirs = vec![WORKSPACE.to_string()];
        for m in &spec.mounts {
            let at = m.at.to_string_lossy().into_owned();
            if at == crate::builtin::BIN_AT {
                continue;
            }
            dirs.push(at.clone());
            mounts.push((at, m.host.clone()));
        }
        mounts.sort_by(|a, b| b.0.len().cmp(&a.0.len()).then(a.cmp(b)));
        let map = PathMap::new(
            mounts
                .iter()
                .filter_map(|(at, host)| host.to_str().map(|h| (h.to_string(), at.clone()))),
        );
        SandboxView { mounts, dirs, map }
    }

    /// A server with no sandbox (a remote upstream): no directory at all,
    /// so every absolute path the default rule looks at is outside.
    pub fn none() -> SandboxView {
        SandboxView::default()
    }

    pub fn dirs(&self) -> &[String] {
        &self.dirs
    }

    pub fn map(&self) -> &PathMap {
        &self.map
    }

    /// The host path behind an absolute, normalised sandbox path, when a
    /// mount holds it.
    fn host_of(&self, sandbox: &str) -> Option<PathBuf> {
        self.mounts.iter().find_map(|(at, host)| {
            let rest = if sandbox == at {
                ""
            } else {
                sandbox.strip_prefix(at.as_str())?.strip_prefix('/')?
            };
            Some(if rest.is_empty() {
                host.clone()
            } else {
                host.join(rest)
            })
        })
    }
}

impl Resolve for SandboxView {
    /// Walks `path` one component at a time, as path_resolution(7) does:
    /// `..` goes up from what was reached so far (after its links were
    /// followed), a symlink's target replaces it (an absolute target starts
    /// again at `/`). A component the host cannot see (not under a mount,
    /// or missing) is taken as written.
    fn resolve(&self, path: &str) -> Result<String, String> {
        let mut todo: VecDeque<String> = path.split('/').map(str::to_string).collect();
        let mut at: Vec<String> = Vec::new();
        let mut links = 0;
        while let Some(seg) = todo.pop_front() {
            match seg.as_str() {
                "" | "." => continue,
                ".." => {
                    at.pop();
                    continue;
                }
                _ => at.push(seg),
            }
            let here = format!("/{}", at.join("/"));
            let Some(host) = self.host_of(&here) else {
                continue;
            };
            let Ok(meta) = std::fs::symlink_metadata(&host) else {
                continue;
            };
            if !meta.file_type().is_symlink() {
                continue;
            }
            links += 1;
            if links > MAX_LINKS {
                return Err("too many levels of symbolic links".into());
            }
            let target = std::fs::read_link(&host)
                .map_err(|e| format!("a symlink in the path cannot be read: {e}"))?;
            let target = target
                .to_str()
                .ok_or("a symlink in the path has a target that is not UTF-8")?;
            at.pop();
            if target.starts_with('/') {
                at.clear();
            }
            for (i, part) in target.split('/').enumerate() {
                todo.insert(i, part.to_string());
            }
        }
        Ok(format!("/{}", at.join("/")))
    }
}

/// Whether `p` is the host path of a mount of `view` (for tests).
#[cfg(test)]
fn mounted(view: &SandboxView, p: &std::path::Path) -> bool {
    view.mounts.iter().any(|(_, h)| h == p)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::symlink;
    use std::path::Path;

    fn view(input: &Path, output: &Path) -> SandboxView {
        let mut mounts = vec![
            ("/workspace/input".to_string(), input.to_path_buf()),
            ("/workspace/output".to_string(), output.to_path_buf()),
        ];
        mounts.sort_by_key(|m| std::cmp::Reverse(m.0.len()));
        let map = PathMap::new(
            mounts
                .iter()
                .map(|(at, h)| (h.to_str().unwrap().to_string(), at.clone())),
        );
        SandboxView {
            mounts,
            dirs: vec![WORKSPACE.into()],
            map,
        }
    }

    #[test]
    fn symlinks_resolve_as_the_sandbox_sees_them() {
        let d = tempfile::tempdir().unwrap();
        let (input, output) = (d.path().join("in"), d.path().join("out"));
        std::fs::create_dir_all(input.join("src")).unwrap();
        std::fs::create_dir_all(&output).unwrap();
        symlink("/etc", output.join("etc")).unwrap();
        symlink("../input/src", output.join("src")).unwrap();
        symlink("loop2", output.join("loop1")).unwrap();
        symlink("loop1", output.join("loop2")).unwrap();
        // a link that names a host path is read in the sandbox: it is the
        // sandbox's /tmp/..., whatever the host has there
        symlink(d.path(), output.join("hostpath")).unwrap();
        let v = view(&input, &output);
        assert!(mounted(&v, &output));
        let r = |p: &str| v.resolve(p);
        assert_eq!(r("/workspace/output/etc/passwd").unwrap(), "/etc/passwd");
        assert_eq!(
            r("/workspace/output/src/a.rs").unwrap(),
            "/workspace/input/src/a.rs"
        );
        assert_eq!(r("/workspace/output/etc/../x").unwrap(), "/x");
        assert_eq!(
            r("/workspace/output/new/file").unwrap(),
            "/workspace/output/new/file"
        );
        assert!(r("/workspace/output/loop1").is_err());
        assert!(r("/workspace/output/hostpath/in")
            .unwrap()
            .starts_with(d.path().to_str().unwrap()));
        assert_eq!(
            v.map()
                .to_sandbox(input.join("src/x").to_str().unwrap())
                .unwrap(),
            "/workspace/input/src/x"
        );
    }
}
