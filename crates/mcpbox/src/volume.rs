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
//! Rootless (no loop device, no mount(2) outside a user namespace) the
//! same image, formatted without a journal and owned by the user, is
//! mounted on `<dir>/volume` by `fuse2fs` (e2fsprogs' ext4 in user space,
//! through the setuid `fusermount` of the fuse package), which runs as a
//! daemon under the host-command supervisor: it ends when the volume is
//! released, and when mcpbox exits for any reason (`kill -9` included,
//! crates/gateway/src/host_command.rs, `start_daemon`), with SIGTERM
//! first, so that it unmounts and writes back what it holds. The image
//! is checked (`e2fsck -p`) before each mount, which repairs what a
//! daemon killed mid-write left. A FUSE mount is reachable only by the
//! user who made it (no `allow_other`): the sandbox's processes are that
//! user in the host's eyes, other local users are not.
//!
//! Where neither can be had, `<dir>/volume` is a plain directory and the
//! bound does not hold: a new workspace is then refused, naming what is
//! missing and the fix, unless the policy sets
//! `sandbox.dangerously_allow_degraded` (then it is said out loud:
//! `serve` and `run --builtin` print it at start, the sandbox's
//! `created` record carries it); see ARCHITECTURE.md, "Disk budgets".

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::Mutex;
use std::time::{Duration, Instant};

use anyhow::{bail, Context};
use mcpbox_gateway::host_command::{Daemon, HostCommand};

/// The image file, in the workspace's folder.
pub const IMAGE: &str = "volume.img";
/// Where the image is mounted, in the workspace's folder.
pub const MOUNT: &str = "volume";

/// The smallest image made: ext4's own metadata needs room.
const MIN_IMAGE: u64 = 2 << 20;
/// How long `mkfs.ext4` may take on an image up to 64 GiB (and
/// `e2fsck -p` on one a killed daemon left).
const MKFS_TIMEOUT: Duration = Duration::from_secs(120);
/// How long `fuse2fs` may take to mount, and `fusermount` to unmount.
const FUSE_TIMEOUT: Duration = Duration::from_secs(20);

/// How the writable space is bounded here.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Bound {
    /// An ext4 image on a loop device (root).
    Volume,
    /// An ext4 image mounted by `fuse2fs` (rootless).
    Fuse,
    /// Nothing can bound it here; the reason and the fix.
    Unbounded(String),
}

impl Bound {
    /// What bounds it, for records and messages; `None` when nothing does.
    pub fn by(&self) -> Option<&'static str> {
        match self {
            Bound::Volume => Some("volume"),
            Bound::Fuse => Some("fuse2fs"),
            Bound::Unbounded(_) => None,
        }
    }
}

/// What this process can use: the volume as root with loop devices and
/// `mkfs.ext4`, `fuse2fs` as an ordinary user with FUSE, else nothing
/// (with the reason and the fix). Looked at once per process (each
/// sandbox's creation asks several times; the answer is what `serve`
/// and `run --builtin` said at start).
pub fn bound() -> Bound {
    static BOUND: std::sync::OnceLock<Bound> = std::sync::OnceLock::new();
    BOUND.get_or_init(probe).clone()
}

/// [`bound`]'s look at the programs and devices.
fn probe() -> Bound {
    if program("mkfs.ext4").is_none() || program("e2fsck").is_none() {
        return Bound::Unbounded(
            "mkfs.ext4 or e2fsck was not found (in /usr/sbin, /sbin or PATH): workspaces are plain directories; fix: install e2fsprogs".into(),
        );
    }
    if !crate::preflight::is_root() {
        return fuse_bound();
    }
    if !Path::new("/dev/loop-control").exists() {
        return Bound::Unbounded(
            "no /dev/loop-control (the loop module is not loaded, or this container hides it): workspaces are plain directories; fix: `modprobe loop`, or give the container /dev/loop-control and loop devices".into(),
        );
    }
    Bound::Volume
}

