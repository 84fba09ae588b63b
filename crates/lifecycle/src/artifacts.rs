//! Only artifacts leave the sandbox: the files of `output` that match the
//! policy's patterns ([`crate::glob`]) and are plain regular files inside
//! it.
//!
//! [`list`] walks `output` without following a symlink and lists every
//! matching path, with why it would be refused:
//!
//! - a symlink (to anything: never followed), also one that is not itself
//!   matched but stands where matching paths could lie below it (a
//!   symlinked directory: what is "inside" it is outside `output`);
//! - a hardlink (`st_nlink > 1`: the same inode is reachable from
//!   elsewhere, possibly a host file the server could not read by name);
//! - a fifo, a socket, a device node;
//! - a directory (only files are artifacts; a pattern ending in `**` walks
//!   through directories and does not list them);
//! - a name that is not UTF-8, a directory deeper than 128 levels;
//! - a file over `max_size`: "needs approval" ([`export`] copies it when
//!   a human approved it at the size listed: [`Approved`]).
//!
//! [`export`] copies exactly the exportable ones, and re-checks each on the
//! descriptor it copies from: every component is opened `O_NOFOLLOW`
//! relative to its parent (directories also `O_DIRECTORY`), the file
//! `O_NONBLOCK` (a fifo swapped in cannot hang us), and fstat(2) of the
//! *opened* file must say a regular file with one link, within the size
//! limit (for a file a human approved, within the size approved: a file
//! grown since is left out and is a new question). A file that changed
//! into something else between the listing and the open is left out (and
//! logged), never followed. At most the size
//! fstat saw is copied, and what was copied is what is hashed and
//! returned. Targets are created `O_CREAT|O_EXCL|O_NOFOLLOW` in a
//! temporary directory (0700) beside `dest`, renamed to `dest` when all
//! are copied; on error nothing is left at `dest`.

use std::collections::BTreeMap;
use std::io;
use std::os::fd::{AsFd, BorrowedFd, OwnedFd};
use std::path::{Path, PathBuf};

use crate::glob::{self, PatternError};
use crate::walk::{self, Kind, Visit, WalkError};
use crate::{Artifact, Exported};

/// Why listing or exporting failed.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("artifacts: {0}")]
    Pattern(#[from] PatternError),
    #[error("artifacts: output {path:?}: {source}")]
    Output { path: PathBuf, source: io::Error },
    #[error("artifacts: {path:?}: {source}")]
    Read { path: String, source: io::Error },
    #[error("export: destination {path:?}: {reason}")]
    Dest { path: PathBuf, reason: String },
    #[error("export: {path:?}: {source}")]
    Copy { path: String, source: io::Error },
}

pub type Result<T, E = Error> = std::result::Result<T, E>;

/// The artifacts over the size limit a human approved, each bound to the
/// size it was listed at and the human saw (path → bytes; the CLI's
/// `--approve-large PATH=BYTES`). An approval covers that file at no more
/// than those bytes: grown since, it stays, and is a new question.
pub type Approved = BTreeMap<String, u64>;

/// Parses one `PATH=BYTES` approval (split at the last `=`: a path may
/// hold one, a size may not).
pub fn parse_approval(arg: &str) -> std::result::Result<(String, u64), String> {
    let (path, bytes) = arg
        .rsplit_once('=')
        .ok_or_else(|| format!("{arg:?}: expected PATH=BYTES, as `artifacts list` shows it"))?;
    let bytes = bytes
        .parse::<u64>()
        .map_err(|e| format!("{arg:?}: the size {bytes:?}: {e}"))?;
    if path.is_empty() {
        return Err(format!("{arg:?}: no path"));
    }
    Ok((path.to_string(), bytes))
}

/// The argument that approves `path` at `size` (`PATH=BYTES`).
pub fn approval_arg(path: &str, size: u64) -> String {
    format!("{path}={size}")
}

impl From<WalkError> for Error {
    fn from(e: WalkError) -> Self {
        Error::Read {
            path: e.path,
            source: e.source,
        }
    }
}

/// Why a matching path is not exported.
#[derive(Debug, Clone, PartialEq, Eq)]
enum Refusal {
    Symlink,
    SymlinkInPath,
    Hardlink(u64),
    Special(Kind),
    Dir,
    BadName,
    TooDeep,
    TooLarge { size: u64, max: u64 },
}

