//! The sandbox lifecycle of `mcpbox serve`: sandboxes that outlive one
//! session, with idle pause, stop and destroy, snapshots, artifacts and a
//! verified teardown.
//!
//! The states and what moves a sandbox between them are
//! [`mcpbox_lifecycle::machine`]'s, an I/O-free core (its module doc
//! draws them, once): this module is its driver. Each [`Sandbox`] holds a
//! [`Machine`] under its lock, hands it every event (a session joins or
//! leaves, a host message, a relay's status, the timer's tick, a control
//! operation) and carries out its effects: the freeze and thaw through the
//! [`Backend`], the park and wake through the sessions' feeds, the
//! registry's state, the audit record, the teardown (`teardown.rs`, which
//! also closes the sessions).
//!
//! A sandbox is keyed by (agent, server or shared group, task)
//! ([`mcpbox_lifecycle::id::Key`]); its id is stable, so a restarted
//! `serve` finds it again in the registry (`<state>/sandboxes.db`). Each
//! session of the sandbox is a relay with its own server process; every
//! one of them starts through the [`Backend`] (here: under the sandbox's
//! cgroup parent), so one freeze stops the whole tree.
//!
//! Who does what: the relays report activity ([`mcpbox_gateway::Activity`]:
//! a host message thaws a paused sandbox before the message can reach the
//! server; after each event, busy or not, parked or not); a timer thread
//! ticks every [`TICK`] (the core applies `idle.pause`, `idle.stop` and
//! `idle.destroy`); the control socket (`mcpbox sandboxes ...`) calls the
//! [`mcpbox_lifecycle::Control`] operations (`ops.rs`). Locks: the map,
//! then one sandbox's state, then the registry. A new sandbox's workspace
//! (its template copied) is made while the map is held, so a large
//! template delays other new sessions for that long; a `restore` builds
//! its workspace without it and holds it only to register the sandbox.

pub mod backend;
mod ops;
pub mod ready;
mod teardown;
pub mod workspace;

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Condvar, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use anyhow::Context;
use mcpbox_audit::{Event, Kind, Sink};
use mcpbox_gateway::{Activity, HostFeed};
use mcpbox_lifecycle::artifacts::Approved;
use mcpbox_lifecycle::id::Key;
use mcpbox_lifecycle::machine::{Effect, Event as LifeEvent, Machine, Paused, Refusal};
use mcpbox_lifecycle::registry::{Record, Registry};
use mcpbox_lifecycle::{SandboxInfo, State};
use mcpbox_policy::serve::{Idle, TemplateBase};
use mcpbox_policy::SecretSource;
use serde_json::json;

pub use backend::Backend;
use workspace::Workspace;

/// How often the idle clocks are looked at.
pub const TICK: Duration = Duration::from_millis(200);
/// How long a teardown waits for its sessions' relays to stop their
/// servers before it kills what is left.
pub const SESSIONS_WAIT: Duration = Duration::from_secs(15);

/// What the lifecycle knows of one configured server.
#[derive(Clone)]
pub struct ServerLife {
    /// The key's `server`: the server's name, or `shared` for
    /// `placement = "shared"`.
    pub group: String,
    /// The size of a new sandbox's writable space (`output` and `tmp`
    /// together): the policy's `[filesystem] tmp` (crate::volume).
    pub workspace_size: u64,
    /// The template policy's `sandbox.dangerously_allow_degraded`: a
    /// workspace nothing can bound here is made anyway (else refused).
    pub allow_unbounded_disk: bool,
    pub idle: Idle,
    /// The template's name and base, if the server has one.
    pub template: Option<(String, TemplateBase)>,
    /// Workspaces made ahead of demand for it (its template's `ready`;
    /// 0 without a template), `ready.rs`.
    pub ready: usize,
    /// The policy's `[artifacts]`.
    pub artifacts: (Vec<String>, u64),
    /// Secrets with a `revoke` command: name, source, command.
    pub revoke: Vec<(String, SecretSource, Vec<String>)>,
    /// Where its records go.
    pub audit: Arc<dyn Sink>,
}

/// A session refused because its agent has as many sandboxes as it may.
#[derive(Debug)]
pub struct SandboxLimit(pub String);

impl std::fmt::Display for SandboxLimit {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.0)
    }
}

impl std::error::Error for SandboxLimit {}

/// A session refused because its sandbox is being torn down (live,
/// stopped, or only a record after a restart): retryable, once the
/// teardown is over a new session gets a sandbox again.
#[derive(Debug)]
pub struct Destroying(pub String);

impl std::fmt::Display for Destroying {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "sandbox {} is being destroyed; retry once it is gone",
            self.0
        )
    }
}

impl std::error::Error for Destroying {}

/// The group name of shared servers.
pub const SHARED: &str = "shared";

struct Shared {
    registry: Mutex<Registry>,
    backend: Arc<dyn Backend>,
    audit: Arc<dyn Sink>,
    state_dir: PathBuf,
}

impl Shared {
    fn record_state(&self, id: &str, state: State) {
        let r = lock(&self.registry).set_state(id, state, mcpbox_audit::now_ms());
        if let Err(e) = r {
            tracing::error!("{e}");
        }
    }
}

