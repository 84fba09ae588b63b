//! What the host says of itself and its files, as the server may hear it:
//! its roots, translated to the sandbox's paths (and those outside
//! dropped), and its name, which becomes the records' caller.

use mcpbox_audit::Kind;
use mcpbox_policy::Reason;
use serde_json::{json, Value};

use super::Session;
use crate::message::{to_line, Message};

impl Session {
    /// The host's answer to the server's `roots/list`, with each root made
    /// the sandbox's path (a `file://` URI under a host directory behind
    /// the sandbox's) and every other root dropped: the server never sees
    /// a host path. What was dropped is logged and audited (how many, never
    /// the paths).
    pub(super) fn roots_answered(&mut self, mut msg: Message) {
        let Some(map) = self.config.paths.clone() else {
            return self.send_server(to_line(&msg.value));
        };
        let mut dropped = 0usize;
        if let Some(result) = msg.value.get_mut("result") {
            // only the roots, each rebuilt from its uri and name: nothing
            // else the host put in its answer reaches the server
            let offered = result
                .get("roots")
                .and_then(Value::as_array)
                .cloned()
                .unwrap_or_default();
            let mut kept = Vec::new();
            for root in offered {
                let uri = root.get("uri").and_then(Value::as_str).unwrap_or("");
                match map.root_uri(uri) {
                    Some(inside) => {
                        let mut r = serde_json::Map::new();
                        r.insert("uri".into(), Value::String(inside));
                        if let Some(name) = root.get("name").filter(|n| n.is_string()) {
                            r.insert("name".into(), name.clone());
                        }
                        kept.push(Value::Object(r));
                    }
                    None => dropped += 1,
                }
            }
            *result = json!({ "roots": kept });
        }
        if dropped > 0 {
            tracing::warn!(server = %self.config.server_name, dropped, "roots outside the sandbox's mounts dropped from the client's answer");
            self.audit(Kind::Flag, |e| {
                e.reason = Some(Reason::RootOutside.as_str().to_string());
                e.source = Some("roots".to_string());
                e.detail = json!({"dropped": dropped});
            });
        }
        self.send_server(to_line(&msg.value));
    }

    /// A stdio host names itself in `initialize` (`clientInfo`): the
    /// records from here on say `stdio:NAME/VERSION` instead of `stdio`.
    /// Cleaned (no control or invisible characters) and bounded, since the
    /// host writes it. A caller the driver authenticated (the HTTP
    /// gateway's client name) is kept as it is.
    pub(super) fn caller_from_client_info(&mut self, params: Option<&Value>) {
        if self.config.caller != "stdio" {
            return;
        }
        let Some(info) = params.and_then(|p| p.get("clientInfo")) else {
            return;
        };
        let part = |k: &str| {
            info.get(k)
                .and_then(Value::as_str)
                .map(|v| {
                    v.chars()
                        .filter(|&c| !mcpbox_policy::terminal::is_unsafe(c))
                        .take(64)
                        .collect::<String>()
                })
                .unwrap_or_default()
        };
        let (name, version) = (part("name"), part("version"));
        if name.is_empty() {
            return;
        }
        self.template.caller = if version.is_empty() {
            format!("stdio:{name}")
        } else {
            format!("stdio:{name}/{version}")
        };
    }
}
