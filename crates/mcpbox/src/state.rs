//! Where mcpbox keeps its state (audit log, tool pins), and ids.

use std::io::Read;
use std::path::PathBuf;
use std::sync::Arc;

use anyhow::Context;
use mcpbox_audit::SqliteStore;
use mcpbox_policy::Policy;

/// `$MCPBOX_STATE_DIR`, else `$XDG_STATE_HOME/mcpbox`, else
/// `$HOME/.local/state/mcpbox`, else `/var/lib/mcpbox`.
pub fn state_dir() -> PathBuf {
    let var = |k: &str| {
        std::env::var_os(k)
            .filter(|v| !v.is_empty())
            .map(PathBuf::from)
    };
    if let Some(d) = var("MCPBOX_STATE_DIR") {
        return d;
    }
    if let Some(d) = var("XDG_STATE_HOME") {
        return d.join("mcpbox");
    }
    if let Some(h) = var("HOME") {
        return h.join(".local/state/mcpbox");
    }
    PathBuf::from("/var/lib/mcpbox")
}

/// The audit database for `policy`: its `[audit] path`, else the state dir's.
pub fn audit_path(policy: &Policy) -> PathBuf {
    policy
        .audit
        .path
        .clone()
        .unwrap_or_else(|| state_dir().join("audit.db"))
}

/// Opens (creating) the audit store of `policy`, with its durability, and
/// applies its retention.
pub fn open_audit(policy: &Policy) -> anyhow::Result<Arc<SqliteStore>> {
    let store = open_store(policy)?;
    retain(&store, &policy.audit);
    Ok(Arc::new(store))
}

/// `mcpbox audit --prune`: opens the policy's log and applies its
/// retention, saying what went (a failure is an error here, not a warning).
pub fn prune_audit(policy: &Policy) -> anyhow::Result<Option<mcpbox_audit::Pruned>> {
    let store = open_store(policy)?;
    retained(&store, &policy.audit)
        .with_context(|| format!("pruning {}", audit_path(policy).display()))
}

/// The policy's audit store, with its durability and the head's key.
fn open_store(policy: &Policy) -> anyhow::Result<SqliteStore> {
    let path = audit_path(policy);
    let durability = match policy.audit.durability {
        mcpbox_policy::Durability::Process => mcpbox_audit::Durability::Process,
        mcpbox_policy::Durability::Machine => mcpbox_audit::Durability::Machine,
    };
    let store = SqliteStore::open_with(&path, durability).with_context(|| {
        format!(
            "opening the audit log {} (nothing was started; if the file is damaged, move it \
             aside and keep it for inspection, and the next run starts a new log: mcpbox \
             never recreates one itself)",
            path.display()
        )
    })?;
    Ok(store.with_head_key(audit_key()?))
}

/// The policy's retention (`[audit] keep`, `max_size`), applied as a
/// session opens the log (and by [`keep_retaining`] while it stays open);
/// what it removed is itself a record. A failure is logged, never fatal:
/// retention must not stop a session that the log can still record.
fn retain(store: &SqliteStore, audit: &mcpbox_policy::Audit) {
    if let Err(e) = retained(store, audit) {
        tracing::warn!("audit retention: {e}");
    }
}

/// [`retain`], saying what it removed.
fn retained(
    store: &SqliteStore,
    audit: &mcpbox_policy::Audit,
) -> anyhow::Result<Option<mcpbox_audit::Pruned>> {
    if !audit.retains() {
        return Ok(None);
    }
    let keep_ms = audit
        .keep
        .map(|d| i64::try_from(d.as_millis()).unwrap_or(i64::MAX));
    let older_than = keep_ms.map(|k| mcpbox_audit::now_ms().saturating_sub(k));
    let pruned = store.prune(older_than, audit.max_size)?;
    if let Some(p) = &pruned {
        use mcpbox_audit::Sink;
        store.record(mcpbox_audit::Event {
            kind: Some(mcpbox_audit::Kind::Retention),
            detail: serde_json::json!({
                "records": p.records,
                "through_seq": p.through_seq,
                "older_than_ms": older_than,
                "max_bytes": audit.max_size,
            }),
            ..mcpbox_audit::Event::default()
        });
    }
    Ok(pruned)
}