/// The lifecycle of every sandbox of one state directory.
pub struct Lifecycle {
    shared: Arc<Shared>,
    /// `limits.max_sandboxes_per_client`.
    max_per_agent: usize,
    /// The state directory's salt for sandbox ids.
    salt: String,
    servers: HashMap<String, ServerLife>,
    map: Mutex<HashMap<String, Arc<Sandbox>>>,
    /// Sandboxes being torn down that are not in `map` (records of a
    /// previous run, stopped): `join` refuses them, so that no session
    /// writes into a workspace the teardown is about to remove. Locked
    /// after `map`; an id is added only while `map` is held.
    tearing: Mutex<std::collections::HashSet<String>>,
    /// The gateway's approval broker, for the control socket's approval
    /// ops (set once, at start).
    pub desk: std::sync::OnceLock<crate::approvals::BrokerDesk>,
    /// Workspaces made ahead of demand (`ready.rs`), started after
    /// `recover` removed what a previous run left of them.
    ready: std::sync::OnceLock<Arc<ready::Ready>>,
}

impl Drop for Lifecycle {
    fn drop(&mut self) {
        if let Some(ready) = self.ready.get() {
            ready.stop();
        }
    }
}

/// One sandbox's state machine and what its driver keeps beside it.
struct Inner {
    machine: Machine,
    /// The feeds of its sessions, by slot (the lifecycle parks, wakes
    /// and closes them).
    feeds: HashMap<u64, HostFeed>,
    next_slot: u64,
    servers: Vec<String>,
    artifacts: Vec<(Vec<String>, u64)>,
    revoke: Vec<(String, SecretSource, Vec<String>)>,
}

/// What the driver gathered from one event's effects.
#[derive(Default)]
struct Outcome {
    refused: Option<Refusal>,
    paused: Option<Paused>,
    /// `idle.destroy`: the caller tears it down, off the lock.
    destroy: bool,
}

/// One sandbox.
pub struct Sandbox {
    pub id: String,
    pub key: Key,
    template: Option<String>,
    pub workspace: Workspace,
    created_ms: i64,
    freezer: Option<String>,
    audit: Arc<dyn Sink>,
    shared: Arc<Shared>,
    inner: Mutex<Inner>,
    /// Signalled when a session leaves.
    left: Condvar,
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

impl Lifecycle {
    /// Opens the registry of `state_dir`, re-adopts what a previous run
    /// left (its processes killed, its cgroups removed, its workspace
    /// kept, the sandbox stopped) and starts the idle timer.
    pub fn start(
        state_dir: &Path,
        backend: Arc<dyn Backend>,
        servers: HashMap<String, ServerLife>,
        audit: Arc<dyn Sink>,
        max_per_agent: usize,
    ) -> anyhow::Result<Arc<Lifecycle>> {
        workspace::private_dir(&state_dir.join("sandboxes"))?;
        let registry = Registry::open(&state_dir.join("sandboxes.db"))?;
        let salt = registry.salt()?;
        let shared = Arc::new(Shared {
            registry: Mutex::new(registry),
            backend,
            audit,
            state_dir: state_dir.to_path_buf(),
        });
        let life = Arc::new(Lifecycle {
            shared,
            max_per_agent,
            salt,
            servers,
            map: Mutex::new(HashMap::new()),
            tearing: Mutex::new(std::collections::HashSet::new()),
            desk: std::sync::OnceLock::new(),
            ready: std::sync::OnceLock::new(),
        });
        life.recover()?;
        let wanted = life
            .servers
            .iter()
            .map(|(name, l)| (name.clone(), l.clone(), life.workspace_size(l)))
            .collect();
        let ready = ready::Ready::start(life.sandboxes_dir(), wanted)
            .context("starting the thread that makes workspaces ahead of demand")?;
        let _ = life.ready.set(ready);
        let weak = Arc::downgrade(&life);
        std::thread::Builder::new()
            .name("mcpbox-lifecycle".into())
            .spawn(move || loop {
                std::thread::sleep(TICK);
                let Some(life) = weak.upgrade() else {
                    return;
                };
                life.tick(Instant::now());
            })
            .context("starting the lifecycle timer")?;
        Ok(life)
    }

    /// The size of a new workspace's volume for `life`'s server, when
    /// the backend keeps volumes (crate::volume).
    fn workspace_size(&self, life: &ServerLife) -> Option<u64> {
        self.shared
            .backend
            .bounded_workspaces()
            .then_some(life.workspace_size)
    }

    fn sandboxes_dir(&self) -> PathBuf {
        self.shared.state_dir.join("sandboxes")
    }

