//! A workspace as a compressed archive with a manifest, and a restore
//! that checks every entry before it writes one.
//!
//! # Format
//!
//! A gzip-compressed tar (GNU headers; GNU long-name entries for paths
//! over 100 bytes; no PAX headers, no links, uid/gid/mtime 0). The first
//! entry is `MANIFEST.json` ([`Manifest`]):
//!
//! ```json
//! {
//!   "format": "mcpbox-snapshot/1",
//!   "parts": ["output", "tmp"],
//!   "entries": [
//!     { "path": "output", "kind": "dir", "size": 0, "mode": "0755" },
//!     { "path": "output/a.txt", "kind": "file", "size": 3, "mode": "0644",
//!       "sha256": "ba7816bf..." }
//!   ],
//!   "skipped": [
//!     { "path": "output/link", "kind": "symlink",
//!       "reason": "not archived: only regular files and directories are" }
//!   ]
//! }
//! ```
//!
//! Then one entry per manifest entry, in the manifest's order (a directory
//! before what it holds). Each part is a named root (`output`, `tmp`) and
//! the first component of every path. Modes are permission bits only
//! (`st_mode & 0o777`), in octal.
//!
//! # What a snapshot leaves out
//!
//! The walk never follows a symlink. Symlinks, fifos, sockets and device
//! nodes a server left in its workspace are not archived but listed in
//! `skipped` (and in [`SnapshotInfo::skipped`]), as are names that are not
//! UTF-8 and directories deeper than 128 levels. A file with several hard
//! links is archived as its content, once per name: no tar link entries.
//!
//! # Restore
//!
//! [`restore`] first copies the archive into an unnamed temporary file of
//! its own (O_TMPFILE beside `dest`, or an unlinked file), so that what is
//! checked is what is extracted: someone who can write the archive's path
//! cannot swap entries between the two passes. It then reads that copy
//! once, completely, and checks it ([`verify`] does only this): the
//! manifest parses and is consistent; every tar entry is a plain file or
//! directory with a plain relative path under one of the parts, listed in
//! the manifest exactly once, after its directory, with the manifest's
//! size and SHA-256; nothing is in the manifest that is not in the
//! archive; after the end-of-archive marker come only zeros and the gzip
//! trailer checks. Only then is it extracted, into a temporary directory
//! beside `dest` that is renamed to `dest` at the end; the digests are
//! checked again while extracting (defence in depth: the copy is ours).
//! On any error that directory is removed and `dest` is left as it was.
//!
//! Every file is created with `O_CREAT|O_EXCL|O_NOFOLLOW` beneath a
//! directory opened with `O_NOFOLLOW`; modes come from the manifest masked
//! with 0o755 (no setuid, setgid, sticky, group or world write) and
//! directories keep owner rwx, so the restored tree can always be removed.
//!
//! Resources are bounded ([`Limits`]): entries, the sum of file sizes, the
//! manifest's size, and the decompressed stream as a whole (to what the
//! manifest accounts for), so a gzip bomb or an oversized long-name entry
//! stops at the limit instead of filling the disk or the memory.

use std::cell::Cell;
use std::collections::HashMap;
use std::ffi::CString;
use std::fs::File;
use std::io::{self, BufRead, BufReader, BufWriter, Read, Seek};
use std::os::fd::{AsFd, OwnedFd};
use std::path::{Path, PathBuf};
use std::rc::Rc;

// bufread's decoder reads exactly its member from our BufReader, so what
// follows the member is still there to be refused (`tar_rest`)
use flate2::bufread::GzDecoder;
use flate2::write::GzEncoder;
use rustix::fs::{self as rfs, Mode};
use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};
use tar::EntryType;

use crate::walk::{self, Kind, Visit, WalkError};
use crate::SnapshotInfo;

/// The first entry of every snapshot.
pub const MANIFEST_NAME: &str = "MANIFEST.json";
/// The manifest's `format`.
pub const FORMAT: &str = "mcpbox-snapshot/1";

/// Bounds on what a restore reads and writes. The defaults are sane for a
/// workspace; a caller restoring a bigger one raises `max_bytes`.
#[derive(Debug, Clone)]
pub struct Limits {
    /// Entries in the manifest (files and directories), and skipped ones.
    pub max_entries: usize,
    /// Sum of the files' sizes.
    pub max_bytes: u64,
    /// Size of `MANIFEST.json`.
    pub max_manifest_bytes: u64,
    /// The part names an archive may hold; empty: any well-formed name.
    pub parts: Vec<String>,
}

impl Default for Limits {
    fn default() -> Self {
        Limits {
            max_entries: 1_000_000,
            max_bytes: 10 << 30,
            max_manifest_bytes: 64 << 20,
            parts: vec!["output".into(), "tmp".into()],
        }
    }
}

/// `MANIFEST.json`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Manifest {
    /// [`FORMAT`].
    pub format: String,
    /// The named roots, each the first component of its entries' paths.
    pub parts: Vec<String>,
    /// Every archived file and directory, the parts' roots included.
    pub entries: Vec<ManifestEntry>,
    /// What the workspace held that was not archived.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub skipped: Vec<Skipped>,
}

