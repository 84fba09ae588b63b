#!/usr/bin/env bash
# Installs, at pinned versions, the software that bench/run compares mcpbox
# against. Idempotent: a second run installs nothing that is already present at
# the pinned version.
#
#   bash bench/install-peers.sh            # everything
#   SKIP_APT=1 bash bench/install-peers.sh # skip the Debian packages (no root)
#
# Layout: srt goes into bench/.local (gitignored) as an npm global prefix, so
# it ends up at bench/.local/bin/srt. The reference server and supergateway go
# into their own prefix bench/.local/npm (bin/mcp-server-everything,
# bin/supergateway, bin/mcp-proxy): mcpbox mounts that prefix into the sandbox, and refuses
# to mount bench/.local itself (an ancestor of the credential location
# .local/share/keyrings). The
# Python mcp-proxy gets its own venv in bench/.local/mcp-proxy-venv (it needs
# mcp<2, which the project's own venv does not have). Debian packages go to
# the system (apt needs root, or sudo when run unprivileged). Everything under
# bench/.local is made world-readable: as root, mcpbox runs the sandboxed
# server as uid 65534, which must read the npm prefix it mounts.
set -euo pipefail

BENCH="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
PREFIX="$BENCH/.local"

# ---- pinned versions ----
# sandbox-runtime (srt) needs bwrap, socat and ripgrep on Linux; without rg it
# fails at start. hyperfine does the timing.
APT_PKGS=(bubblewrap socat ripgrep hyperfine)
NPM_PKGS=("@anthropic-ai/sandbox-runtime@0.0.83")
RELAY_PREFIX="$PREFIX/npm"
# The TypeScript mcp-proxy (bin/mcp-proxy here) is the serve section's second
# bridge; the Python one of the same name (the relay section's) has its venv.
RELAY_NPM_PKGS=(
  "@modelcontextprotocol/server-everything@2026.8.31"
  "supergateway@4.0.0"
  "mcp-proxy@6.7.19"
)
PY_PKGS=("mcp-proxy==0.13.0")
VENV="$PREFIX/mcp-proxy-venv"

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
npm_installed_version() { # $1 = prefix, $2 = package name
  local pj="$1/lib/node_modules/$2/package.json"
  if [ -f "$pj" ]; then node -p "require('$pj').version" 2>/dev/null || true; fi
}
npm_into() { # $1 = prefix, rest = name@version specs
  local prefix="$1" spec name ver todo=()
  shift
  mkdir -p "$prefix"
  for spec in "$@"; do
    name="${spec%@*}"; ver="${spec##*@}"
    [ "$(npm_installed_version "$prefix" "$name")" = "$ver" ] || todo+=("$spec")
  done
  if [ ${#todo[@]} -gt 0 ]; then
    log "npm install -g --prefix $prefix ${todo[*]}"
    npm install -g --prefix "$prefix" --no-fund --no-audit --loglevel=error "${todo[@]}" >&2
  else
    log "npm packages present in $prefix: $*"
  fi
}
mkdir -p "$PREFIX"
if ! command -v npm >/dev/null 2>&1; then
  log "npm not found: srt, server-everything and supergateway cannot be installed (their rows will show failed)"
else
  npm_into "$PREFIX" "${NPM_PKGS[@]}"
  npm_into "$RELAY_PREFIX" "${RELAY_NPM_PKGS[@]}"
fi

# ---- Python mcp-proxy into its own venv ----
# Debian's python (not a per-user pyenv one), so the venv works for any user.
PY=/usr/bin/python3
[ -x "$PY" ] || PY="$(command -v python3)"
if [ ! -x "$VENV/bin/python" ]; then
  log "creating venv $VENV"
  "$PY" -m venv "$VENV"
fi
todo=()
for spec in "${PY_PKGS[@]}"; do
  name="${spec%%==*}"; ver="${spec##*==}"
  have="$("$VENV/bin/python" -m pip show "$name" 2>/dev/null | awk '/^Version:/{print $2}' || true)"
  [ "$have" = "$ver" ] || todo+=("$spec")
done
if [ ${#todo[@]} -gt 0 ]; then
  log "pip install ${todo[*]}"
  "$VENV/bin/python" -m pip install -q --disable-pip-version-check "${todo[@]}" >&2
else
  log "python packages present: ${PY_PKGS[*]}"
fi
chmod -R a+rX "$PREFIX"

for spec in "${NPM_PKGS[@]}"; do
  name="${spec%@*}"
  log "  npm $name $(npm_installed_version "$PREFIX" "$name")"
done
for spec in "${RELAY_NPM_PKGS[@]}"; do
  name="${spec%@*}"
  log "  npm $name $(npm_installed_version "$RELAY_PREFIX" "$name")"
done
for spec in "${PY_PKGS[@]}"; do
  name="${spec%%==*}"
  log "  pip $name $("$VENV/bin/python" -m pip show "$name" 2>/dev/null | awk '/^Version:/{print $2}')"
done
for b in bwrap socat rg hyperfine; do
  log "  apt $b: $(command -v "$b" || echo missing)"
done
