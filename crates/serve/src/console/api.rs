//! The console's JSON API, behind the checks of `http.rs`.
//!
//! ```text
//! GET  /api/info                            mode, what the pages can show
//! GET  /api/approvals[?since=VERSION]       {version, now_ms, approvals}; with
//!                                           since = the current version, a long
//!                                           poll: answers when the table changes,
//!                                           or after 25 s
//! POST /api/approvals/ID/approve            {"scope": "once" | "session"}
//! POST /api/approvals/ID/deny
//! GET  /api/sandboxes                       {available, why, sandboxes}
//! POST /api/sandboxes/ID/pause|resume|destroy
//! GET  /api/audit?db=&kind=&server=&tool=&decision=&since=&before=&limit=
//!                                           records, newest first
//! GET  /api/audit/verify?db=                the hash chain's status
//! GET  /api/pins                            every server's pins and changes
//! POST /api/pins/accept|reject              {"id": "POLICY/STEM"}
//! ```
//!
//! Everything that may block (the broker's wait, the lifecycle, SQLite,
//! the pin files) runs on the runtime's blocking pool.

// A refusal is the response itself, built once per request.
#![allow(clippy::result_large_err)]

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use http_body_util::Full;
use hyper::{Response, StatusCode};
use mcpbox_gateway::broker::{AnswerError, Scope};
use serde_json::{json, Value};

use super::http::{error, json_response, Console};

type Resp = Response<Full<Bytes>>;

/// How long a long poll waits for a change.
const POLL: Duration = Duration::from_secs(25);
/// Audit records per page, by default and at most.
const AUDIT_PAGE: usize = 100;
const AUDIT_MAX: usize = 500;

/// Runs `f` on the blocking pool.
async fn blocking<T: Send + 'static>(f: impl FnOnce() -> T + Send + 'static) -> Option<T> {
    tokio::task::spawn_blocking(f).await.ok()
}

fn internal() -> Resp {
    error(
        StatusCode::INTERNAL_SERVER_ERROR,
        "the console failed (see mcpbox's log)",
    )
}

pub async fn get(c: &Arc<Console>, seg: &[String], q: &HashMap<String, String>) -> Resp {
    let seg: Vec<&str> = seg.iter().map(String::as_str).collect();
    match seg.as_slice() {
        ["info"] => info(c),
        ["approvals"] => approvals(c, q).await,
        ["sandboxes"] => sandboxes(c).await,
        ["audit"] => audit(c, q).await,
        ["audit", "verify"] => verify(c, q).await,
        ["pins"] => {
            let dir = c.parts.state_dir.clone();
            match blocking(move || super::pins::list(&dir)).await {
                Some(p) => json_response(StatusCode::OK, &json!({ "servers": p })),
                None => internal(),
            }
        }
        _ => error(StatusCode::NOT_FOUND, "no such API"),
    }
}

pub async fn post(c: &Arc<Console>, seg: &[String], body: Value) -> Resp {
    let seg: Vec<&str> = seg.iter().map(String::as_str).collect();
    match seg.as_slice() {
        ["approvals", id, "approve"] => {
            let scope = match body.get("scope").and_then(Value::as_str) {
                Some("once") => Scope::Once,
                Some("session") => Scope::Session,
                _ => {
                    return error(
                        StatusCode::BAD_REQUEST,
                        r#"the body must be {"scope": "once"} or {"scope": "session"}"#,
                    )
                }
            };
            answer(c, id, true, scope).await
        }
        ["approvals", id, "deny"] => answer(c, id, false, Scope::Once).await,
        ["sandboxes", id, "pause"] => sandbox_op(c, id.to_string(), "pause").await,
        ["sandboxes", id, "resume"] => sandbox_op(c, id.to_string(), "resume").await,
        ["sandboxes", id, "destroy"] => sandbox_op(c, id.to_string(), "destroy").await,
        ["pins", op @ ("accept" | "reject")] => {
            let Some(id) = body.get("id").and_then(Value::as_str).map(str::to_string) else {
                return error(
                    StatusCode::BAD_REQUEST,
                    r#"the body must be {"id": "...", "tool": "..." (optional)}"#,
                );
            };
            let tool = body.get("tool").and_then(Value::as_str).map(str::to_string);
            let accept = *op == "accept";
            let c2 = c.clone();
            let done = blocking(move || {
                let (policy, decided) =
                    super::pins::decide(&c2.parts.state_dir, &id, tool.as_deref(), accept)?;
                if let Err(e) = audit_pins(&c2, &policy, &decided, accept) {
                    // the pin files are consistent either way
                    tracing::warn!("console: the pins were updated but not audited: {e:#}");
                }
                Ok::<_, String>(decided.len())
            })
            .await;
            match done {
                Some(Ok(n)) => json_response(StatusCode::OK, &json!({"ok": true, "decided": n})),
                Some(Err(e)) => error(StatusCode::CONFLICT, e),
                None => internal(),
            }
        }
        _ => error(StatusCode::NOT_FOUND, "no such API"),
    }
}

