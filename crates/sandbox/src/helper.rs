//! The sandbox helper: how a multi-threaded process starts sandboxes.
//!
//! `fork` in a process with other threads alive copies only the calling
//! thread; a lock another thread held (the allocator's, stdio's, tracing's)
//! stays locked forever in the child. The sandbox's children must run a
//! few dozen steps before `execve`, so they are forked only from a process
//! that is single-threaded. `mcpbox run` is not (relay threads, proxy
//! threads, the signal thread, and it starts the server again when a
//! secret's TTL runs out, from whichever thread runs the session then).
//!
//! So `run` starts each sandbox through a helper: its own binary,
//! re-executed with [`ARG`] as argv[1] (codex's linux-sandbox does the
//! same). `posix_spawn` starts it, which runs no code of ours between its
//! clone and its execve and so is safe from any thread; the new process is
//! single-threaded by construction, and its `main` dispatches to
//! [`enter_if_requested`] before anything else runs (no logging, no
//! runtime, no thread). It reads the [`Spec`] from its control socket
//! (descriptor 3), runs [`crate::spawn`] as the supervisor, answers with the
//! init's pid or the typed error, then waits for the sandbox and reports
//! how it ended.
//!
//! Why a re-executed helper rather than a zygote forked at the top of
//! `main`: the helper is a fresh image (no copy of mcpbox's heap, secrets
//! or descriptors beyond the four it is given), it needs no fd passing
//! (its stdio is the command's stdio), each sandbox gets its own, and a
//! restart at any time from any thread is just another posix_spawn. A
//! zygote would have to live for the whole session, serialise every
//! request and pass pipes back with SCM_RIGHTS. The re-exec costs about a
//! millisecond per start, which only `run` pays: `mcpbox exec` is
//! single-threaded and supervises in-process.
//!
//! Lifetimes: the helper does not use PR_SET_PDEATHSIG, which fires when
//! the *thread* that spawned it exits (prctl(2)), and `run` may spawn from
//! a short-lived thread. It learns of mcpbox's death from EOF on the
//! control socket (every descriptor of a dead process is closed) and then
//! kills its sandbox. The init has PR_SET_PDEATHSIG on the helper, its
//! single-threaded parent, so the helper's own death (even by SIGKILL)
//! takes the whole sandbox with it.

use std::ffi::{CString, OsStr};
use std::fs::File;
use std::os::fd::{AsRawFd, RawFd};

use crate::launch::{self, Sandbox, Status};
use crate::report::Record;
use crate::{init, lastmile, sys, wire, Error, Result, Spec, Stdio};

/// argv[1] that makes the binary the sandbox helper.
pub const ARG: &str = "__sandbox-helper";

/// The helper's control socket.
const CONTROL: RawFd = 3;

/// Becomes the sandbox helper if this process was started as one (argv[1]
/// is [`ARG`]), and never returns then. A binary that starts sandboxes
/// with [`spawn`] calls this first thing in `main`, before any thread,
/// logging or runtime exists. `bridge` is the egress bridge the sandbox
/// runs when its spec asks for egress.
pub fn enter_if_requested(bridge: crate::BridgeFn) {
    if std::env::args_os().nth(1).as_deref() == Some(OsStr::new(ARG)) {
        helper_main(bridge)
    }
}

