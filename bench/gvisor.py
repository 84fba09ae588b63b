#!/usr/bin/env python3
"""The two isolation tiers side by side (bench/run's gvisor section; Python 3
standard library only): the same figures under `[sandbox] isolation =
"namespaces"` and `"gvisor"`, in one run, rows alternating tier by tier so
that a drift of the machine's speed falls on both.

  gvisor.py compare --out FILE --dir DIR --mcpbox BIN --server BIN
                    [--runs 10] [--calls 200]
      For each tier, with its policy written into DIR:
      - start-up: spawn `mcpbox run --policy P -- SERVER` to the answer of
        the first tools/list (after initialize), RUNS times;
      - echo: CALLS sequential `tools/call echo` on one session (SERVER is
        the project's `plain` test server);
      - exec: CALLS `exec {"argv": ["python3", "-c", "pass"]}` calls to the
        built-in server (`mcpbox run --builtin sandbox`);
      - pause/resume: the first call after an idle pause under `serve`
        (the pause is the cgroup freezer under namespaces, `runsc pause`
        under gVisor) is measured by lifecycle.py resume --tier.
  gvisor.py tables OUT
      OUT/gvisor/*.json into OUT/extra/gvisor.json (tools.py report prints it).

FILE gets {"status": "ok", "tiers": {TIER: {FIGURE: summary}}} or
"failed" with "why"; a tier that cannot run (no runsc, not root) is
"failed" with the reason, never skipped silently.
"""

import json
import os
import sys
import time
from pathlib import Path

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from mcpclient import Failed, Stdio, handshake, parse, summarize_ms, write  # noqa: E402

TIERS = ("namespaces", "gvisor")


def policy(d, tier, server_dir, builtin):
    """The policy of `tier`: the server's directory mounted at the same path."""
    name = f"{tier}-{'builtin' if builtin else 'plain'}.toml"
    text = f'[server]\nname = "bench-{tier}"\n[sandbox]\nisolation = "{tier}"\n'
    if builtin:
        # gVisor's resident figures are larger (docs/isolation.md)
        text += '[jobs]\nmax_memory = "512MiB"\n[tools]\ndefault = "allow"\n'
    else:
        text += f'[[filesystem.mounts]]\nhost = "{server_dir}"\nat = "{server_dir}"\n'
    p = d / name
    p.write_text(text)
    return p


def start(o, p, server, err):
    if server is None:
        return Stdio([o["mcpbox"], "run", "--builtin", "sandbox", "--policy", str(p)], err)
    return Stdio([o["mcpbox"], "run", "--policy", str(p), "--", server], err)


def coldstart(o, p, err):
    t0 = time.perf_counter()
    t = start(o, p, o["server"], err)
    try:
        handshake(t)
        t.request("tools/list")
        return time.perf_counter() - t0
    finally:
        t.close()


def calls(o, p, err, builtin, n):
    t = start(o, p, None if builtin else o["server"], err)
    try:
        handshake(t)
        t.request("tools/list")
        if builtin:
            name, args = "exec", {"argv": ["python3", "-c", "pass"]}
        else:
            name, args = "echo", {"message": "x"}
        samples = []
        for i in range(n + 5):
            t0 = time.perf_counter()
            result, _ = t.request("tools/call", {"name": name, "arguments": args})
            dt = time.perf_counter() - t0
            if result.get("isError"):
                raise Failed(f"{name}: {json.dumps(result)[:200]}")
            if builtin and (result.get("structuredContent") or {}).get("exit_code") != 0:
                raise Failed(f"exec python3 -c pass: {json.dumps(result)[:200]}")
            if i >= 5:  # five warm-up calls
                samples.append(dt)
        return samples
    finally:
        t.close()


