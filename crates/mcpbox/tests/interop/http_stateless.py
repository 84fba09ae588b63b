"""The stateless revision (2026-07-28) over HTTP: the official Python SDK's
`Client` in mode "2026-07-28" (no handshake, per-request `_meta`,
`server/discover`) against `mcpbox serve`'s aggregated endpoint /mcp, which
serves `plain` (with `add` denied) and the conformance fixture.

usage: http_stateless.py URL TOKEN

Prints one line per check; any failure exits 1.
"""
import asyncio
import sys

from mcp import Client
from mcp.client.streamable_http import streamable_http_client
from mcp.shared._httpx_utils import create_mcp_http_client
from checks import check, text_of


async def main():
    url, token = sys.argv[1:3]
    http = create_mcp_http_client(headers={"Authorization": f"Bearer {token}"})
    async with http:
        transport = streamable_http_client(url, http_client=http)
        async with Client(transport, mode="2026-07-28") as c:
            tools = {t.name for t in (await c.list_tools()).tools}
            check("plain__echo" in tools, "plain__echo is listed without a handshake")
            check("conformance__test_simple_text" in tools, "the fixture's tools are listed")
            check("plain__add" not in tools, "the denied tool is not listed")
            r = await c.call_tool("conformance__test_simple_text", {})
            check("simple text" in text_of(r), "a stateless call reaches the server its prefix names")
            r = await c.call_tool("plain__add", {"a": 1, "b": 2})
            check(r.is_error and "refused" in text_of(r), "the denied tool is refused statelessly too")
    print("done", flush=True)


asyncio.run(main())
