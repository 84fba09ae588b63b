//! A sandbox's bounded writable space (issue 26, "Disk budgets that
//! hold"): under `serve` a sandbox's `output` and `tmp` together, and
//! under `run --builtin` the built-in server's `tmp`, live on one volume
//! of the policy's `[filesystem] tmp` size, so that an agent that writes
//! without end gets ENOSPC inside its sandbox and never fills the
//! filesystem that holds mcpbox's state (the audit log, the registry,
//! the other sandboxes' workspaces).
//!
//! As root the volume is an image file `<dir>/volume.img` whose blocks
//! are reserved when it is made (fallocate: a sandbox that cannot have
//! its space is refused, naming the free space, before anything runs),
//! formatted ext4 by `mkfs.ext4` (run through the host-command runner:
//! no shell, a minimal environment, killed with its group at its
//! timeout), attached to a loop device and mounted on `<dir>/volume`.
//! The image is kept while the workspace is (a stopped sandbox, a
//! restart of `serve`); a mount left by a `serve` that was killed is
//! found in /proc/self/mountinfo and reused when it is this image's, or
//! taken down. It is unmounted before the workspace is removed.
//!
//! Rootless there is no mechanism that bounds a directory (no loop
//! device, no quota, a tmpfs would not outlive the sandbox's process):
//! `<dir>/volume` is a plain directory and the bound does not hold. That
//! is said out loud (`serve` and `run --builtin` print it once at start,
//! the sandbox's `created` record carries it), never silently; see
//! ARCHITECTURE.md, "Disk budgets".

use std::path::{Path, PathBuf};
use std::time::Duration;

use anyhow::{bail, Context};

/// The image file, in the workspace's folder.
pub const IMAGE: &str = "volume.img";
/// Where the image is mounted, in the workspace's folder.
pub const MOUNT: &str = "volume";

/// The smallest image made: ext4's own metadata needs room.
const MIN_IMAGE: u64 = 2 << 20;
/// How long `mkfs.ext4` may take on an image up to 64 GiB.
const MKFS_TIMEOUT: Duration = Duration::from_secs(120);

/// How the writable space is bounded here.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Bound {
    /// An ext4 image on a loop device (root).
    Volume,
    /// Nothing can bound it here; the reason and the fix.
    Unbounded(String),
}

/// What this process can use: the volume as root with loop devices and
/// `mkfs.ext4`, else nothing.
pub fn bound() -> Bound {
    if !crate::preflight::is_root() {
        return Bound::Unbounded(
            "running as an ordinary user, mcpbox cannot mount a size-limited filesystem for a workspace (no loop device, no quota): its output and tmp are plain directories on the state directory's filesystem; fix: run mcpbox as root".into(),
        );
    }
    if !Path::new("/dev/loop-control").exists() {
        return Bound::Unbounded(
            "no /dev/loop-control (the loop module is not loaded, or this container hides it): workspaces are plain directories; fix: `modprobe loop`, or give the container /dev/loop-control and loop devices".into(),
        );
    }
    if mkfs().is_none() {
        return Bound::Unbounded(
            "mkfs.ext4 was not found (in /usr/sbin, /sbin or PATH): workspaces are plain directories; fix: install e2fsprogs".into(),
        );
    }
    Bound::Volume
}

/// The size of the image for a bound of `tmp` bytes: at least
/// [`MIN_IMAGE`], in whole MiB (what the bound allows, rounded up; the
/// filesystem's own metadata takes a few percent of it).
pub fn image_size(tmp: u64) -> u64 {
    const MIB: u64 = 1 << 20;
    tmp.max(MIN_IMAGE).div_ceil(MIB).saturating_mul(MIB)
}

