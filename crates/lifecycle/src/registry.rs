//! The sandboxes of a state directory, recorded in SQLite
//! (`<state>/sandboxes.db`), so that a `serve` started again knows what
//! the last run left: workspaces to re-adopt, cgroups and processes to
//! clean up. One row per sandbox that is not destroyed; a destroyed
//! sandbox's row is deleted (the audit log keeps its history).

use std::path::{Path, PathBuf};

use rusqlite::{params, Connection, OptionalExtension};

use crate::id::Key;
use crate::State;

/// One recorded sandbox.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Record {
    pub id: String,
    pub key: Key,
    pub template: Option<String>,
    pub state: State,
    pub workspace: PathBuf,
    /// Milliseconds since the epoch.
    pub created_ms: i64,
    pub updated_ms: i64,
    /// The `serve` process that last ran it.
    pub owner_pid: u32,
}

/// Why the registry failed.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("sandbox registry {path}: {source}")]
    Sqlite {
        path: PathBuf,
        #[source]
        source: rusqlite::Error,
    },
    #[error("sandbox registry {path}: creating it (0600): {source}")]
    Create {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("sandbox registry {path}: reading /dev/urandom for the id salt: {source}")]
    Random {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("sandbox registry {path}: row {id} has an unknown state {state:?}")]
    BadState {
        path: PathBuf,
        id: String,
        state: String,
    },
}

pub type Result<T> = std::result::Result<T, Error>;

/// The registry, open.
#[derive(Debug)]
pub struct Registry {
    path: PathBuf,
    conn: Connection,
}

const SCHEMA: &str = "
CREATE TABLE IF NOT EXISTS sandboxes (
    id         TEXT PRIMARY KEY,
    agent      TEXT NOT NULL,
    server     TEXT NOT NULL,
    task       TEXT,
    template   TEXT,
    state      TEXT NOT NULL,
    workspace  TEXT NOT NULL,
    created_ms INTEGER NOT NULL,
    updated_ms INTEGER NOT NULL,
    owner_pid  INTEGER NOT NULL
);
CREATE TABLE IF NOT EXISTS meta (
    key   TEXT PRIMARY KEY,
    value TEXT NOT NULL
);
";

impl Registry {
    /// Opens (creating) the registry at `path`, mode 0600.
    pub fn open(path: &Path) -> Result<Registry> {
        let err = |source| Error::Sqlite {
            path: path.to_path_buf(),
            source,
        };
        // made 0600 before SQLite opens it: SQLite gives its -wal and -shm
        // files the database's mode, and the registry names every
        // sandbox's command and owner, nobody else's to read
        {
            use std::os::unix::fs::{OpenOptionsExt, PermissionsExt};
            // Only a file that does not exist yet is opened (O_EXCL): closing
            // a descriptor of a file drops every POSIX lock this process holds
            // on it, SQLite's included (fcntl(2); sqlite.org/howtocorrupt.html
            // 2.2), so an existing registry is made private by its path.
            let made = match std::fs::OpenOptions::new()
                .read(true)
                .write(true)
                .create_new(true)
                .mode(0o600)
                .open(path)
            {
                Ok(created) => created.set_permissions(std::fs::Permissions::from_mode(0o600)),
                Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => {
                    std::fs::set_permissions(path, std::fs::Permissions::from_mode(0o600))
                }
                Err(e) => Err(e),
            };
            if let Err(source) = made {
                return Err(Error::Create {
                    path: path.to_path_buf(),
                    source,
                });
            }
        }
        let conn = Connection::open(path).map_err(err)?;
        // a second reader (a CLI, a test) waits briefly instead of failing
        conn.busy_timeout(std::time::Duration::from_secs(5))
            .map_err(err)?;
        // Write-ahead log with a sync of it at each commit: as durable as
        // the rollback journal's default (synchronous=FULL), with one
        // fsync per commit where the journal took four, and each new
        // sandbox is recorded on the session's path. Where WAL is not
        // available (some network filesystems) SQLite keeps its journal.
        let mode: String = conn
            .query_row("PRAGMA journal_mode=WAL", [], |r| r.get(0))
            .map_err(err)?;
        if !mode.eq_ignore_ascii_case("wal") {
            tracing::debug!(path = %path.display(), mode, "sandbox registry not in WAL mode");
        }
        conn.pragma_update(None, "synchronous", "FULL")
            .map_err(err)?;
        conn.execute_batch(SCHEMA).map_err(err)?;
        Ok(Registry {
            path: path.to_path_buf(),
            conn,
        })
    }