    /// After a restart (or a crash): every recorded sandbox is stopped on
    /// its kept workspace; whatever process or cgroup of it is left is
    /// killed and removed; a workspace folder with no record (a create cut
    /// short) is removed. Groups of ids this state directory does not know
    /// are left alone: they may be another gateway's.
    fn recover(&self) -> anyhow::Result<()> {
        let records = lock(&self.shared.registry).all()?;
        let backend = &self.shared.backend;
        let now = mcpbox_audit::now_ms();
        let mut known = Vec::new();
        for mut r in records {
            known.push(r.id.clone());
            let killed = backend.stats(&r.id).processes;
            let _ = backend.thaw(&r.id);
            backend.stop(&r.id);
            if let Err(e) = backend.destroy(&r.id) {
                tracing::error!(sandbox = %r.id, "cleaning up after the last run: {e}");
            }
            let left = backend.leftovers(&r.id);
            if !r.workspace.is_dir() {
                lock(&self.shared.registry).remove(&r.id)?;
                audit_lifecycle(
                    &self.shared.audit,
                    &r.id,
                    &r.key,
                    "cleaned",
                    json!({"processes_killed": killed, "left": left, "why": "workspace missing"}),
                );
                continue;
            }
            // its volume mounted again (or the mount a killed run left
            // reused), so that its files are where the host looks
            if let Err(e) = Workspace::at(r.workspace.clone()).remount() {
                tracing::error!(sandbox = %r.id, "mounting its kept workspace volume: {e:#}");
            }
            let was = r.state;
            r.state = State::Stopped;
            r.updated_ms = now;
            r.owner_pid = std::process::id();
            lock(&self.shared.registry).put(&r)?;
            audit_lifecycle(
                &self.shared.audit,
                &r.id,
                &r.key,
                "adopted",
                json!({"was": was.as_str(), "processes_killed": killed, "left": left}),
            );
            if killed > 0 {
                tracing::warn!(sandbox = %r.id, killed, "a previous run left processes; killed");
            }
        }
        // a workspace folder without a record: a create cut short
        if let Ok(entries) = std::fs::read_dir(self.sandboxes_dir()) {
            for e in entries.flatten() {
                let name = e.file_name().to_string_lossy().to_string();
                if name.starts_with(ready::PREFIX) {
                    // a workspace made ahead of demand by a run that did
                    // not stop cleanly: nobody took it
                    let _ = Workspace::at(e.path()).remove();
                    continue;
                }
                if name.starts_with(".restore-") {
                    // a restore's staging folder, cut short (the volume
                    // it may hold unmounted first)
                    let _ = Workspace::at(e.path().join("ws")).remove();
                    let _ = std::fs::remove_dir_all(e.path());
                    continue;
                }
                if mcpbox_lifecycle::id::is_id(&name) && !known.contains(&name) {
                    let _ = backend.thaw(&name);
                    backend.stop(&name);
                    let _ = backend.destroy(&name);
                    let _ = Workspace::at(e.path()).remove();
                    tracing::warn!(sandbox = %name, "removed a workspace no record names");
                }
            }
        }
        Ok(())
    }

    /// The sandbox a new session of `agent` on `server` (for `task`) runs
    /// in: the live one, the one a previous run left, or a new one made
    /// from the server's template; with a session slot taken in it.
    pub fn join(
        self: &Arc<Self>,
        agent: &str,
        server: &str,
        task: Option<&str>,
    ) -> anyhow::Result<(Arc<Sandbox>, u64)> {
        let started = Instant::now();
        let life = self
            .servers
            .get(server)
            .with_context(|| format!("no server {server}"))?;
        let key = Key {
            agent: agent.to_string(),
            server: life.group.clone(),
            task: task.map(String::from),
        };
        let id = key.id(&self.salt);
        let sb = {
            let mut map = lock(&self.map);
            // a teardown holds it (live, or a record being destroyed):
            // refused, retryable, rather than a session whose writes the
            // teardown then deletes
            if lock(&self.tearing).contains(&id) {
                return Err(anyhow::Error::new(Destroying(id)));
            }
            match map.get(&id) {
                Some(sb) if lock(&sb.inner).machine.destroying() => {
                    return Err(anyhow::Error::new(Destroying(id)));
                }
                Some(sb) => sb.clone(),
                None => {
                    self.check_room(&map, &id, agent)?;
                    let sb = Arc::new(self.make(&id, key, server, life, started)?);
                    map.insert(id.clone(), sb.clone());
                    sb
                }
            }
        };
        let slot = {
            let mut g = lock(&sb.inner);
            // the core checks again under the sandbox's own lock (a
            // teardown may have begun since the map was looked at)
            let slot = g.next_slot;
            let joined = sb.on(&mut g, LifeEvent::Join { slot }, Instant::now());
            if joined.refused.is_some() {
                return Err(anyhow::Error::new(Destroying(id)));
            }
            g.next_slot += 1;
            if !g.servers.iter().any(|s| s == server) {
                g.servers.push(server.to_string());
                g.artifacts.push(life.artifacts.clone());
                g.revoke.extend(life.revoke.iter().cloned());
            }
            slot
        };
        Ok((sb, slot))
    }

    /// Refuses a new sandbox `id` of `agent` when the agent has as many as
    /// it may (live ones and kept ones alike: each holds a workspace).
    fn check_room(
        &self,
        map: &HashMap<String, Arc<Sandbox>>,
        id: &str,
        agent: &str,
    ) -> anyhow::Result<()> {
        let records = lock(&self.shared.registry).all()?;
        if records.iter().any(|r| r.id == id) {
            return Ok(()); // a kept one, re-adopted: not one more
        }
        let mut ids: Vec<&str> = map
            .values()
            .filter(|s| s.key.agent == agent)
            .map(|s| s.id.as_str())
            .collect();
        for r in records.iter().filter(|r| r.key.agent == agent) {
            if !ids.contains(&r.id.as_str()) {
                ids.push(&r.id);
            }
        }
        if ids.len() >= self.max_per_agent {
            return Err(anyhow::Error::new(SandboxLimit(format!(
                "{agent} has {} sandboxes, as many as limits.max_sandboxes_per_client ({}) allows: destroy one first (mcpbox sandboxes list)",
                ids.len(),
                self.max_per_agent
            ))));
        }
        Ok(())
    }

