//! Tool pinning: the first tool list (and server instructions) seen under a
//! pin file is recorded as one digest per tool; later changes (a rug pull)
//! or new tools are withheld until accepted.
//!
//! A pin file (and its pending twin) also keeps each tool's definition as
//! it was digested ([`Kept`]), at most [`MAX_KEPT`] bytes a tool, and the
//! instructions' text, so that a change can be reviewed as a diff
//! ([`crate::pin_review`]). The digests decide; a kept text is shown only
//! when it still hashes to its digest. Files written before definitions
//! were kept (version 1) read as pins whose definitions are unknown.
//!
//! A proposal a human rejected ([`crate::pin_review::reject`]) is
//! remembered in the pin file by its digest (`rejected`): the tool stays
//! withheld while the server offers it, and it is not written to the
//! pending file again.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

use serde_json::{json, Map, Value};

use mcpbox_policy::Reason;

use crate::digest::json_digest;

/// Errors reading or writing pin files.
#[derive(Debug, thiserror::Error)]
pub enum PinError {
    /// The pin file could not be read or written.
    #[error("pin file {path}: {source}")]
    Io {
        /// The file.
        path: PathBuf,
        /// Underlying error.
        source: std::io::Error,
    },
    /// The pin file is not valid pin JSON.
    #[error("pin file {path}: not a valid pin file")]
    Invalid {
        /// The file.
        path: PathBuf,
    },
}

/// At most this many bytes of one tool's definition (its canonical JSON) or
/// of the instructions are kept in a pin file; beyond that only the digest.
pub const MAX_KEPT: usize = 64 * 1024;

/// What a pin file keeps of a definition beside its digest.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Kept {
    /// The definition as digested: for a tool the object of the fields
    /// [`tool_digest`] covers, for instructions the string.
    Value(Value),
    /// Over [`MAX_KEPT`]: only the digest was kept.
    TooLarge {
        /// Its size in bytes.
        bytes: usize,
    },
}

impl Kept {
    fn of(value: Value) -> Kept {
        let bytes = serde_json::to_vec(&value).map_or(usize::MAX, |b| b.len());
        if bytes > MAX_KEPT {
            Kept::TooLarge { bytes }
        } else {
            Kept::Value(value)
        }
    }

    fn to_json(&self) -> Value {
        match self {
            Kept::Value(v) => json!({ "kept": v }),
            Kept::TooLarge { bytes } => json!({ "too_large": bytes }),
        }
    }

    fn from_json(v: &Value) -> Option<Kept> {
        if let Some(k) = v.get("kept") {
            return Some(Kept::Value(k.clone()));
        }
        let bytes = v.get("too_large")?.as_u64()?;
        Some(Kept::TooLarge {
            bytes: usize::try_from(bytes).unwrap_or(usize::MAX),
        })
    }
}

/// Pinned digests, with the definitions they were taken from.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Pins {
    /// Tool name to hex SHA-256 of its definition.
    pub tools: BTreeMap<String, String>,
    /// Whether a tool list has been pinned at all. A session that only
    /// initialized pins the instructions but not the (unseen) tool set, which
    /// must not read as "the server has no tools" (an empty pinned set would
    /// withhold every tool forever after).
    pub tools_pinned: bool,
    /// Hex SHA-256 of the server instructions, when it gave any.
    pub instructions: Option<String>,
    /// What is kept of each tool's definition. Missing in files of
    /// version 1 and for tools pinned before; check it against the digest
    /// ([`Pins::tool_definition`]) before showing it.
    pub definitions: BTreeMap<String, Kept>,
    /// The instructions' text, as [`Pins::definitions`] for tools.
    pub instructions_text: Option<Kept>,
    /// Digests of proposals a human rejected, by tool: withheld while the
    /// server offers them, never pending again.
    pub rejected: BTreeMap<String, BTreeSet<String>>,
    /// Digests of rejected instructions.
    pub rejected_instructions: BTreeSet<String>,
    /// The server these pins are of, as the binary names it (a command
    /// line, or a URL without credentials): for lists of pin files. Not
    /// part of any pinning decision.
    pub server: Option<String>,
}

