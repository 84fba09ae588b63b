//! A server that works in its workspace, for the lifecycle tests: an
//! in-memory counter (state a pause must keep and a stop must lose),
//! file writes and reads anywhere it can reach, a listing, the processes
//! it can see, and the special files a hostile server leaves behind for
//! the artifact export (a symlink, a hardlink, a fifo); and, for the
//! audit's file records, a read through mmap (no read(2) at all), a flood
//! of files in one call, and a call that takes its time.
#![forbid(unsafe_code)]

use mcpbox_testservers::{main_for, str_arg, text, tool, CallResult, Io, Server};
use serde_json::{json, Value};

#[derive(Default)]
struct Workspace {
    count: u64,
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
                path.clone(),
            ),
            tool(
                "mmap_read",
                "Reads a path through mmap, never read(2) (with python3).",
                path.clone(),
            ),
            tool(
                "write_many",
                "Writes count small files into a directory.",
                json!({"path": {"type": "string"}, "count": {"type": "integer"}}),
            ),
            tool(
                "fill",
                "Appends 64 KiB blocks to path until a write fails; says how many bytes it wrote and why it stopped.",
                path.clone(),
            ),
            tool(
                "rename",
                "Renames path to target.",
                json!({"path": {"type": "string"}, "target": {"type": "string"}}),
            ),
            tool(
                "remove",
                "Removes a file, or a directory and all in it.",
                path.clone(),
            ),
            tool("mkdir", "Makes a directory and its parents.", path.clone()),
            tool(
                "mkdir_many",
                "Makes count directories in a directory.",
                json!({"path": {"type": "string"}, "count": {"type": "integer"}}),
            ),
            tool(
                "hide",
                "In one call: makes directory path, writes path/loot.txt, renames path to target and removes target.",
                json!({"path": {"type": "string"}, "target": {"type": "string"}}),
            ),
            tool(
                "sleep",
                "Waits ms milliseconds.",
                json!({"ms": {"type": "integer"}}),
            ),
        ]
    }

    fn call(&mut self, _io: &mut Io, name: &str, args: &Value) -> CallResult {
        let path = str_arg(args, "path");
        match name {
            "count" => {
                self.count += 1;
                Ok(text(self.count.to_string()))
            }
            "write" => std::fs::write(path, str_arg(args, "text"))
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
            "symlink" => std::os::unix::fs::symlink(str_arg(args, "target"), path)
                .map(|()| text("ok"))
                .map_err(|e| io_err(path, e)),
            "hardlink" => std::fs::hard_link(str_arg(args, "target"), path)
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
            "mmap_read" => {
                const SCRIPT: &str = "import mmap, sys\n\
                    f = open(sys.argv[1], 'rb')\n\
                    m = mmap.mmap(f.fileno(), 0, prot=mmap.PROT_READ)\n\
                    sys.stdout.write(m[:].decode())\n";
                let out = std::process::Command::new("python3")
                    .args(["-c", SCRIPT, path])
                    .output()
                    .map_err(|e| io_err("python3", e))?;
                if out.status.success() {
                    Ok(text(String::from_utf8_lossy(&out.stdout).into_owned()))
                } else {
                    Err((-32000, String::from_utf8_lossy(&out.stderr).into_owned()))
                }
            }
            "write_many" => {
                let count = args.get("count").and_then(Value::as_u64).unwrap_or(0);
                for i in 0..count {
                    let p = format!("{path}/f{i:04}.txt");
                    std::fs::write(&p, i.to_string()).map_err(|e| io_err(&p, e))?;
                }
                Ok(text(format!("wrote {count}")))
            }
            "fill" => {
                use std::io::Write;
                let mut f = std::fs::OpenOptions::new()
                    .create(true)
                    .append(true)
                    .open(path)
                    .map_err(|e| io_err(path, e))?;
                let block = vec![0x5au8; 64 << 10];
                let mut wrote: u64 = 0;
                loop {
                    match f.write(&block) {
                        Ok(0) => {
                            return Err((
                                -32000,
                                format!("{path}: wrote {wrote} bytes, then a write of 0"),
                            ))
                        }
                        Ok(n) => wrote += n as u64,
                        Err(e) => {
                            return Err((-32000, format!("{path}: wrote {wrote} bytes, then: {e}")))
                        }
                    }
                }
            }
            "rename" => std::fs::rename(path, str_arg(args, "target"))
                .map(|()| text("ok"))
                .map_err(|e| io_err(path, e)),
            "remove" => match std::fs::symlink_metadata(path) {
                Ok(m) if m.is_dir() => std::fs::remove_dir_all(path),
                _ => std::fs::remove_file(path),
            }
            .map(|()| text("ok"))
            .map_err(|e| io_err(path, e)),
            "hide" => {
                let target = str_arg(args, "target");
                std::fs::create_dir(path)
                    .and_then(|()| std::fs::write(format!("{path}/loot.txt"), "loot"))
                    .and_then(|()| std::fs::rename(path, target))
                    .and_then(|()| std::fs::remove_dir_all(target))
                    .map(|()| text("ok"))
                    .map_err(|e| io_err(path, e))
            }
            "mkdir_many" => {
                let count = args.get("count").and_then(Value::as_u64).unwrap_or(0);
                for i in 0..count {
                    let p = format!("{path}/d{i:05}");
                    std::fs::create_dir_all(&p).map_err(|e| io_err(&p, e))?;
                }
                Ok(text(format!("made {count}")))
            }
            "mkdir" => std::fs::create_dir_all(path)
                .map(|()| text("ok"))
                .map_err(|e| io_err(path, e)),
            "sleep" => {
                let ms = args.get("ms").and_then(Value::as_u64).unwrap_or(0);
                std::thread::sleep(std::time::Duration::from_millis(ms));
                Ok(text("slept"))
            }
            _ => Err((-32602, format!("unknown tool {name}"))),
        }
    }
}

fn main() {
    main_for(&mut Workspace::default());
}
