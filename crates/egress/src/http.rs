//! HTTP/1.x request heads as the proxy needs them: read a head without
//! reading past it by more than one buffer, parse it strictly, parse the
//! target, rewrite a plain-HTTP request to origin form, and write responses.

use std::io::{self, Read};
use std::net::IpAddr;

/// Largest request head accepted; bigger ones are a malformed request.
pub const MAX_HEAD: usize = 64 * 1024;

/// Why a request could not be taken.
#[derive(Debug, thiserror::Error)]
pub enum HeadError {
    /// The peer closed before sending anything.
    #[error("the client closed the connection before sending a request")]
    Empty,
    /// Reading failed (including the head timeout).
    #[error("reading the request head failed: {0}")]
    Read(#[source] io::Error),
    /// The bytes are not an acceptable HTTP/1.x request.
    #[error("malformed request: {0}")]
    Malformed(&'static str),
}

/// A parsed request head.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RequestHead {
    /// Request method, e.g. `CONNECT` or `GET`.
    pub method: String,
    /// Request target as sent.
    pub target: String,
    /// `HTTP/1.1` or `HTTP/1.0`.
    pub version: String,
    /// Header fields in order, names as sent.
    pub headers: Vec<(String, String)>,
}

/// Reads from `r` into `buf` until a full head (`\r\n\r\n`) is present.
/// Returns the head length; bytes after it (`buf[len..]`) belong to the body
/// or the tunnel and must be forwarded.
pub fn read_head<R: Read>(r: &mut R, buf: &mut Vec<u8>) -> Result<usize, HeadError> {
    let mut chunk = [0u8; 4096];
    loop {
        if let Some(end) = find_head_end(buf) {
            return Ok(end);
        }
        if buf.len() >= MAX_HEAD {
            return Err(HeadError::Malformed("request head too large"));
        }
        let n = match r.read(&mut chunk) {
            Ok(n) => n,
            Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
            Err(e) => return Err(HeadError::Read(e)),
        };
        if n == 0 {
            return Err(if buf.is_empty() {
                HeadError::Empty
            } else {
                HeadError::Malformed("connection closed inside the request head")
            });
        }
        buf.extend_from_slice(&chunk[..n]);
    }
}

fn find_head_end(buf: &[u8]) -> Option<usize> {
    buf.windows(4).position(|w| w == b"\r\n\r\n").map(|p| p + 4)
}

/// Most header fields accepted in one request head. A head is at most
/// [`MAX_HEAD`] bytes anyway; this bounds the work per head and matches
/// hyper's own default (100), with room for proxy clients' extras.
pub const MAX_HEADERS: usize = 128;

/// Parses a head (including its final empty line) strictly: CRLF line ends,
/// no obs-fold, no control characters, no whitespace before the colon, at
/// most [`MAX_HEADERS`] fields. The framing fields of a forwarded request
/// are checked by [`rewrite_absolute`].
///
/// The grammar is `httparse`'s (the parser hyper uses). Its defaults already
/// refuse, for a request: whitespace between a field name and its colon
/// (RFC 9112 §5.1, a smuggling shape), obs-fold (§5.2: a line that starts
/// with a space is not a field name), more than one space between the parts
/// of the request line, a version other than HTTP/1.0 and HTTP/1.1, a method
/// or field name that is not a token, a target or value with a control
/// character, and more fields than the slice it is given. What it accepts
/// and the proxy does not is checked here, before and after it runs:
/// - a bare LF as a line end (httparse takes `\n` alone, RFC 9112 §2.2
///   allows it; a proxy and an upstream that split lines differently
///   disagree about where a field ends, so only CRLF is taken);
/// - empty lines before the request line (httparse skips them, §2.2);
/// - bytes after the head's empty line (the caller hands the head alone);
/// - field values that are obs-text but not UTF-8 (httparse gives bytes).
pub fn parse_head(head: &[u8]) -> Result<RequestHead, HeadError> {
    check_lines(head)?;
    let mut fields = vec![httparse::EMPTY_HEADER; MAX_HEADERS];
    let mut req = httparse::Request::new(&mut fields);
    let len = match req.parse(head) {
        Ok(httparse::Status::Complete(len)) => len,
        Ok(httparse::Status::Partial) => {
            return Err(HeadError::Malformed("head does not end with an empty line"))
        }
        Err(e) => return Err(HeadError::Malformed(parse_error(e))),
    };
    if len != head.len() {
        return Err(HeadError::Malformed("bytes after the end of the head"));
    }
    let (Some(method), Some(target), Some(minor)) = (req.method, req.path, req.version) else {
        return Err(HeadError::Malformed("no request line"));
    };
    let version = match minor {
        0 => "HTTP/1.0",
        1 => "HTTP/1.1",
        _ => return Err(HeadError::Malformed("unsupported http version")),
    };

    let headers = fields_of(req.headers)?;
    Ok(RequestHead {
        method: method.to_string(),
        target: target.to_string(),
        version: version.to_string(),
        headers,
    })
}

/// What httparse takes and the proxy does not, in any head (request or
/// response): not UTF-8, no final empty line, a bare LF as a line end, an
/// empty line before the first line (see [`parse_head`]).
fn check_lines(head: &[u8]) -> Result<(), HeadError> {
    let text = std::str::from_utf8(head).map_err(|_| HeadError::Malformed("head is not utf-8"))?;
    if !text.ends_with("\r\n\r\n") {
        return Err(HeadError::Malformed("head does not end with an empty line"));
    }
    // Only CRLF ends a line: every LF must follow a CR. A CR not followed
    // by LF is refused by httparse itself (it expects LF after every CR).
    let bytes = text.as_bytes();
    if bytes
        .iter()
        .enumerate()
        .any(|(i, &b)| b == b'\n' && (i == 0 || bytes[i - 1] != b'\r'))
    {
        return Err(HeadError::Malformed("bare line feed in the head"));
    }
    if text.starts_with("\r\n") {
        return Err(HeadError::Malformed("empty line before the first line"));
    }
    Ok(())
}

/// httparse's fields as owned pairs; a value that is obs-text but not
/// UTF-8 is refused (httparse gives bytes).
fn fields_of(fields: &[httparse::Header<'_>]) -> Result<Vec<(String, String)>, HeadError> {
    fields
        .iter()
        .map(|field| {
            let value = std::str::from_utf8(field.value)
                .map_err(|_| HeadError::Malformed("header value is not utf-8"))?;
            Ok((field.name.to_string(), value.to_string()))
        })
        .collect()
}

/// A parsed response head (an upstream's, on a connection the proxy
/// opened to put a secret in: exchange.rs).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ResponseHead {
    /// `HTTP/1.1` or `HTTP/1.0`.
    pub version: String,
    /// Status code.
    pub status: u16,
    /// Header fields in order, names as sent.
    pub headers: Vec<(String, String)>,
}

/// Parses a response head as strictly as [`parse_head`] does a request's.
pub fn parse_response_head(head: &[u8]) -> Result<ResponseHead, HeadError> {
    check_lines(head)?;
    let mut fields = vec![httparse::EMPTY_HEADER; MAX_HEADERS];
    let mut resp = httparse::Response::new(&mut fields);
    let len = match resp.parse(head) {
        Ok(httparse::Status::Complete(len)) => len,
        Ok(httparse::Status::Partial) => {
            return Err(HeadError::Malformed("head does not end with an empty line"))
        }
        Err(httparse::Error::Status) => return Err(HeadError::Malformed("bad status code")),
        Err(e) => return Err(HeadError::Malformed(parse_error(e))),
    };
    if len != head.len() {
        return Err(HeadError::Malformed("bytes after the end of the head"));
    }
    let (Some(minor), Some(status)) = (resp.version, resp.code) else {
        return Err(HeadError::Malformed("no status line"));
    };
    let version = match minor {
        0 => "HTTP/1.0",
        1 => "HTTP/1.1",
        _ => return Err(HeadError::Malformed("unsupported http version")),
    };
    let headers = fields_of(resp.headers)?;
    Ok(ResponseHead {
        version: version.to_string(),
        status,
        headers,
    })
}

/// How a message's body is delimited (RFC 9112 §6).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Framing {
    /// No `Content-Length` and no `Transfer-Encoding`: a request has no
    /// body; a response runs until the connection closes.
    None,
    /// `Content-Length: N`.
    Length(u64),
    /// `Transfer-Encoding: chunked`.
    Chunked,
}

