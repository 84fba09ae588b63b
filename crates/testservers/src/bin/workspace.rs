//! A server that works in its workspace, for the lifecycle tests: an
//! in-memory counter (state a pause must keep and a stop must lose),
//! file writes and reads anywhere it can reach, a listing, the processes
//! it can see, and the special files a hostile server leaves behind for
//! the artifact export (a symlink, a hardlink, a fifo).
#![forbid(unsafe_code)]

use mcpbox_testservers::{main_for, text, tool, CallResult, Io, Server};
use serde_json::{json, Value};

#[derive(Default)]
struct Workspace {
    count: u64,
}

fn arg<'a>(args: &'a Value, key: &str) -> &'a str {
    args.get(key).and_then(Value::as_str).unwrap_or("")
}

fn io_err(what: &str, e: std::io::Error) -> (i64, String) {
    (-32000, format!("{what}: {e}"))
}

impl Server for Workspace {
    fn name(&self) -> &str {
        "workspace"
    }

    fn tools(&mut self) -> Vec<Value> {
        let path = json!({"path": {"type": "string"}});
        vec![
            tool(
                "count",
                "Adds one to an in-memory counter and returns it.",
                json!({}),
            ),
            tool(
                "write",
                "Writes text to a path.",
                json!({"path": {"type": "string"}, "text": {"type": "string"}}),
            ),
            tool("read", "Reads a path.", path.clone()),
            tool("ls", "Lists a directory.", path.clone()),
            tool("ps", "Lists the process ids it can see.", json!({})),
            tool(
                "symlink",
                "Makes a symlink at path pointing to target.",
                json!({"path": {"type": "string"}, "target": {"type": "string"}}),
            ),
            tool(
                "hardlink",
                "Makes a hardlink at path of target.",
                json!({"path": {"type": "string"}, "target": {"type": "string"}}),
            ),
            tool(
                "mkfifo",
                "Makes a fifo at path (with the mkfifo program).",
                path,
            ),
        ]
    }

    fn call(&mut self, _io: &mut Io, name: &str, args: &Value) -> CallResult {
        let path = arg(args, "path");
        match name {
            "count" => {
                self.count += 1;
                Ok(text(self.count.to_string()))
            }
            "write" => std::fs::write(path, arg(args, "text"))
                .map(|()| text(format!("wrote {path}")))
                .map_err(|e| io_err(path, e)),
            "read" => std::fs::read_to_string(path)
                .map(text)
                .map_err(|e| io_err(path, e)),
            "ls" => {
                let mut names: Vec<String> = std::fs::read_dir(path)
                    .map_err(|e| io_err(path, e))?
                    .flatten()
                    .map(|e| e.file_name().to_string_lossy().to_string())
                    .collect();
                names.sort();
                Ok(text(names.join("\n")))
            }
            "ps" => {
                let mut pids: Vec<u32> = std::fs::read_dir("/proc")
                    .map_err(|e| io_err("/proc", e))?
                    .flatten()
                    .filter_map(|e| e.file_name().to_str()?.parse().ok())
                    .collect();
                pids.sort();
                Ok(text(
                    pids.iter()
                        .map(u32::to_string)
                        .collect::<Vec<_>>()
                        .join(" "),
                ))
            }
            "symlink" => std::os::unix::fs::symlink(arg(args, "target"), path)
                .map(|()| text("ok"))
                .map_err(|e| io_err(path, e)),
            "hardlink" => std::fs::hard_link(arg(args, "target"), path)
                .map(|()| text("ok"))
                .map_err(|e| io_err(path, e)),
            "mkfifo" => {
                let status = std::process::Command::new("mkfifo")
                    .arg(path)
                    .status()
                    .map_err(|e| io_err("mkfifo", e))?;
                if status.success() {
                    Ok(text("ok"))
                } else {
                    Err((-32000, format!("mkfifo {path}: {status}")))
                }
            }
            _ => Err((-32602, format!("unknown tool {name}"))),
        }
    }
}

fn main() {
    main_for(&mut Workspace::default());
}
