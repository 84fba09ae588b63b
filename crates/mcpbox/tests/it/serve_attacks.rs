//! `mcpbox serve` attacked through the real binary over raw HTTP/1.1: one
//! gateway per test (its own tempdir, state and port), test servers from
//! crates/testservers in their sandboxes. Each test is named after the
//! attack it tries and fails if the defence it names is taken away.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use crate::common;

use std::time::{Duration, Instant};

use common::http::{self, Conn};
use common::serve::{text_of, Gateway, Server, ALICE, BOB, CAROL};
use serde_json::{json, Value};

/// `plain` with `add` denied.
fn plain() -> Server<'static> {
    Server::test("plain", "plain", "[tools]\n\"add\" = \"deny\"\n")
}

fn gateway(limits: &str) -> Gateway {
    Gateway::start(limits, &[plain()])
}

/// A tools/call of `echo` on a fresh session of alice's works.
#[track_caller]
fn gateway_still_serves(gw: &Gateway) {
    let mut m = gw.mcp("plain", Some(ALICE));
    m.initialize();
    let r = m.call("echo", json!({"text": "still here"}));
    assert_eq!(text_of(&r), "still here", "{r}");
}

fn error_code(r: &http::Response) -> Value {
    r.json()["error"]["code"].clone()
}

fn access_records(events: &[Value]) -> Vec<&Value> {
    events.iter().filter(|e| e["kind"] == "access").collect()
}

#[test]
fn request_without_a_token_is_401_with_a_bearer_challenge() {
    let gw = gateway("");
    let m = gw.mcp("plain", None);
    let r = m.post(&json!({"jsonrpc": "2.0", "id": 1, "method": "ping"}));
    assert_eq!(r.status, 401, "{}", r.text());
    let challenge = r.header("www-authenticate").unwrap_or_default();
    assert!(challenge.starts_with("Bearer "), "{r:?}");
}

#[test]
fn a_client_without_a_token_cannot_keep_its_connection_open() {
    let gw = gateway("");
    let m = gw.mcp("plain", None);
    let body = serde_json::to_vec(&json!({"jsonrpc": "2.0", "id": 1, "method": "ping"})).unwrap();
    let wrong = format!("Bearer {ALICE}x");
    for auth in [None, Some(wrong.as_str())] {
        let head = m.bytes_with(&body, |h| {
            h.push(("Connection".into(), "keep-alive".into()));
            if let Some(a) = auth {
                h.push(("Authorization".into(), a.into()));
            }
        });
        let mut c = Conn::open(gw.port);
        c.write(&head).unwrap();
        let r = c.response().unwrap();
        assert_eq!(r.status, 401, "{auth:?}: {}", r.text());
        assert_eq!(r.header("connection"), Some("close"), "{auth:?}: {r:?}");
        assert!(
            c.closed_within(Duration::from_secs(5)),
            "{auth:?}: the connection of a refused request stayed open"
        );
    }
    gateway_still_serves(&gw);
}

#[test]
fn request_with_a_wrong_token_is_401() {
    let gw = gateway("");
    for bad in [
        format!("{ALICE}x"),
        ALICE[..ALICE.len() - 1].to_string(),
        "".into(),
    ] {
        let m = gw.mcp("plain", Some(&bad));
        let r = m.post(&json!({"jsonrpc": "2.0", "id": 1, "method": "ping"}));
        assert_eq!(r.status, 401, "token {bad:?}: {}", r.text());
    }
    // not a bearer token at all
    let m = gw.mcp("plain", None);
    let r = m.send_with("POST", b"{}", |h| {
        h.push(("Authorization".into(), format!("Basic {ALICE}")))
    });
    assert_eq!(r.status, 401, "{}", r.text());
}

#[test]
fn client_without_the_right_to_a_server_is_403_and_audited() {
    let gw = gateway("");
    let mut m = gw.mcp("plain", Some(CAROL));
    let msg = m.message("initialize", json!({"protocolVersion": "2025-11-25", "capabilities": {}, "clientInfo": {"name": "c", "version": "0"}}));
    let r = m.post(&msg);
    assert_eq!(r.status, 403, "{}", r.text());
    assert!(r.header("mcp-session-id").is_none());
    let events = gw.audit_until("access for carol", |e| {
        e["kind"] == "access" && e["caller"] == "carol"
    });
    let rec = access_records(&events)[0];
    assert_eq!(rec["server"], "plain", "{rec}");
    assert_eq!(rec["decision"], "deny", "{rec}");
    // carol may still use the server she has a right to
    let mut ok = gw.mcp("other", Some(CAROL));
    ok.initialize();
}

