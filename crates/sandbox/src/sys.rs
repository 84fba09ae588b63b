//! Safe wrappers around every raw system call the sandbox makes.
//!
//! This is the only module of the project that holds `unsafe`. Each wrapper
//! is a thin, literal translation of one call: it takes Rust types, checks
//! the return value and turns `-1` into `io::Error::last_os_error()`. Logic
//! lives in the callers, so that what is unsafe stays small enough to read.
//!
//! We call `libc` directly rather than `rustix`/`nix` because several calls
//! we need (`mount_setattr`, `close_range`, `capset`, `seccomp`) are not
//! covered uniformly by either, and one style for all of them is easier to
//! audit than two (see docs/conventions.md).
#![allow(unsafe_code)]

use std::ffi::{CStr, CString, OsStr};
use std::io;
use std::os::fd::{AsRawFd, BorrowedFd, FromRawFd, OwnedFd, RawFd};
use std::os::unix::ffi::OsStrExt;

/// Turns a path or string into a C string, refusing interior NUL bytes.
pub fn cstr(s: impl AsRef<OsStr>) -> io::Result<CString> {
    CString::new(s.as_ref().as_bytes())
        .map_err(|_| io::Error::new(io::ErrorKind::InvalidInput, "path contains a NUL byte"))
}

fn check(ret: libc::c_int) -> io::Result<libc::c_int> {
    if ret == -1 {
        Err(io::Error::last_os_error())
    } else {
        Ok(ret)
    }
}

fn check_long(ret: libc::c_long) -> io::Result<libc::c_long> {
    if ret == -1 {
        Err(io::Error::last_os_error())
    } else {
        Ok(ret)
    }
}

/// What `fork` returned.
pub enum Fork {
    Parent(libc::pid_t),
    Child,
}

/// fork(2), for the sandbox's own processes only. Every caller is a
/// single-threaded process: the supervisor (`mcpbox exec`, checked with
/// [`thread_count`] before the first fork, or the helper `mcpbox run`
/// re-executes), the init (made by [`clone_into_namespaces`] from the
/// supervisor, and never starting a thread), and `mcpbox doctor`'s probe.
pub fn fork() -> io::Result<Fork> {
    // SAFETY: fork has no memory-safety preconditions of its own. What makes
    // continuing in Rust code sound in the child is that the parent is
    // single-threaded (see above): no lock (allocator, stdio, tracing) can
    // be held by a thread that does not exist in the child. On top of that,
    // the sandbox's children make only system calls on data prepared before
    // the fork until they execve (launch.rs, lastmile.rs); the egress bridge,
    // which never execs, runs ordinary Rust, which the first point allows.
    let pid = unsafe { libc::fork() };
    match pid {
        -1 => Err(io::Error::last_os_error()),
        0 => Ok(Fork::Child),
        p => Ok(Fork::Parent(p)),
    }
}

/// clone(2) without CLONE_VM, so like fork, with `flags` naming the new
/// namespaces the child starts in (with CLONE_NEWPID it is pid 1 of the new
/// one). This is how the supervisor makes the sandbox's init in one step,
/// as bwrap does, instead of a fork that unshares and forks again.
pub fn clone_into_namespaces(flags: libc::c_int) -> io::Result<Fork> {
    let flags = libc::c_ulong::try_from(flags | libc::SIGCHLD)
        .map_err(|_| io::Error::from_raw_os_error(libc::EINVAL))?;
    // SAFETY: the raw system call, not glibc's clone(3) (which wants a
    // function and a stack): with a null stack and no CLONE_VM the child
    // continues here on a copy of the parent's memory and stack, exactly as
    // after fork(2). The caller is single-threaded, as for [`fork`], so no
    // lock is held by a thread missing in the child. What glibc's fork does
    // besides (atfork handlers, the thread's tid in its own TCB) is not
    // done; the child (the init) only makes system calls on prepared data
    // and starts its own children with [`fork`], which sets theirs up.
    let ret = unsafe {
        libc::syscall(
            libc::SYS_clone,
            flags,
            0 as libc::c_ulong, // stack: the parent's, copied
            0 as libc::c_ulong, // parent_tid: unused
            0 as libc::c_ulong, // child_tid: unused
            0 as libc::c_ulong, // tls: unused
        )
    };
    forked(ret)
}

/// What a raw clone or clone3 returned, as after fork(2).
fn forked(ret: libc::c_long) -> io::Result<Fork> {
    match ret {
        -1 => Err(io::Error::last_os_error()),
        0 => Ok(Fork::Child),
        p => libc::pid_t::try_from(p)
            .map(Fork::Parent)
            .map_err(|_| io::Error::from_raw_os_error(libc::EINVAL)),
    }
}

/// `struct clone_args` of clone3(2), as far as its `cgroup` field
/// (`CLONE_ARGS_SIZE_VER2`, 88 bytes, Linux 5.7).
#[repr(C)]
struct CloneArgs {
    flags: u64,
    pidfd: u64,
    child_tid: u64,
    parent_tid: u64,
    exit_signal: u64,
    stack: u64,
    stack_size: u64,
    tls: u64,
    set_tid: u64,
    set_tid_size: u64,
    cgroup: u64,
}

/// clone3(2)'s `CLONE_INTO_CGROUP` (linux/sched.h; Linux 5.7).
const CLONE_INTO_CGROUP: u64 = 0x2_0000_0000;

/// As [`clone_into_namespaces`], with the child born in the cgroup v2
/// directory `cgroup` (clone3(2), `CLONE_INTO_CGROUP`) instead of moved
/// there afterwards by a write to its `cgroup.procs`. A move takes the
/// kernel's cgroup_threadgroup_rwsem for writing, which waits for an RCU
/// grace period, where a clone into the group takes only the read side:
/// `bench/run`'s builtin section, a fresh sandbox's `initialize` to its
/// first `exec` result, went from 28.9 to 13.75 ms (median, 2026-12-04). Errors are clone3's own: ENOSYS
/// before Linux 5.3 or under a seccomp profile that refuses clone3 (as
/// Docker's does, so that libc falls back to clone), EINVAL or E2BIG
/// before 5.7; the caller falls back to [`clone_into_namespaces`].
pub fn clone3_into_namespaces(flags: libc::c_int, cgroup: BorrowedFd<'_>) -> io::Result<Fork> {
    let flags = u64::try_from(flags).map_err(|_| io::Error::from_raw_os_error(libc::EINVAL))?;
    let fd =
        u64::try_from(cgroup.as_raw_fd()).map_err(|_| io::Error::from_raw_os_error(libc::EBADF))?;
    let args = CloneArgs {
        flags: flags | CLONE_INTO_CGROUP,
        pidfd: 0,
        child_tid: 0,
        parent_tid: 0,
        exit_signal: libc::SIGCHLD as u64,
        // no stack and no CLONE_VM: the child continues here on a copy of
        // the parent's memory and stack, as after fork(2) (clone3(2))
        stack: 0,
        stack_size: 0,
        tls: 0,
        set_tid: 0,
        set_tid_size: 0,
        cgroup: fd,
    };
    // SAFETY: as for clone_into_namespaces: the raw system call, without
    // CLONE_VM, from a single-threaded caller; `args` lives across the
    // call and its size is passed with it.
    let ret = unsafe {
        libc::syscall(
            libc::SYS_clone3,
            std::ptr::addr_of!(args),
            std::mem::size_of::<CloneArgs>(),
        )
    };
    forked(ret)
}

/// _exit(2): leaves without running atexit handlers or flushing stdio
/// buffers that belong to the parent's copy of the process.
pub fn exit_now(code: i32) -> ! {
    // SAFETY: _exit never returns and has no preconditions.
    unsafe { libc::_exit(code) }
}

/// Makes the child that `cmd` starts get SIGKILL when the thread that
/// starts it ends (prctl(2) `PR_SET_PDEATHSIG`, set in the child between
/// fork and exec), and fail to start when that parent is already gone by
/// then. Used for a program mcpbox runs directly as a server's sandbox
/// (gVisor's `runsc`, whose own children die with it). What runs in the
/// child is two async-signal-safe system calls, so it is sound in a
/// process with threads.
pub fn kill_with_parent(cmd: &mut std::process::Command) {
    use std::os::unix::process::CommandExt;
    // SAFETY: getpid has no preconditions.
    let parent = unsafe { libc::getpid() };
    let hook = move || -> io::Result<()> {
        // SAFETY: prctl with integer arguments; getppid has none.
        check(unsafe { libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL, 0, 0, 0) })?;
        // SAFETY: getppid has no preconditions.
        if unsafe { libc::getppid() } != parent {
            return Err(io::Error::from_raw_os_error(libc::ESRCH));
        }
        Ok(())
    };
    // SAFETY: the hook makes only async-signal-safe system calls and
    // touches no lock or allocation.
    unsafe { cmd.pre_exec(hook) };
}

/// unshare(2) with the given CLONE_* flags.
pub fn unshare(flags: libc::c_int) -> io::Result<()> {
    // SAFETY: plain syscall with an integer argument.
    check(unsafe { libc::unshare(flags) }).map(drop)
}

