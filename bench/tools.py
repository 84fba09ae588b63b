#!/usr/bin/env python3
"""Helpers for bench/run (Python 3 standard library only).

  tools.py mem --name NAME --out FILE -- CMD [ARGS...]
      Runs CMD and samples VmRSS/VmHWM of that process (not its children)
      from /proc/PID/status until it exits; writes JSON to FILE.
  tools.py relay DIR
      Pools DIR/relay/{latency,coldstart,memory}/*.json (written by
      mcpclient.py) into tables under DIR/extra/.
  tools.py large DIR
      Pools DIR/large/rows/*.json (mcpclient.py large) into the large-result
      throughput table under DIR/extra/.
  tools.py egress DIR
      Parses DIR/egress/egress_bench.txt (the stdout of crates/egress's
      egress_bench example) and DIR/egress/e2e/*.json (httpbench.py client
      lines) into tables under DIR/extra/.
  tools.py alternate DIR RUNS WARMUP NAME=CMD...
      Times the start-up rows' commands in turn, one run each, into
      DIR/NAME.json (hyperfine's export format).
  tools.py serve DIR
      Pools DIR/serve/{latency,throughput,sessions,flood,load}/*.json (written by
      mcphttp.py and load.py) into the serve tables under DIR/extra/.
  tools.py selfexe SRC DST LINK
      Copies the mcpbox binary SRC to DST with every "/proc/self/exe" in it
      (string constants and the two 8-byte immediates a short copy is
      compiled to) replaced by LINK (14 bytes, the same length), and makes
      LINK a symlink to DST: valgrind 3.19 cannot exec /proc/self/exe (it
      would run the valgrind tool itself), and mcpbox starts its sandbox
      helper and host-command supervisor so. Only for the callgrind rows.
  tools.py report DIR
      Prints the tables for one bench/run result directory and writes
      DIR/summary.json; with MCPBOX_BEFORE rows, also the before/after
      table (DIR/before-after/*.json, written by the section tools) with
      after/before for each figure.
"""

import json
import os
import re
import statistics
import subprocess
import sys
import time
from pathlib import Path

# Start-up rows in this order; anything else follows alphabetically.
STARTUP_ORDER = ["true", "mcpbox", "mcpbox-dynamic", "before", "bwrap", "srt"]
BASELINE = "true"
# Targets from the issues, printed under the tables (never asserted).
STARTUP_TARGET = "target (issue 2): mcpbox under 3 ms added over bare true, and faster than bwrap"
MEMORY_TARGET = "target (issue 2): mcpbox's own resident memory under 10 MiB while the sandbox runs"


def read_status(pid):
    """VmRSS and VmHWM in KiB, or None once the process is gone or a zombie."""
    try:
        text = Path(f"/proc/{pid}/status").read_text()
    except OSError:
        return None
    fields = {}
    for line in text.splitlines():
        key, _, value = line.partition(":")
        if key in ("VmRSS", "VmHWM"):
            fields[key] = int(value.split()[0])
    if "VmRSS" not in fields:
        return None
    return fields


def cmd_mem(argv):
    name, out, cmd = None, None, None
    i = 0
    while i < len(argv):
        if argv[i] == "--name":
            name, i = argv[i + 1], i + 2
        elif argv[i] == "--out":
            out, i = argv[i + 1], i + 2
        elif argv[i] == "--":
            cmd = argv[i + 1:]
            break
        else:
            sys.exit(f"tools.py mem: unexpected argument {argv[i]!r}")
    if not (name and out and cmd):
        sys.exit("usage: tools.py mem --name NAME --out FILE -- CMD [ARGS...]")
    proc = subprocess.Popen(cmd, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL)
    rss_max = hwm = 0
    samples = 0
    deadline = time.monotonic() + 60
    while proc.poll() is None and time.monotonic() < deadline:
        st = read_status(proc.pid)
        if st:
            samples += 1
            rss_max = max(rss_max, st["VmRSS"])
            hwm = max(hwm, st.get("VmHWM", 0))
        time.sleep(0.01)
    if proc.poll() is None:
        proc.kill()
    code = proc.wait()
    result = {"name": name, "command": cmd, "exit_code": code, "samples": samples,
              "vmrss_max_kib": rss_max, "vmhwm_kib": hwm}
    if code != 0 or samples == 0:
        result["status"] = "failed"
        result["why"] = f"exit code {code}, {samples} samples"
    else:
        result["status"] = "ok"
    Path(out).write_text(json.dumps(result, indent=2))
    return 0


def record_pairs(out, section, pairs):
    """Writes OUT/before-after/SECTION.json: [figure, unit, before, after]
    rows (MCPBOX_BEFORE's binary and the current one, same run), printed
    by report with after/before. Nothing when no row has both values."""
    rows = [list(p) for p in pairs if p[2] is not None or p[3] is not None]
    if not rows:
        return
    (out / "before-after").mkdir(parents=True, exist_ok=True)
    (out / "before-after" / f"{section}.json").write_text(json.dumps({"section": section, "rows": rows}, indent=2))


def callgrind_rows(dirpath):
    """{name: [instructions per call of each run]} from mcpclient.py /
    mcphttp.py latency rows run with --callgrind, and {name: why} of the
    failed ones."""
    ok, failed = {}, {}
    for name, runs in pooled(dirpath).items():
        for r in runs:
            if r.get("status") == "ok" and r.get("instructions_per_call"):
                ok.setdefault(name, []).append(r["instructions_per_call"])
            elif r.get("status") != "ok":
                failed.setdefault(name, r.get("why", "unknown"))
    return ok, failed


def callgrind_table(out, dirpath, stem, title, what):
    """The callgrind table of one section: per row, instructions per call
    of each run, their median and spread. Returns {name: median}."""
    ok, failed = callgrind_rows(dirpath)
    if not ok and not failed:
        return {}
    rows, med = [], {}
    for name in sorted(set(ok) | set(failed), key=lambda n: (n.startswith("before"), n)):
        vals = ok.get(name)
        if not vals:
            rows.append([name, f"failed: {failed.get(name)}"])
            continue
        med[name] = statistics.median(vals)
        spread = (max(vals) - min(vals)) / med[name] if med[name] else None
        rows.append([name, round(med[name]), " / ".join(f"{v:.0f}" for v in vals),
                     f"{spread:.2%}" if spread is not None else "-", len(vals)])
    runs = next((r for rs in pooled(dirpath).values() for r in rs if r.get("status") == "ok"), {})
    notes = [f"{what}: `valgrind --tool=callgrind --trace-children=no`; counters zeroed after "
             f"{runs.get('warmup', '?')} warm-up calls, dumped after {runs.get('calls', '?')} calls "
             "(callgrind_control -z / -d); Ir of that window / calls: every thread of the process, "
             "no child (the sandbox helpers, supervisors and servers run natively)",
             "instructions, not time: the figure a regression check can compare on a noisy machine; "
             "'spread' = (max - min) / median over the runs",
             "the binary under valgrind is a copy with /proc/self/exe replaced by a symlink of the same "
             "length to itself (tools.py selfexe): valgrind 3.19 cannot exec /proc/self/exe"]
    write_table(out, stem, title, ["row", "Ir per call", "runs", "spread", "n"], rows, notes)
    return med


def order_key(name):
    return (STARTUP_ORDER.index(name) if name in STARTUP_ORDER else len(STARTUP_ORDER), name)


