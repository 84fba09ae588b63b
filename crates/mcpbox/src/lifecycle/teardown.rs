//! The teardown of a sandbox, in its order: sessions closed, artifacts
//! exported (a failed export keeps the workspace), secrets revoked, what
//! is left killed, cgroups and workspace removed, then checked from the
//! host and audited.

use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use mcpbox_audit::{Kind, Sink};
use mcpbox_lifecycle::artifacts::Approved;
use mcpbox_lifecycle::id::Key;
use mcpbox_lifecycle::machine::Event as LifeEvent;
use mcpbox_lifecycle::{Artifact, Exported, State, Teardown};
use mcpbox_policy::SecretSource;
use serde_json::json;

use super::workspace::{self, Workspace};
use super::{audit_lifecycle, lock, sandbox_event, Lifecycle};

/// How long a secret's `revoke` command may run.
pub const REVOKE_TIMEOUT: Duration = Duration::from_secs(10);

impl Lifecycle {
    /// Stops, exports, revokes, removes and checks: the teardown of `id`.
    pub(super) fn teardown(
        &self,
        id: &str,
        why: &str,
        approved: &Approved,
    ) -> Result<Teardown, String> {
        if !mcpbox_lifecycle::id::is_id(id) {
            return Err(format!("{id:?} is not a sandbox id"));
        }
        // live, or not: a stopped sandbox of a previous run. Not live, it
        // is marked as being torn down while the map is held, so that no
        // session makes it live again under the teardown (`join`); the
        // mark goes when the teardown returns.
        let (sb, _mark) = {
            let map = lock(&self.map);
            match map.get(id) {
                Some(sb) => (Some(sb.clone()), None),
                None => {
                    if !lock(&self.tearing).insert(id.to_string()) {
                        return Err(format!("sandbox {id} is already being destroyed"));
                    }
                    let mark = TearingMark {
                        tearing: &self.tearing,
                        id: id.to_string(),
                    };
                    (None, Some(mark))
                }
            }
        };
        let (ws, key, audit, rules, revoke) = match &sb {
            Some(sb) => {
                let (rules, revoke) = {
                    let mut g = lock(&sb.inner);
                    let now = std::time::Instant::now();
                    if let Some(r) = sb.on(&mut g, LifeEvent::DestroyBegin, now).refused {
                        return Err(sb.refusal(r));
                    }
                    (g.artifacts.clone(), g.revoke.clone())
                };
                sb.stop_sessions();
                (
                    sb.workspace.clone(),
                    sb.key.clone(),
                    sb.audit.clone(),
                    rules,
                    revoke,
                )
            }
            None => {
                let r = self.record(id)?;
                let rules = self
                    .lives_of(&r.key.server)
                    .map(|l| l.artifacts.clone())
                    .collect();
                let revoke = self
                    .lives_of(&r.key.server)
                    .flat_map(|l| l.revoke.clone())
                    .collect();
                (
                    Workspace::at(r.workspace),
                    r.key,
                    self.shared.audit.clone(),
                    rules,
                    revoke,
                )
            }
        };
        let backend = &self.shared.backend;
        let _ = backend.thaw(id);
        backend.stop(id);
        let mut t = Teardown {
            id: id.to_string(),
            ..Teardown::default()
        };
        // the artifacts, before the workspace goes
        let dest = self
            .shared
            .state_dir
            .join("artifacts")
            .join(id)
            .join(mcpbox_audit::now_ms().to_string());
        // an export that fails keeps the workspace: no artifact is lost to
        // a teardown (the record stays for another try)
        let mut keep_workspace = false;
        if rules.iter().any(|(p, _)| !p.is_empty()) {
            let made = dest
                .parent()
                .map_or(Ok(()), workspace::private_dir)
                .map_err(|e| format!("{e:#}"));
            match made.and_then(|()| export(&ws, &rules, approved, &dest, &audit, id, &key)) {
                Ok(exports) => {
                    // an artifact a human has not approved yet is not lost
                    // with the workspace: it stays, and the teardown says why
                    let waiting = exports.waiting_for_approval();
                    t.exported = exports.out;
                    if !waiting.is_empty() {
                        keep_workspace = true;
                        t.left.push(format!(
                            "{} artifact(s) over [artifacts] max_size wait for a human ({}): the workspace {} is kept; `mcpbox sandboxes destroy {id} {}` exports them at those sizes and finishes",
                            waiting.len(),
                            waiting.join(", "),
                            ws.root.display(),
                            waiting
                                .iter()
                                .map(|a| format!("--approve-large {}", shell_word(a)))
                                .collect::<Vec<_>>()
                                .join(" ")
                        ));
                    }
                }
                Err(e) => {
                    keep_workspace = true;
                    t.left.push(format!(
                        "artifacts not exported ({e}); the workspace {} is kept",
                        ws.root.display()
                    ));
                }
            }
        }
        // the credentials go with the sandbox: not while its workspace is
        // kept for another try (the next try revokes them, once)
        if !keep_workspace {
            for (name, source, argv) in &revoke {
                let outcome = revoke_secret(name, source, argv);
                t.revoked.push((name.clone(), outcome));
            }
        }
        if let Err(e) = backend.destroy(id) {
            t.left.push(e);
        }
        if !keep_workspace {
            if let Err(e) = ws.remove() {
                t.left.push(format!("{e:#}"));
            }
        }
        // checked from the host: nothing of it may be left
        t.left.extend(backend.leftovers(id));
        let volume = ws.volume();
        let kept = keep_workspace.then_some(volume.as_path());
        t.left.extend(workspace::mounts_under(&ws.root, kept));
        if ws.root.exists() && !keep_workspace {
            t.left.push(format!("file {}", ws.root.display()));
        }
        // clean: the record goes; not clean: it stays (stopped), so that
        // `destroy` can be asked again and the next start tries again
        let kept = if t.clean() {
            lock(&self.shared.registry).remove(id)
        } else {
            lock(&self.shared.registry).set_state(id, State::Stopped, mcpbox_audit::now_ms())
        };
        if let Err(e) = kept {
            t.left.push(e.to_string());
        }
        lock(&self.map).remove(id);
        if let Some(sb) = &sb {
            let mut g = lock(&sb.inner);
            sb.on(&mut g, LifeEvent::Destroyed, std::time::Instant::now());
        }
        audit_lifecycle(
            &audit,
            id,
            &key,
            "destroyed",
            json!({
                "why": why,
                "clean": t.clean(),
                "left": t.left,
                "exported": t.exported.len(),
                "revoked": t.revoked.iter().map(|(n, o)| json!({"secret": n, "outcome": o})).collect::<Vec<_>>(),
            }),
        );
        if !t.clean() {
            tracing::error!(sandbox = %id, left = ?t.left, "teardown left something behind");
        }
        Ok(t)
    }
}

