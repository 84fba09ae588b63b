//! Which files a tool call read, wrote, renamed and removed, as the
//! kernel saw it: fanotify(7) marks on the sandbox's workspace.
//!
//! How it holds together:
//!
//! - **The watch** is the binary's (`mcpbox_sandbox::fanotify`, joined in
//!   `mcpbox/src/launch.rs`): as root, mount marks on the sandbox's own
//!   workspace mounts (only the server's reads and writes, each event with
//!   a descriptor of its file) plus inode marks on the writable trees'
//!   directories (renames and removals); rootless, inode marks on every
//!   workspace directory for all of it ([`FileEvents::mode`]). Every path
//!   is the sandbox's name (`/workspace/output/a.txt`). Where the kernel
//!   refuses both, the relay falls back to the modification-time walk of
//!   [`crate::written`].
//! - **Renames and removals** move an entry to its new name (keeping the
//!   first as `moved_from`) or mark it `deleted`; a renamed directory takes
//!   the entries listed under it along.
//! - **The events** say read or written (a read-only open and close counts
//!   as a read, so a read through mmap is not missed); the descriptor that
//!   comes with each is the kernel's, opened for us without notification,
//!   so the digest makes no event of its own.
//! - **Which call.** The relay's driver drains the queue (non-blocking)
//!   whenever the descriptor is readable and each time the set of calls in
//!   flight changes, *before* it changes: an event is queued inside the
//!   read(2) or write(2) (or the close) that caused it, so every event of
//!   a call is queued before the server writes the call's response, and
//!   the drain that comes with that response gives it to the call. An
//!   event while several calls are in flight goes to each of them (as the
//!   egress proxy's records do).
//! - **Bounds.** [`MAX_FILES`] files per call, [`MAX_HELD`] descriptors
//!   held for all calls together; the kernel's queue holds 16384 events
//!   and says when it overflowed. Whatever a bound cut is flagged
//!   `files_truncated`, never silently dropped.
//! - **Digests** are taken when the call's record is written (the audit
//!   thread, not the host path): SHA-256 of the file's content then, up to
//!   [`MAX_DIGESTED`] bytes; a larger file gets its size and no digest.
//!
//! Not seen: files under `/workspace/tmp` (discarded with the sandbox),
//! accesses before the marks are placed (the server's own start, before
//! any call), and a file opened and closed without a read or a write.

use std::collections::HashMap;
use std::fs::File;
use std::io;
use std::os::fd::BorrowedFd;
use std::os::unix::fs::{FileExt, MetadataExt};
use std::sync::Arc;

use serde_json::{json, Value};
use sha2::{Digest, Sha256};

/// Most files listed per call.
pub const MAX_FILES: usize = 256;
/// Most file descriptors held, over all calls in flight.
pub const MAX_HELD: usize = 1024;
/// Largest file whose content is digested, in bytes.
pub const MAX_DIGESTED: u64 = 64 << 20;

/// One access the kernel reported, every path as the sandbox names it,
/// control characters escaped.
#[derive(Debug)]
pub enum Access {
    /// A file read or written.
    File {
        /// The file (read-only; opened by the kernel without notification,
        /// or by the watch beneath its tree).
        file: File,
        /// Its path.
        path: String,
        /// Written (else read).
        written: bool,
    },
    /// A file or directory renamed.
    Moved {
        /// The name it had.
        from: String,
        /// The name it has.
        to: String,
        /// The file at its new name, when it is one and could be opened.
        file: Option<File>,
    },
    /// A file or directory removed.
    Deleted {
        /// The name it had.
        path: String,
    },
}

