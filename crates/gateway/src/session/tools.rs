//! The server's tool list and instructions on their way to the host:
//! pinning (a changed or new tool is withheld and refused on call), the
//! policy's visibility, and screening of descriptions (escapes and
//! invisible Unicode stripped, instructions aimed at the model flagged).

use std::collections::HashMap;

use mcpbox_audit::Kind;
use mcpbox_policy::{Reason, Source, ToolHints};
use serde_json::{json, Value};

use super::{Effect, Session};
use crate::pin::{PinStore, PinVerdict, PinWrite};
use crate::screen::{flag_instructions, sanitize};

/// What the session knows about the server's tools.
pub(crate) struct ToolScreen {
    pins: Option<PinStore>,
    /// The pin file has no tool list yet: the first complete list is
    /// pinned as it is.
    establishing: bool,
    /// Annotations from the last list, by tool.
    hints: HashMap<String, ToolHints>,
    /// Tools withheld from the host, with the reason.
    withheld: HashMap<String, Reason>,
}

impl ToolScreen {
    pub(crate) fn new(pins: Option<PinStore>) -> ToolScreen {
        let establishing = pins.as_ref().is_some_and(|p| !p.established());
        ToolScreen {
            pins,
            establishing,
            hints: HashMap::new(),
            withheld: HashMap::new(),
        }
    }

    pub(crate) fn hints(&self, tool: &str) -> ToolHints {
        self.hints.get(tool).copied().unwrap_or_default()
    }
}

impl Session {
    /// Why a call to `tool` is refused by pinning, if it is.
    pub(super) fn pin_refusal(&self, tool: &str) -> Option<Reason> {
        if let Some(r) = self.tools.withheld.get(tool) {
            return Some(*r);
        }
        let pins = self.tools.pins.as_ref()?.pins()?;
        // A call to a tool outside a pinned set is refused even when the host
        // never listed tools in this session (a pinned set may be empty).
        if !self.tools.establishing && pins.tools_pinned && !pins.tools.contains_key(tool) {
            return Some(Reason::PinNew);
        }
        None
    }

    fn pin_writes(&mut self, writes: Vec<PinWrite>) {
        self.out.extend(writes.into_iter().map(Effect::WritePins));
    }

    /// Screens the server's `instructions` in an `initialize` (or
    /// `server/discover`) result.
    pub(super) fn screen_instructions(&mut self, v: &mut Value) -> bool {
        // the session's secrets redacted first: what is pinned, kept in the
        // pin file and shown by `mcpbox pin` and the console is what the
        // host sees, never a secret the server put in its instructions
        let redacted = match v.pointer_mut("/result/instructions") {
            Some(slot @ Value::String(_)) => self.redact_kept(slot),
            _ => return false,
        };
        let Some(Value::String(text)) = v.pointer("/result/instructions").cloned() else {
            return redacted;
        };
        let accept = self.config.accept_pin_changes;
        let establishing = self.tools.establishing;
        if let Some(store) = self.tools.pins.as_mut() {
            let (changed, writes) = store.plan_instructions(&text, establishing, accept);
            self.pin_writes(writes);
            if let Some((old, new)) = changed {
                if let Some(r) = v.get_mut("result").and_then(Value::as_object_mut) {
                    r.remove("instructions");
                }
                self.audit(Kind::PinChange, |e| {
                    e.reason = Some(Reason::PinInstructionsChanged.as_str().into());
                    e.source = Some("pin".into());
                    e.detail = json!({"instructions": true, "old": old, "new": new});
                });
                return true;
            }
        }
        let (clean, stripped) = sanitize(&text);
        for rule in stripped.rules() {
            self.flag(None, rule, Source::Instructions);
        }
        for rule in flag_instructions(&clean) {
            self.flag(None, rule, Source::Instructions);
        }
        if let std::borrow::Cow::Owned(c) = clean {
            v["result"]["instructions"] = Value::String(c);
            return true;
        }
        redacted
    }

    /// Screens one page of a `tools/list` result.
    pub(super) fn screen_tool_list(&mut self, v: &mut Value) -> bool {
        let last_page = v.pointer("/result/nextCursor").is_none_or(Value::is_null);
        // the session's secrets redacted before pinning: a pin file keeps
        // the definitions it digests, and a secret the server put in a
        // description must not be written to disk or shown by `mcpbox pin`
        // and the console. The digest is of what the host sees; a secret's
        // placeholder names the secret, so a rotated value pins the same.
        let redacted = match v.pointer_mut("/result/tools") {
            Some(tools @ Value::Array(_)) => self.redact_kept(tools),
            _ => false,
        };
        let Some(Value::Array(tools)) = v.pointer_mut("/result/tools").map(std::mem::take) else {
            return redacted;
        };
        let accepted = self.config.accept_pin_changes;
        let establishing = self.tools.establishing;
        let verdicts = match self.tools.pins.as_mut() {
            Some(store) => {
                let (verdicts, writes) = store.plan_tools(&tools, establishing, accepted);
                self.pin_writes(writes);
                Some(verdicts)
            }
            None => None,
        };
        if last_page {
            self.tools.establishing = false;
        }
        let mut kept = Vec::with_capacity(tools.len());
        let mut changed = redacted;
        for (i, mut tool) in tools.into_iter().enumerate() {
            let Some(name) = tool.get("name").and_then(Value::as_str).map(str::to_string) else {
                changed = true;
                continue;
            };
            if !valid_tool_name(&name) {
                // a look-alike of a name a rule is written for must not
                // reach the host: withheld and flagged, its call refused
                tracing::warn!(server = %self.config.server_name, tool = %name.escape_debug(), "tool name outside the MCP characters withheld");
                self.flag(Some(&name), Reason::ToolNameInvalid, Source::Relay);
                changed = true;
                continue;
            }
            let hints = ToolHints::from_tool(&tool);
            self.tools.hints.insert(name.clone(), hints);
            if let Some(verdict) = verdicts.as_ref().and_then(|vs| vs.get(i)) {
                if self.pin_verdict(&name, verdict) {
                    changed = true;
                    continue;
                }
            }
            if !self.policy.visible(&name, &hints)
                || !self.policy.visible(&name, &ToolHints::default())
            {
                changed = true;
                continue;
            }
            changed |= self.screen_tool(&mut tool, &name);
            kept.push(tool);
        }
        let given = kept.len();
        let mut withheld: Vec<String> = self.tools.withheld.keys().cloned().collect();
        withheld.sort();
        self.audit(Kind::ToolList, |e| {
            e.detail = json!({"tools": given, "withheld": withheld});
        });
        if let Some(slot) = v.pointer_mut("/result/tools") {
            *slot = Value::Array(kept);
        }
        changed
    }