    /// A sandbox for `key`: re-adopted from the registry, or created.
    fn make(
        &self,
        id: &str,
        key: Key,
        server: &str,
        life: &ServerLife,
        started: Instant,
    ) -> anyhow::Result<Sandbox> {
        let backend = &self.shared.backend;
        let size = self.workspace_size(life);
        let existing = lock(&self.shared.registry).get(id)?;
        // a new one's `created` record, once it is ready: whether it took
        // a ready workspace
        let mut created = None;
        let (ws, created_ms, template, state) = match existing {
            Some(r) => (
                Workspace::at(r.workspace),
                r.created_ms,
                r.template,
                r.state,
            ),
            None => {
                let ws = Workspace::at(self.sandboxes_dir().join(id));
                let now = mcpbox_audit::now_ms();
                let template = life.template.as_ref().map(|(n, _)| n.clone());
                // recorded before anything is made, so a crash from here on
                // leaves a record the next start cleans up
                lock(&self.shared.registry).put(&Record {
                    id: id.to_string(),
                    key: key.clone(),
                    template: template.clone(),
                    state: State::Created,
                    workspace: ws.root.clone(),
                    created_ms: now,
                    updated_ms: now,
                    owner_pid: std::process::id(),
                })?;
                // one made ahead of demand, renamed to this sandbox's
                // folder, or one made now
                let taken = self.ready.get().and_then(|r| r.take(server, &ws.root));
                if taken.is_none() {
                    if let Err(e) = fill(&ws, life, size) {
                        let _ = ws.remove();
                        let _ = lock(&self.shared.registry).remove(id);
                        return Err(e);
                    }
                }
                created = Some(taken.is_some());
                (ws, now, template, State::Created)
            }
        };
        let made = ws.ensure(size).and_then(|()| {
            backend
                .create(id)
                .map_err(|e| anyhow::anyhow!("sandbox {id}: {e}"))
        });
        if let Some(ready) = created {
            // `ready`: whether its workspace was made ahead of demand;
            // `made_us`: from the session's join to the sandbox ready for
            // its server (workspace mounted, cgroups made), or failed
            let mut detail = json!({"template": template, "workspace": ws.root,
                "disk": disk_bound(size), "ready": ready,
                "made_us": u64::try_from(started.elapsed().as_micros()).unwrap_or(u64::MAX)});
            if let Err(e) = &made {
                detail["error"] = json!(format!("{e:#}"));
            }
            audit_lifecycle(&life.audit, id, &key, "created", detail);
        }
        let freezer = made?;
        let can_freeze = freezer.is_some();
        Ok(Sandbox {
            id: id.to_string(),
            key,
            template,
            workspace: ws,
            created_ms,
            freezer,
            audit: life.audit.clone(),
            shared: self.shared.clone(),
            inner: Mutex::new(Inner {
                machine: Machine::new(state, life.idle, can_freeze, Instant::now()),
                feeds: HashMap::new(),
                next_slot: 0,
                servers: Vec::new(),
                artifacts: Vec::new(),
                revoke: Vec::new(),
            }),
            left: Condvar::new(),
        })
    }

    /// One look at every sandbox's idle clock.
    fn tick(self: &Arc<Self>, now: Instant) {
        let all: Vec<Arc<Sandbox>> = lock(&self.map).values().cloned().collect();
        for sb in all {
            if sb.tick(now) {
                let life = self.clone();
                let id = sb.id.clone();
                let _ = std::thread::Builder::new()
                    .name("mcpbox-teardown".into())
                    .spawn(move || {
                        if let Err(e) = life.teardown(&id, "idle.destroy", &Approved::new()) {
                            tracing::error!(sandbox = %id, "idle teardown: {e}");
                        }
                    });
            }
        }
    }

    fn get(&self, id: &str) -> Result<Arc<Sandbox>, String> {
        if !mcpbox_lifecycle::id::is_id(id) {
            return Err(format!("{id:?} is not a sandbox id"));
        }
        lock(&self.map)
            .get(id)
            .cloned()
            .ok_or_else(|| format!("no live sandbox {id} (see `mcpbox sandboxes list`)"))
    }

    /// A recorded sandbox that is not live (stopped, left by a previous
    /// run): its record.
    fn record(&self, id: &str) -> Result<Record, String> {
        lock(&self.shared.registry)
            .get(id)
            .map_err(|e| e.to_string())?
            .ok_or_else(|| format!("no sandbox {id} (see `mcpbox sandboxes list`)"))
    }

    fn workspace_of(&self, id: &str) -> Result<Workspace, String> {
        if let Ok(sb) = self.get(id) {
            return Ok(sb.workspace.clone());
        }
        if !mcpbox_lifecycle::id::is_id(id) {
            return Err(format!("{id:?} is not a sandbox id"));
        }
        self.record(id).map(|r| Workspace::at(r.workspace))
    }