/// What an archived entry is.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum EntryKind {
    File,
    Dir,
}

/// One archived file or directory.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ManifestEntry {
    /// `part/relative/path`, `/`-separated, no `.` or `..`.
    pub path: String,
    pub kind: EntryKind,
    /// Bytes; 0 for a directory.
    #[serde(default)]
    pub size: u64,
    /// Permission bits, as octal digits (`"0644"`).
    #[serde(with = "octal")]
    pub mode: u32,
    /// Hex SHA-256 of a file's content; absent for a directory.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub sha256: Option<String>,
}

/// Something in the workspace that was not archived, and why.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Skipped {
    /// As [`ManifestEntry::path`] (shown lossily if the name is not UTF-8).
    pub path: String,
    /// `symlink`, `fifo`, `socket`, `char-device`, `block-device`,
    /// `unknown`; or `file`/`dir` when the name or depth was the reason.
    pub kind: String,
    pub reason: String,
}

/// What a restore wrote.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Restored {
    pub dest: PathBuf,
    pub parts: Vec<String>,
    /// Files and directories written.
    pub entries: usize,
    /// Sum of the files' sizes.
    pub bytes: u64,
    /// Hex SHA-256 of the manifest.
    pub manifest_sha256: String,
    /// What the snapshot had left out.
    pub skipped: Vec<Skipped>,
}

/// Why a snapshot or a restore failed. Nothing is left at the destination
/// either way.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("snapshot: part {part:?}: {reason}")]
    Part { part: String, reason: String },
    #[error("snapshot: {path:?}: {source}")]
    Read { path: String, source: io::Error },
    #[error("snapshot: {path:?}: changed while it was archived (pause the sandbox first)")]
    Changed { path: String },
    #[error("snapshot: {0}")]
    TooLarge(String),
    #[error("snapshot: archive {path:?}: {source}")]
    Write { path: PathBuf, source: io::Error },
    #[error("restore: archive {path:?}: {source}")]
    Archive { path: PathBuf, source: io::Error },
    #[error("restore: manifest: {0}")]
    Manifest(String),
    #[error("restore: entry {path:?}: {reason}")]
    Entry { path: String, reason: String },
    #[error("restore: {0}")]
    Limit(String),
    #[error("restore: destination {path:?}: {reason}")]
    Dest { path: PathBuf, reason: String },
    #[error("restore: writing {path:?}: {source}")]
    Extract { path: String, source: io::Error },
}

pub type Result<T, E = Error> = std::result::Result<T, E>;

impl From<WalkError> for Error {
    fn from(e: WalkError) -> Self {
        Error::Read {
            path: e.path,
            source: e.source,
        }
    }
}

/// Permission bits as octal text, so the manifest reads like `ls -l`.
mod octal {
    use serde::{de::Error as _, Deserialize, Deserializer, Serializer};

    pub fn serialize<S: Serializer>(mode: &u32, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_str(&format!("{mode:04o}"))
    }

    pub fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<u32, D::Error> {
        let s = String::deserialize(d)?;
        if s.is_empty() || s.len() > 6 || !s.bytes().all(|b| (b'0'..=b'7').contains(&b)) {
            return Err(D::Error::custom(format!("mode {s:?} is not octal digits")));
        }
        u32::from_str_radix(&s, 8).map_err(D::Error::custom)
    }
}

/// A part's name: one plain path component, `[A-Za-z0-9._-]`, not starting
/// with a dot, not the manifest's name.
fn check_part_name(name: &str) -> Result<(), &'static str> {
    if name.is_empty() || name.len() > 64 {
        return Err("a part name has 1 to 64 characters");
    }
    if name.starts_with('.') {
        return Err("a part name does not start with a dot");
    }
    if name == MANIFEST_NAME {
        return Err("a part cannot be named as the manifest");
    }
    if !name
        .bytes()
        .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'.' | b'_' | b'-'))
    {
        return Err("a part name is letters, digits, '.', '_' and '-'");
    }
    Ok(())
}

/// A path as an archive or a manifest may hold it.
fn check_path(path: &str, parts: &[String]) -> Result<(), String> {
    if path.is_empty() {
        return Err("an empty path".into());
    }
    if path.contains('\0') {
        return Err("a NUL in the path".into());
    }
    if path.starts_with('/') {
        return Err("an absolute path".into());
    }
    if path.len() > 4096 {
        return Err("a path longer than 4096 bytes".into());
    }
    for seg in path.split('/') {
        match seg {
            "" => return Err("an empty component (a '//' or a trailing '/')".into()),
            "." => return Err("a '.' component".into()),
            ".." => return Err("a path with '..'".into()),
            s if s.len() > 255 => return Err("a name longer than 255 bytes".into()),
            _ => {}
        }
    }
    let first = path.split('/').next().unwrap_or_default();
    if !parts.iter().any(|p| p == first) {
        return Err(format!(
            "outside the snapshot's parts ({})",
            parts.join(", ")
        ));
    }
    Ok(())
}

/// Reads through to a hasher, counting.
struct Hashing<R> {
    inner: R,
    hasher: Sha256,
    count: u64,
}

