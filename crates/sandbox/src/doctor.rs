//! Kernel feature probes for `mcpbox doctor`: what works on this machine,
//! what each result means for mcpbox, and how to fix what is missing.
//! Probes try the real thing (a throwaway child unshares, a ruleset is
//! queried) rather than trusting configuration files alone.

use std::path::Path;

use crate::cgroup::{Controller, Layout, Version};
use crate::sys::{self, Fork, Wait};

/// The outcome of one probe.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Level {
    /// Works.
    Ok,
    /// Missing, but mcpbox works without it (with the stated consequence).
    Warn,
    /// Missing, and the full sandbox is not available.
    Fail,
}

/// One line of the report.
#[derive(Debug, Clone)]
pub struct Check {
    pub name: &'static str,
    pub level: Level,
    /// What was found.
    pub detail: String,
    /// What it means for mcpbox, and how to fix it when it is not Ok.
    pub advice: String,
}

fn read_trim(path: &str) -> Option<String> {
    std::fs::read_to_string(path)
        .ok()
        .map(|s| s.trim().to_string())
}

/// Forks a child that tries `unshare(flags)`; Ok(()) or the errno it got.
fn try_unshare(flags: libc::c_int) -> Result<(), i32> {
    match sys::fork() {
        Err(e) => Err(e.raw_os_error().unwrap_or(0)),
        Ok(Fork::Child) => match sys::unshare(flags) {
            Ok(()) => sys::exit_now(0),
            Err(e) => sys::exit_now(e.raw_os_error().unwrap_or(255).min(255)),
        },
        Ok(Fork::Parent(pid)) => match sys::waitpid(pid, false) {
            Ok(Wait::Exited(_, 0)) => Ok(()),
            Ok(Wait::Exited(_, code)) => Err(code),
            _ => Err(0),
        },
    }
}

/// Whether this process can make the namespaces of the full sandbox (a
/// forked child tries; call it while single-threaded). Where it cannot,
/// a policy that accepts the degraded tier runs on the host's paths, with
/// no mounts of its own (runtime discovery is then skipped).
pub fn user_namespaces_work() -> bool {
    try_unshare(libc::CLONE_NEWUSER | libc::CLONE_NEWNS | libc::CLONE_NEWPID | libc::CLONE_NEWNET)
        .is_ok()
}

fn userns() -> Check {
    let mut notes = Vec::new();
    if let Some(v) = read_trim("/proc/sys/kernel/unprivileged_userns_clone") {
        notes.push(format!("kernel.unprivileged_userns_clone={v}"));
    }
    if let Some(v) = read_trim("/proc/sys/user/max_user_namespaces") {
        notes.push(format!("user.max_user_namespaces={v}"));
    }
    let apparmor = read_trim("/proc/sys/kernel/apparmor_restrict_unprivileged_userns");
    if let Some(v) = &apparmor {
        notes.push(format!("kernel.apparmor_restrict_unprivileged_userns={v}"));
    }
    let all = libc::CLONE_NEWUSER | libc::CLONE_NEWNS | libc::CLONE_NEWPID | libc::CLONE_NEWNET;
    match try_unshare(all) {
        Ok(()) => Check {
            name: "user namespaces",
            level: Level::Ok,
            detail: format!(
                "unshare(user, mount, pid, net) works ({})",
                notes.join(", ")
            ),
            advice: "the full sandbox (own root, pid and network namespaces) is available".into(),
        },
        Err(errno) => {
            let fix = if apparmor.as_deref() == Some("1") {
                "AppArmor restricts unprivileged user namespaces (Ubuntu 23.10+): add an AppArmor \
                 profile granting `userns,` to the mcpbox binary, or run \
                 `sysctl kernel.apparmor_restrict_unprivileged_userns=0`"
            } else {
                "enable them: `sysctl kernel.unprivileged_userns_clone=1` (Debian before 11) or \
                 `sysctl user.max_user_namespaces=15000`"
            };
            Check {
                name: "user namespaces",
                level: Level::Fail,
                detail: format!(
                    "unshare failed: {} ({})",
                    std::io::Error::from_raw_os_error(errno),
                    notes.join(", ")
                ),
                advice: format!(
                    "without them mcpbox can only offer the weaker tier (Landlock, seccomp, \
                     no_new_privs, rlimits), and only for policies that set \
                     sandbox.dangerously_allow_degraded = true; fix: {fix}"
                ),
            }
        }
    }
}

fn landlock() -> Check {
    match sys::landlock_abi_version() {
        Ok(v) if v >= 1 => Check {
            name: "landlock",
            level: if v >= 3 { Level::Ok } else { Level::Warn },
            detail: format!("ABI version {v}"),
            advice: if v >= 3 {
                "second filesystem layer (read-only vs read-write, execute rights) enforced".into()
            } else {
                "enforced partially: ABI < 3 cannot refuse truncate; upgrade to Linux 6.2+".into()
            },
        },
        Ok(v) => Check {
            name: "landlock",
            level: Level::Fail,
            detail: format!("unexpected ABI {v}"),
            advice: "upgrade the kernel".into(),
        },
        Err(e) => Check {
            name: "landlock",
            level: Level::Fail,
            detail: format!("unavailable: {e}"),
            advice:
                "boot with Landlock enabled (CONFIG_SECURITY_LANDLOCK=y and `lsm=landlock,...` \
                     on the kernel command line); mcpbox refuses to start without it"
                    .into(),
        },
    }
}

