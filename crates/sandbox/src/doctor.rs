//! Kernel feature probes for `mcpbox doctor` (filled in below).