/// pipe2(2) with O_CLOEXEC: (read end, write end).
pub fn pipe() -> io::Result<(OwnedFd, OwnedFd)> {
    let mut fds = [0 as libc::c_int; 2];
    // SAFETY: fds is a valid array of two ints for the kernel to fill.
    check(unsafe { libc::pipe2(fds.as_mut_ptr(), libc::O_CLOEXEC) })?;
    // SAFETY: the kernel just returned two fresh descriptors that we own.
    Ok(unsafe { (OwnedFd::from_raw_fd(fds[0]), OwnedFd::from_raw_fd(fds[1])) })
}

/// fcntl(2) F_SETPIPE_SZ: asks the kernel for a pipe buffer of at least
/// `size` bytes; returns the size it set. An unprivileged process may go up
/// to /proc/sys/fs/pipe-max-size (EPERM above, and EPERM too once the user's
/// pipe-user-pages-soft is used up); callers treat a refusal as harmless.
pub fn set_pipe_size(fd: BorrowedFd<'_>, size: usize) -> io::Result<usize> {
    let size =
        libc::c_int::try_from(size).map_err(|_| io::Error::from_raw_os_error(libc::EINVAL))?;
    // SAFETY: fcntl with an integer command and argument on a descriptor we
    // borrow; a descriptor that is not a pipe yields EBADF/EINVAL.
    let n = check(unsafe { libc::fcntl(fd.as_raw_fd(), libc::F_SETPIPE_SZ, size) })?;
    Ok(usize::try_from(n).unwrap_or(0))
}

/// dup2(2).
pub fn dup2(from: RawFd, to: RawFd) -> io::Result<()> {
    // SAFETY: dup2 on integer fds; invalid ones yield EBADF.
    check(unsafe { libc::dup2(from, to) }).map(drop)
}

/// prctl(2) with up to four integer arguments.
pub fn prctl(option: libc::c_int, a2: libc::c_ulong, a3: libc::c_ulong) -> io::Result<libc::c_int> {
    // SAFETY: every prctl option used by this crate takes integer arguments
    // only (PR_SET_PDEATHSIG, PR_SET_NO_NEW_PRIVS, PR_CAPBSET_DROP, PR_CAPBSET_READ,
    // PR_CAP_AMBIENT, PR_GET_SECCOMP, PR_SET_DUMPABLE).
    check(unsafe { libc::prctl(option, a2, a3, 0 as libc::c_ulong, 0 as libc::c_ulong) })
}

/// getpid(2) / getppid(2) / getuid(2) / getgid(2).
pub fn getpid() -> libc::pid_t {
    // SAFETY: always succeeds.
    unsafe { libc::getpid() }
}
pub fn getppid() -> libc::pid_t {
    // SAFETY: always succeeds.
    unsafe { libc::getppid() }
}
pub fn geteuid() -> u32 {
    // SAFETY: always succeeds.
    unsafe { libc::geteuid() }
}
pub fn getegid() -> u32 {
    // SAFETY: always succeeds.
    unsafe { libc::getegid() }
}

/// setsid(2): a new session with no controlling terminal, so that the
/// sandbox cannot push input into ours with TIOCSTI (CVE-2017-5226).
pub fn setsid() -> io::Result<()> {
    // SAFETY: no arguments.
    check(unsafe { libc::setsid() }).map(drop)
}

/// setpgid(0, 0): the command leads its own process group, so that the
/// init can signal the whole group.
pub fn setpgid_self() -> io::Result<()> {
    // SAFETY: integer arguments.
    check(unsafe { libc::setpgid(0, 0) }).map(drop)
}

/// mount(2) on prepared C strings.
pub fn mount(
    source: Option<&CStr>,
    target: &CStr,
    fstype: Option<&CStr>,
    flags: libc::c_ulong,
    data: Option<&CStr>,
) -> io::Result<()> {
    let ptr = |c: Option<&CStr>| c.map_or(std::ptr::null(), |c| c.as_ptr());
    // SAFETY: every pointer is either null or a valid NUL-terminated string
    // that outlives the call.
    check(unsafe {
        libc::mount(
            ptr(source),
            target.as_ptr(),
            ptr(fstype),
            flags,
            ptr(data) as *const libc::c_void,
        )
    })
    .map(drop)
}

/// umount2(2).
pub fn umount2(target: &CStr, flags: libc::c_int) -> io::Result<()> {
    // SAFETY: valid NUL-terminated path.
    check(unsafe { libc::umount2(target.as_ptr(), flags) }).map(drop)
}

/// The kernel's `struct mount_attr` (linux/mount.h).
#[repr(C)]
struct MountAttr {
    attr_set: u64,
    attr_clr: u64,
    propagation: u64,
    userns_fd: u64,
}

pub const MOUNT_ATTR_RDONLY: u64 = 0x0000_0001;
pub const MOUNT_ATTR_NOSUID: u64 = 0x0000_0002;
pub const MOUNT_ATTR_NODEV: u64 = 0x0000_0004;
pub const MOUNT_ATTR_NOEXEC: u64 = 0x0000_0008;

/// mount_setattr(2) with AT_RECURSIVE: sets attributes on a whole mount
/// tree at once, so that a read-only bind cannot leave a writable submount
/// behind (Linux 5.12+).
pub fn mount_setattr_recursive(target: &CStr, attr_set: u64) -> io::Result<()> {
    let attr = MountAttr {
        attr_set,
        attr_clr: 0,
        propagation: 0,
        userns_fd: 0,
    };
    // SAFETY: target is a valid string, attr a valid struct of the size we
    // pass; the kernel only reads from it.
    check_long(unsafe {
        libc::syscall(
            libc::SYS_mount_setattr,
            libc::AT_FDCWD,
            target.as_ptr(),
            libc::AT_RECURSIVE as libc::c_uint,
            &attr as *const MountAttr,
            std::mem::size_of::<MountAttr>(),
        )
    })
    .map(drop)
}

/// `MOUNT_ATTR_IDMAP` (linux/mount.h): the mount takes the id mapping of
/// the user namespace in `mount_attr.userns_fd` (mount_setattr(2)).
pub const MOUNT_ATTR_IDMAP: u64 = 0x0010_0000;

/// open_tree(2) with `OPEN_TREE_CLONE | OPEN_TREE_CLOEXEC | AT_RECURSIVE`:
/// a detached copy of the mount tree at `path` (submounts included, as a
/// recursive bind), not yet visible in any mount namespace. Needs
/// CAP_SYS_ADMIN over the caller's mount namespace (Linux 5.2+).
pub fn open_tree_clone(path: &CStr) -> io::Result<OwnedFd> {
    let flags =
        libc::OPEN_TREE_CLONE | libc::OPEN_TREE_CLOEXEC | libc::AT_RECURSIVE as libc::c_uint;
    // SAFETY: path is a valid NUL-terminated string; integer flags.
    let fd = check_long(unsafe {
        libc::syscall(libc::SYS_open_tree, libc::AT_FDCWD, path.as_ptr(), flags)
    })?;
    // SAFETY: on success open_tree returns a new descriptor we now own.
    Ok(unsafe { OwnedFd::from_raw_fd(fd as RawFd) })
}

/// mount_setattr(2) on the detached mount tree `tree` (`AT_EMPTY_PATH |
/// AT_RECURSIVE`): sets `attr_set`, which holds [`MOUNT_ATTR_IDMAP`], with
/// the id mapping of the user namespace `userns`, and makes every mount of
/// the tree private (`propagation = MS_PRIVATE`), so nothing mounted on the
/// host below it later shows up inside, nor the other way. The kernel
/// refuses with EINVAL where the filesystem does not support idmapped
/// mounts (Linux 5.12+; mount_setattr(2), "ID-mapped mounts").
pub fn mount_setattr_idmap(
    tree: BorrowedFd<'_>,
    attr_set: u64,
    userns: BorrowedFd<'_>,
) -> io::Result<()> {
    let attr = MountAttr {
        attr_set,
        attr_clr: 0,
        propagation: libc::MS_PRIVATE,
        userns_fd: userns.as_raw_fd() as u64,
    };
    // SAFETY: tree and userns are open descriptors, "" a valid string, attr
    // a valid struct of the size we pass; the kernel only reads from it.
    check_long(unsafe {
        libc::syscall(
            libc::SYS_mount_setattr,
            tree.as_raw_fd(),
            c"".as_ptr(),
            (libc::AT_EMPTY_PATH | libc::AT_RECURSIVE) as libc::c_uint,
            &attr as *const MountAttr,
            std::mem::size_of::<MountAttr>(),
        )
    })
    .map(drop)
}