    /// The artifact rules for `id`: those of every server that ran in it,
    /// or of the servers its key names when it is not live.
    fn artifact_rules(&self, id: &str) -> Result<Vec<(Vec<String>, u64)>, String> {
        if let Ok(sb) = self.get(id) {
            return Ok(lock(&sb.inner).artifacts.clone());
        }
        let r = self.record(id)?;
        Ok(self
            .lives_of(&r.key.server)
            .map(|l| l.artifacts.clone())
            .collect())
    }

    /// The configured servers whose sandboxes are keyed by `group` (a
    /// server's own name, or `shared`).
    fn lives_of<'a>(&'a self, group: &'a str) -> impl Iterator<Item = &'a ServerLife> + 'a {
        self.servers.values().filter(move |l| l.group == group)
    }

    /// Whose sandbox `id` is, and where its records go: the live one's
    /// server's audit store, else (a kept sandbox) the gateway's.
    fn owner(&self, id: &str) -> Result<(Key, Arc<dyn Sink>), String> {
        match self.get(id) {
            Ok(sb) => Ok((sb.key.clone(), sb.audit.clone())),
            Err(_) => Ok((self.record(id)?.key, self.shared.audit.clone())),
        }
    }

    fn info_of_record(&self, r: &Record) -> SandboxInfo {
        let stats = self.shared.backend.stats(&r.id);
        SandboxInfo {
            id: r.id.clone(),
            agent: r.key.agent.clone(),
            server: r.key.server.clone(),
            task: r.key.task.clone(),
            template: r.template.clone(),
            state: r.state,
            workspace: r.workspace.clone(),
            idle_seconds: u64::try_from((mcpbox_audit::now_ms() - r.updated_ms).max(0) / 1000)
                .unwrap_or(0),
            created: mcpbox_audit::format_time(r.created_ms),
            sessions: 0,
            processes: stats.processes,
            cpu_usec: stats.cpu_usec,
            memory_bytes: stats.memory_bytes,
            freezer: None,
            note: None,
        }
    }

    /// Live sandboxes and recorded ones, by id.
    fn all_infos(&self) -> Vec<SandboxInfo> {
        let live: Vec<Arc<Sandbox>> = lock(&self.map).values().cloned().collect();
        let mut out: Vec<SandboxInfo> = live.iter().map(|s| s.info()).collect();
        let records = lock(&self.shared.registry).all().unwrap_or_default();
        for r in records {
            if !out.iter().any(|i| i.id == r.id) {
                out.push(self.info_of_record(&r));
            }
        }
        out.sort_by(|a, b| a.created.cmp(&b.created).then(a.id.cmp(&b.id)));
        out
    }

    /// The gateway is stopping, its sessions ended: every sandbox stays
    /// recorded, stopped, on its kept workspace; what is left of its
    /// processes is killed and its cgroups are removed (made again when it
    /// is used next).
    pub fn shutdown(&self) {
        // what was made ahead of demand and not taken goes first
        if let Some(ready) = self.ready.get() {
            ready.stop();
        }
        let all: Vec<Arc<Sandbox>> = lock(&self.map).values().cloned().collect();
        let backend = &self.shared.backend;
        for sb in all {
            let _ = backend.thaw(&sb.id);
            backend.stop(&sb.id);
            if let Err(e) = backend.destroy(&sb.id) {
                tracing::error!(sandbox = %sb.id, "removing its cgroups at stop: {e}");
            }
            let mut g = lock(&sb.inner);
            sb.on(&mut g, LifeEvent::Shutdown, Instant::now());
        }
        // every kept workspace's volume is unmounted (its image stays, and
        // is mounted again at the next start)
        for r in lock(&self.shared.registry).all().unwrap_or_default() {
            if let Err(e) = Workspace::at(r.workspace).unmount() {
                tracing::error!(sandbox = %r.id, "unmounting its workspace volume: {e:#}");
            }
        }
    }
}

/// What bounds a new sandbox's writable space, for its `created` record.
fn disk_bound(size: Option<u64>) -> serde_json::Value {
    let bound = crate::volume::bound();
    match (size, bound.by(), bound) {
        (None, _, _) => json!({"bound": null, "why": "the backend keeps no volumes"}),
        (Some(size), Some(by), _) => json!({"bound": size, "by": by}),
        (Some(_), None, crate::volume::Bound::Unbounded(why)) => {
            json!({"bound": null, "why": why})
        }
        (Some(_), None, _) => json!({"bound": null}),
    }
}