impl<R: Read> Read for Hashing<R> {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        let n = self.inner.read(buf)?;
        self.hasher.update(&buf[..n]);
        self.count += n as u64;
        Ok(n)
    }
}

/// Writes the parts' trees to `archive`: a gzip-compressed tar whose first
/// entry is the manifest. Symlinks are never followed; what is neither a
/// regular file nor a directory is listed as skipped, not archived.
///
/// The archive is written to a temporary file (0600) beside `archive` and
/// linked into place only when complete: an existing file, or a symlink,
/// at `archive` is an error, never overwritten or followed. A file that
/// changes between the manifest's pass and the archive's (a running
/// server) fails the snapshot: pause the sandbox first.
pub fn write(parts: &[(&str, &Path)], archive: &Path) -> Result<SnapshotInfo> {
    write_excluding(parts, archive, &[])
}

/// [`write`], leaving out the entries whose archive paths (`part/rel`) are
/// in `exclude`, and everything under them: they are neither archived nor
/// listed as skipped. The built-in sandbox server keeps its own
/// checkpoints in `tmp/.mcpbox` and leaves them out of the next one.
pub fn write_excluding(
    parts: &[(&str, &Path)],
    archive: &Path,
    exclude: &[&str],
) -> Result<SnapshotInfo> {
    write_with(parts, archive, exclude, &Limits::default())
}

