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

/// `mcpbox audit --ocsf` of the database at `db`, validated against the OCSF
/// 1.5.0 schema by `tests/interop/ocsf_check.py` (ocsf-json-schema and
/// jsonschema, pinned in scripts/install-peers.sh); its report, one line
/// per class.
pub fn assert_valid_ocsf(db: &Path) -> String {
    let out = Command::new(super::mcpbox())
        .args(["audit", "--ocsf", "--db"])
        .arg(db)
        .output()
        .expect("run mcpbox audit --ocsf");
    assert!(
        out.status.success(),
        "mcpbox audit --ocsf failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let mut check = Command::new(super::peers::peers().join("venv/bin/python"))
        .arg(super::interop_script("ocsf_check.py"))
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .expect("run ocsf_check.py");
    use std::io::Write;
    check
        .stdin
        .take()
        .expect("stdin")
        .write_all(&out.stdout)
        .expect("feed ocsf_check.py");
    let done = check.wait_with_output().expect("wait for ocsf_check.py");
    assert!(
        done.status.success(),
        "the OCSF export is not valid:\n{}\n{}",
        String::from_utf8_lossy(&done.stderr),
        String::from_utf8_lossy(&out.stdout)
    );
    String::from_utf8_lossy(&done.stdout).into_owned()
}
