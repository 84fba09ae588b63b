//! The response bodies the gateway sends: a whole JSON document, or a
//! server-sent event stream fed from a channel.

use std::convert::Infallible;
use std::pin::Pin;
use std::task::{Context, Poll};

use bytes::Bytes;
use hyper::body::{Body as HttpBody, Frame, SizeHint};
use tokio::sync::mpsc;

/// A response body.
#[derive(Debug)]
pub enum Body {
    /// The whole body (taken on the first poll).
    Full(Option<Bytes>),
    /// An event stream: each chunk is one or more whole SSE events; the
    /// body ends when every sender is gone.
    Stream(mpsc::Receiver<Bytes>),
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
            Body::Stream(rx) => rx.poll_recv(cx).map(|c| c.map(|b| Ok(Frame::data(b)))),
        }
    }

    fn is_end_stream(&self) -> bool {
        matches!(self, Body::Full(None))
    }

    fn size_hint(&self) -> SizeHint {
        match self {
            Body::Full(Some(b)) => SizeHint::with_exact(b.len() as u64),
            Body::Full(None) => SizeHint::with_exact(0),
            Body::Stream(_) => SizeHint::default(),
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