/// Rootless: `fuse2fs`, a setuid `fusermount` and a usable `/dev/fuse`.
fn fuse_bound() -> Bound {
    const FIX: &str =
        "fix: install fuse2fs and fuse (`apt-get install fuse2fs fuse`), or run mcpbox as root";
    if program("fuse2fs").is_none() {
        return Bound::Unbounded(format!(
            "running as an ordinary user, a workspace is bounded by an ext4 image that fuse2fs mounts, and fuse2fs was not found: its output and tmp would be plain directories on the state directory's filesystem; {FIX}"
        ));
    }
    if fusermount().is_none() {
        return Bound::Unbounded(format!(
            "running as an ordinary user, fuse2fs needs the setuid fusermount (or fusermount3) to mount, and none was found: workspaces would be plain directories; {FIX}"
        ));
    }
    if let Err(e) = std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .open("/dev/fuse")
    {
        return Bound::Unbounded(format!(
            "running as an ordinary user, fuse2fs needs /dev/fuse, which cannot be opened here ({e}): workspaces would be plain directories; fix: `modprobe fuse`, or give the container /dev/fuse; or run mcpbox as root"
        ));
    }
    Bound::Fuse
}

/// Refuses a new bounded workspace where nothing bounds it, unless the
/// policy allows it (`sandbox.dangerously_allow_degraded`), as a memory
/// limit that cannot be enforced is refused.
pub fn require(bound: &Bound, allow_degraded: bool) -> anyhow::Result<()> {
    match bound {
        Bound::Unbounded(why) if !allow_degraded => bail!(
            "[filesystem] tmp cannot be enforced here: {why}; or set sandbox.dangerously_allow_degraded = true in the policy to run with the workspace unbounded"
        ),
        _ => Ok(()),
    }
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
    room_left(
        &format!("the workspace needs {} reserved", mib(size)),
        size,
        free,
        total,
    )
}

/// What stays free on a filesystem of `total` bytes, for the audit log
/// and the registry: 1/20 of it, at least 1 MiB, at most 256 MiB.
fn kept_free(total: u64) -> u64 {
    (total / 20).clamp(1 << 20, 256 << 20)
}

/// The bytes a copy may take on the state directory's filesystem, given
/// its `space` (free, total): what is free less [`kept_free`].
pub fn copy_room(space: (u64, u64)) -> u64 {
    let (free, total) = space;
    free.saturating_sub(kept_free(total))
}

/// [`check_room`] for what `need` says (its figure in it).
fn room_left(need: &str, size: u64, free: u64, total: u64) -> Result<(), String> {
    let keep = kept_free(total);
    if free >= size.saturating_add(keep) {
        return Ok(());
    }
    Err(format!(
        "{need}, and the state directory's filesystem has {} free of {} (at least {} of it stays free for the audit log and the registry)",
        mib(free),
        mib(total),
        mib(keep)
    ))
}

/// The free and total bytes of the filesystem holding `dir` (statvfs(2)),
/// as an unprivileged writer sees them.
pub fn space(dir: &Path) -> anyhow::Result<(u64, u64)> {
    let st = rustix::fs::statvfs(dir).with_context(|| format!("statvfs {}", dir.display()))?;
    Ok((
        st.f_bavail.saturating_mul(st.f_frsize),
        st.f_blocks.saturating_mul(st.f_frsize),
    ))
}

/// Whether a copy of `size` bytes (`what`: a template's base) fits in
/// the state directory's filesystem with [`check_room`]'s share kept
/// free; `space` is [`space`] (a test's stand-in otherwise).
pub fn check_copy_room(what: &str, size: u64, space: (u64, u64)) -> anyhow::Result<()> {
    let (free, total) = space;
    room_left(&format!("{what} needs {}", mib(size)), size, free, total)
        .map_err(|e| anyhow::anyhow!("{e}"))
}

fn mib(n: u64) -> String {
    format!("{:.1} MiB", n as f64 / f64::from(1u32 << 20))
}

/// A program's path: root's usual places first (a service's PATH may
/// lack the sbin directories), then PATH.
fn program(name: &str) -> Option<PathBuf> {
    let fixed = ["/usr/sbin", "/sbin", "/usr/bin", "/bin"].map(|d| Path::new(d).join(name));
    let on_path = std::env::var_os("PATH")
        .map(|p| {
            std::env::split_paths(&p)
                .map(|d| d.join(name))
                .collect::<Vec<_>>()
        })
        .unwrap_or_default();
    fixed.into_iter().chain(on_path).find(|p| p.is_file())
}