/// [`write_excluding`] under `limits`: a tree that restore would refuse
/// under the same limits (too many entries, too many bytes, too large a
/// manifest) is refused before the archive is written.
pub fn write_with(
    parts: &[(&str, &Path)],
    archive: &Path,
    exclude: &[&str],
    limits: &Limits,
) -> Result<SnapshotInfo> {
    let mut roots: Vec<(String, OwnedFd)> = Vec::new();
    for (name, path) in parts {
        check_part_name(name).map_err(|reason| Error::Part {
            part: name.to_string(),
            reason: reason.into(),
        })?;
        if roots.iter().any(|(n, _)| n == name) {
            return Err(Error::Part {
                part: name.to_string(),
                reason: "named twice".into(),
            });
        }
        let fd = walk::open_root(path).map_err(|e| Error::Part {
            part: name.to_string(),
            reason: format!("{}: {e}", path.display()),
        })?;
        roots.push((name.to_string(), fd));
    }

    // Pass 1: the manifest, with every file's digest.
    let mut total_bytes = 0u64;
    let mut manifest = Manifest {
        format: FORMAT.into(),
        parts: roots.iter().map(|(n, _)| n.clone()).collect(),
        entries: Vec::new(),
        skipped: Vec::new(),
    };
    for (name, fd) in &roots {
        let st = rfs::fstat(fd).map_err(|e| Error::Read {
            path: name.clone(),
            source: e.into(),
        })?;
        manifest.entries.push(ManifestEntry {
            path: name.clone(),
            kind: EntryKind::Dir,
            size: 0,
            mode: st.st_mode & 0o777,
            sha256: None,
        });
        let entries = &mut manifest.entries;
        let skipped = &mut manifest.skipped;
        let total = &mut total_bytes;
        walk::walk(fd.as_fd(), name, &mut |v: Visit<'_>| -> Result<bool> {
            if entries.len() + skipped.len() >= limits.max_entries {
                return Err(Error::TooLarge(format!(
                    "more than {} entries",
                    limits.max_entries
                )));
            }
            match v {
                Visit::BadName { rel, kind } => {
                    skipped.push(Skipped {
                        path: rel,
                        kind: kind.as_str().into(),
                        reason: "a name that is not UTF-8".into(),
                    });
                    Ok(false)
                }
                Visit::TooDeep { rel } => {
                    skipped.push(Skipped {
                        path: rel.into(),
                        kind: Kind::Dir.as_str().into(),
                        reason: format!("deeper than {} directories", walk::MAX_DEPTH),
                    });
                    Ok(false)
                }
                Visit::Node(n) if exclude.contains(&n.rel) => Ok(false),
                Visit::Node(n) => match n.kind {
                    Kind::Dir => {
                        entries.push(ManifestEntry {
                            path: n.rel.into(),
                            kind: EntryKind::Dir,
                            size: 0,
                            mode: n.mode & 0o777,
                            sha256: None,
                        });
                        Ok(true)
                    }
                    Kind::File => {
                        let (mut f, st) =
                            walk::open_file_in(n.dir, n.name).map_err(|e| Error::Read {
                                path: n.rel.into(),
                                source: e.into(),
                            })?;
                        if Kind::of(st.st_mode) != Kind::File {
                            return Err(Error::Changed { path: n.rel.into() });
                        }
                        // what restore would refuse is refused here, before
                        // anything is written (issue 26): the sum of the
                        // files' sizes, read no further than the limit
                        let room = limits.max_bytes.saturating_sub(*total);
                        let (size, sha) =
                            walk::copy_hashing(&mut f, &mut io::sink(), room.saturating_add(1))
                                .map_err(|source| Error::Read {
                                    path: n.rel.into(),
                                    source,
                                })?;
                        if size > room {
                            return Err(Error::TooLarge(format!(
                                "files of more than {} bytes in all (restore refuses that)",
                                limits.max_bytes
                            )));
                        }
                        *total += size;
                        entries.push(ManifestEntry {
                            path: n.rel.into(),
                            kind: EntryKind::File,
                            size,
                            mode: st.st_mode & 0o777,
                            sha256: Some(sha),
                        });
                        Ok(false)
                    }
                    other => {
                        skipped.push(Skipped {
                            path: n.rel.into(),
                            kind: other.as_str().into(),
                            reason: "not archived: only regular files and directories are".into(),
                        });
                        Ok(false)
                    }
                },
            }
        })?;
    }
    let json = serde_json::to_vec_pretty(&manifest).map_err(|e| Error::Write {
        path: archive.into(),
        source: io::Error::other(e),
    })?;
    if json.len() as u64 > limits.max_manifest_bytes {
        return Err(Error::TooLarge(format!(
            "a manifest of {} bytes, over {}",
            json.len(),
            limits.max_manifest_bytes
        )));
    }
    let manifest_sha256 = mcpbox_policy::hex::encode(&Sha256::digest(&json));

    // Pass 2: the archive, re-reading each file and checking it against
    // the manifest.
    let werr = |source: io::Error| Error::Write {
        path: archive.into(),
        source,
    };
    let parent = parent_of(archive);
    let file_name = archive
        .file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .ok_or_else(|| werr(io::Error::new(io::ErrorKind::InvalidInput, "no file name")))?;
    let tmp = tempfile::Builder::new()
        .prefix(&format!(".{file_name}."))
        .suffix(".tmp")
        .tempfile_in(parent)
        .map_err(werr)?;
    let gz = GzEncoder::new(
        BufWriter::new(tmp.as_file()),
        flate2::Compression::default(),
    );
    let mut tar = tar::Builder::new(gz);
    let mut h = header(EntryType::Regular, json.len() as u64, 0o600);
    tar.append_data(&mut h, MANIFEST_NAME, &json[..])
        .map_err(werr)?;
    let mut bytes = 0u64;
    for e in &manifest.entries {
        let (part, rel) = e.path.split_once('/').unwrap_or((&e.path, ""));
        match e.kind {
            EntryKind::Dir => {
                let mut h = header(EntryType::Directory, 0, e.mode);
                tar.append_data(&mut h, &e.path, io::empty())
                    .map_err(werr)?;
            }
            EntryKind::File => {
                let root = roots
                    .iter()
                    .find(|(n, _)| n == part)
                    .map(|(_, fd)| fd.as_fd())
                    .ok_or_else(|| Error::Changed {
                        path: e.path.clone(),
                    })?;
                let (f, st) = walk::open_file_beneath(root, rel).map_err(|w| Error::Read {
                    path: e.path.clone(),
                    source: w.source,
                })?;
                if Kind::of(st.st_mode) != Kind::File {
                    return Err(Error::Changed {
                        path: e.path.clone(),
                    });
                }
                let mut src = Hashing {
                    inner: f.take(e.size),
                    hasher: Sha256::new(),
                    count: 0,
                };
                let mut h = header(EntryType::Regular, e.size, e.mode);
                tar.append_data(&mut h, &e.path, &mut src).map_err(werr)?;
                let sha = mcpbox_policy::hex::encode(&src.hasher.finalize());
                if src.count != e.size || Some(&sha) != e.sha256.as_ref() {
                    return Err(Error::Changed {
                        path: e.path.clone(),
                    });
                }
                bytes += e.size;
            }
        }
    }
    let gz = tar.into_inner().map_err(werr)?;
    let buf = gz.finish().map_err(werr)?;
    buf.into_inner().map_err(|e| werr(e.into_error()))?;
    tmp.as_file().sync_all().map_err(werr)?;
    tmp.persist_noclobber(archive).map_err(|e| werr(e.error))?;
    if let Ok(dir) = File::open(parent) {
        // the new name is durable once its directory is
        let _ = dir.sync_all();
    }
    Ok(SnapshotInfo {
        archive: archive.into(),
        entries: manifest.entries.len(),
        bytes,
        manifest_sha256,
        skipped: manifest.skipped,
    })
}

fn header(kind: EntryType, size: u64, mode: u32) -> tar::Header {
    let mut h = tar::Header::new_gnu();
    h.set_entry_type(kind);
    h.set_size(size);
    h.set_mode(mode & 0o777);
    h.set_uid(0);
    h.set_gid(0);
    h.set_mtime(0);
    h
}

fn parent_of(p: &Path) -> &Path {
    match p.parent() {
        Some(d) if !d.as_os_str().is_empty() => d,
        _ => Path::new("."),
    }
}

/// Restores `archive` into `dest` with the default [`Limits`].
pub fn restore(archive: &Path, dest: &Path) -> Result<Restored> {
    restore_with(archive, dest, &Limits::default())
}

