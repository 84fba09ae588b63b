//! What is done to the server's output before the host sees it: secret
//! values (and their encodings) replaced, also across the text items of a
//! result and at the cut of a compacted line; credential shapes flagged
//! (and redacted unless configured otherwise); terminal escapes stripped
//! from text content; text content cut to `max_result`.

use mcpbox_audit::Kind;
use mcpbox_policy::{Reason, Source};
use serde_json::{json, Value};

use super::Session;
use crate::message::at_mut;
use crate::redact::{find_credentials, redact_credentials, walk_strings, Redacted};
use crate::screen::sanitize;

impl Session {
    /// In strings cut by compaction, removes a partial secret left just
    /// before the cut.
    pub(super) fn strip_cut_secrets(&mut self, v: &mut Value) -> bool {
        let redactor = self.redaction.redactor.clone();
        if redactor.is_empty() {
            return false;
        }
        let mut counts = vec![0usize; redactor.names().len()];
        redactor.strip_cut_json(v, &mut counts)
    }

    /// Replaces secret values anywhere in the message (`raw`: the line it
    /// was parsed from); one audit record per secret found.
    pub(super) fn redact_secrets(
        &mut self,
        v: &mut Value,
        raw: &[u8],
        tool: Option<&str>,
    ) -> Redacted {
        let redactor = self.redaction.redactor.clone();
        if redactor.is_empty() {
            return Redacted::Unchanged;
        }
        let mut counts = vec![0usize; redactor.names().len()];
        // One pass over every string, key and number, then the content
        // texts' boundaries (a secret split over two text items is still
        // the secret). Not skipped for a plain line without a pattern in
        // it: the halves of a split secret are not a pattern of the line.
        let outcome = redactor.redact_message(v, raw, &mut counts);
        if outcome == Redacted::Refused {
            // the secret is in a number's digits the parser could not keep:
            // counted once for each secret in the line's bytes
            counts.iter_mut().for_each(|c| *c = 0);
            for (_, _, secret) in redactor.find(raw) {
                if let Some(c) = counts.get_mut(secret) {
                    *c += 1;
                }
            }
        }
        self.audit_redactions(redactor.names(), &counts, tool, "stdout");
        outcome
    }

    /// Replaces secret values in a part of a message that is kept (a tool
    /// list, the instructions: pinned), before it is kept; one audit record
    /// per secret found. The whole message still passes
    /// [`Session::redact_secrets`] on its way to the host.
    pub(super) fn redact_kept(&mut self, v: &mut Value) -> bool {
        let redactor = self.redaction.redactor.clone();
        if redactor.is_empty() {
            return false;
        }
        let mut counts = vec![0usize; redactor.names().len()];
        let changed = redactor.redact_json(v, &mut counts);
        self.audit_redactions(redactor.names(), &counts, None, "stdout");
        changed
    }

    /// Removes every `_meta` entry under mcpbox's own names from a message
    /// of the server (see [`crate::reserved`]): what the host reads there
    /// is mcpbox's word only. Flagged once per session.
    pub(super) fn strip_reserved_meta(&mut self, v: &mut Value, raw: &[u8]) -> bool {
        if !crate::reserved::may_hold(raw) {
            return false;
        }
        let removed = crate::reserved::strip(v);
        if removed == 0 {
            return false;
        }
        tracing::warn!(server = %self.config.server_name, removed, "the server wrote mcpbox's own _meta keys; removed");
        self.flag(None, Reason::ServerReservedMeta, Source::Relay);
        true
    }

    /// One audit record (and a warning) per secret with a non-zero count
    /// in `counts` (indexed as `names`), found in what `source` names.
    pub(super) fn audit_redactions(
        &mut self,
        names: &[String],
        counts: &[usize],
        tool: Option<&str>,
        source: &str,
    ) {
        for (name, &count) in names.iter().zip(counts) {
            if count == 0 {
                continue;
            }
            tracing::warn!(server = %self.config.server_name, secret = %name, count, source, "secret redacted");
            self.audit(Kind::Redaction, |e| {
                e.tool = tool.map(str::to_string);
                e.reason = Some(Reason::RedactionSecret.as_str().into());
                e.source = Some(source.into());
                e.detail = json!({"secret": name, "count": count});
            });
        }
    }

    /// Credential shapes, escapes and size of a tool result. `plain` is the
    /// raw line when [`crate::message::is_plain`] (every string of the
    /// parsed message is its very bytes): a search over it stands for the
    /// walk over every string.
    pub(super) fn screen_result(
        &mut self,
        v: &mut Value,
        tool: &str,
        plain: Option<&[u8]>,
    ) -> (bool, Vec<String>) {
        let mut changed = false;
        let redact = self.config.redact_credential_shapes;
        let mut rules: Vec<Reason> = Vec::new();
        let shapes =
            plain.is_none_or(|line| !find_credentials(&String::from_utf8_lossy(line)).is_empty());
        if let Some(result) = v.get_mut("result").filter(|_| shapes) {
            changed |= walk_strings(result, &mut |s| {
                let hits = find_credentials(s);
                if hits.is_empty() {
                    return None;
                }
                for h in &hits {
                    if !rules.contains(&h.2) {
                        rules.push(h.2);
                    }
                }
                redact.then(|| redact_credentials(s, &hits))
            });
        }
        let found: Vec<String> = rules.iter().map(|r| r.as_str().to_string()).collect();
        for reason in rules {
            self.audit(Kind::Flag, |e| {
                e.tool = Some(tool.to_string());
                e.reason = Some(reason.as_str().to_string());
                e.source = Some("result".into());
                e.detail = json!({"redacted": redact});
            });
        }
        // a plain line has no escapes to strip, and no more text than bytes
        let small = plain.is_some_and(|line| line.len() <= self.config.max_result);
        if small && !changed {
            return (false, found);
        }
        (changed | truncate_text(v, self.config.max_result), found)
    }
}

/// Strips terminal escapes from the text items of a result and cuts them,
/// summed, to `max` bytes (at a char boundary, with a marker).
fn truncate_text(v: &mut Value, max: usize) -> bool {
    let mut changed = false;
    let mut budget = max;
    let Some(Value::Array(items)) = at_mut(v, &["result", "content"]) else {
        return false;
    };
    for item in items {
        if item.get("type").and_then(Value::as_str) != Some("text") {
            continue;
        }
        let Some(Value::String(text)) = item.get_mut("text") else {
            continue;
        };
        if let (std::borrow::Cow::Owned(clean), _) = sanitize(text) {
            *text = clean;
            changed = true;
        }
        if text.len() <= budget {
            budget -= text.len();
            continue;
        }
        let mut cut = budget;
        while !text.is_char_boundary(cut) {
            cut -= 1;
        }
        let dropped = text.len() - cut;
        text.truncate(cut);
        if !text.is_empty() {
            text.push('\n');
        }
        text.push_str(&format!("[mcpbox: truncated {dropped} bytes]"));
        budget = 0;
        changed = true;
    }
    changed
}
