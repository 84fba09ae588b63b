//! The audit stores under attack: crashes, edits, deletions, contention.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::os::unix::fs::PermissionsExt;
use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use mcpbox_audit::{Event, JsonlStore, Kind, Query, Sink, SqliteStore, Verdict, SCHEMA_VERSION};
use serde_json::json;

fn ev(n: i64, server: &str, tool: &str, decision: Verdict) -> Event {
    Event {
        time_ms: 1_000_000 + n * 1000,
        kind: Some(Kind::ToolCall),
        sandbox_id: "sb-1".into(),
        workspace_id: "ws-1".into(),
        server: server.into(),
        caller: "agent-a".into(),
        tool: Some(tool.into()),
        decision: Some(decision),
        reason: Some(format!("tool.{}_rule", decision.as_str())),
        source: Some("policy:tools.default".into()),
        args_digest: Some("ab".repeat(32)),
        result_bytes: Some(10 * n.unsigned_abs()),
        exit_status: None,
        duration_ms: Some(n.unsigned_abs()),
        files_written: vec![format!("out/{n}.txt")],
        detail: json!({"n": n, "nested": {"b": [1, 2.5, null], "a": "x"}}),
    }
}

fn fill(store: &SqliteStore, n: i64) {
    for i in 1..=n {
        store.record(ev(i, "fs", "read_file", Verdict::Allow));
    }
}

fn raw(path: &Path) -> rusqlite::Connection {
    rusqlite::Connection::open(path).unwrap()
}

/// Issue 7: the relay's audit writer hands over what queued in one
/// `record_all`. The rows must be the very rows one `record` each would
/// have written: same seqs, same chain, same hashes.
#[test]
fn record_all_writes_the_chain_record_by_record_would() {
    let dir = tempfile::tempdir().unwrap();
    let (one, all) = (dir.path().join("one.db"), dir.path().join("all.db"));
    let one = SqliteStore::open(&one).unwrap();
    let all = SqliteStore::open(&all).unwrap();
    fill(&one, 5);
    all.record(ev(1, "fs", "read_file", Verdict::Allow));
    all.record_all(
        (2..=4)
            .map(|i| ev(i, "fs", "read_file", Verdict::Allow))
            .collect(),
    );
    all.record_all(vec![ev(5, "fs", "read_file", Verdict::Allow)]);
    all.record_all(Vec::new());
    let (a, b) = (
        one.query_records(&Query::default()).unwrap(),
        all.query_records(&Query::default()).unwrap(),
    );
    assert_eq!(a, b);
    assert_eq!(b.iter().map(|r| r.seq).collect::<Vec<_>>(), [1, 2, 3, 4, 5]);
    let report = all.verify().unwrap();
    assert!(report.is_intact(), "{report:?}");
    assert_eq!(report.records, 5);
}

#[test]
fn records_survive_reopen() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("audit.db");
    {
        let store = SqliteStore::open(&path).unwrap();
        fill(&store, 3);
    }
    let store = SqliteStore::open(&path).unwrap();
    let events = store.query(&Query::default()).unwrap();
    assert_eq!(events.len(), 3);
    assert_eq!(events[0], ev(1, "fs", "read_file", Verdict::Allow));
    store.record(ev(4, "fs", "read_file", Verdict::Allow));
    let records = store.query_records(&Query::default()).unwrap();
    assert_eq!(
        records.iter().map(|r| r.seq).collect::<Vec<_>>(),
        [1, 2, 3, 4]
    );
    let report = store.verify().unwrap();
    assert!(report.is_intact(), "{report:?}");
    assert_eq!(report.records, 4);
    assert_eq!(report.head_hash, records[3].hash);
}

#[test]
fn every_field_round_trips_exactly() {
    let dir = tempfile::tempdir().unwrap();
    let store = SqliteStore::open(&dir.path().join("a.db")).unwrap();
    let mut e = ev(
        7,
        "srv\u{1b}[31m'; DROP TABLE events; --",
        "t\u{202e}x",
        Verdict::Approve,
    );
    e.kind = Some(Kind::ServerExit);
    e.exit_status = Some(-9);
    e.result_bytes = Some(u64::MAX); // clamped to i64::MAX by the store
    e.detail = json!({"z": 1, "a": {"y": "é", "x": [true, false]}, "big": u64::MAX});
    store.record(e.clone());
    store.record(Event::default());
    let back = store.query(&Query::default()).unwrap();
    e.result_bytes = Some(i64::MAX.unsigned_abs());
    assert_eq!(back[0], e);
    assert_eq!(back[1].kind, None);
    assert!(back[1].time_ms > 0, "zero time is filled by the store");
    assert!(store.verify().unwrap().is_intact());
}

