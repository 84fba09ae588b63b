//! The descriptors the driver reads itself: the host's input and the
//! server's stdout. Waiting for them in the driver's own `poll` (with the
//! [`Inbox`]'s wake-up descriptor) instead of in a reader thread each saves
//! a thread hand-off per message, a futex wake and a context switch, which
//! was most of what the relay added to a round trip (issue 7).
//!
//! No descriptor is made non-blocking: the host's stdin may be a terminal
//! or a pipe end shared with other processes, whose flags are not ours to
//! change. A read happens only when `poll` says the descriptor is ready;
//! the reads that complete a line spanning several of them ask `poll`
//! again with a zero timeout first. Each turn reads at most [`TURN_READS`]
//! chunks, so a server streaming a huge line does not keep the host's
//! messages (a cancellation, say) waiting until it ends.

use std::io::{self, Read};
use std::os::fd::{AsFd, BorrowedFd, OwnedFd};
use std::sync::mpsc::{SyncSender, TrySendError};
use std::sync::Arc;
use std::time::Duration;

use rustix::event::{poll, PollFd, PollFlags};
use rustix::io::Errno;

use super::Input;
use crate::lines::{Line, LineReader};

/// Reads of one source per turn before the driver looks at the others
/// (64 KiB each, see [`crate::lines`]).
const TURN_READS: usize = 16;

/// A descriptor read by the driver, and whether it may have data now.
pub(super) struct Source {
    lines: LineReader<Polled>,
    /// `poll` said it was readable, or a line is still buffered: worth a
    /// look before the driver waits again.
    pending: bool,
    /// Its end of file (or a read error) was handed out.
    done: bool,
}

impl Source {
    /// Lines of at most `max` bytes from `fd`; with `keep`, over-long
    /// lines are compacted ([`LineReader::with_compaction`]).
    pub(super) fn new<F: AsFd + Send + 'static>(fd: F, max: usize, keep: Option<usize>) -> Source {
        let polled = Polled {
            fd: Box::new(fd),
            ready: false,
            reads_left: 0,
        };
        let lines = match keep {
            Some(keep) => LineReader::with_compaction(polled, max, keep),
            None => LineReader::new(polled, max),
        };
        Source {
            lines,
            pending: false,
            done: false,
        }
    }

    pub(super) fn fd(&self) -> BorrowedFd<'_> {
        self.lines.get_ref().fd.as_fd()
    }

    /// Whether the driver should wait for this descriptor.
    pub(super) fn waits(&self) -> bool {
        !self.done && !self.pending
    }

    /// `poll` found the descriptor ready (readable, closed or failed).
    pub(super) fn ready(&mut self) {
        let p = self.lines.get_mut();
        p.ready = true;
        p.reads_left = TURN_READS;
        self.pending = true;
    }

    /// The next whole line if one can be had without blocking; `None` when
    /// the descriptor has nothing more for now (or this turn's reads are
    /// spent). A read error ends the source as its end of file does.
    pub(super) fn next(&mut self, what: &str) -> Option<Line> {
        if self.done || !self.pending {
            return None;
        }
        let line = match self.lines.next_line() {
            Ok(line) => line,
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => {
                self.pending = false;
                return None;
            }
            Err(e) => {
                tracing::warn!("reading {what} failed: {e}");
                Line::Eof
            }
        };
        if matches!(line, Line::Eof) {
            self.done = true;
        }
        Some(line)
    }
}

/// Raw reads of a descriptor, never blocking: the first after `poll` said
/// it was ready, the next ones only if a zero-timeout `poll` says so.
struct Polled {
    fd: Box<dyn AsFd + Send>,
    ready: bool,
    reads_left: usize,
}

impl Read for Polled {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        if self.reads_left == 0 {
            return Err(io::ErrorKind::WouldBlock.into());
        }
        if !self.ready && !readable_now(self.fd.as_fd())? {
            return Err(io::ErrorKind::WouldBlock.into());
        }
        self.ready = false;
        self.reads_left -= 1;
        loop {
            match rustix::io::read(self.fd.as_fd(), &mut *buf) {
                Ok(n) => return Ok(n),
                Err(Errno::INTR) => {}
                // a descriptor someone else made non-blocking
                Err(Errno::AGAIN) => return Err(io::ErrorKind::WouldBlock.into()),
                Err(e) => return Err(e.into()),
            }
        }
    }
}

/// Whether a read of `fd` would not block now (data, end of file or an
/// error to report).
fn readable_now(fd: BorrowedFd<'_>) -> io::Result<bool> {
    let mut fds = [PollFd::new(&fd, PollFlags::IN)];
    loop {
        match poll(&mut fds, Some(&rustix::time::Timespec::default())) {
            Ok(n) => return Ok(n > 0),
            Err(Errno::INTR) => {}
            Err(e) => return Err(e.into()),
        }
    }
}

/// How often the driver looks at its queue when the inbox has no eventfd
/// (it could not be made: out of descriptors).
pub(super) const NO_WAKE_POLL: Duration = Duration::from_millis(5);

/// The driver's queue for what other threads send it (the launcher, the
/// stderr reader, approvals, questions from outside, a [`super::HostFeed`]'s
/// messages), with an eventfd that wakes the driver's `poll` after each.
#[derive(Clone)]
pub(super) struct Inbox {
    tx: SyncSender<Input>,
    wake: Option<Arc<OwnedFd>>,
}

impl Inbox {
    pub(super) fn new(tx: SyncSender<Input>) -> Inbox {
        use rustix::event::{eventfd, EventfdFlags};
        let wake = match eventfd(0, EventfdFlags::CLOEXEC | EventfdFlags::NONBLOCK) {
            Ok(fd) => Some(Arc::new(fd)),
            Err(e) => {
                tracing::warn!("no eventfd for the relay's queue ({e}): it is looked at every {NO_WAKE_POLL:?}");
                None
            }
        };
        Inbox { tx, wake }
    }

    /// Queues `input`, waiting while the queue is full; false once the
    /// driver is gone.
    pub(super) fn send(&self, input: Input) -> bool {
        if self.tx.send(input).is_err() {
            return false;
        }
        self.notify();
        true
    }

    /// Queues `input` unless the queue is full.
    pub(super) fn try_send(&self, input: Input) -> Result<(), TrySendError<Input>> {
        self.tx.try_send(input)?;
        self.notify();
        Ok(())
    }

    /// After the send: the driver resets the counter before it looks at
    /// the queue, so a wake-up is never lost (at worst one is spurious).
    fn notify(&self) {
        if let Some(fd) = &self.wake {
            // NONBLOCK: only a counter at its maximum refuses, and then
            // the driver has a wake-up pending anyway
            let _ = rustix::io::write(fd.as_fd(), &1u64.to_ne_bytes());
        }
    }

    pub(super) fn wake_fd(&self) -> Option<BorrowedFd<'_>> {
        self.wake.as_ref().map(|fd| fd.as_fd())
    }

    /// Resets the wake-up counter (the driver, before it drains the queue).
    pub(super) fn reset(&self) {
        if let Some(fd) = &self.wake {
            let mut buf = [0u8; 8];
            let _ = rustix::io::read(fd.as_fd(), &mut buf);
        }
    }
}
