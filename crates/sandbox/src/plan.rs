//! The filesystem plan: what the sandbox's root contains, as data.
//!
//! [`plan`] turns a [`Spec`] and a few facts about the host ([`HostFacts`])
//! into a list of [`Step`]s. The init process executes them in order against
//! a fresh tmpfs (see `launch.rs`); unit tests check the list itself, so the
//! layout is tested without root or a kernel.

use std::path::{Path, PathBuf};

use crate::{Spec, HOME, INPUT, OUTPUT, SANDBOX_UID, TMP, WORKSPACE};

/// How a bind mount may be used.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Access {
    /// Read-only, nosuid, nodev, for the whole mounted tree.
    ReadOnly,
    /// Read-write, nosuid, nodev, for the whole mounted tree.
    ReadWrite,
    /// A device node from the host's /dev (null, zero, ...): nosuid only.
    Device,
}

/// One step of building the new root. Paths are inside the sandbox.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Step {
    /// Shows a directory of the new root at a second place too (a bind
    /// within the sandbox), read-write, nosuid, nodev.
    Alias {
        from: PathBuf,
        path: PathBuf,
    },
    Dir {
        path: PathBuf,
        mode: u32,
    },
    Tmpfs {
        path: PathBuf,
        size: u64,
        mode: u32,
    },
    Bind {
        host: PathBuf,
        path: PathBuf,
        access: Access,
    },
    /// A file whose contents mcpbox writes (passwd, hosts, ...).
    File {
        path: PathBuf,
        contents: String,
    },
    Symlink {
        path: PathBuf,
        target: PathBuf,
    },
    Proc {
        path: PathBuf,
    },
    Chown {
        path: PathBuf,
        uid: u32,
        gid: u32,
    },
    /// Makes the mount at `path` (and its submounts) noexec: execve of a
    /// file there fails, and so does mapping one as code (mmap with
    /// PROT_EXEC, mount(8) "noexec"), which is how the dynamic loader and
    /// dlopen run a file. Right after a writable mount is made, with
    /// `process.allow_exec`, so that nothing mounted later below it is
    /// touched.
    NoExec {
        path: PathBuf,
    },
}

/// What a host path is.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Kind {
    Dir,
    /// A regular file; for /etc entries, with its contents (copied into the
    /// sandbox rather than bind-mounted: a copy of a small file is cheaper
    /// than a mount, and cannot change under the sandbox).
    File(Option<String>),
    Symlink(PathBuf),
    Missing,
}

