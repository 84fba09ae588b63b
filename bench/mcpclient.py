#!/usr/bin/env python3
"""A minimal MCP client for bench/run (Python 3 standard library only).

It speaks raw JSON-RPC, newline-delimited over a child's stdio, or Streamable
HTTP (POST with `Accept: application/json, text/event-stream`, the
`Mcp-Session-Id` header carried, JSON or SSE answers) over one keep-alive
connection on loopback. No SDK, so every path pays the same client cost.

  mcpclient.py latency --name NAME --out FILE [--calls N] [--warmup W]
                       [--url URL] -- CMD [ARGS...]
      initialize, notifications/initialized, tools/list, W warm-up calls,
      then N sequential `tools/call echo {"message": "x"}`; per-call round
      trip. A row fails when echo does not echo (a refusal is not timed).
      With --callgrind DIR, CMD runs under `valgrind --tool=callgrind
      --callgrind-out-file=DIR/callgrind.out.%p` (bench/run writes that
      command line): its counters are zeroed after the warm-up
      (callgrind_control -z) and dumped after the N calls (-d); the row
      gets "instructions" (Ir of that window, every thread of CMD's own
      process, no child) and "instructions_per_call".
      Without --url, CMD is the MCP server, spoken to over its stdio. With
      --url, CMD is an HTTP bridge: it is started in its own session, the
      client waits until URL's port accepts, speaks Streamable HTTP to URL,
      then ends the bridge's whole process group.
  mcpclient.py coldstart --name NAME --out FILE [--runs R] -- CMD [ARGS...]
      spawn to the answer of the first tools/list (after initialize and
      notifications/initialized), R times; the child is stopped each time.
  mcpclient.py memory --name NAME --out FILE [--mib M] -- CMD [ARGS...]
      VmRSS/VmHWM of CMD's own process (not its children) at idle after
      initialize + tools/list, then while the server answers
      `tools/call big {"mib": M}` (the project's flood test server).

  mcpclient.py large --name NAME --out FILE [--mib M] [--runs R] [--warmup W]
                     [--secret S] [--embed N] [--check 0] -- CMD [ARGS...]
      initialize + tools/list, W warm-up calls, then R timed calls of
      `tools/call big {"mib": M, "char": C}` (the flood test server; C is
      "é", or with --embed N a unit of "é" ending in S, sized so that the
      result holds S N times); each timed from writing the request to the
      last byte of the answer line (read with large reads; parsing it is
      not timed). The answer is then checked: not an error, one text item
      of the expected size unless redacted, and with --secret: S nowhere
      in the line and exactly N (default 0) `[REDACTED:` labels (not with
      --check 0: a direct call, where S is expected).

Every subcommand writes one JSON object to FILE, with "status": "ok" or
"status": "failed" and "why"; the exit code is 0 either way unless the
arguments are wrong.
"""

import http.client
import json
import os
import signal
import socket
import statistics
import subprocess
import sys
import threading
import time
import urllib.parse
from pathlib import Path

PROTOCOL = "2025-06-18"
ECHO_ARGS = {"message": "x"}
TIMEOUT = 30.0


class Failed(Exception):
    """A measurement that could not be made; the message goes into the row."""


def init_params():
    return {"protocolVersion": PROTOCOL, "capabilities": {},
            "clientInfo": {"name": "mcpbox-bench", "version": "0"}}


# ---------------------------------------------------------------------------
# stdio transport
# ---------------------------------------------------------------------------
class Stdio:
    def __init__(self, cmd, stderr):
        self.t0 = time.perf_counter()
        self.proc = subprocess.Popen(cmd, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                     stderr=stderr, bufsize=0)
        self.out = self.proc.stdout
        self.next_id = 0

    def request(self, method, params=None):
        self.next_id += 1
        rid = self.next_id
        msg = {"jsonrpc": "2.0", "id": rid, "method": method}
        if params is not None:
            msg["params"] = params
        self.proc.stdin.write(json.dumps(msg, separators=(",", ":")).encode() + b"\n")
        while True:
            line = self.out.readline()
            if not line:
                raise Failed(f"{method}: server closed stdout (exit {self.proc.poll()})")
            # Cheap filter first: notifications and server requests are skipped.
            if b'"id"' not in line:
                continue
            try:
                m = json.loads(line)
            except ValueError:
                raise Failed(f"{method}: non-JSON line from server: {line[:80]!r}")
            if m.get("id") == rid and "method" not in m:
                if "error" in m:
                    raise Failed(f"{method}: error {m['error']}")
                return m["result"], len(line)

    def notify(self, method, params=None):
        msg = {"jsonrpc": "2.0", "method": method}
        if params is not None:
            msg["params"] = params
        self.proc.stdin.write(json.dumps(msg, separators=(",", ":")).encode() + b"\n")

    def close(self):
        try:
            self.proc.stdin.close()
        except OSError:
            pass
        try:
            self.proc.wait(timeout=5)
        except subprocess.TimeoutExpired:
            self.proc.terminate()
            try:
                self.proc.wait(timeout=3)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()


