//! A server that never reads its stdin cannot stall the relay: the stdio
//! driver writes to the server's stdin without blocking and hands what a
//! full pipe will not take to its own writer thread, so only that thread
//! waits, and the host still gets its answers (here: every call times out)
//! and can end the session.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::io::{BufRead, BufReader, Write};
use std::os::unix::net::UnixStream;
use std::time::{Duration, Instant};

use mcpbox_gateway::{CommandLauncher, Config, EndReason, Relay, CODE_CALL_TIMEOUT};
use serde_json::{json, Value};

#[test]
fn server_that_never_reads_stdin_cannot_stall_the_host() {
    let config = Config {
        server_name: "stuck".into(),
        call_timeout: Some(Duration::from_millis(500)),
        shutdown_grace: Duration::from_millis(100),
        ..Config::default()
    };
    // `sleep` never reads its stdin
    let launcher = CommandLauncher::new("sleep", ["30"]);
    let relay = Relay::new(config, Box::new(launcher));
    let (ours, theirs) = UnixStream::pair().unwrap();
    let theirs_out = theirs.try_clone().unwrap();
    let handle = std::thread::spawn(move || relay.run(Box::new(theirs), Box::new(theirs_out)));
    ours.set_read_timeout(Some(Duration::from_secs(20)))
        .unwrap();
    let mut reader = BufReader::new(ours.try_clone().unwrap());
    let mut writer = ours.try_clone().unwrap();

    // 256 calls of 1 KiB each: four times what a pipe holds
    const CALLS: usize = 256;
    let pad = "x".repeat(1024);
    let started = Instant::now();
    let sender = std::thread::spawn(move || {
        for i in 0..CALLS {
            let call = json!({"jsonrpc": "2.0", "id": i, "method": "tools/call",
                "params": {"name": "echo", "arguments": {"pad": pad}}});
            writeln!(writer, "{call}").unwrap();
        }
        writer
    });
    let mut timed_out = 0;
    while timed_out < CALLS {
        let mut line = String::new();
        assert!(reader.read_line(&mut line).unwrap() > 0, "relay closed");
        let v: Value = serde_json::from_str(&line).unwrap();
        assert_eq!(v["error"]["code"], json!(CODE_CALL_TIMEOUT), "{v}");
        timed_out += 1;
    }
    // the answers came from the relay's own clock, not after the server died
    assert!(started.elapsed() < Duration::from_secs(15));
    let writer = sender.join().unwrap();
    writer.shutdown(std::net::Shutdown::Write).unwrap();
    let outcome = handle.join().unwrap().unwrap();
    assert_eq!(outcome.reason, EndReason::HostClosed);
}