/// The framing `headers` declare, refusing what two parsers could read
/// differently (RFC 9112 §6.3, request smuggling): `Content-Length` with
/// `Transfer-Encoding`, more than one `Content-Length`, one that is not
/// `1*DIGIT` (httparse hands values over unread), and, where `strict_te`,
/// a `Transfer-Encoding` other than exactly `chunked` once.
pub fn framing(headers: &[(String, String)], strict_te: bool) -> Result<Framing, HeadError> {
    let mut length = None;
    let mut te: Option<&str> = None;
    for (name, value) in headers {
        if name.eq_ignore_ascii_case("content-length") {
            if length.is_some() {
                return Err(HeadError::Malformed("more than one content-length header"));
            }
            if value.is_empty() || value.len() > 19 || !value.bytes().all(|b| b.is_ascii_digit()) {
                return Err(HeadError::Malformed("content-length is not a number"));
            }
            length = Some(
                value
                    .parse::<u64>()
                    .map_err(|_| HeadError::Malformed("content-length is not a number"))?,
            );
        }
        if name.eq_ignore_ascii_case("transfer-encoding") {
            if te.is_some() && strict_te {
                return Err(HeadError::Malformed(
                    "more than one transfer-encoding header",
                ));
            }
            te = Some(value);
        }
    }
    match (length, te) {
        (Some(_), Some(_)) => Err(HeadError::Malformed(
            "both content-length and transfer-encoding",
        )),
        (Some(n), None) => Ok(Framing::Length(n)),
        (None, Some(v)) => {
            if strict_te && !v.trim().eq_ignore_ascii_case("chunked") {
                return Err(HeadError::Malformed(
                    "a transfer-encoding other than chunked",
                ));
            }
            Ok(Framing::Chunked)
        }
        (None, None) => Ok(Framing::None),
    }
}