/// Restores `archive` into `dest` (which must not exist, or be an empty
/// directory) after checking all of it; see the module's documentation.
pub fn restore_with(archive: &Path, dest: &Path, limits: &Limits) -> Result<Restored> {
    let dest_err = |reason: String| Error::Dest {
        path: dest.into(),
        reason,
    };
    let name = crate::walk::fresh_dest(dest).map_err(dest_err)?;
    let parent = parent_of(dest);

    // Our own copy: what is checked is what is extracted.
    let copy = private_copy(archive, parent, limits)?;
    let plan = check(&copy, archive, limits)?;

    let tmp = tempfile::Builder::new()
        .prefix(&format!(".{name}.restore-"))
        .permissions(std::os::unix::fs::PermissionsExt::from_mode(0o700))
        .tempdir_in(parent)
        .map_err(|e| dest_err(format!("a temporary directory beside it: {e}")))?;
    // On error `tmp` is dropped, and removes what was extracted.
    extract(&copy, archive, tmp.path(), &plan, limits)?;
    let tmp_path = tmp.keep();
    if let Err(e) = std::fs::rename(&tmp_path, dest) {
        if let Err(e) = std::fs::remove_dir_all(&tmp_path) {
            tracing::warn!(path = %tmp_path.display(), error = %e, "restore: removing the temporary directory");
        }
        return Err(dest_err(e.to_string()));
    }
    let bytes = plan.bytes;
    Ok(Restored {
        dest: dest.into(),
        parts: plan.manifest.parts,
        entries: plan.manifest.entries.len(),
        bytes,
        manifest_sha256: plan.manifest_sha256,
        skipped: plan.manifest.skipped,
    })
}

/// Checks all of `archive` without writing anything, and returns its
/// manifest.
pub fn verify(archive: &Path, limits: &Limits) -> Result<Manifest> {
    let copy = private_copy(archive, &std::env::temp_dir(), limits)?;
    Ok(check(&copy, archive, limits)?.manifest)
}

/// The most decompressed bytes an archive within `limits` can hold (the
/// compressed stream is not bigger but for gzip's framing).
fn stream_cap(limits: &Limits) -> u64 {
    let per_entry = 3 * 512 + 4096;
    limits
        .max_bytes
        .saturating_add(limits.max_manifest_bytes)
        .saturating_add((limits.max_entries as u64).saturating_mul(per_entry))
        .saturating_add(64 << 10)
}

fn private_copy(archive: &Path, dir: &Path, limits: &Limits) -> Result<File> {
    let aerr = |source: io::Error| Error::Archive {
        path: archive.into(),
        source,
    };
    let src = File::open(archive).map_err(aerr)?;
    let mut copy = tempfile::tempfile_in(dir).map_err(|e| Error::Dest {
        path: dir.into(),
        reason: format!("a temporary copy of the archive: {e}"),
    })?;
    let cap = stream_cap(limits);
    let n = io::copy(&mut src.take(cap.saturating_add(1)), &mut copy).map_err(aerr)?;
    if n > cap {
        return Err(Error::Limit(format!(
            "an archive over {cap} bytes cannot hold what the limits allow"
        )));
    }
    copy.rewind().map_err(aerr)?;
    Ok(copy)
}

/// The decompressed stream ran past what the manifest accounts for.
#[derive(Debug)]
struct OverBudget;

impl std::fmt::Display for OverBudget {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("the archive holds more data than its manifest accounts for")
    }
}

impl std::error::Error for OverBudget {}

/// A reader that fails once it has produced `left` bytes; the tar parser
/// reads through it, so no entry (GNU long names included, which it
/// buffers in memory) can make it read past the budget.
struct Budget<R> {
    inner: R,
    left: Rc<Cell<u64>>,
}

impl<R: Read> Read for Budget<R> {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        let n = self.inner.read(buf)?;
        let left = self.left.get();
        if n as u64 > left {
            return Err(io::Error::other(OverBudget));
        }
        self.left.set(left - n as u64);
        Ok(n)
    }
}

