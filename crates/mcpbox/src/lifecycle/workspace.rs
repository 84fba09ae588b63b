//! A sandbox's workspace on the host: `<state>/sandboxes/<id>/` with
//! `input` (its own copy of the template, read-only inside) and the
//! sandbox's bounded writable space `volume/` (crate::volume: as root an
//! ext4 image `volume.img` of the policy's `[filesystem] tmp` size
//! mounted there) holding `output` and `tmp` (read-write inside). Made
//! private (0700) and, as root, owned by the uid the sandbox runs as
//! where it writes.

use std::ffi::CStr;
use std::fs;
use std::os::fd::{AsFd, BorrowedFd};
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};

use anyhow::{bail, Context};
use mcpbox_lifecycle::walk::Kind;

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
///
/// The base may sit in a folder another host user can write, and `serve`
/// may run as root: every file is read through [`TemplateEntry::open`]
/// (from its directory's descriptor, never through a link, never blocking
/// on a fifo, checked on the open descriptor), so an entry swapped for a
/// link to a host file between the walk's look and the copy is refused,
/// not copied into the sandbox.
///
/// The copy lands on the state directory's filesystem, beside the audit
/// log: the base's size (each file and folder rounded up to 4 KiB) is
/// checked against its free space first, with the share
/// [`crate::volume::check_room`] keeps, so that a base too large is
/// refused before a byte is written (a ready workspace's maker would
/// otherwise fill the filesystem, fail and try again).
pub fn copy_template(from: &Path, to: &Path) -> anyhow::Result<u64> {
    copy_template_with(from, to, &crate::volume::space)
}

/// [`copy_template`], with the free space found by `space` (statvfs, or
/// a test's figures).
fn copy_template_with(
    from: &Path,
    to: &Path,
    space: &dyn Fn(&Path) -> anyhow::Result<(u64, u64)>,
) -> anyhow::Result<u64> {
    let meta =
        fs::symlink_metadata(from).with_context(|| format!("template base {}", from.display()))?;
    if !meta.is_dir() {
        bail!("template base {} is not a directory", from.display());
    }
    let mut need = 0u64;
    walk_template(from, &mut |e| {
        let size = u64::try_from(e.stat.st_size).unwrap_or(0);
        need = need.saturating_add(size.div_ceil(4096).max(1).saturating_mul(4096));
        Ok(())
    })?;
    crate::volume::check_copy_room(
        &format!("the template base {}", from.display()),
        need,
        space(to)?,
    )?;
    let mut bytes = 0;
    walk_template(from, &mut |e| {
        let dst = to.join(e.rel);
        if e.is_dir() {
            // the root (`to`) exists already
            if !e.rel.as_os_str().is_empty() {
                fs::create_dir(&dst).with_context(|| format!("creating {}", dst.display()))?;
            }
            fs::set_permissions(&dst, fs::Permissions::from_mode(0o755))
                .with_context(|| format!("chmod {}", dst.display()))
        } else {
            let (mut src, st) = e.open(from)?;
            let mut out = fs::OpenOptions::new()
                .write(true)
                .create_new(true)
                .open(&dst)
                .with_context(|| format!("creating {}", dst.display()))?;
            bytes += std::io::copy(&mut src, &mut out).with_context(|| {
                format!(
                    "copying {} to {}",
                    from.join(e.rel).display(),
                    dst.display()
                )
            })?;
            // the mode of what was read, not of what the walk saw
            let mode = if st.st_mode & 0o111 != 0 {
                0o755
            } else {
                0o644
            };
            fs::set_permissions(&dst, fs::Permissions::from_mode(mode))
                .with_context(|| format!("chmod {}", dst.display()))
        }
    })?;
    Ok(bytes)
}

/// One entry of a template walk: a directory or a regular file, as
/// lstat(2) saw it.
pub struct TemplateEntry<'a> {
    /// Relative to the base; empty for the base itself.
    pub rel: &'a Path,
    pub stat: &'a rustix::fs::Stat,
    /// The directory holding it and its name there (none for the base).
    at: Option<(BorrowedFd<'a>, &'a CStr)>,
}

impl TemplateEntry<'_> {
    pub fn is_dir(&self) -> bool {
        Kind::of(self.stat.st_mode) == Kind::Dir
    }

    /// Opens the file for reading from its directory's descriptor: never
    /// through a symlink, never blocking on a fifo (mcpbox_lifecycle's
    /// walk module). What was opened must be a regular file, checked on
    /// the descriptor (fstat), whatever the walk saw a moment before; its
    /// fstat comes with it. `base` names the template in errors.
    pub fn open(&self, base: &Path) -> anyhow::Result<(fs::File, rustix::fs::Stat)> {
        let shown = || base.join(self.rel).display().to_string();
        let Some((dir, name)) = self.at else {
            bail!("template base {} is not a file to copy", base.display());
        };
        let (file, st) = mcpbox_lifecycle::walk::open_file_in(dir, name)
            .with_context(|| format!("opening {} (a link is never followed)", shown()))?;
        if Kind::of(st.st_mode) != Kind::File {
            bail!(
                "{} changed into something that is not a file while it was copied",
                shown()
            );
        }
        Ok((file, st))
    }
}

