//! The in-memory fallback both file stores use when a write fails.
//!
//! `Sink::record` cannot return an error and must not panic, so a failed
//! write keeps the event here, in order, and the next successful write flushes
//! it first. The queue is bounded: past [`PENDING_CAPACITY`] the oldest events
//! are dropped and counted, and the count is logged. A process that dies with
//! events still queued loses them; that is the price of never blocking or
//! panicking the relay on a broken disk.

use std::collections::VecDeque;

use crate::Event;

/// How many failed events are kept in memory before the oldest are dropped.
pub(crate) const PENDING_CAPACITY: usize = 4096;

#[derive(Debug, Default)]
pub(crate) struct Pending {
    queue: VecDeque<Event>,
    dropped: u64,
}

impl Pending {
    pub(crate) fn push(&mut self, event: Event) {
        if self.queue.len() >= PENDING_CAPACITY {
            self.queue.pop_front();
            self.dropped += 1;
            tracing::error!(
                dropped = self.dropped,
                "audit fallback queue full: oldest unwritten audit event dropped"
            );
        }
        self.queue.push_back(event);
    }

    pub(crate) fn front(&self) -> Option<&Event> {
        self.queue.front()
    }

    pub(crate) fn pop_front(&mut self) -> Option<Event> {
        self.queue.pop_front()
    }

    pub(crate) fn len(&self) -> usize {
        self.queue.len()
    }

    pub(crate) fn dropped(&self) -> u64 {
        self.dropped
    }
}

/// Writes the queued events, then `event`, with `write`; whatever fails stays
/// queued (in order) and is logged. Used by both file stores.
pub(crate) fn write_through<E: std::fmt::Display>(
    pending: &mut Pending,
    event: Event,
    store: &str,
    mut write: impl FnMut(&Event) -> Result<(), E>,
) {
    while let Some(front) = pending.front() {
        match write(front) {
            Ok(()) => {
                pending.pop_front();
            }
            Err(e) => return keep(pending, event, store, &e),
        }
    }
    if let Err(e) = write(&event) {
        keep(pending, event, store, &e);
    }
}

/// Keeps `event`, which `store` could not write, behind what is queued, and
/// says so.
pub(crate) fn keep(
    pending: &mut Pending,
    event: Event,
    store: &str,
    error: &dyn std::fmt::Display,
) {
    tracing::error!(
        store,
        error = %error,
        queued = pending.len() + 1,
        "audit write failed: event kept in memory until the next write succeeds"
    );
    pending.push(event);
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    fn ev(n: i64) -> Event {
        Event {
            time_ms: n,
            ..Event::default()
        }
    }

    #[test]
    fn full_queue_drops_the_oldest_and_counts_it() {
        let mut p = Pending::default();
        for n in 0..=i64::try_from(PENDING_CAPACITY).unwrap() {
            p.push(ev(n));
        }
        assert_eq!(p.len(), PENDING_CAPACITY);
        assert_eq!(p.dropped(), 1);
        assert_eq!(p.front().unwrap().time_ms, 1);
    }

    #[test]
    fn failing_writer_keeps_order_and_recovers() {
        let mut p = Pending::default();
        let mut written = Vec::new();
        let mut fail = true;
        for n in 0..3 {
            write_through(&mut p, ev(n), "test", |e| {
                if fail {
                    Err("disk full")
                } else {
                    written.push(e.time_ms);
                    Ok(())
                }
            });
        }
        assert_eq!(p.len(), 3);
        fail = false;
        write_through(&mut p, ev(3), "test", |e| {
            if fail {
                Err("disk full")
            } else {
                written.push(e.time_ms);
                Ok(())
            }
        });
        assert_eq!(written, [0, 1, 2, 3]);
        assert_eq!(p.len(), 0);
    }
}