/// A kernel watch on a sandbox's workspace (the binary's joins
/// `mcpbox_sandbox::fanotify`'s mount and directory watches).
pub trait FileEvents: Send + std::fmt::Debug {
    /// Readable when events are queued (one or two descriptors).
    fn fds(&self) -> [Option<BorrowedFd<'_>>; 2];
    /// Everything queued now, without blocking; true when events were lost.
    fn drain(&mut self, each: &mut dyn FnMut(Access)) -> bool;
    /// What `session_start` says of it: `kernel` (the sandbox's own
    /// accesses only) or `kernel-dirs` (any process's but mcpbox's).
    fn mode(&self) -> &'static str;
    /// Directories past the watch's bound, whose events are not seen.
    fn unwatched(&self) -> usize;
    /// Renames and removals are seen.
    fn renames(&self) -> bool;
}

/// A watch for [`crate::launcher::ServerProcess::files`].
pub type FileWatch = Box<dyn FileEvents>;

/// What a launch adds to the `session_start` record: the sandbox tier and
/// how the files are known (`files`: the watch's mode, or `times` without
/// one), with `files_unwatched_dirs` past the watch's bound and
/// `files_renames: false` when renames and removals are not watched.
pub fn launch_facts(tier: Option<&str>, files: Option<&FileWatch>) -> Value {
    let mut facts = json!({
        "sandbox_tier": tier,
        "files": files.map_or("times", |f| f.mode()),
    });
    if let Some(f) = files {
        if f.unwatched() > 0 {
            facts["files_unwatched_dirs"] = f.unwatched().into();
        }
        if !f.renames() {
            facts["files_renames"] = false.into();
        }
    }
    facts
}

/// One file a call touched.
#[derive(Debug, Clone)]
pub struct Touched {
    /// The path as the sandbox names it (the first seen for the file, or
    /// the name it was renamed to).
    pub path: String,
    /// Read during the call.
    pub read: bool,
    /// Written during the call (a truncation counts).
    pub written: bool,
    /// Renamed during the call, from this path (the first name it had).
    pub moved_from: Option<String>,
    /// Removed during the call.
    pub deleted: bool,
    /// The file, for its size and digest; `None` past [`MAX_HELD`], for a
    /// removed file and for a directory.
    file: Option<Arc<File>>,
    /// (device, inode): one entry per file, whatever its names; `None`
    /// where no file was opened (then the path is the key).
    key: Option<(u64, u64)>,
}

impl Touched {
    fn new(path: String, file: Option<Arc<File>>, key: Option<(u64, u64)>) -> Touched {
        Touched {
            path,
            read: false,
            written: false,
            moved_from: None,
            deleted: false,
            file,
            key,
        }
    }
}

/// The files one call touched.
#[derive(Debug, Clone, Default)]
pub struct CallFiles {
    /// In the order first seen.
    pub files: Vec<Touched>,
    /// A bound or the kernel's queue cut the list short.
    pub truncated: bool,
}

/// The driver's side: the watch, and the files of each call in flight.
#[derive(Debug)]
pub(crate) struct Tracker {
    watch: FileWatch,
    /// (call reference, its files), for the calls in flight now.
    calls: Vec<(String, CallFiles)>,
    /// Calls that ended, until their record takes their files.
    ended: HashMap<String, CallFiles>,
}

impl Tracker {
    pub(crate) fn new(watch: FileWatch) -> Tracker {
        Tracker {
            watch,
            calls: Vec::new(),
            ended: HashMap::new(),
        }
    }

    pub(crate) fn fds(&self) -> [Option<BorrowedFd<'_>>; 2] {
        self.watch.fds()
    }

    fn held(&self) -> usize {
        let count = |c: &CallFiles| c.files.iter().filter(|t| t.file.is_some()).count();
        self.calls.iter().map(|(_, c)| count(c)).sum::<usize>()
            + self.ended.values().map(count).sum::<usize>()
    }

