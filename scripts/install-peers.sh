#!/usr/bin/env bash
# Installs the third-party MCP servers and clients the interop tests drive,
# pinned, into .local/peers (gitignored). Idempotent: a second run only checks.
#   .local/peers/npm/bin/      mcp-server-everything, mcp-server-filesystem, mcp-inspector
#   .local/peers/venv/bin/     python with the mcp SDK, mcp-server-time, mcp-server-fetch
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
PEERS="${MCPBOX_PEERS_DIR:-$ROOT/.local/peers}"
NPM_PKGS=(
  "@modelcontextprotocol/server-everything@2026.8.31"
  "@modelcontextprotocol/server-filesystem@2026.8.31"
  "@modelcontextprotocol/inspector@2.12.0"
)
PY_PKGS=(
  "mcp==2.3.0"
  "mcp-server-time==2026.10.19"
  "mcp-server-fetch==2026.10.24"
)
log() { printf '[peers] %s\n' "$*"; }
mkdir -p "$PEERS"

todo=()
for spec in "${NPM_PKGS[@]}"; do
  name="${spec%@*}"; ver="${spec##*@}"
  pj="$PEERS/npm/lib/node_modules/$name/package.json"
  have=""
  [ -f "$pj" ] && have="$(node -p "require('$pj').version" 2>/dev/null || true)"
  [ "$have" = "$ver" ] || todo+=("$spec")
done
if [ ${#todo[@]} -gt 0 ]; then
  log "npm install ${todo[*]}"
  npm install -g --prefix "$PEERS/npm" --no-fund --no-audit --loglevel=error "${todo[@]}"
else
  log "npm packages present"
fi

if [ ! -x "$PEERS/venv/bin/python" ]; then
  log "creating venv"
  # Debian's python, not a per-user one: the venv is mounted into sandboxes
  # and used by the unprivileged test user, so its interpreter must live in /usr.
  /usr/bin/python3 -m venv "$PEERS/venv"
fi
todo=()
for spec in "${PY_PKGS[@]}"; do
  name="${spec%%==*}"; ver="${spec##*==}"
  have="$("$PEERS/venv/bin/python" -m pip show "$name" 2>/dev/null | awk '/^Version:/{print $2}' || true)"
  [ "$have" = "$ver" ] || todo+=("$spec")
done
if [ ${#todo[@]} -gt 0 ]; then
  log "pip install ${todo[*]}"
  "$PEERS/venv/bin/python" -m pip install -q --disable-pip-version-check "${todo[@]}"
else
  log "python packages present"
fi
# mcp-server-fetch's HTML simplifier runs `npm install` on first use; do it
# now, since a sandboxed server has a read-only venv.
RJS="$("$PEERS/venv/bin/python" -c 'import os,readabilipy; print(os.path.join(os.path.dirname(readabilipy.__file__),"javascript"))')"
if [ -f "$RJS/package.json" ] && [ ! -d "$RJS/node_modules" ]; then
  log "npm install for readabilipy"
  (cd "$RJS" && npm install --no-fund --no-audit --loglevel=error)
fi
# Readable by the unprivileged test user, who runs servers from here too.
chmod -R a+rX "$PEERS"
log "done"
