//! Just enough of TLS to read the server name (SNI) from a ClientHello
//! (RFC 8446 §4.1.2, RFC 6066 §3), so that a CONNECT to an allowed host
//! cannot carry a handshake for another name (domain fronting by SNI).
//! The ClientHello may be split over several records; they are reassembled.

/// Largest ClientHello the proxy waits for before giving up.
pub const MAX_HELLO: usize = 64 * 1024;

/// What the first client bytes of a tunnel are.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Hello {
    /// Not a TLS handshake record: some other protocol, relayed unchecked.
    NotTls,
    /// The start of a TLS handshake; more bytes are needed.
    Incomplete,
    /// A complete ClientHello, with its server name if it sent one.
    ClientHello {
        /// The `host_name` from the server_name extension, lowercase.
        sni: Option<String>,
    },
    /// Looks like TLS but is not a well-formed ClientHello: refused.
    Malformed(&'static str),
}

struct Cursor<'a> {
    buf: &'a [u8],
}

impl<'a> Cursor<'a> {
    fn take(&mut self, n: usize) -> Option<&'a [u8]> {
        if self.buf.len() < n {
            return None;
        }
        let (head, rest) = self.buf.split_at(n);
        self.buf = rest;
        Some(head)
    }
    fn u8(&mut self) -> Option<usize> {
        self.take(1).map(|b| usize::from(b[0]))
    }
    fn u16(&mut self) -> Option<usize> {
        self.take(2)
            .map(|b| usize::from(u16::from_be_bytes([b[0], b[1]])))
    }
    fn vec8(&mut self) -> Option<&'a [u8]> {
        let n = self.u8()?;
        self.take(n)
    }
    fn vec16(&mut self) -> Option<&'a [u8]> {
        let n = self.u16()?;
        self.take(n)
    }
}

/// Inspects the first bytes a client sent into a tunnel.
pub fn inspect(buf: &[u8]) -> Hello {
    if buf.is_empty() {
        return Hello::Incomplete;
    }
    if buf[0] != 0x16 {
        return Hello::NotTls;
    }
    if buf.len() >= 2 && buf[1] != 0x03 {
        return Hello::NotTls;
    }
    // Reassemble the handshake layer from consecutive handshake records.
    let mut handshake = Vec::new();
    let mut rest = buf;
    loop {
        if rest.len() < 5 {
            return Hello::Incomplete;
        }
        if rest[0] != 0x16 || rest[1] != 0x03 {
            return Hello::Malformed("non-handshake record inside the client hello");
        }
        let len = usize::from(u16::from_be_bytes([rest[3], rest[4]]));
        if len == 0 || len > (1 << 14) {
            return Hello::Malformed("bad tls record length");
        }
        if rest.len() < 5 + len {
            return Hello::Incomplete;
        }
        handshake.extend_from_slice(&rest[5..5 + len]);
        rest = &rest[5 + len..];
        if handshake.len() >= 4 {
            if handshake[0] != 1 {
                return Hello::Malformed("first handshake message is not a client hello");
            }
            let body_len = (usize::from(handshake[1]) << 16)
                | (usize::from(handshake[2]) << 8)
                | usize::from(handshake[3]);
            if body_len + 4 > MAX_HELLO {
                return Hello::Malformed("client hello too large");
            }
            if handshake.len() >= 4 + body_len {
                return match parse_client_hello(&handshake[4..4 + body_len]) {
                    Some(Ok(sni)) => Hello::ClientHello { sni },
                    Some(Err(why)) => Hello::Malformed(why),
                    None => Hello::Malformed("truncated client hello"),
                };
            }
        }
    }
}

/// `None` when a length runs past the end.
fn parse_client_hello(body: &[u8]) -> Option<Result<Option<String>, &'static str>> {
    let mut c = Cursor { buf: body };
    c.take(2)?; // legacy_version
    c.take(32)?; // random
    c.vec8()?; // legacy_session_id
    c.vec16()?; // cipher_suites
    c.vec8()?; // legacy_compression_methods
    if c.buf.is_empty() {
        return Some(Ok(None)); // no extensions at all (old clients)
    }
    let mut exts = Cursor { buf: c.vec16()? };
    if !c.buf.is_empty() {
        return Some(Err("bytes after the client hello extensions"));
    }
    let mut sni = None;
    while !exts.buf.is_empty() {
        let kind = exts.u16()?;
        let data = exts.vec16()?;
        if kind != 0 {
            continue;
        }
        if sni.is_some() {
            return Some(Err("duplicate server_name extension"));
        }
        let mut list = Cursor {
            buf: Cursor { buf: data }.vec16()?,
        };
        let mut name = None;
        while !list.buf.is_empty() {
            let name_type = list.u8()?;
            let value = list.vec16()?;
            if name_type != 0 {
                continue;
            }
            if name.is_some() {
                return Some(Err("several host names in server_name"));
            }
            if value.is_empty()
                || !value
                    .iter()
                    .all(|b| b.is_ascii_alphanumeric() || b"-._".contains(b))
            {
                return Some(Err("bad host name in server_name"));
            }
            let text = String::from_utf8_lossy(value).to_ascii_lowercase();
            name = Some(text.strip_suffix('.').unwrap_or(&text).to_string());
        }
        sni = Some(name);
    }
    Some(Ok(sni.flatten()))
}

