//! Prometheus-style metrics for `/metrics` (text exposition format 0.0.4):
//! requests by method and status, a latency histogram, live sessions
//! (one sandbox each), and denials (refused HTTP requests, refused tool
//! calls).

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use mcpbox_audit::{Event, Kind, Sink, Verdict};

/// Histogram bucket bounds, in seconds.
const BUCKETS: [f64; 12] = [
    0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 1.0, 5.0, 30.0,
];

/// The gateway's counters.
#[derive(Debug, Default)]
pub struct Metrics {
    requests: Mutex<BTreeMap<(String, u16), u64>>,
    buckets: [AtomicU64; BUCKETS.len()],
    count: AtomicU64,
    sum_micros: AtomicU64,
    refused: Mutex<BTreeMap<&'static str, u64>>,
    tool_denials: AtomicU64,
    sessions_opened: AtomicU64,
    /// Messages for clients dropped past a byte budget, by queue: (count, bytes).
    dropped: Mutex<BTreeMap<&'static str, (u64, u64)>>,
}

impl Metrics {
    /// Counts one answered request.
    pub fn observe(&self, method: &str, status: u16, took: Duration) {
        *self
            .requests
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .entry((method.to_string(), status))
            .or_default() += 1;
        let secs = took.as_secs_f64();
        for (i, b) in BUCKETS.iter().enumerate() {
            if secs <= *b {
                self.buckets[i].fetch_add(1, Ordering::Relaxed);
            }
        }
        self.count.fetch_add(1, Ordering::Relaxed);
        let micros = u64::try_from(took.as_micros()).unwrap_or(u64::MAX);
        self.sum_micros.fetch_add(micros, Ordering::Relaxed);
    }

    /// Counts one request refused for `reason` (a reason code).
    pub fn refused(&self, reason: &'static str) {
        *self
            .refused
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .entry(reason)
            .or_default() += 1;
    }

    /// Counts one message for a client dropped from `queue` past a byte
    /// budget ([`crate::budget`]).
    pub fn dropped(&self, queue: &'static str, bytes: usize) {
        let mut d = self.dropped.lock().unwrap_or_else(|p| p.into_inner());
        let e = d.entry(queue).or_default();
        e.0 += 1;
        e.1 += u64::try_from(bytes).unwrap_or(u64::MAX);
    }

    /// Counts one session opened.
    pub fn session_opened(&self) {
        self.sessions_opened.fetch_add(1, Ordering::Relaxed);
    }

    /// An audit sink that counts refused tool calls, then hands every
    /// event to `inner`.
    pub fn sink(self: &Arc<Self>, inner: Arc<dyn Sink>) -> Arc<dyn Sink> {
        Arc::new(Counting {
            metrics: self.clone(),
            inner,
        })
    }