/// When run as the child of `record_survives_sigkill_of_the_writing_process`,
/// records events, says so, and waits to be killed.
#[test]
fn crash_child_records_then_waits_for_sigkill() {
    let Ok(path) = std::env::var("MCPBOX_AUDIT_CRASH_CHILD_DB") else {
        return;
    };
    let durability = match std::env::var("MCPBOX_AUDIT_CRASH_CHILD_DURABILITY").as_deref() {
        Ok("process") => mcpbox_audit::Durability::Process,
        _ => mcpbox_audit::Durability::Machine,
    };
    let store = SqliteStore::open_with(Path::new(&path), durability).unwrap();
    fill(&store, 5);
    println!("recorded");
    // Killed here: no destructor, no checkpoint, no close.
    std::thread::sleep(Duration::from_secs(30));
    panic!("the parent should have killed this process");
}

#[test]
fn record_survives_sigkill_of_the_writing_process() {
    sigkill_after_records("machine");
}

#[test]
fn record_survives_sigkill_with_process_durability() {
    // The default: commits go to the write-ahead log without an fsync; a
    // killed process still loses nothing.
    sigkill_after_records("process");
}

fn sigkill_after_records(durability: &str) {
    use std::io::BufRead;
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("crash.db");
    let mut child = std::process::Command::new(std::env::current_exe().unwrap())
        .args([
            "--exact",
            "crash_child_records_then_waits_for_sigkill",
            "--nocapture",
            "--test-threads=1",
        ])
        .env("MCPBOX_AUDIT_CRASH_CHILD_DB", &path)
        .env("MCPBOX_AUDIT_CRASH_CHILD_DURABILITY", durability)
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::null())
        .spawn()
        .unwrap();
    let stdout = child.stdout.take().unwrap();
    let ready = std::io::BufReader::new(stdout)
        .lines()
        .map_while(Result::ok)
        .any(|l| l.contains("recorded"));
    child.kill().unwrap(); // SIGKILL
    let status = child.wait().unwrap();
    assert!(ready, "the child never reported its records");
    assert!(!status.success());
    let store = SqliteStore::open(&path).unwrap();
    assert_eq!(store.query(&Query::default()).unwrap().len(), 5);
    assert!(store.verify().unwrap().is_intact());
}

#[test]
fn edited_row_is_named_by_verify() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("a.db");
    let store = SqliteStore::open(&path).unwrap();
    fill(&store, 5);
    raw(&path)
        .execute(
            "UPDATE events SET decision = 'allow', server = 'other' WHERE seq = 3",
            [],
        )
        .unwrap();
    let report = store.verify().unwrap();
    assert_eq!(report.first_broken_seq, Some(3));
    assert_eq!(report.reason, Some("chain.hash_mismatch"));
    assert_eq!(report.records, 2);
}

#[test]
fn edit_with_correctly_recomputed_hash_breaks_the_next_link() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("a.db");
    let store = SqliteStore::open(&path).unwrap();
    fill(&store, 4);
    // The forger knows the algorithm: a twin log with the same first row and
    // a forged second row yields the hash the forged row 2 must carry.
    let forged = ev(2, "fs", "read_file", Verdict::Deny);
    let twin_path = dir.path().join("twin.db");
    let twin = SqliteStore::open(&twin_path).unwrap();
    twin.record(ev(1, "fs", "read_file", Verdict::Allow));
    twin.record(forged);
    let forged_hash = twin.query_records(&Query::default()).unwrap()[1]
        .hash
        .clone();
    raw(&path)
        .execute(
            "UPDATE events SET decision = 'deny', reason = 'tool.deny_rule', hash = ?1 WHERE seq = 2",
            [&forged_hash],
        )
        .unwrap();
    let report = store.verify().unwrap();
    assert_eq!(report.first_broken_seq, Some(3));
    assert_eq!(report.reason, Some("chain.prev_mismatch"));
    assert_eq!(report.records, 2);
}

#[test]
fn deleted_row_is_named_by_verify() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("a.db");
    let store = SqliteStore::open(&path).unwrap();
    fill(&store, 5);
    raw(&path)
        .execute("DELETE FROM events WHERE seq = 2", [])
        .unwrap();
    let report = store.verify().unwrap();
    assert_eq!(report.first_broken_seq, Some(2));
    assert_eq!(report.reason, Some("chain.seq_gap"));
}

