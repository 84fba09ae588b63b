//! The host side of a session that is not a byte stream (the HTTP
//! gateway): [`HostFeed`] takes the host's messages in, [`HostSink`] takes
//! the session's out, [`Attached`] runs it.

use std::sync::mpsc::{self, Receiver};

use super::source::Inbox;
use super::{Driver, HostOut, Input, Relay};
use crate::lines::Line;
use crate::session::Event;
use crate::{Outcome, Result};

/// A session prepared by [`Relay::attach`], not yet running.
pub struct Attached {
    pub(super) relay: Relay,
    pub(super) sink: Box<dyn HostSink>,
    pub(super) inbox: Inbox,
    pub(super) rx: Receiver<Input>,
}

impl std::fmt::Debug for Attached {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Attached").finish_non_exhaustive()
    }
}

impl Attached {
    /// Runs the session until the host closes ([`HostFeed::close`]) or
    /// the server exits, as [`Relay::run`] does. Messages sent through
    /// the feed before this starts wait in its queue.
    pub fn run(self) -> Result<Outcome> {
        let dispatch = self.relay.dispatch.clone();
        let result = Driver::run(
            self.relay,
            None,
            HostOut::Sink(self.sink),
            self.inbox,
            self.rx,
        );
        dispatch.disconnect();
        result
    }
}

/// Takes the messages of a session prepared with [`Relay::attach`] that are
/// for the host, one JSON-RPC message each, in order. Called on the
/// session's own thread: it must not block (hand the message on).
pub trait HostSink: Send {
    /// One message, without a newline. An error means the host is gone:
    /// the session ends as it does when writing to a stdio host fails.
    fn message(&mut self, message: &[u8]) -> std::io::Result<()>;
    /// Called once after the messages of one input were handed over.
    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

/// Why [`HostFeed::send`] did not take a message.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FeedError {
    /// The session's input queue is full: try again shortly.
    Busy,
    /// The session has ended.
    Closed,
}

/// The host's side of a session prepared with [`Relay::attach`]: hands it
/// the host's messages. Cloneable; never blocks.
#[derive(Clone)]
pub struct HostFeed {
    pub(super) inbox: Inbox,
    pub(super) max_line: usize,
}

impl std::fmt::Debug for HostFeed {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("HostFeed").finish_non_exhaustive()
    }
}

impl HostFeed {
    /// Hands one message from the host to the session. A message longer
    /// than the session's `max_line` is refused by the session (-32600),
    /// as an over-long stdio line is.
    pub fn send(&self, message: Vec<u8>) -> std::result::Result<(), FeedError> {
        let line = if message.len() > self.max_line {
            let keep = message.len().min(crate::lines::TOO_LONG_PREFIX);
            Line::TooLong {
                len: message.len(),
                prefix: message[..keep].to_vec(),
            }
        } else {
            Line::Data(message)
        };
        self.push(Input::Event(Event::Host(line)))
    }

    /// Asks the session to park its server (the lifecycle's idle stop):
    /// stopped, session kept, started again by the next host message. A
    /// busy session ignores it.
    pub fn park(&self) -> std::result::Result<(), FeedError> {
        self.push(Input::Event(Event::Park))
    }

    /// Asks the session to start a parked server now.
    pub fn wake(&self) -> std::result::Result<(), FeedError> {
        self.push(Input::Event(Event::Wake))
    }

    /// Tells the session the host has closed (stdin's end of file): the
    /// server is stopped politely and the session ends. Blocks while the
    /// session's input queue is full (call it off an async runtime's
    /// threads); a session that has ended already is fine.
    pub fn close(&self) {
        let _ = self.inbox.send(Input::Event(Event::Host(Line::Eof)));
    }

    fn push(&self, input: Input) -> std::result::Result<(), FeedError> {
        match self.inbox.try_send(input) {
            Ok(()) => Ok(()),
            Err(mpsc::TrySendError::Full(_)) => Err(FeedError::Busy),
            Err(mpsc::TrySendError::Disconnected(_)) => Err(FeedError::Closed),
        }
    }
}