    fn err(&self, source: rusqlite::Error) -> Error {
        Error::Sqlite {
            path: self.path.clone(),
            source,
        }
    }

    /// This state directory's salt for sandbox ids ([`Key::id`]): made
    /// once from the kernel's random source, then kept.
    pub fn salt(&self) -> Result<String> {
        let have: Option<String> = self
            .conn
            .query_row("SELECT value FROM meta WHERE key = 'salt'", [], |r| {
                r.get(0)
            })
            .optional()
            .map_err(|e| self.err(e))?;
        if let Some(s) = have {
            return Ok(s);
        }
        let mut bytes = [0u8; 16];
        {
            use std::io::Read;
            std::fs::File::open("/dev/urandom")
                .and_then(|mut f| f.read_exact(&mut bytes))
                .map_err(|e| Error::Random {
                    path: self.path.clone(),
                    source: e,
                })?;
        }
        let salt = mcpbox_policy::hex::encode(&bytes);
        self.conn
            .execute(
                "INSERT OR IGNORE INTO meta (key, value) VALUES ('salt', ?1)",
                params![salt],
            )
            .map_err(|e| self.err(e))?;
        // another opener may have won the race: read what is stored
        self.conn
            .query_row("SELECT value FROM meta WHERE key = 'salt'", [], |r| {
                r.get(0)
            })
            .map_err(|e| self.err(e))
    }

    /// Records `r`, replacing the row of the same id.
    pub fn put(&self, r: &Record) -> Result<()> {
        self.conn
            .execute(
                "INSERT OR REPLACE INTO sandboxes
                 (id, agent, server, task, template, state, workspace, created_ms, updated_ms, owner_pid)
                 VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9, ?10)",
                params![
                    r.id,
                    r.key.agent,
                    r.key.server,
                    r.key.task,
                    r.template,
                    r.state.as_str(),
                    r.workspace.to_string_lossy(),
                    r.created_ms,
                    r.updated_ms,
                    r.owner_pid,
                ],
            )
            .map_err(|e| self.err(e))?;
        Ok(())
    }

    /// Sets the state of `id` (no row: nothing happens).
    pub fn set_state(&self, id: &str, state: State, now_ms: i64) -> Result<()> {
        self.conn
            .execute(
                "UPDATE sandboxes SET state = ?2, updated_ms = ?3 WHERE id = ?1",
                params![id, state.as_str(), now_ms],
            )
            .map_err(|e| self.err(e))?;
        Ok(())
    }

    /// Deletes the row of `id`.
    pub fn remove(&self, id: &str) -> Result<()> {
        self.conn
            .execute("DELETE FROM sandboxes WHERE id = ?1", params![id])
            .map_err(|e| self.err(e))?;
        Ok(())
    }

    /// The row of `id`.
    pub fn get(&self, id: &str) -> Result<Option<Record>> {
        let row = self
            .conn
            .query_row(
                "SELECT id, agent, server, task, template, state, workspace, created_ms, updated_ms, owner_pid
                 FROM sandboxes WHERE id = ?1",
                params![id],
                raw,
            )
            .optional()
            .map_err(|e| self.err(e))?;
        row.map(|r| self.record(r)).transpose()
    }

    /// Every row, oldest first.
    pub fn all(&self) -> Result<Vec<Record>> {
        let mut stmt = self
            .conn
            .prepare(
                "SELECT id, agent, server, task, template, state, workspace, created_ms, updated_ms, owner_pid
                 FROM sandboxes ORDER BY created_ms, id",
            )
            .map_err(|e| self.err(e))?;
        let rows = stmt
            .query_map([], raw)
            .map_err(|e| self.err(e))?
            .collect::<std::result::Result<Vec<_>, _>>()
            .map_err(|e| self.err(e))?;
        rows.into_iter().map(|r| self.record(r)).collect()
    }

    fn record(&self, r: Raw) -> Result<Record> {
        let state = State::parse(&r.state).ok_or_else(|| Error::BadState {
            path: self.path.clone(),
            id: r.id.clone(),
            state: r.state.clone(),
        })?;
        Ok(Record {
            id: r.id,
            key: Key {
                agent: r.agent,
                server: r.server,
                task: r.task,
            },
            template: r.template,
            state,
            workspace: PathBuf::from(r.workspace),
            created_ms: r.created_ms,
            updated_ms: r.updated_ms,
            owner_pid: r.owner_pid,
        })
    }
}

