//! `read_file`, `write_file`, `list_files`, `delete_file`: inside
//! /workspace only.
//!
//! Two checks, on two sides. The gateway refuses a path argument that
//! names a place outside /workspace as written (`mcpbox_policy::confine_path`,
//! reason `argument.path_outside`); here every path is opened with
//! openat2(2) and `RESOLVE_BENEATH` from a descriptor of /workspace, so
//! that a symlink, a `..` after one, or a magic link in /proc cannot lead
//! out either: the kernel refuses (EXDEV) what a string check cannot see.
//! Where openat2 is missing (gVisor's kernel), a walk of one component at
//! a time with `O_NOFOLLOW` stands in, refusing every symlink on the way.

use std::ffi::{CStr, CString};
use std::fs::File;
use std::io::{Read, Seek, SeekFrom, Write};
use std::os::fd::{AsFd, BorrowedFd, OwnedFd};

use mcpbox_policy::Reason;
use rustix::fs::{openat2, AtFlags, FileType, Mode, OFlags, ResolveFlags};
use rustix::io::Errno;
use serde_json::{json, Value};

/// A refused or failed file operation, with the reason code a result names.
#[derive(Debug)]
pub struct Refusal {
    pub reason: Option<Reason>,
    pub message: String,
}

impl Refusal {
    fn outside(path: &str, why: &str) -> Refusal {
        Refusal {
            reason: Some(Reason::ArgumentPathOutside),
            message: format!(
                "{path}: outside the workspace ({why}); only paths under /workspace are served"
            ),
        }
    }

    fn io(path: &str, e: Errno) -> Refusal {
        if e == Errno::XDEV {
            return Refusal::outside(path, "a symlink on the way leads out");
        }
        let what = match e {
            Errno::NOENT => "no such file or directory".to_string(),
            Errno::ROFS => "read-only (the template's input is; write under /workspace/output or /workspace/tmp)".to_string(),
            Errno::ISDIR => "is a directory".to_string(),
            Errno::NOTDIR => "not a directory".to_string(),
            Errno::NOTEMPTY => "directory not empty (pass recursive: true)".to_string(),
            Errno::LOOP => "too many symlinks".to_string(),
            // the sandbox's bounded writable space (the policy's
            // [filesystem] tmp holds output and tmp together) is used up
            Errno::NOSPC | Errno::DQUOT => "the workspace is full: output and tmp together are bounded by the policy's [filesystem] tmp; delete files to make room".to_string(),
            other => std::io::Error::from(other).to_string(),
        };
        Refusal {
            reason: None,
            message: format!("{path}: {what}"),
        }
    }

    pub fn invalid(message: String) -> Refusal {
        Refusal {
            reason: Some(Reason::ArgumentInvalid),
            message,
        }
    }
}

/// The most entries one `list_files` returns.
const MAX_LIST: usize = 10_000;
/// How deep a recursive listing or deletion descends.
const MAX_DEPTH: usize = 64;

/// Opens `rel` (a confined relative path: [`Root::rel`]) beneath `root`
/// one component at a time, where openat2(2) is missing: every
/// directory on the way opened `O_PATH | O_NOFOLLOW` from the one before,
/// and the last with `flags | O_NOFOLLOW`. Stricter than
/// `RESOLVE_BENEATH`, never looser: a symlink anywhere on the way is
/// refused (EXDEV), even one that would stay inside, and so is every
/// magic link; `..` cannot occur (the path is normalised and confined).
fn walk_beneath(root: &OwnedFd, rel: &str, flags: OFlags, mode: Mode) -> Result<OwnedFd, Errno> {
    let parts: Vec<&str> = rel
        .split('/')
        .filter(|p| !p.is_empty() && *p != ".")
        .collect();
    if parts.contains(&"..") {
        return Err(Errno::XDEV);
    }
    let open = |at: BorrowedFd<'_>, name: &str, flags: OFlags, mode: Mode| loop {
        match rustix::fs::openat(at, name, flags | OFlags::CLOEXEC | OFlags::NOFOLLOW, mode) {
            Err(Errno::INTR) => continue,
            r => return r,
        }
    };
    let Some((last, dirs)) = parts.split_last() else {
        // the root itself
        return open(root.as_fd(), ".", flags, mode);
    };
    let mut dir: Option<OwnedFd> = None;
    for name in dirs {
        let at = dir.as_ref().map_or(root.as_fd(), |d| d.as_fd());
        let next = open(at, name, OFlags::PATH, Mode::empty())?;
        let st = rustix::fs::fstat(&next)?;
        match FileType::from_raw_mode(st.st_mode) {
            FileType::Directory => dir = Some(next),
            FileType::Symlink => return Err(Errno::XDEV),
            _ => return Err(Errno::NOTDIR),
        }
    }
    let at = dir.as_ref().map_or(root.as_fd(), |d| d.as_fd());
    match open(at, last, flags, mode) {
        // O_NOFOLLOW on a symlink: ELOOP; O_PATH opens the link itself
        Err(Errno::LOOP) => Err(Errno::XDEV),
        Ok(fd) if flags.contains(OFlags::PATH) => {
            let st = rustix::fs::fstat(&fd)?;
            if FileType::from_raw_mode(st.st_mode) == FileType::Symlink {
                Err(Errno::XDEV)
            } else {
                Ok(fd)
            }
        }
        r => r,
    }
}

