//! The relay's sans-I/O session core (`mcpbox_gateway::session`), fed a
//! sequence of events decoded from the input: host lines and server lines
//! (raw bytes or filled-in message templates, so the fuzzer reaches the
//! approval, pinning and restart states and not only the JSON parser),
//! over-long and compacted lines, server exits and restarts, approval
//! answers, questions from outside and timer ticks with a moving clock.
//!
//! The decoding and the invariants live in
//! `mcpbox_gateway::fuzzing::fuzz_session`, where a unit test also runs
//! them on pseudo-random inputs: no panic; no effect after the session
//! ended (but answers to outside questions); every line to the host is a
//! JSON object; the secret's value never reaches the host, raw or decoded;
//! after every event no deadline is left in the past, and an ended session
//! has none.
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| mcpbox_gateway::fuzzing::fuzz_session(data));
