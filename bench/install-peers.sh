#!/usr/bin/env bash
# Installs, at pinned versions, the software that bench/run compares mcpbox
# against. Idempotent: a second run installs nothing that is already present at
# the pinned version.
#
#   bash bench/install-peers.sh            # everything
#   SKIP_APT=1 bash bench/install-peers.sh # skip the Debian packages (no root)
#
# Layout: npm packages go into bench/.local (gitignored) as an npm global
# prefix, so srt ends up at bench/.local/bin/srt. Debian packages go to the
# system (apt needs root, or sudo when run unprivileged).
set -euo pipefail

BENCH="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
PREFIX="$BENCH/.local"

# ---- pinned versions ----
# sandbox-runtime (srt) needs bwrap, socat and ripgrep on Linux; without rg it
# fails at start. hyperfine does the timing.
APT_PKGS=(bubblewrap socat ripgrep hyperfine)
NPM_PKGS=("@anthropic-ai/sandbox-runtime@0.0.83")

log() { printf '[install-peers] %s\n' "$*" >&2; }

# ---- Debian packages ----
if [ "${SKIP_APT:-0}" != 1 ]; then
  missing=()
  for p in "${APT_PKGS[@]}"; do
    dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
  done
  if [ ${#missing[@]} -gt 0 ]; then
    SUDO=""
    if [ "$(id -u)" -ne 0 ]; then
      if command -v sudo >/dev/null 2>&1; then SUDO=sudo; else
        log "missing apt packages ${missing[*]} and not root (no sudo): install them, or set SKIP_APT=1"
        exit 1
      fi
    fi
    log "apt-get install ${missing[*]}"
    $SUDO apt-get update -qq
    DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
  else
    log "apt packages present: ${APT_PKGS[*]}"
  fi
fi

# ---- npm packages into bench/.local ----
if ! command -v npm >/dev/null 2>&1; then
  log "npm not found: srt cannot be installed (its row will show failed)"
  exit 0
fi
npm_installed_version() { # $1 = package name
  local pj="$PREFIX/lib/node_modules/$1/package.json"
  if [ -f "$pj" ]; then node -p "require('$pj').version" 2>/dev/null || true; fi
}
mkdir -p "$PREFIX"
todo=()
for spec in "${NPM_PKGS[@]}"; do
  name="${spec%@*}"; ver="${spec##*@}"
  [ "$(npm_installed_version "$name")" = "$ver" ] || todo+=("$spec")
done
if [ ${#todo[@]} -gt 0 ]; then
  log "npm install -g --prefix $PREFIX ${todo[*]}"
  npm install -g --prefix "$PREFIX" --no-fund --no-audit --loglevel=error "${todo[@]}" >&2
else
  log "npm packages present: ${NPM_PKGS[*]}"
fi

for spec in "${NPM_PKGS[@]}"; do
  name="${spec%@*}"
  log "  npm $name $(npm_installed_version "$name")"
done
for b in bwrap socat rg hyperfine; do
  log "  apt $b: $(command -v "$b" || echo missing)"
done
