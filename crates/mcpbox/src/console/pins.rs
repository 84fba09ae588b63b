//! The pin store as the console's Pins page sees it: every server's pins
//! under `<state>/pins/` and its pending change, with accept (and reject).
//!
//! An adapter, so that the page does not change when the pin store does:
//! today the store keeps a digest per tool, so a change names the tools
//! added, removed and changed. The fields the pin store's coming version
//! fills (branch `pins`: the pinned descriptions, a unified diff of a
//! changed description, and `reject`) are here already, marked
//! `PENDING(pins)`: [`ToolChange::diff`] is `None` and [`reject`] says it
//! is not available until then.

use std::path::{Path, PathBuf};

use mcpbox_gateway::{pending_path, read_pins, Pins};
use serde::Serialize;

/// One server's pins.
#[derive(Debug, Clone, Serialize)]
pub struct ServerPins {
    /// How the page names it in accept and reject: `POLICY/FILE_STEM`
    /// (the stem is a digest of the server's identity), or `FILE_STEM`
    /// for a pin file of the older one-per-policy layout.
    pub id: String,
    /// The policy's name.
    pub policy: String,
    /// Whether a tool list has been pinned at all.
    pub tools_pinned: bool,
    /// The pinned tools, by name, with their definition's digest.
    pub tools: Vec<PinnedTool>,
    /// A withheld change, waiting for a human.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub pending: Option<Change>,
    /// Whether [`reject`] works yet (PENDING(pins)).
    pub reject_available: bool,
}

/// One pinned tool.
#[derive(Debug, Clone, Serialize)]
pub struct PinnedTool {
    pub name: String,
    /// Hex SHA-256 of its definition.
    pub digest: String,
    /// Its pinned description, once the pin store keeps it
    /// (PENDING(pins)).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub description: Option<String>,
}

/// What a pending change does.
#[derive(Debug, Clone, Serialize, Default)]
pub struct Change {
    pub added: Vec<String>,
    pub removed: Vec<String>,
    pub changed: Vec<ToolChange>,
    pub instructions_changed: bool,
}

/// A tool whose definition changed.
#[derive(Debug, Clone, Serialize)]
pub struct ToolChange {
    pub name: String,
    pub old_digest: String,
    pub new_digest: String,
    /// A unified diff of the description, once the pin store keeps
    /// descriptions (PENDING(pins)); `None` until then.
    pub diff: Option<String>,
}

/// Whether the pin store can reject a pending change yet (PENDING(pins)).
pub const REJECT_AVAILABLE: bool = false;

/// Every pin file under `<state>/pins`, with its policy's name and id.
fn files(state_dir: &Path) -> Vec<(String, String, PathBuf)> {
    let root = state_dir.join("pins");
    let mut out = Vec::new();
    let Ok(entries) = std::fs::read_dir(&root) else {
        return out;
    };
    let mut entries: Vec<_> = entries.filter_map(Result::ok).collect();
    entries.sort_by_key(std::fs::DirEntry::file_name);
    for e in entries {
        let name = e.file_name().to_string_lossy().into_owned();
        let Ok(kind) = e.file_type() else { continue };
        if kind.is_dir() {
            for (stem, file) in pin_files(&e.path()) {
                out.push((name.clone(), format!("{name}/{stem}"), file));
            }
        } else if let Some(stem) = name.strip_suffix(".json") {
            // the older layout: pins/<policy>.json
            out.push((stem.to_string(), stem.to_string(), e.path()));
        }
    }
    out
}

/// The pin files (`*.json`, also those that exist only as their pending
/// twin) in `dir`, by stem.
fn pin_files(dir: &Path) -> Vec<(String, PathBuf)> {
    let mut out: Vec<(String, PathBuf)> = Vec::new();
    let Ok(entries) = std::fs::read_dir(dir) else {
        return out;
    };
    for e in entries.filter_map(Result::ok) {
        let name = e.file_name().to_string_lossy().into_owned();
        let base = name.strip_suffix(".pending").unwrap_or(&name);
        if let Some(stem) = base.strip_suffix(".json") {
            if !out.iter().any(|(s, _)| s == stem) {
                out.push((stem.to_string(), dir.join(base)));
            }
        }
    }
    out.sort();
    out
}

/// What `new` changes from `old`.
fn change(old: Option<&Pins>, new: &Pins) -> Change {
    let empty = Pins::default();
    let old = old.unwrap_or(&empty);
    let mut c = Change::default();
    for (tool, digest) in &new.tools {
        match old.tools.get(tool) {
            None => c.added.push(tool.clone()),
            Some(d) if d != digest => c.changed.push(ToolChange {
                name: tool.clone(),
                old_digest: d.clone(),
                new_digest: digest.clone(),
                diff: None,
            }),
            Some(_) => {}
        }
    }
    c.removed = old
        .tools
        .keys()
        .filter(|t| !new.tools.contains_key(*t))
        .cloned()
        .collect();
    c.instructions_changed = old.instructions != new.instructions;
    c
}

/// Every server's pins; a file that cannot be read is left out (and
/// logged).
pub fn list(state_dir: &Path) -> Vec<ServerPins> {
    let mut out = Vec::new();
    for (policy, id, file) in files(state_dir) {
        let (current, pending) = match (read_pins(&file), read_pins(&pending_path(&file))) {
            (Ok(c), Ok(p)) => (c, p),
            (Err(e), _) | (_, Err(e)) => {
                tracing::warn!("console: pins: {e}");
                continue;
            }
        };
        let tools = current
            .as_ref()
            .filter(|p| p.tools_pinned)
            .map(|p| {
                p.tools
                    .iter()
                    .map(|(name, digest)| PinnedTool {
                        name: name.clone(),
                        digest: digest.clone(),
                        description: None,
                    })
                    .collect()
            })
            .unwrap_or_default();
        out.push(ServerPins {
            id,
            policy,
            tools_pinned: current.as_ref().is_some_and(|p| p.tools_pinned),
            tools,
            pending: pending.as_ref().map(|p| change(current.as_ref(), p)),
            reject_available: REJECT_AVAILABLE,
        });
    }
    out
}

/// The pin file of `id`, looked up among those that exist (an id from
/// the page is never made into a path).
fn file_of(state_dir: &Path, id: &str) -> Option<PathBuf> {
    files(state_dir)
        .into_iter()
        .find(|(_, i, _)| i == id)
        .map(|(_, _, f)| f)
}

/// Accepts `id`'s pending change.
pub fn accept(state_dir: &Path, id: &str) -> Result<(), String> {
    let file = file_of(state_dir, id).ok_or_else(|| format!("no pins {id:?}"))?;
    match mcpbox_gateway::accept_pins(&file) {
        Ok(true) => Ok(()),
        Ok(false) => Err(format!("nothing is pending for {id}")),
        Err(e) => Err(e.to_string()),
    }
}

/// Rejects `id`'s pending change: PENDING(pins), the pin store's
/// `reject` lands with the `pins` branch.
pub fn reject(state_dir: &Path, id: &str) -> Result<(), String> {
    let _ = file_of(state_dir, id).ok_or_else(|| format!("no pins {id:?}"))?;
    Err(
        "rejecting a change is not available in this build yet; it stays withheld \
         (`mcpbox pin reset` forgets all of this server's pins)"
            .into(),
    )
}
