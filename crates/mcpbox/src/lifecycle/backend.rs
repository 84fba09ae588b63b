//! The seam between the lifecycle and whatever runs sandboxes.
//!
//! The lifecycle ([`super::Lifecycle`]) decides *when* a sandbox is
//! created, frozen, thawed, stopped and destroyed; a [`Backend`] does it.
//! [`Local`] is the namespaces backend of this machine: a cgroup parent
//! per sandbox (`mcpbox-sb-<id>` in the freezer and CPU accounting
//! hierarchies) that every server process of the sandbox runs under
//! (`Spec::cgroup_parent`), so one write freezes the whole tree and one
//! counter shows its CPU time. A Kubernetes backend maps the same calls
//! onto a Pod per sandbox (docs/scale-out.md).
//!
//! Starting a server is not here: the relay starts it through its
//! launcher, with the spec [`Backend::prepare`] adjusted.

use mcpbox_sandbox::cgroup::{Parent, Version};

/// What a backend reports of one sandbox.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Stats {
    /// Processes in it now.
    pub processes: usize,
    /// CPU time used, in microseconds, where counted.
    pub cpu_usec: Option<u64>,
    /// Memory its processes use now, in bytes, where it can be read.
    pub memory_bytes: Option<u64>,
    /// Whether it is frozen.
    pub frozen: bool,
}

/// Runs sandboxes for the lifecycle.
pub trait Backend: Send + Sync {
    /// Makes what sandbox `id` needs before its first process (its cgroup
    /// parent); also for a sandbox re-adopted after a restart. Returns
    /// the freezer's interface (`v1`, `v2`), or `None` where there is no
    /// freezer (then the sandbox is never paused, only stopped).
    fn create(&self, id: &str) -> Result<Option<String>, String>;
    /// Adjusts the spec every server process of `id` starts with.
    fn prepare(&self, id: &str, spec: &mut mcpbox_sandbox::Spec);
    /// Freezes every process of `id`.
    fn freeze(&self, id: &str) -> Result<(), String>;
    /// Thaws them.
    fn thaw(&self, id: &str) -> Result<(), String>;
    /// Kills whatever process of `id` is left (the relays stopped theirs).
    fn stop(&self, id: &str);
    /// Removes what [`Backend::create`] made; an error says what is left.
    fn destroy(&self, id: &str) -> Result<(), String>;
    /// Processes, CPU, frozen.
    fn stats(&self, id: &str) -> Stats;
    /// What of `id` still exists on this machine (cgroup directories,
    /// processes), for the teardown's check; empty when nothing.
    fn leftovers(&self, id: &str) -> Vec<String>;
    /// Whether a new workspace's writable space is a volume of the
    /// policy's `tmp` size on this host (crate::volume; as root). No by
    /// default: a backend whose sandboxes live elsewhere bounds them its
    /// own way, and a test's backend makes no mounts.
    fn bounded_workspaces(&self) -> bool {
        false
    }
}

/// The cgroup name of sandbox `id`.
pub fn group_name(id: &str) -> String {
    format!("mcpbox-{id}")
}

/// The local namespaces backend.
pub struct Local {
    /// Force the freezer's interface (`MCPBOX_FREEZER=v1|v2`), else v2
    /// where usable.
    prefer: Option<Version>,
    /// Whether a cgroup parent could be made at all (checked at start).
    usable: Result<(), String>,
    /// The parents made or found, by id: the thaw on a call must not read
    /// /proc/self/mountinfo again.
    parents: std::sync::Mutex<std::collections::HashMap<String, Parent>>,
}

