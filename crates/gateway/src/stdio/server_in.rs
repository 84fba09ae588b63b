//! The server's stdin: the driver writes to the non-blocking pipe end itself
//! while nothing is queued, and hands what the pipe would not take to a
//! writer thread that waits for room, so lines arrive in order and the
//! driver never blocks on a server that stopped reading.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::mpsc::{self, Sender};
use std::sync::Arc;

use super::spawn_named;
use crate::launcher::ServerStdin;
use crate::Result;

/// The driver's side of the server's stdin: the non-blocking pipe end and
/// the writer thread's queue. Dropping it closes the server's stdin once
/// the writer wrote what it holds.
pub(super) struct ServerIn {
    fd: Arc<dyn ServerStdin>,
    /// `O_NONBLOCK` is set, so the driver may write itself.
    direct: bool,
    queue: Sender<Vec<u8>>,
    /// Lines handed to the writer and not yet written in full. Only the
    /// driver adds; the writer subtracts after its write (`Release`), so a
    /// zero read with `Acquire` means every queued byte is in the pipe and
    /// a direct write lands after them.
    queued: Arc<AtomicUsize>,
    /// The bytes of those lines: what a server that stopped reading makes
    /// mcpbox hold for it, at most [`SERVER_IN_BUDGET`].
    queued_bytes: Arc<AtomicUsize>,
}

/// The most bytes held for a server that does not read its input (issue
/// 25: every buffer has a budget in bytes). Past it the server is taken for
/// hung: its input is closed and it is stopped, and the session answers
/// what it owed as for a server that exited.
pub(super) const SERVER_IN_BUDGET: usize = 16 << 20;

/// What became of a line for the server.
#[derive(Debug, PartialEq, Eq)]
pub(super) enum Sent {
    /// Written, or queued behind what is being written.
    Ok,
    /// The server's stdin is gone.
    Gone,
    /// The server has left [`SERVER_IN_BUDGET`] bytes unread: not queued.
    OverBudget,
}

impl ServerIn {
    /// Takes over the server's stdin and starts its writer thread.
    pub(super) fn start(stdin: Box<dyn ServerStdin>) -> Result<ServerIn> {
        // ours alone (the server holds the read end): its flags are ours
        // to change; the writer thread holds the last reference when it
        // still has lines to write after the driver closed its stdin
        let fd: Arc<dyn ServerStdin> = Arc::from(stdin);
        let direct = set_nonblocking(&*fd);
        let queued = Arc::new(AtomicUsize::new(0));
        let queued_bytes = Arc::new(AtomicUsize::new(0));
        let (queue, rx) = mpsc::channel::<Vec<u8>>();
        let (wfd, wqueued, wbytes) = (fd.clone(), queued.clone(), queued_bytes.clone());
        spawn_named("mcpbox-server-in", move || {
            for msg in rx {
                let ok = write_waiting(&*wfd, &msg);
                wbytes.fetch_sub(msg.len(), Ordering::Relaxed);
                wqueued.fetch_sub(1, Ordering::Release);
                if !ok {
                    return;
                }
            }
        })?;
        Ok(ServerIn {
            fd,
            direct,
            queue,
            queued,
            queued_bytes,
        })
    }

    /// Writes `line` without ever blocking: directly while nothing is
    /// queued, the rest through the writer, within [`SERVER_IN_BUDGET`].
    pub(super) fn send(&mut self, mut line: Vec<u8>) -> Sent {
        if self.direct && self.queued.load(Ordering::Acquire) == 0 {
            match write_ready(&*self.fd, &line) {
                Ok(n) if n == line.len() => return Sent::Ok,
                Ok(n) => {
                    line.drain(..n);
                }
                Err(_) => return Sent::Gone,
            }
        }
        let held = self.queued_bytes.load(Ordering::Relaxed);
        if held.saturating_add(line.len()) > SERVER_IN_BUDGET {
            return Sent::OverBudget;
        }
        self.queued_bytes.fetch_add(line.len(), Ordering::Relaxed);
        self.queued.fetch_add(1, Ordering::Relaxed);
        if self.queue.send(line).is_ok() {
            Sent::Ok
        } else {
            Sent::Gone
        }
    }
}

/// Sets `O_NONBLOCK` on our pipe end; false (everything then goes through
/// the writer, which may block) if the descriptor refuses it.
fn set_nonblocking(fd: &dyn ServerStdin) -> bool {
    use rustix::fs::{fcntl_getfl, fcntl_setfl, OFlags};
    match fcntl_getfl(fd.as_fd()).and_then(|f| fcntl_setfl(fd.as_fd(), f | OFlags::NONBLOCK)) {
        Ok(()) => true,
        Err(e) => {
            tracing::debug!("server stdin stays blocking, every line goes through its writer: {e}");
            false
        }
    }
}

/// Writes as much of `buf` as the pipe takes now; the count written.
fn write_ready(fd: &dyn ServerStdin, buf: &[u8]) -> std::result::Result<usize, rustix::io::Errno> {
    use rustix::io::Errno;
    let mut done = 0;
    while done < buf.len() {
        match rustix::io::write(fd.as_fd(), &buf[done..]) {
            Ok(0) => return Err(Errno::PIPE),
            Ok(n) => done += n,
            Err(Errno::INTR) => {}
            Err(Errno::AGAIN) => break,
            Err(e) => return Err(e),
        }
    }
    Ok(done)
}

/// The writer thread's write: all of `buf`, waiting for room with `poll`
/// when the pipe is full. False on an error (the server closed its stdin).
fn write_waiting(fd: &dyn ServerStdin, mut buf: &[u8]) -> bool {
    use rustix::event::{poll, PollFd, PollFlags};
    use rustix::io::Errno;
    while !buf.is_empty() {
        match write_ready(fd, buf) {
            Ok(n) => buf = &buf[n..],
            Err(_) => return false,
        }
        if !buf.is_empty() {
            let pipe = fd.as_fd();
            let mut fds = [PollFd::new(&pipe, PollFlags::OUT)];
            // POLLERR/POLLHUP: the next write reports the error
            match poll(&mut fds, None) {
                Ok(_) | Err(Errno::INTR) => {}
                Err(_) => return false,
            }
        }
    }
    true
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    /// A server that never reads its input: what mcpbox holds for it stops
    /// at the budget (plus what the pipe itself took), and the line that
    /// would pass it is refused, not queued.
    #[test]
    fn a_server_that_never_reads_its_input_is_held_no_more_than_the_budget() {
        let (_read_end, write_end) = std::io::pipe().unwrap();
        let mut input = ServerIn::start(Box::new(write_end)).unwrap();
        let line = vec![b'x'; 1 << 20];
        let mut sent = 0usize;
        let outcome = loop {
            match input.send(line.clone()) {
                Sent::Ok => sent += line.len(),
                other => break other,
            }
            assert!(
                sent <= 2 * SERVER_IN_BUDGET,
                "no budget: {sent} bytes taken"
            );
        };
        assert_eq!(outcome, Sent::OverBudget);
        assert!(input.queued_bytes.load(Ordering::Relaxed) <= SERVER_IN_BUDGET);
    }
}
