//! Package registry recognition: which registry a host is, and which package
//! and version a plain-HTTP download path names, so that the audit shows
//! what was installed. Pure functions; no I/O.

use serde_json::{json, Value};

/// A package ecosystem the proxy recognises.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Ecosystem {
    /// npm (`registry.npmjs.org`, `registry.yarnpkg.com`).
    Npm,
    /// PyPI (`pypi.org`, `files.pythonhosted.org`).
    Pypi,
    /// Rust crates (`crates.io`, `static.crates.io`, `index.crates.io`).
    Crates,
    /// Debian (`deb.debian.org`, `security.debian.org`, `ftp.debian.org`).
    Debian,
}

impl Ecosystem {
    /// Stable lowercase name used in the audit detail.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Npm => "npm",
            Self::Pypi => "pypi",
            Self::Crates => "crates",
            Self::Debian => "debian",
        }
    }
}

/// A package download recognised from a request.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Package {
    /// The registry it came from.
    pub ecosystem: Ecosystem,
    /// Package name as the registry spells it (npm scopes included).
    pub name: String,
    /// Version as written in the file name.
    pub version: String,
}

impl Package {
    /// The `package` object of the audit detail.
    pub fn to_json(&self) -> Value {
        json!({ "ecosystem": self.ecosystem.as_str(), "name": self.name, "version": self.version })
    }
}

/// The registry `host` (lowercase) belongs to, if it is a known one.
pub fn registry_for_host(host: &str) -> Option<Ecosystem> {
    match host {
        "registry.npmjs.org" | "registry.yarnpkg.com" => Some(Ecosystem::Npm),
        "pypi.org" | "files.pythonhosted.org" | "pypi.python.org" => Some(Ecosystem::Pypi),
        "crates.io" | "static.crates.io" | "index.crates.io" => Some(Ecosystem::Crates),
        "deb.debian.org" | "security.debian.org" | "ftp.debian.org" => Some(Ecosystem::Debian),
        _ => None,
    }
}

fn percent_decode(s: &str) -> String {
    let b = s.as_bytes();
    let mut out = Vec::with_capacity(b.len());
    let mut i = 0;
    while i < b.len() {
        if b[i] == b'%' && i + 2 < b.len() {
            if let (Some(h), Some(l)) = (
                mcpbox_policy::hex::digit(b[i + 1]),
                mcpbox_policy::hex::digit(b[i + 2]),
            ) {
                out.push(h * 16 + l);
                i += 3;
                continue;
            }
        }
        out.push(b[i]);
        i += 1;
    }
    String::from_utf8_lossy(&out).into_owned()
}

fn starts_with_digit(s: &str) -> bool {
    s.bytes().next().is_some_and(|b| b.is_ascii_digit())
}

/// The package a download path names on a registry host, where the path
/// shape says it: npm tarballs, PyPI sdists and wheels, crate downloads,
/// Debian pool files. Index and metadata requests give `None`.
pub fn parse_package(host: &str, path: &str) -> Option<Package> {
    let ecosystem = registry_for_host(&host.to_ascii_lowercase())?;
    let path = path.split(['?', '#']).next().unwrap_or_default();
    let segs: Vec<String> = path
        .split('/')
        .filter(|s| !s.is_empty())
        .map(percent_decode)
        .collect();
    let segs: Vec<&str> = segs.iter().map(String::as_str).collect();
    let (name, version) = match ecosystem {
        Ecosystem::Npm => npm(&segs)?,
        Ecosystem::Pypi => pypi(&segs)?,
        Ecosystem::Crates => crates(&segs)?,
        Ecosystem::Debian => debian(&segs)?,
    };
    if name.is_empty() || version.is_empty() {
        return None;
    }
    Some(Package {
        ecosystem,
        name,
        version,
    })
}

/// `/<name>/-/<name>-<ver>.tgz` or `/@scope/<name>/-/<name>-<ver>.tgz`
/// (also `/@scope%2f<name>/-/...`).
fn npm(segs: &[&str]) -> Option<(String, String)> {
    let (full, bare, file) = match segs {
        [scope, name, "-", file] if scope.starts_with('@') => {
            (format!("{scope}/{name}"), *name, *file)
        }
        [name, "-", file] => match name.split_once('/') {
            Some((scope, bare)) if scope.starts_with('@') => (name.to_string(), bare, *file),
            _ => (name.to_string(), *name, *file),
        },
        _ => return None,
    };
    let version = file
        .strip_suffix(".tgz")?
        .strip_prefix(bare)?
        .strip_prefix('-')?;
    Some((full, version.to_string()))
}

/// `/packages/.../<name>-<ver>.tar.gz|.zip` or a wheel
/// `<name>-<ver>(-<build>)?-<py>-<abi>-<plat>.whl`.
fn pypi(segs: &[&str]) -> Option<(String, String)> {
    if segs.first() != Some(&"packages") {
        return None;
    }
    let file = segs.last()?;
    if let Some(stem) = file.strip_suffix(".whl") {
        let parts: Vec<&str> = stem.split('-').collect();
        if parts.len() < 5 {
            return None;
        }
        return Some((parts[0].to_string(), parts[1].to_string()));
    }
    let stem = [".tar.gz", ".zip", ".tar.bz2", ".tgz"]
        .iter()
        .find_map(|ext| file.strip_suffix(ext))?;
    // sdist names may hold '-': the version starts after the last '-' that
    // is followed by a digit.
    let cut = stem
        .rmatch_indices('-')
        .map(|(i, _)| i)
        .find(|&i| starts_with_digit(&stem[i + 1..]))?;
    Some((stem[..cut].to_string(), stem[cut + 1..].to_string()))
}

