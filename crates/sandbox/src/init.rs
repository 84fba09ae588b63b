//! The sandbox's pid 1: reaps every process, forwards signals to the
//! command's process group, and exits with the command's status.
//!
//! It runs our own code, never the command's: pid 1 of a pid namespace is
//! immune to signals it has no handler for from inside the namespace
//! (pid_namespaces(7)), so a hostile command cannot kill it, and when it
//! exits the kernel kills everything left in the namespace.

use std::os::fd::{AsRawFd, OwnedFd};

use crate::report::Record;
use crate::sys::{self, SigSet, Wait};

/// Signals forwarded from outside to the command's process group.
pub const FORWARDED: &[libc::c_int] = &[
    libc::SIGTERM,
    libc::SIGINT,
    libc::SIGHUP,
    libc::SIGQUIT,
    libc::SIGUSR1,
    libc::SIGUSR2,
    libc::SIGWINCH,
    libc::SIGCONT,
];

/// Every signal the init (and the supervisor) waits for. Built on the
/// stack: the init calls this after fork.
pub fn waited() -> SigSet {
    SigSet::of(FORWARDED).with(libc::SIGCHLD)
}

/// Runs until `command` (pid in this namespace) ends; never returns.
pub fn run(command: libc::pid_t, status: OwnedFd) -> ! {
    let set = waited();
    loop {
        let sig = match sys::sigtimedwait(&set, None) {
            Ok(Some(sig)) => sig,
            Ok(None) => continue,
            Err(_) => sys::exit_now(125),
        };
        if sig != libc::SIGCHLD {
            // Negative pid: the whole process group the command leads.
            let _ = sys::kill(-command, sig);
            continue;
        }
        loop {
            match sys::waitpid(-1, true) {
                Ok(Wait::Exited(pid, code)) if pid == command => finish(code, &status),
                Ok(Wait::Signaled(pid, sig)) if pid == command => finish(128 + sig, &status),
                Ok(Wait::Exited(..)) | Ok(Wait::Signaled(..)) => continue,
                Ok(Wait::None) => break,
                // ECHILD: nothing left at all.
                Err(_) => break,
            }
        }
    }
}

/// The command is gone: kill whatever it left behind, report its status on
/// the status pipe and leave with it. kill(-1) from pid 1 reaches every
/// other process of the namespace. The report comes before the exit: the
/// exit drops the last reference to the mount and network namespaces, and
/// their teardown (synchronize_rcu, the network namespace's cleanup) takes
/// time the supervisor need not wait for.
fn finish(code: i32, status: &OwnedFd) -> ! {
    let _ = sys::kill(-1, libc::SIGKILL);
    while let Ok(Wait::Exited(..) | Wait::Signaled(..)) = sys::waitpid(-1, false) {}
    let _ = Record::Ended(code).send(status.as_raw_fd());
    sys::exit_now(code)
}