def load_rows(section):
    """Reads hyperfine exports and *.failed.json files of one section dir."""
    rows = {}
    if not section.is_dir():
        return rows
    for f in sorted(section.glob("*.json")):
        data = json.loads(f.read_text())
        if f.name.endswith(".failed.json"):
            rows[data["name"]] = data
        elif "results" in data:  # hyperfine
            r = data["results"][0]
            times = sorted(r.get("times") or [])
            median = r.get("median")
            if median is None and times:
                median = times[len(times) // 2]
            name = f.stem
            rows[name] = {"name": name, "status": "ok", "command": r.get("command"),
                          "runs": len(times), "median_ms": median * 1e3,
                          "mean_ms": r["mean"] * 1e3, "stddev_ms": (r.get("stddev") or 0) * 1e3,
                          "min_ms": r["min"] * 1e3, "max_ms": r["max"] * 1e3}
        else:
            rows[data["name"]] = data
    return rows


def table(columns, rows):
    """Aligned text table; numbers right-aligned."""
    cells = [[c if isinstance(c, str) else fmt_num(c) for c in row] for row in rows]
    full = [r for r in cells if len(r) == len(columns)]
    widths = [max([len(h)] + [len(r[i]) for r in full]) for i, h in enumerate(columns)]
    lines = ["  ".join(h.ljust(w) if i == 0 else h.rjust(w) for i, (h, w) in enumerate(zip(columns, widths)))]
    for row, raw in zip(cells, rows):
        if len(row) < len(columns):  # a failed row: name and message
            lines.append(f"{row[0].ljust(widths[0])}  {' '.join(row[1:])}")
            continue
        lines.append("  ".join(
            c.ljust(w) if i == 0 else c.rjust(w)
            for i, (c, w) in enumerate(zip(row, widths))))
    return "\n".join(lines)


def fmt_num(x):
    if x is None:
        return "-"
    if isinstance(x, int):
        return str(x)
    if abs(x) >= 100:
        return f"{x:.0f}"
    if abs(x) >= 10:
        return f"{x:.1f}"
    return f"{x:.2f}"


def cmd_report(argv):
    if len(argv) != 1:
        sys.exit("usage: tools.py report DIR")
    out = Path(argv[0])
    env = {}
    if (out / "env.txt").exists():
        for line in (out / "env.txt").read_text().splitlines():
            k, _, v = line.partition("=")
            env[k] = v
    summary = {"stamp": env.get("stamp"), "env": env, "startup": [], "memory": [], "extra": []}
    print()
    print(f"mcpbox benchmarks, {env.get('stamp', '?')}, {env.get('cpus', '?')} CPUs, "
          f"user {env.get('user', '?')}, kernel {env.get('kernel', '?')}, "
          f"load before {env.get('load', '?')}")
    if env.get("handoff_us"):
        print(f"a hand-off between two threads, {env['handoff_us']}")

    startup = load_rows(out / "startup")
    if startup:
        base = startup.get(BASELINE, {})
        base_ms = base.get("median_ms") if base.get("status") == "ok" else None
        rows = []
        for name in sorted(startup, key=order_key):
            r = startup[name]
            if r["status"] == "ok":
                if base_ms:
                    r["ratio_to_true"] = r["median_ms"] / base_ms
                    r["added_ms_over_true"] = r["median_ms"] - base_ms
                rows.append([name, r["median_ms"], r["mean_ms"], r["stddev_ms"],
                             r.get("ratio_to_true"), r.get("added_ms_over_true"), r["runs"]])
            else:
                rows.append([name, f"failed: {r.get('why', '')}"])
            summary["startup"].append(r)
        print()
        print("start-up: spawn to exit of /bin/true (rows alternating run by run; srt: hyperfine -N)")
        print(table(["name", "median ms", "mean ms", "stddev ms", "x true", "+ms over true", "runs"], rows))
        print(STARTUP_TARGET)

    memory = load_rows(out / "memory")
    if memory:
        rows = []
        for name in sorted(memory, key=order_key):
            r = memory[name]
            if r["status"] == "ok":
                r["vmrss_max_mib"] = r["vmrss_max_kib"] / 1024
                r["vmhwm_mib"] = r["vmhwm_kib"] / 1024
                rows.append([name, r["vmrss_max_mib"], r["vmhwm_mib"], r["samples"]])
            else:
                rows.append([name, f"failed: {r.get('why', '')}"])
            summary["memory"].append(r)
        print()
        print("memory: the launcher process itself (not its children) while the sandbox runs sleep 1")
        print(table(["name", "VmRSS max MiB", "VmHWM MiB", "samples"], rows))
        print(MEMORY_TARGET)

    def fig(rows, name, key):
        r = rows.get(name, {})
        return r.get(key) if r.get("status") == "ok" else None
    if startup:
        record_pairs(out, "1-startup", [
            ("start-up median (mcpbox exec /bin/true)", "ms", fig(startup, "before", "median_ms"),
             fig(startup, "mcpbox", "median_ms")),
            ("start-up added over true", "ms", fig(startup, "before", "added_ms_over_true"),
             fig(startup, "mcpbox", "added_ms_over_true"))] if "before" in startup else [])
    if memory:
        record_pairs(out, "2-memory", [
            ("launcher VmRSS max (exec sleep 1)", "MiB", fig(memory, "before", "vmrss_max_mib"),
             fig(memory, "mcpbox", "vmrss_max_mib"))] if "before" in memory else [])

    extra_dir = out / "extra"
    for f in sorted(extra_dir.glob("*.json")) if extra_dir.is_dir() else []:
        data = json.loads(f.read_text())
        summary["extra"].append(data)
        print()
        print(data.get("title", f.stem))
        print(table(data["columns"], data["rows"]))
        for note in data.get("notes", []):
            print(note)

    pairs_dir = out / "before-after"
    pairs = []
    for f in sorted(pairs_dir.glob("*.json")) if pairs_dir.is_dir() else []:
        data = json.loads(f.read_text())
        for fig_name, unit, before, after in data["rows"]:
            # a ratio of two differences that may be negative (an added p99
            # below zero is noise) would mean nothing: only of positive figures
            ratio = after / before if isinstance(before, (int, float)) and isinstance(after, (int, float)) \
                and before > 0 and after > 0 else None
            pairs.append({"section": data["section"].split("-", 1)[-1], "figure": fig_name, "unit": unit,
                          "before": before, "after": after, "after_over_before": ratio})
    if pairs:
        summary["before_after"] = pairs
        print()
        print(f"before/after: MCPBOX_BEFORE ({os.environ.get('MCPBOX_BEFORE') or env.get('mcpbox_before', 'before')}) "
              "vs the current build, same run")
        print(table(["section", "figure", "unit", "before", "after", "after/before"],
                    [[p["section"], p["figure"], p["unit"], p["before"], p["after"],
                      p["after_over_before"]] for p in pairs]))
        print("after/before below 1: the current build is lower (faster, smaller, fewer instructions) "
              "for every figure but calls/s and share of the ceiling, where above 1 is better; "
              "a row whose binary failed shows '-'")

    (out / "summary.json").write_text(json.dumps(summary, indent=2))
    print()
    return 0


# ---------------------------------------------------------------------------
# relay (issue 3) and egress (issue 4) tables
# ---------------------------------------------------------------------------
RELAY_ORDER = ["direct", "direct-clean-env", "mcpbox", "before", "mcpbox-audit-tmpfs", "before-audit-tmpfs",
               "supergateway", "mcp-proxy"]
RELAY_TARGET = ("target (issue 3): mcpbox under 0.1 ms added per call at the median with policy, "
                "redaction and audit on; many times the calls/s of either bridge")
COLD_TARGET = "target (issue 3): cold start within 10 ms of the unsandboxed server's"
RMEM_TARGET = ("target (issue 3): mcpbox run's own resident memory under 20 MiB at idle and "
               "under 64 MiB while a server sends a 64 MiB result")


def relay_key(name):
    return (RELAY_ORDER.index(name) if name in RELAY_ORDER else len(RELAY_ORDER), name)


def pooled(dirpath):
    """{name: [row dicts]} from NAME.rN.json files (mcpclient.py output)."""
    rows = {}
    for f in sorted(Path(dirpath).glob("*.json")) if Path(dirpath).is_dir() else []:
        try:
            d = json.loads(f.read_text())
        except ValueError:
            d = {"name": f.stem.split(".")[0], "status": "failed", "why": f"unreadable {f.name}"}
        rows.setdefault(d.get("name", f.stem.split(".")[0]), []).append(d)
    return rows


def nearest_rank(vals, p):
    vals = sorted(vals)
    k = max(0, min(len(vals) - 1, int(round(p / 100.0 * len(vals) + 0.5)) - 1))
    return vals[k]


def write_table(out, stem, title, columns, rows, notes):
    (out / "extra").mkdir(parents=True, exist_ok=True)
    (out / "extra" / f"{stem}.json").write_text(json.dumps(
        {"title": title, "columns": columns, "rows": rows, "notes": notes}, indent=2))


def first_failure(runs):
    for r in runs:
        if r.get("status") != "ok":
            return r.get("why", "unknown")
    return None


def cmd_relay(argv):
    if len(argv) != 1:
        sys.exit("usage: tools.py relay DIR")
    out = Path(argv[0])
    rel = out / "relay"
    pairs = []  # before/after figures (MCPBOX_BEFORE)

    # --- latency ---
    lat = pooled(rel / "latency")
    stats = {}
    for name, runs in lat.items():
        ok = [r for r in runs if r.get("status") == "ok"]
        why = first_failure(runs)
        if not ok:
            stats[name] = {"failed": why}
            continue
        samples = [x for r in ok for x in r["samples_ms"]]
        total_s = sum(r["calls"] / r["calls_per_s"] for r in ok)
        stats[name] = {"p50": statistics.median(samples), "p99": nearest_rank(samples, 99),
                       "cps": sum(r["calls"] for r in ok) / total_s,
                       "round_p50s": [r["p50_ms"] for r in ok], "rounds": len(ok),
                       "calls": len(samples), "partial": why}
    if stats:
        d = stats.get("direct", {}).get("p50")
        m = stats.get("mcpbox", {}).get("p50")
        rows = []
        for name in sorted(stats, key=relay_key):
            s = stats[name]
            if "failed" in s:
                rows.append([name, f"failed: {s['failed']}"])
                continue
            spread = f"{min(s['round_p50s']):.3f}-{max(s['round_p50s']):.3f}"
            d99 = stats.get("direct", {}).get("p99")
            s["added_p50"] = s["p50"] - d if d else None
            s["added_p99"] = s["p99"] - d99 if d99 else None
            rows.append([name, s["p50"], s["p99"], round(s["cps"]),
                         s["added_p50"], s["added_p99"], s["p50"] / d if d else None,
                         s["p50"] / m if m else None, spread, s["calls"]])
        notes = ["p50/p99 over all calls of all rounds pooled; 'round p50s' shows the spread between rounds",
                 "direct and mcpbox: stdio; supergateway (--stateful) and mcp-proxy: Streamable HTTP on loopback, one keep-alive connection",
                 "mcpbox: [secrets] (redaction on) and the SQLite audit log on disk; mcpbox-audit-tmpfs: the same with the audit database on /dev/shm (the disk cost of an audit record; the default durability 'process' writes the WAL without an fsync)",
                 "before: the mcpbox row with MCPBOX_BEFORE's binary, in the same rounds (before and after alternate, so drift hits both alike)",
                 RELAY_TARGET]
        if d and m:
            notes.insert(0, f"mcpbox adds {(m - d) * 1e3:.0f} us per call at the median over direct")
        for name, s in sorted(stats.items()):
            if s.get("partial"):
                notes.append(f"{name}: some rounds failed: {s['partial']}")
        write_table(out, "relay-1-latency", "relay overhead: tools/call echo round trip, server-everything",
                    ["path", "p50 ms", "p99 ms", "calls/s", "+ms vs direct", "+p99 ms vs direct", "x direct",
                     "x mcpbox", "round p50s", "calls"], rows, notes)
    if "before" in stats:
        a, b = stats.get("mcpbox", {}), stats.get("before", {})
        for label, k, unit in (("relay p50 (stdio echo)", "p50", "ms"), ("relay p99", "p99", "ms"),
                               ("relay added p50 over direct", "added_p50", "ms"),
                               ("relay added p99 over direct", "added_p99", "ms"),
                               ("relay calls/s (1 client)", "cps", "calls/s")):
            pairs.append((label, unit, b.get(k), a.get(k)))

    # --- cold start ---
    cold = pooled(rel / "coldstart")
    cold_med = {}
    if cold:
        rows, base = [], None
        for name in sorted(cold, key=relay_key):
            ok = [r for r in cold[name] if r.get("status") == "ok"]
            if not ok:
                rows.append([name, f"failed: {first_failure(cold[name])}"])
                continue
            samples = [x for r in ok for x in r["samples_ms"]]
            med = statistics.median(samples)
            cold_med[name] = med
            if name == "direct":
                base = med
            listed = sorted({r.get("tools") for r in ok if r.get("tools") is not None})
            rows.append([name, med, min(samples), max(samples), med - base if base else None, len(samples),
                         "/".join(str(x) for x in listed) or "-"])
        write_table(out, "relay-2-coldstart", "cold start: spawn to the answer of the first tools/list",
                    ["path", "median ms", "min ms", "max ms", "+ms vs direct", "runs", "tools listed"], rows,
                    ["each run: spawn, initialize, notifications/initialized, tools/list; runs interleaved",
                     "direct-clean-env: the server unsandboxed with only PATH, HOME and LANG, near what mcpbox gives "
                     "its sandbox (the host's NODE_EXTRA_CA_CERTS alone costs node ~100 ms at start)",
                     COLD_TARGET])
    if "before" in cold:
        pairs.append(("relay cold start to tools/list", "ms", cold_med.get("before"), cold_med.get("mcpbox")))

    # --- callgrind ---
    cg = callgrind_table(out, rel / "callgrind", "relay-4-callgrind",
                         "relay: instructions per tools/call echo of `mcpbox run` itself (callgrind)",
                         "the relay process of `mcpbox run` (stdio, the relay section's policy)")
    if "before" in cg or "before" in callgrind_rows(rel / "callgrind")[1]:
        pairs.append(("relay instructions per call (callgrind)", "Ir", cg.get("before"), cg.get("mcpbox")))

    # --- memory ---
    mem = pooled(rel / "memory")
    if mem:
        rows = []
        for name in sorted(mem):
            for r in mem[name]:
                if r.get("status") != "ok":
                    rows.append([name, f"failed: {r.get('why')}"])
                    continue
                kib = 1024.0
                rows.append([name, r["idle_vmrss_kib"] / kib,
                             (r.get("idle_own_tree_vmrss_kib") or 0) / kib,
                             r["big_vmhwm_kib"] / kib, r["big_vmrss_max_kib"] / kib,
                             r["after_vmrss_kib"] / kib, r["answer_bytes"] / kib / kib,
                             r["call_ms"]])
        write_table(out, "relay-3-memory",
                    "memory of mcpbox run itself (the relay process, not the server) with flood's 64 MiB result",
                    ["policy", "idle RSS MiB", "idle all mcpbox MiB", "VmHWM MiB", "RSS max MiB",
                     "RSS after MiB", "answer MiB", "call ms"], rows,
                    ["idle: after initialize + tools/list and 1 s; VmHWM: the relay's peak after `tools/call big {\"mib\": 64}`",
                     "'all mcpbox': the relay plus mcpbox's supervisor and in-sandbox helper processes, at idle",
                     "max_line-128MiB: the whole 64 MiB line is accepted, then cut to [output] max_result (1 MiB); "
                     "max_line-default: 16 MiB, over-long strings are cut while streaming",
                     RMEM_TARGET])
        mm = {n: next((r for r in rs if r.get("status") == "ok"), None) for n, rs in mem.items()}
        for ml in ("max_line-128MiB", "max_line-default"):
            if "before-" + ml in mm:
                a, b = mm.get(ml), mm.get("before-" + ml)
                pairs.append((f"relay VmHWM with a 64 MiB result ({ml})", "MiB",
                              b["big_vmhwm_kib"] / 1024 if b else None, a["big_vmhwm_kib"] / 1024 if a else None))
    record_pairs(out, "3-relay", pairs)
    return 0


EGRESS_LINE = re.compile(
    r"^(?P<path>\S.*?)\s+(?P<tput>[\d.]+) GB/s\s+(?P<pct>[\d.]+)%\s+(?P<p50>[\d.]+) us\s+"
    r"(?P<p99>[\d.]+) us\s+(?P<added>-?[\d.]+) us\s*$")


def cmd_egress(argv):
    if len(argv) != 1:
        sys.exit("usage: tools.py egress DIR")
    out = Path(argv[0])
    eg = out / "egress"
    txt = eg / "egress_bench.txt"
    failed = eg / "egress_bench.failed"
    rows, notes = [], []
    if failed.exists():
        rows.append(["egress_bench", f"failed: {failed.read_text().strip()}"])
    elif txt.exists():
        for line in txt.read_text().splitlines():
            m = EGRESS_LINE.match(line)
            if m:
                rows.append([m["path"], float(m["tput"]), float(m["pct"]), float(m["p50"]),
                             float(m["p99"]), float(m["added"])])
            elif line.startswith("egress_bench:"):
                notes.append(line)
        if not rows:
            rows.append(["egress_bench", "failed: no result lines in its output (see egress/egress_bench.txt)"])
    if rows:
        notes.append("'bare relay (1 hop)': the proxy's splice relay alone (no request, policy or record), the ceiling of "
                     "any design that carries the bytes through one relay in user space on this machine")
        notes.append("target (issue 28): >= 90% of direct throughput; <= 50 us added per new connection at the median "
                     "(issue 4's: < 200 us)")
        write_table(out, "egress-1-proxy", "egress proxy in-process (crates/egress example egress_bench)",
                    ["path", "GB/s", "% of direct", "connect p50 us", "connect p99 us", "added p50 us"], rows, notes)

    e2e = pooled(eg / "e2e")
    if e2e:
        rows, base = [], {}
        for name in ("direct", "mcpbox-exec", "mcpbox-exec-transparent"):
            if name not in e2e:
                continue
            ok = [r for r in e2e[name] if r.get("status") == "ok"]
            if not ok:
                rows.append([name, f"failed: {first_failure(e2e[name])}"])
                continue
            mbs = statistics.median(r["mb_per_s"] for r in ok)
            p50 = statistics.median(r["request_p50_ms"] for r in ok)
            p99 = statistics.median(r["request_p99_ms"] for r in ok)
            if name == "direct":
                base = {"mbs": mbs, "p50": p50}
            rows.append([name, mbs, mbs / base["mbs"] * 100 if base else None, p50, p99,
                         (p50 - base["p50"]) * 1e3 if base else None,
                         ok[0]["bytes"] / 2 ** 20, len(ok)])
        write_table(out, "egress-2-e2e",
                    "egress end to end: python urllib download on the host vs inside `mcpbox exec`, through the proxy variables and through the transparent capture",
                    ["path", "MB/s", "% of direct", "request p50 ms", "request p99 ms", "added p50 us", "MiB", "rounds"],
                    rows,
                    ["mcpbox-exec: plain-HTTP forwarding (HTTP_PROXY) to a loopback server named bench.test via [network.hosts]; "
                     "mcpbox-exec-transparent: the same client with no proxy (the sandbox's resolver, the capture, CONNECT by name); "
                     "requests: GET of 1 byte, a new connection each; medians over rounds",
                     "both ends are Python: the ratio, not the MB/s, is the figure"])
    return 0


LARGE_ORDER = ["direct", "mcpbox-no-secret", "mcpbox-secret", "direct-secret-in-output",
               "mcpbox-secret-in-output", "before-no-secret", "before-secret",
               "before-secret-in-output"]
LARGE_TARGET = ("target (redaction issue): >= 500 MB/s marginal with one secret "
                "(mcpbox-secret; stretch 1 GB/s)")


def cmd_large(argv):
    if len(argv) != 1:
        sys.exit("usage: tools.py large DIR")
    out = Path(argv[0])
    rows_in = pooled(out / "large" / "rows")
    if not rows_in:
        return 0
    ok = {}
    for name, runs in rows_in.items():
        good = [r for r in runs if r.get("status") == "ok"]
        ok[name] = good[0] if good else {"failed": first_failure(runs)}

    def base_of(name):
        return "direct-secret-in-output" if name.endswith("secret-in-output") else "direct"

    def marginal(name):
        r, b = ok.get(name, {}), ok.get(base_of(name), {})
        if "median_s" not in r or "median_s" not in b or name.startswith("direct"):
            return None, None
        added = r["median_s"] - b["median_s"]
        mbs = r["mib"] * 1048576 / added / 1e6 if added > 0 else None
        return added, mbs

    rows = []
    key = lambda n: (LARGE_ORDER.index(n) if n in LARGE_ORDER else len(LARGE_ORDER), n)
    for name in sorted(ok, key=key):
        r = ok[name]
        if "failed" in r:
            rows.append([name, f"failed: {r['failed']}"])
            continue
        added, mbs = marginal(name)
        b = ok.get(base_of(name), {})
        vs_before = None
        if name.startswith("mcpbox-"):
            _, before = marginal("before-" + name[len("mcpbox-"):])
            if mbs and before:
                vs_before = mbs / before
        rows.append([name, r["median_s"], r["min_s"], r["max_s"],
                     r["mib"] * 1048576 / r["median_s"] / 1e6, added, mbs,
                     r["median_s"] / b["median_s"] if b.get("median_s") and not name.startswith("direct") else None,
                     vs_before, r["redactions"], len(r["samples_s"])])
        r["added_s"], r["marginal_mb_per_s"], r["marginal_x_before"] = added, mbs, vs_before
    any_row = next((r for r in ok.values() if "median_s" in r), {})
    mib = any_row.get("mib", 64)
    notes = [f"one tools/call big {{\"mib\": {mib:g}}} to the flood test server: one text item of "
             f"{mib:g} MiB of \"é\" (non-ASCII); seconds from writing the request to the last byte of the "
             "answer line, median of the runs",
             "mcpbox rows: `mcpbox run` (sandbox + relay) with [output] max_line = max_result = \"128MiB\" "
             "(nothing cut); -secret: one [secrets] entry (absent from the result); -secret-in-output: the "
             "result holds the secret at every ~1 MiB (flood's char argument), each occurrence redacted",
             "marginal MB/s = result bytes / (median through mcpbox - median of the direct row with the same "
             "arguments): the rate of mcpbox's own work, the server's and the client's being in both",
             "before-*: the same rows with MCPBOX_BEFORE (an older build); 'marginal x before' compares them",
             LARGE_TARGET]
    write_table(out, "large-1-throughput",
                f"large result: a {mib:g} MiB tools/call answer direct vs through mcpbox run",
                ["path", "median s", "min s", "max s", "MB/s", "+s vs direct", "marginal MB/s",
                 "x direct", "marginal x before", "redactions", "runs"], rows, notes)
    pairs = []
    for name in sorted(n for n in ok if n.startswith("before-")):
        after = "mcpbox-" + name[len("before-"):]
        b, a = ok.get(name, {}), ok.get(after, {})
        pairs.append((f"large {after[len('mcpbox-'):]}: median", "s", b.get("median_s"), a.get("median_s")))
        pairs.append((f"large {after[len('mcpbox-'):]}: marginal", "MB/s", marginal(name)[1], marginal(after)[1]))
    record_pairs(out, "5-large", pairs)
    return 0

SERVE_ORDER = ["mcpbox-serve", "before-serve", "supergateway", "mcp-proxy"]
SERVE_BRIDGES = ["supergateway", "mcp-proxy"]
SERVE_TARGET = ("target (serve issue): p50 <= 0.6 ms at 1 client (supergateway 2.2 ms, mcp-proxy 2.6 ms "
                "when the issue was written); calls/s at 32 clients >= 5x the better bridge")
SESSIONS_TARGET = "target (serve issue): the gateway's own VmRSS under 64 MiB with 100 idle sessions (sandboxes not counted)"
LOAD_TARGET = ("target (serve issue): 100 clients x 1,000 calls through /mcp, zero errors, "
               "no client ever receives another client's data")


def cmd_serve(argv):
    if len(argv) != 1:
        sys.exit("usage: tools.py serve DIR")
    out = Path(argv[0])
    sv = out / "serve"
    key = lambda n: (SERVE_ORDER.index(n) if n in SERVE_ORDER else len(SERVE_ORDER), n)

    lat = pooled(sv / "latency")
    # One directory per client count (SERVE_CLIENTS=8,32: throughput/c8,
    # throughput/c32); the table above shows the largest, the CPU tables all.
    thr_by_n = {}
    for d in sorted((sv / "throughput").glob("c*")) if (sv / "throughput").is_dir() else []:
        if d.is_dir() and d.name[1:].isdigit():
            thr_by_n[int(d.name[1:])] = pooled(d)
    flat = pooled(sv / "throughput")  # results of an older bench/run: one client count
    if flat and not thr_by_n:
        n = next((r["clients"] for rs in flat.values() for r in rs if r.get("clients")), 0)
        thr_by_n[n] = flat
    top_n = max(thr_by_n) if thr_by_n else None
    cpu_meds, ceiling = {}, None
    thr = thr_by_n.get(top_n, {})
    stats = {}
    for name in set(lat) | set(thr) | {n for t in thr_by_n.values() for n in t}:
        s = {}
        ok = [r for r in lat.get(name, []) if r.get("status") == "ok"]
        if ok:
            samples = [x for r in ok for x in r["samples_ms"]]
            s.update({"p50": statistics.median(samples), "p99": nearest_rank(samples, 99),
                      "cps1": len(samples) / (sum(samples) / 1e3), "calls": len(samples),
                      "round_p50s": [r["p50_ms"] for r in ok]})
        else:
            s["lat_failed"] = first_failure(lat.get(name, [])) or "not run"
        okt = [r for r in thr.get(name, []) if r.get("status") == "ok"]
        if okt:
            s.update({"cps": statistics.median(r["calls_per_s"] for r in okt),
                      "round_cps": [r["calls_per_s"] for r in okt],
                      "clients": okt[0]["clients"],
                      "p50c": statistics.median(r["latency"]["p50_ms"] for r in okt),
                      "p99c": statistics.median(r["latency"]["p99_ms"] for r in okt),
                      "errors": sum(r.get("errors", 0) for r in okt)})
        else:
            s["thr_failed"] = first_failure(thr.get(name, [])) or "not run"
        for n, t in thr_by_n.items():
            okn = [r for r in t.get(name, []) if r.get("status") == "ok"]
            if okn:
                s[f"cps@{n}"] = statistics.median(r["calls_per_s"] for r in okn)
        stats[name] = s
    figures = {}
    if stats:
        bridges_p50 = {n: stats[n]["p50"] for n in SERVE_BRIDGES if "p50" in stats.get(n, {})}
        bridges_cps = {n: stats[n]["cps"] for n in SERVE_BRIDGES if "cps" in stats.get(n, {})}
        best_p50 = min(bridges_p50.items(), key=lambda kv: kv[1]) if bridges_p50 else None
        best_cps = max(bridges_cps.items(), key=lambda kv: kv[1]) if bridges_cps else None
        rows = []
        for name in sorted(stats, key=key):
            s = stats[name]
            if "p50" not in s and "cps" not in s:
                rows.append([name, f"failed: {s.get('lat_failed')}; {s.get('thr_failed')}"])
                continue
            x_p50 = best_p50[1] / s["p50"] if best_p50 and "p50" in s else None
            x_cps = s["cps"] / best_cps[1] if best_cps and "cps" in s else None
            spread = (f"{min(s['round_p50s']):.3f}-{max(s['round_p50s']):.3f}" if "round_p50s" in s else "-")
            cspread = (f"{min(s['round_cps']):.0f}-{max(s['round_cps']):.0f}" if "round_cps" in s else "-")
            rows.append([name, s.get("p50"), s.get("p99"), s.get("cps1"), s.get("cps"), s.get("p50c"),
                         s.get("p99c"), x_p50, x_cps, spread, cspread, s.get("errors")])
            if name == "mcpbox-serve":
                figures = {"p50_ms": s.get("p50"), "p99_ms": s.get("p99"), "calls_per_s_concurrent": s.get("cps"),
                           "clients": s.get("clients"),
                           "best_bridge_p50": best_p50[0] if best_p50 else None,
                           "best_bridge_p50_ms": best_p50[1] if best_p50 else None,
                           "p50_speedup_vs_best_bridge": x_p50,
                           "best_bridge_calls_per_s": best_cps[0] if best_cps else None,
                           "best_bridge_calls_per_s_value": best_cps[1] if best_cps else None,
                           "calls_per_s_ratio_vs_best_bridge": x_cps}
        for name in sorted(stats, key=key):
            for k in ("lat_failed", "thr_failed"):
                if k in stats[name] and ("p50" in stats[name] or "cps" in stats[name]):
                    rows.append([f"{name} ({'1 client' if k == 'lat_failed' else 'concurrent'})",
                                 f"failed: {stats[name][k]}"])
        clients = top_n if top_n is not None else "N"
        lower = [n for n in sorted(thr_by_n) if n != top_n]
        for row in rows:
            if len(row) > 2:  # a measured row: calls/s at the lower client counts after "calls/s 1"
                st = stats.get(row[0], {})
                row[4:4] = [st.get(f"cps@{n}") for n in lower]
        notes = [
            "every row fronts stdio server-everything (npm): one server process per client session behind "
            "mcpbox-serve and supergateway --stateful, one shared by all sessions behind mcp-proxy (npm) "
            "(the 'pids' column of the CPU table); "
            "client: bench/mcphttp.py, raw sockets, Streamable HTTP (POST, Mcp-Session-Id, SSE or JSON answers), "
            "one keep-alive HTTP/1.1 connection per session",
            "1 client: sequential tools/call echo after initialize + tools/list + warm-up; p50/p99 over all rounds pooled",
            f"{clients} clients: each its own session and connection, a call as soon as the last is answered; "
            "calls/s counted in a fixed window after a warm-up, median over rounds ('rounds' shows the spread)",
            "'x bridge p50' = the better bridge's p50 / this row's (above 1: faster); "
            "'x bridge calls/s' = this row's calls/s / the better bridge's",
            "mcpbox-serve: each session's server in its own sandbox (serve always sandboxes), audit log on disk; "
            "one anonymous loopback client with [limits] raised above the load",
            "the client, the gateway and the servers share the machine's CPUs: at many clients the figure is the "
            "whole system's",
            SERVE_TARGET]
        if figures.get("p50_speedup_vs_best_bridge"):
            notes.insert(0, f"mcpbox serve: p50 {figures['p50_ms']:.3f} ms "
                            f"({figures['p50_speedup_vs_best_bridge']:.2f}x faster than {figures['best_bridge_p50']}); "
                            f"{figures['calls_per_s_concurrent'] or 0:.0f} calls/s at {clients} clients "
                            f"({figures['calls_per_s_ratio_vs_best_bridge'] or 0:.2f}x {figures['best_bridge_calls_per_s']})")
        write_table(out, "serve-1-latency",
                    "serve: tools/call echo through an HTTP gateway or bridge to stdio server-everything",
                    ["path", "p50 ms", "p99 ms", "calls/s 1"] + [f"calls/s {n}" for n in lower] +
                    [f"calls/s {clients}", f"p50 ms {clients}",
                     f"p99 ms {clients}", "x bridge p50", "x bridge calls/s", "round p50s", "rounds calls/s",
                     "errors"], rows, notes)
        # The CPU table for every row at every client count, 1 client too
        # (the latency rounds: sequential calls, so far below the ceiling).
        for n in [1] + sorted(thr_by_n):
            rows_n = lat if n == 1 else thr_by_n[n]
            bridge_n = {}
            for b in SERVE_BRIDGES:
                okb = [r for r in rows_n.get(b, []) if r.get("status") == "ok"]
                if okb:
                    bridge_n[b] = statistics.median(r["calls_per_s"] for r in okb)
            best_n = max(bridge_n.items(), key=lambda kv: kv[1]) if bridge_n else None
            got = serve_cpu_table(out, rows_n, key, best_n, n,
                                  stem=f"serve-1-throughput-cpu-{n:03d}" if n != top_n else None)
            if got:
                cpu_meds[n] = got["cpu_per_call"]
                if n == top_n:
                    ceiling = got
        if ceiling and ceiling.get("line"):
            figures.update(ceiling)
            data = json.loads((out / "extra" / "serve-1-latency.json").read_text())
            data["notes"].insert(1 if figures.get("p50_speedup_vs_best_bridge") else 0, ceiling["line"])
            (out / "extra" / "serve-1-latency.json").write_text(json.dumps(data, indent=2))
        data = json.loads((out / "extra" / "serve-1-latency.json").read_text())
        data["figures"] = figures
        (out / "extra" / "serve-1-latency.json").write_text(json.dumps(data, indent=2))

    cg = callgrind_table(out, sv / "callgrind", "serve-4-callgrind",
                         "serve: instructions per tools/call echo of the gateway process alone (callgrind), 1 client",
                         "the `mcpbox serve` process (1 client, one keep-alive connection, the serve section's config)")
    pairs = []
    if stats and "before-serve" in stats:
        a, b = stats.get("mcpbox-serve", {}), stats["before-serve"]
        pairs += [("serve echo p50, 1 client", "ms", b.get("p50"), a.get("p50")),
                  ("serve echo p99, 1 client", "ms", b.get("p99"), a.get("p99"))]
        for n in sorted(thr_by_n):
            pairs.append((f"serve calls/s, {n} clients", "calls/s", b.get(f"cps@{n}"), a.get(f"cps@{n}")))
        for n, med in sorted(cpu_meds.items()):
            ma, mb = med.get("mcpbox-serve", {}), med.get("before-serve", {})
            pairs.append((f"serve gateway CPU per call, {n} client{'s' if n > 1 else ''}", "ms",
                          mb.get("gateway_ms_per_call"), ma.get("gateway_ms_per_call")))
            if n > 1:
                pairs.append((f"serve share of the zero-cost ceiling, {n} clients", "%",
                              100 * mb["share_of_ceiling"] if mb.get("share_of_ceiling") else None,
                              100 * ma["share_of_ceiling"] if ma.get("share_of_ceiling") else None))
    if "before-serve" in cg or "before-serve" in callgrind_rows(sv / "callgrind")[1]:
        pairs.append(("serve gateway instructions per call (callgrind, 1 client)", "Ir",
                      cg.get("before-serve"), cg.get("mcpbox-serve")))

    ses = pooled(sv / "sessions")
    if ses:
        rows = []
        for name in sorted(ses, key=key):
            for r in ses[name]:
                if r.get("status") != "ok":
                    rows.append([name, f"failed: {r.get('why')}"])
                    continue
                kib = 1024.0
                per = (r["sessions_vmrss_kib"] - r["start_vmrss_kib"]) / r["clients"]
                rows.append([name, r["clients"], r["start_vmrss_kib"] / kib, r["sessions_vmrss_kib"] / kib,
                             r["sessions_vmhwm_kib"] / kib, per, r.get("threads"), r["own_children"],
                             r["own_children_vmrss_kib"] / kib, r["open_s"]])
        write_table(out, "serve-2-memory", "serve: memory of the gateway process itself with idle sessions",
                    ["gateway", "sessions", "start RSS MiB", "RSS MiB", "VmHWM MiB", "KiB/session", "threads",
                     "mcpbox children", "children RSS MiB", "open s"], rows,
                    ["each session: initialize + notifications/initialized, then nothing (the gateway closes connections "
                     "idle for [limits] header_timeout, the sessions stay); "
                     "one echo call on one of them, then VmRSS of the `mcpbox serve` pid from /proc/PID/status "
                     "(its children, the sandboxes, not counted)",
                     "'mcpbox children': descendant processes named mcpbox (sandbox supervisors and helpers), "
                     "shown apart; the servers (node) are not mcpbox's",
                     SESSIONS_TARGET])
        sa = next((r for r in ses.get("mcpbox-serve", []) if r.get("status") == "ok"), None)
        sb = next((r for r in ses.get("before-serve", []) if r.get("status") == "ok"), None)
        if "before-serve" in ses:
            pairs.append((f"serve gateway VmRSS with {(sa or sb or {}).get('clients', '?')} idle sessions", "MiB",
                          sb["sessions_vmrss_kib"] / 1024 if sb else None,
                          sa["sessions_vmrss_kib"] / 1024 if sa else None))
    record_pairs(out, "4-serve", pairs)

    fl = pooled(sv / "flood")
    if fl:
        rows = []
        for name in sorted(fl, key=key):
            for r in fl[name]:
                if r.get("status") != "ok":
                    rows.append([name, f"failed: {r.get('why')}"])
                    continue
                kib = 1024.0
                rows.append([name, r["flood_mib"], r["start_vmrss_kib"] / kib, r["flood_vmrss_peak_kib"] / kib,
                             (r["flood_vmrss_peak_kib"] - r["start_vmrss_kib"]) / kib,
                             (r.get("buffered_bytes") or 0) / kib / kib, r["dropped"], r["other_calls_ok"],
                             r["flood_s"]])
        write_table(out, "serve-2b-flood", "serve: gateway memory under a flood",
                    ["gateway", "flood MiB", "start RSS MiB", "peak RSS MiB", "growth MiB", "held at end MiB",
                     "dropped", "other client's calls", "flood s"], rows,
                    ["a server (crates/testservers `concurrent`, `notes`) sends notifications of FLOOD_KIB KiB "
                     "that belong to no request to a client that never opens its GET stream; another client "
                     "calls `slow` meanwhile (each call must work); VmRSS of the `mcpbox serve` pid sampled "
                     "between its calls until /metrics counts the flood dropped",
                     "budgets: [limits] max_buffered_per_session = FLOOD_SESSION_MIB (8 MiB), "
                     "max_buffered_total = FLOOD_TOTAL_MIB (16 MiB); the growth stays under the total "
                     "plus a fixed margin whatever the flood's size (docs/serve.md, Byte budgets)"])

    lo = pooled(sv / "load")
    if lo:
        rows = []
        for name in sorted(lo, key=key):
            for r in lo[name]:
                if r.get("status") != "ok":
                    rows.append([name, f"failed: {r.get('why')}"])
                    continue
                path = r["url"].split("/", 3)[-1]
                rows.append([name, "/" + path, r["clients"], r["calls"], r["ok"], r["errors"], r["leaks"],
                             r["calls_per_s"], r["latency"].get("p50_ms"), r["latency"].get("p99_ms"),
                             r["open_s"]])
        notes = ["each client its own session and connection; every call's message holds the client's random "
                 "64-bit value and the call counter; an answer counts when its text ends with exactly that; "
                 "'cross-client' counts answers holding another client's value; same JSON-RPC ids in every client",
                 LOAD_TARGET]
        for name in lo:
            for r in lo[name]:
                if r.get("fell_back"):
                    notes.insert(0, f"{r['fell_back']['from']}: {r['fell_back']['why']} (no aggregating endpoint "
                                    f"in this build): the load ran through {r['url']}")
                for e in r.get("first_errors", [])[:3]:
                    notes.append(f"{name}: {e}")
        write_table(out, "serve-3-load", "serve: load test (bench/load.py), every answer checked",
                    ["gateway", "endpoint", "clients", "calls", "ok", "errors", "cross-client", "calls/s",
                     "p50 ms", "p99 ms", "open s"], rows, notes)
    return 0


CPU_KEYS = ["client_ms_per_call", "gateway_ms_per_call", "upstream_ms_per_call", "total_ms_per_call",
            "calls_per_s", "ceiling_calls_per_s", "client_bound_calls_per_s", "upstream_bound_calls_per_s",
            "others_ms_per_call", "machine_busy_cores", "ours_cores"]


def serve_cpu_table(out, thr, key, best_cps, clients, stem=None):
    """The CPU table of the concurrent rounds (mcphttp.py's "cpu" block):
    per row, medians over rounds of the CPU ms per call of the client, the
    gateway, the servers and all three, and the ceiling: the calls/s this
    machine's cores allow with this client and these servers if the gateway
    cost nothing, cores / (client + upstream ms per call), also as a
    multiple of the better bridge's measured calls/s. Returns the headline
    figures for summary.json, or None when no round has them."""
    med = {}
    rows = []
    cores = None
    for name in sorted(thr, key=key):
        cpus = [r["cpu"] for r in thr[name] if r.get("status") == "ok" and r.get("cpu", {}).get("status") == "ok"]
        if not cpus:
            why = next((r["cpu"].get("why") for r in thr[name] if r.get("cpu")), None) or first_failure(thr[name])
            rows.append([name, f"failed: {why or 'no CPU figures (older mcphttp.py)'}"])
            continue
        cores = cpus[0]["cores"]
        m = {k: statistics.median(c[k] for c in cpus if c.get(k) is not None) for k in CPU_KEYS}
        # user and kernel parts of the gateway's CPU (older results lack them)
        for k in ("gateway_user_ms_per_call", "gateway_system_ms_per_call"):
            vals = [c[k] for c in cpus if c.get(k) is not None]
            m[k] = statistics.median(vals) if vals else None
        m["rounds"] = len(cpus)
        m["round_ceilings"] = [c["ceiling_calls_per_s"] for c in cpus]
        m["pids"] = f"{cpus[0]['gateway_pids']}+{cpus[0]['upstream_pids']}"
        m["pids_changed"] = any(c["pids_changed"] for c in cpus)
        m["share_of_ceiling"] = (m["calls_per_s"] / m["ceiling_calls_per_s"]
                                 if m.get("ceiling_calls_per_s") else None)
        med[name] = m
        x = m["ceiling_calls_per_s"] / best_cps[1] if best_cps else None
        share = f"{m['share_of_ceiling']:.0%}" if m["share_of_ceiling"] is not None else "-"
        rows.append([name, m["calls_per_s"], m["client_ms_per_call"], m["gateway_ms_per_call"],
                     m["upstream_ms_per_call"], m["total_ms_per_call"], m["ceiling_calls_per_s"], share, x,
                     m["client_bound_calls_per_s"], m["upstream_bound_calls_per_s"], m["ours_cores"],
                     m["machine_busy_cores"], m["others_ms_per_call"], m["pids"],
                     f"{min(m['round_ceilings']):.0f}-{max(m['round_ceilings']):.0f}"])
    if not med:
        return None
    best = best_cps[1] if best_cps else None
    mine = med.get("mcpbox-serve")
    top = max(med.items(), key=lambda kv: kv[1]["ceiling_calls_per_s"] or 0)
    figures = {"cores": cores, "cpu_per_call": med,
               "ceiling_calls_per_s": mine["ceiling_calls_per_s"] if mine else None,
               "ceiling_x_best_bridge": mine["ceiling_calls_per_s"] / best if mine and best else None,
               "highest_ceiling_row": top[0], "highest_ceiling_calls_per_s": top[1]["ceiling_calls_per_s"],
               "highest_ceiling_x_best_bridge": (top[1]["ceiling_calls_per_s"] or 0) / best if best else None}
    line = None
    if mine and best and mine.get("ceiling_calls_per_s"):
        split = ""
        if mine.get("gateway_user_ms_per_call") is not None:
            split = (f" ({mine['gateway_user_ms_per_call']:.3f} in user space, "
                     f"{mine['gateway_system_ms_per_call']:.3f} in the kernel)")
        line = (f"the ceiling at {clients} clients on {cores} cores (a gateway costing zero CPU): "
                f"{cores} / ({mine['client_ms_per_call']:.3f} client + {mine['upstream_ms_per_call']:.3f} servers "
                f"ms per call) = {mine['ceiling_calls_per_s']:.0f} calls/s = "
                f"{figures['ceiling_x_best_bridge']:.2f}x {best_cps[0]} ({best:.0f} calls/s); mcpbox-serve "
                f"reached {mine['calls_per_s']:.0f} calls/s, {mine['calls_per_s'] / mine['ceiling_calls_per_s']:.0%} "
                f"of it, its own CPU {mine['gateway_ms_per_call']:.3f} ms per call{split}; the highest ceiling of any row "
                f"({top[0]}) is {figures['highest_ceiling_x_best_bridge']:.2f}x the better bridge; "
                f"5x would be {5 * best:.0f} calls/s")
        figures["line"] = line
    notes = [
        ("1 client: the sequential calls of the latency rounds, so far below the ceiling (each call waits for "
         "the last); " if clients == 1 else "") +
        f"CPU over the measured window of the {clients}-client rounds (medians over rounds): utime+stime from "
        "/proc/PID/stat (clock ticks), plus cutime+cstime (children reaped), summed over the row's process "
        "tree in two parts: 'servers' = every process running server-everything and its descendants, "
        "'gateway' = the rest of the tree (the gateway or bridge, mcpbox's sandbox supervisors and inits, "
        "a bridge's shells); 'client' = the load client's own getrusage (it is single-threaded)",
        "the window: two snapshots taken by the client's loop between two answers, when the counting window "
        "opens and closes (all sessions are open and warmed up before it); the calls divided by are the "
        "answers checked ok between the two snapshots, so 'calls/s' here can differ slightly from the "
        "table above (calls sent and answered inside the window); 'pids' = gateway+server processes at the "
        "end; the process sets at both ends were " + ("NOT always equal (a process started or ended in the "
        "window: its time is in its reaper's)" if any(m["pids_changed"] for m in med.values()) else
        "equal in every round (no process started or ended in the window)"),
        "'share' = calls/s / ceiling, the part of the zero-cost ceiling this row reached; "
        "'ceiling' = cores / (client + servers CPU ms per call) = the calls/s this machine could serve with "
        "this client and these servers if the gateway cost nothing; 'x bridge' = ceiling / the better "
        "bridge's measured calls/s (the table above); 'client bound' = 1000 / client ms per call (the client "
        "is one thread: one core at most); 'servers bound' = cores / servers ms per call (any client, a "
        "free gateway)",
        "'our cores' = (client + gateway + servers) CPU / window; 'machine cores' = every CPU's busy time "
        "from /proc/stat over the window; 'others ms/call' = the difference per call: work of other users "
        "of this shared machine, which the ceiling assumes away",
    ]
    if line:
        notes.insert(0, line)
    write_table(out, stem or "serve-1-throughput-cpu",
                f"serve: CPU per call at {clients} client{'s' if clients != 1 else ''}, and the ceiling a "
                "zero-cost gateway would reach",
                ["path", "calls/s", "client ms", "gateway ms", "servers ms", "total ms", "ceiling calls/s",
                 "share", "x bridge", "client bound", "servers bound", "our cores", "machine cores", "others ms/call",
                 "pids", "round ceilings"], rows, notes)
    return figures


SELF_EXE = b"/proc/self/exe"


def cmd_selfexe(argv):
    """selfexe SRC DST LINK: see the module's doc. A short constant copy
    is compiled to two overlapping 8-byte immediates (movabs of "/proc/se"
    and "self/exe", 6 bytes apart in the string): both are rewritten, the
    first only next to a second. Fails when nothing was replaced."""
    if len(argv) != 3:
        sys.exit("usage: tools.py selfexe SRC DST LINK")
    src, dst, link = argv[0], Path(argv[1]), argv[2].encode()
    if len(link) != len(SELF_EXE):
        sys.exit(f"selfexe: LINK must be {len(SELF_EXE)} bytes, not {len(link)}")
    data = Path(src).read_bytes()
    whole = data.count(SELF_EXE)
    data = bytearray(data.replace(SELF_EXE, link))
    movabs = lambda imm: re.compile(rb"[\x48\x49][\xb8-\xbf]" + re.escape(imm))
    tails = [m.start() for m in movabs(SELF_EXE[6:]).finditer(bytes(data))]
    heads = [m.start() for m in movabs(SELF_EXE[:8]).finditer(bytes(data))
             if any(abs(m.start() - t) < 64 for t in tails)]
    for t in tails:
        data[t + 2:t + 10] = link[6:]
    for h in heads:
        data[h + 2:h + 10] = link[:8]
    if not whole and not tails:
        sys.exit(f"selfexe: no /proc/self/exe in {src}")
    dst.parent.mkdir(parents=True, exist_ok=True)
    dst.write_bytes(bytes(data))
    dst.chmod(0o755)
    if os.path.lexists(link):
        os.unlink(link)
    os.symlink(dst.resolve(), link)
    print(f"[bench]   {dst.name}: /proc/self/exe -> {link.decode()} ({whole} strings, {len(tails)}+{len(heads)} "
          "immediates)", file=sys.stderr)
    return 0


def cmd_alternate(argv):
    """alternate DIR RUNS WARMUP NAME=CMD...: runs each row's command (a
    shell-quoted argv, run without a shell) once in turn, RUNS times after
    WARMUP turns, timing spawn to exit; writes DIR/NAME.json as hyperfine
    exports do. Rows that alternate every run see the same drift of a VM's
    speed, which rows measured one after the other do not."""
    import shlex
    section, runs, warmup = Path(argv[0]), int(argv[1]), int(argv[2])
    rows = [(a.split("=", 1)[0], shlex.split(a.split("=", 1)[1])) for a in argv[3:]]
    times = {name: [] for name, _ in rows}
    for i in range(warmup + runs):
        for name, cmd in rows:
            start = time.perf_counter()
            pid = os.posix_spawnp(cmd[0], cmd, os.environ)
            _, status = os.waitpid(pid, 0)
            took = time.perf_counter() - start
            if os.waitstatus_to_exitcode(status) != 0:
                sys.exit(f"{name}: {cmd[0]} exited with {os.waitstatus_to_exitcode(status)}")
            if i >= warmup:
                times[name].append(took)
    for name, cmd in rows:
        t = sorted(times[name])
        result = {"command": " ".join(cmd), "times": t, "mean": statistics.fmean(t),
                  "stddev": statistics.stdev(t) if len(t) > 1 else 0.0,
                  "median": statistics.median(t), "min": t[0], "max": t[-1]}
        (section / f"{name}.json").write_text(json.dumps({"results": [result]}))
    return 0


def main():
    cmds = {"mem": cmd_mem, "report": cmd_report, "relay": cmd_relay, "large": cmd_large,
            "egress": cmd_egress, "serve": cmd_serve, "alternate": cmd_alternate, "selfexe": cmd_selfexe}
    if len(sys.argv) < 2 or sys.argv[1] not in cmds:
        sys.exit(__doc__)
    return cmds[sys.argv[1]](sys.argv[2:])


if __name__ == "__main__":
    sys.exit(main())