/// The workspace, as a descriptor every path is resolved beneath.
pub struct Root {
    fd: OwnedFd,
    /// Where it is ("/workspace" in the sandbox).
    pub path: String,
}

fn beneath() -> ResolveFlags {
    // RESOLVE_BENEATH: no absolute symlink, no `..` above the root, no
    // escape at all (openat2(2)); NO_MAGICLINKS: no /proc/self/fd/N jumps.
    ResolveFlags::BENEATH | ResolveFlags::NO_MAGICLINKS
}

impl Root {
    pub fn open(path: &str) -> std::io::Result<Root> {
        let fd = rustix::fs::open(
            path,
            OFlags::PATH | OFlags::DIRECTORY | OFlags::CLOEXEC,
            Mode::empty(),
        )?;
        Ok(Root {
            fd,
            path: path.trim_end_matches('/').to_string(),
        })
    }

    /// `path` checked and made relative to the root ("." for the root).
    pub fn rel(&self, path: &str) -> Result<String, Refusal> {
        let abs = mcpbox_policy::confine_path(path, &self.path)
            .map_err(|why| Refusal::outside(path, &why))?;
        let rel = abs
            .strip_prefix(&self.path)
            .unwrap_or("")
            .trim_start_matches('/');
        Ok(if rel.is_empty() {
            ".".into()
        } else {
            rel.into()
        })
    }

    fn open_at(&self, rel: &str, flags: OFlags, mode: Mode) -> Result<OwnedFd, Errno> {
        loop {
            match openat2(&self.fd, rel, flags | OFlags::CLOEXEC, mode, beneath()) {
                Err(Errno::AGAIN) | Err(Errno::INTR) => continue,
                // A kernel without openat2 (gVisor's, under isolation =
                // "gvisor", or Linux before 5.6): the walk below.
                Err(Errno::NOSYS) => return walk_beneath(&self.fd, rel, flags, mode),
                r => return r,
            }
        }
    }

    /// Opens a regular file for reading; anything else is refused.
    pub fn open_regular(&self, path: &str) -> Result<(File, u64, String), Refusal> {
        let rel = self.rel(path)?;
        let fd = self
            .open_at(&rel, OFlags::RDONLY | OFlags::NOFOLLOW, Mode::empty())
            .map_err(|e| Refusal::io(path, e))?;
        let st = rustix::fs::fstat(&fd).map_err(|e| Refusal::io(path, e))?;
        if FileType::from_raw_mode(st.st_mode) != FileType::RegularFile {
            return Err(Refusal::invalid(format!("{path}: not a regular file")));
        }
        Ok((File::from(fd), u64::try_from(st.st_size).unwrap_or(0), rel))
    }

