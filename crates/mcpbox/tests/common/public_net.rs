//! A network namespace made for one test, in which an allowed name
//! resolves to a public address, as on a real network: the one thing the
//! loopback tests cannot show (there, every name is a `[network.hosts]`
//! mapping to 127.0.0.1, which no program's own address check would pass).
//!
//! mcpbox runs inside `unshare --net --mount --pid`: the namespace's `lo`
//! also holds [`ADDRESS`] (an address on `lo` is local, whatever it is),
//! `/etc/hosts` (bind-mounted over, in that mount namespace only) names
//! it, and a small HTTP server listens on it. The namespace has no device
//! but `lo` and no route anywhere else, so nothing a test does there can
//! leave it; when the test's command
//! ends, the namespace's init ends and takes the server with it. Needs
//! root (a network namespace with a device of its own); callers skip
//! with the reason otherwise.

use std::path::Path;
use std::process::Command;

/// The public-looking address, reachable only inside the namespace.
pub const ADDRESS: &str = "1.2.3.4";
/// The port the namespace's server answers on.
pub const PORT: u16 = 8080;

/// The server: `/robots.txt` is 404 (nothing disallowed), every other
/// path answers `body` as HTML. It writes `ready` once it listens.
const SERVER: &str = r#"
import http.server, sys
addr, port, ready, body = sys.argv[1], int(sys.argv[2]), sys.argv[3], open(sys.argv[4], "rb").read()
class H(http.server.BaseHTTPRequestHandler):
    def do_GET(self):
        if self.path == "/robots.txt":
            self.send_response(404); self.send_header("Content-Length", "0"); self.end_headers(); return
        self.send_response(200)
        self.send_header("Content-Type", "text/html; charset=utf-8")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)
    def log_message(self, *a):
        pass
s = http.server.ThreadingHTTPServer((addr, port), H)
open(ready, "w").close()
s.serve_forever()
"#;

/// The namespace's init: the devices, the hosts file, the server, then
/// the command (not exec'd: init stays, so the namespace ends with it).
const INIT: &str = r#"
set -eu
dir=$1; shift
ip link set lo up
ip addr add "$ADDRESS/32" dev lo
mount --bind "$dir/hosts" /etc/hosts
python3 "$dir/server.py" "$ADDRESS" "$PORT" "$dir/ready" "$dir/body" &
for _ in $(seq 200); do [ -e "$dir/ready" ] && break; sleep 0.05; done
[ -e "$dir/ready" ] || { echo "public_net: the server did not start" >&2; exit 97; }
set +e
"$@"
"#;

/// Whether the namespace can be made here (root, `unshare` and `ip`).
pub fn available() -> bool {
    super::is_root()
        && Command::new("ip").arg("-V").output().is_ok()
        && Command::new("unshare").arg("--version").output().is_ok()
}

/// The command running `argv` inside a fresh namespace where each of
/// `names` resolves (through `/etc/hosts`) to [`ADDRESS`], and
/// `http://NAME:PORT/` answers `body`. `dir` holds the namespace's files.
pub fn command(dir: &Path, names: &[&str], body: &str, argv: &[&str]) -> Command {
    std::fs::create_dir_all(dir).unwrap();
    let hosts = format!("127.0.0.1\tlocalhost\n{ADDRESS}\t{}\n", names.join(" "));
    std::fs::write(dir.join("hosts"), hosts).unwrap();
    std::fs::write(dir.join("server.py"), SERVER).unwrap();
    std::fs::write(dir.join("body"), body).unwrap();
    let mut cmd = Command::new("unshare");
    cmd.args([
        "--net",
        "--mount",
        "--pid",
        "--fork",
        "--kill-child",
        "--mount-proc",
        "--",
        "bash",
        "-c",
        INIT,
        "public_net",
    ]);
    cmd.arg(dir);
    cmd.args(argv);
    cmd.env("ADDRESS", ADDRESS).env("PORT", PORT.to_string());
    cmd
}
