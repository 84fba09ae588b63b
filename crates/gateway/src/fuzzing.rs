//! Fuzzing entry points (for `fuzz/fuzz_targets/*.rs`); not an API.

/// Placeholder, filled below.
pub fn fuzz_session(_data: &[u8]) {}
