//! The tools' definitions: names, descriptions, JSON Schemas of their
//! arguments and results, and MCP annotations. The gateway's policy sees
//! these names (`[tools]` rules, `[commands]` on `exec`), so they are part
//! of the interface: renaming one is a breaking change.

use serde_json::{json, Value};

/// The tools whose `path` argument names a file in the workspace (checked
/// by the gateway too, in the call decision: one list for both).
pub use mcpbox_policy::call::BUILTIN_PATH_TOOLS as PATH_TOOLS;

fn tool(
    name: &str,
    title: &str,
    description: &str,
    input: Value,
    output: Value,
    read_only: bool,
    destructive: bool,
) -> Value {
    json!({
        "name": name,
        "title": title,
        "description": description,
        "inputSchema": input,
        "outputSchema": output,
        "annotations": {
            "title": title,
            "readOnlyHint": read_only,
            "destructiveHint": destructive,
            "idempotentHint": read_only,
            "openWorldHint": false,
        },
    })
}

fn obj(props: Value, required: &[&str]) -> Value {
    json!({"type": "object", "properties": props, "required": required, "additionalProperties": false})
}

fn out(props: Value, required: &[&str]) -> Value {
    json!({"type": "object", "properties": props, "required": required})
}

fn run_result() -> Value {
    out(
        json!({
            "state": {"type": "string", "enum": ["exited", "killed", "timeout", "memory", "stopped"]},
            "exit_code": {"type": ["integer", "null"]},
            "signal": {"type": ["integer", "null"]},
            "stdout": {"type": "string"},
            "stderr": {"type": "string"},
            "stdout_truncated": {"type": "boolean"},
            "stderr_truncated": {"type": "boolean"},
            "duration_ms": {"type": "integer"},
        }),
        &[
            "state",
            "exit_code",
            "signal",
            "stdout",
            "stderr",
            "duration_ms",
        ],
    )
}

fn run_props(extra: Value) -> Value {
    let mut p = json!({
        "cwd": {"type": "string", "description": "Working directory inside /workspace (default /workspace/tmp)."},
        "env": {"type": "object", "additionalProperties": {"type": "string"}, "description": "Environment variables added to the sandbox's own."},
        "timeout_seconds": {"type": "number", "exclusiveMinimum": 0, "description": "Stop it after this long (at most the policy's jobs.exec_timeout, which is also the default)."},
    });
    if let (Some(p), Some(e)) = (p.as_object_mut(), extra.as_object()) {
        for (k, v) in e {
            p.insert(k.clone(), v.clone());
        }
    }
    p
}

fn command_props() -> Value {
    json!({
        "command": {"type": "string", "description": "A shell command line, run by /bin/sh -c."},
        "argv": {"type": "array", "items": {"type": "string"}, "minItems": 1, "description": "An argument vector, run without a shell."},
    })
}

