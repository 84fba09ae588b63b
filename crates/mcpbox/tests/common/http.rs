//! A small HTTP/1.1 server on 127.0.0.1 for tests that need an upstream
//! behind mcpbox's proxy: fixed routes, one request per connection, and a
//! record of every request line it received. Loopback only, by
//! construction.

use std::collections::HashMap;
use std::io::{BufRead, BufReader, Write};
use std::net::{TcpListener, TcpStream};
use std::sync::{Arc, Mutex};

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