/// move_mount(2) with `MOVE_MOUNT_F_EMPTY_PATH`: attaches the detached mount
/// tree `tree` at `target` in the caller's mount namespace. Needs
/// CAP_SYS_ADMIN over the user namespace that owns that mount namespace.
pub fn move_mount_attach(tree: RawFd, target: &CStr) -> io::Result<()> {
    // SAFETY: "" and target are valid NUL-terminated strings; tree is a
    // descriptor number (the kernel checks it); integer flags.
    check_long(unsafe {
        libc::syscall(
            libc::SYS_move_mount,
            tree,
            c"".as_ptr(),
            libc::AT_FDCWD,
            target.as_ptr(),
            libc::MOVE_MOUNT_F_EMPTY_PATH,
        )
    })
    .map(drop)
}

/// Opens `path` read-only and close-on-exec (a namespace file of /proc).
pub fn open_read(path: &CStr) -> io::Result<OwnedFd> {
    // SAFETY: valid NUL-terminated path; integer flags.
    let fd = check(unsafe { libc::open(path.as_ptr(), libc::O_RDONLY | libc::O_CLOEXEC) })?;
    // SAFETY: open returned a new descriptor we now own.
    Ok(unsafe { OwnedFd::from_raw_fd(fd) })
}

/// pivot_root(2), used in its `pivot_root(".", ".")` form.
pub fn pivot_root(new_root: &CStr, put_old: &CStr) -> io::Result<()> {
    // SAFETY: two valid NUL-terminated paths.
    check_long(unsafe { libc::syscall(libc::SYS_pivot_root, new_root.as_ptr(), put_old.as_ptr()) })
        .map(drop)
}

/// chdir(2).
pub fn chdir(path: &CStr) -> io::Result<()> {
    // SAFETY: valid NUL-terminated path.
    check(unsafe { libc::chdir(path.as_ptr()) }).map(drop)
}

/// chown(2) / lchown(2) use: ownership of directories the init creates for
/// the command (HOME).
pub fn chown(path: &CStr, uid: u32, gid: u32) -> io::Result<()> {
    // SAFETY: valid NUL-terminated path.
    check(unsafe { libc::chown(path.as_ptr(), uid, gid) }).map(drop)
}

/// sethostname(2).
pub fn sethostname(name: &str) -> io::Result<()> {
    // SAFETY: pointer and length describe a valid byte slice.
    check(unsafe { libc::sethostname(name.as_ptr() as *const libc::c_char, name.len()) }).map(drop)
}

/// Brings the loopback interface of the current network namespace up
/// (SIOCGIFFLAGS / SIOCSIFFLAGS, netdevice(7)).
pub fn loopback_up() -> io::Result<()> {
    // SAFETY: socket with integer arguments.
    let sock =
        check(unsafe { libc::socket(libc::AF_INET, libc::SOCK_DGRAM | libc::SOCK_CLOEXEC, 0) })?;
    // SAFETY: the kernel just returned this fd and we own it.
    let sock = unsafe { OwnedFd::from_raw_fd(sock) };
    // SAFETY: ifreq is plain old data; all-zero is a valid value.
    let mut req: libc::ifreq = unsafe { std::mem::zeroed() };
    for (dst, src) in req.ifr_name.iter_mut().zip(b"lo\0") {
        *dst = *src as libc::c_char;
    }
    // SAFETY: req is a valid ifreq for SIOCGIFFLAGS to fill.
    check(unsafe { libc::ioctl(sock.as_raw_fd(), libc::SIOCGIFFLAGS, &mut req) })?;
    // SAFETY: reading and writing the flags member of the union that
    // SIOCGIFFLAGS just filled.
    unsafe {
        req.ifr_ifru.ifru_flags |= (libc::IFF_UP | libc::IFF_RUNNING) as libc::c_short;
    }
    // SAFETY: req is a valid ifreq for SIOCSIFFLAGS to read.
    check(unsafe { libc::ioctl(sock.as_raw_fd(), libc::SIOCSIFFLAGS, &req) }).map(drop)
}

/// A netlink socket of `protocol` (netlink(7)) whose reads give up after
/// two seconds: the init waits for the kernel's acknowledgements on it, and
/// a kernel that never answers must fail the step, not hang the sandbox.
pub fn netlink_socket(protocol: libc::c_int) -> io::Result<OwnedFd> {
    // SAFETY: socket with integer arguments.
    let fd = check(unsafe {
        libc::socket(
            libc::AF_NETLINK,
            libc::SOCK_RAW | libc::SOCK_CLOEXEC,
            protocol,
        )
    })?;
    // SAFETY: the kernel just returned this fd and we own it.
    let fd = unsafe { OwnedFd::from_raw_fd(fd) };
    let timeout = libc::timeval {
        tv_sec: 2,
        tv_usec: 0,
    };
    // SAFETY: timeout is a valid timeval for SO_RCVTIMEO, with its size.
    check(unsafe {
        libc::setsockopt(
            fd.as_raw_fd(),
            libc::SOL_SOCKET,
            libc::SO_RCVTIMEO,
            &timeout as *const libc::timeval as *const libc::c_void,
            std::mem::size_of::<libc::timeval>() as libc::socklen_t,
        )
    })?;
    Ok(fd)
}

/// sendto(2) of one buffer of netlink messages to the kernel (port id 0).
pub fn netlink_send(fd: BorrowedFd<'_>, bytes: &[u8]) -> io::Result<()> {
    // SAFETY: sockaddr_nl is plain old data; all-zero is a valid value.
    let mut to: libc::sockaddr_nl = unsafe { std::mem::zeroed() };
    to.nl_family = libc::AF_NETLINK as libc::sa_family_t;
    // SAFETY: bytes is a valid slice for its length; `to` is a valid
    // sockaddr_nl with its size.
    let n = unsafe {
        libc::sendto(
            fd.as_raw_fd(),
            bytes.as_ptr() as *const libc::c_void,
            bytes.len(),
            0,
            &to as *const libc::sockaddr_nl as *const libc::sockaddr,
            std::mem::size_of::<libc::sockaddr_nl>() as libc::socklen_t,
        )
    };
    if n < 0 {
        return Err(io::Error::last_os_error());
    }
    if n as usize != bytes.len() {
        return Err(io::Error::from_raw_os_error(libc::EMSGSIZE));
    }
    Ok(())
}

/// setrlimit(2) with soft = hard = `value`.
pub fn setrlimit(resource: libc::__rlimit_resource_t, value: u64) -> io::Result<()> {
    let lim = libc::rlimit {
        rlim_cur: value,
        rlim_max: value,
    };
    // SAFETY: lim is a valid rlimit struct.
    check(unsafe { libc::setrlimit(resource, &lim) }).map(drop)
}

/// setgroups(0, NULL): drops supplementary groups (where setgroups is
/// allowed in this user namespace).
pub fn clear_groups() -> io::Result<()> {
    // SAFETY: a zero-length list with a null pointer is valid.
    check(unsafe { libc::setgroups(0, std::ptr::null()) }).map(drop)
}

/// setresgid(2) and setresuid(2) to the same id for real, effective, saved.
pub fn set_ids(uid: u32, gid: u32) -> io::Result<()> {
    // SAFETY: integer arguments.
    check(unsafe { libc::setresgid(gid, gid, gid) })?;
    // SAFETY: integer arguments.
    check(unsafe { libc::setresuid(uid, uid, uid) }).map(drop)
}

/// capset(2) with empty effective, permitted and inheritable sets.
pub fn clear_capabilities() -> io::Result<()> {
    #[repr(C)]
    struct Header {
        version: u32,
        pid: libc::c_int,
    }
    #[repr(C)]
    #[derive(Clone, Copy)]
    struct Data {
        effective: u32,
        permitted: u32,
        inheritable: u32,
    }
    const LINUX_CAPABILITY_VERSION_3: u32 = 0x2008_0522;
    let header = Header {
        version: LINUX_CAPABILITY_VERSION_3,
        pid: 0,
    };
    let data = [Data {
        effective: 0,
        permitted: 0,
        inheritable: 0,
    }; 2];
    // SAFETY: header and a two-element data array, as capset(2) requires for
    // version 3; the kernel only reads them.
    check_long(unsafe { libc::syscall(libc::SYS_capset, &header as *const Header, data.as_ptr()) })
        .map(drop)
}

/// The highest capability number this kernel knows (read before forking).
/// PR_CAPBSET_READ answers EINVAL for a number past it (prctl(2)), so
/// counting up from CAP_CHECKPOINT_RESTORE (40, Linux 5.9; mcpbox needs
/// 5.14) takes two system calls, where /proc/sys/kernel/cap_last_cap
/// takes an open, reads and a close through procfs on every sandbox start.
/// A kernel that refuses even 40 is asked through /proc.
pub fn last_cap() -> u32 {
    const KNOWN: u32 = 40;
    let known = |cap: u32| prctl(libc::PR_CAPBSET_READ, libc::c_ulong::from(cap), 0).is_ok();
    if !known(KNOWN) {
        return std::fs::read_to_string("/proc/sys/kernel/cap_last_cap")
            .ok()
            .and_then(|s| s.trim().parse().ok())
            .unwrap_or(KNOWN);
    }
    let mut last = KNOWN;
    // 63: the capability sets are 64 bits wide.
    while last < 63 && known(last + 1) {
        last += 1;
    }
    last
}

