//! The OCI bundle of one gVisor sandbox, as data: the namespaces tier's
//! mount plan ([`mcpbox_sandbox::plan::plan`], the one description of what
//! a sandbox's root holds) turned into an OCI runtime `config.json` and
//! the few files of a root directory.
//!
//! What each step of the plan becomes:
//!
//! - a directory, a file mcpbox writes (`/etc/passwd`, ...) or a symlink of
//!   the root: made in the bundle's `rootfs`, which runsc shows read-only;
//! - a bind of a host directory: an OCI bind mount, read-only or
//!   read-write as the plan says, always `nosuid` and `nodev` (served to
//!   gVisor by its gofer, never mounted on the host);
//! - a tmpfs (`/workspace/tmp`, `/dev/shm`): a tmpfs of gVisor's own, of
//!   the plan's size; `/workspace/tmp` and `HOME` in it belong to the
//!   sandbox user;
//! - `/proc`: gVisor's own procfs (its processes only, its kernel's
//!   version); nothing of the host's `/proc`, `/sys` or `/dev` is shown:
//!   gVisor makes its own `/dev` (null, zero, full, random, urandom, tty,
//!   ptmx, the fd links) and `/sys`, so the plan's `/dev` steps, whose
//!   binds are the host's device nodes, are left out.
//!
//! - the sandbox's tmp shown at `/tmp` too (the plan's alias, when a
//!   policy mount lives below `/tmp`): OCI has no bind from inside the
//!   sandbox, so `/tmp` gets the same host directory when tmp is one (a
//!   kept tmp), else a second gVisor tmpfs of tmp's size, the sandbox
//!   user's (docs/isolation.md); the mount points below it are made by
//!   gVisor.
//!
//! What the plan has that a bundle cannot say is refused
//! ([`Unsupported`]): `noexec` steps (`process.allow_exec`, refused at
//! check for this tier before a bundle is ever written).

use std::path::{Path, PathBuf};

use mcpbox_sandbox::plan::{Access, Step};
use mcpbox_sandbox::{Spec, HOME, TMP};
use serde_json::{json, Value};

/// The user a gVisor sandbox's processes run as, inside gVisor (and the
/// owner gVisor's file checks see): nobody, as the namespaces tier maps
/// its sandbox user to when mcpbox runs as root.
pub const USER: u32 = mcpbox_sandbox::ROOT_RUN_HOST_ID;

/// The host tasks one sandbox process costs under `--platform=ptrace`
/// (its stub process and threads, measured here: about 11), and the
/// tasks of gVisor itself (its kernel's and gofer's threads: about 50),
/// from which the host pids limit is set for `process.pids`.
pub const TASKS_PER_PROCESS: u64 = 12;
pub const TASKS_OF_GVISOR: u64 = 128;

/// A step of the plan that a bundle cannot express.
#[derive(Debug, PartialEq, Eq)]
pub struct Unsupported(pub String);

impl std::fmt::Display for Unsupported {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.0)
    }
}

/// What the bundle's `rootfs` holds before runsc starts: made by
/// [`write_rootfs`], never followed through a link.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Entry {
    Dir(PathBuf, u32),
    File(PathBuf, String),
    Symlink(PathBuf, PathBuf),
}

/// The bundle of `spec`: its `config.json` and what its root holds.
#[derive(Debug)]
pub struct Bundle {
    pub config: Value,
    pub rootfs: Vec<Entry>,
}

/// Whether `path` is `/dev` or below it (gVisor's own `/dev`).
fn under_dev(path: &Path) -> bool {
    path.starts_with("/dev")
}

/// Where a bundle runs.
#[derive(Debug, Clone, Copy)]
pub struct Host<'a> {
    /// The host cgroup path runsc makes for it (`linux.cgroupsPath`).
    pub cgroup: &'a str,
    /// The network namespace it joins (egress: the one that holds the way
    /// to mcpbox's proxy, see `super::network_holder`), else a new one of
    /// its own.
    pub netns: Option<&'a Path>,
    /// runsc `--rootless --ignore-cgroups` (mcpbox is not root): no
    /// cgroup, and the server is uid 0 of runsc's user namespace (the
    /// caller outside, whose files are then its own), with no capability.
    pub rootless: bool,
}

