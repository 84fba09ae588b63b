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
//!
//! Mount marks cannot report what happens to directory entries (a create,
//! a delete, a rename: fanotify_mark(2) refuses those events on a mount
//! with EINVAL), and an unprivileged user may not place them at all. So a
//! second kind of group, [`DirWatch`], puts an *inode* mark on every
//! directory of the workspace trees and is told, for each event, the
//! directory's file handle and the entry's name (FAN_REPORT_DFID_NAME):
//! renames with their source and target (FAN_RENAME), deletes, new
//! directories (which it marks in turn) and, where the mount marks are
//! refused (rootless), the reads and writes of files in those directories.
//! An inode mark sees every process's accesses, not only the sandbox's:
//! mcpbox's own are known by their pid (reported even to an unprivileged
//! group, which is told no other pid), and as root a process seen in
//! mcpbox's own pid namespace is a host process and is not counted.

use std::collections::{HashMap, HashSet};
use std::ffi::OsStr;
use std::fs::File;
use std::io;
use std::os::fd::{AsFd, AsRawFd, BorrowedFd, OwnedFd};
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::{MetadataExt, OpenOptionsExt};
use std::path::{Path, PathBuf};

use crate::sys;

const FAN_ACCESS: u64 = 0x01;
const FAN_MODIFY: u64 = 0x02;
const FAN_CLOSE_WRITE: u64 = 0x08;
const FAN_CLOSE_NOWRITE: u64 = 0x10;
const FAN_CREATE: u64 = 0x100;
const FAN_DELETE: u64 = 0x200;
pub(crate) const FAN_Q_OVERFLOW: u64 = 0x4000;
pub(crate) const FAN_EVENT_ON_CHILD: u64 = 0x0800_0000;
const FAN_RENAME: u64 = 0x1000_0000;
const FAN_ONDIR: u64 = 0x4000_0000;

/// fanotify_event_info_header.info_type of the records a
/// FAN_REPORT_DFID_NAME group is given (linux/fanotify.h).
pub(crate) const INFO_DFID_NAME: u8 = 2;
const INFO_OLD_DFID_NAME: u8 = 10;
const INFO_NEW_DFID_NAME: u8 = 12;

/// Most directories one [`DirWatch`] marks (an unprivileged group may hold
/// 8192 marks); those past it are counted in [`DirWatch::unwatched`].
pub const MAX_DIRS: usize = 4096;

/// Most read(2)s of the queue per [`FileWatch::drain`] (each up to 16 KiB
/// of events): a bound, so a flood cannot hold the caller forever.
const MAX_READS: usize = 1024;

/// One access [`FileWatch::drain`] reports.
#[derive(Debug)]
pub struct MountEvent {
    /// The file, opened by the kernel (read-only, no notification).
    pub file: File,
    /// Its path as the sandbox names it, now (or the last it had).
    pub path: PathBuf,
    /// Written, else read.
    pub written: bool,
    /// No name of it is left: removed since.
    pub removed: bool,
}

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

    /// Everything queued now, without blocking: `each` for each event on
    /// a regular file (see [`MountEvent`]). Returns whether events were
    /// lost (the kernel's queue overflowed, an event's file could not be
    /// opened, or the bound on reads was reached).
    pub fn drain(&self, mut each: impl FnMut(MountEvent)) -> bool {
        drain_queued(self.group.as_fd(), |ev| {
            let Some(fd) = ev.file else { return false };
            let link = format!("/proc/self/fd/{}", fd.as_raw_fd());
            let file = File::from(fd);
            // the name first, then the link count: a removal between
            // the two shows in the count, so a name that came with
            // " (deleted)" (proc(5)) always comes with removed
            let Ok(mut path) = std::fs::read_link(&link) else {
                return false;
            };
            let Ok(meta) = file.metadata() else {
                return false;
            };
            if !meta.file_type().is_file() {
                return false;
            }
            let removed = meta.nlink() == 0;
            if removed {
                if let Some(name) = path.as_os_str().as_bytes().strip_suffix(b" (deleted)") {
                    path = PathBuf::from(OsStr::from_bytes(name));
                }
            }
            each(MountEvent {
                file,
                path,
                written: ev.mask & (FAN_MODIFY | FAN_CLOSE_WRITE) != 0,
                removed,
            });
            false
        })
    }
}

