#!/usr/bin/env python3
"""The sandbox lifecycle of `mcpbox serve`, measured (bench/run's lifecycle
section; Python 3 standard library only).

Every subcommand starts its own gateway (`mcpbox serve`, one anonymous
loopback client, one server `ws`: the project's `workspace` test server,
whose `count` tool adds one to an in-memory counter) in DIR, with its state
directory in DIR/state, talks Streamable HTTP to it (mcpclient.Http, one
keep-alive connection per session, `Mcpbox-Task: NAME` on every POST so
each task gets a sandbox of its own), reads the lifecycle through the
control socket DIR/state/control.sock (JSON lines, one request per
connection: what `mcpbox sandboxes ...` sends, without a process start per
request), and ends the gateway's process group.

  lifecycle.py resume --out FILE --dir DIR --mcpbox BIN --server BIN
                      [--runs 30] [--idle pause|stop] [--freezer v1|v2]
                      [--tier namespaces|gvisor]
      idle=pause: `[idle] pause = "1s"`; idle=stop: `pause = "off", stop =
      "1s"`. One task session; RUNS times: wait until the sandbox shows
      paused (stopped), time one `tools/call count` (the first after the
      pause: it thaws or restarts the server), then one more at once (the
      baseline: a running sandbox). The counter must go on after a pause and
      start again at 1 after a stop (the server really was restarted).
      With idle=stop also RUNS cold starts: a session of a new task,
      initialize + notifications/initialized + the first call, timed.
  lifecycle.py density --out FILE --dir DIR --mcpbox BIN --server BIN
                       [--count 500] [--bwrap bwrap]
      `[idle] pause = "1s"`; COUNT tasks, each initialized and one call
      made; once all show paused: PSS and RSS (/proc/PID/smaps_rollup) of
      every process in the sandboxes' cgroups, the gateway's own, and the
      sandboxes' cpu_usec over 2 s. Then the alternatives: COUNT plain
      processes of the server (pipes from this script) and COUNT under
      bwrap, each initialized and one call made, measured the same way.
  lifecycle.py cycles --out FILE --dir DIR --mcpbox BIN --server BIN
                      [--count 1000] [--bwrap bwrap]
      COUNT cycles of: a session of a new task, initialize + one call, then
      `destroy` of its sandbox over the control socket; before and after:
      the gateway's fds, threads, children and mounts, the host's mounts and
      processes, cgroup dirs `mcpbox-sb-*` under /sys/fs/cgroup, workspace
      dirs under state/sandboxes. Interleaved in blocks of 50 with the
      alternatives: the server spawned directly and under bwrap (spawn,
      initialize, one call, kill).
  lifecycle.py tables OUT
      the tables of OUT/lifecycle/*.json into OUT/extra/ (tools.py report
      prints them).

Each measurement writes one JSON object to FILE with "status": "ok" or
"failed" and "why"; the exit code is 0 either way unless the arguments are
wrong. Nothing here judges a figure: the targets are in the notes.
"""

import json
import os
import resource
import shutil
import socket
import subprocess
import sys
import time
from pathlib import Path

# beside this file: the clients, statistics and process handling, shared
import mcpclient
import tools
from mcpclient import Failed, Http, Stdio, handshake, pct, proc_fields, read_status
from mcphttp import Target, descendants

CALL = {"name": "count", "arguments": {}}
CGROUP = Path("/sys/fs/cgroup")
PREFIX = "mcpbox-sb-"
BLOCK = 50


# ---------------------------------------------------------------------------
# The gateway under test
# ---------------------------------------------------------------------------
def free_port():
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()
    return port


