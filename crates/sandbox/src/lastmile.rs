//! The last mile: what every process we start inside a sandbox does last,
//! the command of the full tier, the command of the degraded tier and the
//! egress bridge alike. One fixed sequence; how the three differ is data
//! ([`LastMile`]), built before forking and unit-tested without root.
//!
//! The order is the argument:
//!
//! 1. signals: nothing blocked, default dispositions (the init and the
//!    supervisor block the signals they wait for; the command must not
//!    inherit that, nor a SIG_IGN of mcpbox's caller).
//! 2. session: its own process group (the init signals the group), or a
//!    new session in the degraded tier (no controlling terminal,
//!    CVE-2017-5226; the session stands in for the init).
//! 3. stdio, working directory, rlimits: while we may still change them.
//! 4. descriptors: everything above stdio closes at execve
//!    (CLOSE_RANGE_CLOEXEC, close_range(2)), so the report pipe stays
//!    usable until then; the bridge, which never execs, closes all but its
//!    listener now.
//! 5. privileges, in the order that makes each possible (capabilities(7)):
//!    the bounding set first (needs CAP_SETPCAP, which we may still have),
//!    ambient, supplementary groups, then setresuid/setresgid, then
//!    capset to empty: an unprivileged caller's uid never was 0, so
//!    setresuid alone would clear nothing ("Effect of user ID changes on
//!    capabilities").
//! 6. no_new_privs: execve can never grant privileges again (setuid bits,
//!    file capabilities), and Landlock and an unprivileged seccomp filter
//!    need it.
//! 7. Landlock: restrict_self with the ruleset built before (landlock.rs).
//! 8. seccomp last: the filter refuses calls (mount, unshare, ...) that the
//!    steps above needed.
//! 9. execve (PATH searched as execvp(3) does), or, for the bridge, its
//!    loop.
//!
//! Everything here is a system call on data prepared before the fork: no
//! allocation, no formatting, no lock.

use std::ffi::CString;
use std::os::fd::RawFd;

use crate::report::{self, ChildStep, Record};
use crate::sys;

/// How the process's session and process group are set.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Session {
    /// setpgid(0, 0): the init signals the command's group.
    OwnGroup,
    /// setsid(): the degraded tier, where there is no init.
    Setsid,
    /// As inherited (the bridge, in the init's session).
    Inherit,
}

/// What happens to descriptors above stdio.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Fds {
    /// Close-on-exec from 3 up: gone at execve, the report pipe usable
    /// until then.
    CloseOnExec,
    /// Closed now, all but the bridge's sockets (the bridge never execs).
    CloseAllButListener,
}

/// How stdio is set.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum StdioSetup {
    /// As inherited (the init already put the pipes in place).
    Keep,
    /// These descriptors become 0, 1 and 2 (the degraded tier's pipes).
    Dup([RawFd; 3]),
    /// /dev/null on 0, 1 and 2 (the bridge holds none of the command's).
    Null,
}

/// The data of one last mile.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LastMile {
    pub session: Session,
    pub stdio: StdioSetup,
    pub chdir: Option<CString>,
    pub rlimits: Vec<(libc::__rlimit_resource_t, u64)>,
    pub fds: Fds,
    /// Highest capability number (read before forking).
    pub last_cap: u32,
    /// Whether a bounding-set failure other than EINVAL is an error: the
    /// degraded tier may have no CAP_SETPCAP to drop with, and then has no
    /// capabilities to drop either.
    pub strict_bounding: bool,
    /// setgroups(0) where it is allowed (a namespace made by root, or the
    /// degraded tier as host root).
    pub clear_groups: bool,
    /// The uid and gid to switch to.
    pub uid: Option<u32>,
    /// Whether a Landlock ruleset is applied (its descriptor is given to
    /// [`run`], since the full tier's is built by the init after forking).
    pub landlock: bool,
}

/// What the process becomes at the end.
pub enum Then<'a> {
    /// execve the first candidate that exists.
    Exec {
        candidates: &'a [CString],
        args: &'a sys::ExecArgs,
    },
    /// Run the egress bridge on `sockets` towards `socket`; exits with its
    /// result.
    Bridge {
        bridge: crate::BridgeFn,
        sockets: crate::BridgeSockets,
        socket: &'a std::path::Path,
    },
}

