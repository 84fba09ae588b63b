//! Byte budgets for what the gateway holds for its clients.
//!
//! A server can write faster than a client reads, or to a client that
//! never opens its GET stream. Every message the gateway holds for a
//! client (a session's backlog, a GET stream's queue, a request's queue,
//! the SSE chunks waiting for hyper, the aggregate's backlog) is charged,
//! by its length, to two [`Pool`]s: its session's
//! (`limits.max_buffered_per_session`) and the gateway's
//! (`limits.max_buffered_total`). The [`Charge`] travels with the message
//! and gives the bytes back when the message is dropped: written out, or
//! thrown away. So what one session holds is bounded by its own budget,
//! and what all hold together by the gateway's, whoever floods.
//!
//! When a message does not fit, the queue that holds it decides (and
//! docs/serve.md says): a notification is dropped (a backlog drops its
//! oldest first to make room), counted in `/metrics` and audited
//! ([`Budget::dropped`]); a response ends its request with an
//! `http.buffer_full` error, which is mcpbox's own small message and is
//! never refused.

use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::Arc;

use crate::Metrics;

/// Bytes in use against a cap.
#[derive(Debug)]
pub struct Pool {
    used: AtomicUsize,
    cap: usize,
}

impl Pool {
    /// An empty pool of `cap` bytes.
    pub fn new(cap: usize) -> Arc<Pool> {
        Arc::new(Pool {
            used: AtomicUsize::new(0),
            cap,
        })
    }

    fn take(&self, n: usize) -> bool {
        self.used
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |u| {
                u.checked_add(n).filter(|t| *t <= self.cap)
            })
            .is_ok()
    }

    fn give(&self, n: usize) {
        self.used.fetch_sub(n, Ordering::AcqRel);
    }

    /// Bytes charged now.
    pub fn used(&self) -> usize {
        self.used.load(Ordering::Acquire)
    }

    /// Its cap.
    pub fn cap(&self) -> usize {
        self.cap
    }
}

/// Bytes charged to a session and the gateway; given back on drop.
#[derive(Debug, Default)]
pub struct Charge {
    pools: Option<(Arc<Pool>, Arc<Pool>)>,
    bytes: usize,
}

impl Drop for Charge {
    fn drop(&mut self) {
        if let Some((session, gateway)) = self.pools.take() {
            session.give(self.bytes);
            gateway.give(self.bytes);
        }
    }
}

/// A message held for a client, with its charge.
#[derive(Debug)]
pub struct Held {
    /// The message (one line of JSON).
    pub bytes: Vec<u8>,
    charge: Charge,
}

impl Held {
    /// mcpbox's own message (an error that ends a request): small,
    /// bounded by what is in flight, and never refused, so not charged.
    pub fn own(bytes: Vec<u8>) -> Held {
        Held {
            bytes,
            charge: Charge::default(),
        }
    }

    /// The message and its charge, apart (the charge then goes with what
    /// is made of the message).
    pub fn into_parts(self) -> (Vec<u8>, Charge) {
        (self.bytes, self.charge)
    }

    /// Its length.
    pub fn len(&self) -> usize {
        self.bytes.len()
    }

    /// Whether it is empty.
    pub fn is_empty(&self) -> bool {
        self.bytes.is_empty()
    }
}

/// The gateway's budgets: the total, and what each session gets.
#[derive(Debug)]
pub struct Budgets {
    gateway: Arc<Pool>,
    per_session: usize,
    metrics: Arc<Metrics>,
}

/// Says what was dropped (a flood is audited, not each message).
pub type OnDrop = Box<dyn Fn(Dropped) + Send + Sync>;

/// A drop worth an audit record.
#[derive(Debug, Clone, Copy)]
pub struct Dropped {
    /// Which queue dropped it: `backlog`, `stream`, `request`, `response`.
    pub queue: &'static str,
    /// Messages this session dropped so far.
    pub count: u64,
    /// Bytes this session dropped so far.
    pub bytes: u64,
    /// The session's budget.
    pub session_cap: usize,
    /// The gateway's budget.
    pub gateway_cap: usize,
}

impl Budgets {
    /// `total` bytes for the gateway, `per_session` for each session.
    pub fn new(total: usize, per_session: usize, metrics: Arc<Metrics>) -> Budgets {
        Budgets {
            gateway: Pool::new(total),
            per_session,
            metrics,
        }
    }

    /// A fresh session budget; `on_drop` records what it drops.
    pub fn session(&self, on_drop: OnDrop) -> Budget {
        Budget {
            session: Pool::new(self.per_session),
            gateway: self.gateway.clone(),
            report: Arc::new(Report {
                metrics: self.metrics.clone(),
                on_drop,
                count: AtomicU64::new(0),
                bytes: AtomicU64::new(0),
            }),
        }
    }