/// Makes a new workspace's folders and its input from the template.
fn fill(ws: &Workspace, life: &ServerLife, size: Option<u64>) -> anyhow::Result<()> {
    if size.is_some() {
        crate::volume::require(&crate::volume::bound(), life.allow_unbounded_disk)?;
    }
    ws.ensure(size)?;
    match &life.template {
        None => {}
        Some((name, TemplateBase::Dir(dir))) => {
            workspace::copy_template(dir, &ws.input())
                .with_context(|| format!("template {name}"))?;
        }
        Some((name, TemplateBase::Snapshot(archive))) => {
            // a snapshot promoted to a template: its output is the input
            let tmp = ws.root.join(".template");
            let limits = snapshot_limits(archive, crate::volume::space(&ws.root)?)
                .with_context(|| format!("template {name}"))?;
            mcpbox_lifecycle::snapshot::restore_with(archive, &tmp, &limits).map_err(|e| {
                anyhow::anyhow!(
                    "template {name}: {e} (a restore may take {} bytes of the state directory's \
                     filesystem, what it has free less what stays free for the audit log)",
                    limits.max_bytes
                )
            })?;
            let from = tmp.join("output");
            if from.is_dir() {
                std::fs::remove_dir(ws.input()).context("replacing the empty input")?;
                std::fs::rename(&from, ws.input()).context("moving the template in")?;
                workspace::private_dir(&ws.input())?;
                std::fs::set_permissions(
                    ws.input(),
                    std::os::unix::fs::PermissionsExt::from_mode(0o755),
                )?;
            }
            std::fs::remove_dir_all(&tmp).ok();
        }
    }
    Ok(())
}

/// The limits of a snapshot template's restore: the default, its files'
/// total bounded by what the state directory's filesystem (`space`: free,
/// total) has room for after the archive's private copy (the restore
/// checks a copy of its own), less the share kept free for the audit log
/// ([`crate::volume::copy_room`]). A manifest adding up to more is
/// refused before anything is extracted; an archive with no room for its
/// copy, before it is read.
fn snapshot_limits(
    archive: &Path,
    space: (u64, u64),
) -> anyhow::Result<mcpbox_lifecycle::snapshot::Limits> {
    let len = std::fs::metadata(archive)
        .with_context(|| format!("snapshot {}", archive.display()))?
        .len();
    crate::volume::check_copy_room(
        &format!("a copy of the snapshot {}", archive.display()),
        len,
        space,
    )?;
    let defaults = mcpbox_lifecycle::snapshot::Limits::default();
    let room = crate::volume::copy_room(space).saturating_sub(len);
    Ok(mcpbox_lifecycle::snapshot::Limits {
        max_bytes: defaults.max_bytes.min(room),
        ..defaults
    })
}

/// An audit record of `kind` about sandbox `id` of `key` (its agent the
/// caller, its workspace named by the sandbox id).
fn sandbox_event(kind: Kind, id: &str, key: &Key) -> Event {
    Event {
        kind: Some(kind),
        sandbox_id: id.to_string(),
        workspace_id: id.to_string(),
        server: key.server.clone(),
        caller: key.agent.clone(),
        ..Event::default()
    }
}

fn audit_lifecycle(
    audit: &Arc<dyn Sink>,
    id: &str,
    key: &Key,
    action: &str,
    detail: serde_json::Value,
) {
    let mut e = sandbox_event(Kind::Lifecycle, id, key);
    let mut d = json!({"action": action, "task": key.task});
    if let (Some(d), serde_json::Value::Object(more)) = (d.as_object_mut(), detail) {
        d.extend(more);
    }
    e.detail = d;
    audit.record(e);
}

impl Sandbox {
    /// Hands `event` to the sandbox's core and carries out its effects in
    /// order (the caller holds the sandbox's lock, `g`): a freeze or thaw
    /// through the backend, its outcome handed back at once; the feeds
    /// parked or woken; the registry written; the change audited.
    fn on(&self, g: &mut Inner, event: LifeEvent, now: Instant) -> Outcome {
        let mut out = Outcome::default();
        let Inner { machine, feeds, .. } = g;
        let backend = &self.shared.backend;
        machine.drive(event, now, &mut |effect| {
            match effect {
                Effect::Freeze(why) => {
                    let result = backend.freeze(&self.id);
                    return Some(LifeEvent::Froze { why, result });
                }
                Effect::Thaw(why) => {
                    let result = backend.thaw(&self.id);
                    return Some(LifeEvent::Thawed { why, result });
                }
                Effect::Park => {
                    for f in feeds.values() {
                        let _ = f.park();
                    }
                }
                Effect::Wake => {
                    for f in feeds.values() {
                        let _ = f.wake();
                    }
                }
                Effect::Destroy => out.destroy = true,
                Effect::Registry(state) => self.shared.record_state(&self.id, state),
                Effect::Audit { action, why } => audit_lifecycle(
                    &self.audit,
                    &self.id,
                    &self.key,
                    action,
                    json!({"why": why.as_str()}),
                ),
                Effect::Paused(p) => out.paused = Some(p),
                Effect::Refuse(r) => out.refused = Some(r),
                Effect::Error(why, e) => {
                    tracing::error!(sandbox = %self.id, why = why.as_str(), "freeze or thaw: {e}")
                }
            }
            None
        });
        out
    }

    /// What a refusal of the core says to the operator.
    fn refusal(&self, r: Refusal) -> String {
        match r {
            Refusal::Destroying => format!("sandbox {} is already being destroyed", self.id),
            Refusal::NothingRuns(s) => format!(
                "sandbox {} is {}: nothing runs to pause",
                self.id,
                s.as_str()
            ),
            Refusal::NoFreezer => format!(
                "sandbox {} cannot be paused here: mcpbox has no freezer cgroup on this host (see `mcpbox doctor`)",
                self.id
            ),
            Refusal::Failed(e) => e,
        }
    }

    /// Whether its workspace's input is its own copy of a template.
    pub fn has_template(&self) -> bool {
        self.template.is_some()
    }

