//! An append-only JSON Lines audit file, for `--audit-jsonl` users.

use std::fs::{File, OpenOptions};
use std::io::Write;
use std::os::unix::fs::{DirBuilderExt, OpenOptionsExt};
use std::path::{Path, PathBuf};
use std::sync::{Mutex, MutexGuard};

use crate::pending::{write_through, Pending};
use crate::{to_json_line, Error, Event, Result, Sink};

/// Appends one JSON object per line (the same form as [`to_json_line`]) and
/// `fsync`s the file after each, so a returned `record` survives a crash.
///
/// No hash chain: use [`crate::SqliteStore`] where tamper evidence matters.
/// On a write error the event is logged and kept in memory until the next
/// successful write (see the crate's fallback notes).
#[derive(Debug)]
pub struct JsonlStore {
    path: PathBuf,
    inner: Mutex<Inner>,
}

#[derive(Debug)]
struct Inner {
    file: File,
    pending: Pending,
}

impl JsonlStore {
    /// Opens (or creates, mode 0600, with missing parent directories) the
    /// file at `path` for appending.
    pub fn open(path: &Path) -> Result<JsonlStore> {
        if let Some(parent) = path.parent().filter(|p| !p.as_os_str().is_empty()) {
            std::fs::DirBuilder::new()
                .recursive(true)
                .mode(0o700)
                .create(parent)
                .map_err(Error::io("create dir", parent))?;
        }
        let file = OpenOptions::new()
            .append(true)
            .create(true)
            .mode(0o600)
            .open(path)
            .map_err(Error::io("open", path))?;
        Ok(JsonlStore {
            path: path.to_path_buf(),
            inner: Mutex::new(Inner {
                file,
                pending: Pending::default(),
            }),
        })
    }

    /// The file's path.
    pub fn path(&self) -> &Path {
        &self.path
    }

    fn lock(&self) -> MutexGuard<'_, Inner> {
        self.inner.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Appends one event and syncs it; errors are returned, not queued.
    pub fn append(&self, mut event: Event) -> Result<()> {
        if event.time_ms == 0 {
            event.time_ms = crate::now_ms();
        }
        let mut inner = self.lock();
        write_line(&mut inner.file, &event, &self.path)
    }

    /// How many events are waiting in memory after failed writes.
    pub fn pending_len(&self) -> usize {
        self.lock().pending.len()
    }
}

fn write_line(file: &mut File, event: &Event, path: &Path) -> Result<()> {
    let mut line = to_json_line(event);
    line.push('\n');
    // One write call per line: with O_APPEND, concurrent writers (other
    // processes) do not interleave inside a line on a local filesystem.
    file.write_all(line.as_bytes())
        .map_err(Error::io("append", path))?;
    file.sync_data().map_err(Error::io("sync", path))
}

impl Sink for JsonlStore {
    fn record(&self, mut event: Event) {
        if event.time_ms == 0 {
            event.time_ms = crate::now_ms();
        }
        let mut guard = self.lock();
        let inner = &mut *guard;
        let path = &self.path;
        let file = &mut inner.file;
        write_through(&mut inner.pending, event, "jsonl", |e| {
            write_line(file, e, path)
        });
    }

    fn healthy(&self) -> bool {
        self.lock().pending.len() == 0
    }

    /// The queued lines first, then `event`; on an error `event` is not kept.
    fn commit(&self, mut event: Event) -> std::result::Result<(), crate::Unwritten> {
        if event.time_ms == 0 {
            event.time_ms = crate::now_ms();
        }
        let mut guard = self.lock();
        let inner = &mut *guard;
        while let Some(front) = inner.pending.front() {
            write_line(&mut inner.file, front, &self.path)?;
            inner.pending.pop_front();
        }
        Ok(write_line(&mut inner.file, &event, &self.path)?)
    }
}
