//! `snapshot`, `restore`, `reset`: the agent's own checkpoints of its
//! workspace (`output` and `tmp`; `input` is the template's, read-only).
//!
//! They are the lifecycle's snapshot archives (`mcpbox_lifecycle::snapshot`:
//! a manifest of digests, a restore that checks the whole archive before it
//! writes a byte), kept in `/workspace/tmp/.mcpbox/snapshots`, which each
//! checkpoint leaves out of itself. They live inside the sandbox, so the
//! agent can change them; what it can reach by that is its own workspace,
//! which it can change anyway, and the restore's checks still apply. The
//! host never reads them: what leaves the sandbox goes through the
//! artifact export. `reset` restores `origin`, the checkpoint taken the
//! first time the server started in this workspace (its template).

use std::path::{Path, PathBuf};

use mcpbox_lifecycle::snapshot;
use serde_json::{json, Value};

use crate::files::Refusal;

/// Where the server keeps its own state, inside `tmp`.
pub const STATE_DIR: &str = ".mcpbox";
/// The checkpoint `reset` goes back to.
pub const ORIGIN: &str = "origin";

pub struct Checkpoints {
    output: PathBuf,
    tmp: PathBuf,
    store: PathBuf,
}

/// A checkpoint name: letters, digits, '.', '_', '-', 1 to 64, no leading dot.
pub fn check_name(name: &str) -> Result<(), Refusal> {
    let ok = !name.is_empty()
        && name.len() <= 64
        && !name.starts_with('.')
        && name
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'.' | b'_' | b'-'));
    if ok {
        Ok(())
    } else {
        Err(Refusal::invalid(format!(
            "snapshot name {:?}: use 1 to 64 letters, digits, '.', '_' or '-', not starting with a dot",
            name.chars().take(80).collect::<String>()
        )))
    }
}

fn fail(what: &str, e: impl std::fmt::Display) -> Refusal {
    Refusal {
        reason: None,
        message: format!("{what}: {e}"),
    }
}

impl Checkpoints {
    pub fn new(root: &Path) -> Checkpoints {
        let tmp = root.join("tmp");
        Checkpoints {
            output: root.join("output"),
            store: tmp.join(STATE_DIR).join("snapshots"),
            tmp,
        }
    }

    fn archive(&self, name: &str) -> PathBuf {
        self.store.join(format!("{name}.tar.gz"))
    }

    /// The names of the checkpoints kept.
    pub fn names(&self) -> Vec<String> {
        let mut v: Vec<String> = std::fs::read_dir(&self.store)
            .into_iter()
            .flatten()
            .flatten()
            .filter_map(|e| {
                e.file_name()
                    .to_str()
                    .and_then(|n| n.strip_suffix(".tar.gz"))
                    .map(str::to_string)
            })
            .filter(|n| check_name(n).is_ok())
            .collect();
        v.sort();
        v
    }

    /// Takes `origin` unless there is one (the first start in a workspace).
    pub fn ensure_origin(&self) -> Result<(), Refusal> {
        if self.archive(ORIGIN).exists() {
            return Ok(());
        }
        self.take(ORIGIN, false).map(|_| ())
    }

    /// Writes checkpoint `name`; with `replace`, over an older one.
    pub fn take(&self, name: &str, replace: bool) -> Result<Value, Refusal> {
        check_name(name)?;
        std::fs::create_dir_all(&self.store).map_err(|e| fail("the snapshot store", e))?;
        let archive = self.archive(name);
        if archive.exists() {
            if !replace {
                return Err(Refusal::invalid(format!(
                    "a snapshot named {name} exists; pass replace: true, or another name"
                )));
            }
            if name == ORIGIN {
                return Err(Refusal::invalid(
                    "origin is the template's state and is never replaced".into(),
                ));
            }
            std::fs::remove_file(&archive).map_err(|e| fail("replacing the snapshot", e))?;
        }
        // A workspace without an output folder (`run --builtin` with no
        // `[filesystem] output`) has only tmp to keep.
        let parts: Vec<(&str, &Path)> = [("output", &*self.output), ("tmp", &*self.tmp)]
            .into_iter()
            .filter(|(_, p)| p.is_dir())
            .collect();
        let exclude = format!("tmp/{STATE_DIR}");
        let info = snapshot::write_excluding(&parts, &archive, &[exclude.as_str()])
            .map_err(|e| fail("snapshot", e))?;
        Ok(json!({
            "name": name,
            "entries": info.entries,
            "bytes": info.bytes,
            "manifest_sha256": info.manifest_sha256,
            "skipped": info.skipped.len(),
        }))
    }

