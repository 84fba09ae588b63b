"""Drives mcpbox's built-in sandbox server with the official MCP Python SDK.

usage: builtin.py SCENARIO stdio MCPBOX POLICY
       builtin.py SCENARIO http URL TOKEN [URL TOKEN]

Each scenario asserts what must hold and prints one line per check; any
failure exits 1 with the reason; the last line is "done".
"""
import asyncio
import json
import os
import sys
import time

from mcp import Client, StdioServerParameters
from mcp.client.streamable_http import streamable_http_client
from mcp.shared._httpx_utils import create_mcp_http_client
from checks import check, text_of

TOOLS = {"exec", "run_code", "read_file", "write_file", "list_files", "delete_file",
         "start_job", "job_status", "job_output", "stop_job", "snapshot", "restore",
         "export_artifact", "reset"}


def data(r):
    return r.structured_content or {}


async def wait_job(c, job, limit=30):
    deadline = time.monotonic() + limit
    while time.monotonic() < deadline:
        r = await c.call_tool("job_status", {"job_id": job})
        state = data(r)["jobs"][0]
        if state["state"] != "running":
            return state
        await asyncio.sleep(0.1)
    check(False, f"job {job} ended within {limit}s")


async def task(c):
    """The multi-step task: write a file, run code that reads it, start a
    background job, poll it to completion, export its artifact."""
    tools = {t.name: t for t in (await c.list_tools()).tools}
    check(TOOLS <= set(tools), "all fourteen tools are listed")
    check(tools["exec"].annotations.destructive_hint is True
          and tools["read_file"].annotations.read_only_hint is True,
          "tools carry MCP annotations (exec destructive, read_file read-only)")
    check(tools["exec"].output_schema is not None, "tools declare an output schema")

    r = await c.call_tool("write_file", {"path": "/workspace/tmp/data.txt", "content": "3 5 8\n"})
    check(not r.is_error and data(r)["bytes"] == 6, "write_file writes into the workspace")
    code = "print(sum(int(x) for x in open('/workspace/tmp/data.txt').read().split()))"
    r = await c.call_tool("run_code", {"language": "python", "code": code})
    check(not r.is_error and data(r)["exit_code"] == 0 and data(r)["stdout"].strip() == "16",
          "run_code runs python inside the sandbox, reading the file written before")
    r = await c.call_tool("run_code", {"language": "node", "code": "console.log(6*7)"})
    check(data(r)["stdout"].strip() == "42", "run_code runs node too")
    r = await c.call_tool("exec", {"command": "echo out; echo err >&2; exit 3"})
    check(data(r)["exit_code"] == 3 and data(r)["stdout"] == "out\n" and data(r)["stderr"] == "err\n",
          "exec returns exit status, stdout and stderr apart")
    r = await c.call_tool("exec", {"argv": ["sh", "-c", "pwd"]})
    check(data(r)["stdout"].strip() == "/workspace/tmp", "exec argv runs without a shell, in /workspace/tmp")

    r = await c.call_tool("snapshot", {"name": "before"})
    check(not r.is_error and data(r)["name"] == "before", "snapshot checkpoints the workspace")
    await c.call_tool("write_file", {"path": "/workspace/tmp/data.txt", "content": "changed"})
    await c.call_tool("write_file", {"path": "/workspace/tmp/new.txt", "content": "new"})
    r = await c.call_tool("restore", {"name": "before"})
    check(not r.is_error, "restore brings a snapshot back")
    r = await c.call_tool("read_file", {"path": "/workspace/tmp/data.txt"})
    check(data(r)["content"] == "3 5 8\n", "the restored file has its old content")
    r = await c.call_tool("list_files", {"path": "/workspace/tmp"})
    names = [e["path"] for e in data(r)["entries"]]
    check("/workspace/tmp/new.txt" not in names, "a file made after the snapshot is gone")
    r = await c.call_tool("reset", {})
    check(not r.is_error, "reset goes back to the template")
    r = await c.call_tool("read_file", {"path": "/workspace/tmp/data.txt"})
    check(r.is_error, "after reset the task's files are gone")
    await c.call_tool("write_file", {"path": "/workspace/tmp/data.txt", "content": "3 5 8\n"})
    job_cmd = ("for i in 1 2 3; do echo step $i; sleep 0.2; done; "
               "python3 -c \"open('/workspace/tmp/result.txt','w').write('42\\n')\"")
    r = await c.call_tool("start_job", {"command": job_cmd})
    check(not r.is_error and data(r)["state"] == "running", "start_job starts a background job")
    job = data(r)["job_id"]
    r = await c.call_tool("exec", {"command": "echo while the job runs"})
    check(data(r)["stdout"].strip() == "while the job runs", "calls go on while the job runs")
    state = await wait_job(c, job)
    check(state["state"] == "exited" and state["exit_code"] == 0, "the job is polled to completion")
    r = await c.call_tool("job_output", {"job_id": job})
    out = data(r)
    check("step 3" in out["stdout"] and out["stdout_next"] == len(out["stdout"].encode()),
          "job_output returns its output and the next offset")
    r = await c.call_tool("job_output", {"job_id": job, "stdout_offset": out["stdout_next"]})
    check(data(r)["stdout"] == "", "reading on from the next offset gives nothing new")

    r = await c.call_tool("export_artifact", {"path": "/workspace/tmp/result.txt"})
    check(not r.is_error and data(r)["path"] == "/workspace/output/result.txt" and data(r)["bytes"] == 3,
          "export_artifact copies the job's artifact into /workspace/output")

    print("done", flush=True)