impl Host<'_> {
    /// The server's user inside gVisor.
    pub fn user(&self) -> u32 {
        if self.rootless {
            0
        } else {
            USER
        }
    }
}

/// Builds the bundle of `spec` from the namespaces tier's `plan`.
pub fn build(spec: &Spec, plan: &[Step], host: &Host<'_>) -> Result<Bundle, Unsupported> {
    let user = host.user();
    let mut mounts: Vec<Value> = Vec::new();
    let mut rootfs: Vec<Entry> = Vec::new();
    // mount points: a directory below one of these is made by gVisor
    // inside the mount, not in the root (where the mount would hide it)
    let mut mounted: Vec<PathBuf> = Vec::new();
    let inside_mount = |mounted: &[PathBuf], path: &Path| {
        mounted
            .iter()
            .any(|m| path != m.as_path() && path.starts_with(m))
    };
    // Whether /tmp is the alias's mount (see the module's comment).
    let mut tmp_alias = false;
    for step in plan {
        match step {
            Step::Dir { path, mode } => {
                if under_dev(path) {
                    continue;
                }
                // The parents of the policy's mount points below /tmp:
                // gVisor makes a mount's destination, parents included.
                if tmp_alias && path.starts_with("/tmp") {
                    continue;
                }
                if inside_mount(&mounted, path) {
                    // HOME in the tmp tmpfs: a tmpfs of its own there, the
                    // sandbox user's (gVisor makes the mount point). In a
                    // kept tmp (a host directory: `serve`, `run
                    // --builtin`) it is a directory of that tmp, made on
                    // the host before the start (`super::home_in_kept_tmp`),
                    // as the namespaces tier's init makes it: part of the
                    // workspace, its snapshots and restores.
                    if path.as_path() == Path::new(HOME) {
                        if spec.tmp_dir.is_none() {
                            mounts.push(tmpfs(path, Some(spec.tmp_size), 0o700, Some(user)));
                            mounted.push(path.clone());
                        }
                        continue;
                    }
                    return Err(Unsupported(format!(
                        "{} would be made inside a mount",
                        path.display()
                    )));
                }
                rootfs.push(Entry::Dir(path.clone(), *mode));
            }
            Step::File { path, contents } => {
                if inside_mount(&mounted, path) {
                    return Err(Unsupported(format!(
                        "{} would be written inside a mount",
                        path.display()
                    )));
                }
                rootfs.push(Entry::File(path.clone(), contents.clone()));
            }
            Step::Symlink { path, target } => {
                if under_dev(path) {
                    continue;
                }
                rootfs.push(Entry::Symlink(path.clone(), target.clone()));
            }
            Step::Tmpfs { path, size, mode } => {
                // gVisor's /dev is its own; /dev/shm is mounted in it
                if path.as_path() == Path::new("/dev") {
                    continue;
                }
                let own = (path.as_path() == Path::new(TMP)).then_some(user);
                mounts.push(tmpfs(path, Some(*size), *mode, own));
                mounted.push(path.clone());
            }
            Step::Bind { host, path, access } => {
                let mode = match access {
                    Access::Device => continue,
                    Access::ReadOnly => "ro",
                    Access::ReadWrite => "rw",
                };
                // a file's mount point is a file of the root (gVisor
                // would make a directory there), unless the plan made it
                let made = rootfs
                    .iter()
                    .any(|e| matches!(e, Entry::File(p, _) if p == path));
                if !host.is_dir() && !made && !inside_mount(&mounted, path) {
                    rootfs.push(Entry::File(path.clone(), String::new()));
                }
                mounts.push(json!({
                    "destination": path,
                    "type": "bind",
                    "source": host,
                    "options": ["rbind", mode, "nosuid", "nodev"],
                }));
                mounted.push(path.clone());
            }
            Step::Proc { path } => {
                mounts.push(json!({"destination": path, "type": "proc", "source": "proc"}));
                mounted.push(path.clone());
            }
            // ownership of tmp and HOME: their tmpfs options say it
            Step::Chown { path, .. }
                if path.as_path() == Path::new(TMP) || path.as_path() == Path::new(HOME) => {}
            Step::Chown { path, .. } => {
                return Err(Unsupported(format!(
                    "{} cannot be given to the sandbox user",
                    path.display()
                )))
            }
            Step::Alias { from, path } => {
                if from.as_path() != Path::new(TMP) || path.as_path() != Path::new("/tmp") {
                    return Err(Unsupported(format!(
                        "{} shown at {} too",
                        from.display(),
                        path.display()
                    )));
                }
                match &spec.tmp_dir {
                    Some(host) => mounts.push(json!({
                        "destination": path,
                        "type": "bind",
                        "source": host,
                        "options": ["rbind", "rw", "nosuid", "nodev"],
                    })),
                    None => mounts.push(tmpfs(path, Some(spec.tmp_size), 0o755, Some(user))),
                }
                mounted.push(path.clone());
                tmp_alias = true;
            }
            Step::NoExec { path } => {
                return Err(Unsupported(format!(
                    "noexec on {} (process.allow_exec)",
                    path.display()
                )))
            }
        }
    }
    let env: Vec<String> = spec
        .env
        .iter()
        .map(|(k, v)| match (k.to_str(), v.to_str()) {
            (Some(k), Some(v)) => Ok(format!("{k}={v}")),
            _ => Err(Unsupported(format!(
                "the environment variable {} is not UTF-8",
                k.to_string_lossy()
            ))),
        })
        .collect::<Result<_, _>>()?;
    let args: Vec<String> = spec
        .argv
        .iter()
        .map(|a| {
            a.to_str()
                .map(str::to_string)
                .ok_or_else(|| Unsupported(format!("the argument {a:?} is not UTF-8")))
        })
        .collect::<Result<_, _>>()?;
    let mut resources = serde_json::Map::new();
    if let Some(memory) = spec.limits.memory {
        resources.insert("memory".into(), json!({ "limit": memory }));
    }
    if let Some(cores) = spec.limits.cpu {
        let period: u64 = 100_000;
        let quota = ((cores * period as f64).ceil() as u64).max(1000);
        resources.insert("cpu".into(), json!({ "quota": quota, "period": period }));
    }
    if let Some(pids) = spec.limits.pids {
        resources.insert("pids".into(), json!({ "limit": host_tasks(pids) }));
    }
    // Counted by gVisor's own kernel, per process (prctl-free, so it
    // holds rootless too): the processes of the server's user, and,
    // rootless where no cgroup bounds the sandbox, each process's address
    // space (the namespaces tier's rlimit fallback; check asks for
    // sandbox.dangerously_allow_degraded first).
    let mut rlimits = Vec::new();
    if let Some(pids) = spec.limits.pids {
        rlimits.push(json!({"type": "RLIMIT_NPROC", "hard": pids, "soft": pids}));
    }
    if let (true, Some(memory)) = (host.rootless, spec.limits.memory) {
        rlimits.push(json!({"type": "RLIMIT_AS", "hard": memory, "soft": memory}));
    }
    let network = match host.netns {
        Some(path) => json!({"type": "network", "path": path}),
        None => json!({"type": "network"}),
    };
    let mut linux = json!({
        "namespaces": [
            {"type": "pid"}, {"type": "ipc"}, {"type": "uts"},
            {"type": "mount"}, network
        ],
    });
    if !host.rootless {
        linux["cgroupsPath"] = json!(host.cgroup);
        linux["resources"] = Value::Object(resources);
    }
    let config = json!({
        "ociVersion": "1.0.2",
        "process": {
            "terminal": false,
            "user": { "uid": user, "gid": user },
            "rlimits": rlimits,
            "args": args,
            "env": env,
            "cwd": mcpbox_sandbox::WORKSPACE,
            "capabilities": {
                "bounding": [], "effective": [], "inheritable": [], "permitted": [], "ambient": []
            },
            "noNewPrivileges": true,
        },
        "root": { "path": "rootfs", "readonly": true },
        "hostname": "mcpbox",
        "mounts": mounts,
        "linux": linux,
    });
    Ok(Bundle { config, rootfs })
}