#[test]
fn another_clients_session_id_is_404_audited_and_the_owner_keeps_it() {
    let gw = gateway("");
    let mut alice = gw.mcp("plain", Some(ALICE));
    alice.initialize();
    let mut bob = gw.mcp("plain", Some(BOB));
    bob.session = alice.session.clone();
    let call = bob.message(
        "tools/call",
        json!({"name": "echo", "arguments": {"text": "stolen"}}),
    );
    let r = bob.post(&call);
    assert_eq!(r.status, 404, "{}", r.text());
    assert_eq!(error_code(&r), -32001, "{}", r.text());
    // GET and DELETE with it fail alike, and do not end alice's session
    let (_c, head) = bob.open_stream();
    assert_eq!(head.status, 404);
    let d = bob.send_with("DELETE", b"", |_| {});
    assert_eq!(d.status, 404, "{}", d.text());
    let events = gw.audit_until("access for bob", |e| {
        e["kind"] == "access" && e["caller"] == "bob"
    });
    let rec = access_records(&events)[0];
    assert_eq!(rec["reason"], "http.session_unknown", "{rec}");
    assert_eq!(rec["detail"]["session_of_other_client"], true, "{rec}");
    // the server never saw bob's call, and alice's session still works
    let r = alice.call("history", json!({}));
    assert!(!text_of(&r).contains("stolen"), "{r}");
    let r = alice.call("echo", json!({"text": "mine"}));
    assert_eq!(text_of(&r), "mine", "{r}");
}

#[test]
fn made_up_session_id_is_404() {
    let gw = gateway("");
    let mut m = gw.mcp("plain", Some(ALICE));
    m.session = Some("00000000000000000000000000000000".into());
    let msg = m.message("tools/list", json!({}));
    let r = m.post(&msg);
    assert_eq!(r.status, 404, "{}", r.text());
    assert_eq!(error_code(&r), -32001);
    // without any id: 400, not a new session
    m.session = None;
    let r = m.post(&msg);
    assert_eq!(r.status, 400, "{}", r.text());
}

#[test]
fn foreign_origin_is_403_and_the_gateways_own_origin_accepted() {
    let gw = gateway("");
    let mut m = gw.mcp("plain", Some(ALICE));
    m.initialize();
    let ping = m.message("ping", json!({}));
    let with_origin = |o: &str| {
        m.send_with("POST", ping.to_string().as_bytes(), |h| {
            h.push(("Origin".into(), o.into()))
        })
    };
    for evil in ["http://evil.example", "null", "https://127.0.0.1"] {
        let r = with_origin(evil);
        assert_eq!(r.status, 403, "{evil}: {}", r.text());
        assert_eq!(r.json()["error"]["data"]["reason"], "http.origin_refused");
    }
    let own = format!("http://127.0.0.1:{}", gw.port);
    let r = with_origin(&own);
    assert_eq!(r.status, 200, "{own}: {}", r.text());
    let r = with_origin(&format!("http://localhost:{}", gw.port));
    assert_eq!(r.status, 200, "{}", r.text());
}

#[test]
fn rebinding_host_is_403() {
    let gw = gateway("");
    let mut m = gw.mcp("plain", Some(ALICE));
    m.initialize();
    let ping = m.message("ping", json!({}));
    for host in [
        format!("evil.example:{}", gw.port),
        "evil.example".to_string(),
        "127.0.0.1:1".to_string(),
    ] {
        let r = m.send_with("POST", ping.to_string().as_bytes(), |h| {
            h.iter_mut()
                .filter(|(k, _)| k == "Host")
                .for_each(|(_, v)| *v = host.clone())
        });
        assert_eq!(r.status, 403, "{host}: {}", r.text());
        assert_eq!(r.json()["error"]["data"]["reason"], "http.host_refused");
    }
    // the token is not even looked at: a rebinding page gets 403 without one
    let r = http::send(
        gw.port,
        "POST",
        "/servers/plain/mcp",
        &[("Host", &format!("evil.example:{}", gw.port))],
        b"{}",
    );
    assert_eq!(r.status, 403, "{}", r.text());
    let r = m.post(&ping);
    assert_eq!(r.status, 200, "{}", r.text());
}

const SMALL_BODY: &str = "max_body = \"2KiB\"\n";

