//! Idmapped bind mounts of the caller's read-only directories, when mcpbox
//! runs as root.
//!
//! As root, the sandbox user maps to host uid 65534 (nobody,
//! [`ROOT_RUN_HOST_ID`]), so that a hostile server never owns a host file.
//! The price was that root's own directories (a 0700 input, a root-owned
//! git repository that git calls "dubious ownership") were unusable unless
//! chmodded. An idmapped mount (mount_setattr(2), `MOUNT_ATTR_IDMAP`,
//! Linux 5.12+; Documentation/filesystems/idmappings.rst) shows a mount
//! with a different id mapping: here on-disk uid and gid 0 appear as kuid
//! and kgid 65534, the sandbox user's host ids, so inside the sandbox the
//! caller's files are the sandbox user's own. Nothing else is mapped: a
//! file of any other host user (nobody included) shows as the overflow id
//! and is used through its "other" bits, as before. Ownership of root's
//! files on a read-only mount buys no chmod, chown, utime or link (EROFS);
//! it does allow what needs no write: `O_NOATIME` (a read lease,
//! `F_SETLEASE`, which could delay a host writer of the file by
//! lease-break-time, is refused by seccomp; docs/threat-model.md).
//!
//! Writable mounts (the output, `rw` extra mounts) are idmapped too when
//! root owns them: what the sandbox user creates there is stored as uid 0
//! on disk, so the caller owns its output. With the mode it chooses,
//! though: a `chmod 4755` of its own file would leave a setuid-root
//! executable on the host, a privilege escalation for any local user who
//! can reach it. The seccomp filter therefore refuses every mode with
//! S_ISUID or S_ISGID in chmod, open, mknod and mkdir, in every sandbox
//! (`seccomp::RULES`); openat2, whose mode seccomp cannot read, can make
//! only an empty set-id file, whose bits the kernel clears on its first
//! write by a process without CAP_FSETID (docs/threat-model.md).
//!
//! The sequence (each step's place found by experiment on Linux 6.18; the
//! rules are those of mount_setattr(2), open_tree(2), move_mount(2)):
//!
//! 1. The supervisor (host root, initial user and mount namespaces, still
//!    single-threaded, before the first fork) makes a user namespace whose
//!    maps are `0 65534 1`: a short-lived child unshares `CLONE_NEWUSER`,
//!    the supervisor writes its uid_map and gid_map, opens
//!    `/proc/PID/ns/user` and lets the child exit; the descriptor keeps the
//!    namespace alive. One per launch, only when a mount needs it.
//! 2. For each candidate, `open_tree(OPEN_TREE_CLONE | AT_RECURSIVE)` makes
//!    a detached copy of the host tree, and `mount_setattr(AT_EMPTY_PATH |
//!    AT_RECURSIVE)` sets `MOUNT_ATTR_IDMAP` with that namespace, together
//!    with read-only, nosuid and nodev, and private propagation. Both need
//!    CAP_SYS_ADMIN over the filesystem's user namespace (the initial one),
//!    which only the supervisor has; the idmap can be set only on a mount
//!    not yet attached anywhere.
//! 3. The init (root of the sandbox's new user namespace, in its new mount
//!    namespace, which owns the mounts it attaches) inherits the
//!    descriptor through the forks and attaches it with `move_mount` where
//!    the plain bind would have been mounted ([`Call::Attach`] replaces the
//!    bind's [`Call::Mount`] in the compiled root); the plan's own
//!    `mount_setattr` step for the bind runs after it unchanged. A failure
//!    there fails the launch, like any step of the root.
//!
//! Where step 1 or 2 is refused (a filesystem without idmap support, such
//! as ramfs, nfs, or fuse before 6.12, answers EINVAL), the mount stays the
//! plain bind of before, which works if host nobody can read it; if it
//! cannot, the launch stops before any fork with the same error `mcpbox
//! check` gives for such a directory.

use std::ffi::CString;
use std::os::fd::{AsFd, AsRawFd, OwnedFd};
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};

use crate::launch::{Call, RootOp};
use crate::sys::{self, Fork};
use crate::{Error, Result, Spec, ROOT_RUN_HOST_ID};

