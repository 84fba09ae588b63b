#!/usr/bin/env python3
"""Streamable HTTP load generator for bench/run's serve section (Python 3
standard library only).

One client = one MCP session on one keep-alive HTTP/1.1 connection
(raw sockets: the request bytes are written by hand, the answer parsed
with Content-Length or chunked framing, then as JSON or as server-sent
events). Many clients share one thread and one selector, so 32 or 100
clients cost the machine one Python process, the same for every row.

Every subcommand starts CMD (the gateway or bridge under test) in a
session of its own, waits until URL's port accepts, measures, then ends
CMD's whole process group. Every call is `tools/call TOOL {ARG: MESSAGE}`
where MESSAGE is `<client's random hex>:<call number>`; an answer counts
only when its text ends with that MESSAGE and no other client's value is
in it (a refusal, or another client's answer, would look fast).

  mcphttp.py latency --name NAME --out FILE --url URL [--calls N] [--warmup W]
                     [--tool echo] [--arg message] -- CMD [ARGS...]
      1 client: initialize, notifications/initialized, tools/list, W
      warm-up calls, then N sequential calls; per-call round trip (write
      of the request to the last byte of the answer). Also "cpu": CPU ms
      per call of the N calls, as throughput's (--upstream). With
      --callgrind DIR, CMD runs under callgrind with
      --callgrind-out-file=DIR/callgrind.out.%p (bench/run writes that
      command line): its counters are zeroed after the warm-up and dumped
      after the N calls (callgrind_control -z, -d): "instructions" and
      "instructions_per_call" of CMD's own process (all its threads; no
      child: valgrind follows none).
  mcphttp.py throughput --name NAME --out FILE --url URL [--clients C]
                        [--seconds S] [--warmup-seconds W] -- CMD [ARGS...]
      C clients, each its own session and connection, all initialized
      first; then each sends a call as soon as its last one is answered,
      for W seconds (not counted), then S seconds: calls/s in that window
      (answers checked), and the latency of those calls. Also "cpu": CPU
      ms per call over the window of the client (this process), the
      gateway (CMD's process tree but the servers) and the servers
      (processes running --upstream PROGRAM, default mcp-server-everything,
      and their descendants), the machine's cores, and the ceiling:
      cores / (client + servers ms per call), the calls/s a gateway that
      cost no CPU would reach (see cpu_figures).
  mcphttp.py sessions --name NAME --out FILE --url URL [--clients N]
                      [--settle 2] -- CMD [ARGS...]
      VmRSS/VmHWM of CMD's own process (from /proc/PID/status: not its
      children) at start, then after N clients opened a session each
      (initialize + notifications/initialized, then nothing; connections
      left open) and SETTLE seconds.

  mcphttp.py flood --name NAME --out FILE --url URL [--notes 800] [--kib 512]
                   [--fits 16] [--settle 2] -- CMD [ARGS...]
      Gateway memory under a flood: 2 clients open a session each on URL
      (the `concurrent` test server of crates/testservers); the first
      calls `notes {count: NOTES, kib: KIB}`, whose server then sends
      NOTES notifications of KIB KiB that belong to no request, and never
      opens its GET stream; the second calls `slow` over and over
      meanwhile. VmRSS of CMD's own process is sampled before and between
      the second client's calls until the gateway's /metrics counts all
      but FITS of the notifications dropped (the session's byte budget
      holds FITS): its peak, and the calls that worked meanwhile.

Common options: --tool (default echo; `everything__echo` on the
aggregating /mcp), --arg (echo's argument, default message), --open N
(sessions being opened at once, default 16), --ready SECONDS (default 60).

Each writes one JSON object to FILE with "status": "ok" or "failed" and
"why"; the exit code is 0 either way unless the arguments are wrong.
bench/load.py uses the same client for the load test.
"""

import json
import os
import re
import resource
import select
import selectors
import signal
import socket
import statistics
import subprocess
import sys
import time
import urllib.parse
from pathlib import Path

# beside this file: the stdio client's measurement helpers and process
# handling, shared
import mcpclient
from mcpclient import Bridge, Failed, pct, read_status, summarize_ms

PROTOCOL = "2025-11-25"
INIT_TIMEOUT = 180.0
CALL_TIMEOUT = 60.0
# A client's value in a message: 16 hex digits, a colon, a counter.
VALUE = re.compile(rb"\b([0-9a-f]{16}):(\d+)\b")


