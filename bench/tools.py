#!/usr/bin/env python3
"""Helpers for bench/run (Python 3 standard library only).

  tools.py mem --name NAME --out FILE -- CMD [ARGS...]
      Runs CMD and samples VmRSS/VmHWM of that process (not its children)
      from /proc/PID/status until it exits; writes JSON to FILE.
  tools.py report DIR
      Prints the tables for one bench/run result directory and writes
      DIR/summary.json.
"""

import json
import os
import subprocess
import sys
import time
from pathlib import Path

# Start-up rows in this order; anything else follows alphabetically.
STARTUP_ORDER = ["true", "mcpbox", "bwrap", "srt"]
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
        print("start-up: spawn to exit of /bin/true (hyperfine -N)")
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

    extra_dir = out / "extra"
    for f in sorted(extra_dir.glob("*.json")) if extra_dir.is_dir() else []:
        data = json.loads(f.read_text())
        summary["extra"].append(data)
        print()
        print(data.get("title", f.stem))
        print(table(data["columns"], data["rows"]))
        for note in data.get("notes", []):
            print(note)

    (out / "summary.json").write_text(json.dumps(summary, indent=2))
    print()
    return 0


def main():
    if len(sys.argv) < 2 or sys.argv[1] not in ("mem", "report"):
        sys.exit(__doc__)
    if sys.argv[1] == "mem":
        return cmd_mem(sys.argv[2:])
    return cmd_report(sys.argv[2:])


if __name__ == "__main__":
    sys.exit(main())