/// One `pin_change` record per decision, in the audit log of the pins'
/// policy, as `mcpbox pin accept|reject` writes them (source `console`).
fn audit_pins(
    c: &Console,
    policy: &str,
    decided: &[mcpbox_gateway::pin_review::PendingChange],
    accepted: bool,
) -> anyhow::Result<()> {
    let path = c
        .parts
        .pin_audit
        .iter()
        .find(|(name, _)| name == policy)
        .map(|(_, p)| p.clone())
        .or_else(|| c.parts.audit_dbs.first().cloned())
        .ok_or_else(|| anyhow::anyhow!("no audit log for policy {policy}"))?;
    let key = mcpbox_audit::HeadKey::load_or_create(&c.parts.state_dir.join("audit.key"))?;
    // several writers may share a log: each row is its own transaction
    let store = mcpbox_audit::SqliteStore::open(&path)?.with_head_key(key);
    for change in decided {
        let mut e = mcpbox_gateway::pin_review::change_event(change, accepted, "console");
        e.server = policy.to_string();
        store.append(e)?;
    }
    Ok(())
}

fn info(c: &Console) -> Resp {
    json_response(
        StatusCode::OK,
        &json!({
            "mode": c.parts.mode,
            "sandboxes": c.parts.control.is_some(),
            "audit_dbs": c.parts.audit_dbs.iter().map(|p| p.display().to_string()).collect::<Vec<_>>(),
        }),
    )
}

async fn approvals(c: &Arc<Console>, q: &HashMap<String, String>) -> Resp {
    let broker = c.parts.broker.clone();
    let since = match q.get("since").map(|s| s.parse::<u64>()) {
        None => None,
        Some(Ok(v)) => Some(v),
        Some(Err(_)) => return error(StatusCode::BAD_REQUEST, "since: not a version number"),
    };
    if let Some(seen) = since {
        if broker.version() == seen {
            // a bounded number wait at once; the others are answered now
            // and poll again
            if let Ok(permit) = c.polls.try_acquire() {
                let b = broker.clone();
                let _ = blocking(move || b.wait_changed(seen, POLL)).await;
                drop(permit);
            } else {
                tokio::time::sleep(Duration::from_secs(1)).await;
            }
        }
    }
    let b = broker.clone();
    let Some((version, list)) = blocking(move || {
        // the version first: a change between the two shows next time
        let v = b.version();
        (v, b.list())
    })
    .await
    else {
        return internal();
    };
    json_response(
        StatusCode::OK,
        &json!({
            "version": version,
            "now_ms": mcpbox_audit::now_ms(),
            "approvals": list,
        }),
    )
}

async fn answer(c: &Console, id: &str, approve: bool, scope: Scope) -> Resp {
    // the answer is audited (a SQLite write) before it is delivered
    let (broker, id) = (c.parts.broker.clone(), id.to_string());
    let Some(done) = blocking(move || broker.answer(&id, approve, scope, "console")).await else {
        return internal();
    };
    match done {
        Ok(v) => json_response(StatusCode::OK, &json!({ "approval": v })),
        Err(e @ AnswerError::Malformed(_)) => error(StatusCode::BAD_REQUEST, e),
        Err(e @ AnswerError::Unknown(_)) => error(StatusCode::NOT_FOUND, e),
        Err(e @ AnswerError::AlreadyApproved(_)) => error(StatusCode::CONFLICT, e),
    }
}

async fn sandboxes(c: &Arc<Console>) -> Resp {
    let Some(control) = c.parts.control.clone() else {
        return json_response(
            StatusCode::OK,
            &json!({
                "available": false,
                "why": mcpbox_lifecycle::NO_SANDBOXES,
                "sandboxes": [],
            }),
        );
    };
    match blocking(move || control.list()).await {
        Some(list) => json_response(
            StatusCode::OK,
            &json!({ "available": true, "sandboxes": list }),
        ),
        None => internal(),
    }
}

async fn sandbox_op(c: &Arc<Console>, id: String, op: &'static str) -> Resp {
    let Some(control) = c.parts.control.clone() else {
        return error(StatusCode::CONFLICT, mcpbox_lifecycle::NO_SANDBOXES);
    };
    let done = blocking(move || match op {
        "pause" => control.pause(&id).map(|i| json!({ "sandbox": i })),
        "resume" => control.resume(&id).map(|i| json!({ "sandbox": i })),
        // as `mcpbox sandboxes destroy` without --allow-large: artifacts
        // over the limit keep the workspace
        _ => control
            .destroy(&id, &mcpbox_lifecycle::artifacts::Approved::new())
            .map(|t| json!({ "teardown": t })),
    })
    .await;
    match done {
        Some(Ok(v)) => json_response(StatusCode::OK, &v),
        Some(Err(e)) => error(StatusCode::CONFLICT, e),
        None => internal(),
    }
}

