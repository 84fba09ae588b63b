//! HTTP/1.1 exchanges relayed one at a time, on a connection the proxy
//! opened to put a secret's value in (swap.rs): each request head is
//! parsed and checked, rewritten, sent on; its body is streamed by its
//! framing; the response head and body come back scrubbed of every real
//! value. Generic over the two byte streams, so the same code serves
//! plain HTTP and the inside of TLS, and tests drive it over socket pairs.
//!
//! What it refuses, and why:
//! - a request for another host than the one the connection was checked
//!   for (its `Host` field, an absolute-form target): the value must go
//!   only where the policy says, whatever the client claims later in the
//!   connection (pipelined requests are checked one by one: 421);
//! - `Upgrade` (WebSocket, h2c) and `CONNECT` inside: after either the
//!   bytes are no longer HTTP/1.1 exchanges this code can check;
//! - framing two parsers could read differently (see [`http::framing`]):
//!   `Content-Length` with `Transfer-Encoding`, a coding other than
//!   `chunked`, malformed chunk sizes;
//! - a response in a content coding (gzip, br): a value inside it cannot
//!   be found, so it cannot be scrubbed. The request asks for `identity`.
//!
//! Every buffer is bounded: heads by [`http::MAX_HEAD`], a chunk-size or
//! trailer line by [`MAX_LINE`], bodies stream through [`BUFFER`] bytes,
//! and the scrubber holds back less than one value.

use std::collections::BTreeSet;
use std::io::{self, Read, Write};

pub use crate::http::Host;
use crate::http::{self, Framing, HeadError, RequestHead};
use crate::swap::Swaps;

/// Longest chunk-size line or trailer line.
pub const MAX_LINE: usize = 4096;
/// Bytes read at a time from either side.
pub const BUFFER: usize = 64 * 1024;
/// Most trailer fields taken after a chunked body (then dropped).
const MAX_TRAILERS: usize = 64;

