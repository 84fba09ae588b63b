//! The default audit store: an embedded SQLite database with a hash chain.
//!
//! Durability: WAL journal, one transaction per write, or per group of
//! writes that arrive together from several threads (`group.rs`: a
//! `record` or `commit` returns once the transaction holding it ended). With
//! [`Durability::Process`] (`synchronous=NORMAL`, the default) a `record`
//! that returned is in the write-ahead log and survives a crash or kill of
//! the process; a crash of the machine may lose the last few records. With
//! [`Durability::Machine`] (`synchronous=FULL`) it is also on disk, as far as
//! the disk honours `fsync`, at the price of a flush per event. Where WAL is
//! not available (some network filesystems) SQLite keeps its rollback
//! journal, always with `synchronous=FULL`.
//!
//! Tamper evidence: each row stores `prev_hash` and
//! `hash = sha256(prev_hash || canonical JSON of the record)`, the record
//! being the event without its null fields plus its `seq`; the first row's
//! `prev_hash` is 64 zeros. A `chain_head` row holds the last seq and hash,
//! updated in the same transaction, so deleting the newest rows shows too.
//! [`SqliteStore::verify`] walks the chain and names the first broken seq.
//! Someone who can write the file and recomputes every hash after an edit,
//! or deletes the newest rows and points the head at the new last one, has
//! a valid chain again: a store given a [`HeadKey`] also signs the head
//! (`chain_head.mac`, anchor.rs), and [`SqliteStore::verify_with`] checks
//! that signature with the key, kept outside the database. What is still
//! not caught: the whole file put back as an older copy of itself; keep a
//! copy of [`VerifyReport::head_hash`] elsewhere for that.
//!
//! Write errors in [`Sink::record`]: logged with `tracing`, and the event is
//! kept in a bounded in-memory queue that the next successful write flushes
//! first, in order (see `pending.rs`).
//!
//! Several processes may share one file: the next seq and prev hash are read
//! inside the same `BEGIN IMMEDIATE` transaction that inserts the row.

use std::fs::OpenOptions;
use std::os::unix::fs::{DirBuilderExt, OpenOptionsExt};
use std::path::{Path, PathBuf};
use std::sync::{Mutex, MutexGuard};
use std::time::Duration;

use rusqlite::types::Value as SqlValue;
use rusqlite::{params, Connection, OptionalExtension, TransactionBehavior};

use crate::canonical::{chain_hash, record_json, record_json_with, GENESIS};
use crate::group::{Answers, Batch, Group, Write};
use crate::pending::{keep, write_through, Pending};
use crate::{Durability, Error, Event, HeadKey, Query, Result, Sink};

/// Held while a store creates its file and opens its connection (see
/// [`SqliteStore::open_with`]): no connection of this process may be
/// opened on a file between its creation and the close of that descriptor.
static OPENING: Mutex<()> = Mutex::new(());

/// The schema version this build writes. Stored in the `schema_version`
/// table; a database from a newer build is refused rather than misread.
pub const SCHEMA_VERSION: i64 = 3;

/// How long a write waits for another process holding the write lock.
const DEFAULT_BUSY_TIMEOUT: Duration = Duration::from_secs(5);

/// `MIGRATIONS[i]` takes the schema from version `i` to `i + 1`.
const MIGRATIONS: &[&str] = &[
    // 0 -> 1: the first schema. No column may ever hold raw arguments,
    // results, prompts or secrets: `args_digest` and `result_bytes` only.
    "CREATE TABLE events (
        seq           INTEGER PRIMARY KEY,
        time_ms       INTEGER NOT NULL,
        kind          TEXT,
        sandbox_id    TEXT NOT NULL,
        workspace_id  TEXT NOT NULL,
        server        TEXT NOT NULL,
        caller        TEXT NOT NULL,
        tool          TEXT,
        decision      TEXT,
        reason        TEXT,
        source        TEXT,
        args_digest   TEXT,
        result_bytes  INTEGER,
        exit_status   INTEGER,
        duration_ms   INTEGER,
        files_written TEXT NOT NULL,
        detail        TEXT NOT NULL,
        prev_hash     TEXT NOT NULL,
        hash          TEXT NOT NULL
     );
     CREATE INDEX events_time ON events (time_ms);
     CREATE INDEX events_server_tool ON events (server, tool);
     CREATE TABLE chain_head (
        id   INTEGER PRIMARY KEY CHECK (id = 1),
        seq  INTEGER NOT NULL,
        hash TEXT NOT NULL
     );",
    // 1 -> 2: the head's MAC (anchor.rs), NULL where no key was given.
    "ALTER TABLE chain_head ADD COLUMN mac TEXT;",
    // 2 -> 3: retention (`SqliteStore::prune`): the seq and hash of the last
    // record removed, signed like the head, so the chain starts from it.
    "CREATE TABLE IF NOT EXISTS chain_base (
        id        INTEGER PRIMARY KEY CHECK (id = 1),
        seq       INTEGER NOT NULL,
        hash      TEXT NOT NULL,
        mac       TEXT,
        pruned_ms INTEGER NOT NULL
     );",
];