class Gateway:
    """`mcpbox serve` on a free loopback port with its config, policy,
    server binary and state directory in `dir`."""

    def __init__(self, o, idle, env=None, tier=None):
        self.dir = Path(o["dir"])
        self.state = self.dir / "state"
        if self.state.exists():
            shutil.rmtree(self.state)
        bindir = self.dir / "bin"
        bindir.mkdir(parents=True, exist_ok=True)
        self.server = bindir / Path(o["server"]).name
        shutil.copy(o["server"], self.server)
        # As root the sandboxed server runs as uid 65534: it must reach its binary.
        for d in (self.dir, bindir):
            d.chmod(0o755)
        self.server.chmod(0o755)
        port = free_port()
        (self.dir / "ws.toml").write_text(
            '# written by bench/lifecycle.py: the workspace test server\n'
            '[server]\nname = "ws"\n\n'
            + (f'[sandbox]\nisolation = "{tier}"\n\n' if tier else '')
            + f'[[filesystem.mounts]]\nhost = "{bindir}"\nat = "{bindir}"\n\n'
            '[tools]\ndefault = "allow"\n')
        (self.dir / "serve.toml").write_text(
            '# written by bench/lifecycle.py\n'
            f'[listen]\naddress = "127.0.0.1:{port}"\n\n'
            # far above the load: the figures measure the lifecycle, not the limiter
            '[limits]\nmax_concurrent = 4096\nrate_per_second = 1000000\nburst = 1000000\n'
            'max_sessions_per_client = 8192\nmax_streams_per_client = 1024\n'
            'max_sandboxes_per_client = 8192\n'
            'header_timeout = "120s"\n\n'
            f'[idle]\n{idle}\n\n'
            '[[clients]]\nname = "bench"\ndangerously_allow_anonymous = true\n\n'
            f'[[servers]]\nname = "ws"\npolicy = "{self.dir / "ws.toml"}"\n'
            f'command = ["{self.server}"]\n')
        self.url = f"http://127.0.0.1:{port}/servers/ws/mcp"
        self.log_path = self.dir / "gateway.log"
        self.log = open(self.log_path, "wb")
        saved = dict(os.environ)
        os.environ["MCPBOX_STATE_DIR"] = str(self.state)
        os.environ.update(env or {})
        try:
            self.target = Target([o["mcpbox"], "serve", "--config", str(self.dir / "serve.toml")],
                                 self.url, self.log, 60.0)
        finally:
            os.environ.clear()
            os.environ.update(saved)
        self.pid = self.target.proc.pid
        deadline = time.monotonic() + 10
        while not (self.state / "control.sock").exists():
            if time.monotonic() > deadline:
                raise Failed("no control socket at state/control.sock")
            time.sleep(0.05)

    def control(self, op, **args):
        """One control-socket request: its result, or Failed."""
        s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        s.settimeout(60)
        try:
            s.connect(str(self.state / "control.sock"))
            s.sendall(json.dumps({"op": op, **args}).encode() + b"\n")
            buf = b""
            while not buf.endswith(b"\n"):
                chunk = s.recv(1 << 16)
                if not chunk:
                    break
                buf += chunk
        finally:
            s.close()
        r = json.loads(buf)
        if not r.get("ok"):
            raise Failed(f"control {op}: {r.get('error')}")
        return r["result"]

    def session(self, task):
        """A task session, initialized."""
        t = Http(self.url, {"Mcpbox-Task": task})
        handshake(t)
        return t

    def sandbox(self, task):
        mine = [s for s in self.control("list") if s.get("task") == task]
        if len(mine) != 1:
            raise Failed(f"{len(mine)} sandboxes of task {task}")
        return mine[0]

    def wait_state(self, sid, want, timeout=30.0):
        """Polls `show` until the sandbox is in state `want`; seconds waited."""
        t0 = time.perf_counter()
        while True:
            info = self.control("show", id=sid)
            if info["state"] == want:
                return time.perf_counter() - t0, info
            if time.perf_counter() - t0 > timeout:
                raise Failed(f"{sid} not {want} after {timeout:.0f} s: {json.dumps(info)[:200]}")
            time.sleep(0.01)

    def stderr_tail(self, n=20):
        self.log.flush()
        try:
            return self.log_path.read_text(errors="replace").splitlines()[-n:]
        except OSError:
            return []

    def stop(self):
        self.target.stop()
        self.log.close()


def count_of(res):
    texts = [c.get("text", "") for c in res.get("content", []) if isinstance(c, dict)]
    if res.get("isError") or len(texts) != 1 or not texts[0].strip().isdigit():
        raise Failed(f"count answered {json.dumps(res)[:200]}")
    return int(texts[0])


def timed_call(t):
    t0 = time.perf_counter()
    res, _ = t.request("tools/call", CALL)
    return time.perf_counter() - t0, count_of(res)