/// The setuid `fusermount` (fuse 2) or `fusermount3` (fuse 3): the only
/// way an ordinary user mounts and unmounts a FUSE filesystem in the
/// host's mount namespace.
fn fusermount() -> Option<PathBuf> {
    use std::os::unix::fs::MetadataExt;
    ["fusermount", "fusermount3"]
        .into_iter()
        .filter_map(program)
        .find(|p| std::fs::metadata(p).is_ok_and(|m| m.uid() == 0 && m.mode() & 0o4000 != 0))
}

/// The `fuse2fs` daemons of the volumes this process mounted, by mount
/// point: a FUSE mount is live only while its daemon is.
static DAEMONS: Mutex<BTreeMap<PathBuf, Daemon>> = Mutex::new(BTreeMap::new());

fn daemons() -> std::sync::MutexGuard<'static, BTreeMap<PathBuf, Daemon>> {
    DAEMONS.lock().unwrap_or_else(|p| p.into_inner())
}

/// The writable space of the workspace folder `dir`: `<dir>/volume`,
/// mounted from `<dir>/volume.img` (made of `size` bytes when missing)
/// when `bound` has a mechanism, a plain directory otherwise.
/// Idempotent: a mount already there of this image is kept.
pub fn ensure(dir: &Path, size: u64, bound: &Bound) -> anyhow::Result<PathBuf> {
    let at = dir.join(MOUNT);
    crate::state::private_dir(&at).with_context(|| format!("creating {}", at.display()))?;
    if bound.by().is_none() {
        return Ok(at);
    }
    let image = dir.join(IMAGE);
    if mounted(dir)? {
        return Ok(at);
    }
    if std::fs::symlink_metadata(&image).is_err() {
        // a workspace made without a volume (by an mcpbox before disk
        // budgets, or one allowed to run degraded) keeps its files where
        // they are: a new volume mounted over them would hide them
        let in_use = std::fs::read_dir(&at)
            .with_context(|| format!("reading {}", at.display()))?
            .next()
            .is_some();
        if in_use {
            tracing::warn!(workspace = %dir.display(), "a workspace made without a volume stays unbounded; destroy the sandbox to have it bounded");
            return Ok(at);
        }
        make_image(&image, image_size(size), bound)?;
    } else if let Err(e) = mcpbox_sandbox::volume::refill(&image) {
        // a kept image with holes (made by an mcpbox that did not refill
        // after mkfs): it is mounted all the same, its files are the
        // agent's; its writes may now meet the filesystem's own ENOSPC
        tracing::warn!(image = %image.display(), "the workspace volume could not be wholly reserved again: {e}");
    }
    match bound {
        Bound::Fuse => fuse_mount(&image, &at)?,
        _ => mcpbox_sandbox::volume::attach_and_mount(&image, &at)
            .with_context(|| format!("mounting the workspace volume {}", image.display()))?,
    }
    // the filesystem's root (root's 0755 from mkfs, or the user's) is as
    // private as the folder it is mounted on
    crate::state::private_dir(&at).with_context(|| format!("chmod {}", at.display()))?;
    Ok(at)
}

/// Mounts the kept image of `dir` again when it has one (a sandbox
/// re-adopted after a restart); nothing when it has none.
pub fn remount(dir: &Path) -> anyhow::Result<()> {
    if std::fs::symlink_metadata(dir.join(IMAGE)).is_err() {
        return Ok(());
    }
    let bound = bound();
    if let Bound::Unbounded(why) = &bound {
        bail!(
            "the workspace {} has a volume and it cannot be mounted here: {why}",
            dir.display()
        );
    }
    ensure(dir, 0, &bound).map(drop)
}