/// Facts about the host that shape the plan, read before forking.
#[derive(Debug, Clone, Default)]
pub struct HostFacts {
    /// Each of [`SYSTEM_DIRS`] with what it is on the host.
    pub system: Vec<(&'static str, Kind)>,
    /// Each of [`ETC_ENTRIES`] with what it is on the host.
    pub etc: Vec<(&'static str, Kind)>,
    /// For each extra mount, whether its host side is a file.
    pub mount_is_file: Vec<bool>,
}

/// System directories shown read-only. On merged-/usr systems (Debian 12)
/// most are symlinks into /usr, and are recreated as the same symlinks.
pub const SYSTEM_DIRS: &[&str] = &[
    "/usr", "/bin", "/sbin", "/lib", "/lib32", "/lib64", "/libx32",
];

/// The parts of the host's /etc a program needs: the dynamic linker's cache,
/// CA certificates, time zone, alternatives symlinks, protocol tables. Not
/// shadow, sudoers, ssh, passwd (generated instead), ld.so.preload (an
/// injection point) or anything with secrets.
pub const ETC_ENTRIES: &[&str] = &[
    "ld.so.cache",
    "ld.so.conf",
    "ld.so.conf.d",
    "alternatives",
    "ssl",
    "ca-certificates",
    "ca-certificates.conf",
    "localtime",
    "timezone",
    "os-release",
    "debian_version",
    "mime.types",
    "protocols",
    "services",
    "gai.conf",
    "host.conf",
    "inputrc",
    "terminfo",
];

/// /etc files up to this size are copied, larger ones bind-mounted. A copy
/// costs its bytes three times (read here, carried in the plan, written
/// into the new root's tmpfs) and a bind costs three system calls, so the
/// line sits where those meet: the few small tables (protocols, services,
/// host.conf) are copied, ld.so.cache (binary) and mime.types (74 KiB on
/// Debian 12) are bound read-only like /usr, and never read by mcpbox.
const MAX_COPIED: u64 = 16 * 1024;

/// Host device nodes bound into the sandbox's /dev.
pub const DEVICES: &[&str] = &["null", "zero", "full", "random", "urandom", "tty"];

impl HostFacts {
    /// Reads the facts from the host filesystem: one lstat per path, a
    /// readlink for a symlink, and the contents of the small /etc files.
    pub fn read(spec: &Spec) -> HostFacts {
        // The lstat's size is the file's: a regular file is not followed.
        let kind = |p: &Path, contents: bool| match std::fs::symlink_metadata(p) {
            Ok(m) if m.file_type().is_symlink() => match std::fs::read_link(p) {
                Ok(t) => Kind::Symlink(t),
                Err(_) => Kind::Missing,
            },
            Ok(m) if m.is_dir() => Kind::Dir,
            Ok(m) if contents && m.file_type().is_file() && m.len() <= MAX_COPIED => Kind::File(
                std::fs::read(p)
                    .ok()
                    .and_then(|b| String::from_utf8(b).ok()),
            ),
            Ok(_) => Kind::File(None),
            Err(_) => Kind::Missing,
        };
        HostFacts {
            system: SYSTEM_DIRS
                .iter()
                .map(|d| (*d, kind(Path::new(d), false)))
                .collect(),
            etc: ETC_ENTRIES
                .iter()
                .map(|e| (*e, kind(&Path::new("/etc").join(e), true)))
                .collect(),
            mount_is_file: spec.mounts.iter().map(|m| !m.host.is_dir()).collect(),
        }
    }
}

fn passwd() -> String {
    format!(
        "root:x:0:0:root:/nonexistent:/usr/sbin/nologin\n\
         sandbox:x:{SANDBOX_UID}:{SANDBOX_UID}:mcpbox sandbox:{HOME}:/bin/sh\n\
         nobody:x:65534:65534:nobody:/nonexistent:/usr/sbin/nologin\n"
    )
}

fn group() -> String {
    format!("root:x:0:\nsandbox:x:{SANDBOX_UID}:\nnogroup:x:65534:\n")
}

/// Size of the small tmpfs that holds /dev.
const DEV_SIZE: u64 = 64 * 1024;

/// Builds the plan for `spec`.
pub fn plan(spec: &Spec, host: &HostFacts) -> Vec<Step> {
    let mut steps = Vec::new();
    let p = |s: &str| PathBuf::from(s);
    // With an allow list, nothing the command can write may run: Landlock
    // refuses execve there, but the dynamic loader (`ld.so FILE`, an execve
    // of an allowed file) and dlopen map a file with mmap, which Landlock
    // does not check and a noexec mount refuses. Every writable mount
    // below is followed by this step.
    let noexec = |steps: &mut Vec<Step>, path: PathBuf| {
        if spec.allow_exec.is_some() {
            steps.push(Step::NoExec { path });
        }
    };

    // System directories, read-only, or the same symlinks the host has.
    for (dir, kind) in &host.system {
        match kind {
            Kind::Dir => {
                steps.push(Step::Dir {
                    path: p(dir),
                    mode: 0o755,
                });
                steps.push(Step::Bind {
                    host: p(dir),
                    path: p(dir),
                    access: Access::ReadOnly,
                });
            }
            Kind::Symlink(target) => steps.push(Step::Symlink {
                path: p(dir),
                target: target.clone(),
            }),
            Kind::File(_) | Kind::Missing => {}
        }
    }

    // A minimal /etc: generated identity files plus read-only host entries.
    steps.push(Step::Dir {
        path: p("/etc"),
        mode: 0o755,
    });
    steps.push(Step::File {
        path: p("/etc/passwd"),
        contents: passwd(),
    });
    steps.push(Step::File {
        path: p("/etc/group"),
        contents: group(),
    });
    steps.push(Step::File {
        path: p("/etc/hosts"),
        contents: "127.0.0.1\tlocalhost mcpbox\n::1\tlocalhost ip6-localhost\n".into(),
    });
    steps.push(Step::File {
        path: p("/etc/hostname"),
        contents: "mcpbox\n".into(),
    });
    steps.push(Step::File {
        path: p("/etc/nsswitch.conf"),
        contents: "passwd: files\ngroup: files\nshadow: files\nhosts: files dns\n".into(),
    });
    if spec.egress.is_some() {
        // The bridge's resolver (ARCHITECTURE.md, "Transparent egress"):
        // names the policy allows get an address that reaches them
        // through the proxy; every other name is NXDOMAIN.
        steps.push(Step::File {
            path: p("/etc/resolv.conf"),
            contents: "nameserver 127.0.0.1\n".into(),
        });
    }
    steps.push(Step::Symlink {
        path: p("/etc/mtab"),
        target: p("../proc/self/mounts"),
    });
    for (entry, kind) in &host.etc {
        let inside = Path::new("/etc").join(entry);
        match kind {
            Kind::Dir => {
                steps.push(Step::Dir {
                    path: inside.clone(),
                    mode: 0o755,
                });
                steps.push(Step::Bind {
                    host: inside.clone(),
                    path: inside,
                    access: Access::ReadOnly,
                });
            }
            Kind::File(Some(contents)) => steps.push(Step::File {
                path: inside,
                contents: contents.clone(),
            }),
            Kind::File(None) => steps.push(Step::Bind {
                host: inside.clone(),
                path: inside,
                access: Access::ReadOnly,
            }),
            Kind::Symlink(target) => steps.push(Step::Symlink {
                path: inside,
                target: target.clone(),
            }),
            Kind::Missing => {}
        }
    }

    // The workspace.
    steps.push(Step::Dir {
        path: p(WORKSPACE),
        mode: 0o755,
    });
    if let Some(input) = &spec.input {
        steps.push(Step::Dir {
            path: p(INPUT),
            mode: 0o755,
        });
        steps.push(Step::Bind {
            host: input.clone(),
            path: p(INPUT),
            access: Access::ReadOnly,
        });
    }
    if let Some(output) = &spec.output {
        steps.push(Step::Dir {
            path: p(OUTPUT),
            mode: 0o755,
        });
        steps.push(Step::Bind {
            host: output.clone(),
            path: p(OUTPUT),
            access: Access::ReadWrite,
        });
        noexec(&mut steps, p(OUTPUT));
    }
    steps.push(Step::Dir {
        path: p(TMP),
        mode: 0o755,
    });
    // A host directory that outlives the launch, or a fresh tmpfs. Either
    // way the init makes HOME in it (an existing one is kept, a symlink in
    // its place fails the launch: Step::Dir never follows one) and chowns
    // both to the sandbox user.
    match &spec.tmp_dir {
        Some(host) => steps.push(Step::Bind {
            host: host.clone(),
            path: p(TMP),
            access: Access::ReadWrite,
        }),
        None => steps.push(Step::Tmpfs {
            path: p(TMP),
            size: spec.tmp_size,
            mode: 0o755,
        }),
    }
    noexec(&mut steps, p(TMP));
    steps.push(Step::Dir {
        path: p(HOME),
        mode: 0o700,
    });
    steps.push(Step::Chown {
        path: p(TMP),
        uid: SANDBOX_UID,
        gid: SANDBOX_UID,
    });
    steps.push(Step::Chown {
        path: p(HOME),
        uid: SANDBOX_UID,
        gid: SANDBOX_UID,
    });
    // Programs that hard-code /tmp get the sandbox's own tmp: a symlink, or,
    // when an extra mount lives below /tmp (a tool installed under the host's
    // /tmp, mounted at the same path), the same tmpfs shown at /tmp too, so
    // the mount points can be made in it and /tmp stays writable.
    if spec.mounts.iter().any(|m| m.at.starts_with("/tmp")) {
        steps.push(Step::Dir {
            path: p("/tmp"),
            mode: 0o755,
        });
        steps.push(Step::Alias {
            from: p(TMP),
            path: p("/tmp"),
        });
        // A bind copies the noexec of its source already; said here too.
        noexec(&mut steps, p("/tmp"));
    } else {
        steps.push(Step::Symlink {
            path: p("/tmp"),
            target: p(TMP),
        });
    }
    // Extra mounts from the policy.
    for (i, m) in spec.mounts.iter().enumerate() {
        let is_file = host.mount_is_file.get(i).copied().unwrap_or(false);
        for parent in
            m.at.ancestors()
                .skip(1)
                .collect::<Vec<_>>()
                .into_iter()
                .rev()
        {
            if parent != Path::new("/") && parent != Path::new(WORKSPACE) {
                steps.push(Step::Dir {
                    path: parent.to_path_buf(),
                    mode: 0o755,
                });
            }
        }
        if is_file {
            steps.push(Step::File {
                path: m.at.clone(),
                contents: String::new(),
            });
        } else {
            steps.push(Step::Dir {
                path: m.at.clone(),
                mode: 0o755,
            });
        }
        let access = if m.writable {
            Access::ReadWrite
        } else {
            Access::ReadOnly
        };
        steps.push(Step::Bind {
            host: m.host.clone(),
            path: m.at.clone(),
            access,
        });
        if m.writable {
            noexec(&mut steps, m.at.clone());
        }
    }

    // The egress proxy's socket directory, when the policy opens egress.
    if let Some(egress) = &spec.egress {
        steps.push(Step::Dir {
            path: p("/run"),
            mode: 0o755,
        });
        steps.push(Step::Dir {
            path: p(crate::EGRESS_DIR),
            mode: 0o755,
        });
        steps.push(Step::Bind {
            host: egress.socket_dir.clone(),
            path: p(crate::EGRESS_DIR),
            access: Access::ReadOnly,
        });
    }

    // A fresh /proc for the sandbox's own pid namespace.
    steps.push(Step::Dir {
        path: p("/proc"),
        mode: 0o555,
    });
    steps.push(Step::Proc { path: p("/proc") });

    // A minimal /dev: a few host device nodes, no block devices, no pts.
    steps.push(Step::Dir {
        path: p("/dev"),
        mode: 0o755,
    });
    steps.push(Step::Tmpfs {
        path: p("/dev"),
        size: DEV_SIZE,
        mode: 0o755,
    });
    // Each bind makes its own mount point (an empty file).
    for dev in DEVICES {
        let path = Path::new("/dev").join(dev);
        steps.push(Step::Bind {
            host: path.clone(),
            path,
            access: Access::Device,
        });
    }
    for (name, target) in [
        ("fd", "/proc/self/fd"),
        ("stdin", "/proc/self/fd/0"),
        ("stdout", "/proc/self/fd/1"),
        ("stderr", "/proc/self/fd/2"),
    ] {
        steps.push(Step::Symlink {
            path: Path::new("/dev").join(name),
            target: p(target),
        });
    }
    steps.push(Step::Dir {
        path: p("/dev/shm"),
        mode: 0o1777,
    });
    steps.push(Step::Tmpfs {
        path: p("/dev/shm"),
        size: spec.tmp_size,
        mode: 0o1777,
    });
    noexec(&mut steps, p("/dev/shm"));
    steps
}

/// Paths the command may write below (Landlock's read-write set).
pub fn writable_paths(spec: &Spec) -> Vec<PathBuf> {
    let mut paths = vec![PathBuf::from(TMP), PathBuf::from("/dev/shm")];
    if spec.output.is_some() {
        paths.push(PathBuf::from(OUTPUT));
    }
    paths.extend(
        spec.mounts
            .iter()
            .filter(|m| m.writable)
            .map(|m| m.at.clone()),
    );
    paths
}

/// Paths the command may read below (Landlock's read-only set).
pub fn readable_paths(spec: &Spec) -> Vec<PathBuf> {
    let mut paths: Vec<PathBuf> = [
        "/usr", "/bin", "/sbin", "/lib", "/lib32", "/lib64", "/libx32", "/etc", "/proc", WORKSPACE,
    ]
    .iter()
    .map(PathBuf::from)
    .collect();
    paths.extend(spec.mounts.iter().map(|m| m.at.clone()));
    // The proxy's directory, read-only (mounted so): the command reads the
    // CA bundle there when a secret stays outside (its socket is reached
    // by the bridge, which Landlock does not restrict).
    if spec.egress.is_some() {
        paths.push(PathBuf::from(crate::EGRESS_DIR));
    }
    paths
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{BindMount, Limits, Stdio};

    fn spec() -> Spec {
        Spec {
            argv: vec!["true".into()],
            env: vec![],
            input: Some("/host/in".into()),
            output: Some("/host/out".into()),
            tmp_size: 1 << 20,
            mounts: vec![BindMount {
                host: "/host/data".into(),
                at: "/data/set".into(),
                writable: false,
            }],
            limits: Limits::default(),
            allow_exec: None,
            allow_degraded: false,
            stdio: Stdio::Inherit,
            egress: None,
            tmp_dir: None,
            cgroup_parent: None,
        }
    }

    fn debian() -> HostFacts {
        HostFacts {
            system: vec![
                ("/usr", Kind::Dir),
                ("/bin", Kind::Symlink("usr/bin".into())),
                ("/lib64", Kind::Symlink("usr/lib64".into())),
                ("/libx32", Kind::Missing),
            ],
            etc: vec![
                ("ld.so.cache", Kind::File(None)),
                ("protocols", Kind::File(Some("ip 0 IP\n".into()))),
                ("ssl", Kind::Dir),
                (
                    "localtime",
                    Kind::Symlink("/usr/share/zoneinfo/Etc/UTC".into()),
                ),
                ("timezone", Kind::Missing),
            ],
            mount_is_file: vec![false],
        }
    }

    fn binds(steps: &[Step]) -> Vec<(String, String, Access)> {
        steps
            .iter()
            .filter_map(|s| match s {
                Step::Bind { host, path, access } => Some((
                    host.display().to_string(),
                    path.display().to_string(),
                    *access,
                )),
                _ => None,
            })
            .collect()
    }

    #[test]
    fn input_is_read_only_and_output_read_write() {
        let b = binds(&plan(&spec(), &debian()));
        assert!(b.contains(&("/host/in".into(), INPUT.into(), Access::ReadOnly)));
        assert!(b.contains(&("/host/out".into(), OUTPUT.into(), Access::ReadWrite)));
        assert!(b.contains(&("/host/data".into(), "/data/set".into(), Access::ReadOnly)));
    }

    #[test]
    fn only_system_dirs_etc_entries_devices_and_workspace_come_from_the_host() {
        let b = binds(&plan(&spec(), &debian()));
        for (host, _, access) in &b {
            let allowed = host == "/usr"
                || host.starts_with("/host/")
                || host == "/etc/ld.so.cache"
                || host == "/etc/ssl"
                || (host.starts_with("/dev/") && *access == Access::Device);
            assert!(allowed, "unexpected host path bound: {host}");
        }
        // Nothing of /home, /root, /tmp, /run, /var or the host's /etc/passwd.
        for forbidden in [
            "/home",
            "/root",
            "/tmp",
            "/run",
            "/var",
            "/etc/passwd",
            "/etc/shadow",
        ] {
            assert!(
                !b.iter().any(|(h, _, _)| h == forbidden),
                "{forbidden} must not be bound"
            );
        }
    }

    #[test]
    fn small_etc_files_are_copied_not_bound() {
        let steps = plan(&spec(), &debian());
        assert!(steps.contains(&Step::File {
            path: "/etc/protocols".into(),
            contents: "ip 0 IP\n".into()
        }));
        assert!(!binds(&steps).iter().any(|(h, _, _)| h == "/etc/protocols"));
    }

    #[test]
    fn every_system_bind_is_read_only() {
        for (host, path, access) in binds(&plan(&spec(), &debian())) {
            if path.starts_with("/usr") || path.starts_with("/etc") {
                assert_eq!(access, Access::ReadOnly, "{host}");
            }
        }
    }

    #[test]
    fn merged_usr_symlinks_are_recreated_not_bound() {
        let steps = plan(&spec(), &debian());
        assert!(steps.contains(&Step::Symlink {
            path: "/bin".into(),
            target: "usr/bin".into()
        }));
        assert!(!binds(&steps).iter().any(|(h, _, _)| h == "/bin"));
    }

    #[test]
    fn default_spec_has_no_input_or_output() {
        let mut s = spec();
        s.input = None;
        s.output = None;
        s.mounts.clear();
        let b = binds(&plan(&s, &debian()));
        assert!(!b.iter().any(|(_, p, _)| p.starts_with(WORKSPACE)));
        assert_eq!(
            writable_paths(&s),
            vec![PathBuf::from(TMP), PathBuf::from("/dev/shm")]
        );
    }

    #[test]
    fn mount_below_tmp_makes_tmp_a_directory_not_the_symlink() {
        // Regression: a mount at /tmp/x once tried to chmod through the
        // /tmp -> /workspace/tmp symlink while building the root.
        let mut s = spec();
        s.mounts.push(BindMount {
            host: "/tmp/ci/venv".into(),
            at: "/tmp/ci/venv".into(),
            writable: false,
        });
        let steps = plan(&s, &debian());
        assert!(steps.contains(&Step::Alias {
            from: TMP.into(),
            path: "/tmp".into()
        }));
        assert!(!steps
            .iter()
            .any(|st| matches!(st, Step::Symlink { path, .. } if path == Path::new("/tmp"))));
        let plain = plan(&spec(), &debian());
        assert!(plain.contains(&Step::Symlink {
            path: "/tmp".into(),
            target: TMP.into()
        }));
    }

    #[test]
    fn proc_is_fresh_and_mounted_after_its_dir() {
        let steps = plan(&spec(), &debian());
        let dir = steps.iter().position(|s| {
            *s == Step::Dir {
                path: "/proc".into(),
                mode: 0o555,
            }
        });
        let proc_ = steps.iter().position(|s| {
            *s == Step::Proc {
                path: "/proc".into(),
            }
        });
        assert!(dir.is_some() && proc_.is_some() && dir < proc_);
    }

    #[test]
    fn tmp_dir_replaces_the_tmpfs_with_a_read_write_bind_and_keeps_home() {
        let with = Spec {
            tmp_dir: Some("/host/state/tmp".into()),
            ..spec()
        };
        let steps = plan(&with, &debian());
        assert!(!steps
            .iter()
            .any(|s| matches!(s, Step::Tmpfs { path, .. } if path == Path::new(TMP))));
        let bind = steps.iter().position(|s| {
            *s == Step::Bind {
                host: "/host/state/tmp".into(),
                path: TMP.into(),
                access: Access::ReadWrite,
            }
        });
        let home = steps.iter().position(|s| {
            *s == Step::Dir {
                path: HOME.into(),
                mode: 0o700,
            }
        });
        let chown = steps.iter().position(|s| {
            *s == Step::Chown {
                path: HOME.into(),
                uid: SANDBOX_UID,
                gid: SANDBOX_UID,
            }
        });
        assert!(bind.is_some() && bind < home && home < chown);
        // Without it, the tmpfs of tmp_size.
        let steps = plan(&spec(), &debian());
        assert!(steps.contains(&Step::Tmpfs {
            path: TMP.into(),
            size: 1 << 20,
            mode: 0o755
        }));
    }

    #[test]
    fn generated_passwd_names_no_host_user() {
        let steps = plan(&spec(), &debian());
        let passwd = steps.iter().find_map(|s| match s {
            Step::File { path, contents } if path == Path::new("/etc/passwd") => {
                Some(contents.clone())
            }
            _ => None,
        });
        let passwd = passwd.unwrap_or_default();
        assert_eq!(passwd.lines().count(), 3);
        assert!(passwd.contains("sandbox:x:1000"));
    }

    #[test]
    fn with_an_allow_list_every_writable_mount_is_made_noexec_right_after_it() {
        let mut s = spec();
        s.mounts.push(BindMount {
            host: "/host/cache".into(),
            at: "/tmp/cache".into(),
            writable: true,
        });
        // Without a list, written programs may run (scripts in tmp).
        let open = plan(&s, &debian());
        assert!(!open.iter().any(|st| matches!(st, Step::NoExec { .. })));
        s.allow_exec = Some(vec!["/usr/bin/python3".into()]);
        let steps = plan(&s, &debian());
        let noexec: Vec<&Path> = steps
            .iter()
            .filter_map(|st| match st {
                Step::NoExec { path } => Some(path.as_path()),
                _ => None,
            })
            .collect();
        assert_eq!(
            noexec,
            [OUTPUT, TMP, "/tmp", "/tmp/cache", "/dev/shm"].map(Path::new)
        );
        // Each right after the mount it is for, so that a read-only mount
        // made later below it keeps its exec.
        for (i, st) in steps.iter().enumerate() {
            let Step::NoExec { path } = st else { continue };
            let made = match &steps[i - 1] {
                Step::Bind { path, access, .. } => {
                    assert_eq!(*access, Access::ReadWrite);
                    path
                }
                Step::Tmpfs { path, .. } | Step::Alias { path, .. } => path,
                other => panic!("{} follows {other:?}", path.display()),
            };
            assert_eq!(made, path);
        }
        // Every path Landlock lets the command write is covered.
        for w in writable_paths(&s) {
            assert!(noexec.contains(&w.as_path()), "{}", w.display());
        }
    }

    #[test]
    fn extra_mount_parents_are_created_in_order() {
        let steps = plan(&spec(), &debian());
        let data = steps.iter().position(|s| {
            *s == Step::Dir {
                path: "/data".into(),
                mode: 0o755,
            }
        });
        let set = steps.iter().position(|s| {
            *s == Step::Dir {
                path: "/data/set".into(),
                mode: 0o755,
            }
        });
        assert!(data.is_some() && data < set);
    }
}