const SELECT_COLUMNS: &str = "seq, time_ms, kind, sandbox_id, workspace_id, server, caller, tool, \
     decision, reason, source, args_digest, result_bytes, exit_status, duration_ms, files_written, \
     detail, prev_hash, hash";

/// A stored event with its place in the chain.
#[derive(Debug, Clone, PartialEq)]
pub struct Record {
    /// Position in the log, from 1, without gaps.
    pub seq: i64,
    /// Hex `sha256(prev_hash || canonical record)`.
    pub hash: String,
    /// The event as stored (its `time_ms` filled in).
    pub event: Event,
}

/// The outcome of [`SqliteStore::verify`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct VerifyReport {
    /// Rows checked and found intact, in seq order, before any break.
    pub records: u64,
    /// The hash of the last intact row (64 zeros for an empty log). Keep it
    /// elsewhere to anchor the chain against a wholesale rewrite.
    pub head_hash: String,
    /// The first seq at which the chain is broken (an edited, deleted or
    /// reordered row), or `None` when the whole log is intact.
    pub first_broken_seq: Option<i64>,
    /// Machine-readable reason for the break: `chain.seq_gap` (row missing),
    /// `chain.prev_mismatch` (row does not follow its predecessor),
    /// `chain.hash_mismatch` (row edited), `chain.undecodable_row`,
    /// `chain.tail_missing` (newest rows deleted), `chain.head_mismatch`,
    /// `chain.head_missing`; with a key, `chain.head_unsigned` (the head
    /// has no MAC), `chain.head_forged` (its MAC is not the key's: the
    /// head was rewritten, newest rows deleted with it) and
    /// `chain.key_unknown` (signed with another key: [`VerifyReport::signing_key`]).
    pub reason: Option<&'static str>,
    /// Whether the head's MAC was checked and holds: `None` when no key was
    /// given, or the log is empty.
    pub head_signed: Option<bool>,
    /// With `chain.key_unknown`: the id of the key the head was signed
    /// with ([`HeadKey::id`]), which the check needs.
    pub signing_key: Option<String>,
    /// The last seq removed by retention ([`SqliteStore::prune`]): the
    /// chain is checked from the record after it.
    pub pruned_through: Option<i64>,
}

/// What [`SqliteStore::prune`] removed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Pruned {
    /// Records removed.
    pub records: u64,
    /// The last seq removed: the chain now starts after it.
    pub through_seq: i64,
}

impl VerifyReport {
    /// Whether the whole log is intact.
    pub fn is_intact(&self) -> bool {
        self.first_broken_seq.is_none()
    }
}

/// The SQLite audit store. Thread-safe: one connection behind a mutex.
#[derive(Debug)]
pub struct SqliteStore {
    path: PathBuf,
    inner: Mutex<Inner>,
    /// The writes of every thread, grouped into transactions (`group.rs`).
    group: Group,
}

#[derive(Debug)]
struct Inner {
    conn: Connection,
    pending: Pending,
    /// The key of the head's MAC, when the store signs its head.
    key: Option<HeadKey>,
}

impl SqliteStore {
    /// Opens the database at `path`, creating it (mode 0600, with missing
    /// parent directories) and its schema when absent, and migrating an older
    /// schema. Refuses a schema newer than [`SCHEMA_VERSION`].
    pub fn open(path: &Path) -> Result<SqliteStore> {
        Self::open_with(path, Durability::Machine)
    }

    /// Opens (creating) the store with the given durability.
    pub fn open_with(path: &Path, durability: Durability) -> Result<SqliteStore> {
        if let Some(parent) = path.parent().filter(|p| !p.as_os_str().is_empty()) {
            std::fs::DirBuilder::new()
                .recursive(true)
                .mode(0o700)
                .create(parent)
                .map_err(Error::io("create dir", parent))?;
        }
        // Create the file ourselves so it is private from the start; SQLite
        // gives its -wal and -shm files the same permissions.
        //
        // Only a file that does not exist yet is opened here (O_EXCL), and
        // under OPENING: closing any descriptor of a file drops every POSIX
        // lock this process holds on it (fcntl(2), "the record locks are
        // lost"), including the locks of SQLite connections already open on
        // it, which SQLite cannot know about. A process whose WAL locks were
        // dropped that way lets another process, closing its connection,
        // believe it is the last one, checkpoint and delete the WAL under
        // it: "database disk image is malformed" (sqlite.org/howtocorrupt.html
        // 2.2; issue 32, a gateway and `run` sessions, or the console's
        // per-request opens, sharing one log). A new file has no
        // connection yet, and OPENING keeps another thread's open from
        // starting between our create and our close.
        let _opening = OPENING.lock().unwrap_or_else(|e| e.into_inner());
        match OpenOptions::new()
            .read(true)
            .write(true)
            .create_new(true)
            .mode(0o600)
            .open(path)
        {
            Ok(created) => drop(created),
            Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => {}
            Err(e) => return Err(Error::io("create", path)(e)),
        }
        let mut conn = Connection::open(path).map_err(Error::sqlite("open"))?;
        conn.busy_timeout(DEFAULT_BUSY_TIMEOUT)
            .map_err(Error::sqlite("set busy timeout"))?;
        let mode: String = conn
            .query_row("PRAGMA journal_mode=WAL", [], |r| r.get(0))
            .map_err(Error::sqlite("set journal mode"))?;
        let wal = mode.eq_ignore_ascii_case("wal");
        if !wal {
            tracing::warn!(path = %path.display(), mode, "audit database not in WAL mode; using its rollback journal with synchronous=FULL");
        }
        // NORMAL is only crash-safe for the process in WAL mode; anything
        // else gets FULL.
        let sync = if wal && durability == Durability::Process {
            "NORMAL"
        } else {
            "FULL"
        };
        conn.pragma_update(None, "synchronous", sync)
            .map_err(Error::sqlite("set synchronous"))?;
        migrate(&mut conn)?;
        Ok(SqliteStore {
            path: path.to_path_buf(),
            inner: Mutex::new(Inner {
                conn,
                pending: Pending::default(),
                key: None,
            }),
            group: Group::default(),
        })
    }