impl Refusal {
    fn reason(&self) -> String {
        match self {
            Refusal::Symlink => "a symlink: never followed, it could lead out of output".into(),
            Refusal::SymlinkInPath => {
                "a symlink where matching files could lie below it: never followed, it could lead out of output".into()
            }
            Refusal::Hardlink(n) => {
                format!("a hardlink ({n} links): the same file is reachable from outside output")
            }
            Refusal::Special(k) => format!("a {}: only regular files are artifacts", k.as_str()),
            Refusal::Dir => "a directory: only files are artifacts".into(),
            Refusal::BadName => "a name that is not UTF-8".into(),
            Refusal::TooDeep => format!("deeper than {} directories", walk::MAX_DEPTH),
            Refusal::TooLarge { size, max } => {
                format!("{size} bytes, over the limit of {max}: needs approval")
            }
        }
    }
}

struct Found {
    path: String,
    size: u64,
    refusal: Option<Refusal>,
}

fn find(output: BorrowedFd<'_>, patterns: &[String], max_size: u64) -> Result<Vec<Found>> {
    for p in patterns {
        glob::check_pattern(p)?;
    }
    let matched = |rel: &str| patterns.iter().any(|p| glob::matches(p, rel));
    let inside = |rel: &str| patterns.iter().any(|p| glob::may_contain(p, rel));
    let mut found = Vec::new();
    walk::walk(output, "", &mut |v: Visit<'_>| -> Result<bool> {
        match v {
            Visit::BadName { rel, .. } => {
                if matched(&rel) || inside(&rel) {
                    found.push(Found {
                        path: rel,
                        size: 0,
                        refusal: Some(Refusal::BadName),
                    });
                }
                Ok(false)
            }
            Visit::TooDeep { rel } => {
                if inside(rel) {
                    found.push(Found {
                        path: rel.into(),
                        size: 0,
                        refusal: Some(Refusal::TooDeep),
                    });
                }
                Ok(false)
            }
            Visit::Node(n) => {
                let refusal = match n.kind {
                    Kind::Dir => {
                        // `**` at the end walks through directories
                        let named = patterns
                            .iter()
                            .any(|p| !p.ends_with("**") && glob::matches(p, n.rel));
                        if named {
                            found.push(Found {
                                path: n.rel.into(),
                                size: 0,
                                refusal: Some(Refusal::Dir),
                            });
                        }
                        return Ok(inside(n.rel));
                    }
                    Kind::Symlink if matched(n.rel) => Some(Refusal::Symlink),
                    Kind::Symlink if inside(n.rel) => Some(Refusal::SymlinkInPath),
                    _ if !matched(n.rel) => return Ok(false),
                    Kind::File if n.nlink > 1 => Some(Refusal::Hardlink(n.nlink)),
                    Kind::File if n.size > max_size => Some(Refusal::TooLarge {
                        size: n.size,
                        max: max_size,
                    }),
                    Kind::File => None,
                    other => Some(Refusal::Special(other)),
                };
                found.push(Found {
                    path: n.rel.into(),
                    size: n.size,
                    refusal,
                });
                Ok(false)
            }
        }
    })?;
    Ok(found)
}

fn open_output(output: &Path) -> Result<OwnedFd> {
    walk::open_root(output).map_err(|source| Error::Output {
        path: output.into(),
        source,
    })
}

/// Every path of `output` that matches one of `patterns`, with its size
/// and, when it would not be exported, why.
pub fn list(output: &Path, patterns: &[String], max_size: u64) -> Result<Vec<Artifact>> {
    let fd = open_output(output)?;
    Ok(find(fd.as_fd(), patterns, max_size)?
        .into_iter()
        .map(|f| Artifact {
            path: f.path,
            size: f.size,
            refused: f.refusal.map(|r| r.reason()),
        })
        .collect())
}