# ---------------------------------------------------------------------------
# Streamable HTTP transport
# ---------------------------------------------------------------------------
class Http:
    """`headers` are sent with every POST (e.g. `Mcpbox-Task`)."""

    def __init__(self, url, headers=None):
        u = urllib.parse.urlsplit(url)
        if u.hostname not in ("127.0.0.1", "::1", "localhost"):
            raise Failed(f"refusing non-loopback url {url}")
        self.path = u.path or "/"
        self.conn = http.client.HTTPConnection(u.hostname, u.port, timeout=TIMEOUT)
        self.session = None
        self.version = None
        self.next_id = 0
        self.extra = dict(headers or {})

    def _post(self, msg):
        body = json.dumps(msg, separators=(",", ":")).encode()
        headers = {"Content-Type": "application/json",
                   "Accept": "application/json, text/event-stream", **self.extra}
        if self.session:
            headers["Mcp-Session-Id"] = self.session
        if self.version:
            headers["MCP-Protocol-Version"] = self.version
        self.conn.request("POST", self.path, body=body, headers=headers)
        resp = self.conn.getresponse()
        sid = resp.getheader("Mcp-Session-Id")
        if sid:
            self.session = sid
        return resp

    def request(self, method, params=None):
        self.next_id += 1
        rid = self.next_id
        msg = {"jsonrpc": "2.0", "id": rid, "method": method}
        if params is not None:
            msg["params"] = params
        resp = self._post(msg)
        if resp.status != 200:
            raise Failed(f"{method}: HTTP {resp.status}: {resp.read()[:120]!r}")
        ctype = (resp.getheader("Content-Type") or "").split(";")[0].strip()
        if ctype == "application/json":
            raw = resp.read()
            m = json.loads(raw)
            msgs = m if isinstance(m, list) else [m]
        elif ctype == "text/event-stream":
            # Read events until the answer; the server then ends the stream.
            msgs, raw, data = [], b"", []
            found = False
            while not found:
                line = resp.readline()
                if not line:
                    break
                raw += line
                line = line.rstrip(b"\r\n")
                if line.startswith(b"data:"):
                    data.append(line[5:].lstrip())
                elif line == b"" and data:
                    m = json.loads(b"\n".join(data))
                    data = []
                    msgs.append(m)
                    if isinstance(m, dict) and m.get("id") == rid:
                        found = True
            resp.read()  # drain to the end so the connection can be reused
        else:
            raise Failed(f"{method}: unexpected Content-Type {ctype!r}")
        for m in msgs:
            if isinstance(m, dict) and m.get("id") == rid and "method" not in m:
                if "error" in m:
                    raise Failed(f"{method}: error {m['error']}")
                return m["result"], len(raw)
        raise Failed(f"{method}: no answer in the HTTP response")

    def notify(self, method, params=None):
        msg = {"jsonrpc": "2.0", "method": method}
        if params is not None:
            msg["params"] = params
        resp = self._post(msg)
        resp.read()
        if resp.status not in (200, 202, 204):
            raise Failed(f"{method}: HTTP {resp.status}")

    def close(self):
        if self.session:
            try:
                self.conn.request("DELETE", self.path, headers={"Mcp-Session-Id": self.session})
                self.conn.getresponse().read()
            except (OSError, http.client.HTTPException):
                pass
        self.conn.close()


# ---------------------------------------------------------------------------
# helpers
# ---------------------------------------------------------------------------
def handshake(t):
    result, _ = t.request("initialize", init_params())
    if isinstance(t, Http):
        t.version = result.get("protocolVersion", PROTOCOL)
    t.notify("notifications/initialized")
    return result