/// A fatal `access_denied` alert (RFC 8446 §6.2), sent instead of an HTTP
/// 403 once the tunnel is open: the client is speaking TLS by then.
pub const ALERT_ACCESS_DENIED: &[u8] = &[0x15, 0x03, 0x03, 0x00, 0x02, 0x02, 0x31];

/// Builds a minimal ClientHello, for tests and the benchmark.
pub fn client_hello(sni: Option<&str>) -> Vec<u8> {
    let mut exts = Vec::new();
    if let Some(name) = sni {
        let n = name.as_bytes();
        let mut entry = vec![0u8];
        entry.extend_from_slice(&(n.len() as u16).to_be_bytes());
        entry.extend_from_slice(n);
        let mut data = (entry.len() as u16).to_be_bytes().to_vec();
        data.extend_from_slice(&entry);
        exts.extend_from_slice(&[0, 0]);
        exts.extend_from_slice(&(data.len() as u16).to_be_bytes());
        exts.extend_from_slice(&data);
    }
    // supported_versions: TLS 1.3, so the hello looks like a modern one.
    exts.extend_from_slice(&[0x00, 0x2b, 0x00, 0x03, 0x02, 0x03, 0x04]);
    let mut body = vec![0x03, 0x03];
    body.extend_from_slice(&[7u8; 32]);
    body.push(0);
    body.extend_from_slice(&[0x00, 0x02, 0x13, 0x01]);
    body.extend_from_slice(&[0x01, 0x00]);
    body.extend_from_slice(&(exts.len() as u16).to_be_bytes());
    body.extend_from_slice(&exts);
    let mut hs = vec![1u8];
    hs.extend_from_slice(&(body.len() as u32).to_be_bytes()[1..]);
    hs.extend_from_slice(&body);
    let mut rec = vec![0x16, 0x03, 0x01];
    rec.extend_from_slice(&(hs.len() as u16).to_be_bytes());
    rec.extend_from_slice(&hs);
    rec
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    #[test]
    fn sni_is_read() {
        assert_eq!(
            inspect(&client_hello(Some("Example.COM"))),
            Hello::ClientHello {
                sni: Some("example.com".into())
            }
        );
        assert_eq!(
            inspect(&client_hello(None)),
            Hello::ClientHello { sni: None }
        );
    }

    #[test]
    fn every_prefix_is_incomplete_never_a_verdict() {
        let hello = client_hello(Some("a.example"));
        for n in 1..hello.len() {
            assert_eq!(inspect(&hello[..n]), Hello::Incomplete, "{n}");
        }
    }

    #[test]
    fn hello_split_over_records_is_reassembled() {
        let hello = client_hello(Some("split.example"));
        let hs = &hello[5..];
        let (a, b) = hs.split_at(10);
        let mut two = Vec::new();
        for part in [a, b] {
            two.extend_from_slice(&[0x16, 0x03, 0x01]);
            two.extend_from_slice(&(part.len() as u16).to_be_bytes());
            two.extend_from_slice(part);
        }
        assert_eq!(
            inspect(&two),
            Hello::ClientHello {
                sni: Some("split.example".into())
            }
        );
    }

    #[test]
    fn non_tls_and_garbage() {
        assert_eq!(inspect(b"SSH-2.0-x\r\n"), Hello::NotTls);
        assert_eq!(inspect(b"GET / HTTP/1.1\r\n"), Hello::NotTls);
        assert!(matches!(
            inspect(&[0x16, 0x03, 0x01, 0, 0]),
            Hello::Malformed(_)
        ));
        let mut hello = client_hello(Some("a.b"));
        hello[5] = 2; // server hello
        assert!(matches!(inspect(&hello), Hello::Malformed(_)));
        // Fuzz-ish: flipping any byte never panics.
        let base = client_hello(Some("x.example"));
        for i in 0..base.len() {
            for v in [0u8, 0xff, 0x7f] {
                let mut b = base.clone();
                b[i] = v;
                let _ = inspect(&b);
            }
        }
    }

    #[test]
    fn duplicate_sni_is_malformed() {
        let one = client_hello(Some("a.b"));
        // Duplicate the server_name extension inside the extensions block.
        let ext = [0u8, 0, 0, 8, 0, 6, 0, 0, 3, b'c', b'.', b'd'];
        let mut body = one[9..].to_vec();
        let ext_len_at = 2 + 32 + 1 + 4 + 2;
        let old = usize::from(u16::from_be_bytes([body[ext_len_at], body[ext_len_at + 1]]));
        body[ext_len_at..ext_len_at + 2].copy_from_slice(&((old + ext.len()) as u16).to_be_bytes());
        body.extend_from_slice(&ext);
        let mut hs = vec![1u8];
        hs.extend_from_slice(&(body.len() as u32).to_be_bytes()[1..]);
        hs.extend_from_slice(&body);
        let mut rec = vec![0x16, 0x03, 0x01];
        rec.extend_from_slice(&(hs.len() as u16).to_be_bytes());
        rec.extend_from_slice(&hs);
        assert!(matches!(inspect(&rec), Hello::Malformed(_)));
    }
}