    /// Replaces `output` and `tmp` (but the server's own state) with
    /// checkpoint `name`. The archive is checked whole before anything in
    /// the workspace is removed.
    pub fn restore(&self, name: &str) -> Result<Value, Refusal> {
        check_name(name)?;
        let archive = self.archive(name);
        if !archive.exists() {
            return Err(Refusal::invalid(format!(
                "no snapshot named {name}; there are: {}",
                self.names().join(", ")
            )));
        }
        let scratch = tempfile::Builder::new()
            .prefix("restore-")
            .tempdir_in(self.tmp.join(STATE_DIR))
            .map_err(|e| fail("a scratch directory", e))?;
        let dest = scratch.path().join("r");
        let restored = snapshot::restore(&archive, &dest).map_err(|e| fail("restore", e))?;
        let keep = [STATE_DIR];
        let parts = [("output", &self.output), ("tmp", &self.tmp)];
        // Checked whole before anything is removed: the server's own state
        // is never replaced by a checkpoint's (a crafted one named it, the
        // workspace was emptied, then the move onto it failed half-way:
        // issue 26), and a part the archive holds must have a place here.
        if std::fs::symlink_metadata(dest.join("tmp").join(STATE_DIR)).is_ok() {
            return Err(Refusal::invalid(format!(
                "snapshot {name} holds /workspace/tmp/{STATE_DIR}, the server's own state; nothing was changed"
            )));
        }
        for (part, live) in parts {
            if dest.join(part).is_dir() && !live.is_dir() {
                return Err(Refusal::invalid(format!(
                    "snapshot {name} holds /workspace/{part}, which this sandbox does not have"
                )));
            }
        }
        for (part, live) in parts {
            let from = dest.join(part);
            if !live.is_dir() {
                continue;
            }
            clear(live, if part == "tmp" { &keep[..] } else { &[] })?;
            if from.is_dir() {
                move_into(&from, live)?;
            }
        }
        Ok(json!({
            "name": name,
            "entries": restored.entries,
            "bytes": restored.bytes,
            "manifest_sha256": restored.manifest_sha256,
        }))
    }
}

fn clear(dir: &Path, keep: &[&str]) -> Result<(), Refusal> {
    let fd = rustix::fs::open(
        dir,
        rustix::fs::OFlags::RDONLY | rustix::fs::OFlags::DIRECTORY | rustix::fs::OFlags::CLOEXEC,
        rustix::fs::Mode::empty(),
    )
    .map_err(|e| fail(&dir.display().to_string(), e))?;
    let mut n = 0;
    crate::files::clear_dir(std::os::fd::AsFd::as_fd(&fd), 0, &mut n, keep)
        .map_err(|e| fail(&format!("emptying {}", dir.display()), e))
}

/// Moves the entries of `from` into `to`: a rename where both are on one
/// mount, else a copy (restored trees hold only files and directories).
fn move_into(from: &Path, to: &Path) -> Result<(), Refusal> {
    let entries = std::fs::read_dir(from).map_err(|e| fail("restore", e))?;
    for e in entries {
        let e = e.map_err(|e| fail("restore", e))?;
        let target = to.join(e.file_name());
        if std::fs::rename(e.path(), &target).is_err() {
            copy_tree(&e.path(), &target)?;
        }
    }
    Ok(())
}

fn copy_tree(from: &Path, to: &Path) -> Result<(), Refusal> {
    let md = std::fs::symlink_metadata(from).map_err(|e| fail("restore", e))?;
    if md.is_dir() {
        std::fs::create_dir(to).map_err(|e| fail("restore", e))?;
        for e in std::fs::read_dir(from).map_err(|e| fail("restore", e))? {
            let e = e.map_err(|e| fail("restore", e))?;
            copy_tree(&e.path(), &to.join(e.file_name()))?;
        }
        std::fs::set_permissions(to, md.permissions()).map_err(|e| fail("restore", e))?;
    } else if md.is_file() {
        std::fs::copy(from, to).map_err(|e| fail("restore", e))?;
    }
    Ok(())
}