    /// `read_file`: up to `max` bytes from `offset`, as text when it is
    /// UTF-8, else base64.
    pub fn read(&self, path: &str, offset: u64, max: u64) -> Result<Value, Refusal> {
        let (mut f, size, rel) = self.open_regular(path)?;
        f.seek(SeekFrom::Start(offset))
            .map_err(|e| io_err(path, &e))?;
        let mut buf = Vec::new();
        f.take(max)
            .read_to_end(&mut buf)
            .map_err(|e| io_err(path, &e))?;
        let end = offset + buf.len() as u64;
        let (content, encoding) = match String::from_utf8(buf) {
            Ok(s) => (s, "utf-8"),
            Err(e) => (crate::encode_base64(e.as_bytes()), "base64"),
        };
        Ok(json!({
            "path": self.show(&rel),
            "size": size,
            "offset": offset,
            "content": content,
            "encoding": encoding,
            "truncated": end < size,
        }))
    }

    /// `write_file`: creates or replaces (or appends to) a regular file.
    pub fn write(
        &self,
        path: &str,
        data: &[u8],
        append: bool,
        create_dirs: bool,
    ) -> Result<Value, Refusal> {
        let rel = self.rel(path)?;
        if rel == "." {
            return Err(Refusal::invalid(format!("{path}: is the workspace itself")));
        }
        if create_dirs {
            if let Some((parent, _)) = rel.rsplit_once('/') {
                self.make_dirs(path, parent)?;
            }
        }
        let mut flags = OFlags::WRONLY | OFlags::CREATE | OFlags::NOFOLLOW;
        flags |= if append {
            OFlags::APPEND
        } else {
            OFlags::TRUNC
        };
        let fd = self
            .open_at(&rel, flags, Mode::from_raw_mode(0o644))
            .map_err(|e| Refusal::io(path, e))?;
        let st = rustix::fs::fstat(&fd).map_err(|e| Refusal::io(path, e))?;
        if FileType::from_raw_mode(st.st_mode) != FileType::RegularFile {
            return Err(Refusal::invalid(format!("{path}: not a regular file")));
        }
        let mut f = File::from(fd);
        f.write_all(data).map_err(|e| io_err(path, &e))?;
        Ok(json!({"path": self.show(&rel), "bytes": data.len(), "appended": append}))
    }

    fn make_dirs(&self, path: &str, parent: &str) -> Result<(), Refusal> {
        let mut at = String::new();
        for part in parent.split('/') {
            if !at.is_empty() {
                at.push('/');
            }
            at.push_str(part);
            // the parent of each step is opened beneath the root, so the
            // directory is never made through a link that leads out
            let (dir, name) = match at.rsplit_once('/') {
                Some((d, n)) => (d.to_string(), n),
                None => (".".to_string(), at.as_str()),
            };
            let dfd = self
                .open_at(&dir, OFlags::PATH | OFlags::DIRECTORY, Mode::empty())
                .map_err(|e| Refusal::io(path, e))?;
            match rustix::fs::mkdirat(&dfd, name, Mode::from_raw_mode(0o755)) {
                Ok(()) | Err(Errno::EXIST) => {}
                Err(e) => return Err(Refusal::io(path, e)),
            }
        }
        Ok(())
    }

    /// `list_files`: the entries of a directory, recursively if asked.
    pub fn list(&self, path: &str, recursive: bool) -> Result<Value, Refusal> {
        let rel = self.rel(path)?;
        let fd = self
            .open_at(&rel, OFlags::RDONLY | OFlags::DIRECTORY, Mode::empty())
            .map_err(|e| Refusal::io(path, e))?;
        let mut out = Vec::new();
        let mut truncated = false;
        let base = if rel == "." {
            String::new()
        } else {
            rel.clone()
        };
        self.list_into(fd.as_fd(), &base, recursive, 0, &mut out, &mut truncated)
            .map_err(|e| Refusal::io(path, e))?;
        Ok(json!({"path": self.show(&rel), "entries": out, "truncated": truncated}))
    }