/// Whether `<dir>/volume` is the live mount of `<dir>/volume.img`. A
/// mount there of anything else (there should be none: the folder is
/// 0700 and mcpbox's), or a FUSE mount whose daemon is gone (a killed
/// daemon, or one of an mcpbox that exited), is taken down and `false`
/// returned.
fn mounted(dir: &Path) -> anyhow::Result<bool> {
    let at = dir.join(MOUNT);
    let image = dir.join(IMAGE);
    let mounts = mcpbox_sandbox::mountinfo::read();
    let Some(m) = mcpbox_sandbox::mountinfo::at(&mounts, &at) else {
        return Ok(false);
    };
    if is_fuse(m) {
        let live =
            m.source == image.to_string_lossy() && daemons().get(&at).is_some_and(|d| !d.exited());
        if live {
            return Ok(true);
        }
        tracing::warn!(mount = %at.display(), "a workspace volume whose fuse2fs is gone: unmounting it");
        fuse_unmount(&at)?;
        return Ok(false);
    }
    let ours = mcpbox_sandbox::volume::backing_file(&m.device).is_some_and(|b| b == image);
    if ours {
        return Ok(true);
    }
    tracing::warn!(mount = %at.display(), source = %m.source, "a mount that is not this workspace's volume: unmounting it");
    mcpbox_sandbox::volume::unmount(&at).with_context(|| format!("unmounting {}", at.display()))?;
    Ok(false)
}

/// A FUSE mount (`fuse`, `fuse.<subtype>`; fuse2fs's is `fuse.ext4`).
fn is_fuse(m: &mcpbox_sandbox::mountinfo::Mount) -> bool {
    m.fstype == "fuse" || m.fstype.starts_with("fuse.")
}

/// Unmounts `<dir>/volume` while anything is mounted there (the image is
/// kept), and waits for its `fuse2fs`, if any, to end. Nothing to do is
/// fine.
pub fn release(dir: &Path) -> anyhow::Result<()> {
    let at = dir.join(MOUNT);
    for _ in 0..8 {
        let mounts = mcpbox_sandbox::mountinfo::read();
        let Some(m) = mcpbox_sandbox::mountinfo::at(&mounts, &at) else {
            stop_daemon(&at);
            return Ok(());
        };
        if is_fuse(m) {
            fuse_unmount(&at)?;
        } else {
            mcpbox_sandbox::volume::unmount(&at)
                .with_context(|| format!("unmounting the workspace volume {}", at.display()))?;
        }
    }
    bail!("{} is still mounted after 8 unmounts", at.display())
}

/// Reserves and formats a new image of `size` bytes. The free space is
/// looked at first, so the refusal names it; the reservation itself is
/// what holds (a race with another writer ends in ENOSPC here, not
/// later inside the sandbox).
fn make_image(image: &Path, size: u64, bound: &Bound) -> anyhow::Result<()> {
    let parent = image.parent().unwrap_or(Path::new("."));
    let (free, total) = space(parent)?;
    check_room(size, free, total).map_err(|e| anyhow::anyhow!("{e}"))?;
    mcpbox_sandbox::volume::reserve(image, size).map_err(|e| {
        anyhow::anyhow!(
            "reserving {} for the workspace volume {}: {e}",
            mib(size),
            image.display()
        )
    })?;
    // mkfs punches holes where it zeroes: the reservation is made whole
    // again before the image is used (crates/sandbox/src/volume.rs)
    let formatted = format(image, bound).and_then(|()| {
        mcpbox_sandbox::volume::refill(image).map_err(|e| {
            anyhow::anyhow!(
                "reserving {} for the workspace volume {} after mkfs.ext4: {e}",
                mib(size),
                image.display()
            )
        })
    });
    if let Err(e) = formatted {
        let _ = std::fs::remove_file(image);
        return Err(e);
    }
    Ok(())
}

