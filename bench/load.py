#!/usr/bin/env python3
"""Load test of `mcpbox serve` (or any Streamable HTTP MCP endpoint):
C clients x N calls, every answer checked (Python 3 standard library only).

  load.py --url URL [--clients 100] [--calls 1000] [--tool echo]
          [--arg message] [--open 16] [--out FILE] [--name NAME]
          [--fallback-url URL2 --fallback-tool TOOL2] [-- CMD ...]

Each client is an MCP session of its own on its own keep-alive connection
(bench/mcphttp.py's client). All clients initialize first; then all send
`tools/call TOOL {ARG: "<client's random 64-bit hex>:<call number>"}`,
each call as soon as its previous one is answered, with the same JSON-RPC
ids in every client (the gateway must route by session, not by id). An
answer is good only when it is HTTP 200 with the request's id, not an
error, and its one text item ends with exactly the client's own value and
counter. An answer that holds another client's value is a leak.

URL is the endpoint: `http://127.0.0.1:PORT/servers/everything/mcp` (one
server) or `http://127.0.0.1:PORT/mcp` with `--tool everything__echo`
(the aggregating endpoint). With --fallback-url, an endpoint that answers
initialize with 404 (a gateway without /mcp yet) is replaced by URL2 and
TOOL2, and the result says so ("fell_back"). With `-- CMD`, CMD (the gateway) is started
first, waited for on URL's port, and ended afterwards.

Prints one JSON line (and writes it to FILE): clients, calls, ok, errors,
leaks, sessions that failed, calls/s over the call phase, latency
percentiles, the first errors. Exit code 0 only with zero errors and zero
leaks.
"""

import json
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import mcpclient  # noqa: E402
import mcphttp  # noqa: E402


def load(url, clients, calls, tool, arg, max_open):
    out = {"url": url, "tool": tool, "clients": clients, "calls_per_client": calls}
    cs = mcphttp.new_clients(url, clients, tool, arg)
    try:
        t0 = time.perf_counter()
        # every session first: the call phase then measures calls only
        mcphttp.run(cs, mcphttp.handshake, max_open)
        out["open_s"] = time.perf_counter() - t0
        opened = [c for c in cs if not c.error]
        out["sessions_failed"] = len(cs) - len(opened)

        def flow(c):
            for n in range(1, calls + 1):
                # the same id sequence in every client
                c.next_id = n - 1
                resp = yield ("call", c.call(n))
                c.check_echo(resp, n)

        t0 = time.perf_counter()
        mcphttp.run(opened, flow)
        elapsed = time.perf_counter() - t0
        stopped = [c for c in opened if c.error]
        ok = sum(c.ok for c in cs)
        errors = sum(c.errors for c in cs)
        # a call never answered (client stopped, session not opened) is an error too
        unanswered = clients * calls - ok - errors
        out.update({
            "calls": clients * calls, "ok": ok, "errors": errors + unanswered,
            "wrong_answers": errors, "unanswered": unanswered,
            "leaks": sum(c.leaks for c in cs), "clients_stopped": len(stopped),
            # keep-alive connections the gateway closed while idle (reopened)
            "reconnects": sum(c.reconnects for c in cs),
            "elapsed_s": elapsed, "calls_per_s": ok / elapsed if elapsed > 0 else None,
            "latency": mcphttp.summarize_ms([x for c in cs for x in c.samples.get("call", [])]),
        })
        first = [c.error for c in cs if c.error][:3] + [e for c in cs for e in c.first_errors][:5]
        if first:
            out["first_errors"] = first
        mcphttp.delete_sessions(opened)
    finally:
        mcphttp.close_all(cs)
    return out


def answers_404(url, tool, arg):
    """Whether initialize on url is answered 404 (no such endpoint)."""
    cs = mcphttp.new_clients(url, 1, tool, arg)
    try:
        mcphttp.run(cs, mcphttp.handshake)
        if cs[0].error is None:
            mcphttp.delete_sessions(cs)
        return cs[0].error is not None and "HTTP 404" in cs[0].error
    finally:
        mcphttp.close_all(cs)


def main(argv):
    o = {"url": None, "clients": "100", "calls": "1000", "tool": "echo", "arg": "message",
         "open": "16", "out": None, "name": "load", "ready": "60",
         "fallback-url": None, "fallback-tool": "echo"}
    o, cmd = mcpclient.parse(argv, o, __doc__, "load.py")
    if not o["url"]:
        sys.exit(__doc__)
    target, log = None, None
    result = {"name": o["name"]}
    try:
        if cmd:
            log = open(str(o["out"] or "load") + ".log", "wb")
            target = mcphttp.Target(cmd, o["url"], log, float(o["ready"]))
        url, tool = o["url"], o["tool"]
        if o["fallback-url"] and answers_404(url, tool, o["arg"]):
            result["fell_back"] = {"from": url, "why": "initialize answered HTTP 404"}
            url, tool = o["fallback-url"], o["fallback-tool"]
        result.update(load(url, int(o["clients"]), int(o["calls"]), tool, o["arg"],
                           int(o["open"])))
        result["status"] = "ok"
    except (mcphttp.Failed, OSError, ValueError) as e:
        result["status"] = "failed"
        result["why"] = str(e)[:300] or type(e).__name__
    finally:
        if target:
            target.stop()
        if log:
            log.close()
    line = json.dumps(result)
    print(line)
    if o["out"]:
        Path(o["out"]).write_text(json.dumps(result, indent=2))
    clean = result["status"] == "ok" and result.get("errors") == 0 and result.get("leaks") == 0
    return 0 if clean else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
