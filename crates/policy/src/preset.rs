//! Presets: least-privilege policies for the MCP servers people actually run,
//! shipped in the binary (`presets/*.toml`, embedded at build time).
//!
//! A preset is an ordinary policy file. It is used whole (`mcpbox run
//! --preset NAME`), as the base of a policy (`extends = "preset:NAME"`, see
//! [`crate::parse_with`]), or printed as a starting point (`mcpbox init
//! --preset NAME`). Its relative paths (`input = "."`) are relative to the
//! directory it is used from: the extending policy's directory, or the
//! current directory under `--preset`. [`for_command`] recognises a server
//! from the command line a host config starts it with, for `mcpbox wrap`.

use std::path::{Path, PathBuf};

use crate::Policy;

/// The prefix that names a preset where a policy file could be named:
/// `extends = "preset:git"`, `mcpbox check preset:git`, a serve config's
/// `policy = "preset:git"`.
pub const PREFIX: &str = "preset:";

/// One shipped preset.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Preset {
    /// What `--preset`, `extends = "preset:NAME"` and `init --preset` take.
    pub name: &'static str,
    /// One line for `mcpbox init --list`, lowercase, no trailing period.
    pub summary: &'static str,
    /// The policy file, commented (`presets/NAME.toml`).
    pub text: &'static str,
    /// The package names and program names the server is started by
    /// (npm packages, PyPI distributions, executables, python modules).
    pub programs: &'static [&'static str],
}

impl Preset {
    /// The label diagnostics use for this preset's own text: `preset:NAME`.
    pub fn label(&self) -> PathBuf {
        PathBuf::from(format!("{PREFIX}{}", self.name))
    }

    /// Parses the preset as a whole policy, its relative paths resolved
    /// against `base` (the directory it is used from).
    pub fn parse(&self, base: &Path) -> crate::Result<Policy> {
        crate::parse_in(self.text, &self.label(), base)
    }
}

static PRESETS: &[Preset] = &[
    Preset {
        name: "everything",
        summary: "the MCP reference test server (npm @modelcontextprotocol/server-everything): nothing of the host",
        text: include_str!("../presets/everything.toml"),
        programs: &["@modelcontextprotocol/server-everything", "mcp-server-everything"],
    },
    Preset {
        name: "fetch",
        summary: "web pages as markdown (PyPI mcp-server-fetch): every host asked for, private addresses refused",
        text: include_str!("../presets/fetch.toml"),
        programs: &["mcp-server-fetch", "mcp_server_fetch"],
    },
    Preset {
        name: "filesystem",
        summary: "files of the current directory, read-only (npm @modelcontextprotocol/server-filesystem)",
        text: include_str!("../presets/filesystem.toml"),
        programs: &["@modelcontextprotocol/server-filesystem", "mcp-server-filesystem"],
    },
    Preset {
        name: "git",
        summary: "the repository in the current directory, read-only (PyPI mcp-server-git): log, diff, show; no commits",
        text: include_str!("../presets/git.toml"),
        programs: &["mcp-server-git", "mcp_server_git"],
    },
    Preset {
        name: "github",
        summary: "the GitHub API with a token from GITHUB_PERSONAL_ACCESS_TOKEN: reads run, writes ask, deletes refused",
        text: include_str!("../presets/github.toml"),
        programs: &[
            "@modelcontextprotocol/server-github",
            "mcp-server-github",
            "github-mcp-server",
        ],
    },
    Preset {
        name: "memory",
        summary: "a knowledge-graph memory kept in the sandbox's tmp (npm @modelcontextprotocol/server-memory)",
        text: include_str!("../presets/memory.toml"),
        programs: &["@modelcontextprotocol/server-memory", "mcp-server-memory"],
    },
    Preset {
        name: "playwright",
        summary: "a headless browser (npm @playwright/mcp, Debian's chromium): screenshots to ./playwright-output, every host asked for, code asks",
        text: include_str!("../presets/playwright.toml"),
        programs: &["@playwright/mcp", "mcp-server-playwright", "playwright-mcp"],
    },
    Preset {
        name: "postgres",
        summary: "read-only SQL over the local PostgreSQL socket (npm @modelcontextprotocol/server-postgres)",
        text: include_str!("../presets/postgres.toml"),
        programs: &["@modelcontextprotocol/server-postgres", "mcp-server-postgres"],
    },
    Preset {
        name: "puppeteer",
        summary: "a headless Chromium (npm @modelcontextprotocol/server-puppeteer): every host asked for",
        text: include_str!("../presets/puppeteer.toml"),
        programs: &["@modelcontextprotocol/server-puppeteer", "mcp-server-puppeteer"],
    },
    Preset {
        name: "time",
        summary: "the time and time zone conversions (PyPI mcp-server-time): nothing of the host",
        text: include_str!("../presets/time.toml"),
        programs: &["mcp-server-time", "mcp_server_time"],
    },
];

