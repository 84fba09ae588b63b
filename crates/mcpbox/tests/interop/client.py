"""Drives `mcpbox run` with the official MCP Python SDK client.

usage: client.py SCENARIO MODE MCPBOX POLICY -- SERVER [ARGS...]
       client.py SCENARIO http URL TOKEN

MODE is the SDK's connect mode: "legacy" (initialize handshake) or
"2026-07-28" (stateless: server/discover, per-request _meta). With "http",
the server is behind `mcpbox serve` at URL (Streamable HTTP, a legacy
handshake), reached with TOKEN as the client's bearer token. Each scenario
asserts what must hold and prints one line per check; any failure exits 1
with the reason.
"""
import asyncio
import os
import sys

from mcp import Client, StdioServerParameters
from checks import check, text_of


async def everything(c):
    tools = {t.name for t in (await c.list_tools()).tools}
    check("echo" in tools, "echo is listed")
    check("get-sum" not in tools, "denied tool get-sum is hidden from tools/list")
    r = await c.call_tool("echo", {"message": "hello through mcpbox"})
    check(not r.is_error and "hello through mcpbox" in text_of(r), "echo round-trips")
    secret = os.environ["MCPBOX_INTEROP_SECRET"]
    r = await c.call_tool("get-env", {})
    env_text = text_of(r)
    check(secret not in env_text, "the secret's value never reaches the client")
    check("[REDACTED:API_KEY]" in env_text, "the secret is shown redacted")
    check("MCPBOX_INTEROP_SECRET" not in env_text, "mcpbox's own environment does not reach the server")
    r = await c.call_tool("get-sum", {"a": 1, "b": 2})
    check(r.is_error and "tool.rule" in text_of(r), "a denied call is refused with a readable reason")
    r = await c.call_tool("get-tiny-image", {})
    check(r.is_error and "approval" in text_of(r), "an approve rule without elicitation is refused")


async def filesystem(c):
    tools = {t.name for t in (await c.list_tools()).tools}
    check("read_text_file" in tools and "write_file" in tools, "filesystem tools are listed")
    r = await c.call_tool("read_text_file", {"path": "/workspace/input/hello.txt"})
    check(not r.is_error and "hello from the host" in text_of(r), "reads a file in its workspace")
    for path in ["/etc/shadow", "/workspace/input/../../etc/passwd", "/root/.ssh/id_rsa",
                 "/workspace/input/escape-link", os.environ["MCPBOX_INTEROP_HOST_SECRET"]]:
        r = await c.call_tool("read_text_file", {"path": path})
        check(r.is_error and "top secret" not in text_of(r), f"cannot read {path}")
    r = await c.call_tool("write_file", {"path": "/workspace/output/written.txt", "content": "from the server"})
    check(not r.is_error, "writes into /workspace/output")
    r = await c.call_tool("write_file", {"path": "/workspace/input/evil.txt", "content": "x"})
    check(r.is_error, "cannot write into the read-only input")
    r = await c.call_tool("move_file", {"source": "/workspace/output/written.txt", "destination": "/workspace/output/moved.txt"})
    check(r.is_error and "approval" in text_of(r), "move_file needs approval and is refused without it")


async def filesystem_serve(c):
    """server-filesystem behind `mcpbox serve`, over /workspace/output of
    the session's sandbox."""
    tools = {t.name for t in (await c.list_tools()).tools}
    check("read_text_file" in tools and "write_file" in tools, "filesystem tools are listed")
    r = await c.call_tool("write_file", {"path": "/workspace/output/served.txt", "content": "from serve"})
    check(not r.is_error, "writes into its sandbox's /workspace/output")
    r = await c.call_tool("read_text_file", {"path": "/workspace/output/served.txt"})
    check(not r.is_error and "from serve" in text_of(r), "reads it back")
    r = await c.call_tool("read_text_file", {"path": "/etc/shadow"})
    check(r.is_error, "cannot read /etc/shadow")