    /// Signs the chain head with `key` on every write from now on
    /// (anchor.rs), so that a rewritten head shows in
    /// [`SqliteStore::verify_with`].
    pub fn with_head_key(self, key: HeadKey) -> SqliteStore {
        self.lock().key = Some(key);
        self
    }

    /// The database file's path.
    pub fn path(&self) -> &Path {
        &self.path
    }

    fn lock(&self) -> MutexGuard<'_, Inner> {
        // A panic elsewhere while holding the lock leaves the connection
        // usable (every write is its own transaction): carry on.
        self.inner.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// How long a write waits for another process holding the write lock
    /// before failing (default 5 s).
    pub fn set_busy_timeout(&self, timeout: Duration) -> Result<()> {
        self.lock()
            .conn
            .busy_timeout(timeout)
            .map_err(Error::sqlite("set busy timeout"))
    }

    /// Appends one event durably and returns its seq. Errors are returned,
    /// not queued; [`Sink::record`] is the variant that never fails. Events
    /// queued by earlier failed `record` calls are written first.
    pub fn append(&self, mut event: Event) -> Result<i64> {
        if event.time_ms == 0 {
            event.time_ms = crate::now_ms();
        }
        let mut guard = self.lock();
        let inner = &mut *guard;
        write_queued(&mut inner.conn, &mut inner.pending, inner.key.as_ref())?;
        append_row(&mut inner.conn, &event, inner.key.as_ref())
    }

    /// Writes the events queued by failed `record` calls; returns how many
    /// are still queued (0 when all were written).
    pub fn flush(&self) -> Result<usize> {
        let mut guard = self.lock();
        let inner = &mut *guard;
        write_queued(&mut inner.conn, &mut inner.pending, inner.key.as_ref())?;
        Ok(inner.pending.len())
    }

    /// How many events wait in memory after failed writes.
    pub fn pending_len(&self) -> usize {
        self.lock().pending.len()
    }

    /// How many events were dropped because the in-memory queue was full.
    pub fn dropped_count(&self) -> u64 {
        self.lock().pending.dropped()
    }

    /// The events matching `query`, oldest first (by seq).
    pub fn query(&self, query: &Query) -> Result<Vec<Event>> {
        Ok(self
            .query_records(query)?
            .into_iter()
            .map(|r| r.event)
            .collect())
    }

    /// Like [`SqliteStore::query`], with each event's seq and hash.
    pub fn query_records(&self, query: &Query) -> Result<Vec<Record>> {
        let mut clauses: Vec<&str> = Vec::new();
        let mut args: Vec<SqlValue> = Vec::new();
        if let Some(server) = &query.server {
            clauses.push("server = ?");
            args.push(SqlValue::Text(server.clone()));
        }
        if let Some(tool) = &query.tool {
            clauses.push("tool = ?");
            args.push(SqlValue::Text(tool.clone()));
        }
        if let Some(decision) = query.decision {
            clauses.push("decision = ?");
            args.push(SqlValue::Text(decision.as_str().to_owned()));
        }
        if let Some(kind) = query.kind {
            clauses.push("kind = ?");
            args.push(SqlValue::Text(kind.as_str().to_owned()));
        }
        if let Some(since) = query.since_ms {
            clauses.push("time_ms >= ?");
            args.push(SqlValue::Integer(since));
        }
        if let Some(until) = query.until_ms {
            clauses.push("time_ms < ?");
            args.push(SqlValue::Integer(until));
        }
        let mut sql = format!("SELECT {SELECT_COLUMNS} FROM events");
        if !clauses.is_empty() {
            sql.push_str(" WHERE ");
            sql.push_str(&clauses.join(" AND "));
        }
        // With a limit, take the newest rows and turn them back to seq order.
        sql.push_str(" ORDER BY seq DESC");
        if let Some(limit) = query.limit {
            sql.push_str(" LIMIT ?");
            args.push(SqlValue::Integer(i64::try_from(limit).unwrap_or(i64::MAX)));
        }
        let guard = self.lock();
        let mut stmt = guard
            .conn
            .prepare(&sql)
            .map_err(Error::sqlite("prepare query"))?;
        let mut rows = stmt
            .query(rusqlite::params_from_iter(args))
            .map_err(Error::sqlite("run query"))?;
        let mut out = Vec::new();
        while let Some(row) = rows.next().map_err(Error::sqlite("read query row"))? {
            let (record, _prev) = decode_row(row)?;
            out.push(record);
        }
        out.reverse();
        Ok(out)
    }

