//! Runs the egress proxy by hand, for trying real clients (curl, npm, pip)
//! against local servers. Names given as `name=ip` are allowed and mapped;
//! names given bare are allowed and resolved by the system resolver;
//! everything else is refused. Audit records go to stdout as JSON lines.
//!
//! `cargo run -p mcpbox-egress --example egress_try -- 127.0.0.1:3128 web.test=127.0.0.1 pypi.org`
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::collections::HashMap;
use std::net::{IpAddr, TcpListener};
use std::sync::Arc;

use mcpbox_audit::{Event, Sink};
use mcpbox_egress::*;
use mcpbox_policy::{Decision, Reason};

struct Args {
    allow: Vec<String>,
    mapped: HashMap<String, IpAddr>,
}

impl EgressPolicy for Args {
    fn decide(&self, host: &str, _port: u16) -> Decision {
        match self.allow.iter().position(|h| h == host) {
            Some(i) => Decision::allow(Reason::NetworkAllow, format!("args[{i}]")),
            None => Decision::deny(Reason::NetworkUnlisted, "args:unlisted"),
        }
    }
    fn mapped_address(&self, host: &str) -> Option<IpAddr> {
        self.mapped.get(host).copied()
    }
}

struct Stdout;
impl Sink for Stdout {
    fn record(&self, event: Event) {
        println!("{}", serde_json::to_string(&event).unwrap());
    }
}

fn main() {
    let mut argv = std::env::args().skip(1);
    let listen = argv.next().unwrap_or_else(|| "127.0.0.1:3128".into());
    let mut args = Args {
        allow: Vec::new(),
        mapped: HashMap::new(),
    };
    for a in argv {
        match a.split_once('=') {
            Some((name, ip)) => {
                args.allow.push(name.to_string());
                args.mapped
                    .insert(name.to_string(), ip.parse().expect("bad ip"));
            }
            None => args.allow.push(a),
        }
    }
    let proxy = Proxy::new(
        Arc::new(args),
        Arc::new(SystemResolver),
        Arc::new(SystemConnector::default()),
        Arc::new(DenyAllApprover),
        Arc::new(Stdout),
        Ids {
            sandbox_id: "try".into(),
            workspace_id: "try".into(),
            server: "try".into(),
        },
    );
    let listener = TcpListener::bind(&listen).expect("bind");
    eprintln!("egress proxy on {}", listener.local_addr().unwrap());
    proxy.serve(listener, &Shutdown::new()).expect("serve");
}
