//! Landlock: the second filesystem layer, enforced by the kernel on the
//! command itself (landlock(7)). The mount namespace decides what exists;
//! Landlock decides, for what exists, what may be read, written and
//! executed, so a mistake in one layer is not an escape.
//!
//! The ruleset is data ([`Plan`]): its rights are computed before forking,
//! from the kernel's ABI version, so the children only make the three
//! Landlock system calls ([`Plan::build`] in the init or the degraded
//! supervisor, `landlock_restrict_self` in the last mile). We call the
//! syscalls through `sys.rs` rather than the `landlock` crate because the
//! crate opens paths and allocates while building, which a forked child
//! must not rely on (docs/conventions.md).

use std::ffi::CString;
use std::os::fd::{AsRawFd, OwnedFd};
use std::path::PathBuf;

use crate::sys;

/// Filesystem access rights (linux/landlock.h, `LANDLOCK_ACCESS_FS_*`).
pub mod fs {
    pub const EXECUTE: u64 = 1 << 0;
    pub const WRITE_FILE: u64 = 1 << 1;
    pub const READ_FILE: u64 = 1 << 2;
    pub const READ_DIR: u64 = 1 << 3;
    pub const REMOVE_DIR: u64 = 1 << 4;
    pub const REMOVE_FILE: u64 = 1 << 5;
    pub const MAKE_CHAR: u64 = 1 << 6;
    pub const MAKE_DIR: u64 = 1 << 7;
    pub const MAKE_REG: u64 = 1 << 8;
    pub const MAKE_SOCK: u64 = 1 << 9;
    pub const MAKE_FIFO: u64 = 1 << 10;
    pub const MAKE_BLOCK: u64 = 1 << 11;
    pub const MAKE_SYM: u64 = 1 << 12;
    /// ABI 2.
    pub const REFER: u64 = 1 << 13;
    /// ABI 3.
    pub const TRUNCATE: u64 = 1 << 14;
    /// ABI 5.
    pub const IOCTL_DEV: u64 = 1 << 15;
    /// The rights that make sense on a file (not a directory); the kernel
    /// refuses a rule on a file with any other (EINVAL).
    pub const FILE: u64 = EXECUTE | WRITE_FILE | READ_FILE | TRUNCATE | IOCTL_DEV;
}

/// `LANDLOCK_ACCESS_NET_BIND_TCP | LANDLOCK_ACCESS_NET_CONNECT_TCP` (ABI 4).
const NET_TCP: u64 = (1 << 0) | (1 << 1);
/// `LANDLOCK_SCOPE_ABSTRACT_UNIX_SOCKET | LANDLOCK_SCOPE_SIGNAL` (ABI 6).
const SCOPE_ALL: u64 = (1 << 0) | (1 << 1);

/// The highest ABI whose filesystem rights we ask for; older kernels get
/// what they have (best effort, as the `landlock` crate's default).
const TARGET_ABI: i64 = 5;

/// Dynamic loaders that an allow-listed executable needs to start. Opened
/// with O_PATH, which follows the merged-/usr symlinks to the real file.
const LOADERS: &[&str] = &["/lib64/ld-linux-x86-64.so.2", "/lib/ld-linux-aarch64.so.1"];

/// Which tier a ruleset is for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Tier {
    /// Inside the full sandbox: the mount namespace already hides the host,
    /// so directory listing is allowed everywhere (it reveals only what the
    /// new root shows) and the network namespace does the network.
    Full,
    /// The degraded tier (no namespaces): no listing of the host's
    /// directories, no TCP bind or connect at all (ABI 4), and no signals
    /// or abstract unix sockets outside the sandbox (ABI 6), standing in for
    /// the missing network and pid namespaces.
    Degraded,
}