#[test]
fn oversized_body_with_content_length_is_413() {
    let gw = gateway(SMALL_BODY);
    let mut m = gw.mcp("plain", Some(ALICE));
    m.initialize();
    let big = m.message(
        "tools/call",
        json!({"name": "echo", "arguments": {"text": "x".repeat(4096)}}),
    );
    let r = m.post(&big);
    assert_eq!(r.status, 413, "{}", r.text());
    // a Content-Length that claims more than the limit is refused before
    // any body is read
    let mut c = Conn::open(gw.port);
    let head = m.bytes_with(b"", |h| {
        h.push(("Content-Length".into(), "1000000000".into()))
    });
    c.write(&head).unwrap();
    let r = c.response().unwrap();
    assert_eq!(r.status, 413, "{}", r.text());
    let r = m.call("echo", json!({"text": "small"}));
    assert_eq!(text_of(&r), "small");
}

#[test]
fn oversized_chunked_body_is_413() {
    let gw = gateway(SMALL_BODY);
    let mut m = gw.mcp("plain", Some(ALICE));
    m.initialize();
    let big = m
        .message(
            "tools/call",
            json!({"name": "echo", "arguments": {"text": "x".repeat(4096)}}),
        )
        .to_string();
    let mut body = Vec::new();
    for piece in big.as_bytes().chunks(500) {
        body.extend_from_slice(format!("{:x}\r\n", piece.len()).as_bytes());
        body.extend_from_slice(piece);
        body.extend_from_slice(b"\r\n");
    }
    body.extend_from_slice(b"0\r\n\r\n");
    let r = m.send_with("POST", &body, |h| {
        h.push(("Transfer-Encoding".into(), "chunked".into()))
    });
    assert_eq!(r.status, 413, "{}", r.text());
    // an endless chunked body is cut off at the limit too
    let mut c = Conn::open(gw.port);
    c.write(&m.bytes_with(b"", |h| {
        h.push(("Transfer-Encoding".into(), "chunked".into()))
    }))
    .unwrap();
    let chunk = format!("400\r\n{}\r\n", "y".repeat(0x400));
    for _ in 0..8 {
        if c.write(chunk.as_bytes()).is_err() {
            break;
        }
    }
    let r = c.response().unwrap();
    assert_eq!(r.status, 413, "{}", r.text());
    let r = m.call("echo", json!({"text": "small"}));
    assert_eq!(text_of(&r), "small");
}

const SLOW: &str = "header_timeout = \"1s\"\nbody_timeout = \"1s\"\n";

#[test]
fn slowloris_head_is_cut_off_after_header_timeout_while_others_are_served() {
    let gw = gateway(SLOW);
    let m = gw.mcp("plain", Some(ALICE));
    let head = m.bytes_with(b"{}", |_| {});
    let mut c = Conn::open(gw.port);
    let mut writer = c.stream().try_clone().unwrap();
    let started = Instant::now();
    let dripping = std::thread::spawn(move || {
        use std::io::Write;
        for b in head {
            if writer.write_all(&[b]).is_err() {
                return;
            }
            std::thread::sleep(Duration::from_secs(1));
        }
    });
    // meanwhile other clients are served
    gateway_still_serves(&gw);
    assert!(
        c.closed_within(Duration::from_secs(8)),
        "a head sent one byte a second was not cut off"
    );
    let took = started.elapsed();
    assert!(took < Duration::from_secs(8), "closed after {took:?}");
    drop(c);
    drop(dripping);
    gateway_still_serves(&gw);
}

#[test]
fn slow_body_is_408_after_body_timeout() {
    let gw = gateway(SLOW);
    let mut m = gw.mcp("plain", Some(ALICE));
    m.initialize();
    let msg = m.message(
        "tools/call",
        json!({"name": "echo", "arguments": {"text": "slow"}}),
    );
    let body = msg.to_string();
    let mut c = Conn::open(gw.port);
    let all = m.bytes_with(body.as_bytes(), |_| {});
    // the head and the first 10 bytes of the body, then nothing
    let head_len = all.len() - body.len();
    c.write(&all[..head_len + 10]).unwrap();
    let started = Instant::now();
    let r = c.response().expect("an answer to the slow body");
    assert_eq!(r.status, 408, "{}", r.text());
    assert!(started.elapsed() < Duration::from_secs(8));
    let r = m.call("echo", json!({"text": "fast"}));
    assert_eq!(text_of(&r), "fast");
}