/// Whether a caller's directory (or file) given to the sandbox is shown
/// through an idmapped mount when mcpbox runs as root: owned by uid 0, the
/// caller, read-only or writable. A directory of anyone else (nobody, say)
/// is not: the mapping covers uid 0 alone, so it would only hide its owner.
pub fn idmapped_when_root(host: &Path) -> bool {
    std::fs::metadata(host).is_ok_and(|m| m.uid() == 0)
}

/// What is wrong with giving `path` to a sandbox whose user is host uid
/// [`ROOT_RUN_HOST_ID`] through a plain bind: the problem and the fix, or
/// None when nobody can use it (read and search; write too when
/// `write`). `mcpbox check` and the launch's fallback say the same.
pub fn root_run_access_problem(path: &Path, write: bool) -> Option<(String, String)> {
    let meta = std::fs::metadata(path).ok()?;
    let id = ROOT_RUN_HOST_ID;
    let mode = meta.mode();
    let (r, w, x) = if meta.uid() == id {
        (0o400, 0o200, 0o100)
    } else if meta.gid() == id {
        (0o040, 0o020, 0o010)
    } else {
        (0o004, 0o002, 0o001)
    };
    // A file needs no search bit.
    let x = if meta.is_dir() { x } else { 0 };
    if mode & r != 0 && mode & x == x && (!write || mode & w != 0) {
        return None;
    }
    let need = match (write, meta.is_dir()) {
        (true, true) => "read, write and search",
        (false, true) => "read and search",
        (true, false) => "read and write",
        (false, false) => "read",
    };
    Some((
        format!(
            "{} is not usable by uid {id}: mcpbox runs as root, so the sandbox runs as host uid \
             {id} (nobody), which needs {need} access",
            path.display()
        ),
        format!(
            "`chown {id}:{id} {}` or `chmod o+{}{}` it, or run mcpbox as an ordinary user",
            path.display(),
            if write { "rw" } else { "r" },
            if meta.is_dir() { "x" } else { "" },
        ),
    ))
}

/// One mount to idmap: host path, path inside, writable.
struct Candidate {
    host: PathBuf,
    at: PathBuf,
    writable: bool,
}

/// The mounts of `spec` that are the caller's: the input, the output and
/// the extra mounts owned by uid 0. (A tmp directory is the sandbox's own,
/// chowned to it by the init, and not a candidate.)
fn candidates(spec: &Spec) -> Vec<Candidate> {
    let mut out = Vec::new();
    let fixed = [
        (&spec.input, crate::INPUT, false),
        (&spec.output, crate::OUTPUT, true),
    ];
    for (host, at, writable) in fixed {
        if let Some(h) = host.as_ref().filter(|h| idmapped_when_root(h)) {
            out.push(Candidate {
                host: h.clone(),
                at: PathBuf::from(at),
                writable,
            });
        }
    }
    for m in &spec.mounts {
        if idmapped_when_root(&m.host) {
            out.push(Candidate {
                host: m.host.clone(),
                at: m.at.clone(),
                writable: m.writable,
            });
        }
    }
    out
}

/// The id maps of the mapping namespace: on-disk 0 is the sandbox user's
/// host id (user_namespaces(7): "ID-inside-ns ID-outside-ns length").
const MAPPING: &str = "0 65534 1\n";
const _: () = assert!(ROOT_RUN_HOST_ID == 65534, "MAPPING names it literally");

