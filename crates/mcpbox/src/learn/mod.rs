//! `mcpbox learn [--policy BASE] [--output FILE] [--force] -- CMD`: `run`
//! with an observing variant of BASE, then a proposed least-privilege
//! policy written from what the session's audit records say it did.
//!
//! The observing variant is BASE with three changes: the audit goes to a
//! private database of this session (removed at the end), unlisted hosts
//! are allowed and recorded instead of refused (the proxy still refuses
//! loopback, private, link-local and metadata addresses after resolving),
//! and the server name is the proposed policy's, so the tool list the
//! session pins is the one the proposed policy starts from. Everything
//! else (mounts, secrets, limits, tool rules) is BASE's. The proposal
//! narrows BASE and never widens it, but for the hosts actually contacted
//! (BASE's `deny` kept). The generator is `mcpbox_policy::learn` (pure, beside the policy it generates). The
//! programs the sandbox executes are watched by `execs.rs` (fanotify's
//! `FAN_OPEN_EXEC`), turned on here only, for `process.allow_exec`.

pub mod execs;

use std::io::Write;
use std::path::{Path, PathBuf};

use anyhow::{bail, Context};
use mcpbox_audit::{Event, Kind, Query, SqliteStore, Verdict};
use mcpbox_policy::Policy;
use serde_json::Value;

use crate::failure::Failure;
use crate::preflight::Loaded;
use crate::run;

use mcpbox_policy::learn::{propose, Call, Connection, FileSeen, Observed, Programs};

/// `learn`'s own options.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Options {
    /// Where the proposal goes; `-` is stdout.
    pub output: Option<PathBuf>,
    /// Overwrite an existing output file.
    pub force: bool,
}

/// Where the proposed policy is written.
#[derive(Debug, Clone, PartialEq, Eq)]
enum Target {
    Stdout,
    File(PathBuf),
}

/// A learning session being prepared: what it needs after the run.
pub struct Learning {
    target: Target,
    force: bool,
    name: String,
    /// BASE as loaded (paths absolute), before the observing changes.
    base: Policy,
    /// The private audit database, in a directory removed on drop.
    db: PathBuf,
    _dir: tempfile::TempDir,
}

/// The proposal's file when none is given: `<BASE stem>.learned.toml`
/// beside BASE, else `learned.toml` in the current directory.
fn default_target(options: &Options, base: Option<&Path>) -> Target {
    match (&options.output, base) {
        (Some(p), _) if p.as_os_str() == "-" => Target::Stdout,
        (Some(p), _) => Target::File(p.clone()),
        (None, Some(b)) => {
            let stem = b
                .file_stem()
                .map(|s| s.to_string_lossy().into_owned())
                .unwrap_or_else(|| "policy".into());
            Target::File(b.with_file_name(format!("{stem}.learned.toml")))
        }
        (None, None) => Target::File(PathBuf::from("learned.toml")),
    }
}

/// Turns `loaded` (BASE) into the observing policy and says where the
/// proposal will go. Refuses before anything runs when that file exists
/// and `--force` was not given, so no session is wasted.
pub fn prepare(loaded: &mut Loaded, options: &Options) -> anyhow::Result<Learning> {
    let target = default_target(options, loaded.file.as_deref());
    let name = match &target {
        Target::File(path) => {
            if !options.force && std::fs::symlink_metadata(path).is_ok() {
                bail!(
                    "{} exists: choose another --output, or pass --force to overwrite it",
                    path.display()
                );
            }
            // the name the file would get without `[server] name`
            mcpbox_policy::name_from_file(path)
        }
        Target::Stdout => loaded.policy.name().to_string(),
    };
    let dir = tempfile::Builder::new()
        .prefix("mcpbox-learn-")
        .tempdir()
        .context("a private directory for the session's audit records")?;
    let db = dir.path().join("learn.db");
    let base = loaded.policy.clone();
    let p = &mut loaded.policy;
    p.audit.path = Some(db.clone());
    p.network.unlisted = mcpbox_policy::Unlisted::Approve;
    p.server.name = Some(name.clone());
    Ok(Learning {
        target,
        force: options.force,
        name,
        base,
        db,
        _dir: dir,
    })
}