#[test]
fn a_thousand_open_event_streams_do_not_stop_calls_and_the_cap_is_429() {
    const STREAMS: usize = 1000;
    common::raise_fd_limit();
    let gw = gateway(&format!(
        "rate_per_second = 100000\nburst = 100000\nmax_streams_per_client = {STREAMS}\n"
    ));
    let gw = std::sync::Arc::new(gw);
    // eight sessions (eight sandboxes), 125 streams on each
    let threads = 8;
    let per = STREAMS / threads;
    let open: Vec<_> = (0..threads)
        .map(|_| {
            let gw = gw.clone();
            std::thread::spawn(move || {
                let mut m = gw.mcp("plain", Some(ALICE));
                m.initialize();
                (0..per)
                    .map(|_| {
                        let (c, head) = m.open_stream();
                        assert_eq!(head.status, 200, "{head:?}");
                        assert_eq!(head.header("content-type"), Some("text/event-stream"));
                        c
                    })
                    .collect::<Vec<Conn>>()
            })
        })
        .collect();
    // calls are answered while the streams are being opened ...
    let mut m = gw.mcp("plain", Some(ALICE));
    m.initialize();
    for i in 0..20 {
        let r = m.call("echo", json!({"text": format!("during {i}")}));
        assert_eq!(text_of(&r), format!("during {i}"), "{r}");
    }
    let streams: Vec<Conn> = open
        .into_iter()
        .flat_map(|t| {
            t.join().unwrap_or_else(|_| {
                let log = gw.stderr();
                let tail: Vec<&str> = log.lines().rev().take(20).collect();
                panic!("opening streams failed; the gateway's last lines:\n{tail:#?}")
            })
        })
        .collect();
    assert_eq!(streams.len(), STREAMS);
    // ... and once all are open
    let started = Instant::now();
    for i in 0..20 {
        let r = m.call("echo", json!({"text": format!("after {i}")}));
        assert_eq!(text_of(&r), format!("after {i}"), "{r}");
    }
    eprintln!(
        "20 calls with {STREAMS} streams open: {:?}",
        started.elapsed()
    );
    // one stream past the cap: 429
    let (_c, head) = m.open_stream();
    assert_eq!(head.status, 429, "{head:?}");
    // and a closed stream gives its place back
    drop(streams);
    let until = Instant::now() + Duration::from_secs(10);
    loop {
        let (_c, head) = m.open_stream();
        if head.status == 200 {
            break;
        }
        assert!(Instant::now() < until, "closed streams kept their places");
        std::thread::sleep(Duration::from_millis(100));
    }
}

#[test]
fn body_that_is_not_json_is_400_parse_error() {
    let gw = gateway("");
    let mut m = gw.mcp("plain", Some(ALICE));
    m.initialize();
    for body in [
        &b"{\"jsonrpc\": \"2.0\", \"id\": 1,"[..],
        b"\xff\xfe",
        b"hello",
    ] {
        let r = m.send_with("POST", body, |_| {});
        assert_eq!(r.status, 400, "{}", r.text());
        assert_eq!(error_code(&r), -32700, "{}", r.text());
    }
    let r = m.call("echo", json!({"text": "after"}));
    assert_eq!(text_of(&r), "after");
}

#[test]
fn json_rpc_batch_is_400_invalid_request() {
    let gw = gateway("");
    let mut m = gw.mcp("plain", Some(ALICE));
    m.initialize();
    let batch = json!([
        {"jsonrpc": "2.0", "id": 1, "method": "tools/call", "params": {"name": "add", "arguments": {"a": 1, "b": 2}}},
        {"jsonrpc": "2.0", "id": 2, "method": "ping"}
    ]);
    let r = m.post(&batch);
    assert_eq!(r.status, 400, "{}", r.text());
    assert_eq!(error_code(&r), -32600, "{}", r.text());
    let h = m.call("history", json!({}));
    assert!(!text_of(&h).contains("add"), "{h}");
}

#[test]
fn wrong_content_type_is_415() {
    let gw = gateway("");
    let mut m = gw.mcp("plain", Some(ALICE));
    m.initialize();
    let ping = m.message("ping", json!({})).to_string();
    for ct in [
        "text/plain",
        "application/x-www-form-urlencoded",
        "application/jsonx",
    ] {
        let r = m.send_with("POST", ping.as_bytes(), |h| {
            h.iter_mut()
                .filter(|(k, _)| k == "Content-Type")
                .for_each(|(_, v)| *v = ct.into())
        });
        assert_eq!(r.status, 415, "{ct}: {}", r.text());
    }
    let r = m.send_with("POST", ping.as_bytes(), |h| {
        h.retain(|(k, _)| k != "Content-Type")
    });
    assert_eq!(r.status, 415, "{}", r.text());
    let r = m.call("echo", json!({"text": "after"}));
    assert_eq!(text_of(&r), "after");
}

