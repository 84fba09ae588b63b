//! Control groups: memory and CPU limits for the whole sandbox.
//!
//! cgroup v2 (one unified hierarchy, cgroups(7)) is used where it offers the
//! controller we need; otherwise cgroup v1, one hierarchy per controller, as
//! on hybrid hosts where memory, pids and cpu still live on v1. A sandbox
//! gets its own child group below mcpbox's own group in each hierarchy, so
//! outer limits keep applying. pids are limited with RLIMIT_NPROC inside
//! the sandbox's user namespace (counted per user namespace since Linux
//! 5.14), which needs no cgroup; a pids cgroup is added where one is made
//! anyway.

use std::fs;
use std::io;
use std::path::{Path, PathBuf};

use crate::{Error, Limits, Result};

/// Which cgroup interface a group lives on.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Version {
    V1,
    V2,
}

/// A controller we may need.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Controller {
    Memory,
    Pids,
    Cpu,
    Freezer,
}

impl Controller {
    pub fn name(self) -> &'static str {
        match self {
            Controller::Memory => "memory",
            Controller::Pids => "pids",
            Controller::Cpu => "cpu",
            Controller::Freezer => "freezer",
        }
    }
}

/// Where each controller can be used by this process, if anywhere.
#[derive(Debug, Clone, Default)]
pub struct Layout {
    /// The unified (v2) mount point and this process's group in it.
    pub v2: Option<(PathBuf, String)>,
    /// Controllers available in our v2 group (cgroup.controllers).
    pub v2_controllers: Vec<String>,
    /// v1 hierarchies: (controller, mount point, our group path).
    pub v1: Vec<(String, PathBuf, String)>,
}

impl Layout {
    /// Reads /proc/self/mountinfo, /proc/self/cgroup and the v2 group's
    /// cgroup.controllers.
    pub fn read() -> Layout {
        let mountinfo = fs::read_to_string("/proc/self/mountinfo").unwrap_or_default();
        let cgroup = fs::read_to_string("/proc/self/cgroup").unwrap_or_default();
        let mut layout = Layout::parse(&mountinfo, &cgroup);
        if let Some((mnt, path)) = &layout.v2 {
            let file = join(mnt, path).join("cgroup.controllers");
            layout.v2_controllers = fs::read_to_string(file)
                .unwrap_or_default()
                .split_whitespace()
                .map(String::from)
                .collect();
        }
        layout
    }

    /// Parses mountinfo and /proc/self/cgroup text (pure, for tests).
    pub fn parse(mountinfo: &str, cgroup: &str) -> Layout {
        let mut v2_mount = None;
        let mut v1_mounts: Vec<(Vec<String>, PathBuf)> = Vec::new();
        for line in mountinfo.lines() {
            // "... mountpoint opts ... - fstype source superopts"
            let Some((left, right)) = line.split_once(" - ") else {
                continue;
            };
            let fields: Vec<&str> = left.split(' ').collect();
            let right: Vec<&str> = right.split(' ').collect();
            let (Some(mnt), Some(fstype)) = (fields.get(4), right.first()) else {
                continue;
            };
            match *fstype {
                "cgroup2" => v2_mount = Some(PathBuf::from(mnt)),
                "cgroup" => {
                    let opts = right.get(2).copied().unwrap_or("");
                    let ctrls = opts.split(',').map(String::from).collect();
                    v1_mounts.push((ctrls, PathBuf::from(mnt)));
                }
                _ => {}
            }
        }
        let mut layout = Layout::default();
        for line in cgroup.lines() {
            let mut parts = line.splitn(3, ':');
            let (Some(_id), Some(ctrls), Some(path)) = (parts.next(), parts.next(), parts.next())
            else {
                continue;
            };
            if ctrls.is_empty() {
                if let Some(m) = &v2_mount {
                    layout.v2 = Some((m.clone(), path.to_string()));
                }
                continue;
            }
            for ctrl in ctrls.split(',') {
                if let Some((_, mnt)) = v1_mounts.iter().find(|(c, _)| c.iter().any(|x| x == ctrl))
                {
                    layout
                        .v1
                        .push((ctrl.to_string(), mnt.clone(), path.to_string()));
                }
            }
        }
        layout
    }