/// httparse's error, said as the part of the head that is wrong.
fn parse_error(e: httparse::Error) -> &'static str {
    match e {
        httparse::Error::HeaderName => "bad header name",
        httparse::Error::HeaderValue => "control character in a header value",
        httparse::Error::NewLine => "bad line ending",
        httparse::Error::Token => "request line is not `METHOD TARGET VERSION`",
        httparse::Error::Version => "unsupported http version",
        httparse::Error::TooManyHeaders => "too many header fields",
        // A request has no status; any other error is a malformed head.
        _ => "malformed request head",
    }
}

/// A checked host: a lowercase DNS name or an IP literal.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Host {
    /// A DNS name, lowercase, without a trailing dot.
    Name(String),
    /// An IP literal.
    Ip(IpAddr),
}

impl Host {
    /// The form handed to the policy: the name, or the canonical IP text.
    pub fn policy_form(&self) -> String {
        match self {
            Self::Name(n) => n.clone(),
            Self::Ip(ip) => ip.to_string(),
        }
    }

    /// The form for a `Host` header or authority (IPv6 in brackets).
    pub fn authority_form(&self) -> String {
        match self {
            Self::Name(n) => n.clone(),
            Self::Ip(IpAddr::V6(v6)) => format!("[{v6}]"),
            Self::Ip(ip) => ip.to_string(),
        }
    }
}

