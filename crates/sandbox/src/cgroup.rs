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
use std::time::{Duration, Instant};

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
        for m in crate::mountinfo::parse(mountinfo) {
            match m.fstype.as_str() {
                "cgroup2" => v2_mount = Some(m.mount_point),
                "cgroup" => {
                    let ctrls = m.super_options.split(',').map(String::from).collect();
                    v1_mounts.push((ctrls, m.mount_point));
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
        self.locate_in(ctrl).map(|(v, _, dir)| (v, dir))
    }

    /// As [`Layout::locate`], with the hierarchy's mount point too (which
    /// tells whether two groups live in the same hierarchy).
    pub fn locate_in(&self, ctrl: Controller) -> Option<(Version, PathBuf, PathBuf)> {
        if let Some((mnt, path)) = &self.v2 {
            if self.v2_controllers.iter().any(|c| c == ctrl.name()) {
                return Some((Version::V2, mnt.clone(), join(mnt, path)));
            }
        }
        self.v1_group(ctrl.name())
    }

    /// The v1 hierarchy of the controller named `name` (also `cpuacct`,
    /// which is no [`Controller`]): its mount point and our group in it.
    pub fn v1_group(&self, name: &str) -> Option<(Version, PathBuf, PathBuf)> {
        self.v1
            .iter()
            .find(|(c, _, _)| c == name)
            .map(|(_, mnt, path)| (Version::V1, mnt.clone(), join(mnt, path)))
    }

    /// Our group in the v2 hierarchy, with its mount point.
    pub fn v2_group(&self) -> Option<(Version, PathBuf, PathBuf)> {
        self.v2
            .as_ref()
            .map(|(mnt, path)| (Version::V2, mnt.clone(), join(mnt, path)))
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
        Group::create_in(layout, limits, name, None)
    }

    /// As [`Group::create`], below a lifecycle `parent` when one is given:
    /// then a group `name` is made under the parent in each of its
    /// hierarchies (freezer, CPU accounting) whether or not `limits` needs
    /// one, and a limit whose controller lives in one of those hierarchies
    /// is set on that same group (on v2, the parent then delegates the
    /// controller to its children in cgroup.subtree_control). Limits in
    /// other hierarchies (v1 memory on a hybrid host, say) get a group
    /// where [`Group::create`] makes it.
    pub fn create_in(
        layout: &Layout,
        limits: &Limits,
        name: &str,
        parent: Option<&Parent>,
    ) -> Result<Option<Group>> {
        let ctrls = needed(limits);
        let mut group = Group { dirs: Vec::new() };
        for place in parent.map(Parent::places).unwrap_or_default() {
            remove_stale(&place.dir);
            let dir = place.dir.join(name);
            mkdir(&dir).map_err(|source| Error::Cgroup {
                path: dir.clone(),
                source,
            })?;
            group.dirs.push((place.version, dir));
        }
        if ctrls.is_empty() && group.dirs.is_empty() {
            return Ok(None);
        }
        for ctrl in ctrls {
            let Some((version, mount, base)) = layout.locate_in(ctrl) else {
                return Err(Error::Unenforceable(format!(
                    "process.{} needs the {} cgroup controller, which this host does not offer to mcpbox",
                    limit_key(ctrl),
                    ctrl.name()
                )));
            };
            // In a hierarchy of the parent, the limit goes on the launch
            // group below it, which exists already.
            let in_parent = parent
                .into_iter()
                .flat_map(Parent::places)
                .find(|p| p.mount == mount);
            if let Some(place) = in_parent {
                if version == Version::V2 {
                    enable_v2_controller(&base, ctrl)?;
                    enable_v2_controller(&place.dir, ctrl)?;
                }
            }
            let dir = in_parent.map_or(&base, |p| &p.dir).join(name);
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

    /// The group's directory in the cgroup v2 hierarchy, if it has one:
    /// the one a process can be born in (clone3(2), `CLONE_INTO_CGROUP`).
    pub fn v2_dir(&self) -> Option<&Path> {
        self.dirs
            .iter()
            .find(|(v, _)| *v == Version::V2)
            .map(|(_, d)| d.as_path())
    }

    /// Moves `pid` (the sandbox's init, waiting for it before it does
    /// anything) into every group but `born_in` (the one it was cloned
    /// into, if any), by writing its pid to each `cgroup.procs`
    /// (cgroups(7)); its children are born there.
    pub fn add(&self, pid: libc::pid_t, born_in: Option<&Path>) -> Result<()> {
        let text = pid.to_string();
        for (_, dir) in &self.dirs {
            if born_in == Some(dir.as_path()) {
                continue;
            }
            let path = dir.join("cgroup.procs");
            fs::write(&path, &text).map_err(|source| Error::Cgroup { path, source })?;
        }
        Ok(())
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

// ---------------------------------------------------------------------------
// The lifecycle parent: one long-lived group per sandbox, frozen while idle.
// ---------------------------------------------------------------------------

/// The prefix of every lifecycle parent's name, for [`Parent::list_names`].
pub const PARENT_PREFIX: &str = "mcpbox-sb-";

/// How long [`Parent::freeze`] and [`Parent::thaw`] wait for the kernel to
/// report the new state.
const STATE_WAIT: Duration = Duration::from_secs(1);

/// One group of a parent: its interface, the hierarchy's mount point (two
/// groups with the same mount point are in the same hierarchy) and its
/// directory.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Place {
    version: Version,
    mount: PathBuf,
    dir: PathBuf,
}

/// The cgroup of one long-lived sandbox, parent of the group of each of
/// its launches (`mcpbox-<pid>`, made by [`Group::create_in`]), so that
/// freezing it freezes the whole sandbox (init, server and its
/// children) and its CPU counter counts all of them.
///
/// It lives in a *freezer* hierarchy, v2 (`cgroup.freeze`, a core file of
/// every non-root v2 group, no controller needed) or else the v1 `freezer`
/// controller, and in a *CPU accounting* one: on v2 the same group
/// (`cpu.stat`'s `usage_usec` is core too); with a v1 freezer, the v1
/// `cpuacct` hierarchy where there is one. The parent itself never holds a
/// process (cgroup v2's no-internal-process rule): only launch groups do.
///
/// No `Drop` removes it: a parent outlives the process that made it (the
/// lifecycle removes it explicitly with [`Parent::remove`], or finds it
/// again after a crash with [`Parent::list_names`] and [`Parent::open`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Parent {
    name: String,
    freezer: Place,
    /// Where the CPU counter is read: the freezer's own group on v2.
    cpu: Option<Place>,
}

/// Checks a parent's name: 1 to 64 of `[a-z0-9-]`, so it is one path
/// component that cannot climb (`..`, `/`), and not `mcpbox-<digits>`,
/// the name of a launch group, which stale-group cleanup removes.
pub fn check_parent_name(name: &str) -> Result<()> {
    let refuse = |why: &str| {
        Err(Error::CgroupParent {
            name: name.to_string(),
            detail: why.to_string(),
        })
    };
    if name.is_empty() || name.len() > 64 {
        return refuse("a cgroup parent's name has 1 to 64 characters");
    }
    if !name
        .bytes()
        .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-')
    {
        return refuse("a cgroup parent's name has only a-z, 0-9 and '-'");
    }
    if name
        .strip_prefix("mcpbox-")
        .is_some_and(|rest| !rest.is_empty() && rest.bytes().all(|b| b.is_ascii_digit()))
    {
        return refuse("mcpbox-<digits> is the name of a launch group, not of a parent");
    }
    Ok(())
}

/// `frozen 1` in a v2 `cgroup.events` (None when the key is missing).
pub fn parse_events_frozen(events: &str) -> Option<bool> {
    events.lines().find_map(|l| match l.split_once(' ') {
        Some(("frozen", v)) => Some(v.trim() == "1"),
        _ => None,
    })
}

/// The state a v1 `freezer.state` reads.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FreezerState {
    Thawed,
    /// Some tasks are not frozen yet.
    Freezing,
    Frozen,
}

/// Parses a v1 `freezer.state`.
pub fn parse_freezer_state(text: &str) -> Option<FreezerState> {
    match text.trim() {
        "THAWED" => Some(FreezerState::Thawed),
        "FREEZING" => Some(FreezerState::Freezing),
        "FROZEN" => Some(FreezerState::Frozen),
        _ => None,
    }
}

/// `VmRSS:    1234 kB` of a `/proc/PID/status`, in bytes.
fn parse_vm_rss(status: &str) -> Option<u64> {
    let line = status.lines().find(|l| l.starts_with("VmRSS:"))?;
    let kb: u64 = line["VmRSS:".len()..]
        .trim()
        .trim_end_matches("kB")
        .trim()
        .parse()
        .ok()?;
    Some(kb * 1024)
}

/// `usage_usec` of a v2 `cpu.stat`.
pub fn parse_cpu_stat(text: &str) -> Option<Duration> {
    text.lines().find_map(|l| match l.split_once(' ') {
        Some(("usage_usec", v)) => v.trim().parse().ok().map(Duration::from_micros),
        _ => None,
    })
}

/// A v1 `cpuacct.usage` (nanoseconds).
pub fn parse_cpuacct_usage(text: &str) -> Option<Duration> {
    text.trim().parse().ok().map(Duration::from_nanos)
}

fn version_name(v: Version) -> &'static str {
    match v {
        Version::V1 => "v1",
        Version::V2 => "v2",
    }
}

/// What to do when a parent cannot be made.
const PARENT_ADVICE: &str = "run mcpbox as root, or in a delegated cgroup v2 subtree \
    (`systemd-run --user --scope -p Delegate=yes mcpbox ...`); without a freezer, idle \
    pause falls back to stopping the server";

impl Place {
    fn child(&self, name: &str) -> Place {
        Place {
            version: self.version,
            mount: self.mount.clone(),
            dir: self.dir.join(name),
        }
    }
}

/// Where a parent's freezer group goes on `version`, if that hierarchy is
/// there: our group in it.
fn freezer_base(layout: &Layout, version: Version) -> Option<(Version, PathBuf, PathBuf)> {
    match version {
        Version::V2 => layout.v2_group(),
        Version::V1 => layout.v1_group("freezer"),
    }
}

fn place((version, mount, dir): (Version, PathBuf, PathBuf)) -> Place {
    Place {
        version,
        mount,
        dir,
    }
}

fn mkdir(dir: &Path) -> io::Result<()> {
    match fs::create_dir(dir) {
        Ok(()) => Ok(()),
        Err(e) if e.kind() == io::ErrorKind::AlreadyExists => Ok(()),
        Err(e) => Err(e),
    }
}

impl Parent {
    /// Makes (or adopts, if it exists) the parent `name`: on v2 when our v2
    /// group is there and writable, else on the v1 freezer; `prefer` forces
    /// one. An error names the paths tried and what to do.
    pub fn create(name: &str, prefer: Option<Version>) -> Result<Parent> {
        check_parent_name(name)?;
        let layout = Layout::read();
        let versions = match prefer {
            Some(v) => vec![v],
            None => vec![Version::V2, Version::V1],
        };
        // Re-adoption first, on whichever freezer the parent is.
        if let Some(found) = versions
            .iter()
            .find_map(|v| Parent::find(&layout, name, *v))
        {
            return Ok(found);
        }
        let mut failures = Vec::new();
        for version in versions {
            match Parent::make(&layout, name, version) {
                Ok(parent) => return Ok(parent),
                Err(why) => failures.push(why),
            }
        }
        Err(Error::CgroupParent {
            name: name.to_string(),
            detail: format!("{}; {PARENT_ADVICE}", failures.join("; ")),
        })
    }

    fn make(layout: &Layout, name: &str, version: Version) -> std::result::Result<Parent, String> {
        let v = version_name(version);
        let Some(base) = freezer_base(layout, version) else {
            return Err(format!("no {v} freezer hierarchy is mounted"));
        };
        let base = place(base);
        let writable = crate::sys::cstr(&base.dir)
            .map(|c| crate::sys::access_w(&c))
            .unwrap_or(false);
        if !writable {
            return Err(format!(
                "the {v} cgroup {} is not writable by this user",
                base.dir.display()
            ));
        }
        let freezer = base.child(name);
        mkdir(&freezer.dir).map_err(|e| format!("cannot create {}: {e}", freezer.dir.display()))?;
        let state = match version {
            Version::V2 => "cgroup.freeze",
            Version::V1 => "freezer.state",
        };
        if !freezer.dir.join(state).exists() {
            let _ = fs::remove_dir(&freezer.dir);
            return Err(format!(
                "{} has no {state} (cgroup v2 freezing needs Linux 5.2)",
                freezer.dir.display()
            ));
        }
        let cpu = match version {
            Version::V2 => Some(freezer.clone()),
            Version::V1 => match layout.v1_group("cpuacct") {
                Some(base) => {
                    let cpu = place(base).child(name);
                    if let Err(e) = mkdir(&cpu.dir) {
                        let _ = fs::remove_dir(&freezer.dir);
                        return Err(format!("cannot create {}: {e}", cpu.dir.display()));
                    }
                    Some(cpu)
                }
                None => None,
            },
        };
        Ok(Parent {
            name: name.to_string(),
            freezer,
            cpu,
        })
    }

    /// The parent `name` on `version` if its freezer group exists.
    fn find(layout: &Layout, name: &str, version: Version) -> Option<Parent> {
        let freezer = place(freezer_base(layout, version)?).child(name);
        if !freezer.dir.is_dir() {
            return None;
        }
        let cpu = match version {
            Version::V2 => Some(freezer.clone()),
            Version::V1 => layout
                .v1_group("cpuacct")
                .map(|b| place(b).child(name))
                .filter(|p| p.dir.is_dir()),
        };
        Some(Parent {
            name: name.to_string(),
            freezer,
            cpu,
        })
    }

    /// The parent `name` a previous run left, if any (v2 first, then v1);
    /// None too for an invalid name.
    pub fn open(name: &str) -> Option<Parent> {
        check_parent_name(name).ok()?;
        let layout = Layout::read();
        Parent::find(&layout, name, Version::V2)
            .or_else(|| Parent::find(&layout, name, Version::V1))
    }

    /// The names of the parents that exist in any of the hierarchies
    /// (`mcpbox-sb-*`), sorted, for cleaning up after a crash.
    pub fn list_names() -> Vec<String> {
        let layout = Layout::read();
        let bases = [
            layout.v2_group(),
            layout.v1_group("freezer"),
            layout.v1_group("cpuacct"),
        ];
        let mut names: Vec<String> = bases
            .into_iter()
            .flatten()
            .filter_map(|(_, _, dir)| fs::read_dir(dir).ok())
            .flat_map(|entries| entries.flatten())
            .filter(|e| e.path().is_dir())
            .filter_map(|e| e.file_name().into_string().ok())
            .filter(|n| n.starts_with(PARENT_PREFIX) && check_parent_name(n).is_ok())
            .collect();
        names.sort();
        names.dedup();
        names
    }

    pub fn name(&self) -> &str {
        &self.name
    }

    /// The freezer's interface.
    pub fn version(&self) -> Version {
        self.freezer.version
    }

    /// Every directory of the parent (freezer, and CPU accounting when it
    /// is another hierarchy), for a teardown check that nothing is left.
    pub fn dirs(&self) -> Vec<PathBuf> {
        let mut dirs = vec![self.freezer.dir.clone()];
        if let Some(cpu) = &self.cpu {
            if cpu.dir != self.freezer.dir {
                dirs.push(cpu.dir.clone());
            }
        }
        dirs
    }

    /// The parent's groups with their hierarchies, for launch groups.
    fn places(&self) -> Vec<&Place> {
        let mut places = vec![&self.freezer];
        if let Some(cpu) = &self.cpu {
            if *cpu != self.freezer {
                places.push(cpu);
            }
        }
        places
    }

    fn write(&self, file: &str, value: &str) -> Result<()> {
        write(&self.freezer.dir, file, value)
    }

    fn read(&self, file: &str) -> Result<String> {
        let path = self.freezer.dir.join(file);
        fs::read_to_string(&path).map_err(|source| Error::Cgroup { path, source })
    }

    /// Freezes every process of the sandbox, and waits (at most a second)
    /// until the kernel says they all are.
    pub fn freeze(&self) -> Result<()> {
        self.set_frozen(true)
    }

    /// Thaws the sandbox, and waits (at most a second) until it runs.
    pub fn thaw(&self) -> Result<()> {
        self.set_frozen(false)
    }

    /// Thaws the sandbox without waiting for it to run: the kernel lets
    /// its tasks run from the write on (v1 has no thawing state; v2's
    /// `frozen 0` follows at once). For the latency of the call that
    /// resumes a paused sandbox: a message written to it meanwhile waits in
    /// its pipe.
    pub fn thaw_quick(&self) -> Result<()> {
        let (file, value) = match self.version() {
            Version::V2 => ("cgroup.freeze", "0"),
            Version::V1 => ("freezer.state", "THAWED"),
        };
        self.write(file, value)
    }

    fn set_frozen(&self, frozen: bool) -> Result<()> {
        let (file, value) = match (self.version(), frozen) {
            (Version::V2, true) => ("cgroup.freeze", "1"),
            (Version::V2, false) => ("cgroup.freeze", "0"),
            (Version::V1, true) => ("freezer.state", "FROZEN"),
            (Version::V1, false) => ("freezer.state", "THAWED"),
        };
        self.write(file, value)?;
        let until = Instant::now() + STATE_WAIT;
        let mut rewritten = Instant::now();
        loop {
            if self.state()? == Some(frozen) {
                return Ok(());
            }
            if Instant::now() >= until {
                return Err(Error::Cgroup {
                    path: self.freezer.dir.join(file),
                    source: io::Error::new(
                        io::ErrorKind::TimedOut,
                        format!(
                            "wrote {value}, but the group did not reach it within {STATE_WAIT:?}"
                        ),
                    ),
                });
            }
            // v1 stays FREEZING while a task cannot be frozen yet (in an
            // uninterruptible sleep); writing FROZEN again retries
            // (Documentation/admin-guide/cgroup-v1/freezer-subsystem.rst).
            if self.version() == Version::V1
                && frozen
                && rewritten.elapsed() >= Duration::from_millis(100)
            {
                self.write(file, value)?;
                rewritten = Instant::now();
            }
            std::thread::sleep(Duration::from_millis(2));
        }
    }

    /// Some(true) frozen, Some(false) thawed, None in between (v1
    /// FREEZING) or unreadable.
    fn state(&self) -> Result<Option<bool>> {
        Ok(match self.version() {
            Version::V2 => parse_events_frozen(&self.read("cgroup.events")?),
            Version::V1 => match parse_freezer_state(&self.read("freezer.state")?) {
                Some(FreezerState::Frozen) => Some(true),
                Some(FreezerState::Thawed) => Some(false),
                Some(FreezerState::Freezing) | None => None,
            },
        })
    }

    /// Whether the sandbox is frozen (completely: not v1's FREEZING).
    pub fn is_frozen(&self) -> bool {
        matches!(self.state(), Ok(Some(true)))
    }

    /// The CPU time used by every process that ever ran in the parent's
    /// groups and their children; None without a CPU accounting group.
    pub fn cpu_usage(&self) -> Option<Duration> {
        let cpu = self.cpu.as_ref()?;
        match cpu.version {
            Version::V2 => parse_cpu_stat(&fs::read_to_string(cpu.dir.join("cpu.stat")).ok()?),
            Version::V1 => {
                parse_cpuacct_usage(&fs::read_to_string(cpu.dir.join("cpuacct.usage")).ok()?)
            }
        }
    }

    /// The memory its processes use, in bytes: `memory.current` of the
    /// parent's group where it is a v2 group with the memory controller
    /// (every descendant counted, page cache included, as the kernel
    /// charges it), else the sum of the resident sets (`VmRSS` in
    /// `/proc/PID/status`, see proc(5)) of `procs` (its processes, as
    /// [`Parent::procs`] lists them), which counts a page shared by two of
    /// them twice.
    pub fn memory_usage(&self, procs: &[i32]) -> u64 {
        if self.freezer.version == Version::V2 {
            let current = fs::read_to_string(self.freezer.dir.join("memory.current"));
            if let Some(bytes) = current.ok().and_then(|t| t.trim().parse::<u64>().ok()) {
                return bytes;
            }
        }
        let mut total = 0u64;
        for pid in procs {
            // a process may end between the list and the read: skipped
            let Ok(status) = fs::read_to_string(format!("/proc/{pid}/status")) else {
                continue;
            };
            total += parse_vm_rss(&status).unwrap_or(0);
        }
        total
    }

    /// Every pid in the parent's groups and their descendants.
    pub fn procs(&self) -> Vec<i32> {
        let mut pids = Vec::new();
        for dir in self.dirs() {
            for group in subtree(&dir) {
                if let Ok(text) = fs::read_to_string(group.join("cgroup.procs")) {
                    pids.extend(text.lines().filter_map(|l| l.trim().parse::<i32>().ok()));
                }
            }
        }
        pids.sort_unstable();
        pids.dedup();
        pids
    }

    /// Kills every process of the sandbox, frozen or not, and waits (at
    /// most a second) until none is left. v2: `cgroup.kill`, which kills
    /// frozen tasks too. Otherwise SIGKILL to each pid, repeated for the
    /// ones forked meanwhile; on v1 a frozen task dies of it only once
    /// thawed, so the group is thawed after signalling (the signal is
    /// pending first, so no task runs user code again).
    pub fn kill_all(&self) -> Result<()> {
        let kill_file = self.freezer.dir.join("cgroup.kill");
        let until = Instant::now() + STATE_WAIT;
        loop {
            let pids = self.procs();
            if pids.is_empty() {
                return Ok(());
            }
            if Instant::now() >= until {
                return Err(Error::Cgroup {
                    path: self.freezer.dir.clone(),
                    source: io::Error::other(format!(
                        "processes {pids:?} are still alive after SIGKILL"
                    )),
                });
            }
            let killed = self.version() == Version::V2
                && kill_file.exists()
                && fs::write(&kill_file, "1").is_ok();
            if !killed {
                for pid in &pids {
                    let _ = crate::sys::kill(*pid, libc::SIGKILL);
                }
            }
            if self.version() == Version::V1 {
                let _ = self.write("freezer.state", "THAWED");
            }
            std::thread::sleep(Duration::from_millis(5));
        }
    }

    /// Removes the parent: its child groups deepest first, then itself,
    /// in each hierarchy, retrying briefly while the last processes are
    /// exiting (EBUSY). Refuses while processes remain ([`Parent::kill_all`]
    /// first). A group already gone is fine.
    pub fn remove(&self) -> Result<()> {
        let pids = self.procs();
        if !pids.is_empty() {
            return Err(Error::CgroupParent {
                name: self.name.clone(),
                detail: format!(
                    "cannot remove: processes {pids:?} are still in it (kill them first)"
                ),
            });
        }
        for dir in self.dirs() {
            let mut groups = subtree(&dir);
            // Deepest first: longer paths are below shorter ones.
            groups.sort_by_key(|g| std::cmp::Reverse(g.components().count()));
            for group in groups {
                rmdir_retrying(&group)?;
            }
        }
        Ok(())
    }
}

/// `dir` and every group below it.
fn subtree(dir: &Path) -> Vec<PathBuf> {
    let mut out = Vec::new();
    let mut todo = vec![dir.to_path_buf()];
    while let Some(d) = todo.pop() {
        if let Ok(entries) = fs::read_dir(&d) {
            todo.extend(
                entries
                    .flatten()
                    .filter(|e| e.file_type().is_ok_and(|t| t.is_dir()))
                    .map(|e| e.path()),
            );
            out.push(d);
        }
    }
    out
}

fn rmdir_retrying(dir: &Path) -> Result<()> {
    let until = Instant::now() + Duration::from_millis(500);
    loop {
        match fs::remove_dir(dir) {
            Ok(()) => return Ok(()),
            Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(()),
            Err(e) if e.raw_os_error() == Some(libc::EBUSY) && Instant::now() < until => {
                std::thread::sleep(Duration::from_millis(5))
            }
            Err(source) => {
                return Err(Error::Cgroup {
                    path: dir.to_path_buf(),
                    source,
                })
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn resident_set_is_read_from_proc_status() {
        let status = "Name:\tnode\nVmPeak:\t  900 kB\nVmRSS:\t   51200 kB\nRssAnon:\t 1 kB\n";
        assert_eq!(parse_vm_rss(status), Some(51200 * 1024));
        assert_eq!(parse_vm_rss("Name:\tkthreadd\n"), None);
        // our own process has one
        let own = std::fs::read_to_string("/proc/self/status").unwrap();
        assert!(parse_vm_rss(&own).unwrap() > 0);
    }

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
    fn a_parent_name_that_climbs_or_is_a_launch_group_is_refused() {
        for bad in [
            "",
            "../x",
            "mcpbox-sb-../../x",
            "mcpbox-sb-/x",
            "Mcpbox-sb-1",
            "mcpbox-sb-a b",
            "mcpbox-1234",
            &"a".repeat(65),
        ] {
            assert!(check_parent_name(bad).is_err(), "{bad:?} accepted");
        }
        for good in [
            "mcpbox-sb-0123456789abcdef",
            "x",
            "mcpbox-sb-",
            &"a".repeat(64),
        ] {
            assert!(check_parent_name(good).is_ok(), "{good:?} refused");
        }
        let err = check_parent_name("../x").unwrap_err().to_string();
        assert!(err.contains("../x") && err.contains("a-z"), "{err}");
    }

    #[test]
    fn freezer_files_parse() {
        assert_eq!(parse_events_frozen("populated 1\nfrozen 1\n"), Some(true));
        assert_eq!(parse_events_frozen("populated 0\nfrozen 0\n"), Some(false));
        assert_eq!(parse_events_frozen("populated 1\n"), None);
        assert_eq!(parse_freezer_state("FROZEN\n"), Some(FreezerState::Frozen));
        assert_eq!(
            parse_freezer_state("FREEZING\n"),
            Some(FreezerState::Freezing)
        );
        assert_eq!(parse_freezer_state("THAWED\n"), Some(FreezerState::Thawed));
        assert_eq!(parse_freezer_state("frozen"), None);
    }

    #[test]
    fn cpu_counters_parse_in_their_units() {
        let stat = "usage_usec 1500\nuser_usec 1000\nsystem_usec 500\nnr_periods 0\n";
        assert_eq!(parse_cpu_stat(stat), Some(Duration::from_micros(1500)));
        assert_eq!(parse_cpu_stat("user_usec 3\n"), None);
        assert_eq!(
            parse_cpuacct_usage("2500000\n"),
            Some(Duration::from_millis(2500) / 1000)
        );
        assert_eq!(parse_cpuacct_usage("x"), None);
    }

    #[test]
    fn hybrid_host_places_the_freezer_and_cpuacct_on_v1_and_v2_at_unified() {
        let mountinfo = format!(
            "{HYBRID_MOUNTINFO}35 30 0:31 / /sys/fs/cgroup/freezer rw - cgroup cgroup rw,freezer\n\
             36 30 0:32 / /sys/fs/cgroup/cpuacct rw - cgroup cgroup rw,cpuacct\n"
        );
        let layout = Layout::parse(
            &mountinfo,
            &format!("6:freezer:/\n2:cpuacct:/\n{HYBRID_CGROUP}"),
        );
        let (_, mnt, dir) = freezer_base(&layout, Version::V2).unwrap();
        assert_eq!(
            (mnt.as_path(), dir.as_path()),
            (
                Path::new("/sys/fs/cgroup/unified"),
                Path::new("/sys/fs/cgroup/unified")
            )
        );
        let (_, _, dir) = freezer_base(&layout, Version::V1).unwrap();
        assert_eq!(dir, PathBuf::from("/sys/fs/cgroup/freezer"));
        let (_, _, dir) = layout.v1_group("cpuacct").unwrap();
        assert_eq!(dir, PathBuf::from("/sys/fs/cgroup/cpuacct"));
    }

    #[test]
    fn cpu_quota_is_in_microseconds_per_100ms() {
        assert_eq!(cpu_quota_us(1.5), 150_000);
        assert_eq!(cpu_quota_us(0.0001), 1000);
    }
}