#[test]
fn deleted_and_renumbered_rows_are_detected() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("a.db");
    let store = SqliteStore::open(&path).unwrap();
    fill(&store, 5);
    let conn = raw(&path);
    conn.execute("DELETE FROM events WHERE seq = 2", [])
        .unwrap();
    conn.execute("UPDATE events SET seq = seq - 1 WHERE seq > 2", [])
        .unwrap();
    let report = store.verify().unwrap();
    assert_eq!(report.first_broken_seq, Some(2));
    assert_eq!(report.reason, Some("chain.prev_mismatch"));
}

#[test]
fn deleted_newest_rows_are_detected() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("a.db");
    let store = SqliteStore::open(&path).unwrap();
    fill(&store, 5);
    raw(&path)
        .execute("DELETE FROM events WHERE seq >= 4", [])
        .unwrap();
    let report = store.verify().unwrap();
    assert_eq!(report.first_broken_seq, Some(4));
    assert_eq!(report.reason, Some("chain.tail_missing"));
}

#[test]
fn row_with_an_unknown_kind_is_named_by_verify_and_refused_by_query() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("a.db");
    let store = SqliteStore::open(&path).unwrap();
    fill(&store, 3);
    raw(&path)
        .execute("UPDATE events SET kind = 'bogus' WHERE seq = 2", [])
        .unwrap();
    let report = store.verify().unwrap();
    assert_eq!(report.first_broken_seq, Some(2));
    assert_eq!(report.reason, Some("chain.undecodable_row"));
    let err = store.query(&Query::default()).unwrap_err().to_string();
    assert!(err.contains("seq 2"), "{err}");
}

#[test]
fn empty_log_verifies() {
    let dir = tempfile::tempdir().unwrap();
    let store = SqliteStore::open(&dir.path().join("a.db")).unwrap();
    let report = store.verify().unwrap();
    assert!(report.is_intact());
    assert_eq!(report.records, 0);
}

#[test]
fn filters_select_exactly_the_matching_events() {
    let dir = tempfile::tempdir().unwrap();
    let store = SqliteStore::open(&dir.path().join("a.db")).unwrap();
    store.record(ev(1, "fs", "read_file", Verdict::Allow));
    store.record(ev(2, "fs", "write_file", Verdict::Deny));
    store.record(ev(3, "git", "git_log", Verdict::Allow));
    let mut net = ev(4, "fetch", "fetch", Verdict::Deny);
    net.kind = Some(Kind::Network);
    store.record(net);
    store.record(ev(5, "fs", "write_file", Verdict::Approve));

    let n = |q: Query| {
        store
            .query(&q)
            .unwrap()
            .iter()
            .map(|e| e.duration_ms.unwrap())
            .collect::<Vec<_>>()
    };
    assert_eq!(n(Query::default()), [1, 2, 3, 4, 5]);
    assert_eq!(
        n(Query {
            server: Some("fs".into()),
            ..Query::default()
        }),
        [1, 2, 5]
    );
    assert_eq!(
        n(Query {
            tool: Some("write_file".into()),
            ..Query::default()
        }),
        [2, 5]
    );
    assert_eq!(
        n(Query {
            decision: Some(Verdict::Deny),
            ..Query::default()
        }),
        [2, 4]
    );
    assert_eq!(
        n(Query {
            kind: Some(Kind::Network),
            ..Query::default()
        }),
        [4]
    );
    // ev(n) is at 1_000_000 + n*1000: since is inclusive, until exclusive.
    assert_eq!(
        n(Query {
            since_ms: Some(1_002_000),
            until_ms: Some(1_004_000),
            ..Query::default()
        }),
        [2, 3]
    );
    assert_eq!(
        n(Query {
            server: Some("fs".into()),
            decision: Some(Verdict::Deny),
            since_ms: Some(1_002_000),
            ..Query::default()
        }),
        [2]
    );
    assert_eq!(
        n(Query {
            limit: Some(2),
            ..Query::default()
        }),
        [4, 5]
    );
    assert_eq!(
        n(Query {
            limit: Some(0),
            ..Query::default()
        }),
        Vec::<u64>::new()
    );
    assert_eq!(
        n(Query {
            server: Some("fs' OR '1'='1".into()),
            ..Query::default()
        }),
        Vec::<u64>::new(),
        "filter values are bound, never spliced into SQL"
    );
}

#[test]
fn concurrent_records_from_threads_lose_nothing() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("a.db");
    let store = Arc::new(SqliteStore::open(&path).unwrap());
    let threads: Vec<_> = (0..4)
        .map(|t| {
            let store = Arc::clone(&store);
            std::thread::spawn(move || {
                for i in 0..25 {
                    store.record(ev(t * 100 + i, &format!("s{t}"), "x", Verdict::Allow));
                }
            })
        })
        .collect();
    for t in threads {
        t.join().unwrap();
    }
    let records = store.query_records(&Query::default()).unwrap();
    assert_eq!(records.len(), 100);
    assert!(records
        .iter()
        .enumerate()
        .all(|(i, r)| r.seq == i as i64 + 1));
    for t in 0..4 {
        let q = Query {
            server: Some(format!("s{t}")),
            ..Query::default()
        };
        assert_eq!(store.query(&q).unwrap().len(), 25);
    }
    assert!(store.verify().unwrap().is_intact());
    assert_eq!(store.pending_len(), 0);
}

