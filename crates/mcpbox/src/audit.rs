//! `mcpbox audit`: read the audit log back, filtered.

use std::path::PathBuf;
use std::process::ExitCode;

use mcpbox_audit::{format_table, now_ms, parse_time, to_json_line, Query, SqliteStore};

/// Filters and output options of `mcpbox audit`.
#[derive(Debug, clap::Args)]
pub struct Args {
    /// Audit database (default: the state directory's audit.db, or the policy's `[audit]` path).
    #[arg(long)]
    pub db: Option<PathBuf>,
    /// Take the database path from this policy's `[audit]` section.
    #[arg(long)]
    pub policy: Option<PathBuf>,
    /// Only this server.
    #[arg(long)]
    pub server: Option<String>,
    /// Only this tool.
    #[arg(long)]
    pub tool: Option<String>,
    /// Only this decision: allow, deny or approve.
    #[arg(long)]
    pub decision: Option<String>,
    /// Only this kind of event (session_start, tool_call, network, ...).
    #[arg(long)]
    pub kind: Option<String>,
    /// From this time: 2026-11-29T10:00:00Z, 2026-11-29, or relative like -1h.
    /// (`--since -1h` as written: a value may start with a hyphen.)
    #[arg(long, allow_hyphen_values = true)]
    pub since: Option<String>,
    /// Until this time (same forms).
    #[arg(long, allow_hyphen_values = true)]
    pub until: Option<String>,
    /// At most this many (the newest).
    #[arg(long)]
    pub limit: Option<usize>,
    /// JSON Lines instead of a table.
    #[arg(long)]
    pub json: bool,
    /// OCSF 1.5.0 events as JSON Lines, for a SIEM: tool calls as API
    /// Activity (6003), connections as Network Activity (4001); other
    /// kinds are left out.
    #[arg(long, conflicts_with = "json")]
    pub ocsf: bool,
    /// Check the hash chain instead of listing; exit 1 when it is broken.
    /// The head's MAC is checked with the state directory's audit.key (or
    /// --key); without a key the check is incomplete and exits 3, unless
    /// --no-key.
    #[arg(long)]
    pub verify: bool,
    /// With --verify: check the chain alone, without the head's signature
    /// (a deleted tail with a rewritten head would not show), and exit 0
    /// when it is intact. For a log whose key is not at hand.
    #[arg(long, requires = "verify", conflicts_with = "key")]
    pub no_key: bool,
    /// Apply the policy's retention (`[audit] keep`, `max_size`) now, as a
    /// session opening the log would, and say what it removed; needs
    /// --policy. The removal is itself a record, and --verify then checks
    /// the chain from the new base.
    #[arg(long, requires = "policy", conflicts_with_all = ["verify", "json", "ocsf"])]
    pub prune: bool,
    /// The key that signed the log's head (default: the state directory's
    /// audit.key), for a log verified where it was not written.
    #[arg(long)]
    pub key: Option<PathBuf>,
}

/// `--prune`: the policy's retention on its log (or `--db`), now.
fn prune(args: &Args) -> ExitCode {
    let Some(policy) = &args.policy else {
        return fail("--prune needs --policy (the retention is the policy's)");
    };
    let mut loaded = match crate::preflight::load(Some(policy)) {
        Ok(l) => l,
        Err(e) => return fail(e),
    };
    if !loaded.policy.audit.retains() {
        return fail(format!(
            "{} sets no retention ([audit] keep or max_size): nothing would be removed",
            policy.display()
        ));
    }
    if let Some(db) = &args.db {
        loaded.policy.audit.path = Some(db.clone());
    }
    let path = crate::state::audit_path(&loaded.policy);
    if !path.exists() {
        return fail(format!("no audit log at {}", path.display()));
    }
    match crate::state::prune_audit(&loaded.policy) {
        Ok(Some(p)) => {
            println!(
                "{}: removed {} records (through seq {}); the chain now starts after them",
                path.display(),
                p.records,
                p.through_seq
            );
            ExitCode::SUCCESS
        }
        Ok(None) => {
            println!("{}: nothing is past the retention", path.display());
            ExitCode::SUCCESS
        }
        Err(e) => fail(format!("{e:#}")),
    }
}

fn fail(msg: impl std::fmt::Display) -> ExitCode {
    eprintln!("mcpbox: {msg}");
    ExitCode::from(2)
}