    /// Gives what is queued to the calls in flight.
    pub(crate) fn drain(&mut self) {
        if self.calls.is_empty() {
            // nothing to give it to: read and drop, so the queue stays short
            let _ = self.watch.drain(&mut drop);
            return;
        }
        let mut held = self.held();
        let calls = &mut self.calls;
        let overflowed = self.watch.drain(&mut |access| {
            let (path, file, moved_from, deleted, written) = match access {
                Access::File {
                    file,
                    path,
                    written,
                } => (path, Some(file), None, false, Some(written)),
                Access::Moved { from, to, file } => (to, file, Some(from), false, None),
                Access::Deleted { path } => (path, None, None, true, None),
            };
            let key = file
                .as_ref()
                .and_then(|f| f.metadata().ok())
                .map(|m| (m.dev(), m.ino()));
            let shared = file.map(Arc::new);
            for (_, files) in calls.iter_mut() {
                let list = &mut files.files;
                // the same file: by inode, else (a rename, a removal, a
                // file seen once without a descriptor) by the name it had
                // until now
                let name = moved_from.as_ref().unwrap_or(&path);
                let known = key
                    .and_then(|k| list.iter().position(|t| t.key == Some(k)))
                    .or_else(|| {
                        list.iter()
                            .position(|t| t.path == *name && (key.is_none() || t.key.is_none()))
                    });
                let t = match known {
                    Some(i) => {
                        let t = &mut list[i];
                        if let (None, Some(f), Some(k)) = (&t.file, &shared, key) {
                            if held < MAX_HELD {
                                held += 1;
                                t.file = Some(f.clone());
                                t.key = Some(k);
                            }
                        }
                        t
                    }
                    None if list.len() >= MAX_FILES => {
                        files.truncated = true;
                        continue;
                    }
                    None => {
                        let file = match &shared {
                            Some(f) if held < MAX_HELD => {
                                held += 1;
                                Some(f.clone())
                            }
                            Some(_) => {
                                files.truncated = true;
                                None
                            }
                            None => None,
                        };
                        list.push(Touched::new(path.clone(), file, key));
                        let last = list.len() - 1;
                        &mut list[last]
                    }
                };
                if let Some(w) = written {
                    t.read |= !w;
                    t.written |= w;
                    // made again after a removal: it exists
                    t.deleted &= !w;
                }
                if let Some(from) = &moved_from {
                    t.moved_from.get_or_insert_with(|| from.clone());
                    t.path = path.clone();
                    t.deleted = false;
                }
                t.deleted |= deleted;
            }
            // a directory removed was empty (rmdir(2)): whatever is listed
            // under it is gone too, even where its own removal was not seen
            if deleted {
                let prefix = format!("{path}/");
                for (_, files) in calls.iter_mut() {
                    for t in files.files.iter_mut() {
                        t.deleted |= t.path.starts_with(&prefix);
                    }
                }
            }
            // a directory renamed: the files listed under its old name
            if let Some(from) = &moved_from {
                let prefix = format!("{from}/");
                for (_, files) in calls.iter_mut() {
                    for t in files.files.iter_mut() {
                        if let Some(rest) = t.path.strip_prefix(&prefix) {
                            t.path = format!("{path}/{rest}");
                        }
                    }
                }
            }
        });
        if overflowed {
            for (_, files) in calls.iter_mut() {
                files.truncated = true;
            }
        }
    }

    /// The calls in flight are now `refs`: what is queued goes to the
    /// previous set first; a call no longer in flight keeps its files
    /// until [`Tracker::take`].
    /// `calls` as (reference, tool), as the session lists them.
    pub(crate) fn in_flight(&mut self, calls: &[(String, String)]) {
        self.drain();
        let mut kept = Vec::with_capacity(calls.len());
        for (call, files) in std::mem::take(&mut self.calls) {
            if calls.iter().any(|(r, _)| *r == call) {
                kept.push((call, files));
            } else {
                self.ended.insert(call, files);
            }
        }
        for (r, _) in calls {
            if !kept.iter().any(|(c, _)| c == r) {
                kept.push((r.clone(), CallFiles::default()));
            }
        }
        self.calls = kept;
    }

    /// The files of a call that ended.
    pub(crate) fn take(&mut self, call: &str) -> Option<CallFiles> {
        self.ended.remove(call)
    }
}

/// What a call's record says of its files: `files_written` (paths under
/// `/workspace/output`, relative to it, as the walk lists them) and the
/// `files` detail (every file with its size and digest).
pub fn describe(files: &CallFiles) -> (Vec<String>, Value) {
    let mut written = Vec::new();
    let mut list = Vec::with_capacity(files.files.len());
    for t in &files.files {
        // a name made in the output: written, or renamed into its place
        if (t.written || t.moved_from.is_some()) && !t.deleted {
            if let Some(rel) = t.path.strip_prefix("/workspace/output/") {
                written.push(rel.to_string());
            }
        }
        let (size, digest) = match &t.file {
            Some(f) => size_and_digest(f),
            None => (None, None),
        };
        list.push(json!({
            "path": t.path,
            "read": t.read,
            "written": t.written,
            "moved_from": t.moved_from,
            "deleted": t.deleted,
            "size": size,
            "sha256": digest,
        }));
    }
    written.sort();
    (written, Value::Array(list))
}

/// The file's size now, and the SHA-256 of its content when it is at most
/// [`MAX_DIGESTED`] bytes (read from the start, whatever the server's
/// offset).
fn size_and_digest(f: &File) -> (Option<u64>, Option<String>) {
    let Ok(meta) = f.metadata() else {
        return (None, None);
    };
    let size = meta.len();
    if size > MAX_DIGESTED {
        return (Some(size), None);
    }
    let mut hasher = Sha256::new();
    let mut buf = vec![0u8; 64 * 1024];
    let mut read = 0u64;
    // pread: the descriptor may be shared by several calls' records, and
    // its offset must not matter
    while read <= MAX_DIGESTED {
        match f.read_at(&mut buf, read) {
            Ok(0) => break,
            Ok(n) => {
                hasher.update(&buf[..n]);
                read += n as u64;
            }
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            // EAGAIN cannot happen on a regular file; anything else: no digest
            Err(_) => return (Some(size), None),
        }
    }
    // grown while it was read: the digest would not match the size
    if read > MAX_DIGESTED {
        return (Some(size), None);
    }
    (
        Some(read),
        Some(mcpbox_policy::hex::encode(&hasher.finalize())),
    )
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;
    use std::io::Read;

    /// A watch that reports what the test queued, from its second drain
    /// on (the first comes as the call starts, before it did anything),
    /// and says of itself what the test set.
    #[derive(Debug)]
    struct Fake {
        queued: Vec<Access>,
        drained: bool,
        unwatched: usize,
        renames: bool,
    }

    impl Fake {
        fn new(queued: Vec<Access>) -> Fake {
            Fake {
                queued,
                drained: false,
                unwatched: 0,
                renames: true,
            }
        }
    }

    impl FileEvents for Fake {
        fn fds(&self) -> [Option<BorrowedFd<'_>>; 2] {
            [None, None]
        }
        fn drain(&mut self, each: &mut dyn FnMut(Access)) -> bool {
            if std::mem::replace(&mut self.drained, true) {
                self.queued.drain(..).for_each(each);
            }
            false
        }
        fn mode(&self) -> &'static str {
            "kernel"
        }
        fn unwatched(&self) -> usize {
            self.unwatched
        }
        fn renames(&self) -> bool {
            self.renames
        }
    }

