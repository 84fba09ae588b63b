//! `npx -y PKG`, `uvx PKG` and `pipx run PKG`: package runners that
//! download the server before running it.
//!
//! Read from the command line before the sandbox starts: the registry the
//! runner will ask (its flag, the policy's environment, else the public
//! one) is decided by the policy's `[network]` here, so a registry the
//! policy does not allow fails at once with what to do, instead of a
//! runner retrying an unreachable host until the host's own timeout. When
//! it is allowed, the runner gets a cache of its own per server
//! (`<state>/cache/<server>/{npm,uv,pipx}`, 0700, mounted read-write at
//! the same path), so the second start does not download again.

use std::ffi::{OsStr, OsString};
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};

use mcpbox_policy::{Policy, Verdict};
use mcpbox_sandbox::{BindMount, Spec};

/// A package runner recognized on the command line.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Runner {
    /// As the user wrote it: `npx -y`, `uvx`, `pipx run`.
    pub tool: &'static str,
    /// The cache's directory name and its environment variables.
    pub cache: &'static str,
    /// What it asks for: (what, host, port) of each registry host; empty
    /// when it runs offline or will not install.
    pub registries: Vec<(String, u16)>,
    /// Registry URLs that cannot be read strictly (`URL: why`): the runner
    /// is refused, since the host checked might not be the one it fetches
    /// from.
    pub unreadable: Vec<String>,
    /// What the registry is, in words, for the error.
    pub registry_name: &'static str,
    /// The fix besides allowing the registry.
    pub instead: &'static str,
}

const NPM_DEFAULT: &str = "https://registry.npmjs.org/";
const PYPI_DEFAULT: &[&str] = &["https://pypi.org/simple", "https://files.pythonhosted.org/"];

/// The value of `--flag VALUE` or `--flag=VALUE` at `args[i]`, if it is one
/// of `names`; and how many words it took.
fn flag_value<'a>(args: &'a [OsString], i: usize, names: &[&str]) -> Option<(&'a OsStr, usize)> {
    let a = args.get(i)?.to_str()?;
    for n in names {
        if a == *n {
            return args.get(i + 1).map(|v| (v.as_os_str(), 2));
        }
        if let Some(v) = a.strip_prefix(n).and_then(|r| r.strip_prefix('=')) {
            return Some((OsStr::new(v), 1));
        }
    }
    None
}

fn env_get<'a>(env: &'a [(OsString, OsString)], names: &[&str]) -> Option<&'a OsStr> {
    names.iter().find_map(|n| {
        env.iter()
            .find(|(k, _)| k == n)
            .map(|(_, v)| v.as_os_str())
            .filter(|v| !v.is_empty())
    })
}

/// Recognizes a package runner in `argv`; `env` is the sandbox's.
pub fn detect(argv: &[OsString], env: &[(OsString, OsString)]) -> Option<Runner> {
    let prog = Path::new(argv.first()?).file_name()?.to_str()?;
    let word = |i: usize| argv.get(i).and_then(|a| a.to_str());
    match prog {
        "npx" => Some(npm(&argv[1..], env)),
        "npm" if matches!(word(1), Some("exec" | "x")) => Some(npm(&argv[2..], env)),
        "uvx" => Some(uv(&argv[1..], env)),
        "uv" if word(1) == Some("tool") && matches!(word(2), Some("run" | "uvx")) => {
            Some(uv(&argv[3..], env))
        }
        "uv" if word(1) == Some("tool") => None,
        "pipx" if word(1) == Some("run") => Some(pipx(&argv[2..], env)),
        _ => None,
    }
}

/// The options before the package: `on` is called with each index and
/// returns how many words that option took (0: not one of its own).
fn scan(args: &[OsString], mut on: impl FnMut(usize) -> usize) {
    let mut i = 0;
    while i < args.len() {
        let taken = on(i);
        if taken > 0 {
            i += taken;
            continue;
        }
        let a = args[i].as_encoded_bytes();
        if a == b"--" || !a.starts_with(b"-") {
            break;
        }
        i += 1;
    }
}

fn npm(args: &[OsString], env: &[(OsString, OsString)]) -> Runner {
    let mut registry =
        env_get(env, &["npm_config_registry", "NPM_CONFIG_REGISTRY"]).map(OsStr::to_os_string);
    let mut installs = true;
    scan(args, |i| {
        if let Some((v, n)) = flag_value(args, i, &["--registry"]) {
            registry = Some(v.to_os_string());
            return n;
        }
        // `--no` (and npx 6's `--no-install`): run only what is installed;
        // `--offline`: the cache only
        match args[i].to_str() {
            Some("--no" | "--no-install" | "--offline" | "--yes=false") => {
                installs = false;
                1
            }
            _ => 0,
        }
    });
    let registry = registry
        .map(|r| r.to_string_lossy().into_owned())
        .unwrap_or_else(|| NPM_DEFAULT.to_string());
    let (registries, unreadable) = if installs {
        read_registries(vec![registry])
    } else {
        Default::default()
    };
    Runner {
        tool: "npx -y",
        cache: "npm",
        registries,
        unreadable,
        registry_name: "the npm registry",
        instead: "install the package (npm install) and run it from its node_modules",
    }
}

