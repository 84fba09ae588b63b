//! Tool pinning: the first tool list (and server instructions) seen under a
//! pin file is recorded as one digest per tool; later changes (a rug pull)
//! or new tools are withheld until accepted.

use std::collections::BTreeMap;
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

/// Pinned digests.
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
}

impl Pins {
    fn to_json(&self) -> Value {
        let tools = if self.tools_pinned {
            json!(self.tools)
        } else {
            Value::Null
        };
        json!({ "version": 1, "tools": tools, "instructions": self.instructions })
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
        Some(out)
    }
}

/// The digest of one tool definition: SHA-256 over the canonical JSON of its
/// name, title, description, input and output schemas and annotations, as
/// the server sent them (before screening, so hidden characters count).
pub fn tool_digest(tool: &Value) -> String {
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
    json_digest(&Value::Object(m))
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
    let mut tmp = path.as_os_str().to_owned();
    tmp.push(".tmp");
    let tmp = PathBuf::from(tmp);
    let text = serde_json::to_string_pretty(value).map_err(|_| PinError::Invalid {
        path: path.to_path_buf(),
    })?;
    std::fs::write(&tmp, text).map_err(io)?;
    std::fs::rename(&tmp, path).map_err(io)
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

/// Accepts pending pin changes (`mcpbox pin accept`): moves
/// `<pin_file>.pending` over `pin_file`. Returns false when nothing was
/// pending.
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
/// `instructions` (if given) into `pin_file`, replacing what was there.
/// For tools that accept a list out of band.
pub fn pin_list(
    pin_file: &Path,
    list_result: &Value,
    instructions: Option<&str>,
) -> Result<(), PinError> {
    let mut pins = Pins {
        tools_pinned: true,
        ..Pins::default()
    };
    for tool in list_result
        .get("tools")
        .and_then(Value::as_array)
        .into_iter()
        .flatten()
    {
        if let Some(name) = tool.get("name").and_then(Value::as_str) {
            pins.tools.insert(name.to_string(), tool_digest(tool));
        }
    }
    pins.instructions = instructions.map(|i| crate::digest::sha256_hex(i.as_bytes()));
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
    /// The verdicts hold whether or not the writes succeed.
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
            let digest = tool_digest(tool);
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
            if take && pins.tools.get(name) != Some(&digest) {
                pins.tools.insert(name.to_string(), digest.clone());
                dirty = true;
            }
            if !take {
                withheld = true;
            }
            self.pending.tools.insert(name.to_string(), digest);
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
            let mut pending = pins.clone();
            pending.tools.extend(
                self.pending
                    .tools
                    .iter()
                    .map(|(k, v)| (k.clone(), v.clone())),
            );
            pending.instructions = self.pending.instructions.clone().or(pending.instructions);
            writes.push(PinWrite::new(&pending_path(&self.path), pending.to_json()));
        }
        (verdicts, writes)
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
    pub fn plan_instructions(
        &mut self,
        text: &str,
        establish: bool,
        accept: bool,
    ) -> (Option<(String, String)>, Vec<PinWrite>) {
        let digest = crate::digest::sha256_hex(text.as_bytes());
        let pins = self.pins.get_or_insert_with(Pins::default);
        self.pending.instructions = Some(digest.clone());
        match pins.instructions.clone() {
            Some(old) if old == digest => (None, Vec::new()),
            None if establish || accept => {
                pins.instructions = Some(digest);
                (None, vec![PinWrite::new(&self.path, pins.to_json())])
            }
            Some(_) if accept => {
                pins.instructions = Some(digest);
                (None, vec![PinWrite::new(&self.path, pins.to_json())])
            }
            old => {
                let mut pending = pins.clone();
                pending.tools.extend(
                    self.pending
                        .tools
                        .iter()
                        .map(|(k, v)| (k.clone(), v.clone())),
                );
                pending.instructions = Some(digest.clone());
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