    fn list_into(
        &self,
        dir: BorrowedFd<'_>,
        rel: &str,
        recursive: bool,
        depth: usize,
        out: &mut Vec<Value>,
        truncated: &mut bool,
    ) -> Result<(), Errno> {
        for (name, _) in entries(dir)? {
            if out.len() >= MAX_LIST {
                *truncated = true;
                return Ok(());
            }
            let Ok(st) = rustix::fs::statat(dir, name.as_c_str(), AtFlags::SYMLINK_NOFOLLOW) else {
                continue;
            };
            let kind = FileType::from_raw_mode(st.st_mode);
            let shown = name.to_string_lossy();
            let child = if rel.is_empty() {
                shown.into_owned()
            } else {
                format!("{rel}/{shown}")
            };
            out.push(json!({
                "path": self.show(&child),
                "type": kind_name(kind),
                "size": u64::try_from(st.st_size).unwrap_or(0),
            }));
            if recursive && kind == FileType::Directory {
                if depth + 1 >= MAX_DEPTH {
                    *truncated = true;
                    continue;
                }
                let sub = rustix::fs::openat(
                    dir,
                    name.as_c_str(),
                    OFlags::RDONLY | OFlags::DIRECTORY | OFlags::NOFOLLOW | OFlags::CLOEXEC,
                    Mode::empty(),
                )?;
                self.list_into(sub.as_fd(), &child, true, depth + 1, out, truncated)?;
            }
        }
        Ok(())
    }

    /// `delete_file`: a file, a link (never what it points to), or a
    /// directory (with `recursive`). The workspace and its three mounts
    /// are not deletable.
    pub fn delete(&self, path: &str, recursive: bool) -> Result<Value, Refusal> {
        let rel = self.rel(path)?;
        if rel == "." || !rel.contains('/') {
            return Err(Refusal::invalid(format!(
                "{path}: the workspace and its top-level directories cannot be deleted; delete what is in them"
            )));
        }
        let (parent, name) = rel.rsplit_once('/').unwrap_or((".", rel.as_str()));
        let dfd = self
            .open_at(parent, OFlags::RDONLY | OFlags::DIRECTORY, Mode::empty())
            .map_err(|e| Refusal::io(path, e))?;
        let st = rustix::fs::statat(&dfd, name, AtFlags::SYMLINK_NOFOLLOW)
            .map_err(|e| Refusal::io(path, e))?;
        let mut count = 0u64;
        if FileType::from_raw_mode(st.st_mode) == FileType::Directory {
            if recursive {
                // no NUL: confine_path refused it
                let name = CString::new(name).map_err(|_| Refusal::io(path, Errno::INVAL))?;
                remove_tree(dfd.as_fd(), &name, 0, &mut count).map_err(|e| Refusal::io(path, e))?;
            } else {
                rustix::fs::unlinkat(&dfd, name, AtFlags::REMOVEDIR)
                    .map_err(|e| Refusal::io(path, e))?;
                count = 1;
            }
        } else {
            rustix::fs::unlinkat(&dfd, name, AtFlags::empty()).map_err(|e| Refusal::io(path, e))?;
            count = 1;
        }
        Ok(json!({"path": self.show(&rel), "deleted": count}))
    }

    /// A relative path as the agent writes it.
    pub fn show(&self, rel: &str) -> String {
        if rel == "." || rel.is_empty() {
            self.path.clone()
        } else {
            format!("{}/{rel}", self.path)
        }
    }
}

/// Removes directory `name` in `dir` and everything under it, never
/// following a link; counts what it removed.
pub fn remove_tree(
    dir: BorrowedFd<'_>,
    name: &CStr,
    depth: usize,
    count: &mut u64,
) -> Result<(), Errno> {
    if depth >= MAX_DEPTH {
        return Err(Errno::LOOP);
    }
    let sub = rustix::fs::openat(
        dir,
        name,
        OFlags::RDONLY | OFlags::DIRECTORY | OFlags::NOFOLLOW | OFlags::CLOEXEC,
        Mode::empty(),
    )?;
    clear_dir(sub.as_fd(), depth, count, &[])?;
    rustix::fs::unlinkat(dir, name, AtFlags::REMOVEDIR)?;
    *count += 1;
    Ok(())
}

/// Removes everything in `dir` but the names in `keep`.
pub fn clear_dir(
    dir: BorrowedFd<'_>,
    depth: usize,
    count: &mut u64,
    keep: &[&str],
) -> Result<(), Errno> {
    for (n, t) in entries(dir)? {
        if n.to_str().is_ok_and(|n| keep.contains(&n)) {
            continue;
        }
        let is_dir = match t {
            FileType::Unknown => rustix::fs::statat(dir, n.as_c_str(), AtFlags::SYMLINK_NOFOLLOW)
                .map(|s| FileType::from_raw_mode(s.st_mode) == FileType::Directory)
                .unwrap_or(false),
            t => t == FileType::Directory,
        };
        if is_dir {
            remove_tree(dir, &n, depth + 1, count)?;
        } else {
            rustix::fs::unlinkat(dir, n.as_c_str(), AtFlags::empty())?;
            *count += 1;
        }
    }
    Ok(())
}