struct Raw {
    id: String,
    agent: String,
    server: String,
    task: Option<String>,
    template: Option<String>,
    state: String,
    workspace: String,
    created_ms: i64,
    updated_ms: i64,
    owner_pid: u32,
}

fn raw(row: &rusqlite::Row<'_>) -> rusqlite::Result<Raw> {
    Ok(Raw {
        id: row.get(0)?,
        agent: row.get(1)?,
        server: row.get(2)?,
        task: row.get(3)?,
        template: row.get(4)?,
        state: row.get(5)?,
        workspace: row.get(6)?,
        created_ms: row.get(7)?,
        updated_ms: row.get(8)?,
        owner_pid: row.get(9)?,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn record(agent: &str, task: Option<&str>) -> Record {
        let key = Key {
            agent: agent.into(),
            server: "fs".into(),
            task: task.map(String::from),
        };
        Record {
            id: key.id("salt"),
            key,
            template: Some("py".into()),
            state: State::Running,
            workspace: PathBuf::from("/state/sandboxes/x"),
            created_ms: 1,
            updated_ms: 2,
            owner_pid: 42,
        }
    }

    #[test]
    fn records_survive_reopening_and_states_change() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("sandboxes.db");
        let a = record("alice", None);
        let b = record("bob", Some("t1"));
        {
            let r = Registry::open(&path).unwrap();
            r.put(&a).unwrap();
            r.put(&b).unwrap();
            r.set_state(&a.id, State::Paused, 9).unwrap();
        }
        let r = Registry::open(&path).unwrap();
        let got = r.get(&a.id).unwrap().unwrap();
        assert_eq!(got.state, State::Paused);
        assert_eq!(got.updated_ms, 9);
        assert_eq!(r.get(&b.id).unwrap().unwrap(), b);
        assert_eq!(r.all().unwrap().len(), 2);
        r.remove(&a.id).unwrap();
        assert!(r.get(&a.id).unwrap().is_none());
        use std::os::unix::fs::PermissionsExt;
        let mode = std::fs::metadata(&path).unwrap().permissions().mode() & 0o777;
        assert_eq!(mode, 0o600);
    }

    #[test]
    fn the_salt_is_made_once_and_kept() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("sandboxes.db");
        let first = Registry::open(&path).unwrap().salt().unwrap();
        assert_eq!(first.len(), 32);
        assert_eq!(Registry::open(&path).unwrap().salt().unwrap(), first);
        let other = tempfile::tempdir().unwrap();
        let second = Registry::open(&other.path().join("sandboxes.db"))
            .unwrap()
            .salt()
            .unwrap();
        assert_ne!(first, second);
    }

    #[test]
    fn a_row_with_an_unknown_state_is_an_error_not_a_guess() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("sandboxes.db");
        let r = Registry::open(&path).unwrap();
        let a = record("alice", None);
        r.put(&a).unwrap();
        r.conn
            .execute("UPDATE sandboxes SET state = 'zombie'", [])
            .unwrap();
        assert!(matches!(r.get(&a.id), Err(Error::BadState { .. })));
    }
}
