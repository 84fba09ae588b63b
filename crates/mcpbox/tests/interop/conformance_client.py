"""The conformance suite's client scenarios with mcpbox on the server side.

usage (by the suite): conformance client --command "python conformance_client.py" --scenario S
The suite starts its scenario server and appends its URL; MCP_CONFORMANCE_SCENARIO
names the scenario. MCPBOX_BIN is the mcpbox binary.

This script starts `mcpbox serve` with that URL as a remote upstream (the
gateway is then the MCP client the scenario server judges), and drives the
gateway with the official Python SDK client as a real agent would. What the
scenario server sees is what mcpbox sent on the agent's behalf.
"""
import asyncio
import os
import shutil
import subprocess
import sys
import tempfile
import urllib.parse

from mcp import ClientSession, types
from mcp.client.streamable_http import streamable_http_client
from mcp.shared._httpx_utils import create_mcp_http_client

TOKEN = "conformance-client-token-5d1e"


def start_gateway(url):
    up = urllib.parse.urlsplit(url)
    d = tempfile.mkdtemp(prefix="mcpbox-conformance-client-")
    with open(os.path.join(d, "up.toml"), "w") as f:
        f.write(f'[server]\nname = "up"\n[network]\nallow = ["{up.hostname}:{up.port}"]\n[tools]\ndefault = "allow"\n')
    with open(os.path.join(d, "serve.toml"), "w") as f:
        f.write(
            '[listen]\naddress = "127.0.0.1:0"\n'
            '[[clients]]\nname = "agent"\ntoken = { from_env = "AGENT_TOKEN" }\n'
            f'[[servers]]\nname = "up"\nurl = "{url}"\npolicy = "up.toml"\n'
        )
    env = dict(os.environ, AGENT_TOKEN=TOKEN, MCPBOX_STATE_DIR=os.path.join(d, "state"))
    p = subprocess.Popen(
        [os.environ["MCPBOX_BIN"], "serve", "--config", os.path.join(d, "serve.toml")],
        stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, env=env, text=True,
    )
    for line in p.stderr:
        sys.stderr.write(line)
        if line.startswith("mcpbox: serving on "):
            return p, line.split("serving on ", 1)[1].strip(), d
    raise SystemExit(f"mcpbox serve did not start (exit {p.wait()})")


async def elicit_with_defaults(context, params):
    # the client applies the schema's defaults for fields it has no value for
    props = (params.requested_schema or {}).get("properties", {})
    content = {k: v["default"] for k, v in props.items() if "default" in v}
    return types.ElicitResult(action="accept", content=content)


async def drive(base, scenario):
    http = create_mcp_http_client(headers={"Authorization": f"Bearer {TOKEN}"})
    async with http:
        async with streamable_http_client(f"{base}/servers/up/mcp", http_client=http) as (read, write):
            async with ClientSession(read, write, elicitation_callback=elicit_with_defaults) as s:
                await s.initialize()
                tools = [t.name for t in (await s.list_tools()).tools]
                if scenario == "tools_call":
                    await s.call_tool("add_numbers", {"a": 5, "b": 3})
                elif scenario == "elicitation-sep1034-client-defaults":
                    await s.call_tool("test_client_elicitation_defaults", {})
                elif scenario == "sse-retry":
                    for t in tools:
                        await s.call_tool(t, {})
                        break


def main():
    url = sys.argv[-1]
    scenario = os.environ.get("MCP_CONFORMANCE_SCENARIO", "initialize")
    gw, base, d = start_gateway(url)
    try:
        asyncio.run(drive(base, scenario))
    finally:
        gw.terminate()
        try:
            gw.wait(timeout=20)
        except subprocess.TimeoutExpired:
            gw.kill()
            gw.wait()
        # the gateway's directory (config, state, audit) is this run's alone
        shutil.rmtree(d, ignore_errors=True)


main()