/// Parses `host[:port]` (IPv6 in brackets), with `default_port` when absent.
pub fn parse_authority(auth: &str, default_port: u16) -> Result<(Host, u16), HeadError> {
    if auth.contains('@') {
        return Err(HeadError::Malformed("userinfo in the authority"));
    }
    let (host_text, port_text) = if let Some(rest) = auth.strip_prefix('[') {
        let (h, after) = rest
            .split_once(']')
            .ok_or(HeadError::Malformed("unclosed bracket in the authority"))?;
        let port = match after {
            "" => None,
            p => Some(
                p.strip_prefix(':')
                    .ok_or(HeadError::Malformed("junk after the bracketed host"))?,
            ),
        };
        let ip: std::net::Ipv6Addr = h
            .parse()
            .map_err(|_| HeadError::Malformed("bad ipv6 literal"))?;
        let port = parse_port(port, default_port)?;
        return Ok((Host::Ip(IpAddr::V6(ip)), port));
    } else {
        match auth.rsplit_once(':') {
            Some((h, p)) => (h, Some(p)),
            None => (auth, None),
        }
    };
    let port = parse_port(port_text, default_port)?;
    Ok((parse_host(host_text)?, port))
}

fn parse_port(text: Option<&str>, default_port: u16) -> Result<u16, HeadError> {
    match text {
        None => Ok(default_port),
        Some(p) if !p.is_empty() && p.len() <= 5 && p.bytes().all(|b| b.is_ascii_digit()) => {
            match p.parse::<u16>() {
                Ok(0) | Err(_) => Err(HeadError::Malformed("bad port")),
                Ok(port) => Ok(port),
            }
        }
        Some(_) => Err(HeadError::Malformed("bad port")),
    }
}

/// Checks a host name or IPv4 literal. Names that a resolver might read as
/// a number (`2130706433`, `0x7f.1`, `127.1`) are refused as ambiguous, so
/// that the policy and the resolver can never disagree about what a host is.
pub fn parse_host(text: &str) -> Result<Host, HeadError> {
    if let Ok(ip) = text.parse::<std::net::Ipv4Addr>() {
        return Ok(Host::Ip(IpAddr::V4(ip)));
    }
    let name = text.strip_suffix('.').unwrap_or(text).to_ascii_lowercase();
    if name.is_empty() || name.len() > 253 {
        return Err(HeadError::Malformed("bad host name length"));
    }
    for label in name.split('.') {
        if label.is_empty()
            || label.len() > 63
            || !label
                .bytes()
                .all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'_')
        {
            return Err(HeadError::Malformed("bad host name"));
        }
    }
    let last = name.rsplit('.').next().unwrap_or_default();
    if last.bytes().all(|b| b.is_ascii_digit()) || last.starts_with("0x") {
        return Err(HeadError::Malformed(
            "numeric host that is not a plain ip literal",
        ));
    }
    Ok(Host::Name(name))
}

/// Headers that belong to one hop and are never forwarded (RFC 9110 §7.6.1),
/// plus the proxy credentials. `Transfer-Encoding` is kept: the body is
/// streamed as sent, so the upstream needs its framing.
const HOP_BY_HOP: [&str; 8] = [
    "connection",
    "proxy-connection",
    "keep-alive",
    "proxy-authorization",
    "proxy-authenticate",
    "te",
    "trailer",
    "upgrade",
];

/// The fields a `Connection` header names (lowercase): hop-by-hop, never
/// forwarded (RFC 9110 §7.6.1).
pub fn connection_named(headers: &[(String, String)]) -> Vec<String> {
    headers
        .iter()
        .filter(|(name, _)| name.eq_ignore_ascii_case("connection"))
        .flat_map(|(_, value)| value.split(',').map(|v| v.trim().to_ascii_lowercase()))
        .filter(|v| !v.is_empty())
        .collect()
}