/// A record-only sandbox being torn down ([`Lifecycle::teardown`]); the
/// mark is removed when this is dropped, whichever way the teardown ends.
struct TearingMark<'a> {
    tearing: &'a std::sync::Mutex<std::collections::HashSet<String>>,
    id: String,
}

impl Drop for TearingMark<'_> {
    fn drop(&mut self) {
        lock(self.tearing).remove(&self.id);
    }
}

/// Copies out the artifacts of `ws` by `rules` (patterns, size limit of
/// each server that ran there), each audited with its digest; refused
/// matches are audited with the reason.
pub(super) fn export(
    ws: &Workspace,
    rules: &[(Vec<String>, u64)],
    approved: &Approved,
    dest: &Path,
    audit: &Arc<dyn Sink>,
    id: &str,
    key: &Key,
) -> Result<Exports, String> {
    let (patterns, max_size) = merge_rules(rules);
    if patterns.is_empty() {
        return Err("the policy declares no [artifacts] patterns: nothing may leave".into());
    }
    let listed = mcpbox_lifecycle::artifacts::list(&ws.output(), &patterns, max_size)
        .map_err(|e| e.to_string())?;
    let out =
        mcpbox_lifecycle::artifacts::export(&ws.output(), &patterns, max_size, approved, dest)
            .map_err(|e| e.to_string())?;
    for a in &out {
        let mut e = sandbox_event(Kind::Artifact, id, key);
        e.files_written = vec![a.path.clone()];
        e.detail = json!({"action": "exported", "path": a.path, "size": a.size, "sha256": a.sha256, "dest": dest});
        audit.record(e);
    }
    let refused: Vec<Artifact> = listed
        .into_iter()
        .filter(|a| a.refused.is_some() && !out.iter().any(|o| o.path == a.path))
        .collect();
    for a in &refused {
        let mut e = sandbox_event(Kind::Artifact, id, key);
        e.reason = Some(mcpbox_policy::Reason::ArtifactRefused.as_str().into());
        e.detail = json!({"action": "refused", "path": a.path, "size": a.size, "why": a.refused});
        audit.record(e);
    }
    Ok(Exports { out, refused })
}