def ms_stats(samples_s):
    """p50, p95, mean and n of samples in seconds, in ms."""
    ms = sorted(x * 1e3 for x in samples_s)
    if not ms:
        return {"n": 0}
    return {"n": len(ms), "p50_ms": pct(ms, 50), "p95_ms": pct(ms, 95),
            "mean_ms": sum(ms) / len(ms), "min_ms": ms[0], "max_ms": ms[-1]}


def measure(o, body):
    """Runs body(result), writes FILE with its status."""
    result = {}
    try:
        body(result)
        result["status"] = "ok"
    except (Failed, OSError, ValueError, KeyError) as e:
        result["status"] = "failed"
        result["why"] = (str(e)[:400] or type(e).__name__)
    mcpclient.write(o["out"], result)
    return 0


def with_gateway(result, gw, body):
    try:
        body(gw)
    except (Failed, OSError, ValueError, KeyError):
        result["gateway_stderr_tail"] = gw.stderr_tail()
        raise
    finally:
        t0 = time.perf_counter()
        gw.stop()
        # SIGTERM, then SIGKILL after Target.term_wait: -9 means it did not end in time
        result["gateway_shutdown_s"] = time.perf_counter() - t0
        result["gateway_exit"] = gw.target.proc.returncode


COMMON = {"out": None, "dir": None, "mcpbox": None, "server": None}


def parse(argv, spec):
    o, _ = mcpclient.parse(argv, {**COMMON, **spec}, __doc__, "lifecycle.py")
    if not all(o[k] for k in COMMON):
        sys.exit(__doc__)
    return o


# ---------------------------------------------------------------------------
# resume: the first call after a pause or a stop
# ---------------------------------------------------------------------------
def cmd_resume(argv):
    o = parse(argv, {"runs": "30", "idle": "pause", "freezer": "", "tier": ""})
    runs, idle = int(o["runs"]), o["idle"]
    table = {"pause": 'pause = "1s"\nstop = "off"\ndestroy = "off"',
             "stop": 'pause = "off"\nstop = "1s"\ndestroy = "off"'}[idle]
    want = {"pause": "paused", "stop": "stopped"}[idle]
    env = {"MCPBOX_FREEZER": o["freezer"]} if o["freezer"] else {}

    def body(result):
        result.update({"idle": idle, "freezer_forced": o["freezer"] or None, "runs": runs,
                       "tier": o["tier"] or "namespaces"})
        gw = Gateway(o, table, env, o["tier"] or None)

        def run(gw):
            t = gw.session("resume")
            first, second, waited, kept = [], [], [], 0
            try:
                _, n = timed_call(t)
                for _ in range(3):
                    _, n = timed_call(t)
                sid = gw.sandbox("resume")["id"]
                result["sandbox"] = sid
                for _ in range(runs):
                    w, info = gw.wait_state(sid, want)
                    waited.append(w)
                    result["freezer"] = info.get("freezer")
                    dt, got = timed_call(t)
                    first.append(dt)
                    # pause keeps the server's memory; stop restarts it
                    kept += got == n + 1
                    dt, n = timed_call(t)
                    second.append(dt)
            finally:
                t.close()
            result["after"] = ms_stats(first)
            result["baseline"] = ms_stats(second)
            result["added"] = ms_stats([a - b for a, b in zip(first, second)])
            result["state_kept"] = kept
            result["waited_for_state"] = ms_stats(waited)
            result["samples_after_ms"] = [round(x * 1e3, 3) for x in first]
            result["samples_baseline_ms"] = [round(x * 1e3, 3) for x in second]
            if idle == "stop":
                cold = []
                for i in range(runs):
                    t0 = time.perf_counter()
                    c = gw.session(f"cold-{i}")
                    try:
                        c.request("tools/call", CALL)
                        cold.append(time.perf_counter() - t0)
                    finally:
                        c.close()
                result["cold"] = ms_stats(cold)
                result["samples_cold_ms"] = [round(x * 1e3, 3) for x in cold]

        with_gateway(result, gw, run)

    return measure(o, body)


