//! mcpbox policy (placeholder until its issue lands).
#![forbid(unsafe_code)]
