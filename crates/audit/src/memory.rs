//! An in-memory sink for the tests of other crates.

use std::sync::{Mutex, MutexGuard};

use crate::{Event, Sink};

/// Keeps every event in a vector, in order. For tests: it holds everything
/// in memory and persists nothing.
#[derive(Debug, Default)]
pub struct MemorySink {
    events: Mutex<Vec<Event>>,
}

impl MemorySink {
    /// An empty sink.
    pub fn new() -> MemorySink {
        MemorySink::default()
    }

    fn lock(&self) -> MutexGuard<'_, Vec<Event>> {
        // A panic in another test thread must not hide the events recorded so far.
        self.events.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// A copy of every event recorded so far, in order.
    pub fn events(&self) -> Vec<Event> {
        self.lock().clone()
    }

    /// Removes and returns every event recorded so far.
    pub fn take(&self) -> Vec<Event> {
        std::mem::take(&mut *self.lock())
    }

    /// How many events were recorded.
    pub fn len(&self) -> usize {
        self.lock().len()
    }

    /// Whether nothing was recorded.
    pub fn is_empty(&self) -> bool {
        self.lock().is_empty()
    }
}

impl Sink for MemorySink {
    fn record(&self, mut event: Event) {
        if event.time_ms == 0 {
            event.time_ms = crate::now_ms();
        }
        self.lock().push(event);
    }
}
