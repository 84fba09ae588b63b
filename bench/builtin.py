#!/usr/bin/env python3
"""mcpbox's built-in sandbox server, measured (bench/run's builtin section).

  builtin.py exec --mcpbox M --bwrap B --srt S --srt-settings F --out FILE --dir D [--runs N]
      One `mcpbox run --builtin sandbox` (stdio): N `exec` calls of `true`
      and of `python3 -c pass` (argv) and of the line `true | true` (whose
      parse runs in the command checker's child) in the warm sandbox, call
      to result. Beside
      them, the same programs started N times directly, under bwrap and
      under srt (spawn to exit).
  builtin.py fresh --mcpbox M --out FILE --dir D [--runs N] [--pause S]
      `mcpbox serve` with `builtin = "sandbox"` from a directory template,
      twice: with `ready = 0` and with the template's default ready
      workspaces (issue 28). N new tasks each, S seconds apart (0.4), each
      timed from `initialize` to the result of its first `exec true` (a new
      sandbox: its workspace, its cgroups, the server started), each
      followed by a new session in an existing sandbox (the server starts,
      no sandbox is made: the floor), and the gateway's own measure of
      join to a sandbox ready for its server (the `created` records'
      `detail.made_us`, from the audit log).
  builtin.py tables OUT
      The markdown rows of both, with E2B's published start time beside.

Rows say "status": "ok" or "failed" with "why"; the exit code is 0 either way.
"""
import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from mcpclient import Failed, Http, Stdio, handshake, summarize_ms  # noqa: E402
from lifecycle import free_port  # noqa: E402

# E2B's own figure for a sandbox start (Firecracker microVM restored from a
# snapshot), as its site and docs publish it; not measured here (no
# network, and no KVM in this VM).
E2B_START_MS = 100
E2B_SOURCE = ("E2B's docs, Sandbox overview (e2b.dev/docs/sandbox; docs/sandbox.mdx of "
              "github.com/e2b-dev/docs, January 2026): \"Sandboxes can start in as little as ~100ms\"")


def opts(argv, keys):
    o = {}
    i = 0
    while i < len(argv):
        k = argv[i].lstrip("-").replace("-", "_")
        if k not in keys:
            raise SystemExit(f"unknown option {argv[i]}")
        o[k] = argv[i + 1]
        i += 2
    return o


def write(out, result):
    Path(out).write_text(json.dumps(result, indent=1))


def call(t, tool, args):
    res, _ = t.request("tools/call", {"name": tool, "arguments": args})
    if res.get("isError"):
        raise Failed(f"{tool} refused: {json.dumps(res)[:200]}")
    sc = res.get("structuredContent") or {}
    if sc.get("exit_code") != 0:
        raise Failed(f"{tool} {args} exited {sc.get('exit_code')}: {sc.get('stderr', '')[:200]}")
    return res