/// Whether `name` is hop-by-hop: one of the standard ones or named in
/// `Connection` (`named`, from [`connection_named`]).
pub fn is_hop_by_hop(name: &str, named: &[String]) -> bool {
    let lower = name.to_ascii_lowercase();
    HOP_BY_HOP.contains(&lower.as_str()) || named.contains(&lower)
}

/// A plain-HTTP request ready to forward.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Forward {
    /// Target host.
    pub host: Host,
    /// Target port.
    pub port: u16,
    /// Path and query in origin form (`/a/b?c`).
    pub path: String,
    /// The rewritten head to send upstream.
    pub head: Vec<u8>,
}

/// Rewrites an absolute-form request (`GET http://host/path HTTP/1.1`) to
/// origin form: `Host` set from the target, hop-by-hop headers and those
/// named in `Connection` dropped, `Connection: close` added (one request per
/// upstream connection).
pub fn rewrite_absolute(req: &RequestHead) -> Result<Forward, HeadError> {
    let target = &req.target;
    let rest = match target.get(..7) {
        Some(s) if s.eq_ignore_ascii_case("http://") => &target[7..],
        _ => {
            return Err(HeadError::Malformed(
                "a plain request must use an absolute http:// target (use CONNECT for https)",
            ))
        }
    };
    let rest = rest.split('#').next().unwrap_or_default();
    let split = rest.find(['/', '?']).unwrap_or(rest.len());
    let (authority, path) = rest.split_at(split);
    let (host, port) = parse_authority(authority, 80)?;
    let path = if path.is_empty() {
        "/".to_string()
    } else if path.starts_with('?') {
        format!("/{path}")
    } else {
        path.to_string()
    };

    // The body is streamed as sent, so its framing is the upstream's to
    // read; two framings an upstream may read differently are refused here
    // (RFC 9112 §6.3: Transfer-Encoding with Content-Length, or an invalid
    // Content-Length, is a request smuggling shape the recipient rejects).
    // RFC 9110 §8.6: `Content-Length = 1*DIGIT`. A list ("3, 3"), a sign
    // or a second field is refused rather than interpreted.
    framing(&req.headers, false)?;
    let named = connection_named(&req.headers);

    let host_header = if port == 80 {
        host.authority_form()
    } else {
        format!("{}:{port}", host.authority_form())
    };
    let mut out = format!(
        "{} {} {}\r\nHost: {host_header}\r\n",
        req.method, path, req.version
    );
    for (name, value) in &req.headers {
        if name.eq_ignore_ascii_case("host") || is_hop_by_hop(name, &named) {
            continue;
        }
        out.push_str(name);
        out.push_str(": ");
        out.push_str(value);
        out.push_str("\r\n");
    }
    out.push_str("Connection: close\r\n\r\n");
    Ok(Forward {
        host,
        port,
        path,
        head: out.into_bytes(),
    })
}

/// Whose fault a failed request was, said in the `X-Mcpbox-Fault` header.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Fault {
    /// The policy refused it: nobody's fault, by design.
    Policy,
    /// The client sent something malformed.
    Client,
    /// The upstream server could not be resolved or reached.
    Upstream,
    /// mcpbox itself failed.
    Proxy,
}

impl Fault {
    fn as_str(self) -> &'static str {
        match self {
            Self::Policy => "policy",
            Self::Client => "client",
            Self::Upstream => "upstream",
            Self::Proxy => "mcpbox",
        }
    }
}

fn header_safe(s: &str) -> String {
    s.chars()
        .map(|c| {
            if c.is_control() || !c.is_ascii() {
                '?'
            } else {
                c
            }
        })
        .collect()
}