    /// Where `ctrl` would be used: v2 if our v2 group offers it, else v1.
    pub fn locate(&self, ctrl: Controller) -> Option<(Version, PathBuf)> {
        if let Some((mnt, path)) = &self.v2 {
            if self.v2_controllers.iter().any(|c| c == ctrl.name()) {
                return Some((Version::V2, join(mnt, path)));
            }
        }
        self.v1
            .iter()
            .find(|(c, _, _)| c == ctrl.name())
            .map(|(_, mnt, path)| (Version::V1, join(mnt, path)))
    }
}

impl Layout {
    /// Whether a group for `ctrl` could be made by this process: the
    /// controller exists and our group in its hierarchy is writable.
    pub fn usable(&self, ctrl: Controller) -> std::result::Result<(), String> {
        match self.locate(ctrl) {
            None => Err(format!(
                "the {} cgroup controller is not available to mcpbox",
                ctrl.name()
            )),
            Some((version, dir)) => {
                let writable = crate::sys::cstr(&dir)
                    .map(|c| crate::sys::access_w(&c))
                    .unwrap_or(false);
                if writable {
                    Ok(())
                } else {
                    let v = if version == Version::V2 { "v2" } else { "v1" };
                    Err(format!(
                        "the {} cgroup ({v}) at {} is not writable by this user",
                        ctrl.name(),
                        dir.display()
                    ))
                }
            }
        }
    }
}

fn join(mount: &Path, group: &str) -> PathBuf {
    mount.join(group.trim_start_matches('/'))
}

/// The groups one sandbox lives in, removed on drop.
#[derive(Debug)]
pub struct Group {
    dirs: Vec<(Version, PathBuf)>,
}

/// Which controllers `limits` needs from a cgroup.
pub fn needed(limits: &Limits) -> Vec<Controller> {
    let mut v = Vec::new();
    if limits.memory.is_some() {
        v.push(Controller::Memory);
    }
    if limits.cpu.is_some() {
        v.push(Controller::Cpu);
    }
    v
}

fn write(dir: &Path, file: &str, value: &str) -> Result<()> {
    let path = dir.join(file);
    fs::write(&path, value).map_err(|source| Error::Cgroup { path, source })
}

impl Group {
    /// Makes a group for each controller `limits` needs and writes the
    /// limits. `Ok(None)` when no controller is needed. Errors say which
    /// controller could not be set up, so the caller can refuse to run.
    pub fn create(layout: &Layout, limits: &Limits, name: &str) -> Result<Option<Group>> {
        let ctrls = needed(limits);
        if ctrls.is_empty() {
            return Ok(None);
        }
        let mut group = Group { dirs: Vec::new() };
        for ctrl in ctrls {
            let Some((version, base)) = layout.locate(ctrl) else {
                return Err(Error::Unenforceable(format!(
                    "process.{} needs the {} cgroup controller, which this host does not offer to mcpbox",
                    limit_key(ctrl),
                    ctrl.name()
                )));
            };
            let dir = base.join(name);
            if !group.dirs.iter().any(|(_, d)| *d == dir) {
                remove_stale(&base);
                if version == Version::V2 {
                    enable_v2_controller(&base, ctrl)?;
                }
                match fs::create_dir(&dir) {
                    Ok(()) => {}
                    Err(e) if e.kind() == io::ErrorKind::AlreadyExists => {}
                    Err(source) => {
                        return Err(Error::Unenforceable(format!(
                            "process.{} needs a {} cgroup, but {} cannot be created: {source} \
                             (run as root, or under a delegated cgroup v2 subtree, or set \
                             sandbox.dangerously_allow_degraded = true to accept rlimits)",
                            limit_key(ctrl),
                            ctrl.name(),
                            dir.display()
                        )))
                    }
                }
                group.dirs.push((version, dir.clone()));
            }
            match (version, ctrl) {
                (Version::V1, Controller::Memory) => {
                    let bytes = limits.memory.unwrap_or(u64::MAX).to_string();
                    write(&dir, "memory.limit_in_bytes", &bytes)?;
                    // Swap counts too where the kernel accounts it.
                    if dir.join("memory.memsw.limit_in_bytes").exists() {
                        write(&dir, "memory.memsw.limit_in_bytes", &bytes)?;
                    }
                }
                (Version::V2, Controller::Memory) => {
                    write(
                        &dir,
                        "memory.max",
                        &limits.memory.unwrap_or(u64::MAX).to_string(),
                    )?;
                    if dir.join("memory.swap.max").exists() {
                        write(&dir, "memory.swap.max", "0")?;
                    }
                }
                (Version::V1, Controller::Cpu) => {
                    let quota = cpu_quota_us(limits.cpu.unwrap_or(1.0));
                    write(&dir, "cpu.cfs_period_us", "100000")?;
                    write(&dir, "cpu.cfs_quota_us", &quota.to_string())?;
                }
                (Version::V2, Controller::Cpu) => {
                    let quota = cpu_quota_us(limits.cpu.unwrap_or(1.0));
                    write(&dir, "cpu.max", &format!("{quota} 100000"))?;
                }
                (Version::V1, Controller::Pids) | (Version::V2, Controller::Pids) => {
                    let max = limits.pids.map_or("max".to_string(), |p| p.to_string());
                    write(&dir, "pids.max", &max)?;
                }
                (_, Controller::Freezer) => {}
            }
        }
        Ok(Some(group))
    }