def spawn_times(cmd, runs):
    samples = []
    for _ in range(runs):
        t0 = time.perf_counter()
        r = subprocess.run(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        samples.append(time.perf_counter() - t0)
        if r.returncode != 0:
            raise Failed(f"{cmd[0]} exited {r.returncode}")
    return summarize_ms(samples)


def cmd_exec(argv):
    o = opts(argv, {"mcpbox", "bwrap", "srt", "srt_settings", "out", "dir", "runs", "label"})
    runs = int(o.get("runs", 100))
    # --label before: MCPBOX_BEFORE's binary; its mcpbox rows only, named "before ..."
    label = o.get("label", "mcpbox")
    d = Path(o["dir"])
    d.mkdir(parents=True, exist_ok=True)
    policy = d / "sandbox.toml"
    policy.write_text('[server]\nname = "bench-sandbox"\n[process]\npids = 256\n')
    result = {"status": "ok", "runs": runs, "rows": {}}
    rows = result["rows"]
    # absolute paths: the same programs inside and outside (a `python3` on
    # the bench's PATH may be a pyenv shim, a shell script)
    progs = {"true": ["/usr/bin/true"], "python": ["/usr/bin/python3", "-c", "pass"]}
    err = open(d / "stderr.log", "wb")
    env = dict(os.environ, MCPBOX_STATE_DIR=str(d / "state"))
    try:
        saved = dict(os.environ)
        os.environ.update(env)
        try:
            t = Stdio([o["mcpbox"], "run", "--builtin", "sandbox", "--policy", str(policy)], err)
        finally:
            os.environ.clear()
            os.environ.update(saved)
        try:
            handshake(t)
            for name, argv in progs.items():
                for _ in range(5):
                    call(t, "exec", {"argv": argv})
                samples = []
                for _ in range(runs):
                    t0 = time.perf_counter()
                    call(t, "exec", {"argv": argv})
                    samples.append(time.perf_counter() - t0)
                rows[f"{label}-builtin exec {name}"] = summarize_ms(samples)
            # a line with a pipe: parsed in the command checker's child
            samples = []
            for _ in range(runs):
                t0 = time.perf_counter()
                call(t, "exec", {"command": "/usr/bin/true | /usr/bin/true"})
                samples.append(time.perf_counter() - t0)
            rows[f"{label}-builtin exec line, a pipe (parsed in the checker child)"] = summarize_ms(samples)
        finally:
            t.close()
    except Failed as e:
        result = {"status": "failed", "why": str(e)}
        write(o["out"], result)
        return
    if label != "mcpbox":
        write(o["out"], result)
        return
    bwrap = [o["bwrap"], "--unshare-all", "--unshare-user", "--cap-drop", "ALL",
             "--ro-bind", "/usr", "/usr", "--symlink", "usr/bin", "/bin", "--symlink", "usr/lib", "/lib",
             "--symlink", "usr/lib64", "/lib64", "--ro-bind", "/etc", "/etc", "--proc", "/proc",
             "--dev", "/dev", "--tmpfs", "/tmp", "--die-with-parent", "--new-session", "--"]
    for name, argv in progs.items():
        prog = argv
        for label, cmd, n in (("direct", prog, runs),
                              ("bwrap", bwrap + prog, runs),
                              ("srt", [o["srt"], "-s", o["srt_settings"], "--", *prog], max(5, runs // 10))):
            try:
                rows[f"{label} {name}"] = spawn_times(cmd, n)
            except (Failed, OSError) as e:
                rows[f"{label} {name}"] = {"status": "failed", "why": str(e)}
    write(o["out"], result)


def made_us(audit_db):
    """(`made_us`, `ready`) of each sandbox `created` record, oldest first:
    join to a sandbox ready for its server, as the gateway measured it."""
    import sqlite3
    con = sqlite3.connect(f"file:{audit_db}?mode=ro", uri=True)
    try:
        rows = con.execute("SELECT detail FROM events WHERE kind = 'lifecycle' ORDER BY seq").fetchall()
    finally:
        con.close()
    out = []
    for (detail,) in rows:
        d = json.loads(detail)
        if d.get("action") == "created" and "made_us" in d:
            out.append((d["made_us"], bool(d.get("ready"))))
    return out


def fresh_gateway(o, d, ready):
    """A `mcpbox serve` in `d` whose builtin sandbox server is made from a
    one-file template with `ready` workspaces made ahead: (process, url)."""
    if d.exists():
        shutil.rmtree(d)
    (d / "template").mkdir(parents=True)
    (d / "template" / "README.md").write_text("the template\n")
    d.chmod(0o755)
    port = free_port()
    (d / "sandbox.toml").write_text('[server]\nname = "bench-sandbox"\n[process]\npids = 256\n')
    ready_line = "" if ready is None else f"ready = {ready}\n"
    (d / "serve.toml").write_text(
        f'[listen]\naddress = "127.0.0.1:{port}"\n'
        '[limits]\nmax_sandboxes_per_client = 8192\nrate_per_second = 1000000\nburst = 1000000\n'
        f'[[templates]]\nname = "t"\nbase = "template"\npolicy = "sandbox.toml"\n{ready_line}'
        '[[clients]]\nname = "bench"\ndangerously_allow_anonymous = true\n'
        '[[servers]]\nname = "sandbox"\nbuiltin = "sandbox"\ntemplate = "t"\n')
    log = open(d / "gateway.log", "wb")
    env = dict(os.environ, MCPBOX_STATE_DIR=str(d / "state"))
    gw = subprocess.Popen([o["mcpbox"], "serve", "--config", str(d / "serve.toml")],
                          stdout=subprocess.DEVNULL, stderr=log, env=env)
    deadline = time.monotonic() + 30
    while not (d / "state" / "control.sock").exists():
        if time.monotonic() > deadline or gw.poll() is not None:
            gw.kill()
            raise Failed("the gateway did not start (see gateway.log)")
        time.sleep(0.05)
    return gw, f"http://127.0.0.1:{port}/servers/sandbox/mcp"


def stop(gw):
    gw.terminate()
    try:
        gw.wait(timeout=30)
    except subprocess.TimeoutExpired:
        gw.kill()


def first_exec(url, task):
    """`initialize` of task `task` to the result of its first `exec true`, s."""
    t0 = time.perf_counter()
    t = Http(url, {"Mcpbox-Task": task})
    handshake(t)
    call(t, "exec", {"argv": ["true"]})
    dt = time.perf_counter() - t0
    t.close()
    return dt


def cmd_fresh(argv):
    o = opts(argv, {"mcpbox", "out", "dir", "runs", "label", "pause"})
    runs = int(o.get("runs", 30))
    label = o.get("label", "mcpbox")
    # time between two new tasks, so that the ready workspaces are made
    # again between them (a new task every few hundred ms, not a burst)
    pause = float(o.get("pause", 0.4))
    rows = {}
    try:
        # ready = 0: every new sandbox makes its workspace on the session's
        # path (mcpbox before issue 28); the default (2): it takes one
        for ready, name in ((0, "ready = 0"), (None, "ready workspaces (default)")):
            d = Path(o["dir"]) / ("ready-0" if ready == 0 else "ready-default")
            try:
                gw, url = fresh_gateway(o, d, ready)
            except Failed as e:
                rows[f"{label}-builtin fresh sandbox, {name}"] = {"status": "failed", "why": str(e)}
                continue
            try:
                samples, warm = [], []
                first_exec(url, "warm")
                for i in range(runs + 3):
                    time.sleep(pause)
                    dt = first_exec(url, f"fresh-{i}")
                    # a new session in a sandbox that exists: the server
                    # starts, no sandbox is made (the floor of the above)
                    dw = first_exec(url, "warm")
                    if i >= 3:
                        samples.append(dt)
                        warm.append(dw)
                made = made_us(d / "state" / "audit.db")[-runs:]
                rows[f"{label}-builtin fresh sandbox, {name}"] = summarize_ms(samples)
                rows[f"{label}-builtin new session in an existing sandbox, {name}"] = summarize_ms(warm)
                if made:
                    row = summarize_ms([us / 1e6 for us, _ in made])
                    row["took_ready"] = sum(1 for _, r in made if r)
                    rows[f"{label}-builtin sandbox ready for its server (detail.made_us), {name}"] = row
            finally:
                stop(gw)
        write(o["out"], {"status": "ok", "runs": runs, "rows": rows})
    except (Failed, OSError) as e:
        write(o["out"], {"status": "failed", "why": str(e), "rows": rows})


def cmd_tables(argv):
    out = Path(argv[0]) / "builtin"
    lines = ["", "### Built-in sandbox server", "",
             "| row | median ms | p90 ms | vs direct |", "|---|---|---|---|"]
    def load(name):
        return json.loads((out / name).read_text()) if (out / name).exists() else {}
    ex, fr = load("exec.json"), load("fresh.json")
    # MCPBOX_BEFORE's rows (bench/run writes them only when it is set)
    exb, frb = load("exec-before.json"), load("fresh-before.json")
    parts = [ex, fr] + [p for p in (exb, frb) if p]
    for part in parts:
        if part.get("status") != "ok":
            lines.append(f"| failed | {part.get('why', 'not run')} | | |")
            continue
        for name, row in part["rows"].items():
            if "p50_ms" not in row:
                lines.append(f"| {name} | failed: {row.get('why')} | | |")
                continue
            prog = name.rsplit(" ", 1)[-1]
            base = ex.get("rows", {}).get(f"direct {prog}", {}).get("p50_ms")
            ratio = f"{row['p50_ms'] / base:.2f}x" if base else ""
            lines.append(f"| {name} | {row['p50_ms']:.2f} | {row['p90_ms']:.2f} | {ratio} |")
    lines.append(f"| E2B sandbox start (published, not measured) | {E2B_START_MS} | | |")
    lines.append("")
    lines.append(f"E2B's figure: {E2B_SOURCE}.")
    text = "\n".join(lines) + "\n"
    (out / "table.md").write_text(text)
    # before/after figures for tools.py report (its record_pairs format)
    pairs = []
    for after, before in ((ex, exb), (fr, frb)):
        if not before:
            continue
        for name, row in after.get("rows", {}).items():
            if not name.startswith("mcpbox-builtin"):
                continue
            b = before.get("rows", {}).get("before" + name[len("mcpbox"):], {})
            pairs.append([name[len("mcpbox-"):] + ", median", "ms", b.get("p50_ms"), row.get("p50_ms")])
        if before.get("status") != "ok" and after.get("status") == "ok":
            pairs.append([f"builtin: before failed: {before.get('why')}"[:90], "", None, None])
    if pairs:
        (out.parent / "before-after").mkdir(exist_ok=True)
        (out.parent / "before-after" / "6-builtin.json").write_text(
            json.dumps({"section": "6-builtin", "rows": pairs}, indent=2))
    print(text)


if __name__ == "__main__":
    {"exec": cmd_exec, "fresh": cmd_fresh, "tables": cmd_tables}[sys.argv[1]](sys.argv[2:])
