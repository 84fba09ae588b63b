//! HTTP/1.1 for tests, loopback only by construction: a small server
//! ([`Stub`]) for tests that need an upstream behind mcpbox's proxy (fixed
//! routes, one request per connection, a record of every request line it
//! received), and a raw client ([`Conn`]) for the gateway's tests.

use std::collections::HashMap;
use std::io::{BufRead, BufReader, Read, Write};
use std::net::{TcpListener, TcpStream};
use std::sync::{Arc, Mutex};
use std::time::Duration;

/// One canned response.
#[derive(Clone)]
struct Route {
    content_type: String,
    body: Vec<u8>,
}

/// A running stub server; it lives until the test process ends.
#[derive(Clone)]
pub struct Stub {
    port: u16,
    routes: Arc<Mutex<HashMap<String, Route>>>,
    requests: Arc<Mutex<Vec<String>>>,
}

impl Stub {
    /// Binds 127.0.0.1 on a free port and starts answering: routes can be
    /// added afterwards (the port is often part of their bodies); any other
    /// path gets 404.
    pub fn start() -> Stub {
        let listener = TcpListener::bind("127.0.0.1:0").expect("bind 127.0.0.1");
        let stub = Stub {
            port: listener.local_addr().expect("local addr").port(),
            routes: Arc::default(),
            requests: Arc::default(),
        };
        let shared = stub.clone();
        std::thread::spawn(move || {
            for conn in listener.incoming() {
                let Ok(conn) = conn else { continue };
                let s = shared.clone();
                std::thread::spawn(move || s.answer(conn));
            }
        });
        stub
    }

    pub fn port(&self) -> u16 {
        self.port
    }

    /// Serves `body` at `path` (the request path, query included).
    pub fn route(&self, path: &str, content_type: &str, body: impl Into<Vec<u8>>) {
        self.routes.lock().unwrap().insert(
            path.to_string(),
            Route {
                content_type: content_type.to_string(),
                body: body.into(),
            },
        );
    }

    /// The request lines received so far (`GET /path HTTP/1.1`).
    pub fn requests(&self) -> Vec<String> {
        self.requests.lock().unwrap().clone()
    }

    fn answer(&self, mut conn: TcpStream) {
        let Ok(read_half) = conn.try_clone() else {
            return;
        };
        let mut reader = BufReader::new(read_half);
        let mut request_line = String::new();
        if reader.read_line(&mut request_line).unwrap_or(0) == 0 {
            return;
        }
        // Headers up to the blank line; GET requests carry no body.
        let mut line = String::new();
        while reader.read_line(&mut line).map(|n| n > 2).unwrap_or(false) {
            line.clear();
        }
        let request_line = request_line.trim_end().to_string();
        self.requests.lock().unwrap().push(request_line.clone());
        let path = request_line.split(' ').nth(1).unwrap_or("/");
        // A forwarding proxy may send the absolute form; route on the path.
        let path = match path.find("://") {
            Some(i) => path[i + 3..]
                .find('/')
                .map(|j| &path[i + 3 + j..])
                .unwrap_or("/"),
            None => path,
        };
        let route = self.routes.lock().unwrap().get(path).cloned();
        let (status, route) = match route {
            Some(r) => ("200 OK", r),
            None => (
                "404 Not Found",
                Route {
                    content_type: "text/plain".into(),
                    body: b"not found".to_vec(),
                },
            ),
        };
        let head = format!(
            "HTTP/1.1 {status}\r\nContent-Type: {}\r\nContent-Length: {}\r\nConnection: close\r\n\r\n",
            route.content_type,
            route.body.len()
        );
        let _ = conn.write_all(head.as_bytes());
        let _ = conn.write_all(&route.body);
        let _ = conn.flush();
    }
}

// ---------------------------------------------------------------------
// A client, for the gateway's tests: raw bytes on a `TcpStream`, so a test
// can send what no HTTP library would (a head one byte a second, a body
// that never ends, a lying Content-Length), and read status, headers and
// an event stream back.