/// Every shipped preset, sorted by name.
pub fn all() -> &'static [Preset] {
    PRESETS
}

/// The preset called `name` (exactly; names are lowercase).
pub fn get(name: &str) -> Option<&'static Preset> {
    PRESETS.iter().find(|p| p.name == name)
}

/// The known names, for "unknown preset" messages: `everything, fetch, ...`.
pub fn names() -> String {
    PRESETS
        .iter()
        .map(|p| p.name)
        .collect::<Vec<_>>()
        .join(", ")
}

/// The preset for a server, recognised from the command line a host config
/// starts it with: `npx -y @modelcontextprotocol/server-filesystem DIR`,
/// `node .../node_modules/@modelcontextprotocol/server-filesystem/dist/index.js`,
/// `uvx mcp-server-git`, `python -m mcp_server_time`, `pipx run mcp-server-fetch`,
/// `/venv/bin/mcp-server-fetch`, `npx @playwright/mcp@latest`. `None` for a
/// server this does not know (and for `docker run`: the image is not a
/// program the sandbox can start).
pub fn for_command(argv: &[String]) -> Option<&'static Preset> {
    let candidates = server_candidates(argv);
    candidates.iter().find_map(|c| {
        PRESETS
            .iter()
            .find(|p| p.programs.iter().any(|prog| prog == c))
    })
}

/// The last path component, without a `.exe`, `.cmd`, `.js`, `.py` suffix.
fn program_name(token: &str) -> &str {
    let base = token.rsplit(['/', '\\']).next().unwrap_or(token);
    [".exe", ".cmd", ".js", ".mjs", ".cjs", ".py"]
        .iter()
        .find_map(|ext| base.strip_suffix(ext))
        .unwrap_or(base)
}

/// A package spec without its version: `@scope/name@1.2` -> `@scope/name`,
/// `name@latest` -> `name`, `name==1.0` / `name>=1` -> `name`, `name[extra]` -> `name`.
fn package_name(spec: &str) -> &str {
    let spec = match spec.strip_prefix('@') {
        // a scoped name: the version's `@` is the second one
        Some(rest) => match rest.find('@') {
            Some(i) => &spec[..i + 1],
            None => spec,
        },
        None => spec.split('@').next().unwrap_or(spec),
    };
    let end = spec
        .find(['=', '<', '>', '~', '!', '[', ' '])
        .unwrap_or(spec.len());
    &spec[..end]
}

/// What a path says about the package it belongs to: the package after the
/// last `node_modules/` (`.../node_modules/@scope/name/dist/index.js` ->
/// `@scope/name`), or the program's own name.
fn path_candidates(token: &str) -> Vec<String> {
    let mut out = Vec::new();
    let parts: Vec<&str> = token.split('/').collect();
    if let Some(i) = parts.iter().rposition(|p| *p == "node_modules") {
        match parts.get(i + 1) {
            Some(scope) if scope.starts_with('@') => {
                if let Some(name) = parts.get(i + 2) {
                    out.push(format!("{scope}/{name}"));
                }
            }
            Some(name) => out.push((*name).to_string()),
            None => {}
        }
    }
    out.push(program_name(token).to_string());
    out
}