# ---------------------------------------------------------------------------
# density: many paused sandboxes, and the same server as plain processes
# ---------------------------------------------------------------------------
def sandbox_cgroups():
    """{sandbox cgroup name: [dirs]} of every `mcpbox-sb-*` dir under
    /sys/fs/cgroup (v2 and each v1 hierarchy hold one each)."""
    found, stack = {}, [(CGROUP, 0)]
    while stack:
        d, depth = stack.pop()
        try:
            entries = list(os.scandir(d))
        except OSError:
            continue
        for e in entries:
            if not e.is_dir(follow_symlinks=False):
                continue
            if e.name.startswith(PREFIX):
                found.setdefault(e.name, []).append(Path(e.path))
            elif depth < 8:
                stack.append((Path(e.path), depth + 1))
    return found


def cgroup_pids(dirs):
    """Every pid in the cgroup dirs and the groups below them."""
    pids = set()
    for top in dirs:
        for root, _, files in os.walk(top):
            if "cgroup.procs" in files:
                try:
                    pids.update(int(x) for x in Path(root, "cgroup.procs").read_text().split())
                except (OSError, ValueError):
                    pass
    return pids


def smaps(pid):
    """(Pss, Rss) in KiB from /proc/PID/smaps_rollup, or None."""
    f = proc_fields(f"/proc/{pid}/smaps_rollup", ("Pss", "Rss"))
    return (f.get("Pss", 0), f.get("Rss", 0)) if f else None


def memory_of(pids):
    pss = rss = n = 0
    for p in pids:
        m = smaps(p)
        if m:
            pss, rss, n = pss + m[0], rss + m[1], n + 1
    return {"processes": n, "pss_kib": pss, "rss_kib": rss}


def cpu_ticks(pids):
    """utime + stime of the pids, in clock ticks."""
    total = 0
    for p in pids:
        try:
            f = Path(f"/proc/{p}/stat").read_text().rsplit(")", 1)[1].split()
            total += int(f[11]) + int(f[12])
        except (OSError, IndexError, ValueError):
            pass
    return total


def raise_nofile():
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft < hard:
        resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))


def plain_density(cmd, count):
    """COUNT copies of cmd, each initialized and one call made: memory of
    the processes (and their children) and their CPU over 2 s."""
    procs = []
    try:
        t0 = time.perf_counter()
        for _ in range(count):
            s = Stdio(cmd, subprocess.DEVNULL)
            procs.append(s)
            handshake(s)
            count_of(s.request("tools/call", CALL)[0])
        opened = time.perf_counter() - t0
        time.sleep(1)
        pids = {s.proc.pid for s in procs}
        for s in procs:
            pids.update(descendants(s.proc.pid))
        r = memory_of(pids)
        c0 = cpu_ticks(pids)
        time.sleep(2)
        r["cpu_ms_2s"] = (cpu_ticks(pids) - c0) * 1e3 / os.sysconf("SC_CLK_TCK")
        r["open_s"] = opened
        r["count"] = count
        return r
    finally:
        for s in procs:
            stop_stdio(s)


def stop_stdio(s):
    s.proc.kill()
    s.proc.wait()
    for f in (s.proc.stdin, s.proc.stdout):
        try:
            f.close()
        except OSError:
            pass


def bwrap_cmd(bwrap, server):
    return [bwrap, "--unshare-all", "--die-with-parent", "--ro-bind", "/", "/",
            "--proc", "/proc", "--dev", "/dev", "--tmpfs", "/tmp", "--", server]