    /// Retention: removes the oldest records, those older than
    /// `older_than_ms` (Unix ms) and, while the database holds more than
    /// `max_bytes` of records, the oldest until it does not (estimated from
    /// its pages in use: freed pages are reused, so the file stops growing
    /// rather than shrinking). Always a prefix of the chain: from the first
    /// record on, up to the last one that is old enough, so no record is
    /// removed from between two kept ones. The last record removed becomes
    /// the chain's base (`chain_base`, signed with the head's key), which
    /// [`SqliteStore::verify_with`] starts from. `None` when nothing was
    /// old enough.
    pub fn prune(
        &self,
        older_than_ms: Option<i64>,
        max_bytes: Option<u64>,
    ) -> Result<Option<Pruned>> {
        let mut guard = self.lock();
        let Inner { conn, key, .. } = &mut *guard;
        let tx = conn
            .transaction_with_behavior(TransactionBehavior::Immediate)
            .map_err(Error::sqlite("begin prune"))?;
        let range: Option<(i64, i64, i64)> = tx
            .query_row("SELECT MIN(seq), MAX(seq), COUNT(*) FROM events", [], |r| {
                Ok((
                    r.get::<_, Option<i64>>(0)?,
                    r.get::<_, Option<i64>>(1)?,
                    r.get(2)?,
                ))
            })
            .map(|(lo, hi, n)| lo.zip(hi).map(|(lo, hi)| (lo, hi, n)))
            .map_err(Error::sqlite("read the log's range"))?;
        let Some((first, last, count)) = range else {
            return Ok(None);
        };
        let mut through = first - 1;
        if let Some(cutoff) = older_than_ms {
            // the prefix up to (not including) the first record that is
            // new enough: a clock stepped back never removes a newer one
            let first_kept: Option<i64> = tx
                .query_row(
                    "SELECT MIN(seq) FROM events WHERE time_ms >= ?1",
                    [cutoff],
                    |r| r.get(0),
                )
                .map_err(Error::sqlite("find the records to keep"))?;
            through = through.max(first_kept.map_or(last, |s| s - 1));
        }
        if let Some(max) = max_bytes {
            let pragma = |name: &str| -> Result<i64> {
                tx.query_row(&format!("PRAGMA {name}"), [], |r| r.get(0))
                    .map_err(Error::sqlite("read the database's size"))
            };
            let used = (pragma("page_count")? - pragma("freelist_count")?) * pragma("page_size")?;
            let max = i64::try_from(max).unwrap_or(i64::MAX);
            if used > max && count > 0 {
                // the share of the records over the limit, one more for
                // the rounding; the oldest go
                let over = used - max;
                let remove = (i128::from(count) * i128::from(over) / i128::from(used)) as i64 + 1;
                through = through.max((first - 1 + remove).min(last));
            }
        }
        if through < first {
            return Ok(None);
        }
        let hash: String = tx
            .query_row("SELECT hash FROM events WHERE seq = ?1", [through], |r| {
                r.get(0)
            })
            .map_err(Error::sqlite("read the new base"))?;
        let removed = tx
            .execute("DELETE FROM events WHERE seq <= ?1", [through])
            .map_err(Error::sqlite("remove old records"))?;
        let mac = key.as_ref().map(|k| k.mac(through, &base_text(&hash)));
        tx.execute(
            "INSERT INTO chain_base (id, seq, hash, mac, pruned_ms) VALUES (1, ?1, ?2, ?3, ?4)
             ON CONFLICT (id) DO UPDATE SET seq = excluded.seq, hash = excluded.hash,
                 mac = excluded.mac, pruned_ms = excluded.pruned_ms",
            params![through, hash, mac, crate::now_ms()],
        )
        .map_err(Error::sqlite("write the chain base"))?;
        tx.commit().map_err(Error::sqlite("commit prune"))?;
        Ok(Some(Pruned {
            records: removed as u64,
            through_seq: through,
        }))
    }

    /// Walks the whole hash chain in seq order and reports the first break.
    /// The head's MAC is not checked: see [`SqliteStore::verify_with`].
    pub fn verify(&self) -> Result<VerifyReport> {
        self.verify_with(None)
    }