/// An error response with the reason, source and fault headers and a short
/// text body.
pub fn error_response(
    status: u16,
    reason: &str,
    source: &str,
    fault: Fault,
    body: &str,
) -> Vec<u8> {
    let text = match status {
        400 => "Bad Request",
        403 => "Forbidden",
        502 => "Bad Gateway",
        503 => "Service Unavailable",
        _ => "Internal Server Error",
    };
    let body = format!("{}\n", header_safe(body));
    format!(
        "HTTP/1.1 {status} {text}\r\nX-Mcpbox-Reason: {}\r\nX-Mcpbox-Source: {}\r\nX-Mcpbox-Fault: {}\r\nContent-Type: text/plain; charset=utf-8\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
        header_safe(reason),
        header_safe(source),
        fault.as_str(),
        body.len(),
    )
    .into_bytes()
}

/// The answer to a CONNECT that will be tunnelled.
pub const CONNECT_OK: &[u8] = b"HTTP/1.1 200 Connection Established\r\n\r\n";

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    fn head(s: &str) -> RequestHead {
        parse_head(s.as_bytes()).unwrap()
    }

    #[test]
    fn head_is_read_without_swallowing_the_body() {
        let mut src: &[u8] = b"CONNECT a.b:443 HTTP/1.1\r\nHost: a.b\r\n\r\n\x16\x03\x01";
        let mut buf = Vec::new();
        let n = read_head(&mut src, &mut buf).unwrap();
        assert_eq!(&buf[n..], b"\x16\x03\x01");
    }

    #[test]
    fn smuggling_shapes_are_malformed() {
        for bad in [
            "GET http://a/ HTTP/1.1\r\nHost : a\r\n\r\n",
            "GET http://a/ HTTP/1.1\r\nX: a\r\n b\r\n\r\n",
            "GET  http://a/ HTTP/1.1\r\n\r\n",
            "GET http://a/ HTTP/2\r\n\r\n",
            "GET http://a/ HTTP/1.1\nX: y\r\n\r\n",
        ] {
            assert!(parse_head(bad.as_bytes()).is_err(), "{bad:?}");
        }
        let h = head(
            "POST http://a/ HTTP/1.1\r\nContent-Length: 1\r\nTransfer-Encoding: chunked\r\n\r\n",
        );
        assert!(rewrite_absolute(&h).is_err());
    }

    #[test]
    fn shapes_httparse_accepts_are_still_malformed() {
        let many: String = (0..=MAX_HEADERS).map(|i| format!("X-{i}: v\r\n")).collect();
        let too_many = format!("GET http://a/ HTTP/1.1\r\n{many}\r\n");
        for bad in [
            // bare LF ending a field line (httparse takes it as a line end)
            "GET http://a/ HTTP/1.1\r\nX: y\nZ: w\r\n\r\n",
            // empty lines before the request line (httparse skips them)
            "\r\nGET http://a/ HTTP/1.1\r\n\r\n",
            // a second request after the head's empty line
            "GET http://a/ HTTP/1.1\r\n\r\nGET http://b/ HTTP/1.1\r\n\r\n",
            // bare CR, NUL and DEL inside a value
            "GET http://a/ HTTP/1.1\r\nX: a\rb\r\n\r\n",
            "GET http://a/ HTTP/1.1\r\nX: a\0b\r\n\r\n",
            "GET http://a/ HTTP/1.1\r\nX: a\x7fb\r\n\r\n",
            // tab or trailing space in the request line
            "GET\thttp://a/ HTTP/1.1\r\n\r\n",
            "GET http://a/ HTTP/1.1 \r\n\r\n",
            // obs-fold on the first field, empty field name
            "GET http://a/ HTTP/1.1\r\n X: a\r\n\r\n",
            "GET http://a/ HTTP/1.1\r\n: a\r\n\r\n",
            too_many.as_str(),
        ] {
            assert!(parse_head(bad.as_bytes()).is_err(), "{bad:?}");
        }
        let at_limit: String = (0..MAX_HEADERS).map(|i| format!("X-{i}: v\r\n")).collect();
        let h = head(&format!("GET http://a/ HTTP/1.1\r\n{at_limit}\r\n"));
        assert_eq!(h.headers.len(), MAX_HEADERS);
        let h = head("GET http://a/ HTTP/1.1\r\nX:  \tspaced out\t \r\nY:\r\n\r\n");
        assert_eq!(
            h.headers,
            [
                ("X".into(), "spaced out".into()),
                ("Y".into(), String::new())
            ]
        );
    }

    #[test]
    fn content_length_that_two_parsers_could_read_differently_is_refused() {
        for bad in [
            "POST http://a/ HTTP/1.1\r\nContent-Length: 3\r\nContent-Length: 3\r\n\r\n",
            "POST http://a/ HTTP/1.1\r\nContent-Length: 3\r\ncontent-length: 4\r\n\r\n",
            "POST http://a/ HTTP/1.1\r\nContent-Length: 3, 3\r\n\r\n",
            "POST http://a/ HTTP/1.1\r\nContent-Length: +3\r\n\r\n",
            "POST http://a/ HTTP/1.1\r\nContent-Length: 0x3\r\n\r\n",
            "POST http://a/ HTTP/1.1\r\nContent-Length:\r\n\r\n",
            "POST http://a/ HTTP/1.1\r\nTransfer-Encoding: chunked\r\ncontent-length: 3\r\n\r\n",
        ] {
            assert!(rewrite_absolute(&head(bad)).is_err(), "{bad:?}");
        }
        let ok = head("POST http://a/ HTTP/1.1\r\nContent-Length: 003\r\n\r\n");
        assert!(rewrite_absolute(&ok).is_ok());
    }

    #[test]
    fn authority_forms() {
        assert_eq!(
            parse_authority("Example.COM.:8443", 443).unwrap(),
            (Host::Name("example.com".into()), 8443)
        );
        assert_eq!(
            parse_authority("[::1]:443", 80).unwrap(),
            (Host::Ip("::1".parse().unwrap()), 443)
        );
        assert_eq!(
            parse_authority("1.2.3.4", 80).unwrap(),
            (Host::Ip("1.2.3.4".parse().unwrap()), 80)
        );
        for bad in [
            "user@a.b:443",
            "a.b:0",
            "a.b:99999",
            "a.b:",
            "2130706433:80",
            "127.1:80",
            "0x7f.0.0.1:80",
            "a..b:1",
            "a b:1",
            "[::1",
        ] {
            assert!(parse_authority(bad, 443).is_err(), "{bad}");
        }
    }

    #[test]
    fn absolute_form_is_rewritten_to_origin_form() {
        let h = head("GET http://Pkg.Test:8080/a/b?c=1 HTTP/1.1\r\nHost: evil.test\r\nProxy-Authorization: Basic eA==\r\nProxy-Connection: keep-alive\r\nConnection: keep-alive, X-Drop\r\nX-Drop: 1\r\nX-Keep: 2\r\n\r\n");
        let f = rewrite_absolute(&h).unwrap();
        assert_eq!(f.host, Host::Name("pkg.test".into()));
        assert_eq!(f.port, 8080);
        assert_eq!(
            String::from_utf8(f.head).unwrap(),
            "GET /a/b?c=1 HTTP/1.1\r\nHost: pkg.test:8080\r\nX-Keep: 2\r\nConnection: close\r\n\r\n"
        );
        let h = head("GET http://a.test HTTP/1.1\r\n\r\n");
        assert_eq!(rewrite_absolute(&h).unwrap().path, "/");
        let h = head("GET https://a.test/ HTTP/1.1\r\n\r\n");
        assert!(rewrite_absolute(&h).is_err());
    }

    #[test]
    fn error_headers_cannot_be_split() {
        let r =
            String::from_utf8(error_response(403, "a\r\nX: y", "s", Fault::Policy, "b")).unwrap();
        assert!(r.contains("X-Mcpbox-Reason: a??X: y\r\n"));
    }
}
