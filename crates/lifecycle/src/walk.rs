//! Walking and opening inside a tree a sandbox could write to (or another
//! host user: a template's base in a folder they own), without ever
//! following a symlink. The one walker of such trees: artifacts, snapshots
//! and the copy of a template (mcpbox's `lifecycle/workspace.rs`) use it.
//!
//! Every component is opened relative to its parent's descriptor with
//! `O_NOFOLLOW` (openat(2)), directories also with `O_DIRECTORY`, so a
//! component swapped for a symlink between a look and an open makes the
//! open fail (`ELOOP`, `ENOTDIR`) instead of leading out of the tree. Files
//! are opened `O_NONBLOCK` so that a fifo swapped in for a file cannot
//! hang the host (open(2) on a fifo blocks until a writer comes), and
//! what was opened is checked with fstat(2) on the descriptor, not on the
//! name.

use std::ffi::{CStr, CString};
use std::io::{self, Read, Write};
use std::os::fd::{AsFd, BorrowedFd, OwnedFd};
use std::path::Path;

use rustix::fs::{self as rfs, AtFlags, FileType, Mode, OFlags, CWD};
use sha2::{Digest, Sha256};

/// How deep a walk goes; deeper directories are reported, not entered
/// (each level holds one descriptor open).
pub const MAX_DEPTH: usize = 128;

/// Checks a destination a restore or an export will create: it must not
/// exist, or be an empty directory (never a symlink, never a file), and
/// have a final name. Returns that name (for the temporary beside it).
pub(crate) fn fresh_dest(dest: &Path) -> Result<String, String> {
    let name = match dest.file_name() {
        Some(n) => n.to_string_lossy().into_owned(),
        None => return Err("no final name".into()),
    };
    match std::fs::symlink_metadata(dest) {
        Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(name),
        Err(e) => Err(e.to_string()),
        Ok(m) if m.file_type().is_symlink() => Err("a symlink".into()),
        Ok(m) if m.is_dir() => {
            let mut it = std::fs::read_dir(dest).map_err(|e| e.to_string())?;
            if it.next().is_some() {
                Err("exists and is not empty".into())
            } else {
                Ok(name)
            }
        }
        Ok(_) => Err("exists and is not a directory".into()),
    }
}

/// What a directory entry is, from lstat.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    File,
    Dir,
    Symlink,
    Fifo,
    Socket,
    CharDevice,
    BlockDevice,
    Unknown,
}

impl Kind {
    pub fn of(st_mode: u32) -> Kind {
        match FileType::from_raw_mode(st_mode) {
            FileType::RegularFile => Kind::File,
            FileType::Directory => Kind::Dir,
            FileType::Symlink => Kind::Symlink,
            FileType::Fifo => Kind::Fifo,
            FileType::Socket => Kind::Socket,
            FileType::CharacterDevice => Kind::CharDevice,
            FileType::BlockDevice => Kind::BlockDevice,
            FileType::Unknown => Kind::Unknown,
        }
    }

    pub fn as_str(self) -> &'static str {
        match self {
            Kind::File => "file",
            Kind::Dir => "dir",
            Kind::Symlink => "symlink",
            Kind::Fifo => "fifo",
            Kind::Socket => "socket",
            Kind::CharDevice => "char-device",
            Kind::BlockDevice => "block-device",
            Kind::Unknown => "unknown",
        }
    }
}

/// One entry met by [`walk`].
pub struct Node<'a> {
    /// Relative to the walk's root (with its prefix), `/`-separated.
    pub rel: &'a str,
    pub kind: Kind,
    /// From lstat; a file may change after it.
    pub size: u64,
    /// Permission bits (`st_mode & 0o7777`).
    pub mode: u32,
    pub nlink: u64,
    /// All that lstat said (inode, times: what a stamp of a tree takes).
    pub stat: rfs::Stat,
    /// The directory it is in, and its name there, to open it with.
    pub dir: BorrowedFd<'a>,
    pub name: &'a CStr,
}

/// What [`walk`] hands its visitor.
pub enum Visit<'a> {
    Node(Node<'a>),
    /// A name that is not UTF-8 (shown lossily): not entered, not opened.
    BadName {
        rel: String,
        kind: Kind,
    },
    /// A directory deeper than [`MAX_DEPTH`]: not entered.
    TooDeep {
        rel: &'a str,
    },
}

/// An I/O error of a walk or an open, with the relative path it hit.
#[derive(Debug)]
pub struct WalkError {
    pub path: String,
    pub source: io::Error,
}

impl std::fmt::Display for WalkError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}: {}", self.path, self.source)
    }
}