    /// Moves `pid` into every group.
    pub fn join(&self, pid: i32) -> Result<()> {
        for (_, dir) in &self.dirs {
            write(dir, "cgroup.procs", &pid.to_string())?;
        }
        Ok(())
    }

    /// Each group's `cgroup.procs`, opened for writing before forking: the
    /// holder joins by writing "0" (the writer itself, cgroups(7)) to each.
    pub fn open_procs(&self) -> Result<Vec<std::os::fd::OwnedFd>> {
        self.dirs
            .iter()
            .map(|(_, dir)| {
                let path = dir.join("cgroup.procs");
                crate::sys::cstr(&path)
                    .and_then(|c| crate::sys::open_write(&c))
                    .map_err(|source| Error::Cgroup { path, source })
            })
            .collect()
    }

    /// The versions in use, for reporting.
    pub fn versions(&self) -> Vec<Version> {
        let mut v: Vec<Version> = self.dirs.iter().map(|(v, _)| *v).collect();
        v.dedup();
        v
    }

    /// Whether the memory controller recorded an out-of-memory kill.
    pub fn oom_killed(&self) -> bool {
        for (version, dir) in &self.dirs {
            let (file, key) = match version {
                Version::V1 => ("memory.oom_control", "oom_kill "),
                Version::V2 => ("memory.events", "oom_kill "),
            };
            if let Ok(text) = fs::read_to_string(dir.join(file)) {
                if text
                    .lines()
                    .any(|l| l.starts_with(key) && l[key.len()..].trim() != "0")
                {
                    return true;
                }
            }
        }
        false
    }

    /// Kills whatever is left in the groups (the pid namespace usually took
    /// care of it already).
    fn kill_all(&self) {
        for (version, dir) in &self.dirs {
            if *version == Version::V2 && fs::write(dir.join("cgroup.kill"), "1").is_ok() {
                continue;
            }
            if let Ok(procs) = fs::read_to_string(dir.join("cgroup.procs")) {
                for pid in procs.lines().filter_map(|l| l.trim().parse::<i32>().ok()) {
                    let _ = crate::sys::kill(pid, libc::SIGKILL);
                }
            }
        }
    }
}

impl Drop for Group {
    fn drop(&mut self) {
        self.kill_all();
        for (_, dir) in &self.dirs {
            // A group is removable once empty; the last process may still be
            // exiting, so try a few times.
            for _ in 0..50 {
                match fs::remove_dir(dir) {
                    Ok(()) => break,
                    Err(e) if e.raw_os_error() == Some(libc::EBUSY) => {
                        std::thread::sleep(std::time::Duration::from_millis(2))
                    }
                    Err(_) => break,
                }
            }
        }
    }
}

