//! The third-party peers that `scripts/install-peers.sh` installs (pinned)
//! into .local/peers, and policy snippets that make them visible inside a
//! sandbox. `scripts/test` installs them (through
//! `scripts/install-test-deps.sh`) before it runs the tests. A missing peer
//! is a failure, never a skip.

use std::path::{Path, PathBuf};

/// What to run when a peer is missing (the script the README names).
const INSTALL_HINT: &str = "run scripts/install-test-deps.sh (scripts/test runs it)";

/// `.local/peers` at the checkout's root (MCPBOX_PEERS overrides), checked
/// to hold both the npm prefix and the Python venv.
///
/// The path is built lexically, not canonicalized: canonicalizing fails
/// when the directory is missing (a fresh clone) or unreadable (the rootless
/// pass, checkout under /root), and the error used to become an empty path,
/// so the failure named no place at all.
pub fn peers() -> PathBuf {
    let dir = std::env::var_os("MCPBOX_PEERS")
        .map(PathBuf::from)
        .unwrap_or_else(|| checkout_root().join(".local/peers"));
    assert!(
        dir.join("venv/bin/python").exists() && dir.join("npm/bin").exists(),
        "interop peers missing at {}: {INSTALL_HINT}",
        dir.display()
    );
    dir
}

/// The checkout's root: two levels above this package's manifest
/// (`crates/mcpbox`).
fn checkout_root() -> PathBuf {
    let manifest = Path::new(env!("CARGO_MANIFEST_DIR"));
    manifest
        .parent()
        .and_then(Path::parent)
        .unwrap_or(manifest)
        .to_path_buf()
}

/// A peer file or directory under `.local/peers`, which must exist.
pub fn peer(rel: &str) -> PathBuf {
    let p = peers().join(rel);
    assert!(p.exists(), "{} is missing: {INSTALL_HINT}", p.display());
    p
}

/// A `[[filesystem.mounts]]` entry showing host `dir` at the same path
/// inside the sandbox (read-only), so that absolute paths baked into it
/// (a venv's interpreter and scripts, npm's bin links) keep working.
pub fn mount_same_path(dir: &Path) -> String {
    format!(
        "[[filesystem.mounts]]\nhost = \"{0}\"\nat = \"{0}\"\n",
        dir.display()
    )
}