async def filesystem_roots(c):
    """server-filesystem started without directories: it takes the client's
    roots, which name host paths; mcpbox translates them to the sandbox's
    and drops the one outside."""
    host_input, host_output = os.environ["MCPBOX_INTEROP_HOST_INPUT"], os.environ["MCPBOX_INTEROP_HOST_OUTPUT"]
    # the server asks for the roots once the handshake is done, on its own
    # time: wait (bounded) until it has them
    for _ in range(100):
        r = await c.call_tool("list_allowed_directories", {})
        allowed = text_of(r)
        if "/workspace" in allowed:
            break
        await asyncio.sleep(0.1)
    check(not r.is_error and "/workspace/input" in allowed and "/workspace/output" in allowed,
          "the host's roots reach the server as /workspace/input and /workspace/output")
    check(host_input not in allowed and "/etc" not in allowed,
          "neither the host's paths nor the root outside the sandbox reach the server")
    r = await c.call_tool("read_text_file", {"path": f"{host_input}/hello.txt"})
    check(not r.is_error and "hello from the host" in text_of(r),
          "a read of a host path is a read of its sandbox path")
    r = await c.call_tool("write_file", {"path": f"{host_output}/via-host-path.txt", "content": "translated"})
    check(not r.is_error, "a write to a host path in output lands in output")
    r = await c.call_tool("write_file", {"path": "/workspace/output/draft.txt", "content": "draft"})
    check(not r.is_error, "writes a draft")
    r = await c.call_tool("move_file", {"source": "/workspace/output/draft.txt",
                                        "destination": "/workspace/output/final.txt"})
    check(not r.is_error, "moves it into place")
    r = await c.call_tool("read_text_file", {"path": "/etc/passwd"})
    check(r.is_error and "argument.path_outside" in text_of(r), "a path outside is refused at the gateway")


def host_roots():
    """The roots the client offers: MCPBOX_INTEROP_ROOTS, URIs separated by spaces."""
    from mcp import types
    uris = os.environ.get("MCPBOX_INTEROP_ROOTS", "").split()

    async def cb(context):
        return types.ListRootsResult(roots=[types.Root(uri=u, name=f"root {i}") for i, u in enumerate(uris)])
    return cb


async def time_server(c):
    tools = {t.name for t in (await c.list_tools()).tools}
    check("get_current_time" in tools, "time tools are listed")
    r = await c.call_tool("get_current_time", {"timezone": "UTC"})
    check(not r.is_error and "UTC" in text_of(r), "get_current_time answers")


async def git_server(c):
    repo = os.environ["MCPBOX_INTEROP_REPO"]
    tools = {t.name for t in (await c.list_tools()).tools}
    check("git_status" in tools and "git_log" in tools, "git tools are listed")
    r = await c.call_tool("git_status", {"repo_path": repo})
    status = text_of(r)
    check("dubious ownership" not in status, f"git trusts the root-owned repository: {status[:300]}")
    check(not r.is_error and "On branch main" in status, f"git_status answers: {status[:300]}")
    check("untracked.txt" in status, "git_status sees the untracked file")
    r = await c.call_tool("git_log", {"repo_path": repo, "max_count": 5})
    log = text_of(r)
    check(not r.is_error and "first commit from root" in log, f"git_log answers: {log[:300]}")


SCENARIOS = {"everything": everything, "filesystem": filesystem, "filesystem_serve": filesystem_serve,
             "filesystem_roots": filesystem_roots,
             "time": time_server, "git": git_server}


async def main():
    if sys.argv[2] == "http":
        from mcp.client.streamable_http import streamable_http_client
        from mcp.shared._httpx_utils import create_mcp_http_client
        scenario, _, url, token = sys.argv[1:5]
        http = create_mcp_http_client(headers={"Authorization": f"Bearer {token}"})
        async with http:
            async with Client(streamable_http_client(url, http_client=http), mode="legacy",
                              read_timeout_seconds=60) as c:
                await SCENARIOS[scenario](c)
        print("done", flush=True)
        return
    scenario, mode, mcpbox, policy = sys.argv[1:5]
    assert sys.argv[5] == "--"
    server = sys.argv[6:]
    params = StdioServerParameters(
        command=mcpbox, args=["run", "--policy", policy, "--", *server], env=dict(os.environ)
    )
    extra = {"list_roots_callback": host_roots()} if os.environ.get("MCPBOX_INTEROP_ROOTS") else {}
    async with Client(params, mode=mode, read_timeout_seconds=60, **extra) as c:
        await SCENARIOS[scenario](c)
    print("done", flush=True)


asyncio.run(main())
