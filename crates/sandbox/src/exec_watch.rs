//! The programs a sandbox executes, as the kernel reports them: a
//! fanotify(7) group watching `FAN_OPEN_EXEC` (Linux 5.0+), the open of a
//! file by execve(2) (the program, and its ELF interpreter or `#!`
//! interpreter, each an exec open of its own). Used by `mcpbox learn` only:
//! `run` and `serve` never pay for it.
//!
//! Two ways, as for the file watch (`fanotify.rs`):
//!
//! - **as root**, *mount* marks on the sandbox's read-only mounts that hold
//!   programs (the system directories, the runtime's and the policy's
//!   read-only mounts, `/workspace/input`), each reached through
//!   `/proc/INIT/root/PATH`: the path resolves in the sandbox's mount
//!   namespace to the sandbox's own bind mount, and a mount mark sees only
//!   what is done through that mount, so only the sandbox's executions are
//!   seen, wherever in the tree the program is. Each event comes with a
//!   descriptor of the file, whose name (`/proc/self/fd/N`) is the
//!   sandbox's;
//! - **rootless** (fanotify_mark(2) refuses mount marks to an unprivileged
//!   user), *inode* marks with `FAN_EVENT_ON_CHILD` on a bounded list of
//!   directories ([`MAX_DIRS`]: the sandbox's `PATH` and the top of each
//!   read-only mount), each event naming the directory's file handle and
//!   the entry. Only programs directly in those directories are seen, and
//!   an inode mark sees every process's executions, so another process of
//!   the same user running a program from one of them during the session
//!   is counted (as the `kernel-dirs` file watch counts its accesses).
//!
//! Every path is the sandbox's name for the program.

use std::collections::HashMap;
use std::ffi::OsStr;
use std::io;
use std::os::fd::{AsFd, AsRawFd, BorrowedFd, OwnedFd};
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::OpenOptionsExt;
use std::path::{Path, PathBuf};

use crate::fanotify::{drain_name_events, drain_queued, FAN_EVENT_ON_CHILD, INFO_DFID_NAME};
use crate::sys;

/// fanotify(7): a file opened for execution (execve, uselib).
const FAN_OPEN_EXEC: u64 = 0x1000;

/// Most directories the rootless watch marks; the rest are counted.
pub const MAX_DIRS: usize = 256;

/// A directory the rootless watch marks: the host's directory and the
/// sandbox's name for it.
#[derive(Debug, Clone)]
pub struct ExecDir {
    pub host: PathBuf,
    pub sandbox: PathBuf,
}

#[derive(Debug)]
enum Marks {
    /// Mount marks, events with descriptors.
    Mounts,
    /// Inode marks on directories: (fsid, handle) to the sandbox's name.
    Dirs(HashMap<([u8; 8], Vec<u8>), PathBuf>),
}

/// A fanotify group reporting the sandbox's executions.
#[derive(Debug)]
pub struct ExecWatch {
    group: OwnedFd,
    marks: Marks,
    /// This process's pid: its own executions are not the sandbox's.
    me: i32,
    unwatched: usize,
    /// Paths that could not be marked (missing in this sandbox, say).
    skipped: Vec<PathBuf>,
}

impl ExecWatch {
    /// Mount marks (as root) on the mounts that `paths` are on, each as this
    /// process resolves it (`/proc/INIT/root/usr`). A path that does not
    /// exist is skipped; fails when the kernel refuses the group or a mark
    /// (EPERM rootless), or when no path could be marked.
    pub fn on_mounts(paths: &[PathBuf]) -> io::Result<ExecWatch> {
        let group = sys::fanotify_init_notify()?;
        let mut marked = 0usize;
        let mut skipped = Vec::new();
        for path in paths {
            let c = sys::cstr(path)?;
            match sys::fanotify_mark_mount(group.as_fd(), FAN_OPEN_EXEC, &c) {
                Ok(()) => marked += 1,
                Err(e) if matches!(e.raw_os_error(), Some(libc::ENOENT | libc::ENOTDIR)) => {
                    skipped.push(path.clone())
                }
                Err(e) => {
                    return Err(io::Error::new(
                        e.kind(),
                        format!("fanotify exec mark on {}: {e}", path.display()),
                    ))
                }
            }
        }
        if marked == 0 {
            return Err(io::Error::other("no mount could be marked for executions"));
        }
        Ok(ExecWatch {
            group,
            marks: Marks::Mounts,
            me: std::process::id() as i32,
            unwatched: 0,
            skipped,
        })
    }