#[test]
fn accept_without_event_stream_is_406() {
    let gw = gateway("");
    let mut m = gw.mcp("plain", Some(ALICE));
    m.initialize();
    let ping = m.message("ping", json!({})).to_string();
    for accept in ["application/json", "text/html"] {
        let r = m.send_with("POST", ping.as_bytes(), |h| {
            h.iter_mut()
                .filter(|(k, _)| k == "Accept")
                .for_each(|(_, v)| *v = accept.into())
        });
        assert_eq!(r.status, 406, "{accept}: {}", r.text());
    }
    let r = m.call("echo", json!({"text": "after"}));
    assert_eq!(text_of(&r), "after");
}

#[test]
fn unknown_protocol_version_is_400() {
    let gw = gateway("");
    let mut m = gw.mcp("plain", Some(ALICE));
    m.initialize();
    let ping = m.message("ping", json!({})).to_string();
    for v in ["1999-01-01", "2025-11-25x", ""] {
        let r = m.send_with("POST", ping.as_bytes(), |h| {
            h.iter_mut()
                .filter(|(k, _)| k == "MCP-Protocol-Version")
                .for_each(|(_, val)| *val = v.into())
        });
        assert_eq!(r.status, 400, "{v:?}: {}", r.text());
        assert_eq!(r.json()["error"]["data"]["reason"], "http.protocol_version");
    }
    let r = m.call("echo", json!({"text": "after"}));
    assert_eq!(text_of(&r), "after");
}

#[test]
fn pretty_printed_body_reaches_the_server_as_one_message_and_a_denied_tool_stays_denied() {
    let gw = gateway("");
    let mut m = gw.mcp("plain", Some(ALICE));
    m.initialize();
    let echo = m.message(
        "tools/call",
        json!({"name": "echo", "arguments": {"text": "multi\nline"}}),
    );
    let r = m.send_with(
        "POST",
        serde_json::to_string_pretty(&echo).unwrap().as_bytes(),
        |_| {},
    );
    assert_eq!(r.status, 200, "{}", r.text());
    assert_eq!(r.json()["id"], echo["id"]);
    assert_eq!(text_of(&r.json()), "multi\nline");
    // the denied tool, spread over lines and with CRLFs, is still denied
    let add = m.message(
        "tools/call",
        json!({"name": "add", "arguments": {"a": 1, "b": 2}}),
    );
    let pretty = serde_json::to_string_pretty(&add)
        .unwrap()
        .replace('\n', "\r\n");
    let r = m.send_with("POST", pretty.as_bytes(), |_| {});
    assert_eq!(r.status, 200, "{}", r.text());
    let answer = r.json();
    assert_eq!(answer["result"]["isError"], true, "{answer}");
    assert!(!text_of(&answer).contains('3'), "{answer}");
    let h = m.call("history", json!({}));
    let calls = h["result"]["structuredContent"]["calls"]
        .as_array()
        .cloned()
        .unwrap();
    let names: Vec<&str> = calls.iter().filter_map(|c| c["name"].as_str()).collect();
    assert_eq!(names, ["echo"], "{h}");
}

#[test]
fn burst_past_the_rate_limit_is_429_with_retry_after() {
    let gw = gateway("rate_per_second = 1\nburst = 5\n");
    let m = gw.mcp("plain", Some(ALICE));
    let ping = json!({"jsonrpc": "2.0", "id": 1, "method": "ping"});
    let statuses: Vec<http::Response> = (0..12).map(|_| m.post(&ping)).collect();
    let limited: Vec<&http::Response> = statuses.iter().filter(|r| r.status == 429).collect();
    assert!(
        limited.len() >= 5,
        "{:?}",
        statuses.iter().map(|r| r.status).collect::<Vec<_>>()
    );
    for r in limited {
        let after: u64 = r
            .header("retry-after")
            .unwrap_or("")
            .parse()
            .expect("Retry-After in seconds");
        assert!(after >= 1, "{r:?}");
        assert_eq!(r.json()["error"]["data"]["reason"], "http.rate_limited");
    }
    // one client's burst does not limit another
    let b = gw.mcp("plain", Some(BOB));
    assert_ne!(b.post(&ping).status, 429);
}