    /// [`SqliteStore::verify`], and with `key` the head's MAC too: a head
    /// rewritten after its newest rows were deleted (a valid chain again)
    /// is `chain.head_forged`, a head without a MAC `chain.head_unsigned`.
    pub fn verify_with(&self, key: Option<&HeadKey>) -> Result<VerifyReport> {
        let mut guard = self.lock();
        // One read transaction: a consistent snapshot even while other
        // processes append.
        let tx = guard
            .conn
            .transaction_with_behavior(TransactionBehavior::Deferred)
            .map_err(Error::sqlite("begin verify"))?;
        let mut report = VerifyReport {
            records: 0,
            head_hash: GENESIS.to_owned(),
            first_broken_seq: None,
            reason: None,
            head_signed: None,
            signing_key: None,
            pruned_through: None,
        };
        let mut expected_seq: i64 = 1;
        // After retention the chain starts from the last record removed.
        // Its row is signed like the head: one rewritten to hide more
        // removed records (or a base the key never signed) is caught.
        let base: Option<(i64, String, Option<String>)> = tx
            .query_row(
                "SELECT seq, hash, mac FROM chain_base WHERE id = 1",
                [],
                |r| Ok((r.get(0)?, r.get(1)?, r.get(2)?)),
            )
            .optional()
            .map_err(Error::sqlite("read chain base"))?;
        if let Some((seq, hash, mac)) = base {
            if let Some(k) = key {
                let found = mac.as_deref().map(|m| k.check(seq, &base_text(&hash), m));
                let names = ("chain.base_unsigned", "chain.base_forged");
                if let Some(r) = signature_problem(found, names, &mut report) {
                    report.first_broken_seq = Some(seq.max(1));
                    report.reason = Some(r);
                    return Ok(report);
                }
            }
            report.pruned_through = Some(seq);
            report.head_hash = hash;
            expected_seq = seq + 1;
        }
        {
            let mut stmt = tx
                .prepare(&format!("SELECT {SELECT_COLUMNS} FROM events ORDER BY seq"))
                .map_err(Error::sqlite("prepare verify"))?;
            let mut rows = stmt.query([]).map_err(Error::sqlite("run verify"))?;
            while let Some(row) = rows.next().map_err(Error::sqlite("read verify row"))? {
                let seq: i64 = row.get(0).map_err(Error::sqlite("read seq"))?;
                let mut brk = |at: i64, reason: &'static str| {
                    report.first_broken_seq = Some(at);
                    report.reason = Some(reason);
                };
                if seq != expected_seq {
                    brk(expected_seq.min(seq), "chain.seq_gap");
                    return Ok(report);
                }
                let (record, prev_hash) = match decode_row(row) {
                    Ok(decoded) => decoded,
                    Err(e) => {
                        tracing::warn!(seq, error = %e, "audit row cannot be decoded");
                        brk(seq, "chain.undecodable_row");
                        return Ok(report);
                    }
                };
                if prev_hash != report.head_hash {
                    brk(seq, "chain.prev_mismatch");
                    return Ok(report);
                }
                let json = record_json(seq, &record.event);
                if chain_hash(&prev_hash, &json) != record.hash {
                    brk(seq, "chain.hash_mismatch");
                    return Ok(report);
                }
                report.records += 1;
                report.head_hash = record.hash;
                expected_seq += 1;
            }
        }
        let last_seq = expected_seq - 1;
        let head: Option<(i64, String, Option<String>)> = tx
            .query_row(
                "SELECT seq, hash, mac FROM chain_head WHERE id = 1",
                [],
                |r| Ok((r.get(0)?, r.get(1)?, r.get(2)?)),
            )
            .optional()
            .map_err(Error::sqlite("read chain head"))?;
        match &head {
            None if last_seq > 0 => {
                report.first_broken_seq = Some(last_seq);
                report.reason = Some("chain.head_missing");
            }
            Some((seq, _, _)) if *seq > last_seq => {
                report.first_broken_seq = Some(last_seq + 1);
                report.reason = Some("chain.tail_missing");
            }
            Some((seq, hash, _)) if *seq != last_seq || *hash != report.head_hash => {
                report.first_broken_seq = Some((*seq).max(1));
                report.reason = Some("chain.head_mismatch");
            }
            Some((seq, hash, mac)) => {
                if let Some(k) = key.filter(|_| last_seq > 0) {
                    let found = mac.as_deref().map(|m| k.check(*seq, hash, m));
                    report.head_signed = Some(found == Some(crate::Signature::Valid));
                    let names = ("chain.head_unsigned", "chain.head_forged");
                    if let Some(r) = signature_problem(found, names, &mut report) {
                        // what follows the last row we have is what is gone
                        report.first_broken_seq = Some(seq + 1);
                        report.reason = Some(r);
                    }
                }
            }
            None => {}
        }
        Ok(report)
    }
}