fn helper_main(bridge: crate::BridgeFn) -> ! {
    // Descriptors 0, 1 and 2 are the command's stdio, 3 the control
    // socket; nothing else is ours (mcpbox's own are close-on-exec).
    let _ = sys::close_range(4, u32::MAX);
    // Started as /proc/self/exe, whose name the kernel would show ("exe").
    let _ = sys::set_name(c"mcpbox");
    let control = match sys::adopt_inherited_fd(CONTROL) {
        Ok(fd) => File::from(fd),
        Err(_) => sys::exit_now(125),
    };
    let answer =
        |started: &wire::Started| wire::write_frame(&control, &wire::encode_started(started));
    let spec = match wire::read_frame(&control).and_then(|f| wire::decode_spec(&f, bridge)) {
        Ok(spec) => spec,
        Err(e) => {
            let _ = answer(&Err(Error::setup("reading the sandbox spec", e)));
            sys::exit_now(125)
        }
    };
    // Our stdio is the command's: the init passes it on.
    let spec = Spec {
        stdio: Stdio::Inherit,
        ..spec
    };
    let mut sb = match launch::spawn(&spec) {
        Ok(sb) => sb,
        Err(e) => {
            let _ = answer(&Err(e));
            sys::exit_now(125)
        }
    };
    if answer(&Ok((sb.init_pid(), sb.notes.clone()))).is_err() {
        // mcpbox is gone already; dropping the sandbox kills it.
        drop(sb);
        sys::exit_now(125)
    }
    // Only the command may hold its stdio, so that EOF on its stdout means
    // it is gone.
    lastmile::detach_stdio();
    // Anything readable on the control socket is its EOF (mcpbox sends
    // nothing more): mcpbox died, so the sandbox goes too.
    let status = launch::supervise(&mut sb, control.as_raw_fd(), |sb| {
        sb.kill();
        Ok(false)
    });
    let (record, code) = match status {
        Ok(Status::Exited(c)) => (Record::Ended(c), c),
        Ok(Status::TimedOut) => (Record::TimedOut, 124),
        Ok(Status::OutOfMemory(c)) => (Record::OutOfMemory(c), c),
        Err(_) => (Record::Ended(125), 125),
    };
    let _ = record.send(control.as_raw_fd());
    // Removes the cgroup, if any.
    drop(sb);
    sys::exit_now(code)
}

/// Starts a sandbox for `spec` through a new helper process; for callers
/// with threads (`mcpbox run`). The binary must call
/// [`enter_if_requested`] first thing in `main`: the helper is
/// `/proc/self/exe` with [`ARG`]. The returned [`Sandbox`] works as one
/// from [`crate::spawn`]: its pid to signal is the init's, and
/// [`Sandbox::kill`] kills the helper too, which takes the sandbox with it.
pub fn spawn(spec: &Spec) -> Result<Sandbox> {
    let stdio = launch::make_stdio(spec.stdio == Stdio::Piped)?;
    let (ours, theirs) = sys::socketpair().map_err(|e| Error::setup("helper socket", e))?;
    let fds = match &stdio {
        Some([a, b, c]) => [
            a.1.as_raw_fd(),
            b.1.as_raw_fd(),
            c.1.as_raw_fd(),
            theirs.as_raw_fd(),
        ],
        None => [0, 1, 2, theirs.as_raw_fd()],
    };
    // An environment of its own: the spec carries everything the sandbox
    // gets; TMPDIR only decides where the degraded tier's tmp goes.
    let mut envp = Vec::new();
    if let Some(tmp) = std::env::var_os("TMPDIR") {
        let mut kv = b"TMPDIR=".to_vec();
        kv.extend_from_slice(std::os::unix::ffi::OsStrExt::as_bytes(tmp.as_os_str()));
        envp.extend(CString::new(kv).ok());
    }
    let argv = vec![c"mcpbox".to_owned(), CString::new(ARG).unwrap_or_default()];
    let args = sys::ExecArgs::new(argv, envp);
    // The helper starts with the forwarded signals blocked: a terminal's
    // SIGINT to our process group must not kill it before mcpbox has
    // stopped the server in order; mcpbox signals the init itself.
    let pid = sys::spawn(c"/proc/self/exe", &args, &fds, &init::waited())
        .map_err(|e| Error::setup("starting the sandbox helper", e))?;
    drop(theirs);
    let (stdin, stdout, stderr) = launch::parent_stdio(stdio);
    let control = File::from(ours);
    let abandon = |e: Error| {
        let _ = sys::kill(pid, libc::SIGKILL);
        let _ = sys::waitpid(pid, false);
        e
    };
    wire::write_frame(&control, &wire::encode_spec(spec))
        .map_err(|e| abandon(Error::setup("sending the spec to the sandbox helper", e)))?;
    let frame = wire::read_frame(&control)
        .map_err(|e| abandon(Error::setup("the sandbox helper's answer", e)))?;
    match wire::decode_started(&frame)
        .map_err(|e| abandon(Error::setup("the sandbox helper's answer", e)))?
    {
        Ok((init, notes)) => Ok(Sandbox::through_helper(
            pid,
            init,
            (stdin, stdout, stderr),
            control,
            notes,
        )),
        Err(e) => {
            let _ = sys::waitpid(pid, false);
            Err(e)
        }
    }
}
