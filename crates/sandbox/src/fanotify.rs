//! The kernel's account of the files a sandboxed server reads and writes:
//! a fanotify(7) group with *mount* marks on the sandbox's own workspace
//! mounts (the relay's `touched` module gives its events to tool calls).
//!
//! Why mount marks, reached through `/proc/PID/root`: the path resolves in
//! the sandbox's mount namespace to the sandbox's own bind mount, and a
//! mount mark sees only accesses made through that mount: the server's,
//! never mcpbox's own reads of the host directory, nor any host process's.
//! fanotify_init(2) gives file descriptors with events, and fanotify_mark(2)
//! marks a mount of a host file system, only to CAP_SYS_ADMIN in the
//! initial user namespace; without it [`FileWatch::on_mounts`] fails with
//! EPERM and the caller falls back to what it had.
//!
//! The events: FAN_ACCESS (read), FAN_CLOSE_NOWRITE (opened read-only and
//! closed: a read through mmap(2) makes no FAN_ACCESS, and an open without
//! a read counts as a read, the safe side for an audit), FAN_MODIFY
//! (written), FAN_CLOSE_WRITE (opened for writing and closed: a truncation
//! without a write, or a write through a shared mapping, counts).
//! The kernel opens each event's file for us with FMODE_NONOTIFY, so
//! reading it for a digest makes no event of its own.

use std::fs::File;
use std::io;
use std::os::fd::{AsFd, AsRawFd, BorrowedFd, OwnedFd};
use std::path::PathBuf;

use crate::sys;

const FAN_ACCESS: u64 = 0x01;
const FAN_MODIFY: u64 = 0x02;
const FAN_CLOSE_WRITE: u64 = 0x08;
const FAN_CLOSE_NOWRITE: u64 = 0x10;
const FAN_Q_OVERFLOW: u64 = 0x4000;

/// Most read(2)s of the queue per [`FileWatch::drain`] (each up to 16 KiB
/// of events): a bound, so a flood cannot hold the caller forever.
const MAX_READS: usize = 1024;

/// A fanotify group marking a sandbox's workspace mounts.
#[derive(Debug)]
pub struct FileWatch {
    group: OwnedFd,
}

impl FileWatch {
    /// A group marking the mounts that `paths` are on (each as this process
    /// resolves it, e.g. `/proc/PID/root/workspace/output`).
    pub fn on_mounts(paths: &[PathBuf]) -> io::Result<FileWatch> {
        let group = sys::fanotify_init_notify()?;
        for path in paths {
            let c = sys::cstr(path)?;
            let mask = FAN_ACCESS | FAN_CLOSE_NOWRITE | FAN_MODIFY | FAN_CLOSE_WRITE;
            sys::fanotify_mark_mount(group.as_fd(), mask, &c).map_err(|e| {
                io::Error::new(
                    e.kind(),
                    format!("fanotify mark on {}: {e}", path.display()),
                )
            })?;
        }
        Ok(FileWatch { group })
    }

    /// The group's descriptor: readable when events are queued.
    pub fn fd(&self) -> BorrowedFd<'_> {
        self.group.as_fd()
    }

    /// Everything queued now, without blocking: `each(file, path, written)`
    /// for each event on a regular file (the path as the sandbox names it,
    /// `/workspace/output/a.txt`). Returns whether events were lost (the
    /// kernel's queue overflowed, an event's file could not be opened, or
    /// the bound on reads was reached).
    pub fn drain(&self, mut each: impl FnMut(File, PathBuf, bool)) -> bool {
        let mut lost = false;
        let mut events = Vec::new();
        for round in 0.. {
            if round == MAX_READS {
                return true;
            }
            events.clear();
            match sys::fanotify_read(self.group.as_fd(), &mut events) {
                Ok(false) => break,
                Ok(true) => {}
                Err(e) if e.raw_os_error() == Some(libc::EINTR) => continue,
                // the kernel could not open one event's file (EACCES on a
                // device node, EMFILE): that event is lost, not the rest
                Err(_) => {
                    lost = true;
                    continue;
                }
            }
            for ev in events.drain(..) {
                if ev.mask & FAN_Q_OVERFLOW != 0 {
                    lost = true;
                }
                let Some(fd) = ev.file else { continue };
                let link = format!("/proc/self/fd/{}", fd.as_raw_fd());
                let file = File::from(fd);
                if !file.metadata().is_ok_and(|m| m.file_type().is_file()) {
                    continue;
                }
                let Ok(path) = std::fs::read_link(&link) else {
                    continue;
                };
                each(file, path, ev.mask & (FAN_MODIFY | FAN_CLOSE_WRITE) != 0);
            }
        }
        lost
    }
}