/// Step 1: a user namespace mapping uid and gid 0 to host 65534, as a
/// descriptor of `/proc/PID/ns/user` of a short-lived child. Runs in the
/// single-threaded supervisor; the child only makes system calls.
fn mapping_userns() -> std::io::Result<OwnedFd> {
    let (ready_r, ready_w) = sys::pipe()?;
    let (done_r, done_w) = sys::pipe()?;
    match sys::fork()? {
        Fork::Child => {
            drop(ready_r);
            drop(done_w);
            // Die with the supervisor rather than linger if it is killed
            // before it lets us go.
            let _ = sys::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL as libc::c_ulong, 0);
            let ok = sys::unshare(libc::CLONE_NEWUSER).is_ok();
            let _ = sys::write_all(ready_w.as_raw_fd(), &[u8::from(ok)]);
            // EOF once the supervisor holds the namespace.
            let mut byte = [0u8; 1];
            let _ = sys::read(done_r.as_raw_fd(), &mut byte);
            sys::exit_now(0)
        }
        Fork::Parent(pid) => {
            drop(ready_w);
            drop(done_r);
            let result = (|| {
                let mut byte = [0u8; 1];
                if sys::read(ready_r.as_raw_fd(), &mut byte)? != 1 || byte[0] != 1 {
                    return Err(std::io::Error::other(
                        "the child could not create a user namespace",
                    ));
                }
                let dir = PathBuf::from(format!("/proc/{pid}"));
                std::fs::write(dir.join("uid_map"), MAPPING)?;
                std::fs::write(dir.join("gid_map"), MAPPING)?;
                sys::open_read(&sys::cstr(dir.join("ns/user"))?)
            })();
            drop(done_w);
            let _ = sys::waitpid(pid, false);
            result
        }
    }
}

/// Step 2 for one host path: the detached, idmapped copy, read-only unless
/// `writable`, nosuid and nodev either way.
fn idmapped_tree(host: &Path, writable: bool, userns: &OwnedFd) -> std::io::Result<OwnedFd> {
    let tree = sys::open_tree_clone(&sys::cstr(host)?)?;
    let mut attrs = sys::MOUNT_ATTR_IDMAP | sys::MOUNT_ATTR_NOSUID | sys::MOUNT_ATTR_NODEV;
    if !writable {
        attrs |= sys::MOUNT_ATTR_RDONLY;
    }
    sys::mount_setattr_idmap(tree.as_fd(), attrs, userns.as_fd())?;
    Ok(tree)
}

/// The compiled bind of `host` at `at`: the `Call::Mount` that
/// `compile_root` makes for a `Step::Bind` (source under /oldroot, target
/// under /newroot, `MS_BIND`, with `MS_REC`, which the recursive
/// `open_tree` stands for): its index and target. The mount attributes
/// are set by the plan's own step after it, whatever they are.
fn bind_op(ops: &[RootOp], host: &Path, at: &Path) -> Option<(usize, CString)> {
    let under = |root: &str, p: &Path| {
        sys::cstr(Path::new(root).join(p.strip_prefix("/").unwrap_or(p))).ok()
    };
    let (source, target) = (under("/oldroot", host)?, under("/newroot", at)?);
    let i = ops.iter().position(|op| {
        matches!(&op.call, Call::Mount { source: Some(s), target: t, fstype: None, flags, .. }
            if *s == source && *t == target && *flags & libc::MS_BIND != 0)
    })?;
    Some((i, target))
}