/// seccomp(SECCOMP_SET_MODE_FILTER, TSYNC? no, 0, prog).
pub fn seccomp_load(filter: &[libc::sock_filter]) -> io::Result<()> {
    let prog = libc::sock_fprog {
        len: u16::try_from(filter.len())
            .map_err(|_| io::Error::new(io::ErrorKind::InvalidInput, "seccomp filter too long"))?,
        filter: filter.as_ptr() as *mut libc::sock_filter,
    };
    // SAFETY: prog points at `filter`, which outlives the call; the kernel
    // copies the program.
    check_long(unsafe {
        libc::syscall(
            libc::SYS_seccomp,
            libc::SECCOMP_SET_MODE_FILTER,
            0u32,
            &prog as *const libc::sock_fprog,
        )
    })
    .map(drop)
}

/// What `waitpid` reported.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Wait {
    Exited(libc::pid_t, i32),
    Signaled(libc::pid_t, i32),
    /// WNOHANG and nothing to reap.
    None,
}

/// waitpid(2) for exit or death by signal.
pub fn waitpid(pid: libc::pid_t, nohang: bool) -> io::Result<Wait> {
    let mut status = 0;
    let flags = if nohang { libc::WNOHANG } else { 0 };
    loop {
        // SAFETY: status is a valid int for the kernel to fill.
        let ret = unsafe { libc::waitpid(pid, &mut status, flags) };
        if ret == -1 {
            let err = io::Error::last_os_error();
            if err.raw_os_error() == Some(libc::EINTR) {
                continue;
            }
            return Err(err);
        }
        if ret == 0 {
            return Ok(Wait::None);
        }
        if libc::WIFEXITED(status) {
            return Ok(Wait::Exited(ret, libc::WEXITSTATUS(status)));
        }
        if libc::WIFSIGNALED(status) {
            return Ok(Wait::Signaled(ret, libc::WTERMSIG(status)));
        }
        // Stopped or continued: not an ending; keep waiting.
        if nohang {
            return Ok(Wait::None);
        }
    }
}

/// kill(2). ESRCH (already gone) is not an error for our callers.
pub fn kill(pid: libc::pid_t, sig: libc::c_int) -> io::Result<()> {
    // SAFETY: integer arguments.
    match check(unsafe { libc::kill(pid, sig) }) {
        Ok(_) => Ok(()),
        Err(e) if e.raw_os_error() == Some(libc::ESRCH) => Ok(()),
        Err(e) => Err(e),
    }
}

/// A signal set.
pub struct SigSet(libc::sigset_t);

impl SigSet {
    pub fn of(signals: &[libc::c_int]) -> SigSet {
        // SAFETY: sigset_t is plain data; sigemptyset initialises it.
        let mut set: libc::sigset_t = unsafe { std::mem::zeroed() };
        // SAFETY: set is a valid sigset_t.
        unsafe { libc::sigemptyset(&mut set) };
        for &s in signals {
            // SAFETY: set is valid; an invalid signal number only yields EINVAL.
            unsafe { libc::sigaddset(&mut set, s) };
        }
        SigSet(set)
    }

    /// The set with `sig` added.
    pub fn with(mut self, sig: libc::c_int) -> SigSet {
        // SAFETY: the set is valid; an invalid signal number only yields EINVAL.
        unsafe { libc::sigaddset(&mut self.0, sig) };
        self
    }
}

/// sigprocmask(SIG_BLOCK / SIG_SETMASK).
pub fn block_signals(set: &SigSet) -> io::Result<()> {
    // SAFETY: set is valid; old set pointer may be null.
    check(unsafe { libc::sigprocmask(libc::SIG_BLOCK, &set.0, std::ptr::null_mut()) }).map(drop)
}
/// Whether every signal of `set` is blocked in the calling thread.
pub fn signals_blocked(set: &SigSet) -> bool {
    // SAFETY: sigset_t is plain data; sigprocmask fills it.
    let mut current: libc::sigset_t = unsafe { std::mem::zeroed() };
    // SAFETY: a null new set only queries; current is valid for writing.
    if unsafe { libc::sigprocmask(libc::SIG_BLOCK, std::ptr::null(), &mut current) } != 0 {
        return false;
    }
    (1..65).all(|sig| {
        // SAFETY: both sets are valid; sigismember only reads them.
        let wanted = unsafe { libc::sigismember(&set.0, sig) } == 1;
        // SAFETY: as above.
        !wanted || unsafe { libc::sigismember(&current, sig) } == 1
    })
}

pub fn unblock_all_signals() -> io::Result<()> {
    let empty = SigSet::of(&[]);
    // SAFETY: empty is a valid set.
    check(unsafe { libc::sigprocmask(libc::SIG_SETMASK, &empty.0, std::ptr::null_mut()) }).map(drop)
}

/// Resets every catchable signal's disposition to the default, so the
/// command does not inherit ignored signals from mcpbox's caller.
pub fn reset_signal_dispositions() {
    for sig in 1..32 {
        if sig == libc::SIGKILL || sig == libc::SIGSTOP {
            continue;
        }
        // SAFETY: installing SIG_DFL is always valid.
        unsafe { libc::signal(sig, libc::SIG_DFL) };
    }
}

/// Ignores SIGPIPE (signal(7)): a write to a socket whose peer closed
/// then fails with EPIPE instead of ending the process. For the egress
/// bridge, which never execs (so nothing it starts inherits this), and
/// which must outlive any one connection's peer.
pub fn ignore_sigpipe() {
    // SAFETY: installing SIG_IGN for SIGPIPE is always valid.
    unsafe { libc::signal(libc::SIGPIPE, libc::SIG_IGN) };
}

/// sigtimedwait(2): the next signal of `set`, or None on timeout.
pub fn sigtimedwait(set: &SigSet, timeout_ms: Option<u64>) -> io::Result<Option<libc::c_int>> {
    // SAFETY: siginfo_t is plain data.
    let mut info: libc::siginfo_t = unsafe { std::mem::zeroed() };
    let ts = timeout_ms.map(|ms| libc::timespec {
        tv_sec: (ms / 1000) as libc::time_t,
        tv_nsec: ((ms % 1000) * 1_000_000) as libc::c_long,
    });
    let ts_ptr = ts
        .as_ref()
        .map_or(std::ptr::null(), |t| t as *const libc::timespec);
    // SAFETY: set, info and (optional) ts are valid for the call.
    let ret = unsafe { libc::sigtimedwait(&set.0, &mut info, ts_ptr) };
    if ret == -1 {
        let err = io::Error::last_os_error();
        return match err.raw_os_error() {
            Some(libc::EAGAIN) | Some(libc::EINTR) => Ok(None),
            _ => Err(err),
        };
    }
    Ok(Some(ret))
}

/// The arguments of one execve(2), with the pointer arrays execve takes
/// built in advance, so that the call after fork allocates nothing.
pub struct ExecArgs {
    argv: Vec<CString>,
    envp: Vec<CString>,
    argv_ptrs: Vec<*const libc::c_char>,
    envp_ptrs: Vec<*const libc::c_char>,
}

impl ExecArgs {
    pub fn new(argv: Vec<CString>, envp: Vec<CString>) -> ExecArgs {
        // The pointers point into the CStrings' heap buffers, which never
        // move or change: the fields are private and never mutated.
        let mut argv_ptrs: Vec<*const libc::c_char> = argv.iter().map(|a| a.as_ptr()).collect();
        argv_ptrs.push(std::ptr::null());
        let mut envp_ptrs: Vec<*const libc::c_char> = envp.iter().map(|e| e.as_ptr()).collect();
        envp_ptrs.push(std::ptr::null());
        ExecArgs {
            argv,
            envp,
            argv_ptrs,
            envp_ptrs,
        }
    }

    pub fn argv(&self) -> &[CString] {
        &self.argv
    }
}

impl std::fmt::Debug for ExecArgs {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ExecArgs")
            .field("argv", &self.argv)
            .field("envp", &self.envp.len())
            .finish()
    }
}

/// execve(2) with prepared arguments. Returns only on failure.
pub fn execve(path: &CStr, args: &ExecArgs) -> io::Error {
    // SAFETY: path is NUL-terminated; argv_ptrs and envp_ptrs are
    // null-terminated arrays of pointers into `args`' CStrings, all alive
    // for the call (see ExecArgs::new).
    unsafe {
        libc::execve(
            path.as_ptr(),
            args.argv_ptrs.as_ptr(),
            args.envp_ptrs.as_ptr(),
        )
    };
    io::Error::last_os_error()
}

/// landlock_create_ruleset(NULL, 0, LANDLOCK_CREATE_RULESET_VERSION): the
/// Landlock ABI version, or an error when Landlock is unavailable.
pub fn landlock_abi_version() -> io::Result<libc::c_long> {
    const LANDLOCK_CREATE_RULESET_VERSION: u32 = 1;
    // SAFETY: a null attr with size 0 and the VERSION flag is the documented
    // way to query the ABI (landlock_create_ruleset(2)).
    check_long(unsafe {
        libc::syscall(
            libc::SYS_landlock_create_ruleset,
            std::ptr::null::<libc::c_void>(),
            0usize,
            LANDLOCK_CREATE_RULESET_VERSION,
        )
    })
}