/// Reads everything queued on a group of mount marks now, without
/// blocking, and gives each event to `each`, which says whether it lost
/// it. Returns whether anything was lost: the kernel's queue overflowed,
/// it could not open an event's file (EACCES on a device node, EMFILE:
/// that event is lost, not the rest), or the bound on reads was reached.
pub(crate) fn drain_queued(
    group: BorrowedFd<'_>,
    mut each: impl FnMut(sys::FanEvent) -> bool,
) -> bool {
    // Nothing queued is the common case (a drain comes with each call's
    // start and end): one poll(2) then, not a read(2) into a zeroed 16 KiB
    // buffer. An error falls through to the read, which reports it.
    if let Ok(ready) = sys::poll_readable(&[group.as_raw_fd()], Some(0)) {
        if ready.first() == Some(&false) {
            return false;
        }
    }
    let mut lost = false;
    let mut events = Vec::new();
    for round in 0.. {
        if round == MAX_READS {
            return true;
        }
        events.clear();
        match sys::fanotify_read(group, &mut events) {
            Ok(false) => break,
            Ok(true) => {}
            Err(e) if e.raw_os_error() == Some(libc::EINTR) => continue,
            Err(_) => {
                lost = true;
                continue;
            }
        }
        for ev in events.drain(..) {
            if ev.mask & FAN_Q_OVERFLOW != 0 {
                lost = true;
            }
            lost |= each(ev);
        }
    }
    lost
}

/// A tree [`DirWatch`] marks: a host directory and the name the sandbox
/// gives it (`/workspace/output`).
#[derive(Debug, Clone)]
pub struct DirRoot {
    pub host: PathBuf,
    pub sandbox: PathBuf,
}

/// What [`DirWatch::drain`] reports, every path as the sandbox names it.
#[derive(Debug)]
pub enum DirEvent {
    /// A regular file read or written (only when the watch was asked for
    /// accesses), opened by mcpbox beneath its tree.
    Access {
        file: File,
        path: PathBuf,
        written: bool,
    },
    /// A file or directory renamed; `file` is the file at its new name,
    /// when it is one and could be opened.
    Moved {
        from: PathBuf,
        to: PathBuf,
        file: Option<File>,
    },
    /// A file or directory removed.
    Deleted { path: PathBuf },
}

/// One marked tree: a descriptor of its top, beneath which every open
/// stays, and its name in the sandbox.
#[derive(Debug)]
struct Tree {
    top: OwnedFd,
    sandbox: PathBuf,
}

/// An fanotify group with an inode mark on every directory of some trees
/// (see the module's documentation).
#[derive(Debug)]
pub struct DirWatch {
    group: OwnedFd,
    trees: Vec<Tree>,
    /// (file system id, file handle) of each marked directory: its tree
    /// and its path relative to the tree's top (empty for the top).
    dirs: HashMap<([u8; 8], Vec<u8>), (usize, PathBuf)>,
    mask: u64,
    accesses: bool,
    /// This process's pid: mcpbox's own accesses (digests, the walk).
    me: i32,
    /// This process's pid namespace, as root (`/proc/self/ns/pid`): a
    /// process seen in it is on the host, not in the sandbox.
    host_pid_ns: Option<PathBuf>,
    unwatched: usize,
}

/// One event of a FAN_REPORT_DFID_NAME group.
pub(crate) struct NameEvent {
    pub(crate) mask: u64,
    pub(crate) pid: i32,
    pub(crate) records: Vec<NameRecord>,
}

/// One info record of a [`NameEvent`].
pub(crate) struct NameRecord {
    pub(crate) kind: u8,
    pub(crate) fsid: [u8; 8],
    /// The directory's file handle.
    pub(crate) handle: Vec<u8>,
    /// The entry's name in it (empty: the directory itself).
    pub(crate) name: Vec<u8>,
}