/// What an export copied, and what matched but stayed (with why).
pub(super) struct Exports {
    pub(super) out: Vec<Exported>,
    pub(super) refused: Vec<Artifact>,
}

impl Exports {
    /// The refused artifacts only a human's approval would let out (over
    /// the size limit), each as the `PATH=BYTES` that approves it at the
    /// size it has now.
    fn waiting_for_approval(&self) -> Vec<String> {
        self.refused
            .iter()
            .filter(|a| {
                a.refused
                    .as_deref()
                    .is_some_and(|r| r.ends_with("needs approval"))
            })
            .map(|a| mcpbox_lifecycle::artifacts::approval_arg(&a.path, a.size))
            .collect()
    }
}

/// `arg` quoted for a POSIX shell when it needs it (the teardown's
/// message is a command line a human copies).
fn shell_word(arg: &str) -> String {
    if arg
        .bytes()
        .all(|b| b.is_ascii_alphanumeric() || b"=._-/+:,@".contains(&b))
    {
        arg.to_string()
    } else {
        format!("'{}'", arg.replace('\'', "'\\''"))
    }
}

/// The patterns of every server, and the smallest size limit among them.
pub(super) fn merge_rules(rules: &[(Vec<String>, u64)]) -> (Vec<String>, u64) {
    let mut patterns: Vec<String> = Vec::new();
    let mut max = u64::MAX;
    for (p, m) in rules {
        for x in p {
            if !patterns.contains(x) {
                patterns.push(x.clone());
            }
        }
        max = max.min(*m);
    }
    (patterns, if max == u64::MAX { 0 } else { max })
}

/// Runs a secret's `revoke` command on the host
/// ([`HostCommand`](mcpbox_gateway::host_command::HostCommand): `PATH`,
/// `HOME` and `LANG` of mcpbox's environment and, on purpose, the value in
/// `MCPBOX_SECRET_VALUE` and the name in `MCPBOX_SECRET_NAME`; its own
/// process group, killed whole at [`REVOKE_TIMEOUT`] and when it ends; no
/// stdin, output discarded). The value is loaded again from its source.
/// Returns how it ended, for the record (never the value).
fn revoke_secret(name: &str, source: &SecretSource, argv: &[String]) -> String {
    let value = match mcpbox_gateway::load_secret(name, source) {
        Ok(v) => v,
        Err(e) => return format!("not run: {e}"),
    };
    let Some(cmd) = mcpbox_gateway::host_command::HostCommand::new(argv, REVOKE_TIMEOUT) else {
        return "not run: empty command".into();
    };
    let cmd = cmd
        .env("MCPBOX_SECRET_NAME", name)
        .env("MCPBOX_SECRET_VALUE", value);
    match cmd.run() {
        Ok(out) => out.ended.describe(),
        Err(e) => format!("failed to start {}: {e}", cmd.program()),
    }
}