/// Copies the exportable artifacts of `output` into `dest` (created 0700;
/// it must not exist, or be an empty directory), a file over `max_size`
/// only when `approved` names it at no less than its size now. Returns
/// what was copied, with digests, for the caller to audit.
pub fn export(
    output: &Path,
    patterns: &[String],
    max_size: u64,
    approved: &Approved,
    dest: &Path,
) -> Result<Vec<Exported>> {
    let dest_err = |reason: String| Error::Dest {
        path: dest.into(),
        reason,
    };
    let name = crate::walk::fresh_dest(dest).map_err(dest_err)?;
    let out_fd = open_output(output)?;
    let found = find(out_fd.as_fd(), patterns, max_size)?;

    let parent = match dest.parent() {
        Some(p) if !p.as_os_str().is_empty() => p,
        _ => Path::new("."),
    };
    // 0700, removed with what it holds if we return early
    let tmp = tempfile::Builder::new()
        .prefix(&format!(".{name}.export-"))
        .permissions(std::os::unix::fs::PermissionsExt::from_mode(0o700))
        .tempdir_in(parent)
        .map_err(|e| dest_err(format!("a temporary directory beside it: {e}")))?;
    let tmp_fd = walk::open_root(tmp.path()).map_err(|e| dest_err(e.to_string()))?;

    let mut exported = Vec::new();
    for f in found {
        // the most bytes this file may have: the limit, or what a human
        // approved for it (the size they were shown), never more
        let limit = match f.refusal {
            None => max_size,
            Some(Refusal::TooLarge { size, .. }) => match approved.get(&f.path) {
                Some(&yes) if size <= yes => yes,
                Some(&yes) => {
                    tracing::warn!(path = %f.path, size, approved = yes, "export: left out, grown past the size a human approved");
                    continue;
                }
                None => continue,
            },
            Some(_) => continue,
        };
        if let Some(e) = copy_one(out_fd.as_fd(), tmp_fd.as_fd(), &f.path, limit)? {
            exported.push(e);
        }
    }
    drop(tmp_fd);
    let tmp_path = tmp.keep();
    if let Err(e) = std::fs::rename(&tmp_path, dest) {
        if let Err(e) = std::fs::remove_dir_all(&tmp_path) {
            tracing::warn!(path = %tmp_path.display(), error = %e, "export: removing the temporary directory");
        }
        return Err(dest_err(e.to_string()));
    }
    Ok(exported)
}

/// Copies one listed artifact, re-checked on its descriptor; `None` when
/// it is no longer a plain file of at most `limit` bytes (it changed since
/// the listing: a race the server may try).
fn copy_one(
    output: BorrowedFd<'_>,
    dest: BorrowedFd<'_>,
    rel: &str,
    limit: u64,
) -> Result<Option<Exported>> {
    let (mut src, st) = match walk::open_file_beneath(output, rel) {
        Ok(x) => x,
        Err(e) => {
            // ELOOP, ENOTDIR, ENOENT, ...: it is not where and what it was
            tracing::warn!(path = rel, error = %e.source, "export: left out, changed since it was listed");
            return Ok(None);
        }
    };
    let size = u64::try_from(st.st_size).unwrap_or(0);
    let links = walk::nlink(&st);
    if Kind::of(st.st_mode) != Kind::File || links != 1 || size > limit {
        tracing::warn!(
            path = rel,
            kind = Kind::of(st.st_mode).as_str(),
            links,
            size,
            "export: left out, changed since it was listed"
        );
        return Ok(None);
    }
    let cerr = |source: io::Error| Error::Copy {
        path: rel.into(),
        source,
    };
    let (parent, name) = walk::split(rel);
    let dir = walk::make_dirs_beneath(dest, parent).map_err(|e| cerr(e.source))?;
    let mut out = walk::create_file_in(dir.as_fd(), name).map_err(cerr)?;
    let (copied, sha256) = walk::copy_hashing(&mut src, &mut out, size).map_err(cerr)?;
    out.sync_all().map_err(cerr)?;
    if let Ok(after) = rustix::fs::fstat(&src) {
        if u64::try_from(after.st_size).unwrap_or(0) != size || copied != size {
            tracing::warn!(
                path = rel,
                copied,
                "export: the file changed while it was copied; what was copied is recorded"
            );
        }
    }
    Ok(Some(Exported {
        path: rel.into(),
        size: copied,
        sha256,
    }))
}
