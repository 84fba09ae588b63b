//! hostile test MCP servers
#![forbid(unsafe_code)]