/// A kept definition checked against its digest.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Checked<'a> {
    /// Kept, and it hashes to the digest.
    Verified(&'a Value),
    /// Only the digest was kept: the definition was over [`MAX_KEPT`].
    TooLarge(usize),
    /// Nothing kept (a pin file written before definitions were kept).
    Unknown,
    /// Kept, but it does not hash to the digest (the file was edited or is
    /// damaged): never to be shown as the pinned definition.
    Mismatch,
}

impl Pins {
    /// The kept definition of `tool`, checked against its digest.
    pub fn tool_definition(&self, tool: &str) -> Checked<'_> {
        let Some(digest) = self.tools.get(tool) else {
            return Checked::Unknown;
        };
        match self.definitions.get(tool) {
            None => Checked::Unknown,
            Some(Kept::TooLarge { bytes }) => Checked::TooLarge(*bytes),
            Some(Kept::Value(v))
                if tool_digest(v) == *digest
                    && v.get("name").and_then(Value::as_str) == Some(tool) =>
            {
                Checked::Verified(v)
            }
            Some(Kept::Value(_)) => Checked::Mismatch,
        }
    }

    /// The kept instructions, checked against their digest.
    pub fn instructions_definition(&self) -> Checked<'_> {
        let Some(digest) = &self.instructions else {
            return Checked::Unknown;
        };
        match &self.instructions_text {
            None => Checked::Unknown,
            Some(Kept::TooLarge { bytes }) => Checked::TooLarge(*bytes),
            Some(Kept::Value(v @ Value::String(text)))
                if crate::digest::sha256_hex(text.as_bytes()) == *digest =>
            {
                Checked::Verified(v)
            }
            Some(Kept::Value(_)) => Checked::Mismatch,
        }
    }

    /// Whether `digest` of `tool` was rejected.
    pub fn is_rejected(&self, tool: &str, digest: &str) -> bool {
        self.rejected.get(tool).is_some_and(|s| s.contains(digest))
    }

    pub(crate) fn to_json(&self) -> Value {
        let tools = if self.tools_pinned {
            json!(self.tools)
        } else {
            Value::Null
        };
        let definitions: Map<String, Value> = self
            .definitions
            .iter()
            .map(|(k, d)| (k.clone(), d.to_json()))
            .collect();
        json!({
            "version": 2,
            "tools": tools,
            "instructions": self.instructions,
            "definitions": definitions,
            "instructions_text": self.instructions_text.as_ref().map(Kept::to_json),
            "rejected": self.rejected,
            "rejected_instructions": self.rejected_instructions,
            "server": self.server,
        })
    }

    fn from_json(v: &Value) -> Option<Pins> {
        let mut out = Pins::default();
        match v.get("tools") {
            None | Some(Value::Null) => {}
            Some(tools) => {
                out.tools_pinned = true;
                for (k, d) in tools.as_object()? {
                    out.tools.insert(k.clone(), d.as_str()?.to_string());
                }
            }
        }
        out.instructions = v
            .get("instructions")
            .and_then(Value::as_str)
            .map(str::to_string);
        // Version 2 on: what is kept beside the digests. Unreadable entries
        // read as not kept (the digests alone still decide).
        if let Some(defs) = v.get("definitions").and_then(Value::as_object) {
            for (k, d) in defs {
                if let Some(kept) = Kept::from_json(d) {
                    out.definitions.insert(k.clone(), kept);
                }
            }
        }
        out.instructions_text = v.get("instructions_text").and_then(Kept::from_json);
        if let Some(rejected) = v.get("rejected").and_then(Value::as_object) {
            for (k, ds) in rejected {
                let set: BTreeSet<String> = ds
                    .as_array()?
                    .iter()
                    .map(|d| d.as_str().map(str::to_string))
                    .collect::<Option<_>>()?;
                out.rejected.insert(k.clone(), set);
            }
        }
        if let Some(ds) = v.get("rejected_instructions").and_then(Value::as_array) {
            out.rejected_instructions = ds
                .iter()
                .map(|d| d.as_str().map(str::to_string))
                .collect::<Option<_>>()?;
        }
        out.server = v.get("server").and_then(Value::as_str).map(str::to_string);
        Some(out)
    }
}