impl DirWatch {
    /// Marks every directory of `trees` (at most [`MAX_DIRS`]), for
    /// renames, deletes and new directories and, with `accesses`, for the
    /// reads and writes of the files in them.
    pub fn on_trees(trees: &[DirRoot], accesses: bool) -> io::Result<DirWatch> {
        let group = sys::fanotify_init_names()?;
        let mut mask = FAN_CREATE | FAN_DELETE | FAN_RENAME | FAN_ONDIR;
        if accesses {
            mask |=
                FAN_ACCESS | FAN_CLOSE_NOWRITE | FAN_MODIFY | FAN_CLOSE_WRITE | FAN_EVENT_ON_CHILD;
        }
        let host_pid_ns = if crate::is_host_root() {
            std::fs::read_link("/proc/self/ns/pid").ok()
        } else {
            None
        };
        let mut watch = DirWatch {
            group,
            trees: Vec::new(),
            dirs: HashMap::new(),
            mask,
            accesses,
            me: std::process::id() as i32,
            host_pid_ns,
            unwatched: 0,
        };
        for t in trees {
            // O_DIRECTORY: a mount of a single file (or a FIFO, which a
            // plain open would wait on) has no entries to watch
            let top = match std::fs::OpenOptions::new()
                .read(true)
                .custom_flags(libc::O_DIRECTORY | libc::O_CLOEXEC)
                .open(&t.host)
            {
                Ok(f) => OwnedFd::from(f),
                Err(e) if e.raw_os_error() == Some(libc::ENOTDIR) => continue,
                Err(e) => return Err(e),
            };
            watch.trees.push(Tree {
                top,
                sandbox: t.sandbox.clone(),
            });
            let tree = watch.trees.len() - 1;
            watch
                .mark_tree(tree, PathBuf::new(), &mut |_| {})
                .map_err(|e| {
                    io::Error::new(
                        e.kind(),
                        format!("fanotify mark on {}: {e}", t.host.display()),
                    )
                })?;
        }
        Ok(watch)
    }