/// The host tasks a sandbox of `pids` processes may have: gVisor's own
/// and, under the ptrace platform, each process's stub ([`TASKS_PER_PROCESS`]).
pub fn host_tasks(pids: u64) -> u64 {
    TASKS_OF_GVISOR.saturating_add(pids.saturating_mul(TASKS_PER_PROCESS))
}

/// A tmpfs at `path`; `own`: the user who owns its root.
fn tmpfs(path: &Path, size: Option<u64>, mode: u32, own: Option<u32>) -> Value {
    let mut options = vec![format!("mode={mode:o}"), "nosuid".into(), "nodev".into()];
    if let Some(size) = size {
        options.push(format!("size={size}"));
    }
    if let Some(user) = own {
        options.push(format!("uid={user}"));
        options.push(format!("gid={user}"));
    }
    json!({"destination": path, "type": "tmpfs", "source": "tmpfs", "options": options})
}

/// Makes the root's entries below `rootfs` (an empty directory of
/// mcpbox's): each path is relative to it, made with `create_new`
/// semantics, and a directory already there (a parent made twice) is
/// fine. Nothing here follows a symlink: every parent was made here.
pub fn write_rootfs(rootfs: &Path, entries: &[Entry]) -> std::io::Result<()> {
    use std::os::unix::fs::{DirBuilderExt, PermissionsExt};
    let at = |p: &Path| rootfs.join(p.strip_prefix("/").unwrap_or(p));
    for e in entries {
        match e {
            Entry::Dir(p, mode) => {
                let path = at(p);
                match std::fs::DirBuilder::new().mode(*mode).create(&path) {
                    Ok(()) => {}
                    Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => continue,
                    Err(e) => return Err(e),
                }
                // the umask may have taken bits off
                std::fs::set_permissions(&path, std::fs::Permissions::from_mode(*mode))?;
            }
            Entry::File(p, contents) => {
                let path = at(p);
                let mut f = std::fs::OpenOptions::new()
                    .write(true)
                    .create_new(true)
                    .open(&path)?;
                std::io::Write::write_all(&mut f, contents.as_bytes())?;
                f.set_permissions(std::fs::Permissions::from_mode(0o644))?;
            }
            Entry::Symlink(p, target) => std::os::unix::fs::symlink(target, at(p))?,
        }
    }
    Ok(())
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;
    use mcpbox_sandbox::plan::{plan, HostFacts};
    use mcpbox_sandbox::{BindMount, Limits, Stdio};

    fn as_root(cgroup: &str) -> Host<'_> {
        Host {
            cgroup,
            netns: None,
            rootless: false,
        }
    }

    pub(crate) fn spec() -> Spec {
        Spec {
            argv: vec!["/usr/bin/python3".into(), "-q".into()],
            env: vec![("PATH".into(), "/usr/bin:/bin".into())],
            input: Some("/srv/in".into()),
            output: Some("/srv/out".into()),
            tmp_size: 1 << 20,
            tmp_dir: None,
            mounts: vec![BindMount {
                host: "/opt/tool".into(),
                at: "/opt/tool".into(),
                writable: false,
            }],
            limits: Limits {
                memory: Some(64 << 20),
                pids: Some(10),
                cpu: Some(0.5),
                timeout: None,
            },
            allow_exec: None,
            allow_degraded: false,
            stdio: Stdio::Piped,
            egress: None,
            cgroup_parent: None,
        }
    }

    fn mounts(b: &Bundle) -> Vec<(String, String, Vec<String>)> {
        b.config["mounts"]
            .as_array()
            .unwrap()
            .iter()
            .map(|m| {
                (
                    m["destination"].as_str().unwrap().to_string(),
                    m["type"].as_str().unwrap().to_string(),
                    m["options"]
                        .as_array()
                        .map(|o| o.iter().map(|s| s.as_str().unwrap().to_string()).collect())
                        .unwrap_or_default(),
                )
            })
            .collect()
    }

    /// The bundle shows what the namespaces tier's plan shows: the same
    /// host directories, read-only unless the plan says read-write, and
    /// nothing of the host's /dev.
    #[test]
    fn the_bundle_mounts_what_the_namespaces_plan_mounts_and_no_host_device() {
        let s = spec();
        let steps = plan(&s, &HostFacts::read(&s));
        let b = build(&s, &steps, &as_root("/mcpbox-gvisor-x")).unwrap();
        let m = mounts(&b);
        let find = |d: &str| m.iter().find(|(dest, _, _)| dest == d).cloned();
        let (_, kind, opts) = find("/usr").expect("/usr bound");
        assert_eq!(kind, "bind");
        assert!(opts.contains(&"ro".to_string()) && opts.contains(&"nosuid".to_string()));
        let (_, _, opts) = find("/workspace/input").unwrap();
        assert!(opts.contains(&"ro".to_string()));
        let (_, _, opts) = find("/workspace/output").unwrap();
        assert!(opts.contains(&"rw".to_string()) && opts.contains(&"nodev".to_string()));
        let (_, _, opts) = find("/opt/tool").unwrap();
        assert!(opts.contains(&"ro".to_string()));
        let (_, kind, opts) = find("/workspace/tmp").unwrap();
        assert_eq!(kind, "tmpfs");
        assert!(opts.contains(&format!("size={}", 1 << 20)));
        assert!(opts.contains(&format!("uid={USER}")));
        assert!(find(HOME).is_some(), "HOME is the sandbox user's");
        assert_eq!(find("/proc").unwrap().1, "proc");
        // every bind's source is one the plan names; no host device
        for step in &steps {
            if let Step::Bind { host, access, .. } = step {
                let shown = b.config["mounts"]
                    .as_array()
                    .unwrap()
                    .iter()
                    .any(|m| m["source"] == json!(host));
                assert_eq!(shown, *access != Access::Device, "{}", host.display());
            }
        }
        assert!(!b.config["mounts"]
            .as_array()
            .unwrap()
            .iter()
            .any(
                |m| m["source"].as_str().is_some_and(|s| s.starts_with("/dev")
                    || s.starts_with("/proc")
                    || s.starts_with("/sys"))
            ));
        // the generated identity files are in the root, read-only
        assert!(b
            .rootfs
            .iter()
            .any(|e| matches!(e, Entry::File(p, c) if p == Path::new("/etc/passwd") && c.contains("nobody"))));
        assert_eq!(b.config["root"]["readonly"], json!(true));
    }

    #[test]
    fn the_bundle_carries_the_limits_the_user_and_no_capability() {
        let s = spec();
        let b = build(&s, &plan(&s, &HostFacts::read(&s)), &as_root("/g")).unwrap();
        let r = &b.config["linux"]["resources"];
        assert_eq!(r["memory"]["limit"], json!(64u64 << 20));
        assert_eq!(r["cpu"]["quota"], json!(50_000));
        assert_eq!(r["pids"]["limit"], json!(host_tasks(10)));
        assert_eq!(b.config["process"]["user"]["uid"], json!(65534));
        assert_eq!(b.config["process"]["capabilities"]["bounding"], json!([]));
        assert_eq!(
            b.config["process"]["args"],
            json!(["/usr/bin/python3", "-q"])
        );
        assert_eq!(b.config["linux"]["cgroupsPath"], json!("/g"));
    }

    /// What a bundle cannot say is refused, never dropped.
    #[test]
    fn an_exec_allowlist_is_refused_not_dropped() {
        let mut s = spec();
        s.allow_exec = Some(vec!["/usr/bin/python3".into()]);
        let e = build(&s, &plan(&s, &HostFacts::read(&s)), &as_root("/g")).unwrap_err();
        assert!(e.0.contains("noexec"), "{e}");
    }

    /// A policy mount below /tmp (a checkout or a venv under the host's
    /// /tmp): /tmp is a tmpfs of tmp's size, the sandbox user's, and the
    /// mount comes after it, its parents left to gVisor.
    #[test]
    fn a_mount_below_tmp_gets_a_tmp_of_its_own_and_its_mount_inside() {
        let mut s = spec();
        s.mounts.push(BindMount {
            host: "/usr/share".into(),
            at: "/tmp/ci/tools".into(),
            writable: false,
        });
        let b = build(&s, &plan(&s, &HostFacts::read(&s)), &as_root("/g")).unwrap();
        let mounts = b.config["mounts"].as_array().unwrap();
        let at = |d: &str| mounts.iter().position(|m| m["destination"] == json!(d));
        let tmp = at("/tmp").expect("a /tmp mount");
        let tools = at("/tmp/ci/tools").expect("the mount below it");
        assert!(tmp < tools, "{mounts:?}");
        assert_eq!(mounts[tmp]["type"], "tmpfs");
        let opts = mounts[tmp]["options"].to_string();
        assert!(opts.contains(&format!("size={}", s.tmp_size)), "{opts}");
        assert!(opts.contains(&format!("uid={USER}")), "{opts}");
        assert!(
            !b.rootfs
                .iter()
                .any(|e| matches!(e, Entry::Dir(p, _) if p.starts_with("/tmp/ci"))),
            "{:?}",
            b.rootfs
        );
    }
}