#[test]
fn two_stores_on_one_file_keep_one_chain() {
    // Two handles stand in for two mcpbox processes sharing a database.
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("a.db");
    let a = Arc::new(SqliteStore::open(&path).unwrap());
    let b = Arc::new(SqliteStore::open(&path).unwrap());
    let handles: Vec<_> = [a.clone(), b.clone()]
        .into_iter()
        .enumerate()
        .map(|(n, s)| {
            std::thread::spawn(move || {
                for i in 0..20 {
                    s.record(ev(i, &format!("p{n}"), "x", Verdict::Allow));
                }
            })
        })
        .collect();
    for h in handles {
        h.join().unwrap();
    }
    assert_eq!(a.query(&Query::default()).unwrap().len(), 40);
    let report = b.verify().unwrap();
    assert!(report.is_intact(), "{report:?}");
    assert_eq!(report.records, 40);
}

#[test]
fn failed_write_is_kept_and_flushed_in_order() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("a.db");
    let store = SqliteStore::open(&path).unwrap();
    store.set_busy_timeout(Duration::from_millis(10)).unwrap();
    store.record(ev(1, "fs", "a", Verdict::Allow));

    // Another writer holds the write lock: the next record cannot commit.
    let mut blocker = raw(&path);
    let tx = blocker
        .transaction_with_behavior(rusqlite::TransactionBehavior::Exclusive)
        .unwrap();
    store.record(ev(2, "fs", "b", Verdict::Allow));
    store.record(ev(3, "fs", "c", Verdict::Allow));
    assert_eq!(store.pending_len(), 2);
    tx.rollback().unwrap();

    store.record(ev(4, "fs", "d", Verdict::Allow));
    assert_eq!(store.pending_len(), 0);
    let tools: Vec<String> = store
        .query(&Query::default())
        .unwrap()
        .into_iter()
        .map(|e| e.tool.unwrap())
        .collect();
    assert_eq!(tools, ["a", "b", "c", "d"]);
    assert!(store.verify().unwrap().is_intact());
    assert_eq!(store.dropped_count(), 0);
}

#[test]
fn schema_has_no_column_for_raw_arguments_or_results() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("a.db");
    SqliteStore::open(&path).unwrap();
    let conn = raw(&path);
    let mut stmt = conn
        .prepare("SELECT name FROM pragma_table_info('events')")
        .unwrap();
    let columns: Vec<String> = stmt
        .query_map([], |r| r.get(0))
        .unwrap()
        .map(Result::unwrap)
        .collect();
    assert_eq!(
        columns,
        [
            "seq",
            "time_ms",
            "kind",
            "sandbox_id",
            "workspace_id",
            "server",
            "caller",
            "tool",
            "decision",
            "reason",
            "source",
            "args_digest",
            "result_bytes",
            "exit_status",
            "duration_ms",
            "files_written",
            "detail",
            "prev_hash",
            "hash"
        ]
    );
    for forbidden in [
        "args",
        "arguments",
        "params",
        "result",
        "output",
        "prompt",
        "secret",
        "content",
    ] {
        assert!(!columns.iter().any(|c| c == forbidden), "{forbidden}");
    }
    let version: i64 = conn
        .query_row("SELECT version FROM schema_version", [], |r| r.get(0))
        .unwrap();
    assert_eq!(version, SCHEMA_VERSION);
    let mode: String = conn
        .query_row("PRAGMA journal_mode", [], |r| r.get(0))
        .unwrap();
    assert_eq!(mode, "wal");
}

#[test]
fn database_from_a_newer_mcpbox_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("a.db");
    SqliteStore::open(&path).unwrap();
    raw(&path)
        .execute("UPDATE schema_version SET version = version + 1", [])
        .unwrap();
    let err = SqliteStore::open(&path).unwrap_err().to_string();
    assert!(err.contains("newer"), "{err}");
}

#[test]
fn database_is_private_and_parents_are_created() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("deep/er/audit.db");
    let store = SqliteStore::open(&path).unwrap();
    store.record(Event::default());
    let mode = std::fs::metadata(&path).unwrap().permissions().mode() & 0o777;
    assert_eq!(mode, 0o600);
}