/// Removes empty groups left by an mcpbox that was SIGKILLed (its Drop
/// never ran): `mcpbox-PID` whose PID is gone. rmdir fails harmlessly on a
/// group that still has processes.
fn remove_stale(base: &Path) {
    let Ok(entries) = fs::read_dir(base) else {
        return;
    };
    for entry in entries.flatten() {
        let name = entry.file_name();
        let Some(pid) = name
            .to_str()
            .and_then(|n| n.strip_prefix("mcpbox-"))
            .and_then(|p| p.parse::<u32>().ok())
        else {
            continue;
        };
        if !Path::new(&format!("/proc/{pid}")).exists() {
            let _ = fs::remove_dir(entry.path());
        }
    }
}

fn limit_key(ctrl: Controller) -> &'static str {
    match ctrl {
        Controller::Memory => "memory",
        Controller::Cpu => "cpu",
        Controller::Pids => "pids",
        Controller::Freezer => "freezer",
    }
}

fn cpu_quota_us(cores: f64) -> u64 {
    ((cores * 100_000.0).round() as u64).max(1000)
}

fn enable_v2_controller(base: &Path, ctrl: Controller) -> Result<()> {
    let subtree = base.join("cgroup.subtree_control");
    let enabled = fs::read_to_string(&subtree).unwrap_or_default();
    if enabled.split_whitespace().any(|c| c == ctrl.name()) {
        return Ok(());
    }
    fs::write(&subtree, format!("+{}", ctrl.name())).map_err(|source| {
        Error::Unenforceable(format!(
            "cgroup v2: cannot enable the {} controller for children of {}: {source} \
             (the group holds processes or is not delegated to you; run mcpbox in a delegated \
             scope, e.g. `systemd-run --user --scope -p Delegate=yes mcpbox ...`)",
            ctrl.name(),
            base.display()
        ))
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    const HYBRID_MOUNTINFO: &str = "\
30 25 0:26 / /sys/fs/cgroup ro,nosuid - tmpfs tmpfs ro,mode=755
31 30 0:27 / /sys/fs/cgroup/unified rw,relatime - cgroup2 cgroup2 rw
32 30 0:28 / /sys/fs/cgroup/memory rw,relatime - cgroup cgroup rw,memory
33 30 0:29 / /sys/fs/cgroup/pids rw,relatime - cgroup cgroup rw,pids
34 30 0:30 / /sys/fs/cgroup/cpu rw,relatime - cgroup cgroup rw,cpu
";
    const HYBRID_CGROUP: &str = "4:memory:/process_api/abc\n8:pids:/\n1:cpu:/\n0::/\n";

    #[test]
    fn hybrid_host_uses_v1_for_memory_when_v2_lacks_it() {
        let layout = Layout::parse(HYBRID_MOUNTINFO, HYBRID_CGROUP);
        let (v, dir) = layout.locate(Controller::Memory).unwrap();
        assert_eq!(v, Version::V1);
        assert_eq!(dir, PathBuf::from("/sys/fs/cgroup/memory/process_api/abc"));
        assert_eq!(layout.locate(Controller::Freezer), None);
    }

    #[test]
    fn pure_v2_host_uses_unified_group() {
        let mountinfo = "27 22 0:23 / /sys/fs/cgroup rw - cgroup2 cgroup2 rw\n";
        let mut layout = Layout::parse(
            mountinfo,
            "0::/user.slice/user-1000.slice/session-2.scope\n",
        );
        layout.v2_controllers = vec!["memory".into(), "pids".into(), "cpu".into()];
        let (v, dir) = layout.locate(Controller::Cpu).unwrap();
        assert_eq!(v, Version::V2);
        assert_eq!(
            dir,
            PathBuf::from("/sys/fs/cgroup/user.slice/user-1000.slice/session-2.scope")
        );
    }

    #[test]
    fn pids_alone_needs_no_cgroup() {
        let limits = Limits {
            pids: Some(10),
            ..Limits::default()
        };
        assert!(needed(&limits).is_empty());
    }

    #[test]
    fn cpu_quota_is_in_microseconds_per_100ms() {
        assert_eq!(cpu_quota_us(1.5), 150_000);
        assert_eq!(cpu_quota_us(0.0001), 1000);
    }
}