# ---------------------------------------------------------------------------
# HTTP/1.1 framing
# ---------------------------------------------------------------------------
class Response:
    __slots__ = ("status", "headers", "body")

    def __init__(self, status, headers, body):
        self.status, self.headers, self.body = status, headers, body

    def messages(self):
        """The JSON-RPC messages in the body: one JSON document, or the
        `data:` of every server-sent event."""
        ctype = self.headers.get("content-type", "").split(";")[0].strip().lower()
        if not self.body:
            return []
        if ctype == "application/json":
            m = json.loads(self.body)
            return m if isinstance(m, list) else [m]
        if ctype == "text/event-stream":
            out, data = [], []
            for line in self.body.split(b"\n"):
                line = line.rstrip(b"\r")
                if line.startswith(b"data:"):
                    data.append(line[5:].lstrip(b" "))
                elif not line and data:
                    out.append(b"\n".join(data))
                    data = []
            if data:
                out.append(b"\n".join(data))
            # an event with empty data (a resumability "priming" event) holds no message
            return [json.loads(d) for d in out if d.strip()]
        raise Failed(f"HTTP {self.status}: unexpected Content-Type {ctype!r}")


def parse_response(buf):
    """(Response, bytes used) for the first whole response in buf, or None."""
    i = buf.find(b"\r\n\r\n")
    if i < 0:
        return None
    lines = bytes(buf[:i]).decode("latin-1").split("\r\n")
    try:
        status = int(lines[0].split(" ", 2)[1])
    except (IndexError, ValueError):
        raise Failed(f"bad status line {lines[0][:80]!r}")
    headers = {}
    for line in lines[1:]:
        k, _, v = line.partition(":")
        headers[k.strip().lower()] = v.strip()
    pos = i + 4
    if 100 <= status < 200:  # 100 Continue and the like: skip it
        return Response(status, headers, b""), pos
    if "chunked" in headers.get("transfer-encoding", "").lower():
        parts = []
        while True:
            j = buf.find(b"\r\n", pos)
            if j < 0:
                return None
            size = int(bytes(buf[pos:j]).split(b";")[0], 16)
            if size == 0:
                k = buf.find(b"\r\n\r\n", j)  # no trailers: "0\r\n\r\n"
                if k < 0:
                    return None
                return Response(status, headers, b"".join(parts)), k + 4
            if len(buf) < j + 2 + size + 2:
                return None
            parts.append(bytes(buf[j + 2:j + 2 + size]))
            pos = j + 2 + size + 2
    if "content-length" in headers:
        n = int(headers["content-length"])
        if len(buf) < pos + n:
            return None
        return Response(status, headers, bytes(buf[pos:pos + n])), pos + n
    if status in (202, 204, 304):
        return Response(status, headers, b""), pos
    raise Failed(f"HTTP {status} without Content-Length or chunked framing (cannot keep the connection)")


