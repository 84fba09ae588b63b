//! A sandbox's workspace on the host: `<state>/sandboxes/<id>/` with
//! `input` (its own copy of the template, read-only inside) and the
//! sandbox's bounded writable space `volume/` (crate::volume: as root an
//! ext4 image `volume.img` of the policy's `[filesystem] tmp` size
//! mounted there) holding `output` and `tmp` (read-write inside). Made
//! private (0700) and, as root, owned by the uid the sandbox runs as
//! where it writes.

use std::fs;
use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::path::{Path, PathBuf};

use anyhow::{bail, Context};

/// The three folders of a workspace.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Workspace {
    pub root: PathBuf,
}

impl Workspace {
    pub fn at(root: PathBuf) -> Workspace {
        Workspace { root }
    }
    pub fn input(&self) -> PathBuf {
        self.root.join("input")
    }
    /// The bounded writable space: the mount point of the volume.
    pub fn volume(&self) -> PathBuf {
        self.root.join(crate::volume::MOUNT)
    }
    pub fn output(&self) -> PathBuf {
        self.volume().join("output")
    }
    pub fn tmp(&self) -> PathBuf {
        self.volume().join("tmp")
    }

    /// Makes what is missing (a kept workspace keeps what it has: its
    /// volume is mounted again), with the modes and owners the sandbox
    /// needs; a new volume is of `size` bytes (the policy's `tmp`), and
    /// there is none without a size (a backend that keeps no volumes).
    pub fn ensure(&self, size: Option<u64>) -> anyhow::Result<()> {
        private_dir(&self.root)?;
        // a workspace made before volumes had `<id>/output` and `<id>/tmp`:
        // they move into `volume/` (a rename on the same filesystem), which
        // then stays a plain directory (crate::volume::ensure)
        for part in ["output", "tmp"] {
            let old = self.root.join(part);
            if fs::symlink_metadata(&old).is_ok_and(|m| m.is_dir()) {
                private_dir(&self.volume())?;
                fs::rename(&old, self.volume().join(part)).with_context(|| {
                    format!("moving {} into {}", old.display(), self.volume().display())
                })?;
            }
        }
        let bound = match size {
            Some(_) => crate::volume::bound(),
            None => crate::volume::Bound::Unbounded("this backend keeps no volumes".into()),
        };
        crate::volume::ensure(&self.root, size.unwrap_or(0), &bound)?;
        // input is read-only inside and must be readable by the sandbox's
        // user; the 0700 root above keeps other host users out
        private_dir(&self.input())?;
        fs::set_permissions(self.input(), fs::Permissions::from_mode(0o755))
            .with_context(|| format!("chmod {}", self.input().display()))?;
        for dir in [self.output(), self.tmp()] {
            private_dir(&dir)?;
            if crate::preflight::is_root() {
                let id = mcpbox_sandbox::ROOT_RUN_HOST_ID;
                std::os::unix::fs::chown(&dir, Some(id), Some(id))
                    .with_context(|| format!("chown {}", dir.display()))?;
            }
        }
        Ok(())
    }

    /// Mounts the kept volume again (a sandbox re-adopted after a
    /// restart of `serve`, or one `serve` was killed under: its stale
    /// mount is reused); nothing for a workspace without an image.
    pub fn remount(&self) -> anyhow::Result<()> {
        crate::volume::remount(&self.root)
    }

    /// Unmounts the volume (`serve` stopping); the image is kept.
    pub fn unmount(&self) -> anyhow::Result<()> {
        crate::volume::release(&self.root)
    }

    /// Removes the workspace, its volume unmounted first (a failed
    /// unmount removes nothing: what is mounted is never emptied through
    /// the mount point); never follows a link the server left in it
    /// (`remove_dir_all` unlinks symlinks, it does not descend them).
    pub fn remove(&self) -> anyhow::Result<()> {
        match fs::symlink_metadata(&self.root) {
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(()),
            Err(e) => return Err(e).with_context(|| format!("{}", self.root.display())),
            Ok(m) if !m.is_dir() => bail!("{} is not a directory", self.root.display()),
            Ok(_) => {}
        }
        self.unmount()?;
        fs::remove_dir_all(&self.root)
            .with_context(|| format!("removing the workspace {}", self.root.display()))
    }
}

/// Creates `dir` (and its parents: `<state>/sandboxes` too) 0700.
pub fn private_dir(dir: &Path) -> anyhow::Result<()> {
    crate::state::private_dir(dir).with_context(|| format!("creating {}", dir.display()))
}

