//! The in-sandbox end of the egress path: a loopback TCP listener inside the
//! sandbox's network namespace whose connections are carried over the
//! proxy's Unix socket (bind-mounted into the sandbox), so the sandbox
//! reaches the proxy and nothing else. Each connection is handed to the
//! proxy as it is accepted (its socket passed over the Unix socket), so no
//! byte of it passes through the bridge.

use std::io;
use std::net::TcpListener;
use std::os::unix::net::UnixStream;
use std::path::{Path, PathBuf};
use std::time::Duration;

use crate::handoff;
use crate::pool::Pool;
use crate::stream::splice_both;

/// Accepts TCP connections on `listener` (127.0.0.1:PORT inside the
/// sandbox's netns) forever and hands each one to the proxy: a new
/// connection to the Unix socket at `target` carries the accepted socket
/// (see `handoff`), after which the proxy reads and writes the sandbox's
/// connection itself and the bridge holds nothing. Where the handoff cannot
/// be sent, the bridge relays that connection over the Unix socket instead,
/// on a pooled thread, both ways with half-close passed through. Returns
/// only on a non-transient accept error.
pub fn bridge(listener: TcpListener, target: &Path) -> io::Result<()> {
    let target: PathBuf = target.to_path_buf();
    let pool = Pool::new("egress-bridge");
    loop {
        let (tcp, _) = match listener.accept() {
            Ok(c) => c,
            Err(e) if transient(&e) => {
                tracing::warn!(error = %e, "bridge accept failed; retrying");
                std::thread::sleep(Duration::from_millis(20));
                continue;
            }
            Err(e) => return Err(e),
        };
        let _ = tcp.set_nodelay(true);
        let unix = match UnixStream::connect(&target) {
            Ok(u) => u,
            Err(e) => {
                // The proxy is gone: closing the TCP side is the answer.
                tracing::warn!(error = %e, path = %target.display(), "bridge could not reach the proxy socket");
                continue;
            }
        };
        // Sent from this thread: a connect and one sendmsg, no wake-up of
        // another thread, so a new connection costs the bridge almost nothing.
        match handoff::send(&unix, &tcp) {
            Ok(()) => continue, // the proxy holds the connection; drop ours
            Err(e) => {
                tracing::debug!(error = %e, "bridge could not hand the connection over; relaying it");
            }
        }
        let relay_pool = pool.clone();
        let spawned = pool.run(move || {
            if let Err(e) = splice_both(tcp, unix, &relay_pool) {
                tracing::warn!(error = %e, "bridge relay failed");
            }
        });
        if let Err(e) = spawned {
            tracing::warn!(error = %e, "bridge could not start a thread; dropping the connection");
        }
    }
}

fn transient(e: &io::Error) -> bool {
    matches!(
        e.kind(),
        io::ErrorKind::ConnectionAborted | io::ErrorKind::Interrupted | io::ErrorKind::WouldBlock
    ) || matches!(e.raw_os_error(), Some(23 | 24 | 105))
}