/// The audit database the request names (`db`: its index in
/// [`super::Parts::audit_dbs`], default 0).
fn audit_db(c: &Console, q: &HashMap<String, String>) -> Result<std::path::PathBuf, Resp> {
    let i = match q.get("db").map(|s| s.parse::<usize>()) {
        None => 0,
        Some(Ok(i)) => i,
        Some(Err(_)) => return Err(error(StatusCode::BAD_REQUEST, "db: not an index")),
    };
    c.parts
        .audit_dbs
        .get(i)
        .cloned()
        .ok_or_else(|| error(StatusCode::NOT_FOUND, "no such audit database"))
}

async fn audit(c: &Arc<Console>, q: &HashMap<String, String>) -> Resp {
    let path = match audit_db(c, q) {
        Ok(p) => p,
        Err(r) => return r,
    };
    let now = mcpbox_audit::now_ms();
    let text = |k: &str| q.get(k).filter(|v| !v.is_empty()).cloned();
    let mut query = mcpbox_audit::Query {
        server: text("server"),
        tool: text("tool"),
        limit: Some(
            q.get("limit")
                .and_then(|l| l.parse().ok())
                .unwrap_or(AUDIT_PAGE)
                .clamp(1, AUDIT_MAX),
        ),
        ..Default::default()
    };
    if let Some(k) = text("kind") {
        match k.parse() {
            Ok(k) => query.kind = Some(k),
            Err(e) => return error(StatusCode::BAD_REQUEST, format!("kind: {e}")),
        }
    }
    if let Some(d) = text("decision") {
        match d.parse() {
            Ok(d) => query.decision = Some(d),
            Err(e) => return error(StatusCode::BAD_REQUEST, format!("decision: {e}")),
        }
    }
    if let Some(s) = text("since") {
        match mcpbox_audit::parse_time(&s, now) {
            Ok(t) => query.since_ms = Some(t),
            Err(e) => return error(StatusCode::BAD_REQUEST, format!("since: {e}")),
        }
    }
    // the next page: records strictly older than the oldest shown
    if let Some(b) = text("before") {
        match b.parse::<i64>() {
            Ok(t) => query.until_ms = Some(t),
            Err(_) => return error(StatusCode::BAD_REQUEST, "before: not a time in ms"),
        }
    }
    let shown = path.display().to_string();
    let done = blocking(move || -> Result<Vec<Value>, String> {
        if !path.exists() {
            return Ok(Vec::new());
        }
        let store = mcpbox_audit::SqliteStore::open(&path).map_err(|e| e.to_string())?;
        let mut records = store.query_records(&query).map_err(|e| e.to_string())?;
        records.reverse();
        Ok(records
            .into_iter()
            .map(|r| json!({"seq": r.seq, "hash": r.hash, "event": r.event}))
            .collect())
    })
    .await;
    match done {
        Some(Ok(records)) => {
            json_response(StatusCode::OK, &json!({ "db": shown, "records": records }))
        }
        Some(Err(e)) => error(StatusCode::INTERNAL_SERVER_ERROR, format!("{shown}: {e}")),
        None => internal(),
    }
}

/// `mcpbox audit --verify`, as data.
async fn verify(c: &Arc<Console>, q: &HashMap<String, String>) -> Resp {
    let path = match audit_db(c, q) {
        Ok(p) => p,
        Err(r) => return r,
    };
    let key_path = c.parts.state_dir.join("audit.key");
    let shown = path.display().to_string();
    let done = blocking(move || -> Result<Value, String> {
        if !path.exists() {
            return Ok(json!({"status": "empty", "records": 0}));
        }
        // the key is read, never made here
        let key = match mcpbox_audit::HeadKey::load(&key_path) {
            Ok(k) => Some(k),
            Err(_) if !key_path.exists() => None,
            Err(e) => return Err(e.to_string()),
        };
        let store = mcpbox_audit::SqliteStore::open(&path).map_err(|e| e.to_string())?;
        let r = store.verify_with(key.as_ref()).map_err(|e| e.to_string())?;
        Ok(json!({
            "status": if r.is_intact() { "intact" } else { "broken" },
            "records": r.records,
            "head_hash": r.head_hash,
            "first_broken_seq": r.first_broken_seq,
            "reason": r.reason,
            "head_signed": r.head_signed,
            "key": key.is_some(),
            "pruned_through": r.pruned_through,
        }))
    })
    .await;
    match done {
        Some(Ok(mut v)) => {
            if let Some(o) = v.as_object_mut() {
                o.insert("db".into(), Value::String(shown));
            }
            json_response(StatusCode::OK, &v)
        }
        Some(Err(e)) => error(StatusCode::INTERNAL_SERVER_ERROR, format!("{shown}: {e}")),
        None => internal(),
    }
}