#[test]
fn jsonl_store_appends_one_synced_line_per_event() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("sub/audit.jsonl");
    {
        let store = JsonlStore::open(&path).unwrap();
        store.record(ev(1, "fs", "a\nb", Verdict::Deny));
        store.record(ev(2, "fs", "c", Verdict::Allow));
    }
    let store = JsonlStore::open(&path).unwrap();
    store.record(ev(3, "fs", "d", Verdict::Allow));
    assert_eq!(store.pending_len(), 0);
    let text = std::fs::read_to_string(&path).unwrap();
    let events: Vec<Event> = text
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    assert_eq!(events.len(), 3);
    assert_eq!(events[0], ev(1, "fs", "a\nb", Verdict::Deny));
    assert_eq!(events[2].tool.as_deref(), Some("d"));
    let mode = std::fs::metadata(&path).unwrap().permissions().mode() & 0o777;
    assert_eq!(mode, 0o600);
}

// ---- the signed head: truncation with the head rewritten ---------------------

fn keyed(path: &Path) -> (SqliteStore, mcpbox_audit::HeadKey) {
    let store = SqliteStore::open(path)
        .unwrap()
        .with_head_key(mcpbox_audit::HeadKey::from_bytes(&[42; 32]));
    (store, mcpbox_audit::HeadKey::from_bytes(&[42; 32]))
}

#[test]
fn a_truncated_tail_with_the_head_rewritten_is_caught_by_the_signed_head() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("a.db");
    let (store, key) = keyed(&path);
    fill(&store, 5);
    let intact = store.verify_with(Some(&key)).unwrap();
    assert!(intact.is_intact(), "{intact:?}");
    assert_eq!(intact.head_signed, Some(true));
    // the casual editor: delete the newest two, point the head at seq 3
    let conn = raw(&path);
    conn.execute("DELETE FROM events WHERE seq >= 4", [])
        .unwrap();
    let hash3: String = conn
        .query_row("SELECT hash FROM events WHERE seq = 3", [], |r| r.get(0))
        .unwrap();
    conn.execute(
        "UPDATE chain_head SET seq = 3, hash = ?1 WHERE id = 1",
        [&hash3],
    )
    .unwrap();
    // the chain alone is whole again; the head's MAC is not
    assert!(store.verify().unwrap().is_intact());
    let r = store.verify_with(Some(&key)).unwrap();
    assert_eq!(r.reason, Some("chain.head_forged"), "{r:?}");
    assert_eq!(r.first_broken_seq, Some(4));
    assert_eq!(r.records, 3);
    // nor can the editor drop the MAC
    conn.execute("UPDATE chain_head SET mac = NULL WHERE id = 1", [])
        .unwrap();
    let r = store.verify_with(Some(&key)).unwrap();
    assert_eq!(r.reason, Some("chain.head_unsigned"), "{r:?}");
    // another key is no key, and says whose signature it is
    let other = mcpbox_audit::HeadKey::from_bytes(&[1; 32]);
    fill(&store, 1);
    assert!(store.verify_with(Some(&key)).unwrap().is_intact());
    let r = store.verify_with(Some(&other)).unwrap();
    assert_eq!(r.reason, Some("chain.key_unknown"));
    assert_eq!(r.signing_key, Some(key.id()));
    assert!(!r.is_intact());
}

#[test]
fn edited_deleted_and_reordered_rows_are_named_by_seq_with_a_signed_head() {
    let dir = tempfile::tempdir().unwrap();
    for (attack, sql, seq, reason) in [
        (
            "edited",
            "UPDATE events SET server = 'other' WHERE seq = 3",
            3,
            "chain.hash_mismatch",
        ),
        (
            "deleted middle",
            "DELETE FROM events WHERE seq = 2",
            2,
            "chain.seq_gap",
        ),
        (
            "reordered pair",
            "UPDATE events SET seq = CASE seq WHEN 2 THEN 3 ELSE 2 END WHERE seq IN (2, 3)",
            2,
            "chain.prev_mismatch",
        ),
    ] {
        let path = dir.path().join(format!("{}.db", attack.replace(' ', "-")));
        let (store, key) = keyed(&path);
        fill(&store, 5);
        let conn = raw(&path);
        // a reordering through a temporary seq, as the primary key needs
        if attack == "reordered pair" {
            conn.execute_batch(
                "UPDATE events SET seq = -2 WHERE seq = 2;
                 UPDATE events SET seq = 2 WHERE seq = 3;
                 UPDATE events SET seq = 3 WHERE seq = -2;",
            )
            .unwrap();
        } else {
            conn.execute(sql, []).unwrap();
        }
        let r = store.verify_with(Some(&key)).unwrap();
        assert_eq!(r.first_broken_seq, Some(seq), "{attack}: {r:?}");
        assert_eq!(r.reason, Some(reason), "{attack}: {r:?}");
    }
}