# ---------------------------------------------------------------------------
# One client: a session on a connection, driven by a generator
# ---------------------------------------------------------------------------
class Client:
    """A session on its own connection. `flow` is a generator that yields
    (label, request bytes) and is sent each Response; it returns when the
    client is done. Times of labelled requests go to `samples[label]`."""

    def __init__(self, index, host, port, path, tool, arg):
        self.index = index
        self.host, self.port, self.path = host, port, path
        self.tool, self.arg = tool, arg
        self.value = os.urandom(8).hex()
        self.sock = None
        self.buf = bytearray()
        self.session = None
        self.version = None
        self.next_id = 0
        self.flow = None
        self.label = None
        self.sent_at = 0.0
        self.deadline = 0.0
        self.error = None
        self.samples = {}
        self.ok = 0
        self.errors = 0
        self.leaks = 0
        self.first_errors = []
        self.last_io = 0.0
        self.reconnects = 0

    # -- requests --
    def connect(self):
        self.sock = socket.create_connection((self.host, self.port), timeout=10)
        self.sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        self.sock.setblocking(False)

    def _head(self, method, length):
        h = [f"{method} {self.path} HTTP/1.1", f"Host: {self.host}:{self.port}"]
        if method == "POST":
            h.append("Content-Type: application/json")
            h.append("Accept: application/json, text/event-stream")
            h.append(f"Content-Length: {length}")
        if self.session:
            h.append(f"Mcp-Session-Id: {self.session}")
        if self.version:
            h.append(f"MCP-Protocol-Version: {self.version}")
        return ("\r\n".join(h) + "\r\n\r\n").encode("latin-1")

    def post(self, msg):
        body = json.dumps(msg, separators=(",", ":")).encode()
        return self._head("POST", len(body)) + body

    def delete(self):
        return self._head("DELETE", 0)

    def request(self, method, params=None):
        self.next_id += 1
        msg = {"jsonrpc": "2.0", "id": self.next_id, "method": method}
        if params is not None:
            msg["params"] = params
        return self.post(msg)

    def notify(self, method):
        return self.post({"jsonrpc": "2.0", "method": method})

    def message(self, n):
        return f"{self.value}:{n}"

    def call(self, n):
        return self.request("tools/call", {"name": self.tool, "arguments": {self.arg: self.message(n)}})

    # -- answers --
    def answer(self, resp, what):
        """The result of the request with id next_id, or Failed."""
        if resp.status != 200:
            raise Failed(f"{what}: HTTP {resp.status}: {resp.body[:160]!r}")
        for m in resp.messages():
            if isinstance(m, dict) and m.get("id") == self.next_id and "method" not in m:
                if "error" in m:
                    raise Failed(f"{what}: error {json.dumps(m['error'])[:200]}")
                return m.get("result") or {}
        raise Failed(f"{what}: no answer with id {self.next_id} in the response")

    def check_echo(self, resp, n):
        """Counts the answer of call n: ok, an error, or another client's data."""
        want = self.message(n).encode()
        try:
            foreign = [v for v in VALUE.findall(resp.body) if v[0].decode() != self.value]
            if foreign:
                self.leaks += 1
                raise Failed(f"call {n}: the answer holds another client's value "
                             f"{foreign[0][0].decode()}:{foreign[0][1].decode()}")
            result = self.answer(resp, f"call {n}")
            texts = [c.get("text", "") for c in result.get("content", []) if isinstance(c, dict)]
            if result.get("isError") or len(texts) != 1 or not texts[0].endswith(want.decode()):
                raise Failed(f"call {n}: echo answered {json.dumps(result)[:200]}")
            own = VALUE.findall(texts[0].encode())
            if own != [(self.value.encode(), str(n).encode())]:
                raise Failed(f"call {n}: echo answered {texts[0][:120]!r}, want {want.decode()!r}")
            self.ok += 1
        except (Failed, ValueError) as e:
            self.errors += 1
            if len(self.first_errors) < 3:
                self.first_errors.append(str(e)[:300])


def handshake(c):
    """initialize + notifications/initialized: the session id and version."""
    resp = yield ("init", c.request("initialize", {
        "protocolVersion": PROTOCOL, "capabilities": {},
        "clientInfo": {"name": "mcpbox-bench", "version": "0"}}))
    result = c.answer(resp, "initialize")
    c.session = resp.headers.get("mcp-session-id")
    if not c.session:
        raise Failed("initialize: no Mcp-Session-Id in the answer")
    c.version = result.get("protocolVersion") or PROTOCOL
    resp = yield ("init", c.notify("notifications/initialized"))
    if resp.status not in (200, 202, 204):
        raise Failed(f"notifications/initialized: HTTP {resp.status}: {resp.body[:160]!r}")
    return result


def end_session(c):
    """DELETE the session (a bridge or gateway may answer 200, 204 or 405)."""
    if c.session:
        yield ("delete", c.delete())