/// Applies the policy's retention again and again while a long-lived
/// process (`run`, `serve`) holds the log open, not only as it opened it:
/// every half of `keep`, between a second and ten minutes (ten minutes for
/// a size alone). A thread of its own, so never for `exec`, which forks
/// its sandbox itself and must stay single-threaded; nothing to do without
/// a retention.
pub fn keep_retaining(store: &Arc<SqliteStore>, audit: &mcpbox_policy::Audit) {
    if !audit.retains() {
        return;
    }
    let every = audit.keep.map_or(RETAIN_MAX, |k| {
        (k / 2).clamp(std::time::Duration::from_secs(1), RETAIN_MAX)
    });
    let store = Arc::downgrade(store);
    let audit = audit.clone();
    let spawned = std::thread::Builder::new()
        .name("audit-retention".into())
        .spawn(move || loop {
            std::thread::sleep(every);
            // the log closed (its last holder gone): nothing left to keep
            let Some(store) = store.upgrade() else { return };
            retain(&store, &audit);
        });
    if let Err(e) = spawned {
        tracing::warn!("audit retention is applied only as sessions open the log: {e}");
    }
}

/// The longest wait between two retentions of an open log.
const RETAIN_MAX: std::time::Duration = std::time::Duration::from_secs(600);

/// Where the key of the audit log's signed head is kept: in the state
/// directory, beside nothing the sandbox sees, whatever `[audit] path` says.
pub fn audit_key_path() -> PathBuf {
    state_dir().join("audit.key")
}

/// The key that signs every audit log's head (created on first use, 0600):
/// with it `mcpbox audit --verify` catches a log whose newest records were
/// deleted and whose head was rewritten to match.
fn audit_key() -> anyhow::Result<mcpbox_audit::HeadKey> {
    let path = audit_key_path();
    mcpbox_audit::HeadKey::load_or_create(&path)
        .with_context(|| format!("the audit log's key {}", path.display()))
}

/// Opens (creating) the state directory's audit store, for records that
/// belong to no one policy (the HTTP gateway's refused requests).
pub fn open_default_audit() -> anyhow::Result<Arc<SqliteStore>> {
    let path = state_dir().join("audit.db");
    let store = SqliteStore::open_with(&path, mcpbox_audit::Durability::Process)
        .with_context(|| format!("opening the audit log {}", path.display()))?;
    Ok(Arc::new(store.with_head_key(audit_key()?)))
}

/// A fresh random id (12 hex digits) for a sandbox.
pub fn new_id() -> String {
    let mut bytes = [0u8; 6];
    let filled = std::fs::File::open("/dev/urandom").and_then(|mut f| f.read_exact(&mut bytes));
    if filled.is_err() {
        let t = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|d| d.as_nanos())
            .unwrap_or(0);
        bytes.copy_from_slice(&(t as u64 ^ u64::from(std::process::id())).to_le_bytes()[..6]);
    }
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

/// The workspace's id: a stable digest of the host directories it exposes
/// (input, output, mounts), so records of the same workspace group
/// together across sandboxes. 12 hex digits of FNV-1a; an id, not a secret.
pub fn workspace_id(spec: &mcpbox_sandbox::Spec) -> String {
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    let mut feed = |bytes: &[u8]| {
        for b in bytes.iter().chain(b"\0") {
            h ^= u64::from(*b);
            h = h.wrapping_mul(0x0100_0000_01b3);
        }
    };
    use std::os::unix::ffi::OsStrExt;
    for p in spec
        .input
        .iter()
        .chain(spec.output.iter())
        .chain(spec.mounts.iter().map(|m| &m.host))
    {
        feed(p.as_os_str().as_bytes());
    }
    format!("{:012x}", h & 0xffff_ffff_ffff)
}