    /// Applies one tool's pin verdict; returns true when it is withheld.
    fn pin_verdict(&mut self, name: &str, verdict: &PinVerdict) -> bool {
        let accepted = self.config.accept_pin_changes;
        let (old, new) = match verdict {
            PinVerdict::Pinned => {
                self.tools.withheld.remove(name);
                return false;
            }
            PinVerdict::Changed { old, new } => (Some(old.clone()), new.clone()),
            PinVerdict::New { new } => (None, new.clone()),
        };
        let reason = verdict.reason().unwrap_or(Reason::PinChanged);
        let first_time = self.tools.withheld.get(name) != Some(&reason) || accepted;
        // a definition a human rejected (`mcpbox pin reject`) is withheld
        // without being proposed again
        let rejected = !accepted
            && self
                .tools
                .pins
                .as_ref()
                .and_then(PinStore::pins)
                .is_some_and(|p| p.is_rejected(name, &new));
        if first_time && rejected {
            tracing::warn!(server = %self.config.server_name, tool = %name, reason = reason.as_str(), "the server offers a tool definition that was rejected: withheld");
        } else if first_time {
            tracing::warn!(server = %self.config.server_name, tool = %name, reason = reason.as_str(), accepted, "tool definition differs from pin: review it with `mcpbox pin diff --policy POLICY`, then `mcpbox pin accept|reject --policy POLICY`");
        }
        if first_time {
            self.audit(Kind::PinChange, |e| {
                e.tool = Some(name.to_string());
                e.reason = Some(reason.as_str().to_string());
                e.source = Some(
                    if accepted {
                        "config:accept_pin_changes"
                    } else {
                        "pin"
                    }
                    .into(),
                );
                e.decision = Some(if accepted {
                    mcpbox_policy::Verdict::Allow
                } else {
                    mcpbox_policy::Verdict::Deny
                });
                e.detail = if rejected {
                    json!({"old": old, "new": new, "rejected": true})
                } else {
                    json!({"old": old, "new": new})
                };
            });
        }
        if accepted {
            return false;
        }
        self.tools.withheld.insert(name.to_string(), reason);
        true
    }

    /// Strips escapes and invisible characters from a tool's description,
    /// titles and schema texts, and flags instructions in them.
    fn screen_tool(&mut self, tool: &mut Value, name: &str) -> bool {
        let mut changed = false;
        let mut stripped_rules: Vec<Reason> = Vec::new();
        let mut texts = String::new();
        let mut clean_field = |slot: Option<&mut Value>, texts: &mut String| {
            if let Some(Value::String(s)) = slot {
                let (clean, stripped) = sanitize(s);
                for r in stripped.rules() {
                    if !stripped_rules.contains(&r) {
                        stripped_rules.push(r);
                    }
                }
                texts.push_str(&clean);
                texts.push('\n');
                if let std::borrow::Cow::Owned(c) = clean {
                    *s = c;
                    changed = true;
                }
            }
        };
        clean_field(tool.get_mut("description"), &mut texts);
        clean_field(tool.get_mut("title"), &mut texts);
        clean_field(tool.pointer_mut("/annotations/title"), &mut texts);
        for schema in ["inputSchema", "outputSchema"] {
            if let Some(s) = tool.get_mut(schema) {
                clean_schema(s, &mut |slot, t| clean_field(Some(slot), t), &mut texts);
            }
        }
        for r in stripped_rules {
            self.flag(Some(name), r, Source::Description);
        }
        for r in flag_instructions(&texts) {
            self.flag(Some(name), r, Source::Description);
        }
        changed
    }
}

/// Applies `f` to every `description`/`title` string in a JSON schema.
fn clean_schema(v: &mut Value, f: &mut dyn FnMut(&mut Value, &mut String), texts: &mut String) {
    match v {
        Value::Object(m) => {
            for (k, child) in m.iter_mut() {
                if (k == "description" || k == "title") && child.is_string() {
                    f(child, texts);
                } else {
                    clean_schema(child, f, texts);
                }
            }
        }
        Value::Array(a) => {
            for child in a {
                clean_schema(child, f, texts);
            }
        }
        _ => {}
    }
}

/// The tool-name characters of the MCP specification; defined beside the
/// tool rules (`learn` proposes no rule for another name either).
pub use mcpbox_policy::valid_tool_name;