/// Writes all of `buf` to a raw descriptor, retrying on EINTR. Used to
/// report errors through a pipe from a child process.
pub fn write_all(fd: RawFd, mut buf: &[u8]) -> io::Result<()> {
    while !buf.is_empty() {
        // SAFETY: buf is a valid slice for the given length.
        let n = unsafe { libc::write(fd, buf.as_ptr() as *const libc::c_void, buf.len()) };
        if n < 0 {
            let err = io::Error::last_os_error();
            if err.raw_os_error() == Some(libc::EINTR) {
                continue;
            }
            return Err(err);
        }
        buf = &buf[n as usize..];
    }
    Ok(())
}

/// Reads up to `buf.len()` bytes, retrying on EINTR.
pub fn read(fd: RawFd, buf: &mut [u8]) -> io::Result<usize> {
    loop {
        // SAFETY: buf is a valid, writable slice for the given length.
        let n = unsafe { libc::read(fd, buf.as_mut_ptr() as *mut libc::c_void, buf.len()) };
        if n < 0 {
            let err = io::Error::last_os_error();
            if err.raw_os_error() == Some(libc::EINTR) {
                continue;
            }
            return Err(err);
        }
        return Ok(n as usize);
    }
}

/// close_range(first, ~0, CLOSE_RANGE_CLOEXEC): every descriptor from
/// `first` on closes at the next execve, so nothing of mcpbox leaks into the
/// command while a report pipe stays usable until then (Linux 5.11+).
pub fn cloexec_fds_from(first: u32) -> io::Result<()> {
    const CLOSE_RANGE_CLOEXEC: u32 = 1 << 2;
    // SAFETY: integer arguments.
    check_long(unsafe {
        libc::syscall(libc::SYS_close_range, first, u32::MAX, CLOSE_RANGE_CLOEXEC)
    })
    .map(drop)
}

/// access(path, W_OK) for the real uid.
pub fn access_w(path: &CStr) -> bool {
    // SAFETY: valid NUL-terminated path.
    unsafe { libc::access(path.as_ptr(), libc::W_OK) == 0 }
}

/// signalfd(2) for `set` (which the caller has blocked), close-on-exec.
pub fn signalfd(set: &SigSet) -> io::Result<OwnedFd> {
    // SAFETY: set is a valid sigset_t; -1 asks for a new descriptor.
    let fd = check(unsafe { libc::signalfd(-1, &set.0, libc::SFD_CLOEXEC) })?;
    // SAFETY: the kernel just returned this descriptor and we own it.
    Ok(unsafe { OwnedFd::from_raw_fd(fd) })
}

/// Reads one signal number from a signalfd, if one is pending.
pub fn read_signal(fd: RawFd) -> io::Result<Option<i32>> {
    // SAFETY: signalfd_siginfo is plain data.
    let mut info: libc::signalfd_siginfo = unsafe { std::mem::zeroed() };
    let size = std::mem::size_of::<libc::signalfd_siginfo>();
    // SAFETY: info is a valid, writable buffer of `size` bytes.
    let n = unsafe {
        libc::read(
            fd,
            &mut info as *mut libc::signalfd_siginfo as *mut libc::c_void,
            size,
        )
    };
    if n < 0 {
        let err = io::Error::last_os_error();
        return match err.raw_os_error() {
            Some(libc::EAGAIN) | Some(libc::EINTR) => Ok(None),
            _ => Err(err),
        };
    }
    Ok(if n as usize == size {
        Some(info.ssi_signo as i32)
    } else {
        None
    })
}

/// poll(2) on up to a few descriptors for input; returns which are ready
/// (readable, hung up or in error). `timeout_ms` None waits forever.
pub fn poll_readable(fds: &[RawFd], timeout_ms: Option<u64>) -> io::Result<Vec<bool>> {
    let mut pfds: Vec<libc::pollfd> = fds
        .iter()
        .map(|&fd| libc::pollfd {
            fd,
            events: libc::POLLIN,
            revents: 0,
        })
        .collect();
    let timeout = timeout_ms.map_or(-1, |ms| ms.min(i32::MAX as u64) as libc::c_int);
    loop {
        // SAFETY: pfds is a valid array of pollfd of the given length.
        let n = unsafe { libc::poll(pfds.as_mut_ptr(), pfds.len() as libc::nfds_t, timeout) };
        if n < 0 {
            let err = io::Error::last_os_error();
            if err.raw_os_error() == Some(libc::EINTR) {
                continue;
            }
            return Err(err);
        }
        return Ok(pfds.iter().map(|p| p.revents != 0).collect());
    }
}

/// Whether this process is root of the host: euid 0 in the initial user
/// namespace (whose uid_map is the identity over the whole range). Root of
/// an inner user namespace is an ordinary user of the host.
pub fn is_host_root() -> bool {
    // Read once per process: mcpbox never changes its ids or its user
    // namespace, and procfs costs an open and reads on every sandbox start.
    static HOST_ROOT: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
    *HOST_ROOT.get_or_init(|| {
        geteuid() == 0
            && std::fs::read_to_string("/proc/self/uid_map")
                .map(|m| m.split_whitespace().collect::<Vec<_>>() == ["0", "0", "4294967295"])
                .unwrap_or(false)
    })
}

/// close_range(2) over [first, last]: used where a child that never execs
/// must not hold descriptors (pipe ends) of its parent.
pub fn close_range(first: u32, last: u32) -> io::Result<()> {
    if first > last {
        return Ok(());
    }
    // SAFETY: integer arguments.
    check_long(unsafe { libc::syscall(libc::SYS_close_range, first, last, 0u32) }).map(drop)
}

/// The number of threads of this process, from /proc/self/stat (field 20,
/// proc(5)). Read by the supervisor before its first fork: a sandbox is
/// never forked from a process with more than one thread.
pub fn thread_count() -> io::Result<u64> {
    let stat = std::fs::read_to_string("/proc/self/stat")?;
    // The command name (field 2) may contain spaces and parentheses; the
    // fields after its closing parenthesis start at field 3.
    let after = stat
        .rfind(')')
        .map(|i| &stat[i + 1..])
        .ok_or_else(|| io::Error::other("malformed /proc/self/stat"))?;
    after
        .split_whitespace()
        .nth(20 - 3)
        .and_then(|n| n.parse().ok())
        .ok_or_else(|| io::Error::other("malformed /proc/self/stat"))
}

/// mkdir(2).
pub fn mkdir(path: &CStr, mode: u32) -> io::Result<()> {
    // SAFETY: valid NUL-terminated path.
    check(unsafe { libc::mkdir(path.as_ptr(), mode) }).map(drop)
}

/// umask(2): sets the file mode creation mask, returns the previous one.
pub fn umask(mask: u32) -> u32 {
    // SAFETY: integer argument; umask cannot fail.
    unsafe { libc::umask(mask as libc::mode_t) as u32 }
}

/// chmod(2).
pub fn chmod(path: &CStr, mode: u32) -> io::Result<()> {
    // SAFETY: valid NUL-terminated path.
    check(unsafe { libc::chmod(path.as_ptr(), mode) }).map(drop)
}

/// lstat(2): whether `path` itself (not a symlink's target) is a directory.
pub fn lstat_is_dir(path: &CStr) -> io::Result<bool> {
    // SAFETY: stat is plain data; all-zero is a valid value.
    let mut st: libc::stat = unsafe { std::mem::zeroed() };
    // SAFETY: valid path and a valid stat buffer for the kernel to fill.
    check(unsafe { libc::lstat(path.as_ptr(), &mut st) })?;
    Ok(st.st_mode & libc::S_IFMT == libc::S_IFDIR)
}

/// fstat(2) on a descriptor (an O_PATH one too): whether it is a directory.
pub fn fstat_is_dir(fd: RawFd) -> io::Result<bool> {
    // SAFETY: stat is plain data; all-zero is a valid value.
    let mut st: libc::stat = unsafe { std::mem::zeroed() };
    // SAFETY: a valid stat buffer for the kernel to fill.
    check(unsafe { libc::fstat(fd, &mut st) })?;
    Ok(st.st_mode & libc::S_IFMT == libc::S_IFDIR)
}

fn open(path: &CStr, flags: libc::c_int, mode: libc::mode_t) -> io::Result<OwnedFd> {
    // SAFETY: valid NUL-terminated path; integer flags and mode.
    let fd = check(unsafe { libc::open(path.as_ptr(), flags | libc::O_CLOEXEC, mode) })?;
    // SAFETY: the kernel just returned this descriptor and we own it.
    Ok(unsafe { OwnedFd::from_raw_fd(fd) })
}

/// open(2) with O_PATH: a handle on a path for Landlock rules.
pub fn open_path(path: &CStr) -> io::Result<OwnedFd> {
    open(path, libc::O_PATH, 0)
}