def pct(sorted_vals, p):
    """Nearest-rank percentile of a sorted list."""
    if not sorted_vals:
        return None
    k = max(0, min(len(sorted_vals) - 1, int(round(p / 100.0 * len(sorted_vals) + 0.5)) - 1))
    return sorted_vals[k]


def summarize_ms(samples_s):
    ms = sorted(x * 1e3 for x in samples_s)
    if not ms:
        return {"n": 0}
    return {"n": len(ms), "p50_ms": statistics.median(ms), "p90_ms": pct(ms, 90),
            "p99_ms": pct(ms, 99), "min_ms": ms[0], "max_ms": ms[-1],
            "mean_ms": statistics.fmean(ms)}


def proc_fields(path, keys):
    """{key: its first number} of the `Key: N ...` lines of a /proc file
    (status, smaps_rollup) named in keys; None when it cannot be read."""
    try:
        text = Path(path).read_text()
    except OSError:
        return None
    f = {}
    for line in text.splitlines():
        k, _, v = line.partition(":")
        if k in keys:
            f[k] = int(v.split()[0])
    return f


def read_status(pid):
    f = proc_fields(f"/proc/{pid}/status", ("VmRSS", "VmHWM", "Threads"))
    return f if f and "VmRSS" in f else None


def own_tree_rss(pid):
    """Sum of VmRSS (KiB) over pid and its descendants that run the same
    program (same comm): mcpbox's supervisor and in-sandbox helper, not the
    server it runs."""
    try:
        comm = Path(f"/proc/{pid}/comm").read_text().strip()
    except OSError:
        return None
    children = {}
    for d in os.listdir("/proc"):
        if not d.isdigit():
            continue
        try:
            ppid = int(Path(f"/proc/{d}/stat").read_text().rsplit(")", 1)[1].split()[1])
        except (OSError, IndexError, ValueError):
            continue
        children.setdefault(ppid, []).append(int(d))
    total, n, todo = 0, 0, [pid]
    while todo:
        p = todo.pop()
        todo.extend(children.get(p, []))
        try:
            if Path(f"/proc/{p}/comm").read_text().strip() != comm:
                continue
        except OSError:
            continue
        st = read_status(p)
        if st:
            total += st["VmRSS"]
            n += 1
    return {"kib": total, "processes": n}


def _callgrind_control(opt, pid):
    r = subprocess.run(["callgrind_control", opt, str(pid)], stdout=subprocess.PIPE,
                       stderr=subprocess.STDOUT, timeout=120)
    if r.returncode != 0 or b"OK" not in r.stdout:
        raise Failed(f"callgrind_control {opt} {pid}: {r.stdout.decode(errors='replace').strip()[:200]}")


def callgrind_zero(pid):
    """Zeroes the counters of PID, a process running under callgrind
    (through vgdb: the call returns when callgrind has done it)."""
    _callgrind_control("-z", pid)


def callgrind_dump(pid, outdir):
    """Dumps PID's counters (callgrind_control -d) into OUTDIR (the
    --callgrind-out-file=OUTDIR/callgrind.out.%p of its command line) and
    returns the instructions (Ir) counted since the last zero: the dump's
    `totals:` line (`summary:` in older formats)."""
    before = set(Path(outdir).glob(f"callgrind.out.{pid}*"))
    _callgrind_control("-d", pid)
    new = sorted(set(Path(outdir).glob(f"callgrind.out.{pid}*")) - before,
                 key=lambda f: f.stat().st_mtime)
    if not new:
        raise Failed(f"callgrind_control -d {pid} wrote no file in {outdir}")
    text = new[-1].read_text(errors="replace")
    for key in ("totals:", "summary:"):
        for line in text.splitlines():
            if line.startswith(key):
                return int(line.split()[1])
    raise Failed(f"no totals in {new[-1]}")


def parse(argv, spec, doc=__doc__, prog="mcpclient.py"):
    """--opt VALUE options named in spec (with defaults), then `-- CMD...`;
    an unknown one exits with `doc`."""
    opts = dict(spec)
    cmd = None
    i = 0
    while i < len(argv):
        a = argv[i]
        if a == "--":
            cmd = argv[i + 1:]
            break
        if a.startswith("--") and a[2:] in opts and i + 1 < len(argv):
            opts[a[2:]] = argv[i + 1]
            i += 2
            continue
        sys.exit(f"{prog}: unexpected argument {a!r}\n\n{doc}")
    return opts, cmd