impl SqliteStore {
    /// Writes one batch of the group (`group.rs`): every write in one
    /// transaction when nothing waits in memory from a failed write, else,
    /// or when that transaction fails (nothing of it written), each in
    /// turn as if alone: a record through the in-memory queue on an error,
    /// a commit after the queued records, refused with why on an error.
    fn write_batch(&self, batch: Batch) -> Answers {
        let mut guard = self.lock();
        let inner = &mut *guard;
        let conn = &mut inner.conn;
        let key = inner.key.as_ref();
        if inner.pending.len() == 0 {
            let events: Vec<&Event> = batch
                .iter()
                .map(|(_, w)| match w {
                    Write::Record(e) | Write::Commit(e) => e,
                })
                .collect();
            match append_refs(conn, &events, key) {
                Ok(_) => {
                    return batch
                        .into_iter()
                        .filter(|(_, w)| matches!(w, Write::Commit(_)))
                        .map(|(t, _)| (t, Ok(())))
                        .collect()
                }
                Err(e) if batch.len() > 1 => {
                    tracing::debug!(error = %e, "audit batch failed; writing its events one by one")
                }
                // alone: the same write again would fail the same way
                Err(e) => {
                    return match batch.into_iter().next() {
                        Some((t, Write::Commit(_))) => vec![(t, Err(self.unwritten(e)))],
                        Some((_, Write::Record(event))) => {
                            keep(&mut inner.pending, event, "sqlite", &e);
                            Vec::new()
                        }
                        None => Vec::new(),
                    };
                }
            }
        }
        let mut answers = Vec::new();
        for (ticket, write) in batch {
            match write {
                Write::Record(event) => write_through(&mut inner.pending, event, "sqlite", |e| {
                    append_row(conn, e, key).map(|_| ())
                }),
                Write::Commit(event) => {
                    let result = write_queued(conn, &mut inner.pending, key)
                        .and_then(|()| append_row(conn, &event, key).map(|_| ()));
                    answers.push((ticket, result.map_err(|e| self.unwritten(e))));
                }
            }
        }
        answers
    }

    fn unwritten(&self, e: Error) -> crate::Unwritten {
        let unwritten = crate::Unwritten::from(e);
        tracing::error!(path = %self.path.display(), "audit record not written: {unwritten}");
        unwritten
    }
}

/// Writes the records that failed earlier writes queued, oldest first, each
/// in its own transaction; stops at the first error (that record and the
/// rest stay queued).
fn write_queued(conn: &mut Connection, pending: &mut Pending, key: Option<&HeadKey>) -> Result<()> {
    while let Some(front) = pending.front() {
        append_row(conn, front, key)?;
        pending.pop_front();
    }
    Ok(())
}

impl Sink for SqliteStore {
    fn record(&self, mut event: Event) {
        if event.time_ms == 0 {
            event.time_ms = crate::now_ms();
        }
        self.group
            .submit(vec![Write::Record(event)], |b| self.write_batch(b));
    }

    /// In one transaction with whatever other threads write meanwhile
    /// (`group.rs`). If it fails nothing of it was written, and they go one
    /// by one as [`Sink::record`] takes them: whatever fails then is
    /// queued, in order.
    fn record_all(&self, mut events: Vec<Event>) {
        let now = crate::now_ms();
        for e in events.iter_mut().filter(|e| e.time_ms == 0) {
            e.time_ms = now;
        }
        let writes = events.into_iter().map(Write::Record).collect();
        self.group.submit(writes, |b| self.write_batch(b));
    }

    fn healthy(&self) -> bool {
        self.lock().pending.len() == 0
    }

    /// Like [`SqliteStore::append`] (the queued records first, then
    /// `event`), in one transaction with whatever other threads write
    /// meanwhile (`group.rs`); returns once that transaction committed. On
    /// an error `event` is not kept.
    fn commit(&self, mut event: Event) -> std::result::Result<(), crate::Unwritten> {
        if event.time_ms == 0 {
            event.time_ms = crate::now_ms();
        }
        // no answer for a commit means the batch that held it never
        // finished (the writing thread unwound): refused, never assumed
        // written (fail closed)
        self.group
            .submit(vec![Write::Commit(event)], |b| self.write_batch(b))
            .unwrap_or_else(|| {
                Err(crate::Unwritten {
                    cause: crate::Cause::Other,
                    detail: "the transaction holding this record did not finish".into(),
                })
            })
    }
}