/// Whether `size` bytes may be reserved on a filesystem of `total`
/// bytes with `free` available: after it, 1/20 of the filesystem (at
/// least 1 MiB, at most 256 MiB) must stay free for the audit log and
/// the registry. The error names the figures.
pub fn check_room(size: u64, free: u64, total: u64) -> Result<(), String> {
    let keep = (total / 20).clamp(1 << 20, 256 << 20);
    if free >= size.saturating_add(keep) {
        return Ok(());
    }
    Err(format!(
        "the workspace needs {} reserved, and the state directory's filesystem has {} free of {} (at least {} of it stays free for the audit log and the registry)",
        mib(size),
        mib(free),
        mib(total),
        mib(keep)
    ))
}

fn mib(n: u64) -> String {
    format!("{:.1} MiB", n as f64 / f64::from(1u32 << 20))
}

/// `mkfs.ext4`'s path: root's usual places first (a service's PATH may
/// lack the sbin directories), then PATH.
fn mkfs() -> Option<PathBuf> {
    let fixed = ["/usr/sbin/mkfs.ext4", "/sbin/mkfs.ext4"].map(PathBuf::from);
    let on_path = std::env::var_os("PATH")
        .map(|p| {
            std::env::split_paths(&p)
                .map(|d| d.join("mkfs.ext4"))
                .collect::<Vec<_>>()
        })
        .unwrap_or_default();
    fixed.into_iter().chain(on_path).find(|p| p.is_file())
}

/// The writable space of the workspace folder `dir`: `<dir>/volume`,
/// mounted from `<dir>/volume.img` (made of `size` bytes when missing)
/// when `bound` is [`Bound::Volume`], a plain directory otherwise.
/// Idempotent: a mount already there of this image is kept.
pub fn ensure(dir: &Path, size: u64, bound: &Bound) -> anyhow::Result<PathBuf> {
    let at = dir.join(MOUNT);
    crate::state::private_dir(&at).with_context(|| format!("creating {}", at.display()))?;
    if *bound != Bound::Volume {
        return Ok(at);
    }
    let image = dir.join(IMAGE);
    if mounted(dir)? {
        return Ok(at);
    }
    if std::fs::symlink_metadata(&image).is_err() {
        // a workspace made without a volume (rootless, or by an mcpbox
        // before disk budgets) keeps its files where they are: a new
        // volume mounted over them would hide them
        let in_use = std::fs::read_dir(&at)
            .with_context(|| format!("reading {}", at.display()))?
            .next()
            .is_some();
        if in_use {
            tracing::warn!(workspace = %dir.display(), "a workspace made without a volume stays unbounded; destroy the sandbox to have it bounded");
            return Ok(at);
        }
        make_image(&image, image_size(size))?;
    }
    mcpbox_sandbox::volume::attach_and_mount(&image, &at)
        .with_context(|| format!("mounting the workspace volume {}", image.display()))?;
    // the filesystem's root (root's, 0755 from mkfs) is as private as the
    // folder it is mounted on
    crate::state::private_dir(&at).with_context(|| format!("chmod {}", at.display()))?;
    Ok(at)
}

/// Mounts the kept image of `dir` again when it has one (a sandbox
/// re-adopted after a restart); nothing when it has none.
pub fn remount(dir: &Path) -> anyhow::Result<()> {
    if std::fs::symlink_metadata(dir.join(IMAGE)).is_err() {
        return Ok(());
    }
    ensure(dir, 0, &Bound::Volume).map(drop)
}

/// Whether `<dir>/volume` is the mount of `<dir>/volume.img`. A mount
/// there of anything else (there should be none: the folder is 0700 and
/// mcpbox's) is taken down and `false` returned.
fn mounted(dir: &Path) -> anyhow::Result<bool> {
    let at = dir.join(MOUNT);
    let mounts = mcpbox_sandbox::mountinfo::read();
    let Some(m) = mcpbox_sandbox::mountinfo::at(&mounts, &at) else {
        return Ok(false);
    };
    let ours =
        mcpbox_sandbox::volume::backing_file(&m.device).is_some_and(|b| b == dir.join(IMAGE));
    if ours {
        return Ok(true);
    }
    tracing::warn!(mount = %at.display(), source = %m.source, "a mount that is not this workspace's volume: unmounting it");
    mcpbox_sandbox::volume::unmount(&at).with_context(|| format!("unmounting {}", at.display()))?;
    Ok(false)
}

