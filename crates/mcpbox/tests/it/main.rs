//! crates/mcpbox's integration tests, one module per former test file, in
//! ONE test binary: each `tests/*.rs` used to be a binary of its own that
//! linked the whole dependency graph again (37 links per build, the
//! largest share of a fresh build's test phase). Run one file's tests with
//! `cargo nextest run -p mcpbox --test it -E 'test(/^serve_wire::/)'`.
//!
//! nextest runs every test in a process of its own, as before; the
//! rootless pass of `scripts/test` runs this binary as one process.
#![allow(clippy::unwrap_used, clippy::expect_used)]

#[path = "../common/mod.rs"]
mod common;

mod approvals;
mod argument_rules;
mod audit_failing;
mod audit_files;
mod audit_shared;
mod builtin_sandbox;
mod cli;
mod console;
mod console_browser;
mod disk_budgets;
mod egress;
mod egress_packages;
mod egress_transparent;
mod exec_attacks;
mod failures;
mod fetch_server;
mod host_commands;
mod interop;
mod isolation;
mod learn;
mod lifecycle;
mod network_approval;
mod pin_review;
mod presets;
mod rmcp_client;
mod root_idmap;
mod run_relay;
mod runtime;
mod secrets_outside;
mod serve_aggregate;
mod serve_approvals;
mod serve_attacks;
mod serve_budgets;
mod serve_clients;
mod serve_conformance;
mod serve_load;
mod serve_remote;
mod serve_wire;
mod single_threaded_fork;
mod state_dir;
mod wrap;