/// Walks a template's base as a copy takes it: `visit` for the base itself
/// (the empty path; a file when the base is a snapshot archive), then, for
/// a directory, each entry sorted by name, a directory before what it
/// holds: directories and regular files only (a symlink, device, fifo,
/// socket or a name that is not UTF-8 is skipped with a warning: a
/// template is the operator's, but a link in it would resolve inside
/// every sandbox made from it, and nothing needs one), at most
/// [`mcpbox_lifecycle::walk::MAX_DEPTH`] levels deep. Below the base,
/// every directory is opened from its parent's descriptor without
/// following a link (mcpbox_lifecycle's walk module), so a directory
/// swapped for a link leads nowhere. The walk stops at the first error,
/// its own or `visit`'s. `copy_template` copies with it, and
/// `ready::stamp` records what a ready workspace was copied from.
pub fn walk_template(
    root: &Path,
    visit: &mut dyn FnMut(&TemplateEntry<'_>) -> anyhow::Result<()>,
) -> anyhow::Result<()> {
    use mcpbox_lifecycle::walk::{self, Visit};
    let st =
        rustix::fs::lstat(root).with_context(|| format!("template base {}", root.display()))?;
    let base = TemplateEntry {
        rel: Path::new(""),
        stat: &st,
        at: None,
    };
    visit(&base)?;
    if !base.is_dir() {
        return Ok(());
    }
    // the base's own path is the operator's (its parents trusted); its
    // last component is not followed, and it must still be what lstat saw
    let dir = walk::open_root(root).with_context(|| format!("opening {}", root.display()))?;
    let opened = rustix::fs::fstat(&dir).with_context(|| format!("{}", root.display()))?;
    if (opened.st_dev, opened.st_ino) != (st.st_dev, st.st_ino) {
        bail!("template base {} changed while it was read", root.display());
    }
    walk::walk(
        dir.as_fd(),
        "",
        &mut |v: Visit<'_>| -> Result<bool, WalkFailed> {
            match v {
                Visit::Node(n) if matches!(n.kind, Kind::Dir | Kind::File) => {
                    let rel = Path::new(n.rel);
                    visit(&TemplateEntry {
                        rel,
                        stat: &n.stat,
                        at: Some((n.dir, n.name)),
                    })
                    .map_err(WalkFailed)?;
                    Ok(n.kind == Kind::Dir)
                }
                Visit::Node(n) => {
                    tracing::warn!(path = %root.join(n.rel).display(), kind = n.kind.as_str(),
                    "template: skipping what is not a file or directory");
                    Ok(false)
                }
                Visit::BadName { rel, kind } => {
                    tracing::warn!(path = %root.join(&rel).display(), kind = kind.as_str(),
                    "template: skipping a name that is not UTF-8");
                    Ok(false)
                }
                Visit::TooDeep { rel } => Err(WalkFailed(anyhow::anyhow!(
                    "template {} nests deeper than {} levels",
                    root.join(rel).display(),
                    walk::MAX_DEPTH
                ))),
            }
        },
    )
    .map_err(|e| e.0)
}

/// A template walk's error: the walker's own or the visitor's.
struct WalkFailed(anyhow::Error);

impl From<mcpbox_lifecycle::walk::WalkError> for WalkFailed {
    fn from(e: mcpbox_lifecycle::walk::WalkError) -> Self {
        WalkFailed(anyhow::Error::new(e).context("reading the template"))
    }
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

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    /// A base with a file, an executable, a folder with a file, and what a
    /// copy skips: a link to a host file and a fifo. Also the host file
    /// and folder a swapped-in link would lead to.
    fn base() -> (tempfile::TempDir, PathBuf, PathBuf) {
        let t = tempfile::tempdir().unwrap();
        let host = t.path().join("host");
        fs::create_dir(&host).unwrap();
        fs::write(host.join("shadow"), "HOST SECRET").unwrap();
        let base = t.path().join("base");
        fs::create_dir_all(base.join("sub")).unwrap();
        fs::write(base.join("a.txt"), "a").unwrap();
        fs::write(base.join("run.sh"), "#!/bin/sh\n").unwrap();
        fs::set_permissions(base.join("run.sh"), fs::Permissions::from_mode(0o700)).unwrap();
        fs::write(base.join("sub/b.txt"), "bb").unwrap();
        std::os::unix::fs::symlink(host.join("shadow"), base.join("link")).unwrap();
        mkfifo(&base.join("fifo"));
        (t, base, host)
    }

    fn mkfifo(path: &Path) {
        rustix::fs::mknodat(
            rustix::fs::CWD,
            path,
            rustix::fs::FileType::Fifo,
            rustix::fs::Mode::from_raw_mode(0o644),
            0,
        )
        .unwrap();
    }

