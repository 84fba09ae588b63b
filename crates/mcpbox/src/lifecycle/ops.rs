//! The control socket's operations (`mcpbox sandboxes`, `mcpbox
//! artifacts`) on the lifecycle.

use std::path::Path;

use anyhow::Context;
use mcpbox_lifecycle::id::Key;
use mcpbox_lifecycle::registry::Record;
use mcpbox_lifecycle::{Artifact, Control, Exported, SandboxInfo, SnapshotInfo, State, Teardown};
use serde_json::json;

use super::teardown::{export, merge_rules};
use super::workspace::Workspace;
use super::{audit_lifecycle, fill, lock, Lifecycle};

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
        sb.pause()?;
        Ok(sb.info())
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
    ) -> Result<SnapshotInfo, String> {
        let ws = self.workspace_of(id)?;
        // frozen while it is read, so the archive is one moment's state
        let live = self.get(id).ok();
        let froze = match &live {
            Some(sb) => {
                let mut g = lock(&sb.inner);
                let froze = g.state == State::Running
                    && sb.freezer.is_some()
                    && self.shared.backend.freeze(id).is_ok();
                // the idle clock must not pause (and this then thaw) it meanwhile
                g.snapshotting = froze;
                froze
            }
            None => false,
        };
        let output = ws.output();
        let tmp = ws.tmp();
        let mut parts: Vec<(&str, &Path)> = vec![("output", output.as_path())];
        if include_tmp {
            parts.push(("tmp", tmp.as_path()));
        }
        // the built-in server's own state (its checkpoints, its code files)
        // is never part of a sandbox's snapshot (issue 26): it is mcpbox's
        let own = format!("tmp/{}", mcpbox_builtin::STATE_DIR);
        let result = mcpbox_lifecycle::snapshot::write_excluding(&parts, archive, &[own.as_str()])
            .map_err(|e| e.to_string());
        if let (true, Some(sb)) = (froze, &live) {
            let mut g = lock(&sb.inner);
            let _ = self.shared.backend.thaw(id);
            g.snapshotting = false;
        }
        let info = result?;
        let (key, audit) = self.owner(id)?;
        audit_lifecycle(
            &audit,
            id,
            &key,
            "snapshot",
            json!({"archive": info.archive, "entries": info.entries, "bytes": info.bytes, "manifest_sha256": info.manifest_sha256, "tmp": include_tmp}),
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
        let map = lock(&self.map);
        if map.contains_key(&id) || self.record(&id).is_ok() {
            return Err(format!(
                "sandbox {id} of {agent} on {server} exists; destroy it first (`mcpbox sandboxes destroy {id}`)"
            ));
        }
        let ws = Workspace::at(self.sandboxes_dir().join(&id));
        // checked whole, then written beside the workspace, then moved in
        let staging = self.sandboxes_dir().join(format!(".restore-{id}"));
        let _ = std::fs::remove_dir_all(&staging);
        mcpbox_lifecycle::snapshot::restore(archive, &staging).map_err(|e| e.to_string())?;
        let now = mcpbox_audit::now_ms();
        let made = (|| -> anyhow::Result<()> {
            fill(&ws, life)?;
            for part in ["output", "tmp"] {
                let from = staging.join(part);
                if from.is_dir() {
                    let to = ws.root.join(part);
                    std::fs::remove_dir_all(&to).ok();
                    std::fs::rename(&from, &to)
                        .with_context(|| format!("moving the restored {part} in"))?;
                    if crate::preflight::is_root() {
                        chown_tree(&to, mcpbox_sandbox::ROOT_RUN_HOST_ID)?;
                    }
                }
            }
            ws.ensure()?;
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
        std::fs::remove_dir_all(&staging).ok();
        drop(map);
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

    fn destroy(&self, id: &str, allow_large: bool) -> Result<Teardown, String> {
        if !mcpbox_lifecycle::id::is_id(id) {
            return Err(format!("{id:?} is not a sandbox id"));
        }
        self.teardown(id, "mcpbox sandboxes destroy", allow_large)
    }

    fn artifacts(&self, id: &str) -> Result<Vec<Artifact>, String> {
        let ws = self.workspace_of(id)?;
        let (patterns, max) = merge_rules(&self.artifact_rules(id)?);
        if patterns.is_empty() {
            return Ok(Vec::new());
        }
        mcpbox_lifecycle::artifacts::list(&ws.output(), &patterns, max).map_err(|e| e.to_string())
    }

    fn export(&self, id: &str, dest: &Path, allow_large: bool) -> Result<Vec<Exported>, String> {
        let ws = self.workspace_of(id)?;
        let rules = self.artifact_rules(id)?;
        let (key, audit) = self.owner(id)?;
        export(&ws, &rules, allow_large, dest, &audit, id, &key).map(|e| e.out)
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