# ---------------------------------------------------------------------------
# The loop
# ---------------------------------------------------------------------------
def run(clients, make_flow, max_open=None, ticks=()):
    """Runs make_flow(client) for every client to its end, at most max_open
    of them starting at once (the rest wait for a slot). A client whose
    flow raises gets .error and stops; the others go on. `ticks` is a list
    of (perf_counter time, fn): each fn() is called once, between two
    answers, as soon as its time has come (the throughput window's CPU
    snapshots: no answer is handled while one is taken)."""
    sel = selectors.DefaultSelector()
    ticks = sorted(ticks, key=lambda t: t[0])
    waiting = list(clients)
    waiting.reverse()
    running = 0
    limit = max_open or len(clients)
    pc = time.perf_counter

    def send(c, item):
        c.label, data = item
        # A keep-alive connection the server closed while it was idle (the
        # gateway's header timeout): open a new one, as HTTP clients do.
        if c.sock is not None and pc() - c.last_io > 0.5 and dropped(c.sock):
            try:
                sel.unregister(c.sock)
            except (KeyError, ValueError):
                pass
            c.sock.close()
            c.sock = None
            c.buf.clear()
            c.reconnects += 1
        if c.sock is None:
            c.connect()
        try:
            sel.get_key(c.sock)
        except KeyError:
            sel.register(c.sock, selectors.EVENT_READ, c)
        c.sent_at = c.last_io = pc()
        c.deadline = c.sent_at + (INIT_TIMEOUT if c.label == "init" else CALL_TIMEOUT)
        while data:
            try:
                n = c.sock.send(data)
                data = data[n:]
            except BlockingIOError:
                select.select([], [c.sock], [], 1.0)

    def start(c):
        try:
            if c.sock is None:
                c.connect()
            c.flow = make_flow(c)
            send(c, next(c.flow))
            return True
        except StopIteration:
            return False
        except (Failed, OSError) as e:
            c.error = str(e) or type(e).__name__
            return False

    def finish(c, error=None):
        nonlocal running
        if error and not c.error:
            c.error = error
        try:
            sel.unregister(c.sock)
        except (KeyError, ValueError):
            pass
        running -= 1

    checked = pc()
    while waiting or running:
        while waiting and running < limit:
            c = waiting.pop()
            if start(c):
                running += 1
        if not running:
            continue
        events = sel.select(timeout=1.0)
        now = pc()
        for key, _ in events:
            if ticks and pc() >= ticks[0][0]:
                ticks.pop(0)[1]()
            c = key.data
            try:
                data = c.sock.recv(1 << 16)
            except BlockingIOError:
                continue
            except OSError as e:
                finish(c, f"recv: {e}")
                continue
            if not data:
                finish(c, f"connection closed by the server (waiting for {c.label})")
                continue
            c.buf += data
            c.last_io = now
            while True:
                try:
                    got = parse_response(c.buf)
                except (Failed, ValueError) as e:
                    finish(c, str(e))
                    break
                if got is None:
                    break
                resp, used = got
                del c.buf[:used]
                if 100 <= resp.status < 200:
                    continue
                t = pc()
                c.samples.setdefault(c.label, []).append(t - c.sent_at)
                try:
                    send(c, c.flow.send(resp))
                except StopIteration:
                    finish(c)
                    break
                except (Failed, ValueError, OSError) as e:
                    finish(c, str(e)[:300] or type(e).__name__)
                    break
        while ticks and pc() >= ticks[0][0]:
            ticks.pop(0)[1]()
        if now - checked > 1.0:
            checked = now
            for key in list(sel.get_map().values()):
                c = key.data
                if now > c.deadline:
                    finish(c, f"no answer to {c.label} within {c.deadline - c.sent_at:.0f} s")
    sel.close()


def dropped(sock):
    """Whether the peer closed this idle connection (readable, and EOF)."""
    r, _, _ = select.select([sock], [], [], 0)
    if not r:
        return False
    try:
        return sock.recv(1, socket.MSG_PEEK) == b""
    except BlockingIOError:
        return False
    except OSError:
        return True


def close_all(clients):
    for c in clients:
        if c.sock is not None:
            try:
                c.sock.close()
            except OSError:
                pass
            c.sock = None


def new_clients(url, n, tool, arg):
    u = urllib.parse.urlsplit(url)
    if u.hostname not in ("127.0.0.1", "::1", "localhost"):
        raise Failed(f"refusing non-loopback url {url}")
    return [Client(i, u.hostname, u.port, u.path or "/", tool, arg) for i in range(n)]


def open_sessions(clients, max_open):
    """Every client initialized; Failed when one could not be."""
    def flow(c):
        yield from handshake(c)
    run(clients, flow, max_open)
    bad = [c for c in clients if c.error]
    if bad:
        raise Failed(f"{len(bad)} of {len(clients)} sessions did not open: {bad[0].error}")


def delete_sessions(clients):
    run([c for c in clients if c.sock is not None and c.session], end_session)


# ---------------------------------------------------------------------------
# Statistics and the process under test
# ---------------------------------------------------------------------------
def descendants(pid):
    children = {}
    for d in os.listdir("/proc"):
        if not d.isdigit():
            continue
        try:
            ppid = int(Path(f"/proc/{d}/stat").read_text().rsplit(")", 1)[1].split()[1])
        except (OSError, IndexError, ValueError):
            continue
        children.setdefault(ppid, []).append(int(d))
    out, todo = [], list(children.get(pid, []))
    while todo:
        p = todo.pop()
        out.append(p)
        todo.extend(children.get(p, []))
    return out


CLK_TCK = os.sysconf("SC_CLK_TCK")


def _stat(pid):
    """(ppid, own ticks, reaped children's ticks, own + reaped user ticks)
    from /proc/PID/stat, or None."""
    try:
        f = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except (OSError, IndexError):
        return None
    # after the comm: state ppid ... utime(14) stime(15) cutime(16) cstime(17)
    return int(f[1]), int(f[11]) + int(f[12]), int(f[13]) + int(f[14]), int(f[11]) + int(f[13])