/// Creates or migrates the schema, in one transaction.
fn migrate(conn: &mut Connection) -> Result<()> {
    // A current schema needs no write: read first, without the write
    // lock, so that a log another process holds locked, or on a full
    // disk, still opens, and a session on it refuses its calls with the
    // cause (`Sink::commit`) rather than failing to start.
    let current: Option<i64> = conn
        .query_row("SELECT version FROM schema_version WHERE id = 1", [], |r| {
            r.get(0)
        })
        .ok();
    match current {
        Some(v) if v == SCHEMA_VERSION => return Ok(()),
        Some(found) if found > SCHEMA_VERSION => {
            return Err(Error::SchemaTooNew {
                found,
                supported: SCHEMA_VERSION,
            })
        }
        _ => {}
    }
    let tx = conn
        .transaction_with_behavior(TransactionBehavior::Immediate)
        .map_err(Error::sqlite("begin migration"))?;
    tx.execute_batch(
        "CREATE TABLE IF NOT EXISTS schema_version (
            id         INTEGER PRIMARY KEY CHECK (id = 1),
            version    INTEGER NOT NULL,
            updated_ms INTEGER NOT NULL
         )",
    )
    .map_err(Error::sqlite("create schema_version"))?;
    let found: i64 = tx
        .query_row("SELECT version FROM schema_version WHERE id = 1", [], |r| {
            r.get(0)
        })
        .optional()
        .map_err(Error::sqlite("read schema version"))?
        .unwrap_or(0);
    if found > SCHEMA_VERSION {
        return Err(Error::SchemaTooNew {
            found,
            supported: SCHEMA_VERSION,
        });
    }
    if found == SCHEMA_VERSION {
        return Ok(());
    }
    let from = usize::try_from(found).map_err(|_| Error::Corrupt {
        seq: 0,
        what: format!("negative schema version {found}"),
    })?;
    for (step, sql) in MIGRATIONS.iter().enumerate().skip(from) {
        tracing::info!(
            from = step,
            to = step + 1,
            "migrating audit database schema"
        );
        tx.execute_batch(sql)
            .map_err(Error::sqlite("migrate schema"))?;
    }
    tx.execute(
        "INSERT INTO schema_version (id, version, updated_ms) VALUES (1, ?1, ?2)
         ON CONFLICT (id) DO UPDATE SET version = excluded.version, updated_ms = excluded.updated_ms",
        params![SCHEMA_VERSION, crate::now_ms()],
    )
    .map_err(Error::sqlite("write schema version"))?;
    tx.commit().map_err(Error::sqlite("commit migration"))
}

fn to_i64(v: u64) -> i64 {
    i64::try_from(v).unwrap_or(i64::MAX)
}

/// Appends one row and moves the chain head, in one IMMEDIATE transaction.
fn append_row(conn: &mut Connection, event: &Event, key: Option<&HeadKey>) -> Result<i64> {
    append_refs(conn, &[event], key)
}

/// Appends `events` in one transaction, chained in order; returns the seq
/// of the last (the head's, unchanged, when there are none).
fn append_refs(conn: &mut Connection, events: &[&Event], key: Option<&HeadKey>) -> Result<i64> {
    let tx = Immediate::begin(conn).map_err(Error::sqlite("begin insert"))?;
    // Statements are prepared once per connection and cached: parsing the
    // SQL again for every event was most of an audited call's cost.
    let (prev_seq, prev_hash): (i64, String) = tx
        .prepare_cached("SELECT seq, hash FROM chain_head WHERE id = 1")
        .and_then(|mut st| st.query_row([], |r| Ok((r.get(0)?, r.get(1)?))).optional())
        .map_err(Error::sqlite("read chain head"))?
        .unwrap_or((0, GENESIS.to_owned()));
    let (mut seq, mut prev_hash) = (prev_seq, prev_hash);
    for event in events {
        seq += 1;
        prev_hash = insert_row(&tx, seq, &prev_hash, event)?;
    }
    // signed in the same transaction as the rows, so that the head and
    // its MAC never disagree, whoever else writes
    let mac = key.map(|k| k.mac(seq, &prev_hash));
    tx.prepare_cached(
        "INSERT INTO chain_head (id, seq, hash, mac) VALUES (1, ?1, ?2, ?3)
         ON CONFLICT (id) DO UPDATE SET seq = excluded.seq, hash = excluded.hash, mac = excluded.mac",
    )
    .and_then(|mut st| st.execute(params![seq, prev_hash, mac]))
    .map_err(Error::sqlite("move chain head"))?;
    tx.commit().map_err(Error::sqlite("commit event"))?;
    Ok(seq)
}

/// `BEGIN IMMEDIATE` ... `COMMIT` through cached statements, for the writes
/// every audited call makes: rusqlite's `Transaction` parses both
/// statements again each time (`execute_batch`). Measured with callgrind
/// (`mcpbox serve`, one client, echo): 403,336 instructions per call
/// before, 399,126 after. Dropped without
/// [`Immediate::commit`] (an error on the way, or a failed commit), it
/// rolls back, as `Transaction` does.
struct Immediate<'c> {
    conn: &'c Connection,
    open: bool,
}

impl<'c> Immediate<'c> {
    fn begin(conn: &'c Connection) -> rusqlite::Result<Self> {
        conn.prepare_cached("BEGIN IMMEDIATE")?.execute([])?;
        Ok(Immediate { conn, open: true })
    }

    fn commit(mut self) -> rusqlite::Result<()> {
        self.conn.prepare_cached("COMMIT")?.execute([])?;
        self.open = false;
        Ok(())
    }
}

impl std::ops::Deref for Immediate<'_> {
    type Target = Connection;
    fn deref(&self) -> &Connection {
        self.conn
    }
}

impl Drop for Immediate<'_> {
    fn drop(&mut self) {
        // Only while a transaction is open: a COMMIT that failed may have
        // ended it already (SQLite rolls back on some errors itself).
        if self.open && !self.conn.is_autocommit() {
            if let Err(e) = self.conn.execute_batch("ROLLBACK") {
                tracing::warn!(error = %e, "rolling back an audit write");
            }
        }
    }
}