/// Unmounts `<dir>/volume` while anything is mounted there (the image is
/// kept). Nothing to do is fine.
pub fn release(dir: &Path) -> anyhow::Result<()> {
    let at = dir.join(MOUNT);
    for _ in 0..8 {
        let mounts = mcpbox_sandbox::mountinfo::read();
        if mcpbox_sandbox::mountinfo::at(&mounts, &at).is_none() {
            return Ok(());
        }
        mcpbox_sandbox::volume::unmount(&at)
            .with_context(|| format!("unmounting the workspace volume {}", at.display()))?;
    }
    bail!("{} is still mounted after 8 unmounts", at.display())
}

/// Reserves and formats a new image of `size` bytes. The free space is
/// looked at first, so the refusal names it; the reservation itself is
/// what holds (a race with another writer ends in ENOSPC here, not
/// later inside the sandbox).
fn make_image(image: &Path, size: u64) -> anyhow::Result<()> {
    let parent = image.parent().unwrap_or(Path::new("."));
    let st =
        rustix::fs::statvfs(parent).with_context(|| format!("statvfs {}", parent.display()))?;
    let free = st.f_bavail.saturating_mul(st.f_frsize);
    let total = st.f_blocks.saturating_mul(st.f_frsize);
    check_room(size, free, total).map_err(|e| anyhow::anyhow!("{e}"))?;
    mcpbox_sandbox::volume::reserve(image, size).map_err(|e| {
        anyhow::anyhow!(
            "reserving {} for the workspace volume {}: {e}",
            mib(size),
            image.display()
        )
    })?;
    if let Err(e) = format(image) {
        let _ = std::fs::remove_file(image);
        return Err(e);
    }
    Ok(())
}

/// `mkfs.ext4` on `image`: no reserved blocks (the whole bound is the
/// sandbox's), the root directory root's.
fn format(image: &Path) -> anyhow::Result<()> {
    let Some(mkfs) = mkfs() else {
        bail!("mkfs.ext4 was not found; install e2fsprogs");
    };
    let argv = [
        mkfs.to_string_lossy().into_owned(),
        "-q".into(),
        "-F".into(),
        "-m".into(),
        "0".into(),
        "-E".into(),
        "root_owner=0:0,nodiscard".into(),
        image.to_string_lossy().into_owned(),
    ];
    let cmd = mcpbox_gateway::host_command::HostCommand::new(&argv, MKFS_TIMEOUT)
        .context("mkfs.ext4's command line")?;
    let outcome = cmd
        .run()
        .with_context(|| format!("running {}", mkfs.display()))?;
    if !outcome.ended.success() {
        bail!(
            "{} {}: {}",
            mkfs.display(),
            image.display(),
            outcome.ended.describe()
        );
    }
    Ok(())
}

/// `run --builtin`'s working space (the built-in server's `tmp`, a host
/// directory so that the gateway can measure an artifact in it):
/// `<state>/builtin/<id>/`, 0700, its `tmp` on a volume of the policy's
/// `tmp` size as a serve workspace's is. `<id>.lock` is held locked
/// (flock) by the run for as long as it lives, so the next run can tell
/// a space whose owner is gone (a SIGKILL: the kernel drops the lock
/// with the process) from one in use, and reclaims only the former.
/// Removed, its volume unmounted, when dropped.
pub struct RunSpace {
    dir: PathBuf,
    lock_path: PathBuf,
    _lock: std::fs::File,
}

/// Where `run --builtin` keeps its working spaces, in the state directory.
const RUN_SPACES: &str = "builtin";

