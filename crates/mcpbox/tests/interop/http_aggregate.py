"""Drives `mcpbox serve`'s aggregated endpoint /mcp with the official MCP
Python SDK's Streamable HTTP client.

usage: http_aggregate.py URL TOKEN MARKER

The gateway serves two servers, `plain` (crates/testservers) and
`conformance` (the project's conformance fixture). MARKER is a value only
this client knows: it is echoed back and must come back unchanged. Prints
one line per check; any failure exits 1 with the reason.
"""
import asyncio
import sys

from mcp import ClientSession, types
from mcp.client.streamable_http import streamable_http_client
from mcp.shared._httpx_utils import create_mcp_http_client
from checks import check, text_of


async def roots(context):
    return types.ListRootsResult(roots=[types.Root(uri="file:///workspace/input", name="input")])


async def sampling(context, params):
    return types.CreateMessageResult(
        role="assistant",
        content=types.TextContent(type="text", text="sampled by the python client"),
        model="test-model",
        stopReason="endTurn",
    )


async def main():
    url, token, marker = sys.argv[1], sys.argv[2], sys.argv[3]
    http = create_mcp_http_client(headers={"Authorization": f"Bearer {token}"})
    async with http:
        async with streamable_http_client(url, http_client=http) as (read, write):
            async with ClientSession(
                read, write, list_roots_callback=roots, sampling_callback=sampling
            ) as s:
                init = await s.initialize()
                check(init.server_info.name == "mcpbox", "the aggregate answers as mcpbox")
                tools = {t.name for t in (await s.list_tools()).tools}
                check("plain__echo" in tools, "plain's echo is listed as plain__echo")
                check(
                    "conformance__test_simple_text" in tools,
                    "the fixture's tools are listed under conformance__",
                )
                check("echo" not in tools, "no name is listed without its server's prefix")
                check("plain__add" not in tools, "the denied tool is not listed")
                r = await s.call_tool("plain__echo", {"text": marker})
                check(text_of(r) == marker, "plain__echo returns this client's own value")
                r = await s.call_tool("plain__add", {"a": 1, "b": 2})
                check(r.is_error and "refused" in text_of(r), "plain__add is refused by policy")
                r = await s.call_tool("plain__ask_client", {})
                check("file:///workspace/input" in text_of(r), "a member's roots request reaches the client and its answer the member")
                r = await s.call_tool("conformance__test_sampling", {"prompt": "hi"})
                check("sampled by the python client" in text_of(r), "a member's sampling request round-trips")
                r = await s.call_tool("conformance__test_simple_text", {})
                check("simple text" in text_of(r), "the fixture's tool answers")
                res = await s.read_resource("test://static-text")
                check("static text" in res.contents[0].text, "a resource is read from the server that lists it")
                prompts = {p.name for p in (await s.list_prompts()).prompts}
                check("conformance__test_simple_prompt" in prompts, "prompts are listed with their prefix")
                p = await s.get_prompt("conformance__test_simple_prompt", {})
                check(len(p.messages) > 0, "a prefixed prompt is fetched")
                try:
                    await s.call_tool("nobody__echo", {})
                    check(False, "a name of no server is refused")
                except Exception as e:  # the SDK raises on a JSON-RPC error
                    check("no server" in str(e), "a name of no server is refused")
    print("done", flush=True)


asyncio.run(main())