#[test]
fn duplicate_request_id_in_flight_is_400() {
    let gw = gateway("");
    let mut m = gw.mcp("plain", Some(ALICE));
    m.initialize();
    let slow = json!({"jsonrpc": "2.0", "id": 77, "method": "tools/call", "params": {"name": "sleep", "arguments": {"ms": 1500}}});
    let first = {
        let (port, path, headers) = (m.port, m.path.clone(), m.headers());
        let body = slow.to_string();
        std::thread::spawn(move || {
            let h: Vec<(&str, &str)> = headers
                .iter()
                .map(|(k, v)| (k.as_str(), v.as_str()))
                .collect();
            http::send(port, "POST", &path, &h, body.as_bytes())
        })
    };
    std::thread::sleep(Duration::from_millis(400));
    let dup = json!({"jsonrpc": "2.0", "id": 77, "method": "tools/call", "params": {"name": "echo", "arguments": {"text": "dup"}}});
    let r = m.post(&dup);
    assert_eq!(r.status, 400, "{}", r.text());
    assert_eq!(r.json()["error"]["data"]["reason"], "http.duplicate_id");
    let r = first.join().unwrap();
    assert_eq!(r.status, 200);
    assert_eq!(text_of(&r.json()), "slept", "{}", r.text());
    // the duplicate never reached the server; the id is free again
    let h = m.call("history", json!({}));
    assert!(!text_of(&h).contains("dup"), "{h}");
    let again = m.post(&dup);
    assert_eq!(text_of(&again.json()), "dup");
}

#[test]
fn clients_workspaces_are_isolated() {
    let gw = Gateway::start(
        "",
        &[Server::test(
            "plain",
            "plain",
            "[filesystem]\noutput = \"output\"\n",
        )],
    );
    let mut a = gw.mcp("plain", Some(ALICE));
    a.initialize();
    let mut b = gw.mcp("plain", Some(BOB));
    b.initialize();
    let r = a.call(
        "write_file",
        json!({"path": "/workspace/output/alice.txt", "text": "alice's"}),
    );
    assert!(text_of(&r).starts_with("wrote"), "{r}");
    let r = b.call(
        "write_file",
        json!({"path": "/workspace/output/bob.txt", "text": "bob's"}),
    );
    assert!(text_of(&r).starts_with("wrote"), "{r}");
    // each client's sandbox has a workspace of its own
    let sandboxes = gw.cli_json(&["sandboxes", "list"]);
    let of = |c: &str| {
        let sb = sandboxes
            .as_array()
            .unwrap()
            .iter()
            .find(|s| s["agent"] == c)
            .unwrap_or_else(|| panic!("no sandbox of {c}: {sandboxes}"));
        let ws = std::path::PathBuf::from(sb["workspace"].as_str().unwrap());
        common::serve::files_under(&ws.join("volume/output"))
    };
    let names = |c: &str| -> Vec<String> {
        of(c)
            .iter()
            .map(|p| p.file_name().unwrap().to_string_lossy().into_owned())
            .collect()
    };
    assert_eq!(names("alice"), ["alice.txt"]);
    assert_eq!(names("bob"), ["bob.txt"]);
    assert_eq!(std::fs::read_to_string(&of("alice")[0]).unwrap(), "alice's");
    // nothing landed in the policy's own output directory either
    assert!(common::serve::files_under(&gw.dir.path().join("output")).is_empty());
}

#[test]
fn server_crash_mid_call_is_an_error_then_404_then_a_new_session_works() {
    let gw = Gateway::start("", &[Server::test("crasher", "crasher", "")]);
    let mut m = gw.mcp("crasher", Some(ALICE));
    m.initialize();
    let crash = m.message("tools/call", json!({"name": "crash", "arguments": {}}));
    let first = {
        let (port, path, headers) = (m.port, m.path.clone(), m.headers());
        let body = crash.to_string();
        std::thread::spawn(move || {
            let h: Vec<(&str, &str)> = headers
                .iter()
                .map(|(k, v)| (k.as_str(), v.as_str()))
                .collect();
            http::send(port, "POST", &path, &h, body.as_bytes())
        })
    };
    std::thread::sleep(Duration::from_millis(300));
    // the crasher dies once a second request arrives
    let echo = m.message("tools/call", json!({"name": "echo", "arguments": {}}));
    let second = m.post(&echo);
    let first = first.join().unwrap();
    for r in [&first, &second] {
        assert_eq!(r.status, 200, "{}", r.text());
        let answer = r.json();
        assert!(
            answer["error"]["code"].is_i64(),
            "not a JSON-RPC error: {answer}"
        );
    }
    // the session is gone
    let until = Instant::now() + Duration::from_secs(10);
    loop {
        let next = m.message("tools/list", json!({}));
        let r = m.post(&next);
        if r.status == 404 {
            break;
        }
        assert!(
            Instant::now() < until,
            "session still there: {} {}",
            r.status,
            r.text()
        );
        std::thread::sleep(Duration::from_millis(100));
    }
    let mut fresh = gw.mcp("crasher", Some(ALICE));
    fresh.initialize();
    let r = fresh.call("echo", json!({}));
    assert_eq!(text_of(&r), "ok", "{r}");
}

