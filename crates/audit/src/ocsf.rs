//! The audit log as OCSF events (Open Cybersecurity Schema Framework 1.5.0,
//! https://schema.ocsf.io), for a SIEM: a `tool_call` is an API Activity
//! (class 6003), a `network` record a Network Activity (class 4001). Other
//! kinds have no class of their own here and are not exported.
//!
//! What mcpbox knows that OCSF has no attribute for (sandbox and workspace
//! ids, the decision's reason and source, the argument digest, the files
//! written, the calls a connection belongs to) goes under `unmapped`, as
//! the schema intends. As everywhere in the audit: never an argument, a
//! result or a secret.

use serde_json::{json, Map, Value};

use crate::{Event, Kind, Verdict};

/// The OCSF version the events are written against.
pub const OCSF_VERSION: &str = "1.5.0";

/// `Severity ID`: informational for an allowed event, low for one that
/// waited for a human, medium for a refusal.
fn severity(e: &Event) -> (u8, &'static str) {
    match e.decision {
        Some(Verdict::Deny) => (3, "Medium"),
        Some(Verdict::Approve) => (2, "Low"),
        _ => (1, "Informational"),
    }
}

fn metadata(e: &Event, seq: Option<i64>) -> Value {
    let mut m = json!({
        "version": OCSF_VERSION,
        "product": {"name": "mcpbox", "vendor_name": "mcpbox", "version": env!("CARGO_PKG_VERSION")},
        "log_name": "mcpbox audit",
    });
    if let Some(s) = seq {
        m["uid"] = json!(s.to_string());
    }
    if !e.sandbox_id.is_empty() {
        m["correlation_uid"] = json!(e.sandbox_id);
    }
    m
}

/// What OCSF has no attribute for.
fn unmapped(e: &Event) -> Value {
    let mut u = Map::new();
    let mut put = |k: &str, v: Value| {
        if !v.is_null() {
            u.insert(k.into(), v);
        }
    };
    put("sandbox_id", json!(e.sandbox_id));
    put("workspace_id", json!(e.workspace_id));
    put("decision", json!(e.decision.map(|d| d.as_str())));
    put("reason", json!(e.reason));
    put("source", json!(e.source));
    put("args_digest", json!(e.args_digest));
    put("result_bytes", json!(e.result_bytes));
    put("exit_status", json!(e.exit_status));
    if !e.files_written.is_empty() {
        put("files_written", json!(e.files_written));
    }
    if !e.detail.is_null() {
        put("detail", e.detail.clone());
    }
    Value::Object(u)
}

/// The attributes every exported class has.
struct Class {
    uid: u32,
    name: &'static str,
    category_uid: u32,
    category_name: &'static str,
    activity_id: u32,
    activity_name: &'static str,
}

/// An event of `class` for `e`: what every class has, in one place.
fn base(e: &Event, seq: Option<i64>, class: &Class) -> Map<String, Value> {
    let (sev, sev_name) = severity(e);
    let (status_id, status) = if e.decision == Some(Verdict::Deny) {
        (2, "Failure")
    } else {
        (1, "Success")
    };
    let mut v = Map::new();
    let mut put = |k: &str, x: Value| {
        v.insert(k.into(), x);
    };
    put("class_uid", json!(class.uid));
    put("class_name", json!(class.name));
    put("category_uid", json!(class.category_uid));
    put("category_name", json!(class.category_name));
    put("activity_id", json!(class.activity_id));
    put("activity_name", json!(class.activity_name));
    put("type_uid", json!(class.uid * 100 + class.activity_id));
    put(
        "type_name",
        json!(format!("{}: {}", class.name, class.activity_name)),
    );
    put("time", json!(e.time_ms));
    put("severity_id", json!(sev));
    put("severity", json!(sev_name));
    put("status_id", json!(status_id));
    put("status", json!(status));
    put("metadata", metadata(e, seq));
    put("unmapped", unmapped(e));
    if let Some(r) = &e.reason {
        put("status_detail", json!(r));
    }
    if let Some(d) = e.duration_ms {
        put("duration", json!(d));
    }
    v
}

