"""Several sessions of one agent at once on one server (issue 32): the
official Python SDK's `Client` in its default mode ("auto", which probes
with a session of its own first), twice at once, plus one in the stateless
2026-07-28 mode, all open together against /servers/<name>/mcp. Each writes
a file into the shared workspace and reads the others' files.

usage: many_sessions.py URL TOKEN

Prints one line per check; any failure exits 1.
"""
import asyncio
import sys
from contextlib import AsyncExitStack

from mcp import Client
from mcp.client.streamable_http import streamable_http_client
from mcp.shared._httpx_utils import create_mcp_http_client
from checks import check, text_of


async def main():
    url, token = sys.argv[1:3]
    async with AsyncExitStack() as stack:
        clients = []
        for mode in ["auto", "auto", "2026-07-28"]:
            http = await stack.enter_async_context(
                create_mcp_http_client(headers={"Authorization": f"Bearer {token}"}))
            transport = streamable_http_client(url, http_client=http)
            c = await stack.enter_async_context(Client(transport, mode=mode))
            clients.append((mode, c))
        check(len(clients) == 3, "three clients are open at once")
        for i, (mode, c) in enumerate(clients):
            r = await c.call_tool("write", {"path": f"/workspace/output/c{i}.txt", "text": mode})
            check(not r.is_error, f"client {i} ({mode}) writes: {text_of(r)}")
        for i, (mode, c) in enumerate(clients):
            for j, (other, _) in enumerate(clients):
                r = await c.call_tool("read", {"path": f"/workspace/output/c{j}.txt"})
                check(text_of(r) == other, f"client {i} ({mode}) reads client {j}'s file")
    print("done", flush=True)


asyncio.run(main())
