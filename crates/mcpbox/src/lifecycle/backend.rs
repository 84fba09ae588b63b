//! The seam between the lifecycle and whatever runs sandboxes.
//!
//! The lifecycle ([`super::Lifecycle`], driving
//! [`mcpbox_lifecycle::machine`]) decides *when* a sandbox is created,
//! frozen, thawed, stopped and destroyed; a [`Backend`] does it, and starts
//! every server process of the sandbox: a relay of `serve` starts its
//! server through [`Launch`], the gateway's `Launcher` over
//! [`Backend::start`], and sees only the stdio and the process control it
//! hands back. So a second backend (a gVisor runtime, a container engine,
//! a Pod per sandbox: docs/scale-out.md) implements this trait and nothing
//! in the relay changes.
//!
//! [`Local`] is the namespaces backend of this machine: a cgroup parent
//! per sandbox (`mcpbox-<id>` in the freezer and CPU accounting
//! hierarchies) that every server process of the sandbox runs under
//! (`Spec::cgroup_parent`), so one write freezes the whole tree and one
//! counter shows its CPU time; its servers start through
//! [`crate::launch::spawn`], as `mcpbox run`'s do.

use std::sync::Arc;

use mcpbox_gateway::{Launcher, ServerProcess};
use mcpbox_sandbox::cgroup::{Parent, Version};
use mcpbox_sandbox::Spec;

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

/// Runs sandboxes for the lifecycle. Object-safe: the lifecycle and
/// `serve` hold an `Arc<dyn Backend>`. Every call names the sandbox by
/// its id; a call on an id the backend does not know does nothing (or
/// says so), so a teardown or a restart's cleanup may call it blindly.
pub trait Backend: Send + Sync {
    /// Makes what sandbox `id` needs before its first process (its cgroup
    /// parent); also for a sandbox re-adopted after a restart. Returns
    /// the freezer's interface (`v1`, `v2`), or `None` where there is no
    /// freezer (then the sandbox is never paused, only stopped).
    fn create(&self, id: &str) -> Result<Option<String>, String>;
    /// Starts one server process in sandbox `id` as `spec` says (its
    /// command, environment, mounts, workspace folders, limits), inside
    /// what [`Backend::create`] made, and hands back its stdio and its
    /// control. Called for each session's server and each restart of it
    /// (a secret's TTL, a parked server woken).
    fn start(&self, id: &str, spec: &Spec) -> std::io::Result<ServerProcess>;
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

/// The gateway's `Launcher` of one session's server in sandbox `id`: each
/// launch (the first, and each restart) goes to [`Backend::start`] with
/// the launch's secrets added to the spec.
pub struct Launch {
    backend: Arc<dyn Backend>,
    id: String,
    spec: Spec,
}

impl Launch {
    pub fn new(backend: Arc<dyn Backend>, id: &str, spec: Spec) -> Launch {
        Launch {
            backend,
            id: id.to_string(),
            spec,
        }
    }
}

impl Launcher for Launch {
    fn launch(&mut self, env: &[(String, String)]) -> std::io::Result<ServerProcess> {
        let spec = crate::launch::with_env(&self.spec, env);
        self.backend.start(&self.id, &spec)
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

    fn start(&self, id: &str, spec: &Spec) -> std::io::Result<ServerProcess> {
        let mut spec = spec.clone();
        if self.usable.is_ok() {
            spec.cgroup_parent = Some(group_name(id));
        }
        crate::launch::spawn(&spec).map(|(server, _init)| server)
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

#[cfg(test)]
pub(crate) mod tests {
    use std::io::Read;
    use std::sync::Mutex;

    use mcpbox_gateway::CommandLauncher;

    use super::*;

    /// A second backend: no cgroup, no namespace, each server a plain
    /// child process; it records what it was asked (and says it has a
    /// freezer when `freezer`, whose freezes and thaws then succeed).
    #[derive(Default)]
    pub(crate) struct Plain {
        pub(crate) calls: Mutex<Vec<String>>,
        pub(crate) freezer: bool,
    }

    impl Plain {
        fn note(&self, call: String) {
            self.calls.lock().unwrap().push(call);
        }
    }

    impl Backend for Plain {
        fn create(&self, id: &str) -> Result<Option<String>, String> {
            self.note(format!("create {id}"));
            Ok(self.freezer.then(|| "plain".to_string()))
        }
        fn start(&self, id: &str, spec: &Spec) -> std::io::Result<ServerProcess> {
            let env: Vec<(String, String)> = spec
                .env
                .iter()
                .map(|(k, v)| {
                    (
                        k.to_string_lossy().into_owned(),
                        v.to_string_lossy().into_owned(),
                    )
                })
                .collect();
            self.note(format!("start {id}"));
            let argv: Vec<String> = spec
                .argv
                .iter()
                .map(|a| a.to_string_lossy().into_owned())
                .collect();
            CommandLauncher::new(&argv[0], &argv[1..]).launch(&env)
        }
        fn freeze(&self, id: &str) -> Result<(), String> {
            self.note(format!("freeze {id}"));
            if self.freezer {
                Ok(())
            } else {
                Err("no freezer".into())
            }
        }
        fn thaw(&self, id: &str) -> Result<(), String> {
            self.note(format!("thaw {id}"));
            Ok(())
        }
        fn stop(&self, id: &str) {
            self.note(format!("stop {id}"));
        }
        fn destroy(&self, id: &str) -> Result<(), String> {
            self.note(format!("destroy {id}"));
            Ok(())
        }
        fn stats(&self, _: &str) -> Stats {
            Stats::default()
        }
        fn leftovers(&self, _: &str) -> Vec<String> {
            Vec::new()
        }
    }

    /// The relay's launcher of a `serve` session hands every launch to
    /// whatever backend it was given, the launch's secrets added to the
    /// spec (replacing a variable of the same name): another backend
    /// plugs in behind `dyn Backend` and the relay sees only stdio.
    #[test]
    fn a_second_backend_starts_the_session_server_with_the_launch_secrets() {
        let plain = Arc::new(Plain::default());
        let backend: Arc<dyn Backend> = plain.clone();
        backend.create("sb-1").unwrap();
        let spec = Spec {
            argv: vec!["/bin/sh".into(), "-c".into(), "printf %s \"$TOKEN\"".into()],
            env: vec![("TOKEN".into(), "stale".into())],
            input: None,
            output: None,
            tmp_size: 1 << 20,
            tmp_dir: None,
            mounts: Vec::new(),
            limits: Default::default(),
            allow_exec: None,
            allow_degraded: false,
            stdio: mcpbox_sandbox::Stdio::Piped,
            egress: None,
            cgroup_parent: None,
        };
        let mut launch = Launch::new(backend, "sb-1", spec);
        let mut server = launch
            .launch(&[("TOKEN".into(), "fresh".into())])
            .expect("started");
        let mut out = String::new();
        std::fs::File::from(server.stdout.as_fd().try_clone_to_owned().unwrap())
            .read_to_string(&mut out)
            .unwrap();
        assert_eq!(out, "fresh");
        assert_eq!(server.control.wait().unwrap().code, Some(0));
        assert_eq!(*plain.calls.lock().unwrap(), ["create sb-1", "start sb-1"]);
    }
}