def _runs(pid, program):
    """Whether the process runs PROGRAM: argv[0] or argv[1] (an interpreter's
    script) ends with it. Not further: a bridge names the server it starts
    in its own arguments."""
    try:
        argv = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")[:2]
    except OSError:
        return False
    return any(a.decode(errors="replace").endswith(program) for a in argv)


def tree_cpu(root, upstream):
    """CPU of ROOT's process tree in clock ticks, split in two: the
    'upstream' part (every process that runs UPSTREAM (see _runs),
    and its descendants: the MCP servers) and the 'gateway' part (the rest:
    the gateway or bridge, its helpers, mcpbox's sandbox supervisors).
    A process counts utime+stime of all its threads plus cutime+cstime,
    the times of the children it has reaped: a process that ends between
    two snapshots leaves its time in its reaper's, so the difference of
    two snapshots stays whole (as long as the reaper is in the same part:
    the pid sets are returned so the caller can check none changed), and
    of those ticks the ones in user space (the rest is the kernel's)."""
    procs = {}
    for d in os.listdir("/proc"):
        if d.isdigit():
            st = _stat(int(d))
            if st:
                procs[int(d)] = st
    children = {}
    for pid, (ppid, _, _, _) in procs.items():
        children.setdefault(ppid, []).append(pid)
    parts = {"gateway": [0, [], 0], "upstream": [0, [], 0]}
    todo = [(root, False)] if root in procs else []
    while todo:
        pid, up = todo.pop()
        up = up or _runs(pid, upstream)
        part = parts["upstream" if up else "gateway"]
        part[0] += procs[pid][1] + procs[pid][2]
        part[1].append(pid)
        part[2] += procs[pid][3]
        todo.extend((c, up) for c in children.get(pid, []))
    return {k: (v[0], sorted(v[1]), v[2]) for k, v in parts.items()}


def machine_cpu():
    """(busy, steal, all) jiffies of the whole machine from /proc/stat's cpu
    line: what every process here used, ours and other users'."""
    f = [int(x) for x in Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:]]
    idle = f[3] + f[4]  # idle + iowait
    steal = f[7] if len(f) > 7 else 0
    total = sum(f[:8])
    return total - idle - steal, steal, total


def self_cpu():
    """This process's own CPU seconds (the load client, all its threads)."""
    ru = resource.getrusage(resource.RUSAGE_SELF)
    return ru.ru_utime + ru.ru_stime


class Target(Bridge):
    """CMD in its own session, listening on URL's port; ended as a group
    (a gateway stopping its sandboxes gets longer after SIGTERM)."""

    term_wait = 10


# ---------------------------------------------------------------------------
# subcommands
# ---------------------------------------------------------------------------
COMMON = {"name": None, "out": None, "url": None, "tool": "echo", "arg": "message",
          "open": "16", "ready": "60"}


def parse(argv, spec, doc=__doc__):
    """--opt VALUE options named in spec and COMMON (with defaults), then
    `-- CMD...`; name, out, url and CMD are required."""
    opts, cmd = mcpclient.parse(argv, {**COMMON, **spec}, doc, "mcphttp.py")
    if not (opts["name"] and opts["out"] and opts["url"] and cmd):
        sys.exit(doc)
    return opts, cmd


def measure(o, cmd, body):
    """Starts the target, runs body(result, target), stops it, writes FILE."""
    result = {"name": o["name"], "command": cmd, "url": o["url"], "tool": o["tool"]}
    log = open(str(o["out"]) + ".log", "wb")
    target = None
    try:
        target = Target(cmd, o["url"], log, float(o["ready"]))
        result["pid"] = target.proc.pid
        body(result, target)
        result["status"] = "ok"
    except (Failed, OSError, ValueError, subprocess.SubprocessError) as e:
        result["status"] = "failed"
        result["why"] = str(e)[:300] or type(e).__name__
    finally:
        if target:
            target.stop()
        log.close()
    Path(o["out"]).write_text(json.dumps(result, indent=2))
    return 0


def cpu_snap(snaps, pid, upstream, ok, edge):
    """Appends one CPU snapshot for cpu_figures: PID's process tree split
    into gateway and servers (tree_cpu), the machine, this client; OK is
    the number of answers checked ok so far. EDGE 0 opens the window, 1
    closes it: the client's own time is read outside the /proc scan."""
    if edge == 1:
        client = self_cpu()
    t_scan = time.perf_counter()
    tree, mach = tree_cpu(pid, upstream), machine_cpu()
    scan = time.perf_counter() - t_scan
    if edge == 0:
        client = self_cpu()
    snaps.append({"t": time.perf_counter(), "ok": ok, "client_s": client, "tree": tree,
                  "machine": mach, "scan_s": scan})