    /// The group's descriptor: readable when events are queued.
    pub fn fd(&self) -> BorrowedFd<'_> {
        self.group.as_fd()
    }

    /// Directories left unmarked past [`MAX_DIRS`]: what happens in them
    /// is not seen.
    pub fn unwatched(&self) -> usize {
        self.unwatched
    }

    /// Marks the directory `rel` of `tree` and every directory below it;
    /// `file(rel)` for each other entry found. Every directory is opened
    /// beneath the tree's top with no link followed, so a server that
    /// swaps a directory for a link while it is walked marks nothing of
    /// the host's. Fails only when the top itself cannot be marked.
    fn mark_tree(
        &mut self,
        tree: usize,
        rel: PathBuf,
        file: &mut dyn FnMut(PathBuf),
    ) -> io::Result<()> {
        let mut stack = vec![rel];
        while let Some(rel) = stack.pop() {
            if self.dirs.len() >= MAX_DIRS {
                self.unwatched += 1 + stack.len();
                return Ok(());
            }
            let dir = match self.open_in(tree, &rel, true) {
                Ok(d) => d,
                Err(e) if rel.as_os_str().is_empty() => return Err(e),
                Err(_) => continue,
            };
            match sys::fanotify_mark_dir(self.group.as_fd(), self.mask, dir.as_fd()) {
                Ok(()) => {}
                Err(e) if rel.as_os_str().is_empty() => return Err(e),
                Err(_) => continue,
            }
            if let (Ok(fsid), Ok(handle)) = (sys::fsid(dir.as_fd()), sys::file_handle(dir.as_fd()))
            {
                self.dirs.insert((fsid, handle), (tree, rel.clone()));
            }
            // the entries of the directory just opened, whatever its name
            // has become since
            let Ok(entries) = std::fs::read_dir(format!("/proc/self/fd/{}", dir.as_raw_fd()))
            else {
                continue;
            };
            for entry in entries.flatten() {
                let Ok(kind) = entry.file_type() else {
                    continue;
                };
                let child = rel.join(entry.file_name());
                if kind.is_dir() {
                    stack.push(child);
                } else if kind.is_file() {
                    file(child);
                }
            }
        }
        Ok(())
    }

    /// Opens `rel` beneath the top of `tree`, following no link.
    fn open_in(&self, tree: usize, rel: &Path, directory: bool) -> io::Result<OwnedFd> {
        let rel = if rel.as_os_str().is_empty() {
            Path::new(".")
        } else {
            rel
        };
        let c = sys::cstr(rel)?;
        sys::open_beneath(self.trees[tree].top.as_fd(), &c, directory)
    }

    /// A regular file's descriptor (read-only), opened beneath its tree;
    /// `None` for anything else or when it is gone. Found as O_PATH, and
    /// opened for reading only once it is known to be a regular file,
    /// through its own descriptor (the magic link names that very inode,
    /// whatever its name has become).
    fn open_file(&self, tree: usize, rel: &Path) -> Option<File> {
        let found = File::from(self.open_in(tree, rel, false).ok()?);
        if !found.metadata().ok()?.is_file() {
            return None;
        }
        std::fs::OpenOptions::new()
            .read(true)
            .custom_flags(libc::O_NONBLOCK | libc::O_NOCTTY | libc::O_CLOEXEC)
            .open(format!("/proc/self/fd/{}", found.as_raw_fd()))
            .ok()
    }

    /// The (tree, path relative to its top) a record names.
    fn resolve(&self, fsid: &[u8; 8], handle: &[u8], name: &[u8]) -> Option<(usize, PathBuf)> {
        let (tree, dir) = self.dirs.get(&(*fsid, handle.to_vec()))?;
        if name.is_empty() || name == b"." {
            return Some((*tree, dir.clone()));
        }
        Some((*tree, dir.join(OsStr::from_bytes(name))))
    }

    fn sandbox_path(&self, tree: usize, rel: &Path) -> PathBuf {
        let top = &self.trees[tree].sandbox;
        if rel.as_os_str().is_empty() {
            top.clone()
        } else {
            top.join(rel)
        }
    }

    /// An event of mcpbox's own, or (as root) of a host process.
    fn not_the_sandbox(&self, pid: i32) -> bool {
        if pid == self.me {
            return true;
        }
        let Some(host) = &self.host_pid_ns else {
            return false;
        };
        // a process already gone cannot be placed: it counts, the safe
        // side for an audit
        std::fs::read_link(format!("/proc/{pid}/ns/pid")).is_ok_and(|ns| ns == *host)
    }

    /// Everything queued now, without blocking, each event given to `each`
    /// (see [`DirEvent`]). Returns whether events were lost or may have
    /// been (the queue overflowed, a rename's directories were not known,
    /// the bound on reads was reached, or directories are left unwatched:
    /// what happens in them is never seen, so no list is known whole).
    pub fn drain(&mut self, mut each: impl FnMut(DirEvent)) -> bool {
        let mut lost = self.unwatched > 0;
        // one open per file and kind in a drain, however many events
        let mut opened: HashSet<(usize, PathBuf, bool)> = HashSet::new();
        let group = self.group.as_raw_fd();
        lost |= drain_name_events(group, |ev| {
            !self.not_the_sandbox(ev.pid) && self.event(ev, &mut opened, &mut each)
        });
        lost
    }

    /// One event; true when it could not be placed.
    fn event(
        &mut self,
        ev: &NameEvent,
        opened: &mut HashSet<(usize, PathBuf, bool)>,
        each: &mut impl FnMut(DirEvent),
    ) -> bool {
        let on_dir = ev.mask & FAN_ONDIR != 0;
        let record = |kind: u8| {
            ev.records
                .iter()
                .find(|r| r.kind == kind)
                .and_then(|r| self.resolve(&r.fsid, &r.handle, &r.name))
        };
        if ev.mask & FAN_RENAME != 0 {
            let (Some((from_tree, from)), Some((to_tree, to))) =
                (record(INFO_OLD_DFID_NAME), record(INFO_NEW_DFID_NAME))
            else {
                return true;
            };
            if on_dir && from_tree == to_tree {
                self.moved_dir(from_tree, &from, &to);
            }
            // a directory renamed before its mark was placed (made during
            // the call): marked now, under the name it has
            let known = self.dirs.values().any(|(t, p)| *t == to_tree && *p == to);
            let mut lost_here = false;
            if on_dir && !known {
                lost_here = self.mark_new(to_tree, &to, each);
            }
            let file = if on_dir {
                None
            } else {
                self.open_file(to_tree, &to)
            };
            each(DirEvent::Moved {
                from: self.sandbox_path(from_tree, &from),
                to: self.sandbox_path(to_tree, &to),
                file,
            });
            return lost_here;
        }
        let Some((tree, rel)) = record(INFO_DFID_NAME) else {
            return true;
        };
        let mut lost_here = false;
        if ev.mask & FAN_CREATE != 0 && on_dir {
            lost_here |= self.mark_new(tree, &rel, each);
        }
        let access = FAN_ACCESS | FAN_CLOSE_NOWRITE | FAN_MODIFY | FAN_CLOSE_WRITE;
        if self.accesses && ev.mask & access != 0 && !on_dir {
            let written = ev.mask & (FAN_MODIFY | FAN_CLOSE_WRITE) != 0;
            if opened.insert((tree, rel.clone(), written)) {
                if let Some(file) = self.open_file(tree, &rel) {
                    each(DirEvent::Access {
                        file,
                        path: self.sandbox_path(tree, &rel),
                        written,
                    });
                }
            }
        }
        if ev.mask & FAN_DELETE != 0 {
            if on_dir {
                self.dirs
                    .retain(|_, (t, p)| !(*t == tree && p.starts_with(&rel)));
            }
            each(DirEvent::Deleted {
                path: self.sandbox_path(tree, &rel),
            });
        }
        lost_here
    }

    /// A directory made during the call (seen by its creation, or by a
    /// rename before its mark could be placed): marked now, with all below
    /// it, and (watching accesses) what was made in it before the mark, so
    /// after it and during this call, given as written. True when the
    /// bound on marks left some of it unwatched (the calls in flight are
    /// then told their lists may be short).
    fn mark_new(&mut self, tree: usize, rel: &Path, each: &mut impl FnMut(DirEvent)) -> bool {
        let mut found = Vec::new();
        let before = self.unwatched;
        let _ = self.mark_tree(tree, rel.to_path_buf(), &mut |f| found.push(f));
        if self.accesses {
            for f in found {
                if let Some(file) = self.open_file(tree, &f) {
                    each(DirEvent::Access {
                        file,
                        path: self.sandbox_path(tree, &f),
                        written: true,
                    });
                }
            }
        }
        self.unwatched > before
    }

    /// A marked directory (and all below it) renamed from `from` to `to`.
    fn moved_dir(&mut self, tree: usize, from: &Path, to: &Path) {
        for (t, p) in self.dirs.values_mut() {
            if *t != tree {
                continue;
            }
            if let Ok(rest) = p.strip_prefix(from) {
                *p = to.join(rest);
            }
        }
    }
}