    /// The activity hook of session `slot`.
    pub fn activity(self: &Arc<Self>, slot: u64) -> Arc<dyn Activity> {
        Arc::new(SessionActivity {
            sb: self.clone(),
            slot,
        })
    }

    /// Gives session `slot` its feed (the lifecycle parks and closes it).
    pub fn attach(&self, slot: u64, feed: &HostFeed) {
        let mut g = lock(&self.inner);
        if g.machine.has_session(slot) {
            g.feeds.insert(slot, feed.clone());
        }
    }

    /// Session `slot` has ended (its relay returned).
    pub fn leave(&self, slot: u64) {
        let mut g = lock(&self.inner);
        g.feeds.remove(&slot);
        self.on(&mut g, LifeEvent::Leave { slot }, Instant::now());
        drop(g);
        self.left.notify_all();
    }

    /// Whether this tick must destroy it (the caller does, off the lock).
    fn tick(&self, now: Instant) -> bool {
        let mut g = lock(&self.inner);
        self.on(&mut g, LifeEvent::Tick, now).destroy
    }

    /// Thaws and asks every session to end; waits (bounded) until they
    /// have.
    fn stop_sessions(&self) {
        let _ = self.shared.backend.thaw(&self.id);
        let feeds: Vec<HostFeed> = lock(&self.inner).feeds.values().cloned().collect();
        for f in feeds {
            f.close();
        }
        let deadline = Instant::now() + SESSIONS_WAIT;
        let mut g = lock(&self.inner);
        while g.machine.sessions() > 0 {
            let left = deadline.saturating_duration_since(Instant::now());
            if left.is_zero() {
                tracing::warn!(sandbox = %self.id, "sessions did not end in time; killing what is left");
                break;
            }
            g = self
                .left
                .wait_timeout(g, left)
                .unwrap_or_else(|p| p.into_inner())
                .0;
        }
    }

    fn info(&self) -> SandboxInfo {
        let g = lock(&self.inner);
        let stats = self.shared.backend.stats(&self.id);
        SandboxInfo {
            id: self.id.clone(),
            agent: self.key.agent.clone(),
            server: self.key.server.clone(),
            task: self.key.task.clone(),
            template: self.template.clone(),
            state: g.machine.state(),
            workspace: self.workspace.root.clone(),
            idle_seconds: g.machine.idle_for(Instant::now()).as_secs(),
            created: mcpbox_audit::format_time(self.created_ms),
            sessions: g.machine.sessions(),
            processes: stats.processes,
            cpu_usec: stats.cpu_usec,
            memory_bytes: stats.memory_bytes,
            freezer: self.freezer.clone(),
            note: None,
        }
    }

    /// Freezes it; what it did, for [`Paused::note`].
    fn pause(&self) -> Result<Paused, String> {
        let mut g = lock(&self.inner);
        let out = self.on(&mut g, LifeEvent::Pause, Instant::now());
        match (out.refused, out.paused) {
            (Some(r), _) => Err(self.refusal(r)),
            (None, Some(p)) => Ok(p),
            (None, None) => Err(format!("sandbox {} was not paused", self.id)),
        }
    }

    fn resume(&self) -> Result<(), String> {
        let mut g = lock(&self.inner);
        match self.on(&mut g, LifeEvent::Resume, Instant::now()).refused {
            Some(r) => Err(self.refusal(r)),
            None => Ok(()),
        }
    }
}

/// A session's [`Activity`]: the idle clock and the thaw on a message.
struct SessionActivity {
    sb: Arc<Sandbox>,
    slot: u64,
}

impl Activity for SessionActivity {
    fn host_message(&self) {
        let sb = &self.sb;
        let mut g = lock(&sb.inner);
        sb.on(&mut g, LifeEvent::HostMessage, Instant::now());
    }

    fn status(&self, busy: bool, parked: bool) {
        let sb = &self.sb;
        let mut g = lock(&sb.inner);
        let event = LifeEvent::Status {
            slot: self.slot,
            busy,
            parked,
        };
        sb.on(&mut g, event, Instant::now());
    }
}

/// Kept by a session: leaves the sandbox when the relay has ended.
pub struct SessionGuard {
    pub sb: Arc<Sandbox>,
    pub slot: u64,
}

impl Drop for SessionGuard {
    fn drop(&mut self) {
        self.sb.leave(self.slot);
    }
}

/// The driver carries out the core's effects: freezes and thaws through
/// the backend, the registry's state, the audit records, the teardown.
/// No idle limit is set, so the timer thread decides nothing here.
#[cfg(test)]
mod driver_tests {
    use std::collections::HashMap;
    use std::sync::Arc;

    use mcpbox_audit::{MemorySink, Sink};
    use mcpbox_lifecycle::artifacts::Approved;
    use mcpbox_lifecycle::registry::Registry;
    use mcpbox_lifecycle::{Control, State};
    use mcpbox_policy::serve::Idle;

    use super::backend::tests::Plain;
    use super::{Lifecycle, ServerLife, SessionGuard};

    fn actions(audit: &MemorySink) -> Vec<String> {
        audit
            .events()
            .iter()
            .map(|e| {
                let why = e.detail["why"].as_str().unwrap_or("");
                format!("{} {why}", e.detail["action"].as_str().unwrap_or("?"))
                    .trim_end()
                    .to_string()
            })
            .collect()
    }