#[test]
fn a_database_of_schema_1_is_migrated_and_signed_from_its_next_write() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("a.db");
    {
        let store = SqliteStore::open(&path).unwrap();
        fill(&store, 2);
    }
    // as an older mcpbox left it: no mac column, schema version 1
    let conn = raw(&path);
    conn.execute_batch(
        "ALTER TABLE chain_head DROP COLUMN mac; UPDATE schema_version SET version = 1;",
    )
    .unwrap();
    drop(conn);
    let (store, key) = keyed(&path);
    assert_eq!(
        store.verify_with(Some(&key)).unwrap().reason,
        Some("chain.head_unsigned")
    );
    fill(&store, 1);
    let r = store.verify_with(Some(&key)).unwrap();
    assert!(r.is_intact(), "{r:?}");
    assert_eq!(r.records, 3);
}

#[test]
fn retention_by_age_removes_a_prefix_and_the_chain_verifies_from_its_signed_base() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("a.db");
    let (store, key) = keyed(&path);
    fill(&store, 10); // times 1_001_000 .. 1_010_000
    let pruned = store.prune(Some(1_004_500), None).unwrap().unwrap();
    assert_eq!((pruned.records, pruned.through_seq), (4, 4));
    let r = store.verify_with(Some(&key)).unwrap();
    assert!(r.is_intact(), "{r:?}");
    assert_eq!((r.records, r.pruned_through), (6, Some(4)));
    // nothing more is old enough: nothing happens
    assert_eq!(store.prune(Some(1_004_500), None).unwrap(), None);
    // new records chain on as before
    store.record(ev(11, "fs", "read_file", Verdict::Allow));
    assert!(store.verify_with(Some(&key)).unwrap().is_intact());
    let seqs: Vec<i64> = store
        .query_records(&Query::default())
        .unwrap()
        .iter()
        .map(|r| r.seq)
        .collect();
    assert_eq!(seqs, (5..=11).collect::<Vec<_>>());
}

#[test]
fn a_clock_stepped_back_never_lets_retention_remove_a_newer_record() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("a.db");
    let (store, key) = keyed(&path);
    fill(&store, 3);
    // seq 4 is new, seq 5 carries an old time (a clock stepped back)
    store.record(ev(50, "fs", "read_file", Verdict::Allow));
    store.record(ev(1, "fs", "read_file", Verdict::Allow));
    let pruned = store.prune(Some(1_040_000), None).unwrap().unwrap();
    assert_eq!(
        pruned.through_seq, 3,
        "only the prefix before the first new record"
    );
    assert!(store.verify_with(Some(&key)).unwrap().is_intact());
}

#[test]
fn retention_by_size_removes_the_oldest_until_the_log_fits() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("a.db");
    let (store, key) = keyed(&path);
    fill(&store, 400);
    let pruned = store.prune(None, Some(64 * 1024)).unwrap().unwrap();
    assert!(pruned.records > 0 && pruned.records < 400, "{pruned:?}");
    assert_eq!(pruned.through_seq, pruned.records as i64);
    let r = store.verify_with(Some(&key)).unwrap();
    assert!(r.is_intact(), "{r:?}");
    assert_eq!(r.records, 400 - pruned.records);
}

/// A keyed log of ten records whose retention removed seq 1 to 3 (the
/// base is seq 3); its database path.
fn pruned_through_three(dir: &Path) -> (std::path::PathBuf, SqliteStore, mcpbox_audit::HeadKey) {
    let path = dir.join("a.db");
    let (store, key) = keyed(&path);
    fill(&store, 10);
    let pruned = store.prune(Some(1_003_500), None).unwrap().unwrap();
    assert_eq!(pruned.through_seq, 3);
    (path, store, key)
}

#[test]
fn more_records_removed_behind_retentions_back_are_caught() {
    let dir = tempfile::tempdir().unwrap();
    let (path, store, key) = pruned_through_three(dir.path());
    // the editor removes two more of the oldest, leaving the base alone
    let conn = raw(&path);
    conn.execute("DELETE FROM events WHERE seq <= 5", [])
        .unwrap();
    let r = store.verify_with(Some(&key)).unwrap();
    assert_eq!(r.reason, Some("chain.seq_gap"), "{r:?}");
    assert_eq!(r.first_broken_seq, Some(4));
}