/// Inserts one row at `seq` after `prev_hash`; returns its hash.
fn insert_row(tx: &Connection, seq: i64, prev_hash: &str, event: &Event) -> Result<String> {
    // SQLite integers are signed: the counts are clamped in the hashed
    // record (`record_json`) as `to_i64` clamps them in the row.
    let detail_bytes = crate::canonical::canonical_bytes(&event.detail);
    let json = record_json_with(seq, event, &detail_bytes);
    let hash = chain_hash(prev_hash, &json);
    let files_written = serde_json::to_string(&event.files_written)?;
    // canonical JSON is whole UTF-8 strings and ASCII
    let detail = String::from_utf8_lossy(&detail_bytes);
    tx.prepare_cached(
        "INSERT INTO events (seq, time_ms, kind, sandbox_id, workspace_id, server, caller, tool,
            decision, reason, source, args_digest, result_bytes, exit_status, duration_ms,
            files_written, detail, prev_hash, hash)
         VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9, ?10, ?11, ?12, ?13, ?14, ?15, ?16, ?17, ?18, ?19)",
    )
    .and_then(|mut st| st.execute(params![
            seq,
            event.time_ms,
            event.kind.map(|k| k.as_str()),
            event.sandbox_id,
            event.workspace_id,
            event.server,
            event.caller,
            event.tool,
            event.decision.map(|d| d.as_str()),
            event.reason,
            event.source,
            event.args_digest,
            event.result_bytes.map(to_i64),
            event.exit_status,
            event.duration_ms.map(to_i64),
            files_written,
            detail,
            prev_hash,
            hash,
        ]))
    .map_err(Error::sqlite("insert event"))?;
    Ok(hash)
}

/// Turns a row selected with [`SELECT_COLUMNS`] back into a record and its
/// stored `prev_hash`.
fn decode_row(row: &rusqlite::Row<'_>) -> Result<(Record, String)> {
    let seq: i64 = row.get(0).map_err(Error::sqlite("read seq"))?;
    let corrupt = |what: String| Error::Corrupt { seq, what };
    let get_err = |e: rusqlite::Error| Error::Corrupt {
        seq,
        what: e.to_string(),
    };
    let kind: Option<String> = row.get(2).map_err(get_err)?;
    let decision: Option<String> = row.get(8).map_err(get_err)?;
    let result_bytes: Option<i64> = row.get(12).map_err(get_err)?;
    let duration_ms: Option<i64> = row.get(14).map_err(get_err)?;
    let files_written: String = row.get(15).map_err(get_err)?;
    let detail: String = row.get(16).map_err(get_err)?;
    let to_u64 = |v: Option<i64>, name: &str| {
        v.map(|v| u64::try_from(v).map_err(|_| corrupt(format!("negative {name}"))))
            .transpose()
    };
    let event = Event {
        time_ms: row.get(1).map_err(get_err)?,
        kind: kind
            .map(|k| k.parse())
            .transpose()
            .map_err(|e: Error| corrupt(e.to_string()))?,
        sandbox_id: row.get(3).map_err(get_err)?,
        workspace_id: row.get(4).map_err(get_err)?,
        server: row.get(5).map_err(get_err)?,
        caller: row.get(6).map_err(get_err)?,
        tool: row.get(7).map_err(get_err)?,
        decision: decision
            .map(|d| d.parse())
            .transpose()
            .map_err(|e: String| corrupt(e))?,
        reason: row.get(9).map_err(get_err)?,
        source: row.get(10).map_err(get_err)?,
        args_digest: row.get(11).map_err(get_err)?,
        result_bytes: to_u64(result_bytes, "result_bytes")?,
        exit_status: row.get(13).map_err(get_err)?,
        duration_ms: to_u64(duration_ms, "duration_ms")?,
        files_written: serde_json::from_str(&files_written)
            .map_err(|e| corrupt(format!("files_written: {e}")))?,
        detail: serde_json::from_str(&detail).map_err(|e| corrupt(format!("detail: {e}")))?,
    };
    let prev_hash: String = row.get(17).map_err(get_err)?;
    let hash: String = row.get(18).map_err(get_err)?;
    Ok((Record { seq, hash, event }, prev_hash))
}

/// What the base's MAC covers: its hash, marked as a base, so a head's MAC
/// (over the same seq and hash, when every record up to the head was
/// removed) can never pass for a base's, nor a base's for a head's.
fn base_text(hash: &str) -> String {
    format!("base:{hash}")
}

/// The reason a checked signature (the head's or the base's) fails, if it
/// does: `names` are the (unsigned, forged) reasons for that row; another
/// key's signature names that key in the report.
fn signature_problem(
    found: Option<crate::Signature>,
    names: (&'static str, &'static str),
    report: &mut VerifyReport,
) -> Option<&'static str> {
    match found {
        Some(crate::Signature::Valid) => None,
        None => Some(names.0),
        Some(crate::Signature::Forged) => Some(names.1),
        Some(crate::Signature::OtherKey(id)) => {
            report.signing_key = Some(id);
            Some("chain.key_unknown")
        }
    }
}
