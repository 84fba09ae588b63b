//! Which files in the output directory a tool call wrote: a bounded walk
//! for regular files changed at or after the call's start.
//!
//! Timestamps, and what they cannot tell:
//!
//! - File systems stamp inodes with the kernel's *coarse* real-time clock
//!   (updated once per tick, 1 to 10 ms), so a file written just after
//!   `SystemTime::now()` can carry an earlier mtime. [`coarse_now`] reads
//!   that same coarse clock, so a write after it is never missed; a file
//!   written up to one tick before the call may be listed too.
//! - The server owns its files and can set their mtime (`utime`), so the
//!   status-change time (`ctime`, which no unprivileged call can set) is
//!   checked as well: a file counts when either time is at or after the
//!   start. A chmod or rename counts as a write.
//! - Calls that overlap in time each list what was written while they ran;
//!   a file written and deleted within a call is not seen; the host's clock
//!   being stepped backwards during a call can hide a write.
//!
//! This is an audit aid, not a boundary: the sandbox's mount plan is what
//! confines writes.

use std::fs;
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

/// Most directory entries looked at per walk.
pub const MAX_ENTRIES: usize = 4096;
/// Deepest directory level entered (the output directory itself is 0).
pub const MAX_DEPTH: usize = 8;
/// Most paths listed per call.
pub const MAX_LISTED: usize = 256;

/// The result of one walk.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Written {
    /// Paths relative to the output directory, sorted; control characters
    /// escaped (`\u{1b}`), other non-UTF-8 bytes replaced.
    pub paths: Vec<String>,
    /// True when a bound (entries, depth, listed paths) stopped the walk
    /// short, so the list may be incomplete.
    pub truncated: bool,
}

/// The kernel's coarse real-time clock, the one file timestamps come
/// from; falls back to `SystemTime::now()` where it cannot be read.
pub fn coarse_now() -> SystemTime {
    let ts = rustix::time::clock_gettime(rustix::time::ClockId::RealtimeCoarse);
    match (u64::try_from(ts.tv_sec), u32::try_from(ts.tv_nsec)) {
        (Ok(s), Ok(n)) if n < 1_000_000_000 => UNIX_EPOCH + Duration::new(s, n),
        _ => SystemTime::now(),
    }
}

fn changed_at(meta: &fs::Metadata) -> SystemTime {
    let at = |secs: i64, nsecs: i64| match (u64::try_from(secs), u32::try_from(nsecs)) {
        (Ok(s), Ok(n)) if n < 1_000_000_000 => UNIX_EPOCH + Duration::new(s, n),
        _ => UNIX_EPOCH,
    };
    at(meta.mtime(), meta.mtime_nsec()).max(at(meta.ctime(), meta.ctime_nsec()))
}

/// A path for a record: control, invisible and bidi characters
/// ([`mcpbox_policy::terminal::is_unsafe`]) escaped (`\u{1b}`), other
/// non-UTF-8 bytes replaced.
pub fn display(rel: &Path) -> String {
    let lossy = rel.to_string_lossy();
    if !lossy.chars().any(mcpbox_policy::terminal::is_unsafe) {
        return lossy.into_owned();
    }
    lossy
        .chars()
        .map(|c| {
            if mcpbox_policy::terminal::is_unsafe(c) {
                c.escape_default().to_string()
            } else {
                c.to_string()
            }
        })
        .collect()
}

/// Regular files under `dir` whose mtime or ctime is at or after `since`.
/// Never follows symbolic links (a link to a directory is not entered, a
/// link to a file is not listed); unreadable entries are skipped.
pub fn files_written_since(dir: &Path, since: SystemTime) -> Written {
    let mut out = Written::default();
    let mut seen = 0usize;
    // (directory, its path relative to `dir`, depth)
    let mut stack: Vec<(PathBuf, PathBuf, usize)> = vec![(dir.to_path_buf(), PathBuf::new(), 0)];
    while let Some((abs, rel, depth)) = stack.pop() {
        let Ok(entries) = fs::read_dir(&abs) else {
            continue;
        };
        for entry in entries {
            let Ok(entry) = entry else { continue };
            seen += 1;
            if seen > MAX_ENTRIES {
                out.truncated = true;
                stack.clear();
                break;
            }
            // DirEntry::metadata does not traverse symlinks
            let Ok(meta) = entry.metadata() else { continue };
            let name = entry.file_name();
            let ft = meta.file_type();
            if ft.is_dir() {
                if depth + 1 > MAX_DEPTH {
                    out.truncated = true;
                } else {
                    stack.push((entry.path(), rel.join(&name), depth + 1));
                }
            } else if ft.is_file() && changed_at(&meta) >= since {
                if out.paths.len() >= MAX_LISTED {
                    out.truncated = true;
                } else {
                    out.paths.push(display(&rel.join(&name)));
                }
            }
        }
    }
    out.paths.sort();
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn lists_new_files_not_old_ones_links_or_directories() {
        let dir = tempfile::tempdir().unwrap();
        let d = dir.path();
        std::fs::write(d.join("old.txt"), "old").unwrap();
        // an mtime and ctime well before the start
        let start = coarse_now() + Duration::from_secs(2);
        let later = |p: &Path| {
            let f = std::fs::File::options().write(true).open(p).unwrap();
            f.set_modified(start + Duration::from_secs(1)).unwrap();
        };
        std::fs::create_dir_all(d.join("sub/deeper")).unwrap();
        std::fs::write(d.join("sub/deeper/new.bin"), "x").unwrap();
        later(&d.join("sub/deeper/new.bin"));
        std::fs::write(d.join("top.txt"), "x").unwrap();
        later(&d.join("top.txt"));
        std::os::unix::fs::symlink(d.join("top.txt"), d.join("link")).unwrap();
        std::os::unix::fs::symlink("/", d.join("root")).unwrap();
        let w = files_written_since(d, start);
        assert_eq!(w.paths, vec!["sub/deeper/new.bin", "top.txt"]);
        assert!(!w.truncated);
    }

    #[test]
    fn a_file_written_right_after_the_start_is_seen() {
        let dir = tempfile::tempdir().unwrap();
        let start = coarse_now();
        std::fs::write(dir.path().join("now.txt"), "x").unwrap();
        assert_eq!(
            files_written_since(dir.path(), start).paths,
            vec!["now.txt"]
        );
    }

    #[test]
    fn a_huge_tree_is_walked_only_up_to_the_bounds() {
        let dir = tempfile::tempdir().unwrap();
        let start = coarse_now();
        for i in 0..(MAX_ENTRIES + 10) {
            std::fs::write(dir.path().join(format!("f{i}")), "").unwrap();
        }
        let w = files_written_since(dir.path(), start);
        assert!(w.truncated);
        assert_eq!(w.paths.len(), MAX_LISTED);
        let dir2 = tempfile::tempdir().unwrap();
        let mut p = dir2.path().to_path_buf();
        for _ in 0..(MAX_DEPTH + 2) {
            p = p.join("d");
        }
        std::fs::create_dir_all(&p).unwrap();
        std::fs::write(p.join("deep.txt"), "").unwrap();
        let w = files_written_since(dir2.path(), start);
        assert!(w.truncated);
        assert!(w.paths.is_empty());
    }

    #[test]
    fn control_characters_in_names_are_escaped() {
        let dir = tempfile::tempdir().unwrap();
        let start = coarse_now();
        std::fs::write(dir.path().join("a\u{1b}[31mb"), "").unwrap();
        let w = files_written_since(dir.path(), start);
        assert_eq!(w.paths, vec!["a\\u{1b}[31mb"]);
    }
}