def write(out, result):
    Path(out).write_text(json.dumps(result, indent=2))


def stderr_file(out):
    return open(str(out) + ".stderr", "wb")


# ---------------------------------------------------------------------------
# subcommands
# ---------------------------------------------------------------------------
class Bridge:
    """An HTTP bridge (or gateway) process in its own session, listening on
    URL's port; ended as a group, SIGTERM first for `term_wait` seconds."""

    term_wait = 3

    def __init__(self, cmd, url, stderr, wait_s=30.0):
        u = urllib.parse.urlsplit(url)
        self.proc = subprocess.Popen(cmd, stdin=subprocess.DEVNULL, stdout=stderr,
                                     stderr=stderr, start_new_session=True)
        deadline = time.monotonic() + wait_s
        while True:
            if self.proc.poll() is not None:
                raise Failed(f"{Path(cmd[0]).name} exited with {self.proc.returncode} before listening")
            try:
                socket.create_connection((u.hostname, u.port), timeout=1).close()
                return
            except OSError:
                if time.monotonic() > deadline:
                    self.stop()
                    raise Failed(f"not listening on {u.hostname}:{u.port} after {wait_s:.0f} s")
                time.sleep(0.05)

    def stop(self):
        for sig, wait in ((signal.SIGTERM, self.term_wait), (signal.SIGKILL, 3)):
            try:
                os.killpg(self.proc.pid, sig)
            except ProcessLookupError:
                pass
            try:
                self.proc.wait(timeout=wait)
                # The group may outlive its leader: make sure it is empty.
                os.killpg(self.proc.pid, signal.SIGKILL)
            except ProcessLookupError:
                return
            except subprocess.TimeoutExpired:
                continue


def cmd_latency(argv):
    o, cmd = parse(argv, {"name": None, "out": None, "calls": "1000", "warmup": "50", "url": None,
                          "callgrind": None})
    if not o["name"] or not o["out"] or not cmd:
        sys.exit(__doc__)
    calls, warmup = int(o["calls"]), int(o["warmup"])
    result = {"name": o["name"], "transport": "http" if o["url"] else "stdio",
              "command": cmd, "url": o["url"], "calls": calls, "warmup": warmup}
    t = bridge = None
    err = stderr_file(o["out"])
    try:
        if o["url"]:
            bridge = Bridge(cmd, o["url"], err)
            t = Http(o["url"])
        else:
            t = Stdio(cmd, err)
        init = handshake(t)
        result["server"] = init.get("serverInfo")
        result["protocol"] = init.get("protocolVersion")
        # As a host does: list before calling (mcpbox pins the first list).
        tools, _ = t.request("tools/list")
        result["tools"] = len(tools.get("tools", []))
        for _ in range(warmup):
            t.request("tools/call", {"name": "echo", "arguments": ECHO_ARGS})
        res, _ = t.request("tools/call", {"name": "echo", "arguments": ECHO_ARGS})
        result["sample_result"] = res
        texts = [c.get("text", "") for c in res.get("content", []) if isinstance(c, dict)]
        if res.get("isError") or not any("x" in x for x in texts):
            # A refused call is fast: never time refusals as if they were echoes.
            raise Failed(f"echo did not answer: {json.dumps(res)[:200]}")
        # The process measured by --callgrind: the relay (stdio) or the bridge.
        counted = (bridge.proc if bridge else t.proc).pid
        if o["callgrind"]:
            callgrind_zero(counted)
        samples = []
        pc = time.perf_counter
        start = pc()
        for _ in range(calls):
            t0 = pc()
            t.request("tools/call", {"name": "echo", "arguments": ECHO_ARGS})
            samples.append(pc() - t0)
        total = pc() - start
        if o["callgrind"]:
            ir = callgrind_dump(counted, o["callgrind"])
            result.update({"instructions": ir, "instructions_per_call": ir / calls})
        result.update(summarize_ms(samples))
        result["calls_per_s"] = calls / total
        result["samples_ms"] = [round(x * 1e3, 4) for x in samples]
        result["status"] = "ok"
    except (Failed, OSError, ValueError, http.client.HTTPException, subprocess.SubprocessError) as e:
        result["status"] = "failed"
        result["why"] = str(e)[:300] or type(e).__name__
    finally:
        if t:
            t.close()
        if bridge:
            bridge.stop()
        err.close()
    write(o["out"], result)
    return 0