fn is_over_budget(e: &io::Error) -> bool {
    let mut cur: Option<&(dyn std::error::Error + 'static)> = e.get_ref().map(|r| r as _);
    while let Some(err) = cur {
        if err.is::<OverBudget>() {
            return true;
        }
        cur = err.source();
    }
    // the tar crate may re-wrap an error as text
    e.to_string().contains("more data than its manifest")
}

const BLOCK: u64 = 512;
/// What may follow the end-of-archive marker: zeros up to a 20-block
/// record (GNU tar's default blocking), and no more.
const TRAILER: u64 = 20 * BLOCK;

fn blocks(n: u64) -> u64 {
    n.div_ceil(BLOCK).saturating_mul(BLOCK)
}

/// What the check pass learnt.
struct Plan {
    manifest: Manifest,
    manifest_sha256: String,
    bytes: u64,
    /// The decompressed bytes after the manifest's entry.
    budget: u64,
    index: HashMap<String, usize>,
}

fn open_stream(
    copy: &File,
    left: Rc<Cell<u64>>,
) -> tar::Archive<Budget<GzDecoder<BufReader<&File>>>> {
    tar::Archive::new(Budget {
        inner: GzDecoder::new(BufReader::new(copy)),
        left,
    })
}

/// Maps a tar or gzip error to ours.
fn stream_err(archive: &Path, e: io::Error) -> Error {
    if is_over_budget(&e) {
        Error::Limit(OverBudget.to_string())
    } else {
        Error::Archive {
            path: archive.into(),
            source: e,
        }
    }
}

/// An entry's path as checked text: UTF-8, a directory's one trailing
/// slash dropped.
fn entry_path<R: Read>(e: &tar::Entry<'_, R>) -> Result<String> {
    let raw = e.path_bytes();
    let s = String::from_utf8(raw.to_vec()).map_err(|_| Error::Entry {
        path: String::from_utf8_lossy(&raw).into_owned(),
        reason: "a name that is not UTF-8".into(),
    })?;
    if e.header().entry_type().is_dir() {
        if let Some(stripped) = s.strip_suffix('/') {
            return Ok(stripped.to_string());
        }
    }
    Ok(s)
}

fn type_name(t: EntryType) -> String {
    match t {
        EntryType::Link => "a hardlink entry".into(),
        EntryType::Symlink => "a symlink entry".into(),
        EntryType::Char => "a character device entry".into(),
        EntryType::Block => "a block device entry".into(),
        EntryType::Fifo => "a fifo entry".into(),
        EntryType::Continuous => "a contiguous-file entry".into(),
        EntryType::GNUSparse => "a GNU sparse entry".into(),
        EntryType::XHeader | EntryType::XGlobalHeader => "a PAX header".into(),
        EntryType::GNULongName | EntryType::GNULongLink => "a stray GNU long-name entry".into(),
        other => format!("an entry of type {:?}", other.as_byte() as char),
    }
}

/// The checks every tar entry passes in both passes: a plain file or
/// directory, no link name, no PAX extension.
fn check_entry_header<R: Read>(e: &mut tar::Entry<'_, R>, path: &str) -> Result<()> {
    let refuse = |reason: String| Error::Entry {
        path: path.into(),
        reason,
    };
    let t = e.header().entry_type();
    if !(t.is_file() || t.is_dir()) {
        return Err(refuse(format!(
            "{} (only files and directories are restored)",
            type_name(t)
        )));
    }
    if e.link_name_bytes().is_some_and(|l| !l.is_empty()) {
        return Err(refuse("a link name on a file or directory entry".into()));
    }
    match e.pax_extensions() {
        Ok(None) => Ok(()),
        Ok(Some(_)) | Err(_) => Err(refuse("PAX extended headers (this format has none)".into())),
    }
}

fn check_manifest(m: &Manifest, limits: &Limits) -> Result<(HashMap<String, usize>, u64, u64)> {
    let bad = |s: String| Error::Manifest(s);
    if m.format != FORMAT {
        return Err(bad(format!("format {:?}, not {FORMAT:?}", m.format)));
    }
    if m.parts.is_empty() {
        return Err(bad("no parts".into()));
    }
    for (i, p) in m.parts.iter().enumerate() {
        check_part_name(p).map_err(|r| bad(format!("part {p:?}: {r}")))?;
        if m.parts[..i].contains(p) {
            return Err(bad(format!("part {p:?} named twice")));
        }
        if !limits.parts.is_empty() && !limits.parts.contains(p) {
            return Err(bad(format!(
                "part {p:?} is not one of {}",
                limits.parts.join(", ")
            )));
        }
    }
    if m.entries.len() > limits.max_entries || m.skipped.len() > limits.max_entries {
        return Err(Error::Limit(format!(
            "more than {} entries",
            limits.max_entries
        )));
    }
    let mut index = HashMap::with_capacity(m.entries.len());
    let mut bytes = 0u64;
    // the decompressed stream: headers, long names, data, padding
    let mut budget = TRAILER + 2 * BLOCK;
    for (i, e) in m.entries.iter().enumerate() {
        let refuse = |reason: String| Error::Entry {
            path: e.path.clone(),
            reason: format!("{reason} (in the manifest)"),
        };
        check_path(&e.path, &m.parts).map_err(refuse)?;
        if e.mode > 0o7777 {
            return Err(refuse(format!("mode {:o} is not permission bits", e.mode)));
        }
        match e.kind {
            EntryKind::Dir => {
                if e.size != 0 || e.sha256.is_some() {
                    return Err(refuse("a directory with a size or a digest".into()));
                }
            }
            EntryKind::File => {
                let ok = e.sha256.as_ref().is_some_and(|s| {
                    s.len() == 64
                        && s.bytes()
                            .all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b))
                });
                if !ok {
                    return Err(refuse("a file without a hex SHA-256".into()));
                }
                if !e.path.contains('/') {
                    return Err(refuse("a part that is a file".into()));
                }
            }
        }
        if index.insert(e.path.clone(), i).is_some() {
            return Err(refuse("listed twice".into()));
        }
        bytes = bytes
            .checked_add(e.size)
            .filter(|b| *b <= limits.max_bytes)
            .ok_or_else(|| {
                Error::Limit(format!(
                    "the files add up to more than {} bytes",
                    limits.max_bytes
                ))
            })?;
        let name = e.path.len() as u64 + 2;
        budget = budget
            .saturating_add(BLOCK + blocks(e.size))
            .saturating_add(if name > 100 { BLOCK + blocks(name) } else { 0 });
    }
    for e in &m.entries {
        if let Some((parent, _)) = e.path.rsplit_once('/') {
            match index.get(parent).map(|&i| m.entries[i].kind) {
                Some(EntryKind::Dir) => {}
                _ => {
                    return Err(Error::Entry {
                        path: e.path.clone(),
                        reason: "its directory is not in the manifest".into(),
                    })
                }
            }
        }
    }
    for p in &m.parts {
        if index.get(p).map(|&i| m.entries[i].kind) != Some(EntryKind::Dir) {
            return Err(bad(format!("part {p:?} has no directory entry")));
        }
    }
    Ok((index, bytes, budget))
}

