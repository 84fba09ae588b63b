"""A human approval through MCP elicitation over Streamable HTTP: the
official Python SDK client against `mcpbox serve`'s /servers/plain/mcp,
where the policy says `echo = "approve"`.

usage: http_approval.py URL TOKEN ANSWER [TOOL [MODE]]

ANSWER is what the client's human says: "approve", "decline", or "none"
(the client declares no elicitation capability at all). TOOL is the
name echo has at URL (`plain__echo` on /mcp). MODE "2026-07-28" drives
the SDK's stateless `Client`, which takes no server-to-client requests:
there the question comes back as an `InputRequiredResult` the SDK answers
through the same callback and retries the call with. Prints one line per
check; any failure exits 1 with the reason.
"""
import asyncio
import sys

from mcp import Client, ClientSession, types
from mcp.client.streamable_http import streamable_http_client
from mcp.shared._httpx_utils import create_mcp_http_client
from checks import check, text_of

asked = []


async def main():
    url, token, answer = sys.argv[1], sys.argv[2], sys.argv[3]
    tool = sys.argv[4] if len(sys.argv) > 4 else "echo"
    mode = sys.argv[5] if len(sys.argv) > 5 else "legacy"

    async def elicit(context, params):
        asked.append(params.message)
        if answer == "approve":
            return types.ElicitResult(action="accept", content={"approve": True})
        return types.ElicitResult(action="decline")

    http = create_mcp_http_client(headers={"Authorization": f"Bearer {token}"})
    callback = None if answer == "none" else elicit
    async with http:
        if mode == "2026-07-28":
            transport = streamable_http_client(url, http_client=http)
            async with Client(transport, mode=mode, elicitation_callback=callback) as c:
                r = await c.call_tool(tool, {"text": "approved-value"})
        else:
            async with streamable_http_client(url, http_client=http) as (read, write):
                async with ClientSession(read, write, elicitation_callback=callback) as s:
                    await s.initialize()
                    r = await s.call_tool(tool, {"text": "approved-value"})
    if answer == "approve":
        check(len(asked) == 1 and "echo" in asked[0], "the human was asked about echo")
        check(not r.is_error and text_of(r) == "approved-value", "the approved call ran")
    elif answer == "decline":
        check(len(asked) == 1, "the human was asked")
        check(r.is_error and "approval.declined" in text_of(r), "the declined call was refused")
    else:
        check(not asked, "nobody could be asked")
        check(r.is_error and "approval.pending" in text_of(r), "without elicitation the call is refused, naming the approval")
    print("done", flush=True)


asyncio.run(main())
