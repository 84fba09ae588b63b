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
//! [`Local`] is the backend of this machine: a cgroup parent per sandbox
//! (`mcpbox-<id>` in the freezer and CPU accounting hierarchies) that
//! every namespaces-tier server process of the sandbox runs under
//! (`Spec::cgroup_parent`), so one write freezes the whole tree and one
//! counter shows its CPU time; its servers start through
//! [`crate::launch::spawn`], as `mcpbox run`'s do. A server whose policy
//! chose gVisor starts through [`crate::gvisor::spawn`] as a container
//! named after the sandbox, and each operation also goes to the sandbox's
//! containers through runsc ([`crate::gvisor::Containers`]: `pause`,
//! `resume`, `kill`, `delete`, `events --stats`, with `runsc list` as the
//! source of which exist).

use std::sync::Arc;

use mcpbox_gateway::{Launcher, ServerProcess};
use mcpbox_policy::Isolation;
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
    /// (a secret's TTL, a parked server woken). `server`: its name in the
    /// config; `isolation`: the tier its policy chose (`[sandbox]
    /// isolation`); one sandbox may hold servers of both.
    fn start(
        &self,
        id: &str,
        server: &str,
        spec: &Spec,
        isolation: Isolation,
    ) -> std::io::Result<ServerProcess>;
    /// Writes the memory of `id`'s running servers into `dir` (a new
    /// directory), one directory each named `SERVER.N`, for
    /// `sandboxes snapshot --memory`; how many. A later start of SERVER
    /// in a sandbox whose workspace holds them resumes from them
    /// ([`memory_dir`]). A backend whose checkpoint ends the server keeps
    /// a copy there for `id` itself, so that its own next start resumes
    /// where it was. A backend that cannot says why.
    fn checkpoint(&self, id: &str, dir: &std::path::Path) -> Result<usize, String> {
        let _ = (id, dir);
        self.keeps_memory().map(|()| 0)
    }
    /// Whether [`Backend::checkpoint`] and the resume from its images work
    /// here at all; why not.
    fn keeps_memory(&self) -> Result<(), String> {
        Err("this backend cannot keep a server's memory".into())
    }
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
    server: String,
    spec: Spec,
    isolation: Isolation,
}

impl Launch {
    pub fn new(
        backend: Arc<dyn Backend>,
        id: &str,
        server: &str,
        spec: Spec,
        isolation: Isolation,
    ) -> Launch {
        Launch {
            backend,
            id: id.to_string(),
            server: server.to_string(),
            spec,
            isolation,
        }
    }
}

/// Where the workspace of sandbox `id` keeps its servers' memory images
/// (restored from a `sandboxes snapshot --memory`): in its volume, beside
/// `output` and `tmp` but bound into no sandbox, mcpbox's own.
pub fn memory_dir(state: &std::path::Path, id: &str) -> std::path::PathBuf {
    super::workspace::Workspace::at(state.join("sandboxes").join(id))
        .volume()
        .join(MEMORY)
}

/// The folder of [`memory_dir`] in a workspace's volume, and the part of
/// a snapshot that holds it.
pub const MEMORY: &str = ".memory";

/// A server's name as a file name of an image directory (`SERVER.N`).
fn image_name_ok(server: &str) -> bool {
    !server.is_empty()
        && server.len() <= 64
        && !server.starts_with('.')
        && server
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b"-_".contains(&b))
}

/// Copies the files of image directory `from` (runsc writes only files
/// there) into `to`, a new directory.
fn copy_image(from: &std::path::Path, to: &std::path::Path) -> Result<(), String> {
    let fail = |e: std::io::Error| format!("copying the memory image {}: {e}", from.display());
    std::fs::create_dir(to).map_err(fail)?;
    for e in std::fs::read_dir(from).map_err(fail)? {
        let e = e.map_err(fail)?;
        if e.file_type().map_err(fail)?.is_file() {
            std::fs::copy(e.path(), to.join(e.file_name())).map_err(fail)?;
        }
    }
    Ok(())
}

/// The image of `server` a start resumes from: the lowest `SERVER.N` in
/// `dir`, if any.
fn next_image(dir: &std::path::Path, server: &str) -> Option<std::path::PathBuf> {
    let mut found: Vec<(u32, std::path::PathBuf)> = std::fs::read_dir(dir)
        .ok()?
        .flatten()
        .filter_map(|e| {
            let name = e.file_name().into_string().ok()?;
            let n = name.strip_prefix(server)?.strip_prefix('.')?.parse().ok()?;
            e.file_type().ok()?.is_dir().then(|| (n, e.path()))
        })
        .collect();
    found.sort();
    found.into_iter().next().map(|(_, p)| p)
}