/// Pass 1: reads all of the copy and checks it; writes nothing.
fn check(copy: &File, archive: &Path, limits: &Limits) -> Result<Plan> {
    let serr = |e| stream_err(archive, e);
    let left = Rc::new(Cell::new(
        BLOCK + blocks(limits.max_manifest_bytes) + 2 * BLOCK,
    ));
    let mut tar = open_stream(copy, left.clone());
    let mut entries = tar.entries().map_err(serr)?;

    // The manifest, first.
    let mut first = match entries.next() {
        None => return Err(Error::Manifest("the archive is empty".into())),
        Some(e) => e.map_err(serr)?,
    };
    let path = entry_path(&first)?;
    if path != MANIFEST_NAME {
        return Err(Error::Manifest(format!(
            "the first entry is {path:?}, not {MANIFEST_NAME}"
        )));
    }
    check_entry_header(&mut first, &path)?;
    if !first.header().entry_type().is_file() {
        return Err(Error::Manifest("not a file".into()));
    }
    if first.size() > limits.max_manifest_bytes {
        return Err(Error::Limit(format!(
            "a manifest of {} bytes, over {}",
            first.size(),
            limits.max_manifest_bytes
        )));
    }
    let mut json = Vec::new();
    (&mut first)
        .take(limits.max_manifest_bytes)
        .read_to_end(&mut json)
        .map_err(serr)?;
    drop(first);
    let manifest_sha256 = mcpbox_policy::hex::encode(&Sha256::digest(&json));
    let manifest: Manifest = serde_json::from_slice(&json)
        .map_err(|e| Error::Manifest(format!("not a manifest: {e}")))?;
    drop(json);
    let (index, bytes, budget) = check_manifest(&manifest, limits)?;
    left.set(budget);

    // Every other entry.
    let mut seen = vec![false; manifest.entries.len()];
    for e in entries {
        let mut e = e.map_err(serr)?;
        let path = entry_path(&e)?;
        let refuse = |reason: String| Error::Entry {
            path: path.clone(),
            reason,
        };
        check_entry_header(&mut e, &path)?;
        check_path(&path, &manifest.parts).map_err(refuse)?;
        let Some(&i) = index.get(&path) else {
            return Err(refuse("not in the manifest".into()));
        };
        if seen[i] {
            return Err(refuse("a duplicate entry".into()));
        }
        let m = &manifest.entries[i];
        let is_dir = e.header().entry_type().is_dir();
        match (m.kind, is_dir) {
            (EntryKind::Dir, false) => {
                return Err(refuse("a file, a directory in the manifest".into()))
            }
            (EntryKind::File, true) => {
                return Err(refuse("a directory, a file in the manifest".into()))
            }
            _ => {}
        }
        if let Some((parent, _)) = path.rsplit_once('/') {
            if !index.get(parent).is_some_and(|&p| seen[p]) {
                return Err(refuse("before its directory".into()));
            }
        }
        if e.size() != m.size {
            return Err(refuse(format!(
                "{} bytes in the archive, {} in the manifest",
                e.size(),
                m.size
            )));
        }
        if m.kind == EntryKind::File {
            let (n, sha) = walk::copy_hashing(&mut e, &mut io::sink(), m.size).map_err(serr)?;
            if n != m.size {
                return Err(refuse(format!("truncated at {n} of {} bytes", m.size)));
            }
            if Some(&sha) != m.sha256.as_ref() {
                return Err(refuse(
                    "a digest mismatch: its SHA-256 is not the manifest's".into(),
                ));
            }
        }
        seen[i] = true;
    }
    tar_rest(tar, archive)?;
    if let Some(i) = seen.iter().position(|s| !s) {
        return Err(Error::Entry {
            path: manifest.entries[i].path.clone(),
            reason: "in the manifest but not in the archive".into(),
        });
    }
    Ok(Plan {
        manifest,
        manifest_sha256,
        bytes,
        budget,
        index,
    })
}

/// After the end-of-archive marker: only zeros, at most [`TRAILER`]
/// bytes, then a gzip trailer that checks (reading to the end verifies its
/// CRC and length).
fn tar_rest(tar: tar::Archive<Budget<GzDecoder<BufReader<&File>>>>, archive: &Path) -> Result<()> {
    let mut rest = tar.into_inner();
    rest.left.set(rest.left.get().min(TRAILER));
    let mut buf = [0u8; 4096];
    loop {
        let n = match rest.read(&mut buf) {
            Ok(0) => return gzip_rest(rest, archive),
            Ok(n) => n,
            Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
            Err(e) if is_over_budget(&e) => {
                return Err(Error::Limit("data after the end of the archive".into()))
            }
            Err(e) => return Err(stream_err(archive, e)),
        };
        if buf[..n].iter().any(|b| *b != 0) {
            return Err(Error::Limit("data after the end of the archive".into()));
        }
    }
}