/// Makes the idmapped trees for `spec` (as root only) and rewrites their
/// binds in `ops` into attachments. Returns the trees' descriptors, which
/// must stay open until the init has attached them (they are inherited
/// through the forks; close-on-exec keeps them from the command). A mount
/// whose filesystem refuses keeps its plain bind, unless host nobody could
/// not use it: then the launch is refused here, before any fork.
pub(crate) fn attach(spec: &Spec, ops: &mut [RootOp], as_root: bool) -> Result<Vec<OwnedFd>> {
    if !as_root {
        return Ok(Vec::new());
    }
    let wanted = candidates(spec);
    if wanted.is_empty() {
        return Ok(Vec::new());
    }
    let userns = mapping_userns();
    let mut trees = Vec::new();
    for Candidate { host, at, writable } in wanted {
        let made = match &userns {
            Ok(ns) => idmapped_tree(&host, writable, ns),
            Err(e) => Err(std::io::Error::new(e.kind(), e.to_string())),
        };
        match made {
            Ok(tree) => {
                let Some((i, target)) = bind_op(ops, &host, &at) else {
                    return Err(Error::setup(
                        format!("idmapped mount of {}", host.display()),
                        std::io::Error::other("the mount plan has no bind for it"),
                    ));
                };
                ops[i] = RootOp {
                    label: format!("attach idmapped {} -> {}", host.display(), at.display()),
                    call: Call::Attach {
                        tree: tree.as_raw_fd(),
                        target,
                    },
                };
                tracing::debug!(host = %host.display(), at = %at.display(), writable, "idmapped mount: on-disk uid 0 is the sandbox user");
                trees.push(tree);
            }
            Err(e) => {
                if let Some((problem, hint)) = root_run_access_problem(&host, writable) {
                    return Err(Error::setup(
                        format!("idmapped mount of {}", host.display()),
                        std::io::Error::other(format!(
                            "{problem}, and its filesystem refused an idmapped mount ({e}); {hint}"
                        )),
                    ));
                }
                tracing::info!(host = %host.display(), error = %e, "no idmapped mount here; a plain bind used as host nobody");
            }
        }
    }
    Ok(trees)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::launch::compile_root;
    use crate::plan::{Access, Step};

    #[test]
    fn the_bind_of_a_step_is_found_in_the_compiled_root() {
        let steps = vec![
            Step::Dir {
                path: "/workspace/input".into(),
                mode: 0o755,
            },
            Step::Bind {
                host: "/root/repo".into(),
                path: "/workspace/input".into(),
                access: Access::ReadOnly,
            },
            Step::Dir {
                path: "/data".into(),
                mode: 0o755,
            },
            Step::Bind {
                host: "/srv/data".into(),
                path: "/data".into(),
                access: Access::ReadOnly,
            },
        ];
        let ops = compile_root(&steps).unwrap();
        let (i, target) =
            bind_op(&ops, Path::new("/root/repo"), Path::new("/workspace/input")).unwrap();
        assert_eq!(target.as_bytes(), b"/newroot/workspace/input");
        assert_eq!(ops[i].label, "bind /root/repo -> /workspace/input");
        // The plan's mount attributes follow the bind, and so the attachment.
        assert!(matches!(&ops[i + 1].call, Call::SetAttr { attrs, .. }
            if attrs & sys::MOUNT_ATTR_RDONLY != 0 && attrs & sys::MOUNT_ATTR_NOSUID != 0));
        let (j, _) = bind_op(&ops, Path::new("/srv/data"), Path::new("/data")).unwrap();
        assert_eq!(ops[j].label, "bind /srv/data -> /data");
        assert!(bind_op(&ops, Path::new("/srv/data"), Path::new("/workspace/input")).is_none());
    }

    #[test]
    fn unprivileged_runs_are_not_idmapped() {
        let spec = Spec {
            argv: vec!["true".into()],
            env: Vec::new(),
            input: Some("/".into()),
            output: None,
            tmp_size: 1 << 20,
            mounts: Vec::new(),
            limits: crate::Limits::default(),
            allow_exec: None,
            allow_degraded: false,
            stdio: crate::Stdio::Piped,
            egress: None,
            tmp_dir: None,
            cgroup_parent: None,
        };
        let mut ops = Vec::new();
        assert!(attach(&spec, &mut ops, false).unwrap().is_empty());
    }

    #[test]
    fn only_root_owned_paths_are_candidates() {
        // / is root's on every host this runs on.
        assert!(idmapped_when_root(Path::new("/")));
        assert!(!idmapped_when_root(Path::new("/nonexistent/x")));
        let nobody = tempfile::tempdir().unwrap();
        if sys::geteuid() == 0 {
            std::os::unix::fs::chown(nobody.path(), Some(65534), Some(65534)).unwrap();
            assert!(!idmapped_when_root(nobody.path()));
        }
    }

    #[test]
    fn a_directory_nobody_cannot_search_is_a_problem_with_a_fix() {
        let dir = tempfile::tempdir().unwrap();
        use std::os::unix::fs::PermissionsExt;
        std::fs::set_permissions(dir.path(), std::fs::Permissions::from_mode(0o700)).unwrap();
        let (problem, hint) = root_run_access_problem(dir.path(), false).unwrap();
        assert!(problem.contains("not usable by uid 65534"), "{problem}");
        assert!(hint.contains("chmod o+rx"), "{hint}");
        std::fs::set_permissions(dir.path(), std::fs::Permissions::from_mode(0o755)).unwrap();
        assert!(root_run_access_problem(dir.path(), false).is_none());
        assert!(root_run_access_problem(dir.path(), true).is_some());
    }
}