def cmd_coldstart(argv):
    o, cmd = parse(argv, {"name": None, "out": None, "runs": "10"})
    if not o["name"] or not o["out"] or not cmd:
        sys.exit(__doc__)
    result = {"name": o["name"], "command": cmd, "runs": int(o["runs"])}
    samples = []
    err = stderr_file(o["out"])
    try:
        for _ in range(int(o["runs"])):
            t = Stdio(cmd, err)
            try:
                handshake(t)
                tools, _ = t.request("tools/list")
                samples.append(time.perf_counter() - t.t0)
                result["tools"] = len(tools.get("tools", []))
            finally:
                t.close()
        result.update(summarize_ms(samples))
        result["samples_ms"] = [round(x * 1e3, 3) for x in samples]
        result["status"] = "ok"
    except (Failed, OSError, ValueError) as e:
        result["status"] = "failed"
        result["why"] = str(e)[:300] or type(e).__name__
    err.close()
    write(o["out"], result)
    return 0


def cmd_memory(argv):
    o, cmd = parse(argv, {"name": None, "out": None, "mib": "64", "settle": "1.0"})
    if not o["name"] or not o["out"] or not cmd:
        sys.exit(__doc__)
    result = {"name": o["name"], "command": cmd, "mib": float(o["mib"])}
    err = stderr_file(o["out"])
    t = None
    try:
        t = Stdio(cmd, err)
        pid = t.proc.pid
        handshake(t)
        t.request("tools/list")
        time.sleep(float(o["settle"]))
        idle = read_status(pid)
        if not idle:
            raise Failed("process gone after tools/list")
        result["idle_vmrss_kib"] = idle["VmRSS"]
        result["idle_vmhwm_kib"] = idle.get("VmHWM")
        tree = own_tree_rss(pid)
        if tree:
            result["idle_own_tree_vmrss_kib"] = tree["kib"]
            result["own_tree_processes"] = tree["processes"]
        # Sample RSS while the big answer is in flight.
        peak = {"rss": idle["VmRSS"]}
        done = threading.Event()

        def sampler():
            while not done.is_set():
                st = read_status(pid)
                if st:
                    peak["rss"] = max(peak["rss"], st["VmRSS"])
                time.sleep(0.002)

        th = threading.Thread(target=sampler, daemon=True)
        th.start()
        t0 = time.perf_counter()
        try:
            res, size = t.request("tools/call", {"name": "big", "arguments": {"mib": float(o["mib"])}})
        except Failed as e:  # e.g. a line refused: still a memory figure
            res, size = {"isError": True, "content": [{"type": "text", "text": str(e)}]}, 0
        result["call_ms"] = (time.perf_counter() - t0) * 1e3
        done.set()
        th.join()
        after = read_status(pid)
        if not after:
            raise Failed("process gone after the big call")
        result["big_vmrss_max_kib"] = peak["rss"]
        result["big_vmhwm_kib"] = after.get("VmHWM")
        result["after_vmrss_kib"] = after["VmRSS"]
        result["answer_bytes"] = size
        texts = [c.get("text", "") for c in res.get("content", []) if isinstance(c, dict)]
        result["answer_text_bytes"] = sum(len(x.encode()) for x in texts)
        result["answer_is_error"] = bool(res.get("isError"))
        result["answer_tail"] = (texts[-1][-160:] if texts else "")
        result["status"] = "ok"
    except (Failed, OSError, ValueError) as e:
        result["status"] = "failed"
        result["why"] = str(e)[:300] or type(e).__name__
    finally:
        if t:
            t.close()
        err.close()
    write(o["out"], result)
    return 0


class BigLines:
    """Newline-delimited reading with 1 MiB reads; a newline is looked for
    in each new chunk only (no rescans of a growing buffer)."""

    def __init__(self, fd):
        self.fd = fd
        self.rest = b""

    def readline(self):
        parts = [self.rest]
        i = self.rest.find(b"\n")
        while i < 0:
            chunk = os.read(self.fd, 1 << 20)
            if not chunk:
                self.rest = b""
                return b"".join(parts)
            parts.append(chunk)
            i = chunk.find(b"\n")
        last = parts.pop()
        parts.append(last[:i + 1])
        self.rest = last[i + 1:]
        return b"".join(parts)