/// The fields of a tool that [`tool_digest`] covers, as one object: what a
/// pin file keeps of it.
pub fn digested_fields(tool: &Value) -> Value {
    let mut m = Map::new();
    for key in [
        "name",
        "title",
        "description",
        "inputSchema",
        "outputSchema",
        "annotations",
    ] {
        if let Some(v) = tool.get(key) {
            m.insert(key.to_string(), v.clone());
        }
    }
    Value::Object(m)
}

/// The digest of one tool definition: SHA-256 over the canonical JSON of its
/// name, title, description, input and output schemas and annotations, as
/// the server sent them (before screening, so hidden characters count),
/// with the session's secrets redacted (the relay redacts a list before it
/// pins it: a pin file never keeps a secret).
pub fn tool_digest(tool: &Value) -> String {
    json_digest(&digested_fields(tool))
}

/// What pinning says about one tool in a list.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum PinVerdict {
    /// Matches the pin (or was pinned just now).
    Pinned,
    /// The definition differs from the pin.
    Changed {
        /// Pinned digest.
        old: String,
        /// Digest of what the server sent now.
        new: String,
    },
    /// Not in the pins.
    New {
        /// Digest of what the server sent.
        new: String,
    },
}

impl PinVerdict {
    /// Reason code for a withheld tool.
    pub fn reason(&self) -> Option<Reason> {
        match self {
            PinVerdict::Pinned => None,
            PinVerdict::Changed { .. } => Some(Reason::PinChanged),
            PinVerdict::New { .. } => Some(Reason::PinNew),
        }
    }
}

/// Pins of one server, backed by a JSON file.
#[derive(Debug)]
pub struct PinStore {
    path: PathBuf,
    pins: Option<Pins>,
    pending: Pins,
}

/// Path of the pending-changes file next to `pin_file`.
pub fn pending_path(pin_file: &Path) -> PathBuf {
    let mut s = pin_file.as_os_str().to_owned();
    s.push(".pending");
    PathBuf::from(s)
}

/// A write of the pin file (or its pending twin) that
/// [`PinStore::plan_tools`] and [`PinStore::plan_instructions`] decided on
/// and left to the caller, so that the relay's session core stays free of
/// I/O. Writes of one store must be done in the order they were planned.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PinWrite {
    /// The file.
    pub path: PathBuf,
    /// Its whole new content (pretty JSON).
    pub value: Value,
}

impl PinWrite {
    fn new(path: &Path, value: Value) -> PinWrite {
        PinWrite {
            path: path.to_path_buf(),
            value,
        }
    }

    /// Writes the file atomically (a temporary file renamed over it).
    pub fn write(&self) -> Result<(), PinError> {
        write_atomic(&self.path, &self.value)
    }
}

fn write_all(writes: Vec<PinWrite>) -> Result<(), PinError> {
    writes.iter().try_for_each(PinWrite::write)
}

fn write_atomic(path: &Path, value: &Value) -> Result<(), PinError> {
    let io = |source| PinError::Io {
        path: path.to_path_buf(),
        source,
    };
    // a temporary name of this write alone: sessions of one server under
    // `serve` write the same pin file at once, and a shared `.tmp` was
    // renamed away under the other writer
    static WRITES: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
    let n = WRITES.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    let mut tmp = path.as_os_str().to_owned();
    tmp.push(format!(".tmp.{}.{n}", std::process::id()));
    let tmp = PathBuf::from(tmp);
    let text = serde_json::to_string_pretty(value).map_err(|_| PinError::Invalid {
        path: path.to_path_buf(),
    })?;
    // 0600: a pin file keeps tool definitions, which are nobody else's to
    // read (docs/threat-model.md, "Local users"); set again on the open
    // file, so the umask cannot loosen it
    use std::io::Write;
    use std::os::unix::fs::{OpenOptionsExt, PermissionsExt};
    let mut f = std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(0o600)
        .open(&tmp)
        .map_err(io)?;
    f.set_permissions(std::fs::Permissions::from_mode(0o600))
        .map_err(io)?;
    let written = f.write_all(text.as_bytes());
    drop(f);
    if let Err(e) = written.and_then(|()| std::fs::rename(&tmp, path)) {
        let _ = std::fs::remove_file(&tmp);
        return Err(io(e));
    }
    Ok(())
}