/// open(2) read-write of /dev/null.
pub fn open_devnull() -> io::Result<OwnedFd> {
    open(c"/dev/null", libc::O_RDWR, 0)
}

/// Creates `path` as an empty file unless something is there already (a
/// bind-mount target): O_CREAT without O_TRUNC; a directory is fine too.
pub fn touch(path: &CStr) -> io::Result<()> {
    match open(path, libc::O_WRONLY | libc::O_CREAT | libc::O_NOCTTY, 0o644) {
        Ok(_) => Ok(()),
        Err(e) if e.raw_os_error() == Some(libc::EISDIR) => Ok(()),
        Err(e) => Err(e),
    }
}

/// Writes `contents` to `path`, created or truncated, mode 0644.
pub fn write_file(path: &CStr, contents: &[u8]) -> io::Result<()> {
    let fd = open(
        path,
        libc::O_WRONLY | libc::O_CREAT | libc::O_TRUNC | libc::O_NOCTTY,
        0o644,
    )?;
    write_all(fd.as_raw_fd(), contents)
}

/// symlink(2): `path` -> `target`.
pub fn symlink(target: &CStr, path: &CStr) -> io::Result<()> {
    // SAFETY: two valid NUL-terminated strings.
    check(unsafe { libc::symlink(target.as_ptr(), path.as_ptr()) }).map(drop)
}

/// socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC): the helper's control
/// channel.
pub fn socketpair() -> io::Result<(OwnedFd, OwnedFd)> {
    let mut fds = [0 as libc::c_int; 2];
    // SAFETY: fds is a valid array of two ints for the kernel to fill.
    check(unsafe {
        libc::socketpair(
            libc::AF_UNIX,
            libc::SOCK_STREAM | libc::SOCK_CLOEXEC,
            0,
            fds.as_mut_ptr(),
        )
    })?;
    // SAFETY: the kernel just returned two fresh descriptors that we own.
    Ok(unsafe { (OwnedFd::from_raw_fd(fds[0]), OwnedFd::from_raw_fd(fds[1])) })
}

/// fcntl(F_DUPFD_CLOEXEC): a copy of `fd` numbered `min` or above.
fn dup_above(fd: RawFd, min: RawFd) -> io::Result<OwnedFd> {
    // SAFETY: integer arguments; an invalid fd yields EBADF.
    let new = check(unsafe { libc::fcntl(fd, libc::F_DUPFD_CLOEXEC, min) })?;
    // SAFETY: the kernel just returned this descriptor and we own it.
    Ok(unsafe { OwnedFd::from_raw_fd(new) })
}

/// posix_spawn(3) of `path` with `fds[i]` as descriptor `i` of the child
/// (every other descriptor is close-on-exec) and `mask` as its signal mask.
///
/// This is how a multi-threaded mcpbox starts the sandbox helper: glibc's
/// posix_spawn runs no code of ours in the child (clone(CLONE_VM |
/// CLONE_VFORK), the file actions, the mask, then execve), so it is safe
/// from any thread, unlike fork followed by Rust code.
pub fn spawn(
    path: &CStr,
    args: &ExecArgs,
    fds: &[RawFd],
    mask: &SigSet,
) -> io::Result<libc::pid_t> {
    // Copies above every target first, so that no dup2 of the file actions
    // overwrites a source a later action still needs.
    let high: Vec<OwnedFd> = fds
        .iter()
        .map(|&fd| dup_above(fd, 10))
        .collect::<io::Result<_>>()?;
    // SAFETY: posix_spawn_file_actions_t and posix_spawnattr_t are opaque
    // plain data that the _init calls initialise.
    let mut actions: libc::posix_spawn_file_actions_t = unsafe { std::mem::zeroed() };
    // SAFETY: as above.
    let mut attr: libc::posix_spawnattr_t = unsafe { std::mem::zeroed() };
    // SAFETY: actions is valid storage for the call to initialise.
    let ret = unsafe { libc::posix_spawn_file_actions_init(&mut actions) };
    if ret != 0 {
        return Err(io::Error::from_raw_os_error(ret));
    }
    // SAFETY: attr is valid storage for the call to initialise.
    let ret = unsafe { libc::posix_spawnattr_init(&mut attr) };
    if ret != 0 {
        // SAFETY: actions was initialised above.
        unsafe { libc::posix_spawn_file_actions_destroy(&mut actions) };
        return Err(io::Error::from_raw_os_error(ret));
    }
    let mut ret = 0;
    for (target, src) in high.iter().enumerate() {
        if ret == 0 {
            // SAFETY: actions is initialised; integer descriptors.
            ret = unsafe {
                libc::posix_spawn_file_actions_adddup2(
                    &mut actions,
                    src.as_raw_fd(),
                    target as RawFd,
                )
            };
        }
    }
    if ret == 0 {
        // SAFETY: attr is initialised; mask is a valid sigset_t.
        ret = unsafe { libc::posix_spawnattr_setsigmask(&mut attr, &mask.0) };
    }
    if ret == 0 {
        // SAFETY: attr is initialised.
        ret = unsafe {
            libc::posix_spawnattr_setflags(&mut attr, libc::POSIX_SPAWN_SETSIGMASK as libc::c_short)
        };
    }
    let mut pid: libc::pid_t = 0;
    if ret == 0 {
        // SAFETY: path is NUL-terminated; actions and attr are initialised;
        // argv and envp are null-terminated pointer arrays kept alive by
        // `args` (ExecArgs::new).
        ret = unsafe {
            libc::posix_spawn(
                &mut pid,
                path.as_ptr(),
                &actions,
                &attr,
                args.argv_ptrs.as_ptr() as *const *mut libc::c_char,
                args.envp_ptrs.as_ptr() as *const *mut libc::c_char,
            )
        };
    }
    // SAFETY: both were initialised above and are not used afterwards.
    unsafe {
        libc::posix_spawn_file_actions_destroy(&mut actions);
        libc::posix_spawnattr_destroy(&mut attr);
    }
    drop(high);
    if ret != 0 {
        return Err(io::Error::from_raw_os_error(ret));
    }
    Ok(pid)
}

/// The kernel's `struct landlock_ruleset_attr` (linux/landlock.h).
#[repr(C)]
struct LandlockRulesetAttr {
    handled_access_fs: u64,
    handled_access_net: u64,
    scoped: u64,
}

/// landlock_create_ruleset(2). The attribute size grows with the fields
/// used, so an older kernel accepts a ruleset that handles only files.
pub fn landlock_create_ruleset(fs: u64, net: u64, scoped: u64) -> io::Result<OwnedFd> {
    let attr = LandlockRulesetAttr {
        handled_access_fs: fs,
        handled_access_net: net,
        scoped,
    };
    let size = if scoped != 0 {
        24usize
    } else if net != 0 {
        16
    } else {
        8
    };
    // SAFETY: attr is a valid struct of at least `size` bytes that the
    // kernel only reads.
    let fd = check_long(unsafe {
        libc::syscall(
            libc::SYS_landlock_create_ruleset,
            &attr as *const LandlockRulesetAttr,
            size,
            0u32,
        )
    })?;
    // SAFETY: the kernel just returned this descriptor (close-on-exec, as
    // every Landlock ruleset fd) and we own it.
    Ok(unsafe { OwnedFd::from_raw_fd(fd as RawFd) })
}

/// The kernel's `struct landlock_path_beneath_attr`, packed as it is there.
#[repr(C, packed)]
struct LandlockPathBeneathAttr {
    allowed_access: u64,
    parent_fd: i32,
}

/// landlock_add_rule(2) with LANDLOCK_RULE_PATH_BENEATH.
pub fn landlock_add_path_rule(ruleset: RawFd, parent: RawFd, access: u64) -> io::Result<()> {
    const LANDLOCK_RULE_PATH_BENEATH: libc::c_int = 1;
    let attr = LandlockPathBeneathAttr {
        allowed_access: access,
        parent_fd: parent,
    };
    // SAFETY: attr is a valid packed struct the kernel only reads.
    check_long(unsafe {
        libc::syscall(
            libc::SYS_landlock_add_rule,
            ruleset,
            LANDLOCK_RULE_PATH_BENEATH,
            &attr as *const LandlockPathBeneathAttr,
            0u32,
        )
    })
    .map(drop)
}

/// landlock_restrict_self(2): the calling thread (the whole process: the
/// callers are single-threaded) is restricted by the ruleset from now on.
pub fn landlock_restrict_self(ruleset: RawFd) -> io::Result<()> {
    // SAFETY: integer arguments.
    check_long(unsafe { libc::syscall(libc::SYS_landlock_restrict_self, ruleset, 0u32) }).map(drop)
}

/// Takes ownership of a descriptor this process was started with (the
/// helper's control socket, descriptor 3, placed by [`spawn`]). Fails
/// unless it is open.
pub fn adopt_inherited_fd(fd: RawFd) -> io::Result<OwnedFd> {
    // SAFETY: F_GETFD only inspects the descriptor.
    check(unsafe { libc::fcntl(fd, libc::F_GETFD) })?;
    // SAFETY: the descriptor is open (checked above) and nothing else in
    // this freshly exec'd process owns it: it was placed for us by our
    // parent's posix_spawn, and is adopted once, at the helper's start.
    Ok(unsafe { OwnedFd::from_raw_fd(fd) })
}