/// The filesystem rights a kernel of Landlock ABI `abi` handles, up to
/// [`TARGET_ABI`].
pub fn fs_rights(abi: i64) -> u64 {
    use fs::*;
    let v1 = EXECUTE
        | WRITE_FILE
        | READ_FILE
        | READ_DIR
        | REMOVE_DIR
        | REMOVE_FILE
        | MAKE_CHAR
        | MAKE_DIR
        | MAKE_REG
        | MAKE_SOCK
        | MAKE_FIFO
        | MAKE_BLOCK
        | MAKE_SYM;
    let mut all = if abi >= 1 { v1 } else { 0 };
    if abi >= 2 {
        all |= fs::REFER;
    }
    if abi >= 3 {
        all |= fs::TRUNCATE;
    }
    if abi >= TARGET_ABI {
        all |= fs::IOCTL_DEV;
    }
    all
}

/// A ruleset as data: what it handles and the rules, with their paths as C
/// strings, ready for the system calls.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Plan {
    pub handled_fs: u64,
    pub handled_net: u64,
    pub scoped: u64,
    /// (path, rights beneath it); rights are already limited to what the
    /// ruleset handles.
    pub rules: Vec<(CString, u64)>,
}

impl Plan {
    /// [`Plan::new`] for a start that cannot go on without Landlock (both
    /// tiers): a kernel without it is an error naming the step.
    pub fn required(
        abi: i64,
        tier: Tier,
        readable: &[PathBuf],
        writable: &[PathBuf],
        allow_exec: Option<&[PathBuf]>,
    ) -> crate::Result<Plan> {
        Plan::new(abi, tier, readable, writable, allow_exec)
            .map_err(|e| crate::Error::setup("landlock", e))?
            .ok_or_else(|| {
                crate::Error::setup(
                    "landlock",
                    std::io::Error::other("landlock is not supported by this kernel"),
                )
            })
    }

    /// The ruleset for `tier` on a kernel of Landlock ABI `abi`: read (and,
    /// without an allow list, execute) below `readable`, everything below
    /// `writable`, device access below /dev, and execute only for
    /// `allow_exec` (plus the dynamic loader) when given. None when the
    /// kernel has no Landlock (`abi` < 1).
    pub fn new(
        abi: i64,
        tier: Tier,
        readable: &[PathBuf],
        writable: &[PathBuf],
        allow_exec: Option<&[PathBuf]>,
    ) -> std::io::Result<Option<Plan>> {
        let all = fs_rights(abi);
        if all == 0 {
            return Ok(None);
        }
        let read_exec = fs::EXECUTE | fs::READ_FILE | fs::READ_DIR;
        let (read, write) = match allow_exec {
            // With an allow list nothing else, and nothing writable, executes.
            Some(_) => (read_exec & !fs::EXECUTE, all & !fs::EXECUTE),
            // Without one, written files may be executed too (scripts in tmp).
            None => (read_exec, all),
        };
        let dev = fs::READ_FILE | fs::WRITE_FILE | fs::READ_DIR | fs::IOCTL_DEV;
        let mut rules: Vec<(PathBuf, u64)> = Vec::new();
        if tier == Tier::Full {
            rules.push(("/".into(), fs::READ_DIR));
        }
        rules.extend(readable.iter().map(|p| (p.clone(), read)));
        rules.push(("/dev".into(), dev));
        rules.extend(writable.iter().map(|p| (p.clone(), write)));
        if let Some(list) = allow_exec {
            let exec = fs::EXECUTE | fs::READ_FILE;
            rules.extend(list.iter().map(|p| (p.clone(), exec)));
            rules.extend(LOADERS.iter().map(|p| (PathBuf::from(p), exec)));
        }
        let rules = rules
            .into_iter()
            .map(|(p, access)| Ok((sys::cstr(&p)?, access & all)))
            .collect::<std::io::Result<Vec<_>>>()?;
        let degraded = tier == Tier::Degraded;
        Ok(Some(Plan {
            handled_fs: all,
            handled_net: if degraded && abi >= 4 { NET_TCP } else { 0 },
            scoped: if degraded && abi >= 6 { SCOPE_ALL } else { 0 },
            rules,
        }))
    }