async def refusals(c):
    """Paths outside /workspace, a denied command category, the job limits."""
    for path in ["/etc/passwd", "../etc/passwd", "/workspace/../etc/passwd", "file:///etc/shadow",
                 "/workspacex/a"]:
        r = await c.call_tool("read_file", {"path": path})
        check(r.is_error and "argument.path_outside" in text_of(r), f"read_file {path} is refused at the gateway")
    r = await c.call_tool("exec", {"command": "ln -s /etc /workspace/tmp/etc-link"})
    check(data(r)["exit_code"] == 0, "a symlink out of the workspace can be planted")
    r = await c.call_tool("read_file", {"path": "/workspace/tmp/etc-link/passwd"})
    check(r.is_error and "outside the workspace" in text_of(r),
          "a read through the planted symlink is refused (RESOLVE_BENEATH)")
    r = await c.call_tool("write_file", {"path": "/workspace/tmp/etc-link/x", "content": "x"})
    check(r.is_error and "argument.path_outside" in text_of(r) and "tools.outside_paths" in text_of(r),
          "a write through it is refused at the gateway, which follows the link as the sandbox would")
    r = await c.call_tool("exec", {"command": "ls", "cwd": "/etc"})
    check(r.is_error and "argument.path_outside" in text_of(r), "a cwd outside the workspace is refused")
    # the server is non-dumpable: the agent's code (its child, same user)
    # reads neither its environment (its secrets) nor its memory
    if os.environ.get("MCPBOX_TEST_TIER") == "gvisor":
        # gVisor (2022-12) does not close a non-dumpable process's environ
        # to its own uid; the server's environment is the one the agent's
        # code inherits anyway (docs/isolation.md). Its memory stays closed.
        r = await c.call_tool("exec", {"command": "head -c 1 /proc/$PPID/mem"})
        check(data(r)["exit_code"] != 0 and "Permission denied" in data(r)["stderr"] and data(r)["stdout"] == "",
              "the server's /proc mem is closed to the agent's code")
    else:
        r = await c.call_tool("exec", {"command": "head -c 64 /proc/$PPID/environ; head -c 1 /proc/$PPID/mem"})
        check(data(r)["exit_code"] != 0 and "Permission denied" in data(r)["stderr"] and data(r)["stdout"] == "",
              "the server's /proc environ and mem are closed to the agent's code")
    r = await c.call_tool("delete_file", {"path": "/workspace/output"})
    check(r.is_error, "the workspace's own directories cannot be deleted")

    for line in ["sudo id", "echo hi && chown nobody /workspace/tmp", "ls | (su root)", "sh -c 'sudo ls'"]:
        r = await c.call_tool("exec", {"command": line})
        check(r.is_error and "command.category" in text_of(r) and "privilege" in text_of(r),
              f"exec of a denied category ({line!r}) is refused with its reason")
    r = await c.call_tool("exec", {"argv": ["sudo", "id"]})
    check(r.is_error and "command.category" in text_of(r), "so is the same command as argv")
    r = await c.call_tool("run_code", {"language": "sh", "code": "echo hi\nsudo id"})
    check(r.is_error and "command.category" in text_of(r), "and as a shell snippet of run_code")
    r = await c.call_tool("start_job", {"command": "sleep 1; sudo id"})
    check(r.is_error and "command.category" in text_of(r), "and as a background job")
    r = await c.call_tool("exec", {"command": "$X rm -rf /"})
    check(r.is_error and "commands.unparsed" in text_of(r), "a program named by an expansion is never run silently (approval, and no way to ask here)")
    r = await c.call_tool("exec", {"command": "curl http://127.0.0.1:1/"})
    check(r.is_error and "command.program" in text_of(r), "a program rule refuses curl")

    jobs = []
    for i in range(2):
        r = await c.call_tool("start_job", {"command": "sleep 30"})
        check(not r.is_error, f"job {i + 1} of 2 starts")
        jobs.append(data(r)["job_id"])
    r = await c.call_tool("start_job", {"command": "sleep 30"})
    check(r.is_error and "job.limit" in text_of(r), "a job over jobs.max_running is refused with job.limit")
    for j in jobs:
        r = await c.call_tool("stop_job", {"job_id": j})
        check(data(r)["state"] == "stopped", f"stop_job stops {j}")
    r = await c.call_tool("start_job", {"command": "sleep 30", "timeout_seconds": 0.5})
    state = await wait_job(c, data(r)["job_id"])
    check(state["state"] == "timeout" and state["reason"] == "job.timeout",
          "a job past its time limit is stopped and reported as timeout (job.timeout)")
    hog = "import time\nb=[]\nwhile True:\n    b.append(b'x' * (4 << 20))\n    time.sleep(0.005)\n"
    r = await c.call_tool("start_job", {"argv": ["python3", "-c", hog]})
    state = await wait_job(c, data(r)["job_id"])
    check(state["state"] == "memory" and state["reason"] == "job.memory",
          "a job past jobs.max_memory is stopped and reported as memory (job.memory)")
    r = await c.call_tool("exec", {"command": "sleep 30", "timeout_seconds": 0.3})
    check(data(r)["state"] == "timeout", "an exec past its timeout is stopped and says so")
    print("done", flush=True)