    /// The exposition text; `sessions` is the number of live sessions,
    /// `buffered` the bytes held for clients now.
    pub fn render(&self, sessions: usize, buffered: usize) -> String {
        let mut out = String::new();
        out.push_str(
            "# HELP mcpbox_http_requests_total HTTP requests answered, by method and status.\n",
        );
        out.push_str("# TYPE mcpbox_http_requests_total counter\n");
        for ((m, s), n) in self
            .requests
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .iter()
        {
            let _ = writeln!(
                out,
                "mcpbox_http_requests_total{{method=\"{m}\",status=\"{s}\"}} {n}"
            );
        }
        out.push_str("# HELP mcpbox_http_request_duration_seconds Time to the response head (a stream's first byte).\n");
        out.push_str("# TYPE mcpbox_http_request_duration_seconds histogram\n");
        for (i, b) in BUCKETS.iter().enumerate() {
            let n = self.buckets[i].load(Ordering::Relaxed);
            let _ = writeln!(
                out,
                "mcpbox_http_request_duration_seconds_bucket{{le=\"{b}\"}} {n}"
            );
        }
        let count = self.count.load(Ordering::Relaxed);
        let _ = writeln!(
            out,
            "mcpbox_http_request_duration_seconds_bucket{{le=\"+Inf\"}} {count}"
        );
        let sum = self.sum_micros.load(Ordering::Relaxed) as f64 / 1e6;
        let _ = writeln!(out, "mcpbox_http_request_duration_seconds_sum {sum}");
        let _ = writeln!(out, "mcpbox_http_request_duration_seconds_count {count}");
        out.push_str("# HELP mcpbox_sessions Live client sessions (one sandbox each).\n");
        out.push_str("# TYPE mcpbox_sessions gauge\n");
        let _ = writeln!(out, "mcpbox_sessions {sessions}");
        out.push_str("# HELP mcpbox_sessions_opened_total Client sessions opened.\n");
        out.push_str("# TYPE mcpbox_sessions_opened_total counter\n");
        let _ = writeln!(
            out,
            "mcpbox_sessions_opened_total {}",
            self.sessions_opened.load(Ordering::Relaxed)
        );
        out.push_str("# HELP mcpbox_buffered_bytes Bytes held for clients (every session's queues), against limits.max_buffered_total.\n");
        out.push_str("# TYPE mcpbox_buffered_bytes gauge\n");
        let _ = writeln!(out, "mcpbox_buffered_bytes {buffered}");
        out.push_str("# HELP mcpbox_dropped_messages_total Messages for clients dropped past a byte budget, by queue.\n");
        out.push_str("# TYPE mcpbox_dropped_messages_total counter\n");
        let dropped = self
            .dropped
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .clone();
        for (q, (n, _)) in &dropped {
            let _ = writeln!(out, "mcpbox_dropped_messages_total{{queue=\"{q}\"}} {n}");
        }
        out.push_str("# HELP mcpbox_dropped_bytes_total Bytes of the messages dropped past a byte budget, by queue.\n");
        out.push_str("# TYPE mcpbox_dropped_bytes_total counter\n");
        for (q, (_, b)) in &dropped {
            let _ = writeln!(out, "mcpbox_dropped_bytes_total{{queue=\"{q}\"}} {b}");
        }
        out.push_str(
            "# HELP mcpbox_denials_total Refusals: HTTP requests (by reason) and tool calls.\n",
        );
        out.push_str("# TYPE mcpbox_denials_total counter\n");
        for (r, n) in self
            .refused
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .iter()
        {
            let _ = writeln!(
                out,
                "mcpbox_denials_total{{kind=\"http\",reason=\"{r}\"}} {n}"
            );
        }
        let _ = writeln!(
            out,
            "mcpbox_denials_total{{kind=\"tool_call\"}} {}",
            self.tool_denials.load(Ordering::Relaxed)
        );
        out
    }
}

struct Counting {
    metrics: Arc<Metrics>,
    inner: Arc<dyn Sink>,
}

impl Sink for Counting {
    fn record(&self, event: Event) {
        if event.kind == Some(Kind::ToolCall) && event.decision == Some(Verdict::Deny) {
            self.metrics.tool_denials.fetch_add(1, Ordering::Relaxed);
        }
        self.inner.record(event);
    }

    // The rest as the store behind says: a wrapper that kept the
    // defaults would tell the relay every record is written (`healthy`)
    // and commit a call's start without the store's answer.
    fn record_all(&self, events: Vec<Event>) {
        let denials = events
            .iter()
            .filter(|e| e.kind == Some(Kind::ToolCall) && e.decision == Some(Verdict::Deny))
            .count();
        self.metrics
            .tool_denials
            .fetch_add(denials as u64, Ordering::Relaxed);
        self.inner.record_all(events);
    }

    fn healthy(&self) -> bool {
        self.inner.healthy()
    }

    fn commit(&self, event: Event) -> Result<(), mcpbox_audit::Unwritten> {
        self.inner.commit(event)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_exposition_has_every_family_and_cumulative_buckets() {
        let m = Metrics::default();
        m.observe("POST", 200, Duration::from_micros(700));
        m.observe("POST", 401, Duration::from_millis(3));
        m.refused("http.token_invalid");
        let text = m.render(2, 0);
        assert!(text.contains("mcpbox_http_requests_total{method=\"POST\",status=\"200\"} 1"));
        assert!(text.contains("mcpbox_http_request_duration_seconds_bucket{le=\"0.001\"} 1"));
        assert!(text.contains("mcpbox_http_request_duration_seconds_bucket{le=\"0.005\"} 2"));
        assert!(text.contains("mcpbox_http_request_duration_seconds_count 2"));
        assert!(text.contains("mcpbox_sessions 2"));
        assert!(text.contains("reason=\"http.token_invalid\"} 1"));
    }
}