    /// Bytes held for clients now, all sessions together.
    pub fn used(&self) -> usize {
        self.gateway.used()
    }
}

struct Report {
    metrics: Arc<Metrics>,
    on_drop: OnDrop,
    count: AtomicU64,
    bytes: AtomicU64,
}

impl std::fmt::Debug for Report {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Report").finish_non_exhaustive()
    }
}

/// One session's budget (its pool and the gateway's), shared by every
/// queue of the session.
#[derive(Debug, Clone)]
pub struct Budget {
    session: Arc<Pool>,
    gateway: Arc<Pool>,
    report: Arc<Report>,
}

impl Budget {
    /// Charges `bytes` to the session and the gateway; `Err` gives them
    /// back when either is full.
    pub fn charge(&self, bytes: Vec<u8>) -> Result<Held, Vec<u8>> {
        let n = bytes.len();
        if !self.session.take(n) {
            return Err(bytes);
        }
        if !self.gateway.take(n) {
            self.session.give(n);
            return Err(bytes);
        }
        Ok(Held {
            bytes,
            charge: Charge {
                pools: Some((self.session.clone(), self.gateway.clone())),
                bytes: n,
            },
        })
    }

    /// Counts a message of `bytes` dropped from `queue` (metrics), and
    /// audits the session's 1st, 2nd, 4th, 8th, ... drop: a flood of a
    /// million messages is about twenty records, each with the totals.
    pub fn dropped(&self, queue: &'static str, bytes: usize) {
        self.report.metrics.dropped(queue, bytes);
        let bytes = u64::try_from(bytes).unwrap_or(u64::MAX);
        let total = self.report.bytes.fetch_add(bytes, Ordering::Relaxed) + bytes;
        let count = self.report.count.fetch_add(1, Ordering::Relaxed) + 1;
        tracing::warn!(
            queue,
            count,
            "a message for a client did not fit its byte budget: dropped"
        );
        if count.is_power_of_two() {
            (self.report.on_drop)(Dropped {
                queue,
                count,
                bytes: total,
                session_cap: self.session.cap(),
                gateway_cap: self.gateway.cap(),
            });
        }
    }

    /// Bytes this session holds now.
    pub fn used(&self) -> usize {
        self.session.used()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::Mutex;

    fn budgets(total: usize, per_session: usize) -> Budgets {
        Budgets::new(total, per_session, Arc::new(Metrics::default()))
    }

    #[test]
    fn a_session_cannot_hold_more_than_its_budget_and_gets_it_back_on_drop() {
        let b = budgets(1000, 100);
        let s = b.session(Box::new(|_| {}));
        let a = s.charge(vec![0; 60]).unwrap();
        assert!(s.charge(vec![0; 60]).is_err());
        assert_eq!((s.used(), b.used()), (60, 60));
        drop(a);
        assert_eq!((s.used(), b.used()), (0, 0));
        assert!(s.charge(vec![0; 100]).is_ok());
    }

    #[test]
    fn one_sessions_flood_leaves_the_rest_of_the_gateway_to_the_others() {
        let b = budgets(250, 100);
        let flood = b.session(Box::new(|_| {}));
        let other = b.session(Box::new(|_| {}));
        let mut held = Vec::new();
        while let Ok(h) = flood.charge(vec![0; 10]) {
            held.push(h);
        }
        assert_eq!(flood.used(), 100);
        assert!(other.charge(vec![0; 100]).is_ok());
    }

    #[test]
    fn the_gateway_total_caps_every_session_together_and_refunds_the_session() {
        let b = budgets(150, 100);
        let one = b.session(Box::new(|_| {}));
        let two = b.session(Box::new(|_| {}));
        let _a = one.charge(vec![0; 100]).unwrap();
        assert!(two.charge(vec![0; 60]).is_err());
        // the refused charge was not left on the session
        assert_eq!(two.used(), 0);
        assert!(two.charge(vec![0; 50]).is_ok());
    }

    #[test]
    fn drops_are_counted_every_time_and_audited_at_powers_of_two() {
        let b = budgets(1000, 100);
        let seen = Arc::new(Mutex::new(Vec::new()));
        let sink = seen.clone();
        let s = b.session(Box::new(move |d| sink.lock().unwrap().push(d.count)));
        for _ in 0..20 {
            s.dropped("backlog", 10);
        }
        assert_eq!(*seen.lock().unwrap(), vec![1, 2, 4, 8, 16]);
        assert!(b
            .metrics
            .render(0, 0)
            .contains("mcpbox_dropped_messages_total{queue=\"backlog\"} 20"));
    }
}