#[test]
fn a_base_rewritten_to_hide_more_removed_records_is_caught_by_its_signature() {
    let dir = tempfile::tempdir().unwrap();
    let (path, store, key) = pruned_through_three(dir.path());
    // the editor removes seq 4 and 5 and points the base at seq 5, whose
    // hash the next record names: the chain alone is whole again
    let conn = raw(&path);
    let hash5: String = conn
        .query_row("SELECT hash FROM events WHERE seq = 5", [], |r| r.get(0))
        .unwrap();
    conn.execute("DELETE FROM events WHERE seq <= 5", [])
        .unwrap();
    conn.execute(
        "UPDATE chain_base SET seq = 5, hash = ?1 WHERE id = 1",
        [&hash5],
    )
    .unwrap();
    assert!(store.verify().unwrap().is_intact(), "without the key");
    let r = store.verify_with(Some(&key)).unwrap();
    assert_eq!(r.reason, Some("chain.base_forged"), "{r:?}");
    assert_eq!(r.first_broken_seq, Some(5));
    // a base with its MAC removed is unsigned
    conn.execute("UPDATE chain_base SET mac = NULL WHERE id = 1", [])
        .unwrap();
    let r = store.verify_with(Some(&key)).unwrap();
    assert_eq!(r.reason, Some("chain.base_unsigned"), "{r:?}");
}

#[test]
fn a_heads_signature_cannot_pass_for_a_bases() {
    // retention that removed every record: the base's seq and hash are the
    // head's, yet the head's MAC copied onto the base must not verify
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("a.db");
    let (store, key) = keyed(&path);
    fill(&store, 3);
    store.prune(Some(i64::MAX), None).unwrap().unwrap();
    assert!(store.verify_with(Some(&key)).unwrap().is_intact());
    let conn = raw(&path);
    let head_mac: String = conn
        .query_row("SELECT mac FROM chain_head WHERE id = 1", [], |r| r.get(0))
        .unwrap();
    conn.execute("UPDATE chain_base SET mac = ?1 WHERE id = 1", [&head_mac])
        .unwrap();
    let r = store.verify_with(Some(&key)).unwrap();
    assert_eq!(r.reason, Some("chain.base_forged"), "{r:?}");
}

/// When run as the child of the lock test below: another process that
/// opens the log, reads it and closes it, as a `run` session ending does.
/// Prints the number of records and the integrity check's answer.
#[test]
fn peek_child_reads_and_closes() {
    let Ok(path) = std::env::var("MCPBOX_AUDIT_PEEK_DB") else {
        return;
    };
    let conn = raw(Path::new(&path));
    let n: i64 = conn
        .query_row("SELECT COUNT(*) FROM events", [], |r| r.get(0))
        .unwrap();
    let check: String = conn
        .query_row("PRAGMA integrity_check", [], |r| r.get(0))
        .unwrap();
    println!("peek {n} {check}");
    drop(conn);
}

/// What the peek child saw.
fn peek(path: &Path) -> String {
    let out = std::process::Command::new(std::env::current_exe().unwrap())
        .args([
            "--exact",
            "peek_child_reads_and_closes",
            "--nocapture",
            "--test-threads=1",
        ])
        .env("MCPBOX_AUDIT_PEEK_DB", path)
        .stderr(std::process::Stdio::null())
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&out.stdout);
    text.lines()
        .find_map(|l| {
            l.split_once("... peek ")
                .map(|(_, v)| v)
                .or(l.strip_prefix("peek "))
        })
        .unwrap_or_else(|| panic!("the peek child said nothing: {text}"))
        .to_string()
}

/// Issue 32 ("database disk image is malformed" with a gateway and `run`
/// sessions on one log): opening a second store on a file closed a
/// descriptor of it, and close(2) drops every POSIX lock the process holds
/// on the file, the first store's WAL locks included. Another process that
/// then closed its connection believed it was the last, checkpointed and
/// deleted the WAL under the first store: its next records were lost.
#[test]
fn opening_a_second_store_keeps_the_first_ones_locks_so_no_record_is_lost() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("shared.db");
    let first = SqliteStore::open_with(&path, mcpbox_audit::Durability::Process).unwrap();
    fill(&first, 3);
    // the console's per-request open, or a second server's store
    let second = SqliteStore::open_with(&path, mcpbox_audit::Durability::Process).unwrap();
    assert_eq!(peek(&path), "3 ok");
    assert!(
        dir.path().join("shared.db-wal").exists(),
        "another process's close took the WAL while this one had it open"
    );
    first.record(ev(4, "fs", "read_file", Verdict::Allow));
    second.record(ev(5, "fs", "read_file", Verdict::Allow));
    assert_eq!(peek(&path), "5 ok");
    drop((first, second));
    let store = SqliteStore::open(&path).unwrap();
    assert_eq!(store.query(&Query::default()).unwrap().len(), 5);
    assert!(store.verify().unwrap().is_intact());
}