    fn recorded(state: &std::path::Path, id: &str) -> Option<State> {
        let r = Registry::open(&state.join("sandboxes.db")).unwrap();
        r.get(id).unwrap().map(|r| r.state)
    }

    #[test]
    fn a_sandbox_driven_through_its_life_acts_on_the_backend_registry_and_audit() {
        let dir = tempfile::tempdir().unwrap();
        let state = dir.path();
        let plain = Arc::new(Plain {
            freezer: true,
            ..Plain::default()
        });
        let audit = Arc::new(MemorySink::new());
        let sink: Arc<dyn Sink> = audit.clone();
        let never = Idle {
            pause: None,
            stop: None,
            destroy: None,
        };
        let servers = HashMap::from([(
            "s".to_string(),
            ServerLife {
                group: "s".into(),
                idle: never,
                template: None,
                ready: 0,
                artifacts: (Vec::new(), 0),
                revoke: Vec::new(),
                audit: sink.clone(),
                workspace_size: 64 << 20,
                allow_unbounded_disk: false,
            },
        )]);
        let life = Lifecycle::start(state, plain.clone(), servers, sink, 4).unwrap();
        let (sb, slot) = life.join("agent", "s", None).unwrap();
        let id = sb.id.clone();
        let guard = SessionGuard {
            sb: sb.clone(),
            slot,
        };
        assert_eq!(recorded(state, &id), Some(State::Running));
        // the session is still opening: a pause says it is in flight
        let info = life.pause(&id).unwrap();
        assert_eq!(info.state, State::Paused);
        assert!(info.note.unwrap().contains("1 session(s)"));
        assert_eq!(recorded(state, &id), Some(State::Paused));
        // a host message thaws it before it goes on
        sb.activity(slot).host_message();
        assert_eq!(life.show(&id).unwrap().state, State::Running);
        drop(guard);
        assert_eq!(recorded(state, &id), Some(State::Stopped));
        assert_eq!(life.show(&id).unwrap().sessions, 0);
        let t = life.destroy(&id, &Approved::new()).unwrap();
        assert!(t.clean(), "{:?}", t.left);
        assert_eq!(recorded(state, &id), None);
        assert!(!sb.workspace.root.exists());
        assert_eq!(
            actions(&audit),
            [
                "created",
                "running session",
                "paused mcpbox sandboxes pause",
                "running call",
                "stopped last session ended",
                "destroyed mcpbox sandboxes destroy",
            ]
        );
        assert_eq!(
            *plain.calls.lock().unwrap(),
            [
                format!("create {id}"),
                format!("freeze {id}"),
                format!("thaw {id}"),
                // the teardown: thawed, what is left stopped, removed
                format!("thaw {id}"),
                format!("thaw {id}"),
                format!("stop {id}"),
                format!("destroy {id}"),
            ]
        );
        // a torn-down sandbox is gone from the live map: a new session of
        // the same key gets a new one
        assert!(life.show(&id).is_err());
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod snapshot_template_tests {
    use super::snapshot_limits;

    /// A snapshot template whose files add up to more than the state
    /// directory's filesystem has room for (less the share kept for the
    /// audit log) is refused before anything is extracted; one whose
    /// archive has no room for its copy, before it is read.
    #[test]
    fn a_snapshot_template_larger_than_the_free_space_is_not_restored() {
        let t = tempfile::tempdir().unwrap();
        let out = t.path().join("output");
        std::fs::create_dir(&out).unwrap();
        // incompressible: the archive is about as large as its files
        let mut bytes = vec![0u8; 256 << 10];
        let mut x = 0x2545_f491_u32;
        for b in bytes.iter_mut() {
            x ^= x << 13;
            x ^= x >> 17;
            x ^= x << 5;
            *b = x as u8;
        }
        std::fs::write(out.join("data"), &bytes).unwrap();
        let archive = t.path().join("snap.tar.gz");
        mcpbox_lifecycle::snapshot::write(&[("output", &out)], &archive).unwrap();
        let len = std::fs::metadata(&archive).unwrap().len();
        let total = 100 << 20;
        let keep = 5 << 20;
        // room for the archive's copy and 64 KiB more: the files are refused
        let tight = (keep + len + (64 << 10), total);
        let limits = snapshot_limits(&archive, tight).unwrap();
        assert_eq!(limits.max_bytes, 64 << 10);
        let dest = t.path().join("restored");
        let err = mcpbox_lifecycle::snapshot::restore_with(&archive, &dest, &limits).unwrap_err();
        assert!(err.to_string().contains("add up to more than"), "{err}");
        assert!(!dest.exists(), "restored anyway");
        // no room even for the archive's copy: refused before it is read
        let err = snapshot_limits(&archive, (keep + len / 2, total)).unwrap_err();
        assert!(
            format!("{err:#}").contains("a copy of the snapshot"),
            "{err:#}"
        );
        // with room, the same archive restores
        let limits = snapshot_limits(&archive, (keep + (4 << 20), total)).unwrap();
        mcpbox_lifecycle::snapshot::restore_with(&archive, &dest, &limits).unwrap();
        assert_eq!(std::fs::read(dest.join("output/data")).unwrap(), bytes);
    }
}