    /// Inode marks (rootless) on each of `dirs` (at most [`MAX_DIRS`], the
    /// rest counted in [`ExecWatch::unwatched`]), for the executions of
    /// the files directly in them. A directory that cannot be opened is
    /// skipped; fails when the kernel refuses the group or no directory
    /// could be marked.
    pub fn on_dirs(dirs: &[ExecDir]) -> io::Result<ExecWatch> {
        let group = sys::fanotify_init_names()?;
        let mut known = HashMap::new();
        let mut skipped = Vec::new();
        let mut unwatched = 0usize;
        let mut last_err = None;
        for d in dirs {
            if known.len() >= MAX_DIRS {
                unwatched += 1;
                continue;
            }
            let dir = match std::fs::OpenOptions::new()
                .read(true)
                .custom_flags(libc::O_DIRECTORY | libc::O_CLOEXEC)
                .open(&d.host)
            {
                Ok(f) => OwnedFd::from(f),
                Err(_) => {
                    skipped.push(d.sandbox.clone());
                    continue;
                }
            };
            let (Ok(fsid), Ok(handle)) = (sys::fsid(dir.as_fd()), sys::file_handle(dir.as_fd()))
            else {
                skipped.push(d.sandbox.clone());
                continue;
            };
            if known.contains_key(&(fsid, handle.clone())) {
                continue;
            }
            match sys::fanotify_mark_dir(
                group.as_fd(),
                FAN_OPEN_EXEC | FAN_EVENT_ON_CHILD,
                dir.as_fd(),
            ) {
                Ok(()) => {
                    known.insert((fsid, handle), d.sandbox.clone());
                }
                Err(e) => {
                    skipped.push(d.sandbox.clone());
                    last_err = Some(e);
                }
            }
        }
        if known.is_empty() {
            return Err(last_err.unwrap_or_else(|| {
                io::Error::other("no directory could be marked for executions")
            }));
        }
        Ok(ExecWatch {
            group,
            marks: Marks::Dirs(known),
            me: std::process::id() as i32,
            unwatched,
            skipped,
        })
    }

    /// Whether the marks are on mounts (everything the sandbox executes
    /// from them) rather than on directories (only what is directly in
    /// them, and any process's).
    pub fn on_whole_mounts(&self) -> bool {
        matches!(self.marks, Marks::Mounts)
    }

    /// Directories past [`MAX_DIRS`], not watched.
    pub fn unwatched(&self) -> usize {
        self.unwatched
    }

    /// The paths that could not be marked.
    pub fn skipped(&self) -> &[PathBuf] {
        &self.skipped
    }

    /// The group's descriptor: readable when events are queued.
    pub fn fd(&self) -> BorrowedFd<'_> {
        self.group.as_fd()
    }

    /// Waits up to `timeout_ms` for events; true when some are queued.
    pub fn wait(&self, timeout_ms: u64) -> io::Result<bool> {
        Ok(
            sys::poll_readable(&[self.group.as_raw_fd()], Some(timeout_ms))?
                .first()
                .copied()
                .unwrap_or(false),
        )
    }

    /// Everything queued now, without blocking: `each` with the sandbox's
    /// path of each program executed. True when events were lost (the
    /// queue overflowed, an event could not be placed, the bound on reads).
    pub fn drain(&self, mut each: impl FnMut(PathBuf)) -> bool {
        match &self.marks {
            Marks::Mounts => self.drain_mounts(&mut each),
            Marks::Dirs(known) => self.drain_dirs(known, &mut each),
        }
    }

    fn drain_mounts(&self, each: &mut impl FnMut(PathBuf)) -> bool {
        drain_queued(self.group.as_fd(), |ev| {
            let Some(fd) = ev.file else { return false };
            match std::fs::read_link(format!("/proc/self/fd/{}", fd.as_raw_fd())) {
                Ok(path) => {
                    each(path);
                    false
                }
                Err(_) => true,
            }
        })
    }

    fn drain_dirs(
        &self,
        known: &HashMap<([u8; 8], Vec<u8>), PathBuf>,
        each: &mut impl FnMut(PathBuf),
    ) -> bool {
        drain_name_events(self.group.as_raw_fd(), |ev| {
            if ev.pid == self.me {
                return false;
            }
            let placed = ev
                .records
                .iter()
                .find(|r| r.kind == INFO_DFID_NAME)
                .and_then(|r| {
                    let dir = known.get(&(r.fsid, r.handle.clone()))?;
                    (!r.name.is_empty()).then(|| dir.join(OsStr::from_bytes(&r.name)))
                });
            match placed {
                Some(p) => {
                    each(p);
                    false
                }
                None => true,
            }
        })
    }
}

/// The directory of each `PATH` entry, as the sandbox names it.
pub fn path_dirs(path: &OsStr) -> Vec<PathBuf> {
    path.as_bytes()
        .split(|b| *b == b':')
        .filter(|d| d.starts_with(b"/"))
        .map(|d| Path::new(OsStr::from_bytes(d)).to_path_buf())
        .collect()
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    #[test]
    fn a_program_run_from_a_watched_directory_is_named_as_the_sandbox_names_it() {
        let dir = tempfile::tempdir().unwrap();
        // a copy of a program in a directory of its own (the host's /usr/bin
        // is busy with other processes' executions)
        let prog = dir.path().join("true");
        std::fs::copy("/bin/true", &prog).unwrap();
        let w = ExecWatch::on_dirs(&[ExecDir {
            host: dir.path().to_path_buf(),
            sandbox: "/opt/tools".into(),
        }])
        .unwrap();
        assert!(!w.on_whole_mounts());
        // another process runs it: an inode mark counts it
        let ok = std::process::Command::new("sh")
            .arg("-c")
            .arg(format!("{} && true", prog.display()))
            .status()
            .unwrap()
            .success();
        assert!(ok);
        assert!(w.wait(2000).unwrap());
        let mut seen = Vec::new();
        let lost = w.drain(|p| seen.push(p));
        assert!(!lost);
        assert!(seen.contains(&PathBuf::from("/opt/tools/true")), "{seen:?}");
    }

    #[test]
    fn path_dirs_keeps_only_absolute_entries() {
        assert_eq!(
            path_dirs(OsStr::new("/usr/bin:relative::/bin")),
            vec![PathBuf::from("/usr/bin"), PathBuf::from("/bin")]
        );
    }
}