#[test]
fn sigterm_answers_the_call_in_flight_exits_0_and_audits_the_session_end() {
    let mut gw = gateway("");
    let mut m = gw.mcp("plain", Some(ALICE));
    m.initialize();
    let slow = m.message(
        "tools/call",
        json!({"name": "sleep", "arguments": {"ms": 1500}}),
    );
    let first = {
        let (port, path, headers) = (m.port, m.path.clone(), m.headers());
        let body = slow.to_string();
        std::thread::spawn(move || {
            let h: Vec<(&str, &str)> = headers
                .iter()
                .map(|(k, v)| (k.as_str(), v.as_str()))
                .collect();
            http::send(port, "POST", &path, &h, body.as_bytes())
        })
    };
    std::thread::sleep(Duration::from_millis(400));
    gw.sigterm();
    let r = first.join().unwrap();
    assert_eq!(r.status, 200, "{}", r.text());
    assert_eq!(text_of(&r.json()), "slept", "{}", r.text());
    let status = gw.wait(Duration::from_secs(20));
    assert_eq!(status.code(), Some(0), "stderr:\n{}", gw.stderr());
    let events = gw.audit();
    assert!(
        events
            .iter()
            .any(|e| e["kind"] == "session_end" && e["caller"] == "alice"),
        "no session_end for alice:\n{}",
        events
            .iter()
            .map(Value::to_string)
            .collect::<Vec<_>>()
            .join("\n")
    );
}

#[test]
fn metrics_without_a_token_are_401_and_with_one_count_requests_sessions_and_denials() {
    let gw = Gateway::start(
        "",
        &[Server::test("plain", "plain", "[tools]\nadd = \"deny\"\n")],
    );
    let host = gw.host();
    let r = http::send(gw.port, "GET", "/metrics", &[("Host", &host)], b"");
    assert_eq!(r.status, 401, "{}", r.text());
    let mut m = gw.mcp("plain", Some(ALICE));
    m.initialize();
    m.call("add", json!({"a": 1, "b": 2}));
    let bad = gw.mcp("plain", Some("not-a-token"));
    assert_eq!(
        bad.post(&json!({"jsonrpc": "2.0", "id": 1, "method": "ping"}))
            .status,
        401
    );
    let auth = format!("Bearer {ALICE}");
    // the denial is counted as its audit record is written, just after the
    // answer: ask again for a few seconds at most
    let until = Instant::now() + Duration::from_secs(5);
    let text = loop {
        let r = http::send(
            gw.port,
            "GET",
            "/metrics",
            &[("Host", &host), ("Authorization", &auth)],
            b"",
        );
        assert_eq!(r.status, 200, "{}", r.text());
        let text = r.text();
        if text.contains("mcpbox_denials_total{kind=\"tool_call\"} 1") || Instant::now() > until {
            break text;
        }
        std::thread::sleep(Duration::from_millis(50));
    };
    for want in [
        "mcpbox_http_requests_total{method=\"POST\",status=\"200\"}",
        "mcpbox_http_request_duration_seconds_bucket{le=\"+Inf\"}",
        "mcpbox_sessions 1",
        "mcpbox_denials_total{kind=\"http\",reason=\"http.token_invalid\"}",
        "mcpbox_denials_total{kind=\"tool_call\"} 1",
    ] {
        assert!(text.contains(want), "no {want} in:\n{text}");
    }
    assert!(!text.contains(ALICE), "a token in the metrics");
}

#[test]
fn healthz_answers_without_a_token_and_nothing_else_does() {
    let gw = gateway("");
    let host = gw.host();
    let r = http::send(gw.port, "GET", "/healthz", &[("Host", &host)], b"");
    assert_eq!((r.status, r.text().trim()), (200, "ok"));
    let r = http::send(
        gw.port,
        "GET",
        "/servers/plain/mcp",
        &[("Host", &host)],
        b"",
    );
    assert_eq!(r.status, 401, "{}", r.text());
}