    #[test]
    fn a_template_copy_takes_files_and_folders_and_skips_links_and_fifos() {
        let (t, base, _) = base();
        let to = t.path().join("to");
        fs::create_dir(&to).unwrap();
        let bytes = copy_template(&base, &to).unwrap();
        assert_eq!(bytes, 1 + 10 + 2);
        assert_eq!(fs::read_to_string(to.join("sub/b.txt")).unwrap(), "bb");
        let mode = |p: &str| fs::metadata(to.join(p)).unwrap().permissions().mode() & 0o777;
        assert_eq!(mode("a.txt"), 0o644);
        assert_eq!(mode("run.sh"), 0o755);
        assert_eq!(mode("sub"), 0o755);
        assert!(fs::symlink_metadata(to.join("link")).is_err());
        assert!(fs::symlink_metadata(to.join("fifo")).is_err());
    }

    /// The open of `a.txt` after the walk looked at it (lstat: a file)
    /// and `swap` replaced it: the open's error (the walk itself goes on).
    fn open_after_swap(base: &Path, swap: impl Fn(&Path)) -> String {
        let mut refused = None;
        walk_template(base, &mut |e| {
            if e.rel == Path::new("a.txt") {
                fs::remove_file(base.join("a.txt")).unwrap();
                swap(&base.join("a.txt"));
                refused = Some(format!("{:#}", e.open(base).unwrap_err()));
            }
            Ok(())
        })
        .unwrap();
        refused.expect("a.txt was not visited")
    }

    /// The window between the walk's look (lstat: a file) and the copy's
    /// open: a host user who can write the base swaps the file for a link
    /// to a host file (as root, `serve` could read anything). The open
    /// refuses the link.
    #[test]
    fn a_template_file_swapped_for_a_symlink_after_the_look_is_not_followed() {
        let (_t, base, host) = base();
        let err = open_after_swap(&base, |p| {
            std::os::unix::fs::symlink(host.join("shadow"), p).unwrap()
        });
        assert!(err.contains("a link is never followed"), "{err}");
    }

    /// The same for a folder: swapped for a link to a host folder after
    /// the walk saw it, it is not entered (the walk fails), and nothing of
    /// the host folder is visited.
    #[test]
    fn a_template_folder_swapped_for_a_symlink_after_the_look_is_not_entered() {
        let (_t, base, host) = base();
        let mut seen = Vec::new();
        let result = walk_template(&base, &mut |e| {
            seen.push(e.rel.to_path_buf());
            if e.rel == Path::new("sub") {
                fs::remove_dir_all(base.join("sub")).unwrap();
                std::os::unix::fs::symlink(&host, base.join("sub")).unwrap();
            }
            Ok(())
        });
        assert!(
            result.is_err(),
            "the walk went on through the link: {seen:?}"
        );
        assert!(
            !seen
                .iter()
                .any(|p| p.starts_with("sub") && p != Path::new("sub")),
            "visited through the link: {seen:?}"
        );
    }

    /// A file swapped for a fifo after the look: opening a fifo for
    /// reading would wait for a writer (and hold every join of `serve`);
    /// the open does not wait, and refuses what is not a file.
    #[test]
    fn a_template_file_swapped_for_a_fifo_after_the_look_does_not_block_the_copy() {
        let (_t, base, _) = base();
        let err = open_after_swap(&base, mkfifo);
        assert!(err.contains("not a file"), "{err}");
    }

    /// A base larger than the state directory's free space (less the
    /// share kept for the audit log) is refused before a byte is copied.
    #[test]
    fn a_template_base_larger_than_the_free_space_is_not_copied() {
        let (t, base, _) = base();
        let to = t.path().join("to");
        fs::create_dir(&to).unwrap();
        // the base needs 20 KiB (five entries of 4 KiB); a 100 MiB
        // filesystem keeps 5 MiB free, and has only 8 KiB more
        let tight = (5 << 20) + (8 << 10);
        let err = copy_template_with(&base, &to, &|_| Ok((tight, 100 << 20))).unwrap_err();
        let text = format!("{err:#}");
        assert!(text.contains("the template base"), "{text}");
        assert!(text.contains("stays free for the audit log"), "{text}");
        assert!(fs::read_dir(&to).unwrap().next().is_none(), "copied anyway");
        // with room, the same copy goes through
        assert!(copy_template_with(&base, &to, &|_| Ok((20 << 20, 100 << 20))).is_ok());
    }

    /// A base swapped for a link (its last component) is not followed.
    #[test]
    fn a_template_base_that_is_a_link_is_refused() {
        let (t, _, host) = base();
        let link = t.path().join("base-link");
        std::os::unix::fs::symlink(&host, &link).unwrap();
        let to = t.path().join("to");
        fs::create_dir(&to).unwrap();
        assert!(copy_template(&link, &to).is_err());
        assert!(fs::read_dir(&to).unwrap().next().is_none());
    }
}