/// The index URLs a Python runner fetches from.
fn python_indexes(mut index: Option<String>, offline: bool) -> Vec<String> {
    if offline {
        return Vec::new();
    }
    match index.take() {
        Some(i) => vec![i],
        None => PYPI_DEFAULT.iter().map(|s| s.to_string()).collect(),
    }
}

/// `urls` read strictly: the (host, port) of each, without repeats, and
/// `URL: why` for each that cannot be read.
fn read_registries(urls: Vec<String>) -> (Vec<(String, u16)>, Vec<String>) {
    let (mut hosts, mut unreadable) = (Vec::new(), Vec::new());
    for url in urls {
        match host_port(&url) {
            Ok(h) if !hosts.contains(&h) => hosts.push(h),
            Ok(_) => {}
            Err(why) => unreadable.push(format!("\"{}\": {why}", url.escape_debug())),
        }
    }
    (hosts, unreadable)
}

fn uv(args: &[OsString], env: &[(OsString, OsString)]) -> Runner {
    let mut index = env_get(env, &["UV_DEFAULT_INDEX", "UV_INDEX_URL"])
        .map(|v| v.to_string_lossy().into_owned());
    let mut offline = env_get(env, &["UV_OFFLINE"]).is_some_and(|v| v != "0" && v != "false");
    scan(args, |i| {
        if let Some((v, n)) = flag_value(args, i, &["--default-index", "--index-url", "-i"]) {
            index = Some(v.to_string_lossy().into_owned());
            return n;
        }
        if args[i] == "--offline" {
            offline = true;
            return 1;
        }
        0
    });
    let (registries, unreadable) = read_registries(python_indexes(index, offline));
    Runner {
        tool: "uvx",
        cache: "uv",
        registries,
        unreadable,
        registry_name: "the Python package index",
        instead: "install the package into a virtual environment (uv venv; uv pip install) \
                  and run it from there",
    }
}

fn pipx(args: &[OsString], env: &[(OsString, OsString)]) -> Runner {
    let mut index = None;
    let mut backend = env_get(env, &["PIPX_DEFAULT_BACKEND"]).map(|v| v.to_os_string());
    scan(args, |i| {
        if let Some((v, n)) = flag_value(args, i, &["--index-url", "-i"]) {
            index = Some(v.to_string_lossy().into_owned());
            return n;
        }
        if let Some((v, n)) = flag_value(args, i, &["--backend"]) {
            backend = Some(v.to_os_string());
            return n;
        }
        0
    });
    // pipx (1.8 and later) runs the package with `uv tool run` when uv is
    // installed (`--backend`, else PIPX_DEFAULT_BACKEND, else uv if found):
    // then its `--index-url` is passed on, but the environment that counts
    // is uv's (UV_DEFAULT_INDEX, UV_INDEX_URL), not PIP_INDEX_URL. Which
    // one it picks is not known before the start, so without a flag or a
    // backend named, the registries of both must be allowed.
    let registries = match index {
        Some(i) => python_indexes(Some(i), false),
        None => {
            let pip = || {
                let i = env_get(env, &["PIP_INDEX_URL"]).map(|v| v.to_string_lossy().into_owned());
                python_indexes(i, false)
            };
            let uv = || {
                let i = env_get(env, &["UV_DEFAULT_INDEX", "UV_INDEX_URL"])
                    .map(|v| v.to_string_lossy().into_owned());
                python_indexes(i, false)
            };
            match backend.as_ref().and_then(|b| b.to_str()) {
                Some("pip") => pip(),
                Some("uv") => uv(),
                _ => {
                    let mut both = pip();
                    for r in uv() {
                        if !both.contains(&r) {
                            both.push(r);
                        }
                    }
                    both
                }
            }
        }
    };
    let (registries, unreadable) = read_registries(registries);
    Runner {
        tool: "pipx run",
        cache: "pipx",
        registries,
        unreadable,
        registry_name: "the Python package index",
        instead: "install the package into a virtual environment (python3 -m venv; pip \
                  install) and run it from there",
    }
}