/// Why the exchanges on a connection stopped early.
#[derive(Debug, thiserror::Error)]
pub enum ExchangeError {
    /// The client sent what is refused; it is answered with 400 (or 501
    /// for an upgrade) and the connection closes.
    #[error("the client's request was refused: {0}")]
    Request(&'static str),
    /// The request names a host other than the connection's; answered 421.
    #[error("the request is for {named}, not for the host this connection was opened to")]
    Misdirected {
        /// What the request named.
        named: String,
    },
    /// The upstream sent what cannot be relayed with the secret kept
    /// out; answered 502 when no response head went to the client yet.
    #[error("the upstream's response was refused: {0}")]
    Response(&'static str),
    /// The client's side failed or closed mid-message.
    #[error("the client's side failed: {0}")]
    Client(#[source] io::Error),
    /// The upstream's side failed or closed mid-message.
    #[error("the upstream's side failed: {0}")]
    Upstream(#[source] io::Error),
}

impl ExchangeError {
    /// The status and reason phrase a client is answered with, when it can
    /// still be answered.
    pub fn status(&self) -> Option<(u16, &'static str)> {
        match self {
            ExchangeError::Request(why) if why.contains("upgrade") => {
                Some((501, "Not Implemented"))
            }
            ExchangeError::Request(_) => Some((400, "Bad Request")),
            ExchangeError::Misdirected { .. } => Some((421, "Misdirected Request")),
            ExchangeError::Response(_) => Some((502, "Bad Gateway")),
            ExchangeError::Client(_) | ExchangeError::Upstream(_) => None,
        }
    }
}

/// What went through, for the connection's audit record. Names only.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct Exchanged {
    /// Requests sent upstream.
    pub requests: u64,
    /// Secrets whose value went into a request.
    pub added: BTreeSet<String>,
    /// Secrets whose placeholder went to a host it is not for (left as is).
    pub elsewhere: BTreeSet<String>,
    /// Secrets whose real value came back and was replaced.
    pub scrubbed: BTreeSet<String>,
    /// Body and head bytes from the client, as received.
    pub bytes_up: u64,
    /// Body and head bytes to the client, as sent.
    pub bytes_down: u64,
    /// Whether a response head already went to the client for the request
    /// in progress (then an error can only close the connection).
    pub answering: bool,
    /// Whether the connection was TLS (opened by intercept.rs) rather than
    /// plain HTTP.
    pub tls: bool,
}

/// A byte stream read through a buffer, so that a head's end and a chunk's
/// line can be found without reading past what belongs to the message. The
/// buffer is allocated once ([`http::MAX_HEAD`] + [`BUFFER`] bytes) and read
/// into in place; bodies are handed on from it without copies.
struct Buffered<S> {
    inner: S,
    buf: Vec<u8>,
    start: usize,
    end: usize,
}

impl<S: Read> Buffered<S> {
    fn new(inner: S) -> Self {
        Buffered {
            inner,
            buf: Vec::new(),
            start: 0,
            end: 0,
        }
    }

    fn pending(&self) -> &[u8] {
        &self.buf[self.start..self.end]
    }

    fn consume(&mut self, n: usize) {
        self.start += n;
        if self.start == self.end {
            self.start = 0;
            self.end = 0;
        }
    }

    /// Reads more after what is pending; `Ok(0)` at the end of the stream.
    /// What is pending is less than [`http::MAX_HEAD`] whenever more is
    /// asked for (head, line and body reads check), so there is room.
    fn fill(&mut self) -> io::Result<usize> {
        if self.buf.is_empty() {
            self.buf = vec![0; http::MAX_HEAD + BUFFER];
        }
        if self.start > 0 {
            self.buf.copy_within(self.start..self.end, 0);
            self.end -= self.start;
            self.start = 0;
        }
        if self.end == self.buf.len() {
            return Err(io::Error::other("read buffer full"));
        }
        loop {
            match self.inner.read(&mut self.buf[self.end..]) {
                Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
                // A TLS peer that closes without close_notify: rustls says
                // UnexpectedEof. Taken as the end of the stream, as most
                // clients close; a body it cuts short is still refused by
                // its framing (only a body that runs to the close could be
                // truncated unseen, as with any such body).
                Err(e) if e.kind() == io::ErrorKind::UnexpectedEof => return Ok(0),
                Err(e) => return Err(e),
                Ok(n) => {
                    self.end += n;
                    return Ok(n);
                }
            }
        }
    }

    /// The next head (through its empty line), at most [`http::MAX_HEAD`]
    /// bytes; `Ok(None)` when the stream ended before its first byte.
    fn head(&mut self) -> Result<Option<Vec<u8>>, HeadError> {
        loop {
            if let Some(end) = self.pending().windows(4).position(|w| w == b"\r\n\r\n") {
                let head = self.pending()[..end + 4].to_vec();
                self.consume(end + 4);
                return Ok(Some(head));
            }
            if self.pending().len() >= http::MAX_HEAD {
                return Err(HeadError::Malformed("head too large"));
            }
            if self.fill().map_err(HeadError::Read)? == 0 {
                return if self.pending().is_empty() {
                    Ok(None)
                } else {
                    Err(HeadError::Malformed("connection closed inside a head"))
                };
            }
        }
    }

    /// One CRLF-ended line (without its CRLF), at most [`MAX_LINE`] bytes.
    fn line(&mut self) -> io::Result<Result<Vec<u8>, &'static str>> {
        loop {
            if let Some(end) = self.pending().windows(2).position(|w| w == b"\r\n") {
                let line = self.pending()[..end].to_vec();
                self.consume(end + 2);
                return Ok(Ok(line));
            }
            if self.pending().len() > MAX_LINE {
                return Ok(Err("a chunk or trailer line is too long"));
            }
            if self.fill()? == 0 {
                return Err(io::ErrorKind::UnexpectedEof.into());
            }
        }
    }

    /// How much of a body of which `left` bytes are still to come is
    /// pending now (at most [`BUFFER`], reading once if nothing is); the
    /// caller takes `pending()[..n]`, then consumes it. The stream ending
    /// first is an error (the message was cut short).
    fn part_of(&mut self, left: u64) -> io::Result<usize> {
        let max = usize::try_from(left).unwrap_or(usize::MAX).min(BUFFER);
        match self.some(max)? {
            0 => Err(io::ErrorKind::UnexpectedEof.into()),
            n => Ok(n),
        }
    }

    /// How much is pending, at most `max`: what is buffered, else one
    /// read. 0 at the end of the stream. Nothing is consumed.
    fn some(&mut self, max: usize) -> io::Result<usize> {
        if self.pending().is_empty() && self.fill()? == 0 {
            return Ok(0);
        }
        Ok(self.pending().len().min(max))
    }
}

/// The connection's checked target: the host and port the proxy's policy
/// and address checks were made for.
#[derive(Debug, Clone)]
pub struct Target {
    /// Host as the policy names it (lowercase name or IP literal).
    pub host: Host,
    /// Port.
    pub port: u16,
}

/// Relays exchanges until either side closes, a message says
/// `Connection: close`, or something is refused. On a refusal the client
/// is answered (when it still can be) and the error returned; the caller
/// closes both sides and records `done`.
pub fn relay<C, U>(
    client: C,
    upstream: U,
    target: &Target,
    swaps: &Swaps,
    done: &mut Exchanged,
) -> Result<(), ExchangeError>
where
    C: Read + Write,
    U: Read + Write,
{
    let mut client = Buffered::new(client);
    let mut upstream = Buffered::new(upstream);
    let result = exchanges(&mut client, &mut upstream, target, swaps, done);
    if let Err(e) = &result {
        if let (Some((status, text)), false) = (e.status(), done.answering) {
            let reply = answer(status, text, &e.to_string());
            if client.inner.write_all(&reply).is_ok() {
                done.bytes_down += reply.len() as u64;
            }
            let _ = client.inner.flush();
        }
    }
    result
}

fn answer(status: u16, text: &str, why: &str) -> Vec<u8> {
    let body = format!("{}\n", why.replace(['\r', '\n'], " "));
    format!(
        "HTTP/1.1 {status} {text}\r\nX-Mcpbox-Source: egress.secrets\r\nContent-Type: text/plain; charset=utf-8\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
        body.len()
    )
    .into_bytes()
}

fn exchanges<C, U>(
    client: &mut Buffered<C>,
    upstream: &mut Buffered<U>,
    target: &Target,
    swaps: &Swaps,
    done: &mut Exchanged,
) -> Result<(), ExchangeError>
where
    C: Read + Write,
    U: Read + Write,
{
    // where the policy allows it, placeholders in request bodies become
    // values (same length, streamed)
    let into_bodies = swaps.for_bodies(&target.host.policy_form(), target.port);
    loop {
        done.answering = false;
        let raw = match client.head() {
            Ok(Some(raw)) => raw,
            // the client is done (at a message boundary)
            Ok(None) => return Ok(()),
            Err(HeadError::Read(e)) => return Err(ExchangeError::Client(e)),
            Err(HeadError::Malformed(why)) => return Err(ExchangeError::Request(why)),
            Err(HeadError::Empty) => return Ok(()),
        };
        done.bytes_up += raw.len() as u64;
        let mut head = http::parse_head(&raw).map_err(|e| match e {
            HeadError::Malformed(why) => ExchangeError::Request(why),
            _ => ExchangeError::Request("malformed request head"),
        })?;
        let checked = check_request(&head, target)?;
        let rewrite = swaps.rewrite(&mut head, &target.host.policy_form(), target.port);
        done.added.extend(rewrite.added);
        done.elsewhere.extend(rewrite.elsewhere);

        let out = request_head(&head, &checked);
        upstream
            .inner
            .write_all(&out)
            .map_err(ExchangeError::Upstream)?;
        if checked.expect_continue && checked.framing != Framing::None {
            // The client waits for a go-ahead before its body; the proxy
            // gives it (RFC 9110 §10.1.1) and did not forward the Expect.
            let go = b"HTTP/1.1 100 Continue\r\n\r\n";
            client.inner.write_all(go).map_err(ExchangeError::Client)?;
            client.inner.flush().map_err(ExchangeError::Client)?;
            done.bytes_down += go.len() as u64;
        }
        // A request body goes as sent, but for the secrets whose policy
        // says `bodies = true` (into_bodies).
        body(
            client,
            &mut upstream.inner,
            checked.framing,
            into_bodies.as_ref(),
            done,
            true,
        )?;
        upstream.inner.flush().map_err(ExchangeError::Upstream)?;
        done.requests += 1;

        let keep = response(client, upstream, &head, swaps, done)?;
        if !keep || checked.close {
            return Ok(());
        }
    }
}

/// What a request's checks found.
struct Checked {
    framing: Framing,
    expect_continue: bool,
    /// The client asked for the connection to end after this exchange.
    close: bool,
}

fn check_request(head: &RequestHead, target: &Target) -> Result<Checked, ExchangeError> {
    if head.method.eq_ignore_ascii_case("CONNECT") {
        return Err(ExchangeError::Request(
            "a tunnel inside a connection mcpbox opened is not carried",
        ));
    }
    // Origin form only (RFC 9112 §3.2.1); `*` for OPTIONS. An absolute
    // target could name another host than the checked one.
    if !(head.target.starts_with('/') || (head.target == "*" && head.method == "OPTIONS")) {
        return Err(ExchangeError::Request(
            "only an origin-form target (/path) is taken inside a connection mcpbox opened",
        ));
    }
    let hosts: Vec<&str> = head
        .headers
        .iter()
        .filter(|(k, _)| k.eq_ignore_ascii_case("host"))
        .map(|(_, v)| v.as_str())
        .collect();
    let [host] = hosts[..] else {
        return Err(ExchangeError::Request(
            "a request needs exactly one Host field",
        ));
    };
    match http::parse_authority(host, target.port) {
        Ok((h, p)) if h == target.host && p == target.port => {}
        _ => {
            return Err(ExchangeError::Misdirected {
                named: host.chars().take(200).collect(),
            })
        }
    }
    let named = http::connection_named(&head.headers);
    if named.iter().any(|n| n == "upgrade")
        || head
            .headers
            .iter()
            .any(|(k, _)| k.eq_ignore_ascii_case("upgrade"))
    {
        return Err(ExchangeError::Request(
            "an upgrade (WebSocket, h2c) is not carried on a connection mcpbox opened",
        ));
    }
    let framing = http::framing(&head.headers, true).map_err(|e| match e {
        HeadError::Malformed(why) => ExchangeError::Request(why),
        _ => ExchangeError::Request("malformed framing"),
    })?;
    let expect_continue = head.headers.iter().any(|(k, v)| {
        k.eq_ignore_ascii_case("expect") && v.trim().eq_ignore_ascii_case("100-continue")
    });
    let close = named.iter().any(|n| n == "close")
        || (head.version == "HTTP/1.0" && !named.iter().any(|n| n == "keep-alive"));
    Ok(Checked {
        framing,
        expect_continue,
        close,
    })
}

/// The head sent upstream: hop-by-hop fields, `Expect` and
/// `Accept-Encoding` dropped; `Accept-Encoding: identity` (the response
/// must be readable to be scrubbed) and `Connection: close` when the
/// client asked for it.
fn request_head(head: &RequestHead, checked: &Checked) -> Vec<u8> {
    let named = http::connection_named(&head.headers);
    let mut out = format!("{} {} {}\r\n", head.method, head.target, head.version);
    for (name, value) in &head.headers {
        if http::is_hop_by_hop(name, &named)
            || name.eq_ignore_ascii_case("expect")
            || name.eq_ignore_ascii_case("accept-encoding")
        {
            continue;
        }
        out.push_str(name);
        out.push_str(": ");
        out.push_str(value);
        out.push_str("\r\n");
    }
    out.push_str("Accept-Encoding: identity\r\n");
    if checked.close {
        out.push_str("Connection: close\r\n");
    }
    out.push_str("\r\n");
    out.into_bytes()
}

/// Reads the response to `request` and relays it scrubbed. Returns whether
/// the connection may carry another exchange.
fn response<C, U>(
    client: &mut Buffered<C>,
    upstream: &mut Buffered<U>,
    request: &RequestHead,
    swaps: &Swaps,
    done: &mut Exchanged,
) -> Result<bool, ExchangeError>
where
    C: Read + Write,
    U: Read + Write,
{
    let (raw, head) = loop {
        let raw = match upstream.head() {
            Ok(Some(raw)) => raw,
            Ok(None) => {
                return Err(ExchangeError::Response(
                    "the upstream closed without answering",
                ))
            }
            Err(HeadError::Read(e)) => return Err(ExchangeError::Upstream(e)),
            Err(HeadError::Malformed(why)) => return Err(ExchangeError::Response(why)),
            Err(HeadError::Empty) => {
                return Err(ExchangeError::Response(
                    "the upstream closed without answering",
                ))
            }
        };
        let head = http::parse_response_head(&raw).map_err(|e| match e {
            HeadError::Malformed(why) => ExchangeError::Response(why),
            _ => ExchangeError::Response("malformed response head"),
        })?;
        match head.status {
            101 => {
                return Err(ExchangeError::Response(
                    "the upstream switched protocols, which was not asked for",
                ))
            }
            // Interim answers (100 Continue was given by the proxy already,
            // 103 Early Hints is optional): not forwarded.
            100..=199 => continue,
            _ => break (raw, head),
        }
    };
    if head.headers.iter().any(|(k, v)| {
        k.eq_ignore_ascii_case("content-encoding") && !v.trim().eq_ignore_ascii_case("identity")
    }) {
        return Err(ExchangeError::Response(
            "the response is in a content coding (it was asked for identity): a secret's value inside it could not be found",
        ));
    }
    // RFC 9112 §6.3: no body after HEAD, 204 and 304.
    let framing = if request.method.eq_ignore_ascii_case("HEAD")
        || head.status == 204
        || head.status == 304
    {
        Framing::Length(0)
    } else {
        http::framing(&head.headers, true).map_err(|e| match e {
            HeadError::Malformed(why) => ExchangeError::Response(why),
            _ => ExchangeError::Response("malformed framing"),
        })?
    };
    // The head, scrubbed as one piece (same length: nothing moves).
    let mut scrub = swaps.scrubber();
    let mut out = Vec::with_capacity(raw.len());
    scrub.feed(&raw, &mut out);
    scrub.finish(&mut out);
    done.scrubbed.extend(scrub.replaced());
    client
        .inner
        .write_all(&out)
        .map_err(ExchangeError::Client)?;
    done.bytes_down += out.len() as u64;
    done.answering = true;
    body(
        upstream,
        &mut client.inner,
        framing,
        Some(swaps),
        done,
        false,
    )?;
    client.inner.flush().map_err(ExchangeError::Client)?;
    let named = http::connection_named(&head.headers);
    let keep = framing != Framing::None
        && head.version == "HTTP/1.1"
        && !named.iter().any(|n| n == "close");
    Ok(keep)
}

/// Streams one body from `from` to `to` by `framing`, scrubbed when
/// `swaps` is given. `up` says which way (for the byte counts and whose
/// fault a failure is). A chunked body is decoded and encoded again (its
/// trailer fields are dropped, RFC 9112 §7.1.2), so that a value split
/// across chunks is still found.
fn body<R: Read, W: Write>(
    from: &mut Buffered<R>,
    to: &mut W,
    framing: Framing,
    swaps: Option<&Swaps>,
    done: &mut Exchanged,
    up: bool,
) -> Result<(), ExchangeError> {
    let read_err = |e: io::Error| {
        if up {
            ExchangeError::Client(e)
        } else {
            ExchangeError::Upstream(e)
        }
    };
    let write_err = |e: io::Error| {
        if up {
            ExchangeError::Upstream(e)
        } else {
            ExchangeError::Client(e)
        }
    };
    let refuse = |why: &'static str| {
        if up {
            ExchangeError::Request(why)
        } else {
            ExchangeError::Response(why)
        }
    };
    let mut scrub = swaps.map(Swaps::scrubber);
    let mut out = Vec::new();
    // Passes the first `n` pending bytes on (scrubbed; framed as a chunk
    // when `chunked`), counting them, then consumes them.
    let mut pass = |from: &mut Buffered<R>,
                    n: usize,
                    chunked: bool,
                    out: &mut Vec<u8>,
                    done: &mut Exchanged|
     -> Result<(), ExchangeError> {
        let piece = &from.pending()[..n];
        if up {
            done.bytes_up += n as u64;
        }
        let emit = match scrub.as_mut() {
            Some(s) => s.feed_slice(piece, out),
            None => piece,
        };
        if !emit.is_empty() {
            if chunked {
                write_chunk(to, emit, done, up).map_err(write_err)?;
            } else {
                write_counted(to, emit, done, up).map_err(write_err)?;
            }
        }
        from.consume(n);
        Ok(())
    };
    match framing {
        Framing::Length(mut left) => {
            while left > 0 {
                let n = from.part_of(left).map_err(read_err)?;
                left -= n as u64;
                pass(from, n, false, &mut out, done)?;
            }
        }
        Framing::None if up => {}
        Framing::None => loop {
            let n = from.some(BUFFER).map_err(read_err)?;
            if n == 0 {
                break;
            }
            pass(from, n, false, &mut out, done)?;
        },
        Framing::Chunked => loop {
            let line = from.line().map_err(read_err)?.map_err(refuse)?;
            if up {
                done.bytes_up += line.len() as u64 + 2;
            }
            let size = chunk_size(&line).ok_or_else(|| refuse("a malformed chunk size"))?;
            if size == 0 {
                // trailer fields until the empty line: read, bounded, dropped
                let mut fields = 0;
                loop {
                    let t = from.line().map_err(read_err)?.map_err(refuse)?;
                    if t.is_empty() {
                        break;
                    }
                    fields += 1;
                    if fields > MAX_TRAILERS {
                        return Err(refuse("too many trailer fields"));
                    }
                }
                break;
            }
            let mut left = size;
            while left > 0 {
                let n = from.part_of(left).map_err(read_err)?;
                left -= n as u64;
                pass(from, n, true, &mut out, done)?;
            }
            if from.line().map_err(read_err)?.map_err(refuse)? != b"" {
                return Err(refuse("a chunk's data does not end where its size says"));
            }
        },
    }
    // what the scrubber held back, then the end of a chunked body
    out.clear();
    if let Some(s) = scrub.as_mut() {
        s.finish(&mut out);
        if up {
            done.added.extend(s.replaced());
        } else {
            done.scrubbed.extend(s.replaced());
        }
    }
    if framing == Framing::Chunked {
        if !out.is_empty() {
            write_chunk(to, &out, done, up).map_err(write_err)?;
        }
        write_counted(to, b"0\r\n\r\n", done, up).map_err(write_err)?;
    } else if !out.is_empty() {
        write_counted(to, &out, done, up).map_err(write_err)?;
    }
    Ok(())
}

/// `data` as one chunk of a chunked body (never empty: that is the end).
fn write_chunk<W: Write>(
    to: &mut W,
    data: &[u8],
    done: &mut Exchanged,
    up: bool,
) -> io::Result<()> {
    write_counted(to, format!("{:x}\r\n", data.len()).as_bytes(), done, up)?;
    write_counted(to, data, done, up)?;
    write_counted(to, b"\r\n", done, up)
}

fn write_counted<W: Write>(
    to: &mut W,
    bytes: &[u8],
    done: &mut Exchanged,
    up: bool,
) -> io::Result<()> {
    to.write_all(bytes)?;
    if !up {
        done.bytes_down += bytes.len() as u64;
    }
    Ok(())
}

/// A chunk-size line: hex digits (at most 15, so the size fits), then
/// optionally `;` and extensions (ignored, RFC 9112 §7.1.1). Anything else
/// (a sign, `0x`, spaces before the digits) is malformed.
fn chunk_size(line: &[u8]) -> Option<u64> {
    let digits = line.split(|&b| b == b';').next().unwrap_or_default();
    // optional whitespace before `;` (BWS)
    let digits = match digits.iter().rposition(|b| !b" \t".contains(b)) {
        Some(end) => &digits[..=end],
        None => return None,
    };
    if digits.is_empty() || digits.len() > 15 || !digits.iter().all(u8::is_ascii_hexdigit) {
        return None;
    }
    u64::from_str_radix(std::str::from_utf8(digits).ok()?, 16).ok()
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;
    use crate::swap::SwapSecret;
    use mcpbox_policy::HostRule;
    use std::os::unix::net::UnixStream;
    use std::thread;

    const PH: &str = "ghp_PLACEHOLDERplaceholder0123456789ab";
    const VALUE: &str = "ghp_REALVALUErealvalue9876543210zyxwvu";

    fn swaps() -> Swaps {
        Swaps::new(vec![SwapSecret {
            name: "GITHUB_TOKEN".into(),
            placeholder: PH.into(),
            value: VALUE.into(),
            hosts: vec![HostRule::parse("api.github.com").unwrap()],
            bodies: false,
        }])
        .unwrap()
    }

    fn target() -> Target {
        Target {
            host: Host::Name("api.github.com".into()),
            port: 443,
        }
    }

    /// Runs `relay` between a client that sends `request` (then closes its
    /// writing side) and an upstream played by `upstream`, which gets the
    /// bytes the proxy sent it and returns what to answer. Returns what
    /// the client got, what the upstream got, and the relay's result.
    fn run(
        request: &[u8],
        upstream: impl FnOnce(&mut UnixStream) -> Vec<u8> + Send + 'static,
    ) -> (Vec<u8>, Vec<u8>, Result<(), ExchangeError>, Exchanged) {
        run_with(&swaps(), request, upstream)
    }

    /// [`run`] with the swaps `s`.
    fn run_with(
        s: &Swaps,
        request: &[u8],
        upstream: impl FnOnce(&mut UnixStream) -> Vec<u8> + Send + 'static,
    ) -> (Vec<u8>, Vec<u8>, Result<(), ExchangeError>, Exchanged) {
        let (mut c_out, c_in) = UnixStream::pair().unwrap();
        let (u_out, mut u_in) = UnixStream::pair().unwrap();
        let up = thread::spawn(move || {
            let seen = upstream(&mut u_in);
            let _ = u_in.shutdown(std::net::Shutdown::Both);
            seen
        });
        c_out.write_all(request).unwrap();
        c_out.shutdown(std::net::Shutdown::Write).unwrap();
        let mut done = Exchanged::default();
        let r = relay(&c_in, &u_out, &target(), s, &mut done);
        drop(c_in);
        let _ = u_out.shutdown(std::net::Shutdown::Both);
        let mut got = Vec::new();
        c_out.read_to_end(&mut got).unwrap();
        (got, up.join().unwrap(), r, done)
    }

    /// An upstream that reads one request head (and `body` more bytes),
    /// answers `answer`, and returns what it read.
    fn answers(body: usize, answer: &'static [u8]) -> impl FnOnce(&mut UnixStream) -> Vec<u8> {
        move |s: &mut UnixStream| {
            let mut seen = Vec::new();
            let mut b = [0u8; 1];
            while !seen.ends_with(b"\r\n\r\n") {
                if s.read(&mut b).unwrap() == 0 {
                    return seen;
                }
                seen.push(b[0]);
            }
            let mut rest = vec![0u8; body];
            s.read_exact(&mut rest).unwrap();
            seen.extend_from_slice(&rest);
            s.write_all(answer).unwrap();
            seen
        }
    }

    fn text(b: &[u8]) -> String {
        String::from_utf8_lossy(b).into_owned()
    }

    #[test]
    fn the_value_goes_up_and_an_echo_of_it_comes_back_as_the_placeholder() {
        let req = format!("GET /user HTTP/1.1\r\nHost: api.github.com\r\nAuthorization: Bearer {PH}\r\nAccept-Encoding: gzip\r\nConnection: close\r\n\r\n");
        let echo = format!(
            "HTTP/1.1 200 OK\r\nContent-Length: {}\r\nX-Echo: {VALUE}\r\n\r\n{VALUE}",
            VALUE.len()
        )
        .leak()
        .as_bytes();
        let (got, seen, r, done) = run(req.as_bytes(), answers(0, echo));
        r.unwrap();
        let seen = text(&seen);
        assert!(
            seen.contains(&format!("Authorization: Bearer {VALUE}\r\n")),
            "{seen}"
        );
        assert!(!seen.contains(PH));
        assert!(
            seen.contains("Accept-Encoding: identity\r\n") && !seen.contains("gzip"),
            "{seen}"
        );
        let got = text(&got);
        assert!(!got.contains(VALUE), "{got}");
        assert!(got.ends_with(PH), "{got}");
        assert!(got.contains(&format!("X-Echo: {PH}")));
        assert_eq!(done.added.iter().collect::<Vec<_>>(), ["GITHUB_TOKEN"]);
        assert_eq!(done.scrubbed.iter().collect::<Vec<_>>(), ["GITHUB_TOKEN"]);
    }

    #[test]
    fn a_pipelined_request_for_another_host_is_refused_and_never_sent() {
        let req = format!(
            "GET /a HTTP/1.1\r\nHost: api.github.com\r\nAuthorization: {PH}\r\n\r\n\
             GET /b HTTP/1.1\r\nHost: evil.test\r\nAuthorization: {PH}\r\n\r\n"
        );
        let (got, seen, r, done) = run(
            req.as_bytes(),
            answers(0, b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok"),
        );
        assert!(matches!(r, Err(ExchangeError::Misdirected { .. })), "{r:?}");
        let seen = text(&seen);
        assert_eq!(seen.matches("GET ").count(), 1, "{seen}");
        assert!(!seen.contains("evil.test"));
        let got = text(&got);
        assert!(got.starts_with("HTTP/1.1 200 OK"), "{got}");
        assert!(got.contains("421 Misdirected Request"), "{got}");
        assert_eq!(done.requests, 1);
    }

    #[test]
    fn requests_that_could_name_another_host_are_refused_before_anything_is_sent() {
        for req in [
            // the right name on another port
            format!("GET / HTTP/1.1\r\nHost: api.github.com:8443\r\nAuthorization: {PH}\r\n\r\n"),
            // two Host fields, none, an absolute target for another host
            format!("GET / HTTP/1.1\r\nHost: api.github.com\r\nHost: evil.test\r\nX: {PH}\r\n\r\n"),
            format!("GET / HTTP/1.1\r\nX: {PH}\r\n\r\n"),
            format!("GET http://evil.test/ HTTP/1.1\r\nHost: api.github.com\r\nX: {PH}\r\n\r\n"),
            format!("GET https://api.github.com/ HTTP/1.1\r\nHost: api.github.com\r\nX: {PH}\r\n\r\n"),
            // a tunnel or a protocol switch inside
            format!("CONNECT evil.test:443 HTTP/1.1\r\nHost: api.github.com\r\nX: {PH}\r\n\r\n"),
            format!("GET / HTTP/1.1\r\nHost: api.github.com\r\nConnection: Upgrade\r\nUpgrade: h2c\r\nX: {PH}\r\n\r\n"),
            format!("GET / HTTP/1.1\r\nHost: api.github.com\r\nUpgrade: websocket\r\nX: {PH}\r\n\r\n"),
            // smuggling shapes
            format!("POST / HTTP/1.1\r\nHost: api.github.com\r\nContent-Length: 3\r\nTransfer-Encoding: chunked\r\nX: {PH}\r\n\r\nabc"),
            format!("POST / HTTP/1.1\r\nHost: api.github.com\r\nContent-Length: 3\r\nContent-Length: 4\r\nX: {PH}\r\n\r\nabcd"),
            format!("POST / HTTP/1.1\r\nHost: api.github.com\r\nTransfer-Encoding: gzip, chunked\r\nX: {PH}\r\n\r\n0\r\n\r\n"),
            format!("POST / HTTP/1.1\r\nHost: api.github.com\r\nContent-Length: +3\r\nX: {PH}\r\n\r\nabc"),
            // an HTTP/2 preface
            "PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n".to_string(),
        ] {
            let (got, seen, r, _) = run(req.as_bytes(), answers(0, b""));
            assert!(r.is_err(), "{req:?} was taken");
            assert!(seen.is_empty(), "{req:?} reached the upstream: {}", text(&seen));
            let got = text(&got);
            assert!(
                got.starts_with("HTTP/1.1 4") || got.starts_with("HTTP/1.1 501"),
                "{req:?}: {got}"
            );
        }
    }

    #[test]
    fn a_chunked_body_is_decoded_and_a_value_split_across_chunks_is_still_scrubbed() {
        let (a, b) = VALUE.split_at(10);
        let answer = format!(
            "HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n{:x}\r\n{{\"t\":\"{a}\r\n{:x};ext=1\r\n{b}\"}}\r\n0\r\nX-Trailer: {VALUE}\r\n\r\n",
            a.len() + 6,
            b.len() + 2
        )
        .leak()
        .as_bytes();
        let req = "POST /up HTTP/1.1\r\nHost: api.github.com\r\nTransfer-Encoding: chunked\r\nConnection: close\r\n\r\n5\r\nhello\r\n0\r\n\r\n";
        let (got, seen, r, _) = run(req.as_bytes(), answers(15, answer));
        r.unwrap();
        assert!(
            text(&seen).ends_with("5\r\nhello\r\n0\r\n\r\n"),
            "{}",
            text(&seen)
        );
        let got = text(&got);
        assert!(!got.contains(VALUE), "{got}");
        // decode what the client got
        let (_, body) = got.split_once("\r\n\r\n").unwrap();
        let mut decoded = String::new();
        let mut rest = body;
        loop {
            let (size, after) = rest.split_once("\r\n").unwrap();
            let n = usize::from_str_radix(size, 16).unwrap();
            if n == 0 {
                break;
            }
            decoded.push_str(&after[..n]);
            rest = &after[n + 2..];
        }
        assert_eq!(decoded, format!("{{\"t\":\"{PH}\"}}"));
        assert!(!got.contains("X-Trailer"), "trailers are dropped: {got}");
    }

    #[test]
    fn a_placeholder_in_a_body_goes_as_sent_unless_the_secret_allows_bodies() {
        let n = PH.len() + 6;
        let req = format!(
            "POST /t HTTP/1.1\r\nHost: api.github.com\r\nContent-Length: {n}\r\nConnection: close\r\n\r\ntoken={PH}"
        );
        let (_, seen, r, _) = run(
            req.as_bytes(),
            answers(n, b"HTTP/1.1 204 No Content\r\n\r\n"),
        );
        r.unwrap();
        assert!(
            text(&seen).ends_with(&format!("token={PH}")),
            "{}",
            text(&seen)
        );
        // with bodies = true: the value, same length, the framing unchanged
        let s = Swaps::new(vec![SwapSecret {
            name: "GITHUB_TOKEN".into(),
            placeholder: PH.into(),
            value: VALUE.into(),
            hosts: vec![HostRule::parse("api.github.com").unwrap()],
            bodies: true,
        }])
        .unwrap();
        let (_, seen, r, done) = run_with(
            &s,
            req.as_bytes(),
            answers(n, b"HTTP/1.1 204 No Content\r\n\r\n"),
        );
        r.unwrap();
        let seen = text(&seen);
        assert!(seen.contains(&format!("Content-Length: {n}\r\n")), "{seen}");
        assert!(seen.ends_with(&format!("token={VALUE}")), "{seen}");
        assert_eq!(done.added.iter().collect::<Vec<_>>(), ["GITHUB_TOKEN"]);
    }

    #[test]
    fn a_compressed_response_is_refused_because_it_cannot_be_scrubbed() {
        let req = "GET / HTTP/1.1\r\nHost: api.github.com\r\n\r\n";
        let (got, _, r, _) = run(
            req.as_bytes(),
            answers(
                0,
                b"HTTP/1.1 200 OK\r\nContent-Encoding: gzip\r\nContent-Length: 3\r\n\r\nabc",
            ),
        );
        assert!(matches!(r, Err(ExchangeError::Response(_))), "{r:?}");
        let got = text(&got);
        assert!(got.starts_with("HTTP/1.1 502"), "{got}");
        assert!(!got.contains("abc"));
    }

    #[test]
    fn expect_continue_is_answered_by_the_proxy_and_not_forwarded() {
        let req = "PUT /x HTTP/1.1\r\nHost: api.github.com\r\nExpect: 100-continue\r\nContent-Length: 4\r\nConnection: close\r\n\r\nbody";
        let (got, seen, r, _) = run(
            req.as_bytes(),
            answers(
                4,
                b"HTTP/1.1 100 Continue\r\n\r\nHTTP/1.1 201 Created\r\nContent-Length: 0\r\n\r\n",
            ),
        );
        r.unwrap();
        let seen = text(&seen);
        assert!(!seen.to_ascii_lowercase().contains("expect"), "{seen}");
        assert!(seen.ends_with("\r\n\r\nbody"));
        let got = text(&got);
        assert!(
            got.starts_with("HTTP/1.1 100 Continue\r\n\r\nHTTP/1.1 201 Created"),
            "{got}"
        );
        assert_eq!(got.matches("100 Continue").count(), 1, "{got}");
    }

    #[test]
    fn a_head_request_has_no_body_even_with_a_content_length() {
        let req = "HEAD / HTTP/1.1\r\nHost: api.github.com\r\n\r\nGET / HTTP/1.1\r\nHost: api.github.com\r\nConnection: close\r\n\r\n";
        let up = |s: &mut UnixStream| {
            let mut seen = Vec::new();
            let mut b = [0u8; 1];
            let mut answered = 0;
            while s.read(&mut b).unwrap_or(0) == 1 {
                seen.push(b[0]);
                if seen.ends_with(b"\r\n\r\n") {
                    answered += 1;
                    let a: &[u8] = if answered == 1 {
                        b"HTTP/1.1 200 OK\r\nContent-Length: 5\r\n\r\n"
                    } else {
                        b"HTTP/1.1 200 OK\r\nContent-Length: 5\r\n\r\nhello"
                    };
                    s.write_all(a).unwrap();
                    if answered == 2 {
                        break;
                    }
                }
            }
            seen
        };
        let (got, seen, r, done) = run(req.as_bytes(), up);
        r.unwrap();
        assert_eq!(done.requests, 2);
        assert_eq!(text(&seen).matches("HTTP/1.1\r\n").count(), 2);
        assert!(text(&got).ends_with("\r\n\r\nhello"));
    }

    #[test]
    fn a_response_cut_short_is_an_upstream_failure_not_a_short_answer() {
        let req = "GET / HTTP/1.1\r\nHost: api.github.com\r\n\r\n";
        let (got, _, r, done) = run(
            req.as_bytes(),
            answers(0, b"HTTP/1.1 200 OK\r\nContent-Length: 10\r\n\r\nabc"),
        );
        assert!(matches!(r, Err(ExchangeError::Upstream(_))), "{r:?}");
        assert!(done.answering);
        // the client got the head and the three bytes, then the close:
        // it sees a short body, never a second (error) response after it
        assert!(text(&got).ends_with("\r\n\r\nabc"), "{}", text(&got));
    }

    #[test]
    fn chunk_sizes_are_read_strictly() {
        assert_eq!(chunk_size(b"1a"), Some(26));
        assert_eq!(chunk_size(b"1A;name=value"), Some(26));
        assert_eq!(chunk_size(b"0"), Some(0));
        for bad in [
            &b""[..],
            b" 1",
            b"+1",
            b"0x1",
            b"-1",
            b"1 2",
            b"g",
            b"1000000000000000",
        ] {
            assert_eq!(chunk_size(bad), None, "{:?}", text(bad));
        }
    }
}
