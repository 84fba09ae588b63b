//! The audit crate's errors: each variant names the step and the input that failed.

use std::path::PathBuf;

/// The audit crate's result type.
pub type Result<T, E = Error> = std::result::Result<T, E>;

/// Everything that can go wrong in the audit stores and helpers.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// A file or directory could not be created, opened, written or synced.
    #[error("audit {step} {path}: {source}")]
    Io {
        /// What was being done, e.g. `create dir`.
        step: &'static str,
        /// The path involved.
        path: PathBuf,
        /// The underlying error.
        #[source]
        source: std::io::Error,
    },
    /// SQLite refused a step.
    #[error("audit database {step}: {source}")]
    Sqlite {
        /// What was being done, e.g. `insert event`.
        step: &'static str,
        /// The underlying error.
        #[source]
        source: rusqlite::Error,
    },
    /// The database was written by a newer mcpbox with a schema this one does not know.
    #[error(
        "audit database schema version {found} is newer than this mcpbox supports ({supported})"
    )]
    SchemaTooNew {
        /// The version found in the database.
        found: i64,
        /// The newest version this build knows.
        supported: i64,
    },
    /// A stored row could not be turned back into an event.
    #[error("audit record seq {seq} is corrupt: {what}")]
    Corrupt {
        /// The row's sequence number.
        seq: i64,
        /// What was wrong with it.
        what: String,
    },
    /// The audit key file holds no key.
    #[error("audit key {path}: {what}")]
    BadKey {
        /// The key file.
        path: PathBuf,
        /// What is wrong with it.
        what: &'static str,
    },
    /// An event could not be serialized.
    #[error("audit event serialization: {0}")]
    Json(#[from] serde_json::Error),
    /// A string did not name a known kind or decision.
    #[error("unknown {what} {value:?}")]
    UnknownValue {
        /// `kind` or `decision`.
        what: &'static str,
        /// The string given.
        value: String,
    },
    /// A time given on the command line could not be parsed.
    #[error(
        "bad time {input:?}: {why} (expected 2026-11-29T10:00:00Z, 2026-11-29, or -30m/-1h/-7d)"
    )]
    BadTime {
        /// The string given.
        input: String,
        /// What was wrong with it.
        why: &'static str,
    },
}

impl Error {
    pub(crate) fn sqlite(step: &'static str) -> impl FnOnce(rusqlite::Error) -> Error {
        move |source| Error::Sqlite { step, source }
    }

    pub(crate) fn io(
        step: &'static str,
        path: &std::path::Path,
    ) -> impl FnOnce(std::io::Error) -> Error {
        let path = path.to_path_buf();
        move |source| Error::Io { step, path, source }
    }
}

/// Why a record could not be written when it had to be
/// ([`crate::Sink::commit`]): what the relay names in the refusal of a call
/// (`audit.unavailable`) and logs.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Unwritten {
    /// The class of the failure, for the message.
    pub cause: Cause,
    /// The store's own words (SQLite's error, the path).
    pub detail: String,
}

/// The classes of a failed write a human can act on.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Cause {
    /// The filesystem (or SQLite's own page limit) is full: free space.
    DiskFull,
    /// Another process held the log's write lock past the busy timeout.
    Locked,
    /// The file is not a sound database any more (malformed, not a
    /// database): move it aside, keep it for inspection.
    Broken,
    /// The file or its directory cannot be written (permissions, an
    /// immutable file, a read-only mount).
    ReadOnly,
    /// Another input/output error of the filesystem.
    Io,
    /// Anything else.
    Other,
}

impl Cause {
    /// A few words for a message: "disk full", "locked by another process".
    pub fn as_str(self) -> &'static str {
        match self {
            Cause::DiskFull => "disk full",
            Cause::Locked => "locked by another process",
            Cause::Broken => "broken (malformed database)",
            Cause::ReadOnly => "not writable",
            Cause::Io => "input/output error",
            Cause::Other => "write failed",
        }
    }
}

impl std::fmt::Display for Unwritten {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}: {}", self.cause.as_str(), self.detail)
    }
}

impl From<&Error> for Cause {
    fn from(e: &Error) -> Cause {
        use rusqlite::ErrorCode as C;
        match e {
            Error::Sqlite {
                source: rusqlite::Error::SqliteFailure(f, _),
                ..
            } => match f.code {
                C::DiskFull => Cause::DiskFull,
                C::DatabaseBusy | C::DatabaseLocked => Cause::Locked,
                C::DatabaseCorrupt | C::NotADatabase => Cause::Broken,
                C::ReadOnly | C::PermissionDenied | C::CannotOpen => Cause::ReadOnly,
                C::SystemIoFailure => Cause::Io,
                _ => Cause::Other,
            },
            Error::Io { source, .. } => io_cause(source),
            Error::Corrupt { .. } | Error::SchemaTooNew { .. } => Cause::Broken,
            _ => Cause::Other,
        }
    }
}

/// The class of an input/output error, by its errno.
fn io_cause(e: &std::io::Error) -> Cause {
    use std::io::ErrorKind as K;
    match e.kind() {
        // ENOSPC, EDQUOT
        K::StorageFull | K::QuotaExceeded => Cause::DiskFull,
        // EACCES, EPERM, EROFS
        K::PermissionDenied | K::ReadOnlyFilesystem => Cause::ReadOnly,
        _ => Cause::Io,
    }
}

impl From<Error> for Unwritten {
    fn from(e: Error) -> Unwritten {
        Unwritten {
            cause: Cause::from(&e),
            detail: e.to_string(),
        }
    }
}