impl std::error::Error for WalkError {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        Some(&self.source)
    }
}

fn at(path: &str) -> impl FnOnce(rustix::io::Errno) -> WalkError + '_ {
    move |e| WalkError {
        path: path.to_string(),
        source: e.into(),
    }
}

const DIR_FLAGS: OFlags = OFlags::RDONLY
    .union(OFlags::DIRECTORY)
    .union(OFlags::NOFOLLOW)
    .union(OFlags::CLOEXEC);
const FILE_FLAGS: OFlags = OFlags::RDONLY
    .union(OFlags::NOFOLLOW)
    .union(OFlags::NONBLOCK)
    .union(OFlags::NOCTTY)
    .union(OFlags::CLOEXEC);

/// Opens the directory `path` (a host path we chose: its parents are
/// trusted) without following a symlink in its last component.
pub fn open_root(path: &Path) -> io::Result<OwnedFd> {
    Ok(rfs::openat(CWD, path, DIR_FLAGS, Mode::empty())?)
}

/// Opens the directory `name` inside `dir`, never through a symlink.
pub(crate) fn open_dir_in(dir: BorrowedFd<'_>, name: &CStr) -> rustix::io::Result<OwnedFd> {
    rfs::openat(dir, name, DIR_FLAGS, Mode::empty())
}

/// Opens `name` inside `dir` for reading, never through a symlink and
/// never blocking on a fifo, and fstats what was opened.
pub fn open_file_in(
    dir: BorrowedFd<'_>,
    name: &CStr,
) -> rustix::io::Result<(std::fs::File, rfs::Stat)> {
    let fd = rfs::openat(dir, name, FILE_FLAGS, Mode::empty())?;
    let st = rfs::fstat(&fd)?;
    Ok((std::fs::File::from(fd), st))
}

/// The components of a relative path from our own walk or a checked
/// manifest; anything else is refused rather than resolved.
fn components(rel: &str) -> io::Result<Vec<CString>> {
    rel.split('/')
        .map(|c| {
            if c.is_empty() || c == "." || c == ".." {
                return Err(io::Error::new(
                    io::ErrorKind::InvalidInput,
                    "not a plain relative path",
                ));
            }
            CString::new(c).map_err(|_| io::Error::new(io::ErrorKind::InvalidInput, "a NUL"))
        })
        .collect()
}

/// Opens the directory `rel` below `root` component by component, each
/// with `O_NOFOLLOW|O_DIRECTORY`; `""` is `root` itself.
pub(crate) fn open_dir_beneath(root: BorrowedFd<'_>, rel: &str) -> Result<OwnedFd, WalkError> {
    descend(root, rel, false)
}

/// Opens `rel` below `root` one component at a time (`O_NOFOLLOW|
/// O_DIRECTORY`), making each missing one first (0700) when `make`.
fn descend(root: BorrowedFd<'_>, rel: &str, make: bool) -> Result<OwnedFd, WalkError> {
    let mut fd = rfs::openat(root, c".", DIR_FLAGS, Mode::empty()).map_err(at(rel))?;
    if rel.is_empty() {
        return Ok(fd);
    }
    for c in components(rel).map_err(|source| WalkError {
        path: rel.to_string(),
        source,
    })? {
        if make {
            match rfs::mkdirat(&fd, &c, Mode::from_raw_mode(0o700)) {
                Ok(()) | Err(rustix::io::Errno::EXIST) => {}
                Err(e) => return Err(at(rel)(e)),
            }
        }
        fd = open_dir_in(fd.as_fd(), &c).map_err(at(rel))?;
    }
    Ok(fd)
}

/// Splits `rel` into its parent directory and last name.
pub(crate) fn split(rel: &str) -> (&str, &str) {
    match rel.rsplit_once('/') {
        Some((parent, name)) => (parent, name),
        None => ("", rel),
    }
}

/// Opens the file `rel` below `root` for reading (parents `O_DIRECTORY`,
/// every component `O_NOFOLLOW`), and fstats the opened descriptor.
pub(crate) fn open_file_beneath(
    root: BorrowedFd<'_>,
    rel: &str,
) -> Result<(std::fs::File, rfs::Stat), WalkError> {
    let (parent, name) = split(rel);
    let dir = open_dir_beneath(root, parent)?;
    let name = CString::new(name).map_err(|_| WalkError {
        path: rel.to_string(),
        source: io::Error::new(io::ErrorKind::InvalidInput, "a NUL"),
    })?;
    open_file_in(dir.as_fd(), &name).map_err(at(rel))
}