/// `mkfs.ext4` on `image`: no reserved blocks (the whole bound is the
/// sandbox's). As root its root directory is root's; for fuse2fs it is
/// the user's (fuse2fs checks permissions as the kernel would, against
/// the caller's ids) and the filesystem has no journal (fuse2fs does not
/// write one; `e2fsck -p` before each mount stands in for its replay).
fn format(image: &Path, bound: &Bound) -> anyhow::Result<()> {
    let Some(mkfs) = program("mkfs.ext4") else {
        bail!("mkfs.ext4 was not found; install e2fsprogs");
    };
    let mut argv: Vec<String> = vec![
        mkfs.to_string_lossy().into_owned(),
        "-q".into(),
        "-F".into(),
    ];
    argv.extend(["-m".into(), "0".into()]);
    match bound {
        Bound::Fuse => {
            let (uid, gid) = (rustix::process::getuid(), rustix::process::getgid());
            argv.extend([
                "-O".into(),
                "^has_journal".into(),
                "-E".into(),
                format!("root_owner={}:{},nodiscard", uid.as_raw(), gid.as_raw()),
            ]);
        }
        _ => argv.extend(["-E".into(), "root_owner=0:0,nodiscard".into()]),
    }
    argv.push(image.to_string_lossy().into_owned());
    host(&argv, MKFS_TIMEOUT, "mkfs.ext4").and_then(|outcome| {
        if outcome.success() {
            Ok(())
        } else {
            bail!(
                "{} {}: {}",
                mkfs.display(),
                image.display(),
                outcome.describe()
            )
        }
    })
}

/// Runs a host command (no shell, a minimal environment, killed with its
/// group at `timeout`): how it ended.
fn host(
    argv: &[String],
    timeout: Duration,
    what: &str,
) -> anyhow::Result<mcpbox_gateway::host_command::Ended> {
    let cmd = HostCommand::new(argv, timeout).with_context(|| format!("{what}'s command line"))?;
    let outcome = cmd.run().with_context(|| format!("running {}", argv[0]))?;
    Ok(outcome.ended)
}

/// Mounts `image` on `at` with `fuse2fs` (rootless): the image checked
/// and repaired first (`e2fsck -p`: a daemon killed mid-write leaves
/// bitmaps it had not written back), then the daemon started and waited
/// for until its mount is there.
fn fuse_mount(image: &Path, at: &Path) -> anyhow::Result<()> {
    let (Some(fuse2fs), Some(e2fsck)) = (program("fuse2fs"), program("e2fsck")) else {
        bail!("fuse2fs or e2fsck was not found; install fuse2fs and e2fsprogs");
    };
    // another process may still hold the image: the daemon of an mcpbox
    // that has just exited, writing back before it ends
    wait_unused(image)?;
    let argv = [
        e2fsck.to_string_lossy().into_owned(),
        "-p".into(),
        image.to_string_lossy().into_owned(),
    ];
    // e2fsck(8): 0 clean, 1 errors corrected, 2 corrected (reboot: not
    // ours), 4 and up left uncorrected or failed
    match host(&argv, MKFS_TIMEOUT, "e2fsck")? {
        mcpbox_gateway::host_command::Ended::Exited(0..=2) => {}
        other => bail!(
            "the workspace volume {} is damaged and e2fsck -p could not repair it ({}); fix: `e2fsck -f {}`, or destroy the sandbox",
            image.display(),
            other.describe(),
            image.display()
        ),
    }
    // -f: in the foreground, so that the supervisor holds it; the image's
    // path is the mount's source in mountinfo (how a live one is known)
    let argv = [
        fuse2fs.to_string_lossy().into_owned(),
        "-f".into(),
        image.to_string_lossy().into_owned(),
        at.to_string_lossy().into_owned(),
    ];
    let daemon = HostCommand::new(&argv, FUSE_TIMEOUT)
        .context("fuse2fs's command line")?
        .start_daemon()
        .with_context(|| format!("starting {}", fuse2fs.display()))?;
    let until = Instant::now() + FUSE_TIMEOUT;
    loop {
        let mounts = mcpbox_sandbox::mountinfo::read();
        if mcpbox_sandbox::mountinfo::at(&mounts, at).is_some_and(is_fuse) {
            break;
        }
        if daemon.exited() || Instant::now() >= until {
            let ended = daemon.stop();
            bail!(
                "fuse2fs could not mount the workspace volume {} on {}: {}",
                image.display(),
                at.display(),
                match ended {
                    Ok(e) => e.describe(),
                    Err(e) => e.to_string(),
                }
            );
        }
        std::thread::sleep(Duration::from_millis(5));
    }
    // a daemon this replaces (none is expected: mounted() stopped it) is
    // stopped after the map's lock is let go, not while holding it
    let replaced = daemons().insert(at.to_path_buf(), daemon);
    drop(replaced);
    Ok(())
}