/// Every tool, in the order `tools/list` gives them.
pub fn list() -> Vec<Value> {
    let job_state = out(
        json!({
            "job_id": {"type": "string"},
            "state": {"type": "string", "enum": ["running", "exited", "killed", "timeout", "memory", "stopped"]},
            "exit_code": {"type": ["integer", "null"]},
            "signal": {"type": ["integer", "null"]},
            "started_ms": {"type": "integer"},
            "duration_ms": {"type": "integer"},
            "stdout_bytes": {"type": "integer"},
            "stderr_bytes": {"type": "integer"},
            "reason": {"type": ["string", "null"]},
        }),
        &["job_id", "state"],
    );
    vec![
        tool(
            "exec",
            "Run a command",
            "Run a command in this sandbox and wait for it: `command` (a shell command line) or `argv`. Returns its exit status and its output (cut to the policy's limit). Use start_job for anything that should keep running.",
            obj(run_props(command_props()), &[]),
            run_result(),
            false,
            true,
        ),
        tool(
            "run_code",
            "Run a code snippet",
            "Run a snippet of code with an interpreter inside the sandbox: language python (python3), node (javascript) or sh. Same result as exec.",
            obj(
                run_props(json!({
                    "language": {"type": "string", "enum": ["python", "node", "javascript", "sh"]},
                    "code": {"type": "string"},
                })),
                &["language", "code"],
            ),
            run_result(),
            false,
            true,
        ),
        tool(
            "read_file",
            "Read a file",
            "Read a file under /workspace (relative paths are relative to /workspace). Text comes back as is, other bytes as base64.",
            obj(
                json!({
                    "path": {"type": "string"},
                    "offset": {"type": "integer", "minimum": 0},
                    "max_bytes": {"type": "integer", "minimum": 1},
                }),
                &["path"],
            ),
            out(
                json!({
                    "path": {"type": "string"}, "size": {"type": "integer"}, "offset": {"type": "integer"},
                    "content": {"type": "string"}, "encoding": {"type": "string", "enum": ["utf-8", "base64"]},
                    "truncated": {"type": "boolean"},
                }),
                &["path", "size", "content", "encoding"],
            ),
            true,
            false,
        ),
        tool(
            "write_file",
            "Write a file",
            "Create or replace (or append to) a file under /workspace/output or /workspace/tmp. Give `content` (text) or `content_base64`.",
            obj(
                json!({
                    "path": {"type": "string"},
                    "content": {"type": "string"},
                    "content_base64": {"type": "string"},
                    "append": {"type": "boolean"},
                    "create_dirs": {"type": "boolean", "description": "Make missing parent directories (default true)."},
                }),
                &["path"],
            ),
            out(json!({"path": {"type": "string"}, "bytes": {"type": "integer"}, "appended": {"type": "boolean"}}), &["path", "bytes"]),
            false,
            true,
        ),
        tool(
            "list_files",
            "List files",
            "List a directory under /workspace (default /workspace), recursively if asked. Links are listed, never followed.",
            obj(json!({"path": {"type": "string"}, "recursive": {"type": "boolean"}}), &[]),
            out(
                json!({
                    "path": {"type": "string"},
                    "entries": {"type": "array", "items": {"type": "object", "properties": {
                        "path": {"type": "string"}, "type": {"type": "string"}, "size": {"type": "integer"}}}},
                    "truncated": {"type": "boolean"},
                }),
                &["path", "entries"],
            ),
            true,
            false,
        ),
        tool(
            "delete_file",
            "Delete a file",
            "Delete a file, a link or (with recursive) a directory under /workspace/output or /workspace/tmp.",
            obj(json!({"path": {"type": "string"}, "recursive": {"type": "boolean"}}), &["path"]),
            out(json!({"path": {"type": "string"}, "deleted": {"type": "integer"}}), &["path", "deleted"]),
            false,
            true,
        ),
        tool(
            "start_job",
            "Start a background job",
            "Start a command that keeps running after this call (within the policy's job limits: how many at once, how long, how much memory). Poll it with job_status and job_output; stop it with stop_job. Jobs end with the session.",
            obj(run_props(command_props()), &[]),
            job_state.clone(),
            false,
            true,
        ),
        tool(
            "job_status",
            "Job status",
            "The state of one background job, or of all of them without job_id.",
            obj(json!({"job_id": {"type": "string"}}), &[]),
            out(json!({"jobs": {"type": "array", "items": job_state.clone()}}), &["jobs"]),
            true,
            false,
        ),
        tool(
            "job_output",
            "Job output",
            "A background job's output from the given offsets (0 at first; pass back the *_next offsets to read on). The oldest bytes of a long output are dropped: `*_from` says where what you got starts.",
            obj(
                json!({
                    "job_id": {"type": "string"},
                    "stdout_offset": {"type": "integer", "minimum": 0},
                    "stderr_offset": {"type": "integer", "minimum": 0},
                    "max_bytes": {"type": "integer", "minimum": 1},
                }),
                &["job_id"],
            ),
            out(
                json!({
                    "job_id": {"type": "string"}, "state": {"type": "string"},
                    "stdout": {"type": "string"}, "stderr": {"type": "string"},
                    "stdout_from": {"type": "integer"}, "stderr_from": {"type": "integer"},
                    "stdout_next": {"type": "integer"}, "stderr_next": {"type": "integer"},
                }),
                &["job_id", "state", "stdout", "stderr", "stdout_next", "stderr_next"],
            ),
            true,
            false,
        ),
        tool(
            "stop_job",
            "Stop a job",
            "Stop a background job and everything it started.",
            obj(json!({"job_id": {"type": "string"}}), &["job_id"]),
            job_state,
            false,
            false,
        ),
        tool(
            "snapshot",
            "Snapshot the workspace",
            "Checkpoint /workspace/output and /workspace/tmp under a name (default: a numbered one), to restore later.",
            obj(json!({"name": {"type": "string"}, "replace": {"type": "boolean"}}), &[]),
            out(json!({"name": {"type": "string"}, "entries": {"type": "integer"}, "bytes": {"type": "integer"}, "manifest_sha256": {"type": "string"}}), &["name"]),
            false,
            false,
        ),
        tool(
            "restore",
            "Restore a snapshot",
            "Replace /workspace/output and /workspace/tmp with a snapshot's. Running jobs are stopped first. Without name, lists the snapshots.",
            obj(json!({"name": {"type": "string"}}), &[]),
            out(json!({"name": {"type": "string"}, "snapshots": {"type": "array", "items": {"type": "string"}}}), &[]),
            false,
            true,
        ),
        tool(
            "export_artifact",
            "Export an artifact",
            "Copy a regular file from the workspace into /workspace/output (as `name`, default its file name), where the policy's artifact rules let it leave the sandbox. Over the policy's artifacts.max_size it needs a human's approval.",
            obj(json!({"path": {"type": "string"}, "name": {"type": "string"}}), &["path"]),
            out(json!({"path": {"type": "string"}, "bytes": {"type": "integer"}, "sha256": {"type": "string"}}), &["path", "bytes"]),
            false,
            false,
        ),
        tool(
            "reset",
            "Reset the workspace",
            "Back to the template: /workspace/output and /workspace/tmp as they were when this sandbox was made. Running jobs are stopped first; snapshots are kept.",
            obj(json!({}), &[]),
            out(json!({"name": {"type": "string"}}), &[]),
            false,
            true,
        ),
    ]
}
