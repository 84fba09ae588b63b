//! The egress proxy's HTTP/1.1 exchanges on a connection it opened to put a
//! secret's value in (`mcpbox_egress::exchange::relay`, with
//! `mcpbox_egress::swap`): a client and an upstream both played by the
//! input, each handing out its bytes in chunk sizes the input chose.
//!
//! Input layout (every input is valid; a crash reproduces from its artifact):
//!
//! ```text
//! [0..8]   chunk sizes, cycled: n means a read of at most n*n+1 bytes
//! [8..10]  u16 little-endian: how many of the rest the client sends
//! [10..]   the client's bytes, then the upstream's
//! ```
//!
//! Invariants:
//! - nothing panics, and the relay ends (both streams are finite);
//! - the client never receives the real value, unless it sent the value
//!   itself (then an error message may quote its own bytes back);
//! - the upstream receives the real value only if the client sent the
//!   placeholder (or the value itself);
//! - every byte the client received is counted in `bytes_down`.
#![no_main]

use std::io::{self, Read, Write};

use libfuzzer_sys::fuzz_target;
use mcpbox_egress::exchange::{relay, Exchanged, Host, Target};
use mcpbox_egress::swap::{SwapSecret, Swaps};
use mcpbox_policy::HostRule;

const PLACEHOLDER: &[u8] = b"ghp_PLACEHOLDERplaceholder0123456789ab";
const VALUE: &[u8] = b"ghp_REALVALUErealvalue9876543210zyxwvu";

/// One side: reads from its script in the input's chunk sizes, keeps what
/// is written to it.
struct Side<'a> {
    data: &'a [u8],
    sizes: &'a [u8],
    turn: usize,
    written: Vec<u8>,
}

impl Read for Side<'_> {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        let s = self.sizes[self.turn % self.sizes.len()];
        self.turn += 1;
        let n = (usize::from(s) * usize::from(s) + 1)
            .min(self.data.len())
            .min(buf.len());
        buf[..n].copy_from_slice(&self.data[..n]);
        self.data = &self.data[n..];
        Ok(n)
    }
}

impl Write for Side<'_> {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        self.written.extend_from_slice(buf);
        Ok(buf.len())
    }
    fn flush(&mut self) -> io::Result<()> {
        Ok(())
    }
}

fn contains(hay: &[u8], needle: &[u8]) -> bool {
    hay.windows(needle.len()).any(|w| w == needle)
}

fuzz_target!(|input: &[u8]| {
    if input.len() < 10 {
        return;
    }
    let sizes = &input[..8];
    let split = usize::from(u16::from_le_bytes([input[8], input[9]])).min(input.len() - 10);
    let (client_in, upstream_in) = input[10..].split_at(split);
    let swaps = Swaps::new(vec![SwapSecret {
        name: "GITHUB_TOKEN".into(),
        placeholder: String::from_utf8(PLACEHOLDER.to_vec()).unwrap(),
        value: String::from_utf8(VALUE.to_vec()).unwrap(),
        hosts: vec![HostRule::parse("api.github.com").unwrap()],
        bodies: true,
    }])
    .unwrap();
    let target = Target {
        host: Host::Name("api.github.com".into()),
        port: 443,
    };
    let mut client = Side {
        data: client_in,
        sizes,
        turn: 0,
        written: Vec::new(),
    };
    let mut upstream = Side {
        data: upstream_in,
        sizes,
        turn: 3,
        written: Vec::new(),
    };
    let mut done = Exchanged::default();
    let _ = relay(&mut client, &mut upstream, &target, &swaps, &mut done);

    let client_sent_value = contains(client_in, VALUE);
    if !client_sent_value {
        assert!(
            !contains(&client.written, VALUE),
            "the client received the real value"
        );
    }
    if contains(&upstream.written, VALUE) {
        assert!(
            client_sent_value || contains(client_in, PLACEHOLDER),
            "the value went up without the placeholder"
        );
    }
    assert_eq!(done.bytes_down, client.written.len() as u64, "bytes_down");
});