/// A response: status, headers (names lowercase), the whole body (an
/// event stream's body too, read to its end).
#[derive(Debug)]
pub struct Response {
    pub status: u16,
    pub headers: Vec<(String, String)>,
    pub body: Vec<u8>,
}

impl Response {
    pub fn header(&self, name: &str) -> Option<&str> {
        self.headers
            .iter()
            .find(|(k, _)| k.eq_ignore_ascii_case(name))
            .map(|(_, v)| v.as_str())
    }

    pub fn text(&self) -> String {
        String::from_utf8_lossy(&self.body).into_owned()
    }

    /// The JSON-RPC messages: the body, or each `data:` of an event stream.
    pub fn messages(&self) -> Vec<serde_json::Value> {
        let parse =
            |s: &str| serde_json::from_str(s).unwrap_or_else(|e| panic!("not JSON ({e}): {s}"));
        if self
            .header("content-type")
            .is_some_and(|c| c.starts_with("text/event-stream"))
        {
            self.text()
                .lines()
                .filter_map(|l| l.strip_prefix("data:"))
                .map(|d| parse(d.trim()))
                .collect()
        } else if self.body.is_empty() {
            Vec::new()
        } else {
            vec![parse(&self.text())]
        }
    }

    /// The last message (a request's answer).
    pub fn json(&self) -> serde_json::Value {
        self.messages()
            .pop()
            .unwrap_or_else(|| panic!("no message in a {} response", self.status))
    }
}

/// One client connection.
pub struct Conn {
    reader: BufReader<TcpStream>,
    /// Buffered event-stream bytes not yet returned as an event.
    events: Vec<u8>,
    chunked: bool,
}

impl Conn {
    /// Connects to 127.0.0.1:`port`; reads time out after 20 s.
    pub fn open(port: u16) -> Conn {
        let s = TcpStream::connect(("127.0.0.1", port)).expect("connect to the gateway");
        s.set_read_timeout(Some(Duration::from_secs(20))).unwrap();
        Conn {
            reader: BufReader::new(s),
            events: Vec::new(),
            chunked: false,
        }
    }

    pub fn stream(&self) -> &TcpStream {
        self.reader.get_ref()
    }

    /// Writes `bytes` as they are.
    pub fn write(&mut self, bytes: &[u8]) -> std::io::Result<()> {
        let mut s = self.reader.get_ref();
        s.write_all(bytes)?;
        s.flush()
    }

    /// Reads a status line and headers.
    pub fn head(&mut self) -> std::io::Result<Response> {
        let mut line = String::new();
        if self.reader.read_line(&mut line)? == 0 {
            return Err(std::io::ErrorKind::UnexpectedEof.into());
        }
        let status = line
            .split(' ')
            .nth(1)
            .and_then(|s| s.parse().ok())
            .unwrap_or_else(|| panic!("not a status line: {line:?}"));
        let mut headers = Vec::new();
        loop {
            line.clear();
            self.reader.read_line(&mut line)?;
            let l = line.trim_end();
            if l.is_empty() {
                break;
            }
            if let Some((k, v)) = l.split_once(':') {
                headers.push((k.trim().to_ascii_lowercase(), v.trim().to_string()));
            }
        }
        let r = Response {
            status,
            headers,
            body: Vec::new(),
        };
        self.chunked = r
            .header("transfer-encoding")
            .is_some_and(|t| t.eq_ignore_ascii_case("chunked"));
        Ok(r)
    }

    /// Reads one chunk of a chunked body; `None` at its end.
    fn chunk(&mut self) -> std::io::Result<Option<Vec<u8>>> {
        let mut line = String::new();
        if self.reader.read_line(&mut line)? == 0 {
            return Err(std::io::ErrorKind::UnexpectedEof.into());
        }
        let size = usize::from_str_radix(line.trim().split(';').next().unwrap_or(""), 16)
            .map_err(|_| std::io::Error::other(format!("bad chunk size {line:?}")))?;
        let mut data = vec![0; size];
        self.reader.read_exact(&mut data)?;
        let mut crlf = [0; 2];
        self.reader.read_exact(&mut crlf)?;
        Ok((size > 0).then_some(data))
    }

