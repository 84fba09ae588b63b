//! The system calls of a bounded workspace volume: an image file whose
//! space is reserved up front, attached to a loop device and mounted
//! (root only). What goes where, and the filesystem on the image, is the
//! binary's (`crates/mcpbox/src/volume.rs`); this is the mechanism.

use std::fs::{File, OpenOptions};
use std::io;
use std::os::fd::AsFd;
use std::os::unix::fs::OpenOptionsExt;
use std::path::{Path, PathBuf};

use crate::sys;

/// Creates `image` (it must not exist), mode 0600, with `size` bytes
/// reserved (fallocate: the blocks are allocated now, so the filesystem
/// that holds the image cannot later run out under it). A failed
/// reservation removes the file.
pub fn reserve(image: &Path, size: u64) -> io::Result<()> {
    let file = OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(0o600)
        .custom_flags(libc::O_NOFOLLOW)
        .open(image)?;
    if let Err(e) = sys::fallocate(file.as_fd(), size) {
        drop(file);
        let _ = std::fs::remove_file(image);
        return Err(e);
    }
    file.sync_all()
}

/// Allocates again every block of the existing `image` (to its length)
/// that is a hole (fallocate(2) mode 0 allocates holes and leaves
/// allocated blocks as they are). `mkfs.ext4` zeroes its inode tables
/// and journal by punching holes in a file (FALLOC_FL_PUNCH_HOLE, even
/// with `-E nodiscard`), which gives about a quarter of a small image's
/// reservation back to the filesystem that holds it; without this the
/// sandbox's first writes would take that space from the audit log's
/// filesystem after all. Not O_CREAT: the image must already be there.
pub fn refill(image: &Path) -> io::Result<()> {
    let file = OpenOptions::new()
        .write(true)
        .custom_flags(libc::O_NOFOLLOW)
        .open(image)?;
    let len = file.metadata()?.len();
    sys::fallocate(file.as_fd(), len)?;
    file.sync_all()
}

/// Attaches `image` to a free loop device (`LO_FLAGS_AUTOCLEAR`: the
/// device lets go of the image when the last user, the mount, is gone)
/// and mounts its ext4 on `at` with nosuid and nodev. Not noexec: a
/// bind mount copies the flags of its source, and a server may run a
/// script it wrote to its tmp; the sandbox adds noexec on its own binds
/// when the policy has an exec allow list (crates/sandbox/src/plan.rs).
pub fn attach_and_mount(image: &Path, at: &Path) -> io::Result<()> {
    let backing = OpenOptions::new()
        .read(true)
        .write(true)
        .custom_flags(libc::O_NOFOLLOW)
        .open(image)?;
    let ctl = OpenOptions::new()
        .read(true)
        .write(true)
        .open("/dev/loop-control")?;
    // another process may take the free device between the two calls:
    // LOOP_CONFIGURE then says EBUSY, and the next free one is asked for
    let mut tries = 0;
    let (dev, path) = loop {
        let n = sys::loop_ctl_get_free(ctl.as_fd())?;
        let path = PathBuf::from(format!("/dev/loop{n}"));
        let dev = OpenOptions::new()
            .read(true)
            .write(true)
            .custom_flags(libc::O_CLOEXEC)
            .open(&path)?;
        match sys::loop_configure(dev.as_fd(), backing.as_fd(), sys::LO_FLAGS_AUTOCLEAR) {
            Ok(()) => break (dev, path),
            Err(e) if e.raw_os_error() == Some(libc::EBUSY) && tries < 16 => tries += 1,
            Err(e) => return Err(e),
        }
    };
    let mounted = sys::mount(
        Some(&sys::cstr(&path)?),
        &sys::cstr(at)?,
        Some(c"ext4"),
        libc::MS_NOSUID | libc::MS_NODEV,
        None,
    );
    // the device stays bound while mounted; closing it now (mounted or
    // not) lets AUTOCLEAR release it when nothing uses it any more
    drop::<File>(dev);
    mounted
}

/// Unmounts `at` (never following a symlink there). A mount still busy
/// (a process the teardown missed) is detached lazily: it goes from the
/// tree now and from the kernel when its last user does.
pub fn unmount(at: &Path) -> io::Result<()> {
    let target = sys::cstr(at)?;
    match sys::umount2(&target, libc::UMOUNT_NOFOLLOW) {
        Err(e) if e.raw_os_error() == Some(libc::EBUSY) => {
            sys::umount2(&target, libc::UMOUNT_NOFOLLOW | libc::MNT_DETACH)
        }
        r => r,
    }
}

/// The file behind the loop device `device` ("major:minor", as mountinfo
/// names it), if it is a loop device.
pub fn backing_file(device: &str) -> Option<PathBuf> {
    if device.contains('/') {
        return None;
    }
    let text =
        std::fs::read_to_string(format!("/sys/dev/block/{device}/loop/backing_file")).ok()?;
    Some(PathBuf::from(text.trim_end_matches('\n')))
}
