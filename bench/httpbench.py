#!/usr/bin/env python3
"""Loopback HTTP server and client for bench/run's end-to-end egress figure
(Python 3 standard library only).

  httpbench.py serve --port-file FILE
      Serves on 127.0.0.1 (a free port, written to FILE) until killed:
      GET /bytes/N answers N bytes (streamed in 256 KiB chunks, never held in
      memory), GET /small answers one byte. Each answer closes its connection.
  httpbench.py client --url BASE [--mib M] [--conns N] [--env-proxy]
      Downloads BASE/bytes/(M MiB) once, then makes N requests to BASE/small,
      each on a new connection; prints one JSON line: bytes, seconds, MB/s,
      per-request latency p50/p99 in ms. With --env-proxy it uses the
      HTTP_PROXY that mcpbox sets inside a sandbox; without it, no proxy at all.
"""

import json
import statistics
import sys
import time
import urllib.request
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

CHUNK = 256 * 1024


class Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.0"

    def do_GET(self):
        if self.path.startswith("/bytes/"):
            try:
                n = int(self.path[len("/bytes/"):])
            except ValueError:
                self.send_error(400)
                return
        elif self.path == "/small":
            n = 1
        else:
            self.send_error(404)
            return
        self.send_response(200)
        self.send_header("Content-Type", "application/octet-stream")
        self.send_header("Content-Length", str(n))
        self.end_headers()
        block = b"\xa5" * CHUNK
        while n > 0:
            k = min(n, CHUNK)
            self.wfile.write(block[:k])
            n -= k

    def log_message(self, *args):
        pass


def serve(argv):
    if len(argv) != 2 or argv[0] != "--port-file":
        sys.exit(__doc__)
    srv = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    srv.daemon_threads = True
    with open(argv[1], "w") as f:
        f.write(str(srv.server_address[1]))
    srv.serve_forever()


def client(argv):
    url, mib, conns, env_proxy = None, 256, 200, False
    i = 0
    while i < len(argv):
        if argv[i] == "--url":
            url, i = argv[i + 1], i + 2
        elif argv[i] == "--mib":
            mib, i = int(argv[i + 1]), i + 2
        elif argv[i] == "--conns":
            conns, i = int(argv[i + 1]), i + 2
        elif argv[i] == "--env-proxy":
            env_proxy, i = True, i + 1
        else:
            sys.exit(__doc__)
    if not url:
        sys.exit(__doc__)
    handlers = [] if env_proxy else [urllib.request.ProxyHandler({})]
    opener = urllib.request.build_opener(*handlers)
    out = {"url": url, "proxy": env_proxy}
    want = mib * 1024 * 1024
    t0 = time.perf_counter()
    got = 0
    with opener.open(f"{url}/bytes/{want}", timeout=60) as r:
        while True:
            b = r.read(1 << 20)
            if not b:
                break
            got += len(b)
    secs = time.perf_counter() - t0
    out.update({"bytes": got, "seconds": secs, "mb_per_s": got / secs / 1e6})
    if got != want:
        out["error"] = f"short download: {got} of {want} bytes"
    lat = []
    for _ in range(conns):
        t = time.perf_counter()
        with opener.open(f"{url}/small", timeout=30) as r:
            r.read()
        lat.append((time.perf_counter() - t) * 1e3)
    if lat:
        lat.sort()
        out.update({"conns": conns, "request_p50_ms": statistics.median(lat),
                    "request_p99_ms": lat[min(len(lat) - 1, int(0.99 * len(lat)))]})
    print(json.dumps(out))


def main():
    if len(sys.argv) < 2 or sys.argv[1] not in ("serve", "client"):
        sys.exit(__doc__)
    (serve if sys.argv[1] == "serve" else client)(sys.argv[2:])


if __name__ == "__main__":
    main()
