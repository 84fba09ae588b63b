//! The control socket's operations (`mcpbox sandboxes`, `mcpbox
//! artifacts`) on the lifecycle.

use std::path::Path;
use std::time::Instant;

use anyhow::Context;
use mcpbox_lifecycle::artifacts::Approved;
use mcpbox_lifecycle::id::Key;
use mcpbox_lifecycle::machine::Event as LifeEvent;
use mcpbox_lifecycle::registry::Record;
use mcpbox_lifecycle::{Artifact, Control, Exported, SandboxInfo, SnapshotInfo, State, Teardown};
use serde_json::json;

use super::teardown::{export, merge_rules};
use super::workspace::Workspace;
use super::{audit_lifecycle, fill, lock, Lifecycle};

/// The part of a snapshot that holds its servers' memory images.
const MEMORY_PART: &str = "memory";
/// In that part: whose sandbox it was (agent, server group).
const MEMORY_OWNER: &str = "owner.json";

impl Control for Lifecycle {
    fn desk(&self) -> Option<&dyn mcpbox_lifecycle::Desk> {
        self.desk.get().map(|d| d as &dyn mcpbox_lifecycle::Desk)
    }

    fn list(&self) -> Vec<SandboxInfo> {
        self.all_infos()
    }

    fn show(&self, id: &str) -> Result<SandboxInfo, String> {
        if let Ok(sb) = self.get(id) {
            return Ok(sb.info());
        }
        self.record(id).map(|r| self.info_of_record(&r))
    }

    fn pause(&self, id: &str) -> Result<SandboxInfo, String> {
        let sb = self.get(id)?;
        let how = sb.pause()?;
        // the state at the answer, and why: a call may have woken it
        let mut info = sb.info();
        info.note = Some(how.note(info.state));
        Ok(info)
    }

    fn resume(&self, id: &str) -> Result<SandboxInfo, String> {
        let sb = self.get(id)?;
        sb.resume()?;
        Ok(sb.info())
    }

    fn snapshot(
        &self,
        id: &str,
        archive: &Path,
        include_tmp: bool,
        memory: bool,
    ) -> Result<SnapshotInfo, String> {
        let ws = self.workspace_of(id)?;
        if memory && self.get(id).is_err() {
            return Err(format!(
                "sandbox {id} is not running here: there is no server's memory to keep"
            ));
        }
        // frozen while it is read, so the archive is one moment's state
        // (and the idle clock leaves it alone meanwhile: it must not pause,
        // and this then thaw, it)
        let live = self.get(id).ok();
        if let Some(sb) = &live {
            let mut g = lock(&sb.inner);
            sb.on(&mut g, LifeEvent::SnapshotBegin, Instant::now());
        }
        // With memory: each running gVisor server's checkpoint, taken
        // while the sandbox is frozen, in a folder of mcpbox's state that
        // the archive then holds as its part `memory`.
        let images = if memory {
            tempfile::Builder::new()
                .prefix(&format!(".memory-{id}-"))
                .tempdir_in(self.sandboxes_dir())
                .map_err(|e| format!("a folder for the memory images: {e}"))
                .and_then(|d| {
                    let dir = d.path().join("memory");
                    self.shared.backend.checkpoint(id, &dir)?;
                    // whose it is: a server's memory holds what it was
                    // given (its secrets too), so it is restored for this
                    // agent only
                    let (key, _) = self.owner(id)?;
                    let owner = json!({"agent": key.agent, "server": key.server});
                    std::fs::write(dir.join(MEMORY_OWNER), owner.to_string())
                        .map_err(|e| format!("{}: {e}", dir.display()))?;
                    Ok((d, dir))
                })
                .map(Some)
        } else {
            Ok(None)
        };
        let output = ws.output();
        let tmp = ws.tmp();
        let mut parts: Vec<(&str, &Path)> = vec![("output", output.as_path())];
        if include_tmp {
            parts.push(("tmp", tmp.as_path()));
        }
        if let Ok(Some((_, dir))) = &images {
            parts.push((MEMORY_PART, dir.as_path()));
        }
        // the built-in server's own state (its checkpoints, its code files)
        // is never part of a sandbox's snapshot (issue 26): it is mcpbox's
        let own = format!("tmp/{}", mcpbox_builtin::STATE_DIR);
        let result = match &images {
            Err(e) => Err(e.clone()),
            Ok(_) => mcpbox_lifecycle::snapshot::write_excluding(&parts, archive, &[own.as_str()])
                .map_err(|e| e.to_string()),
        };
        drop(images);
        if let Some(sb) = &live {
            let mut g = lock(&sb.inner);
            sb.on(&mut g, LifeEvent::SnapshotEnd, Instant::now());
        }
        let info = result?;
        let (key, audit) = self.owner(id)?;
        audit_lifecycle(
            &audit,
            id,
            &key,
            "snapshot",
            json!({"archive": info.archive, "entries": info.entries, "bytes": info.bytes, "manifest_sha256": info.manifest_sha256, "tmp": include_tmp, "memory": memory}),
        );
        Ok(info)
    }