    /// Reads a whole response.
    pub fn response(&mut self) -> std::io::Result<Response> {
        let mut r = self.head()?;
        if self.chunked {
            while let Some(c) = self.chunk()? {
                r.body.extend_from_slice(&c);
            }
        } else if let Some(n) = r.header("content-length").and_then(|n| n.parse().ok()) {
            let mut body = vec![0; n];
            self.reader.read_exact(&mut body)?;
            r.body = body;
        }
        Ok(r)
    }

    /// The next event's `data` on an event stream (comments skipped);
    /// `None` when the stream ended.
    pub fn event(&mut self) -> std::io::Result<Option<serde_json::Value>> {
        loop {
            if let Some(end) = self.events.windows(2).position(|w| w == b"\n\n") {
                let event: Vec<u8> = self.events.drain(..end + 2).collect();
                let text = String::from_utf8_lossy(&event);
                let data: String = text
                    .lines()
                    .filter_map(|l| l.strip_prefix("data:"))
                    .map(str::trim)
                    .collect();
                if data.is_empty() {
                    continue;
                }
                return serde_json::from_str(&data)
                    .map(Some)
                    .map_err(std::io::Error::other);
            }
            let more = if self.chunked {
                self.chunk()?
            } else {
                let mut buf = vec![0; 4096];
                let n = self.reader.read(&mut buf)?;
                buf.truncate(n);
                (n > 0).then_some(buf)
            };
            match more {
                Some(b) => self.events.extend_from_slice(&b),
                None => return Ok(None),
            }
        }
    }

    /// Whether the peer closed the connection (EOF or reset) within `d`.
    pub fn closed_within(&mut self, d: Duration) -> bool {
        self.reader.get_ref().set_read_timeout(Some(d)).unwrap();
        let mut buf = [0; 1024];
        let deadline = std::time::Instant::now() + d;
        loop {
            match self.reader.read(&mut buf) {
                Ok(0) => return true,
                // a 408 or the like before the close is fine
                Ok(_) if std::time::Instant::now() < deadline => continue,
                Ok(_) => return false,
                Err(e) => {
                    return !matches!(
                        e.kind(),
                        std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut
                    )
                }
            }
        }
    }
}

/// A request's bytes: `method path`, `headers` as given, `Content-Length`
/// for a body, and `Connection: close` unless the headers say otherwise.
pub fn request_bytes(method: &str, path: &str, headers: &[(&str, &str)], body: &[u8]) -> Vec<u8> {
    let mut out = format!("{method} {path} HTTP/1.1\r\n");
    for (k, v) in headers {
        out.push_str(&format!("{k}: {v}\r\n"));
    }
    if !headers
        .iter()
        .any(|(k, _)| k.eq_ignore_ascii_case("connection"))
    {
        out.push_str("Connection: close\r\n");
    }
    let chunked = headers
        .iter()
        .any(|(k, _)| k.eq_ignore_ascii_case("transfer-encoding"));
    if !body.is_empty() && !chunked {
        out.push_str(&format!("Content-Length: {}\r\n", body.len()));
    }
    out.push_str("\r\n");
    let mut out = out.into_bytes();
    out.extend_from_slice(body);
    out
}

/// Sends one request on a fresh connection and reads its response.
pub fn send(
    port: u16,
    method: &str,
    path: &str,
    headers: &[(&str, &str)],
    body: &[u8],
) -> Response {
    let mut c = Conn::open(port);
    c.write(&request_bytes(method, path, headers, body))
        .expect("send the request");
    c.response().expect("read the response")
}