impl Launcher for Launch {
    fn launch(&mut self, env: &[(String, String)]) -> std::io::Result<ServerProcess> {
        let spec = crate::launch::with_env(&self.spec, env);
        self.backend
            .start(&self.id, &self.server, &spec, self.isolation)
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
    /// The gVisor tier's containers, where it can run here.
    gvisor: Option<crate::gvisor::Containers>,
    /// The sandboxes that started a gVisor server in this process, with
    /// each container's id and server: only theirs are asked of runsc
    /// (each call a process, ~20 ms). A killed mcpbox's containers are
    /// deleted when this one starts (`Containers::here`). An id leaves
    /// once its teardown found nothing.
    gvisor_ids: std::sync::Mutex<std::collections::HashMap<String, Vec<(String, String)>>>,
    /// One lock per such sandbox around its runsc operations: a pause
    /// during a checkpoint kills this runsc's container.
    gvisor_ops: std::sync::Mutex<std::collections::HashMap<String, Arc<std::sync::Mutex<()>>>>,
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
            gvisor: crate::gvisor::Containers::here(),
            gvisor_ids: std::sync::Mutex::new(std::collections::HashMap::new()),
            gvisor_ops: std::sync::Mutex::new(std::collections::HashMap::new()),
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

    /// The gVisor containers of `id`, if it started any here.
    fn gvisor(&self, id: &str) -> Option<&crate::gvisor::Containers> {
        let ids = self.gvisor_ids.lock().unwrap_or_else(|p| p.into_inner());
        ids.contains_key(id)
            .then_some(self.gvisor.as_ref())
            .flatten()
    }

    /// The lock of `id`'s runsc operations.
    fn gvisor_lock(&self, id: &str) -> Arc<std::sync::Mutex<()>> {
        let mut locks = self.gvisor_ops.lock().unwrap_or_else(|p| p.into_inner());
        locks.entry(id.to_string()).or_default().clone()
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

    fn start(
        &self,
        id: &str,
        server: &str,
        spec: &Spec,
        isolation: Isolation,
    ) -> std::io::Result<ServerProcess> {
        if isolation == Isolation::Gvisor {
            // its own cgroup is runsc's (`/mcpbox-gvisor/CONTAINER`); the
            // pause is runsc's too
            self.gvisor_ids
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .entry(id.to_string())
                .or_default();
            // a restored snapshot's memory of this server, taken once:
            // whatever the start's outcome, the next start is a fresh one
            // (not while a checkpoint of this sandbox is being written)
            let lock = self.gvisor_lock(id);
            let _held = lock.lock().unwrap_or_else(|p| p.into_inner());
            let images = memory_dir(&crate::state::state_dir(), id);
            // renamed out of the way first (runsc reads it once it runs,
            // and it goes with the container's state)
            let image = next_image(&images, server).and_then(|found| {
                static TAKEN: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
                let n = TAKEN.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                let taken = images.join(format!(".taken-{}-{n}", std::process::id()));
                std::fs::rename(&found, &taken).ok().map(|()| taken)
            });
            let started = crate::gvisor::spawn(spec, Some(id), image.as_deref());
            if let (Err(_), Some(image)) = (&started, &image) {
                let _ = std::fs::remove_dir_all(image);
            }
            let (process, _, container) = started.map_err(|e| match &image {
                Some(_) => std::io::Error::other(format!(
                    "resuming {server} from its snapshot's memory: {e} (the image is removed: \
                     the next start is a fresh one)"
                )),
                None => e,
            })?;
            if let Some(list) = self
                .gvisor_ids
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .get_mut(id)
            {
                list.push((container, server.to_string()));
            }
            return Ok(process);
        }
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
        p.freeze().map_err(|e| e.to_string())?;
        match self.gvisor(id) {
            Some(g) => {
                let lock = self.gvisor_lock(id);
                let _held = lock.lock().unwrap_or_else(|p| p.into_inner());
                g.pause(id).inspect_err(|_| {
                    let _ = p.thaw_quick();
                })
            }
            None => Ok(()),
        }
    }

    fn thaw(&self, id: &str) -> Result<(), String> {
        let gvisor = match self.gvisor(id) {
            Some(g) => {
                let lock = self.gvisor_lock(id);
                let _held = lock.lock().unwrap_or_else(|p| p.into_inner());
                g.resume(id)
            }
            None => Ok(()),
        };
        let local = match self.parent(id) {
            // no wait for the processes to run again: what is written to
            // them meanwhile waits in their pipes
            Some(p) => p.thaw_quick().map_err(|e| e.to_string()),
            None => Ok(()),
        };
        gvisor.and(local)
    }

    fn stop(&self, id: &str) {
        if let Some(g) = self.gvisor(id) {
            let lock = self.gvisor_lock(id);
            let _held = lock.lock().unwrap_or_else(|p| p.into_inner());
            g.kill(id);
        }
        if let Some(p) = self.parent(id) {
            if let Err(e) = p.kill_all() {
                tracing::error!(sandbox = id, "killing what is left: {e}");
            }
        }
    }

    fn destroy(&self, id: &str) -> Result<(), String> {
        let gvisor = match self.gvisor(id) {
            Some(g) => {
                let lock = self.gvisor_lock(id);
                let _held = lock.lock().unwrap_or_else(|p| p.into_inner());
                g.kill(id);
                g.delete(id)
            }
            None => Ok(()),
        };
        let local = match self.parent(id) {
            Some(p) => {
                self.forget(id);
                let killed = p.kill_all();
                p.remove().map_err(|e| match killed {
                    Err(k) => format!("{e} (killing: {k})"),
                    Ok(()) => e.to_string(),
                })
            }
            None => Ok(()),
        };
        gvisor.and(local)
    }

    fn keeps_memory(&self) -> Result<(), String> {
        match &self.gvisor {
            None => Err(
                "only the gVisor tier keeps a server's memory, and it cannot run here \
                 (`mcpbox doctor`)"
                    .into(),
            ),
            // runsc says "Rootless mode not supported with \"restore\""
            // (measured), and its checkpoint ends the server
            Some(g) if g.rootless() => Err("runsc --rootless cannot restore a checkpoint: a \
                 server's memory is kept with mcpbox running as root only"
                .into()),
            Some(_) => Ok(()),
        }
    }

    fn checkpoint(&self, id: &str, dir: &std::path::Path) -> Result<usize, String> {
        self.keeps_memory()?;
        let Some(g) = self.gvisor(id) else {
            return Err(format!(
                "sandbox {id} runs no gVisor server here: only the gVisor tier keeps a \
                 server's memory (runsc checkpoint)"
            ));
        };
        let containers = self
            .gvisor_ids
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .get(id)
            .cloned()
            .unwrap_or_default();
        let lock = self.gvisor_lock(id);
        let _held = lock.lock().unwrap_or_else(|p| p.into_inner());
        let live: Vec<String> = g.of(id).into_iter().map(|c| c.id).collect();
        let mut count: std::collections::HashMap<&str, u32> = std::collections::HashMap::new();
        let mut written = 0;
        std::fs::create_dir(dir).map_err(|e| format!("{}: {e}", dir.display()))?;
        // This runsc's checkpoint ends the container (gvisor::Containers::
        // checkpoint), so each image is written where this sandbox's own
        // next start of that server resumes from it (its relay starts it
        // again), and copied into `dir`, under the lock, before any start
        // can take it.
        let own = memory_dir(&crate::state::state_dir(), id);
        for (container, server) in &containers {
            if !live.contains(container) {
                continue;
            }
            if !image_name_ok(server) {
                return Err(format!("server name {server:?} cannot name a memory image"));
            }
            let n = count.entry(server.as_str()).or_default();
            let name = format!("{server}.{n}");
            *n += 1;
            std::fs::create_dir_all(&own).map_err(|e| format!("{}: {e}", own.display()))?;
            let kept = own.join(&name);
            let _ = std::fs::remove_dir_all(&kept);
            g.checkpoint(container, &kept)?;
            copy_image(&kept, &dir.join(&name))?;
            written += 1;
        }
        if written == 0 {
            return Err(format!("sandbox {id} has no running gVisor server to keep"));
        }
        Ok(written)
    }

    fn stats(&self, id: &str) -> Stats {
        let mut stats = match self.parent(id) {
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
        };
        if let Some(g) = self.gvisor(id) {
            let (procs, cpu_usec, memory, paused) = g.stats(id);
            if procs > 0 || paused {
                stats.processes += procs;
                stats.cpu_usec = Some(stats.cpu_usec.unwrap_or(0) + cpu_usec);
                stats.memory_bytes = Some(stats.memory_bytes.unwrap_or(0) + memory);
                stats.frozen |= paused;
            }
        }
        stats
    }

    fn leftovers(&self, id: &str) -> Vec<String> {
        let mut left: Vec<String> = match self.gvisor(id) {
            Some(g) => g
                .of(id)
                .into_iter()
                .map(|c| format!("gVisor container {} ({})", c.id, c.status))
                .collect(),
            None => Vec::new(),
        };
        if left.is_empty() {
            self.gvisor_ids
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .remove(id);
            self.gvisor_ops
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .remove(id);
        }
        let Some(p) = self.parent(id) else {
            return left;
        };
        left.extend(p.procs().iter().map(|pid| format!("process {pid}")));
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
        fn start(
            &self,
            id: &str,
            _: &str,
            spec: &Spec,
            _: Isolation,
        ) -> std::io::Result<ServerProcess> {
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
        let mut launch = Launch::new(backend, "sb-1", "srv", spec, Isolation::Namespaces);
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