/// Reads everything queued on a FAN_REPORT_DFID_NAME group now, without
/// blocking, and gives each event but an overflow to `each`, which says
/// whether it lost it. Returns whether anything was lost: the queue
/// overflowed, a read failed, or the bound on reads was reached.
pub(crate) fn drain_name_events(
    group: std::os::fd::RawFd,
    mut each: impl FnMut(&NameEvent) -> bool,
) -> bool {
    let mut lost = false;
    // on the stack, as the mount group's: a drain comes twice per call
    let mut buf = [0u8; 16 * 1024];
    for round in 0.. {
        if round == MAX_READS {
            return true;
        }
        let n = match sys::read(group, &mut buf) {
            Ok(0) => break,
            Ok(n) => n,
            Err(e) if e.raw_os_error() == Some(libc::EAGAIN) => break,
            Err(e) if e.raw_os_error() == Some(libc::EINTR) => continue,
            Err(_) => {
                lost = true;
                break;
            }
        };
        for ev in parse_name_events(&buf[..n]) {
            if ev.mask & FAN_Q_OVERFLOW != 0 {
                lost = true;
                continue;
            }
            lost |= each(&ev);
        }
    }
    lost
}

/// The events in one read(2) of a FAN_REPORT_DFID_NAME group; a record
/// that does not parse ends the buffer's events (the kernel's format,
/// fanotify(7): metadata, then info records each with its own length).
pub(crate) fn parse_name_events(buf: &[u8]) -> Vec<NameEvent> {
    const HEAD: usize = 24;
    let u16_at = |b: &[u8], i: usize| u16::from_ne_bytes([b[i], b[i + 1]]) as usize;
    let u32_at = |b: &[u8], i: usize| u32::from_ne_bytes([b[i], b[i + 1], b[i + 2], b[i + 3]]);
    let mut out = Vec::new();
    let mut at = 0usize;
    while buf.len() - at >= HEAD {
        let ev = &buf[at..];
        let len = u32_at(ev, 0) as usize;
        let meta_len = u16_at(ev, 6);
        if ev[4] != libc::FANOTIFY_METADATA_VERSION
            || len < HEAD
            || len > ev.len()
            || meta_len > len
        {
            break;
        }
        let mut mask = [0u8; 8];
        mask.copy_from_slice(&ev[8..16]);
        let pid = u32_at(ev, 20) as i32;
        let mut records = Vec::new();
        let mut r = meta_len;
        // each: info_type u8, pad u8, len u16, fsid [u8; 8], handle_bytes
        // u32, handle_type i32, the handle, then the NUL-ended name
        while len - r >= 4 {
            let kind = ev[r];
            let rlen = u16_at(ev, r + 2);
            if rlen < 4 || rlen > len - r {
                break;
            }
            let rec = &ev[r..r + rlen];
            if matches!(
                kind,
                INFO_DFID_NAME | INFO_OLD_DFID_NAME | INFO_NEW_DFID_NAME
            ) && rec.len() >= 20
            {
                let mut fsid = [0u8; 8];
                fsid.copy_from_slice(&rec[4..12]);
                let hlen = u32_at(rec, 12) as usize;
                if 20 + hlen <= rec.len() {
                    let handle = rec[20..20 + hlen].to_vec();
                    let rest = &rec[20 + hlen..];
                    let name = rest.split(|b| *b == 0).next().unwrap_or_default().to_vec();
                    records.push(NameRecord {
                        kind,
                        fsid,
                        handle,
                        name,
                    });
                }
            }
            r += rlen;
        }
        out.push(NameEvent {
            mask: u64::from_ne_bytes(mask),
            pid,
            records,
        });
        at += len;
    }
    out
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    /// Runs `script` in a shell: another process, whose events count.
    fn sh(dir: &Path, script: &str) {
        let ok = std::process::Command::new("sh")
            .arg("-c")
            .arg(script)
            .current_dir(dir)
            .status()
            .unwrap()
            .success();
        assert!(ok, "{script}");
    }

    fn events(w: &mut DirWatch) -> Vec<String> {
        let mut out = Vec::new();
        let lost = w.drain(|e| {
            out.push(match e {
                DirEvent::Access { path, written, .. } => {
                    format!(
                        "{} {}",
                        if written { "write" } else { "read" },
                        path.display()
                    )
                }
                DirEvent::Moved { from, to, file } => {
                    format!(
                        "move {} {} {}",
                        from.display(),
                        to.display(),
                        file.is_some()
                    )
                }
                DirEvent::Deleted { path } => format!("delete {}", path.display()),
            })
        });
        assert!(!lost);
        out
    }

    #[test]
    fn renames_deletes_and_new_directories_are_named_as_the_sandbox_names_them() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::create_dir(dir.path().join("sub")).unwrap();
        std::fs::write(dir.path().join("sub/a"), b"a").unwrap();
        std::fs::write(dir.path().join("gone"), b"g").unwrap();
        let roots = [DirRoot {
            host: dir.path().to_path_buf(),
            sandbox: "/workspace/output".into(),
        }];
        let mut w = DirWatch::on_trees(&roots, true).unwrap();
        // mcpbox's own accesses are not the sandbox's
        std::fs::read(dir.path().join("sub/a")).unwrap();
        assert_eq!(events(&mut w), Vec::<String>::new());

        sh(dir.path(), "mv sub/a sub/b && rm gone");
        let seen = events(&mut w);
        assert!(
            seen.contains(&"move /workspace/output/sub/a /workspace/output/sub/b true".to_string()),
            "{seen:?}"
        );
        assert!(
            seen.contains(&"delete /workspace/output/gone".to_string()),
            "{seen:?}"
        );
        sh(dir.path(), "mv sub moved");
        let seen = events(&mut w);
        assert!(
            seen.contains(&"move /workspace/output/sub /workspace/output/moved false".to_string()),
            "{seen:?}"
        );

        // the renamed directory is still watched, under its new name; a new
        // one is marked, and what was made in it counts as written
        sh(
            dir.path(),
            "cat moved/b >/dev/null && mkdir -p new/deep && echo x > new/deep/f",
        );
        let seen = events(&mut w);
        assert!(
            seen.contains(&"read /workspace/output/moved/b".to_string()),
            "{seen:?}"
        );
        assert!(
            seen.contains(&"write /workspace/output/new/deep/f".to_string()),
            "{seen:?}"
        );
        // made and renamed before the queue was read: marked under the
        // name it has
        sh(dir.path(), "mkdir fresh && mv fresh fresh2");
        let seen = events(&mut w);
        assert!(
            seen.contains(
                &"move /workspace/output/fresh /workspace/output/fresh2 false".to_string()
            ),
            "{seen:?}"
        );
        sh(dir.path(), "echo x > fresh2/f");
        let seen = events(&mut w);
        assert!(
            seen.contains(&"write /workspace/output/fresh2/f".to_string()),
            "{seen:?}"
        );
        sh(dir.path(), "mv new/deep/f new/deep/g");
        let seen = events(&mut w);
        assert!(
            seen.contains(
                &"move /workspace/output/new/deep/f /workspace/output/new/deep/g true".to_string()
            ),
            "{seen:?}"
        );
    }

    #[test]
    fn a_directory_swapped_for_a_link_is_not_followed_out_of_the_tree() {
        let dir = tempfile::tempdir().unwrap();
        let outside = tempfile::tempdir().unwrap();
        std::fs::write(outside.path().join("secret"), b"s").unwrap();
        std::fs::create_dir(dir.path().join("sub")).unwrap();
        let roots = [DirRoot {
            host: dir.path().to_path_buf(),
            sandbox: "/workspace/output".into(),
        }];
        let mut w = DirWatch::on_trees(&roots, true).unwrap();
        // a file read in sub, then sub replaced by a link to another tree
        // holding a file of the same name before the queue is read
        sh(
            dir.path(),
            "echo s > sub/secret && cat sub/secret >/dev/null",
        );
        sh(
            dir.path(),
            &format!("rm -r sub && ln -s {} sub", outside.path().display()),
        );
        let seen = events(&mut w);
        // the write and read are reported only if the file could be opened
        // beneath the tree; never through the link
        let mut files = Vec::new();
        w.drain(|e| {
            if let DirEvent::Access { file, .. } = e {
                files.push(file)
            }
        });
        assert!(files.is_empty());
        assert!(
            seen.iter()
                .all(|s| !s.starts_with("read") && !s.starts_with("write")),
            "{seen:?}"
        );
    }

    #[test]
    fn a_flood_of_directories_past_the_bound_is_counted_and_flagged_lost() {
        let dir = tempfile::tempdir().unwrap();
        for i in 0..MAX_DIRS + 10 {
            std::fs::create_dir(dir.path().join(format!("d{i}"))).unwrap();
        }
        let roots = [DirRoot {
            host: dir.path().to_path_buf(),
            sandbox: "/workspace/output".into(),
        }];
        let mut w = DirWatch::on_trees(&roots, false).unwrap();
        assert_eq!(w.unwatched(), 11, "the top and 4095 below it are marked");
        // every mark is taken: a directory made now cannot be watched
        sh(dir.path(), "mkdir d0/more");
        assert!(w.drain(drop), "the calls in flight are told");
    }
}
