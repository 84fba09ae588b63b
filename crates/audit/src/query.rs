//! Filters for reading the audit log back.

use crate::{Kind, Verdict};

/// Filters for [`crate::SqliteStore::query`]. Every field that is set must
/// match; an empty query returns everything.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Query {
    /// Only events of this server (exact match).
    pub server: Option<String>,
    /// Only events of this tool (exact match).
    pub tool: Option<String>,
    /// Only events with this decision.
    pub decision: Option<Verdict>,
    /// Only events of this kind.
    pub kind: Option<Kind>,
    /// Only events at or after this Unix time in milliseconds.
    pub since_ms: Option<i64>,
    /// Only events strictly before this Unix time in milliseconds.
    pub until_ms: Option<i64>,
    /// At most this many events: the newest ones that match, still returned
    /// oldest first.
    pub limit: Option<usize>,
}