pub fn run(args: Args) -> ExitCode {
    if args.prune {
        return prune(&args);
    }
    let path = match (&args.db, &args.policy) {
        (Some(db), _) => db.clone(),
        (None, Some(p)) => match crate::preflight::load(Some(p)) {
            Ok(l) => crate::state::audit_path(&l.policy),
            Err(e) => return fail(e),
        },
        (None, None) => crate::state::state_dir().join("audit.db"),
    };
    if !path.exists() {
        return fail(format!(
            "no audit log at {} (nothing recorded yet, or pass --db)",
            path.display()
        ));
    }
    let store = match SqliteStore::open(&path) {
        Ok(s) => s,
        Err(e) => return fail(format!("{}: {e}", path.display())),
    };
    if args.verify {
        // the key is read, never made here: a verify creates nothing
        let key_path = args
            .key
            .clone()
            .unwrap_or_else(crate::state::audit_key_path);
        let key = if args.no_key {
            None
        } else {
            match mcpbox_audit::HeadKey::load(&key_path) {
                Ok(k) => Some(k),
                Err(_) if args.key.is_none() && !key_path.exists() => None,
                Err(e) => return fail(e),
            }
        };
        return match store.verify_with(key.as_ref()) {
            Ok(r) if r.first_broken_seq.is_none() => {
                // a chain whose head could not be checked is not verified:
                // its newest records may be gone with the head rewritten
                // to match, so a script must not read "verified" (exit 3)
                let unchecked = key.is_none() && r.records > 0 && !args.no_key;
                let signed = match r.head_signed {
                    Some(true) => "its head signed".to_string(),
                    _ if args.no_key => "its head not checked (--no-key)".to_string(),
                    _ if key.is_none() && r.records > 0 => format!(
                        "its head NOT checked: no key at {} (a deleted tail with a rewritten head would not show); pass --key FILE, the audit.key of the state directory the log was written from, or --no-key to accept the chain alone",
                        key_path.display()
                    ),
                    _ => "empty".to_string(),
                };
                let pruned = match r.pruned_through {
                    Some(seq) => {
                        format!(", from seq {} on (retention removed 1 to {seq})", seq + 1)
                    }
                    None => String::new(),
                };
                if unchecked {
                    println!(
                        "unverified: the chain of {} records{pruned} is intact, head {}, {signed}",
                        r.records, r.head_hash
                    );
                    return ExitCode::from(3);
                }
                println!(
                    "intact: {} records{pruned}, head {}, {signed}",
                    r.records, r.head_hash
                );
                ExitCode::SUCCESS
            }
            Ok(r) => {
                println!(
                    "BROKEN at seq {} ({}); {} records intact before it{}",
                    r.first_broken_seq.unwrap_or(0),
                    r.reason.unwrap_or("unknown"),
                    r.records,
                    match r.reason {
                        Some("chain.head_forged") => ": the head was rewritten (records from this seq on were deleted)".to_string(),
                        Some("chain.head_unsigned") => ": the head has no MAC (written by an mcpbox before signed heads, or stripped)".to_string(),
                        Some("chain.base_forged") => ": the retention base was rewritten (more old records were deleted than retention removed)".to_string(),
                        Some("chain.base_unsigned") => ": the retention base has no MAC (stripped, or written without the key)".to_string(),
                        Some("chain.key_unknown") => format!(
                            ": the head is signed with another key (id {}) than {}; verify with --key and that key's file (the state directory's audit.key where the log was written)",
                            r.signing_key.as_deref().unwrap_or("?"),
                            key_path.display()
                        ),
                        _ => String::new(),
                    }
                );
                ExitCode::from(1)
            }
            Err(e) => fail(e),
        };
    }
    let now = now_ms();
    let time = |s: &Option<String>| s.as_deref().map(|t| parse_time(t, now)).transpose();
    let (since, until) = match (time(&args.since), time(&args.until)) {
        (Ok(a), Ok(b)) => (a, b),
        (Err(e), _) | (_, Err(e)) => return fail(e),
    };
    let decision = match args.decision.as_deref().map(str::parse).transpose() {
        Ok(d) => d,
        Err(e) => return fail(format!("--decision: {e}")),
    };
    let kind = match args.kind.as_deref().map(str::parse).transpose() {
        Ok(k) => k,
        Err(e) => return fail(format!("--kind: {e}")),
    };
    let query = Query {
        server: args.server,
        tool: args.tool,
        decision,
        kind,
        since_ms: since,
        until_ms: until,
        limit: args.limit,
    };
    if args.ocsf {
        return match store.query_records(&query) {
            Ok(records) => {
                for r in &records {
                    if let Some(v) = mcpbox_audit::to_ocsf(&r.event, Some(r.seq)) {
                        println!("{v}");
                    }
                }
                ExitCode::SUCCESS
            }
            Err(e) => fail(e),
        };
    }
    match store.query(&query) {
        Ok(events) => {
            if args.json {
                for e in &events {
                    println!("{}", to_json_line(e));
                }
            } else {
                let table = format_table(&events);
                print!("{table}");
                if !table.ends_with('\n') {
                    println!();
                }
            }
            ExitCode::SUCCESS
        }
        Err(e) => fail(e),
    }
}