impl RunSpace {
    /// Reclaims what killed runs left, then makes a new space of `size`.
    pub fn make(state: &Path, size: u64) -> anyhow::Result<RunSpace> {
        use std::os::unix::fs::OpenOptionsExt;
        let base = state.join(RUN_SPACES);
        crate::state::private_dir(&base).with_context(|| format!("creating {}", base.display()))?;
        reclaim(&base);
        let id = crate::state::new_id();
        // locked under a name reclaim() skips, then renamed into place: a
        // lock file is never seen unlocked while its run lives
        let fresh = base.join(format!(".new-{id}"));
        let lock = std::fs::OpenOptions::new()
            .write(true)
            .create_new(true)
            .mode(0o600)
            .open(&fresh)
            .with_context(|| format!("creating {}", fresh.display()))?;
        rustix::fs::flock(&lock, rustix::fs::FlockOperation::NonBlockingLockExclusive)
            .with_context(|| format!("locking {}", fresh.display()))?;
        let lock_path = base.join(format!("{id}.lock"));
        std::fs::rename(&fresh, &lock_path)
            .with_context(|| format!("placing {}", lock_path.display()))?;
        let space = RunSpace {
            dir: base.join(&id),
            lock_path,
            _lock: lock,
        };
        crate::state::private_dir(&space.dir)
            .with_context(|| format!("creating {}", space.dir.display()))?;
        let vol = ensure(&space.dir, size, &bound())?;
        let tmp = vol.join("tmp");
        crate::state::private_dir(&tmp).with_context(|| format!("creating {}", tmp.display()))?;
        if crate::preflight::is_root() {
            let id = mcpbox_sandbox::ROOT_RUN_HOST_ID;
            std::os::unix::fs::chown(&tmp, Some(id), Some(id))
                .with_context(|| format!("chown {}", tmp.display()))?;
        }
        Ok(space)
    }

    /// The built-in server's tmp.
    pub fn tmp(&self) -> PathBuf {
        self.dir.join(MOUNT).join("tmp")
    }
}

impl Drop for RunSpace {
    fn drop(&mut self) {
        if let Err(e) = remove_space(&self.dir) {
            tracing::error!(dir = %self.dir.display(), "removing the built-in server's working space: {e:#}");
            return;
        }
        let _ = std::fs::remove_file(&self.lock_path);
    }
}

/// Unmounts and removes a working space (never through a mount that
/// would not go: then nothing is removed).
fn remove_space(dir: &Path) -> anyhow::Result<()> {
    if std::fs::symlink_metadata(dir).is_err() {
        return Ok(());
    }
    release(dir)?;
    std::fs::remove_dir_all(dir).with_context(|| format!("removing {}", dir.display()))
}

/// A working space's name: [`crate::state::new_id`]'s 12 hex digits.
fn is_run_id(s: &str) -> bool {
    s.len() == 12
        && s.bytes()
            .all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b))
}