/// prctl(PR_SET_NAME): the name ps and /proc/PID/comm show.
pub fn set_name(name: &CStr) -> io::Result<()> {
    // SAFETY: a NUL-terminated string the kernel copies (up to 16 bytes).
    check(unsafe { libc::prctl(libc::PR_SET_NAME, name.as_ptr() as libc::c_ulong, 0, 0, 0) })
        .map(drop)
}

/// fanotify_init(2) for a notification-only group that is given a
/// descriptor of each event's file: close-on-exec and non-blocking, the
/// event descriptors read-only, close-on-exec and non-blocking (so the
/// kernel's open of a FIFO never waits for a writer). Needs CAP_SYS_ADMIN.
pub fn fanotify_init_notify() -> io::Result<OwnedFd> {
    let event_flags = libc::O_RDONLY | libc::O_LARGEFILE | libc::O_CLOEXEC | libc::O_NONBLOCK;
    // SAFETY: two flag words; returns a new descriptor or -1.
    let fd = check(unsafe {
        libc::fanotify_init(
            libc::FAN_CLASS_NOTIF | libc::FAN_CLOEXEC | libc::FAN_NONBLOCK,
            event_flags as libc::c_uint,
        )
    })?;
    // SAFETY: a descriptor we just got and own alone.
    Ok(unsafe { OwnedFd::from_raw_fd(fd) })
}

/// fanotify_mark(FAN_MARK_ADD | FAN_MARK_MOUNT, mask) on the mount `path`
/// is on, resolved from the current directory.
pub fn fanotify_mark_mount(group: BorrowedFd<'_>, mask: u64, path: &CStr) -> io::Result<()> {
    // SAFETY: a valid descriptor and a NUL-terminated path that lives
    // across the call.
    check(unsafe {
        libc::fanotify_mark(
            group.as_raw_fd(),
            libc::FAN_MARK_ADD | libc::FAN_MARK_MOUNT,
            mask,
            libc::AT_FDCWD,
            path.as_ptr(),
        )
    })
    .map(drop)
}

/// One fanotify event: its mask, and the descriptor of its file (none for
/// a queue overflow).
pub struct FanEvent {
    pub mask: u64,
    pub file: Option<OwnedFd>,
}

/// Reads the queued events of a non-blocking fanotify group into `out`;
/// `Ok(false)` when none were queued (EAGAIN). Each event's descriptor is
/// owned as soon as it is parsed, so none leaks whatever the caller does.
pub fn fanotify_read(group: BorrowedFd<'_>, out: &mut Vec<FanEvent>) -> io::Result<bool> {
    // struct fanotify_event_metadata: event_len u32, vers u8, reserved u8,
    // metadata_len u16, mask u64, fd i32, pid i32 (native endian)
    const HEAD: usize = 24;
    let mut buf = [0u8; 16 * 1024];
    let n = match read(group.as_raw_fd(), &mut buf) {
        Ok(n) => n,
        Err(e) if e.raw_os_error() == Some(libc::EAGAIN) => return Ok(false),
        Err(e) => return Err(e),
    };
    let mut at = 0usize;
    while n - at >= HEAD {
        let ev = &buf[at..n];
        let len = u32::from_ne_bytes([ev[0], ev[1], ev[2], ev[3]]) as usize;
        if ev[4] != libc::FANOTIFY_METADATA_VERSION || len < HEAD || len > ev.len() {
            break;
        }
        let mut mask = [0u8; 8];
        mask.copy_from_slice(&ev[8..16]);
        let fd = i32::from_ne_bytes([ev[16], ev[17], ev[18], ev[19]]);
        let file = (fd >= 0).then(|| {
            // SAFETY: the kernel installed this descriptor for us in this
            // read(2); nothing else refers to it.
            unsafe { OwnedFd::from_raw_fd(fd) }
        });
        out.push(FanEvent {
            mask: u64::from_ne_bytes(mask),
            file,
        });
        at += len;
    }
    Ok(n > 0)
}

/// fanotify_init(2) for a group that reports, instead of a descriptor,
/// the file handle of the directory an event happened in and the entry's
/// name (FAN_REPORT_DFID_NAME): the only kind that reports directory entry
/// events (create, delete, rename), and the only kind an unprivileged user
/// may make (Linux 5.13+, inode marks only). Close-on-exec, non-blocking.
pub fn fanotify_init_names() -> io::Result<OwnedFd> {
    let event_flags = libc::O_RDONLY | libc::O_LARGEFILE | libc::O_CLOEXEC;
    // SAFETY: two flag words; returns a new descriptor or -1.
    let fd = check(unsafe {
        libc::fanotify_init(
            libc::FAN_CLASS_NOTIF
                | libc::FAN_CLOEXEC
                | libc::FAN_NONBLOCK
                | libc::FAN_REPORT_DFID_NAME,
            event_flags as libc::c_uint,
        )
    })?;
    // SAFETY: a descriptor we just got and own alone.
    Ok(unsafe { OwnedFd::from_raw_fd(fd) })
}

/// fanotify_mark(FAN_MARK_ADD | FAN_MARK_ONLYDIR, mask) on the directory
/// `dir` itself (a NULL path: the object is the descriptor's, so nothing is
/// resolved by name and no link is followed).
pub fn fanotify_mark_dir(group: BorrowedFd<'_>, mask: u64, dir: BorrowedFd<'_>) -> io::Result<()> {
    // SAFETY: two valid descriptors and a NULL path, which fanotify_mark(2)
    // documents as "the object dirfd refers to".
    check(unsafe {
        libc::fanotify_mark(
            group.as_raw_fd(),
            libc::FAN_MARK_ADD | libc::FAN_MARK_ONLYDIR,
            mask,
            dir.as_raw_fd(),
            std::ptr::null(),
        )
    })
    .map(drop)
}

/// The longest file handle (MAX_HANDLE_SZ in linux/exportfs.h).
const MAX_HANDLE: usize = 128;

/// struct file_handle with room for the longest handle.
#[repr(C)]
struct FileHandle {
    handle_bytes: u32,
    handle_type: i32,
    f_handle: [u8; MAX_HANDLE],
}

/// The bytes of `fd`'s file handle, as fanotify reports it in an event's
/// FID record: name_to_handle_at(2) with AT_EMPTY_PATH | AT_HANDLE_FID
/// (Linux 6.5+: the encoding fanotify uses, even where the file system
/// cannot open by handle), or without AT_HANDLE_FID on older kernels, where
/// the two encodings are the same for the file systems that have both.
pub fn file_handle(fd: BorrowedFd<'_>) -> io::Result<Vec<u8>> {
    let attempt = |flags: libc::c_int| {
        let mut h = FileHandle {
            handle_bytes: MAX_HANDLE as u32,
            handle_type: 0,
            f_handle: [0; MAX_HANDLE],
        };
        let mut mount_id: libc::c_int = 0;
        // SAFETY: a valid descriptor, an empty NUL-terminated path, a
        // file_handle whose handle_bytes says how much room follows it, and
        // an int for the mount id; all live across the call.
        check_long(unsafe {
            libc::syscall(
                libc::SYS_name_to_handle_at,
                fd.as_raw_fd(),
                c"".as_ptr(),
                &mut h as *mut FileHandle,
                &mut mount_id as *mut libc::c_int,
                libc::AT_EMPTY_PATH | flags,
            )
        })?;
        let n = (h.handle_bytes as usize).min(MAX_HANDLE);
        Ok::<_, io::Error>(h.f_handle[..n].to_vec())
    };
    match attempt(libc::AT_HANDLE_FID) {
        Err(e) if e.raw_os_error() == Some(libc::EINVAL) => attempt(0),
        other => other,
    }
}

/// The file system id of `fd`'s file system (statfs(2) f_fsid), as
/// fanotify reports it in an event's FID record.
pub fn fsid(fd: BorrowedFd<'_>) -> io::Result<[u8; 8]> {
    // SAFETY: statfs is plain data; all zeroes is a valid value.
    let mut st: libc::statfs = unsafe { std::mem::zeroed() };
    // SAFETY: a valid descriptor and a statfs the kernel fills.
    check(unsafe { libc::fstatfs(fd.as_raw_fd(), &mut st) })?;
    // fsid_t is two ints whose fields libc keeps private: copy its bytes.
    let mut out = [0u8; 8];
    // SAFETY: f_fsid is 8 bytes of plain data, out has room for them, and
    // the two do not overlap.
    unsafe {
        std::ptr::copy_nonoverlapping(
            &st.f_fsid as *const libc::fsid_t as *const u8,
            out.as_mut_ptr(),
            std::mem::size_of::<libc::fsid_t>().min(8),
        )
    };
    Ok(out)
}