def cmd_latency(argv):
    o, cmd = parse(argv, {"calls": "1000", "warmup": "50", "upstream": "mcp-server-everything",
                          "callgrind": None})
    calls, warmup = int(o["calls"]), int(o["warmup"])

    def body(result, target):
        clients = new_clients(o["url"], 1, o["tool"], o["arg"])
        c = clients[0]
        try:
            open_sessions(clients, 1)

            def flow(c):
                resp = yield ("list", c.request("tools/list"))
                tools = c.answer(resp, "tools/list").get("tools", [])
                result["tools"] = len(tools)
                for n in range(1, warmup + 1):
                    resp = yield ("warmup", c.call(n))
                    c.check_echo(resp, n)
                if c.errors:
                    # a refused call is fast: never time refusals as echoes
                    raise Failed(c.first_errors[0])
                if o["callgrind"]:
                    mcpclient.callgrind_zero(target.proc.pid)
                cpu_snap(snaps, target.proc.pid, o["upstream"], c.ok, 0)
                for n in range(warmup + 1, warmup + calls + 1):
                    resp = yield ("call", c.call(n))
                    c.check_echo(resp, n)
                cpu_snap(snaps, target.proc.pid, o["upstream"], c.ok, 1)
                if o["callgrind"]:
                    ir = mcpclient.callgrind_dump(target.proc.pid, o["callgrind"])
                    result.update({"instructions": ir, "instructions_per_call": ir / calls})
                yield from end_session(c)

            snaps = []
            t0 = time.perf_counter()
            run(clients, flow)
            elapsed = time.perf_counter() - t0
            if c.error:
                raise Failed(c.error)
            if c.errors:
                raise Failed(f"{c.errors} of {calls + warmup} echo answers wrong: {c.first_errors[0]}")
            samples = c.samples.get("call", [])
            result["cpu"] = cpu_figures(snaps)
            result.update(summarize_ms(samples))
            result.update({"calls": calls, "warmup": warmup, "protocol": c.version,
                           "calls_per_s": len(samples) / sum(samples),
                           "elapsed_s": elapsed,
                           "samples_ms": [round(x * 1e3, 4) for x in samples]})
        finally:
            close_all(clients)

    return measure(o, cmd, body)


def cmd_throughput(argv):
    o, cmd = parse(argv, {"clients": "32", "seconds": "10", "warmup-seconds": "2",
                          "upstream": "mcp-server-everything"})
    n_clients, secs, warm = int(o["clients"]), float(o["seconds"]), float(o["warmup-seconds"])

    def body(result, target):
        clients = new_clients(o["url"], n_clients, o["tool"], o["arg"])
        try:
            t0 = time.perf_counter()
            open_sessions(clients, int(o["open"]))
            result["open_s"] = time.perf_counter() - t0
            start = time.perf_counter()
            window = (start + warm, start + warm + secs)
            counted = {}
            # CPU over the window: snapshots taken by run() between two
            # answers at the window's edges; the calls they are divided by
            # are the answers checked ok between the two snapshots (see cpu_figures).
            snaps = []

            def snap(edge):
                def take():
                    cpu_snap(snaps, target.proc.pid, o["upstream"], sum(c.ok for c in clients), edge)
                return take

            def flow(c):
                n = 0
                while True:
                    n += 1
                    sent = time.perf_counter()
                    if sent >= window[1]:
                        return
                    resp = yield ("warmup" if sent < window[0] else "call", c.call(n))
                    before = c.ok
                    c.check_echo(resp, n)
                    if sent >= window[0] and time.perf_counter() <= window[1] and c.ok > before:
                        counted[c.index] = counted.get(c.index, 0) + 1

            run(clients, flow, ticks=[(window[0], snap(0)), (window[1], snap(1))])
            bad = [c for c in clients if c.error]
            if bad:
                raise Failed(f"{len(bad)} of {n_clients} clients stopped: {bad[0].error}")
            result["cpu"] = cpu_figures(snaps)
            errors = sum(c.errors for c in clients)
            total = sum(c.ok for c in clients) + errors
            result["errors"] = errors
            result["leaks"] = sum(c.leaks for c in clients)
            result["reconnects"] = sum(c.reconnects for c in clients)
            if errors:
                result["first_errors"] = [e for c in clients for e in c.first_errors][:5]
            if errors > total * 0.01:
                raise Failed(f"{errors} of {total} answers wrong: {result['first_errors'][0]}")
            done = sum(counted.values())
            samples = [x for c in clients for x in c.samples.get("call", [])]
            per_client = sorted(counted.get(c.index, 0) for c in clients)
            result.update({"clients": n_clients, "seconds": secs, "warmup_seconds": warm,
                           "calls": done, "calls_per_s": done / secs,
                           "per_client_min": per_client[0], "per_client_max": per_client[-1]})
            result.update({"latency": summarize_ms(samples)})
            delete_sessions(clients)
        finally:
            close_all(clients)

    return measure(o, cmd, body)