/// Removes the working spaces under `base` whose run is gone: their lock
/// file can be locked (or is missing). One still locked is a live run's.
fn reclaim(base: &Path) {
    let Ok(entries) = std::fs::read_dir(base) else {
        return;
    };
    for e in entries.flatten() {
        let name = e.file_name().to_string_lossy().into_owned();
        // `<id>` (a space) or `<id>.lock`; `.new-<id>` is a lock being
        // placed, and anything else is not ours
        let id = name.strip_suffix(".lock").unwrap_or(&name);
        if !is_run_id(id) {
            continue;
        }
        let lock_path = base.join(format!("{id}.lock"));
        // kept open (and so locked) until the space is gone
        let _lock = match std::fs::OpenOptions::new().write(true).open(&lock_path) {
            Ok(f) => {
                let op = rustix::fs::FlockOperation::NonBlockingLockExclusive;
                if rustix::fs::flock(&f, op).is_err() {
                    continue; // its run lives
                }
                Some(f)
            }
            // no lock file: a space is only made after its lock is placed,
            // and its lock only removed after it, so its run is gone
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => None,
            Err(_) => continue,
        };
        let dir = base.join(id);
        match remove_space(&dir) {
            Ok(()) => {
                let _ = std::fs::remove_file(&lock_path);
                tracing::warn!(dir = %dir.display(), "reclaimed the working space of a run --builtin that was killed");
            }
            Err(e) => {
                tracing::error!(dir = %dir.display(), "reclaiming a killed run's working space: {e:#}")
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn image_size_is_the_bound_in_whole_mib_and_never_below_the_minimum() {
        assert_eq!(image_size(1), MIN_IMAGE);
        assert_eq!(image_size(MIN_IMAGE), MIN_IMAGE);
        assert_eq!(image_size(64 << 20), 64 << 20);
        assert_eq!(image_size((64 << 20) + 1), 65 << 20);
        // past any size the policy allows it saturates, never wraps
        assert_eq!(image_size(u64::MAX), u64::MAX);
    }

    #[test]
    fn reclaim_removes_only_spaces_whose_run_is_gone() {
        let base = tempfile::tempdir().unwrap();
        let b = base.path();
        let (live, dead, lockless) = ("0123456789ab", "ba9876543210", "aaaaaaaaaaaa");
        for id in [live, dead, lockless] {
            std::fs::create_dir_all(b.join(id).join(MOUNT).join("tmp")).unwrap();
            std::fs::write(b.join(id).join(MOUNT).join("tmp/f"), "x").unwrap();
        }
        // a live run holds its lock; a dead one's lock is a plain file
        let held = std::fs::File::create(b.join(format!("{live}.lock"))).unwrap();
        rustix::fs::flock(&held, rustix::fs::FlockOperation::LockExclusive).unwrap();
        std::fs::write(b.join(format!("{dead}.lock")), "").unwrap();
        // a lock being placed, and what is not a space, are left alone
        std::fs::write(b.join(".new-cccccccccccc"), "").unwrap();
        std::fs::create_dir(b.join("not-a-space")).unwrap();
        reclaim(b);
        let mut left: Vec<String> = std::fs::read_dir(b)
            .unwrap()
            .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
            .collect();
        left.sort();
        assert_eq!(
            left,
            [
                ".new-cccccccccccc",
                "0123456789ab",
                "0123456789ab.lock",
                "not-a-space"
            ]
        );
        assert!(b.join(live).join(MOUNT).join("tmp/f").is_file());
        drop(held);
        reclaim(b);
        assert!(!b.join(live).exists());
    }

    #[test]
    fn run_ids_are_new_ids() {
        assert!(is_run_id(&crate::state::new_id()));
        assert!(!is_run_id(".new-0123456789ab"));
        assert!(!is_run_id("0123456789AB"));
        assert!(!is_run_id("sb-0123456789abcdef"));
    }

    #[test]
    fn check_room_keeps_a_twentieth_and_names_the_figures() {
        let total = 100 << 20;
        assert!(check_room(10 << 20, 20 << 20, total).is_ok());
        assert!(check_room(10 << 20, 15 << 20, total).is_ok());
        let e = check_room(10 << 20, (15 << 20) - 1, total).unwrap_err();
        assert!(e.contains("10.0 MiB reserved"), "{e}");
        assert!(e.contains("free of 100.0 MiB"), "{e}");
        // on a small filesystem the floor is 1 MiB
        assert!(check_room(1 << 20, 2 << 20, 4 << 20).is_ok());
        assert!(check_room(1 << 20, (2 << 20) - 1, 4 << 20).is_err());
        assert!(check_room(u64::MAX, u64::MAX - 1, u64::MAX).is_err());
        // on a large one, at most 256 MiB
        let tib = 1u64 << 40;
        assert!(check_room(64 << 20, (64 << 20) + (256 << 20), tib).is_ok());
        assert!(check_room(64 << 20, (64 << 20) + (256 << 20) - 1, tib).is_err());
    }
}