/// Reads a pin file (or its pending twin); `None` when there is none.
pub fn read_pins(path: &Path) -> Result<Option<Pins>, PinError> {
    match std::fs::read(path) {
        Ok(bytes) => {
            let v: Value = serde_json::from_slice(&bytes).map_err(|_| PinError::Invalid {
                path: path.to_path_buf(),
            })?;
            Pins::from_json(&v)
                .map(Some)
                .ok_or_else(|| PinError::Invalid {
                    path: path.to_path_buf(),
                })
        }
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(None),
        Err(source) => Err(PinError::Io {
            path: path.to_path_buf(),
            source,
        }),
    }
}

/// Accepts every pending pin change: moves `<pin_file>.pending` over
/// `pin_file`. Returns false when nothing was pending.
/// [`crate::pin_review::accept`] is the reviewed form (one tool or all,
/// returning what was accepted), which `mcpbox pin accept` uses.
pub fn accept_pins(pin_file: &Path) -> Result<bool, PinError> {
    let pending = pending_path(pin_file);
    match read_pins(&pending)? {
        None => Ok(false),
        Some(_) => {
            std::fs::rename(&pending, pin_file).map_err(|source| PinError::Io {
                path: pending.clone(),
                source,
            })?;
            Ok(true)
        }
    }
}

/// Pins every tool of a `tools/list` result (`{"tools":[...]}`) and
/// `instructions` (if given) into `pin_file`, with their definitions,
/// replacing what was there (but the server's name). For tools that accept
/// a list out of band.
pub fn pin_list(
    pin_file: &Path,
    list_result: &Value,
    instructions: Option<&str>,
) -> Result<(), PinError> {
    let server = read_pins(pin_file).ok().flatten().and_then(|p| p.server);
    let mut pins = Pins {
        tools_pinned: true,
        server,
        ..Pins::default()
    };
    for tool in list_result
        .get("tools")
        .and_then(Value::as_array)
        .into_iter()
        .flatten()
    {
        if let Some(name) = tool.get("name").and_then(Value::as_str) {
            let fields = digested_fields(tool);
            pins.tools.insert(name.to_string(), json_digest(&fields));
            pins.definitions.insert(name.to_string(), Kept::of(fields));
        }
    }
    pins.instructions = instructions.map(|i| crate::digest::sha256_hex(i.as_bytes()));
    pins.instructions_text = instructions.map(|i| Kept::of(Value::String(i.to_string())));
    write_atomic(pin_file, &pins.to_json())
}

impl PinStore {
    /// Opens (but does not create) the pin file.
    pub fn open(path: &Path) -> Result<PinStore, PinError> {
        let pins = read_pins(path)?;
        let pending = pins.clone().unwrap_or_default();
        Ok(PinStore {
            path: path.to_path_buf(),
            pins,
            pending,
        })
    }

    /// True once a tool list is pinned (on disk or in this session).
    pub fn established(&self) -> bool {
        self.pins.as_ref().is_some_and(|p| p.tools_pinned)
    }

    /// The current pins.
    pub fn pins(&self) -> Option<&Pins> {
        self.pins.as_ref()
    }

    /// Checks the tools of one list page. `establish` pins them outright
    /// (first list of a pin file); `accept` takes changes into the pins.
    /// Writes the pin file, or `<pin_file>.pending` when something is
    /// withheld.
    pub fn check_tools(
        &mut self,
        tools: &[Value],
        establish: bool,
        accept: bool,
    ) -> Result<Vec<PinVerdict>, PinError> {
        let (verdicts, writes) = self.plan_tools(tools, establish, accept);
        write_all(writes)?;
        Ok(verdicts)
    }