/// `fusermount -u` on `at`; lazily (`-z`) when busy (a process the
/// teardown missed): the mount leaves the tree now, and its daemon ends
/// when its last user does. Then its daemon, if this process has it, is
/// waited for.
fn fuse_unmount(at: &Path) -> anyhow::Result<()> {
    let Some(fusermount) = fusermount() else {
        bail!(
            "{} is a FUSE mount and no setuid fusermount was found to unmount it; install fuse",
            at.display()
        );
    };
    let path = at.to_string_lossy().into_owned();
    let prog = fusermount.to_string_lossy().into_owned();
    let plain = host(
        &[prog.clone(), "-u".into(), path.clone()],
        FUSE_TIMEOUT,
        "fusermount",
    )?;
    if !plain.success() {
        let lazy = host(
            &[prog, "-u".into(), "-z".into(), path],
            FUSE_TIMEOUT,
            "fusermount",
        )?;
        if !lazy.success() {
            bail!("fusermount -u -z {}: {}", at.display(), lazy.describe());
        }
    }
    stop_daemon(at);
    Ok(())
}

/// Lets go of `at`'s fuse2fs, if this process started it, and waits for
/// it: unmounted already, it ends by itself; otherwise it is asked to
/// end (crates/gateway/src/host_command.rs, `Daemon::stop`).
fn stop_daemon(at: &Path) {
    let daemon = daemons().remove(at);
    if let Some(d) = daemon {
        // unmounted: it ends on its own once it has written back
        let _ = d.wait_exit(mcpbox_gateway::host_command::TERM_GRACE);
        if let Err(e) = d.stop() {
            tracing::warn!(mount = %at.display(), "fuse2fs: {e}");
        }
    }
}

/// Waits (up to [`FUSE_TIMEOUT`]) until no process of this user has
/// `image` open, from `/proc/<pid>/fd` (only one's own processes can be
/// read there, which are the only ones that can open the 0600 image).
fn wait_unused(image: &Path) -> anyhow::Result<()> {
    let until = Instant::now() + FUSE_TIMEOUT;
    loop {
        let Some(pid) = holder(image) else {
            return Ok(());
        };
        if Instant::now() >= until {
            bail!(
                "the workspace volume {} is still open by process {pid}",
                image.display()
            );
        }
        std::thread::sleep(Duration::from_millis(10));
    }
}

/// A process that has `image` open, if any.
fn holder(image: &Path) -> Option<u32> {
    let me = std::process::id();
    for entry in std::fs::read_dir("/proc").ok()?.flatten() {
        let Some(pid) = entry
            .file_name()
            .to_str()
            .and_then(|n| n.parse::<u32>().ok())
        else {
            continue;
        };
        if pid == me {
            continue;
        }
        let Ok(fds) = std::fs::read_dir(entry.path().join("fd")) else {
            continue;
        };
        for fd in fds.flatten() {
            if std::fs::read_link(fd.path()).is_ok_and(|t| t == image) {
                return Some(pid);
            }
        }
    }
    None
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
    fn a_workspace_nothing_bounds_is_refused_unless_the_policy_allows_it() {
        let none = Bound::Unbounded("no fuse2fs here; fix: install it".into());
        let e = require(&none, false).unwrap_err().to_string();
        assert!(
            e.contains("[filesystem] tmp cannot be enforced here"),
            "{e}"
        );
        assert!(e.contains("fix: install it"), "{e}");
        assert!(e.contains("sandbox.dangerously_allow_degraded"), "{e}");
        assert!(require(&none, true).is_ok());
        assert!(require(&Bound::Volume, false).is_ok());
        assert!(require(&Bound::Fuse, false).is_ok());
        assert_eq!(Bound::Fuse.by(), Some("fuse2fs"));
        assert_eq!(none.by(), None);
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