fn seccomp() -> Check {
    let avail = read_trim("/proc/sys/kernel/seccomp/actions_avail");
    match (sys::prctl(libc::PR_GET_SECCOMP, 0, 0), avail) {
        (Ok(_), Some(actions)) if actions.contains("errno") => Check {
            name: "seccomp",
            level: Level::Ok,
            detail: format!("filter mode available (actions: {actions})"),
            advice: format!(
                "{} system calls refused inside the sandbox",
                crate::seccomp::refused_names().len()
            ),
        },
        (r, a) => Check {
            name: "seccomp",
            level: Level::Fail,
            detail: format!("prctl: {r:?}, actions: {a:?}"),
            advice: "enable CONFIG_SECCOMP_FILTER; mcpbox refuses to start without it".into(),
        },
    }
}

fn cgroups() -> Vec<Check> {
    let layout = Layout::read();
    let mut checks = Vec::new();
    let v2 = match &layout.v2 {
        Some((mnt, path)) => format!(
            "v2 at {} (group {path}, controllers: {})",
            mnt.display(),
            if layout.v2_controllers.is_empty() {
                "none".to_string()
            } else {
                layout.v2_controllers.join(" ")
            }
        ),
        None => "no v2 hierarchy".into(),
    };
    let v1: Vec<&str> = layout.v1.iter().map(|(c, _, _)| c.as_str()).collect();
    let mode = match (layout.v2.is_some(), v1.is_empty()) {
        (true, true) => "pure v2",
        (true, false) => "hybrid (v1 + v2)",
        (false, false) => "pure v1",
        (false, true) => "none",
    };
    checks.push(Check {
        name: "cgroups",
        level: Level::Ok,
        detail: format!(
            "{mode}: {v2}; v1 controllers: {}",
            if v1.is_empty() {
                "none".into()
            } else {
                v1.join(" ")
            }
        ),
        advice: "mcpbox uses v2 where it offers a controller and v1 otherwise".into(),
    });
    for ctrl in [Controller::Memory, Controller::Cpu, Controller::Pids] {
        let (level, detail, advice) = match layout.locate(ctrl) {
            Some((version, dir)) => {
                let writable = is_writable(&dir);
                let v = if version == Version::V2 { "v2" } else { "v1" };
                if writable {
                    (
                        Level::Ok,
                        format!("{v} at {}", dir.display()),
                        "enforced with a cgroup".to_string(),
                    )
                } else {
                    (
                        Level::Warn,
                        format!("{v} at {} (not writable by this user)", dir.display()),
                        fallback_advice(ctrl),
                    )
                }
            }
            None => (Level::Warn, "not available".into(), fallback_advice(ctrl)),
        };
        checks.push(Check {
            name: ctrl_check_name(ctrl),
            level,
            detail,
            advice,
        });
    }
    checks.push(freezer(&layout));
    checks
}

/// Whether a lifecycle parent could be made here, and on which freezer: v2
/// (`cgroup.freeze`, in every non-root v2 group since Linux 5.2, below our
/// writable v2 group) or v1 (the `freezer` controller). Reads only; makes
/// no group.
fn freezer(layout: &Layout) -> Check {
    let v2 = layout.v2_group().map(|(_, _, dir)| dir);
    let v1 = layout.v1_group("freezer").map(|(_, _, dir)| dir);
    let usable = |d: &Option<std::path::PathBuf>| d.as_deref().is_some_and(is_writable);
    let state = |d: &Option<std::path::PathBuf>| match d {
        None => "missing".to_string(),
        Some(d) => format!("{} not writable", d.display()),
    };
    let (level, detail) = match (&v2, &v1) {
        (Some(d), _) if usable(&v2) => (
            Level::Ok,
            format!("v2 (cgroup.freeze, groups below {})", d.display()),
        ),
        (_, Some(d)) if usable(&v1) => (
            Level::Ok,
            format!("v1 (freezer.state, groups below {})", d.display()),
        ),
        _ => (
            Level::Warn,
            format!("not usable: v2 {}, v1 freezer {}", state(&v2), state(&v1)),
        ),
    };
    Check {
        name: "cgroup freezer",
        level,
        detail,
        advice: if level == Level::Ok {
            "idle sandboxes are paused with the cgroup freezer (no CPU, memory kept)".into()
        } else {
            "idle pause falls back to stopping the server (and starting it again on the next \
             call); fix: run as root, or in a delegated cgroup v2 scope \
             (`systemd-run --user --scope -p Delegate=yes`)"
                .into()
        },
    }
}

