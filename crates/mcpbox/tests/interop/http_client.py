"""Drives `mcpbox serve` over Streamable HTTP with the official MCP Python SDK.

usage: http_client.py SCENARIO URL TOKEN

The token goes in an `Authorization: Bearer` header on every request (an
httpx2 client made by the SDK's own create_mcp_http_client). Each scenario
asserts what must hold and prints one line per check; any failure exits 1
with the reason; the last line is "done".
"""
import asyncio
import sys

from mcp import Client, types
from mcp.client.streamable_http import streamable_http_client
from mcp.shared._httpx_utils import create_mcp_http_client
from checks import check, text_of

ROOT = "file:///workspace/from-the-python-client"


async def list_roots(context):
    return types.ListRootsResult(roots=[types.Root(uri=ROOT, name="test root")])


async def sampling(context, params):
    asked = params.messages[0].content.text
    return types.CreateMessageResult(
        role="assistant",
        content=types.TextContent(type="text", text=f"sampled by python: {asked}"),
        model="python-test-model",
        stop_reason="endTurn",
    )


async def plain(c):
    tools = {t.name for t in (await c.list_tools()).tools}
    check("echo" in tools, "echo is listed")
    check("add" not in tools, "the denied tool add is hidden from tools/list")
    r = await c.call_tool("echo", {"text": "hello over http"})
    check(not r.is_error and text_of(r) == "hello over http", "echo round-trips")
    r = await c.call_tool("add", {"a": 1, "b": 2})
    check(r.is_error and "tool.rule" in text_of(r), "a denied call is refused with its reason")
    r = await c.call_tool("ask_client", {})
    check(not r.is_error and ROOT in text_of(r),
          "the server's roots/list reached the client's callback over HTTP and its answer came back")


async def everything(c):
    tools = {t.name for t in (await c.list_tools()).tools}
    check("echo" in tools, "echo is listed")
    check("get-sum" not in tools, "the denied tool get-sum is hidden from tools/list")
    r = await c.call_tool("echo", {"message": "hello over http"})
    check(not r.is_error and "hello over http" in text_of(r), "echo round-trips")
    r = await c.call_tool("get-sum", {"a": 1, "b": 2})
    check(r.is_error and "tool.rule" in text_of(r), "a denied call is refused with its reason")
    check("trigger-sampling-request" in tools, "the sampling tool is offered (the client said it samples)")
    r = await c.call_tool("trigger-sampling-request", {"prompt": "ping", "maxTokens": 5})
    check(not r.is_error and "sampled by python" in text_of(r),
          "the server's sampling/createMessage reached the client's callback over HTTP")


SCENARIOS = {"plain": plain, "everything": everything}


async def main():
    scenario, url, token = sys.argv[1:4]
    http = create_mcp_http_client(headers={"Authorization": f"Bearer {token}"})
    async with http:
        transport = streamable_http_client(url, http_client=http)
        async with Client(transport, mode="legacy", read_timeout_seconds=60,
                          list_roots_callback=list_roots, sampling_callback=sampling) as c:
            await SCENARIOS[scenario](c)
    print("done", flush=True)


asyncio.run(main())