    fn restore(
        &self,
        archive: &Path,
        agent: &str,
        server: &str,
        task: Option<&str>,
    ) -> Result<SandboxInfo, String> {
        let life = self
            .servers
            .get(server)
            .ok_or_else(|| format!("no server {server} in the config"))?;
        let key = Key {
            agent: agent.to_string(),
            server: life.group.clone(),
            task: task.map(String::from),
        };
        let id = key.id(&self.salt);
        let exists = || {
            format!(
                "sandbox {id} of {agent} on {server} exists; destroy it first (`mcpbox sandboxes destroy {id}`)"
            )
        };
        // A first look, so that a restore onto an existing sandbox fails
        // before it reads the archive; the lifecycle's lock is not held
        // meanwhile (every other sandbox's sessions and ops go on), so it
        // is looked at again when the sandbox is registered.
        if lock(&self.map).contains_key(&id) || self.record(&id).is_ok() {
            return Err(exists());
        }
        // Checked whole and extracted, and the workspace built (template,
        // modes, owners), all in a staging folder of this restore alone
        // beside the workspaces, without the lock: a large archive delays
        // no one else.
        let staging = tempfile::Builder::new()
            .prefix(&format!(".restore-{id}-"))
            .tempdir_in(self.sandboxes_dir())
            .map_err(|e| format!("a staging folder for the restore: {e}"))?;
        let built = Workspace::at(staging.path().join("ws"));
        let prepared = (|| -> anyhow::Result<()> {
            fill(&built, life, self.workspace_size(life))?;
            // extracted inside the new workspace's volume: on its
            // filesystem (the moves below are renames) and within its
            // bound (an archive larger than the workspace fails here, and
            // never fills the state directory's filesystem)
            let extracted = built.volume().join(".restore");
            let limits = mcpbox_lifecycle::snapshot::Limits {
                parts: vec!["output".into(), "tmp".into(), MEMORY_PART.into()],
                ..Default::default()
            };
            mcpbox_lifecycle::snapshot::restore_with(archive, &extracted, &limits)
                .map_err(|e| anyhow::anyhow!("{e}"))?;
            // the servers' memory, for their first start (Backend::start),
            // and for the agent whose it was only
            let memory = extracted.join(MEMORY_PART);
            if memory.is_dir() {
                self.shared
                    .backend
                    .keeps_memory()
                    .map_err(|e| anyhow::anyhow!("the snapshot holds servers' memory: {e}"))?;
                let owner: serde_json::Value = std::fs::read(memory.join(MEMORY_OWNER))
                    .ok()
                    .and_then(|b| serde_json::from_slice(&b).ok())
                    .unwrap_or_default();
                if owner["agent"].as_str() != Some(agent)
                    || owner["server"].as_str() != Some(&key.server)
                {
                    anyhow::bail!(
                        "the snapshot holds the memory of {}'s servers ({}): a server's memory \
                         holds what it was given, secrets included, so it is restored for that \
                         agent and server only",
                        owner["agent"].as_str().unwrap_or("an unknown agent"),
                        owner["server"].as_str().unwrap_or("unknown")
                    );
                }
                std::fs::rename(&memory, built.volume().join(super::backend::MEMORY))
                    .context("moving the restored memory images in")?;
            }
            for part in ["output", "tmp"] {
                let from = extracted.join(part);
                if from.is_dir() {
                    let to = built.volume().join(part);
                    std::fs::remove_dir_all(&to).ok();
                    std::fs::rename(&from, &to)
                        .with_context(|| format!("moving the restored {part} in"))?;
                    if crate::preflight::is_root() {
                        chown_tree(&to, mcpbox_sandbox::ROOT_RUN_HOST_ID)?;
                    }
                }
            }
            std::fs::remove_dir_all(&extracted).context("removing the extraction's folder")?;
            built.ensure(self.workspace_size(life))
        })();
        if let Err(e) = prepared {
            // its volume unmounted before the staging folder goes
            let _ = built.remove();
            return Err(format!("{e:#}"));
        }
        // Registered under the lock: still no such sandbox (a session or
        // another restore may have made it meanwhile), then the built
        // workspace moved into place (one rename) and recorded.
        let ws = Workspace::at(self.sandboxes_dir().join(&id));
        let map = lock(&self.map);
        if map.contains_key(&id) || self.record(&id).is_ok() || lock(&self.tearing).contains(&id) {
            return Err(exists());
        }
        let now = mcpbox_audit::now_ms();
        let made = (|| -> anyhow::Result<()> {
            std::fs::rename(&built.root, &ws.root).with_context(|| {
                format!("moving the restored workspace to {}", ws.root.display())
            })?;
            lock(&self.shared.registry).put(&Record {
                id: id.clone(),
                key: key.clone(),
                template: life.template.as_ref().map(|(n, _)| n.clone()),
                state: State::Stopped,
                workspace: ws.root.clone(),
                created_ms: now,
                updated_ms: now,
                owner_pid: std::process::id(),
            })?;
            Ok(())
        })();
        drop(map);
        drop(staging);
        if let Err(e) = made {
            let _ = ws.remove();
            return Err(format!("{e:#}"));
        }
        audit_lifecycle(
            &life.audit,
            &id,
            &key,
            "restored",
            json!({"archive": archive}),
        );
        self.show(&id)
    }