def cmd_density(argv):
    o = parse(argv, {"count": "500", "bwrap": "bwrap"})
    count = int(o["count"])
    raise_nofile()

    def body(result):
        result["count"] = count
        gw = Gateway(o, 'pause = "1s"\nstop = "off"\ndestroy = "off"')

        def run(gw):
            gst = read_status(gw.pid)
            result["gateway_start_vmrss_kib"] = gst["VmRSS"] if gst else None
            t0 = time.perf_counter()
            for i in range(count):
                t = gw.session(f"d-{i}")
                try:
                    count_of(t.request("tools/call", CALL)[0])
                finally:
                    # the session stays (no DELETE), as an agent that went away
                    t.conn.close()
            result["open_s"] = time.perf_counter() - t0
            deadline = time.monotonic() + 60 + count * 0.05
            while True:
                boxes = gw.control("list")
                states = {}
                for b in boxes:
                    states[b["state"]] = states.get(b["state"], 0) + 1
                if states.get("paused", 0) >= count or time.monotonic() > deadline:
                    break
                time.sleep(0.5)
            result["states"] = states
            result["sandboxes"] = len(boxes)
            if states.get("paused", 0) < count:
                raise Failed(f"not all paused: {states}")
            result["freezers"] = sorted({str(b.get("freezer")) for b in boxes})
            groups = sandbox_cgroups()
            # a sandbox's cgroup is named mcpbox-<its id>
            ids = {"mcpbox-" + b["id"] for b in boxes}
            mine = {k: v for k, v in groups.items() if k in ids}
            result["sandbox_cgroups_found"] = len(mine)
            pids = set()
            for dirs in mine.values():
                pids |= cgroup_pids(dirs)
            result["sandboxes_mem"] = memory_of(pids)
            result["reported_processes"] = sum(b.get("processes", 0) for b in boxes)
            result["gateway_mem"] = memory_of([gw.pid])
            st = read_status(gw.pid) or {}
            result["gateway_threads"] = st.get("Threads")
            # the gateway's other descendants (outside every sandbox cgroup)
            others = set(descendants(gw.pid)) - pids
            result["gateway_other_descendants_mem"] = memory_of(others)
            c0 = sum(b.get("cpu_usec") or 0 for b in boxes)
            g0 = cpu_ticks([gw.pid])
            time.sleep(2)
            # the gateway's CPU before the next list: answering it is not idle work
            g1 = cpu_ticks([gw.pid])
            boxes2 = gw.control("list")
            result["sandboxes_cpu_usec_2s"] = sum(b.get("cpu_usec") or 0 for b in boxes2) - c0
            result["gateway_cpu_ms_2s"] = (g1 - g0) * 1e3 / os.sysconf("SC_CLK_TCK")
            result["paused_after_2s"] = sum(b["state"] == "paused" for b in boxes2)

        with_gateway(result, gw, run)
        for name, cmd in (("plain", [o["server"]]), ("bwrap", bwrap_cmd(o["bwrap"], o["server"]))):
            try:
                result[name] = plain_density(cmd, count)
            except (Failed, OSError, ValueError) as e:
                result[name] = {"status": "failed", "why": str(e)[:300] or type(e).__name__}

    return measure(o, body)


# ---------------------------------------------------------------------------
# cycles: create and destroy, counting what is left
# ---------------------------------------------------------------------------
def counts(gw, destroyed=()):
    """What a leak would show in; `destroyed`: ids of sandboxes destroyed."""
    groups = sandbox_cgroups()

    def lines(p):
        try:
            return len(Path(p).read_text().splitlines())
        except OSError:
            return None

    st = read_status(gw.pid) or {}
    kids = descendants(gw.pid)
    children = 0
    for p in kids:
        try:
            if int(Path(f"/proc/{p}/stat").read_text().rsplit(")", 1)[1].split()[1]) == gw.pid:
                children += 1
        except (OSError, IndexError, ValueError):
            pass
    ws = gw.state / "sandboxes"
    return {
        "gateway fds": len(os.listdir(f"/proc/{gw.pid}/fd")),
        "gateway threads": st.get("Threads"),
        "gateway children": children,
        "gateway descendants": len(kids),
        "gateway mounts": lines(f"/proc/{gw.pid}/mountinfo"),
        "host mounts": lines("/proc/self/mountinfo"),
        "host processes": sum(1 for d in os.listdir("/proc") if d.isdigit()),
        # host-wide: other gateways (test suites) on this machine add theirs
        "cgroup dirs mcpbox-sb-* (host)": sum(len(v) for v in groups.values()),
        "cgroup dirs of destroyed sandboxes": sum(len(groups.get("mcpbox-" + i, ())) for i in destroyed),
        "workspace dirs": len(os.listdir(ws)) if ws.is_dir() else 0,
        "sandboxes listed": len(gw.control("list")),
        "gateway VmRSS KiB": st.get("VmRSS"),
    }


# Figures that may move without anything leaking: shown, not judged.
NOT_LEAKS = {"gateway VmRSS KiB", "host processes", "cgroup dirs mcpbox-sb-* (host)"}