def cpu_figures(snaps):
    """CPU per call over the throughput window from its two snapshots: the
    client (this process), the gateway (the target's tree but the servers),
    the upstream servers, and the machine as a whole (everyone's, other
    users' included), in ms per call; and the ceiling, the calls/s the
    machine's cores would allow with a gateway that costs nothing:
    cores / (client + upstream CPU per call)."""
    if len(snaps) != 2:
        return {"status": "failed", "why": f"{len(snaps)} of 2 CPU snapshots taken (the window did not close)"}
    a, b = snaps
    calls = b["ok"] - a["ok"]
    wall = b["t"] - a["t"]
    if calls <= 0 or wall <= 0:
        return {"status": "failed", "why": "no call answered in the window"}
    cores = len(os.sched_getaffinity(0))
    ms = 1e3 / CLK_TCK
    client = (b["client_s"] - a["client_s"]) * 1e3
    gateway = (b["tree"]["gateway"][0] - a["tree"]["gateway"][0]) * ms
    upstream = (b["tree"]["upstream"][0] - a["tree"]["upstream"][0]) * ms
    # the gateway's time in user space; the rest is the kernel's (system
    # calls, and the wake-ups and context switches of its threads)
    gateway_user = (b["tree"]["gateway"][2] - a["tree"]["gateway"][2]) * ms
    busy, steal, total = (y - x for x, y in zip(a["machine"], b["machine"]))
    # /proc/stat counts every CPU: its jiffies over the window are ~ cores x wall
    machine_busy = busy * ms
    ours = client + gateway + upstream
    per = lambda x: x / calls
    out = {
        "status": "ok", "cores": cores, "cpu_count": os.cpu_count(), "clk_tck": CLK_TCK,
        "window_s": wall, "calls": calls, "calls_per_s": calls / wall,
        "client_ms": client, "gateway_ms": gateway, "upstream_ms": upstream, "total_ms": ours,
        "client_ms_per_call": per(client), "gateway_ms_per_call": per(gateway),
        "gateway_user_ms_per_call": per(gateway_user), "gateway_system_ms_per_call": per(gateway - gateway_user),
        "upstream_ms_per_call": per(upstream), "total_ms_per_call": per(ours),
        # everyone's CPU on the machine in the window, and the part that was not ours
        # (other users' work: this machine is shared), both per call of ours
        "machine_busy_ms_per_call": per(machine_busy), "others_ms_per_call": per(machine_busy - ours),
        "machine_busy_cores": machine_busy / 1e3 / wall, "ours_cores": ours / 1e3 / wall,
        "steal_cores": steal * ms / 1e3 / wall,
        "gateway_pids": len(b["tree"]["gateway"][1]), "upstream_pids": len(b["tree"]["upstream"][1]),
        "pids_changed": a["tree"]["gateway"][1] != b["tree"]["gateway"][1]
                        or a["tree"]["upstream"][1] != b["tree"]["upstream"][1],
        "scan_ms": [a["scan_s"] * 1e3, b["scan_s"] * 1e3],
    }
    base = per(client) + per(upstream)
    out["ceiling_calls_per_s"] = cores * 1e3 / base if base > 0 else None
    # what the single-threaded client alone allows (one core at most), and
    # what the servers alone allow (any client, any gateway, all cores)
    out["client_bound_calls_per_s"] = 1e3 / per(client) if client > 0 else None
    out["upstream_bound_calls_per_s"] = cores * 1e3 / per(upstream) if upstream > 0 else None
    return out


