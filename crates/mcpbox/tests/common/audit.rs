//! Reading the audit log back through `mcpbox audit --json`.

use std::path::Path;
use std::process::Command;

use serde_json::Value;

/// Every record in the audit database at `db`, as JSON objects.
pub fn events(db: &Path) -> Vec<Value> {
    let out = Command::new(super::mcpbox())
        .args(["audit", "--json", "--db"])
        .arg(db)
        .output()
        .expect("run mcpbox audit");
    assert!(
        out.status.success(),
        "mcpbox audit failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout)
        .lines()
        .map(|l| serde_json::from_str(l).unwrap_or_else(|e| panic!("not JSON ({e}): {l}")))
        .collect()
}

/// The network events among `events` whose `detail.host` is `host`.
pub fn network_to<'a>(events: &'a [Value], host: &str) -> Vec<&'a Value> {
    events
        .iter()
        .filter(|e| e["kind"] == "network" && e["detail"]["host"] == host)
        .collect()
}