/// Opens `rel` beneath the directory `root`, with no link followed at any
/// step and no step out of `root` or onto another mount: openat2(2) with
/// RESOLVE_BENEATH | RESOLVE_NO_SYMLINKS | RESOLVE_NO_MAGICLINKS |
/// RESOLVE_NO_XDEV. `rel` names what a sandboxed server made; it may have
/// swapped any component for a link to the host's files since. A
/// directory is opened read-only; anything else as O_PATH, which opens
/// nothing (a FIFO's waiting writer is not woken, no device is touched)
/// until the caller has seen what it is.
pub fn open_beneath(root: BorrowedFd<'_>, rel: &CStr, directory: bool) -> io::Result<OwnedFd> {
    let flags = if directory {
        libc::O_RDONLY | libc::O_DIRECTORY | libc::O_NOFOLLOW | libc::O_CLOEXEC
    } else {
        libc::O_PATH | libc::O_NOFOLLOW | libc::O_CLOEXEC
    };
    // struct open_how (linux/openat2.h); libc's is non-exhaustive
    #[repr(C)]
    struct OpenHow {
        flags: u64,
        mode: u64,
        resolve: u64,
    }
    let how = OpenHow {
        flags: flags as u64,
        mode: 0,
        resolve: libc::RESOLVE_BENEATH
            | libc::RESOLVE_NO_SYMLINKS
            | libc::RESOLVE_NO_MAGICLINKS
            | libc::RESOLVE_NO_XDEV,
    };
    // SAFETY: a valid descriptor, a NUL-terminated path and an open_how
    // whose size we pass; returns a new descriptor or -1.
    let fd = check_long(unsafe {
        libc::syscall(
            libc::SYS_openat2,
            root.as_raw_fd(),
            rel.as_ptr(),
            &how as *const OpenHow,
            std::mem::size_of::<OpenHow>(),
        )
    })?;
    // SAFETY: a descriptor we just got and own alone.
    Ok(unsafe { OwnedFd::from_raw_fd(fd as RawFd) })
}

/// `LOOP_CTL_GET_FREE`, `LOOP_CONFIGURE` and `LO_FLAGS_AUTOCLEAR`
/// (linux/loop.h; libc does not carry them).
const LOOP_CTL_GET_FREE: libc::c_ulong = 0x4C82;
const LOOP_CONFIGURE: libc::c_ulong = 0x4C0A;
pub const LO_FLAGS_AUTOCLEAR: u32 = 4;

/// The kernel's `struct loop_info64` (linux/loop.h).
#[repr(C)]
struct LoopInfo64 {
    lo_device: u64,
    lo_inode: u64,
    lo_rdevice: u64,
    lo_offset: u64,
    lo_sizelimit: u64,
    lo_number: u32,
    lo_encrypt_type: u32,
    lo_encrypt_key_size: u32,
    lo_flags: u32,
    lo_file_name: [u8; 64],
    lo_crypt_name: [u8; 64],
    lo_encrypt_key: [u8; 32],
    lo_init: [u64; 2],
}

/// The kernel's `struct loop_config` (linux/loop.h, Linux 5.8+).
#[repr(C)]
struct LoopConfig {
    fd: u32,
    block_size: u32,
    info: LoopInfo64,
    reserved: [u64; 8],
}

/// ioctl(LOOP_CTL_GET_FREE) on `/dev/loop-control`: the number of a free
/// loop device (made if there was none).
pub fn loop_ctl_get_free(ctl: BorrowedFd<'_>) -> io::Result<u32> {
    // SAFETY: this request takes no argument and returns the number.
    let n = check(unsafe { libc::ioctl(ctl.as_raw_fd(), LOOP_CTL_GET_FREE as _) })?;
    u32::try_from(n).map_err(|_| io::Error::other("LOOP_CTL_GET_FREE: a negative number"))
}

/// ioctl(LOOP_CONFIGURE) on the loop device `dev`: backs it with the file
/// `backing`, with `flags` (`LO_FLAGS_*`), in one step (no window in which
/// the device is bound but not configured).
pub fn loop_configure(dev: BorrowedFd<'_>, backing: BorrowedFd<'_>, flags: u32) -> io::Result<()> {
    let fd = u32::try_from(backing.as_raw_fd())
        .map_err(|_| io::Error::other("LOOP_CONFIGURE: a negative fd"))?;
    let config = LoopConfig {
        fd,
        block_size: 0,
        info: LoopInfo64 {
            lo_device: 0,
            lo_inode: 0,
            lo_rdevice: 0,
            lo_offset: 0,
            lo_sizelimit: 0,
            lo_number: 0,
            lo_encrypt_type: 0,
            lo_encrypt_key_size: 0,
            lo_flags: flags,
            lo_file_name: [0; 64],
            lo_crypt_name: [0; 64],
            lo_encrypt_key: [0; 32],
            lo_init: [0; 2],
        },
        reserved: [0; 8],
    };
    // SAFETY: `config` is a valid `struct loop_config` that lives across the
    // call; the kernel only reads it.
    check(unsafe {
        libc::ioctl(
            dev.as_raw_fd(),
            LOOP_CONFIGURE as _,
            &config as *const LoopConfig,
        )
    })
    .map(drop)
}

/// fallocate(2) with mode 0: reserves `len` bytes of `fd` from 0 (the
/// blocks are allocated, so later writes into them cannot fail for space).
pub fn fallocate(fd: BorrowedFd<'_>, len: u64) -> io::Result<()> {
    let len = libc::off_t::try_from(len)
        .map_err(|_| io::Error::new(io::ErrorKind::InvalidInput, "size too large"))?;
    // SAFETY: integer arguments on a valid fd.
    check(unsafe { libc::fallocate(fd.as_raw_fd(), 0, 0, len) }).map(drop)
}

#[cfg(test)]
mod tests {
    #[test]
    fn last_cap_counted_by_prctl_is_the_kernels_own() {
        let proc: u32 = std::fs::read_to_string("/proc/sys/kernel/cap_last_cap")
            .expect("cap_last_cap")
            .trim()
            .parse()
            .expect("a number");
        assert_eq!(super::last_cap(), proc);
    }

    /// `clone3_into_namespaces` must put the child in the group its fd
    /// names before the child runs: launch.rs falls back to clone and a
    /// move on any refusal, and ends the same either way, so a broken
    /// clone_args (its layout, its size, the flag) would only show as a
    /// slower start. Here nothing moves the child: it is in the group only
    /// if the kernel put it there.
    #[test]
    #[allow(unsafe_code, clippy::unwrap_used)]
    fn clone3_into_cgroup_puts_the_child_in_the_group_its_fd_names() {
        use crate::cgroup::{Parent, Version};
        use std::os::fd::{AsFd, AsRawFd};
        use std::os::unix::fs::OpenOptionsExt;
        if !super::is_host_root() {
            assert_ne!(
                std::env::var("CI").as_deref(),
                Ok("true"),
                "not root, and CI=true"
            );
            eprintln!("skipped: not root (making a cgroup needs root)");
            return;
        }
        let name = format!("mcpbox-test-clone3-{}", std::process::id());
        let parent = Parent::create(&name, Some(Version::V2)).unwrap();
        let leaf = parent.dirs()[0].join("leaf");
        std::fs::create_dir(&leaf).unwrap();
        let dir = std::fs::File::options()
            .read(true)
            .custom_flags(libc::O_DIRECTORY)
            .open(&leaf)
            .unwrap();
        let (wait_r, wait_w) = super::pipe().unwrap();
        let cloned = super::clone3_into_namespaces(0, dir.as_fd());
        if let Err(e) = &cloned {
            let _ = std::fs::remove_dir(&leaf);
            let _ = parent.remove();
            // a host that refuses clone3 (launch.rs falls back there)
            assert!(
                matches!(e.raw_os_error(), Some(libc::ENOSYS | libc::EPERM)),
                "clone3: {e}"
            );
            eprintln!("skipped: clone3 is refused here ({e})");
            return;
        }
        let child = match cloned.unwrap() {
            super::Fork::Child => {
                // system calls only: wait for the parent to close its
                // end (this copy of it closed first), leave
                let mut b = [0u8; 1];
                // SAFETY: close and a read into a local buffer on valid
                // fds; _exit
                unsafe {
                    libc::close(wait_w.as_raw_fd());
                    libc::read(wait_r.as_raw_fd(), b.as_mut_ptr().cast(), 1);
                    libc::_exit(0)
                }
            }
            super::Fork::Parent(pid) => pid,
        };
        let seen = std::fs::read_to_string(format!("/proc/{child}/cgroup")).unwrap();
        drop(wait_w);
        let mut status = 0;
        // SAFETY: waits for the child cloned above
        assert_eq!(unsafe { libc::waitpid(child, &mut status, 0) }, child);
        let _ = std::fs::remove_dir(&leaf);
        let _ = parent.remove();
        let v2 = seen
            .lines()
            .find_map(|l| l.strip_prefix("0::"))
            .unwrap_or("");
        assert!(
            v2.ends_with(&format!("/{name}/leaf")),
            "the child's v2 group is {v2:?}, not the one its fd named:\n{seen}"
        );
    }
}