/// Host (lowercase, IPv6 without brackets) and port of a registry URL,
/// read by the one strict reader ([`mcpbox_policy::url::host_port`]): a
/// URL with user information or a backslash is refused, not read as the
/// part after its last `@`, which a runner's own URL parser may not agree
/// with.
fn host_port(url: &str) -> Result<(String, u16), String> {
    let (host, port) = mcpbox_policy::url::host_port(url)?;
    let host = host
        .strip_prefix('[')
        .and_then(|h| h.strip_suffix(']'))
        .unwrap_or(&host);
    Ok((host.to_ascii_lowercase(), port))
}

/// The environment variables pointing a runner at its cache directory.
fn cache_env(cache: &str, dir: &Path) -> Vec<(&'static str, PathBuf)> {
    match cache {
        "npm" => vec![("npm_config_cache", dir.to_path_buf())],
        "uv" => vec![
            ("UV_CACHE_DIR", dir.to_path_buf()),
            ("UV_TOOL_DIR", dir.join("tools")),
            ("UV_PYTHON_INSTALL_DIR", dir.join("python")),
        ],
        // pipx's uv backend runs `uv tool run`, which downloads into uv's
        // cache (and may fetch a Python), not PIPX_HOME's
        _ => vec![
            ("PIPX_HOME", dir.to_path_buf()),
            ("PIPX_BIN_DIR", dir.join("bin")),
            ("PIP_CACHE_DIR", dir.join("pip")),
            ("UV_CACHE_DIR", dir.join("uv")),
            ("UV_PYTHON_INSTALL_DIR", dir.join("python")),
        ],
    }
}