    /// [`PinStore::check_tools`] without the writes: returns them instead.
    /// The verdicts hold whether or not the writes succeed. A tool whose
    /// digest was rejected keeps its verdict (it is withheld) but is not
    /// written to the pending file.
    pub fn plan_tools(
        &mut self,
        tools: &[Value],
        establish: bool,
        accept: bool,
    ) -> (Vec<PinVerdict>, Vec<PinWrite>) {
        let mut writes = Vec::new();
        let pins = self.pins.get_or_insert_with(Pins::default);
        let mut verdicts = Vec::with_capacity(tools.len());
        let mut dirty = false;
        let mut withheld = false;
        for tool in tools {
            let name = tool.get("name").and_then(Value::as_str).unwrap_or_default();
            let fields = digested_fields(tool);
            let digest = json_digest(&fields);
            let verdict = match pins.tools.get(name) {
                Some(old) if *old == digest => PinVerdict::Pinned,
                Some(old) => PinVerdict::Changed {
                    old: old.clone(),
                    new: digest.clone(),
                },
                None if establish => PinVerdict::Pinned,
                None => PinVerdict::New {
                    new: digest.clone(),
                },
            };
            let take = establish || accept || verdict == PinVerdict::Pinned;
            let kept = Kept::of(fields);
            if take
                && (pins.tools.get(name) != Some(&digest)
                    || pins.definitions.get(name) != Some(&kept))
            {
                // also fills in the definition of a tool pinned by an
                // older version, which kept digests only
                pins.tools.insert(name.to_string(), digest.clone());
                pins.definitions.insert(name.to_string(), kept.clone());
                dirty = true;
            }
            let rejected = !take && pins.is_rejected(name, &digest);
            if !take && !rejected {
                withheld = true;
            }
            if !rejected {
                self.pending.tools.insert(name.to_string(), digest);
                self.pending.definitions.insert(name.to_string(), kept);
            }
            verdicts.push(verdict);
        }
        if establish && !pins.tools_pinned {
            pins.tools_pinned = true;
            dirty = true;
        }
        if dirty {
            writes.push(PinWrite::new(&self.path, pins.to_json()));
        }
        if withheld {
            let pending = self.pending_file(None);
            writes.push(PinWrite::new(&pending_path(&self.path), pending.to_json()));
        }
        (verdicts, writes)
    }

    /// The pending file's content: the pins with what this session saw
    /// on top (and `instructions`, when given).
    fn pending_file(&self, instructions: Option<(String, Kept)>) -> Pins {
        let mut pending = self.pins.clone().unwrap_or_default();
        pending.tools.extend(
            self.pending
                .tools
                .iter()
                .map(|(k, v)| (k.clone(), v.clone())),
        );
        pending.definitions.extend(
            self.pending
                .definitions
                .iter()
                .map(|(k, v)| (k.clone(), v.clone())),
        );
        match instructions {
            Some((digest, text)) => {
                pending.instructions = Some(digest);
                pending.instructions_text = Some(text);
            }
            None => {
                if self.pending.instructions.is_some() {
                    pending.instructions = self.pending.instructions.clone();
                    pending.instructions_text = self.pending.instructions_text.clone();
                }
            }
        }
        pending
    }

    /// Checks server instructions. Returns `Some(old, new)` when they differ
    /// from the pin and were not accepted.
    pub fn check_instructions(
        &mut self,
        text: &str,
        establish: bool,
        accept: bool,
    ) -> Result<Option<(String, String)>, PinError> {
        let (changed, writes) = self.plan_instructions(text, establish, accept);
        write_all(writes)?;
        Ok(changed)
    }