/// After the first gzip member: nothing. A second member (which gzip
/// tools would decompress and append) or any other bytes were never
/// checked by this pass, so they are refused (issue 26).
fn gzip_rest(rest: Budget<GzDecoder<BufReader<&File>>>, archive: &Path) -> Result<()> {
    let mut after = rest.inner.into_inner();
    match after.fill_buf() {
        Ok([]) => Ok(()),
        Ok(_) => Err(Error::Limit(
            "data after the archive's gzip stream (a second member?)".into(),
        )),
        Err(e) => Err(stream_err(archive, e)),
    }
}

/// Final modes: permission bits without group/world write or the special
/// bits; a directory keeps owner rwx so the tree stays removable.
fn file_mode(m: u32) -> u32 {
    m & 0o755
}

fn dir_mode(m: u32) -> u32 {
    (m & 0o755) | 0o700
}

/// Pass 2: extracts the checked copy below `root` (a fresh directory of
/// ours), checking each file's digest again as it is written.
fn extract(copy: &File, archive: &Path, root: &Path, plan: &Plan, limits: &Limits) -> Result<()> {
    let serr = |e| stream_err(archive, e);
    let xerr = |path: &str| {
        let path = path.to_string();
        move |source: io::Error| Error::Extract { path, source }
    };
    let changed = |path: &str| Error::Entry {
        path: path.into(),
        reason: "the archive changed between the check and the extraction".into(),
    };
    (&*copy).rewind().map_err(serr)?;
    let root_fd = walk::open_root(root).map_err(xerr(""))?;
    let left = Rc::new(Cell::new(
        BLOCK + blocks(limits.max_manifest_bytes) + 2 * BLOCK,
    ));
    let mut tar = open_stream(copy, left.clone());
    let mut entries = tar.entries().map_err(serr)?;
    let mut first = match entries.next() {
        Some(e) => e.map_err(serr)?,
        None => return Err(changed(MANIFEST_NAME)),
    };
    let mut json = Vec::new();
    (&mut first)
        .take(limits.max_manifest_bytes)
        .read_to_end(&mut json)
        .map_err(serr)?;
    drop(first);
    if mcpbox_policy::hex::encode(&Sha256::digest(&json)) != plan.manifest_sha256 {
        return Err(changed(MANIFEST_NAME));
    }
    left.set(plan.budget);

    let mut dirs: Vec<(String, u32)> = Vec::new();
    let mut parent_fd: Option<(String, OwnedFd)> = None;
    for e in entries {
        let mut e = e.map_err(serr)?;
        let path = entry_path(&e)?;
        check_entry_header(&mut e, &path)?;
        let Some(&i) = plan.index.get(&path) else {
            return Err(changed(&path));
        };
        let m = &plan.manifest.entries[i];
        let (parent, name) = walk::split(&path);
        if parent_fd.as_ref().map(|(p, _)| p.as_str()) != Some(parent) {
            let fd =
                walk::open_dir_beneath(root_fd.as_fd(), parent).map_err(|w| Error::Extract {
                    path: path.clone(),
                    source: w.source,
                })?;
            parent_fd = Some((parent.to_string(), fd));
        }
        let Some((_, dir)) = parent_fd.as_ref() else {
            return Err(changed(&path));
        };
        match m.kind {
            EntryKind::Dir => {
                let c = CString::new(name).map_err(|_| changed(&path))?;
                rfs::mkdirat(dir, &c, Mode::from_raw_mode(0o700)).map_err(|e| Error::Extract {
                    path: path.clone(),
                    source: e.into(),
                })?;
                dirs.push((path.clone(), m.mode));
            }
            EntryKind::File => {
                let mut out = walk::create_file_in(dir.as_fd(), name).map_err(xerr(&path))?;
                let (n, sha) = walk::copy_hashing(&mut e, &mut out, m.size).map_err(|e| {
                    if is_over_budget(&e) {
                        Error::Limit(OverBudget.to_string())
                    } else {
                        Error::Extract {
                            path: path.clone(),
                            source: e,
                        }
                    }
                })?;
                if n != m.size || Some(&sha) != m.sha256.as_ref() {
                    return Err(changed(&path));
                }
                rfs::fchmod(&out, Mode::from_raw_mode(file_mode(m.mode))).map_err(|e| {
                    Error::Extract {
                        path: path.clone(),
                        source: e.into(),
                    }
                })?;
            }
        }
    }
    drop(parent_fd);
    // Directory modes last, deepest first, so a read-only directory does
    // not stop its own extraction.
    for (path, mode) in dirs.iter().rev() {
        let fd = walk::open_dir_beneath(root_fd.as_fd(), path).map_err(|w| Error::Extract {
            path: path.clone(),
            source: w.source,
        })?;
        rfs::fchmod(&fd, Mode::from_raw_mode(dir_mode(*mode))).map_err(|e| Error::Extract {
            path: path.clone(),
            source: e.into(),
        })?;
    }
    Ok(())
}
