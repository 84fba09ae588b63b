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
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};
use std::os::unix::ffi::OsStrExt;
use std::path::Path;

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

/// fork(2). glibc's wrapper runs the atfork handlers, so the allocator is
/// usable in the child. Callers fork only while single-threaded.
pub fn fork() -> io::Result<Fork> {
    // SAFETY: fork has no memory-safety preconditions of its own; the child
    // is a copy of this single-threaded process and continues in Rust code.
    let pid = unsafe { libc::fork() };
    match pid {
        -1 => Err(io::Error::last_os_error()),
        0 => Ok(Fork::Child),
        p => Ok(Fork::Parent(p)),
    }
}

/// _exit(2): leaves without running atexit handlers or flushing stdio
/// buffers that belong to the parent's copy of the process.
pub fn exit_now(code: i32) -> ! {
    // SAFETY: _exit never returns and has no preconditions.
    unsafe { libc::_exit(code) }
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

/// dup2(2).
pub fn dup2(from: RawFd, to: RawFd) -> io::Result<()> {
    // SAFETY: dup2 on integer fds; invalid ones yield EBADF.
    check(unsafe { libc::dup2(from, to) }).map(drop)
}

/// prctl(2) with up to four integer arguments.
pub fn prctl(option: libc::c_int, a2: libc::c_ulong, a3: libc::c_ulong) -> io::Result<libc::c_int> {
    // SAFETY: every prctl option used by this crate takes integer arguments
    // only (PR_SET_PDEATHSIG, PR_SET_NO_NEW_PRIVS, PR_CAPBSET_DROP,
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

/// mount(2).
pub fn mount(
    source: Option<&Path>,
    target: &Path,
    fstype: Option<&str>,
    flags: libc::c_ulong,
    data: Option<&str>,
) -> io::Result<()> {
    let source = source.map(cstr).transpose()?;
    let target = cstr(target)?;
    let fstype = fstype.map(cstr).transpose()?;
    let data = data.map(cstr).transpose()?;
    let ptr = |c: &Option<CString>| c.as_ref().map_or(std::ptr::null(), |c| c.as_ptr());
    // SAFETY: every pointer is either null or a valid NUL-terminated string
    // that outlives the call.
    check(unsafe {
        libc::mount(
            ptr(&source),
            target.as_ptr(),
            ptr(&fstype),
            flags,
            ptr(&data) as *const libc::c_void,
        )
    })
    .map(drop)
}

/// umount2(2).
pub fn umount2(target: &Path, flags: libc::c_int) -> io::Result<()> {
    let target = cstr(target)?;
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

/// mount_setattr(2) with AT_RECURSIVE: sets attributes on a whole mount
/// tree at once, so that a read-only bind cannot leave a writable submount
/// behind (Linux 5.12+).
pub fn mount_setattr_recursive(target: &Path, attr_set: u64) -> io::Result<()> {
    let target = cstr(target)?;
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

/// pivot_root(2), used in its `pivot_root(".", ".")` form.
pub fn pivot_root(new_root: &Path, put_old: &Path) -> io::Result<()> {
    let new_root = cstr(new_root)?;
    let put_old = cstr(put_old)?;
    // SAFETY: two valid NUL-terminated paths.
    check_long(unsafe { libc::syscall(libc::SYS_pivot_root, new_root.as_ptr(), put_old.as_ptr()) })
        .map(drop)
}

/// chdir(2).
pub fn chdir(path: &Path) -> io::Result<()> {
    let path = cstr(path)?;
    // SAFETY: valid NUL-terminated path.
    check(unsafe { libc::chdir(path.as_ptr()) }).map(drop)
}

/// chown(2) / lchown(2) use: ownership of directories the init creates for
/// the command (HOME).
pub fn chown(path: &Path, uid: u32, gid: u32) -> io::Result<()> {
    let path = cstr(path)?;
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

/// The highest capability number this kernel knows.
pub fn last_cap() -> u32 {
    std::fs::read_to_string("/proc/sys/kernel/cap_last_cap")
        .ok()
        .and_then(|s| s.trim().parse().ok())
        .unwrap_or(40)
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
}

/// sigprocmask(SIG_BLOCK / SIG_SETMASK).
pub fn block_signals(set: &SigSet) -> io::Result<()> {
    // SAFETY: set is valid; old set pointer may be null.
    check(unsafe { libc::sigprocmask(libc::SIG_BLOCK, &set.0, std::ptr::null_mut()) }).map(drop)
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

/// execve(2) with an explicit environment. Returns only on failure.
pub fn execve(path: &CStr, argv: &[CString], envp: &[CString]) -> io::Error {
    let mut argv_ptrs: Vec<*const libc::c_char> = argv.iter().map(|a| a.as_ptr()).collect();
    argv_ptrs.push(std::ptr::null());
    let mut env_ptrs: Vec<*const libc::c_char> = envp.iter().map(|e| e.as_ptr()).collect();
    env_ptrs.push(std::ptr::null());
    // SAFETY: path, argv and envp are NUL-terminated strings in
    // null-terminated arrays that live until execve returns (on failure).
    unsafe { libc::execve(path.as_ptr(), argv_ptrs.as_ptr(), env_ptrs.as_ptr()) };
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

/// Whether the other end of a pipe is closed (poll(2) reports POLLHUP).
pub fn poll_hup(fd: RawFd) -> bool {
    let mut pfd = libc::pollfd {
        fd,
        events: libc::POLLIN,
        revents: 0,
    };
    // SAFETY: one valid pollfd, zero timeout.
    let n = unsafe { libc::poll(&mut pfd, 1, 0) };
    n > 0 && (pfd.revents & libc::POLLHUP) != 0
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
    geteuid() == 0
        && std::fs::read_to_string("/proc/self/uid_map")
            .map(|m| m.split_whitespace().collect::<Vec<_>>() == ["0", "0", "4294967295"])
            .unwrap_or(false)
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