/// Checks a runner on `spec`'s command against the policy and gives it its
/// cache. `asks` says whether a host can be asked about an unlisted
/// registry (`run`: yes, through the relay; `exec`: no); `cache` whether
/// to mount one (not with `[runtime] discover = false`, which mounts
/// nothing; the registry is checked all the same). Returns the runner
/// found, if any, and the cache directory mounted.
pub fn prepare(
    spec: &mut Spec,
    policy: &Policy,
    state: &Path,
    asks: bool,
    cache: bool,
) -> anyhow::Result<Option<(Runner, Option<PathBuf>)>> {
    let Some(runner) = detect(&spec.argv, &spec.env) else {
        return Ok(None);
    };
    if !runner.unreadable.is_empty() {
        anyhow::bail!(
            "{} would fetch from a registry URL mcpbox cannot read strictly ({}): write it \
             without user information, backslashes or spaces (a registry credential belongs \
             in the runner's own configuration), or {} (see docs/runtime.md)",
            runner.tool,
            runner.unreadable.join("; "),
            runner.instead
        );
    }
    let refused: Vec<String> = runner
        .registries
        .iter()
        .filter(|(host, port)| {
            let d = policy.network.decide(host, *port);
            !(d.verdict == Verdict::Allow || asks && d.verdict == Verdict::Approve)
        })
        .map(|(h, p)| {
            if *p == 443 || *p == 80 {
                h.clone()
            } else {
                format!("{h}:{p}")
            }
        })
        .collect();
    if !refused.is_empty() {
        let hosts = refused.join(", ");
        let allow = refused
            .iter()
            .map(|h| format!("\"{h}\""))
            .collect::<Vec<_>>()
            .join(", ");
        anyhow::bail!(
            "{} needs {} ({hosts}), which the policy's [network] does not allow: add \
             allow = [{allow}] to [network], or {} (see docs/runtime.md)",
            runner.tool,
            runner.registry_name,
            runner.instead
        );
    }
    if policy.process.allow_exec.is_some() && !runner.registries.is_empty() {
        anyhow::bail!(
            "{} runs the package it downloads from a writable cache, which process.allow_exec \
             makes noexec: {} and list its programs in allow_exec",
            runner.tool,
            runner.instead
        );
    }
    let env = cache_env(runner.cache, Path::new(""));
    // a variable the policy sets itself is the policy's: no cache then
    if !cache
        || env
            .iter()
            .any(|(k, _)| spec.env.iter().any(|(name, _)| name == k))
    {
        return Ok(Some((runner, None)));
    }
    let dir = state.join("cache").join(policy.name()).join(runner.cache);
    crate::state::private_dir(&dir)
        .map_err(|e| anyhow::anyhow!("creating the cache {}: {e}", dir.display()))?;
    for d in [dir.as_path(), dir.parent().unwrap_or(&dir)] {
        std::fs::set_permissions(d, std::fs::Permissions::from_mode(0o700))
            .map_err(|e| anyhow::anyhow!("making {} private: {e}", d.display()))?;
    }
    let dir = std::fs::canonicalize(&dir).unwrap_or(dir);
    for (k, v) in cache_env(runner.cache, &dir) {
        spec.env.push((k.into(), v.into_os_string()));
    }
    spec.mounts.push(BindMount {
        host: dir.clone(),
        at: dir.clone(),
        writable: true,
    });
    Ok(Some((runner, Some(dir))))
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    fn argv(words: &[&str]) -> Vec<OsString> {
        words.iter().map(OsString::from).collect()
    }

    #[test]
    fn npx_asks_the_registry_its_flag_names_or_the_public_one() {
        let r = detect(&argv(&["npx", "-y", "@scope/pkg", "--registry", "x"]), &[]).unwrap();
        assert_eq!(r.registries, vec![("registry.npmjs.org".into(), 443)]);
        let r = detect(
            &argv(&[
                "/usr/bin/npx",
                "--registry=http://reg.test:4873/",
                "-y",
                "pkg",
            ]),
            &[],
        )
        .unwrap();
        assert_eq!(r.registries, vec![("reg.test".into(), 4873)]);
        let env = vec![("npm_config_registry".into(), "http://r.test/".into())];
        let r = detect(&argv(&["npm", "exec", "pkg"]), &env).unwrap();
        assert_eq!(r.registries, vec![("r.test".into(), 80)]);
    }

    #[test]
    fn npx_that_will_not_install_needs_no_registry() {
        for flag in ["--no", "--offline", "--no-install"] {
            let r = detect(&argv(&["npx", flag, "pkg"]), &[]).unwrap();
            assert!(r.registries.is_empty(), "{flag}");
        }
    }

    #[test]
    fn uvx_and_pipx_run_ask_pypi_and_its_file_host() {
        let both = vec![
            ("pypi.org".to_string(), 443),
            ("files.pythonhosted.org".to_string(), 443),
        ];
        assert_eq!(
            detect(&argv(&["uvx", "mcp-server-time"]), &[])
                .unwrap()
                .registries,
            both
        );
        assert_eq!(
            detect(&argv(&["pipx", "run", "mcp-server-time"]), &[])
                .unwrap()
                .registries,
            both
        );
        let r = detect(
            &argv(&[
                "uv",
                "tool",
                "run",
                "--index-url",
                "http://i.test:81/simple",
                "x",
            ]),
            &[],
        )
        .unwrap();
        assert_eq!(r.registries, vec![("i.test".into(), 81)]);
        assert!(detect(&argv(&["uvx", "--offline", "x"]), &[])
            .unwrap()
            .registries
            .is_empty());
        assert!(detect(&argv(&["pipx", "install", "x"]), &[]).is_none());
        // pipx may run the package with pip or with uv: each reads its own
        // index variable, so both count unless the backend is named
        let env = vec![
            ("PIP_INDEX_URL".into(), "http://p.test/simple".into()),
            ("UV_INDEX_URL".into(), "http://u.test/simple".into()),
        ];
        let r = detect(&argv(&["pipx", "run", "x"]), &env).unwrap();
        assert_eq!(
            r.registries,
            vec![("p.test".into(), 80), ("u.test".into(), 80)]
        );
        let r = detect(&argv(&["pipx", "run", "--backend", "pip", "x"]), &env).unwrap();
        assert_eq!(r.registries, vec![("p.test".into(), 80)]);
        let r = detect(&argv(&["pipx", "run", "--backend=uv", "x"]), &env).unwrap();
        assert_eq!(r.registries, vec![("u.test".into(), 80)]);
        let r = detect(&argv(&["pipx", "run", "-i", "http://i.test/s", "x"]), &env).unwrap();
        assert_eq!(r.registries, vec![("i.test".into(), 80)]);
        assert!(detect(&argv(&["node", "npx"]), &[]).is_none());
    }

    #[test]
    fn urls_give_their_host_and_port() {
        assert_eq!(
            host_port("https://Reg.test/x"),
            Ok(("reg.test".into(), 443))
        );
        assert_eq!(host_port("http://[::1]:8080/"), Ok(("::1".into(), 8080)));
        assert!(host_port("registry").is_err());
    }

    #[test]
    fn a_registry_url_read_differently_by_other_parsers_is_unreadable() {
        for url in [
            "https://u:p@reg.test/",
            "https://evil.test\\@registry.npmjs.org/",
            "https://registry.npmjs.org@evil.test/",
        ] {
            let r = detect(
                &argv(&["npx", &format!("--registry={url}"), "-y", "pkg"]),
                &[],
            )
            .unwrap();
            assert!(r.registries.is_empty(), "{url}: {:?}", r.registries);
            assert_eq!(r.unreadable.len(), 1, "{url}");
        }
        let env = vec![("UV_INDEX_URL".into(), "https://u@i.test/simple".into())];
        let r = detect(&argv(&["uvx", "x"]), &env).unwrap();
        assert!(r.registries.is_empty() && r.unreadable.len() == 1, "{r:?}");
    }
}
