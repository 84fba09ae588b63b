//! A PyPI stand-in on loopback: a pure-Python wheel built here by
//! /usr/bin/python3's standard library (no binary fixture to keep in sync)
//! and served by a [`Stub`] as a PEP 503 simple index. The registry's
//! names are mapped to 127.0.0.1 by the policy's `[network.hosts]`, so a
//! runner inside the sandbox reaches the stand-in through the egress
//! proxy and nothing leaves the machine.

use std::path::Path;
use std::process::Command;

use super::http::Stub;

/// Writes a wheel of `name` `version` holding `module` (`NAME/__init__.py`,
/// `NAME` with dashes as underscores) and, when `script` is given, a console
/// script of the package's name running `NAME:main`; prints its sha256.
const BUILD_WHEEL: &str = r#"
import base64, hashlib, io, sys, zipfile
out, name, version, module, script = sys.argv[1:]
mod = name.replace("-", "_")
dist_info = f"{mod}-{version}.dist-info"
files = {
    f"{mod}/__init__.py": module.encode(),
    f"{dist_info}/METADATA": f"Metadata-Version: 2.1\nName: {name}\nVersion: {version}\n".encode(),
    f"{dist_info}/WHEEL":
        b"Wheel-Version: 1.0\nGenerator: mcpbox-test\nRoot-Is-Purelib: true\nTag: py3-none-any\n",
}
if script == "1":
    files[f"{dist_info}/entry_points.txt"] = f"[console_scripts]\n{name} = {mod}:main\n".encode()
def record_hash(data):
    digest = base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()
    return f"sha256={digest}"
record = "".join(f"{p},{record_hash(d)},{len(d)}\n" for p, d in files.items())
record += f"{dist_info}/RECORD,,\n"
files[f"{dist_info}/RECORD"] = record.encode()
buf = io.BytesIO()
with zipfile.ZipFile(buf, "w", zipfile.ZIP_DEFLATED) as zf:
    for p, d in files.items():
        zf.writestr(p, d)
whl = buf.getvalue()
open(out, "wb").write(whl)
print(hashlib.sha256(whl).hexdigest())
"#;

/// A built wheel and its sha256 (hex).
pub struct Wheel {
    pub name: String,
    pub version: String,
    pub bytes: Vec<u8>,
    pub sha256: String,
}

/// Builds a wheel of `name` (the distribution name; the module is the same
/// with underscores) in `dir`; with `console_script`, the package's name
/// is also a command running the module's `main()`.
pub fn build_wheel(
    dir: &Path,
    name: &str,
    version: &str,
    module: &str,
    console_script: bool,
) -> Wheel {
    let out_path = dir.join(format!("{name}.whl"));
    let out = Command::new("/usr/bin/python3")
        .args(["-c", BUILD_WHEEL])
        .arg(&out_path)
        .args([
            name,
            version,
            module,
            if console_script { "1" } else { "0" },
        ])
        .output()
        .expect("run /usr/bin/python3 to build the test wheel");
    assert!(
        out.status.success(),
        "building the test wheel failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    Wheel {
        name: name.to_string(),
        version: version.to_string(),
        bytes: std::fs::read(&out_path).unwrap(),
        sha256: String::from_utf8_lossy(&out.stdout).trim().to_string(),
    }
}

/// Serves `wheel` from `stub`: the project page `/simple/NAME/` (PEP 503:
/// the normalized name) links to the file under `files_base` (say
/// `http://files.pythonhosted.org:PORT`, as pypi.org's pages link to its
/// file host), with its `#sha256=`. Returns the file's path on the stub.
pub fn serve_wheel(stub: &Stub, wheel: &Wheel, files_base: &str) -> String {
    let file_name = format!(
        "{}-{}-py3-none-any.whl",
        wheel.name.replace('-', "_"),
        wheel.version
    );
    let file_path = format!("/packages/9f/2e/0c1d/{file_name}");
    let normalized = wheel.name.replace('_', "-").to_ascii_lowercase();
    let index = format!(
        "<!DOCTYPE html><html><body>\n<a href=\"{files_base}{file_path}#sha256={}\">{file_name}</a>\n</body></html>\n",
        wheel.sha256
    );
    stub.route(&format!("/simple/{normalized}/"), "text/html", index);
    stub.route(&file_path, "application/octet-stream", wheel.bytes.clone());
    file_path
}