#[test]
fn a_commit_the_log_cannot_take_says_why_and_keeps_nothing_of_it() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("audit.db");
    let store = SqliteStore::open(&path).unwrap();
    store.set_busy_timeout(Duration::from_millis(50)).unwrap();
    store.commit(ev(1, "fs", "a", Verdict::Allow)).unwrap();
    // another process holds the write lock past the busy timeout
    let mut other = raw(&path);
    let tx = other
        .transaction_with_behavior(rusqlite::TransactionBehavior::Immediate)
        .unwrap();
    let err = store.commit(ev(2, "fs", "b", Verdict::Allow)).unwrap_err();
    assert_eq!(err.cause, mcpbox_audit::Cause::Locked, "{err}");
    assert!(
        err.to_string().starts_with("locked by another process"),
        "{err}"
    );
    // the caller decides what becomes of it: nothing waits in memory
    assert_eq!(store.pending_len(), 0);
    // what `record` queued meanwhile goes first once the log takes writes
    store.record(ev(3, "fs", "c", Verdict::Deny));
    assert_eq!(store.pending_len(), 1);
    drop(tx);
    store.commit(ev(4, "fs", "d", Verdict::Allow)).unwrap();
    let tools: Vec<String> = store
        .query(&Query::default())
        .unwrap()
        .into_iter()
        .filter_map(|e| e.tool)
        .collect();
    assert_eq!(tools, ["a", "c", "d"]);
    assert!(store.verify().unwrap().is_intact());
}

#[test]
fn commits_and_records_of_many_threads_share_transactions_and_keep_one_chain() {
    // serve's sessions write to one store at once: grouped into
    // transactions, every commit answered Ok only once written, each
    // thread's records in its order, one intact chain
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("audit.db");
    let store = Arc::new(SqliteStore::open_with(&path, mcpbox_audit::Durability::Process).unwrap());
    let threads: Vec<_> = (0..8)
        .map(|t| {
            let store = store.clone();
            std::thread::spawn(move || {
                for n in 0..40 {
                    let server = format!("s{t}");
                    store
                        .commit(ev(n, &server, &format!("c{n}"), Verdict::Allow))
                        .unwrap();
                    store.record_all(vec![
                        ev(n, &server, &format!("r{n}a"), Verdict::Allow),
                        ev(n, &server, &format!("r{n}b"), Verdict::Deny),
                    ]);
                }
            })
        })
        .collect();
    for t in threads {
        t.join().unwrap();
    }
    let all = store.query(&Query::default()).unwrap();
    assert_eq!(all.len(), 8 * 40 * 3);
    for t in 0..8 {
        let tools: Vec<String> = all
            .iter()
            .filter(|e| e.server == format!("s{t}"))
            .filter_map(|e| e.tool.clone())
            .collect();
        let want: Vec<String> = (0..40)
            .flat_map(|n| [format!("c{n}"), format!("r{n}a"), format!("r{n}b")])
            .collect();
        assert_eq!(tools, want, "thread {t}'s records in its order");
    }
    assert!(store.verify().unwrap().is_intact());
    assert!(store.healthy());
}

#[test]
fn a_full_disk_and_a_broken_file_are_named_as_such() {
    use mcpbox_audit::{Cause, Error};
    let sqlite = |code| Error::Sqlite {
        step: "commit event",
        source: rusqlite::Error::SqliteFailure(rusqlite::ffi::Error::new(code), None),
    };
    assert_eq!(
        Cause::from(&sqlite(rusqlite::ffi::SQLITE_FULL)),
        Cause::DiskFull
    );
    assert_eq!(
        Cause::from(&sqlite(rusqlite::ffi::SQLITE_CORRUPT)),
        Cause::Broken
    );
    assert_eq!(
        Cause::from(&sqlite(rusqlite::ffi::SQLITE_NOTADB)),
        Cause::Broken
    );
    assert_eq!(
        Cause::from(&sqlite(rusqlite::ffi::SQLITE_BUSY)),
        Cause::Locked
    );
    assert_eq!(
        Cause::from(&sqlite(rusqlite::ffi::SQLITE_READONLY)),
        Cause::ReadOnly
    );
    let io = Error::Io {
        step: "append",
        path: "/x".into(),
        source: std::io::Error::from_raw_os_error(28),
    };
    assert_eq!(Cause::from(&io), Cause::DiskFull);
    let unwritten = mcpbox_audit::Unwritten::from(sqlite(rusqlite::ffi::SQLITE_FULL));
    assert!(
        unwritten.to_string().starts_with("disk full: "),
        "{unwritten}"
    );
}