impl Learning {
    /// Runs the session as `run` does, then writes the proposal. A session
    /// that could not start writes nothing.
    pub fn run(self, loaded: Loaded, spec: mcpbox_sandbox::Spec) -> Result<i32, Failure> {
        // the command as given (runtime discovery may run a bare name by
        // the path it found): the proposal's command line and the pins'
        // identity are the ones `run` will use
        let given = loaded.argv.clone().unwrap_or_else(|| spec.argv.clone());
        let command: Vec<String> = given
            .iter()
            .map(|a| a.to_string_lossy().into_owned())
            .collect();
        let pin_file = run::pin_file(&loaded, &run::command_identity(&given));
        let own = execs::own_programs(&spec);
        // sandbox paths, as the programs seen are: the targets of the
        // read-only mounts (the runtime's and the policy's)
        let read_only: Vec<String> = spec
            .mounts
            .iter()
            .filter(|m| !m.writable)
            .map(|m| m.at.to_string_lossy().into_owned())
            .collect();
        let log = execs::enable();
        let code = run::run_with(
            loaded,
            spec,
            false,
            crate::egress::HostApprover::record_and_allow(),
        )
        .map_err(Failure::from_run)?;
        let ran = log.finish();
        let programs = Programs {
            mode: ran.mode.map(str::to_string),
            refused: ran.refused,
            seen: ran.programs.into_iter().collect(),
            cut: ran.cut,
            own,
            dirs: ran.dirs,
            read_only,
        };
        self.write(&command, &pin_file, programs)
            .map_err(|e| Failure::at("learn", e))?;
        Ok(code)
    }

    fn write(&self, command: &[String], pin_file: &Path, programs: Programs) -> anyhow::Result<()> {
        let mut seen = observed(&self.db)?;
        seen.programs = Some(programs);
        seen.command = command.join(" ");
        seen.program = command.first().cloned();
        if let Some(pins) = mcpbox_gateway::read_pins(pin_file)
            .with_context(|| format!("reading the pins {}", pin_file.display()))?
        {
            if pins.tools_pinned {
                seen.listed = Some(pins.tools.keys().cloned().collect());
                seen.pin_file = Some(pin_file.display().to_string());
            }
        }
        let text = propose(&self.base, &self.name, &seen).map_err(anyhow::Error::msg)?;
        let checked_as = match &self.target {
            Target::File(p) => std::path::absolute(p).unwrap_or_else(|_| p.clone()),
            Target::Stdout => PathBuf::from("learned.toml"),
        };
        // what `mcpbox check` would say: a proposal that fails it is our bug
        if let Err(d) = mcpbox_policy::parse(&text, &checked_as) {
            bail!("the proposed policy does not pass mcpbox check (please report it): {d}");
        }
        match &self.target {
            Target::Stdout => {
                let mut out = std::io::stdout().lock();
                out.write_all(text.as_bytes())
                    .and_then(|()| out.flush())
                    .context("writing the proposed policy to stdout")?;
            }
            Target::File(path) => {
                write_file(path, &text, self.force)?;
                eprintln!(
                    "mcpbox: proposed policy written to {} ({} tool calls, {} connections seen); \
                     review it, then: mcpbox run --policy {} -- {}",
                    path.display(),
                    seen.calls.len(),
                    seen.connections.len(),
                    path.display(),
                    seen.command
                );
            }
        }
        Ok(())
    }
}

/// Writes `text` to `path`: a new file (never following or replacing one
/// that appeared meanwhile), or with `force` a replacement put in place
/// by a rename, so a reader never sees half a policy.
fn write_file(path: &Path, text: &str, force: bool) -> anyhow::Result<()> {
    if !force {
        let mut f = std::fs::OpenOptions::new()
            .write(true)
            .create_new(true)
            .open(path)
            .with_context(|| {
                format!(
                    "creating {} (if it exists now, choose another --output or pass --force)",
                    path.display()
                )
            })?;
        return f
            .write_all(text.as_bytes())
            .and_then(|()| f.sync_all())
            .with_context(|| format!("writing {}", path.display()));
    }
    let dir = match path.parent() {
        Some(d) if !d.as_os_str().is_empty() => d,
        _ => Path::new("."),
    };
    let mut tmp = tempfile::NamedTempFile::new_in(dir)
        .with_context(|| format!("a temporary file in {}", dir.display()))?;
    tmp.write_all(text.as_bytes())
        .and_then(|()| tmp.as_file().sync_all())
        .with_context(|| format!("writing {}", tmp.path().display()))?;
    tmp.persist(path)
        .with_context(|| format!("replacing {}", path.display()))?;
    Ok(())
}

/// The session's records in the private database, as the generator's
/// input.
fn observed(db: &Path) -> anyhow::Result<Observed> {
    let store = SqliteStore::open(db)
        .with_context(|| format!("opening the session's audit records {}", db.display()))?;
    let events = store
        .query(&Query::default())
        .context("reading the session's audit records")?;
    Ok(from_events(&events))
}