    /// [`PinStore::check_instructions`] without the writes: returns them.
    /// Rejected instructions are withheld without a pending write.
    pub fn plan_instructions(
        &mut self,
        text: &str,
        establish: bool,
        accept: bool,
    ) -> (Option<(String, String)>, Vec<PinWrite>) {
        let digest = crate::digest::sha256_hex(text.as_bytes());
        let kept = Kept::of(Value::String(text.to_string()));
        let pins = self.pins.get_or_insert_with(Pins::default);
        let take = |pins: &mut Pins| {
            pins.instructions = Some(digest.clone());
            pins.instructions_text = Some(kept.clone());
            PinWrite::new(&self.path, pins.to_json())
        };
        match pins.instructions.clone() {
            Some(old) if old == digest => {
                self.pending.instructions = Some(digest.clone());
                self.pending.instructions_text = Some(kept.clone());
                if pins.instructions_text.as_ref() == Some(&kept) {
                    (None, Vec::new())
                } else {
                    // pinned by an older version: keep the text now
                    (None, vec![take(pins)])
                }
            }
            None if establish || accept => {
                self.pending.instructions = Some(digest.clone());
                self.pending.instructions_text = Some(kept.clone());
                (None, vec![take(pins)])
            }
            Some(_) if accept => {
                self.pending.instructions = Some(digest.clone());
                self.pending.instructions_text = Some(kept.clone());
                (None, vec![take(pins)])
            }
            old if pins.rejected_instructions.contains(&digest) => {
                (Some((old.unwrap_or_default(), digest)), Vec::new())
            }
            old => {
                self.pending.instructions = Some(digest.clone());
                self.pending.instructions_text = Some(kept.clone());
                let pending = self.pending_file(Some((digest.clone(), kept)));
                let write = PinWrite::new(&pending_path(&self.path), pending.to_json());
                (Some((old.unwrap_or_default(), digest)), vec![write])
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn tool(name: &str, desc: &str) -> Value {
        json!({"name": name, "description": desc, "inputSchema": {"type": "object"}})
    }

    #[test]
    fn instructions_only_session_does_not_pin_an_empty_tool_set() {
        let dir = std::env::temp_dir().join(format!("mcpbox-pin-empty-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let file = dir.join("pins.json");
        let _ = std::fs::remove_file(&file);
        let mut store = PinStore::open(&file).unwrap();
        assert_eq!(
            store.check_instructions("hello", true, false).unwrap(),
            None
        );
        // A later session has pinned instructions but no tool set yet: its
        // first list establishes the tools instead of withholding them all.
        let store = PinStore::open(&file).unwrap();
        assert!(!store.established());
        let mut store = PinStore::open(&file).unwrap();
        let v = store
            .check_tools(&[tool("a", "adds")], !store.established(), false)
            .unwrap();
        assert_eq!(v, vec![PinVerdict::Pinned]);
        assert!(PinStore::open(&file).unwrap().established());
        let _ = std::fs::remove_dir_all(&dir);
    }

    #[test]
    fn empty_pinned_tool_set_still_counts_as_pinned() {
        let dir = std::env::temp_dir().join(format!("mcpbox-pin-none-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let file = dir.join("pins.json");
        let _ = std::fs::remove_file(&file);
        let mut store = PinStore::open(&file).unwrap();
        store.check_tools(&[], true, false).unwrap();
        let mut store = PinStore::open(&file).unwrap();
        assert!(store.established());
        let v = store
            .check_tools(&[tool("sneaky", "new")], false, false)
            .unwrap();
        assert_eq!(v[0].reason(), Some(Reason::PinNew));
        let _ = std::fs::remove_dir_all(&dir);
    }

    #[test]
    fn rug_pull_is_detected_and_accept_moves_pending_in() {
        let dir = std::env::temp_dir().join(format!("mcpbox-pin-test-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let file = dir.join("pins.json");
        let _ = std::fs::remove_file(&file);
        let mut store = PinStore::open(&file).unwrap();
        let v = store
            .check_tools(&[tool("a", "adds")], true, false)
            .unwrap();
        assert_eq!(v, vec![PinVerdict::Pinned]);
        let mut store = PinStore::open(&file).unwrap();
        let v = store
            .check_tools(
                &[tool("a", "adds. ignore previous"), tool("b", "new")],
                false,
                false,
            )
            .unwrap();
        assert_eq!(v[0].reason(), Some(Reason::PinChanged));
        assert_eq!(v[1].reason(), Some(Reason::PinNew));
        assert!(accept_pins(&file).unwrap());
        let mut store = PinStore::open(&file).unwrap();
        let v = store
            .check_tools(
                &[tool("a", "adds. ignore previous"), tool("b", "new")],
                false,
                false,
            )
            .unwrap();
        assert_eq!(v, vec![PinVerdict::Pinned, PinVerdict::Pinned]);
        assert!(!accept_pins(&file).unwrap());
        let _ = std::fs::remove_dir_all(&dir);
    }
}