async def isolation(a, b):
    """Two agents: neither sees the other's files or processes."""
    r = await a.call_tool("write_file", {"path": "/workspace/tmp/alice.txt", "content": "alice's"})
    check(not r.is_error, "alice writes a file")
    r = await a.call_tool("start_job", {"command": "exec sleep 37"})
    check(not r.is_error, "alice starts a job")
    r = await b.call_tool("list_files", {"path": "/workspace", "recursive": True})
    paths = [e["path"] for e in data(r)["entries"]]
    check(not any("alice" in p for p in paths), "bob's workspace has none of alice's files")
    r = await b.call_tool("exec", {"command": "cat /workspace/tmp/alice.txt; ls /proc | grep -c '^[0-9]'; ps -eo args 2>/dev/null || cat /proc/[0-9]*/cmdline | tr '\\0' ' '"})
    check("alice's" not in data(r)["stdout"] and "sleep 37" not in data(r)["stdout"],
          "bob sees neither alice's file nor her job's process")
    r = await a.call_tool("exec", {"command": "cat /proc/[0-9]*/cmdline | tr '\\0' ' '"})
    check("sleep 37" in data(r)["stdout"], "alice sees her own job")
    r = await b.call_tool("exec", {"command": "cat /proc/[0-9]*/environ 2>/dev/null | tr '\\0' '\\n'; env"})
    check("other-server-secret-9e1c" not in data(r)["stdout"], "another server's secret is not visible inside")
    out = data(r)["stdout"]
    check("OWN_TOKEN=" in out and os.environ["BUILTIN_SECRET"] not in out,
          "its own secret is in its environment, and redacted on the way out")
    print("done", flush=True)


async def main():
    scenario, mode = sys.argv[1:3]
    if mode == "stdio":
        mcpbox, policy = sys.argv[3:5]
        params = StdioServerParameters(command=mcpbox, args=["run", "--builtin", "sandbox", "--policy", policy],
                                       env=dict(os.environ))
        async with Client(params, mode="legacy", read_timeout_seconds=60) as c:
            await SCENARIOS[scenario](c)
        return
    urls = sys.argv[3:]
    clients = []
    for i in range(0, len(urls), 2):
        http = create_mcp_http_client(headers={"Authorization": f"Bearer {urls[i + 1]}"})
        clients.append((urls[i], http))
    if scenario == "isolation":
        (ua, ha), (ub, hb) = clients
        async with ha, hb:
            async with Client(streamable_http_client(ua, http_client=ha), mode="legacy", read_timeout_seconds=60) as a:
                async with Client(streamable_http_client(ub, http_client=hb), mode="legacy", read_timeout_seconds=60) as b:
                    await isolation(a, b)
        return
    url, http = clients[0]
    async with http:
        async with Client(streamable_http_client(url, http_client=http), mode="legacy", read_timeout_seconds=60) as c:
            await SCENARIOS[scenario](c)


SCENARIOS = {"task": task, "refusals": refusals}

asyncio.run(main())