impl Local {
    /// Checks once whether this host lets mcpbox make cgroup parents; when
    /// not, sandboxes run without one (no pause, processes still end with
    /// their sandbox's pid namespace) and the reason is logged.
    pub fn new() -> Local {
        let prefer = match std::env::var("MCPBOX_FREEZER").ok().as_deref() {
            Some("v1") => Some(Version::V1),
            Some("v2") => Some(Version::V2),
            _ => None,
        };
        let probe = format!("mcpbox-sb-probe{}", std::process::id());
        let usable = match Parent::create(&probe, prefer) {
            Ok(p) => {
                let _ = p.remove();
                Ok(())
            }
            Err(e) => Err(e.to_string()),
        };
        if let Err(e) = &usable {
            tracing::warn!("sandboxes cannot be paused here (no freezer cgroup): {e}; idle sandboxes are stopped instead");
        }
        Local {
            prefer,
            usable,
            parents: std::sync::Mutex::new(std::collections::HashMap::new()),
        }
    }

    /// The parent of `id`: remembered, or found on the host (a previous
    /// run's), or none.
    fn parent(&self, id: &str) -> Option<Parent> {
        let mut known = self.parents.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(p) = known.get(id) {
            return Some(p.clone());
        }
        let p = Parent::open(&group_name(id))?;
        known.insert(id.to_string(), p.clone());
        Some(p)
    }

    fn forget(&self, id: &str) {
        let mut known = self.parents.lock().unwrap_or_else(|p| p.into_inner());
        known.remove(id);
    }
}

impl Default for Local {
    fn default() -> Self {
        Local::new()
    }
}

fn version_name(v: Version) -> String {
    match v {
        Version::V1 => "v1".into(),
        Version::V2 => "v2".into(),
    }
}

impl Backend for Local {
    fn bounded_workspaces(&self) -> bool {
        true
    }

    fn create(&self, id: &str) -> Result<Option<String>, String> {
        if self.usable.is_err() {
            return Ok(None);
        }
        let p = Parent::create(&group_name(id), self.prefer).map_err(|e| e.to_string())?;
        let version = version_name(p.version());
        let mut known = self.parents.lock().unwrap_or_else(|p| p.into_inner());
        known.insert(id.to_string(), p);
        Ok(Some(version))
    }

    fn prepare(&self, id: &str, spec: &mut mcpbox_sandbox::Spec) {
        if self.usable.is_ok() {
            spec.cgroup_parent = Some(group_name(id));
        }
    }

    fn freeze(&self, id: &str) -> Result<(), String> {
        let p = self
            .parent(id)
            .ok_or_else(|| format!("sandbox {id} has no freezer cgroup here"))?;
        p.freeze().map_err(|e| e.to_string())
    }

    fn thaw(&self, id: &str) -> Result<(), String> {
        match self.parent(id) {
            // no wait for the processes to run again: what is written to
            // them meanwhile waits in their pipes
            Some(p) => p.thaw_quick().map_err(|e| e.to_string()),
            None => Ok(()),
        }
    }

    fn stop(&self, id: &str) {
        if let Some(p) = self.parent(id) {
            if let Err(e) = p.kill_all() {
                tracing::error!(sandbox = id, "killing what is left: {e}");
            }
        }
    }

    fn destroy(&self, id: &str) -> Result<(), String> {
        match self.parent(id) {
            Some(p) => {
                self.forget(id);
                let killed = p.kill_all();
                p.remove().map_err(|e| match killed {
                    Err(k) => format!("{e} (killing: {k})"),
                    Ok(()) => e.to_string(),
                })
            }
            None => Ok(()),
        }
    }

    fn stats(&self, id: &str) -> Stats {
        match self.parent(id) {
            Some(p) => {
                // one listing of the processes for the count and the memory
                let procs = p.procs();
                Stats {
                    processes: procs.len(),
                    cpu_usec: p.cpu_usage().map(|d| d.as_micros() as u64),
                    memory_bytes: Some(p.memory_usage(&procs)),
                    frozen: p.is_frozen(),
                }
            }
            None => Stats::default(),
        }
    }

    fn leftovers(&self, id: &str) -> Vec<String> {
        let Some(p) = self.parent(id) else {
            return Vec::new();
        };
        let mut left: Vec<String> = p
            .procs()
            .iter()
            .map(|pid| format!("process {pid}"))
            .collect();
        left.extend(
            p.dirs()
                .iter()
                .filter(|d| d.exists())
                .map(|d| format!("cgroup {}", d.display())),
        );
        left
    }
}