/// The records, as the generator's input.
fn from_events(events: &[Event]) -> Observed {
    let mut seen = Observed::default();
    for e in events {
        let d = &e.detail;
        match e.kind {
            Some(Kind::SessionStart) => {
                seen.files_mode = d["files"].as_str().map(str::to_string);
            }
            Some(Kind::ToolCall) => seen.calls.push(Call {
                tool: e.tool.clone().unwrap_or_default(),
                allowed: e.decision == Some(Verdict::Allow),
                files: d["files"]
                    .as_array()
                    .map(|fs| fs.iter().filter_map(file_seen).collect())
                    .unwrap_or_default(),
                truncated: d["files_truncated"] == Value::Bool(true),
                span: e.duration_ms.and_then(|ms| {
                    let ms = i64::try_from(ms).ok()?;
                    Some((e.time_ms.saturating_sub(ms), e.time_ms))
                }),
            }),
            // The sandbox's resolver asking about a name (issue 31): the
            // connection, if one follows, has its own record with its port.
            Some(Kind::Network) if d["method"] == mcpbox_egress::RESOLVE_METHOD => {}
            // A packet the namespace refused (UDP, IPv6): never a host to
            // propose, the capture cannot carry it.
            Some(Kind::Network) if d["method"] == mcpbox_egress::REFUSED_METHOD => {}
            Some(Kind::Network) => seen.connections.push(Connection {
                host: d["host"].as_str().unwrap_or_default().to_string(),
                port: d["port"]
                    .as_u64()
                    .and_then(|p| u16::try_from(p).ok())
                    .unwrap_or(0),
                connected: e.decision == Some(Verdict::Allow) && !d["address"].is_null(),
                refused: (e.decision != Some(Verdict::Allow))
                    .then(|| e.reason.clone().unwrap_or_else(|| "refused".into())),
                tools: d["calls"]
                    .as_array()
                    .map(|cs| {
                        cs.iter()
                            .filter_map(|c| c["tool"].as_str().map(str::to_string))
                            .collect()
                    })
                    .unwrap_or_default(),
            }),
            Some(Kind::ServerExit) => seen.exits.extend(e.exit_status),
            _ => {}
        }
    }
    seen
}

/// One entry of `detail.files`: a rename or removal counts as a write.
fn file_seen(v: &Value) -> Option<FileSeen> {
    Some(FileSeen {
        path: v["path"].as_str()?.to_string(),
        read: v["read"] == Value::Bool(true),
        written: v["written"] == Value::Bool(true)
            || v["deleted"] == Value::Bool(true)
            || v["moved_from"].is_string(),
    })
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    #[test]
    fn the_default_output_is_beside_the_base_and_named_after_it() {
        let o = Options {
            output: None,
            force: false,
        };
        assert_eq!(
            default_target(&o, Some(Path::new("/p/fs.toml"))),
            Target::File(PathBuf::from("/p/fs.learned.toml"))
        );
        assert_eq!(
            default_target(&o, None),
            Target::File(PathBuf::from("learned.toml"))
        );
        let dash = Options {
            output: Some(PathBuf::from("-")),
            force: false,
        };
        assert_eq!(default_target(&dash, None), Target::Stdout);
    }

    #[test]
    fn records_become_observations() {
        let call = Event {
            kind: Some(Kind::ToolCall),
            tool: Some("write_file".into()),
            decision: Some(Verdict::Allow),
            detail: serde_json::json!({"files": [
                {"path": "/workspace/output/a", "read": false, "written": false,
                 "moved_from": "/workspace/output/b", "deleted": false},
                {"path": "/workspace/input/c", "read": true, "written": false,
                 "moved_from": null, "deleted": false}
            ], "files_truncated": true}),
            ..Event::default()
        };
        let net = Event {
            kind: Some(Kind::Network),
            decision: Some(Verdict::Deny),
            reason: Some("network.private_address".into()),
            detail: serde_json::json!({"host": "10.0.0.1", "port": 80, "address": null}),
            ..Event::default()
        };
        let seen = from_events(&[call, net]);
        assert!(seen.calls[0].files[0].written);
        assert!(seen.calls[0].files[1].read);
        assert!(seen.calls[0].truncated && seen.calls[0].allowed);
        assert!(!seen.connections[0].connected);
        assert_eq!(
            seen.connections[0].refused.as_deref(),
            Some("network.private_address")
        );
    }
}