def cmd_sessions(argv):
    o, cmd = parse(argv, {"clients": "100", "settle": "2"})
    n_clients = int(o["clients"])

    def body(result, target):
        pid = target.proc.pid
        time.sleep(float(o["settle"]))
        st = read_status(pid)
        if not st:
            raise Failed("the process is gone")
        result["comm"] = Path(f"/proc/{pid}/comm").read_text().strip()
        result["start_vmrss_kib"] = st["VmRSS"]
        clients = new_clients(o["url"], n_clients, o["tool"], o["arg"])
        try:
            t0 = time.perf_counter()
            open_sessions(clients, int(o["open"]))
            result["open_s"] = time.perf_counter() - t0
            # one call on one session: the sessions answer (not counted)
            c = clients[0]

            def flow(c):
                resp = yield ("call", c.call(1))
                c.check_echo(resp, 1)

            run([c], flow)
            if c.error or c.errors:
                raise Failed(c.error or c.first_errors[0])
            time.sleep(float(o["settle"]))
            st = read_status(pid)
            if not st:
                raise Failed("the process is gone after the sessions opened")
            result.update({"clients": n_clients, "sessions_vmrss_kib": st["VmRSS"],
                           "reconnects": c.reconnects,
                           "sessions_vmhwm_kib": st.get("VmHWM"), "threads": st.get("Threads")})
            same = [p for p in descendants(pid) if _comm(p) == result["comm"]]
            result["own_children"] = len(same)
            result["own_children_vmrss_kib"] = sum((read_status(p) or {}).get("VmRSS", 0) for p in same)
            result["descendants"] = len(descendants(pid))
        finally:
            close_all(clients)

    return measure(o, cmd, body)


def metric(url, name):
    """A sample of the gateway's /metrics (0 while absent)."""
    u = urllib.parse.urlsplit(url)
    with socket.create_connection((u.hostname, u.port), timeout=10) as s:
        s.sendall(f"GET /metrics HTTP/1.1\r\nHost: {u.hostname}:{u.port}\r\n"
                  f"Connection: close\r\n\r\n".encode())
        data = b""
        while chunk := s.recv(65536):
            data += chunk
    for line in data.decode("latin-1").splitlines():
        if line.startswith(name + " "):
            return float(line.split()[-1])
    return 0.0


def cmd_flood(argv):
    o, cmd = parse(argv, {"notes": "800", "kib": "512", "fits": "16", "settle": "2",
                          "timeout": "600"})
    notes, kib, fits = int(o["notes"]), int(o["kib"]), int(o["fits"])

    def call(tool, args):
        def flow(c):
            resp = yield (tool, c.request("tools/call", {"name": tool, "arguments": args}))
            result = c.answer(resp, tool)
            if result.get("isError"):
                raise Failed(f"{tool}: {json.dumps(result)[:200]}")
            c.ok += 1
        return flow

    def body(result, target):
        pid = target.proc.pid
        time.sleep(float(o["settle"]))
        victim, other = new_clients(o["url"], 2, o["tool"], o["arg"])
        try:
            open_sessions([victim, other], 2)
            st = read_status(pid)
            if not st:
                raise Failed("the process is gone")
            result["start_vmrss_kib"] = peak = st["VmRSS"]
            result.update({"notes": notes, "kib": kib, "flood_mib": notes * kib / 1024})
            run([victim], call("notes", {"count": notes, "kib": kib}))
            if victim.error:
                raise Failed(victim.error)
            t0 = time.perf_counter()
            dropped = 0.0
            while dropped + fits < notes:
                if time.perf_counter() - t0 > float(o["timeout"]):
                    raise Failed(f"the flood did not end: {dropped:.0f} of {notes} dropped")
                st = read_status(pid)
                if not st:
                    raise Failed("the process is gone during the flood")
                peak = max(peak, st["VmRSS"])
                run([other], call("slow", {"ms": 0, "kib": 1, "notes": 0}))
                if other.error:
                    raise Failed(f"the other client's call failed: {other.error}")
                dropped = metric(o["url"], 'mcpbox_dropped_messages_total{queue="backlog"}')
                time.sleep(0.05)
            st = read_status(pid) or st
            result.update({"flood_vmrss_peak_kib": max(peak, st["VmRSS"]),
                           "flood_vmhwm_kib": st.get("VmHWM"), "flood_s": time.perf_counter() - t0,
                           "dropped": dropped, "other_calls_ok": other.ok,
                           "buffered_bytes": metric(o["url"], "mcpbox_buffered_bytes")})
        finally:
            close_all([victim, other])

    return measure(o, cmd, body)


def _comm(pid):
    try:
        return Path(f"/proc/{pid}/comm").read_text().strip()
    except OSError:
        return None


def main():
    cmds = {"latency": cmd_latency, "throughput": cmd_throughput, "sessions": cmd_sessions,
            "flood": cmd_flood}
    if len(sys.argv) < 2 or sys.argv[1] not in cmds:
        sys.exit(__doc__)
    return cmds[sys.argv[1]](sys.argv[2:])


if __name__ == "__main__":
    sys.exit(main())