    /// Creates the ruleset and adds the rules: system calls only, for the
    /// init (after the new root exists) or the degraded supervisor. A path
    /// that cannot be opened gets no rule (nothing below it is granted), as
    /// with the `landlock` crate's `path_beneath_rules`; a rule on a file
    /// keeps only the rights a file can have.
    pub fn build(&self) -> std::io::Result<OwnedFd> {
        let ruleset = sys::landlock_create_ruleset(self.handled_fs, self.handled_net, self.scoped)?;
        for (path, access) in &self.rules {
            let Ok(fd) = sys::open_path(path) else {
                continue;
            };
            let access = match sys::fstat_is_dir(fd.as_raw_fd()) {
                Ok(false) => access & fs::FILE,
                _ => *access,
            };
            if access == 0 {
                continue;
            }
            sys::landlock_add_path_rule(ruleset.as_raw_fd(), fd.as_raw_fd(), access)?;
        }
        Ok(ruleset)
    }

    /// The paths with their rights, for tests.
    #[cfg(test)]
    pub fn rule_paths(&self) -> Vec<(&std::path::Path, u64)> {
        use std::os::unix::ffi::OsStrExt;
        self.rules
            .iter()
            .map(|(p, a)| {
                (
                    std::path::Path::new(std::ffi::OsStr::from_bytes(p.as_bytes())),
                    *a,
                )
            })
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::path::Path;

    fn paths(list: &[&str]) -> Vec<PathBuf> {
        list.iter().map(PathBuf::from).collect()
    }

    #[test]
    fn no_landlock_means_no_plan() {
        assert_eq!(Plan::new(0, Tier::Full, &[], &[], None).unwrap(), None);
    }

    #[test]
    fn an_older_kernel_gets_only_the_rights_it_knows() {
        let plan = Plan::new(1, Tier::Full, &paths(&["/usr"]), &paths(&["/tmp"]), None)
            .unwrap()
            .unwrap();
        assert_eq!(plan.handled_fs, (1 << 13) - 1);
        assert!(plan.rules.iter().all(|(_, a)| a & !plan.handled_fs == 0));
        let v5 = Plan::new(7, Tier::Full, &[], &[], None).unwrap().unwrap();
        assert_eq!(v5.handled_fs, (1 << 16) - 1, "capped at ABI 5's rights");
    }

    #[test]
    fn with_an_allow_list_only_listed_files_and_the_loader_execute() {
        let plan = Plan::new(
            5,
            Tier::Full,
            &paths(&["/usr"]),
            &paths(&["/workspace/tmp"]),
            Some(&paths(&["/usr/bin/python3"])),
        )
        .unwrap()
        .unwrap();
        for (path, access) in plan.rule_paths() {
            let listed = path == Path::new("/usr/bin/python3")
                || LOADERS.iter().any(|l| path == Path::new(l));
            assert_eq!(access & fs::EXECUTE != 0, listed, "{}", path.display());
        }
    }

    #[test]
    fn the_full_tier_lists_everywhere_and_handles_no_network() {
        let plan = Plan::new(6, Tier::Full, &[], &[], None).unwrap().unwrap();
        assert_eq!(plan.rules[0], (CString::new("/").unwrap(), fs::READ_DIR));
        assert_eq!((plan.handled_net, plan.scoped), (0, 0));
    }

    #[test]
    fn the_degraded_tier_handles_tcp_and_scopes_where_the_kernel_can() {
        let old = Plan::new(3, Tier::Degraded, &[], &[], None)
            .unwrap()
            .unwrap();
        assert_eq!((old.handled_net, old.scoped), (0, 0));
        let plan = Plan::new(6, Tier::Degraded, &[], &[], None)
            .unwrap()
            .unwrap();
        assert_eq!((plan.handled_net, plan.scoped), (NET_TCP, SCOPE_ALL));
        assert!(plan.rule_paths().iter().all(|(p, _)| *p != Path::new("/")));
    }
}