/// `/api/v1/crates/<name>/<ver>/download` or `/crates/<name>/<name>-<ver>.crate`.
fn crates(segs: &[&str]) -> Option<(String, String)> {
    match segs {
        ["api", "v1", "crates", name, ver, "download"] => Some((name.to_string(), ver.to_string())),
        ["crates", name, file] => {
            let ver = file
                .strip_suffix(".crate")?
                .strip_prefix(name)?
                .strip_prefix('-')?;
            Some((name.to_string(), ver.to_string()))
        }
        _ => None,
    }
}

/// `/.../pool/<component>/<prefix>/<source>/<name>_<ver>_<arch>.deb`.
fn debian(segs: &[&str]) -> Option<(String, String)> {
    if !segs.contains(&"pool") {
        return None;
    }
    let file = segs.last()?;
    let stem = file
        .strip_suffix(".deb")
        .or_else(|| file.strip_suffix(".udeb"))?;
    let mut parts = stem.split('_');
    let (name, ver, _arch) = (parts.next()?, parts.next()?, parts.next()?);
    if parts.next().is_some() {
        return None;
    }
    Some((name.to_string(), ver.to_string()))
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    fn p(host: &str, path: &str) -> Option<(&'static str, String, String)> {
        parse_package(host, path).map(|p| (p.ecosystem.as_str(), p.name, p.version))
    }

    fn some(e: &'static str, n: &str, v: &str) -> Option<(&'static str, String, String)> {
        Some((e, n.to_string(), v.to_string()))
    }

    #[test]
    fn npm_tarballs() {
        assert_eq!(
            p("registry.npmjs.org", "/left-pad/-/left-pad-1.3.0.tgz"),
            some("npm", "left-pad", "1.3.0")
        );
        assert_eq!(
            p(
                "registry.npmjs.org",
                "/@modelcontextprotocol/sdk/-/sdk-1.2.0-beta.1.tgz"
            ),
            some("npm", "@modelcontextprotocol/sdk", "1.2.0-beta.1")
        );
        assert_eq!(
            p("registry.npmjs.org", "/@scope%2fpkg/-/pkg-2.0.0.tgz"),
            some("npm", "@scope/pkg", "2.0.0")
        );
        assert_eq!(p("registry.npmjs.org", "/left-pad"), None);
        assert_eq!(p("registry.npmjs.org", "/left-pad/-/other-1.0.0.tgz"), None);
    }

    #[test]
    fn pypi_files() {
        assert_eq!(
            p(
                "files.pythonhosted.org",
                "/packages/ab/cd/ef01/requests-2.32.3-py3-none-any.whl"
            ),
            some("pypi", "requests", "2.32.3")
        );
        assert_eq!(
            p(
                "files.pythonhosted.org",
                "/packages/ab/cd/ef01/mcp_server_fetch-0.6.2-1-py3-none-any.whl"
            ),
            some("pypi", "mcp_server_fetch", "0.6.2")
        );
        assert_eq!(
            p(
                "files.pythonhosted.org",
                "/packages/source/z/zope-interface/zope-interface-6.0.tar.gz"
            ),
            some("pypi", "zope-interface", "6.0")
        );
        assert_eq!(p("pypi.org", "/simple/requests/"), None);
    }

    #[test]
    fn crates_downloads() {
        assert_eq!(
            p("crates.io", "/api/v1/crates/serde/1.0.200/download"),
            some("crates", "serde", "1.0.200")
        );
        assert_eq!(
            p(
                "static.crates.io",
                "/crates/serde-json/serde-json-1.0.0-rc.1.crate"
            ),
            some("crates", "serde-json", "1.0.0-rc.1")
        );
        assert_eq!(p("index.crates.io", "/se/rd/serde"), None);
    }

    #[test]
    fn debian_pool() {
        assert_eq!(
            p(
                "deb.debian.org",
                "/debian/pool/main/c/curl/curl_7.88.1-10+deb12u5_amd64.deb"
            ),
            some("debian", "curl", "7.88.1-10+deb12u5")
        );
        assert_eq!(
            p(
                "security.debian.org",
                "/debian-security/pool/updates/main/o/openssl/libssl3_1%3a3.0.15-1_arm64.deb"
            ),
            some("debian", "libssl3", "1:3.0.15-1")
        );
        assert_eq!(
            p("deb.debian.org", "/debian/dists/bookworm/InRelease"),
            None
        );
    }

    #[test]
    fn other_hosts_are_never_packages() {
        assert_eq!(p("evil.example", "/left-pad/-/left-pad-1.3.0.tgz"), None);
        assert_eq!(p("registry.npmjs.org", "%"), None);
        assert_eq!(p("registry.npmjs.org", "/%e2%2/-/x"), None);
    }
}