fn ctrl_check_name(ctrl: Controller) -> &'static str {
    match ctrl {
        Controller::Memory => "cgroup memory",
        Controller::Cpu => "cgroup cpu",
        Controller::Pids => "cgroup pids",
        Controller::Freezer => "cgroup freezer",
    }
}

fn fallback_advice(ctrl: Controller) -> String {
    match ctrl {
        Controller::Pids => "not needed: pids are limited with RLIMIT_NPROC inside the sandbox's user namespace".into(),
        Controller::Memory => "policies with process.memory are refused unless they set \
            sandbox.dangerously_allow_degraded = true (then RLIMIT_AS per process); fix: run as root, \
            or in a delegated cgroup v2 scope (`systemd-run --user --scope -p Delegate=yes`)"
            .into(),
        _ => "policies with process.cpu are refused unless they set sandbox.dangerously_allow_degraded \
              = true (then not enforced); fix: as for memory"
            .into(),
    }
}

fn is_writable(dir: &Path) -> bool {
    match sys::cstr(dir) {
        // SAFETY-free: access(2) through a safe wrapper below.
        Ok(c) => sys::access_w(&c),
        Err(_) => false,
    }
}

fn overlayfs() -> Check {
    let fs = std::fs::read_to_string("/proc/filesystems").unwrap_or_default();
    let ok = fs.lines().any(|l| l.trim_end().ends_with("overlay"));
    Check {
        name: "overlayfs",
        level: if ok { Level::Ok } else { Level::Warn },
        detail: if ok {
            "available".into()
        } else {
            "not listed in /proc/filesystems".into()
        },
        advice: "not used: a template is copied into each workspace and a snapshot is an archive"
            .into(),
    }
}

/// How the audit can learn which files a call touched (docs/audit.md,
/// "Files read and written"): tried on a throwaway directory.
fn file_audit() -> Check {
    // a directory of our own (a name already taken is not ours to judge by)
    let Some(dir) = (0..16).find_map(|i| {
        let d = std::env::temp_dir().join(format!("mcpbox-doctor-{}-{i}", std::process::id()));
        std::fs::create_dir(&d).ok().map(|()| d)
    }) else {
        return Check {
            name: "file audit",
            level: Level::Warn,
            detail: format!(
                "no throwaway directory could be made in {}",
                std::env::temp_dir().display()
            ),
            advice: "not probed; set TMPDIR to a writable directory and run doctor again".into(),
        };
    };
    let mounts = crate::fanotify::FileWatch::on_mounts(std::slice::from_ref(&dir));
    let dirs = crate::fanotify::DirWatch::on_trees(
        &[crate::fanotify::DirRoot {
            host: dir.clone(),
            sandbox: "/workspace/output".into(),
        }],
        mounts.is_err(),
    );
    let _ = std::fs::remove_dir(&dir);
    match (mounts, dirs) {
        (Ok(_), Ok(_)) => Check {
            name: "file audit",
            level: Level::Ok,
            detail: "fanotify mount and directory marks (files: kernel)".into(),
            advice: "each call's files read, written, renamed and removed (reads and writes: the sandbox's only)"
                .into(),
        },
        (Ok(_), Err(e)) => Check {
            name: "file audit",
            level: Level::Warn,
            detail: format!("fanotify mount marks; directory marks refused: {e}"),
            advice: "files read and written are recorded, renames and removals are not".into(),
        },
        (Err(_), Ok(_)) => Check {
            name: "file audit",
            level: Level::Ok,
            detail: "fanotify directory marks (files: kernel-dirs)".into(),
            advice: "each call's files read, written, renamed and removed; another process \
                     of yours touching the workspace during a call is given to it (mount \
                     marks, which tell them apart, need root)"
                .into(),
        },
        (Err(e), Err(_)) => Check {
            name: "file audit",
            level: Level::Warn,
            detail: format!("fanotify refused: {e}"),
            advice: "written files are found by their times (files: times): no reads, no \
                     digests; needs Linux 5.13+ with CONFIG_FANOTIFY"
                .into(),
        },
    }
}

fn kernel() -> Check {
    let release = read_trim("/proc/sys/kernel/osrelease").unwrap_or_default();
    let mut parts = release
        .split(|c: char| !c.is_ascii_digit())
        .filter_map(|p| p.parse::<u32>().ok());
    let (major, minor) = (parts.next().unwrap_or(0), parts.next().unwrap_or(0));
    let ok = (major, minor) >= (5, 14);
    Check {
        name: "kernel",
        level: if ok { Level::Ok } else { Level::Fail },
        detail: release,
        advice: if ok {
            "mount_setattr, close_range and per-namespace RLIMIT_NPROC available".into()
        } else {
            "mcpbox needs Linux 5.14 or newer (mount_setattr 5.12, RLIMIT_NPROC per user namespace 5.14)".into()
        },
    }
}

/// Runs every probe.
pub fn run() -> Vec<Check> {
    let mut checks = vec![kernel(), userns(), landlock(), seccomp()];
    checks.extend(cgroups());
    checks.push(overlayfs());
    checks.push(file_audit());
    checks
}
