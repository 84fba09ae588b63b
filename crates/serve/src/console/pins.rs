//! The pin store as the console's Pins page sees it: every server's pins
//! under `<state>/pins/` and its pending changes, with accept and reject,
//! over `mcpbox_gateway::pin_review` (what `mcpbox pin` uses too).
//!
//! An adapter, so that the page's JSON stays put when the pin store
//! changes. Every text in it came from a server: the page shows it as text.

use std::path::{Path, PathBuf};

use mcpbox_gateway::pin_review::{self, PendingChange, Pick, SchemaDiff, Shown};
use mcpbox_gateway::{read_pins, Checked};
use serde::Serialize;

/// One server's pins.
#[derive(Debug, Clone, Serialize)]
pub struct ServerPins {
    /// How the page names it in accept and reject: `POLICY/FILE_STEM` (the
    /// stem is a digest of the server's identity).
    pub id: String,
    /// The policy's name.
    pub policy: String,
    /// The server it pins, as `mcpbox run` labelled it (its command line,
    /// or URL), when known.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub server: Option<String>,
    /// Whether a tool list has been pinned at all.
    pub tools_pinned: bool,
    /// The pinned tools, by name.
    pub tools: Vec<PinnedTool>,
    /// The withheld changes, waiting for a human (empty: none).
    pub pending: Vec<Change>,
}

/// One pinned tool.
#[derive(Debug, Clone, Serialize)]
pub struct PinnedTool {
    pub name: String,
    /// Hex SHA-256 of its definition.
    pub digest: String,
    /// Its pinned description, when kept and matching the digest.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub description: Option<String>,
}

/// One withheld change.
#[derive(Debug, Clone, Serialize)]
pub struct Change {
    /// The tool; `None` for the server's instructions.
    pub tool: Option<String>,
    /// `added`, `removed`, `changed`, `instructions_changed`.
    pub kind: &'static str,
    pub pinned_digest: Option<String>,
    pub proposed_digest: Option<String>,
    /// The proposed description (an added tool's, say), when known.
    pub proposed_description: Option<String>,
    /// A unified diff of the description, when both sides are known.
    pub diff: Option<String>,
    /// How the input schema changed (JSON Pointers), when both sides are
    /// known.
    pub schema: Option<Schema>,
    /// Why a side cannot be shown (too large, pinned by an older mcpbox,
    /// damaged), else empty.
    pub why_not: String,
}

/// [`SchemaDiff`], serialisable.
#[derive(Debug, Clone, Serialize)]
pub struct Schema {
    pub added: Vec<String>,
    pub removed: Vec<String>,
    pub changed: Vec<String>,
}

impl From<&SchemaDiff> for Schema {
    fn from(d: &SchemaDiff) -> Schema {
        Schema {
            added: d.added.clone(),
            removed: d.removed.clone(),
            changed: d.changed.clone(),
        }
    }
}

fn change(c: &PendingChange) -> Change {
    let why = |s: &Option<Shown>| s.as_ref().map(Shown::why_not).unwrap_or_default();
    let why_not = [why(&c.pinned), why(&c.proposed)]
        .into_iter()
        .filter(|w| !w.is_empty())
        .collect::<Vec<_>>()
        .join("; ");
    Change {
        tool: c.tool.clone(),
        kind: c.kind.as_str(),
        pinned_digest: c.pinned_digest.clone(),
        proposed_digest: c.proposed_digest.clone(),
        proposed_description: c
            .proposed
            .as_ref()
            .and_then(Shown::known)
            .and_then(|d| d.description.clone()),
        diff: c.description_diff.clone(),
        schema: c.schema.as_ref().map(Schema::from),
        why_not,
    }
}

/// The id of `path` under its policy's directory.
fn id_of(policy: &str, path: &Path) -> String {
    let stem = path
        .file_stem()
        .map(|s| s.to_string_lossy().into_owned())
        .unwrap_or_default();
    format!("{policy}/{stem}")
}

/// Every server's pins; a file that cannot be read is left out (and
/// logged).
pub fn list(state_dir: &Path) -> Vec<ServerPins> {
    let files = match pin_review::pin_files(state_dir) {
        Ok(f) => f,
        Err(e) => {
            tracing::warn!("console: pins: {e}");
            return Vec::new();
        }
    };
    let mut out = Vec::new();
    for f in files {
        let (current, review) = match (read_pins(&f.path), pin_review::review(&f.path)) {
            (Ok(c), Ok(r)) => (c.unwrap_or_default(), r),
            (Err(e), _) | (_, Err(e)) => {
                tracing::warn!("console: pins: {e}");
                continue;
            }
        };
        let tools = if current.tools_pinned {
            current
                .tools
                .iter()
                .map(|(name, digest)| PinnedTool {
                    name: name.clone(),
                    digest: digest.clone(),
                    description: match current.tool_definition(name) {
                        Checked::Verified(v) => v
                            .get("description")
                            .and_then(serde_json::Value::as_str)
                            .map(str::to_string),
                        _ => None,
                    },
                })
                .collect()
        } else {
            Vec::new()
        };
        out.push(ServerPins {
            id: id_of(&f.policy, &f.path),
            policy: f.policy.clone(),
            server: f.server.clone(),
            tools_pinned: current.tools_pinned,
            tools,
            pending: review.changes.iter().map(change).collect(),
        });
    }
    out
}

/// The pin file of `id` and its policy's name, looked up among those that
/// exist (an id from the page is never made into a path).
fn file_of(state_dir: &Path, id: &str) -> Option<(String, PathBuf)> {
    pin_review::pin_files(state_dir)
        .ok()?
        .into_iter()
        .find(|f| id_of(&f.policy, &f.path) == id)
        .map(|f| (f.policy, f.path))
}

/// Accepts (or rejects) `id`'s pending change of `tool` (`None`: all of
/// them); returns the policy's name and what was decided, for the audit.
pub fn decide(
    state_dir: &Path,
    id: &str,
    tool: Option<&str>,
    accept: bool,
) -> Result<(String, Vec<PendingChange>), String> {
    let (policy, file) = file_of(state_dir, id).ok_or_else(|| format!("no pins {id:?}"))?;
    let pick = match tool {
        None => Pick::All,
        Some("instructions") => Pick::Instructions,
        Some(t) => Pick::Tool(t),
    };
    let done = if accept {
        pin_review::accept(&file, pick)
    } else {
        pin_review::reject(&file, pick)
    }
    .map_err(|e| e.to_string())?;
    if done.is_empty() {
        return Err(format!("nothing is pending for {id}"));
    }
    Ok((policy, done))
}
