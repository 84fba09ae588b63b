//! The third-party peers that `scripts/install-peers.sh` installs (pinned)
//! into .local/peers, and policy snippets that make them visible inside a
//! sandbox. A missing peer is a failure, never a skip.

use std::path::{Path, PathBuf};

/// `.local/peers` (MCPBOX_PEERS overrides), checked to hold both the npm
/// prefix and the Python venv.
pub fn peers() -> PathBuf {
    let dir = std::env::var_os("MCPBOX_PEERS")
        .map(PathBuf::from)
        .unwrap_or_else(|| {
            PathBuf::from(env!("CARGO_MANIFEST_DIR"))
                .join("../../.local/peers")
                .canonicalize()
                .unwrap_or_default()
        });
    assert!(
        dir.join("venv/bin/python").exists() && dir.join("npm/bin").exists(),
        "interop peers missing at {}: run scripts/install-peers.sh",
        dir.display()
    );
    dir
}

/// A peer file or directory under `.local/peers`, which must exist.
pub fn peer(rel: &str) -> PathBuf {
    let p = peers().join(rel);
    assert!(
        p.exists(),
        "{} is missing: run scripts/install-peers.sh",
        p.display()
    );
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