/// `mcpbox serve` on `files` must refuse to start: its exit status is not
/// 0 and its stderr holds `want`. (Killed after 30 s: a gateway that
/// started would otherwise serve forever.)
fn refuses_to_start(files: &[(&str, String)], env: &[(&str, &str)], want: &str) {
    let dir = tempfile::tempdir().unwrap();
    for (name, text) in files {
        std::fs::write(dir.path().join(name), text).unwrap();
    }
    let mut cmd = std::process::Command::new(common::mcpbox());
    cmd.arg("serve")
        .arg("--config")
        .arg(dir.path().join("serve.toml"))
        .env("MCPBOX_STATE_DIR", dir.path().join("state"))
        .stdin(std::process::Stdio::null())
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::piped());
    for (k, v) in env {
        cmd.env(k, v);
    }
    let mut child = cmd.spawn().unwrap();
    let until = Instant::now() + Duration::from_secs(30);
    let status = loop {
        if let Some(s) = child.try_wait().unwrap() {
            break s;
        }
        if Instant::now() > until {
            let _ = child.kill();
            let _ = child.wait();
            panic!("mcpbox serve started although it should have refused ({want})");
        }
        std::thread::sleep(Duration::from_millis(20));
    };
    let mut err = String::new();
    std::io::Read::read_to_string(&mut child.stderr.take().unwrap(), &mut err).unwrap();
    assert!(!status.success(), "exit 0: {err}");
    assert!(err.contains(want), "{err}");
}

fn one_server_config(clients: &str) -> String {
    let plain = common::mcp::testserver("plain");
    format!(
        "[listen]\naddress = \"127.0.0.1:0\"\n{clients}\n[[servers]]\nname = \"plain\"\n\
         policy = \"plain.toml\"\ncommand = [{:?}]\n",
        plain.display().to_string()
    )
}

#[test]
fn a_writable_mount_every_client_would_share_is_refused_at_start() {
    let plain = common::mcp::testserver("plain");
    let shared = tempfile::tempdir().unwrap();
    // usable by the sandbox's uid when the tests run as root: the refusal
    // must be the sharing, not the permissions
    std::fs::set_permissions(
        shared.path(),
        std::os::unix::fs::PermissionsExt::from_mode(0o777),
    )
    .unwrap();
    let policy = format!(
        "{}[[filesystem.mounts]]\nhost = \"{}\"\nat = \"/shared\"\nmode = \"rw\"\n",
        common::peers::mount_same_path(&plain),
        shared.path().display()
    );
    let clients = "[[clients]]\nname = \"alice\"\ntoken = { from_env = \"T_ALICE\" }\n";
    refuses_to_start(
        &[
            ("plain.toml", policy),
            ("serve.toml", one_server_config(clients)),
        ],
        &[("T_ALICE", ALICE)],
        "read-write",
    );
}

#[test]
fn two_clients_with_one_token_are_refused_at_start() {
    let clients = "[[clients]]\nname = \"alice\"\ntoken = { from_env = \"T_ALICE\" }\n\
                   [[clients]]\nname = \"mallory\"\ntoken = { from_env = \"T_MALLORY\" }\n";
    let plain = common::mcp::testserver("plain");
    refuses_to_start(
        &[
            ("plain.toml", common::peers::mount_same_path(&plain)),
            ("serve.toml", one_server_config(clients)),
        ],
        &[("T_ALICE", ALICE), ("T_MALLORY", ALICE)],
        "the same token as another client",
    );
}

/// Issue 11, through the gateway: a server that exits before answering
/// `initialize` gives the client its last (redacted) stderr lines in the
/// error, as `mcpbox run` does, not only "exited (status 1)".
#[test]
fn a_server_that_exits_at_start_tells_the_client_why() {
    let failing = Server {
        name: "failing",
        command: vec![
            "/bin/sh".into(),
            "-c".into(),
            "read line; echo 'boom: missing config file' >&2; exit 1".into(),
        ],
        policy: "",
    };
    let gw = Gateway::start("", &[failing]);
    let mut m = gw.mcp("failing", Some(ALICE));
    let msg = m.message(
        "initialize",
        json!({"protocolVersion": "2025-11-25", "capabilities": {},
               "clientInfo": {"name": "t", "version": "0"}}),
    );
    let r = m.post(&msg);
    let answer = r.json();
    let message = answer["error"]["message"].as_str().unwrap_or_default();
    assert!(
        message.contains("exited (status 1)") && message.contains("boom: missing config file"),
        "{} {answer}",
        r.status
    );
    assert_eq!(
        answer["error"]["data"]["stderr"],
        json!(["boom: missing config file"]),
        "{answer}"
    );
}
