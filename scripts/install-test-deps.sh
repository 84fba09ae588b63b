#!/usr/bin/env bash
# Installs what the test suite needs, pinned and idempotent. Needs root for
# the Debian packages (skipped with SKIP_APT=1).
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
# chromium: the web console's browser tests (tests/console_browser.rs), driven
# by Playwright from the peers' venv (install-peers.sh), and the playwright
# preset's test (tests/presets.rs, @playwright/mcp from install-peers.sh),
# neither of which can download a browser of its own here.
# e2fsprogs, fuse2fs and fuse: the workspace volumes of serve and run
# --builtin (mkfs.ext4 and e2fsck; rootless, fuse2fs mounts them through
# the setuid fusermount: tests/it/disk_budgets.rs runs in the rootless pass;
# fuse3's fusermount does as well, and installing fuse would remove it).
APT_PKGS=(python3 python3-venv nodejs util-linux passwd iproute2 g++ chromium e2fsprogs fuse2fs)
if ! command -v fusermount >/dev/null && ! command -v fusermount3 >/dev/null; then
  APT_PKGS+=(fuse)
fi
if [ "${SKIP_APT:-0}" != 1 ] && [ "$(id -u)" -eq 0 ]; then
  missing=()
  for p in "${APT_PKGS[@]}"; do
    dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
  done
  # runsc: the gVisor tier's tests (tests/it/isolation.rs), pinned to
  # Debian 12's build (the tier is documented against it: docs/isolation.md)
  RUNSC_VERSION=0.0~20221219.0-2+b3
  [ "$(dpkg-query -W -f='${Version}' runsc 2>/dev/null)" = "$RUNSC_VERSION" ] || missing+=("runsc=$RUNSC_VERSION")
  if [ ${#missing[@]} -gt 0 ]; then
    # bounded downloads: a mirror that stops answering fails the install
    # within minutes instead of holding it (apt.conf(5), Acquire::Retries)
    net_opts=(-o Acquire::Retries=3 -o Acquire::http::Timeout=60 -o Acquire::https::Timeout=60)
    apt-get "${net_opts[@]}" update -qq
    DEBIAN_FRONTEND=noninteractive apt-get "${net_opts[@]}" install -y -qq "${missing[@]}"
  fi
fi
export PATH="${CARGO_HOME:-$HOME/.cargo}/bin:$PATH"
# cargo's own bounds on a registry that stops answering (its defaults are
# 30 s without progress and 3 retries; set here so they cannot be loosened
# by a user's config unseen)
export CARGO_HTTP_TIMEOUT=60 CARGO_NET_RETRY=3
# cargo subcommands, pinned; installed when absent or at another version.
NEXTEST_VERSION=0.9.143
FUZZ_VERSION=0.13.2
MACHETE_VERSION=0.9.2
DENY_VERSION=0.20.2
if ! cargo nextest --version >/dev/null 2>&1; then
  cargo install --locked "cargo-nextest@$NEXTEST_VERSION"
fi
# cargo-fuzz builds and runs fuzz/ (scripts/test; fuzz/README.md). It needs
# a C++ compiler for libFuzzer (g++, from build-essential on this machine).
if [ "$(cargo fuzz --version 2>/dev/null)" != "cargo-fuzz $FUZZ_VERSION" ]; then
  cargo install --locked "cargo-fuzz@$FUZZ_VERSION"
fi
# The dependency checks of scripts/test: unused dependencies (cargo machete)
# and bans, licenses and sources (cargo deny, deny.toml); both offline.
if [ "$(cargo machete --version 2>/dev/null)" != "cargo-machete $MACHETE_VERSION" ]; then
  cargo install --locked "cargo-machete@$MACHETE_VERSION"
fi
if [ "$(cargo deny --version 2>/dev/null)" != "cargo-deny $DENY_VERSION" ]; then
  cargo install --locked "cargo-deny@$DENY_VERSION"
fi
# Third-party MCP servers and clients for the interop tests (scripts/test
# installs them as a phase of their own: SKIP_PEERS=1).
if [ "${SKIP_PEERS:-0}" != 1 ]; then
  bash scripts/install-peers.sh
fi