    fn destroy(&self, id: &str, approved: &Approved) -> Result<Teardown, String> {
        if !mcpbox_lifecycle::id::is_id(id) {
            return Err(format!("{id:?} is not a sandbox id"));
        }
        self.teardown(id, "mcpbox sandboxes destroy", approved)
    }

    fn artifacts(&self, id: &str) -> Result<Vec<Artifact>, String> {
        let ws = self.workspace_of(id)?;
        let (patterns, max) = merge_rules(&self.artifact_rules(id)?);
        if patterns.is_empty() {
            return Ok(Vec::new());
        }
        mcpbox_lifecycle::artifacts::list(&ws.output(), &patterns, max).map_err(|e| e.to_string())
    }

    fn export(&self, id: &str, dest: &Path, approved: &Approved) -> Result<Vec<Exported>, String> {
        let ws = self.workspace_of(id)?;
        let rules = self.artifact_rules(id)?;
        let (key, audit) = self.owner(id)?;
        export(&ws, &rules, approved, dest, &audit, id, &key).map(|e| e.out)
    }
}

/// Gives `root` and everything under it (never following a link) to `uid`.
fn chown_tree(root: &Path, uid: u32) -> anyhow::Result<()> {
    std::os::unix::fs::lchown(root, Some(uid), Some(uid))
        .with_context(|| format!("chown {}", root.display()))?;
    if std::fs::symlink_metadata(root)?.is_dir() {
        for e in std::fs::read_dir(root)? {
            chown_tree(&e?.path(), uid)?;
        }
    }
    Ok(())
}