def direct_cycle(cmd):
    t0 = time.perf_counter()
    s = Stdio(cmd, subprocess.DEVNULL)
    try:
        handshake(s)
        count_of(s.request("tools/call", CALL)[0])
    finally:
        stop_stdio(s)
    return time.perf_counter() - t0


def cmd_cycles(argv):
    o = parse(argv, {"count": "1000", "bwrap": "bwrap"})
    count = int(o["count"])

    def body(result):
        result["count"] = count
        gw = Gateway(o, 'pause = "off"\nstop = "off"\ndestroy = "off"')
        alts = {"direct": [o["server"]], "bwrap": bwrap_cmd(o["bwrap"], o["server"])}

        def cycle(i):
            t0 = time.perf_counter()
            t = gw.session(f"c-{i}")
            try:
                count_of(t.request("tools/call", CALL)[0])
                t1 = time.perf_counter()
                sid = gw.sandbox(f"c-{i}")["id"]
                t2 = time.perf_counter()
                td = gw.control("destroy", id=sid)
                t3 = time.perf_counter()
            finally:
                t.close()
            destroyed.append(sid)
            if td.get("left"):
                unclean.append({"id": sid, "left": td["left"][:5]})
            return t1 - t0, t3 - t2, (t1 - t0) + (t3 - t2)

        unclean, destroyed = [], []

        def run(gw):
            for i in range(3):  # warm-up: first-use allocations are not leaks
                cycle(f"warm-{i}")
            time.sleep(1)
            before = counts(gw)
            warm = len(destroyed)
            samples = {"mcpbox": [], "mcpbox create": [], "mcpbox destroy": [],
                       "direct": [], "bwrap": []}
            errors = {k: 0 for k in alts}
            first_errors = {}
            t0 = time.perf_counter()
            for start in range(0, count, BLOCK):
                n = min(BLOCK, count - start)
                for i in range(start, start + n):
                    c, d, total = cycle(i)
                    samples["mcpbox create"].append(c)
                    samples["mcpbox destroy"].append(d)
                    samples["mcpbox"].append(total)
                for name, cmd in alts.items():
                    for _ in range(n):
                        try:
                            samples[name].append(direct_cycle(cmd))
                        except (Failed, OSError, ValueError) as e:
                            errors[name] += 1
                            first_errors.setdefault(name, str(e)[:200])
            result["elapsed_s"] = time.perf_counter() - t0
            # the last teardowns may still be exiting: wait for the counts to settle
            deadline = time.monotonic() + 10
            while True:
                after = counts(gw, destroyed[warm:])
                if all(after[k] == before[k] for k in before if k not in NOT_LEAKS) \
                        or time.monotonic() > deadline:
                    break
                time.sleep(0.25)
            result["before"], result["after"] = before, after
            result["leaked"] = {k: after[k] - before[k] for k in before
                                if k not in NOT_LEAKS and after[k] is not None and before[k] is not None}
            result["unclean_teardowns"] = len(unclean)
            result["unclean_first"] = unclean[:5]
            result["alt_errors"], result["alt_first_errors"] = errors, first_errors
            result["times"] = {k: ms_stats(v) for k, v in samples.items()}

        with_gateway(result, gw, run)

    return measure(o, body)


# ---------------------------------------------------------------------------
# tables
# ---------------------------------------------------------------------------
def ratio(a, b):
    return a / b if a is not None and b else None


def load(d, name):
    try:
        return json.loads((d / f"{name}.json").read_text())
    except (OSError, ValueError):
        return {"status": "failed", "why": f"no {name}.json"}


def mib(kib):
    return kib / 1024 if kib is not None else None


def shutdown_note(r):
    """How the gateway ended on SIGTERM (-9: it did not within Target.term_wait s)."""
    return (f"gateway on SIGTERM: exit {r.get('gateway_exit')} after {r.get('gateway_shutdown_s', 0):.2f} s"
            + (" (killed: it did not end within 10 s)" if r.get("gateway_exit") == -9 else ""))


def failed(r, name, rows, notes):
    """A failed row, and the gateway's last words as notes."""
    rows.append([name, f"failed: {r.get('why', '')}"])
    notes.extend(f"gateway: {line}" for line in r.get("gateway_stderr_tail", [])[-5:])