/// Runs the last mile and becomes the command (or the bridge). A failure is
/// reported on `rep` with its step and ends the process with 125.
pub fn run(
    m: &LastMile,
    ruleset: Option<RawFd>,
    filter: &[libc::sock_filter],
    then: Then<'_>,
    rep: RawFd,
) -> ! {
    // 1. signals
    let _ = sys::unblock_all_signals();
    sys::reset_signal_dispositions();
    // 2. session
    let session = match m.session {
        Session::OwnGroup => sys::setpgid_self(),
        Session::Setsid => sys::setsid(),
        Session::Inherit => Ok(()),
    };
    if let Err(e) = session {
        report::fail(rep, ChildStep::Session, &e);
    }
    // 3. stdio, cwd, rlimits
    match m.stdio {
        StdioSetup::Keep => {}
        StdioSetup::Dup(fds) => {
            for (i, fd) in fds.into_iter().enumerate() {
                if let Err(e) = sys::dup2(fd, i as RawFd) {
                    report::fail(rep, ChildStep::Stdio, &e);
                }
            }
        }
        StdioSetup::Null => detach_stdio(),
    }
    if let Some(dir) = &m.chdir {
        if let Err(e) = sys::chdir(dir) {
            report::fail(rep, ChildStep::Chdir, &e);
        }
    }
    for (resource, value) in &m.rlimits {
        if let Err(e) = sys::setrlimit(*resource, *value) {
            report::fail(rep, ChildStep::Setrlimit, &e);
        }
    }
    // 4. descriptors
    let closed = match m.fds {
        Fds::CloseOnExec => sys::cloexec_fds_from(3),
        Fds::CloseAllButListener => match &then {
            Then::Bridge { sockets, .. } => {
                use std::os::fd::AsRawFd;
                // Close every gap between the kept descriptors, sorted on
                // the stack (no allocation after fork).
                let mut keep = [
                    sockets.proxy.as_raw_fd() as u32,
                    sockets.capture.as_raw_fd() as u32,
                    sockets.dns_udp.as_raw_fd() as u32,
                    sockets.dns_tcp.as_raw_fd() as u32,
                    sockets.nflog.as_raw_fd() as u32,
                ];
                keep.sort_unstable();
                let mut from = 3u32;
                let mut closed = Ok(());
                for fd in keep {
                    if closed.is_ok() && fd >= from {
                        closed = sys::close_range(from, fd.saturating_sub(1));
                        from = fd + 1;
                    }
                }
                closed.and_then(|()| sys::close_range(from, u32::MAX))
            }
            Then::Exec { .. } => Err(std::io::Error::from_raw_os_error(libc::EBADF)),
        },
    };
    if let Err(e) = closed {
        report::fail(rep, ChildStep::CloseFds, &e);
    }
    // 5. privileges
    for cap in 0..=m.last_cap {
        if let Err(e) = sys::prctl(libc::PR_CAPBSET_DROP, cap.into(), 0) {
            if m.strict_bounding && e.raw_os_error() != Some(libc::EINVAL) {
                report::fail(rep, ChildStep::BoundingSet, &e);
            }
        }
    }
    let clear_all = libc::PR_CAP_AMBIENT_CLEAR_ALL as libc::c_ulong;
    if let Err(e) = sys::prctl(libc::PR_CAP_AMBIENT, clear_all, 0) {
        report::fail(rep, ChildStep::Ambient, &e);
    }
    if m.clear_groups {
        if let Err(e) = sys::clear_groups() {
            report::fail(rep, ChildStep::Setgroups, &e);
        }
    }
    if let Some(id) = m.uid {
        if let Err(e) = sys::set_ids(id, id) {
            report::fail(rep, ChildStep::Setresuid, &e);
        }
    }
    if let Err(e) = sys::clear_capabilities() {
        report::fail(rep, ChildStep::Capset, &e);
    }
    // 6. no_new_privs
    if let Err(e) = sys::prctl(libc::PR_SET_NO_NEW_PRIVS, 1, 0) {
        report::fail(rep, ChildStep::NoNewPrivs, &e);
    }
    // 7. Landlock
    if m.landlock {
        let applied = match ruleset {
            Some(fd) => sys::landlock_restrict_self(fd),
            None => Err(std::io::Error::from_raw_os_error(libc::EBADF)),
        };
        if let Err(e) = applied {
            report::fail(rep, ChildStep::Landlock, &e);
        }
    }
    // 8. seccomp, last
    if let Err(e) = sys::seccomp_load(filter) {
        report::fail(rep, ChildStep::Seccomp, &e);
    }
    // 9. become the command, or the bridge
    match then {
        Then::Exec { candidates, args } => exec(candidates, args, rep),
        Then::Bridge {
            bridge,
            sockets,
            socket,
        } => {
            // The bridge is a fork of the single-threaded init: running
            // ordinary Rust (threads, allocation) from here on is sound.
            // The dispositions were reset above; a peer (the proxy, or a
            // program in the sandbox) that closes its end while the bridge
            // still writes must cost that connection an EPIPE, not the
            // bridge its life (every later connection was refused).
            sys::ignore_sigpipe();
            let code = match bridge(sockets, socket) {
                Ok(()) => 0,
                Err(_) => 1,
            };
            sys::exit_now(code)
        }
    }
}

/// execve with execvp(3)'s PATH search over the prepared candidates; on
/// failure reports 127 (not found) or 126 (cannot run). Never returns.
fn exec(candidates: &[CString], args: &sys::ExecArgs, rep: RawFd) -> ! {
    let mut last = libc::ENOENT;
    for candidate in candidates {
        let err = sys::execve(candidate, args);
        let errno = err.raw_os_error().unwrap_or(libc::ENOENT);
        // Keep looking on "not here"; anything else is the answer (execvp(3)),
        // EACCES only if nothing later runs.
        match errno {
            libc::ENOENT | libc::ENOTDIR => {}
            libc::EACCES => last = errno,
            _ => {
                last = errno;
                break;
            }
        }
    }
    let code = if last == libc::ENOENT { 127 } else { 126 };
    let _ = Record::ExecFailed { code, errno: last }.send(rep);
    sys::exit_now(code)
}

/// Points 0, 1 and 2 at /dev/null, so that only the command holds the real
/// stdio (EOF on its stdout then means it and its children are gone).
pub fn detach_stdio() {
    if let Ok(null) = sys::open_devnull() {
        use std::os::fd::AsRawFd;
        for fd in 0..3 {
            let _ = sys::dup2(null.as_raw_fd(), fd);
        }
    }
}
