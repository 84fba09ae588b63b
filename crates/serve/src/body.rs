//! The response bodies the gateway sends: a whole JSON document, or a
//! server-sent event stream fed from a channel.

use std::convert::Infallible;
use std::pin::Pin;
use std::task::{Context, Poll};

use bytes::Bytes;
use hyper::body::{Body as HttpBody, Frame, SizeHint};
use tokio::sync::mpsc;

use crate::budget::Charge;

/// A response body.
pub enum Body {
    /// The whole body (taken on the first poll).
    Full(Option<Bytes>),
    /// An event stream: each chunk is one or more whole SSE events; the
    /// body ends when every sender is gone. A chunk's bytes stay charged
    /// to its session's budget until hyper asks for the next one (then it
    /// had room for more: the chunk is in the socket or in hyper's
    /// bounded write buffer).
    Stream {
        /// The chunks, in order.
        rx: mpsc::Receiver<Chunk>,
        /// The charge of the chunk handed out last.
        last: Option<Charge>,
    },
    /// A body and what must live until it is done or dropped: a POST's
    /// place among the requests in flight, so that a graceful stop waits
    /// for the last byte of a streamed answer, not for the handler.
    Held(Box<Body>, Box<dyn Send + Sync>),
}

impl std::fmt::Debug for Body {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Body::Full(b) => f.debug_tuple("Full").field(b).finish(),
            Body::Stream { .. } => f.write_str("Stream"),
            Body::Held(b, _) => f.debug_tuple("Held").field(b).finish(),
        }
    }
}

/// One chunk of an event stream, charged to its session's budget.
#[derive(Debug)]
pub struct Chunk {
    bytes: Bytes,
    charge: Charge,
}

impl Chunk {
    /// `bytes`, with the charge of the message they were made of.
    pub fn new(bytes: Bytes, charge: Charge) -> Chunk {
        Chunk { bytes, charge }
    }

    /// mcpbox's own bytes (a keep-alive, an error that ends a request).
    pub fn own(bytes: Bytes) -> Chunk {
        Chunk {
            bytes,
            charge: Charge::default(),
        }
    }
}

impl Body {
    /// A body of these bytes.
    pub fn full(bytes: impl Into<Bytes>) -> Body {
        Body::Full(Some(bytes.into()))
    }

    /// No body.
    pub fn empty() -> Body {
        Body::Full(None)
    }

    /// An event stream of these chunks.
    pub fn stream(rx: mpsc::Receiver<Chunk>) -> Body {
        Body::Stream { rx, last: None }
    }

    /// This body, with `guard` kept until it is done or dropped.
    pub fn held(self, guard: Box<dyn Send + Sync>) -> Body {
        Body::Held(Box::new(self), guard)
    }
}

impl HttpBody for Body {
    type Data = Bytes;
    type Error = Infallible;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, Infallible>>> {
        match self.get_mut() {
            Body::Full(bytes) => Poll::Ready(bytes.take().map(|b| Ok(Frame::data(b)))),
            Body::Stream { rx, last } => {
                // asked again: hyper took the last chunk in
                *last = None;
                rx.poll_recv(cx).map(|c| {
                    c.map(|c| {
                        *last = Some(c.charge);
                        Ok(Frame::data(c.bytes))
                    })
                })
            }
            Body::Held(inner, _) => Pin::new(inner.as_mut()).poll_frame(cx),
        }
    }

    fn is_end_stream(&self) -> bool {
        match self {
            Body::Held(inner, _) => inner.is_end_stream(),
            b => matches!(b, Body::Full(None)),
        }
    }

    fn size_hint(&self) -> SizeHint {
        match self {
            Body::Full(Some(b)) => SizeHint::with_exact(b.len() as u64),
            Body::Full(None) => SizeHint::with_exact(0),
            Body::Stream { .. } => SizeHint::default(),
            Body::Held(inner, _) => inner.size_hint(),
        }
    }
}

/// One JSON-RPC message as a server-sent event (`event: message`). A
/// message is one line of JSON (the relay never passes raw newlines), so
/// it fits one `data:` field.
pub fn sse_event(message: &[u8]) -> Bytes {
    let mut out = Vec::with_capacity(message.len() + 24);
    out.extend_from_slice(b"event: message\ndata: ");
    // a stray CR or LF would end the field early; JSON text has none
    // outside strings, where they are escaped, so this only guards
    out.extend(
        message
            .iter()
            .map(|&b| if b == b'\n' || b == b'\r' { b' ' } else { b }),
    );
    out.extend_from_slice(b"\n\n");
    Bytes::from(out)
}

/// An SSE comment that keeps idle connections (and proxies) from timing
/// the stream out; clients ignore it.
pub const KEEPALIVE: &[u8] = b": keepalive\n\n";

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_newline_smuggled_into_a_message_cannot_start_a_second_event() {
        let e = sse_event(b"{\"a\":1}\ndata: {\"evil\":true}");
        let text = std::str::from_utf8(&e).unwrap();
        let fields = text.lines().filter(|l| l.starts_with("data:")).count();
        assert_eq!(fields, 1, "{text}");
        assert!(text.ends_with("\n\n"));
    }
}