def cmd_tables(argv):
    if len(argv) != 1:
        sys.exit("usage: lifecycle.py tables OUT")
    out = Path(argv[0])
    d = out / "lifecycle"

    # 1. resume latency
    rows, notes = [], []
    for name in ("pause-v2", "pause-v1", "stop"):
        r = load(d, f"resume-{name}")
        if r.get("status") != "ok":
            failed(r, f"after {name}", rows, notes)
            continue
        b, a, add = r["baseline"], r["after"], r["added"]
        label = f"{name} (freezer {r.get('freezer')})" if name.startswith("pause") else name
        rows.append([f"running, {label} gateway", b["n"], b["p50_ms"], b["p95_ms"], None, None, 1.0, None])
        kept = f"{r['state_kept']}/{r['runs']}"
        rows.append([f"first call after {label}", a["n"], a["p50_ms"], a["p95_ms"],
                     add["p50_ms"], add["p95_ms"], ratio(a["p50_ms"], b["p50_ms"]), kept])
        if name == "stop" and r.get("cold"):
            c = r["cold"]
            rows.append(["cold start (new task: initialize + call)", c["n"], c["p50_ms"], c["p95_ms"],
                         None, None, ratio(c["p50_ms"], b["p50_ms"]), None])
            notes.append(f"after stop / cold start (p50): {ratio(a['p50_ms'], c['p50_ms']):.2f}")
        notes.append(f"{name}: the idle state was reached {r['waited_for_state']['p50_ms'] / 1e3:.2f} s "
                     f"(p50) after the last call; {shutdown_note(r)}")
    notes += ["added = first call after the pause (stop) minus the next call, pairwise; "
              "ratio = p50 over the running baseline's p50",
              "counter column: calls where the count went on (pause keeps the server's memory: "
              "want all) / after stop: want 0 (restarted, initialize replayed)",
              "target: at most 5 ms added after a pause; after a stop about one cold start"]
    tools.write_table(out, "lifecycle-1-resume", "lifecycle: the first call after an idle pause or stop (tools/call count)",
                      ["row", "n", "p50 ms", "p95 ms", "added p50 ms", "added p95 ms", "x running", "counter kept"],
                      rows, notes)

    # 2. density
    r = load(d, "density")
    rows, notes = [], []
    if r.get("status") != "ok":
        failed(r, "mcpbox sandboxes", rows, notes)
    else:
        n = r["count"]
        sb, g = r["sandboxes_mem"], r["gateway_mem"]
        plain = r.get("plain", {})
        base = plain.get("pss_kib") / n if plain.get("pss_kib") else None
        both = sb["pss_kib"] + g["pss_kib"] + r["gateway_other_descendants_mem"]["pss_kib"]

        def row(name, procs, pss, rss, cpu):
            per = pss / n if pss is not None else None
            rows.append([name, procs, mib(pss), per, mib(rss), rss / n if rss is not None else None,
                         cpu, ratio(per, base)])

        row(f"mcpbox: {n} paused sandboxes (their cgroups)", sb["processes"], sb["pss_kib"], sb["rss_kib"],
            r["sandboxes_cpu_usec_2s"] / 1e3)
        row("mcpbox serve itself", g["processes"], g["pss_kib"], g["rss_kib"], r["gateway_cpu_ms_2s"])
        row("mcpbox total (sandboxes + gateway + other children)",
            sb["processes"] + g["processes"] + r["gateway_other_descendants_mem"]["processes"],
            both, sb["rss_kib"] + g["rss_kib"] + r["gateway_other_descendants_mem"]["rss_kib"],
            r["sandboxes_cpu_usec_2s"] / 1e3 + r["gateway_cpu_ms_2s"])
        for name in ("plain", "bwrap"):
            a = r.get(name, {})
            if a.get("status") == "failed" or "pss_kib" not in a:
                rows.append([f"{name}: {n} processes", f"failed: {a.get('why', '')}"])
            else:
                row(f"{name}: {n} processes (pipes, no sandbox)" if name == "plain" else
                    f"bwrap: {n} sandboxes", a["processes"], a["pss_kib"], a["rss_kib"], a["cpu_ms_2s"])
        notes += [f"{r['sandboxes']} sandboxes {r['states']}, freezer {', '.join(r['freezers'])}; "
                  f"{r['sandbox_cgroups_found']} sandbox cgroups found, {r['reported_processes']} processes "
                  f"reported by sandboxes list; opened in {r['open_s']:.1f} s; gateway {r['gateway_threads']} threads",
                  "per = KiB per sandbox (per server process for the alternatives); PSS from "
                  "/proc/PID/smaps_rollup (shared pages split among their users), RSS counts them in every process",
                  "x plain = PSS per sandbox over PSS per plain process; cpu = CPU time over 2 s while idle "
                  "(sandboxes: cpu_usec of their cgroups; others: utime+stime)",
                  "target: CPU near zero while paused"]
        bw = r.get("bwrap", {})
        if bw.get("pss_kib"):
            notes.append(f"PSS per sandbox, mcpbox (cgroups only) / bwrap: {sb['pss_kib'] / bw['pss_kib']:.2f}; "
                         f"mcpbox total / bwrap: {both / bw['pss_kib']:.2f}")
        notes.append(shutdown_note(r))
    tools.write_table(out, "lifecycle-2-density", "lifecycle: density, idle sandboxes of the workspace server",
                      ["row", "processes", "PSS MiB", "PSS KiB per", "RSS MiB", "RSS KiB per", "cpu ms in 2 s",
                       "x plain"], rows, notes)

    # 3. cycles
    r = load(d, "cycles")
    rows, notes = [], []
    if r.get("status") != "ok":
        failed(r, "mcpbox", rows, notes)
        tools.write_table(out, "lifecycle-3-cycles", "lifecycle: create/destroy cycles",
                          ["row", "n", "p50 ms", "mean ms", "p95 ms", "x direct", "x bwrap"], rows, notes)
    else:
        t = r["times"]
        dp = t.get("direct", {}).get("p50_ms")
        bp = t.get("bwrap", {}).get("p50_ms")
        labels = {"mcpbox": "mcpbox: new task (initialize + call) + destroy",
                  "mcpbox create": "  of which initialize + call",
                  "mcpbox destroy": "  of which destroy (control socket)",
                  "direct": "direct: spawn, initialize, call, kill",
                  "bwrap": "bwrap: the same under bwrap --unshare-all"}
        for k in ("mcpbox", "mcpbox create", "mcpbox destroy", "direct", "bwrap"):
            s = t.get(k, {})
            if not s.get("n"):
                rows.append([labels[k], f"failed: {r.get('alt_first_errors', {}).get(k, 'no samples')}"])
                continue
            rows.append([labels[k], s["n"], s["p50_ms"], s["mean_ms"], s["p95_ms"],
                         ratio(s["p50_ms"], dp), ratio(s["p50_ms"], bp)])
        notes.append(f"{r['count']} cycles each, interleaved in blocks of {BLOCK}; "
                     f"{r['unclean_teardowns']} teardowns reported something left; "
                     f"alternative errors {r['alt_errors']}; {shutdown_note(r)}")
        tools.write_table(out, "lifecycle-3-cycles", "lifecycle: create/destroy cycles, time per cycle",
                          ["row", "n", "p50 ms", "mean ms", "p95 ms", "x direct", "x bwrap"], rows, notes)
        rows = []
        for k in r["before"]:
            leak = r["leaked"].get(k)
            rows.append([k, r["before"][k], r["after"][k], leak if k not in NOT_LEAKS else "(not judged)"])
        tools.write_table(out, "lifecycle-4-leaks", f"lifecycle: what {r['count']} create/destroy cycles left behind",
                          ["resource", "before", "after", "leaked"], rows,
                          ["before: after 3 warm-up cycles; after: once the counts settle (10 s at most)",
                           "target: zero leaked everywhere"])
    return 0


def main():
    cmds = {"resume": cmd_resume, "density": cmd_density, "cycles": cmd_cycles, "tables": cmd_tables}
    if len(sys.argv) < 2 or sys.argv[1] not in cmds:
        sys.exit(__doc__)
    return cmds[sys.argv[1]](sys.argv[2:])


if __name__ == "__main__":
    sys.exit(main())