/// The entries of `dir` but `.` and `..`, sorted, with the type the
/// directory reports. Names stay as the kernel gives them: one that is not
/// UTF-8 still names its file (shown lossily, used exactly).
fn entries(dir: BorrowedFd<'_>) -> Result<Vec<(CString, FileType)>, Errno> {
    let dup = rustix::fs::openat(
        dir,
        ".",
        OFlags::RDONLY | OFlags::DIRECTORY | OFlags::CLOEXEC,
        Mode::empty(),
    )?;
    let mut out = Vec::new();
    for e in rustix::fs::Dir::new(dup)? {
        let e = e?;
        let name = e.file_name();
        if name.to_bytes() != b"." && name.to_bytes() != b".." {
            out.push((name.to_owned(), e.file_type()));
        }
    }
    out.sort_by(|a, b| a.0.cmp(&b.0));
    Ok(out)
}

fn kind_name(k: FileType) -> &'static str {
    match k {
        FileType::RegularFile => "file",
        FileType::Directory => "dir",
        FileType::Symlink => "symlink",
        _ => "other",
    }
}

fn io_err(path: &str, e: &std::io::Error) -> Refusal {
    match e.raw_os_error() {
        Some(n) => Refusal::io(path, Errno::from_raw_os_error(n)),
        None => Refusal {
            reason: None,
            message: format!("{path}: {e}"),
        },
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    /// The walk that stands in for openat2 where the kernel has none
    /// (gVisor): what it opens, and every symlink refused, one that would
    /// lead out above all.
    #[test]
    fn without_openat2_a_symlink_on_the_way_is_refused_and_plain_paths_open() {
        let dir = tempfile::tempdir().unwrap();
        let outside = tempfile::tempdir().unwrap();
        std::fs::write(outside.path().join("secret"), "host").unwrap();
        std::fs::create_dir(dir.path().join("sub")).unwrap();
        std::fs::write(dir.path().join("sub/f"), "in").unwrap();
        std::os::unix::fs::symlink(outside.path(), dir.path().join("out")).unwrap();
        std::os::unix::fs::symlink("sub", dir.path().join("inner")).unwrap();
        std::os::unix::fs::symlink(outside.path().join("secret"), dir.path().join("sub/link"))
            .unwrap();
        let root = rustix::fs::open(
            dir.path(),
            OFlags::PATH | OFlags::DIRECTORY | OFlags::CLOEXEC,
            Mode::empty(),
        )
        .unwrap();
        let read = |rel: &str| walk_beneath(&root, rel, OFlags::RDONLY, Mode::empty());
        let mut text = String::new();
        File::from(read("sub/f").unwrap())
            .read_to_string(&mut text)
            .unwrap();
        assert_eq!(text, "in");
        for rel in [
            "out/secret",
            "sub/link",
            "inner/f",
            "out",
            "../x",
            "sub/../../x",
        ] {
            assert_eq!(read(rel).err(), Some(Errno::XDEV), "{rel}");
        }
        assert_eq!(
            walk_beneath(&root, "sub/link", OFlags::PATH, Mode::empty()).err(),
            Some(Errno::XDEV)
        );
        assert_eq!(read("sub/f/x").err(), Some(Errno::NOTDIR));
        assert_eq!(read("nope/f").err(), Some(Errno::NOENT));
        // creating a file, and the root itself
        let fd = walk_beneath(
            &root,
            "sub/new",
            OFlags::WRONLY | OFlags::CREATE | OFlags::EXCL,
            Mode::from_raw_mode(0o600),
        )
        .unwrap();
        File::from(fd).write_all(b"x").unwrap();
        assert_eq!(std::fs::read(dir.path().join("sub/new")).unwrap(), b"x");
        assert!(walk_beneath(&root, ".", OFlags::PATH | OFlags::DIRECTORY, Mode::empty()).is_ok());
        assert_eq!(
            std::fs::read(outside.path().join("secret")).unwrap(),
            b"host"
        );
    }
}