    #[test]
    fn a_file_in_a_directory_renamed_then_removed_is_listed_removed_under_its_last_name() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("loot");
        std::fs::write(&p, b"loot").unwrap();
        let queued = Fake::new(vec![
            Access::File {
                file: File::open(&p).unwrap(),
                path: "/workspace/output/stage/loot".into(),
                written: true,
            },
            Access::Moved {
                from: "/workspace/output/stage".into(),
                to: "/workspace/output/moved".into(),
                file: None,
            },
            // the file's own removal unseen (its directory was never
            // marked): only the directory's
            Access::Deleted {
                path: "/workspace/output/moved".into(),
            },
        ]);
        let mut t = Tracker::new(Box::new(queued));
        let call = vec![("call-1".to_string(), "hide".to_string())];
        t.in_flight(&call);
        t.in_flight(&[]);
        let files = t.take("call-1").unwrap();
        let (written, detail) = describe(&files);
        assert_eq!(written, Vec::<String>::new(), "{detail}");
        assert_eq!(
            detail[0]["path"], "/workspace/output/moved/loot",
            "{detail}"
        );
        assert_eq!(detail[0]["deleted"], true, "{detail}");
        assert_eq!(
            detail[1]["moved_from"], "/workspace/output/stage",
            "{detail}"
        );
        assert_eq!(detail[1]["deleted"], true, "{detail}");
    }

    #[test]
    fn session_start_says_what_the_watch_cannot_see() {
        assert_eq!(
            launch_facts(Some("full"), None),
            json!({"sandbox_tier": "full", "files": "times"})
        );
        let whole: FileWatch = Box::new(Fake::new(Vec::new()));
        assert_eq!(
            launch_facts(Some("full"), Some(&whole)),
            json!({"sandbox_tier": "full", "files": "kernel"})
        );
        // past the budget of fanotify groups, and past the bound on marks
        let short: FileWatch = Box::new(Fake {
            unwatched: 7,
            renames: false,
            ..Fake::new(Vec::new())
        });
        assert_eq!(
            launch_facts(Some("full"), Some(&short)),
            json!({"sandbox_tier": "full", "files": "kernel",
                "files_unwatched_dirs": 7, "files_renames": false})
        );
    }

    #[test]
    fn the_digest_is_of_the_whole_file_from_its_start() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("a");
        std::fs::write(&p, b"hello\n").unwrap();
        let mut f = File::open(&p).unwrap();
        let mut one = [0u8; 3];
        f.read_exact(&mut one).unwrap();
        let (size, digest) = size_and_digest(&f);
        assert_eq!(size, Some(6));
        assert_eq!(
            digest.as_deref(),
            Some("5891b5b522d5df086d0ff0b110fbd9d21bb4fc7163af34d08286a2e846f6be03")
        );
    }
}
