"""Drives `mcpbox run` with the official MCP Python SDK client.

usage: client.py SCENARIO MODE MCPBOX POLICY -- SERVER [ARGS...]

MODE is the SDK's connect mode: "legacy" (initialize handshake) or
"2026-07-28" (stateless: server/discover, per-request _meta). Each scenario
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


SCENARIOS = {"everything": everything, "filesystem": filesystem, "time": time_server, "git": git_server}


async def main():
    scenario, mode, mcpbox, policy = sys.argv[1:5]
    assert sys.argv[5] == "--"
    server = sys.argv[6:]
    params = StdioServerParameters(
        command=mcpbox, args=["run", "--policy", policy, "--", *server], env=dict(os.environ)
    )
    async with Client(params, mode=mode, read_timeout_seconds=60) as c:
        await SCENARIOS[scenario](c)
    print("done", flush=True)


asyncio.run(main())