/// Copies the template directory `from` into `to` (which exists and is
/// empty): directories and regular files only. A symlink, device, fifo or
/// socket in a template is skipped with a warning: a template is the
/// operator's, but a link in it would resolve inside every sandbox made
/// from it, and nothing needs one. The copy is read-only inside the
/// sandbox (`/workspace/input`), so it is made readable by all.
pub fn copy_template(from: &Path, to: &Path) -> anyhow::Result<u64> {
    let meta =
        fs::symlink_metadata(from).with_context(|| format!("template base {}", from.display()))?;
    if !meta.is_dir() {
        bail!("template base {} is not a directory", from.display());
    }
    let mut bytes = 0;
    walk_template(from, &mut |rel, m| {
        let (src, dst) = (from.join(rel), to.join(rel));
        if m.is_dir() {
            // the root (`to`) exists already
            if !rel.as_os_str().is_empty() {
                fs::create_dir(&dst).with_context(|| format!("creating {}", dst.display()))?;
            }
            fs::set_permissions(&dst, fs::Permissions::from_mode(0o755))
                .with_context(|| format!("chmod {}", dst.display()))
        } else {
            bytes += fs::copy(&src, &dst)
                .with_context(|| format!("copying {} to {}", src.display(), dst.display()))?;
            let mode = if m.mode() & 0o111 != 0 { 0o755 } else { 0o644 };
            fs::set_permissions(&dst, fs::Permissions::from_mode(mode))
                .with_context(|| format!("chmod {}", dst.display()))
        }
    })?;
    Ok(bytes)
}

/// Walks a template's base as a copy takes it: `visit(relative path,
/// metadata)` for `root` itself (the empty path; a file when the base is a
/// snapshot archive), then, for a directory, each entry sorted by name,
/// a directory before what it holds: directories and regular files only
/// (a symlink, device, fifo or socket is skipped with a warning: a
/// template is the operator's, but a link in it would resolve inside
/// every sandbox made from it, and nothing needs one), at most 64 levels
/// deep. The walk stops at the first error, its own or `visit`'s.
/// `copy_template` copies with it, and `ready::stamp` records what a ready
/// workspace was copied from.
pub fn walk_template(
    root: &Path,
    visit: &mut dyn FnMut(&Path, &fs::Metadata) -> anyhow::Result<()>,
) -> anyhow::Result<()> {
    let meta =
        fs::symlink_metadata(root).with_context(|| format!("template base {}", root.display()))?;
    visit(Path::new(""), &meta)?;
    if meta.is_dir() {
        walk_dir(root, Path::new(""), visit, 0)?;
    }
    Ok(())
}

fn walk_dir(
    root: &Path,
    rel: &Path,
    visit: &mut dyn FnMut(&Path, &fs::Metadata) -> anyhow::Result<()>,
    depth: usize,
) -> anyhow::Result<()> {
    let dir = root.join(rel);
    if depth > 64 {
        bail!("template {} nests deeper than 64 levels", dir.display());
    }
    let mut entries: Vec<_> = fs::read_dir(&dir)
        .with_context(|| format!("reading {}", dir.display()))?
        .collect::<Result<_, _>>()
        .with_context(|| format!("reading {}", dir.display()))?;
    entries.sort_by_key(|e| e.file_name());
    for entry in entries {
        let path = entry.path();
        let m = fs::symlink_metadata(&path).with_context(|| format!("{}", path.display()))?;
        let inner = rel.join(entry.file_name());
        let ft = m.file_type();
        if ft.is_dir() {
            visit(&inner, &m)?;
            walk_dir(root, &inner, visit, depth + 1)?;
        } else if ft.is_file() {
            visit(&inner, &m)?;
        } else {
            tracing::warn!(path = %path.display(), "template: skipping what is not a file or directory");
        }
    }
    Ok(())
}

/// Host mounts at or under `root` but `kept` (there should be none: a
/// sandbox's mounts live in its own mount namespace, and its volume is
/// unmounted with its workspace, or kept with it), for the teardown's
/// check.
pub fn mounts_under(root: &Path, kept: Option<&Path>) -> Vec<String> {
    mcpbox_sandbox::mountinfo::read()
        .into_iter()
        .filter(|m| m.mount_point.starts_with(root) && Some(m.mount_point.as_path()) != kept)
        .map(|m| format!("mount {}", m.mount_point.display()))
        .collect()
}