/// One record as an OCSF event; None for a kind without a class here.
/// `seq` is its place in the log, as `metadata.uid`.
pub fn to_ocsf(e: &Event, seq: Option<i64>) -> Option<Value> {
    let refused = e.decision == Some(Verdict::Deny);
    match e.kind? {
        Kind::ToolCall => {
            // 99: Other (an MCP tools/call is none of create, read, update, delete)
            let class = Class {
                uid: 6003,
                name: "API Activity",
                category_uid: 6,
                category_name: "Application Activity",
                activity_id: 99,
                activity_name: "Other",
            };
            let mut v = base(e, seq, &class);
            v.insert(
                "actor".into(),
                json!({"user": {"name": e.caller}, "app_name": "mcpbox"}),
            );
            v.insert(
                "api".into(),
                json!({"operation": "tools/call", "service": {"name": e.server}}),
            );
            v.insert("src_endpoint".into(), json!({"name": e.caller}));
            v.insert(
                "resources".into(),
                json!([{"name": e.tool.clone().unwrap_or_default(), "type": "MCP tool"}]),
            );
            Some(Value::Object(v))
        }
        Kind::Network => {
            // 5: Refuse for a refused connection, 6: Traffic for one that ran
            let class = Class {
                uid: 4001,
                name: "Network Activity",
                category_uid: 4,
                category_name: "Network Activity",
                activity_id: if refused { 5 } else { 6 },
                activity_name: if refused { "Refuse" } else { "Traffic" },
            };
            let d = &e.detail;
            let mut dst = Map::new();
            if let Some(h) = d.get("host").and_then(Value::as_str) {
                dst.insert("hostname".into(), json!(h));
            }
            if let Some(p) = d.get("port").and_then(Value::as_u64) {
                dst.insert("port".into(), json!(p));
            }
            if let Some(a) = d.get("address").and_then(Value::as_str) {
                // "ip:port" as the proxy records it
                if let Ok(sa) = a.parse::<std::net::SocketAddr>() {
                    dst.insert("ip".into(), json!(sa.ip().to_string()));
                }
            }
            let mut v = base(e, seq, &class);
            v.insert(
                "src_endpoint".into(),
                json!({"name": format!("sandbox {}", e.sandbox_id)}),
            );
            v.insert("dst_endpoint".into(), Value::Object(dst));
            v.insert(
                "connection_info".into(),
                json!({"direction_id": 2, "direction": "Outbound", "protocol_name": "tcp"}),
            );
            v.insert(
                "traffic".into(),
                json!({
                    "bytes_out": d.get("bytes_up").and_then(Value::as_u64).unwrap_or(0),
                    "bytes_in": d.get("bytes_down").and_then(Value::as_u64).unwrap_or(0),
                }),
            );
            // the class has no actor: who asked is unmapped
            if let (false, Some(u)) = (
                e.caller.is_empty(),
                v.get_mut("unmapped").and_then(Value::as_object_mut),
            ) {
                u.insert("caller".into(), json!(e.caller));
            }
            Some(Value::Object(v))
        }
        _ => None,
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    #[test]
    fn a_call_and_a_connection_map_to_their_classes_and_nothing_else_does() {
        let call = Event {
            time_ms: 5,
            kind: Some(Kind::ToolCall),
            server: "fs".into(),
            caller: "alice".into(),
            tool: Some("read".into()),
            decision: Some(Verdict::Deny),
            reason: Some("tool.rule".into()),
            ..Event::default()
        };
        let v = to_ocsf(&call, Some(3)).unwrap();
        assert_eq!(v["class_uid"], 6003);
        assert_eq!(v["type_uid"], 600399);
        assert_eq!(v["status_id"], 2);
        assert_eq!(v["metadata"]["uid"], "3");
        assert_eq!(v["unmapped"]["reason"], "tool.rule");
        let net = Event {
            kind: Some(Kind::Network),
            decision: Some(Verdict::Allow),
            detail: json!({"host": "pypi.org", "port": 443, "address": "1.2.3.4:443", "bytes_up": 7}),
            ..Event::default()
        };
        let v = to_ocsf(&net, None).unwrap();
        assert_eq!(v["type_uid"], 400106);
        assert_eq!(v["dst_endpoint"]["hostname"], "pypi.org");
        assert_eq!(v["dst_endpoint"]["ip"], "1.2.3.4");
        assert_eq!(v["traffic"]["bytes_out"], 7);
        let other = Event {
            kind: Some(Kind::SessionStart),
            ..Event::default()
        };
        assert!(to_ocsf(&other, None).is_none());
    }
}