def cmd_large(argv):
    o, cmd = parse(argv, {"name": None, "out": None, "mib": "64", "runs": "5", "warmup": "1",
                          "secret": None, "embed": "0", "check": "1"})
    if not o["name"] or not o["out"] or not cmd:
        sys.exit(__doc__)
    mib, runs, warmup, embed = float(o["mib"]), int(o["runs"]), int(o["warmup"]), int(o["embed"])
    unit = "é"
    if embed and o["secret"]:
        per = int(mib * 1024 * 1024) // embed
        unit = "é" * ((per - len(o["secret"].encode())) // 2) + o["secret"]
    # as flood computes it: whole repeats of the unit's UTF-8 bytes
    unit_bytes = max(1, len(unit.encode()))
    want_text = unit_bytes * (int(mib * 1024 * 1024) // unit_bytes)
    result = {"name": o["name"], "command": cmd, "mib": mib, "runs": runs, "warmup": warmup,
              "char_bytes": unit_bytes, "expect_redactions": embed if o["secret"] else 0, "checked": o["check"] == "1"}
    err = stderr_file(o["out"])
    t = None
    try:
        t = Stdio(cmd, err)
        handshake(t)
        t.request("tools/list")
        # Stdio reads unbuffered (a byte per read(2) in readline): fine for
        # small answers, minutes for 64 MiB. From here on, large reads.
        reader = BigLines(t.proc.stdout.fileno())
        samples = []
        line = b""
        for i in range(warmup + runs):
            t.next_id += 1
            rid = t.next_id
            msg = {"jsonrpc": "2.0", "id": rid, "method": "tools/call",
                   "params": {"name": "big", "arguments": {"mib": mib, "char": unit}}}
            req = json.dumps(msg, separators=(",", ":")).encode() + b"\n"
            t0 = time.perf_counter()
            t.proc.stdin.write(req)
            while True:
                line = reader.readline()
                if not line:
                    raise Failed(f"server closed stdout (exit {t.proc.poll()})")
                # notifications are short; the answer is the long line
                if len(line) > 1 << 20 or b'"id"' in line:
                    break
            elapsed = time.perf_counter() - t0
            if i >= warmup:
                samples.append(elapsed)
        m = json.loads(line)
        if "error" in m:
            raise Failed(f"error answer: {json.dumps(m['error'])[:200]}")
        res = m["result"]
        texts = [c.get("text", "") for c in res.get("content", []) if isinstance(c, dict)]
        text = "".join(texts)
        result["answer_bytes"] = len(line) - 1
        result["text_bytes"] = len(text.encode())
        result["items"] = len(texts)
        result["is_error"] = bool(res.get("isError"))
        result["redactions"] = text.count("[REDACTED:")
        if res.get("isError"):
            raise Failed(f"isError answer: {text[:200]}")
        if o["secret"] is not None and o["check"] == "1":
            if o["secret"].encode() in line:
                raise Failed("the secret reached the client")
            if result["redactions"] != result["expect_redactions"]:
                raise Failed(f"{result['redactions']} redactions, expected {result['expect_redactions']}")
        if result["redactions"] == 0 and result["text_bytes"] != want_text:
            raise Failed(f"text of {result['text_bytes']} bytes, expected {want_text} (truncated?)")
        if "truncated" in text[-200:]:
            raise Failed("the result was truncated (raise [output] max_result)")
        s_sorted = sorted(samples)
        result["samples_s"] = [round(x, 5) for x in samples]
        result["median_s"] = statistics.median(s_sorted)
        result["min_s"] = s_sorted[0]
        result["max_s"] = s_sorted[-1]
        result["status"] = "ok"
    except (Failed, OSError, ValueError) as e:
        result["status"] = "failed"
        result["why"] = str(e)[:300] or type(e).__name__
    finally:
        if t:
            t.close()
        err.close()
    write(o["out"], result)
    return 0


def main():
    cmds = {"latency": cmd_latency, "coldstart": cmd_coldstart, "memory": cmd_memory,
            "large": cmd_large}
    if len(sys.argv) < 2 or sys.argv[1] not in cmds:
        sys.exit(__doc__)
    return cmds[sys.argv[1]](sys.argv[2:])


if __name__ == "__main__":
    sys.exit(main())
