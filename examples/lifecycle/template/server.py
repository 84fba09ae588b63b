"""A minimal MCP stdio server: one tool, write_report, which writes
/workspace/output/report.md (the artifact the notes policy declares).
Standard library only; one JSON-RPC message per line."""

import json
import os
import sys

OUTPUT = "/workspace/output"

TOOL = {
    "name": "write_report",
    "description": "Write text to report.md in the workspace output",
    "inputSchema": {
        "type": "object",
        "properties": {"text": {"type": "string"}},
        "required": ["text"],
    },
}


def answer(req):
    method = req.get("method")
    if method == "initialize":
        return {
            "protocolVersion": req.get("params", {}).get("protocolVersion", "2025-06-18"),
            "capabilities": {"tools": {}},
            "serverInfo": {"name": "notes", "version": "0.1.0"},
        }
    if method == "tools/list":
        return {"tools": [TOOL]}
    if method == "tools/call":
        args = req.get("params", {}).get("arguments", {})
        with open(os.path.join(OUTPUT, "report.md"), "w", encoding="utf-8") as f:
            f.write(str(args.get("text", "")))
        return {"content": [{"type": "text", "text": "wrote report.md"}]}
    if method == "ping":
        return {}
    return None


def main():
    for line in sys.stdin:
        try:
            req = json.loads(line)
        except ValueError:
            continue
        if "id" not in req:
            continue  # a notification
        result = answer(req)
        if result is None:
            msg = {"jsonrpc": "2.0", "id": req["id"],
                   "error": {"code": -32601, "message": "method not found"}}
        else:
            msg = {"jsonrpc": "2.0", "id": req["id"], "result": result}
        sys.stdout.write(json.dumps(msg) + "\n")
        sys.stdout.flush()


if __name__ == "__main__":
    main()