/// The tokens that may name the server: the package a launcher runs, the
/// script an interpreter runs, the module of `python -m`, or the program.
fn server_candidates(argv: &[String]) -> Vec<String> {
    let Some(first) = argv.first() else {
        return Vec::new();
    };
    let launcher = program_name(first);
    let rest = &argv[1..];
    // Options of launchers that take a value: the value is not the package.
    let next_value = |args: &[String], with_value: &[&str]| -> (Vec<String>, Option<String>) {
        let mut named = Vec::new();
        let mut i = 0;
        while let Some(a) = args.get(i) {
            if let Some((flag, value)) = a.split_once('=') {
                if ["--package", "--from", "--spec"].contains(&flag) {
                    named.push(package_name(value).to_string());
                }
                i += 1;
            } else if with_value.contains(&a.as_str()) {
                if let Some(v) = args.get(i + 1) {
                    if ["-p", "--package", "--from", "--spec"].contains(&a.as_str()) {
                        named.push(package_name(v).to_string());
                    }
                }
                i += 2;
            } else if a.starts_with('-') {
                // a flag, or `--`
                i += 1;
            } else {
                return (named, Some(a.clone()));
            }
        }
        (named, None)
    };
    let package_runner = |args: &[String]| -> Vec<String> {
        let (mut named, package) = next_value(
            args,
            &[
                "-p",
                "--package",
                "--from",
                "--spec",
                "--with",
                "--python",
                "--registry",
                "--cache",
                "--index-url",
                "--pip-args",
            ],
        );
        if let Some(p) = package {
            named.push(package_name(&p).to_string());
            named.extend(path_candidates(&p));
        }
        named
    };
    match launcher {
        "npx" | "bunx" | "pnpx" | "uvx" => package_runner(rest),
        "pnpm" | "yarn" | "bun" | "pipx" | "uv" => {
            // `pnpm dlx PKG`, `yarn dlx PKG`, `bun x PKG`, `pipx run PKG`, `uv tool run PKG`
            let sub = rest
                .iter()
                .position(|a| ["dlx", "x", "run"].contains(&a.as_str()));
            match sub {
                Some(i) => package_runner(&rest[i + 1..]),
                None => Vec::new(),
            }
        }
        "node" | "nodejs" | "deno" | "tsx" | "ts-node" => {
            let (_, script) = next_value(rest, &["-r", "--require", "--import", "--loader"]);
            script.map(|s| path_candidates(&s)).unwrap_or_default()
        }
        l if l == "python" || l.starts_with("python3") || l == "py" => {
            if let Some(i) = rest.iter().position(|a| a == "-m") {
                return rest.get(i + 1).map(|m| vec![m.clone()]).unwrap_or_default();
            }
            let (_, script) = next_value(rest, &["-X", "-W"]);
            script.map(|s| path_candidates(&s)).unwrap_or_default()
        }
        "docker" | "podman" => Vec::new(),
        _ => path_candidates(first),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_preset_parses_validates_and_passes_its_own_examples() {
        let base = Path::new("/srv/project");
        for p in all() {
            let policy = p
                .parse(base)
                .unwrap_or_else(|d| panic!("preset {}: {d}", p.name));
            assert_eq!(policy.name(), p.name, "preset {} names itself", p.name);
            assert!(!policy.tests.is_empty(), "preset {} has examples", p.name);
            assert!(
                p.text
                    .lines()
                    .filter(|l| l.trim_start().starts_with('#'))
                    .count()
                    >= 5,
                "preset {} is commented",
                p.name
            );
            assert!(
                !p.summary.ends_with('.')
                    && p.summary.chars().next().is_some_and(char::is_lowercase),
                "summary of {}: lowercase, no trailing period",
                p.name
            );
            // usable by an ordinary user without a delegated cgroup, where a
            // memory or CPU limit cannot be enforced and mcpbox refuses to start
            assert!(
                policy.process.memory.is_none() && policy.process.cpu.is_none(),
                "{} sets a limit that stops it starting rootless",
                p.name
            );
            // least privilege: no preset writes to the host (but the
            // browser's output folder, whose screenshots are its product),
            // none passes the whole environment, none opens the network
            // without asking
            assert!(
                policy.filesystem.output.is_none()
                    || (p.name == "playwright"
                        && policy.filesystem.output.as_deref()
                            == Some(Path::new("/srv/project/playwright-output"))),
                "{} writes to the host",
                p.name
            );
            assert!(
                policy
                    .filesystem
                    .mounts
                    .iter()
                    .all(|m| m.mode == crate::MountMode::Ro),
                "{} mounts something writable",
                p.name
            );
        }
    }

    #[test]
    fn presets_are_sorted_and_named_once() {
        let names: Vec<&str> = all().iter().map(|p| p.name).collect();
        let mut sorted = names.clone();
        sorted.sort_unstable();
        sorted.dedup();
        assert_eq!(names, sorted);
        for required in [
            "filesystem",
            "git",
            "fetch",
            "memory",
            "time",
            "everything",
            "github",
            "postgres",
            "playwright",
            "puppeteer",
        ] {
            assert!(get(required).is_some(), "missing preset {required}");
        }
        assert!(get("nope").is_none());
        assert!(get("Git").is_none(), "names are exact");
    }

    #[test]
    fn relative_paths_resolve_against_the_directory_it_is_used_from() {
        let p = get("filesystem")
            .unwrap()
            .parse(Path::new("/srv/project"))
            .unwrap();
        assert_eq!(
            p.filesystem.input.as_deref(),
            Some(Path::new("/srv/project"))
        );
    }

    fn argv(s: &str) -> Vec<String> {
        s.split_whitespace().map(String::from).collect()
    }

    #[test]
    fn for_command_recognises_servers_as_host_configs_start_them() {
        let table = [
            ("npx -y @modelcontextprotocol/server-filesystem /home/u/docs /tmp", Some("filesystem")),
            ("npx --yes @modelcontextprotocol/server-filesystem@2026.8.31 .", Some("filesystem")),
            ("/usr/bin/npx -y @modelcontextprotocol/server-everything", Some("everything")),
            ("node /opt/peers/npm/lib/node_modules/@modelcontextprotocol/server-filesystem/dist/index.js /w", Some("filesystem")),
            ("/opt/peers/npm/bin/mcp-server-filesystem /workspace/input", Some("filesystem")),
            ("uvx mcp-server-git --repository /repo", Some("git")),
            ("uvx --from mcp-server-git==2026.10.19 mcp-server-git", Some("git")),
            ("uvx mcp-server-fetch", Some("fetch")),
            ("uv tool run mcp-server-time --local-timezone UTC", Some("time")),
            ("pipx run mcp-server-fetch", Some("fetch")),
            ("python -m mcp_server_time --local-timezone UTC", Some("time")),
            ("/venv/bin/python3.11 -m mcp_server_git -r .", Some("git")),
            ("/home/u/.venv/bin/mcp-server-fetch", Some("fetch")),
            ("npx -y @modelcontextprotocol/server-memory", Some("memory")),
            ("npx -y @modelcontextprotocol/server-github", Some("github")),
            ("github-mcp-server stdio", Some("github")),
            ("npx -y @modelcontextprotocol/server-postgres postgresql://localhost/db", Some("postgres")),
            ("npx @playwright/mcp@latest --headless", Some("playwright")),
            ("npx -y @modelcontextprotocol/server-puppeteer", Some("puppeteer")),
            ("pnpm dlx @modelcontextprotocol/server-memory", Some("memory")),
            ("npx -p @modelcontextprotocol/server-filesystem mcp-server-filesystem /d", Some("filesystem")),
            ("C:\\tools\\npx.cmd -y @modelcontextprotocol/server-everything", Some("everything")),
            // not recognised
            ("docker run -i --rm mcp/github", None),
            ("npx -y some-other-server", None),
            ("node server.js mcp-server-git", None),
            ("python -c import mcp_server_git", None),
            ("uvx", None),
            ("", None),
            // a directory argument that looks like a server is not the server
            ("/usr/local/bin/my-server /data/mcp-server-git", None),
        ];
        for (line, want) in table {
            let got = for_command(&argv(line)).map(|p| p.name);
            assert_eq!(got, want, "for_command({line:?})");
        }
    }

    #[test]
    fn package_specs_lose_their_versions() {
        assert_eq!(package_name("@a/b@1.2.3"), "@a/b");
        assert_eq!(package_name("@a/b"), "@a/b");
        assert_eq!(package_name("b@latest"), "b");
        assert_eq!(package_name("mcp-server-git==1.0"), "mcp-server-git");
        assert_eq!(package_name("mcp-server-git>=1"), "mcp-server-git");
        assert_eq!(package_name("pkg[extra]"), "pkg");
    }
}