/// Makes the directories of `rel` below `root` (mode 0700, an existing
/// directory is fine, a symlink is not) and opens the last one.
pub(crate) fn make_dirs_beneath(root: BorrowedFd<'_>, rel: &str) -> Result<OwnedFd, WalkError> {
    descend(root, rel, true)
}

/// Creates the file `name` in `dir`: `O_CREAT|O_EXCL|O_NOFOLLOW`, so an
/// existing name (a symlink planted there included) is an error, never
/// written through. Mode 0600 until the caller sets the final one.
pub(crate) fn create_file_in(dir: BorrowedFd<'_>, name: &str) -> io::Result<std::fs::File> {
    let name =
        CString::new(name).map_err(|_| io::Error::new(io::ErrorKind::InvalidInput, "a NUL"))?;
    let fd = rfs::openat(
        dir,
        &name,
        OFlags::WRONLY | OFlags::CREATE | OFlags::EXCL | OFlags::NOFOLLOW | OFlags::CLOEXEC,
        Mode::from_raw_mode(0o600),
    )?;
    Ok(std::fs::File::from(fd))
}

/// Walks the directory `root` depth first, names sorted (so two walks of
/// an unchanged tree agree), calling `visit` on each entry below it; the
/// visitor says whether to enter a directory. Entries that vanish between
/// the listing and their lstat are passed over.
pub fn walk<E: From<WalkError>>(
    root: BorrowedFd<'_>,
    prefix: &str,
    visit: &mut dyn FnMut(Visit<'_>) -> Result<bool, E>,
) -> Result<(), E> {
    walk_dir(root, prefix, 0, visit)
}

fn walk_dir<E: From<WalkError>>(
    dir: BorrowedFd<'_>,
    rel: &str,
    depth: usize,
    visit: &mut dyn FnMut(Visit<'_>) -> Result<bool, E>,
) -> Result<(), E> {
    let mut names = Vec::new();
    for entry in rfs::Dir::read_from(dir).map_err(at(rel))? {
        let entry = entry.map_err(at(rel))?;
        let name = entry.file_name();
        if name.to_bytes() == b"." || name.to_bytes() == b".." {
            continue;
        }
        names.push(name.to_owned());
    }
    names.sort();
    for name in names {
        let lossy = name.to_string_lossy();
        let child = if rel.is_empty() {
            lossy.to_string()
        } else {
            format!("{rel}/{lossy}")
        };
        let st = match rfs::statat(dir, &name, AtFlags::SYMLINK_NOFOLLOW) {
            Ok(st) => st,
            Err(rustix::io::Errno::NOENT) => continue,
            Err(e) => return Err(at(&child)(e).into()),
        };
        let kind = Kind::of(st.st_mode);
        if name.to_str().is_err() {
            visit(Visit::BadName { rel: child, kind })?;
            continue;
        }
        if kind == Kind::Dir && depth >= MAX_DEPTH {
            visit(Visit::TooDeep { rel: &child })?;
            continue;
        }
        let node = Node {
            rel: &child,
            kind,
            size: u64::try_from(st.st_size).unwrap_or(0),
            mode: st.st_mode & 0o7777,
            nlink: nlink(&st),
            stat: st,
            dir,
            name: &name,
        };
        if visit(Visit::Node(node))? && kind == Kind::Dir {
            let sub = open_dir_in(dir, &name).map_err(at(&child))?;
            walk_dir(sub.as_fd(), &child, depth + 1, visit)?;
        }
    }
    Ok(())
}

/// `st_nlink`, whose width differs between architectures.
#[allow(clippy::useless_conversion)]
pub(crate) fn nlink(st: &rfs::Stat) -> u64 {
    u64::from(st.st_nlink)
}

/// Copies at most `limit` bytes from `src` to `dst`, hashing them; returns
/// the count and the hex SHA-256.
pub(crate) fn copy_hashing(
    src: &mut dyn Read,
    dst: &mut dyn Write,
    limit: u64,
) -> io::Result<(u64, String)> {
    let mut h = Sha256::new();
    let mut buf = vec![0u8; 64 * 1024];
    let mut left = limit;
    let mut n = 0u64;
    while left > 0 {
        let want = usize::try_from(left.min(buf.len() as u64)).unwrap_or(buf.len());
        let got = match src.read(&mut buf[..want]) {
            Ok(0) => break,
            Ok(k) => k,
            Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
            Err(e) => return Err(e),
        };
        h.update(&buf[..got]);
        dst.write_all(&buf[..got])?;
        n += got as u64;
        left -= got as u64;
    }
    Ok((n, mcpbox_policy::hex::encode(&h.finalize())))
}
