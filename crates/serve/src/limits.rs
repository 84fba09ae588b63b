//! Per-client limits: a token bucket for the request rate and counters
//! for requests in flight, sessions and open streams. A slot is a guard:
//! dropping it gives it back, so no path (an error, a client that went
//! away) leaks one.

use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Instant;

use crate::settings::Limits;

/// One client's counters.
#[derive(Debug)]
pub struct ClientLimits {
    bucket: Mutex<Bucket>,
    rate: f64,
    burst: f64,
    in_flight: Counter,
    sessions: Counter,
    streams: Counter,
}

#[derive(Debug)]
struct Bucket {
    tokens: f64,
    at: Instant,
}

/// A count with a cap.
#[derive(Debug)]
pub struct Counter {
    now: AtomicU32,
    cap: u32,
}

/// A taken place in a [`Counter`]; given back on drop.
#[derive(Debug)]
pub struct Slot {
    counter: Arc<ClientLimits>,
    which: Which,
}

#[derive(Debug, Clone, Copy)]
enum Which {
    InFlight,
    Session,
    Stream,
}

impl Counter {
    fn new(cap: u32) -> Counter {
        Counter {
            now: AtomicU32::new(0),
            cap,
        }
    }

    fn take(&self) -> bool {
        self.now
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |n| {
                (n < self.cap).then_some(n + 1)
            })
            .is_ok()
    }

    fn give(&self) {
        self.now.fetch_sub(1, Ordering::AcqRel);
    }

    /// How many are taken.
    pub fn current(&self) -> u32 {
        self.now.load(Ordering::Acquire)
    }
}

impl ClientLimits {
    /// Fresh counters under `limits`.
    pub fn new(limits: &Limits, now: Instant) -> ClientLimits {
        ClientLimits {
            bucket: Mutex::new(Bucket {
                tokens: f64::from(limits.burst),
                at: now,
            }),
            rate: f64::from(limits.rate_per_second),
            burst: f64::from(limits.burst.max(1)),
            in_flight: Counter::new(limits.max_concurrent),
            sessions: Counter::new(limits.max_sessions_per_client),
            streams: Counter::new(limits.max_streams_per_client),
        }
    }

    /// Takes one request's token; `false` when the client is over its rate.
    pub fn admit(&self, now: Instant) -> bool {
        let mut b = self.bucket.lock().unwrap_or_else(|p| p.into_inner());
        let elapsed = now.saturating_duration_since(b.at).as_secs_f64();
        b.tokens = (b.tokens + elapsed * self.rate).min(self.burst);
        b.at = now;
        if b.tokens >= 1.0 {
            b.tokens -= 1.0;
            true
        } else {
            false
        }
    }

    fn counter(&self, which: Which) -> &Counter {
        match which {
            Which::InFlight => &self.in_flight,
            Which::Session => &self.sessions,
            Which::Stream => &self.streams,
        }
    }

    fn slot(self: &Arc<Self>, which: Which) -> Option<Slot> {
        self.counter(which).take().then(|| Slot {
            counter: self.clone(),
            which,
        })
    }

    /// A place for one request in flight.
    pub fn request(self: &Arc<Self>) -> Option<Slot> {
        self.slot(Which::InFlight)
    }

    /// A place for one live session.
    pub fn session(self: &Arc<Self>) -> Option<Slot> {
        self.slot(Which::Session)
    }

    /// A place for one open event stream.
    pub fn stream(self: &Arc<Self>) -> Option<Slot> {
        self.slot(Which::Stream)
    }

    /// Requests in flight now.
    pub fn in_flight(&self) -> u32 {
        self.in_flight.current()
    }
}

impl Drop for Slot {
    fn drop(&mut self) {
        self.counter.counter(self.which).give();
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    fn limits() -> Limits {
        Limits {
            rate_per_second: 10,
            burst: 3,
            max_concurrent: 2,
            ..Limits::default()
        }
    }

    #[test]
    fn a_burst_past_the_bucket_is_refused_and_refills_with_time() {
        let t0 = Instant::now();
        let l = ClientLimits::new(&limits(), t0);
        assert!(l.admit(t0) && l.admit(t0) && l.admit(t0));
        assert!(!l.admit(t0));
        assert!(l.admit(t0 + Duration::from_millis(100)));
        assert!(!l.admit(t0 + Duration::from_millis(100)));
    }

    #[test]
    fn slots_are_capped_and_given_back_on_drop() {
        let l = Arc::new(ClientLimits::new(&limits(), Instant::now()));
        let a = l.request().unwrap();
        let _b = l.request().unwrap();
        assert!(l.request().is_none());
        drop(a);
        assert!(l.request().is_some());
    }
}