def cmd_compare(argv):
    o, _ = parse(argv, {"out": None, "dir": None, "mcpbox": None, "server": None,
                        "runs": "10", "calls": "200"}, __doc__, "gvisor.py")
    if not all(o[k] for k in ("out", "dir", "mcpbox", "server")):
        sys.exit(__doc__)
    d = Path(o["dir"])
    d.mkdir(parents=True, exist_ok=True)
    server_dir = str(Path(o["server"]).resolve().parent)
    runs, n = int(o["runs"]), int(o["calls"])
    tiers = {t: {"start": [], "echo": [], "exec": []} for t in TIERS}
    why = {}
    with open(d / "stderr.log", "ab") as err:
        pol = {(t, b): policy(d, t, server_dir, b) for t in TIERS for b in (False, True)}
        # whether each tier runs here at all, once, with its reason
        for t in TIERS:
            try:
                coldstart(o, pol[(t, False)], err)
            except Exception as e:  # noqa: BLE001 - the row says why
                why[t] = f"{type(e).__name__}: {e}"
        live = [t for t in TIERS if t not in why]
        for _ in range(runs):
            for t in live:
                tiers[t]["start"].append(coldstart(o, pol[(t, False)], err))
        for t in live:
            try:
                tiers[t]["echo"] = calls(o, pol[(t, False)], err, False, n)
                tiers[t]["exec"] = calls(o, pol[(t, True)], err, True, n)
            except Exception as e:  # noqa: BLE001
                why[t] = f"{type(e).__name__}: {e}"
    result = {"status": "ok", "tiers": {}, "why": why}
    for t in TIERS:
        if t in why:
            result["tiers"][t] = {"status": "failed", "why": why[t]}
        else:
            result["tiers"][t] = {k: summarize_ms(v) for k, v in tiers[t].items()}
    write(o["out"], result)


def cmd_tables(argv):
    out = Path(argv[0])
    g = out / "gvisor"
    try:
        cmp = json.loads((g / "compare.json").read_text())
    except (OSError, ValueError) as e:
        cmp = {"status": "failed", "why": str(e)}
    resume = {}
    for t in TIERS:
        try:
            resume[t] = json.loads((g / f"resume-{t}.json").read_text())
        except (OSError, ValueError) as e:
            resume[t] = {"status": "failed", "why": str(e)}

    def fig(t, key):
        if cmp.get("status") != "ok":
            return None
        s = cmp["tiers"].get(t, {})
        return (s.get(key) or {}).get("p50_ms")

    def resumed(t):
        r = resume[t]
        if r.get("status") != "ok":
            return None
        return (r.get("after") or {}).get("p50_ms")

    rows, notes = [], []
    for label, get in [("start-up to the first tools/list (p50 ms)", lambda t: fig(t, "start")),
                       ("echo round trip (p50 ms)", lambda t: fig(t, "echo")),
                       ("built-in exec of python3 -c pass (p50 ms)", lambda t: fig(t, "exec")),
                       ("first call after an idle pause (p50 ms)", resumed)]:
        ns, gv = get("namespaces"), get("gvisor")
        ratio = round(gv / ns, 2) if ns and gv else None
        rows.append([label, round(ns, 3) if ns else "failed", round(gv, 3) if gv else "failed", ratio])
    for t in TIERS:
        if cmp.get("status") == "ok" and cmp["tiers"].get(t, {}).get("status") == "failed":
            notes.append(f"{t}: {cmp['tiers'][t]['why']}")
        if resume[t].get("status") != "ok":
            notes.append(f"{t} pause/resume: {resume[t].get('why')}")
    if cmp.get("status") != "ok":
        notes.append(f"compare: {cmp.get('why')}")
    notes.append("ratio: gvisor / namespaces; the two tiers alternate run by run")
    table = {"title": "isolation tiers: namespaces beside gvisor (runsc --platform=ptrace)",
             "columns": ["figure", "namespaces", "gvisor", "gvisor/namespaces"],
             "rows": rows, "notes": notes}
    (out / "extra").mkdir(parents=True, exist_ok=True)
    (out / "extra" / "gvisor.json").write_text(json.dumps(table, indent=2))


def main():
    if len(sys.argv) < 2 or sys.argv[1] not in ("compare", "tables"):
        sys.exit(__doc__)
    if sys.argv[1] == "compare":
        cmd_compare(sys.argv[2:])
    else:
        cmd_tables(sys.argv[2:])


if __name__ == "__main__":
    main()
